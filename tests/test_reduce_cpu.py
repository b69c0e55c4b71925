"""ReduceTensor on the CPU: descriptor round trip, sizes, validation."""
import pydnn
from pydnn.reference import reduce as ref
from test_fuzz_cpu import _call, _desc, cpu_handle


def _r(op=pydnn.PYDNN_REDUCE_TENSOR_ADD, indices=0):
    r = pydnn.create_reduce_tensor_descriptor()
    pydnn.set_reduce_tensor_descriptor(r, op, pydnn.PYDNN_DATA_FLOAT, 0, indices, 0)
    return r


def test_descriptor_round_trip_and_errors():
    r = _r(pydnn.PYDNN_REDUCE_TENSOR_AMAX, 1)
    assert pydnn.get_reduce_tensor_descriptor(r) == (pydnn.PYDNN_REDUCE_TENSOR_AMAX, 0, 0, 1, 0)
    assert _call(pydnn.set_reduce_tensor_descriptor, r, 99, 0, 0, 0, 0) == pydnn.PYDNN_STATUS_BAD_PARAM
    assert "reduceTensorOp" in pydnn.get_last_error_string()
    pydnn.destroy_reduce_tensor_descriptor(r)
    assert _call(pydnn.get_reduce_tensor_descriptor, r) == pydnn.PYDNN_STATUS_BAD_PARAM


def test_sizes_and_validation():
    h = cpu_handle()
    a, c = _desc((4, 6, 9, 10)), _desc((4, 1, 9, 1))
    assert pydnn.get_reduction_indices_size(h, _r(pydnn.PYDNN_REDUCE_TENSOR_MAX, 1), a, c) == 4 * 9 * 4
    assert pydnn.get_reduction_indices_size(h, _r(), a, c) == 0
    full = _desc((1, 1, 1, 1))
    big = _desc((1, 1, 1, 1 << 26))
    assert pydnn.get_reduction_workspace_size(h, _r(), big, full) > 0
    assert _call(pydnn.get_reduction_workspace_size, h, _r(), a, _desc((4, 2, 9, 1))) == pydnn.PYDNN_STATUS_BAD_PARAM
    assert "cDesc: dim 1 is 2" in pydnn.get_last_error_string()
    assert _call(pydnn.get_reduction_indices_size, h, _r(pydnn.PYDNN_REDUCE_TENSOR_ADD, 1), a, c) == \
        pydnn.PYDNN_STATUS_NOT_SUPPORTED
    st = _call(pydnn.reduce_tensor, h, _r(pydnn.PYDNN_REDUCE_TENSOR_MAX, 1), 1 << 40, 4, 0, 0, 1.0, a, 1 << 41, 0.0,
               c, 1 << 42)
    assert st == pydnn.PYDNN_STATUS_BAD_PARAM and "indicesSizeInBytes" in pydnn.get_last_error_string()
    st = _call(pydnn.reduce_tensor, h, _r(), 0, 0, 1 << 40, 16, 1.0, big, 1 << 41, 0.0, full, 1 << 42)
    assert st == pydnn.PYDNN_STATUS_BAD_PARAM and "workspaceSizeInBytes" in pydnn.get_last_error_string()
    st = _call(pydnn.reduce_tensor, h, _r(), 0, 0, 0, 0, 1.0, _desc((2, 3), pydnn.PYDNN_DATA_FLOAT), 1 << 41, 0.0,
               _desc((2, 1), pydnn.PYDNN_DATA_HALF), 1 << 42)
    assert st == pydnn.PYDNN_STATUS_NOT_SUPPORTED


def test_reference_indices_follow_a_dim_order():
    import numpy as np

    a = np.arange(24, dtype=float).reshape(2, 3, 4)
    a[1, 2, 1] = 100
    v, idx, _ = ref.reduce(pydnn.PYDNN_REDUCE_TENSOR_MAX, 1.0, a, 0.0, None, (2, 1, 1))
    assert v.ravel().tolist() == [11, 100] and idx.ravel().tolist() == [11, 9]
