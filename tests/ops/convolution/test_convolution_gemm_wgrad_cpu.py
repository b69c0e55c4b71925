"""The explicit-GEMM backward filter (BWD_FILTER_ALGO_3) and the direct 1x1 backward data (BWD_DATA_ALGO_1's
explicit GEMM without col2im), pydnn/ops/convolution_gemm.py, on the CPU: every launch of a plan emulated from
its real parameter structs (im2col, pack_rows, matmul's operands as its plan addresses them, wgrad_fold in
its fixed order) against the float64 reference over odd shapes, strides, padding, dilation, 1-d / 3-d,
NCHW / NHWC / padded layouts, both filter formats, both modes, alpha / beta, chunks of images; the plan each
problem gets, exact workspace sizes, refusals with their reasons, and the v7 ranking of the ResNet-50 layers."""
import numpy as np
import pytest

import pydnn
from pydnn import tuning
from pydnn.ops.convolution import implicit as CI, plans as CP, problem as CPb, tensor_core as CT
from pydnn.ops.convolution import gemm as G
from pydnn.reference import convolution as ref
from test_convolution_cpu import (BF16, CONV, F32, F64, NCHW, NHWC, NS, XCORR, _check, _gather_tensor, _scatter,
                                  _val, cdesc, fdesc, tdesc)
from test_convolution_gemm_cpu import ITEM, _problem, emulate_im2col_padded, emulate_matmul
from test_fuzz_cpu import cpu_handle

BWD_F3 = pydnn.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_3
BWD_F1 = pydnn.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_1
BWD_D1 = pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_1


def emulate_pack_rows(p, buf):
    """pack_rows: out[ch * out_ld + img * rows + pos] = in[img * s_img + ch * s_ch + pos * s_pos]."""
    c, n, pos = np.meshgrid(np.arange(p.ch), np.arange(p.imgs), np.arange(p.rows), indexing="ij")
    out = np.zeros(p.ch * p.out_ld)
    out[c * p.out_ld + n * p.rows + pos] = buf[n * p.s_img + c * p.s_ch + pos * p.s_pos]
    return out


