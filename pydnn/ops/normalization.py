"""Layer, group, instance and RMS normalization (pydnn extensions; kernels in ptx/normalization.cu).

cuDNN 9 has cudnnNormalizationForward* with other semantics (batch-norm-like, running statistics); these
calls are pydnn's own, in cuDNN's handle / descriptor style, named pydnn*Norm* so the two cannot be
confused:

    pydnnCreateNormDescriptor / pydnnSetNormDescriptor(kind, groups, normalizedDims, epsilon,
        activationDesc) / pydnnGetNormDescriptor / pydnnDestroyNormDescriptor
    pydnnDeriveNormParamDescriptors   the scale/bias and mean/invstd descriptors for an x
    pydnnNormForwardTraining          y = alpha * act(xhat * scale + bias) + beta * y, mean and invstd out
    pydnnNormForwardInference         the same y, statistics computed on the fly and not written
    pydnnGetNormBackwardWorkspaceSize / pydnnNormBackward   dx, dscale, dbias

Kinds (pydnnNormKind_t, a pydnn extension enum):
    LAYER     each set: the last `normalizedDims` dims of x (any dims before them index the sets);
              scale / bias have x's dims with 1 in front: (1, ..., 1, d[n-k], ..., d[n-1]).
    RMS       as LAYER, without the mean: xhat = x / sqrt(mean(x^2) + eps); bias optional.
    GROUP     x is (N, C, spatial...); each set: one sample's C / groups consecutive channels and all
              spatial positions; scale / bias per channel: (1, C, 1, ...).
    INSTANCE  GROUP with groups = C.
Statistics (mean, invstd = 1 / sqrt(biased variance + epsilon)) are float32 tensors of x's dims with the
normalized dims set to 1 (LAYER / RMS) or (N, groups, 1, ...) (GROUP; INSTANCE: (N, C, 1, ...)), any
strides. RMS writes and reads no mean (its pointer may be NULL). scale, bias, dscale and dbias are packed
float32 tensors. x, y, dy, dx: float, half or bfloat16 (float32 arithmetic); any strides (NCHW, NHWC,
gaps); x, y, dy, dx must have the same dims and type; y may be x, dx may be x or dy.

The fused activation (activationDesc, NULL for none) is copied when the norm descriptor is set: any
pydnnActivationMode_t (RELU, SIGMOID, TANH, CLIPPED_RELU, ELU, IDENTITY, SWISH, GELU_ERF, GELU_TANH), NaN
option ignored (NaN stays NaN except through ReLU's comparison). Backward takes its derivative at the
pre-activation z, recomputed from x, the saved statistics, scale and bias (so bias must be passed again).

Blending: y = alpha * out + beta * y, dx = alphaDataDiff * dx' + betaDataDiff * dx, dscale =
alphaParamDiff * dscale' + betaParamDiff * dscale (dbias likewise); beta == 0 never reads the output.

Backward workspace: dscale / dbias are sums over all sets; each block (or block subgroup; for the 16-bit
rows' `bwd_ring_cl`, each cluster of BWD_RING_PICK's CL blocks) writes its partial sums to the workspace and
a small `finish` kernel adds them in a fixed order.

Kernels (see _configs): the forward of contiguous layer / RMS rows without activation takes `fwd_rows` (G
threads per row, statistics exact from registers; see ROWS_*), in 16-bit `fwd_persist` with FWD_PERSIST
(persistent, scale / bias in registers, a register ring of rows; see FWD_PERSIST_*); otherwise `fwd` / `bwd`
when a set's elements form at most two levels in memory (a contiguous inner run, an outer stride: layer-norm
rows, NCHW groups, NHWC groups) and fit in registers (G threads per set, a power of two up to a block),
`fwd_cluster` / `bwd_cluster` (sm_90: a cluster of 8 blocks per set) for larger sets, `gen_fwd` / `gen_bwd`
for anything else (one block per set, three or two passes over memory). The backward's 16-byte-vector launches
take `bwd_staged` / `bwd_staged_cluster` (persistent, the next set's x and dy copied into shared memory with
cp.async while the current one is processed) when the set fits their 256-thread blocks; see STAGED_FWD /
STAGED_BWD. With BWD_ROWS (on) the backward of 16-bit contiguous layer / RMS rows without activation takes
`bwd_rows` (persistent, a register ring of DEPTH rows, one reduction per row; see BWD_ROWS_*), and with
BWD_RING (on) `bwd_ring`, the same with the ring in shared memory (see BWD_RING_*). Group / instance norm with
each group's channels contiguous at every position (NHWC) takes `gn_fwd` / `gn_bwd` on sm_90 (a cluster of 8
blocks per sample and GC groups, the tiles held in shared memory between the statistics and the output; see
GN_*); its forward takes `gn_reg_cl` first when a block's share fits (half of it in registers, half in the
threads' own shared-memory slots; see GN_REG*), each block pulling into L2 the x of the block PF_BYTES ahead
(NormParams.pf; fwd_rows has the same option, off). Group / instance norm on packed NCHW or packed NHWC
without activation, sets of GS_MIN_BYTES or more, where those NHWC tile kernels do not serve: the split
kernels (`gs_*`, unit normalization_gs.<dtype>, ptx/normalization_gs.cu; see GS_*): a one-kernel forward (a
block or a cluster of 8 per set or NHWC channel slab, two passes over x) and a backward of per-(n, c, chunk)
partials in the workspace, their sums, a table of dx's coefficients, and dx over the flat tensor.
"""
import ctypes
import math
import struct
import sys

from .. import enums as E
from .. import tuning
from .._build.manifest import KernelUnit
from .._build.params import FLAG_BETA, MAX_DIMS, kernel_params
from .._cuda import driver
from ..buffers import device_ptr
from .. import buffers as _buffers
from ..handle import Handle, check_handle
from ..status import PydnnError, api
from ..tensor import TensorDescriptor, _int, check_tensor, packed_strides
from . import activation as _activation
from .common import (
    TAG, cdiv, enum_arg, float_tensor, next_pow2, no_partial_alias, output_tensor, prod, same_shape, same_type,
    scalar,
)
from ._elementwise import CTYPE, _SIZES, vec_width
from . import _elementwise as _ew
from .._build import fastcall

__all__ = [
    "create_norm_descriptor", "set_norm_descriptor", "get_norm_descriptor", "destroy_norm_descriptor",
    "derive_norm_param_descriptors", "norm_forward_training", "norm_forward_inference",
    "get_norm_backward_workspace_size", "norm_backward",
]

KINDS = (E.PYDNN_NORM_KIND_LAYER, E.PYDNN_NORM_KIND_GROUP, E.PYDNN_NORM_KIND_INSTANCE, E.PYDNN_NORM_KIND_RMS)
LAYERLIKE = (E.PYDNN_NORM_KIND_LAYER, E.PYDNN_NORM_KIND_RMS)
DATA_TYPES = (E.PYDNN_DATA_FLOAT, E.PYDNN_DATA_HALF, E.PYDNN_DATA_BFLOAT16)
TAGS = ("f32", "f16", "bf16")
# pydnnActivationMode_t -> PYDNN_NORM_ACT_* in ptx/normalization_params.h
ACT_IDS = {E.PYDNN_ACTIVATION_IDENTITY: 0, E.PYDNN_ACTIVATION_RELU: 1, E.PYDNN_ACTIVATION_SIGMOID: 2,
           E.PYDNN_ACTIVATION_TANH: 3, E.PYDNN_ACTIVATION_CLIPPED_RELU: 4, E.PYDNN_ACTIVATION_ELU: 5,
           E.PYDNN_ACTIVATION_SWISH: 6, E.PYDNN_ACTIVATION_GELU_ERF: 7, E.PYDNN_ACTIVATION_GELU_TANH: 8}

