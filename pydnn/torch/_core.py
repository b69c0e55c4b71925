"""The bridge's plumbing: one pydnn handle per device (its stream set to PyTorch's current stream on every
call), tensor / filter descriptors cached by (dtype, dims, strides), workspaces from PyTorch's caching
allocator, the fallback record, and the autocast helpers.

Everything here goes through pydnn's public API (`pydnn.<function>`) only (and pydnn's driver layer to make
the handle's context current on the calling thread); buffers are passed as
`tensor.data_ptr()` ints (pydnn's fast path: no __cuda_array_interface__ or DLPack parsing per call).
"""
import logging
import threading
from collections import Counter

import torch

import pydnn
from pydnn import tuning
from pydnn._cuda import driver  # the calling thread's context (pydnn's API has no cudaSetDevice)

log = logging.getLogger("pydnn.torch")

DTYPES = {
    torch.float32: pydnn.PYDNN_DATA_FLOAT,
    torch.float64: pydnn.PYDNN_DATA_DOUBLE,
    torch.float16: pydnn.PYDNN_DATA_HALF,
    torch.bfloat16: pydnn.PYDNN_DATA_BFLOAT16,
}
NOT_SUPPORTED = frozenset(v for k, v in vars(pydnn).items()
                          if k.startswith("PYDNN_STATUS_NOT_SUPPORTED") and isinstance(v, int))

# reason -> number of calls that ran PyTorch's own op instead (see fallback()); read with fallback_report()
fallbacks = Counter()
_warned = set()
_lock = threading.Lock()


class Unsupported(Exception):
    """Raised inside the bridge when a configuration is not one pydnn runs; the module falls back."""


def fallback(reason):
    """Record that a call ran PyTorch's own op, and why (logged once per reason at INFO)."""
    fallbacks[reason] += 1
    if reason not in _warned:
        _warned.add(reason)
        log.info("pydnn.torch: falling back to PyTorch: %s", reason)


def is_not_supported(err):
    return isinstance(err, pydnn.PydnnError) and getattr(err, "status", None) in NOT_SUPPORTED


# ----------------------------------------------------------------------------------------------- handles
class _HandleEntry:
    __slots__ = ("handle", "stream")

    def __init__(self, handle):
        self.handle, self.stream = handle, None


_handles = {}
# Per thread: the _HandleEntry whose context this bridge last made current on the thread. pydnn launches on
# the calling thread's current driver context, and PyTorch calls the bridge from threads of its own: autograd
# runs CUDA backward passes on one worker thread per device, on which no context may be current yet (the
# worker of device 0 makes no CUDA call before running the graph's nodes: a pydnn backward that comes first
# failed with CUDA_ERROR_INVALID_CONTEXT) -- and DataLoader-style or user threads may run forwards. The
# context is made current once per (thread, device) and then trusted: PyTorch only changes a thread's context
# through its device switches (cudaSetDevice, to the primary context of the device it names, which is the
# handle's), and handle_for refuses a tensor that is not on the current device. That holds from CUDA 12's
# runtime on (cudaSetDevice makes the context current at once); under an older runtime (a PyTorch built with
# CUDA 11) cudaSetDevice leaves the previous device's context current until the next runtime call, so there
# the current context is compared on every call (one driver query).
_tls = threading.local()
_VERIFY = int((torch.version.cuda or "0").split(".")[0]) < 12


# PyTorch's own C entry points for the current device and the raw cudaStream_t of the current stream (what
# torch.cuda.current_device() and torch.cuda.current_stream(i).cuda_stream return, without the Python
# wrappers: current_stream builds a torch.cuda.Stream object per call); checked against the public ones when
# the first handle is made, else the public ones are used
_get_device = getattr(torch._C, "_cuda_getDevice", None)
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_fast = {"on": False}
# torch.cuda.is_current_stream_capturing's C entry (workspace() asks it per call), once _check_fast found the C
# getters usable; None: the public function
_capturing_c = None
_capturing_pub = torch.cuda.is_current_stream_capturing  # (a test's stand-in for it turns _capturing_c off)


