"""pydnnMatmul / pydnn.matmul (pydnn extension): C = alpha * A @ B + beta * C from tensor descriptors, over
pydnn's GEMM kernels (pydnn/ops/matmul.py). The graph's OPERATION_MATMUL runs through the same mapping.

    matmul(handle, alpha, aDesc, A, bDesc, B, beta, cDesc, C)
    matmul_ex(handle, alpha, aDesc, A, bDesc, B, beta, cDesc, C, workSpace, workSpaceSizeInBytes)
    get_matmul_ex_workspace_size(handle, aDesc, bDesc, cDesc) -> bytes

MatmulEx with a workspace of GetMatmulExWorkspaceSize bytes (0 for most problems) lets a problem with few
output tiles and a long K (a Linear layer's weight gradient) split K over the SMs, the fp32 partials summed in
a fixed order (deterministic); with less (or Matmul) the same result comes from one whole-K launch. No call
allocates.

Descriptors have 2 dims (M x K, K x N, M x N) or 3 (a batch in front). Every matrix is row- or
column-major: one of its last two strides is 1 (transposes are strides: a K x M row-major buffer seen
with strides (1, M) is A transposed); the other is the row pitch. C may be column-major too (the product is
then computed as C^T = B^T A^T). A's and B's batch is C's or 1 (broadcast: one matrix for every batch).
A, B and C have one data type: FLOAT (exact FMA, never TF32), HALF or BFLOAT16 (tensor cores, float
accumulation). beta == 0 never reads C. C must not overlap A or B.

Statuses: BAD_PARAM (naming the argument: shapes that do not chain, batch mismatch, mixed data types,
overlapping output, scalars), NOT_SUPPORTED (other data types, more than 3 dims, a matrix with no unit
stride), BAD_PARAM_NULL_POINTER / BAD_PARAM_MISALIGNED_POINTER for pointers.
"""
import functools

from .. import buffers as _buffers
from .. import enums as E
from .. import tuning
from ..handle import Handle, check_handle
from ..ops import matmul as M
from ..buffers import device_ptr
from ..ops.common import element_aligned, scalar
from ..status import PydnnError, api
from ..tensor import check_tensor

__all__ = ["matmul", "matmul_ex", "get_matmul_ex_workspace_size"]

TYPES = (E.PYDNN_DATA_FLOAT, E.PYDNN_DATA_HALF, E.PYDNN_DATA_BFLOAT16)


def _bad(msg):
    return PydnnError(E.PYDNN_STATUS_BAD_PARAM, msg)


def _ns(msg):
    return PydnnError(E.PYDNN_STATUS_NOT_SUPPORTED, msg)


def _as3(name, dims, strides):
    if len(dims) == 2:
        return (1,) + tuple(dims), (0,) + tuple(strides)
    if len(dims) == 3:
        return tuple(dims), tuple(strides)
    raise _ns(f"{name}: {len(dims)} dims; matmul takes 2 (a matrix) or 3 (a batch of matrices)")


def _matrix(name, rows, cols, s_row, s_col):
    """(transposed, leading dim) of a rows x cols matrix with these strides (pydnn.ops.matmul's convention:
    not transposed = row-major with pitch ld >= cols; transposed = column-major with pitch ld >= rows)."""
    if cols == 1 or (s_col == 1 and (rows == 1 or s_row >= cols)):
        return False, (s_row if rows > 1 else cols)
    if rows == 1 or (s_row == 1 and s_col >= rows):
        return True, (s_col if cols > 1 else rows)
    if s_col == 1 or s_row == 1:
        raise _ns(f"{name}: strides ({s_row}, {s_col}) make the rows of the {rows} x {cols} matrix overlap")
    raise _ns(f"{name}: strides ({s_row}, {s_col}) of the {rows} x {cols} matrix have no unit stride "
              f"(matmul needs row- or column-major matrices)")


def _batch_stride(name, b, stride, batch, c_name):
    if b == batch:
        return stride if batch > 1 else 0
    if b == 1:
        return 0  # broadcast
    raise _bad(f"{name}: batch {b} is neither {c_name}'s {batch} nor 1")


