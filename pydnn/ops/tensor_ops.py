"""Tensor ops: cudnnSetTensor, cudnnScaleTensor, cudnnAddTensor, cudnnOpTensor (+ its descriptor),
cudnnTransformTensor. All are element-wise maps (ptx/tensor_ops.cu over common/elementwise.cuh).

Supported types: SetTensor takes all eight data types; ScaleTensor, AddTensor and OpTensor take float,
double, half and bfloat16 with every tensor of one type (arithmetic in float, double for double);
TransformTensor converts between any two of the eight (to integers: round to nearest even, saturate,
NaN -> 0). Broadcasting as cuDNN: AddTensor's A and OpTensor's B may have 1 where C has more.
"""
from .. import enums as E
from .._build.manifest import KernelUnit
from .._build.params import FLAG_NAN_PROP
from ..buffers import device_ptr
from ..handle import check_handle
from ..status import PydnnError, api
from ..tensor import DTYPES, check_tensor
from . import _elementwise as ew
from .common import FLOAT_TAGS, TAG, enum_arg, float_tensor, output_tensor, same_type, scalar

ALL_TAGS = ("f32", "f64", "f16", "bf16", "i8", "u8", "i32", "i64")
OPS = {E.PYDNN_OP_TENSOR_ADD: "pydnn::tensor::OpAdd", E.PYDNN_OP_TENSOR_MUL: "pydnn::tensor::OpMul",
       E.PYDNN_OP_TENSOR_MIN: "pydnn::tensor::OpMin", E.PYDNN_OP_TENSOR_MAX: "pydnn::tensor::OpMax",
       E.PYDNN_OP_TENSOR_SQRT: "pydnn::tensor::OpSqrt", E.PYDNN_OP_TENSOR_NOT: "pydnn::tensor::OpNot"}
UNARY = (E.PYDNN_OP_TENSOR_SQRT, E.PYDNN_OP_TENSOR_NOT)
SET, SCALED = "pydnn::tensor::Set", "pydnn::tensor::Scaled"


def kernel_units():
    units = []
    for t in ALL_TAGS:
        exprs = list(ew.map_exprs(SET, t))
        if t in FLOAT_TAGS:
            for op in (SCALED, *OPS.values()):
                exprs += ew.map_exprs(op, t)
            exprs.append(ew.transpose_expr(SCALED, t))
        units.append(KernelUnit(f"tensor_ops.{t}", "tensor_ops.cu", tuple(exprs)))
        outs = [to for to in ALL_TAGS if to != t or t not in FLOAT_TAGS]  # same float type: the unit above
        conv = [e for to in outs for e in ew.map_exprs(SCALED, t, to) + (ew.transpose_expr(SCALED, t, to),)]
        units.append(KernelUnit(f"tensor_ops.transform.{t}", "tensor_ops.cu", tuple(conv)))
    return units


def _transform_unit(ti, to):
    return f"tensor_ops.{ti}" if ti == to and ti in FLOAT_TAGS else f"tensor_ops.transform.{ti}"


def _broadcast(src, sname, dst, dname):
    """Each dim of src equals dst's or is 1 (cuDNN's broadcast rule), with as many dims."""
    if len(src.dims) != len(dst.dims):
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM,
                         f"{sname}: has {len(src.dims)} dims, {dname} has {len(dst.dims)}")
    for i, (a, c) in enumerate(zip(src.dims, dst.dims)):
        if a != c and a != 1:
            raise PydnnError(E.PYDNN_STATUS_BAD_PARAM,
                             f"{sname}: dim {i} is {a}; it must equal {dname}'s ({c}) or be 1")


def _any_tensor(desc, name):
    check_tensor(desc, name)
    if desc.dtype not in DTYPES:
        raise PydnnError(E.PYDNN_STATUS_NOT_SUPPORTED, f"{name}: data type {desc.dtype} is not supported")
    return desc


