"""Normalization nodes of the graph API: cuDNN 9's OPERATION_NORM_FORWARD / OPERATION_NORM_BACKWARD
descriptors (attributes PYDNN_ATTR_OPERATION_NORM_FWD_* / _BWD_*, modes pydnnBackendNormMode_t, phases
pydnnBackendNormFwdPhase_t), the frontend's layernorm / rmsnorm / batchnorm / batchnorm_inference /
instancenorm and their *_backward (cudnn-frontend's argument names and outputs), the node engine's steps
on pydnn's normalization and batch-norm kernels, and the fusion of layer / RMS norm with a pointwise
epilogue into ONE launch of the normalization kernel (gen_fwd_body in ptx/normalization.cu instantiated
with a functor generated from the pointwise ops).

Shapes (cudnn-frontend's):
  LAYER_NORM, RMS_NORM   x [N, ...]; scale / bias 1 over the leading dims and x's dims over the normalized
                         trailing ones ([1, C, H, W] for x [N, C, H, W]: each sample normalized);
                         mean / inv_variance x's leading dims, 1 over the normalized ones ([N, 1, 1, 1]).
  INSTANCE_NORM          x [N, C, ...]; scale / bias [1, C, 1, ...]; statistics [N, C, 1, ...].
  BATCH_NORM             x [N, C, H, W(, D)]; scale / bias / statistics / running statistics [1, C, 1, 1].
Epsilon and the batch-norm momentum (EXP_AVG_FACTOR) are pass-by-value tensors of one element. In the
TRAINING phase mean (not for RMS) and inv_variance are outputs; BATCH_NORM's INFERENCE phase reads them
(mean, inv_variance) as inputs; LAYER / RMS / INSTANCE inference writes no statistics.
pydnn's kernels read scale, bias and the statistics as packed FLOAT tensors (NOT_SUPPORTED otherwise).
"""
import hashlib

from .. import enums as E
from ..status import PydnnError
from . import backend as B
from . import codegen as cg
from . import descriptors as D
from . import engines as EN
from . import frontend as F
from . import plans as PL
from .descriptors import Attr, OpInfo, bad

MODE_NAMES = {v: k[len("PYDNN_"):] for k, v in E.ENUMS["pydnnBackendNormMode_t"].items()}
LAYER, INSTANCE, BATCH, GROUP, RMS, ADA = (E.PYDNN_LAYER_NORM, E.PYDNN_INSTANCE_NORM, E.PYDNN_BATCH_NORM,
                                          E.PYDNN_GROUP_NORM, E.PYDNN_RMS_NORM, E.PYDNN_ADA_LAYER_NORM)
TRAINING, INFERENCE = E.PYDNN_NORM_FWD_TRAINING, E.PYDNN_NORM_FWD_INFERENCE
FWD, BWD = "OPERATION_NORM_FWD_", "OPERATION_NORM_BWD_"
_BD, _T = "BACKEND_DESCRIPTOR", dict(kinds=("TENSOR",))

FWD_SCHEMA = {
    FWD + "MODE": Attr("NORM_MODE", required=True), FWD + "PHASE": Attr("NORM_FWD_PHASE", required=True),
    FWD + "XDESC": Attr(_BD, required=True, **_T), FWD + "MEAN_DESC": Attr(_BD, **_T),
    FWD + "INV_VARIANCE_DESC": Attr(_BD, **_T), FWD + "SCALE_DESC": Attr(_BD, required=True, **_T),
    FWD + "BIAS_DESC": Attr(_BD, **_T), FWD + "EPSILON_DESC": Attr(_BD, required=True, **_T),
    FWD + "EXP_AVG_FACTOR_DESC": Attr(_BD, **_T), FWD + "INPUT_RUNNING_MEAN_DESC": Attr(_BD, **_T),
    FWD + "INPUT_RUNNING_VAR_DESC": Attr(_BD, **_T), FWD + "OUTPUT_RUNNING_MEAN_DESC": Attr(_BD, **_T),
    FWD + "OUTPUT_RUNNING_VAR_DESC": Attr(_BD, **_T), FWD + "YDESC": Attr(_BD, required=True, **_T),
    FWD + "PEER_STAT_DESCS": Attr(_BD, 0, 64, **_T),
}
BWD_SCHEMA = {
    BWD + "MODE": Attr("NORM_MODE", required=True), BWD + "XDESC": Attr(_BD, required=True, **_T),
    BWD + "MEAN_DESC": Attr(_BD, **_T), BWD + "INV_VARIANCE_DESC": Attr(_BD, **_T),
    BWD + "DYDESC": Attr(_BD, required=True, **_T), BWD + "SCALE_DESC": Attr(_BD, required=True, **_T),
    BWD + "EPSILON_DESC": Attr(_BD, **_T), BWD + "DSCALE_DESC": Attr(_BD, required=True, **_T),
    BWD + "DBIAS_DESC": Attr(_BD, **_T), BWD + "DXDESC": Attr(_BD, required=True, **_T),
    BWD + "PEER_STAT_DESCS": Attr(_BD, 0, 64, **_T),
}


# ----------------------------------------------------------------------------- shapes

def norm_shapes(mode, x_dims, scale_dims, where, attr):
    """(parameter dims, statistics dims, normalized trailing dims k) of a mode for x, checked against the
    scale's dims; BAD_PARAM naming `attr` (the scale attribute) when they do not fit."""
    x, sc, n = tuple(x_dims), tuple(scale_dims), len(x_dims)
    if len(sc) != n:
        raise bad(f"{where}: PYDNN_ATTR_{attr} has {len(sc)} dims, x has {n}")
    if mode in (LAYER, RMS):
        for p in range(n):
            if all(d == 1 for d in sc[:p]) and sc[p:] == x[p:]:
                return sc, x[:p] + (1,) * (n - p), n - p
        raise bad(f"{where}: PYDNN_ATTR_{attr} dims {list(sc)} must be 1 over x's leading dims and equal x's "
                  f"{list(x)} over the normalized trailing dims")
    if n < 2:
        raise bad(f"{where}: x needs N and C dims (dims {list(x)})")
    want = (1, x[1]) + (1,) * (n - 2)
    if sc != want:
        raise bad(f"{where}: PYDNN_ATTR_{attr} dims {list(sc)} must be {list(want)} (one per channel)")
    return want, ((x[0], x[1]) + (1,) * (n - 2)) if mode == INSTANCE else want, n - 2


def _opt(d, name):
    v = d.one(name)
    return v.state if v is not None else None


def _scalar(t, where, attr):
    if any(v != 1 for v in t.dims):
        raise bad(f"{where}: PYDNN_ATTR_{attr} must be one element (dims {list(t.dims)})")
    return t


def _dims(t, want, where, attr):
    if tuple(t.dims) != tuple(want):
        raise bad(f"{where}: PYDNN_ATTR_{attr} dims {list(t.dims)} must be {list(want)}")


