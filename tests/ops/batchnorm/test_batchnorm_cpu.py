"""Batch normalization on the CPU: every validation error (status + the argument it names), the derived
descriptor, the float64 reference against finite differences, the kernel choice per layout and the
workspace sizes, and the host's chunking replayed in numpy (Chan merges of the stats kernels' partials in
the final kernel's order) against the direct statistics, including a large N*H*W with a large mean."""
import numpy as np
import pytest

import pydnn
from pydnn import tuning
from pydnn.ops import batchnorm as B
from pydnn.reference import batchnorm as ref
from pydnn.tensor import packed_strides
from test_fuzz_cpu import _call, _desc, cpu_handle

F32, F64, F16, BF16 = (pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DATA_DOUBLE, pydnn.PYDNN_DATA_HALF,
                       pydnn.PYDNN_DATA_BFLOAT16)
PER_ACT, SPATIAL, PERSIST = (pydnn.PYDNN_BATCHNORM_PER_ACTIVATION, pydnn.PYDNN_BATCHNORM_SPATIAL,
                             pydnn.PYDNN_BATCHNORM_SPATIAL_PERSISTENT)
OPS_BN, OPS_ACT, OPS_ADD = (pydnn.PYDNN_BATCHNORM_OPS_BN, pydnn.PYDNN_BATCHNORM_OPS_BN_ACTIVATION,
                            pydnn.PYDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION)
BAD, NS = pydnn.PYDNN_STATUS_BAD_PARAM, pydnn.PYDNN_STATUS_NOT_SUPPORTED
NULL, MIS = pydnn.PYDNN_STATUS_BAD_PARAM_NULL_POINTER, pydnn.PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER
NOINIT = pydnn.PYDNN_STATUS_NOT_INITIALIZED  # everything valid: the CPU-only handle refuses at kernel lookup
X, Y, Z, DY, DX, DZ = (1 << 40, 1 << 41, 1 << 42, 1 << 43, 1 << 44, 1 << 45)
SC, BI, RM, RV, SM, SI, WS, RS = (1 << 46, 1 << 47, 1 << 48, 1 << 49, 1 << 50, 1 << 51, 1 << 52, 1 << 53)


def _check(fn, args, status, needle):
    st = _call(fn, *args)
    msg = pydnn.get_last_error_string()
    assert st == status, (st, msg)
    assert needle in msg, msg


def _nhwc(dims, dtype=F32):
    return _desc(dims, dtype, packed_strides(dims, pydnn.PYDNN_TENSOR_NHWC))


def _bn(x, mode=SPATIAL):
    d = pydnn.create_tensor_descriptor()
    pydnn.derive_bn_tensor_descriptor(d, x, mode)
    return d


def _relu():
    a = pydnn.create_activation_descriptor()
    pydnn.set_activation_descriptor(a, pydnn.PYDNN_ACTIVATION_RELU, pydnn.PYDNN_NOT_PROPAGATE_NAN, 0.0)
    return a


# ----------------------------------------------------------------------------- derive

def test_derive_bn_tensor_descriptor():
    for dt, want in ((F32, F32), (F16, F32), (BF16, F32), (F64, F64)):
        x = _desc((2, 3, 4, 5), dt)
        d = _bn(x, SPATIAL)
        assert pydnn.get_tensor_nd_descriptor(d, 8) == (want, 4, [1, 3, 1, 1], [3, 1, 1, 1])
        d = _bn(x, PER_ACT)
        assert pydnn.get_tensor_nd_descriptor(d, 8) == (want, 4, [1, 3, 4, 5], [60, 20, 5, 1])
    x5 = _nhwc((2, 3, 4, 5, 6))
    assert pydnn.get_tensor_nd_descriptor(_bn(x5, PERSIST), 8)[2] == [1, 3, 1, 1, 1]
    d = pydnn.create_tensor_descriptor()
    der = pydnn.derive_bn_tensor_descriptor
    _check(der, (d, _desc((2, 3, 4, 5)), 3), BAD, "derive_bn_tensor_descriptor: mode: 3 is not")
    _check(der, (d, _desc((2, 3, 4)), SPATIAL), BAD, "xDesc: batch normalization takes 4 or 5 dims")
    _check(der, (d, _desc((2, 3, 4, 5), pydnn.PYDNN_DATA_INT8), SPATIAL), NS, "xDesc: data type")
    _check(der, ("d", _desc((2, 3, 4, 5)), SPATIAL), BAD, "derivedBnDesc: not a live")
    _check(der, (d, pydnn.create_tensor_descriptor(), SPATIAL), BAD, "xDesc: descriptor was never set")


