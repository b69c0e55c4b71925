"""The GEMM and WINOGRAD_NONFUSED convolution algorithms on the CPU: which problems they refuse (status +
reason), their workspace sizes and the BAD_PARAM for a smaller workspace, their rows in the v7 ranking,
and an emulation of every launch from the real parameter structs of the plans (im2col; the Winograd
filter / input / output transforms; the implicit GEMM between them through test_convolution_cpu's
emulator), checked against the float64 reference on odd shapes, both layouts, groups, both modes."""
import numpy as np
import pytest

import pydnn
from pydnn import tuning
from pydnn.ops.convolution import implicit as CI, plans as CP, problem as CPb, tensor_core as CT
from pydnn.ops.convolution import winograd as Wg
from pydnn.reference import convolution as ref
from pydnn.reference import matmul as mref
from test_convolution_cpu import (BAD, CONV, F16, F32, F64, NCHW, NHWC, NS, XCORR, _check, _decompose3, _gather,
                                  _gather_tensor, _scatter, _strided, _val, cdesc, emulate, fdesc, tdesc)
from test_fuzz_cpu import cpu_handle

FWD_GEMM = pydnn.PYDNN_CONVOLUTION_FWD_ALGO_GEMM
FWD_WINO = pydnn.PYDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED
BWD_WINO = pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED


def _problem(case, mode, rng, dtype=F32):
    xd, k, filt, pad, st, dil, g, layout, wfmt = case
    c = cdesc(pad, st, dil, mode, groups=g)
    wd = (k, xd[1] // g) + filt
    yd = (xd[0], k) + ref.out_dims(xd[2:], filt, pad, st, dil)
    xs, xsize = _strided(xd, layout, rng)
    ys, ysize = _strided(yd, layout, rng)
    xdsc, ydsc, wdsc = tdesc(xd, dtype, strides=xs), tdesc(yd, dtype, strides=ys), fdesc(wd, dtype, wfmt)
    return c, (xd, wd, yd), (xs, wdsc.strides, ys), (xsize, ysize), (xdsc, wdsc, ydsc)


# ----------------------------------------------------------------------------- refusals and sizes

def test_winograd_refusals():
    h = cpu_handle()
    x, y = tdesc((2, 4, 9, 9)), tdesc((2, 6, 9, 9))
    ws = pydnn.get_convolution_forward_workspace_size
    _check(ws, (h, x, fdesc((6, 4, 5, 5)), cdesc((2, 2), (1, 1), (1, 1)), y, FWD_WINO), NS, "needs a 3 x 3 filter")
    _check(ws, (h, x, fdesc((6, 4, 3, 3)), cdesc((1, 1), (2, 2), (1, 1)), tdesc((2, 6, 5, 5)), FWD_WINO), NS,
           "needs stride 1")
    _check(ws, (h, x, fdesc((6, 4, 3, 3)), cdesc((2, 2), (1, 1), (2, 2)), y, FWD_WINO), NS, "needs dilation 1")
    _check(ws, (h, tdesc((2, 4, 9)), fdesc((6, 4, 3)), cdesc((1,), (1,), (1,)), tdesc((2, 6, 9)), FWD_WINO), NS,
           "2-d convolutions only")
    _check(ws, (h, tdesc((1, 4, 3, 9, 9)), fdesc((6, 4, 1, 3, 3)), cdesc((0, 1, 1), (1, 1, 1), (1, 1, 1)),
                tdesc((1, 6, 3, 9, 9)), FWD_WINO), NS, "2-d convolutions only")
    bw = pydnn.get_convolution_backward_data_workspace_size
    _check(bw, (h, fdesc((6, 4, 3, 3)), tdesc((2, 6, 13, 13)), cdesc((3, 3), (1, 1), (1, 1)), x, BWD_WINO), NS,
           "needs padding <= 2")
    _check(bw, (h, fdesc((6, 4, 3, 3)), tdesc((2, 6, 5, 5)), cdesc((1, 1), (2, 2), (1, 1)), x, BWD_WINO), NS,
           "needs stride 1")
    # still not implemented: the fused WINOGRAD (backward filter WINOGRAD_NONFUSED: test_convolution_wino_wgrad_cpu.py)
    _check(ws, (h, x, fdesc((6, 4, 3, 3)), cdesc((1, 1), (1, 1), (1, 1)), y,
                pydnn.PYDNN_CONVOLUTION_FWD_ALGO_WINOGRAD), NS, "not implemented")


def _ru(n, a=256):
    return -(-n // a) * a


@pytest.mark.parametrize("dtype,item,acc", [(F32, 4, 4), (F16, 2, 4), (F64, 8, 8)])
@pytest.mark.parametrize("tile", Wg.TILES)
def test_workspace_sizes_and_small_workspace(dtype, item, acc, tile, monkeypatch):
    monkeypatch.setattr(tuning.conv_winograd, "PREFERRED_TILE", tile)
    h = cpu_handle()
    n, c, k, hh, ww = 3, 5, 7, 11, 9
    cv = cdesc((1, 1), (1, 1), (1, 1), ctype=F64 if dtype == F64 else F32)
    x, w, y = tdesc((n, c, hh, ww), dtype), fdesc((k, c, 3, 3), dtype), tdesc((n, k, hh, ww), dtype)
    gemm = pydnn.get_convolution_forward_workspace_size(h, x, w, cv, y, FWD_GEMM)
    if dtype == F16:  # tensor cores: 45 columns padded to 48, the NCHW filter packed behind them
        assert gemm == _ru(n * hh * ww * 48 * item) + _ru(k * 48 * item, 16)
    else:
        assert gemm == _ru(n * hh * ww * c * 9 * item, 16)
    tiles, pos = n * -(-hh // tile) * -(-ww // tile), (tile + 2) ** 2
    want = _ru(pos * tiles * c * acc) + _ru(pos * k * c * acc) + _ru(pos * tiles * k * acc)
    assert pydnn.get_convolution_forward_workspace_size(h, x, w, cv, y, FWD_WINO) == want
    want_b = _ru(pos * tiles * k * acc) + _ru(pos * c * k * acc) + _ru(pos * tiles * c * acc)
    assert pydnn.get_convolution_backward_data_workspace_size(h, w, y, cv, x, BWD_WINO) == want_b
    for algo, need in ((FWD_GEMM, gemm), (FWD_WINO, want)):
        _check(pydnn.convolution_forward, (h, 1.0, x, 1 << 40, w, 1 << 41, cv, algo, 1 << 43, need - 1, 0.0, y,
                                           1 << 42), BAD, f"less than the {need} bytes")
    _check(pydnn.convolution_backward_data, (h, 1.0, w, 1 << 41, y, 1 << 42, cv, BWD_WINO, 1 << 43, want_b - 1, 0.0,
                                             x, 1 << 40), BAD, "WINOGRAD_NONFUSED needs")


def test_v7_lists_the_new_algorithms_truthfully():
    h = cpu_handle()
    c = cdesc((1, 1), (1, 1), (1, 1))
    x, w, y = tdesc((64, 64, 56, 56)), fdesc((64, 64, 3, 3)), tdesc((64, 64, 56, 56))
    r = {p.algo: p for p in pydnn.get_convolution_forward_algorithm_v7(h, x, w, c, y, 8)}
    for a in (FWD_GEMM, FWD_WINO, CPb.E.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM):
        assert r[a].status == pydnn.PYDNN_STATUS_SUCCESS and r[a].determinism == pydnn.PYDNN_DETERMINISTIC
    assert r[FWD_GEMM].memory == 64 * 56 * 56 * 64 * 9 * 4 and r[FWD_WINO].memory > 0
    ranked = [p.algo for p in pydnn.get_convolution_forward_algorithm_v7(h, x, w, c, y, 8)]
    assert ranked[0] == FWD_WINO  # 2.25x fewer multiplies on CUDA cores: the model's first choice
    # GEMM's float GEMM is matmul's 128 x 128 CUDA-core tile (convolution_gemm.py): faster than the
    # implicit GEMM's 64 x 64 even after the im2col pass
    assert ranked.index(FWD_GEMM) < ranked.index(CPb.E.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM)
    rd = {p.algo: p for p in pydnn.get_convolution_backward_data_algorithm_v7(h, w, y, c, x, 6)}
    assert rd[BWD_WINO].status == pydnn.PYDNN_STATUS_SUCCESS and rd[BWD_WINO].determinism == pydnn.PYDNN_DETERMINISTIC
    c2 = cdesc((1, 1), (2, 2), (1, 1))
    r2 = {p.algo: p for p in pydnn.get_convolution_forward_algorithm_v7(h, x, w, c2, tdesc((64, 64, 28, 28)), 8)}
    assert r2[FWD_WINO].status == NS and "stride 1" in r2[FWD_WINO].message
    assert r2[FWD_GEMM].status == pydnn.PYDNN_STATUS_SUCCESS


def test_gemm_uses_tensor_cores_when_the_view_allows():
    """The column matrix's GEMM is the tensor-core plan for 16-bit problems of one group (the columns padded
    to a multiple of 8 and the filter packed where needed: convolution_gemm.py), the CUDA-core implicit
    GEMM otherwise (groups here)."""
    h = cpu_handle()
    c = cdesc((1, 1), (1, 1), (1, 1))
    x, y = tdesc((2, 8, 9, 9), F16, NHWC), tdesc((2, 16, 9, 9), F16, NHWC)
    pl = CP.new_plan(h, CPb.DIR_FWD, FWD_GEMM, c, x, fdesc((16, 8, 3, 3), F16, NHWC), y)
    # (72 columns: fwd_tc, or the pipelined kernel with the channel tail zero-filled: tuning.conv.FWD_TAIL_FILL, or
    # the streaming 1x1 kernels: tuning.conv.STREAM_1X1)
    tc = ("fwd_tc<", "implicit_gemm_pipe_tc<", "fwd_wgmma<", "stream_1x1<")
    assert any(t in pl.sub.plan.gemm_expr for t in tc) and pl.align == 16
    pl = CP.new_plan(h, CPb.DIR_FWD, FWD_GEMM, c, x, fdesc((16, 8, 3, 3), F16, NCHW), y)
    assert any(t in pl.sub.plan.gemm_expr for t in tc) and pl.pack is not None  # the filter packed (NHWC rows) first
    g2 = cdesc((1, 1), (1, 1), (1, 1), groups=2)
    pl = CP.new_plan(h, CPb.DIR_FWD, FWD_GEMM, g2, x, fdesc((16, 4, 3, 3), F16, NHWC), y)
    assert "implicit_gemm<" in pl.sub.plan.gemm_expr  # groups: the CUDA-core 1x1 view


# ----------------------------------------------------------------------------- emulation

CASES = [  # xdims, k, filt, pad, stride, dil, groups, layout, filter format
    ((2, 3, 11), 5, (3,), (1,), (2,), (1,), 1, "nchw", NCHW),
    ((2, 4, 7, 9), 6, (3, 3), (1, 1), (1, 1), (1, 1), 1, "nhwc", NHWC),
    ((2, 4, 7, 9), 6, (3, 2), (1, 0), (2, 3), (1, 2), 2, "nchw", NCHW),
    ((1, 6, 8, 5), 6, (3, 3), (2, 1), (2, 1), (2, 1), 6, "nhwc", NCHW),     # depthwise
    ((2, 5, 6, 6), 7, (1, 1), (0, 0), (2, 2), (1, 1), 1, "gap", NHWC),
    ((1, 3, 4, 5, 6), 4, (2, 3, 2), (1, 1, 0), (1, 2, 2), (2, 1, 1), 1, "nchw", NCHW),
    ((1, 4, 4, 5, 3), 4, (3, 1, 2), (1, 0, 1), (2, 1, 1), (1, 1, 2), 2, "nhwc", NHWC),
]
WINO_CASES = [
    ((2, 4, 7, 9), 6, (3, 3), (1, 1), (1, 1), (1, 1), 1, "nhwc", NHWC),
    ((2, 4, 8, 6), 6, (3, 3), (1, 1), (1, 1), (1, 1), 1, "nchw", NCHW),
    ((1, 6, 5, 7), 4, (3, 3), (0, 2), (1, 1), (1, 1), 2, "nchw", NHWC),       # groups, odd pads
    ((3, 5, 6, 5), 5, (3, 3), (2, 0), (1, 1), (1, 1), 5, "gap", NCHW),       # depthwise, padded layout
    ((1, 1, 4, 4), 1, (3, 3), (1, 1), (1, 1), (1, 1), 1, "nhwc", NCHW),       # one channel
]


def emulate_im2col(p, xbuf):
    """The column matrix exactly as conv_gemm::im2col addresses x."""
    outs, ins, filt = _val(p.out_size), _val(p.in_size), _val(p.filt)
    pad, st, dil, xs = _val(p.pad), _val(p.stride), _val(p.dil), _val(p.xs)
    rows = p.batch * int(np.prod(outs))
    row = np.arange(rows)[:, None]
    j = np.arange(p.cols)[None, :]
    b, o = _decompose3(row, outs)
    per = p.cg * p.taps
    g, jj = j // per, j % per
    tap, c = (jj // p.cg, jj % p.cg) if p.cin_inner else (jj % p.taps, jj // p.taps)
    t = [tap // (filt[1] * filt[2]), (tap // filt[2]) % filt[1], tap % filt[2]]
    off = b * xs[0] + (g * p.cg + c) * xs[1]
    ok = np.ones(off.shape, bool)
    for i in range(3):
        tt = filt[i] - 1 - t[i] if p.flags & 16 else t[i]
        q = o[i] * st[i] - pad[i] + tt * dil[i]
        ok &= (q >= 0) & (q < ins[i])
        off = off + q * xs[2 + i]
    return _gather(xbuf, off, ok).ravel()


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("mode", [XCORR, CONV])
def test_gemm_emulated(case, mode, rng):
    h = cpu_handle()
    c, (xd, wd, yd), (xs, ws, ys), (xsize, ysize), (xdsc, wdsc, ydsc) = _problem(case, mode, rng)
    x, w = rng.standard_normal(xd), rng.standard_normal(wd)
    xb, wb = _scatter(x, xs, xsize), _scatter(w, ws, int(np.prod(wd)))
    pl = CP.new_plan(h, CPb.DIR_FWD, FWD_GEMM, c, xdsc, wdsc, ydsc)
    col = emulate_im2col(pl.steps[0][4], xb)
    assert col.size * 4 <= pl.workspace
    got = _gather_tensor(emulate(pl.sub.plan, CPb.DIR_FWD, col, wb, ysize), yd, ys)
    want = ref.forward_raw(x, w, case[3], case[4], case[5], case[6], mode == XCORR)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


MATS = {  # B^T, G, A^T of F(2x2, 3x3) and F(4x4, 3x3)
    2: (np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]),
        np.array([[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]]),
        np.array([[1, 1, 1, 0], [0, 1, -1, -1]])),
    4: (np.array([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0], [0, -2, -1, 2, 1, 0],
                  [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]]),
        np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6], [1 / 24, 1 / 12, 1 / 6],
                  [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]]),
        np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]])),
}


