"""pooling_backward's cached path (int pointers, float alpha / beta, a plan for the descriptors): the same
launch as the full path (kernel, grid, block, parameter bytes), max and average, few Python calls, and the
per-call errors (overlap, misalignment, NULL) still raised as the full path raises them."""
import sys

import pydnn
from pydnn._cuda import driver
from pydnn.handle import Handle
from pydnn.ops import pooling as P
from pydnn.tensor import packed_strides
from test_fuzz_cpu import _desc

F32, BF16 = pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DATA_BFLOAT16


class _Funcs(dict):
    def get(self, key, default=None):
        return ("f",) + key


def _handle():
    h = Handle.__new__(Handle)
    h.ctx, h.device, h.arch, h.sm_count, h.stream, h.cu_stream, h.alive = None, 0, "sm_90", 132, 0, None, True
    h._funcs, h.prepared = _Funcs(), {}
    return h


def _setup(mode, dt, xdims, layout=pydnn.PYDNN_TENSOR_NCHW):
    pd = pydnn.create_pooling_descriptor()
    pydnn.set_pooling2d_descriptor(pd, mode, pydnn.PYDNN_NOT_PROPAGATE_NAN, 3, 3, 1, 1, 2, 2)
    xd = _desc(xdims, dt, packed_strides(xdims, layout))
    ydims = tuple(pydnn.get_pooling2d_forward_output_dim(pd, xd))
    yd = _desc(ydims, dt, packed_strides(ydims, layout))
    step = -(-(xd.span_bytes() + 4096) // 256) * 256
    X, DX, Y, DY = ((1 << 40) + i * step for i in range(4))
    return pd, xd, yd, X, DX, Y, DY


def _status(fn):
    try:
        fn()
    except pydnn.PydnnError as e:
        return e.status
    return pydnn.PYDNN_STATUS_SUCCESS


def test_cached_backward_launches_what_the_full_path_launches():
    for mode in (pydnn.PYDNN_POOLING_MAX, pydnn.PYDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING):
        for dt, xdims, layout in ((F32, (101, 38, 50, 50), pydnn.PYDNN_TENSOR_NCHW),
                                  (BF16, (4, 64, 9, 9), pydnn.PYDNN_TENSOR_NHWC),
                                  (BF16, (4, 5, 9, 9), pydnn.PYDNN_TENSOR_NHWC)):
            pd, xd, yd, X, DX, Y, DY = _setup(mode, dt, xdims, layout)
            for shift, beta in ((0, 0.0), (xd.itemsize, 0.5)):  # misaligned: the scalar launch
                call = lambda h: pydnn.pooling_backward(h, pd, 1.0, yd, Y + shift, yd, DY + shift, xd,  # noqa
                                                        X + shift, beta, xd, DX + shift)
                with driver.recording() as full:
                    call(_handle())
                h = _handle()
                with driver.recording():
                    call(h)
                with driver.recording() as cached:
                    call(h)
                assert list(cached) == list(full), (mode, dt, xdims, shift)
                n = [0]

                def prof(frame, event, arg):
                    if event == "call":
                        n[0] += 1
                with driver.recording():
                    sys.setprofile(prof)
                    try:
                        call(h)
                    finally:
                        sys.setprofile(None)
                assert n[0] <= 8, n[0]  # the API wrapper, pooling_backward, _run, the launch (full path: 40+)


def test_cached_backward_errors():
    MIS, BAD, NUL = (pydnn.PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER, pydnn.PYDNN_STATUS_BAD_PARAM,
                     pydnn.PYDNN_STATUS_BAD_PARAM_NULL_POINTER)
    pd, xd, yd, X, DX, Y, DY = _setup(pydnn.PYDNN_POOLING_MAX, F32, (3, 4, 20, 20))
    h = _handle()
    with driver.recording():
        pydnn.pooling_backward(h, pd, 1.0, yd, Y, yd, DY, xd, X, 0.0, xd, DX)
        assert _status(lambda: pydnn.pooling_backward(h, pd, 1.0, yd, Y, yd, DY, xd, X, 0.0, xd, X + 64)) == BAD
        assert _status(lambda: pydnn.pooling_backward(h, pd, 1.0, yd, Y, yd, DY, xd, X, 0.0, xd, X)) == BAD
        assert _status(lambda: pydnn.pooling_backward(h, pd, 1.0, yd, Y, yd, DX + 16, xd, X, 0.0, xd, DX)) == BAD
        assert _status(lambda: pydnn.pooling_backward(h, pd, 1.0, yd, Y + 2, yd, DY, xd, X, 0.0, xd, DX)) == MIS
        assert _status(lambda: pydnn.pooling_backward(h, pd, 1.0, yd, Y, yd, DY, xd, X, 0.0, xd, 0)) in (NUL, BAD)
        assert _status(lambda: pydnn.pooling_backward(h, pd, 1.0, yd, Y, yd, DY, xd, None, 0.0, xd, DX)) in (NUL, BAD)
        assert _status(lambda: pydnn.pooling_backward(h, pd, "a", yd, Y, yd, DY, xd, X, 0.0, xd, DX)) == BAD
        # averages read dy only: dx may overlap x (not read), not dy
        pa, xa, ya, Xa, DXa, Ya, DYa = _setup(pydnn.PYDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING, F32, (3, 4, 20, 20))
        pydnn.pooling_backward(h, pa, 1.0, ya, Ya, ya, DYa, xa, Xa, 0.0, xa, DXa)
        assert _status(lambda: pydnn.pooling_backward(h, pa, 1.0, ya, Ya, ya, DYa, xa, Xa, 0.0, xa, DYa + 64)) == BAD
        # a re-set descriptor: validated again (x's dims no longer pool to y's)
        pydnn.set_pooling2d_descriptor(pd, pydnn.PYDNN_POOLING_MAX, pydnn.PYDNN_NOT_PROPAGATE_NAN, 3, 3, 0, 0, 1, 1)
        assert _status(lambda: pydnn.pooling_backward(h, pd, 1.0, yd, Y, yd, DY, xd, X, 0.0, xd, DX)) == BAD
