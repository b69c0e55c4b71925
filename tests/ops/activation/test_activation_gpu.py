"""Activations on the GPU against the float64 reference: every mode, dtype, layout, alpha/beta."""
import numpy as np
import pytest

import pydnn
from devtensor import DevTensor, assert_close
from pydnn.reference import activation as ref
from pydnn.tensor import packed_strides

pytestmark = pytest.mark.gpu

MODES = [pydnn.PYDNN_ACTIVATION_SIGMOID, pydnn.PYDNN_ACTIVATION_RELU, pydnn.PYDNN_ACTIVATION_TANH,
         pydnn.PYDNN_ACTIVATION_CLIPPED_RELU, pydnn.PYDNN_ACTIVATION_ELU, pydnn.PYDNN_ACTIVATION_IDENTITY,
         pydnn.PYDNN_ACTIVATION_SWISH, pydnn.PYDNN_ACTIVATION_GELU_ERF, pydnn.PYDNN_ACTIVATION_GELU_TANH]
DTYPES = [pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DATA_HALF, pydnn.PYDNN_DATA_BFLOAT16, pydnn.PYDNN_DATA_DOUBLE]

# dense, odd sizes (vector tail), NHWC, and strided with gaps
SHAPES = [
    ((2, 3, 5, 7), None),
    ((1, 1, 1, 1), None),
    ((3, 17, 31, 33), "nhwc"),
    ((2, 3, 4, 5), (200, 50, 12, 2)),  # gaps between elements and rows
    ((1, 1, 1, 100003), None),
]


def _tensor(dims, layout, dtype):
    if layout == "nhwc":
        return DevTensor(dims, dtype, packed_strides(dims, pydnn.PYDNN_TENSOR_NHWC))
    return DevTensor(dims, dtype, layout)


def _desc(mode, coef=1.5, nan=pydnn.PYDNN_NOT_PROPAGATE_NAN, swish_beta=1.0):
    a = pydnn.create_activation_descriptor()
    pydnn.set_activation_descriptor(a, mode, nan, coef)
    pydnn.set_activation_descriptor_swish_beta(a, swish_beta)
    return a


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
def test_forward(handle, rng, mode, dtype):
    for dims, layout in SHAPES:
        x, y = _tensor(dims, layout, dtype), _tensor(dims, layout, dtype)
        xv = x.random(rng)
        a = _desc(mode, coef=float(rng.uniform(0.5, 2.0)), swish_beta=float(rng.uniform(0.5, 2.0)))
        kw = {"coef": pydnn.get_activation_descriptor(a)[2],
              "swish_beta": pydnn.get_activation_descriptor_swish_beta(a)}
        pydnn.activation_forward(handle, a, 1.0, x.desc, x.ptr, 0.0, y.desc, y.ptr)
        assert_close(y.download(), ref.forward(mode, 1.0, xv, 0.0, None, **kw), dtype, f"fwd {dims}")
        y.check_untouched()
        # alpha/beta blending on top of fresh y
        y0 = y.random(rng)
        alpha, beta = float(rng.uniform(-2, 2)), float(rng.uniform(-2, 2))
        pydnn.activation_forward(handle, a, alpha, x.desc, x.ptr, beta, y.desc, y.ptr)
        scale = np.abs(alpha * ref.act(mode, xv, **kw)) + np.abs(beta * y0)
        assert_close(y.download(), ref.forward(mode, alpha, xv, beta, y0, **kw), dtype, f"fwd blend {dims}",
                     scale=scale)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
def test_backward(handle, rng, mode, dtype):
    for dims, layout in SHAPES:
        x, y, dy, dx = (_tensor(dims, layout, dtype) for _ in range(4))
        a = _desc(mode, coef=float(rng.uniform(0.5, 2.0)), swish_beta=float(rng.uniform(0.5, 2.0)))
        kw = {"coef": pydnn.get_activation_descriptor(a)[2],
              "swish_beta": pydnn.get_activation_descriptor_swish_beta(a)}
        xv = x.random(rng)
        pydnn.activation_forward(handle, a, 1.0, x.desc, x.ptr, 0.0, y.desc, y.ptr)
        yv = y.download()
        dyv = dy.random(rng)
        pydnn.activation_backward(handle, a, 1.0, y.desc, y.ptr, dy.desc, dy.ptr, x.desc, x.ptr, 0.0,
                                  dx.desc, dx.ptr)
        terms = ref.act_grad_terms(mode, xv, yv, **kw) * np.abs(dyv)
        assert_close(dx.download(), ref.backward(mode, 1.0, yv, dyv, xv, 0.0, None, **kw), dtype, f"bwd {dims}",
                     scale=terms)
        dx.check_untouched()
        dx0 = dx.random(rng)
        alpha, beta = float(rng.uniform(-2, 2)), float(rng.uniform(-2, 2))
        pydnn.activation_backward(handle, a, alpha, y.desc, y.ptr, dy.desc, dy.ptr, x.desc, x.ptr, beta,
                                  dx.desc, dx.ptr)
        scale = abs(alpha) * terms + np.abs(beta * dx0)
        assert_close(dx.download(), ref.backward(mode, alpha, yv, dyv, xv, beta, dx0, **kw), dtype,
                     f"bwd blend {dims}", scale=scale)


