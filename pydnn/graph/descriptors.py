"""cuDNN's backend descriptors: a typed attribute store per descriptor type, checked on every set (the
attribute belongs to the type, its attribute type, element count and values) and frozen by finalize.

Descriptor types, attribute names and attribute types are cuDNN 9's (pydnnBackendDescriptorType_t,
pydnnBackendAttributeName_t, pydnnBackendAttributeType_t in pydnn.enums). SCHEMA says, per descriptor
type, which attributes it takes; FINALIZERS (filled by the modules above this one: opgraph, engines, plans)
validate a descriptor's attributes into its `state` at finalize. Every error is a PydnnError naming the
descriptor type and the attribute: BAD_PARAM (wrong type, count or value, a finalized descriptor set
again, a required attribute missing), BAD_PARAM_NOT_FINALIZED (a descriptor given before its finalize),
NOT_SUPPORTED (valid, but no engine of pydnn runs it; the reason is in the message).
"""
import math
import operator

from .. import enums as E
from ..status import PydnnError

T = {v: k[len("PYDNN_TYPE_"):] for k, v in E.ENUMS["pydnnBackendAttributeType_t"].items()}
A = {v: k[len("PYDNN_ATTR_"):] for k, v in E.ENUMS["pydnnBackendAttributeName_t"].items()}
D = {v: k[len("PYDNN_BACKEND_"):-len("_DESCRIPTOR")] for k, v in E.ENUMS["pydnnBackendDescriptorType_t"].items()}
DT = {k[len("PYDNN_"):]: v for k, v in E.ENUMS["pydnnBackendDescriptorType_t"].items()}

TYPE_ENUMS = {  # attribute type -> the enum its values come from
    "DATA_TYPE": "pydnnDataType_t", "HEUR_MODE": "pydnnBackendHeurMode_t", "KNOB_TYPE": "pydnnBackendKnobType_t",
    "NAN_PROPOGATION": "pydnnNanPropagation_t", "POINTWISE_MODE": "pydnnPointwiseMode_t",
    "REDUCTION_OPERATOR_TYPE": "pydnnReduceTensorOp_t", "CONVOLUTION_MODE": "pydnnConvolutionMode_t",
    "NUMERICAL_NOTE": "pydnnBackendNumericalNote_t", "BEHAVIOR_NOTE": "pydnnBackendBehaviorNote_t",
    "NORM_MODE": "pydnnBackendNormMode_t", "NORM_FWD_PHASE": "pydnnBackendNormFwdPhase_t",
}
# operation descriptor types an OPERATIONGRAPH takes (a list: register_operation adds the node modules' ones)
OPERATIONS = ["OPERATION_POINTWISE", "OPERATION_MATMUL", "OPERATION_REDUCTION", "OPERATION_CONVOLUTION_FORWARD",
              "OPERATION_CONVOLUTION_BACKWARD_DATA", "OPERATION_CONVOLUTION_BACKWARD_FILTER"]


class Attr:
    """One attribute of a descriptor type: accepted attribute types, element count range, whether a user
    may set it (False: computed, get only), required at finalize, and for BACKEND_DESCRIPTOR the descriptor
    types its elements may have."""

    __slots__ = ("types", "lo", "hi", "settable", "required", "kinds")

    def __init__(self, types, lo=1, hi=1, settable=True, required=False, kinds=()):
        self.types = (types,) if isinstance(types, str) else tuple(types)
        self.lo, self.hi, self.settable, self.required, self.kinds = lo, hi, settable, required, kinds


