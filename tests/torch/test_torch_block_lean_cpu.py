"""tuning.torch.BLOCK_LEAN on the CPU against emulated pydnn calls (test_torch_emulated_cpu.py's harness; its
'validated' mode runs each real pydnn call first on a CPU sm_90 handle, so every pointer / descriptor pair the
lean path passes goes through pydnn's own checks): the CNN demo's model at its channel counts (3 -> 64 -> 128;
the second block on NHWC copies under BLOCK_NHWC, the first on the plain NCHW path) on 4x4 images, under the
bridge's bf16 autocast and in float32. With the switch the blocks' backward temporaries are pointers into one
workspace buffer and the parameters' casts are transforms: the same logits, gradients and running statistics
as without it (the emulation computes each call in float64 from the same values, and a transform's rounding to
bf16 is Tensor.to's), no torch cast and fewer torch allocations in the bridge a step."""
import os
import sys

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import pydnn.torch as pt  # noqa: E402
from pydnn import tuning  # noqa: E402
from pydnn.torch import _core as C  # noqa: E402
from pydnn.torch import functional as PF  # noqa: E402
from test_torch_block_nhwc_cpu import _model  # noqa: E402 (the demo's model at its channel counts)
from test_torch_emulated_cpu import CALLS, emulated, no_fallback  # noqa: E402,F401


BRIDGE = os.sep + os.path.join("pydnn", "torch") + os.sep
_ALLOC = ("empty", "empty_like", "empty_strided")


def _run(lean, steps=3, grad_x=False, nhwc=True, linear=False, arena=True):
    """steps training steps of the converted model; per step (output, gradients, buffers, pydnn calls, the bridge's
    torch casts, the bridge's torch allocations, lean backward calls)."""
    torch.manual_seed(7)
    ref = _model()
    m = _model()
    m.load_state_dict(ref.state_dict())
    pt.convert(m, fuse=True)
    gen = torch.Generator().manual_seed(3)
    res = []
    real_to = torch.Tensor.to
    reals = {n: getattr(torch, n) for n in _ALLOC}
    lean_bwd = PF._block_bwd_lean
    with tuning.override({"torch.BLOCK_LEAN": lean, "torch.BLOCK_NHWC": nhwc, "torch.LINEAR_LEAN": linear,
                          "torch.BLOCK_ARENA": arena}):
        for _ in range(steps):
            m.zero_grad(set_to_none=True)
            x = torch.randn(2, 3, 4, 4, generator=gen, requires_grad=grad_x)
            y = torch.randint(0, 10, (2,), generator=gen)
            CALLS.clear()
            n = {"to": 0, "alloc": 0, "lean": 0}

            def counting_to(self, *a, **k):  # the bridge's own casts (the fakes cast too)
                n["to"] += BRIDGE in sys._getframe(1).f_code.co_filename
                return real_to(self, *a, **k)

            def counting(name):
                def f(*a, **k):
                    n["alloc"] += BRIDGE in sys._getframe(1).f_code.co_filename
                    return reals[name](*a, **k)
                return f

            def spy(*a):
                n["lean"] += 1
                return lean_bwd(*a)
            torch.Tensor.to = counting_to
            for name in _ALLOC:
                setattr(torch, name, counting(name))
            PF._block_bwd_lean = spy
            try:
                out = no_fallback(lambda: m(x))
                loss = F.cross_entropy(out.float(), y)
                no_fallback(loss.backward)
            finally:
                torch.Tensor.to = real_to
                for name in _ALLOC:
                    setattr(torch, name, reals[name])
                PF._block_bwd_lean = lean_bwd
            res.append((out.detach().clone(), {k: p.grad.clone() for k, p in m.named_parameters()},
                        {k: b.clone() for k, b in m.named_buffers()}, list(CALLS), n,
                        None if x.grad is None else x.grad.clone()))
    return res


def _same(on, off):
    for (o1, g1, b1, _, _, x1), (o2, g2, b2, _, _, x2) in zip(on, off):
        assert o1.dtype == o2.dtype and o1.stride() == o2.stride()
        torch.testing.assert_close(o1, o2, rtol=0, atol=0)
        for k in g1:
            assert g1[k].dtype == g2[k].dtype == torch.float32, k
            torch.testing.assert_close(g1[k], g2[k], rtol=0, atol=0, msg=k)
        for k in b1:
            torch.testing.assert_close(b1[k], b2[k], rtol=0, atol=0, msg=k)
        if x1 is not None or x2 is not None:
            torch.testing.assert_close(x1, x2, rtol=0, atol=0)