def layout(a, b, c, names=("aDesc", "bDesc", "cDesc")):
    """The gemm problem of C = A @ B for (dtype, dims, strides) triples: (swap, gemm_plan keywords). swap:
    the operands go to the kernel as (B, A) (C is column-major: C^T = B^T A^T). Pure: no handle, no GPU."""
    an, bn, cn = names
    (ta, da, sa), (tb, db, sb), (tc, dc, sc) = a, b, c
    for nm, t in ((an, ta), (bn, tb), (cn, tc)):
        if t not in TYPES:
            if t in (E.PYDNN_DATA_DOUBLE, E.PYDNN_DATA_INT8, E.PYDNN_DATA_INT32, E.PYDNN_DATA_INT64,
                     E.PYDNN_DATA_UINT8, E.PYDNN_DATA_BOOLEAN, E.PYDNN_DATA_FP8_E4M3, E.PYDNN_DATA_FP8_E5M2):
                raise _ns(f"{nm}: data type {t} is not supported by matmul (float, half, bfloat16)")
            raise _bad(f"{nm}: {t!r} is not a data type value")
    if ta != tc or tb != tc:
        raise _bad(f"{an if ta != tc else bn}: data type {ta if ta != tc else tb} differs from {cn}'s ({tc})")
    da, sa = _as3(an, da, sa)
    db, sb = _as3(bn, db, sb)
    dc, sc = _as3(cn, dc, sc)
    batch, m, n = dc
    if da[1] != m:
        raise _bad(f"{an}: {da[1]} rows, {cn} has {m}")
    k = da[2]
    if db[1] != k:
        raise _bad(f"{bn}: {db[1]} rows, but {an} has {k} columns (A @ B needs them equal)")
    if db[2] != n:
        raise _bad(f"{bn}: {db[2]} columns, {cn} has {n}")
    stride_a = _batch_stride(an, da[0], sa[0], batch, cn)
    stride_b = _batch_stride(bn, db[0], sb[0], batch, cn)
    trans_a, lda = _matrix(an, m, k, sa[1], sa[2])
    trans_b, ldb = _matrix(bn, k, n, sb[1], sb[2])
    c_trans, ldc = _matrix(cn, m, n, sc[1], sc[2])
    stride_c = sc[0] if batch > 1 else 0
    if c_trans:  # C^T (n x m, row-major with pitch ldc) = B^T A^T
        kw = dict(dtype=tc, m=n, n=m, k=k, trans_a=not trans_b, trans_b=not trans_a, lda=ldb, ldb=lda, ldc=ldc,
                  batch=batch, stride_a=stride_b, stride_b=stride_a, stride_c=stride_c)
    else:
        kw = dict(dtype=tc, m=m, n=n, k=k, trans_a=trans_a, trans_b=trans_b, lda=lda, ldb=ldb, ldc=ldc,
                  batch=batch, stride_a=stride_a, stride_b=stride_b, stride_c=stride_c)
    return c_trans, kw


def plan_for(handle, a_desc, b_desc, c_desc, names=("aDesc", "bDesc", "cDesc")):
    """(swap, GemmPlan) for three tensor descriptors, kept in the handle per layout."""
    key = ("pydnn.matmul", a_desc.dtype, a_desc.dims, a_desc.strides, b_desc.dtype, b_desc.dims, b_desc.strides,
           c_desc.dtype, c_desc.dims, c_desc.strides)
    hit = handle.prepared.get(key)
    if hit is None:
        if not c_desc.non_overlapping():
            raise _bad(f"{names[2]}: strides {c_desc.strides} make elements overlap")
        swap, kw = layout((a_desc.dtype, a_desc.dims, a_desc.strides), (b_desc.dtype, b_desc.dims, b_desc.strides),
                          (c_desc.dtype, c_desc.dims, c_desc.strides), names)
        hit = (swap, M.gemm_plan(handle, split_k=True, **kw))  # launched through plan.launch: split-K allowed
        handle.remember(key, hit)
    return hit


@api
def get_matmul_ex_workspace_size(handle, a_desc, b_desc, c_desc):
    """pydnnGetMatmulExWorkspaceSize (extension): the workspace bytes that let matmul_ex split K (0: none
    used)."""
    check_handle(handle)
    check_tensor(a_desc, "aDesc")
    check_tensor(b_desc, "bDesc")
    check_tensor(c_desc, "cDesc")
    return plan_for(handle, a_desc, b_desc, c_desc)[1].ws_bytes


@api
def matmul(handle, alpha, a_desc, A, b_desc, B, beta, c_desc, C):  # noqa: N803 - cuDNN's names
    """pydnnMatmul (extension): C = alpha * A @ B + beta * C (see the module docstring)."""
    _matmul(handle, alpha, a_desc, A, b_desc, B, beta, c_desc, C, 0, 0)


_matmul_full = matmul  # the full function (api-wrapped: errors are named after it)


# The cached call: a call that passed _matmul's checks leaves (swap, plan, spans of A, B, C) in the handle's
# cache under its three descriptors and their versions (a Set or Destroy makes a new key). A repeated call
# with float alpha / beta and positive, element-aligned int pointers (or CUDA torch tensors of at least their
# spans) whose C does not overlap A or B goes straight to the plan's launch (which keeps its own checks);
# anything else, and any failure, to the full function (same checks, errors and last-error text).
# Python calls of a repeated int-pointer call (tools/profile_torch_host_cpu.py's CNN step): matmul 40 -> 21,
# matmul_ex (split K) 51 -> 28, 17 of them the plan's launch in pydnn/ops/matmul.py (its own re-checks). H200 host
# (tools/bench_host_cnn.py): matmul 9.3-9.5 -> 7.2-8.0 us a call, matmul_ex 13.7-15.8 -> 11.7-13.2 (launches alone
# 4.6 / 7.9).
_K_MM = "pydnn.matmul.call"


