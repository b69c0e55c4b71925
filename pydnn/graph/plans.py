"""Engines, engine configs, heuristics and execution plans of the backend API (finalizers and computed
attributes of ENGINEHEUR, ENGINE, ENGINECFG, KNOB_CHOICE, EXECUTION_PLAN, VARIANT_PACK), and a plan's
JSON form (cuDNN's EXECUTION_PLAN_JSON_REPRESENTATION): the graph, the engine index, a format version.
"""
import json

from .. import buffers as _buffers
from .. import enums as E
from ..status import PydnnError
from . import descriptors as D
from .descriptors import bad
from .engines import ENGINES, heuristic
from .opgraph import OpGraph

FORMAT, VERSION = "pydnn.execution_plan", 1
CHECKS = {}  # operation kind of a node module -> fn(op) raising ValueError on operands / parameters read from JSON
CONV_ROLES = {"conv_fprop": (("x", "w"), ("y",)), "conv_dgrad": (("w", "dy"), ("dx",)),
              "conv_wgrad": (("x", "dy"), ("dw",))}


class Plan:
    """A built execution plan: engine index, the graph, and the engine's plan (steps, workspace size)."""

    __slots__ = ("engine", "graph", "built", "handle", "io", "by_value", "workspace_size", "io_uids", "spans")

    def __init__(self, engine, graph, handle):
        why = ENGINES[engine].support(graph)
        if why:
            raise bad(f"EXECUTION_PLAN: engine {engine} ({ENGINES[engine].name}) cannot run this graph: {why}",
                      E.PYDNN_STATUS_NOT_SUPPORTED)
        self.engine, self.graph, self.handle = engine, graph, handle
        self.built = ENGINES[engine].build(graph, handle)
        self.workspace_size = self.built.workspace_size
        self.io = []  # (uid, bytes spanned, what an error calls it) of every tensor execute needs
        self.by_value = []  # (uid, data type, what): the host scalars (epsilon, momentum, scales), read at execute
        for uid in graph.inputs + graph.outputs:
            t = graph.tensors[uid]
            if t.by_value:
                self.by_value.append((uid, t.dtype, f"variantPack: uid {uid} (by value)"))
                continue
            es = 4 if t.dtype == E.PYDNN_DATA_FLOAT else 8 if t.dtype == E.PYDNN_DATA_DOUBLE else 2
            self.io.append((uid, (sum((d - 1) * s for d, s in zip(t.dims, t.strides)) + 1) * es,
                            f"variantPack: uid {uid}"))
        # Graph.execute's fast path: a variant pack of exactly these uids, all positive int pointers
        self.io_uids = frozenset(uid for uid, _, _ in self.io) if not self.by_value else None
        self.spans = {uid: span for uid, span, _ in self.io}  # the device tensors' spans (bytes) by uid

    def to_json(self):
        return json.dumps({"format": FORMAT, "version": VERSION, "engine": self.engine,
                           "graph": self.graph.to_json()}, sort_keys=True, separators=(",", ":"))


def plan_from_json(text, handle):
    """A Plan from its JSON: BAD_PARAM for anything corrupt, SERIALIZATION_VERSION_MISMATCH for another
    format version. Builds the plan (its fused kernel comes from the cache, or compiles once)."""
    try:
        j = json.loads(text)
    except (ValueError, TypeError) as e:
        raise bad(f"EXECUTION_PLAN: the JSON representation is corrupt ({e})") from None
    if not isinstance(j, dict) or j.get("format") != FORMAT:
        raise bad("EXECUTION_PLAN: the JSON representation is not a pydnn execution plan")
    if j.get("version") != VERSION:
        raise PydnnError(E.PYDNN_STATUS_SERIALIZATION_VERSION_MISMATCH,
                         f"EXECUTION_PLAN: format version {j.get('version')!r}, this pydnn reads version {VERSION}")
    try:
        engine = j["engine"]
        if type(engine) is not int or not 0 <= engine < len(ENGINES):
            raise ValueError(f"engine {engine!r}")
        graph = OpGraph.from_json(j["graph"], handle)
        _check_graph(graph)
        return Plan(engine, graph, handle)
    except PydnnError as e:
        if e.status in (E.PYDNN_STATUS_NOT_SUPPORTED, E.PYDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED):
            raise
        raise bad(f"EXECUTION_PLAN: the JSON representation is corrupt ({e.message})") from None
    except Exception as e:  # noqa: BLE001 - any malformed content is BAD_PARAM, never a crash
        raise bad(f"EXECUTION_PLAN: the JSON representation is corrupt ({type(e).__name__}: {e})") from None


