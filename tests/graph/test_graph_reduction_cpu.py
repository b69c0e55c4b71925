"""The REDUCTION / OPERATION_REDUCTION descriptors and the fused matmul + row reduction on the CPU: cuDNN 9's
attribute names and enum values, attribute and finalize checks, which graphs the fusion engine takes (and
the reason it gives for the others, which the node engine runs), and a fused plan built with a CPU handle
(the generated kernel compiled by NVRTC) whose execute launches once with the workspace and the counters
in the epilogue's two extra pointer slots."""
import os
import sys

import pytest

import pydnn as P
from pydnn.graph import Graph
from pydnn.graph import engines as EN

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))
import bench_host as B  # noqa: E402

BAD, NS = P.PYDNN_STATUS_BAD_PARAM, P.PYDNN_STATUS_NOT_SUPPORTED
BF16, F32, F16 = P.PYDNN_DATA_BFLOAT16, P.PYDNN_DATA_FLOAT, P.PYDNN_DATA_HALF
DESC = P.PYDNN_TYPE_BACKEND_DESCRIPTOR


def _raises(status, needle, fn, *args):
    with pytest.raises(P.PydnnError) as e:
        fn(*args)
    assert e.value.status == status, e.value
    assert needle in str(e.value), e.value


def test_cudnn_names_and_values():
    assert (P.PYDNN_BACKEND_REDUCTION_DESCRIPTOR, P.PYDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR) == (21, 22)
    assert (P.PYDNN_ATTR_REDUCTION_OPERATOR, P.PYDNN_ATTR_REDUCTION_COMP_TYPE, P.PYDNN_ATTR_OPERATION_REDUCTION_XDESC,
            P.PYDNN_ATTR_OPERATION_REDUCTION_YDESC, P.PYDNN_ATTR_OPERATION_REDUCTION_DESC) == (1600, 1601, 1610, 1611, 1612)
    assert P.PYDNN_TYPE_REDUCTION_OPERATOR_TYPE == 18
    assert [getattr(P, "PYDNN_REDUCE_TENSOR_" + n) for n in
            ("ADD", "MUL", "MIN", "MAX", "AMAX", "AVG", "NORM1", "NORM2", "MUL_NO_ZEROS")] == list(range(9))
    # every cuDNN reduce op fuses into a matmul epilogue
    assert set(EN.RED_NAMES) == set(range(9))


def test_reduction_descriptor_checks():
    r = P.backend_create_descriptor(P.PYDNN_BACKEND_REDUCTION_DESCRIPTOR)
    _raises(BAD, "99 is not a pydnnReduceTensorOp_t value", P.backend_set_attribute, r, P.PYDNN_ATTR_REDUCTION_OPERATOR,
            P.PYDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, [99])
    _raises(BAD, "takes PYDNN_TYPE_REDUCTION_OPERATOR_TYPE", P.backend_set_attribute, r,
            P.PYDNN_ATTR_REDUCTION_OPERATOR, P.PYDNN_TYPE_INT64, 1, [3])
    _raises(BAD, "needs PYDNN_ATTR_REDUCTION_OPERATOR", P.backend_finalize, r)
    P.backend_set_attribute(r, P.PYDNN_ATTR_REDUCTION_OPERATOR, P.PYDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1,
                            [P.PYDNN_REDUCE_TENSOR_NORM2])
    P.backend_set_attribute(r, P.PYDNN_ATTR_REDUCTION_COMP_TYPE, P.PYDNN_TYPE_DATA_TYPE, 1, [F32])
    P.backend_finalize(r)
    _raises(BAD, "", P.backend_set_attribute, r, P.PYDNN_ATTR_REDUCTION_OPERATOR,
            P.PYDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, [P.PYDNN_REDUCE_TENSOR_ADD])  # finalized: immutable
    n, got = P.backend_get_attribute(r, P.PYDNN_ATTR_REDUCTION_OPERATOR, P.PYDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1)
    assert n == 1 and list(got) == [P.PYDNN_REDUCE_TENSOR_NORM2]


