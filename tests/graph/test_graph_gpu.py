"""The graph API on the GPU against float64 numpy (pydnn.reference.graph): the 8-op pointwise chain over 3
inputs on the fusion engine (one launch, counted) and on the node engine (8 launches), broadcasts, every
pointwise mode through a one-node graph, matmul + bias + GELU and matmul + bias + residual, a reduction
graph, matmul + bias + row reduction (every reduce op but the products) as ONE launch (counted), with and
without the reduced tensor stored, on the mma.sync and the wgmma tiles, the backend API with a variant
pack, and a deserialized plan giving bitwise the same output. Outputs
start poisoned (NaN bytes) and their gaps are checked untouched."""
import numpy as np
import pytest

import pydnn as P
from devtensor import DevTensor, assert_close
from pydnn._cuda import driver
from pydnn.graph import Graph
from pydnn.graph import pointwise_ops as pw
from pydnn.reference import graph as ref
from pydnn.reference.reduce import reduce as ref_reduce

pytestmark = pytest.mark.gpu
F32, F16, BF16 = P.PYDNN_DATA_FLOAT, P.PYDNN_DATA_HALF, P.PYDNN_DATA_BFLOAT16


class Launches:
    """Counts cuLaunchKernel calls made through pydnn's launch paths."""

    def __init__(self, monkeypatch):
        self.n = 0
        for name in ("launch_args", "launch"):
            orig = getattr(driver, name)

            def counted(*a, _orig=orig, **k):
                self.n += 1
                return _orig(*a, **k)
            monkeypatch.setattr(driver, name, counted)


def _ws(g):
    n = g.get_workspace_size()
    return P.DeviceArray((max(n, 1),), np.uint8) if n else None


def _chain_ref(x, s, b):
    v = ref.pointwise("MUL", x, s)
    v = ref.pointwise("ADD", v, b)
    v = ref.pointwise("GELU_FWD", v)
    v = ref.pointwise("MUL", v, x)
    v = ref.pointwise("SUB", v, b)
    v = ref.pointwise("RELU_FWD", v, upper=4.0)
    v = ref.pointwise("TANH_FWD", v)
    return ref.pointwise("ADD", v, x)


def _chain_graph(handle, io, dims=(8, 64, 130)):
    g = Graph(io_data_type=io, handle=handle)
    n, c, w = dims
    x = g.tensor(name="x", dim=[n, c, w])
    s = g.tensor(name="s", dim=[1, c, 1])
    b = g.tensor(name="b", dim=[1, 1, w])
    v = g.mul(x, s)
    v = g.add(v, b)
    v = g.gelu(v)
    v = g.mul(v, x)
    v = g.sub(v, b)
    v = g.relu(v, upper_clip=4.0)
    v = g.tanh(v)
    y = g.add(v, x, name="y").set_output(True)
    return g, (x, s, b, y)


@pytest.mark.parametrize("io", [F32, F16, BF16])
@pytest.mark.parametrize("mode, engine, launches", [(P.PYDNN_HEUR_MODE_A, 1, 1), (P.PYDNN_HEUR_MODE_FALLBACK, 0, 8)])
def test_chain8(handle, rng, monkeypatch, io, mode, engine, launches):
    g, (x, s, b, y) = _chain_graph(handle, io)
    g.build_operation_graph().create_execution_plans([mode]).check_support().build_plans()
    assert g.engine_index() == engine
    tx, ts, tb, ty = (DevTensor(t.dim, io) for t in (x, s, b, y))
    xv, sv, bv = tx.random(rng, -2, 2), ts.random(rng, -2, 2), tb.random(rng, -2, 2)
    ws = _ws(g)
    count = Launches(monkeypatch)
    g.execute({x: tx.ptr, s: ts.ptr, b: tb.ptr, y: ty.ptr}, ws.ptr if ws else 0, handle=handle)
    assert count.n == launches
    want = _chain_ref(xv, sv, bv)
    assert_close(ty.download(), want, io, f"chain8 engine {engine}", scale=np.abs(want) + np.abs(xv) + 1)
    ty.check_untouched()


FORMS = [dict(PW_SPLIT=False, PW_RUNS=1, PW_GRID=16), dict(PW_SPLIT=True, PW_RUNS=1, PW_GRID=0),
         dict(PW_SPLIT=True, PW_RUNS=2, PW_GRID=0), dict(PW_SPLIT=True, PW_RUNS=4, PW_GRID=16),
         dict(PW_SPLIT=True, PW_RUNS=4, PW_GRID=1, PW_MIN_BLOCKS=2)]


@pytest.mark.parametrize("form", range(len(FORMS)))
@pytest.mark.parametrize("io, xpad", [(BF16, 0), (F16, 4), (F32, 0), (BF16, 2)],
                         ids=["bf16", "f16-pad4", "f32", "bf16-pad2"])
