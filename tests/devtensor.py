"""A tensor on the GPU for tests: descriptor + device buffer + the strided layout, with poisoning.

The device buffer covers the descriptor's span; elements between strided ones (gaps) are poisoned too,
so `check_untouched` proves a kernel wrote nothing outside the tensor's elements.
"""
import numpy as np
from numpy.lib.stride_tricks import as_strided

import pydnn
from pydnn.reference import dtypes as rd
from pydnn.tensor import DTYPES, packed_strides

POISON = 0xFF  # all-ones bytes: NaN for every float type


class DevTensor:
    def __init__(self, dims, dtype, strides=None, fmt=None):
        self.dims = tuple(dims)
        self.dtype = dtype
        if strides is None:
            strides = packed_strides(self.dims, fmt if fmt is not None else pydnn.PYDNN_TENSOR_NCHW)
        self.strides = tuple(strides)
        self.desc = pydnn.create_tensor_descriptor()
        pydnn.set_tensor_nd_descriptor(self.desc, dtype, len(self.dims), self.dims, self.strides)
        self.span = pydnn.get_tensor_size_in_bytes(self.desc) // DTYPES[dtype][0]
        self.np_dtype = DTYPES[dtype][1]
        self.buf = pydnn.DeviceArray((self.span,), self.np_dtype)
        self.buf.fill_bytes(POISON)
        self.values = None

    @property
    def ptr(self):
        return self.buf.ptr

    def _view(self, flat):
        item = flat.dtype.itemsize
        return as_strided(flat, self.dims, [s * item for s in self.strides])

    def upload(self, values):
        """Store float64 `values` (rounded to the dtype); gaps stay poisoned. Returns the stored values."""
        flat = self.buf.to_numpy()  # current contents, gaps included
        stored = rd.to_storage(values, self.dtype)
        self._view(flat)[...] = stored
        self.buf.copy_from_numpy(flat)
        self.values = rd.from_storage(stored, self.dtype)
        return self.values

    def random(self, rng, lo=-3.0, hi=3.0):
        v = rng.uniform(lo, hi, self.dims).astype(np.float32).astype(np.float64)
        return self.upload(v)

    def poison(self):
        self.buf.fill_bytes(POISON)

    def download(self):
        flat = self.buf.to_numpy()
        return rd.from_storage(np.array(self._view(flat)), self.dtype)

    def check_untouched(self):
        """Every byte outside the tensor's elements still holds the poison."""
        flat = self.buf.to_numpy()
        mask = np.ones(self.span, bool)
        idx = as_strided(np.arange(self.span), self.dims, [s * 8 for s in self.strides])
        mask[idx.ravel()] = False
        gaps = flat.view(np.uint8).reshape(self.span, -1)[mask]
        assert (gaps == POISON).all(), "a kernel wrote outside the tensor's elements"


def assert_close(out, ref, dtype, what="", scale=None):
    """|out - ref| <= atol + rtol * max(|ref|, scale). `scale` is the magnitude of the terms a result
    was summed from (alpha*f + beta*y): rounding error scales with them, not with a cancelled result."""
    rtol, atol = rd.TOLERANCE[dtype]
    out = np.asarray(out, np.float64)
    ref = np.asarray(ref, np.float64)
    mag = np.abs(ref) if scale is None else np.maximum(np.abs(ref), np.asarray(scale, np.float64))
    assert out.shape == ref.shape
    assert not np.isnan(out[~np.isnan(ref)]).any(), f"{what}: NaN where the reference has a number (unwritten?)"
    both_nan = np.isnan(out) & np.isnan(ref)
    err = np.abs(out - ref)
    bad = ~both_nan & ~(err <= atol + rtol * mag) & ~(out == ref)
    if bad.any():
        i = np.argwhere(bad)[0]
        raise AssertionError(f"{what}: {bad.sum()} of {bad.size} elements off; first at {tuple(i)}: "
                             f"got {out[tuple(i)]!r}, want {ref[tuple(i)]!r} (rtol {rtol}, atol {atol})")
