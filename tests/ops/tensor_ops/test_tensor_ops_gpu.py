"""Tensor ops on the GPU against float64 references: every op and dtype, broadcasting, strides with gaps,
in-place, alpha/beta (outputs start poisoned: beta = 0 must never read them), NCHW <-> NHWC and other
transposes (vector and scalar tile kernels, tails, several batch dims, misaligned pointers), conversions
between all eight data types with rounding and saturation, and tensors of more than 2^31 elements."""
import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

import pydnn
from devtensor import POISON, DevTensor, assert_close
from pydnn.reference import dtypes as rd
from pydnn.reference import tensor_ops as ref
from pydnn.tensor import DTYPES, packed_strides

pytestmark = pytest.mark.gpu

F32, F64, F16, BF16 = (pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DATA_DOUBLE, pydnn.PYDNN_DATA_HALF,
                       pydnn.PYDNN_DATA_BFLOAT16)
I8, U8, I32, I64 = pydnn.PYDNN_DATA_INT8, pydnn.PYDNN_DATA_UINT8, pydnn.PYDNN_DATA_INT32, pydnn.PYDNN_DATA_INT64
FLOATS = [F32, F16, BF16, F64]
INTS = [I8, U8, I32, I64]
ALL = FLOATS + INTS
OPS = [pydnn.PYDNN_OP_TENSOR_ADD, pydnn.PYDNN_OP_TENSOR_MUL, pydnn.PYDNN_OP_TENSOR_MIN, pydnn.PYDNN_OP_TENSOR_MAX,
       pydnn.PYDNN_OP_TENSOR_SQRT, pydnn.PYDNN_OP_TENSOR_NOT]
SQRT, NOT = pydnn.PYDNN_OP_TENSOR_SQRT, pydnn.PYDNN_OP_TENSOR_NOT
NHWC = pydnn.PYDNN_TENSOR_NHWC
INT_NP = {I8: np.int8, U8: np.uint8, I32: np.int32, I64: np.int64}


def _strides(dims, layout):
    return packed_strides(dims, NHWC) if layout == "nhwc" else layout


def _comp(dtype):
    return F64 if dtype == F64 else F32


def _op_desc(op, dtype, nan=pydnn.PYDNN_NOT_PROPAGATE_NAN):
    d = pydnn.create_op_tensor_descriptor()
    pydnn.set_op_tensor_descriptor(d, op, _comp(dtype), nan)
    return d


def _upload_raw(t, values):
    """Exact values of t's numpy type into its strided layout (int64 beyond 2^53 survives); gaps stay
    poisoned."""
    flat = t.buf.to_numpy()
    t._view(flat)[...] = values
    t.buf.copy_from_numpy(flat)


def _download_raw(t):
    return np.array(t._view(t.buf.to_numpy()))


# ------------------------------------------------------------------------------------------ OpTensor
# (C dims, A dims, B dims, C layout): dense, bias-like B, A broadcast, NHWC, 1 element, long odd row,
# gaps between elements and rows, both inputs broadcast, 5-d.
OP_CASES = [
    ((2, 3, 5, 7), (2, 3, 5, 7), (2, 3, 5, 7), None),
    ((2, 3, 5, 7), (2, 3, 5, 7), (1, 3, 1, 1), None),
    ((2, 3, 5, 7), (1, 3, 1, 7), (2, 3, 5, 7), None),
    ((3, 17, 9, 11), (3, 17, 9, 11), (3, 17, 9, 11), "nhwc"),
    ((3, 17, 9, 11), (3, 17, 9, 11), (1, 17, 1, 1), "nhwc"),
    ((1, 1, 1, 1), (1, 1, 1, 1), (1, 1, 1, 1), None),
    ((1, 1, 1, 100003), (1, 1, 1, 100003), (1, 1, 1, 1), None),
    ((2, 3, 4, 5), (2, 3, 4, 5), (2, 1, 4, 1), (200, 50, 12, 2)),
    ((2, 3, 4, 5), (1, 3, 1, 5), (2, 1, 4, 1), None),
    ((2, 3, 4, 5, 6), (2, 3, 4, 5, 6), (1, 3, 1, 1, 1), None),
]


