"""Pooling on the CPU: every validation error (status + the argument it names), descriptor set / get and the
output-dim queries, the float64 reference against direct formulas (tie rule, NaN rules, adaptive windows,
backward as the vector-Jacobian product), that the kernel units compile without spills, and an emulation of
the kernels over the host's real launch parameters: each work item's coordinates, windows, covering ranges,
vector addresses and alignment are replayed from the PoolParams struct, proving every output element is
written exactly once with the reference's value and nothing else is touched. The C face: tests/c/pooling_cpu.c."""
import itertools
import re

import numpy as np
import pytest

import pydnn
from pydnn import tuning
from pydnn.ops import pooling as P
from pydnn.reference import pooling as ref
from pydnn.tensor import packed_strides
from test_fuzz_cpu import _call, _desc, cpu_handle

F32, F64, F16, BF16 = (pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DATA_DOUBLE, pydnn.PYDNN_DATA_HALF,
                       pydnn.PYDNN_DATA_BFLOAT16)
MAX, INC, EXC, MAXD = (pydnn.PYDNN_POOLING_MAX, pydnn.PYDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING,
                       pydnn.PYDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING, pydnn.PYDNN_POOLING_MAX_DETERMINISTIC)
NOPROP, PROP = pydnn.PYDNN_NOT_PROPAGATE_NAN, pydnn.PYDNN_PROPAGATE_NAN
BAD, NS = pydnn.PYDNN_STATUS_BAD_PARAM, pydnn.PYDNN_STATUS_NOT_SUPPORTED
NULL, MIS = pydnn.PYDNN_STATUS_BAD_PARAM_NULL_POINTER, pydnn.PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER
NOINIT = pydnn.PYDNN_STATUS_NOT_INITIALIZED  # everything valid: the CPU-only handle refuses at kernel lookup
X, Y, DY, DX = 1 << 40, 1 << 41, 1 << 42, 1 << 43


def _check(fn, args, status, needle):
    st = _call(fn, *args)
    msg = pydnn.get_last_error_string()
    assert st == status, (st, msg)
    assert needle in msg, msg


def _pool2d(mode=MAX, nan=NOPROP, win=(3, 3), pad=(1, 1), stride=(2, 2)):
    d = pydnn.create_pooling_descriptor()
    pydnn.set_pooling2d_descriptor(d, mode, nan, win[0], win[1], pad[0], pad[1], stride[0], stride[1])
    return d


def _poolnd(mode, nan, win, pad, stride):
    d = pydnn.create_pooling_descriptor()
    pydnn.set_pooling_nd_descriptor(d, mode, nan, len(win), win, pad, stride)
    return d


# ----------------------------------------------------------------------------- descriptors

def test_descriptor_set_get_roundtrip():
    d = _pool2d(MAXD, PROP, (3, 2), (1, 0), (2, 1))
    assert pydnn.get_pooling2d_descriptor(d) == (MAXD, PROP, 3, 2, 1, 0, 2, 1)
    assert pydnn.get_pooling_nd_descriptor(d, 2) == (MAXD, PROP, 2, [3, 2], [1, 0], [2, 1])
    assert pydnn.get_pooling_nd_descriptor(d, 1) == (MAXD, PROP, 2, [3], [1], [2])
    d3 = _poolnd(EXC, NOPROP, (2, 3, 4), (0, 1, 2), (1, 2, 3))
    assert pydnn.get_pooling_nd_descriptor(d3, 3) == (EXC, NOPROP, 3, [2, 3, 4], [0, 1, 2], [1, 2, 3])
    _check(pydnn.get_pooling2d_descriptor, (d3,), BAD, "poolingDesc: has 3 spatial dims, not 2")
    pydnn.destroy_pooling_descriptor(d3)
    pydnn.destroy_pooling_descriptor(None)
    _check(pydnn.get_pooling_nd_descriptor, (d3, 3), BAD, "poolingDesc: not a live pooling descriptor")
    _check(pydnn.destroy_pooling_descriptor, (d3,), BAD, "poolingDesc: not a live")
    _check(pydnn.get_pooling2d_descriptor, (pydnn.create_pooling_descriptor(),), BAD, "descriptor was never set")
    _check(pydnn.get_pooling_nd_descriptor, (d, -1), BAD, "nbDimsRequested: -1 is negative")


def test_descriptor_validation():
    d = pydnn.create_pooling_descriptor()
    s2 = pydnn.set_pooling2d_descriptor
    _check(s2, (d, 7, NOPROP, 3, 3, 1, 1, 2, 2), BAD, "mode: 7 is not a pydnnPoolingMode_t value")
    _check(s2, (d, MAX, 2, 3, 3, 1, 1, 2, 2), BAD, "maxpoolingNanOpt: 2 is not")
    _check(s2, (d, MAX, NOPROP, 0, 3, 0, 0, 2, 2), BAD, "windowHeight: 0 must be positive")
    _check(s2, (d, MAX, NOPROP, 3, -3, 0, 0, 2, 2), BAD, "windowWidth: -3 must be positive")
    _check(s2, (d, MAX, NOPROP, 3, 3, 0, 0, 0, 2), BAD, "verticalStride: 0 must be positive")
    _check(s2, (d, MAX, NOPROP, 3, 3, 0, 0, 2, -1), BAD, "horizontalStride: -1 must be positive")
    _check(s2, (d, MAX, NOPROP, 3, 3, -1, 0, 2, 2), BAD, "verticalPadding: -1 must not be negative")
    _check(s2, (d, MAX, NOPROP, 3, 3, 3, 0, 2, 2), BAD, "verticalPadding: 3 must be smaller than the window (windowHeight = 3)")
    _check(s2, (d, MAX, NOPROP, 3, 2, 0, 2, 2, 2), BAD, "horizontalPadding: 2 must be smaller than the window")
    _check(s2, (d, MAX, NOPROP, 3.0, 3, 0, 0, 2, 2), BAD, "windowHeight: expected an integer")
    _check(s2, ("d", MAX, NOPROP, 3, 3, 0, 0, 2, 2), BAD, "poolingDesc: not a live pooling descriptor")
    assert not d.is_set  # nothing changed by the failed calls
    sn = pydnn.set_pooling_nd_descriptor
    _check(sn, (d, MAX, NOPROP, 0, [], [], []), BAD, "nbDims: 0 spatial dims")
    _check(sn, (d, MAX, NOPROP, 4, [2] * 4, [0] * 4, [1] * 4), BAD, "nbDims: 4 spatial dims")
    _check(sn, (d, MAX, NOPROP, 3, [2, 0, 2], [0] * 3, [1] * 3), BAD, "windowDimA[1]: 0 must be positive")
    _check(sn, (d, MAX, NOPROP, 3, [2, 2, 2], [0, 0, 2], [1] * 3), BAD, "paddingA[2]: 2 must be smaller than the window (windowDimA[2] = 2)")
    _check(sn, (d, MAX, NOPROP, 3, [2, 2, 2], [0] * 3, [1, 0, 1]), BAD, "strideA[1]: 0 must be positive")
    _check(sn, (d, MAX, NOPROP, 3, [2, 2], [0] * 3, [1] * 3), BAD, "windowDimA: has 2 entries, nbDims is 3")
    _check(sn, (d, MAX, NOPROP, 2, 5, [0] * 2, [1] * 2), BAD, "windowDimA: expected a sequence")


