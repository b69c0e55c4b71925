"""fwd_tma's host plan (pydnn/ops/convolution/conv_tma.py; tuning.conv.FWD_TMA) on CPU-only handles (sm_90 / 132
SMs): what it refuses, the output box it picks (tn * th * tw = 128, fewest padded rows), the tensor maps'
dims / strides / boxes, the register_top hook (off by default; a split plan stays split); a numpy emulation of
the kernel's walk (TMA boxes with out-of-bounds zeros at the tap's shifted coordinates, the flip, dilation,
the K-major products, the epilogue's row -> (image, row, column) map) against the float64 reference; the
params struct's layout; the unit compiles for sm_90a without spills."""
import itertools
import sys
from pathlib import Path

import numpy as np
import pytest

import pydnn
from pydnn import tuning
from pydnn.ops.common import cdiv
from pydnn.ops.convolution import conv_tma as T, plans as CP, problem as CPb, tensor_core as CT
from pydnn.reference import convolution as ref

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools"))
from plan_digest import cpu_handle  # noqa: E402

BF16, F32 = pydnn.PYDNN_DATA_BFLOAT16, pydnn.PYDNN_DATA_FLOAT
NHWC, NCHW = pydnn.PYDNN_TENSOR_NHWC, pydnn.PYDNN_TENSOR_NCHW
FWD_PRE = pydnn.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM
XCORR, CONV = pydnn.PYDNN_CROSS_CORRELATION, pydnn.PYDNN_CONVOLUTION


@pytest.fixture
def h():
    return cpu_handle("sm_90", 132)