def test_chain8_kernel_forms(handle, rng, monkeypatch, form, io, xpad):
    """The chain in each form of the generated kernel (pydnn.tuning.graph: one loop or split loops, 1 / 2 /
    4 runs a thread, one wave or a fixed grid of several iterations a thread, launch bounds), one launch,
    against float64; x with rows padded by xpad elements takes the element-by-element loop (its runs are
    not 16-byte aligned); the form with a grid of 1 block an SM runs on a handle that claims one SM, so the
    block's threads loop."""
    from pydnn import tuning

    for k, v in FORMS[form].items():
        monkeypatch.setattr(tuning.graph, k, v)
    if FORMS[form]["PW_GRID"] == 1:  # one block in all: its threads take 3 iterations each
        monkeypatch.setattr(handle, "sm_count", 1)
    dims = (3, 8, 1024)
    g, (x, s, b, y) = _chain_graph(handle, io, dims)
    n, c, w = dims
    if xpad:
        x.set_stride([c * (w + xpad), w + xpad, 1])
    g.build_operation_graph().create_execution_plans().build_plans()
    assert g.engine_index() == 1
    step = g._plan_obj.built.steps[0]
    assert step.runs == FORMS[form]["PW_RUNS"]
    tx = DevTensor(dims, io, x.stride) if xpad else DevTensor(dims, io)
    ts, tb, ty = (DevTensor(t.dim, io) for t in (s, b, y))
    xv, sv, bv = tx.random(rng, -2, 2), ts.random(rng, -2, 2), tb.random(rng, -2, 2)
    count = Launches(monkeypatch)
    g.execute({x: tx.ptr, s: ts.ptr, b: tb.ptr, y: ty.ptr}, 0, handle=handle)
    assert count.n == 1
    assert step.vec_static == (xpad == 0)
    if FORMS[form]["PW_GRID"] == 1:
        assert step.grid == (1, 1, 1)
    want = _chain_ref(xv, sv, bv)
    assert_close(ty.download(), want, io, f"chain8 form {FORMS[form]}", scale=np.abs(want) + np.abs(xv) + 1)
    ty.check_untouched()


def test_tanh_nonneg_is_tanhf_bitwise(handle):
    """tanh(relu(x, upper 9)) (generated with tanh_nonneg: the range is proven) against tanh(x) (tanhf) on
    float32 x in [-0, 9]: every float in [0.55, 0.65] (the branch point 0.6) and in [8.9, 9], 2^22 more
    spread over [0, 9], zeros and denormals; the two outputs bitwise the same."""
    def between(lo, hi):
        a, b = np.array([lo, hi], np.float32).view(np.int32)
        return np.arange(a, b + 1, dtype=np.int32).view(np.float32)

    xs = np.concatenate([between(0.55, 0.65), between(8.9, 9.0), np.linspace(0, 9, 1 << 22, dtype=np.float32),
                         np.array([0.0, -0.0, 1e-45, 1e-40, 1.17e-38, 1e-30, 1e-4], np.float32)])
    outs = []
    for ranged in (True, False):
        g = Graph(io_data_type=F32, handle=handle)
        x = g.tensor(name="x", dim=[1, xs.size])
        y = g.tanh(g.relu(x, upper_clip=9.0) if ranged else x, name="y").set_output(True)
        g.build_operation_graph().create_execution_plans().build_plans()
        assert g.engine_index() == 1
        text = __import__("pydnn._build.cache", fromlist=["x"])._source_memo[g._plan_obj.built.steps[0].unit.source][0]
        assert ("tanh_nonneg(" in text) == ranged
        tx, ty = DevTensor(x.dim, F32), DevTensor(y.dim, F32)
        tx.upload(xs.astype(np.float64)[None])
        g.execute({x: tx.ptr, y: ty.ptr}, 0, handle=handle)
        outs.append(ty.buf.to_numpy().view(np.uint32).copy())
    bad = np.nonzero(outs[0] != outs[1])[0]
    assert bad.size == 0, [(float(xs[i]), hex(outs[0][i]), hex(outs[1][i])) for i in bad[:8]]


def test_chain8_strided_output(handle, rng):
    """Output with padded strides and an input stored transposed (non-packed): one kernel still."""
    g = Graph(io_data_type=F32, handle=handle)
    x = g.tensor(name="x", dim=[6, 10], stride=[1, 6])  # column-major
    z = g.tensor(name="z", dim=[6, 10])
    y = g.sigmoid(g.add(x, z)).set_output(True).set_stride([16, 1])
    g.build_operation_graph().create_execution_plans().build_plans()
    tx, tz, ty = DevTensor([6, 10], F32, [1, 6]), DevTensor([6, 10], F32), DevTensor([6, 10], F32, [16, 1])
    xv, zv = tx.random(rng), tz.random(rng)
    g.execute({x: tx.ptr, z: tz.ptr, y: ty.ptr}, 0, handle=handle)
    assert_close(ty.download(), ref.pointwise("SIGMOID_FWD", xv + zv), F32, "strided")
    ty.check_untouched()