# ----------------------------------------------------------------------------- validation

def _fwd_args(**kw):
    x = kw.get("xd", _nhwc((4, 8, 3, 5)))
    a = dict(h=cpu_handle(), mode=SPATIAL, alpha=1.0, beta=0.0, xd=x, x=X, yd=x, y=Y, bd=None if "bd" in kw else _bn(x),
             sc=SC, bi=BI, f=0.1, rm=RM, rv=RV, eps=1e-5, sm=SM, si=SI)
    a.update(kw)
    return [a[k] for k in ("h", "mode", "alpha", "beta", "xd", "x", "yd", "y", "bd", "sc", "bi", "f", "rm", "rv",
                           "eps", "sm", "si")]


def test_forward_training_validation():
    fwd = pydnn.batch_normalization_forward_training
    x = _nhwc((4, 8, 3, 5))
    _check(fwd, _fwd_args(), NOINIT, "")
    _check(fwd, _fwd_args(rm=None, rv=0, sm=None, si=None), NOINIT, "")  # the optional pairs
    _check(fwd, _fwd_args(mode=7), BAD, "batch_normalization_forward_training: mode: 7 is not")
    _check(fwd, _fwd_args(eps=-1e-3), BAD, "epsilon: -0.001 is below PYDNN_BN_MIN_EPSILON")
    _check(fwd, _fwd_args(eps=float("nan")), BAD, "epsilon:")
    _check(fwd, _fwd_args(eps=0.0), NOINIT, "")  # PYDNN_BN_MIN_EPSILON itself is allowed
    _check(fwd, _fwd_args(f=float("inf")), BAD, "exponentialAverageFactor:")
    _check(fwd, _fwd_args(yd=_nhwc((4, 8, 3, 6))), BAD, "yDesc: dims (4, 8, 3, 6) differ from xDesc")
    _check(fwd, _fwd_args(yd=_nhwc((4, 8, 3, 5), F16)), BAD, "yDesc: data type")
    _check(fwd, _fwd_args(yd=_desc((4, 8, 3, 5), F32, (1, 1, 1, 1))), BAD, "yDesc: strides")
    _check(fwd, _fwd_args(xd=_desc((4, 8, 3)), bd=_bn(x)), BAD, "xDesc: batch normalization takes 4 or 5 dims")
    ix = _desc((4, 8, 3, 5), pydnn.PYDNN_DATA_INT32)
    _check(fwd, _fwd_args(xd=ix, bd=_bn(x)), NS, "xDesc: data type")
    # the parameter descriptor must be the derived one
    _check(fwd, _fwd_args(bd=_bn(x, PER_ACT)), BAD, "bnScaleBiasMeanVarDesc: dims (1, 8, 3, 5) are not (1, 8, 1, 1)")
    _check(fwd, _fwd_args(bd=_desc((1, 7, 1, 1))), BAD, "bnScaleBiasMeanVarDesc: dims (1, 7, 1, 1)")
    _check(fwd, _fwd_args(bd=_desc((1, 8, 1, 1), F16)), BAD, "bnScaleBiasMeanVarDesc: data type")
    _check(fwd, _fwd_args(bd=_desc((1, 8, 1, 1), F32, (16, 2, 1, 1))), BAD, "bnScaleBiasMeanVarDesc: strides")
    hx = _nhwc((4, 8, 3, 5), F16)
    _check(fwd, _fwd_args(xd=hx, yd=hx, bd=_desc((1, 8, 1, 1), F16)), BAD,
           "bnScaleBiasMeanVarDesc: data type 2 is not 0")
    _check(fwd, _fwd_args(xd=hx, yd=hx, bd=_bn(hx), x=X + 2, y=Y + 6), NOINIT, "")  # 2-byte aligned is enough
    _check(fwd, _fwd_args(bd=None), BAD, "bnScaleBiasMeanVarDesc: not a live")
    # pointers
    _check(fwd, _fwd_args(x=0), NULL, "x: NULL")
    _check(fwd, _fwd_args(y=None), NULL, "y: NULL")
    _check(fwd, _fwd_args(sc=0), NULL, "bnScale: NULL")
    _check(fwd, _fwd_args(bi=0), NULL, "bnBias: NULL")
    _check(fwd, _fwd_args(x=X + 2), MIS, "x: 0x")
    _check(fwd, _fwd_args(sc=SC + 2), MIS, "bnScale: 0x")
    _check(fwd, _fwd_args(rv=None), BAD, "resultRunningMean, resultRunningVariance: give both or neither")
    _check(fwd, _fwd_args(sm=0), BAD, "resultSaveMean, resultSaveInvVariance: give both or neither")
    _check(fwd, _fwd_args(alpha="a"), BAD, "alpha: expected a number")
    _check(fwd, _fwd_args(h="h"), BAD, "handle:")


