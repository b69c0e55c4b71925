"""Multi-head attention with projections on the CPU: the attention and sequence data descriptors (set / get /
destroy and every bad argument), the buffer sizes, the weight buffer's layout as GetMultiHeadAttnWeights
describes it, the calls' validation (status + the argument named), the window -> fused mask mapping, the
C marshalling of the new argument kinds (through cffi, without building the library), and the float64
reference (its gradients against finite differences; no-projection heads; beams)."""
import numpy as np
import pytest

import pydnn
from pydnn.ops import mha as M
from pydnn.reference import mha as R
from test_fuzz_cpu import _call, cpu_handle

F32, F16, BF16, F64 = pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DATA_HALF, pydnn.PYDNN_DATA_BFLOAT16, pydnn.PYDNN_DATA_DOUBLE
BAD, NS = pydnn.PYDNN_STATUS_BAD_PARAM, pydnn.PYDNN_STATUS_NOT_SUPPORTED
NULL, MIS = pydnn.PYDNN_STATUS_BAD_PARAM_NULL_POINTER, pydnn.PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER
NOINIT = pydnn.PYDNN_STATUS_NOT_INITIALIZED
O2O, BIAS = pydnn.PYDNN_ATTN_QUERYMAP_ONE_TO_ONE, pydnn.PYDNN_ATTN_ENABLE_PROJ_BIASES
T_, B_, M_, V_ = (pydnn.PYDNN_SEQDATA_TIME_DIM, pydnn.PYDNN_SEQDATA_BATCH_DIM, pydnn.PYDNN_SEQDATA_BEAM_DIM,
                  pydnn.PYDNN_SEQDATA_VECT_DIM)
BMTV = (B_, M_, T_, V_)
TBMV = (T_, B_, M_, V_)
ADD, SET = pydnn.PYDNN_WGRAD_MODE_ADD, pydnn.PYDNN_WGRAD_MODE_SET
QP, KP, VP, OP, W, WS, RS, LQ, LK, RES, DQ, DK, DV, DW = (i << 36 for i in range(1, 15))


def _check(fn, args, status, needle):
    st = _call(fn, *args)
    msg = pydnn.get_last_error_string()
    assert st == status, (st, msg)
    assert needle in msg, msg


def _attn(mode=O2O | BIAS, heads=2, dt=BF16, sizes=(40, 24, 20), proj=(64, 64, 64, 48), maxima=(10, 12, 3, 2),
          comp=F32, drop=(None, None), sm=0.125):
    a = pydnn.create_attn_descriptor()
    pydnn.set_attn_descriptor(a, mode, heads, sm, dt, comp, pydnn.PYDNN_TENSOR_OP_MATH, *drop, *sizes, *proj,
                              *maxima)
    return a


def _seq(t, b, m, v, axes=BMTV, lens=None, dt=BF16, fill=None):
    d = pydnn.create_seq_data_descriptor()
    dims = [0] * 4
    dims[T_], dims[B_], dims[M_], dims[V_] = t, b, m, v
    lens = [t] * (b * m) if lens is None else lens
    pydnn.set_seq_data_descriptor(d, dt, 4, dims, axes, len(lens), lens, fill)
    return d


# ----------------------------------------------------------------------------- the attention descriptor

def test_attn_descriptor_set_get_destroy():
    a = _attn()
    got = pydnn.get_attn_descriptor(a)
    assert got == (O2O | BIAS, 2, 0.125, BF16, F32, pydnn.PYDNN_TENSOR_OP_MATH, None, None, 40, 24, 20, 64, 64, 64,
                   48, 10, 12, 3, 2)
    pydnn.destroy_attn_descriptor(a)
    pydnn.destroy_attn_descriptor(None)
    _check(pydnn.get_attn_descriptor, (a,), BAD, "attnDesc: not a live multi-head attention descriptor")
    _check(pydnn.get_attn_descriptor, (pydnn.create_attn_descriptor(),), BAD, "attnDesc: descriptor was never set")


def test_attn_descriptor_keeps_dropout_descriptors():
    d = pydnn.create_dropout_descriptor()
    pydnn.set_dropout_descriptor(d, cpu_handle(), 0.25, None, 0, 9)
    a = _attn(drop=(d, None))
    assert pydnn.get_attn_descriptor(a)[6] is d and pydnn.get_attn_descriptor(a)[7] is None


_GOOD = [O2O | BIAS, 2, 0.125, BF16, F32, 1, None, None, 40, 24, 20, 64, 64, 64, 48, 10, 12, 3, 2]


@pytest.mark.parametrize("i,value,status,needle", [
    (0, 4, BAD, "attnMode: 0x4 has bits other than"),
    (1, 0, BAD, "nHeads: 0 must be positive"),
    (2, -1.0, BAD, "smScaler: -1.0 must be finite and not negative"),
    (2, float("nan"), BAD, "smScaler: nan"),
    (3, 77, BAD, "dataType: 77 is not a pydnnDataType_t value"),
    (3, pydnn.PYDNN_DATA_INT8, NS, "dataType: data type 3 is not supported by multi-head attention"),
    (4, F16, BAD, "computePrec: 2 cannot compute dataType 9"),
    (5, 9, BAD, "mathType: 9 is not a pydnnMathType_t value"),
    (6, "x", BAD, "attnDropoutDesc: not a live dropout descriptor"),
    (7, "x", BAD, "postDropoutDesc: not a live dropout descriptor"),
    (8, 0, BAD, "qSize: 0 must be positive"),
    (9, -3, BAD, "kSize: -3 must be positive"),
    (10, 0, BAD, "vSize: 0 must be positive"),
    (11, -1, BAD, "qProjSize: -1 must be 0 (no projection) or positive"),
    (12, 32, BAD, "kProjSize: 32 differs from qProjSize 64"),
    (14, -2, BAD, "oProjSize: -2"),
    (15, 0, BAD, "qoMaxSeqLength: 0 must be positive"),
    (16, 0, BAD, "kvMaxSeqLength: 0"),
    (17, 0, BAD, "maxBatchSize: 0"),
    (18, 0, BAD, "maxBeamSize: 0"),
    (1, 2.0, BAD, "nHeads: expected an integer"),
])
def test_attn_descriptor_bad_arguments(i, value, status, needle):
    args = list(_GOOD)
    args[i] = value
    a = pydnn.create_attn_descriptor()
    _check(pydnn.set_attn_descriptor, [a] + args, status, needle)
    assert not a.is_set
    _check(pydnn.set_attn_descriptor, ["a"] + _GOOD, BAD, "attnDesc: not a live")


def test_attn_descriptor_no_projection_needs_equal_q_k_sizes():
    args = list(_GOOD)
    args[11] = args[12] = 0
    _check(pydnn.set_attn_descriptor, [pydnn.create_attn_descriptor()] + args, BAD,
           "kSize: 24 differs from qSize 40 and there are no Q / K projections")
    args[9] = 40
    pydnn.set_attn_descriptor(pydnn.create_attn_descriptor(), *args)


def test_unset_dropout_descriptor_is_refused():
    d = pydnn.create_dropout_descriptor()
    args = list(_GOOD)
    args[6] = d
    _check(pydnn.set_attn_descriptor, [pydnn.create_attn_descriptor()] + args, BAD,
           "attnDropoutDesc: dropout descriptor was never set")


# ----------------------------------------------------------------------------- sequence data

