"""ReduceTensor on the GPU against the float64 reference: every op and type pair over every subset of
reduced dims (NCHW, NHWC, strided with gaps), each kernel path (asserted through plan_summary) with
aligned and unaligned A, alpha/beta, indices with ties, NaN and infinities, C with its own layout, a long
full reduction, and bitwise determinism."""
import itertools

import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

import pydnn
from devtensor import DevTensor, assert_close
from pydnn.ops.reduce import plan_summary
from pydnn.reference import reduce as ref
from pydnn.tensor import DTYPES, packed_strides

pytestmark = pytest.mark.gpu

F32, F64, F16, BF16 = (pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DATA_DOUBLE, pydnn.PYDNN_DATA_HALF,
                       pydnn.PYDNN_DATA_BFLOAT16)
ADD, MUL, MIN, MAX, AMAX, AVG, NORM1, NORM2, MNZ = (
    pydnn.PYDNN_REDUCE_TENSOR_ADD, pydnn.PYDNN_REDUCE_TENSOR_MUL, pydnn.PYDNN_REDUCE_TENSOR_MIN,
    pydnn.PYDNN_REDUCE_TENSOR_MAX, pydnn.PYDNN_REDUCE_TENSOR_AMAX, pydnn.PYDNN_REDUCE_TENSOR_AVG,
    pydnn.PYDNN_REDUCE_TENSOR_NORM1, pydnn.PYDNN_REDUCE_TENSOR_NORM2, pydnn.PYDNN_REDUCE_TENSOR_MUL_NO_ZEROS)
OPS = list(pydnn.ENUMS["pydnnReduceTensorOp_t"].values())
INDEXED = (MIN, MAX, AMAX)
PAIRS = [(F32, F32), (F64, F64), (F16, F16), (BF16, BF16), (F16, F32), (BF16, F32), (F32, F16), (F32, BF16)]
NAMES = {F32: "f32", F64: "f64", F16: "f16", BF16: "bf16"}
NHWC = pydnn.PYDNN_TENSOR_NHWC


def _rdesc(op, indices=False, nan=0, comp=F32):
    r = pydnn.create_reduce_tensor_descriptor()
    pydnn.set_reduce_tensor_descriptor(r, op, comp, nan,
                                       pydnn.PYDNN_REDUCE_TENSOR_FLATTENED_INDICES if indices else 0,
                                       pydnn.PYDNN_32BIT_INDICES)
    return r


