"""The graph API's code generator on the CPU: every pointwise mode's expression (the very string the
fused kernel gets) evaluated in numpy float32 against the float64 reference; the kernel's offset math
(numpy emulation) against numpy broadcasting, with dim collapsing; the params struct against
ptx/graph_params.h; and NVRTC compiling generated kernels for sm_80 and sm_90."""
import math

import numpy as np
import pytest

import pydnn
from pydnn.graph import codegen as cg
from pydnn.graph import pointwise_ops as pw
from pydnn.reference import graph as ref

MODES = sorted(pw.MODES)


def _inputs(name, rng, n=257):
    kind = pw.MODES[name][0]
    x = rng.uniform(-3, 3, n).astype(np.float32)
    if name in ("LOG", "SQRT", "RSQRT"):
        x = rng.uniform(0.1, 4, n).astype(np.float32)
    if name == "POW":
        x = rng.uniform(0.1, 3, n).astype(np.float32)
    if name.startswith("CMP") or name.startswith("LOGICAL"):
        x = rng.integers(-1, 2, n).astype(np.float32)
    b = rng.uniform(-3, 3, n).astype(np.float32) if "b" in kind or kind == "xdy" else None
    if b is not None and name in ("DIV", "MOD"):
        b = np.where(np.abs(b) < 0.2, 0.5, b).astype(np.float32)
    if b is not None and (name.startswith("CMP") or name.startswith("LOGICAL")):
        b = rng.integers(-1, 2, n).astype(np.float32)
    t = rng.integers(0, 2, n).astype(np.float32) if kind == "xbt" else None
    return x, b, t


@pytest.mark.parametrize("name", MODES)
@pytest.mark.parametrize("params", [{}, dict(lower=-0.5, upper=2.0, slope=0.1, elu_alpha=0.7, softplus_beta=2.0,
                                              swish_beta=1.5)])
def test_expression_matches_reference(name, params):
    rng = np.random.default_rng(hash(name) % 2**32)
    x, b, t = _inputs(name, rng)
    mode = getattr(pydnn, "PYDNN_POINTWISE_" + name)
    expr = pw.expression(mode, params, "x", "b" if b is not None else None, "t" if t is not None else None)
    ns = pw.numpy_namespace(np)
    ns.update(x=x, b=b, t=t)
    with np.errstate(all="ignore"):
        got = np.asarray(eval(pw.to_numpy_source(expr), {"__builtins__": {}}, ns), np.float64)  # noqa: S307
    want = ref.pointwise(name, x, b, t, **params)
    np.testing.assert_allclose(got, np.broadcast_to(want, got.shape), rtol=2e-5, atol=2e-5, err_msg=expr)


def test_every_cudnn_mode_is_known():
    names = {k[len("PYDNN_POINTWISE_"):] for k in pydnn.ENUMS["pydnnPointwiseMode_t"]}
    assert names == set(pw.MODES) | {"GEN_INDEX"}


@pytest.mark.parametrize("seed", range(25))
def test_offsets_emulation_matches_broadcasting(seed):
    rng = np.random.default_rng(seed)
    nd = int(rng.integers(1, 6))
    dims = [int(v) for v in rng.integers(1, 5, nd)]
    strides_list, arrays = [], []
    for _ in range(int(rng.integers(1, 5))):
        bdims = [d if rng.random() < 0.7 else 1 for d in dims]
        perm = rng.permutation(nd)  # any memory order
        st = [0] * nd
        acc = 1
        for d in reversed(perm):
            st[d] = acc
            acc *= bdims[d] + int(rng.integers(0, 2))
        flat = rng.standard_normal(acc + 1)
        view = np.lib.stride_tricks.as_strided(flat, bdims, [s * 8 for s in st])
        strides_list.append([s if bd > 1 else 0 for s, bd in zip(st, bdims)])
        arrays.append((flat, np.broadcast_to(view, dims)))
    cdims, cstrides = cg.collapse(dims, strides_list)
    assert len(cdims) <= len(dims) and int(np.prod(cdims)) == int(np.prod(dims))
    off = cg.offsets(cdims, cstrides)
    for (flat, want), o in zip(arrays, off):
        np.testing.assert_array_equal(flat[o], want.reshape(-1))
    elems, wide, grid = cg.launch_shape(cdims, cstrides, 132)
    assert cdims[-1] % elems == 0 and not wide and grid[0] >= 1
    for (flat, want), o in zip(arrays, cg.thread_offsets(cdims, cstrides, elems)):
        np.testing.assert_array_equal(flat[o], want.reshape(-1))


