"""The backend API on the CPU: attribute checks (type, count, value, unknown attribute, get-only,
immutability after finalize, descriptors not finalized), tensor and operation finalize checks, operation
graph checks (uid clashes, virtual tensors, cycles), heuristics and engine support reasons, execution
plans built with a CPU-only handle (generated kernels compile with NVRTC), JSON round trips and corrupt /
version-mismatched JSON, variant packs and backend_execute's argument checks."""
import json

import pytest

import pydnn as P
from pydnn.graph import plans
from test_fuzz_cpu import cpu_handle

BAD, NS = P.PYDNN_STATUS_BAD_PARAM, P.PYDNN_STATUS_NOT_SUPPORTED
NOTFIN = P.PYDNN_STATUS_BAD_PARAM_NOT_FINALIZED
DESC, I64 = P.PYDNN_TYPE_BACKEND_DESCRIPTOR, P.PYDNN_TYPE_INT64


def _raises(status, needle, fn, *args):
    with pytest.raises(P.PydnnError) as e:
        fn(*args)
    assert e.value.status == status, e.value
    assert needle in str(e.value), e.value


def tensor(uid, dims, dtype=P.PYDNN_DATA_FLOAT, virtual=False, strides=None, finalize=True):
    if strides is None:
        strides, acc = [], 1
        for d in reversed(dims):
            strides.insert(0, acc)
            acc *= d
    t = P.backend_create_descriptor(P.PYDNN_BACKEND_TENSOR_DESCRIPTOR)
    P.backend_set_attribute(t, P.PYDNN_ATTR_TENSOR_DATA_TYPE, P.PYDNN_TYPE_DATA_TYPE, 1, [dtype])
    P.backend_set_attribute(t, P.PYDNN_ATTR_TENSOR_DIMENSIONS, I64, len(dims), dims)
    P.backend_set_attribute(t, P.PYDNN_ATTR_TENSOR_STRIDES, I64, len(strides), strides)
    P.backend_set_attribute(t, P.PYDNN_ATTR_TENSOR_UNIQUE_ID, I64, 1, [uid])
    P.backend_set_attribute(t, P.PYDNN_ATTR_TENSOR_BYTE_ALIGNMENT, I64, 1, [16])
    P.backend_set_attribute(t, P.PYDNN_ATTR_TENSOR_IS_VIRTUAL, P.PYDNN_TYPE_BOOLEAN, 1, [virtual])
    if finalize:
        P.backend_finalize(t)
    return t


def pwdesc(mode, **attrs):
    p = P.backend_create_descriptor(P.PYDNN_BACKEND_POINTWISE_DESCRIPTOR)
    P.backend_set_attribute(p, P.PYDNN_ATTR_POINTWISE_MODE, P.PYDNN_TYPE_POINTWISE_MODE, 1, [mode])
    P.backend_set_attribute(p, P.PYDNN_ATTR_POINTWISE_MATH_PREC, P.PYDNN_TYPE_DATA_TYPE, 1, [P.PYDNN_DATA_FLOAT])
    for k, v in attrs.items():
        P.backend_set_attribute(p, getattr(P, "PYDNN_ATTR_POINTWISE_" + k), P.PYDNN_TYPE_DOUBLE, 1, [v])
    P.backend_finalize(p)
    return p


def pwop(mode, x, y, b=None, t=None, finalize=True, **attrs):
    o = P.backend_create_descriptor(P.PYDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR)
    P.backend_set_attribute(o, P.PYDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, DESC, 1, [pwdesc(mode, **attrs)])
    P.backend_set_attribute(o, P.PYDNN_ATTR_OPERATION_POINTWISE_XDESC, DESC, 1, [x])
    if b is not None:
        P.backend_set_attribute(o, P.PYDNN_ATTR_OPERATION_POINTWISE_BDESC, DESC, 1, [b])
    if t is not None:
        P.backend_set_attribute(o, P.PYDNN_ATTR_OPERATION_POINTWISE_TDESC, DESC, 1, [t])
    P.backend_set_attribute(o, P.PYDNN_ATTR_OPERATION_POINTWISE_YDESC, DESC, 1, [y])
    if finalize:
        P.backend_finalize(o)
    return o


