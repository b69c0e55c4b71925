"""PYDNN_RNN_ALGO_PERSIST_STATIC: the recurrence of each layer as one persistent kernel (ptx/rnn_persist.cu).

The input projection of every step stays one large GEMM (as STANDARD); then one launch per layer (both
directions of a bidirectional layer in the same grid when 2 * blocks fit the SMs, else one launch per
direction) runs all T steps: block x owns `units` hidden units (all G gates of them), keeps its slice of the
recurrent weights in shared memory for the whole sequence, and the blocks of a direction meet at a global
counter barrier after each step. Every block must be resident at once: at most one block per SM (grid <=
SM count; the kernel uses all 256 threads and most of the shared memory), checked with the driver's
occupancy query before the first launch. Backward data runs the same way over reversed time (block x: the
dh of its units = d_prev x W[:, units]); backward weights is STANDARD's (one GEMM per matrix over all steps).

The reserve space and the workspace are STANDARD's (the same layout: the backward of either algorithm reads
what either forward wrote), plus 256 bytes of workspace for the barrier counters. NOT_SUPPORTED (with the
reason) when: the data type is not float / half / bfloat16, there is an LSTM projection, hiddenSize is not a
multiple of 8, or no slice width fits (the weight slice + the [batch, K] operand's buffers + the partial sums
over the device's opt-in shared memory per block, with hiddenSize / units blocks <= the SM count); training
also needs the backward's (its operand is [batch, G * hiddenSize]). The operand passes through shared memory
at once where it fits, else in K chunks through two buffers (Layout).
"""
import ctypes

from ... import enums as E
from ... import tuning
from ..._build.manifest import KernelUnit
from ..._build.params import kernel_params
from ..._cuda import driver
from ..common import cdiv
from .descriptors import LSTM, _ns

THREADS = 256
WARPS = THREADS // 32
BAR_STRIDE = 1024  # bytes between the directions' barrier words (kBarWords: the counter, then the flags)
FLAG_OFF = 32      # kFlagOff: the first flag word (PV_FLAGS: one per block)
MAX_FLAG_BLOCKS = BAR_STRIDE // 4 - FLAG_OFF
BAR_BYTES = 2 * BAR_STRIDE
TAGS = ("f32", "f16", "bf16")
CTYPE = {"f32": "float", "f16": "pydnn::half_t", "bf16": "pydnn::bf16_t"}
DTYPES = {E.PYDNN_DATA_FLOAT: "f32", E.PYDNN_DATA_HALF: "f16", E.PYDNN_DATA_BFLOAT16: "bf16"}
# the opt-in shared memory per block where the driver cannot be asked (CPU tests): by arch
SMEM_OPTIN = {"sm_80": 166912, "sm_86": 101376, "sm_87": 166912, "sm_89": 101376, "sm_90": 232448}

_DIR = ("xp", "w", "bw", "br", "hs", "s32", "y", "act", "dy", "dxa", "dha", "gh", "gc", "ghrec", "bar", "xchg")


@kernel_params("rnn_persist_params.h", "PersistDir")
class PersistDir(ctypes.Structure):
    _fields_ = [(n, ctypes.c_void_p) for n in _DIR] + [("rev", ctypes.c_int), ("pad", ctypes.c_int)]


@kernel_params("rnn_persist_params.h", "PersistParams")
class PersistParams(ctypes.Structure):
    _fields_ = [("dir", PersistDir * 2), ("lens", ctypes.c_void_p)] + [
        (n, ctypes.c_longlong) for n in ("ld_xp", "gs_xp", "ld_y", "ld_yt")] + [
        (n, ctypes.c_float) for n in ("lclip", "rclip")] + [
        (n, ctypes.c_int) for n in ("clip", "seq", "batch", "hidden", "units", "pingpong", "xwords", "kp", "nchunk",
                                    "pitch", "wpitch", "bp", "ksplit", "off_w", "off_a", "off_part", "off_x", "off_b",
                                    "off_s", "off_s2", "off_lens", "off_h", "off_g", "variant", "pad2")] + [
        ("stamps", ctypes.c_void_p)]


