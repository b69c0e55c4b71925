"""AddTensor / OpTensor with an input broadcast as one row over the output's rows (map_rows, issue 20) on the
GPU against the float64 reference: a bias 1 x H onto R x H (short rows: several per block; long rows:
several column tiles; row counts not a multiple of a block's), padded output rows, the broadcast input as
A or B, blending, beta 0 never reading the poisoned C, the switch off, and unaligned pointers (map_strided).
Every case's plan is checked to be the map_rows launch (or not, where it must not be)."""
import numpy as np
import pytest

import pydnn
from pydnn import tuning
from pydnn.ops import _elementwise as ew
from pydnn.ops import tensor_ops as T
from devtensor import DevTensor, assert_close
from pydnn.reference import tensor_ops as ref

pytestmark = pytest.mark.gpu

F32, F64, F16, BF16 = (pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DATA_DOUBLE, pydnn.PYDNN_DATA_HALF,
                       pydnn.PYDNN_DATA_BFLOAT16)
FLOATS = [F32, F16, BF16, F64]
TAGS = {F32: "f32", F64: "f64", F16: "f16", BF16: "bf16"}

# (C dims, bias dims, C strides or None): the rows' shapes
ROW_CASES = [
    ((37, 64), (1, 64), None),            # 8 vectors a row (16-bit): 16 rows per 128-thread block
    ((1000, 984), (1, 984), None),         # 984 = 8 * 123: one column tile, 1 row per thread row
    ((3, 4096), (1, 4096), None),          # several column tiles, fewer rows than ROWS
    ((130, 24), (1, 24), (32, 1)),         # padded output rows
    ((2, 5, 96), (1, 1, 96), None),        # 3-d, leading dims merged
    # rows that are not a multiple of the vector: the scalar map_rows (BROADCAST_ROWS_SCALAR)
    ((9, 50083), (1, 50083), None),        # the sweep's bias 8659 x 50083, fewer rows: 196 column tiles
    ((33, 75), (1, 75), None),             # 2 rows per 256-thread block row
    ((5, 13), (1, 13), (15, 1)),           # padded odd rows
    ((3, 1, 7), (1, 1, 7), None),          # 3-d, very short rows
]


def _uses_rows(handle, rec_dims, dtype, vec=None):
    """Whether add_tensor's record for these descriptors launches map_rows (vec 1: the scalar variant) on
    aligned pointers."""
    cdims, adims, strides = rec_dims
    c, a = DevTensor(cdims, dtype, strides), DevTensor(adims, dtype)
    T.add_tensor(handle, 1.0, a.desc, a.ptr, 0.0, c.desc, c.ptr)
    key = ("add", (a.desc, a.desc.version), (c.desc, c.desc.version))
    rec = handle.prepared.get(key)
    assert rec is not None
    if TAGS[dtype] not in T.ROWS_TAGS:  # (double: no rows unit, map_strided serves)
        return False
    return rec.vec_func == handle.function(f"tensor_ops.rows.{ew.ktag(TAGS[dtype])}",
                                           T.rows_expr(T.SCALED, TAGS[dtype], vec))