def test_seq_data_set_get_destroy():
    d = _seq(7, 3, 2, 40, axes=TBMV, lens=[7, 1, 0, 5, 6, 7], fill=-1.5)
    dims = [0] * 4
    dims[T_], dims[B_], dims[M_], dims[V_] = 7, 3, 2, 40
    assert pydnn.get_seq_data_descriptor(d, 4, 6) == (BF16, 4, dims, list(TBMV), 6, [7, 1, 0, 5, 6, 7], -1.5)
    assert pydnn.get_seq_data_descriptor(d, 2, 3)[2:6] == (dims[:2], list(TBMV)[:2], 6, [7, 1, 0])
    # packed strides in the axes' order (TIME outermost here), in elements
    assert d.strides[V_] == 1 and d.strides[M_] == 40 and d.strides[B_] == 80 and d.strides[T_] == 240
    pydnn.destroy_seq_data_descriptor(d)
    pydnn.destroy_seq_data_descriptor(None)
    _check(pydnn.get_seq_data_descriptor, (d, 4, 6), BAD, "seqDataDesc: not a live sequence data descriptor")
    _check(pydnn.get_seq_data_descriptor, (pydnn.create_seq_data_descriptor(), 4, 6), BAD, "never set")


@pytest.mark.parametrize("change,status,needle", [
    (dict(dt=pydnn.PYDNN_DATA_INT32), NS, "dataType: data type 4 is not supported"),
    (dict(nb=3), BAD, "nbDims: 3 must be PYDNN_SEQDATA_DIM_COUNT (4)"),
    (dict(dims=[5, 0, 2, 8]), BAD, "dimA[1]: 0 must be positive"),
    (dict(axes=[0, 1, 1, 3]), BAD, "axes: [0, 1, 1, 3] names an axis twice"),
    (dict(axes=[0, 1, 3, 2]), BAD, "axes[3]: 2; the vectors must be innermost"),
    (dict(axes=[0, 1, 2, 7]), BAD, "axes[3]: 7 is not a pydnnSeqDataAxis_t value"),
    (dict(n=5), BAD, "seqLengthArraySize: 5 must be batch * beam = 6"),
    (dict(lens=[5, 5, 6, 5, 5, 5]), BAD, "seqLengthArray[2]: 6 is outside [0, 5]"),
    (dict(lens=[5, -1, 5, 5, 5, 5]), BAD, "seqLengthArray[1]: -1"),
    (dict(lens=[5, 5]), BAD, "seqLengthArray: has 2 entries, 6 are needed"),
    (dict(fill="x"), BAD, "paddingFill: expected a number"),
])
def test_seq_data_bad_arguments(change, status, needle):
    a = dict(dt=BF16, nb=4, dims=[5, 3, 2, 8], axes=list(BMTV), n=6, lens=[5] * 6, fill=None)
    a.update(change)
    d = pydnn.create_seq_data_descriptor()
    _check(pydnn.set_seq_data_descriptor, (d, a["dt"], a["nb"], a["dims"], a["axes"], a["n"], a["lens"], a["fill"]),
           status, needle)
    assert not d.is_set


# ----------------------------------------------------------------------------- buffers and weights

def test_buffer_sizes():
    a = _attn()  # heads 2, sizes 40 / 24 / 20, projections 64 / 64 / 64 / 48, maxima T 10 / 12, B 3, M 2
    wsize, ws, rs = pydnn.get_multi_head_attn_buffers(cpu_handle(), a)
    up = M._up
    regs = [2 * 64 * 40 * 2, 2 * 64 * 24 * 2, 2 * 64 * 20 * 2, 48 * 128 * 2, 128 * 2, 128 * 2, 128 * 2, 48 * 2]
    assert wsize == sum(up(r) for r in regs)
    nq, nk = 3 * 2 * 10, 3 * 2 * 12  # ONE_TO_ONE: K / V have the query beams
    qp, kp, ao, lse = nq * 128 * 2, nk * 128 * 2, nq * 128 * 2, 3 * 2 * 2 * 10 * 4
    assert rs == 2 * (up(qp) + 2 * up(kp)) + up(ao) + up(lse)
    assert ws == max(up(qp) + 2 * up(kp) + up(ao), up(up(ao) + lse), up(nk * 2) + up(nq * 2))
    # ALL_TO_ONE: K / V have one beam
    b = _attn(mode=BIAS)
    assert pydnn.get_multi_head_attn_buffers(cpu_handle(), b)[2] < rs
    _check(pydnn.get_multi_head_attn_buffers, (cpu_handle(), "a"), BAD, "attnDesc: not a live")


def test_weights_layout_is_described_truthfully():
    """Every existing kind lies inside the buffer, 256-byte aligned, without overlap; the descriptors
    say the dims and strides of the documented layout."""
    h, a = cpu_handle(), _attn()
    wsize = pydnn.get_multi_head_attn_buffers(h, a)[0]
    base = 1 << 40
    spans = []
    expect = {M.QW: ((2, 64, 40), (64 * 40, 40, 1)), M.KW: ((2, 64, 24), (64 * 24, 24, 1)),
              M.VW: ((2, 64, 20), (64 * 20, 20, 1)), M.OW: ((2, 48, 64), (64, 128, 1)),
              M.QB: ((2, 64, 1), (64, 1, 1)), M.KB: ((2, 64, 1), (64, 1, 1)), M.VB: ((2, 64, 1), (64, 1, 1)),
              M.OB: ((1, 48, 1), (48, 1, 1))}
    for kind, (dims, strides) in expect.items():
        wd = pydnn.create_tensor_descriptor()
        addr = pydnn.get_multi_head_attn_weights(h, a, kind, wsize, base, wd)
        assert (addr - base) % 256 == 0
        assert pydnn.get_tensor_nd_descriptor(wd, 3) == (BF16, 3, list(dims), list(strides))
        spans.append((addr, addr + pydnn.get_tensor_size_in_bytes(wd)))
    spans.sort()
    assert spans[0][0] == base and spans[-1][1] <= base + wsize
    assert all(x[1] <= y[0] for x, y in zip(spans, spans[1:]))


def test_weights_absent_kinds_are_null():
    h = cpu_handle()
    a = _attn(mode=O2O, sizes=(40, 40, 20), proj=(0, 0, 64, 0))  # no biases, only V projected
    wsize = pydnn.get_multi_head_attn_buffers(h, a)[0]
    assert wsize == M._up(2 * 64 * 20 * 2)
    wd = pydnn.create_tensor_descriptor()
    for kind in (M.QW, M.KW, M.OW, M.QB, M.KB, M.VB, M.OB):
        assert pydnn.get_multi_head_attn_weights(h, a, kind, wsize, 1 << 40, wd) == 0
    assert not wd.is_set  # left as it was
    assert pydnn.get_multi_head_attn_weights(h, a, M.VW, wsize, 1 << 40, wd) == 1 << 40
    assert a.o_size == 2 * 64  # the heads concatenated


def test_weights_bad_arguments():
    h, a = cpu_handle(), _attn()
    wsize = pydnn.get_multi_head_attn_buffers(h, a)[0]
    wd = pydnn.create_tensor_descriptor()
    f = pydnn.get_multi_head_attn_weights
    _check(f, (h, a, 8, wsize, W, wd), BAD, "wKind: 8 is not a pydnnMultiHeadAttnWeightKind_t value")
    _check(f, (h, a, M.QW, wsize - 1, W, wd), BAD, f"weightSizeInBytes: {wsize - 1} is less than the {wsize} bytes")
    _check(f, (h, a, M.QW, wsize, None, wd), NULL, "weights: NULL pointer")
    _check(f, (h, a, M.QW, wsize, W, "x"), BAD, "wDesc: not a live tensor descriptor")


