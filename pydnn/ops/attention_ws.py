"""Fused attention forward on Hopper, warp specialized as FlashAttention-3 builds it (ptx/attention_ws.cu;
units attention.ws.<tag> (d 64, 128) and attention.ws.d256.<tag>, compiled for sm_90a only).
pydnn/ops/attention.py's attention_forward
validates the call and builds the params; `usable` says whether this path takes it (an sm_90 device, a
head dim of HEAD_DIMS, no dropout, tuning.attention.WS) ahead of the older wgmma forward
(pydnn/ops/attention_wgmma.py, which WS = False selects for A/B) and `launch`es it.

Kernel shape: 384 threads, one persistent CTA per SM: a producer warpgroup (32 registers) copies Q and
the K / V tiles into STAGES-deep rings, by TMA (one thread, tensor maps encoded per call: WS_TMA, the
default; not with per-batch key lengths) or by cp.async (the whole warpgroup), completion signalled on
mbarriers; two consumer
warpgroups (232 registers) of 64 query rows each run S = Q K^T / softmax / O += P V on wgmma, the
softmax of tile j under P_{j-1} V_{j-1} (intra-warpgroup overlap), taking turns at the tensor cores
(ping-pong on named barriers). Work units of 128 query rows go round the CTAs in snake order, longest
causal row blocks first within sections of sched_heads (batch, head) pairs whose K / V fit in L2.

Variants (template parameters of fwd_ws_body, each a unit and a tuning.attention switch; `pick` is the one
choice): two Q buffers (WS_Q2, the default at d 64 / 128), polynomial exp2 for a share of the softmax
(WS_EMU, d 64 by default), rotated key order (WS_ROT), three consumer warpgroups at d 64 (WS_C3), 2-CTA
clusters sharing K / V by multicast (WS_CL), the next unit's first S issued with the last P V (WS_XU);
tools/PERF.md "Session 30: attnf" has their measurements. Ghost tiles (WS_GH: each consumer warpgroup
computes only the key tiles its rows see) with end-aligned 192-row blocks (WS_AL): the d 64 default and d 256's
under causal masks since session 31 (tools/PERF.md "Session 31: attn").
"""
import ctypes
import math

from .. import tuning
from .._build.manifest import KernelUnit
from .._cuda import driver, tensormap

ARCH = "sm_90"
# The head dims the planner sends here. Mid-session run (H200, 2026-11-28, bench_attention --fwd-ab, B*S =
# 16384, against the old wgmma forward in the same run): d 64 geomean 0.826x cuDNN (old 0.694), d 128 0.863x
# (old 0.691; TMA 0.893x), d 256 0.829x (old 0.703), better on every point.
HEAD_DIMS = (64, 128, 256)
INSTANTIATED = (64, 128)  # attention.ws.<tag>; d 256 in its own unit (attention.ws.d256.<tag>, built in parallel)
THREADS, BM = 384, 128  # kThreadsWS, kBM in ptx/attention_ws.cu
BN = {64: 128, 128: 128, 256: 64}  # keys a tile (d 256: O takes 128 registers a thread, as the old kernel's)
STAGES = {64: 2, 128: 2, 256: 2}  # K and V buffers each (FA3's count at d 128: 160 KiB of tiles)
CTYPE = {"bf16": "pydnn::bf16_t", "f16": "pydnn::half_t"}
L2_SHARE = 0.5          # the share of L2 a section's K / V may fill
_L2 = {}


# PINGPONG: a benchmark knob (tools/bench_attention.py --fwd-ab), not a tuning switch: False launches the
# d 128 bf16 variant whose consumer warpgroups do not take turns (the one other instantiation)
PINGPONG = True


def _expr(tag, d, pp=True, tma=False, stages=None, bn=None, qs=1, emu=0, rot=False, nc=2, xu=False, gh=False,
          al=False):
    # the template's trailing arguments QS, EMU, (fwd_ws_tma:) ROT, NC, (fwd_ws_tma:) XU, GH, AL, written up
    # to the last one set
    b = lambda x: "true" if x else "false"  # noqa: E731
    tail = [str(qs), str(emu)] + ([b(rot)] if tma else []) + [str(nc)] + ([b(xu), b(gh), b(al)] if tma else [])
    dflt = ["1", "0"] + (["false"] if tma else []) + ["2"] + (["false"] * 3 if tma else [])
    tail = tail[:max((i + 1 for i, (x, y) in enumerate(zip(tail, dflt)) if x != y), default=0)]
    tail = "".join(", " + x for x in tail)
    return (f"pydnn::attn_ws::fwd_ws{'_tma' if tma else ''}<{CTYPE[tag]}, {d}, {bn or BN[d]}, {stages or STAGES[d]}, "
            f"{'true' if pp else 'false'}{tail}>")