def _op_scale(op, a1, av, a2, bv):
    """Magnitude of the terms a result is computed from (rounding error scales with them)."""
    if op == SQRT:
        return None
    if op == NOT:
        return 1 + np.abs(a1 * av)
    return np.abs(a1 * av) + np.abs(a2 * bv)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", OPS)
def test_op_tensor(handle, rng, op, dtype):
    for cdims, adims, bdims, layout in OP_CASES:
        strides = _strides(cdims, layout)
        a, b, c = DevTensor(adims, dtype), DevTensor(bdims, dtype), DevTensor(cdims, dtype, strides)
        av = a.random(rng, 0.0 if op == SQRT else -3.0, 3.0)
        bv = b.random(rng)
        desc = _op_desc(op, dtype)
        a1 = float(rng.uniform(0.25, 2)) if op == SQRT else float(rng.uniform(-2, 2))
        a2 = float(rng.uniform(-2, 2))
        pydnn.op_tensor(handle, desc, a1, a.desc, a.ptr, a2, b.desc, b.ptr, 0.0, c.desc, c.ptr)
        want = np.broadcast_to(ref.op_tensor(op, a1, av, a2, bv, 0.0, None), cdims)
        scale = _op_scale(op, a1, av, a2, bv)
        scale = None if scale is None else np.broadcast_to(scale, cdims)
        assert_close(c.download(), want, dtype, f"op {op} {cdims} a{adims} b{bdims}", scale=scale)
        c.check_untouched()
        c0 = c.random(rng)
        beta = float(rng.uniform(-2, 2))
        pydnn.op_tensor(handle, desc, a1, a.desc, a.ptr, a2, b.desc, b.ptr, beta, c.desc, c.ptr)
        want = ref.op_tensor(op, a1, av, a2, bv, beta, c0)
        s2 = (np.abs(want - beta * c0) if scale is None else scale) + np.abs(beta * c0)
        assert_close(c.download(), want, dtype, f"op {op} blend {cdims}", scale=s2)
        c.check_untouched()


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_op_tensor_unary_ignores_b(handle, rng, dtype):
    dims = (2, 3, 5, 7)
    a, c = DevTensor(dims, dtype), DevTensor(dims, dtype)
    av = a.random(rng, 0.0, 3.0)
    for op in (SQRT, NOT):
        pydnn.op_tensor(handle, _op_desc(op, dtype), 1.5, a.desc, a.ptr, 1.0, None, None, 0.0, c.desc, c.ptr)
        assert_close(c.download(), ref.op_tensor(op, 1.5, av, 1.0, None, 0.0, None), dtype, f"unary {op}",
                     scale=None if op == SQRT else 1 + np.abs(1.5 * av))


def test_op_tensor_in_place(handle, rng):
    dims = (4, 8, 6, 6)
    for dtype in (F32, F16):
        a, b = DevTensor(dims, dtype), DevTensor(dims, dtype)
        av, bv = a.random(rng), b.random(rng)
        # C is A
        pydnn.op_tensor(handle, _op_desc(pydnn.PYDNN_OP_TENSOR_MUL, dtype), 1.0, a.desc, a.ptr, 1.0, b.desc, b.ptr,
                        0.0, a.desc, a.ptr)
        assert_close(a.download(), av * bv, dtype, "C is A")
        av = a.download()
        # C is B, with blending: B = A + 2B - B
        pydnn.op_tensor(handle, _op_desc(pydnn.PYDNN_OP_TENSOR_ADD, dtype), 1.0, a.desc, a.ptr, 2.0, b.desc, b.ptr,
                        -1.0, b.desc, b.ptr)
        assert_close(b.download(), av + bv, dtype, "C is B", scale=np.abs(av) + 3 * np.abs(bv))
        # A, B and C the same buffer
        bv = b.download()
        pydnn.op_tensor(handle, _op_desc(pydnn.PYDNN_OP_TENSOR_MAX, dtype), 1.0, b.desc, b.ptr, -1.0, b.desc, b.ptr,
                        0.0, b.desc, b.ptr)
        assert_close(b.download(), np.abs(bv), dtype, "A, B and C one buffer")


