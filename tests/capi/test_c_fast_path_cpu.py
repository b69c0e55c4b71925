"""libpydnn's C fast path (pydnn/capi/fastpath.py) without a GPU: libpydnn loaded into this process (its
embedded code then runs in this interpreter), pydnnCreate answering a CPU handle whose kernels are fake
addresses, and the library's test launch (a no-op that keeps what it was given) in place of cuLaunchKernel.

For each element-wise call: the first call takes the Python path (one launch through driver.launch_args);
the same call again is answered in C (no Python launch, the hit counter moves), and what C launches — kernel,
grid, block, the params bytes — is exactly what the Python path launches for the same arguments, for
aligned and misaligned pointers, alpha / beta values and in place calls. Any set / destroy makes the next
call slow again; NULL arguments keep their errors."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

# libpydnn's embedded interpreter starts inside this process on the first C call: run these tests in a
# process of their own (a first pydnnCreate after other C-API tests of a long session was seen to hang there)
ISOLATED = os.environ.get("PYDNN_TEST_C_FAST_ISOLATED") == "1"
isolated = pytest.mark.skipif(not ISOLATED, reason="runs in its own process (test_in_its_own_process)")


@pytest.mark.skipif(ISOLATED, reason="this is the isolated process")
def test_in_its_own_process():
    env = dict(os.environ, PYDNN_TEST_C_FAST_ISOLATED="1")
    env.pop("PYDNN_TEST_SHARD", None)  # the child runs the whole file, not a shard's share of it
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__], capture_output=True,
                       text=True, env=env, timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert " passed" in r.stdout and "failed" not in r.stdout, r.stdout[-2000:]

import pydnn
from pydnn._cuda import driver

cffi = pytest.importorskip("cffi")
ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import bench_host as B  # noqa: E402

F32, F64, F16 = pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DATA_DOUBLE, pydnn.PYDNN_DATA_HALF


class _IntFuncs(dict):
    """Kernels as distinct fake addresses (the fast path keeps them as CUfunction values)."""

    def get(self, key, default=None):
        return 0x10000 + (hash(key) & 0xFFFFFF) * 16


@pytest.fixture(scope="module")
def c(tmp_path_factory):
    import shutil

    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler")
    from cprog import library_path
    from pydnn.capi import decl, fastpath

    path = library_path()
    ffi = cffi.FFI()
    ffi.cdef(decl.types_block() + "\n" + fastpath.CDEF + "\n".join(decl.prototypes()))
    lib = ffi.dlopen(str(path))
    return ffi, lib


@pytest.fixture
def env(c, monkeypatch):
    ffi, lib = c
    launches = []

    def launch_args(f, g, b, s, st, a):
        launches.append((f, tuple(g), tuple(b), bytes(a[2])))

    def cpu_create():
        h = B.cpu_handle()
        h._funcs = _IntFuncs()
        return h

    import pydnn.handle

    monkeypatch.setattr(pydnn, "create", cpu_create)
    monkeypatch.setattr(pydnn.handle, "create", cpu_create)
    monkeypatch.setattr(driver, "launch_args", launch_args)
    monkeypatch.setattr(driver, "function_set_max_dynamic_smem", lambda f, n: None)
    lib._pydnn_fast_use_noop_launch(1)
    hp = ffi.new("pydnnHandle_t *")
    assert lib.pydnnCreate(hp) == 0
    yield ffi, lib, hp[0], launches
    lib.pydnnDestroy(hp[0])
    lib._pydnn_fast_use_noop_launch(0)


def _last(ffi, lib):
    f, dims, buf = ffi.new("void **"), ffi.new("unsigned int[7]"), ffi.new("unsigned char[1024]")
    n = lib._pydnn_fast_last(f, dims, buf, 1024)
    return int(ffi.cast("uintptr_t", f[0])), tuple(dims[0:3]), tuple(dims[3:6]), bytes(ffi.buffer(buf, n))


def _tensor(ffi, lib, dims, dtype=F32):
    t = ffi.new("pydnnTensorDescriptor_t *")
    assert lib.pydnnCreateTensorDescriptor(t) == 0
    arr = ffi.new("int[]", list(dims))
    strides, acc = [0] * len(dims), 1
    for i in reversed(range(len(dims))):
        strides[i] = acc
        acc *= dims[i]
    assert lib.pydnnSetTensorNdDescriptor(t[0], dtype, len(dims), arr, ffi.new("int[]", strides)) == 0
    return t[0]


def _scalar(ffi, v, dtype):
    return ffi.new("double *" if dtype == F64 else "float *", v)


BASE = 1 << 32


def _ptr(ffi, off):
    return ffi.cast("void *", BASE + off)


def _cases(ffi, lib, h, dtype):
    """(name, call(pointer offsets, alpha, beta)) for every fast-path function."""
    t = _tensor(ffi, lib, (2, 3, 4, 5), dtype)
    bias = _tensor(ffi, lib, (1, 3, 1, 1), dtype)
    a = ffi.new("pydnnActivationDescriptor_t *")
    lib.pydnnCreateActivationDescriptor(a)
    assert lib.pydnnSetActivationDescriptor(a[0], pydnn.PYDNN_ACTIVATION_ELU, 0, 0.5) == 0
    op = ffi.new("pydnnOpTensorDescriptor_t *")
    lib.pydnnCreateOpTensorDescriptor(op)
    comp = F64 if dtype == F64 else F32
    assert lib.pydnnSetOpTensorDescriptor(op[0], pydnn.PYDNN_OP_TENSOR_MUL, comp, 0) == 0
    sq = ffi.new("pydnnOpTensorDescriptor_t *")
    lib.pydnnCreateOpTensorDescriptor(sq)
    assert lib.pydnnSetOpTensorDescriptor(sq[0], pydnn.PYDNN_OP_TENSOR_SQRT, comp, 0) == 0
    s = lambda v: _scalar(ffi, v, dtype)  # noqa: E731
    p = lambda o: _ptr(ffi, o)  # noqa: E731
    return [
        ("ActivationForward", lambda o, al, be: lib.pydnnActivationForward(h, a[0], s(al), t, p(o[0]), s(be), t, p(o[1]))),
        ("ActivationBackward", lambda o, al, be: lib.pydnnActivationBackward(h, a[0], s(al), t, p(o[0]), t, p(o[1]), t,
                                                                             p(o[2]), s(be), t, p(o[3]))),
        ("AddTensor", lambda o, al, be: lib.pydnnAddTensor(h, s(al), bias, p(o[0]), s(be), t, p(o[1]))),
        ("OpTensor", lambda o, al, be: lib.pydnnOpTensor(h, op[0], s(al), t, p(o[0]), s(0.5), t, p(o[1]), s(be), t,
                                                         p(o[2]))),
        ("OpTensor unary", lambda o, al, be: lib.pydnnOpTensor(h, sq[0], s(al), t, p(o[0]), s(2.0), ffi.NULL, ffi.NULL,
                                                               s(be), t, p(o[2]))),
        ("ScaleTensor", lambda o, al, be: lib.pydnnScaleTensor(h, t, p(o[0]), s(al))),
        ("TransformTensor", lambda o, al, be: lib.pydnnTransformTensor(h, s(al), t, p(o[0]), s(be), t, p(o[1]))),
    ]


OFFSETS = [(0, 4096, 8192, 12288), (4, 4096, 8196, 12300), (4096, 4096, 4096, 4096), (2, 6, 8194, 12290)]
SCALARS = [(1.0, 0.0), (2.0, 0.5), (1.0, 1.0), (-0.25, 0.0)]


@isolated
@pytest.mark.parametrize("extra", [0, 1], ids=["kernelParams", "extra"])
@pytest.mark.parametrize("dtype", [F32, F64, F16], ids=["f32", "f64", "f16"])
def test_fast_path_launches_what_python_launches(env, dtype, extra):
    """extra: the parameter block through cuLaunchKernel's `extra` (_pydnn_fast_use_extra), the same bytes."""
    ffi, lib, h, launches = env
    lib._pydnn_fast_use_extra(extra)
    try:
        _launches_what_python_launches(ffi, lib, h, launches, dtype)
    finally:
        lib._pydnn_fast_use_extra(0)


