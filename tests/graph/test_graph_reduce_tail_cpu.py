"""A reduction after a fusable graph in the fusion engine (pydnn/graph/reduce_tail.py) on the CPU: which
graphs it takes (column reductions, reductions of pointwise graphs) and which it leaves to the one-launch
forms (a row reduction in the GEMM's epilogue, with or without a prologue), the plan's steps, the reduced
tensor's storage type and workspace layout."""
import pytest

import pydnn as P
from pydnn.graph import Graph
from pydnn.graph import engines as EN
from test_fuzz_cpu import cpu_handle

BF16, F32 = P.PYDNN_DATA_BFLOAT16, P.PYDNN_DATA_FLOAT


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("PYDNN_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "redtailcache"))

    class Zeroed:
        ptr = 0
    monkeypatch.setattr(EN, "_zeroed_u32", lambda handle, n: Zeroed())


def _built(g):
    g.build_operation_graph().create_execution_plans().check_support().build_plans()
    return g._plan_obj.built


def test_pointwise_then_column_reduction():
    g = Graph(io_data_type=F32, handle=cpu_handle())
    x = g.tensor(name="x", dim=[4, 8, 16])
    g.reduction(g.exp(x), P.PYDNN_REDUCE_TENSOR_MAX, dim=[4, 1, 16]).set_output(True).set_name("y")
    b = _built(g)
    assert g.engine_index() == 1 and [type(s).__name__ for s in b.steps] == ["PwStep", "ReduceStep"]
    (uid, off), = b.offsets.items()
    assert off == 0 and g.get_workspace_size() >= 4 * 8 * 16 * 4  # the FLOAT intermediate, stored
    assert b.steps[1].ws_offset >= 4 * 8 * 16 * 4


@pytest.mark.parametrize("prologue", [False, True])
def test_matmul_then_column_reduction(prologue):
    g = Graph(io_data_type=BF16, intermediate_data_type=F32, handle=cpu_handle())
    a = g.tensor(name="a", dim=[1, 64, 32])
    w = g.tensor(name="w", dim=[1, 32, 48])
    bias = g.tensor(name="bias", dim=[1, 1, 48])
    v = g.add(g.matmul(g.relu(a) if prologue else a, w), bias)
    g.reduction(v, P.PYDNN_REDUCE_TENSOR_ADD, dim=[1, 1, 48]).set_output(True).set_name("colsum")
    b = _built(g)
    names = [type(s).__name__ for s in b.steps]
    assert g.engine_index() == 1
    assert names == (["PwStep"] if prologue else []) + ["FusedMatmulStep", "ReduceStep"]
    red = b.steps[-1]
    xuid = red.uids[0]
    assert xuid in b.offsets  # the virtual epilogue result, stored (bf16, the GEMM's store) in the workspace
    assert g.get_workspace_size() >= b.offsets[xuid] + 64 * 48 * 2


def test_row_reductions_stay_one_launch_forms():
    g = Graph(io_data_type=BF16, intermediate_data_type=F32, handle=cpu_handle())
    a, w = g.tensor(name="a", dim=[1, 64, 32]), g.tensor(name="w", dim=[1, 32, 48])
    g.reduction(g.matmul(a, w), P.PYDNN_REDUCE_TENSOR_MAX, dim=[1, 64, 1]).set_output(True).set_name("y")
    b = _built(g)
    assert [type(s).__name__ for s in b.steps] == ["FusedMatmulStep"] and g.launches() == 1
    g = Graph(io_data_type=BF16, intermediate_data_type=F32, handle=cpu_handle())
    a, w = g.tensor(name="a", dim=[1, 64, 32]), g.tensor(name="w", dim=[1, 32, 48])
    g.reduction(g.matmul(g.relu(a), w), P.PYDNN_REDUCE_TENSOR_MAX, dim=[1, 64, 1]).set_output(True).set_name("y")
    b = _built(g)
    assert [type(s).__name__ for s in b.steps] == ["PwStep", "FusedMatmulStep"] and g.launches() == 2


def test_plain_reduction_stays_on_the_node_engine():
    g = Graph(io_data_type=F32, handle=cpu_handle())
    x = g.tensor(name="x", dim=[4, 8, 16])
    g.reduction(x, P.PYDNN_REDUCE_TENSOR_MAX, dim=[4, 1, 16]).set_output(True).set_name("y")
    g.build_operation_graph().create_execution_plans().build_plans()
    assert g.engine_index() == 0
