"""ConvolutionBackwardBias's kernel (ptx/conv_bias.cu bias_grad_rows) and its host-side plan: the reduced
dims (n, d, h, w) merged where the strides allow, so an NCHW dy becomes rows of D*H*W contiguous elements read
16 bytes at a time (the kernel decomposes its flat index per vector, not per element).

    dims, strides = merge_reduced(sizes4, strides4)   # 4 sizes / strides, innermost last, merged
    v = vector_width(itemsize, dims, strides, cstride, ptr)   # elements per load (1: the general path)
"""
from .._elementwise import CTYPE
from ..common import FLOAT_TAGS
from .plans import add_kernels

UNIT = "conv_bias.{}"
THREADS = 512  # kBiasThreads in ptx/conv_bias.cu


def bias_expr(tag, v):
    return f"pydnn::conv::bias_grad_rows<{CTYPE[tag]}, {v}>"


def widths(tag):
    """The vector widths built for a data type: 16 bytes a load, and 1 (any strides, any alignment)."""
    size = {"f32": 4, "f64": 8, "f16": 2, "bf16": 2}[tag]
    return (16 // size, 1)


for _t in FLOAT_TAGS:
    add_kernels(UNIT.format(_t), "conv_bias.cu", [bias_expr(_t, v) for v in widths(_t)])


def merge_reduced(sizes, strides):
    """(sizes, strides) of the 4 reduced dims (n, d, h, w) with size-1 dims dropped and each dim folded
    into the next-inner one where outer stride == inner stride * inner size; padded back to 4 with leading
    size-1 dims (stride 0). The same elements, in the same order (row-major over the result)."""
    dims = [(int(n), int(s)) for n, s in zip(sizes, strides) if n != 1]
    out = []
    for n, s in dims:
        if out and out[-1][1] == s * n:
            m, _ = out.pop()
            out.append((m * n, s))
        else:
            out.append((n, s))
    if not out:
        out = [(1, 0)]
    while len(out) < 4:
        out.insert(0, (1, 0))
    return tuple(n for n, _ in out), tuple(s for _, s in out)


def vector_width(itemsize, sizes, strides, cstride, ptr):
    """Elements per load for merged (sizes, strides) and channel stride `cstride` at pointer `ptr`: 16 bytes
    when the innermost dim is contiguous and every row, channel and vector start is 16-byte aligned, else 1."""
    v = 16 // itemsize
    if v > 1 and strides[3] == 1 and sizes[3] % v == 0 and ptr % 16 == 0 and cstride % v == 0 \
            and all(s % v == 0 for n, s in zip(sizes[:3], strides[:3]) if n > 1):
        return v
    return 1


def element_offsets(sizes, strides):
    """The kernel's offsets of one channel's elements, in its flat order (CPU tests emulate the kernel's
    index math with this: flat e -> row = e / L, j = e % L, row -> (i0, i1, i2))."""
    import numpy as np
    e = np.arange(int(np.prod(sizes)), dtype=np.int64)
    L = sizes[3]
    row, j = e // L, e % L
    i2 = row % sizes[2]
    row //= sizes[2]
    i1, i0 = row % sizes[1], row // sizes[1]
    return i0 * strides[0] + i1 * strides[1] + i2 * strides[2] + j * strides[3]