def _check_graph(g):
    """What descriptor finalize checks, again for a graph read from JSON."""
    from . import pointwise_ops as pw

    for t in g.tensors.values():
        if t.dtype not in E.ENUMS["pydnnDataType_t"].values() or len(t.dims) != len(t.strides) or \
                not 1 <= len(t.dims) <= 8 or min(t.dims) <= 0 or min(t.strides) <= 0:
            raise ValueError(f"tensor {t.uid}")
    for op in g.ops:
        if op.kind == "pointwise":
            if op.params["mode"] not in pw.BY_VALUE:
                raise ValueError(f"pointwise mode {op.params['mode']}")
            need = {"x": {"x"}, "xb": {"x", "b"}, "xbt": {"x", "b", "t"}, "xdy": {"x", "b"}}[pw.inputs(op.params["mode"])]
            if set(op.inputs) != need or len(op.outputs) != 1:
                raise ValueError("pointwise operands")
            float(op.params["alpha1"]), float(op.params["alpha2"])
        elif op.kind == "matmul":
            if set(op.inputs) != {"a", "b"} or set(op.outputs) != {"c"}:
                raise ValueError("matmul operands")
        elif op.kind == "reduction":
            if set(op.inputs) != {"x"} or set(op.outputs) != {"y"}:
                raise ValueError("reduction operands")
        elif op.kind in CONV_ROLES:
            ins, outs = CONV_ROLES[op.kind]
            if set(op.inputs) != set(ins) or set(op.outputs) != set(outs):
                raise ValueError("convolution operands")
            nd = len(op.params["pad"])
            if not (len(op.params["stride"]) == len(op.params["dil"]) == nd) or min(op.params["stride"]) < 1:
                raise ValueError("convolution parameters")
        elif op.kind in CHECKS:
            CHECKS[op.kind](op)
        else:
            raise ValueError(f"operation kind {op.kind!r}")
        for u in list(op.inputs.values()) + list(op.outputs.values()):
            if u not in g.tensors:
                raise ValueError(f"uid {u}")


# ----------------------------------------------------------------------------- finalizers

def _engine_desc(graph_desc, index):
    e = D.BackendDescriptor("ENGINE")
    D.set_attribute(e, E.PYDNN_ATTR_ENGINE_OPERATION_GRAPH, E.PYDNN_TYPE_BACKEND_DESCRIPTOR, 1, [graph_desc])
    D.set_attribute(e, E.PYDNN_ATTR_ENGINE_GLOBAL_INDEX, E.PYDNN_TYPE_INT64, 1, [index])
    D.finalize(e)
    cfg = D.BackendDescriptor("ENGINECFG")
    D.set_attribute(cfg, E.PYDNN_ATTR_ENGINECFG_ENGINE, E.PYDNN_TYPE_BACKEND_DESCRIPTOR, 1, [e])
    D.finalize(cfg)
    return cfg


def _fin_heur(d):
    g = d.one("ENGINEHEUR_OPERATION_GRAPH")
    return [_engine_desc(g, i) for i in heuristic(g.state, d.one("ENGINEHEUR_MODE"))]


def _fin_engine(d):
    g = d.one("ENGINE_OPERATION_GRAPH").state
    i = d.one("ENGINE_GLOBAL_INDEX")
    if not 0 <= i < len(ENGINES):
        raise bad(f"ENGINE: PYDNN_ATTR_ENGINE_GLOBAL_INDEX = {i} is outside [0, {len(ENGINES) - 1}]")
    why = ENGINES[i].support(g)
    if why:
        raise bad(f"ENGINE: engine {i} ({ENGINES[i].name}) does not support this graph: {why}",
                  E.PYDNN_STATUS_NOT_SUPPORTED)
    return i


def _fin_cfg(d):
    for k in d.get("ENGINECFG_KNOB_CHOICES", []):
        raise bad(f"ENGINECFG: engine {d.one('ENGINECFG_ENGINE').state} has no knobs "
                  f"(knob type {k.one('KNOB_CHOICE_KNOB_TYPE')})", E.PYDNN_STATUS_NOT_SUPPORTED)
    return d.one("ENGINECFG_ENGINE").state


def _fin_plan(d):
    handle = d.one("EXECUTION_PLAN_HANDLE")
    text = d.one("EXECUTION_PLAN_JSON_REPRESENTATION")
    if text is not None:
        return plan_from_json(text, handle)
    cfg = d.one("EXECUTION_PLAN_ENGINE_CONFIG")
    engine = cfg.one("ENGINECFG_ENGINE")
    return Plan(engine.state, engine.one("ENGINE_OPERATION_GRAPH").state, handle)