@pytest.mark.parametrize("dtype", FLOATS)
def test_add_tensor_bias_rows(handle, rng, dtype):
    for cdims, adims, strides in ROW_CASES:
        vec = ew.vec_width(TAGS[dtype], TAGS[dtype])
        vector = cdims[-1] % vec == 0 and (strides is None or strides[0] % vec == 0)
        rows = TAGS[dtype] in T.ROWS_TAGS
        assert _uses_rows(handle, (cdims, adims, strides), dtype) == (vector and rows), (cdims, dtype)
        assert _uses_rows(handle, (cdims, adims, strides), dtype, 1) == (not vector and rows), (cdims, dtype)
        a, c = DevTensor(adims, dtype), DevTensor(cdims, dtype, strides)
        av = a.random(rng)
        c.poison()
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
        c0 = c.random(rng)
        pydnn.add_tensor(handle, 1.0, a.desc, a.ptr, 1.0, c.desc, c.ptr)  # the sweep's C += bias
        assert_close(c.download(), av + c0, dtype, f"c += bias {cdims}", scale=np.abs(av) + np.abs(c0))


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("op", [pydnn.PYDNN_OP_TENSOR_ADD, pydnn.PYDNN_OP_TENSOR_MUL])
def test_op_tensor_bias_rows(handle, rng, op, dtype):
    """The broadcast row as B, then as A; with and without blending."""
    for cdims, rdims, strides in ROW_CASES:
        for bias_is_b in (True, False):
            full, row, c = DevTensor(cdims, dtype), DevTensor(rdims, dtype), DevTensor(cdims, dtype, strides)
            fv, rv = full.random(rng), row.random(rng)
            a, av, b, bv = (full, fv, row, rv) if bias_is_b else (row, rv, full, fv)
            d = pydnn.create_op_tensor_descriptor()
            pydnn.set_op_tensor_descriptor(d, op, F32, pydnn.PYDNN_NOT_PROPAGATE_NAN)
            a1, a2 = float(rng.uniform(-2, 2)), float(rng.uniform(-2, 2))
            pydnn.op_tensor(handle, d, a1, a.desc, a.ptr, a2, b.desc, b.ptr, 0.0, c.desc, c.ptr)
            want = np.broadcast_to(ref.op_tensor(op, a1, av, a2, bv, 0.0, None), cdims)
            scale = np.broadcast_to(np.abs(a1 * av) + np.abs(a2 * bv), cdims)
            assert_close(c.download(), want, dtype, f"op {op} {cdims} bias_is_b={bias_is_b}", scale=scale)
            c.check_untouched()
            c0 = c.random(rng)
            beta = float(rng.uniform(-2, 2))
            pydnn.op_tensor(handle, d, a1, a.desc, a.ptr, a2, b.desc, b.ptr, beta, c.desc, c.ptr)
            want = ref.op_tensor(op, a1, av, a2, bv, beta, c0)
            assert_close(c.download(), want, dtype, f"op {op} blend {cdims}", scale=scale + np.abs(beta * c0))
            c.check_untouched()


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_bias_rows_off_and_unaligned(handle, rng, monkeypatch, dtype):
    """BROADCAST_ROWS off: map_strided, same results; a C starting one element in: the scalar launch."""
    cdims, adims = (33, 256), (1, 256)
    monkeypatch.setattr(tuning.tensor_ops, "BROADCAST_ROWS", False)
    assert not _uses_rows(handle, (cdims, adims, None), dtype)
    a, c = DevTensor(adims, dtype), DevTensor(cdims, dtype)
    av, c0 = a.random(rng), c.random(rng)
    pydnn.add_tensor(handle, 1.0, a.desc, a.ptr, 1.0, c.desc, c.ptr)
    assert_close(c.download(), av + c0, dtype, "switch off", scale=np.abs(av) + np.abs(c0))
    monkeypatch.setattr(tuning.tensor_ops, "BROADCAST_ROWS", True)
    item = 4 if dtype == F32 else 2
    big = DevTensor((cdims[0] * cdims[1] + 8,), dtype)
    bv = big.random(rng)
    view = pydnn.create_tensor_descriptor()
    pydnn.set_tensor_nd_descriptor(view, dtype, 2, cdims, (cdims[1], 1))
    pydnn.add_tensor(handle, 1.0, a.desc, a.ptr, 1.0, view, big.ptr + item)
    got = big.download()
    n = cdims[0] * cdims[1]
    want = bv[1:1 + n].reshape(cdims) + av
    assert_close(got[1:1 + n].reshape(cdims), want, dtype, "unaligned C", scale=np.abs(bv[1:1 + n].reshape(cdims)) + np.abs(av))
    assert got[0] == bv[0] and (got[1 + n:] == bv[1 + n:]).all()


@pytest.mark.parametrize("dtype", [F32, F16])
def test_bias_rows_scalar_off(handle, rng, monkeypatch, dtype):
    """BROADCAST_ROWS_SCALAR off: odd rows take map_strided again, same results."""
    cdims, adims = (33, 75), (1, 75)
    monkeypatch.setattr(tuning.tensor_ops, "BROADCAST_ROWS_SCALAR", False)
    assert not _uses_rows(handle, (cdims, adims, None), dtype, 1)
    a, c = DevTensor(adims, dtype), DevTensor(cdims, dtype)
    av, c0 = a.random(rng), c.random(rng)
    pydnn.add_tensor(handle, 1.0, a.desc, a.ptr, 1.0, c.desc, c.ptr)
    assert_close(c.download(), av + c0, dtype, "scalar switch off", scale=np.abs(av) + np.abs(c0))