@pytest.mark.parametrize("name", sorted(pw.MODES))
def test_every_mode_one_node(handle, rng, name):
    mode = getattr(P, "PYDNN_POINTWISE_" + name)
    kind = pw.MODES[name][0]
    g = Graph(io_data_type=F32, handle=handle)
    dims = [3, 50]
    x = g.tensor(name="x", dim=dims)
    b = g.tensor(name="b", dim=dims) if kind != "x" else None
    t = g.tensor(name="t", dim=dims) if kind == "xbt" else None
    y = g.pointwise(mode, x, b, t).set_output(True)
    g.build_operation_graph().create_execution_plans().build_plans()
    tx, ty = DevTensor(dims, F32), DevTensor(dims, F32)
    lo, hi = (0.1, 3.0) if name in ("LOG", "SQRT", "RSQRT", "POW") else (-3.0, 3.0)
    xv = tx.random(rng, lo, hi) if not name.startswith(("CMP", "LOGICAL")) else tx.upload(rng.integers(-1, 2, dims) * 1.0)
    bufs, bv, tv = {x: tx.ptr, y: ty.ptr}, None, None
    if b is not None:
        tb = DevTensor(dims, F32)
        bv = tb.random(rng, 0.5, 2.0) if name in ("DIV", "MOD") else (
            tb.upload(rng.integers(-1, 2, dims) * 1.0) if name.startswith(("CMP", "LOGICAL")) else tb.random(rng))
        bufs[b] = tb.ptr
    if t is not None:
        tt = DevTensor(dims, F32)
        tv = tt.upload(rng.integers(0, 2, dims) * 1.0)
        bufs[t] = tt.ptr
    g.execute(bufs, 0, handle=handle)
    want = ref.pointwise(name, xv, bv, tv)
    got = ty.download()
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5, err_msg=name)


def _mm_graph(handle, io, m, n, k, residual=False, batch=1):
    g = Graph(io_data_type=io, handle=handle)
    a = g.tensor(name="a", dim=[batch, m, k])
    w = g.tensor(name="w", dim=[1, k, n])
    bias = g.tensor(name="bias", dim=[1, 1, n])
    v = g.add(g.matmul(a, w), bias)
    r = None
    if residual:
        r = g.tensor(name="r", dim=[batch, m, n])
        v = g.add(v, r)
    else:
        v = g.gelu(v)
    y = v.set_output(True)
    return g, (a, w, bias, r, y)


@pytest.mark.parametrize("io", [F16, BF16, F32])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("m, n, k, batch", [(128, 96, 64, 1), (77, 130, 40, 2), (512, 512, 512, 1), (33, 131, 64, 1)])
def test_matmul_epilogue(handle, rng, monkeypatch, io, residual, m, n, k, batch):
    g, (a, w, bias, r, y) = _mm_graph(handle, io, m, n, k, residual, batch)
    g.build_operation_graph().create_execution_plans().check_support().build_plans()
    ta, tw, tb, ty = (DevTensor(t.dim, io) for t in (a, w, bias, y))
    av, wv, bv = ta.random(rng, -1, 1), tw.random(rng, -1, 1), tb.random(rng, -1, 1)
    bufs = {a: ta.ptr, w: tw.ptr, bias: tb.ptr, y: ty.ptr}
    if residual:
        tr = DevTensor(r.dim, io)
        rv = tr.random(rng, -1, 1)
        bufs[r] = tr.ptr
    ws = _ws(g)
    count = Launches(monkeypatch)
    g.execute(bufs, ws.ptr if ws else 0, handle=handle)
    expected_launches = g.launches()
    assert count.n == expected_launches
    if g.engine_index() == 1:
        assert expected_launches == 1
    c = np.matmul(av, wv) + bv
    scale = np.matmul(np.abs(av), np.abs(wv)) + np.abs(bv)
    want = c + rv if residual else ref.pointwise("GELU_FWD", c)
    if residual:
        scale = scale + np.abs(rv)
    # the node engine stores the virtual matmul output in the io type: one more rounding of that type
    assert_close(ty.download(), want, io, f"matmul epilogue engine {g.engine_index()}", scale=2 * scale)
    ty.check_untouched()


@pytest.mark.parametrize("mode", [P.PYDNN_HEUR_MODE_A, P.PYDNN_HEUR_MODE_FALLBACK], ids=["fusion", "nodes"])
def test_reduction_graph(handle, rng, monkeypatch, mode):
    """exp then a max over the middle dim: the fusion engine's generated kernel + reduce_tensor
    (pydnn/graph/reduce_tail.py), or node by node."""
    g = Graph(io_data_type=F32, handle=handle)
    x = g.tensor(name="x", dim=[4, 8, 16])
    y = g.reduction(g.exp(x), P.PYDNN_REDUCE_TENSOR_MAX, dim=[4, 1, 16]).set_output(True)
    g.build_operation_graph().create_execution_plans([mode]).check_support().build_plans()
    assert g.engine_index() == (1 if mode == P.PYDNN_HEUR_MODE_A else 0)
    tx, ty = DevTensor([4, 8, 16], F32), DevTensor([4, 1, 16], F32)
    xv = tx.random(rng)
    ws = _ws(g)
    if ws:
        ws.fill_bytes(0xFF)
    count = Launches(monkeypatch)
    g.execute({x: tx.ptr, y: ty.ptr}, ws.ptr if ws else 0, handle=handle)
    assert count.n >= 2
    assert_close(ty.download(), np.exp(xv).max(axis=1, keepdims=True), F32, "exp + max")
    ty.check_untouched()


