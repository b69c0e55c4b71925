"""Attention: fused scaled dot-product attention (a pydnn API in cuDNN style; kernels in ptx/attention.cu).

    O = softmax(scale * Q K^T + mask) V          per (batch, query head); K/V head = query head / group
    lse = log(sum_j exp(scale * q_i . k_j))      per query row (natural log, fp32): what the backward needs

Tensors are 4-d descriptors (batch, heads, sequence, head dim): Q and O (B, Hq, Sq, D), K and V
(B, Hkv, Skv, D), the statistics (B, Hq, Sq, 1) float. BHSD and BSHD (or any other order) are strides;
the head dim must be contiguous (stride 1) and the other strides multiples of 8 elements (16 bytes), the
pointers 16-byte aligned. bf16 and fp16 (fp32 accumulation and softmax); head dims 64, 96, 128 and 256.

The descriptor (pydnn extension: pydnnAttentionDescriptor_t):
    set_attention_descriptor(desc, numHeadsQ, numHeadsKV, headDim, softmaxScale, maskMode,
                             dropoutProbability, seed)
  numHeadsQ a multiple of numHeadsKV (MHA, GQA, MQA); maskMode a pydnnAttentionMaskMode_t
  (NONE, CAUSAL_TOP_LEFT: key j visible to query i when j <= i; CAUSAL_BOTTOM_RIGHT: j <= i + Skv - Sq,
  lengths being the per-batch actual ones); softmaxScale > 0; dropout probability p in [0, 1) on the
  softmax probabilities (kept ones scaled by 1 / (1 - p)), with the Philox stream (seed, offset 0) of
  ptx/common/philox.cuh: element (query i, key j) of (batch b, query head h) is number
  ((b * Hq + h) * Sq + i) * Skv + j of the stream, dropped iff its 16-bit slice < round(p * 65536)
  (pydnn/reference/dropout.py's keep_mask replays it). The same mask in the forward and the backward;
  change the seed between training steps. (Correct first: one Philox block per element, not fast.)

Variable lengths: seqLensQ / seqLensKV are int32 device arrays of B entries (cuDNN's SEQ_LEN tensors) or
NULL for the full length. The kernels read them (no host synchronization, graph capturable) and clamp
them to [0, S]; under PYDNN_CHECKED=1 they are copied to the host first and a length outside [0, S] is
BAD_PARAM. Rows past their length: O = 0, lse = -inf, dQ = 0; keys past theirs: dK = dV = 0. A row that
sees no key at all: O = 0, lse = -inf.

Workspace: forward none, except the split-KV decode forward (below): its partial results, the size query's
number (a smaller workspace makes fewer splits, none one split: nothing is allocated behind the caller's
back); backward rowsum(dO * O) (4 bytes per query row, rounded up to 16) and, when
deterministic = 0, an fp32 dQ accumulator (4 * D bytes per query row); the size query reports the latter.
Backward: dQ, dK, dV (dK, dV summed over the query heads that share a K/V head, in registers: always
deterministic). dQ: deterministic = 1 runs a separate dQ pass (recomputes S and dP; every element summed
by one thread in a fixed order: bit-identical results run to run); deterministic = 0 adds each K/V
block's dQ share with fp32 atomics into the accumulator (faster; the order of the float sums varies).

Kernels. On sm_90 (Hopper) without dropout, wgmma ones. The d 64 / 128 / 256 forward is
ptx/attention_ws.cu (pydnn/ops/attention_ws.py; tuning.attention.WS, WS_TMA): FlashAttention-3's warp
specialization, a producer warpgroup filling mbarrier-guarded K / V rings (TMA where it can), two
consumer warpgroups taking turns at the tensor cores (ping-pong), a persistent grid with the longest
causal row blocks first. The d 96 forward (and the others with WS off) is ptx/attention_wgmma.cu (128 query
rows per CTA = two warpgroups x 64, 128-key K/V tiles double-buffered with cp.async in 128B-swizzled
shared memory, S by wgmma from shared memory, P kept in registers as the A operand of P V; see
pydnn/ops/attention_wgmma.py) and the backward's dK/dV (+ the atomic dQ share) and deterministic dQ
passes ptx/attention_wgmma_bwd.cu (128 keys / 128 query rows per CTA; pydnn/ops/attention_wgmma_bwd.py).
Elsewhere, and with dropout, the mma.sync ones (ptx/attention.cu): forward 128 query rows per CTA (4 warps
x 32 rows), K/V tiles of 64 keys (32 at D = 128) double-buffered with cp.async, mma.sync m16n8k16;
backward: preprocess (rowsum), dK/dV per 64-key block (loops over the group's query heads and query tiles
of 64 rows, 32 at D = 128), dQ per 64 query rows. The switches attention_wgmma.ENABLED /
attention_wgmma_bwd.ENABLED force the mma.sync kernels on Hopper too. Head dims 96 and 256: on sm_90 the
forward on wgmma (D = 96 as D = 128 with 32 zero columns in shared memory, D = 256 with 64-key tiles), and
the D = 96 backward (D = 128's tiles, zero padding); the D = 256 backward's dK / dV on the warp-specialized
bwd_ws256 (64-key CTAs, pydnn/ops/attention_ws_bwd.py; its deterministic dQ pass the mma.sync one); the D = 256
backward that bwd_ws256 does not take, other archs and dropout on mma.sync: D = 96 in D = 128's shared-memory layout, D = 256 with
64-row forward CTAs, dK / dV split over two CTAs by halves of the head dim and 16-row / 16-key tiles
(Tiles<D> in ptx/attention.cu has the register and smem counts).

Decode (tuning.attention.DECODE, DECODE_MAX_SQ, DECODE_SPLITS, DECODE_IMBALANCE): a forward of at most 16
query rows without dropout runs ptx/attention.cu's dec: the query rows of each K/V head's group (GQA) in one
CTA's 16 rows, so each K/V tile is read once for the group, the keys split over `splits` CTAs (FlashDecoding;
decode_plan / split_cost pick the count whose CTAs fill whole layers of one or two per SM: a CTA streams at
~1/132 of the DRAM rate, and a last wave of a few CTAs costs as much as a full one), each writing its partial O and lse to the workspace, then dec_combine merges
them (one CTA per query row). A repeated decode call with the same descriptors, workspace size and switches
runs from a record kept on the handle (_dec_replay: pointer checks, the params patched, the launches).
"""
import ctypes

import numpy as np

from .. import enums as E
from .. import tuning
from .._build.manifest import KernelUnit
from .._build.params import kernel_params
from .._cuda import driver
from .. import buffers as _buffers
from ..buffers import CHECKED, device_ptr
from ..handle import Handle, check_handle
from ..status import PydnnError, api
from ..tensor import check_tensor, _int
from . import attention_wgmma as W
from . import attention_ws as WS
from . import attention_wgmma_bwd as _wgb
from . import attention_ws_bwd as _wsb
from .common import TAG, cdiv, enum_arg, output_tensor, same_shape, scalar

__all__ = ["AttentionDescriptor", "create_attention_descriptor", "set_attention_descriptor",
           "get_attention_descriptor", "destroy_attention_descriptor",
           "get_attention_forward_workspace_size", "get_attention_backward_workspace_size",
           "attention_forward", "attention_backward", "get_attention_forward_paged_workspace_size",
           "attention_forward_paged"]

