"""Convolution (cudnnConvolution*): descriptors, shape queries, forward, backward data, backward filter,
backward bias, fused bias + activation forward, workspace sizes; algorithm queries and Find live in
convolution_algos.py. Kernels: ptx/convolution.cu (params: ptx/convolution_params.h).

    forward          y  = alpha * conv(x, w) + beta * y
    backward data    dx = alpha * conv^T(dy, w) + beta * dx
    backward filter  dw = alpha * corr(x, dy) + beta * dw
    backward bias    db = alpha * sum over (n, spatial) of dy + beta * db
    bias+activation  y  = act(alpha1 * conv(x, w) + alpha2 * z + bias)     (inside the conv's epilogue)

1 to 3 spatial dims (x and y of 3 to 5 dims; the descriptor's array length is the spatial count), any
tensor strides (NCHW, NHWC, gaps), filters in NCHW (K, C, spatial) or NHWC (K, spatial, C) format,
groups (depthwise too), padding, stride, dilation, CONVOLUTION (flipped filter) and CROSS_CORRELATION.
Data types: x, w, y (dx, dw, dy, z, bias) of one type: float, half and bfloat16 with FLOAT compute
(HALF compute is accepted for half data and also accumulates in float), double with DOUBLE compute.

Algorithms implemented (the rest answer NOT_SUPPORTED with the reason):
    forward          IMPLICIT_GEMM   CUDA cores, every shape, no workspace, deterministic
                     IMPLICIT_PRECOMP_GEMM  tensor cores (mma.sync m16n8k16, ldmatrix, cp.async; the
                                     pipelined implicit_gemm_pipe_tc where C % 64 == 0, else fwd_tc;
                                     tiles from the models _tcp_tiling / _tc_tiling; on sm_90 with
                                     C % 64 == 0 and >= WGM_MIN_KTILES (4) K tiles a block, fwd_wgmma: the same gather
                                     on Hopper wgmma, sm_90a units, tiles from _wgm_tiling),
                                     half / bfloat16, NHWC x and filter, C % 8 == 0, one group;
                                     deterministic, no workspace. The fused bias + activation (and
                                     beta, z) run in the same kernel's epilogue: bias + IDENTITY / RELU /
                                     CLIPPED_RELU in registers, the rest staged through shared memory
    backward data    ALGO_0          CUDA cores, every shape, gather form (no atomics), no workspace,
                                     deterministic (cuDNN's ALGO_0 is not; ours is, and says so)
                     ALGO_1          tensor cores, the same conditions as IMPLICIT_PRECOMP_GEMM (dy NHWC,
                                     K % 8 == 0 too); deterministic, no workspace. On sm_90 with stride 1
                                     where the model (or a forced WGM tile) takes fwd_wgmma: the forward
                                     of dy reading the filter as [k][c] tiles (_plan_bwd_wgmma); for a
                                     filter it cannot read so (or WGM_BWD_SWAP), the filter with K and C
                                     swapped first (filter_kc_swap, K * C * taps elements in the workspace).
                                     Where the tensor cores refuse and C < 64 or the stride > 1 (the 7x7
                                     stem), float / half / bfloat16, one group: an explicit GEMM (dy .
                                     filter into the workspace, pydnn.ops.matmul) + a col2im gather,
                                     deterministic (convolution_gemm.py); 1x1 unpadded stride-1 ones
                                     (any C): one matmul straight into dx, no workspace
    backward filter  ALGO_0          CUDA cores, one pass (no split of the reduction), no workspace,
                                     deterministic
                     ALGO_1          the reduction split over blocks into a workspace of fp32 partial
                                     sums, added in a fixed order by a second kernel: deterministic
                                     (bitwise reproducible), more parallel. On tensor cores for half /
                                     bfloat16 with NHWC-like x and dy, C % 8 == 0, K % 8 == 0, one group,
                                     any filter format: wgrad_pipe_tc (the pipelined loop; dy packed
                                     NHWC) or wgrad_tc, (tile, split) chosen by a model
                                     (_wgrad_pipe_tiling / _wgrad_tiling; one split writes dw directly,
                                     no workspace); on sm_90 first wgrad_tc_wgmma where it applies
                                     (Hopper wgmma, MN-major operands; its own split model and
                                     deterministic fold: convolution_wgrad_wgmma.py); else the
                                     CUDA-core kernel
                     ALGO_3          explicit GEMMs (im2col, or x itself for 1x1) into partial dw's,
                                     summed in a fixed order: deterministic (convolution_gemm.py)
    and in their own modules: forward GEMM (convolution_gemm.py), forward and backward data
    WINOGRAD_NONFUSED, forward, backward data and backward filter (convolution_winograd.py: its GEMMs
    on pydnn.ops.matmul), FFT in all three
    directions (convolution_fft.py).
"""
import ctypes

from .. import enums as E
from .._build.manifest import KernelUnit
from .._build.params import FLAG_BETA, FLAG_NAN_PROP, kernel_params
from .._cuda import driver
from ..buffers import device_ptr
from ..handle import check_handle
from ..status import PydnnError, api
from ..tensor import DTYPES, _int, check_filter, check_tensor
from .common import FLOAT_TAGS, TAG, cdiv, element_aligned, enum_arg, float_tensor, output_tensor, prod, scalar
from ._elementwise import CTYPE
from .convolution_gemm import StepPlan

BAD, NS = E.PYDNN_STATUS_BAD_PARAM, E.PYDNN_STATUS_NOT_SUPPORTED

# ----------------------------------------------------------------------------- kernel parameters

FLAG_Z, FLAG_BIAS, FLAG_FLIP, FLAG_A_KFAST, FLAG_B_KFAST, FLAG_PARTIAL, FLAG_CIN, FLAG_PAIR, FLAG_STAGED = \
    4, 8, 16, 32, 64, 128, 256, 512, 1024
ACT = {E.PYDNN_ACTIVATION_IDENTITY: 0, E.PYDNN_ACTIVATION_RELU: 1, E.PYDNN_ACTIVATION_CLIPPED_RELU: 2,
       E.PYDNN_ACTIVATION_SIGMOID: 3, E.PYDNN_ACTIVATION_TANH: 4, E.PYDNN_ACTIVATION_ELU: 5}
BM, BN, BK, THREADS = 64, 64, 16, 256   # kBM, kBN, kBK, kThreads in ptx/convolution.cu
DIR_FWD, DIR_BWD_DATA, DIR_BWD_FILTER = 0, 1, 2
MAX_SPLITS = 64
INT_MAX = 2**31 - 1


@kernel_params("convolution_params.h", "ConvParams")
class ConvParams(ctypes.Structure):
    _fields_ = [
        ("x", ctypes.c_void_p), ("w", ctypes.c_void_p), ("out", ctypes.c_void_p),
        ("z", ctypes.c_void_p), ("bias", ctypes.c_void_p),
        ("alpha", ctypes.c_double), ("beta", ctypes.c_double), ("alpha2", ctypes.c_double),
        ("coef", ctypes.c_double),
        ("batch", ctypes.c_int), ("groups", ctypes.c_int), ("cg", ctypes.c_int), ("kg", ctypes.c_int),
        ("in_size", ctypes.c_int * 3), ("out_size", ctypes.c_int * 3), ("filt", ctypes.c_int * 3),
        ("pad", ctypes.c_int * 3), ("stride", ctypes.c_int * 3), ("dil", ctypes.c_int * 3),
        ("gm", ctypes.c_int), ("gn", ctypes.c_int), ("gk", ctypes.c_int),
        ("splits", ctypes.c_int), ("k_per_split", ctypes.c_int), ("act", ctypes.c_int),
        ("flags", ctypes.c_uint),
        ("red_size", ctypes.c_int * 4), ("red_step", ctypes.c_int * 4), ("pad_", ctypes.c_int),
        ("xs", ctypes.c_longlong * 5), ("ys", ctypes.c_longlong * 5), ("ws", ctypes.c_longlong * 5),
        ("zs", ctypes.c_longlong * 5), ("bias_stride", ctypes.c_longlong),
    ]


@kernel_params("convolution_params.h", "ConvAuxParams")
class ConvAuxParams(ctypes.Structure):
    _fields_ = [
        ("out", ctypes.c_void_p), ("in_", ctypes.c_void_p),
        ("alpha", ctypes.c_double), ("beta", ctypes.c_double),
        ("groups", ctypes.c_int), ("kg", ctypes.c_int), ("cg", ctypes.c_int), ("taps", ctypes.c_int),
        ("filt", ctypes.c_int * 3), ("splits", ctypes.c_int), ("flags", ctypes.c_uint),
        ("channels", ctypes.c_int), ("count", ctypes.c_longlong), ("inner", ctypes.c_int * 4),
        ("in_stride", ctypes.c_longlong * 5), ("out_stride", ctypes.c_longlong * 5),
    ]
    C_NAMES = {"in_": "in"}


TC_TAGS = ("f16", "bf16")   # data types of the tensor-core kernels
TC_BK, TC_LD, TC_STAGES = 32, 40, 4   # kTcBK, kTcLd, TcShape::STAGES
TC_TILES = ((128, 128), (128, 64), (64, 128), (64, 64))   # fwd_tc / bwd_data_tc<T, BM, BN> instantiations
WG_BMS, WG_BN, WG_STAGES = (128, 64), 128, 4   # wgrad_tc<T, BM> instantiations; kWgBN, WgShape::STAGES
# implicit_gemm_pipe_tc<DIR, T, BM, BN, WARPS_M, WARPS_N, MINB, DB> instantiations (forward and stride-1
# backward data on the pipelined main loop, ptx/common/mma_pipe.cuh): BM x BN tiles of WARPS_M x WARPS_N
# warps, MINB blocks per SM for the register cap, DB 1: fragments double-buffered; TCP_BK-deep K tiles,
# TCP_STAGES stages
TCP_TILES = ((128, 64, 4, 1, 3, 0), (128, 128, 4, 2, 2, 0))
TCP_BK, TCP_STAGES = 64, 3   # mma::kPipeBK, kPipeStages
# wgrad_pipe_tc<T, BM, BN, WARPS_M, WARPS_N, MINB> instantiations (backward filter on the pipelined loop)
WGP_TILES = ((128, 128, 4, 2, 2), (64, 128, 2, 2, 3), (128, 64, 4, 1, 3))
WG_PIPE = True   # the backward filter's model picks wgrad_pipe_tc where it applies (else wgrad_tc)
# direction -> a tiling used instead of the model's choice, for tests and benchmarks: (BM, BN) for the
# forward and backward-data kernels (fwd_tc / bwd_data_tc), a TCP_TILES entry for the pipelined ones
# (used where they apply, else the model's fwd_tc / bwd_data_tc tile), (BM, splits) for the backward filter
# (wgrad_tc) or (a WGP_TILES entry, splits) (wgrad_pipe_tc where it applies, else the model's choice)
TC_FORCE = {}
# fwd_wgmma<T, BN, STAGES, MINB, LEAN, BKN> instantiations (the forward on Hopper's wgmma, ptx/convolution.cu; units
# convolution.wgmma.<tag>, compiled for sm_90a only): (BM = 128, BN, STAGES, MINB) tiles, two warpgroups
# (256 threads), the pipelined forward's gather into 1 KiB-aligned 128B-swizzled stages. A forced forward
# or backward-data tiling (TC_FORCE[DIR_FWD] / [DIR_BWD_DATA]) may name one; it runs where
# implicit_gemm_pipe_tc applies on a device of arch WGM_ARCH (elsewhere the model's choice runs); backward
# data runs as the forward of dy, its B read from the filter as [k][c] (or after filter_kc_swap:
# _plan_bwd_wgmma). USE_WGM: the model picks it instead of
# implicit_gemm_pipe_tc (sm_90 only, channels % 64 == 0, at least WGM_MIN_KTILES K tiles a block: where
# tools/bench_convolution.py measured it faster: v8 the ResNet 3x3 layers' 9-72 K tiles, 1.17-1.42x; v14 the
# 1x1 layers' 4 K tiles (1x1 over 256 channels), 1.11-1.17x with v12's 128x64 tile in two runs, while with
# 1 K tile (1x1 over 64 channels) every wgmma tile ran ~0.8x). WGM_TILE_SPEED: a tile's speed per flop at
# equal work on the busiest SM (v8: the 128-wide tile ~10% faster where both tiles load the SMs alike; v12
# with the lean copies: the same picks are the faster tile on each ResNet 3x3 layer), see _wgm_tiling.
# Entries (BM, BN, STAGES, MINB, LEAN): LEAN = 1 is v12's copy loop (the per-K-tile tap offsets computed once,
# no branch per chunk, the k16 descriptors by increments; tools/bench_convolution.py v12: 1.07-1.42x the v8
# loop on the bf16 3x3 layers, H200). WGM_VARIANTS keeps v8's loop (LEAN = 0) as forced tilings only, so the
# benchmark times both in one run. (v14's LEAN = 2 loop, 25-28% fewer instructions a K tile, ran 3-23% under
# v12 on every layer in three runs and was reverted: tools/bench_convolution.py v14.)
WGM_TILES = ((128, 64, 4, 2, 1), (128, 128, 4, 1, 1))
WGM_VARIANTS = ((128, 64, 4, 2), (128, 128, 4, 1))
WGM_ARCH = "sm_90"
USE_WGM = True
WGM_MIN_KTILES = 4
WGM_TILE_SPEED = {(128, 64, 4, 2, 1): 1.0, (128, 128, 4, 1, 1): 1.1}
# the plain tensor-core forward through the shared-memory staged epilogue too (FLAG_STAGED; the fused
# bias / z / activation and beta != 0 always take it): a benchmark switch, read when a plan is made
TC_STAGED_PLAIN = False
# backward data on fwd_wgmma through filter_kc_swap + the forward (v9) even where fwd_wgmma can read B
# straight from the filter (BKN, v17: no swap, no workspace): a benchmark / test switch, read when a plan
# is made (the swap plan also serves the filters BKN cannot read: _bkn_refusal)
WGM_BWD_SWAP = False


