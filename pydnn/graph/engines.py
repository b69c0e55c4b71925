"""Engines of the graph API (cuDNN's ENGINE global indices):

  0  pydnn.nodes   every valid graph, one node at a time on pydnn's kernels: pointwise nodes as generated
                   one-node kernels (codegen), matmul on the GEMM kernels (matmul_api), reductions through
                   reduce_tensor, convolutions through the public convolution calls; virtual tensors live
                   in the workspace.
  1  pydnn.fusion  runtime fusion (behavior note RUNTIME_COMPILATION), ONE kernel per graph:
                   - pointwise ops (a chain or tree over up to 16 tensors): a generated kernel;
                   - one fp16 / bf16 matmul whose output feeds pointwise ops (bias, GELU, residual, extra
                     outputs): the GEMM (the tile pydnn.ops.matmul chooses: gemm_tma or wgmma on sm_90) instantiated
                     with the generated epilogue;
                   - conv_fprop -> bias add (-> residual add) -> activation: convolution_bias_activation_
                     forward (the epilogue in the convolution kernel; no code generated).
                   Generated kernels compile with NVRTC when the plan is built, cached by their source's hash.

engine.support(graph) -> None or the reason it cannot run the graph (NOT_SUPPORTED's message);
engine.build(graph, handle) -> EnginePlan (compiles what it needs; loads nothing on the GPU);
plan.execute(handle, {uid: device pointer}, workspace) enqueues the work on the handle's stream.
"""
import ctypes
from ctypes import memmove as _memmove

from .. import enums as E
from .. import tuning
from .._build import cache, fastcall, loader
from .._cuda import driver
from ..status import PydnnError
from . import codegen as cg

from .matmul_api import layout

TAGS = {E.PYDNN_DATA_FLOAT: "f32", E.PYDNN_DATA_HALF: "f16", E.PYDNN_DATA_BFLOAT16: "bf16"}
ESIZE = {E.PYDNN_DATA_FLOAT: 4, E.PYDNN_DATA_HALF: 2, E.PYDNN_DATA_BFLOAT16: 2}
ALIGN = 256
FLAG_PAIR = 4  # PYDNN_MATMUL_FLAG_PAIR (ptx/matmul_params.h; pydnn.ops.matmul.FLAG_PAIR)
FLAG_C16 = 8   # PYDNN_MATMUL_FLAG_C16: C's rows 16-byte aligned (gemm_tma's WIDE stores)


def _bcast_strides(t, dims):
    return [0 if (td == 1 and d != 1) else s for td, s, d in zip(t.dims, t.strides, dims)]


def _span(t, dtype):
    return (sum((d - 1) * s for d, s in zip(t.dims, t.strides)) + 1) * ESIZE[dtype]


_READY = set()  # (unit name, arch) compiled or found in the cache by this process


def _compile(handle, unit):
    """Compile (or find in the cache) a generated unit for the handle's arch: no GPU needed. A unit this
    process already has is not read again (build_plans of a graph built before costs no disk read)."""
    key = (unit.name, handle.arch, str(cache.cache_dir()))
    if key in _READY:
        return
    try:
        loader.load_unit(handle.arch, unit)
        _READY.add(key)
    except PydnnError:
        raise
    except Exception as e:  # noqa: BLE001 - an NVRTC failure of generated code is pydnn's bug: say so
        raise PydnnError(E.PYDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED, f"compiling {unit.name}: {e}") from e


def _resident_blocks(handle, fn, threads):
    """Blocks of `threads` a generated kernel keeps resident on one SM (the driver's occupancy; 0 where the
    driver cannot say)."""
    try:
        d = driver._driver()
        with driver.pushed(handle.ctx):
            err, n = d.cuOccupancyMaxActiveBlocksPerMultiprocessor(fn, threads, 0)
        return int(n) if int(err) == 0 else 0
    except Exception:  # noqa: BLE001 - an occupancy query is advice: fall back to the static grid
        return 0


_LAUNCH_ARGS = driver.launch_args
_PATCH = [None]  # fastcall.patch_launch once looked up (None: not available here)


def _patch_launch():
    if _PATCH[0] is None:
        _PATCH[0] = fastcall.patch_launcher()
    return _PATCH[0]


