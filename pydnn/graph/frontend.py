"""pydnn.graph.Graph: the graph API in the style of cudnn-frontend's Python API, built on the backend API
(every tensor, operation, graph, heuristic query and plan below is a backend descriptor).

    g = Graph(io_data_type=PYDNN_DATA_BFLOAT16, intermediate_data_type=PYDNN_DATA_FLOAT,
              compute_data_type=PYDNN_DATA_FLOAT)
    x = g.tensor(name="x", dim=[1, 512, 1024], stride=[512 * 1024, 1024, 1])
    w = g.tensor(name="w", dim=[1, 1024, 4096], stride=[1024 * 4096, 4096, 1])
    bias = g.tensor(name="bias", dim=[1, 1, 4096], stride=[4096, 4096, 1])
    y = g.gelu(g.add(g.matmul(x, w), bias))
    y.set_output(True)                           # virtual (intermediate) unless an output
    g.validate(); g.build_operation_graph(handle)
    g.create_execution_plans([PYDNN_HEUR_MODE_A]); g.check_support(); g.build_plans()
    ws = g.get_workspace_size()
    g.execute({x: x_buf, w: w_buf, bias: b_buf, y: y_buf}, workspace, handle=handle)
    blob = g.serialize();  g2 = Graph.deserialize(handle, blob)   # runs with no op graph and no compile

Buffers: device pointers (int) or objects with __cuda_array_interface__ / DLPack; keys: the tensors, their
names, or their uids. Errors are PydnnError (BAD_PARAM naming what is wrong, NOT_SUPPORTED with the reason
no engine runs the graph, SERIALIZATION_VERSION_MISMATCH for a blob of another format version).
"""
import json

from .. import enums as E
from ..status import PydnnError
from . import backend as B
from . import pointwise_ops as pw
from .descriptors import bad
from .plans import run as _run
from .. import buffers as _buffers

FORMAT, VERSION = "pydnn.graph", 1
# node kind -> fn(graph, node dict, {uid: tensor descriptor}) -> a finalized operation descriptor (the node
# modules norm_nodes / sdpa_nodes register theirs, and their Graph methods, when imported)
NODE_BUILDERS = {}
ESIZE = {E.PYDNN_DATA_FLOAT: 4, E.PYDNN_DATA_HALF: 2, E.PYDNN_DATA_BFLOAT16: 2, E.PYDNN_DATA_DOUBLE: 8}


def packed(dims):
    st, acc = [], 1
    for d in reversed(dims):
        st.insert(0, acc)
        acc *= d
    return st


class Tensor:
    """A graph tensor: name, uid, dims, strides, data type (None for an operation's output: the graph's
    io_data_type once set_output(True), else its intermediate_data_type); virtual unless set_output(True)
    or a graph input."""

    def __init__(self, graph, name, dim, stride, data_type, virtual, uid):
        self.graph, self.name, self.uid = graph, name, uid
        self.dim = list(dim) if dim is not None else None
        self.stride = list(stride) if stride is not None else None
        self.data_type, self.virtual, self.is_output = data_type, virtual, False
        self.by_value = False

    def set_output(self, flag=True):
        self.is_output = bool(flag)
        self.virtual = not flag
        return self

    def set_dim(self, dim):
        self.dim = list(dim)
        return self

    def set_stride(self, stride):
        self.stride = list(stride)
        return self

    def set_data_type(self, data_type):
        self.data_type = data_type
        return self

    def set_name(self, name):
        self.name = name
        if self.graph is not None:
            self.graph._keys = None  # execute's key map is rebuilt
        return self

    def get_dim(self):
        return list(self.dim)

    def get_stride(self):
        return list(self.stride)

    def get_uid(self):
        return self.uid

    def __repr__(self):
        return f"Tensor({self.name!r}, uid={self.uid}, dim={self.dim}, stride={self.stride}, virtual={self.virtual})"


