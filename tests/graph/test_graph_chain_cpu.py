"""The CPU side of tests/graph/test_graph_chain_gpu.py: every kernel those GPU tests generate (the 8-op chain
over each broadcast pattern, float / half / bfloat16, 1 / 2 / 4 runs a thread, the defaults' 16-bit forms)
is built on a CPU handle, takes the fusion engine's one launch, and compiles with NVRTC for sm_90 without
spills (sm_80 for the bfloat16 ones); the numpy emulation of each kernel's loop visits every element once
with numpy's broadcast offsets; the launch's vector flag follows the pointers' alignment exactly as the GPU
test expects (a no-op launch records it); the emitted chain, evaluated by numpy in float32, matches float64."""
import os
import re
import sys

import numpy as np
import pytest

import pydnn as P
from pydnn import tuning
from pydnn.graph import codegen as cg
from pydnn.graph import pointwise_ops as pw
from test_graph_chain_gpu import PATTERNS, _chain

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))
import bench_host as B  # noqa: E402

F32, F16, BF16 = P.PYDNN_DATA_FLOAT, P.PYDNN_DATA_HALF, P.PYDNN_DATA_BFLOAT16
PROPS = re.compile(r"Function properties for (\S+)[^\n]*\n[^\n]*?(\d+) bytes stack frame, (\d+) bytes spill stores"
                   r"[^\n]*\n[^\n]*?Used (\d+) registers")


