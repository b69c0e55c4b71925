"""Layer / group / instance / RMS normalization on the GPU against the float64 reference: every kind x
dtype over layouts that reach every kernel (fwd / bwd vector and scalar, the 8-block cluster kernels,
gen; the PREG, PLANE and atomic parameter-partial modes), fused activations, alpha / beta blending of y,
dx and the parameter gradients, no bias, in place, unaligned pointers. Outputs are poisoned first."""
import numpy as np
import pytest

import pydnn
from pydnn import tuning
from devtensor import DevTensor, assert_close
from pydnn.ops import normalization as N
from pydnn.reference import normalization as ref
from pydnn.tensor import packed_strides

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _no_rows_fit(monkeypatch):
    """These tests state the 4-item plans (tuning.norm.ROWS_FIT's 5-item ones: test_normalization_fit_*.py)."""
    monkeypatch.setattr(tuning.norm, "ROWS_FIT", False)


F32, F16, BF16 = pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DATA_HALF, pydnn.PYDNN_DATA_BFLOAT16
LAYER, GROUP, INSTANCE, RMS = (pydnn.PYDNN_NORM_KIND_LAYER, pydnn.PYDNN_NORM_KIND_GROUP,
                               pydnn.PYDNN_NORM_KIND_INSTANCE, pydnn.PYDNN_NORM_KIND_RMS)
NHWC = pydnn.PYDNN_TENSOR_NHWC
DTYPES = [F32, F16, BF16]

CASES = [  # kind, groups, normalized dims, dims, layout of x/y/dy/dx ("nchw", "nhwc" or strides)
    (LAYER, 0, 1, (64, 4096), "nchw"),                # the benchmark's rows: vector, PREG
    (LAYER, 0, 1, (7, 37), "nchw"),                   # odd rows: scalar
    (LAYER, 0, 1, (5, 40), (48, 1)),                  # padded rows
    (LAYER, 0, 2, (3, 5, 16), (96, 18, 1)),           # padded trailing dims: two levels
    (LAYER, 0, 2, (3, 5, 8), (40, 1, 5)),             # transposed trailing dims: gen
    (RMS, 0, 1, (33, 1000), "nchw"),
    (RMS, 0, 3, (2, 3, 4, 8), "nhwc"),
    (LAYER, 0, 1, (3, 40000), "nchw"),                # forward: cluster (16-bit) / 1024 threads; backward: gen
    (GROUP, 4, 1, (3, 8, 5, 4), "nchw"),
    (GROUP, 4, 1, (3, 16, 6, 5), "nhwc"),             # NHWC groups: PLANE
    (GROUP, 32, 1, (2, 512, 12, 12), "nhwc"),
    (GROUP, 2, 1, (2, 64, 32, 32), "nhwc"),           # clusters (backward everywhere, forward in fp32)
    (GROUP, 2, 1, (2, 64, 32, 32), "nchw"),
    (LAYER, 0, 1, (9, 8192), "nchw"),                 # backward: staged cluster with PREG
    (GROUP, 4, 1, (1, 256, 64, 64), "nhwc"),          # forward: cluster of 1024-thread blocks; backward: gen
    (GROUP, 2, 1, (2, 4, 3, 5), (1, 2, 40, 8)),       # N innermost: gen
    (GROUP, 1, 1, (2, 8, 3, 3, 2), "nchw"),           # 5-d
    (INSTANCE, 0, 1, (2, 6, 5, 7), "nchw"),
    (INSTANCE, 0, 1, (2, 6, 5, 7), "nhwc"),
    (INSTANCE, 0, 1, (3, 5), "nchw"),                 # no spatial dims: sets of one element
]

ACTS = [None, (pydnn.PYDNN_ACTIVATION_RELU, 0.0, 1.0), (pydnn.PYDNN_ACTIVATION_SWISH, 0.0, 1.25),
        (pydnn.PYDNN_ACTIVATION_GELU_ERF, 0.0, 1.0), (pydnn.PYDNN_ACTIVATION_GELU_TANH, 0.0, 1.0)]


def _tensor(dims, layout, dtype):
    if layout == "nchw":
        return DevTensor(dims, dtype)
    if layout == "nhwc":
        return DevTensor(dims, dtype, packed_strides(dims, NHWC))
    return DevTensor(dims, dtype, layout)