class Graph:
    def __init__(self, io_data_type=E.PYDNN_DATA_FLOAT, intermediate_data_type=E.PYDNN_DATA_FLOAT,
                 compute_data_type=E.PYDNN_DATA_FLOAT, handle=None, name="graph"):
        self.io, self.inter, self.compute, self.handle, self.name = (io_data_type, intermediate_data_type,
                                                                     compute_data_type, handle, name)
        self.tensors, self.nodes = [], []
        self._uid = 1
        self._opgraph = self._cfgs = self._plan = None
        self._plan_obj = None
        self._keys = None  # (plan, {Tensor / name / uid: uid}) of execute, built on its first call
        self._descs = []

    # ------------------------------------------------------------------ building
    def _new_uid(self):
        while any(t.uid == self._uid for t in self.tensors):
            self._uid += 1
        self._uid += 1
        return self._uid - 1

    def tensor(self, name=None, dim=None, stride=None, data_type=None, uid=None, is_virtual=False,
               is_pass_by_value=False):
        if dim is None:
            raise bad("tensor: dim is required")
        t = Tensor(self, name or f"t{len(self.tensors)}", dim, stride if stride is not None else packed(list(dim)),
                   data_type if data_type is not None else self.io, is_virtual,
                   uid if uid is not None else self._new_uid())
        t.by_value = bool(is_pass_by_value)
        self.tensors.append(t)
        return t

    def tensor_like(self, obj, name=None):
        """A tensor with a torch / cupy / numpy-like object's dims, strides and data type; a torch CPU tensor of
        one element is a pass-by-value scalar (as in cudnn-frontend), int32 a sequence-length tensor."""
        dtype = {"float32": E.PYDNN_DATA_FLOAT, "float16": E.PYDNN_DATA_HALF, "bfloat16": E.PYDNN_DATA_BFLOAT16,
                 "int32": E.PYDNN_DATA_INT32}
        key = str(getattr(obj, "dtype", "")).split(".")[-1]
        if key not in dtype:
            raise bad(f"tensor_like: data type {getattr(obj, 'dtype', None)} (float32, float16, bfloat16, int32)")
        dims = list(obj.shape)
        n = 1
        for v in dims:
            n *= v
        by_value = str(getattr(obj, "device", "")) == "cpu" and n == 1
        return self.tensor(name=name, dim=dims, stride=list(obj.stride()) if callable(
            getattr(obj, "stride", None)) else None, data_type=dtype[key], is_pass_by_value=by_value)

    def _out(self, name, dim):
        t = Tensor(self, name or f"t{len(self.tensors)}", dim, None, None, True, self._new_uid())
        self.tensors.append(t)
        return t

    def _check_in(self, t, what):
        if not isinstance(t, Tensor) or t.graph is not self:
            raise bad(f"{what}: not a tensor of this graph")
        return t

    def pointwise(self, mode, a, b=None, c=None, name=None, alpha1=1.0, alpha2=1.0, **params):
        """Any PYDNN_POINTWISE_* mode: a (x, or the forward input of a *_BWD mode), b (second input, or dy),
        c (BINARY_SELECT's condition); params: lower_clip, upper_clip, lower_clip_slope, elu_alpha,
        softplus_beta, swish_beta."""
        if mode not in pw.BY_VALUE:
            raise bad(f"pointwise: mode {mode!r} is not a supported PYDNN_POINTWISE_* value")
        kind = pw.inputs(mode)
        ins = [self._check_in(a, "a")]
        if kind in ("xb", "xbt", "xdy"):
            ins.append(self._check_in(b, "b"))
        if kind == "xbt":
            ins.append(self._check_in(c, "c"))
        ranks = {len(t.dim) for t in ins}
        if len(ranks) != 1:
            raise bad(f"{pw.BY_VALUE[mode].lower()}: inputs of different ranks ({[t.dim for t in ins]})")
        dim = []
        for ds in zip(*[t.dim for t in ins]):
            big = max(ds)
            if any(d != big and d != 1 for d in ds):
                raise bad(f"{pw.BY_VALUE[mode].lower()}: dims {[t.dim for t in ins]} do not broadcast")
            dim.append(big)
        out = self._out(name, dim)
        keymap = dict(lower_clip="lower", upper_clip="upper", lower_clip_slope="slope", negative_slope="slope",
                      elu_alpha="elu_alpha", softplus_beta="softplus_beta", swish_beta="swish_beta")
        for k in params:
            if k not in keymap:
                raise bad(f"pointwise: unknown parameter {k!r}")
        self.nodes.append(("pointwise", dict(mode=mode, ins=ins, out=out, alpha1=alpha1, alpha2=alpha2,
                                             params={keymap[k]: float(v) for k, v in params.items() if v is not None})))
        return out

    def matmul(self, A, B, compute_data_type=None, name=None):  # noqa: N803 - cudnn-frontend's names
        a, b = self._check_in(A, "A"), self._check_in(B, "B")
        if len(a.dim) != len(b.dim) or len(a.dim) < 2:
            raise bad(f"matmul: A dims {a.dim} and B dims {b.dim} need one rank of at least 2")
        if a.dim[-1] != b.dim[-2]:
            raise bad(f"matmul: A has {a.dim[-1]} columns, B has {b.dim[-2]} rows")
        batch = [max(x, y) for x, y in zip(a.dim[:-2], b.dim[:-2])]
        out = self._out(name, batch + [a.dim[-2], b.dim[-1]])
        self.nodes.append(("matmul", dict(a=a, b=b, out=out, comp=compute_data_type or self.compute)))
        return out

    def _conv(self, kind, a, b, padding, stride, dilation, compute_data_type, name, dim, mode):
        nd = len(a.dim) - 2
        if nd < 1 or len(b.dim) != len(a.dim):
            raise bad(f"{kind}: operands of {len(a.dim)} and {len(b.dim)} dims (N, C and 1 to 3 spatial dims)")
        pad = list(padding) if padding is not None else [0] * nd
        st = list(stride) if stride is not None else [1] * nd
        dil = list(dilation) if dilation is not None else [1] * nd
        if not len(pad) == len(st) == len(dil) == nd:
            raise bad(f"{kind}: padding, stride and dilation need {nd} entries each")
        out = self._out(name, dim)
        self.nodes.append((kind, dict(a=a, b=b, out=out, pad=pad, stride=st, dil=dil, mode=mode,
                                      comp=compute_data_type or self.compute)))
        return out

    def conv_fprop(self, image, weight, padding=None, stride=None, dilation=None, compute_data_type=None, name=None,
                   conv_mode=E.PYDNN_CROSS_CORRELATION):
        """y = conv(x, w): x [N, C, *spatial], w [K, C, *filter]; y's dims are computed."""
        x, w = self._check_in(image, "image"), self._check_in(weight, "weight")
        nd = len(x.dim) - 2
        pad = list(padding) if padding is not None else [0] * nd
        st = list(stride) if stride is not None else [1] * nd
        dil = list(dilation) if dilation is not None else [1] * nd
        if len(w.dim) != len(x.dim) or not len(pad) == len(st) == len(dil) == nd:
            raise bad(f"conv_fprop: image {x.dim}, weight {w.dim}, padding {pad}, stride {st}, dilation {dil} disagree")
        dim = [x.dim[0], w.dim[0]] + [1 + (i + 2 * p - ((f - 1) * d + 1)) // s
                                      for i, f, p, s, d in zip(x.dim[2:], w.dim[2:], pad, st, dil)]
        if min(dim) < 1:
            raise bad(f"conv_fprop: the output would have dims {dim}")
        return self._conv("conv_fprop", x, w, pad, st, dil, compute_data_type, name, dim, conv_mode)

    def conv_dgrad(self, loss, filter, padding=None, stride=None, dilation=None, compute_data_type=None,  # noqa: A002
                   name=None, dim=None, conv_mode=E.PYDNN_CROSS_CORRELATION):
        """dx of y = conv(x, w) from dy (loss) and w; dx's dims: `dim` or set_dim() before building."""
        return self._conv("conv_dgrad", self._check_in(loss, "loss"), self._check_in(filter, "filter"), padding, stride,
                          dilation, compute_data_type, name, dim, conv_mode)

    def conv_wgrad(self, image, loss, padding=None, stride=None, dilation=None, compute_data_type=None, name=None,
                   dim=None, conv_mode=E.PYDNN_CROSS_CORRELATION):
        """dw of y = conv(x, w) from x (image) and dy (loss); dw's dims: `dim` or set_dim() before building."""
        return self._conv("conv_wgrad", self._check_in(image, "image"), self._check_in(loss, "loss"), padding, stride,
                          dilation, compute_data_type, name, dim, conv_mode)

    def reduction(self, input, mode, dim=None, compute_data_type=None, name=None):  # noqa: A002
        x = self._check_in(input, "input")
        out = self._out(name, dim if dim is not None else [1] * len(x.dim))
        self.nodes.append(("reduction", dict(x=x, out=out, mode=mode, comp=compute_data_type or self.compute)))
        return out

    # ------------------------------------------------------------------ validate and build
    def validate(self):
        if not self.nodes:
            raise bad("validate: the graph has no operations")
        produced = set()
        for kind, n in self.nodes:
            for t in n.get("outs") or [n["out"]]:  # a node of several outputs lists them all in "outs"
                if t is not None:
                    produced.add(t.uid)
        for t in self.tensors:
            if t.dim is None:
                raise bad(f"validate: tensor {t.name!r} has no dims (set_dim)")
            if t.uid not in produced and t.virtual:
                raise bad(f"validate: tensor {t.name!r} is virtual but no operation writes it")
            if t.is_output and t.stride is None:
                t.stride = packed(t.dim)
            if t.virtual and t.stride is None:
                t.stride = packed(t.dim)
        uids = [t.uid for t in self.tensors]
        if len(set(uids)) != len(uids):
            raise bad("validate: two tensors share a uid")
        for t in self.tensors:
            if len(t.stride) != len(t.dim):
                raise bad(f"validate: tensor {t.name!r} has {len(t.dim)} dims but {len(t.stride)} strides")
        return self

    def _tensor_desc(self, t):
        d = B.backend_create_descriptor(E.PYDNN_BACKEND_TENSOR_DESCRIPTOR)
        dt = t.data_type  # an operation's output: io_data_type if an output, else intermediate_data_type
        if dt is None:
            dt = self.inter if t.virtual else self.io
        B.backend_set_attribute(d, E.PYDNN_ATTR_TENSOR_DATA_TYPE, E.PYDNN_TYPE_DATA_TYPE, 1, [dt])
        B.backend_set_attribute(d, E.PYDNN_ATTR_TENSOR_DIMENSIONS, E.PYDNN_TYPE_INT64, len(t.dim), t.dim)
        B.backend_set_attribute(d, E.PYDNN_ATTR_TENSOR_STRIDES, E.PYDNN_TYPE_INT64, len(t.stride), t.stride)
        B.backend_set_attribute(d, E.PYDNN_ATTR_TENSOR_UNIQUE_ID, E.PYDNN_TYPE_INT64, 1, [t.uid])
        B.backend_set_attribute(d, E.PYDNN_ATTR_TENSOR_BYTE_ALIGNMENT, E.PYDNN_TYPE_INT64, 1, [16])
        B.backend_set_attribute(d, E.PYDNN_ATTR_TENSOR_IS_VIRTUAL, E.PYDNN_TYPE_BOOLEAN, 1, [t.virtual])
        if getattr(t, "by_value", False):
            B.backend_set_attribute(d, E.PYDNN_ATTR_TENSOR_IS_BY_VALUE, E.PYDNN_TYPE_BOOLEAN, 1, [True])
        B.backend_finalize(d)
        return d

    def build_operation_graph(self, handle=None):
        """The backend OPERATIONGRAPH of this graph (tensors, operations), finalized."""
        if handle is not None:
            self.handle = handle
        if self.handle is None:
            raise bad("build_operation_graph: no handle (pass one here or to Graph())")
        self.validate()
        S = B.backend_set_attribute  # noqa: N806
        DESC, F64 = E.PYDNN_TYPE_BACKEND_DESCRIPTOR, E.PYDNN_TYPE_DOUBLE  # noqa: N806
        td = {t.uid: self._tensor_desc(t) for t in self.tensors}
        ops = []
        for kind, n in self.nodes:
            if kind == "pointwise":
                p = B.backend_create_descriptor(E.PYDNN_BACKEND_POINTWISE_DESCRIPTOR)
                S(p, E.PYDNN_ATTR_POINTWISE_MODE, E.PYDNN_TYPE_POINTWISE_MODE, 1, [n["mode"]])
                S(p, E.PYDNN_ATTR_POINTWISE_MATH_PREC, E.PYDNN_TYPE_DATA_TYPE, 1, [self.compute])
                names = dict(lower="RELU_LOWER_CLIP", upper="RELU_UPPER_CLIP", slope="RELU_LOWER_CLIP_SLOPE",
                             elu_alpha="ELU_ALPHA", softplus_beta="SOFTPLUS_BETA", swish_beta="SWISH_BETA")
                for k, v in n["params"].items():
                    S(p, getattr(E, f"PYDNN_ATTR_POINTWISE_{names[k]}"), F64, 1, [v])
                B.backend_finalize(p)
                o = B.backend_create_descriptor(E.PYDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR)
                S(o, E.PYDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, DESC, 1, [p])
                kindio = pw.inputs(n["mode"])
                roles = {"x": ["XDESC", "YDESC"], "xb": ["XDESC", "BDESC", "YDESC"],
                         "xbt": ["XDESC", "BDESC", "TDESC", "YDESC"], "xdy": ["XDESC", "DYDESC", "DXDESC"]}[kindio]
                for role, t in zip(roles, n["ins"] + [n["out"]]):
                    S(o, getattr(E, f"PYDNN_ATTR_OPERATION_POINTWISE_{role}"), DESC, 1, [td[t.uid]])
                if n["alpha1"] != 1.0:
                    S(o, E.PYDNN_ATTR_OPERATION_POINTWISE_ALPHA1, F64, 1, [n["alpha1"]])
                if n["alpha2"] != 1.0:
                    S(o, E.PYDNN_ATTR_OPERATION_POINTWISE_ALPHA2, F64, 1, [n["alpha2"]])
            elif kind == "matmul":
                m = B.backend_create_descriptor(E.PYDNN_BACKEND_MATMUL_DESCRIPTOR)
                S(m, E.PYDNN_ATTR_MATMUL_COMP_TYPE, E.PYDNN_TYPE_DATA_TYPE, 1, [n["comp"]])
                B.backend_finalize(m)
                o = B.backend_create_descriptor(E.PYDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR)
                S(o, E.PYDNN_ATTR_OPERATION_MATMUL_ADESC, DESC, 1, [td[n["a"].uid]])
                S(o, E.PYDNN_ATTR_OPERATION_MATMUL_BDESC, DESC, 1, [td[n["b"].uid]])
                S(o, E.PYDNN_ATTR_OPERATION_MATMUL_CDESC, DESC, 1, [td[n["out"].uid]])
                S(o, E.PYDNN_ATTR_OPERATION_MATMUL_DESC, DESC, 1, [m])
            elif kind.startswith("conv_"):
                cv = B.backend_create_descriptor(E.PYDNN_BACKEND_CONVOLUTION_DESCRIPTOR)
                nd = len(n["pad"])
                S(cv, E.PYDNN_ATTR_CONVOLUTION_COMP_TYPE, E.PYDNN_TYPE_DATA_TYPE, 1, [n["comp"]])
                S(cv, E.PYDNN_ATTR_CONVOLUTION_CONV_MODE, E.PYDNN_TYPE_CONVOLUTION_MODE, 1, [n["mode"]])
                S(cv, E.PYDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, E.PYDNN_TYPE_INT64, 1, [nd])
                S(cv, E.PYDNN_ATTR_CONVOLUTION_DILATIONS, E.PYDNN_TYPE_INT64, nd, n["dil"])
                S(cv, E.PYDNN_ATTR_CONVOLUTION_FILTER_STRIDES, E.PYDNN_TYPE_INT64, nd, n["stride"])
                S(cv, E.PYDNN_ATTR_CONVOLUTION_PRE_PADDINGS, E.PYDNN_TYPE_INT64, nd, n["pad"])
                S(cv, E.PYDNN_ATTR_CONVOLUTION_POST_PADDINGS, E.PYDNN_TYPE_INT64, nd, n["pad"])
                B.backend_finalize(cv)
                dtype, attr, roles = {
                    "conv_fprop": (E.PYDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, "FORWARD", ("X", "W", "Y")),
                    "conv_dgrad": (E.PYDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR, "BWD_DATA",
                                   ("DY", "W", "DX")),
                    "conv_wgrad": (E.PYDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR, "BWD_FILTER",
                                   ("X", "DY", "DW"))}[kind]
                o = B.backend_create_descriptor(dtype)
                S(o, getattr(E, f"PYDNN_ATTR_OPERATION_CONVOLUTION_{attr}_CONV_DESC"), DESC, 1, [cv])
                for role, t in zip(roles, (n["a"], n["b"], n["out"])):
                    S(o, getattr(E, f"PYDNN_ATTR_OPERATION_CONVOLUTION_{attr}_{role}"), DESC, 1, [td[t.uid]])
            elif kind in NODE_BUILDERS:
                ops.append(NODE_BUILDERS[kind](self, n, td))
                continue
            else:
                r = B.backend_create_descriptor(E.PYDNN_BACKEND_REDUCTION_DESCRIPTOR)
                S(r, E.PYDNN_ATTR_REDUCTION_OPERATOR, E.PYDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, [n["mode"]])
                S(r, E.PYDNN_ATTR_REDUCTION_COMP_TYPE, E.PYDNN_TYPE_DATA_TYPE, 1, [n["comp"]])
                B.backend_finalize(r)
                o = B.backend_create_descriptor(E.PYDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR)
                S(o, E.PYDNN_ATTR_OPERATION_REDUCTION_XDESC, DESC, 1, [td[n["x"].uid]])
                S(o, E.PYDNN_ATTR_OPERATION_REDUCTION_YDESC, DESC, 1, [td[n["out"].uid]])
                S(o, E.PYDNN_ATTR_OPERATION_REDUCTION_DESC, DESC, 1, [r])
            B.backend_finalize(o)
            ops.append(o)
        g = B.backend_create_descriptor(E.PYDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)
        S(g, E.PYDNN_ATTR_OPERATIONGRAPH_HANDLE, E.PYDNN_TYPE_HANDLE, 1, [self.handle])
        S(g, E.PYDNN_ATTR_OPERATIONGRAPH_OPS, DESC, len(ops), ops)
        B.backend_finalize(g)
        self._opgraph = g
        return self

    def create_execution_plans(self, heur_modes=(E.PYDNN_HEUR_MODE_A,)):
        if self._opgraph is None:
            raise bad("create_execution_plans: call build_operation_graph first")
        cfgs, seen = [], set()
        for mode in heur_modes:
            h = B.backend_create_descriptor(E.PYDNN_BACKEND_ENGINEHEUR_DESCRIPTOR)
            B.backend_set_attribute(h, E.PYDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, E.PYDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                    [self._opgraph])
            B.backend_set_attribute(h, E.PYDNN_ATTR_ENGINEHEUR_MODE, E.PYDNN_TYPE_HEUR_MODE, 1, [mode])
            B.backend_finalize(h)
            n, _ = B.backend_get_attribute(h, E.PYDNN_ATTR_ENGINEHEUR_RESULTS, E.PYDNN_TYPE_BACKEND_DESCRIPTOR, 0)
            _, results = B.backend_get_attribute(h, E.PYDNN_ATTR_ENGINEHEUR_RESULTS, E.PYDNN_TYPE_BACKEND_DESCRIPTOR, n)
            for cfg in results:
                if cfg.state not in seen:
                    seen.add(cfg.state)
                    cfgs.append(cfg)
        self._cfgs = cfgs
        return self

    def check_support(self):
        if self._cfgs is None:
            raise bad("check_support: call create_execution_plans first")
        if not self._cfgs:
            from .engines import ENGINES

            g = self._opgraph.state
            reasons = "; ".join(f"{e.name}: {e.support(g)}" for e in ENGINES)
            raise PydnnError(E.PYDNN_STATUS_NOT_SUPPORTED, f"check_support: no engine runs this graph ({reasons})")
        return self

    def engines(self):
        """Engine indices of the candidate plans, best first."""
        return [c.state for c in (self._cfgs or [])]

    def build_plans(self, engine=None):
        """Build the first candidate plan (or the given engine's): kernels compile here (or load from the cache)."""
        self.check_support()
        cands = [c for c in self._cfgs if engine is None or c.state == engine]
        if not cands:
            raise PydnnError(E.PYDNN_STATUS_NOT_SUPPORTED, f"build_plans: engine {engine} is not a candidate")
        errors = []
        for cfg in cands:
            p = B.backend_create_descriptor(E.PYDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)
            B.backend_set_attribute(p, E.PYDNN_ATTR_EXECUTION_PLAN_HANDLE, E.PYDNN_TYPE_HANDLE, 1, [self.handle])
            B.backend_set_attribute(p, E.PYDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, E.PYDNN_TYPE_BACKEND_DESCRIPTOR, 1, [cfg])
            try:
                B.backend_finalize(p)
            except PydnnError as e:
                errors.append(e)
                continue
            self._plan = p
            self._plan_obj = p.state
            return self
        raise errors[0]

    def get_workspace_size(self):
        return self._need_plan("get_workspace_size").workspace_size

    def engine_index(self):
        return self._need_plan("engine_index").engine

    def launches(self):
        """Kernel launches one execute makes (None where a step decides at run time)."""
        return self._need_plan("launches").built.launches

    def _need_plan(self, what):
        if self._plan_obj is None:
            raise bad(f"{what}: call build_plans first", E.PYDNN_STATUS_BAD_PARAM_NOT_FINALIZED)
        return self._plan_obj

    def _uid_of(self, key):
        if isinstance(key, Tensor):
            return key.uid
        if isinstance(key, str):
            for t in self.tensors:
                if t.name == key:
                    return t.uid
            raise bad(f"execute: no tensor named {key!r}")
        if isinstance(key, int) and not isinstance(key, bool):
            return key
        raise bad(f"execute: {key!r} is not a tensor, a name or a uid")

    def execute(self, buffers, workspace=0, handle=None):
        """Run the built plan on {tensor, name or uid: buffer} (ints, torch tensors, anything pydnn.buffers
        reads) with the workspace. Host work per call: a key lookup per buffer, the buffers' resolution and
        the launches (the key map is made once per plan; tests/graph/test_graph_host_cpu.py counts it)."""
        plan = self._plan_obj
        if plan is None:
            plan = self._need_plan("execute")
        keys = self._keys
        if keys is None or keys[0] is not plan:
            keys = self._keys = (plan, self._key_map())
        km = keys[1]
        given = {}
        ints = True
        # torch tensors (buffers.TORCH_TENSOR) of the plan's device tensors are read inline with _torch_ptr's
        # checks against the tensor's span (plan.spans); one that fails a check, and anything else, is left for
        # plans.run's device_ptr (the same errors, naming the uid)
        tt, spans = _buffers.TORCH_TENSOR, plan.spans
        for k, v in buffers.items():
            try:
                u = km[k] if type(k) is not bool else self._uid_of(k)
            except (KeyError, TypeError):
                u = self._uid_of(k)
            if type(v) is int:
                if v <= 0:
                    ints = False
            elif (type(v) is tt and v.is_cuda and (n := spans.get(u)) is not None and v.nbytes >= n
                  and v.is_contiguous() and (p := v.data_ptr())):
                v = p
            else:
                ints = False
            given[u] = v
        if type(workspace) is tt and plan.workspace_size and workspace.is_cuda \
                and workspace.nbytes >= plan.workspace_size and workspace.is_contiguous() and workspace.data_ptr():
            workspace = workspace.data_ptr()
        # every buffer a positive int for exactly the plan's tensors (no pass-by-value ones), an int workspace
        # where one is needed: plans.run would take each pointer as is, so enqueue directly (one Python frame
        # and a lookup per tensor less a call)
        if (ints and given.keys() == plan.io_uids and not _buffers.CHECKED
                and (type(workspace) is int and workspace > 0 if plan.workspace_size else type(workspace) is int)):
            built = plan.built
            step = getattr(built, "single", None)
            if step is not None:  # EnginePlan.execute's work for one step inline
                given["workspace"] = workspace
                step.run(handle if handle is not None else self.handle, given)
            else:
                built.execute(handle if handle is not None else self.handle, given, workspace)
            return
        if plan.by_value:  # pass-by-value tensors: the graph's stored constants, a Python int as its value
            for uid, v in getattr(self, "_consts", {}).items():  # (from C an int is the value's address)
                given.setdefault(uid, v)
            for uid, _dtype, _what in plan.by_value:
                if type(given.get(uid)) is int:
                    given[uid] = float(given[uid])
        _run(handle if handle is not None else self.handle, plan, given, workspace)

    def _key_map(self):
        km = {}
        for t in self.tensors:
            km[t] = t.uid
            km[t.uid] = t.uid
            if isinstance(t.name, str):
                km.setdefault(t.name, t.uid)
        return km

    # ------------------------------------------------------------------ serialization
    def serialize(self):
        plan = self._need_plan("serialize")
        return json.dumps({"format": FORMAT, "version": VERSION, "plan": plan.to_json(),
                           "names": {t.name: t.uid for t in self.tensors if not t.virtual},
                           "consts": {str(u): v for u, v in getattr(self, "_consts", {}).items()}}).encode()

    @classmethod
    def deserialize(cls, handle, blob):
        from .plans import plan_from_json

        try:
            j = json.loads(bytes(blob).decode("utf-8"))
        except (ValueError, TypeError, UnicodeDecodeError) as e:
            raise bad(f"deserialize: corrupt graph blob ({e})") from None
        if not isinstance(j, dict) or j.get("format") != FORMAT:
            raise bad("deserialize: not a serialized pydnn graph")
        if j.get("version") != VERSION:
            raise PydnnError(E.PYDNN_STATUS_SERIALIZATION_VERSION_MISMATCH,
                             f"deserialize: format version {j.get('version')!r}, this pydnn reads version {VERSION}")
        if not isinstance(j.get("plan"), str) or not isinstance(j.get("names"), dict):
            raise bad("deserialize: corrupt graph blob (plan or names missing)")
        plan = plan_from_json(j["plan"], handle)
        g = cls(handle=handle)
        for name, uid in j["names"].items():
            t = plan.graph.tensors.get(uid)
            if t is None:
                raise bad(f"deserialize: corrupt graph blob (tensor {name!r} uid {uid})")
            g.tensors.append(Tensor(g, name, t.dims, t.strides, t.dtype, False, uid))
        consts = j.get("consts", {})
        try:
            g._consts = {int(u): float(v) for u, v in consts.items()}
        except (AttributeError, TypeError, ValueError):
            raise bad("deserialize: corrupt graph blob (constants)") from None
        g._plan_obj = plan
        return g


