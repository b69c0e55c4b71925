"""walk_row's batched tail (ptx/reduce.cu) on the GPU against the float64 reference: rows_vec problems whose
lanes end with every tail count 0..3 (reduce_tail_cases.CASES; the CPU test checks the counts), for sums,
AVG, NORM2, products and MAX / MIN with indices over ties (the first index must win, so the order of a
lane's tail matters), aligned and unaligned A, poisoned C and indices (beta 0 never reads C)."""
import numpy as np
import pytest

import pydnn
from devtensor import DevTensor
from pydnn.ops import reduce as R
from pydnn.ops.reduce import plan_summary
from reduce_tail_cases import CASES
from test_reduce_gpu import INDEXED, NAMES, Shifted, _check, _rdesc, _values

pytestmark = pytest.mark.gpu

F32, F16, BF16 = pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DATA_HALF, pydnn.PYDNN_DATA_BFLOAT16
ADD, MUL, MIN, MAX, AVG, NORM2 = (pydnn.PYDNN_REDUCE_TENSOR_ADD, pydnn.PYDNN_REDUCE_TENSOR_MUL,
                                  pydnn.PYDNN_REDUCE_TENSOR_MIN, pydnn.PYDNN_REDUCE_TENSOR_MAX,
                                  pydnn.PYDNN_REDUCE_TENSOR_AVG, pydnn.PYDNN_REDUCE_TENSOR_NORM2)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0].split(" (")[0].replace(" ", "_"))
@pytest.mark.parametrize("pair", [(F32, F32), (BF16, BF16), (F16, F32)], ids=lambda p: f"{NAMES[p[0]]}-{NAMES[p[1]]}")
def test_rows_vec_tails(handle, rng, case, pair):
    name, dims, cdims = case
    ta, tc = pair
    for shift in (0, 1):
        a = Shifted(dims, ta, None, shift)
        for op in (AVG, ADD, NORM2, MUL, MAX, MIN):
            av = a.upload(_values(rng, dims, op, ta))
            c = DevTensor(cdims, tc)
            if shift == 0:
                kinds = [k[0] for k in plan_summary(handle, _rdesc(op, op in INDEXED), a.desc, c.desc)]
                # a walk of two reduced dims takes rows_vec only where the inner one holds whole vectors of
                # A's type (8 16-bit values, 4 floats): H x W = 100 is rows_gen's for 16-bit A
                vec = R.vec_width(R.TAG[ta], R.TAG[ta])
                want = "rows_vec" if not name.startswith("two dims") or np.prod(dims[2:]) % vec == 0 else "rows_gen"
                assert kinds[0] == want, (name, op, kinds)
            _check(handle, op, a.desc, a.ptr, av, c, tc, f"{name} op {op} shift {shift}")


def test_sweep_avg_rows(handle, rng):
    """Rows of the sweep's AVG 53513 x 2824 float32 point (8192 of them, 92 MB: the same plan per row), C
    poisoned."""
    dims, cdims = (8192, 2824), (8192, 1)
    a = DevTensor(dims, F32)
    av = a.random(rng)
    c = DevTensor(cdims, F32)
    _check(handle, AVG, a.desc, a.ptr, av, c, F32, "avg 8192 x 2824")
    assert np.isfinite(c.download()).all()


@pytest.mark.parametrize("rounds", [1, 2, 3])
def test_row_rounds(handle, rng, monkeypatch, rounds):
    """tuning.reduce.ROW_ROUNDS (the group per row: rounds of kUnroll vector loads per thread): the tails and
    sweep rows with each setting, C poisoned, aligned and unaligned A."""
    from pydnn import tuning
    monkeypatch.setattr(tuning.reduce, "ROW_ROUNDS", rounds)
    cases = [((517, 2824), F32, AVG), ((33, 16384), F16, MAX), ((5, 65536), BF16, ADD), ((97, 1001), F32, NORM2)]
    for dims, ta, op in cases:
        for shift in (0, 1):
            a = Shifted(dims, ta, None, shift)
            av = a.upload(_values(rng, dims, op, ta))
            c = DevTensor((dims[0], 1), ta)
            _check(handle, op, a.desc, a.ptr, av, c, ta, f"rounds {rounds} {dims} op {op} shift {shift}")


@pytest.mark.parametrize("seg_rounds", [1, 2, 4])
def test_seg_rounds(handle, rng, monkeypatch, seg_rounds):
    """tuning.reduce.SEG_ROUNDS (a segment of a split row or column keeps at least that many rounds of kUnroll
    loads a thread): few long rows in 4..24 segments (the second pass over the partials), indices of MAX over the
    segments (the first index must win), a column reduction, aligned and unaligned A, C poisoned."""
    from pydnn import tuning
    monkeypatch.setattr(tuning.reduce, "SEG_ROUNDS", seg_rounds)
    cases = [((18, 65536), F32, ADD, (18, 1)), ((9, 65536), BF16, MAX, (9, 1)), ((3, 100003), F32, AVG, (3, 1)),
             ((2, 70000), F16, MAX, (2, 1)), ((40000, 8), F32, ADD, (1, 8))]
    for dims, ta, op, cdims in cases:
        for shift in (0, 1):
            a = Shifted(dims, ta, None, shift)
            av = a.upload(_values(rng, dims, op, ta))
            c = DevTensor(cdims, ta)
            if shift == 0 and cdims[0] > 1:
                segs = plan_summary(handle, _rdesc(op, op in INDEXED), a.desc, c.desc)[0][3]
                assert segs > 1, (dims, segs)
            _check(handle, op, a.desc, a.ptr, av, c, ta, f"seg_rounds {seg_rounds} {dims} op {op} shift {shift}")
