"""The graph API's normalization, convolution-fusion and attention nodes on the GPU against float64 numpy
(pydnn.reference.normalization / batchnorm / graph / convolution / attention): layer / RMS norm with a
scale + bias + GELU epilogue as ONE launch of the normalization kernel (launches counted) and on the node
engine, layer / RMS / instance norm forward and backward nodes, batch norm training (running statistics,
epsilon and momentum as pass-by-value tensors), inference and backward. Outputs start poisoned (NaN
bytes)."""
import numpy as np
import pytest

import pydnn as P
from devtensor import DevTensor, assert_close
from pydnn.graph import Graph
from pydnn.reference import batchnorm as rb
from pydnn.reference import graph as ref
from pydnn.reference import normalization as rn
from test_graph_gpu import Launches, _ws

pytestmark = pytest.mark.gpu
F32, F16, BF16 = P.PYDNN_DATA_FLOAT, P.PYDNN_DATA_HALF, P.PYDNN_DATA_BFLOAT16
TRAIN, INFER = P.PYDNN_NORM_FWD_TRAINING, P.PYDNN_NORM_FWD_INFERENCE
EPS = 1e-5


def _stats_close(inv, want_inv, mean=None, want_mean=None, xv=None, sets=None, what=""):
    """float32 statistics as tests/ops/normalization checks them: inv_variance to FLOAT's tolerance, the
    mean to it relative to the mean |x| of each set (sets: x reshaped to (sets, len) in logical order)."""
    assert_close(np.ravel(inv), np.ravel(want_inv), F32, "inv_variance " + what)
    if mean is not None:
        xs = np.abs(np.asarray(xv)).reshape(sets, -1).mean(axis=1)
        assert_close(np.ravel(mean), np.ravel(want_mean), F32, "mean " + what, scale=xs)


def _norm_epilogue_graph(handle, io, rms, phase, dims):
    n, s, d = dims
    g = Graph(io_data_type=io, handle=handle)
    x = g.tensor(name="x", dim=[n, s, d])
    sc = g.tensor(name="scale", dim=[1, 1, d], data_type=F32)
    b = None if rms else g.tensor(name="bias", dim=[1, 1, d], data_type=F32)
    if rms:
        y, inv = g.rmsnorm(x, sc, EPS, norm_forward_phase=phase)
        mean = None
    else:
        y, mean, inv = g.layernorm(x, sc, b, EPS, norm_forward_phase=phase)
    for t in (mean, inv):
        if t is not None:
            t.set_output(True)
    s2 = g.tensor(name="s2", dim=[1, 1, d])
    b2 = g.tensor(name="b2", dim=[1, 1, d])
    out = g.gelu(g.add(g.mul(y, s2), b2), name="out").set_output(True)
    return g, dict(x=x, scale=sc, bias=b, s2=s2, b2=b2, out=out, mean=mean, inv=inv)


@pytest.mark.parametrize("io", [F32, BF16], ids=["f32", "bf16"])
@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
@pytest.mark.parametrize("phase", [TRAIN, INFER], ids=["train", "infer"])
@pytest.mark.parametrize("mode, engine", [(P.PYDNN_HEUR_MODE_A, 1), (P.PYDNN_HEUR_MODE_FALLBACK, 0)],
                         ids=["fused", "nodes"])
