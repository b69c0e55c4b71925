"""pydnn.torch on the GPU: each module's forward and backward against PyTorch on random shapes (the oracle:
PyTorch in float64 on the same, already rounded, inputs), gradcheck in float64 where pydnn runs double,
autocast, channels_last, non-contiguous inputs, CUDA graph capture, convert() of a CNN. Every check also
asserts that pydnn ran (no fallback recorded), so a silent fallback to PyTorch cannot pass for pydnn."""
import contextlib

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import pydnn.torch as pt  # noqa: E402
from pydnn import tuning  # noqa: E402
from pydnn.torch import functional as PF  # noqa: E402

pytestmark = pytest.mark.gpu

# max-norm relative error allowed, by the dtype pydnn computed in (fp32: pydnn's own fp32 sums against
# float64; 16-bit: the output's rounding dominates)
TOL = {torch.float64: 1e-8, torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 2e-2}
# results summed from many 16-bit products on tensor cores or through transforms (convolution's Winograd /
# FFT / GEMM algorithms, attention's P and dS rounded to the 16-bit type): pydnn's own convolution tests
# allow rtol x the magnitude of the summed terms, about 3 to 4 times the result's max-norm
TOL_SUM = {torch.float64: 1e-8, torch.float32: 2e-4, torch.float16: 8e-3, torch.bfloat16: 3e-2}


@pytest.fixture(autouse=True)
def _setup():
    if not torch.cuda.is_available():
        pytest.skip("PyTorch sees no CUDA device")
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = False  # references run in float64 anyway; keep torch's fp32 exact
    torch.backends.cuda.matmul.allow_tf32 = False
    pt.benchmark = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved
    pt.benchmark = False


@contextlib.contextmanager
def pydnn_runs():
    """Fails when any call inside fell back to PyTorch."""
    before = dict(pt.fallbacks)
    yield
    new = {r: n - before.get(r, 0) for r, n in pt.fallbacks.items() if n != before.get(r, 0)}
    assert not new, f"fell back to PyTorch: {new}"


def close(got, want, dtype, what="", tol=None):
    got, want = got.detach().double(), want.detach().double()
    assert got.shape == want.shape, (what, got.shape, want.shape)
    assert torch.isfinite(got).all(), f"{what}: non-finite values"
    scale = want.abs().max().clamp_min(1e-3)
    err = ((got - want).abs().max() / scale).item()
    tol = TOL[dtype] if tol is None else tol
    assert err <= tol, f"{what}: max-norm relative error {err:.3g} > {tol} ({dtype})"


def rand(*shape, dtype=torch.float32, gen=None):
    return torch.randn(*shape, device="cuda", generator=gen).to(dtype)


def compare_module(mine, ref, x, dtype, train=True, what="", ref_nchw=False):
    """Forward and backward of `mine` (dtype) against `ref` (float64 copy) on x; parameter grads too.
    ref_nchw: the reference on a contiguous (NCHW) copy of x."""
    x = x.detach().requires_grad_(True)
    xr = x.detach().double()
    xr = (xr.contiguous() if ref_nchw else xr).requires_grad_(True)
    with pydnn_runs():
        y = mine(x)
    yr = ref(xr)
    close(y, yr, dtype, f"{what} forward")
    dy = torch.randn_like(yr).to(y.dtype)
    with pydnn_runs():
        y.backward(dy)
    yr.backward(dy.double())
    close(x.grad, xr.grad, dtype, f"{what} dx")
    for (n, p), (_, pr) in zip(mine.named_parameters(), ref.named_parameters()):
        if p.grad is not None or pr.grad is not None:
            close(p.grad, pr.grad, dtype, f"{what} d{n}")  # the data dtype's tolerance applies
    return y


def pair(pcls, tcls, args, kwargs, dtype, param_dtype=None):
    torch.manual_seed(0)
    ref = tcls(*args, **kwargs).cuda().double()
    mine = pcls(*args, **kwargs).cuda()
    mine.load_state_dict(ref.state_dict())
    mine.to(param_dtype or dtype)
    # the reference starts from the same rounded parameters
    ref.load_state_dict({k: v.double() if v.is_floating_point() else v for k, v in mine.state_dict().items()})
    return mine, ref