@pytest.mark.parametrize("dtype", [F32, F16, BF16, F64])
def test_op_tensor_nan_propagation(handle, rng, dtype):
    dims = (4, 8, 6, 6)
    a, b = DevTensor(dims, dtype), DevTensor(dims, dtype)
    v = a.random(rng).copy()
    v[0, 0, 0, :3] = np.nan
    av = a.upload(v)
    w = b.random(rng).copy()
    w[0, 0, 0, 1:5] = np.nan  # NaN in both at [1], [2]; in one only at [0], [3], [4]
    bv = b.upload(w)
    for op in (pydnn.PYDNN_OP_TENSOR_MIN, pydnn.PYDNN_OP_TENSOR_MAX):
        for nan in (pydnn.PYDNN_NOT_PROPAGATE_NAN, pydnn.PYDNN_PROPAGATE_NAN):
            c = DevTensor(dims, dtype)
            pydnn.op_tensor(handle, _op_desc(op, dtype, nan), 1.0, a.desc, a.ptr, 1.0, b.desc, b.ptr, 0.0, c.desc,
                            c.ptr)
            out = c.download()
            row = out[0, 0, 0, :5]
            if nan == pydnn.PYDNN_PROPAGATE_NAN:
                assert np.isnan(row).all()
            else:
                assert np.isnan(row[1:3]).all() and not np.isnan(row[[0, 3, 4]]).any()
            assert_close(out, ref.op_tensor(op, 1, av, 1, bv, 0, None, propagate_nan=nan == pydnn.PYDNN_PROPAGATE_NAN),
                         dtype, f"op {op} nan {nan}")


# ------------------------------------------------------------------------------ Add / Scale / Set
# (C dims, A dims, C layout)
ADD_CASES = [
    ((2, 3, 5, 7), (1, 3, 1, 1), None),            # bias, NCHW
    ((3, 19, 5, 7), (1, 19, 1, 1), "nhwc"),        # bias, NHWC
    ((2, 3, 5, 7), (2, 3, 5, 7), "nhwc"),
    ((3, 4, 5, 6), (1, 1, 1, 6), (500, 120, 24, 3)),
    ((3, 4, 5, 6), (3, 4, 5, 6), (500, 120, 24, 3)),
    ((1, 1, 1, 1), (1, 1, 1, 1), None),
    ((1, 1, 1, 100003), (1, 1, 1, 100003), None),
    ((1, 1, 1, 100003), (1, 1, 1, 1), None),       # scalar broadcast
    ((2, 5, 3, 4, 6), (1, 5, 1, 1, 1), None),      # 5-d bias
    ((4, 1, 3, 2), (4, 1, 3, 1), None),
]


@pytest.mark.parametrize("dtype", FLOATS)
def test_add_scale_set(handle, rng, dtype):
    for cdims, adims, layout in ADD_CASES:
        a, c = DevTensor(adims, dtype), DevTensor(cdims, dtype, _strides(cdims, layout))
        av = a.random(rng)
        alpha = float(rng.uniform(-2, 2))
        pydnn.add_tensor(handle, alpha, a.desc, a.ptr, 0.0, c.desc, c.ptr)  # C poisoned: beta 0 never reads it
        assert_close(c.download(), np.broadcast_to(alpha * av, cdims), dtype, f"add beta 0 {cdims}")
        c.check_untouched()
        c0 = c.random(rng)
        beta = float(rng.uniform(-2, 2))
        pydnn.add_tensor(handle, alpha, a.desc, a.ptr, beta, c.desc, c.ptr)
        want = ref.scaled(alpha, av, beta, c0)
        assert_close(c.download(), want, dtype, f"add {cdims}", scale=np.abs(alpha * av) + np.abs(beta * c0))
        c.check_untouched()
        cv = c.download()
        pydnn.scale_tensor(handle, c.desc, c.ptr, -0.75)
        assert_close(c.download(), -0.75 * cv, dtype, "scale")
        c.check_untouched()
        pydnn.set_tensor(handle, c.desc, c.ptr, 2.5)
        assert (c.download() == 2.5).all()
        c.check_untouched()


