"""Layer / group / instance / RMS normalization on the CPU: the descriptor, every validation error (status
+ the argument it names), the float64 reference against direct formulas and finite differences, the
kernel choice for the layouts that matter, and an emulation of the kernels' index arithmetic over the
host's real parameter structs: every element of every set is read and written exactly once, at the
right address, with the right scale index, and the backward partial-sum modes (PREG ownership, PLANE
lane sharing) hold for the launches the planner makes."""
import ctypes

import numpy as np
import pytest

import pydnn
from pydnn import tuning
from pydnn.ops import normalization as N
from pydnn.reference import normalization as ref
from pydnn.tensor import packed_strides
from test_fuzz_cpu import _call, _desc, cpu_handle


@pytest.fixture(autouse=True)
def _no_rows_fit(monkeypatch):
    """These tests state the 4-item plans (tuning.norm.ROWS_FIT's 5-item ones: test_normalization_fit_*.py)."""
    monkeypatch.setattr(tuning.norm, "ROWS_FIT", False)


F32, F64, F16, BF16 = (pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DATA_DOUBLE, pydnn.PYDNN_DATA_HALF,
                       pydnn.PYDNN_DATA_BFLOAT16)
LAYER, GROUP, INSTANCE, RMS = (pydnn.PYDNN_NORM_KIND_LAYER, pydnn.PYDNN_NORM_KIND_GROUP,
                               pydnn.PYDNN_NORM_KIND_INSTANCE, pydnn.PYDNN_NORM_KIND_RMS)
BAD, NS = pydnn.PYDNN_STATUS_BAD_PARAM, pydnn.PYDNN_STATUS_NOT_SUPPORTED
NULL, MIS = pydnn.PYDNN_STATUS_BAD_PARAM_NULL_POINTER, pydnn.PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER
NOINIT = pydnn.PYDNN_STATUS_NOT_INITIALIZED  # everything valid: the CPU-only handle refuses at kernel lookup
X, Y, DY, DX, S, B, M, V, W = (1 << 40, 1 << 41, 1 << 42, 1 << 43, 1 << 44, 1 << 45, 1 << 46, 1 << 47, 1 << 48)
NHWC = pydnn.PYDNN_TENSOR_NHWC


def _check(fn, args, status, needle):
    st = _call(fn, *args)
    msg = pydnn.get_last_error_string()
    assert st == status, (st, msg)
    assert needle in msg, msg


def _nd(kind, groups=1, k=1, eps=1e-5, act=None):
    d = pydnn.create_norm_descriptor()
    pydnn.set_norm_descriptor(d, kind, groups, k, eps, act)
    return d


def _act(mode, coef=0.0):
    a = pydnn.create_activation_descriptor()
    pydnn.set_activation_descriptor(a, mode, pydnn.PYDNN_NOT_PROPAGATE_NAN, coef)
    return a


def _params(x, nd):
    sb, st = pydnn.create_tensor_descriptor(), pydnn.create_tensor_descriptor()
    pydnn.derive_norm_param_descriptors(sb, st, x, nd)
    return sb, st


# ----------------------------------------------------------------------------- descriptor

def test_descriptor_set_get_and_errors():
    d = pydnn.create_norm_descriptor()
    _check(pydnn.get_norm_descriptor, (d,), BAD, "normDesc: descriptor was never set")
    pydnn.set_norm_descriptor(d, GROUP, 32, 1, 1e-6, None)
    assert pydnn.get_norm_descriptor(d) == (GROUP, 32, 1, 1e-6)
    s = pydnn.set_norm_descriptor
    _check(s, (d, 7, 1, 1, 1e-5, None), BAD, "set_norm_descriptor: kind: 7 is not a pydnnNormKind_t")
    _check(s, (d, pydnn.PYDNN_NORM_PER_CHANNEL + 10, 1, 1, 1e-5, None), BAD, "kind:")
    _check(s, (d, GROUP, 0, 1, 1e-5, None), BAD, "groups: 0 must be positive")
    _check(s, (d, GROUP, 2.0, 1, 1e-5, None), BAD, "groups: expected an integer")
    _check(s, (d, LAYER, 1, 0, 1e-5, None), BAD, "normalizedDims: 0 is outside [1, 8]")
    _check(s, (d, RMS, 1, 9, 1e-5, None), BAD, "normalizedDims: 9 is outside")
    _check(s, (d, LAYER, 1, 1, 0.0, None), BAD, "epsilon: 0.0 must be positive")
    _check(s, (d, LAYER, 1, 1, -1e-5, None), BAD, "epsilon:")
    _check(s, (d, LAYER, 1, 1, float("nan"), None), BAD, "epsilon: nan")
    _check(s, (d, LAYER, 1, 1, float("inf"), None), BAD, "epsilon: inf")
    _check(s, (d, LAYER, 1, 1, "1e-5", None), BAD, "epsilon: expected a number")
    _check(s, (d, LAYER, 1, 1, 1e-5, pydnn.create_activation_descriptor()), BAD, "activationDesc: descriptor was never set")
    _check(s, (d, LAYER, 1, 1, 1e-5, "relu"), BAD, "activationDesc:")
    _check(s, ("d", LAYER, 1, 1, 1e-5, None), BAD, "normDesc: not a live norm descriptor")
    assert pydnn.get_norm_descriptor(d) == (GROUP, 32, 1, 1e-6)  # failed sets changed nothing
    pydnn.set_norm_descriptor(d, INSTANCE, 0, 0, 1e-3, _act(pydnn.PYDNN_ACTIVATION_SWISH))  # ignored fields
    assert d.act_id == 6
    pydnn.destroy_norm_descriptor(d)
    pydnn.destroy_norm_descriptor(None)
    _check(pydnn.get_norm_descriptor, (d,), BAD, "normDesc: not a live")


def test_derive_param_descriptors():
    x = _desc((4, 6, 5, 3), BF16)
    sb, st = _params(x, _nd(GROUP, 3))
    assert (sb.dims, sb.dtype, st.dims, st.dtype) == ((1, 6, 1, 1), F32, (4, 3, 1, 1), F32)
    sb, st = _params(x, _nd(INSTANCE))
    assert (sb.dims, st.dims) == ((1, 6, 1, 1), (4, 6, 1, 1))
    sb, st = _params(x, _nd(LAYER, k=2))
    assert (sb.dims, st.dims) == ((1, 1, 5, 3), (4, 6, 1, 1))
    sb, st = _params(x, _nd(RMS, k=4))
    assert (sb.dims, st.dims) == ((4, 6, 5, 3), (1, 1, 1, 1))
    d = pydnn.create_tensor_descriptor()
    _check(pydnn.derive_norm_param_descriptors, (d, d, x, _nd(GROUP, 4)), BAD, "normDesc: groups 4 does not divide xDesc's C = 6")
    _check(pydnn.derive_norm_param_descriptors, (d, d, x, _nd(LAYER, k=5)), BAD, "normalizedDims 5 is more than")
    _check(pydnn.derive_norm_param_descriptors, (None, d, x, _nd(LAYER)), BAD, "scaleBiasDesc: not a live")


# ----------------------------------------------------------------------------- validation of the calls

def _fwd_args(h, nd, x, y=None, sb=None, st=None, ptrs=None):
    y = y or x
    if sb is None or st is None:
        dsb, dst = _params(x, nd)
        sb, st = sb or dsb, st or dst
    p = dict(x=X, y=Y, s=S, b=B, m=M, v=V)
    p.update(ptrs or {})
    return (h, nd, 1.0, 0.0, x, p["x"], y, p["y"], sb, p["s"], p["b"], st, p["m"], p["v"])


def test_forward_training_validation():
    h = cpu_handle()
    f = pydnn.norm_forward_training
    x = _desc((4, 8, 5, 3), BF16)
    g = _nd(GROUP, 4)
    _check(f, _fwd_args(h, g, x), NOINIT, "")
    _check(f, _fwd_args(h, _nd(GROUP, 3), x, sb=_desc((1, 8, 1, 1)), st=_desc((4, 3, 1, 1))), BAD,
           "norm_forward_training: normDesc: groups 3 does not divide xDesc's C = 8")
    _check(f, _fwd_args(h, _nd(LAYER, k=5), x, sb=_desc((1, 8, 1, 1)), st=_desc((4, 3, 1, 1))), BAD,
           "normDesc: normalizedDims 5 is more than xDesc's 4 dims")
    _check(f, _fwd_args(h, g, x, sb=_desc((1, 4, 1, 1))), BAD, "scaleBiasDesc: dims (1, 4, 1, 1) must be (1, 8, 1, 1)")
    _check(f, _fwd_args(h, g, x, sb=_desc((8,))), BAD, "scaleBiasDesc: dims (8,) must be")
    _check(f, _fwd_args(h, g, x, sb=_desc((1, 8, 1, 1), BF16)), BAD, "scaleBiasDesc: data type")
    _check(f, _fwd_args(h, g, x, sb=_desc((1, 8, 1, 1), F32, (16, 2, 1, 1))), BAD, "scaleBiasDesc: strides")
    _check(f, _fwd_args(h, g, x, st=_desc((4, 8, 1, 1))), BAD, "meanInvstdDesc: dims (4, 8, 1, 1) must be (4, 4, 1, 1)")
    _check(f, _fwd_args(h, g, x, st=_desc((4, 4, 1, 1), F16)), BAD, "meanInvstdDesc: data type")
    _check(f, _fwd_args(h, g, x, st=_desc((4, 4, 1, 1), F32, (1, 1, 1, 1))), BAD, "meanInvstdDesc: strides")
    _check(f, _fwd_args(h, g, x, st=_desc((4, 4, 1, 1), F32, (1, 4, 1, 1))), NOINIT, "")  # any strides
    _check(f, _fwd_args(h, _nd(LAYER, k=2), x, sb=_desc((1, 8, 5, 3))), BAD, "scaleBiasDesc: dims (1, 8, 5, 3) must be (1, 1, 5, 3)")
    _check(f, _fwd_args(h, g, x, y=_desc((4, 8, 5, 4), BF16)), BAD, "yDesc: dims (4, 8, 5, 4) differ")
    _check(f, _fwd_args(h, g, x, y=_desc((4, 8, 5, 3), F16)), BAD, "yDesc: data type")
    _check(f, _fwd_args(h, g, x, y=_desc((4, 8, 5, 3), BF16, (1, 1, 1, 1))), BAD, "yDesc: strides")
    d64 = _desc((4, 8, 5, 3), F64)
    _check(f, _fwd_args(h, g, d64, sb=_desc((1, 8, 1, 1)), st=_desc((4, 4, 1, 1))), NS, "xDesc: data type 1 is not supported")
    i8 = _desc((4, 8, 5, 3), pydnn.PYDNN_DATA_INT8)
    _check(f, _fwd_args(h, g, i8, sb=_desc((1, 8, 1, 1)), st=_desc((4, 4, 1, 1))), NS, "xDesc: data type")
    _check(f, _fwd_args(h, g, _desc((8,), BF16), sb=_desc((1, 8, 1, 1)), st=_desc((4, 4, 1, 1))), BAD,
           "xDesc: group / instance norm needs N, C dims")
    _check(f, _fwd_args(h, pydnn.create_norm_descriptor(), x, sb=_desc((1, 8, 1, 1)), st=_desc((4, 4, 1, 1))), BAD,
           "normDesc: descriptor was never set")
    _check(f, _fwd_args(h, g, x, ptrs=dict(x=0)), NULL, "x: NULL")
    _check(f, _fwd_args(h, g, x, ptrs=dict(y=None)), NULL, "y: NULL")
    _check(f, _fwd_args(h, g, x, ptrs=dict(s=0)), NULL, "scale: NULL")
    _check(f, _fwd_args(h, g, x, ptrs=dict(m=0)), NULL, "resultMean: NULL")
    _check(f, _fwd_args(h, g, x, ptrs=dict(v=0)), NULL, "resultInvStd: NULL")
    _check(f, _fwd_args(h, g, x, ptrs=dict(b=0)), NOINIT, "")  # no bias
    _check(f, _fwd_args(h, g, x, ptrs=dict(x=X + 1)), MIS, "x: 0x")
    _check(f, _fwd_args(h, g, x, ptrs=dict(y=Y + 2)), NOINIT, "")  # 2-byte elements: 2-byte aligned is enough
    _check(f, _fwd_args(h, g, x, ptrs=dict(y=X)), NOINIT, "")  # in place: the same address and layout
    _check(f, _fwd_args(h, g, x, ptrs=dict(y=X + 2)), BAD, "y: its memory overlaps x's")
    nhwc = _desc((4, 8, 5, 3), BF16, packed_strides((4, 8, 5, 3), NHWC))
    _check(f, _fwd_args(h, g, x, y=nhwc, ptrs=dict(y=X)), BAD, "y: its memory overlaps x's")  # same address, other layout
    _check(f, _fwd_args(h, g, x, ptrs=dict(s=S + 2)), MIS, "scale: 0x")
    _check(f, _fwd_args(h, g, x, ptrs=dict(b=B + 2)), MIS, "bias: 0x")
    _check(f, _fwd_args(h, g, x, ptrs=dict(v=V + 1)), MIS, "resultInvStd: 0x")
    r = _nd(RMS, k=3)
    _check(f, _fwd_args(h, r, x, ptrs=dict(m=0)), NOINIT, "")  # RMS: no mean
    args = list(_fwd_args(h, g, x))
    args[0] = "h"
    _check(f, args, BAD, "handle:")
    args = list(_fwd_args(h, g, x))
    args[11] = None
    _check(f, args, BAD, "meanInvstdDesc: not a live tensor descriptor")


