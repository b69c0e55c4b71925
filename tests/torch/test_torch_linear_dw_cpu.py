"""pydnn.torch's Linear weight gradient as a 1x1 NHWC convolution's backward filter
(pydnn.tuning.torch.LINEAR_DW_SPLITK), and the call records (pydnn.tuning.torch.FAST_CALLS), on the CPU
against emulated pydnn calls (test_torch_emulated_cpu.py's harness): which shapes take the convolution, that
its descriptors compute dW = dy^T x (gradients against PyTorch), that the switch turns it off; that a
repeated call runs from its record (the same pydnn calls, results equal to the full path's) and that a
changed shape, layout or switch does not reuse a record."""
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import pydnn.torch as pt  # noqa: E402
from pydnn import tuning  # noqa: E402
from pydnn.torch import functional as PF  # noqa: E402
from test_torch_emulated_cpu import CALLS, check, emulated, make  # noqa: E402,F401


@pytest.fixture
def dw(emulated, monkeypatch):
    monkeypatch.setattr(tuning.torch, "LINEAR_DW_SPLITK", True)
    yield CALLS


def _mm(calls):
    return [c for c in calls if c in ("matmul", "conv_bwd_filter")]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_long_m_weight_gradient_takes_the_convolution(dw, dtype):
    mine, ref = make(pt.Linear, nn.Linear, 24, 40, bias=False)
    mine.to(dtype), ref.to(dtype)
    check(mine, ref, torch.randn(2, 200, 24).to(dtype), atol=5e-2, rtol=3e-2)  # m = 400 >= 8 * 40
    # forward and dx on matmul; dW on the convolution
    assert _mm(dw) == ["matmul", "matmul", "conv_bwd_filter"]  # (the emulation asks no matmul workspace)


def test_with_bias(dw):
    mine, ref = make(pt.Linear, nn.Linear, 16, 8)
    mine.to(torch.bfloat16), ref.to(torch.bfloat16)
    check(mine, ref, torch.randn(300, 16).to(torch.bfloat16), atol=5e-2, rtol=3e-2)
    assert _mm(dw)[-1] == "conv_bwd_filter"


@pytest.mark.parametrize("m,k,n,dtype", [(64, 24, 40, torch.bfloat16),     # m < 8 max(n, k)
                                         (400, 24, 40, torch.float32)])    # not a 16-bit type
def test_other_shapes_stay_on_matmul(dw, m, k, n, dtype):
    mine, ref = make(pt.Linear, nn.Linear, k, n)
    mine.to(dtype), ref.to(dtype)
    tol = 5e-2 if dtype != torch.float32 else 1e-4
    check(mine, ref, torch.randn(m, k).to(dtype), atol=tol, rtol=tol)
    assert "conv_bwd_filter" not in dw


def test_split_matmul_keeps_matmul(dw, monkeypatch):
    """Where pydnn.matmul splits K itself (it asks a workspace), the weight gradient stays on matmul_ex."""
    import pydnn
    real = pydnn.get_matmul_ex_workspace_size
    monkeypatch.setattr(pydnn, "get_matmul_ex_workspace_size", lambda h, a, b, c: real(h, a, b, c) or 4096)
    mine, ref = make(pt.Linear, nn.Linear, 24, 40, bias=False)
    mine.to(torch.bfloat16), ref.to(torch.bfloat16)
    check(mine, ref, torch.randn(400, 24).to(torch.bfloat16), atol=5e-2, rtol=3e-2)
    assert "conv_bwd_filter" not in dw


def test_switch_off_keeps_matmul(emulated, monkeypatch):
    monkeypatch.setattr(tuning.torch, "LINEAR_DW_SPLITK", False)
    mine, ref = make(pt.Linear, nn.Linear, 24, 40, bias=False)
    mine.to(torch.bfloat16), ref.to(torch.bfloat16)
    check(mine, ref, torch.randn(400, 24).to(torch.bfloat16), atol=5e-2, rtol=3e-2)
    assert "conv_bwd_filter" not in emulated


# ------------------------------------------------------------------------------------------- call records
def _block():
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                         nn.AvgPool2d(2), nn.Flatten(), nn.Linear(8 * 2 * 2, 5))


