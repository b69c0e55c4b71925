"""pydnn.matmul on the GPU against float64 numpy: float (exact), half and bfloat16, row- and column-major
operands (transposes through strides), column-major C, batches with padded strides and broadcast A or B,
alpha / beta blending. Every buffer starts poisoned (NaN bytes): beta == 0 must never read C, and C's
gaps must stay untouched."""
import numpy as np
import pytest

import pydnn
from devtensor import DevTensor, assert_close

pytestmark = pytest.mark.gpu

F32, F16, BF16 = pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DATA_HALF, pydnn.PYDNN_DATA_BFLOAT16


def _layout(batch, rows, cols, kind, pad=0, bpad=0):
    """(dims, strides) of an operand: kind 'row' or 'col' major, rows padded by `pad`, batches `bpad` apart."""
    if kind == "row":
        s_row, s_col, mat = cols + pad, 1, rows * (cols + pad)
    else:
        s_row, s_col, mat = 1, rows + pad, cols * (rows + pad)
    if batch is None:
        return (rows, cols), (s_row, s_col)
    return (batch, rows, cols), (mat + bpad, s_row, s_col)


def _as3(v):
    return v if v.ndim == 3 else v[None]


CASES = [
    # (m, n, k, batch of C (None: 2-d), batch A, batch B, kinds of A, B, C, pads)
    (33, 65, 129, None, None, None, "row", "row", "row", 0),
    (64, 48, 32, None, None, None, "col", "row", "row", 0),
    (64, 48, 32, None, None, None, "row", "col", "row", 0),
    (64, 48, 32, None, None, None, "col", "col", "row", 0),
    (37, 50, 19, None, None, None, "row", "row", "col", 0),
    (37, 50, 19, None, None, None, "col", "col", "col", 3),
    (40, 24, 72, 3, 3, 1, "row", "row", "row", 8),    # B broadcast over the batch
    (40, 24, 72, 3, 1, 3, "col", "row", "row", 0),    # A broadcast
    (17, 9, 130, 4, 4, 4, "row", "col", "row", 5),
    (1, 64, 64, 2, 2, 2, "row", "row", "row", 0),
    (64, 1, 64, 2, 2, 1, "row", "row", "row", 0),
]


@pytest.mark.parametrize("dtype", [F32, F16, BF16])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("alpha, beta", [(1.0, 0.0), (0.5, 2.0)])
def test_matmul(handle, rng, dtype, case, alpha, beta):
    m, n, k, bc, ba, bb, ka, kb, kc, pad = case
    a = DevTensor(_layout(ba, m, k, ka, pad, pad)[0], dtype, strides=_layout(ba, m, k, ka, pad, pad)[1])
    b = DevTensor(_layout(bb, k, n, kb, pad, 1)[0], dtype, strides=_layout(bb, k, n, kb, pad, 1)[1])
    c = DevTensor(_layout(bc, m, n, kc, pad, 2)[0], dtype, strides=_layout(bc, m, n, kc, pad, 2)[1])
    av, bv = a.random(rng), b.random(rng)
    cv = c.random(rng) if beta != 0.0 else None
    pydnn.matmul(handle, alpha, a.desc, a.ptr, b.desc, b.ptr, beta, c.desc, c.ptr)
    want = alpha * np.matmul(_as3(av), _as3(bv))
    scale = abs(alpha) * np.matmul(np.abs(_as3(av)), np.abs(_as3(bv)))
    if beta != 0.0:
        want = want + beta * _as3(cv)
        scale = scale + abs(beta) * np.abs(_as3(cv))
    got = _as3(c.download())
    assert_close(got, want, dtype, f"matmul {case} {alpha} {beta}", scale=scale)
    c.check_untouched()


@pytest.mark.parametrize("dtype", [F16, BF16, F32])
def test_matmul_large_tiles(handle, rng, dtype):
    """Big enough for the 128x256 tile (and gemm_wgmma on sm_90): 2048 x 2048 x 512, batch 1."""
    m = n = 2048
    k = 512
    a, b, c = DevTensor((m, k), dtype), DevTensor((k, n), dtype), DevTensor((m, n), dtype)
    av, bv = a.random(rng, -1, 1), b.random(rng, -1, 1)
    pydnn.matmul(handle, 1.0, a.desc, a.ptr, b.desc, b.ptr, 0.0, c.desc, c.ptr)
    assert_close(c.download(), av @ bv, dtype, "matmul 2048x2048x512", scale=np.abs(av) @ np.abs(bv))
