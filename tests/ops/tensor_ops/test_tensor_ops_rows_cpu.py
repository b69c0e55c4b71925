"""map_rows (ptx/tensor_ops.cu) index arithmetic emulated on the CPU over the grid the host launches: every
(row, column vector) of the output visited exactly once, the broadcast row's vector the one at the column."""
import numpy as np
import pytest

from pydnn.ops import tensor_ops as T


def _grid(R, hv):
    tc = 1
    while tc < hv and tc < T.ROWS_THREADS:
        tc *= 2
    return tc, -(-hv // tc) * -(-R // (T.ROWS_THREADS // tc * T.ROWS_ROWS))


def _emulate(R, hv):
    tc, grid = _grid(R, hv)
    tr, ct = T.ROWS_THREADS // tc, -(-hv // tc)
    seen = np.zeros((R, hv), np.int64)
    t = np.arange(T.ROWS_THREADS)
    for b in range(grid):
        c = (b % ct) * tc + (t & (tc - 1))
        r0 = (b // ct) * (tr * T.ROWS_ROWS) + t // tc
        live = c < hv
        for u in range(T.ROWS_ROWS):
            r = r0 + u * tr
            ok = live & (r < R)
            np.add.at(seen, (r[ok], c[ok]), 1)
    return seen


@pytest.mark.parametrize("R,hv", [(37, 8), (1000, 123), (3, 512), (130, 3), (1, 1), (5, 129), (77, 256), (9, 1)])
def test_map_rows_visits_every_vector_once(R, hv):
    assert (_emulate(R, hv) == 1).all()
