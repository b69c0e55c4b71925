"""A CPU emulation of the device for pydnn/ops/rnn/engine.py: device memory is one numpy byte array
(pointers are byte addresses into it), pydnn.ops.matmul.gemm is its documented formula in numpy, and each
ptx/rnn.cu kernel is re-stated in numpy from its CUDA source. It runs the engine's real Python (buffer
layout, pointer arithmetic, launch order) so that its index math is checked without a GPU."""
import ctypes

import numpy as np

from pydnn import enums as E
from pydnn.reference import dtypes as rd
from pydnn.handle import Handle
from pydnn.ops.rnn import kernels as K

GUARD = 4096
# emu_gemm row by row (each row of C one vector-matrix product: its bits independent of the GEMM's M; numpy's
# matrix product rounds a row differently for different M), for the tests that compare two launch orders bitwise
ROWWISE = False
NP = {E.PYDNN_DATA_FLOAT: np.float32, E.PYDNN_DATA_HALF: np.float16, E.PYDNN_DATA_BFLOAT16: np.uint16,
      E.PYDNN_DATA_DOUBLE: np.float64}


class Device:
    def __init__(self, nbytes=1 << 26):
        # addresses are real host addresses of self.mem (4 KiB aligned), so that kernels compiled for the
        # host (test_rnn_kernels_host_cpu.py) can run on it directly
        self.raw = np.zeros(nbytes + 8192, np.uint8)
        addr = self.raw.ctypes.data
        self.base = -(-addr // 4096) * 4096
        self.mem = self.raw[self.base - addr:self.base - addr + nbytes]
        self.top = GUARD
        self.guards = []

    def alloc(self, nbytes):
        ptr = self.base + self.top
        n = -(-max(int(nbytes), 1) // 256) * 256
        self.mem[self.top:self.top + n] = 0xFF  # poison: NaN in every float type
        self.top += n
        self.guards.append((self.top, GUARD))
        self.mem[self.top:self.top + GUARD] = 0xA5  # guard band: must stay untouched
        self.top += GUARD
        assert self.top < len(self.mem)
        return ptr

    def view(self, ptr, n, dt):
        off = ptr - self.base
        dt = np.dtype(dt)
        assert off >= 0 and off % dt.itemsize == 0, (ptr, dt)
        return self.mem[off:off + n * dt.itemsize].view(dt)

    def put(self, arr):
        arr = np.ascontiguousarray(arr)
        p = self.alloc(arr.nbytes)
        self.view(p, arr.size, arr.dtype)[:] = arr.ravel()
        return p

    def write(self, ptr, arr):
        arr = np.ascontiguousarray(arr)
        self.view(ptr, arr.size, arr.dtype)[:] = arr.ravel()

    def read(self, ptr, n, dt):
        return self.view(ptr, n, dt).copy()

    def sync(self):
        pass

    def dropout_desc(self, handle, p):
        return dropout_descriptor(self, p)

    def guards_intact(self):
        return all(np.all(self.mem[o:o + n] == 0xA5) for o, n in self.guards)


def dropout_descriptor(dev, p):
    """A set dropout descriptor without the GPU (its states are never read by the emulation)."""
    from pydnn.ops.dropout import DropoutDescriptor
    d = DropoutDescriptor()
    d.is_set, d.dropout, d.states, d.state_size = True, p, dev.alloc(32), 32
    return d


def fake_handle():
    h = Handle.__new__(Handle)
    h.alive, h.prepared, h.arch, h.sm_count, h._funcs = True, {}, "sm_90", 132, {}
    h.stream, h.cu_stream, h.ctx, h.device = 0, 0, None, 0
    return h


def _acc(dt):
    """ptx/rnn.cu's Acc<T> (the math and state type): float, double for double."""
    return np.float64 if dt == np.float64 else np.float32


def _f(v, dt):
    """Stored values (bf16 as uint16 bits) as float32 (double as double)."""
    if dt == np.uint16:
        return (v.astype(np.uint32) << 16).view(np.float32)
    return v.astype(_acc(dt))


def _s(v, dt):
    """float values rounded to the storage type (bf16: nearest even, as the GPU)."""
    if dt == np.uint16:
        return rd.to_storage(np.asarray(v, np.float64).astype(np.float32).astype(np.float64), E.PYDNN_DATA_BFLOAT16)
    return np.asarray(v).astype(dt)


def emu_gemm(dev, dt, m, n, k, a, b, c, alpha, beta, trans_a, trans_b, lda, ldb, ldc):
    """pydnn.ops.matmul's documented formula (products of dt values summed in float32, C rounded to dt)."""
    A = _f(dev.view(a, ((k - 1) * lda + m) if trans_a else ((m - 1) * lda + k), dt), dt)
    Bm = _f(dev.view(b, ((n - 1) * ldb + k) if trans_b else ((k - 1) * ldb + n), dt), dt)
    opA = np.stack([A[i::lda][:k] for i in range(m)]) if trans_a else np.stack([A[i * lda:i * lda + k] for i in range(m)])
    opB = np.stack([Bm[j * ldb:j * ldb + k] for j in range(n)]).T if trans_b else np.stack([Bm[q * ldb:q * ldb + n] for q in range(k)])
    C = dev.view(c, (m - 1) * ldc + n, dt)
    res = alpha * (np.stack([opA[i] @ opB for i in range(m)]) if ROWWISE else opA @ opB).astype(np.float64)
    for i in range(m):
        row = C[i * ldc:i * ldc + n]
        row[:] = _s(res[i] + (beta * _f(row, dt).astype(np.float64) if beta else 0.0), dt)


def install(monkeypatch, dev, dtype, host_lib=None):
    """Route the engine's launches (engine._launch) to the numpy kernels (or, with host_lib, to ptx/rnn.cu
    itself compiled for the host) and the numpy GEMM; Handle.function returns a token (no module is loaded). The engine's own GEMM launch records (_gemm_params: the real plan, its
    checks and its params struct) are what the emulated GEMM reads."""
    from pydnn.ops.rnn import engine

    dt = NP[dtype]
    monkeypatch.setattr(Handle, "function", lambda self, unit, expr, smem=0: (unit, expr))
    calls = []

    rng = np.random.default_rng(99)

    def launch(handle, f, grid, block, smem, args, meta):
        calls.append(meta[:2] if meta[0] == "call" else meta)
        if meta[0] == "call":  # DropoutForward / Backward on a [rows, cols] tensor, pydnn's mask-bit layout
            fn, (_, dd, td, xin, _, yout, mask, _) = meta[1], meta[2]
            n = td.count
            scale = 1.0 / (1.0 - dd.dropout)
            src = _f(dev.view(xin, n, dt), dt)
            bits = dev.view(mask, (n + 7) // 8, np.uint8)
            if fn.__name__ == "dropout_forward":
                keep = rng.uniform(size=n) >= dd.dropout
                packed = np.zeros((n + 7) // 8 * 8, np.uint8)
                packed[:n] = keep
                bits[:] = np.packbits(packed.reshape(-1, 8)[:, ::-1], axis=1).ravel()
            else:
                keep = np.unpackbits(bits.reshape(-1, 1), axis=1)[:, ::-1].ravel()[:n].astype(bool)
            dev.view(yout, n, dt)[:] = _s(np.where(keep, src * scale, 0), dt)
            return
        p = args[2]
        if meta[0] == "rnn" and host_lib is not None:
            tag = {np.float32: "f32", np.float16: "f16", np.uint16: "bf16", np.float64: "f64"}[dt]
            rc = getattr(host_lib, f"rnn_host_{tag}")(meta[1].encode(), meta[2] or 0, ctypes.byref(p), grid[0],
                                                       grid[1])
            assert rc == 0, meta
        elif meta[0] == "persist":  # PERSIST_STATIC: rnn_persist_emulator.py, block by block
            from rnn_persist_emulator import PERSIST
            PERSIST[meta[1]](dev, p, dt, meta[2], grid, smem)
        elif meta[0] == "rnn":
            KERNELS[meta[1]](dev, p, dt, meta[2])
            for y in range(1, grid[1]):  # the other rows of blocks (RnnDir2), as ptx/rnn.cu's direction()
                if meta[1] in ("bias_partial",):
                    break
                q = K.RnnParams.from_buffer_copy(p)
                for name in K.DIR2:
                    if getattr(q, name):
                        setattr(q, name, getattr(q, name) + getattr(p.dir2[y - 1], name))
                q.t = p.dir2[y - 1].t
                KERNELS[meta[1]](dev, q, dt, meta[2])
        else:
            _, ta, tb, m, n, k = meta
            assert (p.m, p.n, p.k) == (m, n, k)
            from pydnn.ops.matmul import FLAG_BETA
            es = np.dtype(dt).itemsize
            for z in range(p.batch):
                emu_gemm(dev, dt, p.m, p.n, p.k, p.a + z * p.stride_a * es, p.b + z * p.stride_b * es,
                         p.c + z * p.stride_c * es, p.alpha, p.beta if p.flags & FLAG_BETA else 0.0, ta, tb,
                         p.lda, p.ldb, p.ldc)

    monkeypatch.setattr(engine, "_launch", launch)
    return calls


# ----------------------------------------------------------------------------- kernels, from ptx/rnn.cu

def _sig(v):
    return 1.0 / (1.0 + np.exp(-v))


def _st(dev, ptr, n, dt):
    """A state buffer (RnnParams' void * ones): float, double for double."""
    return dev.view(ptr, n, _acc(dt))


def _split(dev, p, ptr, n, dt):
    """The sum of the nsplit partial results (split_stride elements apart) as float32."""
    es = np.dtype(dt).itemsize
    return sum(dev.view(ptr + z * p.split_stride * es, n, dt).astype(_acc(dt)) for z in range(max(p.nsplit, 1)))


def fwd_cell(dev, p, dt, cell):
    B, H, P = p.batch, p.hidden, p.out
    G = 4 if cell == 2 else (3 if cell == 3 else 1)
    proj = cell == 2 and P != H
    lens = dev.view(p.lens, B, np.int32)
    act_rows = p.t < lens
    xa, ha = [], []
    for g in range(G):
        X = np.stack([dev.view(p.xp + (b * p.ld_xp + g * p.gs_xp) * dt().itemsize, H, dt) for b in range(B)]).astype(_acc(dt))
        Hp = _split(dev, p, p.hp, B * G * H, dt).reshape(B, G, H)[:, g]
        if p.bw:
            X = X + dev.view(p.bw, G * H, dt)[g * H:(g + 1) * H].astype(_acc(dt))
        if p.br:
            Hp = Hp + dev.view(p.br, G * H, dt)[g * H:(g + 1) * H].astype(_acc(dt))
        xa.append(X)
        ha.append(Hp)
    a = act_rows[:, None]
    hout = dev.view(p.h_out, B * H, dt).reshape(B, H)
    y = [dev.view(p.y + b * p.ld_y * dt().itemsize, H, dt) for b in range(B)] if p.y else None
    act = _st(dev, p.act, B * (4 if cell >= 2 else 1) * H, dt).reshape(B, -1, H) if p.act else None
    if cell == 2:
        cp = _st(dev, p.s_prev, B * H, dt).reshape(B, H).copy()
        i, f, g, o = _sig(xa[0] + ha[0]), _sig(xa[1] + ha[1]), np.tanh(xa[2] + ha[2]), _sig(xa[3] + ha[3])
        c = f * cp + i * g
        if p.clip:
            c = np.minimum(np.maximum(c, p.lclip), p.rclip)
        m = o * np.tanh(c)
        _st(dev, p.s_out, B * H, dt).reshape(B, H)[:] = np.where(a, c, cp)
        if proj:
            hout[:] = np.where(a, m, 0).astype(dt)
        else:
            hprev = dev.view(p.h_prev, B * H, dt).reshape(B, H).copy()
            hout[:] = np.where(a, m.astype(dt), hprev)
        newh = m
        if act is not None:
            for k, v in enumerate((i, f, g, o)):
                act[:, k][act_rows] = v[act_rows]
    elif cell == 3:
        hp32 = _st(dev, p.s_prev, B * H, dt).reshape(B, H).copy()
        r, z = _sig(xa[0] + ha[0]), _sig(xa[1] + ha[1])
        n = np.tanh(xa[2] + r * ha[2])
        h = (1 - z) * n + z * hp32
        _st(dev, p.s_out, B * H, dt).reshape(B, H)[:] = np.where(a, h, hp32)
        hprev = dev.view(p.h_prev, B * H, dt).reshape(B, H).copy()
        hout[:] = np.where(a, h.astype(dt), hprev)
        newh = h
        if act is not None:
            for k, v in enumerate((r, z, n, ha[2])):
                act[:, k][act_rows] = v[act_rows]
    else:
        s = xa[0] + ha[0]
        h = np.maximum(s, 0) if cell == 0 else np.tanh(s)
        hprev = dev.view(p.h_prev, B * H, dt).reshape(B, H).copy()
        hout[:] = np.where(a, h.astype(dt), hprev)
        newh = h
        if act is not None:
            act[:, 0][act_rows] = h[act_rows]
    if y is not None and not proj:
        for b in range(B):
            y[b][:] = newh[b].astype(dt) if act_rows[b] else 0


def proj_commit(dev, p, dt, cell):
    B, P = p.batch, p.out
    lens = dev.view(p.lens, B, np.int32)
    if p.nsplit > 1:  # the projection GEMM's split-K partial sums, added in float and rounded once
        src = _s(_split(dev, p, p.aux_in, B * P, dt), dt).reshape(B, P)
    else:
        src = dev.view(p.aux_in, B * P, dt).reshape(B, P).copy()
    hp = dev.view(p.h_prev, B * P, dt).reshape(B, P).copy()
    a = (p.t < lens)[:, None]
    dev.view(p.h_out, B * P, dt).reshape(B, P)[:] = np.where(a, src, hp)
    if p.y:
        for b in range(B):
            dev.view(p.y + b * p.ld_y * dt().itemsize, P, dt)[:] = src[b] if a[b, 0] else 0


def state_init(dev, p, dt, cell):
    B, P, H = p.batch, p.out, p.hidden
    dev.view(p.h_out, B * P, dt)[:] = dev.view(p.h_prev, B * P, dt) if p.h_prev else 0
    if p.s_out:
        src = p.aux_in if p.mode == 2 else p.h_prev
        _st(dev, p.s_out, B * H, dt)[:] = dev.view(src, B * H, dt).astype(_acc(dt)) if src else 0


def state_out(dev, p, dt, cell):
    B, P, H = p.batch, p.out, p.hidden
    if p.aux:
        dev.view(p.aux, B * P, dt)[:] = dev.view(p.h_prev, B * P, dt)
    if p.dxa:
        dev.view(p.dxa, B * H, dt)[:] = _st(dev, p.s_prev, B * H, dt).astype(dt)


def pack(dev, p, dt, cell):
    T, B, V = p.seq, p.batch, p.vec
    lens = dev.view(p.lens, B, np.int32)
    for t in range(T):
        for b in range(B):
            valid = t < lens[b]
            if p.layout == 0:
                urow = t * B + b
            elif p.layout == 2:
                urow = b * T + t
            else:
                urow = sum(min(int(lens[k]), t) + (1 if (k < b and lens[k] > t) else 0) for k in range(B))
            irow = t * B + b
            if p.mode == 0:
                dev.view(p.aux + irow * V * dt().itemsize, V, dt)[:] = (
                    dev.view(p.aux_in + urow * V * dt().itemsize, V, dt) if valid else 0)
            elif valid:
                dev.view(p.aux + urow * V * dt().itemsize, V, dt)[:] = dev.view(p.aux_in + irow * V * dt().itemsize, V, dt)
            elif p.layout != 1 and p.mode == 1:
                dev.view(p.aux + urow * V * dt().itemsize, V, dt)[:] = p.fill


def bwd_cell(dev, p, dt, cell):
    B, H, P = p.batch, p.hidden, p.out
    G = 4 if cell == 2 else (3 if cell == 3 else 1)
    proj = cell == 2 and P != H
    lens = dev.view(p.lens, B, np.int32)
    act_rows = p.t < lens
    a = act_rows[:, None]
    gh = _st(dev, p.gh, B * P, dt).reshape(B, P)
    ghrec = _split(dev, p, p.ghrec, B * P, dt).reshape(B, P)
    dxa = dev.view(p.dxa, B * G * H, dt).reshape(B, G, H)
    dha = dev.view(p.dha, B * G * H, dt).reshape(B, G, H) if p.dha else None
    if proj:
        dh = dev.view(p.dm, B * H, dt).reshape(B, H).astype(_acc(dt))
    else:
        dh = gh + ghrec
        if p.dy:
            dh = dh + np.stack([dev.view(p.dy + b * p.ld_y * dt().itemsize, H, dt) for b in range(B)]).astype(_acc(dt))
    act = _st(dev, p.act, B * (4 if cell >= 2 else 1) * H, dt).reshape(B, -1, H)
    if cell == 2:
        i, f, g, o = (act[:, k] for k in range(4))
        c = _st(dev, p.s_out, B * H, dt).reshape(B, H)
        cp = _st(dev, p.s_prev, B * H, dt).reshape(B, H)
        tc = np.tanh(c)
        gc = _st(dev, p.gc, B * H, dt).reshape(B, H)
        dc = gc + dh * o * (1 - tc * tc)
        if p.clip:
            dc = np.where((p.lclip < c) & (c < p.rclip), dc, 0)
        d = [dc * g * i * (1 - i), dc * cp * f * (1 - f), dc * i * (1 - g * g), dh * tc * o * (1 - o)]
        dr = d
        gc[:] = np.where(a, dc * f, gc)
        newgh = np.zeros_like(dh)
    elif cell == 3:
        r, z, n, han = (act[:, k] for k in range(4))
        hp = _st(dev, p.s_prev, B * H, dt).reshape(B, H)
        dn = dh * (1 - z) * (1 - n * n)
        d = [dn * han * r * (1 - r), dh * (hp - n) * z * (1 - z), dn]
        dr = [d[0], d[1], dn * r]
        newgh = dh * z
    else:
        h = act[:, 0]
        d = [dh * ((h > 0) if cell == 0 else (1 - h * h))]
        dr = d
        newgh = np.zeros_like(dh)
    if not proj:
        gh[:] = np.where(a, newgh, gh + ghrec)
    for k in range(G):
        dxa[:, k] = np.where(a, d[k], 0).astype(dt)
        if dha is not None:
            dha[:, k] = np.where(a, dr[k], 0).astype(dt)


def bwd_proj_pre(dev, p, dt, cell):
    B, P = p.batch, p.out
    lens = dev.view(p.lens, B, np.int32)
    a = (p.t < lens)[:, None]
    gh = _st(dev, p.gh, B * P, dt).reshape(B, P)
    g = gh + _split(dev, p, p.ghrec, B * P, dt).reshape(B, P)
    dy = np.stack([dev.view(p.dy + b * p.ld_y * dt().itemsize, P, dt) for b in range(B)]).astype(_acc(dt)) if p.dy else 0
    dev.view(p.aux, B * P, dt).reshape(B, P)[:] = np.where(a, g + dy, 0).astype(dt)
    gh[:] = np.where(a, 0, g)


def bwd_state_init(dev, p, dt, cell):
    B, P, H = p.batch, p.out, p.hidden
    _st(dev, p.gh, B * P, dt)[:] = dev.view(p.dy, B * P, dt).astype(_acc(dt)) if p.dy else 0
    for z in range(max(p.nsplit, 1)):
        dev.view(p.aux + z * p.split_stride * np.dtype(dt).itemsize, B * P, dt)[:] = 0
    if p.gc:
        _st(dev, p.gc, B * H, dt)[:] = dev.view(p.dm, B * H, dt).astype(_acc(dt)) if p.dm else 0


def bwd_state_out(dev, p, dt, cell):
    B, P, H = p.batch, p.out, p.hidden
    if p.aux:
        dev.view(p.aux, B * P, dt)[:] = (_st(dev, p.gh, B * P, dt) + _split(dev, p, p.ghrec, B * P, dt)).astype(dt)
    if p.dxa:
        dev.view(p.dxa, B * H, dt)[:] = _st(dev, p.gc, B * H, dt).astype(dt)


def skip_dx(dev, p, dt, cell):
    R, H, G = p.rows, p.hidden, p.cols
    src = dev.view(p.aux_in, R * G * H, dt).reshape(R, G, H).astype(_acc(dt)).sum(1)
    for r in range(R):
        row = dev.view(p.aux + r * p.ld_aux * dt().itemsize, H, dt)
        row[:] = (src[r] + (row.astype(_acc(dt)) if p.mode & K.MODE_ADD else 0)).astype(dt)


def bias_partial(dev, p, dt, cell, chunks=None):
    R, C, ld, ch = p.rows, p.cols, p.ld_aux, p.vec
    src = dev.view(p.aux_in, (R - 1) * ld + C, dt)
    rows = np.stack([src[r * ld:r * ld + C] for r in range(R)]).astype(_acc(dt))
    for y in range(-(-R // ch)):
        _st(dev, p.s_out + y * C * np.dtype(_acc(dt)).itemsize, C, dt)[:] = rows[y * ch:(y + 1) * ch].sum(0)


def bias_final(dev, p, dt, cell):
    C = p.cols
    s = _st(dev, p.s_prev, p.seq * C, dt).reshape(p.seq, C).sum(0)
    out = dev.view(p.aux, C, dt)
    out[:] = (s + (out.astype(_acc(dt)) if p.mode & K.MODE_ADD else 0)).astype(dt)


KERNELS = {"bias_partial": bias_partial, "bias_final": bias_final, "fwd_cell": fwd_cell, "proj_commit": proj_commit, "state_init": state_init, "state_out": state_out,
           "pack": pack, "bwd_cell": bwd_cell, "bwd_proj_pre": bwd_proj_pre, "bwd_state_init": bwd_state_init,
           "bwd_state_out": bwd_state_out, "skip_dx": skip_dx}