# ------------------------------------------------------------------------------------------ convolution
CONVS = [  # (dims, cin, cout, k, stride, pad, dil, groups, bias, activation)
    (1, 4, 8, 3, 1, 1, 1, 1, True, None),
    (1, 6, 6, 5, 2, 2, 2, 3, False, None),
    (2, 3, 16, 3, 1, 1, 1, 1, True, "relu"),
    (2, 16, 32, 3, 2, 1, 1, 1, True, None),
    (2, 8, 8, 3, 1, 2, 2, 8, True, None),          # depthwise, dilated
    (2, 12, 24, (3, 5), (1, 2), (1, 2), 1, 4, False, None),
    (2, 16, 16, 1, 1, 0, 1, 1, True, "sigmoid"),
    (2, 32, 64, 3, 1, 1, 1, 1, True, "tanh"),
    (3, 4, 8, 3, 1, 1, 1, 1, True, None),
    (3, 8, 8, 3, 2, 1, 1, 2, False, "relu"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("cfg", CONVS, ids=[str(i) for i in range(len(CONVS))])
def test_conv(cfg, dtype):
    dims, cin, cout, k, s, p, d, g, bias, act = cfg
    pcls, tcls = {1: (pt.Conv1d, nn.Conv1d), 2: (pt.Conv2d, nn.Conv2d), 3: (pt.Conv3d, nn.Conv3d)}[dims]
    torch.manual_seed(1)
    ref = tcls(cin, cout, k, s, p, d, g, bias).cuda().double()
    mine = pcls(cin, cout, k, s, p, d, g, bias, activation=act).cuda()
    mine.load_state_dict(ref.state_dict())
    mine.to(dtype)
    ref.load_state_dict({n: v.double() for n, v in mine.state_dict().items()})
    fn = {None: lambda t: t, "relu": F.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh}[act]
    spatial = {1: (37,), 2: (19, 23), 3: (7, 9, 8)}[dims]
    x = rand(3, cin, *spatial, dtype=dtype)
    x = x.requires_grad_(True)
    xr = x.detach().double().requires_grad_(True)
    with pydnn_runs():
        y = mine(x)
    yr = fn(ref(xr))
    tol = TOL_SUM[dtype]
    close(y, yr, dtype, "forward", tol)
    dy = torch.randn_like(yr).to(dtype)
    with pydnn_runs():
        y.backward(dy)
    yr.backward(dy.double())
    close(x.grad, xr.grad, dtype, "dx", tol)
    close(mine.weight.grad, ref.weight.grad, dtype, "dw", tol)
    if bias:
        close(mine.bias.grad, ref.bias.grad, dtype, "db", tol)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_conv_channels_last_tensor_cores(dtype):
    torch.manual_seed(2)
    ref = nn.Conv2d(64, 64, 3, padding=1).cuda().double()
    mine = pt.Conv2d(64, 64, 3, padding=1, activation="relu").cuda()
    mine.load_state_dict(ref.state_dict())
    mine.to(dtype).to(memory_format=torch.channels_last)
    ref.load_state_dict({n: v.double() for n, v in mine.state_dict().items()})
    x = rand(4, 64, 14, 14, dtype=dtype).to(memory_format=torch.channels_last).requires_grad_(True)
    with pydnn_runs():
        y = mine(x)
    assert y.is_contiguous(memory_format=torch.channels_last)
    xr = x.detach().double().requires_grad_(True)
    yr = F.relu(ref(xr))
    tol = TOL_SUM[dtype]
    close(y, yr, dtype, "forward", tol)
    dy = torch.randn_like(yr)
    with pydnn_runs():
        y.backward(dy.to(dtype))
    yr.backward(dy)
    assert x.grad.is_contiguous(memory_format=torch.channels_last)
    close(x.grad, xr.grad, dtype, "dx", tol)
    close(mine.weight.grad, ref.weight.grad, dtype, "dw", tol)
    close(mine.bias.grad, ref.bias.grad, dtype, "db", tol)


def test_conv_non_contiguous_input_and_benchmark():
    torch.manual_seed(3)
    ref = nn.Conv2d(8, 16, 3, padding=1).cuda().double()
    mine = pt.Conv2d(8, 16, 3, padding=1).cuda()
    mine.load_state_dict(ref.state_dict())
    ref.load_state_dict({n: v.double() for n, v in mine.state_dict().items()})
    base = rand(2, 8, 20, 30)
    x = base[:, :, 2:18, 3:27:2]  # a strided slice: passes as it is (strides)
    for bench in (False, True):
        pt.benchmark = bench
        with pydnn_runs():
            y = mine(x)
        close(y, ref(x.double()), torch.float32, f"benchmark={bench}", TOL_SUM[torch.float32])
    pt.benchmark = False


def test_conv_gradcheck_float64():
    torch.manual_seed(4)
    x = torch.randn(2, 4, 6, 5, device="cuda", dtype=torch.float64, requires_grad=True)
    w = torch.randn(6, 2, 3, 3, device="cuda", dtype=torch.float64, requires_grad=True)
    b = torch.randn(6, device="cuda", dtype=torch.float64, requires_grad=True)
    with pydnn_runs():
        assert torch.autograd.gradcheck(lambda x, w, b: PF.conv(x, w, b, 2, 1, 1, 2), (x, w, b))
        assert torch.autograd.gradcheck(lambda x, w, b: PF.conv(x, w, b, 1, 1, 1, 2, "tanh"), (x, w, b))


# ----------------------------------------------------------------------------------------- batch norm
@pytest.mark.parametrize("cls,tcls,shape", [(pt.BatchNorm2d, nn.BatchNorm2d, (6, 8, 7, 9)),
                                            (pt.BatchNorm1d, nn.BatchNorm1d, (16, 12)),
                                            (pt.BatchNorm1d, nn.BatchNorm1d, (4, 12, 33))])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_batch_norm(cls, tcls, shape, dtype):
    mine, ref = pair(cls, tcls, (shape[1],), dict(momentum=0.3), dtype, param_dtype=torch.float32)
    for step in range(2):
        mine.zero_grad(), ref.zero_grad()
        compare_module(mine, ref, rand(*shape, dtype=dtype), dtype, what=f"bn step {step}")
    close(mine.running_mean, ref.running_mean, torch.float32 if dtype == torch.float32 else dtype, "running_mean")
    close(mine.running_var, ref.running_var, torch.float32 if dtype == torch.float32 else dtype, "running_var")
    assert int(mine.num_batches_tracked) == 2
    mine.eval(), ref.eval()
    mine.zero_grad(), ref.zero_grad()
    compare_module(mine, ref, rand(*shape, dtype=dtype), dtype, what="bn eval")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("channels_last", [False, True])
def test_batch_norm_relu_fused(dtype, channels_last):
    torch.manual_seed(12)
    ref = nn.Sequential(nn.BatchNorm2d(32), nn.ReLU()).cuda().double()
    mine = pt.BatchNorm2d(32, activation="relu").cuda()
    mine.load_state_dict(ref[0].state_dict())
    for step in range(2):
        x = rand(4, 32, 9, 10, dtype=dtype)
        if channels_last:
            x = x.to(memory_format=torch.channels_last)
        mine.zero_grad(), ref.zero_grad()
        compare_module(mine, ref, x, dtype, what=f"bn+relu step {step}")
    close(mine.running_var, ref[0].running_var, torch.float32, "running_var")
    mine.eval(), ref.eval()
    mine.zero_grad(), ref.zero_grad()
    compare_module(mine, ref, rand(4, 32, 9, 10, dtype=dtype), dtype, what="bn+relu eval")


def test_batch_norm_channels_last_and_gradcheck():
    mine, ref = pair(pt.BatchNorm2d, nn.BatchNorm2d, (16,), {}, torch.float32)
    x = rand(4, 16, 5, 6).to(memory_format=torch.channels_last)
    y = compare_module(mine, ref, x, torch.float32, what="bn channels_last")
    assert y.is_contiguous(memory_format=torch.channels_last)
    x = torch.randn(5, 3, 4, 2, device="cuda", dtype=torch.float64, requires_grad=True)
    w = torch.rand(3, device="cuda", dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, device="cuda", dtype=torch.float64, requires_grad=True)
    with pydnn_runs():
        assert torch.autograd.gradcheck(lambda x, w, b: PF.batch_norm(x, None, None, w, b, True), (x, w, b))


# ---------------------------------------------------------------------------- layer / group / RMS norm
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", [
    (pt.LayerNorm, nn.LayerNorm, (256,), {}, (4, 33, 256)),
    (pt.LayerNorm, nn.LayerNorm, ((6, 40),), dict(eps=1e-3), (5, 6, 40)),
    (pt.LayerNorm, nn.LayerNorm, (96,), dict(bias=False), (7, 96)),
    (pt.GroupNorm, nn.GroupNorm, (4, 32), {}, (3, 32, 9, 7)),
    (pt.GroupNorm, nn.GroupNorm, (8, 16), dict(affine=False), (2, 16, 50)),
    (pt.RMSNorm, nn.RMSNorm, (128,), dict(eps=1e-6), (3, 17, 128)),
], ids=["ln", "ln2d", "ln-nobias", "gn", "gn-noaffine", "rms"])
def test_norms(case, dtype):
    pcls, tcls, args, kw, shape = case
    mine, ref = pair(pcls, tcls, args, kw, dtype, param_dtype=torch.float32)
    compare_module(mine, ref, rand(*shape, dtype=dtype), dtype, what=pcls.__name__)


def test_layer_norm_non_contiguous_input():
    mine, ref = pair(pt.LayerNorm, nn.LayerNorm, (64,), {}, torch.float32)
    x = rand(64, 10, 64).transpose(0, 1)  # rows of 64 with a row stride of 640
    compare_module(mine, ref, x, torch.float32, what="ln transposed")


# ---------------------------------------------------------------------------------------- activations
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("case", [(pt.ReLU, nn.ReLU, {}), (pt.GELU, nn.GELU, {}),
                                  (pt.GELU, nn.GELU, dict(approximate="tanh")), (pt.SiLU, nn.SiLU, {}),
                                  (pt.Sigmoid, nn.Sigmoid, {}), (pt.Tanh, nn.Tanh, {})],
                         ids=["relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh"])
def test_activations(case, dtype):
    pcls, tcls, kw = case
    mine, ref = pcls(**kw), tcls(**kw)
    x = rand(5, 7, 33, dtype=dtype)
    compare_module(mine, ref, x, dtype, what=pcls.__name__)
    compare_module(mine, ref, x.transpose(0, 2), dtype, what=pcls.__name__ + " transposed")
    if dtype == torch.float64:
        xg = torch.randn(3, 4, device="cuda", dtype=torch.float64, requires_grad=True)
        with pydnn_runs():
            assert torch.autograd.gradcheck(mine, (xg,))


# -------------------------------------------------------------------------------------------- pooling
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", [
    (pt.MaxPool2d, nn.MaxPool2d, (2,), {}), (pt.MaxPool2d, nn.MaxPool2d, (3,), dict(stride=2, padding=1)),
    (pt.AvgPool2d, nn.AvgPool2d, (2,), {}), (pt.AvgPool2d, nn.AvgPool2d, (3,), dict(stride=2, padding=1)),
    (pt.AvgPool2d, nn.AvgPool2d, (3,), dict(stride=1, padding=1, count_include_pad=False)),
    (pt.AdaptiveAvgPool2d, nn.AdaptiveAvgPool2d, (1,), {}),
    (pt.AdaptiveAvgPool2d, nn.AdaptiveAvgPool2d, ((5, 3),), {}),
], ids=["max2", "max3s2p1", "avg2", "avg3s2p1", "avg-exclude", "adaptive1", "adaptive53"])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_pooling(case, dtype, layout):
    pcls, tcls, args, kw = case
    mine, ref = pcls(*args, **kw), tcls(*args, **kw)
    x = distinct_planes(3, 8, 17, 14, dtype)
    if layout == "nhwc":
        x = x.to(memory_format=torch.channels_last)
    # the float64 reference runs on an NCHW copy: PyTorch's CUDA avg_pool2d backward on channels_last input
    # with padding > 0 returns wrong gradients (pytorch/pytorch#188344, fixed after torch 2.11); pydnn's
    # agree with the numpy reference there (tests/ops/pooling)
    y = compare_module(mine, ref, x, dtype, what=pcls.__name__, ref_nchw=True)
    if layout == "nhwc":
        assert y.is_contiguous(memory_format=torch.channels_last)


def distinct_planes(n, c, h, w, dtype):
    """Each (n, c) plane a random permutation of 0..h*w-1, over 16, minus 7: exact in bf16 (integers
    below 256 times a power of two) and without ties, so max pooling's argmax is the same as PyTorch's."""
    assert h * w <= 256
    planes = torch.stack([torch.randperm(h * w, device="cuda") for _ in range(n * c)])
    return (planes.view(n, c, h, w).to(torch.float32) / 16 - 7).to(dtype)


def test_pooling_gradcheck_float64():
    x = torch.randn(2, 3, 6, 7, device="cuda", dtype=torch.float64, requires_grad=True)
    with pydnn_runs():
        assert torch.autograd.gradcheck(lambda t: PF.avg_pool2d(t, 3, 2, 1), (x,))
        assert torch.autograd.gradcheck(lambda t: PF.max_pool2d(t, 2), (x,))
        assert torch.autograd.gradcheck(lambda t: PF.adaptive_avg_pool2d(t, (4, 3)), (x,))


# ---------------------------------------------------------------------------------------------- dropout
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dropout(dtype):
    torch.manual_seed(5)
    p = 0.3
    m = pt.Dropout(p)
    x = (rand(64, 1000, dtype=dtype).abs() + 0.5).requires_grad_(True)
    with pydnn_runs():
        y = m(x)
    kept = y != 0
    frac = 1 - kept.float().mean().item()
    assert abs(frac - p) < 0.01, frac
    close(y[kept], (x[kept].double() / (1 - p)), dtype, "kept values")
    dy = rand(64, 1000, dtype=dtype)
    with pydnn_runs():
        y.backward(dy)
    close(x.grad, torch.where(kept, dy.double() / (1 - p), 0.0), dtype, "dx")
    y2 = m(x)
    assert not torch.equal(y2 != 0, kept)  # a fresh mask per call
    m.eval()
    assert m(x) is x


# ---------------------------------------------------------------------------------------------- softmax
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("dim", [-1, 1])
def test_softmax(dtype, log, dim):
    x = (rand(4, 37, 9, dtype=dtype) * 3).requires_grad_(True)
    xr = x.detach().double().requires_grad_(True)
    fn, tfn = (pt.log_softmax, F.log_softmax) if log else (pt.softmax, F.softmax)
    with pydnn_runs():
        y = fn(x, dim)
    yr = tfn(xr, dim)
    close(y, yr, dtype, "softmax")
    dy = torch.randn_like(yr)
    with pydnn_runs():
        y.backward(dy.to(dtype))
    yr.backward(dy)
    close(x.grad, xr.grad, dtype, "softmax dx")