@pytest.mark.parametrize("nhwc", [True, False])
def test_lean_block_bf16_same_values_no_casts(emulated, monkeypatch, nhwc):
    """bf16 autocast (the demo's): the values of the general path, no torch cast in the blocks and 9 torch
    allocations fewer a steady step (BLOCK_NHWC on: the pool's and batch norm's gradients of both blocks, the
    second block's NHWC input and weight gradients, the first block's 16-bit weight gradient, both blocks' 16-bit
    bias gradients, and the forward's two 16-bit biases: 11, less the batch norm's parameter gradients as two
    allocations instead of one unbound), both blocks' backward on the lean path. BLOCK_NHWC off:
    the second block's convolution runs on NHWC copies with its output transposed back, which the lean path does
    not take (the general path there), the first block's is lean."""
    monkeypatch.setattr(C, "autocast_dtype", lambda: torch.bfloat16)  # the bridge's autocast, as on the GPU
    on = _run(True, nhwc=nhwc)
    off = _run(False, nhwc=nhwc)
    _same(on, off)
    n_on, n_off = on[-1][4], off[-1][4]
    assert n_on["lean"] == (2 if nhwc else 1) and n_off["lean"] == 0, (n_on, n_off)
    # left: the input's autocast cast (conv_batch_norm), the Linear's weight / bias casts and its gradients'
    # (BLOCK_NHWC off: the second block's weight, bias and their gradients cast by Tensor.to in both runs: 4)
    assert n_on["to"] == (5 if nhwc else 9) and n_off["to"] == (11 if nhwc else 13), (n_on, n_off)
    if nhwc:  # (a Tensor.to allocates its output too; BLOCK_ARENA, on: 7 allocations fewer, see test_block_arena_*)
        assert n_off["alloc"] + n_off["to"] - (n_on["alloc"] + n_on["to"]) == 9 + 7, (n_on, n_off)
    # the same compute calls in the same order, casts aside (the transforms are the lean path's casts)
    def compute(cs):
        return [c for c in cs if c != "transform" and not c.startswith(("get_", "find_", "validated:"))]
    assert compute(on[-1][3]) == compute(off[-1][3])


def test_linear_lean_same_values(emulated, monkeypatch):
    """tuning.torch.LINEAR_LEAN (bf16 autocast, FOLD_CASTS): the Linear's weight / bias casts and their gradients'
    by transform_tensor, the bias added by add_tensor: the values of Tensor.to / add_, five torch operations fewer
    (the Linear's four casts and its add, for three allocations: its 16-bit weight and two float32 gradients)."""
    monkeypatch.setattr(C, "autocast_dtype", lambda: torch.bfloat16)
    on = _run(True, linear=True)
    off = _run(True, linear=False)
    _same(on, off)
    n_on, n_off = on[-1][4], off[-1][4]
    assert n_on["to"] == 1 and n_off["to"] == 5, (n_on, n_off)  # (the input's autocast cast is left)
    assert n_on["alloc"] == n_off["alloc"] + 3, (n_on, n_off)
    assert on[-1][3].count("add_tensor") == 1 and "add_tensor" not in off[-1][3]


def test_lean_block_float32_same_values(emulated):
    """float32 (no autocast: no casts at all; the second block plain NCHW too, not being 16-bit): the general path's
    values, an input gradient included (the backward data into a real tensor, its workspace before the
    temporaries)."""
    on = _run(True, grad_x=True)
    off = _run(False, grad_x=True)
    _same(on, off)
    assert on[-1][4]["lean"] == 2 and on[-1][4]["to"] == off[-1][4]["to"] == 0
    assert on[-1][4]["alloc"] < off[-1][4]["alloc"]


def test_lean_scratch_layout(emulated, monkeypatch):
    """The lean backward's temporaries start after the largest workspace its calls ask and do not overlap."""
    monkeypatch.setattr(C, "autocast_dtype", lambda: torch.bfloat16)
    _run(True, steps=2)
    plans = [(rec, key[1], lb) for rec in PF._recs.values() if rec and isinstance(rec, PF._BlockRec)
             for key, lb in rec.bn.lean.items() if lb]
    assert len(plans) == 2, plans
    for rec, need, lb in plans:  # (the workspaces of the calls the needs make)
        cp = rec.conv.pl.nhwc if rec.nhwc else rec.conv.pl
        assert lb.ws >= max(lb.nws_bn, cp.bwd_data_ws if need[0] else 0, cp.bwd_filter_ws if need[1] else 0)
        offs = sorted(o for o in (lb.pdy, lb.bdx, lb.dxh, lb.dw16, lb.db16) if o >= 0)
        assert offs[0] == lb.ws and offs == sorted(set(offs)) and offs[-1] < lb.total
        assert all(o % 256 == 0 for o in offs)


