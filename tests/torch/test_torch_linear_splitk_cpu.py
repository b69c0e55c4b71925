"""pydnn.torch's Linear forward as a 1x1 convolution's backward filter (pydnn.tuning.torch.LINEAR_FWD_SPLITK),
on the CPU against emulated pydnn calls (test_torch_emulated_cpu.py's harness): which shapes take it, that the
descriptors it builds compute y = x W^T (outputs and gradients against PyTorch), that the switch turns it
off, and that the backward stays on pydnn.matmul."""
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import pydnn.torch as pt  # noqa: E402
from pydnn import tuning  # noqa: E402
from test_torch_emulated_cpu import CALLS, check, emulated, make  # noqa: E402,F401


@pytest.fixture
def splitk(emulated, monkeypatch):
    monkeypatch.setattr(tuning.torch, "LINEAR_FWD_SPLITK", True)
    yield CALLS


def _fwd_calls(calls):
    return [c for c in calls if c in ("matmul", "conv_bwd_filter")]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_long_k_takes_the_convolution(splitk, dtype):
    mine, ref = make(pt.Linear, nn.Linear, 1024, 10)
    mine.to(dtype), ref.to(dtype)
    check(mine, ref, torch.randn(16, 1024).to(dtype), atol=3e-2, rtol=3e-2)
    # forward: the convolution; backward: dx and dW on matmul
    assert _fwd_calls(splitk) == ["conv_bwd_filter", "matmul", "matmul"]


def test_batched_input_and_no_bias(splitk):
    mine, ref = make(pt.Linear, nn.Linear, 512, 7, bias=False)
    mine.to(torch.bfloat16), ref.to(torch.bfloat16)
    check(mine, ref, torch.randn(2, 3, 512).to(torch.bfloat16), atol=3e-2, rtol=3e-2)
    assert _fwd_calls(splitk)[0] == "conv_bwd_filter"


@pytest.mark.parametrize("k,n,m,dtype", [(64, 10, 16, torch.bfloat16),     # K < 8 max(M, N)
                                         (4096, 600, 16, torch.bfloat16),  # N > 512
                                         (1024, 10, 16, torch.float32)])   # not a 16-bit type
def test_other_shapes_stay_on_matmul(splitk, k, n, m, dtype):
    mine, ref = make(pt.Linear, nn.Linear, k, n)
    mine.to(dtype), ref.to(dtype)
    tol = 3e-2 if dtype != torch.float32 else 1e-4
    check(mine, ref, torch.randn(m, k).to(dtype), atol=tol, rtol=tol)
    assert "conv_bwd_filter" not in splitk


def test_switch_off_keeps_matmul(emulated, monkeypatch):
    monkeypatch.setattr(tuning.torch, "LINEAR_FWD_SPLITK", False)
    mine, ref = make(pt.Linear, nn.Linear, 1024, 10)
    mine.to(torch.bfloat16), ref.to(torch.bfloat16)
    check(mine, ref, torch.randn(16, 1024).to(torch.bfloat16), atol=3e-2, rtol=3e-2)
    assert "conv_bwd_filter" not in emulated


def test_unaligned_view_stays_on_matmul(splitk):
    """x a view one element into its storage (not 16-byte aligned): pydnn.matmul (its general path) runs it."""
    mine, ref = make(pt.Linear, nn.Linear, 1024, 10)
    mine.to(torch.bfloat16), ref.to(torch.bfloat16)
    base = torch.randn(16 * 1024 + 1).to(torch.bfloat16)
    x = base[1:].view(16, 1024)
    check(mine, ref, x, atol=3e-2, rtol=3e-2)
    assert _fwd_calls(splitk)[0] == "matmul"