def _run(handle, r, a_desc, a_ptr, c, alpha=1.0, beta=0.0):
    """One reduce_tensor call with buffers of exactly the reported sizes; returns the int32 indices
    (None without them). Indices are poisoned first (-1) so an unwritten one shows."""
    ws = pydnn.get_reduction_workspace_size(handle, r, a_desc, c.desc)
    isz = pydnn.get_reduction_indices_size(handle, r, a_desc, c.desc)
    wbuf = pydnn.DeviceArray((max(ws, 8),), np.uint8)
    wbuf.fill_bytes(0xFF)
    ibuf = pydnn.DeviceArray((max(isz // 4, 1),), np.int32)
    ibuf.fill_bytes(0xFF)
    pydnn.reduce_tensor(handle, r, ibuf.ptr if isz else None, isz, wbuf.ptr if ws else None, ws, alpha,
                        a_desc, a_ptr, beta, c.desc, c.ptr)
    return ibuf.to_numpy()[: isz // 4] if isz else None


class Shifted:
    """A tensor view that starts `shift` elements into its buffer: an A whose base is not 16-byte aligned."""

    def __init__(self, dims, dtype, strides=None, shift=1):
        self.dims, self.dtype, self.shift = tuple(dims), dtype, shift
        self.strides = tuple(strides or packed_strides(self.dims, pydnn.PYDNN_TENSOR_NCHW))
        self.desc = pydnn.create_tensor_descriptor()
        pydnn.set_tensor_nd_descriptor(self.desc, dtype, len(self.dims), self.dims, self.strides)
        span = pydnn.get_tensor_size_in_bytes(self.desc) // DTYPES[dtype][0]
        self.flat = DevTensor((span + shift,), dtype)
        self.ptr = self.flat.ptr + shift * DTYPES[dtype][0]

    def upload(self, values):
        """Store `values` (shape dims) at the view's elements; returns what the device holds."""
        full = np.zeros(self.flat.dims)
        as_strided(full[self.shift:], self.dims, [s * 8 for s in self.strides])[...] = values
        stored = self.flat.upload(full)
        return np.array(as_strided(stored[self.shift:], self.dims, [s * 8 for s in self.strides]))


def _values(rng, dims, op, dtype):
    """Inputs that suit the op: few distinct values for MIN/MAX/AMAX (ties), factors near 1 for
    products (their logs sum to a few units however long the slice: no overflow, even in half), zeros
    for MUL_NO_ZEROS, signed numbers otherwise."""
    if op in (MUL, MNZ):
        w = min(0.2, 3.0 / np.sqrt(np.prod(dims)))
        v = np.exp(rng.uniform(-w, w, dims))
        if op == MNZ:
            v[rng.random(dims) < 0.3] = 0
        return v
    if op in INDEXED:
        return rng.integers(-4, 5, dims).astype(np.float64) / 2
    return rng.uniform(-3, 3, dims).astype(np.float32).astype(np.float64)


def _check(handle, op, a_desc, a_ptr, av, c, tc, what, alpha=1.0, beta=0.0, c0=None, nan=0):
    idx = _run(handle, _rdesc(op, op in INDEXED, nan), a_desc, a_ptr, c, alpha, beta)
    want, widx, scale = ref.reduce(op, alpha, av, beta, c0, c.dims, propagate_nan=bool(nan))
    assert_close(c.download(), want, tc, what, scale=scale)
    if op in INDEXED:
        got = idx.reshape(c.dims)
        bad = got != widx
        assert not bad.any(), f"{what}: indices differ at {np.argwhere(bad)[0]}: {got[bad][:5]} vs {widx[bad][:5]}"
    c.check_untouched()
    return idx


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{NAMES[p[0]]}-{NAMES[p[1]]}")
@pytest.mark.parametrize("op", OPS)
def test_every_subset_of_dims(handle, rng, op, pair):
    ta, tc = pair
    dims = (2, 3, 5, 7)
    for layout in ("nchw", "nhwc", "gaps"):
        strides = {"nchw": None, "nhwc": packed_strides(dims, NHWC), "gaps": (400, 120, 21, 2)}[layout]
        a = DevTensor(dims, ta, strides)
        av = a.upload(_values(rng, dims, op, ta))
        for mask in itertools.product((0, 1), repeat=4):
            cdims = tuple(1 if m else d for m, d in zip(mask, dims))
            c = DevTensor(cdims, tc)
            _check(handle, op, a.desc, a.ptr, av, c, tc, f"op {op} {layout} {cdims}")
        a.check_untouched()


# (name, A dims, A strides (None: NCHW; "nhwc"; a tuple), C dims, expected kernel of the aligned plan)
PATHS = [
    ("rows_vec odd rows", (3, 5, 7, 37), None, (3, 5, 7, 1), "rows_vec"),
    ("rows_vec long rows", (6, 1, 1, 40003), None, (6, 1, 1, 1), "rows_vec"),
    ("rows_vec 2 dims", (32, 16, 28, 28), None, (1, 16, 1, 1), "rows_vec"),
    ("rows_vec 2 dims few", (256, 4, 16, 16), None, (1, 4, 1, 1), "rows_vec"),
    ("cols packed", (64, 3, 32, 32), "nhwc", (1, 3, 1, 1), "cols"),
    ("cols vec packed", (32, 64, 14, 14), "nhwc", (1, 64, 1, 1), "cols"),
    ("cols wide", (4, 64, 32, 32), None, (1, 64, 32, 32), "cols"),
    ("cols wide few", (4096, 2, 3, 40), None, (1, 2, 3, 40), "cols"),
    ("cols 2 dims", (8, 40, 12, 12), "nhwc", (8, 40, 1, 1), "cols"),
    ("rows_gen gaps", (6, 50, 30, 22), (70000, 1400, 46, 2), (1, 50, 1, 1), "rows_gen"),
    ("rows_gen full", (16, 24, 40, 44), (50000, 2000, 49, 1), (1, 1, 1, 1), "rows_gen"),
]


@pytest.mark.parametrize("case", PATHS, ids=lambda c: c[0].replace(" ", "_"))
@pytest.mark.parametrize("pair", [(F32, F32), (BF16, BF16), (F16, F32), (F64, F64)],
                         ids=lambda p: f"{NAMES[p[0]]}-{NAMES[p[1]]}")
def test_kernel_paths(handle, rng, case, pair):
    name, dims, strides, cdims, kind = case
    ta, tc = pair
    if strides == "nhwc":
        strides = packed_strides(dims, NHWC)
    for shift in (0, 1):
        a = Shifted(dims, ta, strides, shift)
        for op in (ADD, MAX, NORM2, AMAX):
            av = a.upload(_values(rng, dims, op, ta))
            c = DevTensor(cdims, tc)
            if shift == 0:  # the case reaches the kernel it is named after
                kinds = [k[0] for k in plan_summary(handle, _rdesc(op, op in INDEXED), a.desc, c.desc)]
                assert kinds[0] == kind, (name, op, kinds)
            _check(handle, op, a.desc, a.ptr, av, c, tc, f"{name} op {op} shift {shift}")


@pytest.mark.parametrize("pair", [(F32, F32), (F16, F32), (F32, BF16), (F64, F64)],
                         ids=lambda p: f"{NAMES[p[0]]}-{NAMES[p[1]]}")
@pytest.mark.parametrize("op", OPS)
def test_alpha_beta(handle, rng, op, pair):
    ta, tc = pair
    for dims, cdims in (((4, 6, 9, 10), (4, 1, 9, 1)), ((3, 2000), (1, 2000)), ((2, 50000), (2, 1))):
        a = DevTensor(dims, ta)
        av = a.upload(_values(rng, dims, op, ta))
        for alpha, beta in ((-1.5, 0.5), (2.0, 1.0), (0.25, 0.0)):
            c = DevTensor(cdims, tc)
            c0 = c.random(rng)
            _check(handle, op, a.desc, a.ptr, av, c, tc, f"alpha/beta {op} {dims}", alpha, beta, c0)


def test_compute_type_double(handle, rng):
    a = DevTensor((5, 300), F64)
    av = a.random(rng)
    c = DevTensor((5, 1), F64)
    r = _rdesc(NORM2, comp=F64)
    _run(handle, r, a.desc, a.ptr, c)
    want, _, scale = ref.reduce(NORM2, 1.0, av, 0.0, None, (5, 1))
    assert_close(c.download(), want, F64, "double compute type", scale=scale)


def test_outputs_with_their_own_layout(handle, rng):
    """C in NHWC or with gaps: values land at C's strides, gaps stay poisoned; indices are packed in
    C's dims whatever C's strides."""
    dims = (3, 4, 5, 6)
    a = DevTensor(dims, F32, packed_strides(dims, NHWC))
    av = a.upload(_values(rng, dims, MAX, F32))
    for cdims in ((3, 1, 5, 6), (3, 4, 1, 1), (1, 4, 5, 1), (3, 4, 5, 6)):
        st, acc = [], 2
        for d in reversed(cdims):
            st.append(acc)
            acc = acc * d + 1
        for cst in (packed_strides(cdims, NHWC), tuple(reversed(st))):
            c = DevTensor(cdims, F32, cst)
            _check(handle, MAX, a.desc, a.ptr, av, c, F32, f"C {cdims} strides {cst}")
            c = DevTensor(cdims, F16, cst)
            _check(handle, AVG, a.desc, a.ptr, av, c, F16, f"C {cdims} strides {cst}")


@pytest.mark.parametrize("dims,cdims,strides", [((4, 50), (4, 1), None), ((4, 3, 20, 20), (1, 3, 1, 1), "nhwc"),
                                                ((2, 70001), (2, 1), None), ((2, 3, 40, 40), (1, 1, 1, 1), None)])
def test_nan_propagation_and_first_index(handle, rng, dims, cdims, strides):
    """PROPAGATE_NAN: NaN, index of the first NaN; NOT_PROPAGATE: NaNs skipped, a slice of nothing but
    NaN gives NaN at index 0."""
    if strides == "nhwc":
        strides = packed_strides(dims, NHWC)
    a = DevTensor(dims, F32, strides)
    v = rng.integers(-3, 4, dims).astype(np.float64)
    v[rng.random(dims) < 0.01] = np.nan
    if np.prod(cdims) > 1:
        v[tuple(0 if c != 1 else slice(None) for c in cdims)] = np.nan  # the first slice: all NaN
    av = a.upload(v)
    for op in INDEXED:
        for nan in (0, 1):
            c = DevTensor(cdims, F32)
            _check(handle, op, a.desc, a.ptr, av, c, F32, f"op {op} nan {nan}", nan=nan)
    for op in (ADD, NORM1):  # arithmetic ops: NaN in, NaN out
        c = DevTensor(cdims, F32)
        _run(handle, _rdesc(op), a.desc, a.ptr, c)
        want, _, _ = ref.reduce(op, 1.0, av, 0.0, None, cdims)
        assert (np.isnan(c.download()) == np.isnan(want)).all()


def test_infinities_in_sums(handle):
    a = DevTensor((3, 1000), F32)
    v = np.ones((3, 1000))
    v[0, 10] = np.inf
    v[1, 10], v[1, 500] = np.inf, -np.inf
    v[2, 999] = -np.inf
    a.upload(v)
    c = DevTensor((3, 1), F32)
    _run(handle, _rdesc(ADD), a.desc, a.ptr, c)
    out = c.download().ravel()
    assert out[0] == np.inf and np.isnan(out[1]) and out[2] == -np.inf
    _run(handle, _rdesc(NORM2), a.desc, a.ptr, c)
    assert (c.download().ravel() == np.inf)[[0, 2]].all()


@pytest.mark.parametrize("op", [ADD, NORM2, AMAX, MIN, AVG])
def test_long_full_reduction_is_accurate_and_deterministic(handle, rng, op):
    n = 2**27 + 13
    a = DevTensor((n,), F32)
    av = a.random(rng, -1, 1) if op != MIN else a.upload(rng.integers(-1000, 1000, n) / 8)
    c = DevTensor((1,), F32)
    r = _rdesc(op, indices=op in INDEXED)
    assert pydnn.get_reduction_workspace_size(handle, r, a.desc, c.desc) > 0  # takes the two-pass path
    idx1 = _run(handle, r, a.desc, a.ptr, c)
    first = c.buf.to_numpy().tobytes()
    idx2 = _run(handle, r, a.desc, a.ptr, c)
    assert c.buf.to_numpy().tobytes() == first, "not bitwise reproducible"
    want, widx, scale = ref.reduce(op, 1.0, av, 0.0, None, (1,))
    assert_close(c.download(), want, F32, f"op {op} over 2^27", scale=scale)
    if widx is not None:
        assert idx1.tolist() == idx2.tolist() == widx.ravel().tolist()


def test_deterministic_across_runs(handle, rng):
    """Segmented cols and rows plans give the same bits run after run."""
    for dims, strides, cdims, ta in (((64, 64, 28, 28), "nhwc", (1, 64, 1, 1), BF16),
                                     ((64, 32, 28, 28), None, (1, 32, 1, 1), F32),
                                     ((3, 1 << 22), None, (3, 1), F16)):
        if strides == "nhwc":
            strides = packed_strides(dims, NHWC)
        a = DevTensor(dims, ta, strides)
        av = a.random(rng)
        c = DevTensor(cdims, F32)
        r = _rdesc(ADD)
        assert pydnn.get_reduction_workspace_size(handle, r, a.desc, c.desc) > 0
        _run(handle, r, a.desc, a.ptr, c)
        first = c.buf.to_numpy().tobytes()
        for _ in range(3):
            _run(handle, r, a.desc, a.ptr, c)
            assert c.buf.to_numpy().tobytes() == first
        want, _, scale = ref.reduce(ADD, 1.0, av, 0.0, None, cdims)
        assert_close(c.download(), want, F32, f"{dims}", scale=scale)


def test_one_element_and_no_reduction(handle, rng):
    for dims in ((1,), (1, 1, 1, 1), (7, 1, 3)):
        a = DevTensor(dims, F16)
        av = a.random(rng)
        for op in OPS:
            for cdims in (dims, tuple(1 for _ in dims)):
                c = DevTensor(cdims, F16)
                _check(handle, op, a.desc, a.ptr, av, c, F16, f"{dims} -> {cdims} op {op}")
