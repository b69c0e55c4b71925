"""The generated pointwise kernel's forms (pydnn.tuning.graph: split loops, runs a thread, grid, launch
bounds) on the CPU: the numpy emulation of the kernel's loop visits every element once with numpy's
broadcast offsets, the run count and launch shape rules, the engine's choice per switch, and NVRTC compiles
the 8-op chain in every form for sm_80 and sm_90 without spills."""
import re

import numpy as np
import pytest

import pydnn as P
from pydnn import tuning
from pydnn.graph import Graph
from pydnn.graph import codegen as cg
from pydnn.graph import pointwise_ops as pw
from test_fuzz_cpu import cpu_handle


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("PYDNN_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "pwformscache"))


@pytest.mark.parametrize("dims, strides, elems, runs, threads", [
    ([64, 512], [[512, 1], [0, 1], [1, 0]], 8, 2, 64),        # two runs, several iterations a thread
    ([3, 4, 1024], [[4096, 1024, 1], [0, 1, 0], [0, 0, 1]], 8, 4, 32),
    ([3, 4, 1024], [[4096, 1024, 1], [0, 1, 0], [0, 0, 1]], 4, 8, 96),
    ([5, 256], [[256, 1], [1, 5]], 8, 1, 7 * 32),              # one run: the first form's order
    ([2, 7, 256], [[1792, 256, 1], [0, 0, 1]], 2, 4, 256),     # more threads than runs
])
def test_kernel_loop_visits_every_element_once(dims, strides, elems, runs, threads):
    assert dims[-1] % (32 * elems * runs) == 0 or runs == 1
    idx, off = cg.kernel_visits(dims, strides, elems, runs, threads)
    assert np.array_equal(np.sort(idx), np.arange(int(np.prod(dims))))
    want = cg.offsets(dims, strides)
    for k in range(len(strides)):
        np.testing.assert_array_equal(off[k], want[k][idx])


def test_kernel_loop_one_run_matches_thread_offsets():
    dims, strides = [6, 64], [[64, 1], [0, 1]]
    idx, off = cg.kernel_visits(dims, strides, 4, 1, 1 << 20)  # one iteration: thread order is index order
    assert np.array_equal(idx, np.arange(6 * 64))
    np.testing.assert_array_equal(off, cg.thread_offsets(dims, strides, 4))


def test_run_count():
    assert cg.run_count([64, 4096], 8, 4) == 4
    assert cg.run_count([64, 4096], 8, 16) == 16 and cg.run_count([64, 4096], 8, 32) == 16
    assert cg.run_count([64, 512], 8, 4) == 2       # 32 * 8 * 4 = 1024 does not divide 512
    assert cg.run_count([64, 130], 2, 4) == 1
    assert cg.run_count([64, 4096], 8, 3) == 2      # powers of two only
    assert cg.run_count([64, 4096], 8, 1) == 1


def test_launch_shape_runs_and_grid():
    dims, st = [64, 1024, 4096], [[4194304, 4096, 1], [0, 1, 0]]
    e, wide, grid = cg.launch_shape(dims, st, 132, [2, 2], runs=4, per_sm=16)
    assert e == 8 and not wide and grid[0] == 132 * 16
    assert cg.launch_shape(dims, st, 132, [2, 2], runs=4, per_sm=6)[2][0] == 132 * 6
    assert cg.launch_shape([8, 1024], [[1024, 1]], 132, [2], runs=4)[2][0] == 1   # 8192 elements: one block
    assert cg.launch_shape([2**30, 4], [[4, 1]], 132, [4], runs=1)[1] is True


def _chain(h, dims, io=P.PYDNN_DATA_BFLOAT16):
    n, c, w = dims
    g = Graph(io_data_type=io, handle=h)
    x = g.tensor(name="x", dim=[n, c, w])
    s = g.tensor(name="s", dim=[1, c, 1])
    b = g.tensor(name="b", dim=[1, 1, w])
    v = g.gelu(g.add(g.mul(x, s), b))
    v = g.tanh(g.relu(g.sub(g.mul(v, x), b), upper_clip=4.0))
    g.add(v, x).set_output(True).set_name("y")
    return g


def _step(monkeypatch, dims, **sw):
    for k, v in sw.items():
        monkeypatch.setattr(tuning.graph, k, v)
    g = _chain(cpu_handle(), dims)
    g.build_operation_graph().create_execution_plans().build_plans()
    assert g.engine_index() == 1 and g.launches() == 1
    return g._plan_obj.built.steps[0]


def test_engine_follows_switches(monkeypatch):
    from pydnn._build import cache

    st = _step(monkeypatch, (4, 16, 1024), PW_RUNS=4, PW_GRID=16, PW_SPLIT=True, PW_MIN_BLOCKS=0)
    text = cache._source_memo[st.unit.source][0]
    assert st.runs == 4 and "constexpr int R = 4;" in text and st.grid == (8, 1, 1)  # 65536 / (8 * 4 * 256)
    assert "_loop<1>(p);" in text and "_loop<0>(p);" in text and "__launch_bounds__(256)" in text
    st1 = _step(monkeypatch, (4, 16, 1024), PW_RUNS=1, PW_GRID=16, PW_SPLIT=False, PW_MIN_BLOCKS=3)
    t1 = cache._source_memo[st1.unit.source][0]
    assert st1.runs == 1 and "_loop<2>(p);" in t1 and "_loop<1>" not in t1 and "__launch_bounds__(256, 3)" in t1
    assert st1.unit.name != st.unit.name
    st2 = _step(monkeypatch, (4, 16, 96), PW_RUNS=4)       # 32 * 8 * 2 does not divide 96: one run
    assert st2.runs == 1
    st3 = _step(monkeypatch, (64, 1024, 4096), PW_RUNS=2, PW_GRID=0)
    assert st3.per_sm == 0 and st3.work_blocks == 64 * 1024 * 4096 // (8 * 2 * 256)


PROPS = re.compile(r"Function properties for (\S+)[^\n]*\n[^\n]*?(\d+) bytes stack frame, (\d+) bytes spill stores"
                   r"[^\n]*\n[^\n]*?Used (\d+) registers")


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_chain_forms_compile_without_spills(arch, monkeypatch):
    """NVRTC compiles the 8-op chain (bf16, the benchmark's broadcasts) in each form; ptxas reports no
    spill, and the split forms stay within the registers of one wave of at least 4 blocks of 256."""
    from pydnn._build import cache
    from pydnn._build.manifest import COMMON_OPTIONS
    from pydnn._cuda import nvrtc

    for split, runs, minb, fast in ((False, 1, 0, False), (True, 1, 0, False), (True, 2, 0, False),
                                    (True, 4, 0, False), (True, 2, 4, False), (True, 4, 0, True), (True, 2, 0, True),
                                    (True, 2, 5, True), (True, 1, 0, True)):
        st = _step(monkeypatch, (2, 8, 4096), PW_SPLIT=split, PW_RUNS=runs, PW_MIN_BLOCKS=minb, PW_TANH_FAST=fast,
                   PW_GELU_FAST=fast)
        assert st.runs == runs
        text = cache._source_memo[st.unit.source][0]
        _, lowered, log = nvrtc.compile_cubin(text, st.unit.source, (st.expr,), arch,
                                              COMMON_OPTIONS + ("--ptxas-options=-v",), [str(cache.ptx_dir())])
        props = {f: (int(a), int(b), int(r)) for f, a, b, r in PROPS.findall(log)}
        frame, spill, regs = props[lowered[st.expr]]
        assert (frame, spill) == (0, 0), log
        assert regs <= 64, (split, runs, minb, log)
        if fast:  # tanh.approx.f32 is in sm_80's and sm_90's PTX: MUFU.TANH
            assert "tanh_fast(" in text and "gelu_fast" in text
        if minb:
            assert regs <= 65536 // (256 * minb), log


@pytest.mark.parametrize("params, alpha, on, want", [
    (dict(upper=4.0), 1.0, True, True),
    (dict(upper=9.0, lower=0.5), 1.0, True, True),
    (dict(upper=9.5), 1.0, True, False),              # past the range tanh_nonneg matches tanhf on
    (dict(), 1.0, True, False),                       # no upper clip
    (dict(upper=4.0, lower=-1.0), 1.0, True, False),  # may be negative
    (dict(upper=4.0, slope=0.1), 1.0, True, False),   # leaky: below the lower clip
    (dict(upper=4.0), 2.0, True, False),              # tanh's own alpha1 scales the value
    (dict(upper=4.0), 1.0, False, False),             # tuning.graph.PW_RANGE off
])
def test_tanh_of_a_clipped_value_uses_tanh_nonneg(monkeypatch, params, alpha, on, want):
    monkeypatch.setattr(tuning.graph, "PW_RANGE", on)
    nodes = [cg.PwNode(P.PYDNN_POINTWISE_RELU_FWD, params, x=("op", 0)),
             cg.PwNode(P.PYDNN_POINTWISE_TANH_FWD, alpha1=alpha, x=("v", 0))]
    prog = cg.PwProgram([("f32", "in"), ("f32", "out")], nodes, [(1, 1)])
    (_, relu), (_, tanh) = cg.expressions(prog)
    assert ("tanh_nonneg(" in tanh) == want and ("tanhf(" in tanh) == (not want)
    # numpy evaluation of the emitted expressions (the CPU tests' emulation) against the reference formula
    from pydnn.graph import pointwise_ops as pw

    env = pw.numpy_namespace(np)
    x = np.linspace(-3, 12, 301, dtype=np.float32)
    v0 = eval(pw.to_numpy_source(relu.replace("in0", "x")), env, dict(x=x))  # noqa: S307
    v1 = eval(pw.to_numpy_source(tanh.replace("v0", "v")), env, dict(v=v0))  # noqa: S307
    lo, hi = params.get("lower", 0.0), params.get("upper", np.inf)
    r = np.where(x < lo, lo + params.get("slope", 0.0) * (x - lo), np.minimum(x, hi))
    np.testing.assert_allclose(v1, np.tanh(np.float32(alpha) * r.astype(np.float32)), rtol=1e-6)


def test_chain_kernel_uses_tanh_nonneg_and_fewer_instructions(monkeypatch):
    """The benchmark's chain (relu clipped at 4 -> tanh) with the 16-bit forms off is generated with
    tanh_nonneg and erff; ptxas compiles it."""
    from pydnn._build import cache

    st = _step(monkeypatch, (2, 8, 4096), PW_RUNS=2, PW_TANH_FAST=False, PW_GELU_FAST=False)
    text = cache._source_memo[st.unit.source][0]
    assert "tanh_nonneg(" in text and "tanhf(" not in text and "erff(" in text


def test_chain_kernel_bf16_defaults_take_the_16_bit_forms(monkeypatch):
    """At the defaults the bf16 chain (every output bfloat16) takes gelu_fast and tanh_fast: no erff, no
    tanhf / tanh_nonneg; the same chain in float keeps erff and tanh_nonneg, in half gelu_fast and
    tanh_nonneg (tanh.approx's 2^-11 is about an fp16 half ulp: bfloat16 outputs only)."""
    from pydnn._build import cache

    monkeypatch.setattr(tuning.graph, "PW_TANH_FAST", True)
    monkeypatch.setattr(tuning.graph, "PW_GELU_FAST", True)
    st = _step(monkeypatch, (2, 8, 4096))
    text = cache._source_memo[st.unit.source][0]
    assert "tanh_fast(" in text and "gelu_fast" in text and "erff(" not in text and "tanh_nonneg(" not in text
    for io, gelu, tanh in ((P.PYDNN_DATA_FLOAT, "erff(", "tanh_nonneg("), (P.PYDNN_DATA_HALF, "gelu_fast(", "tanh_nonneg(")):
        g = _chain(cpu_handle(), (2, 8, 4096), io)
        g.build_operation_graph().create_execution_plans().build_plans()
        t = cache._source_memo[g._plan_obj.built.steps[0].unit.source][0]
        body = t[t.index("for (int e = 0; e < E * R; ++e)"):]
        assert gelu in body and tanh in body and "tanh_fast(" not in body, io


def test_one_wave_grid_from_the_driver_occupancy(monkeypatch):
    """PW_GRID 0 / -k: the first launch on a handle asks the driver how many blocks stay resident an SM and
    launches 1 / k times that many an SM (never more than the work); a driver that cannot say leaves the
    16-an-SM cap."""
    import contextlib

    from pydnn._cuda import driver
    from pydnn.graph import engines as EN

    class FakeDriver:
        def __init__(self, n, err=0):
            self.n, self.err, self.calls = n, err, 0

        def cuOccupancyMaxActiveBlocksPerMultiprocessor(self, fn, threads, smem):  # noqa: N802
            assert fn == "fn" and threads == 256 and smem == 0
            self.calls += 1
            return self.err, self.n

    grids = []
    monkeypatch.setattr(driver, "pushed", lambda ctx: contextlib.nullcontext())
    monkeypatch.setattr(driver, "launch_args", lambda fn, grid, *a: grids.append(grid))
    for n, err, grid, dims, want in ((6, 0, 0, (64, 1024, 4096), 6 * 132), (6, 0, 0, (4, 16, 1024), 32),
                                     (0, 1, 0, (64, 1024, 4096), 16 * 132), (4, 0, -4, (64, 1024, 4096), 16 * 132),
                                     (12, 0, -3, (64, 1024, 4096), 24 * 132)):  # at most 8 resident blocks a wave
        fake = FakeDriver(n, err)
        monkeypatch.setattr(driver, "_driver", lambda fake=fake: fake)
        st = _step(monkeypatch, dims, PW_RUNS=1, PW_GRID=grid)
        h = cpu_handle()
        monkeypatch.setattr(type(h), "function", lambda self, unit, expr, smem=0: "fn")
        ptr = {u: 1 << 20 for u in st.uids}
        st.run(h, ptr)
        st.run(h, ptr)
        assert grids[-1] == grids[-2] == (want, 1, 1) and fake.calls == 1


@pytest.mark.parametrize("on, out_tags, final_tag, want", [
    (False, ["bf16"], None, False), (True, ["bf16"], None, True), (True, ["f16"], None, True),
    (True, ["f32"], None, False), (True, ["bf16", "f32"], None, False), (True, ["bf16", "f16"], None, True),
    (True, [], "f32", False),     # a fused matmul / norm kernel whose own store is float
    (True, [], "bf16", True), (True, ["bf16"], "f32", False), (True, [], None, False)])
def test_gelu_fast_only_when_switched_on_and_outputs_are_16_bit(monkeypatch, on, out_tags, final_tag, want):
    monkeypatch.setattr(tuning.graph, "PW_GELU_FAST", on)
    monkeypatch.setattr(tuning.graph, "PW_GELU_DEG5", False)
    prog = cg.PwProgram([("bf16", "in")] + [(t, "out") for t in out_tags],
                        [cg.PwNode(P.PYDNN_POINTWISE_GELU_FWD, x=("op", 0))], [(0, 1 + k) for k in range(len(out_tags))])
    (_, e), = cg.expressions(prog, final_tag)
    assert ("gelu_fast(" in e) == want and ("erff(" in e) == (not want)


@pytest.mark.parametrize("on, out_tags, final_tag, alpha, want", [
    (False, ["bf16"], None, 1.0, False), (True, ["bf16"], None, 1.0, True), (True, ["bf16"], None, 2.0, True),
    (True, ["f16"], None, 1.0, False),   # tanh.approx's 2^-11 is about an fp16 half ulp: bfloat16 only
    (True, ["f32"], None, 1.0, False), (True, ["bf16", "f16"], None, 1.0, False), (True, [], "bf16", 1.0, True),
    (True, [], "f32", 1.0, False), (True, ["bf16"], "f16", 1.0, False), (True, [], None, 1.0, False)])
def test_tanh_fast_only_when_switched_on_and_outputs_are_bf16(monkeypatch, on, out_tags, final_tag, alpha, want):
    monkeypatch.setattr(tuning.graph, "PW_TANH_FAST", on)
    prog = cg.PwProgram([("bf16", "in")] + [(t, "out") for t in out_tags],
                        [cg.PwNode(P.PYDNN_POINTWISE_TANH_FWD, alpha1=alpha, x=("op", 0))],
                        [(0, 1 + k) for k in range(len(out_tags))])
    (_, e), = cg.expressions(prog, final_tag)
    assert ("tanh_fast(" in e) == want and ("tanhf(" in e) == (not want)
    if alpha != 1.0:
        assert f"{pw.literal(alpha)} * in0" in e
    # the CPU emulation evaluates the emitted text: tanh_fast is tanh there
    x = np.linspace(-5, 5, 101, dtype=np.float32)
    got = eval(pw.to_numpy_source(e), pw.numpy_namespace(np), dict(in0=x))  # noqa: S307
    np.testing.assert_allclose(got, np.tanh(np.float32(alpha) * x), rtol=1e-6)


def test_tanh_fast_wins_over_tanh_nonneg(monkeypatch):
    """A clipped value's tanh in a bf16 kernel takes tanh_fast (1 instruction) over tanh_nonneg (12)."""
    nodes = [cg.PwNode(P.PYDNN_POINTWISE_RELU_FWD, dict(upper=4.0), x=("op", 0)),
             cg.PwNode(P.PYDNN_POINTWISE_TANH_FWD, x=("v", 0))]
    for on, want in ((True, "tanh_fast("), (False, "tanh_nonneg(")):
        monkeypatch.setattr(tuning.graph, "PW_TANH_FAST", on)
        prog = cg.PwProgram([("bf16", "in"), ("bf16", "out")], nodes, [(1, 1)])
        assert want in cg.expressions(prog)[1][1]


def test_matmul_and_norm_epilogues_pass_their_store_type(monkeypatch):
    """The fused matmul's epilogue asks expressions with the GEMM's C type (an fp32 GEMM + bias + GELU, whose
    program has no output operand, keeps erff), the fused norm's with y's; with tuning.graph.EPI_GELU_EX2 a
    bfloat16 GEMM epilogue takes gelu_ex2 and the norm epilogue keeps its form."""
    from pydnn.graph import norm_nodes
    from pydnn.ops import matmul as M

    monkeypatch.setattr(tuning.graph, "PW_GELU_FAST", True)
    monkeypatch.setattr(tuning.graph, "PW_GELU_DEG5", False)
    prog = cg.PwProgram([("f32", "in")], [cg.PwNode(P.PYDNN_POINTWISE_ADD, x=("acc", 0), b=("op", 0)),
                                          cg.PwNode(P.PYDNN_POINTWISE_GELU_FWD, x=("v", 0))], [])
    fast = M.TC_TILES[0]
    for ex2 in (False, True):
        monkeypatch.setattr(tuning.graph, "EPI_GELU_EX2", ex2)
        for tag, want in (("f32", "erff("), ("bf16", "gelu_fast(")):
            _, text = cg.matmul_source(prog, ("v", 1), tag, fast, M.TC_GENERAL, False, False)
            assert (("gelu_ex2(" if ex2 and tag == "bf16" else want) in text), (ex2, tag)
            _, ntext, _ = norm_nodes.epilogue_source(prog, ("v", 1), tag)
            assert want in ntext and "gelu_ex2(" not in ntext, (ex2, tag)


def test_gelu_fast_compiles_and_matches_the_activation_family():
    """graph_pointwise.cuh's gelu_fast is activation.cu's (the same steps and coefficients)."""
    from pydnn._build import cache

    act = (cache.ptx_dir() / "activation.cu").read_text()
    mine = (cache.ptx_dir() / "graph_pointwise.cuh").read_text()
    coefs = re.findall(r"[-+]?\d\.\d{9}e[-+]\d\d", act[act.index("phi_fast_parts"):act.index("phi_fast(float x)")])
    assert len(coefs) == 8 and all(c in mine for c in coefs)
    assert "0.35355339059327373f" in mine and "-0.72134752044448170f" in mine and "1e30f" in mine


@pytest.mark.parametrize("deg5, out_tags, want", [(False, ["bf16"], "gelu_fast("), (True, ["bf16"], "gelu_fast5("),
                                                  (True, ["f16"], "gelu_fast("), (True, ["bf16", "f16"], "gelu_fast("),
                                                  (True, ["f32"], "erff(")])
def test_gelu_deg5_only_for_bfloat16_outputs(monkeypatch, deg5, out_tags, want):
    monkeypatch.setattr(tuning.graph, "PW_GELU_FAST", True)
    monkeypatch.setattr(tuning.graph, "PW_GELU_DEG5", deg5)
    prog = cg.PwProgram([("bf16", "in")] + [(t, "out") for t in out_tags],
                        [cg.PwNode(P.PYDNN_POINTWISE_GELU_FWD, x=("op", 0))], [(0, 1 + k) for k in range(len(out_tags))])
    (_, e), = cg.expressions(prog)
    assert want in e


def test_gelu_fast5_error_in_float32():
    """gelu_fast5 as graph_pointwise.cuh computes it (its coefficients read from the source), each step
    rounded to float32 with exact rcp / ex2: relative error <= 1.6e-5 for |x| < 13 (<= 9e-6 for |x| <= 6),
    >= 120x below bfloat16's half ulp (2^-9); +-inf, NaN and 0 as gelu_fast."""
    import math

    src = (__import__("pydnn._build.cache", fromlist=["x"]).ptx_dir() / "graph_pointwise.cuh").read_text()
    body = src.split("float gelu_fast5(float x) {", 1)[1].split("\n}", 1)[0]
    coefs = [float(c) for c in re.findall(r"([-+]?\d\.\d{9}e[-+]\d\d)f", body)]
    assert len(coefs) == 6
    f = np.float32
    x = np.concatenate([np.linspace(-13.0, 13.0, 200001), [-1e-30, 1e-30, 3e-8, -3e-8]]).astype(f)

    def run(x):
        x64 = x.astype(np.float64)
        t = (1.0 / (np.abs(x64) * float(f(0.35355339059327373)) + 1.0)).astype(f).astype(np.float64)
        q = np.full_like(t, float(f(coefs[0])))
        for c in coefs[1:]:
            q = (q * t + float(f(c))).astype(f).astype(np.float64)
        xx = (x64 ** 2).astype(f).astype(np.float64)
        with np.errstate(over="ignore", invalid="ignore"):
            e = np.exp2((xx * float(f(-0.72134752044448170)) + q).astype(f).astype(np.float64)).astype(f).astype(np.float64)
            u = (np.minimum(np.abs(x64), float(f(1e30))) * t).astype(f).astype(np.float64)
            return (np.maximum(x64, 0.0) - u * e).astype(f).astype(np.float64), x64

    y, x64 = run(x)
    exact = np.array([v * 0.5 * math.erfc(-v / math.sqrt(2.0)) for v in x64])
    rel = np.abs(y / exact - 1.0)
    rel[exact == 0] = np.abs(y[exact == 0])
    assert rel.max() <= 1.6e-5, (rel.max(), x64[rel.argmax()])
    assert rel[np.abs(x64) <= 6].max() <= 9e-6
    y, _ = run(np.array([np.inf, -np.inf, np.nan, 0.0], f))
    assert y[0] == np.inf and y[1] == 0.0 and np.isnan(y[2]) and y[3] == 0.0


def _gelu_ex2_f32(x, hc):
    """gelu_ex2 as graph_pointwise.cuh computes it on float32 x (hc: its coefficients, highest first): a =
    min.NaN(|x|, 13), Horner by FFMA (the product exact in float64, one float32 rounding a step), ex2 exact then
    rounded to float32 and flushed below 2^-126 (.ftz), fma(-a, e, max(x, 0)) rounded once."""
    f = np.float32
    x64 = np.asarray(x, f).astype(np.float64)
    a = np.minimum(np.abs(x64), 13.0)
    a[np.isnan(x64)] = np.nan
    q = np.full_like(a, hc[0])
    for c in hc[1:]:
        q = (q * a + c).astype(f).astype(np.float64)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        e = np.exp2(q).astype(f).astype(np.float64)
        e[e < 2.0 ** -126] = 0.0
        return (np.maximum(x64, 0.0) - a * e).astype(f).astype(np.float64), x64


def test_gelu_ex2_error_in_float32():
    """gelu_ex2 (one MUFU; tuning.graph.EPI_GELU_EX2) as graph_pointwise.cuh computes it, its coefficients read
    from the source, over every 4099th float32 bit pattern (1.05 M values, both signs, every binade) and a dense
    grid of [-13, 13]: relative error <= 4e-5 wherever x > -12.9 and GELU(x) is a normal float (>= 48x below
    bfloat16's half ulp, 2^-9; the 16-bit rule's 30x is 6.5e-5), x >= 13 gives x exactly, x <= -12.9 gives either
    that accuracy or -0 where |GELU(x)| < 1.6e-37 (Phi(x) < 2^-126: ex2.approx.ftz flushes); +-inf, NaN, 0 as
    gelu_fast. (tools/gelu_ex2.py scan runs every bit pattern.)"""
    import math

    src = (__import__("pydnn._build.cache", fromlist=["x"]).ptx_dir() / "graph_pointwise.cuh").read_text()
    body = src.split("float gelu_ex2(float x) {", 1)[1].split("\n}", 1)[0]
    hc = [float(np.float32(c)) for c in re.findall(r"([-+]?\d\.\d{9}e[-+]\d\d)f", body)]
    assert len(hc) == 10 and "min.NaN.f32 %0, t, 0f41500000" in body  # degree 9; the clamp at 13.0
    bits = np.arange(0, 1 << 32, 4099, dtype=np.uint64).astype(np.uint32)
    x = np.concatenate([bits.view(np.float32), np.linspace(-13.0, 13.0, 200001, dtype=np.float32)])
    x = x[np.isfinite(x) & (np.abs(x) < 3e38)]
    y, x64 = _gelu_ex2_f32(x, hc)
    phi = 0.5 * np.vectorize(math.erfc)(-x64 / math.sqrt(2.0))
    exact = x64 * phi
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.abs(y / exact - 1.0)
    normal = np.abs(exact) >= 2.0 ** -126
    main = normal & (x64 > -12.9)
    assert rel[main].max() <= 4e-5, (rel[main].max(), x64[main][rel[main].argmax()])
    big = x64 >= 13.0
    assert np.array_equal(y[big], x64[big])
    tail = x64 <= -12.9
    ok = (rel[tail] <= 4e-5) | ((y[tail] == 0.0) & (np.abs(exact[tail]) < 1.6e-37))
    assert ok.all(), x64[tail][~ok][:5]
    # subnormal results (|x| < ~2^-125): the same relative error beyond float32's 2^-149 spacing there
    sub = ~normal & (x64 > -12.9) & (exact != 0)
    assert (np.abs(y[sub] - exact[sub]) <= 4e-5 * np.abs(exact[sub]) + 2.0 ** -149).all()
    y, _ = _gelu_ex2_f32(np.array([np.inf, -np.inf, np.nan, 0.0], np.float32), hc)
    assert y[0] == np.inf and y[1] == 0.0 and np.isnan(y[2]) and y[3] == 0.0


def test_launch_bounds_only_where_a_thread_holds_few_runs(monkeypatch):
    """PW_MIN_BLOCKS (8 at the defaults: 32 registers) applies where contiguous inputs x runs (x 2 with the
    prefetch form) <= PW_MIN_BLOCKS_RUNS and no input is strided: the broadcast chain (x, b contiguous, 2 runs)
    takes it; with s, b full (3 contiguous inputs), prefetching, 4 runs, or a strided x it does not."""
    from pydnn._build import cache

    monkeypatch.setattr(tuning.graph, "PW_MIN_BLOCKS", 8)
    monkeypatch.setattr(tuning.graph, "PW_MIN_BLOCKS_RUNS", 4)

    def bounds(dims=(2, 8, 4096), full=False, xstride=None, io=P.PYDNN_DATA_BFLOAT16, arch="sm_90", **sw):
        for k, v in sw.items():
            monkeypatch.setattr(tuning.graph, k, v)
        n, c, w = dims
        h = cpu_handle()
        h.arch = arch
        g = Graph(io_data_type=io, handle=h)
        x = g.tensor(name="x", dim=[n, c, w], stride=xstride)
        s = g.tensor(name="s", dim=[n, c, w] if full else [1, c, 1])
        b = g.tensor(name="b", dim=[n, c, w] if full else [1, 1, w])
        v = g.tanh(g.relu(g.sub(g.mul(g.gelu(g.add(g.mul(x, s), b)), x), b), upper_clip=4.0))
        g.add(v, x).set_output(True).set_name("y")
        g.build_operation_graph().create_execution_plans().build_plans()
        st = g._plan_obj.built.steps[0]
        text = cache._source_memo[st.unit.source][0]
        assert ("__launch_bounds__(256, 8)" in text) == (st.min_blocks == 8)
        return st.min_blocks

    assert bounds(PW_RUNS=2, PW_PREFETCH=False) == 8
    assert bounds(PW_RUNS=1) == 8
    assert bounds(full=True, PW_RUNS=1) == 8          # 3 x 1
    assert bounds(full=True, PW_RUNS=2) == 0          # 3 x 2
    assert bounds(PW_RUNS=4) == 0                     # 2 x 4
    assert bounds(PW_RUNS=2, PW_PREFETCH=True) == 0   # 2 x 2 x 2
    assert bounds(PW_RUNS=1, PW_PREFETCH=True) == 8   # 2 x 1 x 2
    assert bounds(PW_RUNS=2, PW_PREFETCH=False, xstride=[8 * 4096 * 2, 4096 * 2, 2]) == 0  # x strided: "g"
    assert bounds(PW_RUNS=2, io=P.PYDNN_DATA_HALF) == 0   # half / float outputs spilled at 32 registers
    assert bounds(PW_RUNS=2, io=P.PYDNN_DATA_FLOAT) == 0
    assert bounds(PW_RUNS=2, arch="sm_80") == 0           # so did the bfloat16 chain on sm_80


def test_the_benchmark_chain_fits_32_registers_on_sm_90():
    """The broadcast chain at the defaults (launch bounds 8, 2 runs, gelu_fast5, tanh_fast) compiles for
    sm_90 in 32 registers with no stack frame and no spill (the measured 88% of copy)."""
    from pydnn._build import cache
    from pydnn._build.manifest import COMMON_OPTIONS
    from pydnn._cuda import nvrtc

    g = _chain(cpu_handle(), (64, 1024, 4096))
    g.build_operation_graph().create_execution_plans().build_plans()
    st = g._plan_obj.built.steps[0]
    text = cache._source_memo[st.unit.source][0]
    assert st.min_blocks == 8 and st.runs == 2 and "gelu_fast5(" in text and "tanh_fast(" in text
    _, lowered, log = nvrtc.compile_cubin(text, st.unit.source, (st.expr,), "sm_90",
                                          COMMON_OPTIONS + ("--ptxas-options=-v",), [str(cache.ptx_dir())])
    props = {f: (int(a), int(b), int(r)) for f, a, b, r in PROPS.findall(log)}
    assert props[lowered[st.expr]] == (0, 0, 32), log