# ----------------------------------------------------------------------------- the calls' validation

class Setup:
    """A valid ONE_TO_ONE problem (heads 2, projections 64, T 10 / 12, B 3, M 2) and its argument lists."""

    def __init__(self, a=None, q=None, k=None, v=None, o=None, lens_q=None, lens_k=None):
        self.a = a or _attn()
        self.q = q or _seq(10, 3, 2, 40, lens=lens_q)
        self.k = k or _seq(12, 3, 2, 24, lens=lens_k)
        self.v = v or _seq(12, 3, 2, 20, lens=lens_k)
        self.o = o or _seq(10, 3, 2, 48, lens=lens_q)
        self.h = cpu_handle()
        self.wsize, self.wssize, self.rssize = pydnn.get_multi_head_attn_buffers(self.h, self.a)
        self.lo, self.hi = [0] * 10, [12] * 10

    def fwd(self, **kw):
        d = dict(curr=-1, lo=self.lo, hi=self.hi, lq=LQ, lk=LK, q=self.q, qp=QP, res=None, k=self.k, kp=KP,
                 v=self.v, vp=VP, o=self.o, op=OP, wsize=self.wsize, w=W, wssize=self.wssize, ws=WS,
                 rssize=self.rssize, rs=RS)
        d.update(kw)
        return (self.h, self.a, d["curr"], d["lo"], d["hi"], d["lq"], d["lk"], d["q"], d["qp"], d["res"], d["k"],
                d["kp"], d["v"], d["vp"], d["o"], d["op"], d["wsize"], d["w"], d["wssize"], d["ws"], d["rssize"],
                d["rs"])

    def bwd_data(self, **kw):
        d = dict(lo=self.lo, hi=self.hi, lq=LQ, lk=LK, do=self.o, dout=OP, dq=self.q, dqp=DQ, qp=QP, dk=self.k,
                 dkp=DK, kp=KP, dv=self.v, dvp=DV, vp=VP, wsize=self.wsize, w=W, wssize=self.wssize, ws=WS,
                 rssize=self.rssize, rs=RS)
        d.update(kw)
        return (self.h, self.a, d["lo"], d["hi"], d["lq"], d["lk"], d["do"], d["dout"], d["dq"], d["dqp"], d["qp"],
                d["dk"], d["dkp"], d["kp"], d["dv"], d["dvp"], d["vp"], d["wsize"], d["w"], d["wssize"], d["ws"],
                d["rssize"], d["rs"])

    def bwd_w(self, **kw):
        d = dict(mode=ADD, q=self.q, qp=QP, k=self.k, kp=KP, v=self.v, vp=VP, do=self.o, dout=OP,
                 wsize=self.wsize, w=W, dw=DW, wssize=self.wssize, ws=WS, rssize=self.rssize, rs=RS)
        d.update(kw)
        return (self.h, self.a, d["mode"], d["q"], d["qp"], d["k"], d["kp"], d["v"], d["vp"], d["do"], d["dout"],
                d["wsize"], d["w"], d["dw"], d["wssize"], d["ws"], d["rssize"], d["rs"])


VALID_END = (NOINIT, NS)  # all checks passed: the CPU handle refuses at kernel lookup (or matmul is absent)


def _valid(fn, args):
    st = _call(fn, *args)
    msg = pydnn.get_last_error_string()
    assert st in VALID_END, (st, msg)
    if st == NS:
        assert "pydnn.ops.matmul" in msg, msg


def test_valid_calls_pass_validation():
    s = Setup()
    _valid(pydnn.multi_head_attn_forward, s.fwd())  # training
    _valid(pydnn.multi_head_attn_forward, s.fwd(rs=None, rssize=0))  # inference, all steps
    _valid(pydnn.multi_head_attn_forward, s.fwd(rs=None, rssize=0, curr=4))  # inference, one step
    _valid(pydnn.multi_head_attn_backward_data, s.bwd_data())
    _valid(pydnn.multi_head_attn_backward_weights, s.bwd_w())
    _valid(pydnn.multi_head_attn_backward_weights, s.bwd_w(mode=SET))
    # TIME-outer layout; causal windows; residuals (oSize = qSize)
    r = Setup(a=_attn(proj=(64, 64, 64, 40)), q=_seq(10, 3, 2, 40, axes=TBMV), k=_seq(12, 3, 2, 24, axes=TBMV),
              v=_seq(12, 3, 2, 20, axes=TBMV), o=_seq(10, 3, 2, 40, axes=TBMV))
    _valid(pydnn.multi_head_attn_forward, r.fwd(hi=[t + 1 for t in range(10)], res=RES))


@pytest.mark.parametrize("kw,status,needle", [
    (dict(curr=10, rs=None, rssize=0), BAD, "currIdx: 10 is past qDesc's last time-step 9"),
    (dict(curr=3), BAD, "currIdx: 3; training (reserveSpace given) computes every time-step"),
    (dict(curr=1.0), BAD, "currIdx: expected an integer"),
    (dict(lo=[0] * 9), BAD, "loWinIdx: has 9 entries, 10 are needed"),
    (dict(hi=None), NULL, "hiWinIdx: NULL pointer"),
    (dict(hi=["x"] * 10), BAD, "hiWinIdx[0]: expected an integer"),
    (dict(curr=2, rs=None, rssize=0, lo=[12] * 10), BAD, "loWinIdx[2]: 12 is not below hiWinIdx[2] = 12"),
    (dict(q=_seq(10, 3, 2, 41)), BAD, "qDesc: dimA[PYDNN_SEQDATA_VECT_DIM] = 41, the attention descriptor's qSize is 40"),
    (dict(k=_seq(12, 3, 2, 20)), BAD, "kDesc: dimA[PYDNN_SEQDATA_VECT_DIM] = 20, the attention descriptor's kSize is 24"),
    (dict(o=_seq(10, 3, 2, 40)), BAD, "oDesc: dimA[PYDNN_SEQDATA_VECT_DIM] = 40"),
    (dict(q=_seq(10, 3, 2, 40, dt=F16)), BAD, "qDesc: data type 2 differs from attnDesc's dataType 9"),
    (dict(q=_seq(11, 3, 2, 40)), BAD, "qDesc: time 11 exceeds attnDesc's qoMaxSeqLength 10"),
    (dict(k=_seq(13, 3, 2, 24)), BAD, "kDesc: time 13 exceeds attnDesc's kvMaxSeqLength 12"),
    (dict(q=_seq(10, 4, 2, 40)), BAD, "qDesc: batch 4 exceeds attnDesc's maxBatchSize 3"),
    (dict(q=_seq(10, 3, 3, 40)), BAD, "qDesc: beam 3 exceeds attnDesc's maxBeamSize 2"),
    (dict(k=_seq(12, 2, 2, 24)), BAD, "kDesc: batch 2 differs from qDesc's 3"),
    (dict(k=_seq(12, 3, 1, 24)), BAD, "kDesc: beam 1 must be 2 (ONE_TO_ONE: one per query beam)"),
    (dict(v=_seq(11, 3, 2, 20)), BAD, "vDesc: dims"),
    (dict(v=_seq(12, 3, 2, 20, axes=TBMV)), BAD, "vDesc: dims"),
    (dict(v=_seq(12, 3, 2, 20, lens=[3] * 6)), BAD, "vDesc: seqLengthArray differs from kDesc's"),
    (dict(o=_seq(10, 3, 2, 48, lens=[3] * 6)), BAD, "oDesc: seqLengthArray differs from qDesc's"),
    (dict(q="q"), BAD, "qDesc: not a live sequence data descriptor"),
    (dict(res=RES), BAD, "residuals: need an output size equal to qSize (48 != 40)"),
    (dict(qp=None), NULL, "queries: NULL pointer"),
    (dict(kp=KP + 2), MIS, "keys: 0x"),
    (dict(op=None), NULL, "out: NULL pointer"),
    (dict(lq=None), NULL, "devSeqLengthsQO: NULL pointer"),
    (dict(lk=LK + 2), MIS, "devSeqLengthsKV: 0x"),
    (dict(w=None), NULL, "weights: NULL pointer"),
    (dict(wsize=100), BAD, "weightSizeInBytes: 100 is less than the"),
    (dict(rssize=100), BAD, "reserveSpaceSizeInBytes: 100 is less than the"),
    (dict(rs=None, rssize=0, wssize=10), BAD, "workSpaceSizeInBytes: 10 is less than the"),
    (dict(rs=None, rssize=0, ws=None), NULL, "workSpace: NULL pointer"),
    (dict(lo=[1] + [0] * 9), NS, "loWinIdx[0]: 1 > 0; the fused attention kernel has no window that starts after"),
    (dict(hi=[5] * 10), NS, "hiWinIdx[0]: 5; the fused attention kernel takes windows"),
])
def test_forward_bad_arguments(kw, status, needle):
    _check(pydnn.multi_head_attn_forward, Setup().fwd(**kw), status, needle)


