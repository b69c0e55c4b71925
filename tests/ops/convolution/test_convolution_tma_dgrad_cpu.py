"""Backward data on fwd_tma (pydnn/ops/convolution/conv_tma.py: tma_dgrad_top, plan_dgrad_tma; tuning.conv.DGRAD_TMA)
on CPU-only handles (sm_90 / 132 SMs): which plans it replaces (a call's own unsplit stride-1 fwd_wgmma plan,
direct or swap; not a split plan, a phase of a strided problem, a forced tiling under True, sm_80), the forward of
dy it runs (sizes, padding, the tensor maps' dims / strides / boxes, the workspace of the swap), a numpy emulation
of the kernel's walk with B read as the direct route's boxes of w (64 c x 64 k, MN-major) or the swap's packed
copy, against the float64 reference; the launches (the swap before the kernel; a misaligned call runs the
replaced plan with the call's own pointers); the BKN units compile for sm_90a without spills."""
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
from test_convolution_tma_cpu import _emulate as emulate_forward  # noqa: E402

BF16 = pydnn.PYDNN_DATA_BFLOAT16
NHWC, NCHW = pydnn.PYDNN_TENSOR_NHWC, pydnn.PYDNN_TENSOR_NCHW
BWD = pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_1
XCORR, CONV = pydnn.PYDNN_CROSS_CORRELATION, pydnn.PYDNN_CONVOLUTION
WGM_TILE = (128, 128, 4, 1, 1)


@pytest.fixture
def h():
    return cpu_handle("sm_90", 132)


@pytest.fixture
def rng():
    return np.random.default_rng(11)


def _descs(n, c, k, hw, r, pad, stride=1, dil=1, mode=XCORR, wdim=None, wfmt=NHWC, s=None):
    ww = wdim or hw
    s = s or r
    p = (hw + 2 * pad - dil * (r - 1) - 1) // stride + 1
    q = (ww + 2 * pad - dil * (s - 1) - 1) // stride + 1
    xd, yd = pydnn.create_tensor_descriptor(), pydnn.create_tensor_descriptor()
    pydnn.set_tensor4d_descriptor(xd, NHWC, BF16, n, c, hw, ww)
    pydnn.set_tensor4d_descriptor(yd, NHWC, BF16, n, k, p, q)
    wd = pydnn.create_filter_descriptor()
    pydnn.set_filter4d_descriptor(wd, BF16, wfmt, k, c, r, s)
    cv = pydnn.create_convolution_descriptor()
    pydnn.set_convolution2d_descriptor(cv, pad, pad, stride, stride, dil, dil, mode, pydnn.PYDNN_DATA_FLOAT)
    return cv, xd, wd, yd


def _plan(h, *a, **kw):
    cv, xd, wd, yd = _descs(*a, **kw)
    return CP.new_plan(h, CPb.DIR_BWD_DATA, BWD, cv, xd, wd, yd)


@pytest.fixture
def on(monkeypatch):
    monkeypatch.setattr(tuning.conv, "DGRAD_TMA", "always")
    monkeypatch.setattr(tuning.conv, "STREAM_1X1", False)   # (a 1x1 case's plan on fwd_tma, not the stream kernels)


def test_switch(h, monkeypatch):
    monkeypatch.setattr(tuning.conv, "DGRAD_TMA", False)
    pl = _plan(h, 64, 64, 64, 56, 3, 1)
    assert type(pl) is CP.Plan and "fwd_wgmma<" in pl.gemm_expr
    monkeypatch.setattr(tuning.conv, "DGRAD_TMA", True)
    pl = _plan(h, 64, 64, 64, 56, 3, 1)
    assert isinstance(pl, T.DgradTmaPlan) and pl.direction == CPb.DIR_BWD_DATA and pl.workspace == 0
    assert type(pl.fallback) is CP.Plan and pl.fallback.gemm_expr.endswith(", 1>")   # fwd_wgmma's BKN plan
    assert pl.swap_plan is None and pl.expr.endswith(", 1>") and ".tma_dgrad." in pl.unit_name
    assert pl.problem.stride3 == (1, 1, 1) and pl.problem.c == 64 and pl.sub_problem.k == 64
    monkeypatch.setattr(T, "MIN_K", 128)                                   # C 64 < MIN_K: left on fwd_wgmma
    assert not isinstance(_plan(h, 64, 64, 64, 56, 3, 1), T.TmaPlan)
    assert isinstance(_plan(h, 32, 128, 128, 28, 3, 1), T.DgradTmaPlan)
    monkeypatch.setitem(tuning.conv.TC_FORCE, CPb.DIR_BWD_DATA, WGM_TILE)   # a forced tiling runs as forced
    assert not isinstance(_plan(h, 32, 128, 128, 28, 3, 1), T.TmaPlan)
    monkeypatch.setattr(tuning.conv, "DGRAD_TMA", "always")
    assert isinstance(_plan(h, 32, 128, 128, 28, 3, 1), T.DgradTmaPlan)


