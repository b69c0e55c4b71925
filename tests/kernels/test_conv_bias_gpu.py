"""ConvolutionBackwardBias (ptx/conv_bias.cu, planned in pydnn/ops/convolution/bias.py) on the GPU against the
float64 reference: the 16-byte row path (NCHW shapes of the CNN demo and long rows that run the unrolled
loop and its tail), the general path (NHWC, padded layouts, rows that are not a multiple of the vector, a
pointer off 16-byte alignment), 1-d / 3-d, alpha / beta blending, every float type, a poisoned output with
its gaps untouched, and bitwise reproducibility run to run."""
import numpy as np
import pytest

import pydnn
from devtensor import DevTensor, assert_close
from pydnn.ops.convolution import bias as B
from pydnn.reference import convolution as ref
from pydnn.reference import dtypes as rd
from pydnn.tensor import DTYPES as TDT, packed_strides

pytestmark = pytest.mark.gpu

F32, F64, F16, BF16 = (pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DATA_DOUBLE, pydnn.PYDNN_DATA_HALF,
                       pydnn.PYDNN_DATA_BFLOAT16)


def _strides(dims, layout):
    if layout == "nchw":
        return tuple(packed_strides(dims, pydnn.PYDNN_TENSOR_NCHW))
    if layout == "nhwc":
        return tuple(packed_strides(dims, pydnn.PYDNN_TENSOR_NHWC))
    s, acc = [0] * len(dims), 1  # "gap": every dim padded by one element
    for i in reversed(range(len(dims))):
        s[i] = acc
        acc *= dims[i] + (1 if i > 0 else 0)
    return tuple(s)


def _vector(dy, itemsize):
    dims5 = (dy.dims[0], dy.dims[1]) + (1,) * (5 - len(dy.dims)) + tuple(dy.dims[2:])
    st = dy.strides
    st5 = (st[0], st[1]) + (0,) * (5 - len(st)) + tuple(st[2:])
    sizes, strides = B.merge_reduced((dims5[0],) + dims5[2:], (st5[0],) + st5[2:])
    return B.vector_width(itemsize, sizes, strides, st5[1], dy.ptr)


def _check(handle, rng, dims, dtype, layout, alphas=((1.0, 0.0), (0.5, -1.0)), want_vector=None):
    dy = DevTensor(dims, dtype, _strides(dims, layout))
    v = dy.random(rng)
    if want_vector is not None:
        assert (_vector(dy, TDT[dtype][0]) > 1) == want_vector, "the case does not take the path it tests"
    bd = (1, dims[1]) + (1,) * (len(dims) - 2)
    db = DevTensor(bd, dtype)
    for alpha, beta in alphas:
        b0 = db.random(rng) if beta else None
        if not beta:
            db.poison()
        pydnn.convolution_backward_bias(handle, alpha, dy.desc, dy.ptr, beta, db.desc, db.ptr)
        want = ref.backward_bias(alpha, v, beta, b0)
        scale = abs(alpha) * ref.backward_bias_raw(np.abs(v)) + (abs(beta) * np.abs(b0) if beta else 0)
        assert_close(db.download(), want, dtype, f"backward bias {dims} {layout}", scale=scale)
    dy.check_untouched()
    return dy, db


@pytest.mark.parametrize("dtype", [BF16, F16, F32, F64])
@pytest.mark.parametrize("dims", [(32, 64, 32, 32), (16, 128, 16, 16), (3, 5, 8, 8), (2, 3, 4, 4, 8)])
def test_row_path(handle, rng, dtype, dims):
    _check(handle, rng, dims, dtype, "nchw", want_vector=True)


@pytest.mark.parametrize("dtype", [BF16, F32])
def test_long_rows_and_tails(handle, rng, dtype):
    # one channel of 2 * 8200 elements: the unrolled loop, then 1..3 tail vectors of a thread
    for n in (2 * 8192 + 8, 4 * 8192 - 8, 3 * 4096 + 24):
        _check(handle, rng, (1, 3, n), dtype, "nchw", alphas=((1.0, 0.0),), want_vector=True)


@pytest.mark.parametrize("dtype", [BF16, F16, F32, F64])
@pytest.mark.parametrize("dims,layout", [((4, 64, 8, 8), "nhwc"), ((3, 7, 5, 6), "nchw"), ((2, 300, 4), "nchw"),
                                         ((2, 5, 3, 4, 5), "nhwc"), ((3, 4, 8, 16), "gap")])
def test_general_path(handle, rng, dtype, dims, layout):
    _check(handle, rng, dims, dtype, layout, want_vector=False if layout != "nchw" else None)


def test_unaligned_pointer(handle, rng):
    """dy one element past a 16-byte boundary: the general path, same sums."""
    dims, dtype = (4, 8, 8, 16), BF16
    n = int(np.prod(dims))
    vals = rng.uniform(-3, 3, n + 8).astype(np.float32).astype(np.float64)
    raw = rd.to_storage(vals, dtype)
    store = pydnn.DeviceArray((n + 8,), raw.dtype)
    store.copy_from_numpy(raw)
    stored = rd.from_storage(raw, dtype)
    d = pydnn.create_tensor_descriptor()
    pydnn.set_tensor_nd_descriptor(d, dtype, 4, dims, packed_strides(dims, pydnn.PYDNN_TENSOR_NCHW))
    db = DevTensor((1, dims[1], 1, 1), dtype)
    db.poison()
    pydnn.convolution_backward_bias(handle, 1.0, d, store.ptr + 2, 0.0, db.desc, db.ptr)
    v = stored[1:n + 1].reshape(dims)
    assert_close(db.download(), ref.backward_bias(1.0, v, 0.0, None), dtype, "unaligned",
                 scale=ref.backward_bias_raw(np.abs(v)))


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_bitwise_reproducible(handle, rng, layout):
    dims, dtype = (16, 64, 16, 16), F32
    dy, db = _check(handle, rng, dims, dtype, layout, alphas=((1.0, 0.0),))
    first = db.buf.to_numpy().copy()
    for _ in range(3):
        db.poison()
        pydnn.convolution_backward_bias(handle, 1.0, dy.desc, dy.ptr, 0.0, db.desc, db.ptr)
        np.testing.assert_array_equal(db.buf.to_numpy().view(np.uint8), first.view(np.uint8))
    assert rd.TOLERANCE[dtype]  # the dtype has a tolerance row (the comparison above is exact)