def _launches_what_python_launches(ffi, lib, h, launches, dtype):
    for name, call in _cases(ffi, lib, h, dtype):
        for offs in OFFSETS:
            if dtype != F16 and any(o % 4 for o in offs) and name == "TransformTensor":
                pass
            for al, be in SCALARS:
                # the Python path's launch for these arguments: the first call after a descriptor change
                launches.clear()
                lib._pydnn_fast_bump()
                st = call(offs, al, be)
                if st != 0:  # a misaligned pointer the family refuses: the fast path never sees it either
                    continue
                assert len(launches) == 1, (name, offs, al, be)
                want = launches[0]
                h0 = lib._pydnn_fast_hits()
                assert call(offs, al, be) == 0
                hit = lib._pydnn_fast_hits() - h0
                if hit:
                    assert len(launches) == 1, "a fast call also launched from Python"
                    assert _last(ffi, lib) == want, (name, offs, al, be)
                else:  # no record: only a transform whose alpha / beta decide its kernel may do this
                    assert name == "TransformTensor" and len(launches) == 2 and launches[1] == want


@isolated
def test_records_follow_descriptors_and_errors_stay(env):
    ffi, lib, h, launches = env
    t = _tensor(ffi, lib, (1, 4, 2, 2))
    a = ffi.new("pydnnActivationDescriptor_t *")
    lib.pydnnCreateActivationDescriptor(a)
    lib.pydnnSetActivationDescriptor(a[0], pydnn.PYDNN_ACTIVATION_RELU, 0, 0.0)
    one, zero = ffi.new("float *", 1.0), ffi.new("float *", 0.0)
    x, y = _ptr(ffi, 0), _ptr(ffi, 256)

    def act(xp=x, yp=y, al=one):
        return lib.pydnnActivationForward(h, a[0], al, t, xp, zero, t, yp)

    assert act() == 0 and act() == 0
    h0 = lib._pydnn_fast_hits()
    assert act() == 0 and lib._pydnn_fast_hits() == h0 + 1
    n = len(launches)
    lib.pydnnSetActivationDescriptor(a[0], pydnn.PYDNN_ACTIVATION_TANH, 0, 0.0)  # a Set: slow again
    assert act() == 0 and len(launches) == n + 1
    assert act() == 0 and len(launches) == n + 1 and lib._pydnn_fast_hits() == h0 + 2
    msg = ffi.new("char[256]")
    for kwargs, status, text in (({"xp": ffi.NULL}, pydnn.PYDNN_STATUS_BAD_PARAM_NULL_POINTER, b"x: NULL pointer"),
                                 ({"yp": ffi.NULL}, pydnn.PYDNN_STATUS_BAD_PARAM_NULL_POINTER, b"y: NULL pointer"),
                                 ({"al": ffi.NULL}, pydnn.PYDNN_STATUS_BAD_PARAM_NULL_POINTER, b"alpha: NULL")):
        assert act(**kwargs) == status
        lib.pydnnGetLastErrorString(msg, 256)
        assert text in ffi.string(msg), ffi.string(msg)
    lib.pydnnSetTensor4dDescriptor(t, 0, F64, 1, 4, 2, 2)  # double: alpha / beta are doubles now
    d1, d0 = ffi.new("double *", 1.0), ffi.new("double *", 0.0)
    assert lib.pydnnActivationForward(h, a[0], d1, t, x, d0, t, y) == 0
    h1 = lib._pydnn_fast_hits()
    assert lib.pydnnActivationForward(h, a[0], d1, t, x, d0, t, y) == 0 and lib._pydnn_fast_hits() == h1 + 1
    lib.pydnnDestroyActivationDescriptor(a[0])
    assert lib.pydnnActivationForward(h, a[0], d1, t, x, d0, t, y) == pydnn.PYDNN_STATUS_BAD_PARAM
    h2 = lib._pydnn_fast_hits()
    lib.pydnnSetStream(h, ffi.cast("cudaStream_t", 0x1234))  # a stream change re-plans (records hold it)
    assert lib._pydnn_fast_hits() == h2


@isolated
def test_checked_mode_never_installs(env, monkeypatch):
    from pydnn import buffers

    ffi, lib, h, launches = env
    monkeypatch.setattr(buffers, "CHECKED", True)
    monkeypatch.setattr(buffers, "_check_allocation", lambda ptr, name, need: None)
    t = _tensor(ffi, lib, (1, 1, 1, 4))
    one, zero = ffi.new("float *", 1.0), ffi.new("float *", 0.0)
    h0 = lib._pydnn_fast_hits()
    for _ in range(3):
        assert lib.pydnnScaleTensor(h, t, _ptr(ffi, 0), one) == 0
    assert lib._pydnn_fast_hits() == h0 and len(launches) == 3


@isolated
def test_a_fast_call_runs_no_python(env):
    """The regression guard of the C face's hot path (counts, not time): a repeated ActivationForward makes
    no Python-level call at all (sys.setprofile sees only the foreign call itself)."""
    ffi, lib, h, launches = env
    t = _tensor(ffi, lib, (1, 1, 1, 1))
    a = ffi.new("pydnnActivationDescriptor_t *")
    lib.pydnnCreateActivationDescriptor(a)
    lib.pydnnSetActivationDescriptor(a[0], pydnn.PYDNN_ACTIVATION_RELU, 0, 0.0)
    one, zero = ffi.new("float *", 1.0), ffi.new("float *", 0.0)
    x, y = _ptr(ffi, 0), _ptr(ffi, 256)
    fn = lib.pydnnActivationForward
    fn(h, a[0], one, t, x, zero, t, y)
    events = []

    def prof(frame, event, arg):
        events.append((event, frame.f_code.co_name))

    sys.setprofile(prof)
    try:
        st = fn(h, a[0], one, t, x, zero, t, y)
    finally:
        sys.setprofile(None)
    assert st == 0
    assert [e for e in events if e[0] == "call"] == [], events
    sys.setprofile(prof)
    events.clear()
    try:  # the slow path, for contrast: the marshalling and the Python function run
        lib._pydnn_fast_bump()
        fn(h, a[0], one, t, x, zero, t, y)
    finally:
        sys.setprofile(None)
    assert any(e == ("call", "activation_forward") for e in events), events


