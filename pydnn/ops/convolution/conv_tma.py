"""fwd_tma (ptx/conv_tma.cu; issue 18): the 16-bit NHWC forward convolution as a warp-specialized TMA +
mbarrier kernel (a producer thread issuing TMA boxes, two consumer warpgroups on wgmma, a persistent grid),
behind tuning.conv.FWD_TMA (on: a call's own unsplit fwd_wgmma forward plan with K >= MIN_K runs it; H200,
mid-session run 3, tools/bench_conv_tma.py: 1.10-1.30x fwd_wgmma on 11 forward rows, 0.594 -> 0.706 of cuDNN).

What it takes (tma_refusal says why not): half / bfloat16, one group, 2-d, stride 1 (a tap's window of a box
of output pixels is then a box of x), or strides up to 8 under tuning.conv.FWD_TMA_STRIDED (x's box then spans
stride x the pixels and loads every stride-th: the map's element strides), any padding and dilation, either
mode; x NHWC-like with channel stride 1 and every other stride a multiple of 8 elements (TMA: 16-byte strides,
a 16-byte aligned base, checked per call: a misaligned x, or maps the driver cannot encode, run fwd_wgmma's
plan instead); the filter packed KRSC (a 3-d map: C, R * S, K); C a multiple of 8; y any strides (the epilogue
writes 16-byte groups of 8 channels where y allows it, tuning.conv.FWD_TMA_WIDE, else channel pairs or
elements). The output tile's 128 GEMM rows are a box of tn images x th rows x tw columns of y (powers of two,
tn * th * tw = 128), chosen to waste the fewest rows at the image's edges (_box).

The GEMM algorithm's direct 1x1 plans on matmul's mma.sync tile move here too (tuning.conv.TMA_1X1,
gemm1x1_top: the section at the end).

The plan (TmaPlan, a StepPlan) encodes x's and the filter's tensor maps per call (tensormap.MapCache: once
per base address) into ConvTmaParams and launches one kernel; ConvolutionBiasActivationForward's fields are
the embedded ConvParams' (plan.gemm), so the fused call runs the same kernel with its epilogue.

Backward data (DgradTmaPlan, tuning.conv.DGRAD_TMA / DGRAD_TMA_PHASES; the section "backward data" below): a
stride-1 dx is the forward of dy with the flipped, K <-> C transposed filter, which fwd_tma<..., BKN = 1>
reads straight from w (MN-major TMA boxes), or K-major from filter_kc_swap's copy; a strided call's phases
(dgrad_phases.py) are such stride-1 problems too.
"""
import ctypes

from ... import enums as E
from ... import tuning
from ..._build.params import FLAG_BETA, FLAG_NAN_PROP, kernel_params
from ..._cuda import driver
from ..._cuda import tensormap as TM
from ...status import PydnnError
from .._elementwise import CTYPE
from ..common import cdiv
from . import tensor_core  # noqa: F401 - its split-K hook registers before tma_top (a split plan stays split)
from .plans import Plan, StepPlan, add_kernels, base_params, register_tma_planner, register_top
from .problem import DIR_BWD_DATA, DIR_FWD, FLAG_BIAS, FLAG_PAIR, FLAG_Z, ConvParams

BM, BK = 128, 64
BNS = (64, 128, 256)   # the tile's output channels: fwd_tma<T, BN, STAGES> instantiations, a unit each
# ring stages by tile width: ~192 KiB of stages each (BN 256: gemm_tma's 128 x 256 tile's 4; the 128-wide
# tiles deeper, as matmul's 128 x 128 ping-pong candidate's 7 x 32 KiB), one block an SM
STAGES = {64: 8, 128: 6, 256: 4}
THREADS = 384


def smem(bn):
    """The ring, 1 KiB of alignment slack, the mbarriers (each width: 193 KiB)."""
    return STAGES[bn] * (BM + bn) * BK * 2 + 1024 + 16 * STAGES[bn]
ARCH = "sm_90"
TAGS = ("f16", "bf16")


@kernel_params("conv_tma_params.h", "ConvTmaParams")
class ConvTmaParams(ctypes.Structure):
    _fields_ = [("map_x", ctypes.c_uint64 * 16), ("map_w", ctypes.c_uint64 * 16), ("p", ConvParams),
                ("tw", ctypes.c_int), ("th", ctypes.c_int), ("tn", ctypes.c_int),
                ("tiles_w", ctypes.c_int), ("tiles_h", ctypes.c_int), ("tiles_n", ctypes.c_int),
                ("tiles_k", ctypes.c_int), ("cblocks", ctypes.c_int), ("wide", ctypes.c_int),
                ("pad_tail", ctypes.c_int * 5)]