def test_what_it_leaves(h, on, monkeypatch):
    sp = _plan(h, 8, 512, 512, 7, 3, 1)                     # the split-K model splits it: stays split
    assert type(sp) is CP.Plan and sp.fold is not None
    assert not isinstance(_plan(cpu_handle("sm_80", 108), 64, 64, 64, 56, 3, 1), T.TmaPlan)
    monkeypatch.setattr(tuning.conv, "DGRAD_TMA_PHASES", False)
    ph = _plan(h, 32, 128, 128, 28, 3, 1, stride=2)         # stride 2: dgrad_phases' phases, their own switch
    assert not isinstance(ph, T.TmaPlan)
    assert all(not isinstance(s[0], T.TmaPlan) for s in getattr(ph, "subs", ()))
    monkeypatch.setattr(tuning.conv, "DGRAD_TMA_PHASES", True)
    ph = _plan(h, 128, 128, 128, 28, 3, 1, stride=2)        # C 128: full tiles (PHASE_MIN_FILL)
    assert any(isinstance(s[0], T.DgradTmaPlan) for s in ph.subs)
    ph = _plan(h, 128, 320, 128, 28, 3, 1, stride=2)        # C 320 on 128- or 256-wide tiles: 0.83 / 0.63 full
    assert all(not isinstance(s[0], T.TmaPlan) for s in ph.subs)
    monkeypatch.setattr(tuning.conv, "DGRAD_TMA_PHASES", "always")
    assert any(isinstance(s[0], T.DgradTmaPlan) for s in _plan(h, 128, 320, 128, 28, 3, 1, stride=2).subs)
    pb = _plan(h, 64, 64, 64, 56, 3, 1).problem
    assert T.dgrad_refusal(h, pb, False) is None
    assert "arch" in T.dgrad_refusal(cpu_handle("sm_80", 108), pb, False)


def test_forward_of_dy_and_maps(h, on, monkeypatch):
    monkeypatch.setitem(tuning.conv.TC_FORCE, CPb.DIR_BWD_DATA, WGM_TILE)
    pl = _plan(h, 6, 72, 136, 10, 3, 2, dil=2, wdim=12, mode=CONV)
    assert isinstance(pl, T.DgradTmaPlan)
    spb, q = pl.sub_problem, pl.q
    assert (spb.c, spb.k, spb.in3, spb.out3) == (136, 72, pl.problem.out3, pl.problem.in3)
    assert spb.pad3[1:] == (2 * 2 - 2, 2 * 2 - 2) and spb.flip == (not pl.problem.flip)
    assert q.p.flags & CPb.FLAG_FLIP == (CPb.FLAG_FLIP if spb.flip else 0)
    P, Q = pl.problem.out3[1], pl.problem.out3[2]
    mx, mw = pl.maps[0].map, pl.maps[1].map
    assert mx.dims == (136, Q, P, 6) and mx.strides == (136 * 2, Q * 136 * 2, P * Q * 136 * 2)
    assert mx.box == (64, q.tw, q.th, q.tn)
    assert mw.dims == (72, 9, 136) and mw.box == (64, 1, 64)   # w itself: (C, taps, K)
    assert mw.strides == (72 * 2, 9 * 72 * 2)
    assert (q.tiles_k, q.cblocks) == (cdiv(72, pl.bn), 3) and pl.bn == 128
    assert pl.items == q.tiles_w * q.tiles_h * q.tiles_n * q.tiles_k and pl.grid[0] == min(pl.items, 132)


def test_swap_route(h, on, monkeypatch):
    monkeypatch.setitem(tuning.conv.TC_FORCE, CPb.DIR_BWD_DATA, WGM_TILE)
    monkeypatch.setattr(tuning.conv, "WGM_BWD_SWAP", True)
    pl = _plan(h, 4, 64, 128, 9, 3, 1)
    assert isinstance(pl, T.DgradTmaPlan) and isinstance(pl.swap_plan, CT.BwdWgmmaPlan)
    assert pl.fallback is pl.swap_plan and pl.workspace == pl.swap_plan.workspace >= 9 * 64 * 128 * 2
    assert pl.expr == T.expr("bf16", pl.bn) and pl.unit_name == T.unit("bf16", pl.bn)   # the forward's instantiation
    mw = pl.maps[1].map
    assert mw.dims == (128, 9, 64) and mw.strides == (128 * 2, 9 * 128 * 2) and mw.box == (64, 1, pl.bn)
    assert T.dgrad_refusal(h, pl.problem, True) is None


