"""Fused attention backward on Hopper, warp specialized as FlashAttention-3 builds it (ptx/attention_ws_bwd.cu;
units attention.ws_bwd.<tag>, sm_90a only, registered through attention_wgmma_bwd.kernel_units).

bwd_ws<T, D, ATOMIC, STAGES> replaces the older wgmma dK / dV kernel (attention_wgmma_bwd.py's
bwd_dkdv_wg) where `usable` says so: one CTA per (128 keys, K/V head, batch), a producer warp loading K / V
once and then Q / dO (TMA) with lse / dsum (plain loads) into a STAGES-deep mbarrier ring, two consumer
warpgroups of 64 keys each holding dK / dV in registers across the walk over the group's query heads and
tiles, dQ added to the fp32 accumulator (deterministic = 0: red.global.add from the registers, or FA3's
bulk reduction of a shared-memory tile, tuning.attention_bwd.WS_DQ) or left to the deterministic dQ pass. The
preprocess, the dQ conversion and the deterministic dQ pass are unchanged (pydnn/ops/attention.py's
attention_backward launches them around this kernel), and so is the workspace.

d 256 runs bwd_ws256<T, DQ> (DQ a D256_MODES value; atomic: tuning.attention_bwd.WS_DQ_D256): one CTA per 64
keys, consumer warpgroup w holding dK / dV's head-dim columns 128 w.. (ptx/attention_ws_bwd.cu Cfg256 has the
register and shared-memory counts); the deterministic mode's dQ pass there is attention.cu's mma.sync bwd_dq, the
older kernel the mma.sync bwd_dkdv.

Not taken (the older kernel runs): per-batch lengths (TMA's boxes would bring rows past a length that are
not zero), a launch recorder listening (the tensor maps hold pointers a record cannot patch), a head dim
outside HEAD_DIMS (HEAD_DIMS_DET for deterministic = 1), dropout, tuning.attention_bwd.WS False, or an encode the driver refuses.
"""
import ctypes
import functools

from .. import tuning
from .._build.manifest import KernelUnit
from .._cuda import driver, tensormap

ARCH = "sm_90"
INSTANTIATED = (64, 128, 256)
# The head dims the planner sends here by default, atomic dQ (deterministic = 0) and deterministic (the dQ
# pass after this kernel). Both lists take d64 and d128: the kernel beat the older bwd_dkdv_wg at every measured
# point, atomic 0.832x cuDNN geomean against 0.615x, deterministic 1.13-1.23x the older time (H200, b4 s4096;
# the runs: tools/PERF.md, the attn section of session 28).
# d 256 (bwd_ws256, session 30): 64-key CTAs, dK / dV split by head-dim halves over the consumer warpgroups;
# dQ by red.global.add or (deterministic) the mma.sync dQ pass.
HEAD_DIMS = (64, 128, 256)
HEAD_DIMS_DET = (64, 128, 256)
THREADS = 384           # kThreads: the producer warpgroup and two consumer warpgroups
KEYS = 128              # kBN
STAGES = 2
TAGS = ("bf16", "f16")
CTYPE = {"bf16": "pydnn::bf16_t", "f16": "pydnn::half_t"}


def query_rows(d):
    """Cfg<D>::BM: query rows a stage (bwd_dkdv_wg's: the S^T / dP^T and dK / dV accumulators)."""
    return 64 if d > 64 else 128


def keys(d):
    """Keys a CTA: kBN, Cfg256::BN at d 256 (dK / dV of 64 keys x 256: 128 registers a consumer thread)."""
    return 64 if d == 256 else KEYS


def smem_bytes(d, stages=STAGES, mode="none"):
    """Cfg<D, STAGES, NDQ>::SMEM: K, V (128 keys), STAGES stages of Q and dO, two dS^T buffers, lse / dsum
    [STAGES][BM] each, the fp32 dQ tile (BM x d, kDqBulk's; every mode reserves one, "bulkwpp" two),
    9 + 2 STAGES mbarriers and two dQ tiles' coordinates (16 bytes), 1 KiB alignment slack (d 128: 198776
    bytes, 3 stages 232072 (of 232448), bulkwpp 231544; d 64: 199800)."""
    if d == 256:  # Cfg256: K, V (64 keys), 2 stages of Q / dO, 2 x (P^T, dS^T), lse / dsum, 7 mbarriers, slack
        return 2 * 64 * d * 2 + 2 * 2 * 64 * d * 2 + 4 * 64 * 64 * 2 + 2 * 64 * 8 + 7 * 8 + 1024
    bm = query_rows(d)
    ndq = 2 if mode == "bulkwpp" else 1
    return (2 * KEYS * d * 2 + 2 * stages * bm * d * 2 + 2 * KEYS * bm * 2 + stages * bm * 8 + ndq * bm * d * 4
            + (2 * stages + 9) * 8 + 16 + 1024)


