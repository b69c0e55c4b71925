"""1x1 convolutions with a short reduction on tensor cores, as persistent streams (ptx/conv_stream.cu):
stride 1, no padding, one group, half / bfloat16, x and y packed NHWC, the reduction (forward: C; backward
data: K) a multiple of 8 up to 128 and the other side (forward: K; backward data: C) a multiple of 8 up to 512
(past 256: column chunks of 256, a block each, A read once a chunk).

    forward          IMPLICIT_PRECOMP_GEMM  stream_1x1<T, KP, NT, false> (the fused bias / z / activation too)
    backward data    ALGO_1                 stream_1x1<T, KP, NT, true>

Why (issue 18's sweep, H200): N32 1x1 64->64 @56 forward and backward data ran 0.267x / 0.268x cuDNN on
implicit_gemm_pipe_tc, 1x1 32->400 / 40->280 0.33-0.40x on fwd_tma; these are GEMMs of one to eight k16 steps that
move 2 (C + K) bytes a pixel, and one tile a block cannot overlap its stores with the next tile's loads. The kernel
keeps the filter in shared memory and walks 64-pixel tiles through a 4-deep cp.async ring (the same rows: 0.62x,
0.90x, 0.79x). On sm_90 an output side past 128 with a reduction of at least matmul.WG_PERSIST_MIN_K goes to
matmul's persistent wgmma GEMM instead (wgmma_takes), which ran those at 0.99-1.25x.

Model (Get..._v7): the bytes moved at DRAM_GBPS over the filled part of a wave.
"""
from ... import enums as E
from ..._build.params import FLAG_BETA
from ..._cuda import driver
from ...status import PydnnError
from .._elementwise import CTYPE
from ..common import cdiv, prod
from .plans import StepPlan, add_kernels, base_params, load_function, register
from .problem import DIR_BWD_DATA, DIR_FWD, TC_TAGS, packed_nhwc

SOURCE = "conv_stream.cu"
THREADS = 256
BM = 64                    # pixel rows a tile (kStreamBM)
STAGES = 4                 # the ring (kStreamStages)
MAX_R = 128                # the reduction: C (forward) / K (backward data)
NTS = (64, 128, 256)       # the output side's tile: the smallest that holds it (256-wide chunks past 256)
MAX_N = 512
# the reduction rounded up: 3 widths, not every k16 step (8), so that the units are 3/8 as many (installed: 18
# instantiations a type); the padded k16 steps read zero-filled shared memory, no global bytes
KPS = (32, 64, 128)
# 256 threads at <= 128 registers: 2 blocks a SM where shared memory holds two. Not the driver's occupancy: 64 x 64
# uses 76 registers, so 3 fit, but 3 ran slower (H200, tools/bench_conv1x1.py --stream: N128 64 -> 64
# forward 33.2 -> 35.6 us, N8 5.1 -> 5.6 us; N32 10.6 -> 10.7 us)
BLOCKS_PER_SM = 2
SMEM_PER_SM = 227 * 1024   # (sm_80 / sm_90: 228 KB a SM, 227 KB a block at most)
DRAM_GBPS = 3000.0


def unit(tag):
    return f"convolution.stream.{tag}"


def _expr(tag, kp, nt, kn):
    return f"pydnn::conv::stream_1x1<{CTYPE[tag]}, {kp}, {nt}, {'true' if kn else 'false'}>"


for _t in TC_TAGS:
    add_kernels(unit(_t), SOURCE, [_expr(_t, kp, nt, kn) for kn in (False, True) for kp in KPS for nt in NTS])


def smem_bytes(kp, nt, kn):
    """StreamSmem<KP, NT, KN>::bytes: the ring of A tiles and the filter, rows padded by 16 bytes."""
    a = STAGES * BM * (kp + 8)
    b = kp * (nt + 8) if kn else nt * (kp + 8)
    return (a + b) * 2


def blocks_per_sm(kp, nt, kn):
    """StreamMinBlocks: 2 where shared memory holds two blocks and the tile fits 128 registers (KP <= 64 or NT <=
    128: ptxas spilled KP 96 x NT 256 at 128), else 1."""
    return BLOCKS_PER_SM if 2 * smem_bytes(kp, nt, kn) <= SMEM_PER_SM and (kp <= 64 or nt <= 128) else 1


def _sides(pb, direction):
    """(reduction, output side) of the GEMM: forward (C, K), backward data (K, C)."""
    return (pb.c, pb.k) if direction == DIR_FWD else (pb.k, pb.c)


