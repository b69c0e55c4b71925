"""Matmul (GEMM): pydnn's own tensor-core matrix multiply (kernels in ptx/matmul.cu). INTERNAL module:
other families (the multi-head attention projections, the graph API) call it from Python; the public
call is pydnn.matmul / pydnnMatmul (pydnn/graph/matmul_api.py: tensor descriptors mapped onto gemm_plan),
and the graph API's runtime fusion instantiates gemm_tc_body / gemm_wgmma_body / gemm_tma_body (fused_tma) with
generated epilogues.

    plan = gemm_plan(handle, dtype, m, n, k, trans_a=False, trans_b=False, lda=None, ldb=None, ldc=None,
                     batch=1, stride_a=0, stride_b=0, stride_c=0, bias=False, allow_tf32=False)
    plan.launch(handle, a, b, c, alpha=1.0, beta=0.0, bias=0)      # a, b, c, bias: device pointers
    gemm(handle, dtype, m, n, k, a, b, c, alpha=1.0, beta=0.0, **the keywords of gemm_plan)  # cached plan

Row major; leading dims and batch strides in ELEMENTS. For each z < batch:

    C_z[i, j] = alpha * sum_k opA_z[i, k] * opB_z[k, j] + beta * C_z[i, j]  (+ bias[j] when bias=True)
    opA_z[i, k] = A[z*stride_a + i*lda + k]    (trans_a: A[z*stride_a + k*lda + i])
    opB_z[k, j] = B[z*stride_b + k*ldb + j]    (trans_b: B[z*stride_b + j*ldb + k])
    C_z[i, j]   = C[z*stride_c + i*ldc + j]

dtype (PYDNN_DATA_FLOAT, HALF or BFLOAT16) is that of A, B, C and bias alike; products are summed in
float32. beta == 0 never reads C. The bias (a length-n vector) is added unscaled, after alpha and beta.
Default leading dims are the packed ones (lda = k, or m when trans_a; ldb = n, or k when trans_b;
ldc = n). m, n, k >= 0 (m or n = 0: nothing to do; k = 0: C = beta * C (+ bias)); batch >= 1; a batch
stride of 0 broadcasts that operand (C's may be 0 only when batch == 1). C's batches must not overlap:
one after another (stride_c >= (m - 1) * ldc + n) or side by side within its rows (stride_c >= n and
(batch - 1) * stride_c + n <= ldc).

Kernels: half / bfloat16 on tensor cores (mma.sync m16n8k16, cp.async multi-stage pipeline, ldmatrix,
fragments double-buffered in registers), one of three block tiles chosen per problem (128x256 / 128x128 /
64x64, by an estimate of waves x tile cost); on a compute capability 9.0 device, problems of at least 3/4 of a
wave of blocks and K >= 512 take gemm_wgmma instead (Hopper wgmma from 128B-swizzled shared tiles,
ptx/common/wgmma.cuh; its units are compiled for sm_90a only, see WG_TILES; the 128x256 tile runs
persistent, one wave of blocks walking the tiles, with tuning.matmul.WG_PERSIST: WG_PERSIST_TILE; where both
operands suit TMA, plain GEMMs run gemm_tma in its place: TMA_TILE, tuning.matmul.USE_TMA); operands whose pointer,
leading dim or batch stride is not a multiple of 16 bytes take a general path (the mma.sync kernel
loading element by element). float runs on
CUDA cores (FMA, gemm_simt: 128x128 or 64x128 block tiles of 8x8 outputs a thread, and for long-K problems of
at least two waves the 128x256 SIMT_BIG_TILE of 16x8 outputs a thread; persistent blocks, any alignment; on the
H200 8192^3 and the 7B projections 0.92-0.93x cuBLAS without TF32 (47-48 TFLOP/s), the 128x128 tile 0.80-0.84x);
allow_tf32 is accepted (it permits TF32, it does not require it) and currently changes
nothing: float always takes the exact FMA kernel.

No call allocates or synchronizes; launches go to the handle's stream. gemm() keeps its plans in the
handle (handle.prepared), so a repeated call costs a dictionary lookup, the pointer checks and
cuLaunchKernel.

Errors (PydnnError): BAD_PARAM naming the argument (sizes, leading dims, strides, flags, scalars, C
overlapping A, B or bias), NOT_SUPPORTED for a data type this module has no kernel for (double, ints),
BAD_PARAM_NULL_POINTER / BAD_PARAM_MISALIGNED_POINTER for pointers. Everything is checked before the GPU is
touched.

gemm() also takes the bias pointer: `bias_ptr=`, or a non-boolean `bias` (a pointer) as a shorthand.

A C API would be one function, say pydnnMatmulEx(handle, dataType, m, n, k, transA, transB, alpha, A, lda,
strideA, B, ldb, strideB, beta, C, ldc, strideC, batchCount, bias) declared in C_API below (bias in
C_NULLABLE): every argument maps onto an existing marshalling rule (host scalars alpha / beta, device
pointers, ints and long longs), and its body is gemm(). Not star-import this module into pydnn: its
names are internal.
"""
import ctypes

from .. import enums as E
from .. import tuning
from .._build import loader
from .._build.manifest import KernelUnit
from .._build.params import kernel_params
from .._cuda import driver
from .._cuda import tensormap
from ..buffers import device_ptr
from ..handle import check_handle
from ..status import PydnnError
from .common import TAG, cdiv, element_aligned, scalar

__all__ = ["gemm_plan", "cached_plan", "gemm", "GemmPlan"]
C_API = []              # internal module: no C functions (see the docstring for the one a C API would add)
C_OPAQUE_TYPES = []
C_NULLABLE = {}

FLAG_BETA, FLAG_BIAS, FLAG_PAIR, FLAG_C16 = 1, 2, 4, 8  # PYDNN_MATMUL_FLAG_* in ptx/matmul_params.h
INT_MAX = 2**31 - 1
MAX_GRID_Z = 65535          # the kernels loop over the batch past the grid's z
GROUP_M = 8                 # tile raster: groups of 8 tile rows (L2 reuse of B's columns)
BK = 64                     # gemm_tc's K step (elements)
ESIZE = {E.PYDNN_DATA_FLOAT: 4, E.PYDNN_DATA_HALF: 2, E.PYDNN_DATA_BFLOAT16: 2}
CTYPE = {"f16": "pydnn::half_t", "bf16": "pydnn::bf16_t"}
TRANS = ("nn", "nt", "tn", "tt")  # (trans_a, trans_b) as letters: t = transposed


@kernel_params("matmul_params.h", "MatmulParams")
class MatmulParams(ctypes.Structure):
    _fields_ = [
        ("a", ctypes.c_void_p), ("b", ctypes.c_void_p), ("c", ctypes.c_void_p), ("bias", ctypes.c_void_p),
        ("lda", ctypes.c_longlong), ("ldb", ctypes.c_longlong), ("ldc", ctypes.c_longlong),
        ("stride_a", ctypes.c_longlong), ("stride_b", ctypes.c_longlong), ("stride_c", ctypes.c_longlong),
        ("alpha", ctypes.c_float), ("beta", ctypes.c_float),
        ("m", ctypes.c_int), ("n", ctypes.c_int), ("k", ctypes.c_int), ("batch", ctypes.c_int),
        ("tiles_m", ctypes.c_int), ("tiles_n", ctypes.c_int), ("group_m", ctypes.c_int), ("flags", ctypes.c_uint),
        ("k_split", ctypes.c_int),
    ]


@kernel_params("matmul_params.h", "MatmulTmaParams")
class MatmulTmaParams(ctypes.Structure):
    """gemm_tma's parameters: the two 128-byte tensor maps (64-byte aligned in the C struct: at offsets 0 and
    128 here, so the layouts agree; the driver copies the bytes, the host buffer's own alignment does not
    matter), then MatmulParams."""
    _fields_ = [("map_a", ctypes.c_uint64 * 16), ("map_b", ctypes.c_uint64 * 16), ("p", MatmulParams)]


# ----------------------------------------------------------------------------- kernel variants