def test_norm_scale_bias_gelu(handle, rng, monkeypatch, io, rms, phase, mode, engine):
    """gelu(norm(x) * s2 + b2): engine 1 runs it as ONE launch of the normalization kernel with the
    generated epilogue; engine 0 runs the norm node and three pointwise nodes."""
    dims = (3, 37, 320)
    g, t = _norm_epilogue_graph(handle, io, rms, phase, dims)
    g.build_operation_graph().create_execution_plans([mode]).check_support().build_plans()
    assert g.engine_index() == engine
    if engine == 1:
        assert g.launches() == 1 and g.get_workspace_size() == 0
    kind = P.PYDNN_NORM_KIND_RMS if rms else P.PYDNN_NORM_KIND_LAYER
    dev = {k: DevTensor(v.dim, v.data_type if v.data_type is not None else (F32 if k in ("mean", "inv") else io),
                        v.stride) for k, v in t.items() if v is not None}
    xv = dev["x"].random(rng, -2, 3)
    scv = dev["scale"].random(rng, 0.5, 1.5)
    bv = dev["bias"].random(rng, -1, 1) if "bias" in dev else None
    s2v, b2v = dev["s2"].random(rng, -1.5, 1.5), dev["b2"].random(rng, -1, 1)
    bufs = {t[k]: dev[k].ptr for k in dev}
    ws = _ws(g)
    count = Launches(monkeypatch)
    g.execute(bufs, ws.ptr if ws else 0, handle=handle)
    if engine == 1:
        assert count.n == 1, count.n
    z = rn.pre_activation(kind, 1, 1, EPS, xv, scv, bv)
    v = z * s2v + b2v
    want = ref.pointwise("GELU_FWD", v)
    terms = rn.forward_terms(kind, 1, 1, EPS, None, xv, scv, bv) * np.abs(s2v) + np.abs(b2v)
    # engine 0 stores y in x's type before the epilogue: one more rounding of y, scaled by |s2|
    assert_close(dev["out"].download(), want, io, f"norm epilogue engine {engine}", scale=1.2 * terms)
    dev["out"].check_untouched()
    mean, inv = rn.statistics(kind, 1, 1, EPS, xv)
    if phase == TRAIN:
        _stats_close(dev["inv"].download(), inv, None if rms else dev["mean"].download(), mean, xv, inv.size)
        dev["inv"].check_untouched()


@pytest.mark.parametrize("io", [F32, BF16], ids=["f32", "bf16"])
def test_norm_epilogue_per_row_and_extra_output(handle, rng, monkeypatch, io):
    """An epilogue operand per row ([n, s, 1]) and a full tensor ([n, s, d]), the pre-activation stored as
    a second output: still one launch (bf16 rows of 256: the fwd_rows form, its operand runs as one value a
    row and as 16-byte vectors; f32 rows of 250, not whole 16-byte vectors: the gen_fwd form)."""
    n, s, d = 2, 9, 256 if io == BF16 else 250
    g = Graph(io_data_type=io, handle=handle)
    x = g.tensor(name="x", dim=[n, s, d])
    sc = g.tensor(name="scale", dim=[1, 1, d], data_type=F32)
    b = g.tensor(name="bias", dim=[1, 1, d], data_type=F32)
    r = g.tensor(name="r", dim=[n, s, 1])
    res = g.tensor(name="res", dim=[n, s, d])
    y, _, _ = g.layernorm(x, sc, b, EPS, norm_forward_phase=INFER)
    pre = g.add(g.mul(y, r), res, name="pre").set_output(True)
    out = g.relu(pre, name="out").set_output(True)
    g.build_operation_graph().create_execution_plans([P.PYDNN_HEUR_MODE_A]).check_support().build_plans()
    assert g.engine_index() == 1 and g.launches() == 1
    assert g._plan_obj.built.steps[0].kernels == (["rows8", "gen"] if io == BF16 else ["gen"])
    tx, ts, tb = DevTensor(x.dim, io), DevTensor(sc.dim, F32), DevTensor(b.dim, F32)
    tr, tres, tpre, tout = DevTensor(r.dim, io), DevTensor(res.dim, io), DevTensor(pre.dim, io), DevTensor(out.dim, io)
    xv, scv, bv = tx.random(rng), ts.random(rng, 0.5, 1.5), tb.random(rng, -1, 1)
    rv, resv = tr.random(rng, -2, 2), tres.random(rng, -1, 1)
    count = Launches(monkeypatch)
    g.execute({x: tx.ptr, sc: ts.ptr, b: tb.ptr, r: tr.ptr, res: tres.ptr, pre: tpre.ptr, out: tout.ptr}, 0,
              handle=handle)
    assert count.n == 1
    kind = P.PYDNN_NORM_KIND_LAYER
    z = rn.pre_activation(kind, 1, 1, EPS, xv, scv, bv)
    terms = rn.forward_terms(kind, 1, 1, EPS, None, xv, scv, bv) * np.abs(rv) + np.abs(resv)
    assert_close(tpre.download(), z * rv + resv, io, "pre", scale=terms)
    assert_close(tout.download(), np.maximum(z * rv + resv, 0), io, "out", scale=terms)
    tpre.check_untouched()
    tout.check_untouched()


