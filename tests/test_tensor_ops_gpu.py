"""Tensor ops on the GPU against float64 references: every op and dtype, broadcasting, strides with gaps,
in-place, alpha/beta, NCHW <-> NHWC, conversions between all eight data types."""
import numpy as np
import pytest

import pydnn
from devtensor import DevTensor, assert_close
from pydnn.reference import dtypes as rd
from pydnn.reference import tensor_ops as ref
from pydnn.tensor import packed_strides

pytestmark = pytest.mark.gpu

FLOATS = [pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DATA_HALF, pydnn.PYDNN_DATA_BFLOAT16, pydnn.PYDNN_DATA_DOUBLE]
ALL = FLOATS + [pydnn.PYDNN_DATA_INT8, pydnn.PYDNN_DATA_UINT8, pydnn.PYDNN_DATA_INT32, pydnn.PYDNN_DATA_INT64]
OPS = [pydnn.PYDNN_OP_TENSOR_ADD, pydnn.PYDNN_OP_TENSOR_MUL, pydnn.PYDNN_OP_TENSOR_MIN, pydnn.PYDNN_OP_TENSOR_MAX,
       pydnn.PYDNN_OP_TENSOR_SQRT, pydnn.PYDNN_OP_TENSOR_NOT]
NHWC = pydnn.PYDNN_TENSOR_NHWC


def _op_desc(op, nan=0):
    d = pydnn.create_op_tensor_descriptor()
    pydnn.set_op_tensor_descriptor(d, op, pydnn.PYDNN_DATA_FLOAT, nan)
    return d


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", OPS)
def test_op_tensor(handle, rng, op, dtype):
    cases = [((2, 3, 5, 7), (2, 3, 5, 7), None), ((2, 3, 5, 7), (1, 3, 1, 1), None),   # bias-like B
             ((3, 17, 9, 11), (3, 17, 9, 11), "nhwc"), ((1, 1, 1, 100003), (1, 1, 1, 1), None),
             ((2, 3, 4, 5), (2, 1, 4, 1), (200, 50, 12, 2))]
    for cdims, bdims, layout in cases:
        strides = packed_strides(cdims, NHWC) if layout == "nhwc" else layout
        a, c = DevTensor(cdims, dtype, strides), DevTensor(cdims, dtype, strides)
        b = DevTensor(bdims, dtype)
        lo = 0.0 if op == pydnn.PYDNN_OP_TENSOR_SQRT else -3.0
        av, bv = a.random(rng, lo, 3.0), b.random(rng)
        desc = _op_desc(op)
        a1 = 1.0 if op == pydnn.PYDNN_OP_TENSOR_SQRT else float(rng.uniform(-2, 2))
        a2 = float(rng.uniform(-2, 2))
        pydnn.op_tensor(handle, desc, a1, a.desc, a.ptr, a2, b.desc, b.ptr, 0.0, c.desc, c.ptr)
        want = ref.op_tensor(op, a1, av, a2, bv, 0.0, None)
        scale = np.abs(a1 * av) + (0 if op in (pydnn.PYDNN_OP_TENSOR_SQRT,) else np.abs(a2 * bv))
        if op == pydnn.PYDNN_OP_TENSOR_NOT:
            scale = 1 + np.abs(a1 * av)
        if op == pydnn.PYDNN_OP_TENSOR_SQRT:
            scale = None
        assert_close(c.download(), want, dtype, f"op {op} {cdims}", scale=scale)
        c.check_untouched()
        c0 = c.random(rng)
        beta = float(rng.uniform(-2, 2))
        pydnn.op_tensor(handle, desc, a1, a.desc, a.ptr, a2, b.desc, b.ptr, beta, c.desc, c.ptr)
        want = ref.op_tensor(op, a1, av, a2, bv, beta, c0)
        s2 = (np.abs(want - beta * c0) if scale is None else scale) + np.abs(beta * c0)
        assert_close(c.download(), want, dtype, f"op {op} blend {cdims}", scale=s2)


def test_op_tensor_in_place_and_nan(handle, rng):
    dims = (4, 8, 6, 6)
    a, b = DevTensor(dims, pydnn.PYDNN_DATA_FLOAT), DevTensor(dims, pydnn.PYDNN_DATA_FLOAT)
    av, bv = a.random(rng), b.random(rng)
    pydnn.op_tensor(handle, _op_desc(pydnn.PYDNN_OP_TENSOR_MUL), 1.0, a.desc, a.ptr, 1.0, b.desc, b.ptr, 0.0,
                    a.desc, a.ptr)  # C is A
    assert_close(a.download(), av * bv, pydnn.PYDNN_DATA_FLOAT, "in place")
    v = av.copy()
    v[0, 0, 0, :3] = np.nan
    av = a.upload(v)
    for nan in (0, 1):
        c = DevTensor(dims, pydnn.PYDNN_DATA_FLOAT)
        pydnn.op_tensor(handle, _op_desc(pydnn.PYDNN_OP_TENSOR_MAX, nan), 1.0, a.desc, a.ptr, 1.0, b.desc, b.ptr,
                        0.0, c.desc, c.ptr)
        out = c.download()
        assert np.isnan(out[0, 0, 0, :3]).all() == bool(nan)
        assert_close(out, ref.op_tensor(pydnn.PYDNN_OP_TENSOR_MAX, 1, av, 1, bv, 0, None, propagate_nan=bool(nan)),
                     pydnn.PYDNN_DATA_FLOAT, "max nan")


