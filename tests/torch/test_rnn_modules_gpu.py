"""pydnn.torch's LSTM / GRU / RNN on the GPU against PyTorch's own modules: forward (output, h_n, c_n) and
backward (dx, dh_0, dc_0, every parameter's gradient) on random shapes, the reference being PyTorch's
module in float64 on the same (already rounded) parameters and inputs. Every check asserts that pydnn ran
(no fallback recorded). Tolerances (max-norm relative, by the data dtype) are those of pydnn's RNN family
tests (tests/ops/rnn/rnn_harness.py: the recurrence rounds h to the data type every step)."""
import contextlib

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import pydnn.torch as pt  # noqa: E402

pytestmark = pytest.mark.gpu

TOL = {torch.float32: 2e-4, torch.float16: 2e-2, torch.bfloat16: 6e-2}
# gradients sum over every step (and, for the weights, every batch entry): fp32 as the op-level PyTorch test
# (tests/ops/rnn/test_rnn_gpu.py: rtol 1e-3), 16-bit as the forward
TOL_GRAD = {torch.float32: 1e-3, torch.float16: 2e-2, torch.bfloat16: 6e-2}
PCLS = {nn.LSTM: pt.LSTM, nn.GRU: pt.GRU, nn.RNN: pt.RNN}


@pytest.fixture(autouse=True)
def _setup():
    if not torch.cuda.is_available():
        pytest.skip("PyTorch sees no CUDA device")
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@contextlib.contextmanager
def pydnn_runs():
    before = dict(pt.fallbacks)
    yield
    new = {r: n - before.get(r, 0) for r, n in pt.fallbacks.items() if n != before.get(r, 0)}
    assert not new, f"fell back to PyTorch: {new}"


def close(got, want, tol, what):
    got, want = got.detach().double(), want.detach().double()
    assert got.shape == want.shape, (what, got.shape, want.shape)
    assert torch.isfinite(got).all(), f"{what}: non-finite values"
    scale = want.abs().max().clamp_min(1e-3)
    err = ((got - want).abs().max() / scale).item()
    assert err <= tol, f"{what}: max-norm relative error {err:.3g} > {tol}"


def pair(tcls, args, kw, dtype):
    torch.manual_seed(0)
    ref = tcls(*args, **kw).cuda().double()
    mine = PCLS[tcls](*args, **kw).cuda()
    mine.load_state_dict(ref.state_dict())
    mine.to(dtype)
    ref.load_state_dict({k: v.double() for k, v in mine.state_dict().items()})
    return mine, ref


def states(o):
    """[output (padded data of a PackedSequence), h_n, (c_n)]."""
    y = o[0].data if isinstance(o[0], nn.utils.rnn.PackedSequence) else o[0]
    return [y, *(o[1] if isinstance(o[1], tuple) else (o[1],))]


def run_pair(mine, ref, inp, inp_ref, hx, hx_ref, dtype, what):
    with pydnn_runs():
        out = mine(inp, hx)
    out_ref = ref(inp_ref, hx_ref)
    got, want = states(out), states(out_ref)
    for name, a, b in zip(("output", "h_n", "c_n"), got, want):
        assert a.dtype == dtype, (name, a.dtype)
        close(a, b, TOL[dtype], f"{what} {name}")
    gen = torch.Generator(device="cuda").manual_seed(5)
    grads = [torch.randn(b.shape, device="cuda", dtype=torch.float64, generator=gen) for b in want]
    with pydnn_runs():
        torch.autograd.backward(got, [g.to(dtype) for g in grads])
    torch.autograd.backward(want, [g.to(dtype).double() for g in grads])
    for (n, p), (_, pr) in zip(mine.named_parameters(), ref.named_parameters()):
        close(p.grad, pr.grad, TOL_GRAD[dtype], f"{what} d{n}")
    return out


