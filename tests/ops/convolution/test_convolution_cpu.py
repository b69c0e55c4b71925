"""Convolution on the CPU: descriptors and shape queries, every validation error (status + the argument it
names), the float64 reference against a literal loop and against itself (the adjoint identities that tie
forward, backward data and backward filter together), the heuristic algorithm queries, and an emulation
of the implicit-GEMM kernels' index arithmetic from the real parameter structs of the host's plans
(decomposition of m / n / k, channel-innermost reduction order, flipped filters, the gather of backward
data, split-K slices and their fold), checked against the reference on many shapes and layouts."""
import itertools
import re

import numpy as np
import pytest

import pydnn
from pydnn import tuning
from pydnn.ops.convolution import api as CAPI, implicit as CI, plans as CP, problem as CPb, tensor_core as CT
from pydnn.reference import convolution as ref
from pydnn.tensor import packed_strides
from test_fuzz_cpu import _call, cpu_handle

F32, F64, F16, BF16 = (pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DATA_DOUBLE, pydnn.PYDNN_DATA_HALF,
                       pydnn.PYDNN_DATA_BFLOAT16)
BAD, NS = pydnn.PYDNN_STATUS_BAD_PARAM, pydnn.PYDNN_STATUS_NOT_SUPPORTED
NOINIT = pydnn.PYDNN_STATUS_NOT_INITIALIZED
NCHW, NHWC = pydnn.PYDNN_TENSOR_NCHW, pydnn.PYDNN_TENSOR_NHWC
CONV, XCORR = pydnn.PYDNN_CONVOLUTION, pydnn.PYDNN_CROSS_CORRELATION
FWD_IG = pydnn.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM
BWD_D0 = pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_0
BWD_F0, BWD_F1 = pydnn.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_0, pydnn.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_1
X, W, Y, WS = 1 << 40, 1 << 41, 1 << 42, 1 << 43


def _check(fn, args, status, needle):
    st = _call(fn, *args)
    msg = pydnn.get_last_error_string()
    assert st == status, (st, msg)
    assert needle in msg, msg


def tdesc(dims, dtype=F32, fmt=NCHW, strides=None):
    d = pydnn.create_tensor_descriptor()
    pydnn.set_tensor_nd_descriptor(d, dtype, len(dims), dims, strides or packed_strides(tuple(dims), fmt))
    return d


def fdesc(dims, dtype=F32, fmt=NCHW):
    d = pydnn.create_filter_descriptor()
    pydnn.set_filter_nd_descriptor(d, dtype, fmt, len(dims), dims)
    return d


def cdesc(pad, stride, dil, mode=XCORR, ctype=F32, groups=1):
    c = pydnn.create_convolution_descriptor()
    pydnn.set_convolution_nd_descriptor(c, len(pad), pad, stride, dil, mode, ctype)
    pydnn.set_convolution_group_count(c, groups)
    return c


# ----------------------------------------------------------------------------- descriptors

def test_descriptor_round_trips():
    c = pydnn.create_convolution_descriptor()
    pydnn.set_convolution2d_descriptor(c, 1, 2, 3, 4, 5, 6, CONV, F32)
    assert pydnn.get_convolution2d_descriptor(c) == (1, 2, 3, 4, 5, 6, CONV, F32)
    assert pydnn.get_convolution_nd_descriptor(c, 2) == (2, [1, 2], [3, 4], [5, 6], CONV, F32)
    assert pydnn.get_convolution_nd_descriptor(c, 1) == (2, [1], [3], [5], CONV, F32)
    pydnn.set_convolution_nd_descriptor(c, 3, [0, 1, 2], [1, 2, 3], [2, 1, 1], XCORR, F64)
    assert pydnn.get_convolution_nd_descriptor(c, 3) == (3, [0, 1, 2], [1, 2, 3], [2, 1, 1], XCORR, F64)
    pydnn.set_convolution_nd_descriptor(c, 1, [3], [2], [1], XCORR, F32)
    assert pydnn.get_convolution_nd_descriptor(c, 5) == (1, [3], [2], [1], XCORR, F32)
    assert pydnn.get_convolution_group_count(c) == 1
    pydnn.set_convolution_group_count(c, 4)
    assert pydnn.get_convolution_group_count(c) == 4
    assert pydnn.get_convolution_math_type(c) == pydnn.PYDNN_DEFAULT_MATH
    for m in (pydnn.PYDNN_TENSOR_OP_MATH, pydnn.PYDNN_TENSOR_OP_MATH_ALLOW_CONVERSION, pydnn.PYDNN_FMA_MATH):
        pydnn.set_convolution_math_type(c, m)
        assert pydnn.get_convolution_math_type(c) == m
    pydnn.destroy_convolution_descriptor(c)
    pydnn.destroy_convolution_descriptor(None)
    _check(pydnn.get_convolution_group_count, (c,), BAD, "convDesc: not a live convolution descriptor")


def test_descriptor_errors():
    c = pydnn.create_convolution_descriptor()
    s2 = pydnn.set_convolution2d_descriptor
    _check(pydnn.get_convolution2d_descriptor, (c,), BAD, "convDesc: descriptor was never set")
    _check(s2, (c, -1, 0, 1, 1, 1, 1, CONV, F32), BAD, "pad_h: -1 must not be negative")
    _check(s2, (c, 0, -2, 1, 1, 1, 1, CONV, F32), BAD, "pad_w:")
    _check(s2, (c, 0, 0, 0, 1, 1, 1, CONV, F32), BAD, "u: 0 must be positive")
    _check(s2, (c, 0, 0, 1, -1, 1, 1, CONV, F32), BAD, "v:")
    _check(s2, (c, 0, 0, 1, 1, 0, 1, CONV, F32), BAD, "dilation_h:")
    _check(s2, (c, 0, 0, 1, 1, 1, 0, CONV, F32), BAD, "dilation_w:")
    _check(s2, (c, 0, 0, 1, 1, 1, 1, 2, F32), BAD, "mode: 2 is not a pydnnConvolutionMode_t")
    _check(s2, (c, 0, 0, 1, 1, 1, 1, CONV, 99), BAD, "computeType: 99 is not")
    _check(s2, (c, 0, 0, 1, 1, 1, 1, CONV, pydnn.PYDNN_DATA_INT8), NS, "computeType: compute type")
    _check(s2, (c, 0.5, 0, 1, 1, 1, 1, CONV, F32), BAD, "pad_h: expected an integer")
    _check(s2, (None, 0, 0, 1, 1, 1, 1, CONV, F32), BAD, "convDesc: not a live")
    sn = pydnn.set_convolution_nd_descriptor
    _check(sn, (c, 0, [], [], [], CONV, F32), BAD, "arrayLength: 0 is outside [1, 3]")
    _check(sn, (c, 4, [0] * 4, [1] * 4, [1] * 4, CONV, F32), NS, "arrayLength: 4 is outside")
    _check(sn, (c, 2, [0], [1, 1], [1, 1], CONV, F32), BAD, "padA: has 1 entries, arrayLength is 2")
    _check(sn, (c, 2, [0, 0], [1, 0], [1, 1], CONV, F32), BAD, "filterStrideA[1]: 0 must be positive")
    _check(sn, (c, 2, [0, 0], [1, 1], [1, -1], CONV, F32), BAD, "dilationA[1]:")
    _check(sn, (c, 2, [0, 0], [1, 1], None, CONV, F32), BAD, "dilationA: expected a sequence")
    _check(pydnn.get_convolution_nd_descriptor, (c, 2), BAD, "never set")
    pydnn.set_convolution2d_descriptor(c, 0, 0, 1, 1, 1, 1, CONV, F32)
    _check(pydnn.get_convolution_nd_descriptor, (c, -1), BAD, "arrayLengthRequested: -1 is negative")
    _check(pydnn.set_convolution_group_count, (c, 0), BAD, "groupCount: 0 must be positive")
    _check(pydnn.set_convolution_math_type, (c, 7), BAD, "mathType: 7 is not a pydnnMathType_t")
    pydnn.set_convolution_nd_descriptor(c, 3, [0] * 3, [1] * 3, [1] * 3, CONV, F32)
    _check(pydnn.get_convolution2d_descriptor, (c,), BAD, "convDesc: has 3 spatial dims, not 2")


@pytest.mark.parametrize("xdims,wdims,pad,stride,dil", [
    ((2, 3, 10), (4, 3, 3), (1,), (2,), (1,)),
    ((2, 3, 9, 11), (4, 3, 3, 5), (1, 2), (2, 3), (2, 1)),
    ((1, 2, 5, 6, 7), (3, 2, 2, 3, 1), (0, 1, 2), (1, 2, 3), (2, 1, 1)),
    ((64, 3, 224, 224), (64, 3, 7, 7), (3, 3), (2, 2), (1, 1)),
])
def test_output_dims(xdims, wdims, pad, stride, dil):
    c = cdesc(pad, stride, dil)
    out = pydnn.get_convolution_nd_forward_output_dim(c, tdesc(xdims), fdesc(wdims), len(xdims))
    assert tuple(out) == (xdims[0], wdims[0]) + ref.out_dims(xdims[2:], wdims[2:], pad, stride, dil)
    if len(xdims) == 4:
        assert pydnn.get_convolution2d_forward_output_dim(c, tdesc(xdims), fdesc(wdims)) == tuple(out)
    # the reference agrees on the size of what it computes
    rng = np.random.default_rng(0)
    if np.prod(xdims) < 5000:
        y = ref.forward_raw(rng.standard_normal(xdims), rng.standard_normal(wdims), pad, stride, dil)
        assert y.shape == tuple(out)


def test_output_dim_errors():
    c = cdesc((0, 0), (1, 1), (1, 1), groups=2)
    f = pydnn.get_convolution_nd_forward_output_dim
    _check(f, (c, tdesc((2, 4, 5, 5)), fdesc((6, 2, 3, 3)), 3), BAD, "nbDims: 3 differs from the input's 4 dims")
    _check(f, (c, tdesc((2, 5, 5, 5)), fdesc((6, 2, 3, 3)), 4), BAD,
           "filterDesc: 2 input channels per group x groupCount 2 = 4 differs from the 5 channels of inputTensorDesc")
    _check(f, (c, tdesc((2, 4, 5, 5)), fdesc((5, 2, 3, 3)), 4), BAD,
           "filterDesc: 5 output channels are not a multiple of groupCount 2")
    _check(f, (c, tdesc((2, 4, 5)), fdesc((6, 2, 3, 3)), 4), BAD, "inputTensorDesc: has 3 dims; convDesc has 2")
    _check(f, (c, tdesc((2, 4, 5, 5)), fdesc((6, 2, 3)), 4), BAD, "filterDesc: has 3 dims")
    _check(f, (c, tdesc((2, 4, 2, 5)), fdesc((6, 2, 3, 3)), 4), BAD,
           "convDesc: spatial dim 0: input 2 with padding 0 is smaller than the dilated filter extent 3")
    c2 = cdesc((1, 0), (1, 1), (3, 1))
    _check(f, (c2, tdesc((2, 4, 4, 5)), fdesc((6, 4, 3, 3)), 4), BAD, "input 4 with padding 1 is smaller than the dilated filter extent 7 (filter 3, dilation 3)")
    _check(f, (pydnn.create_convolution_descriptor(), tdesc((2, 4, 5, 5)), fdesc((6, 4, 3, 3)), 4), BAD,
           "convDesc: descriptor was never set")
    _check(pydnn.get_convolution2d_forward_output_dim, (cdesc((0,), (1,), (1,)), tdesc((2, 4, 5)),
                                                         fdesc((6, 4, 3))), BAD, "not 2")


