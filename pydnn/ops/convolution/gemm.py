"""Convolution through explicit GEMMs (ptx/conv_gemm.cu): the forward GEMM algorithm
(CUDNN_CONVOLUTION_FWD_ALGO_GEMM), the explicit-GEMM form of backward data (BWD_DATA_ALGO_1 where the
tensor-core implicit GEMM refuses, e.g. C % 8 != 0 or float data) and the backward filter
BWD_FILTER_ALGO_3 (explicit GEMMs into partial dw's + a fixed-order fold).

Forward: an im2col of x into the workspace, then a GEMM. The column matrix col[N * OD * OH * OW][ld]
(ld >= groups * C/g * T * R * S: see ptx/conv_gemm_params.h) times the filter viewed as a (K, ld) matrix:
    * half / bfloat16, one group, math type not FMA: ld rounded up to a multiple of 8 (zero columns) and,
      unless the caller's filter already is that matrix (NHWC, packed, C * taps % 8 == 0), the filter
      packed into the workspace too (pack_filter); the GEMM is a 1x1, stride-1 convolution of the column
      matrix on the family's tensor-core kernel (fwd_tc / fwd_wgmma), so y's strides, alpha / beta and
      the fused bias + activation epilogue are that kernel's own. The 7x7 stem (C = 3, 147 columns) gets
      tensor cores this way.
    * half / bfloat16 1x1 problems (issue 18; mm16_ok: one group, math type not FMA, tuning.conv_gemm.MM_1X1):
      pydnn.ops.matmul, no tensor-core view. Stride 1, unpadded, x and y matrices of one layout: one matmul
      on x itself (`direct`, no workspace; NHWC images one after another are ONE GEMM of N * P rows, so the
      tiles run over all images at once: y[N*P x K] = x[N*P x C] . W^T); strided or padded ones keep the
      gather + the implicit view (gather + matmul measured no faster than fwd_wgmma, below). Several taps
      (tuning.conv_gemm.MM_COLS): the column matrix on matmul where the model (mm16_ms) is faster than the
      view's estimate, else the view. The fused call (bias, z, activation) on a direct plan runs the
      tensor-core implicit GEMM of the problem itself (matmul has no activation epilogue). Get..._v7 ranks
      FWD_ALGO_GEMM against IMPLICIT_PRECOMP_GEMM by mm16_ms / the implicit model; Find times both.
    * float, one group, y with packed spatial dims (NCHW-like or NHWC-like): pydnn.ops.matmul (the
      CUDA-core gemm_simt, 128 x 128 tiles), one GEMM per image (its batch); alpha / beta are the GEMM's.
      A ConvolutionBiasActivationForward call (bias, z, activation) runs the 1x1 convolution instead (the
      CUDA-core implicit GEMM's epilogue), over the same workspace.
    * otherwise (double, groups, FMA math, odd y strides): the 1x1 convolution on the CUDA-core implicit GEMM.
Backward data, BWD_DATA_ALGO_1 where the tensor-core implicit GEMM refuses (plans.plan_for), for
problems with C < 64 or a stride (where the CUDA-core gather of ALGO_0 wastes most of its 64-wide tile or
its taps), one group, float / half / bfloat16 (16-bit: math type not FMA): col = dy . filter, then
col2im: each dx element sums its own taps in a fixed order (deterministic, no atomics) with alpha / beta.
The GEMM is pydnn.ops.matmul (tensor cores for 16-bit data, gemm_simt for float), one GEMM per image
(dy NCHW-like or NHWC-like with packed spatial dims; the filter packed into the workspace unless it
already is the (K, ld) matrix). A 1x1, stride-1, unpadded problem (any C) whose dx and dy read as matrices
of one layout needs no column matrix: one matmul per image straight into dx, alpha / beta its own, no
workspace (`direct`: NCHW-like dx_n[C x P] = W^T[C x K] . dy_n[K x P], the filter shared (batch stride
0); NHWC-like dx_n[P x C] = dy_n[P x K] . W[K x C]). Without it, fp32 1x1 backward data with C >= 64 has
only the col2im round trip (not worth it there) or the CUDA-core ALGO_0: 4.3-5.9 TFLOP/s on the ResNet
1x1 layers (H200) against the direct GEMM's 29.1-34.7 (H100 80GB; Performance below).
BWD_DATA_ALGO_0 for half / bfloat16 1x1, stride-1, unpadded problems (issue 18; plan_backward_data_mm16,
before the CUDA-core gather in ALGO_0's candidates): the direct matmul dx[N*P x C] = dy[N*P x K] . W,
deterministic, no workspace; the gather serves the rest (the col + col2im form measured 8x slower than
ALGO_1's phases on the strided 1x1 layers). So Get..._v7 ranks the GEMM form (ALGO_0) against the
implicit GEMMs (ALGO_1) and Find times both.
Measured (H200, tools/bench_conv1x1.py, CUDA-graph device time, ms; implicit / matmul / cuDNN): forward
N128 512->256 @28 0.132 / 0.085 / 0.048, 512->2048 @7 0.056 / 0.041 / 0.024, 1024->256 @14 0.050 / 0.042 /
0.022, N32 512->2048 @7 0.0192 / 0.0147 / 0.0081; backward data N128 512->256 @28 0.193 / 0.117 / 0.053,
2048->512 @7 0.056 / 0.042 / 0.024. The matmul loses where its tiles fit badly (N = 64 outputs: 256->64
forward 0.101 / 0.152; K < 512 with few tiles: N32 256->1024 backward data 0.0145 / 0.0258): mm16_ms ranks
them (27 of 29 measured picks right; the misses within 1.8x).
Backward filter, BWD_FILTER_ALGO_3: dw[K, C * taps] = sum over images and positions of dy[K, pos] .
col[pos, C * taps] (col: the forward's im2col of x, columns padded to a multiple of 8 for the 16-bit
tensor-core GEMMs; for a 1x1, stride-1, unpadded problem whose x reads as a matrix, x itself). The
reduction is long and dw small, so the GEMMs write partial dw's into the workspace and wgrad_fold sums
them in a fixed order (ascending partial index) with alpha / beta through dw's strides: deterministic,
bitwise reproducible. Where dy's images follow one another as rows (NHWC-like, packed) and so does the
column source (col always; x when NHWC-like), the whole reduction is one matrix, split into `s` equal
parts (a divisor of the rows near one wave of blocks, _splits; a short tail in one more partial when none
divides) as one batched matmul. NCHW-like dy under an im2col is first made channel-major by pack_rows
([K][images * positions]) so that it is such a matrix too; 1x1 problems on x itself with NCHW-like x or
dy take one partial per image (batch = images, no copy). Images go in chunks: im2col (+ the packed dy) of
at most COL_LIMIT bytes per chunk, each chunk with partials of its own; per-image plans over more than
PART_LIMIT bytes of partials add later chunks into the first chunk's partials (beta 1, in chunk order).
The partials are the data type's (matmul writes C in it): float exact; half / bfloat16 products are
summed in fp32 within a partial, then each partial is rounded once before the fp32 fold. The partials are
[K x columns] or, where gemm_simt's 64 x 128 tiles waste less that way (K > columns), [columns x K]
(`orient`). Refused (NOT_SUPPORTED, with the reason): double (matmul has no double kernel), groups > 1,
16-bit data with the FMA math type, dy without packed spatial dims.
ALGO_3's implicit variant (plan_wgrad_implicit, WgradImplicitPlan; its numbers below): float problems of at most
IMPLICIT_MAX_COLS (160) columns (C * taps: the 7x7 stem's 147) that are not the 1x1 stride-1 ones read
as x itself, with every x / dy offset within 32 bits, run no im2col, no pack and no matmul: one kernel,
wgrad_implicit (ptx/conv_gemm.cu), whose block owns a 64 (k) x 160 (column) tile of dw for a slot of
consecutive pixels (n, od, oh, ow), gathers each stage's 16 pixels' columns from x (zeros for the
padding) and dy rows into shared memory with cp.async and runs an fp32 FMA register-tiled product (no
TF32), then writes its partial [K x columns]; wgrad_fold sums the slots' partials in ascending order, as
above (deterministic, bitwise reproducible). Slots: about one wave of WI_MINB blocks per SM. What it
refuses (16-bit data, more columns, x as a matrix, 64-bit offsets; IMPLICIT = False) takes the explicit
GEMMs; NHWC / strided x and dy, dilation, CONVOLUTION mode, 1-d / 3-d and any K (tiles of 64) it serves.

Workspace: the column matrix (N * OD * OH * OW * ld elements; rounded up to 16 bytes, or to 256 when the
packed filter (K * ld elements) follows it); reported exactly by Get...WorkspaceSize. Deterministic
(one writer per element, sums in a fixed order). Backward filter: the partials (parts * K * columns
elements), then one chunk's column matrix, then its packed dy, each part on a 256-byte boundary; the
direct backward data needs none; the implicit variant only the partials (slots * K * columns elements).

StepPlan (plans.py) is the shape of a multi-launch plan that plans.run_plan hands to `.launch`; the
explicit-GEMM plans here, WINOGRAD_NONFUSED (winograd.py) and FFT (fft.py) use it.

Performance (the numbers that decided the design above; which version brought what, the predictions made
before each device run, the variants tried and dropped, and the old text of these notes:
tools/notes/convolution.md). The stem is 7x7/2 3->64 @224, N = 64: 15.1 GFLOP; cuDNN runs through PyTorch
in the same run as the pydnn numbers; TFLOP/s.
  Forward and backward data (H200). im2col works per block of 32 rows x 512 columns, each column's offsets
     and each row's base decomposed once into shared memory: an im2col decomposing every element with
     integer divisions was instruction-bound (~1.3 ms of the forward's 1.6). col2im visits only the taps
     that meet an output (first_tap, then steps of stride / gcd(stride, dil)) instead of testing all 49
     with a division each. The 16-bit forward GEMM is the tensor-core 1x1 view (fwd_tc over the 152
     columns 0.227 ms against matmul's gemm_tc 128x128 0.296); 16-bit backward data keeps matmul (gemm_tc
     128x256 0.410 ms against the 1x1 view of dy's implicit_gemm_pipe_tc 128x64 0.496). Not kept, each
     measured slower: 4 gathers in flight per im2col thread, col2im's innermost taps as a counted unrolled
     run (~0.12 ms slower), backward data as the tensor-core 1x1 forward of dy with W^T packed.
     Stem: bf16 fwd 26.9 (0.80x cuDNN's 33.6), bwd data 19.7 (1.06x of 18.5); fp32 fwd 18.2 (0.88x of
     20.6), bwd data 11.0 (0.71x of 15.5: gemm_simt 1.05 ms with 147 of 256 tile columns used + col2im
     0.33). fp32 1x1 forward (the direct GEMM, no im2col): 256->64 @56 35.3 (0.93x; IMPLICIT_GEMM 6.6),
     64->256 28.1 (1.03x; 4.2). Where the time goes: im2col 0.34 ms (bf16 and fp32 alike: latency-bound,
     1.4 TB/s at fp32), col2im 0.33-0.35 ms.
  The direct 1x1 backward data and the explicit BWD_FILTER_ALGO_3 (H100 80GB, cuDNN 9.19; pydnn / cuDNN):
       1x1 256->64 @56  bwd data (ALGO_1 direct)  29.1 / 16.5 = 1.76x   bwd filter (ALGO_3)  19.2 / 11.1 = 1.73x
       1x1 64->256 @56  bwd data (ALGO_1 direct)  34.7 / 25.2 = 1.38x   bwd filter (ALGO_3)  19.2 / 18.2 = 1.05x
       7x7/2 stem bf16  bwd filter (ALGO_3, tensor-core matmul over 152 columns, NHWC dy in place)
                                                  30.3 / 47.2 = 0.64x   (ALGO_1 2.5)
     The explicit fp32 stem backward filter: 1.24 ms, 12.2 = 0.65x (per 64 images: im2col ~0.35 ms,
     pack_rows 0.19, gemm_simt 64 x 128 0.66, fold 0.02). Its GEMM runs at ~40 TFLOP/s of tile work, 23
     useful (147 of 256 columns), so ~1.0 ms is the floor of that form: what serves the stem is the
     implicit variant below. COL_LIMIT: one 64-image chunk (1 GiB, 653 MiB workspace) 1.178 ms, the default
     256 MiB (three chunks, 243 MiB) 1.243, 64 MiB (eleven) 1.532. The 1x1 backward filter's per-image
     matmul takes matmul's 128 x 128 tile (m = 64: half idle, 64 blocks on 132 SMs; 0.336 ms, each lone
     block at ~93% of a full SM's rate): matmul's chooser, shared with other families, decides.
     The model (tile_ms, LONE_BLOCK_SPEED) put that 1x1 ALGO_3 at 0.553 ms (measured 0.34) and the stem
     at 1.8 (1.24): slow but ranked right.
  The implicit variant (the fp32 stem's backward filter; H100 80GB, cuDNN 9.19). Block (slot, column tile,
     K tile) = 64 k x 160 columns (147 used: 92%) over a slot of pixels, 160 threads (5 warps, each 64 k x
     32 columns; a thread 8 x 8 as gemm_simt's, four 16-byte shared loads per 64 FMAs per pixel); per
     stage of 16 pixels each thread gathers one column (its channel / tap decomposed once, in registers;
     the pixels' origins in shared memory, decoded one stage ahead by 16 threads) with 4-byte cp.async
     (zero fill in the padding) and the dy rows (pixels innermost for NCHW-like dy: coalesced); three
     stage buffers (44 KB, static), two stages' gathers in flight during a stage's FMAs. It moves ~0.26 GB
     (x 38.5 MB + dy 205.5 MB read once, partials 15 MB written and read by the fold; 16.4 GFLOP of tile
     work) against the explicit form's ~1.6 GB, so it is compute-bound. Measured: whole ALGO_3 0.659 ms =
     22.9 TFLOP/s, 1.23x cuDNN's 18.6 (the explicit form 1.246 ms, 12.1); wgrad_implicit alone 0.640 ms
     (25.7 TFLOP/s of tile work: IMPLICIT_TFLOPS 26, ~38% of the FMA peak), the fold of 396 partials
     0.013. WI_MINB 3: MINB 4 (96 registers) was 3% faster (0.610 / 0.638 ms kernel / whole) but spills
     212 bytes on sm_80. WI_WAVES 1: two waves of slots 0.70 ms, four 0.78 (the fold of 1568 partials
     0.101). Not profiled; the likely limit (an estimate) is the L1 / shared-memory pipe: per pixel a warp
     issues four 16-byte operand loads for 64 FMAs plus ~1.4 gather copies whose lanes touch 5-10 sectors
     each, with a barrier per 16 pixels. Levers left: 32-pixel stages (dynamic shared memory past 48 KB:
     StepPlan launches static shared only), a per-stage x patch reused by the column reads.
  Get..._v7's first choice was Find's fastest (1.00x) on every layer and direction above (bf16 1x1 64->256
     backward filter: ALGO_1 0.071 ms against Find's fastest, ALGO_3, 0.070: 1.02x).
"""
import ctypes
import math

