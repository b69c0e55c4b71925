"""A reduction at the end of a fusable graph in the fusion engine (a FUSERS entry): pointwise ops (or one
matmul with its pointwise prologue / epilogue) whose result one reduction reduces along any dims, where
no one-kernel form exists (the fused GEMM's epilogue reduces rows only: a column reduction, a reduction of
a pointwise graph). The graph before the reduction runs as the fusion engine runs it (one generated kernel,
or the prologue kernels and the fused GEMM), its result stored (in the workspace when virtual), then
reduce_tensor reduces it: 2 launches (reduce_tensor's: 1 or 2) where the node engine takes one per node.

The reduced tensor is stored in its own type for a pointwise graph (FLOAT intermediates stay FLOAT) and in
the matmul's input type after a GEMM (the GEMM's store; the node engine rounds a virtual matmul result the
same way). A reduction inside the GEMM's epilogue along columns (partials per row tile combined in order, as
the row reduction does per column tile) would be one launch but needs ptx/matmul.cu's epilogue protocol to
pass column partials (not the generator's).
"""
from .. import enums as E
from . import engines as EN
from .descriptors import TensorInfo
from .opgraph import OpGraph


def _copy(t, **kw):
    n = TensorInfo()
    for f in TensorInfo.__slots__:
        setattr(n, f, kw.get(f, getattr(t, f)))
    return n


class ReductionTailFuser:
    """FUSERS entry (before the prologue fuser, which it defers to where that one fuses the whole graph)."""

    def analyze(self, g):
        reds = [op for op in g.ops if op.kind == "reduction"]
        if len(reds) != 1 or any(op.kind not in ("pointwise", "matmul", "reduction") for op in g.ops):
            return None
        if len(g.ops) == 1 or sum(op.kind == "matmul" for op in g.ops) > 1:
            return None
        if any(t.by_value for t in g.tensors.values()):
            return None
        red = reds[0]
        x, y = g.tensors[red.inputs["x"]], g.tensors[red.outputs["y"]]
        if x.uid in g.inputs:
            return None  # nothing computed before it: the node engine's reduce_tensor
        mms = [op for op in g.ops if op.kind == "matmul"]
        if mms:
            if isinstance(EN._matmul_epilogue(g), dict):
                return None  # the engine's own one-launch row reduction
            from .prologue import PrologueFuser

            if isinstance(PrologueFuser().analyze(g), dict):
                return None  # the prologue kernels and the fused GEMM with its row reduction
        if y.uid not in g.outputs or any(y.uid in op.inputs.values() for op in g.ops):
            return f"the reduction's Y (uid {y.uid}) must be a graph output that no operation reads"
        if y.dtype not in EN.TAGS or x.dtype not in EN.TAGS:
            return f"reduction tensors of data types {x.dtype} / {y.dtype}"
        if red.params["comp_type"] != E.PYDNN_DATA_FLOAT:
            return None  # the engine's own reason
        dtype = x.dtype
        if mms:  # the GEMM stores its result in the 16-bit type it reads A and B in (prologue.py's choice)
            halfs = [g.tensors[mms[0].inputs[r]].dtype for r in ("a", "b")]
            halfs = [d for d in halfs if d in (E.PYDNN_DATA_HALF, E.PYDNN_DATA_BFLOAT16)]
            if not halfs:
                return None
            dtype = halfs[0]
        ops2 = [op for op in g.ops if op is not red]
        used = {u for op in ops2 for u in list(op.inputs.values()) + list(op.outputs.values())}
        tensors2 = {u: (_copy(g.tensors[u], virtual=False, dtype=dtype) if u == x.uid else g.tensors[u]) for u in used}
        g2 = OpGraph(tensors2, ops2, g.handle)
        why = EN.ENGINES[1].support(g2)
        if why:
            return f"before the reduction: {why}"
        return dict(g2=g2, red=red, x=tensors2[x.uid], y=y, virtual=x.virtual)

    def build(self, handle, g, an):
        inner = EN.ENGINES[1].build(an["g2"], handle)
        off = (inner.workspace_size + EN.ALIGN - 1) // EN.ALIGN * EN.ALIGN
        offsets = dict(inner.offsets)
        x = an["x"]
        if an["virtual"]:
            offsets[x.uid] = off
            off += (EN._span(x, x.dtype) + EN.ALIGN - 1) // EN.ALIGN * EN.ALIGN
        storage = {x.uid: x.dtype, an["y"].uid: an["y"].dtype}
        rs = EN.ReduceStep(handle, g, an["red"], storage, off)
        return EN.EnginePlan(list(inner.steps) + [rs], offsets, off + rs.ws_size)


_prologue_at = next(i for i, f in enumerate(EN.FUSERS) if type(f).__name__ == "PrologueFuser")
EN.FUSERS.insert(_prologue_at, ReductionTailFuser())