_T = "pydnnTensorDescriptor_t"
C_API = [("Fused scaled dot-product attention (pydnn extension)", [
    ("pydnnStatus_t pydnnCreateAttentionDescriptor(pydnnAttentionDescriptor_t *attnDesc);",
     "A new fused-attention descriptor, unset until pydnnSetAttentionDescriptor."),
    ("pydnnStatus_t pydnnSetAttentionDescriptor(pydnnAttentionDescriptor_t attnDesc, int numHeadsQ, int numHeadsKV, "
     "int headDim, double softmaxScale, pydnnAttentionMaskMode_t maskMode, double dropoutProbability, "
     "unsigned long long seed);",
     "Heads of Q and of K/V (numHeadsQ a multiple of numHeadsKV), head dim, softmax scale (> 0), mask, dropout."),
    ("pydnnStatus_t pydnnGetAttentionDescriptor(const pydnnAttentionDescriptor_t attnDesc, int *numHeadsQ, "
     "int *numHeadsKV, int *headDim, double *softmaxScale, pydnnAttentionMaskMode_t *maskMode, "
     "double *dropoutProbability, unsigned long long *seed);", "The fused-attention descriptor's settings."),
    ("pydnnStatus_t pydnnDestroyAttentionDescriptor(pydnnAttentionDescriptor_t attnDesc);",
     "Release a fused-attention descriptor (NULL: nothing to do)."),
    ("pydnnStatus_t pydnnGetAttentionForwardWorkspaceSize(pydnnHandle_t handle, const pydnnAttentionDescriptor_t attnDesc, "
     f"const {_T} qDesc, const {_T} kDesc, size_t *sizeInBytes);",
     "Workspace bytes pydnnAttentionForward needs: 0, or for the split-KV decode forward (seqQ <= 16, no "
     "dropout) its partial results (batch * numHeadsQ * seqQ * splits * (headDim + 1) * 4); less makes fewer splits."),
    ("pydnnStatus_t pydnnGetAttentionBackwardWorkspaceSize(pydnnHandle_t handle, const pydnnAttentionDescriptor_t attnDesc, "
     f"const {_T} qDesc, const {_T} kDesc, size_t *sizeInBytes);",
     "Workspace bytes pydnnAttentionBackward needs (batch * numHeadsQ * seqQ * 4)."),
    ("pydnnStatus_t pydnnAttentionForward(pydnnHandle_t handle, const pydnnAttentionDescriptor_t attnDesc, "
     f"const {_T} qDesc, const void *q, const {_T} kDesc, const void *k, const {_T} vDesc, const void *v, "
     f"const {_T} oDesc, void *o, const {_T} statsDesc, void *stats, const void *seqLensQ, const void *seqLensKV, "
     "void *workSpace, size_t workSpaceSizeInBytes);",
     "O = softmax(scale Q K^T + mask) V; stats (fp32 log-sum-exp per row, statsDesc NULL: not written); "
     "seqLens*: int32 device arrays or NULL."),
    ("pydnnStatus_t pydnnAttentionBackward(pydnnHandle_t handle, const pydnnAttentionDescriptor_t attnDesc, "
     f"const {_T} qDesc, const void *q, const {_T} kDesc, const void *k, const {_T} vDesc, const void *v, "
     f"const {_T} oDesc, const void *o, const {_T} dODesc, const void *dO, const {_T} statsDesc, const void *stats, "
     f"const {_T} dQDesc, void *dQ, const {_T} dKDesc, void *dK, const {_T} dVDesc, void *dV, "
     "const void *seqLensQ, const void *seqLensKV, int deterministic, void *workSpace, size_t workSpaceSizeInBytes);",
     "dQ, dK, dV from the forward's O and stats (dK, dV summed over the query heads of each K/V head)."),
])]
C_OPAQUE_TYPES = [("pydnnAttentionDescriptor_t", "pydnnAttentionStruct")]
C_NULLABLE = {"pydnnAttentionForward": ("statsDesc",)}

HEAD_DIMS = (64, 96, 128, 256)
BASE_DIMS = (64, 128)   # in units attention.<tag>; 96 and 256 in their own units (unit_name)
DTYPES = (E.PYDNN_DATA_HALF, E.PYDNN_DATA_BFLOAT16)
MASKS = (E.PYDNN_ATTN_MASK_NONE, E.PYDNN_ATTN_MASK_CAUSAL_TOP_LEFT, E.PYDNN_ATTN_MASK_CAUSAL_BOTTOM_RIGHT)
THREADS = 128
BWD_M, BWD_N = 64, 64                              # kBwdM, kBwdN in ptx/attention.cu
# Tiles<D> in ptx/attention.cu (the register / shared-memory arithmetic that chose them is there):
FWD_ROWS = {64: 128, 96: 128, 128: 128, 256: 64}   # kFwdM: forward query rows per CTA
DQ_N = {64: 64, 96: 64, 128: 64, 256: 16}          # kDqN: the dQ pass's keys per K/V tile
DSPLIT = {64: 1, 96: 1, 128: 1, 256: 2}            # kDSplit: CTAs sharing a key block's head dim in dK/dV
KV_M = {64: 64, 96: 32, 128: 32, 256: 16}          # kKvM: dK/dV query rows per tile
# forward tiles (keys per compute step, keys per K/V tile in shared memory) instantiated per head dim, and
# the one used (FWD_N; the benchmark measures each instantiated). At D = 128, 32/64 and 64/64 (which
# spill a little) measured within -1%..+2% of 32/32 on the H200 (tools/bench_attention.py): not instantiated.
# D = 96: 32-key steps in 64-key tiles (a 64-key step spilled 40 bytes); D = 256: 32 / 32 (O alone is 128
# registers; 64-key tiles would halve the CTAs per SM).
FWD_TILES = {64: ((64, 64),), 96: ((32, 64),), 128: ((32, 32),), 256: ((32, 32),)}
FWD_N = {64: (64, 64), 96: (32, 64), 128: (32, 32), 256: (32, 32)}
DEC_N = 64                                         # kDecN: decode keys per K/V tile (16 per warp)
DEC_STAGES = {64: 3, 96: 3, 128: 3, 256: 2}        # Dec<D>::STAGES
DEC_ROWS = 16                                      # decode rows per CTA (one m16 tile)
DEC_MIN_TILES = 4      # a split covers at least 4 tiles (256 keys): below that the combine's traffic dominates
DEC_MAX_SPLITS = 256
T_Q, T_K, T_V, T_O, T_DO, T_DQ, T_DK, T_DV, T_LSE = range(9)  # PYDNN_ATTN_T_*
MAX_GRID_YZ = 65535
LOG2E = 1.4426950408889634


@kernel_params("attention_params.h", "AttnParams")
class AttnParams(ctypes.Structure):
    _fields_ = [
        ("q", ctypes.c_void_p), ("k", ctypes.c_void_p), ("v", ctypes.c_void_p), ("o", ctypes.c_void_p),
        ("lse", ctypes.c_void_p), ("dout", ctypes.c_void_p), ("dq", ctypes.c_void_p), ("dk", ctypes.c_void_p),
        ("dv", ctypes.c_void_p), ("dsum", ctypes.c_void_p), ("dq_acc", ctypes.c_void_p),
        ("lens_q", ctypes.c_void_p), ("lens_kv", ctypes.c_void_p),
        ("stride", (ctypes.c_longlong * 3) * 9),
        ("batch", ctypes.c_int), ("heads_q", ctypes.c_int), ("heads_kv", ctypes.c_int), ("group", ctypes.c_int),
        ("seq_q", ctypes.c_int), ("seq_kv", ctypes.c_int), ("mask", ctypes.c_int), ("flags", ctypes.c_uint),
        ("scale", ctypes.c_float), ("scale_log2", ctypes.c_float),
        ("seed", ctypes.c_ulonglong), ("drop_threshold", ctypes.c_uint), ("drop_scale", ctypes.c_float),
        ("part_o", ctypes.c_void_p), ("part_lse", ctypes.c_void_p), ("splits", ctypes.c_int),
        ("split_len", ctypes.c_int), ("sched_heads", ctypes.c_int), ("sched_pad", ctypes.c_int),
        ("ptab_k", ctypes.c_void_p), ("ptab_v", ctypes.c_void_p), ("ptab_stride", (ctypes.c_longlong * 2) * 2),
        ("page_size", ctypes.c_int), ("paged_pad", ctypes.c_int),
    ]


# ----------------------------------------------------------------------------- kernel units

def pitch(d):
    """Pitch<D>: elements per shared-memory row (D = 96 is swizzled as D = 128, its last quarter unused)."""
    return 128 if d == 96 else d


def unit_name(kernel, d, tag, drop=False):
    """The unit holding kernel `kernel` at head dim d: attention.<tag> (64, 128), attention.d96.<tag> and
    attention.d256.<tag> (96 / 256 without dropout), attention.dropx.<tag> (their dropout variants),
    attention.dec.<tag> (the decode kernels, every head dim). Smaller units compile in parallel (the
    install's build, a test run's prebuild) and load only when used."""
    if kernel in ("dec_paged", "dec_paged_pipe"):
        return f"attention.dec.paged.{tag}"
    if kernel in ("dec", "dec_combine"):
        return f"attention.dec.{tag}"
    if d in BASE_DIMS:
        return f"attention.{tag}"
    return f"attention.dropx.{tag}" if drop else f"attention.d{d}.{tag}"


