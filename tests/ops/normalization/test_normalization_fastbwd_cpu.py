"""norm_backward's cached call (a loaded plan for the descriptors, int pointers, float scalars): the same
launches as the full path (kernels, grids, blocks, parameter bytes) for layer / RMS norm, with and without
bias / dbias, aligned and not; few Python calls; per-call errors (overlap, misalignment, NULL, a small
workspace) still raised as the full path raises them; a re-set descriptor validated again."""
import sys

import pytest

import pydnn
from pydnn._cuda import driver
from pydnn.handle import Handle
from pydnn.ops import normalization as N

BF16, F32 = pydnn.PYDNN_DATA_BFLOAT16, pydnn.PYDNN_DATA_FLOAT


class _Funcs(dict):
    def get(self, key, default=None):
        return ("f",) + key


def _handle():
    h = Handle.__new__(Handle)
    h.ctx, h.device, h.arch, h.sm_count, h.stream, h.cu_stream, h.alive = None, 0, "sm_90", 132, 0, None, True
    h._funcs, h.prepared = _Funcs(), {}
    return h


class _P:
    def __init__(self, kind, dt, R, L):
        self.xd = pydnn.create_tensor_descriptor()
        pydnn.set_tensor_nd_descriptor(self.xd, dt, 4, [R, L, 1, 1], [L, 1, 1, 1])
        self.nd = pydnn.create_norm_descriptor()
        pydnn.set_norm_descriptor(self.nd, kind, 1, 3, 1e-5, None)
        self.sb, self.mi = pydnn.create_tensor_descriptor(), pydnn.create_tensor_descriptor()
        pydnn.derive_norm_param_descriptors(self.sb, self.mi, self.xd, self.nd)
        step = -(-(self.xd.span_bytes() + 4096) // 256) * 256
        self.X, self.DY, self.DX = ((1 << 40) + i * step for i in range(3))
        q = (1 << 40) + 3 * step
        self.P = [q + i * (4 * L + 4096) // 256 * 256 for i in range(4)]
        q += 4 * (4 * L + 4096)
        self.M = [q, q + (4 * R + 4096) // 256 * 256]
        self.W = q + 2 * (4 * R + 4096)

    def call(self, h, shift=0, bias=True, beta=0.0, ws=None, **over):
        a = dict(x=self.X + shift, dy=self.DY + shift, dx=self.DX + shift, scale=self.P[0],
                 bias=self.P[1] if bias else None, ds=self.P[2], db=self.P[3] if bias else 0, mean=self.M[0],
                 inv=self.M[1])
        a.update(over)
        n = ws if ws is not None else pydnn.get_norm_backward_workspace_size(h, self.nd, self.xd, self.xd, self.xd,
                                                                              self.sb, self.mi)
        return lambda: pydnn.norm_backward(h, self.nd, 1.0, beta, 1.0, beta, self.xd, a["x"], self.xd, a["dy"],
                                           self.xd, a["dx"], self.sb, a["scale"], a["bias"], a["ds"], a["db"],
                                           self.mi, a["mean"], a["inv"], self.W, n)


CASES = [(pydnn.PYDNN_NORM_KIND_LAYER, BF16, 96, 275), (pydnn.PYDNN_NORM_KIND_LAYER, BF16, 417, 2770),
         (pydnn.PYDNN_NORM_KIND_RMS, F32, 33, 4096), (pydnn.PYDNN_NORM_KIND_LAYER, F32, 3673, 8552),
         (pydnn.PYDNN_NORM_KIND_RMS, BF16, 5, 56616)]


@pytest.fixture(autouse=True)
def _no_driver(monkeypatch):  # the stand-in functions need no shared-memory opt-in
    monkeypatch.setattr(driver, "function_set_max_dynamic_smem", lambda f, n: None)


def test_cached_backward_launches_what_the_full_path_launches(monkeypatch):
    for kind, dt, R, L in CASES:
        p = _P(kind, dt, R, L)
        for shift, bias, beta in ((0, True, 0.0), (p.xd.itemsize, False, 0.5)):
            with driver.recording() as full:
                p.call(_handle(), shift, bias, beta)()
            h = _handle()
            with driver.recording():
                p.call(h, shift, bias, beta)()
            took = []
            fast = N._fast_bwd
            monkeypatch.setattr(N, "_fast_bwd", lambda *a: took.append(fast(*a)) or took[-1])
            with driver.recording() as cached:
                p.call(h, shift, bias, beta)()
            monkeypatch.setattr(N, "_fast_bwd", fast)
            assert took == [True], (kind, R, L, shift)
            assert list(cached) == list(full), (kind, R, L, shift)
            n = [0]

            def prof(frame, event, arg):
                if event == "call":
                    n[0] += 1
            fn = p.call(h, shift, bias, beta)
            with driver.recording():
                sys.setprofile(prof)
                try:
                    fn()
                finally:
                    sys.setprofile(None)
            assert n[0] <= 16, n[0]  # (the full path: 55)


def _status(fn):
    try:
        fn()
    except pydnn.PydnnError as e:
        return e.status
    return pydnn.PYDNN_STATUS_SUCCESS


def test_cached_backward_errors():
    MIS, BAD, NUL = (pydnn.PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER, pydnn.PYDNN_STATUS_BAD_PARAM,
                     pydnn.PYDNN_STATUS_BAD_PARAM_NULL_POINTER)
    p = _P(pydnn.PYDNN_NORM_KIND_LAYER, BF16, 417, 2770)
    h = _handle()
    with driver.recording():
        p.call(h)()
        assert _status(p.call(h, dx=p.X + 64)) == BAD
        assert _status(p.call(h, dx=p.DY + 2)) == BAD
        assert _status(p.call(h, x=p.X + 1)) == MIS
        assert _status(p.call(h, scale=p.P[0] + 2)) == MIS
        assert _status(p.call(h, mean=None)) in (NUL, BAD)
        assert _status(p.call(h, inv=0)) in (NUL, BAD)
        n = pydnn.get_norm_backward_workspace_size(h, p.nd, p.xd, p.xd, p.xd, p.sb, p.mi)
        if n:
            assert _status(p.call(h, ws=n - 1)) == BAD
        pydnn.set_norm_descriptor(p.nd, pydnn.PYDNN_NORM_KIND_GROUP, 7, 3, 1e-5, None)  # 7 groups of 2770: refused
        assert _status(p.call(h, ws=1 << 30)) == BAD
