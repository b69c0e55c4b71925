"""The generated pointwise kernel's 16-bit forms on the GPU (pydnn.tuning.graph.PW_GELU_FAST / PW_TANH_FAST,
the defaults for kernels whose outputs are all 16-bit / all bfloat16) against float64 numpy: the 8-op chain
over every broadcast pattern of its two small inputs, odd shapes (innermost dims that no vector or run
divides), pointers off the 16-byte alignment (the element-by-element loop), every run count, one launch
each (counted), outputs poisoned and their gaps checked untouched; the exact forms for float and half in the
same kernels; tanh_fast and gelu_fast alone against float64 at bfloat16's rounding (dense sweeps)."""
import math

import numpy as np
import pytest

import pydnn as P
from devtensor import POISON, DevTensor, assert_close
from pydnn import tuning
from pydnn.graph import Graph
from pydnn.reference import dtypes as rd
from pydnn.reference import graph as ref
from pydnn.tensor import DTYPES
from test_graph_gpu import Launches, _chain_ref

pytestmark = pytest.mark.gpu
F32, F16, BF16 = P.PYDNN_DATA_FLOAT, P.PYDNN_DATA_HALF, P.PYDNN_DATA_BFLOAT16


class Shifted:
    """A packed tensor whose first element sits `off` elements past a 256-byte aligned allocation (off > 0:
    not 16-byte aligned for 16-bit types unless off is a multiple of 8); the elements before it and the
    whole buffer start poisoned, and check_untouched proves the kernel wrote only the tensor."""

    def __init__(self, dims, dtype, off=0):
        self.dims, self.dtype, self.off = tuple(dims), dtype, off
        self.n = int(np.prod(self.dims))
        self.esize, self.np_dtype = DTYPES[dtype]
        self.buf = P.DeviceArray((self.n + off + 8,), self.np_dtype)
        self.buf.fill_bytes(POISON)

    @property
    def ptr(self):
        return self.buf.ptr + self.off * self.esize

    def random(self, rng, lo=-2.0, hi=2.0):
        v = rng.uniform(lo, hi, self.dims).astype(np.float32).astype(np.float64)
        flat = self.buf.to_numpy()
        stored = rd.to_storage(v, self.dtype)
        flat[self.off:self.off + self.n] = stored.ravel()
        self.buf.copy_from_numpy(flat)
        return rd.from_storage(stored, self.dtype)

    def download(self):
        flat = self.buf.to_numpy()
        return rd.from_storage(np.array(flat[self.off:self.off + self.n]), self.dtype).reshape(self.dims)

    def check_untouched(self):
        flat = self.buf.to_numpy().view(np.uint8).reshape(self.buf.to_numpy().size, -1)
        gaps = np.concatenate([flat[:self.off], flat[self.off + self.n:]])
        assert (gaps == POISON).all(), "a kernel wrote outside the tensor's elements"


def _chain(handle, io, xd, sd, bd):
    g = Graph(io_data_type=io, handle=handle)
    x = g.tensor(name="x", dim=list(xd))
    s = g.tensor(name="s", dim=list(sd))
    b = g.tensor(name="b", dim=list(bd))
    v = g.gelu(g.add(g.mul(x, s), b))
    v = g.tanh(g.relu(g.sub(g.mul(v, x), b), upper_clip=4.0))
    y = g.add(v, x, name="y").set_output(True)
    return g, (x, s, b, y)


# (x dims, s dims, b dims): per channel / per column (the benchmark's), per row, per batch, scalar, full,
# mixed; innermost dims 4096 (every run count), 1024 + 8, 130, 33, 7, 1 (no vector, no run divides)
PATTERNS = [
    ((3, 8, 4096), (1, 8, 1), (1, 1, 4096)),
    ((3, 8, 1024), (3, 8, 1), (1, 8, 1024)),
    ((2, 6, 1032), (2, 1, 1), (1, 6, 1)),
    ((5, 7, 130), (1, 1, 1), (5, 7, 130)),
    ((4, 9, 33), (1, 9, 33), (4, 1, 1)),
    ((3, 5, 7), (3, 5, 7), (1, 1, 7)),
    ((17, 3, 1), (1, 3, 1), (17, 1, 1)),
    ((2, 64, 512), (2, 64, 512), (2, 64, 512)),
]


@pytest.mark.parametrize("runs", [1, 2, 4])
@pytest.mark.parametrize("pattern", range(len(PATTERNS)))
@pytest.mark.parametrize("io", [BF16, F16, F32], ids=["bf16", "f16", "f32"])
def test_chain_broadcast_patterns(handle, rng, monkeypatch, io, pattern, runs):
    """Every broadcast pattern at the defaults (bf16: gelu_fast + tanh_fast; f16: gelu_fast + tanh_nonneg;
    f32: erff + tanh_nonneg), one launch, against float64."""
    from pydnn._build import cache

    monkeypatch.setattr(tuning.graph, "PW_RUNS", runs)
    xd, sd, bd = PATTERNS[pattern]
    g, (x, s, b, y) = _chain(handle, io, xd, sd, bd)
    g.build_operation_graph().create_execution_plans().build_plans()
    assert g.engine_index() == 1 and g.launches() == 1
    text = cache._source_memo[g._plan_obj.built.steps[0].unit.source][0]
    assert ("tanh_fast(" in text) == (io == BF16) and ("gelu_fast" in text) == (io != F32)
    tx, ts, tb, ty = (DevTensor(t.dim, io) for t in (x, s, b, y))
    xv, sv, bv = tx.random(rng, -2, 2), ts.random(rng, -2, 2), tb.random(rng, -2, 2)
    count = Launches(monkeypatch)
    g.execute({x: tx.ptr, s: ts.ptr, b: tb.ptr, y: ty.ptr}, 0, handle=handle)
    assert count.n == 1
    want = _chain_ref(xv, sv, bv)
    assert_close(ty.download(), want, io, f"chain {PATTERNS[pattern]} runs {runs}",
                 scale=np.abs(want) + np.abs(xv) + 1)
    ty.check_untouched()


@pytest.mark.parametrize("offs", [(1, 0, 0, 0), (0, 0, 0, 3), (0, 1, 5, 0), (2, 0, 1, 6), (8, 0, 0, 8)])
@pytest.mark.parametrize("io", [BF16, F16], ids=["bf16", "f16"])
def test_chain_misaligned_pointers(handle, rng, monkeypatch, io, offs):
    """x, s, b, y each `offs` elements past 16-byte alignment: a contiguous operand off the vector alignment
    turns the launch to the element-by-element loop (p.flags), same results; 8 elements (16 bytes) keep
    the vector loop. One launch, the bytes around y untouched."""
    xd, sd, bd = (3, 8, 1024), (1, 8, 1), (1, 1, 1024)
    g, (x, s, b, y) = _chain(handle, io, xd, sd, bd)
    g.build_operation_graph().create_execution_plans().build_plans()
    step = g._plan_obj.built.steps[0]
    tx, ts, tb, ty = (Shifted(d, io, o) for d, o in zip((xd, sd, bd, xd), offs))
    xv, sv, bv = tx.random(rng), ts.random(rng), tb.random(rng)
    count = Launches(monkeypatch)
    g.execute({x: tx.ptr, s: ts.ptr, b: tb.ptr, y: ty.ptr}, 0, handle=handle)
    assert count.n == 1
    # s is broadcast along the innermost dim (read once a run): its alignment does not matter
    assert step.params.flags == (1 if offs[0] % 8 == 0 and offs[2] % 8 == 0 and offs[3] % 8 == 0 else 0)
    want = _chain_ref(xv, sv, bv)
    assert_close(ty.download(), want, io, f"chain offsets {offs}", scale=np.abs(want) + np.abs(xv) + 1)
    ty.check_untouched()


@pytest.mark.parametrize("runs", [1, 2, 4])
@pytest.mark.parametrize("pattern", [0, 1, 2, 7])
@pytest.mark.parametrize("io", [BF16, F32], ids=["bf16", "f32"])
def test_chain_prefetch_form(handle, rng, monkeypatch, io, pattern, runs):
    """The prefetch form (tuning.graph.PW_PREFETCH: the vector loop as a software pipeline) on one block of
    256 threads (a handle claiming one SM, PW_GRID 1), so that each thread takes several iterations and
    the loads of iteration i + 1 really run ahead of iteration i's stores; one launch, against float64."""
    from pydnn._build import cache

    monkeypatch.setattr(tuning.graph, "PW_PREFETCH", True)
    monkeypatch.setattr(tuning.graph, "PW_RUNS", runs)
    monkeypatch.setattr(tuning.graph, "PW_GRID", 1)
    monkeypatch.setattr(handle, "sm_count", 1)
    g, (x, s, b, y) = _chain(handle, io, *PATTERNS[pattern])
    g.build_operation_graph().create_execution_plans().build_plans()
    step = g._plan_obj.built.steps[0]
    assert step.grid == (1, 1, 1) and step.vec_static
    assert "the prefetch form" in cache._source_memo[step.unit.source][0]
    tx, ts, tb, ty = (DevTensor(t.dim, io) for t in (x, s, b, y))
    xv, sv, bv = tx.random(rng, -2, 2), ts.random(rng, -2, 2), tb.random(rng, -2, 2)
    count = Launches(monkeypatch)
    g.execute({x: tx.ptr, s: ts.ptr, b: tb.ptr, y: ty.ptr}, 0, handle=handle)
    assert count.n == 1 and step.params.flags == 1
    want = _chain_ref(xv, sv, bv)
    assert_close(ty.download(), want, io, f"chain prefetch {PATTERNS[pattern]} runs {runs}",
                 scale=np.abs(want) + np.abs(xv) + 1)
    ty.check_untouched()


def test_chain_exact_forms_still_pass(handle, rng, monkeypatch):
    """With PW_GELU_FAST / PW_TANH_FAST off, the bf16 chain is erff + tanh_nonneg again, same tolerance."""
    from pydnn._build import cache

    monkeypatch.setattr(tuning.graph, "PW_GELU_FAST", False)
    monkeypatch.setattr(tuning.graph, "PW_TANH_FAST", False)
    g, (x, s, b, y) = _chain(handle, BF16, *PATTERNS[0])
    g.build_operation_graph().create_execution_plans().build_plans()
    text = cache._source_memo[g._plan_obj.built.steps[0].unit.source][0]
    assert "erff(" in text and "tanh_nonneg(" in text and "tanh_fast(" not in text
    tx, ts, tb, ty = (DevTensor(t.dim, BF16) for t in (x, s, b, y))
    xv, sv, bv = tx.random(rng, -2, 2), ts.random(rng, -2, 2), tb.random(rng, -2, 2)
    g.execute({x: tx.ptr, s: ts.ptr, b: tb.ptr, y: ty.ptr}, 0, handle=handle)
    want = _chain_ref(xv, sv, bv)
    assert_close(ty.download(), want, BF16, "chain exact", scale=np.abs(want) + np.abs(xv) + 1)


def _bf16_ulps(got, want):
    """Distance in bfloat16 steps between got (bfloat16 values) and want (float64): both to float32 bits
    (bfloat16 is the top half of a float32), the difference of their ordered integer codes / 2^16."""
    def code(v):
        b = np.asarray(v, np.float32).view(np.int32).astype(np.int64)
        return np.where(b < 0, -(b & 0x7FFFFFFF), b)
    w = rd.from_storage(rd.to_storage(want, BF16), BF16)  # want rounded to nearest bfloat16
    return np.abs(code(got) - code(w)) >> 16


