"""ptx/rnn_persist.cu re-stated in numpy for the CPU emulation of the device (rnn_emulator.py): block by block
and step by step, with each block's shared memory one byte array laid out at the offsets the host chose
(PersistParams.off_*: overlapping regions would corrupt the results), the slice mapping (block x owns
hidden units [x * units, + units), row g * units + u of its weight slice = W row g * hidden + j0 + u), the
block GEMM's K slices and their partial sums, the state slots (ping-pong in inference) and the barrier
(every block finishes step s before any starts step s + 1, which is what the counter barrier guarantees)."""
import numpy as np

from rnn_emulator import _f, _s, _sig


def _ahead(p):
    return bool(p.variant & 4) and p.nchunk == 1  # PV_XS_AHEAD (the host sets it only with the barrier)


def _views(smem, p, dt, bwd, G):
    B, U = p.batch, p.units
    N = U if bwd else G * U
    es = np.dtype(dt).itemsize

    def v(off, n, t):
        t = np.dtype(t)
        assert off % t.itemsize == 0 and off + n * t.itemsize <= len(smem), (off, n, t, len(smem))
        return smem[off:off + n * t.itemsize].view(t)

    nbuf = 2 if p.nchunk > 1 else 1
    out = dict(w=v(p.off_w, N * p.wpitch, dt).reshape(N, p.wpitch),
               a=v(p.off_a, nbuf * p.bp * p.pitch, dt).reshape(nbuf, p.bp, p.pitch),
               part=v(p.off_part, p.ksplit * p.bp * N, np.float32).reshape(p.ksplit, p.bp, N),
               s=v(p.off_s, B * U, np.float32).reshape(B, U), lens=v(p.off_lens, B, np.int32))
    if bwd:
        out["s2"] = v(p.off_s2, B * U, np.float32).reshape(B, U)
    else:
        nx = 2 if _ahead(p) else 1  # PV_XS_AHEAD: step s's input projection slice in buffer s & 1
        out["x"] = v(p.off_x, nx * B * N, dt).reshape(nx, B, N)
        out["b"] = v(p.off_b, 2 * N, np.float32)
        out["h"] = v(p.off_h, B * U, dt).reshape(B, U)
    assert es in (2, 4)
    return out


