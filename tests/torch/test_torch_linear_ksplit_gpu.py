"""pydnn.torch's Linear weight gradient split over chunks of the token rows (pydnn.tuning.torch.LINEAR_DW_KSPLIT:
one batched pydnn.matmul into 16-bit partials, summed by torch.sum) and as a 1x1 convolution's backward filter
(LINEAR_DW_SPLITK) on the GPU, at the GPT demo's MLP shapes with fewer tokens: y, dx and dW against PyTorch in
float64 on the same rounded inputs (max-norm, TOL_SUM), and that the split really ran."""
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import pydnn.torch as pt  # noqa: E402
from pydnn import tuning  # noqa: E402
from pydnn.torch import functional as PF  # noqa: E402
from test_torch_gpu import TOL_SUM, close, pydnn_runs  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "half"])
@pytest.mark.parametrize("k,n", [(768, 3072), (3072, 768)], ids=["fc1", "fc2"])
@pytest.mark.parametrize("mode", ["ksplit2", "ksplit8", "conv"])
def test_linear_dw_split_matches_torch(dtype, k, n, mode, monkeypatch):
    torch.manual_seed(0)
    m = 8192 * 3  # 8 x max(n, k) = 24576 tokens: the long reduction both paths take
    ref = nn.Linear(k, n, bias=False).double().cuda()
    mine = pt.Linear(k, n, bias=False).cuda().to(dtype)
    mine.load_state_dict({kk: v.to(dtype) for kk, v in ref.state_dict().items()})
    ref.load_state_dict({kk: v.double() for kk, v in mine.state_dict().items()})
    x = torch.randn(4, m // 4, k, device="cuda").to(dtype).requires_grad_(True)
    xr = x.detach().double().requires_grad_(True)
    monkeypatch.setattr(tuning.torch, "LINEAR_DW_KSPLIT", int(mode[6:]) if mode.startswith("ksplit") else 0)
    monkeypatch.setattr(tuning.torch, "LINEAR_DW_SPLITK", mode == "conv")
    ran = []
    real = PF._dw_ksplit
    monkeypatch.setattr(PF, "_dw_ksplit", lambda *a: ran.append(real(*a)) or ran[-1])
    with pydnn_runs():
        y = mine(x)
        dy = torch.randn_like(y)
        y.backward(dy)
    yr = ref(xr)
    yr.backward(dy.double())
    torch.cuda.synchronize()
    if mode.startswith("ksplit"):
        # the batched split runs where pydnn.matmul does not split the whole-K problem itself (no workspace)
        C = pt._core
        ws = PF._matmul_ws(C.handle_for(x.device), C.tensor_desc(dtype, (n, m), (1, n)),
                           C.tensor_desc(dtype, (m, k), (k, 1)), C.tensor_desc(dtype, (n, k), (k, 1)))
        assert ran == [not ws], (ran, ws)
    close(y, yr, dtype, "linear y", tol=TOL_SUM[dtype])
    close(x.grad, xr.grad, dtype, "linear dx", tol=TOL_SUM[dtype])
    close(mine.weight.grad, ref.weight.grad, dtype, f"linear dW ({mode})", tol=TOL_SUM[dtype])
