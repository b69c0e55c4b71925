"""convert(fuse=True)'s conv + batch norm blocks (pydnn.tuning.torch.FUSE_BLOCK: conv + bias + batch norm + ReLU
+ max pool in one autograd Function) and Linear's folded autocast casts (tuning.torch.FOLD_CASTS) on the GPU:
the CNN demo's model trained a few steps with the switches on against the same model with them off (the same
pydnn calls in the same order) and against PyTorch's own modules in float64 on the same inputs; in bf16 autocast
against PyTorch's autocast step. Every check asserts that pydnn ran (no fallback)."""
import os
import sys

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from pydnn import tuning  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "examples"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import train_cnn  # noqa: E402
from test_torch_gpu import TOL_SUM, close, pydnn_runs  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _chain_off():
    """(tuning.torch.FUSE_CHAIN off: this file's node counts, reports and Python work are its blocks' own;
    test_torch_chain_*.py covers the chain.)"""
    with tuning.override({"torch.FUSE_CHAIN": False}):
        yield


@pytest.fixture(autouse=True)
def _setup():
    if not torch.cuda.is_available():
        pytest.skip("PyTorch sees no CUDA device")
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def _models(n):
    torch.manual_seed(0)
    init = train_cnn.build("torch").state_dict()
    out = []
    for _ in range(n):
        m = train_cnn.build("pydnn").cuda()
        m.load_state_dict(init)
        out.append(m)
    ref = train_cnn.build("torch").cuda()
    ref.load_state_dict(init)
    return out, ref


def _step(model, x, y, autocast):
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        out = model(x)
        loss = F.cross_entropy(out, y)
    loss.backward()
    return out, loss


def _nodes(loss):
    """Names of the autograd graph's nodes reachable from loss."""
    seen, todo, names = set(), [loss.grad_fn], []
    while todo:
        f = todo.pop()
        if f is None or f in seen:
            continue
        seen.add(f)
        names.append(type(f).__name__)
        todo.extend(g for g, _ in f.next_functions)
    return names


def test_demo_model_fused_blocks_float32():
    """float32, 3 training steps: the fused blocks give the unfused path's outputs, gradients and running
    statistics (the same kernels) and PyTorch's float64 ones within the summed-product tolerance."""
    (on, off), ref = _models(2)
    ref.double()
    gen = torch.Generator(device="cuda").manual_seed(1)
    for step in range(3):
        x = torch.randn(8, 3, 32, 32, device="cuda", generator=gen)
        y = torch.randint(0, 10, (8,), device="cuda", generator=gen)
        for m in (on, off, ref):
            m.zero_grad(set_to_none=True)
        with tuning.override({"torch.FUSE_BLOCK": True}), pydnn_runs():
            out_on, loss = _step(on, x, y, False)
        names = _nodes(loss)
        assert names.count("ConvBatchNormFunctionBackward") == 2, names
        with tuning.override({"torch.FUSE_BLOCK": False}), pydnn_runs():
            out_off, loss_off = _step(off, x, y, False)
        assert "ConvBatchNormFunctionBackward" not in _nodes(loss_off)
        out_ref, _ = _step(ref, x.double(), y, False)
        close(out_on, out_off, torch.float32, f"step {step} logits on / off", tol=1e-5)
        close(out_on, out_ref, torch.float32, f"step {step} logits", tol=TOL_SUM[torch.float32])
        for (n, a), b, r in zip(on.named_parameters(), off.parameters(), ref.parameters()):
            close(a.grad, b.grad, torch.float32, f"step {step} d{n} on / off", tol=1e-5)
            close(a.grad, r.grad, torch.float32, f"step {step} d{n}", tol=5 * TOL_SUM[torch.float32])
        for (n, a), b, r in zip(on.named_buffers(), off.buffers(), ref.buffers()):
            if a.is_floating_point():
                close(a, b, torch.float32, f"step {step} {n} on / off", tol=1e-6)
                close(a, r, torch.float32, f"step {step} {n}", tol=1e-4)
            else:
                assert torch.equal(a, b) and torch.equal(a, r), n  # num_batches_tracked
    on.eval(), ref.eval()
    x = torch.randn(8, 3, 32, 32, device="cuda", generator=gen)
    with torch.no_grad(), pydnn_runs():
        close(on(x), ref(x.double()), torch.float32, "eval logits", tol=TOL_SUM[torch.float32])


BIAS_BEFORE_BN = ("0.bias", "4.bias")  # the demo model's conv biases, each followed by a BatchNorm2d


