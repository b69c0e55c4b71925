"""libpydnn's C fast path on the GPU: libpydnn loaded into this process, the element-wise calls made through
it repeatedly with new data, alpha / beta and pointers (aligned and misaligned), each result checked against
numpy, and the fast path's hit counter showing that the repeated calls were answered in C."""
import os
import subprocess
import sys

import numpy as np
import pytest

import pydnn

pytestmark = pytest.mark.gpu
cffi = pytest.importorskip("cffi")
# libpydnn's embedded interpreter starts inside the process on the first C call: in a process of its own
ISOLATED = os.environ.get("PYDNN_TEST_C_FAST_ISOLATED") == "1"


@pytest.mark.skipif(ISOLATED, reason="this is the isolated process")
def test_in_its_own_process():
    env = dict(os.environ, PYDNN_TEST_C_FAST_ISOLATED="1")
    env.pop("PYDNN_TEST_SHARD", None)  # the child runs the whole file, not a shard's share of it
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__], capture_output=True,
                       text=True, env=env, timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert " passed" in r.stdout and "failed" not in r.stdout, r.stdout[-2000:]


@pytest.fixture(scope="module")
def c():
    torch = pytest.importorskip("torch")
    from cprog import library_path
    from pydnn.capi import decl, fastpath

    ffi = cffi.FFI()
    ffi.cdef(decl.types_block() + "\n" + fastpath.CDEF + "\n".join(decl.prototypes()))
    lib = ffi.dlopen(str(library_path()))
    hp = ffi.new("pydnnHandle_t *")
    assert lib.pydnnCreate(hp) == 0
    assert lib.pydnnSetStream(hp[0], ffi.cast("cudaStream_t", torch.cuda.current_stream().cuda_stream)) == 0
    yield ffi, lib, hp[0], torch
    torch.cuda.synchronize()
    lib.pydnnDestroy(hp[0])


def _tensor(ffi, lib, dims, dtype=pydnn.PYDNN_DATA_FLOAT):
    t = ffi.new("pydnnTensorDescriptor_t *")
    assert lib.pydnnCreateTensorDescriptor(t) == 0
    assert lib.pydnnSetTensor4dDescriptor(t[0], pydnn.PYDNN_TENSOR_NCHW, dtype, *dims) == 0
    return t[0]


def _p(ffi, t, off=0):
    return ffi.cast("void *", t.data_ptr() + off * t.element_size())


@pytest.mark.skipif(not ISOLATED, reason="runs in its own process")
def test_repeated_calls_are_answered_in_c_and_right(c, rng):
    ffi, lib, h, torch = c
    dims = (2, 3, 5, 7)
    n = int(np.prod(dims))
    t = _tensor(ffi, lib, dims)
    bias_d = _tensor(ffi, lib, (1, 3, 1, 1))
    relu = ffi.new("pydnnActivationDescriptor_t *")
    lib.pydnnCreateActivationDescriptor(relu)
    lib.pydnnSetActivationDescriptor(relu[0], pydnn.PYDNN_ACTIVATION_RELU, 0, 0.0)
    tanh = ffi.new("pydnnActivationDescriptor_t *")
    lib.pydnnCreateActivationDescriptor(tanh)
    lib.pydnnSetActivationDescriptor(tanh[0], pydnn.PYDNN_ACTIVATION_TANH, 0, 0.0)
    mul = ffi.new("pydnnOpTensorDescriptor_t *")
    lib.pydnnCreateOpTensorDescriptor(mul)
    lib.pydnnSetOpTensorDescriptor(mul[0], pydnn.PYDNN_OP_TENSOR_MUL, pydnn.PYDNN_DATA_FLOAT, 0)
    f = lambda v: ffi.new("float *", v)  # noqa: E731
    pool = torch.empty(8 * (n + 64), device="cuda")
    hits0 = lib._pydnn_fast_hits()
    calls = 0
    for it in range(6):
        off = (it % 3) * (n + 1)  # three places in the pool, one of them at an odd float offset
        x, y, z = (pool[off + k * (n + 3):off + k * (n + 3) + n] for k in range(3))
        b = pool[off + 3 * (n + 3):off + 3 * (n + 3) + 3]
        xs = rng.standard_normal(n).astype(np.float32)
        ys = rng.standard_normal(n).astype(np.float32)
        bs = rng.standard_normal(3).astype(np.float32)
        al, be = float(rng.choice([1.0, 0.5, -2.0])), float(rng.choice([0.0, 1.0, 0.25]))
        x.copy_(torch.from_numpy(xs))
        y.copy_(torch.from_numpy(ys))
        b.copy_(torch.from_numpy(bs))
        assert lib.pydnnActivationForward(h, relu[0], f(al), t, _p(ffi, x), f(be), t, _p(ffi, y)) == 0
        want = al * np.maximum(xs, 0) + be * ys
        np.testing.assert_allclose(y.cpu().numpy(), want, rtol=1e-6, atol=1e-6)
        assert lib.pydnnAddTensor(h, f(al), bias_d, _p(ffi, b), f(1.0), t, _p(ffi, y)) == 0
        want = want + al * np.broadcast_to(bs.reshape(1, 3, 1, 1), dims).ravel()
        np.testing.assert_allclose(y.cpu().numpy(), want, rtol=1e-5, atol=1e-5)
        z.copy_(torch.from_numpy(ys))
        assert lib.pydnnOpTensor(h, mul[0], f(al), t, _p(ffi, x), f(0.5), t, _p(ffi, y), f(be), t, _p(ffi, z)) == 0
        want_z = (al * xs) * (0.5 * want) + be * ys
        np.testing.assert_allclose(z.cpu().numpy(), want_z, rtol=1e-5, atol=1e-5)
        assert lib.pydnnScaleTensor(h, t, _p(ffi, z), f(al)) == 0
        np.testing.assert_allclose(z.cpu().numpy(), al * want_z, rtol=1e-5, atol=1e-5)
        assert lib.pydnnTransformTensor(h, f(al), t, _p(ffi, x), f(be), t, _p(ffi, z)) == 0
        want_t = al * xs + be * al * want_z
        np.testing.assert_allclose(z.cpu().numpy(), want_t, rtol=1e-5, atol=1e-5)
        # tanh backward: dx = alpha * (1 - y^2) * dy + beta * dx, with y = tanh(x)
        ty = np.tanh(xs)
        y.copy_(torch.from_numpy(ty))
        z.copy_(torch.from_numpy(ys))
        assert lib.pydnnActivationBackward(h, tanh[0], f(al), t, _p(ffi, y), t, _p(ffi, x), t, _p(ffi, x), f(be), t,
                                           _p(ffi, z)) == 0
        np.testing.assert_allclose(z.cpu().numpy(), al * (1 - ty * ty) * xs + be * ys, rtol=1e-5, atol=1e-5)
        calls += 6
    torch.cuda.synchronize()
    # the first call of each (function, descriptors) takes the Python path, and each new alpha / beta pair of
    # the transform may too; the rest are answered in C
    assert lib._pydnn_fast_hits() - hits0 >= calls - 6 - 6, (lib._pydnn_fast_hits() - hits0, calls)


