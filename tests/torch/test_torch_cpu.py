"""pydnn.torch on the CPU: construction, argument checks, state_dict compatibility with PyTorch's modules,
convert()'s report, descriptor caches and the shapes the plans compute (no GPU needed)."""
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import pydnn  # noqa: E402
import pydnn.torch as pt  # noqa: E402
from pydnn.torch import _core as C  # noqa: E402
from pydnn.torch import functional as PF  # noqa: E402

# (pydnn.torch class, PyTorch class, args, kwargs, input shape)
CASES = [
    (pt.Conv1d, nn.Conv1d, (4, 6, 3), dict(stride=2, padding=1, dilation=1, groups=2), (2, 4, 9)),
    (pt.Conv2d, nn.Conv2d, (3, 8, 3), dict(padding=1, bias=False), (2, 3, 7, 7)),
    (pt.Conv2d, nn.Conv2d, (4, 8, (3, 5)), dict(stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=4), (2, 4, 9, 11)),
    (pt.Conv2d, nn.Conv2d, (3, 4, 3), dict(padding="same", padding_mode="reflect"), (1, 3, 6, 6)),
    (pt.Conv3d, nn.Conv3d, (2, 4, 3), dict(padding=1), (1, 2, 5, 5, 5)),
    (pt.BatchNorm1d, nn.BatchNorm1d, (6,), dict(momentum=0.2), (8, 6)),
    (pt.BatchNorm1d, nn.BatchNorm1d, (6,), dict(affine=False), (8, 6, 5)),
    (pt.BatchNorm2d, nn.BatchNorm2d, (5,), dict(eps=1e-3, momentum=None), (4, 5, 3, 3)),
    (pt.LayerNorm, nn.LayerNorm, ((4, 6),), dict(eps=1e-6), (3, 4, 6)),
    (pt.LayerNorm, nn.LayerNorm, (6,), dict(bias=False), (3, 6)),
    (pt.GroupNorm, nn.GroupNorm, (2, 6), dict(), (3, 6, 4, 4)),
    (pt.RMSNorm, nn.RMSNorm, (8,), dict(eps=1e-5), (3, 5, 8)),
    (pt.ReLU, nn.ReLU, (), dict(), (3, 4)),
    (pt.GELU, nn.GELU, (), dict(approximate="tanh"), (3, 4)),
    (pt.SiLU, nn.SiLU, (), dict(), (3, 4)),
    (pt.Sigmoid, nn.Sigmoid, (), dict(), (3, 4)),
    (pt.Tanh, nn.Tanh, (), dict(), (3, 4)),
    (pt.MaxPool2d, nn.MaxPool2d, (3,), dict(stride=2, padding=1), (2, 3, 9, 9)),
    (pt.AvgPool2d, nn.AvgPool2d, (2,), dict(count_include_pad=False, padding=1), (2, 3, 8, 8)),
    (pt.AdaptiveAvgPool2d, nn.AdaptiveAvgPool2d, ((3, None),), dict(), (2, 3, 7, 5)),
    (pt.Softmax, nn.Softmax, (), dict(dim=-1), (3, 7)),
    (pt.LogSoftmax, nn.LogSoftmax, (), dict(dim=1), (3, 7, 2)),
    (pt.Linear, nn.Linear, (6, 4), dict(), (3, 6)),
    (pt.Dropout, nn.Dropout, (0.3,), dict(), (3, 6)),
]
IDS = [f"{c[1].__name__}-{i}" for i, c in enumerate(CASES)]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_construction_and_state_dict_roundtrip(case):
    pcls, tcls, args, kw, _ = case
    torch.manual_seed(0)
    mine, ref = pcls(*args, **kw), tcls(*args, **kw)
    assert isinstance(mine, tcls)
    assert repr(mine) == repr(ref)
    sd_ref, sd_mine = ref.state_dict(), mine.state_dict()
    assert list(sd_ref) == list(sd_mine)
    assert [n for n, _ in ref.named_parameters()] == [n for n, _ in mine.named_parameters()]
    # each loads the other's state dict (strict) and ends with identical tensors
    for k, v in sd_ref.items():
        if v.is_floating_point():
            v.copy_(torch.randn_like(v))
    mine.load_state_dict(sd_ref, strict=True)
    for k, v in mine.state_dict().items():
        assert torch.equal(v, sd_ref[k]), k
    back = tcls(*args, **kw)
    back.load_state_dict(mine.state_dict(), strict=True)
    for k, v in back.state_dict().items():
        assert torch.equal(v, sd_ref[k]), k