def test_launch_shape():
    assert cg.launch_shape([6, 4], [[4, 1]], 132)[:2] == (4, False)
    assert cg.launch_shape([6, 6], [[6, 1]], 132)[:2] == (2, False)
    assert cg.launch_shape([7, 5], [[5, 1]], 132)[:2] == (1, False)
    assert cg.launch_shape([2**31], [[1]], 132)[1] is True            # the index reaches past an int
    assert cg.launch_shape([2, 8], [[2**31, 1]], 132)[1] is True      # an offset past an int


def test_collapse_packed_is_one_dim():
    dims, st = cg.collapse([2, 3, 4], [[12, 4, 1], [12, 4, 1], [0, 0, 1]])
    assert dims == [6, 4] and st == [[4, 1], [4, 1], [0, 1]]
    dims, st = cg.collapse([2, 3, 4], [[12, 4, 1], [12, 4, 1]])
    assert dims == [24] and st == [[1], [1]]


def test_params_layout():
    import ctypes

    assert ctypes.sizeof(cg.GraphPwParams) == 16 * 8 + 16 * 8 * 8 + 8 * 8 + 8 + 8 + 8 * 4 + 8 * 4
    p = cg.params([6, 4], [[4, 1], [0, 1]], [1 << 20, 2 << 20])
    assert p.total == 24 and p.ndim == 2 and p.stride[1][0] == 0 and p.ptr[1] == 2 << 20


def _all_modes_program(tag):
    ops = [(tag, "in"), (tag, "in"), ("f32", "in"), (tag, "out")]
    nodes = []
    for name in MODES:
        kind = pw.MODES[name][0]
        prev = ("v", len(nodes) - 1) if nodes else ("op", 0)
        nodes.append(cg.PwNode(getattr(pydnn, "PYDNN_POINTWISE_" + name), {"upper": 6.0} if name == "RELU_FWD" else {},
                               1.0, 0.5, x=prev, b=("op", 1) if kind != "x" else None,
                               t=("op", 2) if kind == "xbt" else None))
    return cg.PwProgram(ops, nodes, [(len(nodes) - 1, 3)])


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("tag", ["f32", "f16", "bf16"])
def test_generated_kernel_compiles(arch, tag, tmp_path, monkeypatch):
    """NVRTC compiles a kernel that chains every pointwise mode (one node each) for each storage type."""
    from pydnn._build import build, cache

    monkeypatch.setenv("PYDNN_CACHE_DIR", str(tmp_path))
    unit, expr = cg.kernel_unit(_all_modes_program(tag), 3, elems=4, wide=(tag == "f32"))
    cubin, lowered = build.compile_unit(unit, arch)
    assert cubin[:4] == b"\x7fELF" and set(lowered) == {expr}
    # cached under the generated text's key: the loader finds it without compiling again
    nv = build.nvrtc.version()
    assert cache.read_entry(cache.entry_path(unit, arch, cache.unit_key(unit, arch, nv))) is not None


def test_same_program_same_unit_and_different_program_different_key():
    p1 = _all_modes_program("f16")
    u1, e1 = cg.kernel_unit(p1, 2)
    u2, e2 = cg.kernel_unit(_all_modes_program("f16"), 2)
    u3, _ = cg.kernel_unit(_all_modes_program("bf16"), 2)
    u4, _ = cg.kernel_unit(p1, 3)
    assert (u1, e1) == (u2, e2) and u3.name != u1.name and u4.name != u1.name
    assert math.isfinite(len(e1))


def _epilogue_program():
    """bias add, GELU, residual add; the pre-activation is also stored (a second output)."""
    ops = [("bf16", "in"), ("f16", "in"), ("f32", "out")]
    nodes = [cg.PwNode(pydnn.PYDNN_POINTWISE_ADD, x=("acc", 0), b=("op", 0)),
             cg.PwNode(pydnn.PYDNN_POINTWISE_GELU_FWD, x=("v", 0)),
             cg.PwNode(pydnn.PYDNN_POINTWISE_ADD, x=("v", 1), b=("op", 1))]
    return cg.PwProgram(ops, nodes, [(0, 2)])