def _mode(d, prefix, where):
    mode = d.one(prefix + "MODE")
    if mode in (GROUP, ADA):
        raise bad(f"{where}: norm mode {MODE_NAMES[mode]} is not supported by pydnn's engines",
                  E.PYDNN_STATUS_NOT_SUPPORTED)
    if d.get(prefix + "PEER_STAT_DESCS"):
        raise bad(f"{where}: PYDNN_ATTR_{prefix}PEER_STAT_DESCS (statistics shared across GPUs) is not supported",
                  E.PYDNN_STATUS_NOT_SUPPORTED)
    return mode


def _fin_fwd(d):
    where = "OPERATION_NORM_FORWARD"
    mode = _mode(d, FWD, where)
    phase = d.one(FWD + "PHASE")
    where = f"OPERATION_NORM_FORWARD ({MODE_NAMES[mode]}, {'TRAINING' if phase == TRAINING else 'INFERENCE'})"
    t = {r: _opt(d, FWD + a) for r, a in (
        ("x", "XDESC"), ("y", "YDESC"), ("scale", "SCALE_DESC"), ("bias", "BIAS_DESC"), ("epsilon", "EPSILON_DESC"),
        ("mean", "MEAN_DESC"), ("inv_variance", "INV_VARIANCE_DESC"), ("momentum", "EXP_AVG_FACTOR_DESC"),
        ("in_running_mean", "INPUT_RUNNING_MEAN_DESC"), ("in_running_var", "INPUT_RUNNING_VAR_DESC"),
        ("out_running_mean", "OUTPUT_RUNNING_MEAN_DESC"), ("out_running_var", "OUTPUT_RUNNING_VAR_DESC"))}
    x, y = t["x"], t["y"]
    if tuple(y.dims) != tuple(x.dims):
        raise bad(f"{where}: PYDNN_ATTR_{FWD}YDESC dims {list(y.dims)} must equal XDESC's {list(x.dims)}")
    pdims, sdims, k = norm_shapes(mode, x.dims, t["scale"].dims, where, FWD + "SCALE_DESC")
    if t["bias"] is not None:
        _dims(t["bias"], pdims, where, FWD + "BIAS_DESC")
    _scalar(t["epsilon"], where, FWD + "EPSILON_DESC")
    stats_in = mode == BATCH and phase == INFERENCE
    for r, a in (("mean", "MEAN_DESC"), ("inv_variance", "INV_VARIANCE_DESC")):
        need = (phase == TRAINING or stats_in) and not (r == "mean" and mode == RMS)
        if need and t[r] is None:
            raise bad(f"{where}: needs PYDNN_ATTR_{FWD}{a}")
        if not need and t[r] is not None:
            raise bad(f"{where}: PYDNN_ATTR_{FWD}{a} is not used "
                      f"({'RMS norm has no mean' if mode == RMS else 'inference writes no statistics'})")
        if t[r] is not None:
            _dims(t[r], sdims, where, FWD + a)
    running = ("momentum", "in_running_mean", "in_running_var", "out_running_mean", "out_running_var")
    given = [r for r in running if t[r] is not None]
    if given and (mode != BATCH or phase != TRAINING):
        raise bad(f"{where}: running statistics (PYDNN_ATTR_{FWD}EXP_AVG_FACTOR_DESC, ..._RUNNING_...) belong to "
                  f"batch norm training")
    if given and len(given) != len(running):
        missing = [r for r in running if t[r] is None]
        raise bad(f"{where}: running statistics need all of momentum, input and output running mean / var "
                  f"(missing {', '.join(missing)})")
    if given:
        _scalar(t["momentum"], where, FWD + "EXP_AVG_FACTOR_DESC")
        for r in running[1:]:
            _dims(t[r], pdims, where, FWD + r.upper().replace("IN_", "INPUT_").replace("OUT_", "OUTPUT_") + "_DESC")
    in_roles = ["x", "scale", "bias", "epsilon"] + (["mean", "inv_variance"] if stats_in else []) + \
        (list(running[:3]) if given else [])
    out_roles = ["y"] + (["mean", "inv_variance"] if phase == TRAINING else []) + (list(running[3:]) if given else [])
    ins = {r: t[r] for r in in_roles if t[r] is not None}
    outs = {r: t[r] for r in out_roles if t[r] is not None}
    return OpInfo("norm_fwd", ins, outs, dict(mode=mode, phase=phase, k=k))


def _fin_bwd(d):
    mode = _mode(d, BWD, "OPERATION_NORM_BACKWARD")
    where = f"OPERATION_NORM_BACKWARD ({MODE_NAMES[mode]})"
    t = {r: _opt(d, BWD + a) for r, a in (
        ("x", "XDESC"), ("dy", "DYDESC"), ("dx", "DXDESC"), ("scale", "SCALE_DESC"), ("mean", "MEAN_DESC"),
        ("inv_variance", "INV_VARIANCE_DESC"), ("epsilon", "EPSILON_DESC"), ("dscale", "DSCALE_DESC"),
        ("dbias", "DBIAS_DESC"))}
    x = t["x"]
    for r, a in (("dy", "DYDESC"), ("dx", "DXDESC")):
        if tuple(t[r].dims) != tuple(x.dims):
            raise bad(f"{where}: PYDNN_ATTR_{BWD}{a} dims {list(t[r].dims)} must equal XDESC's {list(x.dims)}")
    pdims, sdims, k = norm_shapes(mode, x.dims, t["scale"].dims, where, BWD + "SCALE_DESC")
    _dims(t["dscale"], pdims, where, BWD + "DSCALE_DESC")
    if t["dbias"] is not None:
        _dims(t["dbias"], pdims, where, BWD + "DBIAS_DESC")
    if t["inv_variance"] is None:
        raise bad(f"{where}: needs PYDNN_ATTR_{BWD}INV_VARIANCE_DESC (the saved statistics)")
    if mode != RMS and t["mean"] is None:
        raise bad(f"{where}: needs PYDNN_ATTR_{BWD}MEAN_DESC (the saved statistics)")
    if mode == RMS and t["mean"] is not None:
        raise bad(f"{where}: PYDNN_ATTR_{BWD}MEAN_DESC is not used (RMS norm has no mean)")
    for r, a in (("mean", "MEAN_DESC"), ("inv_variance", "INV_VARIANCE_DESC")):
        if t[r] is not None:
            _dims(t[r], sdims, where, BWD + a)
    if t["epsilon"] is not None:
        _scalar(t["epsilon"], where, BWD + "EPSILON_DESC")
    ins = {r: t[r] for r in ("x", "dy", "scale", "mean", "inv_variance", "epsilon") if t[r] is not None}
    outs = {r: t[r] for r in ("dx", "dscale", "dbias") if t[r] is not None}
    return OpInfo("norm_bwd", ins, outs, dict(mode=mode, k=k))


