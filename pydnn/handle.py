"""The handle: the device and context a caller works on, the stream calls go to, and the kernels loaded
there (cudnnCreate / cudnnDestroy / cudnnSetStream / cudnnGetStream)."""
from . import enums
from ._build import fastcall, loader
from ._cuda import driver
from .status import PydnnError, api


class Handle:
    """cudnnHandle_t. Holds the context current at creation, its device, arch and stream."""

    __slots__ = ("ctx", "device", "arch", "sm_count", "stream", "cu_stream", "_funcs", "prepared", "alive",
                 "__weakref__")

    def __init__(self):
        self.ctx, self.device = driver.current_context()
        self.arch = driver.device_arch(self.device)
        self.sm_count = driver.device_attribute(self.device, "CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT")
        self.stream = 0
        self.cu_stream = driver.cu_stream(0)
        self._funcs = {}
        self.prepared = {}  # launch records keyed by (op, descriptors, their versions): see remember()
        self.alive = True
        fastcall.install()  # the compiled launch (built on first use; cuda.bindings' otherwise)

    def function(self, unit, expr, smem=0):
        """The CUfunction for a kernel instantiation on this handle's context (loaded on first use). smem: the
        dynamic shared memory the caller launches it with; past the 48 KiB default the function is opted in
        to it once per handle (again only if a later launch asks for more)."""
        key = (unit, expr)
        f = self._funcs.get(key)
        if f is None:
            f = loader.get_function(self.ctx, self.arch, unit, expr)
            self._funcs[key] = f
        if smem > 48 * 1024:
            skey = ("smem opt-in", unit, expr)
            if self.prepared.get(skey, 0) < smem:
                driver.function_set_max_dynamic_smem(f, smem)
                self.remember(skey, smem)
        return f

    def remember(self, key, record):
        """Keep a prepared launch for `key`; the table is bounded (cleared when large)."""
        if len(self.prepared) >= 4096:
            self.prepared.clear()
        self.prepared[key] = record
        return record

    def launch(self, unit, expr, grid, block, params, smem=0):
        driver.launch(self.function(unit, expr), grid, block, smem, self.cu_stream, params)


def check_handle(handle, name="handle"):
    if type(handle) is not Handle or not handle.alive:
        raise PydnnError(enums.PYDNN_STATUS_BAD_PARAM, f"{name}: not a live handle from create()")
    return handle


def stream_value(stream, name="streamId"):
    """A CUstream address from an int, a cuda.bindings CUstream, a torch/cupy stream, or __cuda_stream__."""
    if stream is None:
        return 0
    if type(stream) is int:
        return stream
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        return int(proto()[1])
    for attr in ("cuda_stream", "ptr", "handle"):
        v = getattr(stream, attr, None)
        if isinstance(v, int):
            return v
    try:
        return int(stream)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an __int__ / __index__ that refuses
        raise PydnnError(enums.PYDNN_STATUS_BAD_PARAM,
                         f"{name}: {type(stream).__name__} is not a CUDA stream") from None


@api
def create():
    """cudnnCreate: a handle on the current device (NOT_INITIALIZED when there is no GPU or driver)."""
    if driver.device_count() == 0:
        raise PydnnError(enums.PYDNN_STATUS_NOT_INITIALIZED, "no CUDA device is present")
    return Handle()


@api
def destroy(handle):
    """cudnnDestroy."""
    check_handle(handle)
    handle.alive = False
    handle._funcs.clear()
    handle.prepared.clear()


@api
def set_stream(handle, stream_id):
    """cudnnSetStream: later calls on this handle enqueue on `stream_id` (0 = the legacy default stream)."""
    check_handle(handle)
    s = stream_value(stream_id)
    if s < 0:
        raise PydnnError(enums.PYDNN_STATUS_BAD_PARAM, f"streamId: negative value {s}")
    handle.stream = s
    handle.cu_stream = driver.cu_stream(s)


@api
def get_stream(handle):
    """cudnnGetStream: the stream address (int)."""
    check_handle(handle)
    return handle.stream