def _nd(kind, groups, k, eps=1e-5, act=None):
    a = None
    if act is not None:
        a = pydnn.create_activation_descriptor()
        pydnn.set_activation_descriptor(a, act[0], pydnn.PYDNN_NOT_PROPAGATE_NAN, act[1])
        pydnn.set_activation_descriptor_swish_beta(a, act[2])
    d = pydnn.create_norm_descriptor()
    pydnn.set_norm_descriptor(d, kind, groups, k, eps, a)
    return d


def _param_tensors(x, nd, rng, bias=True):
    sbd, std = pydnn.create_tensor_descriptor(), pydnn.create_tensor_descriptor()
    pydnn.derive_norm_param_descriptors(sbd, std, x.desc, nd)
    scale, b = DevTensor(sbd.dims, F32), DevTensor(sbd.dims, F32)
    sv = scale.random(rng, 0.5, 1.5)
    bv = b.random(rng, -1.0, 1.0) if bias else None
    mean, inv = DevTensor(std.dims, F32), DevTensor(std.dims, F32)
    return sbd, std, scale, b, sv, bv, mean, inv


def _forward_check(handle, rng, kind, groups, k, dims, layout, dtype, act=None, bias=True, alpha=1.0, beta=0.0,
                   inplace=False, center=None):
    """center: (mean, std) of normal x instead of uniform in [-3, 3] (rows of a large mean: the one-pass
    statistics' shift)."""
    nd = _nd(kind, groups, k, act=act)
    x = _tensor(dims, layout, dtype)
    y = x if inplace else _tensor(dims, layout, dtype)
    if center is None:
        xv = x.random(rng, -3, 3)
    else:
        xv = x.upload(rng.normal(center[0], center[1], dims).astype(np.float32).astype(np.float64))
    sbd, std, scale, b, sv, bv, mean, inv = _param_tensors(x, nd, rng, bias)
    y0 = y.random(rng) if beta != 0 and not inplace else None
    what = f"{kind} {dims} {layout} {dtype} act={act} bias={bias} center={center}"
    pydnn.norm_forward_training(handle, nd, alpha, beta, x.desc, x.ptr, y.desc, y.ptr, sbd, scale.ptr,
                                b.ptr if bias else 0, std, mean.ptr, inv.ptr)
    want, wm, wi = ref.forward(kind, groups, k, 1e-5, act, alpha, xv, beta, y0, sv, bv)
    terms = abs(alpha) * ref.forward_terms(kind, groups, k, 1e-5, act, xv, sv, bv)
    if y0 is not None:
        terms = terms + np.abs(beta * y0)
    assert_close(y.download(), want, dtype, "y " + what, scale=terms)
    y.check_untouched()
    got_inv = inv.download().ravel()
    assert_close(got_inv, wi, F32, "invstd " + what)
    if kind != RMS:
        xs = np.abs(xv).reshape(len(wm), -1).mean(axis=1)  # sets are consecutive in logical order
        assert_close(mean.download().ravel(), wm, F32, "mean " + what, scale=xs)
    else:
        assert np.isnan(mean.download()).all(), "RMS wrote a mean"
    # inference: the same y, nothing else written
    if not inplace:
        y.poison()
        mean.poison()
        pydnn.norm_forward_inference(handle, nd, alpha, 0.0, x.desc, x.ptr, y.desc, y.ptr, sbd, scale.ptr,
                                     b.ptr if bias else 0)
        want0 = ref.forward(kind, groups, k, 1e-5, act, alpha, xv, 0.0, None, sv, bv)[0]
        assert_close(y.download(), want0, dtype, "inference y " + what,
                     scale=abs(alpha) * ref.forward_terms(kind, groups, k, 1e-5, act, xv, sv, bv))
        assert np.isnan(mean.download()).all()
    return xv, wm, wi