def _expr(kernel, tag, d, extra=None):
    t = "pydnn::bf16_t" if tag == "bf16" else "pydnn::half_t"
    if kernel == "dec_paged":  # dec<T, D, true>: paged K / V
        kernel, extra = "dec", "true"
    if kernel == "dec_paged_pipe":  # dec<T, D, true, true>: the page ids loaded an iteration ahead
        kernel, extra = "dec", "true, true"
    tail = "" if extra is None else f", {extra}"
    return f"pydnn::attn::{kernel}<{t}, {d}{tail}>"


def _b(v):
    return "true" if v else "false"


def _targs(kernel, d, drop=False, atomic=False, tile=None):
    """The template arguments after <T, D> of a kernel variant (None: none)."""
    if kernel == "fwd":
        n, nl = tile or FWD_N[d]
        return f"{n}, {nl}, {_b(drop)}"
    if kernel == "bwd_dq":
        return _b(drop)
    if kernel == "bwd_dkdv":
        return f"{_b(atomic)}, {_b(drop)}"
    return None  # bwd_pre, bwd_dq_convert, dec, dec_combine


def _unit_exprs(tag, dims, drops=(False, True), plain=True):
    exprs = []
    for d in dims:
        for drop in drops:
            exprs += [_expr("fwd", tag, d, _targs("fwd", d, drop, tile=t)) for t in FWD_TILES[d]]
            exprs += [_expr("bwd_dq", tag, d, _targs("bwd_dq", d, drop))]
            exprs += [_expr("bwd_dkdv", tag, d, _targs("bwd_dkdv", d, drop, at)) for at in (False, True)]
        if plain:
            exprs += [_expr("bwd_pre", tag, d), _expr("bwd_dq_convert", tag, d)]
    return tuple(exprs)


def kernel_units():
    tags = ("bf16", "f16")
    extra = tuple(d for d in HEAD_DIMS if d not in BASE_DIMS)
    dec = lambda t: tuple(_expr(k, t, d) for d in HEAD_DIMS for k in ("dec", "dec_combine"))  # noqa: E731
    return ([KernelUnit(f"attention.{t}", "attention.cu", _unit_exprs(t, BASE_DIMS)) for t in tags]
            + [KernelUnit(f"attention.d{d}.{t}", "attention.cu", _unit_exprs(t, (d,), (False,))) for d in extra
               for t in tags]
            + [KernelUnit(f"attention.dropx.{t}", "attention.cu", _unit_exprs(t, extra, (True,), False)) for t in tags]
            + [KernelUnit(f"attention.dec.{t}", "attention.cu", dec(t)) for t in tags]
            + [KernelUnit(f"attention.dec.paged.{t}", "attention.cu",
                          tuple(_expr(k, t, d) for k in ("dec_paged", "dec_paged_pipe") for d in HEAD_DIMS)) for t in tags]
            + _prep_units())


# The backward's memory passes in 16-byte accesses (ptx/attention_prep.cu, units attention.prep.<tag>, every arch;
# tuning.attention_bwd.PREP_VEC): bwd_pre_v / bwd_dq_convert_v, PREP_THREADS threads a block, prep_rows(d) rows.
PREP_THREADS = 256
PREP_RPT = 4


def prep_rows(d):
    """Prep<D>::ROWS: query rows a block of bwd_pre_v / bwd_dq_convert_v (D / 8 lanes a row, rounded up to a
    power of two, PREP_RPT rows a thread)."""
    ch = d // 8
    tpr = 8 if ch <= 8 else (16 if ch <= 16 else 32)
    return PREP_THREADS // tpr * PREP_RPT


def prep_unit(tag):
    return f"attention.prep.{tag}"


def prep_expr(kernel, tag, d):
    """kernel "bwd_pre_v" or "bwd_dq_convert_v"."""
    t = "pydnn::bf16_t" if tag == "bf16" else "pydnn::half_t"
    return f"pydnn::attn_prep::{kernel}<{t}, {d}>"


def _prep_units():
    return [KernelUnit(prep_unit(t), "attention_prep.cu",
                       tuple(prep_expr(k, t, d) for d in HEAD_DIMS for k in ("bwd_pre_v", "bwd_dq_convert_v")))
            for t in ("bf16", "f16")]


def _launch_prep(handle, kernel, pr, rows, p):
    """One of the backward's memory passes: the 16-byte form (PREP_VEC) or attention.cu's (a warp a row)."""
    if tuning.attention_bwd.PREP_VEC:
        f = handle.function(prep_unit(pr.tag), prep_expr(kernel, pr.tag, pr.d), 0)
        driver.launch(f, (cdiv(rows, prep_rows(pr.d)), 1, 1), (PREP_THREADS, 1, 1), 0, handle.cu_stream, p)
    else:
        f, _ = _func(handle, kernel[:-2], pr)
        _launch(handle, f, 0, (cdiv(rows, THREADS // 32), 1, 1), p)


def smem_bytes(kernel, d, atomic=False, tile=None):
    """Dynamic shared memory of each kernel (the tile layout at the top of each kernel; rows of pitch(d))."""
    pt = pitch(d)
    if kernel == "fwd":
        return (FWD_ROWS[d] + 4 * (tile or FWD_N[d])[1]) * pt * 2
    if kernel == "bwd_dq":
        return (2 * BWD_M + 4 * DQ_N[d]) * pt * 2
    if kernel == "bwd_dkdv":
        ds = BWD_N * 64 * 2 if atomic else 0  # the dS^T tile
        return (2 * BWD_N + 4 * KV_M[d]) * pt * 2 + 4 * KV_M[d] * 4 + ds
    if kernel in ("dec", "dec_paged", "dec_paged_pipe"):  # Q's 16 rows, the K and V rings (the warps' merge reuses them)
        paged = DEC_STAGES[d] * 2 * DEC_N * 8 if kernel != "dec" else 0  # + the row offsets' ring
        return (DEC_ROWS + 2 * DEC_STAGES[d] * DEC_N) * pt * 2 + paged
    return 0


# ----------------------------------------------------------------------------- the descriptor

class AttentionDescriptor:
    """pydnnAttentionDescriptor_t (pydnn extension): the fused attention problem minus the tensors."""

    __slots__ = ("heads_q", "heads_kv", "head_dim", "scale", "mask", "dropout", "seed", "is_set", "alive",
                 "version")

    def __init__(self):
        self.heads_q = self.heads_kv = self.head_dim = 0
        self.scale, self.mask, self.dropout, self.seed = 1.0, E.PYDNN_ATTN_MASK_NONE, 0.0, 0
        self.is_set, self.alive, self.version = False, True, 0


def _live(desc, name="attnDesc"):
    if type(desc) is not AttentionDescriptor or not desc.alive:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{name}: not a live attention descriptor")
    return desc


def _set_desc(desc, name="attnDesc"):
    _live(desc, name)
    if not desc.is_set:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{name}: descriptor was never set")
    return desc


@api
def create_attention_descriptor():
    """pydnnCreateAttentionDescriptor."""
    return AttentionDescriptor()


@api
def set_attention_descriptor(attn_desc, num_heads_q, num_heads_kv, head_dim, softmax_scale, mask_mode,
                             dropout_probability, seed):
    """pydnnSetAttentionDescriptor. BAD_PARAM: heads or head dim not positive, numHeadsQ not a multiple of
    numHeadsKV, softmaxScale not positive and finite, maskMode not a pydnnAttentionMaskMode_t, dropout
    outside [0, 1), seed outside [0, 2^64). (An unsupported head dim is NOT_SUPPORTED at the call.)"""
    _live(attn_desc)
    hq, hkv, d = _int("numHeadsQ", num_heads_q), _int("numHeadsKV", num_heads_kv), _int("headDim", head_dim)
    for n, v in (("numHeadsQ", hq), ("numHeadsKV", hkv), ("headDim", d)):
        if not 0 < v < 2**31:
            raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{n}: {v} must be in [1, 2^31)")
    if hq % hkv:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM,
                         f"numHeadsQ: {hq} is not a multiple of numHeadsKV ({hkv}); GQA needs whole groups")
    sc = scalar("softmaxScale", softmax_scale)
    if not (sc > 0 and np.isfinite(sc)):
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"softmaxScale: {sc!r} must be positive and finite")
    mask = enum_arg("maskMode", mask_mode, MASKS, "pydnnAttentionMaskMode_t")
    p = scalar("dropoutProbability", dropout_probability)
    if not 0.0 <= p < 1.0:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"dropoutProbability: {p!r} is outside [0, 1)")
    s = _int("seed", seed)
    if not 0 <= s < 2**64:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"seed: {s} is outside [0, 2^64)")
    attn_desc.heads_q, attn_desc.heads_kv, attn_desc.head_dim = hq, hkv, d
    attn_desc.scale, attn_desc.mask, attn_desc.dropout, attn_desc.seed = sc, mask, p, s
    attn_desc.is_set = True
    attn_desc.version += 1


