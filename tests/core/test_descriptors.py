"""Tensor, filter and activation descriptors on the CPU: round trips, validation, statuses, messages."""
import pytest

import pydnn
from pydnn import PydnnError


def _status(fn, *args):
    with pytest.raises(PydnnError) as e:
        fn(*args)
    return e.value.status, pydnn.get_last_error_string()


def test_tensor4d_round_trip():
    d = pydnn.create_tensor_descriptor()
    pydnn.set_tensor4d_descriptor(d, pydnn.PYDNN_TENSOR_NCHW, pydnn.PYDNN_DATA_HALF, 2, 3, 5, 7)
    assert pydnn.get_tensor4d_descriptor(d) == (pydnn.PYDNN_DATA_HALF, 2, 3, 5, 7, 105, 35, 7, 1)
    pydnn.set_tensor4d_descriptor(d, pydnn.PYDNN_TENSOR_NHWC, pydnn.PYDNN_DATA_FLOAT, 2, 3, 5, 7)
    assert pydnn.get_tensor4d_descriptor(d) == (pydnn.PYDNN_DATA_FLOAT, 2, 3, 5, 7, 105, 1, 21, 3)
    assert pydnn.get_tensor_size_in_bytes(d) == 2 * 3 * 5 * 7 * 4
    pydnn.set_tensor4d_descriptor_ex(d, pydnn.PYDNN_DATA_BFLOAT16, 2, 3, 4, 5, 100, 30, 6, 1)
    assert pydnn.get_tensor4d_descriptor(d)[5:] == (100, 30, 6, 1)
    assert pydnn.get_tensor_size_in_bytes(d) == (100 + 60 + 18 + 4 + 1) * 2
    pydnn.destroy_tensor_descriptor(d)


def test_tensor_nd_round_trip():
    d = pydnn.create_tensor_descriptor()
    pydnn.set_tensor_nd_descriptor(d, pydnn.PYDNN_DATA_DOUBLE, 5, [2, 3, 4, 5, 6], [720, 240, 60, 12, 2])
    dt, nb, dims, strides = pydnn.get_tensor_nd_descriptor(d, 8)
    assert (dt, nb, dims, strides) == (pydnn.PYDNN_DATA_DOUBLE, 5, [2, 3, 4, 5, 6], [720, 240, 60, 12, 2])
    assert pydnn.get_tensor_nd_descriptor(d, 2)[2:] == ([2, 3], [720, 240])
    pydnn.set_tensor_nd_descriptor_ex(d, pydnn.PYDNN_TENSOR_NHWC, pydnn.PYDNN_DATA_INT8, 5, [2, 3, 4, 5, 6])
    assert pydnn.get_tensor_nd_descriptor(d, 5)[3] == [360, 1, 90, 18, 3]


def test_large_tensor_descriptor_over_2g_elements():
    d = pydnn.create_tensor_descriptor()
    pydnn.set_tensor4d_descriptor(d, pydnn.PYDNN_TENSOR_NCHW, pydnn.PYDNN_DATA_BFLOAT16, 1, 1, 65536, 65537)
    assert pydnn.get_tensor_size_in_bytes(d) == 65536 * 65537 * 2