def test_output_dims():
    x = _desc((2, 3, 7, 8))
    assert pydnn.get_pooling2d_forward_output_dim(_pool2d(), x) == (2, 3, 4, 4)
    assert pydnn.get_pooling2d_forward_output_dim(_pool2d(win=(2, 3), pad=(0, 0), stride=(3, 1)), x) == (2, 3, 2, 6)
    assert pydnn.get_pooling_nd_forward_output_dim(_pool2d(), x, 4) == [2, 3, 4, 4]
    d3 = _poolnd(MAX, NOPROP, (2, 3, 3), (1, 0, 1), (2, 1, 3))
    assert pydnn.get_pooling_nd_forward_output_dim(d3, _desc((1, 2, 5, 6, 7)), 5) == [1, 2, 3, 4, 3]
    assert pydnn.get_pooling_nd_forward_output_dim(_poolnd(MAX, NOPROP, (3,), (0,), (2,)), _desc((1, 2, 9)), 3) == [1, 2, 4]
    # the window may reach exactly the padded edge, not past it
    assert pydnn.get_pooling2d_forward_output_dim(_pool2d(win=(5, 5), pad=(1, 1), stride=(1, 1)), _desc((1, 1, 3, 3))) == (1, 1, 1, 1)
    _check(pydnn.get_pooling2d_forward_output_dim, (_pool2d(win=(5, 5), pad=(0, 1)), _desc((1, 1, 4, 4))), BAD,
           "inputTensorDesc: dim 2 (4, padded by 2 * 0) is smaller than the window (5)")
    _check(pydnn.get_pooling2d_forward_output_dim, (_pool2d(), _desc((1, 1, 4))), BAD,
           "inputTensorDesc: has 3 dims; a 2-d pooling takes 4")
    _check(pydnn.get_pooling2d_forward_output_dim, (d3, x), BAD, "poolingDesc: has 3 spatial dims, not 2")
    _check(pydnn.get_pooling_nd_forward_output_dim, (_pool2d(), x, 3), BAD, "nbDims: 3 differs from inputTensorDesc's 4 dims")
    _check(pydnn.get_pooling_nd_forward_output_dim, (_pool2d(), None, 4), BAD, "inputTensorDesc: not a live tensor")


# ----------------------------------------------------------------------------- call validation

def test_forward_validation():
    h = cpu_handle()
    f = pydnn.pooling_forward
    pd = _pool2d()
    x, y = _desc((2, 3, 7, 8)), _desc((2, 3, 4, 4))
    _check(f, (h, pd, 1.0, x, X, 0.0, y, Y), NOINIT, "")
    _check(f, (h, pd, 1.0, x, X, 0.0, _desc((2, 3, 4, 5)), Y), BAD,
           "yDesc: dims (2, 3, 4, 5) differ from the pooled dims (2, 3, 4, 4) of xDesc")
    _check(f, (h, pd, 1.0, x, X, 0.0, _desc((2, 3, 4, 4), F16), Y), BAD, "yDesc: data type")
    _check(f, (h, pd, 1.0, _desc((2, 3, 7, 8), pydnn.PYDNN_DATA_INT8), X, 0.0, _desc((2, 3, 4, 4), pydnn.PYDNN_DATA_INT8), Y),
           NS, "xDesc: data type")
    _check(f, (h, _pool2d(pad=(0, 0)), 1.0, _desc((2, 3, 2, 8)), X, 0.0, y, Y), BAD,
           "xDesc: dim 2 (2, padded by 2 * 0) is smaller than the window (3)")
    _check(f, (h, pd, 1.0, _desc((2, 3, 7, 8, 1)), X, 0.0, y, Y), BAD, "xDesc: has 5 dims; a 2-d pooling takes 4")
    _check(f, (h, pd, 1.0, x, X, 0.0, _desc((2, 3, 4, 4), F32, (48, 16, 4, 2)), Y), BAD, "yDesc: strides")
    _check(f, (h, pydnn.create_pooling_descriptor(), 1.0, x, X, 0.0, y, Y), BAD, "poolingDesc: descriptor was never set")
    _check(f, (h, "pd", 1.0, x, X, 0.0, y, Y), BAD, "poolingDesc: not a live pooling descriptor")
    _check(f, (h, pd, 1.0, None, X, 0.0, y, Y), BAD, "xDesc:")
    _check(f, (h, pd, 1.0, x, 0, 0.0, y, Y), NULL, "x: NULL")
    _check(f, (h, pd, 1.0, x, X, 0.0, y, None), NULL, "y: NULL")
    _check(f, (h, pd, 1.0, x, X + 2, 0.0, y, Y), MIS, "x: ")
    _check(f, (h, pd, "a", x, X, 0.0, y, Y), BAD, "alpha: expected a number")
    _check(f, ("h", pd, 1.0, x, X, 0.0, y, Y), BAD, "handle:")