def _current_device():
    if _fast["on"]:
        return _get_device()
    return torch.cuda.current_device()


def _current_stream(idx):
    if _fast["on"]:
        return _raw_stream(idx)
    return torch.cuda.current_stream(idx).cuda_stream


def _check_fast(idx):
    """Use PyTorch's C getters when they exist and agree with the public API (now, with CUDA initialised)."""
    global _capturing_c
    try:
        _fast["on"] = (_get_device is not None and _raw_stream is not None
                       and _get_device() == torch.cuda.current_device()
                       and _raw_stream(idx) == torch.cuda.current_stream(idx).cuda_stream)
    except Exception:  # noqa: BLE001 - a PyTorch without them, or with other signatures: the public API
        _fast["on"] = False
    cap = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None)
    try:
        _capturing_c = cap if _fast["on"] and cap is not None and cap() == torch.cuda.is_current_stream_capturing() \
            else None
    except Exception:  # noqa: BLE001
        _capturing_c = None


def device_index(device):
    return device.index if device.index is not None else _current_device()


def _create(idx):
    """The handle of device idx, created on its primary context (the one PyTorch uses) made current here."""
    torch.cuda.init()
    torch.empty(1, device=f"cuda:{idx}")  # PyTorch's context for idx exists (its primary context)
    driver.set_current(driver.primary_context(idx))
    h = pydnn.create()
    if h.device != idx:  # pragma: no cover - the driver and the runtime number devices alike
        raise RuntimeError(f"pydnn.torch: handle for cuda:{idx} was created on device {h.device}")
    return _HandleEntry(h)


def handle_for(device):
    """The pydnn handle of `device` (created on first use, on that device's primary context, which PyTorch
    shares), its context current on the calling thread (autograd's device threads included) and its stream
    set to torch.cuda.current_stream(device). A tensor on a device other than the current one is refused
    (Unsupported): pydnn launches on the current context."""
    fast = _fast["on"]  # (the getters inline: handle_for runs for every Function's forward and backward)
    cur = _get_device() if fast else torch.cuda.current_device()
    idx = device.index
    if idx is None:
        idx = cur
    elif cur != idx:
        raise Unsupported(f"tensor on cuda:{idx} while cuda:{cur} is the current device")
    e = _handles.get(idx)
    if e is None:
        with _lock:
            e = _handles.get(idx)
            if e is None:
                e = _handles[idx] = _create(idx)
                _tls.entry = e  # _create made its context current on this thread
                _check_fast(idx)
    if getattr(_tls, "entry", None) is not e or (_VERIFY and driver.current() != int(e.handle.ctx)):
        driver.set_current(e.handle.ctx)  # not a stream operation: allowed while a stream is captured
        _tls.entry = e
    s = _raw_stream(idx) if fast else torch.cuda.current_stream(idx).cuda_stream
    if e.stream != s:  # the same as setting it every call: only the changes reach pydnn
        pydnn.set_stream(e.handle, s)
        e.stream = s
    return e.handle


# ------------------------------------------------------------------------------------------- descriptors
_MAX_CACHE = 8192


class BoundedDict(dict):
    """A cache that empties itself when it reaches _MAX_CACHE entries (shapes that never repeat cannot grow
    it without bound)."""

    def __setitem__(self, key, value):
        if len(self) >= _MAX_CACHE:
            self.clear()
        super().__setitem__(key, value)


_tdescs = BoundedDict()
_fdescs = BoundedDict()


def pydnn_dtype(t):
    dt = DTYPES.get(t.dtype)
    if dt is None:
        raise Unsupported(f"dtype {t.dtype} (pydnn: float32, float64, float16, bfloat16)")
    return dt