# Two Q buffers (tuning.attention.WS_Q2; units attention.ws.q2.<tag>, TMA and cp.async at d 64 / 128): the
# next unit's Q is copied while the consumers run the current one. With one buffer the producer copies it
# only after both warpgroups' epilogues, so each unit starts with a copy's latency and a lone S: about 1-2k
# clocks a unit, 10-30% of a causal s 512 / 1024 unit's 2-8 tile pairs of ~2k clocks (prediction).
# Polynomial exponentials (WS_EMU, units attention.ws.emu.<tag>, TMA only, with two Q buffers): EMU eighths
# of an unmasked tile's exp2 on the FMA pipe (ptx/attention_ws.cu exp2_poly); at d 64 a tile's 64 MUFU.EX2 a
# thread occupy the special-function units as long as its two GEMMs the tensor cores.
# Rotated key order (WS_ROT, units attention.ws.rot.<tag>, TMA with two Q buffers, non-causal calls): a
# unit's key tiles from tile blockIdx.x % nt on, so that the CTAs on one head do not all read the same K / V
# tile from L2 at once (the sweep: non-causal d 128 at s 16384 ran slower than causal, 588 vs 650 TFLOP/s).
ROT_UNIT = "attention.ws.rot.{}"
# Three consumer warpgroups at d 64 (WS_C3, units attention.ws.c3.<tag>, with two Q buffers): 192-row units,
# 512 threads (FlashAttention-3's d 64 tile); TMA only (the cp.async producer spilled 4-12 bytes at 24 / 32
# registers), not with EMU (its consumers spilled 36 bytes of 160 registers).
C3_UNIT = "attention.ws.c3.{}"
# 2-CTA clusters sharing K / V by TMA multicast (WS_CL, units attention.ws.cl.<tag>, non-causal calls without
# per-batch lengths, two Q buffers): the CTAs on row blocks 2i, 2i + 1 of a head each copy half of every K / V
# tile into both, halving L2 -> SM traffic (FlashAttention-3 clusters its non-causal d >= 128 forward).
# Instantiated with the head dim's default EMU (CL_EMU).
CL_UNIT = "attention.ws.cl.{}"
# Across units (WS_XU, units attention.ws.xu.<tag>, TMA with two Q buffers): a consumer warpgroup issues the
# next unit's S_0 with the current unit's last P V and runs the next first softmax under it, then the
# epilogue; at d 64 / 128 with the head dim's default EMU (CL_EMU's).
XU_UNIT = "attention.ws.xu.{}"
CL_EMU = {64: 2, 128: 0}
# Ghost tiles (WS_GH, units attention.ws.gh.<tag>, TMA, session 31): each consumer warpgroup computes only
# the key tiles its own 64 rows see and walks the unit's others without issuing (ptx/attention_ws.cu GH).
# Where the unit's tile count over-covers a warpgroup: d 64 on three warpgroups (192-row units against
# 128-key tiles: causal units, and the last unit's rows past the sequence), d 256 (64-key tiles: warpgroup 0
# one masked tile a causal unit). With WS_AL (d 64, three warpgroups) the row blocks end at the sequence's
# end, so the partial block is the first (its rows above 0 ghosts) and not the longest causal one. Counted
# (64-row warpgroup tiles computed / the units' tile walks; a warpgroup computes tile 0 at least): d 64 s 1024
# causal 96 / 32 -> GH 74 / 32 -> GH + AL 74 / 27; s 512 causal 27 / 9 -> 21 / 9 -> 21 / 8; non-causal s 1024
# 144 -> 130 computed. Mid-session H200 run 1 (session 31, 8 points b32 s512 / b16 s1024, h32/32 and 64/8,
# causal and not, against cuDNN in the same run): d 64 c3 0.835x, gh 0.883x, gh + al 0.928x (min 0.756 ->
# 0.863; causal s 1024 0.756 / 0.787 -> 0.959 / 0.952); d 256 gh 0.877x against 0.881x: causal s 512
# +1-4%, s 1024 ~0, non-causal -2..-4% (the same kernel; ntw = nt there): d 256 takes it under causal
# masks only, if at all (WS_GH's "causal").
GH_UNIT = "attention.ws.gh.{}"
GH_EXPRS = ((64, dict(qs=2, nc=3, gh=True)), (64, dict(qs=2, nc=3, gh=True, al=True)), (256, dict(gh=True)))