def emulate_fold(f, part, dwbuf, alpha, beta):
    """wgrad_fold: each dw element the sum of its partials in ascending order, decoded through the column
    order, written through dw's strides."""
    filt, ws = _val(f.filt), _val(f.ws)
    k, j = np.meshgrid(np.arange(f.k), np.arange(f.cols), indexing="ij")
    s = np.zeros(k.shape)
    for t in range(f.parts):
        s = s + part[t * f.part_stride + k * f.ks + j * f.js]
    tap, c = (j // f.cg, j % f.cg) if f.cin_inner else (j % f.taps, j // f.taps)
    t0, t1, t2 = tap // (filt[1] * filt[2]), (tap // filt[2]) % filt[1], tap % filt[2]
    off = k * ws[0] + c * ws[1] + t0 * ws[2] + t1 * ws[3] + t2 * ws[4]
    assert len(np.unique(off)) == off.size, "two dw elements share an address"
    dwbuf[off] = alpha * s + (beta * dwbuf[off] if f.flags & G.FLAG_WF_BETA else 0.0)


def emulate_implicit(p, grid, xb, dyb, part):
    """wgrad_implicit from its parameters: block (slot, column tile, K tile) sums dy[k][pixel] * x at column
    j's tap of the pixel (zero in the padding) over its slot's pixels, decoded as the kernel decodes them
    (32-bit offsets: checked), into part[slot * part_stride + k * cols + j] for its 64 k's x 160 columns."""
    filt, pad, st, dil = _val(p.filt), _val(p.pad), _val(p.stride), _val(p.dil)
    insz, out, xs, ys = _val(p.in_size), _val(p.out_size), _val(p.xs), _val(p.ys)
    assert grid[1] * G.WI_JT >= p.cols and grid[2] * G.WI_KT >= p.k and p.per_slot % G.WI_BK == 0
    assert (grid[0] - 1) * p.per_slot < p.npix <= grid[0] * p.per_slot   # every slot has pixels
    flip = bool(p.flags & G.FLAG_FLIP)
    for ct in range(grid[1]):
        j = np.arange(ct * G.WI_JT, min((ct + 1) * G.WI_JT, p.cols))
        tap, c = (j // p.cg, j % p.cg) if p.cin_inner else (j % p.taps, j // p.taps)
        t = [tap // (filt[1] * filt[2]), (tap // filt[2]) % filt[1], tap % filt[2]]
        cd = [((filt[i] - 1 - t[i]) if flip else t[i]) * dil[i] for i in range(3)]
        coff = c * xs[1] + cd[0] * xs[2] + cd[1] * xs[3] + cd[2] * xs[4]
        for slot in range(grid[0]):
            pix = np.arange(slot * p.per_slot, min((slot + 1) * p.per_slot, p.npix))
            o2, r = pix % out[2], pix // out[2]
            o1, r = r % out[1], r // out[1]
            o0, n = r % out[0], r // out[0]
            org = [o0 * st[0] - pad[0], o1 * st[1] - pad[1], o2 * st[2] - pad[2]]
            xoff = n * xs[0] + org[0] * xs[2] + org[1] * xs[3] + org[2] * xs[4]
            ok = np.ones((pix.size, j.size), bool)
            for i in range(3):
                pos = org[i][:, None] + cd[i][None, :]
                ok &= (pos >= 0) & (pos < insz[i])
            off = xoff[:, None] + coff[None, :]
            assert np.abs(off).max() < 2**31
            col = np.where(ok, xb[np.where(ok, off, 0)], 0.0)
            for kt in range(grid[2]):
                k = np.arange(kt * G.WI_KT, min((kt + 1) * G.WI_KT, p.k))
                doff = (n * ys[0] + o0 * ys[2] + o1 * ys[3] + o2 * ys[4])[:, None] + k[None, :] * ys[1]
                assert doff.max() < 2**31
                blk = dyb[doff].T @ col      # [k x j] of this block
                part[slot * p.part_stride + k[:, None] * p.cols + j[None, :]] = blk


def run_wgrad(pl, xb, dyb, dwb, alpha, beta, item):
    """The plan's launches in order: per chunk of images im2col / pack_rows / the GEMMs into the partials
    (beta 1 for per-image plans' later chunks), then the fold; the implicit variant's one kernel, then the
    fold."""
    pb = pl.problem
    ws = np.full(pl.workspace // item, np.nan)   # never-written workspace reads poison the result
    if pl.implicit:
        unit, expr, grid, block, p = pl.steps[pl.gather][:5]
        assert expr == G._implicit_expr(G.WI_MINB) and block == (G.WI_THREADS, 1, 1)
        emulate_implicit(p, grid, xb, dyb, ws[pl.part_off // item:])
        pl.chunks = []
    for n0, kind, slot0, first in pl.chunks:
        base = {"dy": (dyb, n0 * pb.ys[0]), "x": (xb, n0 * pb.xs[0]), "col": (ws, pl.col_off // item),
                "pack": (ws, pl.pack_off // item)}
        im2col, pack, gemms = pl.kinds[kind]
        if im2col is not None:
            col = emulate_im2col_padded(pl.steps[im2col][4], xb[n0 * pb.xs[0]:])
            ws[pl.col_off // item:pl.col_off // item + col.size] = col
        if pack is not None:
            q = pl.steps[pack][4]
            packed = emulate_pack_rows(q, dyb[n0 * pb.ys[0]:])
            ws[pl.pack_off // item:pl.pack_off // item + packed.size] = packed
        for mp, a, aoff, b, boff, slot in gemms:
            abuf, a0 = base[a]
            bbuf, b0 = base[b]
            c0 = pl.part_off // item + (slot0 + slot) * pl.slot
            emulate_matmul(mp, abuf[a0 + aoff:].copy(), bbuf[b0 + boff:].copy(), ws[c0:], 1.0, 0.0 if first else 1.0)
    f = pl.steps[pl.fold][4]
    f.flags = (f.flags & ~G.FLAG_WF_BETA) | (G.FLAG_WF_BETA if beta else 0)
    emulate_fold(f, ws[pl.part_off // item:], dwb, alpha, beta)


WGRAD_CASES = [  # xdims, k, filt, pad, stride, dil, layout, filter format
    ((2, 3, 13, 11), 5, (7, 7), (3, 3), (2, 2), (1, 1), "nchw", NCHW),       # a stem: dy packed channel-major
    ((3, 3, 13, 11), 6, (7, 7), (3, 3), (2, 2), (1, 1), "nhwc", NHWC),       # NHWC dy: its rows as they are
    ((2, 5, 7, 9), 3, (3, 2), (1, 0), (2, 3), (1, 2), "nchw", NHWC),         # dilation, odd strides
    ((1, 6, 5, 7), 9, (1, 1), (0, 0), (1, 1), (1, 1), "nchw", NCHW),         # 1x1 NCHW: x itself, per image
    ((3, 6, 5, 7), 9, (1, 1), (0, 0), (1, 1), (1, 1), "nchw", NHWC),
    ((2, 20, 5, 7), 70, (1, 1), (0, 0), (1, 1), (1, 1), "nchw", NCHW),      # K > C: the partials transposed
    ((2, 6, 5, 7), 4, (1, 1), (0, 0), (1, 1), (1, 1), "nhwc", NHWC),         # 1x1 NHWC: one flat reduction
    ((2, 6, 5, 7), 4, (1, 1), (0, 0), (2, 2), (1, 1), "nhwc", NCHW),         # 1x1 stride 2: im2col
    ((2, 5, 6, 7), 7, (1, 1), (0, 0), (1, 1), (1, 1), "gapx", NCHW),         # padded x: im2col of a 1x1
    ((2, 3, 11), 4, (3,), (1,), (2,), (1,), "nchw", NHWC),                    # 1-d
    ((1, 3, 4, 5, 6), 4, (2, 3, 2), (1, 1, 0), (1, 2, 2), (2, 1, 1), "nhwc", NCHW),   # 3-d
    ((3, 20, 4, 4), 70, (3, 3), (1, 1), (1, 1), (1, 1), "nchw", NCHW),       # K > C: the partials transposed
]


def _wgrad_problem(case, mode, rng, dtype):
    """_problem, except that layout "gapx" pads x only (dy packed NCHW)."""
    if case[6] != "gapx":
        return _problem(case, mode, rng, dtype)
    c, dims, (xs, ws, ys), (xsize, ysize), (xdsc, wdsc, ydsc) = _problem(case[:6] + ("nchw",) + case[7:], mode,
                                                                        rng, dtype)
    from test_convolution_cpu import _strided
    xs, xsize = _strided(dims[0], "gap", rng)
    return c, dims, (xs, ws, ys), (xsize, ysize), (tdesc(dims[0], dtype, strides=xs), wdsc, ydsc)


def _check_wgrad(h, case, mode, dtype, rng, alphas=((1.0, 0.0), (-0.5, 0.75))):
    c, (xd, wd, yd), (xs, ws, ys), (xsize, ysize), (xdsc, wdsc, ydsc) = _wgrad_problem(case, mode, rng, dtype)
    x, dy, dw0 = rng.standard_normal(xd), rng.standard_normal(yd), rng.standard_normal(wd)
    xb, dyb = _scatter(x, xs, xsize), _scatter(dy, ys, ysize)
    pl = CP.new_plan(h, CPb.DIR_BWD_FILTER, BWD_F3, c, xdsc, wdsc, ydsc)
    assert isinstance(pl, G.WgradGemmPlan) and pl.deterministic
    assert pl.workspace == pydnn.get_convolution_backward_filter_workspace_size(h, xdsc, ydsc, c, wdsc, BWD_F3)
    for alpha, beta in alphas:
        dwb = _scatter(dw0, ws, int(np.prod(wd)))
        run_wgrad(pl, xb, dyb, dwb, alpha, beta, ITEM[dtype])
        got = _gather_tensor(dwb, wd, ws)
        want = alpha * ref.backward_filter_raw(x, dy, wd[2:], case[3], case[4], case[5], 1, mode == XCORR) + beta * dw0
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
    return pl


def implicit_expected(case, dtype):
    """Whether ALGO_3 takes the implicit variant: float, C * taps within one column tile, not a 1x1 stride-1
    problem whose x is the GEMMs' matrix."""
    one = case[2] in ((1, 1), (1,)) and case[4] in ((1, 1), (1,)) and case[6] != "gapx"
    return dtype == F32 and not one and case[0][1] * int(np.prod(case[2])) <= G.IMPLICIT_MAX_COLS


@pytest.mark.parametrize("case", WGRAD_CASES)
@pytest.mark.parametrize("mode", [XCORR, CONV])
@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("implicit", [True, False])
def test_backward_filter_emulated(case, mode, dtype, implicit, rng, monkeypatch):
    """Both forms of ALGO_3 where they apply: the implicit variant (on by default) and the explicit GEMMs
    (IMPLICIT off)."""
    monkeypatch.setattr(tuning.conv_gemm, "IMPLICIT", implicit)
    if implicit and not implicit_expected(case, dtype):
        pytest.skip("the explicit GEMMs serve it either way (covered with implicit=False)")
    pl = _check_wgrad(cpu_handle(), case, mode, dtype, rng)
    assert pl.implicit == implicit
    if implicit:
        return
    one = case[2] in ((1, 1), (1,)) and case[4] in ((1, 1), (1,)) and case[6] != "gapx"
    assert pl.direct == one                       # x itself only for 1x1 stride 1 with x a matrix
    assert pl.packs_dy == (not one and case[6] != "nhwc")   # NCHW dy under an im2col: made channel-major
    if dtype == BF16 and not one:                 # tensor-core GEMMs over rows padded to a multiple of 8
        p = pl.steps[pl.kinds[pl.chunks[0][1]][0]][4]
        assert p.ld % 8 == 0 and p.cols <= p.ld < p.cols + 8


@pytest.mark.parametrize("case", [WGRAD_CASES[0], WGRAD_CASES[1], WGRAD_CASES[3], WGRAD_CASES[5]])
def test_backward_filter_chunks_of_images(case, rng, monkeypatch):
    """A small column budget: several chunks of images (the last one shorter), each with partials of its
    own; a small partial budget on a per-image plan: the later chunks add into the first's partials."""
    monkeypatch.setattr(tuning.conv_gemm, "IMPLICIT", False)
    monkeypatch.setattr(tuning.conv_gemm, "COL_LIMIT", 1)
    monkeypatch.setattr(tuning.conv_gemm, "PART_LIMIT", 1)
    monkeypatch.setattr(tuning.conv_gemm, "MIN_SPLIT_ROWS", 16)
    h = cpu_handle()
    big = ((5,) + case[0][1:],) + case[1:]
    pl = _check_wgrad(h, big, XCORR, F32, rng)
    if pl.direct and pl.flat:   # x and dy read in place as one reduction: no chunks
        assert len(pl.chunks) == 1
        return
    assert len(pl.chunks) == 5 and [c[1] for c in pl.chunks] == [1] * 5
    if pl.flat:
        assert [c[2] for c in pl.chunks] == [i * pl.parts // 5 for i in range(5)] and all(c[3] for c in pl.chunks)
    else:
        assert [c[3] for c in pl.chunks] == [True] + [False] * 4 and pl.parts == 1
    monkeypatch.setattr(tuning.conv_gemm, "COL_LIMIT", 2 * prod_bytes(big))
    pl = _check_wgrad(h, big, CONV, F32, rng)
    if not pl.direct:
        assert [c[1] for c in pl.chunks] == [2, 2, 1]


def test_backward_filter_tail_split(rng, monkeypatch):
    """61 reduction rows (prime): 8 splits of 7 rows in one batched GEMM and the 5 left in a ninth partial."""
    monkeypatch.setattr(tuning.conv_gemm, "MIN_SPLIT_ROWS", 7)
    monkeypatch.setattr(tuning.conv_gemm, "IMPLICIT", False)
    for mode in (XCORR, CONV):
        pl = _check_wgrad(cpu_handle(), ((1, 6, 61), 5, (1,), (0,), (1,), (1,), "nhwc", NHWC), mode, F32, rng)
        gemms = pl.kinds[1][2]
        assert pl.flat and pl.parts == 9 and [(g[0].batch, g[0].k, g[5]) for g in gemms] == [(8, 7, 0), (1, 5, 8)]


def prod_bytes(case):
    """One image's column matrix bytes in float (im2col's share of the per-image budget, + dy's pack)."""
    xd, k, filt, pad, st, dil = case[:6]
    out = ref.out_dims(xd[2:], filt, pad, st, dil)
    pos = int(np.prod(out))
    return pos * xd[1] * int(np.prod(filt)) * 4 + (k * pos * 4 if case[6] != "nhwc" else 0)


def test_backward_filter_splits_fill_the_gpu(monkeypatch):
    """The ResNet-50 layers at N = 64, fp32 NCHW: the stem (explicit GEMMs) packs dy and splits its chunks'
    reductions into about a wave of 64 x 128 tiles (3 per SM) with no tail; the 1x1 layers read x and dy
    in place, one partial per image, the partials oriented so the tiles' 128-wide side is the longer one."""
    h = cpu_handle()
    monkeypatch.setattr(tuning.conv_gemm, "IMPLICIT", False)
    stem = CP.new_plan(h, CPb.DIR_BWD_FILTER, BWD_F3, cdesc((3, 3), (2, 2), (1, 1)), tdesc((64, 3, 224, 224)),
                       fdesc((64, 3, 7, 7)), tdesc((64, 64, 112, 112)))
    assert stem.packs_dy and stem.flat and not stem.direct
    for g, (im2col, pack, gemms) in stem.kinds.items():
        assert len(gemms) == 1 and gemms[0][0].m == 64 and gemms[0][0].n == 147
        assert gemms[0][0].k * gemms[0][0].batch == g * 112 * 112
        assert 132 * 3 // 2 <= 2 * gemms[0][0].batch <= 132 * 3
    assert stem.chunk * (112 * 112 * (147 + 64) * 4) <= tuning.conv_gemm.COL_LIMIT
    want = G.round_up(stem.parts * 64 * 147 * 4) + G.round_up(stem.chunk * 112 * 112 * 147 * 4) + \
        G.round_up(64 * stem.chunk * 112 * 112 * 4, 16)
    assert stem.workspace == want
    c1 = cdesc((0, 0), (1, 1), (1, 1))
    for cc, k, orient in ((256, 64, False), (64, 256, True)):
        pl = CP.new_plan(h, CPb.DIR_BWD_FILTER, BWD_F3, c1, tdesc((64, cc, 56, 56)), fdesc((k, cc, 1, 1)),
                         tdesc((64, k, 56, 56)))
        assert pl.direct and not pl.flat and pl.parts == 64 and pl.orient == orient
        mp = pl.kinds[64][2][0][0]
        assert (mp.m, mp.n, mp.k, mp.batch) == ((cc, k) if orient else (k, cc)) + (56 * 56, 64)
        assert pl.workspace == G.round_up(64 * 64 * 256 * 4, 16)


IMPL_CASES = [  # xdims, k, filt, pad, stride, dil, layout, filter format: the implicit variant's edges
    ((5, 3, 9, 7), 64, (7, 7), (3, 3), (2, 2), (1, 1), "nchw", NCHW),      # the stem's shape, N = 5, odd image
    ((1, 3, 11, 13), 70, (7, 7), (3, 3), (2, 2), (1, 1), "nchw", NHWC),    # two K tiles (the second 6 wide)
    ((3, 3, 13, 9), 5, (7, 7), (3, 3), (2, 2), (1, 1), "nhwc", NHWC),      # NHWC x and dy (dy loads k-fast)
    ((2, 5, 12, 10), 9, (7, 7), (3, 3), (2, 2), (1, 1), "gapx", NCHW),     # 245 columns: two column tiles
    ((4, 2, 9, 8), 3, (3, 2), (2, 0), (2, 3), (2, 1), "nchw", NCHW),       # dilation, odd strides, pad > dil
    ((2, 3, 4, 5, 6), 7, (2, 3, 2), (1, 1, 0), (1, 2, 2), (2, 1, 1), "nhwc", NCHW),   # 3-d
    ((3, 4, 19), 6, (5,), (2,), (3,), (1,), "nchw", NHWC),                 # 1-d
]


@pytest.mark.parametrize("case", IMPL_CASES)
@pytest.mark.parametrize("mode", [XCORR, CONV])
def test_implicit_emulated_slots_and_tiles(case, mode, rng, monkeypatch):
    """The implicit variant with many short slots (the last one shorter), several column / K tiles, every
    layout: the kernel's decoding from its real parameters, the fold, the workspace query."""
    monkeypatch.setattr(G, "IMPLICIT_MAX_COLS", 2 * G.WI_JT)
    monkeypatch.setattr(G, "WI_MIN_SLOT", G.WI_BK)
    monkeypatch.setattr(G, "WI_WAVES", 64)
    pl = _check_wgrad(cpu_handle(), case, mode, F32, rng)
    assert pl.implicit and pl.deterministic and pl.launches == 2
    grid = pl.steps[pl.gather][2]
    npix = case[0][0] * int(np.prod(ref.out_dims(case[0][2:], case[2], case[3], case[4], case[5])))
    cols = case[0][1] * int(np.prod(case[2]))
    assert grid == (pl.parts, -(-cols // G.WI_JT), -(-case[1] // G.WI_KT)) and pl.parts > 1
    assert pl.per_slot == G.WI_BK or npix <= pl.parts * G.WI_BK
    assert pl.workspace == G.round_up(pl.parts * case[1] * cols * 4, 16)
    p = pl.steps[pl.gather][4]
    assert bool(p.flags & G.FLAG_WI_KFAST) == (case[6] == "nhwc")


def test_implicit_stem_plan():
    """The fp32 stem at N = 64 (issue 4's layer): one kernel over 3 blocks per SM (396 slots of 2032
    pixels, the last 176), 64 x 147 partials (15 MB), the fold, no column matrix; v7 still puts ALGO_3
    first, with the implicit plan's workspace."""
    h = cpu_handle()
    conv, x, w, y = cdesc((3, 3), (2, 2), (1, 1)), tdesc((64, 3, 224, 224)), fdesc((64, 3, 7, 7)), tdesc((64, 64, 112, 112))
    pl = CP.new_plan(h, CPb.DIR_BWD_FILTER, BWD_F3, conv, x, w, y)
    assert pl.implicit and pl.parts == 132 * G.WI_MINB and pl.per_slot % G.WI_BK == 0
    assert (pl.parts - 1) * pl.per_slot < 64 * 112 * 112 <= pl.parts * pl.per_slot
    assert pl.steps[pl.gather][2] == (pl.parts, 1, 1)
    assert pl.workspace == G.round_up(pl.parts * 64 * 147 * 4, 16) < 32 << 20
    assert pydnn.get_convolution_backward_filter_workspace_size(h, x, y, conv, w, BWD_F3) == pl.workspace
    f = pl.steps[pl.fold][4]
    assert (f.parts, f.part_stride, f.ks, f.js, f.cin_inner) == (pl.parts, 64 * 147, 147, 1, 0)
    rf = pydnn.get_convolution_backward_filter_algorithm_v7(h, x, y, conv, w, 7)
    assert rf[0].algo == BWD_F3 and rf[0].memory == pl.workspace and rf[0].determinism == pydnn.PYDNN_DETERMINISTIC


def test_implicit_routing(monkeypatch):
    """What the implicit variant refuses goes to the explicit GEMMs (never a wrong answer): 16-bit data,
    more than one column tile, a 1x1 stride-1 problem whose x is a matrix, offsets beyond 32 bits; the
    switch off; and ALGO_3's own refusals stay what they were."""
    h = cpu_handle()
    c7 = cdesc((3, 3), (2, 2), (1, 1))
    plan = lambda conv, x, w, y: CP.new_plan(h, CPb.DIR_BWD_FILTER, BWD_F3, conv, x, w, y)
    assert plan(c7, tdesc((2, 3, 17, 17)), fdesc((8, 3, 7, 7)), tdesc((2, 8, 9, 9))).implicit
    stem16 = plan(c7, tdesc((2, 3, 17, 17), BF16, NHWC), fdesc((8, 3, 7, 7), BF16, NHWC), tdesc((2, 8, 9, 9), BF16, NHWC))
    assert not stem16.implicit and stem16.steps                       # the tensor-core GEMMs
    wide = plan(c7, tdesc((2, 4, 17, 17)), fdesc((8, 4, 7, 7)), tdesc((2, 8, 9, 9)))   # 196 columns
    assert not wide.implicit and wide.packs_dy
    c1 = cdesc((0, 0), (1, 1), (1, 1))
    one = plan(c1, tdesc((2, 20, 5, 7)), fdesc((8, 20, 1, 1)), tdesc((2, 8, 5, 7)))
    assert not one.implicit and one.direct
    one_s2 = plan(cdesc((0, 0), (2, 2), (1, 1)), tdesc((2, 20, 5, 7)), fdesc((8, 20, 1, 1)), tdesc((2, 8, 3, 4)))
    assert one_s2.implicit                                           # 1x1 stride 2: a gather, no im2col
    big = tdesc((2, 3, 17, 17), strides=(1 << 30, 289, 17, 1))      # image 1 starts 2^30 elements in
    assert not plan(c7, big, fdesc((8, 3, 7, 7)), tdesc((2, 8, 9, 9))).implicit
    _check(pydnn.get_convolution_backward_filter_workspace_size,
           (h, tdesc((2, 4, 9, 9)), tdesc((2, 6, 5, 5)), cdesc((3, 3), (2, 2), (1, 1), groups=2), fdesc((6, 2, 7, 7)),
            BWD_F3), NS, "explicit GEMM needs groupCount 1 (got 2)")
    monkeypatch.setattr(tuning.conv_gemm, "IMPLICIT", False)
    assert not plan(c7, tdesc((2, 3, 17, 17)), fdesc((8, 3, 7, 7)), tdesc((2, 8, 9, 9))).implicit


def test_v7_ranks_the_explicit_gemms_first():
    """fp32 NCHW, N = 64: v7's first backward filter choice is ALGO_3 on the 1x1 layers and the stem, its
    first backward data choice ALGO_1 (the direct GEMM) on the 1x1 layers; on bf16 NHWC 3x3 and 1x1 the
    tensor-core ALGO_1 stays first."""
    h = cpu_handle()
    for name, c, k, hw, r, st, pad in (("1x1 256->64", 256, 64, 56, 1, 1, 0), ("1x1 64->256", 64, 256, 56, 1, 1, 0),
                                       ("stem", 3, 64, 224, 7, 2, 3)):
        o = (hw + 2 * pad - r) // st + 1
        conv = cdesc((pad, pad), (st, st), (1, 1))
        x, w, y = tdesc((64, c, hw, hw)), fdesc((k, c, r, r)), tdesc((64, k, o, o))
        rf = pydnn.get_convolution_backward_filter_algorithm_v7(h, x, y, conv, w, 7)
        assert rf[0].algo == BWD_F3 and rf[0].determinism == pydnn.PYDNN_DETERMINISTIC, name
        assert rf[0].memory == pydnn.get_convolution_backward_filter_workspace_size(h, x, y, conv, w, BWD_F3)
        if r == 1:
            rd = pydnn.get_convolution_backward_data_algorithm_v7(h, w, y, conv, x, 6)
            assert rd[0].algo == BWD_D1 and rd[0].memory == 0, name
            assert CP.new_plan(h, CPb.DIR_BWD_DATA, BWD_D1, conv, x, w, y).direct
    for c, k, r, pad in ((64, 64, 3, 1), (256, 64, 1, 0)):
        conv = cdesc((pad, pad), (1, 1), (1, 1))
        x, w, y = tdesc((64, c, 56, 56), BF16, NHWC), fdesc((k, c, r, r), BF16, NHWC), tdesc((64, k, 56, 56), BF16, NHWC)
        assert pydnn.get_convolution_backward_filter_algorithm_v7(h, x, y, conv, w, 7)[0].algo == BWD_F1


def test_backward_filter_refusals():
    h = cpu_handle()
    bw = pydnn.get_convolution_backward_filter_workspace_size
    c = cdesc((1, 1), (1, 1), (1, 1))
    x, w, y = tdesc((2, 4, 9, 9)), fdesc((6, 4, 3, 3)), tdesc((2, 6, 9, 9))
    assert bw(h, x, y, c, w, BWD_F3) > 0
    _check(bw, (h, tdesc((2, 4, 9, 9), F64), tdesc((2, 6, 9, 9), F64), cdesc((1, 1), (1, 1), (1, 1), ctype=F64),
                fdesc((6, 4, 3, 3), F64), BWD_F3), NS, "pydnn.ops.matmul has no double kernel")
    _check(bw, (h, x, y, cdesc((1, 1), (1, 1), (1, 1), groups=2), fdesc((6, 2, 3, 3)), BWD_F3), NS,
           "explicit GEMM needs groupCount 1 (got 2)")
    odd = tdesc((2, 6, 9, 9), strides=(600, 100, 10, 1))   # rows of 10 for a width of 9
    _check(bw, (h, x, odd, c, w, BWD_F3), NS, "reads dy with packed spatial dims")
    fma = cdesc((1, 1), (1, 1), (1, 1))
    pydnn.set_convolution_math_type(fma, pydnn.PYDNN_FMA_MATH)
    _check(bw, (h, tdesc((2, 4, 9, 9), BF16), tdesc((2, 6, 9, 9), BF16), fma, fdesc((6, 4, 3, 3), BF16), BWD_F3), NS,
           "FMA math type forbids")
    assert pydnn.get_convolution_backward_filter_algorithm_max_count(h) == 7


DIRECT_CASES = [  # xdims (dx), k, layout, filter format
    ((2, 70, 5, 7), 9, "nchw", NCHW),      # C >= 64: the direct GEMM (no col2im)
    ((3, 6, 5, 7), 80, "nhwc", NHWC),
    ((1, 64, 3, 3), 64, "nhwc", NCHW),
    ((2, 5, 4, 3), 7, "nchw", NHWC),       # small C: direct too (a 1x1 needs no col2im at any C)
]


@pytest.mark.parametrize("case", DIRECT_CASES)
@pytest.mark.parametrize("mode", [XCORR, CONV])
@pytest.mark.parametrize("dtype", [F32, BF16])
def test_backward_data_direct_emulated(case, mode, dtype, rng):
    h = cpu_handle()
    xd, k, layout, wfmt = case
    full = (xd, k, (1, 1), (0, 0), (1, 1), (1, 1), layout, wfmt)
    c, (xd, wd, yd), (xs, ws, ys), (xsize, ysize), (xdsc, wdsc, ydsc) = _problem(full, mode, rng, dtype)
    pl = CP.new_plan(h, CPb.DIR_BWD_DATA, BWD_D1, c, xdsc, wdsc, ydsc)
    from pydnn.ops.convolution import stream as S
    stream = S.refusal(CPb.problem(c, xdsc, wdsc, ydsc), CPb.DIR_BWD_DATA) is None   # (a 1x1 filter of either format)
    if dtype == BF16 and layout == "nhwc" and xd[1] % 8 == 0 and k % 8 == 0 and (wfmt == NHWC or stream):
        assert not isinstance(pl, G.BwdGemmPlan)   # the tensor-core ALGO_1 (or the streaming kernels) serves it
        return
    assert isinstance(pl, G.BwdGemmPlan) and pl.direct and pl.workspace == 0 and not pl.steps
    w, dy, dx0 = rng.standard_normal(wd), rng.standard_normal(yd), rng.standard_normal(xd)
    wb, dyb = _scatter(w, ws, int(np.prod(wd))), _scatter(dy, ys, ysize)
    for alpha, beta in ((1.0, 0.0), (-0.5, 0.75)):
        dxb = _scatter(dx0, xs, xsize)
        a, b = (wb, dyb) if pl.filter_a else (dyb, wb)
        emulate_matmul(pl.mm, a, b, dxb, alpha, beta)
        got = _gather_tensor(dxb, xd, xs)
        want = alpha * ref.backward_data_raw(w, dy, xd[2:], (0, 0), (1, 1), (1, 1), 1, mode == XCORR) + beta * dx0
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


def test_backward_data_direct_refusal():
    """C >= 64 at stride 1 with dx and dy of different layouts: no direct GEMM, and col2im is for small C."""
    h = cpu_handle()
    c1 = cdesc((0, 0), (1, 1), (1, 1))
    x, w, y = tdesc((2, 64, 5, 5), F32, NHWC), fdesc((8, 64, 1, 1)), tdesc((2, 8, 5, 5))
    _check(pydnn.get_convolution_backward_data_workspace_size, (h, w, y, c1, x, BWD_D1), NS,
           "direct 1x1 GEMM reads dx and dy as matrices of one layout")
