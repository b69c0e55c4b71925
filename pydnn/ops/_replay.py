"""Plans of multi-launch calls: a call's launches recorded once, replayed with only their pointers patched.

A call such as MultiHeadAttnForward makes a dozen launches through other families (GEMMs, fused attention,
tensor ops), each validating its arguments and building descriptors: about 0.3 ms of Python per call. Its
plan is made once per (descriptor set, argument shape) as a dry run under driver.recording():

1. the call runs with its real arguments, recorded, not enqueued: its checks run as before and raise
   the same errors; the recorded launches are what it would have enqueued;
2. it runs again with every device buffer replaced by a tag (an address no allocation has:
   TAG_BASE | (i + 1) << 48 | the real address's low 8 bits, so alignment-dependent choices are the same,
   and buffers that are the same object get the same tag, so aliasing is the same); every 8-byte word of a
   recorded parameter struct that holds base i's tag plus an offset is a pointer into buffer i;
3. the tagged recording, its words patched with the real addresses, must reproduce the first recording
   byte for byte, or no plan is kept (the call is launched from its first recording).

A later call with the same key launches the plan: the base addresses are resolved and checked (NULL, size,
alignment as the plan's first call needed, no partial overlap between different buffers), the patched
words rewritten only when an address differs from the previous call's, and each launch is one
cuLaunchKernel. Any argument that is not what the plan saw takes the full path (which raises what it
raised before).
"""
import ctypes
import struct

from .. import tuning
from .._build import fastcall
from .._cuda import driver
from ..buffers import device_ptr
from ..status import PydnnError

TAG_TOP = 0x5A  # bits 55..62 of a tag; bits 48..54: buffer index + 1; bits 0..47: offset (+ low 8 bits)
_LOW = 0xFF
_WORD = struct.Struct("<Q")
_COPY = struct.Struct("<3Q")


def tag(i, real):
    return (TAG_TOP << 55) | ((i + 1) << 48) | (real & _LOW)


def _base_of(w):
    """(buffer index, offset from its tag) of a tagged word, or None."""
    if (w >> 55) != TAG_TOP:
        return None
    return ((w >> 48) & 0x7F) - 1


def signature(ptrs):
    """What a plan depends on in the addresses: each buffer's low 8 bits and which buffers are the same."""
    return tuple(p & _LOW for p in ptrs), tuple(ptrs.index(p) for p in ptrs)


def overlapping(ptrs, needs):
    """Whether two different addresses' extents overlap (the plan was made with disjoint buffers)."""
    spans = sorted({(p, n) for p, n in zip(ptrs, needs) if n})
    for (p0, n0), (p1, _) in zip(spans, spans[1:]):
        if p1 != p0 and p1 < p0 + n0:
            return True
        if p1 == p0:  # the same address with two sizes: the same buffer (same-address aliasing is kept)
            continue
    return False


class Plan:
    """A call's launches with the positions of their pointer words; launch(handle, ptrs) replays them."""

    __slots__ = ("items", "patches", "sig", "last", "needs", "aligns", "tags", "extra", "citems")

    def __init__(self, items, patches, sig, ptrs, needs, aligns):
        self.items, self.patches, self.sig = items, patches, sig
        self.last, self.needs, self.aligns = tuple(ptrs), tuple(needs), tuple(aligns)
        self.tags, self.extra, self.citems = (), None, None

    def repatch(self, ptrs):
        deltas = [p - t for p, t in zip(ptrs, self.tags)]
        for buf, words in self.patches:
            for off, i, w in words:
                _WORD.pack_into(buf, off, w + deltas[i])
        self.last = tuple(ptrs)
        c = self.citems
        if c:  # the C array holds copies' addresses by value (launches point at the patched params)
            arr = c[2]
            for k, it in enumerate(self.items):
                if it[0] == "c":
                    arr[k].dst, arr[k].src, arr[k].nbytes = _COPY.unpack_from(it[1], 0)

    def launch(self, handle):
        c = self.citems
        if c is None:
            c = self.citems = _citems(self.items)
        if c and driver.launch_args is _LAUNCH_ARGS and driver.memcpy_dtod_async is _COPY_ASYNC \
                and not driver._recorders:
            err, i = fastcall.items_launcher()(c[0], c[1], handle.stream)
            if err:
                driver.raise_status(err, "cuLaunchKernel" if self.items[i][0] == "k" else "cuMemcpyDtoDAsync")
            return
        stream = handle.cu_stream
        la, cp = driver.launch_args, driver.memcpy_dtod_async
        for it in self.items:
            if it[0] == "k":
                la(it[1], it[2], it[3], it[4], stream, it[5])
            else:
                cp(*_COPY.unpack_from(it[1], 0), stream)


