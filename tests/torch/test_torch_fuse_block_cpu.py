"""convert(fuse=True)'s conv + batch norm blocks (pydnn.tuning.torch.FUSE_BLOCK: conv + bias + batch norm [+ ReLU]
[+ max pool] in one autograd Function in training) and Linear's folded autocast casts (FOLD_CASTS), on the CPU
against emulated pydnn calls (test_torch_emulated_cpu.py's harness): which patterns fuse (state-dict keys kept),
outputs / gradients / running statistics against PyTorch over training steps and in eval, the switches off
(same results), the bridge's autocast (casts inside the Functions: the same values, float32 parameter
gradients, no cast nodes), and the Python-level work of a training step (counted, not timed: the gain pinned)."""
import os
import sys

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import pydnn.torch as pt  # noqa: E402
from pydnn import tuning  # noqa: E402
from pydnn.torch import _core as C  # noqa: E402
from test_torch_emulated_cpu import CALLS, check, emulated, no_fallback  # noqa: E402,F401


@pytest.fixture(autouse=True)
def _chain_off():
    """(tuning.torch.FUSE_CHAIN off: this file's node counts, reports and Python work are its blocks' own;
    test_torch_chain_*.py covers the chain.)"""
    with tuning.override({"torch.FUSE_CHAIN": False}):
        yield


def _model():
    """The CNN demo's model (examples/train_cnn.py) on 8x8 images."""
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * 2 * 2, 5))


def _pair(seed=3):
    torch.manual_seed(seed)
    ref = _model()
    mine = _model()
    mine.load_state_dict(ref.state_dict())
    keys = list(mine.state_dict())
    report = pt.convert(mine, fuse=True)
    assert list(mine.state_dict()) == keys
    return mine, ref, report


def _nodes(t):
    """Names of the autograd graph's nodes reachable from t."""
    seen, todo, names = set(), [t.grad_fn], []
    while todo:
        f = todo.pop()
        if f is None or f in seen:
            continue
        seen.add(f)
        names.append(type(f).__name__)
        todo.extend(g for g, _ in f.next_functions)
    return names


def test_convert_fuses_blocks(emulated):
    mine, _, report = _pair()
    assert ("0", "1") in report.fused and ("4", "5") in report.fused
    assert mine[0].__dict__["_bn"] is mine[1] and mine[4].__dict__["_bn"] is mine[5]
    assert mine[1].__dict__["_absorbed"] and mine[5].__dict__["_absorbed"]
    assert "_bn" not in dict(mine[0].named_children())  # not a registered child: no new state-dict keys
    # the absorbed batch norm passes its input through (the convolution before it ran it)
    x = torch.randn(2, 8, 4, 4)
    assert mine[1](x) is x


@pytest.mark.parametrize("fuse_block", [True, False])
def test_fused_blocks_match_torch(emulated, fuse_block):
    with tuning.override({"torch.FUSE_BLOCK": fuse_block}):
        mine, ref, _ = _pair()
        for step in range(3):
            mine.zero_grad(), ref.zero_grad()
            x = torch.randn(4, 3, 8, 8)
            y = check(mine, ref, x)
            assert _nodes(y).count("ConvBatchNormFunctionBackward") == (2 if fuse_block else 0)
        for (n, a), b in zip(mine.named_buffers(), ref.buffers()):
            torch.testing.assert_close(a, b, msg=n)  # running statistics and num_batches_tracked
        assert CALLS.count("pool_fwd") == 6 and CALLS.count("bn_fwd_train_ex") == 6
        mine.eval(), ref.eval()
        mine.zero_grad(), ref.zero_grad()
        check(mine, ref, torch.randn(4, 3, 8, 8))  # eval: the convolution, then the batch norm


def test_blocks_not_fused(emulated):
    """A convolution with a fused activation, modules with hooks, and fuse=False keep conv and batch norm apart."""
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.BatchNorm2d(8))
    assert not any(b == "0" or a == "0" and b != "relu" for a, b in pt.convert(m, fuse=True).fused)
    assert "_bn" not in m[0].__dict__
    m = _model()
    m[1].register_forward_hook(lambda mod, i, o: None)
    assert ("0", "1") not in pt.convert(m, fuse=True).fused and ("4", "5") in pt.convert(_model(), fuse=True).fused
    m = _model()
    assert not pt.convert(m).fused and "_bn" not in m[0].__dict__


def _bridge_autocast(monkeypatch):
    """The bridge under CUDA autocast (bf16) as the GPU sees it: the emulated harness runs on the CPU, where
    torch's autocast is off; the bridge's own casts (to autocast's dtype) then run as they do on the GPU."""
    monkeypatch.setattr(C, "autocast_dtype", lambda: torch.bfloat16)


@pytest.mark.parametrize("on", [True, False])
def test_folded_casts_give_autocasts_values(emulated, monkeypatch, on):
    """With the bridge's autocast: the fused blocks and the Linear's folded casts (on) against the unfused path
    with the casts before the Functions (off): the same logits and gradients (the same emulated calls on the
    same bf16 values), float32 parameter gradients, and the autograd graph's cast nodes: one (the logits' to
    float32) against 7 (each convolution's and the Linear's weight and bias, and the logits)."""
    _bridge_autocast(monkeypatch)
    torch.manual_seed(5)
    x, y = torch.randn(4, 3, 8, 8), torch.randint(0, 5, (4,))
    outs = []
    for sw in ({"torch.FUSE_BLOCK": on, "torch.FOLD_CASTS": on}, {"torch.FUSE_BLOCK": False, "torch.FOLD_CASTS": False}):
        mine, _, _ = _pair()
        with tuning.override(sw):
            out = no_fallback(lambda: mine(x))
            loss = F.cross_entropy(out.float(), y)
            no_fallback(loss.backward)
        assert out.dtype == torch.bfloat16
        assert all(p.grad.dtype == torch.float32 for p in mine.parameters())
        outs.append((out, [p.grad for p in mine.parameters()], _nodes(loss).count("ToCopyBackward0")))
    (o1, g1, n1), (o2, g2, n2) = outs
    torch.testing.assert_close(o1, o2, rtol=0, atol=0)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    assert n2 == 7 and n1 == (1 if on else 7)