R = dict(required=True)
TENSORDESC = dict(kinds=("TENSOR",))
SCALAR = ("FLOAT", "DOUBLE")
SCHEMA = {
    "TENSOR": {
        "TENSOR_DATA_TYPE": Attr("DATA_TYPE", **R), "TENSOR_DIMENSIONS": Attr("INT64", 1, 8, **R),
        "TENSOR_STRIDES": Attr("INT64", 1, 8, **R), "TENSOR_UNIQUE_ID": Attr("INT64", **R),
        "TENSOR_BYTE_ALIGNMENT": Attr("INT64", **R), "TENSOR_IS_VIRTUAL": Attr("BOOLEAN"),
        "TENSOR_IS_BY_VALUE": Attr("BOOLEAN"), "TENSOR_VECTOR_COUNT": Attr("INT64"),
        "TENSOR_VECTORIZED_DIMENSION": Attr("INT64"),
    },
    "POINTWISE": {
        "POINTWISE_MODE": Attr("POINTWISE_MODE", **R), "POINTWISE_MATH_PREC": Attr("DATA_TYPE", **R),
        "POINTWISE_NAN_PROPAGATION": Attr("NAN_PROPOGATION"), "POINTWISE_RELU_LOWER_CLIP": Attr(SCALAR),
        "POINTWISE_RELU_UPPER_CLIP": Attr(SCALAR), "POINTWISE_RELU_LOWER_CLIP_SLOPE": Attr(SCALAR),
        "POINTWISE_ELU_ALPHA": Attr(SCALAR), "POINTWISE_SOFTPLUS_BETA": Attr(SCALAR),
        "POINTWISE_SWISH_BETA": Attr(SCALAR), "POINTWISE_AXIS": Attr("INT64"),
    },
    "OPERATION_POINTWISE": {
        "OPERATION_POINTWISE_PW_DESCRIPTOR": Attr("BACKEND_DESCRIPTOR", kinds=("POINTWISE",), **R),
        **{f"OPERATION_POINTWISE_{n}": Attr("BACKEND_DESCRIPTOR", **TENSORDESC)
           for n in ("XDESC", "BDESC", "YDESC", "TDESC", "DXDESC", "DYDESC")},
        "OPERATION_POINTWISE_ALPHA1": Attr(SCALAR), "OPERATION_POINTWISE_ALPHA2": Attr(SCALAR),
    },
    "MATMUL": {"MATMUL_COMP_TYPE": Attr("DATA_TYPE", **R), "MATMUL_PADDING_VALUE": Attr(SCALAR)},
    "OPERATION_MATMUL": {
        "OPERATION_MATMUL_ADESC": Attr("BACKEND_DESCRIPTOR", **TENSORDESC, **R),
        "OPERATION_MATMUL_BDESC": Attr("BACKEND_DESCRIPTOR", **TENSORDESC, **R),
        "OPERATION_MATMUL_CDESC": Attr("BACKEND_DESCRIPTOR", **TENSORDESC, **R),
        "OPERATION_MATMUL_DESC": Attr("BACKEND_DESCRIPTOR", kinds=("MATMUL",), **R),
        "OPERATION_MATMUL_IRREGULARLY_STRIDED_BATCH_COUNT": Attr("INT64"),
    },
    "CONVOLUTION": {
        "CONVOLUTION_COMP_TYPE": Attr("DATA_TYPE", **R), "CONVOLUTION_CONV_MODE": Attr("CONVOLUTION_MODE", **R),
        "CONVOLUTION_SPATIAL_DIMS": Attr("INT64", **R), "CONVOLUTION_DILATIONS": Attr("INT64", 1, 6, **R),
        "CONVOLUTION_FILTER_STRIDES": Attr("INT64", 1, 6, **R), "CONVOLUTION_PRE_PADDINGS": Attr("INT64", 1, 6, **R),
        "CONVOLUTION_POST_PADDINGS": Attr("INT64", 1, 6, **R),
    },
    **{f"OPERATION_CONVOLUTION_{kind}": {
        f"OPERATION_CONVOLUTION_{attr}_ALPHA": Attr(SCALAR), f"OPERATION_CONVOLUTION_{attr}_BETA": Attr(SCALAR),
        f"OPERATION_CONVOLUTION_{attr}_CONV_DESC": Attr("BACKEND_DESCRIPTOR", kinds=("CONVOLUTION",), **R),
        **{f"OPERATION_CONVOLUTION_{attr}_{t}": Attr("BACKEND_DESCRIPTOR", **TENSORDESC, **R) for t in tens},
    } for kind, attr, tens in (("FORWARD", "FORWARD", ("W", "X", "Y")), ("BACKWARD_DATA", "BWD_DATA", ("W", "DX", "DY")),
                               ("BACKWARD_FILTER", "BWD_FILTER", ("DW", "X", "DY")))},
    "REDUCTION": {"REDUCTION_OPERATOR": Attr("REDUCTION_OPERATOR_TYPE", **R),
                  "REDUCTION_COMP_TYPE": Attr("DATA_TYPE", **R)},
    "OPERATION_REDUCTION": {
        "OPERATION_REDUCTION_XDESC": Attr("BACKEND_DESCRIPTOR", **TENSORDESC, **R),
        "OPERATION_REDUCTION_YDESC": Attr("BACKEND_DESCRIPTOR", **TENSORDESC, **R),
        "OPERATION_REDUCTION_DESC": Attr("BACKEND_DESCRIPTOR", kinds=("REDUCTION",), **R),
    },
    "OPERATIONGRAPH": {
        "OPERATIONGRAPH_HANDLE": Attr("HANDLE", **R),
        "OPERATIONGRAPH_OPS": Attr("BACKEND_DESCRIPTOR", 1, 1024, kinds=OPERATIONS, **R),
        "OPERATIONGRAPH_ENGINE_GLOBAL_COUNT": Attr("INT64", settable=False),
    },
    "ENGINEHEUR": {
        "ENGINEHEUR_OPERATION_GRAPH": Attr("BACKEND_DESCRIPTOR", kinds=("OPERATIONGRAPH",), **R),
        "ENGINEHEUR_MODE": Attr("HEUR_MODE", **R), "ENGINEHEUR_SM_COUNT_TARGET": Attr("INT32"),
        "ENGINEHEUR_RESULTS": Attr("BACKEND_DESCRIPTOR", 0, 1024, settable=False),
    },
    "ENGINE": {
        "ENGINE_OPERATION_GRAPH": Attr("BACKEND_DESCRIPTOR", kinds=("OPERATIONGRAPH",), **R),
        "ENGINE_GLOBAL_INDEX": Attr("INT64", **R), "ENGINE_SM_COUNT_TARGET": Attr("INT32"),
        "ENGINE_KNOB_INFO": Attr("BACKEND_DESCRIPTOR", 0, 64, settable=False),
        "ENGINE_NUMERICAL_NOTE": Attr("NUMERICAL_NOTE", 0, 16, settable=False),
        "ENGINE_BEHAVIOR_NOTE": Attr("BEHAVIOR_NOTE", 0, 16, settable=False),
        "ENGINE_LAYOUT_INFO": Attr("BACKEND_DESCRIPTOR", 0, 64, settable=False),
    },
    "ENGINECFG": {
        "ENGINECFG_ENGINE": Attr("BACKEND_DESCRIPTOR", kinds=("ENGINE",), **R),
        "ENGINECFG_KNOB_CHOICES": Attr("BACKEND_DESCRIPTOR", 0, 64, kinds=("KNOB_CHOICE",)),
        "ENGINECFG_INTERMEDIATE_INFO": Attr("BACKEND_DESCRIPTOR", 0, 1, settable=False),
    },
    "KNOB_CHOICE": {"KNOB_CHOICE_KNOB_TYPE": Attr("KNOB_TYPE", **R), "KNOB_CHOICE_KNOB_VALUE": Attr("INT64", **R)},
    "EXECUTION_PLAN": {
        "EXECUTION_PLAN_HANDLE": Attr("HANDLE", **R),
        "EXECUTION_PLAN_ENGINE_CONFIG": Attr("BACKEND_DESCRIPTOR", kinds=("ENGINECFG",)),
        "EXECUTION_PLAN_JSON_REPRESENTATION": Attr("CHAR", 1, 1 << 24),
        "EXECUTION_PLAN_RUN_ONLY_INTERMEDIATE_UIDS": Attr("INT64", 0, 1024),
        "EXECUTION_PLAN_WORKSPACE_SIZE": Attr("INT64", settable=False),
        "EXECUTION_PLAN_COMPUTED_INTERMEDIATE_UIDS": Attr("INT64", 0, 1024, settable=False),
    },
    "VARIANT_PACK": {
        "VARIANT_PACK_UNIQUE_IDS": Attr("INT64", 0, 1024), "VARIANT_PACK_DATA_POINTERS": Attr("VOID_PTR", 0, 1024),
        "VARIANT_PACK_WORKSPACE": Attr("VOID_PTR"), "VARIANT_PACK_INTERMEDIATES": Attr("VOID_PTR", 0, 1024),
    },
}
FINALIZERS = {}  # descriptor type name -> fn(desc) -> state (registered by tensors/ops here, graphs/plans above)