PV_FLAGS, PV_CHAIN2, PV_XS_AHEAD, PV_FAST_MATH, PV_SLEEP, PV_CG = 1, 2, 4, 8, 16, 32  # PersistParams.variant bits
STAMPS = 8  # u64 phase stamps per step (PersistParams.stamps)


def expr(name, tag, cell=None, lean=0):
    """lean: persist_fwd's LEAN = 1 instance (no tagged exchange, one chunk: tuning.rnn.PERSIST_LEAN)."""
    t = CTYPE[tag]
    if lean:
        return f"pydnn::rnn::{name}<{t}, {cell}, 1>"
    return f"pydnn::rnn::{name}<{t}, {cell}>" if cell is not None else f"pydnn::rnn::{name}<{t}>"


def expr_r(tag, cell, kr, one=0):
    """persist_fwd_r<T, CELL, KR[, 1]>: KR the k steps a warp holds at most (REG_KR); one: the ONE instance (one
    combo a thread, fast math compiled in: tuning.rnn.PERSIST_REG_ONE)."""
    return f"pydnn::rnn::persist_fwd_r<{CTYPE[tag]}, {cell}, {kr}" + (", 1>" if one else ">")


def unit_name(tag, reg=False):
    """reg: the unit of persist_fwd_r / persist_bwd_r."""
    return f"rnn_persist_r.{tag}" if reg else f"rnn_persist.{tag}"


def kernel_units():
    units = []
    for tag in TAGS:
        exprs = [expr(k, tag, c) for k in ("persist_fwd", "persist_bwd") for c in range(4)]
        exprs += [expr("persist_fwd", tag, c, 1) for c in range(4)]
        exprs.append(expr("persist_reset", tag))
        units.append(KernelUnit(unit_name(tag), "rnn_persist.cu", tuple(exprs)))
        if tag != "f32":  # persist_fwd_r (KR 4 and 8) and persist_bwd_r: 16-bit only (mma fragments in
            # registers); a unit of their own, compiled in parallel with the general one
            exprs = [expr_r(tag, c, kr) for c in range(4) for kr in REG_KR]
            exprs += [expr_r(tag, c, 4, 1) for c in range(4)]
            exprs += [expr("persist_bwd_r", tag, c) for c in range(4)]
            units.append(KernelUnit(unit_name(tag, True), "rnn_persist.cu", tuple(exprs)))
    return units