@api
def get_attention_descriptor(attn_desc):
    """pydnnGetAttentionDescriptor -> (numHeadsQ, numHeadsKV, headDim, softmaxScale, maskMode,
    dropoutProbability, seed)."""
    d = _set_desc(attn_desc)
    return d.heads_q, d.heads_kv, d.head_dim, d.scale, d.mask, d.dropout, d.seed


@api
def destroy_attention_descriptor(attn_desc):
    """pydnnDestroyAttentionDescriptor (None / NULL: nothing to do)."""
    if attn_desc is None:
        return
    _live(attn_desc).alive = False
    attn_desc.version += 1


# ----------------------------------------------------------------------------- validation

def _qkv(desc, name, heads, d, dtype=None):
    """A 4-d Q/K/V/O-like descriptor: (B, heads, S, d), half or bfloat16, head dim contiguous, the other
    strides whole 16-byte units. Returns (B, S)."""
    check_tensor(desc, name)
    if desc.dtype not in DTYPES:
        raise PydnnError(E.PYDNN_STATUS_NOT_SUPPORTED,
                         f"{name}: data type {desc.dtype} is not supported by fused attention (half, bfloat16)")
    if dtype is not None and desc.dtype != dtype:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{name}: data type {desc.dtype} differs from qDesc's {dtype}")
    if len(desc.dims) != 4:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM,
                         f"{name}: expected 4 dims (batch, heads, sequence, head dim), got {len(desc.dims)}")
    b, h, s, dd = desc.dims
    if h != heads:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{name}: dims[1] = {h} heads, the descriptor says {heads}")
    if dd != d:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{name}: dims[3] = {dd}, the descriptor's headDim is {d}")
    if s >= 2**31 or b > MAX_GRID_YZ or desc.strides[2] >= 2**31:
        raise PydnnError(E.PYDNN_STATUS_NOT_SUPPORTED, f"{name}: dims {desc.dims} exceed the kernels' limits "
                         f"(sequence < 2^31, batch <= {MAX_GRID_YZ}, sequence stride < 2^31)")
    if desc.strides[3] != 1:
        raise PydnnError(E.PYDNN_STATUS_NOT_SUPPORTED,
                         f"{name}: strides[3] = {desc.strides[3]}; the head dim must be contiguous (stride 1)")
    for i in (2, 1, 0):  # innermost first: the one that breaks the rows' alignment
        if desc.strides[i] % 8:
            raise PydnnError(E.PYDNN_STATUS_NOT_SUPPORTED,
                             f"{name}: strides[{i}] = {desc.strides[i]} is not a multiple of 8 elements "
                             "(16-byte rows are needed by the kernels' vector copies)")
    return b, s


def _stats(desc, name, b, hq, sq):
    check_tensor(desc, name)
    if desc.dtype != E.PYDNN_DATA_FLOAT:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{name}: the statistics are float (fp32), got {desc.dtype}")
    if desc.dims != (b, hq, sq, 1):
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{name}: dims {desc.dims} must be {(b, hq, sq, 1)}")


class _Problem:
    __slots__ = ("b", "sq", "skv", "dtype", "d", "tag", "ws")


def _validate(a, q_desc, k_desc, v_desc, o_desc, o_name, stats_desc, stats_required):
    """Shapes of one call (forward: o is the output; backward: the forward's O)."""
    _set_desc(a)
    if a.head_dim not in HEAD_DIMS:
        raise PydnnError(E.PYDNN_STATUS_NOT_SUPPORTED,
                         f"attnDesc: headDim {a.head_dim} is not supported (fused attention has {HEAD_DIMS})")
    if a.heads_q > MAX_GRID_YZ:
        raise PydnnError(E.PYDNN_STATUS_NOT_SUPPORTED, f"attnDesc: numHeadsQ {a.heads_q} > {MAX_GRID_YZ}")
    b, sq = _qkv(q_desc, "qDesc", a.heads_q, a.head_dim)
    dt = q_desc.dtype
    bk, skv = _qkv(k_desc, "kDesc", a.heads_kv, a.head_dim, dt)
    if bk != b:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"kDesc: batch {bk} differs from qDesc's {b}")
    _qkv(v_desc, "vDesc", a.heads_kv, a.head_dim, dt)
    same_shape(k_desc, "kDesc", v_desc, "vDesc")
    _qkv(o_desc, o_name, a.heads_q, a.head_dim, dt)
    same_shape(q_desc, "qDesc", o_desc, o_name)
    if stats_desc is not None:
        _stats(stats_desc, "statsDesc", b, a.heads_q, sq)
    elif stats_required:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, "statsDesc: NULL; the backward needs the forward's statistics")
    pr = _Problem()
    pr.b, pr.sq, pr.skv, pr.dtype, pr.d, pr.tag = b, sq, skv, dt, a.head_dim, TAG[dt]
    pr.ws = _ws_sizes(b, a.heads_q, sq, a.head_dim)
    return pr


def _ws_sizes(b, hq, sq, d):
    """(deterministic, atomic) backward workspace bytes: rowsum(dO * O) (rounded to 16 bytes), then for the
    atomic mode the fp32 dQ accumulator."""
    dsum = (b * hq * sq * 4 + 15) // 16 * 16
    return dsum, dsum + b * hq * sq * d * 4


def _ptr16(buf, name, desc):
    p = device_ptr(buf, name, desc.span_bytes())
    if p % 16:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER,
                         f"{name}: {p:#x} is not 16-byte aligned (the kernels copy 16-byte vectors)")
    return p


def _lens(buf, name, batch, seq):
    """An optional int32 device array of `batch` lengths (None / 0: the full length)."""
    if buf is None or (type(buf) is int and buf == 0):
        return 0
    p = device_ptr(buf, name, batch * 4)
    if p % 4:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER, f"{name}: {p:#x} is not 4-byte aligned (int32)")
    if CHECKED:  # the caller asked for extents checked before launch: read the lengths (synchronizes)
        host = np.empty(batch, np.int32)
        driver.memcpy_dtoh(host.ctypes.data, p, batch * 4)
        check_lengths(host, name, seq)
    return p


def check_lengths(lengths, name, seq):
    """BAD_PARAM when a per-batch length is outside [0, seq] (PYDNN_CHECKED=1 mode; tests)."""
    for i, n in enumerate(np.asarray(lengths).tolist()):
        if not 0 <= n <= seq:
            raise PydnnError(E.PYDNN_STATUS_BAD_PARAM,
                             f"{name}[{i}]: length {n} is outside [0, {seq}] (the tensor's sequence dim)")


def _workspace(ws, ws_size, need):
    size = _int("workSpaceSizeInBytes", ws_size)
    if size < need:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM,
                         f"workSpaceSizeInBytes: {size} is less than the {need} bytes this call needs")
    if need == 0:
        return 0
    p = device_ptr(ws, "workSpace", need)
    if p % 16:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER, f"workSpace: {p:#x} is not 16-byte aligned")
    return p


def _params(a, pr, descs):
    p = AttnParams()
    for t, dsc in descs.items():
        if dsc is not None:
            for i in range(3):
                p.stride[t][i] = dsc.strides[i]
    p.batch, p.heads_q, p.heads_kv, p.group = pr.b, a.heads_q, a.heads_kv, a.heads_q // a.heads_kv
    p.seq_q, p.seq_kv = pr.sq, pr.skv
    p.mask = a.mask  # PYDNN_ATTN_MASK_* == PYDNN_ATTN_KMASK_*
    p.scale = a.scale
    p.scale_log2 = a.scale * LOG2E
    p.seed = a.seed
    p.drop_threshold = drop_threshold(a.dropout)
    p.drop_scale = 1.0 / (1.0 - a.dropout)
    p.splits = 1
    return p


def drop_threshold(prob):
    """Dropout's 16-bit threshold, round(p * 65536) (as pydnn/reference/dropout.py's threshold)."""
    return int(np.floor(float(prob) * 65536.0 + 0.5))


def _func(handle, kernel, pr, drop=False, atomic=False):
    unit, expr = unit_name(kernel, pr.d, pr.tag, drop), _expr(kernel, pr.tag, pr.d, _targs(kernel, pr.d, drop, atomic))
    smem = smem_bytes(kernel, pr.d, atomic)
    return handle.function(unit, expr, smem), smem