def _cl_expr(tag, d):
    return f"pydnn::attn_ws::fwd_ws_tma_cl<{CTYPE[tag]}, {d}, {BN[d]}, {STAGES[d]}, {CL_EMU[d]}>"
C3_BM, C3_THREADS = 192, 512
Q2_UNIT = "attention.ws.q2.{}"
EMU_UNIT = "attention.ws.emu.{}"
Q2_DIMS = (64, 128)
EMU_CHOICES = {64: (2, 3), 128: (2,)}


# Wide K / V tiles (A/B knobs until a GPU run decides): BN = 176 at d 128 (FlashAttention-3's non-causal
# d 128 tile, 128 x 176: 37.5% more keys a softmax pass than 128; units attention.ws.n176.<tag>,
# tuning.attention.WS_BN176; smem (128 + 4 x 176) x 256 + 1104) and BN = 192 at d 64 (the per-tile
# barrier / max / rescale work over 1.5x the keys; units attention.ws.n192.<tag>, WS_BN192).
N176_UNIT = "attention.ws.n176.{}"
WIDE = {128: (176, "WS_BN176", N176_UNIT), 64: (192, "WS_BN192", "attention.ws.n192.{}")}


# 3-deep K / V rings at d 128 (230512 bytes of shared memory, within the 232448 a block may opt in to)
# measured no faster with TMA (mid-session run 2, H200: geomean 0.857x cuDNN against 0.877x with 2, -6%..+3%
# a point): not instantiated; STAGES3 is kept for a later producer whose balance may differ.
STAGES3 = {64: 2, 128: 3, 256: 2}


def unit_name(tag, d=128):
    return f"attention.ws.d256.{tag}" if d == 256 else f"attention.ws.{tag}"


PAGED_UNIT = "attention.ws.paged.{}"  # the paged K / V kernels (every head dim of HEAD_DIMS), built apart


def _paged_expr(tag, d, tma):
    return (f"pydnn::attn_ws::fwd_ws{'_tma' if tma else ''}_paged<{CTYPE[tag]}, {d}, {BN[d]}, {STAGES[d]}, true>")


def kernel_units():
    out = []
    for tag in ("bf16", "f16"):
        exprs = (tuple(_expr(tag, d) for d in INSTANTIATED) + ((_expr(tag, 128, False),) if tag == "bf16" else ())
                 + tuple(_expr(tag, d, tma=True) for d in INSTANTIATED))
        out.append(KernelUnit(unit_name(tag), "attention_ws.cu", exprs, archs=(ARCH + "a",)))
        out.append(KernelUnit(unit_name(tag, 256), "attention_ws.cu", (_expr(tag, 256), _expr(tag, 256, tma=True)),
                              archs=(ARCH + "a",)))
        for d, (bn, _, unit) in sorted(WIDE.items(), reverse=True):
            out.append(KernelUnit(unit.format(tag), "attention_ws.cu",
                                  (_expr(tag, d, bn=bn), _expr(tag, d, tma=True, bn=bn)), archs=(ARCH + "a",)))
        out.append(KernelUnit(Q2_UNIT.format(tag), "attention_ws.cu",
                              tuple(_expr(tag, d, tma=t, qs=2) for d in Q2_DIMS for t in (True, False)),
                              archs=(ARCH + "a",)))
        out.append(KernelUnit(EMU_UNIT.format(tag), "attention_ws.cu",
                              tuple(_expr(tag, d, tma=True, qs=2, emu=e) for d in Q2_DIMS for e in EMU_CHOICES[d]),
                              archs=(ARCH + "a",)))
        out.append(KernelUnit(C3_UNIT.format(tag), "attention_ws.cu",
                              (_expr(tag, 64, tma=True, qs=2, nc=3),), archs=(ARCH + "a",)))
        out.append(KernelUnit(CL_UNIT.format(tag), "attention_ws.cu", tuple(_cl_expr(tag, d) for d in Q2_DIMS),
                              archs=(ARCH + "a",)))
        out.append(KernelUnit(XU_UNIT.format(tag), "attention_ws.cu",
                              tuple(_expr(tag, d, tma=True, qs=2, emu=CL_EMU[d], xu=True) for d in Q2_DIMS),
                              archs=(ARCH + "a",)))
        out.append(KernelUnit(GH_UNIT.format(tag), "attention_ws.cu",
                              tuple(_expr(tag, d, tma=True, **kw) for d, kw in GH_EXPRS), archs=(ARCH + "a",)))
        out.append(KernelUnit(ROT_UNIT.format(tag), "attention_ws.cu",
                              tuple(_expr(tag, d, tma=True, qs=2, rot=True) for d in Q2_DIMS), archs=(ARCH + "a",)))
        out.append(KernelUnit(PAGED_UNIT.format(tag), "attention_ws.cu",
                              tuple(_paged_expr(tag, d, t) for d in HEAD_DIMS for t in (False, True)),
                              archs=(ARCH + "a",)))
    return out


