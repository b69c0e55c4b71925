"""The CUDA-core implicit GEMM (ptx/convolution.cu implicit_gemm<DIR, T>): every shape, every data type,
no workspace unless split, deterministic.

    forward          IMPLICIT_GEMM
    backward data    ALGO_0   gather form (no atomics; cuDNN's ALGO_0 is not deterministic, ours is)
    backward filter  ALGO_0   one pass, no split of the reduction
                     ALGO_1   where the tensor cores do not serve it (see tensor_core.py, wgrad_wgmma.py):
                              the reduction split over blocks into fp32 partials in the workspace, added in
                              a fixed order by conv::fold (deterministic, bitwise reproducible)

Each problem is a GEMM (M, N, K) whose K walks the reduction digits (channels and taps, in the order the
operands' strides make contiguous); BM x BN tiles, BK-deep K steps.
"""
from ... import enums as E
from ..._cuda import driver
from ...status import PydnnError
from ...tensor import DTYPES
from .._elementwise import CTYPE
from ..common import FLOAT_TAGS, cdiv, prod
from .plans import Plan, add_kernels, base_params, digit_step, fold_expr, register
from .problem import (DIR_BWD_DATA, DIR_BWD_FILTER, DIR_FWD, FLAG_A_KFAST, FLAG_B_KFAST, FLAG_CIN, FLAG_FLIP,
                      FLAG_PARTIAL, INT_MAX, MAX_SPLITS, NS, ConvAuxParams)

BM, BN, BK, THREADS = 64, 64, 16, 256   # kBM, kBN, kBK, kThreads in ptx/convolution.cu


def implicit_expr(tag, direction):
    return f"pydnn::conv::implicit_gemm<{direction}, {CTYPE[tag]}>"


def bias_grad_expr(tag):
    """conv::bias_grad: the former ConvolutionBackwardBias kernel (one block per channel, an index
    decomposition per element); the call now runs bias.py's row kernel. Still instantiated so this unit
    stays as it was (its cache entries and the other branches' edits to it); to be dropped with the kernel."""
    return f"pydnn::conv::bias_grad<{CTYPE[tag]}>"


for _t in FLOAT_TAGS:
    add_kernels(f"convolution.{_t}", "convolution.cu",
                [implicit_expr(_t, d) for d in (DIR_FWD, DIR_BWD_DATA, DIR_BWD_FILTER)]
                + [fold_expr(_t), bias_grad_expr(_t)])

def _gemm_shape(pb, direction):
    """(M, N, K, reduction digit sizes, channel-innermost?, A k-fast?, B k-fast?) of a direction."""
    taps3 = pb.filt3
    p_out, p_in = prod(pb.out3), prod(pb.in3)
    if direction == DIR_FWD:
        cin = pb.xs[1] == 1 and pb.c > 1
        red = list(taps3) + [pb.cg] if cin else [pb.cg] + list(taps3)
        # x: NCHW runs along m (output columns), NHWC along k (channels); the filter along k
        return pb.n * p_out, pb.kg, pb.cg * prod(taps3), red, cin, cin, True
    if direction == DIR_BWD_DATA:
        cin = pb.ys[1] == 1 and pb.k > 1
        red = list(taps3) + [pb.kg] if cin else [pb.kg] + list(taps3)
        return pb.n * p_in, pb.cg, pb.kg * prod(taps3), red, cin, cin, pb.w_format == E.PYDNN_TENSOR_NCHW
    nhwc = pb.xs[1] == 1 and pb.c > 1
    return pb.kg, pb.cg * prod(taps3), pb.n * p_out, [pb.n] + list(pb.out3), False, not nhwc, not nhwc


def plan(handle, pb, direction, algo, split=False):
    """-> Plan (no kernel loaded). `split`: backward filter ALGO_1 on CUDA cores (split-K into the
    workspace)."""
    gm, gn, gk, red, cin, akf, bkf = _gemm_shape(pb, direction)
    for name, v in (("M", gm), ("N", gn), ("K", gk)):
        if v > INT_MAX:
            raise PydnnError(NS, f"the implicit GEMM's {name} = {v} exceeds 2^31 - 1 (split the batch)")
    acc = 8 if pb.dtype == E.PYDNN_DATA_DOUBLE else 4
    p = base_params(pb, direction)
    p.gm, p.gn, p.gk = gm, gn, gk
    p.flags |= (FLAG_CIN if cin else 0) | (FLAG_A_KFAST if akf else 0) | (FLAG_B_KFAST if bkf else 0)
    for i in range(4):
        p.red_size[i] = red[i]
    for i, v in enumerate(digit_step(BK, red)):
        p.red_step[i] = v
    tiles = cdiv(gm, BM) * cdiv(gn, BN) * pb.groups
    splits = 1
    if split:
        want = cdiv(2 * handle.sm_count, tiles)
        splits = max(1, min(want, MAX_SPLITS, cdiv(gk, 4 * BK)))
    kps = cdiv(cdiv(gk, splits), BK) * BK
    splits = cdiv(gk, kps)
    p.splits, p.k_per_split = splits, kps
    pl = Plan()
    pl.direction, pl.algo, pl.unit = direction, algo, f"convolution.{pb.tag}"
    pl.itemsize, pl.acc_size, pl.deterministic, pl.splits = DTYPES[pb.dtype][0], acc, True, splits
    pl.gemm, pl.gemm_grid = p, (cdiv(gm, BM), cdiv(gn, BN), pb.groups * splits)
    pl.gemm_expr = implicit_expr(pb.tag, direction)
    pl.gemm_argv, pl.gemm_func = driver.kernel_args(p), None
    pl.fold = pl.fold_func = pl.fold_argv = None
    pl.workspace, pl.align, pl.smem, pl.pair_ok, pl.threads = 0, 0, 0, False, THREADS
    if pl.gemm_grid[2] > 65535 or pl.gemm_grid[1] > 65535:
        raise PydnnError(NS, f"groups x splits = {pl.gemm_grid[2]} exceeds the grid's 65535 (too many groups)")
    if splits > 1:
        p.flags |= FLAG_PARTIAL
        pl.workspace = splits * pb.groups * gm * gn * acc
        f = ConvAuxParams()
        f.groups, f.kg, f.cg, f.taps, f.splits = pb.groups, pb.kg, pb.cg, prod(pb.filt3), splits
        for i in range(3):
            f.filt[i] = pb.filt3[i]
        for i in range(5):
            f.out_stride[i] = pb.ws[i]
        f.flags = FLAG_FLIP if pb.flip else 0
        pl.fold, pl.fold_expr = f, fold_expr(pb.tag)
        pl.fold_grid = (cdiv(pb.groups * gm * gn, 256), 1, 1)
        pl.fold_argv = driver.kernel_args(f)
    return pl


@register(DIR_FWD, E.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM)
@register(DIR_BWD_DATA, E.PYDNN_CONVOLUTION_BWD_DATA_ALGO_0)
@register(DIR_BWD_FILTER, E.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_0)
def plan_unsplit(handle, pb, direction, algo):
    return plan(handle, pb, direction, algo)


@register(DIR_BWD_FILTER, E.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_1, order=2)
def plan_split(handle, pb, direction, algo):
    """ALGO_1 where neither tensor-core backward filter serves the problem."""
    return plan(handle, pb, direction, algo, split=True)