def register_operation(kind, schema, finalizer):
    """An operation descriptor type of a node module (norm_nodes, sdpa_nodes): its attributes, its
    finalizer (-> OpInfo), and its place among the operations an OPERATIONGRAPH takes."""
    SCHEMA[kind] = schema
    FINALIZERS[kind] = finalizer
    if kind not in OPERATIONS:
        OPERATIONS.append(kind)


def bad(msg, status=E.PYDNN_STATUS_BAD_PARAM):
    return PydnnError(status, msg)


class BackendDescriptor:
    """cudnnBackendDescriptor_t of one descriptor type."""

    __slots__ = ("kind", "attrs", "finalized", "alive", "state", "__weakref__")

    def __init__(self, kind):
        self.kind, self.attrs, self.finalized, self.alive, self.state = kind, {}, False, True, None

    def __repr__(self):
        return f"<pydnn backend {self.kind} descriptor{' (finalized)' if self.finalized else ''}>"

    # convenient reads for the modules above (after finalize)
    def get(self, name, default=None):
        v = self.attrs.get(name)
        return default if v is None else v[1]

    def one(self, name, default=None):
        v = self.attrs.get(name)
        return default if v is None else v[1][0]


def check_descriptor(desc, name="descriptor"):
    if type(desc) is not BackendDescriptor or not desc.alive:
        raise bad(f"{name}: not a live backend descriptor")
    return desc