def _up(n, m):
    return -(-n // m) * m


class Layout:
    """The block GEMM's shape and the shared memory layout of one kernel (forward or backward) for a slice of
    `units` hidden units: C [bp, n] = A [bp, K] x B [n, K]^T, partial sums over ksplit K slices. The weight
    slice B holds all of K; A passes through one buffer (kc None: K padded in one chunk) or two buffers of kc
    columns (kc divides K: nchunk = K / kc chunks, each loaded while the one before is multiplied)."""

    def __init__(self, bwd, G, H, B, units, es, GA=1, kc=None, ahead=False):
        self.units = units
        # forward in one chunk with tuning.rnn.PERSIST_XS_AHEAD: two input projection buffers (PV_XS_AHEAD)
        self.ahead = ahead and not bwd and kc is None
        n = units if bwd else G * units
        k = G * H if bwd else H
        if es == 4:  # FFMA: threads over (column, 4 rows, K slice), float4 loads
            self.bp, pad, step = _up(B, 4), 4, 32
        else:  # mma.m16n8k16: warps over (m tile, n tile, K slice)
            self.bp, pad, step = _up(B, 16), 8, 16
        if kc is None:
            self.kp, self.nchunk = _up(k, step), 1
            self.wpitch = self.kp + pad
        else:
            assert k % kc == 0 and kc % step == 0 and kc < k
            self.kp, self.nchunk = kc, k // kc
            self.wpitch = k + pad
        self.pitch = self.kp + pad
        ks = 1
        if es == 4:  # 2 columns x 4 rows a thread
            items = (n // 2) * (self.bp // 4)
            while items * ks * 2 <= THREADS and ks * 2 <= 8 and self.kp % (4 * ks * 2) == 0:
                ks *= 2
        else:
            tiles = (self.bp // 16) * (n // 8)
            while tiles * ks * 2 <= WARPS and (self.kp // 16) % (ks * 2) == 0:
                ks *= 2
        self.ksplit, self.n, self.k = ks, n, k
        nbuf = 2 if self.nchunk > 1 else 1
        regions = [("w", n * self.wpitch * es), ("a", nbuf * self.bp * self.pitch * es),
                   ("part", ks * self.bp * n * 4),
                   ("x", B * units * (4 * GA + (8 if G > 1 else 0) + es) if bwd
                    else B * n * es * (2 if self.ahead else 1)),
                   ("b", 0 if bwd else 2 * n * 4), ("s", B * units * 4), ("s2", B * units * 4 if bwd else 0),
                   ("lens", B * 4), ("h", 0 if bwd else B * units * es), ("g", 0 if bwd else B * units * GA * 4)]
        off = 0
        self.off = {}
        for name, nbytes in regions:
            self.off[name] = off
            off += _up(nbytes, 16)
        self.smem = off

    def fill(self, p):
        p.kp, p.nchunk, p.pitch, p.wpitch, p.bp, p.ksplit = (self.kp, self.nchunk, self.pitch, self.wpitch, self.bp,
                                                            self.ksplit)
        for name, v in self.off.items():
            setattr(p, "off_" + name, v)


def chunks(k, es):
    """The chunk widths to try for a K-long operand, widest first: None (all of K at once), then the
    divisors of K that are multiples of the k-step (16; float 32) and at least 64 (tuning.rnn.PERSIST_MAX_CHUNK
    caps them: the tests force several chunks on small problems)."""
    step = 32 if es == 4 else 16
    cap = tuning.rnn.PERSIST_MAX_CHUNK
    out = [] if cap and k > cap else [None]
    out += [c for c in range(k - step, 63, -step) if k % c == 0 and c % step == 0 and (not cap or c <= cap)]
    return out


class Plan:
    """The slice width and both kernels' layouts for one problem, or NOT_SUPPORTED with the reason."""

    def __init__(self, r, g, sm_count, smem_optin, training):
        if r.dtype not in DTYPES:
            _ns(f"rnnDesc: algo PYDNN_RNN_ALGO_PERSIST_STATIC supports dataType float, half and bfloat16, not "
                f"{r.dtype}")
        if r.proj:
            _ns(f"rnnDesc: algo PYDNN_RNN_ALGO_PERSIST_STATIC has no LSTM projection (projSize {r.proj_size} < "
                f"hiddenSize {r.hidden}); use PYDNN_RNN_ALGO_STANDARD")
        H, B, G, es = g.H, g.B, g.G, g.es
        if H % 8:
            _ns(f"rnnDesc: hiddenSize {H} is not a multiple of 8, which PYDNN_RNN_ALGO_PERSIST_STATIC's slices "
                "of 8 hidden units need")
        self.tag = DTYPES[r.dtype]
        best = None
        # tuning.rnn.PERSIST_UNITS: at least that many units a block where a slice that wide exists (fewer blocks
        # at the barrier), else the fewest as without it
        order = [u for u in range(8, H + 1, 8) if H % u == 0 and H // u <= sm_count]
        want = tuning.rnn.PERSIST_UNITS
        order = [u for u in order if u >= want] + [u for u in order if u < want]
        for units in order:
            fwd = _fit([Layout(False, G, H, B, units, es, g.GA, kc, tuning.rnn.PERSIST_XS_AHEAD)
                        for kc in chunks(H, es)], smem_optin)
            bwd = _fit([Layout(True, G, H, B, units, es, g.GA, kc) for kc in chunks(G * H, es)],
                       smem_optin) if training else None
            need = max(fwd.smem, bwd.smem if bwd else 0)
            if best is None:
                best = (units, need)
            if need <= smem_optin:
                self.units, self.fwd, self.bwd = units, fwd, bwd
                break
        else:
            if best is None:
                _ns(f"rnnDesc: hiddenSize {H} has no slice of 8 * n units with hiddenSize / units <= {sm_count} "
                    "blocks (the SM count) for PYDNN_RNN_ALGO_PERSIST_STATIC")
            what = "forward and backward" if training else "forward"
            _ns(f"rnnDesc: hiddenSize {H} with batch {B} is too large for PYDNN_RNN_ALGO_PERSIST_STATIC's on-chip "
                f"weights: the {what} kernel needs {best[1]} bytes of shared memory per block at {best[0]} units "
                f"per block (the recurrent weight slice and the [batch, K] operand tile), the device allows "
                f"{smem_optin}; use PYDNN_RNN_ALGO_STANDARD")
        self.blocks = H // self.units
        self.both = g.D == 2 and 2 * self.blocks <= sm_count


def _fit(layouts, limit):
    """The first layout (widest chunk) that fits `limit` bytes, else the smallest."""
    for lay in layouts:
        if lay.smem <= limit:
            return lay
    return min(layouts, key=lambda lay: lay.smem)


def smem_optin(handle):
    key = ("rnn.persist.smem_optin",)
    v = handle.prepared.get(key)
    if v is None:
        v = None
        if getattr(handle, "ctx", None) is not None:
            try:
                v = driver.device_attribute(handle.device, "CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN")
            except Exception:  # noqa: BLE001 - no driver: the arch table
                v = None
        if v is None:
            v = SMEM_OPTIN.get(handle.arch, 101376)
        handle.remember(key, v)
    return v


def plan(handle, r, g, training):
    """The Plan for this handle's device (cached on the handle by the problem's sizes)."""
    key = ("rnn.persist.plan", r.dtype, r.cell, r.proj, g.H, g.B, g.D, tuning.rnn.PERSIST_UNITS,
           tuning.rnn.PERSIST_XS_AHEAD, training,
           tuning.rnn.PERSIST_MAX_CHUNK)
    p = handle.prepared.get(key)
    if p is None:
        p = Plan(r, g, handle.sm_count, smem_optin(handle), training)
        if getattr(handle, "ctx", None) is not None:  # on the device: every block resident, before any launch
            for name, lay in (("persist_fwd", p.fwd), ("persist_bwd", p.bwd)):
                if lay is not None:
                    f = handle.function(unit_name(p.tag), expr(name, p.tag, r.cell), lay.smem)
                    _check_resident(handle, f, lay.smem, p.blocks * (2 if p.both else 1))
        handle.remember(key, p)
    return p


def _check_resident(handle, f, smem, blocks):
    """Every block of a persistent grid must be resident at once: the driver's occupancy for this kernel at
    this shared memory must allow one block per SM and the grid must not exceed the SMs (checked once)."""
    key = ("rnn.persist.resident", f, smem)
    if handle.prepared.get(key):
        return
    if handle.ctx is not None:
        d = driver._driver()
        n = driver.check(d.cuOccupancyMaxActiveBlocksPerMultiprocessor(f, THREADS, smem),
                         "cuOccupancyMaxActiveBlocksPerMultiprocessor")
        if n < 1 or blocks > n * handle.sm_count:
            _ns(f"rnnDesc: PYDNN_RNN_ALGO_PERSIST_STATIC's {blocks} blocks ({smem} bytes of shared memory each) "
                f"cannot all be resident ({n} per SM, {handle.sm_count} SMs)")
    handle.remember(key, True)


def _launch(ex, name, cell, grid, smem, p, lean=0, one=0):
    """lean: persist_fwd's LEAN instance, or persist_fwd_r's KR (one: its ONE instance)."""
    handle = ex.handle
    tag = ex.lau.tag
    reg = name in ("persist_fwd_r", "persist_bwd_r")
    f = handle.function(unit_name(tag, reg), expr_r(tag, cell, lean, one) if name == "persist_fwd_r" else
                        expr(name, tag, cell, lean), smem)
    if name != "persist_reset":
        _check_resident(handle, f, smem, grid[0] * grid[1])
    q = PersistParams.from_buffer_copy(p)
    ex._go(f, grid, (THREADS, 1, 1), smem, driver.kernel_args(q),
           ("persist", name, cell, lean) + ((one,) if name == "persist_fwd_r" else ()))


def xchg_bytes(dtype, B, H):
    """Bytes of one direction's tagged exchange words: 2 slots of [B, H] words (u64 for float, u32 else)."""
    return 2 * B * H * (8 if dtype == E.PYDNN_DATA_FLOAT else 4)


X_CHUNKS = 8  # kXChunks in ptx/rnn_persist.cu: 16-byte chunks of tagged words a thread gathers at once


def use_xchg(r, g, pl):
    """The forward exchanges h as tagged words when tuning.rnn.PERSIST_XCHG, the 16-bit tags hold T, and one
    round of loads covers a chunk of the operand (at most X_CHUNKS 16-byte chunks a thread: batch 32 x hidden
    256 in 16-bit); larger tiles take the barrier, whose cp.async copies keep every load in flight."""
    per = 2 if r.dtype == E.PYDNN_DATA_FLOAT else 4
    cols = pl.fwd.kp if pl.fwd.nchunk > 1 else g.H
    return tuning.rnn.PERSIST_XCHG and g.T < 65535 and g.B * (cols // per) <= X_CHUNKS * THREADS


# tools/bench_rnn.py --stamps: a device buffer of [T][STAMPS] u64 for block 0's phase clocks (0: none)
stamps_buffer = 0


def variant(pl, tagged):
    """PersistParams.variant of a forward launch from the tuning switches (PERSIST_FLAGS: not with the tagged
    exchange, at most MAX_FLAG_BLOCKS blocks)."""
    v = 0
    if tuning.rnn.PERSIST_FLAGS and not tagged and pl.blocks <= MAX_FLAG_BLOCKS:
        v |= PV_FLAGS
    if tuning.rnn.PERSIST_CHAIN2:
        v |= PV_CHAIN2
    if pl.fwd.ahead and not tagged:
        v |= PV_XS_AHEAD
    if tuning.rnn.PERSIST_FAST_MATH and pl.tag != "f32":
        v |= PV_FAST_MATH
    return v


def record_key():
    """What of the switches and hooks a recorded PERSIST_STATIC call depends on (engine._run's key)."""
    return (tuning.rnn.PERSIST_XCHG, tuning.rnn.PERSIST_UNITS, tuning.rnn.PERSIST_FLAGS, tuning.rnn.PERSIST_CHAIN2,
            tuning.rnn.PERSIST_XS_AHEAD, tuning.rnn.PERSIST_FAST_MATH, tuning.rnn.PERSIST_LEAN, tuning.rnn.PERSIST_REG,
            tuning.rnn.PERSIST_REG_XCHG, tuning.rnn.PERSIST_REG_SLEEP, tuning.rnn.PERSIST_BWD_REG,
            tuning.rnn.PERSIST_REG_ONE, tuning.rnn.PERSIST_REG_CG, stamps_buffer)


REG_KR = (4, 8)  # persist_fwd_r's KR instances: k steps a warp at most (its weight fragments in registers)
REG_K = REG_KR[-1]
REG_SMEM = 2 * WARPS * 4 * 32 * 16  # persist_fwd_r's shared memory: the K slices' partial sums, 2 step parities


def reg_shape(tag, B, H, units):
    """persist_fwd_r's (m tiles, K slices) for this shape, or None where it does not apply: 16-bit data, 8 units
    a block, hidden a multiple of 32; the m tiles (16 rows each, rounded up to 1, 2, 4 or 8: batch <= 128)
    times the K slices fill the 8 warps where hidden allows (each slice whole k-step pairs: hidden a multiple
    of 32 x slices; fewer slices leave warps idle), at most REG_K k steps a warp (the weight fragments held in
    registers: hidden <= 128 x slices)."""
    if tag == "f32" or units != 8 or H % 32 or B > 128:
        return None
    mt = 1
    while mt * 16 < B:
        mt *= 2
    ks = WARPS // mt
    while ks > 1 and H % (32 * ks):
        ks //= 2
    if H // 16 // ks > REG_K:
        return None
    return mt, ks


BWD_REG_K = 16  # kBwdK in ptx/rnn_persist.cu: k steps a warp at most in persist_bwd_r
BWD_REG_SMEM = 2 * WARPS * 4 * 32 * 4  # persist_bwd_r's partial sums (f32 a combo), 2 step parities


def bwd_reg_shape(tag, B, H, G, units):
    """persist_bwd_r's (m tiles, K slices) over K = G * hidden, or None: as reg_shape, at most BWD_REG_K k steps
    a warp."""
    if tag == "f32" or units != 8 or H % 32 or B > 128:
        return None
    mt = 1
    while mt * 16 < B:
        mt *= 2
    ks = WARPS // mt
    while ks > 1 and (G * H) % (32 * ks):
        ks //= 2
    if G * H // 16 // ks > BWD_REG_K:
        return None
    return mt, ks


def reg_kr(H, ksplit):
    """The KR instance of persist_fwd_r for this shape: the fewest k steps a warp that hold its slice."""
    return next(kr for kr in REG_KR if H // 16 // ksplit <= kr)


def use_reg(pl, g, tagged):
    """The forward takes persist_fwd_r (tuning.rnn.PERSIST_REG) where reg_shape allows, with the barrier, and
    where the general kernel would take the operand in one chunk (PERSIST_MAX_CHUNK forcing chunks keeps it)."""
    if not tuning.rnn.PERSIST_REG or tagged or pl.fwd.nchunk != 1:
        return None
    return reg_shape(pl.tag, g.B, g.H, pl.units)


def _groups(pl, dirs):
    return [dirs] if pl.both else [[dr] for dr in dirs]


def forward_layer(ex, r, g, pl, dirs, ly, training, lens, bar, clip, xchg):
    """The recurrence of one layer (after the input GEMMs and state_init; STANDARD's _fwd_steps). xchg: the
    workspace of the tagged exchange (used when tuning.rnn.PERSIST_XCHG and the 16-bit tags hold T)."""
    es, B, H, P, D, GH = g.es, g.B, g.H, g.P, g.D, g.GH
    xb = xchg_bytes(r.dtype, B, H)
    tagged = use_xchg(r, g, pl)
    reg = use_reg(pl, g, tagged)
    # persist_fwd_r's own tagged exchange (tuning.rnn.PERSIST_REG_XCHG; KR 4 only, the 16-bit tags hold T)
    xtag = tagged or bool(reg and tuning.rnn.PERSIST_REG_XCHG and g.T < 65535 and reg_kr(H, reg[1]) == 4)
    for group in _groups(pl, dirs):
        p = PersistParams()
        for i, dr in enumerate(group):
            q = p.dir[i]
            q.xp = dr.xpd if dr.w_in else dr.inp
            q.w, q.bw, q.br = dr.w_rec, dr.b_in, dr.b_rec
            q.hs, q.s32 = dr.hs_at(0), dr.s_at(0)
            q.y = ly + dr.d * P * es
            q.act = dr.act0 if training else 0
            q.bar, q.rev = bar + dr.d * BAR_STRIDE, dr.d
            q.xchg = xchg + dr.d * xb if xtag else 0
        p.xwords = xb // 4
        w0 = group[0]
        p.ld_xp, p.gs_xp = (GH, H) if w0.w_in else (w0.inp_w, 0)  # SKIP_INPUT: x itself enters every gate
        p.ld_y, p.ld_yt = D * P, B * D * P
        p.lens, p.seq, p.batch, p.hidden, p.units = lens, g.T, B, H, pl.units
        p.pingpong = 0 if training else 1
        if clip:
            p.clip, p.lclip, p.rclip = 1, clip[0], clip[1]
        pl.fwd.fill(p)
        p.variant = variant(pl, tagged)
        p.stamps = stamps_buffer
        _launch(ex, "persist_reset", None, (min(64, cdiv(xb // 4, THREADS)) if xtag else 1, len(group), 1), 0, p)
        if reg:  # persist_fwd_r reads batch, hidden, ksplit, bp and the pointers; no shared memory layout
            p.bp, p.ksplit = 16 * reg[0], reg[1]
            p.variant &= PV_FAST_MATH
            if xtag and tuning.rnn.PERSIST_REG_SLEEP:
                p.variant |= PV_SLEEP
            if tuning.rnn.PERSIST_REG_CG:
                p.variant |= PV_CG
            kr = reg_kr(g.H, reg[1])
            # ONE (tuning.rnn.PERSIST_REG_ONE): one combo a thread (4 or 8 K slices), fast math, KR 4
            one = int(bool(tuning.rnn.PERSIST_REG_ONE and reg[1] >= 4 and kr == 4 and p.variant & PV_FAST_MATH))
            _launch(ex, "persist_fwd_r", r.cell, (pl.blocks, len(group), 1), REG_SMEM, p, kr, one)
            continue
        lean = 1 if tuning.rnn.PERSIST_LEAN and pl.fwd.nchunk == 1 and not tagged else 0
        _launch(ex, "persist_fwd", r.cell, (pl.blocks, len(group), 1), pl.fwd.smem, p, lean)


def backward_layer(ex, r, g, pl, dirs, dly, lens, bar, clip):
    """Backward data's recurrence of one layer (after bwd_state_init; STANDARD's step loops). Leaves the dhx
    share in gh and 0 in ghrec[0] (bwd_state_out adds them)."""
    es, B, H, P, D = g.es, g.B, g.H, g.P, g.D
    for group in _groups(pl, dirs):
        p = PersistParams()
        for i, dr in enumerate(group):
            q = p.dir[i]
            q.w, q.s32, q.act = dr.w_rec, dr.s_at(0), dr.act0
            q.dy = dly + dr.d * P * es
            q.dxa, q.dha = dr.dxa0, dr.dha0
            q.gh, q.gc, q.ghrec = dr.gh, dr.gc if r.cell == LSTM else 0, dr.ghrec
            q.bar, q.rev = bar + dr.d * BAR_STRIDE, dr.d
        p.ld_y, p.ld_yt = D * P, B * D * P
        p.lens, p.seq, p.batch, p.hidden, p.units = lens, g.T, B, H, pl.units
        if clip:
            p.clip, p.lclip, p.rclip = 1, clip[0], clip[1]
        pl.bwd.fill(p)
        p.variant = variant(pl, False) & (PV_FLAGS | PV_CHAIN2)  # the barrier and the mma chains only
        _launch(ex, "persist_reset", None, (1, len(group), 1), 0, p)
        # persist_bwd_r where the general kernel would take the operand in one chunk (PERSIST_MAX_CHUNK forcing
        # chunks keeps the general one)
        breg = (bwd_reg_shape(pl.tag, B, H, g.G, pl.units) if tuning.rnn.PERSIST_BWD_REG and pl.bwd.nchunk == 1
                else None)
        if breg:  # persist_bwd_r: the counter barrier, no variant bits
            p.bp, p.ksplit, p.variant = 16 * breg[0], breg[1], 0
            _launch(ex, "persist_bwd_r", r.cell, (pl.blocks, len(group), 1), BWD_REG_SMEM, p)
            continue
        _launch(ex, "persist_bwd", r.cell, (pl.blocks, len(group), 1), pl.bwd.smem, p)


__all__ = ["Plan", "Layout", "plan", "forward_layer", "backward_layer", "kernel_units", "reg_shape"]
