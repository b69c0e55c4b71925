"""pydnn.torch's LSTM / GRU / RNN on the CPU: construction with PyTorch's arguments and PyTorch's argument
errors, state_dict compatibility both ways with nn.LSTM / nn.GRU / nn.RNN, the flat weight space (every
parameter a view of one buffer, in pydnn's weight-space layout, kept through .to() / load_state_dict /
deepcopy / pickling), and the CPU forward (PyTorch's own, recorded as a fallback) equal to PyTorch's."""
import copy
import io

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import pydnn  # noqa: E402
import pydnn.torch as pt  # noqa: E402
from pydnn.torch import rnn as PR  # noqa: E402

CONFIGS = [  # class, args, kwargs
    (nn.LSTM, (5, 8), dict()),
    (nn.LSTM, (5, 8), dict(num_layers=3, bidirectional=True, batch_first=True, dropout=0.2)),
    (nn.LSTM, (5, 8), dict(num_layers=2, proj_size=3, bias=False)),
    (nn.LSTM, (7, 6), dict(num_layers=2, bidirectional=True, proj_size=2)),
    (nn.GRU, (4, 9), dict(num_layers=2, bidirectional=True)),
    (nn.GRU, (4, 9), dict(bias=False, batch_first=True)),
    (nn.RNN, (3, 5), dict(nonlinearity="relu", num_layers=2)),
    (nn.RNN, (3, 5), dict(nonlinearity="tanh", bidirectional=True, bias=False)),
]
PCLS = {nn.LSTM: pt.LSTM, nn.GRU: pt.GRU, nn.RNN: pt.RNN}
IDS = [str(i) for i in range(len(CONFIGS))]


def _make(tcls, args, kw):
    torch.manual_seed(0)
    return PCLS[tcls](*args, **kw), tcls(*args, **kw)


@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
def test_construction_and_state_dict(cfg):
    tcls, args, kw = cfg
    mine, ref = _make(tcls, args, kw)
    assert isinstance(mine, tcls)
    assert list(mine.state_dict()) == list(ref.state_dict())
    assert [(n, p.shape) for n, p in mine.named_parameters()] == [(n, p.shape) for n, p in ref.named_parameters()]
    assert repr(mine) == repr(ref)
    # both ways
    mine.load_state_dict(ref.state_dict())
    for k, v in ref.state_dict().items():
        assert torch.equal(mine.state_dict()[k], v), k
    ref2 = tcls(*args, **kw)
    ref2.load_state_dict(mine.state_dict())
    for k, v in mine.state_dict().items():
        assert torch.equal(ref2.state_dict()[k], v), k


def _check_flat(mod):
    flat = mod.__dict__["_pydnn_flat"]
    lay, total = PR.layout(mod)
    assert flat.numel() == total == sum(p.numel() for p in mod.parameters())
    es = flat.element_size()
    for n, off, shape in lay:
        p = getattr(mod, n)
        assert p.data_ptr() == flat.data_ptr() + off * es and tuple(p.shape) == shape and p.is_contiguous(), n
        assert torch.equal(flat[off:off + p.numel()].view(shape), p.detach()), n
    assert flat.data_ptr() % 256 == 0
    return flat


@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
def test_flat_weight_space_matches_pydnn_layout(cfg):
    """The module's flat buffer holds each parameter where pydnn's weight-space layout (its RNN descriptor's
    regions, which GetRNNWeightParams reports) puts the matching (pseudo-layer, linLayerID) parts."""
    tcls, args, kw = cfg
    mine, _ = _make(tcls, args, kw)
    _check_flat(mine)
    proj = kw.get("proj_size", 0)
    cell = PR._CELLS[mine.mode]
    r = pydnn.create_rnn_descriptor()
    pydnn.set_rnn_descriptor_v8(r, pydnn.PYDNN_RNN_ALGO_STANDARD, cell,
                                pydnn.PYDNN_RNN_DOUBLE_BIAS if mine.bias else pydnn.PYDNN_RNN_NO_BIAS,
                                pydnn.PYDNN_BIDIRECTIONAL if mine.bidirectional else pydnn.PYDNN_UNIDIRECTIONAL,
                                pydnn.PYDNN_LINEAR_INPUT, pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DATA_FLOAT,
                                pydnn.PYDNN_DEFAULT_MATH, args[0], args[1], proj or args[1], mine.num_layers, None,
                                pydnn.PYDNN_RNN_PADDED_IO_ENABLED)
    assert r.weight_elements() == PR.layout(mine)[1]
    offs = {(p, kind, lin): off for p, kind, lin, off in mine._pydnn_offsets(mine.__dict__["_pydnn_views"])}
    g = PR._GATES[mine.mode]
    for pl in range(r.pseudo_layers):
        regs, _ = r.pseudo_layer_regions(pl)
        for (kind, lin), (off, dims) in regs.items():
            first = lin if lin == 8 else (0 if lin < g else g)  # the gate's block starts at the first gate
            assert offs[(pl, kind, first)] + (lin - first) * args[1] * (dims[2] if kind == "m" else 1) == off, \
                (pl, kind, lin)


