"""pydnn.torch's fused MLP (Linear -> GELU -> Linear without biases as one autograd Function, the GELU and its
gradient in GEMM epilogues through the graph API; pydnn.tuning.torch.FUSE_MLP) on the CPU: convert's pattern
(what it fuses and what it leaves, parameters and state_dict keys unchanged), the Function's plumbing against
PyTorch with the two graphs' launches emulated (test_torch_emulated_cpu.py's harness for the pydnn.matmul
calls), and the real graphs built on a CPU-only sm_90 handle (one fused launch each)."""
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import pydnn  # noqa: E402
import pydnn.torch as pt  # noqa: E402
from pydnn import tuning  # noqa: E402
from pydnn.torch import _core as C  # noqa: E402
from pydnn.torch import functional as PF  # noqa: E402
from test_torch_emulated_cpu import CALLS, cpu_handle, emulated, view  # noqa: E402,F401


def _mlp(d=16, hid=32, bias=False, approximate="tanh"):
    return nn.Sequential(nn.Linear(d, hid, bias=bias), nn.GELU(approximate=approximate),
                         nn.Linear(hid, d, bias=bias), nn.Dropout(0.0))


def test_off_by_default():
    assert tuning.torch.FUSE_MLP is False


def test_convert_fuses_the_block_and_keeps_the_parameters(monkeypatch):
    monkeypatch.setattr(tuning.torch, "FUSE_MLP", True)
    torch.manual_seed(0)
    m = nn.Sequential(_mlp(), nn.Linear(16, 4))
    keys = list(m.state_dict())
    params = [id(p) for p in m.parameters()]
    rep = pt.convert(m, fuse=True)
    assert rep.fused == [("0.0", "gelu + 0.2")]
    assert type(m[0][1]) is nn.Identity and m[0][0].__dict__["_mlp"] == ("tanh", m[0][2])
    assert m[0][2].__dict__["_mlp_tail"] is True and "_mlp" not in m[1].__dict__
    assert list(m.state_dict()) == keys and [id(p) for p in m.parameters()] == params
    assert "_mlp" not in dict(m.named_modules())  # the tuple registers no child module


@pytest.mark.parametrize("what", ["switch off", "bias", "hook", "no gelu"])
def test_convert_leaves_other_blocks(monkeypatch, what):
    monkeypatch.setattr(tuning.torch, "FUSE_MLP", what != "switch off")
    m = _mlp(bias=what == "bias")
    if what == "hook":
        m[2].register_forward_hook(lambda *a: None)
    if what == "no gelu":
        m[1] = nn.ReLU()
    rep = pt.convert(m, fuse=True)
    assert not [f for f in rep.fused if "gelu" in f[1]]
    assert "_mlp" not in m[0].__dict__ and "_mlp_tail" not in m[2].__dict__


class _FakeGraph:
    """What the fused graph computes, from the buffers' addresses (float64 math, rounded to the io type)."""

    def __init__(self, kind, dt, m, k, n, k2, approx):
        self.kind, self.dt, self.shape, self.approx = kind, dt, (m, k, n, k2), approx
        self.runs = 0

    def execute(self, buffers, workspace, handle=None):
        self.runs += 1
        m, k, n, k2 = self.shape
        dt = PF._PD_TYPES[self.dt]
        b = buffers
        if self.kind == "fwd":
            x, w1 = view(b["x"], dt, (m, k), (k, 1)), view(b["w1t"], dt, (n, k), (k, 1))
            h = x.double() @ w1.double().t()
            view(b["h"], dt, (m, n), (n, 1)).copy_(h)
            view(b["a"], dt, (m, n), (n, 1)).copy_(F.gelu(h, approximate=self.approx))
        else:
            dy, w2 = view(b["dy"], dt, (m, k2), (k2, 1)), view(b["w2"], dt, (k2, n), (n, 1))
            da = dy.double() @ w2.double()
            with torch.enable_grad():  # (a Function's backward runs with grad mode off)
                hp = view(b["hp"], dt, (m, n), (n, 1)).double().requires_grad_(True)
                (dh,) = torch.autograd.grad(F.gelu(hp, approximate=self.approx), hp, da)
            view(b["dh"], dt, (m, n), (n, 1)).copy_(dh)


