"""The operation graph: finalized operations checked as one graph (tensor uids name one tensor each,
every virtual tensor is produced once and consumed, no cycles) and ordered for execution. It holds no
descriptor objects, so an execution plan serializes it to JSON and rebuilds it in another process.

    g = OpGraph(tensors={uid: TensorInfo}, ops=[Op(kind, inputs={role: uid}, outputs={role: uid}, params)])
    g.order           # ops in an executable order
    g.inputs, g.outputs, g.virtuals   # uids: non-virtual tensors read only / written; virtual ones
"""

from . import descriptors as D
from .descriptors import bad


class Op:
    __slots__ = ("kind", "inputs", "outputs", "params")

    def __init__(self, kind, inputs, outputs, params):
        self.kind, self.inputs, self.outputs, self.params = kind, dict(inputs), dict(outputs), dict(params)

    def to_json(self):
        p = dict(self.params)
        if "params" in p:
            p["params"] = {k: (v if v != float("inf") else "inf") for k, v in p["params"].items()}
        return {"kind": self.kind, "inputs": self.inputs, "outputs": self.outputs, "params": p}

    @classmethod
    def from_json(cls, j):
        p = dict(j["params"])
        if "params" in p:
            p["params"] = {k: (float(v) if v != "inf" else float("inf")) for k, v in p["params"].items()}
        return cls(j["kind"], {k: int(v) for k, v in j["inputs"].items()},
                   {k: int(v) for k, v in j["outputs"].items()}, p)


class OpGraph:
    def __init__(self, tensors, ops, handle=None):
        self.tensors, self.ops, self.handle = dict(tensors), list(ops), handle
        produced, consumed = {}, set()
        for i, op in enumerate(self.ops):
            for uid in op.outputs.values():
                if uid in produced:
                    raise bad(f"OPERATIONGRAPH: tensor uid {uid} is written by two operations ({produced[uid]} and {i})")
                produced[uid] = i
            consumed.update(op.inputs.values())
        for uid, t in self.tensors.items():
            if t.virtual and uid not in produced:
                raise bad(f"OPERATIONGRAPH: virtual tensor uid {uid} is read but no operation writes it")
            if t.virtual and uid not in consumed:
                raise bad(f"OPERATIONGRAPH: virtual tensor uid {uid} is written but never read "
                          f"(a graph output must not be virtual)")
        self.order = self._topological(produced)
        self.inputs = sorted(u for u, t in self.tensors.items() if not t.virtual and u not in produced)
        self.outputs = sorted(u for u, t in self.tensors.items() if not t.virtual and u in produced)
        self.virtuals = sorted(u for u, t in self.tensors.items() if t.virtual)

    def _topological(self, produced):
        deps = [{produced[u] for u in op.inputs.values() if u in produced} for op in self.ops]
        order, done = [], set()
        while len(order) < len(self.ops):
            ready = [i for i in range(len(self.ops)) if i not in done and deps[i] <= done]
            if not ready:
                raise bad("OPERATIONGRAPH: the operations form a cycle")
            for i in ready:
                if any(u == v for u in self.ops[i].inputs.values() for v in self.ops[i].outputs.values()):
                    raise bad(f"OPERATIONGRAPH: operation {i} reads the tensor it writes")
            order.extend(ready)
            done.update(ready)
        return [self.ops[i] for i in order]

    # ------------------------------------------------------------------ serialization
    def to_json(self):
        return {"tensors": [dict(uid=t.uid, dtype=t.dtype, dims=list(t.dims), strides=list(t.strides),
                                 alignment=t.alignment, virtual=t.virtual, by_value=t.by_value)
                            for t in self.tensors.values()],
                "ops": [op.to_json() for op in self.ops]}

    @classmethod
    def from_json(cls, j, handle=None):
        tensors = {}
        for tj in j["tensors"]:
            t = D.TensorInfo()
            t.uid, t.dtype, t.dims, t.strides = int(tj["uid"]), int(tj["dtype"]), tuple(tj["dims"]), tuple(tj["strides"])
            t.alignment, t.virtual, t.by_value = int(tj["alignment"]), bool(tj["virtual"]), bool(tj["by_value"])
            tensors[t.uid] = t
        return cls(tensors, [Op.from_json(o) for o in j["ops"]], handle)


def from_descriptor(desc):
    """The OpGraph of an OPERATIONGRAPH descriptor's finalized operations (its finalizer)."""
    tensors, ops = {}, []
    for od in desc.get("OPERATIONGRAPH_OPS"):
        info = od.state
        roles = {}
        for group in (info.inputs, info.outputs):
            for role, t in group.items():
                old = tensors.get(t.uid)
                if old is not None and old is not t and (old.dims, old.strides, old.dtype, old.virtual) != \
                        (t.dims, t.strides, t.dtype, t.virtual):
                    raise bad(f"OPERATIONGRAPH: uid {t.uid} names two different tensors ({old} and {t})")
                tensors.setdefault(t.uid, t)
                roles[role] = t.uid
        ops.append(Op(info.kind, {r: t.uid for r, t in info.inputs.items()},
                      {r: t.uid for r, t in info.outputs.items()}, info.params))
    return OpGraph(tensors, ops, desc.one("OPERATIONGRAPH_HANDLE"))


D.FINALIZERS["OPERATIONGRAPH"] = from_descriptor
D.GETTERS["OPERATIONGRAPH_ENGINE_GLOBAL_COUNT"] = lambda d: [2]  # engines.ENGINES: node-by-node, fusion