BKN_UNITS = {0: "tma", 1: "tma_dgrad", 2: "tma_phase"}


def expr(tag, bn=128, bkn=0):
    """fwd_tma<T, BN, STAGES> (B K-major: the forward's packed KRSC filter, or backward data's swapped copy), or
    fwd_tma<T, BN, STAGES, BKN> (backward data's B read MN-major from the filter itself, plan_dgrad_tma: BKN 1 a
    call's packed KRSC filter through a 3-d map, 2 a strided call's phase's sub-filter view through a 4-d one)."""
    return f"pydnn::conv::fwd_tma<{CTYPE[tag]}, {bn}, {STAGES[bn]}{f', {int(bkn)}' if bkn else ''}>"


def unit(tag, bn=128, bkn=0):
    """The forward's units convolution.tma.<tag>.bn<BN>; backward data's convolution.tma_dgrad.bn<BN>.<tag> (the data
    type last: rare.py's `together` rule compiles a data type's widths at once on their first use) and the phases'
    convolution.tma_phase.bn<BN>.<tag>."""
    if not bkn:
        return f"convolution.tma.{tag}.bn{bn}"
    return f"convolution.{BKN_UNITS[int(bkn)]}.bn{bn}.{tag}"


for _t in TAGS:
    for _bn in BNS:   # one unit a tile: compiled in parallel, loaded only where a plan runs it
        for _k in BKN_UNITS:   # (backward data's BKN 1 / 2: first use, pydnn/_build/rare.py)
            add_kernels(unit(_t, _bn, _k), "conv_tma.cu", (expr(_t, _bn, _k),), archs=(ARCH + "a",))


# A short reduction (<= SHORT_RED K tiles: a 1x1 of C <= 256) is memory-bound; with the 16-byte store, its 256-wide tile
# (x read once per 256 output channels) beat the 128-wide one where the 128-wide items made >= WIDE256_WAVES waves
# (H200, session 33, the 1x1 route's points: 16 of 16 with K >= 256 and >= 784 items, 1.04-1.31x, e.g. N128 1x1
# 128->256 @56 0.1139 -> 0.0872 ms; at 392 items (3 waves) 128 was faster on all 4, 1.09-1.12x)
SHORT_RED = 4
WIDE256_WAVES = 4


def _bn(handle, pb, tiles_px):
    """The tile's output channels: tuning.conv.FWD_TMA_BN, else 64 for K <= 64 (a 128-wide tile would be half
    empty); 256 where K >= 256, the 128-wide tiles would take under two waves of the SMs and the 256-wide ones
    still fill half a wave; else 128. Measured (H200, mid-session run 3, ms at BN 64 / 128 / 256): N64 3x3
    64 @56 0.0553 / (run 1) 0.0890 / 0.1902; N128 UNet 3x3 256 @32 0.3740 / 0.2693 / 0.3070 (16 waves: 128);
    N128 3x3 512 @7 0.0917 / 0.0690 / 0.0593 (196 items of 128: 1.5 waves; 98 of 256); N32 UNet 512 @16
    0.1012 / 0.0654 / 0.0613 (256 / 128 items); N32 3x3 256 @14 0.0256 / 0.0190 / 0.0381 (49 items of 256:
    0.37 wave); N128 1x1 512->2048 @7 0.0527 / 0.0476 / 0.0617 (784 items of 128)."""
    forced = tuning.conv.FWD_TMA_BN
    if forced is not None:
        return int(forced)
    if pb.k <= 64:
        return 64
    sms = max(handle.sm_count, 1)
    ktiles = pb.filt3[1] * pb.filt3[2] * cdiv(pb.c, BK)
    if (tuning.conv.FWD_TMA_WIDE and ktiles <= SHORT_RED and pb.k >= 256
            and tiles_px * cdiv(pb.k, 128) >= WIDE256_WAVES * sms):
        return 256   # a memory-bound short reduction with many items: x's tiles read once per 256 channels
    if pb.k >= 256 and tiles_px * cdiv(pb.k, 128) < 2 * sms and tiles_px * cdiv(pb.k, 256) * 2 >= sms:
        return 256
    return 128


MAX_ESTRIDE = 8   # a TMA map's element strides are 1..8 (cuTensorMapEncodeTiled)


