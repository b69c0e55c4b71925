"""Convolution problems: the descriptor (cudnnConvolutionDescriptor_t and its Set / Get calls), output
dims, the validated Problem a planner works from, the kernels' parameter structs, the algorithm enums,
and the operand rules of the tensor-core kernels that several algorithms consult. Imports no sibling:
every other module of the package builds on this one.

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
"""
import ctypes

from ... import enums as E
from ..._build.params import kernel_params
from ...status import PydnnError, api
from ...tensor import DTYPES, _int, check_filter, check_tensor
from ..common import TAG, enum_arg, prod

BAD, NS = E.PYDNN_STATUS_BAD_PARAM, E.PYDNN_STATUS_NOT_SUPPORTED

# ----------------------------------------------------------------------------- kernel parameters

FLAG_Z, FLAG_BIAS, FLAG_FLIP, FLAG_A_KFAST, FLAG_B_KFAST, FLAG_PARTIAL, FLAG_CIN, FLAG_PAIR, FLAG_STAGED = \
    4, 8, 16, 32, 64, 128, 256, 512, 1024
ACT = {E.PYDNN_ACTIVATION_IDENTITY: 0, E.PYDNN_ACTIVATION_RELU: 1, E.PYDNN_ACTIVATION_CLIPPED_RELU: 2,
       E.PYDNN_ACTIVATION_SIGMOID: 3, E.PYDNN_ACTIVATION_TANH: 4, E.PYDNN_ACTIVATION_ELU: 5}
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
                 "w_dims", "view")

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


def packed_nhwc(strides, dims_c, spatial):
    """Whether 5 strides (n, c, d, h, w) are a packed NHWC layout of (c, *spatial) (size-1 dims free)."""
    if strides[1] != 1 and dims_c > 1:
        return False
    step = dims_c
    for st, size in zip(reversed(strides[2:]), reversed(spatial)):
        if size > 1 and st != step:
            return False
        step *= size
    return True


def strides5(strides):
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
    pb.xs, pb.ys, pb.ws = strides5(x_desc.strides), strides5(y_desc.strides), strides5(w_desc.strides)
    pb.flip = conv.mode == E.PYDNN_CONVOLUTION
    pb.w_format, pb.math_type = w_desc.format, conv.math_type
    pb.x_desc, pb.y_desc, pb.w_dims = x_desc, y_desc, tuple(w_desc.dims)
    return pb


# ----------------------------------------------------------------------------- algorithms

FWD_ALGOS = tuple(v for k, v in E.ENUMS["pydnnConvolutionFwdAlgo_t"].items() if not k.endswith("COUNT"))
BWD_DATA_ALGOS = tuple(v for k, v in E.ENUMS["pydnnConvolutionBwdDataAlgo_t"].items() if not k.endswith("COUNT"))
BWD_FILTER_ALGOS = tuple(v for k, v in E.ENUMS["pydnnConvolutionBwdFilterAlgo_t"].items() if not k.endswith("COUNT"))
ALGO_TYPES = {DIR_FWD: ("pydnnConvolutionFwdAlgo_t", FWD_ALGOS), DIR_BWD_DATA: ("pydnnConvolutionBwdDataAlgo_t",
              BWD_DATA_ALGOS), DIR_BWD_FILTER: ("pydnnConvolutionBwdFilterAlgo_t", BWD_FILTER_ALGOS)}


def algo_name(direction, algo):
    t, _ = ALGO_TYPES[direction]
    for k, v in E.ENUMS[t].items():
        if v == algo:
            return k
    return str(algo)


def operand_names(direction):
    return {DIR_FWD: ("xDesc", "wDesc", "yDesc"), DIR_BWD_DATA: ("dxDesc", "wDesc", "dyDesc"),
            DIR_BWD_FILTER: ("xDesc", "dwDesc", "dyDesc")}[direction]


def filter_bytes(w_desc):
    return prod(w_desc.dims) * DTYPES[w_desc.dtype][0]


# ----------------------------------------------------------------------------- tensor-core operand rules
# What the tensor-core kernels (ptx/convolution.cu) need of their operands: the tensor-core algorithms
# decide with them, and so do the algorithms that run a tensor-core convolution as one of their steps.

TC_TAGS = ("f16", "bf16")   # data types of the tensor-core kernels
TCP_BK = 64                 # the pipelined kernels' K tile (mma::kPipeBK)


def tc_refusal(pb, direction):
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


def wgp_refusal(pb):
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
