"""ReduceTensor on the CPU: descriptor round trip, every validation error, the reference, that the
kernel units compile, and an emulation of the kernels' index arithmetic over the host's launch plans
(every element of A reaches its output exactly once, with its flat index, in increasing order per
thread; outputs, indices and partials land where they belong)."""
import itertools

import numpy as np
import pytest

import pydnn
from pydnn.ops import reduce as R
from pydnn.reference import reduce as ref
from pydnn.tensor import packed_strides
from test_fuzz_cpu import _call, _desc, cpu_handle

F32, F64, F16, BF16 = (pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DATA_DOUBLE, pydnn.PYDNN_DATA_HALF,
                       pydnn.PYDNN_DATA_BFLOAT16)
ADD, MUL, MIN, MAX, AMAX, AVG, NORM1, NORM2, MNZ = (
    pydnn.PYDNN_REDUCE_TENSOR_ADD, pydnn.PYDNN_REDUCE_TENSOR_MUL, pydnn.PYDNN_REDUCE_TENSOR_MIN,
    pydnn.PYDNN_REDUCE_TENSOR_MAX, pydnn.PYDNN_REDUCE_TENSOR_AMAX, pydnn.PYDNN_REDUCE_TENSOR_AVG,
    pydnn.PYDNN_REDUCE_TENSOR_NORM1, pydnn.PYDNN_REDUCE_TENSOR_NORM2, pydnn.PYDNN_REDUCE_TENSOR_MUL_NO_ZEROS)
FLAT = pydnn.PYDNN_REDUCE_TENSOR_FLATTENED_INDICES


def _r(op=ADD, indices=0, comp=F32, nan=0, itype=0):
    r = pydnn.create_reduce_tensor_descriptor()
    pydnn.set_reduce_tensor_descriptor(r, op, comp, nan, indices, itype)
    return r


def _handle(sm_count=132):
    h = cpu_handle()
    h.sm_count = sm_count
    return h


# ----------------------------------------------------------------------------- descriptor, validation

def test_descriptor_round_trip_and_errors():
    r = _r(AMAX, FLAT, nan=1)
    assert pydnn.get_reduce_tensor_descriptor(r) == (AMAX, F32, 1, FLAT, 0)
    pydnn.set_reduce_tensor_descriptor(r, MNZ, F64, 0, 0, pydnn.PYDNN_64BIT_INDICES)
    assert pydnn.get_reduce_tensor_descriptor(r) == (MNZ, F64, 0, 0, pydnn.PYDNN_64BIT_INDICES)
    for args, name in (((99, 0, 0, 0, 0), "reduceTensorOp"), ((0, 77, 0, 0, 0), "reduceTensorCompType"),
                       ((0, 0, 2, 0, 0), "reduceTensorNanOpt"), ((0, 0, 0, 2, 0), "reduceTensorIndices"),
                       ((0, 0, 0, 0, 4), "reduceTensorIndicesType"), ((True, 0, 0, 0, 0), "reduceTensorOp"),
                       ((0, "x", 0, 0, 0), "reduceTensorCompType")):
        assert _call(pydnn.set_reduce_tensor_descriptor, r, *args) == pydnn.PYDNN_STATUS_BAD_PARAM
        assert pydnn.get_last_error_string().startswith(f"set_reduce_tensor_descriptor: {name}:")
    assert pydnn.get_reduce_tensor_descriptor(r) == (MNZ, F64, 0, 0, pydnn.PYDNN_64BIT_INDICES)  # unchanged
    pydnn.destroy_reduce_tensor_descriptor(r)
    assert _call(pydnn.get_reduce_tensor_descriptor, r) == pydnn.PYDNN_STATUS_BAD_PARAM
    assert _call(pydnn.set_reduce_tensor_descriptor, "r", 0, 0, 0, 0, 0) == pydnn.PYDNN_STATUS_BAD_PARAM
    pydnn.destroy_reduce_tensor_descriptor(None)
    h = _handle()
    unset = pydnn.create_reduce_tensor_descriptor()
    st = _call(pydnn.get_reduction_workspace_size, h, unset, _desc((2, 3)), _desc((2, 1)))
    assert st == pydnn.PYDNN_STATUS_BAD_PARAM and "never set" in pydnn.get_last_error_string()


def test_sizes():
    h = _handle()
    a, c = _desc((4, 6, 9, 10)), _desc((4, 1, 9, 1))
    assert pydnn.get_reduction_indices_size(h, _r(MAX, FLAT), a, c) == 4 * 9 * 4
    assert pydnn.get_reduction_indices_size(h, _r(MIN, FLAT), a, _desc((1, 1, 1, 1))) == 4
    assert pydnn.get_reduction_indices_size(h, _r(MAX), a, c) == 0
    assert pydnn.get_reduction_indices_size(h, _r(), a, c) == 0
    assert pydnn.get_reduction_workspace_size(h, _r(), a, c) == 0  # enough outputs: one pass
    big, full = _desc((1, 1, 1, 1 << 26)), _desc((1, 1, 1, 1))
    ws = pydnn.get_reduction_workspace_size(h, _r(), big, full)
    assert ws > 0 and ws % 8 == 0
    assert pydnn.get_reduction_workspace_size(h, _r(AMAX, FLAT), big, full) > ws  # + int32 indices


