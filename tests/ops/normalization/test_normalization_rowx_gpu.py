"""Layer / RMS norm rows of any length (fwd_rowx, issue 20) on the GPU against the float64 reference: odd
lengths (rows starting at every offset from a 16-byte boundary), lengths that fwd_rows' blocks do not hold
(up to 65536), padded rows with a stride that is not a multiple of the vector (the padding must stay
poisoned: the edge vectors are stored element by element), several rows per block, blending, no bias,
in place, rows far from zero (the one-pass statistics' shift), and the plan each shape gets."""
import numpy as np
import pytest

import pydnn
from pydnn import tuning
from pydnn.ops import normalization as N
from test_normalization_gpu import _backward_check, _forward_check, _nd, _tensor

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _no_rows_fit(monkeypatch):
    """These tests state the 4-item plans (tuning.norm.ROWS_FIT's 5-item ones: test_normalization_fit_*.py)."""
    monkeypatch.setattr(tuning.norm, "ROWS_FIT", False)
    # (and bwd_rowx's plans: tuning.norm.XSPLIT_SLOTS moves few-rows-per-group shapes such as 417 x 2770 to the split
    # kernels, tested in test_normalization_xsplit_gpu.py)
    monkeypatch.setattr(tuning.norm, "XSPLIT_SLOTS", False)


F32, F16, BF16 = pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DATA_HALF, pydnn.PYDNN_DATA_BFLOAT16
LAYER, RMS = pydnn.PYDNN_NORM_KIND_LAYER, pydnn.PYDNN_NORM_KIND_RMS
DTYPES = [F32, F16, BF16]

