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
    assert g.engine_index() == 1 and step.swap and y.stride == [1, 64]
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


def _conv_graph(io=P.PYDNN_DATA_HALF, wdim=(32, 16, 3, 3), wstride=None, padding=(1, 1)):
    g = Graph(io_data_type=io, handle=cpu_handle())
    x = g.tensor(name="x", dim=[2, 16, 10, 10])
    w = g.tensor(name="w", dim=list(wdim), stride=wstride)
    b = g.tensor(name="b", dim=[1, wdim[0], 1, 1])
    y = g.relu(g.add(g.conv_fprop(x, w, padding=list(padding)), b)).set_output(True)
    return g, y


def test_conv_bias_relu_fuses_into_the_convolution_epilogue():
    g, y = _conv_graph()
    assert y.dim == [2, 32, 10, 10]
    g.build_operation_graph().create_execution_plans([P.PYDNN_HEUR_MODE_A, P.PYDNN_HEUR_MODE_FALLBACK])
    assert g.engines() == [1, 0]
    g.build_plans()
    step = g._plan_obj.built.steps[0]
    assert type(step).__name__ == "ConvBiasActStep" and step.uids["z"] is None
    assert P.get_activation_descriptor(step.ad)[0] == P.PYDNN_ACTIVATION_RELU


def test_conv_bias_residual_clipped_relu_pattern():
    g = Graph(io_data_type=P.PYDNN_DATA_HALF, handle=cpu_handle())
    x = g.tensor(name="x", dim=[2, 16, 10, 10])
    w = g.tensor(name="w", dim=[16, 16, 3, 3])
    b = g.tensor(name="b", dim=[1, 16, 1, 1])
    z = g.tensor(name="z", dim=[2, 16, 10, 10])
    g.relu(g.add(g.add(g.conv_fprop(x, w, padding=[1, 1]), b), z), upper_clip=6.0).set_output(True)
    g.build_operation_graph().create_execution_plans().build_plans()
    step = g._plan_obj.built.steps[0]
    assert g.engine_index() == 1 and step.uids["z"] == z.uid
    assert P.get_activation_descriptor(step.ad)[::2] == (P.PYDNN_ACTIVATION_CLIPPED_RELU, 6.0)
    g = Graph(io_data_type=P.PYDNN_DATA_HALF, handle=cpu_handle())   # no bias: not this pattern
    y = g.relu(g.conv_fprop(g.tensor(dim=[2, 16, 10, 10]), g.tensor(dim=[16, 16, 3, 3]))).set_output(True)
    g.build_operation_graph().create_execution_plans()
    assert g.engines() == [0] and y.uid


def test_conv_bias_relu_node_engine():
    g, y = _conv_graph()
    g.build_operation_graph().create_execution_plans([P.PYDNN_HEUR_MODE_FALLBACK]).build_plans()
    assert [type(s).__name__ for s in g._plan_obj.built.steps] == ["ConvStep", "PwStep", "PwStep"]
    assert g.get_workspace_size() >= 2 * 32 * 10 * 10 * 2
    g2 = Graph.deserialize(cpu_handle(), g.serialize())
    assert [type(s).__name__ for s in g2._plan_obj.built.steps] == ["ConvStep", "PwStep", "PwStep"]


def test_conv_nhwc_filter_and_unpacked_filter():
    g, _ = _conv_graph(wstride=[144, 1, 48, 16])  # NHWC filter (K, R, S, C in memory)
    g.build_operation_graph().create_execution_plans().build_plans()
    g, _ = _conv_graph(wstride=[300, 9, 3, 1])  # padded K stride: not a filter layout pydnn takes
    g.build_operation_graph().create_execution_plans()
    _raises(NS, "must be packed NCHW or NHWC", g.check_support)
    assert g.engines() == []


def test_conv_graph_errors():
    g = Graph(handle=cpu_handle())
    x = g.tensor(dim=[2, 16, 10, 10])
    _raises(BAD, "disagree", g.conv_fprop, x, g.tensor(dim=[8, 16, 3]))
    _raises(BAD, "would have dims", g.conv_fprop, x, g.tensor(dim=[8, 16, 11, 11]))
    dx = g.conv_dgrad(g.tensor(dim=[2, 8, 8, 8]), g.tensor(dim=[8, 16, 3, 3]))
    _raises(BAD, "has no dims", g.validate)
    dx.set_dim([2, 16, 9, 9]).set_output(True)
    _raises(BAD, "y dims [2, 8, 8, 8], the convolution gives [2, 8, 7, 7]", g.build_operation_graph)
    g = Graph(handle=cpu_handle())
    y = g.conv_fprop(g.tensor(dim=[2, 16, 10, 10]), g.tensor(dim=[8, 8, 3, 3]))
    y.set_output(True)
    _raises(BAD, "grouped convolutions are not supported", g.build_operation_graph)


def test_conv_asymmetric_padding_not_supported():
    from pydnn.graph import backend as B

    c = B.backend_create_descriptor(P.PYDNN_BACKEND_CONVOLUTION_DESCRIPTOR)
    I64 = P.PYDNN_TYPE_INT64
    B.backend_set_attribute(c, P.PYDNN_ATTR_CONVOLUTION_COMP_TYPE, P.PYDNN_TYPE_DATA_TYPE, 1, [P.PYDNN_DATA_FLOAT])
    B.backend_set_attribute(c, P.PYDNN_ATTR_CONVOLUTION_CONV_MODE, P.PYDNN_TYPE_CONVOLUTION_MODE, 1,
                            [P.PYDNN_CROSS_CORRELATION])
    B.backend_set_attribute(c, P.PYDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, I64, 1, [2])
    for a, v in (("DILATIONS", [1, 1]), ("FILTER_STRIDES", [1, 1]), ("PRE_PADDINGS", [1, 1]), ("POST_PADDINGS", [1, 0])):
        B.backend_set_attribute(c, getattr(P, "PYDNN_ATTR_CONVOLUTION_" + a), I64, 2, v)
    _raises(NS, "asymmetric paddings", B.backend_finalize, c)