from ... import enums as E
from ... import tuning
from ..._build.params import FLAG_NAN_PROP, kernel_params
from ..._cuda import driver
from ...status import PydnnError
from .. import matmul
from .._elementwise import CTYPE
from ..common import FLOAT_TAGS, cdiv, prod
from .plans import kernel_units as _family_units, IM2COL_GBPS, LAUNCH_MS, StepPlan, SubGemm, add_kernels, estimate_ms, planner, register, round_up, tma_plan
from .problem import DIR_BWD_DATA, DIR_BWD_FILTER, DIR_FWD, INT_MAX, TC_TAGS, algo_name, tc_refusal
from .problem import FLAG_BIAS, FLAG_Z

NS = E.PYDNN_STATUS_NOT_SUPPORTED
FLAG_FLIP = 16
FLAG_C2I_BETA, FLAG_C2I_CLAST = 1, 2
# The heuristic's rates for pydnn.ops.matmul (a ranking, not a promise): gemm_simt's 128 x 128 float tile
# (25.5 TFLOP/s measured on 4096^3, one block per SM), the tensor-core GEMMs' rate and their memory rate.
SIMT_TILE_TFLOPS = 25.0
MM_TC_TFLOPS = 150.0
MM_GBPS = 2500.0
IM2COL_ROWS, IM2COL_COLS = 32, 512   # im2col's block: rows x columns (ptx/conv_gemm.cu)
MM_TAGS = ("f32", "f16", "bf16")   # the data types pydnn.ops.matmul runs
SMALL_C = 64   # backward data: the explicit GEMM serves C < SMALL_C (the CUDA-core gather's N tile) or stride > 1


@kernel_params("conv_gemm_params.h", "Im2colParams")
class Im2colParams(ctypes.Structure):
    _fields_ = [
        ("x", ctypes.c_void_p), ("col", ctypes.c_void_p),
        ("batch", ctypes.c_int), ("groups", ctypes.c_int), ("cg", ctypes.c_int), ("taps", ctypes.c_int),
        ("in_size", ctypes.c_int * 3), ("out_size", ctypes.c_int * 3), ("filt", ctypes.c_int * 3),
        ("pad", ctypes.c_int * 3), ("stride", ctypes.c_int * 3), ("dil", ctypes.c_int * 3),
        ("cin_inner", ctypes.c_int), ("flags", ctypes.c_uint),
        ("xs", ctypes.c_longlong * 5), ("cols", ctypes.c_longlong), ("ld", ctypes.c_longlong),
    ]


@kernel_params("conv_gemm_params.h", "PackFilterParams")
class PackFilterParams(ctypes.Structure):
    _fields_ = [
        ("w", ctypes.c_void_p), ("out", ctypes.c_void_p),
        ("k", ctypes.c_int), ("cg", ctypes.c_int), ("taps", ctypes.c_int), ("cin_inner", ctypes.c_int),
        ("filt", ctypes.c_int * 3), ("pad_", ctypes.c_int),
        ("ws", ctypes.c_longlong * 5), ("cols", ctypes.c_longlong), ("ld", ctypes.c_longlong),
    ]


@kernel_params("conv_gemm_params.h", "Col2imParams")
class Col2imParams(ctypes.Structure):
    _fields_ = [
        ("col", ctypes.c_void_p), ("dx", ctypes.c_void_p),
        ("batch", ctypes.c_int), ("c", ctypes.c_int), ("taps", ctypes.c_int), ("cin_inner", ctypes.c_int),
        ("in_size", ctypes.c_int * 3), ("out_size", ctypes.c_int * 3), ("filt", ctypes.c_int * 3),
        ("pad", ctypes.c_int * 3), ("stride", ctypes.c_int * 3), ("dil", ctypes.c_int * 3),
        ("tap_step", ctypes.c_int * 3), ("out_step", ctypes.c_int * 3),
        ("flags", ctypes.c_uint), ("alpha", ctypes.c_float), ("beta", ctypes.c_float), ("pad_", ctypes.c_int),
        ("xs", ctypes.c_longlong * 5), ("ld", ctypes.c_longlong), ("total", ctypes.c_longlong),
    ]


def _expr(kernel, tag):
    return f"pydnn::conv_gemm::{kernel}<{CTYPE[tag]}>"


def _units():
    for t in FLOAT_TAGS:
        add_kernels(f"conv_gemm.{t}", "conv_gemm.cu",
                    tuple(_expr(k, t) for k in ("im2col", "pack_filter", "col2im", "pack_rows", "wgrad_fold"))
                    + ((_implicit_expr(WI_MINB),) if t == "f32" else ()))


def _packed_filter(pb):
    """The filter's column order (cin_inner) when it is a packed (K, C/g * taps) matrix, else None."""
    taps = prod(pb.filt3)
    ws = pb.ws
    if pb.w_format == E.PYDNN_TENSOR_NHWC:
        want = (taps * pb.cg, 1, pb.filt3[1] * pb.filt3[2] * pb.cg, pb.filt3[2] * pb.cg, pb.cg)
        inner = 1
    else:
        want = (pb.cg * taps, taps, pb.filt3[1] * pb.filt3[2], pb.filt3[2], 1)
        inner = 0
    # spatial dims of size 1 may carry any stride (they are never stepped)
    ok = all(ws[i] == want[i] or (i >= 2 and pb.filt3[i - 2] == 1) for i in range(5)) and (ws[1] == want[1] or pb.cg == 1)
    return inner if ok else None


def _spatial_unit(strides3, sizes3):
    """The stride of one step of the flattened (d, h, w) position when the spatial dims are packed
    row-major over it (0 when every spatial size is 1: any unit), else None."""
    unit = None
    expect = None
    for s, n in zip(reversed(strides3), reversed(sizes3)):
        if n == 1:
            continue
        if unit is None:
            unit, expect = s, s
        if s != expect:
            return None
        expect = s * n
    return 0 if unit is None else unit


def _add_im2col(pl, pb, inner, cols, ld):
    taps = prod(pb.filt3)
    rows = pb.n * prod(pb.out3)
    p = Im2colParams()
    p.batch, p.groups, p.cg, p.taps, p.cin_inner, p.cols, p.ld = pb.n, pb.groups, pb.cg, taps, inner, cols, ld
    for i in range(3):
        p.in_size[i], p.out_size[i], p.filt[i] = pb.in3[i], pb.out3[i], pb.filt3[i]
        p.pad[i], p.stride[i], p.dil[i] = pb.pad3[i], pb.stride3[i], pb.dil3[i]
    for i in range(5):
        p.xs[i] = pb.xs[i]
    p.flags = FLAG_FLIP if pb.flip else 0
    grid = (cdiv(rows, IM2COL_ROWS), cdiv(ld, IM2COL_COLS), 1)
    return pl.add_step(f"conv_gemm.{pb.tag}", _expr("im2col", pb.tag), grid, (256, 1, 1), p)


