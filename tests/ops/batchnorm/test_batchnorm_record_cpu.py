"""Batch norm's launch records for forward training and backward (plain and Ex) on the CPU: a repeated call
(same descriptors) launches exactly what the full path launches (kernels, grids, blocks, parameter bytes) for
every argument variant, takes few Python calls, and every per-call error still comes out as the full path
raises it (the record falls back); a re-set descriptor is validated again."""
import sys

import pytest

import pydnn
from pydnn._cuda import driver
from pydnn.handle import Handle
from pydnn.ops import batchnorm as B
from pydnn.tensor import packed_strides
from test_fuzz_cpu import _desc

F32, F16, BF16 = pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DATA_HALF, pydnn.PYDNN_DATA_BFLOAT16
S = pydnn.PYDNN_BATCHNORM_SPATIAL
BN, ACT, ADD = (pydnn.PYDNN_BATCHNORM_OPS_BN, pydnn.PYDNN_BATCHNORM_OPS_BN_ACTIVATION,
                pydnn.PYDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION)


class _Funcs(dict):
    def get(self, key, default=None):
        return ("f",) + key  # a stand-in CUfunction: never launched (driver.recording)


def _handle():
    h = Handle.__new__(Handle)
    h.ctx, h.device, h.arch, h.sm_count, h.stream, h.cu_stream, h.alive = None, 0, "sm_90", 132, 0, None, True
    h._funcs, h.prepared = _Funcs(), {}
    return h


def _launches(fn):
    with driver.recording() as items:
        fn()
    return list(items)