def _emulate(spb, q, dy, w, bn, direct):
    """fwd_tma's walk (test_convolution_tma_cpu's emulation) on the forward of dy: dy (N, P, Q, K), w (K, R, S, C)
    float64; B as the swap's packed w' (C, taps, K) boxes (64 k x bn c, K-major), or as the direct route's TMA boxes
    of w (bn / 64 boxes of 64 c x 64 k at (n0 + 64 i, s, r, c0), MN-major: [k][c] rows). Returns dx (N, H, W, C)."""
    K, R, S, C = w.shape
    wt = w.reshape(K, R * S, C)

    def box_b(c0, tap, n0):   # (bn, 64): [output channel][reduction channel]
        b = np.zeros((bn, 64))
        for i in range(bn // 64):
            slab = np.zeros((64, 64))   # 64 rows (k) of 64 c: the box at (n0 + 64 i, tap, c0)
            blk = wt[c0:c0 + 64, tap, n0 + 64 * i:n0 + 64 * i + 64]
            slab[:blk.shape[0], :blk.shape[1]] = blk
            b[64 * i:64 * i + 64, :] = slab.T
        return b

    return emulate_forward(spb, q, dy, w.transpose(3, 1, 2, 0), bn, box_b if direct else None)


@pytest.mark.parametrize("args, kw", [
    ((2, 8, 16, 9), dict(r=3, pad=1)),                   # C 8: a tail of the 64-wide output tile; K 16
    ((3, 136, 72, 7), dict(r=3, pad=1, mode=CONV)),      # C 136: 3 slabs of B a 256 tile / a tail; K 72: 2 blocks
    ((1, 24, 16, 11), dict(r=3, pad=2, dil=2, wdim=13)),  # dilation, padding past the window (negative pad')
    ((2, 72, 24, 8), dict(r=5, pad=0, s=3)),             # 5x3, no padding: pad' 4 / 2
    ((4, 64, 128, 5), dict(r=1, pad=0)),                 # 1x1
])
@pytest.mark.parametrize("bn", T.BNS)
@pytest.mark.parametrize("route", ["direct", "swap"])
def test_emulated_walk_matches_the_reference(h, on, rng, monkeypatch, args, kw, bn, route):
    monkeypatch.setitem(tuning.conv.TC_FORCE, CPb.DIR_BWD_DATA, WGM_TILE)   # the replaced plan on fwd_wgmma
    monkeypatch.setattr(tuning.conv, "FWD_TMA_BN", bn)
    monkeypatch.setattr(tuning.conv, "WGM_BWD_SWAP", route == "swap")
    kw = dict(kw)
    n, c, k, hw = args
    pl = _plan(h, n, c, k, hw, kw.pop("r"), kw.pop("pad"), **kw)
    assert isinstance(pl, T.DgradTmaPlan) and pl.bn == bn and (pl.swap_plan is None) == (route == "direct")
    pb, spb = pl.problem, pl.sub_problem
    R, S = pb.filt3[1], pb.filt3[2]
    H, W = pb.in3[1], pb.in3[2]
    P, Q = pb.out3[1], pb.out3[2]
    dy = rng.integers(-3, 4, (n, k, P, Q)).astype(np.float64)
    w = rng.integers(-3, 4, (k, c, R, S)).astype(np.float64)
    got = _emulate(spb, pl.q, dy.transpose(0, 2, 3, 1), w.transpose(0, 2, 3, 1), bn, route == "direct")
    want = ref.backward_data_raw(w, dy, (H, W), pb.pad3[1:], pb.stride3[1:], pb.dil3[1:], 1, not pb.flip)
    assert not np.isnan(got).any(), "a dx element never written"
    np.testing.assert_array_equal(got.transpose(0, 3, 1, 2), want)


class _Encoded:
    def get(self, address):
        return bytes(128)


def test_launches(h, on, monkeypatch):
    """Direct: one kernel with dy and w. Swap: filter_kc_swap (w -> workspace) first, then the kernel reading the
    workspace. Misaligned dy / w (direct) or dy (swap), or maps that cannot be encoded: the replaced plan with the
    call's own pointers."""
    from pydnn._cuda import driver
    launched, fell = [], []
    monkeypatch.setattr(driver, "launch_args", lambda func, grid, block, smem, stream, argv: launched.append(func))
    monkeypatch.setattr(driver, "function_set_max_dynamic_smem", lambda func, n: None)
    monkeypatch.setattr(CP, "run_plan", lambda handle, plan, *a: fell.append((plan, a)))
    for route in ("direct", "swap"):
        monkeypatch.setattr(tuning.conv, "WGM_BWD_SWAP", route == "swap")
        pl = _plan(h, 4, 64, 128, 9, 3, 1)
        pl.maps = (_Encoded(), _Encoded())
        pl.func = pl.expr   # (the loaded functions: their expressions, for the record)
        if pl.swap_plan is not None:
            pl.swap_plan.swap_func = pl.swap_plan.swap_expr
        launched.clear()
        fell.clear()
        pl.launch(h, 0x1000, 0x2000, 0x3000, 0x4000, 1.0, 0.0)
        if route == "direct":
            assert launched == [pl.expr] and pl.q.p.w == 0x2000 and pl.q.p.x == 0x1000 and pl.q.p.out == 0x3000
        else:
            assert launched == [pl.swap_plan.swap_expr, pl.expr] and pl.q.p.w == 0x4000
            assert pl.swap_plan.swap.in_ == 0x2000 and pl.swap_plan.swap.out == 0x4000
        assert not fell
        launched.clear()
        pl.launch(h, 0x1008, 0x2000, 0x3000, 0x4000, 0.5, 1.0)
        assert not launched and fell[-1] == (pl.fallback, (0x1008, 0x2000, 0x3000, 0x4000, 0.5, 1.0))
    # the maps cannot be encoded (a CPU handle's dry run): the replaced plan
    pl = _plan(h, 4, 64, 128, 9, 3, 1)
    fell.clear()
    pl.launch(h, 0x1000, 0x2000, 0x3000, 0, 1.0, 0.0)
    assert fell and fell[0][0] is pl.fallback


@pytest.mark.parametrize("bkn", [1, 2])
@pytest.mark.parametrize("bn", T.BNS)
@pytest.mark.parametrize("tag", T.TAGS)
def test_bkn_unit_compiles_without_spills(tag, bn, bkn):
    nvrtc = pytest.importorskip("pydnn._cuda.nvrtc")
    try:
        nvrtc.version()
    except Exception as e:  # noqa: BLE001 - no NVRTC here
        pytest.skip(f"no NVRTC: {e}")
    from pydnn._build import cache, manifest
    u = [u for u in manifest.family_units() if u.name == T.unit(tag, bn, bkn)][0]
    assert u.archs == ("sm_90a",) and u.exprs == (T.expr(tag, bn, bkn),)
    text, _ = cache.unit_inputs(u)
    cubin, lowered, log = nvrtc.compile_cubin(text, u.source, u.exprs, "sm_90a", ("-std=c++17", "--ptxas-options=-v"),
                                              [str(cache.ptx_dir())])
    assert cubin and set(lowered) == set(u.exprs)
    assert "spill" in log
    for line in log.splitlines():
        if "spill" in line:
            assert "0 bytes spill stores, 0 bytes spill loads" in line, line


@pytest.mark.parametrize("args, kw", [
    ((2, 72, 64, 9), dict(r=3, pad=1, stride=2, wdim=10)),        # 3x3 / 2: phases of 2x2, 2x1, 1x2, 1x1 taps
    ((3, 64, 136, 8), dict(r=3, pad=1, stride=2, mode=CONV)),     # the flip over each phase's sub-filter
    ((2, 64, 72, 9), dict(r=1, pad=0, stride=2)),                 # 1x1 / 2: 3 of 4 phases without taps (the fill)
    ((1, 128, 64, 11), dict(r=5, pad=2, stride=2)),               # 5x5 / 2: 3x3, 3x2, 2x3, 2x2 taps
    ((2, 64, 64, 13), dict(r=3, pad=2, stride=3, dil=2)),         # stride 3, dilation 2
])
def test_phases_emulated(h, rng, monkeypatch, args, kw):
    """DGRAD_TMA_PHASES: each phase of a strided backward data on fwd_tma's direct read, B through the 4-d map of
    the phase's sub-filter view (dims (C, S', R', K) and strides taken from the map itself, at the phase's filter
    offset); the phases' emulated walks placed at their dx offsets and strides, the tapless phases zero (the fill),
    equal the float64 reference of the whole strided problem."""
    from pydnn.ops.convolution import dgrad_phases as DP
    monkeypatch.setattr(tuning.conv, "DGRAD_TMA_PHASES", "always")
    monkeypatch.setitem(tuning.conv.TC_FORCE, CPb.DIR_BWD_DATA, WGM_TILE)
    kw = dict(kw)
    n, c, k, hw = args
    r, pad, stride = kw.pop("r"), kw.pop("pad"), kw["stride"]
    pl = _plan(h, n, c, k, hw, r, pad, **kw)
    assert isinstance(pl, DP.PhasePlan) and pl.subs
    assert all(isinstance(sp, T.DgradTmaPlan) and sp.swap_plan is None and sp.expr.endswith(", 2>")
               and ".tma_phase." in sp.unit_name for sp, _, _, _ in pl.subs)
    pb = pl.problem
    H, W, P, Q = pb.in3[1], pb.in3[2], pb.out3[1], pb.out3[2]
    dy = rng.integers(-3, 4, (n, k, P, Q)).astype(np.float64)
    w = rng.integers(-3, 4, (k, c, r, r)).astype(np.float64)
    wflat = w.transpose(0, 2, 3, 1).ravel()      # packed KRSC
    dx = np.full(n * H * W * c, np.nan)
    for sp, dx_off, w_off, spb in pl.subs:
        mw = sp.maps[1].map
        C_, S_, R_, K_ = mw.dims
        st = [b // 2 for b in mw.strides]        # (s, r, k) strides in elements
        assert (C_, K_) == (c, k) and mw.box == (64, 1, 1, 64)
        wsub = np.lib.stride_tricks.as_strided(wflat[w_off:], (K_, R_, S_, C_),
                                               [v * 8 for v in (st[2], st[1], st[0], 1)])
        got = _emulate(sp.sub_problem, sp.q, dy.transpose(0, 2, 3, 1), wsub, sp.bn, True)
        xs = spb.xs   # the phase's dx strides (n, c, d, h, w)
        view = np.lib.stride_tricks.as_strided(dx[dx_off:], got.shape, [v * 8 for v in (xs[0], xs[3], xs[4], xs[1])])
        assert np.isnan(view).all(), "a dx element in two phases"
        view[...] = got
    if pl.fill is not None:
        dx[np.isnan(dx)] = 0.0
    got = dx.reshape(n, H, W, c).transpose(0, 3, 1, 2)
    want = ref.backward_data_raw(w, dy, (H, W), pb.pad3[1:], pb.stride3[1:], pb.dil3[1:], 1, not pb.flip)
    assert not np.isnan(got).any(), "a dx element never written"
    np.testing.assert_array_equal(got, want)


def test_true_leaves_the_measured_losers(h, monkeypatch):
    """DGRAD_TMA True where the mid-session sweeps measured fwd_tma slower (slower_than_replaced): under a wave of
    items with <= SHORT_K K tiles over the replaced 128 x 64 tile it takes fwd_tma at the 64-wide tile (session 33:
    1.13-1.50x the kept plan), dy's K under one K tile keeps fwd_wgmma; "always" takes them at the chooser's width."""
    monkeypatch.setattr(tuning.conv, "DGRAD_TMA", True)
    for args in ((8, 512, 256, 28, 1, 0), (8, 128, 128, 28, 3, 1)):
        pl = _plan(h, *args)
        assert isinstance(pl, T.DgradTmaPlan) and pl.bn == 64 and "fwd_wgmma<" in pl.fallback.gemm_expr, args
        monkeypatch.setattr(tuning.conv, "DGRAD_TMA", "always")
        tp = _plan(h, *args)
        assert isinstance(tp, T.DgradTmaPlan) and tp.bn > 64, args
        assert T.slower_than_replaced(h, tp, pl.fallback).startswith(T.UNDER_WAVE), args
        monkeypatch.setattr(tuning.conv, "DGRAD_TMA", True)
    pl = _plan(h, 135, 88, 40, 26, 7, 3)          # dy's 40 channels: under one K tile
    assert type(pl) is CP.Plan and "fwd_wgmma<" in pl.gemm_expr
    for args in ((8, 256, 512, 28, 1, 0), (32, 512, 512, 7, 3, 1), (8, 256, 256, 14, 3, 1), (64, 64, 64, 56, 3, 1)):
        assert isinstance(_plan(h, *args), T.DgradTmaPlan), args   # measured faster (1.015-1.261x)