def _add_pack(pl, pb, inner, cols, ld):
    p = PackFilterParams()
    p.k, p.cg, p.taps, p.cin_inner, p.cols, p.ld = pb.k, pb.cg, prod(pb.filt3), inner, cols, ld
    for i in range(3):
        p.filt[i] = pb.filt3[i]
    for i in range(5):
        p.ws[i] = pb.ws[i]
    return pl.add_step(f"conv_gemm.{pb.tag}", _expr("pack_filter", pb.tag), (cdiv(pb.k * ld, 256), 1, 1),
                       (256, 1, 1), p)


def _filter_order(pb):
    """(cin_inner, packed?): the caller's filter's own column order when it is packed; else the order
    that follows its format (the pack reads any strides)."""
    inner = _packed_filter(pb)
    if inner is not None:
        return inner, True
    return (1 if pb.w_format == E.PYDNN_TENSOR_NHWC else 0), False


def simt_ms(handle, m, n, k, batch):
    """The model's time of gemm_simt: waves of 128 x 128 tiles, one block per SM."""
    tiles = cdiv(m, 128) * cdiv(n, 128) * batch
    sms = max(handle.sm_count, 1)
    waves = -(-tiles // sms)
    return waves * 2.0 * 128 * 128 * k / (SIMT_TILE_TFLOPS * 1e12 / sms) * 1e3


def mm_ms(handle, mp):
    """The model's time of a pydnn.ops.matmul plan."""
    if mp.esize == 4:
        return simt_ms(handle, mp.m, mp.n, mp.k, mp.batch)
    nbytes = mp.batch * (mp.m * mp.k + mp.k * mp.n + mp.m * mp.n) * mp.esize
    return max(2.0 * mp.batch * mp.m * mp.n * mp.k / (MM_TC_TFLOPS * 1e9), nbytes / (MM_GBPS * 1e6))


# mm16_ms: the 16-bit matmul's time by the tile matmul's chooser takes (a ranking, not a promise). The
# 128x256 mma.sync tile's full-wave rate (fit to the 1x1 layers; bf16 4096^3: 308-325 TFLOP/s), by the tile's `eff`
# (wgmma 128x256 1.6, 128x128 1.3; mma.sync 128x128 0.9, 64x64 0.45); a block's K loop pays about
# MM_FILL_KTILES K tiles of pipeline fill and epilogue; the operands and C cross memory at MM16_GBPS at
# least (a conservative copy rate: H100 ~2960 GB/s, H200 ~4150).
MM16_TC_TFLOPS = 250.0   # fit (tools/bench_conv1x1.py, H200, 29 points: 27 picks right) from the 4096^3 310
MM_FILL_KTILES = 1.5
MM16_GBPS = 3000.0
MM16_GENERAL_TFLOPS = 40.0   # the unaligned path (element-by-element copies)


def mm16_ms(handle, mp, beta_reads=False):
    """The model's time of a 16-bit pydnn.ops.matmul plan `mp` (gemm_plan's record): waves of the chosen
    tile at its efficiency, stretched by the short-K fill, or its bytes at MM16_GBPS, whichever is longer."""
    sms = max(handle.sm_count, 1)
    m, n, k, batch = mp.m, mp.n, mp.k, mp.batch
    nbytes = batch * (m * k + k * n + m * n * (2 if beta_reads else 1)) * mp.esize
    mem = nbytes / (MM16_GBPS * 1e6)
    if not mp.vec_ok:
        return max(2.0 * batch * m * n * k / (MM16_GENERAL_TFLOPS * 1e9), mem)
    try:   # matmul's chooser and its tiles' fields (pydnn/ops/matmul.py, another family's module)
        t = matmul._choose_tile(m, n, batch, sms, handle.arch, k)
        bm, bn, per_sm, eff, bk = t.bm, t.bn, t.per_sm, t.eff, matmul.BK
    except (AttributeError, TypeError):   # its internals moved: the flat model
        return mm_ms(handle, mp)
    waves = cdiv(cdiv(m, bm) * cdiv(n, bn) * batch, per_sm * sms)
    per_block_flops = 2.0 * bm * bn * bk * (cdiv(k, bk) + MM_FILL_KTILES)
    rate_sm = MM16_TC_TFLOPS * eff * 1e12 / sms / per_sm   # one block's share of its SM
    compute = waves * per_block_flops / rate_sm * 1e3
    return max(compute, mem)


LONE_BLOCK_SPEED = 0.6   # a gemm_simt block alone on its SM, relative to the tile's full per-SM rate (a guess)


def _busy_sm_blocks(blocks, sms, per_sm):
    """How many blocks' time at the full rate the busiest SM spends on `blocks` blocks over `sms` SMs that
    each hold per_sm at once: whole rounds of per_sm, and a last round of rem < per_sm blocks at
    LONE_BLOCK_SPEED each (at most the full rate)."""
    full, rem = divmod(cdiv(blocks, sms), per_sm)
    return full * per_sm + (rem / min(1.0, LONE_BLOCK_SPEED * rem) if rem else 0)


def tile_ms(handle, mp):
    """The model's time of a pydnn.ops.matmul plan by the tile it runs: gemm_simt's chosen tile in waves
    of per_sm x SMs items at its efficiency (an SM holding fewer blocks than per_sm runs them at
    LONE_BLOCK_SPEED per block, at most the full rate), the tensor-core GEMMs as mm_ms."""
    if mp.esize != 4:
        return mm_ms(handle, mp)
    sms = max(handle.sm_count, 1)
    t = matmul._choose_simt_tile(mp.m, mp.n, mp.batch, sms, mp.k)
    items = cdiv(mp.m, t.bm) * cdiv(mp.n, t.bn) * mp.batch
    eff = t.eff_short if mp.k <= matmul.SHORT_K else t.eff
    work = 2.0 * t.bm * t.bn * mp.k / (SIMT_TILE_TFLOPS * 1e12 / sms * eff)   # seconds of one block at the full rate
    return _busy_sm_blocks(items, sms, t.per_sm) * work * 1e3


# ----------------------------------------------------------------------------- the forward GEMM algorithm

def _col_problem(pb, ld, w_rows):
    """The 1x1, stride-1 convolution of the column matrix (ld channels per group) with the filter viewed as
    (K, ld) rows `w_rows` apart."""
    s = pb.copy()  # everything the real problem has, then the view's own sizes
    s.dtype, s.tag, s.n, s.groups, s.k, s.kg = pb.dtype, pb.tag, pb.n, pb.groups, pb.k, pb.kg
    s.cg = ld // pb.groups
    s.c = ld
    s.in3 = s.out3 = tuple(pb.out3)
    s.filt3, s.pad3, s.stride3, s.dil3 = (1, 1, 1), (0, 0, 0), (1, 1, 1), (1, 1, 1)
    o = pb.out3
    s.xs = (prod(o) * ld, 1, o[1] * o[2] * ld, o[2] * ld, ld)
    s.ys = pb.ys
    s.ws = (w_rows, 1, 0, 0, 0)
    s.flip = False
    s.w_format, s.math_type, s.nspatial = E.PYDNN_TENSOR_NHWC, pb.math_type, pb.nspatial
    s.x_desc, s.y_desc, s.w_dims = pb.x_desc, pb.y_desc, (pb.k, s.cg)
    s.view = "col"   # the tensor-core choice reads it: channel tails by tuning.conv_gemm.VIEW_TAIL_FILL
    return s


def _fwd_matmul(handle, pb, ld, w_rows):
    """pydnn.ops.matmul's plan of the forward GEMM over the column matrix (one GEMM per image) and
    whether its A operand is the filter, or None when y's layout does not allow one. float; 16-bit 1x1
    problems (strided or padded: the im2col is their gather) under mm16_ok, NHWC-like y with its images
    one after another as one GEMM of N * P rows."""
    if pb.groups != 1 or (pb.tag != "f32" and not (_mm16_cols_ok(pb) and prod(pb.filt3) > 1)):
        # 16-bit 1x1 problems that need a gather (strided, padded) keep the implicit view: measured (H200,
        # bench_conv1x1, N128 1x1/2): gather + matmul 0.1986 / 0.0977 ms against fwd_wgmma 0.1961 / 0.0803
        return None
    P, K = prod(pb.out3), pb.k
    unit = _spatial_unit(pb.ys[2:], pb.out3)
    try:
        if pb.tag != "f32" and pb.ys[1] == 1 and unit is not None and _flat(pb, pb.n, P * ld, ld, pb.ys[0],
                                                                              max(unit, K), P):
            mp = matmul.gemm_plan(handle, pb.dtype, pb.n * P, K, ld, trans_b=True, lda=ld, ldb=w_rows,
                                  ldc=max(unit, K))
            return mp, False
        if pb.ys[1] == 1 and unit is not None:     # NHWC-like y: y_n[P x K] = col_n . W^T
            mp = matmul.gemm_plan(handle, pb.dtype, P, K, ld, trans_b=True, lda=ld, ldb=w_rows,
                                  ldc=max(unit, K), batch=pb.n, stride_a=P * ld, stride_c=pb.ys[0])
            return mp, False
        if unit in (0, 1):                          # NCHW-like y: y_n[K x P] = W . col_n^T
            mp = matmul.gemm_plan(handle, pb.dtype, K, P, ld, trans_b=True, lda=w_rows, ldb=ld,
                                  ldc=max(pb.ys[1], P), batch=pb.n, stride_b=P * ld, stride_c=pb.ys[0])
            return mp, True
    except PydnnError:
        return None
    return None


def mm16_ok(pb):
    """Whether a 16-bit 1x1 problem takes pydnn.ops.matmul (tuning.conv_gemm.MM_1X1; tensor cores: the
    math type not FMA; one group)."""
    return (tuning.conv_gemm.MM_1X1 and pb.tag in TC_TAGS and pb.math_type != E.PYDNN_FMA_MATH
            and pb.groups == 1 and pb.filt3 == (1, 1, 1))


def _mm16_cols_ok(pb):
    """Whether a 16-bit problem of several taps may run its column matrix on pydnn.ops.matmul
    (tuning.conv_gemm.MM_COLS not False; the rest as mm16_ok)."""
    return (tuning.conv_gemm.MM_COLS is not False and tuning.conv_gemm.MM_1X1 and pb.tag in TC_TAGS
            and pb.math_type != E.PYDNN_FMA_MATH and pb.groups == 1)


def _flat(pb, n_img, a_img, a_rows, c_img, c_rows, P):
    """Whether both matrices' images follow one another as rows (image stride = P rows), so the batch of
    per-image GEMMs is one GEMM of n_img * P rows (one grid of tiles over all images: no per-image tail)."""
    return n_img == 1 or (a_img == P * a_rows and c_img == P * c_rows)


def _direct_matmul(handle, pb):
    """A 1x1, stride-1, unpadded problem whose x already is the column matrix (NCHW-like x with NCHW-like
    y, or NHWC-like both, spatial dims packed) and whose filter is a packed (K, C) matrix: the matmul plan
    (no im2col, no workspace) and whether A is the filter; else None. float, and 16-bit data under
    mm16_ok; 16-bit NHWC-like images one after another are one GEMM of N * P rows."""
    if (pb.groups != 1 or pb.filt3 != (1, 1, 1) or pb.stride3 != (1, 1, 1)
            or pb.pad3 != (0, 0, 0) or _packed_filter(pb) is None):
        return None
    if pb.tag != "f32" and not mm16_ok(pb):
        return None
    P, K, Cc = prod(pb.out3), pb.k, pb.c
    xu, yu = _spatial_unit(pb.xs[2:], pb.in3), _spatial_unit(pb.ys[2:], pb.out3)
    if xu is None or yu is None:
        return None
    try:
        if pb.ys[1] == 1 and pb.xs[1] == 1:         # y_n[P x K] = x_n[P x C] . W^T
            lda, ldc = max(xu, Cc), max(yu, K)
            if pb.tag != "f32" and _flat(pb, pb.n, pb.xs[0], lda, pb.ys[0], ldc, P):
                mp = matmul.gemm_plan(handle, pb.dtype, pb.n * P, K, Cc, trans_b=True, lda=lda, ldb=pb.ws[0],
                                      ldc=ldc)
                return mp, False
            mp = matmul.gemm_plan(handle, pb.dtype, P, K, Cc, trans_b=True, lda=lda, ldb=pb.ws[0],
                                  ldc=ldc, batch=pb.n, stride_a=pb.xs[0], stride_c=pb.ys[0])
            return mp, False
        if xu in (0, 1) and yu in (0, 1):           # y_n[K x P] = W[K x C] . x_n[C x P]
            mp = matmul.gemm_plan(handle, pb.dtype, K, P, Cc, lda=pb.ws[0], ldb=max(pb.xs[1], P),
                                  ldc=max(pb.ys[1], P), batch=pb.n, stride_b=pb.xs[0], stride_c=pb.ys[0])
            return mp, True
    except PydnnError:
        return None
    return None


class GemmPlan(StepPlan):
    """im2col (+ pack_filter) + the GEMM: matmul (`mm`) or the 1x1 convolution (`sub`). `direct`: a 1x1
    problem whose x is the column matrix: matmul on x itself, no im2col (and `sub` the implicit GEMM of
    the problem itself, for the fused epilogue)."""

    mm = None
    pack = None
    im2col = None
    direct = False
    col_bytes = 0

    def launch(self, handle, a_ptr, b_ptr, out_ptr, ws_ptr, alpha, beta, z_ptr=0, bias_ptr=0):
        fused = bool(z_ptr or bias_ptr)
        if self.direct:
            if fused:
                if tuning.conv_gemm.MM_FUSED == "tma":
                    t = self.fused_tma(handle)
                    if t is not None:
                        return t.launch(handle, a_ptr, b_ptr, out_ptr, 0, alpha, beta, z_ptr, bias_ptr)
                fm = self.fused_mm(handle, alpha, beta, z_ptr, bias_ptr)
                if fm is not None and fm.ready(handle):
                    return fm.run(handle, a_ptr, b_ptr, out_ptr, z_ptr, bias_ptr)
                return self.sub.run(handle, a_ptr, b_ptr, out_ptr, alpha, beta, z_ptr, bias_ptr)
            mp, filter_a = self.mm
            a, b = (b_ptr, a_ptr) if filter_a else (a_ptr, b_ptr)
            return mp.launch(handle, a, b, out_ptr, alpha, beta)
        p = self.steps[self.im2col][4]
        p.x, p.col = a_ptr, ws_ptr
        self.run_step(handle, self.im2col)
        w = b_ptr
        if self.pack is not None:
            q = self.steps[self.pack][4]
            q.w, q.out = b_ptr, ws_ptr + self.filter_off
            self.run_step(handle, self.pack)
            w = ws_ptr + self.filter_off
        if self.mm is not None and not fused:
            mp, filter_a = self.mm
            a, b = (w, ws_ptr) if filter_a else (ws_ptr, w)
            return mp.launch(handle, a, b, out_ptr, alpha, beta)
        self.sub.run(handle, ws_ptr, w, out_ptr, alpha, beta, z_ptr, bias_ptr)

    def fused_mm(self, handle, alpha, beta, z_ptr, bias_ptr):
        """The fused call's graph-API matmul (FusedMM) for this call's epilogue (the fields _fused_run set on
        self.gemm), or None where it does not apply (then the implicit GEMM's epilogue runs). Built once per
        epilogue key and cached on the plan; a graph that does not build is remembered as None."""
        key = fused_mm_key(self, alpha, beta, z_ptr, bias_ptr)
        if key is None:
            return None
        cache = self.__dict__.setdefault("_fused", {})
        if key not in cache:
            try:
                cache[key] = FusedMM(handle, self, key)
            except PydnnError:
                cache[key] = None
        return cache[key]

    def fused_tma(self, handle):
        """tuning.conv_gemm.MM_FUSED "tma": the fused call on fwd_tma (conv_tma.py) of the problem itself, with
        this call's epilogue fields (set on self.gemm, the implicit sub-plan's) copied over; None where fwd_tma
        refuses the problem. Built once, cached on the plan."""
        t = self.__dict__.get("_tma", 0)
        if t == 0:
            t = self._tma = tma_plan(handle, self.problem, self.algo, self.sub.plan)
        if t is not None:
            _copy_epilogue(self.gemm, t.gemm)
        return t

    def estimate_ms(self, handle, base_estimate):
        if self.mm is not None and self.mm[0].esize == 2:
            gemm = mm16_ms(handle, self.mm[0])
        else:
            gemm = mm_ms(handle, self.mm[0]) if self.mm is not None else base_estimate(handle, self.sub.plan)
        return gemm + 2 * self.col_bytes / (IM2COL_GBPS * 1e6) + LAUNCH_MS * len(self.steps)


ACT_IDENTITY, ACT_RELU = 0, 1   # problem.ACT's codes of the convolution epilogue's activations


def _copy_epilogue(src, dst):
    """ConvolutionBiasActivationForward's fields of one ConvParams onto another's (act, coef, alpha2, bias
    stride, z strides, the BIAS / Z / NAN_PROP flags)."""
    dst.act, dst.coef, dst.alpha2, dst.bias_stride = src.act, src.coef, src.alpha2, src.bias_stride
    for i in range(5):
        dst.zs[i] = src.zs[i]
    keep = FLAG_BIAS | FLAG_Z | FLAG_NAN_PROP
    dst.flags = (dst.flags & ~keep) | (src.flags & keep)


def fused_mm_key(pl, alpha, beta, z_ptr, bias_ptr):
    """The epilogue key of a fused call on a direct 16-bit plan that the graph API's fused matmul serves, or
    None: tuning.conv_gemm.MM_FUSED, alpha1 1, beta 0, a bias, z absent or added unscaled (alpha2 1) through
    y's own strides, activation IDENTITY or RELU without NaN propagation (max(v, 0): NaN -> 0 as the
    convolution epilogue's)."""
    if not (tuning.conv_gemm.MM_FUSED and pl.direct and pl.mm[0].esize == 2 and bias_ptr
            and alpha == 1.0 and beta == 0.0):
        return None
    p, pb = pl.gemm, pl.problem
    if p.act not in (ACT_IDENTITY, ACT_RELU) or (p.act == ACT_RELU and p.flags & FLAG_NAN_PROP):
        return None
    zs = tuple(p.zs[i] for i in range(5))
    if z_ptr and (p.alpha2 != 1.0 or zs != tuple(pb.ys)):
        return None
    return (p.act, bool(z_ptr), p.bias_stride)


class FusedMM:
    """A direct 1x1 plan's fused call as ONE launch of the graph API's fused matmul (pydnn/graph: the GEMM
    tile pydnn.ops.matmul chooses, gemm_tma on sm_90, with bias (+ z) (+ max(v, 0)) generated into its
    epilogue, in fp32, rounded once): NHWC-like y[N*P x K] = x[N*P x C] . W^T + bias, or NCHW-like
    y_n[K x P] = W[K x C] . x_n[C x P] + bias (W broadcast over the images). Called, not edited (the graph
    and matmul are other families' code). ReLU is MAX against a one-element zero tensor kept here (the graph's
    RELU_FWD clips NaN to its upper bound; the convolution's NOT_PROPAGATE_NAN gives 0)."""

    def __init__(self, handle, pl, key):
        from ...graph.frontend import Graph
        act, has_z, bias_stride = key
        pb = pl.problem
        mp, filter_a = pl.mm
        io = pb.dtype
        F = E.PYDNN_DATA_FLOAT
        g = Graph(io_data_type=io, intermediate_data_type=F, compute_data_type=F, handle=handle)
        n, K, C, P = pb.n, pb.k, pb.c, prod(pb.out3)
        ldw = pb.ws[0]
        if not filter_a:   # NHWC-like: one GEMM of N * P rows (or per image with the images' strides)
            batch = mp.batch
            rows = mp.m
            xa = g.tensor(name="x", dim=[batch, rows, C], stride=[mp.stride_a or rows * mp.lda, mp.lda, 1])
            wb = g.tensor(name="w", dim=[1, C, K], stride=[C * ldw, 1, ldw])
            ydims, ystr = [batch, rows, K], [mp.stride_c or rows * mp.ldc, mp.ldc, 1]
            bias = g.tensor(name="bias", dim=[1, 1, K], stride=[K * bias_stride, K * bias_stride, bias_stride])
            mm = g.matmul(xa, wb)
            ops = (xa, wb)
        else:              # NCHW-like: y_n[K x P] = W[K x C] . x_n[C x P]
            wa = g.tensor(name="w", dim=[1, K, C], stride=[K * ldw, ldw, 1])
            xb = g.tensor(name="x", dim=[n, C, P], stride=[pb.xs[0], mp.ldb, 1])
            ydims, ystr = [n, K, P], [pb.ys[0], mp.ldc, 1]
            bias = g.tensor(name="bias", dim=[1, K, 1], stride=[K * bias_stride, bias_stride, bias_stride])
            mm = g.matmul(wa, xb)
            ops = (xb, wa)
        v = g.add(mm, bias)
        z = zero = None
        if has_z:
            z = g.tensor(name="z", dim=ydims, stride=ystr)
            v = g.add(v, z)
        if act == ACT_RELU:
            zero = g.tensor(name="zero", dim=[1, 1, 1], stride=[1, 1, 1])
            v = g.max(v, zero)
        v.set_output(True).set_dim(ydims).set_stride(ystr).set_data_type(io)
        g.build_operation_graph().create_execution_plans([E.PYDNN_HEUR_MODE_A]).check_support()
        g.build_plans()
        if g.engine_index() != 1 or g.launches() != 1 or g.get_workspace_size() != 0:
            raise PydnnError(NS, f"fused 1x1: the graph API planned {g.launches()} launches on engine "
                                 f"{g.engine_index()}")
        self.graph, self.x, self.w, self.bias, self.z, self.y = g, ops[0], ops[1], bias, z, v
        self.zero_t, self.zero = zero, None   # the zero element: allocated (and cleared) by ready(), once
        self.bufs = {}

    def ready(self, handle):
        """Whether the route can run: its zero element allocated (once; False where no device memory can be had,
        e.g. a CPU handle's recording: the caller then runs the implicit GEMM's epilogue)."""
        if self.zero is False:
            return False
        if self.zero_t is None or self.zero is not None:
            return True
        try:
            import numpy as np

            from ..._cuda.memory import DeviceArray
            with driver.pushed(handle.ctx):
                zero = DeviceArray((8,), np.uint8)
                zero.fill_bytes(0)
        except PydnnError:
            self.zero = False
            return False
        self.zero = zero
        self.bufs[self.zero_t] = zero.ptr
        return True

    def run(self, handle, x_ptr, w_ptr, y_ptr, z_ptr, bias_ptr):
        bufs = self.bufs
        bufs[self.x], bufs[self.w], bufs[self.bias], bufs[self.y] = x_ptr, w_ptr, bias_ptr, y_ptr
        if self.z is not None:
            bufs[self.z] = z_ptr
        self.graph.execute(bufs, 0, handle=handle)


def plan_gemm(handle, pb, algo):
    """The GEMM algorithm's plan, or NOT_SUPPORTED with the reason."""
    direct = _direct_matmul(handle, pb)
    if direct is not None:
        pl = GemmPlan(DIR_FWD, algo, pb)
        pl.direct, pl.mm = True, direct
        # the fused epilogue's path (bias, z, activation): the tensor-core implicit GEMM for 16-bit data
        fused_algo = (E.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM
                      if pb.tag != "f32" and tc_refusal(pb, DIR_FWD) is None else E.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM)
        sub = planner(DIR_FWD, fused_algo)(handle, pb, algo)
        pl.sub = SubGemm(sub, pb)
        pl.gemm, pl.gemm_expr = sub.gemm, sub.gemm_expr
        if pb.tag != "f32":   # the kernel the plain call runs (a label: the sweep's kernel column)
            pl.gemm_expr = direct[0].fast.expr
        return pl
    taps = prod(pb.filt3)
    rows, cols = pb.n * prod(pb.out3), pb.groups * pb.cg * taps
    tc = (pb.tag in TC_TAGS and pb.groups == 1 and pb.math_type != E.PYDNN_FMA_MATH)
    ld = -(-cols // 8) * 8 if tc else cols
    if rows > 2**31 - 1 or ld > 2**31 - 1:
        raise PydnnError(NS, f"algo: GEMM's column matrix ({rows} x {ld}) exceeds 2^31 - 1 rows or columns")
    inner, packed = _filter_order(pb)
    # the caller's filter is the GEMM's B operand as it is when packed in the column order (and, for the
    # tensor cores, NHWC rows of ld elements); else it is packed into the workspace
    own = packed and ld == cols and (not tc or inner == 1)
    pl = GemmPlan(DIR_FWD, algo, pb)
    pl.col_bytes = round_up(rows * ld * pl.itemsize)
    pl.filter_off = pl.col_bytes
    w_rows = pb.ws[0] if own else ld
    pl.im2col = _add_im2col(pl, pb, inner, cols, ld)
    if not own:
        pl.pack = _add_pack(pl, pb, inner, cols, ld)
    spb = _col_problem(pb, ld, w_rows)
    if tc_refusal(spb, DIR_FWD) is None:
        sub = planner(DIR_FWD, E.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM)(handle, spb, algo)
    else:
        sub = planner(DIR_FWD, E.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM)(handle, spb, algo)
    pl.sub = SubGemm(sub, spb)
    pl.mm = _fwd_matmul(handle, pb, ld, w_rows)
    if pl.mm is not None and pb.tag != "f32" and taps > 1 and tuning.conv_gemm.MM_COLS is None:
        if mm16_ms(handle, pl.mm[0]) >= estimate_ms(handle, sub):   # algorithms.py's model, registered in plans
            pl.mm = None   # the model's choice: the implicit 1x1 view of the column matrix
    pl.gemm = sub.gemm            # the epilogue fields (bias, z, activation) of ConvolutionBiasActivationForward
    pl.gemm_expr = sub.gemm_expr
    if pl.mm is not None and pb.tag != "f32":   # the plain call's kernel (a label)
        pl.gemm_expr = pl.mm[0].fast.expr
    # the tensor-core GEMM reads the filter in 16-byte vectors: the caller's, when it is read in place
    pl.align = sub.align if own else 0
    pl.workspace = round_up(rows * ld * pl.itemsize, 16) if own else pl.col_bytes + round_up(pb.k * ld * pl.itemsize, 16)
    return pl


# ----------------------------------------------------------------------------- backward data: GEMM + col2im

class BwdGemmPlan(StepPlan):
    """(pack_filter +) col = dy . W (pydnn.ops.matmul) + col2im; or, `direct` (a 1x1, stride-1, unpadded
    problem whose dy and dx read as matrices), one matmul straight into dx with alpha / beta."""

    pack = None
    direct = False

    def launch(self, handle, a_ptr, b_ptr, out_ptr, ws_ptr, alpha, beta, z_ptr=0, bias_ptr=0):
        """a = dy, b = w, out = dx."""
        if self.direct:
            mp, filter_a = self.mm, self.filter_a
            a, b = (b_ptr, a_ptr) if filter_a else (a_ptr, b_ptr)
            return mp.launch(handle, a, b, out_ptr, alpha, beta)
        w = b_ptr
        if self.pack is not None:
            q = self.steps[self.pack][4]
            q.w, q.out = b_ptr, ws_ptr + self.filter_off
            self.run_step(handle, self.pack)
            w = ws_ptr + self.filter_off
        self.mm.launch(handle, a_ptr, w, ws_ptr, 1.0, 0.0)
        p = self.steps[self.col2im][4]
        p.col, p.dx, p.alpha, p.beta = ws_ptr, out_ptr, alpha, beta
        p.flags = (p.flags & ~FLAG_C2I_BETA) | (FLAG_C2I_BETA if beta != 0 else 0)
        self.run_step(handle, self.col2im)

    def estimate_ms(self, handle, base_estimate):
        if self.mm.esize == 2:
            gemm = mm16_ms(handle, self.mm)
        else:
            gemm = tile_ms(handle, self.mm) if self.direct else mm_ms(handle, self.mm)
        if self.direct:
            return gemm
        return gemm + 2 * self.col_bytes / (IM2COL_GBPS * 1e6) + LAUNCH_MS * len(self.steps)


def _bwd_direct_ok(pb):
    """A 1x1, stride-1, unpadded problem whose filter is a packed (K, C) matrix: dx = W^T . dy per image
    needs no column matrix."""
    return (pb.filt3 == (1, 1, 1) and pb.stride3 == (1, 1, 1) and pb.pad3 == (0, 0, 0) and pb.groups == 1
            and _packed_filter(pb) is not None)


def _bwd_direct_matmul(handle, pb):
    """The direct backward data's matmul plan and whether its A operand is the filter, or None when dx
    and dy do not read as matrices of one orientation (NCHW-like both: dx_n[C x P] = W^T . dy_n[K x P];
    NHWC-like both: dx_n[P x C] = dy_n[P x K] . W), each with packed spatial dims."""
    P, K, Cc = prod(pb.out3), pb.k, pb.c
    xu, yu = _spatial_unit(pb.xs[2:], pb.in3), _spatial_unit(pb.ys[2:], pb.out3)
    if xu is None or yu is None:
        return None
    if pb.ys[1] == 1 and pb.xs[1] == 1:
        lda, ldc = max(yu, K), max(xu, Cc)
        if pb.tag != "f32" and _flat(pb, pb.n, pb.ys[0], lda, pb.xs[0], ldc, P):   # one GEMM of N * P rows
            return matmul.gemm_plan(handle, pb.dtype, pb.n * P, Cc, K, lda=lda, ldb=pb.ws[0], ldc=ldc), False
        return matmul.gemm_plan(handle, pb.dtype, P, Cc, K, lda=lda, ldb=pb.ws[0], ldc=ldc,
                                batch=pb.n, stride_a=pb.ys[0], stride_c=pb.xs[0]), False
    if xu in (0, 1) and yu in (0, 1):
        return matmul.gemm_plan(handle, pb.dtype, Cc, P, K, trans_a=True, lda=pb.ws[0], ldb=max(pb.ys[1], P),
                                ldc=max(pb.xs[1], P), batch=pb.n, stride_b=pb.ys[0], stride_c=pb.xs[0]), True
    return None


def _matmul_refusal(pb, dtypes="float, half and bfloat16 data"):
    """Why pydnn.ops.matmul cannot run a problem's explicit GEMM (None when it can)."""
    if pb.tag not in MM_TAGS:
        return f"its explicit GEMM runs {dtypes}"
    if pb.tag in TC_TAGS and pb.math_type == E.PYDNN_FMA_MATH:
        return "its explicit GEMM runs 16-bit data on tensor cores, which the FMA math type forbids"
    if pb.groups != 1:
        return f"its explicit GEMM needs groupCount 1 (got {pb.groups})"
    return None


def bwd_data_gemm_refusal(pb):
    """Why the explicit-GEMM backward data cannot serve a problem (None when it can)."""
    why = _matmul_refusal(pb)
    if why:
        return why
    direct = _bwd_direct_ok(pb)
    if pb.c >= SMALL_C and prod(pb.stride3) == 1 and not direct:
        return (f"its explicit GEMM + col2im serves small-channel (C < {SMALL_C}) or strided problems, where "
                f"the CUDA-core gather wastes most of its tile or taps, and 1x1 unpadded stride-1 ones (C "
                f"{pb.c}, stride 1, filter {pb.filt3[3 - pb.nspatial:]})")
    unit = _spatial_unit(pb.ys[2:], pb.out3)
    if unit is None or (pb.ys[1] != 1 and unit not in (0, 1)):
        return (f"its explicit GEMM reads dy as a matrix: NCHW-like or NHWC-like with packed spatial dims "
                f"(strides {tuple(pb.y_desc.strides)})")
    return None


def plan_bwd_data_gemm(handle, pb, algo):
    """Backward data as pack_filter (when needed) + matmul + col2im, or NOT_SUPPORTED with the reason."""
    why = bwd_data_gemm_refusal(pb)
    if why:
        raise PydnnError(NS, f"algo: {algo_name(DIR_BWD_DATA, algo)}: {why}")
    if _bwd_direct_ok(pb):
        direct = _bwd_direct_matmul(handle, pb)
        if direct is not None:  # no column matrix, no workspace: alpha / beta straight into dx
            pl = BwdGemmPlan(DIR_BWD_DATA, algo, pb)
            pl.direct, (pl.mm, pl.filter_a) = True, direct
            pl.gemm, pl.gemm_expr = None, pl.mm.fast.expr if pl.mm.fast is not None else ""
            return pl
        if pb.c >= SMALL_C:
            raise PydnnError(NS, f"algo: {algo_name(DIR_BWD_DATA, algo)}: its direct 1x1 GEMM reads dx and dy "
                                 f"as matrices of one layout (NCHW-like both or NHWC-like both, packed spatial "
                                 f"dims; strides {tuple(pb.x_desc.strides)}, {tuple(pb.y_desc.strides)})")
    taps = prod(pb.filt3)
    P, K, rows, cols = prod(pb.out3), pb.k, pb.n * prod(pb.out3), pb.c * taps
    tc = pb.tag in TC_TAGS
    ld = -(-cols // 8) * 8 if tc else cols
    if rows > 2**31 - 1 or ld > 2**31 - 1:
        raise PydnnError(NS, f"algo: the column matrix ({rows} x {ld}) exceeds 2^31 - 1 rows or columns")
    inner, packed = _filter_order(pb)
    pl = BwdGemmPlan(DIR_BWD_DATA, algo, pb)
    pl.col_bytes = round_up(rows * ld * pl.itemsize)
    pl.filter_off = pl.col_bytes
    own = packed and ld == cols
    w_rows = pb.ws[0] if own else ld
    if not own:
        pl.pack = _add_pack(pl, pb, inner, cols, ld)
    unit = _spatial_unit(pb.ys[2:], pb.out3)
    if pb.ys[1] == 1 and pb.tag != "f32" and _flat(pb, pb.n, pb.ys[0], max(unit, K), P * ld, ld, P):
        # 16-bit NHWC-like dy, images one after another: col[N * P x ld] = dy[N * P x K] . W, one GEMM
        pl.mm = matmul.gemm_plan(handle, pb.dtype, pb.n * P, ld, K, lda=max(unit, K), ldb=w_rows, ldc=ld)
    elif pb.ys[1] == 1:   # NHWC-like dy: col_n[P x ld] = dy_n[P x K] . W
        pl.mm = matmul.gemm_plan(handle, pb.dtype, P, ld, K, lda=max(unit, K), ldb=w_rows, ldc=ld, batch=pb.n,
                                 stride_a=pb.ys[0], stride_c=P * ld)
    else:               # NCHW-like dy: col_n = dy_n^T . W
        pl.mm = matmul.gemm_plan(handle, pb.dtype, P, ld, K, trans_a=True, lda=max(pb.ys[1], P) if K > 1 else P,
                                 ldb=w_rows, ldc=ld, batch=pb.n, stride_a=pb.ys[0], stride_c=P * ld)
    _add_col2im(pl, pb, inner, taps, ld)
    pl.gemm, pl.gemm_expr = None, pl.mm.fast.expr
    pl.align = 0
    pl.workspace = round_up(rows * ld * pl.itemsize, 16) if own else pl.col_bytes + round_up(K * ld * pl.itemsize, 16)
    return pl


def _add_col2im(pl, pb, inner, taps, ld):
    p = Col2imParams()
    p.batch, p.c, p.taps, p.cin_inner, p.ld = pb.n, pb.c, taps, inner, ld
    for i in range(3):
        p.in_size[i], p.out_size[i], p.filt[i] = pb.in3[i], pb.out3[i], pb.filt3[i]
        p.pad[i], p.stride[i], p.dil[i] = pb.pad3[i], pb.stride3[i], pb.dil3[i]
        gcd = math.gcd(pb.stride3[i], pb.dil3[i])
        p.tap_step[i], p.out_step[i] = pb.stride3[i] // gcd, pb.dil3[i] // gcd
    for i in range(5):
        p.xs[i] = pb.xs[i]
    p.total = pb.c * prod(pb.in3)
    if p.total > 2**31 - 1:
        raise PydnnError(NS, f"algo: dx's {p.total} elements per image exceed col2im's 2^31 - 1")
    clast = pb.xs[1] == 1 and pb.c > 1
    p.flags = (FLAG_FLIP if pb.flip else 0) | (FLAG_C2I_CLAST if clast else 0)
    pl.col2im = pl.add_step(f"conv_gemm.{pb.tag}", _expr("col2im", pb.tag), (cdiv(p.total, 256), pb.n, 1),
                            (256, 1, 1), p)


# ----------------------------------------------------------------------------- backward filter: BWD_FILTER_ALGO_3

@kernel_params("conv_gemm_params.h", "PackRowsParams")
class PackRowsParams(ctypes.Structure):
    _fields_ = [
        ("in_", ctypes.c_void_p), ("out", ctypes.c_void_p),
        ("rows", ctypes.c_int), ("ch", ctypes.c_int), ("imgs", ctypes.c_int), ("pad_", ctypes.c_int),
        ("s_img", ctypes.c_longlong), ("s_ch", ctypes.c_longlong), ("s_pos", ctypes.c_longlong),
        ("out_ld", ctypes.c_longlong),
    ]
    C_NAMES = {"in_": "in"}


@kernel_params("conv_gemm_params.h", "GemmFoldParams")
class GemmFoldParams(ctypes.Structure):
    _fields_ = [
        ("part", ctypes.c_void_p), ("dw", ctypes.c_void_p),
        ("k", ctypes.c_int), ("cols", ctypes.c_int), ("cg", ctypes.c_int), ("taps", ctypes.c_int),
        ("cin_inner", ctypes.c_int), ("parts", ctypes.c_int), ("filt", ctypes.c_int * 3),
        ("flags", ctypes.c_uint), ("alpha", ctypes.c_float), ("beta", ctypes.c_float),
        ("part_stride", ctypes.c_longlong), ("ks", ctypes.c_longlong), ("js", ctypes.c_longlong),
        ("ws", ctypes.c_longlong * 5),
    ]


FLAG_WF_BETA, FLAG_WF_KFAST = 1, 2
FOLD_GBPS = 2000.0        # the model's rate of the fold (partials read / time)


def _matrix_view(s5, sizes3, ch):
    """One image of a tensor (ch channels, spatial sizes3, strides s5) as a matrix: ('p', ld) positions x
    channels (channels contiguous, rows ld apart), ('c', ld) channels x positions (positions contiguous),
    or None (spatial dims not packed, or neither dim contiguous)."""
    unit = _spatial_unit(s5[2:], sizes3)
    if unit is None:
        return None
    if s5[1] == 1 or ch == 1:
        return "p", max(unit, ch, 1)
    if unit in (0, 1):
        return "c", max(s5[1], prod(sizes3), 1)
    return None


class _Operand:
    """A GEMM operand of the backward filter: `src` ('dy', 'x', 'col', 'pack': the base pointer it is
    read from), its matrix view (kind 'p' / 'c', ld), the elements between images (`img`) and, when the
    images follow one another as rows (flat), the elements per reduction row (`row`)."""

    def __init__(self, src, kind, ld, img, flat):
        self.src, self.kind, self.ld, self.img = src, kind, ld, img
        self.row = (ld if kind == "p" else 1) if flat else None


def wgrad_gemm_refusal(pb):
    """Why BWD_FILTER_ALGO_3 cannot serve a problem (None when it can)."""
    why = _matmul_refusal(pb, "float, half and bfloat16 data (pydnn.ops.matmul has no double kernel)")
    if why:
        return why
    if _spatial_unit(pb.ys[2:], pb.out3) is None:
        return (f"its explicit GEMM reads dy with packed spatial dims (strides {tuple(pb.y_desc.strides)})")
    return None


def _wgrad_direct_x(pb):
    """x itself as the GEMM's column matrix (1x1, stride 1, unpadded, x a matrix), else None."""
    if pb.filt3 != (1, 1, 1) or pb.stride3 != (1, 1, 1) or pb.pad3 != (0, 0, 0):
        return None
    return _matrix_view(pb.xs, pb.in3, pb.c)


class WgradGemmPlan(StepPlan):
    """Backward filter as explicit GEMMs into partial dw's + a fixed-order fold (see plan_wgrad_gemm)."""

    implicit = False

    def launch(self, handle, a_ptr, b_ptr, out_ptr, ws_ptr, alpha, beta, z_ptr=0, bias_ptr=0):
        """a = dy, b = x, out = dw."""
        es = self.itemsize
        part = ws_ptr + self.part_off
        for n0, kind, slot0, first in self.chunks:
            base = {"dy": a_ptr + n0 * self.problem.ys[0] * es, "x": b_ptr + n0 * self.problem.xs[0] * es,
                    "col": ws_ptr + self.col_off, "pack": ws_ptr + self.pack_off}
            im2col, pack, gemms = self.kinds[kind]
            if im2col is not None:
                p = self.steps[im2col][4]
                p.x, p.col = base["x"], base["col"]
                self.run_step(handle, im2col)
            if pack is not None:
                q = self.steps[pack][4]
                q.in_, q.out = base["dy"], base["pack"]
                self.run_step(handle, pack)
            for mp, a, aoff, b, boff, slot in gemms:
                mp.launch(handle, base[a] + aoff * es, base[b] + boff * es, part + (slot0 + slot) * self.slot * es,
                          1.0, 0.0 if first else 1.0)
        self.run_fold(handle, part, out_ptr, alpha, beta)

    def run_fold(self, handle, part, out_ptr, alpha, beta):
        """wgrad_fold: dw = alpha * (the partials at `part`, summed in order) + beta * dw."""
        f = self.steps[self.fold][4]
        f.part, f.dw, f.alpha, f.beta = part, out_ptr, alpha, beta
        f.flags = (f.flags & ~FLAG_WF_BETA) | (FLAG_WF_BETA if beta != 0 else 0)
        self.run_step(handle, self.fold)

    def estimate_ms(self, handle, base_estimate):
        t = 0.0
        for _, kind, _, _ in self.chunks:
            t += self.kind_ms[kind]
        return t + self.fold_bytes / (FOLD_GBPS * 1e6) + LAUNCH_MS * self.launches


def _gemm_for(handle, pb, dy, src, ncols, red, batch, a_step, b_step, part_ld_t):
    """matmul's plan of `batch` partial dw's over `red` reduction rows each, dy and src batch `a_step` /
    `b_step` elements apart, in one orientation: part_ld_t False: part[K x ncols] = dy^T-ish . src, else
    part[ncols x K] = src^T-ish . dy (the orientation whose tiles waste less is chosen by the caller)."""
    K = pb.k
    slot = K * ncols
    if not part_ld_t:   # m = K, n = ncols: A = dy (positions along k), B = src
        return matmul.gemm_plan(handle, pb.dtype, K, ncols, red, trans_a=dy.kind == "p", lda=dy.ld,
                                trans_b=src.kind == "c", ldb=src.ld, ldc=ncols, batch=batch,
                                stride_a=a_step, stride_b=b_step, stride_c=slot)
    return matmul.gemm_plan(handle, pb.dtype, ncols, K, red, trans_a=src.kind == "p", lda=src.ld,
                            trans_b=dy.kind == "c", ldb=dy.ld, ldc=K, batch=batch,
                            stride_a=b_step, stride_b=a_step, stride_c=slot)


def _splits(handle, pb, rows, tiles, slot_bytes, tc):
    """(splits, rows per split) of a flat reduction of `rows` rows: about one wave of blocks (3 of
    gemm_simt's 64 x 128 per SM, 2 tensor-core tiles), splits of at least tuning.conv_gemm.MIN_SPLIT_ROWS, the partials
    within tuning.conv_gemm.PART_LIMIT; a divisor of rows near that when there is one (no tail)."""
    want = (2 if tc else 3) * max(handle.sm_count, 1)
    s = max(1, min(want // max(tiles, 1), rows // tuning.conv_gemm.MIN_SPLIT_ROWS, tuning.conv_gemm.PART_LIMIT // (2 * slot_bytes)))
    for d in range(s, max(1, (s - 1) // 2), -1):   # s down to about s / 2 (not 1: that loses the splits)
        if rows % d == 0:
            return d, rows // d
    return s, rows // s


def plan_wgrad_gemm(handle, pb, algo):
    """BWD_FILTER_ALGO_3: dw[K, C * taps] = sum over images and positions of dy[K, pos] . col[pos, C * taps]
    (col: x's im2col, or x itself for 1x1 stride-1 unpadded problems), as pydnn.ops.matmul GEMMs writing
    partial dw's into the workspace, then wgrad_fold sums them in a fixed order with alpha / beta; or,
    where wgrad_implicit_refusal says None (float, few columns, no x-as-matrix shortcut), the implicit
    variant (one kernel gathering the columns itself, then the same fold). NOT_SUPPORTED with the reason
    for what it cannot serve."""
    why = wgrad_gemm_refusal(pb)
    if why:
        raise PydnnError(NS, f"algo: {algo_name(DIR_BWD_FILTER, algo)}: {why}")
    if wgrad_implicit_refusal(pb) is None:
        return plan_wgrad_implicit(handle, pb, algo)
    pl = WgradGemmPlan(DIR_BWD_FILTER, algo, pb)
    es = pl.itemsize
    taps, P, K, N = prod(pb.filt3), prod(pb.out3), pb.k, pb.n
    cols = pb.c * taps
    tc = pb.tag in TC_TAGS
    dyv = _matrix_view(pb.ys, pb.out3, K)
    dy_flat = dyv is not None and dyv[0] == "p" and (N == 1 or pb.ys[0] == P * dyv[1])
    xv = _wgrad_direct_x(pb) if dyv is not None else None
    inner = 1 if pb.w_format == E.PYDNN_TENSOR_NHWC else 0
    if xv is not None:   # x itself is the column matrix: no im2col
        ncols, inner, pack = pb.c, 0, False
        x_flat = xv[0] == "p" and (N == 1 or pb.xs[0] == P * xv[1])
        flat = x_flat and dy_flat     # else one partial per image, chunks of images adding into them
        src = _Operand("x", xv[0], xv[1], pb.xs[0], flat)
        dy = _Operand("dy", dyv[0], dyv[1], pb.ys[0], flat)
        chunk = N if flat else max(1, min(N, tuning.conv_gemm.PART_LIMIT // max(K * ncols * es, 1)))
    else:                # im2col of a chunk of images (+ dy made channel-major when its images are not rows)
        ncols = -(-cols // 8) * 8 if tc else cols
        pack, flat = not dy_flat, True
        per_img = P * ncols * es + (K * P * es if pack else 0)
        chunk = max(1, min(N, tuning.conv_gemm.COL_LIMIT // max(per_img, 1)))
        chunk = cdiv(N, cdiv(N, chunk))   # as many chunks, of sizes as even as they go (64 -> 22, 22, 20)
        src = _Operand("col", "p", ncols, P * ncols, True)
        dy = None if pack else _Operand("dy", "p", dyv[1], pb.ys[0], True)
    if max(ncols, K, chunk * P) > 2**31 - 1:
        raise PydnnError(NS, f"algo: {algo_name(DIR_BWD_FILTER, algo)}: a GEMM size exceeds 2^31 - 1 "
                             f"({chunk * P} positions, {ncols} columns, K {K})")
    pl.slot = K * ncols
    slot_bytes = pl.slot * es
    pl.kinds, pl.kind_ms, pl.chunks, nslots = {}, {}, [], {}
    orient = None
    for g in sorted({chunk, N % chunk} - {0}, reverse=True):   # the chunk sizes: full, and the last one
        steps_ms, im2col_i, pack_i, dyk = 0.0, None, None, dy
        if xv is None:
            im2col_i = _add_im2col(pl, _chunk_problem(pb, g), inner, cols, ncols)
            steps_ms += 2 * g * P * ncols * es / (IM2COL_GBPS * 1e6)
            if pack:
                dyk = _Operand("pack", "c", g * P, 0, True)
                pack_i = _add_pack_rows(pl, pb, g)
                steps_ms += 2 * g * P * K * es / (IM2COL_GBPS * 1e6)
        rows = g * P if flat else P
        if orient is None:
            orient = _orientation(pb, ncols, tc)
        if flat:   # the chunk's positions of every image as one reduction, split into s partials
            s, L = _splits(handle, pb, rows, _tiles(pb, ncols, orient, tc), slot_bytes, tc)
            gemms = [_entry(_gemm_for(handle, pb, dyk, src, ncols, L, s, L * dyk.row, L * src.row, orient),
                            dyk.src, 0, src.src, 0, 0, orient)]
            if rows - s * L:   # the tail (fewer than s rows) in one more partial
                gemms.append(_entry(_gemm_for(handle, pb, dyk, src, ncols, rows - s * L, 1, 0, 0, orient),
                                    dyk.src, s * L * dyk.row, src.src, s * L * src.row, s, orient))
            nslots[g] = s + len(gemms) - 1
        else:
            gemms = [_entry(_gemm_for(handle, pb, dyk, src, ncols, P, g, dyk.img, src.img, orient),
                            "dy", 0, "x", 0, 0, orient)]
            nslots[g] = g
        pl.kinds[g] = (im2col_i, pack_i, gemms)
        pl.kind_ms[g] = steps_ms + sum(tile_ms(handle, gm[0]) for gm in gemms)
    # the chunks in order: flat plans give every chunk partials of its own; per-image plans add the later
    # chunks into the first chunk's (beta 1): a fixed order either way
    slot0, pl.launches = 0, 1
    for n0 in range(0, N, chunk):
        g = min(chunk, N - n0)
        pl.chunks.append((n0, g, slot0, n0 == 0 or flat))
        if flat:
            slot0 += nslots[g]
        im2col_i, pack_i, gemms = pl.kinds[g]
        pl.launches += len(gemms) + (im2col_i is not None) + (pack_i is not None)
    parts = slot0 if flat else nslots[chunk]
    # workspace: the partials, then one chunk's column matrix, then its channel-major dy
    part_bytes = parts * slot_bytes
    col_bytes = chunk * P * ncols * es if xv is None else 0
    pack_bytes = K * chunk * P * es if pack else 0
    pl.part_off = 0
    pl.col_off = round_up(part_bytes)
    pl.pack_off = pl.col_off + round_up(col_bytes)
    pl.workspace = (pl.pack_off + round_up(pack_bytes, 16) if pack else
                    pl.col_off + round_up(col_bytes, 16) if col_bytes else round_up(part_bytes, 16))
    pl.fold_bytes = part_bytes
    pl.fold = _add_wgrad_fold(pl, pb, parts, ncols, cols, inner, taps, orient)
    pl.gemm, pl.gemm_expr = None, ""
    pl.parts, pl.orient, pl.direct, pl.flat, pl.packs_dy, pl.chunk = parts, orient, xv is not None, flat, pack, chunk
    return pl


def _entry(mp, dy, dy_off, src, src_off, slot, orient):
    """A GEMM launch of the plan: (plan, A's source, A's offset, B's source, B's offset, partial index)."""
    if orient:
        return mp, src, src_off, dy, dy_off, slot
    return mp, dy, dy_off, src, src_off, slot


def _chunk_problem(pb, g):
    """pb with g images (the im2col of one chunk)."""
    s = pb.copy()
    s.n = g
    return s


def _tiles(pb, ncols, orient, tc):
    m, n = (ncols, pb.k) if orient else (pb.k, ncols)
    return cdiv(m, 128) * cdiv(n, 128) if tc else cdiv(m, 64) * cdiv(n, 128)


def _orientation(pb, ncols, tc):
    """True: the partials as [ncols x K] (m = the columns), where that wastes less of gemm_simt's 64 x 128
    tiles (the one it takes for a wave of many items); the tensor-core GEMMs keep m = K."""
    if tc:
        return False
    K = pb.k
    return cdiv(ncols, 64) * 64 * cdiv(K, 128) * 128 < cdiv(K, 64) * 64 * cdiv(ncols, 128) * 128


def _add_pack_rows(pl, pb, g):
    p = PackRowsParams()
    P = prod(pb.out3)
    p.rows, p.ch, p.imgs = P, pb.k, g
    p.s_img, p.s_ch, p.s_pos = pb.ys[0], pb.ys[1], _spatial_unit(pb.ys[2:], pb.out3) or 0
    p.out_ld = g * P
    if P > 2**31 - 1 or max(pb.k, g) > 65535:
        raise PydnnError(NS, f"algo: dy's {pb.k} channels x {g} images exceed pack_rows' grid (65535 each)")
    return pl.add_step(f"conv_gemm.{pb.tag}", _expr("pack_rows", pb.tag), (cdiv(P, 256), pb.k, g), (256, 1, 1), p)


def _add_wgrad_fold(pl, pb, parts, ncols, cols, inner, taps, orient):
    f = GemmFoldParams()
    f.k, f.cols, f.cg, f.taps, f.cin_inner, f.parts = pb.k, cols, pb.cg, taps, inner, parts
    for i in range(3):
        f.filt[i] = pb.filt3[i]
    for i in range(5):
        f.ws[i] = pb.ws[i]
    f.part_stride = pb.k * ncols
    f.ks, f.js = (1, pb.k) if orient else (ncols, 1)
    f.flags = FLAG_WF_KFAST if orient else 0
    if pb.k * cols > 2**31 - 1:
        raise PydnnError(NS, f"algo: dw's {pb.k * cols} elements exceed the fold's 2^31 - 1")
    return pl.add_step(f"conv_gemm.{pb.tag}", _expr("wgrad_fold", pb.tag), (cdiv(pb.k * cols, 256), 1, 1),
                       (256, 1, 1), f)


# ----------------------------------------------------------------------------- backward filter: the implicit variant

@kernel_params("conv_gemm_params.h", "WgradImplicitParams")
class WgradImplicitParams(ctypes.Structure):
    _fields_ = [
        ("x", ctypes.c_void_p), ("dy", ctypes.c_void_p), ("part", ctypes.c_void_p),
        ("k", ctypes.c_int), ("cols", ctypes.c_int), ("cg", ctypes.c_int), ("taps", ctypes.c_int),
        ("cin_inner", ctypes.c_int), ("npix", ctypes.c_int), ("per_slot", ctypes.c_int),
        ("in_size", ctypes.c_int * 3), ("out_size", ctypes.c_int * 3), ("filt", ctypes.c_int * 3),
        ("pad", ctypes.c_int * 3), ("stride", ctypes.c_int * 3), ("dil", ctypes.c_int * 3),
        ("flags", ctypes.c_uint), ("xs", ctypes.c_int * 5), ("ys", ctypes.c_int * 5),
        ("part_stride", ctypes.c_longlong),
    ]


WI_KT, WI_JT, WI_BK = 64, 160, 16   # wgrad_implicit's block tile (K x columns) and pixels per stage (ptx/conv_gemm.cu)
WI_THREADS = 160
WI_MINB = 3             # blocks per SM its registers are capped for (127 registers on sm_90, no spills; 4
                        # was 3% faster on the H100 stem but spills on sm_80: see the notes above)
IMPLICIT_MAX_COLS = WI_JT   # the columns (C * taps) it serves: one column tile (the kernel itself takes any)
WI_WAVES = 1            # slots: about WI_WAVES waves of WI_MINB blocks per SM
WI_MIN_SLOT = 64        # pixels per slot at least (4 stages: the pipeline's fill and the partial's write)
IMPLICIT_TFLOPS = 26.0  # the model's rate of the tile's work (64 x 160 per pixel, padding included; H100
                        # stem: 25.7 measured, 40 was the guess before)
FLAG_WI_KFAST = 1


def _implicit_expr(minb):
    return f"pydnn::conv_gemm::wgrad_implicit<float, {minb}>"


def _implicit_spans(pb):
    """The largest magnitudes wgrad_implicit's 32-bit offset arithmetic reaches in x and dy (bounds)."""
    xs, ys = [abs(v) for v in pb.xs], [abs(v) for v in pb.ys]
    xspan = pb.n * xs[0] + pb.c * xs[1]
    yspan = pb.n * ys[0] + (pb.k + WI_KT) * ys[1]
    for i in range(3):
        reach = pb.out3[i] * pb.stride3[i] + pb.pad3[i] + pb.filt3[i] * pb.dil3[i]
        xspan += reach * xs[2 + i]
        yspan += pb.out3[i] * ys[2 + i]
    return xspan, yspan


def wgrad_implicit_refusal(pb):
    """Why ALGO_3's implicit variant does not serve a problem that ALGO_3 serves (None when it does)."""
    if not tuning.conv_gemm.IMPLICIT:
        return "turned off (tuning.conv_gemm.IMPLICIT)"
    if pb.tag != "f32":
        return "float data only (fp32 FMA; 16-bit data keeps the tensor-core GEMMs)"
    cols = pb.c * prod(pb.filt3)
    if cols > IMPLICIT_MAX_COLS:
        return f"C * taps {cols} > {IMPLICIT_MAX_COLS} (one column tile)"
    dyv = _matrix_view(pb.ys, pb.out3, pb.k)
    if dyv is not None and _wgrad_direct_x(pb) is not None:
        return "1x1, stride 1, unpadded with x a matrix: the GEMMs read x itself"
    xspan, yspan = _implicit_spans(pb)
    npix = pb.n * prod(pb.out3)
    if max(xspan, yspan, npix + WI_MIN_SLOT) > INT_MAX:
        return f"offsets beyond 32 bits (x {xspan}, dy {yspan}, {npix} pixels)"
    return None


class WgradImplicitPlan(WgradGemmPlan):
    """ALGO_3's implicit variant: wgrad_implicit into `parts` partial dw's (one per slot of pixels), then
    wgrad_fold (see plan_wgrad_implicit)."""

    implicit = True
    direct = flat = packs_dy = orient = False

    def launch(self, handle, a_ptr, b_ptr, out_ptr, ws_ptr, alpha, beta, z_ptr=0, bias_ptr=0):
        """a = dy, b = x, out = dw."""
        p = self.steps[self.gather][4]
        p.x, p.dy, p.part = b_ptr, a_ptr, ws_ptr + self.part_off
        self.run_step(handle, self.gather)
        self.run_fold(handle, ws_ptr + self.part_off, out_ptr, alpha, beta)

    def estimate_ms(self, handle, base_estimate):
        """The busiest SM's blocks at IMPLICIT_TFLOPS / SMs (an SM short of WI_MINB blocks runs its last
        ones at LONE_BLOCK_SPEED each, at most the full rate), + the fold and its launch."""
        sms = max(handle.sm_count, 1)
        work = 2.0 * WI_KT * WI_JT * self.per_slot / (IMPLICIT_TFLOPS * 1e12 / sms)
        t = _busy_sm_blocks(self.blocks, sms, self.minb) * work
        return t * 1e3 + self.fold_bytes / (FOLD_GBPS * 1e6) + LAUNCH_MS


def _implicit_slots(handle, pb, npix, tiles, slot_bytes):
    """(slots, pixels per slot): about WI_WAVES waves of WI_MINB blocks per SM over the `tiles` (column x
    K) tiles, slots of at least WI_MIN_SLOT pixels in whole stages, the partials within tuning.conv_gemm.PART_LIMIT."""
    want = max(1, WI_WAVES * WI_MINB * max(handle.sm_count, 1) // max(tiles, 1))
    per = cdiv(max(WI_MIN_SLOT, cdiv(npix, want)), WI_BK) * WI_BK
    while cdiv(npix, per) * slot_bytes > tuning.conv_gemm.PART_LIMIT and per < npix:
        per *= 2
    return cdiv(npix, per), per


def plan_wgrad_implicit(handle, pb, algo):
    """ALGO_3 without a column matrix: wgrad_implicit (grid: slots of pixels x column tiles x K tiles;
    each block sums its slot's pixels into a 64 x 160 tile of partial dw[slot][k][column]) writes one
    partial per slot into the workspace, wgrad_fold sums them in ascending slot order with alpha / beta
    through dw's strides (deterministic). Columns in the filter format's order (cin_inner), as the
    explicit GEMMs'."""
    pl = WgradImplicitPlan(DIR_BWD_FILTER, algo, pb)
    taps, K = prod(pb.filt3), pb.k
    cols = pb.c * taps
    inner = 1 if pb.w_format == E.PYDNN_TENSOR_NHWC else 0
    npix = pb.n * prod(pb.out3)
    ctiles, ktiles = cdiv(cols, WI_JT), cdiv(K, WI_KT)
    slot_bytes = K * cols * pl.itemsize
    parts, per = _implicit_slots(handle, pb, npix, ctiles * ktiles, slot_bytes)
    p = WgradImplicitParams()
    p.k, p.cols, p.cg, p.taps, p.cin_inner = K, cols, pb.cg, taps, inner
    p.npix, p.per_slot = npix, per
    for i in range(3):
        p.in_size[i], p.out_size[i], p.filt[i] = pb.in3[i], pb.out3[i], pb.filt3[i]
        p.pad[i], p.stride[i], p.dil[i] = pb.pad3[i], pb.stride3[i], pb.dil3[i]
    for i in range(5):
        p.xs[i], p.ys[i] = pb.xs[i], pb.ys[i]
    p.flags = (FLAG_FLIP if pb.flip else 0) | (FLAG_WI_KFAST if pb.ys[1] == 1 and K > 1 else 0)
    p.part_stride = K * cols
    pl.minb = WI_MINB
    pl.gather = pl.add_step(f"conv_gemm.{pb.tag}", _implicit_expr(pl.minb), (parts, ctiles, ktiles),
                            (WI_THREADS, 1, 1), p)
    pl.blocks = parts * ctiles * ktiles
    pl.parts, pl.per_slot, pl.slot = parts, per, K * cols
    pl.part_off = 0
    pl.workspace = round_up(parts * slot_bytes, 16)
    pl.fold_bytes = parts * slot_bytes
    pl.fold = _add_wgrad_fold(pl, pb, parts, cols, cols, inner, taps, False)
    pl.gemm, pl.gemm_expr = None, ""
    pl.chunk, pl.launches = pb.n, 2
    return pl


_units()


@register(DIR_FWD, E.PYDNN_CONVOLUTION_FWD_ALGO_GEMM)
def plan_forward(handle, pb, direction, algo):
    return plan_gemm(handle, pb, algo)


@register(DIR_BWD_DATA, E.PYDNN_CONVOLUTION_BWD_DATA_ALGO_1, order=1, refusal=lambda pb: bwd_data_gemm_refusal(pb))
def plan_backward_data(handle, pb, direction, algo):
    """BWD_DATA_ALGO_1 where the tensor-core implicit GEMM refuses (tensor_core.py)."""
    return plan_bwd_data_gemm(handle, pb, algo)


def bwd_data_mm16_refusal(pb):
    """Why BWD_DATA_ALGO_0's GEMM form (16-bit 1x1 problems through pydnn.ops.matmul) cannot serve a
    problem (None when it can; the CUDA-core gather serves the rest)."""
    if not mm16_ok(pb) or not _bwd_direct_ok(pb):
        # strided / padded ones would take col2im: measured (H200, N128 1x1/2 256->512 @56 and 1024->2048 @14)
        # 1.338 / 0.372 ms against ALGO_1's phases 0.172 / 0.083
        return ("its GEMM form serves 16-bit 1x1, stride-1, unpadded problems with one group and the math type "
                "not FMA (tuning.conv_gemm.MM_1X1)")
    return bwd_data_gemm_refusal(pb)


@register(DIR_BWD_DATA, E.PYDNN_CONVOLUTION_BWD_DATA_ALGO_0, order=-1, refusal=bwd_data_mm16_refusal)
def plan_backward_data_mm16(handle, pb, direction, algo):
    """BWD_DATA_ALGO_0 for 16-bit 1x1 problems (issue 18): dx = dy . W as one matmul (stride 1, unpadded),
    or col = dy . W + col2im (strided or padded: the col2im scatters into dx and writes the positions no
    output reaches as beta * dx); deterministic. Get..._v7 ranks it against ALGO_1's implicit GEMMs by
    mm16_ms, Find by timing. None (the CUDA-core gather then) where dx and dy do not read as matrices."""
    try:
        return plan_bwd_data_gemm(handle, pb, algo)
    except PydnnError as e:
        if e.status != NS:
            raise
        return None


@register(DIR_BWD_FILTER, E.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_3)
def plan_backward_filter(handle, pb, direction, algo):
    return plan_wgrad_gemm(handle, pb, algo)


def kernel_units():
    """This module's kernel units."""
    return _family_units("conv_gemm.")
