"""Bad input, fuzzed with hypothesis on the CPU: every refusal is a PydnnError with a known status and a
message that starts with the function's name; nothing else escapes and nothing crashes."""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pydnn
from pydnn.handle import Handle

STATUSES = set(pydnn.ENUMS["pydnnStatus_t"].values()) - {pydnn.PYDNN_STATUS_SUCCESS}
junk = st.one_of(st.integers(-2**70, 2**70), st.floats(allow_nan=True), st.none(), st.text(max_size=3),
                 st.booleans(), st.lists(st.integers(-3, 9), max_size=9))
small = st.one_of(st.integers(-2, 70), junk)


def _call(fn, *args):
    try:
        fn(*args)
    except pydnn.PydnnError as e:
        assert e.status in STATUSES, e
        assert e.status != pydnn.PYDNN_STATUS_INTERNAL_ERROR, e  # validation must catch it, not a crash
        assert pydnn.get_last_error_string().startswith(fn.__name__ + ": "), pydnn.get_last_error_string()
        return e.status
    return pydnn.PYDNN_STATUS_SUCCESS


class _NoKernels(dict):
    """Kernel table of a CPU-only handle: any lookup fails before the driver is touched."""

    def get(self, key, default=None):
        raise pydnn.PydnnError(pydnn.PYDNN_STATUS_NOT_INITIALIZED, "CPU-only test handle: no kernels")


def cpu_handle():
    """A handle record for argument validation that never reaches the driver (safe with or without a GPU):
    every check runs, and a call that passes them all fails with NOT_INITIALIZED at kernel lookup."""
    h = Handle.__new__(Handle)
    h.ctx, h.device, h.arch, h.sm_count, h.stream, h.cu_stream, h.alive = None, 0, "sm_90", 132, 0, None, True
    h._funcs, h.prepared = _NoKernels(), {}
    return h


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.tuples(small, small, small, small, small, small))
def test_set_tensor4d_fuzz(args):
    d = pydnn.create_tensor_descriptor()
    _call(pydnn.set_tensor4d_descriptor, d, *args)


@settings(max_examples=300)
@given(small, small, junk, junk)
def test_set_tensor_nd_fuzz(dt, nb, dims, strides):
    d = pydnn.create_tensor_descriptor()
    if _call(pydnn.set_tensor_nd_descriptor, d, dt, nb, dims, strides) == pydnn.PYDNN_STATUS_SUCCESS:
        _, nbd, got_dims, _ = pydnn.get_tensor_nd_descriptor(d, 8)
        assert nbd == nb and got_dims == list(dims[:nb])


@settings(max_examples=200)
@given(small, small, small, junk)
def test_set_filter_nd_fuzz(dt, fmt, nb, dims):
    f = pydnn.create_filter_descriptor()
    _call(pydnn.set_filter_nd_descriptor, f, dt, fmt, nb, dims)


@settings(max_examples=200)
@given(small, small, junk, junk)
def test_activation_descriptor_fuzz(mode, nan, coef, beta):
    a = pydnn.create_activation_descriptor()
    _call(pydnn.set_activation_descriptor, a, mode, nan, coef)
    _call(pydnn.set_activation_descriptor_swish_beta, a, beta)


def _desc(dims, dtype=pydnn.PYDNN_DATA_FLOAT, strides=None):
    d = pydnn.create_tensor_descriptor()
    if strides is None:
        pydnn.set_tensor_nd_descriptor_ex(d, pydnn.PYDNN_TENSOR_NCHW, dtype, len(dims), dims)
    else:
        pydnn.set_tensor_nd_descriptor(d, dtype, len(dims), dims, strides)
    return d


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["handle", "desc", "alpha", "beta", "xdesc", "ydesc", "x", "y", "dtype", "overlap"]),
       junk)
def test_activation_forward_bad_arguments(which, value):
    """One bad argument at a time: refused before any launch, with a status and the argument's name."""
    h = cpu_handle()
    a = pydnn.create_activation_descriptor()
    pydnn.set_activation_descriptor(a, pydnn.PYDNN_ACTIVATION_RELU, 0, 0.0)
    args = {"handle": h, "desc": a, "alpha": 1.0, "xdesc": _desc((2, 3, 4, 5)), "x": 1 << 40, "beta": 0.0,
            "ydesc": _desc((2, 3, 4, 5)), "y": 1 << 41}
    if which == "dtype":
        args["ydesc"] = _desc((2, 3, 4, 5), pydnn.PYDNN_DATA_HALF)
    elif which == "overlap":
        args["ydesc"] = _desc((2, 3, 4, 5), strides=(1, 1, 1, 1))
    elif which == "xdesc" and isinstance(value, list) and value and all(v > 0 for v in value):
        args["xdesc"] = _desc(tuple(value[:8]))
    else:
        args[which] = value
    order = ["handle", "desc", "alpha", "xdesc", "x", "beta", "ydesc", "y"]
    status = _call(pydnn.activation_forward, *[args[k] for k in order])
    if status == pydnn.PYDNN_STATUS_NOT_INITIALIZED:  # every check passed; the launch needs a driver
        return
    assert status != pydnn.PYDNN_STATUS_SUCCESS


def test_cpu_handle_reaches_the_driver_only_with_good_arguments():
    h = cpu_handle()
    a = pydnn.create_activation_descriptor()
    pydnn.set_activation_descriptor(a, pydnn.PYDNN_ACTIVATION_RELU, 0, 0.0)
    d = _desc((2, 3, 4, 5))
    assert _call(pydnn.activation_forward, h, a, 1.0, d, 1 << 40, 0.0, d, 1 << 41) == pydnn.PYDNN_STATUS_NOT_INITIALIZED
    st_, msg = _call(pydnn.activation_forward, h, a, 1.0, d, 1 << 40, 0.0, d, 0), pydnn.get_last_error_string()
    assert st_ == pydnn.PYDNN_STATUS_BAD_PARAM_NULL_POINTER and "y: NULL" in msg
