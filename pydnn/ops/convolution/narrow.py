"""1x1 convolutions with few output channels (K < 8), stride 1, no padding, one group, half / bfloat16,
x and y packed NHWC, 8 <= C <= 256 with C % 8 == 0: memory-bound streams on CUDA cores (ptx/conv_narrow.cu).

    forward          IMPLICIT_GEMM  narrow_fwd (the fused bias / z / activation too)
    backward data    ALGO_0         narrow_dgrad
    backward filter  ALGO_0         narrow_wgrad (fp32 partials a block) + narrow_wfold (deterministic)

Why (issue 18's sweep, H200, 2026-11-28): the UNet head 1x1 64 -> 2 @128 ran the CUDA-core implicit GEMM
(64 x 64 tiles over 2 useful columns) at 0.050-0.074x cuDNN forward, 0.076x backward filter at N 8, and the
tile GEMMs at 0.34-0.53x for the rest; the tensor-core paths refuse K % 8 != 0. Each direction reads the
wide operand once (x: 268 MB at N 128) and the narrow one (y / dy: K / C of it) with it.

Model (Get..._v7): the bytes moved at DRAM_GBPS over the filled part of a wave, plus launches.
"""
from ... import enums as E
from ..._build.params import FLAG_BETA
from ..._cuda import driver
from ...status import PydnnError
from .._elementwise import CTYPE
from ..common import cdiv, prod
from .plans import LAUNCH_MS, StepPlan, add_kernels, base_params, load_function, register, round_up
from .problem import DIR_BWD_DATA, DIR_BWD_FILTER, DIR_FWD, TC_TAGS, ConvAuxParams, packed_nhwc

SOURCE = "conv_narrow.cu"
MAX_K = 7      # K < 8: where the tensor-core paths refuse (K % 8) or run an n8 MMA mostly empty
MAX_C = 256
THREADS = 256
UNROLL = 4
DRAM_GBPS = 3000.0
WAVES = 2                  # blocks: at most this many waves of 8 blocks a SM (grid-stride beyond)
WGRAD_BLOCKS_PER_SM = 4    # backward filter: the partials' blocks (KT 2: 48 registers, 5 blocks a SM fit)


def unit(tag):
    return f"convolution.narrow.{tag}"


KTS = (1, 2, 4, 8)          # the kernels' KT: K rounded up to one of these


def kt(k):
    return next(t for t in KTS if t >= k)


def _expr(name, tag, k=None):
    return f"pydnn::conv::{name}<{CTYPE[tag]}" + (f", {k}>" if k is not None else ">")


def exprs(tag):
    return ([_expr(n, tag, k) for n in ("narrow_fwd", "narrow_dgrad", "narrow_wgrad") for k in KTS]
            + [_expr("narrow_wfold", tag)])


for _t in TC_TAGS:
    add_kernels(unit(_t), SOURCE, exprs(_t))


def refusal(pb):
    """Why the narrow kernels do not serve pb (None: they do)."""
    if pb.tag not in TC_TAGS:
        return "not half / bfloat16"
    if pb.groups != 1:
        return "groups"
    if pb.k > MAX_K:
        return f"K {pb.k} > {MAX_K} (the tensor-core and GEMM paths serve K = 8 and up)"
    if pb.c % 8 or not 8 <= pb.c <= MAX_C:
        return f"C {pb.c}: a multiple of 8 in 8..{MAX_C}"
    if any(f != 1 for f in pb.filt3) or any(s != 1 for s in pb.stride3) or any(pb.pad3):
        return "not a 1x1, stride-1, unpadded convolution"
    if not packed_nhwc(pb.xs, pb.c, pb.in3) or not packed_nhwc(pb.ys, pb.k, pb.out3):
        return "x / y not packed NHWC"
    if pb.n * prod(pb.in3) > 2**31 - 1:
        return "more than 2^31 - 1 pixels"
    return None


def lanes(c):
    """G: the lanes a pixel (a power of two covering C / 8 16-byte vectors)."""
    g = 1
    while g * 8 < c:
        g *= 2
    return g