def test_demo_model_fused_blocks_bf16_autocast():
    """bf16 autocast (the demo's): the fused blocks and folded casts against the unfused path with autocast's
    own casts (equal up to the kernels' nondeterminism) and against PyTorch's autocast step (logits within the
    bf16 tolerance; each parameter gradient in the same direction: two bf16 backward chains through two batch
    norms differ by more than one op's rounding -- conv 1's weight gradient by 0.096 max-norm on the H200, mid
    run of session 30 -- so the float32 test is the one against float64 values); float32 parameter gradients;
    the autograd graph keeps one cast node (the logits' to float32 for the loss) instead of 7."""
    (on, off), ref = _models(2)
    gen = torch.Generator(device="cuda").manual_seed(2)
    for step in range(2):
        x = torch.randn(16, 3, 32, 32, device="cuda", generator=gen)
        y = torch.randint(0, 10, (16,), device="cuda", generator=gen)
        for m in (on, off, ref):
            m.zero_grad(set_to_none=True)
        with tuning.override({"torch.FUSE_BLOCK": True, "torch.FOLD_CASTS": True}), pydnn_runs():
            out_on, loss = _step(on, x, y, True)
        names = _nodes(loss)
        assert names.count("ConvBatchNormFunctionBackward") == 2 and names.count("ToCopyBackward0") == 1, names
        with tuning.override({"torch.FUSE_BLOCK": False, "torch.FOLD_CASTS": False}), pydnn_runs():
            out_off, loss_off = _step(off, x, y, True)
        assert _nodes(loss_off).count("ToCopyBackward0") == 7
        out_ref, _ = _step(ref, x, y, True)
        assert out_on.dtype == out_off.dtype == out_ref.dtype == torch.bfloat16
        close(out_on, out_off, torch.bfloat16, f"step {step} logits on / off", tol=1e-2)
        close(out_on, out_ref, torch.bfloat16, f"step {step} logits", tol=TOL_SUM[torch.bfloat16])
        for (n, a), b, r in zip(on.named_parameters(), off.parameters(), ref.parameters()):
            assert a.grad.dtype == torch.float32, n
            close(a.grad, b.grad, torch.bfloat16, f"step {step} d{n} on / off", tol=2e-2)
            if n in BIAS_BEFORE_BN:
                # a training batch norm removes each channel's mean, so the conv bias before it has a gradient of
                # exactly 0: both backends' values are rounding noise (a direction means nothing; cosine 0.63 on
                # the H200, final run of session 30); pydnn's noise is no larger than a few times PyTorch's
                assert a.grad.norm() <= 4 * r.grad.norm() + 1e-6, f"step {step} d{n}: {a.grad.norm():.3g} " \
                    f"against PyTorch's {r.grad.norm():.3g} (both should be rounding noise around 0)"
                continue
            cos = F.cosine_similarity(a.grad.double().flatten(), r.grad.double().flatten(), dim=0).item()
            assert cos > 0.99, f"step {step} d{n}: cosine {cos:.4f} against PyTorch's autocast gradient"
        for (n, a), r in zip(on.named_buffers(), ref.buffers()):
            if a.is_floating_point():
                close(a, r, torch.bfloat16, f"step {step} {n}", tol=2e-2)


def test_fused_block_under_cuda_graph_capture():
    """The fused block's forward and backward captured in a CUDA graph (make_graphed_callables, the demo's
    --cuda-graph model) replay the eager results."""
    (m,), _ = _models(1)
    x = torch.randn(8, 3, 32, 32, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
        g = torch.cuda.make_graphed_callables(m, (x.clone(),))
    (e,), _ = _models(1)
    e.load_state_dict(m.state_dict())
    xs = torch.randn(8, 3, 32, 32, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
        out = g(xs)
        want = e(xs)
    out.float().sum().backward()
    want.float().sum().backward()
    close(out, want, torch.bfloat16, "graphed logits", tol=2e-2)
    for (n, a), b in zip(m.named_parameters(), e.parameters()):
        close(a.grad, b.grad, torch.bfloat16, f"graphed d{n}", tol=2e-2)


def test_conv_batch_norm_gradcheck_float64():
    """pydnn.torch.functional.conv_batch_norm (conv + bias + batch norm + ReLU + max pool, one Function) in
    float64: autograd's gradcheck (running statistics on: each evaluation moves them; the output does not
    read them in training)."""
    from pydnn.torch import functional as PF
    dev = "cuda"
    torch.manual_seed(6)
    x = torch.randn(3, 2, 6, 6, device=dev, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 2, 3, 3, device=dev, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, device=dev, dtype=torch.float64, requires_grad=True)
    g = torch.rand(4, device=dev, dtype=torch.float64, requires_grad=True) + 0.5
    beta = torch.randn(4, device=dev, dtype=torch.float64, requires_grad=True)
    rm, rv = torch.zeros(4, device=dev, dtype=torch.float64), torch.ones(4, device=dev, dtype=torch.float64)

    def f(x, w, b, g, beta):
        return PF.conv_batch_norm(x, w, b, 1, 1, 1, 1, rm, rv, g, beta, True, 0.1, 1e-5, "relu", (2, 2, 0))

    with tuning.override({"torch.FUSE_BLOCK": True}), pydnn_runs():
        y = f(x, w, b, g, beta)
        assert type(y.grad_fn).__name__ == "ConvBatchNormFunctionBackward"
        assert torch.autograd.gradcheck(f, (x, w, b, g, beta))