@pytest.mark.parametrize("nan_opt", [0, 1])
def test_relu_nan_propagation(handle, nan_opt):
    dims = (1, 1, 4, 4)
    x, y = DevTensor(dims, pydnn.PYDNN_DATA_FLOAT), DevTensor(dims, pydnn.PYDNN_DATA_FLOAT)
    v = np.linspace(-2, 2, 16).reshape(dims)
    v[0, 0, 1, 1] = np.nan
    xv = x.upload(v)
    a = _desc(pydnn.PYDNN_ACTIVATION_RELU, nan=nan_opt)
    pydnn.activation_forward(handle, a, 1.0, x.desc, x.ptr, 0.0, y.desc, y.ptr)
    out = y.download()
    assert np.isnan(out[0, 0, 1, 1]) == bool(nan_opt)
    want = ref.act(pydnn.PYDNN_ACTIVATION_RELU, xv, propagate_nan=bool(nan_opt))
    assert_close(out, want, pydnn.PYDNN_DATA_FLOAT)


def test_extreme_inputs_do_not_overflow(handle):
    """sigmoid, tanh, swish and ELU stay finite and exact at +-1e4 and +-88 (no exp overflow to NaN)."""
    dims = (1, 1, 1, 8)
    v = np.array([[[[-1e4, -88.7, -20, -1e-3, 1e-3, 20, 88.7, 1e4]]]])
    for mode in (pydnn.PYDNN_ACTIVATION_SIGMOID, pydnn.PYDNN_ACTIVATION_TANH, pydnn.PYDNN_ACTIVATION_SWISH,
                 pydnn.PYDNN_ACTIVATION_ELU, pydnn.PYDNN_ACTIVATION_GELU_ERF, pydnn.PYDNN_ACTIVATION_GELU_TANH):
        for dtype in (pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DATA_BFLOAT16):
            x, y = DevTensor(dims, dtype), DevTensor(dims, dtype)
            xv = x.upload(v)
            a = _desc(mode, coef=1.0)
            pydnn.activation_forward(handle, a, 1.0, x.desc, x.ptr, 0.0, y.desc, y.ptr)
            out = y.download()
            assert np.isfinite(out).all(), (mode, out)
            assert_close(out, ref.act(mode, xv, coef=1.0), dtype, f"mode {mode}")


def test_in_place(handle, rng):
    dims = (4, 8, 9, 10)
    x = DevTensor(dims, pydnn.PYDNN_DATA_FLOAT)
    xv = x.random(rng)
    a = _desc(pydnn.PYDNN_ACTIVATION_TANH)
    pydnn.activation_forward(handle, a, 1.0, x.desc, x.ptr, 0.0, x.desc, x.ptr)
    assert_close(x.download(), np.tanh(xv), pydnn.PYDNN_DATA_FLOAT)


def test_torch_tensors_and_large_offsets(handle, rng):
    """torch tensors go in directly (__cuda_array_interface__), and a too-small one is refused."""
    torch = pytest.importorskip("torch")
    t = torch.from_numpy(rng.standard_normal((3, 5, 7, 9)).astype(np.float32)).cuda()
    out = torch.full_like(t, float("nan"))
    d = pydnn.create_tensor_descriptor()
    pydnn.set_tensor4d_descriptor(d, pydnn.PYDNN_TENSOR_NCHW, pydnn.PYDNN_DATA_FLOAT, 3, 5, 7, 9)
    a = _desc(pydnn.PYDNN_ACTIVATION_SIGMOID)
    pydnn.activation_forward(handle, a, 1.0, d, t, 0.0, d, out)
    torch.cuda.synchronize()
    assert_close(out.cpu().numpy(), ref.act(pydnn.PYDNN_ACTIVATION_SIGMOID, t.cpu().numpy()), pydnn.PYDNN_DATA_FLOAT)
    small = torch.empty(10, device="cuda")
    with pytest.raises(pydnn.PydnnError) as e:
        pydnn.activation_forward(handle, a, 1.0, d, t, 0.0, d, small)
    assert e.value.status == pydnn.PYDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT
    assert "y:" in pydnn.get_last_error_string()