@pytest.mark.parametrize("op, m, n, k", [(P.PYDNN_REDUCE_TENSOR_ADD, 128, 96, 64), (P.PYDNN_REDUCE_TENSOR_MAX, 77, 130, 40)],
                         ids=["colsum", "colmax_odd"])
def test_matmul_column_reduction(handle, rng, monkeypatch, op, m, n, k):
    """gelu(x @ w + bias) reduced over its rows (a column reduction): the fused GEMM stores the bf16 result
    in the workspace, reduce_tensor reduces it (reduce_tail.py); the rounding to bf16 before the reduction
    is in the reference."""
    from pydnn.reference import dtypes as rd

    g = Graph(io_data_type=BF16, intermediate_data_type=F32, handle=handle)
    a, w = g.tensor(name="a", dim=[1, m, k]), g.tensor(name="w", dim=[1, k, n])
    bias = g.tensor(name="bias", dim=[1, 1, n])
    v = g.gelu(g.add(g.matmul(a, w), bias))
    y = g.reduction(v, op, dim=[1, 1, n]).set_output(True).set_name("y")
    g.build_operation_graph().create_execution_plans().check_support().build_plans()
    assert g.engine_index() == 1
    names = [type(s).__name__ for s in g._plan_obj.built.steps]
    assert names == ["FusedMatmulStep", "ReduceStep"]
    ta, tw, tb, ty = (DevTensor(t.dim, BF16) for t in (a, w, bias, y))
    av, wv, bv = ta.random(rng, -1, 1), tw.random(rng, -1, 1), tb.random(rng, -1, 1)
    ws = _ws(g)
    ws.fill_bytes(0xFF)
    count = Launches(monkeypatch)
    g.execute({a: ta.ptr, w: tw.ptr, bias: tb.ptr, y: ty.ptr}, ws.ptr, handle=handle)
    assert count.n >= 2
    c = ref.pointwise("GELU_FWD", np.matmul(av, wv) + bv)
    cs = rd.from_storage(rd.to_storage(c, BF16), BF16)  # stored by the GEMM as bf16
    term = np.matmul(np.abs(av), np.abs(wv)) + np.abs(bv)
    if op == P.PYDNN_REDUCE_TENSOR_ADD:
        want, scale = cs.sum(axis=1, keepdims=True), 2 * term.sum(axis=1, keepdims=True)
    else:
        want, scale = cs.max(axis=1, keepdims=True), 2 * term.max(axis=1, keepdims=True)
    assert_close(ty.download(), want, BF16, f"column reduction {op}", scale=scale)
    ty.check_untouched()


def test_backend_api_execute(handle, rng):
    g, (x, s, b, y) = _chain_graph(handle, F16, (2, 16, 33))
    g.build_operation_graph().create_execution_plans().build_plans()
    tx, ts, tb, ty = (DevTensor(t.dim, F16) for t in (x, s, b, y))
    xv, sv, bv = tx.random(rng, -2, 2), ts.random(rng, -2, 2), tb.random(rng, -2, 2)
    vp = P.backend_create_descriptor(P.PYDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)
    P.backend_set_attribute(vp, P.PYDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, P.PYDNN_TYPE_INT64, 4,
                            [x.uid, s.uid, b.uid, y.uid])
    P.backend_set_attribute(vp, P.PYDNN_ATTR_VARIANT_PACK_DATA_POINTERS, P.PYDNN_TYPE_VOID_PTR, 4,
                            [tx.ptr, ts.ptr, tb.ptr, ty.ptr])
    P.backend_set_attribute(vp, P.PYDNN_ATTR_VARIANT_PACK_WORKSPACE, P.PYDNN_TYPE_VOID_PTR, 1, [0])
    P.backend_finalize(vp)
    P.backend_execute(handle, g._plan, vp)
    want = _chain_ref(xv, sv, bv)
    assert_close(ty.download(), want, F16, "backend execute", scale=np.abs(want) + np.abs(xv) + 1)


def test_deserialized_plan_is_bitwise_identical(handle, rng):
    g, (x, s, b, y) = _chain_graph(handle, BF16)
    g.build_operation_graph().create_execution_plans().build_plans()
    g2 = Graph.deserialize(handle, g.serialize())
    tx, ts, tb, ty, ty2 = (DevTensor(t.dim, BF16) for t in (x, s, b, y, y))
    tx.random(rng), ts.random(rng), tb.random(rng)
    g.execute({x: tx.ptr, s: ts.ptr, b: tb.ptr, y: ty.ptr}, 0, handle=handle)
    g2.execute({"x": tx.ptr, "s": ts.ptr, "b": tb.ptr, "y": ty2.ptr}, 0, handle=handle)
    assert (ty.buf.to_numpy() == ty2.buf.to_numpy()).all()


