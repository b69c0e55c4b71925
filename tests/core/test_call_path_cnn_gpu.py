"""The call records of the CNN demo's calls (tuning.callpath.CALL_RECORDS: convolution forward / backward data /
backward filter / bias + activation, pydnn.matmul) on the GPU: a repeated call on other buffers, given as int
pointers or as torch tensors, computes bit for bit what the full path computes for the same inputs, and
activation_backward's inline path computes ReLU's gradient exactly. The demo's layers at batch 8, bf16."""
import pytest

import pydnn as P
from pydnn import tuning

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

BF16, F32 = P.PYDNN_DATA_BFLOAT16, P.PYDNN_DATA_FLOAT
NHWC, NCHW = P.PYDNN_TENSOR_NHWC, P.PYDNN_TENSOR_NCHW
N = 8


@pytest.fixture
def th():
    h = P.create()
    P.set_stream(h, torch.cuda.current_stream().cuda_stream)
    yield h
    torch.cuda.synchronize()
    tuning.callpath.reset()
    P.destroy(h)


def _td(dims, fmt=NCHW):
    d = P.create_tensor_descriptor()
    P.set_tensor_nd_descriptor_ex(d, fmt, BF16, len(dims), list(dims))
    return d


def _best(perfs):
    return next(p.algo for p in perfs if p.status == P.PYDNN_STATUS_SUCCESS)


def _conv(kind, h):
    """(run(x, w, y, bias) -> None on fresh descriptors' call, sizes) for one call kind; x / w / y in the call's
    own roles (backward data: w, dy, dx; backward filter: x, dy, dw)."""
    c, k, fmt = (3, 64, NCHW) if kind == "cba" else (64, 128, NHWC)
    xd, yd = _td((N, c, 32, 32), fmt), _td((N, k, 32, 32), fmt)
    wd = P.create_filter_descriptor()
    P.set_filter4d_descriptor(wd, BF16, fmt, k, c, 3, 3)
    cd = P.create_convolution_descriptor()
    P.set_convolution2d_descriptor(cd, 1, 1, 1, 1, 1, 1, P.PYDNN_CROSS_CORRELATION, F32)
    P.set_convolution_math_type(cd, P.PYDNN_TENSOR_OP_MATH)
    bd = _td((1, k, 1, 1))
    ad = P.create_activation_descriptor()
    P.set_activation_descriptor(ad, P.PYDNN_ACTIVATION_RELU, P.PYDNN_NOT_PROPAGATE_NAN, 0.0)
    if kind in ("fwd", "cba"):
        algo = _best(P.get_convolution_forward_algorithm_v7(h, xd, wd, cd, yd, 8))
        ws = P.get_convolution_forward_workspace_size(h, xd, wd, cd, yd, algo)
    elif kind == "bwd_data":
        algo = _best(P.get_convolution_backward_data_algorithm_v7(h, wd, yd, cd, xd, 8))
        ws = P.get_convolution_backward_data_workspace_size(h, wd, yd, cd, xd, algo)
    else:
        algo = _best(P.get_convolution_backward_filter_algorithm_v7(h, xd, yd, cd, wd, 8))
        ws = P.get_convolution_backward_filter_workspace_size(h, xd, yd, cd, wd, algo)
    work = torch.empty(max(ws, 16), dtype=torch.uint8, device="cuda")
    nx, nw, ny = N * c * 32 * 32, k * c * 9, N * k * 32 * 32

    def run(a, b, out, bias):
        if kind == "fwd":
            P.convolution_forward(h, 1.0, xd, a, wd, b, cd, algo, work, ws, 0.0, yd, out)
        elif kind == "bwd_data":
            P.convolution_backward_data(h, 1.0, wd, a, yd, b, cd, algo, work, ws, 0.0, xd, out)
        elif kind == "bwd_filter":
            P.convolution_backward_filter(h, 1.0, xd, a, yd, b, cd, algo, work, ws, 0.0, wd, out)
        else:
            P.convolution_bias_activation_forward(h, 1.0, xd, a, wd, b, cd, algo, work, ws, 0.0, yd, out, bd, bias,
                                                  ad, yd, out)
    sizes = {"fwd": (nx, nw, ny), "cba": (nx, nw, ny), "bwd_data": (nw, ny, nx), "bwd_filter": (nx, ny, nw)}[kind]
    return run, sizes, k


