"""Dropout on the CPU: the numpy Philox against Random123's known answers, the reference mask's
properties (a pure function of seed, offset and element index; the kept fraction within 6 sigma of
1 - p), every validation error (status + the argument it names) of every call, the descriptor's
set / restore / get on a CPU-only handle, and an emulation of the kernels' index arithmetic from their
real parameter structs (every element visited once, at the right offset)."""
import math

import numpy as np
import pytest

import pydnn
from pydnn.ops import dropout as D
from pydnn.reference import dropout as ref
from pydnn.tensor import packed_strides
from test_fuzz_cpu import _call, _desc, cpu_handle

F32, F64, F16, BF16 = (pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DATA_DOUBLE, pydnn.PYDNN_DATA_HALF,
                       pydnn.PYDNN_DATA_BFLOAT16)
BAD, NS = pydnn.PYDNN_STATUS_BAD_PARAM, pydnn.PYDNN_STATUS_NOT_SUPPORTED
NULL, MIS = pydnn.PYDNN_STATUS_BAD_PARAM_NULL_POINTER, pydnn.PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER
NOINIT = pydnn.PYDNN_STATUS_NOT_INITIALIZED  # everything valid: the CPU-only handle refuses at kernel lookup
OK = pydnn.PYDNN_STATUS_SUCCESS
X, Y, R, S = 1 << 40, 1 << 41, 1 << 42, 1 << 43


def _check(fn, args, status, needle=""):
    st = _call(fn, *args)
    msg = pydnn.get_last_error_string() if st != OK else ""
    assert st == status, (st, msg)
    assert needle in msg, msg


# ----------------------------------------------------------------------------- the generator

