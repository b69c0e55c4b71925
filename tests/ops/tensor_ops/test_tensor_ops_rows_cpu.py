"""map_rows (ptx/tensor_ops.cu) index arithmetic emulated on the CPU over the grid the host launches: every
(row, column vector) of the output visited exactly once, the broadcast row's vector the one at the column."""
import numpy as np
import pytest

from pydnn.ops import tensor_ops as T


def _grid(R, hv, threads, rows):
    tc = 1
    while tc < hv and tc < threads:
        tc *= 2
    return tc, -(-hv // tc) * -(-R // (threads // tc * rows))


def _emulate(R, hv, vec=8):
    threads, rows = T.rows_shape(vec)
    tc, grid = _grid(R, hv, threads, rows)
    tr, ct = threads // tc, -(-hv // tc)
    seen = np.zeros((R, hv), np.int64)
    t = np.arange(threads)
    for b in range(grid):
        c = (b % ct) * tc + (t & (tc - 1))
        r0 = (b // ct) * (tr * rows) + t // tc
        live = c < hv
        for u in range(rows):
            r = r0 + u * tr
            ok = live & (r < R)
            np.add.at(seen, (r[ok], c[ok]), 1)
    return seen


@pytest.mark.parametrize("vec", [8, 1], ids=["vector", "scalar"])
@pytest.mark.parametrize("R,hv", [(37, 8), (1000, 123), (3, 512), (130, 3), (1, 1), (5, 129), (77, 256), (9, 1),
                                  (17, 50083), (33, 75), (3, 257)])
def test_map_rows_visits_every_vector_once(R, hv, vec):
    assert (_emulate(R, hv, vec) == 1).all()