def smem_bytes(d, bn=None, qs=1, bm=BM):
    """qs Q tiles (128 x d), STAGES K and STAGES V tiles (16-bit), the mbarriers (4 per stage + 2 per Q
    buffer, 8 bytes each), +1 KiB to align the swizzle atoms (d 128: 164944 bytes; d 256: 197712; d 128
    with 176-key tiles: 214096; d 128 with two Q buffers: 197728)."""
    return (qs * bm + 2 * STAGES[d] * (bn or BN[d])) * d * 2 + (4 * STAGES[d] + 2 * qs) * 8 + 1024


def c3_of(d, qs):
    """3 consumer warpgroups (tuning.attention.WS_C3, d 64 with two Q buffers), else 2."""
    return 3 if tuning.attention.WS_C3 and d == 64 and qs == 2 else 2


def q2_of(d, bn):
    """2 where the call takes two Q buffers (tuning.attention.WS_Q2, d of Q2_DIMS, 128-key tiles), else 1."""
    return 2 if tuning.attention.WS_Q2 and d in Q2_DIMS and bn == BN[d] else 1


def cl_of(d, qs, p):
    """2-CTA clusters (tuning.attention.WS_CL): two Q buffers, a non-causal call without per-batch lengths,
    the head dim's default exponentials (CL_EMU)."""
    return bool(tuning.attention.WS_CL and qs == 2 and d in CL_EMU and p.mask == 0 and not p.lens_q
                and not p.lens_kv and emu_of(d, qs) == CL_EMU[d])


def gh_of(d, nc, mask=0):
    """(ghost tiles, end-aligned row blocks) of a TMA call with mask (AttnParams.mask): tuning.attention.WS_GH
    says which head dims take them ({head dim: "all" | "causal"}, or a tuple of head dims: "all"), of d 64 on
    three consumer warpgroups and d 256; WS_AL: end-aligned blocks with them, d 64 / NC 3."""
    t = tuning.attention
    w = t.WS_GH or {}
    w = w.get(d) if isinstance(w, dict) else ("all" if d in w else None)
    gh = (w == "all" or (w == "causal" and mask != 0)) and ((d == 64 and nc == 3) or d == 256)
    return gh, bool(gh and t.WS_AL and nc == 3)


def xu_of(d, qs):
    """Across units (tuning.attention.WS_XU): two Q buffers, the head dim's default exponentials."""
    return bool(tuning.attention.WS_XU and qs == 2 and d in CL_EMU and emu_of(d, qs) == CL_EMU[d])


def rot_of(qs, p):
    """The TMA launch's rotated key order: tuning.attention.WS_ROT, two Q buffers, a non-causal call."""
    return bool(tuning.attention.WS_ROT and qs == 2 and p.mask == 0)