@pytest.mark.parametrize("case", [c for c in CASES if c[1] is not nn.Dropout], ids=[i for c, i in zip(CASES, IDS)
                                                                                     if c[1] is not nn.Dropout])
def test_cpu_forward_falls_back_to_torch_exactly(case):
    """On CPU tensors every module runs PyTorch's op (recorded as a fallback): the same output, the same
    running statistics after several training steps (BatchNorm's momentum / cumulative factor is the bridge's)."""
    pcls, tcls, args, kw, shape = case
    torch.manual_seed(1)
    ref = tcls(*args, **kw)
    mine = pcls(*args, **kw)
    mine.load_state_dict(ref.state_dict())
    before = sum(pt.fallbacks.values())
    for _ in range(3):
        x = torch.randn(shape)
        torch.testing.assert_close(mine(x), ref(x), rtol=0, atol=0)
    for k, v in ref.state_dict().items():
        assert torch.equal(mine.state_dict()[k], v), k
    if pcls is not pt.Linear:
        assert sum(pt.fallbacks.values()) > before
        assert any("CUDA" in r or "cuda" in r for r in pt.fallbacks)


def test_argument_checks():
    with pytest.raises(ValueError, match="activation"):
        pt.Conv2d(3, 4, 3, activation="gelu")
    with pytest.raises(ValueError):  # PyTorch's own checks run (groups must divide in_channels)
        pt.Conv2d(3, 4, 3, groups=2)
    with pytest.raises(ValueError):
        pt.Conv2d(3, 4, 3, padding="same", stride=2)
    with pytest.raises(ValueError):
        pt.Dropout(1.5)
    with pytest.raises(TypeError):
        pt.BatchNorm2d()
    m = pt.Conv2d(3, 4, 3, activation="relu")
    assert m.activation == "relu" and "activation='relu'" in repr(m)
    bn = pt.BatchNorm2d(4)
    with pytest.raises(ValueError):  # _check_input_dim: BatchNorm2d wants 4-d input
        bn(torch.randn(2, 4))


def test_conv_fused_activation_cpu_matches_torch():
    torch.manual_seed(2)
    m = pt.Conv2d(3, 4, 3, padding=1, activation="relu")
    x = torch.randn(2, 3, 5, 5)
    torch.testing.assert_close(m(x), F.relu(F.conv2d(x, m.weight, m.bias, padding=1)))


def _cnn():
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Dropout(0.1), nn.Linear(16, 10))


class _Custom(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)
        self.pixel = nn.PixelShuffle(1)

    def forward(self, x):
        return F.relu(self.pixel(self.conv(x)))


class _MyConv(nn.Conv2d):
    pass


def test_convert_swaps_in_place_and_reports():
    torch.manual_seed(3)
    model = nn.Sequential(_cnn(), _Custom(), _MyConv(3, 3, 1))
    ref = nn.Sequential(_cnn(), _Custom(), _MyConv(3, 3, 1))
    ref.load_state_dict(model.state_dict())
    params = {n: p for n, p in model.named_parameters()}
    keys = list(model.state_dict())
    report = pt.convert(model)
    converted = dict(report.converted)
    assert converted["0.0"] == "Conv2d" and converted["0.1"] == "BatchNorm2d" and converted["0.10"] == "Linear"
    assert converted["1.conv"] == "Conv2d"
    assert type(model[0][0]) is pt.Conv2d and type(model[0][9]) is pt.Dropout and type(model[0][7]) is pt.AdaptiveAvgPool2d
    kept = {n: (c, r) for n, c, r in report.kept}
    assert kept["0.8"][0] == "Flatten"
    assert kept["1.pixel"][0] == "PixelShuffle"
    assert kept["1"][0] == "_Custom" and "own forward" in kept["1"][1]
    assert kept["2"][0] == "_MyConv" and "subclass" in kept["2"][1]
    assert "left as PyTorch" in str(report)
    # the same Parameter objects (an optimizer built before convert keeps working) and state_dict keys
    assert all(p is params[n] for n, p in model.named_parameters())
    assert list(model.state_dict()) == keys
    model.eval(), ref.eval()
    x = torch.randn(2, 3, 8, 8)
    torch.testing.assert_close(model[0](x), ref[0](x), rtol=0, atol=0)