FLAG_STATS, FLAG_RMS, FLAG_BETA2, FLAG_PREG, FLAG_PLANE, FLAG_STREAM, FLAG_WARPSTAT = 4, 8, 16, 32, 64, 128, 256
FLAG_WS16 = 512
FWD_ITEMS = {True: 4, False: 8}    # vectors (vector launch) or elements (scalar launch) per thread
BWD_ITEMS = {True: 2, False: 4}
FWD_MAX_BLOCK, BWD_MAX_BLOCK = 1024, 512   # the kernels' __launch_bounds__
MIN_BLOCK = 128
CLUSTER = 8                        # kCluster
BWD_THREADS_PER_SM = {True: 768, False: 1024}  # backward grid (persistent): threads per SM, by PREG (its slots are large)
SMEM_PARAMS_MAX = 160 * 1024       # backward without PREG: [2][nparams] floats in shared memory
GEN_THREADS = 256
# Which kernels serve the 16-byte-vector launches (tools/bench_normalization.py has the measurements):
# backward: the staged kernels (persistent, cp.async two-stage pipeline; 1.6x the register-tile backward on
# rows of 4096, H200); forward: the register-tile kernels, 1-3 points of copy bandwidth above the staged
# forward (STAGED_FWD = True compiles and selects it). Scalar launches always take the register-tile
# kernels, and sets too large for the staged blocks fall back to them.
# STAGED_FWD: a switch, pydnn.tuning.norm.STAGED_FWD (default False)
# STAGED_BWD: a switch, pydnn.tuning.norm.STAGED_BWD (default True)
# Forward of contiguous layer / RMS norm rows without activation (`fwd_rows`): G threads per row hold
# ITEMS 16-byte vectors of each of R rows; R > 1 keeps scale / bias in registers for the R rows. A third
# field ONE (16-bit layer norm): one-pass shifted statistics, one reduction per row instead of two (see
# fwd_rows in ptx/normalization.cu for the error bound); RMS ignores ONE.
# ROWS_CONFIGS: the (ITEMS, R, ONE) compiled per element size; ROWS_PICK: the one the planner takes; add a
# config here (and to ROWS_PICK) to try another, the tests and the bench's sweep take every compiled one.
# Why (4, 1): it beats every 512-thread config ((1, 2), (1, 4) in 16-bit, (2, 2), (2, 1) in fp32) by 14-39
# points of copy; with ONE it reaches 80.4% of copy on LN bf16 rows of 4096 (72.9% without), against
# 62.7% for the 256-thread (2, 1, ONE) and 79.2-81.9% for two rows per group (parameters read once for
# both), H200. The parameter reads (32 KiB of fp32 scale / bias from L1 per 8 KiB row) are most of LN's gap
# to RMS: LN bf16 without bias runs at 88.3% of copy against 82.1% with it (H200). tools/notes/normalization.md
# lists the configs measured and dropped.
# ROWS_FWD: a switch, pydnn.tuning.norm.ROWS_FWD (default True)
ROWS_CONFIGS = {2: ((4, 1, False), (4, 1, True)), 4: ((4, 1, False), (5, 1, False))}
ROWS_PICK = {"f32": (4, 1, False), "f16": (4, 1, True), "bf16": (4, 1, True)}
# ROWS_FIT: rows whose vectors fill G (a power of two) x 4 items poorly take ROWS_FIT_ITEMS items where that
# leaves fewer idle slots (G x items below ROWS_FIT_GAIN of the pick's): the sweep's forward points below 1.0x
# all ran about half their slots idle (H200, 2026-11-28 17:15): RMS fp16 rows of 4336 (542 vectors: G 256 x 4,
# 53% used; 5 items: G 128, 85%) 0.80x, RMS bf16 2296 (287: 56% -> 90%) 0.99x, LN fp16 9576 (1197: 58% ->
# 94%) 0.99x. fp32 takes fwd_rows<float, 4, 5> (56 registers); 16-bit rows go to fwd_rowx<T, 8, 5> instead (63
# registers, no spills; fwd_rows<T, 8, 5, 1, true> spilled 56 bytes at the 64-register cap, sm_90), where there
# are at least as many rows as SMs (fewer keep fwd_rows: fwd_rowx leaves those whole-vector rows to the cluster
# kernel). Measured (mid-session run 2, H200, tools/bench_memory_points.py, eager ms off / on, PyTorch in the same run):
# RMS fp16 199454 x 4336 1.279 / 1.140 (0.81 -> 0.90x), RMS bf16 22392 x 2296 0.0733 / 0.0713, LN bf16 8204 x 39856
# (fwd_rowx 8 -> 5 items) 0.689 / 0.638 (0.90 -> 0.97x), LN fp16 26676 x 9576 0.460 / 0.431 (0.99 -> 1.06x), RMS fp16
# 1587 x 38005 0.112 / 0.101. On.
# ROWS_FIT: a switch, pydnn.tuning.norm.ROWS_FIT (default True)
ROWS_FIT_ITEMS = 5
ROWS_FIT_GAIN = 0.85
# Backward of the same rows (`bwd_rows`): persistent, G threads per row, ITEMS vectors per thread, x / dy
# of DEPTH rows in registers (a ring: DEPTH - 1 rows of loads in flight while one is reduced).
# BWD_ROWS_CONFIGS: the (ITEMS, DEPTH) compiled per element size (none for fp32: its rows of 4096 need
# 4 vectors per thread, beyond the 128-register budget; the staged kernel keeps them); BWD_ROWS_PICK:
# the planner's. Blocks of at most 512 // ITEMS threads, 2 per SM (__launch_bounds__(512 / ITEMS, 2)).
# Why (2, 3): LN bf16 16384 x 4096 at 66.5% of copy, (2, 2) 64.6%, (1, 2) 56.9%, (1, 3) 53.0%, the staged
# kernel 44.3% (H200). Only the two fastest configs are compiled. BWD_RING supersedes it when on.
# BWD_ROWS: a switch, pydnn.tuning.norm.BWD_ROWS (default True)
BWD_ROWS_CONFIGS = {2: ((2, 3), (2, 2)), 4: ()}
BWD_ROWS_PICK = {"f16": (2, 3), "bf16": (2, 3)}
BWD_ROWS_BLOCKS_PER_SM = 2
# Backward of the same rows from a cp.async ring (`bwd_ring`): bwd_rows with x / dy of DEPTH rows in
# shared memory instead of registers. BWD_RING_CONFIGS: (ITEMS, DEPTH, CL) per element size; BWD_RING_PICK:
# the planner's. __launch_bounds__(256, 2): 128 registers (3 blocks per SM at 80 registers measured 55-58%
# of copy against 72-73%, H200). CL: clusters of CL blocks add their dscale / dbias partials through
# distributed shared memory before writing them (CL times fewer workspace slots for finish; bwd_ring_cl,
# sm_90; other archs take CL 1, whose (ITEMS, DEPTH, 1) config must stay compiled). Every CL writes the
# partials from shared memory in consecutive 16-byte vectors (with 4-byte stores 32 B apart across lanes
# CL 1 measured 72.3% of copy on LN against 83.2%, H200, two runs).
# Why (2, 4, 2), bf16 16384 x 4096 LN / RMS, H200: CL 2 84.6% / 85.4% of copy, CL 1 83.2% / 83.9%, CL 4
# 55.5% / 56.2% (clusters of 4 at 2 blocks per SM are not all resident at once); DEPTH 6 measured 68.7% /
# 72.0% against DEPTH 4's 70.5% / 74.4% and is not compiled.
# BWD_RING: a switch, pydnn.tuning.norm.BWD_RING (default True)
BWD_RING_CONFIGS = {2: ((2, 4, 1), (2, 4, 2)), 4: ()}
BWD_RING_PICK = {"f16": (2, 4, 2), "bf16": (2, 4, 2)}
BWD_RING_REGS = 128
BWD_RING_MAX_BLOCK = 256
# Forward of the same 16-bit rows in a persistent grid (`fwd_persist`): scale / bias loaded once per
# thread into registers (fwd_rows reads them from L1 for every row), x of DEPTH rows in a register ring.
# FWD_PERSIST_CONFIGS: (ITEMS, DEPTH, MINB) per element size (none for fp32: fwd_rows is at 91% there);
# __launch_bounds__(512 / ITEMS, MINB): blocks of at most 512 // ITEMS threads, the register cap
# 65536 / (512 / ITEMS * MINB), MINB blocks per SM (more when the rows are short and blocks smaller).
# Off: its best, (4, 2, 4), runs at 76.7% / 79.9% of copy on LN / RMS bf16 16384 x 4096 against fwd_rows'
# 81.1% / 90.4% (H200); (4, 2, 4) stays compiled for the tests and the bench's sweep.
# FWD_PERSIST: a switch, pydnn.tuning.norm.FWD_PERSIST (default False)
FWD_PERSIST_CONFIGS = {2: ((4, 2, 4),), 4: ()}
FWD_PERSIST_PICK = {"f16": (4, 2, 4), "bf16": (4, 2, 4)}
# Layer / RMS rows of any length (`fwd_rowx`, ptx/normalization_rowx.cuh): the contiguous rows without
# activation that fwd_rows does not take (a length that is not a multiple of the 16-byte vector, or rows of
# more than 4 vectors per thread of a 1024-thread block), read with 16-byte vectors in the row's aligned
# frame (row r starts (r * stride) mod VEC elements past a 16-byte boundary; the edge vectors' other
# elements masked, their stores element by element), the parameters read at the shifted positions. G
# threads per row, ITEMS vectors per thread: the smallest of ROWX_ITEMS whose G is at most ROWX_MAX_GROUP.
# Rows of whole vectors fewer than the SMs keep the 8-block cluster kernel (sm_90), which spreads a row
# over 8 SMs.
# Why: such rows took the scalar register-tile kernel (one 1024-thread block per row of 2-byte loads),
# the 8-block cluster kernel or gen, at 0.39-0.80x PyTorch in the issue-20 sweep (H200).
# ROWX: a switch, pydnn.tuning.norm.ROWX (default True)
ROWX_ITEMS = (4, 8)
ROWX_MAX_GROUP = 1024              # fwd_rowx's __launch_bounds__(1024)
# The backward of the rows whose length is not a multiple of the vector (`bwd_rowx`; whole-vector rows keep
# bwd_ring / bwd_rows / the staged and register-tile kernels): blocks of one alignment class (rows whose
# offset from a 16-byte boundary is the same, so that each thread keeps the same positions in every row),
# ROWX_BWD_ITEMS vectors of x and dy per thread in registers, the dscale / dbias partials in the threads'
# own shared-memory slots (block * ITEMS * 2 * VEC floats), a persistent grid evened out per class, rows of
# at most ROWX_BWD_MAX_BLOCK * ITEMS vectors (16K 16-bit / 8K fp32 elements; longer ones: gen).
ROWX_BWD_ITEMS = 4
ROWX_BWD_MAX_BLOCK = 512           # bwd_rowx's __launch_bounds__(512)
ROWX_BWD_REGS = 128
# Rows beyond one block (sm_90): fwd_rowx_cl, a cluster of ROWX_FWD_CL 1024-thread blocks of ROWX_ITEMS[-1]
# vectors per thread per row (fp32 rows up to 64K); bwd_rowx_cl, clusters of the smallest CL of ROWX_BWD_CL
# whose blocks hold the row (up to 64K elements); the statistics / row sums added over the cluster through
# distributed shared memory, one workspace slot per cluster.
ROWX_FWD_CL = 2
ROWX_BWD_CL = (2, 4, 8)
# ROWX_BWD_CL_BLOCK: bwd_rowx_cl's blocks are at most this many threads when a cluster of ROWX_BWD_CL holds
# the row so (else up to ROWX_BWD_MAX_BLOCK). Why 256: the H200 mid-session run (tools/bench_rows.py,
# 2026-11-28) had LN fp16 2402 x 34823 at 0.62x PyTorch (573 GB/s) on clusters of 4 blocks of 512 threads:
# one block per SM (127 registers, 128 KiB of partials), each cluster walking its rows with one row's loads
# in flight and none during the reduction / cluster barrier / stores; blocks of 256 in clusters of 8 put two
# blocks (two rows' phases) on each SM. Not yet measured: 512 is the previous choice.
# ROWX_BWD_CL_BLOCK: a switch, pydnn.tuning.norm.ROWX_BWD_CL_BLOCK (default 256)
# ROWX_BWD_WS16: bwd_rowx (no cluster) writes its dscale / dbias slot in order, 16-byte stores (PYDNN_NORM_FLAG_WS16),
# instead of one float at a time from each thread's positions (lanes 32 bytes apart: 8 partial writes per sector).
# Why: LN bf16 417 x 2770 spent 29.0 us in bwd_rowx against PyTorch's 5.6 us grad-input kernel (mid-session run 1,
# H200, tools/profile_memory_points.py): 420 slots of 2 x 2770 floats, 3.3M scalar stores. Measured (session 32
# mid-session run, H200, tools/bench_memory_points.py, eager ms off / on, PyTorch in the same run): LN bf16 417 x
# 2770 0.0359 / 0.0260 (0.93x -> 1.27x), RMS bf16 665 x 2277 0.0287 / 0.0189, LN fp32 21 x 1439 0.0212 / 0.0164
# (0.96x -> 1.29x), LN bf16 169308 x 166 0.1507 / 0.1379, RMS fp16 17244 x 4231 0.3355 / 0.3289; LN bf16 96 x 275,
# RMS bf16 81995 x 9188, LN fp32 486865 x 2015 unchanged (within 0.5%). On.
# ROWX_BWD_WS16: a switch, pydnn.tuning.norm.ROWX_BWD_WS16 (default True)
# Shared-memory staging of scale / bias for the row forward (fwd_sp, fwd_rows_sp) measured at or below
# fwd_rows and is not in the code (tools/notes/normalization.md).
# Kernels whose y / dx stores take the evict-first policy (st.global.cs, PYDNN_NORM_FLAG_STREAM): any of
# "fwd_rows", "fwd_persist", "bwd_ring", "gn_fwd", "gn_reg". Measured (H200): fwd_rows +3.5 points on RMS
# bf16 (90.4 -> 93.9% of copy), +5.7 on LN fp32 (91.4 -> 97.1%), +0.3 on LN bf16 ONE; bwd_ring +-0.1;
# gn_fwd -1.5; gn_reg (8, 4, 8) +0.5 (74.3 -> 74.8%).
# STREAM: a switch, pydnn.tuning.norm.STREAM (default {"fwd_rows", "gn_reg"})
# bwd_ring: a row's mean / invstd copied into the ring once per warp, not once per thread, when G >= 32.
# Measured (bf16 16384 x 4096, H200): LN backward 72.7% of copy against 68.8% without, RMS 73.8% / 72.6%.
# BWD_RING_WARPSTAT: a switch, pydnn.tuning.norm.BWD_RING_WARPSTAT (default True)
# finish's block: FINISH = (parameters, slot groups); see finish in the .cu. (32, 32): +1.5-1.7 points
# of copy over (32, 8) on LN / RMS bf16 backward, +1.1-1.3 on NHWC GN backward (H200); (8, 128) measured
# no better than (32, 32) and is not compiled.
# FINISH: a switch, pydnn.tuning.norm.FINISH (default (32, 32))
FINISH_SHAPES = ((32, 8), (32, 32))  # compiled
# Group norm with channels innermost (`gn_fwd` / `gn_bwd`; NHWC / channels_last): a cluster of 8 blocks
# per unit (one sample's GC consecutive groups over all positions), each block's tile of positions x
# GC * cg channels held in shared memory between the statistics and the output (x, and dy, read once).
# GN_TILE_MAX: the dynamic shared memory per block (the tiles of every operand); GC is the largest divisor
# of G whose tiles fit and whose units still number GN_FILL blocks per SM (else the smallest GC that fits:
# the most clusters). GN_THREADS: the block size (at most). Measured on the H200: 64 KiB and 256 threads
# are the best of the sweep for both directions; persistent clusters walking units with double-buffered
# tiles measured far slower (37% / 32% of copy against 65% / 56%) and are not in the code.
# GN_FWD: a switch, pydnn.tuning.norm.GN_FWD (default True)
GN_TILE_MAX = 64 * 1024
# GN_THREADS: a switch, pydnn.tuning.norm.GN_THREADS (default 256)
# GN_FILL: a switch, pydnn.tuning.norm.GN_FILL (default 2)
# GN_ONE: 16-bit gn_fwd with one-pass shifted statistics (one cluster reduction instead of two) and the
# tile copied in 4 commit groups, summed as each lands (see gn_fwd in the .cu for the error bound).
# GN_ONE: a switch, pydnn.tuning.norm.GN_ONE (default True)
# GN_BWD: a switch, pydnn.tuning.norm.GN_BWD (default True); gn_bwd: the backward on the same units (x and dy tiles: 2x the bytes)
# GN_REG (`gn_reg` / `gn_reg_cl`): the NHWC forward with each block's share of a unit held in registers
# (GN_REG_ITEMS 16-byte vectors per thread, 64 registers) and SI more vectors per thread in the thread's own
# slots of a shared-memory tile, instead of gn_fwd's all-shared-memory tile; a unit (one sample, GC groups, all
# positions) per cluster of CL blocks (CL 1: one block, no cluster, any arch). GN_REG_CONFIGS: the (CL, SI)
# compiled; GN_REG_PICK: (CL, GC, SI), GC lowered to the largest divisor of G whose channel vectors per position
# divide 32, CL 1 before sm_90 (if compiled with that SI); units whose block share needs more than
# GN_REG_MAX_BLOCK threads take gn_fwd. 16-bit: one-pass shifted statistics (ONE), fp32: two passes.
# Why (8, 4, 8), bf16 32 x 512 x 64 x 64, H200: 74.3% of copy, 74.8% with evict-first y stores ("gn_reg" in
# STREAM), (4, 4, 8) 72.7%, (4, 2, 8) 69.6%, (8, 2, 8) 65.3%, registers only (SI 0) 51-65% (not compiled),
# against gn_fwd's 72.6%.
# GN_REG: a switch, pydnn.tuning.norm.GN_REG (default True)
GN_REG_ITEMS = 8
GN_REG_CONFIGS = ((4, 8), (8, 8))
# GN_REG_PICK: a switch, pydnn.tuning.norm.GN_REG_PICK (default (8, 4, 8))
GN_REG_MAX_BLOCK = 1024
# L2 prefetch (NormParams.pf): block b of fwd_rows / gn_reg pulls into L2 (prefetch.global.L2) the x that
# block b + pf will read, pf = PF_BYTES[kernel] / the bytes of x one block reads (at least 1; 0 bytes: off). Why: a
# one-shot block's loads are in flight only until they land, so DRAM idles while the SM's blocks reduce and
# store (LN bf16 16384 x 4096 forward: 88.6% of copy in steady state, RMS 100%, H200). The distance is
# in bytes because what bounds it is: ahead by more than a memory latency's worth of the copy's traffic (~2 us
# x ~4 TB/s = 8 MB), and not so far that the prefetched lines leave L2 (50 MB) before their block reads them.
# gn_reg: on at 8 MiB, 84.1-84.2% of copy against 83.2-83.3% without on 32 x 512 x 64 x 64 bf16 NHWC (H100;
# 16 MiB falls to 77.1%: the lines leave L2 first). fwd_rows: off, every distance at or below its 94.7-95.0%
# without on LN bf16 16384 x 4096 (H100); 2 MiB gains 10-13% on 4096 x 4096 rows, not measured at enough
# sizes to pick a threshold. The sweep of distances: tools/notes/normalization.md.
# PF_BYTES: a switch, pydnn.tuning.norm.PF_BYTES (default {"fwd_rows": 0, "gn_reg": 8 << 20})
ROWS_MAX_GROUP = 1024              # fwd_rows' __launch_bounds__(1024 / R): blocks of at most this // R threads
STAGED_FWD_ITEMS = 4
STAGED_FWD_CLUSTER_MAX_BLOCK = 1024  # fwd_staged_cluster's __launch_bounds__
STAGED_BWD_ITEMS = {"f32": 4, "f16": 2, "bf16": 2}
STAGED_BWD_MAX_BLOCK = 256        # kStagedBwdThreads
STAGED_REGS = {False: 64, True: 128}  # register caps of fwd_staged (1024 threads) / bwd_staged (256 x 2)
SMEM_PER_SM = 228 * 1024
SMEM_PER_BLOCK_EXTRA = 2048       # static shared memory and the 1 KiB the hardware reserves per block
SMEM_BLOCK_MAX = 227 * 1024
MAX_GRID = 2**31 - 1
WS_ALIGN = 16


@kernel_params("normalization_params.h", "NormParams")
class NormParams(ctypes.Structure):
    _fields_ = [
        ("out", ctypes.c_void_p), ("x", ctypes.c_void_p), ("dy", ctypes.c_void_p),
        ("scale", ctypes.c_void_p), ("bias", ctypes.c_void_p), ("mean", ctypes.c_void_p),
        ("invstd", ctypes.c_void_p), ("ws", ctypes.c_void_p), ("dscale", ctypes.c_void_p),
        ("dbias", ctypes.c_void_p),
        ("alpha", ctypes.c_double), ("beta", ctypes.c_double), ("alpha2", ctypes.c_double),
        ("beta2", ctypes.c_double), ("eps", ctypes.c_double), ("coef", ctypes.c_double),
        ("coef2", ctypes.c_double),
        ("sets", ctypes.c_longlong), ("len", ctypes.c_longlong), ("nparams", ctypes.c_longlong),
        ("slots", ctypes.c_longlong),
        ("act", ctypes.c_int), ("flags", ctypes.c_uint), ("group", ctypes.c_int),
        ("set_ndim", ctypes.c_int), ("el_ndim", ctypes.c_int), ("pf", ctypes.c_int),
        ("set_size", ctypes.c_longlong * MAX_DIMS), ("set_stride", (ctypes.c_longlong * MAX_DIMS) * 4),
        ("set_pstride", ctypes.c_longlong * MAX_DIMS),
        ("el_size", ctypes.c_longlong * MAX_DIMS), ("el_stride", (ctypes.c_longlong * MAX_DIMS) * 3),
        ("el_pstride", ctypes.c_longlong * MAX_DIMS),
    ]


# ----------------------------------------------------------------------------- kernel variants

def _fwd_expr(tag, vec, cluster=False):
    name = "fwd_cluster" if cluster else "fwd"
    return f"pydnn::norm::{name}<{CTYPE[tag]}, {vec}, {FWD_ITEMS[vec > 1]}>"


def _bwd_expr(tag, vec, preg, cluster=False):
    name = "bwd_cluster" if cluster else "bwd"
    return f"pydnn::norm::{name}<{CTYPE[tag]}, {vec}, {BWD_ITEMS[vec > 1]}, {'true' if preg else 'false'}>"


def _staged_expr(tag, vec, backward, preg=False, cluster=False):
    name = ("bwd_staged" if backward else "fwd_staged") + ("_cluster" if cluster else "")
    if backward:
        return f"pydnn::norm::{name}<{CTYPE[tag]}, {vec}, {STAGED_BWD_ITEMS[tag]}, {'true' if preg else 'false'}>"
    return f"pydnn::norm::{name}<{CTYPE[tag]}, {vec}, {STAGED_FWD_ITEMS}>"


def _rows_expr(tag, vec, items, rows, one):
    return f"pydnn::norm::fwd_rows<{CTYPE[tag]}, {vec}, {items}, {rows}, {'true' if one else 'false'}>"


def _rowx_expr(tag, vec, items, cl=1):
    if cl > 1:
        return f"pydnn::norm::fwd_rowx_cl<{CTYPE[tag]}, {vec}, {items}, {cl}>"
    return f"pydnn::norm::fwd_rowx<{CTYPE[tag]}, {vec}, {items}>"


def _finish_rowx_expr(shape):
    return f"pydnn::norm::finish_rowx<{shape[0]}, {shape[1]}>"


def _rowx_bwd_expr(tag, vec, items, cl=1):
    if cl > 1:
        return f"pydnn::norm::bwd_rowx_cl<{CTYPE[tag]}, {vec}, {items}, {cl}>"
    return f"pydnn::norm::bwd_rowx<{CTYPE[tag]}, {vec}, {items}>"


def _bwd_ring_expr(tag, vec, items, depth, cl=1):
    if cl > 1:
        return f"pydnn::norm::bwd_ring_cl<{CTYPE[tag]}, {vec}, {items}, {depth}, {cl}>"
    return f"pydnn::norm::bwd_ring<{CTYPE[tag]}, {vec}, {items}, {depth}>"


def _bwd_rows_expr(tag, vec, items, depth):
    return f"pydnn::norm::bwd_rows<{CTYPE[tag]}, {vec}, {items}, {depth}>"


def _gn_expr(tag, vec, backward=False, one=False):
    if backward:
        return f"pydnn::norm::gn_bwd<{CTYPE[tag]}, {vec}>"
    return f"pydnn::norm::gn_fwd<{CTYPE[tag]}, {vec}, {'true' if one else 'false'}>"


