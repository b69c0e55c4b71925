"""pydnn.torch's NHWC forward and backward for NCHW convolutions (pydnn.tuning.torch.CONV_NHWC_FWD / _BWD), on
the CPU against emulated pydnn calls (the harness of test_torch_emulated_cpu.py, with pydnn.transform_tensor
emulated too): which convolutions take them, that they transpose x / the filter / dy to NHWC and the results
back (and nothing else), that the convolution calls get NHWC descriptors, and that outputs and gradients match
PyTorch's with the switches on and off."""
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import pydnn  # noqa: E402
import pydnn.torch as pt  # noqa: E402
from pydnn import tuning  # noqa: E402
from test_torch_emulated_cpu import CALLS, check, emulated, make  # noqa: E402,F401

SEEN = []  # (call, layout of its tensors: "nhwc" / "nchw")


def _layout(desc):
    _, _, dims, strides = pydnn.get_tensor_nd_descriptor(desc, 8)
    return "nhwc" if strides[1] == 1 and dims[1] > 1 else "nchw"


@pytest.fixture
def nhwc(emulated, monkeypatch):
    """The emulated harness (transform_tensor emulated there too), the convolution calls' layouts recorded."""
    for name, dy_at in (("convolution_bias_activation_forward", 2), ("convolution_forward", 2),
                        ("convolution_backward_data", 4), ("convolution_backward_filter", 4)):
        inner = getattr(pydnn, name)

        def rec(*args, _inner=inner, _name=name, _at=dy_at):
            SEEN.append((_name, _layout(args[_at])))
            return _inner(*args)
        monkeypatch.setattr(pydnn, name, rec)
    SEEN.clear()
    monkeypatch.setattr(tuning.torch, "CONV_NHWC_BWD", True)
    monkeypatch.setattr(tuning.torch, "CONV_NHWC_FWD", True)
    yield CALLS


FWD = ("convolution_bias_activation_forward", "nhwc")


def _run(cin, cout, dtype, x_grad=True, groups=1, tol=3e-2):
    mine, ref = make(pt.Conv2d, nn.Conv2d, cin, cout, 3, padding=1, groups=groups)
    mine.to(dtype), ref.to(dtype)
    x = torch.randn(2, cin, 5, 6).to(dtype)
    if x_grad:
        return check(mine, ref, x, atol=tol, rtol=tol)
    y = mine(x)
    yr = ref(x)
    dy = torch.randn_like(yr)
    y.backward(dy), yr.backward(dy)
    for p, pr in zip(mine.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, pr.grad, atol=tol, rtol=tol)
    return y


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_nhwc_forward_and_backward(nhwc, dtype):
    _run(64, 128, dtype)
    assert nhwc.count("transform") == 6  # forward: x, w in, y out; backward: dy in, dx and dw out
    assert SEEN == [FWD, ("convolution_backward_data", "nhwc"), ("convolution_backward_filter", "nhwc")]


def test_nhwc_without_input_gradient(nhwc):
    _run(64, 64, torch.bfloat16, x_grad=False)
    assert nhwc.count("transform") == 5  # forward: x, w in, y out; backward: dy in, dw out
    assert SEEN == [FWD, ("convolution_backward_filter", "nhwc")]


def test_nhwc_backward_only(nhwc, monkeypatch):
    monkeypatch.setattr(tuning.torch, "CONV_NHWC_FWD", False)
    _run(64, 128, torch.bfloat16)
    assert nhwc.count("transform") == 5  # dy, w in; dx out; x in; dw out
    assert SEEN == [("convolution_bias_activation_forward", "nchw"), ("convolution_backward_data", "nhwc"),
                    ("convolution_backward_filter", "nhwc")]


def test_nhwc_backward_only_without_input_gradient(nhwc, monkeypatch):
    monkeypatch.setattr(tuning.torch, "CONV_NHWC_FWD", False)
    _run(64, 64, torch.bfloat16, x_grad=False)
    assert nhwc.count("transform") == 3  # dy, x in; dw out
    assert SEEN == [("convolution_bias_activation_forward", "nchw"), ("convolution_backward_filter", "nhwc")]


def test_nhwc_forward_without_bias_or_with_activation(nhwc):
    """The unfused forward (no bias, no activation) and the fused ReLU both run NHWC."""
    mine, ref = make(pt.Conv2d, nn.Conv2d, 64, 64, 3, padding=1, bias=False)
    mine.to(torch.bfloat16), ref.to(torch.bfloat16)
    check(mine, ref, torch.randn(2, 64, 5, 6).to(torch.bfloat16), atol=3e-2, rtol=3e-2)
    assert SEEN[0] == ("convolution_forward", "nhwc")
    SEEN.clear()
    mine, ref = make(pt.Conv2d, nn.Conv2d, 64, 64, 3, padding=1)
    mine.activation = "relu"
    mine.to(torch.bfloat16), ref.to(torch.bfloat16)
    check(mine, nn.Sequential(ref, nn.ReLU()), torch.randn(2, 64, 5, 6).to(torch.bfloat16), atol=3e-2, rtol=3e-2)
    assert SEEN[0] == FWD


def test_switches_off_keep_nchw(nhwc, monkeypatch):
    monkeypatch.setattr(tuning.torch, "CONV_NHWC_BWD", False)
    monkeypatch.setattr(tuning.torch, "CONV_NHWC_FWD", False)
    _run(64, 128, torch.bfloat16)
    assert "transform" not in nhwc
    assert SEEN == [("convolution_bias_activation_forward", "nchw"), ("convolution_backward_data", "nchw"),
                    ("convolution_backward_filter", "nchw")]


@pytest.mark.parametrize("cin,cout,dtype,groups", [(3, 64, torch.bfloat16, 1),     # the stem: C = 3
                                                   (64, 96, torch.bfloat16, 1),    # K not a multiple of 64
                                                   (64, 128, torch.float32, 1),    # not a 16-bit type
                                                   (128, 128, torch.bfloat16, 2)])  # groups
def test_other_convolutions_keep_nchw(nhwc, cin, cout, dtype, groups):
    _run(cin, cout, dtype, groups=groups, tol=3e-2 if dtype != torch.float32 else 1e-4)
    assert "transform" not in nhwc
    assert all(layout == "nchw" for _, layout in SEEN)


def test_channels_last_input_unchanged(nhwc):
    """A channels_last input already runs NHWC: no transposes are added."""
    mine, ref = make(pt.Conv2d, nn.Conv2d, 64, 64, 3, padding=1)
    mine.to(torch.bfloat16).to(memory_format=torch.channels_last)
    ref.to(torch.bfloat16).to(memory_format=torch.channels_last)
    x = torch.randn(2, 64, 5, 6).to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
    check(mine, ref, x, atol=3e-2, rtol=3e-2)
    assert "transform" not in nhwc