def emulate_wino_gemm(pl, ubuf, vbuf, size):
    """The plan's P GEMMs -> the M buffer: the batched matmul launch (float accumulation) as its params
    struct addresses the workspace (the float64 matmul reference, C scattered through ldc / stride_c), or
    the implicit GEMM's emulator (double data)."""
    if pl.mm is None:
        return emulate(pl.sub.plan, CPb.DIR_FWD, ubuf, vbuf, size)
    mp, q = pl.mm, pl.mm.fast.params
    a, b = (vbuf, ubuf) if pl.v_is_a else (ubuf, vbuf)
    out = mref.gemm(a, b, None, q.m, q.n, q.k, 1.0, 0.0, mp.trans_a, mp.trans_b, q.lda, q.ldb, q.ldc, q.batch,
                    q.stride_a, q.stride_b, q.stride_c)
    mbuf = np.full(size, np.nan)
    z, i, j = np.ix_(np.arange(q.batch), np.arange(q.m), np.arange(q.n))
    idx = z * q.stride_c + i * q.ldc + j
    assert len(np.unique(idx)) == idx.size == size  # every M element written exactly once
    mbuf[idx] = out
    return mbuf


def emulate_winograd(pl, inbuf, wbuf, out_dims):
    """Filter, input and output transforms as conv_winograd.cu addresses them, the GEMM through the
    implicit-GEMM emulator; returns the forward-form output (N, K, H, W)."""
    p = pl.params
    bwd, flip = bool(pl.base_flags & Wg.FLAG_BWD), bool(pl.base_flags & Wg.FLAG_FLIP)  # p.flags: set per call
    ws, ist = _val(p.ws), _val(p.is_)
    kout, cin = p.groups * p.cout_g, p.groups * p.cin_g
    o, i = np.arange(kout)[:, None], np.arange(p.cin_g)[None, :]
    base = ((o // p.cout_g * p.cin_g + i) * ws[0] + (o % p.cout_g) * ws[1]) if bwd else (o * ws[0] + i * ws[1])
    f = np.array([[wbuf[base + (2 - r if flip else r) * ws[2] + (2 - s if flip else s) * ws[3]] for s in range(3)]
                  for r in range(3)])
    t, BT, G, AT = pl.tile, *MATS[pl.tile]
    A, P = t + 2, (t + 2) ** 2
    vbuf = np.einsum("ar,rsoi,bs->aboi", G, f, G).reshape(P * kout * p.cin_g)
    m, ch = np.arange(p.tiles)[:, None], np.arange(cin)[None, :]
    tw, th, n = m % p.tiles_w, (m // p.tiles_w) % p.tiles_h, m // (p.tiles_w * p.tiles_h)
    d = np.zeros((A, A, p.tiles, cin))
    for a in range(A):
        for b in range(A):
            hh, ww = th * t - p.pad_h + a, tw * t - p.pad_w + b
            ok = (hh >= 0) & (hh < p.in_h) & (ww >= 0) & (ww < p.in_w) & (ch >= 0)
            d[a, b] = _gather(inbuf, n * ist[0] + ch * ist[1] + hh * ist[2] + ww * ist[3], ok)
    U = np.einsum("xa,abmc,yb->xymc", BT, d, BT).reshape(P, p.tiles, cin)
    ubuf = np.full(P * p.tiles * cin, np.nan)
    bidx = np.arange(P)[:, None, None]
    ubuf[m[None] * p.u_m + (bidx * cin + ch[None]) * p.u_c] = U
    assert not np.isnan(ubuf).any()
    mbuf = emulate_wino_gemm(pl, ubuf, vbuf, P * p.tiles * kout)
    ko = np.arange(kout)[None, :]
    M = mbuf[m[None] * p.m_m + (bidx * kout + ko[None]) * p.m_c].reshape(A, A, p.tiles, kout)
    Y = np.einsum("xa,abmk,yb->xymk", AT, M, AT)  # (t, t, tiles, K)
    out = np.zeros((p.batch, kout, p.tiles_h * t, p.tiles_w * t))
    Y = Y.reshape(t, t, p.batch, p.tiles_h, p.tiles_w, kout)
    out[:] = np.transpose(Y, (2, 5, 3, 0, 4, 1)).reshape(out.shape)
    return out[:, :, :out_dims[0], :out_dims[1]]


@pytest.mark.parametrize("case", WINO_CASES)
@pytest.mark.parametrize("mode", [XCORR, CONV])
@pytest.mark.parametrize("direction", [CPb.DIR_FWD, CPb.DIR_BWD_DATA])
@pytest.mark.parametrize("tile", Wg.TILES)
def test_winograd_emulated(case, mode, direction, tile, rng, monkeypatch):
    monkeypatch.setattr(tuning.conv_winograd, "PREFERRED_TILE", tile)
    monkeypatch.setattr(Wg, "MIN_F4_CHANNELS_F32", 0)  # index math here, not float rounding: every shape
    h = cpu_handle()
    c, (xd, wd, yd), (xs, ws, ys), (xsize, ysize), (xdsc, wdsc, ydsc) = _problem(case, mode, rng)
    x, w, dy = rng.standard_normal(xd), rng.standard_normal(wd), rng.standard_normal(yd)
    wb = _scatter(w, ws, int(np.prod(wd)))
    args = (case[3], case[4], case[5], case[6], mode == XCORR)
    if direction == CPb.DIR_FWD:
        pl = CP.new_plan(h, direction, FWD_WINO, c, xdsc, wdsc, ydsc)
        got = emulate_winograd(pl, _scatter(x, xs, xsize), wb, yd[2:])
        want = ref.forward_raw(x, w, *args)
    else:
        pl = CP.new_plan(h, direction, BWD_WINO, c, xdsc, wdsc, ydsc)
        got = emulate_winograd(pl, _scatter(dy, ys, ysize), wb, xd[2:])
        want = ref.backward_data_raw(w, dy, xd[2:], *args)
    assert pl.deterministic and pl.tile == tile
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


def test_winograd_tile_choice():
    h = cpu_handle()
    x, y = tdesc((2, 4000, 9, 9)), tdesc((2, 4000, 9, 9))
    pl = CP.new_plan(h, CPb.DIR_FWD, FWD_WINO, cdesc((1, 1), (1, 1), (1, 1), groups=4000), x, fdesc((4000, 1, 3, 3)), y)
    assert pl.tile == 2  # 36 * 4000 GEMM groups would overflow grid.z; 16 * 4000 fit
    x, y = tdesc((2, 4096, 9, 9)), tdesc((2, 4096, 9, 9))
    _check(pydnn.get_convolution_forward_workspace_size, (h, x, fdesc((4096, 1, 3, 3)),
           cdesc((1, 1), (1, 1), (1, 1), groups=4096), y, FWD_WINO), NS, "at most 4095 groups")
    pl = CP.new_plan(h, CPb.DIR_FWD, FWD_WINO, cdesc((1, 1), (1, 1), (1, 1)), tdesc((2, 8, 9, 9)), fdesc((8, 8, 3, 3)),
                     tdesc((2, 8, 9, 9)))
    assert pl.tile == tuning.conv_winograd.PREFERRED_TILE == 4
    # float with fewer than 4 channels per group to reduce over: F(2x2) (F(4x4)'s rounding is too close to
    # float's tolerance); half keeps F(4x4); backward data reduces over K / groups
    dw = (tdesc((2, 8, 9, 9)), fdesc((8, 1, 3, 3)), tdesc((2, 8, 9, 9)))
    assert CP.new_plan(h, CPb.DIR_FWD, FWD_WINO, cdesc((1, 1), (1, 1), (1, 1), groups=8), *dw).tile == 2
    dw16 = (tdesc((2, 8, 9, 9), F16), fdesc((8, 1, 3, 3), F16), tdesc((2, 8, 9, 9), F16))
    assert CP.new_plan(h, CPb.DIR_FWD, FWD_WINO, cdesc((1, 1), (1, 1), (1, 1), groups=8), *dw16).tile == 4
    few_k = (tdesc((2, 8, 9, 9)), fdesc((3, 8, 3, 3)), tdesc((2, 3, 9, 9)))
    assert CP.new_plan(h, CPb.DIR_FWD, FWD_WINO, cdesc((1, 1), (1, 1), (1, 1)), *few_k).tile == 4
    assert CP.new_plan(h, CPb.DIR_BWD_DATA, BWD_WINO, cdesc((1, 1), (1, 1), (1, 1)), *few_k).tile == 2


def test_device_transform_tables_match_the_emulated_ones():
    """The B^T, G, A^T tables in ptx/conv_winograd.cu are the matrices the emulation verifies."""
    import re
    from pydnn._build import cache
    src = (cache.ptx_dir() / "conv_winograd.cu").read_text()
    for tile in Wg.TILES:
        body = src[src.index(f"template <> struct Wino<{tile}>"):]
        body = body[:body.index("\n};")]  # the struct's closing line
        tables = re.findall(r"const double t\[\d+\]\[\d+\] = \{(.*?)\};", body, re.S)
        assert len(tables) == 3
        for text, want in zip(tables, MATS[tile]):
            rows = re.findall(r"\{([^{}]*)\}", text)
            got = np.array([[eval(v) for v in r.split(",")] for r in rows], float)  # "1.0 / 6" style entries
            np.testing.assert_array_equal(got, np.asarray(want, float))


def test_new_kernels_keep_their_state_in_registers():
    """The transforms' alpha x alpha tiles and their constant matrices fold into registers (ptxas: no stack
    frame, no spills) for both tile sizes; the im2col likewise."""
    import re
    from pydnn._build import cache
    from pydnn._build.manifest import COMMON_OPTIONS
    from pydnn._cuda import nvrtc

    for name in ("conv_winograd.f32", "conv_winograd.f64", "conv_gemm.f32"):
        unit = next(u for u in CP.kernel_units() if u.name == name)
        text, _ = cache.unit_inputs(unit)
        _, _, log = nvrtc.compile_cubin(text, unit.source, unit.exprs, "sm_90",
                                        COMMON_OPTIONS + ("--ptxas-options=-v",), [str(cache.ptx_dir())])
        frames = re.findall(r"(\d+) bytes stack frame, (\d+) bytes spill stores", log)
        assert len(frames) == len(unit.exprs)
        assert all(int(a) == 0 and int(b) == 0 for a, b in frames), (name, frames)


TYPES_SHIM = """// host shim of what conv_winograd.cu uses from common/types.cuh (float / double only)
#include <cmath>
namespace pydnn {
template <class T> struct AccOf { typedef float type; };
template <> struct AccOf<double> { typedef double type; };
template <class A> inline A load(float v) { return (A)v; }
template <class A> inline A load(double v) { return (A)v; }
template <class T, class A> inline T store(A v) { return (T)v; }
inline float m_expm1(float x) { return expm1f(x); }
inline double m_expm1(double x) { return expm1(x); }
inline float m_tanh(float x) { return tanhf(x); }
inline double m_tanh(double x) { return tanh(x); }
template <class A> inline A sigmoid(A x) { return A(1) / (A(1) + std::exp(-x)); }
}
"""


def test_winograd_kernels_on_the_host(tmp_path):
    """The transform kernels themselves (ptx/conv_winograd.cu, compiled as host C++: tests/c/
    conv_winograd_host.cpp) against a direct convolution, within float's tolerance, for both tiles."""
    import shutil
    import subprocess
    from pydnn._build import cache
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    ptx = cache.ptx_dir()
    (tmp_path / "common").mkdir()
    for name in ("conv_winograd.cu", "conv_winograd_params.h"):
        shutil.copy(ptx / name, tmp_path / name)
    shutil.copy(ptx / "common" / "params.h", tmp_path / "common" / "params.h")
    (tmp_path / "common" / "types.cuh").write_text(TYPES_SHIM)
    src = __import__("pathlib").Path(__file__).resolve().parents[2] / "c" / "conv_winograd_host.cpp"
    exe = tmp_path / "host"
    subprocess.run([cxx, "-O1", "-std=c++17", "-I", str(tmp_path), str(src), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stdout
