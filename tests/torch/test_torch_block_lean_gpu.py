"""tuning.torch.BLOCK_LEAN and LINEAR_LEAN on the GPU: the CNN demo's model (its fused conv + batch norm + ReLU + max
pool blocks, its Linear with folded casts) trained a few steps with the lean paths against the same model on the
general paths (the same kernels on the same values: the lean paths change where temporaries live, cast by
pydnn.transform_tensor instead of Tensor.to, both round to nearest even, and add the Linear's bias by
pydnn.add_tensor instead of Tensor.add_, both float math rounded once), and in float32 against PyTorch's own modules in float64; a fresh random batch each
step; before each step the stream's kept workspace buffer (where the lean temporaries live) and a large block
handed back to PyTorch's caching allocator (where the outputs come from) are poisoned with 0xFF bytes (NaN in
every float type: close() fails on a value nobody wrote); the lean backward counted (it must have run, both
blocks, every step)."""
import os
import sys

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from pydnn import tuning  # noqa: E402
from pydnn.torch import functional as PF  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from test_torch_fuse_block_gpu import _models as _fuse_models  # noqa: E402
from test_torch_gpu import TOL_SUM, _setup, close, pydnn_runs  # noqa: E402,F401 (_setup: autouse)

pytestmark = pytest.mark.gpu


def _models():
    return _fuse_models(2)


def _poison():
    from pydnn.torch import _core as C
    for ws in C._ws.values():
        ws.fill_(0xFF)
    blk = torch.full((256 << 20,), 0xFF, dtype=torch.uint8, device="cuda")
    del blk  # (back to the caching allocator, poisoned: the step's allocations split it)


def _step(model, x, y, autocast, switches, count):
    _poison()
    real = PF._block_bwd_lean

    def spy(*a):
        count[0] += 1
        return real(*a)
    PF._block_bwd_lean = spy
    try:
        with tuning.override(switches), pydnn_runs():
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
                out = model(x)
                loss = F.cross_entropy(out.float(), y)
            loss.backward()
    finally:
        PF._block_bwd_lean = real
    return out


# (switches on, switches off, lean block backwards a step on / off): BLOCK_LEAN alone (with BLOCK_ARENA, its
# default), BLOCK_ARENA alone (the blocks lean in both runs) and LINEAR_LEAN alone (the blocks lean in both runs)
_CASES = {"block": ({"torch.BLOCK_LEAN": True, "torch.LINEAR_LEAN": False},
                    {"torch.BLOCK_LEAN": False, "torch.LINEAR_LEAN": False}, (2, 0)),
          "arena": ({"torch.BLOCK_LEAN": True, "torch.BLOCK_ARENA": True, "torch.LINEAR_LEAN": False},
                    {"torch.BLOCK_LEAN": True, "torch.BLOCK_ARENA": False, "torch.LINEAR_LEAN": False}, (2, 2)),
          "linear": ({"torch.BLOCK_LEAN": True, "torch.LINEAR_LEAN": True},
                     {"torch.BLOCK_LEAN": True, "torch.LINEAR_LEAN": False}, (2, 2))}


@pytest.mark.parametrize("case", ["block", "arena", "linear"])
@pytest.mark.parametrize("autocast", [True, False], ids=["bf16_autocast", "float32"])
def test_lean_blocks_equal_the_general_path(autocast, case):
    """3 steps (the demo's 3x32x32 digits shape; batch 32 in bf16, 8 in float32 as test_torch_fuse_block_gpu's
    float64 check: at batch 32 the float32 conv 1 weight gradient reached 2.7e-3 max-norm off float64 on the
    general path too, mid-session run of session 32, over the 1e-3 allowed): logits, every parameter gradient
    (float32) and the running statistics of the lean path equal the general path's; in float32 both within the
    summed-product tolerance of PyTorch's float64 modules. case 'linear': LINEAR_LEAN on against off (its casts
    and bias add exist under autocast only: in float32 both runs take Tensor's path); case 'arena': BLOCK_ARENA on
    against off (the arena comes from the poisoned allocator)."""
    (lean, gen_), ref = _models()
    if not autocast:
        ref.double()
    g = torch.Generator(device="cuda").manual_seed(11)
    for step in range(3):
        nb = 32 if autocast else 8
        x = torch.randn(nb, 3, 32, 32, device="cuda", generator=g)
        y = torch.randint(0, 10, (nb,), device="cuda", generator=g)
        for m in (lean, gen_, ref):
            m.zero_grad(set_to_none=True)
        n_lean, n_gen = [0], [0]
        on, off, want = _CASES[case]
        out_l = _step(lean, x, y, autocast, on, n_lean)
        out_g = _step(gen_, x, y, autocast, off, n_gen)
        assert (n_lean[0], n_gen[0]) == want, (n_lean, n_gen)
        dt = torch.bfloat16 if autocast else torch.float32
        assert out_l.dtype == out_g.dtype == dt
        close(out_l, out_g, dt, f"step {step} logits lean / general", tol=1e-6)
        for (n, a), b in zip(lean.named_parameters(), gen_.parameters()):
            assert a.grad is not None and a.grad.dtype == torch.float32, n
            close(a.grad, b.grad, torch.float32, f"step {step} d{n} lean / general", tol=1e-5)
        for (n, a), b in zip(lean.named_buffers(), gen_.buffers()):
            if a.is_floating_point():
                close(a, b, torch.float32, f"step {step} {n} lean / general", tol=1e-6)
            else:
                assert torch.equal(a, b), n
        if not autocast:
            out_r = ref(x.double())
            F.cross_entropy(out_r, y).backward()
            close(out_l, out_r, torch.float32, f"step {step} logits", tol=TOL_SUM[torch.float32])
            for (n, a), r in zip(lean.named_parameters(), ref.parameters()):
                close(a.grad, r.grad, torch.float32, f"step {step} d{n}", tol=5 * TOL_SUM[torch.float32])


# Under CUDA graph capture (the workspace a fresh allocation of the graph's pool): test_torch_fuse_block_gpu.py's
# test_fused_block_under_cuda_graph_capture runs these blocks with BLOCK_LEAN at its default (on).