def test_validation_statuses_and_messages():
    h = _handle()
    a, c = _desc((4, 6, 9, 10)), _desc((4, 1, 9, 1))
    BAD, NS = pydnn.PYDNN_STATUS_BAD_PARAM, pydnn.PYDNN_STATUS_NOT_SUPPORTED

    def check(fn, args, status, text):
        st = _call(fn, *args)
        assert st == status, (st, pydnn.get_last_error_string())
        assert text in pydnn.get_last_error_string(), pydnn.get_last_error_string()

    ws_fn = pydnn.get_reduction_workspace_size
    check(ws_fn, (h, _r(), a, _desc((4, 2, 9, 1))), BAD, "cDesc: dim 1 is 2")
    check(ws_fn, (h, _r(), a, _desc((4, 1, 9))), BAD, "cDesc: has 3 dims")
    check(ws_fn, (h, _r(), a, "c"), BAD, "cDesc:")
    check(ws_fn, (h, _r(), None, c), BAD, "aDesc:")
    check(ws_fn, ("h", _r(), a, c), BAD, "handle:")
    check(ws_fn, (h, object(), a, c), BAD, "reduceTensorDesc:")
    check(ws_fn, (h, _r(), _desc((2, 3), pydnn.PYDNN_DATA_INT8), _desc((2, 1), pydnn.PYDNN_DATA_INT8)), NS, "aDesc:")
    check(ws_fn, (h, _r(), _desc((2, 3), F32), _desc((2, 1), F64)), NS, "cDesc: data type")
    check(ws_fn, (h, _r(), _desc((2, 3), F16), _desc((2, 1), BF16)), NS, "cDesc: data type")
    check(ws_fn, (h, _r(), _desc((2, 3), F64), _desc((2, 1), F32)), NS, "cDesc: data type")
    check(ws_fn, (h, _r(comp=F64), _desc((2, 3), F32), _desc((2, 1), F32)), NS, "reduceTensorDesc: compute type")
    check(ws_fn, (h, _r(comp=F16), _desc((2, 3), F16), _desc((2, 1), F16)), NS, "reduceTensorDesc: compute type")
    check(ws_fn, (h, _r(ADD, FLAT), a, c), NS, "reduceTensorDesc: indices exist only")
    check(pydnn.get_reduction_indices_size, (h, _r(NORM2, FLAT), a, c), NS, "MIN, MAX and AMAX")
    check(ws_fn, (h, _r(MAX, FLAT, itype=pydnn.PYDNN_64BIT_INDICES), a, c), NS, "32-bit only")
    check(ws_fn, (h, _r(MAX, FLAT), _desc((1, 1 << 31)), _desc((1, 1))), NS, "cannot number")
    # supported pairs and compute types pass validation
    for ta, tc in ((F32, F32), (F64, F64), (F16, F16), (BF16, BF16), (F16, F32), (BF16, F32), (F32, F16),
                   (F32, BF16)):
        assert pydnn.get_reduction_workspace_size(h, _r(), _desc((2, 3), ta), _desc((2, 1), tc)) == 0
    assert pydnn.get_reduction_workspace_size(h, _r(comp=F64), _desc((2, 3), F64), _desc((2, 1), F64)) == 0

    rt = pydnn.reduce_tensor
    A, C, I, W = 1 << 41, 1 << 42, 1 << 40, 1 << 43
    big, full = _desc((1, 1, 1, 1 << 26)), _desc((1, 1, 1, 1))
    need = pydnn.get_reduction_workspace_size(h, _r(), big, full)
    check(rt, (h, _r(MAX, FLAT), I, 4, 0, 0, 1.0, a, A, 0.0, c, C), BAD, "indicesSizeInBytes: 4 is less than the 144")
    check(rt, (h, _r(MAX, FLAT), 0, 144, 0, 0, 1.0, a, A, 0.0, c, C), pydnn.PYDNN_STATUS_BAD_PARAM_NULL_POINTER,
          "indices: NULL")
    check(rt, (h, _r(MAX, FLAT), I + 2, 144, 0, 0, 1.0, a, A, 0.0, c, C),
          pydnn.PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER, "indices:")
    check(rt, (h, _r(), 0, 0, W, 16, 1.0, big, A, 0.0, full, C), BAD, "workspaceSizeInBytes: 16 is less than")
    check(rt, (h, _r(), 0, 0, None, need, 1.0, big, A, 0.0, full, C), pydnn.PYDNN_STATUS_BAD_PARAM_NULL_POINTER,
          "workspace: NULL")
    check(rt, (h, _r(), 0, 0, W + 4, need, 1.0, big, A, 0.0, full, C),
          pydnn.PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER, "workspace:")
    check(rt, (h, _r(), 0, -1, 0, 0, 1.0, a, A, 0.0, c, C), BAD, "indicesSizeInBytes:")
    check(rt, (h, _r(), 0, 0, 0, "8", 1.0, a, A, 0.0, c, C), BAD, "workspaceSizeInBytes:")
    check(rt, (h, _r(), 0, 0, 0, 0, "one", a, A, 0.0, c, C), BAD, "alpha:")
    check(rt, (h, _r(), 0, 0, 0, 0, 1.0, a, A, None, c, C), BAD, "beta:")
    check(rt, (h, _r(), 0, 0, 0, 0, 1.0, a, 0, 0.0, c, C), pydnn.PYDNN_STATUS_BAD_PARAM_NULL_POINTER, "A: NULL")
    check(rt, (h, _r(), 0, 0, 0, 0, 1.0, a, A, 0.0, c, None), pydnn.PYDNN_STATUS_BAD_PARAM_NULL_POINTER, "C: NULL")
    check(rt, (h, _r(ADD, FLAT), I, 144, 0, 0, 1.0, a, A, 0.0, c, C), NS, "indices exist only")
    check(rt, (h, _r(), 0, 0, 0, 0, 1.0, a, A, 0.0, _desc((4, 2, 9, 1)), C), BAD, "cDesc: dim 1")
    # indices and workspace are ignored when not needed (NULL, any size)
    check(rt, (h, _r(MAX), None, 0, None, 0, 1.0, a, A, 0.0, c, C), pydnn.PYDNN_STATUS_NOT_INITIALIZED, "")
    # everything valid: the CPU-only handle refuses at kernel lookup
    check(rt, (h, _r(MAX, FLAT), I, 144, W, 0, 1.0, a, A, 0.0, c, C), pydnn.PYDNN_STATUS_NOT_INITIALIZED, "")
    check(rt, (h, _r(), 0, 0, W, need, 1.0, big, A, 0.5, full, C), pydnn.PYDNN_STATUS_NOT_INITIALIZED, "")