def refusal(pb, direction):
    """Why the streaming kernels do not serve pb in `direction` (None: they do)."""
    if pb.tag not in TC_TAGS:
        return "not half / bfloat16"
    if pb.math_type == E.PYDNN_FMA_MATH:
        return "FMA math (tensor cores)"
    if pb.groups != 1:
        return "groups"
    if any(f != 1 for f in pb.filt3) or any(s != 1 for s in pb.stride3) or any(pb.pad3):
        return "not a 1x1, stride-1, unpadded convolution"
    r, n = _sides(pb, direction)
    if r % 8 or r > MAX_R:
        return f"reduction {r}: a multiple of 8 up to {MAX_R}"
    if n % 8 or n > MAX_N:
        return f"output channels {n}: a multiple of 8 up to {MAX_N}"
    if not packed_nhwc(pb.xs, pb.c, pb.in3) or not packed_nhwc(pb.ys, pb.k, pb.out3):
        return "x / y not packed NHWC"
    if pb.ws[0] != pb.c or (pb.c > 1 and pb.ws[1] != 1):
        return "the filter not packed (K, C)"
    if pb.n * prod(pb.in3) > 2**31 - 1:
        return "more than 2^31 - 1 pixels (ConvParams.gm)"
    return None


class StreamPlan(StepPlan):
    def __init__(self, handle, pb, direction, algo):
        super().__init__(direction, algo, pb)
        self.unit = unit(pb.tag)
        self.align = 16
        self.pixels = pb.n * prod(pb.in3)
        r, n = _sides(pb, direction)
        kp = next(k for k in KPS if k >= r)
        nt = next((t for t in NTS if t >= n), NTS[-1])
        self.chunks = cdiv(n, nt)   # column chunks
        kn = direction == DIR_BWD_DATA
        p = base_params(pb, direction)
        p.flags = 0
        p.gm, p.gn, p.gk, p.splits = self.pixels, n, r, self.chunks
        self.gemm = p
        self.smem = smem_bytes(kp, nt, kn)
        self.per_sm = blocks_per_sm(kp, nt, kn)
        per_chunk = max(1, min(cdiv(self.pixels, BM), self.per_sm * max(handle.sm_count, 1) // self.chunks))
        self.blocks = per_chunk * self.chunks   # (a multiple of the chunks: block b takes chunk b % chunks)
        self.gemm_expr = _expr(pb.tag, kp, nt, kn)
        self.gemm_argv = driver.kernel_args(p)
        self.gemm_func = None

    def launch(self, handle, a_ptr, b_ptr, out_ptr, ws_ptr, alpha, beta, z_ptr=0, bias_ptr=0):
        """forward: a = x, b = w, out = y; backward data: a = dy, b = w, out = dx."""
        if (a_ptr | b_ptr | out_ptr) & 15:
            what, ptr = next(wp for wp in (("the input", a_ptr), ("w", b_ptr), ("the output", out_ptr)) if wp[1] & 15)
            raise PydnnError(E.PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER,
                             f"the streaming 1x1 kernels move {what} in 16-byte vectors: {ptr:#x} is not 16-byte "
                             f"aligned")
        if self.gemm_func is None:
            self.gemm_func = load_function(handle, self.unit, self.gemm_expr, self.smem)
        p = self.gemm
        p.x, p.w, p.out = a_ptr, b_ptr, out_ptr
        p.z, p.bias = z_ptr or None, bias_ptr or None
        p.alpha, p.beta = alpha, beta
        p.flags = (p.flags & ~FLAG_BETA) | (FLAG_BETA if beta != 0 else 0)
        driver.launch_args(self.gemm_func, (self.blocks, 1, 1), (THREADS, 1, 1), self.smem, handle.cu_stream,
                           self.gemm_argv)

    def estimate_ms(self, handle, base_estimate):
        pb = self.problem
        r, n = _sides(pb, self.direction)
        t = self.pixels * (self.chunks * r + n) * 2 / (DRAM_GBPS * 1e6)
        fill = min(1.0, self.blocks / (self.per_sm * max(handle.sm_count, 1)))
        return t / max(fill, 0.1)


def wgmma_takes(handle, pb, direction):
    """Whether matmul's persistent 128x256 wgmma tile serves this GEMM better (sm_90, an output side past 128, a
    reduction of at least tuning.matmul.WG_PERSIST_MIN_K). Measured (H200, the sweep's 1x1 rows in
    one call): those rows ran 0.99-1.25x cuDNN on gemm_wgmma_p against 0.58-0.94x on these kernels."""
    from ... import tuning
    r, n = _sides(pb, direction)
    return (handle.arch == "sm_90" and tuning.matmul.USE_WGMMA and n > NTS[1]
            and r >= tuning.matmul.WG_PERSIST_MIN_K)


def _planner(direction):
    def plan(handle, pb, d, algo):
        from ... import tuning
        if not tuning.conv.STREAM_1X1 or refusal(pb, direction) is not None or wgmma_takes(handle, pb, direction):
            return None
        return StreamPlan(handle, pb, direction, algo)
    return plan


# first among the algorithm's candidates (the switch off: never a candidate)
register(DIR_FWD, E.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, order=-5)(_planner(DIR_FWD))
register(DIR_BWD_DATA, E.PYDNN_CONVOLUTION_BWD_DATA_ALGO_1, order=-5)(_planner(DIR_BWD_DATA))