# kDqNone, kDqRed, kDqBulk, kDqRedPP, kDqBulkW (bulk with FA3's dedicated dQ writer warp), kDqBulkWPP (the
# writer with redpp's ping-pong, two dQ tiles). MODE_DIMS: the head dims a mode is instantiated for (others
# run "bulk"): bulkwpp's two fp32 dQ tiles of 128 x 64 put d 64 at 232568 bytes, past the 232448 an sm_90
# block may have (the mid-session run's cuFuncSetAttribute refused it); at d 64 bulkw carries a 28-byte spill
# (attention_ws_bwd.cu's writer).
# "bulkwpp1" (session 33): bulkwpp with one dQ tile (fits d 64: the ping-pong there; ptx/attention_ws_bwd.cu
# kDqBulkWPP1); the default of WS_DQ and, at d 64, of WS_DQ_CAUSAL's bulkwpp (dq_mode).
DQ_MODES = {"none": 0, "red": 1, "bulk": 2, "redpp": 3, "bulkw": 4, "bulkwpp": 5, "bulkw2": 6, "bulkwpp1": 7}
# d 256 (bwd_ws256): the modes instantiated, "none" (deterministic) and the atomic ones tuning.attention_bwd.
# WS_DQ_D256 picks from (a value not listed runs the first atomic one). The kernel has three: "red"
# (red.global.add), "bulkw" (the writer's bulk reductions, the fp32 dQ tile staged in the stage's Q / dO buffers:
# no room for a tile of its own) and "bulkw2" (d 256 only: bulkw with the dO buffer taking both warpgroups' first
# 64 dQ columns, the Q buffer their last 64, each in the bytes its own dV / dK read: no meeting). Session 30's
# mid-session H200 runs (tools/PERF.md): bulkw 0.918 / 0.929x cuDNN, bulkw2 0.919, red 0.778 / 0.799; only bulkw
# is instantiated (the install-time build compiles what the defaults run; the others, GPU-tested in those runs,
# come back by adding them here).
D256_MODES = ("none", "bulkw")
MODE_DIMS = {"bulkwpp": (128,), "bulk": (64, 128), "redpp": (64, 128), "bulkwpp1": (64, 128),
             **{m: (64, 128) + ((256,) if m in D256_MODES else ()) for m in ("red", "bulkw")},
             "bulkw2": (256,) if "bulkw2" in D256_MODES else ()}
SMEM_LIMIT = 227 * 1024  # sm_90's largest dynamic shared memory a block (attention_ws_bwd.cu static_asserts it)
# (d, mode, stages) instantiated beyond the STAGES ones: the 3-stage ring where it fits (d 128: 232040 bytes;
# d 64's 128-row stages do not), for tuning.attention_bwd.WS_STAGES (first use: measured within 1% of 2 stages)
DEEP = tuple((128, m, 3) for m in ("bulk", "bulkw", "bulkwpp1"))


# bwd_ws's VAR (ptx/attention_ws_bwd.cu kVar*), tuning.attention_bwd.WS_VAR, first-use instantiations of the default
# modes (pydnn/_build/rare.py): the probes "noexp" (no exponential), "nored" (no dQ bulk reductions), "noload" (Q / dO
# loaded for the first stages only), timing only (their results are wrong): what each part of a tile costs; and "l2pf"
# (results kept, not yet timed: the next wave's K / V prefetched into L2, kVarL2Pf). (Session 33's A/B variants, the
# old exponentials' loop, the old descriptors, ghost tiles and exp2_poly eighths: tools/PERF.md.)
VARS = {"noexp": 1, "nored": 2, "noload": 4, "l2pf": 8}
VAR_CASES = ((64, "bulkwpp1"), (128, "bulkwpp1"), (128, "bulkwpp"))