D.register_operation("OPERATION_NORM_FORWARD", FWD_SCHEMA, _fin_fwd)
D.register_operation("OPERATION_NORM_BACKWARD", BWD_SCHEMA, _fin_bwd)


def _check_json(op):
    """An operation read from a serialized plan: its roles and parameters (finalize checked the rest)."""
    p = op.params
    if p.get("mode") not in (LAYER, INSTANCE, BATCH, RMS) or type(p.get("k")) is not int:
        raise ValueError("normalization parameters")
    if op.kind == "norm_fwd":
        if p.get("phase") not in (TRAINING, INFERENCE) or not {"x", "scale", "epsilon"} <= set(op.inputs) or \
                "y" not in op.outputs:
            raise ValueError("normalization operands")
    elif not {"x", "dy", "scale", "inv_variance"} <= set(op.inputs) or not {"dx", "dscale"} <= set(op.outputs):
        raise ValueError("normalization backward operands")


PL.CHECKS.update(norm_fwd=_check_json, norm_bwd=_check_json)
EN.BY_VALUE.update(norm_fwd={"epsilon", "momentum"}, norm_bwd={"epsilon"})


# ----------------------------------------------------------------------------- node engine

def _packed(t):
    return all(s == p or d == 1 for s, p, d in zip(t.strides, F.packed(list(t.dims)), t.dims))


KIND_OF = {LAYER: E.PYDNN_NORM_KIND_LAYER, RMS: E.PYDNN_NORM_KIND_RMS, INSTANCE: E.PYDNN_NORM_KIND_INSTANCE}
PARAM_ROLES = ("scale", "bias", "dscale", "dbias", "in_running_mean", "in_running_var", "out_running_mean",
               "out_running_var")
STAT_ROLES = ("mean", "inv_variance")


class NormNode:
    """NODE_KINDS entry of norm_fwd / norm_bwd."""

    def storage(self, g, op, st):
        src = g.tensors[op.inputs["x"]]
        for r in ("y", "dx"):
            u = op.outputs.get(r)
            if u is not None and g.tensors[u].virtual:
                st[u] = st[src.uid]  # pydnn's normalization writes the type it reads

    def support(self, g, op, st):
        mode, tens = op.params["mode"], {**{r: g.tensors[u] for r, u in op.inputs.items()},
                                          **{r: g.tensors[u] for r, u in op.outputs.items()}}
        name = f"{op.kind} ({MODE_NAMES[mode]})"
        data = [r for r in ("x", "y", "dy", "dx") if r in tens]
        if len({st[tens[r].uid] for r in data}) != 1:
            return f"{name}: {', '.join(data)} need one data type (a virtual output is stored in x's)"
        for r, t in tens.items():
            if r in PARAM_ROLES + STAT_ROLES:
                if t.dtype != E.PYDNN_DATA_FLOAT:
                    return f"{name}: {r} (uid {t.uid}) must be FLOAT (pydnn's kernels keep parameters in float32)"
                if r in PARAM_ROLES and not _packed(t):
                    return f"{name}: {r} (uid {t.uid}) must be packed, strides {list(t.strides)}"
            if r in ("epsilon", "momentum") and not t.by_value:
                return f"{name}: {r} (uid {t.uid}) must be a pass-by-value scalar"
        if "mean" in tens and "inv_variance" in tens and tens["mean"].strides != tens["inv_variance"].strides:
            return f"{name}: mean and inv_variance need the same strides"
        if mode == BATCH:
            if len(tens["x"].dims) not in (4, 5):
                return f"{name}: batch norm takes x of 4 or 5 dims, not {len(tens['x'].dims)}"
            if op.kind == "norm_fwd" and op.params["phase"] == TRAINING and "bias" not in tens:
                return f"{name}: batch norm training needs a bias"
            if op.kind == "norm_bwd" and "dbias" not in tens:
                return f"{name}: batch norm backward needs dbias"
            if op.kind == "norm_fwd" and op.params["phase"] == TRAINING:
                for r in STAT_ROLES:
                    if not _packed(tens[r]):
                        return f"{name}: {r} must be packed"
        return None

    def step(self, handle, g, op, st, ws_offset):
        if op.kind == "norm_fwd" and op.params["mode"] == BATCH and op.params["phase"] == INFERENCE:
            return _bn_inference_step(handle, g, op, st)
        if op.params["mode"] == BATCH:
            return BatchNormStep(handle, g, op, st, ws_offset)
        return NormStep(handle, g, op, st, ws_offset)


def _tdesc(t, dtype):
    import pydnn

    d = pydnn.create_tensor_descriptor()
    pydnn.set_tensor_nd_descriptor(d, dtype, len(t.dims), list(t.dims), list(t.strides))
    return d


class NormStep:
    """Layer / RMS / instance norm forward or backward: one public pydnn normalization call
    (norm_forward_training / _inference, norm_backward); the kernel is chosen by pydnn's planner."""

    def __init__(self, handle, g, op, st, ws_offset):
        import pydnn

        self.kind, self.mode, p = op.kind, op.params["mode"], op.params
        self.training = op.kind == "norm_bwd" or p["phase"] == TRAINING
        self.uids = {**op.inputs, **op.outputs}
        tens = {r: g.tensors[u] for r, u in self.uids.items()}
        self.k = p["k"]
        self.nd = pydnn.create_norm_descriptor()
        self.eps = None
        self._set_eps(1e-5)
        data = {r: _tdesc(tens[r], st[tens[r].uid]) for r in ("x", "y", "dy", "dx") if r in tens}
        self.data = data
        self.sb = _tdesc(tens["scale"], E.PYDNN_DATA_FLOAT)
        stat = tens.get("inv_variance")
        self.stats = _tdesc(stat, E.PYDNN_DATA_FLOAT) if stat is not None else None
        if self.stats is None and self.training:  # never: finalize asked for the statistics
            raise PydnnError(E.PYDNN_STATUS_INTERNAL_ERROR, "norm: training without statistics")
        self.ws_size, self.ws_offset = 0, ws_offset
        if self.kind == "norm_bwd":
            self.ws_size = pydnn.get_norm_backward_workspace_size(handle, self.nd, data["x"], data["dy"], data["dx"],
                                                                  self.sb, self.stats)
        self.launches = None  # pydnn's planner decides (one kernel forward; the backward adds a finish)

    def _set_eps(self, eps):
        import pydnn

        if eps != self.eps:
            if not eps > 0:
                raise bad(f"norm: epsilon {eps!r} must be positive")
            pydnn.set_norm_descriptor(self.nd, KIND_OF[self.mode], 1, self.k, eps, None)
            self.eps = eps

    def run(self, handle, ptr):
        import pydnn

        u, d = self.uids, self.data

        def p(r):
            return ptr[u[r]] if r in u else 0
        if "epsilon" in u:
            self._set_eps(float(ptr[u["epsilon"]]))
        if self.kind == "norm_fwd":
            if self.training:
                pydnn.norm_forward_training(handle, self.nd, 1.0, 0.0, d["x"], p("x"), d["y"], p("y"), self.sb,
                                            p("scale"), p("bias"), self.stats, p("mean"), p("inv_variance"))
            else:
                pydnn.norm_forward_inference(handle, self.nd, 1.0, 0.0, d["x"], p("x"), d["y"], p("y"), self.sb,
                                             p("scale"), p("bias"))
        else:
            ws = ptr["workspace"] + self.ws_offset if self.ws_size else 0
            pydnn.norm_backward(handle, self.nd, 1.0, 0.0, 1.0, 0.0, d["x"], p("x"), d["dy"], p("dy"), d["dx"], p("dx"),
                                self.sb, p("scale"), 0, p("dscale"), p("dbias"), self.stats, p("mean"),
                                p("inv_variance"), ws, self.ws_size)