NODE_CASES = [  # (mode name, x dims, scale dims)
    ("LAYER", (4, 6, 5, 7), (1, 6, 5, 7)),
    ("LAYER", (5, 3, 96), (1, 1, 96)),
    ("RMS", (5, 3, 96), (1, 1, 96)),
    ("INSTANCE", (3, 8, 6, 5), (1, 8, 1, 1)),
]


def _kind(name):
    return getattr(P, f"PYDNN_NORM_KIND_{name}")


@pytest.mark.parametrize("io", [F32, BF16], ids=["f32", "bf16"])
@pytest.mark.parametrize("name, xdims, sdims", NODE_CASES)
def test_norm_nodes_forward_backward(handle, rng, io, name, xdims, sdims):
    """Training forward (y, mean, inv_variance) then backward (dx, dscale, dbias) from the saved
    statistics, each a graph on the node engine."""
    rms = name == "RMS"
    g = Graph(io_data_type=io, handle=handle)
    x = g.tensor(name="x", dim=list(xdims))
    sc = g.tensor(name="scale", dim=list(sdims), data_type=F32)
    b = g.tensor(name="bias", dim=list(sdims), data_type=F32)
    fn = {"LAYER": g.layernorm, "INSTANCE": g.instancenorm}.get(name)
    if rms:
        y, inv = g.rmsnorm(x, sc, EPS, bias=b)
        mean = None
    else:
        y, mean, inv = fn(x, sc, b, EPS)
    y.set_output(True)
    inv.set_output(True)
    if mean is not None:
        mean.set_output(True)
    g.build_operation_graph().create_execution_plans([P.PYDNN_HEUR_MODE_A]).check_support().build_plans()
    assert g.engine_index() == 0
    tx, ts, tb, ty = DevTensor(xdims, io), DevTensor(sdims, F32), DevTensor(sdims, F32), DevTensor(xdims, io)
    tinv = DevTensor(inv.dim, F32)
    tmean = DevTensor(mean.dim, F32) if mean is not None else None
    xv, scv, bv = tx.random(rng, -2, 3), ts.random(rng, 0.5, 1.5), tb.random(rng, -1, 1)
    bufs = {x: tx.ptr, sc: ts.ptr, b: tb.ptr, y: ty.ptr, inv: tinv.ptr}
    if mean is not None:
        bufs[mean] = tmean.ptr
    ws = _ws(g)
    g.execute(bufs, ws.ptr if ws else 0)
    kind = _kind(name)
    nd = len(xdims) - 1 if name == "LAYER" and sdims[1] != 1 else 1
    want, rmean, rinv = rn.forward(kind, 1, nd, EPS, None, 1.0, xv, 0.0, None, scv, bv)
    assert_close(ty.download(), want, io, f"{name} y", scale=rn.forward_terms(kind, 1, nd, EPS, None, xv, scv, bv))
    _stats_close(tinv.download(), rinv, tmean.download() if mean is not None else None, rmean, xv, rinv.size, name)
    ty.check_untouched()

    # backward from the saved statistics (the reference's, rounded to float32)
    gb = Graph(io_data_type=io, handle=handle)
    dyt = gb.tensor(name="dy", dim=list(xdims))
    xt = gb.tensor(name="x", dim=list(xdims))
    sct = gb.tensor(name="scale", dim=list(sdims), data_type=F32)
    invt = gb.tensor(name="inv", dim=inv.dim, data_type=F32)
    meant = gb.tensor(name="mean", dim=inv.dim, data_type=F32) if not rms else None
    if rms:
        dx, dscale, dbias = gb.rmsnorm_backward(dyt, xt, sct, invt, has_dbias=True)
    else:
        bw = {"LAYER": gb.layernorm_backward, "INSTANCE": gb.instancenorm_backward}[name]
        dx, dscale, dbias = bw(dyt, xt, sct, meant, invt)
    for o in (dx, dscale, dbias):
        o.set_output(True)
    gb.build_operation_graph().create_execution_plans([P.PYDNN_HEUR_MODE_A]).check_support().build_plans()
    tdy, tinv2 = DevTensor(xdims, io), DevTensor(inv.dim, F32)
    dyv = tdy.random(rng, -1, 1)
    inv32 = tinv2.upload(rinv.reshape(inv.dim))
    bufs = {dyt: tdy.ptr, xt: tx.ptr, sct: ts.ptr, invt: tinv2.ptr}
    mean32 = np.zeros(rinv.size)
    if not rms:
        tmean2 = DevTensor(inv.dim, F32)
        mean32 = tmean2.upload(rmean.reshape(inv.dim))
        bufs[meant] = tmean2.ptr
    tdx, tds, tdb = DevTensor(xdims, io), DevTensor(sdims, F32), DevTensor(sdims, F32)
    bufs.update({dx: tdx.ptr, dscale: tds.ptr, dbias: tdb.ptr})
    ws = _ws(gb)
    gb.execute(bufs, ws.ptr if ws else 0)
    rdx, rds, rdb = rn.backward(kind, 1, nd, EPS, None, xv, dyv, scv, None, mean32, inv32)
    tdx_, tds_, tdb_ = rn.backward_terms(kind, 1, nd, EPS, None, xv, dyv, scv, None, mean32, inv32)
    assert_close(tdx.download(), rdx, io, f"{name} dx", scale=tdx_)
    assert_close(tds.download(), rds, F32, f"{name} dscale", scale=tds_)
    assert_close(tdb.download(), rdb, F32, f"{name} dbias", scale=tdb_)
    tdx.check_untouched()