def test_matmul_epilogue_large_tile(handle, rng, monkeypatch):
    """2048 x 2048 x 512 bf16: the chooser's big tile (gemm_wgmma's 128x256 on an sm_90 device) with the
    generated epilogue, one launch."""
    g, (a, w, bias, r, y) = _mm_graph(handle, BF16, 2048, 2048, 512)
    g.build_operation_graph().create_execution_plans().build_plans()
    assert g.engine_index() == 1
    ta, tw, tb, ty = (DevTensor(t.dim, BF16) for t in (a, w, bias, y))
    av, wv, bv = ta.random(rng, -1, 1), tw.random(rng, -1, 1), tb.random(rng, -1, 1)
    count = Launches(monkeypatch)
    g.execute({a: ta.ptr, w: tw.ptr, bias: tb.ptr, y: ty.ptr}, 0, handle=handle)
    assert count.n == 1
    c = (av[0] @ wv[0])[None] + bv
    assert_close(ty.download(), ref.pointwise("GELU_FWD", c), BF16, "wgmma epilogue",
                 scale=(np.abs(av[0]) @ np.abs(wv[0]))[None] + np.abs(bv))


@pytest.mark.parametrize("m, n, k, on_b, red", [(128, 96, 64, False, False), (77, 130, 40, True, False),
                                                (256, 256, 128, False, True), (512, 512, 256, True, False)],
                         ids=["a_only", "ab_odd", "a_rowmax", "ab_512"])
def test_matmul_prologue(handle, rng, monkeypatch, m, n, k, on_b, red):
    """gelu(relu(x * s) @ w' + bias), w' = tanh(w) + h when on_b (a prologue on B too), optionally with a
    row max of the result: the fusion engine runs one pointwise kernel per computed operand (into the
    workspace, rounded to bf16 as the GEMM reads it) and the fused GEMM; launches counted."""
    from pydnn.reference import dtypes as rd

    g = Graph(io_data_type=BF16, intermediate_data_type=F32, handle=handle)
    x = g.tensor(name="x", dim=[1, m, k])
    s = g.tensor(name="s", dim=[1, 1, k])
    w = g.tensor(name="w", dim=[1, k, n])
    h = g.tensor(name="h", dim=[1, 1, 1])
    bias = g.tensor(name="bias", dim=[1, 1, n])
    a = g.relu(g.mul(x, s))
    b = g.add(g.tanh(w), h) if on_b else w
    v = g.gelu(g.add(g.matmul(a, b), bias))
    if red:
        y = g.reduction(v, P.PYDNN_REDUCE_TENSOR_MAX, dim=[1, m, 1]).set_output(True).set_name("y")
    else:
        y = v.set_output(True).set_name("y")
    g.build_operation_graph().create_execution_plans().check_support().build_plans()
    assert g.engine_index() == 1 and g.launches() == 2 + on_b
    tx, ts, tw, th, tb, ty = (DevTensor(t.dim, BF16) for t in (x, s, w, h, bias, y))
    xv, sv, wv = tx.random(rng, -1, 1), ts.random(rng, -1, 1), tw.random(rng, -1, 1)
    hv, bv = th.random(rng, -0.5, 0.5), tb.random(rng, -1, 1)
    ws = _ws(g)
    assert ws is not None
    ws.fill_bytes(0xFF)
    bufs = {x: tx.ptr, s: ts.ptr, w: tw.ptr, bias: tb.ptr, y: ty.ptr}
    if on_b:
        bufs[h] = th.ptr
    count = Launches(monkeypatch)
    g.execute(bufs, ws.ptr, handle=handle)
    assert count.n == 2 + on_b
    av = rd.from_storage(rd.to_storage(np.maximum(xv * sv, 0.0), BF16), BF16)       # stored as the GEMM reads it
    bw = rd.from_storage(rd.to_storage(np.tanh(wv) + hv, BF16), BF16) if on_b else wv
    c = np.matmul(av, bw) + bv
    want = ref.pointwise("GELU_FWD", c)
    scale = np.matmul(np.abs(av), np.abs(bw)) + np.abs(bv)
    if red:
        want, scale = want.max(axis=-1, keepdims=True), scale.max(axis=-1, keepdims=True)
    # the operands may round the other way at a tie of the device's and numpy's float math: 2x the scale
    assert_close(ty.download(), want, BF16, f"prologue {m}x{n}x{k} on_b {on_b} red {red}", scale=2 * scale)
    ty.check_untouched()