def test_convert_reports_a_supported_root():
    m = nn.Conv2d(3, 3, 1)
    r = pt.convert(m)
    assert r.converted == [] and r.kept[0][0] == "" and "root" in r.kept[0][2]


def test_mha_construction_and_fallback_reason():
    torch.manual_seed(4)
    ref = nn.MultiheadAttention(64, 1, batch_first=True)
    mine = pt.MultiheadAttention(64, 1, batch_first=True)
    mine.load_state_dict(ref.state_dict())
    assert list(mine.state_dict()) == list(ref.state_dict())
    x = torch.randn(2, 5, 64)
    out, w = mine(x, x, x)  # need_weights=True (PyTorch's default): PyTorch's forward, weights returned
    out_r, w_r = ref(x, x, x)
    torch.testing.assert_close(out, out_r)
    torch.testing.assert_close(w, w_r)
    assert any("need_weights" in r for r in pt.fallbacks)
    out, w = mine(x, x, x, need_weights=False)
    assert w is None
    torch.testing.assert_close(out, ref(x, x, x, need_weights=False)[0])


def test_functional_cpu_fallbacks():
    torch.manual_seed(5)
    q, k, v = (torch.randn(2, 4, 6, 64) for _ in range(3))
    torch.testing.assert_close(PF.scaled_dot_product_attention(q, k, v, is_causal=True),
                               F.scaled_dot_product_attention(q, k, v, is_causal=True))
    x = torch.randn(3, 5, 7)
    torch.testing.assert_close(pt.softmax(x, 1), F.softmax(x, 1))
    torch.testing.assert_close(pt.log_softmax(x, -1), F.log_softmax(x, -1))
    torch.testing.assert_close(PF.gelu(x), F.gelu(x))
    assert PF.dropout(x, 0.5, training=False) is x