def test_add_tensor_in_place(handle, rng):
    c = DevTensor((2, 3, 5, 7), F32)
    cv = c.random(rng)
    pydnn.add_tensor(handle, 2.0, c.desc, c.ptr, 0.5, c.desc, c.ptr)  # A is C
    assert_close(c.download(), 2.5 * cv, F32, "A is C")


@pytest.mark.parametrize("dtype", ALL)
def test_set_tensor_every_type(handle, dtype):
    for dims, strides in [((3, 5, 7, 2), (400, 60, 8, 3)), ((1, 1, 1, 1), None), ((1, 1, 1, 100003), None)]:
        t = DevTensor(dims, dtype, strides)
        pydnn.set_tensor(handle, t.desc, t.ptr, 7)
        assert (t.download() == 7).all()
        t.check_untouched()
        pydnn.set_tensor(handle, t.desc, t.ptr, -0.0 if dtype in FLOATS else 0)
        got = t.download()
        assert (got == 0).all()
        if dtype in FLOATS:
            assert np.signbit(got).all()


@pytest.mark.parametrize("dtype, value, want", [
    (I8, 2.5, 2), (I8, 3.5, 4), (I8, -2.5, -2), (I8, 300, 127), (I8, -1e9, -128), (I8, float("nan"), 0),
    (U8, -5, 0), (U8, 255.5, 255), (U8, 254.5, 254), (U8, float("inf"), 255),
    (I32, 2**40, 2**31 - 1), (I32, -2**31, -2**31), (I32, 1234567.5, 1234568),
    (I64, 2**62 + 1, 2**62 + 1), (I64, -2**63, -2**63), (I64, 2**63 - 1, 2**63 - 1), (I64, 2**70, 2**63 - 1),
    (I64, 9007199254740993, 9007199254740993),
    (F16, 70000.0, np.inf), (F16, 1 + 2**-11, 1.0), (F16, 1 + 3 * 2**-11, 1 + 2**-9),
    (BF16, 1 + 2**-8, 1.0), (BF16, 1 + 3 * 2**-8, 1 + 2**-6), (F32, 0.1, float(np.float32(0.1))),
    (F64, 0.1, 0.1), (F32, float("-inf"), -np.inf),
])
def test_set_tensor_value_rounding(handle, dtype, value, want):
    t = DevTensor((3, 1, 1, 37), dtype)
    pydnn.set_tensor(handle, t.desc, t.ptr, value)
    got = _download_raw(t) if dtype in INTS else t.download()
    if dtype in INTS:
        assert (got == np.array(want, INT_NP[dtype])).all(), got.ravel()[:4]
    else:
        assert (got == want).all(), got.ravel()[:4]


# ------------------------------------------------------------------------------ TransformTensor
# Layout pairs (dims, x strides, y strides) that reach each kernel: the vector map (same layout), the
# vector transpose (dense extents multiples of 16, partial tiles), the scalar transpose (odd extents),
# the strided map (3 channels: too narrow to tile) and gaps on both sides.
def _layouts():
    nhwc = lambda d: packed_strides(d, NHWC)  # noqa: E731
    return [
        ((2, 5, 7, 9), None, None),
        ((2, 48, 4, 20), None, nhwc((2, 48, 4, 20))),
        ((2, 32, 4, 8), nhwc((2, 32, 4, 8)), None),
        ((2, 37, 5, 7), None, nhwc((2, 37, 5, 7))),
        ((3, 19, 3, 17), nhwc((3, 19, 3, 17)), None),
        ((2, 3, 5, 7), None, nhwc((2, 3, 5, 7))),
        ((2, 3, 4, 5), (200, 50, 12, 2), (3, 150, 7, 29)),
    ]