@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
def test_flat_survives_to_copy_and_pickle(cfg):
    tcls, args, kw = cfg
    mine, ref = _make(tcls, args, kw)
    mine.load_state_dict(ref.state_dict())
    mine.double()
    assert mine.__dict__["_pydnn_flat"].dtype == torch.float64
    _check_flat(mine)
    mine.float()
    _check_flat(mine)
    cp = copy.deepcopy(mine)
    w, views = cp._pydnn_weight_space(cp._pydnn_params(), torch.float32)
    assert w is cp.__dict__["_pydnn_flat"]  # still views of its own (copied) flat buffer: no copy per call
    buf = io.BytesIO()
    torch.save(mine, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    for k, v in ref.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k


def test_pickle_after_an_nvrtc_compile():
    """torch.save / torch.load of a pydnn LSTM after an in-process NVRTC compile with an empty log (what
    tests/ops/rnn/test_rnn_kernels_cpu.py does before this file in one pytest process): pydnn's NVRTC wrapper
    once wrote the log's NUL into CPython's shared b" ", and the unpickler then read weight_ih_l0's dimension
    32 (byte 0x20) as 0 (see tests/kernels/test_nvrtc_buffers_cpu.py)."""
    from pydnn._cuda import nvrtc
    try:
        nvrtc.version()
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"NVRTC unavailable: {e}")
    nvrtc.compile_cubin('extern "C" __global__ void k(float* x) { x[0] = 1.0f; }\n', "k.cu", [], "sm_80", [], [])
    mine, ref = _make(nn.LSTM, (5, 8), dict())
    mine.load_state_dict(ref.state_dict())
    buf = io.BytesIO()
    torch.save(mine, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    _check_flat(loaded)
    for k, v in ref.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k


def test_constructor_errors_are_pytorchs():
    for bad in (dict(proj_size=8), dict(proj_size=-1), dict(dropout=1.5)):
        with pytest.raises(ValueError):
            pt.LSTM(4, 8, **bad)
        with pytest.raises(ValueError):
            nn.LSTM(4, 8, **bad)
    with pytest.raises(ValueError):
        pt.RNN(4, 8, nonlinearity="gelu")
    with pytest.raises(ValueError):
        pt.GRU(4, 8, proj_size=2)


def test_forward_argument_errors_are_pytorchs():
    mine, ref = _make(nn.LSTM, (5, 8), dict(num_layers=2))
    mine.load_state_dict(ref.state_dict())
    with pytest.raises(RuntimeError) as e1:
        mine(torch.randn(4, 2, 6))
    with pytest.raises(RuntimeError) as e2:
        ref(torch.randn(4, 2, 6))
    assert str(e1.value) == str(e2.value)
    with pytest.raises(RuntimeError):
        mine(torch.randn(4, 2, 5), (torch.zeros(2, 3, 8), torch.zeros(2, 2, 8)))


@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
def test_cpu_forward_falls_back_equal(cfg):
    tcls, args, kw = cfg
    mine, ref = _make(tcls, args, kw)
    mine.load_state_dict(ref.state_dict())
    mine.eval(), ref.eval()
    shape = (2, 4, args[0]) if kw.get("batch_first") else (4, 2, args[0])
    x = torch.randn(shape)
    before = pt.fallbacks[f"{type(mine).__name__}: tensors not on a CUDA device"]
    a, b = mine(x), ref(x)
    assert pt.fallbacks[f"{type(mine).__name__}: tensors not on a CUDA device"] == before + 1
    torch.testing.assert_close(a[0], b[0])


def test_convert_swaps_rnns_keeping_parameters():
    model = nn.Sequential(nn.GRU(4, 6), nn.RNN(6, 6))
    params = [id(p) for p in model.parameters()]
    rep = pt.convert(model)
    assert {c for _, c in rep.converted} == {"GRU", "RNN"}
    assert type(model[0]) is pt.GRU and type(model[1]) is pt.RNN
    assert [id(p) for p in model.parameters()] == params
    _check_flat(model[0]), _check_flat(model[1])