def test_backward_validation():
    h = cpu_handle()
    b = pydnn.pooling_backward
    pd = _pool2d()
    x, y = _desc((2, 3, 7, 8)), _desc((2, 3, 4, 4))
    _check(b, (h, pd, 1.0, y, Y, y, DY, x, X, 0.0, x, DX), NOINIT, "")
    _check(b, (h, pd, 1.0, y, Y, _desc((2, 3, 4, 3)), DY, x, X, 0.0, x, DX), BAD, "dyDesc: dims (2, 3, 4, 3) differ from yDesc dims")
    _check(b, (h, pd, 1.0, y, Y, y, DY, x, X, 0.0, _desc((2, 3, 7, 9)), DX), BAD, "dxDesc: dims (2, 3, 7, 9) differ from xDesc dims")
    _check(b, (h, pd, 1.0, _desc((2, 3, 4, 3)), Y, _desc((2, 3, 4, 3)), DY, x, X, 0.0, x, DX), BAD,
           "dyDesc: dims (2, 3, 4, 3) differ from the pooled dims (2, 3, 4, 4) of dxDesc")
    _check(b, (h, pd, 1.0, y, Y, y, DY, x, X, 0.0, _desc((2, 3, 7, 8), F64), DX), BAD, "dxDesc: data type")
    _check(b, (h, pd, 1.0, y, Y, _desc((2, 3, 4, 4), BF16), DY, x, X, 0.0, x, DX), BAD, "dyDesc: data type")
    _check(b, (h, pd, 1.0, y, Y, y, DY, x, X, 0.0, _desc((2, 3, 7, 8), F32, (56, 56, 8, 1)), DX), BAD, "dxDesc: strides")
    _check(b, (h, pd, 1.0, y, 0, y, DY, x, X, 0.0, x, DX), NULL, "y: NULL")
    _check(b, (h, pd, 1.0, y, Y, y, DY, x, X, 0.0, x, DX + 1), MIS, "dx: ")
    ints = [_desc(d, pydnn.PYDNN_DATA_INT32) for d in ((2, 3, 4, 4), (2, 3, 4, 4), (2, 3, 7, 8), (2, 3, 7, 8))]
    _check(b, (h, pd, 1.0, ints[0], Y, ints[1], DY, ints[2], X, 0.0, ints[3], DX), NS, "yDesc: data type")


def test_extension_validation():
    h = cpu_handle()
    af, ab = pydnn.adaptive_pooling_forward, pydnn.adaptive_pooling_backward
    gf, gb = pydnn.global_average_pooling_forward, pydnn.global_average_pooling_backward
    x, y = _desc((2, 3, 7, 8)), _desc((2, 3, 3, 5))
    _check(af, (h, MAX, NOPROP, 1.0, x, X, 0.0, y, Y), NOINIT, "")
    _check(af, (h, 9, NOPROP, 1.0, x, X, 0.0, y, Y), BAD, "mode: 9 is not")
    _check(af, (h, MAX, 9, 1.0, x, X, 0.0, y, Y), BAD, "maxpoolingNanOpt: 9")
    _check(af, (h, MAX, NOPROP, 1.0, x, X, 0.0, _desc((2, 4, 3, 5)), Y), BAD, "yDesc: dims (2, 4, 3, 5) do not pool xDesc")
    _check(af, (h, MAX, NOPROP, 1.0, x, X, 0.0, _desc((2, 3, 3)), Y), BAD, "yDesc: dims (2, 3, 3) do not pool")
    _check(af, (h, MAX, NOPROP, 1.0, _desc((2, 3)), X, 0.0, _desc((2, 3)), Y), BAD, "xDesc: has 2 dims")
    _check(af, (h, INC, NOPROP, 1.0, x, X, 0.0, _desc((2, 3, 3, 5), F16), Y), BAD, "yDesc: data type")
    _check(ab, (h, MAX, NOPROP, 1.0, y, Y, y, DY, x, X, 0.0, x, DX), NOINIT, "")
    _check(ab, (h, MAX, NOPROP, 1.0, y, Y, _desc((2, 3, 3, 4)), DY, x, X, 0.0, x, DX), BAD, "dyDesc: dims")
    _check(ab, (h, MAX, NOPROP, 1.0, y, Y, y, DY, x, X, 0.0, _desc((2, 3, 7, 7)), DX), BAD, "dxDesc: dims")
    g = _desc((2, 3, 1, 1))
    _check(gf, (h, 1.0, x, X, 0.0, g, Y), NOINIT, "")
    _check(gf, (h, 1.0, x, X, 0.0, y, Y), BAD, "yDesc: dims (2, 3, 3, 5): global pooling gives spatial dims of 1")
    _check(gb, (h, 1.0, g, DY, 0.0, x, DX), NOINIT, "")
    _check(gb, (h, 1.0, y, DY, 0.0, x, DX), BAD, "dyDesc: dims (2, 3, 3, 5): global pooling")
    _check(gb, (h, 1.0, g, DY, 0.0, _desc((2, 3, 7, 8), F16), DX), BAD, "dxDesc: data type")
    _check(gb, (h, 1.0, g, 0, 0.0, x, DX), NULL, "dy: NULL")


# ----------------------------------------------------------------------------- reference

def _naive_forward(mode, nan, x, win, pad, stride):
    """Element-by-element loops, 2-d, straight from the definitions."""
    n, c, H, W = x.shape
    oh, ow = ref.pooled_size(H, win[0], pad[0], stride[0]), ref.pooled_size(W, win[1], pad[1], stride[1])
    y = np.zeros((n, c, oh, ow))
    for i, j, a, b in itertools.product(range(n), range(c), range(oh), range(ow)):
        vals = [x[i, j, r, s] for r in range(a * stride[0] - pad[0], a * stride[0] - pad[0] + win[0])
                for s in range(b * stride[1] - pad[1], b * stride[1] - pad[1] + win[1]) if 0 <= r < H and 0 <= s < W]
        if mode in (MAX, MAXD):
            real = [v for v in vals if not np.isnan(v)]
            if nan == PROP and len(real) < len(vals) or not real:
                y[i, j, a, b] = np.nan
            else:
                y[i, j, a, b] = max(real)
        else:
            y[i, j, a, b] = sum(vals) / (win[0] * win[1] if mode == INC else len(vals))
    return y


@pytest.mark.parametrize("mode", [MAX, INC, EXC])
def test_reference_matches_naive_loops(mode, rng):
    for win, pad, stride, shape in (((3, 3), (1, 1), (2, 2), (2, 3, 7, 8)), ((2, 4), (0, 3), (3, 1), (1, 2, 5, 6)),
                                     ((1, 1), (0, 0), (2, 3), (1, 1, 4, 7))):
        x = rng.uniform(-3, 3, shape)
        x[0, 0, 1, 1] = np.nan
        for nan in (NOPROP, PROP):
            got = ref.forward(mode, nan, 1.0, x, 0.0, None, ("pool", win, pad, stride))
            want = _naive_forward(mode, nan, x, win, pad, stride)
            np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-14, equal_nan=True)


