"""Convolution Find without Ex on the CPU: every argument is checked before anything is allocated."""
import pydnn
from test_convolution_cpu import BAD, cdesc, fdesc, tdesc
from test_fuzz_cpu import _call, cpu_handle


def _check(fn, args, status, needle):
    st = _call(fn, *args)
    msg = pydnn.get_last_error_string()
    assert st == status, (st, msg)
    assert needle in msg, msg


def test_find_without_ex_validates_before_allocating():
    h = cpu_handle()  # its context is None: an allocation would fail with another status and message
    c = cdesc((1, 1), (1, 1), (1, 1))
    x, w, y = tdesc((2, 8, 9, 9)), fdesc((4, 8, 3, 3)), tdesc((2, 4, 9, 9))
    _check(pydnn.find_convolution_forward_algorithm, (h, x, w, c, y, 0), BAD, "requestedAlgoCount: 0 must be")
    _check(pydnn.find_convolution_forward_algorithm, (h, x, w, c, tdesc((2, 4, 9, 8)), 8), BAD, "yDesc: dims")
    _check(pydnn.find_convolution_backward_data_algorithm, (h, w, y, c, x, -1), BAD, "requestedAlgoCount")
    _check(pydnn.find_convolution_backward_data_algorithm, (h, fdesc((4, 7, 3, 3)), y, c, x, 6), BAD, "wDesc")
    _check(pydnn.find_convolution_backward_filter_algorithm, (h, x, y, c, w, 0), BAD, "requestedAlgoCount")
    _check(pydnn.find_convolution_backward_filter_algorithm, (h, x, y, None, w, 7), BAD, "convDesc")