class NarrowPlan(StepPlan):
    def __init__(self, handle, pb, direction, algo):
        super().__init__(direction, algo, pb)
        self.unit = unit(pb.tag)
        self.align = 16
        self.pixels = pb.n * prod(pb.in3)
        self.g = lanes(pb.c)
        p = base_params(pb, direction)
        p.flags = 0
        p.gm, p.gn = self.pixels, self.g
        self.gemm = p
        sms = max(handle.sm_count, 1)
        per_block = THREADS // 32 * (32 // self.g)   # pixels a block's round
        need = cdiv(self.pixels, per_block * UNROLL)
        if direction == DIR_BWD_FILTER:
            self.blocks = max(1, min(need, WGRAD_BLOCKS_PER_SM * sms))
        else:
            self.blocks = max(1, min(need, WAVES * 8 * sms))
        name = {DIR_FWD: "narrow_fwd", DIR_BWD_DATA: "narrow_dgrad", DIR_BWD_FILTER: "narrow_wgrad"}[direction]
        self.gemm_expr = _expr(name, pb.tag, kt(pb.k))
        self.gemm_argv = driver.kernel_args(p)
        self.gemm_func = None
        self.smem = pb.k * pb.c * 4 if direction == DIR_BWD_FILTER else 0
        if direction == DIR_BWD_FILTER:
            self.partial_bytes = self.blocks * pb.k * pb.c * 4
            self.workspace = round_up(self.partial_bytes)
            f = ConvAuxParams()
            f.kg, f.cg, f.splits = pb.k, pb.c, self.blocks
            for i in range(5):
                f.out_stride[i] = pb.ws[i]
            self.fold_params = f
            self.fold_step = self.add_step(self.unit, _expr("narrow_wfold", pb.tag),
                                           (cdiv(pb.k * pb.c * 32, 256), 1, 1), (256, 1, 1), f)

    def launch(self, handle, a_ptr, b_ptr, out_ptr, ws_ptr, alpha, beta, z_ptr=0, bias_ptr=0):
        """forward: a = x, b = w, out = y; backward data: a = dy, b = w, out = dx; backward filter: a = dy,
        b = x, out = dw."""
        wide = {DIR_FWD: a_ptr, DIR_BWD_DATA: out_ptr, DIR_BWD_FILTER: b_ptr}[self.direction]
        if wide % 16:
            raise PydnnError(E.PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER,
                             f"the narrow 1x1 kernels move the C-channel tensor in 16-byte vectors: {wide:#x} "
                             f"is not 16-byte aligned")
        if self.gemm_func is None:
            self.gemm_func = load_function(handle, self.unit, self.gemm_expr, self.smem)
        p = self.gemm
        p.x, p.w = a_ptr, b_ptr
        p.z, p.bias = z_ptr or None, bias_ptr or None
        if self.direction == DIR_BWD_FILTER:
            p.out = ws_ptr
            driver.launch_args(self.gemm_func, (self.blocks, 1, 1), (THREADS, 1, 1), self.smem, handle.cu_stream,
                               self.gemm_argv)
            f = self.fold_params
            f.out, f.in_, f.alpha, f.beta = out_ptr, ws_ptr, alpha, beta
            f.flags = FLAG_BETA if beta != 0 else 0
            self.run_step(handle, self.fold_step)
            return
        p.out, p.alpha, p.beta = out_ptr, alpha, beta
        p.flags = (p.flags & ~FLAG_BETA) | (FLAG_BETA if beta != 0 else 0)
        driver.launch_args(self.gemm_func, (self.blocks, 1, 1), (THREADS, 1, 1), 0, handle.cu_stream,
                           self.gemm_argv)

    def estimate_ms(self, handle, base_estimate):
        pb = self.problem
        moved = self.pixels * (pb.c + pb.k) * 2
        t = moved / (DRAM_GBPS * 1e6)
        full = (WGRAD_BLOCKS_PER_SM if self.direction == DIR_BWD_FILTER else 2) * max(handle.sm_count, 1)
        fill = min(1.0, self.blocks / full)   # (grid-stride; assumed: 2 blocks of 8 warps a SM stream at the rate)
        t = t / max(fill, 0.1)
        if self.direction == DIR_BWD_FILTER:
            t += LAUNCH_MS + 2 * self.partial_bytes / (DRAM_GBPS * 1e6)
        return t


def _planner(direction):
    def plan(handle, pb, d, algo):
        from ... import tuning
        if not tuning.conv.NARROW_1X1 or refusal(pb) is not None:
            return None
        return NarrowPlan(handle, pb, direction, algo)
    return plan


# first among each algorithm's candidates (gemm.py's 1x1 matmul backward data is at -1)
register(DIR_FWD, E.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, order=-2)(_planner(DIR_FWD))
register(DIR_BWD_DATA, E.PYDNN_CONVOLUTION_BWD_DATA_ALGO_0, order=-2)(_planner(DIR_BWD_DATA))
register(DIR_BWD_FILTER, E.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_0, order=-2)(_planner(DIR_BWD_FILTER))