@isolated
def test_records_survive_calls_that_change_nothing_and_see_python_sets(env):
    """The records' generation (pydnn.tuning.RECORDS_GEN) moves only with a change: a C program that
    interleaves other calls (a Get, a size query, a convolution's workspace query, another fast call) keeps its
    fast relu; a Set / Destroy made from Python on the object behind the C pointer (libpydnn loaded in a Python
    process), a tuning switch, or a Get that writes a caller's descriptor make the next call slow again."""
    from pydnn import tuning
    from pydnn.capi import impl

    ffi, lib, h, launches = env
    t = _tensor(ffi, lib, (1, 4, 2, 2))
    a = ffi.new("pydnnActivationDescriptor_t *")
    lib.pydnnCreateActivationDescriptor(a)
    lib.pydnnSetActivationDescriptor(a[0], pydnn.PYDNN_ACTIVATION_RELU, 0, 0.0)
    one, zero = ffi.new("float *", 1.0), ffi.new("float *", 0.0)
    x, y = _ptr(ffi, 0), _ptr(ffi, 256)

    def act():
        return lib.pydnnActivationForward(h, a[0], one, t, x, zero, t, y)

    def fast():
        h0, n = lib._pydnn_fast_hits(), len(launches)
        assert act() == 0
        return lib._pydnn_fast_hits() == h0 + 1 and len(launches) == n

    assert act() == 0 and fast()
    size = ffi.new("size_t *")
    assert lib.pydnnGetTensorSizeInBytes(t, size) == 0 and size[0] == 64
    assert fast(), "a size query made the record stale"
    st = ffi.new("cudaStream_t *")
    assert lib.pydnnGetStream(h, st) == 0
    assert lib.pydnnScaleTensor(h, t, _ptr(ffi, 512), one) == 0  # another fast-path function
    t2 = _tensor(ffi, lib, (1, 4, 2, 2))  # creating (and setting) another descriptor is a Set: stale once
    assert act() == 0 and fast()
    dims = ffi.new("int[8]")
    nb = ffi.new("int *")
    dt = ffi.new("pydnnDataType_t *")
    assert lib.pydnnGetTensorNdDescriptor(t2, 8, dt, nb, dims, ffi.new("int[8]")) == 0
    assert fast(), "a Get made the record stale"
    # Python-side changes of the objects C holds: a Set from Python, a tuning switch
    py_t = impl._objects[int(ffi.cast("uintptr_t", t))][1]
    pydnn.set_tensor4d_descriptor(py_t, pydnn.PYDNN_TENSOR_NCHW, F32, 1, 4, 2, 2)
    assert not fast(), "a Set from Python was not seen"
    assert fast()
    with tuning.override({"callpath.MHA_PLANS": False}):
        assert not fast(), "a switch change was not seen"
        assert fast()
    assert not fast()  # restoring the switch is a change too
    g0 = tuning.RECORDS_GEN[0]
    py_t._assign(F32, (1, 4, 2, 2), (16, 4, 2, 1))  # what a Get* writing a caller's descriptor does
    assert tuning.RECORDS_GEN[0] != g0
    assert not fast() and fast()
    lib.pydnnDestroyTensorDescriptor(t2)
    assert not fast() and fast()
