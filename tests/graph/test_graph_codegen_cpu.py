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

    assert ctypes.sizeof(cg.GraphPwParams) == 16 * 8 + 16 * 8 * 8 + 8 * 8 + 8 + 8
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