@pytest.mark.parametrize("make,status,needle", [
    (lambda: Setup(a=_attn(dt=F32), q=_seq(10, 3, 2, 40, dt=F32), k=_seq(12, 3, 2, 24, dt=F32),
                   v=_seq(12, 3, 2, 20, dt=F32), o=_seq(10, 3, 2, 48, dt=F32)), NS, "attnDesc: dataType 0; the GPU path"),
    (lambda: Setup(a=_attn(proj=(80, 80, 80, 48))), NS, "attnDesc: qProjSize 80; the fused attention kernel takes"),
    (lambda: Setup(a=_attn(proj=(64, 64, 128, 48))), NS, "attnDesc: vProjSize 128 differs from qProjSize 64"),
    (lambda: Setup(a=_attn(sizes=(40, 40, 20), proj=(0, 0, 64, 48)), k=_seq(12, 3, 2, 40)), NS, "attnDesc: qProjSize 0 (no projection)"),
    (lambda: Setup(a=_attn(mode=BIAS), k=_seq(12, 3, 1, 24), v=_seq(12, 3, 1, 20)), NS,
     "qDesc: beam 2 with the ALL_TO_ONE query map"),
    (lambda: Setup(a=_attn(sm=0.0)), NS, "smScaler 0"),
])
def test_forward_not_supported(make, status, needle):
    s = make()
    _check(pydnn.multi_head_attn_forward, s.fwd(), status, needle)


def test_dropout_mapping():
    h = cpu_handle()
    d = pydnn.create_dropout_descriptor()
    pydnn.set_dropout_descriptor(d, h, 0.3, None, 0, 5)
    post = pydnn.create_dropout_descriptor()
    pydnn.set_dropout_descriptor(post, h, 0.1, None, 0, 5)
    _check(pydnn.multi_head_attn_forward, Setup(a=_attn(drop=(None, post))).fwd(), NS,
           "postDropoutDesc with a probability > 0 is not supported")
    _valid(pydnn.multi_head_attn_forward, Setup(a=_attn(drop=(d, None))).fwd())
    # TIME between BATCH and BEAM: (b, m) do not fold into one stride -> per-batch launches -> no dropout
    axes = (B_, T_, M_, V_)
    s = Setup(a=_attn(drop=(d, None)), q=_seq(10, 3, 2, 40, axes=axes), k=_seq(12, 3, 2, 24, axes=axes),
              v=_seq(12, 3, 2, 20, axes=axes), o=_seq(10, 3, 2, 48, axes=axes))
    _check(pydnn.multi_head_attn_forward, s.fwd(), NS, "attention dropout needs the batch and beam axes")
    _valid(pydnn.multi_head_attn_forward, s.fwd(rs=None, rssize=0))  # inference: no dropout, per-batch groups


@pytest.mark.parametrize("kw,status,needle", [
    (dict(rs=None), NULL, "reserveSpace: NULL; the backward needs the reserve space"),
    (dict(rssize=5), BAD, "reserveSpaceSizeInBytes: 5 is less than"),
    (dict(wssize=5), BAD, "workSpaceSizeInBytes: 5 is less than"),
    (dict(dq=_seq(10, 3, 2, 41)), BAD, "dqDesc: dimA[PYDNN_SEQDATA_VECT_DIM] = 41"),
    (dict(do=_seq(10, 3, 2, 40)), BAD, "doDesc: dimA[PYDNN_SEQDATA_VECT_DIM] = 40"),
    (dict(dk=_seq(12, 3, 1, 24)), BAD, "dkDesc: beam 1 must be 2"),
    (dict(dqp=None), NULL, "dqueries: NULL pointer"),
    (dict(dvp=DV + 8), MIS, "dvalues: 0x"),
    (dict(lq=None), NULL, "devSeqLengthsDQDO: NULL pointer"),
    (dict(lk=None), NULL, "devSeqLengthsDKDV: NULL pointer"),
    (dict(hi=[3] * 10), NS, "hiWinIdx[0]: 3"),
])
def test_backward_data_bad_arguments(kw, status, needle):
    _check(pydnn.multi_head_attn_backward_data, Setup().bwd_data(**kw), status, needle)


@pytest.mark.parametrize("kw,status,needle", [
    (dict(mode=2), BAD, "addGrad: 2 is not a pydnnWgradMode_t value"),
    (dict(rs=None), NULL, "reserveSpace: NULL"),
    (dict(dw=None), NULL, "dweights: NULL pointer"),
    (dict(dout=OP + 4), MIS, "dout: 0x"),
    (dict(do=_seq(10, 3, 2, 48, lens=[1] * 6)), BAD, "doDesc: seqLengthArray differs from qDesc's"),
    (dict(wssize=0), BAD, "workSpaceSizeInBytes: 0 is less than"),
])
def test_backward_weights_bad_arguments(kw, status, needle):
    _check(pydnn.multi_head_attn_backward_weights, Setup().bwd_w(**kw), status, needle)


# ----------------------------------------------------------------------------- windows -> fused mask

def _mask_of(lo, hi, lens_q=None, lens_k=None, curr=-1):
    s = Setup(lens_q=lens_q, lens_k=lens_k)
    c = M._validate(s.a, s.q, s.k, s.v, s.o)
    return M._fused_mask(c, lo, hi, curr)