def _index(v):
    """v as a Python int when it is an integer (has __index__ that works), else None: a bool, a float, a
    numpy array of several elements and the like are not indices."""
    if type(v) is int:  # the common case first (build_operation_graph makes ~1000 of these calls a chain)
        return v
    if isinstance(v, bool) or not hasattr(v, "__index__"):
        return None
    try:
        return operator.index(v)
    except (TypeError, ValueError, OverflowError):
        return None


def descriptor_type(v):
    if _index(v) not in D:
        raise bad(f"descriptorType: {v!r} is not a pydnnBackendDescriptorType_t value")
    kind = D[_index(v)]
    if kind not in SCHEMA:
        raise bad(f"descriptorType: {kind} descriptors are not supported by pydnn "
                  f"(supported: {', '.join(sorted(SCHEMA))})", E.PYDNN_STATUS_NOT_SUPPORTED)
    return kind


def _attr(desc, name):
    if _index(name) not in A:
        raise bad(f"attributeName: {name!r} is not a pydnnBackendAttributeName_t value")
    an = A[_index(name)]
    spec = SCHEMA[desc.kind].get(an)
    if spec is None:
        raise bad(f"attributeName: PYDNN_ATTR_{an} is not an attribute of a {desc.kind} descriptor")
    return an, spec


def _attr_type(an, spec, attr_type):
    if _index(attr_type) not in T:
        raise bad(f"attributeType: {attr_type!r} is not a pydnnBackendAttributeType_t value")
    tn = T[_index(attr_type)]
    if tn not in spec.types:
        want = " or ".join(f"PYDNN_TYPE_{t}" for t in spec.types)
        raise bad(f"attributeType: PYDNN_ATTR_{an} takes {want}, not PYDNN_TYPE_{tn}",
                  E.PYDNN_STATUS_BAD_PARAM)
    return tn


def _value(an, tn, spec, i, v):
    where = f"arrayOfElements[{i}] (PYDNN_ATTR_{an})"
    if tn in ("INT64", "INT32"):
        if _index(v) is None:
            raise bad(f"{where}: expected an integer, got {type(v).__name__}")
        v = _index(v)
        lim = 2**63 if tn == "INT64" else 2**31
        if not -lim <= v < lim:
            raise bad(f"{where}: {v} does not fit {tn}")
        return v
    if tn in ("FLOAT", "DOUBLE"):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise bad(f"{where}: expected a number, got {type(v).__name__}")
        return float(v)
    if tn == "BOOLEAN":
        if v in (True, False, 0, 1) and not isinstance(v, float):
            return bool(v)
        raise bad(f"{where}: expected a boolean, got {v!r}")
    if tn in TYPE_ENUMS:
        values = E.ENUMS[TYPE_ENUMS[tn]].values()
        if _index(v) not in values:
            raise bad(f"{where}: {v!r} is not a {TYPE_ENUMS[tn]} value")
        return _index(v)
    if tn == "BACKEND_DESCRIPTOR":
        if type(v) is not BackendDescriptor or not v.alive:
            raise bad(f"{where}: not a live backend descriptor")
        if spec.kinds and v.kind not in spec.kinds:
            raise bad(f"{where}: a {v.kind} descriptor, expected {' or '.join(spec.kinds)}")
        if not v.finalized:
            raise bad(f"{where}: the {v.kind} descriptor is not finalized", E.PYDNN_STATUS_BAD_PARAM_NOT_FINALIZED)
        return v
    if tn == "HANDLE":
        from ..handle import check_handle

        return check_handle(v, where)
    if tn == "VOID_PTR":
        if isinstance(v, bool):
            raise bad(f"{where}: expected a device pointer, got a bool")
        if type(v) is int and v < 0:
            raise bad(f"{where}: negative address {v}")
        return v  # an int address or a buffer object (resolved when the plan executes)
    if tn == "CHAR":
        if isinstance(v, (bytes, bytearray)):
            v = bytes(v).decode("utf-8", "replace")
        if not isinstance(v, str):
            raise bad(f"{where}: expected characters, got {type(v).__name__}")
        return v
    raise bad(f"{where}: attribute type {tn} is not handled", E.PYDNN_STATUS_NOT_SUPPORTED)