def _fast(args, ws, n):
    """The cached call of matmul / matmul_ex (args: matmul's nine; ws, n: the workspace and its size): True once
    launched, False when the full function must take it. May raise (the caller then runs the full function)."""
    handle, alpha, a_desc, A, b_desc, B, beta, c_desc, C = args  # noqa: N806 - cuDNN's names
    if not (type(handle) is Handle and handle.alive and type(alpha) is float and type(beta) is float
            and not _buffers.CHECKED and type(n) is int and 0 <= n <= 2**62):
        return False
    rec = handle.prepared.get((_K_MM, a_desc, a_desc.version, b_desc, b_desc.version, c_desc, c_desc.version))
    if rec is None:
        return False
    tt = _buffers.TORCH_TENSOR
    swap, plan, es, na, nb, nc = rec
    cp = C if type(C) is int else (C.data_ptr() if type(C) is tt and C.is_cuda
                                   and C.nbytes >= nc and C.is_contiguous() else 0)
    ap = A if type(A) is int else (A.data_ptr() if type(A) is tt and A.is_cuda
                                   and A.nbytes >= na and A.is_contiguous() else 0)
    bp = B if type(B) is int else (B.data_ptr() if type(B) is tt and B.is_cuda
                                   and B.nbytes >= nb and B.is_contiguous() else 0)
    if (cp <= 0 or ap <= 0 or bp <= 0 or cp % es or ap % es or bp % es
            or (cp < ap + na and ap < cp + nc) or (cp < bp + nb and bp < cp + nc)):
        return False
    if n and plan.ws_bytes:
        wp = ws if type(ws) is int else (ws.data_ptr() if type(ws) is tt and ws.is_cuda and ws.nbytes >= n
                                         and ws.is_contiguous() else 0)
        if wp <= 0:
            return False
    else:
        wp = n = 0
    if swap:
        plan.launch(handle, bp, ap, cp, alpha, beta, 0, wp, n)
    else:
        plan.launch(handle, ap, bp, cp, alpha, beta, 0, wp, n)
    return True


@functools.wraps(_matmul_full)
def matmul(*args, **kwargs):  # noqa: F811 - the public entry in front of it
    if not kwargs and len(args) == 9:  # (misuse: the full function raises Python's error)
        try:
            if _fast(args, 0, 0):
                return None
        except Exception:  # noqa: BLE001 - the full function below repeats the call and reports any error
            pass
    return _matmul_full(*args, **kwargs)


@api
def matmul_ex(handle, alpha, a_desc, A, b_desc, B, beta, c_desc, C, work_space, work_space_size_in_bytes):  # noqa: N803
    """pydnnMatmulEx (extension): matmul with a workspace (get_matmul_ex_workspace_size bytes: split K)."""
    _matmul(handle, alpha, a_desc, A, b_desc, B, beta, c_desc, C, work_space, work_space_size_in_bytes)


_matmul_ex_full = matmul_ex  # the full function (api-wrapped: errors are named after it)


@functools.wraps(_matmul_ex_full)
def matmul_ex(*args, **kwargs):  # noqa: F811 - the public entry in front of it (matmul's cached call)
    if not kwargs and len(args) == 11:  # (misuse: the full function raises Python's error)
        try:
            if _fast(args[:9], args[9], args[10]):
                return None
        except Exception:  # noqa: BLE001 - the full function below repeats the call and reports any error
            pass
    return _matmul_ex_full(*args, **kwargs)


def _matmul(handle, alpha, a_desc, A, b_desc, B, beta, c_desc, C, workspace, workspace_size):  # noqa: N803
    check_handle(handle)
    check_tensor(a_desc, "aDesc")
    check_tensor(b_desc, "bDesc")
    check_tensor(c_desc, "cDesc")
    al, be = scalar("alpha", alpha), scalar("beta", beta)
    swap, plan = plan_for(handle, a_desc, b_desc, c_desc)
    if plan.empty:
        return
    es = plan.esize  # the pointers under cuDNN's names before the kernel's own checks (which say a, b, c)
    C = element_aligned(device_ptr(C, "C", c_desc.span_bytes()), "C", es)
    if plan.k:
        A = element_aligned(device_ptr(A, "A", a_desc.span_bytes()), "A", es)
        B = element_aligned(device_ptr(B, "B", b_desc.span_bytes()), "B", es)
        for x, d, nm in ((A, a_desc, "A"), (B, b_desc, "B")):
            if C < x + d.span_bytes() and x < C + c_desc.span_bytes():
                raise _bad(f"C: its memory overlaps {nm}'s (C must be separate memory)")
    workspace_size = M._size("workSpaceSizeInBytes", workspace_size, 0, 2**62) if workspace_size else 0
    if workspace_size and plan.ws_bytes:
        workspace = device_ptr(workspace, "workSpace", workspace_size)
    else:
        workspace = workspace_size = 0
    if swap:
        plan.launch(handle, B, A, C, al, be, 0, workspace, workspace_size)
    else:
        plan.launch(handle, A, B, C, al, be, 0, workspace, workspace_size)
    if plan.k and tuning.callpath.CALL_RECORDS:  # the cached call's record (see matmul's entry)
        handle.remember((_K_MM, a_desc, a_desc.version, b_desc, b_desc.version, c_desc, c_desc.version),
                        (swap, plan, es, a_desc.span_bytes(), b_desc.span_bytes(), c_desc.span_bytes()))