def test_forward_inference_validation():
    h = cpu_handle()
    f = pydnn.norm_forward_inference
    x = _desc((6, 10), F32)
    nd = _nd(LAYER)
    sb = _desc((1, 10))
    _check(f, (h, nd, 1.0, 0.0, x, X, x, Y, sb, S, 0), NOINIT, "")
    _check(f, (h, nd, 1.0, 0.0, x, X, x, Y, _desc((10,)), S, 0), BAD, "scaleBiasDesc: dims (10,) must be (1, 10)")
    _check(f, (h, nd, 1.0, 0.0, x, X, _desc((6, 10), BF16), Y, sb, S, 0), BAD, "yDesc: data type")
    _check(f, (h, nd, 1.0, 0.0, x, X, x, Y, sb, 0, 0), NULL, "scale: NULL")
    _check(f, (h, "nd", 1.0, 0.0, x, X, x, Y, sb, S, 0), BAD, "normDesc: not a live norm descriptor")


def _bwd_args(h, nd, x, dy=None, dx=None, sb=None, st=None, ptrs=None, ws_size=1 << 30):
    if sb is None or st is None:
        dsb, dst = _params(x, nd)
        sb, st = sb or dsb, st or dst
    p = dict(x=X, dy=DY, dx=DX, s=S, b=B, ds=S + 4096, db=B + 4096, m=M, v=V, w=W)
    p.update(ptrs or {})
    return (h, nd, 1.0, 0.0, 1.0, 0.0, x, p["x"], dy or x, p["dy"], dx or x, p["dx"], sb, p["s"], p["b"],
            p["ds"], p["db"], st, p["m"], p["v"], p["w"], ws_size)


def test_backward_validation():
    h = cpu_handle()
    f = pydnn.norm_backward
    x = _desc((64, 256), BF16)
    nd = _nd(LAYER)
    _check(f, _bwd_args(h, nd, x), NOINIT, "")
    _check(f, _bwd_args(h, nd, x, dy=_desc((64, 255), BF16)), BAD, "dyDesc: dims (64, 255) differ")
    _check(f, _bwd_args(h, nd, x, dx=_desc((64, 256), F32)), BAD, "dxDesc: data type")
    _check(f, _bwd_args(h, nd, x, dy=_desc((64, 256), F16)), BAD, "dyDesc: data type")
    _check(f, _bwd_args(h, nd, x, dx=_desc((64, 256), BF16, (1, 1))), BAD, "dxDesc: strides")
    _check(f, _bwd_args(h, nd, x, st=_desc((64, 2))), BAD, "meanInvstdDesc: dims (64, 2) must be (64, 1)")
    _check(f, _bwd_args(h, nd, x, sb=_desc((1, 256), BF16)), BAD, "scaleBiasDesc: data type")
    sb, st = _params(x, nd)
    need = pydnn.get_norm_backward_workspace_size(h, nd, x, x, x, sb, st)
    assert need > 0 and need % 16 == 0
    _check(f, _bwd_args(h, nd, x, ws_size=need), NOINIT, "")
    _check(f, _bwd_args(h, nd, x, ws_size=need - 1), BAD, f"workspaceSizeInBytes: {need - 1} is less than the {need} bytes needed")
    _check(f, _bwd_args(h, nd, x, ws_size=0), BAD, "workspaceSizeInBytes: 0 is less")
    _check(f, _bwd_args(h, nd, x, ptrs=dict(w=0)), NULL, "workspace: NULL")
    _check(f, _bwd_args(h, nd, x, ptrs=dict(ds=0)), NULL, "resultScaleDiff: NULL")
    _check(f, _bwd_args(h, nd, x, ptrs=dict(db=0, b=0)), NOINIT, "")  # no bias, no dbias
    _check(f, _bwd_args(h, nd, x, ptrs=dict(m=0)), NULL, "savedMean: NULL")
    _check(f, _bwd_args(h, _nd(RMS), x, ptrs=dict(m=0)), NOINIT, "")
    _check(f, _bwd_args(h, nd, x, ptrs=dict(dx=DX + 1)), MIS, "dx: 0x")
    _check(f, _bwd_args(h, nd, x, ptrs=dict(db=B + 1)), MIS, "resultBiasDiff: 0x")
    _check(f, _bwd_args(h, _nd(GROUP, 3), _desc((2, 8, 4), F32), sb=_desc((1, 8, 1)), st=_desc((2, 3, 1))), BAD,
           "groups 3 does not divide")
    _check(pydnn.get_norm_backward_workspace_size, (h, nd, x, x, _desc((64, 256), F16), sb, st), BAD, "dxDesc: data type")


# ----------------------------------------------------------------------------- reference

def test_reference_matches_direct_formulas():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 6, 4, 5))
    gamma, beta = rng.standard_normal((1, 6, 1, 1)), rng.standard_normal((1, 6, 1, 1))
    # group norm with 2 groups: each (n, 3 channels, H, W)
    y, mean, inv = ref.forward(GROUP, 2, 1, 1e-5, None, 1.0, x, 0.0, None, gamma, beta)
    xs = x.reshape(3, 2, -1)
    m, v = xs.mean(-1), xs.var(-1)
    want = ((xs - m[..., None]) / np.sqrt(v[..., None] + 1e-5)).reshape(x.shape) * gamma + beta
    assert np.allclose(y, want, rtol=1e-13, atol=1e-13)
    assert np.allclose(mean, m.ravel()) and np.allclose(inv, 1 / np.sqrt(v.ravel() + 1e-5))
    # instance = group with G = C
    yi = ref.forward(INSTANCE, 0, 1, 1e-5, None, 1.0, x, 0.0, None, gamma, beta)[0]
    assert np.allclose(yi, ref.forward(GROUP, 6, 1, 1e-5, None, 1.0, x, 0.0, None, gamma, beta)[0])
    # layer norm over the last 2 dims, RMS norm
    g2 = rng.standard_normal((1, 1, 4, 5))
    yl = ref.forward(LAYER, 0, 2, 1e-3, None, 1.0, x, 0.0, None, g2, None)[0]
    m, v = x.mean(axis=(2, 3), keepdims=True), x.var(axis=(2, 3), keepdims=True)
    assert np.allclose(yl, (x - m) / np.sqrt(v + 1e-3) * g2)
    yr = ref.forward(RMS, 0, 1, 1e-6, None, 1.0, x, 0.0, None, g2[0, 0, :1, :], None)[0]
    assert np.allclose(yr, x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * g2[0, 0, :1, :])
    # activation and blending
    act = (pydnn.PYDNN_ACTIVATION_RELU, 0.0, 1.0)
    y0 = rng.standard_normal(x.shape)
    ya = ref.forward(GROUP, 2, 1, 1e-5, act, 0.5, x, -2.0, y0, gamma, beta)[0]
    assert np.allclose(ya, 0.5 * np.maximum(want, 0) - 2.0 * y0)


@pytest.mark.parametrize("kind,groups,nd,act", [
    (LAYER, 0, 1, None), (LAYER, 0, 2, (pydnn.PYDNN_ACTIVATION_GELU_TANH, 0.0, 1.0)), (RMS, 0, 1, None),
    (RMS, 0, 2, (pydnn.PYDNN_ACTIVATION_SWISH, 0.0, 1.5)), (GROUP, 2, 1, None),
    (GROUP, 3, 1, (pydnn.PYDNN_ACTIVATION_SIGMOID, 0.0, 1.0)), (INSTANCE, 0, 1, (pydnn.PYDNN_ACTIVATION_ELU, 0.7, 1.0)),
])
def test_reference_backward_is_the_vjp_of_forward(kind, groups, nd, act):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 6, 3, 4))
    dy = rng.standard_normal(x.shape)
    pshape = (1, 1, 3, 4) if nd == 2 else (1, 1, 1, 4)
    if kind in (GROUP, INSTANCE):
        pshape = (1, 6, 1, 1)
    gamma, beta = rng.standard_normal(pshape), rng.standard_normal(pshape)
    if kind == RMS:
        beta = None
    mean, inv = ref.statistics(kind, groups, nd, 1e-3, x)
    dx, dg, db = ref.backward(kind, groups, nd, 1e-3, act, x, dy, gamma, beta, mean, inv)

    def loss(xx, gg, bb):
        return (ref.forward(kind, groups, nd, 1e-3, act, 1.0, xx, 0.0, None, gg, bb)[0] * dy).sum()

    h = 1e-6
    for idx in [(0, 0, 0, 0), (1, 5, 2, 3), (0, 3, 1, 2)]:
        e = np.zeros_like(x)
        e[idx] = h
        assert np.isclose((loss(x + e, gamma, beta) - loss(x - e, gamma, beta)) / (2 * h), dx[idx], rtol=1e-5, atol=1e-7)
    for idx in [tuple(0 for _ in pshape), tuple(s - 1 for s in pshape)]:
        e = np.zeros_like(gamma)
        e[idx] = h
        assert np.isclose((loss(x, gamma + e, beta) - loss(x, gamma - e, beta)) / (2 * h), dg[idx], rtol=1e-5, atol=1e-7)
        if beta is not None:
            assert np.isclose((loss(x, gamma, beta + e) - loss(x, gamma, beta - e)) / (2 * h), db[idx], rtol=1e-5,
                              atol=1e-7)


# ----------------------------------------------------------------------------- kernel choice

def _summary(nd, x, backward=False):
    return N.plan_summary(cpu_handle(), nd, x, backward=backward)