@pytest.mark.parametrize("arch, wgmma", [("sm_80", False), ("sm_90", True)])
def test_generated_matmul_epilogue_compiles(arch, wgmma, tmp_path, monkeypatch):
    """NVRTC compiles a GEMM with a generated epilogue: on sm_80 the 128x256 mma.sync tile, on sm_90 the
    wgmma tile (an sm_90a unit), each with the general path beside it."""
    from pydnn._build import build, manifest
    from pydnn.ops import matmul as M

    monkeypatch.setenv("PYDNN_CACHE_DIR", str(tmp_path))
    fast = M.WG_TILES[0] if wgmma else M.TC_TILES[0]
    unit, fe, ge = cg.matmul_unit(_epilogue_program(), ("v", 2), "bf16", fast, M.TC_GENERAL, False, True)
    assert manifest.unit_arch(unit, arch) == ("sm_90a" if wgmma else arch)
    cubin, lowered = build.compile_unit(unit, arch)
    assert cubin[:4] == b"\x7fELF" and set(lowered) == {fe, ge}
    _, text = cg.matmul_source(_epilogue_program(), ("v", 2), "bf16", fast, M.TC_GENERAL, False, True)
    assert "acc0 = v2;" in text and "acc1 = v2;" in text and "e.ptr[2]" in text and ("gemm_wgmma_body" in text) == wgmma


@pytest.mark.parametrize("arch, wgmma", [("sm_80", False), ("sm_90", True)])
def test_generated_matmul_row_reduction_compiles(arch, wgmma, tmp_path, monkeypatch):
    """NVRTC compiles a GEMM whose epilogue adds a bias (read once for both rows: access "C"), stores an
    extra output, and reduces each row (every reduce op the epilogue serves), with and without the C store."""
    from pydnn._build import build
    from pydnn.ops import matmul as M

    monkeypatch.setenv("PYDNN_CACHE_DIR", str(tmp_path))
    fast = M.WG_TILES[0] if wgmma else M.TC_TILES[0]
    ops = [("bf16", "in"), ("f32", "in"), ("f16", "out"), ("f32", "out")]
    nodes = [cg.PwNode(pydnn.PYDNN_POINTWISE_ADD, x=("acc", 0), b=("op", 0)),
             cg.PwNode(pydnn.PYDNN_POINTWISE_MUL, x=("v", 0), b=("op", 1))]
    prog = cg.PwProgram(ops, nodes, [(0, 2)])
    for i, mode in enumerate(cg.RED):
        if (i % 3 != 0) and mode not in ("MAX", "NORM2"):
            continue  # compile time: a sample of the ops here, every op's text below
        unit, fe, ge = cg.matmul_unit(prog, ("v", 1), "bf16", fast, M.TC_GENERAL, False, False,
                                      access=["C", "b", "c", "g"], red=dict(mode=mode, y=3), store_c=(i % 2 == 0))
        cubin, lowered = build.compile_unit(unit, arch)
        assert cubin[:4] == b"\x7fELF" and set(lowered) == {fe, ge}
    for mode, (init, mp, comb, done) in cg.RED.items():
        _, text = cg.matmul_source(prog, ("v", 1), "bf16", fast, M.TC_GENERAL, False, False,
                                   access=["C", "b", "c", "g"], red=dict(mode=mode, y=3), store_c=False)
        assert f"return {init};" in text and f"return {mp};" in text and f"store<float>({done})" in text
        assert "kRed = true, kStoreC = false" in text and "e.ptr[4]" in text and "e.ptr[5]" in text
        # "C": no row term in the bias's address; "b": one value a row; "c": a pair load where flags allow
        assert "r.p0 = static_cast<const bf16_t*>(e.ptr[0]) + z * e.stride[0][0];" in text
        assert "r.b1 = ldf(" in text and "(e.flags >> 2)" not in text
    with pytest.raises(ValueError):
        cg.matmul_source(prog, ("v", 1), "bf16", fast, M.TC_GENERAL, False, False, access=["c", "b", "C", "g"])
    with pytest.raises(ValueError):
        cg.matmul_source(prog, ("v", 1), "bf16", fast, M.TC_GENERAL, False, False, red=dict(mode="SOFTMAX", y=3))