def test_window_mapping():
    none, tl, br = (pydnn.PYDNN_ATTN_MASK_NONE, pydnn.PYDNN_ATTN_MASK_CAUSAL_TOP_LEFT,
                    pydnn.PYDNN_ATTN_MASK_CAUSAL_BOTTOM_RIGHT)
    assert _mask_of([0] * 10, [12] * 10) == (none, 12)
    assert _mask_of([-5] * 10, [10**6] * 10) == (none, 12)
    assert _mask_of([0] * 10, [t + 1 for t in range(10)]) == (tl, 12)
    # every K/V sequence 8 long: windows ending at 8 see every key
    assert _mask_of([0] * 10, [8] * 10, lens_k=[8] * 6) == (none, 12)
    # kv - q = 2 for every sequence: bottom-right
    assert _mask_of([0] * 10, [t + 3 for t in range(10)], lens_q=[7] * 6, lens_k=[9] * 6) == (br, 12)
    assert _mask_of([0] * 10, [t + 3 for t in range(10)])[0] == br  # full lengths 10 / 12
    with pytest.raises(pydnn.PydnnError, match="hiWinIdx"):  # differences that vary: not expressible
        _mask_of([0] * 10, [t + 3 for t in range(10)], lens_q=[7, 8, 7, 7, 7, 7], lens_k=[9] * 6)
    # one inference step: keys [0, hi)
    assert _mask_of([0] * 10, [4] * 10, curr=3) == (none, 4)
    assert _mask_of([0] * 10, [40] * 10, curr=3) == (none, 12)


def test_window_mapping_memo_keys_on_windows_and_lengths():
    """The mask is remembered per (windows, lengths): a later call with other windows or lengths on the same
    shapes gets its own answer, an error is raised every time, and a non-integer entry is still refused."""
    none, tl = pydnn.PYDNN_ATTN_MASK_NONE, pydnn.PYDNN_ATTN_MASK_CAUSAL_TOP_LEFT
    causal = [t + 1 for t in range(10)]
    for _ in range(2):
        assert _mask_of([0] * 10, causal) == (tl, 12)
        assert _mask_of([0] * 10, [12] * 10) == (none, 12)
        assert _mask_of([0] * 10, [8] * 10, lens_k=[8] * 6) == (none, 12)
        with pytest.raises(pydnn.PydnnError, match="hiWinIdx"):
            _mask_of([0] * 10, [8] * 10)  # full K/V lengths 12: a window ending at 8 is not expressible
    s = Setup()
    _valid(pydnn.multi_head_attn_forward, s.fwd(hi=causal))
    _check(pydnn.multi_head_attn_forward, s.fwd(hi=[float(v) for v in causal]), BAD,
           "hiWinIdx[0]: expected an integer, got float")
    _check(pydnn.multi_head_attn_forward, s.fwd(hi=causal[:5] + [True] + causal[6:]), BAD,
           "hiWinIdx[5]: expected an integer, got bool")


def test_groups_fold_batch_and_beam():
    s = Setup()  # BMTV: batch just outside beam
    c = M._validate(s.a, s.q, s.k, s.v, s.o)
    assert M._groups(c) == [(0, 6, 0, 0, 10, 12)]
    axes = (B_, T_, M_, V_)
    s = Setup(q=_seq(10, 3, 2, 40, axes=axes), k=_seq(12, 3, 2, 24, axes=axes), v=_seq(12, 3, 2, 20, axes=axes),
              o=_seq(10, 3, 2, 48, axes=axes))
    c = M._validate(s.a, s.q, s.k, s.v, s.o)
    assert M._groups(c) == [(0, 2, 0, 0, 1, 1), (2, 2, 20, 24, 1, 1), (4, 2, 40, 48, 1, 1)]


# ----------------------------------------------------------------------------- C marshalling (cffi, no library)

@pytest.fixture
def capi(monkeypatch):
    """impl's tables with this family's types and NULLABLE entries (until the manifest lists the family)."""
    from pydnn.capi import impl
    monkeypatch.setattr(impl, "OPAQUE", impl.OPAQUE | {t for t, _ in M.C_OPAQUE_TYPES})
    monkeypatch.setattr(impl, "NULLABLE", {**impl.NULLABLE, **M.C_NULLABLE})
    return _ffi()


def _ffi():
    cffi = pytest.importorskip("cffi")
    ffi = cffi.FFI()
    ffi.cdef("typedef int pydnnDataType_t; typedef int pydnnSeqDataAxis_t; typedef int pydnnMathType_t;"
             "typedef void *pydnnSeqDataDescriptor_t; typedef void *pydnnAttnDescriptor_t;"
             "typedef void *pydnnDropoutDescriptor_t; typedef void *pydnnHandle_t;")
    return ffi


def _proto(c_name):
    for _, entries in M.C_API:
        for proto, _doc in entries:
            if f" {c_name}(" in proto:
                return proto
    raise KeyError(c_name)


def test_c_marshalling_seq_data_and_fill(capi):
    from pydnn.capi import impl
    ffi = capi
    d = pydnn.create_seq_data_descriptor()
    h = ffi.new_handle(d)
    impl._objects[int(ffi.cast("uintptr_t", h))] = (h, d)
    try:
        set_c = impl.Marshal(ffi, _proto("pydnnSetSeqDataDescriptor"))
        dims = ffi.new("int[4]", [0] * 4)
        dims[T_], dims[B_], dims[M_], dims[V_] = 5, 3, 4, 8
        lens = list(range(12))
        lens = [x % 6 for x in lens]
        fill = ffi.new("unsigned short *", 0x3E00)  # 1.5 in half
        set_c(h, F16, 4, dims, ffi.new("int[4]", list(TBMV)), 12, ffi.new("int[12]", lens), fill)
        assert d.lengths == tuple(lens) and d.fill == 1.5  # 12 lengths: not capped at PYDNN_DIM_MAX
        get_c = impl.Marshal(ffi, _proto("pydnnGetSeqDataDescriptor"))
        dt, nb, dim_out, ax_out = ffi.new("int *"), ffi.new("int *"), ffi.new("int[4]"), ffi.new("int[4]")
        n, lens_out, fill_out = ffi.new("size_t *"), ffi.new("int[12]", [-1] * 12), ffi.new("unsigned short *")
        get_c(h, dt, nb, 4, dim_out, ax_out, n, 10, lens_out, fill_out)
        assert (dt[0], nb[0], list(dim_out), list(ax_out), n[0]) == (F16, 4, list(dims), list(TBMV), 12)
        assert list(lens_out) == lens[:10] + [-1, -1]  # seqLengthSizeRequested entries, no more
        assert fill_out[0] == 0x3E00
        get_c(h, dt, nb, 4, dim_out, ax_out, n, 12, lens_out, ffi.NULL)  # paddingFill NULL: not returned
        set_c(h, F16, 4, dims, ffi.new("int[4]", list(TBMV)), 12, ffi.new("int[12]", lens), ffi.NULL)
        assert d.fill is None
    finally:
        impl._objects.pop(int(ffi.cast("uintptr_t", h)), None)