# ----------------------------------------------------------------------------- reference

def test_reference_indices_follow_a_dim_order():
    a = np.arange(24, dtype=float).reshape(2, 3, 4)
    a[1, 2, 1] = 100
    v, idx, _ = ref.reduce(MAX, 1.0, a, 0.0, None, (2, 1, 1))
    assert v.ravel().tolist() == [11, 100] and idx.ravel().tolist() == [11, 9]
    v, idx, _ = ref.reduce(MIN, 1.0, a, 0.0, None, (1, 3, 1))
    assert v.ravel().tolist() == [0, 4, 8] and idx.ravel().tolist() == [0, 0, 0]
    v, idx, _ = ref.reduce(MAX, 1.0, a, 0.0, None, (1, 3, 1))  # reduced dims 0 and 2: index = n * 4 + w
    assert idx.ravel().tolist() == [7, 7, 5]


def test_reference_ties_nan_and_ops():
    x = np.array([[1.0, 3.0, 3.0, -3.0], [np.nan, 2.0, np.nan, 5.0], [np.nan] * 4, [-0.0, 0.0, -1.0, 0.0]])
    v, i, _ = ref.reduce(MAX, 1.0, x, 0.0, None, (4, 1))
    assert i.ravel().tolist() == [1, 3, 0, 0] and np.isnan(v[2, 0]) and v[0, 0] == 3 and v[1, 0] == 5
    v, i, _ = ref.reduce(MAX, 1.0, x, 0.0, None, (4, 1), propagate_nan=True)
    assert i.ravel().tolist() == [1, 0, 0, 0] and np.isnan(v[1, 0]) and np.isnan(v[2, 0])
    v, i, _ = ref.reduce(AMAX, 1.0, x, 0.0, None, (4, 1))
    assert i.ravel().tolist() == [1, 3, 0, 2] and v[0, 0] == 3
    v, i, _ = ref.reduce(MIN, 1.0, x, 0.0, None, (4, 1))
    assert i.ravel().tolist() == [3, 1, 0, 2]
    y = np.array([[0.0, 2.0, 0.0, -3.0], [0.0, 0.0, 0.0, 0.0]])
    assert ref.reduce(MNZ, 1.0, y, 0.0, None, (2, 1))[0].ravel().tolist() == [-6.0, 1.0]
    assert ref.reduce(MUL, 1.0, y, 0.0, None, (2, 1))[0].ravel().tolist() == [0.0, 0.0]
    z = np.array([[3.0, -4.0]])
    assert ref.reduce(NORM2, 2.0, z, 0.5, np.array([[2.0]]), (1, 1))[0][0, 0] == 11.0
    assert ref.reduce(NORM1, 1.0, z, 0.0, None, (1, 1))[0][0, 0] == 7.0
    assert ref.reduce(AVG, 1.0, z, 0.0, None, (1, 1))[0][0, 0] == -0.5
    assert ref.reduce(ADD, 1.0, z, 0.0, None, (1, 2))[0].tolist() == [[3.0, -4.0]]


# ----------------------------------------------------------------------------- kernels compile

def test_kernel_units_compile_for_sm80_and_sm90():
    from pydnn._build import build

    # every unit of the family in each arch's install / first-use split (the cache entries the loader reads)
    build.build_all(archs=["sm_80", "sm_90"], prefixes=("reduce.",), everything=True, progress=False)


