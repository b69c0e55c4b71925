"""tuning.torch.FUSE_CHAIN on the GPU: the CNN demo's model converted with the switch on (pydnn.torch.modules.Sequential:
its two fused blocks, Flatten and Linear one autograd node in training) against the same model module by module
(the same kernels on the same values; the module path's own float64 checks are test_torch_fuse_block_gpu.py's and
test_torch_block_lean_gpu.py's, at batch 8: at this test's batch 32 the float32 conv 1 weight gradient was 2.7e-3
max-norm off float64 on both paths alike, mid-session run of session 32, over the 1e-3 they allow); a fresh random
batch each step, the kept workspace and a large freed block poisoned before each step (test_torch_block_lean_gpu's
_poison), the chain counted (it must have run from the second step on: the first may make the records)."""
import os
import sys

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from pydnn import tuning  # noqa: E402
from pydnn.torch import functional as PF  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from test_torch_block_lean_gpu import _poison  # noqa: E402
from test_torch_fuse_block_gpu import _models as _fuse_models  # noqa: E402
from test_torch_gpu import _setup, close, pydnn_runs  # noqa: E402,F401 (_setup: autouse)

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("autocast", [True, False], ids=["bf16_autocast", "float32"])
def test_chain_equals_the_module_path(autocast):
    with tuning.override({"torch.FUSE_CHAIN": True}):
        (chained, _), _ = _fuse_models(2)
    (plain, _), _ = _fuse_models(2)
    assert type(chained).__name__ == "Sequential" and type(chained).__module__ == "pydnn.torch.modules"
    g = torch.Generator(device="cuda").manual_seed(12)
    real = PF.ChainFunction.forward
    n = [0]

    def spy(*a):
        n[0] += 1
        return real(*a)
    for step in range(3):
        x = torch.randn(32, 3, 32, 32, device="cuda", generator=g)
        y = torch.randint(0, 10, (32,), device="cuda", generator=g)
        outs = []
        for m, on in ((chained, True), (plain, False)):
            m.zero_grad(set_to_none=True)
            _poison()
            n[0] = 0
            PF.ChainFunction.forward = staticmethod(spy)
            try:
                with tuning.override({"torch.FUSE_CHAIN": on}), pydnn_runs():
                    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
                        out = m(x)
                        loss = F.cross_entropy(out.float(), y)
                    loss.backward()
            finally:
                PF.ChainFunction.forward = real
            # (step 0 may go module by module: the records of these shapes may not exist yet)
            assert n[0] == int(on) or (on and step == 0 and n[0] == 0), (step, on, n[0])
            outs.append(out)
        dt = torch.bfloat16 if autocast else torch.float32
        close(outs[0], outs[1], dt, f"step {step} logits chain / modules", tol=1e-6)
        for (k, a), b in zip(chained.named_parameters(), plain.parameters()):
            assert a.grad is not None and a.grad.dtype == torch.float32, k
            close(a.grad, b.grad, torch.float32, f"step {step} d{k} chain / modules", tol=1e-5)
        for (k, a), b in zip(chained.named_buffers(), plain.buffers()):
            if a.is_floating_point():
                close(a, b, torch.float32, f"step {step} {k} chain / modules", tol=1e-6)
            else:
                assert torch.equal(a, b), k


def test_chain_under_cuda_graph_capture():
    """The chain captured in CUDA graphs (make_graphed_callables under bf16 autocast, the demo's --cuda-graph model:
    its warm-up makes the records, the capture runs the chain) replays the eager chain's values."""
    with tuning.override({"torch.FUSE_CHAIN": True}):
        (m, e), _ = _fuse_models(2)
        x = torch.randn(16, 3, 32, 32, device="cuda")
        real = PF.ChainFunction.forward
        n = [0]

        def spy(*a):
            n[0] += 1
            return real(*a)
        PF.ChainFunction.forward = staticmethod(spy)
        try:
            with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
                gm = torch.cuda.make_graphed_callables(m, (x.clone(),))
        finally:
            PF.ChainFunction.forward = real
        assert n[0] >= 1, n  # (the capture ran the chain)
        e.load_state_dict(m.state_dict())
        xs = torch.randn(16, 3, 32, 32, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
            out = gm(xs)
            want = e(xs)
        out.float().sum().backward()
        want.float().sum().backward()
    close(out, want, torch.bfloat16, "graphed logits", tol=2e-2)
    for (k, a), b in zip(m.named_parameters(), e.parameters()):
        close(a.grad, b.grad, torch.bfloat16, f"graphed d{k}", tol=2e-2)