def test_inference_validation():
    inf = pydnn.batch_normalization_forward_inference
    x = _desc((2, 6, 4, 4))
    bd = _bn(x)

    def args(**kw):
        a = dict(h=cpu_handle(), mode=SPATIAL, alpha=1.0, beta=0.0, xd=x, x=X, yd=x, y=Y, bd=bd, sc=SC, bi=BI,
                 m=RM, v=RV, eps=1e-5)
        a.update(kw)
        return list(a.values())

    _check(inf, args(), NOINIT, "")
    _check(inf, args(y=X), NOINIT, "")  # in place
    _check(inf, args(eps=-1.0), BAD, "epsilon:")
    _check(inf, args(m=0), NULL, "estimatedMean: NULL")
    _check(inf, args(v=None), NULL, "estimatedVariance: NULL")
    _check(inf, args(bd=_bn(x, PER_ACT)), BAD, "bnScaleBiasMeanVarDesc: dims")
    _check(inf, args(yd=_desc((2, 6, 4, 4), F64)), BAD, "yDesc: data type")
    _check(inf, args(mode=-1), BAD, "mode:")


def _bwd_args(**kw):
    x = kw.get("xd", _nhwc((4, 8, 3, 5)))
    a = dict(h=cpu_handle(), mode=SPATIAL, ad=1.0, bd_=0.0, ap=1.0, bp=0.0, xd=x, x=X, dyd=x, dy=DY, dxd=x, dx=DX,
             bnd=None if "bnd" in kw else _bn(x), sc=SC, ds=RM, db=RV, eps=1e-5, sm=SM, si=SI)
    a.update(kw)
    return [a[k] for k in ("h", "mode", "ad", "bd_", "ap", "bp", "xd", "x", "dyd", "dy", "dxd", "dx", "bnd", "sc",
                           "ds", "db", "eps", "sm", "si")]


def test_backward_validation():
    bwd = pydnn.batch_normalization_backward
    _check(bwd, _bwd_args(), NOINIT, "")
    _check(bwd, _bwd_args(sm=None, si=0), NOINIT, "")  # recompute
    _check(bwd, _bwd_args(si=0), BAD, "savedMean, savedInvVariance: give both or neither")
    _check(bwd, _bwd_args(dyd=_nhwc((4, 8, 3, 4))), BAD, "dyDesc: dims")
    _check(bwd, _bwd_args(dxd=_nhwc((4, 8, 3, 5), F64)), BAD, "dxDesc: data type")
    _check(bwd, _bwd_args(dxd=_desc((4, 8, 3, 5), F32, (0 + 1, 1, 1, 1))), BAD, "dxDesc: strides")
    _check(bwd, _bwd_args(bnd=_desc((1, 8, 1, 1), F64)), BAD, "dBnScaleBiasDesc: data type")
    _check(bwd, _bwd_args(bnd=_desc((8,))), BAD, "dBnScaleBiasDesc: dims")
    _check(bwd, _bwd_args(eps=-0.5), BAD, "epsilon:")
    _check(bwd, _bwd_args(ds=0), NULL, "dBnScaleResult: NULL")
    _check(bwd, _bwd_args(db=None), NULL, "dBnBiasResult: NULL")
    _check(bwd, _bwd_args(dx=DX + 1), MIS, "dx: 0x")
    _check(bwd, _bwd_args(bp="x"), BAD, "betaParamDiff: expected a number")
    _check(bwd, _bwd_args(mode=5), BAD, "mode: 5")


