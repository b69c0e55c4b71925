"""Shared launch planning for element-wise kernels (ptx/common/elementwise.cuh).

`plan` collapses the iteration space of an output and its inputs: size-1 dims are dropped, dims are
ordered by the output's strides (innermost last) and adjacent dims merge when every operand is dense
across them. A fully dense problem becomes one flat dim, taken by the vectorised `map_contig` kernel;
anything else (other strides, broadcast inputs with stride 0) runs `map_strided`.
"""
import ctypes
import struct

from .. import tuning
from .._build import fastcall
from .._build.params import FLAG_BETA, FLAG_IN_BF16, FLAG_OUT_BF16, MAP_INPUTS, MAX_DIMS, MapParams
from .._cuda import driver

THREADS = 256  # block of the scalar-contiguous and strided kernels (kMapThreads)
TILE = 64  # map_transpose's tile along the output's dense dim (kTile); 128 along the input's for 16-bit
UNROLL = 4  # vectors per thread of the scalar-contiguous kernel (kMapUnroll)

# Geometry of the vectorised map_contig (template arguments; tools/PERF.md "Element-wise" has the
# measurements behind them, tools/bench_elementwise_sweep.py the sweep): threads per block and elements per
# thread (as whole vectors, at least one): PyTorch's geometry, the best of 12 on the H200 for memory-bound
# cases; an op may ask for more elements per thread (prepare_map's elems: 16-bit GELU takes 16).
CONTIG_THREADS = 128
CONTIG_ELEMS = 8
# map_contig's cache policy HINT (see ptx/common/elementwise.cuh): 1, evict-first streaming loads and
# stores, unless the op asks for 0 (prepare_map's hint).
CONTIG_HINT = 1

# C spellings of element types, for template name expressions
CTYPE = {"f32": "float", "f64": "double", "f16": "pydnn::half_t", "bf16": "pydnn::bf16_t",
         "i8": "signed char", "u8": "unsigned char", "i32": "int", "i64": "pydnn::i64"}
# The map kernels' own spellings: half and bfloat16 share one pydnn::h16_t instantiation (ptx/common/h16.cuh;
# the format of a launch is in MapParams.flags: FLAG_IN_BF16 / FLAG_OUT_BF16, set by fmt_flags), so the
# activation and tensor-op units compile one 16-bit unit instead of two (issue 21: the install time).
MAP_CTYPE = dict(CTYPE, f16="pydnn::h16_t", bf16="pydnn::h16_t")
# The unit tag of a data tag: f16 and bf16 -> h16 (activation.h16, tensor_ops.h16, tensor_ops.transform.h16, ...)
KTAG = {"f16": "h16", "bf16": "h16"}


def ktag(t):
    """The kernel-unit tag of data tag t (h16 for both 16-bit float types)."""
    return KTAG.get(t, t)


def unit_tags(tags):
    """The data tags whose units a family builds: bf16's are f16's (h16) while the fold is on."""
    return tuple(t for t in tags if not (KTAG and t == "bf16"))


def set_fold16(on):
    """The fold on (the default, what the install builds) or off: typed half_t / bf16_t instantiations in units
    named *.f16 / *.bf16, which the install does not build (tools/fold16.py --gpu compares the two, registering
    the typed units with the loader). In place, so that every module's reference sees it."""
    KTAG.clear()
    MAP_CTYPE.update(CTYPE)
    if on:
        KTAG.update(f16="h16", bf16="h16")
        MAP_CTYPE.update(f16="pydnn::h16_t", bf16="pydnn::h16_t")


def fmt_flags(ti, to):
    """MapParams.flags bits naming the 16-bit formats of a map from ti to to (h16_t instantiations)."""
    return (FLAG_IN_BF16 if ti == "bf16" else 0) | (FLAG_OUT_BF16 if (to or ti) == "bf16" else 0)