def set_attribute(desc, name, attr_type, count, elements):
    check_descriptor(desc)
    an, spec = _attr(desc, name)
    if desc.finalized:
        raise bad(f"descriptor: the {desc.kind} descriptor is finalized (immutable); PYDNN_ATTR_{an} cannot be set")
    if not spec.settable:
        raise bad(f"attributeName: PYDNN_ATTR_{an} is computed by pydnn (get only)")
    tn = _attr_type(an, spec, attr_type)
    if _index(count) is None:
        raise bad(f"elementCount: expected an integer, got {type(count).__name__}")
    count = _index(count)
    if tn == "CHAR":  # a character array: elementCount characters of `elements` (a str or bytes)
        text = _value(an, tn, spec, 0, elements)
        if not 1 <= count <= min(len(text), spec.hi):
            raise bad(f"elementCount: {count} characters, PYDNN_ATTR_{an} was given {len(text)}")
        desc.attrs[an] = (tn, [text[:count]])
        return
    if not spec.lo <= count <= spec.hi:
        raise bad(f"elementCount: PYDNN_ATTR_{an} takes {spec.lo if spec.lo == spec.hi else f'{spec.lo} to {spec.hi}'} "
                  f"element(s), not {count}")
    try:
        seq = list(elements) if not isinstance(elements, (str, bytes)) else [elements]
    except TypeError:
        raise bad(f"arrayOfElements: expected a sequence of {count} elements") from None
    if len(seq) < count:
        raise bad(f"arrayOfElements: has {len(seq)} elements, elementCount is {count}")
    desc.attrs[an] = (tn, [_value(an, tn, spec, i, v) for i, v in enumerate(seq[:count])])


def get_attribute(desc, name, attr_type, requested):
    """(elementCount, the first `requested` elements)."""
    check_descriptor(desc)
    an, spec = _attr(desc, name)
    tn = _attr_type(an, spec, attr_type)
    if _index(requested) is None or _index(requested) < 0:
        raise bad(f"requestedElementCount: {requested!r} is not a count")
    if not spec.settable and not desc.finalized:
        raise bad(f"descriptor: PYDNN_ATTR_{an} is known once the {desc.kind} descriptor is finalized",
                  E.PYDNN_STATUS_BAD_PARAM_NOT_FINALIZED)
    hit = desc.attrs.get(an)
    if hit is None:
        getter = GETTERS.get(an)
        if getter is None:
            raise bad(f"attributeName: PYDNN_ATTR_{an} was never set on this {desc.kind} descriptor")
        values = getter(desc)
    else:
        values = hit[1]
    if tn == "CHAR":  # one string: its length, and its first `requested` characters
        return len(values[0]), values[0][: _index(requested)]
    return len(values), list(values[: _index(requested)])


GETTERS = {}  # computed attribute name -> fn(desc) -> [values] (registered by the modules above)


def finalize(desc):
    check_descriptor(desc)
    if desc.finalized:
        raise bad(f"descriptor: the {desc.kind} descriptor is already finalized")
    for an, spec in SCHEMA[desc.kind].items():
        if spec.required and an not in desc.attrs and not _optional_by_context(desc, an):
            raise bad(f"descriptor: {desc.kind} needs PYDNN_ATTR_{an} before finalize")
    fin = FINALIZERS.get(desc.kind)
    desc.state = fin(desc) if fin else None
    desc.finalized = True


def _optional_by_context(desc, an):
    return desc.kind == "EXECUTION_PLAN" and an == "EXECUTION_PLAN_ENGINE_CONFIG" and \
        "EXECUTION_PLAN_JSON_REPRESENTATION" in desc.attrs


# ----------------------------------------------------------------------------- tensors and op descriptors