CASES = [  # class, (input_size, hidden_size), kwargs, (T, B), dtype
    (nn.LSTM, (24, 32), dict(num_layers=2, bidirectional=True), (7, 4), torch.float32),
    (nn.LSTM, (16, 32), dict(num_layers=2, proj_size=16, batch_first=True), (6, 3), torch.float32),
    (nn.LSTM, (12, 20), dict(bidirectional=True, proj_size=8, bias=False), (5, 5), torch.float32),
    (nn.GRU, (16, 48), dict(num_layers=2, bidirectional=True, batch_first=True), (5, 4), torch.float32),
    (nn.GRU, (10, 24), dict(bias=False), (9, 2), torch.float32),
    (nn.RNN, (8, 16), dict(num_layers=3, bidirectional=True), (4, 3), torch.float32),
    (nn.RNN, (8, 16), dict(nonlinearity="relu"), (6, 2), torch.float32),
    (nn.LSTM, (64, 128), dict(num_layers=2, bidirectional=True), (16, 8), torch.float16),
    (nn.GRU, (64, 128), dict(batch_first=True), (12, 8), torch.float16),
    (nn.LSTM, (64, 64), dict(num_layers=2, proj_size=32), (10, 8), torch.bfloat16),
    (nn.GRU, (48, 64), dict(bidirectional=True), (10, 8), torch.bfloat16),
]


@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("case", CASES, ids=[str(i) for i in range(len(CASES))])
def test_rnn_against_pytorch(case, with_state):
    tcls, args, kw, (T, B), dtype = case
    mine, ref = pair(tcls, args, kw, dtype)
    gen = torch.Generator(device="cuda").manual_seed(1)
    shape = (B, T, args[0]) if kw.get("batch_first") else (T, B, args[0])
    x = torch.randn(shape, device="cuda", generator=gen).to(dtype).requires_grad_(True)
    xr = x.detach().double().requires_grad_(True)
    hx = hx_ref = None
    if with_state:
        dirs, layers = (2 if ref.bidirectional else 1), ref.num_layers
        out = (ref.proj_size or ref.hidden_size) if tcls is nn.LSTM else ref.hidden_size
        h0 = (0.5 * torch.randn(dirs * layers, B, out, device="cuda", generator=gen)).to(dtype)
        ts = [h0]
        if tcls is nn.LSTM:
            ts.append((0.5 * torch.randn(dirs * layers, B, ref.hidden_size, device="cuda", generator=gen)).to(dtype))
        ts = [t.requires_grad_(True) for t in ts]
        tr = [t.detach().double().requires_grad_(True) for t in ts]
        hx, hx_ref = (tuple(ts), tuple(tr)) if tcls is nn.LSTM else (ts[0], tr[0])
    run_pair(mine, ref, x, xr, hx, hx_ref, dtype, f"{tcls.__name__}{kw}")
    close(x.grad, xr.grad, TOL_GRAD[dtype], "dx")
    if with_state:
        for a, b, n in zip(hx if isinstance(hx, tuple) else (hx,), hx_ref if isinstance(hx_ref, tuple) else (hx_ref,),
                           ("dh_0", "dc_0")):
            close(a.grad, b.grad, TOL_GRAD[dtype], n)
    # no grad: the INFERENCE forward, same outputs
    with torch.no_grad(), pydnn_runs():
        y = states(mine(x, hx))
    for a, b in zip(y, states(ref(xr, hx_ref))):
        close(a, b, TOL[dtype], "inference")


@pytest.mark.parametrize("tcls", [nn.LSTM, nn.GRU])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rnn_packed_sequence(tcls, dtype):
    mine, ref = pair(tcls, (16, 32), dict(num_layers=2, bidirectional=True), dtype)
    lengths = [5, 9, 2, 7, 9, 1]
    gen = torch.Generator(device="cuda").manual_seed(2)
    xs = torch.randn(9, 6, 16, device="cuda", generator=gen).to(dtype)
    x = xs.clone().requires_grad_(True)
    xr = xs.double().requires_grad_(True)
    p = nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=False)
    pr = nn.utils.rnn.pack_padded_sequence(xr, lengths, enforce_sorted=False)
    h0 = (0.5 * torch.randn(4, 6, 32, device="cuda", generator=gen)).to(dtype)
    c0 = (0.5 * torch.randn(4, 6, 32, device="cuda", generator=gen)).to(dtype)
    hx = (h0, c0) if tcls is nn.LSTM else h0
    hxr = (h0.double(), c0.double()) if tcls is nn.LSTM else h0.double()
    out = run_pair(mine, ref, p, pr, hx, hxr, dtype, f"packed {tcls.__name__}")
    assert isinstance(out[0], nn.utils.rnn.PackedSequence)
    close(x.grad, xr.grad, TOL_GRAD[dtype], "packed dx")


