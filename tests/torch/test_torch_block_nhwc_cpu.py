"""tuning.torch.BLOCK_NHWC on the CPU against emulated pydnn calls (test_torch_emulated_cpu.py's harness; its
'validated' mode runs each real pydnn call first on a CPU sm_90 handle): the CNN demo's model at its channel
counts (3 -> 64 -> 128: the second block's convolution runs on NHWC copies, CONV_NHWC_FWD) on 4x4 images under
the bridge's bf16 autocast. With the switch, that block's batch norm and max pool read the NHWC convolution
output (the pool writing the block's NCHW output), the batch-norm gradient goes to the NHWC convolution
backward as it is, and the float32 weight is cast in the transform to its NHWC copy (the gradient back to
float32 in the transform to NCHW): the same logits, gradients and running statistics as without it (the
emulation computes each call in float64 from the same values, so equal), two transforms and two casts fewer
a step, the output's layout unchanged."""
import os
import sys

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import pydnn.torch as pt  # noqa: E402
from pydnn import tuning  # noqa: E402
from pydnn.torch import _core as C  # noqa: E402
from test_torch_emulated_cpu import CALLS, emulated, no_fallback  # noqa: E402,F401


def _model():
    return nn.Sequential(
        nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(128, 10))


bridge = os.sep + os.path.join("pydnn", "torch") + os.sep


def _run(on, steps=2, capture=False, lean=False):
    """(BLOCK_LEAN and LINEAR_LEAN off by default: their casts are transforms too; this file pins BLOCK_NHWC's own
    counts.)"""
    torch.manual_seed(7)
    ref = _model()
    m = _model()
    m.load_state_dict(ref.state_dict())
    pt.convert(m, fuse=True)
    gen = torch.Generator().manual_seed(3)
    outs, calls, casts = [], [], []
    with tuning.override({"torch.BLOCK_NHWC": on, "torch.BLOCK_LEAN": lean, "torch.LINEAR_LEAN": lean}):
        for _ in range(steps):
            m.zero_grad(set_to_none=True)
            x = torch.randn(2, 3, 4, 4, generator=gen)
            y = torch.randint(0, 10, (2,), generator=gen)
            CALLS.clear()
            n_to = [0]
            real_to = torch.Tensor.to

            def counting_to(self, *a, **k):  # the bridge's own casts (the fakes cast too)
                n_to[0] += bridge in sys._getframe(1).f_code.co_filename
                return real_to(self, *a, **k)
            torch.Tensor.to = counting_to
            if capture:  # (the bridge asks torch.cuda.is_current_stream_capturing: the harness's stand-in)
                torch.cuda.is_current_stream_capturing = lambda: True
            try:
                out = no_fallback(lambda: m(x))
                loss = F.cross_entropy(out.float(), y)
                no_fallback(loss.backward)
            finally:
                torch.Tensor.to = real_to
                if capture:
                    torch.cuda.is_current_stream_capturing = lambda: False
            calls.append(list(CALLS))
            casts.append(n_to[0])
            outs.append((out.detach().clone(), {n: p.grad.clone() for n, p in m.named_parameters()},
                         {n: b.clone() for n, b in m.named_buffers()}, out.stride()))
    return outs, calls, casts


def test_block_nhwc_same_values_fewer_calls(emulated, monkeypatch):
    monkeypatch.setattr(C, "autocast_dtype", lambda: torch.bfloat16)  # the bridge's autocast, as on the GPU
    on, calls_on, casts_on = _run(True)
    off, calls_off, casts_off = _run(False)
    for (o1, g1, b1, s1), (o2, g2, b2, s2) in zip(on, off):
        assert o1.dtype == torch.bfloat16 and s1 == s2 == o1.contiguous().stride()
        torch.testing.assert_close(o1, o2, rtol=0, atol=0)
        for n in g1:
            assert g1[n].dtype == torch.float32, n
            torch.testing.assert_close(g1[n], g2[n], rtol=1e-6, atol=1e-7, msg=n)
        for n in b1:
            torch.testing.assert_close(b1[n], b2[n], rtol=1e-6, atol=1e-7, msg=n)
    for c_on, c_off, t_on, t_off in zip(calls_on, calls_off, casts_on, casts_off):
        # off: x, w, y forward and dy, dx, dw backward; on: x, w (cast in it) forward, dx, dw (cast in it) backward
        assert c_off.count("transform") == 6 and c_on.count("transform") == 4, (c_on, c_off)
        def compute(cs):  # (the first steps' size queries: plans the two runs share)
            return [c for c in cs if c != "transform" and not c.startswith(("get_", "find_", "validated:"))]
        assert compute(c_on) == compute(c_off), (c_on, c_off)
    # the steady step (the first one makes records: the run that goes first pays their casts): the second block's
    # weight cast and its gradient's gone
    assert casts_on[-1] == casts_off[-1] - 2, (casts_on, casts_off)


def test_block_nhwc_is_eager_only(emulated, monkeypatch):
    """Under CUDA graph capture a BLOCK_NHWC block takes the path without it (its mixed-layout max-pool backward
    costs GPU time, which a captured step spends): the calls and values of the switch off."""
    monkeypatch.setattr(C, "autocast_dtype", lambda: torch.bfloat16)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    cap, calls_cap, _ = _run(True, capture=True)
    off, calls_off, _ = _run(False, capture=True)
    for c_cap, c_off in zip(calls_cap, calls_off):
        assert c_cap.count("transform") == c_off.count("transform") == 6, (c_cap, c_off)
    for (o1, g1, b1, _), (o2, g2, b2, _) in zip(cap, off):
        torch.testing.assert_close(o1, o2, rtol=0, atol=0)
        for n in g1:
            torch.testing.assert_close(g1[n], g2[n], rtol=0, atol=0, msg=n)