class PwStep:
    """One launch of a generated pointwise kernel: operand uids in kernel order, a params struct reused.
    Its form follows pydnn.tuning.graph (read when the plan is built): PW_SPLIT, PW_RUNS, PW_GRID,
    PW_MIN_BLOCKS, PW_PREFETCH (and the 16-bit math forms, codegen.expressions)."""

    def __init__(self, handle, prog, dims, strides_list, uids):
        from .. import tuning

        sw = tuning.graph
        cdims, cstrides = cg.collapse(dims, strides_list)
        esizes = [ESIZE[{v: k for k, v in TAGS.items()}[tag]] for tag, _ in prog.operands]
        elems = cg.launch_shape(cdims, cstrides, handle.sm_count, esizes)[0]
        self.runs = cg.run_count(cdims, elems, max(1, int(sw.PW_RUNS)))
        self.per_sm = int(sw.PW_GRID)
        self.waves = max(1, -self.per_sm)  # PW_GRID <= 0: waves of the resident blocks (at most 8 an SM each)
        elems, wide, self.grid = cg.launch_shape(cdims, cstrides, handle.sm_count, esizes, self.runs,
                                                 self.per_sm if self.per_sm > 0 else 16, 8 * self.waves)
        self.work_blocks = max(1, -(-cg.prod(cdims) // (elems * self.runs * cg.THREADS)))
        access = cg.access_kinds(cstrides)
        # __launch_bounds__(256, PW_MIN_BLOCKS) only for the class of kernel it was measured on: sm_90, every
        # output bfloat16 (the 16-bit forms' shortest code), at most 8 nodes, a thread holding few 16-byte runs
        # (contiguous inputs x runs, twice that prefetching, at most PW_MIN_BLOCKS_RUNS), no strided input.
        # The broadcast chain (2 x 2 runs) fits 32 registers there without a spill; at 32 registers the same
        # chain spills on sm_80 (60 bytes) and in half (48) / float (12) on sm_90 (ptxas, NVRTC 13.5), and
        # with s, b full (3 x 2 runs) it spilled 40 bytes and ran 631 instead of 508 us (H200, run 2)
        minb = int(sw.PW_MIN_BLOCKS)
        held = sum(1 for a, (_, role) in zip(access, prog.operands) if a == "c" and role == "in") * self.runs
        outs = [tag for tag, role in prog.operands if role != "in"]
        if ("g" in access or held * (2 if sw.PW_PREFETCH else 1) > int(sw.PW_MIN_BLOCKS_RUNS)
                or not str(handle.arch).startswith("sm_90") or not outs or any(t != "bf16" for t in outs)
                or len(prog.nodes) > 8):
            minb = 0
        self.min_blocks = minb
        self.unit, self.expr = cg.kernel_unit(prog, len(cdims), elems, wide, access, self.runs, bool(sw.PW_SPLIT),
                                              minb, bool(sw.PW_PREFETCH))
        _compile(handle, self.unit)
        self.params = cg.params(cdims, cstrides, [0] * len(uids))
        self.args = driver.kernel_args(self.params)
        # vector loads / stores (p.flags bit 0) where the strides allow them (checked here) and every
        # contiguous operand's pointer is aligned to the widest run (elems of the widest type; checked per
        # launch: one OR of the pointers against one mask, conservative for the narrower types)
        self.vec_static = elems > 1 and cg.vector_ok(cdims, cstrides, elems)
        contig = [k for k, a in enumerate(access) if a == "c"]
        self.vec_mask = max([elems * esizes[k] for k in contig] or [1]) - 1
        self.vec_ops = tuple(contig)
        self.uids = tuple(uids)
        self.launches = 1
        self.fn = (None, None)  # (handle, CUfunction) of the last handle
        self.crec, self.crec_addr = None, 0  # fastcall's record of the last handle's launch (patch_launch)

    def _resolve(self, handle):
        fn = handle.function(self.unit.name, self.expr)
        if self.per_sm <= 0:  # waves of the blocks resident at once (occupancy of this kernel), never more than the work
            key = ("graph.pw occupancy", self.unit.name)
            n = handle.prepared.get(key)
            if n is None:
                n = handle.remember(key, _resident_blocks(handle, fn, cg.THREADS))
            if n > 0:
                self.grid = (max(1, min(self.work_blocks, self.waves * min(n, 8) * handle.sm_count)), 1, 1)
        self.fn = (handle, fn)
        # the compiled patch + launch (fastcall.patch_launch): the pointers at p.ptr[k], the vector flag from
        # the OR of the contiguous operands' pointers, cuLaunchKernel - one C call instead of a ctypes write a
        # pointer and driver.launch_args (tests/graph/test_graph_patch_launch_cpu.py: the same bytes launched)
        self.crec = None
        if _patch_launch() is not None:
            sel = 0
            for k in self.vec_ops:
                sel |= 1 << k
            off = cg.GraphPwParams.ptr.offset
            self.crec = fastcall.patch_record(fn, self.grid, (cg.THREADS, 1, 1), 0, self.params, self.args[1],
                                              [off + 8 * k for k in range(len(self.uids))], self.vec_mask, sel,
                                              cg.GraphPwParams.flags.offset if self.vec_static else None)
        self.crec_addr = ctypes.addressof(self.crec) if self.crec is not None else 0
        return self.fn

    def run(self, handle, ptr):
        fn = self.fn
        if fn[0] is not handle:
            fn = self._resolve(handle)
        c = self.crec_addr
        if c and driver._drv is driver._fast_drv and driver.launch_args is _LAUNCH_ARGS and not driver._recorders:
            err = _PATCH[0](c, handle.stream, ptr, self.uids)
            if err:
                driver.raise_status(err)
            return
        p = self.params
        pp = p.ptr
        for k, u in enumerate(self.uids):
            pp[k] = ptr[u]
        if self.vec_static:
            bits = 0
            for k in self.vec_ops:
                bits |= ptr[self.uids[k]]
            p.flags = 0 if bits & self.vec_mask else 1
        driver.launch_args(fn[1], self.grid, (cg.THREADS, 1, 1), 0, handle.cu_stream, self.args)


class MatmulStep:
    def __init__(self, handle, g, op, storage):
        from ..ops import matmul as M

        a, b, c = (g.tensors[op.inputs["a"]], g.tensors[op.inputs["b"]], g.tensors[op.outputs["c"]])
        self.swap, kw = layout((storage[a.uid], a.dims, a.strides), (storage[b.uid], b.dims, b.strides),
                               (storage[c.uid], c.dims, c.strides), ("A", "B", "C"))
        self.plan = M.gemm_plan(handle, **kw)
        self.uids = (a.uid, b.uid, c.uid)
        self.launches = 0 if self.plan.empty else 1

    def run(self, handle, ptr):
        a, b, c = (ptr[u] for u in self.uids)
        if self.swap:
            a, b = b, a
        self.plan.launch(handle, a, b, c, 1.0, 0.0)


class ReduceStep:
    def __init__(self, handle, g, op, storage, ws_offset):
        import pydnn

        x, y = g.tensors[op.inputs["x"]], g.tensors[op.outputs["y"]]
        self.xd, self.yd = pydnn.create_tensor_descriptor(), pydnn.create_tensor_descriptor()
        pydnn.set_tensor_nd_descriptor(self.xd, storage[x.uid], len(x.dims), list(x.dims), list(x.strides))
        pydnn.set_tensor_nd_descriptor(self.yd, storage[y.uid], len(y.dims), list(y.dims), list(y.strides))
        self.rd = pydnn.create_reduce_tensor_descriptor()
        pydnn.set_reduce_tensor_descriptor(self.rd, op.params["op"], E.PYDNN_DATA_FLOAT, E.PYDNN_NOT_PROPAGATE_NAN,
                                           E.PYDNN_REDUCE_TENSOR_NO_INDICES, E.PYDNN_32BIT_INDICES)
        self.ws_size = pydnn.get_reduction_workspace_size(handle, self.rd, self.xd, self.yd)
        self.ws_offset = ws_offset
        self.uids = (x.uid, y.uid)
        self.launches = None  # reduce_tensor chooses (one or two kernels)

    def run(self, handle, ptr):
        import pydnn

        ws = ptr["workspace"] + self.ws_offset if self.ws_size else 0
        pydnn.reduce_tensor(handle, self.rd, 0, 0, ws, self.ws_size, 1.0, self.xd, ptr[self.uids[0]], 0.0, self.yd,
                            ptr[self.uids[1]])


CONV = {  # kind: (activation-side roles, filter role, the output role, pydnn call suffix)
    "conv_fprop": ("x", "w", "y", "forward"), "conv_dgrad": ("dy", "w", "dx", "backward_data"),
    "conv_wgrad": ("x", "dy", "dw", "backward_filter"),
}


def _filter_format(t):
    """PYDNN_TENSOR_NCHW or NHWC for a packed filter tensor [K, C, *spatial], else None."""
    dims, st = list(t.dims), list(t.strides)
    packed = [0] * len(dims)
    acc = 1
    for i in range(len(dims) - 1, -1, -1):
        packed[i] = acc
        acc *= dims[i]
    if all(s == p or d == 1 for s, p, d in zip(st, packed, dims)):
        return E.PYDNN_TENSOR_NCHW
    order = [0] + list(range(2, len(dims))) + [1]  # K, spatial..., C
    nhwc = [0] * len(dims)
    acc = 1
    for i in reversed(order):
        nhwc[i] = acc
        acc *= dims[i]
    if all(s == p or d == 1 for s, p, d in zip(st, nhwc, dims)):
        return E.PYDNN_TENSOR_NHWC
    return None


class ConvStep:
    """One public pydnn convolution call (forward, backward data or backward filter), its algorithm chosen
    by pydnn's heuristic (get_convolution_*_algorithm_v7) when the plan is built."""

    def __init__(self, handle, g, op, storage, ws_offset):
        import pydnn

        self.kind = op.kind
        tens = {r: g.tensors[u] for r, u in list(op.inputs.items()) + list(op.outputs.items())}
        wrole = "dw" if op.kind == "conv_wgrad" else "w"
        descs = {}
        for r, t in tens.items():
            if r == wrole:
                d = pydnn.create_filter_descriptor()
                pydnn.set_filter_nd_descriptor(d, storage[t.uid], _filter_format(t), len(t.dims), list(t.dims))
            else:
                d = pydnn.create_tensor_descriptor()
                pydnn.set_tensor_nd_descriptor(d, storage[t.uid], len(t.dims), list(t.dims), list(t.strides))
            descs[r] = d
        cd = pydnn.create_convolution_descriptor()
        p = op.params
        pydnn.set_convolution_nd_descriptor(cd, len(p["pad"]), p["pad"], p["stride"], p["dil"], p["mode"],
                                            p["comp_type"])
        if storage[tens[wrole].uid] in (E.PYDNN_DATA_HALF, E.PYDNN_DATA_BFLOAT16):
            pydnn.set_convolution_math_type(cd, E.PYDNN_TENSOR_OP_MATH)
        if op.kind == "conv_fprop":
            order = (descs["x"], descs["w"], cd, descs["y"])
            perf = pydnn.get_convolution_forward_algorithm_v7(handle, *order, 8)
            size = pydnn.get_convolution_forward_workspace_size
        elif op.kind == "conv_dgrad":
            order = (descs["w"], descs["dy"], cd, descs["dx"])
            perf = pydnn.get_convolution_backward_data_algorithm_v7(handle, *order, 8)
            size = pydnn.get_convolution_backward_data_workspace_size
        else:
            order = (descs["x"], descs["dy"], cd, descs["dw"])
            perf = pydnn.get_convolution_backward_filter_algorithm_v7(handle, *order, 8)
            size = pydnn.get_convolution_backward_filter_workspace_size
        ok = [r for r in perf if r.status == E.PYDNN_STATUS_SUCCESS]
        if not ok:
            raise PydnnError(E.PYDNN_STATUS_NOT_SUPPORTED, f"{op.kind}: no pydnn convolution algorithm runs it")
        self.algo = ok[0].algo
        self.ws_size = size(handle, *order, self.algo)
        self.ws_offset, self.descs, self.cd, self.alpha = ws_offset, descs, cd, float(p["alpha"])
        self.uids = {r: t.uid for r, t in tens.items()}
        self.launches = None  # an algorithm may take several kernels

    def run(self, handle, ptr):
        import pydnn

        d, u = self.descs, self.uids
        ws = ptr["workspace"] + self.ws_offset if self.ws_size else 0
        if self.kind == "conv_fprop":
            pydnn.convolution_forward(handle, self.alpha, d["x"], ptr[u["x"]], d["w"], ptr[u["w"]], self.cd, self.algo,
                                      ws, self.ws_size, 0.0, d["y"], ptr[u["y"]])
        elif self.kind == "conv_dgrad":
            pydnn.convolution_backward_data(handle, self.alpha, d["w"], ptr[u["w"]], d["dy"], ptr[u["dy"]], self.cd,
                                            self.algo, ws, self.ws_size, 0.0, d["dx"], ptr[u["dx"]])
        else:
            pydnn.convolution_backward_filter(handle, self.alpha, d["x"], ptr[u["x"]], d["dy"], ptr[u["dy"]], self.cd,
                                              self.algo, ws, self.ws_size, 0.0, d["dw"], ptr[u["dw"]])


class EnginePlan:
    def __init__(self, steps, offsets, workspace_size):
        self.steps, self.offsets, self.workspace_size = steps, offsets, workspace_size
        # one step and no virtual tensors (every fused plan): Graph.execute calls the step itself
        self.single = steps[0] if len(steps) == 1 and not offsets else None

    @property
    def launches(self):
        n = [s.launches for s in self.steps]
        return None if None in n else sum(n)

    def execute(self, handle, ptrs, workspace):
        """Enqueue the steps; `ptrs` ({uid: device pointer}, the caller's own dict) is completed in place
        with the virtual tensors' and the workspace's addresses."""
        if self.offsets:
            for uid, off in self.offsets.items():
                ptrs[uid] = workspace + off
        ptrs["workspace"] = workspace
        for s in self.steps:
            s.run(handle, ptrs)


# Hooks of the node modules (norm_nodes, sdpa_nodes, conv_fusion), filled when they are imported:
#   NODE_KINDS[kind]: an object with support(g, op, storage) -> reason or None, storage(g, op, storage)
#     (adjusts the dict of stored data types) and step(handle, g, op, storage, ws_offset) -> a step with
#     ws_size, launches and run(handle, ptr);
#   BY_VALUE[kind]: the input roles of that operation that may be pass-by-value (host) scalars;
#   FUSERS: objects with analyze(g) -> None (not theirs), a reason (str) or an analysis, and
#     build(handle, g, analysis) -> EnginePlan; tried by the fusion engine before its own patterns.
#   OTHER_DTYPES[kind]: {input role: data types} an operation takes beyond FLOAT / HALF / BFLOAT16 (sdpa's
#     INT32 sequence lengths).
NODE_KINDS, BY_VALUE, FUSERS, OTHER_DTYPES = {}, {}, [], {}


def _other_dtype_ok(g, t):
    users = [(op, r) for op in g.ops for r, u in op.inputs.items() if u == t.uid]
    return bool(users) and all(t.dtype in OTHER_DTYPES.get(op.kind, {}).get(r, ()) for op, r in users)


def _byvalue_ok(g, uid):
    users = [(op, r) for op in g.ops for r, u in op.inputs.items() if u == uid]
    return bool(users) and all(r in BY_VALUE.get(op.kind, ()) for op, r in users)


def _common_support(g):
    for t in g.tensors.values():
        if t.by_value:
            if _byvalue_ok(g, t.uid):
                continue
            return f"tensor uid {t.uid} is by value (pass-by-value scalars are not supported yet)"
        if t.dtype not in TAGS and not _other_dtype_ok(g, t):
            return f"tensor uid {t.uid}: data type {t.dtype} (pydnn's graph engines take FLOAT, HALF, BFLOAT16)"
    return None


def _storage(g):
    """Data type each tensor is stored in: its own, except a virtual matmul output whose type differs from
    A's (pydnn's GEMM writes C in A's type; the rounding is that of the graph's output type or finer)."""
    st = {u: t.dtype for u, t in g.tensors.items()}
    for op in g.ops:
        if op.kind == "matmul":
            c = g.tensors[op.outputs["c"]]
            if c.virtual:
                st[c.uid] = g.tensors[op.inputs["a"]].dtype
        elif op.kind in CONV:
            src, _, out, _ = CONV[op.kind]
            o = g.tensors[op.outputs[out]]
            if o.virtual:  # pydnn's convolutions write the type they read (as a virtual matmul output)
                st[o.uid] = g.tensors[op.inputs[src]].dtype
        elif op.kind in NODE_KINDS:
            NODE_KINDS[op.kind].storage(g, op, st)
    return st


def _pw_node(op, ref):
    return cg.PwNode(op.params["mode"], op.params["params"], op.params["alpha1"], op.params["alpha2"],
                     x=ref(op.inputs["x"]), b=ref(op.inputs["b"]) if "b" in op.inputs else None,
                     t=ref(op.inputs["t"]) if "t" in op.inputs else None)


class NodeEngine:
    index, name, behavior = 0, "pydnn.nodes", ()

    def support(self, g):
        why = _common_support(g)
        if why:
            return why
        st = _storage(g)
        for op in g.ops:
            if op.kind == "matmul":
                a, b, c = (g.tensors[op.inputs["a"]], g.tensors[op.inputs["b"]], g.tensors[op.outputs["c"]])
                if op.params["comp_type"] != E.PYDNN_DATA_FLOAT:
                    return f"matmul: compute type {op.params['comp_type']} (pydnn accumulates in FLOAT)"
                if not (st[a.uid] == st[b.uid] == st[c.uid]):
                    return (f"matmul: A, B and C (uids {a.uid}, {b.uid}, {c.uid}) need one data type "
                            f"(a virtual C is stored in A's)")
                try:
                    layout((st[a.uid], a.dims, a.strides), (st[b.uid], b.dims, b.strides), (st[c.uid], c.dims, c.strides))
                except PydnnError as e:
                    return f"matmul: {e.message}"
            elif op.kind in CONV:
                tens = [g.tensors[u] for u in list(op.inputs.values()) + list(op.outputs.values())]
                if len({st[t.uid] for t in tens}) != 1:
                    return f"{op.kind}: x, w and y need one data type (a virtual output is stored in its input's)"
                w = g.tensors[op.outputs["dw"] if op.kind == "conv_wgrad" else op.inputs["w"]]
                if _filter_format(w) is None:
                    return f"{op.kind}: the filter (uid {w.uid}) must be packed NCHW or NHWC, strides {w.strides}"
            elif op.kind in NODE_KINDS:
                why = NODE_KINDS[op.kind].support(g, op, st)
                if why:
                    return why
        return None

    def build(self, g, handle):
        st = _storage(g)
        offsets, off = {}, 0
        for uid in g.virtuals:
            offsets[uid] = off
            off += (_span(g.tensors[uid], st[uid]) + ALIGN - 1) // ALIGN * ALIGN
        steps, red_ws = [], 0
        for op in g.order:
            if op.kind == "pointwise":
                out_uid = next(iter(op.outputs.values()))
                out = g.tensors[out_uid]
                roles = [r for r in ("x", "b", "t") if r in op.inputs]
                uids = [op.inputs[r] for r in roles] + [out_uid]
                operands = [(TAGS[st[u]], "in") for u in uids[:-1]] + [(TAGS[st[out_uid]], "out")]
                node = _pw_node(op, lambda u: ("op", uids.index(u)))
                prog = cg.PwProgram(operands, [node], [(0, len(uids) - 1)])
                steps.append(PwStep(handle, prog, list(out.dims),
                                    [_bcast_strides(g.tensors[u], out.dims) for u in uids], uids))
            elif op.kind == "matmul":
                steps.append(MatmulStep(handle, g, op, st))
            elif op.kind == "reduction":
                s = ReduceStep(handle, g, op, st, off)
                red_ws = max(red_ws, s.ws_size)
                steps.append(s)
            elif op.kind in CONV:
                s = ConvStep(handle, g, op, st, off)
                red_ws = max(red_ws, s.ws_size)
                steps.append(s)
            elif op.kind in NODE_KINDS:
                s = NODE_KINDS[op.kind].step(handle, g, op, st, off)
                red_ws = max(red_ws, s.ws_size)
                steps.append(s)
        return EnginePlan(steps, offsets, off + red_ws)


def _zeroed_u32(handle, n):
    """A zeroed device array of n uint32 in the handle's context (allocated and cleared at build)."""
    import numpy as np

    from .._cuda.memory import DeviceArray

    with driver.pushed(handle.ctx):
        arr = DeviceArray((max(n, 1),), np.uint32)
        arr.fill_bytes(0)
    return arr


class FusedMatmulStep:
    """ONE launch: pydnn's GEMM (tile chosen as pydnn.ops.matmul chooses it) with the graph's pointwise ops
    generated into its epilogue (codegen.matmul_source). Everything but the pointers is set at build: the
    two launch records (fast tile, general path), their argument arrays, the epilogue's access kinds; run
    patches pointers and flags and launches (the host path counted by tests/graph/test_graph_host_cpu.py)."""

    def __init__(self, handle, g, an):
        import ctypes

        from ..ops import matmul as M

        a, b, final = an["a"], an["b"], an["final"]
        self.swap, kw = layout((a.dtype, a.dims, a.strides), (b.dtype, b.dims, b.strides),
                               (a.dtype, final.dims, final.strides), ("A", "B", "C"))
        self.plan = plan = M.gemm_plan(handle, **kw)
        tag = TAGS[a.dtype]
        fast = M._choose_tile(plan.m, plan.n, plan.batch, handle.sm_count, handle.arch, plan.k)
        # where the plain planner runs gemm_tma, so does the fused GEMM (pydnn.ops.matmul.fused_tma; owner: gemm)
        tma = M.fused_tma(handle, plan, red=an.get("red") is not None)
        fast_rec = plan.fast if tma is None else tma[1]
        if tma is not None:
            fast = tma[0]
        self.c16_ok = tma is not None and plan.c16_ok
        shape = final.dims
        strides, access, self.pair_static = [], [], 0
        shape3 = ([1] + list(shape)) if len(shape) == 2 else list(shape)
        for k, u in enumerate(an["eops"]):
            t = g.tensors[u]
            s = _bcast_strides(t, shape)
            s = ([0] + s) if len(s) == 2 else s
            s = [0 if d == 1 else v for d, v in zip(shape3, s)]  # a dim of one: never stepped
            if self.swap:
                s = [s[0], s[2], s[1]]
            strides.append(s)
            kind = "b" if s[2] == 0 and u in g.inputs else "c" if s[2] == 1 else "g"
            access.append(kind.upper() if s[1] == 0 and u in g.inputs else kind)
            # a contiguous input is read in pairs where every (batch, row) start is even (and the pointer
            # 2-element aligned: checked per call)
            if kind == "c" and u in g.inputs and s[0] % 2 == 0 and s[1] % 2 == 0:
                self.pair_static |= 1 << k
        red, self.store_c = an.get("red"), an.get("store_c", True)
        # gemm_tma's cooperative tile may stage the epilogue's column operands per tile (owner: gemm)
        stage_bn, widen = 0, False
        if tma is not None and tuning.matmul.FUSED_STAGE and red is None and not fast.pp:
            # tuning.matmul.EPI_WIDEN: 16-bit column operands held as float there (where they fit: else raw)
            widen = (tuning.matmul.EPI_WIDEN and fast.bn == 256
                     and cg.stage_plan(an["prog"], access, fast.bn, True)[1] > 0)
            sb = cg.stage_plan(an["prog"], access, fast.bn, widen)[1]
            if sb:
                stage_bn = fast.bn
                fast_rec.smem += cg.stage_smem(sb)
        # gemm_tma's cooperative tile may store through stmatrix (tuning.matmul.EPI_STSM; owner: gemm)
        stsm = (tma is not None and tuning.matmul.EPI_STSM and not fast.pp and fast.cm == 1 and tag != "f32"
                and self.store_c)
        if stsm:
            fast_rec.smem += cg.stsm_smem(cg.stage_plan(an["prog"], access, fast.bn, widen)[1] if stage_bn else 0)
        self.unit, fe, ge = cg.matmul_unit(an["prog"], an["final_ref"], tag, fast, M.TC_GENERAL,
                                           plan.trans_a, plan.trans_b, access, red, self.store_c, stage_bn, stsm,
                                           widen and stage_bn > 0,
                                           tuning.matmul.EPI_CHUNK if stsm and stage_bn > 0 else 0)
        _compile(handle, self.unit)
        self.e = cg.params([1, 1, 1], strides, [0] * len(an["eops"]))
        self.eops = tuple(an["eops"])
        # a row reduction: per launch, tiles_n x (warps along n) partials a row in the workspace, and one
        # counter per (batch, row tile) in memory the plan owns (zeroed here; every launch leaves them 0)
        self.red_slot, self.workspace_size, self.counters = None, 0, None
        if red is not None:
            parts = cnt = 0
            for rec, tile in ((fast_rec, fast), (plan.general, M.TC_GENERAL)):
                split = tile.wn if hasattr(tile, "wm") else 1
                p = rec.params.p if rec.maps is not None else rec.params
                parts = max(parts, p.tiles_n * split)
                cnt = max(cnt, p.tiles_m)
            self.workspace_size = plan.batch * parts * plan.m * 4
            self.counters = _zeroed_u32(handle, plan.batch * cnt)
            self.red_slot = len(self.eops)
            self.e.ptr[self.red_slot + 1] = self.counters.ptr
        self.pair_align = [2 * ESIZE[g.tensors[u].dtype] - 1 for u in self.eops]
        self.recs = []
        for rec, expr in ((fast_rec, fe), (plan.general, ge)):
            p = rec.params.p if rec.maps is not None else rec.params
            p.bias, p.alpha, p.beta = 0, 1.0, 0.0
            arr = (ctypes.c_void_p * 2)(ctypes.addressof(rec.params), ctypes.addressof(self.e))
            self.recs.append((rec, expr, (arr, ctypes.addressof(arr), rec.params, self.e)))
        self.uids = (a.uid, b.uid, final.uid)
        self.es = ESIZE[a.dtype]
        self.vec_ok, self.pair_ok = plan.vec_ok, plan.pair_ok
        self.fn = (None, None, None)  # (handle, fast CUfunction, general CUfunction) of the last handle
        self.launches = 1

    def _functions(self, handle):
        fns = tuple(handle.function(self.unit.name, expr, rec.smem) for rec, expr, _ in self.recs)
        if self.red_slot is not None:
            # the reduction's static shared word: a tile whose ring is exactly 48 KiB (the 64x64 one) needs
            # the opt-in too (dynamic + static past the default; the H200 refused the launch without it)
            for f, (rec, _, _) in zip(fns, self.recs):
                driver.function_set_max_dynamic_smem(f, rec.smem)
        self.fn = (handle,) + fns
        return self.fn

    def run(self, handle, ptr):
        ua, ub, uc = self.uids
        a, b = ptr[ua], ptr[ub]
        c = ptr[uc] if self.store_c else 0
        if self.swap:
            a, b = b, a
        fast = self.vec_ok and (a | b) & 15 == 0
        rec, _, args = self.recs[0 if fast else 1]
        p = rec.params
        flags = FLAG_PAIR if (self.pair_ok and c % (2 * self.es) == 0) else 0
        if rec.maps is not None:  # gemm_tma: A's and B's maps (encoded once per base address) copied in
            _memmove(p.map_a, rec.maps[0].get(a), 128)
            _memmove(p.map_b, rec.maps[1].get(b), 128)
            p = p.p
            if self.c16_ok and c % 16 == 0:
                flags |= FLAG_C16
        p.a, p.b, p.c = a, b, c
        p.flags = flags
        e = self.e
        flags = self.pair_static
        for k, u in enumerate(self.eops):
            v = ptr[u]
            e.ptr[k] = v
            if v & self.pair_align[k]:
                flags &= ~(1 << k)
        e.flags = flags
        if self.red_slot is not None:
            e.ptr[self.red_slot] = ptr["workspace"]
        fn = self.fn if self.fn[0] is handle else self._functions(handle)
        driver.launch_args(fn[1] if fast else fn[2], rec.grid, rec.block, rec.smem, handle.cu_stream, args)


RED_NAMES = {getattr(E, "PYDNN_REDUCE_TENSOR_" + n): n for n in cg.RED}


def _row_reduction(g, shape):
    """The one reduction of a fusable matmul graph (None if none) as (op, its x, its y), or the reason it
    cannot fuse: it reduces the matmul result's last dim only, in FLOAT, into a graph output no op reads."""
    reds = [op for op in g.ops if op.kind == "reduction"]
    if not reds:
        return None
    if len(reds) > 1:
        return "at most one reduction fuses into a matmul epilogue"
    op = reds[0]
    x, y = g.tensors[op.inputs["x"]], g.tensors[op.outputs["y"]]
    if op.params["op"] not in RED_NAMES:
        return f"reduction operator {op.params['op']} (the fused epilogue takes {', '.join(cg.RED)})"
    if op.params["comp_type"] != E.PYDNN_DATA_FLOAT:
        return f"reduction compute type {op.params['comp_type']} (the fused epilogue reduces in FLOAT)"
    if list(x.dims) != list(shape) or list(y.dims) != list(shape[:-1]) + [1]:
        return (f"a fused reduction reduces the matmul result's last dim: X dims {x.dims} must be {list(shape)} "
                f"and Y dims {y.dims} {list(shape[:-1]) + [1]}")
    if y.virtual or y.uid not in g.outputs or any(y.uid in o.inputs.values() for o in g.ops):
        return f"the reduction's Y (uid {y.uid}) must be a graph output that no operation reads"
    if y.dtype not in TAGS:
        return f"tensor uid {y.uid}: data type {y.dtype}"
    return op, x, y


def _matmul_epilogue(g):
    """How a graph of one matmul, pointwise ops and at most one row reduction (of the epilogue's result)
    fuses into one GEMM kernel, or the reason it cannot."""
    mms = [op for op in g.ops if op.kind == "matmul"]
    if len(mms) != 1 or any(op.kind not in ("matmul", "pointwise", "reduction") for op in g.ops):
        return "runtime fusion takes pointwise graphs, or one matmul with a pointwise (and row reduction) epilogue"
    mm = mms[0]
    a, b, c = g.tensors[mm.inputs["a"]], g.tensors[mm.inputs["b"]], g.tensors[mm.outputs["c"]]
    if a.uid not in g.inputs or b.uid not in g.inputs:
        return "the matmul's A and B must be graph inputs (no prologue fusion yet)"
    if not (a.dtype == b.dtype and a.dtype in (E.PYDNN_DATA_HALF, E.PYDNN_DATA_BFLOAT16)):
        return "a fused matmul takes HALF or BFLOAT16 A and B (FLOAT runs on the node engine)"
    if mm.params["comp_type"] != E.PYDNN_DATA_FLOAT:
        return f"matmul compute type {mm.params['comp_type']} (pydnn accumulates in FLOAT)"
    shape = c.dims
    if len(shape) not in (2, 3):
        return f"a fused matmul output has 2 or 3 dims, not {len(shape)}"
    red = _row_reduction(g, shape)
    if isinstance(red, str):
        return red
    red_y = red[2].uid if red else None
    for t in g.tensors.values():
        if t.uid in (a.uid, b.uid, red_y):
            continue
        if len(t.dims) != len(shape) or any(d != s and d != 1 for d, s in zip(t.dims, shape)):
            return f"tensor uid {t.uid} dims {t.dims} do not broadcast to the matmul output's {shape}"
    order = [op for op in g.order if op.kind == "pointwise"]
    produced = {c.uid: None}
    for j, op in enumerate(order):
        produced[next(iter(op.outputs.values()))] = j
    if red:
        # the reduced value is the GEMM's final value: stored through C when it is a graph output
        x = red[1]
        if x.uid not in produced:
            return f"the reduction's X (uid {x.uid}) is not the matmul's result or computed from it"
        if any(x.uid == u for u in g.outputs):
            if x.dtype != a.dtype:
                return f"the reduced tensor uid {x.uid} is a graph output of another data type than A's"
            cands = [x.uid]
        else:
            cands = []
            final = x
    else:
        cands = [u for u in g.outputs if g.tensors[u].dims == shape and g.tensors[u].dtype == a.dtype]
    store_c = not (red and not cands)
    if store_c:
        final = None
        for u in sorted(cands, key=lambda u: -1 if produced.get(u) is None else produced[u], reverse=True):
            t = g.tensors[u]
            try:
                layout((a.dtype, a.dims, a.strides), (b.dtype, b.dims, b.strides), (t.dtype, t.dims, t.strides))
            except PydnnError:
                continue
            final = t
            break
        if final is None:
            return "no graph output can take the GEMM's store (A's data type, the matmul's shape, a matrix layout)"
    else:
        try:
            swap, _ = layout((a.dtype, a.dims, a.strides), (b.dtype, b.dims, b.strides), (a.dtype, final.dims, final.strides))
        except PydnnError as e:
            return f"the reduced tensor's layout: {e.message}"
    if red:
        swap, _ = layout((a.dtype, a.dims, a.strides), (b.dtype, b.dims, b.strides), (a.dtype, final.dims, final.strides))
        if swap:
            return "a fused row reduction needs a row-major matmul result (this one is column-major)"
    ins = [u for u in g.inputs if u not in (a.uid, b.uid)]
    if any(u in op.inputs.values() for op in order for u in (a.uid, b.uid)):
        return "the epilogue reads the matmul's A or B"
    outs = [u for u in g.outputs if u != final.uid and u != red_y]
    eops = ins + outs + ([red_y] if red else [])
    if len(eops) + (2 if red else 0) > cg.MAX_OPERANDS:
        return f"{len(eops)} epilogue tensors (at most {cg.MAX_OPERANDS - (2 if red else 0)} with a reduction)"
    for t in (g.tensors[u] for u in eops):
        if t.dtype not in TAGS:
            return f"tensor uid {t.uid}: data type {t.dtype}"

    def ref(u):
        if u == c.uid:
            return ("acc", 0)
        if u in produced and produced[u] is not None:
            return ("v", produced[u])
        return ("op", eops.index(u))

    nodes = [_pw_node(op, ref) for op in order]
    stores = [(-1 if produced[u] is None else produced[u], eops.index(u)) for u in outs]
    operands = [(TAGS[g.tensors[u].dtype], "in") for u in ins] + \
               [(TAGS[g.tensors[u].dtype], "out") for u in outs + ([red_y] if red else [])]
    rinfo = dict(mode=RED_NAMES[red[0].params["op"]], y=eops.index(red_y)) if red else None
    return dict(a=a, b=b, final=final, final_ref=ref(final.uid), eops=eops, red=rinfo, store_c=store_c,
                prog=cg.PwProgram(operands, nodes, stores))


ACTS = {"RELU_FWD": "RELU", "SIGMOID_FWD": "SIGMOID", "TANH_FWD": "TANH", "ELU_FWD": "ELU", "IDENTITY": "IDENTITY"}


def _conv_epilogue(g):
    """How conv_fprop -> add bias [1, K, 1, ...] (-> add z) -> activation maps onto pydnn's
    convolution_bias_activation_forward (the epilogue in the convolution kernel), or the reason it cannot."""
    convs = [op for op in g.ops if op.kind == "conv_fprop"]
    if len(convs) != 1 or any(op.kind not in ("conv_fprop", "pointwise") for op in g.ops):
        return "runtime fusion takes one convolution with a bias / residual / activation epilogue"
    conv = convs[0]
    x, w, c = g.tensors[conv.inputs["x"]], g.tensors[conv.inputs["w"]], g.tensors[conv.outputs["y"]]
    if x.uid not in g.inputs or w.uid not in g.inputs or x.dtype != w.dtype:
        return "the convolution's x and w must be graph inputs of one data type"
    if _filter_format(w) is None:
        return f"the filter (uid {w.uid}) must be packed NCHW or NHWC"
    if conv.params["alpha"] != 1.0:
        return "a scaled convolution (alpha != 1)"
    cur, bias, z, act = c.uid, None, None, None
    for op in [o for o in g.order if o.kind == "pointwise"]:
        if act is not None:
            return "operations after the activation"
        if not g.tensors[cur].virtual or cur not in op.inputs.values():
            return "the epilogue must be one chain from the convolution's (virtual) output"
        name = op.params["name"]
        others = [u for r, u in op.inputs.items() if u != cur]
        if name == "ADD" and len(others) == 1 and op.params["alpha1"] == op.params["alpha2"] == 1.0:
            t = g.tensors[others[0]]
            if t.virtual or t.dtype != x.dtype:
                return f"tensor uid {t.uid}: an epilogue operand must be a graph input of x's data type"
            if bias is None and list(t.dims) == [1, c.dims[1]] + [1] * (len(c.dims) - 2):
                bias = t
            elif z is None and t.dims == c.dims:
                z = t
            else:
                return f"an add of tensor uid {t.uid} (dims {t.dims}) that is neither a bias nor a residual"
        elif name in ACTS and not others and op.params["alpha1"] == 1.0:
            pr = op.params["params"]
            if name == "RELU_FWD" and (pr.get("lower", 0.0) != 0.0 or pr.get("slope", 0.0) != 0.0):
                return "a ReLU with a lower clip or slope"
            act = op
        else:
            return f"pointwise {name} in a convolution epilogue (bias, residual add, activation only)"
        cur = next(iter(op.outputs.values()))
    y = g.tensors[cur]
    if bias is None:
        return "a convolution epilogue needs a bias"
    if y.virtual or g.outputs != [y.uid] or y.dtype != x.dtype or y.dims != c.dims:
        return "the epilogue's result must be the graph's one output, of x's data type"
    return dict(x=x, w=w, y=y, z=z, bias=bias, act=act, conv=conv)


class ConvBiasActStep:
    """pydnn.convolution_bias_activation_forward: the convolution with the bias, residual and activation in
    its kernel's epilogue."""

    def __init__(self, handle, g, an):
        import pydnn

        conv = an["conv"]
        p = conv.params

        def tdesc(t):
            d = pydnn.create_tensor_descriptor()
            pydnn.set_tensor_nd_descriptor(d, t.dtype, len(t.dims), list(t.dims), list(t.strides))
            return d

        self.xd, self.yd, self.bd = tdesc(an["x"]), tdesc(an["y"]), tdesc(an["bias"])
        self.zd = tdesc(an["z"]) if an["z"] is not None else self.yd
        w = an["w"]
        self.wd = pydnn.create_filter_descriptor()
        pydnn.set_filter_nd_descriptor(self.wd, w.dtype, _filter_format(w), len(w.dims), list(w.dims))
        self.cd = pydnn.create_convolution_descriptor()
        pydnn.set_convolution_nd_descriptor(self.cd, len(p["pad"]), p["pad"], p["stride"], p["dil"], p["mode"],
                                            p["comp_type"])
        if w.dtype in (E.PYDNN_DATA_HALF, E.PYDNN_DATA_BFLOAT16):
            pydnn.set_convolution_math_type(self.cd, E.PYDNN_TENSOR_OP_MATH)
        self.ad = pydnn.create_activation_descriptor()
        act, coef, mode = an["act"], 0.0, E.PYDNN_ACTIVATION_IDENTITY
        if act is not None:
            name, pr = act.params["name"], act.params["params"]
            mode = getattr(E, "PYDNN_ACTIVATION_" + ACTS[name])
            if name == "RELU_FWD" and pr.get("upper", float("inf")) != float("inf"):
                mode, coef = E.PYDNN_ACTIVATION_CLIPPED_RELU, pr["upper"]
            if name == "ELU_FWD":
                coef = pr.get("elu_alpha", 1.0)
        pydnn.set_activation_descriptor(self.ad, mode, E.PYDNN_NOT_PROPAGATE_NAN, coef)
        perf = pydnn.get_convolution_forward_algorithm_v7(handle, self.xd, self.wd, self.cd, self.yd, 8)
        ok = [r.algo for r in perf if r.status == E.PYDNN_STATUS_SUCCESS]
        if not ok:
            raise PydnnError(E.PYDNN_STATUS_NOT_SUPPORTED, "conv_fprop: no pydnn convolution algorithm runs it")
        # the implicit GEMMs: the epilogue in the one convolution kernel (other algorithms run it too)
        prefer = [a for a in (E.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
                              E.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM) if a in ok]
        self.algo = (prefer or ok)[0]
        self.ws_size = pydnn.get_convolution_forward_workspace_size(handle, self.xd, self.wd, self.cd, self.yd,
                                                                    self.algo)
        self.uids = dict(x=an["x"].uid, w=w.uid, y=an["y"].uid, bias=an["bias"].uid,
                         z=an["z"].uid if an["z"] is not None else None)
        self.launches = None  # the convolution plan's (one kernel, two with a split-K fold)

    def run(self, handle, ptr):
        import pydnn

        u = self.uids
        ws = ptr["workspace"] if self.ws_size else 0
        z = ptr[u["z"]] if u["z"] is not None else ptr[u["y"]]
        pydnn.convolution_bias_activation_forward(
            handle, 1.0, self.xd, ptr[u["x"]], self.wd, ptr[u["w"]], self.cd, self.algo, ws, self.ws_size,
            1.0 if u["z"] is not None else 0.0, self.zd, z, self.bd, ptr[u["bias"]], self.ad, self.yd, ptr[u["y"]])


class FusionEngine:
    index, name, behavior = 1, "pydnn.fusion", (E.PYDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION,)

    def support(self, g):
        for f in FUSERS:  # (a fuser checks data types and by-value tensors itself)
            an = f.analyze(g)
            if an is not None:
                return an if isinstance(an, str) else None
        why = _common_support(g)
        if why:
            return why
        kinds = {op.kind for op in g.ops}
        if kinds & set(NODE_KINDS):
            return f"no fused form of a graph with {', '.join(sorted(kinds & set(NODE_KINDS)))} in this shape"
        if "matmul" in kinds:
            an = _matmul_epilogue(g)
            return an if isinstance(an, str) else None
        if "conv_fprop" in kinds:
            an = _conv_epilogue(g)
            return an if isinstance(an, str) else None
        if kinds != {"pointwise"}:
            return (f"runtime fusion takes graphs of pointwise operations, or one matmul with a pointwise "
                    f"epilogue (this one has {', '.join(sorted(kinds - {'pointwise'}))})")
        shape = g.tensors[g.outputs[0]].dims if g.outputs else None
        if shape is None:
            return "the graph writes no tensor"
        for u in g.outputs:
            if g.tensors[u].dims != shape:
                return f"outputs of different shapes ({g.tensors[u].dims} and {shape}) cannot share one kernel"
        for t in g.tensors.values():
            if len(t.dims) != len(shape) or any(d != s and d != 1 for d, s in zip(t.dims, shape)):
                return f"tensor uid {t.uid} dims {t.dims} do not broadcast to the output shape {shape}"
        if len(g.inputs) + len(g.outputs) > cg.MAX_OPERANDS:
            return f"{len(g.inputs) + len(g.outputs)} tensors (one fused kernel takes at most {cg.MAX_OPERANDS})"
        return None

    def build(self, g, handle):
        for f in FUSERS:
            an = f.analyze(g)
            if an is not None and not isinstance(an, str):
                return f.build(handle, g, an)
        if any(op.kind == "matmul" for op in g.ops):
            step = FusedMatmulStep(handle, g, _matmul_epilogue(g))
            return EnginePlan([step], {}, step.workspace_size)
        if any(op.kind == "conv_fprop" for op in g.ops):
            step = ConvBiasActStep(handle, g, _conv_epilogue(g))
            return EnginePlan([step], {}, step.ws_size)
        shape = list(g.tensors[g.outputs[0]].dims)
        uids = list(g.inputs) + list(g.outputs)
        operands = [(TAGS[g.tensors[u].dtype], "in") for u in g.inputs] + \
                   [(TAGS[g.tensors[u].dtype], "out") for u in g.outputs]
        value = {}
        nodes = []

        def ref(u):
            return ("v", value[u]) if u in value else ("op", uids.index(u))

        for op in g.order:
            nodes.append(_pw_node(op, ref))
            value[next(iter(op.outputs.values()))] = len(nodes) - 1
        stores = [(value[u], uids.index(u)) for u in g.outputs]
        prog = cg.PwProgram(operands, nodes, stores)
        step = PwStep(handle, prog, shape, [_bcast_strides(g.tensors[u], shape) for u in uids], uids)
        return EnginePlan([step], {}, 0)


ENGINES = (NodeEngine(), FusionEngine())


def heuristic(g, mode):
    """Engine indices in preference order for a heur mode: fusion first where it applies (INSTANT, A, B),
    the node engine alone for FALLBACK. Unsupported engines are left out."""
    order = [ENGINES[0]] if mode == E.PYDNN_HEUR_MODE_FALLBACK else [ENGINES[1], ENGINES[0]]
    return [e.index for e in order if e.support(g) is None]


