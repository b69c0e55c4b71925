"""On the GPU: the bridge's call records (pydnn.tuning.torch.FAST_CALLS: a repeated call runs from its record)
and the max pool fused into the batch norm's Function (pydnn.tuning.torch.FUSE_POOL) give the same results
as the full path with separate pools and as PyTorch over several training steps of the CNN demo's layers
(conv + fused batch norm / ReLU / max pool, the NHWC second convolution, the Linear classifier), and Linear's
weight gradient as a 1x1 NHWC convolution's backward filter (pydnn.tuning.torch.LINEAR_DW_SPLITK) against
PyTorch in float64 on the same rounded inputs (a GPT-like MLP shape, long token dimension)."""
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import pydnn.torch as pt  # noqa: E402
from pydnn import tuning  # noqa: E402
from test_torch_gpu import TOL_SUM, close, pydnn_runs  # noqa: E402


@pytest.fixture(autouse=True)
def _chain_off():
    """(tuning.torch.FUSE_CHAIN off: this file's node counts, reports and Python work are its blocks' own;
    test_torch_chain_*.py covers the chain.)"""
    with tuning.override({"torch.FUSE_CHAIN": False}):
        yield

pytestmark = pytest.mark.gpu


def _cnn():
    return nn.Sequential(
        nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(128 * 4 * 4, 10))


def _steps(model, xs, fast, fuse_pool=True):
    saved = tuning.torch.FAST_CALLS, tuning.torch.FUSE_POOL
    tuning.torch.FAST_CALLS, tuning.torch.FUSE_POOL = fast, fuse_pool
    out = []
    try:
        for x in xs:
            model.zero_grad(set_to_none=True)
            with pydnn_runs(), torch.autocast("cuda", dtype=torch.bfloat16):
                y = model(x)
            with pydnn_runs():
                y.float().square().mean().backward()
            out.append((y.detach().float(), [p.grad.detach().float().clone() for p in model.parameters()]))
    finally:
        tuning.torch.FAST_CALLS, tuning.torch.FUSE_POOL = saved
    return out


def test_records_match_full_path_and_torch():
    torch.manual_seed(0)
    ref = _cnn().cuda()
    xs = [torch.randn(8, 3, 16, 16, device="cuda") for _ in range(3)]
    res = {}
    for fast in (True, False):  # (False: also the max pools as their own calls, the path before)
        model = _cnn().cuda()
        model.load_state_dict(ref.state_dict())
        report = pt.convert(model, fuse=True)
        blocks = [("0", "1"), ("4", "5")] if tuning.torch.FUSE_BLOCK else []  # conv + batch norm, one node
        assert sorted(report.fused) == sorted(
            [("1", "max_pool2d"), ("1", "relu"), ("5", "max_pool2d"), ("5", "relu")] + blocks)
        res[fast] = _steps(model, xs, fast, fuse_pool=fast)
    want = []
    for x in xs:
        ref.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = ref(x)
        y.float().square().mean().backward()
        want.append(y.detach().float())
    for step, ((y1, g1), (y0, g0), yr) in enumerate(zip(res[True], res[False], want)):
        # records and the full path launch the same kernels on the same data (equal up to the order of any
        # atomic accumulation)
        close(y1, y0, torch.bfloat16, f"step {step} y: record against the full path")
        for i, (a, b) in enumerate(zip(g1, g0)):
            close(a, b, torch.bfloat16, f"step {step} grad {i}: record against the full path")
        # against PyTorch (cuDNN, bf16 too): the output (each op's gradients against float64: test_torch_gpu.py)
        close(y1, yr, torch.bfloat16, f"step {step} y against PyTorch", tol=TOL_SUM[torch.bfloat16])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "half"])
@pytest.mark.parametrize("shape,k,n", [((3, 8192, 768), 768, 3072), ((24576, 3072), 3072, 768)])
def test_linear_dw_splitk_matches_torch(dtype, shape, k, n, monkeypatch):
    """The GPT demo's MLP weight-gradient shapes (72 output tiles of 128 x 256: pydnn.matmul asks no
    workspace, so the convolution takes them), a shorter token dimension (24576)."""
    import pydnn
    torch.manual_seed(0)
    ref = nn.Linear(k, n, bias=False).double().cuda()
    mine = pt.Linear(k, n, bias=False).cuda().to(dtype)
    mine.load_state_dict({kk: v.to(dtype) for kk, v in ref.state_dict().items()})
    ref.load_state_dict({kk: v.double() for kk, v in mine.state_dict().items()})
    x = torch.randn(*shape, device="cuda").to(dtype).requires_grad_(True)
    xr = x.detach().double().requires_grad_(True)
    calls = []
    real = pydnn.convolution_backward_filter
    monkeypatch.setattr(pydnn, "convolution_backward_filter", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(tuning.torch, "LINEAR_DW_SPLITK", True)
    # matmul's split over several waves asks a workspace for these shapes, and the bridge then takes matmul;
    # without it matmul asks none, the case LINEAR_DW_SPLITK's 1x1 backward filter is for
    monkeypatch.setattr(tuning.matmul, "SPLIT_WAVES", False)
    with pydnn_runs():
        y = mine(x)
        dy = torch.randn_like(y)
        y.backward(dy)
    assert calls == [1], "the weight gradient did not take the 1x1 NHWC backward filter"
    yr = ref(xr)
    yr.backward(dy.double())
    close(y, yr, dtype, "linear y", tol=TOL_SUM[dtype])
    close(x.grad, xr.grad, dtype, "linear dx", tol=TOL_SUM[dtype])
    close(mine.weight.grad, ref.weight.grad, dtype, "linear dW (1x1 NHWC wgrad)", tol=TOL_SUM[dtype])
