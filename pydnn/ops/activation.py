"""Activations: cudnnCreate/Set/Get/DestroyActivationDescriptor, ...SwishBeta, cudnnActivationForward,
cudnnActivationBackward. GELU (erf and tanh forms) are pydnn extensions (PYDNN_ACTIVATION_GELU_*).

Forward  y  = alpha * f(x) + beta * y
Backward dx = alpha * f'(x) * dy + beta * dx   (sigmoid and tanh use y; the others use x)
"""
from .. import enums as E
from .._build.manifest import KernelUnit
from .._build.params import FLAG_NAN_PROP
from ..handle import check_handle
from ..status import PydnnError, api
from . import _elementwise as ew
from .common import FLOAT_TAGS, TAG, buffer, enum_arg, float_tensor, output_tensor, same_shape, same_type, scalar

# mode -> (forward functor, backward functor) in ptx/activation.cu
OPS = {
    E.PYDNN_ACTIVATION_SIGMOID: ("pydnn::act::Sigmoid", "pydnn::act::SigmoidBwd"),
    E.PYDNN_ACTIVATION_RELU: ("pydnn::act::Relu", "pydnn::act::ReluBwd"),
    E.PYDNN_ACTIVATION_TANH: ("pydnn::act::Tanh", "pydnn::act::TanhBwd"),
    E.PYDNN_ACTIVATION_CLIPPED_RELU: ("pydnn::act::ClippedRelu", "pydnn::act::ClippedReluBwd"),
    E.PYDNN_ACTIVATION_ELU: ("pydnn::act::Elu", "pydnn::act::EluBwd"),
    E.PYDNN_ACTIVATION_IDENTITY: ("pydnn::act::Identity", "pydnn::act::IdentityBwd"),
    E.PYDNN_ACTIVATION_SWISH: ("pydnn::act::Swish", "pydnn::act::SwishBwd"),
    E.PYDNN_ACTIVATION_GELU_ERF: ("pydnn::act::GeluErf", "pydnn::act::GeluErfBwd"),
    E.PYDNN_ACTIVATION_GELU_TANH: ("pydnn::act::GeluTanh", "pydnn::act::GeluTanhBwd"),
}


def kernel_units():
    units = []
    for t in FLOAT_TAGS:
        exprs = []
        for fwd, bwd in OPS.values():
            exprs += ew.map_exprs(fwd, t) + ew.map_exprs(bwd, t)
        units.append(KernelUnit(f"activation.{t}", "activation.cu", tuple(exprs)))
    return units


class ActivationDescriptor:
    """cudnnActivationDescriptor_t."""

    __slots__ = ("mode", "relu_nan_opt", "coef", "swish_beta", "is_set", "alive")

    def __init__(self):
        self.mode, self.relu_nan_opt, self.coef, self.swish_beta = E.PYDNN_ACTIVATION_RELU, 0, 0.0, 1.0
        self.is_set, self.alive = False, True


def _live(desc, name="activationDesc"):
    if type(desc) is not ActivationDescriptor or not desc.alive:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{name}: not a live activation descriptor")
    return desc


@api
def create_activation_descriptor():
    """cudnnCreateActivationDescriptor."""
    return ActivationDescriptor()


@api
def set_activation_descriptor(activation_desc, mode, relu_nan_opt, coef):
    """cudnnSetActivationDescriptor: coef is the clipped-ReLU ceiling or the ELU alpha."""
    _live(activation_desc)
    mode = enum_arg("mode", mode, OPS, "pydnnActivationMode_t")
    nan = enum_arg("reluNanOpt", relu_nan_opt, (E.PYDNN_NOT_PROPAGATE_NAN, E.PYDNN_PROPAGATE_NAN),
                   "pydnnNanPropagation_t")
    c = scalar("coef", coef)
    if c != c:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, "coef: NaN")
    activation_desc.mode, activation_desc.relu_nan_opt, activation_desc.coef = mode, nan, c
    activation_desc.is_set = True


@api
def get_activation_descriptor(activation_desc):
    """cudnnGetActivationDescriptor -> (mode, reluNanOpt, coef)."""
    d = _live(activation_desc)
    return d.mode, d.relu_nan_opt, d.coef


@api
def set_activation_descriptor_swish_beta(activation_desc, swish_beta):
    """cudnnSetActivationDescriptorSwishBeta: y = x * sigmoid(swish_beta * x)."""
    _live(activation_desc).swish_beta = scalar("swish_beta", swish_beta)


@api
def get_activation_descriptor_swish_beta(activation_desc):
    """cudnnGetActivationDescriptorSwishBeta."""
    return _live(activation_desc).swish_beta


@api
def destroy_activation_descriptor(activation_desc):
    """cudnnDestroyActivationDescriptor."""
    if activation_desc is None:
        return
    _live(activation_desc).alive = False


def _set(desc):
    _live(desc)
    if not desc.is_set:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, "activationDesc: descriptor was never set")
    return desc


def _flags(desc):
    return FLAG_NAN_PROP if desc.relu_nan_opt == E.PYDNN_PROPAGATE_NAN else 0


@api
def activation_forward(handle, activation_desc, alpha, x_desc, x, beta, y_desc, y):
    """cudnnActivationForward: y = alpha * f(x) + beta * y. x and y may be the same buffer."""
    check_handle(handle)
    a = _set(activation_desc)
    al, be = scalar("alpha", alpha), scalar("beta", beta)
    float_tensor(x_desc, "xDesc")
    float_tensor(y_desc, "yDesc")
    same_shape(x_desc, "xDesc", y_desc, "yDesc")
    same_type(x_desc, "xDesc", y_desc, "yDesc")
    output_tensor(y_desc, "yDesc")
    xp, yp = buffer(x, x_desc, "x"), buffer(y, y_desc, "y")
    t = TAG[x_desc.dtype]
    ew.launch_map(handle, f"activation.{t}", OPS[a.mode][0], t, t, yp, (xp,), al, be, y_desc, (x_desc,),
                  flags=_flags(a), coef=a.coef, coef2=a.swish_beta)


@api
def activation_backward(handle, activation_desc, alpha, y_desc, y, dy_desc, dy, x_desc, x, beta, dx_desc, dx):
    """cudnnActivationBackward: dx = alpha * f'(x) * dy + beta * dx."""
    check_handle(handle)
    a = _set(activation_desc)
    al, be = scalar("alpha", alpha), scalar("beta", beta)
    for d, n in ((y_desc, "yDesc"), (dy_desc, "dyDesc"), (x_desc, "xDesc"), (dx_desc, "dxDesc")):
        float_tensor(d, n)
        same_shape(y_desc, "yDesc", d, n)
        same_type(y_desc, "yDesc", d, n)
    output_tensor(dx_desc, "dxDesc")
    yp, dyp = buffer(y, y_desc, "y"), buffer(dy, dy_desc, "dy")
    xp, dxp = buffer(x, x_desc, "x"), buffer(dx, dx_desc, "dx")
    t = TAG[y_desc.dtype]
    ew.launch_map(handle, f"activation.{t}", OPS[a.mode][1], t, t, dxp, (dyp, yp, xp), al, be, dx_desc,
                  (dy_desc, y_desc, x_desc), flags=_flags(a), coef=a.coef, coef2=a.swish_beta)