# ------------------------------------------------------------------------------------ handles and threads
def test_handle_context_made_current_on_each_calling_thread(monkeypatch):
    """PyTorch runs CUDA backward passes on its own per-device threads, where no driver context may be
    current (the GPU run failed with CUDA_ERROR_INVALID_CONTEXT): handle_for makes the handle's context
    current once per thread (and again after the thread used another device's handle), creates each handle
    on its device's primary context, and keeps the stream logic; under a CUDA 11 runtime it compares the
    current context on every call. Driver, runtime and pydnn.create stood in (contexts: 1000 + device)."""
    import threading

    class Handle:
        def __init__(self, ctx, device):
            self.ctx, self.device = ctx, device

    class Stream:
        def __init__(self, s):
            self.cuda_stream = s

    state = {"dev": 0, "stream": 7}
    made, sets, streams = [], [], []
    monkeypatch.setattr(C, "_handles", {})
    monkeypatch.setattr(C, "_tls", threading.local())
    monkeypatch.setattr(C, "_VERIFY", False)  # a CUDA 12+ runtime
    monkeypatch.setattr(C, "_fast", {"on": False})  # PyTorch's C getters would bypass the stand-ins below
    monkeypatch.setattr(C, "_get_device", None)
    monkeypatch.setattr(torch.cuda, "init", lambda: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: state["dev"])
    monkeypatch.setattr(torch.cuda, "current_stream", lambda idx=None: Stream(state["stream"] + idx))
    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, device=None, **k: real_empty(*a, **k))
    monkeypatch.setattr(C.driver, "primary_context", lambda idx: 1000 + idx)
    monkeypatch.setattr(C.driver, "current", lambda: state["current"])

    def set_current(ctx):
        sets.append((threading.get_ident(), ctx))
        state["current"] = ctx
    monkeypatch.setattr(C.driver, "set_current", set_current)

    def create():
        made.append(Handle(state["current"], state["current"] - 1000))
        return made[-1]
    monkeypatch.setattr(pydnn, "create", create)
    monkeypatch.setattr(pydnn, "set_stream", lambda h, s: streams.append((h.ctx, s)))

    cuda0, cuda1 = torch.device("cuda", 0), torch.device("cuda", 1)
    me = threading.get_ident()
    h0 = C.handle_for(cuda0)
    assert h0.ctx == 1000 and sets == [(me, 1000)] and streams == [(1000, 7)]
    for _ in range(3):  # later calls on this thread: no driver call, no set_stream while the stream holds
        assert C.handle_for(torch.device("cuda")) is h0
    assert sets == [(me, 1000)] and streams == [(1000, 7)]

    seen = []
    t = threading.Thread(target=lambda: seen.extend([C.handle_for(cuda0), C.handle_for(cuda0)]))
    t.start()
    t.join()
    assert seen == [h0, h0] and len(made) == 1
    assert sets[1:] == [(t.ident, 1000)]  # once on the new thread (autograd's device thread, say)

    state["dev"] = 1  # torch.cuda.set_device(1): a handle of its own, on device 1's primary context
    with pytest.raises(C.Unsupported):
        C.handle_for(cuda0)
    h1 = C.handle_for(cuda1)
    assert h1 is not h0 and h1.ctx == 1001 and sets[-1] == (me, 1001) and streams[-1] == (1001, 8)
    n = len(sets)
    state["dev"] = 0
    assert C.handle_for(cuda0) is h0 and sets[n:] == [(me, 1000)]  # made current again after device 1's
    state["stream"] = 20  # another current stream: set on the handle, the context left alone
    assert C.handle_for(cuda0) is h0 and streams[-1] == (1000, 20) and len(sets) == n + 1
    state["current"] = 1001  # a CUDA 11 runtime's lazy cudaSetDevice(0): device 1's context still current
    assert C.handle_for(cuda0) is h0 and len(sets) == n + 1  # CUDA 12+: trusted (no driver query)
    monkeypatch.setattr(C, "_VERIFY", True)
    assert C.handle_for(cuda0) is h0 and sets[-1] == (me, 1000) and len(sets) == n + 2
    assert C.handle_for(cuda0) is h0 and len(sets) == n + 2  # compared, equal: not set again


# ------------------------------------------------------------------------------- descriptors and plans
def test_descriptor_cache_by_dtype_dims_strides():
    x = torch.randn(2, 3, 4, 5)
    d1, d2 = C.tdesc(x), C.tdesc(torch.randn(2, 3, 4, 5))
    assert d1 is d2
    cl = x.to(memory_format=torch.channels_last)
    d3 = C.tdesc(cl)
    assert d3 is not d1
    assert pydnn.get_tensor_nd_descriptor(d3, 4)[3] == list(cl.stride())
    assert C.tdesc(x.half()) is not d1
    assert pydnn.get_tensor_nd_descriptor(C.tdesc(x.bfloat16()), 4)[0] == pydnn.PYDNN_DATA_BFLOAT16
    # a transposed view passes as it is (strides), a broadcast one is materialised
    t = x.transpose(1, 3)
    assert C.dense(t) is t
    b = torch.randn(3, 1).expand(3, 4)
    assert C.usable_strides(b.shape, b.stride()) is None
    assert C.dense(b).is_contiguous()
    assert C.usable_strides((1, 4), (0, 1)) == (1, 1)
    with pytest.raises(C.Unsupported):
        C.tdesc(torch.zeros(3, dtype=torch.int32))


def test_filter_format():
    w = torch.randn(8, 4, 3, 3)
    assert C.filter_format(w)[0] == pydnn.PYDNN_TENSOR_NCHW
    wcl = w.to(memory_format=torch.channels_last)
    fmt, w2 = C.filter_format(wcl)
    assert fmt == pydnn.PYDNN_TENSOR_NHWC and w2 is wcl
    fmt, w3 = C.filter_format(w.transpose(2, 3))
    assert fmt == pydnn.PYDNN_TENSOR_NCHW and w3.is_contiguous()


CONV_SHAPES = [
    ((2, 4, 17), (6, 2, 3), ((2,), (1,), (2,), 2)),
    ((2, 3, 9, 11), (8, 3, 3, 3), ((1, 1), (1, 1), (1, 1), 1)),
    ((1, 8, 10, 7), (8, 2, 3, 5), ((2, 3), (0, 2), (2, 1), 4)),
    ((1, 2, 5, 6, 7), (4, 2, 3, 3, 3), ((1, 2, 1), (1, 1, 0), (1, 1, 2), 1)),
]