def _inputs(sizes, k, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(sizes[0], device="cuda", generator=g).to(torch.bfloat16)
    b = torch.randn(sizes[1], device="cuda", generator=g).to(torch.bfloat16)
    bias = torch.randn(k, device="cuda", generator=g).to(torch.bfloat16)
    return a, b, bias


@pytest.mark.parametrize("kind", ["fwd", "bwd_data", "bwd_filter", "cba"])
def test_conv_cached_calls_match_the_full_path(th, kind):
    run, sizes, k = _conv(kind, th)
    a0, b0, bias0 = _inputs(sizes, k, 0)
    run(a0, b0, torch.empty(sizes[2], dtype=torch.bfloat16, device="cuda"), bias0)  # the record
    outs = []
    for seed, as_int in ((1, True), (2, False), (3, True)):
        a, b, bias = _inputs(sizes, k, seed)
        out = torch.full((sizes[2],), float("nan"), dtype=torch.bfloat16, device="cuda")
        if as_int:
            run(a.data_ptr(), b.data_ptr(), out.data_ptr(), bias.data_ptr())
        else:
            run(a, b, out, bias)
        outs.append((seed, out))
    tuning.callpath.CALL_RECORDS = False
    full, _, _ = _conv(kind, th)  # fresh descriptors: every call through the full path
    for seed, out in outs:
        a, b, bias = _inputs(sizes, k, seed)
        ref = torch.full((sizes[2],), float("nan"), dtype=torch.bfloat16, device="cuda")
        full(a, b, ref, bias)
        torch.cuda.synchronize()
        assert not torch.isnan(out).any()
        assert torch.equal(out, ref), (kind, seed)


def test_matmul_cached_calls_match_the_full_path(th):
    def descs():
        return _td((N, 8192)), _td((8192, 10)), _td((N, 10))

    ad, bd, cd = descs()
    g = torch.Generator(device="cuda").manual_seed(0)
    ins = [(torch.randn(N, 8192, device="cuda", generator=g).to(torch.bfloat16),
            torch.randn(8192, 10, device="cuda", generator=g).to(torch.bfloat16)) for _ in range(3)]
    c0 = torch.empty(N, 10, dtype=torch.bfloat16, device="cuda")
    P.matmul(th, 1.0, ad, ins[0][0], bd, ins[0][1], 0.0, cd, c0)
    outs = []
    for i, (a, b) in enumerate(ins[1:]):
        c = torch.full((N, 10), float("nan"), dtype=torch.bfloat16, device="cuda")
        if i == 0:
            P.matmul(th, 1.0, ad, a.data_ptr(), bd, b.data_ptr(), 0.0, cd, c.data_ptr())
        else:
            P.matmul(th, 1.0, ad, a, bd, b, 0.0, cd, c)
        outs.append(c)
    tuning.callpath.CALL_RECORDS = False
    ad2, bd2, cd2 = descs()
    for (a, b), c in zip(ins[1:], outs):
        ref = torch.empty(N, 10, dtype=torch.bfloat16, device="cuda")
        P.matmul(th, 1.0, ad2, a, bd2, b, 0.0, cd2, ref)
        torch.cuda.synchronize()
        assert torch.equal(c, ref)
        torch.testing.assert_close(c.float(), a.float() @ b.float(), rtol=2e-2, atol=2e-1)


def test_activation_backward_inline_path(th):
    d = _td((N, 64, 32, 32))
    ad = P.create_activation_descriptor()
    P.set_activation_descriptor(ad, P.PYDNN_ACTIVATION_RELU, P.PYDNN_NOT_PROPAGATE_NAN, 0.0)
    n = N * 64 * 32 * 32
    for rep in range(3):
        y = torch.randn(n, device="cuda").to(torch.bfloat16)
        dy = torch.randn(n, device="cuda").to(torch.bfloat16)
        dx = torch.full((n,), float("nan"), dtype=torch.bfloat16, device="cuda")
        if rep == 1:
            P.activation_backward(th, ad, 1.0, d, y, d, dy, d, y, 0.0, d, dx)
        else:
            P.activation_backward(th, ad, 1.0, d, y.data_ptr(), d, dy.data_ptr(), d, y.data_ptr(), 0.0, d,
                                  dx.data_ptr())
        torch.cuda.synchronize()
        assert torch.equal(dx, torch.where(y > 0, dy, torch.zeros_like(dy)))