class BatchNormStep:
    """Batch norm training forward (running statistics: the input ones copied to the output ones, then
    updated in place by pydnn's kernel) or backward: pydnn's batch_normalization_* (SPATIAL)."""

    def __init__(self, handle, g, op, st, ws_offset):
        self.kind = op.kind
        self.uids = {**op.inputs, **op.outputs}
        tens = {r: g.tensors[u] for r, u in self.uids.items()}
        self.data = {r: _tdesc(tens[r], st[tens[r].uid]) for r in ("x", "y", "dy", "dx") if r in tens}
        self.bn = _tdesc(tens["scale"], E.PYDNN_DATA_FLOAT)
        self.running = "momentum" in self.uids
        self.pbytes = 4 * tens["scale"].dims[1]
        self.ws_size, self.launches = 0, None

    def run(self, handle, ptr):
        import pydnn
        from .._cuda import driver

        u, d = self.uids, self.data

        def p(r):
            return ptr[u[r]] if r in u else 0
        eps = float(ptr[u["epsilon"]]) if "epsilon" in u else 1e-5
        if self.kind == "norm_fwd":
            factor, rm, rv = 0.0, 0, 0
            if self.running:
                factor = float(ptr[u["momentum"]])
                rm, rv = p("out_running_mean"), p("out_running_var")
                for src, dst in ((p("in_running_mean"), rm), (p("in_running_var"), rv)):
                    if src != dst:
                        driver.memcpy_dtod_async(dst, src, self.pbytes, handle.cu_stream)
            pydnn.batch_normalization_forward_training(
                handle, E.PYDNN_BATCHNORM_SPATIAL, 1.0, 0.0, d["x"], p("x"), d["y"], p("y"), self.bn, p("scale"),
                p("bias"), factor, rm or None, rv or None, eps, p("mean"), p("inv_variance"))
        else:
            pydnn.batch_normalization_backward(
                handle, E.PYDNN_BATCHNORM_SPATIAL, 1.0, 0.0, 1.0, 0.0, d["x"], p("x"), d["dy"], p("dy"), d["dx"],
                p("dx"), self.bn, p("scale"), p("dscale"), p("dbias"), eps, p("mean"), p("inv_variance"))


def _bn_inference_program(roles, dtypes):
    """y = (x - mean) * inv_variance * scale (+ bias) as a generated pointwise program over the operands
    `roles` (inputs in order, then y)."""
    idx = {r: i for i, r in enumerate(roles)}
    nodes = [cg.PwNode(E.PYDNN_POINTWISE_SUB, x=("op", idx["x"]), b=("op", idx["mean"])),
             cg.PwNode(E.PYDNN_POINTWISE_MUL, x=("v", 0), b=("op", idx["inv_variance"])),
             cg.PwNode(E.PYDNN_POINTWISE_MUL, x=("v", 1), b=("op", idx["scale"]))]
    if "bias" in idx:
        nodes.append(cg.PwNode(E.PYDNN_POINTWISE_ADD, x=("v", 2), b=("op", idx["bias"])))
    operands = [(EN.TAGS[dt], "out" if r == "y" else "in") for r, dt in zip(roles, dtypes)]
    return cg.PwProgram(operands, nodes, [(len(nodes) - 1, idx["y"])])


def _bn_inference_step(handle, g, op, st):
    """Batch norm inference from the given mean and inv_variance: one generated pointwise kernel."""
    roles = [r for r in ("x", "mean", "inv_variance", "scale", "bias") if r in op.inputs] + ["y"]
    uids = [op.inputs[r] if r != "y" else op.outputs["y"] for r in roles]
    y = g.tensors[op.outputs["y"]]
    prog = _bn_inference_program(roles, [st[u] for u in uids])
    step = EN.PwStep(handle, prog, list(y.dims), [EN._bcast_strides(g.tensors[u], y.dims) for u in uids], uids)
    step.ws_size = 0
    return step


EN.NODE_KINDS.update(norm_fwd=NormNode(), norm_bwd=NormNode())


# ----------------------------------------------------------------------------- fusion: norm + epilogue

def _flat_stride(dims, strides):
    """The one stride that walks dims (row-major, flattened) in an operand with these (broadcast) strides,
    or None when the operand does not walk them as one run (size-1 dims do not count)."""
    live = [(d, s) for d, s in zip(dims, strides) if d != 1]
    if not live:
        return 0
    for (d0, s0), (d1, s1) in zip(live, live[1:]):
        if s0 != s1 * d1:
            return None
    return live[-1][1]


