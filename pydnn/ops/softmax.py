"""Softmax: cudnnSoftmaxForward / cudnnSoftmaxBackward (FAST, ACCURATE, LOG; INSTANCE and CHANNEL modes).

INSTANCE normalises over every dim but N (C, H, W, ...) for each n; CHANNEL over C for each (n, h, w...).
The problem becomes `rows` independent rows (ptx/softmax_params.h). Rows whose elements are contiguous
and fit in registers take softmax_*_regs (one read, one write); anything else takes softmax_*_loop.
Every algorithm subtracts the row maximum first.
"""
import ctypes

from .. import enums as E
from .._build.manifest import KernelUnit
from .._build.params import FLAG_BETA, MAX_DIMS, kernel_params
from .._cuda import driver
from ..buffers import device_ptr
from ..handle import check_handle
from ..status import PydnnError, api
from .common import FLOAT_TAGS, TAG, enum_arg, next_pow2, float_tensor, output_tensor, same_shape, same_type, scalar
from ._elementwise import CTYPE, _SIZES

MAXV = 4          # vectors per thread in the register kernels (compile-time register array)
REGS_MAX_G = 1024
LOOP_BLOCK = 256
ALGOS = (E.PYDNN_SOFTMAX_FAST, E.PYDNN_SOFTMAX_ACCURATE, E.PYDNN_SOFTMAX_LOG)
MODES = (E.PYDNN_SOFTMAX_MODE_INSTANCE, E.PYDNN_SOFTMAX_MODE_CHANNEL)


@kernel_params("softmax_params.h", "SoftmaxParams")
class SoftmaxParams(ctypes.Structure):
    _fields_ = [
        ("out", ctypes.c_void_p), ("in0", ctypes.c_void_p), ("in1", ctypes.c_void_p),
        ("alpha", ctypes.c_double), ("beta", ctypes.c_double),
        ("rows", ctypes.c_longlong), ("len", ctypes.c_longlong),
        ("algo", ctypes.c_int), ("group", ctypes.c_int), ("flags", ctypes.c_uint),
        ("row_ndim", ctypes.c_int), ("red_ndim", ctypes.c_int), ("pad_", ctypes.c_int),
        ("row_size", ctypes.c_longlong * MAX_DIMS), ("red_size", ctypes.c_longlong * MAX_DIMS),
        ("row_stride", (ctypes.c_longlong * MAX_DIMS) * 3), ("red_stride", (ctypes.c_longlong * MAX_DIMS) * 3),
    ]


def _vec(tag):
    return 16 // _SIZES[tag]


def _exprs(tag):
    t = CTYPE[tag]
    out = []
    for d in ("fwd", "bwd"):
        out += [f"pydnn::softmax::softmax_{d}_regs<{t}, {_vec(tag)}, {MAXV}>",
                f"pydnn::softmax::softmax_{d}_regs<{t}, 1, {MAXV}>",
                f"pydnn::softmax::softmax_{d}_loop<{t}>"]
    return tuple(out)


def kernel_units():
    return [KernelUnit(f"softmax.{t}", "softmax.cu", _exprs(t)) for t in FLOAT_TAGS]


def _collapse(dims, operands):
    """Merge a group of dims (rows or reduce) across operands: drop size 1, order by the first operand's
    stride (outermost first), join neighbours that are dense across every operand."""
    keep = sorted((i for i in dims if operands[0][0][i] != 1), key=lambda i: -operands[0][1][i])
    sizes, strides = [], [[] for _ in operands]
    for i in keep:
        size = operands[0][0][i]
        if sizes and all(st[-1] == d[1][i] * size for st, d in zip(strides, operands)):
            sizes[-1] *= size
            for st, d in zip(strides, operands):
                st[-1] = d[1][i]
        else:
            sizes.append(size)
            for st, d in zip(strides, operands):
                st.append(d[1][i])
    if not sizes:
        sizes, strides = [1], [[1] for _ in operands]
    return sizes, strides


class _Record:
    __slots__ = ("params", "argv", "funcs", "grids", "block", "need", "masks")