def test_kernel_choice_for_the_benchmarks(monkeypatch):
    monkeypatch.setattr(tuning.norm, "GS", False)  # (the split kernels: test_gs_*)
    ln = _desc((16384, 4096), BF16)
    # forward: fwd_rows (v3), 128 threads per row, one row per block; the scalar launch for unaligned pointers
    alts, ws = _summary(_nd(LAYER), ln)
    # v12: with the L2 prefetch PF_BYTES ahead, in blocks of one 8 KiB row (fp32: 16 KiB)
    pf = tuning.norm.PF_BYTES["fwd_rows"] // 8192
    assert alts[0] == ["fwd_rows vec=8 G=128 block=128 items=4 rows=1 one=True grid=16384" + (f" pf={pf}" if pf else "")]
    assert alts[1][0].startswith("fwd vec=1")
    assert alts[0][0] == _summary(_nd(LAYER), _desc((16384, 4096), F16))[0][0][0]
    # fwd_persist (v7, measured slower: off): 128 threads per row, 4 blocks per SM evened out (512 x 32 rows)
    monkeypatch.setattr(tuning.norm, "FWD_PERSIST", True)
    monkeypatch.setitem(N.FWD_PERSIST_PICK, "bf16", (4, 2, 4))
    assert _summary(_nd(RMS), ln)[0][0] == ["fwd_persist vec=8 G=128 block=128 items=4 depth=2 minb=4 grid=512"]
    monkeypatch.setitem(N.FWD_PERSIST_PICK, "bf16", (2, 3, 3))  # 3 blocks per SM: 391 blocks of 42 rows
    assert _summary(_nd(LAYER), ln)[0][0] == ["fwd_persist vec=8 G=256 block=256 items=2 depth=3 minb=3 grid=391"]
    monkeypatch.setattr(tuning.norm, "FWD_PERSIST", False)
    alts, _ = _summary(_nd(LAYER), _desc((16384, 4096), F32))
    assert alts[0] == ["fwd_rows vec=4 G=256 block=256 items=4 rows=1 one=False grid=16384" + (f" pf={pf // 2}" if pf else "")]
    # v1 register tiles for what fwd_rows does not take: an activation, a row too long for a block
    alts, _ = _summary(_nd(LAYER, act=_act(pydnn.PYDNN_ACTIVATION_RELU)), ln)
    assert alts[0] == ["fwd vec=8 G=128 block=128 cluster=1"]
    alts, _ = _summary(_nd(LAYER), _desc((4, 65536), BF16))
    assert alts[0] == ["fwd vec=8 G=2048 block=256 cluster=8"]
    monkeypatch.setattr(tuning.norm, "BWD_ROWS", False)
    monkeypatch.setattr(tuning.norm, "BWD_RING", False)
    alts, ws = _summary(_nd(RMS), ln, backward=True)
    # backward without BWD_ROWS: the staged kernel, 2 blocks of 256 per SM (128 registers), evened out: 261
    # blocks of 63 rows (the last fewer)
    assert alts[0][0] == "bwd vec=8 G=256 block=256 cluster=1 preg=True plane=False staged grid=261"
    assert alts[0][1] == "finish slots=261" and ws == 261 * 2 * 4096 * 4
    # with BWD_ROWS (and BWD_RING off): bwd_rows (v4), 2 blocks per SM evened out: 261 blocks of 63 rows
    monkeypatch.setattr(tuning.norm, "BWD_ROWS", True)
    monkeypatch.setattr(tuning.norm, "BWD_RING", False)
    alts, ws = _summary(_nd(RMS), ln, backward=True)
    items, depth = N.BWD_ROWS_PICK["bf16"]
    g = 512 // items
    assert alts[0][0] == f"bwd_rows vec=8 G={g} block={g} items={items} depth={depth} grid=261"
    assert alts[0][1] == "finish slots=261" and ws == 261 * 2 * 4096 * 4
    # the default (v6): bwd_ring, 2 blocks of 256 per SM (128 registers); v9: in clusters of 2 whose blocks
    # add their partials (bwd_ring_cl): 131 clusters (262 blocks, at most 63 rows per group), 131 slots
    monkeypatch.setattr(tuning.norm, "BWD_RING", True)
    alts, ws = _summary(_nd(RMS), ln, backward=True)
    items, depth, cl = N.BWD_RING_PICK["bf16"]
    assert cl == 2
    assert alts[0][0] == f"bwd_ring vec=8 G=256 block=256 items={items} depth={depth} grid=262 cl=2"
    assert alts[0][1] == "finish slots=131" and ws == 131 * 2 * 4096 * 4
    # without clusters (CL 1, or before sm_90): one slot per block, the same 261 blocks as before v9
    for pick, arch in (((items, depth, 1), 90), ((items, depth, 2), 80)):
        with monkeypatch.context() as m:
            m.setitem(N.BWD_RING_PICK, "bf16", pick)
            m.setattr(N, "_arch_num", lambda h, arch=arch: arch)
            alts, ws = _summary(_nd(RMS), ln, backward=True)
            assert alts[0][0] == f"bwd_ring vec=8 G=256 block=256 items={items} depth={depth} grid=261"
            assert alts[0][1] == "finish slots=261" and ws == 261 * 2 * 4096 * 4
    alts, ws = _summary(_nd(RMS), _desc((16384, 4096), F32), backward=True)
    # fp32: the staged kernel, 2 blocks of 256 per SM (128 registers), evened out: 261 blocks of 63 rows
    assert alts[0][0] == "bwd vec=4 G=256 block=256 cluster=1 preg=True plane=False staged grid=261"
    assert alts[0][1] == "finish slots=261" and ws == 261 * 2 * 4096 * 4
    alts, _ = _summary(_nd(LAYER, act=_act(pydnn.PYDNN_ACTIVATION_RELU)), ln, backward=True)
    assert "staged" in alts[0][0]  # an activation: not bwd_rows
    gn = _desc((32, 512, 64, 64), BF16, packed_strides((32, 512, 64, 64), NHWC))
    # v11: gn_reg (GN_REG), each block's share of a unit in registers (8 vectors per thread) and SI more in its own
    # shared-memory slots: GN_REG_PICK (CL, GC, SI)
    # the default: (8, 4, 8), 4 groups (128 B per position) per cluster of 8 blocks of 256 threads, 32 KiB of shared
    # memory each; its y stores evict-first (STREAM)
    alts, _ = _summary(_nd(GROUP, 32), gn)
    # v12: with the L2 prefetch PF_BYTES ahead, in blocks of 512 positions x 128 B = 64 KiB
    pf = tuning.norm.PF_BYTES["gn_reg"] // 65536
    assert alts[0] == ["gn_reg vec=8 GC=4 CL=8 block=256 items=8+8 grid=2048" + (f" pf={pf}" if pf else "")]
    lc = N._plan(cpu_handle(), _nd(GROUP, 32), gn, gn, None, _params(gn, _nd(GROUP, 32))[1], False).alternatives[0][0]
    assert lc.smem == 8 * 256 * 16 and lc.params.flags & N.FLAG_STREAM
    for pick, arch, want in (((4, 4, 8), 90, "gn_reg vec=8 GC=4 CL=4 block=512 items=8+8 grid=1024"),
                             ((4, 2, 8), 90, "gn_reg vec=8 GC=2 CL=4 block=256 items=8+8 grid=2048"),
                             ((8, 2, 8), 90, "gn_reg vec=8 GC=2 CL=8 block=128 items=8+8 grid=4096"),
                             ((8, 4, 8), 80, "gen"),  # CL 1 is not compiled with SI 8; no clusters before sm_90
                             ((8, 4, 0), 90, "gn_fwd vec=8 GC=4 block=256 tile=65536 grid=2048 one"),  # not compiled
                             ((4, 16, 8), 90, "gn_fwd vec=8 GC=4 block=256 tile=65536 grid=2048 one")):  # 2048 threads
        with monkeypatch.context() as m:
            m.setattr(tuning.norm, "GN_REG_PICK", pick)
            m.setattr(N, "_arch_num", lambda h, arch=arch: arch)
            m.setitem(tuning.norm.PF_BYTES, "gn_reg", 0)  # (the distances: test_l2_prefetch_distance)
            assert _summary(_nd(GROUP, 32), gn)[0][0] == [want], pick
    monkeypatch.setattr(tuning.norm, "GN_REG", False)
    alts, _ = _summary(_nd(GROUP, 32), gn)
    # v6: gn_fwd, 4 groups (64 channels, 128 B per position) per cluster, 64 KiB tiles of 512 positions; v8:
    # one-pass statistics in 16-bit (GN_ONE)
    assert alts[0] == ["gn_fwd vec=8 GC=4 block=256 tile=65536 grid=2048 one"]
    assert alts[0][0] == _summary(_nd(GROUP, 32), _desc((32, 512, 64, 64), F16, packed_strides((32, 512, 64, 64),
                                                                                                NHWC)))[0][0][0]
    f32 = _summary(_nd(GROUP, 32), _desc((32, 512, 16, 16), F32, packed_strides((32, 512, 16, 16), NHWC)))[0][0][0]
    assert f32.startswith("gn_fwd") and not f32.endswith(" one")  # fp32: the two-pass statistics
    monkeypatch.setattr(tuning.norm, "GN_FWD", False)
    alts, _ = _summary(_nd(GROUP, 32), gn)
    assert alts[0] == ["fwd vec=8 G=2048 block=256 cluster=8"]
    monkeypatch.setattr(tuning.norm, "GN_FWD", True)
    alts, _ = _summary(_nd(GROUP, 32), _desc((32, 512, 64, 64), BF16))
    assert alts[0] == ["fwd vec=8 G=2048 block=256 cluster=8"]  # NCHW: not gn_fwd
    # v6: gn_bwd, 2 groups per cluster (x and dy tiles of 32 KiB), N * 8 workspace slots
    alts, ws = _summary(_nd(GROUP, 32), gn, backward=True)
    assert alts[0] == ["gn_bwd vec=8 GC=2 block=256 tile=65536 grid=4096", "finish slots=256"]
    assert ws == 256 * 2 * 512 * 4
    monkeypatch.setattr(tuning.norm, "GN_BWD", False)
    alts, _ = _summary(_nd(GROUP, 32), gn, backward=True)  # too large for the staged kernels: register tiles
    assert "bwd vec=8 G=4096 block=512 cluster=8 preg=False plane=True" in alts[0][0]
    alts, _ = _summary(_nd(GROUP, 32), _desc((32, 512, 64, 64), BF16), backward=True)
    assert "cluster=8 preg=False plane=False" in alts[0][0]
    alts, _ = _summary(_nd(GROUP, 32), _desc((32, 512, 16, 16), BF16, packed_strides((32, 512, 16, 16), NHWC)),
                       backward=True)
    assert "bwd vec=8 G=256 block=256 cluster=1 preg=False plane=True staged" in alts[0][0]


def test_staged_forward_choice(monkeypatch):
    """The staged forward (measured slower, off by default) still plans: persistent, evened-out grids."""
    monkeypatch.setattr(tuning.norm, "GS", False)
    monkeypatch.setattr(tuning.norm, "STAGED_FWD", True)
    monkeypatch.setattr(tuning.norm, "ROWS_FWD", False)
    monkeypatch.setattr(tuning.norm, "ROWX", False)
    monkeypatch.setattr(tuning.norm, "FWD_PERSIST", False)
    monkeypatch.setattr(tuning.norm, "GN_FWD", False)
    monkeypatch.setattr(tuning.norm, "GN_REG", False)
    alts, _ = _summary(_nd(LAYER), _desc((16384, 4096), BF16))
    assert alts[0] == ["fwd vec=8 G=128 block=128 cluster=1 staged grid=1024"]  # 8 blocks per SM, 16 rows each
    gn = _desc((32, 512, 64, 64), BF16, packed_strides((32, 512, 64, 64), NHWC))
    alts, _ = _summary(_nd(GROUP, 32), gn)
    assert alts[0] == ["fwd vec=8 G=2048 block=256 cluster=8 staged grid=512"]
    assert N._staged_expr("bf16", 8, False) in N._unit_exprs("bf16")


def test_kernel_choice_falls_back_to_gen(monkeypatch):
    monkeypatch.setattr(tuning.norm, "GS", False)
    alts, ws = _summary(_nd(LAYER), _desc((2, 300000), BF16), backward=True)  # beyond a cluster's registers
    assert alts == [["zero", "gen", "finish slots=1"]] and ws == 2 * 300000 * 4
    alts, _ = _summary(_nd(GROUP, 2), _desc((2, 4, 3, 5), F32, (1, 2, 40, 8)))  # three-level layout
    assert alts == [["gen"]]
    h = cpu_handle()
    h.arch = "sm_80"  # no clusters before sm_90
    alts, _ = N.plan_summary(h, _nd(GROUP, 32), _desc((4, 512, 64, 64), BF16))
    assert alts == [["gen"]]


# ----------------------------------------------------------------------------- kernel emulation

def _addresses(desc):
    """Element address (in elements) of every logical index of desc, as an array of its dims."""
    idx = np.zeros(desc.dims, np.int64)
    for d, (n, s) in enumerate(zip(desc.dims, desc.strides)):
        shape = [1] * len(desc.dims)
        shape[d] = n
        idx = idx + (np.arange(n) * s).reshape(shape)
    return idx


def _expected(kind, groups, nd_k, x):
    """For each logical element of x: its set and its parameter index (logical order)."""
    dims = x.dims
    count = int(np.prod(dims))
    lin = np.arange(count).reshape(dims)
    if kind in (LAYER, RMS):
        per = int(np.prod(dims[len(dims) - nd_k:]))
        return lin // per, lin % per
    g = dims[1] if kind == INSTANCE else groups
    cg = dims[1] // g
    c = np.broadcast_to(np.arange(dims[1]).reshape((1, -1) + (1,) * (len(dims) - 2)), dims)
    n = np.broadcast_to(np.arange(dims[0]).reshape((-1,) + (1,) * (len(dims) - 1)), dims)
    return n * g + c // cg, c


def _set_base(p, s):
    off, pb = [0, 0, 0, 0], 0
    for d in range(p.set_ndim - 1, -1, -1):
        s, c = divmod(s, p.set_size[d])
        for k in range(4):
            off[k] += c * p.set_stride[k][d]
        pb += c * p.set_pstride[d]
    return off, pb


def _emulate(p, vec, items, backward, operand):
    """(address, set, parameter index) visited by the fast kernel for each element of `operand` (0 x,
    1 out, 2 dy), replaying fwd_body / bwd_body's index arithmetic; also the stats offset per set."""
    G = p.group
    nvec = p.len // vec
    if p.el_ndim == 1:
        I, os_, po, pi = p.len, 0, 0, p.el_pstride[0]
    else:
        I, os_, po, pi = p.el_size[1], p.el_stride[operand][0], p.el_pstride[0], p.el_pstride[1]
    lanes = np.arange(G)
    k = np.arange(items)
    vi = (lanes[:, None] + k[None, :] * G).ravel()
    vi = vi[vi < nvec]
    e = vi * vec
    o, i = e // I, e % I
    seen_addr, seen_set, seen_par, stats = [], [], [], []
    for s in range(p.sets):
        off, pb = _set_base(p, s)
        stats.append(off[3])
        for j in range(vec):
            seen_addr.append(off[operand] + o * os_ + i + j)
            seen_par.append(pb + o * po + (i + j) * pi)
            seen_set.append(np.full(len(vi), s))
    return np.concatenate(seen_addr), np.concatenate(seen_set), np.concatenate(seen_par), stats