def test_red_ops_match_reduce_reference():
    """Each reduction op's init / map / combine / result, evaluated in numpy as the kernel evaluates it
    (partials over column blocks combined in order), against pydnn.reference.reduce."""
    from pydnn.reference.reduce import reduce as ref_reduce

    rng = np.random.default_rng(5)
    x = rng.uniform(-2, 2, (6, 40))
    x[2, 5] = 0.0
    env = dict(fminf=np.minimum, fmaxf=np.maximum, fabsf=np.abs, sqrtf=np.sqrt, INFINITY=np.inf)
    for mode, (init, mp, comb, done) in cg.RED.items():
        f = lambda s: s.replace("0.0f", "0.0").replace("1.0f", "1.0").replace("(float)n", "n")  # noqa: E731
        mp_ = f(mp).replace("(v == 0.0 ? 1.0 : v)", "np.where(v == 0.0, 1.0, v)")
        vals = eval(mp_, dict(env, np=np), dict(v=x))  # noqa: S307
        parts = []
        for blk in np.split(vals, 4, axis=1):  # tiles: each reduced alone, then combined in order
            a = np.full(x.shape[0], eval(f(init), env))  # noqa: S307
            for col in blk.T:
                a = eval(f(comb), env, dict(a=a, b=col))  # noqa: S307
            parts.append(a)
        a = np.full(x.shape[0], eval(f(init), env))  # noqa: S307
        for pa in parts:
            a = eval(f(comb), env, dict(a=a, b=pa))  # noqa: S307
        got = eval(f(done), env, dict(a=a, n=x.shape[1]))  # noqa: S307
        want, _, _ = ref_reduce(getattr(pydnn, "PYDNN_REDUCE_TENSOR_" + mode), 1.0, x, 0.0, None, [6, 1])
        np.testing.assert_allclose(got, want[:, 0], rtol=1e-12, err_msg=mode)


def test_pointwise_vector_paths_compile(tmp_path, monkeypatch):
    """The pointwise kernel with every operand access kind (contiguous: a 16-byte vector or element by
    element by p.flags; broadcast along the innermost dim: once a run; strided) for sm_80 and sm_90."""
    from pydnn._build import build

    monkeypatch.setenv("PYDNN_CACHE_DIR", str(tmp_path))
    ops = [("bf16", "in"), ("f32", "in"), ("f16", "in"), ("bf16", "out"), ("f32", "out")]
    nodes = [cg.PwNode(pydnn.PYDNN_POINTWISE_MUL, x=("op", 0), b=("op", 1)),
             cg.PwNode(pydnn.PYDNN_POINTWISE_ADD, x=("v", 0), b=("op", 2))]
    prog = cg.PwProgram(ops, nodes, [(1, 3), (0, 4)])
    unit, expr = cg.kernel_unit(prog, 3, elems=8, wide=False, access=["c", "b", "g", "c", "g"])
    _, text = cg.source(prog, 3, 8, False, ["c", "b", "g", "c", "g"])
    assert "Run16<bf16_t, E>::load(" in text and "const float b1 = " in text and "p.stride[2][2]" in text
    assert "Run16<bf16_t, E>::store(" in text and "p.stride[4][2]" in text
    _, t1 = cg.source(prog, 3, 1, False, ["c", "b", "g", "c", "g"])
    assert "Run" not in t1  # one element a thread: no vector path
    for arch in ("sm_80", "sm_90"):
        cubin, lowered = build.compile_unit(unit, arch)
        assert cubin[:4] == b"\x7fELF" and set(lowered) == {expr}