def _run(model, x):
    x = x.clone().requires_grad_()
    y = model(x)
    y.float().square().sum().backward()
    return y.detach(), x.grad, [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("fuse", [False, True])
def test_records_repeat_the_full_path(emulated, monkeypatch, fuse):
    """Three steps with records on (the second and third from the records) against the same steps with
    FAST_CALLS off: the same pydnn calls in the same order, the same outputs and gradients."""
    torch.manual_seed(0)
    base = _block()
    x = torch.randn(2, 3, 8, 8)
    res = {}
    for fast in (True, False):
        monkeypatch.setattr(tuning.torch, "FAST_CALLS", fast)
        model = _block()
        model.load_state_dict(base.state_dict())
        pt.convert(model, fuse=fuse)
        outs = []
        CALLS.clear()
        for _ in range(3):
            outs.append(_run(model, x))
            for p in model.parameters():
                p.grad = None
        res[fast] = (outs, [c for c in CALLS if not c.startswith(("get_", "find_"))])  # (queries: cached)
    assert res[True][1] == res[False][1]
    for (y1, g1, p1), (y0, g0, p0) in zip(res[True][0], res[False][0]):
        assert torch.equal(y1, y0) and torch.equal(g1, g0)
        assert all(torch.equal(a, b) for a, b in zip(p1, p0))
    kinds = {k[0] for k in PF._recs}
    # (fused: the max pool runs inside the batch norm's Function, and with tuning.torch.FUSE_BLOCK the batch
    # norm inside the convolution's: one conv_bn record for the three)
    want = ({"conv_bn", "avg_pool2d", "linear"} if fuse and tuning.torch.FUSE_BLOCK
            else {"conv", "batch_norm", "avg_pool2d", "linear"} | (set() if fuse else {"max_pool2d"}))
    assert want <= kinds, kinds


def test_records_follow_shape_and_layout(emulated):
    torch.manual_seed(0)
    mine, ref = make(pt.Conv2d, nn.Conv2d, 3, 8, 3, padding=1)
    for x in (torch.randn(2, 3, 8, 8), torch.randn(3, 3, 8, 8),
              torch.randn(2, 3, 8, 8).contiguous(memory_format=torch.channels_last),
              torch.randn(2, 8, 8, 3).permute(0, 3, 1, 2)):
        check(mine, ref, x, atol=1e-4, rtol=1e-4)
        check(mine, ref, x, atol=1e-4, rtol=1e-4)  # the second call from the record
    assert len([k for k in PF._recs if k[0] == "conv"]) >= 3


def test_record_not_used_for_cpu_tensors(emulated, monkeypatch):
    """A record is made by a call that passed the checks (here: the emulated CUDA path); the same shapes on
    the real checks (CPU tensors, on_cuda false) fall back to PyTorch instead of reusing it."""
    from pydnn.torch import _core as C
    mp = pt.MaxPool2d(2)
    x = torch.randn(2, 4, 8, 8)
    mp(x)
    assert any(k[0] == "max_pool2d" for k in PF._recs)
    monkeypatch.setattr(C, "on_cuda", lambda *ts: all(t is None or t.is_cuda for t in ts))
    monkeypatch.setattr(PF, "_recs", C.BoundedDict())  # (a record keyed by a CUDA device would not match)
    before = sum(pt.fallbacks.values())
    torch.testing.assert_close(mp(x), torch.nn.functional.max_pool2d(x, 2))
    assert sum(pt.fallbacks.values()) == before + 1


def test_workspace_kept_per_stream_and_fresh_under_capture(emulated, monkeypatch):
    """FAST_CALLS: one workspace per (device, stream), grown to the largest size asked; a fresh allocation
    while a CUDA graph is captured; with the switch off, a fresh allocation every call."""
    from pydnn.torch import _core as C
    dev = torch.device("cpu")
    a, pa = C.workspace(100, dev)
    b, pb = C.workspace(60, dev)
    assert b is a and pb == pa
    c, _ = C.workspace(1000, dev)
    assert c.numel() == 1000 and C.workspace(10, dev)[0] is c
    monkeypatch.setattr(C, "_current_stream", lambda idx: 8)
    d, _ = C.workspace(10, dev)
    assert d is not c
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    e, _ = C.workspace(10, dev)
    assert e is not d and e.numel() == 10
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(tuning.torch, "FAST_CALLS", False)
    assert C.workspace(10, dev)[0] is not d
    assert C.workspace(0, dev) == (None, None)