def test_ex_validation():
    h = cpu_handle()
    x = _nhwc((4, 8, 3, 5))
    bd = _bn(x)
    relu = _relu()
    ws = pydnn.get_batch_normalization_forward_training_ex_workspace_size(h, SPATIAL, OPS_ADD, x, x, x, bd, relu)
    rs = pydnn.get_batch_normalization_training_ex_reserve_space_size(h, SPATIAL, OPS_ADD, relu, x)
    assert ws > 0 and rs == 4 * 8 * 3 * 5
    assert pydnn.get_batch_normalization_training_ex_reserve_space_size(h, SPATIAL, OPS_BN, None, x) == 0
    fwd = pydnn.batch_normalization_forward_training_ex

    def args(**kw):
        a = dict(h=h, mode=SPATIAL, ops=OPS_ADD, alpha=1.0, beta=0.0, xd=x, x=X, zd=x, z=Z, yd=x, y=Y, bd=bd,
                 sc=SC, bi=BI, f=0.1, rm=RM, rv=RV, eps=1e-5, sm=SM, si=SI, act=relu, w=WS, wn=ws, r=RS, rn=rs)
        a.update(kw)
        return list(a.values())

    _check(fwd, args(), NOINIT, "")
    _check(fwd, args(ops=OPS_BN, zd=None, z=0, act=None, r=0, rn=0), NOINIT, "")
    _check(fwd, args(ops=3), BAD, "bnOps: 3 is not a pydnnBatchNormOps_t")
    _check(fwd, args(wn=ws - 1), BAD, f"workSpaceSizeInBytes: {ws - 1} is less than the {ws} bytes")
    _check(fwd, args(w=0), NULL, "workspace: NULL")
    _check(fwd, args(rn=rs - 1), BAD, f"reserveSpaceSizeInBytes: {rs - 1} is less than the {rs} bytes")
    _check(fwd, args(r=None), NULL, "reserveSpace: NULL")
    _check(fwd, args(rn=float("nan")), BAD, "reserveSpaceSizeInBytes: expected an integer")
    _check(fwd, args(wn=1.5), BAD, "workSpaceSizeInBytes: expected an integer")
    _check(fwd, args(zd=None), BAD, "zDesc: NULL, but bnOps BN_ADD_ACTIVATION needs it")
    _check(fwd, args(zd=_nhwc((4, 8, 3, 6))), BAD, "zDesc: dims")
    _check(fwd, args(z=0), NULL, "zData: NULL")
    _check(fwd, args(act=None), BAD, "activationDesc:")
    _check(fwd, args(ops=OPS_ACT, act=pydnn.create_activation_descriptor()), BAD, "activationDesc: descriptor was never set")
    tanh = pydnn.create_activation_descriptor()
    pydnn.set_activation_descriptor(tanh, pydnn.PYDNN_ACTIVATION_TANH, 0, 0.0)
    _check(fwd, args(ops=OPS_ACT, act=tanh), NS, "activationDesc: mode 2 is not fused")
    _check(fwd, args(eps=-1e-9), BAD, "epsilon:")
    _check(fwd, args(bd=_bn(x, PER_ACT)), BAD, "bnScaleBiasMeanVarDesc: dims")

    bwd = pydnn.batch_normalization_backward_ex
    bws = pydnn.get_batch_normalization_backward_ex_workspace_size(h, SPATIAL, OPS_ADD, x, x, x, x, x, bd, relu)
    assert bws > ws  # four partials per channel instead of two

    def bargs(**kw):
        a = dict(h=h, mode=SPATIAL, ops=OPS_ADD, ad=1.0, bd_=0.0, ap=1.0, bp=0.0, xd=x, x=X, yd=x, y=Y, dyd=x, dy=DY,
                 dzd=x, dz=DZ, dxd=x, dx=DX, bnd=bd, sc=SC, bi=BI, ds=RM, db=RV, eps=1e-5, sm=SM, si=SI, act=relu,
                 w=WS, wn=bws, r=RS, rn=rs)
        a.update(kw)
        return list(a.values())

    _check(bwd, bargs(), NOINIT, "")
    _check(bwd, bargs(yd=None, y=0), NOINIT, "")
    _check(bwd, bargs(wn=bws - 16), BAD, "workSpaceSizeInBytes:")
    _check(bwd, bargs(rn=0), BAD, "reserveSpaceSizeInBytes: 0 is less than")
    _check(bwd, bargs(dzd=None), BAD, "dzDesc: NULL")
    _check(bwd, bargs(dzd=_nhwc((4, 8, 3, 5), F16)), BAD, "dzDesc: data type")
    _check(bwd, bargs(yd=_nhwc((4, 8, 3, 4))), BAD, "yDesc: dims")
    _check(bwd, bargs(dxd=_nhwc((5, 8, 3, 5))), BAD, "dxDesc: dims")
    _check(bwd, bargs(ops=-1), BAD, "bnOps:")
    size = pydnn.get_batch_normalization_backward_ex_workspace_size
    _check(size, (h, SPATIAL, 9, x, x, x, x, x, bd, relu), BAD, "bnOps: 9")
    _check(size, (h, SPATIAL, OPS_BN, x, None, x, None, x, _bn(x, PER_ACT), None), BAD, "dBnScaleBiasDesc: dims")