def test_reference_tie_and_nan_rules():
    geo = ("pool", (3,), (0,), (3,))
    x = np.array([[[2.0, 5.0, 5.0, np.nan, 1.0, np.nan, np.nan, np.nan, np.nan]]])
    dy = np.array([[[10.0, 20.0, 30.0]]])
    for nan, want_y, want_dx in (
            (NOPROP, [5, 1, np.nan], [0, 10, 0, 0, 20, 0, 30, 0, 0]),   # first of the tied 5s; NaN skipped; all-NaN -> first
            (PROP, [5, np.nan, np.nan], [0, 10, 0, 20, 0, 0, 30, 0, 0])):  # first NaN wins
        np.testing.assert_array_equal(ref.forward(MAX, nan, 1.0, x, 0.0, None, geo)[0, 0], want_y)
        np.testing.assert_array_equal(ref.backward(MAXD, nan, 1.0, dy, x, 0.0, None, geo)[0, 0], want_dx)
    # -inf only: the first element
    x = np.array([[[-np.inf, -np.inf, 3.0]]])
    np.testing.assert_array_equal(ref.backward(MAX, NOPROP, 1.0, np.array([[[1.0]]]), x[..., :2], 0.0, None,
                                               ("pool", (2,), (0,), (1,)))[0, 0], [1, 0])


def test_adaptive_windows_match_torch_definition():
    for n, out in ((7, 3), (10, 4), (5, 5), (3, 7), (1, 1), (112, 7)):
        w = ref.adaptive_windows(n, out)
        for o, (lo, hi) in enumerate(w):
            assert lo == int(np.floor(o * n / out)) and hi == int(np.ceil((o + 1) * n / out))
        covered = set(i for lo, hi in w for i in range(lo, hi))
        assert covered == set(range(n))


@pytest.mark.parametrize("mode", [MAX, INC, EXC])
def test_reference_backward_is_the_vjp(mode, rng):
    """<dy, J dx> == <J^T dy, dx> for a random direction (averages are linear; max is locally linear)."""
    for geo, shape in ((("pool", (3, 2), (1, 0), (2, 1)), (2, 2, 6, 5)), (("adaptive",), (1, 3, 7, 5)),
                       (("pool", (2, 2, 3), (1, 0, 1), (1, 2, 2)), (1, 2, 4, 5, 6))):
        x = rng.standard_normal(shape)
        ysp = (3, 2) if geo[0] == "adaptive" else None
        y = ref.forward(mode, NOPROP, 1.0, x, 0.0, None, geo, ysp)
        dy = rng.standard_normal(y.shape)
        v = rng.standard_normal(shape) * 1e-7
        jv = ref.forward(mode, NOPROP, 1.0, x + v, 0.0, None, geo, ysp) - y
        dx = ref.backward(mode, NOPROP, 1.0, dy, x, 0.0, None, geo)
        assert abs((dy * jv).sum() - (dx * v).sum()) < 1e-12


# ----------------------------------------------------------------------------- kernels compile

def test_kernel_units_compile_without_spills():
    """Every unit compiles for sm_90 with NVRTC, and no kernel of the float32 / bfloat16 units spills (a
    spill costs much bandwidth; the half backward of max spills ~20 bytes at its 128-register cap)."""
    from pydnn._build import cache
    from pydnn._build.manifest import COMMON_OPTIONS
    from pydnn._cuda import nvrtc

    for unit in P.kernel_units():
        text, _ = cache.unit_inputs(unit)
        _, lowered, log = nvrtc.compile_cubin(text, unit.source, unit.exprs, "sm_90",
                                              COMMON_OPTIONS + ("--ptxas-options=-v",), [str(cache.ptx_dir())])
        names = {v: k for k, v in lowered.items()}
        spills, current = {}, None
        for line in log.splitlines():
            m = re.search(r"Function properties for (\S+)", line)
            if m:
                current = names.get(m.group(1))
            m = re.search(r"(\d+) bytes spill stores", line)
            if m and current:
                spills[current] = int(m.group(1))
        assert set(spills) == set(unit.exprs), (unit.name, sorted(spills))
        if unit.name in ("pooling.f32", "pooling.bf16"):
            assert all(v == 0 for v in spills.values()), spills


def test_win2_kernels_compile_for_sm80_and_sm90():
    """win2_fwd / win2_bwd of every dtype compile with NVRTC for sm_80 and sm_90 without spills."""
    from pydnn._build import cache
    from pydnn._build.manifest import COMMON_OPTIONS
    from pydnn._cuda import nvrtc

    for unit in P.kernel_units():
        exprs = tuple(e for e in unit.exprs if "::win2_" in e)
        assert len(exprs) == 4, unit.name
        text, _ = cache.unit_inputs(unit)
        for arch in ("sm_80", "sm_90"):
            _, lowered, log = nvrtc.compile_cubin(text, unit.source, exprs, arch,
                                                  COMMON_OPTIONS + ("--ptxas-options=-v",), [str(cache.ptx_dir())])
            assert set(lowered) == set(exprs)
            spills = [int(v) for v in re.findall(r"(\d+) bytes spill stores", log)]
            assert len(spills) == 4 and not any(spills), (unit.name, arch, log)


# ----------------------------------------------------------------------------- kernel emulation

def _window(p, k, o):
    if p.flags & P.FLAG_ADAPTIVE:
        n, out = p.in_dim[k], p.out_dim[k]
        return o * n // out, ((o + 1) * n + out - 1) // out
    s = o * p.stride[k] - p.pad[k]
    return max(s, 0), min(s + p.win[k], p.in_dim[k])


def _covering(p, k, e):
    out = p.out_dim[k]
    if p.flags & P.FLAG_ADAPTIVE:
        n = p.in_dim[k]
        lo, hi = e * out // n, ((e + 1) * out + n - 1) // n - 1
    else:
        a = e + p.pad[k]
        lo = 0 if a - p.win[k] < 0 else (a - p.win[k]) // p.stride[k] + 1
        hi = a // p.stride[k]
    return lo, min(hi, out - 1)


def _scan(mem, first, xs, lo, hi, count, vec, itemsize):
    """(j, values of VEC channels) for the first `count` window elements, walked as the kernel does (a
    running pointer wrapping rows and planes), checking each vector access's alignment."""
    nw, nh = hi[2] - lo[2], hi[1] - lo[1]
    step_h, step_d = xs[3] - nw * xs[4], xs[2] - nh * xs[3]
    q, iw, ih = first, 0, 0
    for j in range(count):
        assert q % vec == 0
        yield j, mem[q:q + vec]
        q += xs[4]
        iw += 1
        if iw == nw:
            iw, q, ih = 0, q + step_h, ih + 1
            if ih == nh:
                ih, q = 0, q + step_d


def _match(a, m):
    return (a == m) | (np.isnan(a) & np.isnan(m))


def _reduce(p, vals, is_max, count):
    if is_max:  # the packed max: NaN if any (propagate) / only if all (fmax)
        r = vals[0].copy()
        for v in vals[1:]:
            r = np.maximum(r, v) if p.flags & 2 else np.fmax(r, v)
        return r
    return sum(vals) / (p.win[0] * p.win[1] * p.win[2] if p.mode == 1 else count)