def usable_strides(shape, strides):
    """Strides pydnn accepts (positive): a size-1 dim's stride does not matter (1 stands in for 0); None
    when a dim of size > 1 has stride 0 (a broadcast view), which must be materialised."""
    out = []
    for n, s in zip(shape, strides):
        if s <= 0:
            if n != 1:
                return None
            s = 1
        out.append(s)
    return tuple(out)


def dense(t):
    """t itself when pydnn can read it through strides, else a contiguous copy (broadcast / negative
    strides). Non-contiguous but non-broadcast tensors (transposes, slices, channels_last) pass as they are."""
    if t.is_contiguous() or usable_strides(t.shape, t.stride()) is not None:
        return t
    return t.contiguous()


def tensor_desc(dtype, shape, strides):
    """A cached pydnn tensor descriptor for (dtype, dims, strides); never mutated after it is set."""
    key = (dtype, shape, strides)
    d = _tdescs.get(key)
    if d is None:
        st = usable_strides(shape, strides)
        if st is None:
            raise Unsupported(f"broadcast strides {strides} for dims {shape}")
        d = pydnn.create_tensor_descriptor()
        pydnn.set_tensor_nd_descriptor(d, DTYPES[dtype], len(shape), list(shape), list(st))
        _tdescs[key] = d
    return d


def tdesc(t, shape=None, strides=None):
    """The descriptor of tensor t (optionally viewed with other dims / strides)."""
    if t.dtype not in DTYPES:
        raise Unsupported(f"dtype {t.dtype} (pydnn: float32, float64, float16, bfloat16)")
    return tensor_desc(t.dtype, tuple(t.shape) if shape is None else tuple(shape),
                       tuple(t.stride()) if strides is None else tuple(strides))


def filter_format(w):
    """(format, w) for a filter: NHWC (KRSC in memory) when w is channels_last, else NCHW (made contiguous
    when it is neither)."""
    if w.dim() >= 4 and not w.is_contiguous():
        mf = torch.channels_last if w.dim() == 4 else torch.channels_last_3d
        if w.is_contiguous(memory_format=mf):
            return pydnn.PYDNN_TENSOR_NHWC, w
    if not w.is_contiguous():
        w = w.contiguous()
    return pydnn.PYDNN_TENSOR_NCHW, w


def filter_desc(dtype, shape, fmt):
    key = (dtype, shape, fmt)
    d = _fdescs.get(key)
    if d is None:
        d = pydnn.create_filter_descriptor()
        pydnn.set_filter_nd_descriptor(d, DTYPES[dtype], fmt, len(shape), list(shape))
        _fdescs[key] = d
    return d


def same_layout(t, ref):
    """t with ref's strides (a copy only when they differ): gradients arriving from autograd in another
    layout than the forward's output are brought to it, so the backward's plans match the forward's."""
    if t.stride() == ref.stride() or t.shape != ref.shape:
        return t if t.shape == ref.shape else t.reshape(ref.shape)
    out = torch.empty_like(ref)
    out.copy_(t)
    return out


_ws = {}  # (device index, raw stream) -> the stream's workspace tensor (tuning.torch.FAST_CALLS)
_WS_MAX = 1 << 30  # larger workspaces are not kept


def _capturing():
    return torch.cuda.is_current_stream_capturing()


def capturing():
    """Whether the current stream is being captured into a CUDA graph (PyTorch's C getter once _check_fast found
    it usable; a test's stand-in for torch.cuda.is_current_stream_capturing still takes effect)."""
    cap = _capturing_c if torch.cuda.is_current_stream_capturing is _capturing_pub else None
    return cap() if cap is not None else torch.cuda.is_current_stream_capturing()


