"""The direct grouped tensor-core convolution (ops/convolution/grouped_direct.py, ptx/conv_grouped.cu) on
the CPU: which problems it serves (and that the rest stay on grouped.py's packed supergroups), Get..._v7
ranking it first on ResNeXt-50's grouped layers (the N = 8 stage-1 forward too, which ran the CUDA-core
implicit_gemm at 0.017x cuDNN), a numpy emulation of grouped_frag_pack's fragment words and of the
kernel's arithmetic (the halo walk with the plan's virtual-forward parameters, the block-diagonal MMAs
only) against the float64 reference for forward and stride-1 backward data, and NVRTC compiles."""
import os
import sys
from pathlib import Path

import numpy as np
import pytest

import pydnn
from pydnn import tuning
from pydnn.ops.convolution import dgrad_phases as D, grouped as G, grouped_direct as GD, plans as P, problem as Pb
from pydnn.reference import convolution as ref

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools"))
from plan_digest import cpu_handle, descriptors  # noqa: E402

BF16, F16, F32 = pydnn.PYDNN_DATA_BFLOAT16, pydnn.PYDNN_DATA_HALF, pydnn.PYDNN_DATA_FLOAT
XCORR, CONV = pydnn.PYDNN_CROSS_CORRELATION, pydnn.PYDNN_CONVOLUTION
FWD_PRE = pydnn.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM
BWD_D1, BWD_F1 = pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_1, pydnn.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_1

RESNEXT = [(128, 56, 1), (256, 28, 1), (512, 14, 1), (1024, 7, 1), (256, 56, 2), (512, 28, 2), (1024, 14, 2)]


@pytest.fixture(autouse=True)
def _direct_always(monkeypatch):
    """These tests cover the direct kernels wherever they apply (the model may prefer grouped.py's packed
    plan on some layers: test_model_picks_the_lower_estimate)."""
    from pydnn import tuning
    monkeypatch.setattr(tuning.conv, "GROUPED_DIRECT_ALWAYS", True)


