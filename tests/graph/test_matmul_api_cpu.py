"""pydnn.matmul (pydnnMatmul) on the CPU: every validation error names its argument before any GPU work;
the descriptor -> GEMM mapping (transposes through strides, broadcast batches, column-major C computed as
C^T = B^T A^T) is checked by running the float64 GEMM reference on the mapped problem against numpy's
matmul of the strided views, over random layouts."""
import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

import pydnn
from pydnn.graph.matmul_api import layout
from pydnn.reference import matmul as ref
from test_fuzz_cpu import cpu_handle

F32, F64, F16, BF16 = (pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DATA_DOUBLE, pydnn.PYDNN_DATA_HALF,
                       pydnn.PYDNN_DATA_BFLOAT16)
BAD, NS, NOINIT = pydnn.PYDNN_STATUS_BAD_PARAM, pydnn.PYDNN_STATUS_NOT_SUPPORTED, pydnn.PYDNN_STATUS_NOT_INITIALIZED
NULL, MIS = pydnn.PYDNN_STATUS_BAD_PARAM_NULL_POINTER, pydnn.PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER
A, B, C = 1 << 40, 1 << 41, 1 << 42


def desc(dtype, dims, strides=None):
    if strides is None:
        strides, acc = [], 1
        for d in reversed(dims):
            strides.insert(0, acc)
            acc *= d
    d = pydnn.create_tensor_descriptor()
    pydnn.set_tensor_nd_descriptor(d, dtype, len(dims), list(dims), list(strides))
    return d


def _raises(status, needle, fn, *args):
    with pytest.raises(pydnn.PydnnError) as e:
        fn(*args)
    assert e.value.status == status, e.value
    assert needle in str(e.value), e.value
    assert needle in pydnn.get_last_error_string()


def call(a, b, c, alpha=1.0, beta=0.0, pa=A, pb=B, pc=C):
    return pydnn.matmul(cpu_handle(), alpha, a, pa, b, pb, beta, c, pc)


@pytest.mark.parametrize("case, status, needle", [
    (dict(a=(F64, (4, 8)), b=(F64, (8, 6)), c=(F64, (4, 6))), NS, "aDesc: data type"),
    (dict(a=(pydnn.PYDNN_DATA_INT8, (4, 8))), NS, "aDesc: data type"),
    (dict(a=(F16, (4, 8))), BAD, "aDesc: data type 2 differs from cDesc"),
    (dict(b=(BF16, (8, 6))), BAD, "bDesc: data type 9 differs"),
    (dict(a=(F32, (5, 8))), BAD, "aDesc: 5 rows, cDesc has 4"),
    (dict(b=(F32, (7, 6))), BAD, "bDesc: 7 rows, but aDesc has 8 columns"),
    (dict(b=(F32, (8, 5))), BAD, "bDesc: 5 columns, cDesc has 6"),
    (dict(a=(F32, (2, 2, 4, 8))), NS, "aDesc: 4 dims"),
    (dict(a=(F32, (8,))), NS, "aDesc: 1 dims"),
    (dict(a=(F32, (3, 4, 8)), c=(F32, (2, 4, 6))), BAD, "aDesc: batch 3 is neither cDesc's 2 nor 1"),
    (dict(b=(F32, (3, 8, 6)), c=(F32, (2, 4, 6))), BAD, "bDesc: batch 3"),
    (dict(a=(F32, (4, 8), (16, 2))), NS, "aDesc: strides (16, 2) of the 4 x 8 matrix have no unit stride"),
    (dict(a=(F32, (4, 8), (4, 1))), NS, "aDesc: strides (4, 1) make the rows of the 4 x 8 matrix overlap"),
    (dict(c=(F32, (4, 6), (1, 1))), BAD, "cDesc: strides"),
    (dict(c=(F32, (2, 4, 6), (6, 6, 1))), BAD, "cDesc: strides (6, 6, 1) make elements overlap"),
])
def test_validation(case, status, needle):
    spec = dict(a=(F32, (4, 8)), b=(F32, (8, 6)), c=(F32, (4, 6)))
    spec.update(case)
    _raises(status, needle, call, *(desc(*spec[k]) for k in "abc"))