# ----------------------------------------------------------------------------- kernel choice and sizes

def test_layouts_and_workspace():
    h = cpu_handle()
    nhwc = _nhwc((64, 256, 56, 56), BF16)
    layout, seqs, ws = B.plan_summary(h, "fwd", SPATIAL, nhwc, nhwc)
    rows1s = {"rows1s"} if tuning.batchnorm.FWD_APPLY_SAVED else set()  # (the 1-element rows' SC apply)
    assert layout == "rows" and set(seqs) == ({"rows8", "rows8p", "rows8s", "rows1", "gen"} if tuning.batchnorm.FAST16
                                              else {"rows8", "rows8s", "rows1", "gen"}) | rows1s
    names = [s[0] for s in seqs["rows8"]]
    assert names == ["fwd_stats", "fwd_final", "fwd_apply", "fwd_head_batched"] and ws == 0
    if tuning.batchnorm.FAST16:  # the plain forward: the same stats / final / head, fwd_apply_plain
        assert [s[0] for s in seqs["rows8p"]] == ["fwd_stats", "fwd_final", "fwd_apply_plain", "fwd_head_batched"]
        assert seqs["rows8p"][0] == seqs["rows8"][0] and seqs["rows8p"][3][2:] == seqs["rows8"][3][2:]
    stats, final, apply, head = seqs["rows8"]
    rows, feats = 64 * 56 * 56, 256
    chunk, chunks = stats[4]["chunk_rows"], stats[4]["chunks"]
    assert (chunks - 1) * chunk < rows <= chunks * chunk and stats[2][1] == chunks
    assert head[4] == {"row_begin": 0, "row_end": 8}  # 256 x 16 bytes of constants = 8 rows of bf16
    assert apply[4]["row_begin"] == 8 and apply[2][1] * apply[4]["chunk_rows"] >= rows - 8
    assert 256 + chunks * feats * 8 <= rows * feats * 2  # the partials fit in y after the constants
    # with saved statistics: the same stats / final, then fwd_apply_saved over every row (no head)
    assert [s[0] for s in seqs["rows8s"]] == ["fwd_stats", "fwd_final", "fwd_apply_saved"]
    assert seqs["rows8s"][:2] == seqs["rows8"][:2]
    saved = seqs["rows8s"][2]
    assert saved[4]["row_begin"] == 0 and saved[4]["row_end"] == rows
    assert (saved[2][1] - 1) * saved[4]["chunk_rows"] < rows <= saved[2][1] * saved[4]["chunk_rows"]
    _, seqs_ex, ws_ex = B.plan_summary(h, "fwd", SPATIAL, nhwc, nhwc, ex=True)
    assert [s[0] for s in seqs_ex["rows8"]] == ["fwd_stats", "fwd_final", "fwd_apply"] and ws_ex > 0
    relu = _relu()
    assert ws_ex == pydnn.get_batch_normalization_forward_training_ex_workspace_size(
        h, SPATIAL, OPS_ACT, nhwc, None, nhwc, _bn(nhwc), relu)
    # NCHW spatial: the gen geometry (the nc kernels, whose Ex workspace holds constants and partials; a block
    # per channel with NCHW_SPLIT off); per-activation on NCHW: rows of C*H*W
    nchw = _desc((8, 16, 10, 10), F32)
    assert B.plan_summary(h, "fwd", SPATIAL, nchw, nchw)[0] == "gen"
    assert pydnn.get_batch_normalization_forward_training_ex_workspace_size(
        h, SPATIAL, OPS_BN, nchw, None, nchw, _bn(nchw), None) == 0  # 800 rows: the forward keeps gen (NC_GEN_ROWS)
    try:
        tuning.batchnorm.NC_GEN_ROWS = 0
        assert pydnn.get_batch_normalization_forward_training_ex_workspace_size(
            h, SPATIAL, OPS_BN, nchw, None, nchw, _bn(nchw), None) == 256 + 16 * 8  # one item per channel
        tuning.batchnorm.NCHW_SPLIT = False
        assert pydnn.get_batch_normalization_forward_training_ex_workspace_size(
            h, SPATIAL, OPS_BN, nchw, None, nchw, _bn(nchw), None) == 0
    finally:
        tuning.batchnorm.reset()
    layout, seqs, _ = B.plan_summary(h, "fwd", PER_ACT, nchw, nchw)
    assert layout == "rows" and seqs["rows4"][0][1] == 4
    assert B.plan_summary(h, "fwd", PER_ACT, _nhwc((8, 16, 10, 10)), _nhwc((8, 16, 10, 10)))[0] == "gen"
    # H = W = 1: NCHW is rows too; C not a multiple of the vector: scalar rows only
    assert B.plan_summary(h, "fwd", SPATIAL, _desc((32, 24, 1, 1)), _desc((32, 24, 1, 1)))[0] == "rows"
    odd = _nhwc((3, 37, 5, 7), F16)
    layout, seqs, _ = B.plan_summary(h, "bwd", SPATIAL, odd, odd, odd)
    assert layout == "rows" and "rows8" not in seqs and "rows1" in seqs
    # padded y: no scratch in it (gen), but the Ex form still takes rows with the workspace
    padded = _desc((4, 8, 6, 6), F32, (6 * 6 * 12, 1, 6 * 12, 12))
    assert set(B.plan_summary(h, "fwd", SPATIAL, padded, padded)[1]) == {"gen"}
    assert "rows4" in B.plan_summary(h, "fwd", SPATIAL, padded, padded, ex=True)[1]
    # too many channels for the head block's shared memory: gen
    wide = _nhwc((2, 4096, 2, 2))
    assert set(B.plan_summary(h, "fwd", SPATIAL, wide, wide)[1]) == {"gen"}
    # x and y in different layouts: gen
    assert B.plan_summary(h, "fwd", SPATIAL, nhwc, _desc((64, 256, 56, 56), BF16))[0] == "gen"