def _gn_reg_expr(tag, vec, cl, si):
    one = "true" if _SIZES[tag] == 2 else "false"
    if cl > 1:
        return f"pydnn::norm::gn_reg_cl<{CTYPE[tag]}, {vec}, {GN_REG_ITEMS}, {si}, {cl}, {one}>"
    return f"pydnn::norm::gn_reg<{CTYPE[tag]}, {vec}, {GN_REG_ITEMS}, {si}, {one}>"


def _gen_expr(tag, backward):
    return f"pydnn::norm::{'gen_bwd' if backward else 'gen_fwd'}<{CTYPE[tag]}>"


def _persist_expr(tag, vec, items, depth, minb):
    return f"pydnn::norm::fwd_persist<{CTYPE[tag]}, {vec}, {items}, {depth}, {minb}>"


def _finish_expr(shape):
    return f"pydnn::norm::finish<{shape[0]}, {shape[1]}>"


ZERO_EXPR = "pydnn::norm::zero"


def _unit_exprs(tag):
    v = vec_width(tag, tag)
    exprs = [_fwd_expr(tag, v), _fwd_expr(tag, 1), _fwd_expr(tag, v, cluster=True)]
    exprs += [_rows_expr(tag, v, *c) for c in ROWS_CONFIGS[_SIZES[tag]]]
    exprs += [_persist_expr(tag, v, *c) for c in FWD_PERSIST_CONFIGS[_SIZES[tag]]]
    exprs += [_bwd_rows_expr(tag, v, *c) for c in BWD_ROWS_CONFIGS[_SIZES[tag]]]
    exprs += [_bwd_ring_expr(tag, v, *c) for c in BWD_RING_CONFIGS[_SIZES[tag]]]
    exprs += [_gn_expr(tag, v), _gn_expr(tag, v, backward=True)]
    exprs += [_gn_expr(tag, v, one=True)] if _SIZES[tag] == 2 else []  # (GN_ONE: 16-bit only)
    exprs += [_gn_reg_expr(tag, v, cl, si) for cl, si in GN_REG_CONFIGS]
    for preg in (True, False):
        exprs += [_bwd_expr(tag, v, preg), _bwd_expr(tag, 1, preg), _bwd_expr(tag, v, preg, cluster=True)]
    for c in (False, True):
        if tuning.norm.STAGED_FWD:
            exprs += [_staged_expr(tag, v, False, cluster=c)]
        if tuning.norm.STAGED_BWD:
            exprs += [_staged_expr(tag, v, True, preg, c) for preg in (True, False)]
    exprs += [_gen_expr(tag, False), _gen_expr(tag, True), ZERO_EXPR] + [_finish_expr(sh) for sh in FINISH_SHAPES]
    return tuple(exprs)


def _rowx_unit_exprs(tag):
    v = vec_width(tag, tag)
    return tuple([_rowx_expr(tag, v, i) for i in ROWX_ITEMS + (ROWS_FIT_ITEMS,)] +
                 [_rowx_expr(tag, v, ROWX_ITEMS[-1], ROWX_FWD_CL)] +
                 [_rowx_bwd_expr(tag, v, ROWX_BWD_ITEMS, cl) for cl in (1,) + ROWX_BWD_CL] +
                 [_finish_rowx_expr(FINISH_SHAPES[-1])] +
                 [_split_expr(k, tag, v) for k in SPLIT_KERNELS + XSPLIT_KERNELS])


def kernel_units():
    # normalization.rowx.<t>: the rowx kernels in a unit of their own (see ptx/normalization_rowx.cu; their
    # launches name it: _Launch.unit); normalization_gs.<t>: the group / instance norm split kernels
    return [KernelUnit(f"normalization.{t}", "normalization.cu", _unit_exprs(t)) for t in TAGS] + \
        [KernelUnit(f"normalization.rowx.{t}", "normalization_rowx.cu", _rowx_unit_exprs(t)) for t in TAGS] + \
        [KernelUnit(f"normalization_gs.{t}", "normalization_gs.cu", tuple(_gs_exprs(t))) for t in TAGS]


# ----------------------------------------------------------------------------- the descriptor

class NormDescriptor:
    """pydnnNormDescriptor_t: kind, groups, normalized dims, epsilon and a copy of the activation."""

    __slots__ = ("kind", "groups", "normalized_dims", "epsilon", "act_mode", "act_coef", "act_swish_beta",
                 "has_act", "is_set", "alive", "version")

    def __init__(self):
        self.kind, self.groups, self.normalized_dims, self.epsilon = E.PYDNN_NORM_KIND_LAYER, 1, 1, 1e-5
        self.act_mode, self.act_coef, self.act_swish_beta, self.has_act = E.PYDNN_ACTIVATION_IDENTITY, 0.0, 1.0, False
        self.is_set, self.alive, self.version = False, True, 0

    @property
    def act_id(self):
        return ACT_IDS[self.act_mode] if self.has_act else 0


def _live(desc, name="normDesc"):
    if type(desc) is not NormDescriptor or not desc.alive:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{name}: not a live norm descriptor")
    return desc


def _set(desc, name="normDesc"):
    _live(desc, name)
    if not desc.is_set:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{name}: descriptor was never set")
    return desc


@api
def create_norm_descriptor():
    """pydnnCreateNormDescriptor: a new norm descriptor, unset until set_norm_descriptor."""
    return NormDescriptor()


@api
def set_norm_descriptor(norm_desc, kind, groups, normalized_dims, epsilon, activation_desc):
    """pydnnSetNormDescriptor: kind (pydnnNormKind_t), groups (GROUP: >= 1, dividing C; other kinds:
    ignored), normalizedDims (LAYER / RMS: 1 to 8 trailing dims; others: ignored), epsilon (> 0,
    finite), activationDesc (None / NULL: no activation; its settings are copied now)."""
    _live(norm_desc)
    kind = enum_arg("kind", kind, KINDS, "pydnnNormKind_t")
    groups = _int("groups", groups)
    nd = _int("normalizedDims", normalized_dims)
    if kind == E.PYDNN_NORM_KIND_GROUP and groups < 1:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"groups: {groups} must be positive")
    if kind in LAYERLIKE and not 1 <= nd <= MAX_DIMS:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"normalizedDims: {nd} is outside [1, {MAX_DIMS}]")
    eps = scalar("epsilon", epsilon)
    if not eps > 0 or eps == float("inf"):
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"epsilon: {eps!r} must be positive and finite")
    act = None
    if activation_desc is not None:
        act = _activation._set(activation_desc)
        if act.mode not in ACT_IDS:
            raise PydnnError(E.PYDNN_STATUS_NOT_SUPPORTED, f"activationDesc: mode {act.mode} is not supported here")
    d = norm_desc
    d.kind, d.groups, d.normalized_dims, d.epsilon = kind, groups, nd, eps
    d.has_act = act is not None
    if act is not None:
        d.act_mode, d.act_coef, d.act_swish_beta = act.mode, act.coef, act.swish_beta
    d.is_set = True
    d.version += 1


@api
def get_norm_descriptor(norm_desc):
    """pydnnGetNormDescriptor -> (kind, groups, normalizedDims, epsilon)."""
    d = _set(norm_desc)
    return d.kind, d.groups, d.normalized_dims, d.epsilon


@api
def destroy_norm_descriptor(norm_desc):
    """pydnnDestroyNormDescriptor (None / NULL: nothing to do)."""
    if norm_desc is None:
        return
    _live(norm_desc).alive = False
    norm_desc.version += 1


# ----------------------------------------------------------------------------- shapes and validation

def _groups(nd, x):
    return x.dims[1] if nd.kind == E.PYDNN_NORM_KIND_INSTANCE else nd.groups


def _shapes(nd, x, x_name="xDesc"):
    """(parameter dims, statistics dims) for x, or BAD_PARAM naming what does not fit."""
    dims, nb = x.dims, len(x.dims)
    if nd.kind in LAYERLIKE:
        k = nd.normalized_dims
        if k > nb:
            raise PydnnError(E.PYDNN_STATUS_BAD_PARAM,
                             f"normDesc: normalizedDims {k} is more than {x_name}'s {nb} dims")
        return (1,) * (nb - k) + dims[nb - k:], dims[:nb - k] + (1,) * k
    if nb < 2:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{x_name}: group / instance norm needs N, C dims, got {nb} dims")
    c = dims[1]
    g = _groups(nd, x)
    if c % g:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"normDesc: groups {g} does not divide {x_name}'s C = {c}")
    return (1, c) + (1,) * (nb - 2), (dims[0], g) + (1,) * (nb - 2)


def _check_data(named, out_names):
    """x, y (dy, dx): float / half / bfloat16, the same dims and type; outputs without overlaps."""
    first, first_name = named[0]
    for desc, name in named:
        float_tensor(desc, name)
        if desc.dtype not in DATA_TYPES:
            raise PydnnError(E.PYDNN_STATUS_NOT_SUPPORTED,
                             f"{name}: data type {desc.dtype} is not supported here (float, half, bfloat16)")
    for desc, name in named[1:]:
        same_shape(first, first_name, desc, name)
        same_type(first, first_name, desc, name)
    for desc, name in named:
        if name in out_names:
            output_tensor(desc, name)


def _check_float32(desc, name, want):
    check_tensor(desc, name)
    if desc.dtype != E.PYDNN_DATA_FLOAT:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{name}: data type {desc.dtype} must be FLOAT (float32)")
    if desc.dims != want:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{name}: dims {desc.dims} must be {want}")


def _check_params_desc(desc, want, name="scaleBiasDesc"):
    _check_float32(desc, name, want)
    if any(s != p for s, p, d in zip(desc.strides, packed_strides(want, E.PYDNN_TENSOR_NCHW), want) if d > 1):
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{name}: strides {desc.strides} are not packed")


def _check_stats_desc(desc, want, name="meanInvstdDesc"):
    _check_float32(desc, name, want)
    output_tensor(desc, name)


# ----------------------------------------------------------------------------- planning


def _merge(dims):
    """Neighbours (outer, inner) merge when every stride and the parameter stride of the outer one is the
    inner's times its size. dims: [(size, strides tuple, pstride)], size-1 dims already dropped."""
    out = []
    for n, st, ps in dims:
        if out:
            n0, st0, ps0 = out[-1]
            if all(a == b * n for a, b in zip(st0, st)) and ps0 == ps * n:
                out[-1] = (n0 * n, st, ps)
                continue
        out.append((n, st, ps))
    return out


def _geometry(nd, x, out, dy, stats):
    """(set dims, element dims, sets, len, nparams): set dims [(size, (x, out, dy, stats) strides,
    pstride)] in descriptor order; element dims [(size, (x, out, dy) strides, pstride)] in x's memory
    order (outermost first), merged where dense."""
    dims, nb = x.dims, len(x.dims)
    ops = (x.strides, out.strides, (dy or x).strides)
    st = stats.strides if stats is not None else packed_strides(_shapes(nd, x)[1], E.PYDNN_TENSOR_NCHW)
    if nd.kind in LAYERLIKE:
        k = nd.normalized_dims
        lead = nb - k
        sets = [(dims[i], tuple(s[i] for s in ops) + (st[i],), 0) for i in range(lead)]
        pst = packed_strides(dims[lead:], E.PYDNN_TENSOR_NCHW)
        els = [(dims[i], tuple(s[i] for s in ops), pst[i - lead]) for i in range(lead, nb)]
        nparams = prod(dims[lead:])
    else:
        g = _groups(nd, x)
        cg = dims[1] // g
        sets = [(dims[0], tuple(s[0] for s in ops) + (st[0],), 0),
                (g, tuple(s[1] * cg for s in ops) + (st[1],), cg)]
        els = [(cg, tuple(s[1] for s in ops), 1)] + [(dims[i], tuple(s[i] for s in ops), 0) for i in range(2, nb)]
        nparams = dims[1]
    n_sets, length = prod(d[0] for d in sets), prod(d[0] for d in els)
    sets = _merge([d for d in sets if d[0] != 1]) or [(1, (0, 0, 0, 0), 0)]
    els = [d for d in els if d[0] != 1]
    els.sort(key=lambda d: -d[1][0])  # x's memory order, outermost first (stable: ties keep logical order)
    els = _merge(els) or [(1, (1, 1, 1), 0)]
    return sets, els, n_sets, length, nparams


def _fill(p, sets, els, n_sets, length, nparams):
    p.sets, p.len, p.nparams = n_sets, length, nparams
    p.set_ndim, p.el_ndim = len(sets), len(els)
    for d, (n, st, ps) in enumerate(sets):
        p.set_size[d] = n
        for k in range(4):
            p.set_stride[k][d] = st[k]
        p.set_pstride[d] = ps
    for d, (n, st, ps) in enumerate(els):
        p.el_size[d] = n
        for k in range(3):
            p.el_stride[k][d] = st[k]
        p.el_pstride[d] = ps


class _Launch:
    __slots__ = ("expr", "params", "argv", "grid", "block", "smem", "func", "desc", "unit")


class _Plan:
    """alternatives[0] when the pointers are 16-byte aligned (or the only one), else alternatives[-1];
    each alternative is the sequence of launches of one call."""

    __slots__ = ("alternatives", "vec_first", "workspace", "unit", "itemsize", "need", "rms", "kind", "crec",
                 "crec_obj", "crec_key")


def _new_launch(expr, params, grid, block, smem=0, desc=""):
    lc = _Launch()
    lc.expr, lc.params, lc.grid, lc.block, lc.smem, lc.desc = expr, params, grid, block, smem, desc
    lc.func = lc.unit = None  # unit None: the plan's (normalization.<dtype>)
    return lc


def _base_params(nd, sets, els, n_sets, length, nparams, backward):
    p = NormParams()
    _fill(p, sets, els, n_sets, length, nparams)
    p.eps, p.act = nd.epsilon, nd.act_id
    p.coef, p.coef2 = nd.act_coef, nd.act_swish_beta
    p.flags = FLAG_RMS if nd.kind == E.PYDNN_NORM_KIND_RMS else 0
    return p


def _inner(els, length):
    """(I, po, pi, outer strides) of a two-level layout (None if it is not one)."""
    if len(els) == 1:
        n, st, ps = els[0]
        if all(s == 1 for s in st):
            return length, 0, ps, (0, 0, 0)
        return 1, ps, 0, st  # one strided dim: inner runs of one element
    if len(els) == 2 and all(s == 1 for s in els[1][1]):
        return els[1][0], els[0][2], els[1][2], els[0][1]
    return None


