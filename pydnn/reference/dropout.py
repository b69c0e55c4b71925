"""Dropout reference: Philox-4x32-10 in numpy (bit for bit the generator of ptx/common/philox.cuh) and the
float64 forward / backward of pydnn's dropout.

The mask of a forward call is a pure function of (seed, offset, n): element i (the row-major index over
the dims) is kept iff its 16-bit slice of Philox block i // 8 is >= threshold(p) (see
ptx/common/philox.cuh for the stream convention). The reserve space holds bit i % 8 of byte i // 8.
"""
import numpy as np

M0, M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
W0, W1 = 0x9E3779B9, 0xBB67AE85
_LO = np.uint64(0xFFFFFFFF)
_32 = np.uint64(32)


def philox4x32_10(ctr, key):
    """ctr: (..., 4) uint32 counters, key: (..., 2) uint32 keys (broadcast) -> (..., 4) uint32 outputs."""
    c = np.asarray(ctr, dtype=np.uint32).astype(np.uint64)
    k = np.asarray(key, dtype=np.uint32).astype(np.uint64)
    c0, c1, c2, c3 = (c[..., i] for i in range(4))
    k0, k1 = k[..., 0], k[..., 1]
    for r in range(10):
        if r:
            k0 = (k0 + np.uint64(W0)) & _LO
            k1 = (k1 + np.uint64(W1)) & _LO
        p0 = M0 * c0  # < 2^64: exact in uint64
        p1 = M1 * c2
        c0, c1, c2, c3 = (p1 >> _32) ^ c1 ^ k0, p1 & _LO, (p0 >> _32) ^ c3 ^ k1, p0 & _LO
    return np.stack([c0, c1, c2, c3], axis=-1).astype(np.uint32)


def threshold(p):
    """The 16-bit threshold for a drop probability p: round(p * 65536) in 0 .. 65536 (the resolution)."""
    return int(np.floor(float(p) * 65536.0 + 0.5))


def stream_blocks(seed, offset, blocks):
    """Philox blocks `blocks` (uint64 array) of the stream (seed, offset): (len, 4) uint32."""
    b = np.asarray(blocks, dtype=np.uint64)
    seed, offset = int(seed), int(offset)
    ctr = np.empty(b.shape + (4,), np.uint32)
    ctr[..., 0] = (b & _LO).astype(np.uint32)
    ctr[..., 1] = (b >> _32).astype(np.uint32)
    ctr[..., 2] = offset & 0xFFFFFFFF
    ctr[..., 3] = (offset >> 32) & 0xFFFFFFFF
    key = np.array([seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF], np.uint32)
    return philox4x32_10(ctr, key)


def keep_mask(seed, offset, n, p, first=0):
    """bool[n]: whether elements first .. first+n-1 of the stream (seed, offset) are kept at probability p."""
    thr = threshold(p)
    if n == 0:
        return np.zeros(0, bool)
    if thr == 0:
        return np.ones(n, bool)
    if thr >= 65536:
        return np.zeros(n, bool)
    idx = np.arange(first, first + n, dtype=np.uint64)
    g0, g1 = int(idx[0]) // 8, int(idx[-1]) // 8
    words = stream_blocks(seed, offset, np.arange(g0, g1 + 1, dtype=np.uint64))  # (groups, 4)
    slices = np.empty((words.shape[0], 8), np.uint32)
    slices[:, 0::2] = words & 0xFFFF
    slices[:, 1::2] = words >> 16
    flat = slices.reshape(-1)
    return flat[(idx - np.uint64(g0 * 8)).astype(np.int64)] >= thr


def pack_mask(keep):
    """bool[n] -> the reserve-space bytes (bit i % 8 of byte i // 8; bits past n are 0)."""
    return np.packbits(np.asarray(keep, bool).reshape(-1), bitorder="little")


def unpack_mask(reserve, n):
    """Reserve-space bytes -> bool[n]."""
    return np.unpackbits(np.asarray(reserve, np.uint8), bitorder="little")[:n].astype(bool)


def scale(p):
    return 0.0 if p >= 1.0 else 1.0 / (1.0 - float(p))


def forward(x, keep, p):
    """y = x / (1 - p) where kept, exact 0 elsewhere (p = 1: all 0); keep: bool over x's row-major elements."""
    x = np.asarray(x, np.float64)
    k = np.asarray(keep, bool).reshape(x.shape) & (p < 1.0)  # p = 1 keeps nothing
    with np.errstate(invalid="ignore", over="ignore"):
        return np.where(k, x * scale(p), 0.0)


def backward(dy, keep, p):
    """dx = dy / (1 - p) where kept, exact 0 elsewhere."""
    return forward(dy, keep, p)