def emu_of(d, qs):
    """The TMA launch's eighths of polynomial exponentials (tuning.attention.WS_EMU: an int, or a dict by
    head dim), where instantiated (EMU_CHOICES, with two Q buffers); else 0."""
    e = tuning.attention.WS_EMU
    e = e.get(d, 0) if isinstance(e, dict) else e
    return e if qs == 2 and e in EMU_CHOICES.get(d, ()) else 0


def bn_of(d, p):
    """The K / V tile of a (non-paged) call: WIDE[d]'s (176 at d 128, 192 at d 64) under its switch
    (tuning.attention.WS_BN176 / WS_BN192: "noncausal": non-causal calls; True: every call), else BN[d]."""
    if d in WIDE:
        bn, sw, _ = WIDE[d]
        w = getattr(tuning.attention, sw)
        if w and (w is True or p.mask == 0):
            return bn
    return BN[d]


def usable(handle, head_dim, dropout):
    return (tuning.attention.WS and tuning.attention.ENABLED and handle.arch == ARCH
            and head_dim in HEAD_DIMS and dropout == 0)


L2_DEFAULT = 50 << 20   # the H100's / H200's L2, where the driver cannot be asked (CPU-only test handles)


def l2_bytes(handle):
    n = _L2.get(handle.device)
    if n is None:
        try:
            n = int(driver.device_attribute(handle.device, "CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE"))
        except Exception:  # noqa: BLE001 - no driver (the CPU test handles): the Hopper value
            return L2_DEFAULT
        _L2[handle.device] = n
    return n


