"""Group / instance norm split kernels (gs_*, ptx/normalization_gs.cu) on the GPU against the float64
reference: gsp_fwd (contiguous sets: NCHW, NHWC with one group), gsc_fwd (NHWC slabs; 16-byte, 2-element
and 1-element channel vectors) and gsf_fwd (float NHWC whose C takes no 4-element vectors: super-rows of
lcm(C, 4) elements; (2, 7, 20, 20) and (2, 42, 60, 61) in float), one block per unit and clusters of 8, odd planes (unaligned set starts), big
planes walked many times, x of mean 1000 (the shifted one-pass statistics), no bias + alpha / beta blending,
in place; the backward's four launches (plane chunks and NHWC row chunks, several chunks per plane / sample),
blended dx / dscale / dbias, no dbias. Outputs are poisoned first (DevTensor)."""
import pytest

import pydnn
from pydnn import tuning
from pydnn.ops import normalization as N
from devtensor import assert_close
from test_normalization_gpu import _backward_check, _forward_check, _nd, _tensor

pytestmark = pytest.mark.gpu

F32, F16, BF16 = pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DATA_HALF, pydnn.PYDNN_DATA_BFLOAT16
GROUP, INSTANCE = pydnn.PYDNN_NORM_KIND_GROUP, pydnn.PYDNN_NORM_KIND_INSTANCE
DTYPES = [F32, F16, BF16]

GS_CASES = [  # kind, groups, dims, layout
    (GROUP, 1, (3, 103, 19, 21), "nchw"),      # odd planes: every set starts unaligned; 3 sets (clusters)
    (GROUP, 2, (4, 18, 53, 53), "nchw"),       # cg 9 planes of 2809
    (INSTANCE, 0, (5, 27, 31, 33), "nchw"),    # 135 sets of 1023 elements
    (GROUP, 1, (1, 3, 300, 301), "nchw"),      # one set of 270900 elements; backward: 45 chunks per plane
    (GROUP, 1, (2, 15, 37, 41), "nhwc"),       # NHWC, one group: gsp_fwd with channel = i % C
    (GROUP, 2, (3, 178, 9, 11), "nhwc"),       # gsc: C 178 (2-element vectors), cg 89
    (INSTANCE, 0, (4, 42, 13, 17), "nhwc"),    # gsc: 2-element vectors (fp32 and 16-bit)
    (INSTANCE, 0, (2, 7, 20, 20), "nhwc"),     # gsc: 1-element vectors
    (GROUP, 8, (2, 64, 24, 24), "nhwc"),       # gsc: 4-element vectors (gsc_bpart: 16-byte), cg 8
    (GROUP, 4, (1, 2048, 5, 5), "nhwc"),       # gsc: a 512-channel slab per unit
    (INSTANCE, 0, (2, 42, 60, 61), "nhwc"),    # backward: several row chunks per sample
]


def _gs_on(monkeypatch, cl1):
    monkeypatch.setattr(tuning.norm, "GS", True)
    monkeypatch.setattr(tuning.norm, "GS_MIN_BYTES", 1)
    monkeypatch.setattr(tuning.norm, "GS_FWD_F32", True)
    for name in ("GN_FWD", "GN_BWD", "GN_REG"):  # (they would take some NHWC shapes first)
        monkeypatch.setattr(tuning.norm, name, False)
    if cl1:
        monkeypatch.setattr(N, "GS_CLUSTER_UNITS_PER_SM", 0)


FWD_DTYPES = DTYPES  # (float too: its mean from the unshifted sum of x, see gs_stats in ptx/normalization_gs.cu)


def test_gs_fwd_f32_default_is_the_split_kernels(handle, monkeypatch):
    """tuning.norm.GS_FWD_F32 (on): float forwards take gsp_fwd / gsc_fwd by default wherever a set holds
    GS_MIN_BYTES (smaller sets keep the tile kernels; NHWC shapes the gn_* kernels take keep them: the
    H200 mid-session run of 2026-11-28 had (4, 42, 13, 17) / (2, 7, 20, 20) NHWC instance sets of 884 / 1600
    bytes on fwd, as designed); off: none does."""
    assert tuning.norm.GS_FWD_F32
    gs = 0
    for kind, groups, dims, layout in GS_CASES:
        x = _tensor(dims, layout, F32)
        desc = N.plan_summary(handle, _nd(kind, groups, 1), x.desc)[0][0][0]
        G = dims[1] if kind == INSTANCE else groups
        big = dims[1] // G * dims[2] * dims[3] * 4 >= tuning.norm.GS_MIN_BYTES
        if big and not desc.startswith("gn_"):
            assert desc.startswith(("gsp_fwd", "gsc_fwd", "gsf_fwd")), desc
            gs += 1
    assert gs >= 8
    monkeypatch.setattr(tuning.norm, "GS_FWD_F32", False)
    for kind, groups, dims, layout in GS_CASES:
        x = _tensor(dims, layout, F32)
        assert not N.plan_summary(handle, _nd(kind, groups, 1), x.desc)[0][0][0].startswith(("gsp_fwd", "gsc_fwd", "gsf_fwd"))