def set_constant(graph, tensor, value):
    """A pass-by-value tensor whose value the graph keeps (epsilon given as a number): execute passes it
    unless the buffers name the tensor, and serialize stores it."""
    if not hasattr(graph, "_consts"):
        graph._consts = {}
    graph._consts[tensor.uid] = float(value)


def _mk(mode_name, arity):
    mode = getattr(E, "PYDNN_POINTWISE_" + mode_name)
    if arity == 1:
        def f(self, input, name=None, **params):  # noqa: A002
            return self.pointwise(mode, input, name=name, **params)
    elif arity == 2:
        def f(self, a, b, name=None, **params):
            return self.pointwise(mode, a, b, name=name, **params)
    else:
        def f(self, a, b, mask, name=None):
            return self.pointwise(mode, a, b, mask, name=name)
    f.__name__ = mode_name.lower()
    f.__doc__ = f"PYDNN_POINTWISE_{mode_name}"
    return f


for _name, (_kind, _) in pw.MODES.items():
    _method = _name.lower().replace("_fwd", "")
    if _name.endswith("_BWD"):
        _method = _name.lower().replace("_bwd", "_backward")  # relu_backward(input, loss) as cudnn-frontend
    if _method in ("max", "min", "pow", "abs"):
        _method = _method  # keep cudnn-frontend's names
    setattr(Graph, _method, _mk(_name, {"x": 1, "xb": 2, "xdy": 2, "xbt": 3}[_kind]))
