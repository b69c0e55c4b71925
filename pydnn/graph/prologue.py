"""A pointwise prologue on a matmul's A and / or B in the fusion engine (a FUSERS entry): the pointwise
ops that compute a matmul input from graph inputs run as ONE generated pointwise kernel per operand, which
writes the operand into the workspace in the matmul's input type, then the matmul with the rest of the
graph (its pointwise epilogue and optional row reduction) as the one fused GEMM of engines.FusedMatmulStep.
So `gelu(relu(x) @ W + b)` is two launches (node by node: four).

Why not one kernel: the GEMM's operand loads are cp.async copies (mma.sync tiles) and wgmma reads its
operands from shared memory, so a prologue inside the GEMM needs a transform pass over each shared-memory
tile before the MMA reads it (registers -> shared memory on sm_90); that is a change to ptx/matmul.cu's
mainloop, not an epilogue, and the generator does not make it (the report of branch chain describes it).

The operand is stored in, so rounded to, the matmul's input type, as the GEMM reads it: the operand tensor's
own type when it is HALF or BFLOAT16, else the other operand's (a graph input), else the one 16-bit type of
the prologue's inputs; with neither, NOT_SUPPORTED.
"""
from .. import enums as E
from . import codegen as cg
from . import engines as EN
from .descriptors import TensorInfo
from .opgraph import OpGraph

HALFS = (E.PYDNN_DATA_HALF, E.PYDNN_DATA_BFLOAT16)


def _prologue_ops(g, uid, produced):
    """The pointwise ops computing tensor `uid` from graph inputs (in g.order), or a reason."""
    need, ops = [uid], set()
    while need:
        u = need.pop()
        if u not in produced:
            continue
        op = produced[u]
        if op.kind != "pointwise":
            return f"the matmul operand uid {uid} is computed by a {op.kind} operation (a prologue is pointwise)"
        if id(op) in ops:
            continue
        ops.add(id(op))
        need.extend(op.inputs.values())
    return [op for op in g.order if id(op) in ops]


def _copy(t, **kw):
    n = TensorInfo()
    for f in TensorInfo.__slots__:
        setattr(n, f, kw.get(f, getattr(t, f)))
    return n


class PrologueFuser:
    """FUSERS entry of one-matmul graphs whose A or B is computed by pointwise ops."""

    def analyze(self, g):
        mms = [op for op in g.ops if op.kind == "matmul"]
        if len(mms) != 1 or any(op.kind not in ("matmul", "pointwise", "reduction") for op in g.ops):
            return None
        mm = mms[0]
        roles = [r for r in ("a", "b") if mm.inputs[r] not in g.inputs]
        if not roles:
            return None  # no prologue: the engine's own matmul epilogue
        if any(t.by_value for t in g.tensors.values()):
            return "a matmul prologue with by-value tensors"
        produced = {u: op for op in g.ops for u in op.outputs.values()}
        pro, pro_ids = {}, set()
        for r in roles:
            ops = _prologue_ops(g, mm.inputs[r], produced)
            if isinstance(ops, str):
                return ops
            pro[r] = ops
            pro_ids.update(id(op) for op in ops)
        other = [g.tensors[mm.inputs[r]] for r in ("a", "b") if r not in roles]
        store = {}
        inner = {u for r in roles for op in pro[r] for u in op.outputs.values()}
        for r in roles:
            t = g.tensors[mm.inputs[r]]
            src = {g.tensors[u].dtype for op in pro[r] for u in op.inputs.values() if u not in inner}
            cands = [t.dtype] + ([other[0].dtype] if other else []) + (list(src) if len(src) == 1 else [])
            dt = next((d for d in cands if d in HALFS), t.dtype)
            if dt not in HALFS:
                return (f"the matmul operand uid {t.uid} computed by a prologue is {t.dtype}: a fused matmul "
                        f"reads HALF or BFLOAT16 (give it, or the other operand, a 16-bit type)")
            if t.uid in g.outputs:
                return f"the prologue's result uid {t.uid} is a graph output"
            store[r] = dt
        if len(roles) == 2 and store["a"] != store["b"]:
            return "the two prologues' results need one data type"
        # the prologue's values feed only the prologue (or the matmul): no graph output, no epilogue use
        for op in g.ops:
            if id(op) in pro_ids or op is mm:
                continue
            if inner & set(op.inputs.values()):
                return "a prologue value is also read after the matmul (not fused)"
        if inner & set(g.outputs) - {mm.inputs[r] for r in roles}:
            return "a prologue value is a graph output (not fused)"
        # the rest of the graph, the prologue results as inputs stored in the matmul's type
        ops2 = [op for op in g.ops if id(op) not in pro_ids]
        used = {u for op in ops2 for u in list(op.inputs.values()) + list(op.outputs.values())}
        tensors2 = {}
        for u in used:
            t = g.tensors[u]
            if any(u == mm.inputs[r] for r in roles):
                r = "a" if u == mm.inputs["a"] else "b"
                t = _copy(t, virtual=False, dtype=store[r])
            tensors2[u] = t
        g2 = OpGraph(tensors2, ops2, g.handle)
        an = EN._matmul_epilogue(g2)
        if isinstance(an, str):
            return f"after the prologue: {an}"
        steps = []
        for r in roles:
            t = tensors2[mm.inputs[r]]
            ins = sorted({u for op in pro[r] for u in op.inputs.values()} - inner)
            for u in ins:
                s = g.tensors[u]
                if s.dtype not in EN.TAGS:
                    return f"tensor uid {u}: data type {s.dtype}"
                if len(s.dims) != len(t.dims) or any(d != o and d != 1 for d, o in zip(s.dims, t.dims)):
                    return f"prologue input uid {u} dims {s.dims} do not broadcast to the operand's {t.dims}"
            if len(ins) + 1 > cg.MAX_OPERANDS:
                return f"{len(ins) + 1} prologue tensors (one kernel takes at most {cg.MAX_OPERANDS})"
            steps.append((r, t, ins, pro[r]))
        return dict(g2=g2, an=an, pro=steps)

    def build(self, handle, g, an):
        mm = EN.FusedMatmulStep(handle, an["g2"], an["an"])
        off = (mm.workspace_size + EN.ALIGN - 1) // EN.ALIGN * EN.ALIGN  # the row reduction's partials first
        steps, offsets = [], {}
        for _, t, ins, ops in an["pro"]:
            uids = list(ins) + [t.uid]
            value, nodes = {}, []

            def ref(u, uids=uids, value=value):
                return ("v", value[u]) if u in value else ("op", uids.index(u))

            for op in ops:
                nodes.append(EN._pw_node(op, ref))
                value[next(iter(op.outputs.values()))] = len(nodes) - 1
            operands = [(EN.TAGS[g.tensors[u].dtype], "in") for u in ins] + [(EN.TAGS[t.dtype], "out")]
            prog = cg.PwProgram(operands, nodes, [(value[t.uid], len(ins))])
            shape = list(t.dims)
            tens = [g.tensors[u] for u in ins] + [t]
            steps.append(EN.PwStep(handle, prog, shape, [EN._bcast_strides(s, shape) for s in tens], uids))
            offsets[t.uid] = off
            off += (EN._span(t, t.dtype) + EN.ALIGN - 1) // EN.ALIGN * EN.ALIGN
        return EN.EnginePlan(steps + [mm], offsets, off)


EN.FUSERS.append(PrologueFuser())
