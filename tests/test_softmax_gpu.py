"""Softmax on the GPU against the float64 reference: algos x modes x dtypes x layouts, odd lengths."""
import numpy as np
import pytest

import pydnn
from devtensor import DevTensor, assert_close
from pydnn.reference import softmax as ref
from pydnn.tensor import packed_strides

pytestmark = pytest.mark.gpu

ALGOS = [pydnn.PYDNN_SOFTMAX_FAST, pydnn.PYDNN_SOFTMAX_ACCURATE, pydnn.PYDNN_SOFTMAX_LOG]
MODES = [pydnn.PYDNN_SOFTMAX_MODE_INSTANCE, pydnn.PYDNN_SOFTMAX_MODE_CHANNEL]
DTYPES = [pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DATA_HALF, pydnn.PYDNN_DATA_BFLOAT16, pydnn.PYDNN_DATA_DOUBLE]

CASES = [  # dims, layout
    ((2, 37, 3, 5), "nchw"),
    ((2, 37, 3, 5), "nhwc"),
    ((3, 5, 4, 6), (400, 80, 16, 2)),     # gaps everywhere
    ((4, 1000, 1, 1), "nchw"),
    ((2, 4097, 1, 1), "nchw"),            # odd length past a register tile
    ((2, 20000, 1, 1), "nchw"),           # longer than the register kernels hold (fp32 VEC=1)
    ((5, 3, 1, 1), "nchw"),
    ((7, 1, 1, 1), "nchw"),               # rows of one element
    ((2, 16, 8, 8, 3), "nchw"),           # 5-d
    ((64, 4096, 1, 1), "nchw"),           # the benchmark's row length
]


def _tensor(dims, layout, dtype):
    if layout == "nchw":
        return DevTensor(dims, dtype)
    if layout == "nhwc":
        return DevTensor(dims, dtype, packed_strides(dims, pydnn.PYDNN_TENSOR_NHWC))
    return DevTensor(dims, dtype, layout)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("algo", ALGOS)
def test_forward(handle, rng, algo, mode, dtype):
    for dims, layout in CASES:
        x, y = _tensor(dims, layout, dtype), _tensor(dims, layout, dtype)
        xv = x.random(rng, -4, 4)
        pydnn.softmax_forward(handle, algo, mode, 1.0, x.desc, x.ptr, 0.0, y.desc, y.ptr)
        want = ref.forward(algo, mode, 1.0, xv, 0.0, None)
        assert_close(y.download(), want, dtype, f"fwd {dims} {layout}", scale=ref.forward_terms(algo, mode, xv))
        y.check_untouched()
        y0 = y.random(rng)
        alpha, beta = float(rng.uniform(-2, 2)), float(rng.uniform(-2, 2))
        pydnn.softmax_forward(handle, algo, mode, alpha, x.desc, x.ptr, beta, y.desc, y.ptr)
        want = ref.forward(algo, mode, alpha, xv, beta, y0)
        scale = abs(alpha) * ref.forward_terms(algo, mode, xv) + np.abs(beta * y0)
        assert_close(y.download(), want, dtype, f"fwd blend {dims} {layout}", scale=scale)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("algo", ALGOS)
def test_backward(handle, rng, algo, mode, dtype):
    for dims, layout in CASES:
        x, y, dy, dx = (_tensor(dims, layout, dtype) for _ in range(4))
        x.random(rng, -4, 4)
        pydnn.softmax_forward(handle, algo, mode, 1.0, x.desc, x.ptr, 0.0, y.desc, y.ptr)
        yv = y.download()
        dyv = dy.random(rng)
        pydnn.softmax_backward(handle, algo, mode, 1.0, y.desc, y.ptr, dy.desc, dy.ptr, 0.0, dx.desc, dx.ptr)
        want = ref.backward(algo, mode, 1.0, yv, dyv, 0.0, None)
        terms = ref.backward_terms(algo, mode, yv, dyv)
        assert_close(dx.download(), want, dtype, f"bwd {dims} {layout}", scale=terms)
        dx.check_untouched()
        dx0 = dx.random(rng)
        alpha, beta = float(rng.uniform(-2, 2)), float(rng.uniform(-2, 2))
        pydnn.softmax_backward(handle, algo, mode, alpha, y.desc, y.ptr, dy.desc, dy.ptr, beta, dx.desc, dx.ptr)
        want = ref.backward(algo, mode, alpha, yv, dyv, beta, dx0)
        assert_close(dx.download(), want, dtype, f"bwd blend {dims} {layout}",
                     scale=abs(alpha) * terms + np.abs(beta * dx0))


@pytest.mark.parametrize("algo", ALGOS)
def test_huge_inputs_do_not_overflow(handle, algo):
    dims = (2, 6, 1, 1)
    v = np.array([[1e4, -1e4, 0, 88, 1e4, -50], [-1e4, -1e4, -1e4, -1e4, -1e4, -9999]]).reshape(dims)
    for mode in MODES:
        x, y = DevTensor(dims, pydnn.PYDNN_DATA_FLOAT), DevTensor(dims, pydnn.PYDNN_DATA_FLOAT)
        xv = x.upload(v)
        pydnn.softmax_forward(handle, algo, mode, 1.0, x.desc, x.ptr, 0.0, y.desc, y.ptr)
        out = y.download()
        assert np.isfinite(out).all(), out
        assert_close(out, ref.forward(algo, mode, 1.0, xv, 0.0, None), pydnn.PYDNN_DATA_FLOAT, "huge",
                     scale=ref.forward_terms(algo, mode, xv))


def test_nan_in_a_row_makes_that_row_nan(handle):
    dims = (3, 5, 1, 1)
    v = np.arange(15, dtype=np.float64).reshape(dims) / 10
    v[1, 2] = np.nan
    x, y = DevTensor(dims, pydnn.PYDNN_DATA_FLOAT), DevTensor(dims, pydnn.PYDNN_DATA_FLOAT)
    x.upload(v)
    pydnn.softmax_forward(handle, pydnn.PYDNN_SOFTMAX_ACCURATE, pydnn.PYDNN_SOFTMAX_MODE_CHANNEL, 1.0,
                          x.desc, x.ptr, 0.0, y.desc, y.ptr)
    out = y.download()
    assert np.isnan(out[1]).all() and np.isfinite(out[0]).all() and np.isfinite(out[2]).all()


def test_unaligned_pointer_takes_the_scalar_path(handle, rng):
    """A row base that is not 16-byte aligned must still be right (the vector kernel is not used)."""
    dims = (8, 256, 1, 1)
    buf = pydnn.DeviceArray((8 * 256 + 1,), np.float32)
    x = DevTensor(dims, pydnn.PYDNN_DATA_FLOAT)
    xv = x.random(rng)
    out = DevTensor(dims, pydnn.PYDNN_DATA_FLOAT)
    pydnn.softmax_forward(handle, pydnn.PYDNN_SOFTMAX_ACCURATE, pydnn.PYDNN_SOFTMAX_MODE_INSTANCE, 1.0,
                          x.desc, x.ptr, 0.0, out.desc, buf.ptr + 4)
    from pydnn._cuda import driver

    driver.synchronize()
    got = buf.to_numpy()[1:].reshape(dims).astype(np.float64)
    assert_close(got, ref.forward(pydnn.PYDNN_SOFTMAX_ACCURATE, pydnn.PYDNN_SOFTMAX_MODE_INSTANCE, 1.0, xv, 0, None),
                 pydnn.PYDNN_DATA_FLOAT, "unaligned")