@pytest.mark.parametrize("ac", [torch.bfloat16, torch.float16])
def test_rnn_autocast(ac):
    """fp32 parameters under torch.autocast: pydnn computes in the autocast dtype (as PyTorch's cuDNN RNN),
    the reference is float64 on the parameters and input rounded to it; gradients land in fp32."""
    mine, ref = pair(nn.LSTM, (32, 64), dict(num_layers=2, bidirectional=True), torch.float32)
    ref.load_state_dict({k: v.to(ac).double() for k, v in mine.state_dict().items()})
    gen = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(8, 4, 32, device="cuda", generator=gen)
    with torch.autocast("cuda", dtype=ac), pydnn_runs():
        y, (hy, cy) = mine(x)
    assert y.dtype == ac and hy.dtype == ac
    yr, (hyr, cyr) = ref(x.to(ac).double())
    close(y, yr, TOL[ac], "autocast output")
    close(cy, cyr, TOL[ac], "autocast c_n")
    with pydnn_runs():
        y.float().square().sum().backward()
    yr.square().sum().backward()
    for (n, p), (_, pr) in zip(mine.named_parameters(), ref.named_parameters()):
        assert p.grad.dtype == torch.float32, n
        close(p.grad, pr.grad, TOL_GRAD[ac], f"autocast d{n}")


def test_rnn_flat_weights_and_training_steps():
    """The parameters stay views of one flat weight space through optimizer steps and state_dict loads; a
    few SGD steps track PyTorch's module step for step (fp32)."""
    mine, ref = pair(nn.LSTM, (8, 16), dict(num_layers=2), torch.float32)
    ref = ref.float()
    flat = mine.__dict__["_pydnn_flat"]
    opt, opt_r = torch.optim.SGD(mine.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
    gen = torch.Generator(device="cuda").manual_seed(4)
    for step in range(3):
        x = torch.randn(5, 3, 8, device="cuda", generator=gen)
        opt.zero_grad(), opt_r.zero_grad()
        with pydnn_runs():
            mine(x)[0].square().mean().backward()
        ref(x)[0].square().mean().backward()
        opt.step(), opt_r.step()
    for (n, p), (_, pr) in zip(mine.named_parameters(), ref.named_parameters()):
        close(p, pr, 1e-4, f"after 3 steps {n}")
    base = flat.data_ptr()
    for n, off, _ in pt.rnn.layout(mine)[0]:
        assert getattr(mine, n).data_ptr() == base + off * 4, n


def test_rnn_dropout_between_layers():
    """dropout > 0 (training): pydnn's masks (not PyTorch's), so only the properties: eval mode is
    deterministic and equals PyTorch's eval forward, training differs from it and backpropagates."""
    mine, ref = pair(nn.GRU, (16, 32), dict(num_layers=3, dropout=0.4), torch.float32)
    x = torch.randn(6, 4, 16, device="cuda").requires_grad_(True)
    mine.eval()
    with torch.no_grad(), pydnn_runs():
        y_eval = mine(x)[0]
    close(y_eval, ref.eval()(x.double())[0], TOL[torch.float32], "eval")
    mine.train()
    with pydnn_runs():
        y = mine(x)[0]
        y.sum().backward()
    assert (y - y_eval).abs().max() > 1e-3
    assert all(torch.isfinite(p.grad).all() for p in mine.parameters())


def test_rnn_convert_model():
    class Tagger(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(50, 16)
            self.lstm = nn.LSTM(16, 32, batch_first=True, bidirectional=True)
            self.out = nn.Linear(64, 5)

        def forward(self, t):
            return self.out(self.lstm(self.emb(t))[0])

    torch.manual_seed(6)
    model = Tagger().cuda()
    ref = Tagger().cuda()
    ref.load_state_dict(model.state_dict())
    rep = pt.convert(model)
    assert ("lstm", "LSTM") in rep.converted
    t = torch.randint(0, 50, (4, 11), device="cuda")
    with pydnn_runs():
        y = model(t)
    close(y, ref(t), TOL[torch.float32], "converted tagger")