def sched_heads(l2, skv, d, group, nmb=None, grid=None):
    """(batch, head) pairs per scheduling section: as many as keep their K and V (group query heads
    share one K / V head) within L2_SHARE of L2, at least one. With the row blocks nmb and the CTAs
    grid: rounded down to a multiple of 2 grid / gcd(nmb, 2 grid) where that fits, so that a section is
    whole pairs of snake rounds (a forward round and a reversed one: the causal costs of a pair add up
    evenly; emulated, b16 s1024 h32 causal: the busiest CTA 11.7% over the mean -> 2.4%)."""
    per_head = 2 * skv * d * 2 / max(1, group)
    hs = max(1, int(L2_SHARE * l2 // max(1.0, per_head)))
    if nmb and grid:
        m = 2 * grid // math.gcd(nmb, 2 * grid)
        if m <= hs:
            hs = hs // m * m
        elif 2 * m <= 3 * hs:  # up to half again the L2 share (b8 s2048 h64: 25 -> 33, 7.5% -> 0.2%)
            hs = m
    return hs


def grid_size(handle, b, hq, sq, bm=BM, cl=1):
    """Persistent CTAs: one an SM at most, in whole clusters of cl (units: cl row blocks of bm rows)."""
    units = b * hq * -(-((sq + bm - 1) // bm) // cl)
    return cl * max(1, min(units, handle.sm_count // cl))


TMA_DIMS = (64, 128, 256)  # the head dims with a TMA instantiation (fwd_ws_tma)


class TmaMaps(ctypes.Structure):
    """attention_ws.cu TmaMaps: the encoded Q, K, V tensor maps (128 bytes each)."""
    _fields_ = [("raw", ctypes.c_ubyte * 384)]


def _encode(tag, ptr, dims, strides, rows):
    """One 4-d tiled tensor map: dims (d, seq, heads, batch), strides (seq, head, batch) in elements,
    boxes of 64 columns x rows, 128B swizzle, out-of-bounds zero (pydnn/_cuda/tensormap.py's
    encode_tiled). Returns its 128 bytes."""
    return tensormap.encode_tiled(tag, int(ptr), dims, [2 * x for x in strides], (64, rows, 1, 1))


_MAPS = {}          # (tag, d, pointers, sizes, strides) -> TmaMaps: a repeated call encodes nothing
_MAPS_LIMIT = 64


def tma_maps(tag, d, p, bn=None, bm=BM):
    """The TmaMaps of a call (params p): Q boxes of BM rows, K / V of BN[d]. Encoded once per set of
    pointers and shapes (three driver calls a forward otherwise)."""
    b, hq, hkv = p.batch, p.heads_q, p.heads_kv
    st = [[p.stride[t][i] for i in range(3)] for t in range(3)]
    bn = bn or BN[d]
    key = (tag, d, bn, bm, p.q, p.k, p.v, b, hq, hkv, p.seq_q, p.seq_kv, tuple(map(tuple, st)))
    return _cached_maps(key, tag, p, st, (d, p.seq_q, hq, b), (d, p.seq_kv, hkv, b), bn, bm)


def _cached_maps(key, tag, p, st, q_dims, kv_dims, kv_rows, q_rows=BM):
    """The TmaMaps under key, encoded on a miss: Q boxes of BM rows, K and V of kv_rows; strides st per
    tensor (row, head, batch-or-page)."""
    m = _MAPS.get(key)
    if m is not None:
        return m
    q = _encode(tag, p.q, q_dims, (st[0][2], st[0][1], st[0][0]), q_rows)
    k = _encode(tag, p.k, kv_dims, (st[1][2], st[1][1], st[1][0]), kv_rows)
    v = _encode(tag, p.v, kv_dims, (st[2][2], st[2][1], st[2][0]), kv_rows)
    m = TmaMaps()
    ctypes.memmove(ctypes.addressof(m), q + k + v, 384)
    if len(_MAPS) >= _MAPS_LIMIT:
        _MAPS.clear()
    _MAPS[key] = m
    return m


LAST_TMA = False  # (tests: set when a launch went the TMA way)


def takes_tma(d, p):
    """tuning.attention.WS_TMA, a TMA instantiation for d, no per-batch key lengths (a box past len_kv
    inside seq_kv would bring in rows that are not zero: P = 0 against whatever they hold), and no
    launch recorder listening (a record keeps the params' bytes to patch pointers in; the tensor maps
    hold pointers of their own)."""
    return tuning.attention.WS_TMA and d in TMA_DIMS and not p.lens_kv and driver._recorders == 0


def pick(tag, d, p, tma):
    """The kernel of a (non-paged) call with params p under the switches, TMA producer or not: (unit,
    expression, shared memory bytes, threads, query rows a unit, CTAs a cluster)."""
    bn = bn_of(d, p)
    qs = q2_of(d, bn)
    nc = c3_of(d, qs) if tma else 2  # (three consumer warpgroups: TMA only)
    cl = 2 if tma and nc == 2 and cl_of(d, qs, p) else 1
    bm, threads = (C3_BM, C3_THREADS) if nc == 3 else (BM, THREADS)
    smem = smem_bytes(d, bn, qs, bm)
    if bn != BN[d]:
        unit, expr = WIDE[d][2].format(tag), _expr(tag, d, tma=tma, bn=bn)
    elif cl == 2:
        unit, expr = CL_UNIT.format(tag), _cl_expr(tag, d)
    elif tma:
        emu, rot = emu_of(d, qs), rot_of(qs, p)
        gh, al = gh_of(d, nc, p.mask)
        unit, expr = ((GH_UNIT.format(tag), _expr(tag, d, tma=True, qs=qs, nc=nc, gh=True, al=al)) if gh else
                      (C3_UNIT.format(tag), _expr(tag, d, tma=True, qs=2, nc=3)) if nc == 3 else
                      (XU_UNIT.format(tag), _expr(tag, d, tma=True, qs=2, emu=emu, xu=True)) if xu_of(d, qs) else
                      (ROT_UNIT.format(tag), _expr(tag, d, tma=True, qs=2, rot=True)) if rot else
                      (EMU_UNIT.format(tag), _expr(tag, d, tma=True, qs=2, emu=emu)) if emu else
                      (Q2_UNIT.format(tag), _expr(tag, d, tma=True, qs=2)) if qs == 2 else
                      (unit_name(tag, d), _expr(tag, d, tma=True)))
    elif qs == 2:
        unit, expr = Q2_UNIT.format(tag), _expr(tag, d, qs=2)
    else:
        unit, expr = unit_name(tag, d), _expr(tag, d, PINGPONG or tag != "bf16" or d != 128)
    return unit, expr, smem, threads, bm, cl


def launch(handle, tag, d, b, hq, sq, skv, group, p):
    """One forward launch (params p built and checked by attention_forward)."""
    maps = None
    if takes_tma(d, p):
        unit, expr, smem, threads, bm, cl = pick(tag, d, p, True)
        try:  # (clusters: each CTA copies half a K / V tile's rows)
            maps = tma_maps(tag, d, p, bn_of(d, p) // cl, bm)
        except Exception:  # noqa: BLE001 - a layout the encoder refuses: the cp.async producer
            maps = None
    if maps is None:
        unit, expr, smem, threads, bm, cl = pick(tag, d, p, False)
    nmb = -(-(-(-sq // bm)) // cl)  # row blocks (clusters: pairs of them) a head
    grid = (grid_size(handle, b, hq, sq, bm, cl), 1, 1)
    p.sched_heads = sched_heads(l2_bytes(handle), skv, d, group, nmb, grid[0] // cl)
    f = handle.function(unit, expr, smem)
    if maps is not None:
        global LAST_TMA
        LAST_TMA = True
        argv = (ctypes.c_void_p * 2)(ctypes.addressof(p), ctypes.addressof(maps))
        drv = driver._driver()
        err = drv.cuLaunchKernel(f, grid[0], 1, 1, threads, 1, 1, smem, handle.cu_stream,
                                 ctypes.addressof(argv), 0)[0]
        if err != 0:
            driver.check((err,), "cuLaunchKernel")
        return
    driver.launch(f, grid, (threads, 1, 1), smem, handle.cu_stream, p)


# ----------------------------------------------------------------------------- paged K / V

def takes_tma_paged(d, p):
    """The paged forward's TMA producer: tuning.attention.WS_TMA and PAGED_TMA, a page size that is a
    multiple of the K / V tile (a tile is one box inside one page) or, with PAGED_TMA_SMALL, a multiple of
    8 that divides it (BN / ps boxes a tile, one page each), no launch recorder (as takes_tma)."""
    t, ps, bn = tuning.attention, p.page_size, BN[d]
    fits = ps % bn == 0 or (t.PAGED_TMA_SMALL and ps % 8 == 0 and bn % ps == 0)
    return bool(t.WS_TMA and t.PAGED_TMA and fits and driver._recorders == 0)


def paged_maps(tag, d, p, pages):
    """TmaMaps of a paged call: Q as tma_maps', K / V the page pools as (d, page_size, heads_kv, pages)
    tensors with strides (row, head, page), boxes of min(page_size, BN[d]) rows."""
    b, hq, hkv = p.batch, p.heads_q, p.heads_kv
    st = [[p.stride[t][i] for i in range(3)] for t in range(3)]
    key = ("paged", tag, d, p.q, p.k, p.v, b, hq, hkv, p.seq_q, p.page_size, pages, tuple(map(tuple, st)))
    box = min(p.page_size, BN[d])  # (a smaller page: one box a page, load_paged)
    return _cached_maps(key, tag, p, st, (d, p.seq_q, hq, b), (d, p.page_size, hkv, pages), box)


LAST_PAGED = None  # (tests: "tma" or "cp.async", the producer the last paged launch used)


def launch_paged(handle, tag, d, b, hq, sq, skv, group, p, pages):
    """One paged forward launch (params p with the page tables set; attention_forward_paged checked them)."""
    global LAST_PAGED
    smem = smem_bytes(d)
    grid = (grid_size(handle, b, hq, sq), 1, 1)
    p.sched_heads = sched_heads(l2_bytes(handle), skv, d, group, (sq + BM - 1) // BM, grid[0])
    unit = PAGED_UNIT.format(tag)
    if takes_tma_paged(d, p):
        try:
            maps = paged_maps(tag, d, p, pages)
        except Exception:  # noqa: BLE001 - a layout the encoder refuses: the cp.async producer
            maps = None
        if maps is not None:
            LAST_PAGED = "tma"
            f = handle.function(unit, _paged_expr(tag, d, True), smem)
            argv = (ctypes.c_void_p * 2)(ctypes.addressof(p), ctypes.addressof(maps))
            err = driver._driver().cuLaunchKernel(f, grid[0], 1, 1, THREADS, 1, 1, smem, handle.cu_stream,
                                                  ctypes.addressof(argv), 0)[0]
            if err != 0:
                driver.check((err,), "cuLaunchKernel")
            return
    LAST_PAGED = "cp.async"
    f = handle.function(unit, _paged_expr(tag, d, False), smem)
    driver.launch(f, grid, (THREADS, 1, 1), smem, handle.cu_stream, p)
