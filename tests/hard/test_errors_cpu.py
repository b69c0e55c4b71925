"""Which exception a failure raises (CPU): pydnn's checks raise PydnnError, Python-level misuse of a
function (argument count, keywords) raises Python's own TypeError, a pydnn bug becomes INTERNAL_ERROR;
driver errors carry cuGetErrorString's text; NVRTC failures name the unit, arch and options, and
PYDNN_DUMP_CUDA_SOURCE_ON_ERROR=1 prints the numbered source."""
import inspect
import types

import pytest

import pydnn
from pydnn import status
from pydnn._cuda import driver, nvrtc

PUBLIC = sorted(n for n in dir(pydnn) if getattr(getattr(pydnn, n), "__pydnn_api__", False))


def test_every_public_function_is_wrapped():
    """Every cuDNN-style function of the foundation's modules goes through `api` (families added later,
    such as pydnn.graph or pydnn.torch, may export plain helpers of their own)."""
    assert len(PUBLIC) > 100
    mine = ("pydnn.status", "pydnn.tensor", "pydnn.handle", "pydnn.version", "pydnn.ops.")
    plain = [n for n in dir(pydnn) if not n.startswith("_") and inspect.isfunction(getattr(pydnn, n))
             and n not in PUBLIC and getattr(pydnn, n).__module__.startswith(mine)]
    assert sorted(plain) == ["get_error_string", "get_last_error_string"]  # they never fail


@pytest.mark.parametrize("name", PUBLIC)
def test_too_many_arguments_is_a_type_error(name):
    fn = getattr(pydnn, name)
    with pytest.raises(TypeError) as ei:
        fn(*([None] * 40))
    assert not isinstance(ei.value, pydnn.PydnnError)
    assert "argument" in str(ei.value)
    assert pydnn.get_last_error_string().startswith(name + ": ")


@pytest.mark.parametrize("name", PUBLIC)
def test_unknown_keyword_is_a_type_error(name):
    with pytest.raises(TypeError, match="unexpected keyword argument 'no_such_argument'"):
        getattr(pydnn, name)(no_such_argument=1)


def test_missing_arguments_is_a_type_error():
    with pytest.raises(TypeError, match="missing 5 required positional arguments"):
        pydnn.set_tensor4d_descriptor(pydnn.create_tensor_descriptor(), pydnn.PYDNN_TENSOR_NCHW)
    d = pydnn.create_tensor_descriptor()
    with pytest.raises(TypeError, match="multiple values for argument"):
        pydnn.set_tensor4d_descriptor(d, 0, 0, 1, 1, 1, 1, tensor_desc=d)


def test_checks_still_raise_pydnn_error():
    d = pydnn.create_tensor_descriptor()
    with pytest.raises(pydnn.PydnnError) as ei:
        pydnn.set_tensor4d_descriptor(d, pydnn.PYDNN_TENSOR_NCHW, pydnn.PYDNN_DATA_FLOAT, 0, 1, 1, 1)
    assert ei.value.status == pydnn.PYDNN_STATUS_BAD_PARAM
    # a wrong *type* of argument is a check's business (cuDNN's BAD_PARAM), not a Python TypeError
    with pytest.raises(pydnn.PydnnError) as ei:
        pydnn.set_tensor4d_descriptor(d, "NCHW", pydnn.PYDNN_DATA_FLOAT, 1, 1, 1, 1)
    assert ei.value.status == pydnn.PYDNN_STATUS_BAD_PARAM and ei.value.message


def _bug_type_error(x):
    return len(x)  # a TypeError raised inside the body: a pydnn bug, not the caller's misuse


def test_internal_type_error_is_internal_error():
    f = status.api(_bug_type_error)
    with pytest.raises(pydnn.PydnnError) as ei:
        f(3)
    assert ei.value.status == pydnn.PYDNN_STATUS_INTERNAL_ERROR
    assert "_bug_type_error: internal error: TypeError" in ei.value.message
    assert isinstance(ei.value.__cause__, TypeError)
    with pytest.raises(TypeError):  # but the same function called with two arguments: misuse
        f(3, 4)


def test_internal_bugs_and_memory_errors_become_statuses():
    def boom():
        raise KeyError("k")

    def no_memory():
        raise MemoryError()

    with pytest.raises(pydnn.PydnnError) as ei:
        status.api(boom)()
    assert ei.value.status == pydnn.PYDNN_STATUS_INTERNAL_ERROR and "KeyError" in ei.value.message
    with pytest.raises(pydnn.PydnnError) as ei:
        status.api(no_memory)()
    assert ei.value.status == pydnn.PYDNN_STATUS_ALLOC_FAILED
    assert pydnn.get_last_error_string().startswith("no_memory: host allocation failed")


def test_nested_misuse_inside_pydnn_is_a_bug():
    """An API function calling another with the wrong arity is pydnn's bug: INTERNAL_ERROR, not TypeError."""
    inner = status.api(lambda a: a)

    def outer():
        return inner(1, 2)

    with pytest.raises(pydnn.PydnnError) as ei:
        status.api(outer)()
    assert ei.value.status == pydnn.PYDNN_STATUS_INTERNAL_ERROR


def test_keyboard_interrupt_passes_through():
    def stop():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        status.api(stop)()


# ---------------------------------------------------------------- driver errors
class _Enum(int):
    pass


def _fake_driver():
    """Enough of cuda.bindings.driver for check(): 2 = OUT_OF_MEMORY, 700 = ILLEGAL_ADDRESS, 999 unknown."""
    names = {0: "CUDA_SUCCESS", 2: "CUDA_ERROR_OUT_OF_MEMORY", 700: "CUDA_ERROR_ILLEGAL_ADDRESS"}
    texts = {2: "out of memory", 700: "an illegal memory access was encountered"}

    def get_name(err):
        return (_Enum(0), names[int(err)].encode()) if int(err) in names else (_Enum(1), None)

    def get_string(err):
        return (_Enum(0), texts[int(err)].encode()) if int(err) in texts else (_Enum(1), None)

    res = types.SimpleNamespace(CUDA_SUCCESS=_Enum(0), CUDA_ERROR_OUT_OF_MEMORY=_Enum(2))
    return types.SimpleNamespace(cuGetErrorName=get_name, cuGetErrorString=get_string, CUresult=res)


def test_driver_errors_carry_the_error_string(monkeypatch):
    monkeypatch.setattr(driver, "_drv", _fake_driver())
    with pytest.raises(pydnn.PydnnError) as ei:
        driver.check((_Enum(700),), "cuLaunchKernel")
    assert ei.value.status == pydnn.PYDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER
    assert ei.value.message == ("cuLaunchKernel failed: CUDA_ERROR_ILLEGAL_ADDRESS "
                                "(an illegal memory access was encountered)")
    with pytest.raises(pydnn.PydnnError) as ei:
        driver.check((_Enum(2), None), "cuMemAlloc(64)")
    assert ei.value.status == pydnn.PYDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED
    assert ei.value.message == "cuMemAlloc(64) failed: CUDA_ERROR_OUT_OF_MEMORY (out of memory)"
    with pytest.raises(pydnn.PydnnError) as ei:  # a code the driver has no name for: its number
        driver.check((_Enum(999),), "cuX")
    assert ei.value.message == "cuX failed: CUresult 999"
    assert driver.check((_Enum(0), 5), "cuY") == 5


# ---------------------------------------------------------------- NVRTC errors
BAD_SOURCE = "extern \"C\" __global__ void k(int *p) {\n    p[0] = 1\n}\n"


class _FakeNvrtc:
    """NVRTC that fails every compilation with a fixed log (stands in where no NVRTC wheel is installed)."""

    class nvrtcResult:
        NVRTC_SUCCESS = 0
        NVRTC_ERROR_COMPILATION = types.SimpleNamespace(name="NVRTC_ERROR_COMPILATION")

    LOG = b"bad.cu(2): error: expected a \";\"\n\0"

    def nvrtcCreateProgram(self, *a):
        return (0, "prog")

    def nvrtcAddNameExpression(self, prog, expr):
        return (0,)

    def nvrtcCompileProgram(self, prog, n, opts):
        self.opts = opts
        return (self.nvrtcResult.NVRTC_ERROR_COMPILATION,)

    def nvrtcGetProgramLogSize(self, prog):
        return (0, len(self.LOG))

    def nvrtcGetProgramLog(self, prog, buf):
        return (0,)

    def nvrtcDestroyProgram(self, prog):
        return (0,)


def _compile_bad(monkeypatch, real):
    if not real:
        # the once-per-process NVRTC selection asks the real library's version: made before the fake stands in
        # (run alone, this test would otherwise ask the fake)
        try:
            nvrtc._select()
        except pydnn.PydnnError:
            pass
        monkeypatch.setattr(nvrtc, "_nvrtc", lambda: _FakeNvrtc())
    with pytest.raises(pydnn.PydnnError) as ei:
        nvrtc.compile_cubin(BAD_SOURCE, "bad.cu", ["k"], "sm_80", ["-std=c++17", "-DPYDNN_X=1"], ["/inc"],
                            unit="bad.f32")
    return ei.value


def _have_nvrtc():
    try:
        nvrtc.version()
        return True
    except Exception:  # noqa: BLE001
        return False