def test_fast16_plans(monkeypatch):
    """FAST16: bf16 stats as one wave (STATS16_BLOCKS_PER_SM per SM, UNROLL16 rows in flight), the plain
    apply with UNROLL16 rows per step; f16 keeps the v2 stats; FAST16 off: the v2 plans."""
    nhwc = _nhwc((64, 256, 56, 56), BF16)
    h = cpu_handle()
    pl = B._make_plan(h, "bf16", B._geometry(SPATIAL, nhwc.dims, {B.OP_X: nhwc.strides, B.OP_Y: nhwc.strides}, 8),
                      "fwd", False)
    stats, _, apply, _ = pl.seqs["rows8p"]
    near = lambda n, want: want - want // 100 <= n <= want  # noqa: E731 - rows rounded to whole chunks
    assert stats.u == B.UNROLL16 and near(stats.grid[1], h.sm_count * B.STATS16_BLOCKS_PER_SM)
    assert apply.kernel == "fwd_apply_plain" and apply.u == B.UNROLL16 and apply.fields["chunk_rows"] == 8 * 8 * 4
    assert pl.seqs["rows8"][0].u == B.UNROLL16 and pl.seqs["rows8"][2].u is None
    assert pl.seqs["rows1"][0].u == B._rows1_u("bf16", 1)  # (ROWS1_U's rows in flight: test_batchnorm_record_cpu)
    half = _nhwc((64, 256, 56, 56), F16)
    pl = B._make_plan(h, "f16", B._geometry(SPATIAL, half.dims, {B.OP_X: half.strides, B.OP_Y: half.strides}, 8),
                      "fwd", False)
    assert pl.seqs["rows8p"][0].u is None and near(pl.seqs["rows8p"][0].grid[1], h.sm_count * B.BLOCKS_PER_SM)
    assert pl.seqs["rows8p"][2].kernel == "fwd_apply_plain"
    exprs = set(next(u for u in B.kernel_units() if u.name == "batchnorm.bf16").exprs)
    assert {B._expr(k, "bf16", 8, B.UNROLL16) for k in ("fwd_stats", "fwd_apply_plain")} <= exprs
    monkeypatch.setattr(tuning.batchnorm, "FAST16", False)
    _, seqs, _ = B.plan_summary(cpu_handle(), "fwd", SPATIAL, nhwc, nhwc)
    assert set(seqs) == {"rows8", "rows8s", "rows1", "gen"} | ({"rows1s"} if tuning.batchnorm.FWD_APPLY_SAVED else set())
    assert near(seqs["rows8"][0][2][1], h.sm_count * B.BLOCKS_PER_SM)


@pytest.mark.parametrize("apply_saved", [True, False])
def test_plain_forward_sequence_choice(monkeypatch, apply_saved):
    """The plain training forward takes fwd_apply_saved (no head) when the call keeps saved statistics and
    APPLY_SAVED is on, else fwd_apply_plain + the head (FAST16); z, ReLU, mask or blending keep the general
    sequence; scalar rows have no saved variant."""
    monkeypatch.setattr(tuning.batchnorm, "APPLY_SAVED", apply_saved)
    nhwc = _nhwc((8, 64, 7, 9), BF16)
    pl = B._make_plan(cpu_handle(), "bf16", B._geometry(SPATIAL, nhwc.dims, {B.OP_X: nhwc.strides,
                                                                             B.OP_Y: nhwc.strides}, 8), "fwd", False)
    names = lambda seq: [lc.kernel for lc in seq]  # noqa: E731
    with_save = B._pick_plain(pl, pl.seqs["rows8"], B.FLAG_SAVE)
    assert names(with_save) == (["fwd_stats", "fwd_final", "fwd_apply_saved"] if apply_saved
                                else ["fwd_stats", "fwd_final", "fwd_apply_plain", "fwd_head_batched"])
    assert names(B._pick_plain(pl, pl.seqs["rows8"], 0))[2:] == ["fwd_apply_plain", "fwd_head_batched"]
    for flag in (B.FLAG_BETA, B.FLAG_RELU, B.FLAG_Z):
        assert B._pick_plain(pl, pl.seqs["rows8"], B.FLAG_SAVE | flag) is pl.seqs["rows8"]
    # (scalar rows: rows1s, the SC apply over every row, FWD_APPLY_SAVED)
    assert B._pick_plain(pl, pl.seqs["rows1"], B.FLAG_SAVE) is pl.seqs.get("rows1s" if apply_saved else "rows1")
    exprs = set(next(u for u in B.kernel_units() if u.name == "batchnorm.bf16").exprs)
    assert B._expr("fwd_apply_saved", "bf16", 8) in exprs


def _chan_merge(parts):
    n = m = m2 = 0.0
    for nb, mb, m2b in parts:
        if nb == 0:
            continue
        nn = n + nb
        d = mb - m
        f = nb / nn
        m += d * f
        m2 += m2b + d * d * n * f
        n = nn
    return n, m, m2


@pytest.mark.parametrize("dims,dtype", [((64, 256, 56, 56), BF16), ((3, 37, 5, 7), F32), ((256, 8, 24, 24), F16),
                                        ((1, 3, 1, 1), F32)])
