"""Device buffer arguments on the CPU: ints, None, __cuda_array_interface__ objects, DLPack, host arrays."""
import numpy as np
import pytest

import pydnn
from pydnn.buffers import device_ptr


class FakeCAI:
    def __init__(self, ptr, shape, typestr="<f4", strides=None):
        self.__cuda_array_interface__ = {"data": (ptr, False), "shape": shape, "typestr": typestr,
                                         "strides": strides, "version": 3}


def _status(*args):
    with pytest.raises(pydnn.PydnnError) as e:
        device_ptr(*args)
    return e.value.status, e.value.message


def test_int_pointers():
    assert device_ptr(0x7F0000001000, "x") == 0x7F0000001000
    assert _status(0, "x") == (pydnn.PYDNN_STATUS_BAD_PARAM_NULL_POINTER, "x: NULL pointer")
    assert _status(None, "y")[0] == pydnn.PYDNN_STATUS_BAD_PARAM_NULL_POINTER
    assert _status(-5, "x")[0] == pydnn.PYDNN_STATUS_BAD_PARAM


def test_cuda_array_interface_extent_is_checked():
    obj = FakeCAI(4096, (10, 10))
    assert device_ptr(obj, "x", 400) == 4096
    st, msg = _status(obj, "x", 404)
    assert st == pydnn.PYDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT and msg.startswith("x: buffer holds 400 bytes")
    strided = FakeCAI(4096, (2, 3), "<f2", (12, 2))  # rows 12 bytes apart: span (1*12 + 2*2) + 2 = 18
    assert device_ptr(strided, "x", 18) == 4096
    assert _status(strided, "x", 20)[0] == pydnn.PYDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT


def test_host_arrays_and_junk_are_refused():
    st, msg = _status(np.zeros(4, np.float32), "x")
    assert st == pydnn.PYDNN_STATUS_BAD_PARAM and "not CUDA memory" in msg
    st, msg = _status("0x1234", "dy")
    assert st == pydnn.PYDNN_STATUS_BAD_PARAM and msg.startswith("dy: str")
    assert _status(1.5, "x")[0] == pydnn.PYDNN_STATUS_BAD_PARAM