@pytest.mark.parametrize("io", [F32, F16], ids=["f32", "f16"])
def test_batchnorm_training_inference_backward(handle, rng, io):
    """batchnorm (training, running statistics with epsilon and momentum as pass-by-value tensors given
    as host arrays), batchnorm_inference from mean / inv_variance, batchnorm_backward."""
    n, c, h, w = 4, 12, 7, 5
    xd, pd = (n, c, h, w), (1, c, 1, 1)
    g = Graph(io_data_type=io, handle=handle)
    x = g.tensor(name="x", dim=list(xd))
    sc, b = (g.tensor(name=k, dim=list(pd), data_type=F32) for k in ("scale", "bias"))
    rm, rv = (g.tensor(name=k, dim=list(pd), data_type=F32) for k in ("rm", "rv"))
    eps = g.tensor(name="eps", dim=[1, 1, 1, 1], data_type=F32, is_pass_by_value=True)
    mom = g.tensor(name="mom", dim=[1, 1, 1, 1], data_type=F32, is_pass_by_value=True)
    y, mean, inv, nrm, nrv = g.batchnorm(x, sc, b, eps, in_running_mean=rm, in_running_var=rv, momentum=mom)
    for o in (y, mean, inv, nrm, nrv):
        o.set_output(True)
    g.build_operation_graph().create_execution_plans([P.PYDNN_HEUR_MODE_A]).check_support().build_plans()
    tx, ty = DevTensor(xd, io), DevTensor(xd, io)
    t = {k: DevTensor(pd, F32) for k in ("scale", "bias", "rm", "rv", "mean", "inv", "nrm", "nrv")}
    xv = tx.random(rng, -2, 3)
    scv, bv = t["scale"].random(rng, 0.5, 1.5), t["bias"].random(rng, -1, 1)
    rmv, rvv = t["rm"].random(rng, -1, 1), t["rv"].random(rng, 0.5, 2)
    e, m = 1e-3, 0.25
    g.execute({x: tx.ptr, sc: t["scale"].ptr, b: t["bias"].ptr, rm: t["rm"].ptr, rv: t["rv"].ptr, y: ty.ptr,
               mean: t["mean"].ptr, inv: t["inv"].ptr, nrm: t["nrm"].ptr, nrv: t["nrv"].ptr,
               eps: np.array([e], np.float32), mom: np.array([m], np.float32)}, 0)
    mode = P.PYDNN_BATCHNORM_SPATIAL
    wy, wrm, wrv, wmean, winv, _ = rb.forward_training(mode, 1.0, 0.0, xv, None, scv, bv, m, rmv, rvv, e)
    terms = (np.abs(xv) + np.abs(wmean)) * winv * np.abs(scv) + np.abs(bv)
    assert_close(ty.download(), wy, io, "bn y", scale=terms)
    # as tests/ops/batchnorm/test_batchnorm_gpu.py checks the saved and running statistics
    xs = np.abs(xv).mean(axis=(0, 2, 3), keepdims=True)
    assert_close(t["mean"].download(), wmean, F32, "bn mean", scale=xs)
    assert_close(t["inv"].download(), winv, F32, "bn inv_variance")
    assert_close(t["nrm"].download(), wrm, F32, "next running mean", scale=np.abs(rmv) + xs)
    assert_close(t["nrv"].download(), wrv, F32, "next running var", scale=np.abs(rvv) + xs**2)
    assert np.array_equal(t["rm"].download(), rmv)  # the input running statistics are not written
    ty.check_untouched()

    # inference from mean / inv_variance: one generated pointwise kernel
    gi = Graph(io_data_type=io, handle=handle)
    xi = gi.tensor(name="x", dim=list(xd))
    mi, ii, si, bi = (gi.tensor(name=k, dim=list(pd), data_type=F32) for k in ("mean", "inv", "scale", "bias"))
    yi = gi.batchnorm_inference(xi, mi, ii, si, bi).set_output(True)
    gi.build_operation_graph().create_execution_plans([P.PYDNN_HEUR_MODE_A]).check_support().build_plans()
    assert gi.launches() == 1
    tm, tinv, tyi = DevTensor(pd, F32), DevTensor(pd, F32), DevTensor(xd, io)
    mv, iv = tm.random(rng, -1, 1), tinv.random(rng, 0.5, 2)
    gi.execute({xi: tx.ptr, mi: tm.ptr, ii: tinv.ptr, si: t["scale"].ptr, bi: t["bias"].ptr, yi: tyi.ptr}, 0)
    want = (xv - mv) * iv * scv + bv
    assert_close(tyi.download(), want, io, "bn inference",
                 scale=(np.abs(xv) + np.abs(mv)) * iv * np.abs(scv) + np.abs(bv))

    # backward from the saved statistics
    gb = Graph(io_data_type=io, handle=handle)
    dyt, xt = gb.tensor(name="dy", dim=list(xd)), gb.tensor(name="x", dim=list(xd))
    st, mt, it = (gb.tensor(name=k, dim=list(pd), data_type=F32) for k in ("scale", "mean", "inv"))
    dx, ds, db = gb.batchnorm_backward(dyt, xt, st, mt, it)
    for o in (dx, ds, db):
        o.set_output(True)
    gb.build_operation_graph().create_execution_plans([P.PYDNN_HEUR_MODE_A]).check_support().build_plans()
    tdy, tdx, tds, tdb = DevTensor(xd, io), DevTensor(xd, io), DevTensor(pd, F32), DevTensor(pd, F32)
    dyv = tdy.random(rng, -1, 1)
    ms, is_ = DevTensor(pd, F32), DevTensor(pd, F32)
    m32, i32 = ms.upload(wmean), is_.upload(winv)
    gb.execute({dyt: tdy.ptr, xt: tx.ptr, st: t["scale"].ptr, mt: ms.ptr, it: is_.ptr, dx: tdx.ptr, ds: tds.ptr,
                db: tdb.ptr}, 0)
    rdx, rds, rdb, _ = rb.backward(mode, 1.0, 0.0, 1.0, 0.0, xv, dyv, None, scv, None, None, e, m32, i32)
    xh = np.abs((xv - m32) * i32)
    ax = (0, 2, 3)
    dx_terms = np.abs(scv) * i32 * (np.abs(dyv) + np.abs(dyv).mean(axis=ax, keepdims=True)
                                    + xh * (np.abs(dyv) * xh).mean(axis=ax, keepdims=True))
    assert_close(tdx.download(), rdx, io, "bn dx", scale=dx_terms)
    assert_close(tds.download(), rds, F32, "bn dscale", scale=(np.abs(dyv) * xh).sum(axis=(0, 2, 3), keepdims=True))
    assert_close(tdb.download(), rdb, F32, "bn dbias", scale=np.abs(dyv).sum(axis=(0, 2, 3), keepdims=True))
    tdx.check_untouched()