class NormFuser:
    """FUSERS entry: one LAYER / RMS norm forward whose (virtual) y feeds pointwise ops, the final value
    written through the normalization kernel's own store: ONE launch of gen_fwd_body with the generated
    epilogue. x and the final output packed (row-major) in one data type; every epilogue operand walks the
    rows and the normalized elements with one stride each (a per-feature vector, a per-row value, a full
    tensor, a scalar)."""

    def analyze(self, g):
        norms = [op for op in g.ops if op.kind == "norm_fwd"]
        if len(norms) != 1 or any(op.kind not in ("norm_fwd", "pointwise") for op in g.ops):
            return None
        nrm = norms[0]
        if nrm.params["mode"] not in (LAYER, RMS):
            return "only layer and RMS norm fuse with a pointwise epilogue"
        pws = [op for op in g.order if op.kind == "pointwise"]
        if not pws:
            return "a normalization without an epilogue runs on the node engine (its planner's fast kernels)"
        x, y = g.tensors[nrm.inputs["x"]], g.tensors[nrm.outputs["y"]]
        for r in ("scale", "bias", "mean", "inv_variance"):
            u = nrm.inputs.get(r, nrm.outputs.get(r))
            if u is not None:
                t = g.tensors[u]
                if t.dtype != E.PYDNN_DATA_FLOAT or (r in ("scale", "bias") and not _packed(t)):
                    return f"norm {r} (uid {u}) must be a packed FLOAT tensor"
        if not g.tensors[nrm.inputs["epsilon"]].by_value:
            return "the epsilon must be a pass-by-value scalar"
        if nrm.params["phase"] == TRAINING and "mean" in nrm.outputs and \
                g.tensors[nrm.outputs["mean"]].strides != g.tensors[nrm.outputs["inv_variance"]].strides:
            return "mean and inv_variance need the same strides"
        if x.dtype not in EN.TAGS or not _packed(x):
            return "x must be packed (row-major) FLOAT, HALF or BFLOAT16"
        shape = tuple(y.dims)
        produced = {y.uid: None}
        for j, op in enumerate(pws):
            out = next(iter(op.outputs.values()))
            if tuple(g.tensors[out].dims) != shape:
                return f"pointwise output uid {out} dims {g.tensors[out].dims} differ from the norm's {list(shape)}"
            produced[out] = j
        outs = [u for u in g.outputs if u in produced]
        cands = [u for u in outs if g.tensors[u].dtype == x.dtype and _packed(g.tensors[u]) and produced[u] is not None]
        if not cands:
            return "no packed epilogue output of x's data type for the normalization kernel's store"
        final = max(cands, key=lambda u: produced[u])
        extra_out = [u for u in outs if u != final]
        ins, seen = [], set()
        stats = {u for r, u in nrm.outputs.items() if r != "y"}
        for op in pws:
            for u in op.inputs.values():
                if u in stats:
                    return f"the epilogue reads the norm's statistics (uid {u}), which the same kernel writes"
                if u not in produced and u not in seen:
                    seen.add(u)
                    ins.append(u)
        eops = ins + extra_out
        if len(eops) > cg.MAX_OPERANDS:
            return f"{len(eops)} epilogue tensors (at most {cg.MAX_OPERANDS})"
        k = nrm.params["k"]
        lead, inner = shape[:len(shape) - k], shape[len(shape) - k:]
        strides = []
        for u in eops:
            t = g.tensors[u]
            if t.dtype not in EN.TAGS or t.by_value or t.virtual:
                return f"epilogue tensor uid {u}: a FLOAT, HALF or BFLOAT16 graph tensor in device memory"
            if len(t.dims) != len(shape) or any(d != s and d != 1 for d, s in zip(t.dims, shape)):
                return f"epilogue tensor uid {u} dims {list(t.dims)} do not broadcast to {list(shape)}"
            bs = EN._bcast_strides(t, shape)
            rs, cs = _flat_stride(lead, bs[:len(lead)]), _flat_stride(inner, bs[len(lead):])
            if rs is None or cs is None:
                return (f"epilogue tensor uid {u} (strides {list(t.strides)}) does not walk rows and features as one "
                        f"run each")
            strides.append([rs, cs])

        def ref(u):
            if u == y.uid:
                return ("acc", 0)
            if produced.get(u) is not None:
                return ("v", produced[u])
            return ("op", eops.index(u))

        nodes = [EN._pw_node(op, ref) for op in pws]
        stores = [(-1 if produced[u] is None else produced[u], eops.index(u)) for u in extra_out]
        operands = [(EN.TAGS[g.tensors[u].dtype], "in") for u in ins] + \
                   [(EN.TAGS[g.tensors[u].dtype], "out") for u in extra_out]
        return dict(norm=nrm, x=x, y=y, final=g.tensors[final], eops=eops, strides=strides,
                    prog=cg.PwProgram(operands, nodes, stores), final_ref=ref(final))

    def build(self, handle, g, an):
        step = FusedNormStep(handle, g, an)
        return EN.EnginePlan([step], {}, 0)


# fwd_rows blocks of the fused kernels: at most 512 threads (install-time fwd_rows: 1024), so that the
# epilogue's operand loads get 128 registers (at 64, LN + scale + bias + GELU in bf16 spilled 56 bytes)
ROWS_MAX_BLOCK = 512


def col_kinds(strides):
    """Per epilogue operand, how it walks a row's elements (baked into the fwd_rows kernel's vector form):
    0 one value for the row (feature stride 0), 1 contiguous (stride 1: 16-byte vector loads where aligned),
    2 any other stride."""
    return tuple(0 if cs == 0 else 1 if cs == 1 else 2 for _, cs in strides)


_VEC_HELPERS = """
// A run of V elements c0 .. c0 + V - 1 of an epilogue operand's row as floats: K 0 one value for the row,
// 1 contiguous (16-byte loads when the run starts 16-byte aligned and is whole 16-byte words), 2 strided.
template <class T, int V, int K>
__device__ __forceinline__ void epi_run(const void* base, long long row, long long c0, long long cs, float (&out)[V]) {
  const T* p = static_cast<const T*>(base) + row;
  if constexpr (K == 0) {
    const float v = load<float>(p[0]);
#pragma unroll
    for (int j = 0; j < V; ++j) out[j] = v;
  } else if constexpr (K == 1) {
    const T* q = p + c0;
    constexpr int CH = 16 / (int)sizeof(T);  // elements of a 16-byte word
    if constexpr (V % CH == 0) {
      if ((reinterpret_cast<unsigned long long>(q) & 15) == 0) {
#pragma unroll
        for (int k = 0; k < V / CH; ++k) {
          pydnn::norm::Frag<T, CH> f;
          f.load(q + k * CH);
          f.get(out + k * CH);
        }
        return;
      }
    }
#pragma unroll
    for (int j = 0; j < V; ++j) out[j] = load<float>(q[j]);
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) out[j] = load<float>(p[(c0 + j) * cs]);
  }
}
"""


