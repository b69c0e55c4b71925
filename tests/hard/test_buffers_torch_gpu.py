"""torch tensors as buffers on the GPU: the per-type fast path (data_ptr, is_contiguous, nbytes) gives the
same address and extent checks as the __cuda_array_interface__ / DLPack path, and a call with tensors
computes the same as with int pointers."""
import pytest

import pydnn
from pydnn import buffers

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


def _generic(t, need):
    return buffers._generic_ptr(t, "x", need)


def test_fast_path_matches_the_protocol():
    base = torch.zeros(64, 32, device="cuda")
    cases = [base, base[3:], base.t(), base[:, 5:9], base.expand(2, 64, 32)[1],
             torch.zeros(1, device="cuda").expand(100), torch.nn.Parameter(torch.zeros(8, device="cuda")),
             torch.zeros(0, device="cuda")]
    for t in cases:
        d = t.detach()
        span = buffers._torch_span(d)
        assert buffers.device_ptr(t, "x", span) == t.data_ptr()
        if span:
            assert _generic(d, span) == t.data_ptr()
            with pytest.raises(pydnn.PydnnError) as e:
                buffers.device_ptr(t, "x", span + 1)
            assert e.value.status == pydnn.PYDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT
            with pytest.raises(pydnn.PydnnError):
                _generic(d, span + 1)
    assert buffers._RESOLVERS[torch.Tensor] is buffers._torch_ptr
    assert buffers._RESOLVERS[torch.nn.Parameter] is buffers._torch_ptr


def test_requires_grad_tensors_work():
    t = torch.zeros(16, device="cuda", requires_grad=True)
    assert buffers.device_ptr(t, "x", 64) == t.data_ptr()


def test_activation_with_tensors_matches_int_pointers(handle):
    x = torch.randn(3, 5, 7, 2, device="cuda")
    y1, y2 = torch.empty_like(x), torch.empty_like(x)
    d = pydnn.create_tensor_descriptor()
    pydnn.set_tensor4d_descriptor(d, pydnn.PYDNN_TENSOR_NCHW, pydnn.PYDNN_DATA_FLOAT, 3, 5, 7, 2)
    a = pydnn.create_activation_descriptor()
    pydnn.set_activation_descriptor(a, pydnn.PYDNN_ACTIVATION_RELU, pydnn.PYDNN_NOT_PROPAGATE_NAN, 0.0)
    pydnn.set_stream(handle, torch.cuda.current_stream().cuda_stream)
    pydnn.activation_forward(handle, a, 1.0, d, x, 0.0, d, y1)
    pydnn.activation_forward(handle, a, 1.0, d, x.data_ptr(), 0.0, d, y2.data_ptr())
    torch.cuda.synchronize()
    assert torch.equal(y1, torch.relu(x)) and torch.equal(y2, y1)
    with pytest.raises(pydnn.PydnnError) as e:  # a too-small tensor is refused, not written past
        pydnn.activation_forward(handle, a, 1.0, d, x, 0.0, d, torch.empty(10, device="cuda"))
    assert e.value.status == pydnn.PYDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT
    with pytest.raises(pydnn.PydnnError) as e:
        pydnn.activation_forward(handle, a, 1.0, d, x.cpu(), 0.0, d, y1)
    assert e.value.status == pydnn.PYDNN_STATUS_BAD_PARAM and "not CUDA memory" in e.value.message
