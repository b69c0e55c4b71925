"""activation_forward's C entry (fastcall's act_fwd) on the GPU: repeated calls with torch tensors and int
pointers are answered in C and compute exactly torch.relu (aligned and misaligned views: the vector and the
scalar kernel), alpha / beta blend as the Python function's launch does (bitwise), errors are unchanged,
and the call is captured into a CUDA graph and replayed on new inputs."""
import pytest

import pydnn as P
from pydnn.ops import activation as A

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


def _setup(n=4096):
    d = P.create_tensor_descriptor()
    P.set_tensor_nd_descriptor_ex(d, P.PYDNN_TENSOR_NCHW, P.PYDNN_DATA_FLOAT, 4, [1, 1, 1, n])
    a = P.create_activation_descriptor()
    P.set_activation_descriptor(a, P.PYDNN_ACTIVATION_RELU, P.PYDNN_NOT_PROPAGATE_NAN, 0.0)
    return d, a


def _entry_or_skip(th, d, a):
    x, y = torch.randn(4096, device="cuda"), torch.empty(4096, device="cuda")
    for _ in range(2):  # plans, verifies the tensor type, sets the entry up
        P.activation_forward(th, a, 1.0, d, x, 0.0, d, y)
    if A._c_entry is A._no_entry:
        pytest.skip("the launch helper is not available here (no C compiler or Python headers)")
    assert A._c_entry(th, a, 1.0, d, x, 0.0, d, y) is None  # answered in C


def test_entry_results(th):
    d, a = _setup()
    _entry_or_skip(th, d, a)
    x = torch.randn(4099, device="cuda")
    y = torch.full_like(x, float("nan"))
    for rep in range(2):
        for off in (0, 1, 3):
            xs, ys = x[off:off + 4096], y[off:off + 4096]
            for bufs in ((xs, ys), (xs.data_ptr(), ys.data_ptr())):
                ys.fill_(float("nan"))
                assert A._c_entry(th, a, 1.0, d, bufs[0], 0.0, d, bufs[1]) is None
                torch.cuda.synchronize()
                assert torch.equal(ys, torch.relu(xs)), (rep, off, type(bufs[0]).__name__)
        x.normal_()
    # alpha / beta: bitwise what the Python function's own launch computes
    xs = x[:4096]
    y0 = torch.randn(4096, device="cuda")
    y1, y2 = y0.clone(), y0.clone()
    assert A._c_entry(th, a, 0.5, d, xs, 2.0, d, y1) is None
    A._activation_forward(th, a, 0.5, d, xs, 2.0, d, y2)
    torch.cuda.synchronize()
    assert torch.equal(y1, y2)
    assert torch.allclose(y1, 0.5 * torch.relu(xs) + 2.0 * y0, rtol=1e-6, atol=1e-6)


def test_entry_errors_unchanged(th):
    d, a = _setup()
    _entry_or_skip(th, d, a)
    x, y = torch.randn(4096, device="cuda"), torch.empty(4096, device="cuda")
    with pytest.raises(P.PydnnError) as e:
        P.activation_forward(th, a, 1.0, d, x, 0.0, d, torch.empty(10, device="cuda"))
    assert e.value.status == P.PYDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT and e.value.message.startswith("y: ")
    with pytest.raises(P.PydnnError) as e:
        P.activation_forward(th, a, 1.0, d, x.cpu(), 0.0, d, y)
    assert e.value.status == P.PYDNN_STATUS_BAD_PARAM and "not CUDA memory" in e.value.message
    with pytest.raises(P.PydnnError) as e:
        P.activation_forward(th, a, 1.0, d, 0, 0.0, d, y)
    assert e.value.status == P.PYDNN_STATUS_BAD_PARAM_NULL_POINTER
    assert P.get_last_error_string().startswith("activation_forward: ")
    with pytest.raises(TypeError):
        P.activation_forward(th, a, 1.0, d, x, 0.0, d, y, 1)


def test_entry_is_graph_capturable(th):
    d, a = _setup()
    _entry_or_skip(th, d, a)
    x, y = torch.randn(4096, device="cuda"), torch.empty(4096, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        P.set_stream(th, stream.cuda_stream)
        P.activation_forward(th, a, 1.0, d, x, 0.0, d, y)  # warm-up on the capture stream
        stream.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=stream):
            assert A._c_entry(th, a, 1.0, d, x, 0.0, d, y) is None
    torch.cuda.synchronize()
    for _ in range(2):
        x.normal_()
        y.fill_(float("nan"))
        torch.cuda.synchronize()
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, torch.relu(x))
    P.set_stream(th, torch.cuda.current_stream().cuda_stream)


