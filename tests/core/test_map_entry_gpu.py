"""The element-wise calls' compiled entries (fastcall's map kinds, tuning.callpath.C_ENTRY_MAP) on the GPU:
activation_backward, add_tensor, scale_tensor, op_tensor and transform_tensor called repeatedly through their
public names with torch tensors and int pointers are answered from their call-site slots (map_stats' hits move)
and compute, on fresh random inputs with the outputs poisoned first, what a float64 numpy reference computes
(fp32 tolerances), on aligned and misaligned views (the vector and the scalar kernel), bitwise what the Python
function behind each computes; a Set of a descriptor is seen by the next call; a call is captured into a CUDA
graph and replayed on new inputs."""
import numpy as np
import pytest

import pydnn as P

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

N = 4096
TOL = dict(rtol=2e-6, atol=2e-6)  # float32 results of float32 inputs of magnitude ~1, references in float64


def _lib():
    from pydnn._build import fastcall

    lib = fastcall._state.get("lib")
    if lib is None or not hasattr(lib, "map_stats") or type(P.add_tensor).__name__ != "Entry":
        pytest.skip("the compiled entries are not available here (no C compiler or Python headers)")
    return lib


def _desc(n=N):
    d = P.create_tensor_descriptor()
    P.set_tensor_nd_descriptor_ex(d, P.PYDNN_TENSOR_NCHW, P.PYDNN_DATA_FLOAT, 4, [1, 1, 1, n])
    return d


def _np(t):
    return t.detach().cpu().numpy().astype(np.float64)


def _warm(th):
    """Plans one element-wise call (the first compiled launch record sets the entries up)."""
    d = _desc()
    a = P.create_activation_descriptor()
    P.set_activation_descriptor(a, P.PYDNN_ACTIVATION_RELU, P.PYDNN_NOT_PROPAGATE_NAN, 0.0)
    x, y = torch.randn(N, device="cuda"), torch.empty(N, device="cuda")
    for _ in range(2):
        P.activation_forward(th, a, 1.0, d, x, 0.0, d, y)
    return _lib()


def _kinds(th):
    """name -> (args(bufs, alpha, beta), buffers read, the output's index, reference(inputs as float64, alpha, beta,
    the output before))"""
    d = _desc()
    act = P.create_activation_descriptor()
    P.set_activation_descriptor(act, P.PYDNN_ACTIVATION_RELU, P.PYDNN_NOT_PROPAGATE_NAN, 0.0)
    op = P.create_op_tensor_descriptor()
    P.set_op_tensor_descriptor(op, P.PYDNN_OP_TENSOR_ADD, P.PYDNN_DATA_FLOAT, P.PYDNN_NOT_PROPAGATE_NAN)
    return {
        # dx = alpha * (x > 0 ? dy : 0) + beta * dx  (bufs: y, dy, x, dx)
        "activation_backward": (lambda b, al, be: (th, act, al, d, b[0], d, b[1], d, b[2], be, d, b[3]), 4, 3,
                                lambda v, al, be, o: al * np.where(v[2] > 0, v[1], 0.0) + be * o),
        "add_tensor": (lambda b, al, be: (th, al, d, b[0], be, d, b[1]), 2, 1, lambda v, al, be, o: al * v[0] + be * o),
        "scale_tensor": (lambda b, al, be: (th, d, b[0], al), 1, 0, lambda v, al, be, o: al * o),
        "op_tensor": (lambda b, al, be: (th, op, al, d, b[0], 0.25, d, b[1], be, d, b[2]), 3, 2,
                      lambda v, al, be, o: al * v[0] + 0.25 * v[1] + be * o),
        "transform_tensor": (lambda b, al, be: (th, al, d, b[0], be, d, b[1]), 2, 1,
                             lambda v, al, be, o: al * v[0] + be * o),
    }


def _python_fn(name):
    from pydnn.ops import _elementwise as ew

    return getattr(ew._ENTRY_MODULES[name], "_py_" + name)


@pytest.mark.parametrize("name", ["activation_backward", "add_tensor", "scale_tensor", "op_tensor",
                                  "transform_tensor"])