def _launch(handle, f, smem, grid, p):
    driver.launch(f, grid, (THREADS, 1, 1), smem, handle.cu_stream, p)


# ----------------------------------------------------------------------------- decode (split-KV)

class DecodePlan:
    """The split-KV decode forward of one problem: `splits` CTAs along the keys, each `split_len` keys
    (a multiple of DEC_N), `rblocks` blocks of 16 rows per K/V head, and the workspace it needs."""
    __slots__ = ("splits", "split_len", "rblocks", "ws", "rows")

    def __repr__(self):
        return f"DecodePlan(splits={self.splits}, split_len={self.split_len}, rblocks={self.rblocks}, ws={self.ws})"


def decode_ws(rows, splits, d):
    """Workspace bytes of `splits` partial results per query row: fp32 O (d per split), then lse (rounded
    up to 16 bytes); none for one split (the kernel writes O and lse itself)."""
    if splits <= 1:
        return 0
    return rows * splits * d * 4 + (rows * splits * 4 + 15) // 16 * 16


def takes_decode(a, sq):
    """Whether the forward of a call with sq query rows runs the decode kernels (tuning.attention.DECODE,
    sq <= DECODE_MAX_SQ, no dropout)."""
    t = tuning.attention
    return bool(t.DECODE) and sq <= t.DECODE_MAX_SQ and a.dropout == 0