def tma_refusal(handle, pb, strided=False):
    """Why fwd_tma does not take a forward problem (text), or None. strided: a stride of 2..MAX_ESTRIDE taken
    (x's map walks every stride-th pixel: element strides; tuning.conv.FWD_TMA_STRIDED)."""
    if handle.arch != ARCH:
        return f"arch {handle.arch} (fwd_tma is sm_90a code)"
    if pb.tag not in TAGS:
        return f"data type {pb.tag}"
    if pb.groups != 1:
        return "groups"
    if pb.nspatial != 2 or pb.in3[0] != 1 or pb.filt3[0] != 1:
        return "not a 2-d problem"
    if pb.stride3 != (1, 1, 1) and not (strided and pb.stride3[0] == 1 and max(pb.stride3) <= MAX_ESTRIDE):
        return "stride"
    if pb.c % 8:
        return "C % 8 (16-byte TMA strides)"
    if pb.math_type == E.PYDNN_FMA_MATH:
        return "FMA math"
    xs, ws = pb.xs, pb.ws
    if xs[1] != 1 or any(xs[i] % 8 for i in (0, 3, 4)):
        return "x is not NHWC-like with 16-byte pixel / row / image strides"
    R, S = pb.filt3[1], pb.filt3[2]
    if not (ws[1] == 1 and ws[4] == pb.c and ws[3] == S * pb.c and ws[0] == R * S * pb.c):
        return "the filter is not packed KRSC"
    if pb.n * (xs[0] or 1) * 2 >= TM.MAX_STRIDE:
        return "x spans 2^40 bytes"
    return None


def _box(n, P, Q, sh=1, sw=1):
    """(tw, th, tn): powers of two, tw * th * tn = 128, with the fewest padded rows over the whole y (ties:
    the widest tw, for longer contiguous runs of x); strided, x's box spans tw * sw columns and th * sh rows,
    each at most a TMA box dim's 256."""
    best = None
    for a in range(8):
        for b in range(8 - a):
            tw, th = 1 << a, 1 << b
            tn = 128 // (tw * th)
            if tw * th * tn != 128 or tw * sw > TM.MAX_BOX or th * sh > TM.MAX_BOX:
                continue
            rows = cdiv(Q, tw) * tw * cdiv(P, th) * th * cdiv(n, tn) * tn
            key = (rows, -tw)
            if best is None or key < best[0]:
                best = (key, (tw, th, tn))
    return best[1]


class TmaPlan(StepPlan):
    """fwd_tma's launch: the maps of x and the filter per base address, then one kernel."""

    wide_ok = False   # the 16-byte store (plan_tma sets it where tuning.conv.FWD_TMA_WIDE takes the output)

    def launch(self, handle, a_ptr, b_ptr, out_ptr, ws_ptr, alpha, beta, z_ptr=0, bias_ptr=0):
        if not self.encode(a_ptr, b_ptr):
            return self.fallback_run(handle, a_ptr, b_ptr, out_ptr, ws_ptr, alpha, beta, z_ptr, bias_ptr)
        self.run_kernel(handle, a_ptr, b_ptr, out_ptr, alpha, beta, z_ptr, bias_ptr)

    def encode(self, a_ptr, b_ptr):
        """The maps of x (or dy) at a_ptr and of the filter at b_ptr into the params; False where TMA cannot
        take them (a base address not 16-byte aligned, or no map encoder: a driver without it, a CPU handle's
        dry run), so that the caller runs the fallback plan."""
        if a_ptr % 16 or b_ptr % 16:
            return False
        try:
            mx, mw = self.maps[0].get(a_ptr), self.maps[1].get(b_ptr)
        except PydnnError:
            return False
        q = self.q
        ctypes.memmove(ctypes.addressof(q.map_x), mx, 128)
        ctypes.memmove(ctypes.addressof(q.map_w), mw, 128)
        return True

    def run_kernel(self, handle, a_ptr, b_ptr, out_ptr, alpha, beta, z_ptr=0, bias_ptr=0):
        p = self.q.p
        p.x, p.w, p.out, p.z, p.bias = a_ptr, b_ptr, out_ptr, z_ptr or None, bias_ptr or None
        p.alpha, p.beta = alpha, beta
        p.flags = ((p.flags & ~(FLAG_BETA | FLAG_PAIR)) | (FLAG_BETA if beta != 0 else 0)
                   | (FLAG_PAIR if self.pair_ok and out_ptr % 4 == 0 else 0))
        self.q.wide = int(self.wide_ok and out_ptr % 16 == 0)   # (the kernel takes it for the plain epilogue only)
        if self.func is None:
            self.func = handle.function(self.unit_name, self.expr)
            driver.function_set_max_dynamic_smem(self.func, self.smem)
        driver.launch_args(self.func, self.grid, (THREADS, 1, 1), self.smem, handle.cu_stream, self.argv)

    def fallback_run(self, handle, *args):
        """A call whose x or filter is not 16-byte aligned (TMA's base addresses), or whose maps cannot be encoded
        (no driver entry point): fwd_wgmma's plan, with this call's epilogue fields (ConvolutionBiasActivation-
        Forward set them on self.gemm) copied over."""
        from .plans import run_plan
        f, p = self.fallback.gemm, self.q.p
        f.act, f.coef, f.alpha2, f.bias_stride = p.act, p.coef, p.alpha2, p.bias_stride
        for i in range(5):
            f.zs[i] = p.zs[i]
        keep = FLAG_BIAS | FLAG_Z | FLAG_NAN_PROP
        f.flags = (f.flags & ~keep) | (p.flags & keep)
        return run_plan(handle, self.fallback, *args)

    def estimate_ms(self, handle, base_estimate):
        return base_estimate(handle, self.fallback)




class _Map:
    """TiledMap-like: encode(address) -> the 128 bytes (tensormap.encode_tiled with the plan's dims)."""

    estrides = None   # element strides (a strided forward's x); set on the instance only then (plan digests)

    def __init__(self, tag, dims, strides, box, estrides=None):
        self.tag, self.dims, self.strides, self.box = tag, dims, strides, box
        if estrides is not None:
            self.estrides = estrides

    def encode(self, address):
        return TM.encode_tiled(self.tag, address, self.dims, self.strides, self.box, elem_strides=self.estrides)


def plan_tma(handle, pb, algo, fallback, pl=None, bkn=0, bkn_ws=None, bn=None):
    """fwd_tma's plan of a forward problem tma_refusal takes (`fallback`: the plan a misaligned call runs).
    Backward data (plan_dgrad_tma) passes its forward of dy as pb, its own plan object as pl, and bkn 1 / 2: B read
    from the original filter (K = pb.c, C = pb.k), packed KRSC (1) or through its (k, c, d, r, s) strides bkn_ws
    (2), instead of a packed (pb.k, taps, pb.c) one (0)."""
    pl = pl if pl is not None else TmaPlan(DIR_FWD, algo, pb)
    p = base_params(pb, DIR_FWD)
    p.gm, p.gn, p.gk = pb.n * pb.out3[1] * pb.out3[2], pb.k, pb.c * pb.filt3[1] * pb.filt3[2]
    p.splits, p.k_per_split = 1, 0
    for i in range(5):
        p.zs[i] = pb.ys[i]
    q = ConvTmaParams()
    q.p = p
    n, P, Q = pb.n, pb.out3[1], pb.out3[2]
    tw, th, tn = _box(n, P, Q, pb.stride3[1], pb.stride3[2])
    q.tw, q.th, q.tn = tw, th, tn
    q.tiles_w, q.tiles_h, q.tiles_n = cdiv(Q, tw), cdiv(P, th), cdiv(n, tn)
    tiles_px = q.tiles_w * q.tiles_h * q.tiles_n
    bn = bn or _bn(handle, pb, tiles_px)
    q.tiles_k, q.cblocks = cdiv(pb.k, bn), cdiv(pb.c, BK)
    items = q.tiles_w * q.tiles_h * q.tiles_n * q.tiles_k
    pl.q = q
    pl.gemm = q.p                       # ConvolutionBiasActivationForward sets the epilogue fields here
    es = 2
    H, W, C = pb.in3[1], pb.in3[2], pb.c
    xs, R, S = pb.xs, pb.filt3[1], pb.filt3[2]
    if bkn == 1:   # w (K, taps, C) itself: boxes of 64 of its C (this forward's output channels) x 1 tap x 64 of its K
        mw = _Map(pb.tag, (pb.k, R * S, C), (pb.k * es, R * S * pb.k * es), (64, 1, BK))
    elif bkn == 2:   # a view (K, R, S, C) of w through its strides: the same boxes at (c, s, r, k)
        mw = _Map(pb.tag, (pb.k, S, R, C), (bkn_ws[4] * es, bkn_ws[3] * es, bkn_ws[0] * es), (64, 1, 1, BK))
    else:     # (K, taps, C) packed, C this forward's input channels: boxes of 64 of them x 1 tap x BN of K
        mw = _Map(pb.tag, (C, R * S, pb.k), (C * es, R * S * C * es), (BK, 1, bn))
    # x: a box of tw x th x tn output pixels' windows for one tap; strided, the box spans tw * stride columns
    # (th * stride rows) of x and loads every stride-th (the map's element strides): the same 128 rows of 64 c
    sh, sw = pb.stride3[1], pb.stride3[2]
    mx = _Map(pb.tag, (C, W, H, n), (xs[4] * es, xs[3] * es, xs[0] * es), (BK, tw * sw, th * sh, tn),
              (1, sw, sh, 1) if (sh, sw) != (1, 1) else None)
    pl.maps = (TM.MapCache(mx), TM.MapCache(mw))
    pl.grid = (max(1, min(items, handle.sm_count)), 1, 1)
    pl.argv = driver.kernel_args(q)
    pl.bn = bn
    pl.unit_name, pl.expr, pl.func = unit(pb.tag, bn, bkn), expr(pb.tag, bn, bkn), None
    pl.gemm_expr = pl.expr
    pl.fallback = fallback
    pl.smem = smem(bn)
    ys = pb.ys
    pl.pair_ok = ys[1] == 1 and all(ys[i] % 2 == 0 for i in (0, 2, 3, 4))
    # the 16-byte store (tuning.conv.FWD_TMA_WIDE): y's channels contiguous, its rows 16-byte strided, K % 8 == 0
    if tuning.conv.FWD_TMA_WIDE and ys[1] == 1 and all(ys[i] % 8 == 0 for i in (0, 3, 4)) and pb.k % 8 == 0:
        pl.wide_ok = True
    pl.items = items
    return pl