_LAUNCH_ARGS, _COPY_ASYNC = driver.launch_args, driver.memcpy_dtod_async


def _citems(items):
    """(address, count, the array) of the items as fastcall's C array, or () when the compiled launch is not
    to be had (tuning.callpath.C_LAUNCH off, no helper, kernels that are not driver functions). The params
    buffers are the items' own (patched in place), so the array stays valid across repatches."""
    if not tuning.callpath.C_LAUNCH:
        return ()
    try:
        funcs = [int(it[1]) if it[0] == "k" else 0 for it in items]
    except (TypeError, ValueError):
        return ()
    if fastcall.items_launcher() is None:
        return ()
    arr = (fastcall.Item * max(1, len(items)))()
    for a, it, f in zip(arr, items, funcs):
        if it[0] == "k":
            a.kind, a.func, a.argv, a.smem = 0, f, it[5][1], it[4]
            a.grid[:], a.block[:] = list(it[2]), list(it[3])
        else:
            a.kind = 1
            a.dst, a.src, a.nbytes = _COPY.unpack_from(it[1], 0)
    return (ctypes.addressof(arr), len(items), arr)


def _as_buffers(items):
    """Each recorded item with a mutable buffer: ("k", func, grid, block, smem, kernel_args(params)) whose
    args[2] is the params buffer, or ("c", buffer of dst, src, nbytes)."""
    out = []
    for it in items:
        if it[0] == "k":
            raw = it[5] or b"\0"
            out.append(("k", it[1], it[2], it[3], it[4], driver.kernel_args((ctypes.c_char * len(raw)).from_buffer_copy(raw))))
        else:
            out.append(("c", (ctypes.c_char * 24).from_buffer_copy(struct.pack("<3Q", it[1], it[2], it[3]))))
    return out


def _buf(it):
    return it[5][2] if it[0] == "k" else it[1]


def _raw(it):
    return (it[5] or b"\0") if it[0] == "k" else struct.pack("<3Q", it[1], it[2], it[3])


def _same_launch(a, b):
    return a[0] == b[0] and (a[0] != "k" or (a[1] is b[1] or a[1] == b[1]) and a[2:5] == b[2:5])


def record(run, ptrs):
    """(items of the real run, a Plan or None). run(addresses) makes the call with these buffer addresses
    (ints) under recording; the first run uses the real ones (its errors propagate)."""
    with driver.recording() as real:
        run(ptrs)
    tags = []
    for i, p in enumerate(ptrs):
        j = ptrs.index(p)
        tags.append(tags[j] if j < i else tag(i, p))
    try:
        with driver.recording() as tagged:
            run(tags)
    except PydnnError:
        return real, None
    if len(tagged) != len(real) or not all(_same_launch(a, b) for a, b in zip(tagged, real)):
        return real, None
    items = _as_buffers(tagged)
    patches = []
    for it in items:
        buf = _buf(it)
        raw = bytes(buf)
        words = []
        for off in range(0, len(raw) - 7, 8):
            w = _WORD.unpack_from(raw, off)[0]
            i = _base_of(w)
            if i is not None:
                if not 0 <= i < len(ptrs) or not 0 <= w - tags[i] < 1 << 47:
                    return real, None
                words.append((off, i, w))
        if words:
            patches.append((buf, tuple(words)))
    plan = Plan(items, patches, signature(ptrs), ptrs, (), ())
    plan.tags = tuple(tags)
    plan.repatch(ptrs)
    for it, r in zip(items, real):  # the patched tagged recording must be the real one, byte for byte
        if bytes(_buf(it)) != _raw(r):
            return real, None
    return real, plan


def launch_items(handle, items):
    """Enqueue recorded items as they are (a call whose plan could not be kept)."""
    stream = handle.cu_stream
    for it in items:
        if it[0] == "k":
            buf = (ctypes.c_char * max(len(it[5]), 1)).from_buffer_copy(it[5] if it[5] else b"\0")
            driver.launch_args(it[1], it[2], it[3], it[4], stream, driver.kernel_args(buf))
        else:
            driver.memcpy_dtod_async(it[1], it[2], it[3], stream)


def resolve(bufs, names, needs, aligns):
    """The addresses of a plan's buffers, or None when one is not what the plan's first call took (the full
    path then runs and reports it)."""
    out = []
    try:
        for b, name, need, al in zip(bufs, names, needs, aligns):
            p = b if type(b) is int and b > 0 else device_ptr(b, name, need)
            if p % al:
                return None
            out.append(p)
    except PydnnError:
        return None
    return out