def _far_shift_sets(rng, kind, groups, dims):
    """x (logical NCHW order) whose every set has mean exactly 0 in pairs (v, -v), its first element (the
    kernels' shift K) 2.9, and 2% of its elements within 2e-3 of the mean: the data where a mean taken as
    K + sum(x - K) / n in float rounds to an error ~ eps * |K| that y = (x - mean) a misses the fp32 tolerance
    by (the H200 failure of 2026-11-28)."""
    import numpy as np
    n, c = dims[0], dims[1]
    G = c if kind == INSTANCE else groups
    L = (c // G) * int(np.prod(dims[2:]))
    out = np.empty((n * G, L))
    for s in range(n * G):
        half = L // 2
        v = rng.uniform(-3, 3, half)
        near = rng.random(half) < 0.02
        v[near] = rng.uniform(-2e-3, 2e-3, near.sum())
        v[0] = 2.9
        v = v.astype(np.float32).astype(np.float64)
        row = np.concatenate([v, -rng.permutation(v)] + ([np.zeros(1)] if L % 2 else []))
        row[1:] = rng.permutation(row[1:])  # (the 2.9 stays first)
        out[s] = row
    return out.reshape(dims)


@pytest.mark.parametrize("cl1", [False, True], ids=["fill", "block"])
def test_gs_fwd_f32_far_shift(handle, rng, monkeypatch, cl1):
    """Float forward where the set's first element is far from its (zero) mean and many x lie near it, no bias:
    y ~ 1e-3 there, so an error of eps * |K| in the mean shows; the case that failed, NHWC slabs and
    instance sets too (gsp_fwd, gsc_fwd, clusters and single blocks)."""
    import numpy as np
    from devtensor import DevTensor
    from pydnn.reference import normalization as ref
    _gs_on(monkeypatch, cl1)
    cases = [(GROUP, 1, (3, 103, 19, 21), "nchw"), (GROUP, 2, (4, 18, 53, 53), "nchw"),
             (INSTANCE, 0, (2, 42, 60, 61), "nhwc"), (GROUP, 8, (2, 64, 24, 24), "nhwc"),
             (GROUP, 1, (2, 15, 37, 41), "nhwc")]
    for kind, groups, dims, layout in cases:
        nd = _nd(kind, groups, 1)
        x, y = _tensor(dims, layout, F32), _tensor(dims, layout, F32)
        desc = N.plan_summary(handle, nd, x.desc)[0][0][0]
        assert desc.startswith(("gsp_fwd", "gsc_fwd", "gsf_fwd")), desc
        xv = x.upload(_far_shift_sets(rng, kind, groups, dims))
        sbd, std = pydnn.create_tensor_descriptor(), pydnn.create_tensor_descriptor()
        pydnn.derive_norm_param_descriptors(sbd, std, x.desc, nd)
        scale = DevTensor(sbd.dims, F32)
        sv = scale.upload(np.full(sbd.dims, 1.5))
        mean, inv = DevTensor(std.dims, F32), DevTensor(std.dims, F32)
        for alpha in (1.0, 0.75):
            y.poison()
            pydnn.norm_forward_training(handle, nd, alpha, 0.0, x.desc, x.ptr, y.desc, y.ptr, sbd, scale.ptr, 0, std,
                                        mean.ptr, inv.ptr)
            want, wm, wi = ref.forward(kind, groups, 1, 1e-5, None, alpha, xv, 0.0, None, sv, None)
            what = f"far shift {kind} {dims} {layout} alpha={alpha} {desc}"
            assert_close(y.download(), want, F32, "y " + what,
                         scale=abs(alpha) * ref.forward_terms(kind, groups, 1, 1e-5, None, xv, sv, None))
            y.check_untouched()
            assert_close(inv.download().ravel(), wi, F32, "invstd " + what)
            xs = np.abs(xv).reshape(len(wm), -1).mean(axis=1)  # sets are consecutive in logical order
            assert_close(mean.download().ravel(), wm, F32, "mean " + what, scale=xs)


@pytest.mark.parametrize("dtype", FWD_DTYPES)
@pytest.mark.parametrize("cl1", [False, True], ids=["fill", "block"])
def test_gs_forward(handle, rng, monkeypatch, cl1, dtype):
    _gs_on(monkeypatch, cl1)
    for kind, groups, dims, layout in GS_CASES:
        x = _tensor(dims, layout, dtype)
        desc = N.plan_summary(handle, _nd(kind, groups, 1), x.desc)[0][0][0]
        assert desc.startswith(("gsp_fwd", "gsc_fwd", "gsf_fwd")), desc
        if cl1:
            assert " cl=1 " in desc, desc
        _forward_check(handle, rng, kind, groups, 1, dims, layout, dtype)
        _forward_check(handle, rng, kind, groups, 1, dims, layout, dtype, bias=False, alpha=0.75, beta=-0.5)
        _forward_check(handle, rng, kind, groups, 1, dims, layout, dtype, inplace=True)
        _forward_check(handle, rng, kind, groups, 1, dims, layout, dtype, center=(1000.0, 1.0))


@pytest.mark.parametrize("dtype", DTYPES)
def test_gs_backward(handle, rng, monkeypatch, dtype):
    _gs_on(monkeypatch, False)
    for kind, groups, dims, layout in GS_CASES:
        x = _tensor(dims, layout, dtype)
        alts, ws = N.plan_summary(handle, _nd(kind, groups, 1), x.desc, backward=True)
        assert alts[0][0].startswith(("gsp_bpart", "gsc_bpart")) and alts[0][1:3] == ["gs_bred", "gs_bset"], alts
        assert ws > 0
        _backward_check(handle, rng, kind, groups, 1, dims, layout, dtype)
        _backward_check(handle, rng, kind, groups, 1, dims, layout, dtype, alphas=(0.5, -1.5, 2.0, 0.25), bias=False,
                        dbias=False)


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_gs_default_thresholds(handle, rng, dtype):
    """The default switches: sets of GS_MIN_BYTES or more take the split kernels (the sweep's failing shapes,
    scaled down), small sets the register-tile kernels; both directions exact."""
    cases = [(GROUP, 1, (2, 31, 45, 47), "nchw"), (INSTANCE, 0, (3, 21, 36, 36), "nhwc"),
             (INSTANCE, 0, (9, 10, 4, 4), "nchw")]
    for kind, groups, dims, layout in cases:
        x = _tensor(dims, layout, dtype)
        fwd = N.plan_summary(handle, _nd(kind, groups, 1), x.desc)[0][0][0]
        bwd = N.plan_summary(handle, _nd(kind, groups, 1), x.desc, backward=True)[0][0][0]
        big = dims[1] // (dims[1] if kind == INSTANCE else groups) * dims[2] * dims[3] * (4 if dtype == F32 else 2) \
            >= tuning.norm.GS_MIN_BYTES
        fwd_gs = big and (dtype != F32 or tuning.norm.GS_FWD_F32)  # (float forwards: GS_FWD_F32)
        assert fwd.startswith("gs") == fwd_gs and bwd.startswith("gs") == big, (fwd, bwd)
        _forward_check(handle, rng, kind, groups, 1, dims, layout, dtype)
        _backward_check(handle, rng, kind, groups, 1, dims, layout, dtype)


def test_gs_deterministic(handle, rng, monkeypatch):
    """Two backward calls give the same bits (dx, dscale, dbias: every sum in a fixed order)."""
    import numpy as np
    from devtensor import DevTensor
    from pydnn.reference import normalization as ref
    _gs_on(monkeypatch, False)
    kind, groups, dims, layout = INSTANCE, 0, (2, 42, 60, 61), "nhwc"
    nd = _nd(kind, groups, 1)
    x, dy, dx = (_tensor(dims, layout, BF16) for _ in range(3))
    xv = x.random(rng, -3, 3)
    dy.random(rng, -1, 1)
    sbd, std = pydnn.create_tensor_descriptor(), pydnn.create_tensor_descriptor()
    pydnn.derive_norm_param_descriptors(sbd, std, x.desc, nd)
    scale, bias, ds, db = (DevTensor(sbd.dims, F32) for _ in range(4))
    scale.random(rng, 0.5, 1.5)
    bias.random(rng, -1, 1)
    mean, inv = DevTensor(std.dims, F32), DevTensor(std.dims, F32)
    mv, iv = ref.statistics(kind, groups, 1, 1e-5, xv)
    mean.upload(mv.reshape(mean.dims))
    inv.upload(iv.reshape(inv.dims))
    wsize = pydnn.get_norm_backward_workspace_size(handle, nd, x.desc, dy.desc, dx.desc, sbd, std)
    ws = pydnn.DeviceArray((max(1, wsize // 4),), np.float32)
    got = []
    for _ in range(2):
        pydnn.norm_backward(handle, nd, 1.0, 0.0, 1.0, 0.0, x.desc, x.ptr, dy.desc, dy.ptr, dx.desc, dx.ptr, sbd,
                            scale.ptr, bias.ptr, ds.ptr, db.ptr, std, mean.ptr, inv.ptr, ws.ptr, wsize)
        got.append((dx.download().copy(), ds.download().copy(), db.download().copy()))
    for a, b in zip(*got):
        assert np.array_equal(a, b, equal_nan=True)


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_gs_unaligned_pointers(handle, rng, dtype):
    """x / y one element past a 16-byte boundary: a split-kernel plan runs its other alternative (the
    register-tile or gen kernels, loaded on first use); then aligned again: the split kernel."""
    import numpy as np
    from devtensor import DevTensor
    from pydnn.reference import normalization as ref
    dims = (2, 31, 45, 47)
    nd = _nd(GROUP, 1, 1)
    total = int(np.prod(dims))
    item = 4 if dtype == F32 else 2
    xs, ys = DevTensor((total + 1,), dtype), DevTensor((total + 1,), dtype)
    flat = xs.random(rng, -3, 3)
    view = pydnn.create_tensor_descriptor()
    pydnn.set_tensor_nd_descriptor(view, dtype, 4, dims, (31 * 45 * 47, 45 * 47, 47, 1))
    # (a float forward takes the split kernel only with tuning.norm.GS_FWD_F32)
    assert N.plan_summary(handle, nd, view)[0][0][0].startswith("gsp_fwd") == (dtype != F32 or tuning.norm.GS_FWD_F32)
    sbd, std = pydnn.create_tensor_descriptor(), pydnn.create_tensor_descriptor()
    pydnn.derive_norm_param_descriptors(sbd, std, view, nd)
    scale, bias = DevTensor(sbd.dims, F32), DevTensor(sbd.dims, F32)
    sv, bv = scale.random(rng, 0.5, 1.5), bias.random(rng, -1, 1)
    mean, inv = DevTensor(std.dims, F32), DevTensor(std.dims, F32)
    for off in (1, 0):
        ys.poison()
        xv = flat[off:off + total].reshape(dims)
        pydnn.norm_forward_training(handle, nd, 1.0, 0.0, view, xs.ptr + off * item, view, ys.ptr + off * item, sbd,
                                    scale.ptr, bias.ptr, std, mean.ptr, inv.ptr)
        want = ref.forward(GROUP, 1, 1, 1e-5, None, 1.0, xv, 0.0, None, sv, bv)[0]
        got = ys.download()
        assert_close(got[off:off + total].reshape(dims), want, dtype, f"gs unaligned y off={off}",
                     scale=ref.forward_terms(GROUP, 1, 1, 1e-5, None, xv, sv, bv))


@pytest.mark.parametrize("cl1", [False, True], ids=["fill", "block"])
def test_gsf_forward(handle, rng, monkeypatch, cl1):
    """gsf_fwd on odd and 2-mod-4 channel counts (instance and group), blending, in place, a large mean; and
    GS_FLAT off giving gsc_fwd on the same shapes."""
    _gs_on(monkeypatch, cl1)
    cases = [(INSTANCE, 0, (2, 7, 20, 20)), (INSTANCE, 0, (3, 495, 8, 8)), (GROUP, 3, (2, 33, 10, 10)),
             (INSTANCE, 0, (2, 42, 60, 61)), (GROUP, 5, (4, 25, 12, 12))]
    for kind, groups, dims in cases:
        x = _tensor(dims, "nhwc", F32)
        desc = N.plan_summary(handle, _nd(kind, groups, 1), x.desc)[0][0][0]
        assert desc.startswith("gsf_fwd"), desc
        _forward_check(handle, rng, kind, groups, 1, dims, "nhwc", F32)
        _forward_check(handle, rng, kind, groups, 1, dims, "nhwc", F32, bias=False, alpha=0.75, beta=-0.5)
        _forward_check(handle, rng, kind, groups, 1, dims, "nhwc", F32, inplace=True)
        _forward_check(handle, rng, kind, groups, 1, dims, "nhwc", F32, center=(1000.0, 1.0))
    monkeypatch.setattr(tuning.norm, "GS_FLAT", False)
    x = _tensor((2, 7, 20, 20), "nhwc", F32)
    assert N.plan_summary(handle, _nd(INSTANCE, 0, 1), x.desc)[0][0][0].startswith("gsc_fwd")
    _forward_check(handle, rng, INSTANCE, 0, 1, (2, 7, 20, 20), "nhwc", F32)