@pytest.mark.parametrize("args, status, needle", [
    ((pydnn.PYDNN_TENSOR_NCHW, pydnn.PYDNN_DATA_FLOAT, 0, 1, 1, 1), pydnn.PYDNN_STATUS_BAD_PARAM, "n: 0"),
    ((pydnn.PYDNN_TENSOR_NCHW, pydnn.PYDNN_DATA_FLOAT, 1, -3, 1, 1), pydnn.PYDNN_STATUS_BAD_PARAM, "c: -3"),
    ((pydnn.PYDNN_TENSOR_NCHW, 777, 1, 1, 1, 1), pydnn.PYDNN_STATUS_BAD_PARAM, "dataType"),
    ((99, pydnn.PYDNN_DATA_FLOAT, 1, 1, 1, 1), pydnn.PYDNN_STATUS_BAD_PARAM, "format"),
    ((pydnn.PYDNN_TENSOR_NCHW, pydnn.PYDNN_DATA_FLOAT, 1.5, 1, 1, 1), pydnn.PYDNN_STATUS_BAD_PARAM, "n:"),
    ((pydnn.PYDNN_TENSOR_NCHW_VECT_C, pydnn.PYDNN_DATA_FLOAT, 1, 1, 1, 1), pydnn.PYDNN_STATUS_NOT_SUPPORTED, "format"),
])
def test_tensor4d_bad_params(args, status, needle):
    d = pydnn.create_tensor_descriptor()
    pydnn.set_tensor4d_descriptor(d, pydnn.PYDNN_TENSOR_NCHW, pydnn.PYDNN_DATA_FLOAT, 1, 2, 3, 4)
    st, msg = _status(pydnn.set_tensor4d_descriptor, d, *args)
    assert st == status
    assert msg.startswith("set_tensor4d_descriptor: ") and needle in msg
    # a refused set leaves the descriptor as it was
    assert pydnn.get_tensor4d_descriptor(d)[1:5] == (1, 2, 3, 4)


def test_nd_bad_params():
    d = pydnn.create_tensor_descriptor()
    assert _status(pydnn.set_tensor_nd_descriptor, d, pydnn.PYDNN_DATA_FLOAT, 9, [1] * 9, [1] * 9)[0] == \
        pydnn.PYDNN_STATUS_BAD_PARAM
    st, msg = _status(pydnn.set_tensor_nd_descriptor, d, pydnn.PYDNN_DATA_FLOAT, 3, [2, 0, 2], [4, 2, 1])
    assert st == pydnn.PYDNN_STATUS_BAD_PARAM and "dimA[1]" in msg
    st, msg = _status(pydnn.set_tensor_nd_descriptor, d, pydnn.PYDNN_DATA_FLOAT, 3, [2, 2], [4, 2, 1])
    assert st == pydnn.PYDNN_STATUS_BAD_PARAM and "dimA" in msg
    st, msg = _status(pydnn.set_tensor_nd_descriptor, d, pydnn.PYDNN_DATA_FLOAT, 3, [2, 2, 2], [4, 0, 1])
    assert st == pydnn.PYDNN_STATUS_BAD_PARAM and "strideA[1]" in msg
    # an unset descriptor cannot be read
    st, msg = _status(pydnn.get_tensor_nd_descriptor, d, 3)
    assert st == pydnn.PYDNN_STATUS_BAD_PARAM and "never set" in msg


def test_destroyed_descriptor_is_refused():
    d = pydnn.create_tensor_descriptor()
    pydnn.destroy_tensor_descriptor(d)
    assert _status(pydnn.set_tensor4d_descriptor, d, 0, 0, 1, 1, 1, 1)[0] == pydnn.PYDNN_STATUS_BAD_PARAM
    assert _status(pydnn.destroy_tensor_descriptor, d)[0] == pydnn.PYDNN_STATUS_BAD_PARAM
    assert _status(pydnn.get_tensor4d_descriptor, "not a descriptor")[0] == pydnn.PYDNN_STATUS_BAD_PARAM


