"""pydnn.graph.Graph on the CPU (a CPU-only handle; kernels compile with NVRTC, nothing runs): shapes
inferred per node, validation errors, engine choice (fusion for pointwise graphs, nodes otherwise),
workspace sizes, serialize / deserialize (same engine, same kernel; version mismatch; corrupt blobs)."""
import json

import pytest

import pydnn as P
from pydnn.graph import Graph
from test_fuzz_cpu import cpu_handle

BAD, NS = P.PYDNN_STATUS_BAD_PARAM, P.PYDNN_STATUS_NOT_SUPPORTED


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("PYDNN_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "graphcache"))


def _raises(status, needle, fn, *args, **kw):
    with pytest.raises(P.PydnnError) as e:
        fn(*args, **kw)
    assert e.value.status == status, e.value
    assert needle in str(e.value), e.value


def chain8(io=P.PYDNN_DATA_HALF):
    """8 pointwise ops over 3 inputs (the issue's launch-count graph)."""
    g = Graph(io_data_type=io, handle=cpu_handle())
    x = g.tensor(name="x", dim=[8, 64, 128])
    s = g.tensor(name="s", dim=[1, 64, 1])
    b = g.tensor(name="b", dim=[1, 1, 128])
    v = g.mul(x, s)
    v = g.add(v, b)
    v = g.gelu(v)
    v = g.mul(v, x)
    v = g.sub(v, b)
    v = g.relu(v, upper_clip=4.0)
    v = g.tanh(v)
    y = g.add(v, x, name="y").set_output(True)
    return g, (x, s, b, y)


def test_chain_fuses_into_one_kernel():
    g, (x, s, b, y) = chain8()
    assert y.dim == [8, 64, 128] and y.virtual is False
    g.build_operation_graph().create_execution_plans([P.PYDNN_HEUR_MODE_A, P.PYDNN_HEUR_MODE_FALLBACK])
    assert g.engines() == [1, 0]
    g.check_support().build_plans()
    assert g.engine_index() == 1 and g.launches() == 1 and g.get_workspace_size() == 0


def test_fallback_builds_node_plan():
    g, _ = chain8()
    g.build_operation_graph().create_execution_plans([P.PYDNN_HEUR_MODE_FALLBACK]).build_plans()
    assert g.engine_index() == 0 and g.launches() == 8 and g.get_workspace_size() > 0


def test_matmul_bias_gelu_fuses_into_one_gemm():
    g = Graph(io_data_type=P.PYDNN_DATA_BFLOAT16, handle=cpu_handle())
    a = g.tensor(name="a", dim=[1, 128, 64])
    w = g.tensor(name="w", dim=[1, 64, 96])
    bias = g.tensor(name="bias", dim=[1, 1, 96])
    c = g.matmul(a, w)
    assert c.dim == [1, 128, 96]
    y = g.gelu(g.add(c, bias)).set_output(True)
    g.build_operation_graph().create_execution_plans([P.PYDNN_HEUR_MODE_A, P.PYDNN_HEUR_MODE_FALLBACK])
    assert g.engines() == [1, 0]
    g.build_plans()
    assert g.engine_index() == 1 and g.launches() == 1 and g.get_workspace_size() == 0
    assert y.data_type is None  # io type at build: BFLOAT16
    step = g._plan_obj.built.steps[0]
    assert step.e.stride[0][1:3] == [0, 1]  # the bias: broadcast over the rows
    blob = g.serialize()
    g2 = Graph.deserialize(cpu_handle(), blob)
    assert g2.engine_index() == 1 and g2._plan_obj.built.steps[0].unit.name == step.unit.name


def test_matmul_epilogue_column_major_output_swaps_rows_and_columns():
    """A column-major output: the GEMM computes C^T = B^T A^T, so the epilogue's (row, col) are the
    output's (col, row): the residual's strides are swapped too."""
    g = Graph(io_data_type=P.PYDNN_DATA_HALF, handle=cpu_handle())
    a = g.tensor(name="a", dim=[64, 32])
    w = g.tensor(name="w", dim=[32, 48])
    r = g.tensor(name="r", dim=[64, 48])  # row-major residual
    y = g.add(g.matmul(a, w), r).set_output(True).set_stride([1, 64])
    g.build_operation_graph().create_execution_plans().build_plans()
    step = g._plan_obj.built.steps[0]
    assert g.engine_index() == 1 and step.swap
    assert step.e.stride[0][:3] == [0, 1, 48]  # kernel row = output column (stride 1), kernel col = row (48)


def test_matmul_epilogue_not_fusable_reasons():
    g = Graph(io_data_type=P.PYDNN_DATA_FLOAT, handle=cpu_handle())
    y = g.relu(g.matmul(g.tensor(dim=[8, 8]), g.tensor(dim=[8, 8]))).set_output(True)
    g.build_operation_graph().create_execution_plans()
    assert g.engines() == [0]  # float: the node engine (gemm_simt, then the ReLU)
    from pydnn.graph.engines import ENGINES

    assert "HALF or BFLOAT16" in ENGINES[1].support(g._opgraph.state)
    assert y.uid


def test_shape_errors():
    g = Graph(handle=cpu_handle())
    a = g.tensor(dim=[4, 8])
    _raises(BAD, "do not broadcast", g.add, a, g.tensor(dim=[3, 8]))
    _raises(BAD, "different ranks", g.add, a, g.tensor(dim=[8]))
    _raises(BAD, "A has 8 columns, B has 5 rows", g.matmul, a, g.tensor(dim=[5, 2]))
    _raises(BAD, "not a tensor of this graph", g.relu, Graph().tensor(dim=[4, 8]))
    _raises(BAD, "unknown parameter", g.relu, a, nonsense=1)
    _raises(BAD, "no operations", g.validate)
    _raises(BAD, "no handle", Graph().build_operation_graph)


def test_unsupported_graph_says_why():
    g = Graph(io_data_type=P.PYDNN_DATA_DOUBLE, handle=cpu_handle())
    y = g.exp(g.tensor(name="x", dim=[4, 8])).set_output(True)
    g.build_operation_graph().create_execution_plans()
    _raises(NS, "data type 1", g.check_support)
    assert y.uid


def test_serialize_roundtrip_and_errors():
    g, _ = chain8()
    g.build_operation_graph().create_execution_plans().build_plans()
    blob = g.serialize()
    g2 = Graph.deserialize(cpu_handle(), blob)
    assert g2.engine_index() == 1 and g2.launches() == 1
    assert sorted(t.name for t in g2.tensors) == ["b", "s", "x", "y"]
    assert g2._plan_obj.built.steps[0].expr == g._plan_obj.built.steps[0].expr
    j = json.loads(blob)
    _raises(P.PYDNN_STATUS_SERIALIZATION_VERSION_MISMATCH, "version 2", Graph.deserialize, cpu_handle(),
            json.dumps(dict(j, version=2)).encode())
    _raises(BAD, "corrupt", Graph.deserialize, cpu_handle(), blob[:-5])
    _raises(BAD, "corrupt", Graph.deserialize, cpu_handle(), b"\xff\xfe")
    _raises(BAD, "not a serialized pydnn graph", Graph.deserialize, cpu_handle(), b"{}")
    _raises(BAD, "corrupt", Graph.deserialize, cpu_handle(), json.dumps(dict(j, plan="{")).encode())
    inner = json.loads(j["plan"])
    _raises(P.PYDNN_STATUS_SERIALIZATION_VERSION_MISMATCH, "version 0", Graph.deserialize, cpu_handle(),
            json.dumps(dict(j, plan=json.dumps(dict(inner, version=0)))).encode())


def test_execute_needs_a_plan_and_known_tensors():
    g, (x, s, b, y) = chain8()
    _raises(P.PYDNN_STATUS_BAD_PARAM_NOT_FINALIZED, "build_plans first", g.execute, {}, 0)
    g.build_operation_graph().create_execution_plans().build_plans()
    _raises(BAD, "no tensor named 'q'", g.execute, {"q": 1 << 20}, 0)
    _raises(BAD, "no data pointer for tensor uid", g.execute, {x: 1 << 20}, 0)
    _raises(P.PYDNN_STATUS_BAD_PARAM_NULL_POINTER, "uid", g.execute, {x: 0, s: 1, b: 2, y: 3}, 0)
