"""persist_fwd_r (ptx/rnn_persist.cu, tuning.rnn.PERSIST_REG) re-stated thread by thread in numpy: every
(block, warp, lane) computes its index math as the CUDA source does (the m tile / K slice of a warp, the
permuted 16-byte loads of h_{t-1}, the weight fragments, the mma fragment layout of PTX's m16n8k16, the
combos a lane owns, the reduction buffer's indices, the cell's offsets), so that an index slip shows up here
against a float64 recurrence, without a GPU. (rnn_persist_emulator.persist_fwd_r checks the engine's use of the
kernel at the slice level; this file checks the kernel's own per-thread arithmetic.)"""
import numpy as np
import pytest


def _mma(a, b, c):
    """c [32][4] += mma.m16n8k16 of a [32][4] words and b [32][2] words (each word two values, low first)."""
    A, Bm = np.zeros((16, 16)), np.zeros((8, 16))
    for lane in range(32):
        g, q = lane >> 2, lane & 3
        for e in range(2):
            A[g, 2 * q + e], A[g + 8, 2 * q + e] = a[lane][0][e], a[lane][1][e]
            A[g, 2 * q + 8 + e], A[g + 8, 2 * q + 8 + e] = a[lane][2][e], a[lane][3][e]
            Bm[g, 2 * q + e], Bm[g, 2 * q + 8 + e] = b[lane][0][e], b[lane][1][e]
    C = A @ Bm.T
    for lane in range(32):
        g, q = lane >> 2, lane & 3
        c[lane] += [C[g, 2 * q], C[g, 2 * q + 1], C[g + 8, 2 * q], C[g + 8, 2 * q + 1]]


def _sig(v):
    return 1.0 / (1.0 + np.exp(-v))


