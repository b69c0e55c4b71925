"""float64 reference of pydnn.ops.matmul's GEMM, on flat arrays that stand for device memory.

Operands are given as the 1-d arrays of element values a buffer holds (gaps included) plus the
layout numbers the kernel gets: for each z < batch,
    C_z[i, j] = alpha * sum_k opA_z[i, k] opB_z[k, j] + beta * C_z[i, j] (+ bias[j])
with opA_z[i, k] = a[z*stride_a + i*lda + k] (trans_a: a[z*stride_a + k*lda + i]) and likewise for B
(trans_b: b[z*stride_b + j*ldb + k]); C_z[i, j] = c[z*stride_c + i*ldc + j].
"""
import numpy as np
from numpy.lib.stride_tricks import as_strided


def view(flat, batch, stride, rows, cols, ld):
    """The (batch, rows, cols) matrices of a flat array (read-only view; stride 0 repeats a batch)."""
    flat = np.asarray(flat, np.float64)
    it = flat.itemsize
    return as_strided(flat, (batch, rows, cols), (stride * it, ld * it, it), writeable=False)


def operands(a, b, m, n, k, trans_a=False, trans_b=False, lda=None, ldb=None, batch=1, stride_a=0, stride_b=0):
    """(opA, opB): float64 arrays of shapes (batch, m, k) and (batch, k, n)."""
    lda = lda if lda is not None else max(m if trans_a else k, 1)
    ldb = ldb if ldb is not None else max(k if trans_b else n, 1)
    A = view(a, batch, stride_a, k, m, lda).transpose(0, 2, 1) if trans_a else view(a, batch, stride_a, m, k, lda)
    B = view(b, batch, stride_b, n, k, ldb).transpose(0, 2, 1) if trans_b else view(b, batch, stride_b, k, n, ldb)
    return A, B


def gemm(a, b, c, m, n, k, alpha=1.0, beta=0.0, trans_a=False, trans_b=False, lda=None, ldb=None, ldc=None,
         batch=1, stride_a=0, stride_b=0, stride_c=0, bias=None):
    """The (batch, m, n) result C. `c` (flat) is read only when beta != 0 (NaN there then propagates, as
    it must); `bias` is a length-n array or None."""
    A, B = operands(a, b, m, n, k, trans_a, trans_b, lda, ldb, batch, stride_a, stride_b)
    out = alpha * np.matmul(A, B) if k else np.zeros((batch, m, n))
    if beta != 0.0:
        out = out + beta * view(c, batch, stride_c, m, n, ldc if ldc is not None else max(n, 1))
    if bias is not None:
        out = out + np.asarray(bias, np.float64)[None, None, :]
    return out


def gemm_magnitude(a, b, c, m, n, k, alpha=1.0, beta=0.0, trans_a=False, trans_b=False, lda=None, ldb=None,
                   ldc=None, batch=1, stride_a=0, stride_b=0, stride_c=0, bias=None):
    """The magnitude of the terms each result is summed from (|alpha| |A||B| + |beta| |C| + |bias|): the
    scale rounding errors grow with (tests' `scale` for assert_close)."""
    return gemm(np.abs(a), np.abs(b), np.abs(np.nan_to_num(c)) if beta else c, m, n, k, abs(alpha), abs(beta),
                trans_a, trans_b, lda, ldb, ldc, batch, stride_a, stride_b, stride_c,
                None if bias is None else np.abs(bias))

