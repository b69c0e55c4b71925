"""Softmax on the CPU: validation (statuses and messages) and the reference against direct formulas."""
import numpy as np
import pytest

import pydnn
from pydnn.reference import softmax as ref
from test_fuzz_cpu import _call, _desc, cpu_handle


def test_reference_matches_direct_formula():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 4, 5))
    y = ref.forward(pydnn.PYDNN_SOFTMAX_ACCURATE, pydnn.PYDNN_SOFTMAX_MODE_CHANNEL, 1.0, x, 0.0, None)
    direct = np.exp(x) / np.exp(x).sum(axis=1, keepdims=True)
    assert np.allclose(y, direct, rtol=1e-14)
    y = ref.forward(pydnn.PYDNN_SOFTMAX_LOG, pydnn.PYDNN_SOFTMAX_MODE_INSTANCE, 1.0, x, 0.0, None)
    direct = x - np.log(np.exp(x).sum(axis=(1, 2, 3), keepdims=True))
    assert np.allclose(y, direct, rtol=1e-13)
    # backward is the vector-Jacobian product of forward (finite differences on one row)
    v = rng.standard_normal(6)
    dy = rng.standard_normal(6)
    s = np.exp(v) / np.exp(v).sum()
    jac = np.diag(s) - np.outer(s, s)
    got = ref.backward(pydnn.PYDNN_SOFTMAX_ACCURATE, pydnn.PYDNN_SOFTMAX_MODE_CHANNEL, 1.0,
                       s.reshape(1, 6, 1, 1), dy.reshape(1, 6, 1, 1), 0.0, None).ravel()
    assert np.allclose(got, jac.T @ dy, rtol=1e-12)


@pytest.mark.parametrize("bad, status, needle", [
    ("algo", pydnn.PYDNN_STATUS_BAD_PARAM, "algo"),
    ("mode", pydnn.PYDNN_STATUS_BAD_PARAM, "mode"),
    ("dims", pydnn.PYDNN_STATUS_BAD_PARAM, "yDesc"),
    ("dtype", pydnn.PYDNN_STATUS_BAD_PARAM, "yDesc"),
    ("int", pydnn.PYDNN_STATUS_NOT_SUPPORTED, "xDesc"),
    ("null", pydnn.PYDNN_STATUS_BAD_PARAM_NULL_POINTER, "y:"),
])
def test_forward_validation(bad, status, needle):
    h = cpu_handle()
    algo, mode = pydnn.PYDNN_SOFTMAX_ACCURATE, pydnn.PYDNN_SOFTMAX_MODE_CHANNEL
    xd, yd, y = _desc((2, 3, 4, 5)), _desc((2, 3, 4, 5)), 1 << 41
    if bad == "algo":
        algo = 9
    elif bad == "mode":
        mode = -1
    elif bad == "dims":
        yd = _desc((2, 3, 4, 6))
    elif bad == "dtype":
        yd = _desc((2, 3, 4, 5), pydnn.PYDNN_DATA_HALF)
    elif bad == "int":
        xd = _desc((2, 3, 4, 5), pydnn.PYDNN_DATA_INT8)
    elif bad == "null":
        y = 0
    assert _call(pydnn.softmax_forward, h, algo, mode, 1.0, xd, 1 << 40, 0.0, yd, y) == status
    assert needle in pydnn.get_last_error_string()


def test_backward_validation():
    h = cpu_handle()
    d, other = _desc((2, 3, 4, 5)), _desc((2, 3, 5, 5))
    st = _call(pydnn.softmax_backward, h, 1, 1, 1.0, d, 1 << 40, other, 1 << 41, 0.0, d, 1 << 42)
    assert st == pydnn.PYDNN_STATUS_BAD_PARAM and "dyDesc" in pydnn.get_last_error_string()
    one = _desc((7,))
    st = _call(pydnn.softmax_backward, h, 1, 1, 1.0, one, 1 << 40, one, 1 << 41, 0.0, one, 1 << 42)
    assert st == pydnn.PYDNN_STATUS_BAD_PARAM and "at least 2 dims" in pydnn.get_last_error_string()