def test_public_entry_object_and_slots_follow_sets(th):
    """Session 31: pydnn.activation_forward is the compiled entry object once set up, and a repeated call is
    answered from its call-site slot (fastcall act_stats' hits move); a Set of the activation descriptor (same
    object, new mode) or of the tensor descriptor is seen by the next call (it computes the new function), and
    the results stay bitwise the Python function's."""
    from pydnn._build import fastcall

    d, a = _setup()
    _entry_or_skip(th, d, a)
    assert type(P.activation_forward).__name__ == "Entry", P.activation_forward
    assert P.activation_forward.__wrapped__ is not None and P.activation_forward.__name__ == "activation_forward"
    lib = fastcall._state["lib"]
    x, y = torch.randn(4096, device="cuda"), torch.empty(4096, device="cuda")
    P.activation_forward(th, a, 1.0, d, x, 0.0, d, y)
    h0 = lib.act_stats()[0]
    for _ in range(3):
        y.fill_(float("nan"))
        P.activation_forward(th, a, 1.0, d, x, 0.0, d, y)
    torch.cuda.synchronize()
    assert lib.act_stats()[0] - h0 == 3
    assert torch.equal(y, torch.relu(x))
    P.set_activation_descriptor(a, P.PYDNN_ACTIVATION_TANH, P.PYDNN_NOT_PROPAGATE_NAN, 0.0)
    for _ in range(3):  # the first plans (Python), the next from a fresh lookup, then the slot
        y.fill_(float("nan"))
        P.activation_forward(th, a, 1.0, d, x, 0.0, d, y)
        y2 = torch.full_like(y, float("nan"))
        A._activation_forward(th, a, 1.0, d, x, 0.0, d, y2)
        torch.cuda.synchronize()
        assert torch.equal(y, y2)
        assert torch.allclose(y, torch.tanh(x), rtol=1e-5, atol=1e-6)
    P.set_tensor_nd_descriptor_ex(d, P.PYDNN_TENSOR_NCHW, P.PYDNN_DATA_FLOAT, 4, [1, 1, 1, 2048])  # half of it
    y.fill_(float("nan"))
    for _ in range(2):
        P.activation_forward(th, a, 1.0, d, x, 0.0, d, y)
    torch.cuda.synchronize()
    assert torch.allclose(y[:2048], torch.tanh(x[:2048]), rtol=1e-5, atol=1e-6)
    assert torch.isnan(y[2048:]).all()  # nothing written past the new span


def test_entry_answers_cupy_arrays(th):
    """Session 31: cupy arrays (buffers.CUPY_ARRAY once verified against their __cuda_array_interface__) are
    answered by the compiled entry too (data.ptr, nbytes, flags.c_contiguous read as buffers._cupy_ptr reads
    them); a strided or short array goes to the Python function (the exact span, the same errors)."""
    cupy = pytest.importorskip("cupy")
    from pydnn import buffers

    d, a = _setup()
    _entry_or_skip(th, d, a)
    x = cupy.random.standard_normal(4096, dtype=cupy.float32)
    y = cupy.full(4096, float("nan"), dtype=cupy.float32)
    P.activation_forward(th, a, 1.0, d, x, 0.0, d, y)  # verifies cupy.ndarray on the Python path
    torch.cuda.synchronize()
    assert buffers.CUPY_ARRAY is type(x)
    for _ in range(2):
        y.fill(float("nan"))
        torch.cuda.synchronize()
        assert A._c_entry(th, a, 1.0, d, x, 0.0, d, y) is None  # answered in C
        torch.cuda.synchronize()
        assert bool((y == cupy.maximum(x, 0)).all())
    xs = cupy.random.standard_normal(8192, dtype=cupy.float32)[::2]  # strided: the Python function's exact span
    assert A._c_entry(th, a, 1.0, d, xs, 0.0, d, y) is False
    with pytest.raises(P.PydnnError) as e:
        P.activation_forward(th, a, 1.0, d, x, 0.0, d, cupy.empty(10, dtype=cupy.float32))
    assert e.value.status == P.PYDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT
