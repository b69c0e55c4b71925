"""Convolution through explicit GEMMs (pydnn/ops/convolution_gemm.py) on the CPU: which plan each problem
gets (matmul, the tensor-core or CUDA-core 1x1 view, the direct 1x1 GEMM, the packed filter), exact
workspace sizes, refusals with their reasons, the v7 ranking of the 7x7 stem, and an emulation of every
launch from the plans' real parameter structs (im2col, pack_filter, matmul's operands as its plan
addresses them, col2im) against the float64 reference: odd shapes, stride 2, dilation, 1-d / 3-d, NCHW /
NHWC / padded layouts, both filter formats, both modes, alpha / beta."""
import numpy as np
import pytest

import pydnn
from pydnn import tuning
from pydnn.ops.convolution import implicit as CI, plans as CP, problem as CPb, tensor_core as CT
from pydnn.ops.convolution import gemm as G
from pydnn.reference import convolution as ref
from test_convolution_algos_cpu import emulate_im2col
from test_convolution_cpu import (BAD, BF16, CONV, F16, F32, F64, NCHW, NHWC, NS, XCORR, _check, _gather,
                                  _gather_tensor, _scatter, _strided, _val, cdesc, emulate, fdesc, tdesc)
from test_fuzz_cpu import cpu_handle

FWD_GEMM = pydnn.PYDNN_CONVOLUTION_FWD_ALGO_GEMM
FWD_IG = pydnn.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM
BWD_D0, BWD_D1 = pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_0, pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_1
ITEM = {F32: 4, F16: 2, BF16: 2, F64: 8}


def _problem(case, mode, rng, dtype):
    xd, k, filt, pad, st, dil, layout, wfmt = case
    c = cdesc(pad, st, dil, mode, ctype=F64 if dtype == F64 else F32)
    wd = (k, xd[1]) + filt
    yd = (xd[0], k) + ref.out_dims(xd[2:], filt, pad, st, dil)
    xs, xsize = _strided(xd, layout, rng)
    ys, ysize = _strided(yd, layout, rng)
    xdsc, ydsc, wdsc = tdesc(xd, dtype, strides=xs), tdesc(yd, dtype, strides=ys), fdesc(wd, dtype, wfmt)
    return c, (xd, wd, yd), (xs, wdsc.strides, ys), (xsize, ysize), (xdsc, wdsc, ydsc)


# ----------------------------------------------------------------------------- emulation of the launches