def _emulate_rows(lc, mem, itemsize):
    """fwd_rows: every (block, thread) of the launch shape, each thread up to ROW_OUT outputs along w, with the
    kernel's coordinate and 32-bit offset arithmetic."""
    p, vec, is_max = lc.params, lc.vec, lc.expr.endswith("true>")
    out, written = mem["out"], np.zeros(len(mem["out"]), int)
    (gx, gy, gz), (bx, by, _) = lc.grid, lc.block
    for bz, byi, bxi, tx, ty in itertools.product(range(gz), range(gy), range(gx), range(bx), range(by)):
        cg, ow0 = bz * bx + tx, (byi * by + ty) * P.ROW_OUT
        if cg >= p.size[1] or ow0 >= p.size[4]:
            continue
        n, oh = divmod(bxi, p.size[3])
        hlo, hhi = _window(p, 1, oh)
        xrow = n * p.xs[0] + cg * vec * p.xs[1] + hlo * p.xs[3]
        yrow = n * p.os[0] + cg * vec * p.os[1] + oh * p.os[3]
        for ow in range(ow0, min(ow0 + P.ROW_OUT, p.size[4])):
            wlo, whi = _window(p, 2, ow)
            lo, hi = (0, hlo, wlo), (1, hhi, whi)
            count = (hhi - hlo) * (whi - wlo)
            vals = [v for _, v in _scan(mem["x"], xrow + wlo * p.xs[4], p.xs, lo, hi, count, vec, itemsize)]
            r = _reduce(p, vals, is_max, count)
            a = yrow + ow * p.os[4]
            assert a % vec == 0 and a + vec <= 2**31
            old = out[a:a + vec]
            out[a:a + vec] = p.alpha * r + (p.beta * old if p.flags & 1 else 0)
            written[a:a + vec] += 1
    return written