# FWD_TMA True takes K >= MIN_K: mid-session run 3 (H200), fwd_tma / fwd_wgmma 1.10-1.30x on all 11 forward rows
# measured (K 64 on the 64-wide tile: 1.10-1.26x; run 1's 128-wide tile there: 0.78x); K < 64 not measured
MIN_K = 64


def tma_top(handle, pl):
    """plans.register_top's hook (after tensor_core's split-K): a call's own unsplit fwd_wgmma forward plan
    runs fwd_tma where tuning.conv.FWD_TMA is True (K >= MIN_K, no forced tiling) or "always" (forced tilings
    too: the tests' and the benchmark's form) and tma_refusal takes the problem; the wgmma plan stays as the
    fallback of a misaligned call."""
    mode = tuning.conv.FWD_TMA
    if (not mode or type(pl) is not Plan or pl.direction != DIR_FWD or pl.fold is not None
            or "fwd_wgmma<" not in (pl.gemm_expr or "")):
        return pl
    if mode != "always" and (tuning.conv.TC_FORCE.get(DIR_FWD) is not None or pl.problem.k < MIN_K):
        return pl   # a forced tiling runs as forced; K < MIN_K: not measured faster
    smode = tuning.conv.FWD_TMA_STRIDED
    strided = pl.problem.stride3 != (1, 1, 1)
    if strided and not smode:
        return pl   # a strided forward: its own switch (FWD_TMA's mode rules the rest)
    if tma_refusal(handle, pl.problem, strided=bool(smode)) is not None:
        return pl
    tp = plan_tma(handle, pl.problem, pl.algo, pl)
    if strided and smode != "always" and tp.items < STRIDED_MIN_WAVES * max(handle.sm_count, 1):
        return pl   # under a wave of items: fwd_wgmma's 2-blocks-an-SM tile measured as fast (FWD_TMA_STRIDED)
    return tp


# FWD_TMA_STRIDED True takes a strided forward where fwd_tma has at least this many waves of items (H200, session 33:
# fwd_tma / fwd_wgmma 1.205 geomean over the sweep's 10 strided points with a wave or more, 0.978 over the 14 under)
STRIDED_MIN_WAVES = 1


register_top(tma_top)
register_tma_planner(lambda handle, pb, algo, fallback: (plan_tma(handle, pb, algo, fallback)
                                                         if tma_refusal(handle, pb) is None else None))


# ----------------------------------------------------------------------------- backward data (stride 1)
#
# dx of a stride-1 convolution is the forward of dy (K channels) into dx (C channels) with padding
# (R - 1) * dil - pad, the opposite mode and the filter w'[c][tap][k] = w[k][tap][c] (tensor_core.py's
# _bwd_wgm_problem; fwd_wgmma runs it today, _plan_bwd_wgmma). fwd_tma takes it two ways:
#   direct (w packed KRSC): fwd_tma<..., BKN = 1> reads B from w itself, BN / 64 TMA boxes of 64 c x 64 k a
#     K tile (MN-major for wgmma, the transpose bit): one launch, no workspace;
#   swap (the plan fwd_tma replaces is tensor_core's BwdWgmmaPlan: tuning.conv.WGM_BWD_SWAP, or a filter the
#     direct read cannot take): that plan's filter_kc_swap writes w' packed into the workspace, then fwd_tma
#     reads it K-major as the forward's filter (two launches; the swap's traffic counted in the plan's time).
# dy is the A operand: one 4-d box of NHWC dy a K tile, as the forward's x. The epilogue writes dx through its
# strides with alpha / beta (epilogue_value for beta). Deterministic: every dx element written once.