def var_of(d, mode, stages):
    """tuning.attention_bwd.WS_VAR's VAR value where (d, mode) is one of VAR_CASES on STAGES stages, else 0."""
    v = tuning.attention_bwd.WS_VAR
    if not v or stages != STAGES or (d, mode) not in VAR_CASES:
        return 0
    if v not in VARS:
        raise ValueError(f"tuning.attention_bwd.WS_VAR: {v!r} is not one of {sorted(VARS)}")
    return VARS[v]


def stages_of(d, mode):
    """tuning.attention_bwd.WS_STAGES where that (d, mode) is instantiated with it, else STAGES."""
    st = tuning.attention_bwd.WS_STAGES
    return st if st == STAGES or (d, mode, st) in DEEP else STAGES


def dq_mode(atomic, d=128, causal=False):
    """The kernel's DQ argument: "none" (deterministic: the older dQ pass), else tuning.attention_bwd.WS_DQ, or
    under a causal mask WS_DQ_CAUSAL when set (for a mode not instantiated at head dim d, MODE_DIMS: bulkwpp's
    one-tile form bulkwpp1 for bulkwpp, "bulk" for the others)."""
    if not atomic:
        return "none"
    if d == 256:
        m = tuning.attention_bwd.WS_DQ_D256
        return m if m in D256_MODES else D256_MODES[1]
    m = (causal and tuning.attention_bwd.WS_DQ_CAUSAL) or tuning.attention_bwd.WS_DQ
    if d in MODE_DIMS.get(m, INSTANTIATED):
        return m
    return "bulkwpp1" if m == "bulkwpp" and d in MODE_DIMS["bulkwpp1"] else "bulk"


def _expr(tag, d, mode, stages=STAGES, var=0):
    """bwd_ws<T, D, DQ, STAGES> (var: bwd_ws_var<T, D, DQ, STAGES, VAR>; d 256: bwd_ws256<T, DQ>, 2 stages); mode a
    DQ_MODES key."""
    if d == 256:
        return f"pydnn::attn_wsb::bwd_ws256<{CTYPE[tag]}, {DQ_MODES[mode]}>"
    if var:
        return f"pydnn::attn_wsb::bwd_ws_var<{CTYPE[tag]}, {d}, {DQ_MODES[mode]}, {stages}, {var}>"
    return f"pydnn::attn_wsb::bwd_ws<{CTYPE[tag]}, {d}, {DQ_MODES[mode]}, {stages}>"


def unit_name(tag):
    return f"attention.ws_bwd.{tag}"


@functools.lru_cache(maxsize=None)
def d256_compiles():
    """Whether this NVRTC compiles bwd_ws256: NVRTC 12 (12.9, CI's cu12 packages) crashes (SIGSEGV) on it, so
    under a CUDA 12 toolkit the d 256 backward is not instantiated and stays on the mma.sync kernels."""
    from .._cuda import nvrtc
    try:
        return nvrtc.version()[0] >= 13
    except Exception:  # noqa: BLE001 - no NVRTC here: the unit list of the default (CUDA 13) install
        return True


def _dims():
    return tuple(d for d in INSTANTIATED if d != 256 or d256_compiles())


def kernel_units():
    return [KernelUnit(unit_name(tag), "attention_ws_bwd.cu",
                       tuple(_expr(tag, d, m) for d in _dims() for m in DQ_MODES if d in MODE_DIMS.get(m, (d,)))
                       + tuple(_expr(tag, d, m, st) for d, m, st in DEEP)
                       + tuple(_expr(tag, d, m, STAGES, v) for d, m in VAR_CASES if d in _dims()
                               for v in VARS.values()),
                       archs=(ARCH + "a",))
            for tag in TAGS]


def usable(handle, d, tag, dropout, p, atomic=True):
    """Whether bwd_ws runs this problem (params p: lens_q / lens_kv set or not; atomic: deterministic = 0)."""
    return (tuning.attention_bwd.WS and tuning.attention_bwd.ENABLED and handle.arch == ARCH and dropout == 0
            and d in (HEAD_DIMS if atomic else HEAD_DIMS_DET) and d in _dims() and tag in TAGS and not p.lens_q and not p.lens_kv
            and driver._recorders == 0 and not (p.dq_acc or 0) % 16)  # (the bulk reduction's alignment)