@pytest.mark.parametrize("real", [False, True], ids=["fake-nvrtc", "real-nvrtc"])
def test_nvrtc_failure_names_unit_arch_options(monkeypatch, capsys, real):
    if real and not _have_nvrtc():
        pytest.skip("no NVRTC library here")
    monkeypatch.delenv(nvrtc.DUMP_ENV, raising=False)
    e = _compile_bad(monkeypatch, real)
    assert e.status == pydnn.PYDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED
    first = e.message.splitlines()[0]
    assert "kernel unit bad.f32 (bad.cu) for sm_80" in first
    assert "--gpu-architecture=sm_80 -std=c++17 -DPYDNN_X=1 --include-path=/inc" in first
    assert "NVRTC_ERROR_COMPILATION" in first and f"set {nvrtc.DUMP_ENV}=1" in first
    if real:
        assert "bad.cu(3)" in e.message or "bad.cu(2)" in e.message  # NVRTC's log follows
    assert capsys.readouterr().err == ""  # nothing printed without the switch


@pytest.mark.parametrize("real", [False, True], ids=["fake-nvrtc", "real-nvrtc"])
def test_nvrtc_dump_source_on_error(monkeypatch, capsys, real):
    if real and not _have_nvrtc():
        pytest.skip("no NVRTC library here")
    monkeypatch.setenv(nvrtc.DUMP_ENV, "1")
    e = _compile_bad(monkeypatch, real)
    err = capsys.readouterr().err
    assert err.splitlines() == ["==== bad.cu ====", "1 extern \"C\" __global__ void k(int *p) {",
                                "2     p[0] = 1", "3 }", "==== end of bad.cu ===="]
    assert "set PYDNN_DUMP" not in e.message


def test_numbered_source_pads_line_numbers():
    text = nvrtc.numbered_source("\n".join(f"l{i}" for i in range(1, 12)), "x.cu")
    lines = text.splitlines()
    assert lines[1] == " 1 l1" and lines[11] == "11 l11"


def test_status_of_compile_error_reaches_a_caller():
    """A compile failure raised inside an API function keeps its status (not INTERNAL_ERROR)."""
    def compiles():
        raise pydnn.PydnnError(pydnn.PYDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED, "NVRTC could not ...")

    with pytest.raises(pydnn.PydnnError) as ei:
        status.api(compiles)()
    assert ei.value.status == pydnn.PYDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED


# ---------------------------------------------------------------- found by the fuzzers
def test_a_tensor_spanning_more_than_2_62_bytes_is_refused():
    t = pydnn.create_tensor_descriptor()
    with pytest.raises(pydnn.PydnnError) as ei:
        pydnn.set_tensor_nd_descriptor_ex(t, pydnn.PYDNN_TENSOR_NCHW, pydnn.PYDNN_DATA_FLOAT, 8, [2**31 - 1] * 8)
    assert ei.value.status == pydnn.PYDNN_STATUS_BAD_PARAM and "more than 2^62" in ei.value.message
    with pytest.raises(pydnn.PydnnError) as ei:  # with explicit strides too
        pydnn.set_tensor_nd_descriptor(t, pydnn.PYDNN_DATA_FLOAT, 3, [2, 2, 2], [2**61, 2**40, 1])
    assert ei.value.status == pydnn.PYDNN_STATUS_BAD_PARAM
    # large but addressable tensors (more than 2^31 elements) stay legal
    pydnn.set_tensor_nd_descriptor_ex(t, pydnn.PYDNN_TENSOR_NCHW, pydnn.PYDNN_DATA_HALF, 4, [1, 4, 2**16, 2**16])
    assert pydnn.get_tensor_size_in_bytes(t) == 2 * 4 * 2**32


def test_c_getter_of_a_value_past_int_is_not_supported():
    """GetTensor4dDescriptor of a descriptor whose stride exceeds INT_MAX: C's int * cannot hold it."""
    import cffi

    from pydnn.capi import decl, impl

    ffi = cffi.FFI()
    ffi.cdef(decl.types_block())
    proto = next(p for p in decl.prototypes() if impl.parse(p)[1] == "pydnnGetTensor4dDescriptor")
    m = impl.Marshal(ffi, proto)
    t = pydnn.create_tensor_descriptor()
    pydnn.set_tensor4d_descriptor(t, pydnn.PYDNN_TENSOR_NCHW, pydnn.PYDNN_DATA_HALF, 2, 4, 2**15, 2**15)
    h = ffi.new_handle(t)
    addr = int(ffi.cast("uintptr_t", h))
    impl._objects[addr] = (h, t)
    try:
        outs = [ffi.new("int *") for _ in range(9)]
        with pytest.raises(pydnn.PydnnError) as ei:
            m(ffi.cast("pydnnTensorDescriptor_t", addr), *outs)
        assert ei.value.status == pydnn.PYDNN_STATUS_NOT_SUPPORTED
        assert ei.value.message.startswith("nStride: 4294967296 does not fit the C type int")
    finally:
        impl._objects.pop(addr, None)