KAT = [  # Random123 tests/kat_vectors, philox4x32 10: counter, key -> output
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("ctr,key,want", KAT)
def test_philox_known_answers(ctr, key, want):
    assert tuple(int(v) for v in ref.philox4x32_10(ctr, key)) == want


def test_philox_vectorised_equals_one_at_a_time(rng):
    ctr = rng.integers(0, 2**32, (50, 4), dtype=np.uint64).astype(np.uint32)
    key = rng.integers(0, 2**32, (50, 2), dtype=np.uint64).astype(np.uint32)
    many = ref.philox4x32_10(ctr, key)
    for i in range(50):
        assert (ref.philox4x32_10(ctr[i], key[i]) == many[i]).all()


def test_stream_convention():
    """Block b of stream (seed, offset) = Philox(counter (b lo, b hi, offset lo, offset hi), key (seed lo, hi))."""
    seed, offset, b = 0x0123456789ABCDEF, 0xFEDCBA9876543210, 0x1122334455667788
    got = ref.stream_blocks(seed, offset, np.array([b], np.uint64))[0]
    want = ref.philox4x32_10([b & 0xFFFFFFFF, b >> 32, offset & 0xFFFFFFFF, offset >> 32],
                             [seed & 0xFFFFFFFF, seed >> 32])
    assert (got == want).all()


def test_mask_is_a_function_of_seed_offset_and_index(rng):
    n = 10007
    full = ref.keep_mask(7, 3, n, 0.4)
    for a, b in ((0, 1), (5, 13), (8, 16), (9999, n), (1234, 5678)):
        assert (ref.keep_mask(7, 3, b - a, 0.4, first=a) == full[a:b]).all()
    # element 8g + j takes the 16-bit slice j of block g: low half of word j // 2 for even j
    words = ref.stream_blocks(7, 3, np.arange(4, dtype=np.uint64))
    slices = [(int(words[g][j // 2]) >> (16 * (j % 2))) & 0xFFFF for g in range(4) for j in range(8)]
    thr = ref.threshold(0.4)
    assert list(full[:32]) == [s >= thr for s in slices]
    assert (ref.keep_mask(8, 3, n, 0.4) != full).any()
    assert (ref.keep_mask(7, 4, n, 0.4) != full).any()
    assert (ref.keep_mask(7, 3 + 2**32, n, 0.4) != full).any()  # the offset's high word counts


def test_threshold_and_resolution():
    assert ref.threshold(0.0) == 0 and ref.threshold(1.0) == 65536 and ref.threshold(0.5) == 32768
    for p in (0.0, 1e-6, 0.1, 1 / 3, 0.5, 0.9, 0.99999, 1.0):
        assert ref.threshold(p) == D.threshold(p)
        assert abs(ref.threshold(p) / 65536 - p) <= 2**-17
    assert ref.keep_mask(1, 0, 1000, 0.0).all() and not ref.keep_mask(1, 0, 1000, 1.0).any()


@pytest.mark.parametrize("p", [0.01, 0.1, 0.3, 0.5, 0.8, 0.97])
def test_kept_fraction_is_binomial(p, rng):
    n = 1 << 20
    seed, offset = int(rng.integers(0, 2**63)), int(rng.integers(0, 1000))
    kept = int(ref.keep_mask(seed, offset, n, p).sum())
    q = 1 - ref.threshold(p) / 65536
    assert abs(kept - q * n) < 6 * math.sqrt(n * q * (1 - q)), (kept, q * n)


def test_pack_unpack():
    keep = np.array([1, 0, 1, 1, 0, 0, 0, 1, 1, 1, 0], bool)
    packed = ref.pack_mask(keep)
    assert list(packed) == [0b10001101, 0b011]
    assert (ref.unpack_mask(packed, 11) == keep).all()


def test_reference_forward_backward():
    x = np.array([[1.0, -2.0], [np.inf, 4.0]])
    keep = np.array([True, False, False, True])
    assert (ref.forward(x, keep, 0.5) == np.array([[2.0, 0.0], [0.0, 8.0]])).all()
    assert (ref.forward(x, np.ones(4, bool), 1.0) == 0).all()
    assert (ref.backward(x, keep, 0.0) == np.where(keep.reshape(2, 2), x, 0)).all()


# ----------------------------------------------------------------------------- descriptors and sizes

def test_descriptor_set_restore_get():
    h = cpu_handle()
    d = pydnn.create_dropout_descriptor()
    assert pydnn.get_dropout_descriptor(d, h) == (0.0, 0, 0)
    pydnn.set_dropout_descriptor(d, h, 0.25, None, 0, 99)  # NULL states: the dropout value only
    assert pydnn.get_dropout_descriptor(d, h) == (0.25, 0, 0)
    pydnn.restore_dropout_descriptor(d, h, 0.5, S, 32, 1234)  # nothing launched: works on a CPU handle
    assert pydnn.get_dropout_descriptor(d, h) == (0.5, S, 1234)
    pydnn.set_dropout_descriptor(d, h, 0.75, 0, 0, 5)
    assert pydnn.get_dropout_descriptor(d, h) == (0.75, S, 1234)  # states and seed kept
    _check(pydnn.set_dropout_descriptor, (d, h, 0.5, S, 32, 7), NOINIT)  # valid: stops at the init kernel
    assert pydnn.get_dropout_descriptor(d, h) == (0.75, S, 1234)  # a failed set changes nothing
    assert pydnn.dropout_get_states_size(h) == D.STATE_BYTES == 32
    pydnn.destroy_dropout_descriptor(d)
    pydnn.destroy_dropout_descriptor(None)
    _check(pydnn.get_dropout_descriptor, (d, h), BAD, "dropoutDesc: not a live dropout descriptor")


def test_set_and_restore_validation():
    h = cpu_handle()
    d = pydnn.create_dropout_descriptor()
    for fn in (pydnn.set_dropout_descriptor, pydnn.restore_dropout_descriptor):
        _check(fn, (d, h, -0.1, S, 32, 1), BAD, "dropout: -0.1 is outside [0, 1]")
        _check(fn, (d, h, 1.5, S, 32, 1), BAD, "dropout: 1.5 is outside [0, 1]")
        _check(fn, (d, h, float("nan"), S, 32, 1), BAD, "dropout: nan")
        _check(fn, (d, h, "half", S, 32, 1), BAD, "dropout: expected a number")
        _check(fn, (d, h, 0.5, S, 16, 1), BAD, "stateSizeInBytes: 16 is less than the 32 bytes")
        _check(fn, (d, h, 0.5, S, -1, 1), BAD, "stateSizeInBytes: -1 is not a size")
        _check(fn, (d, h, 0.5, S + 4, 32, 1), MIS, "states: 0x")
        _check(fn, (d, h, 0.5, S, 32, -1), BAD, "seed: -1 is not an unsigned 64-bit")
        _check(fn, (d, h, 0.5, S, 32, 2**64), BAD, "seed:")
        _check(fn, (d, "h", 0.5, S, 32, 1), BAD, "handle:")
        _check(fn, ("d", h, 0.5, S, 32, 1), BAD, "dropoutDesc: not a live")
        _check(fn, (d, h, 0.5, "states", 32, 1), BAD, "states: str is not a device pointer")
    _check(pydnn.restore_dropout_descriptor, (d, h, 0.5, None, 32, 1), NULL, "states: NULL")
    _check(pydnn.set_dropout_descriptor, (d, h, 0.5, None, 0, 1), OK)  # NULL states: fine for Set
    _check(pydnn.set_dropout_descriptor, (d, h, 0.5, S, 2**20, 2**64 - 1), NOINIT)  # valid
    _check(pydnn.dropout_get_states_size, ("h",), BAD, "handle:")


def test_reserve_space_size():
    assert pydnn.dropout_get_reserve_space_size(_desc((2, 3, 4, 5))) == 15
    assert pydnn.dropout_get_reserve_space_size(_desc((11, 11), F16)) == 16
    assert pydnn.dropout_get_reserve_space_size(_desc((1,), F64)) == 1
    assert pydnn.dropout_get_reserve_space_size(_desc((2, 8, 3), BF16, (100, 3, 1))) == 6  # elements, not span
    _check(pydnn.dropout_get_reserve_space_size, (_desc((4, 4), pydnn.PYDNN_DATA_INT8),), NS, "xdesc: data type")
    _check(pydnn.dropout_get_reserve_space_size, (None,), BAD, "xdesc: not a live tensor descriptor")


def _ready(p=0.5, states=S):
    d = pydnn.create_dropout_descriptor()
    if states:
        pydnn.restore_dropout_descriptor(d, cpu_handle(), p, states, 32, 1)
    else:
        pydnn.set_dropout_descriptor(d, cpu_handle(), p, None, 0, 1)
    return d


@pytest.mark.parametrize("backward", [False, True])
def test_forward_backward_validation(backward):
    h = cpu_handle()
    fn = pydnn.dropout_backward if backward else pydnn.dropout_forward
    i, o = ("dydesc", "dxdesc") if backward else ("xdesc", "ydesc")
    ib, ob = i[:-4], o[:-4]
    d, t = _ready(), _desc((2, 3, 4, 5))
    _check(fn, (h, d, t, X, t, Y, R, 15), NOINIT)
    _check(fn, (h, d, t, X, t, X, R, 15), NOINIT)  # in place
    _check(fn, (h, d, t, X, t, Y, R, 14), BAD, "reserveSpaceSizeInBytes: 14 is less than the 15 bytes")
    _check(fn, (h, d, t, X, t, Y, R, -3), BAD, "reserveSpaceSizeInBytes: -3 is not a size")
    _check(fn, (h, d, t, X, t, Y, None, 15), NULL, "reserveSpace: NULL")
    _check(fn, (h, d, t, X, t, Y, R + 1, 15), NOINIT)  # the mask is bytes: any alignment
    _check(fn, (h, d, t, X, _desc((2, 3, 4, 6)), Y, R, 15), BAD, f"{o}: dims (2, 3, 4, 6) differ from {i} dims")
    _check(fn, (h, d, t, X, _desc((120,)), Y, R, 15), BAD, f"{o}: dims")  # same count, other dims: refused
    _check(fn, (h, d, t, X, _desc((2, 3, 4, 5), F16), Y, R, 15), BAD, f"{o}: data type")
    i8 = _desc((2, 3, 4, 5), pydnn.PYDNN_DATA_INT8)
    _check(fn, (h, d, i8, X, i8, Y, R, 15), NS, f"{i}: data type")
    _check(fn, (h, d, t, X, _desc((2, 3, 4, 5), pydnn.PYDNN_DATA_INT32), Y, R, 15), NS, f"{o}: data type")
    _check(fn, (h, d, t, X, _desc((2, 3, 4, 5), F32, (1, 1, 1, 1)), Y, R, 15), BAD, f"{o}: strides")
    _check(fn, (h, d, _desc((2, 3, 4, 5), F32, (1, 1, 1, 1)), X, t, Y, R, 15), NOINIT)  # an input may overlap
    _check(fn, (h, d, t, 0, t, Y, R, 15), NULL, f"{ib}: NULL")
    _check(fn, (h, d, t, X, t, None, R, 15), NULL, f"{ob}: NULL")
    _check(fn, (h, d, t, X + 2, t, Y, R, 15), MIS, f"{ib}: 0x")
    _check(fn, (h, d, t, X, t, Y + 1, R, 15), MIS, f"{ob}: 0x")
    hd = _desc((2, 3, 4, 5), F16)
    _check(fn, (h, d, hd, X + 2, hd, Y + 6, R, 15), NOINIT)  # element alignment is enough
    _check(fn, (h, d, None, X, t, Y, R, 15), BAD, f"{i}: not a live tensor descriptor")
    _check(fn, (h, d, t, X, pydnn.create_tensor_descriptor(), Y, R, 15), BAD, f"{o}: descriptor was never set")
    _check(fn, ("h", d, t, X, t, Y, R, 15), BAD, "handle:")
    _check(fn, (h, "d", t, X, t, Y, R, 15), BAD, "dropoutDesc: not a live dropout descriptor")
    _check(fn, (h, pydnn.create_dropout_descriptor(), t, X, t, Y, R, 15), BAD, "dropoutDesc: descriptor was never set")
    # no states buffer: a forward needs one unless p is 0 or 1; a backward never does
    for p, ok in ((0.5, backward), (1e-6, True), (0.0, True), (1.0, True), (0.9999999, True)):
        _check(fn, (h, _ready(p, states=0), t, X, t, Y, R, 15), NOINIT if ok else BAD,
               "" if ok else "dropoutDesc: dropout 0.5 needs a states buffer")


# ----------------------------------------------------------------------------- kernel planning, emulated

class _Funcs(dict):
    """A CPU handle whose kernel lookups return the name expression (the plan is inspected, not run)."""

    def get(self, key, default=None):
        return key[1]


def _plan_handle():
    h = cpu_handle()
    h._funcs = _Funcs()
    return h


def _emulate_dense(pl, vec):
    """The dense kernel's warp tiles (ptx/dropout.cu, dense_body), replayed lane by lane: every element of
    the whole groups is loaded and stored once, by a vector access aligned to VEC elements, with the keep
    bit of its own group (taken from the lane that owns the group) at its own position; every mask byte is
    written once by its owner; the partial group goes to thread 0 of block 0."""
    p = pl.params
    n, full = p.n, p.n >> 3
    G, NV, warps = D.GROUPS[pl.tag], 8 // vec, D.THREADS // 32
    seen = np.zeros(n, np.int64)
    mask_writes = np.zeros(p.groups, np.int64)
    for block in range(pl.grid[0]):
        for u in range(G):
            for warp in range(warps):
                g0 = ((block * G + u) * warps + warp) * 32
                for lane in range(32):
                    if g0 + lane < full:
                        mask_writes[g0 + lane] += 1
                    for k in range(NV):
                        w = k * 32 + lane
                        owner = w // NV  # the lane whose bits this vector takes
                        g = g0 + owner
                        if g < full:
                            first = (w % NV) * vec
                            for e in range(vec):
                                i = (g0 * NV + w) * vec + e  # the element this vector access touches
                                assert i == 8 * g + first + e  # ... is bit first + e of its group
                                seen[i] += 1
    if n % 8:
        seen[full * 8:] += 1
        mask_writes[full] += 1
    assert (seen == 1).all(), np.flatnonzero(seen != 1)[:10]
    assert (mask_writes == 1).all()


def _emulate_tile(pl, size, st):
    """The tile kernel (ptx/dropout.cu, tile_body) replayed: which memory element each tile slot reads and
    writes, and which group / bit the processing pass gives it. Returns (out offsets, in offsets) in
    logical order; checks every element is processed once with the bit of its own logical index."""
    p = pl.params
    nd, TA, TB, T = p.ndim, D.TILE_A, D.TILE_B, D.THREADS
    na, nb = size[-2], size[-1]
    ta_n, tb_n = -(-na // TA), -(-nb // TB)
    assert pl.grid[0] == int(np.prod(size[:-2], dtype=np.int64)) * ta_n * tb_n
    outs, ins = np.full(p.n, -1, np.int64), np.full(p.n, -1, np.int64)
    done = np.zeros(p.n, np.int64)
    for bid in range(pl.grid[0]):
        tb, rest = bid % tb_n, bid // tb_n
        ta, batch = rest % ta_n, rest // ta_n
        o0 = o1 = 0
        r = batch
        for d in range(nd - 3, -1, -1):
            r, c = divmod(r, size[d])
            o0 += c * st[0][d]
            o1 += c * st[1][d]
        a0, b0 = ta * TA, tb * TB
        wa, wb = min(TA, na - a0), min(TB, nb - b0)
        slot_in, slot_out = {}, {}
        for t in range(T):  # read and write passes: thread (tx, ty) moves slot (tx, r + ty)
            tx, ty = t % TA, t // TA
            for rr in range(0, TB, T // TA):
                b = rr + ty
                if tx < wa and b < wb:
                    slot_in[(tx, b)] = o1 + a0 + b0 * st[1][-1] + tx + b * st[1][-1]
                    slot_out[(tx, b)] = o0 + a0 + b0 * st[0][-1] + tx + b * st[0][-1]
        first_row = (batch * na + a0) * nb + b0
        for t in range(T):  # processing pass: thread (j, arow) takes group j of rows arow, arow + 32
            j, arow = t % 8, t // 8
            for h in range(0, TA, T // 8):
                a = arow + h
                if a < wa and 8 * j < wb:
                    assert (first_row + a * nb) % 8 == 0
                    g = (first_row + a * nb) // 8 + j
                    for e in range(8):
                        i = 8 * g + e  # the element whose keep bit is bit e of group g ...
                        # ... is the one in tile slot (a, 8j + e): logical (batch, a0 + a, b0 + 8j + e)
                        assert i == (batch * na + a0 + a) * nb + b0 + 8 * j + e
                        outs[i], ins[i] = slot_out[(a, 8 * j + e)], slot_in[(a, 8 * j + e)]
                        done[i] += 1
    assert (done == 1).all()
    return outs, ins


def _emulate(pl, out_strides_full, in_strides_full, dims):
    """Replay the kernels' index arithmetic from the plan's params: for each logical element i, where
    the kernel reads and writes it. Returns (out offsets, in offsets) in logical order."""
    p = pl.params
    n = p.n
    if pl.dense:
        for vec in (16 // D._SIZES[pl.tag], 1):
            _emulate_dense(pl, vec)
        return np.arange(n), np.arange(n)  # dense: memory index = logical index
    nd = p.ndim
    size = [p.size[d] for d in range(nd)]
    st = [[p.stride[k][d] for d in range(nd)] for k in range(2)]
    if "_tile<" in pl.func:
        return _emulate_tile(pl, size, st)

    def offsets_of(i):
        o0 = o1 = inner = 0
        for d in range(nd - 1, -1, -1):
            q, c = divmod(i, size[d])
            if d == nd - 1:
                inner = c
            o0 += c * st[0][d]
            o1 += c * st[1][d]
            i = q
        return inner, o0, o1

    outs, ins = [], []
    for g in range(p.groups):
        first = g * 8
        cnt = min(8, n - first)
        inner, o0, o1 = offsets_of(first)
        for j in range(cnt):
            outs.append(o0)
            ins.append(o1)
            inner += 1
            if inner < size[-1]:
                o0 += st[0][-1]
                o1 += st[1][-1]
            elif j + 1 < cnt:
                inner, o0, o1 = offsets_of(first + j + 1)
    return np.array(outs), np.array(ins)


LAYOUTS = [  # dims, y layout, x layout, the tile kernel? (None: strided or dense)
    ((2, 3, 4, 5), None, None, None),                             # dense
    ((3, 1, 7, 1), None, None, None),                             # dense with size-1 dims
    ((2, 3, 4, 5), "nhwc", "nhwc", None),                         # strided: H*W = 20 not a multiple of 8
    ((2, 3, 4, 6), "nhwc", "nhwc", "tile"),                       # tile: H*W = 24, C = 3 < 64
    ((2, 70, 3, 48), "nhwc", "nhwc", "tile"),                     # tile: partial tiles along C and H*W
    ((1, 130, 9, 8), (10**5, 1, 8 * 136, 136), "nhwc", "tile"),  # tile: y with channels padded to 136
    ((2, 3, 4, 5), None, "nhwc", None),                           # different layouts
    ((3, 5, 4, 6), (400, 80, 16, 2), None, None),                 # gaps in y
    ((2, 5, 3), (1, 2, 10), (15, 3, 1), None),                    # N innermost in y
    ((4, 1, 13), (20, 99, 1), (13, 13, 1), None),                 # padded rows: rows cross group bounds
    ((1, 1, 1), None, None, None),                                # one element
    ((3, 1001, 7), None, None, None),                             # dense: several blocks, a partial tile
]


@pytest.mark.parametrize("dims,ylay,xlay,tile", LAYOUTS)
@pytest.mark.parametrize("dtype", [F32, BF16, F64])
def test_plans_visit_every_element_once_where_it_lives(dims, ylay, xlay, tile, dtype):
    def strides(lay):
        if lay is None:
            return packed_strides(dims, pydnn.PYDNN_TENSOR_NCHW)
        if lay == "nhwc":
            return packed_strides(dims, pydnn.PYDNN_TENSOR_NHWC)
        return lay
    ys, xs = strides(ylay), strides(xlay)
    yd, xd = _desc(dims, dtype, ys), _desc(dims, dtype, xs)
    d = _ready()
    for backward in (False, True):
        pl = D._plan(_plan_handle(), backward, d, yd, xd)
        n = int(np.prod(dims))
        assert pl.params.groups == (n + 7) // 8 == pl.reserve
        assert pl.dense == (xlay is None and ylay is None)
        assert (pl.params.state is None) == backward
        k = "bwd" if backward else "fwd"
        if pl.dense:
            assert f"::{k}<" in pl.func
        else:
            assert (f"::{k}_tile<" in pl.func) == (tile is not None), pl.func
            assert (f"::{k}_strided<" in pl.func) == (tile is None), pl.func
        outs, ins = _emulate(pl, ys, xs, dims)
        coords = np.array(np.unravel_index(np.arange(n), dims)).T  # row-major logical order
        assert (outs == coords @ np.array(ys)).all()
        assert (ins == coords @ np.array(xs)).all()


def test_plan_scalars():
    h = _plan_handle()
    t = _desc((2, 3, 4, 5))
    for p, thr, scale in ((0.0, 0, 1.0), (0.5, 32768, 2.0), (1.0, 65536, 0.0), (0.1, 6554, 1 / 0.9)):
        pl = D._plan(h, False, _ready(p), t, t)
        assert pl.params.threshold == thr
        assert pl.params.scale == pytest.approx(scale, rel=1e-15)
        assert pl.params.state == S
    pl = D._plan(h, False, _ready(0.0, states=0), t, t)
    assert pl.params.state is None


def test_kernel_units():
    units = {u.name: u for u in D.kernel_units()}
    assert set(units) == {"dropout.f32", "dropout.f64", "dropout.f16", "dropout.bf16", "dropout.misc"}
    assert "pydnn::dropout::fwd<pydnn::bf16_t, 8>" in units["dropout.bf16"].exprs
    assert "pydnn::dropout::bwd<double, 2>" in units["dropout.f64"].exprs


def test_c_declarations():
    from pydnn.capi import decl, impl

    protos = {impl.parse(p)[1]: impl.parse(p) for p in decl.prototypes()}
    for name in ("pydnnCreateDropoutDescriptor", "pydnnDestroyDropoutDescriptor", "pydnnDropoutGetStatesSize",
                 "pydnnDropoutGetReserveSpaceSize", "pydnnSetDropoutDescriptor", "pydnnRestoreDropoutDescriptor",
                 "pydnnGetDropoutDescriptor", "pydnnDropoutForward", "pydnnDropoutBackward"):
        assert name in protos
        assert hasattr(pydnn, impl.snake(name[len("pydnn"):]))
    kinds = [(k, b) for k, b, _ in protos["pydnnGetDropoutDescriptor"][2]]
    assert kinds[2:] == [("out", "float"), ("out", "void *"), ("out", "unsigned long long")]
    assert [k for k, _, _ in protos["pydnnSetDropoutDescriptor"][2]] == ["obj_in", "obj_in", "in", "devptr", "in", "in"]


def test_c_marshalling_of_get_dropout_descriptor(monkeypatch):
    """The C face of GetDropoutDescriptor (the one `void **` output in the API) writes the float, the
    device address and the seed through the caller's pointers (impl.Marshal with a real cffi FFI)."""
    cffi = pytest.importorskip("cffi")
    from pydnn.capi import decl, impl

    ffi = cffi.FFI()
    ffi.cdef(decl.types_block())
    proto = next(p for p in decl.prototypes() if "pydnnGetDropoutDescriptor(" in p)
    m = impl.Marshal(ffi, proto)
    d, h = pydnn.create_dropout_descriptor(), cpu_handle()
    pydnn.restore_dropout_descriptor(d, h, 0.375, S, 32, 2**64 - 5)
    keep = []
    for obj in (d, h):
        ch = ffi.new_handle(obj)
        keep.append(ch)
        impl._objects[int(ffi.cast("uintptr_t", ch))] = (ch, obj)
    dd, hh = ffi.cast("pydnnDropoutDescriptor_t", keep[0]), ffi.cast("pydnnHandle_t", keep[1])
    pf, ps, pseed = ffi.new("float *"), ffi.new("void **"), ffi.new("unsigned long long *")
    try:
        m(dd, hh, pf, ps, pseed)
        assert pf[0] == 0.375 and int(ffi.cast("uintptr_t", ps[0])) == S and pseed[0] == 2**64 - 5
        pydnn.set_dropout_descriptor(d, h, 0.5, None, 0, 0)
        d.states = 0
        m(dd, hh, pf, ps, pseed)
        assert ps[0] == ffi.NULL
        with pytest.raises(pydnn.PydnnError) as e:
            m(dd, hh, pf, ffi.NULL, pseed)
        assert e.value.status == NULL
    finally:
        for ch in keep:
            impl._objects.pop(int(ffi.cast("uintptr_t", ch)), None)


def test_kernels_do_not_spill():
    """Every dropout kernel compiles (sm_90) without spilling to local memory: the register caps of the
    dense kernels (MinBlocks in ptx/dropout.cu) were chosen for that."""
    import re

    from pydnn._build import cache
    from pydnn._build.manifest import COMMON_OPTIONS
    from pydnn._cuda import nvrtc

    for unit in D.kernel_units():
        text, _ = cache.unit_inputs(unit)
        _, lowered, log = nvrtc.compile_cubin(text, unit.source, unit.exprs, "sm_90",
                                              COMMON_OPTIONS + tuple(unit.options) + ("--ptxas-options=-v",),
                                              [str(cache.ptx_dir())])
        names = {v: k for k, v in lowered.items()}
        spills, current = {}, None
        for line in log.splitlines():
            m = re.search(r"Function properties for (\S+)", line)
            if m:
                current = names.get(m.group(1))
            m = re.search(r"(\d+) bytes spill stores", line)
            if m and current:
                spills[current] = int(m.group(1))
        assert set(spills) == set(unit.exprs), (unit.name, sorted(spills))
        assert not any(spills.values()), {e: v for e, v in spills.items() if v}