def _step_threads(cell, G, B, H, ksplit, bp, W, hprev, xs, bw, br, st, hown, lens, t):
    """One step of every block as persist_fwd_r's threads compute it; returns (h_t [B, H], st')."""
    h_new, st_new = hown.copy(), st.copy()
    ksw = (H >> 4) // ksplit
    red = {}
    for bx in range(H // 8):
        j0 = bx * 8
        accs = {}
        for warp in range(8):
            mt, ks = warp // ksplit, warp % ksplit
            kcol0 = ks * ksw * 16
            acc = [np.zeros((32, 4)) for _ in range(G)]
            if ksw and ksw <= 8:
                for kk in range(ksw):
                    i, w = kk >> 1, 2 * (kk & 1)
                    afr, bfr = [], [[] for _ in range(G)]
                    for lane in range(32):
                        gq, q = lane >> 2, lane & 3
                        r0 = mt * 16 + gq
                        rows = []
                        for rh in range(2):
                            r = r0 + 8 * rh
                            off = r * H + kcol0 + 8 * q + 32 * i  # aoff + 32 i (elements)
                            v = hprev.reshape(-1)[off:off + 8] if r < B else np.zeros(8)
                            rows.append([v[2 * k:2 * k + 2] for k in range(4)])  # 4 words
                        afr.append([rows[0][w], rows[1][w], rows[0][w + 1], rows[1][w + 1]])
                        for g in range(G):
                            col = kcol0 + (kk >> 1) * 32 + 8 * q + 4 * (kk & 1)
                            v = W[g * H + j0 + gq, col:col + 4]
                            bfr[g].append([v[0:2], v[2:4]])
                    for g in range(G):
                        _mma(afr, bfr[g], acc[g])
            accs[warp] = acc
        for warp in range(8):  # the stores of red (other combos), then the owners' sums
            mt, ks = warp // ksplit, warp % ksplit
            for lane in range(32):
                r0 = mt * 16 + (lane >> 2)
                for c in range(4):
                    b = r0 + 8 * (c >> 1)
                    if b < B and c % ksplit != ks and ksplit > 1:
                        red[(bx, (warp * 4 + c) * 32 + lane)] = [accs[warp][g][lane][c] for g in range(G)]
        for warp in range(8):
            mt, ks = warp // ksplit, warp % ksplit
            for lane in range(32):
                gq, q = lane >> 2, lane & 3
                r0 = mt * 16 + gq
                for c in range(4):
                    b, u = r0 + 8 * (c >> 1), 2 * q + (c & 1)
                    if not (b < B and c % ksplit == ks):
                        continue
                    ha = np.zeros(G)
                    for k2 in range(ksplit):
                        ha += (np.array([accs[warp][g][lane][c] for g in range(G)]) if k2 == ks
                               else np.array(red[(bx, ((mt * ksplit + k2) * 4 + c) * 32 + lane)]))
                    j = j0 + u
                    xa = np.array([xs[b, g * H + j] for g in range(G)]) + bw[[g * H + j for g in range(G)]]
                    hh = ha + br[[g * H + j for g in range(G)]]
                    if t >= lens[b]:
                        continue
                    if cell == 2:
                        i_, f, gg, o = _sig(xa[0] + hh[0]), _sig(xa[1] + hh[1]), np.tanh(xa[2] + hh[2]), _sig(xa[3] + hh[3])
                        cc = f * st[b, j] + i_ * gg
                        st_new[b, j], h_new[b, j] = cc, o * np.tanh(cc)
                    elif cell == 3:
                        r, z = _sig(xa[0] + hh[0]), _sig(xa[1] + hh[1])
                        n = np.tanh(xa[2] + r * hh[2])
                        st_new[b, j] = h_new[b, j] = (1 - z) * n + z * st[b, j]
                    else:
                        h_new[b, j] = np.tanh(xa[0] + hh[0])
    return h_new, st_new


def _reference(cell, G, B, H, W, h0, c0, xs_all, bw, br, lens):
    h, c = h0.copy(), c0.copy()
    out = []
    for t, xs in enumerate(xs_all):
        a = xs + bw
        r = h @ W.T + br
        act = (t < lens)[:, None]
        if cell == 2:
            i_, f, gg, o = (_sig(a[:, :H] + r[:, :H]), _sig(a[:, H:2 * H] + r[:, H:2 * H]),
                            np.tanh(a[:, 2 * H:3 * H] + r[:, 2 * H:3 * H]), _sig(a[:, 3 * H:] + r[:, 3 * H:]))
            cn = f * c + i_ * gg
            hn = o * np.tanh(cn)
        elif cell == 3:
            rr, z = _sig(a[:, :H] + r[:, :H]), _sig(a[:, H:2 * H] + r[:, H:2 * H])
            n = np.tanh(a[:, 2 * H:] + rr * r[:, 2 * H:])
            hn = cn = (1 - z) * n + z * c
        else:
            hn = cn = np.tanh(a + r)
        h, c = np.where(act, hn, h), np.where(act, cn, c)
        out.append(h.copy())
    return out


@pytest.mark.parametrize("cell,B,H,shape", [
    (2, 20, 128, (2, 4)),   # issue 16's layout (2 row tiles x 4 K slices), 2 k steps a warp, rows past the batch
    (3, 7, 64, (1, 2)),     # GRU, one row tile, 2 slices (warps 2..7 idle), 2 k steps
    (1, 40, 64, (4, 2)),    # 4 row tiles x 2 slices: 2 combos a lane
    (2, 5, 32, (1, 1)),     # one slice: 4 combos a lane, one warp busy
])
def test_reg_threads_match_the_recurrence(cell, B, H, shape):
    from pydnn.ops.rnn import persist
    assert persist.reg_shape("f16", B, H, 8) == shape
    mt, ksplit = shape
    G = {2: 4, 3: 3, 1: 1}[cell]
    rng = np.random.default_rng(cell * 100 + B)
    T = 3
    W = rng.uniform(-1, 1, (G * H, H)) / np.sqrt(H)
    bw, br = rng.uniform(-0.3, 0.3, G * H), rng.uniform(-0.3, 0.3, G * H)
    h0, c0 = rng.uniform(-0.5, 0.5, (B, H)), rng.uniform(-0.5, 0.5, (B, H))
    xs_all = [rng.uniform(-1, 1, (B, G * H)) for _ in range(T)]
    lens = rng.integers(1, T + 1, B)
    ref = _reference(cell, G, B, H, W, h0, c0, xs_all, bw, br, lens)
    h, st = h0.copy(), c0.copy()
    for t in range(T):
        h, st = _step_threads(cell, G, B, H, ksplit, 16 * mt, W, h, xs_all[t], bw, br, st, h, lens, t)
        np.testing.assert_allclose(h, ref[t], rtol=1e-9, atol=1e-9)


def _bwd_rec_threads(B, H, G, ksplit, dprev, W):
    """persist_bwd_r's block GEMM and reduction, thread by thread: rec [B, H] = dprev [B, G H] x W [G H, H] as
    the owners of the combos hold it."""
    GH = G * H
    ksw = (GH >> 4) // ksplit
    rec = np.full((B, H), np.nan)
    for bx in range(H // 8):
        j0 = bx * 8
        parts, red = {}, {}
        for warp in range(8):
            mt, ks = warp // ksplit, warp % ksplit
            kcol0 = ks * ksw * 16
            acc = [np.zeros((32, 4)) for _ in range(4)]
            for kk in range(ksw):
                i, w = kk >> 1, 2 * (kk & 1)
                afr, bfr = [], []
                for lane in range(32):
                    gq, q = lane >> 2, lane & 3
                    r0 = mt * 16 + gq
                    rows = []
                    for rh in range(2):
                        r = r0 + 8 * rh
                        off = r * GH + kcol0 + 8 * q + 32 * i
                        v = dprev.reshape(-1)[off:off + 8] if r < B else np.zeros(8)
                        rows.append([v[2 * k:2 * k + 2] for k in range(4)])
                    afr.append([rows[0][w], rows[1][w], rows[0][w + 1], rows[1][w + 1]])
                    k0 = kcol0 + (kk >> 1) * 32 + 8 * q + 4 * (kk & 1)
                    col = W.reshape(-1)[k0 * H + j0 + gq::H][:4]  # w[0], w[H], w[2H], w[3H]
                    bfr.append([col[0:2], col[2:4]])
                _mma(afr, bfr, acc[kk & 3])
            parts[warp] = ((acc[0] + acc[1]) + acc[2]) + acc[3]
            for lane in range(32):
                r0 = mt * 16 + (lane >> 2)
                for c in range(4):
                    if r0 + 8 * (c >> 1) < B and c % ksplit != ks and ksplit > 1:
                        red[(warp * 4 + c) * 32 + lane] = parts[warp][lane][c]
        for warp in range(8):
            mt, ks = warp // ksplit, warp % ksplit
            for lane in range(32):
                gq, q = lane >> 2, lane & 3
                for c in range(4):
                    b, j = mt * 16 + gq + 8 * (c >> 1), j0 + 2 * q + (c & 1)
                    if b < B and c % ksplit == ks:
                        assert np.isnan(rec[b, j])  # one owner
                        rec[b, j] = sum(parts[warp][lane][c] if k2 == ks
                                        else red[((mt * ksplit + k2) * 4 + c) * 32 + lane] for k2 in range(ksplit))
    return rec


@pytest.mark.parametrize("B,H,G,shape", [(20, 64, 4, (2, 4)), (7, 64, 3, (1, 2)), (40, 32, 4, (4, 2)),
                                         (5, 32, 1, (1, 1))])
def test_bwd_reg_threads_match_the_product(B, H, G, shape):
    from pydnn.ops.rnn import persist
    assert persist.bwd_reg_shape("f16", B, H, G, 8) == shape
    rng = np.random.default_rng(B * H + G)
    dprev, W = rng.standard_normal((B, G * H)), rng.standard_normal((G * H, H))
    rec = _bwd_rec_threads(B, H, G, shape[1], dprev, W)
    np.testing.assert_allclose(rec, dprev @ W, rtol=1e-9, atol=1e-9)