@pytest.mark.parametrize("dtype", FLOATS)
def test_add_scale_set(handle, rng, dtype):
    for cdims, adims, layout in [((2, 3, 5, 7), (1, 3, 1, 1), None), ((2, 3, 5, 7), (2, 3, 5, 7), "nhwc"),
                                 ((3, 4, 5, 6), (1, 1, 1, 6), (500, 120, 24, 3))]:
        strides = packed_strides(cdims, NHWC) if layout == "nhwc" else layout
        a, c = DevTensor(adims, dtype), DevTensor(cdims, dtype, strides)
        av = a.random(rng)
        c0 = c.random(rng)
        alpha, beta = float(rng.uniform(-2, 2)), float(rng.uniform(-2, 2))
        pydnn.add_tensor(handle, alpha, a.desc, a.ptr, beta, c.desc, c.ptr)
        want = ref.scaled(alpha, av, beta, c0)
        assert_close(c.download(), want, dtype, f"add {cdims}", scale=np.abs(alpha * av) + np.abs(beta * c0))
        c.check_untouched()
        cv = c.download()
        pydnn.scale_tensor(handle, c.desc, c.ptr, -0.75)
        assert_close(c.download(), -0.75 * cv, dtype, "scale")
        pydnn.set_tensor(handle, c.desc, c.ptr, 2.5)
        assert (c.download() == 2.5).all()
        c.check_untouched()


@pytest.mark.parametrize("dtype", ALL)
def test_set_tensor_every_type(handle, dtype):
    t = DevTensor((3, 5, 7, 2), dtype, (400, 60, 8, 3))
    pydnn.set_tensor(handle, t.desc, t.ptr, 7)
    assert (t.download() == 7).all()
    t.check_untouched()


@pytest.mark.parametrize("ti", ALL)
@pytest.mark.parametrize("to", ALL)
def test_transform_conversions(handle, rng, ti, to):
    dims = (2, 5, 7, 9)
    x = DevTensor(dims, ti)
    y = DevTensor(dims, to, packed_strides(dims, NHWC))
    ints = ti not in FLOATS
    v = rng.integers(-100, 100, dims).astype(np.float64) if ints else rng.uniform(-300, 300, dims)
    if ti == pydnn.PYDNN_DATA_UINT8:
        v = np.abs(v) * 2
    xv = x.upload(v)
    pydnn.transform_tensor(handle, 1.0, x.desc, x.ptr, 0.0, y.desc, y.ptr)
    want = rd.round_to(xv, to)  # rounding to the output type (saturating, nearest even, for integers)
    got = y.download()
    if to in FLOATS:
        assert_close(got, want, to, f"{ti}->{to}")
    else:
        assert (got == want).all(), f"{ti}->{to}: {got.ravel()[:8]} vs {want.ravel()[:8]}"


def test_transform_nchw_nhwc_round_trip_with_blend(handle, rng):
    dims = (3, 37, 19, 23)
    for dtype in FLOATS:
        x = DevTensor(dims, dtype)
        y = DevTensor(dims, dtype, packed_strides(dims, NHWC))
        xv, y0 = x.random(rng), y.random(rng)
        pydnn.transform_tensor(handle, 2.0, x.desc, x.ptr, -1.0, y.desc, y.ptr)
        assert_close(y.download(), 2 * xv - y0, dtype, "nchw->nhwc", scale=np.abs(2 * xv) + np.abs(y0))
        back = DevTensor(dims, dtype)
        pydnn.transform_tensor(handle, 1.0, y.desc, y.ptr, 0.0, back.desc, back.ptr)
        assert (back.download() == y.download()).all()


def test_transform_saturates_and_rounds_to_int8(handle):
    dims = (1, 1, 1, 8)
    x = DevTensor(dims, pydnn.PYDNN_DATA_FLOAT)
    y = DevTensor(dims, pydnn.PYDNN_DATA_INT8)
    x.upload(np.array([-1000, -128.5, -2.5, -0.5, 0.5, 1.5, 127.4, 1e9]).reshape(dims))
    pydnn.transform_tensor(handle, 1.0, x.desc, x.ptr, 0.0, y.desc, y.ptr)
    assert y.download().ravel().tolist() == [-128, -128, -2, 0, 0, 2, 127, 127]
