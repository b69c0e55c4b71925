"""pydnn.torch's Linear forward as a 1x1 convolution's backward filter (pydnn.tuning.torch.LINEAR_FWD_SPLITK) on
the GPU: the CNN demo's classifier (256 x 8192 -> 10) and a batched input, output and gradients against
PyTorch in float64 on the same rounded inputs, and the same output as pydnn.matmul's within rounding."""
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import pydnn.torch as pt  # noqa: E402
from pydnn import tuning  # noqa: E402
from test_torch_gpu import TOL_SUM, close, pydnn_runs  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "half"])
@pytest.mark.parametrize("shape,k,n", [((256, 8192), 8192, 10), ((2, 64, 2048), 2048, 100)])
def test_linear_splitk_matches_torch(dtype, shape, k, n):
    torch.manual_seed(0)
    ref = nn.Linear(k, n).double().cuda()
    mine = pt.Linear(k, n).cuda().to(dtype)
    mine.load_state_dict({kk: v.to(dtype) for kk, v in ref.state_dict().items()})
    ref.load_state_dict({kk: v.double() for kk, v in mine.state_dict().items()})
    x = torch.randn(*shape, device="cuda").to(dtype).requires_grad_(True)
    xr = x.detach().double().requires_grad_(True)
    saved = tuning.torch.LINEAR_FWD_SPLITK
    tuning.torch.LINEAR_FWD_SPLITK = True
    try:
        with pydnn_runs():
            y = mine(x)
            dy = torch.randn_like(y)
            y.backward(dy)
        tuning.torch.LINEAR_FWD_SPLITK = False
        with pydnn_runs(), torch.no_grad():
            y_mm = mine(x)
    finally:
        tuning.torch.LINEAR_FWD_SPLITK = saved
    yr = ref(xr)
    yr.backward(dy.double())
    close(y, yr, dtype, "linear split-K y", tol=TOL_SUM[dtype])
    close(y, y_mm, dtype, "linear split-K y against pydnn.matmul", tol=TOL_SUM[dtype])
    close(x.grad, xr.grad, dtype, "linear dx", tol=TOL_SUM[dtype])
    close(mine.weight.grad, ref.weight.grad, dtype, "linear dW", tol=TOL_SUM[dtype])
    close(mine.bias.grad, ref.bias.grad, dtype, "linear db", tol=TOL_SUM[dtype])