def test_c_program(tmp_path):
    """tests/c/graph_gpu.c: a fused and a node-by-node plan built and run through the C backend API, and
    pydnnMatmul, against host math."""
    from cprog import build_and_run

    r = build_and_run("graph_gpu", tmp_path, extra=["-ldl", "-lm"])
    print(r.stdout, r.stderr)
    assert "FAIL" not in r.stdout and r.returncode == 0, r.stdout + r.stderr
    for what in ("relu(x + b) numbers (fusion engine)", "relu(x + b) numbers (node engine)", "matmul numbers"):
        assert any(line.startswith(f"ok {what}") for line in r.stdout.splitlines()), r.stdout + r.stderr


@pytest.mark.parametrize("io", [F32, F16])
@pytest.mark.parametrize("nhwc", [False, True])
@pytest.mark.parametrize("mode, engine", [(P.PYDNN_HEUR_MODE_A, 1), (P.PYDNN_HEUR_MODE_FALLBACK, 0)])
@pytest.mark.parametrize("residual", [False, True])
def test_conv_bias_relu(handle, rng, monkeypatch, io, nhwc, mode, engine, residual):
    """relu(conv(x, w) + b) (+ z before the ReLU, clipped at 6 then): engine 1 maps it onto
    convolution_bias_activation_forward (the epilogue in the convolution kernel), engine 0 runs the nodes."""
    from pydnn.reference import convolution as rc

    n, c, hw, k = 2, 16, 9, 24
    xs = [c * hw * hw, 1, hw * c, c] if nhwc else None
    ws = [c * 9, 1, 3 * c, c] if nhwc else None
    g = Graph(io_data_type=io, handle=handle)
    x = g.tensor(name="x", dim=[n, c, hw, hw], stride=xs)
    w = g.tensor(name="w", dim=[k, c, 3, 3], stride=ws)
    b = g.tensor(name="b", dim=[1, k, 1, 1])
    v = g.add(g.conv_fprop(x, w, padding=[1, 1], stride=[2, 2]), b)
    z = None
    if residual:
        z = g.tensor(name="z", dim=[n, k, 5, 5])
        v = g.relu(g.add(v, z), upper_clip=6.0)
    else:
        v = g.relu(v)
    y = v.set_output(True)
    g.build_operation_graph().create_execution_plans([mode]).check_support().build_plans()
    assert g.engine_index() == engine
    tx, tw = DevTensor(x.dim, io, x.stride), DevTensor(w.dim, io, w.stride)
    tb, ty = DevTensor(b.dim, io), DevTensor(y.dim, io, y.stride)
    xv, wv, bv = tx.random(rng, -1, 1), tw.random(rng, -1, 1), tb.random(rng, -1, 1)
    bufs = {x: tx.ptr, w: tw.ptr, b: tb.ptr, y: ty.ptr}
    conv = rc.forward_raw(xv, wv, [1, 1], [2, 2], [1, 1])
    scale = rc.forward_raw(np.abs(xv), np.abs(wv), [1, 1], [2, 2], [1, 1]) + np.abs(bv)
    pre = conv + bv
    if residual:
        tz = DevTensor(z.dim, io)
        zv = tz.random(rng, -1, 1)
        bufs[z] = tz.ptr
        pre, scale = pre + zv, scale + np.abs(zv)
    want = np.clip(pre, 0, 6) if residual else np.maximum(pre, 0)
    ws_buf = _ws(g)
    count = Launches(monkeypatch)
    g.execute(bufs, ws_buf.ptr if ws_buf else 0, handle=handle)
    if engine == 1:
        assert count.n <= 2, count.n  # the convolution kernel (+ a split-K fold where its plan has one)
        print("conv + epilogue launches:", count.n)
    assert_close(ty.download(), want, io, f"conv epilogue engine {engine}", scale=2 * scale)
    ty.check_untouched()


def test_conv_dgrad_wgrad(handle, rng):
    from pydnn.reference import convolution as rc

    g = Graph(io_data_type=F32, handle=handle)
    dy = g.tensor(name="dy", dim=[2, 8, 7, 7])
    w = g.tensor(name="w", dim=[8, 4, 3, 3])
    x = g.tensor(name="x", dim=[2, 4, 7, 7])
    dx = g.conv_dgrad(dy, w, padding=[1, 1], dim=[2, 4, 7, 7]).set_output(True)
    dw = g.conv_wgrad(x, dy, padding=[1, 1], dim=[8, 4, 3, 3]).set_output(True)
    g.build_operation_graph().create_execution_plans().check_support().build_plans()
    t = {v: DevTensor(v.dim, F32) for v in (dy, w, x, dx, dw)}
    dyv, wv, xv = t[dy].random(rng), t[w].random(rng), t[x].random(rng)
    ws_buf = _ws(g)
    g.execute({v: d.ptr for v, d in t.items()}, ws_buf.ptr if ws_buf else 0, handle=handle)
    want_dx = rc.backward_data_raw(wv, dyv, (7, 7), [1, 1], [1, 1], [1, 1])
    want_dw = rc.backward_filter_raw(xv, dyv, (3, 3), [1, 1], [1, 1], [1, 1])
    assert_close(t[dx].download(), want_dx, F32, "dgrad",
                 scale=rc.backward_data_raw(np.abs(wv), np.abs(dyv), (7, 7), [1, 1], [1, 1], [1, 1]))
    assert_close(t[dw].download(), want_dw, F32, "wgrad",
                 scale=rc.backward_filter_raw(np.abs(xv), np.abs(dyv), (3, 3), [1, 1], [1, 1], [1, 1]))