@pytest.mark.skipif(not ISOLATED, reason="runs in its own process")
def test_replay_is_the_python_launch_and_survives_other_calls(c, rng):
    """Session 31 (the records' generation): for each fast function, the call answered in C computes bitwise
    what the same call through the Python path computes (the slow call forced by the C-only epoch), and no
    Python launch is made (driver.launch_args counted); other C calls that change nothing between two relus
    (a size query, a Get, a convolution workspace query) leave the record in use, and a Set made from Python
    on the descriptor behind the C pointer is seen by the next C call (it computes the new function)."""
    from pydnn._cuda import driver
    from pydnn.capi import impl

    ffi, lib, h, torch = c
    dims = (3, 4, 7, 9)
    n = int(np.prod(dims))
    t = _tensor(ffi, lib, dims)
    act = ffi.new("pydnnActivationDescriptor_t *")
    lib.pydnnCreateActivationDescriptor(act)
    lib.pydnnSetActivationDescriptor(act[0], pydnn.PYDNN_ACTIVATION_ELU, 0, 0.7)
    f = lambda v: ffi.new("float *", v)  # noqa: E731
    pool = torch.randn(4 * n + 16, device="cuda")
    py_launches = []
    la = driver.launch_args

    def counting(*args):
        py_launches.append(1)
        return la(*args)

    driver.launch_args = counting
    try:
        for off in (0, 1):
            x = pool[off:off + n]
            y0 = torch.randn(n, device="cuda")
            outs = []
            for forced in (True, False, False):
                y = y0.clone()
                if forced:
                    lib._pydnn_fast_bump()
                h0, p0 = lib._pydnn_fast_hits(), len(py_launches)
                assert lib.pydnnActivationForward(h, act[0], f(0.5), t, _p(ffi, x), f(0.25), t, _p(ffi, y)) == 0
                hit = lib._pydnn_fast_hits() - h0
                assert (hit, len(py_launches) - p0) == ((0, 1) if forced else (1, 0)), (off, forced)
                outs.append(y)
            torch.cuda.synchronize()
            assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2]), off
            xs = x.cpu().numpy().astype(np.float64)
            want = 0.5 * np.where(xs > 0, xs, 0.7 * np.expm1(xs)) + 0.25 * y0.cpu().numpy()
            np.testing.assert_allclose(outs[1].cpu().numpy(), want, rtol=1e-5, atol=1e-6)
        # calls that change nothing between two fast calls
        x, y = pool[:n], pool[2 * n:3 * n]
        size = ffi.new("size_t *")
        dt, nb = ffi.new("pydnnDataType_t *"), ffi.new("int *")
        dd, ss = ffi.new("int[8]"), ffi.new("int[8]")
        lib.pydnnActivationForward(h, act[0], f(1.0), t, _p(ffi, x), f(0.0), t, _p(ffi, y))
        h0 = lib._pydnn_fast_hits()
        for _ in range(4):
            assert lib.pydnnGetTensorSizeInBytes(t, size) == 0
            assert lib.pydnnGetTensorNdDescriptor(t, 8, dt, nb, dd, ss) == 0
            assert lib.pydnnActivationForward(h, act[0], f(1.0), t, _p(ffi, x), f(0.0), t, _p(ffi, y)) == 0
        assert lib._pydnn_fast_hits() - h0 == 4
        # a Set from Python on the object C holds: the next C call computes the new function
        py_act = impl._objects[int(ffi.cast("uintptr_t", act[0]))][1]
        pydnn.set_activation_descriptor(py_act, pydnn.PYDNN_ACTIVATION_TANH, 0, 0.0)
        y.fill_(float("nan"))
        h0, p0 = lib._pydnn_fast_hits(), len(py_launches)
        assert lib.pydnnActivationForward(h, act[0], f(1.0), t, _p(ffi, x), f(0.0), t, _p(ffi, y)) == 0
        assert lib._pydnn_fast_hits() == h0 and len(py_launches) == p0 + 1
        torch.cuda.synchronize()
        assert torch.allclose(y, torch.tanh(x), rtol=1e-5, atol=1e-6)
    finally:
        driver.launch_args = la