class TensorInfo:
    """A finalized TENSOR: uid, data type, dims, strides, alignment, virtual, by value."""

    __slots__ = ("uid", "dtype", "dims", "strides", "alignment", "virtual", "by_value")

    def __repr__(self):
        return f"Tensor(uid={self.uid}, dtype={self.dtype}, dims={self.dims}, strides={self.strides}{', virtual' if self.virtual else ''})"


def _finalize_tensor(d):
    t = TensorInfo()
    t.uid, t.dtype = d.one("TENSOR_UNIQUE_ID"), d.one("TENSOR_DATA_TYPE")
    t.dims, t.strides = tuple(d.get("TENSOR_DIMENSIONS")), tuple(d.get("TENSOR_STRIDES"))
    t.alignment = d.one("TENSOR_BYTE_ALIGNMENT")
    t.virtual, t.by_value = d.one("TENSOR_IS_VIRTUAL", False), d.one("TENSOR_IS_BY_VALUE", False)
    if len(t.dims) != len(t.strides):
        raise bad(f"TENSOR: {len(t.dims)} dimensions but {len(t.strides)} strides")
    for i, v in enumerate(t.dims):
        if v <= 0:
            raise bad(f"TENSOR: PYDNN_ATTR_TENSOR_DIMENSIONS[{i}] = {v} must be positive")
    for i, v in enumerate(t.strides):
        if v <= 0:
            raise bad(f"TENSOR: PYDNN_ATTR_TENSOR_STRIDES[{i}] = {v} must be positive")
    if t.alignment <= 0 or t.alignment & (t.alignment - 1):
        raise bad(f"TENSOR: PYDNN_ATTR_TENSOR_BYTE_ALIGNMENT = {t.alignment} must be a positive power of two")
    if d.one("TENSOR_VECTOR_COUNT", 1) != 1:
        raise bad("TENSOR: PYDNN_ATTR_TENSOR_VECTOR_COUNT other than 1 (vectorized layouts) is not supported",
                  E.PYDNN_STATUS_NOT_SUPPORTED)
    if t.by_value and any(v != 1 for v in t.dims):
        raise bad(f"TENSOR: a by-value tensor is one scalar (dims {t.dims})")
    return t


def _finalize_pointwise(d):
    from . import pointwise_ops as pw

    mode = d.one("POINTWISE_MODE")
    if mode in pw.UNSUPPORTED:
        raise bad(f"POINTWISE: mode {pw.UNSUPPORTED[mode]} is not supported by pydnn's engines",
                  E.PYDNN_STATUS_NOT_SUPPORTED)
    prec = d.one("POINTWISE_MATH_PREC")
    if prec not in (E.PYDNN_DATA_FLOAT, E.PYDNN_DATA_HALF, E.PYDNN_DATA_BFLOAT16):
        raise bad(f"POINTWISE: math precision {prec} (pydnn computes pointwise ops in float)",
                  E.PYDNN_STATUS_NOT_SUPPORTED)
    params = dict(lower=d.one("POINTWISE_RELU_LOWER_CLIP"), upper=d.one("POINTWISE_RELU_UPPER_CLIP"),
                  slope=d.one("POINTWISE_RELU_LOWER_CLIP_SLOPE"), elu_alpha=d.one("POINTWISE_ELU_ALPHA"),
                  softplus_beta=d.one("POINTWISE_SOFTPLUS_BETA"), swish_beta=d.one("POINTWISE_SWISH_BETA"))
    params = {k: v for k, v in params.items() if v is not None}
    for k, v in params.items():
        if not math.isfinite(v) and not (k == "upper" and v == math.inf):
            raise bad(f"POINTWISE: parameter {k} = {v} is not finite")
    if params.get("softplus_beta") == 0.0:
        raise bad("POINTWISE: PYDNN_ATTR_POINTWISE_SOFTPLUS_BETA must not be 0")
    return mode, params


def broadcast_ok(src, dst):
    return len(src) == len(dst) and all(s == o or s == 1 for s, o in zip(src, dst))


class OpInfo:
    """A finalized operation: kind ('pointwise', 'matmul', 'reduction'), its input and output tensors (by
    role) and parameters."""

    __slots__ = ("kind", "inputs", "outputs", "params")

    def __init__(self, kind, inputs, outputs, params):
        self.kind, self.inputs, self.outputs, self.params = kind, inputs, outputs, params