# ----------------------------------------------------------------------------- reference

REF_CASES = [  # xdims, wdims, pad, stride, dil, groups
    ((2, 3, 7), (4, 3, 3), (1,), (2,), (1,), 1),
    ((2, 4, 6, 5), (6, 2, 3, 2), (1, 0), (1, 2), (2, 1), 2),
    ((1, 3, 5, 6), (3, 1, 3, 3), (1, 1), (2, 1), (1, 2), 3),   # depthwise
    ((1, 2, 4, 5, 3), (2, 2, 2, 3, 2), (1, 0, 1), (1, 2, 1), (1, 1, 2), 1),
]


@pytest.mark.parametrize("case", REF_CASES)
@pytest.mark.parametrize("cross", [True, False])
def test_reference_forward_matches_loop(case, cross, rng):
    xd, wd, pad, stride, dil, g = case
    x, w = rng.standard_normal(xd), rng.standard_normal(wd)
    np.testing.assert_allclose(ref.forward_raw(x, w, pad, stride, dil, g, cross),
                               ref.forward_direct(x, w, pad, stride, dil, g, cross), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", REF_CASES)
@pytest.mark.parametrize("cross", [True, False])
def test_reference_adjoints(case, cross, rng):
    """<conv(x, w), dy> = <x, backward_data(w, dy)> = <w, backward_filter(x, dy)>: the three are one
    bilinear form, so the backward references are the forward's true adjoints."""
    xd, wd, pad, stride, dil, g = case
    x, w = rng.standard_normal(xd), rng.standard_normal(wd)
    y = ref.forward_raw(x, w, pad, stride, dil, g, cross)
    dy = rng.standard_normal(y.shape)
    a = (y * dy).sum()
    b = (x * ref.backward_data_raw(w, dy, xd[2:], pad, stride, dil, g, cross)).sum()
    c = (w * ref.backward_filter_raw(x, dy, wd[2:], pad, stride, dil, g, cross)).sum()
    assert abs(a - b) <= 1e-9 * max(1, abs(a)) and abs(a - c) <= 1e-9 * max(1, abs(a))
    db = ref.backward_bias_raw(dy)
    assert db.shape == (1, y.shape[1]) + (1,) * (y.ndim - 2)
    np.testing.assert_allclose(db.ravel(), dy.sum(axis=tuple(i for i in range(y.ndim) if i != 1)))


def test_reference_bias_activation(rng):
    x, w = rng.standard_normal((2, 3, 5, 5)), rng.standard_normal((4, 3, 3, 3))
    y = ref.forward_raw(x, w, (1, 1), (1, 1), (1, 1))
    z, b = rng.standard_normal(y.shape), rng.standard_normal((1, 4, 1, 1))
    r = ref.bias_activation_forward(0.5, x, w, 2.0, z, b, pydnn.PYDNN_ACTIVATION_RELU, 0.0, (1, 1), (1, 1), (1, 1))
    np.testing.assert_allclose(r, np.maximum(0.5 * y + 2.0 * z + b, 0))


# ----------------------------------------------------------------------------- call validation

def _fwd_args(x=None, w=None, c=None, y=None, algo=FWD_IG, ws=0, wsz=0):
    x = x or tdesc((2, 4, 8, 8))
    w = w or fdesc((6, 4, 3, 3))
    c = c or cdesc((1, 1), (1, 1), (1, 1))
    y = y or tdesc((2, 6, 8, 8))
    return (cpu_handle(), 1.0, x, X, w, W, c, algo, ws, wsz, 0.0, y, Y)


def test_forward_validation():
    f = pydnn.convolution_forward
    _check(f, _fwd_args(), NOINIT, "")
    _check(f, _fwd_args(y=tdesc((2, 6, 7, 8))), BAD,
           "yDesc: dims (2, 6, 7, 8) differ from the computed output dims (2, 6, 8, 8)")
    _check(f, _fwd_args(x=tdesc((2, 5, 8, 8))), BAD, "wDesc: 4 input channels per group x groupCount 1 = 4 differs "
                                                     "from the 5 channels of xDesc")
    _check(f, _fwd_args(c=cdesc((1, 1), (1, 1), (1, 1), groups=2)), BAD, "wDesc: 4 input channels per group x "
                                                                         "groupCount 2 = 8")
    _check(f, _fwd_args(c=cdesc((0, 0), (1, 1), (5, 1))), BAD, "the output is empty")
    _check(f, _fwd_args(y=tdesc((2, 6, 8, 8), F16)), NS, "yDesc: data type 2 with xDesc data type 0 is not a supported")
    _check(f, _fwd_args(w=fdesc((6, 4, 3, 3), F64)), NS, "wDesc: data type 1 with xDesc")
    _check(f, _fwd_args(x=tdesc((2, 4, 8, 8), pydnn.PYDNN_DATA_INT8), w=fdesc((6, 4, 3, 3), pydnn.PYDNN_DATA_INT8),
                        y=tdesc((2, 6, 8, 8), pydnn.PYDNN_DATA_INT8)), NS, "xDesc: data type 3 is not supported")
    _check(f, _fwd_args(x=tdesc((2, 4, 8, 8), F64), w=fdesc((6, 4, 3, 3), F64), y=tdesc((2, 6, 8, 8), F64)), NS,
           "convDesc: compute type 0 with data type 1 is not supported")
    _check(f, _fwd_args(c=cdesc((1, 1), (1, 1), (1, 1), ctype=F64)), NS, "convDesc: compute type 1 with data type 0")
    _check(f, _fwd_args(algo=9), BAD, "algo: 9 is not a pydnnConvolutionFwdAlgo_t value")
    _check(f, _fwd_args(algo=pydnn.PYDNN_CONVOLUTION_FWD_ALGO_FFT_TILING), NS,
           "algo: PYDNN_CONVOLUTION_FWD_ALGO_FFT_TILING is not implemented in pydnn yet")
    _check(f, _fwd_args(y=tdesc((2, 6, 8, 8), strides=(384, 64, 8, 0 + 1) if False else (384, 1, 8, 1))), BAD,
           "yDesc: strides")
    _check(f, _fwd_args(c=pydnn.create_convolution_descriptor()), BAD, "convDesc: descriptor was never set")
    _check(f, _fwd_args(w=pydnn.create_filter_descriptor()), BAD, "wDesc: descriptor was never set")
    _check(f, _fwd_args(x="x"), BAD, "xDesc: not a live tensor descriptor")
    a = list(_fwd_args())
    a[3] = 0
    _check(f, tuple(a), pydnn.PYDNN_STATUS_BAD_PARAM_NULL_POINTER, "x:")
    a = list(_fwd_args())
    a[12] = (1 << 42) + 2
    _check(f, tuple(a), pydnn.PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER, "y: 0x40000000002 is not aligned")
    a = list(_fwd_args())
    a[1] = "one"
    _check(f, tuple(a), BAD, "alpha: expected a number")
    a = list(_fwd_args())
    a[9] = -1
    _check(f, tuple(a), BAD, "workSpaceSizeInBytes: -1 is negative")
    _check(f, _fwd_args(x=tdesc((2, 4, 8, 8), F16), w=fdesc((6, 4, 3, 3), F16), y=tdesc((2, 6, 8, 8), F16),
                        c=cdesc((1, 1), (1, 1), (1, 1), ctype=F16)), NOINIT, "")


def test_backward_validation():
    h = cpu_handle()
    c = cdesc((1, 1), (2, 2), (1, 1))
    x, w, dy = tdesc((2, 4, 9, 9)), fdesc((6, 4, 3, 3)), tdesc((2, 6, 5, 5))
    bd, bf = pydnn.convolution_backward_data, pydnn.convolution_backward_filter
    _check(bd, (h, 1.0, w, W, dy, Y, c, BWD_D0, 0, 0, 0.0, x, X), NOINIT, "")
    _check(bd, (h, 1.0, w, W, tdesc((2, 6, 4, 5)), Y, c, BWD_D0, 0, 0, 0.0, x, X), BAD,
           "dyDesc: dims (2, 6, 4, 5) differ from the computed output dims (2, 6, 5, 5)")
    # float, C = 4, stride 2: ALGO_1 is the explicit GEMM + col2im (convolution_gemm.py), which needs its
    # column matrix in the workspace
    _check(bd, (h, 1.0, w, W, dy, Y, c, pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_1, 0, 0, 0.0, x, X), BAD,
           "bytes PYDNN_CONVOLUTION_BWD_DATA_ALGO_1 needs")
    _check(bd, (h, 1.0, w, W, dy, Y, c, pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING, 0, 0, 0.0, x, X), NS,
           "algo: PYDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING is not implemented")
    _check(bd, (h, 1.0, w, W, dy, Y, c, 6, 0, 0, 0.0, x, X), BAD, "algo: 6 is not a pydnnConvolutionBwdDataAlgo_t")
    _check(bf, (h, 1.0, x, X, dy, Y, c, BWD_F0, 0, 0, 0.0, w, W), NOINIT, "")
    assert pydnn.get_convolution_backward_filter_workspace_size(h, x, dy, c, w, BWD_F1) == 0  # too short to split
    x, dy = tdesc((4, 4, 33, 33)), tdesc((4, 6, 17, 17))
    need = pydnn.get_convolution_backward_filter_workspace_size(h, x, dy, c, w, BWD_F1)
    assert need > 0 and need % 4 == 0
    assert pydnn.get_convolution_backward_filter_workspace_size(h, x, dy, c, w, BWD_F0) == 0
    assert pydnn.get_convolution_backward_data_workspace_size(h, w, dy, c, x, BWD_D0) == 0
    assert pydnn.get_convolution_forward_workspace_size(h, x, w, c, dy, FWD_IG) == 0
    _check(bf, (h, 1.0, x, X, dy, Y, c, BWD_F1, WS, need - 1, 0.0, w, W), BAD,
           f"workSpaceSizeInBytes: {need - 1} bytes is less than the {need} bytes "
           "PYDNN_CONVOLUTION_BWD_FILTER_ALGO_1 needs")
    _check(bf, (h, 1.0, x, X, dy, Y, c, BWD_F1, 0, need, 0.0, w, W), pydnn.PYDNN_STATUS_BAD_PARAM_NULL_POINTER,
           "workSpace:")
    _check(bf, (h, 1.0, x, X, dy, Y, c, BWD_F1, WS, need, 0.0, w, W), NOINIT, "")
    _check(bf, (h, 1.0, x, X, dy, Y, c, pydnn.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING, 0, 0, 0.0, w, W), NS,
           "FFT_TILING is not implemented")
    _check(pydnn.get_convolution_forward_workspace_size, (h, x, w, c, dy, pydnn.PYDNN_CONVOLUTION_FWD_ALGO_WINOGRAD),
           NS, "WINOGRAD is not implemented")
    bb = pydnn.convolution_backward_bias
    _check(bb, (h, 1.0, dy, Y, 0.0, tdesc((1, 6, 1, 1)), X), NOINIT, "")
    _check(bb, (h, 1.0, dy, Y, 0.0, tdesc((1, 5, 1, 1)), X), BAD, "dbDesc: dims (1, 5, 1, 1) are not (1, 6, 1, ...)")
    _check(bb, (h, 1.0, dy, Y, 0.0, tdesc((1, 6, 1, 1), F16), X), NS, "dbDesc: data type 2 differs")
    _check(bb, (h, 1.0, tdesc((6, 5)), Y, 0.0, tdesc((1, 6, 1, 1)), X), BAD, "dyDesc: has 2 dims")


def test_bias_activation_validation():
    h = cpu_handle()
    f = pydnn.convolution_bias_activation_forward
    x, w, c, y = tdesc((2, 4, 8, 8)), fdesc((6, 4, 3, 3)), cdesc((1, 1), (1, 1), (1, 1)), tdesc((2, 6, 8, 8))
    b = tdesc((1, 6, 1, 1))
    act = pydnn.create_activation_descriptor()
    pydnn.set_activation_descriptor(act, pydnn.PYDNN_ACTIVATION_RELU, pydnn.PYDNN_NOT_PROPAGATE_NAN, 0.0)

    def args(z=y, bias=b, a=act, yy=y):
        return (h, 1.0, x, X, w, W, c, FWD_IG, 0, 0, 1.0, z, Y, bias, X, a, yy, Y)
    _check(f, args(), NOINIT, "")
    _check(f, args(z=tdesc((2, 6, 8, 7))), BAD, "zDesc: dims (2, 6, 8, 7) differ from yDesc")
    _check(f, args(bias=tdesc((1, 6, 2, 1))), BAD, "biasDesc: dims (1, 6, 2, 1) are not (1, 6, 1, ...)")
    _check(f, args(bias=tdesc((1, 6, 1, 1), F16)), NS, "biasDesc: data type 2 differs")
    gelu = pydnn.create_activation_descriptor()
    pydnn.set_activation_descriptor(gelu, pydnn.PYDNN_ACTIVATION_GELU_ERF, pydnn.PYDNN_NOT_PROPAGATE_NAN, 0.0)
    _check(f, args(a=gelu), NS, "activationDesc: mode 1000 is not supported in the convolution epilogue")
    _check(f, args(a=None), BAD, "activationDesc: not a live")
    _check(f, args(a=pydnn.create_activation_descriptor()), BAD, "activationDesc: descriptor was never set")


# ----------------------------------------------------------------------------- algorithm queries

def test_algorithm_queries():
    h = cpu_handle()
    assert pydnn.get_convolution_forward_algorithm_max_count(h) == 8
    assert pydnn.get_convolution_backward_data_algorithm_max_count(h) == 6
    assert pydnn.get_convolution_backward_filter_algorithm_max_count(h) == 7
    c = cdesc((1, 1), (1, 1), (1, 1))
    x, w, y = tdesc((64, 64, 56, 56)), fdesc((64, 64, 3, 3)), tdesc((64, 64, 56, 56))
    r = pydnn.get_convolution_forward_algorithm_v7(h, x, w, c, y, 8)
    # fp32 3x3 stride 1: WINOGRAD_NONFUSED, IMPLICIT_GEMM, GEMM, FFT run (test_convolution_algos_cpu.py and
    # test_convolution_fft_cpu.py rank them)
    ran = [p.algo for p in r if p.status == pydnn.PYDNN_STATUS_SUCCESS]
    assert sorted(ran) == sorted([FWD_IG, pydnn.PYDNN_CONVOLUTION_FWD_ALGO_GEMM, pydnn.PYDNN_CONVOLUTION_FWD_ALGO_FFT,
                                  pydnn.PYDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED]) and r[:4] == [p for p in r if p.algo in ran]
    assert sorted(p.algo for p in r) == list(range(8))
    assert all(p.status == NS and "not implemented" in p.message for p in r[4:])
    r = [p for p in r if p.algo == FWD_IG]
    assert r[0].determinism == pydnn.PYDNN_DETERMINISTIC and r[0].memory == 0
    assert len(pydnn.get_convolution_forward_algorithm_v7(h, x, w, c, y, 2)) == 2
    algo, status, time, memory, det, math = r[0]
    assert (algo, status, memory, det, math) == (FWD_IG, 0, 0, pydnn.PYDNN_DETERMINISTIC, pydnn.PYDNN_DEFAULT_MATH)
    rd = pydnn.get_convolution_backward_data_algorithm_v7(h, w, y, c, x, 6)
    assert rd[0].algo == pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED and len(rd) == 6  # fp32 3x3 stride 1
    # a long reduction over few output tiles: the split-K ALGO_1 ranks first; a short one: ALGO_0
    rf = pydnn.get_convolution_backward_filter_algorithm_v7(h, x, y, c, w, 7)
    order = [p.algo for p in rf]
    assert order.index(BWD_F1) < order.index(BWD_F0)  # (the FFT ranks among them: test_convolution_fft_cpu.py)
    assert rf[order.index(BWD_F1)].memory > 0
    assert all(p.determinism == pydnn.PYDNN_DETERMINISTIC for p in rf[:3])
    c1 = cdesc((0, 0), (1, 1), (1, 1))
    small = pydnn.get_convolution_backward_filter_algorithm_v7(h, tdesc((1, 512, 4, 4)), tdesc((1, 512, 4, 4)), c1,
                                                               fdesc((512, 512, 1, 1)), 7)
    assert small[0].algo == BWD_F0
    _check(pydnn.get_convolution_forward_algorithm_v7, (h, x, w, c, y, 0), BAD, "requestedAlgoCount: 0 must be")
    _check(pydnn.get_convolution_forward_algorithm_v7, (h, x, w, c, tdesc((64, 64, 56, 55)), 8), BAD, "yDesc: dims")


# ----------------------------------------------------------------------------- kernel emulation

def _val(c_arr):
    return [int(v) for v in c_arr]


def _digits(k, sizes):
    d3 = k % sizes[3]
    k = k // sizes[3]
    d2 = k % sizes[2]
    k = k // sizes[2]
    d1 = k % sizes[1]
    return [k // sizes[1], d1, d2, d3]


def _decompose3(m, size):
    c2 = m % size[2]
    m = m // size[2]
    c1 = m % size[1]
    m = m // size[1]
    return m // size[0], [m % size[0], c1, c2]


def _gather(buf, off, ok):
    return np.where(ok, buf[np.where(ok, off, 0)], 0.0)


def emulate_gemm(p, direction, abuf, bbuf, outbuf, g, split):
    """C of one (group, slice) exactly as implicit_gemm computes its elements' addresses."""
    flags = p.flags
    cin, flip = bool(flags & CPb.FLAG_CIN), bool(flags & CPb.FLAG_FLIP)
    ins, outs, filt = _val(p.in_size), _val(p.out_size), _val(p.filt)
    pad, st, dil = _val(p.pad), _val(p.stride), _val(p.dil)
    xs, ys, ws = _val(p.xs), _val(p.ys), _val(p.ws)
    red = _val(p.red_size)
    kbeg = split * p.k_per_split
    kend = min(p.gk, kbeg + p.k_per_split)
    m = np.arange(p.gm)[:, None]
    n = np.arange(p.gn)[None, :]
    k = np.arange(kbeg, kend)
    d = _digits(k, red)
    ch, taps = (d[3], d[0:3]) if cin else (d[0], d[1:4])
    fl = [(filt[i] - 1 - taps[i]) if flip else taps[i] for i in range(3)]
    if direction == CPb.DIR_FWD:
        b, o = _decompose3(m, outs)
        off = b * xs[0] + (g * p.cg + ch[None, :]) * xs[1]
        ok = np.ones(off.shape, bool)
        for i in range(3):
            q = o[i] * st[i] - pad[i] + taps[i][None, :] * dil[i]
            ok &= (q >= 0) & (q < ins[i])
            off = off + q * xs[2 + i]
        A = _gather(abuf, off, ok)
        boff = (g * p.kg + n) * ws[0] + ch[:, None] * ws[1] + sum(fl[i][:, None] * ws[2 + i] for i in range(3))
        B = bbuf[boff]
    elif direction == CPb.DIR_BWD_DATA:
        b, c = _decompose3(m, ins)
        off = b * ys[0] + (g * p.kg + ch[None, :]) * ys[1]
        ok = np.ones(off.shape, bool)
        for i in range(3):
            q = c[i] + pad[i] - taps[i][None, :] * dil[i]
            ok &= (q >= 0) & (q % st[i] == 0)
            q = q // st[i]
            ok &= q < outs[i]
            off = off + q * ys[2 + i]
        A = _gather(abuf, off, ok)
        boff = (g * p.kg + ch[:, None]) * ws[0] + n * ws[1] + sum(fl[i][:, None] * ws[2 + i] for i in range(3))
        B = bbuf[boff]
    else:
        A = abuf[(g * p.kg + m) * ys[1] + d[0][None, :] * ys[0] + sum(d[1 + i][None, :] * ys[2 + i] for i in range(3))]
        c, t = _decompose3(n, filt)
        off = (g * p.cg + c) * xs[1] + d[0][:, None] * xs[0]
        ok = np.ones(off.shape, bool)
        for i in range(3):
            q = d[1 + i][:, None] * st[i] + t[i] * dil[i] - pad[i]
            ok &= (q >= 0) & (q < ins[i])
            off = off + q * xs[2 + i]
        B = _gather(bbuf, off, ok)
    return A @ B


def out_offsets(p, direction, g):
    """out_offset() of every (m, n) of a group."""
    outs, ins, filt = _val(p.out_size), _val(p.in_size), _val(p.filt)
    xs, ys, ws = _val(p.xs), _val(p.ys), _val(p.ws)
    flip = bool(p.flags & CPb.FLAG_FLIP)
    m = np.arange(p.gm)[:, None]
    n = np.arange(p.gn)[None, :]
    if direction == CPb.DIR_FWD:
        b, o = _decompose3(m, outs)
        return b * ys[0] + (g * p.kg + n) * ys[1] + sum(o[i] * ys[2 + i] for i in range(3))
    if direction == CPb.DIR_BWD_DATA:
        b, c = _decompose3(m, ins)
        return b * xs[0] + (g * p.cg + n) * xs[1] + sum(c[i] * xs[2 + i] for i in range(3))
    c, t = _decompose3(n, filt)
    return (g * p.kg + m) * ws[0] + c * ws[1] + sum(((filt[i] - 1 - t[i]) if flip else t[i]) * ws[2 + i]
                                                    for i in range(3))


def emulate(pl, direction, abuf, bbuf, out_size):
    """The whole plan (every group and slice, then the fold in slice order) -> the output buffer."""
    p = pl.gemm
    out = np.full(out_size, np.nan)
    for g in range(p.groups):
        total = sum(emulate_gemm(p, direction, abuf, bbuf, None, g, s) for s in range(p.splits))
        offs = out_offsets(p, direction, g)
        assert np.isnan(out[offs]).all(), "two GEMM elements write one output element"
        out[offs] = total
    return out


def _strided(dims, layout, rng):
    """(strides, buffer size) for a layout: nchw, nhwc, or 'gap' (NCHW with padded rows and channels)."""
    dims = tuple(dims)
    if layout == "nhwc":
        s = packed_strides(dims, NHWC)
    elif layout == "gap":
        s, acc = [0] * len(dims), 1
        for i in reversed(range(len(dims))):
            s[i] = acc
            acc *= dims[i] + (1 if i > 0 else 0)
        s = tuple(s)
    else:
        s = packed_strides(dims, NCHW)
    return s, sum((d - 1) * st for d, st in zip(dims, s)) + 1


def _scatter(values, strides, size):
    buf = np.zeros(size)
    idx = sum(np.indices(values.shape)[i] * strides[i] for i in range(values.ndim))
    buf[idx] = values
    return buf


def _gather_tensor(buf, dims, strides):
    idx = sum(np.indices(dims)[i] * strides[i] for i in range(len(dims)))
    return buf[idx]


EMU_CASES = [  # xdims, k, filt, pad, stride, dil, groups, layout, filter format
    ((2, 3, 11), 5, (3,), (1,), (2,), (1,), 1, "nchw", NCHW),
    ((2, 4, 7, 9), 6, (3, 3), (1, 1), (1, 1), (1, 1), 1, "nhwc", NHWC),
    ((2, 4, 7, 9), 6, (3, 2), (1, 0), (2, 3), (1, 2), 2, "nchw", NCHW),
    ((1, 6, 8, 5), 6, (3, 3), (2, 1), (2, 1), (2, 1), 6, "nhwc", NCHW),     # depthwise
    ((2, 5, 6, 6), 7, (1, 1), (0, 0), (2, 2), (1, 1), 1, "gap", NHWC),
    ((1, 3, 4, 5, 6), 4, (2, 3, 2), (1, 1, 0), (1, 2, 2), (2, 1, 1), 1, "nchw", NCHW),
    ((1, 4, 4, 5, 3), 4, (3, 1, 2), (1, 0, 1), (2, 1, 1), (1, 1, 2), 2, "nhwc", NHWC),
    ((3, 70, 9, 9), 80, (3, 3), (1, 1), (1, 1), (1, 1), 1, "nchw", NCHW),  # more than one tile each way
]


@pytest.mark.parametrize("case", EMU_CASES)
@pytest.mark.parametrize("mode", [XCORR, CONV])
@pytest.mark.parametrize("direction", [CPb.DIR_FWD, CPb.DIR_BWD_DATA, CPb.DIR_BWD_FILTER])
def test_kernel_index_math_emulated(case, mode, direction, rng):
    """Every plan's parameter struct, run through the kernels' address arithmetic, gives the reference."""
    xd, k, filt, pad, st, dil, g, layout, wfmt = case
    h = cpu_handle()
    c = cdesc(pad, st, dil, mode, groups=g)
    wd = (k, xd[1] // g) + filt
    yd = (xd[0], k) + ref.out_dims(xd[2:], filt, pad, st, dil)
    xs, xsize = _strided(xd, layout, rng)
    ys, ysize = _strided(yd, layout, rng)
    xdsc, ydsc, wdsc = tdesc(xd, strides=xs), tdesc(yd, strides=ys), fdesc(wd, fmt=wfmt)
    ws = wdsc.strides
    x, w, dy = rng.standard_normal(xd), rng.standard_normal(wd), rng.standard_normal(yd)
    xb, wb, dyb = _scatter(x, xs, xsize), _scatter(w, ws, int(np.prod(wd))), _scatter(dy, ys, ysize)
    cross = mode == XCORR
    if direction == CPb.DIR_FWD:
        pl = CP.new_plan(h, direction, FWD_IG, c, xdsc, wdsc, ydsc)
        got = _gather_tensor(emulate(pl, direction, xb, wb, ysize), yd, ys)
        want = ref.forward_raw(x, w, pad, st, dil, g, cross)
    elif direction == CPb.DIR_BWD_DATA:
        pl = CP.new_plan(h, direction, BWD_D0, c, xdsc, wdsc, ydsc)
        got = _gather_tensor(emulate(pl, direction, dyb, wb, xsize), xd, xs)
        want = ref.backward_data_raw(w, dy, xd[2:], pad, st, dil, g, cross)
    else:
        for algo in (BWD_F0, BWD_F1):
            pl = CP.new_plan(h, direction, algo, c, xdsc, wdsc, ydsc)
            got = _gather_tensor(emulate(pl, direction, dyb, xb, int(np.prod(wd))), wd, ws)
            want = ref.backward_filter_raw(x, dy, filt, pad, st, dil, g, cross)
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
        return
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("sizes", [(5, 3, 3, 3), (100, 1, 1, 1), (2, 7, 1, 3), (1000, 1, 2, 17), (4, 2, 2, 64),
                                   (1, 3, 3, 8), (1, 1, 1, 24)])
@pytest.mark.parametrize("bk", [CI.BK, CT.TC_BK])
def test_reduction_digit_steps(sizes, bk):
    """red_step: adding the tile depth's digits with one carry per digit walks k exactly."""
    step = CP.digit_step(bk, sizes)
    for k0 in range(0, 40):
        d = _digits(np.array(k0), sizes)
        d = [int(v) for v in d]
        for j in range(1, 30):
            c = 0
            for i in (3, 2, 1):
                v = d[i] + step[i] + c
                c = int(v >= sizes[i])
                d[i] = v - sizes[i] if c else v
            d[0] += step[0] + c
            assert d == [int(v) for v in _digits(np.array(k0 + j * bk), sizes)]


TC_EMU = [  # xdims, k, filt, pad, stride, dil
    ((2, 8, 7, 9), 6, (3, 3), (1, 1), (1, 1), (1, 1)),
    ((1, 24, 9, 10), 20, (3, 2), (1, 0), (2, 1), (1, 2)),
    ((1, 16, 4, 5, 3), 4, (3, 1, 2), (1, 0, 1), (2, 1, 1), (1, 1, 2)),
]


@pytest.mark.parametrize("case", TC_EMU)
@pytest.mark.parametrize("mode", [XCORR, CONV])
def test_tensor_core_bwd_data_plan_emulated(case, mode, rng, monkeypatch):
    """The backward-data tensor-core plan (output channel innermost in the reduction) gives the reference
    (strided ones: the stride-s bwd_data_tc, with the phase split off; the phases are emulated in
    test_convolution_dgrad_phases_cpu.py)."""
    monkeypatch.setattr(tuning.conv, "DGRAD_PHASES", False)
    xd, k, filt, pad, st, dil = case
    k = 8 * -(-k // 8)
    c = cdesc(pad, st, dil, mode)
    wd = (k, xd[1]) + filt
    yd = (xd[0], k) + ref.out_dims(xd[2:], filt, pad, st, dil)
    xs, ys = packed_strides(xd, NHWC), packed_strides(yd, NHWC)
    xdsc, ydsc, wdsc = tdesc(xd, BF16, strides=xs), tdesc(yd, BF16, strides=ys), fdesc(wd, BF16, fmt=NHWC)
    pl = CP.new_plan(cpu_handle(), CPb.DIR_BWD_DATA, pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_1, c, xdsc, wdsc, ydsc)
    assert "bwd_data_tc" in pl.gemm_expr and pl.gemm.flags & CPb.FLAG_CIN and pl.pair_ok
    assert list(pl.gemm.red_size) == list(CPb._pad3(filt, 1)) + [k]
    assert list(pl.gemm.red_step) == CP.digit_step(CT.TC_BK, list(pl.gemm.red_size))
    w, dy = rng.standard_normal(wd), rng.standard_normal(yd)
    got = _gather_tensor(emulate(pl, CPb.DIR_BWD_DATA, _scatter(dy, ys, int(np.prod(yd))),
                                 _scatter(w, wdsc.strides, int(np.prod(wd))), int(np.prod(xd))), xd, xs)
    np.testing.assert_allclose(got, ref.backward_data_raw(w, dy, xd[2:], pad, st, dil, 1, mode == XCORR),
                               rtol=1e-10, atol=1e-10)


BWD_WGM_EMU = [  # xdims, k, filt, pad, dil: stride 1 (odd sizes, padding 0 / 1 / 2, dilation, 1-d, 3-d)
    ((2, 8, 7, 9), 16, (3, 3), (1, 1), (1, 1)),
    ((1, 16, 5, 11), 8, (3, 3), (0, 2), (1, 1)),
    ((1, 8, 9, 6), 24, (3, 2), (2, 0), (2, 1)),
    ((2, 8, 13), 8, (5,), (2,), (1,)),
    ((1, 8, 3, 4, 5), 16, (2, 3, 3), (1, 1, 0), (1, 1, 2)),
    ((1, 8, 5, 6), 8, (3, 3), (3, 1), (1, 1)),    # pad > (R - 1) * dil: the forward's padding is negative
    ((3, 24, 5, 7), 16, (3, 3), (1, 1), (1, 1)),  # C > K
]


def _swap_emulated(f, wbuf):
    """filter_kc_swap from its ConvAuxParams: out[c][tap][k] = in[k][c][tap] (in through in_stride)."""
    taps, (tf, rf, sf) = f.taps, (f.filt[0], f.filt[1], f.filt[2])
    out = np.zeros(f.cg * taps * f.kg)
    for tap in range(taps):
        t, r, s = tap // (rf * sf), tap // sf % rf, tap % sf
        for k in range(f.kg):
            for c in range(f.cg):
                src = k * f.in_stride[0] + c * f.in_stride[1] + t * f.in_stride[2] + r * f.in_stride[3] + s * f.in_stride[4]
                out[(c * taps + tap) * f.kg + k] = wbuf[src]
    return out


@pytest.mark.parametrize("case", BWD_WGM_EMU)
@pytest.mark.parametrize("mode", [XCORR, CONV])
@pytest.mark.parametrize("swap", [False, True])
def test_bwd_data_wgmma_plan_emulated(case, mode, swap, rng, monkeypatch):
    """Backward data on fwd_wgmma (sm_90, stride 1) = the forward plan of dy (padding (R - 1) * dil - pad,
    the opposite mode) with the filter w'[c][tap][k] = w[k][tap][c]: read from w itself through its strides
    (fwd_wgmma<..., BKN = 1>: one launch, no workspace), or (WGM_BWD_SWAP) from the packed copy that
    filter_kc_swap's params write into the workspace. Either gives the reference dx; the plan is
    deterministic and the workspace query reports its workspace."""
    xd, k, filt, pad, dil = case
    st = (1,) * len(filt)
    monkeypatch.setitem(tuning.conv.TC_FORCE, CPb.DIR_BWD_DATA, CT.WGM_TILES[0])  # channels < 64: a forced tile
    monkeypatch.setattr(tuning.conv, "WGM_BWD_SWAP", swap)
    c = cdesc(pad, st, dil, mode)
    wd = (k, xd[1]) + filt
    yd = (xd[0], k) + ref.out_dims(xd[2:], filt, pad, st, dil)
    xs, ys = packed_strides(xd, NHWC), packed_strides(yd, NHWC)
    xdsc, ydsc, wdsc = tdesc(xd, BF16, strides=xs), tdesc(yd, BF16, strides=ys), fdesc(wd, BF16, fmt=NHWC)
    h = cpu_handle()
    pl = CP.new_plan(h, CPb.DIR_BWD_DATA, pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_1, c, xdsc, wdsc, ydsc)
    assert "fwd_wgmma<" in pl.gemm_expr and pl.deterministic and pl.direction == CPb.DIR_BWD_DATA
    assert pydnn.get_convolution_backward_data_workspace_size(h, wdsc, ydsc, c, xdsc,
                                                              pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_1) == pl.workspace
    w, dy = rng.standard_normal(wd), rng.standard_normal(yd)
    wbuf, dybuf = _scatter(w, wdsc.strides, int(np.prod(wd))), _scatter(dy, ys, int(np.prod(yd)))
    if swap:
        assert isinstance(pl, CT.BwdWgmmaPlan) and pl.gemm_expr == CT._wgm_expr("bf16", CT.WGM_TILES[0])
        assert pl.workspace >= int(np.prod(wd)) * 2 and pl.workspace % 256 == 0
        assert pl.swap_grid == (-(-k // 64), -(-xd[1] // 64), int(np.prod(filt)))
        got = emulate(pl.sub, CPb.DIR_FWD, dybuf, _swap_emulated(pl.swap, wbuf), int(np.prod(xd)))
    else:
        assert type(pl) is CP.Plan and pl.gemm_expr == CT._wgm_expr("bf16", CT.WGM_TILES[0], bkn=True)
        assert pl.gemm_expr.endswith(", 1, 1>") and pl.workspace == 0 and pl.fold is None
        # B's n (= c) contiguous, its k and tap strides w's own: what BKN copies 16 bytes at a time
        assert list(pl.gemm.ws) == [1, wdsc.strides[0]] + [0] * (5 - len(wd)) + list(wdsc.strides[2:])
        assert bool(pl.gemm.flags & CPb.FLAG_FLIP) == (mode == XCORR)
        got = emulate(pl, CPb.DIR_FWD, dybuf, wbuf, int(np.prod(xd)))
    np.testing.assert_allclose(_gather_tensor(got, xd, xs),
                               ref.backward_data_raw(w, dy, xd[2:], pad, st, dil, 1, mode == XCORR),
                               rtol=1e-10, atol=1e-10)


def test_bwd_data_wgmma_choice(monkeypatch):
    """The model takes fwd_wgmma for backward data where it would for the equivalent forward (sm_90,
    stride 1, K % 64, >= WGM_MIN_KTILES K tiles), with the forward's tile for the same GEMM; not with
    stride 2, on sm_80, or without USE_WGM; v7 ranks it first, deterministic, with no workspace (B read
    from the filter itself, BKN), or with WGM_BWD_SWAP the swapped filter's (the same fwd_wgmma tile)."""
    monkeypatch.setattr(tuning.conv, "FWD_TMA", False)   # the forward's fwd_wgmma plan itself (not fwd_tma's)
    monkeypatch.setattr(tuning.conv, "DGRAD_TMA", False)   # backward data's too
    h = cpu_handle()
    bd1 = pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_1
    c = cdesc((1, 1), (1, 1), (1, 1))
    for cc, hw in ((64, 56), (128, 28), (256, 14), (512, 7)):
        x, w = tdesc((64, cc, hw, hw), BF16, NHWC), fdesc((cc, cc, 3, 3), BF16, NHWC)
        pd = CP.new_plan(h, CPb.DIR_BWD_DATA, bd1, c, x, w, x)
        pf = CP.new_plan(h, CPb.DIR_FWD, pydnn.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, c, x, w, x)
        assert type(pd) is CP.Plan and pd.gemm_expr == pf.gemm_expr[:-1] + ", 1>" and pd.workspace == 0
        assert pd.gemm_grid == pf.gemm_grid and pd.smem == pf.smem and pd.threads == pf.threads
        r = pydnn.get_convolution_backward_data_algorithm_v7(h, w, x, c, x, 6)
        assert r[0].algo == bd1 and r[0].determinism == pydnn.PYDNN_DETERMINISTIC and r[0].memory == 0
        monkeypatch.setattr(tuning.conv, "WGM_BWD_SWAP", True)
        pd = CP.new_plan(h, CPb.DIR_BWD_DATA, bd1, c, x, w, x)
        monkeypatch.setattr(tuning.conv, "WGM_BWD_SWAP", False)
        assert isinstance(pd, CT.BwdWgmmaPlan) and pd.gemm_expr == pf.gemm_expr and pd.workspace == cc * cc * 9 * 2
        assert pd.sub.gemm_grid == pf.gemm_grid and pd.sub.smem == pf.smem
    x, w = tdesc((8, 64, 28, 28), BF16, NHWC), fdesc((64, 64, 3, 3), BF16, NHWC)
    y2 = tdesc((8, 64, 14, 14), BF16, NHWC)
    c2 = cdesc((1, 1), (2, 2), (1, 1))  # stride 2: the phases (dgrad_phases.py), or the stride-s bwd_data_tc
    assert type(CP.new_plan(h, CPb.DIR_BWD_DATA, bd1, c2, x, w, y2)).__name__ == "PhasePlan"
    monkeypatch.setattr(tuning.conv, "DGRAD_PHASES", False)
    assert "bwd_data_tc" in CP.new_plan(h, CPb.DIR_BWD_DATA, bd1, c2, x, w, y2).gemm_expr
    monkeypatch.setattr(tuning.conv, "DGRAD_PHASES", True)
    monkeypatch.setattr(tuning.conv, "USE_WGM", False)
    assert "implicit_gemm_pipe_tc<1," in CP.new_plan(h, CPb.DIR_BWD_DATA, bd1, c, x, w, x).gemm_expr
    monkeypatch.setattr(tuning.conv, "USE_WGM", True)
    h.arch = "sm_80"
    pl = CP.new_plan(h, CPb.DIR_BWD_DATA, bd1, c, x, w, x)
    assert "implicit_gemm_pipe_tc<1," in pl.gemm_expr and pl.workspace == 0


def test_tensor_core_smem_and_tiles(monkeypatch):
    """Shared memory per block: 4 stages of A (BM x 40) and B ([n][k] 40 wide, or [k][n] BN + 8 wide); the
    grid follows the tile (the model's choice, or one forced through TC_FORCE)."""
    h = cpu_handle()
    c = cdesc((1, 1), (1, 1), (1, 1))
    for k, tile in ((64, None), (72, (128, 128)), (256, (64, 128)), (256, (128, 64)), (72, (64, 64))):
        if tile:
            monkeypatch.setitem(tuning.conv.TC_FORCE, CPb.DIR_FWD, tile)
            monkeypatch.setitem(tuning.conv.TC_FORCE, CPb.DIR_BWD_DATA, tile)
        x, w, y = tdesc((2, 16, 8, 8), BF16, NHWC), fdesc((k, 16, 3, 3), BF16, NHWC), tdesc((2, k, 8, 8), BF16, NHWC)
        pl = CP.new_plan(h, CPb.DIR_FWD, pydnn.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, c, x, w, y)
        bm, bn = (int(v) for v in pl.gemm_expr[:-1].split(", ")[1:])
        assert tile in (None, (bm, bn)) and (bm, bn) in CT.TC_TILES
        assert pl.gemm_grid == (-(-128 // bm), -(-k // bn), 1)
        assert pl.smem == 4 * (bm + bn) * 40 * 2
        pd = CP.new_plan(h, CPb.DIR_BWD_DATA, pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_1, c, x, w, y)
        if tile is None and k % 64 == 0:  # dy's K fills 64-deep K tiles: fwd_wgmma on sm_90 (test above)
            assert pd.gemm_expr.startswith("pydnn::conv::fwd_wgmma<") and pd.gemm_expr.endswith(", 1>")
            continue
        bm, bn = (int(v) for v in pd.gemm_expr[:-1].split(", ")[1:])
        assert "bwd_data_tc" in pd.gemm_expr and tile in (None, (bm, bn))
        assert pd.gemm_grid == (-(-128 // bm), -(-16 // bn), 1)  # N = C = 16
        assert pd.smem == 4 * (bm * 40 + 32 * (bn + 8)) * 2


def test_tensor_core_pipelined_plans(monkeypatch):
    """Forward and stride-1 backward data whose reduction channels are multiples of 64 get the pipelined
    kernel (implicit_gemm_pipe_tc: WARPS_M x WARPS_N warps, 3 stages of (BM + BN) x 64); a forced pipelined
    tile is obeyed where the kernel applies; strided backward data runs it on its stride-1 phases (or
    bwd_data_tc with the phases off)."""
    h = cpu_handle()
    monkeypatch.setattr(tuning.conv, "USE_WGM", False)  # the forward model's fwd_wgmma on sm_90: test_wgmma_forward_plans
    c = cdesc((1, 1), (1, 1), (1, 1))
    x, w, y = tdesc((64, 64, 56, 56), BF16, NHWC), fdesc((64, 64, 3, 3), BF16, NHWC), tdesc((64, 64, 56, 56), BF16, NHWC)
    for direction, algo in ((CPb.DIR_FWD, pydnn.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM),
                            (CPb.DIR_BWD_DATA, pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_1)):
        pl = CP.new_plan(h, direction, algo, c, x, w, y)
        assert f"implicit_gemm_pipe_tc<{direction}," in pl.gemm_expr
        args = pl.gemm_expr[:-1].split(", ")[2:]
        cfg = tuple(int(v) for v in args[:5]) + (int(args[5] == "true"),)
        assert cfg in CT.TCP_TILES
        bm, bn, wm, wn = cfg[:4]
        assert pl.threads == wm * wn * 32 and pl.smem == 3 * (bm + bn) * 64 * 2
        assert pl.gemm_grid == (-(-64 * 56 * 56 // bm), -(-64 // bn), 1)
        for tile in CT.TCP_TILES:
            monkeypatch.setitem(tuning.conv.TC_FORCE, direction, tile)
            pl = CP.new_plan(h, direction, algo, c, x, w, y)
            assert pl.gemm_expr == CT._tc_expr("bf16", direction, tile)
        monkeypatch.delitem(tuning.conv.TC_FORCE, direction)
    c2 = cdesc((1, 1), (2, 2), (1, 1))
    y2 = tdesc((64, 64, 28, 28), BF16, NHWC)
    pl = CP.new_plan(h, CPb.DIR_BWD_DATA, pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_1, c2, x, w, y2)
    # strided: stride-1 phases (dgrad_phases.py) on the pipelined kernel, or with them off bwd_data_tc
    assert all(f"implicit_gemm_pipe_tc<{CPb.DIR_BWD_DATA}," in sp.gemm_expr for sp, _, _, _ in pl.subs)
    monkeypatch.setattr(tuning.conv, "DGRAD_PHASES", False)
    pl = CP.new_plan(h, CPb.DIR_BWD_DATA, pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_1, c2, x, w, y2)
    assert "bwd_data_tc" in pl.gemm_expr and pl.threads == 256


@pytest.mark.parametrize("tile", [None] + [t for t in CT.WGM_TILES + CT.WGM_VARIANTS])
def test_fused_forward_takes_the_bias_register_instantiation(monkeypatch, tile):
    """convolution_bias_activation_forward's own plan runs fwd_wgmma<..., FB = 1> on the 128x64 model tile
    (the bias in registers), every other tile as the plain forward does; the plain forward's plan keeps
    FB = 0. (A CPU handle: the call fails at the kernel lookup, after its plan is made and cached.)"""
    monkeypatch.setattr(tuning.conv, "FWD_TMA", False)   # fwd_wgmma's plans themselves (not fwd_tma's)
    if tile is not None:
        monkeypatch.setitem(tuning.conv.TC_FORCE, CPb.DIR_FWD, tile)
    h = cpu_handle()
    fwd = pydnn.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM
    c = cdesc((1, 1), (1, 1), (1, 1))
    x, w, y = tdesc((64, 64, 56, 56), BF16, NHWC), fdesc((64, 64, 3, 3), BF16, NHWC), tdesc((64, 64, 56, 56), BF16, NHWC)
    b = tdesc((1, 64, 1, 1), BF16, NHWC)
    act = pydnn.create_activation_descriptor()
    pydnn.set_activation_descriptor(act, pydnn.PYDNN_ACTIVATION_RELU, pydnn.PYDNN_NOT_PROPAGATE_NAN, 0.0)
    plain = CP.new_plan(h, CPb.DIR_FWD, fwd, c, x, w, y)
    with pytest.raises(pydnn.PydnnError) as e:
        pydnn.convolution_bias_activation_forward(h, 1.0, x, 1 << 32, w, 1 << 32, c, fwd, 0, 0, 0.0, y, 1 << 32, b,
                                                  1 << 32, act, y, 1 << 32)
    assert e.value.status == pydnn.PYDNN_STATUS_NOT_INITIALIZED
    (fused,) = [p for p in h.prepared.values() if getattr(p, "direction", None) == CPb.DIR_FWD]
    assert plain.gemm_expr.startswith("pydnn::conv::fwd_wgmma<") and "fwd_wgmma<" in fused.gemm_expr
    if plain.gemm_expr in CT._FB_EXPRS:   # the 128x64 model tile
        assert fused.gemm_expr == plain.gemm_expr[:-1] + ", 0, 1>"   # <T, 64, STAGES, MINB, LEAN, BKN 0, FB 1>
        assert fused.gemm_expr in CT.wgm_units()[1].exprs
    else:
        assert fused.gemm_expr == plain.gemm_expr


def test_wgmma_forward_plans(monkeypatch):
    """fwd_wgmma (Hopper wgmma): its units exist for sm_90 only (as sm_90a); a forced WGM_TILES entry runs
    where the pipelined forward applies on sm_90 (256 threads, STAGES x (128 + BN) x 64 x 2 + 1 KiB of
    shared memory, unit convolution.wgmma.<tag>), elsewhere (another arch, backward data, a filter the
    tap masks cannot hold) the model's choice; without USE_WGM the model never picks it, with it (sm_90,
    channels % 64, >= WGM_MIN_KTILES K tiles) it picks it by _wgm_tiling."""
    from pydnn._build.manifest import unit_arch

    monkeypatch.setattr(tuning.conv, "FWD_TMA", False)   # fwd_wgmma's plans themselves (not fwd_tma's)
    units = CT.wgm_units()
    assert [u.name for u in units] == ["convolution.wgmma.f16", "convolution.wgmma.bf16"]
    assert all(unit_arch(u, "sm_90") == "sm_90a" and unit_arch(u, "sm_80") is None for u in units)
    assert all(u.name in {v.name for v in CP.kernel_units()} for u in units)
    h = cpu_handle()
    fwd = pydnn.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM
    c = cdesc((1, 1), (1, 1), (1, 1))
    x, w, y = tdesc((64, 64, 56, 56), BF16, NHWC), fdesc((64, 64, 3, 3), BF16, NHWC), tdesc((64, 64, 56, 56), BF16, NHWC)
    monkeypatch.setattr(tuning.conv, "USE_WGM", False)
    assert "implicit_gemm_pipe_tc" in CP.new_plan(h, CPb.DIR_FWD, fwd, c, x, w, y).gemm_expr
    for tile in CT.WGM_TILES + CT.WGM_VARIANTS:  # forced: obeyed with USE_WGM off too
        monkeypatch.setitem(tuning.conv.TC_FORCE, CPb.DIR_FWD, tile)
        pl = CP.new_plan(h, CPb.DIR_FWD, fwd, c, x, w, y)
        lean = f", {tile[4]}" if len(tile) == 5 and tile[4] else ""  # LEAN: v12's copies 1 (default 0: v8's)
        assert pl.gemm_expr == f"pydnn::conv::fwd_wgmma<pydnn::bf16_t, {tile[1]}, {tile[2]}, {tile[3]}{lean}>"
        assert pl.unit == "convolution.wgmma.bf16" and pl.threads == 256
        assert pl.smem == tile[2] * (128 + tile[1]) * 64 * 2 + 1024 + tile[1] * 4  # + FB = 0's parked bias
        assert pl.gemm_grid == (64 * 56 * 56 // 128, -(-64 // tile[1]), 1)
        monkeypatch.setitem(tuning.conv.TC_FORCE, CPb.DIR_BWD_DATA, tile)  # backward data (stride 1): this tile, B as [k][c]
        pd = CP.new_plan(h, CPb.DIR_BWD_DATA, pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_1, c, x, w, y)
        assert pd.gemm_expr == f"pydnn::conv::fwd_wgmma<pydnn::bf16_t, {tile[1]}, {tile[2]}, {tile[3]}, {lean[2:] or 0}, 1>"
        assert pd.unit == "convolution.wgmma.bf16" and pd.workspace == 0 and pd.smem == pl.smem
        assert pd.gemm_expr in units[1].exprs and pl.gemm_expr in units[1].exprs
        monkeypatch.setattr(tuning.conv, "WGM_BWD_SWAP", True)  # or the swap + this tile
        pd = CP.new_plan(h, CPb.DIR_BWD_DATA, pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_1, c, x, w, y)
        monkeypatch.setattr(tuning.conv, "WGM_BWD_SWAP", False)
        assert pd.gemm_expr == pl.gemm_expr and pd.unit == "convolution.wgmma.bf16" and pd.workspace == 64 * 64 * 9 * 2
        w17 = fdesc((64, 64, 1, 17), BF16, NHWC)  # S = 17 > 16: the tap masks cannot hold it
        c17 = cdesc((0, 8), (1, 1), (1, 1))
        p17 = CP.new_plan(h, CPb.DIR_FWD, fwd, c17, x, w17, y)
        assert "fwd_tc<" in p17.gemm_expr and p17.unit == "convolution.bf16"
    h.arch = "sm_80"
    pl = CP.new_plan(h, CPb.DIR_FWD, fwd, c, x, w, y)
    assert "wgmma" not in pl.gemm_expr and pl.unit == "convolution.bf16"
    h.arch = "sm_90"
    monkeypatch.delitem(tuning.conv.TC_FORCE, CPb.DIR_FWD)
    monkeypatch.setattr(tuning.conv, "USE_WGM", True)
    assert CP.new_plan(h, CPb.DIR_FWD, fwd, c, x, w, y).gemm_expr.startswith("pydnn::conv::fwd_wgmma<pydnn::bf16_t, 64,")
    x3, w3, y3 = tdesc((8, 72, 28, 28), BF16, NHWC), fdesc((128, 72, 3, 3), BF16, NHWC), tdesc((8, 128, 28, 28), BF16, NHWC)
    # C % 64 != 0: the channel tail fills 72 / 128 of its K tiles >= tuning.conv.FWD_TAIL_FILL: fwd_wgmma
    # (the rest zero-filled); below the threshold fwd_tc
    assert "fwd_wgmma<" in CP.new_plan(h, CPb.DIR_FWD, fwd, c, x3, w3, y3).gemm_expr
    monkeypatch.setattr(tuning.conv, "FWD_TAIL_FILL", 0.6)
    assert "fwd_tc<" in CP.new_plan(h, CPb.DIR_FWD, fwd, c, x3, w3, y3).gemm_expr
    monkeypatch.setattr(tuning.conv, "FWD_TAIL_FILL", 0.5)
    # fewer than WGM_MIN_KTILES K tiles (a 1x1 filter over 64 channels: 1; measured ~0.8x, bench v14): the
    # pipelined kernel; over 256 channels (4 K tiles, 1.11-1.17x) fwd_wgmma
    c1 = cdesc((0, 0), (1, 1), (1, 1))
    x1, w1, y1 = tdesc((8, 64, 28, 28), BF16, NHWC), fdesc((256, 64, 1, 1), BF16, NHWC), tdesc((8, 256, 28, 28), BF16, NHWC)
    assert "implicit_gemm_pipe_tc" in CP.new_plan(h, CPb.DIR_FWD, fwd, c1, x1, w1, y1).gemm_expr
    x1, w1, y1 = tdesc((8, 256, 28, 28), BF16, NHWC), fdesc((64, 256, 1, 1), BF16, NHWC), tdesc((8, 64, 28, 28), BF16, NHWC)
    assert "fwd_wgmma<" in CP.new_plan(h, CPb.DIR_FWD, fwd, c1, x1, w1, y1).gemm_expr
    # the model's tiles on the v8 layers (N = 64): 128x64 at 56² and 14², 128x128 at 28² and 7²
    for cc, hw, bn in ((64, 56, 64), (128, 28, 128), (256, 14, 64), (512, 7, 128)):
        xl, wl, yl = tdesc((64, cc, hw, hw), BF16, NHWC), fdesc((cc, cc, 3, 3), BF16, NHWC), tdesc((64, cc, hw, hw), BF16, NHWC)
        assert CP.new_plan(h, CPb.DIR_FWD, fwd, c, xl, wl, yl).gemm_expr.startswith(f"pydnn::conv::fwd_wgmma<pydnn::bf16_t, {bn},")
    h.arch = "sm_80"
    assert "implicit_gemm_pipe_tc" in CP.new_plan(h, CPb.DIR_FWD, fwd, c, x, w, y).gemm_expr


def test_tensor_core_backward_filter_plan(monkeypatch):
    """BWD_FILTER_ALGO_1 on tensor cores for 16-bit NHWC x and dy (any filter format): the split model's
    tiling, a workspace of fp32 partials when split, the fold told the columns are channel-innermost;
    CUDA cores (and the same algorithm) otherwise. The sm_90 wgmma kernel that takes these problems first
    is off here (its own plan tests: test_convolution_wgrad_wgmma_cpu.py)."""
    from pydnn.ops.convolution import wgrad_wgmma as convolution_wgrad_wgmma
    monkeypatch.setattr(tuning.conv_wgrad_wgmma, "ENABLED", False)
    h = cpu_handle()
    c = cdesc((1, 1), (1, 1), (1, 1))
    f1 = pydnn.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_1
    x, y = tdesc((64, 64, 56, 56), BF16, NHWC), tdesc((64, 64, 56, 56), BF16, NHWC)
    for fmt in (NHWC, NCHW):
        for pipe in (True, False):   # wgrad_pipe_tc (the model's kernel for packed NHWC dy) or wgrad_tc
            monkeypatch.setattr(tuning.conv, "WG_PIPE", pipe)
            pl = CP.new_plan(h, CPb.DIR_BWD_FILTER, f1, c, x, fdesc((64, 64, 3, 3), BF16, fmt=fmt), y)
            assert ("wgrad_pipe_tc" if pipe else "wgrad_tc") in pl.gemm_expr and pl.deterministic and pl.align == 16
            p, bk = pl.gemm, CPb.TCP_BK if pipe else CT.TC_BK
            assert (p.gm, p.gn, p.gk) == (64, 576, 64 * 56 * 56) and p.splits > 1 and p.k_per_split % bk == 0
            assert list(p.red_step) == CP.digit_step(bk, [64, 1, 56, 56])
            assert (p.splits - 1) * p.k_per_split < p.gk <= p.splits * p.k_per_split
            assert pl.workspace == p.splits * 64 * 576 * 4 and pl.fold.flags & CPb.FLAG_CIN
            bn = int(pl.gemm_expr[:-1].split(", ")[2]) if pipe else CT.WG_BN
            assert pl.gemm_grid == (1, -(-576 // bn), p.splits)
            if pipe:
                cfg = tuple(int(v) for v in pl.gemm_expr[:-1].split(", ")[1:])
                assert cfg in CT.WGP_TILES and pl.threads == cfg[2] * cfg[3] * 32
                assert pl.smem == 3 * (cfg[0] + cfg[1]) * 64 * 2
    # forced tilings of either kernel are obeyed
    for forced in ((CT.WGP_TILES[0], 3), (CT.WGP_TILES[1], 1), (128, 2)):
        monkeypatch.setitem(tuning.conv.TC_FORCE, CPb.DIR_BWD_FILTER, forced)
        pl = CP.new_plan(h, CPb.DIR_BWD_FILTER, f1, c, x, fdesc((64, 64, 3, 3), BF16, fmt=NHWC), y)
        cfg = forced[0] if type(forced[0]) is tuple else (forced[0],)
        assert pl.gemm_expr == CT._tc_expr("bf16", CPb.DIR_BWD_FILTER, cfg) and pl.splits == forced[1]
    monkeypatch.delitem(tuning.conv.TC_FORCE, CPb.DIR_BWD_FILTER)
    # dy not packed (positions unevenly spaced): wgrad_tc
    yg = tdesc((64, 64, 56, 56), BF16, strides=(56 * 64 * 64, 1, 64 * 64, 64))
    pl = CP.new_plan(h, CPb.DIR_BWD_FILTER, f1, c, x, fdesc((64, 64, 3, 3), BF16, fmt=NHWC), yg)
    assert "wgrad_tc" in pl.gemm_expr and CPb.wgp_refusal(pl.problem)
    # the 7x7 layer: one split, dw written directly (no workspace)
    x7, y7 = tdesc((64, 512, 7, 7), BF16, NHWC), tdesc((64, 512, 7, 7), BF16, NHWC)
    pl = CP.new_plan(h, CPb.DIR_BWD_FILTER, f1, c, x7, fdesc((512, 512, 3, 3), BF16, fmt=NHWC), y7)
    assert "wgrad_" in pl.gemm_expr and pl.splits == 1 and pl.workspace == 0 and pl.fold is None
    for xx, yy in ((tdesc((2, 12, 8, 8), BF16, NHWC), tdesc((2, 8, 8, 8), BF16, NHWC)),   # C % 8
                   (tdesc((2, 16, 8, 8), BF16, NCHW), tdesc((2, 8, 8, 8), BF16, NHWC)),   # NCHW x
                   (tdesc((2, 16, 8, 8), F32, NHWC), tdesc((2, 8, 8, 8), F32, NHWC))):    # fp32
        dt = xx.dtype
        pl = CP.new_plan(h, CPb.DIR_BWD_FILTER, f1, c, xx, fdesc((8, xx.dims[1], 3, 3), dt, fmt=NHWC), yy)
        assert pl.gemm_expr.startswith("pydnn::conv::implicit_gemm<2")


@pytest.mark.parametrize("case", TC_EMU)
@pytest.mark.parametrize("mode", [XCORR, CONV])
def test_tensor_core_plan_index_math_emulated(case, mode, rng):
    """The tensor-core plan's parameters (channel-innermost reduction, 32-deep digit steps) address the
    operands as the reference needs."""
    xd, k, filt, pad, st, dil = case
    c = cdesc(pad, st, dil, mode)
    wd = (k, xd[1]) + filt
    yd = (xd[0], k) + ref.out_dims(xd[2:], filt, pad, st, dil)
    xs, ys = packed_strides(xd, NHWC), packed_strides(yd, NHWC)
    xdsc, ydsc, wdsc = tdesc(xd, F16, strides=xs), tdesc(yd, F16, strides=ys), fdesc(wd, F16, fmt=NHWC)
    pl = CP.new_plan(cpu_handle(), CPb.DIR_FWD, pydnn.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, c, xdsc, wdsc, ydsc)
    assert "fwd_tc" in pl.gemm_expr and pl.gemm.flags & CPb.FLAG_CIN
    assert list(pl.gemm.red_step) == CP.digit_step(CT.TC_BK, list(pl.gemm.red_size))
    x, w = rng.standard_normal(xd), rng.standard_normal(wd)
    ysize = int(np.prod(yd))
    got = _gather_tensor(emulate(pl, CPb.DIR_FWD, _scatter(x, xs, int(np.prod(xd))), _scatter(w, wdsc.strides,
                                                                                            int(np.prod(wd))), ysize),
                         yd, ys)
    np.testing.assert_allclose(got, ref.forward_raw(x, w, pad, st, dil, 1, mode == XCORR), rtol=1e-10, atol=1e-10)


def test_tensor_core_refusals():
    h = cpu_handle()
    pre = pydnn.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM
    c = cdesc((1, 1), (1, 1), (1, 1), ctype=F32)
    ok = (tdesc((2, 16, 8, 8), BF16, NHWC), fdesc((8, 16, 3, 3), BF16, NHWC), tdesc((2, 8, 8, 8), BF16, NHWC))
    assert pydnn.get_convolution_forward_workspace_size(h, ok[0], ok[1], c, ok[2], pre) == 0
    bad = [
        ((tdesc((2, 16, 8, 8), F32, NHWC), fdesc((8, 16, 3, 3), F32, NHWC), tdesc((2, 8, 8, 8), F32, NHWC), c),
         "half and bfloat16 data only"),
        ((tdesc((2, 12, 8, 8), BF16, NHWC), fdesc((8, 12, 3, 3), BF16, NHWC), tdesc((2, 8, 8, 8), BF16, NHWC), c),
         "multiples of 8 (C 12, K 8)"),
        ((tdesc((2, 16, 8, 8), BF16, NCHW),) + ok[1:] + (c,), "channels innermost (NHWC)"),
        ((ok[0], fdesc((8, 16, 3, 3), BF16, NCHW), ok[2], c), "filter in NHWC format"),
        # depthwise (C/g 1): outside the grouped tensor-core path (grouped.py), the dense kernels' reason
        ((ok[0], fdesc((16, 1, 3, 3), BF16, NHWC), tdesc((2, 16, 8, 8), BF16, NHWC),
          cdesc((1, 1), (1, 1), (1, 1), groups=16)), "groupCount 1"),
    ]
    # groups 2 (C/g 8, K/g 4): the grouped path packs both groups into one supergroup (the filter packed
    # into the workspace)
    assert pydnn.get_convolution_forward_workspace_size(h, ok[0], fdesc((8, 8, 3, 3), BF16, NHWC),
                                                        cdesc((1, 1), (1, 1), (1, 1), groups=2), ok[2], pre) > 0
    for (x, w, y, conv), needle in bad:
        _check(pydnn.get_convolution_forward_workspace_size, (h, x, w, conv, y, pre), NS, needle)
    bd1 = pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_1
    bw = pydnn.get_convolution_backward_data_workspace_size
    assert bw(h, ok[1], ok[2], c, ok[0], bd1) == 0
    # C = 64, stride 1: outside the explicit GEMM's small-channel / strided domain (convolution_gemm.py), so
    # ALGO_1 refuses with the tensor cores' reason (C < 64 or a stride would take the explicit GEMM)
    x64 = tdesc((2, 64, 8, 8), BF16, NHWC)
    _check(bw, (h, fdesc((12, 64, 3, 3), BF16, NHWC), tdesc((2, 12, 8, 8), BF16, NHWC), c, x64, bd1), NS,
           "multiples of 8 (C 64, K 12)")
    _check(bw, (h, fdesc((8, 64, 3, 3), BF16, NHWC), tdesc((2, 8, 8, 8), BF16, NCHW), c, x64, bd1), NS,
           "needs dyDesc with channels innermost")
    fma = cdesc((1, 1), (1, 1), (1, 1))
    pydnn.set_convolution_math_type(fma, pydnn.PYDNN_FMA_MATH)
    _check(pydnn.get_convolution_forward_workspace_size, (h, ok[0], ok[1], fma, ok[2], pre), NS, "FMA math type")
    r = pydnn.get_convolution_forward_algorithm_v7(h, ok[0], ok[1], c, ok[2], 8)
    assert r[0].algo == pre and FWD_IG in [p.algo for p in r[1:3]]  # GEMM (im2col + tensor cores) may rank 2nd
    r = pydnn.get_convolution_forward_algorithm_v7(h, ok[0], ok[1], fma, ok[2], 8)
    assert r[0].algo == FWD_IG and next(p for p in r if p.algo == pre).status == NS


def test_split_k_plan():
    h = cpu_handle()
    c = cdesc((1, 1), (1, 1), (1, 1))
    x, w, y = tdesc((64, 64, 56, 56)), fdesc((64, 64, 3, 3)), tdesc((64, 64, 56, 56))
    pl = CP.new_plan(h, CPb.DIR_BWD_FILTER, BWD_F1, c, x, w, y)
    p = pl.gemm
    assert p.splits > 1 and p.k_per_split % CI.BK == 0 and p.splits * p.k_per_split >= p.gk
    assert (p.splits - 1) * p.k_per_split < p.gk  # no empty slice
    assert pl.workspace == p.splits * p.gm * p.gn * 4
    assert pl.gemm_grid == (1, 9, p.splits)


def test_kernels_compile_without_spills():
    """The implicit GEMM keeps its tile state in registers (ptxas: no stack frame, no spills)."""
    from pydnn._build import cache
    from pydnn._build.manifest import COMMON_OPTIONS
    from pydnn._cuda import nvrtc

    unit = next(u for u in CP.kernel_units() if u.name == "convolution.f32")
    text, _ = cache.unit_inputs(unit)
    _, lowered, log = nvrtc.compile_cubin(text, unit.source, unit.exprs, "sm_90",
                                          COMMON_OPTIONS + ("--ptxas-options=-v",), [str(cache.ptx_dir())])
    frames = re.findall(r"(\d+) bytes stack frame, (\d+) bytes spill stores", log)
    assert len(frames) == len(unit.exprs)
    assert all(int(a) == 0 and int(b) == 0 for a, b in frames), frames


def test_c_api_declarations():
    from pydnn.capi import decl
    protos = decl.prototypes()
    for name in ("pydnnConvolutionForward(", "pydnnSetConvolutionNdDescriptor(", "pydnnConvolutionBackwardBias(",
                 "pydnnGetConvolutionForwardAlgorithmMaxCount("):
        assert any(name in p for p in protos), name
    assert "pydnnConvolutionDescriptor_t" in decl.header_text()


del itertools


def test_c_program_descriptors(tmp_path):
    """tests/c/convolution_gpu.c's first half (descriptors, shape queries, errors through the C face) runs
    without a GPU; with one, the whole program (the GPU suite checks its numbers)."""
    from cprog import build_and_run

    r = build_and_run("convolution_gpu", tmp_path, extra=["-ldl", "-lm"])
    assert "FAIL" not in r.stdout, r.stdout + r.stderr
    assert r.returncode in (0, 3), r.stdout + r.stderr
    for what in ("get nd descriptor", "message names padA[1]", "nd output dims"):
        assert f"ok {what}" in r.stdout, r.stdout


def test_perf_struct_marshalling(monkeypatch):
    """The C face writes the records into the caller's cudnn-style perf array (at most requestedAlgoCount)
    and their number into returnedAlgoCount."""
    import cffi
    from pydnn.capi import decl, impl
    from pydnn.ops.convolution.algorithms import ConvolutionPerf

    ffi = cffi.FFI()
    ffi.cdef(decl.types_block())
    proto = next(p for p in decl.prototypes() if "pydnnGetConvolutionForwardAlgorithm_v7(" in p)
    m = impl.Marshal(ffi, proto)
    monkeypatch.setattr(m, "obj", lambda ptr, name, ctype: name)
    recs = [ConvolutionPerf(1, 0, 0.5, 128, 1, 2), ConvolutionPerf(0, 0, 0.75, 0, 1, 0),
            ConvolutionPerf(2, NS, -1.0, 0, 0, 0)]
    seen = []
    monkeypatch.setattr(pydnn, "get_convolution_forward_algorithm_v7", lambda *a: seen.append(a) or recs)
    returned = ffi.new("int *", -1)
    perf = ffi.new("pydnnConvolutionFwdAlgoPerf_t[2]")
    m(ffi.NULL, ffi.NULL, ffi.NULL, ffi.NULL, ffi.NULL, 2, returned, perf)
    assert seen == [("handle", "srcDesc", "filterDesc", "convDesc", "destDesc", 2)]
    assert returned[0] == 2
    assert (perf[0].algo, perf[0].status, perf[0].time, perf[0].memory, perf[0].determinism, perf[0].mathType) == \
        (1, 0, 0.5, 128, 1, 2)
    assert (perf[1].algo, perf[1].time, perf[1].memory) == (0, 0.75, 0)
    h = impl.parse(proto)[2]
    assert [k for k, _, n in h if n == "perfResults"] == ["struct_out"]


def test_tuning_cache(tmp_path, monkeypatch):
    from pydnn.ops.convolution import algorithms as A

    monkeypatch.setenv("PYDNN_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("PYDNN_CONV_TUNING_CACHE", raising=False)
    c = cdesc((1, 1), (1, 1), (1, 1))
    x, w, y = tdesc((2, 4, 8, 8)), fdesc((6, 4, 3, 3)), tdesc((2, 6, 8, 8))
    key = A.tuning_key("dev|sm_90", CPb.DIR_FWD, c, x, w, y, 1024)
    assert A.tuning_get(key) is None
    perfs = [A.ConvolutionPerf(0, 0, 0.25, 0, 1, 0), A.ConvolutionPerf(4, NS, -1.0, 0, 0, 0, "not implemented")]
    A.tuning_put(key, perfs)
    assert (tmp_path / A.TUNING_FILE).exists()
    A._tuning["path"] = None  # as a new process would: read from disk
    got = A.tuning_get(key)
    assert [p.as_tuple() for p in got] == [p.as_tuple() for p in perfs] and got[1].message == "not implemented"
    # anything the answer depends on changes the key
    assert A.tuning_key("dev|sm_90", CPb.DIR_FWD, c, x, w, y, 0) != key
    assert A.tuning_key("other|sm_90", CPb.DIR_FWD, c, x, w, y, 1024) != key
    assert A.tuning_key("dev|sm_90", CPb.DIR_BWD_DATA, c, x, w, y, 1024) != key
    assert A.tuning_key("dev|sm_90", CPb.DIR_FWD, c, x, w, y, 1024, aligned16=False) != key
    pydnn.set_convolution_math_type(c, pydnn.PYDNN_FMA_MATH)
    assert A.tuning_key("dev|sm_90", CPb.DIR_FWD, c, x, w, y, 1024) != key
    monkeypatch.setenv("PYDNN_CONV_TUNING_CACHE", "0")
    assert A.tuning_get(key) is None
    A.tuning_put("other", perfs)
    monkeypatch.setenv("PYDNN_CONV_TUNING_CACHE", "1")
    A._tuning["path"] = None
    assert A.tuning_get("other") is None and A.tuning_get(key) is not None
    (tmp_path / A.TUNING_FILE).write_text("{not json")
    A._tuning["path"] = None
    assert A.tuning_get(key) is None  # a damaged file is ignored (and replaced on the next put)
    A.tuning_put(key, perfs)
    A._tuning["path"] = None
    assert A.tuning_get(key) is not None


def test_bias_activation_plan_is_cached_per_activation(monkeypatch):
    """A repeated ConvolutionBiasActivationForward reuses its plan (it used to plan every call); changing the
    activation descriptor's settings plans anew."""
    h = cpu_handle()
    x, y, w = tdesc((2, 8, 9, 9), BF16, NHWC), tdesc((2, 8, 9, 9), BF16, NHWC), fdesc((8, 8, 3, 3), BF16, NHWC)
    b, c = tdesc((1, 8, 1, 1), BF16), cdesc((1, 1), (1, 1), (1, 1))
    act = pydnn.create_activation_descriptor()
    pydnn.set_activation_descriptor(act, pydnn.PYDNN_ACTIVATION_RELU, pydnn.PYDNN_NOT_PROPAGATE_NAN, 0.0)
    made, ran = [], []
    new_plan = CP.new_plan
    monkeypatch.setattr(CP, "new_plan", lambda *a: made.append(a) or new_plan(*a))
    monkeypatch.setattr(CAPI, "run_plan", lambda handle, pl, *a: ran.append((pl, pl.gemm.act)))
    algo = pydnn.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM
    call = lambda: pydnn.convolution_bias_activation_forward(h, 1.0, x, X, w, W, c, algo, 0, 0, 0.0, y, Y, b, WS,  # noqa
                                                             act, y, Y)
    call()
    call()
    assert len(made) == 1 and ran[0] == ran[1]
    pydnn.set_activation_descriptor(act, pydnn.PYDNN_ACTIVATION_SIGMOID, pydnn.PYDNN_NOT_PROPAGATE_NAN, 0.0)
    call()
    assert len(made) == 2 and ran[2][0] is not ran[0][0] and ran[2][1] != ran[0][1]