@pytest.mark.parametrize("io", [F32, F16], ids=["f32", "f16"])
@pytest.mark.parametrize("scale_kind", ["scalar", "per_channel"])
@pytest.mark.parametrize("residual", [False, True])
def test_conv_scale_bias_relu(handle, rng, monkeypatch, io, scale_kind, residual):
    """relu(conv(x, w) * s + b (+ z)): a pass-by-value scalar s folds into alpha1 of the convolution's
    bias / activation epilogue (one kernel, two with a split-K fold); a per-channel s [1, K, 1, 1] runs as
    the convolution plus one generated epilogue kernel (pydnn's convolution epilogue has no per-channel
    scale, and folding s into the filter would change the caller's data)."""
    from pydnn.reference import convolution as rc

    n, c, hw, k = 2, 16, 9, 24
    g = Graph(io_data_type=io, handle=handle)
    x = g.tensor(name="x", dim=[n, c, hw, hw])
    w = g.tensor(name="w", dim=[k, c, 3, 3])
    b = g.tensor(name="b", dim=[1, k, 1, 1])
    if scale_kind == "scalar":
        s = g.tensor(name="s", dim=[1, 1, 1, 1], data_type=F32, is_pass_by_value=True)
    else:
        s = g.tensor(name="s", dim=[1, k, 1, 1])
    v = g.add(g.mul(g.conv_fprop(x, w, padding=[1, 1]), s), b)
    z = None
    if residual:
        z = g.tensor(name="z", dim=[n, k, hw, hw])
        v = g.add(v, z)
    y = g.relu(v).set_output(True)
    g.build_operation_graph().create_execution_plans([P.PYDNN_HEUR_MODE_A]).check_support().build_plans()
    assert g.engine_index() == 1
    tx, tw, tb, ty = DevTensor(x.dim, io), DevTensor(w.dim, io), DevTensor(b.dim, io), DevTensor(y.dim, io)
    xv, wv, bv = tx.random(rng, -1, 1), tw.random(rng, -1, 1), tb.random(rng, -1, 1)
    bufs = {x: tx.ptr, w: tw.ptr, b: tb.ptr, y: ty.ptr}
    if scale_kind == "scalar":
        sv = 0.75
        bufs[s] = np.array([sv], np.float32)
    else:
        ts = DevTensor(s.dim, io)
        sv = ts.random(rng, 0.5, 1.5)
        bufs[s] = ts.ptr
    conv = rc.forward_raw(xv, wv, [1, 1], [1, 1], [1, 1])
    terms = rc.forward_raw(np.abs(xv), np.abs(wv), [1, 1], [1, 1], [1, 1]) * np.abs(sv) + np.abs(bv)
    pre = conv * sv + bv
    if residual:
        tz = DevTensor(z.dim, io)
        zv = tz.random(rng, -1, 1)
        bufs[z] = tz.ptr
        pre, terms = pre + zv, terms + np.abs(zv)
    ws = _ws(g)
    count = Launches(monkeypatch)
    g.execute(bufs, ws.ptr if ws else 0, handle=handle)
    if scale_kind == "scalar":
        assert count.n <= 2, count.n  # the convolution kernel (+ a split-K fold where its plan has one)
    print(f"conv * {scale_kind} scale + bias + relu launches:", count.n)
    # the per-channel form stores conv(x, w) in x's type before the epilogue: one rounding, scaled by |s|
    assert_close(ty.download(), np.maximum(pre, 0), io, f"conv {scale_kind}", scale=2 * terms)
    ty.check_untouched()