def _backward_check(handle, rng, kind, groups, k, dims, layout, dtype, act=None, bias=True, alphas=(1.0, 0.0, 1.0, 0.0),
                    dbias=True):
    nd = _nd(kind, groups, k, act=act)
    x, dy, dx = (_tensor(dims, layout, dtype) for _ in range(3))
    xv = x.random(rng, -3, 3)
    dyv = dy.random(rng, -1, 1)
    sbd, std, scale, b, sv, bv, mean, inv = _param_tensors(x, nd, rng, bias)
    mv, iv = ref.statistics(kind, groups, k, 1e-5, xv)
    mean.upload(mv.reshape(mean.dims))
    inv.upload(iv.reshape(inv.dims))
    mv, iv = mean.values.ravel(), inv.values.ravel()  # what the GPU reads (float32)
    ds, db = DevTensor(sbd.dims, F32), DevTensor(sbd.dims, F32)
    ad, bd, ap, bp = alphas
    dx0 = dx.random(rng) if bd != 0 else None
    ds0 = ds.random(rng) if bp != 0 else None
    db0 = db.random(rng) if bp != 0 and dbias else None
    wsize = pydnn.get_norm_backward_workspace_size(handle, nd, x.desc, dy.desc, dx.desc, sbd, std)
    ws = pydnn.DeviceArray((max(1, wsize // 4),), np.float32)
    ws.fill_bytes(0xFF)
    pydnn.norm_backward(handle, nd, ad, bd, ap, bp, x.desc, x.ptr, dy.desc, dy.ptr, dx.desc, dx.ptr, sbd, scale.ptr,
                        b.ptr if bias else 0, ds.ptr, db.ptr if dbias else 0, std,
                        mean.ptr if kind != RMS else 0, inv.ptr, ws.ptr if wsize else 0, wsize)
    wdx, wds, wdb = ref.backward(kind, groups, k, 1e-5, act, xv, dyv, sv, bv, mv, iv)
    tdx, tds, tdb = ref.backward_terms(kind, groups, k, 1e-5, act, xv, dyv, sv, bv, mv, iv)
    what = f"{kind} {dims} {layout} {dtype} act={act} bias={bias} alphas={alphas}"
    want = ad * wdx + (bd * dx0 if dx0 is not None else 0)
    assert_close(dx.download(), want, dtype, "dx " + what,
                 scale=abs(ad) * tdx + (np.abs(bd * dx0) if dx0 is not None else 0))
    dx.check_untouched()
    want = ap * wds + (bp * ds0 if ds0 is not None else 0)
    assert_close(ds.download(), want, F32, "dscale " + what,
                 scale=abs(ap) * tds + (np.abs(bp * ds0) if ds0 is not None else 0))
    if dbias:
        want = ap * wdb + (bp * db0 if db0 is not None else 0)
        assert_close(db.download(), want, F32, "dbias " + what,
                     scale=abs(ap) * tdb + (np.abs(bp * db0) if db0 is not None else 0))
    else:
        assert np.isnan(db.download()).all(), "dbias written though NULL"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_forward(handle, rng, case, dtype):
    kind, groups, k, dims, layout = CASES[case]
    _forward_check(handle, rng, kind, groups, k, dims, layout, dtype)
    _forward_check(handle, rng, kind, groups, k, dims, layout, dtype, bias=False, alpha=0.75, beta=-0.5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_backward(handle, rng, case, dtype):
    kind, groups, k, dims, layout = CASES[case]
    _backward_check(handle, rng, kind, groups, k, dims, layout, dtype)
    _backward_check(handle, rng, kind, groups, k, dims, layout, dtype, alphas=(0.5, -1.5, 2.0, 0.25), bias=False,
                    dbias=False)


@pytest.mark.parametrize("act", ACTS[1:], ids=["relu", "swish", "gelu_erf", "gelu_tanh"])
@pytest.mark.parametrize("case", [0, 9, 12, 15, 6])
def test_fused_activation(handle, rng, act, case):
    kind, groups, k, dims, layout = CASES[case]
    for dtype in (F32, BF16):
        _forward_check(handle, rng, kind, groups, k, dims, layout, dtype, act=act)
        _backward_check(handle, rng, kind, groups, k, dims, layout, dtype, act=act)


def test_in_place_forward(handle, rng):
    for case in (0, 9, 15):
        kind, groups, k, dims, layout = CASES[case]
        _forward_check(handle, rng, kind, groups, k, dims, layout, BF16, inplace=True)


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_unaligned_pointers(handle, rng, dtype):
    """A view starting one element in: the vector launches need 16-byte pointers, so the scalar (or gen)
    launch runs; results are unchanged."""
    rows, n = 6, 256
    nd = _nd(LAYER, 0, 1)
    item = 4 if dtype == F32 else 2
    xs, ys = DevTensor((rows, n + 1), dtype), DevTensor((rows, n + 1), dtype)
    xv = xs.random(rng)[:, 1:]
    view = pydnn.create_tensor_descriptor()
    pydnn.set_tensor_nd_descriptor(view, dtype, 2, (rows, n), (n + 1, 1))
    sbd, std = pydnn.create_tensor_descriptor(), pydnn.create_tensor_descriptor()
    pydnn.derive_norm_param_descriptors(sbd, std, view, nd)
    scale, mean, inv = DevTensor(sbd.dims, F32), DevTensor(std.dims, F32), DevTensor(std.dims, F32)
    sv = scale.random(rng, 0.5, 1.5)
    pydnn.norm_forward_training(handle, nd, 1.0, 0.0, view, xs.ptr + item, view, ys.ptr + item, sbd, scale.ptr, 0,
                                std, mean.ptr, inv.ptr)
    want = ref.forward(LAYER, 0, 1, 1e-5, None, 1.0, xv, 0.0, None, sv, None)[0]
    got = ys.download()
    assert_close(got[:, 1:], want, dtype, "unaligned y", scale=ref.forward_terms(LAYER, 0, 1, 1e-5, None, xv, sv, None))
    assert np.isnan(got[:, 0]).all()


def test_repeated_calls_use_the_cached_plan(handle, rng):
    """The second call with the same descriptors takes the cached launch record and new pointers."""
    kind, groups, k, dims, layout = CASES[9]
    for _ in range(2):
        _forward_check(handle, rng, kind, groups, k, dims, layout, BF16)
        _backward_check(handle, rng, kind, groups, k, dims, layout, BF16)


ROWS_CASES = [  # fwd_rows (v3): kind, normalized dims, dims, layout
    (LAYER, 1, (64, 4096), "nchw"),
    (LAYER, 1, (37, 48), (56, 1)),                    # padded rows, rows not a multiple of a block's
    (RMS, 1, (33, 1000), "nchw"),
    (RMS, 2, (3, 11, 4, 128), "nchw"),                # merged set dims
    (LAYER, 1, (9, 8192), "nchw"),                    # 1024-thread groups for some configs
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cfg", range(max(len(c) for c in N.ROWS_CONFIGS.values())))
def test_forward_rows_configs(handle, rng, monkeypatch, cfg, dtype):
    """Each compiled fwd_rows (ITEMS, R, ONE) config, not only the planner's pick (the benchmark compares
    them): with bias, without bias and blended, in place, rows of mean 1000 (std 1 and 16: ONE's shift)."""
    tag = {F32: "f32", F16: "f16", BF16: "bf16"}[dtype]
    configs = N.ROWS_CONFIGS[4 if dtype == F32 else 2]
    if cfg >= len(configs):
        pytest.skip("no such fwd_rows config for this element size")
    monkeypatch.setitem(N.ROWS_PICK, tag, configs[cfg])
    monkeypatch.setattr(tuning.norm, "FWD_PERSIST", False)  # (fwd_persist: test_forward_persist_configs)
    for kind, k, dims, layout in ROWS_CASES:
        x = _tensor(dims, layout, dtype)
        items, rows, one = configs[cfg]
        alts, _ = N.plan_summary(handle, _nd(kind, 0, k), x.desc)
        assert alts[0][0].startswith("fwd_rows") and f"items={items} rows={rows} one={one}" in alts[0][0], alts
        _forward_check(handle, rng, kind, 0, k, dims, layout, dtype)
        _forward_check(handle, rng, kind, 0, k, dims, layout, dtype, bias=False, alpha=0.75, beta=-0.5)
        _forward_check(handle, rng, kind, 0, k, dims, layout, dtype, inplace=True)
        # rows far from zero, some of whose 16-bit values are all equal (the two-pass mean is one division)
        for center in ((1000.0, 1.0), (1000.0, 16.0), (-50.0, 0.25)):
            _forward_check(handle, rng, kind, 0, k, dims, layout, dtype, center=center)


@pytest.mark.parametrize("dtype", [F16, BF16])
@pytest.mark.parametrize("cfg", range(max(len(c) for c in N.FWD_PERSIST_CONFIGS.values())))
@pytest.mark.parametrize("stream", [False, True])
def test_forward_persist_configs(handle, rng, monkeypatch, cfg, dtype, stream):
    """Each compiled fwd_persist (ITEMS, DEPTH, MINB) config (v7), with and without evict-first stores: with
    bias, without bias and blended, in place, rows walked several per group (the ring wraps, dead rows at
    the end), rows of mean 1000 (std 1 and 16: the shift), rows too long for its blocks (fwd_rows)."""
    tag = {F16: "f16", BF16: "bf16"}[dtype]
    configs = N.FWD_PERSIST_CONFIGS[2]
    if cfg >= len(configs):
        pytest.skip("no such fwd_persist config")
    monkeypatch.setitem(N.FWD_PERSIST_PICK, tag, configs[cfg])
    monkeypatch.setattr(tuning.norm, "FWD_PERSIST", True)
    monkeypatch.setattr(tuning.norm, "STREAM", {"fwd_persist"} if stream else set())
    items, depth, minb = configs[cfg]
    extra = [(LAYER, 1, (2001, 512), "nchw"), (RMS, 1, (1500, 1000), "nchw"), (LAYER, 1, (1200, 4096), "nchw")]
    for kind, k, dims, layout in ROWS_CASES + extra:
        x = _tensor(dims, layout, dtype)
        alts, _ = N.plan_summary(handle, _nd(kind, 0, k), x.desc)
        length = int(np.prod(dims[len(dims) - k:]))
        fits = max(N.MIN_BLOCK, N.next_pow2(-(-length // 8 // items))) <= 512 // items
        assert alts[0][0].startswith("fwd_persist") == fits, alts
        if fits:
            assert f"items={items} depth={depth} minb={minb}" in alts[0][0], alts
        _forward_check(handle, rng, kind, 0, k, dims, layout, dtype)
        _forward_check(handle, rng, kind, 0, k, dims, layout, dtype, bias=False, alpha=0.75, beta=-0.5)
        _forward_check(handle, rng, kind, 0, k, dims, layout, dtype, inplace=True)
        for center in ((1000.0, 1.0), (1000.0, 16.0), (-50.0, 0.25)):
            _forward_check(handle, rng, kind, 0, k, dims, layout, dtype, center=center)


@pytest.mark.parametrize("dtype", [F16, BF16])
@pytest.mark.parametrize("what", ["no stream", "bwd_ring", "no warpstat"] +
                         [f"finish {fx}x{fy}" for fx, fy in N.FINISH_SHAPES if (fx, fy) != tuning.norm.FINISH])
def test_stream_stores_and_finish_blocks(handle, rng, monkeypatch, what, dtype):
    """The v7 options the bench compares, each against the defaults: fwd_rows without evict-first stores,
    bwd_ring with them, finish's other block shapes, bwd_ring's per-thread statistics copies."""
    if what.startswith("finish"):
        monkeypatch.setattr(tuning.norm, "FINISH", tuple(int(a) for a in what.split()[1].split("x")))
    elif what == "no warpstat":
        monkeypatch.setattr(tuning.norm, "BWD_RING_WARPSTAT", False)
    else:
        monkeypatch.setattr(tuning.norm, "STREAM", set() if what == "no stream" else {"fwd_rows", what})
    monkeypatch.setattr(tuning.norm, "FWD_PERSIST", False)
    for kind, k, dims, layout in ROWS_CASES + [(LAYER, 1, (1200, 4096), "nchw")]:
        _forward_check(handle, rng, kind, 0, k, dims, layout, dtype, bias=False, alpha=0.75, beta=-0.5)
        _backward_check(handle, rng, kind, 0, k, dims, layout, dtype)
        _backward_check(handle, rng, kind, 0, k, dims, layout, dtype, alphas=(0.75, -0.5, 1.5, 0.25), bias=False,
                        dbias=False)


def test_c_program(tmp_path):
    from cprog import build_and_run

    r = build_and_run("normalization_gpu", tmp_path, extra=["-ldl", "-lm"])
    print(r.stdout, r.stderr)
    assert "FAIL" not in r.stdout and r.returncode == 0, r.stdout + r.stderr
    for what in ("layer norm forward", "layer norm backward", "group norm forward", "bad groups status"):
        assert f"ok {what}" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("dtype", [F16, BF16])
@pytest.mark.parametrize("cfg", range(max(len(c) for c in N.BWD_ROWS_CONFIGS.values())))
def test_backward_rows_configs(handle, rng, monkeypatch, cfg, dtype):
    """Each compiled bwd_rows (ITEMS, DEPTH) config, not only the planner's pick: plain, blended (dx and
    the parameter gradients), without dbias; rows that do not fit its blocks take the staged kernel."""
    tag = {F16: "f16", BF16: "bf16"}[dtype]
    configs = N.BWD_ROWS_CONFIGS[2]
    if cfg >= len(configs):
        pytest.skip("no such bwd_rows config")
    monkeypatch.setitem(N.BWD_ROWS_PICK, tag, configs[cfg])
    monkeypatch.setattr(tuning.norm, "BWD_ROWS", True)  # off by default until this test has passed
    monkeypatch.setattr(tuning.norm, "BWD_RING", False)  # (bwd_ring: test_backward_ring_configs)
    items, depth = configs[cfg]
    extra = [(LAYER, 1, (2001, 512), "nchw"), (RMS, 1, (1500, 1000), "nchw"), (LAYER, 1, (5, 40), (48, 1))]
    for kind, k, dims, layout in ROWS_CASES + extra:  # 2001, 1500 rows: each group walks several (the ring wraps)
        x = _tensor(dims, layout, dtype)
        alts, _ = N.plan_summary(handle, _nd(kind, 0, k), x.desc, backward=True)
        length = int(np.prod(dims[len(dims) - k:]))
        fits = max(N.MIN_BLOCK, N.next_pow2(-(-length // 8 // items))) <= 512 // items
        assert alts[0][0].startswith("bwd_rows") == fits, alts
        if fits:
            assert f"items={items} depth={depth}" in alts[0][0], alts
        _backward_check(handle, rng, kind, 0, k, dims, layout, dtype)
        _backward_check(handle, rng, kind, 0, k, dims, layout, dtype, alphas=(0.75, -0.5, 1.5, 0.25), bias=False,
                        dbias=False)


GN_CASES = [  # gn_fwd (v6, NHWC group norm in clusters): groups, dims, layout
    (32, (2, 512, 12, 12), "nhwc"),
    (8, (3, 256, 9, 7), "nhwc"),                      # positions not a multiple of 8
    (4, (2, 64, 3, 1), "nhwc"),                       # 3 positions: blocks 3..7 of each cluster empty
    (2, (5, 32, 1, 1), "nhwc"),                       # one position
    (1, (2, 16, 5, 5), "nhwc"),                       # one group
    (4, (2, 32, 5, 3), (600, 1, 120, 40)),            # padded positions (40 channels apart)
    (2, (2, 64, 32, 32), "nhwc"),                     # 8 KiB+ tiles, 256-thread blocks
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fill", [2, 0, "stream"], ids=["fill", "widest", "stream"])
def test_group_norm_nhwc_clusters(handle, rng, monkeypatch, fill, dtype):
    """gn_fwd / gn_bwd with the GC the planner picks (fill: the most clusters on these small shapes, GC 1)
    and with the widest GC whose tiles fit (up to 16 groups, 32 channel vectors per position): forward
    plain, no bias + blended, in place, fused activations, x of mean 1000 (the two-pass variance);
    backward plain, blended without bias / dbias, with swish. "stream": fill, gn_fwd's evict-first stores
    and finish with 8-row blocks (v7 options the bench compares)."""
    if fill == "stream":
        fill = 2
        monkeypatch.setattr(tuning.norm, "STREAM", {"gn_fwd"})
        monkeypatch.setattr(tuning.norm, "FINISH", (32, 8))
    monkeypatch.setattr(tuning.norm, "GN_FILL", fill)
    monkeypatch.setattr(tuning.norm, "GN_REG", False)  # (gn_reg, v11: test_group_norm_nhwc_reg)
    for groups, dims, layout in GN_CASES:
        x = _tensor(dims, layout, dtype)
        alts, _ = N.plan_summary(handle, _nd(GROUP, groups, 1), x.desc)
        assert alts[0][0].startswith("gn_fwd"), alts
        _forward_check(handle, rng, GROUP, groups, 1, dims, layout, dtype)
        _forward_check(handle, rng, GROUP, groups, 1, dims, layout, dtype, bias=False, alpha=0.75, beta=-0.5)
        _forward_check(handle, rng, GROUP, groups, 1, dims, layout, dtype, inplace=True)
        _forward_check(handle, rng, GROUP, groups, 1, dims, layout, dtype, center=(1000.0, 1.0))
        for act in ACTS[1:3]:
            _forward_check(handle, rng, GROUP, groups, 1, dims, layout, dtype, act=act)
        alts, _ = N.plan_summary(handle, _nd(GROUP, groups, 1), x.desc, backward=True)
        assert alts[0][0].startswith("gn_bwd"), alts
        _backward_check(handle, rng, GROUP, groups, 1, dims, layout, dtype)
        _backward_check(handle, rng, GROUP, groups, 1, dims, layout, dtype, alphas=(0.5, -1.5, 2.0, 0.25), bias=False,
                        dbias=False)
        _backward_check(handle, rng, GROUP, groups, 1, dims, layout, dtype, act=ACTS[2])


GN_REG_CASES = GN_CASES + [  # gn_reg (v11): the shapes above, and ones whose units need 1024-thread blocks or more
    (32, (3, 512, 32, 32), "nhwc"),                   # 1024 positions of 16 channels
    (8, (2, 64, 40, 40), "nhwc"),                     # 1600 positions of 8 channels
    (4, (2, 128, 64, 64), "nhwc"),                    # 4096 positions of 32 channels: 512-1024 threads
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cfg", [(8, 4, 8), (8, 2, 8), (4, 4, 8), (4, 2, 8), "no stream"])
def test_group_norm_nhwc_reg(handle, rng, monkeypatch, cfg, dtype):
    """gn_reg / gn_reg_cl (v11: x held in registers, SI more vectors per thread in its own shared-memory slots,
    one unit per block or cluster of CL) with each compiled (CL, SI) ("no stream": the default pick without
    evict-first stores): forward plain, no bias + blended, in place, x of mean 1000 (the one-pass shift
    in 16-bit, the two passes in fp32), fused activations; units too large for its blocks take gn_fwd
    (asserted from the plan)."""
    if cfg == "no stream":
        monkeypatch.setattr(tuning.norm, "STREAM", tuning.norm.STREAM - {"gn_reg"})
    else:
        monkeypatch.setattr(tuning.norm, "GN_REG_PICK", cfg)
    monkeypatch.setattr(tuning.norm, "GN_REG", True)
    cl, gc_want, si = tuning.norm.GN_REG_PICK
    vec = 4 if dtype == F32 else 8
    for groups, dims, layout in GN_REG_CASES:
        x = _tensor(dims, layout, dtype)
        alts, _ = N.plan_summary(handle, _nd(GROUP, groups, 1), x.desc)
        cg, P = dims[1] // groups, int(np.prod(dims[2:]))
        gc = max(g for g in range(1, min(groups, gc_want) + 1) if groups % g == 0 and 32 % (g * cg // vec) == 0)
        block = max(32, N.next_pow2(N.cdiv(N.cdiv(P, cl), N.GN_REG_ITEMS + si) * (gc * cg // vec)))
        if block <= N.GN_REG_MAX_BLOCK:
            assert alts[0][0].startswith("gn_reg") and f"GC={gc} CL={cl} block={block} items=8+{si}" in alts[0][0], alts
        else:
            assert alts[0][0].startswith("gn_fwd"), alts
        _forward_check(handle, rng, GROUP, groups, 1, dims, layout, dtype)
        _forward_check(handle, rng, GROUP, groups, 1, dims, layout, dtype, bias=False, alpha=0.75, beta=-0.5)
        _forward_check(handle, rng, GROUP, groups, 1, dims, layout, dtype, inplace=True)
        _forward_check(handle, rng, GROUP, groups, 1, dims, layout, dtype, center=(1000.0, 1.0))
        for act in ACTS[1:]:
            _forward_check(handle, rng, GROUP, groups, 1, dims, layout, dtype, act=act)


@pytest.mark.parametrize("dtype", [F16, BF16])
@pytest.mark.parametrize("cfg", range(max(len(c) for c in N.BWD_RING_CONFIGS.values())))
def test_backward_ring_configs(handle, rng, monkeypatch, cfg, dtype):
    """Each compiled bwd_ring (ITEMS, DEPTH, CL) config (CL > 1: bwd_ring_cl, partials summed per cluster): plain, blended (dx and the parameter gradients),
    without dbias; rows walked several per group (the ring wraps); rows too long for its blocks take the
    staged kernel."""
    tag = {F16: "f16", BF16: "bf16"}[dtype]
    configs = N.BWD_RING_CONFIGS[2]
    if cfg >= len(configs):
        pytest.skip("no such bwd_ring config")
    monkeypatch.setitem(N.BWD_RING_PICK, tag, configs[cfg])
    items, depth, cl = configs[cfg]
    extra = [(LAYER, 1, (2001, 512), "nchw"), (RMS, 1, (1500, 1000), "nchw"), (LAYER, 1, (5, 40), (48, 1)),
             (LAYER, 1, (1200, 4096), "nchw")]
    for kind, k, dims, layout in ROWS_CASES + extra:
        x = _tensor(dims, layout, dtype)
        alts, _ = N.plan_summary(handle, _nd(kind, 0, k), x.desc, backward=True)
        length = int(np.prod(dims[len(dims) - k:]))
        fits = max(N.MIN_BLOCK, N.next_pow2(-(-length // 8 // items))) <= N.BWD_RING_MAX_BLOCK
        assert alts[0][0].startswith("bwd_ring") == fits, alts
        if fits:
            assert f"items={items} depth={depth}" in alts[0][0], alts
            assert (f" cl={cl}" in alts[0][0]) == (cl > 1), alts
        _backward_check(handle, rng, kind, 0, k, dims, layout, dtype)
        _backward_check(handle, rng, kind, 0, k, dims, layout, dtype, alphas=(0.75, -0.5, 1.5, 0.25), bias=False,
                        dbias=False)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pf_bytes", [1, 64 * 1024])
def test_l2_prefetch(handle, rng, monkeypatch, pf_bytes, dtype):
    """fwd_rows and gn_reg with the L2 prefetch of a later block's x (v12, NormParams.pf) one block ahead (1 byte
    rounds up to one block) and a few ahead: outputs exact as without it (forward plain, no bias + blended, in
    place, x of mean 1000), the last blocks' targets past the grid skipped (rows / units not a multiple of
    anything), and the plan carrying the distance where the grid has blocks that far ahead."""
    monkeypatch.setattr(tuning.norm, "PF_BYTES", {"fwd_rows": pf_bytes, "gn_reg": pf_bytes})
    monkeypatch.setattr(tuning.norm, "FWD_PERSIST", False)
    monkeypatch.setattr(tuning.norm, "GN_REG", True)
    rows = [(kind, 0, k, dims, layout) for kind, k, dims, layout in ROWS_CASES] + [
        (RMS, 0, 1, (1200, 4096), "nchw"), (LAYER, 0, 1, (1201, 4096), "nchw"), (LAYER, 0, 1, (333, 1000), "nchw")]
    gns = [(GROUP, g, 1, dims, layout) for g, dims, layout in GN_REG_CASES]
    for kind, groups, k, dims, layout in rows + gns:
        x = _tensor(dims, layout, dtype)
        desc = N.plan_summary(handle, _nd(kind, groups, k), x.desc)[0][0][0]
        assert desc.startswith(("fwd_rows", "gn_reg", "gn_fwd")), desc
        if dims[0] >= 1200:
            assert " pf=" in desc, desc
        _forward_check(handle, rng, kind, groups, k, dims, layout, dtype)
        _forward_check(handle, rng, kind, groups, k, dims, layout, dtype, bias=False, alpha=0.75, beta=-0.5)
        _forward_check(handle, rng, kind, groups, k, dims, layout, dtype, inplace=True)
        _forward_check(handle, rng, kind, groups, k, dims, layout, dtype, center=(1000.0, 1.0))