def test_entries_results(th, name):
    lib = _warm(th)
    kinds = _kinds(th)
    mk, nbuf, out, ref = kinds[name]
    from pydnn._build import fastcall

    k = fastcall.MAP_KINDS[name]
    hits = 0
    for rep in range(3):
        for off in (0, 1):  # 16-byte aligned views, then misaligned ones (the scalar kernel)
            for al, be in ((1.0, 0.0), (0.75, 1.5)):
                for as_int in (False, True):
                    full = [torch.randn(N + 3, device="cuda") for _ in range(nbuf)]
                    views = [f[off:off + N] for f in full]
                    before, around = views[out].clone(), full[out].clone()
                    if be == 0.0 and name != "scale_tensor":  # (scale_tensor's y is its input)
                        views[out].fill_(float("nan"))
                    inputs = [_np(v) for v in views]
                    o0 = _np(before)
                    bufs = [v.data_ptr() for v in views] if as_int else views
                    h0 = lib.map_stats()[0][k]
                    getattr(P, name)(*mk(bufs, al, be))
                    hits += lib.map_stats()[0][k] - h0
                    torch.cuda.synchronize()
                    got = _np(views[out])
                    want = ref(inputs, al, be, o0)
                    np.testing.assert_allclose(got, want, **TOL, err_msg=f"{name} rep {rep} off {off} {al} {be}")
                    # bitwise the Python function's launch on the same inputs
                    views[out].copy_(before)
                    if be == 0.0 and name != "scale_tensor":
                        views[out].fill_(float("nan"))
                    _python_fn(name)(*mk(bufs, al, be))
                    torch.cuda.synchronize()
                    assert np.array_equal(_np(views[out]), got), (name, rep, off)
                    outside = torch.cat([full[out][:off] != around[:off], full[out][off + N:] != around[off + N:]])
                    assert not bool(outside.any()), (name, "written outside the descriptor's span")
    # every call of the site after its first is answered from the slot (23 of 24); transform_tensor's alternate
    # between its copy key (alpha 1, beta 0) and its scaled key, so each change of scalars declines once (12 of 24)
    assert hits >= (12 if name == "transform_tensor" else 23), hits


def test_entries_follow_sets_and_errors(th):
    lib = _warm(th)
    d = _desc()
    op = P.create_op_tensor_descriptor()
    P.set_op_tensor_descriptor(op, P.PYDNN_OP_TENSOR_ADD, P.PYDNN_DATA_FLOAT, P.PYDNN_NOT_PROPAGATE_NAN)
    a, b, c = (torch.randn(N, device="cuda") for _ in range(3))
    for _ in range(3):
        c.fill_(float("nan"))
        P.op_tensor(th, op, 1.0, d, a, 1.0, d, b, 0.0, d, c)
    torch.cuda.synchronize()
    np.testing.assert_allclose(_np(c), _np(a) + _np(b), **TOL)
    P.set_op_tensor_descriptor(op, P.PYDNN_OP_TENSOR_MUL, P.PYDNN_DATA_FLOAT, P.PYDNN_NOT_PROPAGATE_NAN)
    for _ in range(3):  # the first after the Set plans (Python), then the slot again
        c.fill_(float("nan"))
        P.op_tensor(th, op, 1.0, d, a, 1.0, d, b, 0.0, d, c)
        torch.cuda.synchronize()
        np.testing.assert_allclose(_np(c), _np(a) * _np(b), **TOL)
    P.set_tensor_nd_descriptor_ex(d, P.PYDNN_TENSOR_NCHW, P.PYDNN_DATA_FLOAT, 4, [1, 1, 1, N // 2])  # half of it
    c.fill_(float("nan"))
    for _ in range(2):
        P.add_tensor(th, 1.0, d, a, 0.0, d, c)
    torch.cuda.synchronize()
    np.testing.assert_allclose(_np(c[:N // 2]), _np(a[:N // 2]), **TOL)
    assert np.isnan(_np(c[N // 2:])).all()  # nothing written past the new span
    with pytest.raises(P.PydnnError) as e:
        P.add_tensor(th, 1.0, d, a, 0.0, d, torch.empty(10, device="cuda"))
    assert e.value.status == P.PYDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT and e.value.message.startswith("C: ")
    with pytest.raises(P.PydnnError) as e:
        P.add_tensor(th, 1.0, d, a.cpu(), 0.0, d, c)
    assert e.value.status == P.PYDNN_STATUS_BAD_PARAM and "not CUDA memory" in e.value.message
    assert P.get_last_error_string().startswith("add_tensor: ")
    with pytest.raises(TypeError):
        P.add_tensor(th, 1.0, d, a, 0.0, d, c, 1)
    assert sum(lib.map_stats()[0]) > 0


def test_entry_is_graph_capturable(th):
    _warm(th)
    d = _desc()
    a, c = torch.randn(N, device="cuda"), torch.empty(N, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        P.set_stream(th, stream.cuda_stream)
        for _ in range(2):  # warm-up on the capture stream: the second call fills the slot
            P.add_tensor(th, 2.0, d, a, 0.0, d, c)
        stream.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=stream):
            P.add_tensor(th, 2.0, d, a, 0.0, d, c)
    torch.cuda.synchronize()
    for _ in range(2):
        a.normal_()
        c.fill_(float("nan"))
        torch.cuda.synchronize()
        g.replay()
        torch.cuda.synchronize()
        np.testing.assert_allclose(_np(c), 2.0 * _np(a), **TOL)
    P.set_stream(th, torch.cuda.current_stream().cuda_stream)


def _softmax_ref(x, al, be, o):
    """Channel softmax of an NCHW (1, C, 1, 1) tensor: one row of C, in float64."""
    e = np.exp(x - x.max())
    return al * e / e.sum() + be * o


def _maxpool_ref(x, h, w, al, be, o):
    """2x2 max pooling, stride 2, of an (h, w) plane, in float64."""
    return al * x.reshape(h // 2, 2, w // 2, 2).max(axis=(1, 3)).reshape(-1) + be * o


@pytest.mark.parametrize("name", ["softmax_forward", "pooling_forward"])
def test_plan_entries_results(th, name):
    """softmax_forward / pooling_forward through their compiled entries (plan_core: the plan's first launch for
    16-byte aligned pointers, its last for the others; a pointer that is not a multiple of the element size is
    the Python function's to refuse)."""
    from pydnn._build import fastcall

    lib = _warm(th)
    k = fastcall.MAP_KINDS[name]
    if name == "softmax_forward":
        C = 1000
        xd = P.create_tensor_descriptor()
        P.set_tensor_nd_descriptor_ex(xd, P.PYDNN_TENSOR_NCHW, P.PYDNN_DATA_FLOAT, 4, [1, C, 1, 1])
        yd, nx, ny = xd, C, C
        sm = (P.PYDNN_SOFTMAX_ACCURATE, P.PYDNN_SOFTMAX_MODE_CHANNEL)
        mk = lambda b, al, be: (th, *sm, al, xd, b[0], be, yd, b[1])  # noqa: E731
        ref = lambda x, al, be, o: _softmax_ref(x, al, be, o)  # noqa: E731
        tol = dict(rtol=1e-5, atol=1e-7)  # exp and a 1000-term sum in float32
    else:
        hh, ww = 32, 64
        pd = P.create_pooling_descriptor()
        P.set_pooling2d_descriptor(pd, P.PYDNN_POOLING_MAX, P.PYDNN_NOT_PROPAGATE_NAN, 2, 2, 0, 0, 2, 2)
        xd, yd = P.create_tensor_descriptor(), P.create_tensor_descriptor()
        P.set_tensor_nd_descriptor_ex(xd, P.PYDNN_TENSOR_NCHW, P.PYDNN_DATA_FLOAT, 4, [1, 1, hh, ww])
        P.set_tensor_nd_descriptor_ex(yd, P.PYDNN_TENSOR_NCHW, P.PYDNN_DATA_FLOAT, 4, [1, 1, hh // 2, ww // 2])
        nx, ny = hh * ww, hh * ww // 4
        mk = lambda b, al, be: (th, pd, al, xd, b[0], be, yd, b[1])  # noqa: E731
        ref = lambda x, al, be, o: _maxpool_ref(x, hh, ww, al, be, o)  # noqa: E731
        tol = TOL
    hits = 0
    for rep in range(3):
        for off in (0, 1):  # 16-byte aligned, then 4-byte aligned pointers
            for al, be in ((1.0, 0.0), (0.5, 2.0)):
                for as_int in (False, True):
                    xf, yf = torch.randn(nx + 3, device="cuda"), torch.randn(ny + 3, device="cuda")
                    x, y = xf[off:off + nx], yf[off:off + ny]
                    around = yf.clone()
                    if be == 0.0:
                        y.fill_(float("nan"))
                    before = _np(around[off:off + ny])
                    bufs = (x.data_ptr(), y.data_ptr()) if as_int else (x, y)
                    h0 = lib.map_stats()[0][k]
                    getattr(P, name)(*mk(bufs, al, be))
                    hits += lib.map_stats()[0][k] - h0
                    torch.cuda.synchronize()
                    got = _np(y)
                    np.testing.assert_allclose(got, ref(_np(x), al, be, before), **tol,
                                               err_msg=f"{name} rep {rep} off {off} {al} {be}")
                    outside = torch.cat([yf[:off] != around[:off], yf[off + ny:] != around[off + ny:]])
                    assert not bool(outside.any()), (name, "written outside the descriptor's span")
                    y.copy_(around[off:off + ny])
                    if be == 0.0:
                        y.fill_(float("nan"))
                    _python_fn_plan(name)(*mk(bufs, al, be))
                    torch.cuda.synchronize()
                    assert np.array_equal(_np(y), got), (name, rep, off)
    assert hits >= 23, hits
    with pytest.raises(P.PydnnError) as e:  # not a multiple of the element size: declined, refused in Python
        getattr(P, name)(*mk((x.data_ptr() + 2, y.data_ptr()), 1.0, 0.0))
    assert e.value.status == P.PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER


_python_fn_plan = _python_fn


@pytest.mark.parametrize("n", [1000, 65536])
def test_reduce_entry_results(th, n):
    """reduce_tensor (a sum of n floats into one) through its compiled entry: 65536 takes a workspace and a finish
    pass (two launches) in C as in Python; the workspace's size, buffer and alignment checked as _buffers does."""
    from pydnn._build import fastcall

    lib = _warm(th)
    k = fastcall.MAP_KINDS["reduce_tensor"]
    rd = P.create_reduce_tensor_descriptor()
    P.set_reduce_tensor_descriptor(rd, P.PYDNN_REDUCE_TENSOR_ADD, P.PYDNN_DATA_FLOAT, P.PYDNN_NOT_PROPAGATE_NAN,
                                   P.PYDNN_REDUCE_TENSOR_NO_INDICES, P.PYDNN_32BIT_INDICES)
    ad, cd = P.create_tensor_descriptor(), P.create_tensor_descriptor()
    P.set_tensor_nd_descriptor_ex(ad, P.PYDNN_TENSOR_NCHW, P.PYDNN_DATA_FLOAT, 4, [1, n, 1, 1])
    P.set_tensor_nd_descriptor_ex(cd, P.PYDNN_TENSOR_NCHW, P.PYDNN_DATA_FLOAT, 4, [1, 1, 1, 1])
    wsz = P.get_reduction_workspace_size(th, rd, ad, cd)
    ws = torch.empty(max(wsz, 8) // 4 + 4, device="cuda")
    hits = 0
    for rep in range(3):
        for off in (0, 1):  # the input 16-byte aligned, then not (the plan's other launch where it has two)
            for al, be in ((1.0, 0.0), (0.5, 2.0)):
                for as_int in (False, True):
                    af = torch.randn(n + 3, device="cuda")
                    a = af[off:off + n]
                    c = torch.randn(1, device="cuda")
                    before = _np(c)
                    if be == 0.0:
                        c.fill_(float("nan"))
                    bufs = (a.data_ptr(), c.data_ptr(), ws.data_ptr()) if as_int else (a, c, ws)
                    h0 = lib.map_stats()[0][k]
                    P.reduce_tensor(th, rd, None, 0, bufs[2], wsz, al, ad, bufs[0], be, cd, bufs[1])
                    hits += lib.map_stats()[0][k] - h0
                    torch.cuda.synchronize()
                    got = _np(c)
                    want = al * _np(a).sum() + be * before
                    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(_np(a)).sum() ** 0.5,
                                               err_msg=f"n {n} rep {rep} off {off} {al} {be}")
                    c.copy_(torch.from_numpy(before.astype(np.float32)).cuda())
                    if be == 0.0:
                        c.fill_(float("nan"))
                    from pydnn.ops import reduce as R

                    R._py_reduce_tensor(th, rd, None, 0, bufs[2], wsz, al, ad, bufs[0], be, cd, bufs[1])
                    torch.cuda.synchronize()
                    assert np.array_equal(_np(c), got), (n, rep, off)
    assert hits >= 23, hits
    if wsz:
        with pytest.raises(P.PydnnError) as e:  # a workspace size short of the plan's: declined, refused in Python
            P.reduce_tensor(th, rd, None, 0, ws, wsz - 8, 1.0, ad, a, 0.0, cd, c)
        assert e.value.status == P.PYDNN_STATUS_BAD_PARAM


@pytest.mark.parametrize("shape", [(2, 16, 8, 8), (4, 3, 5, 7)])
def test_bn_inference_entry_results(th, shape):
    """batch_normalization_forward_inference through its compiled entry (bn_core: the launch of x | y's alignment
    tier, its fields, the 17 pointers, alpha / beta / epsilon and the flags) against float64; in place (x is y) and
    a bad epsilon are the Python function's."""
    from pydnn._build import fastcall
    from pydnn.ops import batchnorm as BN

    lib = _warm(th)
    k = fastcall.MAP_KINDS["batch_normalization_forward_inference"]
    n, c, hh, ww = shape
    xd = P.create_tensor_descriptor()
    P.set_tensor_nd_descriptor_ex(xd, P.PYDNN_TENSOR_NCHW, P.PYDNN_DATA_FLOAT, 4, list(shape))
    sbd = P.create_tensor_descriptor()
    P.derive_bn_tensor_descriptor(sbd, xd, P.PYDNN_BATCHNORM_SPATIAL)
    total, eps = n * c * hh * ww, 1e-5
    prm = [torch.randn(c, device="cuda") for _ in range(3)] + [torch.rand(c, device="cuda") + 0.5]
    s_, b_, m_, v_ = (_np(t) for t in prm)
    bshape = (1, c, 1, 1)
    mode = P.PYDNN_BATCHNORM_SPATIAL
    hits = 0
    for rep in range(3):
        for off in (0, 1):  # x and y 16-byte aligned, then 4 bytes off (another tier's launch)
            for al, be in ((1.0, 0.0), (0.5, 2.0)):
                for as_int in (False, True):
                    xf, yf = torch.randn(total + 3, device="cuda"), torch.randn(total + 3, device="cuda")
                    x, y = xf[off:off + total], yf[off:off + total]
                    around = yf.clone()
                    if be == 0.0:
                        y.fill_(float("nan"))
                    before = _np(around[off:off + total]).reshape(shape)
                    bufs = [x, y] + prm
                    if as_int:
                        bufs = [t.data_ptr() for t in bufs]
                    h0 = lib.map_stats()[0][k]
                    P.batch_normalization_forward_inference(th, mode, al, be, xd, bufs[0], xd, bufs[1], sbd, *bufs[2:],
                                                            eps)
                    hits += lib.map_stats()[0][k] - h0
                    torch.cuda.synchronize()
                    got = _np(y)
                    xn = (_np(x).reshape(shape) - m_.reshape(bshape)) / np.sqrt(v_.reshape(bshape) + eps)
                    want = al * (s_.reshape(bshape) * xn + b_.reshape(bshape)) + be * before
                    np.testing.assert_allclose(got, want.reshape(-1), rtol=1e-5, atol=1e-5,
                                               err_msg=f"{shape} rep {rep} off {off} {al} {be}")
                    outside = torch.cat([yf[:off] != around[:off], yf[off + total:] != around[off + total:]])
                    assert not bool(outside.any()), (shape, "written outside the descriptor's span")
                    y.copy_(around[off:off + total])
                    if be == 0.0:
                        y.fill_(float("nan"))
                    BN._py_batch_normalization_forward_inference(th, mode, al, be, xd, bufs[0], xd, bufs[1], sbd,
                                                                 *bufs[2:], eps)
                    torch.cuda.synchronize()
                    assert np.array_equal(_np(y), got), (shape, rep, off)
    # the first call of each alignment tier loads its kernel in Python; every other call is answered in C
    assert hits >= 20, hits
    x = torch.randn(total, device="cuda")
    ref = x.clone()
    P.batch_normalization_forward_inference(th, mode, 1.0, 0.0, xd, x, xd, x, sbd, *prm, eps)  # in place: Python
    torch.cuda.synchronize()
    xn = (_np(ref).reshape(shape) - m_.reshape(bshape)) / np.sqrt(v_.reshape(bshape) + eps)
    np.testing.assert_allclose(_np(x), (s_.reshape(bshape) * xn + b_.reshape(bshape)).reshape(-1), rtol=1e-5,
                               atol=1e-5)
    with pytest.raises(P.PydnnError) as e:
        P.batch_normalization_forward_inference(th, mode, 1.0, 0.0, xd, x, xd, y, sbd, *prm, -1.0)
    assert e.value.status == P.PYDNN_STATUS_BAD_PARAM


@pytest.mark.parametrize("shape", [(2, 8, 4, 4), (3, 5, 7, 9)])
def test_norm_inference_entry_results(th, shape):
    """norm_forward_inference (layer norm over C, H, W) through its compiled entry (nm_core: the alternative of x | y's
    16-byte alignment, its launches' pointers, scalars and flags) against float64, with a bias and without (None);
    in place (x is y) is the Python function's."""
    from pydnn._build import fastcall
    from pydnn.ops import normalization as NM

    lib = _warm(th)
    k = fastcall.MAP_KINDS["norm_forward_inference"]
    n = shape[0]
    total, eps = int(np.prod(shape)), 1e-5
    xd = P.create_tensor_descriptor()
    P.set_tensor_nd_descriptor_ex(xd, P.PYDNN_TENSOR_NCHW, P.PYDNN_DATA_FLOAT, 4, list(shape))
    nd = P.create_norm_descriptor()
    P.set_norm_descriptor(nd, P.PYDNN_NORM_KIND_LAYER, 1, 3, eps, None)
    sbd, mid = P.create_tensor_descriptor(), P.create_tensor_descriptor()
    P.derive_norm_param_descriptors(sbd, mid, xd, nd)
    scale, bias = torch.randn(total // n, device="cuda"), torch.randn(total // n, device="cuda")

    def ref(x, al, be, o, with_bias):
        x = x.reshape(n, -1)
        xn = (x - x.mean(axis=1, keepdims=True)) / np.sqrt(x.var(axis=1, keepdims=True) + eps)
        v = xn * _np(scale) + (_np(bias) if with_bias else 0.0)
        return al * v.reshape(-1) + be * o

    hits = 0
    for rep in range(3):
        for off in (0, 1):
            for al, be in ((1.0, 0.0), (0.5, 2.0)):
                for as_int in (False, True):
                    with_bias = not (rep == 2 and as_int)  # (bias None on some calls: the same slot, no bias)
                    xf, yf = torch.randn(total + 3, device="cuda"), torch.randn(total + 3, device="cuda")
                    x, y = xf[off:off + total], yf[off:off + total]
                    around = yf.clone()
                    if be == 0.0:
                        y.fill_(float("nan"))
                    before = _np(around[off:off + total])
                    bufs = [x, y, scale, bias if with_bias else None]
                    if as_int:
                        bufs = [t.data_ptr() if t is not None else None for t in bufs]
                    h0 = lib.map_stats()[0][k]
                    P.norm_forward_inference(th, nd, al, be, xd, bufs[0], xd, bufs[1], sbd, bufs[2], bufs[3])
                    hits += lib.map_stats()[0][k] - h0
                    torch.cuda.synchronize()
                    got = _np(y)
                    np.testing.assert_allclose(got, ref(_np(x), al, be, before, with_bias), rtol=1e-4, atol=1e-4,
                                               err_msg=f"{shape} rep {rep} off {off} {al} {be}")
                    outside = torch.cat([yf[:off] != around[:off], yf[off + total:] != around[off + total:]])
                    assert not bool(outside.any()), (shape, "written outside the descriptor's span")
                    y.copy_(around[off:off + total])
                    if be == 0.0:
                        y.fill_(float("nan"))
                    NM._py_norm_forward_inference(th, nd, al, be, xd, bufs[0], xd, bufs[1], sbd, bufs[2], bufs[3])
                    torch.cuda.synchronize()
                    assert np.array_equal(_np(y), got), (shape, rep, off)
    assert hits >= 20, hits
    x = torch.randn(total, device="cuda")
    ref0 = _np(x)
    P.norm_forward_inference(th, nd, 1.0, 0.0, xd, x, xd, x, sbd, scale, bias)  # in place: the Python function
    torch.cuda.synchronize()
    np.testing.assert_allclose(_np(x), ref(ref0, 1.0, 0.0, 0.0 * ref0, True), rtol=1e-4, atol=1e-4)