def test_filter_round_trip_and_errors():
    f = pydnn.create_filter_descriptor()
    pydnn.set_filter4d_descriptor(f, pydnn.PYDNN_DATA_HALF, pydnn.PYDNN_TENSOR_NHWC, 64, 3, 7, 7)
    assert pydnn.get_filter4d_descriptor(f) == (pydnn.PYDNN_DATA_HALF, pydnn.PYDNN_TENSOR_NHWC, 64, 3, 7, 7)
    pydnn.set_filter_nd_descriptor(f, pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_TENSOR_NCHW, 5, [8, 4, 3, 3, 3])
    assert pydnn.get_filter_nd_descriptor(f, 5) == (pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_TENSOR_NCHW, 5, [8, 4, 3, 3, 3])
    assert pydnn.get_filter_size_in_bytes(f) == 8 * 4 * 27 * 4
    st, msg = _status(pydnn.set_filter4d_descriptor, f, pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_TENSOR_NCHW, 1, 1, 0, 1)
    assert st == pydnn.PYDNN_STATUS_BAD_PARAM and "h: 0" in msg
    st, _ = _status(pydnn.set_filter_nd_descriptor, f, pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_TENSOR_NCHW, 2, [1, 1])
    assert st == pydnn.PYDNN_STATUS_BAD_PARAM
    st, _ = _status(pydnn.get_filter4d_descriptor, f)  # 5-d filter
    assert st == pydnn.PYDNN_STATUS_BAD_PARAM


def test_activation_descriptor():
    a = pydnn.create_activation_descriptor()
    pydnn.set_activation_descriptor(a, pydnn.PYDNN_ACTIVATION_CLIPPED_RELU, pydnn.PYDNN_PROPAGATE_NAN, 6.0)
    assert pydnn.get_activation_descriptor(a) == (pydnn.PYDNN_ACTIVATION_CLIPPED_RELU, pydnn.PYDNN_PROPAGATE_NAN, 6.0)
    pydnn.set_activation_descriptor_swish_beta(a, 1.702)
    assert pydnn.get_activation_descriptor_swish_beta(a) == 1.702
    st, msg = _status(pydnn.set_activation_descriptor, a, 12345, 0, 0.0)
    assert st == pydnn.PYDNN_STATUS_BAD_PARAM and "mode" in msg
    st, msg = _status(pydnn.set_activation_descriptor, a, pydnn.PYDNN_ACTIVATION_RELU, 7, 0.0)
    assert st == pydnn.PYDNN_STATUS_BAD_PARAM and "reluNanOpt" in msg
    # GELU extension values cannot collide with cuDNN's modes
    cudnn_modes = [v for k, v in pydnn.ENUMS["pydnnActivationMode_t"].items() if "GELU" not in k]
    assert pydnn.PYDNN_ACTIVATION_GELU_ERF not in cudnn_modes
    assert pydnn.PYDNN_ACTIVATION_GELU_TANH not in cudnn_modes


def test_error_strings_and_version():
    assert pydnn.get_error_string(pydnn.PYDNN_STATUS_SUCCESS) == "PYDNN_STATUS_SUCCESS"
    assert pydnn.get_error_string(pydnn.PYDNN_STATUS_BAD_PARAM) == "PYDNN_STATUS_BAD_PARAM"
    assert pydnn.get_error_string(123456) == "PYDNN_STATUS_UNKNOWN"
    assert pydnn.get_version() == 100  # 0.1.0
    assert pydnn.get_property(0) == 0 and pydnn.get_property(1) == 1
    assert isinstance(pydnn.get_cudart_version(), int)


def test_create_without_gpu_reports_not_initialized():
    from conftest import HAVE_GPU

    if HAVE_GPU:
        pytest.skip("a GPU is present")
    st, msg = _status(pydnn.create)
    assert st == pydnn.PYDNN_STATUS_NOT_INITIALIZED and msg.startswith("create: ")


def test_api_names_follow_the_snake_case_rule():
    """Every public function is the snake_case of a cuDNN-style C name that the C API declares."""
    import re

    def snake(c_name):
        s = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", c_name)
        s = re.sub(r"(?<=[A-Z])(?=[A-Z][a-z])", "_", s)
        return s.lower()

    assert snake("SetTensor4dDescriptor") == "set_tensor4d_descriptor"
    assert snake("DeriveBNTensorDescriptor") == "derive_bn_tensor_descriptor"
    assert snake("GetConvolutionForwardAlgorithm_v7") == "get_convolution_forward_algorithm_v7"
    assert snake("GetTensorNdDescriptor") == "get_tensor_nd_descriptor"