# -------------------------------------------------------------------------------------------- attention
def sdpa_ref(q, k, v, causal, scale=None):
    q, k, v = q.double(), k.double(), v.double()
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = q @ k.transpose(-1, -2) * (scale if scale is not None else q.shape[-1] ** -0.5)
    if causal:
        sq, sk = s.shape[-2:]
        s = s.masked_fill(torch.ones(sq, sk, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads", [(4, 4), (8, 2)], ids=["mha", "gqa"])
def test_sdpa(dtype, d, causal, heads):
    torch.manual_seed(6)
    hq, hkv = heads
    b, sq, sk = 2, 197, 197 if causal else 150
    q = rand(b, hq, sq, d, dtype=dtype).requires_grad_(True)
    k = rand(b, hkv, sk, d, dtype=dtype).requires_grad_(True)
    v = rand(b, hkv, sk, d, dtype=dtype).requires_grad_(True)
    refs = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    with pydnn_runs():
        o = pt.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=hq != hkv)
    orf = sdpa_ref(*refs, causal)
    close(o, orf, dtype, "o")
    do = torch.randn_like(orf)
    with pydnn_runs():
        o.backward(do.to(dtype))
    orf.backward(do)
    for t, r, n in zip((q, k, v), refs, "qkv"):  # P and dS are rounded to the 16-bit type in the kernels
        close(t.grad, r.grad, dtype, f"d{n}", tol=TOL_SUM[dtype])


def test_sdpa_bshd_views_and_autocast():
    """q, k, v as strided views of one packed (B, S, 3, H, D) projection, fp32 in, under bf16 autocast."""
    torch.manual_seed(7)
    b, s, h, d = 2, 64, 4, 64
    qkv = rand(b, s, 3, h, d).requires_grad_(True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        q, k, v = qkv.unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        with pydnn_runs():
            o = pt.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert o.dtype == torch.bfloat16
    qkvr = qkv.detach().bfloat16().double().requires_grad_(True)
    qr, kr, vr = (t.transpose(1, 2) for t in qkvr.unbind(2))
    orf = sdpa_ref(qr, kr, vr, True)
    close(o, orf, torch.bfloat16, "o")
    do = torch.randn_like(orf)
    with pydnn_runs():
        o.backward(do.bfloat16())
    orf.backward(do)
    close(qkv.grad, qkvr.grad, torch.bfloat16, "dqkv", tol=TOL_SUM[torch.bfloat16])


@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_attention(batch_first):
    torch.manual_seed(8)
    e, h = 256, 4
    ref = nn.MultiheadAttention(e, h, batch_first=batch_first).cuda()
    mine = pt.MultiheadAttention(e, h, batch_first=batch_first).cuda()
    mine.load_state_dict(ref.state_dict())
    x = rand(3, 50, e) if batch_first else rand(50, 3, e)
    x.requires_grad_(True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        with pydnn_runs():
            y, w = mine(x, x, x, need_weights=False)
        assert w is None
        yr, _ = ref(x, x, x, need_weights=False)
    close(y, yr.float(), torch.bfloat16, "mha", tol=5e-2)  # two bf16 computations (pydnn's, PyTorch's)
    y.float().sum().backward()
    assert mine.in_proj_weight.grad is not None and torch.isfinite(mine.in_proj_weight.grad).all()


# -------------------------------------------------------------------------------------------- linear
@pytest.mark.skipif(not hasattr(__import__("pydnn"), "matmul"), reason="this pydnn has no public pydnn.matmul")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_on_pydnn_matmul(dtype, bias):
    mine, ref = pair(pt.Linear, nn.Linear, (96, 40), dict(bias=bias), dtype)
    compare_module(mine, ref, rand(3, 17, 96, dtype=dtype), dtype, what="linear")
    mine.zero_grad(), ref.zero_grad()
    compare_module(mine, ref, rand(96, 17, 3, dtype=dtype).transpose(0, 2), dtype, what="linear strided")


# ----------------------------------------------------------------------- autocast, convert, CUDA graph
def cnn():
    return nn.Sequential(
        nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU(), nn.MaxPool2d(2),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10))


def relerr(got, want, floor=1e-3):
    got, want = got.detach().double(), want.detach().double()
    return ((got - want).abs().max() / want.abs().max().clamp_min(floor)).item()


@pytest.mark.parametrize("channels_last", [False, True])
def test_convert_cnn_under_autocast(channels_last):
    """pydnn's bf16 autocast pipeline is about as accurate as PyTorch's (cuDNN) one: both against the same
    model in float64. (Two bf16 pipelines through conv + BN + max pooling differ from each other by more
    than either differs from float64 wherever a bf16 rounding breaks a max-pooling tie differently, so
    they are not compared with each other.)"""
    torch.manual_seed(9)
    ref = cnn().cuda()
    model = cnn().cuda()
    model.load_state_dict(ref.state_dict())
    exact = cnn().cuda().double()
    exact.load_state_dict(ref.state_dict())
    report = pt.convert(model, fuse=True)
    pools = [("1", "max_pool2d"), ("5", "max_pool2d")] if tuning.torch.FUSE_POOL else []  # FUSE_POOL folds them
    blocks = [("0", "1"), ("4", "5")] if tuning.torch.FUSE_BLOCK else []  # FUSE_BLOCK: conv + batch norm, one node
    # (no FUSE_CHAIN entry: AdaptiveAvgPool2d is not one of a chain's stages)
    assert len(report.converted) == 10 and report.fused == [("1", "relu"), ("5", "relu")] + pools + blocks
    mf = torch.channels_last if channels_last else torch.contiguous_format
    model.to(memory_format=mf), ref.to(memory_format=mf), exact.to(memory_format=mf)
    x = rand(8, 3, 32, 32).to(memory_format=mf)
    for train in (True, False):
        model.train(train), ref.train(train), exact.train(train)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            with pydnn_runs():
                y = model(x)
            yr = ref(x)
        y64 = exact(x.double())
        assert y.dtype == yr.dtype
        ep, ec = relerr(y, y64), relerr(yr, y64)
        assert ep <= 2 * ec + 2e-2, f"cnn train={train}: pydnn {ep:.3g} against float64, PyTorch {ec:.3g}"
        if train:
            with pydnn_runs():
                y.float().logsumexp(1).sum().backward()
            yr.float().logsumexp(1).sum().backward()
            y64.logsumexp(1).sum().backward()
            # a conv bias before a training-mode batch norm has a zero gradient (the norm removes any
            # per-channel shift): relative to the model's largest gradient, not to its own rounding noise
            floor = 1e-2 * max(p64.grad.abs().max().item() for p64 in exact.parameters())
            for (n, p), pr, p64 in zip(model.named_parameters(), ref.parameters(), exact.parameters()):
                ep, ec = relerr(p.grad, p64.grad, floor), relerr(pr.grad, p64.grad, floor)
                assert ep <= 2 * ec + 2e-2, f"grad {n}: pydnn {ep:.3g} against float64, PyTorch {ec:.3g}"
    close(model[1].running_mean, ref[1].running_mean, torch.bfloat16, "running_mean", tol=5e-2)


def test_cuda_graph_capture_of_a_small_model():
    torch.manual_seed(10)
    model = cnn().cuda()
    pt.convert(model)
    ref = cnn().cuda()
    ref.load_state_dict(model.state_dict())
    model.eval(), ref.eval()
    static_x = rand(4, 3, 16, 16)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up on the side stream: loads pydnn's modules, fills the plan caches
        for _ in range(2):
            model(static_x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with pydnn_runs():
        with torch.cuda.graph(g):
            static_y = model(static_x)
    for _ in range(3):
        static_x.copy_(rand(4, 3, 16, 16))
        g.replay()
        torch.cuda.synchronize()
        close(static_y, ref(static_x).detach(), torch.float32, "replay")


def test_cuda_graph_capture_training_step():
    """Forward + backward captured (train mode: batch-norm statistics update inside the graph)."""
    torch.manual_seed(11)
    model = cnn().cuda()
    pt.convert(model)
    x = rand(4, 3, 16, 16)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            model(x).sum().backward()
    torch.cuda.current_stream().wait_stream(s)
    model.zero_grad(set_to_none=False)
    g = torch.cuda.CUDAGraph()
    with pydnn_runs():
        with torch.cuda.graph(g):
            loss = model(x).square().mean()
            loss.backward()
    rm0 = model[1].running_mean.clone()
    g.replay()
    torch.cuda.synchronize()
    grads = [p.grad.clone() for p in model.parameters()]
    assert all(torch.isfinite(t).all() for t in grads)
    assert not torch.equal(rm0, model[1].running_mean)
    # the same step eagerly, from the same state, gives the same gradients
    ref = cnn().cuda()
    ref.load_state_dict(model.state_dict())
    ref[1].running_mean.copy_(rm0)
    ref.train()
    ref(x).square().mean().backward()
    for p, pr in zip(grads, ref.parameters()):
        close(p, pr.grad, torch.float32, "graph grads")


def test_fp16_autocast_with_grad_scaler():
    """Three SGD steps under fp16 autocast with torch.amp.GradScaler: the same losses as PyTorch's model."""
    torch.manual_seed(13)
    model, ref = cnn().cuda(), cnn().cuda()
    ref.load_state_dict(model.state_dict())
    pt.convert(model, fuse=True)
    losses = {}
    for name, m in (("pydnn", model), ("torch", ref)):
        torch.manual_seed(14)
        opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
        scaler = torch.amp.GradScaler("cuda")
        out = []
        for _ in range(3):
            x, t = rand(16, 3, 16, 16), torch.randint(0, 10, (16,), device="cuda")
            with torch.autocast("cuda", dtype=torch.float16):
                if name == "pydnn":
                    with pydnn_runs():
                        logits = m(x)
                else:
                    logits = m(x)
                loss = F.cross_entropy(logits, t)
            opt.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            out.append(loss.item())
        losses[name] = out
    for a, b in zip(losses["pydnn"], losses["torch"]):
        assert abs(a - b) <= 2e-2 * abs(b) + 1e-3, losses


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_dropout_against_the_philox_reference(causal):
    """dropout_p > 0: the seed the bridge draws from PyTorch's generator is replayed, and pydnn's float64
    reference (pydnn.reference.attention with the Philox keep mask) gives O, dQ, dK, dV."""
    import numpy as np
    from pydnn.reference import attention as R
    import pydnn
    torch.manual_seed(15)
    b, hq, hkv, s, d, p = 2, 4, 2, 80, 64, 0.2
    q, k, v = (rand(b, h, s, d, dtype=torch.bfloat16).requires_grad_(True) for h in (hq, hkv, hkv))
    torch.manual_seed(16)
    seed = int(torch.randint(0, 2 ** 62, (), dtype=torch.int64))  # what AttentionFunction.forward draws
    torch.manual_seed(16)
    with pydnn_runs():
        o = pt.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=causal, enable_gqa=True)
    mask = pydnn.PYDNN_ATTN_MASK_CAUSAL_TOP_LEFT if causal else pydnn.PYDNN_ATTN_MASK_NONE
    qn, kn, vn = (t.detach().double().cpu().numpy() for t in (q, k, v))
    ro, _, so, _ = R.forward(qn, kn, vn, d ** -0.5, mask, dropout=(p, seed))
    rtol, atol = 8e-3, 1e-4

    def ok(got, want, scale, what):
        got = got.detach().double().cpu().numpy()
        bad = np.abs(got - want) > atol + rtol * np.maximum(np.abs(want), scale)
        assert not bad.any(), f"{what}: {bad.sum()} of {bad.size} off"

    ok(o, ro, so, "O")
    do = rand(b, hq, s, d, dtype=torch.bfloat16)
    with pydnn_runs():
        o.backward(do)
    rdq, rdk, rdv, (sdq, sdk, sdv) = R.backward(qn, kn, vn, do.double().cpu().numpy(), d ** -0.5, mask,
                                                dropout=(p, seed))
    ok(q.grad, rdq, sdq, "dQ")
    ok(k.grad, rdk, sdk, "dK")
    ok(v.grad, rdv, sdv, "dV")


# --------------------------------------------------------------------------------- threads and contexts
def test_calls_from_threads_without_a_current_context():
    """pydnn calls from a fresh Python thread (no driver context is current on it: asserted) and from
    autograd's device thread (each backward below starts at a pydnn node, so no PyTorch kernel makes the
    context current there first): the bridge makes the handle's context current on each. Before it did,
    backward passes failed with CUDA_ERROR_INVALID_CONTEXT."""
    import threading

    from cuda.bindings import driver as cu

    torch.manual_seed(12)
    conv = pt.Conv2d(3, 8, 3, padding=1, activation="relu").cuda()
    ref = nn.Conv2d(3, 8, 3, padding=1).cuda().double()
    ref.load_state_dict({k: v.double() for k, v in conv.state_dict().items()})
    x = rand(2, 3, 11, 9)
    dy = rand(2, 8, 11, 9)
    xr = x.double().requires_grad_(True)
    yr = F.relu(ref(xr))
    yr.backward(dy.double())
    gelu_x, gelu_dy = rand(5, 33), rand(5, 33)
    gr = gelu_x.double().requires_grad_(True)
    F.gelu(gr).backward(gelu_dy.double())
    torch.cuda.synchronize()
    results = []

    def work():
        try:
            err, ctx = cu.cuCtxGetCurrent()
            fresh = int(err) == 0 and int(ctx) == 0
            with pydnn_runs():
                with torch.no_grad():
                    y_eval = conv(x)
                xg = x.detach().requires_grad_(True)
                conv(xg).backward(dy)  # the conv's (fused ReLU) backward runs first on the device thread
                ag = gelu_x.detach().requires_grad_(True)
                pt.GELU()(ag).backward(gelu_dy)  # activation backward first
            torch.cuda.synchronize()
            results.append((fresh, y_eval, xg.grad, ag.grad))
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            results.append(e)

    for _ in range(2):
        t = threading.Thread(target=work)
        t.start()
        t.join()
    for r in results:
        if isinstance(r, BaseException):
            raise r
        fresh, y_eval, dx, dgelu = r
        assert fresh, "the thread started with a context current: the test does not test the fix"
        close(y_eval, yr, torch.float32, "forward (no_grad, thread)", TOL_SUM[torch.float32])
        close(dx, xr.grad, torch.float32, "dx (thread)", TOL_SUM[torch.float32])
        close(dgelu, gr.grad, torch.float32, "gelu dx (thread)")
    conv.weight.grad = None
    xg = x.detach().requires_grad_(True)  # and the main thread still works after the others ran
    with pydnn_runs():
        conv(xg).backward(dy)
    close(xg.grad, xr.grad, torch.float32, "dx (main thread)", TOL_SUM[torch.float32])