@api
def set_tensor(handle, y_desc, y, value):
    """cudnnSetTensor: every element of y = value (any of the eight data types)."""
    check_handle(handle)

    def build():
        _any_tensor(y_desc, "yDesc")
        output_tensor(y_desc, "yDesc")
        device_ptr(y, "y", y_desc.span_bytes())
        t = TAG[y_desc.dtype]
        return ew.prepare_map(handle, f"tensor_ops.{t}", SET, t, t, y_desc, ())

    v = scalar("valuePtr", value)
    rec = ew.cached(handle, ew.desc_key("set", y_desc), build)
    rec.params.coef = v
    ew.run_map(handle, rec, device_ptr(y, "y", rec.need[0]), (), 1.0, 0.0)


@api
def scale_tensor(handle, y_desc, y, alpha):
    """cudnnScaleTensor: y = alpha * y."""
    check_handle(handle)

    def build():
        float_tensor(y_desc, "yDesc")
        output_tensor(y_desc, "yDesc")
        device_ptr(y, "y", y_desc.span_bytes())
        t = TAG[y_desc.dtype]
        return ew.prepare_map(handle, f"tensor_ops.{t}", SCALED, t, t, y_desc, (y_desc,))

    al = scalar("alpha", alpha)
    rec = ew.cached(handle, ew.desc_key("scale", y_desc), build)
    yp = device_ptr(y, "y", rec.need[0])
    ew.run_map(handle, rec, yp, (yp,), al, 0.0)


@api
def add_tensor(handle, alpha, a_desc, A, beta, c_desc, C):  # noqa: N803 - cuDNN's names
    """cudnnAddTensor: C = alpha * A + beta * C; A broadcasts where its dims are 1."""
    check_handle(handle)

    def build():
        float_tensor(a_desc, "aDesc")
        float_tensor(c_desc, "cDesc")
        same_type(c_desc, "cDesc", a_desc, "aDesc")
        _broadcast(a_desc, "aDesc", c_desc, "cDesc")
        output_tensor(c_desc, "cDesc")
        device_ptr(A, "A", a_desc.span_bytes())
        device_ptr(C, "C", c_desc.span_bytes())
        t = TAG[c_desc.dtype]
        return ew.prepare_map(handle, f"tensor_ops.{t}", SCALED, t, t, c_desc, (a_desc,))

    al, be = scalar("alpha", alpha), scalar("beta", beta)
    rec = ew.cached(handle, ew.desc_key("add", a_desc, c_desc), build)
    ew.run_map(handle, rec, device_ptr(C, "C", rec.need[0]), (device_ptr(A, "A", rec.need[1]),), al, be)


class OpTensorDescriptor:
    """cudnnOpTensorDescriptor_t."""

    __slots__ = ("op", "comp_type", "nan_opt", "is_set", "alive", "version")

    def __init__(self):
        self.op, self.comp_type, self.nan_opt = E.PYDNN_OP_TENSOR_ADD, E.PYDNN_DATA_FLOAT, 0
        self.is_set, self.alive, self.version = False, True, 0


def _live_op(desc):
    if type(desc) is not OpTensorDescriptor or not desc.alive:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, "opTensorDesc: not a live op-tensor descriptor")
    return desc


@api
def create_op_tensor_descriptor():
    """cudnnCreateOpTensorDescriptor."""
    return OpTensorDescriptor()


@api
def set_op_tensor_descriptor(op_tensor_desc, op_tensor_op, op_tensor_comp_type, op_tensor_nan_opt):
    """cudnnSetOpTensorDescriptor. The compute type may be FLOAT or DOUBLE; arithmetic is float for
    16-bit and float data and double for double data (DOUBLE with float data computes in double too)."""
    d = _live_op(op_tensor_desc)
    op = enum_arg("opTensorOp", op_tensor_op, OPS, "pydnnOpTensorOp_t")
    comp = enum_arg("opTensorCompType", op_tensor_comp_type, (E.PYDNN_DATA_FLOAT, E.PYDNN_DATA_DOUBLE),
                    "compute type (FLOAT or DOUBLE)")
    nan = enum_arg("opTensorNanOpt", op_tensor_nan_opt, (E.PYDNN_NOT_PROPAGATE_NAN, E.PYDNN_PROPAGATE_NAN),
                   "pydnnNanPropagation_t")
    d.op, d.comp_type, d.nan_opt, d.is_set = op, comp, nan, True
    d.version += 1


