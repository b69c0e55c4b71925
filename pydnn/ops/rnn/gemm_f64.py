"""A double-precision GEMM (ptx/gemm_f64.cu, CUDA cores): the RNN family's GEMMs in double, since pydnn's matmul
has no double kernel. The formula, argument names and defaults are matmul's (pydnn/ops/matmul.py's gemm_plan:
row-major, leading dimensions and batch strides in elements, C = alpha * op(A) op(B) + beta * C (+ bias)), and
the params struct keeps MatmulParams' field names and flag values, so that pydnn.matmul could take this kernel
for its double case (a plan whose launch is `function(handle)`, `grid`, `block`, `params(...)`).

One 64 x 64 output tile per block, 256 threads of 4 x 4 outputs, K in steps of 16 through shared memory. It is
a correctness path (the RNN's double data), not a tuned one: an H100 does about 60 TFLOP/s of FP64 on its tensor
cores (DMMA), which this kernel does not use."""
import ctypes

from ... import enums as E
from ..._build.manifest import KernelUnit
from ..._build.params import kernel_params
from ...status import PydnnError

UNIT = "gemm.f64"  # (double: a first-use unit, pydnn/_build/rare.py)
BM = BN = 64
THREADS = 256
FLAG_BETA, FLAG_BIAS = 1, 2  # PYDNN_GEMM_F64_FLAG_*: matmul's PYDNN_MATMUL_FLAG_BETA / _BIAS values


@kernel_params("gemm_f64_params.h", "GemmF64Params")
class GemmF64Params(ctypes.Structure):
    _fields_ = [("a", ctypes.c_void_p), ("b", ctypes.c_void_p), ("c", ctypes.c_void_p), ("bias", ctypes.c_void_p)] + [
        (n, ctypes.c_longlong) for n in ("lda", "ldb", "ldc", "stride_a", "stride_b", "stride_c")] + [
        ("alpha", ctypes.c_double), ("beta", ctypes.c_double)] + [
        (n, ctypes.c_int) for n in ("m", "n", "k", "batch")] + [("flags", ctypes.c_uint), ("pad", ctypes.c_int)]


def expr(trans_a, trans_b):
    return f"pydnn::gemm_f64::dgemm<{int(bool(trans_a))}, {int(bool(trans_b))}>"


def kernel_units():
    return [KernelUnit(UNIT, "gemm_f64.cu", tuple(expr(a, b) for a in (0, 1) for b in (0, 1)))]


def _bad(msg):
    raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, msg)


def _cdiv(a, b):
    return -(-a // b)


class Plan:
    """One GEMM problem, validated: its grid and the params of a launch (pointers given per launch)."""

    def __init__(self, m, n, k, trans_a=False, trans_b=False, lda=None, ldb=None, ldc=None, batch=1, stride_a=0,
                 stride_b=0, stride_c=0):
        for name, v, lo in (("m", m, 1), ("n", n, 1), ("k", k, 0), ("batch", batch, 1)):
            if type(v) is not int or not lo <= v < 2**31:
                _bad(f"{name}: {v!r} must be an int in [{lo}, 2^31)")
        lda = (m if trans_a else k) if lda is None else lda
        ldb = (k if trans_b else n) if ldb is None else ldb
        ldc = n if ldc is None else ldc
        for name, v, need in (("lda", lda, m if trans_a else k), ("ldb", ldb, k if trans_b else n), ("ldc", ldc, n)):
            if type(v) is not int or v < max(need, 1):
                _bad(f"{name}: {v!r} is less than the {max(need, 1)} the operand's rows need")
        for name, v in (("stride_a", stride_a), ("stride_b", stride_b), ("stride_c", stride_c)):
            if type(v) is not int or v < 0:
                _bad(f"{name}: {v!r} must be a non-negative int")
        if batch > 1 and stride_c < (m - 1) * ldc + n:
            _bad(f"stride_c: {stride_c} lets the batch's C matrices overlap ((m - 1) * ldc + n = {(m - 1) * ldc + n})")
        if batch > 65535:
            _bad(f"batch: {batch} is more than the 65535 the grid allows")
        if _cdiv(n, BN) > 65535:
            _bad(f"n: {n} needs more than 65535 tiles of {BN}")
        self.m, self.n, self.k, self.trans_a, self.trans_b = m, n, k, bool(trans_a), bool(trans_b)
        self.lda, self.ldb, self.ldc, self.batch = lda, ldb, ldc, batch
        self.stride_a, self.stride_b, self.stride_c = stride_a, stride_b, stride_c
        self.grid = (_cdiv(m, BM), _cdiv(n, BN), batch)
        self.block = (THREADS, 1, 1)

    def function(self, handle):
        return handle.function(UNIT, expr(self.trans_a, self.trans_b))

    def params(self, a, b, c, alpha=1.0, beta=0.0, bias=0):
        """The launch's params struct for int device addresses (8-byte aligned)."""
        for name, v in (("a", a), ("b", b), ("c", c), ("bias", bias)):
            if v % 8:
                _bad(f"{name}: {v:#x} is not 8-byte aligned")
        p = GemmF64Params()
        p.a, p.b, p.c, p.bias = (a if self.k else 0), (b if self.k else 0), c, bias
        p.lda, p.ldb, p.ldc = self.lda, self.ldb, self.ldc
        p.stride_a, p.stride_b, p.stride_c = self.stride_a, self.stride_b, self.stride_c
        p.alpha, p.beta = alpha, beta
        p.m, p.n, p.k, p.batch = self.m, self.n, self.k, self.batch
        p.flags = (FLAG_BETA if beta != 0.0 else 0) | (FLAG_BIAS if bias else 0)
        return p