def test_c_marshalling_attn_getters_and_null_outputs(capi):
    from pydnn.capi import impl
    ffi = capi
    a = _attn()
    ha = ffi.new_handle(a)
    impl._objects[int(ffi.cast("uintptr_t", ha))] = (ha, a)
    hh_obj = cpu_handle()
    hh = ffi.new_handle(hh_obj)
    impl._objects[int(ffi.cast("uintptr_t", hh))] = (hh, hh_obj)
    try:
        get_c = impl.Marshal(ffi, _proto("pydnnGetAttnDescriptor"))
        outs = [ffi.new(t) for t in ["unsigned *", "int *", "double *", "int *", "int *", "int *",
                                     "pydnnDropoutDescriptor_t *", "pydnnDropoutDescriptor_t *"] + ["int *"] * 11]
        outs[6][0] = outs[7][0] = ffi.cast("void *", 1)
        get_c(ha, *outs)
        assert outs[6][0] == ffi.NULL and outs[7][0] == ffi.NULL  # no dropout descriptors: NULL
        assert [o[0] for o in outs[8:]] == [40, 24, 20, 64, 64, 64, 48, 10, 12, 3, 2]
        buf_c = impl.Marshal(ffi, _proto("pydnnGetMultiHeadAttnBuffers"))
        w, ws = ffi.new("size_t *"), ffi.new("size_t *")
        buf_c(hh, ha, w, ws, ffi.NULL)  # reserveSpaceSizeInBytes NULL: inference, not returned
        assert (w[0], ws[0]) == pydnn.get_multi_head_attn_buffers(hh_obj, a)[:2]
        with pytest.raises(pydnn.PydnnError, match="workSpaceSizeInBytes: NULL"):
            buf_c(hh, ha, w, ffi.NULL, ffi.NULL)
        # the forward reads loWinIdx / hiWinIdx (no count argument) as qoMaxSeqLength host ints
        fwd_c = impl.Marshal(ffi, _proto("pydnnMultiHeadAttnForward"))
        assert [k for k, _, n in fwd_c.params if n in ("loWinIdx", "hiWinIdx")] == ["arr_in", "arr_in"]
        s = Setup(a=a)
        sh = []
        for obj in (s.q, s.k, s.v, s.o):
            x = ffi.new_handle(obj)
            impl._objects[int(ffi.cast("uintptr_t", x))] = (x, obj)
            sh.append(x)
        lo, hi = ffi.new("int[10]", [0] * 10), ffi.new("int[10]", [1] * 9 + [7])
        with pytest.raises(pydnn.PydnnError, match=r"hiWinIdx\[1\]: 1;"):
            fwd_c(hh, ha, -1, lo, hi, ffi.cast("void *", LQ), ffi.cast("void *", LK), sh[0], ffi.cast("void *", QP),
                  ffi.NULL, sh[1], ffi.cast("void *", KP), sh[2], ffi.cast("void *", VP), sh[3],
                  ffi.cast("void *", OP), s.wsize, ffi.cast("void *", W), s.wssize, ffi.cast("void *", WS),
                  s.rssize, ffi.cast("void *", RS))
        for x in sh:
            impl._objects.pop(int(ffi.cast("uintptr_t", x)), None)
    finally:
        impl._objects.pop(int(ffi.cast("uintptr_t", ha)), None)
        impl._objects.pop(int(ffi.cast("uintptr_t", hh)), None)


def test_c_getter_returns_the_dropout_descriptor_the_caller_holds(capi):
    from pydnn.capi import impl
    ffi = capi
    d = pydnn.create_dropout_descriptor()
    pydnn.set_dropout_descriptor(d, cpu_handle(), 0.5, None, 0, 1)
    hd = ffi.new_handle(d)
    addr = int(ffi.cast("uintptr_t", hd))
    impl._objects[addr] = (hd, d)
    a = _attn(drop=(d, None))
    ha = ffi.new_handle(a)
    impl._objects[int(ffi.cast("uintptr_t", ha))] = (ha, a)
    try:
        outs = [ffi.new(t) for t in ["unsigned *", "int *", "double *", "int *", "int *", "int *",
                                     "pydnnDropoutDescriptor_t *", "pydnnDropoutDescriptor_t *"] + ["int *"] * 11]
        impl.Marshal(ffi, _proto("pydnnGetAttnDescriptor"))(ha, *outs)
        assert int(ffi.cast("uintptr_t", outs[6][0])) == addr
    finally:
        impl._objects.pop(addr, None)
        impl._objects.pop(int(ffi.cast("uintptr_t", ha)), None)


# ----------------------------------------------------------------------------- the reference

def _ref_problem(rng, proj=(3, 3, 2, 4), heads=2, sizes=(5, 4, 3), B=2, Mb=2, T=4, Tk=5, one_to_one=True,
                 biases=True):
    q = rng.uniform(-1, 1, (B, Mb, T, sizes[0]))
    mk = Mb if one_to_one else 1
    k = rng.uniform(-1, 1, (B, mk, Tk, sizes[1]))
    v = rng.uniform(-1, 1, (B, mk, Tk, sizes[2]))
    w = {}
    pq, pk, pv, po = proj
    for kind, p, n in ((R.QW, pq, sizes[0]), (R.KW, pk, sizes[1]), (R.VW, pv, sizes[2])):
        if p:
            w[kind] = rng.uniform(-1, 1, (heads, p, n))
            if biases:
                w[kind + 4] = rng.uniform(-1, 1, (heads, p))
    dv = pv or sizes[2]
    if po:
        w[R.OW] = rng.uniform(-1, 1, (heads, po, dv))
        if biases:
            w[R.OB] = rng.uniform(-1, 1, (po,))
    return q, k, v, w


@pytest.mark.parametrize("cfg", [
    dict(),
    dict(one_to_one=False),
    dict(proj=(0, 0, 2, 4), sizes=(4, 4, 3)),
    dict(proj=(3, 3, 0, 0), biases=False),
])
def test_reference_gradients_match_finite_differences(cfg, rng):
    q, k, v, w = _ref_problem(rng, **cfg)
    Mb = q.shape[1]
    lens_q = np.array([[4, 2], [3, 4]])[:, :Mb]
    lens_k = np.array([[5, 3], [4, 5]])[:, :k.shape[1]]
    lo, hi = [0, -1, 0, 1], [1, 3, 5, 4]
    dout_shape = R.forward(q, k, v, w, 2, 0.7, lo, hi, lens_q, lens_k)[0].shape
    g = rng.uniform(-1, 1, dout_shape)

    def loss(q_, k_, v_, w_):
        return (R.forward(q_, k_, v_, w_, 2, 0.7, lo, hi, lens_q, lens_k)[0] * g).sum()

    _, _, cache = R.forward(q, k, v, w, 2, 0.7, lo, hi, lens_q, lens_k)
    dq, dk, dv, dw = R.backward(q, k, v, w, 2, 0.7, lens_q, lens_k, g, cache)
    eps = 1e-6
    for name, x, dx in (("q", q, dq), ("k", k, dk), ("v", v, dv)):
        num = np.zeros_like(x)
        for i in np.ndindex(x.shape):
            xp, xm = x.copy(), x.copy()
            xp[i] += eps
            xm[i] -= eps
            args_p = {"q": (xp, k, v), "k": (q, xp, v), "v": (q, k, xp)}[name]
            args_m = {"q": (xm, k, v), "k": (q, xm, v), "v": (q, k, xm)}[name]
            num[i] = (loss(*args_p, w) - loss(*args_m, w)) / (2 * eps)
        np.testing.assert_allclose(dx, num, atol=1e-6, err_msg=name)
    for kind, x in w.items():
        num = np.zeros_like(x)
        for i in np.ndindex(x.shape):
            wp, wm = dict(w), dict(w)
            wp[kind], wm[kind] = x.copy(), x.copy()
            wp[kind][i] += eps
            wm[kind][i] -= eps
            num[i] = (loss(q, k, v, wp) - loss(q, k, v, wm)) / (2 * eps)
        np.testing.assert_allclose(dw[kind], num, atol=1e-6, err_msg=f"weight kind {kind}")