@api
def get_op_tensor_descriptor(op_tensor_desc):
    """cudnnGetOpTensorDescriptor -> (opTensorOp, opTensorCompType, opTensorNanOpt)."""
    d = _live_op(op_tensor_desc)
    return d.op, d.comp_type, d.nan_opt


@api
def destroy_op_tensor_descriptor(op_tensor_desc):
    """cudnnDestroyOpTensorDescriptor."""
    if op_tensor_desc is None:
        return
    d = _live_op(op_tensor_desc)
    d.alive = False
    d.version += 1


@api
def op_tensor(handle, op_tensor_desc, alpha1, a_desc, A, alpha2, b_desc, B, beta, c_desc, C):  # noqa: N803
    """cudnnOpTensor: C = op(alpha1 * A, alpha2 * B) + beta * C. A has C's dims; B may broadcast.
    SQRT and NOT use A only (B and bDesc may be None). C may be the same buffer as A."""
    check_handle(handle)
    unary = getattr(op_tensor_desc, "op", None) in UNARY

    def build():
        d = _live_op(op_tensor_desc)
        if not d.is_set:
            raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, "opTensorDesc: descriptor was never set")
        float_tensor(a_desc, "aDesc")
        float_tensor(c_desc, "cDesc")
        same_type(c_desc, "cDesc", a_desc, "aDesc")
        if a_desc.dims != c_desc.dims:
            raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"aDesc: dims {a_desc.dims} differ from cDesc dims {c_desc.dims}")
        ins = (a_desc,)
        if not unary:
            float_tensor(b_desc, "bDesc")
            same_type(c_desc, "cDesc", b_desc, "bDesc")
            _broadcast(b_desc, "bDesc", c_desc, "cDesc")
            device_ptr(B, "B", b_desc.span_bytes())
            ins = (a_desc, b_desc)
        output_tensor(c_desc, "cDesc")
        device_ptr(A, "A", a_desc.span_bytes())
        device_ptr(C, "C", c_desc.span_bytes())
        t = TAG[c_desc.dtype]
        flags = FLAG_NAN_PROP if d.nan_opt == E.PYDNN_PROPAGATE_NAN else 0
        return ew.prepare_map(handle, f"tensor_ops.{t}", OPS[d.op], t, t, c_desc, ins, flags=flags)

    a1, a2, be = scalar("alpha1", alpha1), scalar("alpha2", alpha2), scalar("beta", beta)
    key = ew.desc_key("op", op_tensor_desc, a_desc, c_desc, None if unary else b_desc)
    rec = ew.cached(handle, key, build)
    ptrs = (device_ptr(A, "A", rec.need[1]),) if unary else (device_ptr(A, "A", rec.need[1]),
                                                              device_ptr(B, "B", rec.need[2]))
    ew.run_map(handle, rec, device_ptr(C, "C", rec.need[0]), ptrs, a1, be, alpha2=a2)


@api
def transform_tensor(handle, alpha, x_desc, x, beta, y_desc, y):
    """cudnnTransformTensor: y = alpha * x + beta * y between any strides and any two data types."""
    check_handle(handle)

    def build():
        _any_tensor(x_desc, "xDesc")
        _any_tensor(y_desc, "yDesc")
        if x_desc.dims != y_desc.dims:
            raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"yDesc: dims {y_desc.dims} differ from xDesc dims {x_desc.dims}")
        output_tensor(y_desc, "yDesc")
        device_ptr(x, "x", x_desc.span_bytes())
        device_ptr(y, "y", y_desc.span_bytes())
        ti, to = TAG[x_desc.dtype], TAG[y_desc.dtype]
        return ew.prepare_map(handle, _transform_unit(ti, to), SCALED, ti, to, y_desc, (x_desc,), transpose=True)

    al, be = scalar("alpha", alpha), scalar("beta", beta)
    rec = ew.cached(handle, ew.desc_key("transform", x_desc, y_desc), build)
    ew.run_map(handle, rec, device_ptr(y, "y", rec.need[0]), (device_ptr(x, "x", rec.need[1]),), al, be)