def emulate_pack(p, wbuf):
    """pack_filter: the K x ld matrix exactly as the kernel reads the filter through its strides."""
    i = np.arange(p.k * p.ld)
    k, j = i // p.ld, i % p.ld
    filt, ws = _val(p.filt), _val(p.ws)
    jj = np.minimum(j, p.cols - 1)
    tap, c = (jj // p.cg, jj % p.cg) if p.cin_inner else (jj % p.taps, jj // p.taps)
    t0, t1, t2 = tap // (filt[1] * filt[2]), (tap // filt[2]) % filt[1], tap % filt[2]
    off = k * ws[0] + c * ws[1] + t0 * ws[2] + t1 * ws[3] + t2 * ws[4]
    return _gather(wbuf, off, j < p.cols)


def emulate_matmul(mp, a, b, c, alpha=1.0, beta=0.0):
    """C_z = alpha op(A_z) op(B_z) + beta C_z, addressed exactly as pydnn.ops.matmul's docstring says."""
    i, kk, j = np.arange(mp.m)[:, None], np.arange(mp.k)[None, :], np.arange(mp.n)[None, :]
    for z in range(mp.batch):
        A = a[z * mp.stride_a + (kk * mp.lda + i if mp.trans_a else i * mp.lda + kk)]
        kc = np.arange(mp.k)[:, None]
        B = b[z * mp.stride_b + (j * mp.ldb + kc if mp.trans_b else kc * mp.ldb + j)]
        off = z * mp.stride_c + np.arange(mp.m)[:, None] * mp.ldc + j
        c[off] = alpha * (A @ B) + (beta * c[off] if beta else 0.0)


def first_tap(a, s, dil, step, F):
    """conv_gemm.cu's first_tap: the first tap tt < step with a - tt * dil a multiple of s, and its output."""
    o, rem, tt = a // s, a % s, 0
    while rem != 0:
        tt += 1
        if tt >= step or tt >= F:
            return F, o
        rem -= dil
        while rem < 0:
            rem += s
            o -= 1
    return tt, o


def emulate_col2im(p, col, dxbuf, alpha, beta):
    """col2im as the kernel walks it: per dim, the first tap meeting an output (first_tap), then every
    tap_step-th tap with the output falling by out_step."""
    ins, outs, filt = _val(p.in_size), _val(p.out_size), _val(p.filt)
    pad, st, dil, xs = _val(p.pad), _val(p.stride), _val(p.dil), _val(p.xs)
    ts, os_ = _val(p.tap_step), _val(p.out_step)
    flip = bool(p.flags & G.FLAG_FLIP)

    def taps(i, q):
        tt, o = first_tap(q + pad[i], st[i], dil[i], ts[i], filt[i])
        while tt < filt[i] and o >= 0:
            if o < outs[i]:
                yield (filt[i] - 1 - tt if flip else tt), o
            tt, o = tt + ts[i], o - os_[i]
    for n in range(p.batch):
        for c in range(p.c):
            for q in np.ndindex(*ins):
                s = 0.0
                for t0, o0 in taps(0, q[0]):
                    for t1, o1 in taps(1, q[1]):
                        for t2, o2 in taps(2, q[2]):
                            tap = (t0 * filt[1] + t1) * filt[2] + t2
                            j = tap * p.c + c if p.cin_inner else c * p.taps + tap
                            row = ((n * outs[0] + o0) * outs[1] + o1) * outs[2] + o2
                            s += col[row * p.ld + j]
                off = n * xs[0] + c * xs[1] + q[0] * xs[2] + q[1] * xs[3] + q[2] * xs[4]
                dxbuf[off] = alpha * s + (beta * dxbuf[off] if p.flags & G.FLAG_C2I_BETA else 0.0)


def emulate_im2col_blocks(p, xb):
    """im2col as the kernel builds it: per block of IM2COL_ROWS x IM2COL_COLS, each column's x offset and
    tap displacements, each row's base offset and position, then offset = row part + column part where
    every position is in bounds (padding columns: a displacement no position survives)."""
    filt, outs, ins = _val(p.filt), _val(p.out_size), _val(p.in_size)
    pad, st, dil, xs = _val(p.pad), _val(p.stride), _val(p.dil), _val(p.xs)
    rows = p.batch * int(np.prod(outs))
    j = np.arange(p.ld)
    per = p.cg * p.taps
    jc = np.minimum(j, p.cols - 1)
    g, jj = jc // per, jc % per
    tap, c = (jj // p.cg, jj % p.cg) if p.cin_inner else (jj % p.taps, jj // p.taps)
    t = [tap // (filt[1] * filt[2]), (tap // filt[2]) % filt[1], tap % filt[2]]
    flip = p.flags & G.FLAG_FLIP
    cdt = [np.where(j < p.cols, ((filt[i] - 1 - t[i]) if flip else t[i]) * dil[i], 0) for i in range(3)]
    cdt[0] = np.where(j < p.cols, cdt[0], -(1 << 29))
    coff = (g * p.cg + c) * xs[1] + sum(cdt[i] * xs[2 + i] for i in range(3))
    r = np.arange(rows)
    o2, o1, o0, n = r % outs[2], (r // outs[2]) % outs[1], (r // (outs[2] * outs[1])) % outs[0], r // int(np.prod(outs))
    rb = [o * st[i] - pad[i] for i, o in enumerate((o0, o1, o2))]
    roff = n * xs[0] + sum(rb[i] * xs[2 + i] for i in range(3))
    ok = np.ones((rows, p.ld), bool)
    for i in range(3):
        q = rb[i][:, None] + cdt[i][None, :]
        ok &= (q >= 0) & (q < ins[i])
    return _gather(xb, roff[:, None] + coff[None, :], ok).ravel()


def emulate_im2col_padded(p, xb):
    """im2col with its zero columns past `cols`, two ways: the per-element definition (test_convolution_
    algos_cpu's emulator, which walks `cols`) and the kernel's per-block decomposition; they must agree."""
    rows = p.batch * int(np.prod(_val(p.out_size)))
    full = np.zeros((rows, p.ld))
    full[:, :p.cols] = emulate_im2col(p, xb).reshape(rows, p.cols)
    np.testing.assert_array_equal(emulate_im2col_blocks(p, xb), full.ravel())
    return full.ravel()


def run_forward(pl, xb, wb, ysize, item):
    """The forward plan's launches (the plain call: matmul where the plan has one, else the 1x1 view)."""
    if pl.direct:
        mp, filter_a = pl.mm
        y = np.zeros(ysize)
        emulate_matmul(mp, wb if filter_a else xb, xb if filter_a else wb, y)
        return y
    ws = np.zeros(pl.workspace // item)
    col = emulate_im2col_padded(pl.steps[pl.im2col][4], xb)
    ws[:col.size] = col
    w = wb
    if pl.pack is not None:
        f = pl.filter_off // item
        packed = emulate_pack(pl.steps[pl.pack][4], wb)
        ws[f:f + packed.size] = packed
        w = ws[f:]
    if pl.mm is not None:
        mp, filter_a = pl.mm
        y = np.zeros(ysize)
        emulate_matmul(mp, w if filter_a else ws, ws if filter_a else w, y)
        return y
    return emulate(pl.sub.plan, CPb.DIR_FWD, ws, w, ysize)


FWD_CASES = [  # xdims, k, filt, pad, stride, dil, layout, filter format
    ((2, 3, 13, 11), 5, (7, 7), (3, 3), (2, 2), (1, 1), "nchw", NCHW),       # a stem (147 columns)
    ((2, 3, 13, 11), 6, (7, 7), (3, 3), (2, 2), (1, 1), "nhwc", NHWC),
    ((2, 3, 11), 4, (3,), (1,), (2,), (1,), "nchw", NHWC),                    # 1-d, NHWC filter on NCHW x
    ((2, 5, 7, 9), 3, (3, 2), (1, 0), (2, 3), (1, 2), "gap", NCHW),          # padded layout, dilation
    ((1, 3, 4, 5, 6), 4, (2, 3, 2), (1, 1, 0), (1, 2, 2), (2, 1, 1), "nhwc", NHWC),   # 3-d
    ((2, 6, 5, 7), 9, (1, 1), (0, 0), (1, 1), (1, 1), "nchw", NCHW),         # 1x1: direct GEMM (float)
    ((2, 6, 5, 7), 9, (1, 1), (0, 0), (1, 1), (1, 1), "nhwc", NHWC),
    ((2, 6, 5, 7), 9, (1, 1), (0, 0), (1, 1), (1, 1), "gap", NHWC),          # 1x1 on a padded layout
]


@pytest.mark.parametrize("case", FWD_CASES)
@pytest.mark.parametrize("mode", [XCORR, CONV])
@pytest.mark.parametrize("dtype", [F32, BF16, F64])
def test_forward_emulated(case, mode, dtype, rng):
    h = cpu_handle()
    c, (xd, wd, yd), (xs, ws, ys), (xsize, ysize), (xdsc, wdsc, ydsc) = _problem(case, mode, rng, dtype)
    x, w = rng.standard_normal(xd), rng.standard_normal(wd)
    xb, wb = _scatter(x, xs, xsize), _scatter(w, ws, int(np.prod(wd)))
    pl = CP.new_plan(h, CPb.DIR_FWD, FWD_GEMM, c, xdsc, wdsc, ydsc)
    assert pl.deterministic and pl.workspace == pydnn.get_convolution_forward_workspace_size(
        h, xdsc, wdsc, c, ydsc, FWD_GEMM)
    got = _gather_tensor(run_forward(pl, xb, wb, ysize, ITEM[dtype]), yd, ys)
    want = ref.forward_raw(x, w, case[3], case[4], case[5], 1, mode == XCORR)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
    gap, one = case[6] == "gap", case[2] in ((1, 1), (1,))
    if dtype == F32:  # matmul wherever y (and, for the direct 1x1 GEMM, x) has packed spatial dims
        assert (pl.mm is not None) == (not gap) and pl.direct == (one and not gap)
        assert pl.workspace == (0 if pl.direct else G.round_up(pl.steps[pl.im2col][4].cols * yd[0] *
                                                                 int(np.prod(yd[2:])) * 4, 16))
    elif dtype == BF16 and one and not gap:  # 16-bit 1x1: pydnn.ops.matmul on x itself (issue 18, gemm.mm16_ok)
        assert pl.direct and pl.mm is not None and pl.workspace == 0
    elif dtype == BF16:  # tensor cores over rows padded to a multiple of 8 (the 1x1 view)
        p = pl.steps[pl.im2col][4]
        assert p.ld % 8 == 0 and p.cols <= p.ld < p.cols + 8
        # the implicit 1x1 view or (tuning.conv_gemm.MM_COLS: by the model) pydnn.ops.matmul
        assert "_tc<" in pl.gemm_expr or "_wgmma" in pl.gemm_expr
        own = p.ld == p.cols and case[7] == NHWC
        assert (pl.pack is None) == own and pl.align == (16 if own else 0)
    else:  # double: the CUDA-core implicit GEMM of the 1x1 view, the filter read in place
        assert pl.mm is None and pl.pack is None and "implicit_gemm" in pl.gemm_expr


BWD_CASES = [  # xdims (dx), k, filt, pad, stride, dil, layout, filter format
    ((2, 3, 13, 11), 5, (7, 7), (3, 3), (2, 2), (1, 1), "nchw", NCHW),       # a stem
    ((2, 3, 13, 11), 8, (7, 7), (3, 3), (2, 2), (1, 1), "nhwc", NHWC),
    ((2, 3, 11), 4, (3,), (1,), (2,), (1,), "nchw", NHWC),                    # 1-d
    ((2, 5, 7, 9), 3, (3, 2), (1, 0), (2, 3), (1, 2), "nhwc", NCHW),         # dilation, odd strides
    ((1, 3, 4, 5, 6), 4, (2, 3, 2), (1, 1, 0), (1, 2, 2), (2, 1, 1), "nchw", NHWC),   # 3-d
    ((2, 6, 5, 7), 9, (3, 3), (1, 1), (1, 1), (1, 1), "nhwc", NHWC),         # small C, stride 1
    ((2, 4, 6, 5), 3, (3, 3), (2, 2), (3, 3), (1, 1), "nchw", NCHW),         # stride 3 > filter - pad
]


@pytest.mark.parametrize("case", BWD_CASES)
@pytest.mark.parametrize("mode", [XCORR, CONV])
@pytest.mark.parametrize("dtype", [F32, BF16])
def test_backward_data_emulated(case, mode, dtype, rng):
    h = cpu_handle()
    c, (xd, wd, yd), (xs, ws, ys), (xsize, ysize), (xdsc, wdsc, ydsc) = _problem(case, mode, rng, dtype)
    w, dy, dx0 = rng.standard_normal(wd), rng.standard_normal(yd), rng.standard_normal(xd)
    wb, dyb = _scatter(w, ws, int(np.prod(wd))), _scatter(dy, ys, ysize)
    pl = CP.new_plan(h, CPb.DIR_BWD_DATA, BWD_D1, c, xdsc, wdsc, ydsc)
    assert isinstance(pl, G.BwdGemmPlan) and pl.deterministic
    assert pl.workspace == pydnn.get_convolution_backward_data_workspace_size(h, wdsc, ydsc, c, xdsc, BWD_D1)
    item = ITEM[dtype]
    wsb = np.zeros(pl.workspace // item)
    wmat = wb
    if pl.pack is not None:
        f = pl.filter_off // item
        packed = emulate_pack(pl.steps[pl.pack][4], wb)
        wsb[f:f + packed.size] = packed
        wmat = wsb[f:]
    emulate_matmul(pl.mm, dyb, wmat, wsb)
    p = pl.steps[pl.col2im][4]
    assert p.ld == pl.mm.n and (p.ld % 8 == 0 if dtype == BF16 else p.ld == p.taps * p.c)
    for alpha, beta in ((1.0, 0.0), (-0.5, 0.75)):
        dxb = _scatter(dx0, xs, xsize)
        p.flags = (p.flags & ~G.FLAG_C2I_BETA) | (G.FLAG_C2I_BETA if beta else 0)
        emulate_col2im(p, wsb, dxb, alpha, beta)
        got = _gather_tensor(dxb, xd, xs)
        want = alpha * ref.backward_data_raw(w, dy, xd[2:], case[3], case[4], case[5], 1, mode == XCORR) + beta * dx0
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


# ----------------------------------------------------------------------------- plans, sizes, refusals

def test_stem_plans_and_workspace():
    """The ResNet-50 stem (N 64, 3 -> 64, 7x7 / 2 @ 224): bf16 NHWC forward on tensor cores over 152
    columns with the filter packed behind them; fp32 NCHW on matmul; backward data ALGO_1 = GEMM + col2im."""
    h = cpu_handle()
    c = cdesc((3, 3), (2, 2), (1, 1))
    for dt, fmt in ((BF16, NHWC), (F32, NCHW)):
        x, w, y = tdesc((64, 3, 224, 224), dt, fmt), fdesc((64, 3, 7, 7), dt, fmt), tdesc((64, 64, 112, 112), dt, fmt)
        rows, item = 64 * 112 * 112, ITEM[dt]
        ld = 152 if dt == BF16 else 147
        pl = CP.new_plan(h, CPb.DIR_FWD, FWD_GEMM, c, x, w, y)
        want = G.round_up(rows * ld * item) + G.round_up(64 * ld * item, 16) if dt == BF16 else G.round_up(rows * ld * item, 16)
        assert pydnn.get_convolution_forward_workspace_size(h, x, w, c, y, FWD_GEMM) == pl.workspace == want
        assert (pl.mm is not None) == (dt == F32)
        pd = CP.new_plan(h, CPb.DIR_BWD_DATA, BWD_D1, c, x, w, y)
        assert isinstance(pd, G.BwdGemmPlan) and pd.steps[pd.col2im][4].ld == ld
        assert pd.mm.n == ld and pd.mm.k == 64
        want = G.round_up(rows * ld * item) + G.round_up(64 * ld * item, 16) if dt == BF16 else G.round_up(rows * ld * item, 16)
        assert pydnn.get_convolution_backward_data_workspace_size(h, w, y, c, x, BWD_D1) == pd.workspace == want
        # the heuristic: GEMM first forward, ALGO_1 first backward data (ALGO_0's gather: 3 of 64 columns,
        # 1 tap in 4), both deterministic with their true workspace
        r = pydnn.get_convolution_forward_algorithm_v7(h, x, w, c, y, 8)
        assert r[0].algo == FWD_GEMM and r[0].memory == pl.workspace and r[0].determinism == pydnn.PYDNN_DETERMINISTIC
        r = pydnn.get_convolution_backward_data_algorithm_v7(h, w, y, c, x, 6)
        assert r[0].algo == BWD_D1 and r[0].memory == pd.workspace and r[0].determinism == pydnn.PYDNN_DETERMINISTIC
        assert [p.algo for p in r[:2]] == [BWD_D1, BWD_D0]


def test_backward_data_refusals():
    h = cpu_handle()
    bw = pydnn.get_convolution_backward_data_workspace_size
    c, c1 = cdesc((1, 1), (2, 2), (1, 1)), cdesc((1, 1), (1, 1), (1, 1))
    x, w, dy = tdesc((2, 4, 9, 9)), fdesc((6, 4, 3, 3)), tdesc((2, 6, 5, 5))
    assert bw(h, w, dy, c, x, BWD_D1) == G.round_up(2 * 25 * 36 * 4, 16)  # the filter read in place
    _check(bw, (h, w, dy, c, tdesc((2, 4, 9, 9), F64), BWD_D1), NS, "wDesc: data type")  # (types checked first)
    x64, w64, dy64 = tdesc((2, 4, 9, 9), F64), fdesc((6, 4, 3, 3), F64), tdesc((2, 6, 5, 5), F64)
    _check(bw, (h, w64, dy64, cdesc((1, 1), (2, 2), (1, 1), ctype=F64), x64, BWD_D1), NS,
           "explicit GEMM runs float, half and bfloat16 data")
    _check(bw, (h, fdesc((6, 2, 3, 3)), dy, cdesc((1, 1), (2, 2), (1, 1), groups=2), x, BWD_D1), NS,
           "explicit GEMM needs groupCount 1 (got 2)")
    big = tdesc((2, 64, 9, 9))
    _check(bw, (h, fdesc((6, 64, 3, 3)), tdesc((2, 6, 9, 9)), c1, big, BWD_D1), NS,
           "serves small-channel (C < 64) or strided problems")
    odd = tdesc((2, 6, 5, 5), strides=(200, 30, 6, 1))  # rows of 6 for a width of 5: not packed
    _check(bw, (h, w, odd, c, x, BWD_D1), NS, "reads dy as a matrix")
    fma = cdesc((1, 1), (2, 2), (1, 1))
    pydnn.set_convolution_math_type(fma, pydnn.PYDNN_FMA_MATH)
    _check(bw, (h, fdesc((6, 4, 3, 3), BF16), tdesc((2, 6, 5, 5), BF16), fma, tdesc((2, 4, 9, 9), BF16), BWD_D1), NS,
           "FMA math type forbids")
    _check(pydnn.convolution_backward_data, (h, 1.0, w, 1 << 41, dy, 1 << 42, c, BWD_D1, 1 << 43, 100, 0.0, x, 1 << 40),
           BAD, "bytes PYDNN_CONVOLUTION_BWD_DATA_ALGO_1 needs")


def test_forward_accepts_any_filter_strides_through_the_pack():
    """A float filter that is not a packed matrix (NHWC-format on a 1x1 view is; this 3x3 NCHW-format
    filter under a padded bfloat16 problem is not): the plan packs it, and says so in its workspace."""
    h = cpu_handle()
    c = cdesc((1, 1), (1, 1), (1, 1))
    x, y = tdesc((2, 5, 6, 6), BF16, NHWC), tdesc((2, 7, 6, 6), BF16, NHWC)
    pl = CP.new_plan(h, CPb.DIR_FWD, FWD_GEMM, c, x, fdesc((7, 5, 3, 3), BF16, NHWC), y)
    assert pl.pack is not None and pl.steps[pl.pack][4].ld == 48 and pl.steps[pl.im2col][4].cols == 45
    assert pl.workspace == G.round_up(72 * 48 * 2) + G.round_up(7 * 48 * 2, 16)
    pl = CP.new_plan(h, CPb.DIR_FWD, FWD_GEMM, c, tdesc((2, 8, 6, 6), BF16, NHWC), fdesc((7, 8, 3, 3), BF16, NHWC), y)
    assert pl.pack is None and pl.align == 16 and pl.workspace == G.round_up(72 * 72 * 2, 16)


def test_model_counts_the_cuda_core_gather_waste():
    """The v7 model's CUDA-core backward data: whole 64 x 64 tiles and 1 / stride^d useful taps (the
    stem's ALGO_0: 3 of 64 columns, stride 2 x 2)."""
    from pydnn.ops.convolution import algorithms as A
    h = cpu_handle()
    c = cdesc((3, 3), (2, 2), (1, 1))
    x, w, y = tdesc((64, 3, 224, 224)), fdesc((64, 3, 7, 7)), tdesc((64, 64, 112, 112))
    pl = CP.new_plan(h, CPb.DIR_BWD_DATA, BWD_D0, c, x, w, y)
    assert A._cc_tile_waste(pl) == pytest.approx(64 / 3 * 4)
    c1 = cdesc((1, 1), (1, 1), (1, 1))
    x, w, y = tdesc((64, 64, 56, 56)), fdesc((64, 64, 3, 3)), tdesc((64, 64, 56, 56))
    assert A._cc_tile_waste(CP.new_plan(h, CPb.DIR_BWD_DATA, BWD_D0, c1, x, w, y)) == 1.0


def test_kernels_keep_their_state_in_registers():
    """ptxas: no stack frame, no spills, for every conv_gemm kernel of every data type (sm_90; float also
    wgrad_implicit)."""
    import re
    from pydnn._build import cache
    from pydnn._build.manifest import COMMON_OPTIONS
    from pydnn._cuda import nvrtc

    for unit in G.kernel_units():
        text, _ = cache.unit_inputs(unit)
        _, _, log = nvrtc.compile_cubin(text, unit.source, unit.exprs, "sm_90",
                                        COMMON_OPTIONS + ("--ptxas-options=-v",), [str(cache.ptx_dir())])
        frames = re.findall(r"(\d+) bytes stack frame, (\d+) bytes spill stores", log)
        assert len(frames) == len(unit.exprs) == 5 + (unit.name == "conv_gemm.f32")
        assert all(int(a) == 0 and int(b) == 0 for a, b in frames), (unit.name, frames)