def test_reference_forward_by_hand(rng):
    """One head, no biases, identity-free check against a direct loop (the window and lengths included)."""
    q, k, v, w = _ref_problem(rng, proj=(3, 3, 2, 4), heads=1, B=1, Mb=1, biases=False)
    lo, hi = [0, 0, 1, 0], [2, 5, 4, 1]
    out, _, _ = R.forward(q, k, v, w, 1, 0.5, lo, hi, [[3]], [[4]])
    Q, K, V = q[0, 0] @ w[R.QW][0].T, k[0, 0] @ w[R.KW][0].T, v[0, 0] @ w[R.VW][0].T
    for t in range(4):
        if t >= 3:
            assert not out[0, 0, t].any()
            continue
        js = [j for j in range(lo[t], min(hi[t], 4))]
        s = np.array([0.5 * Q[t] @ K[j] for j in js])
        p = np.exp(s - s.max())
        p /= p.sum()
        head = sum(pj * V[j] for pj, j in zip(p, js))
        np.testing.assert_allclose(out[0, 0, t], w[R.OW][0] @ head, rtol=1e-12)


# ----------------------------------------------------------------------------- the orchestration, on numpy stand-ins
# The GPU path's plumbing (buffer layouts, row strides, offsets into the work / reserve space, per-batch
# launch groups, the order of the launches) run with numpy stand-ins for the kernels: a fake device memory,
# a GEMM with the interface of pydnn.ops.matmul, the fused attention through its float64 reference, and the
# tensor ops. A wrong offset or stride gives O(1) errors; the tolerance here only covers half-precision
# storage of the intermediates (the strict numerical checks are the GPU tests').