def _exprs(tag):
    """[0..2] implicit_gemm per direction, [3] fold, [4] bias_grad, then for 16-bit types: fwd_tc and
    bwd_data_tc in TC_TILES order, wgrad_tc<BM> in WG_BMS order, then implicit_gemm_pipe_tc forward and
    backward data in TCP_TILES order, then wgrad_pipe_tc in WGP_TILES order (see _tc_expr)."""
    t = CTYPE[tag]
    return tuple([f"pydnn::conv::implicit_gemm<{d}, {t}>" for d in (DIR_FWD, DIR_BWD_DATA, DIR_BWD_FILTER)]
                 + [f"pydnn::conv::fold<{t}>", f"pydnn::conv::bias_grad<{t}>"]
                 + ([f"pydnn::conv::{k}<{t}, {bm}, {bn}>" for k in ("fwd_tc", "bwd_data_tc") for bm, bn in TC_TILES]
                    + [f"pydnn::conv::wgrad_tc<{t}, {bm}>" for bm in WG_BMS]
                    + [f"pydnn::conv::implicit_gemm_pipe_tc<{d}, {t}, {', '.join(map(str, cfg[:5]))}, "
                       f"{'true' if cfg[5] else 'false'}>"
                       for d in (DIR_FWD, DIR_BWD_DATA) for cfg in TCP_TILES]
                    + [f"pydnn::conv::wgrad_pipe_tc<{t}, {', '.join(map(str, cfg))}>" for cfg in WGP_TILES]
                    if tag in TC_TAGS else []))


def _tc_expr(tag, direction, config):
    """The tensor-core kernel of a direction and tiling: (BM, BN), a TCP_TILES entry (the pipelined
    kernel), or for the backward filter (BM,) (wgrad_tc) or a WGP_TILES entry (wgrad_pipe_tc)."""
    if direction == DIR_BWD_FILTER and len(config) == 5:
        first = 5 + 2 * len(TC_TILES) + len(WG_BMS) + 2 * len(TCP_TILES)
        return _exprs(tag)[first + WGP_TILES.index(tuple(config))]
    if len(config) == 6:
        first = 5 + 2 * len(TC_TILES) + len(WG_BMS) + (0 if direction == DIR_FWD else len(TCP_TILES))
        return _exprs(tag)[first + TCP_TILES.index(tuple(config))]
    first = 5 + {DIR_FWD: 0, DIR_BWD_DATA: 1, DIR_BWD_FILTER: 2}[direction] * len(TC_TILES)
    if direction == DIR_BWD_FILTER:
        return _exprs(tag)[first + WG_BMS.index(config[0])]
    return _exprs(tag)[first + TC_TILES.index(tuple(config))]


def _wgm_expr(tag, cfg, bkn=False, fb=False):
    """The fwd_wgmma instantiation of a WGM_TILES / WGM_VARIANTS entry (a fifth entry: LEAN, 1 v12's copies;
    without it, or 0, v8's). bkn: B read as [k][n] (MN-major; backward data straight from the KRSC filter).
    fb: the fused bias loaded into registers before the K walk (FB = 1; the fused forward on WGM_TILES)."""
    lean = cfg[4] if len(cfg) == 5 else 0
    tail = f", {lean}, 0, 1" if fb else f", {lean}, 1" if bkn else (f", {lean}" if lean else "")
    return f"pydnn::conv::fwd_wgmma<{CTYPE[tag]}, {cfg[1]}, {cfg[2]}, {cfg[3]}{tail}>"


def _fused_bias_in_registers(pl):
    """convolution_bias_activation_forward's plan on the 128x64 model fwd_wgmma tile runs its FB = 1
    instantiation (the bias in registers, v16): the plan is the fused call's own (cached under its own
    key; get_plan's adapt, once per plan), so the plain forward keeps FB = 0, whose K loop the registers
    would change (ptx/convolution.cu)."""
    if type(pl) is Plan and pl.direction == DIR_FWD and pl.gemm_expr in _FB_EXPRS:
        pl.gemm_expr, pl.gemm_func = _FB_EXPRS[pl.gemm_expr], None


def _is_wgm(cfg):
    """Whether a tiling names a fwd_wgmma instantiation (a WGM_TILES or WGM_VARIANTS entry)."""
    return cfg is not None and tuple(cfg) in WGM_TILES + WGM_VARIANTS


def _swap_expr(tag):
    """filter_kc_swap: the filter with K and C swapped (backward data on fwd_wgmma), in the wgmma unit."""
    return f"pydnn::conv::filter_kc_swap<{CTYPE[tag]}>"


def wgm_units():
    """fwd_wgmma units (one per 16-bit type: every WGM_TILES and WGM_VARIANTS entry, the same with B read
    as [k][n] (backward data from the filter itself), then filter_kc_swap): built and loadable for sm_90
    only, as sm_90a (wgmma)."""
    return [KernelUnit(f"convolution.wgmma.{t}", "convolution.cu",
                       tuple(_wgm_expr(t, c, bkn) for bkn in (False, True) for c in WGM_TILES + WGM_VARIANTS)
                       + (_swap_expr(t),) + tuple(_wgm_expr(t, c, fb=True) for c in WGM_TILES if c[1] == 64),
                       archs=(WGM_ARCH + "a",))
            for t in TC_TAGS]


# the 128x64 model tile's FB = 1 (the 128x128 tile's code has the bias in registers whatever FB says)
_FB_EXPRS = {_wgm_expr(t, c): _wgm_expr(t, c, fb=True) for t in TC_TAGS for c in WGM_TILES if c[1] == 64}


def kernel_units():
    from . import convolution_fft, convolution_gemm, convolution_winograd  # GEMM / WINOGRAD_NONFUSED / FFT units
    from . import convolution_wgrad_wgmma  # the wgmma backward filter (sm_90a)
    return ([KernelUnit(f"convolution.{t}", "convolution.cu", _exprs(t)) for t in FLOAT_TAGS] + wgm_units()
            + convolution_gemm.kernel_units() + convolution_winograd.kernel_units()
            + convolution_fft.kernel_units() + convolution_wgrad_wgmma.kernel_units())


# ----------------------------------------------------------------------------- the descriptor

MODES = (E.PYDNN_CONVOLUTION, E.PYDNN_CROSS_CORRELATION)
MATH_TYPES = tuple(E.ENUMS["pydnnMathType_t"].values())
MAX_SPATIAL = 3


class ConvolutionDescriptor:
    """cudnnConvolutionDescriptor_t: per spatial dim pad / stride / dilation, mode, compute type, math
    type and group count. `version` changes with every set (launch records are keyed by it)."""

    __slots__ = ("pad", "stride", "dil", "mode", "compute_type", "math_type", "groups", "is_set", "alive",
                 "version", "__weakref__")

    def __init__(self):
        self.pad, self.stride, self.dil = (), (), ()
        self.mode, self.compute_type = E.PYDNN_CONVOLUTION, E.PYDNN_DATA_FLOAT
        self.math_type, self.groups = E.PYDNN_DEFAULT_MATH, 1
        self.is_set, self.alive, self.version = False, True, 0

    def __repr__(self):
        return (f"ConvolutionDescriptor(pad={self.pad}, stride={self.stride}, dilation={self.dil}, "
                f"mode={self.mode}, computeType={self.compute_type}, groups={self.groups})")


def _live(desc, name="convDesc"):
    if type(desc) is not ConvolutionDescriptor or not desc.alive:
        raise PydnnError(BAD, f"{name}: not a live convolution descriptor")
    return desc


def check_conv(desc, name="convDesc"):
    _live(desc, name)
    if not desc.is_set:
        raise PydnnError(BAD, f"{name}: descriptor was never set")
    return desc


def _nonneg(name, v):
    v = _int(name, v)
    if v < 0:
        raise PydnnError(BAD, f"{name}: {v} must not be negative")
    if v > INT_MAX:
        raise PydnnError(BAD, f"{name}: {v} is too large")
    return v


def _positive(name, v):
    v = _int(name, v)
    if v <= 0:
        raise PydnnError(BAD, f"{name}: {v} must be positive")
    if v > INT_MAX:
        raise PydnnError(BAD, f"{name}: {v} is too large")
    return v


def _compute_type(name, v):
    v = _int(name, v)
    if v not in E.ENUMS["pydnnDataType_t"].values():
        raise PydnnError(BAD, f"{name}: {v} is not a pydnnDataType_t value")
    if v not in (E.PYDNN_DATA_FLOAT, E.PYDNN_DATA_DOUBLE, E.PYDNN_DATA_HALF):
        raise PydnnError(NS, f"{name}: compute type {v} is not supported (FLOAT, DOUBLE or HALF)")
    return v


def _array(name, values, n, check):
    try:
        seq = list(values)
    except TypeError:
        raise PydnnError(BAD, f"{name}: expected a sequence of {n} integers") from None
    if len(seq) < n:
        raise PydnnError(BAD, f"{name}: has {len(seq)} entries, arrayLength is {n}")
    return tuple(check(f"{name}[{i}]", seq[i]) for i in range(n))


def _assign(desc, pad, stride, dil, mode, compute_type):
    desc.pad, desc.stride, desc.dil, desc.mode, desc.compute_type = pad, stride, dil, mode, compute_type
    desc.is_set = True
    desc.version += 1


@api
def create_convolution_descriptor():
    """cudnnCreateConvolutionDescriptor."""
    return ConvolutionDescriptor()


@api
def destroy_convolution_descriptor(conv_desc):
    """cudnnDestroyConvolutionDescriptor (None: nothing to do)."""
    if conv_desc is None:
        return
    _live(conv_desc).alive = False
    conv_desc.version += 1


@api
def set_convolution2d_descriptor(conv_desc, pad_h, pad_w, u, v, dilation_h, dilation_w, mode, compute_type):
    """cudnnSetConvolution2dDescriptor: pads >= 0, strides (u, v) and dilations > 0."""
    _live(conv_desc)
    pad = (_nonneg("pad_h", pad_h), _nonneg("pad_w", pad_w))
    stride = (_positive("u", u), _positive("v", v))
    dil = (_positive("dilation_h", dilation_h), _positive("dilation_w", dilation_w))
    mode = enum_arg("mode", mode, MODES, "pydnnConvolutionMode_t")
    _assign(conv_desc, pad, stride, dil, mode, _compute_type("computeType", compute_type))