def _prepare(handle, backward, algo, mode, descs):
    """descs: [out, in0, in1?] (forward: y, x; backward: dx, y, dy)."""
    out = descs[0]
    nd = len(out.dims)
    if nd < 2:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{'dxDesc' if backward else 'yDesc'}: softmax needs at "
                         f"least 2 dims (N, C, ...), got {nd}")
    red = [1] if mode == E.PYDNN_SOFTMAX_MODE_CHANNEL else list(range(1, nd))
    rowd = [i for i in range(nd) if i not in red]
    ops = [(d.dims, d.strides) for d in [descs[1]] + [descs[0]] + descs[2:]]  # order by the input's strides
    rsz, rst = _collapse(rowd, ops)
    esz, est = _collapse(red, ops)
    # back to operand order out, in0, in1
    rst = [rst[1], rst[0]] + rst[2:]
    est = [est[1], est[0]] + est[2:]
    tag = TAG[out.dtype]
    rows = 1
    for s in rsz:
        rows *= s
    length = 1
    for s in esz:
        length *= s
    p = SoftmaxParams()
    p.rows, p.len, p.algo = rows, length, algo
    p.row_ndim, p.red_ndim = len(rsz), len(esz)
    for k in range(len(rst)):
        for d, s in enumerate(rsz):
            p.row_size[d] = s
            p.row_stride[k][d] = rst[k][d]
        for d, s in enumerate(esz):
            p.red_size[d] = s
            p.red_stride[k][d] = est[k][d]
    rec = _Record()
    rec.params, rec.argv = p, driver.kernel_args(p)
    rec.need = tuple(d.span_bytes() for d in descs)
    d = "bwd" if backward else "fwd"
    t = CTYPE[tag]
    unit = f"softmax.{tag}"
    dense = len(esz) == 1 and all(s[0] == 1 for s in est)
    vec = _vec(tag)
    vec_ok = dense and length % vec == 0 and all(s % vec == 0 for st in rst for s in st)

    def regs(v):
        """(function, threads per row, block) of the register kernel with v-wide vectors, if the row fits."""
        if not dense or length > REGS_MAX_G * v * MAXV:
            return None
        g = min(REGS_MAX_G, next_pow2(-(-length // (v * MAXV))))
        return handle.function(unit, f"pydnn::softmax::softmax_{d}_regs<{t}, {v}, {MAXV}>"), g, max(g, 128)

    # the loop kernel: a block of threads per row when elements are contiguous, else a thread per row
    loop_g = min(LOOP_BLOCK, next_pow2(length)) if est[1][-1] == 1 else 1
    loop = (handle.function(unit, f"pydnn::softmax::softmax_{d}_loop<{t}>"), loop_g, LOOP_BLOCK)
    unaligned = regs(1) or loop
    rec.funcs = ((vec_ok and regs(vec)) or unaligned, unaligned)
    rec.masks = vec * _SIZES[tag] - 1 if vec_ok else 0
    return rec


def _launch(handle, rec, ptrs, alpha, beta):
    p = rec.params
    p.out, p.in0 = ptrs[0], ptrs[1]
    if len(ptrs) > 2:
        p.in1 = ptrs[2]
    p.alpha, p.beta = alpha, beta
    p.flags = FLAG_BETA if beta != 0 else 0
    mask = 0
    for q in ptrs:
        mask |= q
    func, g, block = rec.funcs[0] if (mask & rec.masks) == 0 else rec.funcs[1]
    p.group = g
    per_block = block // g
    grid = (max(1, -(-p.rows // per_block)), 1, 1)
    driver.launch_args(func, grid, (block, 1, 1), 0, handle.cu_stream, rec.argv)


def _key(tag, algo, mode, descs):
    try:
        return (tag, algo, mode) + tuple((d, d.version) for d in descs)
    except (AttributeError, TypeError):
        return None


def _validate(algo, mode, named):
    algo = enum_arg("algo", algo, ALGOS, "pydnnSoftmaxAlgorithm_t")
    mode = enum_arg("mode", mode, MODES, "pydnnSoftmaxMode_t")
    first_desc, first_name = named[0][1], named[0][2]
    for _, d, n in named:
        float_tensor(d, n)
        same_shape(first_desc, first_name, d, n)
        same_type(first_desc, first_name, d, n)
    return algo, mode


@api
def softmax_forward(handle, algo, mode, alpha, x_desc, x, beta, y_desc, y):
    """cudnnSoftmaxForward: y = alpha * softmax(x) + beta * y (log-softmax for LOG)."""
    check_handle(handle)
    key = _key(0, algo, mode, (y_desc, x_desc))
    rec = handle.prepared.get(key) if key is not None else None
    if rec is None:
        algo, mode = _validate(algo, mode, [(x, x_desc, "xDesc"), (y, y_desc, "yDesc")])
        output_tensor(y_desc, "yDesc")
        device_ptr(x, "x", x_desc.span_bytes())
        device_ptr(y, "y", y_desc.span_bytes())
        rec = _prepare(handle, False, algo, mode, [y_desc, x_desc])
        if key is not None:
            handle.remember(key, rec)
    al, be = scalar("alpha", alpha), scalar("beta", beta)
    ptrs = (device_ptr(y, "y", rec.need[0]), device_ptr(x, "x", rec.need[1]))
    _launch(handle, rec, ptrs, al, be)


@api
def softmax_backward(handle, algo, mode, alpha, y_desc, y, dy_desc, dy, beta, dx_desc, dx):
    """cudnnSoftmaxBackward: dx = alpha * y * (dy - sum(dy * y)) + beta * dx;
    LOG: dx = alpha * (dy - exp(y) * sum(dy)) + beta * dx."""
    check_handle(handle)
    key = _key(1, algo, mode, (dx_desc, y_desc, dy_desc))
    rec = handle.prepared.get(key) if key is not None else None
    if rec is None:
        algo, mode = _validate(algo, mode, [(y, y_desc, "yDesc"), (dy, dy_desc, "dyDesc"), (dx, dx_desc, "dxDesc")])
        output_tensor(dx_desc, "dxDesc")
        for b, d, n in ((y, y_desc, "y"), (dy, dy_desc, "dy"), (dx, dx_desc, "dx")):
            device_ptr(b, n, d.span_bytes())
        rec = _prepare(handle, True, algo, mode, [dx_desc, y_desc, dy_desc])
        if key is not None:
            handle.remember(key, rec)
    al, be = scalar("alpha", alpha), scalar("beta", beta)
    ptrs = (device_ptr(dx, "dx", rec.need[0]), device_ptr(y, "y", rec.need[1]), device_ptr(dy, "dy", rec.need[2]))
    _launch(handle, rec, ptrs, al, be)