def _bridge_work(fn):
    """(Python calls in pydnn.torch's code, all Python calls, C calls) made by fn: sys.setprofile events."""
    counts = [0, 0, 0]
    torch_dir = os.sep + os.path.join("pydnn", "torch") + os.sep

    def prof(frame, event, arg):
        if event == "call":
            counts[1] += 1
            if torch_dir in frame.f_code.co_filename:
                counts[0] += 1
        elif event == "c_call":
            counts[2] += 1

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return tuple(counts)


def test_step_python_work(emulated, monkeypatch):
    """The Python-level work of the demo model's training step (forward, loss, backward; the bridge's autocast),
    counted in the bridge's own code (every pydnn compute call an emulated no-op: the fakes' work is not the
    bridge's), with the fused blocks and folded casts against without: fewer bridge calls and fewer autograd
    nodes. The numbers pin the path: a change that adds Python work to the step fails here."""
    _bridge_autocast(monkeypatch)
    import test_torch_emulated_cpu as T
    for f in T.FAKES:  # no compute: the bridge's own calls only (the fakes' Python would dominate the counts)
        if not f.__name__.startswith(("get_", "find_", "create_", "set_", "destroy_", "dropout_get")):
            monkeypatch.setattr(sys.modules["pydnn"], f.__name__, lambda *a, **k: None)
    x, y = torch.randn(4, 3, 8, 8), torch.randint(0, 5, (4,))
    work, nodes = {}, {}
    for on in (True, False):
        sw = {"torch.FUSE_BLOCK": on, "torch.FOLD_CASTS": on}
        mine, _, _ = _pair()
        with tuning.override(sw):
            def step():
                out = mine(x)
                loss = F.cross_entropy(out.float(), y)
                nodes[on] = len(_nodes(loss))
                loss.backward()
            for _ in range(2):  # records and plans made
                step()
            work[on] = _bridge_work(step)
    (b_on, py_on, c_on), (b_off, py_off, c_off) = work[True], work[False]
    # measured on this tree (Python 3.11, torch 2.13 CPU): calls in the bridge's code 76 against 94, all Python
    # calls 252 against 299, C calls 377 against 427; autograd nodes 17 against 25 (the two batch norms' nodes
    # and the six parameter casts' ToCopyBackward gone)
    assert nodes[True] == nodes[False] - 8, nodes
    assert b_on <= b_off - 12 and py_on <= py_off - 30 and c_on < c_off, work
    # the fused path's own budget (measured + ~10%; the bridge's frames only: PyTorch's own Python frames in a
    # step differ between its versions)
    assert b_on <= 85, work


@pytest.mark.parametrize("variant", ["channels_last", "no_bias_no_affine", "momentum_none", "stride2"])
def test_fused_block_variants(emulated, variant):
    """The fused path on other configurations of the pair: channels_last input, a convolution without bias and
    a batch norm without affine parameters, cumulative averages (momentum None), a strided convolution."""
    conv_kw, bn_kw = {"padding": 1}, {}
    if variant == "no_bias_no_affine":
        conv_kw["bias"], bn_kw["affine"] = False, False
    if variant == "momentum_none":
        bn_kw["momentum"] = None
    if variant == "stride2":
        conv_kw["stride"] = 2

    def build():
        return nn.Sequential(nn.Conv2d(3, 8, 3, **conv_kw), nn.BatchNorm2d(8, **bn_kw), nn.ReLU(),
                             nn.Flatten(), nn.Linear(8 * (16 if variant == "stride2" else 64), 5))
    torch.manual_seed(11)
    ref = build()
    mine = build()
    mine.load_state_dict(ref.state_dict())
    assert ("0", "1") in pt.convert(mine, fuse=True).fused
    for _ in range(2):
        mine.zero_grad(), ref.zero_grad()
        x = torch.randn(3, 3, 8, 8)
        if variant == "channels_last":
            x = x.contiguous(memory_format=torch.channels_last)
        y = check(mine, ref, x)
        assert "ConvBatchNormFunctionBackward" in _nodes(y)
    for (n, a), b in zip(mine.named_buffers(), ref.buffers()):
        torch.testing.assert_close(a, b, msg=n)


def test_fused_block_float64(emulated):
    """float64 (the GPU gradcheck's dtype) through the fused path (the two blocks; pydnn's Linear has no
    float64)."""
    torch.manual_seed(4)
    ref = _model()[:8].double()
    mine = _model()[:8].double()
    mine.load_state_dict(ref.state_dict())
    pt.convert(mine, fuse=True)
    y = check(mine, ref, torch.randn(4, 3, 8, 8, dtype=torch.float64), atol=1e-9, rtol=1e-9)
    assert _nodes(y).count("ConvBatchNormFunctionBackward") == 2