def test_readme_example_with_torch_tensors(handle):
    """The README's graph quick start (smaller), with torch tensors as buffers."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    x = torch.randn(256, 128, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(128, 192, device="cuda", dtype=torch.bfloat16) * 0.1
    b = torch.randn(192, device="cuda", dtype=torch.bfloat16)
    y = torch.full((256, 192), float("nan"), device="cuda", dtype=torch.bfloat16)
    g = Graph(io_data_type=BF16, handle=handle)
    tx, tw = g.tensor(name="x", dim=[256, 128]), g.tensor(name="w", dim=[128, 192])
    tb = g.tensor(name="b", dim=[1, 192])
    g.gelu(g.add(g.matmul(tx, tw), tb)).set_output(True).set_name("y")
    g.build_operation_graph().create_execution_plans().check_support().build_plans()
    assert g.engine_index() == 1
    torch.cuda.synchronize()
    g.execute({"x": x, "w": w, "b": b, "y": y}, workspace=0)
    torch.cuda.synchronize()
    want = torch.nn.functional.gelu(torch.addmm(b.float(), x.float(), w.float()))
    assert float((y.float() - want).abs().max()) <= 0.02 * float(want.abs().max())
    g2 = Graph.deserialize(handle, g.serialize())
    y2 = torch.empty_like(y)
    g2.execute({"x": x, "w": w, "b": b, "y": y2}, 0)
    torch.cuda.synchronize()
    assert torch.equal(y, y2)


RED_MODES = ["MAX", "MIN", "AMAX", "ADD", "AVG", "NORM1", "NORM2"]


@pytest.mark.parametrize("mode", RED_MODES)
@pytest.mark.parametrize("io, store_x, m, n, k, batch", [(BF16, False, 77, 300, 64, 2), (F16, True, 130, 520, 72, 1),
                                                         (BF16, True, 33, 131, 64, 1)])
def test_matmul_row_reduction_one_launch(handle, rng, monkeypatch, mode, io, store_x, m, n, k, batch):
    """matmul + bias -> row reduction (over n) as ONE launch of the fused GEMM: the reduction in its
    epilogue, partial rows combined by the last block of each row tile. With store_x the reduced tensor is
    also a graph output (the GEMM's store); without, it is virtual and never written. Run twice: the second
    launch finds the counters the first left at zero and gives bitwise the same rows."""
    op = getattr(P, "PYDNN_REDUCE_TENSOR_" + mode)
    g = Graph(io_data_type=io, intermediate_data_type=F32, compute_data_type=F32, handle=handle)
    a = g.tensor(name="a", dim=[batch, m, k])
    w = g.tensor(name="w", dim=[1, k, n])
    bias = g.tensor(name="bias", dim=[1, 1, n])
    v = g.add(g.matmul(a, w), bias)
    if store_x:
        v.set_output(True).set_name("x")
    y = g.reduction(v, op, dim=[batch, m, 1]).set_output(True).set_name("y")
    g.build_operation_graph().create_execution_plans().check_support().build_plans()
    assert g.engine_index() == 1 and g.launches() == 1
    ta, tw, tb, ty = (DevTensor(t.dim, io) for t in (a, w, bias, y))
    av, wv, bv = ta.random(rng, -1, 1), tw.random(rng, -1, 1), tb.random(rng, -1, 1)
    bufs = {a: ta.ptr, w: tw.ptr, bias: tb.ptr, y: ty.ptr}
    if store_x:
        tx = DevTensor(v.dim, io)
        bufs[v] = tx.ptr
    ws = _ws(g)
    assert ws is not None
    ws.fill_bytes(0xFF)
    count = Launches(monkeypatch)
    g.execute(bufs, ws.ptr, handle=handle)
    assert count.n == 1
    first = ty.download()
    c = np.matmul(av, wv) + bv
    cscale = np.matmul(np.abs(av), np.abs(wv)) + np.abs(bv)
    want, _, rscale = ref_reduce(op, 1.0, c, 0.0, None, [batch, m, 1])
    # rounding of the float accumulations: each reduced term carries its matmul's error (cscale)
    term = {"ADD": cscale.sum(-1, keepdims=True), "AVG": cscale.mean(-1, keepdims=True),
            "NORM1": cscale.sum(-1, keepdims=True)}.get(mode, cscale.max(-1, keepdims=True))
    assert_close(first, want, io, f"matmul + {mode} row reduction", scale=np.maximum(rscale, term))
    ty.check_untouched()
    if store_x:
        assert_close(tx.download(), c, io, "the reduced tensor's store", scale=2 * cscale)
        tx.check_untouched()
    ty.poison()
    g.execute(bufs, ws.ptr, handle=handle)
    np.testing.assert_array_equal(ty.download(), first)


def test_matmul_row_max_wgmma_tile(handle, rng, monkeypatch):
    """2048 x 2048 x 512 bf16 matmul + row MAX (the chooser's wgmma 128x256 tile on sm_90): one launch."""
    g = Graph(io_data_type=BF16, intermediate_data_type=F32, compute_data_type=F32, handle=handle)
    a = g.tensor(name="a", dim=[1, 2048, 512])
    w = g.tensor(name="w", dim=[1, 512, 2048])
    y = g.reduction(g.matmul(a, w), P.PYDNN_REDUCE_TENSOR_MAX, dim=[1, 2048, 1]).set_output(True)
    g.build_operation_graph().create_execution_plans().build_plans()
    assert g.engine_index() == 1 and g.launches() == 1
    ta, tw, ty = (DevTensor(t.dim, BF16) for t in (a, w, y))
    av, wv = ta.random(rng, -1, 1), tw.random(rng, -1, 1)
    ws = _ws(g)
    count = Launches(monkeypatch)
    g.execute({a: ta.ptr, w: tw.ptr, y: ty.ptr}, ws.ptr, handle=handle)
    assert count.n == 1
    c = av @ wv
    assert_close(ty.download(), c.max(-1, keepdims=True), BF16, "wgmma + row max",
                 scale=(np.abs(av) @ np.abs(wv)).max(-1, keepdims=True))
    ty.check_untouched()


@pytest.mark.parametrize("kind, m, n, k, batch", [("gelu", 2048, 1024, 512, 1), ("residual", 600, 700, 520, 2),
                                                  ("rowmax", 700, 600, 512, 2)])
def test_fused_epilogue_persistent_blocks_walk_tiles(handle, rng, monkeypatch, kind, m, n, k, batch):
    """The fused GEMM on the persistent wgmma tile (sm_90, tuning.matmul.WG_PERSIST) with a grid of 2 blocks
    (handle.sm_count patched to 2): each block walks many tiles (partial ones on the m / n edges, batches),
    copying the next tile's first K tiles before each epilogue; bias + GELU, bias + residual, and a row MAX
    (its per-row-tile counters reached by one block several times). One launch, against float64."""
    from pydnn import tuning
    from pydnn.ops import matmul as M

    if handle.arch != M.WG_ARCH:
        pytest.skip(f"the wgmma tiles run on {M.WG_ARCH} only")
    monkeypatch.setattr(tuning.matmul, "WG_PERSIST", True)
    monkeypatch.setattr(handle, "sm_count", 2)
    assert M._choose_tile(m, n, batch, 2, M.WG_ARCH, k) is M.WG_PERSIST_TILE
    if kind == "rowmax":
        g = Graph(io_data_type=BF16, intermediate_data_type=F32, compute_data_type=F32, handle=handle)
        a = g.tensor(name="a", dim=[batch, m, k])
        w = g.tensor(name="w", dim=[1, k, n])
        y = g.reduction(g.matmul(a, w), P.PYDNN_REDUCE_TENSOR_MAX, dim=[batch, m, 1]).set_output(True)
        bias = r = None
    else:
        g, (a, w, bias, r, y) = _mm_graph(handle, BF16, m, n, k, kind == "residual", batch)
    g.build_operation_graph().create_execution_plans().check_support().build_plans()
    assert g.engine_index() == 1 and g.launches() == 1
    ta, tw, ty = (DevTensor(t.dim, BF16) for t in (a, w, y))
    av, wv = ta.random(rng, -1, 1), tw.random(rng, -1, 1)
    bufs = {a: ta.ptr, w: tw.ptr, y: ty.ptr}
    c, scale = np.matmul(av, wv), np.matmul(np.abs(av), np.abs(wv))
    if bias is not None:
        tb = DevTensor(bias.dim, BF16)
        bv = tb.random(rng, -1, 1)
        bufs[bias] = tb.ptr
        c, scale = c + bv, scale + np.abs(bv)
    if r is not None:
        tr = DevTensor(r.dim, BF16)
        rv = tr.random(rng, -1, 1)
        bufs[r] = tr.ptr
        c, scale = c + rv, scale + np.abs(rv)
    ws = _ws(g)
    count = Launches(monkeypatch)
    g.execute(bufs, ws.ptr if ws else 0, handle=handle)
    assert count.n == 1
    if kind == "rowmax":
        want, scale = c.max(-1, keepdims=True), scale.max(-1, keepdims=True)
    else:
        want = ref.pointwise("GELU_FWD", c) if kind == "gelu" else c
        scale = 2 * scale
    assert_close(ty.download(), want, BF16, f"persistent fused {kind}", scale=scale)
    ty.check_untouched()