@api
def get_convolution2d_descriptor(conv_desc):
    """cudnnGetConvolution2dDescriptor -> (pad_h, pad_w, u, v, dilation_h, dilation_w, mode, computeType)."""
    d = check_conv(conv_desc)
    if len(d.pad) != 2:
        raise PydnnError(BAD, f"convDesc: has {len(d.pad)} spatial dims, not 2")
    return (*d.pad, *d.stride, *d.dil, d.mode, d.compute_type)


@api
def set_convolution_nd_descriptor(conv_desc, array_length, pad_a, filter_stride_a, dilation_a, mode, compute_type):
    """cudnnSetConvolutionNdDescriptor: arrayLength = spatial dims, 1 to 3."""
    _live(conv_desc)
    n = _int("arrayLength", array_length)
    if not 1 <= n <= MAX_SPATIAL:
        raise PydnnError(BAD if n <= 0 or n > E.PYDNN_DIM_MAX - 2 else NS,
                         f"arrayLength: {n} is outside [1, {MAX_SPATIAL}] (spatial dims)")
    pad = _array("padA", pad_a, n, _nonneg)
    stride = _array("filterStrideA", filter_stride_a, n, _positive)
    dil = _array("dilationA", dilation_a, n, _positive)
    mode = enum_arg("mode", mode, MODES, "pydnnConvolutionMode_t")
    _assign(conv_desc, pad, stride, dil, mode, _compute_type("computeType", compute_type))


@api
def get_convolution_nd_descriptor(conv_desc, array_length_requested):
    """cudnnGetConvolutionNdDescriptor -> (arrayLength, padA, strideA, dilationA, mode, computeType), the
    arrays cut to arrayLengthRequested entries."""
    d = check_conv(conv_desc)
    req = _int("arrayLengthRequested", array_length_requested)
    if req < 0:
        raise PydnnError(BAD, f"arrayLengthRequested: {req} is negative")
    return len(d.pad), list(d.pad[:req]), list(d.stride[:req]), list(d.dil[:req]), d.mode, d.compute_type


@api
def set_convolution_group_count(conv_desc, group_count):
    """cudnnSetConvolutionGroupCount: groups > 0 (C and K must be multiples of it at the call)."""
    _live(conv_desc).groups = _positive("groupCount", group_count)
    conv_desc.version += 1


@api
def get_convolution_group_count(conv_desc):
    """cudnnGetConvolutionGroupCount."""
    return _live(conv_desc).groups


@api
def set_convolution_math_type(conv_desc, math_type):
    """cudnnSetConvolutionMathType: DEFAULT, TENSOR_OP, TENSOR_OP_ALLOW_CONVERSION or FMA."""
    _live(conv_desc).math_type = enum_arg("mathType", math_type, MATH_TYPES, "pydnnMathType_t")
    conv_desc.version += 1


@api
def get_convolution_math_type(conv_desc):
    """cudnnGetConvolutionMathType."""
    return _live(conv_desc).math_type


# ----------------------------------------------------------------------------- shapes

def _spatial(dims):
    return tuple(dims[2:])


def output_dims(conv, x_desc, w_desc, x_name="inputTensorDesc", w_name="filterDesc"):
    """The output dims (N, K, spatial...) after checking x, w and conv against each other."""
    check_conv(conv)
    check_tensor(x_desc, x_name)
    check_filter(w_desc, w_name)
    ns = len(conv.pad)
    if len(x_desc.dims) != ns + 2:
        raise PydnnError(BAD, f"{x_name}: has {len(x_desc.dims)} dims; convDesc has {ns} spatial dims, so "
                              f"{ns + 2} are needed")
    if len(w_desc.dims) != ns + 2:
        raise PydnnError(BAD, f"{w_name}: has {len(w_desc.dims)} dims; convDesc has {ns} spatial dims, so "
                              f"{ns + 2} are needed")
    n, c = x_desc.dims[:2]
    k, cg = w_desc.dims[:2]
    g = conv.groups
    if c != cg * g:
        raise PydnnError(BAD, f"{w_name}: {cg} input channels per group x groupCount {g} = {cg * g} differs "
                              f"from the {c} channels of {x_name}")
    if k % g:
        raise PydnnError(BAD, f"{w_name}: {k} output channels are not a multiple of groupCount {g}")
    out = []
    for i, (xi, fi, p, s, d) in enumerate(zip(_spatial(x_desc.dims), _spatial(w_desc.dims), conv.pad,
                                              conv.stride, conv.dil)):
        span = (fi - 1) * d + 1
        o = 1 + (xi + 2 * p - span) // s
        if xi + 2 * p < span:
            raise PydnnError(BAD, f"convDesc: spatial dim {i}: input {xi} with padding {p} is smaller than the "
                                  f"dilated filter extent {span} (filter {fi}, dilation {d}): the output is empty")
        out.append(o)
    return (n, k) + tuple(out)


@api
def get_convolution2d_forward_output_dim(conv_desc, input_tensor_desc, filter_desc):
    """cudnnGetConvolution2dForwardOutputDim -> (n, c, h, w)."""
    dims = output_dims(conv_desc, input_tensor_desc, filter_desc)
    if len(dims) != 4:
        raise PydnnError(BAD, f"convDesc: has {len(dims) - 2} spatial dims, not 2")
    return dims


@api
def get_convolution_nd_forward_output_dim(conv_desc, input_tensor_desc, filter_desc, nb_dims):
    """cudnnGetConvolutionNdForwardOutputDim -> the output dims (nbDims must equal the input's dim count)."""
    dims = output_dims(conv_desc, input_tensor_desc, filter_desc)
    nb = _int("nbDims", nb_dims)
    if nb != len(dims):
        raise PydnnError(BAD, f"nbDims: {nb} differs from the input's {len(dims)} dims")
    return list(dims)


# ----------------------------------------------------------------------------- problems

class Problem:
    """A validated convolution problem: every size the kernels need, in 3-d form (D, H, W)."""

    __slots__ = ("dtype", "tag", "n", "c", "k", "groups", "cg", "kg", "in3", "out3", "filt3", "pad3", "stride3",
                 "dil3", "xs", "ys", "ws", "flip", "w_format", "nspatial", "math_type", "x_desc", "y_desc",
                 "w_dims")

    def copy(self):
        """A new Problem with every size this one has (the start of a derived view: the GEMM, Winograd and
        backward-data forms set their own sizes on it)."""
        s = Problem()
        for a in Problem.__slots__:
            if hasattr(self, a):
                setattr(s, a, getattr(self, a))
        return s

    @property
    def flops(self):
        """2 * N * K * P * C/g * taps (the multiply-adds of the forward, backward data or filter)."""
        p = self.out3[0] * self.out3[1] * self.out3[2]
        taps = self.filt3[0] * self.filt3[1] * self.filt3[2]
        return 2 * self.n * self.k * p * self.cg * taps


def _pad3(t, fill):
    return (fill,) * (3 - len(t)) + tuple(t)


def _strides5(strides):
    """(n, c, d, h, w) strides of a 3-to-5-dim tensor (missing spatial dims get stride 0: size 1)."""
    s = tuple(strides)
    return s[:2] + (0,) * (5 - len(s)) + s[2:]


def _types(conv, named):
    """One data type for every tensor; a compute type that goes with it."""
    first, fname = named[0]
    for d, nm in named:
        if d.dtype not in (E.PYDNN_DATA_FLOAT, E.PYDNN_DATA_DOUBLE, E.PYDNN_DATA_HALF, E.PYDNN_DATA_BFLOAT16):
            raise PydnnError(NS, f"{nm}: data type {d.dtype} is not supported (float, double, half, bfloat16)")
        if d.dtype != first.dtype:
            raise PydnnError(NS, f"{nm}: data type {d.dtype} with {fname} data type {first.dtype} is not a "
                                 f"supported combination (every tensor of one type)")
    dt, ct = first.dtype, conv.compute_type
    ok = {E.PYDNN_DATA_DOUBLE: (E.PYDNN_DATA_DOUBLE,), E.PYDNN_DATA_FLOAT: (E.PYDNN_DATA_FLOAT,),
          E.PYDNN_DATA_HALF: (E.PYDNN_DATA_FLOAT, E.PYDNN_DATA_HALF),
          E.PYDNN_DATA_BFLOAT16: (E.PYDNN_DATA_FLOAT,)}[dt]
    if ct not in ok:
        raise PydnnError(NS, f"convDesc: compute type {ct} with data type {dt} is not supported "
                             f"(allowed compute types: {list(ok)})")
    return dt


def problem(conv, x_desc, w_desc, y_desc, names=("xDesc", "wDesc", "yDesc")):
    """Validate x (or dx), w (or dw), y (or dy) against the descriptor -> Problem."""
    xn, wn, yn = names
    dims = output_dims(conv, x_desc, w_desc, xn, wn)
    check_tensor(y_desc, yn)
    dt = _types(conv, [(x_desc, xn), (w_desc, wn), (y_desc, yn)])
    if tuple(y_desc.dims) != dims:
        raise PydnnError(BAD, f"{yn}: dims {tuple(y_desc.dims)} differ from the computed output dims {dims}")
    pb = Problem()
    pb.dtype, pb.tag = dt, TAG[dt]
    pb.n, pb.c = x_desc.dims[:2]
    pb.k, pb.cg = w_desc.dims[:2]
    pb.groups = conv.groups
    pb.kg = pb.k // pb.groups
    pb.nspatial = len(conv.pad)
    pb.in3, pb.out3 = _pad3(_spatial(x_desc.dims), 1), _pad3(dims[2:], 1)
    pb.filt3 = _pad3(_spatial(w_desc.dims), 1)
    pb.pad3, pb.stride3, pb.dil3 = _pad3(conv.pad, 0), _pad3(conv.stride, 1), _pad3(conv.dil, 1)
    pb.xs, pb.ys, pb.ws = _strides5(x_desc.strides), _strides5(y_desc.strides), _strides5(w_desc.strides)
    pb.flip = conv.mode == E.PYDNN_CONVOLUTION
    pb.w_format, pb.math_type = w_desc.format, conv.math_type
    pb.x_desc, pb.y_desc, pb.w_dims = x_desc, y_desc, tuple(w_desc.dims)
    return pb


# ----------------------------------------------------------------------------- planning

def _digit_step(step, sizes):
    out = [0] * 4
    for i in range(3, 0, -1):
        out[i] = step % sizes[i]
        step //= sizes[i]
    out[0] = step
    return out


class Plan:
    """The launches of one (direction, algorithm, problem): `gemm` (ConvParams) and an optional `fold`
    (ConvAuxParams) for split-K, with the workspace bytes they need."""

    __slots__ = ("direction", "algo", "unit", "gemm", "gemm_grid", "gemm_argv", "gemm_expr", "gemm_func", "fold",
                 "fold_grid", "fold_argv", "fold_expr", "fold_func", "workspace", "itemsize", "acc_size",
                 "deterministic", "splits", "problem", "align", "smem", "pair_ok", "threads")


def _base_params(pb, direction):
    p = ConvParams()
    p.batch, p.groups, p.cg, p.kg = pb.n, pb.groups, pb.cg, pb.kg
    for i in range(3):
        p.in_size[i], p.out_size[i], p.filt[i] = pb.in3[i], pb.out3[i], pb.filt3[i]
        p.pad[i], p.stride[i], p.dil[i] = pb.pad3[i], pb.stride3[i], pb.dil3[i]
    for i in range(5):  # backward data: xs are dx's strides, ys dy's
        p.ws[i], p.xs[i], p.ys[i] = pb.ws[i], pb.xs[i], pb.ys[i]
    p.flags = FLAG_FLIP if pb.flip else 0
    return p