class _Problem:
    def __init__(self, dims, dtype, layout):
        fmt = pydnn.PYDNN_TENSOR_NHWC if layout == "nhwc" else pydnn.PYDNN_TENSOR_NCHW
        self.x = _desc(dims, dtype, packed_strides(dims, fmt))
        self.bd = pydnn.create_tensor_descriptor()
        pydnn.derive_bn_tensor_descriptor(self.bd, self.x, S)
        self.ad = pydnn.create_activation_descriptor()
        pydnn.set_activation_descriptor(self.ad, pydnn.PYDNN_ACTIVATION_RELU, pydnn.PYDNN_NOT_PROPAGATE_NAN, 0.0)
        span = -(-(self.x.span_bytes() + 4096) // 256) * 256
        base = 1 << 40
        self.X, self.Y, self.Z, self.DY, self.DX, self.DZ = (base + i * span for i in range(6))
        p0 = base + 6 * span
        self.P = [p0 + i * 65536 for i in range(8)]
        self.WS, self.RS = p0 + 8 * 65536, p0 + 9 * 65536

    def fwd(self, h, ex=False, ops=BN, beta=0.0, running=True, saved=True, shift=0, ws_size=None):
        x, P = self.x, self.P
        shift *= x.itemsize  # elements off the 16-byte vector
        rm, rv = (P[2], P[3]) if running else (None, None)
        sm, si = (P[4], P[5]) if saved else (0, 0)
        if not ex:
            return lambda: pydnn.batch_normalization_forward_training(
                h, S, 1.0, beta, x, self.X + shift, x, self.Y + shift, self.bd, P[0], P[1], 0.1, rm, rv, 1e-5, sm, si)
        nws = pydnn.get_batch_normalization_forward_training_ex_workspace_size(h, S, ops, x, x if ops == ADD else None,
                                                                              x, self.bd, self.ad)
        nrs = pydnn.get_batch_normalization_training_ex_reserve_space_size(h, S, ops, self.ad, x)
        return lambda: pydnn.batch_normalization_forward_training_ex(
            h, S, ops, 1.0, beta, x, self.X + shift, x if ops == ADD else None, self.Z + shift if ops == ADD else None,
            x, self.Y + shift, self.bd, P[0], P[1], 0.1, rm, rv, 1e-5, sm, si, self.ad, self.WS,
            nws if ws_size is None else ws_size, self.RS if nrs else None, nrs)

    def bwd(self, h, ex=False, ops=BN, beta=0.0, pbeta=0.0, saved=True, shift=0, ws_size=None):
        x, P = self.x, self.P
        shift *= x.itemsize
        sm, si = (P[4], P[5]) if saved else (None, None)
        if not ex:
            return lambda: pydnn.batch_normalization_backward(
                h, S, 1.0, beta, 1.0, pbeta, x, self.X + shift, x, self.DY + shift, x, self.DX + shift, self.bd, P[0],
                P[6], P[7], 1e-5, sm, si)
        z = x if ops == ADD else None
        nws = pydnn.get_batch_normalization_backward_ex_workspace_size(h, S, ops, x, x, x, z, x, self.bd, self.ad)
        nrs = pydnn.get_batch_normalization_training_ex_reserve_space_size(h, S, ops, self.ad, x)
        return lambda: pydnn.batch_normalization_backward_ex(
            h, S, ops, 1.0, beta, 1.0, pbeta, x, self.X + shift, x, self.Y + shift, x, self.DY + shift, z,
            self.DZ + shift if z is not None else None, x, self.DX + shift, self.bd, P[0], P[1], P[6], P[7], 1e-5,
            sm, si, self.ad, self.WS, nws if ws_size is None else ws_size, self.RS if nrs else None, nrs)


PROBLEMS = [((256, 64, 16, 16), BF16, "nhwc"), ((162, 4, 9, 9), BF16, "nhwc"), ((39, 1315, 23, 23), F32, "nchw"),
            ((5, 1481, 23, 23), F32, "nchw"), ((2, 477, 13, 13), F32, "nhwc"), ((105, 50, 12, 12), F16, "nhwc")]
VARIANTS = [dict(), dict(beta=0.5), dict(running=False), dict(saved=False), dict(shift=1),
            dict(ex=True), dict(ex=True, ops=ACT), dict(ex=True, ops=ADD), dict(ex=True, ops=ACT, shift=1)]
BVARIANTS = [dict(), dict(beta=0.5), dict(pbeta=1.0), dict(saved=False), dict(shift=1),
             dict(ex=True), dict(ex=True, ops=ACT), dict(ex=True, ops=ADD), dict(ex=True, ops=ACT, shift=3)]


@pytest.mark.parametrize("dims,dtype,layout", PROBLEMS)
def test_record_launches_what_the_full_path_launches(dims, dtype, layout, monkeypatch):
    """Two handles make the same calls in the same order (a plan's parameters keep a launch's fields from the
    call before, so histories match): one with the records off (every call the full path), one with them."""
    pr = _Problem(dims, dtype, layout)
    full_h, warm = _handle(), _handle()
    fast = B._fwd_fast, B._bwd_fast
    for direction, variants in (("fwd", VARIANTS), ("bwd", BVARIANTS)):
        for v in variants:
            full, call = getattr(pr, direction)(full_h, **v), getattr(pr, direction)(warm, **v)
            monkeypatch.setattr(B, "_fwd_fast", lambda *a: False)
            monkeypatch.setattr(B, "_bwd_fast", lambda *a: False)
            want = _launches(full) + _launches(full)
            took = []
            monkeypatch.setattr(B, "_fwd_fast", lambda *a: took.append(fast[0](*a)) or took[-1])
            monkeypatch.setattr(B, "_bwd_fast", lambda *a: took.append(fast[1](*a)) or took[-1])
            first = _launches(call)
            assert any(k[0] == f"bn_{direction}_rec" for k in warm.prepared if type(k) is tuple), (direction, v)
            got = first + _launches(call)  # the second through the record
            assert took[-1] is True, (direction, v)
            assert got == want, (dims, direction, v)
            assert len(want) >= 2


def _python_calls(fn):
    n = [0]

    def prof(frame, event, arg):
        if event == "call":
            n[0] += 1

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return n[0]


def test_record_python_calls():
    pr = _Problem((256, 64, 16, 16), BF16, "nhwc")
    h = _handle()
    with driver.recording():
        for fn in (pr.fwd(h), pr.fwd(h, ex=True, ops=ACT), pr.bwd(h), pr.bwd(h, ex=True, ops=ACT)):
            fn()
            n = _python_calls(fn)
            # the record path: the API wrapper, the record, its pick and parameters, one launch_args per
            # kernel (the full path: 81-96)
            assert n <= 30, n


def _status(fn):
    try:
        fn()
    except pydnn.PydnnError as e:
        return e.status
    return pydnn.PYDNN_STATUS_SUCCESS


def test_record_falls_back_for_per_call_errors():
    pr = _Problem((39, 1315, 23, 23), F32, "nchw")
    h = _handle()
    P = pr.P
    x, bd = pr.x, pr.bd
    with driver.recording():
        pr.fwd(h, ex=True, ops=ACT)()
        pr.bwd(h, ex=True, ops=ACT)()
        pr.fwd(h)()
        pr.bwd(h)()
        MIS, BAD, NUL = (pydnn.PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER, pydnn.PYDNN_STATUS_BAD_PARAM,
                         pydnn.PYDNN_STATUS_BAD_PARAM_NULL_POINTER)
        # a misaligned element pointer, one of a pair, epsilon, factor, overlap, workspace, reserve
        assert _status(lambda: pydnn.batch_normalization_forward_training(
            h, S, 1.0, 0.0, x, pr.X + 2, x, pr.Y, bd, P[0], P[1], 0.1, P[2], P[3], 1e-5, P[4], P[5])) == MIS
        assert _status(lambda: pydnn.batch_normalization_forward_training(
            h, S, 1.0, 0.0, x, pr.X, x, pr.Y, bd, P[0], P[1], 0.1, P[2], None, 1e-5, P[4], P[5])) == BAD
        assert _status(lambda: pydnn.batch_normalization_forward_training(
            h, S, 1.0, 0.0, x, pr.X, x, pr.Y, bd, P[0], P[1], 0.1, P[2], P[3], -1.0, P[4], P[5])) == BAD
        assert _status(lambda: pydnn.batch_normalization_forward_training(
            h, S, 1.0, 0.0, x, pr.X, x, pr.Y, bd, P[0], P[1], float("nan"), P[2], P[3], 1e-5, P[4], P[5])) == BAD
        assert _status(lambda: pydnn.batch_normalization_forward_training(
            h, S, 1.0, 0.0, x, pr.X, x, pr.X + 64, bd, P[0], P[1], 0.1, P[2], P[3], 1e-5, P[4], P[5])) == BAD
        assert _status(lambda: pydnn.batch_normalization_forward_training(
            h, S, 1.0, 0.0, x, pr.X, x, pr.Y, bd, None, P[1], 0.1, P[2], P[3], 1e-5, P[4], P[5])) == NUL
        assert _status(lambda: pydnn.batch_normalization_forward_training(
            h, S, "a", 0.0, x, pr.X, x, pr.Y, bd, P[0], P[1], 0.1, P[2], P[3], 1e-5, P[4], P[5])) == BAD
        assert _status(pr.fwd(h, ex=True, ops=ACT, ws_size=0)) in (BAD, pydnn.PYDNN_STATUS_SUCCESS)
        nws = pydnn.get_batch_normalization_forward_training_ex_workspace_size(h, S, ACT, x, None, x, bd, pr.ad)
        if nws:
            assert _status(pr.fwd(h, ex=True, ops=ACT, ws_size=nws - 1)) == BAD
        assert _status(lambda: pydnn.batch_normalization_forward_training_ex(
            h, S, ACT, 1.0, 0.0, x, pr.X, None, None, x, pr.Y, bd, P[0], P[1], 0.1, P[2], P[3], 1e-5, P[4], P[5],
            pr.ad, pr.WS, nws, pr.RS, 5)) == BAD
        assert _status(lambda: pydnn.batch_normalization_backward(
            h, S, 1.0, 0.0, 1.0, 0.0, x, pr.X, x, pr.DY, x, pr.DY + 64, bd, P[0], P[6], P[7], 1e-5, P[4],
            P[5])) == BAD
        assert _status(lambda: pydnn.batch_normalization_backward(
            h, S, 1.0, 0.0, 1.0, 0.0, x, pr.X, x, pr.DY, x, pr.DX, bd, P[0], P[6] + 2, P[7], 1e-5, P[4],
            P[5])) == MIS
        assert _status(lambda: pydnn.batch_normalization_backward(
            h, S, 1.0, 0.0, 1.0, 0.0, x, pr.X, x, pr.DY, x, pr.DX, bd, P[0], P[6], P[7], 1e-5, None,
            P[5])) == BAD
        # the activation re-set to one batch norm does not fuse: validated again, refused
        pydnn.set_activation_descriptor(pr.ad, pydnn.PYDNN_ACTIVATION_TANH, pydnn.PYDNN_NOT_PROPAGATE_NAN, 0.0)
        assert _status(lambda: pydnn.batch_normalization_forward_training_ex(
            h, S, ACT, 1.0, 0.0, x, pr.X, None, None, x, pr.Y, bd, P[0], P[1], 0.1, P[2], P[3], 1e-5, P[4], P[5],
            pr.ad, pr.WS, nws, pr.RS, x.span_bytes())) == pydnn.PYDNN_STATUS_NOT_SUPPORTED
        # the scale / bias descriptor re-set to other channels: validated again, refused
        pydnn.set_tensor_nd_descriptor(bd, F32, 4, [1, 7, 1, 1], [7, 1, 1, 1])
        assert _status(pr.fwd(h)) == BAD
        assert _status(pr.bwd(h)) == BAD


def test_rows1_u_plans(monkeypatch):
    """ROWS1_U = 8: the 1-element row launches (odd C NHWC) take the <T, 1, 8> kernels (stats and apply) and
    chunk the apply for 8 rows in flight; the vector launches and double keep kUnroll; the kernels are in
    the units."""
    from pydnn import tuning
    h = _handle()
    exprs = {e for u in B.kernel_units() for e in u.exprs}
    for dims, dtype in (((39, 1315, 23, 23), F32), ((195, 93, 38, 38), BF16), ((37, 12, 146, 146), F16),
                        ((4, 16, 5, 7), F32), ((3, 7, 5, 5), pydnn.PYDNN_DATA_DOUBLE)):
        d = _desc(dims, dtype, packed_strides(dims, pydnn.PYDNN_TENSOR_NHWC))
        for direction, others in (("fwd", (d,)), ("bwd", (d, d))):
            monkeypatch.setattr(tuning.batchnorm, "ROWS1_U", 4)
            base = B.plan_summary(h, direction, S, d, *others)[1]
            monkeypatch.setattr(tuning.batchnorm, "ROWS1_U", 8)
            seqs = B.plan_summary(h, direction, S, d, *others)[1]
            for name, seq in seqs.items():
                for (k, v, grid, block, fields), (k0, v0, grid0, block0, f0) in zip(seq, base[name]):
                    assert (k, v, block) == (k0, v0, block0)
                    if name == "rows1" and dtype != pydnn.PYDNN_DATA_DOUBLE and k in B.ROWS1_U_KERNELS:
                        assert "8>" in B._expr(k, B.TAG[dtype], v, 8) and B._expr(k, B.TAG[dtype], v, 8) in exprs
            rows1 = seqs.get("rows1")
            if rows1 is not None:
                h2 = _handle()
                pl = B._make_plan(h2, B.TAG[dtype], B._geometry(S, d.dims, {B.OP_X: d.strides, B.OP_Y: d.strides,
                                                                          B.OP_DY: d.strides, B.OP_DX: d.strides},
                                                                B.vec_width(B.TAG[dtype], B.TAG[dtype])),
                                  direction, False)
                us = [lc.u for lc in pl.seqs["rows1"] if lc.kernel in B.ROWS1_U_KERNELS]
                assert us == ([None, None] if dtype == pydnn.PYDNN_DATA_DOUBLE else [8, 8]), (dims, direction, us)