def _source_values(rng, dtype, dims):
    """Values of the source type including the cases that matter for conversions: ties for rounding to
    integers, values beyond every integer range, and (floats) NaN and infinities."""
    n = int(np.prod(dims))
    if dtype in INTS:
        info = np.iinfo(INT_NP[dtype])
        special = [info.min, info.max, 0, 1, -1, 127, 128, -129, 255, 256, 2**24 + 1, 2**31 - 1, -2**31, 2**53 + 1,
                   2**62 + 3]
        special = [s for s in special if info.min <= s <= info.max]
        v = rng.integers(max(info.min, -10**6), min(info.max, 10**6), n, dtype=np.int64, endpoint=True)
        v[:len(special)] = special
        return v.astype(INT_NP[dtype]).reshape(dims)
    special = [0.5, 1.5, 2.5, -0.5, -2.5, 127.5, 128.5, -128.5, -129.5, 254.5, 255.5, 256.0, -1.0, 1e10, -1e10,
               65519.0, 65520.0, 3e38, np.nan, np.inf, -np.inf, -0.0]
    v = rng.uniform(-300, 300, n)
    v[:len(special)] = special
    with np.errstate(over="ignore"):
        v = rd.from_storage(rd.to_storage(v, dtype), dtype)  # the values the source type holds
    return v.reshape(dims)


def _check_transform(got, want, to, what):
    if to in FLOATS:
        assert_close(got, want, to, what)
    else:
        bad = got != want
        assert not bad.any(), f"{what}: {bad.sum()} off; first got {got[bad][0]} want {want[bad][0]}"


@pytest.mark.parametrize("ti", ALL)
@pytest.mark.parametrize("to", ALL)
def test_transform_conversions(handle, rng, ti, to):
    for dims, xs, ys in _layouts():
        x, y = DevTensor(dims, ti, xs), DevTensor(dims, to, ys)
        v = _source_values(rng, ti, dims)
        if ti in INTS:
            _upload_raw(x, v)
            xv = v.astype(np.float64)
        else:
            xv = x.upload(v)
        pydnn.transform_tensor(handle, 1.0, x.desc, x.ptr, 0.0, y.desc, y.ptr)
        if to in INTS:
            got = _download_raw(y)
            want = ref.convert(xv, to)
            if ti == to:  # a bit copy: exact even beyond 2^53
                assert (got == v).all(), f"{ti}->{to} {dims}: copy not exact"
            _check_transform(got.astype(np.float64), want, to, f"{ti}->{to} {dims} {xs}->{ys}")
        else:
            _check_transform(y.download(), ref.convert(xv, to), to, f"{ti}->{to} {dims} {xs}->{ys}")
        y.check_untouched()