def _finalize_op_pointwise(d):
    from . import pointwise_ops as pw

    pwd = d.one("OPERATION_POINTWISE_PW_DESCRIPTOR")
    mode, params = pwd.state
    kind = pw.inputs(mode)
    name = pw.BY_VALUE[mode]
    need = {"x": ["XDESC", "YDESC"], "xb": ["XDESC", "BDESC", "YDESC"], "xbt": ["XDESC", "BDESC", "TDESC", "YDESC"],
            "xdy": ["XDESC", "DYDESC", "DXDESC"]}[kind]
    for n in need:
        if d.one(f"OPERATION_POINTWISE_{n}") is None:
            raise bad(f"OPERATION_POINTWISE: mode {name} needs PYDNN_ATTR_OPERATION_POINTWISE_{n}")
    tens = {n: d.one(f"OPERATION_POINTWISE_{n}").state for n in need}
    out_role = "DXDESC" if kind == "xdy" else "YDESC"
    out = tens[out_role]
    ins = {"x": tens["XDESC"]}
    if kind in ("xb", "xbt"):
        ins["b"] = tens["BDESC"]
    if kind == "xbt":
        ins["t"] = tens["TDESC"]
    if kind == "xdy":
        ins["b"] = tens["DYDESC"]
    for role, t in ins.items():
        if not broadcast_ok(t.dims, out.dims):
            raise bad(f"OPERATION_POINTWISE: input {role} (uid {t.uid}) dims {t.dims} do not broadcast to the "
                      f"output's {out.dims} (same rank, each dim equal or 1)")
    alpha1 = d.one("OPERATION_POINTWISE_ALPHA1", 1.0)
    alpha2 = d.one("OPERATION_POINTWISE_ALPHA2", 1.0)
    return OpInfo("pointwise", ins, {"y": out}, dict(mode=mode, name=name, params=params, alpha1=alpha1,
                                                     alpha2=alpha2))


def _finalize_op_matmul(d):
    a, b, c = (d.one(f"OPERATION_MATMUL_{n}DESC").state for n in "ABC")
    comp = d.one("OPERATION_MATMUL_DESC").one("MATMUL_COMP_TYPE")
    if not (len(a.dims) == len(b.dims) == len(c.dims)) or len(a.dims) < 2:
        raise bad(f"OPERATION_MATMUL: A, B and C need one rank of at least 2 (dims {a.dims}, {b.dims}, {c.dims})")
    m, k = a.dims[-2:]
    if b.dims[-2] != k:
        raise bad(f"OPERATION_MATMUL: B has {b.dims[-2]} rows, A has {k} columns (dims {a.dims} @ {b.dims})")
    if c.dims[-2:] != (m, b.dims[-1]):
        raise bad(f"OPERATION_MATMUL: C dims {c.dims} are not A's rows x B's columns ({m} x {b.dims[-1]})")
    for t, nm in ((a, "A"), (b, "B")):
        if not broadcast_ok(t.dims[:-2], c.dims[:-2]):
            raise bad(f"OPERATION_MATMUL: {nm}'s batch dims {t.dims[:-2]} do not broadcast to C's {c.dims[:-2]}")
    if d.one("OPERATION_MATMUL_IRREGULARLY_STRIDED_BATCH_COUNT") is not None:
        raise bad("OPERATION_MATMUL: irregularly strided batches are not supported", E.PYDNN_STATUS_NOT_SUPPORTED)
    return OpInfo("matmul", {"a": a, "b": b}, {"c": c}, dict(comp_type=comp))


def _finalize_op_reduction(d):
    x = d.one("OPERATION_REDUCTION_XDESC").state
    y = d.one("OPERATION_REDUCTION_YDESC").state
    rd = d.one("OPERATION_REDUCTION_DESC")
    if not broadcast_ok(y.dims, x.dims):
        raise bad(f"OPERATION_REDUCTION: Y dims {y.dims} must equal X's {x.dims} or be 1 where reduced")
    return OpInfo("reduction", {"x": x}, {"y": y}, dict(op=rd.one("REDUCTION_OPERATOR"),
                                                       comp_type=rd.one("REDUCTION_COMP_TYPE")))