@pytest.fixture
def fused(emulated, monkeypatch):
    """FUSE_MLP on, CUDA and autocast answered as on a GPU, the graph pair emulated (_FakeGraph)."""
    monkeypatch.setattr(tuning.torch, "FUSE_MLP", True)
    monkeypatch.setattr(C, "on_cuda", lambda *ts: True)
    graphs, made = [], {}

    def pair(h, dt, m, k, n, k2, approx):  # built once per shape, as _mlp_graph_pair's cache
        key = (dt, m, k, n, k2, approx)
        if key not in made:
            gf = _FakeGraph("fwd", dt, m, k, n, k2, "tanh" if approx == "tanh" else "none")
            gb = _FakeGraph("bwd", dt, m, k, n, k2, gf.approx)
            graphs.extend([gf, gb])
            made[key] = (gf, "x", "w1t", "h", "a"), (gb, "dy", "w2", "hp", "dh")
        return made[key]
    monkeypatch.setattr(PF, "_mlp_graph_pair", pair)
    monkeypatch.setattr(PF.C, "is_current_stream_capturing", lambda: False, raising=False)
    yield graphs


def _maxnorm(got, want):
    return ((got.double() - want.double()).abs().max() / want.double().abs().max()).item()


@pytest.mark.parametrize("approximate", ["tanh", "none"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fused_block_matches_torch(fused, approximate, dtype):
    torch.manual_seed(1)
    ref = _mlp(approximate=approximate).double()
    mine = _mlp(approximate=approximate)
    mine.load_state_dict(ref.state_dict())
    pt.convert(mine, fuse=True)
    mine.to(dtype)
    x = torch.randn(2, 24, 16).to(dtype).requires_grad_(True)
    xr = x.detach().double().requires_grad_(True)
    y = mine(x)
    yr = ref(xr)
    dy = torch.randn_like(yr).to(dtype)
    CALLS.clear()
    y.backward(dy)
    yr.backward(dy.double())
    assert [g.runs for g in fused] == [1, 1]  # the two graphs ran once each
    assert [c for c in CALLS if c == "matmul"] == ["matmul"] * 3  # dW2, dX, dW1
    tol = 3e-2 if dtype == torch.bfloat16 else 8e-3
    for what, got, want in (("y", y, yr), ("dx", x.grad, xr.grad), ("dW1", mine[0].weight.grad, ref[0].weight.grad),
                            ("dW2", mine[2].weight.grad, ref[2].weight.grad)):
        assert got.dtype == dtype and got.shape == want.shape, what
        assert _maxnorm(got, want) <= tol, (what, _maxnorm(got, want))


def test_unfused_shapes_take_the_three_calls(fused):
    """A width that is not a multiple of 8 (rows off 16-byte alignment): linear, gelu, linear."""
    torch.manual_seed(2)
    mine, ref = _mlp(d=12, hid=20), None
    ref = _mlp(d=12, hid=20)
    ref.load_state_dict(mine.state_dict())
    pt.convert(mine, fuse=True)
    mine.to(torch.bfloat16), ref.to(torch.bfloat16)
    x = torch.randn(40, 12).to(torch.bfloat16)
    y = mine(x)
    assert not fused
    assert _maxnorm(y, ref(x)) <= 3e-2


@pytest.mark.parametrize("approx", ["tanh", "none"])
def test_real_graphs_fuse_on_a_cpu_handle(approx):
    """The two graphs as the GPU builds them (a CPU-only sm_90 handle; NVRTC compiles the generated GEMMs):
    the fusion engine takes both, one launch each, no workspace."""
    h = cpu_handle()
    (gf, *_), (gb, *_) = PF._mlp_build(h, torch.bfloat16, 256, 64, 128, 64, approx)
    for g in (gf, gb):
        assert g.engine_index() == 1 and g.launches() == 1 and g.get_workspace_size() == 0