def _emulate_win2(lc, mem, backward):
    """win2_fwd / win2_bwd: every item (n, c, oh, w group) with the kernel's address arithmetic, x / dx rows of
    kIn = lc.vec elements and y / dy rows of kOut = kIn / 2, each access checked for its vector alignment."""
    p, kin = lc.params, lc.vec
    kout, kh = kin // 2, p.win[1]
    is_max = lc.expr.endswith(", true>")
    prop = bool(p.flags & 2)
    out, written = mem["out"], np.zeros(len(mem["out"]), int)
    for item in range(p.total):
        c = [(item // p.div[k]) % p.size[k] for k in range(5)]
        xo = c[0] * p.xs[0] + c[1] * p.xs[1] + c[3] * kh * p.xs[3] + c[4] * kin
        assert xo % kin == 0
        rows = [mem["x"][xo + i * p.xs[3]:xo + i * p.xs[3] + kin] for i in range(kh)]
        if not backward:
            r = np.empty(kout)
            for j in range(kout):
                vals = [rows[i][2 * j + s] for i in range(kh) for s in range(2)]  # window order
                if is_max:
                    m = vals[0]
                    for v in vals[1:]:
                        m = np.maximum(m, v) if prop else np.fmax(m, v)
                    r[j] = m
                else:
                    r[j] = sum(vals) / (kh * 2)
            a = c[0] * p.os[0] + c[1] * p.os[1] + c[3] * p.os[3] + c[4] * kout
            assert a % kout == 0
            old = out[a:a + kout]
            out[a:a + kout] = p.alpha * r + (p.beta * old if p.flags & 1 else 0)
            written[a:a + kout] += 1
            continue
        ga = c[0] * p.ps[0] + c[1] * p.ps[1] + c[3] * p.ps[3] + c[4] * kout
        assert ga % kout == 0
        g = mem["dy"][ga:ga + kout]
        if is_max:
            ya = c[0] * p.ys[0] + c[1] * p.ys[1] + c[3] * p.ys[3] + c[4] * kout
            assert ya % kout == 0
            m = mem["y"][ya:ya + kout]
        found = np.zeros(kout, bool)
        oo = c[0] * p.os[0] + c[1] * p.os[1] + c[3] * kh * p.os[3] + c[4] * kin
        assert oo % kin == 0
        for i in range(kh):
            r = np.zeros(kin)
            for j in range(kout):
                for s in range(2):
                    if is_max:
                        mine = not found[j] and bool(_match(rows[i][2 * j + s], m[j]))
                        found[j] |= mine
                        r[2 * j + s] = g[j] if mine else 0.0
                    else:
                        r[2 * j + s] = g[j] * (1.0 / (kh * 2))
            a = oo + i * p.os[3]
            old = out[a:a + kin]
            out[a:a + kin] = p.alpha * r + (p.beta * old if p.flags & 1 else 0)
            written[a:a + kin] += 1
    return written


def _emulate(lc, mem, itemsize, backward):
    """Run one launch over flat float64 buffers mem = {'out', 'x', 'dy', 'y'} (addresses in elements)."""
    p, vec = lc.params, lc.vec
    if "::win2_" in lc.expr:
        return _emulate_win2(lc, mem, backward)
    if "::p2_" in lc.expr:  # the scalar launches of 2-d pools (test_pooling_p2_cpu.py)
        from test_pooling_p2_cpu import _emulate_p2
        return _emulate_p2(lc, mem, backward)
    prop = bool(p.flags & 2)
    is_max = lc.expr.endswith(", true>") or lc.expr.endswith(", true, true>")
    assert is_max == (p.mode == 0)
    if "fwd_rows" in lc.expr:
        assert not backward and vec > 1
        return _emulate_rows(lc, mem, itemsize)
    written = np.zeros(len(mem["out"]), int)
    out = mem["out"]
    for item in range(p.total):
        c = [(item // p.div[k]) % p.size[k] for k in range(5)]
        c[1] *= vec
        xnc = c[0] * p.xs[0] + c[1] * p.xs[1]
        if not backward:
            lo, hi = zip(*[_window(p, k, c[2 + k]) for k in range(3)])
            first = xnc + sum(lo[k] * p.xs[2 + k] for k in range(3))
            count = int(np.prod([b - a for a, b in zip(lo, hi)]))
            vals = [v for _, v in _scan(mem["x"], first, p.xs, lo, hi, count, vec, itemsize)]
            if is_max:  # the packed max: NaN if any (propagate) / only if all (fmax)
                r = vals[0].copy()
                for v in vals[1:]:
                    r = np.maximum(r, v) if prop else np.fmax(r, v)
            else:
                r = sum(vals) / (p.win[0] * p.win[1] * p.win[2] if p.mode == 1 else count)
        else:
            r = np.zeros(vec)
            gb = c[0] * p.ps[0] + c[1] * p.ps[1]
            yb = c[0] * p.ys[0] + c[1] * p.ys[1]
            if is_max:
                xa = xnc + sum(c[2 + k] * p.xs[2 + k] for k in range(3))
                assert xa % vec == 0
                xe = mem["x"][xa:xa + vec]
            cov = [_covering(p, k, c[2 + k]) for k in range(3)]
            for o in itertools.product(*[range(a, b + 1) for a, b in cov]):
                po = sum(o[k] * p.ps[2 + k] for k in range(3))
                lo, hi = zip(*[_window(p, k, o[k]) for k in range(3)])
                if is_max:
                    ya = yb + sum(o[k] * p.ys[2 + k] for k in range(3))
                    assert ya % vec == 0
                    m = mem["y"][ya:ya + vec]
                    mine = _match(xe, m)
                    if not mine.any():
                        continue
                    self_j = ((c[2] - lo[0]) * (hi[1] - lo[1]) + (c[3] - lo[1])) * (hi[2] - lo[2]) + (c[4] - lo[2])
                    first = xnc + sum(lo[k] * p.xs[2 + k] for k in range(3))
                    if lc.expr.endswith(", true, true>"):  # one packed max of the earlier elements
                        vals = [v for _, v in _scan(mem["x"], first, p.xs, lo, hi, self_j, vec, itemsize)]
                        if vals:
                            me = _reduce(p, vals, True, 0)
                            mine = mine & np.where(np.isnan(m), prop & ~np.isnan(me), me != m)
                    else:
                        for _, v in _scan(mem["x"], first, p.xs, lo, hi, self_j, vec, itemsize):
                            mine = mine & ~_match(v, m)
                            if not mine.any():
                                break
                    if mine.any():
                        assert (gb + po) % vec == 0
                        r = r + np.where(mine, mem["dy"][gb + po:gb + po + vec], 0)
                else:
                    cnt = p.win[0] * p.win[1] * p.win[2] if p.mode == 1 else np.prod([b - a for a, b in zip(lo, hi)])
                    r = r + mem["dy"][gb + po:gb + po + vec] * (1.0 / cnt)
        a = sum(c[k] * p.os[k] for k in range(5))
        assert a % vec == 0
        old = out[a:a + vec]
        out[a:a + vec] = p.alpha * r + (p.beta * old if p.flags & 1 else 0)
        written[a:a + vec] += 1
    return written


def _strided(flat, dims, strides):
    return np.lib.stride_tricks.as_strided(flat, dims, [s * flat.itemsize for s in strides])


def _layout(dims, layout):
    if layout == "nchw":
        return packed_strides(dims, pydnn.PYDNN_TENSOR_NCHW)
    if layout == "nhwc":
        return packed_strides(dims, pydnn.PYDNN_TENSOR_NHWC)
    if layout == "gapsw":  # NCHW with gaps: rows padded by 8 elements, planes by 16, samples by 32
        st, inner = [1], 1
        for k, gap in zip(range(len(dims) - 1, 0, -1), (8, 16, 32)):
            inner = inner * dims[k] + gap
            st.append(inner)
        return tuple(st[::-1])
    # gaps: NHWC with the channel dim padded by 3 (gaps16: by 16, vectors still fit) and the rows by one pixel
    cpad = 16 if layout == "gaps16" else 3
    st = list(packed_strides(tuple(d + (cpad if i == 1 else 1 if i >= 2 else 0) for i, d in enumerate(dims)),
                             pydnn.PYDNN_TENSOR_NHWC))
    return tuple(st)


def _run_emulated(kind, mode, nan, dt, xdims, ydims, layout, geo, rng, alpha=1.0, beta=0.0, misalign=False):
    """Plan a call as the API does, emulate its launch (the vector one unless misaligned) and compare with
    the reference. Returns the launch's vec."""
    h = cpu_handle()
    xd, yd = _desc(xdims, dt, _layout(xdims, layout)), _desc(ydims, dt, _layout(ydims, layout))
    itemsize = xd.itemsize
    results = {}
    for backward in (False, True):
        if kind == "pool":
            pd = _poolnd(mode, nan, *geo[1:])
            geometry = P._validate_bwd(kind, pd, yd, yd, xd, xd) if backward else P._validate_fwd(kind, pd, xd, yd)
        else:
            geometry = P._validate_bwd(kind, None, yd, yd, xd, xd) if backward else P._validate_fwd(kind, None, xd, yd)
        kmode = P.KMODE[mode] if kind == "pool" else (0 if P.KMODE[mode] == 0 else 2)
        flags = P._nan_flag(mode, nan) | (P.FLAG_ADAPTIVE if kind != "pool" else 0) | (1 if beta else 0)
        if not backward:
            pl = P._plan(h, kmode, flags, yd, xd, None, geometry)
        elif kmode == 0:  # as pooling_backward plans: max reads x and y
            pl = P._plan(h, kmode, flags, xd, xd, yd, geometry, yd)
        else:  # averages read dy only
            pl = P._plan(h, kmode, flags, xd, yd, yd, geometry, yd)
        lc = pl.launches[-1] if misalign else pl.launches[0]
        lc.params.alpha, lc.params.beta = alpha, beta
        xspan, yspan = xd.span_bytes() // itemsize, yd.span_bytes() // itemsize
        xflat = np.full(xspan, np.nan)
        xv = rng.integers(-4, 5, xdims).astype(np.float64)  # small integers: many ties
        xv.flat[rng.integers(0, xv.size, 3)] = np.nan
        _strided(xflat, xdims, xd.strides)[...] = xv
        oflat = np.full((xspan if backward else yspan), np.nan)
        o_dims, o_strides = (xdims, xd.strides) if backward else (ydims, yd.strides)
        o0 = rng.uniform(-1, 1, o_dims)
        if beta:
            _strided(oflat, o_dims, o_strides)[...] = o0
        mem = {"out": oflat, "x": xflat}
        if backward:
            dyflat, yflat = np.full(yspan, np.nan), np.full(yspan, np.nan)
            dyv = rng.uniform(-2, 2, ydims)
            _strided(dyflat, ydims, yd.strides)[...] = dyv
            geo_ref = geo if kind == "pool" else ("adaptive",)
            _strided(yflat, ydims, yd.strides)[...] = ref.forward(mode, nan, 1.0, xv, 0.0, None, geo_ref, ydims[2:])
            mem["dy"], mem["y"] = dyflat, yflat
        written = _emulate(lc, mem, itemsize, backward)
        got = _strided(oflat, o_dims, o_strides).copy()
        wmask = np.zeros(len(oflat), bool)
        _strided(wmask, o_dims, o_strides)[...] = True
        assert (written[wmask] == 1).all() and (written[~wmask] == 0).all(), "each element written exactly once"
        geo_ref = geo if kind == "pool" else ("adaptive",)
        if backward:
            want = ref.backward(mode, nan, alpha, dyv, xv, beta, o0, geo_ref)
        else:
            want = ref.forward(mode, nan, alpha, xv, beta, o0, geo_ref, ydims[2:])
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, equal_nan=True)
        results[backward] = lc.vec
    return results


def _ydims(xdims, geo):
    return tuple(xdims[:2]) + tuple(ref.pooled_size(n, w, p, s) for n, w, p, s in zip(xdims[2:], *geo[1:]))


POOL_CASES = [  # xdims, (window, padding, stride)
    ((2, 16, 7, 8), ((3, 3), (1, 1), (2, 2))),
    ((1, 8, 5, 6), ((2, 3), (0, 2), (3, 1))),       # stride > window along h: uncovered rows
    ((1, 8, 4, 5, 6), ((2, 3, 2), (1, 0, 1), (1, 2, 3))),
    ((2, 3, 9), ((4,), (2,), (2,))),                 # 1-d, 3 channels (no vectors)
]


@pytest.mark.parametrize("layout", ["nchw", "nhwc", "gaps"])
@pytest.mark.parametrize("mode,nan,packed", [(MAX, NOPROP, True), (MAXD, PROP, True), (MAX, NOPROP, False),
                                             (MAX, PROP, False), (INC, NOPROP, True), (EXC, NOPROP, True)])
def test_emulated_pooling(mode, nan, packed, layout, rng, monkeypatch):
    monkeypatch.setattr(tuning.pooling, "BWD_PACKED_TIES", packed)  # max backward: both tie checks
    for xdims, g in POOL_CASES:
        geo = ("pool",) + g
        for dt in (F32, BF16):
            vec = _run_emulated("pool", mode, nan, dt, xdims, _ydims(xdims, geo), layout, geo, rng)
            want_vec = 16 // pydnn.tensor.DTYPES[dt][0] if layout == "nhwc" and xdims[1] % (16 // pydnn.tensor.DTYPES[dt][0]) == 0 else 1
            assert vec == {False: want_vec, True: want_vec}, (xdims, layout, dt, vec)


@pytest.mark.parametrize("mode", [MAX, EXC])
def test_emulated_adaptive_and_blend(mode, rng):
    for xdims, ydims in (((1, 8, 7, 5), (1, 8, 3, 2)), ((2, 4, 3, 4), (2, 4, 5, 7)), ((1, 8, 5, 6, 4), (1, 8, 2, 3, 3))):
        for layout in ("nchw", "nhwc"):
            _run_emulated("adaptive", mode, PROP, F32, xdims, ydims, layout, None, rng)
    _run_emulated("adaptive", mode, NOPROP, F16, (1, 8, 7, 5), (1, 8, 1, 1), "nhwc", None, rng, alpha=0.5, beta=-1.5)
    _run_emulated("pool", mode, NOPROP, F32, (1, 8, 7, 5), (1, 8, 3, 3), "nhwc", ("pool", (3, 3), (0, 1), (2, 2)),
                  rng, alpha=-2.0, beta=0.25, misalign=True)


ROWS_CASES = [  # xdims, dtype, (window, padding, stride): partial strips, several blocks along y and z
    ((1, 16, 6, 9), BF16, ((3, 3), (1, 1), (2, 2))),
    ((1, 128, 3, 66), F32, ((3, 3), (1, 1), (2, 2))),   # 32 x 8 threads, 2 blocks along w
    ((1, 264, 2, 10), F32, ((2, 3), (1, 0), (1, 2))),   # 66 channel groups: 3 blocks along c
    ((2, 16, 9), BF16, ((4,), (2,), (3,))),             # 1-d
]


@pytest.mark.parametrize("layout", ["nhwc", "gaps16"])
@pytest.mark.parametrize("mode,nan", [(MAX, NOPROP), (MAXD, PROP), (INC, NOPROP), (EXC, NOPROP)])
def test_emulated_rows_forward(mode, nan, layout, rng, monkeypatch):
    """fwd_rows (forced for small blocks too) against the reference; backward keeps its kernel."""
    monkeypatch.setattr(tuning.pooling, "ROWS_MIN_BLOCK", 1)
    for xdims, dt, g in ROWS_CASES + [(POOL_CASES[0][0], BF16, POOL_CASES[0][1])]:
        geo = ("pool",) + g
        h = cpu_handle()
        xd = _desc(xdims, dt, _layout(xdims, layout))
        yd = _desc(_ydims(xdims, geo), dt, _layout(_ydims(xdims, geo), layout))
        rows = P.plan_summary(h, yd, xd, geometry=P._validate_fwd("pool", _poolnd(mode, nan, *g), xd, yd))
        assert rows[0][0].startswith("pydnn::pooling::fwd_rows<")
        assert rows[-1][0].startswith(("pydnn::pooling::fwd<", "pydnn::pooling::p2_fwd<"))  # the unaligned launch
        _run_emulated("pool", mode, nan, dt, xdims, _ydims(xdims, geo), layout, geo, rng)
    xdims, g = (1, 8, 7, 5), ((3, 3), (0, 1), (2, 2))
    _run_emulated("pool", mode, nan, F32, xdims, _ydims(xdims, ("pool",) + g), "nhwc", ("pool",) + g, rng,
                  alpha=-2.0, beta=0.25)


def test_rows_forward_limits():
    """fwd_rows only where it applies: 3-d, adaptive, scalar launches and small blocks keep fwd."""
    h = cpu_handle()
    for xdims, g, want in (((8, 64, 112, 112), ((3, 3), (1, 1), (2, 2)), True),
                           ((1, 8, 4, 5, 6), ((2, 3, 2), (1, 0, 1), (1, 2, 3)), False),
                           ((2, 16, 7, 8), ((3, 3), (1, 1), (2, 2)), False)):   # 2 x 1 threads per block
        geo = ("pool",) + g
        xd, yd = _desc(xdims, BF16, _layout(xdims, "nhwc")), _desc(_ydims(xdims, geo), BF16, _layout(_ydims(xdims, geo), "nhwc"))
        rows = P.plan_summary(h, yd, xd, geometry=P._validate_fwd("pool", _poolnd(MAX, NOPROP, *g), xd, yd))
        assert [r[0].startswith("pydnn::pooling::fwd_rows") for r in rows] == [want, False], (xdims, rows)
    xd = _desc((2, 64, 9, 9), BF16, _layout((2, 64, 9, 9), "nhwc"))
    yd = _desc((2, 64, 3, 3), BF16, _layout((2, 64, 3, 3), "nhwc"))
    rows = P.plan_summary(h, yd, xd, flags=P.FLAG_ADAPTIVE)
    assert not any("fwd_rows" in r[0] for r in rows)


WIN2_CASES = [  # xdims, (window, padding, stride), dtype: kh x 2 windows with stride kh x 2 tiling x
    ((2, 3, 4, 16), ((2, 2), (0, 0), (2, 2)), BF16),     # 3 channels, two w groups of 4 outputs
    ((1, 5, 6, 8), ((3, 2), (0, 0), (3, 2)), F32),       # kh 3, odd channel count
    ((2, 2, 2, 4), ((2, 2), (0, 0), (2, 2)), F64),       # one output per thread
    ((1, 4, 3, 16), ((1, 2), (0, 0), (1, 2)), F16),      # kh 1
    ((3, 2, 16), ((2,), (0,), (2,)), BF16),              # 1-d
]


@pytest.mark.parametrize("layout", ["nchw", "gapsw"])
@pytest.mark.parametrize("mode,nan", [(MAX, NOPROP), (MAXD, PROP), (INC, NOPROP), (EXC, NOPROP)])
def test_emulated_win2(mode, nan, layout, rng):
    """win2_fwd / win2_bwd (NCHW, non-overlapping kh x 2 windows) take both directions and match the
    reference with each element written once; blended (alpha, beta) too."""
    for xdims, g, dt in WIN2_CASES:
        geo = ("pool",) + g
        if layout == "gapsw" and len(xdims) == 3:
            continue
        vec = _run_emulated("pool", mode, nan, dt, xdims, _ydims(xdims, geo), layout, geo, rng)
        kin = 16 // pydnn.tensor.DTYPES[dt][0]
        assert vec == {False: kin, True: kin}, (xdims, dt, vec)
    xdims, g, dt = WIN2_CASES[0]
    _run_emulated("pool", mode, nan, dt, xdims, _ydims(xdims, ("pool",) + g), "nchw", ("pool",) + g, rng,
                  alpha=-2.0, beta=0.25)
    # misaligned pointers: the scalar launch
    assert _run_emulated("pool", mode, nan, dt, xdims, _ydims(xdims, ("pool",) + g), "nchw", ("pool",) + g, rng,
                         misalign=True) == {False: 1, True: 1}


def test_win2_limits(monkeypatch):
    """win2 only where it applies: overlapping, padded, non-tiling, 3-x-wide windows, w groups that do not
    divide the output row, channels-last layouts and the switch off keep the other kernels."""
    h = cpu_handle()
    monkeypatch.setattr(tuning.pooling, "P2", False)  # the scalar fwd / bwd where win2 does not apply (P2: test_pooling_p2_cpu.py)

    def first(xdims, g, layout="nchw", dt=BF16, kmode=MAX):
        geo = ("pool",) + g
        yd_ = _ydims(xdims, geo)
        xd, yd = _desc(xdims, dt, _layout(xdims, layout)), _desc(yd_, dt, _layout(yd_, layout))
        pd = _poolnd(kmode, NOPROP, *g)
        fwd = P.plan_summary(h, yd, xd, geometry=P._validate_fwd("pool", pd, xd, yd))[0][0]
        bwd = P.plan_summary(h, xd, xd, yd, kmode=P.KMODE[kmode],
                             geometry=P._validate_bwd("pool", pd, yd, yd, xd, xd))[0][0]
        return fwd.split("<")[0].split("::")[-1], bwd.split("<")[0].split("::")[-1]

    assert first((256, 64, 32, 32), ((2, 2), (0, 0), (2, 2))) == ("win2_fwd", "win2_bwd")
    assert first((256, 128, 16, 16), ((2, 2), (0, 0), (2, 2))) == ("win2_fwd", "win2_bwd")
    assert first((256, 128, 16, 16), ((2, 2), (0, 0), (2, 2)), kmode=INC) == ("win2_fwd", "win2_bwd")
    assert first((2, 8, 16, 16), ((3, 3), (1, 1), (2, 2))) == ("fwd", "bwd")      # overlapping, padded
    assert first((2, 8, 16, 16), ((2, 2), (1, 1), (2, 2))) == ("fwd", "bwd")      # padded
    assert first((2, 8, 17, 16), ((2, 2), (0, 0), (2, 2))) == ("fwd", "bwd")      # H not tiled
    assert first((2, 8, 16, 18), ((2, 2), (0, 0), (2, 2))) == ("fwd", "bwd")      # OW 9: not whole w groups
    assert first((2, 8, 16, 12), ((2, 2), (0, 0), (2, 2)), dt=F32) == ("win2_fwd", "win2_bwd")  # OW 6, kOut 2
    assert first((2, 8, 16, 12), ((2, 2), (0, 0), (2, 2))) == ("fwd", "bwd")      # OW 6, kOut 4
    assert first((2, 8, 16, 16), ((2, 2), (0, 0), (2, 2)), layout="nhwc")[0] != "win2_fwd"
    assert first((2, 8, 18, 18), ((3, 3), (0, 0), (3, 3))) == ("fwd", "bwd")      # 3 wide
    assert first((2, 8, 4, 16, 16), ((1, 2, 2), (0, 0, 0), (1, 2, 2))) == ("fwd", "bwd")  # 3-d
    monkeypatch.setattr(tuning.pooling, "WIN2", False)
    assert first((256, 64, 32, 32), ((2, 2), (0, 0), (2, 2))) == ("fwd", "bwd")


def test_thread_order_follows_the_written_tensor():
    h = cpu_handle()
    for layout, inner in (("nchw", 4), ("nhwc", 1)):
        x, y = _desc((2, 16, 8, 8), BF16, _layout((2, 16, 8, 8), layout)), _desc((2, 16, 4, 4), BF16, _layout((2, 16, 4, 4), layout))
        rows = P.plan_summary(h, y, x)
        assert rows[0][5][inner] == 1
        assert [r[1] for r in rows] == ([8, 1] if layout == "nhwc" else [1])


# ----------------------------------------------------------------------------- C

def test_c_program_on_cpu(tmp_path):
    from cprog import build_and_run

    r = build_and_run("pooling_cpu", tmp_path)
    print(r.stdout, r.stderr)
    lines = r.stdout.splitlines()
    assert not [x for x in lines if x.startswith("FAIL")], r.stdout + r.stderr
    assert sum(x.startswith("ok ") for x in lines) >= 15, r.stdout + r.stderr
    assert r.returncode == 0, r.stdout + r.stderr