def _gemm_shape(pb, direction):
    """(M, N, K, reduction digit sizes, channel-innermost?, A k-fast?, B k-fast?) of a direction."""
    taps3 = pb.filt3
    p_out, p_in = prod(pb.out3), prod(pb.in3)
    if direction == DIR_FWD:
        cin = pb.xs[1] == 1 and pb.c > 1
        red = list(taps3) + [pb.cg] if cin else [pb.cg] + list(taps3)
        # x: NCHW runs along m (output columns), NHWC along k (channels); the filter along k
        return pb.n * p_out, pb.kg, pb.cg * prod(taps3), red, cin, cin, True
    if direction == DIR_BWD_DATA:
        cin = pb.ys[1] == 1 and pb.k > 1
        red = list(taps3) + [pb.kg] if cin else [pb.kg] + list(taps3)
        return pb.n * p_in, pb.cg, pb.kg * prod(taps3), red, cin, cin, pb.w_format == E.PYDNN_TENSOR_NCHW
    nhwc = pb.xs[1] == 1 and pb.c > 1
    return pb.kg, pb.cg * prod(taps3), pb.n * p_out, [pb.n] + list(pb.out3), False, not nhwc, not nhwc


def plan(handle, pb, direction, algo, split=False):
    """-> Plan (no kernel loaded). `split`: backward filter ALGO_1 (split-K into the workspace; on tensor
    cores where they apply, else on CUDA cores)."""
    if split and direction == DIR_BWD_FILTER and _tc_refusal(pb, DIR_BWD_FILTER) is None:
        return plan_wgrad_tc(handle, pb, algo)
    gm, gn, gk, red, cin, akf, bkf = _gemm_shape(pb, direction)
    for name, v in (("M", gm), ("N", gn), ("K", gk)):
        if v > INT_MAX:
            raise PydnnError(NS, f"the implicit GEMM's {name} = {v} exceeds 2^31 - 1 (split the batch)")
    acc = 8 if pb.dtype == E.PYDNN_DATA_DOUBLE else 4
    p = _base_params(pb, direction)
    p.gm, p.gn, p.gk = gm, gn, gk
    p.flags |= (FLAG_CIN if cin else 0) | (FLAG_A_KFAST if akf else 0) | (FLAG_B_KFAST if bkf else 0)
    for i in range(4):
        p.red_size[i] = red[i]
    for i, v in enumerate(_digit_step(BK, red)):
        p.red_step[i] = v
    tiles = cdiv(gm, BM) * cdiv(gn, BN) * pb.groups
    splits = 1
    if split:
        want = cdiv(2 * handle.sm_count, tiles)
        splits = max(1, min(want, MAX_SPLITS, cdiv(gk, 4 * BK)))
    kps = cdiv(cdiv(gk, splits), BK) * BK
    splits = cdiv(gk, kps)
    p.splits, p.k_per_split = splits, kps
    pl = Plan()
    pl.direction, pl.algo, pl.unit = direction, algo, f"convolution.{pb.tag}"
    pl.itemsize, pl.acc_size, pl.deterministic, pl.splits = DTYPES[pb.dtype][0], acc, True, splits
    pl.gemm, pl.gemm_grid = p, (cdiv(gm, BM), cdiv(gn, BN), pb.groups * splits)
    pl.gemm_expr = _exprs(pb.tag)[direction]
    pl.gemm_argv, pl.gemm_func = driver.kernel_args(p), None
    pl.fold = pl.fold_func = pl.fold_argv = None
    pl.workspace, pl.align, pl.smem, pl.pair_ok, pl.threads = 0, 0, 0, False, THREADS
    if pl.gemm_grid[2] > 65535 or pl.gemm_grid[1] > 65535:
        raise PydnnError(NS, f"groups x splits = {pl.gemm_grid[2]} exceeds the grid's 65535 (too many groups)")
    if splits > 1:
        p.flags |= FLAG_PARTIAL
        pl.workspace = splits * pb.groups * gm * gn * acc
        f = ConvAuxParams()
        f.groups, f.kg, f.cg, f.taps, f.splits = pb.groups, pb.kg, pb.cg, prod(pb.filt3), splits
        for i in range(3):
            f.filt[i] = pb.filt3[i]
        for i in range(5):
            f.out_stride[i] = pb.ws[i]
        f.flags = FLAG_FLIP if pb.flip else 0
        pl.fold, pl.fold_expr = f, _exprs(pb.tag)[3]
        pl.fold_grid = (cdiv(pb.groups * gm * gn, 256), 1, 1)
        pl.fold_argv = driver.kernel_args(f)
    return pl


# ----------------------------------------------------------------------------- algorithms

FWD_ALGOS = tuple(v for k, v in E.ENUMS["pydnnConvolutionFwdAlgo_t"].items() if not k.endswith("COUNT"))
BWD_DATA_ALGOS = tuple(v for k, v in E.ENUMS["pydnnConvolutionBwdDataAlgo_t"].items() if not k.endswith("COUNT"))
BWD_FILTER_ALGOS = tuple(v for k, v in E.ENUMS["pydnnConvolutionBwdFilterAlgo_t"].items() if not k.endswith("COUNT"))
ALGO_TYPES = {DIR_FWD: ("pydnnConvolutionFwdAlgo_t", FWD_ALGOS), DIR_BWD_DATA: ("pydnnConvolutionBwdDataAlgo_t",
              BWD_DATA_ALGOS), DIR_BWD_FILTER: ("pydnnConvolutionBwdFilterAlgo_t", BWD_FILTER_ALGOS)}
IMPLEMENTED = {DIR_FWD: (E.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, E.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
                         E.PYDNN_CONVOLUTION_FWD_ALGO_GEMM, E.PYDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED,
                         E.PYDNN_CONVOLUTION_FWD_ALGO_FFT),
               DIR_BWD_DATA: (E.PYDNN_CONVOLUTION_BWD_DATA_ALGO_0, E.PYDNN_CONVOLUTION_BWD_DATA_ALGO_1,
                              E.PYDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED,
                              E.PYDNN_CONVOLUTION_BWD_DATA_ALGO_FFT),
               DIR_BWD_FILTER: (E.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_0, E.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_1,
                                E.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT, E.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_3,
                                E.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED)}


def algo_name(direction, algo):
    t, _ = ALGO_TYPES[direction]
    for k, v in E.ENUMS[t].items():
        if v == algo:
            return k
    return str(algo)


def check_algo(direction, algo):
    """BAD_PARAM for a value outside the enum, NOT_SUPPORTED (with the reason) for one pydnn lacks."""
    t, algos = ALGO_TYPES[direction]
    a = enum_arg("algo", algo, algos, t)
    if a not in IMPLEMENTED[direction]:
        raise PydnnError(NS, f"algo: {algo_name(direction, a)} is not implemented in pydnn yet (available: "
                             f"{', '.join(algo_name(direction, v) for v in IMPLEMENTED[direction])})")
    return a


def _tc_refusal(pb, direction):
    """Why a tensor-core kernel cannot serve a problem (None when it can). Forward reads x (NHWC, C % 8),
    backward data reads dy (NHWC, K % 8) and writes C in chunks of 8 channels; backward filter reads both
    dy and x in chunks of 8 channels (C % 8, K % 8) and writes dw through its strides (any format)."""
    name = {DIR_FWD: "IMPLICIT_PRECOMP_GEMM", DIR_BWD_DATA: "BWD_DATA_ALGO_1",
            DIR_BWD_FILTER: "BWD_FILTER_ALGO_1 on tensor cores"}[direction]
    if pb.tag not in TC_TAGS:
        return f"{name} runs on tensor cores for half and bfloat16 data only (float would need TF32, not implemented)"
    if pb.math_type == E.PYDNN_FMA_MATH:
        return f"{name} uses tensor cores, which the FMA math type forbids"
    if pb.groups != 1:
        return f"{name} needs groupCount 1 (got {pb.groups})"
    if pb.c % 8 or (direction != DIR_FWD and pb.k % 8):
        return f"{name} needs channel counts that are multiples of 8 (C {pb.c}, K {pb.k})"
    sources = {DIR_FWD: ((pb.xs, "xDesc", pb.x_desc),), DIR_BWD_DATA: ((pb.ys, "dyDesc", pb.y_desc),),
               DIR_BWD_FILTER: ((pb.xs, "xDesc", pb.x_desc), (pb.ys, "dyDesc", pb.y_desc))}[direction]
    for src, sname, desc in sources:
        if src[1] != 1 or any(s % 8 for i, s in enumerate(src) if i != 1):
            return (f"{name} needs {sname} with channels innermost (NHWC) and other strides multiples of 8 "
                    f"(strides {tuple(desc.strides)})")
    if direction != DIR_BWD_FILTER and pb.w_format != E.PYDNN_TENSOR_NHWC:
        return f"{name} needs a filter in NHWC format (K, spatial..., C)"
    return None


MAX_WG_SPLITS = 1024
WG_SM_FLOPS = 3.5e12   # the split model's tensor-core rate of one SM in wgrad_tc (a ranking, not a promise)


def _wgrad_tiling(handle, gm, gn, gk):
    """(BM, splits) for wgrad_tc: the least modelled time = rounds of blocks per SM x k tiles per block
    (+3 for the pipeline's fill and the epilogue) x time per tile, plus the fold's traffic (the partials
    written and read back, mostly from L2) when the reduction is split. A round with at most one block
    per SM counts 1.4: 8 warps alone do not keep an SM's tensor cores busy."""
    sms = max(handle.sm_count, 1)
    ksteps = cdiv(gk, TC_BK)
    best = None
    for bm in WG_BMS:
        if bm == 128 and gm <= 64:
            continue  # a half-empty tile
        tiles = cdiv(gm, bm) * cdiv(gn, WG_BN)
        tile_s = 2.0 * bm * WG_BN * TC_BK / WG_SM_FLOPS * (1.0 if bm == 128 else 1.15)
        for splits in range(1, min(MAX_WG_SPLITS, ksteps, 65535) + 1):
            per = cdiv(ksteps, splits)
            if cdiv(ksteps, per) != splits:
                continue  # the same slices as fewer splits
            blocks = tiles * splits
            rounds = cdiv(blocks, sms) if blocks > sms else 1.4
            t = rounds * (per + 3) * tile_s
            if splits > 1:
                t += 2.0 * splits * gm * gn * 4 / 4e12 + gm * gn * 2 / 3e12
            if best is None or t < best[0]:
                best = (t, bm, splits)
    return best[1], best[2]


