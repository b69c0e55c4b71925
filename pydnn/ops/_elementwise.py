"""Shared launch planning for element-wise kernels (ptx/common/elementwise.cuh).

`plan` collapses the iteration space of an output and its inputs: size-1 dims are dropped, dims are
ordered by the output's strides (innermost last) and adjacent dims merge when every operand is dense
across them. A fully dense problem becomes one flat dim, taken by the vectorised `map_contig` kernel;
anything else (other strides, broadcast inputs with stride 0) runs `map_strided`.
"""
from .._build.params import FLAG_BETA, MAX_DIMS, MapParams

THREADS = 256
UNROLL = 4  # vectors per thread in map_contig (kMapUnroll)

# C spellings of element types, for template name expressions
CTYPE = {"f32": "float", "f64": "double", "f16": "pydnn::half_t", "bf16": "pydnn::bf16_t",
         "i8": "signed char", "u8": "unsigned char", "i32": "int", "i64": "pydnn::i64"}


def map_exprs(op, ti, to=None):
    """The three instantiations that serve one op on one type pair: vector, scalar-contiguous, strided."""
    ci, co = CTYPE[ti], CTYPE[to or ti]
    return (f"pydnn::map_contig<{ci}, {co}, {op}, {vec_width(ti, to or ti)}>",
            f"pydnn::map_contig<{ci}, {co}, {op}, 1>",
            f"pydnn::map_strided<{ci}, {co}, {op}>")


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


def fill(p, out_ptr, in_ptrs, alpha, beta, ndim, sizes, strides, n, flags):
    p.out = out_ptr
    for k, ptr in enumerate(in_ptrs):
        p.in_[k] = ptr
    p.alpha, p.beta = alpha, beta
    p.n, p.ndim = n, ndim
    p.flags = flags | (FLAG_BETA if beta != 0 else 0)
    for d in range(ndim):
        p.size[d] = sizes[d]
        for k, s in enumerate(strides):
            p.stride[k][d] = s[d]


def launch_map(handle, unit, op, ti, to, out_ptr, in_ptrs, alpha, beta, out_desc, in_descs,
               flags=0, coef=0.0, coef2=0.0, alpha2=0.0):
    """Plan, fill MapParams and launch the right variant of `op` (instantiated by map_exprs)."""
    ndim, sizes, strides, dense = plan(out_desc.dims, out_desc.strides,
                                       tuple((d.dims, d.strides) for d in in_descs))
    n = 1
    for s in sizes:
        n *= s
    p = MapParams()
    fill(p, out_ptr, in_ptrs, alpha, beta, ndim, sizes, strides, n, flags)
    p.alpha2, p.coef, p.coef2 = alpha2, coef, coef2
    vec_e, scal_e, strided_e = map_exprs(op, ti, to)
    if dense:
        vec = vec_width(ti, to)
        align = vec * max(_SIZES[ti], _SIZES[to])
        aligned = all(ptr % (vec * _SIZES[ti]) == 0 for ptr in in_ptrs) and out_ptr % (vec * _SIZES[to]) == 0
        expr = vec_e if (aligned and align <= 16 and vec > 1) else scal_e
        per_block = THREADS * UNROLL * (vec if expr == vec_e else 1)
        grid = max(1, -(-n // per_block))
    else:
        expr = strided_e
        grid = max(1, min(-(-n // THREADS), handle.sm_count * 16))
    handle.launch(unit, expr, (grid, 1, 1), (THREADS, 1, 1), p)