@pytest.mark.parametrize("dtype", [F32, F16, BF16, F64, I8, I32])
def test_transform_nchw_nhwc_round_trip_with_blend(handle, rng, dtype):
    for dims in [(3, 37, 19, 23), (2, 64, 16, 16), (2, 16, 1, 1), (1, 128, 3, 40)]:
        x = DevTensor(dims, dtype)
        y = DevTensor(dims, dtype, packed_strides(dims, NHWC))
        lo, hi = (-50, 50) if dtype in INTS else (-3, 3)
        xv, y0 = x.random(rng, lo, hi), y.random(rng, lo, hi)
        pydnn.transform_tensor(handle, 2.0, x.desc, x.ptr, -1.0, y.desc, y.ptr)
        want = ref.transform(2.0, xv, -1.0, y0, dtype)
        if dtype in INTS:
            assert (y.download() == want).all(), f"nchw->nhwc {dims}"
        else:
            assert_close(y.download(), want, dtype, f"nchw->nhwc {dims}", scale=np.abs(2 * xv) + np.abs(y0))
        y.check_untouched()
        back = DevTensor(dims, dtype)
        pydnn.transform_tensor(handle, 1.0, y.desc, y.ptr, 0.0, back.desc, back.ptr)
        assert (back.download() == y.download()).all(), f"nhwc->nchw {dims}"
        back.check_untouched()
        # alpha only (no blend) through the transpose: the Scaled kernel rather than the copy
        pydnn.transform_tensor(handle, -0.5, y.desc, y.ptr, 0.0, back.desc, back.ptr)
        yv = y.download()
        want = ref.convert(-0.5 * yv, dtype)
        if dtype in INTS:
            assert (back.download() == want).all()
        else:
            assert_close(back.download(), want, dtype, "alpha -0.5")


def test_transform_other_permutations(handle, rng):
    """Batched transposes with two batch dims (out [B][A][K][M] from in [A][B][M][K]), a 5-d NCDHW ->
    NDHWC, a 2-d transpose, and a permutation of the outer dims only (CNHW: the strided map)."""
    cases = []
    A, B, M, K = 3, 5, 24, 40
    cases.append(((A, B, M, K), None, (K * M, A * K * M, 1, M)))
    d5 = (2, 32, 3, 4, 5)
    cases.append((d5, None, packed_strides(d5, NHWC)))
    cases.append(((1, 1, 100, 70), None, (7000, 7000, 1, 100)))
    d4 = (4, 6, 5, 18)
    cases.append((d4, None, (5 * 18, 4 * 5 * 18, 18, 1)))  # CNHW: W stays innermost
    for dtype in (F32, BF16, U8):
        for dims, xs, ys in cases:
            x, y = DevTensor(dims, dtype, xs), DevTensor(dims, dtype, ys)
            xv = x.random(rng, 0, 100) if dtype == U8 else x.random(rng)
            pydnn.transform_tensor(handle, 1.0, x.desc, x.ptr, 0.0, y.desc, y.ptr)
            assert (y.download() == xv).all(), f"{dtype} {dims} {ys}"
            y.check_untouched()
            pydnn.transform_tensor(handle, 3.0, x.desc, x.ptr, 0.0, y.desc, y.ptr)
            _check_transform(y.download(), ref.convert(3.0 * xv, dtype), dtype, f"{dtype} {dims} alpha 3")


def test_transform_many_batches(handle, rng):
    """More batch entries than grid.z holds (65535): the kernel's batch loop."""
    dims = (70001, 16, 16, 1)
    x = DevTensor(dims, U8)
    y = DevTensor(dims, U8, (256, 1, 16, 1))
    xv = x.random(rng, 0, 255)
    pydnn.transform_tensor(handle, 1.0, x.desc, x.ptr, 0.0, y.desc, y.ptr)
    assert (y.download() == xv).all()


class _OffsetTensor(DevTensor):
    """A DevTensor whose data starts `offset` elements into its buffer (a pointer not 16-byte aligned)."""

    def __init__(self, dims, dtype, strides, offset):
        super().__init__(dims, dtype, strides)
        self.offset = offset
        self.buf = pydnn.DeviceArray((self.span + offset,), self.np_dtype)
        self.buf.fill_bytes(POISON)

    @property
    def ptr(self):
        return self.buf.ptr + self.offset * DTYPES[self.dtype][0]

    def _view(self, flat):
        return super()._view(flat[self.offset:])

    def check_untouched(self):
        flat = self.buf.to_numpy()
        assert (flat[:self.offset].view(np.uint8) == POISON).all()
        mask = np.ones(self.span, bool)
        idx = as_strided(np.arange(self.span), self.dims, [s * 8 for s in self.strides])
        mask[idx.ravel()] = False
        assert (flat[self.offset:].view(np.uint8).reshape(self.span, -1)[mask] == POISON).all()