class _Arena:
    BASE = 1 << 40

    def __init__(self, nbytes=1 << 25):
        self.mem = np.zeros(nbytes, np.uint8)
        self.top = 0

    def alloc(self, nbytes):
        addr = self.BASE + self.top
        self.top += -(-max(nbytes, 1) // 256) * 256
        assert self.top <= self.mem.size
        return addr

    def view(self, addr, np_dtype, dims, strides):
        item = np.dtype(np_dtype).itemsize
        off = addr - self.BASE
        assert off >= 0 and off % item == 0
        flat = self.mem[off:].view(np_dtype)
        return np.lib.stride_tricks.as_strided(flat, tuple(dims), [s * item for s in strides])


class _FakeGemm:
    def __init__(self, arena, m, n, k, trans_a, trans_b, lda, ldb, ldc, bias):
        self.ar, self.shape, self.t, self.ld, self.has_bias = arena, (m, n, k), (trans_a, trans_b), (lda, ldb, ldc), bias

    def launch(self, handle, a, b, c, alpha=1.0, beta=0.0, bias=0):
        m, n, k = self.shape
        lda, ldb, ldc = self.ld
        v = self.ar.view
        A = v(a, np.float16, (k, m), (lda, 1)).T if self.t[0] else v(a, np.float16, (m, k), (lda, 1))
        B = v(b, np.float16, (n, k), (ldb, 1)).T if self.t[1] else v(b, np.float16, (k, n), (ldb, 1))
        C = v(c, np.float16, (m, n), (ldc, 1))
        r = alpha * (A.astype(np.float64) @ B.astype(np.float64))
        if beta:
            r += beta * C
        if self.has_bias:
            r += v(bias, np.float16, (n,), (1,))
        C[...] = r


def _install_fakes(monkeypatch, arena):
    import types
    from pydnn._cuda import driver
    from pydnn.ops import attention as FA
    from pydnn.ops import tensor_ops
    from pydnn.reference import attention as RA

    from pydnn.ops import matmul

    def plan(handle, dt, m, n, k, trans_a=False, trans_b=False, lda=None, ldb=None, ldc=None, bias=False, **kw):
        matmul.gemm_plan(handle, dt, m, n, k, trans_a, trans_b, lda, ldb, ldc, bias=bias, **kw)  # its checks
        return _FakeGemm(arena, m, n, k, trans_a, trans_b, lda, ldb, ldc, bias)

    mm = types.SimpleNamespace(gemm_plan=plan, cached_plan=plan)  # (mha plans through cached_plan)
    monkeypatch.setattr(M, "_matmul", lambda: mm)
    # the numpy stand-ins compute instead of launching: nothing for a recorded plan (pydnn/ops/_replay.py) to
    # record, so every call runs in full here (the plans are checked by tests/hard/test_call_path_cpu.py)
    monkeypatch.setattr(pydnn.tuning.callpath, "MHA_PLANS", False)

    def t(desc, ptr):
        return arena.view(ptr, np.float16 if desc.dtype == F16 else np.float32, desc.dims, desc.strides)

    def lens(ptr, n):
        return None if not ptr else arena.view(ptr, np.int32, (n,), (1,)).copy()

    def fwd(handle, a, qd, q, kd, k, vd, v, od, o, sd, s, lq, lk, ws, wss):
        b = qd.dims[0]
        out, lse, _, _ = RA.forward(t(qd, q), t(kd, k), t(vd, v), a.scale, a.mask, lens(lq, b), lens(lk, b))
        t(od, o)[...] = out
        if sd is not None:
            t(sd, s)[...] = lse[..., None]

    def bwd(handle, a, qd, q, kd, k, vd, v, od, o, dod, do, sd, s, dqd, dq, dkd, dk, dvd, dv, lq, lk, det, ws, wss):
        b = qd.dims[0]
        g = RA.backward(t(qd, q), t(kd, k), t(vd, v), t(dod, do), a.scale, a.mask, lens(lq, b), lens(lk, b))
        t(dqd, dq)[...], t(dkd, dk)[...], t(dvd, dv)[...] = g[:3]

    monkeypatch.setattr(FA, "attention_forward", fwd)
    monkeypatch.setattr(FA, "attention_backward", bwd)
    monkeypatch.setattr(tensor_ops, "set_tensor", lambda h, d, y, val: t(d, y).__setitem__(Ellipsis, val))
    monkeypatch.setattr(tensor_ops, "add_tensor",
                        lambda h, al, ad, A, be, cd, C: t(cd, C).__setitem__(Ellipsis, al * t(ad, A) + be * t(cd, C)))
    monkeypatch.setattr(driver, "memcpy_dtod_async",
                        lambda dst, src, n, stream=0: arena.mem.__setitem__(
                            slice(dst - arena.BASE, dst - arena.BASE + n),
                            arena.mem[src - arena.BASE:src - arena.BASE + n].copy()))


def _fake_seq(arena, rng, t, b, m, v, axes, lens, fill=None, random=True):
    d = _seq(t, b, m, v, axes=axes, lens=lens, dt=F16, fill=fill)
    ptr = arena.alloc(t * b * m * v * 2)
    st = d.strides
    view = arena.view(ptr, np.float16, (b, m, t, v), (st[B_], st[M_], st[T_], 1))
    if random:
        view[...] = rng.uniform(-1, 1, view.shape)
    else:
        view[...] = np.nan
    return d, ptr, view


FAKE_CASES = {
    "bmtv-o2o-lens": dict(axes=BMTV, m=2, lq=[9, 4, 1, 7], lk=[11, 6, 3, 11], hi="full", o_proj=24),
    "tbmv-all2one-causal-residual-fill": dict(axes=TBMV, m=1, lq=[9, 5], lk=[11, 8], hi="tl", o_proj=40,
                                              residual=True, fill=-3.0, biases=False),
    "btmv-groups-bottomright-concat": dict(axes=(B_, T_, M_, V_), m=2, lq=[6, 9, 3, 5], lk=[8, 11, 5, 7], hi="br",
                                           o_proj=0),
}


@pytest.mark.parametrize("name", list(FAKE_CASES))
def test_orchestration_with_numpy_kernels(monkeypatch, rng, name):
    cfg = FAKE_CASES[name]
    arena = _Arena()
    _install_fakes(monkeypatch, arena)
    H, D, sizes, b, m, tq, tk = 2, 64, (40, 24, 16), 2, cfg["m"], 9, 11
    o2o = m > 1
    mk = m if o2o else 1
    a = _attn(mode=(O2O if o2o else 0) | (0 if cfg.get("biases") is False else BIAS), dt=F16, heads=H, sizes=sizes,
              proj=(D, D, D, cfg["o_proj"]), maxima=(tq, tk, b, m))
    h = cpu_handle()
    wsize, wssize, rssize = pydnn.get_multi_head_attn_buffers(h, a)
    wptr, dwptr, ws, rs = arena.alloc(wsize), arena.alloc(wsize), arena.alloc(wssize), arena.alloc(rssize)
    weights = {}
    for kind in M.KINDS:
        wd = pydnn.create_tensor_descriptor()
        addr = pydnn.get_multi_head_attn_weights(h, a, kind, wsize, wptr, wd)
        if addr:
            view = arena.view(addr, np.float16, wd.dims, wd.strides)
            view[...] = rng.uniform(-1, 1, wd.dims) / 4
            val = view.astype(np.float64)
            weights[kind] = val[..., 0] if kind in (M.QB, M.KB, M.VB) else (val.reshape(-1) if kind == M.OB else val)
    osize = a.o_size
    q, qp, qv = _fake_seq(arena, rng, tq, b, m, sizes[0], cfg["axes"], cfg["lq"])
    k, kp, kv = _fake_seq(arena, rng, tk, b, mk, sizes[1], cfg["axes"], cfg["lk"])
    v, vp, vv = _fake_seq(arena, rng, tk, b, mk, sizes[2], cfg["axes"], cfg["lk"])
    o, op, ov = _fake_seq(arena, rng, tq, b, m, osize, cfg["axes"], cfg["lq"], fill=cfg.get("fill"), random=False)
    do, dop, dov = _fake_seq(arena, rng, tq, b, m, osize, cfg["axes"], cfg["lq"])
    grads = [_fake_seq(arena, rng, x.t, b, x.m, x.vect, cfg["axes"], list(x.lengths), random=False) for x in (q, k, v)]
    lq, lk = arena.alloc(4 * b * m), arena.alloc(4 * b * mk)
    arena.view(lq, np.int32, (b * m,), (1,))[...] = cfg["lq"]
    arena.view(lk, np.int32, (b * mk,), (1,))[...] = cfg["lk"]
    lqa, lka = np.array(cfg["lq"]).reshape(b, m), np.array(cfg["lk"]).reshape(b, mk)
    kv_of_q = [lka[i, j if mk > 1 else 0] for i in range(b) for j in range(m)]
    hi = {"full": [tk] * tq, "tl": [t + 1 for t in range(tq)],
          "br": [t + 1 + kv_of_q[0] - cfg["lq"][0] for t in range(tq)]}[cfg["hi"]]
    lo = [0] * tq
    res = qp if cfg.get("residual") else None
    pydnn.multi_head_attn_forward(h, a, -1, lo, hi, lq, lk, q, qp, res, k, kp, v, vp, o, op, wsize, wptr, wssize,
                                  ws, rssize, rs)
    stored = lambda x: x.astype(np.float16).astype(np.float64)  # noqa: E731
    args = (qv.astype(np.float64), kv.astype(np.float64), vv.astype(np.float64), weights, H, a.sm_scaler, lo, hi,
            lqa, lka)
    ref, _, cache = R.forward(*args, residual=bool(res), stored=stored)
    got = ov.astype(np.float64)
    valid = np.zeros(got.shape, bool)
    for i in range(b):
        for j in range(m):
            valid[i, j, :lqa[i, j]] = True
    np.testing.assert_allclose(got[valid], ref[valid], rtol=2e-2, atol=2e-2)
    if cfg.get("fill") is not None:
        assert (got[~valid] == cfg["fill"]).all()
    # inference at every step writes the same; at one step only that step
    ov[...] = np.nan
    pydnn.multi_head_attn_forward(h, a, -1, lo, hi, lq, lk, q, qp, res, k, kp, v, vp, o, op, wsize, wptr, wssize,
                                  ws, 0, None)
    np.testing.assert_allclose(ov.astype(np.float64)[valid], got[valid], rtol=1e-3, atol=1e-3)
    ov[...] = np.nan
    step_hi = [max(x, 1) for x in hi]
    pydnn.multi_head_attn_forward(h, a, 4, lo, step_hi, lq, lk, q, qp, res, k, kp, v, vp, o, op, wsize, wptr,
                                  wssize, ws, 0, None)
    step = ov.astype(np.float64)
    assert np.isnan(np.delete(step, 4, axis=2)).all()
    sv = valid[:, :, 4]
    np.testing.assert_allclose(step[:, :, 4][sv], got[:, :, 4][sv], rtol=2e-2, atol=2e-2)
    # backward data and weights
    pydnn.multi_head_attn_forward(h, a, -1, lo, hi, lq, lk, q, qp, res, k, kp, v, vp, o, op, wsize, wptr, wssize,
                                  ws, rssize, rs)
    (dq, dqp, dqv), (dk, dkp, dkv), (dv, dvp, dvv) = grads
    pydnn.multi_head_attn_backward_data(h, a, lo, hi, lq, lk, do, dop, dq, dqp, qp, dk, dkp, kp, dv, dvp, vp, wsize,
                                        wptr, wssize, ws, rssize, rs)
    rdq, rdk, rdv, rdw = R.backward(*args[:6], lqa, lka, dov.astype(np.float64), cache)
    for name_, got_, ref_ in (("dq", dqv, rdq), ("dk", dkv, rdk), ("dv", dvv, rdv)):
        np.testing.assert_allclose(got_.astype(np.float64), ref_, rtol=3e-2, atol=3e-2, err_msg=name_)
    for mode, factor in ((SET, 1), (ADD, 2)):
        pydnn.multi_head_attn_backward_weights(h, a, mode, q, qp, k, kp, v, vp, do, dop, wsize, wptr, dwptr, wssize,
                                               ws, rssize, rs)
        for kind, ref_ in rdw.items():
            wd = pydnn.create_tensor_descriptor()
            addr = pydnn.get_multi_head_attn_weights(h, a, kind, wsize, dwptr, wd)
            g = arena.view(addr, np.float16, wd.dims, wd.strides).astype(np.float64).reshape(ref_.shape)
            np.testing.assert_allclose(g, factor * ref_, rtol=3e-2, atol=3e-2 * factor * max(1, np.abs(ref_).max()),
                                       err_msg=f"weight kind {kind} x{factor}")


def test_c_program_on_cpu(tmp_path):
    from cprog import build_and_run
    r = build_and_run("mha_cpu", tmp_path)
    print(r.stdout, r.stderr)
    assert "FAIL" not in r.stdout and r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("ok ") == 13, r.stdout + r.stderr