def decode_plan(sm_count, b, hq, hkv, sq, skv, d, mask, ws_limit=None):
    """The split count (split_cost's cheapest over the candidates, each split at least DEC_MIN_TILES tiles of
    keys, at most DEC_MAX_SPLITS); tuning.attention.DECODE_SPLITS forces a count. The keys counted are
    those some row can see (causal top-left: the first sq). With ws_limit (the caller's workspace size) the
    largest count whose partials fit that size."""
    rows = b * hq * sq
    rblocks = cdiv((hq // hkv) * sq, DEC_ROWS)
    keys = min(skv, sq) if mask == E.PYDNN_ATTN_MASK_CAUSAL_TOP_LEFT else skv
    tiles = max(1, cdiv(keys, DEC_N))
    forced = tuning.attention.DECODE_SPLITS
    if forced:
        splits = max(1, min(int(forced), tiles, DEC_MAX_SPLITS))
    else:
        per_sm = max(1, min(2, (227 * 1024) // (smem_bytes("dec", d) + 1024)))
        splits = best_splits(b * hkv * rblocks, tiles, sm_count, per_sm, min(DEC_ROWS, (hq // hkv) * sq))
    if ws_limit is not None:
        while splits > 1 and decode_ws(rows, splits, d) > ws_limit:
            splits -= 1
    pl = DecodePlan()
    pl.split_len = cdiv(tiles, splits) * DEC_N
    pl.splits = max(1, cdiv(keys, pl.split_len))  # no empty split at the end
    pl.rblocks, pl.rows = rblocks, rows
    pl.ws = decode_ws(rows, pl.splits, d)
    return pl


DEC_SPLIT_OVH = 2.0    # a split's fixed cost in K/V tiles (pipeline fill, the warps' merge, its partials)


def split_cost(units, splits, tiles, sms, per_sm=2, rows_per_unit=DEC_ROWS):
    """Modelled time, in K/V tiles of one CTA running alone on an SM, of `units` (batch x K/V heads x row
    blocks) x `splits` CTAs on `sms` SMs holding `per_sm` CTAs each. Fitted to the H200's forced-split
    timings (tools/bench_attention.py --decode-splits, mid-session run of branch decode): one CTA (its
    two 32 KiB tiles in flight) streams at ~1/132 of the DRAM rate, so CTAs up to one per SM run at that
    cap, more share the bandwidth (time x CTAs / SMs), a wave past the resident slots waits for a whole
    CTA (a tail of r CTAs costs max(1, r / SMs) chunks: 288 CTAs on 264 places ran 1.37x the time of
    128), and a wave that puts two CTAs on some SMs and one on others costs
    tuning.attention.DECODE_IMBALANCE of a chunk more (160-192 CTAs measured ~10% over 128 or 256).
    A chunk is the split's tiles plus DEC_SPLIT_OVH plus the combine's traffic (its rows' fp32 partials
    written and read: 8 * D bytes a row against a tile's 256 * D)."""
    slots = sms * per_sm
    ctas = units * splits
    waves, tail = divmod(ctas, slots)
    w = cdiv(tiles, splits) + DEC_SPLIT_OVH + (0.0 if splits == 1 else rows_per_unit * 8 / 256.0)
    layers = waves * per_sm + (max(1.0, tail / sms) if tail else 0.0)
    pen = tuning.attention.DECODE_IMBALANCE * w if tail > sms and tail % sms else 0.0
    return w * layers + pen


_best = {}


def best_splits(units, tiles, sms, per_sm=2, rows_per_unit=DEC_ROWS):
    """The split count by split_cost for `units` CTAs' worth of rows over `tiles` K/V tiles each: the
    fewest splits within 3% of the cheapest (fewer partials to combine, one split none; the model is no
    closer than that: at b64 kv16k it put 1024 CTAs 0.4% ahead of 512, measured 0.6% behind), at
    most tiles // DEC_MIN_TILES, DEC_MAX_SPLITS, and 16 or enough for ~4 waves."""
    key = (units, tiles, sms, per_sm, rows_per_unit, tuning.attention.DECODE_IMBALANCE)
    s = _best.get(key)
    if s is None:
        top = max(1, min(tiles // DEC_MIN_TILES, DEC_MAX_SPLITS, max(16, cdiv(4 * sms * per_sm, units))))
        cost = {n: split_cost(units, n, tiles, sms, per_sm, rows_per_unit) for n in range(1, top + 1)}
        low = min(cost.values())
        s = min(n for n, c in cost.items() if c <= 1.03 * low)
        if len(_best) > 4096:
            _best.clear()
        _best[key] = s
    return s


class _DecRec:
    """A decode forward's launches kept per handle (key: _dec_key) for repeated calls: the params struct
    with everything but the pointers filled, its argument array, the launches, the workspace bytes needed
    and the partial lse's offset in it."""
    __slots__ = ("p", "argv", "launches", "ws", "lse_off", "stats")


def _dec_key(attn_desc, q_desc, k_desc, v_desc, o_desc, stats_desc, ws_size):
    """The handle's cache key of a decode forward call (everything its plan depends on but the pointers),
    or None (an argument a key cannot hold: the full path then raises what it should)."""
    t = tuning.attention
    if type(ws_size) is not int:
        return None
    try:
        return ("attention.dec", attn_desc, attn_desc.version, q_desc, q_desc.version, k_desc, k_desc.version,
                v_desc, v_desc.version, o_desc, o_desc.version, stats_desc,
                None if stats_desc is None else stats_desc.version, ws_size,
                t.DECODE, t.DECODE_MAX_SQ, t.DECODE_SPLITS, t.DECODE_IMBALANCE)
    except AttributeError:
        return None


def _dec_replay(handle, rec, q, k, v, o, stats, ws):
    """A repeated decode forward from its record: int pointers only, non-NULL and aligned as the full path
    checks them (16 bytes; stats 4), else False (the full path runs and raises where it should)."""
    for x in (q, k, v, o):
        if type(x) is not int or x <= 0 or x & 15:
            return False
    if rec.stats and (type(stats) is not int or stats <= 0 or stats & 3):
        return False
    p = rec.p
    if rec.ws:
        if type(ws) is not int or ws <= 0 or ws & 15:
            return False
        p.part_o, p.part_lse = ws, ws + rec.lse_off
    p.q, p.k, p.v, p.o = q, k, v, o
    p.lse = stats if rec.stats else None
    st, argv = handle.cu_stream, rec.argv
    for f, grid, smem in rec.launches:
        driver.launch_args(f, grid, _BLOCK, smem, st, argv)
    return True


_BLOCK = (THREADS, 1, 1)


def _decode_forward(handle, a, pr, p, ws, ws_size, key=None):
    """The decode forward (takes_decode said so): dec over (splits, K/V heads x row blocks, batch), then
    with more than one split dec_combine, one CTA per query row. With a key, the launches are kept on the
    handle for _dec_replay."""
    pl = decode_plan(handle.sm_count, pr.b, a.heads_q, a.heads_kv, pr.sq, pr.skv, pr.d, a.mask, ws_size)
    p.splits, p.split_len = pl.splits, pl.split_len
    lse_off = pl.rows * pl.splits * pr.d * 4
    if pl.ws:
        wp = _workspace(ws, ws_size, pl.ws)
        p.part_o, p.part_lse = wp, wp + lse_off
    f, smem = _func(handle, ("dec_paged_pipe" if tuning.attention.PAGED_DEC_PIPE else "dec_paged") if p.ptab_k
                    else "dec", pr)
    launches = [(f, (pl.splits, a.heads_kv * pl.rblocks, pr.b), smem)]
    if pl.splits > 1:
        fc, _ = _func(handle, "dec_combine", pr)
        launches.append((fc, (min(pl.rows, MAX_GRID_YZ), cdiv(pl.rows, MAX_GRID_YZ), 1), 0))
    rec = _DecRec()
    rec.p, rec.argv, rec.launches = p, driver.kernel_args(p), launches
    rec.ws, rec.lse_off, rec.stats = pl.ws, lse_off, bool(p.lse)
    for f, grid, smem in launches:
        driver.launch_args(f, grid, _BLOCK, smem, handle.cu_stream, rec.argv)
    if key is not None:
        handle.remember(key, rec)


# ----------------------------------------------------------------------------- calls

@api
def get_attention_forward_workspace_size(handle, attn_desc, q_desc, k_desc):
    """pydnnGetAttentionForwardWorkspaceSize: 0, except for the decode forward (sq <= DECODE_MAX_SQ rows,
    no dropout) split along the keys: its partial results, batch * numHeadsQ * seqQ * splits * (headDim + 1)
    * 4 bytes (decode_plan's split count for this handle's device)."""
    check_handle(handle)
    a = _set_desc(attn_desc)
    b, sq = _qkv(q_desc, "qDesc", a.heads_q, a.head_dim)
    _, skv = _qkv(k_desc, "kDesc", a.heads_kv, a.head_dim, q_desc.dtype)
    if a.head_dim not in HEAD_DIMS or not takes_decode(a, sq):
        return 0
    return decode_plan(handle.sm_count, b, a.heads_q, a.heads_kv, sq, skv, a.head_dim, a.mask).ws


@api
def get_attention_backward_workspace_size(handle, attn_desc, q_desc, k_desc):
    """pydnnGetAttentionBackwardWorkspaceSize: what either mode needs (the atomic one's: rowsum(dO * O)
    and an fp32 dQ accumulator, about 4 * (1 + D) bytes per query row; deterministic = 1 needs only the
    first 4 bytes per row, rounded up to 16)."""
    check_handle(handle)
    _set_desc(attn_desc)
    b, sq = _qkv(q_desc, "qDesc", attn_desc.heads_q, attn_desc.head_dim)
    _qkv(k_desc, "kDesc", attn_desc.heads_kv, attn_desc.head_dim, q_desc.dtype)
    return _ws_sizes(b, attn_desc.heads_q, sq, attn_desc.head_dim)[1]


@api
def attention_forward(handle, attn_desc, q_desc, q, k_desc, k, v_desc, v, o_desc, o, stats_desc, stats,
                      seq_lens_q, seq_lens_kv, work_space, work_space_size_in_bytes):
    """pydnnAttentionForward: O = softmax(scale Q K^T + mask) V and (statsDesc not NULL) the per-row
    log-sum-exp. Statuses: BAD_PARAM (descriptors, dims that disagree, numHeadsQ / headDim / dtype
    mismatches, overlapping outputs, a too-small workspace size), BAD_PARAM_NULL_POINTER,
    BAD_PARAM_MISALIGNED_POINTER (q, k, v, o not 16-byte aligned; stats not 4-byte; seqLens not 4-byte),
    NOT_SUPPORTED (head dim not 64 / 128, types other than half / bfloat16, a head dim that is not
    contiguous, strides not multiples of 8 elements). Kernel: on sm_90 without dropout the wgmma one
    (pydnn/ops/attention_wgmma.py, switch attention_wgmma.ENABLED), else mma.sync (ptx/attention.cu)."""
    key = None
    if (type(handle) is Handle and handle.alive and not _buffers.CHECKED
            and (seq_lens_q is None or (type(seq_lens_q) is int and seq_lens_q == 0))
            and (seq_lens_kv is None or (type(seq_lens_kv) is int and seq_lens_kv == 0))):
        # a repeated decode call: its record (one lookup, pointer checks, the launches); ~80 Python calls less
        key = _dec_key(attn_desc, q_desc, k_desc, v_desc, o_desc, stats_desc, work_space_size_in_bytes)
        rec = handle.prepared.get(key) if key is not None else None
        if rec is not None and _dec_replay(handle, rec, q, k, v, o, stats, work_space):
            return
    check_handle(handle)
    a = attn_desc
    pr = _validate(a, q_desc, k_desc, v_desc, o_desc, "oDesc", stats_desc, False)
    output_tensor(o_desc, "oDesc")
    if stats_desc is not None:
        output_tensor(stats_desc, "statsDesc")
    qp, kp, vp = _ptr16(q, "q", q_desc), _ptr16(k, "k", k_desc), _ptr16(v, "v", v_desc)
    op = _ptr16(o, "o", o_desc)
    lp = 0
    if stats_desc is not None:
        lp = device_ptr(stats, "stats", stats_desc.span_bytes())
        if lp % 4:
            raise PydnnError(E.PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER, f"stats: {lp:#x} is not 4-byte aligned")
    lq, lkv = _lens(seq_lens_q, "seqLensQ", pr.b, pr.sq), _lens(seq_lens_kv, "seqLensKV", pr.b, pr.skv)
    _workspace(work_space, work_space_size_in_bytes, 0)
    p = _params(a, pr, {T_Q: q_desc, T_K: k_desc, T_V: v_desc, T_O: o_desc, T_LSE: stats_desc})
    p.q, p.k, p.v, p.o, p.lse, p.lens_q, p.lens_kv = qp, kp, vp, op, lp or None, lq or None, lkv or None
    if takes_decode(a, pr.sq):
        _decode_forward(handle, a, pr, p, work_space, _int("workSpaceSizeInBytes", work_space_size_in_bytes),
                        key if lq == 0 and lkv == 0 else None)
        return
    if _wgmma_forward(handle, a, pr, p):
        return
    f, smem = _func(handle, "fwd", pr, a.dropout != 0)
    _launch(handle, f, smem, (cdiv(pr.sq, FWD_ROWS[pr.d]), a.heads_q, pr.b), p)


@api
def attention_backward(handle, attn_desc, q_desc, q, k_desc, k, v_desc, v, o_desc, o, d_o_desc, d_o, stats_desc,
                       stats, d_q_desc, d_q, d_k_desc, d_k, d_v_desc, d_v, seq_lens_q, seq_lens_kv, deterministic,
                       work_space, work_space_size_in_bytes):
    """pydnnAttentionBackward: dQ, dK, dV of O = attention(Q, K, V) given dO, the forward's O and stats.
    dK / dV sum over the query heads of each K/V head. Statuses as pydnnAttentionForward, plus BAD_PARAM
    for dO / dQ / dK / dV descriptors that do not match Q / K / V, a NULL statsDesc, and deterministic not
    0 or 1. On sm_90 without dropout the dK / dV kernel and the deterministic dQ pass are the wgmma ones
    (pydnn/ops/attention_wgmma_bwd.py); elsewhere, and with dropout, the mma.sync ones."""
    check_handle(handle)
    a = attn_desc
    pr = _validate(a, q_desc, k_desc, v_desc, o_desc, "oDesc", stats_desc, True)
    for dsc, name, ref, rname, heads in ((d_o_desc, "dODesc", q_desc, "qDesc", a.heads_q),
                                         (d_q_desc, "dQDesc", q_desc, "qDesc", a.heads_q),
                                         (d_k_desc, "dKDesc", k_desc, "kDesc", a.heads_kv),
                                         (d_v_desc, "dVDesc", v_desc, "vDesc", a.heads_kv)):
        _qkv(dsc, name, heads, a.head_dim, pr.dtype)
        same_shape(ref, rname, dsc, name)
    for dsc, name in ((d_q_desc, "dQDesc"), (d_k_desc, "dKDesc"), (d_v_desc, "dVDesc")):
        output_tensor(dsc, name)
    det = _int("deterministic", deterministic)
    if det not in (0, 1):
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"deterministic: {det} must be 0 or 1")
    ptrs = [_ptr16(buf, n, dsc) for buf, n, dsc in ((q, "q", q_desc), (k, "k", k_desc), (v, "v", v_desc),
                                                    (o, "o", o_desc), (d_o, "dO", d_o_desc), (d_q, "dQ", d_q_desc),
                                                    (d_k, "dK", d_k_desc), (d_v, "dV", d_v_desc))]
    lp = device_ptr(stats, "stats", stats_desc.span_bytes())
    if lp % 4:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER, f"stats: {lp:#x} is not 4-byte aligned")
    lq, lkv = _lens(seq_lens_q, "seqLensQ", pr.b, pr.sq), _lens(seq_lens_kv, "seqLensKV", pr.b, pr.skv)
    wp = _workspace(work_space, work_space_size_in_bytes, pr.ws[det == 0])
    drop = a.dropout != 0
    # dK / dV (and the atomic dQ share) on wgmma where it runs (attention_wgmma_bwd.usable), else mma.sync
    wg = _wgb.usable(handle, pr.d, pr.tag, a.dropout)
    ws256 = not wg and pr.d == 256 and handle.arch == _wsb.ARCH  # (attn: bwd_ws256 where usable says so)
    if not wg and not ws256:
        fkv, skv_smem = _func(handle, "bwd_dkdv", pr, drop, atomic=not det)
    p = _params(a, pr, {T_Q: q_desc, T_K: k_desc, T_V: v_desc, T_O: o_desc, T_DO: d_o_desc, T_DQ: d_q_desc,
                        T_DK: d_k_desc, T_DV: d_v_desc, T_LSE: stats_desc})
    p.q, p.k, p.v, p.o, p.dout, p.dq, p.dk, p.dv = ptrs
    p.lse, p.dsum, p.lens_q, p.lens_kv = lp, wp, lq or None, lkv or None
    p.dq_acc = None if det else wp + pr.ws[0]
    rows = pr.b * a.heads_q * pr.sq
    _launch_prep(handle, "bwd_pre_v", pr, rows, p)
    if wg:  # the warp-specialized dK / dV kernel where it takes the call (attention_ws_bwd.usable), else the older
        if not (_wsb.usable(handle, pr.d, pr.tag, a.dropout, p, not det)
                and _wsb.launch_dkdv(handle, pr.tag, pr.d, not det, pr.b, a.heads_kv, pr.skv, p)):
            _wgb.launch_dkdv(handle, pr.tag, pr.d, not det, pr.b, a.heads_kv, pr.skv, p)
    elif not (ws256 and _wsb.usable(handle, pr.d, pr.tag, a.dropout, p, not det)
              and _wsb.launch_dkdv(handle, pr.tag, pr.d, not det, pr.b, a.heads_kv, pr.skv, p)):
        if ws256:  # d 256 that bwd_ws256 does not take: the mma.sync kernel
            fkv, skv_smem = _func(handle, "bwd_dkdv", pr, drop, atomic=not det)
        _launch(handle, fkv, skv_smem, (cdiv(pr.skv, BWD_N) * DSPLIT[pr.d], a.heads_kv, pr.b), p)
    if det and wg:
        _wgb.launch_dq(handle, pr.tag, pr.d, pr.b, a.heads_q, pr.sq, p)
    elif det:  # dQ in its own pass: each element summed by one thread in a fixed order
        fq, sq_smem = _func(handle, "bwd_dq", pr, drop)
        _launch(handle, fq, sq_smem, (cdiv(pr.sq, BWD_M), a.heads_q, pr.b), p)
    else:
        _launch_prep(handle, "bwd_dq_convert_v", pr, rows, p)


def _wgmma_forward(handle, a, pr, p):
    """The Hopper forward when it takes the call (an sm_90 device, no dropout, tuning.attention.ENABLED):
    the warp-specialized one (pydnn/ops/attention_ws.py; d 128, tuning.attention.WS), else the older
    wgmma one (pydnn/ops/attention_wgmma.py). Returns whether it launched."""
    if WS.usable(handle, pr.d, a.dropout):
        WS.launch(handle, pr.tag, pr.d, pr.b, a.heads_q, pr.sq, pr.skv, a.heads_q // a.heads_kv, p)
        return True
    if not W.usable(handle, pr.d, a.dropout):
        return False
    W.launch(handle, pr.tag, pr.d, (a.heads_q, pr.b), pr.sq, p)
    return True


# ----------------------------------------------------------------------------- paged K / V (attnf)
#
# The paged-KV forward of inference servers, cuDNN 9's SDPA with paged_attention_k_table / _v_table /
# paged_attention_max_seq_len_kv: K and V are page pools ("containers") of dims (pages, numHeadsKV,
# pageSize, headDim), any strides with the head dim contiguous (HND and NHD pages alike); the page tables
# are INT32 tensors of dims (B, 1, maxPages, 1) (cuDNN's); key j < seqLensKV[b] of batch b is row
# j % pageSize of page table[b][j / pageSize]. maxSeqLenKV (0: maxPages * pageSize of the K table) is the
# key sequence's extent, at most what each table covers; seqLensKV is required (cuDNN's padding mask).
# Page ids are the caller's contract (PYDNN_CHECKED=1 reads the tables and checks the live ones). No
# dropout (inference). Kernels: up to tuning.attention.DECODE_MAX_SQ query rows, other archs, or
# PAGED_WS off: the split-KV decode kernel (dec, any page size); else on sm_90 the warp-specialized
# forward with paged loads (TMA boxes inside a page where the page size is a multiple of its K / V tile,
# else cp.async through the table).

# (C API: the attnf block of pydnn/capi/decl.py)


def _pool(desc, name, heads, d, dtype):
    """A K / V page pool: dims (pages, heads, pageSize, d), q's type, head dim contiguous, the other strides
    whole 16-byte units. Returns (pages, pageSize)."""
    check_tensor(desc, name)
    if desc.dtype != dtype:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{name}: data type {desc.dtype} differs from qDesc's {dtype}")
    if len(desc.dims) != 4:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM,
                         f"{name}: expected 4 dims (pages, heads, page size, head dim), got {len(desc.dims)}")
    pages, h, ps, dd = desc.dims
    if h != heads:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{name}: dims[1] = {h} heads, the descriptor says {heads}")
    if dd != d:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{name}: dims[3] = {dd}, the descriptor's headDim is {d}")
    if pages >= 2**31 or ps >= 2**31:
        raise PydnnError(E.PYDNN_STATUS_NOT_SUPPORTED, f"{name}: dims {desc.dims} exceed the kernels' limits "
                         "(pages and page size < 2^31)")
    if desc.strides[3] != 1:
        raise PydnnError(E.PYDNN_STATUS_NOT_SUPPORTED,
                         f"{name}: strides[3] = {desc.strides[3]}; the head dim must be contiguous (stride 1)")
    for i in (2, 1, 0):
        if desc.strides[i] % 8:
            raise PydnnError(E.PYDNN_STATUS_NOT_SUPPORTED,
                             f"{name}: strides[{i}] = {desc.strides[i]} is not a multiple of 8 elements "
                             "(16-byte rows are needed by the kernels' vector copies)")
    return pages, ps


def _page_table(desc, name, b):
    """A page table: INT32, dims (B, 1, maxPages, 1) (cuDNN's). Returns maxPages."""
    check_tensor(desc, name)
    if desc.dtype != E.PYDNN_DATA_INT32:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{name}: data type {desc.dtype}; page tables are INT32")
    if len(desc.dims) != 4 or desc.dims[0] != b or desc.dims[1] != 1 or desc.dims[3] != 1:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM,
                         f"{name}: dims {desc.dims} must be ({b}, 1, maxPages, 1) (batch, 1, pages a sequence, 1)")
    return desc.dims[2]


class _Paged:
    __slots__ = ("pr", "pages", "ps", "npk", "npv", "route")


def _validate_paged(handle, a, q_desc, k_desc, v_desc, tk_desc, tv_desc, max_seq_len_kv):
    """The shapes of a paged call (everything but the output, the pointers and the lengths)."""
    _set_desc(a)
    if a.head_dim not in HEAD_DIMS:
        raise PydnnError(E.PYDNN_STATUS_NOT_SUPPORTED,
                         f"attnDesc: headDim {a.head_dim} is not supported (fused attention has {HEAD_DIMS})")
    if a.dropout != 0:
        raise PydnnError(E.PYDNN_STATUS_NOT_SUPPORTED,
                         f"attnDesc: dropout {a.dropout} with paged K / V (an inference forward: set 0)")
    b, sq = _qkv(q_desc, "qDesc", a.heads_q, a.head_dim)
    pages, ps = _pool(k_desc, "kDesc", a.heads_kv, a.head_dim, q_desc.dtype)
    _pool(v_desc, "vDesc", a.heads_kv, a.head_dim, q_desc.dtype)
    same_shape(k_desc, "kDesc", v_desc, "vDesc")
    npk = _page_table(tk_desc, "pageTableKDesc", b)
    npv = _page_table(tv_desc, "pageTableVDesc", b) if tv_desc is not None else npk
    m = _int("maxSeqLenKV", max_seq_len_kv)
    if m == 0:
        m = npk * ps
    if not 0 < m < 2**31:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"maxSeqLenKV: {m} must be in [0, 2^31) (0: maxPages x pageSize)")
    for n, np_ in (("pageTableKDesc", npk), ("pageTableVDesc", npv)):
        if np_ * ps < m:
            raise PydnnError(E.PYDNN_STATUS_BAD_PARAM,
                             f"{n}: {np_} pages of {ps} keys cover {np_ * ps} keys, fewer than maxSeqLenKV = {m}")
    pg = _Paged()
    pr = _Problem()
    pr.b, pr.sq, pr.skv, pr.dtype, pr.d, pr.tag = b, sq, m, q_desc.dtype, a.head_dim, TAG[q_desc.dtype]
    pr.ws = (0, 0)
    pg.pr, pg.pages, pg.ps, pg.npk, pg.npv = pr, pages, ps, npk, npv
    t = tuning.attention
    ws = (t.PAGED_WS and WS.usable(handle, pr.d, 0) and pr.d in WS.HEAD_DIMS
          and not (t.DECODE and sq <= t.DECODE_MAX_SQ))
    pg.route = "ws" if ws else "dec"
    if not ws and a.heads_kv * cdiv((a.heads_q // a.heads_kv) * sq, DEC_ROWS) > MAX_GRID_YZ:
        raise PydnnError(E.PYDNN_STATUS_NOT_SUPPORTED,
                         f"qDesc: {sq} query rows x {a.heads_q} heads exceed the paged decode kernel's grid "
                         f"(numHeadsKV x row blocks of {DEC_ROWS} <= {MAX_GRID_YZ}) on this device / these switches")
    return pg


def check_pages(table, name, lengths, page_size, pages):
    """BAD_PARAM when a page id a live key reads (batch b's first ceil(len_b / pageSize)) is outside
    [0, pages) (PYDNN_CHECKED=1 mode; tests). table: (B, maxPages) ints."""
    for b, n in enumerate(np.asarray(lengths).tolist()):
        live = np.asarray(table[b][:cdiv(max(int(n), 0), page_size)])
        bad_ = np.nonzero((live < 0) | (live >= pages))[0]
        if bad_.size:
            j = int(bad_[0])
            raise PydnnError(E.PYDNN_STATUS_BAD_PARAM,
                             f"{name}[{b}][{j}]: page id {int(live[j])} is outside [0, {pages}) (a live key's page)")


def _table_ptr(buf, name, desc):
    p = device_ptr(buf, name, desc.span_bytes())
    if p % 4:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER, f"{name}: {p:#x} is not 4-byte aligned (int32)")
    return p


@api
def get_attention_forward_paged_workspace_size(handle, attn_desc, q_desc, k_desc, page_table_k_desc,
                                               max_seq_len_kv):
    """pydnnGetAttentionForwardPagedWorkspaceSize: the split-KV decode kernel's partial results where the
    paged call runs it (decode_plan's split count over maxSeqLenKV keys), else 0."""
    check_handle(handle)
    a = _set_desc(attn_desc)
    pg = _validate_paged(handle, a, q_desc, k_desc, k_desc, page_table_k_desc, None, max_seq_len_kv)
    if pg.route != "dec":
        return 0
    pr = pg.pr
    return decode_plan(handle.sm_count, pr.b, a.heads_q, a.heads_kv, pr.sq, pr.skv, pr.d, a.mask).ws


LAST_PAGED_ROUTE = None  # (tests: "dec" or "ws", the kernel the last paged call took)


@api
def attention_forward_paged(handle, attn_desc, q_desc, q, k_desc, k, v_desc, v, page_table_k_desc, page_table_k,
                            page_table_v_desc, page_table_v, max_seq_len_kv, o_desc, o, stats_desc, stats,
                            seq_lens_q, seq_lens_kv, work_space, work_space_size_in_bytes):
    """pydnnAttentionForwardPaged: attention_forward with K / V in page pools (kDesc / vDesc dims (pages,
    numHeadsKV, pageSize, headDim)) read through the INT32 page tables (B, 1, maxPages, 1). Statuses as
    attention_forward, plus BAD_PARAM for a page table that is not INT32 (B, 1, maxPages, 1), tables
    covering fewer than maxSeqLenKV keys, maxSeqLenKV negative, seqLensKV NULL, K and V pools that differ
    in dims; NOT_SUPPORTED for dropout. Under PYDNN_CHECKED=1 the lengths are checked against [0, S] and
    the live keys' page ids against [0, pages)."""
    global LAST_PAGED_ROUTE
    check_handle(handle)
    a = attn_desc
    pg = _validate_paged(handle, a, q_desc, k_desc, v_desc, page_table_k_desc, page_table_v_desc, max_seq_len_kv)
    pr = pg.pr
    _qkv(o_desc, "oDesc", a.heads_q, a.head_dim, pr.dtype)
    same_shape(q_desc, "qDesc", o_desc, "oDesc")
    output_tensor(o_desc, "oDesc")
    if stats_desc is not None:
        _stats(stats_desc, "statsDesc", pr.b, a.heads_q, pr.sq)
        output_tensor(stats_desc, "statsDesc")
    qp, kp, vp = _ptr16(q, "q", q_desc), _ptr16(k, "k", k_desc), _ptr16(v, "v", v_desc)
    op = _ptr16(o, "o", o_desc)
    tk = _table_ptr(page_table_k, "pageTableK", page_table_k_desc)
    tv = _table_ptr(page_table_v, "pageTableV", page_table_v_desc)
    lp = 0
    if stats_desc is not None:
        lp = device_ptr(stats, "stats", stats_desc.span_bytes())
        if lp % 4:
            raise PydnnError(E.PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER, f"stats: {lp:#x} is not 4-byte aligned")
    if seq_lens_kv is None or (type(seq_lens_kv) is int and seq_lens_kv == 0):
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM_NULL_POINTER,
                         "seqLensKV: NULL; paged K / V need each sequence's key length (cuDNN's padding mask)")
    lq, lkv = _lens(seq_lens_q, "seqLensQ", pr.b, pr.sq), _lens(seq_lens_kv, "seqLensKV", pr.b, pr.skv)
    if CHECKED:  # the live keys' page ids (reads the tables and the lengths: synchronizes)
        lens = np.empty(pr.b, np.int32)
        driver.memcpy_dtoh(lens.ctypes.data, lkv, pr.b * 4)
        for t, dsc, name in ((tk, page_table_k_desc, "pageTableK"), (tv, page_table_v_desc, "pageTableV")):
            n = dsc.span_bytes() // 4
            host = np.empty(n, np.int32)
            driver.memcpy_dtoh(host.ctypes.data, t, n * 4)
            sb, sp = dsc.strides[0], dsc.strides[2]
            tab = [[host[bi * sb + j * sp] for j in range(dsc.dims[2])] for bi in range(pr.b)]
            check_pages(tab, name, lens, pg.ps, pg.pages)
    p = _params(a, pr, {T_Q: q_desc, T_K: k_desc, T_V: v_desc, T_O: o_desc, T_LSE: stats_desc})
    p.q, p.k, p.v, p.o, p.lse, p.lens_q, p.lens_kv = qp, kp, vp, op, lp or None, lq or None, lkv
    p.ptab_k, p.ptab_v, p.page_size = tk, tv, pg.ps
    for i, dsc in enumerate((page_table_k_desc, page_table_v_desc)):
        p.ptab_stride[i][0], p.ptab_stride[i][1] = dsc.strides[0], dsc.strides[2]
    LAST_PAGED_ROUTE = pg.route
    size = _int("workSpaceSizeInBytes", work_space_size_in_bytes)
    _workspace(work_space, size, 0)
    if pg.route == "ws":
        WS.launch_paged(handle, pr.tag, pr.d, pr.b, a.heads_q, pr.sq, pr.skv, a.heads_q // a.heads_kv, p, pg.pages)
    else:
        _decode_forward(handle, a, pr, p, work_space, size)