def _fast_els(els, length):
    """Element dims as the fast kernels read them (el_ndim 1 contiguous, or 2 with a contiguous inner)."""
    inner, po, pi, os_ = _inner(els, length)
    if len(els) == 1 and inner == length:
        return els
    return [(length // inner, os_, po), (inner, (1, 1, 1), pi)]


def _vector_ok(sets, els, length, vec):
    inner, _, _, os_ = _inner(els, length)
    if inner % vec:
        return False
    if any(s % vec for s in os_):
        return False
    return all(s % vec == 0 for d in sets for s in d[1][:3])


def _threads(handle, nvec, items, max_block, vec, cluster_max_block=None):
    """(G, block, cluster) for sets of nvec vectors, or None when they do not fit."""
    g = next_pow2(max(1, cdiv(nvec, items)))
    if g <= max_block:
        return g, max(g, MIN_BLOCK), 1
    if vec > 1 and g <= CLUSTER * (cluster_max_block or max_block) and _arch_num(handle) >= 90:
        return g, g // CLUSTER, CLUSTER
    return None


def _arch_num(handle):
    try:
        return int(str(handle.arch).replace("sm_", "").rstrip("a"))
    except ValueError:
        return 0


def _grid(n_sets, block, g, cluster, cap_threads_per_sm, handle):
    spb = block // g if cluster == 1 else 1
    units = cdiv(n_sets, spb)  # blocks (cluster == 1) or clusters
    if cap_threads_per_sm:
        cap = max(1, handle.sm_count * max(1, cap_threads_per_sm // block) // cluster)
        units = min(units, cap)
    units = min(units, MAX_GRID // cluster)
    return units * cluster, spb


def _plane_ok(els, length, vec, g):
    inner, po, pi, _ = _inner(els, length)
    if pi != 1 or po != 0 or inner % vec:
        return False
    q = inner // vec
    return q & (q - 1) == 0 and g % q == 0


def _preg_ok(sets, els, length, nparams):
    if nparams != length or any(d[2] for d in sets):
        return False
    inner, po, pi, _ = _inner(els, length)
    return pi == 1 and (po == inner or length == inner)


def _resident(block, smem, regs):
    """Blocks of one kernel that fit on an SM at once (threads, registers at the kernel's cap, shared
    memory): the persistent grids are this many per SM."""
    return max(1, min(32, 2048 // block, 65536 // (regs * block), SMEM_PER_SM // (smem + SMEM_PER_BLOCK_EXTRA)))


def _persistent_grid(handle, n_sets, block, g, cluster, bpsm):
    """Resident blocks (or clusters), evened out so that each walks the same number of sets."""
    spb = block // g if cluster == 1 else 1
    want = cdiv(n_sets, spb)
    cap = min(max(1, handle.sm_count * bpsm // cluster), MAX_GRID // cluster)
    units = cdiv(want, cdiv(want, cap))
    return units * cluster, spb


def _fwd_staged_alt(handle, nd, tag, geo, vec):
    sets, els, n_sets, length, nparams = geo
    t = _threads(handle, length // vec, STAGED_FWD_ITEMS, FWD_MAX_BLOCK, vec, STAGED_FWD_CLUSTER_MAX_BLOCK)
    if t is None:
        return None
    g, block, cluster = t
    smem = 2 * STAGED_FWD_ITEMS * block * 16
    p = _base_params(nd, sets, _fast_els(els, length), n_sets, length, nparams, False)
    p.group = g
    grid, _ = _persistent_grid(handle, n_sets, block, g, cluster, _resident(block, smem, STAGED_REGS[False]))
    return [_new_launch(_staged_expr(tag, vec, False, cluster=cluster > 1), p, (grid, 1, 1), (block, 1, 1), smem,
                        desc=f"fwd vec={vec} G={g} block={block} cluster={cluster} staged grid={grid}")]


def _bwd_staged_alt(handle, nd, tag, geo, vec):
    sets, els, n_sets, length, nparams = geo
    t = _threads(handle, length // vec, STAGED_BWD_ITEMS[tag], STAGED_BWD_MAX_BLOCK, vec)
    if t is None:
        return None
    g, block, cluster = t
    preg = _preg_ok(sets, els, length, nparams)
    smem = (0 if preg else cdiv(2 * nparams * 4, 16) * 16) + 2 * 2 * STAGED_BWD_ITEMS[tag] * block * 16
    if smem > SMEM_BLOCK_MAX:
        return None
    p = _base_params(nd, sets, _fast_els(els, length), n_sets, length, nparams, True)
    p.group = g
    if preg:
        p.flags |= FLAG_PREG
    elif _plane_ok(els, length, vec, g):
        p.flags |= FLAG_PLANE
    grid, spb = _persistent_grid(handle, n_sets, block, g, cluster, _resident(block, smem, STAGED_REGS[True]))
    slots = (grid * spb if cluster == 1 else grid // cluster) if preg else grid
    bwd = _new_launch(_staged_expr(tag, vec, True, preg, cluster > 1), p, (grid, 1, 1), (block, 1, 1), smem,
                      desc=f"bwd vec={vec} G={g} block={block} cluster={cluster} preg={preg} "
                           f"plane={bool(p.flags & FLAG_PLANE)} staged grid={grid}")
    return [bwd, _finish_launch(nd, geo, slots)], slots * 2 * nparams * 4


def _rows_layout(nd, geo, vec):
    """Contiguous layer / RMS rows (one set dim, parameters 1:1 with the row) without activation."""
    sets, els, n_sets, length, nparams = geo
    if nd.kind not in LAYERLIKE or nd.act_id or len(sets) != 1 or sets[0][2] != 0:
        return False
    return len(els) == 1 and all(s == 1 for s in els[0][1]) and els[0][2] == 1 and length % vec == 0


def _rows_alt(handle, nd, tag, geo, vec, fit=True):
    """fwd_rows for contiguous layer / RMS rows without activation, or None. fit=False: ROWS_PICK's items only
    (the graph's fused-epilogue unit instantiates those; a ROWS_FIT launch of it would leave rows unwritten)."""
    sets, els, n_sets, length, nparams = geo
    if not _rows_layout(nd, geo, vec):
        return None
    items, rows, one = ROWS_PICK[tag]
    nv = length // vec
    if fit and tuning.norm.ROWS_FIT and rows == 1:
        def slots(i):  # (a row's group x items: its idle slots)
            return next_pow2(max(1, cdiv(nv, i))) * i
        if slots(ROWS_FIT_ITEMS) < ROWS_FIT_GAIN * slots(items):
            if (ROWS_FIT_ITEMS, rows, one) in ROWS_CONFIGS[_SIZES[tag]]:
                items = ROWS_FIT_ITEMS
            elif n_sets >= handle.sm_count and tuning.norm.ROWX:
                return None  # (fwd_rowx with ROWS_FIT_ITEMS items)
    g = next_pow2(max(1, cdiv(length // vec, items)))
    block = max(g, MIN_BLOCK)
    per_block = block // g * rows
    grid = cdiv(n_sets, per_block)
    if block > ROWS_MAX_GROUP // rows or grid > MAX_GRID or rows * max(abs(s) for s in sets[0][1][:2]) >= 2**31:
        return None
    p = _base_params(nd, sets, els, n_sets, length, nparams, False)
    p.group = g
    if "fwd_rows" in tuning.norm.STREAM:
        p.flags |= FLAG_STREAM
    p.pf = _pf_blocks("fwd_rows", per_block * length * _SIZES[tag], grid)
    return [_new_launch(_rows_expr(tag, vec, items, rows, one), p, (grid, 1, 1), (block, 1, 1),
                        desc=f"fwd_rows vec={vec} G={g} block={block} items={items} rows={rows} one={one} "
                             f"grid={grid}" + (f" pf={p.pf}" if p.pf else ""))]


def _rowx_layout(nd, geo, vec):
    """Contiguous layer / RMS rows without activation (any length) whose x and y row strides agree mod vec
    (every operand's row then starts at the same offset from a 16-byte boundary)."""
    sets, els, n_sets, length, nparams = geo
    if nd.kind not in LAYERLIKE or nd.act_id or len(sets) != 1 or sets[0][2] != 0 or vec < 4:
        return False
    if not (len(els) == 1 and all(s == 1 for s in els[0][1]) and els[0][2] == 1 and nparams == length):
        return False
    st = sets[0][1]
    return all(s >= 0 for s in st[:3]) and st[0] % vec == st[1] % vec == st[2] % vec


def _rowx_alt(handle, nd, tag, geo, vec):
    """fwd_rowx for contiguous layer / RMS rows without activation of any length, or None."""
    sets, els, n_sets, length, nparams = geo
    if not _rowx_layout(nd, geo, vec) or length >= 2**31 - 64:
        return None
    whole = sets[0][1][0] % vec == 0 and length % vec == 0
    if whole and n_sets < handle.sm_count and _arch_num(handle) >= 90:
        return None  # fewer long rows than SMs: the cluster kernel spreads each over 8 SMs
    nsv = length // vec if whole else cdiv(length + vec - 1, vec)
    cl = 1
    fit = [i for i in (ROWS_FIT_ITEMS,) if tuning.norm.ROWS_FIT and next_pow2(max(1, cdiv(nsv, i))) <= ROWX_MAX_GROUP]
    for items in ROWX_ITEMS:
        g = next_pow2(max(1, cdiv(nsv, items)))
        if g <= ROWX_MAX_GROUP:
            if fit and next_pow2(max(1, cdiv(nsv, fit[0]))) * fit[0] < ROWS_FIT_GAIN * g * items:
                items = fit[0]  # (ROWS_FIT: fewer idle slots)
                g = next_pow2(max(1, cdiv(nsv, items)))
            break
    else:
        items, cl = ROWX_ITEMS[-1], ROWX_FWD_CL
        g = max(MIN_BLOCK, next_pow2(max(1, cdiv(nsv, items * cl))))
        if g > ROWX_MAX_GROUP or _arch_num(handle) < 90:
            return None
    block = max(g, MIN_BLOCK)
    grid = cdiv(n_sets, block // g) * cl
    if grid > MAX_GRID:
        return None
    p = _base_params(nd, sets, els, n_sets, length, nparams, False)
    p.group = g
    if "fwd_rows" in tuning.norm.STREAM:
        p.flags |= FLAG_STREAM
    lc = _new_launch(_rowx_expr(tag, vec, items, cl), p, (grid, 1, 1), (block, 1, 1),
                     desc=f"fwd_rowx vec={vec} G={g} block={block} items={items} grid={grid}"
                          + (f" cl={cl}" if cl > 1 else ""))
    lc.unit = f"normalization.rowx.{tag}"
    return [lc]


def _pf_blocks(kernel, block_bytes, grid):
    """NormParams.pf for `kernel`: PF_BYTES[kernel] of x ahead, in blocks that read block_bytes each (0: off, or
    nothing that far ahead in this grid)."""
    want = tuning.norm.PF_BYTES.get(kernel, 0)
    if not want:
        return 0
    pf = max(1, round(want / max(1, block_bytes)))
    return pf if pf < grid else 0


def _persist_alt(handle, nd, tag, geo, vec):
    """fwd_persist for contiguous 16-bit layer / RMS rows without activation (rows that fit its blocks),
    or None."""
    if tag not in FWD_PERSIST_PICK or not _rows_layout(nd, geo, vec):
        return None
    sets, els, n_sets, length, nparams = geo
    items, depth, minb = FWD_PERSIST_PICK[tag]
    g = next_pow2(max(1, cdiv(length // vec, items)))
    block = max(g, MIN_BLOCK)
    if block > 512 // items:
        return None
    p = _base_params(nd, sets, els, n_sets, length, nparams, False)
    p.group = g
    if "fwd_persist" in tuning.norm.STREAM:
        p.flags |= FLAG_STREAM
    grid, spb = _persistent_grid(handle, n_sets, block, g, 1, _resident(block, 0, 65536 // (512 // items * minb)))
    return [_new_launch(_persist_expr(tag, vec, items, depth, minb), p, (grid, 1, 1), (block, 1, 1),
                        desc=f"fwd_persist vec={vec} G={g} block={block} items={items} depth={depth} minb={minb} "
                             f"grid={grid}")]


def _gn_layout(nd, geo, vec):
    """Group / instance norm with each group's cg channels contiguous (stride 1) at every position and
    consecutive groups adjacent (NHWC, channels_last): (N, sample strides, G, group strides, P, position
    strides, cg), strides as (x, out, dy, stats) / (x, out, dy); or None."""
    sets, els, n_sets, length, nparams = geo
    if nd.kind not in (E.PYDNN_NORM_KIND_GROUP, E.PYDNN_NORM_KIND_INSTANCE) or not els:
        return None
    cg, cst, cps = els[-1]
    if cst != (1, 1, 1) or cps != 1 or cg % vec:
        return None
    if len(els) == 1:
        P, pst = 1, (0, 0, 0)
    elif len(els) == 2 and els[0][2] == 0:
        P, pst = els[0][0], els[0][1]
    else:
        return None
    G = nparams // cg
    N_ = n_sets // G
    nst, gst = (0, 0, 0, 0), (cg, cg, cg, 0)
    for size, st, ps in sets:
        if ps == 0 and size == N_:
            nst = st
        elif ps == cg and size == G:
            gst = st
        elif size != 1:
            return None
    if any(s != cg for s in gst[:3]) or any(s % vec for s in nst[:3] + pst[:3]):
        return None
    return N_, nst, G, gst, P, pst, cg


def _gn_alt(handle, nd, tag, geo, vec, backward=False):
    """gn_fwd (or gn_bwd with its finish, and the workspace bytes) for NHWC group norm (sm_90
    clusters), or None. One unit per cluster: tiles of ppb positions x GC * cg channels of each operand
    (x; x and dy) in at most GN_TILE_MAX bytes of dynamic shared memory."""
    lay = _gn_layout(nd, geo, vec)
    if lay is None or _arch_num(handle) < 90:
        return None
    N_, nst, G, gst, P, pst, cg = lay
    ppb, es, nops = cdiv(P, CLUSTER), _SIZES[tag], 2 if backward else 1
    fits = [gc for gc in range(1, G + 1) if G % gc == 0 and 32 % (gc * cg // vec) == 0
            and nops * ppb * gc * cg * es <= GN_TILE_MAX]
    if not fits:
        return None
    full = [gc for gc in fits if N_ * (G // gc) * CLUSTER >= tuning.norm.GN_FILL * handle.sm_count]
    gc = max(full) if full else min(fits)
    smem = max(16, nops * ppb * gc * cg * es)
    block = min(tuning.norm.GN_THREADS, max(32, next_pow2(ppb * gc * cg // vec)))
    grid = N_ * (G // gc) * CLUSTER
    if grid > MAX_GRID:
        return None
    sets, els, n_sets, length, nparams = geo
    p = _base_params(nd, [(N_, nst, 0), (G, gst, cg)], [(P, pst, 0), (cg, (1, 1, 1), 1)], n_sets, length, nparams,
                     backward)
    p.group = gc
    name = "gn_bwd" if backward else "gn_fwd"
    if name in tuning.norm.STREAM:
        p.flags |= FLAG_STREAM
    one = tuning.norm.GN_ONE and not backward and es == 2
    lc = _new_launch(_gn_expr(tag, vec, backward, one), p, (grid, 1, 1), (block, 1, 1), smem,
                     desc=f"{name} vec={vec} GC={gc} block={block} tile={smem} grid={grid}" + (" one" if one else ""))
    if not backward:
        return [lc]
    slots = N_ * CLUSTER
    return [lc, _finish_launch(nd, geo, slots)], slots * 2 * nparams * 4


def _gn_reg_alt(handle, nd, tag, geo, vec):
    """gn_reg (CL 1) / gn_reg_cl for the NHWC forward when a block's share of a unit fits its registers, or
    None."""
    lay = _gn_layout(nd, geo, vec)
    if lay is None:
        return None
    N_, nst, G, gst, P, pst, cg = lay
    cl, gc_want, si = tuning.norm.GN_REG_PICK
    if cl > 1 and _arch_num(handle) < 90:
        cl = 1  # no clusters before sm_90: one block per unit, if its share fits
    fits = [gc for gc in range(1, min(G, gc_want) + 1) if G % gc == 0 and 32 % (gc * cg // vec) == 0]
    if not fits or (cl, si) not in GN_REG_CONFIGS:
        return None
    gc = max(fits)
    vpp = gc * cg // vec
    block = max(32, next_pow2(cdiv(cdiv(P, cl), GN_REG_ITEMS + si) * vpp))
    grid = N_ * (G // gc) * cl
    smem = si * block * 16
    if block > GN_REG_MAX_BLOCK or grid > MAX_GRID or smem > SMEM_BLOCK_MAX:
        return None
    sets, els, n_sets, length, nparams = geo
    p = _base_params(nd, [(N_, nst, 0), (G, gst, cg)], [(P, pst, 0), (cg, (1, 1, 1), 1)], n_sets, length, nparams,
                     False)
    p.group = gc
    if "gn_reg" in tuning.norm.STREAM:
        p.flags |= FLAG_STREAM
    p.pf = _pf_blocks("gn_reg", cdiv(P, cl) * gc * cg * _SIZES[tag], grid)
    return [_new_launch(_gn_reg_expr(tag, vec, cl, si), p, (grid, 1, 1), (block, 1, 1), smem,
                        desc=f"gn_reg vec={vec} GC={gc} CL={cl} block={block} items={GN_REG_ITEMS}+{si} grid={grid}"
                             + (f" pf={p.pf}" if p.pf else ""))]


# Group / instance norm split kernels (`gs_*`, ptx/normalization_gs.cuh): packed NCHW or packed NHWC x / y (dy /
# dx), no activation. Why: the register-tile kernels give one block (or one cluster of 8) per set, need 16-byte
# runs (odd H * W or C fell to scalar loads or gen, one block walking a whole set three times) and cap the set
# at 8 x 1024 threads' registers; the sweep (tools/sweep_memory.py, H200) had group / instance norm at 0.01x
# PyTorch on large odd planes. Forward: gsp_fwd (sets that are one contiguous run: NCHW, NHWC with G == 1) and
# gsc_fwd (NHWC: a unit is one sample's slab of W channels = whole groups, all positions), one block per unit
# or, with fewer than GS_CLUSTER_UNITS_PER_SM units per SM (sm_90), a cluster of 8 blocks per unit; two passes
# over x (the second in reverse, from L2 where it can), no workspace. Backward: gsp_bpart / gsc_bpart write per
# (n, c, chunk) partial sums to the workspace, gs_bred adds the chunks, gs_bset makes per (n, c) the table of
# dx's coefficients and dscale / dbias, gs_bapply writes dx over the flat tensor: x and dy read twice.
GS_FLAG_NHWC = 512
GS_THREADS = 512                  # kGsThreads
GS_BP_THREADS = 256               # kGsBpThreads
GS_CLUSTER_UNITS_PER_SM = 2       # gsp_fwd / gsc_fwd: clusters of 8 when units < this x SMs
GS_SLAB_BYTES = 256               # gsc_fwd: the narrowest channel slab (bytes of a row) that units may take
GS_SMEM_MAX = 160 * 1024
GS_FWD_CVEC = 4                   # gsc_fwd: channel vectors of at most 4 elements (8 in 16-bit spilled at 64 registers)
GS_BP_WARPS_PER_SM = 64           # gsp_bpart: chunks (warps) per SM wanted
GS_BP_MIN_CHUNK = 2048            # gsp_bpart: elements per chunk at least (planes shorter: one chunk)
GS_BC_BLOCKS_PER_SM = 4           # gsc_bpart: blocks per SM wanted


def _gs_fwd_expr(tag, vec, kind, cl):
    return f"pydnn::norm_gs::{kind}_fwd{'_cl' if cl > 1 else ''}<{CTYPE[tag]}, {vec}>"


def _gs_exprs(tag):
    v = vec_width(tag, tag)
    ex = [_gs_fwd_expr(tag, v, "gsp", 1), _gs_fwd_expr(tag, v, "gsp", 8)]
    for w in (min(v, GS_FWD_CVEC), 2, 1):
        ex += [_gs_fwd_expr(tag, w, "gsc", 1), _gs_fwd_expr(tag, w, "gsc", 8)]
    if tag == "f32":
        ex += [_gs_fwd_expr(tag, v, "gsf", 1), _gs_fwd_expr(tag, v, "gsf", 8)]
    for w in (v, 2, 1):
        ex += [f"pydnn::norm_gs::gsc_bpart<{CTYPE[tag]}, {w}>"]
    return ex + [f"pydnn::norm_gs::gsp_bpart<{CTYPE[tag]}, {v}>", f"pydnn::norm_gs::gs_bapply<{CTYPE[tag]}, {v}>",
                 "pydnn::norm_gs::gs_bred", "pydnn::norm_gs::gs_bset"]


def _gs_cvec(C, v):
    """The channel-vector width of gsc_fwd / gsc_bpart: v (at most 16 bytes) when C allows, else 2 elements,
    else 1."""
    return v if C % v == 0 else 2 if C % 2 == 0 else 1


def _packed_as(desc, fmt):
    want = packed_strides(desc.dims, fmt)
    return all(a == b for a, b, d in zip(desc.strides, want, desc.dims) if d > 1)


def _gs_layout(nd, x, others):
    """(nhwc, N, C, S) when x and the others are all packed NCHW or all packed NHWC, else None."""
    if nd.kind not in (E.PYDNN_NORM_KIND_GROUP, E.PYDNN_NORM_KIND_INSTANCE) or nd.act_id or len(x.dims) < 3:
        return None
    descs = [x] + [d for d in others if d is not None]
    for fmt in (E.PYDNN_TENSOR_NCHW, E.PYDNN_TENSOR_NHWC):
        if all(_packed_as(d, fmt) for d in descs):
            return fmt == E.PYDNN_TENSOR_NHWC, x.dims[0], x.dims[1], prod(x.dims[2:])
    return None


def _gs_params(nd, N, C, S, G, nhwc, stats_strides):
    p = NormParams()
    p.sets, p.len, p.nparams = N * G, C // G * S, C
    p.eps = nd.epsilon
    p.set_size[0], p.set_size[1], p.set_size[2], p.set_size[3] = N, C, S, G
    p.set_stride[3][0], p.set_stride[3][1] = stats_strides
    p.flags = GS_FLAG_NHWC if nhwc else 0
    return p


def _gs_stats_strides(nd, x, stats):
    st = stats.strides if stats is not None else packed_strides(_shapes(nd, x)[1], E.PYDNN_TENSOR_NCHW)
    return st[0], st[1]


def _gs_fwd_alt(handle, nd, tag, x, out, stats):
    """[gsp_fwd / gsc_fwd launch] or None (float data: only with tuning.norm.GS_FWD_F32, see there)."""
    if tag == "f32" and not tuning.norm.GS_FWD_F32:
        return None
    lay = _gs_layout(nd, x, (out,))
    if lay is None:
        return None
    nhwc, N, C, S = lay
    G = _groups(nd, x)
    cg, es, v = C // G, _SIZES[tag], vec_width(tag, tag)
    if cg * S * es < tuning.norm.GS_MIN_BYTES or N * C * S >= 2**62:
        return None
    sm90 = _arch_num(handle) >= 90
    p = _gs_params(nd, N, C, S, G, nhwc, _gs_stats_strides(nd, x, stats))
    if not nhwc or G == 1:
        units = N * G
        cl = CLUSTER if sm90 and units < GS_CLUSTER_UNITS_PER_SM * handle.sm_count else 1
        nvec = cdiv(cg * S, v)
        block = min(GS_THREADS, max(128, next_pow2(cdiv(nvec, cl * 8))))
        smem = 8 * cg
        if smem > GS_SMEM_MAX or units * cl > MAX_GRID:
            return None
        return [_new_launch(_gs_fwd_expr(tag, v, "gsp", cl), p, (units * cl, 1, 1), (block, 1, 1), smem,
                            desc=f"gsp_fwd vec={v} cl={cl} block={block} sets={units}")]
    vec = _gs_cvec(C, min(v, GS_FWD_CVEC))
    if vec < min(v, GS_FWD_CVEC) and tuning.norm.GS_FLAT and tag == "f32":  # (16-bit: gsf_fwd<., 8> spills
        # 20 / 52 bytes, gsf_fwd_cl 36 / 100 at 64 registers, sm_90; not measured: gsc_fwd keeps them)
        flat = _gsf_launch(handle, tag, p, N, C, S, G, v, sm90)
        if flat is not None:
            return [flat]
    slabs = [gc * cg for gc in range(1, G + 1) if G % gc == 0 and (gc * cg) % vec == 0 and gc * cg // vec <= GS_THREADS]
    if not slabs:
        return None
    wide = [w for w in slabs if w * es >= GS_SLAB_BYTES]
    W = min(wide) if wide else max(slabs)
    units = N * (C // W)
    cl = CLUSTER if sm90 and units < GS_CLUSTER_UNITS_PER_SM * handle.sm_count else 1
    ncv = W // vec
    rows = max(1, GS_THREADS // ncv)
    block = cdiv(rows * ncv, 32) * 32
    ns = 3 if tag == "f32" else 2  # the kernel's sums per channel (float: sum x as well, see gs_stats in the .cu)
    smem = 4 * (ns * rows * ncv * vec + (ns + 1) * (W // cg) + 2 * W)
    if smem > GS_SMEM_MAX or units * cl > MAX_GRID:
        return None
    p.el_size[0] = W
    return [_new_launch(_gs_fwd_expr(tag, vec, "gsc", cl), p, (units * cl, 1, 1), (block, 1, 1), smem,
                        desc=f"gsc_fwd vec={vec} cl={cl} block={block} W={W} units={units}")]


# gsf_fwd (gsc_fwd_body<..., FLAT>): NHWC whose C takes no full channel vector (odd C: gsc_fwd's 1- or 2-element
# loads): a unit is one sample walked in super-rows of P = lcm(C, v) elements (KR = P / C rows; S a multiple
# of KR), each thread a fixed position of v elements (their channels j mod C), 16-byte loads. Why: in_fwd_train
# NHWC 38x495x212x212 fp32 ran at 30.7% of copy on gsc_fwd's 1-element loads (1.69x PyTorch; H200 mid-session
# run, 2026-11-28). GS_FLAT: a switch, pydnn.tuning.norm.GS_FLAT.
def _gsf_launch(handle, tag, p, N, C, S, G, v, sm90):
    g = math.gcd(C, v)
    P, KR = C * v // g, v // g
    slots = P // v
    if slots > GS_THREADS or S % KR:
        return None
    rows = max(1, GS_THREADS // slots)
    block = cdiv(rows * slots, 32) * 32
    ns = 3 if tag == "f32" else 2
    smem = 4 * (ns * rows * slots * v + (ns + 1) * G + 2 * C)
    units = N
    cl = CLUSTER if sm90 and units < GS_CLUSTER_UNITS_PER_SM * handle.sm_count else 1
    if smem > GS_SMEM_MAX or units * cl > MAX_GRID:
        return None
    p.el_size[0] = P
    return _new_launch(_gs_fwd_expr(tag, v, "gsf", cl), p, (units * cl, 1, 1), (block, 1, 1), smem,
                       desc=f"gsf_fwd vec={v} cl={cl} block={block} P={P} units={units}")


def _gs_bwd_alt(handle, nd, tag, x, dx, dy, stats):
    """([gs*_bpart, gs_bred, gs_bset, gs_bapply], workspace bytes) or None."""
    lay = _gs_layout(nd, x, (dx, dy))
    if lay is None:
        return None
    nhwc, N, C, S = lay
    G = _groups(nd, x)
    cg, es, v = C // G, _SIZES[tag], vec_width(tag, tag)
    if cg * S * es < tuning.norm.GS_MIN_BYTES or N * C * S >= 2**62:
        return None
    p = _gs_params(nd, N, C, S, G, nhwc, _gs_stats_strides(nd, x, stats))
    sm = handle.sm_count
    if not nhwc:
        planes = N * C
        k = max(1, min(cdiv(S, GS_BP_MIN_CHUNK), cdiv(GS_BP_WARPS_PER_SM * sm, planes)))
        ch = cdiv(cdiv(S, k), v) * v
        k = cdiv(S, ch)
        wpb = GS_BP_THREADS // 32
        grid = cdiv(planes * k, wpb)
        part = (f"pydnn::norm_gs::gsp_bpart<{CTYPE[tag]}, {v}>", grid, 0, f"gsp_bpart vec={v} K={k} chunk={ch}")
    else:
        vec = _gs_cvec(C, v)
        ncv = C // vec
        ncvb = min(ncv, GS_BP_THREADS)
        rows = GS_BP_THREADS // ncvb
        k = max(1, min(cdiv(GS_BC_BLOCKS_PER_SM * sm, N), cdiv(S, 4 * rows)))
        ch = cdiv(S, k)
        k = cdiv(S, ch)
        grid = N * k
        smem = 4 * 2 * rows * ncvb * vec
        part = (f"pydnn::norm_gs::gsc_bpart<{CTYPE[tag]}, {vec}>", grid, smem, f"gsc_bpart vec={vec} K={k} rows={ch}")
    if grid > MAX_GRID:
        return None
    U, NC = N * C * k, N * C
    tab = 2 * U + 2 * NC
    ws = 4 * (tab + 4 * NC) + 16  # (gs_table: the table 16-byte aligned from there)
    p.el_size[1], p.el_size[3], p.el_size[4] = k, ch, tab
    nsb = cdiv(N * G, GS_BP_THREADS // 32)
    p.el_size[2] = nsb
    nv = N * C * S // v
    launches = [
        _new_launch(part[0], p, (part[1], 1, 1), (GS_BP_THREADS, 1, 1), part[2], desc=part[3]),
        _new_launch("pydnn::norm_gs::gs_bred", p, (max(1, min(cdiv(NC, GS_BP_THREADS), 65535)), 1, 1),
                    (GS_BP_THREADS, 1, 1), desc="gs_bred"),
        _new_launch("pydnn::norm_gs::gs_bset", p, (nsb + cdiv(C, 32), 1, 1), (GS_BP_THREADS, 1, 1), desc="gs_bset"),
        _new_launch(f"pydnn::norm_gs::gs_bapply<{CTYPE[tag]}, {v}>", p,
                    (max(1, min(cdiv(nv, 2 * GS_BP_THREADS), MAX_GRID)), 1, 1), (GS_BP_THREADS, 1, 1),
                    desc=f"gs_bapply vec={v}"),
    ]
    return launches, ws


def _gs_plan(handle, nd, tag, x, out, dy, stats, backward):
    if not tuning.norm.GS:
        return None
    if backward:
        r = _gs_bwd_alt(handle, nd, tag, x, out, dy, stats)
    else:
        r = _gs_fwd_alt(handle, nd, tag, x, out, stats)
        r = None if r is None else (r, 0)
    if r is not None:
        for lc in r[0]:
            lc.unit = f"normalization_gs.{tag}"
    return r


def _first_alt(tries, *args):
    """The first of the (switched on, planner) pairs whose planner accepts the problem, or None. The
    switches are read at each call: tests and benchmarks flip them."""
    for on, alt in tries:
        if on:
            r = alt(*args)
            if r is not None:
                return r
    return None


def _gn_bwd_alt(handle, nd, tag, geo, vec):
    return _gn_alt(handle, nd, tag, geo, vec, backward=True)


def _fwd_alt(handle, nd, tag, geo, vec):
    if vec > 1:
        r = _first_alt(((tuning.norm.GN_REG, _gn_reg_alt), (tuning.norm.GN_FWD, _gn_alt), (tuning.norm.FWD_PERSIST, _persist_alt), (tuning.norm.ROWS_FWD, _rows_alt),
                        (tuning.norm.ROWX, _rowx_alt),
                        (tuning.norm.STAGED_FWD, _fwd_staged_alt)), handle, nd, tag, geo, vec)
        if r is not None:
            return r
    sets, els, n_sets, length, nparams = geo
    t = _threads(handle, length // vec, FWD_ITEMS[vec > 1], FWD_MAX_BLOCK, vec)
    if t is None:
        return None
    g, block, cluster = t
    p = _base_params(nd, sets, _fast_els(els, length), n_sets, length, nparams, False)
    p.group = g
    grid, _ = _grid(n_sets, block, g, cluster, 0, handle)
    return [_new_launch(_fwd_expr(tag, vec, cluster > 1), p, (grid, 1, 1), (block, 1, 1),
                        desc=f"fwd vec={vec} G={g} block={block} cluster={cluster}")]


def _finish_launch(nd, geo, slots):
    sets, els, n_sets, length, nparams = geo
    p = _base_params(nd, sets, els, n_sets, length, nparams, True)
    p.slots = slots
    grid = max(1, min(cdiv(nparams, tuning.norm.FINISH[0]), 65535))
    return _new_launch(_finish_expr(tuning.norm.FINISH), p, (grid, 1, 1), (tuning.norm.FINISH[0], tuning.norm.FINISH[1], 1), desc=f"finish slots={slots}")


def _finish_rowx_launch(nd, geo, slots):
    """finish's launch over `slots` partial slots, from its copy in the rowx unit (one unit to load for the rowx
    backward forms: bwd_rowx, the split and xsplit backwards)."""
    fin = _finish_launch(nd, geo, slots)
    fin.expr = _finish_rowx_expr(FINISH_SHAPES[-1])
    fin.block = (FINISH_SHAPES[-1][0], FINISH_SHAPES[-1][1], 1)
    fin.grid = (max(1, min(cdiv(geo[4], FINISH_SHAPES[-1][0]), 65535)), 1, 1)
    return fin


def _bwd_rows_alt(handle, nd, tag, geo, vec):
    """([bwd_rows, finish], workspace bytes) for contiguous layer / RMS rows without activation, or None."""
    sets, els, n_sets, length, nparams = geo
    if tag not in BWD_ROWS_PICK or not _rows_layout(nd, geo, vec):
        return None
    items, depth = BWD_ROWS_PICK[tag]
    g = next_pow2(max(1, cdiv(length // vec, items)))
    block = max(g, MIN_BLOCK)
    if block > 512 // items:
        return None
    p = _base_params(nd, sets, els, n_sets, length, nparams, True)
    p.group = g
    p.flags |= FLAG_PREG  # (the kernel's only mode: each thread owns its parameters in every row)
    grid, spb = _persistent_grid(handle, n_sets, block, g, 1, BWD_ROWS_BLOCKS_PER_SM)
    slots = grid * spb
    bwd = _new_launch(_bwd_rows_expr(tag, vec, items, depth), p, (grid, 1, 1), (block, 1, 1),
                      desc=f"bwd_rows vec={vec} G={g} block={block} items={items} depth={depth} grid={grid}")
    return [bwd, _finish_launch(nd, geo, slots)], slots * 2 * nparams * 4


def _bwd_ring_alt(handle, nd, tag, geo, vec):
    """([bwd_ring, finish], workspace bytes) for contiguous 16-bit layer / RMS rows without activation."""
    sets, els, n_sets, length, nparams = geo
    if tag not in BWD_RING_PICK or not _rows_layout(nd, geo, vec):
        return None
    items, depth, cl = BWD_RING_PICK[tag]
    g = next_pow2(max(1, cdiv(length // vec, items)))
    block = max(g, MIN_BLOCK)
    if block > BWD_RING_MAX_BLOCK:
        return None
    smem = depth * 2 * (items * 16 + 4) * block  # x / dy slots, then mean / invstd
    if cl > 1 and _arch_num(handle) < 90:
        cl = 1  # (clusters: sm_90)
    if (block // g) * 2 * nparams * 4 > smem:  # the partials pass through the ring (they fit at DEPTH >= 2)
        return None
    p = _base_params(nd, sets, els, n_sets, length, nparams, True)
    p.group = g
    p.flags |= FLAG_PREG  # (the kernel's only mode: each thread owns its parameters in every row)
    if "bwd_ring" in tuning.norm.STREAM:
        p.flags |= FLAG_STREAM
    if tuning.norm.BWD_RING_WARPSTAT and g >= 32:  # (a warp must lie in one row's group)
        p.flags |= FLAG_WARPSTAT
    bpsm = _resident(block, smem, BWD_RING_REGS)
    spb = block // g
    want = cdiv(cdiv(n_sets, spb), cl)  # clusters (of one block when cl == 1), evened out as _persistent_grid
    cap = min(max(1, handle.sm_count * bpsm // cl), MAX_GRID // cl)
    units = cdiv(want, cdiv(want, cap))
    grid, slots = units * cl, units * spb
    bwd = _new_launch(_bwd_ring_expr(tag, vec, items, depth, cl), p, (grid, 1, 1), (block, 1, 1), smem,
                      desc=f"bwd_ring vec={vec} G={g} block={block} items={items} depth={depth} grid={grid}"
                           + (f" cl={cl}" if cl > 1 else ""))
    return [bwd, _finish_launch(nd, geo, slots)], slots * 2 * nparams * 4


def _bwd_alt(handle, nd, tag, geo, vec):
    """[bwd, finish] and the workspace bytes, or None."""
    if vec > 1:  # else, or when none of these serves, the register-tile kernel (larger sets per cluster)
        r = _first_alt(((tuning.norm.GN_BWD, _gn_bwd_alt), (tuning.norm.BWD_RING, _bwd_ring_alt), (tuning.norm.BWD_ROWS, _bwd_rows_alt),
                        (tuning.norm.STAGED_BWD, _bwd_staged_alt)), handle, nd, tag, geo, vec)
        if r is not None:
            return r
    sets, els, n_sets, length, nparams = geo
    t = _threads(handle, length // vec, BWD_ITEMS[vec > 1], BWD_MAX_BLOCK, vec)
    if t is None:
        return None
    g, block, cluster = t
    preg = _preg_ok(sets, els, length, nparams)
    smem = 0 if preg else 2 * nparams * 4
    if smem > SMEM_PARAMS_MAX:
        return None
    fels = _fast_els(els, length)
    p = _base_params(nd, sets, fels, n_sets, length, nparams, True)
    p.group = g
    if preg:
        p.flags |= FLAG_PREG
    elif _plane_ok(els, length, vec, g):
        p.flags |= FLAG_PLANE
    grid, spb = _grid(n_sets, block, g, cluster, BWD_THREADS_PER_SM[preg], handle)
    slots = (grid * spb if cluster == 1 else grid // cluster) if preg else grid
    bwd = _new_launch(_bwd_expr(tag, vec, preg, cluster > 1), p, (grid, 1, 1), (block, 1, 1), smem,
                      desc=f"bwd vec={vec} G={g} block={block} cluster={cluster} preg={preg} "
                           f"plane={bool(p.flags & FLAG_PLANE)} grid={grid}")
    return [bwd, _finish_launch(nd, geo, slots)], slots * 2 * nparams * 4


def _gen_alt(handle, nd, tag, geo, backward):
    sets, els, n_sets, length, nparams = geo
    p = _base_params(nd, sets, els, n_sets, length, nparams, backward)
    grid = max(1, min(n_sets, MAX_GRID))
    main = _new_launch(_gen_expr(tag, backward), p, (grid, 1, 1), (GEN_THREADS, 1, 1), desc="gen")
    if not backward:
        return [main], 0
    z = _base_params(nd, sets, els, n_sets, length, nparams, True)
    zero = _new_launch(ZERO_EXPR, z, (max(1, min(cdiv(2 * nparams, 256), 1024)), 1, 1), (256, 1, 1), desc="zero")
    return [zero, main, _finish_launch(nd, geo, 1)], 2 * nparams * 4


def _rowx_only_ok(nd, geo, vec, backward):
    """Rows whose vector launch only the rowx kernels serve (their length is not a multiple of vec)."""
    return tuning.norm.ROWX and _rowx_layout(nd, geo, vec)


def _rowx_bwd_only(handle, nd, tag, geo, vec):
    """([bwd_rowx, finish], workspace bytes) for contiguous layer / RMS rows without activation of any
    length (the backward's vector launch when the rows are not whole vectors), or None."""
    sets, els, n_sets, length, nparams = geo
    if not tuning.norm.ROWX or not _rowx_layout(nd, geo, vec) or length >= 2**31 - 64:
        return None
    sx = sets[0][1][0]
    nsv = length // vec if sx % vec == 0 and length % vec == 0 else cdiv(length + vec - 1, vec)
    items, cl = ROWX_BWD_ITEMS, 1
    g = next_pow2(max(1, cdiv(nsv, items)))
    if g > ROWX_BWD_MAX_BLOCK:
        if _arch_num(handle) < 90:
            return None
        cap = tuning.norm.ROWX_BWD_CL_BLOCK  # (the largest cluster block that keeps 2 blocks per SM)
        cl = next((c for c in ROWX_BWD_CL if cdiv(nsv, items * c) <= cap), 0) or \
            next((c for c in ROWX_BWD_CL if cdiv(nsv, items * c) <= ROWX_BWD_MAX_BLOCK), 0)
        if not cl:
            return None
        g = max(MIN_BLOCK, next_pow2(cdiv(nsv, items * cl)))
    block = max(g, MIN_BLOCK)
    spb = block // g
    smem = block * items * 2 * vec * 4  # the dscale / dbias partials, per thread
    if smem > SMEM_BLOCK_MAX:
        return None
    period = vec // math.gcd(sx % vec, vec)  # rows per alignment class cycle (gcd(0, vec) = vec: 1)
    bpsm = _resident(block, smem, ROWX_BWD_REGS)
    # blocks (clusters) per class: each group at least ROWX_BWD_ROWS rows of its class (fewer dscale / dbias
    # slots for finish to read: a block per row wrote 8 bytes a parameter per row, 4x a bf16 row's bytes)
    want = max(1, cdiv(cdiv(n_sets, period), spb * max(1, tuning.norm.ROWX_BWD_ROWS)))
    cap = min(max(1, handle.sm_count * bpsm // (period * cl)), MAX_GRID // (period * cl))
    per = cdiv(want, cdiv(want, cap))
    grid, slots = per * period * cl, per * period * spb
    p = _base_params(nd, sets, els, n_sets, length, nparams, True)
    p.group, p.pf = g, period
    if cl == 1 and tuning.norm.ROWX_BWD_WS16:
        p.flags |= FLAG_WS16
    bwd = _new_launch(_rowx_bwd_expr(tag, vec, items, cl), p, (grid, 1, 1), (block, 1, 1), smem,
                      desc=f"bwd_rowx vec={vec} G={g} block={block} items={items} period={period} grid={grid}"
                           + (f" cl={cl}" if cl > 1 else ""))
    fin = _finish_rowx_launch(nd, geo, slots)
    bwd.unit = fin.unit = f"normalization.rowx.{tag}"
    return [bwd, fin], slots * 2 * nparams * 4


# Whole-vector layer / RMS rows that the whole-vector backward kernels serve only with the 8-block cluster
# register-tile kernel, or not at all: bwd_rowx / bwd_rowx_cl (rows up to 64K elements) instead. Not at all:
# the planner fell to gen (one block a row, scalar: RMS fp32 1 x 56616 at 0.42x PyTorch, 220 us for 226 KB);
# bwd_rowx_cl: 29.0 us, 4.04x (H200 mid-session run, tools/sweep_memory.py). The cluster kernel's rows
# (ROWX_BWD_LONG): to bwd_rowx when it holds the row in one block (no cluster) and the rows are at least the
# SMs: RMS fp32 5315 x 8192 0.403 ms (0.73x) -> 0.224 ms (1.31x); not where bwd_rowx needs a cluster itself:
# LN fp32 3673 x 8552 0.403 -> 0.421 ms on bwd_rowx_cl (4 blocks), and fewer rows than SMs keep the cluster
# kernel, which spreads each over 8 SMs (same run).
# Long whole-vector layer / RMS rows, many of them (BWD_SPLIT): where the one-pass backward takes an 8-block
# cluster per row (bwd_staged_cluster / bwd_cluster) and the rows are at least the SMs, the
# split backward (ptx/normalization_rowx.cu: bwd_split_dx, a block per row reading x and dy twice, then
# bwd_split_params, dscale / dbias per row chunk, then finish_rowx), PyTorch's shape: 5 n bytes, every pass
# at full occupancy. Why: LN fp32 3673 x 8552 ran 0.403-0.421 ms on the cluster kernels (21.5% of copy for
# 3 n; a cluster walks its rows one at a time, 7.5 us a row) against PyTorch's 0.229 ms (H200, 2026-11-28).
# Predicted: ~0.16 ms (5 n at 85% of copy). Measured (mid-session runs 2 and 3, H200, same run each): LN fp32
# 3673 x 8552 0.4072 / 0.4095 ms (staged cluster, 0.559x PyTorch) -> 0.1870 / 0.1869 ms (1.22x, 2017 GB/s on 3 n;
# the register-tile cluster kernel 0.546 ms); RMS fp32 1024 x 16384 0.1715 -> 0.1123 ms (0.70x -> 1.35x); RMS bf16
# 1478 x 32768 0.3621 -> 0.1789 ms (0.55x -> 1.12x, BWD_SPLIT_16). On.
# BWD_SPLIT: a switch, pydnn.tuning.norm.BWD_SPLIT (default True)
# BWD_SPLIT_16: a switch, pydnn.tuning.norm.BWD_SPLIT_16 (default True; False: 16-bit rows keep the cluster kernels)
SPLIT_KERNELS = ("bwd_split_dx", "bwd_split_params")
SPLIT_PARAMS_THREADS = 256  # kSplitParamsThreads
SPLIT_DX_VECS = 8           # vectors of a row per bwd_split_dx thread (block: 128 .. 1024 threads)
SPLIT_BLOCKS_PER_SM = 8     # bwd_split_params: blocks aimed at per SM (row chunks x vector tiles)


def _split_expr(kernel, tag, vec):
    return f"pydnn::norm::{kernel}<{CTYPE[tag]}, {vec}>"


def _split_use(handle, nd, tag, geo, vec, r):
    """Whether the whole-vector rows' backward should take the split kernels instead of `r`."""
    if (not tuning.norm.BWD_SPLIT or (tag != "f32" and not tuning.norm.BWD_SPLIT_16) or vec <= 1
            or not _rows_layout(nd, geo, vec) or geo[2] < handle.sm_count):
        return False
    if geo[2] > MAX_GRID or geo[3] >= 2**31:
        return False
    return r is None or "cluster=8" in r[0][0].desc  # (the 8-block cluster kernels; not bwd_ring_cl's pairs)


def _split_alt(handle, nd, tag, geo, vec):
    """([bwd_split_dx, bwd_split_params, finish_rowx], workspace bytes) for whole-vector layer / RMS rows."""
    sets, els, n_sets, length, nparams = geo
    nvec = length // vec
    g = max(128, min(1024, next_pow2(cdiv(nvec, SPLIT_DX_VECS))))
    pdx = _base_params(nd, sets, els, n_sets, length, nparams, True)
    dx = _new_launch(_split_expr("bwd_split_dx", tag, vec), pdx, (n_sets, 1, 1), (g, 1, 1),
                     desc=f"bwd_split_dx vec={vec} block={g} grid={n_sets}")
    bx = min(32, next_pow2(nvec))
    by = SPLIT_PARAMS_THREADS // bx
    tiles = cdiv(nvec, bx)
    want = max(1, handle.sm_count * SPLIT_BLOCKS_PER_SM // tiles)
    chunks = max(1, min(want, cdiv(n_sets, by * 4), 65535))
    chunk = cdiv(n_sets, chunks)
    chunks = cdiv(n_sets, chunk)
    pp = _base_params(nd, sets, els, n_sets, length, nparams, True)
    pp.group = chunk
    par = _new_launch(_split_expr("bwd_split_params", tag, vec), pp, (tiles, chunks, 1), (bx, by, 1),
                      desc=f"bwd_split_params vec={vec} block={bx}x{by} grid={tiles}x{chunks} rows={chunk}")
    fin = _finish_rowx_launch(nd, geo, chunks)
    dx.unit = par.unit = fin.unit = f"normalization.rowx.{tag}"
    # bwd_split_params before bwd_split_dx: both read x and dy, and dx may be dy or x (in place), which
    # bwd_split_dx overwrites (session 32; params after dx summed the overwritten dy)
    return [par, dx, fin], chunks * 2 * nparams * 4


# Layer / RMS rows of any length (the rowx frame) whose backward takes a cluster per row (bwd_rowx_cl) or no
# vector kernel at all (rows beyond 64K elements; before sm_90 any row beyond one block), at least as many as
# the SMs (XSPLIT): the split backward in the aligned frame (ptx/normalization_rowx.cu: bwd_xsplit_dx, a block
# per row reading x and dy twice; bwd_xsplit_params, dscale / dbias per (alignment class, row chunk); then
# finish_rowx), as BWD_SPLIT does for whole-vector rows. Why: LN fp16 2402 x 34823 took bwd_rowx_cl (clusters
# of 8 x 256 threads walking rows one at a time): 819 us + finish 11.9 against PyTorch's 404 + 129 us, 0.63-0.69x
# (H200, session 31 mid-session run 1 and the final sweep). Predicted: ~0.25 ms (dx: 3 n bytes from DRAM, the
# second read from L2; params: 2 n; ~85% of copy). XSPLIT_ANY: every rowx row backward with rows >= SMs (LN
# bf16 417 x 2770: bwd_rowx 29.0 us + finish 3.7 against PyTorch's 5.6 + 4.1; off until measured).
# XSPLIT: a switch, pydnn.tuning.norm.XSPLIT (default True)
# XSPLIT_ANY: a switch, pydnn.tuning.norm.XSPLIT_ANY (default False)
# XSPLIT_FILL: also the rows bwd_rowx holds in one block whose vectors fill under XSPLIT_FILL of its group's G x
# ROWX_BWD_ITEMS slots (G a power of two: RMS fp16 4231 = 529 vectors in 256 x 4, 52%), tensors of at least
# XSPLIT_FILL_BYTES: the idle lanes hold no loads, so an SM keeps about half the bytes in flight. Measured
# (session 32 mid-session run, H200, tools/bench_memory_points.py, eager ms bwd_rowx / split, PyTorch in the same
# run): RMS fp16 17244 x 4231 (52%) 0.3355 / 0.2751 (0.975x -> 1.19x), RMS bf16 81995 x 9188 (56%) 2.774 / 2.345
# (1.05x -> 1.24x); where the rule keeps bwd_rowx: LN fp32 486865 x 2015 (98%) 4.004 / 4.953, LN bf16 169308 x 166
# (66%) 0.151 / 0.442, LN bf16 417 x 2770 (68%) 0.0359 / 0.0339 (0.0260 with ROWX_BWD_WS16), RMS bf16 665 x 2277
# (56%, 3 MB) 0.0287 / 0.0281 (0.0189 with ROWX_BWD_WS16).
# XSPLIT_FILL: a switch, pydnn.tuning.norm.XSPLIT_FILL (default 0.6; 0: off)
# XSPLIT_FILL_BYTES: a switch, pydnn.tuning.norm.XSPLIT_FILL_BYTES (default 32 MiB)
# XSPLIT_SLOTS: the rows bwd_rowx holds in one block, where its dscale / dbias slots (one per group: 8 bytes a
# parameter, written and read back by finish) move more bytes than the split's second read of x and dy (2 n): few
# rows per group (LN bf16 417 x 2770: 420 slots, 18.6 MB of slots against 2.3 MB of x; 169308 x 166: 504 slots,
# 1.3 MB against 56 MB keeps bwd_rowx). Measured (session 32, as XSPLIT_FILL): LN bf16 417 x 2770 0.0339 ms, RMS bf16
# 665 x 2277 0.0281, where bwd_rowx with ROWX_BWD_WS16 (the 16-byte slot stores) took 0.0260 / 0.0189: off.
# XSPLIT_SLOTS: a switch, pydnn.tuning.norm.XSPLIT_SLOTS (default False)
# XSPLIT_DX_BLOCK: bwd_xsplit_dx's largest block (SPLIT_DX_VECS vectors a thread below it). Why 512: the kernel
# takes 63-64 registers (__launch_bounds__(1024)), so a 1024-thread block is alone on its SM and the SM's loads
# stop through each row's block reduction and tail; 512 keeps two rows' phases on an SM (the whole-vector split's
# 1.12x RMS bf16 1478 x 32768 ran 512-thread blocks). LN fp16 2402 x 34823 (4353 vectors a row) would take 1024.
# XSPLIT_DX_BLOCK: a switch, pydnn.tuning.norm.XSPLIT_DX_BLOCK (default 512)
XSPLIT_KERNELS = ("bwd_xsplit_dx", "bwd_xsplit_params")


def _xsplit_use(handle, nd, tag, geo, vec, r):
    """Whether the rowx rows' backward should take the xsplit kernels instead of `r` (_rowx_bwd_only's answer)."""
    if not tuning.norm.XSPLIT or vec <= 1 or not _rowx_layout(nd, geo, vec) or geo[2] < handle.sm_count:
        return False
    if geo[2] > MAX_GRID or geo[3] >= 2**31 - 64:
        return False
    if r is None or tuning.norm.XSPLIT_ANY or " cl=" in r[0][0].desc:
        return True
    nbytes = geo[2] * geo[3] * _SIZES[tag]
    # XSPLIT_FILL: bwd_rowx's group holds G * ROWX_BWD_ITEMS vectors of a row, G a power of two: below the fill,
    # its idle lanes cut the bytes an SM has in flight (see XSPLIT_FILL above)
    fill = cdiv(geo[3] + vec - 1, vec) / (r[0][0].params.group * ROWX_BWD_ITEMS)
    if fill < tuning.norm.XSPLIT_FILL and nbytes >= tuning.norm.XSPLIT_FILL_BYTES:
        return True
    # XSPLIT_SLOTS: bwd_rowx's dscale / dbias slots (written, then read by finish: 2 x r[1] bytes) against what the
    # split reads more (x and dy once more: 2 n bytes)
    return tuning.norm.XSPLIT_SLOTS and r[1] > nbytes


def _xsplit_alt(handle, nd, tag, geo, vec):
    """([bwd_xsplit_dx, bwd_xsplit_params, finish_rowx], workspace bytes) for layer / RMS rows of any length."""
    sets, els, n_sets, length, nparams = geo
    sx = sets[0][1][0]
    period = vec // math.gcd(sx % vec, vec)  # alignment classes (bwd_rowx's p.pf)
    nsv = cdiv(length + vec - 1, vec)  # the most aligned vectors a row's frame takes
    g = max(128, min(tuning.norm.XSPLIT_DX_BLOCK, next_pow2(cdiv(nsv, SPLIT_DX_VECS))))
    pdx = _base_params(nd, sets, els, n_sets, length, nparams, True)
    dx = _new_launch(_split_expr("bwd_xsplit_dx", tag, vec), pdx, (n_sets, 1, 1), (g, 1, 1),
                     desc=f"bwd_xsplit_dx vec={vec} block={g} grid={n_sets}")
    bx = min(32, next_pow2(nsv))
    by = SPLIT_PARAMS_THREADS // bx
    tiles = cdiv(nsv, bx)
    want = max(1, handle.sm_count * SPLIT_BLOCKS_PER_SM // tiles)  # blocks over the rows, all classes
    rpc = cdiv(n_sets, period)  # rows of the largest class
    chunks = max(1, min(cdiv(want, period), cdiv(rpc, by * 4), 65535 // period))
    chunk = cdiv(rpc, chunks)
    chunks = cdiv(rpc, chunk)
    pp = _base_params(nd, sets, els, n_sets, length, nparams, True)
    pp.group, pp.pf = chunk, period
    par = _new_launch(_split_expr("bwd_xsplit_params", tag, vec), pp, (tiles, chunks * period, 1), (bx, by, 1),
                      desc=f"bwd_xsplit_params vec={vec} block={bx}x{by} grid={tiles}x{chunks * period} "
                           f"period={period} rows={chunk}")
    fin = _finish_rowx_launch(nd, geo, chunks * period)
    dx.unit = par.unit = fin.unit = f"normalization.rowx.{tag}"
    return [par, dx, fin], chunks * period * 2 * nparams * 4  # (params first: dx may be dy or x, see _split_alt)


def _rowx_bwd_long(handle, nd, tag, geo, vec, r):
    """Whether the whole-vector rows' backward should take bwd_rowx instead of `r` (_bwd_alt's answer)."""
    if not tuning.norm.ROWX or not _rowx_layout(nd, geo, vec):
        return False
    if r is None:
        return True
    if not (tuning.norm.ROWX_BWD_LONG and tag == "f32" and "cluster=8" in r[0][0].desc
            and geo[2] >= handle.sm_count):  # (float: the measured case; 16-bit rows not measured)
        return False
    nsv = geo[3] // vec
    return next_pow2(max(1, cdiv(nsv, ROWX_BWD_ITEMS))) <= ROWX_BWD_MAX_BLOCK  # (one block holds the row)


def _configs(handle, nd, tag, geo, backward):
    """(alternatives, vec_first, workspace bytes). Fast kernels when the layout is two-level and the set
    fits: the vector launch (when the strides allow 16-byte accesses) first, then the scalar one; gen
    when the scalar launch does not fit (it then serves unaligned pointers) or the layout is not
    two-level."""
    sets, els, n_sets, length, nparams = geo
    alts, ws = [], 0
    two = _inner(els, length) is not None and length < 2**31
    vector = two and _vector_ok(sets, els, length, vec_width(tag, tag))
    # rows of any length: the rowx kernels' vector launch (only theirs: the others need whole vectors per row)
    rowx = two and not vector and _rowx_only_ok(nd, geo, vec_width(tag, tag), backward)
    got_vector = False
    for v in ((vec_width(tag, tag), 1) if vector or rowx else (1,)) if two else ():
        if backward:
            r = _bwd_alt(handle, nd, tag, geo, v) if not (rowx and v > 1) else _rowx_bwd_only(handle, nd, tag, geo, v)
            if v > 1 and not rowx and _rowx_bwd_long(handle, nd, tag, geo, v, r):
                r = _rowx_bwd_only(handle, nd, tag, geo, v) or r
            if v > 1 and not rowx and _split_use(handle, nd, tag, geo, v, r):
                r = _split_alt(handle, nd, tag, geo, v)
            if v > 1 and rowx and _xsplit_use(handle, nd, tag, geo, v, r):
                r = _xsplit_alt(handle, nd, tag, geo, v)
            a, w = r if r is not None else (None, 0)
        elif rowx and v > 1:
            a, w = (_rowx_alt(handle, nd, tag, geo, v) if tuning.norm.ROWX else None), 0
        else:
            a, w = _fwd_alt(handle, nd, tag, geo, v), 0
        if a is None:
            continue
        alts.append(a)
        ws = max(ws, w)
        got_vector = got_vector or v > 1
    if not alts or len(alts) == 1 and got_vector:
        a, w = _gen_alt(handle, nd, tag, geo, backward)
        alts.append(a)
        ws = max(ws, w)
    ws = cdiv(ws, WS_ALIGN) * WS_ALIGN
    return alts, got_vector and len(alts) == 2, ws


def _plan(handle, nd, x, out, dy, stats, backward):
    tag = TAG[x.dtype]
    geo = _geometry(nd, x, out, dy, stats)
    pl = _Plan()
    pl.alternatives, pl.vec_first, pl.workspace = _configs(handle, nd, tag, geo, backward)
    # the split kernels where the NHWC tile kernels (gn_reg / gn_fwd / gn_bwd: x read once) do not serve
    gs = None if pl.alternatives[0][0].expr.startswith("pydnn::norm::gn_") else \
        _gs_plan(handle, nd, tag, x, out, dy, stats, backward)
    if gs is not None:  # (16-byte aligned pointers; else the last alternative, which serves any alignment)
        pl.alternatives = [gs[0], pl.alternatives[-1]]
        pl.vec_first = True
        pl.workspace = max(pl.workspace, cdiv(gs[1], WS_ALIGN) * WS_ALIGN)
    pl.unit = f"normalization.{tag}"
    pl.itemsize = _SIZES[tag]
    pl.rms = nd.kind == E.PYDNN_NORM_KIND_RMS
    pl.kind = nd.kind
    for alt in pl.alternatives:
        for lc in alt:
            lc.argv = driver.kernel_args(lc.params)
    return pl


def plan_summary(handle, norm_desc, x_desc, backward=False):
    """For tests and tuning: [[launch description, ...] per alternative] for x's layout everywhere, and
    the workspace bytes. Loads no kernel."""
    check_handle(handle)
    nd = _set(norm_desc)
    _check_data([(x_desc, "xDesc")], ())
    _shapes(nd, x_desc)
    pl = _plan(handle, nd, x_desc, x_desc, x_desc if backward else None, None, backward)
    return [[lc.desc for lc in alt] for alt in pl.alternatives], pl.workspace


# ----------------------------------------------------------------------------- calls

def _key(direction, nd, descs):
    try:  # a loop, not a generator: this runs on every call (the same tuple either way)
        key = ["norm", direction, nd, nd.version]
        for d in descs:
            key.append(None if d is None else (d, d.version))
        return tuple(key)
    except (AttributeError, TypeError):
        return None


def _get_plan(handle, direction, nd, x, out, dy, sb, st, named, out_names, need_stats):
    """The cached plan for these descriptors, or a new one (validation first, then kernel lookup)."""
    key = _key(direction, nd, (x, out, dy, sb, st))
    pl = handle.prepared.get(key) if key is not None else None
    if pl is not None:
        return pl
    nd = _set(nd)
    _check_data(named, out_names)
    pdims, sdims = _shapes(nd, x)
    _check_params_desc(sb, pdims)
    if need_stats:
        _check_stats_desc(st, sdims)
    pl = _plan(handle, nd, x, out, dy, st, direction == 2)
    return pl


def _load(handle, pl, key, alts=None):
    """Load the launches' kernels (`alts`: those alternatives; default: every one, but only the first of a
    split-kernel plan, whose other alternative, for unaligned pointers, _run loads when it first takes it)."""
    if alts is None:
        alts = pl.alternatives[:1] if pl.alternatives[0][0].unit is not None else pl.alternatives
    for alt in alts:
        for lc in alt:
            if lc.func is None:
                lc.func = handle.function(lc.unit or pl.unit, lc.expr)
                if lc.smem > 32 * 1024:  # (static shared memory counts towards the 48 KiB default too)
                    driver.function_set_max_dynamic_smem(lc.func, lc.smem)
    if key is not None:
        handle.remember(key, pl)


def _aligned(ptr, name, n):
    if ptr % n:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER,
                         f"{name}: {ptr:#x} is not aligned to {n} bytes")
    return ptr


def _opt_ptr(buf, name, need):
    """An optional float32 buffer: None / 0 -> 0, else its 4-byte aligned address."""
    if buf is None or (type(buf) is int and buf == 0):
        return 0
    return _aligned(device_ptr(buf, name, need), name, 4)


def _ptr(buf, name, need, align):
    return _aligned(device_ptr(buf, name, need), name, align)


# The per-call fields of NormParams in one struct.pack_into a launch: the 10 pointers and the 4 blending scalars
# lead the struct (out .. dbias, alpha .. beta2). Why: 15 ctypes setattr a launch; the patch of one launch 1.00 ->
# 0.77-0.83 us (timeit, this 2-core machine's CPU, session 32), the pointer tuple built once a call: ~1 us less
# for the split backward's 3 launches (norm_backward itself: ~5.5 / ~6-8 us a call with 2 / 3 stubbed launches).
_PATCH = struct.Struct("<10Q4d")
assert (NormParams.out.offset, NormParams.dbias.offset, NormParams.alpha.offset, NormParams.beta2.offset) == \
    (0, 72, 80, 104)
_pack = _PATCH.pack_into


def _run(handle, pl, data_ptrs, fields, alpha, beta, alpha2=0.0, beta2=0.0, stats=False):
    """Patch the call's pointers and scalars into each launch of the chosen alternative, and launch."""
    alts = pl.alternatives
    if len(alts) == 1 or not pl.vec_first:
        alt = alts[0]
    else:
        m = 0
        for q in data_ptrs:  # a loop, not all(<generator>): no Python frame per pointer
            m |= q
        if m % 16 == 0:
            alt = alts[0]
        else:
            alt = alts[-1]
            if alt[0].func is None:  # (a split-kernel plan's fallback: loaded on first use)
                _load(handle, pl, None, (alt,))
    g = fields.get  # (a field not given is 0: no plan sets a pointer of its own)
    vals = (g("out") or 0, g("x") or 0, g("dy") or 0, g("scale") or 0, g("bias") or 0, g("mean") or 0,
            g("invstd") or 0, g("ws") or 0, g("dscale") or 0, g("dbias") or 0, alpha, beta, alpha2, beta2)
    fl = (FLAG_BETA if beta != 0 else 0) | (FLAG_BETA2 if beta2 != 0 else 0) | (FLAG_STATS if stats else 0)
    for lc in alt:
        p = lc.params
        _pack(p, 0, *vals)
        p.flags = p.flags & ~(FLAG_BETA | FLAG_BETA2 | FLAG_STATS) | fl
        driver.launch_args(lc.func, lc.grid, lc.block, lc.smem, handle.cu_stream, lc.argv)


def _forward(handle, norm_desc, alpha, beta, x_desc, x, y_desc, y, sb_desc, scale, bias, st_desc, mean, invstd,
             training):
    if type(handle) is not Handle or not handle.alive:
        check_handle(handle)
    direction = 1 if training else 0
    named = [(x_desc, "xDesc"), (y_desc, "yDesc")]
    key = _key(direction, norm_desc, (x_desc, y_desc, None, sb_desc, st_desc))
    pl = handle.prepared.get(key) if key is not None else None
    fresh = pl is None
    if pl is None:
        pl = _get_plan(handle, direction, norm_desc, x_desc, y_desc, None, sb_desc, st_desc, named, ("yDesc",), training)
        _pointers_fwd(pl, x_desc, x, y_desc, y, sb_desc, scale, bias, st_desc, mean, invstd, training)
        _load(handle, pl, key)
    al = alpha if type(alpha) is float else scalar("alpha", alpha)
    be = beta if type(beta) is float else scalar("beta", beta)
    ptrs = _pointers_fwd(pl, x_desc, x, y_desc, y, sb_desc, scale, bias, st_desc, mean, invstd, training)
    _run(handle, pl, ptrs[:2], ptrs[2], al, be, stats=training)
    if not training and key is not None:
        if _ew.note is not None:  # norm_forward_inference's compiled entry keeps this call site (ew._setup_entries)
            _infer_note(pl, x_desc, y_desc, sb_desc)
        elif fresh and not _ew._entries_tried:  # a new plan: the entries, where no other call set them up yet
            _ew.plan_entries(pl.alternatives[0][0].func)


def _infer_note(pl, x_desc, y_desc, sb_desc):
    """The inference plan's C record (fastcall.norm_infer_record), made again in place when an alternative's kernels
    were loaded since (a split-kernel plan loads its fallback on first use), noted for the compiled entry."""
    alts = pl.alternatives  # (an alternative's launches are loaded together: _load)
    loaded = (alts[0][0].func is not None, alts[-1][0].func is not None, alts[-1][-1].func is not None)
    if getattr(pl, "crec_key", None) != loaded:
        fastcall.norm_infer_record(pl, NormParams, x_desc.span_bytes(), y_desc.span_bytes(), sb_desc.span_bytes(),
                                   FLAG_BETA | FLAG_BETA2 | FLAG_STATS, FLAG_BETA)
        pl.crec_key = loaded
    _ew.note(_ew.K_NORM_INFER, pl, 0, False, False)


def _pointers_fwd(pl, x_desc, x, y_desc, y, sb_desc, scale, bias, st_desc, mean, invstd, training):
    # int pointers that need no check past positive and aligned are taken inline (the hot path); anything
    # else goes through _ptr / _opt_ptr, in the same order, so the same error is raised first
    n = pl.itemsize
    ok = not _buffers.CHECKED
    xs, ys, sbs = x_desc.span_bytes(), y_desc.span_bytes(), sb_desc.span_bytes()
    xp = x if ok and type(x) is int and x > 0 and x % n == 0 else _ptr(x, "x", xs, n)
    yp = y if ok and type(y) is int and y > 0 and y % n == 0 else _ptr(y, "y", ys, n)
    if yp < xp + xs and xp < yp + ys:  # overlapping: only the very same elements may be shared
        no_partial_alias(yp, y_desc, "y", xp, x_desc, "x")
    sp = scale if ok and type(scale) is int and scale > 0 and scale % 4 == 0 else _ptr(scale, "scale", sbs, 4)
    bp = bias if ok and type(bias) is int and bias > 0 and bias % 4 == 0 else _opt_ptr(bias, "bias", sbs)
    fields = {"out": yp, "x": xp, "scale": sp, "bias": bp, "mean": 0, "invstd": 0, "dy": 0}
    if training:
        fields["invstd"] = _ptr(invstd, "resultInvStd", st_desc.span_bytes(), 4)
        if not pl.rms:
            fields["mean"] = _ptr(mean, "resultMean", st_desc.span_bytes(), 4)
    return xp, yp, fields


@api
def norm_forward_training(handle, norm_desc, alpha, beta, x_desc, x, y_desc, y, scale_bias_desc, scale, bias,
                          mean_invstd_desc, result_mean, result_inv_std):
    """pydnnNormForwardTraining: y = alpha * act(xhat * scale + bias) + beta * y with the statistics of
    each set written to resultMean / resultInvStd (RMS: resultInvStd only; resultMean may be NULL). bias
    may be NULL (no bias). Statuses: BAD_PARAM (handle, descriptors, dims, groups not dividing C,
    normalizedDims beyond x, parameter / statistics descriptors of the wrong dims, type or strides,
    overlapping y, alpha / beta not numbers), BAD_PARAM_NULL_POINTER, BAD_PARAM_MISALIGNED_POINTER,
    NOT_SUPPORTED (data types other than float, half, bfloat16)."""
    _forward(handle, norm_desc, alpha, beta, x_desc, x, y_desc, y, scale_bias_desc, scale, bias,
             mean_invstd_desc, result_mean, result_inv_std, True)


@api
def norm_forward_inference(handle, norm_desc, alpha, beta, x_desc, x, y_desc, y, scale_bias_desc, scale, bias):
    """pydnnNormForwardInference: y as norm_forward_training, statistics computed and not written.
    Statuses as norm_forward_training."""
    _forward(handle, norm_desc, alpha, beta, x_desc, x, y_desc, y, scale_bias_desc, scale, bias, None, None, None,
             False)


_py_norm_forward_inference = norm_forward_inference  # the Python function behind the compiled entry (ew._setup_entries)


def _bwd_plan(handle, norm_desc, x_desc, dy_desc, dx_desc, sb_desc, st_desc):
    check_handle(handle)
    named = [(x_desc, "xDesc"), (dy_desc, "dyDesc"), (dx_desc, "dxDesc")]
    key = _key(2, norm_desc, (x_desc, dx_desc, dy_desc, sb_desc, st_desc))
    pl = handle.prepared.get(key) if key is not None else None
    if pl is None:
        pl = _get_plan(handle, 2, norm_desc, x_desc, dx_desc, dy_desc, sb_desc, st_desc, named, ("dxDesc",), True)
    return key, pl


@api
def get_norm_backward_workspace_size(handle, norm_desc, x_desc, dy_desc, dx_desc, scale_bias_desc,
                                     mean_invstd_desc):
    """pydnnGetNormBackwardWorkspaceSize: device bytes norm_backward needs for these descriptors (the
    per-block partial sums of dscale and dbias)."""
    return _bwd_plan(handle, norm_desc, x_desc, dy_desc, dx_desc, scale_bias_desc, mean_invstd_desc)[1].workspace


def _fast_bwd(handle, pl, x, x_desc, dy, dy_desc, dx, dx_desc, scale, bias, dscale, dbias, mean, invstd, ws, a, b,
              a2, b2):
    """norm_backward's cached call (see there); False: the full path must take it."""
    n = pl.itemsize
    for q in (x, dy, dx):
        if type(q) is not int or q <= 0 or q % n:
            return False
    for q in ((scale, dscale, invstd) if pl.rms else (scale, dscale, invstd, mean)):
        if type(q) is not int or q <= 0 or q % 4:
            return False
    opt = []
    for q in (bias, dbias):
        if q is None or (type(q) is int and q == 0):
            opt.append(0)
        elif type(q) is int and q > 0 and not q % 4:
            opt.append(q)
        else:
            return False
    wp = 0
    if pl.workspace:
        if type(ws) is not int or ws <= 0 or ws % 4:
            return False
        wp = ws
    xs, dys, dxs = x_desc.span_bytes(), dy_desc.span_bytes(), dx_desc.span_bytes()
    if (dx < x + xs and x < dx + dxs) or (dx < dy + dys and dy < dx + dxs):
        return False  # (in place, allowed for the very same elements: the full path decides)
    _run(handle, pl, (x, dy, dx), {"out": dx, "x": x, "dy": dy, "scale": scale, "bias": opt[0], "dscale": dscale,
                                   "dbias": opt[1], "mean": 0 if pl.rms else mean, "invstd": invstd, "ws": wp},
         a, b, a2, b2)
    return True


@api
def norm_backward(handle, norm_desc, alpha_data_diff, beta_data_diff, alpha_param_diff, beta_param_diff,
                  x_desc, x, dy_desc, dy, dx_desc, dx, scale_bias_desc, scale, bias, result_scale_diff,
                  result_bias_diff, mean_invstd_desc, saved_mean, saved_inv_std, workspace,
                  workspace_size_in_bytes):
    """pydnnNormBackward: dx, dscale and dbias of norm_forward_training's y from the saved statistics
    (RMS: savedMean is not read and may be NULL); bias may be NULL (no bias: only the activation reads
    it); resultBiasDiff may be NULL (not computed). Statuses as norm_forward_training, and BAD_PARAM when
    workspaceSizeInBytes is below get_norm_backward_workspace_size."""
    # The cached call: a plan for these descriptors (and versions), its kernels loaded, int pointers, float
    # scalars, enough workspace, dx apart from x and dy: the fields straight to _run. Anything else takes
    # the full path below, which names what is wrong. Why: 55 Python calls a call (13 us on this CPU with
    # the stub driver) where the kernels take 5-10 us: ln_bwd bf16 96 x 275 0.94x PyTorch, 417 x 2770 0.84x
    # (H200, tools/sweep_memory.py; host-bound); with it 16 calls.
    if (type(handle) is Handle and handle.alive and not _buffers.CHECKED and type(alpha_data_diff) is float
            and type(beta_data_diff) is float and type(alpha_param_diff) is float and type(beta_param_diff) is float
            and type(workspace_size_in_bytes) is int):
        key = _key(2, norm_desc, (x_desc, dx_desc, dy_desc, scale_bias_desc, mean_invstd_desc))
        try:
            pl = handle.prepared.get(key) if key is not None else None
        except TypeError:
            pl = None
        if (pl is not None and pl.alternatives[0][0].func is not None and workspace_size_in_bytes >= pl.workspace
                and _fast_bwd(handle, pl, x, x_desc, dy, dy_desc, dx, dx_desc, scale, bias, result_scale_diff,
                              result_bias_diff, saved_mean, saved_inv_std, workspace, alpha_data_diff,
                              beta_data_diff, alpha_param_diff, beta_param_diff)):
            return
    key, pl = _bwd_plan(handle, norm_desc, x_desc, dy_desc, dx_desc, scale_bias_desc, mean_invstd_desc)
    ws_size = _int("workspaceSizeInBytes", workspace_size_in_bytes)
    if ws_size < pl.workspace:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM,
                         f"workspaceSizeInBytes: {ws_size} is less than the {pl.workspace} bytes needed")
    n = pl.itemsize
    xp = _ptr(x, "x", x_desc.span_bytes(), n)
    dyp = _ptr(dy, "dy", dy_desc.span_bytes(), n)
    dxp = _ptr(dx, "dx", dx_desc.span_bytes(), n)
    no_partial_alias(dxp, dx_desc, "dx", xp, x_desc, "x")
    no_partial_alias(dxp, dx_desc, "dx", dyp, dy_desc, "dy")
    pbytes, sbytes = scale_bias_desc.span_bytes(), mean_invstd_desc.span_bytes()
    fields = {"out": dxp, "x": xp, "dy": dyp, "scale": _ptr(scale, "scale", pbytes, 4),
              "bias": _opt_ptr(bias, "bias", pbytes), "dscale": _ptr(result_scale_diff, "resultScaleDiff", pbytes, 4),
              "dbias": _opt_ptr(result_bias_diff, "resultBiasDiff", pbytes),
              "mean": 0 if pl.rms else _ptr(saved_mean, "savedMean", sbytes, 4),
              "invstd": _ptr(saved_inv_std, "savedInvStd", sbytes, 4),
              "ws": _ptr(workspace, "workspace", pl.workspace, 4) if pl.workspace else 0}
    if pl.alternatives[0][0].func is None:
        _load(handle, pl, key)
    a, b = scalar("alphaDataDiff", alpha_data_diff), scalar("betaDataDiff", beta_data_diff)
    a2, b2 = scalar("alphaParamDiff", alpha_param_diff), scalar("betaParamDiff", beta_param_diff)
    _run(handle, pl, (xp, dyp, dxp), fields, a, b, a2, b2)


@api
def derive_norm_param_descriptors(scale_bias_desc, mean_invstd_desc, x_desc, norm_desc):
    """pydnnDeriveNormParamDescriptors: set scaleBiasDesc (packed float32 parameters) and meanInvstdDesc
    (packed float32 statistics) to the dims norm_desc's kind needs for x."""
    nd = _set(norm_desc)
    check_tensor(x_desc, "xDesc")
    for d, name in ((scale_bias_desc, "scaleBiasDesc"), (mean_invstd_desc, "meanInvstdDesc")):
        if type(d) is not TensorDescriptor or not d.alive:
            raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{name}: not a live tensor descriptor")
    pdims, sdims = _shapes(nd, x_desc)
    for d, dims in ((scale_bias_desc, pdims), (mean_invstd_desc, sdims)):
        d._assign(E.PYDNN_DATA_FLOAT, dims, packed_strides(dims, E.PYDNN_TENSOR_NCHW))


# ----------------------------------------------------------------------------- the C API

C_OPAQUE_TYPES = [("pydnnNormDescriptor_t", "pydnnNormStruct")]
C_NULLABLE = {"pydnnSetNormDescriptor": ("activationDesc",)}
C_API = [("Layer, group, instance and RMS normalization (pydnn extensions)", [
    ("pydnnStatus_t pydnnCreateNormDescriptor(pydnnNormDescriptor_t *normDesc);",
     "A new norm descriptor, unset until pydnnSetNormDescriptor."),
    ("pydnnStatus_t pydnnSetNormDescriptor(pydnnNormDescriptor_t normDesc, pydnnNormKind_t kind, int groups, int normalizedDims, double epsilon, pydnnActivationDescriptor_t activationDesc);",
     "LAYER / RMS over the last normalizedDims dims, GROUP (groups dividing C) or INSTANCE; epsilon > 0; activationDesc (NULL: none) is copied."),
    ("pydnnStatus_t pydnnGetNormDescriptor(const pydnnNormDescriptor_t normDesc, pydnnNormKind_t *kind, int *groups, int *normalizedDims, double *epsilon);",
     "The norm descriptor's kind, groups, normalized dims and epsilon."),
    ("pydnnStatus_t pydnnDestroyNormDescriptor(pydnnNormDescriptor_t normDesc);",
     "Release a norm descriptor (NULL: nothing to do)."),
    ("pydnnStatus_t pydnnDeriveNormParamDescriptors(pydnnTensorDescriptor_t scaleBiasDesc, pydnnTensorDescriptor_t meanInvstdDesc, const pydnnTensorDescriptor_t xDesc, const pydnnNormDescriptor_t normDesc);",
     "Packed float32 descriptors of scale/bias (LAYER/RMS: 1...1 x trailing dims; GROUP/INSTANCE: 1,C,1...) and of mean/invstd for x."),
    ("pydnnStatus_t pydnnNormForwardTraining(pydnnHandle_t handle, const pydnnNormDescriptor_t normDesc, const void *alpha, const void *beta, const pydnnTensorDescriptor_t xDesc, const void *x, const pydnnTensorDescriptor_t yDesc, void *y, const pydnnTensorDescriptor_t scaleBiasDesc, const void *scale, const void *bias, const pydnnTensorDescriptor_t meanInvstdDesc, void *resultMean, void *resultInvStd);",
     "y = alpha * act(xhat * scale + bias) + beta * y; per-set mean and 1/sqrt(var + eps) out (RMS: invstd only); bias may be NULL."),
    ("pydnnStatus_t pydnnNormForwardInference(pydnnHandle_t handle, const pydnnNormDescriptor_t normDesc, const void *alpha, const void *beta, const pydnnTensorDescriptor_t xDesc, const void *x, const pydnnTensorDescriptor_t yDesc, void *y, const pydnnTensorDescriptor_t scaleBiasDesc, const void *scale, const void *bias);",
     "y as pydnnNormForwardTraining; statistics computed from x and not written."),
    ("pydnnStatus_t pydnnGetNormBackwardWorkspaceSize(pydnnHandle_t handle, const pydnnNormDescriptor_t normDesc, const pydnnTensorDescriptor_t xDesc, const pydnnTensorDescriptor_t dyDesc, const pydnnTensorDescriptor_t dxDesc, const pydnnTensorDescriptor_t scaleBiasDesc, const pydnnTensorDescriptor_t meanInvstdDesc, size_t *sizeInBytes);",
     "Device workspace bytes pydnnNormBackward needs (per-block partial sums of dscale / dbias)."),
    ("pydnnStatus_t pydnnNormBackward(pydnnHandle_t handle, const pydnnNormDescriptor_t normDesc, const void *alphaDataDiff, const void *betaDataDiff, const void *alphaParamDiff, const void *betaParamDiff, const pydnnTensorDescriptor_t xDesc, const void *x, const pydnnTensorDescriptor_t dyDesc, const void *dy, const pydnnTensorDescriptor_t dxDesc, void *dx, const pydnnTensorDescriptor_t scaleBiasDesc, const void *scale, const void *bias, void *resultScaleDiff, void *resultBiasDiff, const pydnnTensorDescriptor_t meanInvstdDesc, const void *savedMean, const void *savedInvStd, void *workspace, size_t workspaceSizeInBytes);",
     "dx, dscale, dbias (alpha/beta blended; dbias may be NULL) from the saved statistics; the activation's derivative at the recomputed pre-activation."),
])]

# the compiled entries over this module's Python functions (_elementwise._setup_entries)
_ew.register_entries(sys.modules[__name__], "norm_forward_inference")