class Maps(ctypes.Structure):
    """attention_ws_bwd.cu Maps: the encoded Q, dO, K, V tensor maps and (bulk dQ) the fp32 accumulator's
    (128 bytes each; zeros where the kernel does not read it)."""
    _fields_ = [("raw", ctypes.c_ubyte * 640)]


_MAPS = {}          # (tag, d, pointers, sizes, strides) -> Maps: a repeated call encodes nothing
_MAPS_LIMIT = 64


def _encode(tag, ptr, dims, st, rows):
    """A 4-d (d, seq, heads, batch) tiled map, strides st = (batch, head, seq) in elements, boxes of 64
    columns x rows, 128B swizzle, out-of-bounds zero."""
    return tensormap.encode_tiled(tag, int(ptr), dims, [2 * st[2], 2 * st[1], 2 * st[0]], (64, rows, 1, 1))


def maps(tag, d, p, mode="none"):
    """The Maps of a call (params p; tensors 0 Q, 1 K, 2 V, 4 dO of attention_params.h; mode "bulk(w)": the
    dQ accumulator's too, (d, seq_q, batch x heads_q) fp32, boxes of 32 columns x BM rows)."""
    b, hq, hkv = p.batch, p.heads_q, p.heads_kv
    st = {t: tuple(p.stride[t][i] for i in range(3)) for t in (0, 1, 2, 4)}
    acc = p.dq_acc if mode in ("bulk", "bulkw", "bulkwpp", "bulkw2", "bulkwpp1") else None
    key = (tag, d, p.q, p.dout, p.k, p.v, acc, b, hq, hkv, p.seq_q, p.seq_kv, tuple(st.values()))
    m = _MAPS.get(key)
    if m is not None:
        return m
    bm, bn = query_rows(d), keys(d)
    raw = (_encode(tag, p.q, (d, p.seq_q, hq, b), st[0], bm) + _encode(tag, p.dout, (d, p.seq_q, hq, b), st[4], bm)
           + _encode(tag, p.k, (d, p.seq_kv, hkv, b), st[1], bn)
           + _encode(tag, p.v, (d, p.seq_kv, hkv, b), st[2], bn))
    if acc:
        raw += tensormap.encode_tiled("f32", int(acc), (d, p.seq_q, b * hq), [4 * d, 4 * d * p.seq_q], (32, bm, 1))
    m = Maps()
    ctypes.memmove(ctypes.addressof(m), raw, len(raw))
    if len(_MAPS) >= _MAPS_LIMIT:
        _MAPS.clear()
    _MAPS[key] = m
    return m


def grid(batch, heads_kv, seq_kv, d=128):
    """(128-key blocks (64 at d 256), K/V heads, batch), or with tuning.attention_bwd.WS_ORDER the same CTAs
    as a 1-d grid the kernel orders itself (kOrderChunk's longest-walk-first chunks)."""
    nx = (seq_kv + keys(d) - 1) // keys(d)
    return (nx * heads_kv * batch, 1, 1) if tuning.attention_bwd.WS_ORDER else (nx, heads_kv, batch)


def launch_dkdv(handle, tag, d, atomic, batch, heads_kv, seq_kv, p):
    """bwd_ws over (128-key blocks, K/V heads, batch). Returns False (nothing launched) when the driver
    refuses a tensor map: the caller then runs the older kernel."""
    mode = dq_mode(atomic, d, p.mask != 0)
    try:
        m = maps(tag, d, p, mode)
    except Exception:  # noqa: BLE001 - a layout the encoder refuses
        return False
    st = stages_of(d, mode)
    smem = smem_bytes(d, st, mode)
    f = handle.function(unit_name(tag), _expr(tag, d, mode, st, var_of(d, mode, st)), smem)
    arr = (ctypes.c_void_p * 2)(ctypes.addressof(p), ctypes.addressof(m))  # two kernel arguments: params, maps
    driver.launch_args(f, grid(batch, heads_kv, seq_kv, d), (THREADS, 1, 1), smem, handle.cu_stream,
                       (arr, ctypes.addressof(arr), p, m))
    return True