@pytest.fixture
def cpu(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("PYDNN_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "chaincache"))
    with B.no_launch() as drv:
        yield B.cpu_handle(), drv


def _built(h, io, pattern):
    g, tensors = _chain(h, io, *PATTERNS[pattern])
    g.build_operation_graph().create_execution_plans().build_plans()
    assert g.engine_index() == 1 and g.launches() == 1
    return g, tensors, g._plan_obj.built.steps[0]


def test_every_variant_compiles_without_spills(cpu, monkeypatch):
    """Each distinct kernel of test_chain_broadcast_patterns compiles (NVRTC, sm_90; bfloat16 ones for sm_80
    too) with no stack frame and no spill; bfloat16 ones use tanh_fast and gelu_fast."""
    from pydnn._build import cache
    from pydnn._build.manifest import COMMON_OPTIONS
    from pydnn._cuda import nvrtc

    h, _ = cpu
    seen = {}
    for io in (BF16, F16, F32):
        for runs in (1, 2, 4):
            monkeypatch.setattr(tuning.graph, "PW_RUNS", runs)
            for pattern in range(len(PATTERNS)):
                _, _, st = _built(h, io, pattern)
                seen.setdefault(st.unit.name, (st, io))
    assert len(seen) >= 20  # patterns x types x runs collapse to this many distinct kernels at least
    monkeypatch.setattr(tuning.graph, "PW_GELU_DEG5", True)  # the deg-5 GELU form in the chain
    _, _, st = _built(h, BF16, 0)
    seen.setdefault(st.unit.name, (st, BF16))
    assert "gelu_fast5(" in cache._source_memo[st.unit.source][0]
    monkeypatch.setattr(tuning.graph, "PW_GELU_DEG5", False)
    monkeypatch.setattr(tuning.graph, "PW_PREFETCH", True)  # test_chain_prefetch_form's kernels
    for io in (BF16, F32):
        for runs in (1, 2, 4):
            monkeypatch.setattr(tuning.graph, "PW_RUNS", runs)
            for pattern in (0, 1, 2, 7):
                _, _, st = _built(h, io, pattern)
                seen.setdefault(st.unit.name, (st, io))
    for st, io in seen.values():
        text = cache._source_memo[st.unit.source][0]
        assert ("tanh_fast(" in text) == (io == BF16) and ("gelu_fast" in text) == (io != F32)
        # (a kernel with launch bounds is generated for sm_90 handles only: engines.PwStep)
        for arch in ("sm_90", "sm_80") if io == BF16 and not st.min_blocks else ("sm_90",):
            _, lowered, log = nvrtc.compile_cubin(text, st.unit.source, (st.expr,), arch,
                                                  COMMON_OPTIONS + ("--ptxas-options=-v",), [str(cache.ptx_dir())])
            props = {f: (int(a), int(b), int(r)) for f, a, b, r in PROPS.findall(log)}
            frame, spill, regs = props[lowered[st.expr]]
            # (the prefetch form at 4 runs holds two iterations' runs: 96 registers, not a default)
            assert (frame, spill) == (0, 0) and regs <= (128 if "the prefetch form" in text else 64), (arch, log)


@pytest.mark.parametrize("pattern", range(len(PATTERNS)))
def test_every_pattern_visits_every_element_once(cpu, monkeypatch, pattern):
    """The kernel's loop (codegen.kernel_visits) at each run count, on the collapsed dims and strides the
    engine made: every output index once, each operand at numpy's broadcast offset."""
    h, _ = cpu
    for runs in (1, 2, 4):
        monkeypatch.setattr(tuning.graph, "PW_RUNS", runs)
        g, _, st = _built(h, BF16, pattern)
        p = st.params
        nd = p.ndim
        dims = [p.dims[d] for d in range(nd)]
        strides = [[p.stride[k][d] for d in range(nd)] for k in range(len(st.uids))]
        elems = cg.launch_shape(dims, strides, h.sm_count, [2] * len(strides), st.runs)[0]
        assert dims[-1] % (32 * elems * st.runs) == 0 or st.runs == 1
        idx, off = cg.kernel_visits(dims, strides, elems, st.runs, 3 * 256)
        assert np.array_equal(np.sort(idx), np.arange(int(np.prod(dims))))
        want = cg.offsets(dims, strides)
        for k in range(len(strides)):
            np.testing.assert_array_equal(off[k], want[k][idx])
        # numpy's broadcasting of the graph's own (uncollapsed) dims gives the same offsets
        xd = PATTERNS[pattern][0]
        dims_of = {t.uid: tuple(t.dim) for t in g.tensors if not t.virtual}
        for k, u in enumerate(st.uids):
            src = np.arange(int(np.prod(dims_of[u]))).reshape(dims_of[u])
            np.testing.assert_array_equal(want[k], np.broadcast_to(src, xd).ravel())


@pytest.mark.parametrize("offs", [(1, 0, 0, 0), (0, 0, 0, 3), (0, 1, 5, 0), (2, 0, 1, 6), (8, 0, 0, 8)])
@pytest.mark.parametrize("io", [BF16, F16], ids=["bf16", "f16"])
def test_misaligned_pointers_turn_the_vector_flag_off(cpu, io, offs):
    """test_chain_misaligned_pointers' launches on the no-op driver: one launch each, p.flags 1 only where
    x, b and y (the contiguous operands) sit on 16-byte boundaries; s (broadcast along the innermost dim)
    does not matter."""
    h, drv = cpu
    g, (x, s, b, y) = _chain(h, io, (3, 8, 1024), (1, 8, 1), (1, 1, 1024))
    g.build_operation_graph().create_execution_plans().build_plans()
    st = g._plan_obj.built.steps[0]
    base = 1 << 32
    ptrs = {t: base + (i << 20) + o * 2 for i, (t, o) in enumerate(zip((x, s, b, y), offs))}
    before = drv.launches
    g.execute(ptrs, 0, handle=h)
    assert drv.launches == before + 1
    assert st.params.flags == (1 if offs[0] % 8 == 0 and offs[2] % 8 == 0 and offs[3] % 8 == 0 else 0)
    assert [st.params.ptr[k] for k in range(4)] == [ptrs[t] for t in (x, s, b, y)]


def test_emitted_chain_in_float32_matches_float64():
    """The chain's emitted expressions (the bf16 kernel's: gelu_fast, tanh_fast), evaluated by numpy in
    float32 (pointwise_ops.numpy_namespace), within bfloat16's tolerance of the float64 reference."""
    from pydnn.reference import graph as ref

    ops = [("bf16", "in"), ("bf16", "in"), ("bf16", "in"), ("bf16", "out")]
    N = cg.PwNode
    nodes = [N(P.PYDNN_POINTWISE_MUL, x=("op", 0), b=("op", 1)), N(P.PYDNN_POINTWISE_ADD, x=("v", 0), b=("op", 2)),
             N(P.PYDNN_POINTWISE_GELU_FWD, x=("v", 1)), N(P.PYDNN_POINTWISE_MUL, x=("v", 2), b=("op", 0)),
             N(P.PYDNN_POINTWISE_SUB, x=("v", 3), b=("op", 2)), N(P.PYDNN_POINTWISE_RELU_FWD, dict(upper=4.0), x=("v", 4)),
             N(P.PYDNN_POINTWISE_TANH_FWD, x=("v", 5)), N(P.PYDNN_POINTWISE_ADD, x=("v", 6), b=("op", 0))]
    exprs = cg.expressions(cg.PwProgram(ops, nodes, [(7, 3)]))
    assert "gelu_fast" in exprs[2][1] and "tanh_fast(" in exprs[6][1]
    rng = np.random.default_rng(3)
    env = dict(pw.numpy_namespace(np))
    xv, sv, bv = (rng.uniform(-2, 2, 4096).astype(np.float32) for _ in range(3))
    env.update(in0=xv, in1=sv, in2=bv)
    for name, e in exprs:
        env[name] = np.asarray(eval(pw.to_numpy_source(e), env), np.float32)  # noqa: S307
    v = ref.pointwise("ADD", ref.pointwise("MUL", xv, sv), bv)
    v = ref.pointwise("SUB", ref.pointwise("MUL", ref.pointwise("GELU_FWD", v), xv), bv)
    want = ref.pointwise("ADD", ref.pointwise("TANH_FWD", ref.pointwise("RELU_FWD", v, upper=4.0)), xv)
    np.testing.assert_allclose(env["v7"], want, rtol=1e-5, atol=1e-5)