def _finalize_conv(d):
    nd = d.one("CONVOLUTION_SPATIAL_DIMS")
    lists = {k: d.get(f"CONVOLUTION_{k}") for k in ("DILATIONS", "FILTER_STRIDES", "PRE_PADDINGS", "POST_PADDINGS")}
    if not 1 <= nd <= 3:
        raise bad(f"CONVOLUTION: PYDNN_ATTR_CONVOLUTION_SPATIAL_DIMS = {nd} (1 to 3)")
    for k, v in lists.items():
        if len(v) != nd:
            raise bad(f"CONVOLUTION: PYDNN_ATTR_CONVOLUTION_{k} has {len(v)} entries, SPATIAL_DIMS is {nd}")
        lo = 0 if "PADDINGS" in k else 1
        if min(v) < lo:
            raise bad(f"CONVOLUTION: PYDNN_ATTR_CONVOLUTION_{k} = {v} (each at least {lo})")
    if lists["PRE_PADDINGS"] != lists["POST_PADDINGS"]:
        raise bad("CONVOLUTION: asymmetric paddings (pre != post) are not supported", E.PYDNN_STATUS_NOT_SUPPORTED)
    return dict(pad=list(lists["PRE_PADDINGS"]), stride=list(lists["FILTER_STRIDES"]), dil=list(lists["DILATIONS"]),
                mode=d.one("CONVOLUTION_CONV_MODE"), comp_type=d.one("CONVOLUTION_COMP_TYPE"))


def _conv_out(x, w, c):
    return [1 + (i + 2 * p - ((f - 1) * dl + 1)) // s
            for i, f, p, s, dl in zip(x[2:], w[2:], c["pad"], c["stride"], c["dil"])]


def _finalize_op_conv(kind, attr, roles):
    def fin(d):
        c = d.one(f"OPERATION_CONVOLUTION_{attr}_CONV_DESC").state
        t = {r: d.one(f"OPERATION_CONVOLUTION_{attr}_{r}").state for r in roles}
        x = t.get("X") or t.get("DX")
        w = t.get("W") or t.get("DW")
        y = t.get("Y") or t.get("DY")
        nd = len(c["pad"])
        for nm, v in (("x", x), ("w", w), ("y", y)):
            if len(v.dims) != nd + 2:
                raise bad(f"OPERATION_CONVOLUTION_{kind}: {nm} has {len(v.dims)} dims, the convolution {nd} spatial + 2")
        if x.dims[1] != w.dims[1]:
            raise bad(f"OPERATION_CONVOLUTION_{kind}: x has {x.dims[1]} channels, w {w.dims[1]} "
                      f"(grouped convolutions are not supported in graphs yet)")
        want = [x.dims[0], w.dims[0]] + _conv_out(x.dims, w.dims, c)
        if list(y.dims) != want:
            raise bad(f"OPERATION_CONVOLUTION_{kind}: y dims {list(y.dims)}, the convolution gives {want}")
        a = d.one(f"OPERATION_CONVOLUTION_{attr}_ALPHA", 1.0)
        b = d.one(f"OPERATION_CONVOLUTION_{attr}_BETA", 0.0)
        if b != 0.0:
            raise bad(f"OPERATION_CONVOLUTION_{kind}: beta {b} (graph outputs are written, not blended)",
                      E.PYDNN_STATUS_NOT_SUPPORTED)
        if kind == "FORWARD":
            return OpInfo("conv_fprop", {"x": x, "w": w}, {"y": y}, dict(c, alpha=a))
        if kind == "BACKWARD_DATA":
            return OpInfo("conv_dgrad", {"w": w, "dy": y}, {"dx": x}, dict(c, alpha=a))
        return OpInfo("conv_wgrad", {"x": x, "dy": y}, {"dw": w}, dict(c, alpha=a))
    return fin


FINALIZERS.update(CONVOLUTION=_finalize_conv,
                  OPERATION_CONVOLUTION_FORWARD=_finalize_op_conv("FORWARD", "FORWARD", ("W", "X", "Y")),
                  OPERATION_CONVOLUTION_BACKWARD_DATA=_finalize_op_conv("BACKWARD_DATA", "BWD_DATA", ("W", "DX", "DY")),
                  OPERATION_CONVOLUTION_BACKWARD_FILTER=_finalize_op_conv("BACKWARD_FILTER", "BWD_FILTER",
                                                                          ("DW", "X", "DY")))
FINALIZERS.update(TENSOR=_finalize_tensor, POINTWISE=_finalize_pointwise, OPERATION_POINTWISE=_finalize_op_pointwise,
                  OPERATION_MATMUL=_finalize_op_matmul, OPERATION_REDUCTION=_finalize_op_reduction)
