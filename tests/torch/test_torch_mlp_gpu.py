"""pydnn.torch's fused MLP (pydnn.tuning.torch.FUSE_MLP: Linear -> GELU -> Linear without biases, the GELU in
the first GEMM's epilogue and its gradient in the backward's dy @ W2 epilogue, through the graph API's fusion
engine) on the GPU: y, dx, dW1 and dW2 against PyTorch's modules in float64 on the same rounded inputs
(max-norm, TOL_SUM), and that the fused Function ran (its two graphs built). The first call compiles the
generated GEMMs (NVRTC, ~10 s each on a cold cache)."""
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import pydnn.torch as pt  # noqa: E402
from pydnn import tuning  # noqa: E402
from pydnn.torch import functional as PF  # noqa: E402
from test_torch_gpu import TOL_SUM, close, pydnn_runs  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "half"])
@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_fused_mlp_matches_torch(dtype, approximate, monkeypatch):
    monkeypatch.setattr(tuning.torch, "FUSE_MLP", True)
    torch.manual_seed(0)
    d, hid = 256, 1024

    def block():
        return nn.Sequential(nn.Linear(d, hid, bias=False), nn.GELU(approximate=approximate),
                             nn.Linear(hid, d, bias=False))
    ref, mine = block().cuda(), block().cuda()
    mine.to(dtype)
    ref.load_state_dict({k: v.to(dtype).double() for k, v in mine.state_dict().items()})
    ref.double()
    rep = pt.convert(mine, fuse=True)
    assert rep.fused == [("0", "gelu + 2")]
    ran = []
    real = PF.MlpFunction.forward
    monkeypatch.setattr(PF.MlpFunction, "forward", staticmethod(lambda *a: ran.append(1) or real(*a)))
    monkeypatch.setattr(PF, "_mlp_apply", PF.C.applier(PF.MlpFunction))
    x = torch.randn(2, 1024, d, device="cuda").to(dtype).requires_grad_(True)
    xr = x.detach().double().requires_grad_(True)
    with pydnn_runs():
        y = mine(x)
        dy = torch.randn_like(y)
        y.backward(dy)
    yr = ref(xr)
    yr.backward(dy.double())
    torch.cuda.synchronize()
    assert ran == [1], "the fused MLP did not run (its graphs did not build?)"
    tol = TOL_SUM[dtype]
    close(y, yr, dtype, "mlp y", tol=tol)
    close(x.grad, xr.grad, dtype, "mlp dx", tol=tol)
    close(mine[0].weight.grad, ref[0].weight.grad, dtype, "mlp dW1", tol=tol)
    close(mine[2].weight.grad, ref[2].weight.grad, dtype, "mlp dW2", tol=tol)


def test_fused_mlp_under_autocast_with_float_weights(monkeypatch):
    """The GPT demo's case: float32 parameters under bf16 autocast (the bridge casts, autograd casts the
    gradients back)."""
    monkeypatch.setattr(tuning.torch, "FUSE_MLP", True)
    torch.manual_seed(1)
    ref = nn.Sequential(nn.Linear(256, 1024, bias=False), nn.GELU(approximate="tanh"),
                        nn.Linear(1024, 256, bias=False)).cuda()
    mine = nn.Sequential(nn.Linear(256, 1024, bias=False), nn.GELU(approximate="tanh"),
                         nn.Linear(1024, 256, bias=False)).cuda()
    mine.load_state_dict(ref.state_dict())
    pt.convert(mine, fuse=True)
    x = torch.randn(4096, 256, device="cuda")
    with pydnn_runs(), torch.autocast("cuda", dtype=torch.bfloat16):
        y = mine(x)
        yr = ref(x)
    assert y.dtype == yr.dtype == torch.bfloat16
    dy = torch.randn_like(y)
    y.backward(dy)
    yr.backward(dy)
    for a, b, what in ((y, yr, "y"), (mine[0].weight.grad, ref[0].weight.grad, "dW1"),
                       (mine[2].weight.grad, ref[2].weight.grad, "dW2")):
        assert a.dtype == b.dtype
        close(a, b, torch.bfloat16, f"autocast mlp {what}", tol=2 * TOL_SUM[torch.bfloat16])
