"""CUDA driver layer: result checking, contexts, streams, events, memory, modules, the one launch call.

Everything here raises PydnnError on failure. Nothing here allocates or synchronizes unless its name says
so (DeviceBuffer, copies, synchronize); `launch` only enqueues, so pydnn calls can be graph-captured.
"""
import ctypes
import threading

from .. import enums
from ..status import PydnnError

_lock = threading.Lock()
_drv = None  # cuda.bindings.driver once initialised
_init_error = None


def _driver():
    """Import cuda.bindings.driver and cuInit once; raise NOT_INITIALIZED when no driver or GPU exists."""
    global _drv, _init_error
    if _drv is not None:
        return _drv
    with _lock:
        if _drv is not None:
            return _drv
        if _init_error is None:
            try:
                from cuda.bindings import driver as d

                (err,) = d.cuInit(0)
                if err != d.CUresult.CUDA_SUCCESS:
                    _init_error = f"cuInit failed: {_err_name(d, err)}"
                else:
                    from .compat import check_driver  # CUDA 12.4+; pydnn[cu12] on a CUDA 12 driver

                    err, version = d.cuDriverGetVersion()
                    _init_error = check_driver(int(version)) if int(err) == 0 else None
                    if _init_error is None:
                        _drv = d
                        return d
            except (ImportError, RuntimeError, OSError) as e:
                _init_error = f"no usable CUDA driver ({e})"
        raise PydnnError(enums.PYDNN_STATUS_NOT_INITIALIZED, _init_error)


def available():
    """True when a CUDA driver and at least one GPU are present."""
    try:
        return device_count() > 0
    except PydnnError:
        return False


def _err_name(d, err):
    """'CUDA_ERROR_X (the driver's description)': cuGetErrorName and cuGetErrorString's texts, or the bare
    number for a code the driver does not know."""
    try:
        e, name = d.cuGetErrorName(err)
        name = name.decode() if int(e) == 0 and name else None
    except Exception:  # noqa: BLE001 - a code outside the bindings' enum: fall back to the number
        name = None
    try:
        e, text = d.cuGetErrorString(err)
        text = text.decode() if int(e) == 0 and text else None
    except Exception:  # noqa: BLE001
        text = None
    if name is None:
        name = f"CUresult {int(err)}"
    return f"{name} ({text})" if text and text != name else name


def raise_status(err, what="cuLaunchKernel"):
    """Raise for a nonzero CUresult status `err` (an int) that a compiled launch returned, as check does."""
    check((_driver().CUresult(err),), what)


def check(result, what):
    """Unpack a cuda.bindings result tuple; raise EXECUTION_FAILED_CUDA_DRIVER naming the call."""
    err = result[0]
    if int(err) != 0:
        d = _driver()
        status = enums.PYDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER
        if int(err) == int(d.CUresult.CUDA_ERROR_OUT_OF_MEMORY):
            status = enums.PYDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED
        raise PydnnError(status, f"{what} failed: {_err_name(d, err)}")
    if len(result) == 1:
        return None
    return result[1] if len(result) == 2 else result[1:]


# ---------------------------------------------------------------- devices and contexts
def device_count():
    d = _driver()
    return check(d.cuDeviceGetCount(), "cuDeviceGetCount")


def device_attribute(dev, attr_name):
    d = _driver()
    attr = getattr(d.CUdevice_attribute, attr_name)
    return check(d.cuDeviceGetAttribute(attr, dev), f"cuDeviceGetAttribute({attr_name})")


def device_arch(dev):
    """'sm_90' for a compute capability 9.0 device."""
    major = device_attribute(dev, "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR")
    minor = device_attribute(dev, "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR")
    return f"sm_{major}{minor}"


def device_name(dev):
    d = _driver()
    raw = check(d.cuDeviceGetName(256, dev), "cuDeviceGetName")
    return raw.split(b"\0", 1)[0].decode()