class TcTile:
    """A gemm_tc block tile: BM x BN of C, WARPS_M x WARPS_N warps, STAGES shared K tiles; `per_sm` blocks
    fit on an SM (shared memory, and the kernel's register cap: its MINB), `eff` a guess of the fraction of
    the tensor-core rate a full SM of such blocks reaches (bigger warp tiles reuse fragments more); `pipe`
    the main loop (ptx/matmul.cu: 1 plain, 2 double-buffered fragments and precomputed copies)."""

    def __init__(self, bm, bn, wm, wn, stages, per_sm, eff, pipe=1):
        self.bm, self.bn, self.wm, self.wn, self.stages, self.per_sm, self.eff = bm, bn, wm, wn, stages, per_sm, eff
        self.pipe = pipe
        self.unit = None  # the unit prefix of a tile outside the build (see extra_units)
        self.threads = wm * wn * 32
        self.smem = stages * (bm + bn) * BK * 2

    def expr(self, tag, ta, tb, vec):
        b = lambda v: "true" if v else "false"  # noqa: E731
        return (f"pydnn::matmul::gemm_tc<{CTYPE[tag]}, {self.bm}, {self.bn}, {self.wm}, {self.wn}, "
                f"{self.stages}, {self.per_sm}, {self.pipe if vec else 1}, {b(ta)}, {b(tb)}, {b(vec)}>")

    def __repr__(self):
        return f"TcTile({self.bm}x{self.bn}, warps {self.wm}x{self.wn}, stages {self.stages}, pipe {self.pipe})"


# The build's tiles. Measured on the H200 (bf16 4096^3 nn, tools/bench_matmul.py): 128x256 pipe 2 325
# TFLOP/s, 128x128 (2x2 warps of 64x64) pipe 2 291, 64x64 pipe 1 150 (its eff relative to the first).
TC_TILES = (TcTile(128, 256, 2, 4, 3, 1, 1.0, pipe=2), TcTile(128, 128, 2, 2, 3, 2, 0.9, pipe=2),
            TcTile(64, 64, 2, 2, 3, 3, 0.45))
TC_GENERAL = TC_TILES[2]  # the unaligned path's tile (pipeline 1: element-by-element copies)
# Candidates measured on the device before they replace a TC_TILES entry (tests and tools/bench_matmul.py
# compile them through extra_units; the build does not). Both measured at 325-332 TFLOP/s on bf16 4096^3
# nn / nt (bench only, not yet through the GPU tests).
CANDIDATE_TILES = (TcTile(256, 128, 4, 2, 3, 1, 1.0, pipe=2), TcTile(128, 256, 2, 4, 4, 1, 1.0, pipe=2))


class WgTile:
    """A gemm_wgmma block tile (Hopper only: its units are compiled for sm_90a, see kernel_units): 128 x BN
    of C, two warpgroups of wgmma.m64nBNk16 (256 threads, 1 block per SM), STAGES shared K tiles in
    wgmma's 128B-swizzled layout (+1 KiB to align them to 1024 bytes); `eff` as TcTile's (relative to
    the 128x256 mma.sync tile)."""

    def __init__(self, bn, stages, eff, per_sm=1, unit="matmul.wgmma", persist=False, lead=None, runon=False,
                 split=False):
        self.bm, self.bn, self.stages, self.eff = 128, bn, stages, eff
        self.per_sm, self.threads = per_sm, 256
        self.unit = unit
        self.persist = persist  # gemm_wgmma_p: a grid of at most one wave of blocks walking the tiles
        # K tiles copied ahead: stages - 2 (one barrier a K tile) or stages - 1 (two; persistent only)
        self.lead = stages - 2 if lead is None else lead
        if self.lead != stages - 2 and not (persist and self.lead == stages - 1):
            raise ValueError(f"lead {lead}: stages - 2, or stages - 1 with persist")
        self.runon = runon  # the K loop runs on into the next tile (persistent only)
        if runon and not persist:
            raise ValueError("runon needs persist")
        self.split = split  # gemm_wgmma_s: split-K partials (persistent, default lead)
        if split and (not persist or runon or self.lead != stages - 2):
            raise ValueError("split needs persist, no runon, the default lead")
        self.smem = stages * (self.bm + bn) * BK * 2 + 1024

    def expr(self, tag, ta, tb, vec=True):
        if not vec:
            raise ValueError("gemm_wgmma has no general (unaligned) path")
        b = lambda v: "true" if v else "false"  # noqa: E731
        kern = "gemm_wgmma_s" if self.split else "gemm_wgmma_p" if self.persist else "gemm_wgmma"
        if self.split:
            return f"pydnn::matmul::{kern}<{CTYPE[tag]}, {self.bn}, {self.stages}, {self.per_sm}, {b(ta)}, {b(tb)}>"
        lead = f", {self.lead}" if self.lead != self.stages - 2 or self.runon else ""
        lead += ", true" if self.runon else ""
        return f"pydnn::matmul::{kern}<{CTYPE[tag]}, {self.bn}, {self.stages}, {self.per_sm}, {b(ta)}, {b(tb)}{lead}>"

    def __repr__(self):
        extra = (", persistent" if self.persist else "") + (f", lead {self.lead}" if self.lead != self.stages - 2 else "")
        extra += ", run-on" if self.runon else ""
        return f"WgTile(128x{self.bn}, wgmma, stages {self.stages}, {self.per_sm} block(s)/SM{extra})"


# The wgmma tiles (units matmul.wgmma.f16 / .bf16, sm_90a only), measured on the H200 (bf16, same run,
# tools/bench_matmul.py): 128x256 4 stages 4096^3 nn 660 TFLOP/s (2.1x the 128x256 mma.sync tile's 308),
# 2048^3 490 (vs 263); 128x128 3 stages 2 blocks/SM 421 and 358. The thresholds below were set when the
# two tiles ran 412 / 333 at 4096^3 (a per-chunk test still in the copy loop) and both lost to gemm_tc on
# 1024^3 (32 / 64 blocks for 132 SMs); without that test the 128x128 tile runs 112 there against
# gemm_tc's 94, so the thresholds are conservative (not re-tuned).
# USE_WGMMA: the chooser considers them on a device of compute
# capability 9.0, for problems of at least 3/4 of a wave of blocks and K >= WG_MIN_K (where they were
# measured faster). WG_CANDIDATES: measured before they replace a WG_TILES entry (compiled through
# wgmma_extra_units by the tests and the benchmark, not by the build).
WG_TILES = (WgTile(256, 4, 1.6), WgTile(128, 3, 1.3, per_sm=2))
# The persistent form of WG_TILES[0] (gemm_wgmma_p, units matmul.wgmmap.f16 / .bf16): the same tile and ring,
# one wave of blocks walking the tiles in the same raster, the K loop running on into the next tile (its
# last copy slots fetch the next tile's first K tiles, so they land before the epilogue starts). The chooser
# takes it in place of WG_TILES[0] when tuning.matmul.WG_PERSIST is set. Measured (H200, tools/bench_graph.py
# --quick --ab, ratios to torch.mm in alternating rounds; torch itself drifted 777 -> 672 TFLOP/s over the
# run): 16384x4096x4096 0.884x (one block a tile 0.825x), 8192^3 0.925x (0.830x); without run-on (the
# next tile's copies issued after the main loop) 0.805x / 0.852x, with 3 K tiles ahead 0.812x / 0.838x.
WG_PERSIST_TILE = WgTile(256, 4, 1.6, unit="matmul.wgmmap", persist=True, runon=True)
# Split-K (units matmul.wgmmas.f16 / .bf16, with splitk_reduce): gemm_plan(split_k=True) on sm_90 cuts K into
# S splits when the 128x256 tiles fill less than 3/4 of a wave and K is long (a Linear layer's weight
# gradient dW = dY^T X: M x N = 384 x 1152, K = 16384 tokens is 15 tiles for 132 SMs; the lead's profile of
# the GPT demo, H200: 215 us a call on the 64x64 mma.sync tile). Each (split, tile) item writes its fp32
# partial to the caller's workspace (ws_bytes = S x m x n floats: get_matmul_ex_workspace_size; without one the
# plan runs its whole-K tile, so no call allocates);
# splitk_reduce sums the S partials in split order (deterministic) and applies alpha, beta and the bias.
WG_SPLIT_TILE = WgTile(256, 4, 1.6, unit="matmul.wgmmas", persist=True, split=True)
SPLIT_MIN_KTILES = 8   # K tiles (of 64) a split walks at least
SPLIT_MAX = 16
# Several waves of splits (tuning.matmul.SPLIT_WAVES): the cost of S splits in K-tile times of one SM is
# waves(S) x (K tiles a split + SPLIT_ITEM_KT: an item's pipeline fill and its 128 KiB fp32 partial store) +
# SPLIT_REDUCE_KT x S x tiles (splitk_reduce reads each 128 KiB partial once: ~0.04 us at ~3 TB/s against
# ~0.85 us a 128x256x64 K tile at 650 TFLOP/s over 132 SMs); S = 1 costs its K tiles + SPLIT_ITEM_KT (one
# wave). H200, session 30 (bench_matmul.py --dw, ms, K = 65536): MLP dW 3072 x 768 whole K 1.555, S = 9 (the
# model's) 0.472, S = 11 0.481; qkv 1280 x 768 S = 4 (one wave) 0.208, S = 13 0.212, S = 11 0.241 (the model at
# SPLIT_ITEM_KT 2 chose 13, at 3 chooses 4); proj 768 x 768 S = 7 0.125, S = 11 0.163. SPLIT_WS_MAX caps the
# partials' workspace.
SPLIT_ITEM_KT = 3
SPLIT_REDUCE_KT = 0.05
SPLIT_WS_MAX = 128 << 20
# WG_CANDIDATES: none now. Measured and not kept (tools/notes/matmul.md, v5): the persistent tile without
# run-on (the next tile's first K tiles copied after the main loop, during the epilogue) and with 3 K tiles
# copied ahead (a second barrier a K tile): both no faster than one block a tile.
WG_CANDIDATES = ()
WG_ARCH = "sm_90"
WG_MIN_K = 512
# The persistent run-on tile hides a short K loop's fill (the next tile's first K tiles land during this
# one's last ones), so it takes K >= tuning.matmul.WG_PERSIST_MIN_K = 64 (one K tile). H200
# (tools/bench_matmul.py --shortk, against torch.mm in one run): at K 64-192 with n >= 256 it ran 0.73-1.35x
# torch where the mma.sync 128x256 tile (the old limit, 256) ran 0.28-0.50x (16384x4096x192 0.284 -> 0.999,
# 1x1 conv 100352x256x64 0.350 -> 1.117); n <= 128 keeps gemm_tc either way (the cost model).
# USE_WGMMA: a switch, pydnn.tuning.matmul.USE_WGMMA (default True)