class DgradTmaPlan(TmaPlan):
    """Backward data on fwd_tma: the forward of dy (self.q; its problem self.sub_problem), B from w itself
    (direct) or from the swap's copy in the workspace (self.swap_plan: the BwdWgmmaPlan it replaces)."""

    def launch(self, handle, a_ptr, b_ptr, out_ptr, ws_ptr, alpha, beta, z_ptr=0, bias_ptr=0):
        """a = dy, b = w, out = dx."""
        from .plans import run_plan
        sw = self.swap_plan
        if not self.encode(a_ptr, ws_ptr if sw is not None else b_ptr):
            return run_plan(handle, self.fallback, a_ptr, b_ptr, out_ptr, ws_ptr, alpha, beta)
        if sw is not None:   # w' = the filter with K and C swapped, packed, into the workspace
            if sw.swap_func is None:
                sw.swap_func = handle.function(sw.unit, sw.swap_expr)
            sw.swap.in_, sw.swap.out = b_ptr, ws_ptr
            driver.launch_args(sw.swap_func, sw.swap_grid, (256, 1, 1), 0, handle.cu_stream, sw.swap_argv)
            b_ptr = ws_ptr
        self.run_kernel(handle, a_ptr, b_ptr, out_ptr, alpha, beta)


def dgrad_refusal(handle, pb, swap, phase=False):
    """Why fwd_tma does not take a stride-1 backward-data problem (text), or None: its forward of dy must be one
    fwd_tma takes (tma_refusal: sm_90, 16-bit, one group, 2-d, K % 8, dy NHWC-like with 16-byte strides), and
    the direct read (swap False) C % 8 (the map's 16-byte row stride) and w packed KRSC (a call's own plan: the
    3-d map) or C contiguous with 16-byte tap / K strides (phase: a strided call's sub-filter view, the 4-d map)."""
    from .tensor_core import _bwd_wgm_problem
    if pb.stride3 != (1, 1, 1):
        return "stride"
    why = tma_refusal(handle, _bwd_wgm_problem(pb))
    if why is not None:
        return why
    if not swap:
        ws, R, S = pb.ws, pb.filt3[1], pb.filt3[2]
        if pb.c % 8:
            return "C % 8 (the filter map's 16-byte row stride)"
        if phase and (ws[1] != 1 or any(ws[i] % 8 for i in (0, 3, 4))):
            return f"filter strides {tuple(ws)} (the direct read: C contiguous, 16-byte tap / K strides)"
        if not phase and not (ws[1] == 1 and ws[4] == pb.c and ws[3] == S * pb.c and ws[0] == R * S * pb.c):
            return "the filter is not packed KRSC (the direct read)"
    return None


def plan_dgrad_tma(handle, pb, algo, fallback, swap, phase=False, bn=None):
    """fwd_tma's plan of a backward-data problem dgrad_refusal takes: direct (swap False: the fallback is
    tensor_core's one-launch fwd_wgmma plan; BKN 1, or 2 for a phase) or after filter_kc_swap (swap True: the
    fallback is its BwdWgmmaPlan, whose swap this plan launches)."""
    from .tensor_core import _bwd_wgm_problem
    spb = _bwd_wgm_problem(pb)
    pl = DgradTmaPlan(DIR_BWD_DATA, algo, pb)
    plan_tma(handle, spb, algo, fallback, pl=pl, bkn=0 if swap else 2 if phase else 1, bkn_ws=tuple(pb.ws), bn=bn)
    pl.problem, pl.sub_problem = pb, spb
    pl.unit = pl.unit_name   # (dgrad_phases' PhasePlan names its biggest phase's unit)
    pl.swap_plan = fallback if swap else None
    pl.workspace = fallback.workspace if swap else 0
    return pl


def slower_than_replaced(handle, tp, pl):
    """Where DGRAD_TMA True leaves the replaced fwd_wgmma plan (a reason, or None): the mid-session sweep (H200,
    session 32, tools/bench_dgrad_tma.py --sweep, 82 stride-1 points: fwd_tma / fwd_wgmma 1.121 geomean, 0.643 -
    1.720) lost on two kinds of point, and no point it won has either mark:
      * under one wave of items (items < SMs) with a short reduction (<= SHORT_K K tiles) where the replaced plan
        is the 128 x 64 MINB 2 tile (2 blocks an SM, 2-4x fwd_tma's items): the ResNet-50 / ResNeXt 1x1 layers
        at N 8 (N8 1x1 512->512 @28 0.785, 512->256 @28 0.816, 2048->512 @7 0.893), N32 1x1 512->1024 @14 0.927,
        N128 1x1 512->2048 @7 0.946, N8 3x3 128->128 @28 0.953; 12 points, 0.785-0.997;
      * dy's channels (the reduction's, K) below one 64-deep K tile: random N135 7x7 88->40 @26 0.643, N12 5x5
        144->48 @35 0.779 (the only two such points).
    The rest of the losers: one point (random N25 5x5 72->200 @111, 0.756) is left to fwd_tma (no mark found)."""
    q = tp.q
    ktiles = tp.sub_problem.filt3[1] * tp.sub_problem.filt3[2] * q.cblocks
    if tp.items < max(handle.sm_count, 1) and ktiles <= SHORT_K and "fwd_wgmma<" in (pl.gemm_expr or ""):
        from .tensor_core import _wgm_cfg
        if _wgm_cfg(pl.gemm_expr)[0] == 64:
            return f"{UNDER_WAVE} {tp.items} items of {ktiles} K tiles, the replaced 128 x 64 tile"
    if tp.sub_problem.c < BK:
        return f"dy's {tp.sub_problem.c} channels: under one K tile"
    return None