# wgrad_pipe_tc's split model: an SM's rate at warp speed 1.0 (_warp_speed), and the blocks of each
# tiling an SM holds (3 stages of (BM + BN) x 64 x 2 bytes, the MINB register cap). A ranking model.
WGP_SM_FLOPS = 2.0e12
# a tiling's speed per flop at the same resident warps, fit to the benchmark's forced tilings (v7 in
# tools/bench_convolution.py: 128x64 beats 64x128 by 7-10% at 12 warps, and 128x128 at 16 warps runs
# below both, where the forward's warp-speed curve alone would put it 18% above)
WGP_TILE_SPEED = {(128, 128): 0.8, (64, 128): 1.0, (128, 64): 1.08}
WGP_PER_SM = {cfg: min(cfg[4], (227 * 1024) // (TCP_STAGES * (cfg[0] + cfg[1]) * TCP_BK * 2)) for cfg in WGP_TILES}


def _wgp_refusal(pb):
    """Why wgrad_pipe_tc cannot serve a backward filter that wgrad_tc can (None when it can): dy's output
    positions must be evenly spaced (offset = position * the W stride: packed NHWC), and x and dy must span
    less than 2^31 elements (32-bit offsets)."""
    acc = pb.ys[4]
    for size, stride in ((pb.out3[2], pb.ys[4]), (pb.out3[1], pb.ys[3]), (pb.out3[0], pb.ys[2]), (pb.n, pb.ys[0])):
        if size > 1 and stride != acc:
            return "dy's positions are not evenly spaced (not packed NHWC)"
        acc *= size
    x_span = 1 + sum((d - 1) * abs(st) for d, st in zip(pb.x_desc.dims, pb.x_desc.strides))
    gk = pb.n * prod(pb.out3)
    if x_span > INT_MAX or (gk + TCP_BK) * pb.ys[4] + pb.k > INT_MAX:
        return "a tensor spans 2^31 elements or more (the kernel's offsets are 32-bit)"
    return None


def _wgrad_pipe_tiling(handle, gm, gn, gk):
    """(a WGP_TILES entry, splits) for wgrad_pipe_tc: the least modelled time = the blocks the busiest SM
    runs x (K tiles per block + 2 for the pipeline's fill and the epilogue) x a tile's flops / the SM's
    rate with the warps it holds, plus the fold's traffic when the reduction is split."""
    sms = max(handle.sm_count, 1)
    ktiles = cdiv(gk, TCP_BK)
    best = None
    for cfg in WGP_TILES:
        bm, bn, wm, wn = cfg[:4]
        if bm == 128 and gm <= 64:
            continue  # a half-empty tile
        tiles = cdiv(gm, bm) * cdiv(gn, bn)
        tile_s = 2.0 * bm * bn * TCP_BK / WGP_SM_FLOPS / WGP_TILE_SPEED[(bm, bn)]
        for splits in range(1, min(MAX_WG_SPLITS, ktiles, 65535) + 1):
            per = cdiv(ktiles, splits)
            if cdiv(ktiles, per) != splits:
                continue  # the same slices as fewer splits
            per_sm = cdiv(tiles * splits, sms)
            t = per_sm * (per + 2) * tile_s / _warp_speed(min(per_sm, WGP_PER_SM[cfg]) * wm * wn)
            if splits > 1:
                t += 2.0 * splits * gm * gn * 4 / 4e12 + gm * gn * 2 / 3e12
            if best is None or t < best[0] * 0.999:
                best = (t, cfg, splits)
    return best[1], best[2]


def _wgrad_choice(handle, pb, gm, gn, gk):
    """(config, splits): config (BM,) for wgrad_tc or a WGP_TILES entry for wgrad_pipe_tc. A forced
    tiling (TC_FORCE) is obeyed where its kernel applies."""
    pipe_ok = _wgp_refusal(pb) is None
    forced = TC_FORCE.get(DIR_BWD_FILTER)
    if forced is not None:
        cfg, splits = forced
        if type(cfg) is int:
            return (cfg,), splits
        if pipe_ok:
            return tuple(cfg), splits
    if WG_PIPE and pipe_ok:
        return _wgrad_pipe_tiling(handle, gm, gn, gk)
    bm, splits = _wgrad_tiling(handle, gm, gn, gk)
    return (bm,), splits


def plan_wgrad_tc(handle, pb, algo):
    """Backward filter ALGO_1 on tensor cores (wgrad_pipe_tc or wgrad_tc in ptx/convolution.cu): M = K,
    N = taps * C (c innermost), the reduction over the N * output positions split over grid.z into fp32
    partials that conv::fold adds in split order (deterministic); one split writes dw directly (no
    workspace)."""
    gm, gn, gk = pb.k, pb.c * prod(pb.filt3), pb.n * prod(pb.out3)
    if max(gm, gn, gk) > INT_MAX:
        raise PydnnError(NS, "the implicit GEMM exceeds 2^31 - 1 rows (split the batch)")
    from .convolution_wgrad_wgmma import maybe_plan  # sm_90: the wgmma kernel where it applies (its module)
    wgm = maybe_plan(handle, pb, algo)
    if wgm is not None:
        return wgm
    cfg, splits = _wgrad_choice(handle, pb, gm, gn, gk)
    pipe = len(cfg) == 5
    bk = TCP_BK if pipe else TC_BK
    bm, bn = (cfg[0], cfg[1]) if pipe else (cfg[0], WG_BN)
    kps = cdiv(cdiv(gk, splits), bk) * bk
    splits = cdiv(gk, kps)
    p = _base_params(pb, DIR_BWD_FILTER)
    p.gm, p.gn, p.gk = gm, gn, gk
    red = [pb.n] + list(pb.out3)
    for i in range(4):
        p.red_size[i] = red[i]
    for i, v in enumerate(_digit_step(bk, red)):
        p.red_step[i] = v
    p.splits, p.k_per_split = splits, kps
    pl = Plan()
    pl.direction, pl.algo, pl.unit = DIR_BWD_FILTER, algo, f"convolution.{pb.tag}"
    pl.itemsize, pl.acc_size, pl.deterministic, pl.splits = DTYPES[pb.dtype][0], 4, True, splits
    pl.gemm, pl.gemm_grid = p, (cdiv(gm, bm), cdiv(gn, bn), splits)
    if pl.gemm_grid[1] > 65535:
        raise PydnnError(NS, f"{gn} filter columns (taps x C) exceed the tensor-core kernel's grid")
    pl.gemm_expr = _tc_expr(pb.tag, DIR_BWD_FILTER, cfg)
    pl.fold = pl.fold_func = pl.fold_argv = None
    pl.workspace, pl.align, pl.pair_ok = 0, 16, False
    if pipe:
        pl.threads = cfg[2] * cfg[3] * 32
        pl.smem = TCP_STAGES * (bm + bn) * TCP_BK * 2
    else:
        pl.threads = THREADS
        pl.smem = WG_STAGES * TC_BK * (bm + 8 + WG_BN + 8) * 2
    if splits > 1:
        p.flags |= FLAG_PARTIAL
        pl.workspace = splits * gm * gn * 4
        f = ConvAuxParams()
        f.groups, f.kg, f.cg, f.taps, f.splits = 1, pb.k, pb.c, prod(pb.filt3), splits
        for i in range(3):
            f.filt[i] = pb.filt3[i]
        for i in range(5):
            f.out_stride[i] = pb.ws[i]
        f.flags = FLAG_CIN | (FLAG_FLIP if pb.flip else 0)
        pl.fold, pl.fold_expr = f, _exprs(pb.tag)[3]
        pl.fold_grid = (cdiv(gm * gn, 256), 1, 1)
        pl.fold_argv = driver.kernel_args(f)
    pl.gemm_argv, pl.gemm_func = driver.kernel_args(p), None
    return pl


# relative speed per flop of the forward / backward-data tiles (bigger tiles move fewer bytes and issue
# fewer ldmatrix per MMA): fit to the benchmark's forced tilings (H200, see tools/bench_convolution.py);
# a ranking model, not a promise
TC_TILE_SPEED = {(128, 128): 1.0, (128, 64): 0.8, (64, 128): 0.8, (64, 64): 0.6}


def _tc_tiling(handle, gm, gn):
    """(BM, BN) of fwd_tc / bwd_data_tc: the least modelled time = rounds of blocks per SM x flops per
    tile / the tiling's speed. (Measured: one block per SM runs nearly as fast per SM as two, so a round
    is one block per SM.) Tiles wider than the problem's N count their empty part."""
    sms = max(handle.sm_count, 1)
    best = None
    for cfg in TC_TILES:
        bm, bn = cfg
        blocks = cdiv(gm, bm) * cdiv(gn, bn)
        rounds = cdiv(blocks, sms)
        t = rounds * bm * bn / TC_TILE_SPEED[cfg]
        if best is None or t < best[0] * 0.999:  # ties: the earlier (bigger) tile
            best = (t, cfg)
    return best[1]


# The pipelined tiles' blocks per SM (shared memory: 3 stages of (BM + BN) x 64 x 2 bytes; registers:
# the MINB cap), and an SM's relative speed by the warps resident on it: the pipelined kernel is latency
# bound (v6 in tools/bench_convolution.py: 12 to 16 resident warps beat 4 to 8 by 20-60% whatever the
# warp tile), fit to the H200's ResNet 3x3 layers. A ranking model, not a promise.
TCP_PER_SM = {cfg: min(cfg[4], (227 * 1024) // (TCP_STAGES * (cfg[0] + cfg[1]) * TCP_BK * 2)) for cfg in TCP_TILES}
TCP_WARP_SPEED = ((4, 0.5), (8, 0.8), (12, 1.0), (16, 1.18))   # (resident warps, speed), interpolated


def _warp_speed(warps):
    pts = TCP_WARP_SPEED
    if warps <= pts[0][0]:
        return pts[0][1]
    for (w0, s0), (w1, s1) in zip(pts, pts[1:]):
        if warps <= w1:
            return s0 + (s1 - s0) * (warps - w0) / (w1 - w0)
    return pts[-1][1]


def _tcp_refusal(pb, direction):
    """Why the pipelined kernel (implicit_gemm_pipe_tc) cannot serve a problem that fwd_tc / bwd_data_tc
    can (None when it can): the tap masks hold T * R <= 16 and S <= 16 bits; backward data gathers with
    stride 1 only (a tap's dy offset is then the same for every dx row)."""
    t, r, s = pb.filt3
    if t * r > 16 or s > 16:
        return f"filter taps T * R = {t * r} > 16 or S = {s} > 16"
    if direction == DIR_BWD_DATA and any(st != 1 for st in pb.stride3):
        return f"backward data with stride {tuple(pb.stride3)}"
    a = pb.x_desc if direction == DIR_FWD else pb.y_desc   # the gathered operand
    a_span = 1 + sum((d - 1) * abs(st) for d, st in zip(a.dims, a.strides))
    w_span = 1 + sum((d - 1) * abs(st) for d, st in zip((pb.k, pb.cg) + tuple(pb.filt3), pb.ws))
    if max(a_span, w_span) > INT_MAX:
        return "a tensor spans 2^31 elements or more (the kernel's offsets are 32-bit)"
    return None


def _tcp_tiling(handle, gm, gn):
    """A TCP_TILES entry: the least modelled time = the blocks the busiest SM runs x a block's flops / the
    SM's speed with the warps it holds (its blocks, up to TCP_PER_SM, x the tile's warps). Tiles wider than
    the problem's N count their empty part; ties go to the earlier entry."""
    sms = max(handle.sm_count, 1)
    best = None
    for cfg in TCP_TILES:
        bm, bn, wm, wn = cfg[:4]
        blocks = cdiv(gm, bm) * cdiv(gn, bn)
        per_sm = cdiv(blocks, sms)
        t = per_sm * bm * bn / _warp_speed(min(per_sm, TCP_PER_SM[cfg]) * wm * wn)
        if best is None or t < best[0] * 0.999:
            best = (t, cfg)
    return best[1]


def _tc_choice(handle, pb, direction, gm, gn, rc):
    """The tiling of a tensor-core plan: a WGM_TILES entry (fwd_wgmma, forward and stride-1 backward data
    on sm_90, by _wgm_tiling) or a TCP_TILES entry (the pipelined kernel) where they apply and the
    reduction's channels fill their 64-deep K tiles (rc % 64 == 0), else fwd_tc / bwd_data_tc's (BM, BN).
    A forced tiling (TC_FORCE) is obeyed where its kernel applies."""
    pipe_ok = _tcp_refusal(pb, direction) is None
    forced = TC_FORCE.get(direction)
    # fwd_wgmma serves the forward and (stride 1, which pipe_ok implies there) backward data as the forward
    # of dy with the filter's K and C roles swapped (_plan_bwd_wgmma)
    wgm_ok = direction in (DIR_FWD, DIR_BWD_DATA) and pipe_ok and getattr(handle, "arch", None) == WGM_ARCH
    if _is_wgm(forced):  # a fwd_wgmma tile: where it exists, else the model's choice
        if wgm_ok:
            return tuple(forced)
        forced = None
    if forced is not None and (len(forced) == 2 or pipe_ok):
        return tuple(forced)
    if forced is None and pipe_ok and rc % TCP_BK == 0:
        if USE_WGM and wgm_ok and prod(pb.filt3) * (rc // TCP_BK) >= WGM_MIN_KTILES:
            return _wgm_tiling(handle, gm, gn)
        return _tcp_tiling(handle, gm, gn)
    return _tc_tiling(handle, gm, gn)


def _wgm_tiling(handle, gm, gn):
    """The fwd_wgmma tile for the model (USE_WGM): the least blocks on the busiest SM x a block's flops /
    WGM_TILE_SPEED (tiles wider than N count their empty part). Against the v8 measurements (N = 64 ResNet
    3x3 layers) it picks the faster tile on each: 128x64 at 56² and 14², 128x128 at 28² (a tie) and 7²."""
    sms = max(handle.sm_count, 1)
    best = None
    for cfg in WGM_TILES:
        bm, bn = cfg[:2]
        t = cdiv(cdiv(gm, bm) * cdiv(gn, bn), sms) * bm * bn / WGM_TILE_SPEED[cfg]
        if best is None or t < best[0] * 0.999:
            best = (t, cfg)
    return best[1]


def plan_tc(handle, pb, algo, direction=DIR_FWD, cfg=None, bkn=False):
    """A tensor-core plan (fwd_wgmma, implicit_gemm_pipe_tc, or fwd_tc / bwd_data_tc, in
    ptx/convolution.cu) or NOT_SUPPORTED with the reason. cfg: the tiling (else the model's or a forced
    one); bkn: a fwd_wgmma forward whose filter is read as [k][n] (backward data's view, _plan_bwd_wgmma)."""
    why = _tc_refusal(pb, direction)
    if why:
        raise PydnnError(NS, f"algo: {why}")
    if direction == DIR_FWD:
        gm, gn, gk, rc, out_strides = pb.n * prod(pb.out3), pb.k, pb.c * prod(pb.filt3), pb.c, pb.ys
    else:
        gm, gn, gk, rc, out_strides = pb.n * prod(pb.in3), pb.c, pb.k * prod(pb.filt3), pb.k, pb.xs
    if max(gm, gn, gk) > INT_MAX:
        raise PydnnError(NS, "the implicit GEMM exceeds 2^31 - 1 rows (split the batch)")
    if cfg is None:
        cfg = _tc_choice(handle, pb, direction, gm, gn, rc)
    if direction == DIR_BWD_DATA and _is_wgm(cfg):
        return _plan_bwd_wgmma(handle, pb, algo, cfg)
    p = _base_params(pb, direction)
    p.gm, p.gn, p.gk = gm, gn, gk
    p.flags |= FLAG_CIN | (FLAG_STAGED if direction == DIR_FWD and TC_STAGED_PLAIN else 0)
    bm, bn = cfg[:2]
    red = list(pb.filt3) + [rc]
    for i in range(4):
        p.red_size[i] = red[i]
    for i, v in enumerate(_digit_step(TC_BK, red)):
        p.red_step[i] = v
    p.splits, p.k_per_split = 1, gk
    pl = Plan()
    pl.direction, pl.algo, pl.unit = direction, algo, f"convolution.{pb.tag}"
    pl.itemsize, pl.acc_size, pl.deterministic, pl.splits = DTYPES[pb.dtype][0], 4, True, 1
    pl.gemm, pl.gemm_grid = p, (cdiv(gm, bm), cdiv(gn, bn), 1)
    if pl.gemm_grid[1] > 65535:
        raise PydnnError(NS, f"{gn} output channels exceed the tensor-core kernel's grid")
    wgm = _is_wgm(cfg)
    pl.gemm_expr = _wgm_expr(pb.tag, cfg, bkn) if wgm else _tc_expr(pb.tag, direction, cfg)
    if wgm:
        pl.unit = f"convolution.wgmma.{pb.tag}"
    pl.gemm_argv, pl.gemm_func = driver.kernel_args(p), None
    pl.fold = pl.fold_func = pl.fold_argv = None
    pl.workspace, pl.align = 0, 16
    if wgm:  # two warpgroups; STAGES x (BM + BN) x 64 swizzled stages + 1 KiB to align them to 1024 bytes
        pl.threads = 256  # + BN floats: FB = 0's fused bias parked for the epilogue
        pl.smem = cfg[2] * (bm + bn) * TCP_BK * 2 + 1024 + bn * 4
    elif len(cfg) == 6:  # the pipelined kernel: WARPS_M x WARPS_N warps, swizzled [rows][64] (or [64][BN]) tiles
        pl.threads = cfg[2] * cfg[3] * 32
        pl.smem = TCP_STAGES * (bm + bn) * TCP_BK * 2
    else:
        pl.threads = THREADS
        b_stage = bn * TC_LD if direction == DIR_FWD else TC_BK * (bn + 8)  # B as [n][k] or [k][n]
        pl.smem = TC_STAGES * (bm * TC_LD + b_stage) * 2
    # channel pairs as 32-bit stores: the output's channels contiguous, every other stride even (and the
    # output 4-byte aligned, checked per call)
    pl.pair_ok = out_strides[1] == 1 and all(st % 2 == 0 for i, st in enumerate(out_strides) if i != 1)
    return pl


# ----------------------------------------------------------------------------- backward data on fwd_wgmma
#
# With stride 1, dx[i] = sum over taps r of dy[i + pad - r * dil] w[r] (cross-correlation; per spatial
# dim, channels contracted over K). That is a forward convolution of dy (K channels) producing dx (C
# channels) with padding (R - 1) * dil - pad and the filter w'[c][r][k] = w[k][r][c] taken flipped
# (tap R - 1 - r): so the forward of the opposite mode. Two plans:
#   direct (v17, where _bkn_refusal allows: the filter's C contiguous, its other strides multiples of 8):
#     fwd_wgmma<..., BKN = 1> reads B = w'[c][tap][k] from w itself as [k][c] tiles (MN-major; its
#     filter strides ws = (1, w's k stride, w's tap strides)). One launch, no workspace.
#   swap (v9; the filters BKN cannot read, or WGM_BWD_SWAP): filter_kc_swap writes w' (packed, K
#     innermost) into the workspace, then fwd_wgmma runs that forward with B K-major.
# Either way fwd_wgmma's epilogue writes dx through dx's strides with alpha / beta. Deterministic
# (every dx element written once, no atomics).

def _bkn_refusal(pb):
    """Why fwd_wgmma cannot read backward data's B straight from the filter (None when it can): it copies
    16 bytes = 8 consecutive c of one (k, tap), so c's stride must be 1 and the others multiples of 8."""
    if pb.ws[1] != 1 or any(pb.ws[i] % 8 for i in (0, 2, 3, 4)):
        return f"filter strides {tuple(pb.ws)}"
    return None


def _bwd_wgm_problem(pb, direct=False):
    """The forward Problem whose output is pb's dx (stride 1): x = dy, y = dx, padding (R - 1) * dil - pad,
    the opposite mode; its filter (C, K, taps) is w itself through its strides (direct) or the packed
    (C, taps, K) copy in the workspace (the swap)."""
    s = pb.copy()
    t, r, q = pb.filt3
    s.n, s.c, s.k, s.groups, s.cg, s.kg = pb.n, pb.k, pb.c, 1, pb.k, pb.c
    s.in3, s.out3 = tuple(pb.out3), tuple(pb.in3)
    s.pad3 = tuple((f - 1) * d - p for f, d, p in zip(pb.filt3, pb.dil3, pb.pad3))
    s.stride3, s.dil3 = (1, 1, 1), tuple(pb.dil3)
    s.xs, s.ys = pb.ys, pb.xs
    s.ws = ((pb.ws[1], pb.ws[0]) + tuple(pb.ws[2:]) if direct
            else (t * r * q * pb.k, 1, r * q * pb.k, q * pb.k, pb.k))
    s.flip = not pb.flip
    s.w_format = E.PYDNN_TENSOR_NHWC
    s.x_desc, s.y_desc, s.w_dims = pb.y_desc, pb.x_desc, (pb.c, pb.k) + tuple(pb.filt3)
    return s


SWAP_GBPS = 2000.0   # the v7 model's rate for filter_kc_swap (bytes read + written / time; a ranking)
SWAP_LAUNCH_MS = 0.004


class BwdWgmmaPlan(StepPlan):
    """Backward data as filter_kc_swap + fwd_wgmma (see above): a multi-launch plan (run_plan's `launch`,
    the v7 model's `estimate_ms`), with the Plan attributes the family reads (StepPlan's)."""

    def __init__(self, pb, algo, sub, spb):
        super().__init__(DIR_BWD_DATA, algo, pb)
        self.sub, self.sub_problem = sub, spb
        sub.problem = spb
        self.align = sub.align            # dy is read in 16-byte vectors
        self.gemm, self.gemm_expr, self.unit = sub.gemm, sub.gemm_expr, sub.unit
        self.filter_bytes = prod(pb.filt3) * pb.c * pb.k * self.itemsize
        self.workspace = -(-self.filter_bytes // 256) * 256
        f = ConvAuxParams()
        f.kg, f.cg, f.taps = pb.k, pb.c, prod(pb.filt3)
        for i in range(3):
            f.filt[i] = pb.filt3[i]
        for i in range(5):
            f.in_stride[i] = pb.ws[i]
        self.swap, self.swap_argv, self.swap_func = f, driver.kernel_args(f), None
        self.swap_grid = (cdiv(pb.k, 64), cdiv(pb.c, 64), f.taps)
        self.swap_expr = _swap_expr(pb.tag)
        if max(self.swap_grid[1:]) > 65535:
            raise PydnnError(NS, f"algo: {self.swap_grid} blocks exceed the launch grid (too many channels)")

    def launch(self, handle, a_ptr, b_ptr, out_ptr, ws_ptr, alpha, beta, z_ptr=0, bias_ptr=0):
        """a = dy, b = w, out = dx; w' goes to the workspace, which fwd_wgmma then reads as its filter."""
        if self.swap_func is None:
            self.swap_func = handle.function(self.unit, self.swap_expr)
        self.swap.in_, self.swap.out = b_ptr, ws_ptr
        driver.launch_args(self.swap_func, self.swap_grid, (256, 1, 1), 0, handle.cu_stream, self.swap_argv)
        run_plan(handle, self.sub, a_ptr, ws_ptr, out_ptr, 0, alpha, beta)

    def estimate_ms(self, handle, base_estimate):
        return base_estimate(handle, self.sub) + 2 * self.filter_bytes / (SWAP_GBPS * 1e6) + SWAP_LAUNCH_MS


def _plan_bwd_wgmma(handle, pb, algo, cfg):
    if not WGM_BWD_SWAP and _bkn_refusal(pb) is None:  # one launch: fwd_wgmma reading w as [k][c] tiles
        pl = plan_tc(handle, _bwd_wgm_problem(pb, direct=True), algo, DIR_FWD, cfg, bkn=True)
        pl.direction = DIR_BWD_DATA
        return pl
    spb = _bwd_wgm_problem(pb)
    sub = plan_tc(handle, spb, algo, DIR_FWD, cfg)
    sub.direction = DIR_FWD
    return BwdWgmmaPlan(pb, algo, sub, spb)


def plan_for(handle, pb, direction, algo):
    if direction == DIR_FWD and algo == E.PYDNN_CONVOLUTION_FWD_ALGO_GEMM:  # im2col + GEMM (convolution_gemm.py)
        from .convolution_gemm import plan_gemm
        return plan_gemm(handle, pb, algo)
    if (direction, algo) in ((DIR_FWD, E.PYDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED),
                             (DIR_BWD_DATA, E.PYDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED)):
        from .convolution_winograd import plan_winograd
        return plan_winograd(handle, pb, direction, algo)
    if direction == DIR_BWD_FILTER and algo == E.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED:
        from .convolution_winograd import plan_winograd_wgrad
        return plan_winograd_wgrad(handle, pb, algo)
    if (direction, algo) in ((DIR_FWD, E.PYDNN_CONVOLUTION_FWD_ALGO_FFT),
                             (DIR_BWD_DATA, E.PYDNN_CONVOLUTION_BWD_DATA_ALGO_FFT),
                             (DIR_BWD_FILTER, E.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT)):
        from .convolution_fft import plan_fft  # FFT (convolution_fft.py)
        return plan_fft(handle, pb, direction, algo)
    if direction == DIR_BWD_FILTER and algo == E.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_3:
        from .convolution_gemm import plan_wgrad_gemm  # explicit GEMMs + a fixed-order fold
        return plan_wgrad_gemm(handle, pb, algo)
    if direction == DIR_FWD and algo == E.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM:
        return plan_tc(handle, pb, algo)
    if direction == DIR_BWD_DATA and algo == E.PYDNN_CONVOLUTION_BWD_DATA_ALGO_1:
        why = _tc_refusal(pb, DIR_BWD_DATA)
        if why is None:
            return plan_tc(handle, pb, algo, DIR_BWD_DATA)
        from .convolution_gemm import bwd_data_gemm_refusal, plan_bwd_data_gemm  # explicit GEMM + col2im
        why_gemm = bwd_data_gemm_refusal(pb)
        if why_gemm is None:
            return plan_bwd_data_gemm(handle, pb, algo)
        raise PydnnError(NS, f"algo: {why}; {why_gemm}")
    return plan(handle, pb, direction, algo,
                split=direction == DIR_BWD_FILTER and algo == E.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_1)


# ----------------------------------------------------------------------------- calls


def _w_key(w):
    try:
        return (w, w.dtype, w.format, tuple(w.dims), w.alive)
    except AttributeError:
        return None


def _key(direction, algo, conv, descs, w):
    if type(algo) is not int:
        return None
    try:
        return (("convolution", direction, algo, conv, conv.version, _w_key(w))
                + tuple((d, d.version) for d in descs))
    except (AttributeError, TypeError):
        return None


def _names(direction):
    return {DIR_FWD: ("xDesc", "wDesc", "yDesc"), DIR_BWD_DATA: ("dxDesc", "wDesc", "dyDesc"),
            DIR_BWD_FILTER: ("xDesc", "dwDesc", "dyDesc")}[direction]


def get_plan(handle, direction, algo, conv, x_desc, w_desc, y_desc, extra=(), extra_key=(), adapt=None):
    """The cached plan of a call, or a new one (validation, kernel lookup). x / w / y in forward terms
    (backward data: dx, w, dy; backward filter: x, dw, dy). `extra`: more descriptors the call depends on
    (keyed with their versions); `extra_key`: plain hashable values it depends on; adapt(plan): applied
    once to a new plan (the call's own variant of it) before it is cached."""
    key = _key(direction, algo, conv, (x_desc, y_desc) + tuple(extra), w_desc)
    if key is not None:
        key += tuple(extra_key)
    pl = handle.prepared.get(key) if key is not None else None
    if pl is None:
        pl = _new_plan(handle, direction, algo, conv, x_desc, w_desc, y_desc)
        if adapt is not None:
            adapt(pl)
        if key is not None:
            handle.remember(key, pl)
    return pl


def _new_plan(handle, direction, algo, conv, x_desc, w_desc, y_desc):
    check_conv(conv)
    pb = problem(conv, x_desc, w_desc, y_desc, _names(direction))
    algo = check_algo(direction, algo)
    out = {DIR_FWD: (y_desc, "yDesc"), DIR_BWD_DATA: (x_desc, "dxDesc"), DIR_BWD_FILTER: None}[direction]
    if out is not None:
        output_tensor(*out)
    pl = plan_for(handle, pb, direction, algo)
    pl.problem = pb
    return pl


def load_kernels(handle, pl):
    if pl.gemm_func is None:
        pl.gemm_func = handle.function(pl.unit, pl.gemm_expr)
        if pl.smem > 48 * 1024:  # dynamic shared memory past 48 KiB must be asked for
            driver.function_set_max_dynamic_smem(pl.gemm_func, pl.smem)
    if pl.fold is not None and pl.fold_func is None:
        pl.fold_func = handle.function(pl.unit, pl.fold_expr)


def check_workspace(pl, work_space, size):
    n = _int("workSpaceSizeInBytes", size)
    if n < 0:
        raise PydnnError(BAD, f"workSpaceSizeInBytes: {n} is negative")
    if n < pl.workspace:
        raise PydnnError(BAD, f"workSpaceSizeInBytes: {n} bytes is less than the {pl.workspace} bytes "
                              f"{algo_name(pl.direction, pl.algo)} needs for this problem")
    if pl.workspace == 0:
        return 0
    ptr = device_ptr(work_space, "workSpace", pl.workspace)
    if ptr == 0:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM_NULL_POINTER, "workSpace: NULL with a workspace needed")
    return element_aligned(ptr, "workSpace", pl.acc_size)


def run_plan(handle, pl, a_ptr, b_ptr, out_ptr, ws_ptr, alpha, beta, z_ptr=0, bias_ptr=0):
    """Enqueue a plan's launches with the call's pointers and scalars."""
    if type(pl) is not Plan:  # a multi-launch plan (GEMM, WINOGRAD_NONFUSED: convolution_gemm.StepPlan)
        return pl.launch(handle, a_ptr, b_ptr, out_ptr, ws_ptr, alpha, beta, z_ptr, bias_ptr)
    if pl.align and (a_ptr % pl.align or b_ptr % pl.align):
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER,
                         f"{algo_name(pl.direction, pl.algo)} reads its input and w in {pl.align}-byte vectors: both "
                         f"must be {pl.align}-byte aligned (input {a_ptr:#x}, w {b_ptr:#x})")
    load_kernels(handle, pl)
    p = pl.gemm
    p.x, p.w, p.z, p.bias = a_ptr, b_ptr, z_ptr or None, bias_ptr or None
    p.alpha, p.beta = alpha, beta
    p.flags = (p.flags & ~(FLAG_BETA | FLAG_PAIR)) | (FLAG_BETA if beta != 0 else 0)
    if pl.pair_ok and out_ptr % 4 == 0:
        p.flags |= FLAG_PAIR
    if pl.fold is None:
        p.out = out_ptr
        driver.launch_args(pl.gemm_func, pl.gemm_grid, (pl.threads, 1, 1), pl.smem, handle.cu_stream, pl.gemm_argv)
        return
    p.out = ws_ptr
    driver.launch_args(pl.gemm_func, pl.gemm_grid, (pl.threads, 1, 1), pl.smem, handle.cu_stream, pl.gemm_argv)
    f = pl.fold
    f.out, f.in_, f.alpha, f.beta = out_ptr, ws_ptr, alpha, beta
    f.flags = (f.flags & ~FLAG_BETA) | (FLAG_BETA if beta != 0 else 0)
    driver.launch_args(pl.fold_func, pl.fold_grid, (256, 1, 1), 0, handle.cu_stream, pl.fold_argv)


def _filter_bytes(w_desc):
    return prod(w_desc.dims) * DTYPES[w_desc.dtype][0]


@api
def convolution_forward(handle, alpha, x_desc, x, w_desc, w, conv_desc, algo, work_space, work_space_size_in_bytes,
                        beta, y_desc, y):
    """cudnnConvolutionForward: y = alpha * conv(x, w) + beta * y. Statuses: BAD_PARAM (descriptors that
    do not fit together: dims, channels vs groups, y not the computed output dims, an empty output,
    overlapping y, a workspace smaller than Get...WorkspaceSize), NOT_SUPPORTED (data / compute types,
    an algorithm pydnn lacks), BAD_PARAM_NULL_POINTER, BAD_PARAM_MISALIGNED_POINTER."""
    check_handle(handle)
    pl = get_plan(handle, DIR_FWD, algo, conv_desc, x_desc, w_desc, y_desc)
    ws = check_workspace(pl, work_space, work_space_size_in_bytes)
    al, be = scalar("alpha", alpha), scalar("beta", beta)
    it = pl.itemsize
    xp = element_aligned(device_ptr(x, "x", x_desc.span_bytes()), "x", it)
    wp = element_aligned(device_ptr(w, "w", _filter_bytes(w_desc)), "w", it)
    yp = element_aligned(device_ptr(y, "y", y_desc.span_bytes()), "y", it)
    run_plan(handle, pl, xp, wp, yp, ws, al, be)


@api
def convolution_backward_data(handle, alpha, w_desc, w, dy_desc, dy, conv_desc, algo, work_space,
                              work_space_size_in_bytes, beta, dx_desc, dx):
    """cudnnConvolutionBackwardData: dx = alpha * (gradient of conv with respect to x)(dy, w) + beta * dx.
    Statuses as convolution_forward (dxDesc must be the input whose output dims are dyDesc's)."""
    check_handle(handle)
    pl = get_plan(handle, DIR_BWD_DATA, algo, conv_desc, dx_desc, w_desc, dy_desc)
    ws = check_workspace(pl, work_space, work_space_size_in_bytes)
    al, be = scalar("alpha", alpha), scalar("beta", beta)
    it = pl.itemsize
    wp = element_aligned(device_ptr(w, "w", _filter_bytes(w_desc)), "w", it)
    dyp = element_aligned(device_ptr(dy, "dy", dy_desc.span_bytes()), "dy", it)
    dxp = element_aligned(device_ptr(dx, "dx", dx_desc.span_bytes()), "dx", it)
    run_plan(handle, pl, dyp, wp, dxp, ws, al, be)


@api
def convolution_backward_filter(handle, alpha, x_desc, x, dy_desc, dy, conv_desc, algo, work_space,
                                work_space_size_in_bytes, beta, dw_desc, dw):
    """cudnnConvolutionBackwardFilter: dw = alpha * (gradient of conv with respect to w)(x, dy) + beta * dw.
    Statuses as convolution_forward."""
    check_handle(handle)
    pl = get_plan(handle, DIR_BWD_FILTER, algo, conv_desc, x_desc, dw_desc, dy_desc)
    ws = check_workspace(pl, work_space, work_space_size_in_bytes)
    al, be = scalar("alpha", alpha), scalar("beta", beta)
    it = pl.itemsize
    xp = element_aligned(device_ptr(x, "x", x_desc.span_bytes()), "x", it)
    dyp = element_aligned(device_ptr(dy, "dy", dy_desc.span_bytes()), "dy", it)
    dwp = element_aligned(device_ptr(dw, "dw", _filter_bytes(dw_desc)), "dw", it)
    run_plan(handle, pl, dyp, xp, dwp, ws, al, be)


def _bias_desc(bias_desc, k, name):
    check_tensor(bias_desc, name)
    dims = tuple(bias_desc.dims)
    want = (1, k) + (1,) * (len(dims) - 2)
    if len(dims) < 2 or dims != want:
        raise PydnnError(BAD, f"{name}: dims {dims} are not (1, {k}, 1, ...) for {k} channels")
    return bias_desc


@api
def convolution_bias_activation_forward(handle, alpha1, x_desc, x, w_desc, w, conv_desc, algo, work_space,
                                        work_space_size_in_bytes, alpha2, z_desc, z, bias_desc, bias,
                                        activation_desc, y_desc, y):
    """cudnnConvolutionBiasActivationForward: y = act(alpha1 * conv(x, w) + alpha2 * z + bias), all in the
    convolution kernel's epilogue. z has y's dims (it may be y itself); bias is (1, K, 1, ...). Activations:
    IDENTITY, RELU, CLIPPED_RELU, SIGMOID, TANH, ELU (others NOT_SUPPORTED). Statuses as
    convolution_forward."""
    from .activation import ActivationDescriptor
    check_handle(handle)
    if type(activation_desc) is not ActivationDescriptor or not activation_desc.alive:
        raise PydnnError(BAD, "activationDesc: not a live activation descriptor")
    if not activation_desc.is_set:
        raise PydnnError(BAD, "activationDesc: descriptor was never set")
    if activation_desc.mode not in ACT:
        raise PydnnError(NS, f"activationDesc: mode {activation_desc.mode} is not supported in the convolution "
                             f"epilogue (IDENTITY, RELU, CLIPPED_RELU, SIGMOID, TANH, ELU)")
    act_key = ("act", activation_desc, activation_desc.mode, activation_desc.coef, activation_desc.relu_nan_opt)
    pl = get_plan(handle, DIR_FWD, algo, conv_desc, x_desc, w_desc, y_desc, extra=(z_desc, bias_desc),
                  extra_key=act_key, adapt=_fused_bias_in_registers)
    check_tensor(z_desc, "zDesc")
    if tuple(z_desc.dims) != tuple(y_desc.dims):
        raise PydnnError(BAD, f"zDesc: dims {tuple(z_desc.dims)} differ from yDesc dims {tuple(y_desc.dims)}")
    if z_desc.dtype != y_desc.dtype:
        raise PydnnError(NS, f"zDesc: data type {z_desc.dtype} differs from yDesc data type {y_desc.dtype}")
    _bias_desc(bias_desc, y_desc.dims[1], "biasDesc")
    if bias_desc.dtype != y_desc.dtype:
        raise PydnnError(NS, f"biasDesc: data type {bias_desc.dtype} differs from yDesc data type {y_desc.dtype}")
    ws = check_workspace(pl, work_space, work_space_size_in_bytes)
    a1, a2 = scalar("alpha1", alpha1), scalar("alpha2", alpha2)
    it = pl.itemsize
    xp = element_aligned(device_ptr(x, "x", x_desc.span_bytes()), "x", it)
    wp = element_aligned(device_ptr(w, "w", _filter_bytes(w_desc)), "w", it)
    yp = element_aligned(device_ptr(y, "y", y_desc.span_bytes()), "y", it)
    zp = element_aligned(device_ptr(z, "z", z_desc.span_bytes()), "z", it) if a2 != 0 else 0
    bp = element_aligned(device_ptr(bias, "bias", bias_desc.span_bytes()), "bias", it)
    p = pl.gemm
    saved = p.flags, p.act, p.coef
    p.act, p.coef = ACT[activation_desc.mode], activation_desc.coef
    p.flags |= FLAG_BIAS | (FLAG_Z if a2 != 0 else 0)
    if activation_desc.relu_nan_opt == E.PYDNN_PROPAGATE_NAN:
        p.flags |= FLAG_NAN_PROP
    for i, s in enumerate(_strides5(z_desc.strides)):
        p.zs[i] = s
    p.bias_stride = bias_desc.strides[1]
    p.alpha2 = a2
    try:
        run_plan(handle, pl, xp, wp, yp, ws, a1, 0.0, zp, bp)
    finally:  # the plan is shared with convolution_forward's cache only through this call's key
        p.flags, p.act, p.coef = saved


@api
def convolution_backward_bias(handle, alpha, dy_desc, dy, beta, db_desc, db):
    """cudnnConvolutionBackwardBias: db = alpha * sum of dy over every dim but C + beta * db; db is
    (1, C, 1, ...). Deterministic (a fixed-order tree sum per channel)."""
    check_handle(handle)
    float_tensor(dy_desc, "dyDesc")
    nd = len(dy_desc.dims)
    if not 3 <= nd <= 5:
        raise PydnnError(BAD, f"dyDesc: has {nd} dims (3 to 5 expected: N, C, spatial...)")
    _bias_desc(db_desc, dy_desc.dims[1], "dbDesc")
    float_tensor(db_desc, "dbDesc")
    if db_desc.dtype != dy_desc.dtype:
        raise PydnnError(NS, f"dbDesc: data type {db_desc.dtype} differs from dyDesc data type {dy_desc.dtype}")
    al, be = scalar("alpha", alpha), scalar("beta", beta)
    it = DTYPES[dy_desc.dtype][0]
    dyp = element_aligned(device_ptr(dy, "dy", dy_desc.span_bytes()), "dy", it)
    dbp = element_aligned(device_ptr(db, "db", db_desc.span_bytes()), "db", it)
    tag = TAG[dy_desc.dtype]
    func = handle.function(f"convolution.{tag}", _exprs(tag)[4])
    dims5 = (dy_desc.dims[0], dy_desc.dims[1]) + (1,) * (5 - nd) + tuple(dy_desc.dims[2:])
    p = ConvAuxParams()
    p.out, p.in_, p.alpha, p.beta = dbp, dyp, al, be
    p.flags = FLAG_BETA if be != 0 else 0
    p.channels = dims5[1]
    p.count = dims5[0] * dims5[2] * dims5[3] * dims5[4]
    for i, v in enumerate((dims5[0], dims5[2], dims5[3], dims5[4])):
        p.inner[i] = v
    for i, s in enumerate(_strides5(dy_desc.strides)):
        p.in_stride[i] = s
    p.out_stride[1] = db_desc.strides[1]
    grid = (min(dims5[1], 65535 * 4), 1, 1)
    driver.launch(func, grid, (256, 1, 1), 0, handle.cu_stream, p)


# ----------------------------------------------------------------------------- workspace sizes

def _workspace(handle, direction, algo, conv, x_desc, w_desc, y_desc):
    check_handle(handle)
    return _new_plan(handle, direction, algo, conv, x_desc, w_desc, y_desc).workspace


@api
def get_convolution_forward_workspace_size(handle, x_desc, w_desc, conv_desc, y_desc, algo):
    """cudnnGetConvolutionForwardWorkspaceSize (NOT_SUPPORTED for an algorithm pydnn lacks)."""
    return _workspace(handle, DIR_FWD, algo, conv_desc, x_desc, w_desc, y_desc)


@api
def get_convolution_backward_data_workspace_size(handle, w_desc, dy_desc, conv_desc, dx_desc, algo):
    """cudnnGetConvolutionBackwardDataWorkspaceSize."""
    return _workspace(handle, DIR_BWD_DATA, algo, conv_desc, dx_desc, w_desc, dy_desc)


@api
def get_convolution_backward_filter_workspace_size(handle, x_desc, dy_desc, conv_desc, grad_desc, algo):
    """cudnnGetConvolutionBackwardFilterWorkspaceSize."""
    return _workspace(handle, DIR_BWD_FILTER, algo, conv_desc, x_desc, grad_desc, dy_desc)


from .convolution_algos import *  # noqa: E402,F401,F403 - algorithm queries and Find
from . import convolution_algos as _algos  # noqa: E402
from .convolution_find import *  # noqa: E402,F401,F403 - Find without Ex (buffers of its own)
from . import convolution_find as _find  # noqa: E402

__all__ = [
    "create_convolution_descriptor", "destroy_convolution_descriptor", "set_convolution2d_descriptor",
    "get_convolution2d_descriptor", "set_convolution_nd_descriptor", "get_convolution_nd_descriptor",
    "set_convolution_group_count", "get_convolution_group_count", "set_convolution_math_type",
    "get_convolution_math_type", "get_convolution2d_forward_output_dim", "get_convolution_nd_forward_output_dim",
    "convolution_forward", "convolution_backward_data", "convolution_backward_filter",
    "convolution_bias_activation_forward", "convolution_backward_bias",
    "get_convolution_forward_workspace_size", "get_convolution_backward_data_workspace_size",
    "get_convolution_backward_filter_workspace_size",
] + list(_algos.__all__) + list(_find.__all__)

_H, _CD, _TD, _FD = "pydnnHandle_t", "pydnnConvolutionDescriptor_t", "pydnnTensorDescriptor_t", "pydnnFilterDescriptor_t"
C_OPAQUE_TYPES = [(_CD, "pydnnConvolutionStruct")]
C_STRUCTS = _algos.C_STRUCTS
C_NULLABLE = {"pydnnConvolutionBiasActivationForward": ()}
C_API = [("Convolution", [
    (f"pydnnStatus_t pydnnCreateConvolutionDescriptor({_CD} *convDesc);", "A new convolution descriptor, unset until a Set call."),
    (f"pydnnStatus_t pydnnSetConvolution2dDescriptor({_CD} convDesc, int pad_h, int pad_w, int u, int v, int dilation_h, int dilation_w, pydnnConvolutionMode_t mode, pydnnDataType_t computeType);", "2 spatial dims: padding, strides (u, v), dilations, mode, compute type."),
    (f"pydnnStatus_t pydnnGetConvolution2dDescriptor(const {_CD} convDesc, int *pad_h, int *pad_w, int *u, int *v, int *dilation_h, int *dilation_w, pydnnConvolutionMode_t *mode, pydnnDataType_t *computeType);", "The settings of a 2-d convolution descriptor."),
    (f"pydnnStatus_t pydnnSetConvolutionNdDescriptor({_CD} convDesc, int arrayLength, const int padA[], const int filterStrideA[], const int dilationA[], pydnnConvolutionMode_t mode, pydnnDataType_t computeType);", "1 to 3 spatial dims (arrayLength)."),
    (f"pydnnStatus_t pydnnGetConvolutionNdDescriptor(const {_CD} convDesc, int arrayLengthRequested, int *arrayLength, int padA[], int strideA[], int dilationA[], pydnnConvolutionMode_t *mode, pydnnDataType_t *computeType);", "Spatial dim count and the first arrayLengthRequested pads, strides, dilations."),
    (f"pydnnStatus_t pydnnSetConvolutionGroupCount({_CD} convDesc, int groupCount);", "Grouped (depthwise) convolution."),
    (f"pydnnStatus_t pydnnGetConvolutionGroupCount({_CD} convDesc, int *groupCount);", "The group count."),
    (f"pydnnStatus_t pydnnSetConvolutionMathType({_CD} convDesc, pydnnMathType_t mathType);", "DEFAULT, TENSOR_OP, TENSOR_OP_ALLOW_CONVERSION or FMA."),
    (f"pydnnStatus_t pydnnGetConvolutionMathType({_CD} convDesc, pydnnMathType_t *mathType);", "The math type."),
    (f"pydnnStatus_t pydnnGetConvolution2dForwardOutputDim(const {_CD} convDesc, const {_TD} inputTensorDesc, const {_FD} filterDesc, int *n, int *c, int *h, int *w);", "Output dims of a 2-d convolution."),
    (f"pydnnStatus_t pydnnGetConvolutionNdForwardOutputDim(const {_CD} convDesc, const {_TD} inputTensorDesc, const {_FD} filterDesc, int nbDims, int tensorOuputDimA[]);", "Output dims (nbDims = the input's dim count)."),
    (f"pydnnStatus_t pydnnDestroyConvolutionDescriptor({_CD} convDesc);", "Release a convolution descriptor (NULL: nothing to do)."),
    (f"pydnnStatus_t pydnnGetConvolutionForwardWorkspaceSize({_H} handle, const {_TD} xDesc, const {_FD} wDesc, const {_CD} convDesc, const {_TD} yDesc, pydnnConvolutionFwdAlgo_t algo, size_t *sizeInBytes);", "Workspace bytes of a forward algorithm."),
    (f"pydnnStatus_t pydnnGetConvolutionBackwardDataWorkspaceSize({_H} handle, const {_FD} wDesc, const {_TD} dyDesc, const {_CD} convDesc, const {_TD} dxDesc, pydnnConvolutionBwdDataAlgo_t algo, size_t *sizeInBytes);", "Workspace bytes of a backward-data algorithm."),
    (f"pydnnStatus_t pydnnGetConvolutionBackwardFilterWorkspaceSize({_H} handle, const {_TD} xDesc, const {_TD} dyDesc, const {_CD} convDesc, const {_FD} gradDesc, pydnnConvolutionBwdFilterAlgo_t algo, size_t *sizeInBytes);", "Workspace bytes of a backward-filter algorithm."),
    (f"pydnnStatus_t pydnnConvolutionForward({_H} handle, const void *alpha, const {_TD} xDesc, const void *x, const {_FD} wDesc, const void *w, const {_CD} convDesc, pydnnConvolutionFwdAlgo_t algo, void *workSpace, size_t workSpaceSizeInBytes, const void *beta, const {_TD} yDesc, void *y);", "y = alpha * conv(x, w) + beta * y."),
    (f"pydnnStatus_t pydnnConvolutionBackwardData({_H} handle, const void *alpha, const {_FD} wDesc, const void *w, const {_TD} dyDesc, const void *dy, const {_CD} convDesc, pydnnConvolutionBwdDataAlgo_t algo, void *workSpace, size_t workSpaceSizeInBytes, const void *beta, const {_TD} dxDesc, void *dx);", "dx = alpha * conv-transpose(dy, w) + beta * dx."),
    (f"pydnnStatus_t pydnnConvolutionBackwardFilter({_H} handle, const void *alpha, const {_TD} xDesc, const void *x, const {_TD} dyDesc, const void *dy, const {_CD} convDesc, pydnnConvolutionBwdFilterAlgo_t algo, void *workSpace, size_t workSpaceSizeInBytes, const void *beta, const {_FD} dwDesc, void *dw);", "dw = alpha * filter gradient(x, dy) + beta * dw."),
    (f"pydnnStatus_t pydnnConvolutionBiasActivationForward({_H} handle, const void *alpha1, const {_TD} xDesc, const void *x, const {_FD} wDesc, const void *w, const {_CD} convDesc, pydnnConvolutionFwdAlgo_t algo, void *workSpace, size_t workSpaceSizeInBytes, const void *alpha2, const {_TD} zDesc, const void *z, const {_TD} biasDesc, const void *bias, const pydnnActivationDescriptor_t activationDesc, const {_TD} yDesc, void *y);", "y = act(alpha1 * conv(x, w) + alpha2 * z + bias), fused in the convolution's epilogue."),
    (f"pydnnStatus_t pydnnConvolutionBackwardBias({_H} handle, const void *alpha, const {_TD} dyDesc, const void *dy, const void *beta, const {_TD} dbDesc, void *db);", "db = alpha * sum of dy over all dims but C + beta * db."),
] + _algos.C_FUNCTIONS + _find.C_FUNCTIONS)]
