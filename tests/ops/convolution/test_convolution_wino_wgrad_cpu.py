"""BWD_FILTER_ALGO_WINOGRAD_NONFUSED on the CPU (pydnn/ops/convolution_winograd.py, plan_winograd_wgrad):
the math in float64 numpy (dw = G^T (sum over tiles of (A dy A^T) . (B^T x B)) G), then every launch of the
real plans emulated from their parameter structs (the x and dy transforms as conv_winograd.cu addresses
the chunked workspace, the batched GEMM through the matmul reference at the plan's leading dims and
strides, or the implicit-GEMM emulator for double, filter_grad's fixed-order sum of the splits, flip,
alpha / beta) against the float64 reference; refusals, workspace sizes, the split model and the v7
ranking. The kernels themselves run on the host in test_convolution_algos_cpu.py
(test_winograd_kernels_on_the_host, tests/c/conv_winograd_host.cpp: check_wgrad)."""
import numpy as np
import pytest

import pydnn
from pydnn import tuning
from pydnn.ops.convolution import implicit as CI, plans as CP, problem as CPb, tensor_core as CT
from pydnn.ops.convolution import winograd as Wg
from pydnn.reference import convolution as ref
from pydnn.reference import matmul as mref
from test_convolution_algos_cpu import MATS, _problem
from test_convolution_cpu import BAD, CONV, F16, F32, F64, NCHW, NHWC, NS, XCORR, _check, _gather, _scatter, \
    _val, cdesc, emulate, fdesc, tdesc
from test_fuzz_cpu import cpu_handle

WINO = pydnn.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED


def _winograd_wgrad(x, dy, pad, m):
    """dw (K, C, 3, 3) of a cross-correlation, one group, by the Winograd identity in float64."""
    bt, g, at = MATS[m]
    n, c, h, w = x.shape
    k, oh, ow = dy.shape[1:]
    th, tw, a = -(-oh // m), -(-ow // m), m + 2
    xp = np.zeros((n, c, th * m + 2, tw * m + 2))
    hs, ws = slice(max(pad[0], 0), min(pad[0] + h, xp.shape[2])), slice(max(pad[1], 0), min(pad[1] + w, xp.shape[3]))
    xp[:, :, hs, ws] = x[:, :, hs.start - pad[0]:hs.stop - pad[0], ws.start - pad[1]:ws.stop - pad[1]]
    dyp = np.zeros((n, k, th * m, tw * m))
    dyp[:, :, :oh, :ow] = dy
    mm = np.zeros((a, a, k, c))
    for i in range(th):
        for j in range(tw):
            u = np.einsum("xp,ncpq,yq->xync", bt, xp[:, :, i * m:i * m + a, j * m:j * m + a], bt)
            d = np.einsum("px,nkpq,qy->xynk", at, dyp[:, :, i * m:(i + 1) * m, j * m:(j + 1) * m], at)
            mm += np.einsum("abnk,abnc->abkc", d, u)
    return np.einsum("ar,abkc,bs->kcrs", g, mm, g)


@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize("shape", [(1, 1, 1, 4, 4, (1, 1)), (2, 3, 5, 7, 6, (0, 2)), (3, 4, 2, 5, 9, (2, 1)),
                                   (1, 2, 3, 1, 1, (1, 1))])
def test_winograd_wgrad_math(m, shape, rng):
    n, c, k, h, w, pad = shape
    x = rng.standard_normal((n, c, h, w))
    dy = rng.standard_normal((n, k, h + 2 * pad[0] - 2, w + 2 * pad[1] - 2))
    want = ref.backward_filter_raw(x, dy, (3, 3), pad, (1, 1), (1, 1), 1, True)
    np.testing.assert_allclose(_winograd_wgrad(x, dy, pad, m), want, rtol=1e-11, atol=1e-11)


# ----------------------------------------------------------------------------- emulation of the plan

def _tile_offset(p, m):
    if p.chunk >= p.tiles:
        return m * p.u_m
    s = m // p.chunk
    return s * p.u_s + (m - s * p.chunk) * p.u_m


def emulate_transform(p, buf, mats, tile, grad, size):
    """input_transform (grad False: B^T d B of alpha x alpha patches at tile * m - pad) or grad_transform
    (A dy A^T of m x m tiles at tile * m) as they address the input and the chunked workspace."""
    bt, _, at = mats
    A = tile + 2
    chans = p.groups * p.cin_g
    m, ch = np.arange(p.tiles)[:, None], np.arange(chans)[None, :]
    tw, th, n = m % p.tiles_w, (m // p.tiles_w) % p.tiles_h, m // (p.tiles_w * p.tiles_h)
    ist = _val(p.is_)
    side = tile if grad else A
    d = np.zeros((side, side, p.tiles, chans))
    for a in range(side):
        for b in range(side):
            hh = th * tile + a - (0 if grad else p.pad_h)
            ww = tw * tile + b - (0 if grad else p.pad_w)
            ok = (n < p.batch) & (hh >= 0) & (hh < p.in_h) & (ww >= 0) & (ww < p.in_w) & (ch >= 0)
            d[a, b] = _gather(buf, n * ist[0] + ch * ist[1] + hh * ist[2] + ww * ist[3], ok)
    mat = at.T if grad else bt   # D = A e A^T with A = (A^T)^T; U = B^T d B
    t = np.einsum("xa,abmc,yb->xymc", mat, d, mat)
    out = np.full(size, np.nan)
    bidx = np.arange(A * A).reshape(A, A)[:, :, None, None]
    idx = _tile_offset(p, m)[None, None] + ch[None, None] * p.u_c + bidx * p.u_b
    assert len(np.unique(idx)) == idx.size
    out[idx] = t
    return out


def emulate_wgrad(pl, xbuf, dybuf, dw0buf, alpha, beta):
    t, mats = pl.tile, MATS[pl.tile]
    A, P = t + 2, (t + 2) ** 2
    px, pd, pf = pl.px, pl.pd, pl.pf
    ubuf = emulate_transform(px, xbuf, mats, t, False, P * px.tiles * px.groups * px.cin_g)
    dbuf = emulate_transform(pd, dybuf, mats, t, True, P * pd.tiles * pd.groups * pd.cin_g)
    total = pf.groups * pf.cout_g * pf.cin_g
    size = pf.splits * P * total
    if pl.mm is None:
        mbuf = emulate(pl.sub.plan, CPb.DIR_BWD_FILTER, dbuf, ubuf, size)
    else:
        mp, q = pl.mm, pl.mm.fast.params
        out = mref.gemm(dbuf, ubuf, None, q.m, q.n, q.k, 1.0, 0.0, mp.trans_a, mp.trans_b, q.lda, q.ldb, q.ldc,
                        q.batch, q.stride_a, q.stride_b, q.stride_c)
        mbuf = np.full(size, np.nan)
        z, i, j = np.ix_(np.arange(q.batch), np.arange(q.m), np.arange(q.n))
        idx = z * q.stride_c + i * q.ldc + j
        assert len(np.unique(idx)) == idx.size == size  # every partial written exactly once
        mbuf[idx] = out
    assert not np.isnan(mbuf).any()
    parts = mbuf.reshape(pf.splits, A, A, total)
    msum = parts[0].copy()
    for s in range(1, pf.splits):  # filter_grad's order
        msum += parts[s]
    g = np.einsum("ar,abq,bs->rsq", mats[1], msum, mats[1])   # (3, 3, o * cin_g + i)
    flip = bool(pl.base_flags & Wg.FLAG_FLIP)
    ws = _val(pf.ws)
    q = np.arange(total)
    o, i = q // pf.cin_g, q % pf.cin_g
    out = dw0buf.copy()
    for r in range(3):
        for s in range(3):
            off = o * ws[0] + i * ws[1] + (2 - r if flip else r) * ws[2] + (2 - s if flip else s) * ws[3]
            out[off] = alpha * g[r, s] + (beta * dw0buf[off] if beta else 0.0)
    return out


WGRAD_CASES = [  # xdims, k, filt, pad, stride, dil, groups, layout, filter format
    ((2, 4, 7, 9), 6, (3, 3), (1, 1), (1, 1), (1, 1), 1, "nhwc", NHWC),
    ((3, 5, 6, 5), 7, (3, 3), (0, 2), (1, 1), (1, 1), 1, "nchw", NCHW),        # odd pads, C != K
    ((1, 6, 5, 7), 4, (3, 3), (2, 1), (1, 1), (1, 1), 2, "gap", NHWC),         # groups, padded layout
    ((3, 4, 4, 4), 4, (3, 3), (1, 1), (1, 1), (1, 1), 4, "nchw", NCHW),        # depthwise
    ((1, 3, 1, 1), 2, (3, 3), (1, 1), (1, 1), (1, 1), 1, "nchw", NHWC),        # one output pixel
]


@pytest.mark.parametrize("case", WGRAD_CASES)
@pytest.mark.parametrize("mode", [XCORR, CONV])
@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("layout,splits", [(None, None), ("tile", 3), ("chan", 2)])
@pytest.mark.parametrize("tile", Wg.TILES)
def test_wgrad_emulated(case, mode, dtype, layout, splits, tile, rng, monkeypatch):
    monkeypatch.setattr(tuning.conv_winograd, "PREFERRED_TILE", tile)
    monkeypatch.setattr(tuning.conv_winograd, "WGRAD_LAYOUT", layout)
    monkeypatch.setattr(tuning.conv_winograd, "WGRAD_FORCE_SPLITS", splits)
    monkeypatch.setattr(Wg, "WGRAD_F4_MIN_CLEAR", 0)  # index math here, not float rounding: every shape
    monkeypatch.setattr(Wg, "WGRAD_F2_MIN_CLEAR", -9)
    h = cpu_handle()
    c, (xd, wd, yd), (xs, ws, ys), (xsize, ysize), (xdsc, wdsc, ydsc) = _problem(case, mode, rng, dtype)
    if dtype == F64:
        c = cdesc(case[3], case[4], case[5], mode, F64, case[6])
    x, dy, dw0 = rng.standard_normal(xd), rng.standard_normal(yd), rng.standard_normal(wd)
    pl = CP.new_plan(h, CPb.DIR_BWD_FILTER, WINO, c, xdsc, wdsc, ydsc)
    assert pl.deterministic and pl.tile == tile and (pl.mm is None) == (dtype == F64)
    tiles = pl.px.batch * pl.px.tiles_h * pl.px.tiles_w
    if splits:  # chunks of ceil(T / S) tiles rounded up to 4 (fewer chunks when the last ones would be empty)
        chunk = -(-(-(-tiles // min(splits, tiles))) // 4) * 4
        assert pl.chunk == chunk and pl.splits == -(-tiles // chunk)
    assert pl.px.tiles == pl.splits * pl.chunk >= tiles > (pl.splits - 1) * pl.chunk
    nw = int(np.prod(wd))
    got = emulate_wgrad(pl, _scatter(x, xs, xsize), _scatter(dy, ys, ysize), _scatter(dw0, ws, nw), -0.5, 0.25)
    args = (case[3], case[4], case[5], case[6], mode == XCORR)
    want = ref.backward_filter(-0.5, x, dy, 0.25, dw0, *args)
    idx = sum(np.indices(wd)[i] * ws[i] for i in range(4))
    np.testing.assert_allclose(got[idx], want, rtol=1e-10, atol=1e-10)


# ----------------------------------------------------------------------------- refusals, sizes, model

def test_wgrad_refusals():
    h = cpu_handle()
    ws = pydnn.get_convolution_backward_filter_workspace_size
    x, y, w = tdesc((2, 4, 9, 9)), tdesc((2, 6, 9, 9)), fdesc((6, 4, 3, 3))
    _check(ws, (h, x, tdesc((2, 6, 7, 7)), cdesc((1, 1), (1, 1), (1, 1)), fdesc((6, 4, 5, 5)), WINO), NS,
           "BWD_FILTER_ALGO_WINOGRAD_NONFUSED needs a 3 x 3 filter")
    _check(ws, (h, x, tdesc((2, 6, 5, 5)), cdesc((1, 1), (2, 2), (1, 1)), w, WINO), NS, "needs stride 1")
    _check(ws, (h, x, tdesc((2, 6, 7, 7)), cdesc((1, 1), (1, 1), (2, 2)), w, WINO), NS, "needs dilation 1")
    _check(ws, (h, tdesc((2, 4, 9)), tdesc((2, 6, 9)), cdesc((1,), (1,), (1,)), fdesc((6, 4, 3)), WINO), NS,
           "2-d convolutions only")
    _check(ws, (h, tdesc((1, 4, 3, 9, 9)), tdesc((1, 6, 3, 9, 9)), cdesc((0, 1, 1), (1, 1, 1), (1, 1, 1)),
                fdesc((6, 4, 1, 3, 3)), WINO), NS, "2-d convolutions only")
    x64, y64 = tdesc((2, 4096, 9, 9), F64), tdesc((2, 4096, 9, 9), F64)
    _check(ws, (h, x64, y64, cdesc((1, 1), (1, 1), (1, 1), ctype=F64, groups=4096), fdesc((4096, 1, 3, 3), F64),
                WINO), NS, "at most 4095 groups for double")
    # float runs its GEMMs on gemm_simt (no grid.z bound): the same groups are served
    assert ws(h, tdesc((2, 4096, 9, 9)), tdesc((2, 4096, 9, 9)), cdesc((1, 1), (1, 1), (1, 1), groups=4096),
              fdesc((4096, 1, 3, 3)), WINO) > 0
    assert ws(h, x, y, cdesc((1, 1), (1, 1), (1, 1)), w, WINO) > 0


def test_wgrad_small_float_outputs():
    """Float data: F(4x4) from min(OH - pad_h, OW - pad_w) >= 4, F(2x2) from 2, NOT_SUPPORTED below (the border
    taps' rounding); half keeps F(4x4) there."""
    h = cpu_handle()
    p1 = cdesc((1, 1), (1, 1), (1, 1))
    for (hh, ww), tile in (((5, 9), 4), ((4, 9), 2), ((9, 3), 2)):
        x, y = tdesc((1, 4, hh, ww)), tdesc((1, 6, hh, ww))
        assert CP.new_plan(h, CPb.DIR_BWD_FILTER, WINO, p1, x, fdesc((6, 4, 3, 3)), y).tile == tile
    x16, y16 = tdesc((1, 4, 3, 2), F16), tdesc((1, 6, 3, 2), F16)
    assert CP.new_plan(h, CPb.DIR_BWD_FILTER, WINO, p1, x16, fdesc((6, 4, 3, 3), F16), y16).tile == 4
    _check(pydnn.get_convolution_backward_filter_workspace_size,
           (h, tdesc((1, 4, 3, 2)), tdesc((1, 6, 3, 2)), p1, fdesc((6, 4, 3, 3)), WINO), NS,
           "min(OH - pad_h, OW - pad_w) = 1")
    p0 = cdesc((0, 0), (1, 1), (1, 1))   # no padding: every tap sees every position
    x, y = tdesc((1, 4, 4, 4)), tdesc((1, 6, 2, 2))
    assert CP.new_plan(h, CPb.DIR_BWD_FILTER, WINO, p0, x, fdesc((6, 4, 3, 3)), y).tile == 2


def _ru(n, a=256):
    return -(-n // a) * a


@pytest.mark.parametrize("dtype,acc", [(F32, 4), (F16, 4), (F64, 8)])
def test_wgrad_workspace_size_and_small_workspace(dtype, acc, monkeypatch):
    h = cpu_handle()
    monkeypatch.setattr(tuning.conv_winograd, "WGRAD_FORCE_SPLITS", 4)
    n, c, k, hh, ww = 3, 5, 7, 11, 9
    cv = cdesc((1, 1), (1, 1), (1, 1), ctype=F64 if dtype == F64 else F32)
    x, w, y = tdesc((n, c, hh, ww), dtype), fdesc((k, c, 3, 3), dtype), tdesc((n, k, hh, ww), dtype)
    tiles = n * 3 * 3                     # 11 x 9 outputs in 4 x 4 tiles
    chunk = 8                             # ceil(27 / 4) = 7 tiles a chunk, rounded up to 4 (16-byte rows)
    want = _ru(36 * 4 * chunk * c * acc) + _ru(36 * 4 * chunk * k * acc) + _ru(4 * 36 * k * c * acc)
    assert pydnn.get_convolution_backward_filter_workspace_size(h, x, y, cv, w, WINO) == want
    _check(pydnn.convolution_backward_filter, (h, 1.0, x, 1 << 40, y, 1 << 41, cv, WINO, 1 << 43, want - 1, 0.0,
                                               w, 1 << 42), BAD, f"less than the {want} bytes")


def test_wgrad_chunks_are_aligned():
    """Chunks of ceil(T / S) tiles rounded up to 32 tiles from 256 on (128-byte rows), else to 4."""
    assert Wg._wgrad_chunk(12544, 11) == 1152 and Wg._wgrad_chunk(3136, 7) == 448
    assert Wg._wgrad_chunk(1024, 4) == 256 and Wg._wgrad_chunk(27, 4) == 8 and Wg._wgrad_chunk(1, 1) == 4
    assert Wg._wgrad_chunk(1000, 4) == 252 and Wg._wgrad_chunk(1100, 4) == 288  # 250 -> 252; 275 -> 288


RESNET = [(64, 56), (128, 28), (256, 14), (512, 7)]   # fp32 3x3 C = K @ H, N = 64


@pytest.mark.parametrize("ch,hw", RESNET)
def test_wgrad_splits_fill_the_gpu_and_v7_ranks_it_first(ch, hw):
    """The split model gives every ResNet-50 3x3 layer at least one full round of GEMM items over the
    132 SMs, and v7 lists WINOGRAD_NONFUSED first (deterministic, its workspace reported) ahead of the
    CUDA-core ALGO_0 / ALGO_1, FFT and the explicit-GEMM ALGO_3."""
    from pydnn.ops import matmul as MM
    h = cpu_handle()
    cv = cdesc((1, 1), (1, 1), (1, 1))
    x, w = tdesc((64, ch, hw, hw)), fdesc((ch, ch, 3, 3))
    pl = CP.new_plan(h, CPb.DIR_BWD_FILTER, WINO, cv, x, w, x)
    t = MM._choose_simt_tile(ch, ch, pl.mm.batch, h.sm_count, pl.chunk)
    items = -(-ch // t.bm) * -(-ch // t.bn) * pl.mm.batch
    assert items >= t.per_sm * h.sm_count * 0.7, (pl.splits, items)
    r = pydnn.get_convolution_backward_filter_algorithm_v7(h, x, x, cv, w, 8)
    assert r[0].algo == WINO and r[0].determinism == pydnn.PYDNN_DETERMINISTIC
    assert r[0].memory == pl.workspace
    ranked = [p.algo for p in r]
    for other in (pydnn.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_0, pydnn.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_1,
                  pydnn.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT, pydnn.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_3):
        assert ranked.index(WINO) < ranked.index(other)


def test_wgrad_16bit_ranked_behind_tensor_cores():
    """bf16 NHWC: the tensor-core ALGO_1 stays v7's first choice (Winograd's transforms and GEMM run in
    float on CUDA cores), Winograd is listed as supported."""
    from pydnn import enums as E
    h = cpu_handle()
    cv = cdesc((1, 1), (1, 1), (1, 1))
    x, w = tdesc((64, 256, 14, 14), E.PYDNN_DATA_BFLOAT16, NHWC), fdesc((256, 256, 3, 3), E.PYDNN_DATA_BFLOAT16, NHWC)
    r = pydnn.get_convolution_backward_filter_algorithm_v7(h, x, x, cv, w, 8)
    assert r[0].algo == pydnn.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_1
    assert {p.algo: p.status for p in r}[WINO] == pydnn.PYDNN_STATUS_SUCCESS