def test_checked_mode_refuses_an_int_pointer_past_its_allocation(handle, monkeypatch):
    import pydnn.buffers

    monkeypatch.setattr(pydnn.buffers, "CHECKED", True)
    dims = (1, 1, 8, 8)
    x = DevTensor(dims, pydnn.PYDNN_DATA_FLOAT)
    small = pydnn.DeviceArray((16,), np.float32)  # 64 bytes, the descriptor spans 256
    a = _desc(pydnn.PYDNN_ACTIVATION_RELU)
    with pytest.raises(pydnn.PydnnError) as e:
        pydnn.activation_forward(handle, a, 1.0, x.desc, x.ptr, 0.0, x.desc, small.ptr)
    assert e.value.status == pydnn.PYDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT and "y:" in e.value.message
    pydnn.activation_forward(handle, a, 1.0, x.desc, x.ptr, 0.0, x.desc, x.ptr)  # in range: fine


@pytest.mark.parametrize("dtype", [pydnn.PYDNN_DATA_HALF, pydnn.PYDNN_DATA_BFLOAT16])
def test_gelu_erf_tails(handle, dtype):
    """GELU (erf form) densely over [-12, 12], forward and backward. Half and bfloat16 use the fast normal
    CDF (phi_fast in ptx/activation.cu): its error must stay below the output's rounding in both tails,
    where the random inputs of test_forward (in [-3, 3]) do not reach. (float is not held to its relative
    tolerance below x ~ -4: it keeps PyTorch's 0.5 x (1 + erff(x / sqrt 2)); see gelu_cdf.)"""
    mode = pydnn.PYDNN_ACTIVATION_GELU_ERF
    dims = (1, 1, 3, 8001)
    x, y, dy, dx = (DevTensor(dims, dtype) for _ in range(4))
    xv = x.upload(np.linspace(-12.0, 12.0, 3 * 8001).reshape(dims))
    a = _desc(mode)
    pydnn.activation_forward(handle, a, 1.0, x.desc, x.ptr, 0.0, y.desc, y.ptr)
    yv = y.download()
    assert_close(yv, ref.act(mode, xv), dtype, "gelu_erf forward")
    dyv = dy.upload(np.ones(dims))
    pydnn.activation_backward(handle, a, 1.0, y.desc, y.ptr, dy.desc, dy.ptr, x.desc, x.ptr, 0.0, dx.desc, dx.ptr)
    assert_close(dx.download(), ref.backward(mode, 1.0, yv, dyv, xv, 0.0, None), dtype, "gelu_erf backward",
                 scale=ref.act_grad_terms(mode, xv, yv))


@pytest.mark.parametrize("dtype", [pydnn.PYDNN_DATA_HALF, pydnn.PYDNN_DATA_BFLOAT16])
@pytest.mark.parametrize("fast,elems", [(True, 8), (False, 8), (True, 16), (False, 16)])
def test_tanh_16bit_forms(handle, dtype, fast, elems, monkeypatch):
    """The 16-bit TANH forward in each form (tuning.activation.TANH_FAST: tanh_fast or tanhf; TANH_ELEMS 8 or 16
    a thread) densely over [-12, 12], around tanh_fast's switch between its two formulas at |x| = 1/8, and on
    small values (its polynomial): every output within one unit in the last place of tanh rounded to the type
    (tanh_fast's float error, < 1.5e-6 relative, is far below a 16-bit half ulp), and the form the switches
    name is the one launched."""
    from pydnn import tuning
    from pydnn.ops import _elementwise as ew
    from pydnn.reference.dtypes import to_storage

    monkeypatch.setattr(tuning.activation, "TANH_FAST", fast)
    monkeypatch.setattr(tuning.activation, "TANH_ELEMS", elems)
    ops, prepare = [], ew.prepare_map

    def spy(h, unit, op, *args, **kw):
        ops.append((op, kw.get("elems")))
        return prepare(h, unit, op, *args, **kw)

    monkeypatch.setattr(ew, "prepare_map", spy)
    edge, small = np.linspace(0.12, 0.13, 2001), np.logspace(-8, 0, 4001)
    v = np.concatenate([np.linspace(-12.0, 12.0, 24001), edge, -edge, small, -small]).astype(np.float32)
    dims = (1, 1, 1, v.size)
    x, y = DevTensor(dims, dtype), DevTensor(dims, dtype)
    xv = x.upload(v.reshape(dims).astype(np.float64))
    a = _desc(pydnn.PYDNN_ACTIVATION_TANH)
    pydnn.activation_forward(handle, a, 1.0, x.desc, x.ptr, 0.0, y.desc, y.ptr)
    out = y.download()
    assert ops == [(f"pydnn::act::Tanh<{'true' if fast else 'false'}>", 16 if elems == 16 else None)], ops
    want = np.tanh(xv)
    assert_close(out, want, dtype, "tanh")

    def bits(vals):
        return np.asarray(to_storage(vals, dtype)).view(np.uint16).astype(np.int64)

    off = np.abs(bits(out) - bits(want))
    assert off.max() <= 1, (int(off.max()), xv.ravel()[np.argmax(off.ravel())])
    y.check_untouched()