@pytest.mark.parametrize("xs,ws,spec", CONV_SHAPES)
def test_conv_descriptor_output_dims_match_torch(xs, ws, spec):
    x, w = torch.randn(xs), torch.randn(ws)
    stride, pad, dil, groups = spec
    fn = (F.conv1d, F.conv2d, F.conv3d)[len(xs) - 3]
    want = fn(x, w, None, stride, pad, dil, groups).shape
    cd = PF._conv_desc(spec, x.dtype)
    fmt, w = C.filter_format(w)
    got = pydnn.get_convolution_nd_forward_output_dim(cd, C.tdesc(x), C.filter_desc(w.dtype, tuple(w.shape), fmt),
                                                      len(xs))
    assert tuple(got) == tuple(want)
    assert PF._conv_desc(spec, x.dtype) is cd


@pytest.mark.parametrize("n,k,p,s", [(9, 3, 1, 2), (8, 2, 0, 2), (7, 3, 0, 1), (10, 4, 2, 3)])
def test_pool_output_dims_match_torch(n, k, p, s):
    x = torch.randn(1, 1, n, n)
    assert PF._pool_out(n, k, p, s) == F.max_pool2d(x, k, s, p).shape[-1] == F.avg_pool2d(x, k, s, p).shape[-1]
    d = PF._pool_desc(pydnn.PYDNN_POOLING_MAX, (k, k), (p, p), (s, s))
    assert pydnn.get_pooling_nd_forward_output_dim(d, C.tdesc(x), 4)[2:] == [PF._pool_out(n, k, p, s)] * 2


@pytest.mark.parametrize("kind,shape,groups,nd", [
    (pydnn.PYDNN_NORM_KIND_LAYER, (3, 4, 6), 1, 2), (pydnn.PYDNN_NORM_KIND_RMS, (5, 8), 1, 1),
    (pydnn.PYDNN_NORM_KIND_GROUP, (3, 6, 4, 4), 3, 1)])
def test_norm_statistics_and_parameter_dims(kind, shape, groups, nd):
    x = torch.randn(shape)
    desc = PF._norm_desc(kind, groups, nd, 1e-5)
    sb, st = PF._norm_param_descs(C.tdesc(x), desc)
    assert tuple(pydnn.get_tensor_nd_descriptor(st, 8)[2]) == PF._stat_dims(x, kind, groups, nd)
    sbd = [n for n in pydnn.get_tensor_nd_descriptor(sb, 8)[2] if n != 1]
    assert sbd == [n for n in PF._ones(x, kind, groups, nd).shape if n != 1]
    assert PF._ones(x, kind, groups, nd).numel() == torch.Size(pydnn.get_tensor_nd_descriptor(sb, 8)[2]).numel()


def test_attention_layout_checks():
    qkv = torch.randn(2, 16, 3, 4, 64)  # (B, S, 3, H, D): q, k, v BSHD views through strides
    q = qkv[:, :, 0].transpose(1, 2)
    assert q.stride() == (16 * 3 * 4 * 64, 64, 3 * 4 * 64, 1)
    assert PF._attn_ok(q) == (q.data_ptr() % 16 == 0)
    bad = torch.randn(2, 4, 16, 64).transpose(2, 3)  # head dim not contiguous
    assert not PF._attn_ok(bad)
    assert PF._attn_in(bad).is_contiguous()


def test_import_pydnn_never_imports_torch():
    code = "import sys, pydnn; assert 'torch' not in sys.modules, 'pydnn imported torch'; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


def test_nothing_outside_pydnn_torch_imports_torch():
    """No import statement outside pydnn/torch/ names torch (module level or inside functions)."""
    import ast
    import pathlib
    root = pathlib.Path(pydnn.__file__).parent
    for f in root.rglob("*.py"):
        if f.relative_to(root).parts[0] == "torch":
            continue
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                mods = [node.module or ""]
            else:
                continue
            assert not any(m == "torch" or m.startswith("torch.") for m in mods), f"{f}:{node.lineno} imports torch"