def driver_version():
    d = _driver()
    return check(d.cuDriverGetVersion(), "cuDriverGetVersion")


_primary = {}


def current_context():
    """The calling thread's current context and its device, retaining device 0's primary context if none.

    Like the CUDA runtime (and so cuDNN), a handle binds to whatever device is current when it is created;
    frameworks such as PyTorch make the primary context current, which we then share.
    """
    d = _driver()
    ctx = check(d.cuCtxGetCurrent(), "cuCtxGetCurrent")
    if int(ctx) == 0:
        ctx = primary_context(0)
        check(d.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    dev = check(d.cuCtxGetDevice(), "cuCtxGetDevice")
    return ctx, int(dev)


def primary_context(dev):
    d = _driver()
    with _lock:
        ctx = _primary.get(dev)
        if ctx is None:
            ctx = check(d.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
            _primary[dev] = ctx
    return ctx


def set_current(ctx):
    d = _driver()
    check(d.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")


def current():
    """The calling thread's current context as an int address (0 when none); retains nothing."""
    d = _driver()
    return int(check(d.cuCtxGetCurrent(), "cuCtxGetCurrent"))


class pushed:
    """Context manager: make `ctx` current for a block, then restore the previous one."""

    def __init__(self, ctx):
        self.ctx = ctx

    def __enter__(self):
        d = _driver()
        check(d.cuCtxPushCurrent(self.ctx), "cuCtxPushCurrent")

    def __exit__(self, *exc):
        d = _driver()
        check(d.cuCtxPopCurrent(), "cuCtxPopCurrent")


def synchronize():
    d = _driver()
    check(d.cuCtxSynchronize(), "cuCtxSynchronize")


# ---------------------------------------------------------------- streams and events
def stream_create():
    d = _driver()
    return int(check(d.cuStreamCreate(d.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate"))


def stream_destroy(stream):
    d = _driver()
    check(d.cuStreamDestroy(d.CUstream(stream)), "cuStreamDestroy")


def stream_synchronize(stream):
    d = _driver()
    check(d.cuStreamSynchronize(d.CUstream(stream)), "cuStreamSynchronize")


class Event:
    """A CUDA event for timing (benchmarks, find-algorithm calls)."""

    def __init__(self):
        d = _driver()
        self._d = d
        self.handle = check(d.cuEventCreate(d.CUevent_flags.CU_EVENT_DEFAULT), "cuEventCreate")

    def record(self, stream=0):
        check(self._d.cuEventRecord(self.handle, self._d.CUstream(stream)), "cuEventRecord")

    def synchronize(self):
        check(self._d.cuEventSynchronize(self.handle), "cuEventSynchronize")

    def elapsed_ms(self, start):
        return check(self._d.cuEventElapsedTime(start.handle, self.handle), "cuEventElapsedTime")

    def __del__(self):
        try:
            self._d.cuEventDestroy(self.handle)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


# ---------------------------------------------------------------- memory
def mem_alloc(nbytes):
    d = _driver()
    return int(check(d.cuMemAlloc(max(int(nbytes), 1)), f"cuMemAlloc({nbytes})"))


def mem_free(ptr):
    d = _driver()
    check(d.cuMemFree(d.CUdeviceptr(ptr)), "cuMemFree")


def memcpy_htod(dst, src_host_ptr, nbytes):
    d = _driver()
    check(d.cuMemcpyHtoD(d.CUdeviceptr(dst), src_host_ptr, nbytes), "cuMemcpyHtoD")


def memcpy_dtoh(dst_host_ptr, src, nbytes):
    d = _driver()
    check(d.cuMemcpyDtoH(dst_host_ptr, d.CUdeviceptr(src), nbytes), "cuMemcpyDtoH")


def memcpy_dtod_async(dst, src, nbytes, stream=0):
    if _recorders and _recorded(("c", int(dst), int(src), int(nbytes))):
        return
    d = _driver()
    check(d.cuMemcpyDtoDAsync(d.CUdeviceptr(dst), d.CUdeviceptr(src), nbytes, d.CUstream(stream)),
          "cuMemcpyDtoDAsync")


def memset_d8(ptr, byte, nbytes):
    d = _driver()
    check(d.cuMemsetD8(d.CUdeviceptr(ptr), byte, nbytes), "cuMemsetD8")


def pointer_device(ptr):
    """The device ordinal a device pointer belongs to, or None if the driver does not know the pointer."""
    d = _driver()
    attr = d.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
    err, dev = d.cuPointerGetAttribute(attr, d.CUdeviceptr(ptr))
    return None if int(err) != 0 else int(dev)


def allocation_range(ptr):
    """(start, size) of the device allocation holding `ptr`, or None if the driver does not know it."""
    d = _driver()
    a = d.CUpointer_attribute
    err, start = d.cuPointerGetAttribute(a.CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, d.CUdeviceptr(ptr))
    if int(err) != 0:
        return None
    err, size = d.cuPointerGetAttribute(a.CU_POINTER_ATTRIBUTE_RANGE_SIZE, d.CUdeviceptr(ptr))
    if int(err) != 0:
        return None
    return int(start), int(size)


# ---------------------------------------------------------------- modules and launches
def module_load(image):
    d = _driver()
    return check(d.cuModuleLoadData(image), "cuModuleLoadData")


def module_function(module, lowered_name):
    d = _driver()
    return check(d.cuModuleGetFunction(module, lowered_name.encode()), f"cuModuleGetFunction({lowered_name})")


def function_set_max_dynamic_smem(func, nbytes):
    d = _driver()
    attr = d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    check(d.cuFuncSetAttribute(func, attr, nbytes), "cuFuncSetAttribute")


def kernel_args(params):
    """The void*[1] array cuLaunchKernel reads for a kernel whose one argument is `params` (a ctypes
    struct). Keep it with the struct: building it per call costs host time."""
    arr = (ctypes.c_void_p * 1)(ctypes.addressof(params))
    return (arr, ctypes.addressof(arr), params)


# ---------------------------------------------------------------- recording (pydnn/ops/_replay.py)
# While a thread records, its launches and device-to-device copies are appended to its list instead of being
# enqueued (a dry run that a family turns into a replayable plan). Other threads launch as usual. The hot
# path pays one global read (_recorders == 0).
_recorders = 0
_rec_local = threading.local()


def _recorded(item):
    items = getattr(_rec_local, "items", None)
    if items is None:
        return False
    items.append(item)
    return True


class recording:
    """with recording() as items: the launches / copies this thread makes are listed, not enqueued. Items:
    ("k", func, grid, block, smem, params bytes) and ("c", dst, src, nbytes)."""

    def __enter__(self):
        global _recorders
        if getattr(_rec_local, "items", None) is not None:
            raise RuntimeError("recording() does not nest")
        self.items = _rec_local.items = []
        with _lock:
            _recorders += 1
        return self.items

    def __exit__(self, *exc):
        global _recorders
        _rec_local.items = None
        with _lock:
            _recorders -= 1
        return False


# pydnn/_build/fastcall.py's compiled cuLaunchKernel (int arguments; cuda.bindings' wrapper costs about
# 2 us per launch on the H200's host), installed by a handle's creation; used while _drv is the module it was
# installed under (a test's stand-in driver turns it off). _addr caches the addresses of CUfunction / CUstream
# objects (int() of one is slow); a placeholder kernel (a CPU handle's) has none and takes cuda.bindings.
_fast = None
_fast_drv = None
_addr = {}


def set_fast_launch(fn):
    global _fast, _fast_drv
    _fast_drv = _driver() if fn is not None else None
    _fast = fn


def _address(obj):
    try:
        v = int(obj)
    except (TypeError, ValueError):
        v = -1
    if len(_addr) >= 4096:
        _addr.clear()
    try:
        _addr[obj] = v
    except TypeError:  # unhashable: never cached
        pass
    return v


def launch_args(func, grid, block, smem, stream, args):
    """Enqueue `func` with arguments prepared by kernel_args (the hot path: nothing built per call)."""
    if _recorders and _recorded(("k", func, tuple(grid), tuple(block), smem, bytes(args[2]))):
        return
    if _fast is not None and _drv is _fast_drv:
        f = _addr.get(func)
        if f is None:
            f = _address(func)
        s = _addr.get(stream)
        if s is None:
            s = _address(stream)
        if f >= 0 and s >= 0:
            err = _fast(f, grid[0], grid[1], grid[2], block[0], block[1], block[2], smem, s, args[1])
            if err:
                raise_status(err)
            return
    err = _drv.cuLaunchKernel(func, grid[0], grid[1], grid[2], block[0], block[1], block[2], smem,
                              stream, args[1], 0)[0]
    if err != 0:
        check((err,), "cuLaunchKernel")


def launch(func, grid, block, smem, stream, params):
    """The one launch path: enqueue `func` with a single by-value parameter struct (bytes-like).

    Every pydnn kernel takes exactly one argument, a POD struct; `params` is its ctypes mirror (see
    pydnn/_build/params.py). The driver copies it at launch, so it may be reused right after.
    No synchronization, no allocation.
    """
    if _recorders and _recorded(("k", func, tuple(grid), tuple(block), smem, bytes(params))):
        return
    d = _drv
    argv = (ctypes.c_void_p * 1)(ctypes.addressof(params))
    if _fast is not None and d is _fast_drv:  # the compiled launch, as launch_args (no cuda.bindings wrapper)
        f = _addr.get(func)
        if f is None:
            f = _address(func)
        s = _addr.get(stream)
        if s is None:
            s = _address(stream)
        if f >= 0 and s >= 0:
            err = _fast(f, grid[0], grid[1], grid[2], block[0], block[1], block[2], smem, s, ctypes.addressof(argv))
            if err:
                raise_status(err)
            return
    err = d.cuLaunchKernel(func, grid[0], grid[1], grid[2], block[0], block[1], block[2], smem,
                           stream, ctypes.addressof(argv), 0)[0]
    if err != 0:
        check((err,), "cuLaunchKernel")


def cu_stream(stream):
    """A cuda.bindings CUstream for an address (kept by the handle so launches do not rebuild it)."""
    d = _driver()
    return d.CUstream(stream)


# ---------------------------------------------------------------- graph capture (tests, users)
class Graph:
    """Capture the work enqueued on `stream` into a CUDA graph and replay it.

    with Graph(stream) as g: <enqueue work on stream>;  then g.launch(); g.launch(); ...
    Capture uses the global mode, under which any call that would synchronize or allocate fails.
    """

    def __init__(self, stream):
        self.stream, self.graph, self.exec = stream, None, None

    def __enter__(self):
        d = _driver()
        mode = d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL
        check(d.cuStreamBeginCapture(d.CUstream(self.stream), mode), "cuStreamBeginCapture")
        return self

    def __exit__(self, exc_type, *exc):
        d = _driver()
        self.graph = check(d.cuStreamEndCapture(d.CUstream(self.stream)), "cuStreamEndCapture")
        if exc_type is None:
            self.exec = check(d.cuGraphInstantiate(self.graph, 0), "cuGraphInstantiate")

    def node_count(self):
        d = _driver()
        _, n = check(d.cuGraphGetNodes(self.graph, 0), "cuGraphGetNodes")
        return int(n)

    def launch(self):
        d = _driver()
        check(d.cuGraphLaunch(self.exec, d.CUstream(self.stream)), "cuGraphLaunch")

    def __del__(self):
        try:
            d = _driver()
            if self.exec is not None:
                d.cuGraphExecDestroy(self.exec)
            if self.graph is not None:
                d.cuGraphDestroy(self.graph)
        except Exception:  # noqa: BLE001
            pass