def test_kernel_unit_names_cover_every_plan():
    """Every expression a plan can ask for is in the unit it is looked up in."""
    units = {u.name: set(u.exprs) for u in R.kernel_units()}
    h = _handle()
    for ta, tc in R.PAIRS:
        dt = {"f32": F32, "f64": F64, "f16": F16, "bf16": BF16}
        for op in R.OPS:
            for idx in ((0, FLAT) if op in R.INDEXED else (0,)):
                for adims, cdims, strides in ((( 8, 64), (8, 1), None), ((64, 8), (1, 8), None),
                                              ((6, 8), (1, 8), (1, 6)), ((4, 6, 8), (1, 6, 1), None),
                                              ((5, 7), (1, 1), (14, 2)), ((64, 6, 8), (1, 6, 1), (48, 1, 6))):
                    pl = R._plan(h, _r(op, idx), _desc(adims, dt[ta], strides), _desc(cdims, dt[tc]))
                    for lch in pl.launches:
                        assert lch.expr in units[pl.unit], lch.expr
                        assert R._expr("reduce_finish", ta) in units[pl.unit]
                        # half and bfloat16 share reduce.h16 (pydnn::h16_t); the flag names the input's format
                        assert (pl.unit == "reduce.h16") == (ta in ("f16", "bf16")), (pl.unit, ta)
                        assert bool(lch.params.flags & R.FLAG_IN_BF16) == (ta == "bf16")


# ----------------------------------------------------------------------------- emulation of the kernels

BLOCK, U = R.BLOCK, R.UNROLL


def _row_offset(p, row, k):
    off = 0
    for d in range(p.row_ndim - 1, -1, -1):
        s = p.row_size[d]
        off += (row % s) * p.row_stride[k][d]
        row //= s
    return off


class _Walk:
    def __init__(self, p, u, two):
        self.p, self.two = p, two
        if two:
            q, self.c1 = divmod(u, p.red_size[1])
            self.off = q * p.red_stride[0] + self.c1 * p.red_stride[1]
        else:
            self.off = u * p.red_stride[0]

    def next(self):
        p = self.p
        self.off += p.step_off
        if self.two:
            self.c1 += p.red_step[1]
            if self.c1 >= p.red_size[1]:
                self.c1 -= p.red_size[1]
                self.off += p.wrap_off


class _WalkN:
    def __init__(self, p, u):
        self.p = p
        self.c = [0] * 8
        for d in range(p.red_ndim - 1, -1, -1):
            if d > 0:
                u, self.c[d] = divmod(u, p.red_size[d])
            else:
                self.c[d] = u
        self.off = sum(self.c[d] * p.red_stride[d] for d in range(p.red_ndim))

    def next(self):
        p, carry = self.p, 0
        for d in range(p.red_ndim - 1, 0, -1):
            v = self.c[d] + p.red_step[d] + carry
            carry = int(v >= p.red_size[d])
            self.c[d] = v - p.red_size[d] if carry else v
            assert self.c[d] < p.red_size[d]
        self.c[0] += p.red_step[0] + carry
        self.off = sum(self.c[d] * p.red_stride[d] for d in range(p.red_ndim))


def _walk(p, walker, base, u, hi, step, vec, index, addr0, visits):
    """The unrolled loop of walk_row / walk_cols: visits.append((element offset, index, lane e)). walk_row
    loads its last (< U) units together before adding them; the visits, their order and offsets are the
    same as one at a time (the second loop here)."""
    while u + (U - 1) * step < hi:
        offs = []
        for _ in range(U):
            offs.append(walker.off)
            walker.next()
        for k in range(U):
            if vec > 1:
                assert (addr0 + base + offs[k]) % vec == 0, "misaligned vector"
            for e in range(vec):
                visits.append((base + offs[k] + e, index(u + k * step, e), e))
        u += U * step
    while u < hi:
        off = walker.off
        walker.next()
        if vec > 1:
            assert (addr0 + base + off) % vec == 0, "misaligned vector"
        for e in range(vec):
            visits.append((base + off + e, index(u, e), e))
        u += step