def epilogue_source(prog, final, tag, rows=None, kinds=None):
    """(name, CUDA C, {variant: kernel expression}) of the normalization kernels (ptx/normalization.cu) with
    the pointwise program as their epilogue: ("acc", 0) is the normalized (scaled, shifted) value of
    element c of row s; ("op", k) operand k of the GraphPwParams e, read at s * e.stride[k][0] + c *
    e.stride[k][1]; prog.stores write further outputs there (j == -1: the normalized value itself);
    `final` goes to y through the kernel's own store. Variants: "gen" (gen_fwd_body: any layout) always;
    with rows = (items, R, one, vecs) also "rows<vec>" (fwd_rows_body, contiguous rows, 16-byte vectors of vec
    elements) for each vec."""
    ops = prog.operands
    lines = ["    const float acc_in = acc;"]
    for k, (otag, role) in enumerate(ops):
        if role == "in":
            lines.append(f"    const float in{k} = load<float>(static_cast<const {cg.CTYPE[otag]}*>(e.ptr[{k}])"
                         f"[s * e.stride[{k}][0] + c * e.stride[{k}][1]]);")
    for name, expr in cg.expressions(prog, tag):
        lines.append(f"    const float {name} = {expr};")
    for j, k in prog.stores:
        ct = cg.CTYPE[ops[k][0]]
        lines.append(f"    static_cast<{ct}*>(e.ptr[{k}])[s * e.stride[{k}][0] + c * e.stride[{k}][1]] = "
                     f"store<{ct}>({'acc_in' if j == -1 else f'v{j}'});")
    kind, i = final
    result = 'acc_in' if kind == 'acc' else f'v{i}'
    lines.append(f"    return {result};")
    body = "\n".join(lines)
    # the run form (fwd_rows): operand runs loaded first, then the expressions per element
    kinds = tuple(kinds) if kinds is not None else (2,) * len(ops)
    run = []
    for k, (otag, role) in enumerate(ops):
        if role == "in":
            run.append(f"    float in{k}_[V];")
            run.append(f"    epi_run<{cg.CTYPE[otag]}, V, {kinds[k]}>(e.ptr[{k}], s * e.stride[{k}][0], c0, "
                       f"e.stride[{k}][1], in{k}_);")
    run.append("#pragma unroll")
    run.append("    for (int j = 0; j < V; ++j) {")
    if prog.stores:
        run.append("      const long long c = c0 + j;")
    run.append("      const float acc_in = a[j];")
    for k, (otag, role) in enumerate(ops):
        if role == "in":
            run.append(f"      const float in{k} = in{k}_[j];")
    for name, expr in cg.expressions(prog, tag):
        run.append(f"      const float {name} = {expr};")
    for j, k in prog.stores:
        ct = cg.CTYPE[ops[k][0]]
        run.append(f"      static_cast<{ct}*>(e.ptr[{k}])[s * e.stride[{k}][0] + c * e.stride[{k}][1]] = "
                   f"store<{ct}>({'acc_in' if j == -1 else f'v{j}'});")
    run.append(f"      a[j] = {result};")
    run.append("    }")
    run_body = "\n".join(run)
    digest = hashlib.sha256(repr((body, run_body, tag, prog.key(), final, rows)).encode()).hexdigest()[:16]
    name = f"norm_{digest}"
    t = cg.CTYPE[tag]
    kernels = [("gen", f"__launch_bounds__(256) {name}_gen", f"pydnn::norm::gen_fwd_body<{t}>(p, Epi_{name}{{e}});")]
    if rows is not None:
        items, r, one, vecs = rows
        for v in vecs:
            kernels.append((f"rows{v}", f"__launch_bounds__({ROWS_MAX_BLOCK // r}) {name}_rows{v}",
                            f"pydnn::norm::fwd_rows_body<{t}, {v}, {items}, {r}, {'true' if one else 'false'}>"
                            f"(p, Epi_{name}{{e}});"))
    text = f"""// Generated by pydnn/graph/norm_nodes.py: layer / RMS norm (ptx/normalization.cu's fwd_rows_body and
// gen_fwd_body) with a fused pointwise epilogue.
#include "normalization.cu"
#include "graph_pointwise.cuh"

namespace pydnn {{
namespace graph {{
{_VEC_HELPERS}
struct Epi_{name} {{
  const GraphPwParams& e;
  __device__ __forceinline__ float operator()(float acc, long long s, long long c) const {{
{body}
  }}
  template <int V>
  __device__ __forceinline__ void run(float (&a)[V], long long s, long long c0) const {{
{run_body}
  }}
}};
"""
    for _, head, call in kernels:
        text += f"""
__global__ void {head}(const NormParams p, const GraphPwParams e) {{
  {call}
}}
"""
    text += """
}  // namespace graph
}  // namespace pydnn
"""
    return name, text, {v: f"pydnn::graph::{name}_{v}" for v, _, _ in kernels}


def epilogue_unit(prog, final, tag, rows=None, kinds=None):
    """(KernelUnit, {variant: expression}) of the fused norm kernels, registered with the loader and the
    cache as the generated pointwise and matmul units are (compiled by NVRTC on a cache miss, cached by
    content)."""
    from .._build import cache, loader
    from .._build.manifest import KernelUnit

    name, text, exprs = epilogue_source(prog, final, tag, rows, kinds)
    src = f"graph/{name}.cu"
    cache.register_generated(src, text)
    unit = KernelUnit(f"graph.{name}", src, tuple(exprs.values()))
    loader.register_units([unit])
    return unit, exprs


class FusedNormStep:
    """ONE launch: the normalization kernel with the graph's pointwise ops as its epilogue. Contiguous
    rows take fwd_rows (G threads per row, 16-byte vectors, statistics from registers) as pydnn's planner
    would for the plain norm, when x and y are 16-byte aligned; other layouts, unaligned pointers and rows
    too long for it take gen_fwd (one block per row, two passes over memory)."""

    def __init__(self, handle, g, an):
        import ctypes

        import pydnn
        from .._cuda import driver
        from ..ops import normalization as N
        from ..ops._elementwise import vec_width

        nrm, x, final = an["norm"], an["x"], an["final"]
        tag = EN.TAGS[x.dtype]
        self.nd = pydnn.create_norm_descriptor()
        kind = KIND_OF[nrm.params["mode"]]
        pydnn.set_norm_descriptor(self.nd, kind, 1, nrm.params["k"], 1e-5, None)
        nd = N._set(self.nd)
        xd, yd = _tdesc(x, x.dtype), _tdesc(final, final.dtype)
        inv = nrm.outputs.get("inv_variance")
        sd = _tdesc(g.tensors[inv], E.PYDNN_DATA_FLOAT) if inv is not None else None
        geo = N._geometry(nd, xd, yd, None, sd)
        sets, els, n_sets, length, _ = geo
        vec = vec_width(tag, tag)
        launches = {}  # variant -> the planner's launch record (params, grid, block)
        if vec > 1 and N._vector_ok(sets, els, length, vec):  # (fwd_rows takes 16-byte vectors only)
            alt = N._rows_alt(handle, nd, tag, geo, vec, fit=False)  # (the unit below has ROWS_PICK's items)
            if alt is not None and alt[0].block[0] * N.ROWS_PICK[tag][1] <= ROWS_MAX_BLOCK:
                launches[f"rows{vec}"] = alt[0]
        # gen serves what fwd_rows does not take (unaligned pointers, other layouts, long rows)
        p = N._base_params(nd, *geo, False)
        launches["gen"] = N._new_launch(None, p, (max(1, min(n_sets, N.MAX_GRID)), 1, 1), (N.GEN_THREADS, 1, 1))
        items, r, one = N.ROWS_PICK[tag]
        vecs = tuple(int(k[4:]) for k in launches if k.startswith("rows"))
        self.unit, exprs = epilogue_unit(an["prog"], an["final_ref"], tag, (items, r, one, vecs) if vecs else None,
                                         col_kinds(an["strides"]))
        EN._compile(handle, self.unit)
        self.e = cg.params([1, 1], an["strides"], [0] * len(an["eops"]))
        self.alts = []  # (needs 16-byte aligned x / y, expr, launch record, kernel args), vector form first
        for variant, lc in launches.items():
            p = lc.params
            p.alpha, p.beta = 1.0, 0.0
            p.flags |= N.FLAG_STATS if inv is not None else 0
            arr = (ctypes.c_void_p * 2)(ctypes.addressof(p), ctypes.addressof(self.e))
            self.alts.append((variant != "gen", exprs[variant], lc, (arr, ctypes.addressof(arr), p, self.e)))
        self.kernels = list(launches)
        self.uids = dict(x=x.uid, y=final.uid, scale=nrm.inputs["scale"], bias=nrm.inputs.get("bias"),
                         eps=nrm.inputs["epsilon"], mean=nrm.outputs.get("mean"), inv=inv)
        self.eops = an["eops"]
        self.launches, self.ws_size, self._driver = 1, 0, driver

    def run(self, handle, ptr):
        u = self.uids
        eps = float(ptr[u["eps"]])
        if not eps > 0:
            raise bad(f"norm: epsilon {eps!r} must be positive")
        x, y = ptr[u["x"]], ptr[u["y"]]
        alts = self.alts
        vec_ok = (x | y) % 16 == 0
        aligned, expr, lc, args = next((a for a in alts if vec_ok or not a[0]), alts[-1])
        p = lc.params
        p.eps, p.x, p.out, p.scale = eps, x, y, ptr[u["scale"]]
        p.bias = ptr[u["bias"]] if u["bias"] is not None else None
        p.mean = ptr[u["mean"]] if u["mean"] is not None else None
        p.invstd = ptr[u["inv"]] if u["inv"] is not None else None
        for k, uid in enumerate(self.eops):
            self.e.ptr[k] = ptr[uid]
        f = handle.function(self.unit.name, expr)
        self._driver.launch_args(f, lc.grid, lc.block, lc.smem, handle.cu_stream, args)