@pytest.mark.parametrize("dtype", [F32, BF16, U8])
def test_transform_misaligned_pointers(handle, rng, dtype):
    """Shapes the vector transpose takes, with x or y one element off 16-byte alignment: the scalar kernel."""
    dims = (2, 32, 4, 8)
    for xo, yo in ((1, 0), (0, 1), (3, 5)):
        x = _OffsetTensor(dims, dtype, None, xo) if xo else DevTensor(dims, dtype)
        y = _OffsetTensor(dims, dtype, packed_strides(dims, NHWC), yo)
        xv = x.random(rng, 0, 100) if dtype == U8 else x.random(rng)
        pydnn.transform_tensor(handle, 1.0, x.desc, x.ptr, 0.0, y.desc, y.ptr)
        assert (y.download() == xv).all(), f"offsets {xo}, {yo}"
        y.check_untouched()
        y0 = y.download()
        pydnn.transform_tensor(handle, 0.5, x.desc, x.ptr, 1.0, y.desc, y.ptr)
        _check_transform(y.download(), ref.transform(0.5, xv, 1.0, y0, dtype), dtype, f"blend {xo}, {yo}")


def test_transform_saturates_and_rounds_to_int8_uint8(handle):
    dims = (1, 1, 1, 12)
    x = DevTensor(dims, F32)
    x.upload(np.array([-1000, -128.5, -2.5, -0.5, 0.5, 1.5, 127.4, 1e9, np.nan, np.inf, -np.inf, 254.5]).reshape(dims))
    y8, yu = DevTensor(dims, I8), DevTensor(dims, U8)
    pydnn.transform_tensor(handle, 1.0, x.desc, x.ptr, 0.0, y8.desc, y8.ptr)
    pydnn.transform_tensor(handle, 1.0, x.desc, x.ptr, 0.0, yu.desc, yu.ptr)
    assert _download_raw(y8).ravel().tolist() == [-128, -128, -2, 0, 0, 2, 127, 127, 0, 127, -128, 127]
    assert _download_raw(yu).ravel().tolist() == [0, 0, 0, 0, 0, 2, 127, 255, 0, 255, 0, 254]
    # through a transpose with alpha: 2 * 63.75 = 127.5 -> 128 saturates to 127 (int8) / 128 (uint8)
    d = (1, 16, 1, 16)
    xs = DevTensor(d, F32)
    xs.upload(np.full(d, 63.75))
    t8 = DevTensor(d, I8, packed_strides(d, NHWC))
    tu = DevTensor(d, U8, packed_strides(d, NHWC))
    pydnn.transform_tensor(handle, 2.0, xs.desc, xs.ptr, 0.0, t8.desc, t8.ptr)
    pydnn.transform_tensor(handle, 2.0, xs.desc, xs.ptr, 0.0, tu.desc, tu.ptr)
    assert (_download_raw(t8) == 127).all() and (_download_raw(tu) == 128).all()


def test_transform_int64_copy_is_exact(handle, rng):
    dims = (2, 24, 4, 5)
    x = DevTensor(dims, I64)
    v = rng.integers(-2**63, 2**63 - 1, dims, dtype=np.int64, endpoint=True)
    v.flat[0], v.flat[1] = 2**53 + 1, -(2**62) - 1
    _upload_raw(x, v)
    for ys in (None, packed_strides(dims, NHWC), (1000, 40, 10, 2)):
        y = DevTensor(dims, I64, ys)
        pydnn.transform_tensor(handle, 1.0, x.desc, x.ptr, 0.0, y.desc, y.ptr)
        assert (_download_raw(y) == v).all(), ys
        y.check_untouched()