def test_chunked_statistics_match(dims, dtype, rng):
    """The stats / final split: per-chunk (mean, M2) merged in chunk order gives the batch statistics,
    also where the mean is far larger than the spread (no sum-of-squares cancellation)."""
    h = cpu_handle()
    d = _nhwc(dims, dtype)
    _, seqs, _ = B.plan_summary(h, "fwd", SPATIAL, d, d, ex=True)
    st = next(iter(v for k, v in seqs.items() if k != "gen"))[0][4]
    rows = dims[0] * int(np.prod(dims[2:]))
    x = 1000.0 + rng.standard_normal(rows).astype(np.float32)  # one channel
    parts = []
    for c in range(st["chunks"]):
        seg = x[c * st["chunk_rows"]:(c + 1) * st["chunk_rows"]].astype(np.float64)
        parts.append((len(seg), seg.mean(), ((seg - seg.mean()) ** 2).sum()))
    assert sum(p[0] for p in parts) == rows
    n, m, m2 = _chan_merge(parts)
    xd = x.astype(np.float64)
    assert n == rows
    assert abs(m - xd.mean()) <= 1e-12 * 1000
    assert abs(m2 / n - xd.var()) <= 1e-9 * max(xd.var(), 1e-30)


# ----------------------------------------------------------------------------- reference

@pytest.mark.parametrize("mode", [SPATIAL, PER_ACT])
def test_reference_backward_is_the_gradient(mode, rng):
    """The backward reference against central differences of the forward reference (recomputed stats)."""
    x = rng.standard_normal((3, 2, 2, 3))
    ps = ref.param_shape(mode, x.shape)
    scale, bias = rng.standard_normal(ps), rng.standard_normal(ps)
    w = rng.standard_normal(x.shape)  # loss = sum(w * y)
    eps = 1e-3

    def loss(xx, sc=scale, bi=bias):
        return (w * ref.forward_training(mode, 1.0, 0.0, xx, None, sc, bi, 1.0, None, None, eps)[0]).sum()

    dx, ds, db, _ = ref.backward(mode, 1.0, 0.0, 1.0, 0.0, x, w, None, scale, None, None, eps)
    h = 1e-6
    num = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[i] = h
        num[i] = (loss(x + e) - loss(x - e)) / (2 * h)
    np.testing.assert_allclose(dx, num, rtol=1e-6, atol=1e-7)
    num_s = np.zeros(ps)
    for i in np.ndindex(ps):
        e = np.zeros(ps)
        e[i] = h
        num_s[i] = (loss(x, scale + e) - loss(x, scale - e)) / (2 * h)
    np.testing.assert_allclose(ds, num_s, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(db, w.sum(axis=ref.axes(mode, 4), keepdims=True), rtol=1e-12)
    # with the saved statistics of the same batch: the same answer
    _, _, _, mean, invstd, _ = ref.forward_training(mode, 1.0, 0.0, x, None, scale, bias, 1.0, None, None, eps)
    dx2, ds2, _, _ = ref.backward(mode, 1.0, 0.0, 1.0, 0.0, x, w, None, scale, None, None, eps, mean, invstd)
    np.testing.assert_allclose(dx2, dx, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(ds2, ds, rtol=1e-12, atol=1e-14)


def test_reference_running_statistics():
    x = np.arange(2 * 2 * 1 * 2, dtype=np.float64).reshape(2, 2, 1, 2)
    rm, rv = np.full((1, 2, 1, 1), 1.0), np.full((1, 2, 1, 1), 2.0)
    _, nm, nv, mean, invstd, _ = ref.forward_training(SPATIAL, 1.0, 0.0, x, None, 1.0, 0.0, 0.25, rm, rv, 0.0)
    ch0 = np.array([0.0, 1.0, 4.0, 5.0])
    assert mean[0, 0, 0, 0] == ch0.mean() and np.isclose(invstd[0, 0, 0, 0], 1 / ch0.std())
    assert np.isclose(nm[0, 0, 0, 0], 0.75 * 1.0 + 0.25 * ch0.mean())
    assert np.isclose(nv[0, 0, 0, 0], 0.75 * 2.0 + 0.25 * ch0.var(ddof=1))  # unbiased, as cuDNN


def test_c_api_declared():
    from pydnn.capi import decl

    protos = "\n".join(decl.prototypes())
    for name in ("pydnnDeriveBNTensorDescriptor", "pydnnBatchNormalizationForwardTrainingEx",
                 "pydnnBatchNormalizationBackwardEx", "pydnnGetBatchNormalizationTrainingExReserveSpaceSize"):
        assert name + "(" in protos
    assert decl.NULLABLE["pydnnBatchNormalizationForwardTrainingEx"] == ("zDesc", "activationDesc")
