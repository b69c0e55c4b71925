"""walk_row's batched tail (ptx/reduce.cu): the GPU cases of test_reduce_tail_gpu.py reach rows_vec with
one segment, and their lanes together end with every tail count 0..3 (float32 plans); the batched tail's
predicated loads, emulated, visit each unit of a lane once, in order, after the unrolled loop."""
import pydnn
from pydnn.ops import reduce as R
from reduce_tail_cases import CASES, tails
from test_fuzz_cpu import cpu_handle

F32 = pydnn.PYDNN_DATA_FLOAT


def _desc(dims):
    d = pydnn.create_tensor_descriptor()
    st, acc = [], 1
    for n in reversed(dims):
        st.append(acc)
        acc *= n
    pydnn.set_tensor_nd_descriptor(d, F32, len(dims), dims, tuple(reversed(st)))
    return d


def _rdesc(op):
    r = pydnn.create_reduce_tensor_descriptor()
    pydnn.set_reduce_tensor_descriptor(r, op, F32, 0, 0, pydnn.PYDNN_32BIT_INDICES)
    return r


def test_cases_hit_every_tail_count():
    h = cpu_handle()
    seen = set()
    for name, dims, cdims in CASES:
        pl = R._plan(h, _rdesc(pydnn.PYDNN_REDUCE_TENSOR_AVG), _desc(dims), _desc(cdims))
        lc = pl.launches[0]
        assert lc.kind == "rows_vec" and lc.params.segments == 1, name
        seen |= tails(lc.params.units, lc.params.group)
    assert seen == {0, 1, 2, 3}


def _lane_visits(units, G, lane):
    """walk_row's loops for one lane: the unrolled loop, then the batched tail (loads, then adds)."""
    U, u, out = R.UNROLL, lane, []
    while u + (U - 1) * G < units:
        out += [u + k * G for k in range(U)]
        u += U * G
    if u < units:
        loads = [u + k * G for k in range(U - 1) if u + k * G < units]
        assert len(loads) == len(range(u, units, G)) <= U - 1
        out += loads
    return out


def test_batched_tail_visits_each_unit_once_in_order():
    for units in list(range(0, 70)) + [706, 901, 1000]:
        for G in (1, 2, 4, 8, 32, 128, 256):
            for lane in range(min(G, units + 1)):
                assert _lane_visits(units, G, lane) == list(range(lane, units, G))


def test_row_rounds_sets_the_group(monkeypatch):
    """tuning.reduce.ROW_ROUNDS: the sweep's AVG 53513 x 2824 float32 rows (706 vectors) get G 128 at 2
    rounds (5.5 vectors per thread: two memory round trips), 256 at 1 (2.8: one); the group is capped at a
    block; every lane's tail stays within 0..3."""
    from pydnn import tuning
    h = cpu_handle()
    monkeypatch.setattr(tuning.reduce, "ROW_ROUNDS_WIDE", 0)  # (its own test: below)
    for rounds, want in ((2, 128), (1, 256), (3, 64)):
        monkeypatch.setattr(tuning.reduce, "ROW_ROUNDS", rounds)
        pl = R._plan(h, _rdesc(pydnn.PYDNN_REDUCE_TENSOR_AVG), _desc((53513, 2824)), _desc((53513, 1)))
        lc = pl.launches[0]
        assert lc.kind == "rows_vec" and lc.params.group == want, (rounds, lc.params.group)
        assert tails(lc.params.units, lc.params.group) <= {0, 1, 2, 3}


def test_row_rounds_wide_sets_the_group_for_many_rows(monkeypatch):
    """tuning.reduce.ROW_ROUNDS_WIDE (8): many rows of a few hundred vectors or more take groups of 8 rounds
    (53513 x 2824 float32: G 32) where the group keeps >= 32 threads and the rows >= a wave of threads
    (sm_count * 2048); few rows or short ones keep ROW_ROUNDS' group; 0: off."""
    from pydnn import tuning
    h = cpu_handle()

    def group(rows, length):
        pl = R._plan(h, _rdesc(pydnn.PYDNN_REDUCE_TENSOR_AVG), _desc((rows, length)), _desc((rows, 1)))
        lc = pl.launches[0]
        assert lc.kind == "rows_vec"
        assert tails(lc.params.units, lc.params.group) <= {0, 1, 2, 3}
        return lc.params.group

    assert group(53513, 2824) == 32
    assert group(30000, 8192) == 64
    assert group(2563, 128) == 4      # G 1 would be short of a warp
    assert group(1818, 16384) == 256  # 1818 x 128 threads: short of a wave
    assert group(1048576, 120) == 4   # 30 vectors: 8 rounds would leave 1 thread a row
    monkeypatch.setattr(tuning.reduce, "ROW_ROUNDS_WIDE", 0)
    assert group(53513, 2824) == 128