SHORT_K = 32


def tma_dgrad_top(handle, pl, mode=None, phase=False):
    """plans.register_top's hook: a call's own unsplit stride-1 backward-data plan on fwd_wgmma (tensor_core's
    direct plan, or its BwdWgmmaPlan) runs fwd_tma where tuning.conv.DGRAD_TMA is True (C >= MIN_K: the forward
    rule on this forward's output channels; no forced tiling; not where slower_than_replaced says) or "always",
    and dgrad_refusal takes it. mode, phase: tma_dgrad_phase_top's (DGRAD_TMA_PHASES, a strided call's phase)."""
    from .tensor_core import BwdWgmmaPlan
    mode = tuning.conv.DGRAD_TMA if mode is None else mode
    if not mode or pl.direction != DIR_BWD_DATA or pl.fold is not None:
        return pl
    if type(pl) is BwdWgmmaPlan:
        swap = True
    elif type(pl) is Plan and "fwd_wgmma<" in (pl.gemm_expr or ""):
        swap = False
    else:
        return pl
    pb = pl.problem
    if mode != "always" and (tuning.conv.TC_FORCE.get(DIR_BWD_DATA) is not None or pb.c < MIN_K):
        return pl
    if dgrad_refusal(handle, pb, swap, phase) is not None:
        return pl
    tp = plan_dgrad_tma(handle, pb, pl.algo, pl, swap, phase)
    if mode != "always":
        why = slower_than_replaced(handle, tp, pl)
        if (why is not None and why.startswith(UNDER_WAVE) and tp.bn > 64 and not phase
                and tuning.conv.FWD_TMA_BN is None):
            return plan_dgrad_tma(handle, pb, pl.algo, pl, swap, phase, bn=64)   # 2-4x the items: see UNDER_WAVE
        if why is not None:
            return pl
    return tp


# slower_than_replaced's first mark (under a wave of items, a short reduction, over fwd_wgmma's 128 x 64 MINB 2 tile):
# there fwd_tma at the 64-wide tile (2-4x the items of the chooser's 128 / 256) beat the kept fwd_wgmma plan on all 12
# network points of the sweep that carry it, 1.13-1.50x (H200, session 33 mid-session run, pair stores: `--set few`,
# e.g. N8 1x1 1024->2048 @7 0.0167 -> 0.0111 ms, N128 1x1 512->2048 @7 0.0444 -> 0.0358), so DGRAD_TMA True takes it
# there at BN 64 (its second mark, dy's K under one K tile, keeps fwd_wgmma: 0.52-0.93x at BN 64; a strided call's
# phases with the first mark keep it too: not measured at BN 64)
UNDER_WAVE = "under a wave:"


def tma_dgrad_phase_top(handle, pl):
    """The same for dgrad_phases.py's phases of a strided call (each a stride-1 backward data of dy into a
    strided view of dx, with a sub-filter view of w: BKN 2's 4-d map takes its tap strides), under
    tuning.conv.DGRAD_TMA_PHASES: True where the phase's output tiles (dx's C over BN-wide tiles) are at least
    PHASE_MIN_FILL full, "always" wherever fwd_tma takes the phase."""
    mode = tuning.conv.DGRAD_TMA_PHASES or False
    tp = tma_dgrad_top(handle, pl, mode, phase=True)
    if tp is pl or mode == "always":
        return tp
    c = tp.sub_problem.k   # the phase forward's output channels: dx's C
    return tp if c / (tp.bn * cdiv(c, tp.bn)) >= PHASE_MIN_FILL else pl


# DGRAD_TMA_PHASES True: the phases' output tiles at least this full (H200, session 33, the sweep's 15 strided points:
# phases on fwd_tma / fwd_wgmma 1.134 geomean over the 12 with tiles >= 0.9 full, 0.638 over the 3 at 0.59-0.63: C 320
# and 152 on 256- / 128-wide tiles; the one loser kept, C 248 at 0.97 full, 0.896)
PHASE_MIN_FILL = 0.9


register_top(tma_dgrad_top, scope="own")
register_top(tma_dgrad_phase_top, scope="sub")