EN.FUSERS.append(NormFuser())


# ----------------------------------------------------------------------------- frontend

def _eps_tensor(g, v, what):
    """A by-value scalar tensor for epsilon / momentum given as a tensor or a number (then its value is
    kept by the graph and passed at execute)."""
    if isinstance(v, F.Tensor):
        g._check_in(v, what)
        return v
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise bad(f"{what}: expected a pass-by-value tensor or a number, got {type(v).__name__}")
    t = g.tensor(name=f"{what}_{len(g.tensors)}", dim=[1], data_type=E.PYDNN_DATA_FLOAT, is_pass_by_value=True)
    F.set_constant(g, t, float(v))
    return t


def _stat(g, name, dims):
    return g._out(name, list(dims)).set_data_type(E.PYDNN_DATA_FLOAT)


def _fwd(g, mode, phase, input, scale, bias, epsilon, name, extra=None):  # noqa: A002
    x = g._check_in(input, "input")
    sc = g._check_in(scale, "scale")
    b = g._check_in(bias, "bias") if bias is not None else None
    if phase not in (TRAINING, INFERENCE):
        raise bad(f"norm_forward_phase: {phase!r} is not a pydnnBackendNormFwdPhase_t value")
    pdims, sdims, k = norm_shapes(mode, x.dim, sc.dim, f"{MODE_NAMES[mode].lower()}", "scale")
    if b is not None and list(b.dim) != list(pdims):
        raise bad(f"{MODE_NAMES[mode].lower()}: bias dims {b.dim} must be {list(pdims)}")
    eps = _eps_tensor(g, epsilon, "epsilon")
    nm = name or MODE_NAMES[mode].lower()
    y = g._out(f"{nm}::Y", x.dim)
    ins = dict(x=x, scale=sc, bias=b, epsilon=eps)
    outs = dict(y=y)
    stats_in = mode == BATCH and phase == INFERENCE
    if phase == TRAINING:
        if mode != RMS:
            outs["mean"] = _stat(g, f"{nm}::MEAN", sdims)
        outs["inv_variance"] = _stat(g, f"{nm}::INV_VARIANCE", sdims)
    if extra:
        for r, t in extra.items():
            if r.startswith("out_"):
                outs[r] = t
            else:
                ins[r] = t
    g.nodes.append(("norm_fwd", dict(mode=mode, phase=phase, ins=ins, outs_map=outs, out=y,
                                     outs=list(outs.values()), stats_in=stats_in)))
    return outs


def layernorm(self, input, scale, bias, epsilon, norm_forward_phase=TRAINING, compute_data_type=None,  # noqa: A002
              name=None, zero_centered_gamma=False):
    """cudnn-frontend's layernorm: [Y, mean, inv_variance] (mean, inv_variance None in INFERENCE)."""
    if zero_centered_gamma:
        raise bad("layernorm: zero_centered_gamma is not supported", E.PYDNN_STATUS_NOT_SUPPORTED)
    o = _fwd(self, LAYER, norm_forward_phase, input, scale, bias, epsilon, name)
    return [o["y"], o.get("mean"), o.get("inv_variance")]


def rmsnorm(self, input, scale, epsilon, bias=None, norm_forward_phase=TRAINING, compute_data_type=None,  # noqa: A002
            name=None, zero_centered_gamma=False):
    """cudnn-frontend's rmsnorm: [Y, inv_variance] (inv_variance None in INFERENCE); bias optional."""
    if zero_centered_gamma:
        raise bad("rmsnorm: zero_centered_gamma is not supported", E.PYDNN_STATUS_NOT_SUPPORTED)
    o = _fwd(self, RMS, norm_forward_phase, input, scale, bias, epsilon, name)
    return [o["y"], o.get("inv_variance")]


def instancenorm(self, input, scale, bias, epsilon, norm_forward_phase=TRAINING, compute_data_type=None,  # noqa: A002
                 name=None):
    """cudnn-frontend's instancenorm: [Y, mean, inv_variance] (mean, inv_variance None in INFERENCE)."""
    o = _fwd(self, INSTANCE, norm_forward_phase, input, scale, bias, epsilon, name)
    return [o["y"], o.get("mean"), o.get("inv_variance")]


