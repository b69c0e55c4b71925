"""The graph API's normalization nodes on the CPU (a CPU-only handle: kernels compile with NVRTC, nothing
runs): cuDNN 9's OPERATION_NORM_FORWARD / BACKWARD attribute names and enum values, descriptor validation
(BAD_PARAM naming the attribute, NOT_SUPPORTED with the reason), the frontend's layernorm / rmsnorm /
batchnorm / instancenorm (+ backward) shapes, engine choice (fusion of a norm + pointwise epilogue into one
launch, the node engine otherwise), the generated norm + epilogue kernel compiled by NVRTC for sm_80 and
sm_90, serialization with by-value constants, and the epilogue's operand strides."""
import json

import pytest

import pydnn as P
from pydnn.graph import Graph
from pydnn.graph import backend as B
from pydnn.graph import codegen as cg
from pydnn.graph import norm_nodes as NN
from test_fuzz_cpu import cpu_handle

BAD, NS = P.PYDNN_STATUS_BAD_PARAM, P.PYDNN_STATUS_NOT_SUPPORTED
F32, BF16, F16 = P.PYDNN_DATA_FLOAT, P.PYDNN_DATA_BFLOAT16, P.PYDNN_DATA_HALF
DESC = P.PYDNN_TYPE_BACKEND_DESCRIPTOR


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("PYDNN_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "graphcache"))


def _raises(status, needle, fn, *args, **kw):
    with pytest.raises(P.PydnnError) as e:
        fn(*args, **kw)
    assert e.value.status == status, e.value
    assert needle in str(e.value), e.value


def test_cudnn_values():
    """cuDNN 9's numbers (cudnn_graph.h)."""
    assert (P.PYDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR, P.PYDNN_BACKEND_OPERATION_NORM_BACKWARD_DESCRIPTOR,
            P.PYDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR) == (29, 30, 41)
    assert (P.PYDNN_LAYER_NORM, P.PYDNN_INSTANCE_NORM, P.PYDNN_BATCH_NORM, P.PYDNN_GROUP_NORM, P.PYDNN_RMS_NORM,
            P.PYDNN_ADA_LAYER_NORM) == (0, 1, 2, 3, 4, 5)
    assert (P.PYDNN_NORM_FWD_INFERENCE, P.PYDNN_NORM_FWD_TRAINING) == (0, 1)
    assert (P.PYDNN_TYPE_NORM_MODE, P.PYDNN_TYPE_NORM_FWD_PHASE) == (27, 28)
    assert P.PYDNN_ATTR_OPERATION_NORM_FWD_MODE == 2000 and P.PYDNN_ATTR_OPERATION_NORM_FWD_YDESC == 2013
    assert P.PYDNN_ATTR_OPERATION_NORM_FWD_PEER_STAT_DESCS == 2014
    assert P.PYDNN_ATTR_OPERATION_NORM_BWD_MODE == 2100 and P.PYDNN_ATTR_OPERATION_NORM_BWD_DXDESC == 2109
    assert P.PYDNN_ATTR_OPERATION_SDPA_FWD_QDESC == 2800 and P.PYDNN_ATTR_OPERATION_SDPA_FWD_SCALEDESC == 2805


_UID = [100]


def _t(dims, dtype=F32, by_value=False, virtual=False):
    d = B.backend_create_descriptor(P.PYDNN_BACKEND_TENSOR_DESCRIPTOR)
    st, acc = [], 1
    for v in reversed(dims):
        st.insert(0, acc)
        acc *= v
    _UID[0] += 1
    S = B.backend_set_attribute  # noqa: N806
    S(d, P.PYDNN_ATTR_TENSOR_DATA_TYPE, P.PYDNN_TYPE_DATA_TYPE, 1, [dtype])
    S(d, P.PYDNN_ATTR_TENSOR_DIMENSIONS, P.PYDNN_TYPE_INT64, len(dims), list(dims))
    S(d, P.PYDNN_ATTR_TENSOR_STRIDES, P.PYDNN_TYPE_INT64, len(dims), st)
    S(d, P.PYDNN_ATTR_TENSOR_UNIQUE_ID, P.PYDNN_TYPE_INT64, 1, [_UID[0]])
    S(d, P.PYDNN_ATTR_TENSOR_BYTE_ALIGNMENT, P.PYDNN_TYPE_INT64, 1, [16])
    S(d, P.PYDNN_ATTR_TENSOR_IS_VIRTUAL, P.PYDNN_TYPE_BOOLEAN, 1, [virtual])
    S(d, P.PYDNN_ATTR_TENSOR_IS_BY_VALUE, P.PYDNN_TYPE_BOOLEAN, 1, [by_value])
    B.backend_finalize(d)
    return d


def _fwd_op(mode=P.PYDNN_LAYER_NORM, phase=P.PYDNN_NORM_FWD_TRAINING, x=(4, 8, 32), scale=(1, 1, 32), stats=(4, 8, 1),
            skip=(), extra=None):
    o = B.backend_create_descriptor(P.PYDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR)
    S = B.backend_set_attribute  # noqa: N806
    S(o, P.PYDNN_ATTR_OPERATION_NORM_FWD_MODE, P.PYDNN_TYPE_NORM_MODE, 1, [mode])
    S(o, P.PYDNN_ATTR_OPERATION_NORM_FWD_PHASE, P.PYDNN_TYPE_NORM_FWD_PHASE, 1, [phase])
    ts = dict(XDESC=_t(x, BF16), YDESC=_t(x, BF16), SCALE_DESC=_t(scale), BIAS_DESC=_t(scale),
              EPSILON_DESC=_t((1, 1, 1), by_value=True), MEAN_DESC=_t(stats), INV_VARIANCE_DESC=_t(stats))
    ts.update(extra or {})
    for k, v in ts.items():
        if k not in skip:
            S(o, getattr(P, "PYDNN_ATTR_OPERATION_NORM_FWD_" + k), DESC, 1, [v])
    return o


def test_forward_descriptor_finalizes_and_validates():
    o = _fwd_op()
    B.backend_finalize(o)
    assert o.state.kind == "norm_fwd" and o.state.params["k"] == 1
    assert set(o.state.inputs) == {"x", "scale", "bias", "epsilon"}
    assert set(o.state.outputs) == {"y", "mean", "inv_variance"}
    # a [1, C, H, W] scale normalizes every sample over C, H, W
    o = _fwd_op(x=(2, 3, 4, 5), scale=(1, 3, 4, 5), stats=(2, 1, 1, 1))
    B.backend_finalize(o)
    assert o.state.params["k"] == 3
    _raises(BAD, "PYDNN_ATTR_OPERATION_NORM_FWD_SCALE_DESC dims [1, 1, 16]", B.backend_finalize,
            _fwd_op(scale=(1, 1, 16)))
    _raises(BAD, "needs PYDNN_ATTR_OPERATION_NORM_FWD_XDESC", B.backend_finalize, _fwd_op(skip=("XDESC",)))
    _raises(BAD, "needs PYDNN_ATTR_OPERATION_NORM_FWD_MEAN_DESC", B.backend_finalize, _fwd_op(skip=("MEAN_DESC",)))
    _raises(BAD, "PYDNN_ATTR_OPERATION_NORM_FWD_INV_VARIANCE_DESC dims [4, 1, 1]", B.backend_finalize,
            _fwd_op(extra=dict(INV_VARIANCE_DESC=_t((4, 1, 1)))))
    _raises(BAD, "PYDNN_ATTR_OPERATION_NORM_FWD_EPSILON_DESC must be one element", B.backend_finalize,
            _fwd_op(extra=dict(EPSILON_DESC=_t((1, 2, 1)))))
    _raises(BAD, "inference writes no statistics", B.backend_finalize, _fwd_op(phase=P.PYDNN_NORM_FWD_INFERENCE))
    _raises(BAD, "RMS norm has no mean", B.backend_finalize, _fwd_op(mode=P.PYDNN_RMS_NORM))
    _raises(BAD, "YDESC dims [4, 8, 16]", B.backend_finalize, _fwd_op(extra=dict(YDESC=_t((4, 8, 16), BF16))))
    _raises(NS, "GROUP_NORM is not supported", B.backend_finalize, _fwd_op(mode=P.PYDNN_GROUP_NORM))
    _raises(BAD, "running statistics", B.backend_finalize,
            _fwd_op(extra=dict(EXP_AVG_FACTOR_DESC=_t((1, 1, 1), by_value=True))))
    # attribute type and values are checked on set
    o = B.backend_create_descriptor(P.PYDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR)
    _raises(BAD, "pydnnBackendNormMode_t", B.backend_set_attribute, o, P.PYDNN_ATTR_OPERATION_NORM_FWD_MODE,
            P.PYDNN_TYPE_NORM_MODE, 1, [17])
    _raises(BAD, "", B.backend_set_attribute, o, P.PYDNN_ATTR_OPERATION_NORM_FWD_MODE, P.PYDNN_TYPE_INT64, 1, [0])
    _raises(BAD, "pydnnBackendNormFwdPhase_t", B.backend_set_attribute, o, P.PYDNN_ATTR_OPERATION_NORM_FWD_PHASE,
            P.PYDNN_TYPE_NORM_FWD_PHASE, 1, [2])


def test_batchnorm_descriptor_running_statistics():
    x, p = (4, 6, 5, 5), (1, 6, 1, 1)
    full = dict(EXP_AVG_FACTOR_DESC=_t((1, 1, 1, 1), by_value=True), INPUT_RUNNING_MEAN_DESC=_t(p),
                INPUT_RUNNING_VAR_DESC=_t(p), OUTPUT_RUNNING_MEAN_DESC=_t(p), OUTPUT_RUNNING_VAR_DESC=_t(p))
    o = _fwd_op(P.PYDNN_BATCH_NORM, x=x, scale=p, stats=p, extra=full)
    B.backend_finalize(o)
    assert {"momentum", "in_running_mean", "in_running_var"} <= set(o.state.inputs)
    assert {"out_running_mean", "out_running_var"} <= set(o.state.outputs)
    part = dict(full)
    del part["INPUT_RUNNING_VAR_DESC"]
    _raises(BAD, "missing in_running_var", B.backend_finalize, _fwd_op(P.PYDNN_BATCH_NORM, x=x, scale=p, stats=p,
                                                                        extra=part))
    _raises(BAD, "SCALE_DESC dims [1, 6, 5, 5] must be [1, 6, 1, 1]", B.backend_finalize,
            _fwd_op(P.PYDNN_BATCH_NORM, x=x, scale=(1, 6, 5, 5), stats=p))
    # inference reads mean / inv_variance
    o = _fwd_op(P.PYDNN_BATCH_NORM, P.PYDNN_NORM_FWD_INFERENCE, x=x, scale=p, stats=p)
    B.backend_finalize(o)
    assert {"mean", "inv_variance"} <= set(o.state.inputs) and set(o.state.outputs) == {"y"}


def test_backward_descriptor_validates():
    def op(mode=P.PYDNN_LAYER_NORM, skip=(), extra=None):
        o = B.backend_create_descriptor(P.PYDNN_BACKEND_OPERATION_NORM_BACKWARD_DESCRIPTOR)
        B.backend_set_attribute(o, P.PYDNN_ATTR_OPERATION_NORM_BWD_MODE, P.PYDNN_TYPE_NORM_MODE, 1, [mode])
        ts = dict(XDESC=_t((4, 32), BF16), DYDESC=_t((4, 32), BF16), DXDESC=_t((4, 32), BF16), SCALE_DESC=_t((1, 32)),
                  DSCALE_DESC=_t((1, 32)), DBIAS_DESC=_t((1, 32)), MEAN_DESC=_t((4, 1)), INV_VARIANCE_DESC=_t((4, 1)))
        ts.update(extra or {})
        for k, v in ts.items():
            if k not in skip:
                B.backend_set_attribute(o, getattr(P, "PYDNN_ATTR_OPERATION_NORM_BWD_" + k), DESC, 1, [v])
        return o

    o = op()
    B.backend_finalize(o)
    assert o.state.kind == "norm_bwd" and set(o.state.outputs) == {"dx", "dscale", "dbias"}
    _raises(BAD, "needs PYDNN_ATTR_OPERATION_NORM_BWD_DSCALE_DESC", B.backend_finalize, op(skip=("DSCALE_DESC",)))
    _raises(BAD, "needs PYDNN_ATTR_OPERATION_NORM_BWD_MEAN_DESC", B.backend_finalize, op(skip=("MEAN_DESC",)))
    _raises(BAD, "PYDNN_ATTR_OPERATION_NORM_BWD_DXDESC dims [4, 16]", B.backend_finalize,
            op(extra=dict(DXDESC=_t((4, 16), BF16))))
    _raises(BAD, "PYDNN_ATTR_OPERATION_NORM_BWD_DSCALE_DESC dims [1, 16]", B.backend_finalize,
            op(extra=dict(DSCALE_DESC=_t((1, 16)))))
    o = op(P.PYDNN_RMS_NORM, skip=("MEAN_DESC",))
    B.backend_finalize(o)
    assert "mean" not in o.state.inputs


def _ln_epilogue(io=BF16, rms=False, phase=P.PYDNN_NORM_FWD_TRAINING, dims=(4, 16, 256), eps=1e-5):
    n, s, d = dims
    g = Graph(io_data_type=io, handle=cpu_handle())
    x = g.tensor(name="x", dim=[n, s, d])
    sc = g.tensor(name="scale", dim=[1, 1, d], data_type=F32)
    b = g.tensor(name="bias", dim=[1, 1, d], data_type=F32)
    if rms:
        y, inv = g.rmsnorm(x, sc, eps, norm_forward_phase=phase)
        stats = [inv]
    else:
        y, mean, inv = g.layernorm(x, sc, b, eps, norm_forward_phase=phase)
        stats = [mean, inv]
    for t in stats:
        if t is not None:
            t.set_output(True)
    s2 = g.tensor(name="s2", dim=[1, 1, d])
    b2 = g.tensor(name="b2", dim=[1, 1, d])
    out = g.gelu(g.add(g.mul(y, s2), b2), name="out").set_output(True)
    return g, (x, sc, b, s2, b2, out, y, stats)


def test_frontend_shapes():
    g, (x, sc, b, s2, b2, out, y, (mean, inv)) = _ln_epilogue()
    assert y.dim == [4, 16, 256] and mean.dim == [4, 16, 1] and inv.dim == [4, 16, 1] and y.virtual
    assert mean.data_type == F32 and out.dim == [4, 16, 256]
    g2 = Graph(handle=cpu_handle())
    x = g2.tensor(name="x", dim=[2, 6, 5, 5])
    p = g2.tensor(name="p", dim=[1, 6, 1, 1])
    y, mean, inv = g2.instancenorm(x, p, p, 1e-5)
    assert mean.dim == [2, 6, 1, 1]
    y, mean, inv, rm, rv = g2.batchnorm(x, p, p, 1e-5)
    assert mean.dim == [1, 6, 1, 1] and rm is None and rv is None
    y, _, inv = g2.layernorm(x, g2.tensor(name="q", dim=[1, 6, 5, 5]), None, 1e-5,
                             norm_forward_phase=P.PYDNN_NORM_FWD_INFERENCE)
    assert inv is None
    _raises(BAD, "scale dims [1, 5, 1, 1]", g2.layernorm, x, g2.tensor(name="r", dim=[1, 5, 1, 1]), None, 1e-5)
    _raises(BAD, "norm_forward_phase", g2.layernorm, x, g2.tensor(name="s", dim=[1, 6, 5, 5]), None, 1e-5,
            norm_forward_phase=7)
    _raises(BAD, "in_running_mean, in_running_var and momentum go together", g2.batchnorm, x, p, p, 1e-5,
            in_running_mean=p)
    dx, ds, db = g2.rmsnorm_backward(x, x, g2.tensor(name="t", dim=[1, 6, 5, 5]), g2.tensor(name="u", dim=[2, 1, 1, 1]))
    assert dx.dim == [2, 6, 5, 5] and ds.dim == [1, 6, 5, 5] and db is None


@pytest.mark.parametrize("io", [F32, BF16])
@pytest.mark.parametrize("rms", [False, True])
def test_norm_epilogue_fuses_into_one_launch(io, rms):
    g, _ = _ln_epilogue(io, rms)
    g.build_operation_graph().create_execution_plans([P.PYDNN_HEUR_MODE_A, P.PYDNN_HEUR_MODE_FALLBACK])
    assert g.engines() == [1, 0]
    g.build_plans()
    assert g.engine_index() == 1 and g.launches() == 1 and g.get_workspace_size() == 0
    step = g._plan_obj.built.steps[0]
    assert step.unit.name.startswith("graph.norm_")
    vec = 4 if io == F32 else 8
    assert step.kernels == [f"rows{vec}", "gen"], step.kernels  # contiguous rows of 256: fwd_rows (+ gen)
    g.build_plans(engine=0)  # the node engine: the norm call, then three pointwise kernels
    assert g.engine_index() == 0 and g.get_workspace_size() > 0


def test_norm_alone_and_instance_norm_run_on_the_node_engine():
    g = Graph(io_data_type=BF16, handle=cpu_handle())
    x = g.tensor(name="x", dim=[4, 64])
    sc = g.tensor(name="scale", dim=[1, 64], data_type=F32)
    y, mean, inv = g.layernorm(x, sc, sc, 1e-5)
    for t in (y, mean, inv):
        t.set_output(True)
    g.build_operation_graph().create_execution_plans([P.PYDNN_HEUR_MODE_A]).build_plans()
    assert g.engine_index() == 0
    g = Graph(io_data_type=F16, handle=cpu_handle())
    x = g.tensor(name="x", dim=[2, 8, 4, 4])
    p = g.tensor(name="p", dim=[1, 8, 1, 1], data_type=F32)
    y, mean, inv = g.instancenorm(x, p, p, 1e-5)
    out = g.relu(y).set_output(True)
    mean.set_output(True)
    inv.set_output(True)
    g.build_operation_graph().create_execution_plans([P.PYDNN_HEUR_MODE_A])
    assert g.engines() == [0]
    g.build_plans()
    assert out.dim == [2, 8, 4, 4]


def test_not_supported_reasons():
    g = Graph(io_data_type=BF16, handle=cpu_handle())
    x = g.tensor(name="x", dim=[4, 64])
    sc = g.tensor(name="scale", dim=[1, 64])  # bf16 scale: pydnn's kernels read float32 parameters
    y, mean, inv = g.layernorm(x, sc, None, 1e-5)
    for t in (y, mean, inv):
        t.set_output(True)
    g.build_operation_graph().create_execution_plans([P.PYDNN_HEUR_MODE_A])
    _raises(NS, "scale (uid", g.check_support)


def test_serialize_keeps_the_epsilon_constant():
    g, _ = _ln_epilogue(eps=3e-4)
    g.build_operation_graph().create_execution_plans([P.PYDNN_HEUR_MODE_A]).build_plans()
    blob = g.serialize()
    g2 = Graph.deserialize(cpu_handle(), blob)
    assert list(g2._consts.values()) == [3e-4] and g2.engine_index() == 1 and g2.launches() == 1
    j = json.loads(blob)
    j["consts"] = {"1": "x"}
    _raises(BAD, "constants", Graph.deserialize, cpu_handle(), json.dumps(j).encode())


def test_host_scalar():
    import ctypes

    import numpy as np

    from pydnn.graph.plans import host_scalar

    v = ctypes.c_float(0.125)
    assert host_scalar(ctypes.addressof(v), F32, "eps") == 0.125
    d = ctypes.c_double(2.5)
    assert host_scalar(ctypes.addressof(d), P.PYDNN_DATA_DOUBLE, "eps") == 2.5
    assert host_scalar(np.array([[1e-3]], np.float32), F32, "eps") == pytest.approx(1e-3)
    assert host_scalar(1e-5, F32, "eps") == 1e-5
    _raises(BAD, "one element", host_scalar, np.zeros(2), F32, "eps")
    _raises(P.PYDNN_STATUS_BAD_PARAM_NULL_POINTER, "NULL", host_scalar, 0, F32, "eps")
    _raises(BAD, "bool", host_scalar, True, F32, "eps")


def test_python_int_for_a_by_value_tensor_is_its_value():
    """Graph.execute takes a Python int for a pass-by-value tensor as the value (from C it is an address)."""
    g = Graph(io_data_type=F16, handle=cpu_handle())
    x = g.tensor(name="x", dim=[2, 16, 9, 9])
    w = g.tensor(name="w", dim=[24, 16, 3, 3])
    b = g.tensor(name="b", dim=[1, 24, 1, 1])
    s = g.tensor(name="s", dim=[1, 1, 1, 1], data_type=F32, is_pass_by_value=True)
    g.relu(g.add(g.mul(g.conv_fprop(x, w, padding=[1, 1]), s), b)).set_output(True)
    g.build_operation_graph().create_execution_plans().build_plans()
    _fake_execute(g, dict(s=2))  # reaches the kernel lookup: 2 was read as 2.0, not dereferenced


def test_flat_stride():
    assert NN._flat_stride([4, 16], [16 * 256, 256]) == 256
    assert NN._flat_stride([4, 16], [0, 0]) == 0
    assert NN._flat_stride([4, 16], [16, 1]) == 1
    assert NN._flat_stride([4, 16], [0, 1]) is None  # broadcast over one leading dim only: not one run
    assert NN._flat_stride([1, 16], [999, 2]) == 2


def test_epilogue_strides_of_operands():
    """Per-feature, per-row, full and scalar operands: (row stride, feature stride)."""
    g = Graph(io_data_type=BF16, handle=cpu_handle())
    x = g.tensor(name="x", dim=[2, 3, 64])
    sc = g.tensor(name="scale", dim=[1, 1, 64], data_type=F32)
    y, _, _ = g.layernorm(x, sc, None, 1e-5, norm_forward_phase=P.PYDNN_NORM_FWD_INFERENCE)
    feat, row = g.tensor(name="f", dim=[1, 1, 64]), g.tensor(name="r", dim=[2, 3, 1])
    full, one = g.tensor(name="full", dim=[2, 3, 64]), g.tensor(name="one", dim=[1, 1, 1])
    v = g.add(g.mul(g.mul(g.add(y, feat), row), full), one).set_output(True)
    g.build_operation_graph().create_execution_plans([P.PYDNN_HEUR_MODE_A])
    an = NN.NormFuser().analyze(g._opgraph.state)
    assert not isinstance(an, str), an
    by = dict(zip(an["eops"], an["strides"]))
    assert by[feat.uid] == [0, 1] and by[row.uid] == [1, 0] and by[full.uid] == [64, 1] and by[one.uid] == [0, 0]
    assert v.dim == [2, 3, 64]
    # an operand broadcast over only one of the leading dims cannot be walked per row
    g = Graph(io_data_type=BF16, handle=cpu_handle())
    x = g.tensor(name="x", dim=[2, 3, 64])
    sc = g.tensor(name="scale", dim=[1, 1, 64], data_type=F32)
    y, _, _ = g.layernorm(x, sc, None, 1e-5, norm_forward_phase=P.PYDNN_NORM_FWD_INFERENCE)
    g.add(y, g.tensor(name="bad", dim=[1, 3, 64])).set_output(True)
    g.build_operation_graph().create_execution_plans([P.PYDNN_HEUR_MODE_A])
    assert "does not walk rows" in NN.NormFuser().analyze(g._opgraph.state)
    assert g.engines() == [0]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("tag", ["f32", "f16", "bf16"])
def test_generated_norm_epilogue_compiles(arch, tag, tmp_path, monkeypatch):
    """NVRTC compiles gen_fwd_body with a generated epilogue (bias add from a bf16 operand, GELU, a
    residual from an f16 operand, the pre-activation stored as a float output) for each data type."""
    from pydnn._build import build

    monkeypatch.setenv("PYDNN_CACHE_DIR", str(tmp_path))
    prog = cg.PwProgram([("bf16", "in"), ("f16", "in"), ("f32", "out")],
                        [cg.PwNode(P.PYDNN_POINTWISE_ADD, x=("acc", 0), b=("op", 0)),
                         cg.PwNode(P.PYDNN_POINTWISE_GELU_FWD, x=("v", 0)),
                         cg.PwNode(P.PYDNN_POINTWISE_ADD, x=("v", 1), b=("op", 1))], [(0, 2)])
    from pydnn.ops import normalization as N
    from pydnn.ops._elementwise import vec_width

    items, r, one = N.ROWS_PICK[tag]
    rows = (items, r, one, (vec_width(tag, tag),))
    kinds = (1, 0, 2)  # a contiguous bf16 run (16-byte loads where aligned), one f16 value a row, a strided output
    unit, exprs = NN.epilogue_unit(prog, ("v", 2), tag, rows, kinds)
    cubin, lowered = build.compile_unit(unit, arch)
    assert cubin[:4] == b"\x7fELF" and set(lowered) == set(exprs.values())
    assert set(exprs) == {"gen", f"rows{vec_width(tag, tag)}"}
    _, text, _ = NN.epilogue_source(prog, ("v", 2), tag, rows, kinds)
    assert "return v2;" in text and "gen_fwd_body" in text and "fwd_rows_body" in text and "e.ptr[2]" in text
    assert "epi_run<bf16_t, V, 1>(e.ptr[0]" in text and "epi_run<half_t, V, 0>(e.ptr[1]" in text
    assert NN.col_kinds([[256, 1], [1, 0], [0, 0], [512, 2]]) == (1, 0, 0, 2)


def test_backward_and_batchnorm_graphs_build():
    """The GPU tests' graphs build on the CPU: layer / RMS / instance norm backward (the node engine,
    a workspace for the dscale / dbias partials), batch norm training with running statistics (epsilon and
    momentum pass-by-value tensors), batch norm inference (one generated pointwise kernel), backward."""
    h = cpu_handle()
    for mode in ("layer", "rms", "instance"):
        g = Graph(io_data_type=BF16, handle=h)
        xd = [3, 8, 6, 5]
        sd = [1, 8, 1, 1] if mode == "instance" else [1, 8, 6, 5]
        dy, x = g.tensor(name="dy", dim=xd), g.tensor(name="x", dim=xd)
        sc = g.tensor(name="scale", dim=sd, data_type=F32)
        st = [3, 8, 1, 1] if mode == "instance" else [3, 1, 1, 1]
        inv, mean = g.tensor(name="inv", dim=st, data_type=F32), g.tensor(name="mean", dim=st, data_type=F32)
        if mode == "rms":
            outs = g.rmsnorm_backward(dy, x, sc, inv, has_dbias=True)
        else:
            outs = getattr(g, f"{mode}norm_backward")(dy, x, sc, mean, inv)
        for o in outs:
            o.set_output(True)
        g.build_operation_graph().create_execution_plans([P.PYDNN_HEUR_MODE_A]).check_support().build_plans()
        assert g.engine_index() == 0 and g.get_workspace_size() > 0, mode
    g = Graph(io_data_type=F16, handle=h)
    x = g.tensor(name="x", dim=[4, 12, 7, 5])
    p = [g.tensor(name=k, dim=[1, 12, 1, 1], data_type=F32) for k in ("scale", "bias", "rm", "rv")]
    eps = g.tensor(name="eps", dim=[1, 1, 1, 1], data_type=F32, is_pass_by_value=True)
    mom = g.tensor(name="mom", dim=[1, 1, 1, 1], data_type=F32, is_pass_by_value=True)
    outs = g.batchnorm(x, p[0], p[1], eps, in_running_mean=p[2], in_running_var=p[3], momentum=mom)
    for o in outs:
        o.set_output(True)
    g.build_operation_graph().create_execution_plans([P.PYDNN_HEUR_MODE_A, P.PYDNN_HEUR_MODE_FALLBACK])
    assert g.engines() == [0]
    g.build_plans()
    blob = g.serialize()
    assert Graph.deserialize(h, blob).engine_index() == 0
    gi = Graph(io_data_type=F16, handle=h)
    xi = gi.tensor(name="x", dim=[4, 12, 7, 5])
    q = [gi.tensor(name=k, dim=[1, 12, 1, 1], data_type=F32) for k in ("mean", "inv", "scale", "bias")]
    gi.batchnorm_inference(xi, *q).set_output(True)
    gi.build_operation_graph().create_execution_plans([P.PYDNN_HEUR_MODE_A]).check_support().build_plans()
    assert gi.launches() == 1
    gb = Graph(io_data_type=F16, handle=h)
    dy, xb = gb.tensor(name="dy", dim=[4, 12, 7, 5]), gb.tensor(name="x", dim=[4, 12, 7, 5])
    q = [gb.tensor(name=k, dim=[1, 12, 1, 1], data_type=F32) for k in ("scale", "mean", "inv")]
    for o in gb.batchnorm_backward(dy, xb, *q):
        o.set_output(True)
    gb.build_operation_graph().create_execution_plans([P.PYDNN_HEUR_MODE_A]).check_support().build_plans()


@pytest.mark.parametrize("scale", ["scalar", "per_channel", "device_scalar", "none"])
def test_conv_scale_bias_relu_plans(scale):
    """conv * s + b + z -> relu: a by-value scalar s is one convolution kernel (alpha1), a per-channel or
    device s the convolution plus one generated epilogue kernel, no s the engine's own mapping."""
    g = Graph(io_data_type=F16, handle=cpu_handle())
    x, w = g.tensor(name="x", dim=[2, 16, 9, 9]), g.tensor(name="w", dim=[24, 16, 3, 3])
    b, z = g.tensor(name="b", dim=[1, 24, 1, 1]), g.tensor(name="z", dim=[2, 24, 9, 9])
    v = g.conv_fprop(x, w, padding=[1, 1])
    if scale == "scalar":
        v = g.mul(v, g.tensor(name="s", dim=[1, 1, 1, 1], data_type=F32, is_pass_by_value=True))
    elif scale == "per_channel":
        v = g.mul(v, g.tensor(name="s", dim=[1, 24, 1, 1]))
    elif scale == "device_scalar":
        v = g.mul(v, g.tensor(name="s", dim=[1, 1, 1, 1]))
    g.relu(g.add(g.add(v, b), z)).set_output(True)
    g.build_operation_graph().create_execution_plans([P.PYDNN_HEUR_MODE_A, P.PYDNN_HEUR_MODE_FALLBACK])
    assert g.engines() == ([1] if scale == "scalar" else [1, 0])
    g.build_plans()
    steps = [type(s).__name__ for s in g._plan_obj.built.steps]
    assert g.engine_index() == 1
    assert steps == (["ConvStep", "PwStep"] if scale in ("per_channel", "device_scalar") else
                     ["ScaledConvBiasActStep"] if scale == "scalar" else ["ConvBiasActStep"])
    if len(steps) == 2:
        assert g.get_workspace_size() >= 2 * 24 * 81 * 2


def test_conv_scale_after_bias_is_two_kernels():
    g = Graph(io_data_type=F16, handle=cpu_handle())
    x, w = g.tensor(name="x", dim=[2, 16, 9, 9]), g.tensor(name="w", dim=[24, 16, 3, 3])
    b = g.tensor(name="b", dim=[1, 24, 1, 1])
    s = g.tensor(name="s", dim=[1, 1, 1, 1], data_type=F32, is_pass_by_value=True)
    g.relu(g.mul(g.add(g.conv_fprop(x, w, padding=[1, 1]), b), s)).set_output(True)
    g.build_operation_graph().create_execution_plans([P.PYDNN_HEUR_MODE_A])
    # a by-value scale after the bias add: not the convolution kernel's form, and the generated epilogue
    # reads device tensors only
    _raises(NS, "a scale after the bias", g.check_support)


# ----------------------------------------------------------------------------- sdpa

def _sdpa_graph(io=BF16, d=64, **kw):
    g = Graph(io_data_type=io, handle=cpu_handle())
    q = g.tensor(name="q", dim=[2, 4, 100, d])
    k, v = g.tensor(name="k", dim=[2, 2, 90, d]), g.tensor(name="v", dim=[2, 2, 90, d])
    o, st = g.sdpa(q, k, v, **kw)
    o.set_output(True)
    if st is not None:
        st.set_output(True)
    return g, (q, k, v, o, st)


def test_sdpa_builds_on_the_fused_attention():
    g, (q, k, v, o, st) = _sdpa_graph(attn_scale=0.125, use_causal_mask=True)
    assert o.dim == [2, 4, 100, 64] and st.dim == [2, 4, 100, 1] and st.data_type == F32
    g.build_operation_graph().create_execution_plans([P.PYDNN_HEUR_MODE_A, P.PYDNN_HEUR_MODE_FALLBACK])
    assert g.engines() == [0]
    g.build_plans()
    assert g.launches() == 1 and g.get_workspace_size() == 0
    step = g._plan_obj.built.steps[0]
    assert P.get_attention_descriptor(step.attn)[:5] == (4, 2, 64, 1.0, P.PYDNN_ATTN_MASK_CAUSAL_TOP_LEFT)
    g2 = Graph.deserialize(cpu_handle(), g.serialize())
    assert list(g2._consts.values()) == [0.125]
    g, (_, _, _, o, st) = _sdpa_graph(is_inference=True, use_causal_mask_bottom_right=True)
    assert st is None
    g.build_operation_graph().create_execution_plans().build_plans()
    assert g._opgraph.state.ops[0].params["mask"] == P.PYDNN_ATTN_MASK_CAUSAL_BOTTOM_RIGHT


def test_sdpa_backward_builds():
    g = Graph(io_data_type=F16, handle=cpu_handle())
    q, o, do = (g.tensor(name=n, dim=[2, 4, 100, 128]) for n in ("q", "o", "do"))
    k, v = g.tensor(name="k", dim=[2, 1, 90, 128]), g.tensor(name="v", dim=[2, 1, 90, 128])
    st = g.tensor(name="st", dim=[2, 4, 100, 1], data_type=F32)
    dq, dk, dv = g.sdpa_backward(q, k, v, o, do, st, attn_scale=0.1, dropout=(0.1, 1234, 0),
                                 use_deterministic_algorithm=True)
    for t in (dq, dk, dv):
        t.set_output(True)
    assert dk.dim == [2, 1, 90, 128]
    g.build_operation_graph().create_execution_plans().check_support().build_plans()
    p = g._opgraph.state.ops[0].params
    assert (p["dropout"], p["seed"], p["deterministic"]) == (0.1, 1234, True)
    assert g.get_workspace_size() > 0


def test_sdpa_validation():
    g = Graph(io_data_type=BF16, handle=cpu_handle())
    q = g.tensor(name="q", dim=[2, 4, 100, 64])
    k, v = g.tensor(name="k", dim=[2, 3, 90, 64]), g.tensor(name="v", dim=[2, 3, 90, 64])
    o, st = g.sdpa(q, k, v)
    o.set_output(True)
    st.set_output(True)
    _raises(BAD, "not a multiple of K's 3", g.build_operation_graph)
    _raises(NS, "bias is not supported", g.sdpa, q, q, q, bias=q)
    _raises(NS, "sliding_window_length is not supported", g.sdpa, q, q, q, sliding_window_length=64)
    _raises(BAD, "unknown argument 'whatever'", g.sdpa, q, q, q, whatever=1)
    _raises(NS, "offset", g.sdpa, q, q, q, dropout=(0.1, 1, 5))
    _raises(BAD, "exclude each other", g.sdpa, q, q, q, use_causal_mask=True, use_causal_mask_bottom_right=True)
    # head dim 96 and fp32 are valid graphs no engine of pydnn runs
    g, _ = _sdpa_graph(d=96)
    g.build_operation_graph().create_execution_plans()
    _raises(NS, "head dim 96", g.check_support)
    g, _ = _sdpa_graph(io=F32)
    g.build_operation_graph().create_execution_plans()
    _raises(NS, "HALF and BFLOAT16", g.check_support)
    # the backend descriptor: the attribute named
    o = B.backend_create_descriptor(P.PYDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR)
    for n, dims in (("QDESC", (2, 4, 8, 64)), ("KDESC", (2, 4, 8, 64)), ("VDESC", (2, 4, 8, 32)),
                    ("ODESC", (2, 4, 8, 64))):
        B.backend_set_attribute(o, getattr(P, "PYDNN_ATTR_OPERATION_SDPA_FWD_" + n), DESC, 1, [_t(dims, BF16)])
    _raises(BAD, "PYDNN_ATTR_OPERATION_SDPA_FWD_VDESC dims [2, 4, 8, 32]", B.backend_finalize, o)
    o = B.backend_create_descriptor(P.PYDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR)
    _raises(BAD, "MASK_MODE", lambda: (B.backend_set_attribute(
        o, P.PYDNN_ATTR_OPERATION_SDPA_FWD_MASK_MODE, P.PYDNN_TYPE_INT64, 1, [7]), _fin_sdpa(o)))


def _fin_sdpa(o):
    for n in ("QDESC", "KDESC", "VDESC", "ODESC"):
        B.backend_set_attribute(o, getattr(P, "PYDNN_ATTR_OPERATION_SDPA_FWD_" + n), DESC, 1, [_t((1, 1, 8, 64), BF16)])
    B.backend_finalize(o)


def test_epilogue_reading_the_statistics_is_not_fused():
    g = Graph(io_data_type=BF16, handle=cpu_handle())
    x = g.tensor(name="x", dim=[4, 64])
    sc = g.tensor(name="scale", dim=[1, 64], data_type=F32)
    y, mean, inv = g.layernorm(x, sc, None, 1e-5)
    mean.set_output(True)
    inv.set_output(True)
    g.mul(y, inv).set_output(True)
    g.build_operation_graph().create_execution_plans([P.PYDNN_HEUR_MODE_A])
    assert "reads the norm's statistics" in NN.NormFuser().analyze(g._opgraph.state)


def _fake_execute(g, consts=None):
    """Execute with made-up aligned device addresses on the CPU-only handle: every argument check of the
    steps' pydnn calls passes and the first kernel lookup fails with NOT_INITIALIZED (nothing is launched)."""
    bufs = {}
    for i, t in enumerate(t for t in g.tensors if not t.virtual):
        if t.name in (consts or {}):
            bufs[t] = consts[t.name]
        elif not t.by_value:  # (by-value constants: the graph passes its own)
            bufs[t] = 0x100000000 + 0x1000000 * i
    ws = 0x900000000 if g.get_workspace_size() else 0
    _raises(P.PYDNN_STATUS_NOT_INITIALIZED, "no kernels", g.execute, bufs, ws)


@pytest.mark.parametrize("mode, xd, sd", [("layer", [4, 6, 5, 7], [1, 6, 5, 7]), ("layer", [5, 3, 96], [1, 1, 96]),
                                          ("rms", [5, 3, 96], [1, 1, 96]), ("instance", [3, 8, 6, 5], [1, 8, 1, 1])])
@pytest.mark.parametrize("io", [F32, BF16])
def test_norm_node_calls_pass_validation(mode, xd, sd, io):
    """The node engine's norm steps hand pydnn's normalization calls descriptors and pointers they accept
    (forward training with statistics, backward with its workspace)."""
    g = Graph(io_data_type=io, handle=cpu_handle())
    x = g.tensor(name="x", dim=xd)
    sc, b = g.tensor(name="scale", dim=sd, data_type=F32), g.tensor(name="bias", dim=sd, data_type=F32)
    if mode == "rms":
        outs = g.rmsnorm(x, sc, 1e-5, bias=b)
    else:
        outs = getattr(g, f"{mode}norm")(x, sc, b, 1e-5)
    for t in outs:
        t.set_output(True)
    g.build_operation_graph().create_execution_plans().check_support().build_plans()
    _fake_execute(g)
    gb = Graph(io_data_type=io, handle=cpu_handle())
    dy, xb, scb = gb.tensor(name="dy", dim=xd), gb.tensor(name="x", dim=xd), gb.tensor(name="s", dim=sd, data_type=F32)
    inv = gb.tensor(name="inv", dim=outs[-1].dim, data_type=F32)
    if mode == "rms":
        douts = gb.rmsnorm_backward(dy, xb, scb, inv, has_dbias=True)
    else:
        mean = gb.tensor(name="mean", dim=outs[-1].dim, data_type=F32)
        douts = getattr(gb, f"{mode}norm_backward")(dy, xb, scb, mean, inv)
    for t in douts:
        t.set_output(True)
    gb.build_operation_graph().create_execution_plans().check_support().build_plans()
    _fake_execute(gb)


def test_batchnorm_sdpa_conv_calls_pass_validation():
    """As above for batch norm (training with running statistics updated in place: the output running
    tensors at the input ones' addresses, so no copy is enqueued; inference; backward), sdpa and
    sdpa_backward, and conv * s + b -> relu with a scalar and with a per-channel s."""
    h = cpu_handle()
    g = Graph(io_data_type=F16, handle=h)
    x = g.tensor(name="x", dim=[4, 12, 7, 5])
    p = [g.tensor(name=k, dim=[1, 12, 1, 1], data_type=F32) for k in ("scale", "bias", "rm", "rv")]
    eps = g.tensor(name="eps", dim=[1, 1, 1, 1], data_type=F32, is_pass_by_value=True)
    mom = g.tensor(name="mom", dim=[1, 1, 1, 1], data_type=F32, is_pass_by_value=True)
    outs = g.batchnorm(x, p[0], p[1], eps, in_running_mean=p[2], in_running_var=p[3], momentum=mom)
    for o in outs:
        o.set_output(True)
    outs[3].set_name("nrm")
    outs[4].set_name("nrv")
    g.build_operation_graph().create_execution_plans().check_support().build_plans()
    _fake_execute(g, dict(eps=1e-3, mom=0.1, rm=0x700000000, nrm=0x700000000, rv=0x800000000, nrv=0x800000000))
    gb = Graph(io_data_type=F16, handle=h)
    dy, xb = gb.tensor(name="dy", dim=[4, 12, 7, 5]), gb.tensor(name="x", dim=[4, 12, 7, 5])
    q = [gb.tensor(name=k, dim=[1, 12, 1, 1], data_type=F32) for k in ("scale", "mean", "inv")]
    for o in gb.batchnorm_backward(dy, xb, *q):
        o.set_output(True)
    gb.build_operation_graph().create_execution_plans().check_support().build_plans()
    _fake_execute(gb)
    gi = Graph(io_data_type=F16, handle=h)
    xi = gi.tensor(name="x", dim=[4, 12, 7, 5])
    q = [gi.tensor(name=k, dim=[1, 12, 1, 1], data_type=F32) for k in ("mean", "inv", "scale", "bias")]
    gi.batchnorm_inference(xi, *q).set_output(True)
    gi.build_operation_graph().create_execution_plans().check_support().build_plans()
    _fake_execute(gi)

    for d in (64, 128):
        gs, _ = _sdpa_graph(io=F16, d=d, attn_scale=0.1, use_causal_mask=True)
        gs.build_operation_graph().create_execution_plans().check_support().build_plans()
        _fake_execute(gs)
    gs = Graph(io_data_type=BF16, handle=h)
    ts = [gs.tensor(name=n, dim=[2, 4, 100, 64]) for n in ("q", "o", "do")]
    kv = [gs.tensor(name=n, dim=[2, 2, 90, 64]) for n in ("k", "v")]
    st = gs.tensor(name="st", dim=[2, 4, 100, 1], data_type=F32)
    for o in gs.sdpa_backward(ts[0], kv[0], kv[1], ts[1], ts[2], st, attn_scale=0.125):
        o.set_output(True)
    gs.build_operation_graph().create_execution_plans().check_support().build_plans()
    _fake_execute(gs)

    for kind in ("scalar", "per_channel"):
        gc = Graph(io_data_type=F16, handle=h)
        x, w = gc.tensor(name="x", dim=[2, 16, 9, 9]), gc.tensor(name="w", dim=[24, 16, 3, 3])
        b = gc.tensor(name="b", dim=[1, 24, 1, 1])
        s = gc.tensor(name="s", dim=[1, 1, 1, 1], data_type=F32, is_pass_by_value=True) if kind == "scalar" else \
            gc.tensor(name="s", dim=[1, 24, 1, 1])
        gc.relu(gc.add(gc.mul(gc.conv_fprop(x, w, padding=[1, 1]), s), b)).set_output(True)
        gc.build_operation_graph().create_execution_plans().check_support().build_plans()
        _fake_execute(gc, dict(s=0.5) if kind == "scalar" else None)


def test_fused_norm_call_passes_validation():
    g, _ = _ln_epilogue(BF16)
    g.build_operation_graph().create_execution_plans().build_plans()
    assert g.engine_index() == 1
    _fake_execute(g)


def test_sdpa_padding_mask():
    g = Graph(io_data_type=BF16, handle=cpu_handle())
    q = g.tensor(name="q", dim=[2, 4, 100, 64])
    k, v = g.tensor(name="k", dim=[2, 2, 90, 64]), g.tensor(name="v", dim=[2, 2, 90, 64])
    lq = g.tensor(name="lq", dim=[2, 1, 1, 1], data_type=P.PYDNN_DATA_INT32)
    lkv = g.tensor(name="lkv", dim=[2, 1, 1, 1], data_type=P.PYDNN_DATA_INT32)
    _raises(BAD, "need use_padding_mask=True", g.sdpa, q, k, v, seq_len_q=lq)
    _raises(BAD, "needs seq_len_q and / or seq_len_kv", g.sdpa, q, k, v, use_padding_mask=True)
    o, st = g.sdpa(q, k, v, use_padding_mask=True, seq_len_q=lq, seq_len_kv=lkv)
    o.set_output(True)
    st.set_output(True)
    g.build_operation_graph().create_execution_plans().check_support().build_plans()
    assert set(g._opgraph.state.ops[0].inputs) == {"q", "k", "v", "seq_len_q", "seq_len_kv"}
    _fake_execute(g)
    g2 = Graph(io_data_type=BF16, handle=cpu_handle())
    q = g2.tensor(name="q", dim=[2, 4, 100, 64])
    k, v = g2.tensor(name="k", dim=[2, 2, 90, 64]), g2.tensor(name="v", dim=[2, 2, 90, 64])
    bad_len = g2.tensor(name="lq", dim=[2, 1, 1, 1], data_type=F32)
    o, st = g2.sdpa(q, k, v, use_padding_mask=True, seq_len_q=bad_len)
    o.set_output(True)
    st.set_output(True)
    _raises(BAD, "PYDNN_ATTR_OPERATION_SDPA_FWD_SEQ_LEN_QDESC data type 0 must be INT32", g2.build_operation_graph)


def test_tensor_like_host_scalar_is_by_value():
    """cudnn-frontend's convention: a one-element host tensor is a pass-by-value scalar."""
    import numpy as np

    class Cpu:  # a torch-like CPU tensor without torch
        def __init__(self, shape, dtype):
            self.shape, self.dtype, self.device = shape, dtype, "cpu"

        def stride(self):
            return [1] * len(self.shape)

    g = Graph(handle=cpu_handle())
    eps = g.tensor_like(Cpu((1, 1, 1, 1), "torch.float32"))
    assert eps.by_value and eps.data_type == F32 and eps.dim == [1, 1, 1, 1]
    assert not g.tensor_like(np.zeros((2, 3), np.float16)).by_value
    assert g.tensor_like(np.zeros((4, 1, 1, 1), np.int32)).data_type == P.PYDNN_DATA_INT32


@pytest.mark.parametrize("io, d, kernels", [(BF16, 256, ["rows8", "gen"]), (F32, 250, ["gen"]),
                                            (F32, 256, ["rows4", "gen"])])
def test_norm_epilogue_kernel_choice(io, d, kernels):
    """fwd_rows (16-byte vectors) for rows of whole vectors, gen_fwd for the rest (and unaligned pointers)."""
    g = Graph(io_data_type=io, handle=cpu_handle())
    x = g.tensor(name="x", dim=[2, 9, d])
    sc = g.tensor(name="scale", dim=[1, 1, d], data_type=F32)
    y, _, _ = g.layernorm(x, sc, None, 1e-5, norm_forward_phase=P.PYDNN_NORM_FWD_INFERENCE)
    g.relu(g.add(g.mul(y, g.tensor(name="r", dim=[2, 9, 1])), g.tensor(name="res", dim=[2, 9, d]))).set_output(True)
    g.build_operation_graph().create_execution_plans([P.PYDNN_HEUR_MODE_A]).build_plans()
    step = g._plan_obj.built.steps[0]
    assert step.kernels == kernels and [a[0] for a in step.alts] == [k != "gen" for k in kernels]