def _emulate_rows(p, lc, operand):
    """fwd_rows: block b, group sub, row r of the group -> row b * per_block + sub * R + r; the thread's
    vectors lane + k * G of that row at row * stride (the R rows of a group in 32-bit offsets from the
    first), parameters 1:1 with the row, statistics at row * stats stride."""
    vec, items, rows = (int(a) for a in lc.expr.split("<")[1].rstrip(">").split(",")[1:4])
    G, nvec = p.group, p.len // vec
    assert p.set_ndim == 1 and p.el_ndim == 1 and p.el_pstride[0] == 1 and p.set_pstride[0] == 0
    assert lc.block[0] % G == 0 and G & (G - 1) == 0 and G <= lc.block[0] <= 1024
    per_block = lc.block[0] // G * rows
    assert lc.grid[0] * per_block >= p.sets > (lc.grid[0] - 1) * per_block  # one-shot: every row, no idle block
    stride = p.set_stride[operand if operand < 2 else 2][0]
    assert rows * abs(stride) < 2**31
    vi = (np.arange(G)[:, None] + np.arange(items)[None, :] * G).ravel()
    vi = vi[vi < nvec]
    addr, sets, pars, stats = [], [], [], []
    for b in range(lc.grid[0]):
        for sub in range(lc.block[0] // G):
            first = b * per_block + sub * rows
            for r in range(rows):
                row = first + r
                if row >= p.sets:
                    continue
                stats.append(row * p.set_stride[3][0])
                for j in range(vec):
                    addr.append(first * stride + r * stride + vi * vec + j)
                    pars.append(vi * vec + j)
                    sets.append(np.full(len(vi), row))
    return np.concatenate(addr), np.concatenate(sets), np.concatenate(pars), stats


def _emulate_rowx(p, lc, operand):
    """fwd_rowx: block b, group sub -> row b * (block / G) + sub; the row's aligned frame: a = (row * x's
    stride) mod vec (every operand's stride agrees mod vec), vectors vi = lane + k * G < ceil((a + len) /
    vec) at row * stride - a + vi * vec (16-byte aligned), element e at position vi * vec + e - a, kept
    when in [0, len); parameters 1:1 with the position, statistics at row * stats stride."""
    args = [int(a) for a in lc.expr.split("<")[1].rstrip(">").split(",")[1:]]
    vec, items, cl = args[0], args[1], (args[2] if "fwd_rowx_cl" in lc.expr else 1)
    G, L = p.group, p.len
    assert p.set_ndim == 1 and p.el_ndim == 1 and p.el_pstride[0] == 1 and p.set_pstride[0] == 0
    assert lc.block[0] % G == 0 and G & (G - 1) == 0 and G <= lc.block[0] <= N.ROWX_MAX_GROUP
    spb = lc.block[0] // G
    if cl > 1:  # fwd_rowx_cl: one row per cluster of cl blocks, rank r holding vectors lane + (k * cl + r) * G
        assert spb == 1 and lc.grid[0] == p.sets * cl
    else:
        assert lc.grid[0] * spb >= p.sets > (lc.grid[0] - 1) * spb
    stride = p.set_stride[operand if operand < 2 else 2][0]
    assert all(p.set_stride[k][0] % vec == p.set_stride[0][0] % vec for k in range(3))
    vi_all = np.concatenate([(np.arange(G)[:, None] + (np.arange(items)[None, :] * cl + r) * G).ravel()
                             for r in range(cl)])  # (the cluster's blocks together)
    assert sorted(vi_all.tolist()) == list(range(G * items * cl))
    addr, sets, pars, stats = [], [], [], []
    for row in range(p.sets):
        a = (row * p.set_stride[0][0]) % vec
        nsv = (a + L + vec - 1) // vec
        vi = vi_all[vi_all < nsv]
        start = row * stride - a
        assert start % vec == 0, "an aligned vector"
        stats.append(row * p.set_stride[3][0])
        for e in range(vec):
            j = vi * vec + e - a
            keep = (j >= 0) & (j < L)
            addr.append(start + vi[keep] * vec + e)
            pars.append(j[keep])
            sets.append(np.full(int(keep.sum()), row))
    return np.concatenate(addr), np.concatenate(sets), np.concatenate(pars), stats


def _emulate_bwd_rowx(p, lc, operand, pl):
    """bwd_rowx: block b takes alignment class c = b mod P (P = p.pf, the period of (row * stride) mod vec),
    its group sub the class's rows c + P * t, t = (b / P) * spb + sub + i * (grid / P) * spb; a = (c *
    stride) mod vec for all of them (checked: the same for every row of the class, so a thread keeps the
    same positions), the aligned frame of fwd_rowx; the group's slot b * spb + sub owns every position
    once (the partials' ownership), the workspace holds grid * spb slots."""
    args = [int(a) for a in lc.expr.split("<")[1].rstrip(">").split(",")[1:]]
    vec, items, cl = args[0], args[1], (args[2] if "bwd_rowx_cl" in lc.expr else 1)
    G, L, P = p.group, p.len, p.pf
    assert p.set_ndim == 1 and p.el_ndim == 1 and p.el_pstride[0] == 1 and p.set_pstride[0] == 0
    assert G & (G - 1) == 0 and lc.block[0] == max(G, N.MIN_BLOCK) <= N.ROWX_BWD_MAX_BLOCK
    units = lc.grid[0] // cl  # blocks, or clusters of cl blocks (one group each: G = block)
    assert lc.grid[0] % cl == 0 and units % P == 0 and lc.smem == lc.block[0] * items * 2 * vec * 4
    assert cl == 1 or G == lc.block[0]
    spb, m = lc.block[0] // G, units // P
    assert pl.workspace >= units * spb * 2 * p.nparams * 4
    assert [a[-1].desc for a in pl.alternatives if a[0] is lc] == [f"finish slots={units * spb}"]
    sx = p.set_stride[0][0]
    assert all(p.set_stride[k][0] % vec == sx % vec for k in range(3))
    stride = p.set_stride[operand][0]
    vi_all = np.concatenate([(np.arange(G)[:, None] + (np.arange(items)[None, :] * cl + r) * G).ravel()
                             for r in range(cl)])  # (a cluster's blocks together)
    addr, sets, pars, stats = [], [], [], []
    for b in range(units):
        cls, bi = b % P, b // P
        a = (cls * sx) % vec
        nsv = (a + L + vec - 1) // vec
        vi = vi_all[vi_all < nsv]
        own = (vi[:, None] * vec + np.arange(vec) - a).ravel()
        assert sorted(own[(own >= 0) & (own < L)].tolist()) == list(range(L))  # the slot: every position once
        nrows = (p.sets - cls + P - 1) // P if cls < p.sets else 0
        for sub in range(spb):
            t = bi * spb + sub
            while t < nrows:
                row = cls + P * t
                assert (row * sx) % vec == a
                stats.append(row * p.set_stride[3][0])
                for e in range(vec):
                    j = vi * vec + e - a
                    keep = (j >= 0) & (j < L)
                    addr.append(row * stride - a + vi[keep] * vec + e)
                    pars.append(j[keep])
                    sets.append(np.full(int(keep.sum()), row))
                t += m * spb
    return np.concatenate(addr), np.concatenate(sets), np.concatenate(pars), stats


def _emulate_bwd_rows(p, lc, operand, pl):
    """bwd_rows: block b, group sub walks rows b * spb + sub + t * step (step = grid * spb) while the
    block's base row b * spb + t' * DEPTH * step is in range (rows past the end dead); the thread's
    vectors lane + k * G of a row at row * stride; its workspace slot b * spb + sub, one per group."""
    vec, items, depth = (int(a) for a in lc.expr.split("<")[1].rstrip(">").split(",")[1:4])
    G, nvec = p.group, p.len // vec
    assert p.set_ndim == 1 and p.el_ndim == 1 and p.el_pstride[0] == 1 and p.set_pstride[0] == 0
    assert G & (G - 1) == 0 and lc.block[0] == max(G, N.MIN_BLOCK) <= 512 // items
    spb = lc.block[0] // G
    step = lc.grid[0] * spb
    cl = int(lc.expr.split(",")[4].rstrip(">")) if "bwd_ring_cl" in lc.expr else 1  # blocks per cluster (v9)
    assert lc.grid[0] % cl == 0
    if "fwd_persist" not in lc.expr:  # (fwd_persist, the same walk in the forward: no workspace)
        assert pl.workspace >= lc.grid[0] // cl * spb * 2 * p.nparams * 4
    if "bwd_ring" in lc.expr:  # (v9) the block's [spb][2][nparams] partials pass through its ring
        assert spb * 2 * p.nparams * 4 <= lc.smem
        assert [a[-1].desc for a in pl.alternatives if a[0] is lc] == [f"finish slots={lc.grid[0] // cl * spb}"]
    stride = p.set_stride[operand][0]
    vi = (np.arange(G)[:, None] + np.arange(items)[None, :] * G).ravel()
    vi = vi[vi < nvec]
    assert sorted((vi[:, None] * vec + np.arange(vec)).ravel().tolist()) == list(range(p.nparams))  # owned once
    addr, sets, pars, stats = [], [], [], []
    for b in range(lc.grid[0]):
        for sub in range(spb):
            base = b * spb
            while base < p.sets:
                for d in range(depth):
                    row = base + sub + d * step
                    if row >= p.sets:
                        continue
                    stats.append(row * p.set_stride[3][0])
                    for j in range(vec):
                        addr.append(row * stride + vi * vec + j)
                        pars.append(vi * vec + j)
                        sets.append(np.full(len(vi), row))
                base += depth * step
    return np.concatenate(addr), np.concatenate(sets), np.concatenate(pars), stats


def _emulate_gn(p, lc, operand, pl):
    """gn_fwd / gn_bwd: cluster u = block // 8 owns unit u: sample n = u // (G / GC), groups g0 = (u % (G /
    GC)) * GC .. + GC - 1; block rank r takes positions [r * ppb, (r + 1) * ppb); tile vector v (thread v %
    block) is position v // VPP, channel vector cv = v % VPP (fixed per thread: block % VPP == 0), at
    n * sN + g0 * sG + pos * sP + cv * vec; its parameters g0 * cg + cv * vec + j; rank 0 writes the unit's
    GC statistics. Shared memory: the tile of each operand (the backward: x, then dy)."""
    vec = int(lc.expr.split(",")[1].rstrip(">"))
    GC, G, N_ = p.group, p.set_size[1], p.set_size[0]
    P, cg = p.el_size[0], p.el_size[1]
    VPP = GC * cg // vec
    assert p.set_ndim == 2 and p.el_ndim == 2 and 32 % VPP == 0 and lc.block[0] % VPP == 0 and lc.block[0] % 32 == 0
    assert p.set_stride[0][1] == p.set_stride[1][1] == cg or G == 1
    ppb = -(-P // 8)
    nops = 2 if "gn_bwd" in lc.expr else 1
    assert lc.smem >= nops * ppb * VPP * 16 and lc.smem <= N.SMEM_BLOCK_MAX and lc.grid[0] == N_ * (G // GC) * 8
    assert p.group * cg <= 32 * 8  # the backward's psum
    if nops == 2:  # workspace slot n * 8 + rank: the units of a sample cover each channel of it once
        cover = np.zeros((N_ * 8, G * cg), np.int64)
        for u in range(lc.grid[0] // 8):
            n, g0 = u // (G // GC), (u % (G // GC)) * GC
            cover[n * 8:n * 8 + 8, g0 * cg:(g0 + GC) * cg] += 1
        assert (cover == 1).all() and pl.workspace >= N_ * 8 * 2 * G * cg * 4
    addr, sets, pars, stats = [], [], [], []
    for u in range(lc.grid[0] // 8):
        n, g0 = u // (G // GC), (u % (G // GC)) * GC
        stats += [n * p.set_stride[3][0] + (g0 + i) * p.set_stride[3][1] for i in range(GC)]
        for r in range(8):
            npos = max(0, min(ppb, P - r * ppb))
            v = np.arange(npos * VPP)
            pos, cv = r * ppb + v // VPP, v % VPP
            for j in range(vec):
                addr.append(n * p.set_stride[operand][0] + g0 * p.set_stride[operand][1] +
                            pos * p.el_stride[operand][0] + cv * vec + j)
                pars.append(g0 * cg + cv * vec + j)
                sets.append(n * G + g0 + (cv * vec + j) // cg)
    return np.concatenate(addr), np.concatenate(sets), np.concatenate(pars), stats


def _emulate_gn_reg(p, lc, operand):
    """gn_reg / gn_reg_cl (v11): CL blocks per unit (block // CL: sample n, groups g0 .. g0 + GC - 1, as gn_fwd),
    rank block % CL takes positions [rank * ppb, ...); thread t holds channel vector t % VPP of positions
    t // VPP + k * (block // VPP), k < ITEMS (registers: no shared-memory tile); rank 0 writes the statistics."""
    args = [a.strip() for a in lc.expr.split("<")[1].rstrip(">").split(",")]
    vec, items, si = int(args[1]), int(args[2]), int(args[3])
    cl = int(args[4]) if "gn_reg_cl" in lc.expr else 1
    GC, G, N_ = p.group, p.set_size[1], p.set_size[0]
    P, cg = p.el_size[0], p.el_size[1]
    VPP, block = GC * cg // vec, lc.block[0]
    assert 32 % VPP == 0 and block % VPP == 0 and block <= N.GN_REG_MAX_BLOCK and lc.smem == si * block * 16
    items += si  # the SI shared-memory slots continue the register items: positions t // VPP + k * (block // VPP)
    assert lc.grid[0] == N_ * (G // GC) * cl
    ppb, pstep = -(-P // cl), block // VPP
    addr, sets, pars, stats = [], [], [], []
    for b in range(lc.grid[0]):
        u, r = divmod(b, cl)
        n, g0 = u // (G // GC), (u % (G // GC)) * GC
        if r == 0:
            stats += [n * p.set_stride[3][0] + (g0 + i) * p.set_stride[3][1] for i in range(GC)]
        npos = max(0, min(ppb, P - r * ppb))
        t = np.arange(block)
        cv, pt = t % VPP, t // VPP
        for k in range(items):
            live = pt + k * pstep < npos
            pos = r * ppb + pt[live] + k * pstep
            for j in range(vec):
                addr.append(n * p.set_stride[operand][0] + g0 * p.set_stride[operand][1] +
                            pos * p.el_stride[operand][0] + cv[live] * vec + j)
                pars.append(g0 * cg + cv[live] * vec + j)
                sets.append(n * G + g0 + (cv[live] * vec + j) // cg)
    return np.concatenate(addr), np.concatenate(sets), np.concatenate(pars), stats


def _emulate_gs(p, lc, operand):
    """The split kernels (ptx/normalization_gs.cuh) on packed tensors (address = flat index): gsp_fwd walks each
    set's head scalars, 16-byte vectors and tail scalars over the CL * block threads of its unit; gsc_fwd a
    slab's rows per thread (channel vector t % NCV, rows rank * R + t // NCV + k * R * CL); gsp_bpart a warp
    per plane chunk; gsc_bpart a block per (n, row chunk), channel-vector blocks in turn; gs_bapply the flat
    tensor. Returns (addresses, sets, parameters, statistics touched (each (n, g) once))."""
    kname = lc.expr.split("<")[0].rsplit("::", 1)[-1]
    vec = int(lc.expr.split(",")[1].strip().rstrip(">"))
    Nn, C, S, G = (int(p.set_size[i]) for i in range(4))
    cg, L = C // G, C // G * S
    nhwc = bool(p.flags & N.GS_FLAG_NHWC)
    cl = 8 if kname.endswith("_cl") else 1
    block = lc.block[0]
    flat = []
    if kname.startswith("gsp_fwd"):
        assert lc.grid[0] == Nn * G * cl and lc.smem == 8 * cg
        NT = cl * block
        for s_ in range(Nn * G):
            base = s_ * L
            h = min((vec - base % vec) % vec, L)
            nv = (L - h) // vec
            t0 = h + nv * vec
            for tid in range(NT):
                flat += [base + i for i in range(tid, h, NT)] + [base + i for i in range(t0 + tid, L, NT)]
                for j in range(tid, nv, NT):
                    flat += [base + h + j * vec + e for e in range(vec)]
    elif kname.startswith("gsf_fwd"):  # a sample per unit, super-rows of P = lcm(C, vec) elements
        P = int(p.el_size[0])
        ncv, KR = P // vec, P // C
        R = block // ncv
        SR = S // KR
        assert S % KR == 0 and P % vec == 0 and P % C == 0 and lc.grid[0] == Nn * cl
        assert lc.smem == 4 * (3 * R * ncv * vec + 4 * G + 2 * C)  # (float only: 3 sums a position)
        for b in range(lc.grid[0]):
            n, rank = divmod(b, cl)
            for t in range(block):
                cv, rr = t % ncv, t // ncv
                if rr >= R:
                    continue
                for r in range(rank * R + rr, SR, R * cl):
                    flat += [n * S * C + r * P + cv * vec + e for e in range(vec)]
    elif kname.startswith("gsc_fwd"):
        W = int(p.el_size[0])
        NS, ncv = C // W, W // vec
        R = block // ncv
        assert lc.grid[0] == Nn * NS * cl and C % W == 0 and W % cg == 0 and W % vec == 0 and C % vec == 0
        ns = 3 if "<float," in lc.expr else 2  # sums a channel (float: sum x as well)
        # red[ns][R * NCV * VEC], grp[ns][W / cg], gk[W / cg], ta[W] (float: each channel's K in pass 1), tb[W]
        assert lc.smem == 4 * (ns * R * ncv * vec + (ns + 1) * (W // cg) + 2 * W)
        for b in range(lc.grid[0]):
            u, rank = divmod(b, cl)
            n, w0 = u // NS, (u % NS) * W
            for t in range(block):
                cv, rr = t % ncv, t // ncv
                if rr >= R:
                    continue
                for r in range(rank * R + rr, S, R * cl):
                    flat += [n * S * C + r * C + w0 + cv * vec + e for e in range(vec)]
    elif kname == "gsp_bpart":
        K, CH = int(p.el_size[1]), int(p.el_size[3])
        assert lc.grid[0] * (block // 32) >= Nn * C * K and CH * K >= S and CH * (K - 1) < S
        for unit in range(Nn * C * K):
            pl, k = divmod(unit, K)
            start, end = pl * S + k * CH, min(pl * S + k * CH + CH, (pl + 1) * S)
            a0 = min(end, -(-start // vec) * vec)
            nv = (end - a0) // vec
            t0 = a0 + nv * vec
            for lane in range(32):
                flat += list(range(start + lane, a0, 32)) + list(range(t0 + lane, end, 32))
                for j in range(lane, nv, 32):
                    flat += [a0 + j * vec + e for e in range(vec)]
    elif kname == "gsc_bpart":
        K, RC = int(p.el_size[1]), int(p.el_size[3])
        ncv = C // vec
        ncvb = min(ncv, block)
        R = block // ncvb
        assert lc.grid[0] == Nn * K and RC * K >= S and C % vec == 0 and lc.smem == 8 * R * ncvb * vec
        for b in range(lc.grid[0]):
            n, k = divmod(b, K)
            rs, re = k * RC, min(k * RC + RC, S)
            for cvb in range(0, ncv, ncvb):
                for t in range(block):
                    rr, cv = t // ncvb, cvb + t % ncvb
                    if rr >= R or cv >= ncv:
                        continue
                    for r in range(rs + rr, re, R):
                        flat += [n * S * C + r * C + cv * vec + e for e in range(vec)]
    elif kname == "gs_bapply":
        total = Nn * C * S
        nv = total // vec
        nthreads = lc.grid[0] * block  # (a grid-stride walk: every vector visited once for any grid)
        assert nthreads >= 1 and block >= total - nv * vec
        flat = list(range(nv * vec)) + list(range(nv * vec, total))
    else:
        raise AssertionError(kname)
    flat = np.array(flat, np.int64)
    if nhwc:
        n, rem = np.divmod(flat, S * C)
        c = rem % C
    else:
        n, rem = np.divmod(flat, C * S)
        c = rem // S
    stats = sorted({int(a) * int(p.set_stride[3][0]) + int(b) * int(p.set_stride[3][1])
                    for a in range(Nn) for b in range(G)})
    return flat, n * G + c // cg, c, stats


def _emulate_gen(p, operand):
    e = np.arange(p.len)
    off = np.zeros(p.len, np.int64)
    par = np.zeros(p.len, np.int64)
    rem = e.copy()
    for d in range(p.el_ndim - 1, -1, -1):
        rem, c = np.divmod(rem, p.el_size[d])
        off += c * p.el_stride[operand][d]
        par += c * p.el_pstride[d]
    addr, sets, pars, stats = [], [], [], []
    for s in range(p.sets):
        o, pb = _set_base(p, s)
        stats.append(o[3])
        addr.append(o[operand] + off)
        pars.append(pb + par)
        sets.append(np.full(p.len, s))
    return np.concatenate(addr), np.concatenate(sets), np.concatenate(pars), stats


LAYOUTS = [  # kind, groups, normalized dims, dims, strides of x / out / dy (None: packed NCHW; "nhwc")
    (LAYER, 0, 1, (6, 40), None, None),
    (LAYER, 0, 1, (37, 48), (56, 1), (64, 1)),           # fwd_rows: padded rows, x and y strides differ
    (RMS, 0, 2, (3, 11, 4, 128), None, None),            # fwd_rows: merged set dims, 512-element rows
    (LAYER, 0, 1, (5, 37), (41, 1), (37, 1)),            # padded rows, odd length
    (LAYER, 0, 1, (9, 37), None, None),                  # fwd_rowx: odd length, several rows per block
    (RMS, 0, 1, (6, 100), (103, 1), (103, 1)),           # fwd_rowx: stride 103, every row offset
    (LAYER, 0, 1, (2, 27723), None, None),               # fwd_rowx: 8 vectors per thread (fp32)
    (LAYER, 0, 2, (3, 5, 8), (60, 12, 1), None),         # padded trailing dims: two levels
    (LAYER, 0, 2, (3, 5, 8), (40, 1, 5), None),          # transposed trailing dims
    (RMS, 0, 1, (4, 3, 64), None, "nhwc"),
    (LAYER, 0, 3, (2, 3, 4, 8), None, None),
    (RMS, 0, 2, (1, 3000, 24), None, None),              # cluster (sm_90) in 16-bit
    (GROUP, 4, 1, (3, 8, 5, 4), None, None),             # NCHW groups
    (GROUP, 4, 1, (3, 16, 5, 4), "nhwc", "nhwc"),        # NHWC groups (PLANE)
    (GROUP, 2, 1, (2, 12, 6, 5), "nhwc", None),          # NHWC x, NCHW y
    (GROUP, 32, 1, (2, 512, 12, 12), "nhwc", "nhwc"),    # gn_fwd (GC 1), cluster NHWC backward
    (GROUP, 8, 1, (3, 256, 9, 7), "nhwc", "nhwc"),       # gn_fwd: GC 2 (16-bit) / 1, positions not a multiple of 8
    (GROUP, 4, 1, (2, 64, 3, 1), "nhwc", "nhwc"),        # gn_fwd: 3 positions, ranks 3..7 empty
    (GROUP, 2, 1, (5, 32, 1, 1), "nhwc", "nhwc"),        # gn_fwd: one position (channels only)
    (GROUP, 1, 1, (2, 16, 5, 5), "nhwc", "nhwc"),        # gn_fwd: one group
    (GROUP, 8, 1, (2, 64, 40, 40), "nhwc", "nhwc"),      # gn_reg: 1600 positions of 8 channels (GC 1: VPP 1)
    (GROUP, 8, 1, (2, 64, 24, 24), None, None),          # cluster NCHW
    (GROUP, 2, 1, (2, 64, 16, 16), "nhwc", "nhwc"),      # staged cluster backward
    (LAYER, 0, 1, (9, 8192), None, None),                # staged cluster backward, PREG
    (INSTANCE, 0, 1, (2, 6, 5, 7), None, None),
    (INSTANCE, 0, 1, (2, 6, 5, 7), "nhwc", "nhwc"),
    (INSTANCE, 0, 1, (3, 5), None, None),                # no spatial dims
    (GROUP, 2, 1, (2, 4, 3, 5), (1, 2, 40, 8), None),    # gen
    (GROUP, 1, 1, (2, 8, 3, 3, 2), None, None),          # 5-d
]


def _layout_desc(dims, layout, dtype):
    if layout is None:
        return _desc(dims, dtype)
    if layout == "nhwc":
        return _desc(dims, dtype, packed_strides(dims, NHWC))
    return _desc(dims, dtype, layout)


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("direction", ["forward", "forward staged", "forward gn wide", "backward", "backward staged",
                                       "backward gn wide"] +
                         [f"forward rows {i}" for i in range(max(len(c) for c in N.ROWS_CONFIGS.values()))] +
                         [f"forward persist {i}" for i in range(max(len(c) for c in N.FWD_PERSIST_CONFIGS.values()))] +
                         [f"backward rows {i}" for i in range(max(len(c) for c in N.BWD_ROWS_CONFIGS.values()))] +
                         [f"backward ring {i}" for i in range(max(len(c) for c in N.BWD_RING_CONFIGS.values()))] +
                         [f"forward gn reg {cl} {gc} {si}" for cl, gc, si in ((8, 4, 8), (8, 2, 8), (4, 4, 8), (4, 2, 8))] +
                         ["forward gs", "forward gs cl1", "backward gs"])
@pytest.mark.parametrize("case", range(len(LAYOUTS)))
def test_kernels_visit_every_element_once(case, direction, dtype, monkeypatch):
    """Every plan's launches replayed on the CPU; "forward rows i": the i-th compiled fwd_rows config
    (ROWS_CONFIGS) instead of the default, so that each one the GPU tests run is checked here too; "... gs": the
    split kernels for every set size (GS_MIN_BYTES 1; cl1: one block per unit)."""
    backward = direction.startswith("backward")
    gs = direction.endswith(("gs", "gs cl1"))
    monkeypatch.setattr(tuning.norm, "GS_MIN_BYTES", 1 if gs else tuning.norm.GS_MIN_BYTES)
    monkeypatch.setattr(tuning.norm, "GS_FWD_F32", gs)  # (the float forward's split kernels)
    if direction.endswith("cl1"):
        monkeypatch.setattr(N, "GS_CLUSTER_UNITS_PER_SM", 0)
    monkeypatch.setattr(tuning.norm, "STAGED_FWD", direction == "forward staged")
    monkeypatch.setattr(tuning.norm, "BWD_ROWS", direction != "backward staged")
    monkeypatch.setattr(tuning.norm, "GN_FWD", direction != "forward staged")
    monkeypatch.setattr(tuning.norm, "GN_BWD", direction in ("backward", "forward", "backward gn wide"))
    monkeypatch.setattr(tuning.norm, "BWD_RING", direction in ("backward", "forward") or direction.startswith("backward ring"))
    monkeypatch.setattr(tuning.norm, "FWD_PERSIST", direction == "forward" or direction.startswith("forward persist"))
    monkeypatch.setattr(tuning.norm, "GN_REG", direction == "forward" or direction.startswith("forward gn reg"))
    if gs:
        for name in ("GN_FWD", "GN_BWD", "GN_REG"):
            monkeypatch.setattr(tuning.norm, name, False)
    if direction.startswith("forward gn reg"):
        monkeypatch.setattr(tuning.norm, "GN_REG_PICK", tuple(int(a) for a in direction.split()[-3:]))
    if direction.startswith("forward persist"):
        configs = N.FWD_PERSIST_CONFIGS[4 if dtype == F32 else 2]
        i = int(direction.split()[-1])
        if i >= len(configs):
            pytest.skip("no such fwd_persist config for this element size")
        monkeypatch.setitem(N.FWD_PERSIST_PICK, "bf16", configs[i])
    if direction.startswith("backward ring"):
        configs = N.BWD_RING_CONFIGS[4 if dtype == F32 else 2]
        i = int(direction.split()[-1])
        if i >= len(configs):
            pytest.skip("no such bwd_ring config for this element size")
        monkeypatch.setitem(N.BWD_RING_PICK, "bf16", configs[i])
    if direction.endswith("gn wide"):  # gn_fwd / gn_bwd's largest GC that fits, not the one that fills the GPU
        monkeypatch.setattr(tuning.norm, "GN_FILL", 0)
    if direction.startswith("backward rows"):
        configs = N.BWD_ROWS_CONFIGS[4 if dtype == F32 else 2]
        i = int(direction.split()[-1])
        if i >= len(configs):
            pytest.skip("no such bwd_rows config for this element size")
        monkeypatch.setitem(N.BWD_ROWS_PICK, "bf16", configs[i])
    if direction.startswith("forward rows"):
        configs = N.ROWS_CONFIGS[4 if dtype == F32 else 2]
        i = int(direction.split()[-1])
        if i >= len(configs):
            pytest.skip("no such fwd_rows config for this element size")
        monkeypatch.setitem(N.ROWS_PICK, "f32" if dtype == F32 else "bf16", configs[i])
    kind, groups, k, dims, lx, ly = LAYOUTS[case]
    nd = _nd(kind, groups, k)
    x, y = _layout_desc(dims, lx, dtype), _layout_desc(dims, ly, dtype)
    sb, st = _params(x, nd)
    h = cpu_handle()
    pl = N._plan(h, nd, x, y, y if backward else None, st, backward)
    want_set, want_par = _expected(kind, groups, k, x)
    st_addr = _addresses(st).ravel()
    for alt in pl.alternatives:
        for lc in alt:
            p = lc.params
            kname = lc.expr.split("<")[0].rsplit("::", 1)[-1]
            if kname in ("finish", "finish_rowx", "zero", "gs_bred", "gs_bset"):
                continue
            for operand, desc in ((0, x), (1, y)) + (((2, y),) if backward else ()):
                if kname.endswith("_bpart") and operand == 1:
                    continue  # (reads x and dy only)
                if kname.startswith("gs"):
                    addr, sset, spar, stats = _emulate_gs(p, lc, operand)
                elif kname.startswith("gen"):
                    addr, sset, spar, stats = _emulate_gen(p, operand)
                elif kname == "fwd_rows":
                    addr, sset, spar, stats = _emulate_rows(p, lc, operand)
                elif kname in ("fwd_rowx", "fwd_rowx_cl"):
                    addr, sset, spar, stats = _emulate_rowx(p, lc, operand)
                elif kname in ("bwd_rowx", "bwd_rowx_cl"):
                    addr, sset, spar, stats = _emulate_bwd_rowx(p, lc, operand, pl)
                elif kname in ("gn_fwd", "gn_bwd"):
                    addr, sset, spar, stats = _emulate_gn(p, lc, operand, pl)
                elif kname in ("gn_reg", "gn_reg_cl"):
                    addr, sset, spar, stats = _emulate_gn_reg(p, lc, operand)
                elif kname in ("bwd_rows", "bwd_ring", "bwd_ring_cl", "fwd_persist"):
                    addr, sset, spar, stats = _emulate_bwd_rows(p, lc, operand, pl)
                else:
                    vec = int(lc.expr.split(",")[1])
                    items = int(lc.expr.split(",")[2].split(">")[0])
                    addr, sset, spar, stats = _emulate(p, vec, items, backward, operand)
                    assert lc.block[0] * (lc.grid[0] if "cluster" not in kname else 8) >= 1
                logical = _addresses(desc)
                order = np.argsort(logical.ravel())
                sorted_addr = logical.ravel()[order]
                pos = np.searchsorted(sorted_addr, addr)
                assert (pos < sorted_addr.size).all() and (sorted_addr[pos] == addr).all(), f"{lc.desc}: stray address"
                which = order[pos]
                assert np.bincount(which, minlength=logical.size).tolist() == [1] * logical.size, f"{lc.desc}: coverage"
                assert (want_set.ravel()[which] == sset).all(), f"{lc.desc}: set"
                assert (want_par.ravel()[which] == spar).all(), f"{lc.desc}: parameter"
                assert sorted(stats) == sorted(st_addr.tolist()), f"{lc.desc}: stats"
            if kname.startswith("bwd") and not kname.startswith("gen") and not kname.startswith("bwd_rowx"):
                _check_partial_modes(lc, pl)  # (bwd_rowx: its slot ownership is checked in its emulation)


def _check_partial_modes(lc, pl):
    p = lc.params
    vec = int(lc.expr.split(",")[1])
    items = int(lc.expr.split(",")[2].split(",")[0])
    G, nvec = p.group, p.len // vec
    I = p.len if p.el_ndim == 1 else p.el_size[1]
    pi = p.el_pstride[0] if p.el_ndim == 1 else p.el_pstride[1]
    po = 0 if p.el_ndim == 1 else p.el_pstride[0]

    def params_of(lane, k, s):
        vi = lane + k * G
        if vi >= nvec:
            return None
        o, i = divmod(vi * vec, I)
        pb = _set_base(p, s)[1]
        return tuple(pb + o * po + (i + j) * pi for j in range(vec))

    if p.flags & N.FLAG_PREG:
        # every (lane, item, j) owns parameter vi * vec + j in every set: one-to-one with the params
        for s in range(min(p.sets, 3)):
            got = sorted(q for lane in range(G) for k in range(items) for q in (params_of(lane, k, s) or ()))
            assert got == list(range(p.nparams)), lc.desc
            for lane in range(G):
                for k in range(items):
                    ps = params_of(lane, k, s)
                    assert ps is None or ps == tuple((lane + k * G) * vec + j for j in range(vec))
    if p.flags & N.FLAG_PLANE:
        q = I // vec
        for s in range(min(p.sets, 3)):
            for lane in range(G):
                base = params_of(lane, 0, s)
                for k in range(items):
                    assert params_of(lane, k, s) in (None, base), lc.desc
                w = min(G, 32)
                m = q
                while m < w:
                    other = params_of(lane ^ m, 0, s)
                    assert other is None or base is None or other == base, lc.desc
                    m <<= 1
    staged = "staged" in lc.expr
    items_bytes = 2 * 2 * items * lc.block[0] * 16 if staged else 0  # the two cp.async stages of x and dy
    if "bwd_ring" in lc.expr:  # its ring: DEPTH stages of x and dy
        items_bytes = int(lc.expr.split(",")[3].rstrip(">")) * 2 * (items * 16 + 4) * lc.block[0]
    if not p.flags & N.FLAG_PREG:
        assert lc.smem == -(-8 * p.nparams // 16) * 16 * staged + 8 * p.nparams * (not staged) + items_bytes
    else:
        assert lc.smem == items_bytes
    assert lc.smem <= N.SMEM_BLOCK_MAX
    assert pl.workspace >= 8 * p.nparams


def test_params_struct_fits_a_kernel_argument():
    assert ctypes.sizeof(N.NormParams) <= 4096


def _one_pass_f32(x, items, vec, G):
    """fwd_rows' ONE statistics of one row in float32, in the kernel's order: c = x[0]; thread t sums its
    vectors t + k * G (k = 0..items-1) element by element (d, d * d by fma: float64 product rounded once),
    then the xor butterfly over min(G, 32) lanes, then the warps' sums in order."""
    f = np.float32
    n = x.size
    c = f(x[0])
    S, Q = np.zeros(G, f), np.zeros(G, f)
    for t in range(G):
        for k in range(items):
            vi = t + k * G
            if vi * vec >= n:
                continue
            for j in range(vec):
                d = f(f(x[vi * vec + j]) - c)
                S[t] = f(S[t] + d)
                Q[t] = f(np.float64(d) * d + np.float64(Q[t]))
    w = min(G, 32)
    m = w >> 1
    while m:
        idx = np.arange(G) ^ m
        idx = (np.arange(G) & ~(w - 1)) | (idx & (w - 1))
        S, Q = (S + S[idx]).astype(f), (Q + Q[idx]).astype(f)
        m >>= 1
    s, q = S[0], Q[0]
    for wi in range(1, G // 32):
        s, q = f(s + S[32 * wi]), f(q + Q[32 * wi])
    inv_len = f(1.0) / f(n)
    ms = f(s * inv_len)
    return f(c + ms), max(f(np.float64(-ms) * ms + np.float64(f(q * inv_len))), f(0))


@pytest.mark.parametrize("dtype", [BF16, F16])
@pytest.mark.parametrize("center", [(0.0, 1.0), (1000.0, 1.0), (1000.0, 16.0), (-50.0, 0.25), (3.0, 1e-3)])
def test_one_pass_statistics_error_bound(dtype, center):
    """The bound stated at fwd_rows' ONE in ptx/normalization.cu, on the float32 emulation of the kernel's
    order of operations, for each 16-bit ROWS_CONFIGS entry with ONE: |var - var64| <= 3 g (var + (x0 -
    mean)^2) + 2^-24 var, and the mean within g (|mean| + std); plus rows whose first element is an
    outlier (the worst case the bound allows)."""
    from pydnn.reference.dtypes import round_to
    rng = np.random.default_rng(7)
    n, vec = 4096, 8
    rows = [rng.normal(center[0], center[1], n) for _ in range(2)]
    outlier = rng.normal(center[0], center[1], n)
    outlier[0] = center[0] + 60 * center[1]
    for cfg in [c for c in N.ROWS_CONFIGS[2] if c[2]] + list(N.FWD_PERSIST_CONFIGS[2]):  # (fwd_persist: same order)
        items = cfg[0]
        G = next(g for g in (1 << i for i in range(11)) if g * items * vec >= n)
        g = (items * vec + int(np.log2(G)) + G // 32) * 2.0 ** -24
        for i, x in enumerate(rows + [outlier]):
            x = round_to(x.astype(np.float32).astype(np.float64), dtype)
            mean, var = _one_pass_f32(x, items, vec, G)
            m64, v64 = x.mean(), x.var()
            assert abs(var - v64) <= 3 * g * (v64 + (x[0] - m64) ** 2) + 2.0 ** -24 * v64, (cfg, var, v64)
            assert abs(mean - m64) <= g * (abs(m64) + np.sqrt(v64)) + 2.0 ** -24 * abs(m64), (cfg, mean, m64)
            if center == (1000.0, 1.0) and i < len(rows):
                assert var == np.float32(v64) or abs(var - v64) <= 2.0 ** -23 * v64  # exact sums, one rounding


def test_stream_flag_and_finish_block(monkeypatch):
    """v7 options: STREAM sets PYDNN_NORM_FLAG_STREAM only on the named kernels' launches, WARPSTAT only on
    bwd_ring's; finish's block is FINISH = (FX, FY), one block per FX parameters, every shape compiled."""
    h = cpu_handle()
    ln = _desc((1000, 4096), BF16)
    gn = _desc((2, 512, 8, 8), BF16, packed_strides((2, 512, 8, 8), NHWC))
    for stream in (set(), {"fwd_persist"}, {"fwd_rows"}, {"bwd_ring"}, {"gn_fwd"}, {"fwd_rows", "bwd_ring"}):
        monkeypatch.setattr(tuning.norm, "STREAM", stream)
        for persist in (True, False):
            monkeypatch.setattr(tuning.norm, "FWD_PERSIST", persist)
            for nd, x, backward in ((_nd(LAYER), ln, False), (_nd(LAYER), ln, True), (_nd(GROUP, 32), gn, False)):
                pl = N._plan(h, nd, x, x, x if backward else None, _params(x, nd)[1], backward)
                for lc in pl.alternatives[0]:
                    kname = lc.expr.split("<")[0].rsplit("::", 1)[-1].replace("bwd_ring_cl", "bwd_ring")  # (v9)
                    assert bool(lc.params.flags & N.FLAG_STREAM) == (kname in stream), (stream, lc.desc)
                    assert bool(lc.params.flags & N.FLAG_WARPSTAT) == (kname == "bwd_ring"), lc.desc  # (G 256)
    short = _desc((37, 48), BF16, (56, 1))  # G = 4: several rows per warp, so no WARPSTAT
    pl = N._plan(h, _nd(LAYER), short, short, short, _params(short, _nd(LAYER))[1], True)
    assert pl.alternatives[0][0].expr.startswith("pydnn::norm::bwd_ring") and pl.alternatives[0][0].params.group == 4
    assert not pl.alternatives[0][0].params.flags & N.FLAG_WARPSTAT
    monkeypatch.setattr(tuning.norm, "BWD_RING_WARPSTAT", False)
    pl = N._plan(h, _nd(LAYER), ln, ln, ln, _params(ln, _nd(LAYER))[1], True)
    assert pl.alternatives[0][0].expr.startswith("pydnn::norm::bwd_ring")
    assert not pl.alternatives[0][0].params.flags & N.FLAG_WARPSTAT
    for fx, fy in N.FINISH_SHAPES:
        monkeypatch.setattr(tuning.norm, "FINISH", (fx, fy))
        pl = N._plan(h, _nd(LAYER), ln, ln, ln, _params(ln, _nd(LAYER))[1], True)
        fin = pl.alternatives[0][-1]
        assert fin.expr == f"pydnn::norm::finish<{fx}, {fy}>" and fin.block == (fx, fy, 1)
        assert fin.grid == (4096 // fx, 1, 1) and fin.expr in N._unit_exprs("bf16")


def test_l2_prefetch_distance(monkeypatch):
    """v12 (NormParams.pf): fwd_rows / gn_reg prefetch x PF_BYTES ahead, as a distance in blocks of the bytes one
    block reads (at least 1), none when the grid has no block that far ahead or PF_BYTES is 0."""
    ln = _desc((16384, 4096), BF16)
    gn = _desc((32, 512, 64, 64), BF16, packed_strides((32, 512, 64, 64), NHWC))
    gn_sm = _desc((2, 512, 64, 64), BF16, packed_strides((2, 512, 64, 64), NHWC))  # 128 blocks of 64 KiB

    def launch(nd, x):
        return N._plan(cpu_handle(), nd, x, x, None, _params(x, nd)[1], False).alternatives[0][0]

    for nbytes, rows_pf, gn_pf, gn_sm_pf, short_pf in ((8 << 20, 1024, 128, 0, 0), (4 << 20, 512, 64, 64, 0),
                                                       (1, 1, 1, 1, 1), (20000, 2, 1, 1, 2), (0, 0, 0, 0, 0)):
        monkeypatch.setattr(tuning.norm, "PF_BYTES", {"fwd_rows": nbytes, "gn_reg": nbytes})
        assert launch(_nd(LAYER), ln).params.pf == rows_pf, nbytes
        assert launch(_nd(RMS), _desc((16384, 4096), F32)).params.pf == (rows_pf + 1) // 2, nbytes
        assert launch(_nd(GROUP, 32), gn).params.pf == gn_pf, nbytes
        assert launch(_nd(GROUP, 32), gn_sm).params.pf == gn_sm_pf, nbytes
        assert launch(_nd(LAYER), _desc((3, 4096), BF16)).params.pf == short_pf, nbytes  # (3 blocks)


@pytest.mark.parametrize("dims,strides,dtype", [((300, 37), None, BF16), ((41, 1001), None, F32),
                                                ((70, 100), (103, 1), BF16), ((9, 4231), None, F16),
                                                ((5, 12345), None, F32), ((3, 40275), None, F32),
                                                ((2, 30693), None, F16), ((1, 64254), None, BF16)])
def test_rowx_walks_with_few_sms(dims, strides, dtype, monkeypatch):
    """fwd_rowx / bwd_rowx on a 1-SM handle (bwd_rowx's groups then walk many rows of their class): every
    element once, at its row's address, with its parameter (the emulations above). (XSPLIT off: its split
    kernels would take the rows of a cluster per row, as many as the one SM; test_normalization_xsplit_cpu.py)"""
    monkeypatch.setattr(tuning.norm, "XSPLIT", False)
    h = cpu_handle()
    h.sm_count = 1
    nd = _nd(RMS if dims[1] % 2 else LAYER)
    x = _desc(dims, dtype, strides) if strides else _desc(dims, dtype)
    for backward in (False, True):
        pl = N._plan(h, nd, x, x, x if backward else None, _params(x, nd)[1], backward)
        lc = pl.alternatives[0][0]
        assert "bwd_rowx" in lc.expr if backward else "fwd_rowx" in lc.expr, lc.desc
        if backward:  # one block (cluster) per alignment class: its groups walk every row
            assert lc.grid[0] == lc.params.pf * (int(lc.expr.split(",")[3].rstrip(">")) if "_cl<" in lc.expr else 1)
        for operand in ((0, 1, 2) if backward else (0, 1)):
            emu = _emulate_bwd_rowx(lc.params, lc, operand, pl) if backward else _emulate_rowx(lc.params, lc, operand)
            addr, sset, spar, _ = emu
            st = strides[0] if strides else dims[1]
            want_addr = (np.arange(dims[0])[:, None] * st + np.arange(dims[1])[None, :]).ravel()
            assert sorted(addr.tolist()) == sorted(want_addr.tolist())
            assert ((addr - sset * st) == spar).all()


@pytest.mark.parametrize("cap", [256, 512])
def test_rowx_backward_cluster_block_cap(cap, monkeypatch):
    """ROWX_BWD_CL_BLOCK: bwd_rowx_cl's blocks at most `cap` threads when a cluster of 2 / 4 / 8 so holds the
    row, else up to 512; every element once (the emulation)."""
    monkeypatch.setattr(tuning.norm, "ROWX_BWD_CL_BLOCK", cap)
    h = cpu_handle()
    for dims, dtype in (((3, 34823), F16), ((2, 12345), F32), ((1, 64254), F32)):
        x = _desc(dims, dtype)
        nd = _nd(LAYER)
        pl = N._plan(h, nd, x, x, x, _params(x, nd)[1], True)
        lc = pl.alternatives[0][0]
        assert "bwd_rowx_cl<" in lc.expr, lc.desc
        vec = 8 if dtype == F16 else 4
        nsv = -(-(dims[1] + vec - 1) // vec)
        fits = [c for c in N.ROWX_BWD_CL if -(-nsv // (N.ROWX_BWD_ITEMS * c)) <= cap]
        want = fits[0] if fits else next(c for c in N.ROWX_BWD_CL if -(-nsv // (N.ROWX_BWD_ITEMS * c)) <= 512)
        assert f" cl={want}" in lc.desc and lc.block[0] <= (cap if fits else 512), lc.desc
        for operand in (0, 1, 2):
            addr, sset, spar, _ = _emulate_bwd_rowx(lc.params, lc, operand, pl)
            assert sorted(addr.tolist()) == list(range(dims[0] * dims[1]))


def test_gs_choice(monkeypatch):
    """The split kernels (gs_*) for group / instance norm where the tile kernels did not serve (the sweep's
    slowest shapes), their launch shapes and workspace; not for small sets, activations, other layouts; a
    float forward only with tuning.norm.GS_FWD_F32 (on by default)."""
    h = cpu_handle()
    f32 = _desc((14, 23, 151, 151), F32)
    assert tuning.norm.GS_FWD_F32
    assert N.plan_summary(h, _nd(GROUP, 1), f32)[0][0] == ["gsp_fwd vec=4 cl=8 block=512 sets=14"]
    assert N.plan_summary(h, _nd(GROUP, 1), f32, backward=True)[0][0][0].startswith("gsp_bpart")
    f32c = _desc((73, 42, 156, 156), F32, packed_strides((73, 42, 156, 156), NHWC))
    # float, C = 42 (no 4-element channel vectors): gsf_fwd's super-rows of lcm(42, 4) = 84 elements (2 rows);
    # GS_FLAT off: gsc_fwd with 2-element vectors, as 16-bit takes
    assert N.plan_summary(h, _nd(INSTANCE), f32c)[0][0] == ["gsf_fwd vec=4 cl=8 block=512 P=84 units=73"]
    monkeypatch.setattr(tuning.norm, "GS_FLAT", False)
    assert N.plan_summary(h, _nd(INSTANCE), f32c)[0][0] == ["gsc_fwd vec=2 cl=8 block=512 W=42 units=73"]
    monkeypatch.setattr(tuning.norm, "GS_FLAT", True)
    monkeypatch.setattr(tuning.norm, "GS_FWD_F32", False)
    assert not N.plan_summary(h, _nd(GROUP, 1), f32)[0][0][0].startswith("gs")
    monkeypatch.setattr(tuning.norm, "GS_FWD_F32", True)
    nchw = _desc((14, 23, 151, 151), F16)
    alts, ws = N.plan_summary(h, _nd(GROUP, 1), nchw)
    assert alts[0] == ["gsp_fwd vec=8 cl=8 block=512 sets=14"] and ws == 0  # 14 sets: clusters of 8
    assert alts[-1] == ["gen"]  # unaligned pointers
    alts, ws = N.plan_summary(h, _nd(GROUP, 1), nchw, backward=True)
    # 322 planes of 22801 elements: 12 chunks each (a warp per chunk), partials + totals + table + 16 B
    assert alts[0] == ["gsp_bpart vec=8 K=12 chunk=1904", "gs_bred", "gs_bset", "gs_bapply vec=8"]
    U, NC = 14 * 23 * 12, 14 * 23
    assert ws >= 4 * (2 * U + 2 * NC + 4 * NC) + 16
    nhwc = _desc((73, 42, 156, 156), F16, packed_strides((73, 42, 156, 156), NHWC))
    alts, _ = N.plan_summary(h, _nd(INSTANCE), nhwc)
    assert alts[0] == ["gsc_fwd vec=2 cl=8 block=512 W=42 units=73"]  # C 42: 2-element channel vectors
    alts, _ = N.plan_summary(h, _nd(INSTANCE), nhwc, backward=True)
    assert alts[0][0].startswith("gsc_bpart vec=2 ") and alts[0][3] == "gs_bapply vec=8"
    many = _desc((6, 688, 158, 158), F16)
    assert N.plan_summary(h, _nd(INSTANCE), many)[0][0] == ["gsp_fwd vec=8 cl=1 block=512 sets=4128"]
    # not: small sets, a fused activation, a layout that is neither packed NCHW nor packed NHWC
    assert not N.plan_summary(h, _nd(INSTANCE), _desc((9, 10, 4, 4), F32))[0][0][0].startswith("gs")
    relu = _nd(GROUP, 1, act=_act(pydnn.PYDNN_ACTIVATION_RELU))
    assert not N.plan_summary(h, relu, nchw)[0][0][0].startswith("gs")
    padded = _desc((2, 8, 40, 40), F32, (8 * 40 * 41, 40 * 41, 41, 1))
    assert not N.plan_summary(h, _nd(GROUP, 2), padded)[0][0][0].startswith("gs")
    # the NHWC tile kernels keep their shapes (x read once)
    gn = _desc((32, 512, 64, 64), BF16, packed_strides((32, 512, 64, 64), NHWC))
    assert N.plan_summary(h, _nd(GROUP, 32), gn)[0][0][0].startswith("gn_reg")
    # before sm_90: one block per unit (no clusters)
    h.arch = "sm_80"
    assert N.plan_summary(h, _nd(GROUP, 1), nchw)[0][0] == ["gsp_fwd vec=8 cl=1 block=512 sets=14"]


def test_gs_math_matches_the_reference():
    """The split kernels' algebra in float64 (ptx/normalization_gs.cu): forward from shifted sums (K = the set's
    first element), y = (x - mean) a + bias; backward from per-(n, c) A = sum dy, B = invstd sum
    dy (x - mean), c1 = sum scale A / len, c2 = sum scale B / len, dx = k1 dy - q (x - mean) - r with k1 =
    invstd scale, q = invstd^2 c2, r = invstd c1, dscale = sum_n B, dbias = sum_n A."""
    from pydnn.reference import normalization as ref
    rng = np.random.default_rng(5)
    N_, C, H, W, G = 3, 12, 5, 7, 4
    cg, S = C // G, H * W
    x = rng.normal(3.0, 2.0, (N_, C, H, W))
    dy = rng.normal(0.0, 1.0, (N_, C, H, W))
    scale, bias = rng.uniform(0.5, 1.5, (1, C, 1, 1)), rng.uniform(-1, 1, (1, C, 1, 1))
    eps = 1e-5
    xs = x.reshape(N_, G, cg * S)
    K = xs[:, :, :1]
    d = xs - K
    s1, s2 = d.sum(axis=2), (d * d).sum(axis=2)
    m1 = s1 / (cg * S)
    var = s2 / (cg * S) - m1 * m1
    mean, inv = K[:, :, 0] + m1, 1.0 / np.sqrt(var + eps)
    a = inv[:, :, None] * scale.reshape(G, cg)[None]                       # (N, G, cg)
    xm = (xs - mean[:, :, None]).reshape(N_, G, cg, S)
    y = (xm * a[..., None] + bias.reshape(G, cg)[None, :, :, None]).reshape(x.shape)
    wy, wm, wi = ref.forward(GROUP, G, 1, eps, None, 1.0, x, 0.0, None, scale, bias)
    assert np.allclose(y, wy, atol=1e-12) and np.allclose(mean.ravel(), wm) and np.allclose(inv.ravel(), wi)
    mg, ig = np.repeat(mean, cg, axis=1), np.repeat(inv, cg, axis=1)        # (N, C)
    xc, dc = x.reshape(N_, C, S), dy.reshape(N_, C, S)
    A = dc.sum(axis=2)
    B = ig * (dc * (xc - mg[..., None])).sum(axis=2)
    sc = scale.reshape(C)
    c1 = (sc * A).reshape(N_, G, cg).sum(axis=2) / (cg * S)
    c2 = (sc * B).reshape(N_, G, cg).sum(axis=2) / (cg * S)
    k1, q, r = ig * sc, ig * ig * np.repeat(c2, cg, axis=1), ig * np.repeat(c1, cg, axis=1)
    dx = k1[..., None] * dc - q[..., None] * (xc - mg[..., None]) - r[..., None]
    wdx, wds, wdb = ref.backward(GROUP, G, 1, eps, None, x, dy, scale, bias, mean.ravel(), inv.ravel())
    assert np.allclose(dx.reshape(x.shape), wdx, atol=1e-12)
    assert np.allclose(B.sum(axis=0), np.ravel(wds)) and np.allclose(A.sum(axis=0), np.ravel(wdb))


def _gs_run_numpy(lc, p, xf, dyf, scale, bias, mean, inv, ws, backward):
    """The split kernels' index math line by line in float64 on flat packed arrays (one Python thread loop per
    CUDA thread, shared memory as arrays): y / dx as the kernel writes it, the statistics it writes, and the
    workspace it fills."""
    kname = lc.expr.split("<")[0].rsplit("::", 1)[-1]
    vec = int(lc.expr.split(",")[1].strip().rstrip(">")) if "<" in lc.expr else 1
    Nn, C, S, G = (int(p.set_size[i]) for i in range(4))
    cg = C // G
    nhwc = bool(p.flags & N.GS_FLAG_NHWC)
    cl = 8 if kname.endswith("_cl") else 1
    B = lc.block[0]
    ss0, ss1 = int(p.set_stride[3][0]), int(p.set_stride[3][1])
    out = {}
    x0 = "<float," in lc.expr  # float data: the mean from the unshifted sum of x (gs_stats in the .cu)
    if kname.startswith("gsp_fwd"):
        L = cg * S
        y = np.full(xf.shape, np.nan)
        for s in range(Nn * G):
            n, g = divmod(s, G)
            base = s * L
            K = xf[base]
            d = xf[base:base + L] - K
            m1 = d.sum() / L
            var = max((d * d).sum() / L - m1 * m1, 0.0)
            mu, iv = (xf[base:base + L].sum() / L if x0 else K + m1), 1 / np.sqrt(var + p.eps)
            mean[n * ss0 + g * ss1], inv[n * ss0 + g * ss1] = mu, iv
            i = np.arange(L)
            q = i % cg if nhwc else i // S
            a = iv * scale[g * cg + q]
            y[base:base + L] = (xf[base:base + L] - mu) * a + bias[g * cg + q]
        out["y"] = y
    elif kname.startswith("gsf_fwd"):  # super-rows of P elements, position j of one is channel j % C
        P = int(p.el_size[0])
        ncv, KR = P // vec, P // C
        R = B // ncv
        y = np.full(xf.shape, np.nan)
        for n in range(Nn):
            xb = n * S * C
            # the kernel's sums: per position over its super-rows (ranks x R rows), then per group over its
            # channels' KR positions
            red = np.zeros((3, P))
            for j in range(P):
                ch = j % C
                K = xf[xb + (ch // cg) * cg]
                vals = xf[xb + np.arange(S // KR) * P + j]
                red[:, j] = ((vals - K).sum(), ((vals - K) ** 2).sum(), vals.sum())
            for q in range(G):
                js = [j for j in range(P) if (j % C) // cg == q]
                s1, s2, s0 = red[:, js].sum(axis=1)
                L = cg * S
                m1 = s1 / L
                var = max(s2 / L - m1 * m1, 0.0)
                mu, iv = (s0 / L if x0 else xf[xb + q * cg] + m1), 1 / np.sqrt(var + p.eps)
                mean[n * ss0 + q * ss1], inv[n * ss0 + q * ss1] = mu, iv
                for c in range(q * cg, (q + 1) * cg):
                    rows = np.arange(S)
                    y[xb + rows * C + c] = (xf[xb + rows * C + c] - mu) * (iv * scale[c]) + bias[c]
        out["y"] = y
    elif kname.startswith("gsc_fwd"):
        W = int(p.el_size[0])
        NS, ncv = C // W, W // vec
        R = B // ncv
        ngs = W // cg
        y = np.full(xf.shape, np.nan)
        for u in range(Nn * NS):
            n, w0 = divmod(u, NS)
            w0 *= W
            xb = n * S * C + w0
            gk = np.array([xf[xb + q * cg] for q in range(ngs)])
            red = np.zeros((3, cl, R, ncv * vec))
            for rank in range(cl):
                for t in range(B):
                    cv, rr = t % ncv, t // ncv
                    if rr >= R:
                        continue
                    for e in range(vec):
                        c = cv * vec + e
                        K = xf[xb + (c // cg) * cg]
                        rows = np.arange(rank * R + rr, S, R * cl)
                        dd = xf[xb + rows * C + c] - K
                        red[0, rank, rr, c] = dd.sum()
                        red[1, rank, rr, c] = (dd * dd).sum()
                        red[2, rank, rr, c] = xf[xb + rows * C + c].sum()
            grp = np.zeros((3, ngs))
            for q in range(ngs):
                grp[:, q] = red[:, :, :, q * cg:(q + 1) * cg].sum(axis=(1, 2, 3))
            for c in range(W):
                q = c // cg
                m1 = grp[0, q] / (cg * S)
                var = max(grp[1, q] / (cg * S) - m1 * m1, 0.0)
                mu, iv = (grp[2, q] / (cg * S) if x0 else gk[q] + m1), 1 / np.sqrt(var + p.eps)
                if c == q * cg:
                    mean[n * ss0 + (w0 // cg + q) * ss1], inv[n * ss0 + (w0 // cg + q) * ss1] = mu, iv
                a = iv * scale[w0 + c]
                rows = np.arange(S)
                y[xb + rows * C + c] = (xf[xb + rows * C + c] - mu) * a + bias[w0 + c]
        out["y"] = y
    elif kname in ("gsp_bpart", "gsc_bpart"):
        K, CH = int(p.el_size[1]), int(p.el_size[3])
        U = Nn * C * K
        for n in range(Nn):
            for c in range(C):
                g = c // cg
                mu, iv = mean[n * ss0 + g * ss1], inv[n * ss0 + g * ss1]
                for k in range(K):
                    if kname == "gsp_bpart":
                        pl = n * C + c
                        lo, hi = pl * S + k * CH, min(pl * S + k * CH + CH, (pl + 1) * S)
                        idx = np.arange(lo, hi)
                        unit = pl * K + k
                    else:
                        rows = np.arange(k * CH, min(k * CH + CH, S))
                        idx = n * S * C + rows * C + c
                        unit = (n * K + k) * C + c
                    ws[unit] = dyf[idx].sum()
                    ws[U + unit] = iv * (dyf[idx] * (xf[idx] - mu)).sum()
    elif kname == "gs_bred":
        K = int(p.el_size[1])
        U, NC = Nn * C * K, Nn * C
        for t in range(NC):
            n, c = divmod(t, C)
            ii = [(n * K + k) * C + c if nhwc else t * K + k for k in range(K)]
            ws[2 * U + t] = sum(ws[i] for i in ii)
            ws[2 * U + NC + t] = sum(ws[U + i] for i in ii)
    elif kname == "gs_bset":
        K = int(p.el_size[1])
        U, NC = Nn * C * K, Nn * C
        tab0 = -(-int(p.el_size[4]) // 4) * 4  # (the kernel aligns the address; ws here starts aligned)
        tot = ws[2 * U:2 * U + 2 * NC]
        for s in range(Nn * G):
            n, g = divmod(s, G)
            cs = np.arange(g * cg, g * cg + cg)
            a = (scale[cs] * tot[n * C + cs]).sum()
            b = (scale[cs] * tot[NC + n * C + cs]).sum()
            mu, iv = mean[n * ss0 + g * ss1], inv[n * ss0 + g * ss1]
            c1, c2 = a / (cg * S), b / (cg * S)
            for c in cs:
                ws[tab0 + 4 * (n * C + c):tab0 + 4 * (n * C + c) + 4] = (iv * scale[c], mu, iv * iv * c2, iv * c1)
        out["dscale"] = tot[NC:].reshape(Nn, C).sum(axis=0)
        out["dbias"] = tot[:NC].reshape(Nn, C).sum(axis=0)
    elif kname == "gs_bapply":
        tab0 = -(-int(p.el_size[4]) // 4) * 4
        i = np.arange(xf.size)
        row = (i // (S * C)) * C + i % C if nhwc else i // S
        t = ws[tab0:tab0 + 4 * Nn * C].reshape(-1, 4)[row]
        out["dx"] = t[:, 0] * dyf - t[:, 2] * (xf - t[:, 1]) - t[:, 3]
    else:
        raise AssertionError(kname)
    return out


@pytest.mark.parametrize("case", [(GROUP, 2, (3, 8, 5, 7), None), (INSTANCE, 0, (2, 6, 9, 5), None),
                                  (GROUP, 1, (2, 5, 6, 7), "nhwc"), (GROUP, 2, (2, 12, 5, 7), "nhwc"),
                                  (INSTANCE, 0, (3, 6, 4, 9), "nhwc"), (GROUP, 4, (2, 16, 3, 3), "nhwc"),
                                  (INSTANCE, 0, (2, 7, 4, 4), "nhwc"), (GROUP, 3, (2, 9, 2, 6), "nhwc")])
@pytest.mark.parametrize("cl1", [False, True])
def test_gs_kernels_emulated_match_the_reference(case, cl1, monkeypatch):
    """Every gs launch of the plan replayed in float64 with the kernels' own index math (_gs_run_numpy): y, the
    statistics, dx, dscale and dbias equal the reference's."""
    from pydnn.reference import normalization as ref
    monkeypatch.setattr(tuning.norm, "GS_MIN_BYTES", 1)
    monkeypatch.setattr(tuning.norm, "GS_FWD_F32", True)
    for name in ("GN_FWD", "GN_BWD", "GN_REG"):
        monkeypatch.setattr(tuning.norm, name, False)
    if cl1:
        monkeypatch.setattr(N, "GS_CLUSTER_UNITS_PER_SM", 0)
    kind, groups, dims, layout = case
    rng = np.random.default_rng(7)
    nd = _nd(kind, groups)
    xd = _layout_desc(dims, layout, F32)
    sb, st = _params(xd, nd)
    G = dims[1] if kind == INSTANCE else groups
    x = rng.normal(2.0, 1.5, dims)
    dy = rng.normal(0.0, 1.0, dims)
    scale, bias = rng.uniform(0.5, 1.5, dims[1]), rng.uniform(-1, 1, dims[1])
    perm = (0, 2, 3, 1) if layout == "nhwc" else (0, 1, 2, 3)
    xf, dyf = x.transpose(perm).ravel(), dy.transpose(perm).ravel()

    def unflat(a):
        shape = tuple(dims[i] for i in perm)
        return a.reshape(shape).transpose(np.argsort(perm))

    h = cpu_handle()
    pl = N._plan(h, nd, xd, xd, None, st, False)
    lc = pl.alternatives[0][0]
    assert len(pl.alternatives[0]) == 1 and lc.desc.startswith(("gsp_fwd", "gsc_fwd", "gsf_fwd"))
    assert (" cl=1 " in lc.desc) == cl1, lc.desc
    mean, inv = np.full(dims[0] * G, np.nan), np.full(dims[0] * G, np.nan)
    y = _gs_run_numpy(lc, lc.params, xf, None, scale, bias, mean, inv, None, False)["y"]
    sc4, bi4 = scale.reshape(1, -1, 1, 1), bias.reshape(1, -1, 1, 1)
    wy, wm, wi = ref.forward(kind, groups, 1, 1e-5, None, 1.0, x, 0.0, None, sc4, bi4)
    assert np.allclose(unflat(y), wy, atol=1e-10) and np.allclose(mean, wm) and np.allclose(inv, wi)
    pl = N._plan(h, nd, xd, xd, xd, st, True)
    assert [lc.desc.split()[0] for lc in pl.alternatives[0]][1:] == ["gs_bred", "gs_bset", "gs_bapply"]
    ws = np.full(pl.workspace // 4, np.nan)
    outs = {}
    for lc in pl.alternatives[0]:
        outs.update(_gs_run_numpy(lc, lc.params, xf, dyf, scale, bias, wm, wi, ws, True))
    wdx, wds, wdb = ref.backward(kind, groups, 1, 1e-5, None, x, dy, sc4, bi4, wm, wi)
    assert np.allclose(unflat(outs["dx"]), wdx, atol=1e-10)
    assert np.allclose(outs["dscale"], np.ravel(wds)) and np.allclose(outs["dbias"], np.ravel(wdb))


@pytest.mark.parametrize("long_rows", [False, True])
@pytest.mark.parametrize("dims,dtype", [((1, 56616), F32), ((2, 40000), F32), ((33, 8552), F32), ((5, 32768), BF16),
                                        ((3, 56616), F16), ((200, 8192), F32), ((5315, 6144), F32),
                                        ((200, 8192), BF16)])
def test_rowx_backward_whole_vector_rows(dims, dtype, long_rows, monkeypatch):
    """Whole-vector rows on bwd_rowx (period 1, no edge vectors): the rows no whole-vector backward kernel
    serves (gen before) always; with ROWX_BWD_LONG the 8-block cluster kernel's float rows that one bwd_rowx
    block holds when they are at least the SMs (not 33 x 8552: fewer rows, and a cluster of bwd_rowx blocks);
    every element once at its row's address with its parameter (the emulation), the workspace query the
    plan's."""
    monkeypatch.setattr(tuning.norm, "ROWX_BWD_LONG", long_rows)
    monkeypatch.setattr(tuning.norm, "BWD_SPLIT", False)  # (the cluster kernel's rows: the split backward's tests)
    h = cpu_handle()
    nd = _nd(RMS if dims[0] % 2 else LAYER)
    x = _desc(dims, dtype)
    pl = N._plan(h, nd, x, x, x, _params(x, nd)[1], True)
    lc = pl.alternatives[0][0]
    assert "gen" not in lc.expr
    moved = long_rows and dtype == F32 and dims[0] >= h.sm_count and dims[1] <= 8192
    if not ("bwd_rowx" in lc.expr):
        assert not moved and "cluster=8" in lc.desc, lc.desc
        return
    assert moved or dims[1] > 32768 or "cluster" not in lc.desc, lc.desc
    assert lc.params.pf == 1, lc.desc  # (period 1: whole vectors from a 16-byte boundary)
    for operand in (0, 1, 2):
        addr, sset, spar, _ = _emulate_bwd_rowx(lc.params, lc, operand, pl)
        want = (np.arange(dims[0])[:, None] * dims[1] + np.arange(dims[1])[None, :]).ravel()
        assert sorted(addr.tolist()) == want.tolist()
        assert ((addr - sset * dims[1]) == spar).all()
    assert pydnn.get_norm_backward_workspace_size(h, nd, x, x, x, *_params(x, nd)) == pl.workspace


@pytest.mark.parametrize("k", [1, 4, 8])
@pytest.mark.parametrize("dims,dtype", [((417, 2770), BF16), ((21, 1439), F32), ((300, 37), F16)])
def test_rowx_backward_rows_per_group(dims, dtype, k, monkeypatch):
    """ROWX_BWD_ROWS: bwd_rowx's grid with each group walking at least k rows of its class (fewer finish
    slots); every element once at its row's address with its parameter, the workspace query the plan's."""
    monkeypatch.setattr(tuning.norm, "ROWX_BWD_ROWS", k)
    h = cpu_handle()
    nd = _nd(LAYER)
    x = _desc(dims, dtype)
    pl = N._plan(h, nd, x, x, x, _params(x, nd)[1], True)
    lc = pl.alternatives[0][0]
    assert "bwd_rowx" in lc.expr, lc.desc
    period, spb = lc.params.pf, lc.block[0] // lc.params.group
    assert lc.grid[0] <= period * max(1, -(-(-(-dims[0] // period)) // (spb * k))), lc.desc
    for operand in (0, 1, 2):
        addr, sset, spar, _ = _emulate_bwd_rowx(lc.params, lc, operand, pl)
        want = (np.arange(dims[0])[:, None] * dims[1] + np.arange(dims[1])[None, :]).ravel()
        assert sorted(addr.tolist()) == want.tolist()
        assert ((addr - sset * dims[1]) == spar).all()
    assert pydnn.get_norm_backward_workspace_size(h, nd, x, x, x, *_params(x, nd)) == pl.workspace


@pytest.mark.parametrize("cl1", [False, True])
@pytest.mark.parametrize("kind,groups,dims", [(INSTANCE, 0, (2, 7, 4, 4)), (GROUP, 3, (2, 9, 2, 6)),
                                              (INSTANCE, 0, (3, 42, 6, 5)), (INSTANCE, 0, (2, 495, 4, 4)),
                                              (GROUP, 5, (3, 25, 4, 3))])
def test_gsf_visits_every_element_once(kind, groups, dims, cl1, monkeypatch):
    """gsf_fwd (NHWC float, C without 4-element channel vectors): the super-row walk reads every element of
    x once per pass, at its own address (the emulation of the launch's blocks, threads and super-rows)."""
    monkeypatch.setattr(tuning.norm, "GS_MIN_BYTES", 1)
    for name in ("GN_FWD", "GN_BWD", "GN_REG"):
        monkeypatch.setattr(tuning.norm, name, False)
    if cl1:
        monkeypatch.setattr(N, "GS_CLUSTER_UNITS_PER_SM", 0)
    h = cpu_handle()
    x = _desc(dims, F32, packed_strides(dims, NHWC))
    nd = _nd(kind, groups) if kind == GROUP else _nd(kind)
    pl = N._plan(h, nd, x, x, None, _params(x, nd)[1], False)
    lc = pl.alternatives[0][0]
    assert lc.desc.startswith("gsf_fwd") and (" cl=1 " in lc.desc) == cl1, lc.desc
    addr = _emulate_gs(lc.params, lc, 0)[0]
    assert sorted(np.asarray(addr).tolist()) == list(range(int(np.prod(dims))))