@pytest.mark.parametrize("io", [F16, BF16], ids=["f16", "bf16"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_sdpa_forward_backward(handle, rng, io, causal, d):
    """sdpa (O and the log-sum-exp statistics, attn_scale a pass-by-value tensor given as a host array),
    then sdpa_backward from them: pydnn's fused attention, GQA (4 query heads on 2 K/V heads), lengths
    that are not tile multiples."""
    from pydnn.reference import attention as R

    b, hq, hkv, sq, skv = 2, 4, 2, 100, 90
    scale = 1.0 / np.sqrt(d)
    mask = P.PYDNN_ATTN_MASK_CAUSAL_TOP_LEFT if causal else P.PYDNN_ATTN_MASK_NONE
    g = Graph(io_data_type=io, handle=handle)
    q = g.tensor(name="q", dim=[b, hq, sq, d])
    k, v = g.tensor(name="k", dim=[b, hkv, skv, d]), g.tensor(name="v", dim=[b, hkv, skv, d])
    sc = g.tensor(name="scale", dim=[1, 1, 1, 1], data_type=F32, is_pass_by_value=True)
    o, st = g.sdpa(q, k, v, attn_scale=sc, use_causal_mask=causal)
    o.set_output(True)
    st.set_output(True)
    g.build_operation_graph().create_execution_plans([P.PYDNN_HEUR_MODE_A]).check_support().build_plans()
    tq, tk, tv = DevTensor(q.dim, io), DevTensor(k.dim, io), DevTensor(v.dim, io)
    to, tst = DevTensor(o.dim, io), DevTensor(st.dim, F32)
    qv, kv, vv = tq.random(rng, -2, 2), tk.random(rng, -2, 2), tv.random(rng, -2, 2)
    g.execute({q: tq.ptr, k: tk.ptr, v: tv.ptr, o: to.ptr, st: tst.ptr, sc: np.array([scale], np.float32)}, 0)
    scale32 = float(np.float32(scale))
    ro, rlse, so, slse = R.forward(qv, kv, vv, scale32, mask)
    assert_close(to.download(), ro, io, "O", scale=so)
    got = tst.download()[..., 0]
    assert_close(got, rlse, F32, "stats", scale=slse)
    to.check_untouched()
    tst.check_untouched()

    gb = Graph(io_data_type=io, handle=handle)
    ts = {n: gb.tensor(name=n, dim=dims) for n, dims in (("q", q.dim), ("k", k.dim), ("v", k.dim), ("o", q.dim),
                                                          ("do", q.dim))}
    ts["stats"] = gb.tensor(name="stats", dim=st.dim, data_type=F32)
    dq, dk, dv = gb.sdpa_backward(ts["q"], ts["k"], ts["v"], ts["o"], ts["do"], ts["stats"], attn_scale=scale32,
                                  use_causal_mask=causal, use_deterministic_algorithm=True)
    for t in (dq, dk, dv):
        t.set_output(True)
    gb.build_operation_graph().create_execution_plans([P.PYDNN_HEUR_MODE_A]).check_support().build_plans()
    tdo = DevTensor(q.dim, io)
    dov = tdo.random(rng, -2, 2)
    tdq, tdk, tdv = DevTensor(q.dim, io), DevTensor(k.dim, io), DevTensor(k.dim, io)
    ws = _ws(gb)
    gb.execute({ts["q"]: tq.ptr, ts["k"]: tk.ptr, ts["v"]: tv.ptr, ts["o"]: to.ptr, ts["do"]: tdo.ptr,
                ts["stats"]: tst.ptr, dq: tdq.ptr, dk: tdk.ptr, dv: tdv.ptr}, ws.ptr if ws else 0)
    rdq, rdk, rdv, (sdq, sdk, sdv) = R.backward(qv, kv, vv, dov, scale32, mask)
    for t, r, s, nm in ((tdq, rdq, sdq, "dQ"), (tdk, rdk, sdk, "dK"), (tdv, rdv, sdv, "dV")):
        assert_close(t.download(), r, io, nm, scale=s)
        t.check_untouched()


def test_sdpa_padding_mask(handle, rng):
    """use_padding_mask with per-batch lengths (INT32 device tensors): rows past their length O = 0 and
    stats = -inf, keys past theirs unseen; the backward with the same lengths."""
    from pydnn.reference import attention as R

    io, b, hq, hkv, sq, skv, d = BF16, 2, 4, 2, 100, 90, 64
    lens_q, lens_kv = [100, 37], [90, 11]
    scale = 0.125
    g = Graph(io_data_type=io, handle=handle)
    q = g.tensor(name="q", dim=[b, hq, sq, d])
    k, v = g.tensor(name="k", dim=[b, hkv, skv, d]), g.tensor(name="v", dim=[b, hkv, skv, d])
    lq = g.tensor(name="lq", dim=[b, 1, 1, 1], data_type=P.PYDNN_DATA_INT32)
    lkv = g.tensor(name="lkv", dim=[b, 1, 1, 1], data_type=P.PYDNN_DATA_INT32)
    o, st = g.sdpa(q, k, v, attn_scale=scale, use_padding_mask=True, seq_len_q=lq, seq_len_kv=lkv)
    o.set_output(True)
    st.set_output(True)
    g.build_operation_graph().create_execution_plans([P.PYDNN_HEUR_MODE_A]).check_support().build_plans()
    tq, tk, tv = DevTensor(q.dim, io), DevTensor(k.dim, io), DevTensor(v.dim, io)
    to, tst = DevTensor(o.dim, io), DevTensor(st.dim, F32)
    qv, kv, vv = tq.random(rng, -2, 2), tk.random(rng, -2, 2), tv.random(rng, -2, 2)
    dq_, dkv_ = P.DeviceArray((b,), np.int32), P.DeviceArray((b,), np.int32)
    dq_.copy_from_numpy(np.array(lens_q, np.int32))
    dkv_.copy_from_numpy(np.array(lens_kv, np.int32))
    g.execute({q: tq.ptr, k: tk.ptr, v: tv.ptr, o: to.ptr, st: tst.ptr, lq: dq_.ptr, lkv: dkv_.ptr}, 0)
    ro, rlse, so, slse = R.forward(qv, kv, vv, scale, P.PYDNN_ATTN_MASK_NONE, lens_q, lens_kv)
    assert_close(to.download(), ro, io, "O", scale=so)
    got = tst.download()[..., 0]
    dead = np.isneginf(rlse)
    assert dead.any() and np.isneginf(got[dead]).all(), "stats of rows past their length must be -inf"
    assert_close(np.where(dead, 0, got), np.where(dead, 0, rlse), F32, "stats", scale=slse)
    to.check_untouched()

    gb = Graph(io_data_type=io, handle=handle)
    ts = {n: gb.tensor(name=n, dim=dims) for n, dims in (("q", q.dim), ("k", k.dim), ("v", k.dim), ("o", q.dim),
                                                          ("do", q.dim))}
    ts["stats"] = gb.tensor(name="stats", dim=st.dim, data_type=F32)
    lqb = gb.tensor(name="lq", dim=[b, 1, 1, 1], data_type=P.PYDNN_DATA_INT32)
    lkvb = gb.tensor(name="lkv", dim=[b, 1, 1, 1], data_type=P.PYDNN_DATA_INT32)
    dq, dk, dv = gb.sdpa_backward(ts["q"], ts["k"], ts["v"], ts["o"], ts["do"], ts["stats"], attn_scale=scale,
                                  use_padding_mask=True, seq_len_q=lqb, seq_len_kv=lkvb)
    for t in (dq, dk, dv):
        t.set_output(True)
    gb.build_operation_graph().create_execution_plans([P.PYDNN_HEUR_MODE_A]).check_support().build_plans()
    tdo = DevTensor(q.dim, io)
    dov = tdo.random(rng, -2, 2)
    tdq, tdk, tdv = DevTensor(q.dim, io), DevTensor(k.dim, io), DevTensor(k.dim, io)
    ws = _ws(gb)
    gb.execute({ts["q"]: tq.ptr, ts["k"]: tk.ptr, ts["v"]: tv.ptr, ts["o"]: to.ptr, ts["do"]: tdo.ptr,
                ts["stats"]: tst.ptr, lqb: dq_.ptr, lkvb: dkv_.ptr, dq: tdq.ptr, dk: tdk.ptr, dv: tdv.ptr},
               ws.ptr if ws else 0)
    rdq, rdk, rdv, (sdq, sdk, sdv) = R.backward(qv, kv, vv, dov, scale, P.PYDNN_ATTN_MASK_NONE, lens_q, lens_kv)
    for t, r, s, nm in ((tdq, rdq, sdq, "dQ"), (tdk, rdk, sdk, "dK"), (tdv, rdv, sdv, "dV")):
        assert_close(t.download(), r, io, nm, scale=s)
        t.check_untouched()