def _mm_red(h, mode=P.PYDNN_REDUCE_TENSOR_MAX, m=64, n=96, k=64, batch=1, store_x=False, ydim=None,
            extra_op=False, comp=None, second=False):
    g = Graph(io_data_type=BF16, intermediate_data_type=F32, compute_data_type=F32, handle=h)
    a = g.tensor(name="a", dim=[batch, m, k])
    w = g.tensor(name="w", dim=[1, k, n])
    v = g.add(g.matmul(a, w), g.tensor(name="bias", dim=[1, 1, n]))
    if store_x:
        v.set_output(True).set_name("x")
    y = g.reduction(v, mode, dim=ydim or [batch, m, 1], compute_data_type=comp).set_name("y")
    if extra_op:
        g.exp(y).set_output(True).set_name("z")
    else:
        y.set_output(True)
    if second:
        g.reduction(v, P.PYDNN_REDUCE_TENSOR_ADD, dim=[batch, m, 1]).set_output(True).set_name("y2")
    return g


@pytest.fixture
def cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("PYDNN_CACHE_DIR", str(tmp_path))
    with B.no_launch() as drv:
        yield B.cpu_handle(), B.CpuBuffers(), drv


@pytest.mark.parametrize("kw, reason", [
    (dict(), None),
    (dict(store_x=True, mode=P.PYDNN_REDUCE_TENSOR_AVG), None),
    (dict(ydim=[1, 1, 96]), None),  # a column reduction: the fused GEMM, then reduce_tensor (reduce_tail.py)
    (dict(extra_op=True), "must be a graph output that no operation reads"),
    (dict(second=True), "at most one reduction"),
    (dict(comp=F16), "the fused epilogue reduces in FLOAT"),
])
def test_fusion_engine_takes_row_reductions(cpu, kw, reason):
    h, _, _ = cpu
    g = _mm_red(h, **kw)
    g.build_operation_graph()
    why = EN.ENGINES[1].support(g._opgraph.state)
    if reason is None:
        assert why is None
        assert EN.ENGINES[0].support(g._opgraph.state) is None  # the node engine runs it too (FALLBACK)
    else:
        assert reason in why, why
        assert EN.heuristic(g._opgraph.state, P.PYDNN_HEUR_MODE_A) == [0]


@pytest.mark.parametrize("store_x", [False, True])
def test_fused_row_reduction_plan_on_cpu(cpu, monkeypatch, store_x):
    """build_plans compiles the generated GEMM + MAX kernel (NVRTC, no GPU); the workspace holds a float
    partial per (column tile x warps along n, row); execute launches once, the workspace and the counters
    in the epilogue's slots after its tensors, C's pointer only when the reduced tensor is stored."""
    from pydnn.ops import matmul as M

    h, buf, drv = cpu

    class Counters:
        ptr = 0x7000000

    monkeypatch.setattr(EN, "_zeroed_u32", lambda handle, n: Counters())
    m, n, k, batch = 64, 96, 64, 2
    g = _mm_red(h, m=m, n=n, k=k, batch=batch, store_x=store_x)
    g.build_operation_graph().create_execution_plans().build_plans()
    assert g.engine_index() == 1 and g.launches() == 1
    step = g._plan_obj.built.steps[0]
    assert step.store_c == store_x
    parts = 0
    for rec, tile in ((step.plan.fast, M._choose_tile(m, n, batch, h.sm_count, h.arch, k)), (step.plan.general, M.TC_GENERAL)):
        parts = max(parts, rec.params.tiles_n * (tile.wn if hasattr(tile, "wm") else 1))
    assert g.get_workspace_size() == batch * parts * m * 4
    names = {"a": batch * m * k * 2, "w": k * n * 2, "bias": n * 2, "y": batch * m * 2}
    if store_x:
        names["x"] = batch * m * n * 2
    bufs = {nm: buf(nb)[0] for nm, nb in names.items()}
    ws = buf(g.get_workspace_size())[0]
    before = drv.launches
    g.execute(bufs, ws)
    assert drv.launches == before + 1
    slot = step.red_slot
    assert step.e.ptr[slot] == ws and step.e.ptr[slot + 1] == Counters.ptr
    assert step.e.ptr[step.eops.index(g.tensors[[t.name for t in g.tensors].index("y")].uid)] == bufs["y"]
    p = step.recs[0][0].params
    assert (p.c or 0) == (bufs["x"] if store_x else 0)
    with pytest.raises(P.PydnnError, match="workspace"):
        g.execute(bufs, 0)