def test_transform_reuses_records_when_alpha_changes(handle, rng):
    """The copy record (alpha 1, beta 0) and the scaled record of one descriptor pair stay apart."""
    dims = (2, 32, 4, 8)
    x, y = DevTensor(dims, F16), DevTensor(dims, F16, packed_strides(dims, NHWC))
    xv = x.random(rng)
    for alpha in (1.0, 2.0, 1.0, -1.0):
        pydnn.transform_tensor(handle, alpha, x.desc, x.ptr, 0.0, y.desc, y.ptr)
        assert (y.download() == alpha * xv).all(), alpha


# ------------------------------------------------------------------------------ > 2^31 elements
def _alloc_or_skip(nbytes_list):
    bufs = []
    try:
        for nb in nbytes_list:
            bufs.append(pydnn.DeviceArray((nb,), np.uint8))
    except pydnn.PydnnError:
        bufs.clear()
        pytest.skip("not enough GPU memory")
    return bufs


@pytest.mark.large
def test_large_add_tensor_bf16_over_2g_elements(handle, rng):
    """C (2^31 + 5 bf16) += alpha * scalar A: the strided map with 64-bit offsets; C's elements past 2^31
    must be written, each exactly once."""
    n = 2**31 + 5
    (cbuf, abuf) = _alloc_or_skip([2 * n, 2])
    table = rd.bf16_bits_from_f32(rng.uniform(-4, 4, 1_000_003).astype(np.float32))
    bits = np.resize(table, n)
    cbuf.copy_from_numpy(bits.view(np.uint8))
    abuf.copy_from_numpy(rd.bf16_bits_from_f32(np.array([0.75], np.float32)).view(np.uint8))
    dc, da = pydnn.create_tensor_descriptor(), pydnn.create_tensor_descriptor()
    pydnn.set_tensor_nd_descriptor(dc, BF16, 4, [1, 1, 1, n], [n, n, n, 1])
    pydnn.set_tensor_nd_descriptor(da, BF16, 4, [1, 1, 1, 1], [1, 1, 1, 1])
    pydnn.add_tensor(handle, 2.0, da, abuf.ptr, -1.0, dc, cbuf.ptr)
    out = cbuf.to_numpy().view(np.uint16)
    picks = np.concatenate([np.arange(1 << 16), np.arange(n - (1 << 16), n), np.arange(2**31 - 4096, 2**31 + 5),
                            rng.integers(0, n, 1 << 18)])
    c0 = rd.from_storage(bits[picks], BF16)
    got = rd.from_storage(out[picks], BF16)
    assert_close(got, 1.5 - c0, BF16, "add 2^31+5", scale=1.5 + np.abs(c0))


@pytest.mark.large
def test_large_transform_u8_nchw_to_nhwc_over_4g_elements(handle, rng):
    """NCHW -> NHWC of 2^32 uint8 elements through the vector transpose: offsets past 2^31 and 2^32 on
    both sides."""
    c, hw = 32, 2**27
    n = c * hw
    xbuf, ybuf = _alloc_or_skip([n, n])
    table = rng.integers(0, 256, 1_000_003, dtype=np.uint8)
    xbits = np.resize(table, n)
    xbuf.copy_from_numpy(xbits)
    ybuf.fill_bytes(POISON)
    dx, dy = pydnn.create_tensor_descriptor(), pydnn.create_tensor_descriptor()
    pydnn.set_tensor_nd_descriptor(dx, U8, 4, [1, c, 1, hw], [n, hw, hw, 1])
    pydnn.set_tensor_nd_descriptor(dy, U8, 4, [1, c, 1, hw], [n, 1, n, c])
    pydnn.transform_tensor(handle, 1.0, dx, xbuf.ptr, 0.0, dy, ybuf.ptr)
    out = ybuf.to_numpy()
    picks = np.concatenate([np.arange(1 << 16), np.arange(n - (1 << 16), n), np.arange(2**31 - 4096, 2**31 + 4096),
                            rng.integers(0, n, 1 << 20)])
    w, ch = picks // c, picks % c  # y offset = w * C + c holds x[c, w] at x offset c * HW + w
    assert (out[picks] == xbits[ch * hw + w]).all()