# ----------------------------------------------------------------------------- the direct 1x1 GEMM plans
#
# The GEMM algorithm's direct 1x1 plan (gemm.py: one pydnn.ops.matmul on NHWC x, or dy, itself) runs matmul's
# mma.sync gemm_tc tile where the reduction is short (matmul takes its wgmma / TMA tiles from K >= 256-512):
# one block a 128 x 256 tile, its single K tile's loads not overlapped with its stores, ~1.1 TB/s on layers
# that are memory-bound (the sweep, H200, 2026-11-28: 31 such points at 0.29-0.61x cuDNN, e.g. N128 1x1
# 64->256 @56 forward 0.2232 ms against cuDNN's 0.0723). fwd_tma is persistent: its producer runs STAGES K
# tiles (here: items) ahead of the consumers' epilogues.

def _mm_tc(mp):
    """Whether a matmul plan runs the mma.sync gemm_tc tile (no wgmma / TMA form)."""
    return mp is not None and getattr(mp, "tma", None) is None and "gemm_tc<" in (mp.fast.expr if mp.fast else "")


# The persistent 128 x 256 wgmma tile (matmul.WG_PERSIST_MIN_K) walks its tiles in waves of one block a SM: a
# last wave under LAST_WAVE_MIN full costs a whole wave's time for a few tiles, where fwd_tma's items (64-256 wide)
# spread the same work finer. H200, the sweep (1x1 rows on gemm_wgmma_p): random N9 1x1 240->64 @44 backward data,
# 137 tiles on 132 SMs (fill 0.52): 18.0 us against fwd_tma's 10.0; every row at fill 0.74 (196 tiles) ran faster on
# gemm_wgmma_p than fwd_tma had (N8 1x1 64->256 @56 forward 8.7 / 10.0 us, 256->128 backward data 10.0 / 11.1 us).
LAST_WAVE_MIN = 0.6


def _wgmma_last_wave_fill(handle, mp, m, n):
    """The last wave's fill of a matmul plan on the persistent 128 x 256 wgmma tile (or its gemm_tma form) over an
    m x n output, one block a SM; None for the other tiles."""
    expr = (mp.tma or mp.fast).expr if mp is not None and (mp.tma or mp.fast) else ""
    if "gemm_wgmma_p<" not in expr and "gemm_tma<" not in expr:
        return None
    tiles = -(-m // 128) * -(-n // 256)
    sms = max(handle.sm_count, 1)
    waves = -(-tiles // sms)
    return tiles / (waves * sms)


def _under_filled(handle, mp, pb, direction):
    """A direct 1x1 GEMM plan's matmul on the persistent wgmma tile with its last wave under LAST_WAVE_MIN full (the
    GEMM: the pixels x the output side, forward K, backward data C)."""
    d, h, w = pb.out3
    fill = _wgmma_last_wave_fill(handle, mp, pb.n * d * h * w, pb.k if direction == DIR_FWD else pb.c)
    return fill is not None and fill < LAST_WAVE_MIN


def gemm1x1_top(handle, pl):
    """plans.register_top's hook (a call's own plan): tuning.conv.TMA_1X1 moves a direct 1x1 GEMM plan whose matmul
    is gemm_tc, or the persistent wgmma tile with an under-filled last wave (_under_filled), to fwd_tma (forward:
    tma_refusal, K >= MIN_K; backward data: the direct DgradTmaPlan under dgrad_refusal, C >= MIN_K, not where
    slower_than_replaced objects), the GEMM plan its fallback (a misaligned call, maps that do not encode) and its
    estimate (Get..._v7's ranking is unchanged)."""
    mode = tuning.conv.TMA_1X1
    if not mode or not getattr(pl, "direct", False) or pl.fold is not None:
        return pl
    from . import gemm
    pb = pl.problem
    if pl.direction == DIR_FWD and type(pl) is gemm.GemmPlan:
        if (not (_mm_tc(pl.mm[0]) or _under_filled(handle, pl.mm[0], pb, DIR_FWD)) or pl.mm[1] or pb.k < MIN_K
                or tma_refusal(handle, pb) is not None):
            return pl
        return plan_tma(handle, pb, pl.algo, pl)
    if pl.direction == DIR_BWD_DATA and type(pl) is gemm.BwdGemmPlan:
        if (not (_mm_tc(pl.mm) or _under_filled(handle, pl.mm, pb, DIR_BWD_DATA)) or pl.filter_a or pb.c < MIN_K
                or dgrad_refusal(handle, pb, False) is not None):
            return pl
        tp = plan_dgrad_tma(handle, pb, pl.algo, pl, False)
        return pl if slower_than_replaced(handle, tp, pl) is not None else tp
    return pl


register_top(gemm1x1_top, scope="own")