def test_pointwise_launch_shape_vectors():
    # bf16: 8 elements (16 bytes) a thread; f32: 4; mixed: the narrowest type's 16 bytes
    assert cg.launch_shape([64, 1024, 4096], [[4194304, 4096, 1], [0, 1, 0]], 132, [2, 2])[0] == 8
    assert cg.launch_shape([64, 4096], [[4096, 1]], 132, [4])[0] == 4
    assert cg.launch_shape([64, 4096], [[4096, 1], [4096, 1]], 132, [4, 2])[0] == 8
    assert cg.launch_shape([64, 4100], [[4100, 1]], 132, [2])[0] == 4  # halved until it divides
    assert cg.launch_shape([64, 4096], [[4096, 1]], 132, [2])[2][0] == min(64 * 4096 // 8 // 256, 132 * 16)
    assert cg.access_kinds([[8, 1], [0, 0], [1, 8]]) == ["c", "b", "g"]
    assert cg.vector_ok([4, 16], [[16, 1], [0, 0]], 8) and not cg.vector_ok([4, 16], [[20, 1]], 8)
    assert cg.vector_ok([1, 16], [[3, 1]], 8)  # a dim of one is never stepped


def test_magic_division_matches_integer_division():
    """The 32-bit kernels' div by a dim (multiply-high and shifts, codegen.magic_u32) equals n // d for
    the dims a kernel sees and the numerators its index reaches: edges, powers of two, random values."""
    rng = np.random.default_rng(11)
    ds = [1, 2, 3, 5, 7, 8, 130, 1000, 1024, 4095, 4096, 65537, 2**20 + 3, 2**30, 2**31 - 1]
    ds += [int(v) for v in rng.integers(2, 2**31 - 1, 40)]
    for d in ds:
        m, s = cg.magic_u32(d)
        n = np.concatenate([np.arange(0, 3000, dtype=np.uint64), rng.integers(0, 2**32, 4000, dtype=np.uint64),
                            np.array([d - 1, d, d + 1, 2 * d - 1, 2 * d, 2**31 - 1, 2**32 - 1], np.uint64) % 2**32])
        np.testing.assert_array_equal(cg.udiv_emulated(n, m, s), n // np.uint64(d), err_msg=str(d))
        assert 0 <= m < 2**32


def _bias_gelu_program():
    """gelu(acc + bias): tools/bench_graph.py's fused graph as the engine generates it (bias access "C")."""
    nodes = [cg.PwNode(pydnn.PYDNN_POINTWISE_ADD, x=("acc", 0), b=("op", 0)),
             cg.PwNode(pydnn.PYDNN_POINTWISE_GELU_FWD, x=("v", 0))]
    return cg.PwProgram([("bf16", "in")], nodes, [])


def test_fused_gelu_on_persistent_wgmma_does_not_spill():
    """The fused gelu(x @ W + b) on the persistent 128x256 wgmma tile (gemm_wgmma_body<..., true>, the
    chooser's tile with tuning.matmul.WG_PERSIST): NVRTC compiles it for sm_90a and ptxas reports no spill
    in the fast kernel (a spill in the epilogue ran the fused kernel at 2x the plain one's time before the
    FAST path: ptx/matmul.cu at NoEpi)."""
    import re

    from pydnn._build import cache
    from pydnn._build.manifest import COMMON_OPTIONS
    from pydnn._cuda import nvrtc
    from pydnn.ops import matmul as M

    name, text = cg.matmul_source(_bias_gelu_program(), ("v", 1), "bf16", M.WG_PERSIST_TILE, M.TC_GENERAL, False,
                                  False, access=["C"])
    assert "gemm_wgmma_body<pydnn::bf16_t, 256, 4, false, false, true, 2, true>" in text  # persistent, run-on
    fe = f"pydnn::graph::{name}_f"
    _, lowered, log = nvrtc.compile_cubin(text, f"graph/{name}.cu", (fe,), "sm_90a",
                                          COMMON_OPTIONS + ("--ptxas-options=-v",), [str(cache.ptx_dir())])
    # "Function properties for NAME" and, on the next line (after a "ptxas ." prefix), its frame and spills
    props = {f: (int(a), int(b)) for f, a, b in re.findall(
        r"Function properties for (\S+)[^\n]*\n[^\n]*?(\d+) bytes stack frame, (\d+) bytes spill stores", log)}
    assert props.get(lowered[fe]) == (0, 0), log
    # bias + residual (two pair loads a column pair): with the next tile's copier live through the epilogue
    # it spilled 264 bytes; set up again after it, 4 (the one-block kernel before the persistent form: 36)
    nodes = [cg.PwNode(pydnn.PYDNN_POINTWISE_ADD, x=("acc", 0), b=("op", 0)),
             cg.PwNode(pydnn.PYDNN_POINTWISE_ADD, x=("v", 0), b=("op", 1))]
    prog = cg.PwProgram([("bf16", "in"), ("bf16", "in")], nodes, [])
    name, text = cg.matmul_source(prog, ("v", 1), "bf16", M.WG_PERSIST_TILE, M.TC_GENERAL, False, False,
                                  access=["C", "c"])
    fe = f"pydnn::graph::{name}_f"
    _, lowered, log = nvrtc.compile_cubin(text, f"graph/{name}.cu", (fe,), "sm_90a",
                                          COMMON_OPTIONS + ("--ptxas-options=-v",), [str(cache.ptx_dir())])
    props = {f: (int(a), int(b)) for f, a, b in re.findall(
        r"Function properties for (\S+)[^\n]*\n[^\n]*?(\d+) bytes stack frame, (\d+) bytes spill stores", log)}
    assert lowered[fe] in props and props[lowered[fe]][1] <= 64, log