def test_pointer_and_scalar_errors():
    a, b, c = desc(F16, (4, 8)), desc(F16, (8, 6)), desc(F16, (4, 6))
    _raises(NULL, "C: NULL", call, a, b, c, 1.0, 0.0, A, B, 0)
    _raises(NULL, "A: NULL", call, a, b, c, 1.0, 0.0, 0, B, C)
    _raises(NULL, "B: NULL", call, a, b, c, 1.0, 0.0, A, 0, C)
    _raises(MIS, "B: ", call, a, b, c, 1.0, 0.0, A, B + 1, C)
    _raises(BAD, "C: its memory overlaps A's", call, a, b, c, 1.0, 0.0, A, B, A + 2)
    _raises(BAD, "alpha", call, a, b, c, "x")
    _raises(BAD, "beta", call, a, b, c, 1.0, None)
    _raises(BAD, "aDesc", pydnn.matmul, cpu_handle(), 1.0, None, A, b, B, 0.0, c, C)
    _raises(BAD, "cDesc: descriptor was never set", pydnn.matmul, cpu_handle(), 1.0, a, A, b, B, 0.0,
            pydnn.create_tensor_descriptor(), C)


def test_valid_call_reaches_the_kernel_lookup():
    """Everything valid: the CPU handle refuses only when the kernel is looked up (no GPU here)."""
    for t in (F32, F16, BF16):
        _raises(NOINIT, "", call, desc(t, (2, 64, 32)), desc(t, (32, 48)), desc(t, (2, 64, 48)))


def _strided(rng, rows, cols, batch, kind):
    """(dims, strides, span) of a batch x rows x cols operand: row-major, column-major, padded, or 2-d."""
    pad = int(rng.integers(0, 3))
    if kind == "col":
        s_row, s_col = 1, rows + pad
        mat = (cols - 1) * s_col + rows
    else:
        s_row, s_col = cols + pad, 1
        mat = (rows - 1) * s_row + cols
    if batch is None:
        return (rows, cols), (s_row, s_col), mat
    bstride = mat + int(rng.integers(0, 4))
    return (batch, rows, cols), (bstride, s_row, s_col), (batch - 1) * bstride + mat


def _view(flat, dims, strides):
    if len(dims) == 2:
        dims, strides = (1,) + dims, (0,) + strides
    return as_strided(flat, dims, [s * 8 for s in strides], writeable=False)


@pytest.mark.parametrize("seed", range(40))
def test_mapping_matches_numpy(seed):
    rng = np.random.default_rng(seed)
    m, n, k = (int(v) for v in rng.integers(1, 7, 3))
    batch = int(rng.integers(1, 4))
    three = rng.random() < 0.7
    bcast_a, bcast_b = rng.random() < 0.3, rng.random() < 0.3
    kinds = [("row", "col")[int(rng.integers(0, 2))] for _ in range(3)]
    da, sa, na = _strided(rng, m, k, (1 if bcast_a else batch) if three else None, kinds[0])
    db, sb, nb = _strided(rng, k, n, (1 if bcast_b else batch) if three else None, kinds[1])
    dc, sc, nc = _strided(rng, m, n, batch if three else None, kinds[2])
    fa, fb = rng.standard_normal(na), rng.standard_normal(nb)
    swap, kw = layout((F32, da, sa), (F32, db, sb), (F32, dc, sc))
    want = np.matmul(_view(fa, da, sa), _view(fb, db, sb))
    x, y = (fb, fa) if swap else (fa, fb)
    kw.pop("dtype")
    got = ref.gemm(x, y, None, **kw)
    if swap:
        got = got.transpose(0, 2, 1)
    # the plan's C addresses are the descriptor's: check the kernel's C indexing against cDesc's strides
    flat = np.full(nc, np.nan)
    cv = as_strided(flat, (kw["batch"], kw["m"], kw["n"]), (kw["stride_c"] * 8, kw["ldc"] * 8, 8))
    cv[...] = ref.gemm(x, y, None, **kw)
    np.testing.assert_allclose(got, np.broadcast_to(want, got.shape), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(_view(flat, dc, sc), np.broadcast_to(want, got.shape).reshape(_view(flat, dc, sc).shape),
                               rtol=1e-12, atol=1e-12)
