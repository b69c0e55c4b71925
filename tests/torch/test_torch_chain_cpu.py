"""tuning.torch.FUSE_CHAIN on the CPU against emulated pydnn calls (test_torch_emulated_cpu.py's harness; 'validated'
runs each real pydnn call first on a CPU sm_90 handle): convert(fuse=True) gives the CNN demo's nn.Sequential
pydnn.torch.modules.Sequential, whose training forward runs its stages (two conv + batch norm blocks, Flatten,
Linear) as one autograd node once their records exist: the same logits, gradients, running statistics and
num_batches_tracked as module by module, one node instead of three, no module call of the children; and the
module path wherever the chain does not apply (hooks, eval mode, the switch off)."""
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import pydnn.torch as pt  # noqa: E402
from pydnn import tuning  # noqa: E402
from pydnn.torch import _core as C  # noqa: E402
from pydnn.torch import functional as PF  # noqa: E402
from pydnn.torch import modules as M  # noqa: E402
from test_torch_block_nhwc_cpu import _model  # noqa: E402 (the demo's model at its channel counts)
from test_torch_emulated_cpu import emulated, no_fallback  # noqa: E402,F401
from test_torch_fuse_block_cpu import _nodes  # noqa: E402


def _convert(m):
    with tuning.override({"torch.FUSE_CHAIN": True}):  # (convert gives the class where the switch is on)
        return pt.convert(m, fuse=True)


def _run(chain, steps=3, grad_x=False, hook=False):
    torch.manual_seed(7)
    m = _model()
    rep = _convert(m)
    assert type(m) is M.Sequential and ("(model)", "chain") in rep.fused
    if hook:
        m[9].register_forward_hook(lambda mod, i, o: None)
    gen = torch.Generator().manual_seed(3)
    res = []
    calls = []
    real = PF.ChainFunction.forward

    def spy(*a):
        calls.append(1)
        return real(*a)
    with tuning.override({"torch.FUSE_CHAIN": chain}):
        PF.ChainFunction.forward = staticmethod(spy)
        try:
            for _ in range(steps):
                m.zero_grad(set_to_none=True)
                x = torch.randn(2, 3, 4, 4, generator=gen, requires_grad=grad_x)
                y = torch.randint(0, 10, (2,), generator=gen)
                n0 = len(calls)
                out = no_fallback(lambda: m(x))
                loss = F.cross_entropy(out.float(), y)
                no_fallback(loss.backward)
                res.append((out.detach().clone(), {k: p.grad.clone() for k, p in m.named_parameters()},
                            {k: b.clone() for k, b in m.named_buffers()},
                            None if x.grad is None else x.grad.clone(), len(calls) - n0, _nodes(out)))
        finally:
            PF.ChainFunction.forward = real
    return res


def _same(a, b):
    for (o1, g1, b1, x1, _, _), (o2, g2, b2, x2, _, _) in zip(a, b):
        assert o1.dtype == o2.dtype
        torch.testing.assert_close(o1, o2, rtol=0, atol=0)
        for k in g1:
            assert g1[k].dtype == g2[k].dtype, k
            torch.testing.assert_close(g1[k], g2[k], rtol=0, atol=0, msg=k)
        for k in b1:
            torch.testing.assert_close(b1[k], b2[k], rtol=0, atol=0, msg=k)
        if x1 is not None or x2 is not None:
            torch.testing.assert_close(x1, x2, rtol=0, atol=0)


@pytest.mark.parametrize("autocast", [True, False], ids=["bf16_autocast", "float32"])
def test_chain_same_values_one_node(emulated, monkeypatch, autocast):
    """The first step module by module (it makes the records), then the chain: the values of the module path
    (num_batches_tracked counted once a step), one pydnn node in the graph instead of three."""
    if autocast:
        monkeypatch.setattr(C, "autocast_dtype", lambda: torch.bfloat16)
    on = _run(True, grad_x=not autocast)
    off = _run(False, grad_x=not autocast)
    _same(on, off)
    assert [r[4] for r in on] == [0, 1, 1] and all(r[4] == 0 for r in off), ([r[4] for r in on], [r[4] for r in off])
    names_on, names_off = on[-1][5], off[-1][5]
    assert names_on.count("ChainFunctionBackward") == 1 and "ConvBatchNormFunctionBackward" not in names_on
    assert names_off.count("ConvBatchNormFunctionBackward") == 2 and "ChainFunctionBackward" not in names_off
    assert on[-1][2]["1.num_batches_tracked"].item() == 3


def test_chain_not_taken_with_hooks_or_in_eval(emulated, monkeypatch):
    """A forward hook on a child (it would not run inside the chain), and eval mode: the module path."""
    monkeypatch.setattr(C, "autocast_dtype", lambda: torch.bfloat16)
    hooked = _run(True, hook=True)
    assert all(r[4] == 0 for r in hooked)
    torch.manual_seed(7)
    m = _model()
    _convert(m)
    x = torch.randn(2, 3, 4, 4)
    with tuning.override({"torch.FUSE_CHAIN": True}):
        no_fallback(lambda: m(x))
        m.eval()
        with torch.no_grad():
            out = no_fallback(lambda: m(x))
    assert out.grad_fn is None and m.__dict__["_chain"][1] is not None


def test_convert_keeps_other_sequentials(emulated):
    """Only a Sequential whose children all make chain stages changes class (a ReLU left unfused, a single stage:
    nn.Sequential stays), only with the switch on; the state_dict keys do not change."""
    a = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8, 2))
    keys = list(a.state_dict())
    _convert(a)
    assert type(a) is M.Sequential and list(a.state_dict()) == keys
    b = nn.Sequential(nn.Linear(4, 4), nn.Sigmoid(), nn.Linear(4, 2))
    _convert(b)
    assert type(b) is nn.Sequential
    c = nn.Sequential(nn.Flatten(), nn.Linear(4, 2))
    _convert(c)
    assert type(c) is nn.Sequential
    d = _model()
    with tuning.override({"torch.FUSE_CHAIN": False}):
        pt.convert(d, fuse=True)  # (the switch off: the class stays)
    assert type(d) is nn.Sequential