ROWX_CASES = [  # kind, dims, layout; the planner's rowx ITEMS by element size (None: another kernel)
    (LAYER, (7, 37), "nchw", {4: 4, 2: 4}),            # odd and short: 4 rows per 128-thread block
    (RMS, (9, 1001), "nchw", {4: 4, 2: 4}),
    (LAYER, (5, 6830), "nchw", {4: 4, 2: 4}),          # 6830 = 8k + 6
    (RMS, (4, 4231), "nchw", {4: 4, 2: 4}),
    (LAYER, (6, 100), (103, 1), {4: 4, 2: 4}),         # padded rows, stride 103: every row offset
    (LAYER, (3, 27723), "nchw", {4: 8, 2: 4}),         # fp32: 8 vectors per thread
    (RMS, (2, 38005), "nchw", {4: 8, 2: 8}),           # 16-bit: 8 per thread; fp32: a cluster of 2 (sm_90)
    (LAYER, (3, 39856), "nchw", {4: None, 2: None}),   # whole vectors, fewer rows than SMs: the 8-block cluster
    (RMS, (1, 65536), "nchw", {4: None, 2: None}),     # the largest row, whole vectors, one row: the same
    (LAYER, (140, 39856), "nchw", {4: 8, 2: 8}),       # whole vectors beyond fwd_rows' blocks, many rows
    (LAYER, (2, 64254), "nchw", {4: 8, 2: 8}),          # fp32: a cluster of 2
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", range(len(ROWX_CASES)))
def test_rowx_forward(handle, rng, case, dtype):
    kind, dims, layout, items = ROWX_CASES[case]
    x = _tensor(dims, layout, dtype)
    alts, _ = N.plan_summary(handle, _nd(kind, 0, 1), x.desc)
    want_items = items[4 if dtype == F32 else 2]
    if want_items is None:
        assert not alts[0][0].startswith("fwd_rowx"), alts
    else:
        assert alts[0][0].startswith("fwd_rowx") and f"items={want_items}" in alts[0][0], alts
    _forward_check(handle, rng, kind, 0, 1, dims, layout, dtype)
    _forward_check(handle, rng, kind, 0, 1, dims, layout, dtype, bias=False, alpha=0.75, beta=-0.5)
    if dims[1] < 10000:
        _forward_check(handle, rng, kind, 0, 1, dims, layout, dtype, inplace=True)
        for center in ((1000.0, 1.0), (-50.0, 0.25)):
            _forward_check(handle, rng, kind, 0, 1, dims, layout, dtype, center=center)


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_rowx_off_and_unaligned_parameters(handle, rng, monkeypatch, dtype):
    """ROWX off: the previous kernels, same results; scale / bias not 16-byte aligned: the kernel's scalar
    parameter loads."""
    kind, dims, layout = LAYER, (5, 6830), "nchw"
    monkeypatch.setattr(tuning.norm, "ROWX", False)
    x = _tensor(dims, layout, dtype)
    assert not N.plan_summary(handle, _nd(kind, 0, 1), x.desc)[0][0][0].startswith("fwd_rowx")
    _forward_check(handle, rng, kind, 0, 1, dims, layout, dtype)
    monkeypatch.setattr(tuning.norm, "ROWX", True)
    # parameters one float past a 16-byte boundary
    nd = _nd(kind, 0, 1)
    xt, yt = _tensor(dims, layout, dtype), _tensor(dims, layout, dtype)
    xv = xt.random(rng)
    sbd, std = pydnn.create_tensor_descriptor(), pydnn.create_tensor_descriptor()
    pydnn.derive_norm_param_descriptors(sbd, std, xt.desc, nd)
    n = dims[1]
    sv = rng.uniform(0.5, 1.5, n).astype(np.float32)
    bv = rng.uniform(-1, 1, n).astype(np.float32)
    buf = pydnn.DeviceArray((2 * n + 8,), np.float32)
    host = np.full(2 * n + 8, np.nan, np.float32)
    host[1:1 + n], host[n + 5:2 * n + 5] = sv, bv
    buf.copy_from_numpy(host)
    pydnn.norm_forward_inference(handle, nd, 1.0, 0.0, xt.desc, xt.ptr, yt.desc, yt.ptr, sbd, buf.ptr + 4,
                                 buf.ptr + 4 * (n + 5))
    from devtensor import assert_close
    from pydnn.reference import normalization as ref
    want = ref.forward(kind, 0, 1, 1e-5, None, 1.0, xv, 0.0, None, sv.astype(np.float64).reshape(sbd.dims),
                       bv.astype(np.float64).reshape(sbd.dims))[0]
    assert_close(yt.download(), want, dtype, "unaligned parameters",
                 scale=ref.forward_terms(kind, 0, 1, 1e-5, None, xv, sv.astype(np.float64).reshape(sbd.dims),
                                         bv.astype(np.float64).reshape(sbd.dims)))


BWD_CASES = [  # kind, dims, layout, whether bwd_rowx serves it by element size
    (LAYER, (7, 37), "nchw", {4: True, 2: True}),
    (RMS, (9, 1001), "nchw", {4: True, 2: True}),
    (LAYER, (5, 6830), "nchw", {4: True, 2: True}),     # 16-bit: period 4; fp32: period 2
    (RMS, (4, 4231), "nchw", {4: True, 2: True}),
    (LAYER, (6, 100), (103, 1), {4: True, 2: True}),    # stride 103: period 4 / 8
    (LAYER, (3, 12345), "nchw", {4: True, 2: True}),    # fp32: beyond 512 x 4 vectors: clusters of 4 x 256
    (LAYER, (2, 30693), "nchw", {4: True, 2: True}),    # clusters of 4 (16-bit) / 8 (fp32) blocks of 256
    (RMS, (1, 64254), "nchw", {4: True, 2: True}),      # clusters of 8: blocks of 256 (16-bit) / 512 (fp32)
    (LAYER, (64, 4096), "nchw", {4: False, 2: False}),  # whole vectors: the existing kernels
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", range(len(BWD_CASES)))
def test_rowx_backward(handle, rng, case, dtype):
    kind, dims, layout, uses = BWD_CASES[case]
    x = _tensor(dims, layout, dtype)
    alts, _ = N.plan_summary(handle, _nd(kind, 0, 1), x.desc, backward=True)
    assert alts[0][0].startswith("bwd_rowx") == uses[4 if dtype == F32 else 2], alts
    _backward_check(handle, rng, kind, 0, 1, dims, layout, dtype)
    _backward_check(handle, rng, kind, 0, 1, dims, layout, dtype, alphas=(0.5, -1.5, 2.0, 0.25), bias=False,
                    dbias=False)


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_rowx_backward_walks_many_rows(handle, rng, monkeypatch, dtype):
    """A 1-SM plan: one block per alignment class, its groups walking every row of the class (the dscale /
    dbias partials summed over many rows in the shared-memory slots)."""
    monkeypatch.setattr(handle, "sm_count", 1)
    for kind, dims in ((LAYER, (300, 37)), (RMS, (70, 1001))):
        x = _tensor(dims, "nchw", dtype)
        alts, _ = N.plan_summary(handle, _nd(kind, 0, 1), x.desc, backward=True)
        assert alts[0][0].startswith("bwd_rowx"), alts
        _backward_check(handle, rng, kind, 0, 1, dims, "nchw", dtype)
        _backward_check(handle, rng, kind, 0, 1, dims, "nchw", dtype, alphas=(1.0, 0.5, 1.0, -1.0))


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_rowx_backward_cluster_blocks(handle, rng, monkeypatch, dtype):
    """bwd_rowx_cl with ROWX_BWD_CL_BLOCK 512 (smaller clusters of larger blocks) as well as the default."""
    for cap in (512, 256):
        monkeypatch.setattr(tuning.norm, "ROWX_BWD_CL_BLOCK", cap)
        for kind, dims in ((LAYER, (5, 20001)), (RMS, (3, 30693))):  # (beyond one 512 x 4 block in both sizes)
            x = _tensor(dims, "nchw", dtype)
            alts, _ = N.plan_summary(handle, _nd(kind, 0, 1), x.desc, backward=True)
            assert alts[0][0].startswith("bwd_rowx") and " cl=" in alts[0][0], alts
            _backward_check(handle, rng, kind, 0, 1, dims, "nchw", dtype, alphas=(1.0, 0.5, 1.0, -1.0))


@pytest.mark.parametrize("long_rows", [False, True], ids=["default", "ROWX_BWD_LONG"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rowx_backward_whole_vector_long_rows(handle, rng, monkeypatch, long_rows, dtype):
    """Whole-vector rows the whole-vector backward kernels do not serve (fp32 1 x 56616, 2 x 40000: gen
    before, 220 us on the H200): bwd_rowx_cl; with ROWX_BWD_LONG the 8-block cluster kernel's float rows that
    one bwd_rowx block holds, at least as many as the SMs (fp32 200 x 8192); 33 x 8552 and 5 x 32768 keep
    the cluster kernel."""
    monkeypatch.setattr(tuning.norm, "ROWX_BWD_LONG", long_rows)
    for kind, dims in ((RMS, (1, 56616)), (LAYER, (2, 40000)), (LAYER, (33, 8552)), (RMS, (5, 32768)),
                       (RMS, (max(200, handle.sm_count), 8192))):
        x = _tensor(dims, "nchw", dtype)
        alts, _ = N.plan_summary(handle, _nd(kind, 0, 1), x.desc, backward=True)
        assert "gen" not in alts[0], alts
        if (dtype == F32 and dims[1] > 32768) or (long_rows and dtype == F32 and dims[1] == 8192):
            assert alts[0][0].startswith("bwd_rowx"), alts
        _backward_check(handle, rng, kind, 0, 1, dims, "nchw", dtype)
        _backward_check(handle, rng, kind, 0, 1, dims, "nchw", dtype, alphas=(0.5, -1.5, 2.0, 0.25), bias=False,
                        dbias=False)


@pytest.mark.parametrize("k", [4, 8])
def test_rowx_backward_rows_per_group(handle, rng, monkeypatch, k):
    """ROWX_BWD_ROWS: groups walking at least k rows of their class (the dscale / dbias partials summed over
    more rows per slot, fewer slots for finish)."""
    monkeypatch.setattr(tuning.norm, "ROWX_BWD_ROWS", k)
    for kind, dims, dtype in ((LAYER, (417, 2770), BF16), (LAYER, (21, 1439), F32), (RMS, (300, 37), F16)):
        x = _tensor(dims, "nchw", dtype)
        alts, _ = N.plan_summary(handle, _nd(kind, 0, 1), x.desc, backward=True)
        assert alts[0][0].startswith("bwd_rowx"), alts
        _backward_check(handle, rng, kind, 0, 1, dims, "nchw", dtype)
        _backward_check(handle, rng, kind, 0, 1, dims, "nchw", dtype, alphas=(1.0, 0.5, 1.0, -1.0))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", [0, 1, 2, 3, 4, 9])
@pytest.mark.parametrize("ws16", [True, False], ids=["ws16", "walk"])
def test_rowx_backward_ws16(handle, rng, case, dtype, monkeypatch, ws16):
    """ROWX_BWD_WS16: bwd_rowx's dscale / dbias slots written in order with 16-byte (8-, 4-byte where the slot is off
    16 bytes: rows of 37 / 1001 / 4231 parameters) stores, from every alignment class; LN bf16 417 x 2770 (the
    sweep's point) and a 1-SM plan walking many rows; and with ROWX_BWD_WS16 off (on by default since session 32), the
    per-thread walk of the slot (which bwd_rowx_cl keeps)."""
    monkeypatch.setattr(tuning.norm, "ROWX_BWD_WS16", ws16)
    cases = BWD_CASES + [None] * 10
    cases[9] = (LAYER, (417, 2770), "nchw", {4: True, 2: True})
    kind, dims, layout, uses = cases[case]
    x = _tensor(dims, layout, dtype)
    alts, _ = N.plan_summary(handle, _nd(kind, 0, 1), x.desc, backward=True)
    assert alts[0][0].startswith("bwd_rowx ") == uses[4 if dtype == F32 else 2], alts
    _backward_check(handle, rng, kind, 0, 1, dims, layout, dtype)
    _backward_check(handle, rng, kind, 0, 1, dims, layout, dtype, alphas=(0.5, -1.5, 2.0, 0.25), bias=False,
                    dbias=False)
    if case == 0:
        monkeypatch.setattr(handle, "sm_count", 1)
        for kind, dims in ((LAYER, (300, 37)), (RMS, (70, 1001))):
            _backward_check(handle, rng, kind, 0, 1, dims, "nchw", dtype, alphas=(1.0, 0.5, 1.0, -1.0))