def workspace(nbytes, device):
    """A workspace from PyTorch's caching allocator: (tensor or None, pointer or None). With
    tuning.torch.FAST_CALLS, outside CUDA graph capture, one buffer per (device, stream) kept and grown to the
    largest size asked: pydnn's workspaces are scratch for one call's kernels, and calls on one stream run in
    its order, so the next call may reuse it (a stream of its own never shares it). Under capture a fresh
    allocation from the graph's pool (a kept buffer that later grew would leave the graph pointing at freed
    memory)."""
    if not nbytes:
        return None, None
    nbytes = int(nbytes)
    cap = _capturing_c if torch.cuda.is_current_stream_capturing is _capturing_pub else None
    if tuning.torch.FAST_CALLS and nbytes <= _WS_MAX and not (cap() if cap is not None else _capturing()):
        idx = device.index
        if idx is None:
            idx = device_index(device)
        key = (idx, _raw_stream(idx) if cap is not None else _current_stream(idx))  # (cap: the C getters are on)
        ws = _ws.get(key)
        if ws is None or ws.numel() < nbytes:
            ws = None  # (the old one back to the allocator first)
            ws = _ws[key] = torch.empty(nbytes, dtype=torch.uint8, device=device)
        return ws, ws.data_ptr()
    ws = torch.empty(nbytes, dtype=torch.uint8, device=device)
    return ws, ws.data_ptr()


def ptr(t):
    return None if t is None else t.data_ptr()


# ------------------------------------------------------------------------------------- autograd entry
_functorch_active = torch._C._are_functorch_transforms_active
_unwrap_if_dead = getattr(getattr(torch._C, "_functorch", None), "unwrap_if_dead", None)
try:
    from torch.compiler import is_compiling as _compiling
except ImportError:  # pragma: no cover - older PyTorch
    def _compiling():
        return False


def applier(cls):
    """cls.apply through the C entry of torch.autograd.Function (what its Python `apply` ends in) where
    tuning.torch.FAST_CALLS is on: the wrapper's setup_context test and closure are skipped (the bridge's
    Functions define no setup_context), the dead-wrapper unwrap of functorch is kept (tensor args), and the
    wrapper itself runs under functorch transforms and torch.compile (its tracing knows `apply`).
    ~2.6 us of the 13.7 us a Function.apply of 4 args costs on the CPU (2-core dev machine)."""
    slow = cls.apply
    try:
        capply = super(torch.autograd.Function, cls).apply
    except AttributeError:  # pragma: no cover - another PyTorch layout
        capply = None
    base = getattr(torch.autograd.function, "_SingleLevelFunction", torch.autograd.Function)
    if capply is None or _unwrap_if_dead is None or cls.setup_context is not base.setup_context:
        return slow
    sw = tuning.torch
    tensor = torch.Tensor

    def apply(*args):
        if not sw.FAST_CALLS or _functorch_active() or _compiling():
            return slow(*args)
        return capply(*[_unwrap_if_dead(a) if isinstance(a, tensor) else a for a in args])
    return apply


# ---------------------------------------------------------------------------------------------- autocast
def autocast_dtype():
    """The CUDA autocast dtype when autocast is on, else None."""
    if torch.is_autocast_enabled("cuda"):
        return torch.get_autocast_dtype("cuda")
    return None


def cast(t, dtype):
    if t is None or dtype is None or t.dtype == dtype or not t.is_floating_point():
        return t
    return t.to(dtype)


def on_cuda(*ts):
    return all(t is None or (t.is_cuda) for t in ts)


def same_float_dtype(*ts):
    dts = {t.dtype for t in ts if t is not None}
    return len(dts) == 1 and next(iter(dts)) in DTYPES


def to_strides(t, shape, strides):
    """t as a tensor of `shape` with exactly `strides` (a copy only when its strides differ)."""
    if tuple(t.shape) != tuple(shape):
        t = t.reshape(shape)
    if t.stride() == tuple(strides):
        return t
    out = torch.empty_strided(shape, strides, dtype=t.dtype, device=t.device)
    out.copy_(t)
    return out