class TmaTile:
    """A gemm_tma tile (sm_90a units matmul.tma.f16 / .bf16): 128 x BN of C, a producer warpgroup issuing
    TMA copies into a STAGES-deep ring and two consumer warpgroups (384 threads, 1 block per SM, a grid of
    at most one wave walking the tiles); shared memory: the ring (+1 KiB to align it to 1024 bytes) and 2
    mbarriers a stage."""

    def __init__(self, bn, stages, unit="matmul.tma", cm=1, wide=False, pp=False):
        self.bm, self.bn, self.stages = 128, bn, stages
        self.wide = wide  # interior tiles store 16 bytes a lane (quad transposes; FLAG_C16)
        if wide and cm != 1 and not pp:
            raise ValueError("wide: the 1-CTA kernel (or the ping-pong cluster candidate) only")
        # ping-pong: each consumer warpgroup a whole 128 x 128 tile, every other item (gemm_tma_body's PP);
        # cm 2: the pair of CTAs sharing B by multicast (TMA_PPC_TILE)
        self.pp = pp
        if pp and bn != 128:
            raise ValueError("pp: 128 x 128 tiles")
        self.per_sm, self.threads, self.unit, self.persist = 1, 384, unit, True
        self.cm = cm  # CTAs of a cluster along M sharing B (gemm_tma_c: 2, B multicast)
        self.smem = stages * (self.bm + bn) * BK * 2 + 1024 + 16 * stages

    def expr(self, tag, ta, tb, vec=True):
        if not vec:
            raise ValueError("gemm_tma has no general (unaligned) path")
        b = lambda v: "true" if v else "false"  # noqa: E731
        kern = "gemm_tma_c" if self.cm == 2 else "gemm_tma"
        w = ", true" if self.wide or self.pp else ""
        w = f", {b(self.wide)}, true" if self.pp else w
        return f"pydnn::matmul::{kern}<{CTYPE[tag]}, {self.bn}, {self.stages}, {b(ta)}, {b(tb)}{w}>"

    def map_shapes(self, ta, tb):
        """(box_cols, box_rows) of A's and B's maps: a K-major operand one box of 64 K x the tile's rows (B's
        split among the cluster's CTAs), an MN-major one boxes of 64 x 64 (one per 64-column slab; the
        kernel issues BM / 64, or BN / 64 / cm)."""
        return ((64, 64) if ta else (64, self.bm)), ((64, self.bn // self.cm) if tb else (64, 64))

    def grid(self, tiles_m, tiles_n, batch, sm_count):
        """Blocks: at most one an SM, in whole clusters (units of cm tile rows x 1 tile column)."""
        units = cdiv(tiles_m, self.cm) * tiles_n * batch
        return (self.cm * min(units, max(sm_count // self.cm, 1)), 1, 1)

    def __repr__(self):
        c = f", clusters of {self.cm} (B multicast)" if self.cm > 1 else ""
        c += ", ping-pong consumers" if self.pp else ""
        return f"TmaTile(128x{self.bn}, TMA + warp-specialised wgmma, stages {self.stages}{c})"


# gemm_tma replaces the 128x256 wgmma tile (WG_TILES[0] / WG_PERSIST_TILE) where the chooser picks it and
# the operands suit TMA (tuning.matmul.USE_TMA; _tma_problem): 4 stages of 48 KiB (a fifth does not fit
# the 227 KiB an SM offers a block). The graph API's fused GEMMs take it too where the plan has it
# (fused_tma: pydnn/graph builds their kernels from gemm_tma_body); the wgmma kernels stay for the RNN engine
# (which launches plan.fast itself), for fused GEMMs where no map encodes, and with USE_TMA off. Why WIDE (16-byte
# stores of interior tiles): the persistent blocks' epilogues land together, and whole-sector stores halve their L2
# writes; 16384x4096x4096 nn 1.011x torch.mm with it against 0.932x without (H200; the runs: tools/PERF.md "gemm").
TMA_TILE = TmaTile(256, 4, wide=True)
# Candidates measured before they replace TMA_TILE (their own units, bf16 only, in the build so the device
# runs can prebuild them; the chooser never takes them): the 2-CTA cluster sharing B by multicast (run 1: +1% on
# N = 4096, -2-3% on N = 11008; run 2: +0.3-0.5% on 8192^3 and N = 4096, -4% / -11% on N = 11008: not taken).
TMA_CANDIDATES = (TmaTile(256, 4, unit="matmul.tmac", cm=2),)
# The ping-pong candidate (unit matmul.tmapp.bf16; bench_matmul.py --fused --pp, not chosen): 128 x 128 tiles, one a
# consumer warpgroup, 7 stages of 32 KiB, so that a fused epilogue (a GELU's erff: ~3800 instructions a thread
# a tile) overlaps the other warpgroup's wgmmas (issue 22's fused gelu target: <= 1.05x the plain matmul).
# Measured (H200, 16384x4096x4096 nn, two runs): plain 1.040-1.042x gemm_tma's time, fused gelu 1.12-1.14x its
# own plain (gemm_tma's fused gelu 1.10-1.12x its plain): the overlap hides nothing (the epilogue's FP32 work
# competes with the running wgmmas; SM clocks equal, so not the power limit). tuning.matmul.FUSED_PP off.
# Session 30 (H200, both 7B shapes, nn): plain 1.082 / 1.084x gemm_tma's time, fused gelu 1.092 / 1.118x and
# relu 1.026 / 1.035x its own plain, again no better than the cooperative kernel's serialized epilogue.
# Session 31 (tools/gemm_timeline.py, clock64 stamps on every SM): the overlap happens (97.6-99.4% of each
# epilogue inside the other warpgroup's K loop, one warpgroup always in its K loop) but the GELU epilogue beside
# it slows that K loop from 40.0 to 43.4 kc a tile (37% of the epilogue's 9.2 kc), and the K loop itself runs at 82%
# of the tensor peak (32 KiB into the SM a 512-cycle K tile; the cooperative K loop 99.5%): per 128x256 of output
# 80.9 kc plain / 88.0 GELU against the cooperative 69.9 / 75.4. Not a candidate for the fused GEMMs any more.
TMA_PP_TILE = TmaTile(128, 7, unit="matmul.tmapp", wide=True, pp=True)
# Session 31's candidate for the ping-pong's plain deficit: the same consumers in 2-CTA clusters on tile rows 2i,
# 2i + 1 sharing B by multicast (gemm_tma_c with pp; unit matmul.tmappc.bf16, registered by pp_units()): 24 KiB of
# L2 reads a CTA a K tile, but still 32 KiB landing in each SM's shared memory. Measured (H200): 92 kc a 128x256
# worth, 1.235-1.239x gemm_tma's event time: worse than the 1-CTA ping-pong; kept only as a measured candidate.
TMA_PPC_TILE = TmaTile(128, 7, unit="matmul.tmappc", cm=2, wide=True, pp=True)


class SimtTile:
    """A gemm_simt (float, CUDA-core FMA) block tile: BM x BN of C from WARPS_M x WARPS_N warps of 16 SUBM x
    32 SUBN (a thread 4 SUBM x 4 SUBN outputs: 8 x 8 for the build's 2 x 2), K tiles of BK in two shared
    buffers; registers capped for `per_sm` blocks per SM (MINB); a grid of one wave of blocks (per_sm per SM)
    walks the (batch, tile) items. `eff` (k > SHORT_K) and `eff_short` (k <= SHORT_K): the FMA rate a full SM
    of these blocks reaches relative to the 128 x 128 tile (the chooser's weights, measured). `name`: a
    candidate's (tuning.matmul.SIMT_BIG; its units are matmul.f32c.<name>.<nn|nt|tn|tt>, simt_extra_units)."""

    def __init__(self, bm, bn, bk, per_sm, eff, eff_short=None, unit=None, subm=2, subn=2, name=None):
        self.bm, self.bn, self.bk, self.per_sm, self.eff = bm, bn, bk, per_sm, eff
        self.eff_short = eff if eff_short is None else eff_short
        self.subm, self.subn, self.name = subm, subn, name
        self.wm, self.wn = bm // (16 * subm), bn // (32 * subn)
        assert self.wm * 16 * subm == bm and self.wn * 32 * subn == bn, (bm, bn, subm, subn)
        self.threads = self.wm * self.wn * 32
        self.unit = unit  # the build's matmul.f32 where None (a candidate: unit_of)
        self.smem = 0     # static shared memory only

    def unit_of(self, ta, tb):
        """The unit holding this tile's kernel for (ta, tb): a candidate's own one-kernel unit, else t.unit or
        the build's matmul.f32."""
        if self.name is not None:
            return f"matmul.f32c.{self.name}.{'t' if ta else 'n'}{'t' if tb else 'n'}"
        return self.unit or "matmul.f32"

    def expr(self, tag="f32", ta=False, tb=False, vec=True):
        b = lambda v: "true" if v else "false"  # noqa: E731
        sub = f", {self.subm}, {self.subn}" if (self.subm, self.subn) != (2, 2) else ""
        return (f"pydnn::matmul::gemm_simt<{self.bm}, {self.bn}, {self.bk}, {self.wm}, {self.wn}, {self.per_sm}, "
                f"{b(ta)}, {b(tb)}{sub}>")

    def __repr__(self):
        sub = f", {4 * self.subm}x{4 * self.subn} a thread" if (self.subm, self.subn) != (2, 2) else ""
        return f"SimtTile({self.bm}x{self.bn}, bk {self.bk}, {self.per_sm} block(s)/SM{sub})"


# The float tiles (unit matmul.f32). ptxas (sm_90): 128x128 with MINB 1 uses 163-167 registers, no spills
# (MINB 2 caps it at 128 and spilled 20-32 bytes: 2% slower, tools/bench_matmul.py); 64x128 (4 warps)
# with MINB 3 159-165, no spills. Measured (H200, two runs): 4096^3 128x128 42.6-43.3 TFLOP/s, 64x128
# 37.5-40.0 (eff 0.87); on the Winograd shapes (k = 64-512) the 64x128 tile matches or beats the 128x128
# (28^2 32.1-32.5 vs 32.5-34.0, 14^2 37.9 vs 33.6, 7^2 34.2 vs 29.5: its 3 blocks per SM overlap each
# other's first loads and epilogues), so eff_short 1.0 and a tie goes to the smaller tile.
SIMT_TILES = (SimtTile(128, 128, 8, 1, 1.0), SimtTile(64, 128, 8, 3, 0.87, eff_short=1.0))
SHORT_K = 512
# Candidates for the large problems' tile (issue 22: fp32 without TF32 >= 0.9x cuBLAS; the 128x128 8x8 tile measured
# 0.80-0.84x), outside the build: one kernel unit each per transposition (simt_extra_units), chosen in place of
# SIMT_TILES[0] by every float plan (matmul, convolution, RNN) where tuning.matmul.SIMT_BIG names one (the rule at
# SIMT_BIG_WAVES). Measured in mid-session runs 2 and 3 (H200, 8192^3 nn / 7B 16384x4096x4096 nt /
# 16384x11008x4096 nt, ratios to cuBLAS without TF32; tools/PERF.md): with SimtTile(bm, bn, bk, per_sm, subm, subn)
# c1 (128, 128, 8, 2, 2, 4: 4 warps of 32 x 128, 8 x 16 a thread) 0.856 / 0.866 / 0.862; c2 (128, 128, 8, 2, 4, 2:
# 4 warps of 64 x 64) 0.911 / 0.894 / 0.890; c3 (128, 256, 8, 1, 2, 4) 0.917 / 0.870 / 0.869; c4 = c1 at BK 16 0.826
# / 0.809 / 0.810; c5 (256, 128, 8, 1, 4, 2) 0.916 / 0.916 / 0.917; c6 (128, 256, 8, 1, 4, 2) 0.928 / 0.920 / 0.919:
# adopted as SIMT_BIG_TILE. c2 and c5 stay (the runners-up, for the next comparison); the 64 x 64 warp tile paid
# most (c2 over c1, c6 over c3: +3-6%), the block's size or count an SM less.
SIMT_CANDIDATES = (SimtTile(128, 128, 8, 2, 1.0, subm=4, subn=2, name="c2"),
                   SimtTile(256, 128, 8, 1, 1.0, subm=4, subn=2, name="c5"))
# The large float GEMMs' tile, c6 (unit matmul.f32big, in the build): 128 x 256, 8 warps of 64 x 64, 16 x 8 outputs
# a thread (128 accumulators; 6 16-byte fragment loads for 128 FMAs a k step where 8 x 8 takes 4 for 64), one block
# an SM (ptxas sm_90: 241-251 registers, no spills), taken in the 128x128 tile's place where K > SHORT_K and its
# items fill SIMT_BIG_WAVES waves (tuning.matmul.SIMT_BIG "big"). Measured (H200, mid-session run 3, bench_matmul
# --f32, torch.mm without TF32 at 51-52 TFLOP/s): 8192^3 nn 47.4 TFLOP/s (0.928x cuBLAS; the 128x128 8x8 tile
# 0.838x), 7B x @ W^T 16384x4096x4096 46.9 (0.920x; 0.796x), 16384x11008x4096 48.0 (0.919x; 0.796x); every result
# bitwise cuBLAS's.
SIMT_BIG_TILE = SimtTile(128, 256, 8, 1, 1.0, unit="matmul.f32big", subm=4, subn=2)


def _simt_expr(ta, tb, tile=None):
    return (tile or SIMT_TILES[0]).expr("f32", ta, tb)


def simt_candidate_units(tiles=None, trans=TRANS):
    """The KernelUnits of SIMT_CANDIDATES (or `tiles`): one kernel each (tile, transposition), so that they
    compile in parallel."""
    return [KernelUnit(t.unit_of(tn[0] == "t", tn[1] == "t"), "matmul.cu", (t.expr("f32", tn[0] == "t", tn[1] == "t"),))
            for t in (SIMT_CANDIDATES if tiles is None else tiles) for tn in trans]


def simt_extra_units():
    """The SIMT_CANDIDATES units, registered with the loader (tests, benchmarks and tuning.matmul.SIMT_BIG;
    outside the build). Returns them."""
    units = simt_candidate_units()
    if units:
        loader.register_units(units)
    return units


def _simt_big():
    """The tile tuning.matmul.SIMT_BIG names: "big" SIMT_BIG_TILE, a SIMT_CANDIDATES name that candidate (its units
    registered), "" None."""
    name = tuning.matmul.SIMT_BIG
    if not name:
        return None
    if name == "big":
        return SIMT_BIG_TILE
    for t in SIMT_CANDIDATES:
        if t.name == name:
            simt_extra_units()
            return t
    raise ValueError(f"tuning.matmul.SIMT_BIG: {name!r} is neither 'big' nor a SIMT_CANDIDATES name "
                     f"({', '.join(t.name for t in SIMT_CANDIDATES)})")


def _choose_simt_tile(m, n, batch, sm_count, k=0):
    """The float tile with the least estimated time, as _choose_tile weighs the tensor-core ones (waves of
    per_sm x SMs items, each costing a full SM of that tile at its efficiency for this k); a tie goes to
    the smaller tile (less work idle in a partial last wave)."""
    best, best_cost = None, None
    for t in SIMT_TILES:
        items = cdiv(m, t.bm) * cdiv(n, t.bn) * batch
        slots = t.per_sm * max(sm_count, 1)
        cost = cdiv(items, slots) * t.per_sm * t.bm * t.bn / (t.eff_short if k <= SHORT_K else t.eff)
        if best_cost is None or cost < best_cost or (cost == best_cost and t.bm * t.bn < best.bm * best.bn):
            best, best_cost = t, cost
    return best


def _unit_name(tag, ta, tb):
    return f"matmul.{tag}.{'t' if ta else 'n'}{'t' if tb else 'n'}" if tag != "f32" else "matmul.f32"


def kernel_units():
    units = []
    for tag in ("f16", "bf16"):
        for tn in TRANS:
            ta, tb = tn[0] == "t", tn[1] == "t"
            exprs = [t.expr(tag, ta, tb, True) for t in TC_TILES] + [TC_GENERAL.expr(tag, ta, tb, False)]
            units.append(KernelUnit(_unit_name(tag, ta, tb), "matmul.cu", tuple(exprs)))
    units.append(KernelUnit("matmul.f32", "matmul.cu",
                            tuple(t.expr("f32", tn[0] == "t", tn[1] == "t") for t in SIMT_TILES for tn in TRANS)))
    units.append(KernelUnit(SIMT_BIG_TILE.unit, "matmul.cu",
                            tuple(SIMT_BIG_TILE.expr("f32", tn[0] == "t", tn[1] == "t") for tn in TRANS)))
    return (units + wgmma_units() + wgmma_units((WG_PERSIST_TILE,), "matmul.wgmmap") + split_units() + tma_units() +
            [u for t in TMA_CANDIDATES for u in tma_units((t,), t.unit, ("bf16",))])


def tma_units(tiles=(TMA_TILE,), name="matmul.tma", tags=("f16", "bf16")):
    """gemm_tma units (`tiles`, every transposition, one unit per type): sm_90a only."""
    return [KernelUnit(f"{name}.{tag}", "matmul.cu",
                       tuple(t.expr(tag, tn[0] == "t", tn[1] == "t") for t in tiles for tn in TRANS),
                       archs=(WG_ARCH + "a",))
            for tag in tags]


def pp_units():
    """The ping-pong candidate's unit (TMA_PP_TILE, bf16, every transposition), registered with the loader
    (benchmarks and tests; outside the build). Returns it."""
    units = tma_units((TMA_PP_TILE,), TMA_PP_TILE.unit, ("bf16",)) + tma_units((TMA_PPC_TILE,), TMA_PPC_TILE.unit,
                                                                              ("bf16",))
    loader.register_units(units)
    return units[0]


def _reduce_expr(tag):
    return f"pydnn::matmul::splitk_reduce<{CTYPE[tag]}>"


def split_units():
    """The split-K units (sm_90a): gemm_wgmma_s for every transposition and splitk_reduce, per type."""
    return [KernelUnit(f"matmul.wgmmas.{tag}", "matmul.cu",
                       tuple(WG_SPLIT_TILE.expr(tag, tn[0] == "t", tn[1] == "t") for tn in TRANS) + (_reduce_expr(tag),),
                       archs=(WG_ARCH + "a",))
            for tag in ("f16", "bf16")]


def _split_k(m, n, k, batch, sm_count, arch):
    """(splits, K elements a split) of a split-K plan, or None: sm_90 with USE_WGMMA and SPLIT_K, batch 1,
    the 128x256 tiles filling less than 3/4 of a wave, and at least 2 splits of SPLIT_MIN_KTILES K tiles.
    The split count: with SPLIT_WAVES the cheapest by SPLIT_ITEM_KT's model over any number of waves, else the
    most that fit one wave (at most SPLIT_MAX); every split but the last walks the same K tiles."""
    if not (tuning.matmul.SPLIT_K and tuning.matmul.USE_WGMMA and arch == WG_ARCH and batch == 1 and m and n):
        return None
    tiles = cdiv(m, 128) * cdiv(n, 256)
    sms = max(sm_count, 1)
    if 4 * tiles >= 3 * sms:
        return None
    kt = cdiv(k, BK)
    smax = min(kt // SPLIT_MIN_KTILES, SPLIT_MAX)
    if smax < 2:
        return None
    if tuning.matmul.SPLIT_WAVES:
        def cost(sp):
            return (cdiv(tiles * sp, sms) * (cdiv(kt, sp) + SPLIT_ITEM_KT)
                    + (SPLIT_REDUCE_KT * sp * tiles if sp > 1 else 0))
        ws = m * (n + (n & 1)) * 4  # bytes of one split's partials
        s = min((sp for sp in range(1, smax + 1) if sp == 1 or sp * ws <= SPLIT_WS_MAX), key=lambda sp: (cost(sp), sp))
    else:
        s = min(sms // tiles, smax)
    if s < 2:
        return None
    chunk = cdiv(kt, s)
    return cdiv(kt, chunk), chunk * BK


def wgmma_units(tiles=WG_TILES, name="matmul.wgmma"):
    """gemm_wgmma units (`tiles`, every transposition, one unit per type): compiled (and loadable) for sm_90
    devices only, as sm_90a."""
    return [KernelUnit(f"{name}.{tag}", "matmul.cu",
                       tuple(t.expr(tag, tn[0] == "t", tn[1] == "t") for t in tiles for tn in TRANS),
                       archs=(WG_ARCH + "a",))
            for tag in ("f16", "bf16") if tiles]


def wgmma_extra_units():
    """The WG_CANDIDATES units (one per candidate unit name and type, so that they compile in parallel),
    registered with the loader (tests and benchmarks; outside the build)."""
    for name in dict.fromkeys(t.unit for t in WG_CANDIDATES):
        loader.register_units(wgmma_units(tuple(t for t in WG_CANDIDATES if t.unit == name), name))


def extra_units(name, tiles, tags=("f16", "bf16"), trans=TRANS):
    """One unit per type holding `tiles` (cp.async path) for the transpositions `trans`, registered with the
    loader: candidates for tests and benchmarks, outside the build. Returns the unit name per tag."""
    units = []
    for tag in tags:
        exprs = [t.expr(tag, tn[0] == "t", tn[1] == "t", True) for t in tiles for tn in trans]
        units.append(KernelUnit(f"matmul.{name}.{tag}", "matmul.cu", tuple(exprs)))
    for t in tiles:
        t.unit = f"matmul.{name}"
    loader.register_units(units)
    return {tag: u.name for tag, u in zip(tags, units)}


def _choose_tile(m, n, batch, sm_count, arch=None, k=0):
    """The tile with the least estimated time: waves of (per_sm x SMs) blocks, each wave costing the
    work of a full SM of that tile at its efficiency. The wgmma tiles take part on sm_90 (USE_WGMMA)
    when they fill 3/4 of a wave and K >= WG_MIN_K (lone blocks with a short K loop are latency bound)."""
    best, best_cost = None, None
    wg = WG_TILES
    if tuning.matmul.WG_PERSIST:
        wg = tuple(WG_PERSIST_TILE if t is WG_TILES[0] else t for t in wg)
    min_k = {t: tuning.matmul.WG_PERSIST_MIN_K if t.persist else WG_MIN_K for t in wg}
    tiles = TC_TILES + (tuple(t for t in wg if k >= min_k[t]) if tuning.matmul.USE_WGMMA and arch == WG_ARCH else ())
    for t in tiles:
        blocks = cdiv(m, t.bm) * cdiv(n, t.bn) * batch
        slots = t.per_sm * sm_count
        if isinstance(t, WgTile) and 4 * blocks < 3 * slots:
            continue
        cost = cdiv(blocks, slots) * t.per_sm * t.bm * t.bn / t.eff
        if best_cost is None or cost < best_cost:
            best, best_cost = t, cost
    return best


# ----------------------------------------------------------------------------- argument checks

def _size(name, v, lo=0, hi=INT_MAX):
    if isinstance(v, bool) or not hasattr(v, "__index__"):
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{name}: expected an integer, got {type(v).__name__}")
    v = v.__index__()
    if v < lo or v > hi:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{name}: {v} is outside [{lo}, {hi}]")
    return v


def _flag(name, v):
    if v in (True, False, 0, 1) and not isinstance(v, float):
        return bool(v)
    raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{name}: expected True or False, got {v!r}")


def _dtype(v):
    if isinstance(v, bool) or not hasattr(v, "__index__"):
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"dtype: {v!r} is not a data type value")
    v = v.__index__()
    if v in ESIZE:
        return v
    if v in TAG:
        raise PydnnError(E.PYDNN_STATUS_NOT_SUPPORTED,
                         f"dtype: data type {v} is not supported by matmul (float, half, bfloat16)")
    raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"dtype: {v!r} is not a data type value")


def _ld(name, v, need):
    """A leading dim: at least the operand's contiguous extent (and 1); default the packed one."""
    if v is None:
        return max(need, 1)
    v = _size(name, v, 1, 2**62)
    if v < need:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{name}: {v} is less than the {need} elements of a row")
    return v


def _batches_apart(batch, stride, rows, cols, ld):
    """Whether the batches of C (rows x cols, row pitch ld, `stride` apart) are disjoint: one after another
    (stride past a whole matrix) or side by side within the row pitch (columns of one row, interleaved
    batches: Winograd's GEMMs write a [tile][position][channel] workspace this way)."""
    return stride >= (rows - 1) * ld + cols or (stride >= cols and (batch - 1) * stride + cols <= ld)


def _span(batch, stride, rows, cols, ld):
    """Elements from an operand's first element to one past its last (0 when empty)."""
    if rows == 0 or cols == 0:
        return 0
    return (batch - 1) * stride + (rows - 1) * ld + cols


# ----------------------------------------------------------------------------- plans

class _Launch:
    """One kernel of a plan: its unit and instantiation, grid, block, dynamic shared memory, and a params
    struct (with its argument array) whose pointer and scalar fields are patched per call."""

    __slots__ = ("unit", "expr", "grid", "block", "smem", "params", "args", "maps")

    def __init__(self, unit, expr, grid, block, smem, params):
        self.unit, self.expr, self.grid, self.block, self.smem = unit, expr, grid, block, smem
        self.params = params
        self.args = driver.kernel_args(params)
        self.maps = None  # gemm_tma: (A's, B's tensormap.MapCache); params is then a MatmulTmaParams

    def function(self, handle):
        return handle.function(self.unit, self.expr, self.smem)


class GemmPlan:
    """A validated GEMM problem and its launches (see gemm_plan). `launch` may be called any number of
    times, with any pointers, on any live handle of the same device."""

    __slots__ = ("dtype", "m", "n", "k", "trans_a", "trans_b", "lda", "ldb", "ldc", "batch", "stride_a",
                 "stride_b", "stride_c", "bias", "allow_tf32", "esize", "span_a", "span_b", "span_c",
                 "empty", "vec_ok", "pair_ok", "fast", "general", "split", "split_fast", "reduce", "ws_bytes",
                 "tma", "tma_off", "c16_ok")

    def describe(self):
        """(kernel expression, grid, block, smem) of the launch aligned pointers take (tests, benchmarks)."""
        if self.empty:
            return None
        r = self.tma or self.fast
        return r.expr, r.grid, r.block, r.smem

    def launch(self, handle, a, b, c, alpha=1.0, beta=0.0, bias=0, workspace=0, workspace_size=0):
        """C = alpha * op(A) op(B) + beta * C (+ bias) on the handle's stream (see the module docstring).
        A split-K plan (ws_bytes > 0) runs split when the caller's workspace holds ws_bytes (16-byte
        aligned), else as one launch of its whole-K tile: no call allocates (CUDA-graph capture)."""
        check_handle(handle)
        alpha = scalar("alpha", alpha)
        beta = scalar("beta", beta)
        if self.empty:
            return
        es = self.esize
        c = element_aligned(device_ptr(c, "c", self.span_c * es), "c", es)
        if self.k:
            a = element_aligned(device_ptr(a, "a", self.span_a * es), "a", es)
            b = element_aligned(device_ptr(b, "b", self.span_b * es), "b", es)
            _no_overlap(c, self.span_c * es, a, self.span_a * es, "a")
            _no_overlap(c, self.span_c * es, b, self.span_b * es, "b")
        else:
            a = b = 0
        flags = FLAG_BETA if beta != 0.0 else 0
        if self.bias:
            bias = element_aligned(device_ptr(bias, "bias", self.n * es), "bias", es)
            _no_overlap(c, self.span_c * es, bias, self.n * es, "bias")
            flags |= FLAG_BIAS
        elif bias:
            raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, "bias: given to a plan made with bias=False")
        if self.pair_ok and c % (2 * es) == 0:
            flags |= FLAG_PAIR
        rec = self.fast if (self.vec_ok and (a | b) & 15 == 0) else self.general
        if self.tma is not None and rec is self.fast:
            # the maps hold A's and B's base addresses: encoded once per address (MapCache), copied in
            t = self.tma
            f = t.function(handle)
            ma, mb = t.maps
            try:
                ba, bb = ma.get(a), mb.get(b)
            except (PydnnError, AttributeError, TypeError) as e:
                # no encoder (a CPU stand-in for the driver, bindings without cuTensorMapEncodeTiled) or a map
                # the driver refused: the plan keeps the wgmma kernel from now on (tma_off says why)
                self.tma, self.tma_off = None, f"{type(e).__name__}: {e}"
            else:
                q = t.params
                ctypes.memmove(q.map_a, ba, tensormap.MAP_BYTES)
                ctypes.memmove(q.map_b, bb, tensormap.MAP_BYTES)
                p = q.p
                p.a, p.b, p.c, p.bias = a, b, c, bias if self.bias else 0
                p.alpha, p.beta = alpha, beta
                p.flags = flags | FLAG_C16 if self.c16_ok and c % 16 == 0 else flags
                driver.launch_args(f, t.grid, t.block, t.smem, handle.cu_stream, t.args)
                return
        if self.split and rec is self.fast and workspace and workspace_size >= self.ws_bytes:
            ws = device_ptr(workspace, "workspace", self.ws_bytes)
            if ws % 16 == 0:
                p = self.split_fast.params
                p.a, p.b, p.c, p.bias, p.alpha, p.beta, p.flags = a, b, ws, 0, 1.0, 0.0, 0
                sf = self.split_fast
                driver.launch_args(sf.function(handle), sf.grid, sf.block, sf.smem, handle.cu_stream, sf.args)
                rec = self.reduce
                a = ws
        p = rec.params
        p.a, p.b, p.c, p.bias = a, b, c, bias if self.bias else 0
        p.alpha, p.beta, p.flags = alpha, beta, flags
        driver.launch_args(rec.function(handle), rec.grid, rec.block, rec.smem, handle.cu_stream, rec.args)



def _no_overlap(c, c_bytes, x, x_bytes, name):
    if c < x + x_bytes and x < c + c_bytes:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"c: its memory overlaps {name}'s (C must be separate memory)")


def _params(plan, tiles_m, tiles_n):
    p = MatmulParams()
    p.lda, p.ldb, p.ldc = plan.lda, plan.ldb, plan.ldc
    p.stride_a, p.stride_b, p.stride_c = plan.stride_a, plan.stride_b, plan.stride_c
    p.m, p.n, p.k, p.batch = plan.m, plan.n, plan.k, plan.batch
    p.tiles_m, p.tiles_n, p.group_m = tiles_m, tiles_n, min(GROUP_M, tiles_m)
    return p


def _tc_launch(plan, tag, tile, vec, sm_count=1):
    tm, tn = cdiv(plan.m, tile.bm), cdiv(plan.n, tile.bn)
    if tm * tn > INT_MAX:
        raise PydnnError(E.PYDNN_STATUS_NOT_SUPPORTED, f"m, n: {plan.m} x {plan.n} needs more than 2^31 - 1 tiles")
    grid = (tm * tn, 1, min(plan.batch, MAX_GRID_Z))
    if getattr(tile, "persist", False):  # one wave of blocks at most, walking (batch, tile) items
        grid = (min(tm * tn * plan.batch, tile.per_sm * max(sm_count, 1)), 1, 1)
    unit = f"{tile.unit}.{tag}" if tile.unit and vec else _unit_name(tag, plan.trans_a, plan.trans_b)
    return _Launch(unit, tile.expr(tag, plan.trans_a, plan.trans_b, vec),
                   grid, (tile.threads, 1, 1), tile.smem, _params(plan, tm, tn))


def _tma_problem(plan, tile=None):
    """Why gemm_tma cannot run plan's problem (text), or None: both operands' tensor maps must encode
    (tensormap.map_problem: 16-byte row pitches and batch strides, batches neither overlapping nor
    broadcast), and the grid's batch coordinate is an int."""
    tile = tile or TMA_TILE
    tag = TAG[plan.dtype]
    (bca, bra), (bcb, brb) = tile.map_shapes(plan.trans_a, plan.trans_b)
    ra, ca = (plan.k, plan.m) if plan.trans_a else (plan.m, plan.k)
    rb, cb = (plan.n, plan.k) if plan.trans_b else (plan.k, plan.n)
    if plan.k == 0:
        return "k = 0"
    why = (tensormap.map_problem(tag, ra, ca, plan.lda, plan.batch, plan.stride_a, bca, bra) or
           tensormap.map_problem(tag, rb, cb, plan.ldb, plan.batch, plan.stride_b, bcb, brb))
    if why:
        return why
    if plan.batch > INT_MAX:
        return "batch exceeds an int"
    return None


def _tma_launch(plan, tag, tile, sm_count):
    """gemm_tma's launch for plan (_tma_problem(plan) is None): one wave of blocks at most, the maps' fixed
    arguments kept (their bytes per base address: tensormap.MapCache), MatmulParams inside."""
    tm, tn = cdiv(plan.m, tile.bm), cdiv(plan.n, tile.bn)
    if tm * tn > INT_MAX:
        raise PydnnError(E.PYDNN_STATUS_NOT_SUPPORTED, f"m, n: {plan.m} x {plan.n} needs more than 2^31 - 1 tiles")
    (bca, bra), (bcb, brb) = tile.map_shapes(plan.trans_a, plan.trans_b)
    ra, ca = (plan.k, plan.m) if plan.trans_a else (plan.m, plan.k)
    rb, cb = (plan.n, plan.k) if plan.trans_b else (plan.k, plan.n)
    q = MatmulTmaParams()
    q.p = _params(plan, tm, tn)
    grid = tile.grid(tm, tn, plan.batch, sm_count)
    rec = _Launch(f"{tile.unit}.{tag}", tile.expr(tag, plan.trans_a, plan.trans_b), grid, (tile.threads, 1, 1),
                  tile.smem, q)
    rec.maps = (tensormap.MapCache(tensormap.TiledMap(tag, ra, ca, plan.lda, plan.batch, plan.stride_a, bca, bra)),
                tensormap.MapCache(tensormap.TiledMap(tag, rb, cb, plan.ldb, plan.batch, plan.stride_b, bcb, brb)))
    return rec


# tuning.matmul.SIMT_BIG's tile (SIMT_BIG_TILE by default) replaces the 128x128 tile where K > SHORT_K and its
# items fill at least SIMT_BIG_WAVES waves of its blocks (the regime it was measured in: 8192^3 and the 7B
# projections, 15-42 waves; the Winograd GEMMs (K <= 512) keep the build's tiles).
SIMT_BIG_WAVES = 2


def _simt_launch(plan, sm_count):
    t = _choose_simt_tile(plan.m, plan.n, plan.batch, sm_count, plan.k)
    if t is SIMT_TILES[0]:
        big = _simt_big()
        if big is not None and plan.k > SHORT_K and (cdiv(plan.m, big.bm) * cdiv(plan.n, big.bn) * plan.batch >=
                                                     SIMT_BIG_WAVES * big.per_sm * max(sm_count, 1)):
            t = big
    tm, tn = cdiv(plan.m, t.bm), cdiv(plan.n, t.bn)
    if tm * tn > INT_MAX:
        raise PydnnError(E.PYDNN_STATUS_NOT_SUPPORTED, f"m, n: {plan.m} x {plan.n} needs more than 2^31 - 1 tiles")
    grid = (min(tm * tn * plan.batch, t.per_sm * max(sm_count, 1)), 1, 1)  # one wave of persistent blocks
    return _Launch(t.unit_of(plan.trans_a, plan.trans_b), t.expr("f32", plan.trans_a, plan.trans_b), grid,
                   (t.threads, 1, 1), 0,
                   _params(plan, tm, tn))


def gemm_plan(handle, dtype, m, n, k, trans_a=False, trans_b=False, lda=None, ldb=None, ldc=None, batch=1,
              stride_a=0, stride_b=0, stride_c=0, bias=False, allow_tf32=False, split_k=False):
    """Validate a GEMM problem and choose its kernels (see the module docstring). Raises PydnnError
    naming the argument; touches no GPU memory. split_k: the plan may cut K into splits (WG_SPLIT_TILE;
    two launches through the caller's workspace of ws_bytes, passed to plan.launch; without it, or for callers
    that take plan.fast's record like the RNN engine, the whole-K launch plan.fast)."""
    check_handle(handle)
    pl = GemmPlan()
    pl.dtype = _dtype(dtype)
    pl.esize = ESIZE[pl.dtype]
    pl.m, pl.n, pl.k = _size("m", m), _size("n", n), _size("k", k)
    pl.trans_a, pl.trans_b = _flag("trans_a", trans_a), _flag("trans_b", trans_b)
    pl.bias, pl.allow_tf32 = _flag("bias", bias), _flag("allow_tf32", allow_tf32)
    m, n, k = pl.m, pl.n, pl.k
    pl.lda = _ld("lda", lda, m if pl.trans_a else k)
    pl.ldb = _ld("ldb", ldb, k if pl.trans_b else n)
    pl.ldc = _ld("ldc", ldc, n)
    pl.batch = _size("batch", batch, 1)
    pl.stride_a = _size("stride_a", stride_a, 0, 2**62)
    pl.stride_b = _size("stride_b", stride_b, 0, 2**62)
    pl.stride_c = _size("stride_c", stride_c, 0, 2**62)
    if pl.batch > 1 and m and n and not _batches_apart(pl.batch, pl.stride_c, m, n, pl.ldc):
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM,
                         f"stride_c: {pl.stride_c} makes the {pl.batch} batches of C overlap "
                         f"(at least {(m - 1) * pl.ldc + n} needed, or batches side by side within a row: "
                         f"stride_c >= {n} and (batch - 1) * stride_c + {n} <= ldc)")
    ra, ca = (k, m) if pl.trans_a else (m, k)
    rb, cb = (n, k) if pl.trans_b else (k, n)
    pl.span_a = _span(pl.batch, pl.stride_a, ra, ca, pl.lda)
    pl.span_b = _span(pl.batch, pl.stride_b, rb, cb, pl.ldb)
    pl.span_c = _span(pl.batch, pl.stride_c, m, n, pl.ldc)
    pl.empty = m == 0 or n == 0
    one = pl.batch == 1
    pl.pair_ok = pl.ldc % 2 == 0 and (one or pl.stride_c % 2 == 0)
    pl.c16_ok = pl.esize == 2 and pl.ldc % 8 == 0 and (one or pl.stride_c % 8 == 0)
    pl.fast = pl.general = pl.reduce = pl.split_fast = pl.tma = pl.tma_off = None
    pl.split, pl.ws_bytes = None, 0
    pl.vec_ok = False
    if pl.empty:
        return pl
    tag = TAG[pl.dtype]
    if tag == "f32":
        pl.fast = pl.general = _simt_launch(pl, handle.sm_count)
        return pl
    # cp.async moves 16-byte chunks: every row (and batch) start of A and B must be 16-byte aligned.
    pl.vec_ok = all(v % 8 == 0 for v in (pl.lda, pl.ldb)) and (one or (pl.stride_a % 8 == 0 and
                                                                     pl.stride_b % 8 == 0))
    sp = _split_k(m, n, k, pl.batch, handle.sm_count, handle.arch) if split_k and pl.vec_ok else None
    # fast: the whole-K launch, also what a split-K plan runs without a workspace (and what the RNN engine
    # launches itself from the record)
    tile = _choose_tile(m, n, pl.batch, handle.sm_count, handle.arch, k)
    pl.fast = _tc_launch(pl, tag, tile, True, handle.sm_count)
    if _use_tma(pl, tile, handle.arch):
        t = _tma_tile()
        pl.tma = _tma_launch(pl, tag, t if t.cm == 1 or tag == "bf16" else TMA_TILE, handle.sm_count)  # (tmac: bf16)
    if sp is not None:
        _split_launches(pl, tag, sp, handle.sm_count)
    pl.general = _tc_launch(pl, tag, TC_GENERAL, False)
    return pl


def _use_tma(pl, tile, arch):
    """Whether plan pl runs gemm_tma (in place of the 128x256 wgmma tile the chooser picked)."""
    return (tuning.matmul.USE_TMA and arch == WG_ARCH and pl.vec_ok and
            (tile is WG_TILES[0] or tile is WG_PERSIST_TILE) and _tma_problem(pl, _tma_tile()) is None)


def _tma_tile():
    """The gemm_tma tile plans take (TMA_TILE; tests and benchmarks patch this to run a candidate)."""
    return TMA_TILE


# A probe address for fused_tma's test encoding (16-byte aligned; cuTensorMapEncodeTiled reads no memory).
_PROBE_ADDRESS = 1 << 24


def fused_tma(handle, plan, red=False):
    """(tile, launch record) of gemm_tma for a GEMM with a fused epilogue (pydnn/graph's FusedMatmulStep builds
    its kernel from gemm_tma_body with the tile; H200, 16384x4096x4096 bf16, fused gelu(x @ W + b): 0.883 ms on
    gemm_tma against 0.955 on gemm_wgmma_p in the same run, bench_matmul.py --fused --wg), or None: where the
    plain planner runs gemm_tma (plan.tma), with the 1-CTA tile (the cluster candidate has no epilogue form), and
    the driver encodes the plan's maps (tried once at a probe address: no encoder, as on a CPU stand-in, keeps
    the caller on plan.fast's wgmma tile, since the fused unit then holds no wgmma kernel to fall back on at
    execute; red: the epilogue reduces rows, which the ping-pong candidate cannot). The record is the caller's
    own (its params patched per call; rec.maps encode A and B once per base address)."""
    if plan.tma is None:
        return None
    tile = TMA_PP_TILE if tuning.matmul.FUSED_PP and not red else _tma_tile()
    # (red: a row reduction epilogue; the ping-pong cluster candidate has an epilogue form, the cooperative one not)
    tile = tile if (tile.cm == 1 or tile.pp) and not (red and tile.pp) else TMA_TILE
    if _tma_problem(plan, tile) is not None:  # (another tile than the plan's: its own boxes)
        return None
    rec = _tma_launch(plan, TAG[plan.dtype], tile, handle.sm_count)
    try:
        for cache in rec.maps:
            cache.map.encode(_PROBE_ADDRESS)
    except (PydnnError, AttributeError, TypeError):
        return None
    return tile, rec


def _split_launches(pl, tag, sp, sm_count):
    """The split-K launches of plan pl: gemm_wgmma_s (batch = the splits, C = the fp32 partials at row pitch
    ldw, n rounded up to even) and splitk_reduce into C."""
    s, ks = sp
    t = WG_SPLIT_TILE
    tm, tn = cdiv(pl.m, t.bm), cdiv(pl.n, t.bn)
    ldw = pl.n + (pl.n & 1)
    p = _params(pl, tm, tn)
    p.batch, p.k_split, p.ldc, p.stride_c, p.stride_a, p.stride_b = s, ks, ldw, pl.m * ldw, 0, 0
    unit = f"{t.unit}.{tag}"
    pl.split_fast = _Launch(unit, t.expr(tag, pl.trans_a, pl.trans_b), (min(tm * tn * s, t.per_sm * max(sm_count, 1)), 1, 1),
                      (t.threads, 1, 1), t.smem, p)
    r = _params(pl, tm, tn)
    r.batch, r.lda, r.stride_a = s, ldw, pl.m * ldw
    pairs = pl.m * ((pl.n + 1) // 2)
    pl.reduce = _Launch(unit, _reduce_expr(tag), (max(1, min(cdiv(pairs, 256), 8 * max(sm_count, 1))), 1, 1),
                        (256, 1, 1), 0, r)
    pl.split, pl.ws_bytes = sp, s * pl.m * ldw * 4


def gemm(handle, dtype, m, n, k, a, b, c, alpha=1.0, beta=0.0, trans_a=False, trans_b=False, lda=None, ldb=None,
         ldc=None, batch=1, stride_a=0, stride_b=0, stride_c=0, bias=False, allow_tf32=False, bias_ptr=0):
    """gemm_plan(...) kept in the handle, then plan.launch(handle, a, b, c, alpha, beta, bias_ptr).

    `bias` is the flag of gemm_plan (a bias vector is added); pass its device pointer as `bias_ptr`. As a
    shorthand, a non-boolean `bias` (a pointer or buffer) means bias=True with that pointer."""
    if not isinstance(bias, bool) and bias not in (0, None):
        bias, bias_ptr = True, bias
    elif bias is None:
        bias = False
    plan = cached_plan(handle, dtype, m, n, k, trans_a, trans_b, lda, ldb, ldc, batch, stride_a, stride_b, stride_c,
                       bias, allow_tf32)
    plan.launch(handle, a, b, c, alpha, beta, bias_ptr)


def cached_plan(handle, dtype, m, n, k, trans_a=False, trans_b=False, lda=None, ldb=None, ldc=None, batch=1,
                stride_a=0, stride_b=0, stride_c=0, bias=False, allow_tf32=False):
    """gemm_plan(...) remembered in the handle per argument tuple: a plan holds no pointers (launch takes
    them), so a repeated problem skips the validation and the tile choice (~0.1 ms of Python per plan)."""
    key = ("matmul", dtype, m, n, k, trans_a, trans_b, lda, ldb, ldc, batch, stride_a, stride_b, stride_c,
           bias, allow_tf32)
    try:
        plan = handle.prepared.get(key)
    except AttributeError:
        plan = None  # not a handle: gemm_plan says so
    except TypeError:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, "gemm: an argument is not a plain value (unhashable)") from None
    if plan is None:
        plan = gemm_plan(handle, dtype, m, n, k, trans_a, trans_b, lda, ldb, ldc, batch, stride_a, stride_b,
                         stride_c, bias, allow_tf32)
        handle.remember(key, plan)
    return plan