def _descs(c, k, hw, groups, stride=1, dtype=BF16, n=32, nhwc=True, filt=3, mode=XCORR, pad=None, dil=1,
           fnhwc=True):
    hw = list(hw) if isinstance(hw, (tuple, list)) else [hw, hw]
    pad = [filt // 2 * dil] * 2 if pad is None else list(pad)
    p = (dtype, nhwc, fnhwc, n, c, k, groups, hw, [filt, filt], pad, [stride, stride], [dil, dil], mode,
         pydnn.PYDNN_DEFAULT_MATH)
    return descriptors(p)


@pytest.mark.parametrize("arch,sms", [("sm_90", 132), ("sm_80", 108)])
@pytest.mark.parametrize("n", [8, 32, 128])
@pytest.mark.parametrize("c,hw,stride", RESNEXT)
def test_resnext_layers_rank_the_direct_kernel_first(arch, sms, n, c, hw, stride):
    conv, x, w, y = _descs(c, c, hw, 32, stride, n=n)
    h = cpu_handle(arch, sms)
    top = pydnn.get_convolution_forward_algorithm_v7(h, x, w, conv, y, 16)[0]
    assert top.algo == FWD_PRE and top.determinism == pydnn.PYDNN_DETERMINISTIC
    pl = P.new_plan(h, Pb.DIR_FWD, FWD_PRE, conv, x, w, y)
    assert type(pl) is GD.GroupedDirectPlan
    assert pl.grid[1] == c // 64 and pl.workspace >= pl.frag_bytes > 0
    assert pl.k_parts == (2 if c // 32 == 32 else 1)
    wide = stride == 1 and hw // stride > 8 and n * -(-hw // 8) * -(-hw // 16) * (c // 64) >= sms
    assert pl.tile == ((8, 16) if wide else (8, 8))
    if pl.stages > 2:   # the large strided forwards: one block a SM, a deeper ring
        assert stride == 2 and pl.resident == 1 and pl.smem <= GD.ring_smem(arch) and pl.gemm.gn == pl.stages
    else:
        assert pl.smem <= (113 if stride == 2 else 75) * 1024   # 3 blocks a SM (2 for the stride-2 halos)
    top = pydnn.get_convolution_backward_data_algorithm_v7(h, w, y, conv, x, 16)[0]
    assert top.algo == BWD_D1
    pl = P.new_plan(h, Pb.DIR_BWD_DATA, BWD_D1, conv, x, w, y)
    assert type(pl) is GD.GroupedDirectPlan and tuple(pl.gemm.pad[1:]) == (1, 1)
    assert pl.mode == (stride == 2) and (stride == 1 or pl.tile == GD.TILE2)
    top = pydnn.get_convolution_backward_filter_algorithm_v7(h, x, y, conv, w, 16)[0]
    assert top.algo == BWD_F1 and top.determinism == pydnn.PYDNN_DETERMINISTIC
    assert type(P.new_plan(h, Pb.DIR_BWD_FILTER, BWD_F1, conv, x, w, y)) is GD.GroupedWgradPlan


def test_where_the_direct_kernel_passes():
    h = cpu_handle("sm_90", 132)
    for args, why in (((256, 512, 14, 32), "C/g == K/g"),              # C/g 8, K/g 16
                      ((256, 256, 14, 4), "C/g == K/g"),               # 64
                      ((96, 96, 14, 4), "C/g == K/g"),                 # 24
                      ((32, 32, 14, 4), "multiple of 64")):            # C/g 8 but C 32
        conv, x, w, y = _descs(*args)
        assert why in GD.refusal(Pb.problem(conv, x, w, y), Pb.DIR_FWD)
        pl = P.new_plan(h, Pb.DIR_FWD, FWD_PRE, conv, x, w, y)
        assert type(pl) is not GD.GroupedDirectPlan
    conv, x, w, y = _descs(256, 256, 14, 32, nhwc=False)   # NCHW data: refused (channels not contiguous)
    assert "contiguous" in GD.refusal(Pb.problem(conv, x, w, y), Pb.DIR_FWD)
    conv, x, w, y = _descs(256, 256, 14, 32, dtype=F32)
    assert GD.refusal(Pb.problem(conv, x, w, y), Pb.DIR_FWD) is not None
    # the switch off: grouped.py's packed supergroups, as before
    conv, x, w, y = _descs(256, 256, 28, 32)
    with tuning.override({"conv.GROUPED_DIRECT": False}):
        assert type(P.new_plan(h, Pb.DIR_FWD, FWD_PRE, conv, x, w, y)) is G.GroupedPlan
        assert type(P.new_plan(h, Pb.DIR_BWD_DATA, BWD_D1, conv, x, w, y)) is G.GroupedPlan
        assert type(P.new_plan(h, Pb.DIR_BWD_FILTER, BWD_F1, conv, x, w, y)) is G.GroupedPlan
    assert type(P.new_plan(h, Pb.DIR_BWD_FILTER, BWD_F1, conv, x, w, y)) is GD.GroupedWgradPlan


# ----------------------------------------------------------------------------- emulation

def emulate_pack(w, c, flip, transpose):
    """grouped_frag_pack's words as (cb, tap, j, nk, lane, reg, half) float64 values; w (K, C/g, R, S)."""
    k, _, R, S = w.shape
    nk_n = GD.nk(c)
    cb, tap, j, nk, lane, reg, h = np.indices((k // 64, R * S, 8, nk_n, 32, 2, 2))
    kc = 2 * (j // 4) + nk if nk_n == 2 else j // 2
    o = cb * 64 + 8 * j + lane // 4
    ci = cb * 64 + kc * 16 + 2 * (lane % 4) + 8 * reg + h
    r, s = tap // S, tap % S
    fl = flip != transpose
    tr, ts = (R - 1 - r, S - 1 - s) if fl else (r, s)
    same = ci // c == o // c
    if transpose:
        v = w[np.where(same, ci, 0), o % c, tr, ts]
    else:
        v = w[o, np.where(same, ci % c, 0), tr, ts]
    return np.where(same, v, 0.0)


def emulate_kernel(pl, xin, words):
    """grouped_direct_tc's arithmetic with the plan's ConvParams: xin (N, C, IH, IW) float64 -> (N, C, OH, OW).
    Per block tile: the halo origin (oh0 * stride - pad), each output pixel's tap offset into it, and per
    n8 chunk j only the k16 chunks the kernel multiplies."""
    p = pl.gemm
    n, C = xin.shape[:2]
    IH, IW, OH, OW = p.in_size[1], p.in_size[2], p.out_size[1], p.out_size[2]
    assert xin.shape[2:] == (IH, IW)
    R, S = p.filt[1], p.filt[2]
    sh, sw, dh, dw, ph, pw = p.stride[1], p.stride[2], p.dil[1], p.dil[2], p.pad[1], p.pad[2]
    TH, TW = pl.tile
    HH, HW = (TH - 1) * sh + (R - 1) * dh + 1, (TW - 1) * sw + (S - 1) * dw + 1
    if pl.mode == 1:
        HH, HW = (TH - 1 + (R - 1) * dh) // 2 + 2, (TW - 1 + (S - 1) * dw) // 2 + 2
    nk_n = pl.k_parts
    # B[cb, tap, j, nk] as 16 x 8 (k x n): word (lane, reg, half) holds k = 2 (lane % 4) + 8 reg + half, n = lane / 4
    B = np.zeros(words.shape[:4] + (16, 8))
    lane, reg, h = np.indices((32, 2, 2))
    B[..., 2 * (lane % 4) + 8 * reg + h, lane // 4] = words[..., lane, reg, h]
    out = np.full((n, C, OH, OW), np.nan)
    th_n, tw_n = -(-OH // TH), -(-OW // TW)
    assert pl.tiles == n * th_n * tw_n and pl.grid[1:] == (C // 64, 1) and 1 <= pl.grid[0] <= pl.tiles
    per = -(-pl.tiles // pl.grid[0])   # the persistent walk: block b's tiles b, b + grid.x, ... cover all once
    assert sorted(t for b in range(pl.grid[0]) for t in range(b, pl.tiles, pl.grid[0])) == list(range(pl.tiles))
    assert per * pl.grid[0] >= pl.tiles
    for img in range(n):
        for ti in range(th_n):
            for tj in range(tw_n):
                oh0, ow0 = ti * TH, tj * TW
                ih0, iw0 = oh0 * sh - ph, ow0 * sw - pw
                if pl.mode == 1:   # the first dy row / column of the halo (floor division)
                    ih0, iw0 = (oh0 + ph - (R - 1) * dh) // 2, (ow0 + pw - (S - 1) * dw) // 2
                halo = np.zeros((HH, HW, C))
                for hy in range(HH):
                    for hx in range(HW):
                        ih, iw = ih0 + hy, iw0 + hx
                        if 0 <= ih < IH and 0 <= iw < IW:
                            halo[hy, hx] = xin[img, :, ih, iw]
                if pl.mode == 1:
                    _mode1_tile(out[img], halo, B, nk_n, (oh0, ow0), (ih0, iw0), (R, S), (ph, pw), (dh, dw),
                                (OH, OW))
                    continue
                oy, ox = np.divmod(np.arange(TH * TW), TW)
                acc = np.zeros((TH * TW, C))
                for r in range(R):
                    for s in range(S):
                        A = halo[oy * sh + r * dh, ox * sw + s * dw]   # (pixels, C)
                        for cb in range(C // 64):
                            for j in range(8):
                                for nk in range(nk_n):
                                    kc = 2 * (j // 4) + nk if nk_n == 2 else j // 2
                                    a = A[:, cb * 64 + kc * 16: cb * 64 + kc * 16 + 16]
                                    acc[:, cb * 64 + 8 * j: cb * 64 + 8 * j + 8] += a @ B[cb, r * S + s, j, nk]
                for pm in range(TH * TW):
                    oh, ow = oh0 + oy[pm], ow0 + ox[pm]
                    if oh < OH and ow < OW:
                        out[img, :, oh, ow] = acc[pm]
    return out


def _kc_chunks(nk_n, j):
    return [(2 * (j // 4) + nk if nk_n == 2 else j // 2, nk) for nk in range(nk_n)]


def _mode1_tile(out, halo, B, nk_n, origin, h0, filt, pad, dil, size):
    """grouped_direct_tc MODE 1 on one 8 x 16 dx tile: warp (py, px) its phase's 32 pixels, the fragment
    taps (r, s) = the filter's (R - 1 - r, S - 1 - s) whose parity matches, dy halo rows (hy2 - rr * dil) / 2."""
    (oh0, ow0), (ih0, iw0), (R, S), (ph, pw), (dh, dw), (OH, OW) = origin, h0, filt, pad, dil, size
    C = halo.shape[2]
    pm = np.arange(32)
    for warp in range(4):
        py, px = warp >> 1, warp & 1
        ly, lx = 2 * (pm >> 3) + py, 2 * (pm & 7) + px
        hy2, hx2 = oh0 + ly + ph - 2 * ih0, ow0 + lx + pw - 2 * iw0
        acc = np.zeros((32, C))
        for r in range(R):
            rr = R - 1 - r
            if (py + oh0 + ph - rr * dh) & 1:
                continue
            for s in range(S):
                ss = S - 1 - s
                if (px + ow0 + pw - ss * dw) & 1:
                    continue
                assert ((hy2 - rr * dh) % 2 == 0).all() and ((hx2 - ss * dw) % 2 == 0).all()
                hy, hx = (hy2 - rr * dh) >> 1, (hx2 - ss * dw) >> 1
                assert hy.min() >= 0 and hy.max() < halo.shape[0] and hx.min() >= 0 and hx.max() < halo.shape[1]
                A = halo[hy, hx]
                for cb in range(C // 64):
                    for j in range(8):
                        for kc, nk in _kc_chunks(nk_n, j):
                            acc[:, cb * 64 + 8 * j: cb * 64 + 8 * j + 8] += \
                                A[:, cb * 64 + kc * 16: cb * 64 + kc * 16 + 16] @ B[cb, r * S + s, j, nk]
        for i in range(32):
            oh, ow = oh0 + ly[i], ow0 + lx[i]
            if oh < OH and ow < OW:
                out[:, oh, ow] = acc[i]


EMU = [  # c (= k), groups, hw, stride, filt, pad, dil, mode, n
    (128, 32, (9, 7), 1, 3, None, 1, XCORR, 2),      # C/g 4 (ResNeXt stage 1)
    (256, 32, (5, 11), 1, 3, None, 1, CONV, 1),      # 8, convolution mode
    (128, 8, (10, 9), 2, 3, None, 1, XCORR, 1),      # 16, stride 2 (forward)
    (128, 4, (6, 5), 1, 3, None, 1, CONV, 1),        # 32 (NK 2), convolution mode
    (64, 2, (7, 9), 1, 3, (2, 0), 2, XCORR, 1),      # 32, dilation 2, asymmetric padding
    (128, 16, (12, 18), 1, 1, None, 1, XCORR, 1),    # 1x1 (two 8 x 16 tiles a row)
    (64, 8, (9, 9), 1, 5, (1, 2), 1, XCORR, 1),      # 5x5, padding < R // 2
    (128, 32, (17, 21), 2, 3, None, 1, XCORR, 1),    # stride 2 (backward data MODE 1), partial tiles
    (128, 4, (18, 35), 2, 3, None, 1, CONV, 1),      # 32 (NK 2), stride 2, convolution mode
    (64, 8, (13, 19), 2, 5, (2, 1), 1, XCORR, 1),    # 5x5 stride 2, uneven padding
    (64, 16, (15, 16), 2, 3, (2, 2), 2, CONV, 1),    # stride 2 with dilation 2
    (64, 4, (12, 9), 2, 1, (0, 0), 1, XCORR, 1),     # 1x1 stride 2 (taps for one phase only)
    (64, 4, (11, 12), 2, 4, (1, 2), 1, XCORR, 1),    # even filter, stride 2
]


@pytest.mark.parametrize("case", EMU, ids=[f"c{e[0]}g{e[1]}s{e[3]}f{e[4]}" for e in EMU])
def test_emulated_forward_and_backward_data_match_reference(case):
    c, groups, hw, stride, filt, pad, dil, mode, n = case
    conv, x, w, y = _descs(c, c, hw, groups, stride, n=n, filt=filt, mode=mode, pad=pad, dil=dil)
    h = cpu_handle("sm_90", 132)
    rng = np.random.default_rng(7)
    pb = Pb.problem(conv, x, w, y)
    cg = c // groups
    wv = rng.standard_normal((c, cg, filt, filt))
    xv = rng.standard_normal((n, c) + tuple(pb.in3[1:]))
    dyv = rng.standard_normal((n, c) + tuple(pb.out3[1:]))
    padv, stv, dilv = pb.pad3[1:], pb.stride3[1:], pb.dil3[1:]
    cross = mode == XCORR
    pl = P.new_plan(h, Pb.DIR_FWD, FWD_PRE, conv, x, w, y)
    assert type(pl) is GD.GroupedDirectPlan
    got = emulate_kernel(pl, xv, emulate_pack(wv, cg, not cross, False))
    want = ref.forward_raw(xv, wv, padv, stv, dilv, groups, cross)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
    if stride in (1, 2):
        pl = P.new_plan(h, Pb.DIR_BWD_DATA, BWD_D1, conv, x, w, y)
        assert type(pl) is GD.GroupedDirectPlan and pl.mode == (stride == 2)
        got = emulate_kernel(pl, dyv, emulate_pack(wv, cg, not cross, True))
        want = ref.backward_data_raw(wv, dyv, tuple(pb.in3[1:]), padv, stv, dilv, groups, cross)
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


def test_pack_flags_and_sizes():
    conv, x, w, y = _descs(256, 256, 14, 32, mode=CONV)
    h = cpu_handle("sm_90", 132)
    pl = P.new_plan(h, Pb.DIR_FWD, FWD_PRE, conv, x, w, y)
    assert pl.pack.flags == Pb.FLAG_FLIP and pl.pack.channels == 256 and pl.pack.cg == 8
    assert pl.frag_bytes == 4 * 9 * 2048 and pl.steps[0][2] == (pl.frag_bytes // 4 // 256, 1, 1)
    pl = P.new_plan(h, Pb.DIR_BWD_DATA, BWD_D1, conv, x, w, y)
    assert pl.pack.flags == Pb.FLAG_FLIP | GD.PACK_TRANSPOSE


# ----------------------------------------------------------------------------- NVRTC

def _nvrtc_ok():
    try:
        from pydnn._cuda import nvrtc
        nvrtc.version()
        return True
    except Exception:  # noqa: BLE001
        return False


@pytest.mark.skipif(not _nvrtc_ok() or os.environ.get("PYDNN_SKIP_SLOW_COMPILE") == "1", reason="no NVRTC")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("tag", ["bf16", "f16"])
@pytest.mark.parametrize("which", ["k1", "k2", "wgrad"])
def test_grouped_direct_unit_compiles(arch, tag, which):
    """Every instantiation compiles (NVRTC, no GPU needed) and lowers to a name."""
    from pydnn._build.build import compile_unit
    name, want = ((GD.wunit(tag), GD.wexprs(tag)) if which == "wgrad"
                  else (GD.unit(tag, int(which[1])), GD.exprs(tag, int(which[1]))))
    unit = [u for u in P.kernel_units(name) if u.name == name][0]
    assert list(unit.exprs) == want
    cubin, lowered = compile_unit(unit, arch)
    assert len(cubin) > 0 and all(e in lowered for e in unit.exprs)


@pytest.mark.parametrize("mode", [XCORR, CONV])
@pytest.mark.parametrize("case", [(128, 32, (9, 8), 3, 1), (256, 8, (7, 10), 3, 1), (64, 2, (11, 9), 5, 2)],
                         ids=["c128g32", "c256g8f3", "c64g2f5"])
def test_emulated_strided_backward_data_phases_match_reference(case, mode):
    """Stride 3 (MODE 1 serves 2 x 2 only): dgrad_phases' stride-1 phases, each a direct plan over its
    sub-filter view (w offset, strides x the tap step) and its dx view; the phases without taps are the
    fill's zeros."""
    c, groups, hw, filt, pad = case
    conv, x, w, y = _descs(c, c, hw, groups, 3, n=1, filt=filt, mode=mode, pad=(pad, pad))
    h = cpu_handle("sm_90", 132)
    pl = P.new_plan(h, Pb.DIR_BWD_DATA, BWD_D1, conv, x, w, y)
    assert type(pl) is D.PhasePlan
    pb = pl.problem
    rng = np.random.default_rng(3)
    cg = c // groups
    wv = rng.standard_normal((c, cg, filt, filt))
    dyv = rng.standard_normal((1, c) + tuple(pb.out3[1:]))
    flat = np.zeros(c * cg * filt * filt)
    k_, c_, r_, s_ = np.indices(wv.shape)
    flat[k_ * pb.ws[0] + c_ * pb.ws[1] + r_ * pb.ws[3] + s_ * pb.ws[4]] = wv
    dx = np.zeros((1, c) + tuple(pb.in3[1:]))
    xs = pb.xs
    for sp, dx_off, w_off, spb in pl.subs:
        assert type(sp) is GD.GroupedDirectPlan
        fr, fs = spb.filt3[1:]
        k_, c_, r_, s_ = np.indices((c, cg, fr, fs))
        subw = flat[w_off + k_ * spb.ws[0] + c_ * spb.ws[1] + r_ * spb.ws[3] + s_ * spb.ws[4]]
        got = emulate_kernel(sp, dyv, emulate_pack(subw, cg, spb.flip, True))
        oh, ow = dx_off // xs[3], dx_off % xs[3] // xs[4]
        dx[:, :, oh::3, ow::3] = got
    want = ref.backward_data_raw(wv, dyv, tuple(pb.in3[1:]), pb.pad3[1:], pb.stride3[1:], pb.dil3[1:], groups,
                                 mode == XCORR)
    np.testing.assert_allclose(dx, want, rtol=1e-10, atol=1e-10)


# the GPU test's cases (test_convolution_grouped_direct_gpu.CASES, repeated here: that module needs a device)
GPU_CASES = [  # xdims, k, filt, pad, stride, dil, groups, filter NHWC
    ((2, 128, 13, 11), 128, (3, 3), (1, 1), (1, 1), (1, 1), 32, True),
    ((2, 256, 9, 7), 256, (3, 3), (1, 1), (1, 1), (1, 1), 32, True),
    ((3, 512, 7, 9), 512, (3, 3), (1, 1), (2, 2), (1, 1), 32, True),
    ((2, 1024, 5, 3), 1024, (3, 3), (1, 1), (1, 1), (1, 1), 32, True),
    ((2, 64, 11, 13), 64, (3, 3), (1, 1), (1, 1), (1, 1), 2, False),
    ((2, 128, 9, 19), 128, (3, 3), (2, 0), (1, 1), (2, 1), 8, False),
    ((1, 128, 20, 17), 128, (1, 1), (0, 0), (1, 1), (1, 1), 16, True),
    ((2, 64, 12, 10), 64, (5, 5), (2, 1), (2, 2), (1, 1), 8, True),
    ((2, 256, 17, 20), 256, (3, 3), (1, 1), (2, 2), (1, 1), 32, True),
    ((1, 64, 13, 14), 64, (3, 3), (1, 1), (3, 3), (1, 1), 4, True),
    ((3, 512, 11, 9), 512, (3, 3), (1, 1), (2, 2), (1, 1), 64, True),
    ((3, 2048, 5, 7), 2048, (3, 3), (1, 1), (1, 1), (1, 1), 64, True),
]


def test_gpu_cases_plan_the_direct_path():
    tiles, parts, modes, wtiles = set(), set(), set(), set()
    for arch, sms in (("sm_90", 132), ("sm_80", 108)):
        h = cpu_handle(arch, sms)
        for xd, k, filt, pad, st, dil, groups, fnhwc in GPU_CASES:
            for dtype in (BF16, F16):
                for mode in (XCORR, CONV):
                    p = (dtype, True, fnhwc, xd[0], xd[1], k, groups, list(xd[2:]), list(filt), list(pad), list(st),
                         list(dil), mode, pydnn.PYDNN_DEFAULT_MATH)
                    conv, x, w, y = descriptors(p)
                    pl = P.new_plan(h, Pb.DIR_BWD_FILTER, BWD_F1, conv, x, w, y)
                    assert type(pl) is GD.GroupedWgradPlan and pl.deterministic
                    wtiles.add((pl.tile, pl.k_parts))
                    for d, algo in ((Pb.DIR_FWD, FWD_PRE), (Pb.DIR_BWD_DATA, BWD_D1)):
                        pl = P.new_plan(h, d, algo, conv, x, w, y)
                        subs = [sp for sp, _, _, _ in pl.subs] if type(pl) is D.PhasePlan else [pl]
                        assert type(pl) is not D.PhasePlan or (d == Pb.DIR_BWD_DATA and max(st) > 1)
                        if d == Pb.DIR_FWD and max(st) > 2:   # two 24 x 24 halos exceed MAX_SMEM: packed
                            assert type(pl) is G.GroupedPlan and "shared memory" in GD.refusal(
                                Pb.problem(conv, x, w, y), d)
                            continue
                        for sp in subs:
                            assert type(sp) is GD.GroupedDirectPlan, (xd, k, groups, d)
                            assert sp.workspace > 0 and sp.deterministic
                            tiles.add(sp.tile)
                            parts.add(sp.k_parts)
                            modes.add((d, sp.mode, type(pl).__name__))
    assert tiles == set(GD.TILES) and parts == {1, 2}   # every instantiation's shape is exercised
    assert wtiles == {(t, k) for t in GD.TILES for k in (1, 2)}, wtiles
    assert modes == {(Pb.DIR_FWD, 0, "GroupedDirectPlan"), (Pb.DIR_BWD_DATA, 0, "GroupedDirectPlan"),
                     (Pb.DIR_BWD_DATA, 1, "GroupedDirectPlan"), (Pb.DIR_BWD_DATA, 0, "PhasePlan")}


# ----------------------------------------------------------------------------- backward filter

def emulate_wgrad(pl, xv, dyv):
    """grouped_wgrad_tc (per split, row block, channel block and warp w = 4 h + q: the tiles split, split +
    splits, ..., dy's tile zero outside the image, the x halo of the block's filter rows, each warp's 16
    output channels 16q.. against its 2 n8 chunks nb, nb + 1 tap by tap: C/g <= 16 nb = 2q and the k16 steps
    of parity h, the halves added at the end; C/g = 32 nb = 4 (q / 2) + 2h, every step; the diagonal
    entries written as partials [split][K][taps][C/g]) and grouped_wgrad_fold (splits added in order, the
    CONVOLUTION flip) -> dw (K, C/g, R, S)."""
    p, pb = pl.gemm, pl.problem
    n, C = xv.shape[:2]
    c = pb.cg
    IH, IW, OH, OW = p.in_size[1], p.in_size[2], p.out_size[1], p.out_size[2]
    R, S = p.filt[1], p.filt[2]
    sh, sw, dh, dw, ph, pw = p.stride[1], p.stride[2], p.dil[1], p.dil[2], p.pad[1], p.pad[2]
    TH, TW = pl.tile
    RB, row_blocks, splits = p.gk, p.gm, p.splits
    assert pl.grid == (splits * row_blocks, C // 64, 1) and RB * row_blocks == R
    assert RB * S <= GD.wgrad_max_taps(c) and 2 <= p.gn <= GD.MAX_STAGES
    assert pl.smem >= max(p.gn * GD.wgrad_stage(pl.tile, RB, (R, S), (sh, sw), (dh, dw)), GD.WGRAD_RED_BYTES)
    HH, HW = (TH - 1) * sh + (RB - 1) * dh + 1, (TW - 1) * sw + (S - 1) * dw + 1
    tiles_h, tiles_w = -(-OH // TH), -(-OW // TW)
    tiles = n * tiles_h * tiles_w
    taps = R * S
    ksteps = TH * TW // 16
    part = np.full((splits, C, taps, c), np.nan)
    ky, kx = np.divmod(np.arange(TH * TW), TW)

    def nb_of(w):
        q, hh = w & 3, w >> 2
        return 2 * q if pl.k_parts == 1 else 4 * (q >> 1) + 2 * hh

    for split in range(splits):
        for rb in range(row_blocks):
            r0 = rb * RB
            for cb in range(C // 64):
                acc = np.zeros((8, RB * S, 2, 16, 8))
                for tile in range(split, tiles, splits):
                    q = tile
                    tw_i = q % tiles_w
                    q //= tiles_w
                    th_i, img = q % tiles_h, q // tiles_h
                    oh0, ow0 = th_i * TH, tw_i * TW
                    ih0, iw0 = oh0 * sh - ph + r0 * dh, ow0 * sw - pw
                    dyt = np.zeros((TH * TW, 64))
                    ok = (oh0 + ky < OH) & (ow0 + kx < OW)
                    dyt[ok] = dyv[img][cb * 64:cb * 64 + 64][:, (oh0 + ky)[ok], (ow0 + kx)[ok]].T
                    halo = np.zeros((HH, HW, 64))
                    for hy in range(HH):
                        for hx in range(HW):
                            if 0 <= ih0 + hy < IH and 0 <= iw0 + hx < IW:
                                halo[hy, hx] = xv[img, cb * 64:cb * 64 + 64, ih0 + hy, iw0 + hx]
                    for w in range(8):
                        qw, hh = w & 3, w >> 2
                        nb = nb_of(w)
                        for ks in range(ksteps):
                            if pl.k_parts == 1 and ks % 2 != hh:
                                continue
                            sel = slice(16 * ks, 16 * ks + 16)
                            a = dyt[sel, 16 * qw:16 * qw + 16]                       # (16 pixels, 16 o)
                            for t in range(RB * S):
                                B = halo[ky[sel] * sh + (t // S) * dh, kx[sel] * sw + (t % S) * dw]   # (16, 64 ci)
                                for j in range(2):
                                    acc[w, t, j] += a.T @ B[:, 8 * (nb + j):8 * (nb + j) + 8]
                if pl.k_parts == 1:
                    acc[:4] += acc[4:]                           # warps h = 1 hand their sums over
                for w in range(4 if pl.k_parts == 1 else 8):
                    qw, nb = w & 3, nb_of(w)
                    for t in range(RB * S):
                        tap = (r0 + t // S) * S + t % S
                        for j in range(2):
                            for mi in range(16):
                                for ni in range(8):
                                    o = cb * 64 + 16 * qw + mi
                                    ci = cb * 64 + 8 * (nb + j) + ni
                                    if o // c == ci // c:
                                        part[split, o, tap, ci % c] = acc[w, t, j, mi, ni]
    assert not np.isnan(part).any(), "a partial no block writes"
    s = part.sum(axis=0)                                  # (K, taps, c)
    dwv = s.reshape(C, R, S, c).transpose(0, 3, 1, 2)
    if pb.flip:
        dwv = dwv[:, :, ::-1, ::-1]
    return dwv


WGRAD_EMU = [  # c, groups, hw, stride, filt, pad, dil, mode, n
    (128, 32, (9, 19), 1, 3, None, 1, XCORR, 2),     # C/g 4, 8 x 16 tiles, 2 images
    (256, 32, (7, 6), 2, 3, None, 1, CONV, 1),       # 8, stride 2, 8 x 8 tiles
    (128, 8, (10, 9), 1, 3, (2, 1), 2, XCORR, 1),    # 16, dilation
    (128, 4, (6, 11), 1, 3, None, 1, CONV, 1),       # 32 (NK 2: the warp pairs split the input channels)
    (128, 4, (9, 7), 2, 3, None, 1, XCORR, 3),       # 32, stride 2, odd sizes, 3 images
    (1024, 32, (5, 3), 1, 3, None, 1, CONV, 2),      # 32, few tiles: one filter row a block (the model)
    (256, 32, (9, 7), 2, 3, None, 1, XCORR, 3),      # 8, stride 2, odd sizes: one row a block
    (64, 8, (9, 9), 1, 5, (2, 2), 1, XCORR, 1),      # 8, 5x5: one row a block
    (128, 16, (12, 18), 1, 1, None, 1, XCORR, 1),    # 1x1
]


@pytest.mark.parametrize("case", WGRAD_EMU, ids=[f"c{e[0]}g{e[1]}s{e[3]}f{e[4]}" for e in WGRAD_EMU])
def test_emulated_backward_filter_matches_reference(case):
    # (the cases cover both of the model's row choices: test_emulated_cases_cover_both_row_choices)
    c, groups, hw, stride, filt, pad, dil, mode, n = case
    conv, x, w, y = _descs(c, c, hw, groups, stride, n=n, filt=filt, mode=mode, pad=pad, dil=dil)
    h = cpu_handle("sm_90", 132)
    pb = Pb.problem(conv, x, w, y)
    pl = P.new_plan(h, Pb.DIR_BWD_FILTER, BWD_F1, conv, x, w, y)
    assert type(pl) is GD.GroupedWgradPlan and pl.deterministic
    rng = np.random.default_rng(11)
    xv = rng.standard_normal((n, c) + tuple(pb.in3[1:]))
    dyv = rng.standard_normal((n, c) + tuple(pb.out3[1:]))
    got = emulate_wgrad(pl, xv, dyv)
    want = ref.backward_filter_raw(xv, dyv, (filt, filt), pb.pad3[1:], pb.stride3[1:], pb.dil3[1:], groups,
                                   mode == XCORR)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


def test_wgrad_splits_and_rows():
    h = cpu_handle("sm_90", 132)
    for c, hw, n, rows, kp in ((128, 56, 8, 3, 1), (1024, 7, 128, 1, 2), (512, 14, 32, 1, 1), (256, 28, 128, 3, 1)):
        conv, x, w, y = _descs(c, c, hw, 32, n=n)
        pl = P.new_plan(h, Pb.DIR_BWD_FILTER, BWD_F1, conv, x, w, y)
        assert type(pl) is GD.GroupedWgradPlan and pl.rows == rows and pl.k_parts == kp
        assert pl.rows * pl.row_blocks == 3 and pl.grid[0] == pl.splits * pl.row_blocks
        # the model's pick: one filter row a block where the tiles are few (fewer splits of partials), all
        # three where a tile's dy and x would be copied three times over many tiles
        other = 4 - rows
        osplits = max(1, min(-(-132 // ((3 // other) * (c // 64))), pl.tiles))
        assert GD.wgrad_model_ms(pl.problem, 132, pl.tile, rows, pl.splits) <= GD.wgrad_model_ms(
            pl.problem, 132, pl.tile, other, osplits)
        assert 1 <= pl.splits <= pl.tiles and pl.workspace >= pl.partial_bytes == pl.splits * c * 9 * (c // 32) * 4
        assert pl.grid[0] * pl.grid[1] >= 132 or pl.splits == pl.tiles
        assert pl.smem <= GD.ring_smem("sm_90") and 2 <= pl.stages <= GD.MAX_STAGES and pl.gemm.gn == pl.stages
        assert pl.stages == 2 or pl.smem == pl.stages * GD.wgrad_stage(pl.tile, rows, (3, 3), (1, 1), (1, 1))
        assert pl.stages <= -(-pl.tiles // pl.splits) + 1   # no stage for a tile the block never walks
        g = pl.fold_params.channels   # the fold's lanes an element: a power of two covering the splits, <= 32
        assert g & (g - 1) == 0 and g <= 32 and (g >= pl.splits or g == 32) and (g == 1 or g // 2 < pl.splits)
        assert pl.steps[pl.fold_step][2][0] * 256 >= c * 9 * (c // 32) * g
    conv, x, w, y = _descs(128, 128, 14, 4, filt=5)   # C/g 32, 5x5: one filter row a block
    pl = P.new_plan(h, Pb.DIR_BWD_FILTER, BWD_F1, conv, x, w, y)
    assert type(pl) is GD.GroupedWgradPlan and (pl.rows, pl.row_blocks) == (1, 5)
    conv, x, w, y = _descs(128, 128, 14, 4, filt=11)   # 11 taps a row: refused, packed path
    assert "exceeds" in GD.refusal(Pb.problem(conv, x, w, y), Pb.DIR_BWD_FILTER)
    assert type(P.new_plan(h, Pb.DIR_BWD_FILTER, BWD_F1, conv, x, w, y)) is G.GroupedPlan


def test_measured_rule_picks_direct_or_packed(monkeypatch):
    """GROUPED_DIRECT_ALWAYS off (the default): direct forward / backward data, the backward filter for C/g = 4
    and C/g = 8 at stride 1 (the 8-warp kernel); the stride-2 forwards direct while their tiles fill <= 4 rounds of the resident blocks, beyond that
    the packed plan, or with GROUPED_RING_S2 the one-block-a-SM ring (grouped_direct._direct_measured_faster's
    numbers)."""
    monkeypatch.setattr(tuning.conv, "GROUPED_DIRECT_ALWAYS", False)
    h = cpu_handle("sm_90", 132)
    for n in (8, 32, 128):
        for c, hw, stride in RESNEXT:
            conv, x, w, y = _descs(c, c, hw, 32, stride, n=n)
            cg = c // 32
            fwd = P.new_plan(h, Pb.DIR_FWD, FWD_PRE, conv, x, w, y)
            tiles = n * (-(-(hw // stride) // 8)) ** 2 * (c // 64)   # 8 x 8 tiles at stride 2
            big = stride == 2 and tiles > 4 * 3 * 132
            assert type(fwd) is (G.GroupedPlan if big else GD.GroupedDirectPlan)
            assert big or (fwd.stages == 2 and fwd.resident == 3 and fwd.smem <= 113 * 1024)
            bd = P.new_plan(h, Pb.DIR_BWD_DATA, BWD_D1, conv, x, w, y)
            assert type(bd) is GD.GroupedDirectPlan and bd.stages == 2 and bd.gemm.gn == 2
            bf = P.new_plan(h, Pb.DIR_BWD_FILTER, BWD_F1, conv, x, w, y)
            direct = cg == 4 or (cg == 8 and stride == 1)   # WGRAD_MEASURED
            assert type(bf) is (GD.GroupedWgradPlan if direct else G.GroupedPlan), (n, c, hw, stride, cg)
            assert not direct or bf.nt in (9, 3)
            if big:
                monkeypatch.setattr(tuning.conv, "GROUPED_RING_S2", True)
                fwd = P.new_plan(h, Pb.DIR_FWD, FWD_PRE, conv, x, w, y)
                assert type(fwd) is GD.GroupedDirectPlan and fwd.stages > 2 and fwd.resident == 1
                assert fwd.smem <= GD.ring_smem("sm_90")
                monkeypatch.setattr(tuning.conv, "GROUPED_RING_S2", False)


@pytest.mark.parametrize("stages", [2, 3, 4, 5, 6])
def test_ring_schedule(stages):
    """The ring of grouped_direct_tc / grouped_wgrad_tc, replayed: the prologue copies tiles 0 .. NS - 2 into
    stages 0 .. NS - 2, iteration i copies tile i + NS - 1 into the stage iteration i - 1 computed from (the
    trailing __syncthreads protects it), waits until at most NS - 1 commit groups are pending
    (cp_async_wait_pending) and computes stage i % NS: that stage holds tile i, its group has landed, and no
    copy is ever issued into the stage being computed."""
    for tiles in range(1, 3 * stages + 3):
        holds, groups, done = {}, [], set()
        for i in range(stages - 1):   # the prologue (an empty group where the tile does not exist)
            groups.append(i if i < tiles else None)
            if i < tiles:
                holds[i] = i
        buf = 0
        for i in range(tiles):
            ahead = i + stages - 1
            dst = stages - 1 if buf == 0 else buf - 1
            assert dst != buf
            groups.append(ahead if ahead < tiles else None)
            if ahead < tiles:
                assert dst not in holds or holds[dst] < i   # only a stage already computed is overwritten
                holds[dst] = ahead
            pending = stages - 1   # wait_group: all but the newest NS - 1 groups complete
            done |= {g for g in groups[:len(groups) - pending] if g is not None}
            assert holds[buf] == i and i in done
            buf = buf + 1 if buf + 1 < stages else 0


def test_wgrad_kernels_compile_without_spills():
    """The 8-warp backward filter keeps its 9 x 2 x 4 sums a lane in registers (ptxas sm_90: no stack frame,
    no spills; one block of 256 threads a SM allows 255 registers)."""
    import re
    if not _nvrtc_ok() or os.environ.get("PYDNN_SKIP_SLOW_COMPILE") == "1":
        pytest.skip("no NVRTC")
    from pydnn._build import cache
    from pydnn._build.manifest import COMMON_OPTIONS
    from pydnn._cuda import nvrtc
    name = GD.wunit("bf16")
    unit = [u for u in P.kernel_units(name) if u.name == name][0]
    text, _ = cache.unit_inputs(unit)
    _, _, log = nvrtc.compile_cubin(text, unit.source, unit.exprs, "sm_90",
                                    COMMON_OPTIONS + ("--ptxas-options=-v",), [str(cache.ptx_dir())])
    frames = re.findall(r"(\d+) bytes stack frame, (\d+) bytes spill stores", log)
    assert len(frames) == len(unit.exprs)
    assert all(int(a) == 0 and int(b) == 0 for a, b in frames), frames


def test_emulated_cases_cover_both_row_choices():
    h = cpu_handle("sm_90", 132)
    rows = set()
    for c, groups, hw, stride, filt, pad, dil, mode, n in WGRAD_EMU:
        if filt == 3:
            conv, x, w, y = _descs(c, c, hw, groups, stride, n=n, filt=filt, mode=mode, pad=pad, dil=dil)
            rows.add(P.new_plan(h, Pb.DIR_BWD_FILTER, BWD_F1, conv, x, w, y).rows)
    assert rows == {1, 3}


def test_wgrad_compile_time_taps():
    """The 8-warp backward filter's NT: 9 for a 3x3 block of all rows, 3 for one row of 3, else 0 (the tap
    count at run time); the expression names it and the unit holds every (NT, NK, tile)."""
    h = cpu_handle("sm_90", 132)
    seen = set()
    for c, groups, hw, stride, filt, pad, dil, mode, n in WGRAD_EMU:
        conv, x, w, y = _descs(c, c, hw, groups, stride, n=n, filt=filt, mode=mode, pad=pad, dil=dil)
        pl = P.new_plan(h, Pb.DIR_BWD_FILTER, BWD_F1, conv, x, w, y)
        want = pl.rows * filt if pl.rows * filt in (9, 3) else 0
        assert pl.nt == want and pl.gemm_expr.endswith(f", {want}>")
        assert pl.gemm_expr in GD.wexprs("bf16")
        seen.add(pl.nt)
    assert seen == {9, 3, 0}