def batchnorm(self, input, scale, bias, epsilon, in_running_mean=None, in_running_var=None,  # noqa: A002
              momentum=None, peer_stats=(), compute_data_type=None, name=None):
    """cudnn-frontend's batchnorm (training): [Y, mean, inv_variance, next_running_mean, next_running_var]
    (the running ones None without in_running_mean / in_running_var / momentum)."""
    if peer_stats:
        raise bad("batchnorm: peer_stats (statistics shared across GPUs) are not supported",
                  E.PYDNN_STATUS_NOT_SUPPORTED)
    given = [v is not None for v in (in_running_mean, in_running_var, momentum)]
    extra = None
    nm = name or "batch_norm"
    if any(given):
        if not all(given):
            raise bad("batchnorm: in_running_mean, in_running_var and momentum go together")
        rm, rv = self._check_in(in_running_mean, "in_running_mean"), self._check_in(in_running_var, "in_running_var")
        extra = dict(in_running_mean=rm, in_running_var=rv, momentum=_eps_tensor(self, momentum, "momentum"),
                     out_running_mean=_stat(self, f"{nm}::NEXT_RUNNING_MEAN", rm.dim),
                     out_running_var=_stat(self, f"{nm}::NEXT_RUNNING_VAR", rv.dim))
    o = _fwd(self, BATCH, TRAINING, input, scale, bias, epsilon, nm, extra)
    return [o["y"], o["mean"], o["inv_variance"], o.get("out_running_mean"), o.get("out_running_var")]


def batchnorm_inference(self, input, mean, inv_variance, scale, bias, compute_data_type=None, name=None):  # noqa: A002
    """cudnn-frontend's batchnorm_inference: Y from the given mean and inv_variance."""
    x = self._check_in(input, "input")
    extra = dict(mean=self._check_in(mean, "mean"), inv_variance=self._check_in(inv_variance, "inv_variance"))
    eps = _eps_tensor(self, 0.0, "epsilon")  # BATCH_NORM inference: epsilon is in inv_variance already
    o = _fwd(self, BATCH, INFERENCE, x, scale, bias, eps, name or "batchnorm_inference", extra)
    return o["y"]


def _bwd(g, mode, grad, input, scale, mean, inv_variance, has_dbias, name, epsilon=None):  # noqa: A002
    dy, x = g._check_in(grad, "grad"), g._check_in(input, "input")
    sc = g._check_in(scale, "scale")
    pdims, sdims, k = norm_shapes(mode, x.dim, sc.dim, f"{MODE_NAMES[mode].lower()}_backward", "scale")
    nm = name or f"{MODE_NAMES[mode].lower()}_backward"
    ins = dict(x=x, dy=dy, scale=sc, inv_variance=g._check_in(inv_variance, "inv_variance"))
    if mode != RMS:
        ins["mean"] = g._check_in(mean, "mean")
    if epsilon is not None:
        ins["epsilon"] = _eps_tensor(g, epsilon, "epsilon")
    dx = g._out(f"{nm}::DX", x.dim)
    outs = dict(dx=dx, dscale=_stat(g, f"{nm}::DSCALE", pdims))
    if has_dbias:
        outs["dbias"] = _stat(g, f"{nm}::DBIAS", pdims)
    g.nodes.append(("norm_bwd", dict(mode=mode, ins=ins, outs_map=outs, out=dx, outs=list(outs.values()))))
    return [dx, outs["dscale"], outs.get("dbias")]


def layernorm_backward(self, grad, input, scale, mean, inv_variance, compute_data_type=None, name=None):  # noqa: A002
    """cudnn-frontend's layernorm_backward: [DX, dscale, dbias]."""
    return _bwd(self, LAYER, grad, input, scale, mean, inv_variance, True, name)


def rmsnorm_backward(self, grad, input, scale, inv_variance, has_dbias=False, compute_data_type=None,  # noqa: A002
                     name=None):
    """cudnn-frontend's rmsnorm_backward: [DX, dscale, dbias] (dbias None unless has_dbias)."""
    return _bwd(self, RMS, grad, input, scale, None, inv_variance, has_dbias, name)


def instancenorm_backward(self, grad, input, scale, mean, inv_variance, compute_data_type=None,  # noqa: A002
                          name=None):
    """cudnn-frontend's instancenorm_backward: [DX, dscale, dbias]."""
    return _bwd(self, INSTANCE, grad, input, scale, mean, inv_variance, True, name)


def batchnorm_backward(self, grad, input, scale, mean, inv_variance, peer_stats=(),  # noqa: A002
                       compute_data_type=None, name=None):
    """cudnn-frontend's batchnorm_backward: [DX, dscale, dbias]."""
    if peer_stats:
        raise bad("batchnorm_backward: peer_stats are not supported", E.PYDNN_STATUS_NOT_SUPPORTED)
    return _bwd(self, BATCH, grad, input, scale, mean, inv_variance, True, name)


FWD_ATTRS = dict(x="XDESC", y="YDESC", scale="SCALE_DESC", bias="BIAS_DESC", epsilon="EPSILON_DESC",
                 mean="MEAN_DESC", inv_variance="INV_VARIANCE_DESC", momentum="EXP_AVG_FACTOR_DESC",
                 in_running_mean="INPUT_RUNNING_MEAN_DESC", in_running_var="INPUT_RUNNING_VAR_DESC",
                 out_running_mean="OUTPUT_RUNNING_MEAN_DESC", out_running_var="OUTPUT_RUNNING_VAR_DESC")
BWD_ATTRS = dict(x="XDESC", dy="DYDESC", dx="DXDESC", scale="SCALE_DESC", mean="MEAN_DESC",
                 inv_variance="INV_VARIANCE_DESC", epsilon="EPSILON_DESC", dscale="DSCALE_DESC", dbias="DBIAS_DESC")


def _build_desc(kind):
    def build(g, n, td):
        S, DESC = B.backend_set_attribute, E.PYDNN_TYPE_BACKEND_DESCRIPTOR  # noqa: N806
        fwd = kind == "norm_fwd"
        o = B.backend_create_descriptor(E.PYDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR if fwd else
                                        E.PYDNN_BACKEND_OPERATION_NORM_BACKWARD_DESCRIPTOR)
        pre, attrs = (("PYDNN_ATTR_OPERATION_NORM_FWD_", FWD_ATTRS) if fwd else
                      ("PYDNN_ATTR_OPERATION_NORM_BWD_", BWD_ATTRS))
        S(o, getattr(E, pre + "MODE"), E.PYDNN_TYPE_NORM_MODE, 1, [n["mode"]])
        if fwd:
            S(o, E.PYDNN_ATTR_OPERATION_NORM_FWD_PHASE, E.PYDNN_TYPE_NORM_FWD_PHASE, 1, [n["phase"]])
        for r, t in list(n["ins"].items()) + list(n["outs_map"].items()):
            if t is not None:
                S(o, getattr(E, pre + attrs[r]), DESC, 1, [td[t.uid]])
        B.backend_finalize(o)
        return o
    return build


F.NODE_BUILDERS.update(norm_fwd=_build_desc("norm_fwd"), norm_bwd=_build_desc("norm_bwd"))
for _f in (layernorm, rmsnorm, instancenorm, batchnorm, batchnorm_inference, layernorm_backward, rmsnorm_backward,
           instancenorm_backward, batchnorm_backward):
    setattr(F.Graph, _f.__name__, _f)
