"""Device memory helpers for users and tests: a device array with __cuda_array_interface__ that copies
to and from numpy. These allocate and synchronize (they are not compute calls)."""
import numpy as np

from . import driver


class DeviceArray:
    """A dense row-major device allocation of `shape` and numpy `dtype` (bf16 data travels as uint16).

    Frees its memory when garbage collected (or at `free()`); exposes __cuda_array_interface__ (v3), so it
    can be passed anywhere pydnn takes a device buffer.
    """

    def __init__(self, shape, dtype, nbytes=None):
        driver.current_context()
        self.shape = tuple(int(s) for s in (shape if isinstance(shape, (tuple, list)) else (shape,)))
        self.dtype = np.dtype(dtype)
        count = 1
        for s in self.shape:
            count *= s
        self.nbytes = int(nbytes) if nbytes is not None else count * self.dtype.itemsize
        self.ptr = driver.mem_alloc(self.nbytes)

    @classmethod
    def from_numpy(cls, arr):
        arr = np.ascontiguousarray(arr)
        out = cls(arr.shape, arr.dtype)
        if arr.nbytes:
            driver.memcpy_htod(out.ptr, arr.ctypes.data, arr.nbytes)
        return out

    @classmethod
    def empty(cls, shape, dtype):
        return cls(shape, dtype)

    def to_numpy(self):
        driver.synchronize()
        out = np.empty(self.shape, self.dtype)
        if out.nbytes:
            driver.memcpy_dtoh(out.ctypes.data, self.ptr, out.nbytes)
        return out

    def fill_bytes(self, byte):
        """Set every byte (e.g. 0xFF to poison: NaN for floats)."""
        driver.memset_d8(self.ptr, byte, self.nbytes)

    def copy_from_numpy(self, arr):
        arr = np.ascontiguousarray(arr)
        if arr.nbytes != self.nbytes:
            raise ValueError(f"size mismatch: {arr.nbytes} bytes into {self.nbytes}")
        driver.memcpy_htod(self.ptr, arr.ctypes.data, arr.nbytes)

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, False),
                "version": 3, "strides": None}

    def free(self):
        if self.ptr:
            driver.mem_free(self.ptr)
            self.ptr = 0

    def __del__(self):
        try:
            self.free()
        except Exception:  # noqa: BLE001 - interpreter shutdown or a dead context
            pass

    def __int__(self):
        return self.ptr