def test_lean_off_under_strided_dz(emulated, monkeypatch):
    """A gradient that reaches the block in other strides than its output's takes the general path (the lean
    pool backward reads dz through the pool record's descriptor)."""
    monkeypatch.setattr(C, "autocast_dtype", lambda: torch.bfloat16)
    torch.manual_seed(1)
    m = _model()[:4]
    pt.convert(m, fuse=True)
    x = torch.randn(2, 3, 4, 4)
    calls = []
    real = PF._block_bwd_lean
    monkeypatch.setattr(PF, "_block_bwd_lean", lambda *a: calls.append(1) or real(*a))
    for _ in range(2):
        out = no_fallback(lambda: m(x))
        g = torch.randn(out.shape[::-1]).permute(3, 2, 1, 0)  # same shape, other strides
        no_fallback(lambda: out.backward(g))
    assert not calls


@pytest.mark.parametrize("nhwc", [True, False])
def test_block_arena_same_values(emulated, monkeypatch, nhwc):
    """tuning.torch.BLOCK_ARENA (bf16 autocast): the lean blocks' forward tensors that only their backward reads in
    one allocation each: the values without it, the same pydnn calls, both blocks' backward on the lean path, 7
    torch allocations fewer a step (the second block's NHWC copies of x and of the filter, the first block's 16-bit
    filter, both convolution outputs, both batch-norm outputs and buffers: 9, less the two arenas; BLOCK_NHWC off:
    the second block takes the general path, the first block 3 allocations fewer: 4 in its arena)."""
    monkeypatch.setattr(C, "autocast_dtype", lambda: torch.bfloat16)
    on = _run(True, nhwc=nhwc)
    off = _run(True, nhwc=nhwc, arena=False)
    _same(on, off)
    n_on, n_off = on[-1][4], off[-1][4]
    assert n_on["lean"] == n_off["lean"] == (2 if nhwc else 1), (n_on, n_off)
    assert n_on["to"] == n_off["to"] and n_off["alloc"] - n_on["alloc"] == (7 if nhwc else 3), (n_on, n_off)
    assert on[-1][3] == off[-1][3]


def test_block_arena_float32_input_gradient(emulated):
    """float32 (no casts: the first block's filter read as it is, not copied into the arena), an input gradient
    included: the values without the arena."""
    on = _run(True, grad_x=True)
    off = _run(True, grad_x=True, arena=False)
    _same(on, off)
    assert on[-1][4]["lean"] == 2 and on[-1][4]["alloc"] < off[-1][4]["alloc"]


def test_block_arena_layout(emulated, monkeypatch):
    """Each lean block's arena: its parts 256-byte aligned, in order, not overlapping, sized for their tensors."""
    monkeypatch.setattr(C, "autocast_dtype", lambda: torch.bfloat16)
    _run(True, steps=1)
    recs = [rec for rec in PF._recs.values() if rec and isinstance(rec, PF._BlockRec) and rec.lean is not None]
    assert len(recs) == 2 and sorted(r.nhwc for r in recs) == [False, True]
    for rec in recs:
        lf, es = rec.lean, 2
        n = 1
        for d in (rec.conv.pl.nhwc if rec.nhwc else rec.conv.pl).y_shape:
            n *= d
        xn = wn = 1
        for d in lf.x_shape:
            xn *= d
        for d in lf.w_shape:
            wn *= d
        parts = [(lf.o_xc, xn * es), (lf.o_wc, wn * es), (lf.o_y, n * es), (lf.o_yb, n * es), (lf.o_buf, rec.bn.nbuf)]
        parts = [(o, sz) for o, sz in parts if o >= 0]
        assert len(parts) == (5 if rec.nhwc else 4)  # (the first block's x is read as it is; its filter is cast)
        end = 0
        for o, sz in parts:
            assert o % 256 == 0 and o >= end, (o, end)
            end = o + sz
        assert end <= lf.arena


def test_block_arena_general_backward_same_values(emulated, monkeypatch):
    """A gradient in other strides than the block's output takes the general backward, on views of the arena: the
    values of the general path without it."""
    monkeypatch.setattr(C, "autocast_dtype", lambda: torch.bfloat16)
    res = []
    for arena in (True, False):
        torch.manual_seed(1)
        m = _model()[:4]
        pt.convert(m, fuse=True)
        gen = torch.Generator().manual_seed(5)
        calls = []
        real = PF._block_bwd_lean
        monkeypatch.setattr(PF, "_block_bwd_lean", lambda *a: calls.append(1) or real(*a))
        outs = []
        with tuning.override({"torch.BLOCK_ARENA": arena}):
            for _ in range(2):
                m.zero_grad(set_to_none=True)
                x = torch.randn(2, 3, 4, 4, generator=gen)
                out = no_fallback(lambda: m(x))
                g = torch.randn(out.shape[::-1], generator=gen).permute(3, 2, 1, 0)  # same shape, other strides
                no_fallback(lambda: out.backward(g))
                outs.append((out.detach().clone(), {k: p.grad.clone() for k, p in m.named_parameters()},
                             {k: b.clone() for k, b in m.named_buffers()}, [], {}, None))
        assert not calls
        res.append(outs)
    _same(*res)