def _fin_pack(d):
    uids = d.get("VARIANT_PACK_UNIQUE_IDS", [])
    ptrs = d.get("VARIANT_PACK_DATA_POINTERS", [])
    if len(uids) != len(ptrs):
        raise bad(f"VARIANT_PACK: {len(uids)} unique ids but {len(ptrs)} data pointers")
    if len(set(uids)) != len(uids):
        raise bad("VARIANT_PACK: a unique id appears twice", E.PYDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES)
    return dict(zip(uids, ptrs)), d.one("VARIANT_PACK_WORKSPACE", 0)


D.FINALIZERS.update(ENGINEHEUR=_fin_heur, ENGINE=_fin_engine, ENGINECFG=_fin_cfg, EXECUTION_PLAN=_fin_plan,
                    VARIANT_PACK=_fin_pack)
D.GETTERS.update(
    ENGINEHEUR_RESULTS=lambda d: d.state,
    ENGINE_KNOB_INFO=lambda d: [], ENGINE_LAYOUT_INFO=lambda d: [], ENGINE_NUMERICAL_NOTE=lambda d: [],
    ENGINE_BEHAVIOR_NOTE=lambda d: list(ENGINES[d.state].behavior),
    ENGINECFG_INTERMEDIATE_INFO=lambda d: [],
    EXECUTION_PLAN_WORKSPACE_SIZE=lambda d: [d.state.workspace_size],
    EXECUTION_PLAN_JSON_REPRESENTATION=lambda d: [d.state.to_json()],
    EXECUTION_PLAN_COMPUTED_INTERMEDIATE_UIDS=lambda d: list(d.state.graph.virtuals),
)


def execute(handle, plan_desc, pack_desc):
    from ..handle import check_handle

    check_handle(handle)
    D.check_descriptor(plan_desc, "executionPlan")
    D.check_descriptor(pack_desc, "variantPack")
    for d, nm, kind in ((plan_desc, "executionPlan", "EXECUTION_PLAN"), (pack_desc, "variantPack", "VARIANT_PACK")):
        if d.kind != kind:
            raise bad(f"{nm}: a {d.kind} descriptor, expected {kind}", E.PYDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE)
        if not d.finalized:
            raise bad(f"{nm}: not finalized", E.PYDNN_STATUS_BAD_PARAM_NOT_FINALIZED)
    plan = plan_desc.state
    given, ws = pack_desc.state
    run(handle, plan, given, ws)


def run(handle, plan, given, ws):
    """Resolve the variant pack's buffers (pydnn.buffers.device_ptr: an int is taken as is unless
    PYDNN_CHECKED=1) and enqueue the plan. The hot path of execute: per call only the lookups, the buffer
    resolution and the steps' launches (tests/graph/test_graph_host_cpu.py counts its Python calls)."""
    ptrs = {}
    for uid, span, what in plan.io:
        v = given.get(uid)
        if type(v) is int and v > 0 and not _buffers.CHECKED:
            ptrs[uid] = v
            continue
        if v is None:
            raise bad(f"variantPack: no data pointer for tensor uid {uid}")
        ptrs[uid] = _buffers.device_ptr(v, what, span)
    for uid, dtype, what in plan.by_value:
        ptrs[uid] = host_scalar(given.get(uid), dtype, what)
    if plan.workspace_size:
        ws = _buffers.device_ptr(ws, "variantPack: workspace", plan.workspace_size)
    plan.built.execute(handle, ptrs, ws or 0)


def host_scalar(v, dtype, what):
    """The value of a pass-by-value tensor: a Python number, a host array / CPU tensor of one element, or
    (from C) the host address of one element of the tensor's data type."""
    import ctypes

    if v is None:
        raise bad(f"{what}: no value given for the pass-by-value tensor")
    if isinstance(v, bool):
        raise bad(f"{what}: expected a number, got a bool")
    if isinstance(v, float):
        return v
    if isinstance(v, int):
        if v == 0:
            raise bad(f"{what}: NULL pointer", E.PYDNN_STATUS_BAD_PARAM_NULL_POINTER)
        ct = {E.PYDNN_DATA_DOUBLE: ctypes.c_double, E.PYDNN_DATA_FLOAT: ctypes.c_float}.get(dtype)
        if ct is None:
            raise bad(f"{what}: a by-value tensor of data type {dtype} (FLOAT or DOUBLE)")
        return float(ct.from_address(v).value)
    try:
        import numpy as np

        a = np.asarray(v, dtype=np.float64).reshape(-1)
    except Exception:  # noqa: BLE001 - anything else is not a host scalar
        raise bad(f"{what}: expected a host scalar (a number or a one-element host array)") from None
    if a.size != 1:
        raise bad(f"{what}: a by-value tensor takes one element, got {a.size}")
    return float(a[0])