def opgraph(ops, handle=None):
    g = P.backend_create_descriptor(P.PYDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)
    P.backend_set_attribute(g, P.PYDNN_ATTR_OPERATIONGRAPH_HANDLE, P.PYDNN_TYPE_HANDLE, 1, [handle or cpu_handle()])
    P.backend_set_attribute(g, P.PYDNN_ATTR_OPERATIONGRAPH_OPS, DESC, len(ops), ops)
    P.backend_finalize(g)
    return g


def heur(g, mode=P.PYDNN_HEUR_MODE_INSTANT):
    h = P.backend_create_descriptor(P.PYDNN_BACKEND_ENGINEHEUR_DESCRIPTOR)
    P.backend_set_attribute(h, P.PYDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, DESC, 1, [g])
    P.backend_set_attribute(h, P.PYDNN_ATTR_ENGINEHEUR_MODE, P.PYDNN_TYPE_HEUR_MODE, 1, [mode])
    P.backend_finalize(h)
    n, _ = P.backend_get_attribute(h, P.PYDNN_ATTR_ENGINEHEUR_RESULTS, DESC, 0)
    return P.backend_get_attribute(h, P.PYDNN_ATTR_ENGINEHEUR_RESULTS, DESC, n)[1]


def plan(cfg, handle=None):
    p = P.backend_create_descriptor(P.PYDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)
    P.backend_set_attribute(p, P.PYDNN_ATTR_EXECUTION_PLAN_HANDLE, P.PYDNN_TYPE_HANDLE, 1, [handle or cpu_handle()])
    P.backend_set_attribute(p, P.PYDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, DESC, 1, [cfg])
    P.backend_finalize(p)
    return p


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("PYDNN_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "graphcache"))


# ----------------------------------------------------------------------------- attributes

def test_enum_values_are_cudnn9s():
    assert (P.PYDNN_BACKEND_POINTWISE_DESCRIPTOR, P.PYDNN_BACKEND_TENSOR_DESCRIPTOR,
            P.PYDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, P.PYDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR) == (0, 17, 19, 22)
    assert (P.PYDNN_ATTR_TENSOR_UNIQUE_ID, P.PYDNN_ATTR_OPERATION_MATMUL_ADESC, P.PYDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION,
            P.PYDNN_ATTR_VARIANT_PACK_WORKSPACE, P.PYDNN_ATTR_REDUCTION_OPERATOR) == (906, 1520, 405, 1003, 1600)
    assert (P.PYDNN_TYPE_BACKEND_DESCRIPTOR, P.PYDNN_TYPE_INT64, P.PYDNN_TYPE_CHAR) == (15, 3, 24)
    assert (P.PYDNN_POINTWISE_GELU_APPROX_TANH_FWD, P.PYDNN_POINTWISE_BINARY_SELECT, P.PYDNN_HEUR_MODE_A) == (107, 601, 3)


@pytest.mark.parametrize("call, status, needle", [
    (lambda t: P.backend_set_attribute(t, 99999, I64, 1, [1]), BAD, "attributeName: 99999"),
    (lambda t: P.backend_set_attribute(t, P.PYDNN_ATTR_MATMUL_COMP_TYPE, P.PYDNN_TYPE_DATA_TYPE, 1, [0]), BAD,
     "not an attribute of a TENSOR"),
    (lambda t: P.backend_set_attribute(t, P.PYDNN_ATTR_TENSOR_UNIQUE_ID, P.PYDNN_TYPE_FLOAT, 1, [1.0]), BAD,
     "takes PYDNN_TYPE_INT64, not PYDNN_TYPE_FLOAT"),
    (lambda t: P.backend_set_attribute(t, P.PYDNN_ATTR_TENSOR_UNIQUE_ID, I64, 2, [1, 2]), BAD, "elementCount"),
    (lambda t: P.backend_set_attribute(t, P.PYDNN_ATTR_TENSOR_DIMENSIONS, I64, 9, [1] * 9), BAD, "1 to 8"),
    (lambda t: P.backend_set_attribute(t, P.PYDNN_ATTR_TENSOR_DIMENSIONS, I64, 3, [1, 2]), BAD, "has 2 elements"),
    (lambda t: P.backend_set_attribute(t, P.PYDNN_ATTR_TENSOR_UNIQUE_ID, I64, 1, ["1"]), BAD, "expected an integer"),
    (lambda t: P.backend_set_attribute(t, P.PYDNN_ATTR_TENSOR_DATA_TYPE, P.PYDNN_TYPE_DATA_TYPE, 1, [77]), BAD,
     "not a pydnnDataType_t"),
    (lambda t: P.backend_set_attribute(t, P.PYDNN_ATTR_TENSOR_IS_VIRTUAL, P.PYDNN_TYPE_BOOLEAN, 1, [2]), BAD,
     "expected a boolean"),
    (lambda t: P.backend_set_attribute(t, P.PYDNN_ATTR_TENSOR_UNIQUE_ID, 555, 1, [1]), BAD, "attributeType"),
    (lambda t: P.backend_set_attribute(t, P.PYDNN_ATTR_TENSOR_UNIQUE_ID, I64, 1.0, [1]), BAD, "elementCount"),
    (lambda t: P.backend_get_attribute(t, P.PYDNN_ATTR_TENSOR_UNIQUE_ID, I64, -1), BAD, "requestedElementCount"),
    (lambda t: P.backend_set_attribute("x", P.PYDNN_ATTR_TENSOR_UNIQUE_ID, I64, 1, [1]), BAD, "not a live backend"),
])
def test_attribute_errors(call, status, needle):
    _raises(status, needle, call, tensor(1, [2, 3], finalize=False))


def test_get_returns_count_and_requested_elements():
    t = tensor(7, [2, 3, 4])
    assert P.backend_get_attribute(t, P.PYDNN_ATTR_TENSOR_DIMENSIONS, I64, 2) == (3, [2, 3])
    assert P.backend_get_attribute(t, P.PYDNN_ATTR_TENSOR_STRIDES, I64, 8) == (3, [12, 4, 1])
    assert P.backend_get_attribute(t, P.PYDNN_ATTR_TENSOR_UNIQUE_ID, I64, 1) == (1, [7])
    _raises(BAD, "never set", P.backend_get_attribute, t, P.PYDNN_ATTR_TENSOR_IS_BY_VALUE, P.PYDNN_TYPE_BOOLEAN, 1)
    _raises(BAD, "takes PYDNN_TYPE_INT64", P.backend_get_attribute, t, P.PYDNN_ATTR_TENSOR_UNIQUE_ID,
            P.PYDNN_TYPE_DOUBLE, 1)


def test_finalized_is_immutable_and_finalize_once():
    t = tensor(1, [2, 3])
    _raises(BAD, "finalized (immutable)", P.backend_set_attribute, t, P.PYDNN_ATTR_TENSOR_UNIQUE_ID, I64, 1, [2])
    _raises(BAD, "already finalized", P.backend_finalize, t)


def test_destroyed_descriptor_is_refused():
    t = tensor(1, [2, 3])
    P.backend_destroy_descriptor(t)
    P.backend_destroy_descriptor(None)
    _raises(BAD, "not a live backend descriptor", P.backend_get_attribute, t, P.PYDNN_ATTR_TENSOR_UNIQUE_ID, I64, 1)


def test_descriptor_types():
    _raises(BAD, "descriptorType", P.backend_create_descriptor, 1000)
    _raises(NS, "RESAMPLE", P.backend_create_descriptor, P.PYDNN_BACKEND_RESAMPLE_DESCRIPTOR)


@pytest.mark.parametrize("dims, strides, extra, needle", [
    ([2, 3], [3], {}, "2 dimensions but 1 strides"),
    ([2, 0], [3, 1], {}, "DIMENSIONS[1] = 0"),
    ([2, 3], [3, -1], {}, "STRIDES[1] = -1"),
    ([2, 3], [3, 1], {"TENSOR_BYTE_ALIGNMENT": 12}, "power of two"),
])
def test_tensor_finalize_errors(dims, strides, extra, needle):
    t = tensor(1, dims, strides=strides, finalize=False)
    for k, v in extra.items():
        P.backend_set_attribute(t, getattr(P, "PYDNN_ATTR_" + k), I64, 1, [v])
    _raises(BAD, needle, P.backend_finalize, t)


def test_required_attribute_missing():
    t = P.backend_create_descriptor(P.PYDNN_BACKEND_TENSOR_DESCRIPTOR)
    _raises(BAD, "needs PYDNN_ATTR_TENSOR_DATA_TYPE", P.backend_finalize, t)


def test_unfinalized_descriptor_as_element():
    x = tensor(1, [4], finalize=False)
    o = P.backend_create_descriptor(P.PYDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR)
    _raises(NOTFIN, "not finalized", P.backend_set_attribute, o, P.PYDNN_ATTR_OPERATION_POINTWISE_XDESC, DESC, 1, [x])
    _raises(BAD, "a POINTWISE descriptor, expected TENSOR", P.backend_set_attribute, o,
            P.PYDNN_ATTR_OPERATION_POINTWISE_XDESC, DESC, 1, [pwdesc(P.PYDNN_POINTWISE_ADD)])


def test_pointwise_op_checks():
    x, y = tensor(1, [2, 4]), tensor(2, [2, 4])
    _raises(BAD, "mode ADD needs PYDNN_ATTR_OPERATION_POINTWISE_BDESC", pwop, P.PYDNN_POINTWISE_ADD, x, y)
    _raises(BAD, "do not broadcast", lambda: pwop(P.PYDNN_POINTWISE_ADD, x, y, b=tensor(3, [3, 4])))
    _raises(BAD, "do not broadcast", lambda: pwop(P.PYDNN_POINTWISE_ADD, x, y, b=tensor(3, [4])))
    pwop(P.PYDNN_POINTWISE_ADD, x, y, b=tensor(3, [1, 4]))  # a broadcast row
    _raises(NS, "GEN_INDEX", pwdesc, P.PYDNN_POINTWISE_GEN_INDEX)


def test_matmul_op_checks():
    def mm(a, b, c):
        m = P.backend_create_descriptor(P.PYDNN_BACKEND_MATMUL_DESCRIPTOR)
        P.backend_set_attribute(m, P.PYDNN_ATTR_MATMUL_COMP_TYPE, P.PYDNN_TYPE_DATA_TYPE, 1, [P.PYDNN_DATA_FLOAT])
        P.backend_finalize(m)
        o = P.backend_create_descriptor(P.PYDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR)
        for n, t in zip("ABC", (a, b, c)):
            P.backend_set_attribute(o, getattr(P, f"PYDNN_ATTR_OPERATION_MATMUL_{n}DESC"), DESC, 1, [t])
        P.backend_set_attribute(o, P.PYDNN_ATTR_OPERATION_MATMUL_DESC, DESC, 1, [m])
        P.backend_finalize(o)
        return o

    mm(tensor(1, [2, 4, 8]), tensor(2, [1, 8, 6]), tensor(3, [2, 4, 6]))
    _raises(BAD, "B has 7 rows", mm, tensor(1, [4, 8]), tensor(2, [7, 6]), tensor(3, [4, 6]))
    _raises(BAD, "C dims", mm, tensor(1, [4, 8]), tensor(2, [8, 6]), tensor(3, [4, 5]))
    _raises(BAD, "batch dims", mm, tensor(1, [3, 4, 8]), tensor(2, [1, 8, 6]), tensor(3, [2, 4, 6]))
    _raises(BAD, "one rank", mm, tensor(1, [4, 8]), tensor(2, [1, 8, 6]), tensor(3, [4, 6]))


def test_operation_graph_checks():
    x, y = tensor(1, [8]), tensor(2, [8])
    v = tensor(3, [8], virtual=True)
    _raises(BAD, "virtual tensor uid 3 is written but never read", opgraph, [pwop(P.PYDNN_POINTWISE_RELU_FWD, x, v)])
    _raises(BAD, "virtual tensor uid 3 is read but no operation writes it", opgraph,
            [pwop(P.PYDNN_POINTWISE_RELU_FWD, v, y)])
    _raises(BAD, "uid 2 is written by two operations", opgraph,
            [pwop(P.PYDNN_POINTWISE_RELU_FWD, x, y), pwop(P.PYDNN_POINTWISE_EXP, x, y)])
    _raises(BAD, "names two different tensors", opgraph,
            [pwop(P.PYDNN_POINTWISE_RELU_FWD, x, y), pwop(P.PYDNN_POINTWISE_EXP, tensor(2, [4]), tensor(5, [4]))])
    a, b = tensor(10, [8], virtual=True), tensor(11, [8], virtual=True)
    _raises(BAD, "cycle", opgraph, [pwop(P.PYDNN_POINTWISE_ADD, a, b, b=x), pwop(P.PYDNN_POINTWISE_EXP, b, a)])
    g = opgraph([pwop(P.PYDNN_POINTWISE_RELU_FWD, x, v), pwop(P.PYDNN_POINTWISE_EXP, v, y)])
    assert P.backend_get_attribute(g, P.PYDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT, I64, 1) == (1, [2])


def _chain():
    """y = relu(x * s + b) -> exp, over 3 inputs, one virtual in between."""
    x, s, b, y = tensor(1, [4, 8, 16]), tensor(2, [1, 8, 1]), tensor(3, [1, 1, 16]), tensor(4, [4, 8, 16])
    v1, v2, v3 = (tensor(u, [4, 8, 16], virtual=True) for u in (5, 6, 7))
    return opgraph([pwop(P.PYDNN_POINTWISE_MUL, x, v1, b=s), pwop(P.PYDNN_POINTWISE_ADD, v1, v2, b=b),
                    pwop(P.PYDNN_POINTWISE_RELU_FWD, v2, v3, RELU_UPPER_CLIP=6.0),
                    pwop(P.PYDNN_POINTWISE_EXP, v3, y)])


def test_heuristics_fusion_first_fallback_nodes():
    g = _chain()
    engines = [c.state for c in heur(g)]
    assert engines == [1, 0]
    assert [c.state for c in heur(g, P.PYDNN_HEUR_MODE_FALLBACK)] == [0]


def test_fusion_plan_one_launch_no_workspace_and_json_roundtrip():
    g = _chain()
    cfg = heur(g)[0]
    p = plan(cfg)
    assert p.state.engine == 1 and p.state.built.launches == 1
    assert P.backend_get_attribute(p, P.PYDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, I64, 1) == (1, [0])
    n, text = P.backend_get_attribute(p, P.PYDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION, P.PYDNN_TYPE_CHAR, 1 << 20)
    assert n == len(text) and json.loads(text)["version"] == plans.VERSION
    q = P.backend_create_descriptor(P.PYDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)
    P.backend_set_attribute(q, P.PYDNN_ATTR_EXECUTION_PLAN_HANDLE, P.PYDNN_TYPE_HANDLE, 1, [cpu_handle()])
    P.backend_set_attribute(q, P.PYDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION, P.PYDNN_TYPE_CHAR, len(text), text)
    P.backend_finalize(q)
    assert q.state.to_json() == text
    assert q.state.built.steps[0].expr == p.state.built.steps[0].expr  # the same generated kernel


def test_node_plan_one_launch_per_op_with_workspace():
    p = plan(heur(_chain(), P.PYDNN_HEUR_MODE_FALLBACK)[0])
    assert p.state.engine == 0 and p.state.built.launches == 4
    ws = P.backend_get_attribute(p, P.PYDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, I64, 1)[1][0]
    assert ws >= 3 * 4 * 8 * 16 * 4
    assert P.backend_get_attribute(p, P.PYDNN_ATTR_EXECUTION_PLAN_COMPUTED_INTERMEDIATE_UIDS, I64, 8) == (3, [5, 6, 7])


@pytest.mark.parametrize("mutate, status, needle", [
    (lambda j: "{not json", BAD, "corrupt"),
    (lambda j: json.dumps(dict(j, version=99)), P.PYDNN_STATUS_SERIALIZATION_VERSION_MISMATCH, "version 99"),
    (lambda j: json.dumps(dict(j, format="x")), BAD, "not a pydnn execution plan"),
    (lambda j: json.dumps(dict(j, engine=7)), BAD, "corrupt"),
    (lambda j: json.dumps(dict(j, graph={"tensors": [], "ops": j["graph"]["ops"]})), BAD, "corrupt"),
    (lambda j: json.dumps({**j, "graph": {**j["graph"], "tensors": [dict(t, dims=[0] * len(t["dims"]))
                                                                     for t in j["graph"]["tensors"]]}}), BAD, "corrupt"),
    (lambda j: json.dumps([1, 2]), BAD, "not a pydnn"),
    (lambda j: json.dumps({**j, "graph": {**j["graph"], "ops": [dict(o, params=dict(o["params"], mode=9999))
                                                                 for o in j["graph"]["ops"]]}}), BAD, "corrupt"),
])
def test_corrupt_plan_json(mutate, status, needle):
    p = plan(heur(_chain())[0])
    j = json.loads(p.state.to_json())
    q = P.backend_create_descriptor(P.PYDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)
    P.backend_set_attribute(q, P.PYDNN_ATTR_EXECUTION_PLAN_HANDLE, P.PYDNN_TYPE_HANDLE, 1, [cpu_handle()])
    text = mutate(j)
    P.backend_set_attribute(q, P.PYDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION, P.PYDNN_TYPE_CHAR, len(text), text)
    _raises(status, needle, P.backend_finalize, q)


def test_engine_support_reasons():
    g = _chain()
    e = P.backend_create_descriptor(P.PYDNN_BACKEND_ENGINE_DESCRIPTOR)
    P.backend_set_attribute(e, P.PYDNN_ATTR_ENGINE_OPERATION_GRAPH, DESC, 1, [g])
    P.backend_set_attribute(e, P.PYDNN_ATTR_ENGINE_GLOBAL_INDEX, I64, 1, [5])
    _raises(BAD, "outside [0, 1]", P.backend_finalize, e)
    # a reduction is not fusable: engine 1 says why
    x, y = tensor(1, [4, 8]), tensor(2, [4, 1])
    r = P.backend_create_descriptor(P.PYDNN_BACKEND_REDUCTION_DESCRIPTOR)
    P.backend_set_attribute(r, P.PYDNN_ATTR_REDUCTION_OPERATOR, P.PYDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1,
                            [P.PYDNN_REDUCE_TENSOR_MAX])
    P.backend_set_attribute(r, P.PYDNN_ATTR_REDUCTION_COMP_TYPE, P.PYDNN_TYPE_DATA_TYPE, 1, [P.PYDNN_DATA_FLOAT])
    P.backend_finalize(r)
    o = P.backend_create_descriptor(P.PYDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR)
    P.backend_set_attribute(o, P.PYDNN_ATTR_OPERATION_REDUCTION_XDESC, DESC, 1, [x])
    P.backend_set_attribute(o, P.PYDNN_ATTR_OPERATION_REDUCTION_YDESC, DESC, 1, [y])
    P.backend_set_attribute(o, P.PYDNN_ATTR_OPERATION_REDUCTION_DESC, DESC, 1, [r])
    P.backend_finalize(o)
    g2 = opgraph([o])
    assert [c.state for c in heur(g2)] == [0]
    e = P.backend_create_descriptor(P.PYDNN_BACKEND_ENGINE_DESCRIPTOR)
    P.backend_set_attribute(e, P.PYDNN_ATTR_ENGINE_OPERATION_GRAPH, DESC, 1, [g2])
    P.backend_set_attribute(e, P.PYDNN_ATTR_ENGINE_GLOBAL_INDEX, I64, 1, [1])
    _raises(NS, "runtime fusion takes graphs of pointwise operations", P.backend_finalize, e)


def test_variant_pack_and_execute_checks():
    p = plan(heur(_chain())[0])
    vp = P.backend_create_descriptor(P.PYDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)
    P.backend_set_attribute(vp, P.PYDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, I64, 3, [1, 2, 3])
    P.backend_set_attribute(vp, P.PYDNN_ATTR_VARIANT_PACK_DATA_POINTERS, P.PYDNN_TYPE_VOID_PTR, 2, [1 << 20, 2 << 20])
    _raises(BAD, "3 unique ids but 2 data pointers", P.backend_finalize, vp)
    vp = P.backend_create_descriptor(P.PYDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)
    P.backend_set_attribute(vp, P.PYDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, I64, 2, [1, 1])
    P.backend_set_attribute(vp, P.PYDNN_ATTR_VARIANT_PACK_DATA_POINTERS, P.PYDNN_TYPE_VOID_PTR, 2, [1 << 20, 2 << 20])
    _raises(P.PYDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES, "twice", P.backend_finalize, vp)
    vp = P.backend_create_descriptor(P.PYDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)
    P.backend_set_attribute(vp, P.PYDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, I64, 3, [1, 2, 3])
    P.backend_set_attribute(vp, P.PYDNN_ATTR_VARIANT_PACK_DATA_POINTERS, P.PYDNN_TYPE_VOID_PTR, 3,
                            [1 << 20, 2 << 20, 3 << 20])
    P.backend_finalize(vp)
    _raises(BAD, "no data pointer for tensor uid 4", P.backend_execute, cpu_handle(), p, vp)
    _raises(P.PYDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE, "expected EXECUTION_PLAN", P.backend_execute, cpu_handle(), vp, vp)
    q = P.backend_create_descriptor(P.PYDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)
    _raises(NOTFIN, "not finalized", P.backend_execute, cpu_handle(), q, vp)


@pytest.mark.parametrize("seed", range(6))
def test_random_attributes_never_crash(seed):
    """Random attribute names, types, counts and values on every descriptor type: each call succeeds or
    raises PydnnError with a BAD_PARAM / NOT_SUPPORTED status, and finalize does the same (no other
    exception escapes)."""
    import random

    r = random.Random(seed)
    names = list(P.ENUMS["pydnnBackendAttributeName_t"].values()) + [-1, 5000]
    types = list(P.ENUMS["pydnnBackendAttributeType_t"].values()) + [99]
    junk = [0, 1, -1, 2**70, 1.5, "x", None, [], cpu_handle(), tensor(99, [2, 2])]
    kinds = [v for k, v in P.ENUMS["pydnnBackendDescriptorType_t"].items()]
    for _ in range(300):
        try:
            d = P.backend_create_descriptor(r.choice(kinds))
        except P.PydnnError as e:
            assert e.status in (BAD, NS)
            continue
        for _ in range(r.randint(0, 6)):
            n = r.randint(0, 3)
            try:
                P.backend_set_attribute(d, r.choice(names), r.choice(types), n, [r.choice(junk) for _ in range(n)])
            except P.PydnnError as e:
                assert e.status // 1000 * 1000 in (BAD, NS), e
        try:
            P.backend_finalize(d)
        except P.PydnnError as e:
            assert e.status // 1000 * 1000 in (BAD, NS), e