@pytest.mark.parametrize("op", ["TANH_FWD", "GELU_FWD", "GELU_FWD deg5"])
def test_fast_forms_within_a_bfloat16_step(handle, monkeypatch, op):
    """y = tanh(x) / gelu(x), x float32 (one float32 in each run of 512 / 4096 consecutive ones, at random in
    it, of magnitude 1e-30 to 12, both signs; GELU's negative side to -9), y bfloat16: the kernel takes tanh_fast / gelu_fast; every output is the float64
    result rounded to bfloat16 or its neighbour, and at most 25% (tanh.approx: an error <= 2^-10.99
    relative moves a value across a rounding boundary only within that distance of one: <= 2 * 2^-10.99 /
    2^-8 of a step) / 1% (gelu_fast: <= 7.9e-6 relative) differ from the correctly rounded value."""
    from pydnn._build import cache

    op, deg5 = op.split()[0], op.endswith("deg5")  # gelu_fast5 (PW_GELU_DEG5): <= 1.6e-5 relative
    monkeypatch.setattr(tuning.graph, "PW_GELU_DEG5", deg5)
    lo, hi = np.array([0.0, 12.0], np.float32).view(np.int32)
    step = 512 if op == "TANH_FWD" else 4096  # the float64 GELU reference is math.erfc element by element
    # each sample's low mantissa bits at random: on the bare grid (low 9 / 12 bits zero) GELU(x) ~ x / 2 and
    # tanh(x) ~ x of a small x fall exactly on a bfloat16 tie 1 time in 16, which the float32 result (the
    # tie itself) and the float64 one (just past it) round apart: 2.8% of the grid's GELU outputs in the
    # first mid-session run, 2.3% in a float32 emulation of gelu_fast with exact rcp / ex2, 0.01% jittered
    bits = np.arange(lo, hi, step, dtype=np.int64) + np.random.default_rng(5).integers(0, step, (hi - lo + step - 1) // step)
    pos = bits.astype(np.int32).view(np.float32)
    pos = pos[pos >= 1e-30]
    neg = pos if op == "TANH_FWD" else pos[pos <= 9.0]  # GELU(-9) ~ -1e-18: no result near the flush to zero
    xs = np.concatenate([pos, -neg, np.array([0.0, -0.0], np.float32)])
    g = Graph(io_data_type=BF16, handle=handle)
    x = g.tensor(name="x", dim=[1, xs.size], data_type=F32)
    y = g.pointwise(getattr(P, "PYDNN_POINTWISE_" + op), x, name="y").set_output(True)
    g.build_operation_graph().create_execution_plans().build_plans()
    assert g.engine_index() == 1
    text = cache._source_memo[g._plan_obj.built.steps[0].unit.source][0]
    assert ("tanh_fast(" if op == "TANH_FWD" else "gelu_fast5(" if deg5 else "gelu_fast(") in text
    tx, ty = DevTensor(x.dim, F32), DevTensor(y.dim, BF16)
    tx.upload(xs.astype(np.float64)[None])
    g.execute({x: tx.ptr, y: ty.ptr}, 0, handle=handle)
    got = ty.download()[0]
    x64 = xs.astype(np.float64)
    if op == "TANH_FWD":
        want = ref.pointwise(op, x64)
    else:  # as 0.5 x erfc(-x / sqrt 2): the reference's 0.5 x (1 + erf) cancels in float64 below x ~ -8
        want = 0.5 * x64 * np.vectorize(math.erfc, otypes=[np.float64])(-x64 / math.sqrt(2.0))
        np.testing.assert_allclose(want[np.abs(x64) < 5], ref.pointwise(op, x64[np.abs(x64) < 5]), rtol=1e-9,
                                   atol=1e-300)
    ulps = _bf16_ulps(got, want)
    assert ulps.max() <= 1, (op, xs[np.argmax(ulps)], got[np.argmax(ulps)], want[np.argmax(ulps)])
    frac = float((ulps > 0).mean())
    assert frac <= (0.25 if op == "TANH_FWD" else 0.01), (op, frac)
    ty.check_untouched()


def test_gelu_fast_edges(handle):
    """gelu_fast at the edges (bf16 in and out): +inf -> +inf, NaN -> NaN, -inf -> 0 (the limit; the
    reference formula 0.5 x (1 + erf) is NaN there), zeros and the largest finite values."""
    xs = np.array([np.inf, np.nan, -np.inf, 0.0, -0.0, 3.0e38, -3.0e38, 1e-30, -1e-30], np.float64)
    g = Graph(io_data_type=BF16, handle=handle)
    x = g.tensor(name="x", dim=[1, xs.size])
    y = g.gelu(x, name="y").set_output(True)
    g.build_operation_graph().create_execution_plans().build_plans()
    tx, ty = DevTensor(x.dim, BF16), DevTensor(y.dim, BF16)
    xv = tx.upload(xs[None])[0]
    g.execute({x: tx.ptr, y: ty.ptr}, 0, handle=handle)
    got = ty.download()[0]
    assert got[0] == np.inf and np.isnan(got[1]) and got[2] == 0.0 and got[3] == 0.0 and got[4] == 0.0
    assert got[5] == xv[5] and got[6] == 0.0
    assert abs(got[7] - 0.5 * xv[7]) <= 0.5e-30 * 8e-3 and abs(got[8] - 0.5 * xv[8]) <= 0.5e-30 * 8e-3