def _gemm(sm, p, dt, N, full):
    """The [B, K] operand `full` (dt storage) chunk by chunk through the A buffers (chunk c in buffer c & 1,
    kp columns; one chunk: all of K, zero padded), part[ks] (+)= A[:, slice ks] x W[:, chunk c, slice ks]^T
    in float32 (16-bit: K slices of whole 16-wide k-steps)."""
    es = np.dtype(dt).itemsize
    B, K = full.shape
    kc = p.kp
    assert (p.nchunk == 1 and kc >= K) or kc * p.nchunk == K
    per = (kc // 16) // p.ksplit * 16 if es == 2 else kc // p.ksplit
    assert per * p.ksplit == kc
    for c in range(p.nchunk):
        buf = sm["a"][c & 1]
        kreal = min(kc, K)
        buf[:B, :kreal] = full[:, c * kc:c * kc + kreal]
        A, Bm = _f(buf[:, :kc], dt), _f(sm["w"][:, c * kc:(c + 1) * kc], dt)
        for ks in range(p.ksplit):
            k0 = ks * per
            prod = A[:, k0:k0 + per].astype(np.float32) @ Bm[:, k0:k0 + per].astype(np.float32).T
            sm["part"][ks] = prod if c == 0 else sm["part"][ks] + prod


def _slot(p, i):
    return i & 1 if p.pingpong else i


def persist_reset(dev, p, dt, cell, grid, smem):
    for y in range(grid[1]):
        dev.view(p.dir[y].bar, 1, np.uint32)[0] = 0
        if p.dir[y].xchg:
            dev.view(p.dir[y].xchg, p.xwords, np.uint32)[:] = 0


def _xchg_words(dev, d, dt, slot, B, H):
    """(values as dt storage [B, H], tags [B, H]) of a tagged-exchange slot (u32: value bits | tag << 16;
    float: u64, the tag in the high word)."""
    if np.dtype(dt).itemsize == 4:
        w = dev.view(d.xchg + slot * B * H * 8, B * H, np.uint64).reshape(B, H)
        return (w & 0xFFFFFFFF).astype(np.uint32).view(np.float32), (w >> 32).astype(np.int64)
    w = dev.view(d.xchg + slot * B * H * 4, B * H, np.uint32).reshape(B, H)
    return (w & 0xFFFF).astype(np.uint16).view(dt), (w >> 16).astype(np.int64)


def _xchg_put(dev, d, dt, slot, B, H, j0, vals, tag):
    """Publish vals [B, U] (dt storage) of units j0.. with tag into slot."""
    U = vals.shape[1]
    if np.dtype(dt).itemsize == 4:
        w = dev.view(d.xchg + slot * B * H * 8, B * H, np.uint64).reshape(B, H)
        w[:, j0:j0 + U] = vals.astype(np.float32).view(np.uint32).astype(np.uint64) | np.uint64(tag << 32)
    else:
        w = dev.view(d.xchg + slot * B * H * 4, B * H, np.uint32).reshape(B, H)
        w[:, j0:j0 + U] = vals.view(np.uint16).astype(np.uint32) | np.uint32(tag << 16)


def persist_fwd(dev, p, dt, cell, grid, smem):
    G = 4 if cell == 2 else (3 if cell == 3 else 1)
    GA = 4 if cell >= 2 else 1
    B, H, U, T = p.batch, p.hidden, p.units, p.seq
    N, es = G * U, np.dtype(dt).itemsize
    assert grid[0] * U == H and p.kp * p.nchunk >= H and p.bp >= B
    for y in range(grid[1]):
        d = p.dir[y]
        W = dev.view(d.w, G * H * H, dt).reshape(G * H, H)
        blocks = []
        for x in range(grid[0]):
            sm = _views(np.zeros(smem, np.uint8), p, dt, False, G)
            j0 = x * U
            for g in range(G):
                sm["w"][g * U:(g + 1) * U, :H] = W[g * H + j0:g * H + j0 + U]
                for name, ptr, k in (("bw", d.bw, 0), ("br", d.br, N)):
                    sm["b"][k + g * U:k + (g + 1) * U] = (_f(dev.view(ptr, G * H, dt), dt)[g * H + j0:g * H + j0 + U]
                                                          if ptr else 0)
            first = T if d.rev else 0
            if cell >= 2:
                s0 = dev.view(d.s32 + _slot(p, first) * B * H * 4, B * H, np.float32).reshape(B, H)
                sm["s"][:] = s0[:, j0:j0 + U]
            sm["lens"][:] = dev.view(p.lens, B, np.int32)
            sm["h"][:] = dev.view(d.hs + _slot(p, first) * B * H * es, B * H, dt).reshape(B, H)[:, j0:j0 + U]
            blocks.append((j0, sm))
        for s in range(T):
            t = T - 1 - s if d.rev else s
            ip, io = (t + 1, t) if d.rev else (t, t + 1)
            if s > 0 and d.xchg:  # the words of step s - 1 must all carry tag s
                hprev, tags = _xchg_words(dev, d, dt, (s - 1) & 1, B, H)
                assert (tags == s).all(), (s, np.unique(tags))
                hprev = hprev.copy()
            else:
                hprev = dev.view(d.hs + _slot(p, ip) * B * H * es, B * H, dt).reshape(B, H).copy()
            for j0, sm in blocks:
                xs = sm["x"][s & 1 if _ahead(p) else 0]
                for g in range(G):
                    for b in range(B):
                        row = d.xp + ((t * B + b) * p.ld_xp + g * p.gs_xp + j0) * es
                        xs[b, g * U:(g + 1) * U] = dev.view(row, U, dt)
                _gemm(sm, p, dt, N, hprev)
                part = sm["part"].sum(axis=0)[:B]
                ha = [part[:, g * U:(g + 1) * U] + sm["b"][N + g * U:N + (g + 1) * U] for g in range(G)]
                xa = [_f(xs[:, g * U:(g + 1) * U], dt) + sm["b"][g * U:(g + 1) * U] for g in range(G)]
                active = (t < sm["lens"])[:, None]
                hp_slice = sm["h"].copy()
                h_out = dev.view(d.hs + _slot(p, io) * B * H * es, B * H, dt).reshape(B, H)
                s_out = (dev.view(d.s32 + _slot(p, io) * B * H * 4, B * H, np.float32).reshape(B, H)
                         if cell >= 2 else None)
                act = (dev.view(d.act + t * B * GA * H * 4, B * GA * H, np.float32).reshape(B, GA, H)
                       if d.act else None)
                if cell == 2:
                    cp = sm["s"].copy()
                    i, f, gg, o = _sig(xa[0] + ha[0]), _sig(xa[1] + ha[1]), np.tanh(xa[2] + ha[2]), _sig(xa[3] + ha[3])
                    c = f * cp + i * gg
                    if p.clip:
                        c = np.minimum(np.maximum(c, p.lclip), p.rclip)
                    new, vals = o * np.tanh(c), (i, f, gg, o)
                    sm["s"][:] = np.where(active, c, cp)
                    s_out[:, j0:j0 + U] = sm["s"]
                elif cell == 3:
                    hp32 = sm["s"].copy()
                    r, z = _sig(xa[0] + ha[0]), _sig(xa[1] + ha[1])
                    n = np.tanh(xa[2] + r * ha[2])
                    new, vals = (1 - z) * n + z * hp32, (r, z, n, ha[2])
                    sm["s"][:] = np.where(active, new, hp32)
                    s_out[:, j0:j0 + U] = sm["s"]
                else:
                    a = xa[0] + ha[0]
                    new = np.maximum(a, 0) if cell == 0 else np.tanh(a)
                    vals = (new,)
                h_out[:, j0:j0 + U] = np.where(active, _s(new, dt), hp_slice)
                sm["h"][:] = h_out[:, j0:j0 + U]
                if d.xchg:
                    _xchg_put(dev, d, dt, s & 1, B, H, j0, h_out[:, j0:j0 + U].copy(), s + 1)
                for b in range(B):
                    yrow = dev.view(d.y + (t * p.ld_yt + b * p.ld_y + j0) * es, U, dt)
                    yrow[:] = _s(new[b], dt) if active[b, 0] else 0
                    if act is not None and active[b, 0]:
                        for k, v in enumerate(vals):
                            act[b, k, j0:j0 + U] = v[b]


def persist_bwd(dev, p, dt, cell, grid, smem):
    G = 4 if cell == 2 else (3 if cell == 3 else 1)
    GA = 4 if cell >= 2 else 1
    B, H, U, T = p.batch, p.hidden, p.units, p.seq
    GH, es = G * H, np.dtype(dt).itemsize
    assert grid[0] * U == H and p.kp * p.nchunk >= GH and p.bp >= B
    for y in range(grid[1]):
        d = p.dir[y]
        W = dev.view(d.w, GH * H, dt).reshape(GH, H)
        ghg = dev.view(d.gh, B * H, np.float32).reshape(B, H)
        gcg = dev.view(d.gc, B * H, np.float32).reshape(B, H) if cell == 2 else None
        drec = d.dha or d.dxa
        blocks = []
        for x in range(grid[0]):
            sm = _views(np.zeros(smem, np.uint8), p, dt, True, G)
            j0 = x * U
            sm["w"][:, :GH] = W[:, j0:j0 + U].T
            assert not sm["w"][:, GH:].any()
            sm["s"][:] = ghg[:, j0:j0 + U]
            sm["s2"][:] = gcg[:, j0:j0 + U] if cell == 2 else 0
            sm["lens"][:] = dev.view(p.lens, B, np.int32)
            blocks.append((j0, sm))
        for s in range(T + 1):
            t = s if d.rev else T - 1 - s
            if s > 0:
                tp = t - 1 if d.rev else t + 1
                dprev = dev.view(drec + tp * B * GH * es, B * GH, dt).reshape(B, GH).copy()
                for j0, sm in blocks:
                    _gemm(sm, p, dt, U, dprev)
            for j0, sm in blocks:
                rec = sm["part"].sum(axis=0)[:B] if s > 0 else np.zeros((B, U), np.float32)
                gh, gc = sm["s"], sm["s2"]
                if s == T:
                    ghg[:, j0:j0 + U] = gh + rec
                    if cell == 2:
                        gcg[:, j0:j0 + U] = gc
                    dev.view(d.ghrec, B * H, dt).reshape(B, H)[:, j0:j0 + U] = 0
                    continue
                ip, io = (t + 1, t) if d.rev else (t, t + 1)
                active = (t < sm["lens"])[:, None]
                dh = gh + rec
                if d.dy:
                    dh = dh + np.stack([_f(dev.view(d.dy + (t * p.ld_yt + b * p.ld_y + j0) * es, U, dt), dt)
                                        for b in range(B)])
                act = dev.view(d.act + t * B * GA * H * 4, B * GA * H, np.float32).reshape(B, GA, H)[:, :, j0:j0 + U]
                s32 = (lambda i: dev.view(d.s32 + i * B * H * 4, B * H, np.float32).reshape(B, H)[:, j0:j0 + U])
                if cell == 2:
                    i, f, g, o = act[:, 0], act[:, 1], act[:, 2], act[:, 3]
                    c, cp = s32(io), s32(ip)
                    tc = np.tanh(c)
                    dc = gc + dh * o * (1 - tc * tc)
                    if p.clip:
                        dc = np.where((p.lclip < c) & (c < p.rclip), dc, 0)
                    dd = [dc * g * i * (1 - i), dc * cp * f * (1 - f), dc * i * (1 - g * g), dh * tc * o * (1 - o)]
                    dr = dd
                    new_gc, new_gh = dc * f, np.zeros_like(dh)
                elif cell == 3:
                    r, z, n, han = act[:, 0], act[:, 1], act[:, 2], act[:, 3]
                    hp = s32(ip)
                    dn = dh * (1 - z) * (1 - n * n)
                    dd = [dn * han * r * (1 - r), dh * (hp - n) * z * (1 - z), dn]
                    dr = [dd[0], dd[1], dn * r]
                    new_gc, new_gh = gc, dh * z
                else:
                    h = act[:, 0]
                    dd = [dh * ((h > 0).astype(np.float32) if cell == 0 else 1 - h * h)]
                    dr = dd
                    new_gc, new_gh = gc, np.zeros_like(dh)
                gh[:] = np.where(active, new_gh, gh + rec)
                gc[:] = np.where(active, new_gc, gc)
                for g in range(G):
                    for ptr, vals in ((d.dxa, dd), (d.dha, dr)):
                        if ptr:
                            out = dev.view(ptr + t * B * GH * es, B * GH, dt).reshape(B, GH)
                            out[:, g * H + j0:g * H + j0 + U] = np.where(active, _s(vals[g], dt), 0)


def persist_fwd_r(dev, p, dt, cell, grid, smem):
    """persist_fwd_r (tuning.rnn.PERSIST_REG): 8 units a block, warps over (m tile mt = warp / ksplit, K slice
    ks = warp % ksplit), each warp's slice of K ([ks * ksw * 16, + ksw * 16) physical columns; the permuted order
    inside a 32-column block does not change the set) multiplied in float32, the slices' partial sums added in
    ks order by the combo's owner, then the cell as persist_fwd's (register state: the same values)."""
    G = 4 if cell == 2 else (3 if cell == 3 else 1)
    B, H, U, T, ks_n = p.batch, p.hidden, 8, p.seq, p.ksplit
    N, es = G * U, np.dtype(dt).itemsize
    assert es == 2 and grid[0] * U == H and p.units == U and smem >= 8 * 4 * 32 * 16
    mt_n = p.bp // 16
    assert mt_n * 16 >= B and mt_n * ks_n <= 8 and H % (32 * ks_n) == 0 and H // 16 // ks_n <= 8
    ksw = H // 16 // ks_n
    for y in range(grid[1]):
        d = p.dir[y]
        W = _f(dev.view(d.w, G * H * H, dt).reshape(G * H, H), dt)
        bw = _f(dev.view(d.bw, G * H, dt), dt) if d.bw else np.zeros(G * H, np.float32)
        br = _f(dev.view(d.br, G * H, dt), dt) if d.br else np.zeros(G * H, np.float32)
        first = T if d.rev else 0
        lens = dev.view(p.lens, B, np.int32).copy()
        st = (dev.view(d.s32 + _slot(p, first) * B * H * 4, B * H, np.float32).reshape(B, H).copy() if cell >= 2
              else None)
        hown = dev.view(d.hs + _slot(p, first) * B * H * es, B * H, dt).reshape(B, H).copy()
        cols = [np.concatenate([np.arange(g * H + x * U, g * H + x * U + U) for g in range(G)])
                for x in range(grid[0])]
        for s in range(T):
            t = T - 1 - s if d.rev else s
            ip, io = (t + 1, t) if d.rev else (t, t + 1)
            if s > 0 and d.xchg:  # PERSIST_REG_XCHG: the words of step s - 1 must all carry tag s
                assert ksw <= 4  # KR 4 only
                hw, tags = _xchg_words(dev, d, dt, (s - 1) & 1, B, H)
                assert (tags == s).all(), (s, np.unique(tags))
                hprev = _f(hw.copy(), dt).astype(np.float32)
            else:
                hprev = _f(dev.view(d.hs + _slot(p, ip) * B * H * es, B * H, dt).reshape(B, H), dt).astype(np.float32)
            x = np.stack([_f(dev.view(d.xp + ((t * B + b) * p.ld_xp) * es, p.ld_xp, dt), dt) for b in range(B)])
            h_out = dev.view(d.hs + _slot(p, io) * B * H * es, B * H, dt).reshape(B, H)
            active = (t < lens)[:, None]
            new_h = hown.copy()
            for xb in range(grid[0]):
                j0 = xb * U
                Wb = W[cols[xb]]  # [G * 8, H]: row g * 8 + u
                part = np.zeros((B, N), np.float32)
                for k2 in range(ks_n):  # the owner's order
                    k0 = k2 * ksw * 16
                    part = part + hprev[:, k0:k0 + ksw * 16] @ Wb[:, k0:k0 + ksw * 16].T
                ha = [part[:, g * U:(g + 1) * U] + br[g * H + j0:g * H + j0 + U] for g in range(G)]
                xa = [x[:, g * p.gs_xp + j0:g * p.gs_xp + j0 + U] + bw[g * H + j0:g * H + j0 + U] for g in range(G)]
                sl = slice(j0, j0 + U)
                if cell == 2:
                    i, f, gg, o = _sig(xa[0] + ha[0]), _sig(xa[1] + ha[1]), np.tanh(xa[2] + ha[2]), _sig(xa[3] + ha[3])
                    c = f * st[:, sl] + i * gg
                    if p.clip:
                        c = np.minimum(np.maximum(c, p.lclip), p.rclip)
                    new, vals = o * np.tanh(c), (i, f, gg, o)
                    st[:, sl] = np.where(active, c, st[:, sl])
                elif cell == 3:
                    r, z = _sig(xa[0] + ha[0]), _sig(xa[1] + ha[1])
                    n = np.tanh(xa[2] + r * ha[2])
                    new, vals = (1 - z) * n + z * st[:, sl], (r, z, n, ha[2])
                    st[:, sl] = np.where(active, new, st[:, sl])
                else:
                    a = xa[0] + ha[0]
                    new = np.maximum(a, 0) if cell == 0 else np.tanh(a)
                    vals = (new,)
                new_h[:, sl] = np.where(active, _s(new, dt), hown[:, sl])
                act = (dev.view(d.act + t * B * len(vals) * H * 4, B * len(vals) * H, np.float32)
                       .reshape(B, len(vals), H) if d.act else None)
                for b in range(B):
                    yrow = dev.view(d.y + (t * p.ld_yt + b * p.ld_y + j0) * es, U, dt)
                    yrow[:] = new_h[b, sl] if active[b, 0] else 0
                    if act is not None and active[b, 0]:
                        for k, v in enumerate(vals):
                            act[b, k, sl] = v[b]
            hown = new_h
            h_out[:] = hown
            if d.xchg:
                _xchg_put(dev, d, dt, s & 1, B, H, 0, hown.copy(), s + 1)
            if cell >= 2:
                dev.view(d.s32 + _slot(p, io) * B * H * 4, B * H, np.float32).reshape(B, H)[:] = st


def persist_bwd_r(dev, p, dt, cell, grid, smem):
    """persist_bwd_r (tuning.rnn.PERSIST_BWD_REG): its shape constraints, then persist_bwd's numbers (the block
    GEMM over all of K at once; the host's general layout still sits in p's offsets, K slices left out)."""
    import ctypes
    G = 4 if cell == 2 else (3 if cell == 3 else 1)
    B, H = p.batch, p.hidden
    mt, ks = p.bp // 16, p.ksplit
    assert np.dtype(dt).itemsize == 2 and p.units == 8 and grid[0] * 8 == H and smem >= 8 * 4 * 32 * 4 * 2
    assert mt * 16 >= B and mt * ks <= 8 and (G * H) % (32 * ks) == 0 and G * H // 16 // ks <= 16
    q = type(p).from_buffer_copy(p)
    q.bp, q.ksplit = -(-B // 16) * 16, 1
    persist_bwd(dev, q, dt, cell, grid, 1 << 23)


PERSIST = {"persist_reset": persist_reset, "persist_fwd": persist_fwd, "persist_bwd": persist_bwd,
           "persist_fwd_r": persist_fwd_r, "persist_bwd_r": persist_bwd_r}