def _descs(n, c, k, hw, r, pad, stride=1, dil=1, dtype=BF16, fmt=NHWC, mode=XCORR, groups=1, wdim=None):
    ww = wdim or hw
    p = (hw + 2 * pad - dil * (r - 1) - 1) // stride + 1
    q = (ww + 2 * pad - dil * (r - 1) - 1) // stride + 1
    xd, yd = pydnn.create_tensor_descriptor(), pydnn.create_tensor_descriptor()
    pydnn.set_tensor4d_descriptor(xd, fmt, dtype, n, c, hw, ww)
    pydnn.set_tensor4d_descriptor(yd, fmt, dtype, n, k, p, q)
    wd = pydnn.create_filter_descriptor()
    pydnn.set_filter4d_descriptor(wd, dtype, fmt, k, c // groups, r, r)
    cv = pydnn.create_convolution_descriptor()
    pydnn.set_convolution2d_descriptor(cv, pad, pad, stride, stride, dil, dil, mode, pydnn.PYDNN_DATA_FLOAT)
    if groups > 1:
        pydnn.set_convolution_group_count(cv, groups)
    return cv, xd, wd, yd


def _plan(h, *a, **kw):
    cv, xd, wd, yd = _descs(*a, **kw)
    return CP.new_plan(h, CPb.DIR_FWD, FWD_PRE, cv, xd, wd, yd)


@pytest.fixture
def tma_on(monkeypatch):
    monkeypatch.setattr(tuning.conv, "FWD_TMA", "always")
    monkeypatch.setattr(tuning.conv, "STREAM_1X1", False)   # (a 1x1 case's plan on fwd_tma, not the stream kernels)


def test_on_by_default_and_off(h, monkeypatch):
    assert tuning.conv.FWD_TMA is True
    assert isinstance(_plan(h, 64, 64, 64, 56, 3, 1), T.TmaPlan)
    monkeypatch.setattr(tuning.conv, "FWD_TMA", False)
    pl = _plan(h, 64, 64, 64, 56, 3, 1)
    assert type(pl) is CP.Plan and "fwd_wgmma<" in pl.gemm_expr


def test_hook_replaces_unsplit_wgmma_plans(h, tma_on):
    pl = _plan(h, 64, 64, 64, 56, 3, 1)
    assert isinstance(pl, T.TmaPlan) and "fwd_wgmma<" in pl.fallback.gemm_expr and pl.workspace == 0
    assert pl.gemm is not None and pl.gemm.gn == 64
    # a plan the split-K model splits stays split (N8 3x3 512->512 @7: 32 blocks of 72 K tiles)
    sp = _plan(h, 8, 512, 512, 7, 3, 1)
    assert type(sp) is CP.Plan and sp.fold is not None
    # not on sm_80
    pl80 = _plan(cpu_handle("sm_80", 108), 64, 64, 64, 56, 3, 1)
    assert not isinstance(pl80, T.TmaPlan)


def test_refusals(h, tma_on):
    assert T.tma_refusal(h, _plan(h, 8, 64, 64, 16, 3, 1).problem) is None
    for kw, why in ((dict(stride=2), "stride"), (dict(groups=2), "groups"), (dict(dtype=F32), "data type"),
                    (dict(fmt=NCHW), "NHWC")):
        cv, xd, wd, yd = _descs(8, 64, 64, 16, 3, 1, **kw)
        pl = CP.new_plan(h, CPb.DIR_FWD, pydnn.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, cv, xd, wd, yd)
        assert not isinstance(pl, T.TmaPlan)
        assert why in (T.tma_refusal(h, pl.problem) or ""), kw
    assert "arch" in T.tma_refusal(cpu_handle("sm_80", 108), _plan(h, 8, 64, 64, 16, 3, 1).problem)


@pytest.mark.parametrize("n, P, Q", [(64, 56, 56), (32, 7, 7), (8, 28, 28), (128, 14, 14), (3, 9, 11), (1, 1, 200)])
def test_box_is_the_fewest_padded_rows(n, P, Q):
    tw, th, tn = T._box(n, P, Q)
    assert tw * th * tn == 128 and all(v & (v - 1) == 0 for v in (tw, th, tn))
    rows = lambda a, b, c: cdiv(Q, a) * a * cdiv(P, b) * b * cdiv(n, c) * c  # noqa: E731
    best = min(rows(1 << a, 1 << b, 128 >> (a + b)) for a in range(8) for b in range(8 - a))
    assert rows(tw, th, tn) == best


def test_maps(h, tma_on):
    pl = _plan(h, 6, 96, 136, 10, 3, 1, wdim=12)
    q = pl.q
    mx, mw = pl.maps[0].map, pl.maps[1].map
    assert mx.dims == (96, 12, 10, 6) and mx.strides == (96 * 2, 12 * 96 * 2, 10 * 12 * 96 * 2)
    assert mx.box == (64, q.tw, q.th, q.tn)
    assert pl.bn == 128 and "fwd_tma<pydnn::bf16_t, 128, 6>" in pl.gemm_expr and pl.unit_name.endswith(".bn128")
    assert mw.dims == (96, 9, 136) and mw.strides == (96 * 2, 9 * 96 * 2) and mw.box == (64, 1, 128)
    assert (q.tiles_k, q.cblocks) == (2, 2)
    assert pl.items == q.tiles_w * q.tiles_h * q.tiles_n * 2 and pl.grid[0] == min(pl.items, 132)
    assert all(T.smem(bn) <= 227 * 1024 for bn in T.BNS) and pl.smem == T.smem(128)


def test_strided_maps_and_switch(h, tma_on, monkeypatch):
    """FWD_TMA_STRIDED: off, a strided forward keeps its fwd_wgmma plan; on, x's box spans tw * stride columns
    (th * stride rows) and walks every stride-th (element strides (1, s, s, 1)); no box dim past 256 (stride 3 on
    a wide image: tw <= 64); strides past 8 (a TMA element stride's limit) refused."""
    monkeypatch.setattr(tuning.conv, "FWD_TMA_STRIDED", False)
    assert not isinstance(_plan(h, 8, 64, 64, 56, 3, 1, stride=2), T.TmaPlan)
    monkeypatch.setattr(tuning.conv, "FWD_TMA_STRIDED", True)   # True: a wave of items at least
    assert not isinstance(_plan(h, 8, 64, 64, 56, 3, 1, stride=2), T.TmaPlan)      # 49 items for 132 SMs
    big = _plan(h, 32, 64, 64, 56, 3, 1, stride=2)                                  # 196 items
    assert isinstance(big, T.TmaPlan) and big.items >= 132
    monkeypatch.setattr(tuning.conv, "FWD_TMA_STRIDED", "always")
    pl = _plan(h, 8, 64, 64, 56, 3, 1, stride=2)
    assert isinstance(pl, T.TmaPlan) and "fwd_wgmma<" in pl.fallback.gemm_expr
    q, mx = pl.q, pl.maps[0].map
    assert mx.dims == (64, 56, 56, 8) and mx.box == (64, 2 * q.tw, 2 * q.th, q.tn) and mx.estrides == (1, 2, 2, 1)
    assert (q.tiles_w * q.tw, q.tiles_h * q.th) >= (28, 28) and pl.q.p.stride[1] == 2
    assert _plan(h, 8, 64, 64, 56, 3, 1).maps[0].map.estrides is None          # stride 1: no element strides
    monkeypatch.setitem(tuning.conv.TC_FORCE, CPb.DIR_FWD, (128, 128, 4, 1, 1))   # the base plan on fwd_wgmma
    pl = _plan(h, 1, 64, 64, 2, 1, 0, stride=3, wdim=769)                      # Q 257: tw 128 would span 384
    assert T._box(1, 1, 257) == (128, 1, 1) and pl.q.tw == 64 and pl.maps[0].map.box[1] == 192
    assert "stride" in T.tma_refusal(h, _plan(h, 2, 64, 64, 40, 1, 0, stride=9).problem, strided=True)


def test_tile_width(h, tma_on, monkeypatch):
    assert _plan(h, 64, 64, 64, 56, 3, 1).bn == 64                 # K 64: the 64-wide tile
    assert _plan(h, 128, 256, 256, 32, 3, 1).bn == 128             # 16 waves of 128-wide tiles: 128
    assert _plan(h, 128, 512, 512, 7, 3, 1).bn == 256              # 196 items of 128 (1.5 waves), 98 of 256
    assert _plan(h, 32, 512, 512, 16, 3, 1).bn == 256              # 256 / 128 items
    assert _plan(h, 32, 256, 256, 14, 3, 1).bn == 128              # 49 items of 256: under half a wave
    assert _plan(h, 128, 512, 2048, 7, 1, 0).bn == 128             # 784 items of 128
    assert _plan(h, 8, 256, 256, 16, 3, 1).bn == 128
    monkeypatch.setattr(tuning.conv, "FWD_TMA_BN", 64)
    pl = _plan(h, 128, 256, 256, 32, 3, 1)
    assert pl.bn == 64 and pl.q.tiles_k == 4 and pl.maps[1].map.box == (64, 1, 64)


def _emulate(pb, q, x, w, bn, box_b=None):
    """fwd_tma's walk in numpy: per item, the K tiles' boxes (zeros out of bounds) multiplied K-major, then the
    epilogue's row map. x (N, H, W, C), w (K, R, S, C) float64; returns y (N, P, Q, K). box_b(c0, tap, n0) -> (bn,
    64): B's tile another way (backward data's direct read, test_convolution_tma_dgrad_cpu.py)."""
    N, H, W, C = x.shape
    K, R, S, _ = w.shape
    P, Q = pb.out3[1], pb.out3[2]
    y = np.full((N, P, Q, K), np.nan)
    dh, dw, ph, pw = pb.dil3[1], pb.dil3[2], pb.pad3[1], pb.pad3[2]
    sh, sw = pb.stride3[1], pb.stride3[2]
    flip = pb.flip
    wt = w.reshape(K, R * S, C)

    def box_x(c0, iw, ih, nb):
        """The map's box at (c0, iw, ih, nb): every sw-th column and sh-th row (its element strides)."""
        out = np.zeros((q.tn, q.th, q.tw, 64))
        for ni, hi, wi in itertools.product(range(q.tn), range(q.th), range(q.tw)):
            a, b, cc = nb + ni, ih + hi * sh, iw + wi * sw
            if 0 <= a < N and 0 <= b < H and 0 <= cc < W:
                cs = x[a, b, cc, c0:c0 + 64]
                out[ni, hi, wi, :len(cs)] = cs
        return out.reshape(128, 64)   # row = wi + tw * (hi + th * ni)

    def box_w(c0, tap, n0):
        if box_b is not None:
            return box_b(c0, tap, n0)
        out = np.zeros((bn, 64))
        blk = wt[n0:n0 + bn, tap, c0:c0 + 64]
        out[:blk.shape[0], :blk.shape[1]] = blk
        return out

    items = q.tiles_w * q.tiles_h * q.tiles_n * q.tiles_k
    for item in range(items):
        per_k = q.tiles_w * q.tiles_h * q.tiles_n
        tk, rr = divmod(item, per_k)
        bw = rr % q.tiles_w
        rr //= q.tiles_w
        bh, bi = rr % q.tiles_h, rr // q.tiles_h
        w0, h0, nb, n0 = bw * q.tw, bh * q.th, bi * q.tn, tk * bn
        acc = np.zeros((128, bn))
        for r in range(R):
            for s in range(S):
                tap = (R - 1 - r) * S + (S - 1 - s) if flip else r * S + s
                for cb in range(q.cblocks):
                    acc += box_x(cb * 64, w0 * sw + s * dw - pw, h0 * sh + r * dh - ph, nb) @ box_w(cb * 64, tap, n0).T
        for row in range(128):
            wi, hi, ni = row % q.tw, (row // q.tw) % q.th, row // (q.tw * q.th)
            a, oh, ow = nb + ni, h0 + hi, w0 + wi
            if a >= N or oh >= P or ow >= Q:
                continue
            for col in range(bn):
                if n0 + col < K:
                    assert np.isnan(y[a, oh, ow, n0 + col]), "an output written twice"
                    y[a, oh, ow, n0 + col] = acc[row, col]
    return y


@pytest.mark.parametrize("args, kw", [
    ((2, 8, 10, 9), dict(r=3, pad=1)),                 # C 8: a channel tail; K 10
    ((3, 72, 136, 7), dict(r=3, pad=1, mode=CONV)),    # 2 channel blocks, 2 K tiles, several images a box, flip
    ((1, 16, 24, 11), dict(r=3, pad=2, dil=2, wdim=13)),  # dilation, pad past the window
    ((2, 24, 8, 6), dict(r=5, pad=2)),                 # 5x5
    ((4, 64, 16, 5), dict(r=1, pad=0)),                # 1x1
    ((2, 72, 24, 13), dict(r=3, pad=1, stride=2)),     # stride 2 (odd H: the last window's edge), channel tail
    ((3, 16, 8, 9), dict(r=1, pad=0, stride=2)),       # 1x1 / 2
    ((1, 24, 16, 17), dict(r=5, pad=2, stride=3, dil=2, mode=CONV, wdim=23)),   # stride 3, dilation, flip
])
@pytest.mark.parametrize("bn", T.BNS)
def test_emulated_walk_matches_the_reference(h, tma_on, rng, monkeypatch, args, kw, bn):
    monkeypatch.setitem(tuning.conv.TC_FORCE, CPb.DIR_FWD, (128, 128, 4, 1, 1))   # the base plan on fwd_wgmma
    monkeypatch.setattr(tuning.conv, "FWD_TMA_STRIDED", "always")
    monkeypatch.setattr(tuning.conv, "FWD_TMA_BN", bn)
    kw = dict(kw)
    n, c, k, hw = args
    pl = _plan(h, n, c, k, hw, kw.pop("r"), kw.pop("pad"), **kw)
    assert isinstance(pl, T.TmaPlan)
    pb = pl.problem
    W = pb.in3[2]
    x = rng.integers(-3, 4, (n, c, hw, W)).astype(np.float64)
    R, S = pb.filt3[1], pb.filt3[2]
    w = rng.integers(-3, 4, (k, c, R, S)).astype(np.float64)
    got = _emulate(pb, pl.q, x.transpose(0, 2, 3, 1), w.transpose(0, 2, 3, 1), pl.bn)
    want = ref.forward_raw(x, w, pb.pad3[1:], pb.stride3[1:], pb.dil3[1:], 1, not pb.flip)
    assert not np.isnan(got).any(), "an output never written"
    np.testing.assert_array_equal(got.transpose(0, 3, 1, 2), want)


@pytest.fixture
def rng():
    return np.random.default_rng(7)


@pytest.mark.parametrize("bn", T.BNS)
@pytest.mark.parametrize("tag", T.TAGS)
def test_unit_compiles_without_spills(tag, bn):
    nvrtc = pytest.importorskip("pydnn._cuda.nvrtc")
    try:
        nvrtc.version()
    except Exception as e:  # noqa: BLE001 - no NVRTC here
        pytest.skip(f"no NVRTC: {e}")
    from pydnn._build import cache, manifest
    u = [u for u in manifest.family_units() if u.name == T.unit(tag, bn)][0]
    assert u.archs == ("sm_90a",) and u.exprs == (T.expr(tag, bn),)
    text, _ = cache.unit_inputs(u)
    cubin, lowered, log = nvrtc.compile_cubin(text, u.source, u.exprs, "sm_90a", ("-std=c++17", "--ptxas-options=-v"),
                                              [str(cache.ptx_dir())])
    assert cubin and set(lowered) == set(u.exprs)
    assert "spill" in log
    for line in log.splitlines():
        if "spill" in line:
            assert "0 bytes spill stores, 0 bytes spill loads" in line, line
    assert CT is not None


def test_misaligned_call_runs_the_wgmma_plan_with_its_epilogue(h, tma_on, monkeypatch):
    """x or the filter not 16-byte aligned: the fallback (fwd_wgmma's plan) runs, with the fused call's epilogue
    fields (set on the TMA plan's ConvParams) copied to it."""
    from pydnn._build.params import FLAG_NAN_PROP
    pl = _plan(h, 64, 64, 64, 56, 3, 1)
    assert isinstance(pl, T.TmaPlan)
    p = pl.gemm
    p.act, p.coef, p.alpha2, p.bias_stride = 2, 1.5, -0.5, 3
    p.flags |= CPb.FLAG_BIAS | CPb.FLAG_Z | FLAG_NAN_PROP
    for i in range(5):
        p.zs[i] = 100 + i
    seen = []
    monkeypatch.setattr(CP, "run_plan", lambda handle, plan, *a: seen.append((plan, a)))
    pl.launch(h, 0x1002, 0x2000, 0x3000, 0, 1.0, 0.0, 0x4000, 0x5000)
    assert seen and seen[0][0] is pl.fallback and seen[0][1] == (0x1002, 0x2000, 0x3000, 0, 1.0, 0.0, 0x4000, 0x5000)
    f = pl.fallback.gemm
    assert (f.act, f.coef, f.alpha2, f.bias_stride) == (2, 1.5, -0.5, 3)
    assert list(f.zs) == [100, 101, 102, 103, 104]
    assert f.flags & CPb.FLAG_BIAS and f.flags & CPb.FLAG_Z and f.flags & FLAG_NAN_PROP


def test_true_takes_k_from_min_k_and_leaves_forced_tilings(h, monkeypatch):
    monkeypatch.setattr(tuning.conv, "FWD_TMA", True)
    assert isinstance(_plan(h, 128, 256, 256, 32, 3, 1), T.TmaPlan)          # K 256
    assert isinstance(_plan(h, 64, 64, 64, 56, 3, 1), T.TmaPlan)             # K 64 = MIN_K
    monkeypatch.setattr(T, "MIN_K", 128)
    assert not isinstance(_plan(h, 64, 64, 64, 56, 3, 1), T.TmaPlan)         # K 64 < MIN_K
    monkeypatch.setitem(tuning.conv.TC_FORCE, CPb.DIR_FWD, (128, 128, 4, 1, 1))
    assert not isinstance(_plan(h, 128, 256, 256, 32, 3, 1), T.TmaPlan)      # a forced tiling runs as forced
    monkeypatch.setattr(tuning.conv, "FWD_TMA", "always")
    assert isinstance(_plan(h, 128, 256, 256, 32, 3, 1), T.TmaPlan)


def _plan_dir(h, direction, algo, *a, **kw):
    cv, xd, wd, yd = _descs(*a, **kw)
    return CP.new_plan(h, direction, algo, cv, xd, wd, yd)


def test_gemm1x1_top_moves_only_gemm_tc_plans(h, monkeypatch):
    """TMA_1X1: the direct 1x1 GEMM plans whose matmul runs gemm_tc (a short reduction) move to
    fwd_tma, the GEMM plan their fallback; plans on matmul's wgmma / TMA tiles (a long reduction), NCHW ones (the
    filter as A), K or C under MIN_K stay."""
    from pydnn.ops.convolution import gemm as G
    GEMM, BD0 = pydnn.PYDNN_CONVOLUTION_FWD_ALGO_GEMM, pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_0
    monkeypatch.setattr(tuning.conv, "TMA_1X1", False)
    fwd = lambda *a, **kw: _plan_dir(h, CPb.DIR_FWD, GEMM, *a, **kw)          # noqa: E731
    bwd = lambda *a, **kw: _plan_dir(h, CPb.DIR_BWD_DATA, BD0, *a, **kw)      # noqa: E731
    # matmul takes its persistent wgmma tile from K = tuning.matmul.WG_PERSIST_MIN_K (64): 64 -> 256 stays a GEMM
    # plan on it, TMA_1X1 or not; above the reduction the limit leaves gemm_tc, the plans this hook moves
    for on in (False, True):
        monkeypatch.setattr(tuning.conv, "TMA_1X1", on)
        pl = fwd(64, 64, 256, 56, 1, 0)
        assert type(pl) is G.GemmPlan and "gemm_wgmma_p<" in pl.mm[0].fast.expr
    monkeypatch.setattr(tuning.conv, "TMA_1X1", False)
    monkeypatch.setattr(tuning.matmul, "WG_PERSIST_MIN_K", 512)
    base = fwd(64, 64, 256, 56, 1, 0)
    assert type(base) is G.GemmPlan and "gemm_tc<" in base.mm[0].fast.expr     # the default: the GEMM plan
    assert type(bwd(64, 256, 64, 56, 1, 0)) is G.BwdGemmPlan
    monkeypatch.setattr(tuning.conv, "TMA_1X1", True)
    pl = fwd(64, 64, 256, 56, 1, 0)
    assert type(pl) is T.TmaPlan and type(pl.fallback) is G.GemmPlan and pl.fallback.direct
    assert pl.maps[0].map.estrides is None and pl.workspace == 0
    pl = bwd(64, 256, 64, 56, 1, 0)                       # dx 256 channels from dy's 64: the direct read of w
    assert type(pl) is T.DgradTmaPlan and type(pl.fallback) is G.BwdGemmPlan and pl.swap_plan is None
    assert pl.unit_name.startswith("convolution.tma_dgrad.")
    long_k = fwd(128, 1024, 256, 14, 1, 0)                # reduction 1024: matmul's TMA tile, kept
    assert type(long_k) is G.GemmPlan and "gemm_tc<" not in long_k.mm[0].fast.expr
    assert type(fwd(8, 64, 32, 56, 1, 0)) is G.GemmPlan                       # K 32 < MIN_K
    assert type(fwd(8, 64, 256, 56, 1, 0, fmt=NCHW)) is G.GemmPlan            # NCHW: not fwd_tma's
    assert type(bwd(64, 256, 32, 56, 1, 0)) is G.BwdGemmPlan                  # dy's 32 channels: under a K tile
    assert type(bwd(64, 32, 256, 56, 1, 0)) is G.BwdGemmPlan                  # dx's C 32 < MIN_K
    # Get..._v7 ranks the moved plan by the GEMM plan's estimate: the same first choice either way
    cv, xd, wd, yd = _descs(64, 64, 256, 56, 1, 0)
    first = pydnn.get_convolution_forward_algorithm_v7(h, xd, wd, cv, yd, 1)[0].algo
    monkeypatch.setattr(tuning.conv, "TMA_1X1", False)
    assert pydnn.get_convolution_forward_algorithm_v7(h, xd, wd, cv, yd, 1)[0].algo == first


def test_gemm1x1_top_moves_under_filled_wgmma_plans(h, monkeypatch):
    """A direct 1x1 GEMM plan on the persistent 128 x 256 wgmma tile whose last wave is under LAST_WAVE_MIN full
    moves to fwd_tma too: 9 x 44 x 44 pixels by 240 outputs are 137 tiles on 132 SMs (fill 0.52); at 196 tiles
    (fill 0.74) and at 784 (0.99) the GEMM plan stays."""
    from pydnn.ops.convolution import gemm as G
    GEMM, BD0 = pydnn.PYDNN_CONVOLUTION_FWD_ALGO_GEMM, pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_0
    fwd = lambda *a, **kw: _plan_dir(h, CPb.DIR_FWD, GEMM, *a, **kw)          # noqa: E731
    bwd = lambda *a, **kw: _plan_dir(h, CPb.DIR_BWD_DATA, BD0, *a, **kw)      # noqa: E731
    pl = bwd(9, 240, 64, 44, 1, 0)
    assert type(pl) is T.DgradTmaPlan and type(pl.fallback) is G.BwdGemmPlan
    assert T._wgmma_last_wave_fill(h, pl.fallback.mm, 9 * 44 * 44, 240) == pytest.approx(137 / 264)
    pl = fwd(9, 64, 240, 44, 1, 0)
    assert type(pl) is T.TmaPlan and "gemm_wgmma_p<" in pl.fallback.mm[0].fast.expr
    for n, fill in ((8, 196 / 264), (32, 784 / 792)):
        pl = fwd(n, 64, 256, 56, 1, 0)
        assert type(pl) is G.GemmPlan and T._wgmma_last_wave_fill(h, pl.mm[0], n * 56 * 56, 256) == pytest.approx(fill)
        assert type(bwd(n, 256, 64, 56, 1, 0)) is G.BwdGemmPlan
    monkeypatch.setattr(T, "LAST_WAVE_MIN", 0.5)   # (the bound itself decides)
    assert type(bwd(9, 240, 64, 44, 1, 0)) is G.BwdGemmPlan
    monkeypatch.setattr(tuning.conv, "TMA_1X1", False)
    monkeypatch.setattr(T, "LAST_WAVE_MIN", 0.6)
    assert type(bwd(9, 240, 64, 44, 1, 0)) is G.BwdGemmPlan


def test_gemm1x1_fallback_is_the_gemm_plan(h, monkeypatch):
    """A misaligned x (or maps that cannot encode, as on this CPU handle) runs the GEMM plan it replaced."""
    monkeypatch.setattr(tuning.conv, "TMA_1X1", True)
    monkeypatch.setattr(tuning.matmul, "WG_PERSIST_MIN_K", 512)   # (the 1x1 GEMM on gemm_tc: the plans TMA_1X1 moves)
    pl = _plan_dir(h, CPb.DIR_FWD, pydnn.PYDNN_CONVOLUTION_FWD_ALGO_GEMM, 64, 64, 256, 56, 1, 0)
    seen = []
    monkeypatch.setattr(CP, "run_plan", lambda handle, plan, *a: seen.append((plan, a)))
    pl.launch(h, 0x1002, 0x2000, 0x3000, 0, 1.0, 0.5)
    assert seen and seen[0][0] is pl.fallback and seen[0][1][:6] == (0x1002, 0x2000, 0x3000, 0, 1.0, 0.5)