def _emulate(launch, addr0):
    """{output row: [(A offset, index), ...]}, {row: (C offset, I offset)} (direct writes),
    {partial slot: row}; checks each thread sees increasing indices."""
    p, kind, vec = launch.params, launch.kind, launch.vec
    S = p.segments
    got, writes, partials = {}, {}, {}
    jobs = {}  # (row, seg) -> ("butterfly", [visits of lane 0..G-1]) or ("fold", [visits in fold order])

    def emit(row, seg, slot, c_off, i_off):
        if S == 1:
            assert row not in writes
            writes[row] = (c_off, i_off)
        else:
            assert slot not in partials
            partials[slot] = row

    if kind in ("rows_vec", "rows_gen"):
        G = p.group
        for b in range(launch.grid[0]):
            for t in range(BLOCK):
                lane = t & (G - 1)
                slot = b * (BLOCK // G) + t // G
                row, seg = divmod(slot, S) if S > 1 else (slot, 0)
                if row >= p.rows:
                    continue
                base = _row_offset(p, row, 1)
                lo = seg * p.chunk
                vis = []
                if kind == "rows_gen":
                    hi = min(p.len, lo + p.chunk)
                    _walk(p, _WalkN(p, lo + lane), base, lo + lane, hi, G, 1, lambda u, e: u, addr0, vis)
                elif p.red_ndim == 2:
                    hi = min(p.units, lo + p.chunk)
                    _walk(p, _Walk(p, lo + lane, True), base, lo + lane, hi, G, vec, lambda u, e: u * vec + e,
                          addr0, vis)
                else:
                    mis = (addr0 + base) % vec
                    head = min(p.len, (vec - mis) & (vec - 1))
                    nvec = (p.len - head) // vec
                    if seg == 0:
                        vis += [(base + e, e, 0) for e in range(lane, head, G)]
                    hi = min(nvec, lo + p.chunk)
                    _walk(p, _Walk(p, lo + lane, False), base + head, lo + lane, hi, G, vec,
                          lambda u, e: head + u * vec + e, addr0, vis)
                    if seg == 0:
                        vis += [(base + e, e, 0) for e in range(head + nvec * vec + lane, p.len, G)]
                idxs = [i for _, i, _ in vis]
                assert idxs == sorted(idxs) and len(set(idxs)) == len(idxs)
                got.setdefault(row, []).extend((o, i) for o, i, _ in vis)
                jobs.setdefault((row, seg), ("butterfly", []))[1].append([(o, i) for o, i, _ in vis])
                if lane == 0:
                    emit(row, seg, slot, _row_offset(p, row, 0), _row_offset(p, row, 2))
    else:  # cols
        bx, by = launch.block[0], launch.block[1]
        P, K = p.pack, p.cols
        KV = K // vec
        for b in range(launch.grid[0]):
            seg = 0
            if S > 1:
                b, seg = divmod(b, S)
            outer, tile = divmod(b, p.tiles)
            threads, tvis = {}, {}
            for ty in range(by):
                for tx in range(bx):
                    if P > 1:
                        sub, vcol = divmod(tx, KV)
                        active = sub < P
                    else:
                        sub, vcol = 0, tile * bx + tx
                        active = vcol < KV
                    threads[(ty, tx)] = (sub, vcol, active)
                    if not active:
                        continue
                    assert outer < p.rows // K
                    base = _row_offset(p, outer, 1) + vcol * vec * p.col_stride[1]
                    lo = seg * p.chunk
                    hi = min(p.units, lo + p.chunk)
                    r = lo + sub + P * ty
                    vis = []
                    _walk(p, _Walk(p, r, p.red_ndim == 2), base, r, hi, P * by, vec, lambda u, e: u, addr0, vis)
                    for e in range(vec):
                        mine = [(o, i) for o, i, ee in vis if ee == e]
                        assert [i for _, i in mine] == sorted(i for _, i in mine)
                        got.setdefault(outer * K + vcol * vec + e, []).extend(mine)
                        tvis[(ty, tx, e)] = mine
            for (ty, tx), (sub, vcol, active) in threads.items():
                if ty or not active or sub:
                    continue
                kv = KV if P > 1 else 0
                for s in range(P):  # the fold reads the partials of (y, s * kv + tx): same column, sub s
                    for y in range(by):
                        assert threads[(y, s * kv + tx)] == (s, vcol, True)
                for e in range(vec):
                    col = vcol * vec + e
                    row = outer * K + col
                    jobs[(row, seg)] = ("fold", [tvis.get((y, s * kv + tx, e), []) for s in range(P)
                                                 for y in range(by)])
                    emit(row, seg, row * S + seg, _row_offset(p, outer, 0) + col * p.col_stride[0],
                         _row_offset(p, outer, 2) + col * p.col_stride[2])
    if S > 1:  # reduce_finish: row -> its partials and its output offsets
        assert sorted(partials) == list(range(p.rows * S))
        for slot, row in partials.items():
            assert slot // S == row
        for row in range(p.rows):
            if p.cols:
                outer, k = divmod(row, p.cols)
                writes[row] = (_row_offset(p, outer, 0) + k * p.col_stride[0],
                               _row_offset(p, outer, 2) + k * p.col_stride[2])
            else:
                writes[row] = (_row_offset(p, row, 0), _row_offset(p, row, 2))
    return got, writes, jobs


def _expected(adims, astr, cdims, cstr):
    """{C offset: (I offset, {A offset: flat index})}."""
    nd = len(adims)
    ist = packed_strides(cdims, pydnn.PYDNN_TENSOR_NCHW)
    red = [i for i in range(nd) if cdims[i] == 1]
    out = {}
    for cidx in itertools.product(*[range(n) for n in cdims]):
        elems = {}
        for ridx in itertools.product(*[range(adims[i]) for i in red]):
            full = list(cidx)
            for i, v in zip(red, ridx):
                full[i] = v
            flat = int(np.ravel_multi_index(ridx, [adims[i] for i in red])) if red else 0
            elems[sum(c * s for c, s in zip(full, astr))] = flat
        out[sum(c * s for c, s in zip(cidx, cstr))] = (sum(c * s for c, s in zip(cidx, ist)), elems)
    return out


def _check_plan(h, op, idx, dtype, adims, astr, cdims, cstr=None, addrs=(0, 1, 3)):
    a = _desc(adims, dtype, astr)
    c = _desc(cdims, F64 if dtype == F64 else F32, cstr)
    astr, cstr = a.strides, c.strides
    pl = R._plan(h, _r(op, idx), a, c)
    want = _expected(adims, astr, cdims, cstr)
    kinds = []
    for n, launch in enumerate(pl.launches):
        kinds.append((launch.kind, launch.vec, launch.params.segments))
        for addr0 in ((0,) if (n == 0 and pl.align_mask) else addrs):
            got, writes, _ = _emulate(launch, addr0)
            assert len(writes) == len(want) == len(got), (launch.kind, len(writes), len(want), len(got))
            for row, (c_off, i_off) in writes.items():
                w_ioff, elems = want[c_off]
                assert i_off == w_ioff or not idx
                visits = got[row]
                assert sorted(o for o, _ in visits) == sorted(elems), (launch.kind, row)
                if idx:
                    assert all(elems[o] == i for o, i in visits), (launch.kind, row)
        if launch.params.segments > 1:
            assert launch.workspace >= launch.params.rows * launch.params.segments * 8
        assert pl.workspace >= launch.workspace
    return kinds


# ---- the kernels' arithmetic, in Python floats (IEEE comparisons, like the device code)
EMPTY = 0x7FFFFFFF
NAN, INF = float("nan"), float("inf")


def _isnan(x):
    return x != x


def _identity(op, np_):
    if op in (MUL, MNZ):
        return 1.0
    if op == MIN:
        return INF if np_ else NAN
    if op in (MAX, AMAX):
        return -INF if np_ else NAN
    return 0.0


def _pick(a, b, is_min, np_):
    if np_:
        if _isnan(a) or _isnan(b):
            return NAN
        return min(a, b) if is_min else max(a, b)
    if _isnan(a):
        return b
    if _isnan(b):
        return a
    return min(a, b) if is_min else max(a, b)


def _acc(visits, vals, op, np_, idx):
    """add() over a thread's elements, then close(): (value, index)."""
    v, c, i = _identity(op, np_), 0.0, EMPTY
    for off, e in visits:
        x = vals[off]
        if op in (ADD, AVG, NORM1, NORM2):
            x = abs(x) if op == NORM1 else x
            y = (x * x if op == NORM2 else x) - c
            t = v + y
            cc = (t - v) - y
            c = cc if cc == cc else 0.0
            v = t
        elif op in (MUL, MNZ):
            v *= 1.0 if (op == MNZ and x == 0) else x
        else:
            x = abs(x) if op == AMAX else x
            if not idx:
                v = _pick(v, x, op == MIN, np_)
                continue
            better = x < v if op == MIN else x > v
            xn, vn = _isnan(x), _isnan(v)
            if i == EMPTY or ((not vn if xn else better) if np_ else (not xn if vn else better)):
                v, i = x, e
    return ((v - c) if op in (ADD, AVG, NORM1, NORM2) else v), i


def _merge(a, b, op, np_, idx):
    if op in (ADD, AVG, NORM1, NORM2):
        return a[0] + b[0], a[1]
    if op in (MUL, MNZ):
        return a[0] * b[0], a[1]
    if not idx:
        return _pick(a[0], b[0], op == MIN, np_), a[1]
    better = b[0] < a[0] if op == MIN else b[0] > a[0]
    an, bn = _isnan(a[0]), _isnan(b[0])
    if b[1] == EMPTY:
        take = False
    elif a[1] == EMPTY:
        take = True
    elif an or bn:
        take = b[1] < a[1] if (an and bn) else (bn if np_ else an)
    else:
        take = better or (b[0] == a[0] and b[1] < a[1])
    return b if take else a


def _butterfly(parts, op, np_, idx):
    G = len(parts)
    m = min(G, 32) // 2
    while m:
        parts = [_merge(parts[l], parts[l ^ m], op, np_, idx) for l in range(G)]
        m //= 2
    r = parts[0]
    for w in range(1, G // 32):
        r = _merge(r, parts[32 * w], op, np_, idx)
    return r


def _run_values(launch, addr0, vals, op, np_, idx):
    """{output row: (value, index)} as the kernels would compute it (alpha 1, beta 0)."""
    p = launch.params
    S = p.segments
    _, _, jobs = _emulate(launch, addr0)
    res = {}
    for (row, seg), (how, lists) in jobs.items():
        parts = [_acc(v, vals, op, np_, idx) for v in lists]
        if how == "butterfly":
            r = _butterfly(parts, op, np_, idx)
        else:
            r = parts[0]
            for q in parts[1:]:
                r = _merge(r, q, op, np_, idx)
        res[(row, seg)] = r
    out = {}
    for row in range(p.rows):
        if S == 1:
            r = res[(row, 0)]
        else:  # reduce_finish
            G = p.fgroup
            lanes = []
            for lane in range(G):
                a = (_identity(op, np_), EMPTY)
                for sg in range(lane, S, G):
                    a = _merge(a, res[(row, sg)], op, np_, idx)
                lanes.append(a)
            r = _butterfly(lanes, op, np_, idx)
        v = r[0]
        if op == AVG:
            v = v / p.len
        elif op == NORM2:
            v = v ** 0.5 if v == v and v >= 0 else v
        out[row] = (v, r[1])
    return out


def _check_values(h, op, idx, np_, dtype, adims, astr, cdims, values, addrs=(0, 1)):
    a = _desc(adims, dtype, astr)
    c = _desc(cdims, F64 if dtype == F64 else F32)
    pl = R._plan(h, _r(op, idx, nan=np_), a, c)
    want, widx, scale = ref.reduce(op, 1.0, values, 0.0, None, cdims, propagate_nan=bool(np_))
    vals = {}
    for mi in itertools.product(*[range(n) for n in adims]):
        vals[sum(i * s for i, s in zip(mi, a.strides))] = float(values[mi])
    rowmap = _expected(adims, a.strides, cdims, c.strides)
    for n, launch in enumerate(pl.launches):
        for addr0 in ((0,) if (n == 0 and pl.align_mask) else addrs):
            out = _run_values(launch, addr0, vals, op, np_, idx)
            _, writes, _ = _emulate(launch, addr0)
            for row, (v, i) in out.items():
                c_off = writes[row][0]
                cidx = np.unravel_index(list(rowmap).index(c_off), cdims)
                w = want[cidx]
                if np.isnan(w):
                    assert v != v, (launch.kind, cidx, v)
                else:
                    assert abs(v - w) <= 1e-12 * max(1.0, scale[cidx]), (launch.kind, cidx, v, w)
                if idx:
                    assert i == widx[cidx], (launch.kind, cidx, i, widx[cidx])
    return pl


def test_emulated_values_nan_and_ties():
    """MIN/MAX/AMAX with many ties and NaNs (either NaN option), through every path, match the
    reference bit for bit (values and indices); the other ops match to rounding."""
    rng = np.random.default_rng(5)
    nhwc = lambda d: packed_strides(d, pydnn.PYDNN_TENSOR_NHWC)  # noqa: E731
    cases = [
        (132, (3, 5, 7, 37), None, (3, 5, 7, 1)),
        (1, (2, 20001), None, (2, 1)),
        (1, (64, 2, 16, 32), None, (1, 2, 1, 1)),
        (1, (16, 3, 16, 16), nhwc, (1, 3, 1, 1)),
        (1, (16, 16, 16, 16), nhwc, (1, 16, 1, 1)),
        (132, (3, 4, 5, 6), nhwc, (1, 4, 5, 1)),
        (1, (8, 8, 12, 12), lambda d: (3000, 300, 25, 2), (1, 1, 1, 1)),
        (132, (4, 6, 5, 7), lambda d: (1, 4, 24, 120), (1, 6, 1, 7)),
    ]
    for n, (sm, adims, st, cdims) in enumerate(cases):
        strides = st(adims) if callable(st) else st
        heavy = np.prod(adims) > 10000
        v = rng.integers(-3, 4, adims).astype(float) / 2
        v[rng.random(adims) < 0.02] = np.nan
        v[tuple(0 if c != 1 else slice(None) for c in cdims)] = np.nan  # one slice of nothing but NaN
        for op in ((MAX,) if heavy else (MIN, MAX, AMAX)):
            for np_ in (0, 1):
                _check_values(_handle(sm), op, FLAT, np_, F32, adims, strides, cdims, v)
                if not heavy:
                    _check_values(_handle(sm), op, 0, np_, F32, adims, strides, cdims, v)
        w = rng.uniform(0.5, 1.5, adims)
        w[rng.random(adims) < 0.1] = 0
        for op in ((ADD,) if heavy else (ADD, AVG, NORM1, NORM2, MNZ)):
            _check_values(_handle(sm), op, 0, 0, F32, adims, strides, cdims, w)
    small = (2, 3, 5, 7)
    _check_values(_handle(132), MUL, 0, 0, F32, small, None, (1, 3, 1, 7), rng.uniform(0.5, 1.5, small))

LAYOUTS = {"nchw": None, "nhwc": lambda d: packed_strides(d, pydnn.PYDNN_TENSOR_NHWC),
           "gaps": lambda d: (d[1] * d[2] * d[3] * 2 + 5, d[2] * d[3] * 2 + 3, d[3] * 2 + 1, 2)}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("dtype", [F32, F16, F64])
def test_emulated_plans_every_subset_of_dims(layout, dtype):
    h = _handle()
    dims = (2, 3, 5, 8)
    strides = LAYOUTS[layout](dims) if LAYOUTS[layout] else None
    for mask in itertools.product((0, 1), repeat=4):
        cdims = tuple(1 if m else d for m, d in zip(mask, dims))
        for op, idx in ((ADD, 0), (MAX, FLAT)):
            _check_plan(h, op, idx, dtype, dims, strides, cdims, addrs=(0, 3))


def test_emulated_plans_take_every_path():
    """Shapes chosen to reach each kernel, vector width, packing and the segmented second pass (a small
    sm_count makes modest problems count as 'few outputs')."""
    seen = set()
    nhwc = lambda d: packed_strides(d, pydnn.PYDNN_TENSOR_NHWC)  # noqa: E731
    cases = [
        # rows_vec, one contiguous run, odd lengths (head and tail)
        (132, ADD, 0, F32, (3, 5, 7, 37), None, (3, 5, 7, 1)),
        (132, MAX, FLAT, F16, (6, 133), None, (6, 1)),
        (1, ADD, 0, F32, (2, 40001), None, (2, 1)),          # segmented
        (1, AMAX, FLAT, F16, (2, 70001), None, (2, 1)),      # segmented, indices
        (132, ADD, 0, F64, (5, 3), None, (5, 1)),             # shorter than a vector
        # rows_vec, two dims (NCHW: reduce N, H, W), whole aligned vectors; rows_gen for unaligned A
        (132, ADD, 0, F32, (4, 3, 8, 16), None, (1, 3, 1, 1)),
        (1, MIN, FLAT, F32, (64, 2, 16, 32), None, (1, 2, 1, 1)),  # segmented
        (1, ADD, 0, F16, (9, 2, 4, 40), None, (1, 2, 1, 1)),
        # cols: kept inner dim contiguous (NHWC: reduce N, H, W), packing for small C, vectors
        (132, ADD, 0, F32, (4, 16, 6, 6), nhwc, (1, 16, 1, 1)),
        (1, ADD, 0, F32, (16, 16, 16, 16), nhwc, (1, 16, 1, 1)),  # segmented
        (1, MAX, FLAT, F32, (16, 3, 16, 16), nhwc, (1, 3, 1, 1)),  # K = 3: scalar, packed, segmented
        (132, ADD, 0, F16, (2, 72, 5, 3), nhwc, (1, 72, 1, 1)),   # K >= 32 vectors of 8
        (132, ADD, 0, F32, (2, 300, 3, 1), nhwc, (1, 300, 1, 1)),  # several tiles
        (1, NORM2, 0, F64, (512, 40, 3, 3), None, (1, 40, 3, 3)),  # NCHW reduce N: K = 360, segmented
        (132, MAX, FLAT, F32, (3, 4, 5, 6), nhwc, (1, 4, 5, 1)),  # two reduce dims, dim order
        (132, ADD, 0, F32, (7, 5, 9), (100, 1, 5), (7, 1, 9)),    # reduced dim innermost in memory, not in dims
        # rows_gen: everything strided, three reduce dims
        (132, ADD, 0, F32, (3, 4, 5, 6), lambda d: (500, 120, 23, 3), (1, 4, 1, 1)),
        (1, MAX, FLAT, F16, (8, 8, 12, 12), lambda d: (3000, 300, 25, 2), (1, 1, 1, 1)),  # segmented
        (132, ADD, 0, F32, (4, 6, 5, 7), lambda d: (1, 4, 24, 120), (1, 6, 1, 7)),
    ]
    for sm, op, idx, dt, adims, st, cdims in cases:
        strides = st(adims) if callable(st) else st
        for kind, vec, segs in _check_plan(_handle(sm), op, idx, dt, adims, strides, cdims):
            seen.add((kind, vec > 1, segs > 1))
    for need in [("rows_vec", True, False), ("rows_vec", True, True), ("cols", True, False), ("cols", True, True),
                 ("cols", False, False), ("cols", False, True), ("rows_gen", False, False),
                 ("rows_gen", False, True)]:
        assert need in seen, (need, sorted(seen))


def _gapped(dims):
    """Strides with a gap after every row of every dim (outputs must not overlap)."""
    st, acc = [], 2
    for d in reversed(dims):
        st.append(acc)
        acc = acc * d + 1
    return tuple(reversed(st))


def test_emulated_output_layouts():
    """C with its own strides (NHWC, gaps): outputs land at C's offsets, indices packed in C's dims."""
    h = _handle()
    dims = (3, 4, 5, 6)
    for cdims in ((3, 1, 5, 6), (3, 4, 1, 1), (1, 4, 5, 1), (3, 4, 5, 6)):
        for cst in (packed_strides(cdims, pydnn.PYDNN_TENSOR_NHWC),
                    _gapped(cdims)):
            for astr in (None, packed_strides(dims, pydnn.PYDNN_TENSOR_NHWC)):
                _check_plan(h, MAX, FLAT, F32, dims, astr, cdims, cst)
                _check_plan(h, ADD, 0, F16, dims, astr, cdims, cst)


def test_plans_choose_the_expected_kernels():
    h = _handle()
    summary = R.plan_summary
    # rows of 4096 (the benchmark): rows_vec, 4-wide, one pass
    assert summary(h, _r(), _desc((16384, 4096, 1, 1)), _desc((16384, 1, 1, 1)))[0][:2] == ("rows_vec", 4)
    # BN statistics, NCHW: reduce N, H, W -> rows_vec over two dims (aligned) or rows_gen
    s = summary(h, _r(), _desc((64, 64, 56, 56)), _desc((1, 64, 1, 1)))
    assert [x[0] for x in s] == ["rows_vec", "rows_gen"] and s[0][3] > 1
    # BN statistics, NHWC: cols with vectors, segmented
    nhwc = _desc((64, 64, 56, 56), F16, packed_strides((64, 64, 56, 56), pydnn.PYDNN_TENSOR_NHWC))
    s = summary(h, _r(), nhwc, _desc((1, 64, 1, 1), F16))
    assert s[0][:2] == ("cols", 8) and s[0][3] > 1 and s[1][:2] == ("cols", 1)
    # full reduction of 2^27: segmented, every SM busy
    s = summary(h, _r(), _desc((1 << 27,)), _desc((1,)))
    assert s[0][0] == "rows_vec" and s[0][3] >= 132