def contig_geometry(ti, to=None, elems=None):
    """(vector elements, threads, vectors per thread) of map_contig for a type pair; elems: elements per
    thread if not CONTIG_ELEMS (an op's own choice, e.g. 16 for compute-bound 16-bit activations)."""
    vec = vec_width(ti, to or ti)
    return vec, CONTIG_THREADS, max(1, (elems or CONTIG_ELEMS) // vec)


def contig_expr(op, ti, to=None, threads=None, unroll=None, hint=None, elems=None):
    """The vectorised map_contig instantiation (the planner's geometry and CONTIG_HINT unless given)."""
    vec, t, u = contig_geometry(ti, to, elems)
    t, u, h = threads or t, unroll or u, CONTIG_HINT if hint is None else hint
    return f"pydnn::map_contig<{MAP_CTYPE[ti]}, {MAP_CTYPE[to or ti]}, {op}, {vec}, {t}, {u}, {h}>"


def map_exprs(op, ti, to=None, hint=None, elems=None):
    """The three instantiations that serve one op on one type pair: vector, scalar-contiguous, strided.
    hint: the vector kernel's cache policy (CONTIG_HINT if None); elems: as in contig_geometry."""
    ci, co = MAP_CTYPE[ti], MAP_CTYPE[to or ti]
    return (contig_expr(op, ti, to, hint=hint, elems=elems),
            f"pydnn::map_contig<{ci}, {co}, {op}, 1>",
            f"pydnn::map_strided<{ci}, {co}, {op}>")


def transpose_expr(op, ti, to=None):
    """The tiled-transpose instantiation of a single-input op (see map_transpose)."""
    return f"pydnn::map_transpose<{MAP_CTYPE[ti]}, {MAP_CTYPE[to or ti]}, {op}>"


def transpose_order(ndim, strides):
    """If the collapsed problem is a batched transpose (output dense along its last dim, the input dense
    along another dim), the dim order that puts the input's dense dim second to last; else None."""
    out_s, in_s = strides[0], strides[1]
    if ndim < 2 or out_s[-1] != 1 or in_s[-1] == 1:
        return None
    dense_in = [d for d in range(ndim - 1) if in_s[d] == 1]
    if len(dense_in) != 1:
        return None
    j = dense_in[0]
    return [d for d in range(ndim - 1) if d != j] + [j, ndim - 1]


_SIZES = {"f32": 4, "f64": 8, "f16": 2, "bf16": 2, "i8": 1, "u8": 1, "i32": 4, "i64": 8}


def vec_width(ti, to):
    """Elements per vector access: 16 bytes of the wider type."""
    return max(1, 16 // max(_SIZES[ti], _SIZES[to]))


_plans = {}


def plan(out_dims, out_strides, inputs):
    """(ndim, sizes, [stride lists: out, in0, ...], dense) for an output and input (dims, strides) pairs.

    Inputs may broadcast: an input dim of 1 against a larger output dim gets stride 0. Memoised.
    """
    key = (out_dims, out_strides, inputs)
    hit = _plans.get(key)
    if hit is not None:
        return hit
    nd = len(out_dims)
    cols = [out_strides]
    for dims, strides in inputs:
        cols.append(tuple(0 if (dims[i] == 1 and out_dims[i] != 1) else strides[i] for i in range(nd)))
    keep = [i for i in range(nd) if out_dims[i] != 1]
    # outermost first: larger output stride first; ties keep the descriptor's order
    keep.sort(key=lambda i: -out_strides[i])
    sizes = [out_dims[i] for i in keep]
    st = [[c[i] for i in keep] for c in cols]
    ms, mst = [], [[] for _ in cols]
    for j in range(len(sizes)):
        if ms and all(m[-1] == s[j] * sizes[j] for m, s in zip(mst, st)):
            ms[-1] *= sizes[j]
            for k, s in enumerate(st):
                mst[k][-1] = s[j]
        else:
            ms.append(sizes[j])
            for k, s in enumerate(st):
                mst[k].append(s[j])
    if not ms:
        ms, mst = [1], [[1] for _ in cols]
    dense = len(ms) == 1 and all(s[0] == 1 for s in mst)
    if len(ms) > MAX_DIMS:
        raise AssertionError("more than 8 dims after collapsing")  # descriptors cap dims at 8
    result = (len(ms), tuple(ms), tuple(tuple(s) for s in mst), dense)
    if len(_plans) > 4096:
        _plans.clear()
    _plans[key] = result
    return result


class Prepared:
    """Everything about one element-wise launch that depends only on descriptors: the filled parameter
    struct (pointers and scalars are patched per call), the kernel for aligned and unaligned pointers,
    the grid and block of each, and the byte spans the buffers must cover. Cached per handle, so a repeated call skips
    planning and validation (the Python host cost of a small call)."""

    __slots__ = ("params", "argv", "block", "vec_block", "vec_func", "vec_grid", "scalar_func", "scalar_grid",
                 "in_masks", "out_mask", "base_flags", "need", "ninputs", "crec", "crec_obj")

    def __init__(self):
        self.crec = None  # the compiled launch's record address (pydnn/_build/fastcall.py); 0: none; None: not made


def plain_fits(out_desc, in_descs, limit):
    """Whether a dense map's operands (output and inputs, their byte spans summed) fit in `limit` bytes:
    such a map keeps the plain cache policy (map_contig HINT 0, see prepare_map's plain_unit)."""
    total = out_desc.span_bytes()
    for d in in_descs:
        total += d.span_bytes()
    return total <= limit


def prepare_map(handle, unit, op, ti, to, out_desc, in_descs, flags=0, coef=0.0, coef2=0.0, transpose=False,
                hint=None, elems=None, plain_unit=None):
    """transpose=True: the unit also instantiates transpose_expr(op, ti, to), used when the problem is a
    batched 2-D transpose (NCHW <-> NHWC and the like). hint, elems: as in map_exprs. plain_unit: a unit
    holding map_contig with HINT 0 (contig_expr(op, ti, to, hint=0, elems=elems)); a dense problem takes it
    instead of the streaming (evict-first) instantiation (the caller decides when: operands that fit in L2,
    where a warm cache serves the next call or the next kernel)."""
    ndim, sizes, strides, dense = plan(out_desc.dims, out_desc.strides,
                                       tuple((d.dims, d.strides) for d in in_descs))
    order = transpose_order(ndim, strides) if (transpose and not dense) else None
    if order is not None:
        sizes = tuple(sizes[d] for d in order)
        strides = tuple(tuple(st[d] for d in order) for st in strides)
    n = 1
    for s in sizes:
        n *= s
    pr = Prepared()
    p = pr.params = MapParams()
    p.n, p.ndim, p.coef, p.coef2 = n, ndim, coef, coef2
    for d in range(ndim):
        p.size[d] = sizes[d]
        for k, st in enumerate(strides):
            p.stride[k][d] = st[d]
    pr.argv = driver.kernel_args(p)
    pr.block = pr.vec_block = (THREADS, 1, 1)  # the vector kernel's block differs when dense (below)
    pr.base_flags = flags | fmt_flags(ti, to)
    pr.ninputs = len(in_descs)
    pr.need = (out_desc.span_bytes(),) + tuple(d.span_bytes() for d in in_descs)
    vec_e, scal_e, strided_e = map_exprs(op, ti, to, hint, elems)
    if order is not None:
        batch = 1
        for sz in sizes[:-2]:
            batch *= sz
        wide = {"f64", "i32", "i64"}  # double arithmetic (AccOf)
        t1 = 2 * TILE if (_SIZES[ti] < 4 and ti not in wide and (to or ti) not in wide) else TILE  # TransposeTile::d1
        tiles = batch * -(-sizes[-2] // t1) * -(-sizes[-1] // TILE)
        pr.vec_func = pr.scalar_func = handle.function(unit, transpose_expr(op, ti, to))
        pr.vec_grid = pr.scalar_grid = (tiles, 1, 1)
        pr.block = pr.vec_block = (32, 8, 1)
        pr.in_masks = pr.out_mask = 0
    elif dense:
        vec, threads, unroll = contig_geometry(ti, to, elems)
        eff_hint = CONTIG_HINT if hint is None else hint
        if plain_unit is not None and eff_hint != 0:
            pr.vec_func = handle.function(plain_unit, contig_expr(op, ti, to, hint=0, elems=elems))
        else:
            pr.vec_func = handle.function(unit, vec_e)
        pr.vec_grid = (max(1, -(-(n // vec) // (threads * unroll))), 1, 1)  # one tile per block
        pr.vec_block = (threads, 1, 1)
        pr.scalar_func = handle.function(unit, scal_e)
        pr.scalar_grid = (max(1, -(-n // (THREADS * UNROLL))), 1, 1)
        pr.in_masks = vec * _SIZES[ti] - 1
        pr.out_mask = vec * _SIZES[to] - 1
    else:  # strided: no alignment requirement, one kernel
        pr.vec_func = pr.scalar_func = handle.function(unit, strided_e)
        pr.vec_grid = pr.scalar_grid = (max(1, min(-(-n // THREADS), handle.sm_count * 16)), 1, 1)
        pr.in_masks = pr.out_mask = 0
    return pr


# The per-call fields of MapParams, written with one struct.pack_into each instead of six ctypes field
# assignments (p.in_[k] alone builds an array view per access): out, in[0..2], alpha, alpha2, beta are
# contiguous at the start of the struct, flags sits after ndim. Offsets are taken from the ctypes mirror,
# whose layout tests/test_params_layout.py checks against the C header.
_PATCH = struct.Struct(f"<{1 + MAP_INPUTS}Q3d")
_FLAGS = struct.Struct("<I")
_FLAGS_AT = MapParams.flags.offset
assert (MapParams.out.offset, MapParams.in_.offset, MapParams.alpha.offset, MapParams.alpha2.offset,
        MapParams.beta.offset) == (0, 8, 8 + 8 * MAP_INPUTS, 16 + 8 * MAP_INPUTS, 24 + 8 * MAP_INPUTS)
_pack, _pack_flags = _PATCH.pack_into, _FLAGS.pack_into
_LAUNCH_ARGS = driver.launch_args


_fast_launch = None  # fastcall's pydnn_map_launch, set by _crec before any record uses it
# fastcall's map_note(kind, record, inputs, copy, same) once the compiled entries of the element-wise calls are set
# up (_setup_entries; tuning.callpath.C_ENTRY_MAP): each such call's cached path notes the record it launched, and
# the entry that called it keeps it in that call site's slot; None before (and without a compiled launch)
note = None
_entries_tried = False
# fastcall.MAP_KINDS' numbers, by name for the callers' note
(K_ACT_BWD, K_ADD, K_SCALE, K_OP, K_TRANSFORM, K_SOFTMAX, K_POOL, K_REDUCE, K_BN_INFER, K_NORM_INFER, K_CONV_FWD,
 K_CONV_BWD_DATA, K_CONV_BWD_FILTER) = (fastcall.MAP_KINDS[n] for n in (
    "activation_backward", "add_tensor", "scale_tensor", "op_tensor", "transform_tensor", "softmax_forward",
    "pooling_forward", "reduce_tensor", "batch_normalization_forward_inference", "norm_forward_inference",
    "convolution_forward", "convolution_backward_data", "convolution_backward_filter"))


def plan_entries(func):
    """_setup_entries from a softmax / pooling / reduce call whose plan launches `func`, in a process where no
    element-wise launch record was made yet: once func is a driver function (not a CPU handle's placeholder) and
    the compiled launch is available, as _crec would find."""
    if _entries_tried or not tuning.callpath.C_LAUNCH:
        return
    try:
        int(func)
    except (TypeError, ValueError):
        return
    if fastcall.launcher() is not None:
        _setup_entries()


# name -> the op module holding `_py_<name>` (the Python function behind a compiled entry); each op module registers
# its own calls at import (register_entries), so this module never imports the families that import it
_ENTRY_MODULES = {}


def register_entries(module, *names):
    """An op module's calls that get compiled entries (_setup_entries): activation_forward (whose module's
    _entry_setup makes the first entry) and the calls whose Python function the module keeps as `_py_<name>`."""
    for n in names:
        _ENTRY_MODULES[n] = module


def _setup_entries():
    """Once, when the first compiled launch record is made: activation_forward's entry (its act_setup gives the
    kinds their module objects), then activation_backward, add_tensor, scale_tensor, op_tensor, transform_tensor,
    softmax_forward, pooling_forward, reduce_tensor, batch_normalization_forward_inference, norm_forward_inference
    and the three convolutions (forward, backward data, backward filter) as compiled entries over their Python
    functions (pydnn/_build/fastcall.py's mk_try: a cached call from its call-site slot, no Python frame; the Python
    function for anything else). Where a public name no
    longer holds the def (a caller replaced it) it is left alone; a reference taken earlier keeps the def, which
    answers the same."""
    global _entries_tried, note
    _entries_tried = True
    cp = tuning.callpath
    if not (cp.C_ENTRY and cp.C_ENTRY_SITES and cp.C_ENTRY_MAP):
        return
    import sys

    A = _ENTRY_MODULES.get("activation_forward")
    if A is None:
        return
    mods = {n: m for n, m in _ENTRY_MODULES.items() if n != "activation_forward"}
    try:
        if not A._entry_tried:
            A._entry_setup()
        if A._c_entry is None:
            return
        got = fastcall.map_entries({n: getattr(m, "_py_" + n) for n, m in mods.items()})
    except Exception:  # noqa: BLE001 - an optimisation: the Python functions answer
        got = None
    if not got:
        return
    pubs, note = got
    for name, pub in pubs.items():
        own = mods[name]
        for mod in (own, sys.modules.get("pydnn")):
            if mod is not None and getattr(mod, name, None) is getattr(own, "_py_" + name):
                setattr(mod, name, pub)


def _crec(pr):
    """Make the launch record's C twin for fastcall's compiled launch (0 when there is none)."""
    global _fast_launch
    rec = fastcall.record(pr) if tuning.callpath.C_LAUNCH else None  # None for a CPU handle's placeholders
    if rec is not None:
        _fast_launch = _fast_launch or fastcall.launcher()
        if _fast_launch is None:
            rec = None
    pr.crec_obj = rec
    pr.crec = ctypes.addressof(rec) if rec is not None else 0
    if rec is not None and not _entries_tried:
        _setup_entries()
    return pr.crec


def run_map(handle, pr, out_ptr, in_ptrs, alpha, beta, alpha2=0.0):
    """Patch pointers and scalars into a prepared launch and enqueue it (one compiled call where the
    launch helper is available and the driver's launch is not replaced or recording)."""
    c = pr.crec
    if c is None:
        c = _crec(pr)
    if c and driver.launch_args is _LAUNCH_ARGS and not driver._recorders:
        n = len(in_ptrs)
        err = _fast_launch(c, handle.stream, out_ptr, in_ptrs[0] if n else 0, in_ptrs[1] if n > 1 else 0,
                              in_ptrs[2] if n > 2 else 0, alpha, alpha2, beta, n)
        if err:
            driver.raise_status(err)
        return
    n = len(in_ptrs)
    if n == 1:
        i0 = mask = in_ptrs[0]
        i1 = i2 = 0
    elif n == 2:
        i0, i1 = in_ptrs
        i2, mask = 0, i0 | i1
    elif n == 3:
        i0, i1, i2 = in_ptrs
        mask = i0 | i1 | i2
    else:  # no input (SetTensor)
        i0 = i1 = i2 = mask = 0
    p = pr.params
    _pack(p, 0, out_ptr, i0, i1, i2, alpha, alpha2, beta)
    _pack_flags(p, _FLAGS_AT, pr.base_flags | FLAG_BETA if beta != 0 else pr.base_flags)
    if (mask & pr.in_masks) == 0 and (out_ptr & pr.out_mask) == 0:
        driver.launch_args(pr.vec_func, pr.vec_grid, pr.vec_block, 0, handle.cu_stream, pr.argv)
    else:
        driver.launch_args(pr.scalar_func, pr.scalar_grid, pr.block, 0, handle.cu_stream, pr.argv)


def cached(handle, key, build):
    """The launch record for `key` from the handle's table, or build() it (validation included) and keep
    it. `key` is None when an argument is not a descriptor: then build() runs and reports the error."""
    rec = handle.prepared.get(key) if key is not None else None
    if rec is None:
        rec = build()
        if key is not None:
            handle.remember(key, rec)
    return rec


_PLAIN = frozenset((int, float, str, bool, type(None)))


def desc_key(*parts):
    """A cache key from op parameters and descriptors (each with its version); None if one is not a
    descriptor. Descriptor versions change on every set and destroy, so a key never outlives its meaning.
    One loop, no generator: this runs on every call of the families that use it."""
    key = []
    for x in parts:
        if type(x) in _PLAIN:
            key.append(x)
            continue
        try:
            key.append((x, x.version))
        except AttributeError:
            if not isinstance(x, (int, float, str)):
                return None
            key.append(x)
    return tuple(key)


def launch_map(handle, unit, op, ti, to, out_ptr, in_ptrs, alpha, beta, out_desc, in_descs,
               flags=0, coef=0.0, coef2=0.0, alpha2=0.0):
    """Plan and launch `op` once, without caching (see prepare_map / run_map for the cached path)."""
    pr = prepare_map(handle, unit, op, ti, to, out_desc, in_descs, flags, coef, coef2)
    run_map(handle, pr, out_ptr, in_ptrs, alpha, beta, alpha2)
