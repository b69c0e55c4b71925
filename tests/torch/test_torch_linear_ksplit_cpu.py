"""pydnn.torch's Linear weight gradient as a batched pydnn.matmul over S chunks of the token rows
(pydnn.tuning.torch.LINEAR_DW_KSPLIT), on the CPU against emulated pydnn calls (test_torch_emulated_cpu.py's
harness, both its emulated and validated forms): which shapes take it, that the batched descriptors and the
sum of the partials give dW = dy^T x (gradients against PyTorch), that the switch off (the default) and the
other paths keep the single matmul."""
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import pydnn.torch as pt  # noqa: E402
from pydnn import tuning  # noqa: E402
from pydnn.torch import functional as PF  # noqa: E402
from test_torch_emulated_cpu import CALLS, check, emulated, make  # noqa: E402,F401


@pytest.fixture
def taken(emulated, monkeypatch):
    """The _dw_ksplit calls' answers (True: the batched matmul ran)."""
    got = []
    real = PF._dw_ksplit

    def spy(*a):
        r = real(*a)
        got.append(r)
        return r
    monkeypatch.setattr(PF, "_dw_ksplit", spy)
    monkeypatch.setattr(PF, "_ksplit_descs", type(PF._ksplit_descs)())
    return got


def _mm(calls):
    return [c for c in calls if c in ("matmul", "conv_bwd_filter")]


def _maxnorm(got, want):
    return ((got.double() - want.double()).abs().max() / want.double().abs().max()).item()


def _run_split(mine, ref, x, dtype):
    """Forward / backward of both modules; y, dx and dW against float64 PyTorch on the same rounded values,
    as max-norm relative errors (the GPU tests' TOL_SUM rule: each partial is rounded to the 16-bit type
    once more, so an element far below the largest carries the partials' rounding, not its own)."""
    x = x.to(dtype).requires_grad_(True)
    xr = x.detach().double().requires_grad_(True)
    ref.double()
    y = mine(x)
    yr = ref(xr)
    dy = torch.randn_like(yr).to(dtype)
    y.backward(dy)
    yr.backward(dy.double())
    tol = 3e-2 if dtype == torch.bfloat16 else 8e-3
    for what, got, want in (("y", y, yr), ("dx", x.grad, xr.grad), ("dW", mine.weight.grad, ref.weight.grad)):
        assert got.dtype == dtype and got.shape == want.shape, what
        assert _maxnorm(got, want) <= tol, (what, _maxnorm(got, want))


def test_default_is_the_measured_split():
    assert tuning.torch.LINEAR_DW_KSPLIT == 8  # the GPT demo's step on the H200 (tuning.py's note)


def test_off_keeps_one_matmul(taken, monkeypatch):
    monkeypatch.setattr(tuning.torch, "LINEAR_DW_KSPLIT", 0)
    mine, ref = make(pt.Linear, nn.Linear, 24, 40, bias=False)
    mine.to(torch.bfloat16)
    _run_split(mine, ref, torch.randn(2, 256, 24), torch.bfloat16)
    assert taken == [False]


@pytest.mark.parametrize("s", [2, 4])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_long_m_weight_gradient_is_split(taken, monkeypatch, s, dtype):
    monkeypatch.setattr(tuning.torch, "LINEAR_DW_KSPLIT", s)
    mine, ref = make(pt.Linear, nn.Linear, 24, 40, bias=False)
    mine.to(dtype)
    _run_split(mine, ref, torch.randn(2, 256, 24), dtype)  # m = 512 >= 8 * 40, 8 s | m
    assert taken == [True]
    assert _mm(CALLS) == ["matmul", "matmul", "matmul"]  # forward, dx, the batched dW


def test_with_bias_and_float_master_weights_under_autocast(taken, monkeypatch):
    """The demo's case: float32 parameters cast by autocast; the bias gradient stays PyTorch's."""
    from pydnn.torch import _core as C
    monkeypatch.setattr(tuning.torch, "LINEAR_DW_KSPLIT", 2)
    monkeypatch.setattr(C, "on_cuda", lambda *ts: True)  # the bridge casts as under CUDA autocast
    monkeypatch.setattr(C, "autocast_dtype", lambda: torch.bfloat16)
    mine, ref = make(pt.Linear, nn.Linear, 16, 8)
    x = torch.randn(320, 16)
    xr = x.clone().requires_grad_(True)
    x.requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = mine(x)
        yr = ref(xr)
    dy = torch.randn_like(yr)
    y.backward(dy)
    yr.backward(dy)
    assert taken == [True]
    for a, b in ((mine.weight.grad, ref.weight.grad), (mine.bias.grad, ref.bias.grad), (x.grad, xr.grad)):
        assert a.dtype == b.dtype == torch.float32
        assert _maxnorm(a, b) <= 3e-2  # both bf16 products (PyTorch's one rounding, the split's two)


@pytest.mark.parametrize("m,k,n,dtype", [(64, 24, 40, torch.bfloat16),     # m < 8 max(n, k)
                                         (328, 24, 40, torch.bfloat16),    # m = 328 not a multiple of 8 * 2 ... 16
                                         (400, 24, 40, torch.float32),     # not a 16-bit type
                                         (400, 20, 40, torch.bfloat16)])   # k = 20: rows off 16-byte alignment
def test_other_shapes_stay_on_one_matmul(taken, monkeypatch, m, k, n, dtype):
    monkeypatch.setattr(tuning.torch, "LINEAR_DW_KSPLIT", 2)
    mine, ref = make(pt.Linear, nn.Linear, k, n)
    mine.to(dtype), ref.to(dtype)
    tol = 5e-2 if dtype != torch.float32 else 1e-4
    check(mine, ref, torch.randn(m, k).to(dtype), atol=tol, rtol=tol)
    assert not any(taken)
    assert _mm(CALLS) == ["matmul", "matmul", "matmul"]


def test_matmul_split_keeps_one_call(taken, monkeypatch):
    """Where pydnn.matmul splits K itself (it asks a workspace for the whole-K problem), its plan runs."""
    import pydnn
    monkeypatch.setattr(tuning.torch, "LINEAR_DW_KSPLIT", 2)
    real = pydnn.get_matmul_ex_workspace_size
    monkeypatch.setattr(pydnn, "get_matmul_ex_workspace_size", lambda h, a, b, c: real(h, a, b, c) or 4096)
    monkeypatch.setattr(PF, "_sizes", type(PF._sizes)())
    mine, ref = make(pt.Linear, nn.Linear, 24, 40, bias=False)
    mine.to(torch.bfloat16), ref.to(torch.bfloat16)
    check(mine, ref, torch.randn(400, 24).to(torch.bfloat16), atol=5e-2, rtol=3e-2)
    assert not any(taken)


def test_dw_splitk_convolution_comes_first(taken, monkeypatch):
    monkeypatch.setattr(tuning.torch, "LINEAR_DW_KSPLIT", 2)
    monkeypatch.setattr(tuning.torch, "LINEAR_DW_SPLITK", True)
    mine, ref = make(pt.Linear, nn.Linear, 24, 40, bias=False)
    mine.to(torch.bfloat16), ref.to(torch.bfloat16)
    check(mine, ref, torch.randn(400, 24).to(torch.bfloat16), atol=5e-2, rtol=3e-2)
    assert _mm(CALLS)[-1] == "conv_bwd_filter" and not taken
