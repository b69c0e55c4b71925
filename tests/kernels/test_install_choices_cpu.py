"""The install / first-use split against the planners (pydnn/_build/rare.py), on the CPU: the kernels that
the planners choose for common deep-learning calls (float / half / bfloat16, default tuning switches, aligned
dense tensors) on sm_80 and sm_90 are in units the install builds, so that such calls never compile on first
use; and what the rules leave to first use is what the planners take only off that path (dropout in
attention, forced switches, other archs).

The calls run on a CPU handle whose kernel lookups are recorded (handle._funcs) inside driver.recording()
(launches listed, not enqueued): every kernel a call would load, whatever launch path it takes."""
import json
import os

import pytest

import pydnn
from pydnn import tuning
from pydnn._build import loader, manifest, rare
from pydnn._cuda import driver
from pydnn.ops import attention as A
from pydnn.ops import attention_ws as WS
from pydnn.ops import matmul as M
from test_attention_cpu import BF16, BR, F16, F32, NONE, _attn, _t
from test_fuzz_cpu import cpu_handle

ARCHS = {"sm_80": 108, "sm_90": 132}   # the default install's archs and their SM counts (A100, H100 / H200)


class _Lookups(dict):
    """handle._funcs that records each (unit, expr) looked up and hands back the key as the 'function'."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def get(self, key, default=None):
        self.seen.append(key)
        return key


@pytest.fixture
def record(monkeypatch):
    """record(arch, fn, *args): run fn(handle, *args) on a CPU handle of `arch`; returns the (unit, expr)
    pairs it looked up."""
    monkeypatch.setattr(driver, "function_set_max_dynamic_smem", lambda f, n: None)

    def run(arch, fn, *args):
        h = cpu_handle()
        h.arch, h.sm_count, h._funcs = arch, ARCHS.get(arch, 132), _Lookups()
        with driver.recording():
            fn(h, *args)
        assert h._funcs.seen, "the call looked up no kernel"
        return list(dict.fromkeys(h._funcs.seen))
    return run


def _where(arch, unit, expr):
    """The unit that holds (family unit, expr) on `arch` after the split."""
    name = loader.resolve(arch, unit, expr)
    u = loader._tables(arch)[0].get(name)   # (the loader's cached split of the arch)
    assert u is not None and expr in u.exprs, (arch, unit, expr, name)
    assert manifest.unit_arch(u, arch) is not None, f"{name} does not exist for {arch}"
    return u


def assert_installed(arch, pairs):
    out = os.environ.get("PYDNN_RECORD_CHOICES")   # tools/build_stats.py --unused: what common calls load
    if out:
        with open(out, "a") as f:
            f.writelines(json.dumps([arch, _where(arch, u, e).name, e]) + "\n" for u, e in pairs)
    bad = [(u, e, _where(arch, u, e).name) for u, e in pairs if not _where(arch, u, e).install]
    assert not bad, f"{arch}: common calls would compile on first use: {bad}"


# ----------------------------------------------------------------------------- attention

def _attn_call(d, dtype, sq, skv, mask, backward, det=1, p=0.0, b=2, hq=8, hkv=2):
    a = _attn(hq, hkv, d, mask=mask, p=p, seed=1 if p else 0)
    q, o = _t((b, hq, sq, d), dtype), _t((b, hq, sq, d), dtype)
    k, v = _t((b, hkv, skv, d), dtype), _t((b, hkv, skv, d), dtype)
    st = _t((b, hq, sq, 1), F32)
    P = [i << 36 for i in range(1, 12)]

    def fwd(h):
        ws = pydnn.get_attention_forward_workspace_size(h, a, q, k)
        pydnn.attention_forward(h, a, q, P[0], k, P[1], v, P[2], o, P[3], st, P[4], None, None,
                                P[10] if ws else None, ws)

    def bwd(h):
        ws = pydnn.get_attention_backward_workspace_size(h, a, q, k)
        pydnn.attention_backward(h, a, q, P[0], k, P[1], v, P[2], o, P[3], q, P[5], st, P[4], q, P[6], k, P[7], v,
                                 P[8], None, None, det, P[10], ws)
    return bwd if backward else fwd


ATTN_CASES = [(d, dt, mask) for d in A.HEAD_DIMS for dt in (BF16, F16) for mask in (NONE, BR)]


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("d,dtype,mask", ATTN_CASES)
def test_attention_without_dropout_is_installed(record, arch, d, dtype, mask):
    """Training forward / backward (both dQ modes) and the decode forward: every head dim, both types."""
    got = []
    got += record(arch, _attn_call(d, dtype, 512, 512, mask, False))
    got += record(arch, _attn_call(d, dtype, 1, 4096, mask, False))             # decode
    got += record(arch, _attn_call(d, dtype, 512, 512, mask, True, det=1))
    got += record(arch, _attn_call(d, dtype, 512, 512, mask, True, det=0))
    assert_installed(arch, got)
    if arch == "sm_90" and d in WS.HEAD_DIMS:   # (the recording keeps the TMA launch off: its pick here)
        p = A.AttnParams()
        p.mask = mask
        assert_installed(arch, [WS.pick("bf16" if dtype == BF16 else "f16", d, p, True)[:2]])


# the warp-specialized forward's switches that choose a unit (tuning.attention), all off: what the defaults
# replaced (one Q buffer, two consumer warpgroups at d 64, no ghost tiles / end-aligned blocks)
WS_OFF = {"attention.WS_Q2": False, "attention.WS_C3": False, "attention.WS_GH": {}, "attention.WS_AL": False,
          "attention.WS_EMU": 0}


@pytest.mark.parametrize("tag", ["bf16", "f16"])
def test_warp_specialized_forward_defaults_installed_older_forms_first_use(tag):
    """sm_90's forward at every head dim, mask, TMA producer or cp.async (per-batch key lengths): the defaults'
    kernels are installed; the forms the defaults replaced (one Q buffer, d 64 on two warpgroups with TMA, three
    without ghost tiles or without end-aligned blocks) compile on first use (rare.py), where they differ."""
    arch, default, older = "sm_90", set(), set()
    for d in WS.HEAD_DIMS:
        for mask in (NONE, BR):
            p = A.AttnParams()
            p.mask = mask
            for tma in (True, False):
                default.add(WS.pick(tag, d, p, tma)[:2])
                for off in [WS_OFF, {"attention.WS_C3": False, "attention.WS_EMU": 0}] + [{k: v} for k, v in
                                                                                          WS_OFF.items()]:
                    with tuning.override(off):
                        older.add(WS.pick(tag, d, p, tma)[:2])
    assert_installed(arch, sorted(default))
    first = {(u, e) for u, e in older - default if not _where(arch, u, e).install}
    # every older form is first use but d 256's one-Q-buffer kernels (attention.ws.d256: d 256 has no two-buffer
    # form, and its TMA kernel without ghost tiles is the default of calls without a mask)
    assert older - default - first <= {(WS.unit_name(tag, 256), WS._expr(tag, 256, tma=t)) for t in (True, False)}
    assert {u for u, e in first} >= {f"attention.ws.{tag}", f"attention.ws.q2.{tag}", f"attention.ws.c3.{tag}",
                                     f"attention.ws.gh.{tag}", f"attention.ws.emu.{tag}"}, first


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("d", A.HEAD_DIMS)
def test_attention_dropout_compiles_on_first_use(record, arch, d):
    """Attention dropout is off in most models: its mma.sync kernels are first-use units (rare.py)."""
    got = record(arch, _attn_call(d, BF16, 512, 512, NONE, False, p=0.1))
    got += record(arch, _attn_call(d, BF16, 512, 512, NONE, True, p=0.1))
    first = {e for u, e in got if not _where(arch, u, e).install}
    assert any("::fwd<" in e for e in first) and any("::bwd_dkdv<" in e for e in first), first
    assert all(e.endswith("true>") for e in first), first  # only the dropout variants


def test_hopper_mma_sync_attention_is_first_use_only_on_sm90():
    """The mma.sync forward / backward at d 64 / 96 / 128 without dropout: first use on sm_90 (the wgmma and
    warp-specialized kernels take those calls there), installed on every other arch (their main path)."""
    e = A._expr("fwd", "bf16", 128, A._targs("fwd", 128))
    for arch in ("sm_80", "sm_86", "sm_89", "sm_100", "sm_120"):
        assert not rare.is_rare("attention.bf16", e, arch), arch
    assert rare.is_rare("attention.bf16", e, "sm_90")
    pre = A._expr("bwd_pre", "bf16", 128)
    assert not rare.is_rare("attention.bf16", pre, "sm_90")   # every arch's backward runs it
    bwd256 = A._expr("bwd_dkdv", "bf16", 256, A._targs("bwd_dkdv", 256, False, False))
    assert not rare.is_rare("attention.d256.bf16", bwd256, "sm_90")   # (no wgmma backward at d 256)


def test_warp_specialized_backward_defaults_are_installed():
    """bwd_ws (sm_90) at its head dims in the dQ modes the defaults run: tuning.attention_bwd.WS_DQ for
    deterministic = 0, "none" for deterministic = 1; the other WS_DQ values compile on first use. (The recording
    above cannot see bwd_ws: usable() refuses it while a launch recorder listens.)"""
    from pydnn.ops import attention_ws_bwd as WB

    arch = "sm_90"
    for tag in WB.TAGS:
        unit = WB.unit_name(tag)
        used = {(d, WB.dq_mode(atomic, d, causal)) for d in WB.HEAD_DIMS for atomic in (True, False)
                for causal in (False, True)}
        assert_installed(arch, [(unit, WB._expr(tag, d, m)) for d, m in sorted(used)])
        rest = [(d, m) for d in WB.INSTANTIATED for m in WB.DQ_MODES if (d, m) not in used
                and d in WB.MODE_DIMS.get(m, (d,))]
        assert rest and all(not _where(arch, unit, WB._expr(tag, d, m)).install for d, m in rest)


def test_rnn_standard_installed_persist_static_first_use():
    """The STANDARD algorithm's cells (the default, pydnn.torch's) are installed on both archs; PERSIST_STATIC's
    persistent kernels, an algorithm a caller names, compile on first use."""
    from pydnn.ops.rnn import kernels as RK

    units = RK.kernel_units()
    persist = [u for u in units if u.source == "rnn_persist.cu"]
    names = {RK.unit_name(t) for t in ("f32", "f16", "bf16")}   # (half and bfloat16: the one rnn.h16 unit)
    cells = [u for u in units if u.name in names]   # (every cell mode, RNN_TANH too)
    assert {e for u in cells for e in u.exprs} >= {RK.expr(k, t, c) for t in ("f32", "f16", "bf16")
                                                   for k in ("fwd_cell", "bwd_cell") for c in range(4)}
    assert persist and cells
    for arch in ARCHS:
        assert all(not _where(arch, u.name, e).install for u in persist for e in u.exprs), arch
        assert_installed(arch, [(u.name, e) for u in cells for e in u.exprs])


# ----------------------------------------------------------------------------- matmul

MM_SHAPES = [  # (m, n, k, batch): LLM projections and their gradients, small layers, batched products
    (4096, 4096, 4096, 1), (8192, 8192, 8192, 1), (16384, 4096, 4096, 1), (16384, 11008, 4096, 1),
    (10240, 384, 536, 1), (1024, 1024, 1024, 1), (512, 512, 4096, 1), (384, 1152, 16384, 1), (64, 64, 64, 1),
    (4096, 4096, 384, 1), (128, 128, 64, 96), (1024, 1024, 64, 32), (2048, 2048, 2048, 16)]


def _mm_pairs(plan):
    return [(lc.unit, lc.expr) for lc in (plan.fast, plan.tma, plan.split_fast, plan.reduce) if lc is not None]


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("dtype", [BF16, F16, F32])
@pytest.mark.parametrize("trans", ["nn", "nt", "tn"])
def test_matmul_plans_are_installed(arch, dtype, trans):
    h = cpu_handle()
    h.arch, h.sm_count = arch, ARCHS[arch]
    ta, tb = trans[0] == "t", trans[1] == "t"
    pairs = []
    for m, n, k, batch in MM_SHAPES:
        kw = dict(batch=batch, stride_a=m * k, stride_b=k * n, stride_c=m * n) if batch > 1 else {}
        for split_k in (False, True):
            pairs += _mm_pairs(M.gemm_plan(h, dtype, m, n, k, trans_a=ta, trans_b=tb, split_k=split_k, **kw))
    assert pairs
    assert_installed(arch, pairs)


def test_matmul_first_use_is_off_the_default_path():
    """What rare.py leaves to first use on sm_90: the one-block-a-tile 128x256 wgmma tile (WG_PERSIST runs the
    persistent one), the TMA candidates, and A^T B^T; the 128x128 wgmma tile and the TMA tile stay."""
    for tag in ("f16", "bf16"):
        assert rare.is_rare(f"matmul.wgmma.{tag}", M.WG_TILES[0].expr(tag, False, False), "sm_90")
        assert not rare.is_rare(f"matmul.wgmma.{tag}", M.WG_TILES[1].expr(tag, False, False), "sm_90")
        for ta, tb in ((False, False), (False, True), (True, False)):
            assert not rare.is_rare(f"matmul.tma.{tag}", M.TMA_TILE.expr(tag, ta, tb), "sm_90")
            assert not rare.is_rare(f"matmul.wgmmap.{tag}", M.WG_PERSIST_TILE.expr(tag, ta, tb), "sm_90")
            assert not rare.is_rare(f"matmul.wgmmas.{tag}", M.WG_SPLIT_TILE.expr(tag, ta, tb), "sm_90")
        assert rare.is_rare(f"matmul.tma.{tag}", M.TMA_TILE.expr(tag, True, True), "sm_90")
        assert rare.is_rare(f"matmul.wgmmap.{tag}", M.WG_PERSIST_TILE.expr(tag, True, True), "sm_90")
        assert rare.is_rare(f"matmul.wgmmas.{tag}", M.WG_SPLIT_TILE.expr(tag, True, True), "sm_90")
    for t in M.TMA_CANDIDATES:
        assert rare.is_rare(f"{t.unit}.bf16", t.expr("bf16", False, False), "sm_90")
    assert tuning.matmul.WG_PERSIST and tuning.matmul.USE_TMA  # (the defaults these rules rest on)


# ----------------------------------------------------------------------------- convolution

# (N, C, K, H = W, filter, pad, stride, groups): ResNet-50's layers (stem, bottleneck 1x1 / 3x3, downsampling),
# a UNet-like 3x3 stack, a 1x1 over 64 channels, a depthwise 3x3 / 7x7 (MobileNet, ConvNeXt)
CONV_LAYERS = [(32, 3, 64, 224, 7, 3, 2, 1), (32, 64, 64, 56, 1, 0, 1, 1), (32, 64, 64, 56, 3, 1, 1, 1),
               (32, 64, 256, 56, 1, 0, 1, 1), (32, 256, 128, 56, 1, 0, 1, 1), (32, 128, 128, 56, 3, 1, 2, 1),
               (32, 256, 512, 56, 1, 0, 2, 1), (32, 256, 256, 14, 3, 1, 1, 1), (32, 512, 512, 7, 3, 1, 1, 1),
               (32, 2048, 512, 7, 1, 0, 1, 1), (8, 128, 128, 128, 3, 1, 1, 1), (8, 320, 320, 64, 3, 1, 1, 1),
               (32, 96, 96, 56, 7, 3, 1, 96), (32, 144, 144, 56, 3, 1, 2, 144),
               # batch-1 inference (ResNet 3x3 at 56² and 7²), MobileNet-v2's 1x1 expand / project over 24 and 144
               # channels (C, K not multiples of 64) and its stride-1 depthwise 3x3 over 32 channels at 112²
               (1, 64, 64, 56, 3, 1, 1, 1), (1, 512, 512, 7, 3, 1, 1, 1), (32, 24, 144, 56, 1, 0, 1, 1),
               (32, 144, 24, 56, 1, 0, 1, 1), (32, 32, 32, 112, 3, 1, 1, 32),
               # a UNet head 1x1 64 -> 2 / 3 (K < 8)
               (8, 64, 2, 128, 1, 0, 1, 1), (8, 64, 3, 128, 1, 0, 1, 1),
               # layers whose tiles only they took in a scan of ResNet-50, MobileNet-v2, EfficientNet-B0, VGG-16, UNet
               # and ResNeXt at N 1 / 8 / 32 / 128 (rare.py's convolution rules): MobileNet-v2's 16 -> 96 expand at
               # 112², its 96 -> 24 project, a 3x3 over 96 channels, a 3-channel stride-2 stem, a 96 -> 576 1x1
               (1, 16, 96, 112, 1, 0, 1, 1), (32, 96, 24, 56, 1, 0, 1, 1), (1, 96, 32, 56, 3, 1, 1, 1),
               (8, 3, 32, 224, 3, 1, 2, 1), (32, 96, 576, 14, 1, 0, 1, 1)]
# grouped convolutions (groups > 1, C/g >= 2): ResNeXt-50 32x4d's grouped 3x3 (C/g 4, 8 with stride 2, 16, 32),
# grouped 3x3s with 2 / 4 / 32 groups; their kernels compile on first use since session 32 (rare.py)
GROUPED_LAYERS = [(32, 128, 128, 56, 3, 1, 1, 32), (32, 256, 256, 56, 3, 1, 2, 32), (32, 512, 512, 14, 3, 1, 1, 32),
                  (32, 1024, 1024, 7, 3, 1, 1, 32), (1, 224, 224, 56, 3, 1, 1, 2), (1, 448, 448, 28, 3, 1, 2, 4),
                  (128, 256, 256, 28, 3, 1, 2, 32)]
GROUPED_UNITS = ("convolution.grouped.", "convolution.gdirect", "convolution.gwgrad.")
CONV_TYPES = [(BF16, True), (F16, True), (F32, False), (F32, True), (F16, False), (BF16, False)]   # (dtype, NHWC)


def _conv_descs(layer, dtype, nhwc):
    n, c, k, hw, f, pad, stride, groups = layer
    fmt = pydnn.PYDNN_TENSOR_NHWC if nhwc else pydnn.PYDNN_TENSOR_NCHW
    conv = pydnn.create_convolution_descriptor()
    pydnn.set_convolution2d_descriptor(conv, pad, pad, stride, stride, 1, 1, pydnn.PYDNN_CROSS_CORRELATION,
                                       pydnn.PYDNN_DATA_FLOAT)
    pydnn.set_convolution_group_count(conv, groups)
    x = pydnn.create_tensor_descriptor()
    pydnn.set_tensor4d_descriptor(x, fmt, dtype, n, c, hw, hw)
    w = pydnn.create_filter_descriptor()
    pydnn.set_filter4d_descriptor(w, dtype, fmt, k, c // groups, f, f)
    y = pydnn.create_tensor_descriptor()
    pydnn.set_tensor4d_descriptor(y, fmt, dtype, *pydnn.get_convolution2d_forward_output_dim(conv, x, w))
    return conv, x, w, y


def _conv_calls(layer, dtype, nhwc):
    """The three directions, each with the algorithm Get..._v7 ranks first and the workspace it reports."""
    conv, x, w, y = _conv_descs(layer, dtype, nhwc)
    X, W, Y, WSP = (i << 36 for i in range(1, 5))

    def fwd(h):
        p = pydnn.get_convolution_forward_algorithm_v7(h, x, w, conv, y, 1)[0]
        pydnn.convolution_forward(h, 1.0, x, X, w, W, conv, p.algo, WSP if p.memory else None, p.memory, 0.0, y, Y)

    def bwd_data(h):
        p = pydnn.get_convolution_backward_data_algorithm_v7(h, w, y, conv, x, 1)[0]
        pydnn.convolution_backward_data(h, 1.0, w, W, y, Y, conv, p.algo, WSP if p.memory else None, p.memory, 0.0,
                                        x, X)

    def bwd_filter(h):
        p = pydnn.get_convolution_backward_filter_algorithm_v7(h, x, y, conv, w, 1)[0]
        pydnn.convolution_backward_filter(h, 1.0, x, X, y, Y, conv, p.algo, WSP if p.memory else None, p.memory,
                                          0.0, w, W)
    def fused(h):   # ConvolutionBiasActivationForward with ReLU (inference graphs), v7's algorithm
        p = pydnn.get_convolution_forward_algorithm_v7(h, x, w, conv, y, 1)[0]
        db = pydnn.create_tensor_descriptor()
        pydnn.set_tensor4d_descriptor(db, pydnn.PYDNN_TENSOR_NCHW, dtype, 1, layer[2], 1, 1)
        act = pydnn.create_activation_descriptor()
        pydnn.set_activation_descriptor(act, pydnn.PYDNN_ACTIVATION_RELU, pydnn.PYDNN_NOT_PROPAGATE_NAN, 0.0)
        pydnn.convolution_bias_activation_forward(h, 1.0, x, X, w, W, conv, p.algo, WSP if p.memory else None,
                                                  p.memory, 0.0, y, Y, db, WSP + (1 << 30), act, y, Y)

    def bwd_bias(h):
        db = pydnn.create_tensor_descriptor()
        pydnn.set_tensor4d_descriptor(db, pydnn.PYDNN_TENSOR_NCHW, dtype, 1, layer[2], 1, 1)
        pydnn.convolution_backward_bias(h, 1.0, y, Y, 0.0, db, WSP)
    return fwd, bwd_data, bwd_filter, bwd_bias, fused


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("dtype,nhwc", CONV_TYPES)
def test_convolution_v7_choices_are_installed(record, arch, dtype, nhwc):
    """What Get..._v7 ranks first (what frameworks run without benchmarking) on common layers, each direction."""
    pairs = []
    for layer in CONV_LAYERS:
        for call in _conv_calls(layer, dtype, nhwc):
            pairs += record(arch, call)
    assert_installed(arch, pairs)


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("dtype,nhwc", CONV_TYPES)
def test_grouped_convolutions_compile_on_first_use(record, arch, dtype, nhwc):
    """Grouped layers, each direction with Get..._v7's algorithm: the grouped kernels (16-bit) are first-use units
    (rare.py: ~29 s of a 2-core install), whatever else such a call takes (packs, folds, float paths) is installed."""
    pairs = []
    for layer in GROUPED_LAYERS:
        for call in _conv_calls(layer, dtype, nhwc):
            pairs += record(arch, call)
    grouped = [(u, e) for u, e in pairs if u.startswith(GROUPED_UNITS)]
    assert_installed(arch, [(u, e) for u, e in pairs if (u, e) not in grouped])
    assert all(not _where(arch, u, e).install for u, e in grouped), grouped
    if dtype != F32 and nhwc:
        assert grouped   # 16-bit NHWC layers run the grouped tensor-core kernels (NCHW ones the dense paths)


# ----------------------------------------------------------------------------- normalization

def _norm_cases(dt):
    from test_fuzz_cpu import _desc

    def nd(kind, groups=1, k=1, act=None):
        d = pydnn.create_norm_descriptor()
        pydnn.set_norm_descriptor(d, kind, groups, k, 1e-5, act)
        return d

    relu = pydnn.create_activation_descriptor()
    pydnn.set_activation_descriptor(relu, pydnn.PYDNN_ACTIVATION_RELU, pydnn.PYDNN_NOT_PROPAGATE_NAN, 0.0)
    LN, RMS = pydnn.PYDNN_NORM_KIND_LAYER, pydnn.PYDNN_NORM_KIND_RMS
    GN, IN = pydnn.PYDNN_NORM_KIND_GROUP, pydnn.PYDNN_NORM_KIND_INSTANCE
    for rows in (1, 64, 4096, 32768):       # layer / RMS rows: transformer widths, with and without activation
        for L in (256, 768, 1024, 4096, 5120, 8192, 16384, 65536, 131072):
            for kind in (LN, RMS):
                for act in (None, relu):
                    yield nd(kind, 1, 1, act), _desc((rows, L), dt)
            yield nd(LN, 1, 2), _desc((rows, 64, L // 64), dt)
    for n in (1, 32):                      # group / instance norm: UNet and GAN shapes, NCHW and NHWC
        for c in (64, 320, 1280):
            for hw in (8, 32, 128):
                for fmt in (pydnn.PYDNN_TENSOR_NCHW, pydnn.PYDNN_TENSOR_NHWC):
                    x = pydnn.create_tensor_descriptor()
                    pydnn.set_tensor4d_descriptor(x, fmt, dt, n, c, hw, hw)
                    for kind, g in ((GN, 32), (GN, 1), (IN, 1)):
                        for act in (None, relu):
                            yield nd(kind, g, 1, act), x


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("dtype", [BF16, F16, F32])
def test_normalization_choices_are_installed(arch, dtype):
    """The launches a plan loads (normalization._load: every alternative, the unaligned one too, except a
    split-kernel plan's second) of layer / RMS / group / instance norm forward and backward over transformer
    and UNet shapes."""
    from pydnn.ops import normalization as N

    h = cpu_handle()
    h.arch, h.sm_count = arch, ARCHS[arch]
    pairs = []
    for nd, x in _norm_cases(dtype):
        for bwd in (False, True):
            pl = N._plan(h, N._set(nd), x, x, x if bwd else None, None, bwd)
            alts = pl.alternatives[:1] if pl.alternatives[0][0].unit is not None else pl.alternatives  # (N._load's)
            pairs += [(lc.unit or pl.unit, lc.expr) for alt in alts for lc in alt]
    assert len(pairs) > 100
    assert_installed(arch, list(dict.fromkeys(pairs)))


# ----------------------------------------------------------------------------- softmax

@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("dtype", [BF16, F16, F32])
def test_softmax_choices_are_installed(arch, dtype):
    """Every launch of the plan (a plan looks up its unaligned fallback with its main launch) for classifier
    heads (10 / 1000 classes), attention rows (odd lengths: ViT's 197, CLIP's 77), vocabularies (50257) and
    channel softmax (NCHW segmentation)."""
    from test_fuzz_cpu import _desc
    from pydnn.ops import softmax as S

    h = cpu_handle()
    h.arch, h.sm_count = arch, ARCHS[arch]
    pairs = []
    for rows, length in ((256, 10), (256, 1000), (4096, 197), (4096, 77), (512, 50257), (32, 31), (64, 64),
                         (8, 4096), (1, 131072)):
        x = _desc((rows, length), dtype)
        for backward in (False, True):
            for algo in (pydnn.PYDNN_SOFTMAX_ACCURATE, pydnn.PYDNN_SOFTMAX_LOG):
                descs = (x, x) if not backward else (x, x, x)
                pl = S._plan(h, backward, algo, pydnn.PYDNN_SOFTMAX_MODE_INSTANCE, descs)
                pairs += [(lc.unit or pl.unit, lc.expr) for lc in pl.launches]
    for hw in (128, 7):
        x = pydnn.create_tensor_descriptor()
        pydnn.set_tensor4d_descriptor(x, pydnn.PYDNN_TENSOR_NCHW, dtype, 8, 21, hw, hw)
        for backward in (False, True):
            pl = S._plan(h, backward, pydnn.PYDNN_SOFTMAX_ACCURATE, pydnn.PYDNN_SOFTMAX_MODE_CHANNEL,
                         (x, x) if not backward else (x, x, x))
            pairs += [(lc.unit or pl.unit, lc.expr) for lc in pl.launches]
    assert_installed(arch, list(dict.fromkeys(pairs)))


# ----------------------------------------------------------------------------- pooling

POOLS = [(3, 1, 2, 112), (2, 0, 2, 56), (7, 0, 7, 7), (3, 1, 1, 28)]   # (window, pad, stride, H = W)


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("dtype,nhwc", CONV_TYPES)
def test_pooling_choices_are_installed(record, arch, dtype, nhwc):
    """ResNet's 3x3 / 2 max pool, 2x2 pools, the global average pool and a stride-1 pool, NCHW and NHWC."""
    fmt = pydnn.PYDNN_TENSOR_NHWC if nhwc else pydnn.PYDNN_TENSOR_NCHW
    pairs = []
    for win, pad, stride, hw in POOLS:
        for mode in (pydnn.PYDNN_POOLING_MAX, pydnn.PYDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING):
            pd = pydnn.create_pooling_descriptor()
            pydnn.set_pooling2d_descriptor(pd, mode, pydnn.PYDNN_NOT_PROPAGATE_NAN, win, win, pad, pad, stride, stride)
            x = pydnn.create_tensor_descriptor()
            pydnn.set_tensor4d_descriptor(x, fmt, dtype, 32, 64, hw, hw)
            y = pydnn.create_tensor_descriptor()
            pydnn.set_tensor4d_descriptor(y, fmt, dtype, *pydnn.get_pooling2d_forward_output_dim(pd, x))
            X, Y, DY, DX = (i << 36 for i in range(1, 5))
            pairs += record(arch, lambda h: pydnn.pooling_forward(h, pd, 1.0, x, X, 0.0, y, Y))
            pairs += record(arch, lambda h: pydnn.pooling_backward(h, pd, 1.0, y, Y, y, DY, x, X, 0.0, x, DX))
    assert_installed(arch, pairs)


# ----------------------------------------------------------------------------- batch norm

@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("dtype,nhwc", CONV_TYPES)
def test_batchnorm_choices_are_installed(record, arch, dtype, nhwc):
    """Spatial batch norm (ResNet's channel counts and sizes, 7 x 7 included) forward training, inference and
    backward, NCHW and NHWC, aligned pointers."""
    fmt = pydnn.PYDNN_TENSOR_NHWC if nhwc else pydnn.PYDNN_TENSOR_NCHW
    mode = pydnn.PYDNN_BATCHNORM_SPATIAL
    P = [i << 36 for i in range(1, 12)]
    pairs = []
    for n, c, hw in ((32, 64, 112), (32, 256, 56), (32, 512, 28), (32, 2048, 7), (8, 64, 7), (256, 128, 14)):
        x = pydnn.create_tensor_descriptor()
        pydnn.set_tensor4d_descriptor(x, fmt, dtype, n, c, hw, hw)
        bn = pydnn.create_tensor_descriptor()
        pydnn.derive_bn_tensor_descriptor(bn, x, mode)
        pairs += record(arch, lambda h: pydnn.batch_normalization_forward_training(
            h, mode, 1.0, 0.0, x, P[0], x, P[1], bn, P[2], P[3], 0.1, P[4], P[5], 1e-5, P[6], P[7]))
        pairs += record(arch, lambda h: pydnn.batch_normalization_forward_inference(
            h, mode, 1.0, 0.0, x, P[0], x, P[1], bn, P[2], P[3], P[4], P[5], 1e-5))
        pairs += record(arch, lambda h: pydnn.batch_normalization_backward(
            h, mode, 1.0, 0.0, 1.0, 0.0, x, P[0], x, P[8], x, P[9], bn, P[2], P[3], P[10], 1e-5, P[6], P[7]))
    assert_installed(arch, pairs)


# ----------------------------------------------------------------------------- activations, tensor ops

@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("dtype", [BF16, F16, F32])
def test_activation_and_tensor_op_choices_are_installed(record, arch, dtype):
    """Dense activations forward / backward (every mode but the rare ones of rare.py), AddTensor of a bias and
    OpTensor ADD / MUL on dense tensors: the plans look up their scalar fallback with the vector kernel."""
    from test_fuzz_cpu import _desc

    X, Y, DY, DX, B = (i << 36 for i in range(1, 6))
    x = _desc((64, 1024), dtype)
    bias = _desc((1, 1024), dtype)
    pairs = []
    for mode in (pydnn.PYDNN_ACTIVATION_RELU, pydnn.PYDNN_ACTIVATION_SIGMOID, pydnn.PYDNN_ACTIVATION_TANH,
                 pydnn.PYDNN_ACTIVATION_SWISH, pydnn.PYDNN_ACTIVATION_GELU_ERF, pydnn.PYDNN_ACTIVATION_GELU_TANH):
        a = pydnn.create_activation_descriptor()
        pydnn.set_activation_descriptor(a, mode, pydnn.PYDNN_NOT_PROPAGATE_NAN, 0.0)
        pairs += record(arch, lambda h: pydnn.activation_forward(h, a, 1.0, x, X, 0.0, x, Y))
        pairs += record(arch, lambda h: pydnn.activation_backward(h, a, 1.0, x, Y, x, DY, x, X, 0.0, x, DX))
    pairs += record(arch, lambda h: pydnn.add_tensor(h, 1.0, bias, B, 1.0, x, Y))
    for op in (pydnn.PYDNN_OP_TENSOR_ADD, pydnn.PYDNN_OP_TENSOR_MUL):
        od = pydnn.create_op_tensor_descriptor()
        pydnn.set_op_tensor_descriptor(od, op, pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_NOT_PROPAGATE_NAN)
        pairs += record(arch, lambda h: pydnn.op_tensor(h, od, 1.0, x, X, 1.0, x, DY, 0.0, x, Y))
    pairs += record(arch, lambda h: pydnn.set_tensor(h, x, Y, 0.0))          # zeroing a gradient
    pairs += record(arch, lambda h: pydnn.scale_tensor(h, x, Y, 0.5))
    assert_installed(arch, pairs)


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("dtype", [BF16, F16, F32])
def test_transform_and_dropout_choices_are_installed(record, arch, dtype):
    """TransformTensor between float and the 16-bit types (autocast's casts) and between NCHW and NHWC (a
    layout change), dense, aligned; dropout forward / backward (its states set up once) on dense tensors."""
    X, Y, ST, RS = (i << 36 for i in range(1, 5))
    pairs = []
    for other in (F32, BF16, F16):
        for src_fmt, dst_fmt in ((pydnn.PYDNN_TENSOR_NCHW, pydnn.PYDNN_TENSOR_NCHW),
                                 (pydnn.PYDNN_TENSOR_NCHW, pydnn.PYDNN_TENSOR_NHWC),
                                 (pydnn.PYDNN_TENSOR_NHWC, pydnn.PYDNN_TENSOR_NCHW)):
            if other == dtype and src_fmt == dst_fmt:
                continue
            x = pydnn.create_tensor_descriptor()
            pydnn.set_tensor4d_descriptor(x, src_fmt, dtype, 32, 64, 56, 56)
            y = pydnn.create_tensor_descriptor()
            pydnn.set_tensor4d_descriptor(y, dst_fmt, other, 32, 64, 56, 56)
            pairs += record(arch, lambda h: pydnn.transform_tensor(h, 1.0, x, X, 0.0, y, Y))
    x = pydnn.create_tensor_descriptor()
    pydnn.set_tensor4d_descriptor(x, pydnn.PYDNN_TENSOR_NCHW, dtype, 64, 1024, 1, 1)
    d = pydnn.create_dropout_descriptor()

    def dropout(h):
        size = pydnn.dropout_get_states_size(h)
        pydnn.set_dropout_descriptor(d, h, 0.1, ST, size, 1234)
        rs = pydnn.dropout_get_reserve_space_size(x)
        pydnn.dropout_forward(h, d, x, X, x, Y, RS, rs)
        pydnn.dropout_backward(h, d, x, Y, x, X, RS, rs)
    pairs += record(arch, dropout)
    assert_installed(arch, pairs)


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("dtype", [BF16, F16, F32])
def test_reduce_choices_are_installed(record, arch, dtype):
    """ReduceTensor ADD / MAX / AMAX / AVG / NORM2 over the last dim (rows), the first dim (a bias gradient's
    columns) and NCHW's N, H, W (per-channel sums)."""
    from test_fuzz_cpu import _desc

    A_, C_, W_ = (i << 36 for i in range(1, 4))
    shapes = [((4096, 1024), (4096, 1)), ((4096, 1024), (1, 1024)), ((4096, 1000), (1, 1000)),
              ((32, 64, 56, 56), (1, 64, 1, 1)), ((32, 64, 56, 56), (32, 64, 1, 1))]
    pairs = []
    for op in (pydnn.PYDNN_REDUCE_TENSOR_ADD, pydnn.PYDNN_REDUCE_TENSOR_MAX, pydnn.PYDNN_REDUCE_TENSOR_AMAX,
               pydnn.PYDNN_REDUCE_TENSOR_AVG, pydnn.PYDNN_REDUCE_TENSOR_NORM2):
        r = pydnn.create_reduce_tensor_descriptor()
        pydnn.set_reduce_tensor_descriptor(r, op, pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_NOT_PROPAGATE_NAN,
                                           pydnn.PYDNN_REDUCE_TENSOR_NO_INDICES, pydnn.PYDNN_32BIT_INDICES)
        for a_dims, c_dims in shapes:
            a, c = _desc(a_dims, dtype), _desc(c_dims, dtype)

            def call(h):
                ws = pydnn.get_reduction_workspace_size(h, r, a, c)
                pydnn.reduce_tensor(h, r, None, 0, W_ if ws else None, ws, 1.0, a, A_, 0.0, c, C_)
            pairs += record(arch, call)
    assert_installed(arch, pairs)


# ----------------------------------------------------------------------------- what an arch can never run

def test_sm80_install_has_no_hopper_only_kernels():
    """The sm_80 install (Ampere and Ada devices load it) compiles no wgmma / TMA / warp-specialized kernel (their
    units exist for sm_90a only) and no thread-block-cluster kernel (the planners take them from sm_90 on)."""
    import re

    hopper = re.compile(r"wgmma|::fwd_ws|gemm_tma|attn_wg|_cluster<|_cl<|bwd_ring_cl<|gn_reg_cl<|::gn_(fwd|bwd)<"
                        r"|row_split_fwd<")
    bad = [(u.name, e) for u in manifest.install_units("sm_80") if manifest.unit_arch(u, "sm_80")
           for e in u.exprs if hopper.search(e)]
    assert not bad, bad
    assert any(hopper.search(e) for u in manifest.install_units("sm_90") for e in u.exprs)   # (the pattern bites)
