"""pydnn.torch's NHWC forward / backward for NCHW 16-bit convolutions (pydnn.tuning.torch.CONV_NHWC_FWD / _BWD)
on the GPU: the output and the data, filter and bias gradients against PyTorch in float64 on the same rounded
inputs, with the switches on (the NHWC copies and pydnn.transform_tensor there and back), the backward only,
and off (the NCHW algorithms), the CNN demo's second convolution among the shapes; the paths agree with each
other too."""
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import pydnn.torch as pt  # noqa: E402
from pydnn import tuning  # noqa: E402
from test_torch_gpu import TOL_SUM, close, pydnn_runs  # noqa: E402

pytestmark = pytest.mark.gpu


def _grads(cin, cout, n, hw, dtype, nhwc, x_grad=True, seed=0, fwd=None):
    g = torch.Generator(device="cuda").manual_seed(seed)
    torch.manual_seed(seed)
    ref = nn.Conv2d(cin, cout, 3, padding=1).double().cuda()
    mine = pt.Conv2d(cin, cout, 3, padding=1).cuda()
    mine.load_state_dict(ref.state_dict())
    mine.to(dtype)
    ref.load_state_dict({k: v.to(dtype).double() for k, v in mine.state_dict().items()})  # the rounded values
    x = torch.randn(n, cin, hw, hw, device="cuda", generator=g).to(dtype).requires_grad_(x_grad)
    xr = x.detach().double().requires_grad_(x_grad)
    saved = tuning.torch.CONV_NHWC_BWD, tuning.torch.CONV_NHWC_FWD
    tuning.torch.CONV_NHWC_BWD = nhwc
    tuning.torch.CONV_NHWC_FWD = nhwc if fwd is None else fwd
    try:
        with pydnn_runs():
            y = mine(x)
            dy = torch.randn(y.shape, device="cuda", generator=g).to(dtype)
            y.backward(dy)
    finally:
        tuning.torch.CONV_NHWC_BWD, tuning.torch.CONV_NHWC_FWD = saved
    yr = ref(xr)
    yr.backward(dy.double())
    what = f"conv {cin}->{cout} {n}x{hw}x{hw} nhwc={nhwc} fwd={fwd}"
    assert y.is_contiguous()
    close(y, yr, dtype, f"{what} y", tol=TOL_SUM[dtype])
    if x_grad:
        close(x.grad, xr.grad, dtype, f"{what} dx", tol=TOL_SUM[dtype])
    close(mine.weight.grad, ref.weight.grad, dtype, f"{what} dw", tol=TOL_SUM[dtype])
    close(mine.bias.grad, ref.bias.grad, dtype, f"{what} db", tol=TOL_SUM[dtype])
    return (x.grad if x_grad else None), mine.weight.grad, mine.bias.grad


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "half"])
@pytest.mark.parametrize("cin,cout,n,hw", [(64, 128, 32, 16), (64, 64, 4, 9), (128, 64, 2, 7)])
def test_nhwc_backward_matches_torch(dtype, cin, cout, n, hw):
    on = _grads(cin, cout, n, hw, dtype, True)
    bwd_only = _grads(cin, cout, n, hw, dtype, True, fwd=False)
    off = _grads(cin, cout, n, hw, dtype, False)
    for a, b, c, name in zip(on, bwd_only, off, ("dx", "dw", "db")):
        close(a, c, dtype, f"NHWC against NCHW backward {name}", tol=TOL_SUM[dtype])
        close(b, c, dtype, f"NHWC backward only against NCHW {name}", tol=TOL_SUM[dtype])


def test_nhwc_backward_without_input_gradient():
    _grads(64, 128, 8, 16, torch.bfloat16, True, x_grad=False)
    _grads(64, 128, 8, 16, torch.bfloat16, True, x_grad=False, fwd=False)


def test_demo_shape_under_autocast():
    """The CNN demo's second convolution as the demo runs it: float32 module, bf16 autocast, batch 256."""
    torch.manual_seed(1)
    ref = nn.Conv2d(64, 128, 3, padding=1).cuda()
    mine = pt.Conv2d(64, 128, 3, padding=1).cuda()
    mine.load_state_dict(ref.state_dict())
    x = torch.randn(256, 64, 16, 16, device="cuda")
    with pydnn_runs(), torch.autocast("cuda", dtype=torch.bfloat16):
        y = mine(x)
    y.float().square().mean().backward()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        yr = ref(x)
    yr.float().square().mean().backward()
    close(y, yr, torch.bfloat16, "demo conv forward", tol=TOL_SUM[torch.bfloat16])
    close(mine.weight.grad, ref.weight.grad, torch.bfloat16, "demo conv dw", tol=TOL_SUM[torch.bfloat16])
    close(mine.bias.grad, ref.bias.grad, torch.bfloat16, "demo conv db", tol=TOL_SUM[torch.bfloat16])
