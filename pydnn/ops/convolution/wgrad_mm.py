"""The 1x1 backward filter as one pydnn.ops.matmul GEMM with its split-K (tuning.conv.WGRAD_MM; issue 18).

A 1x1, stride-1, unpadded, one-group backward filter of 16-bit NHWC-like x and dy is a plain GEMM over the
N * P pixels: dw[K x C] = dy^T[K x NP] . x[NP x C] (dw packed (K, C): its rows C apart). pydnn.ops.matmul plans it
with split_k (its gemm_wgmma split tile cuts the long NP reduction into slices when the 128 x 256 tiles fill
under 3/4 of a wave, their fp32 partials in this plan's workspace, splitk_reduce summing them in split order with
alpha / beta: deterministic; else its whole-K wgmma / TMA tile). Measured there (H200, session 30, a Linear
layer's dW, K = 65536: 1.555 ms whole K against 0.472 split). The sweep's 1x1 backward filters ran
wgrad_tc_wgmma (BWD_FILTER_ALGO_1) at 0.34-0.50x cuDNN where C and K are large and the pixels few (N8 1x1
1024->512 @14: 0.337x).

A hook on a call's own backward-filter plan (plans.register_top, "own"): where the switch is on and the problem
fits, the plan becomes WgradMMPlan, the replaced plan its fallback (a call whose operands matmul's vector loads
cannot take: misaligned pointers) and its estimate (so Get..._v7's ranking is unchanged).
"""
from ... import enums as E
from ... import tuning
from ...status import PydnnError
from .. import matmul
from .plans import StepPlan, register_top, round_up, run_plan
from .problem import DIR_BWD_FILTER


def _ld(s, sizes):
    """The elements between consecutive pixel rows of an NHWC-like tensor (its innermost spatial dim of size > 1;
    the image stride where every spatial size is 1)."""
    return s[4] if sizes[2] > 1 else (s[3] if sizes[1] > 1 else (s[2] if sizes[0] > 1 else s[0]))


def wgrad_mm_refusal(pb):
    """Why the 1x1 backward filter cannot run as one matmul (text), or None: 16-bit data (tensor-core math), one
    group, a 1x1 stride-1 unpadded filter, packed KRSC dw, and x / dy NHWC-like with their pixels one row apart
    (the images too: one matrix of N * P rows)."""
    from .gemm import _packed_filter
    if pb.tag not in ("f16", "bf16") or pb.math_type == E.PYDNN_FMA_MATH:
        return f"data type {pb.tag} / math type (16-bit tensor-core data)"
    if pb.groups != 1 or pb.filt3 != (1, 1, 1) or pb.stride3 != (1, 1, 1) or pb.pad3 != (0, 0, 0):
        return "not a one-group 1x1, stride-1, unpadded problem"
    if _packed_filter(pb) != 1 or pb.ws[0] != pb.c:
        return "dw is not a packed (K, C) matrix"
    for name, s, sizes, ch in (("x", pb.xs, pb.in3, pb.c), ("dy", pb.ys, pb.out3, pb.k)):
        if s[1] != 1:
            return f"{name} is not NHWC-like (channels contiguous)"
        ld = _ld(s, sizes)
        d, hh, w = sizes
        if (w > 1 and s[4] != ld) or (hh > 1 and s[3] != w * ld) or (d > 1 and s[2] != hh * w * ld):
            return f"{name}'s pixels are not one row apart"
        if pb.n > 1 and s[0] != d * hh * w * ld:
            return f"{name}'s images do not follow one another"
        if ld < ch:
            return f"{name}'s rows overlap"
    return None


class WgradMMPlan(StepPlan):
    """dw = alpha * dy^T x + beta * dw: one matmul plan (`mm`, split-K through the workspace where it splits)."""

    def launch(self, handle, a_ptr, b_ptr, out_ptr, ws_ptr, alpha, beta, z_ptr=0, bias_ptr=0):
        """a = dy, b = x, out = dw (convolution_backward_filter's order): A = dy (transposed), B = x."""
        if (a_ptr | b_ptr) & 15:   # matmul's vector loads need 16-byte aligned operands: the plan replaced
            return run_plan(handle, self.fallback, a_ptr, b_ptr, out_ptr, ws_ptr, alpha, beta)
        self.mm.launch(handle, a_ptr, b_ptr, out_ptr, alpha, beta, workspace=ws_ptr if self.mm.ws_bytes else 0,
                       workspace_size=self.workspace)

    def estimate_ms(self, handle, base_estimate):
        return base_estimate(handle, self.fallback)


def plan_wgrad_mm(handle, pb, algo, fallback):
    """WgradMMPlan of a problem wgrad_mm_refusal takes (fallback: the plan a misaligned call runs)."""
    rows = pb.n * pb.out3[0] * pb.out3[1] * pb.out3[2]
    mp = matmul.gemm_plan(handle, pb.dtype, pb.k, pb.c, rows, trans_a=True, lda=_ld(pb.ys, pb.out3),
                          ldb=_ld(pb.xs, pb.in3), ldc=pb.ws[0], split_k=True)
    pl = WgradMMPlan(DIR_BWD_FILTER, algo, pb)
    pl.mm, pl.fallback = mp, fallback
    pl.workspace = max(round_up(mp.ws_bytes), fallback.workspace)
    pl.deterministic = True
    pl.gemm = getattr(fallback, "gemm", None)
    pl.gemm_expr = (mp.tma or mp.split_fast or mp.fast).expr if mp.fast is not None else ""
    return pl


# WGRAD_MM True: where dw has at least MIN_CK elements and the reduction at least MIN_ROWS pixels (H200, session 33
# second mid-session run, tools/bench_conv_tma_routes.py --set wgrad, the sweep's 73 1x1 backward filters: the matmul /
# the v7 plan 1.209 geomean over the 17 such points (0.959-1.475, e.g. N128 1x1 512->2048 @7 0.0458 -> 0.0310 ms),
# 0.317 over the other 56: few pixels or a small dw split 16 ways over too few 128 x 256 tiles)
MIN_CK = 1 << 18
MIN_ROWS = 6272


def wgrad_mm_top(handle, pl):
    """plans.register_top's hook: tuning.conv.WGRAD_MM moves a call's own 1x1 backward-filter plan to one matmul
    (split-K) where wgrad_mm_refusal takes the problem (True: and it is large enough, MIN_CK / MIN_ROWS; "always":
    wherever it fits); on sm_90 only (matmul's split tile is wgmma's)."""
    mode = tuning.conv.WGRAD_MM
    if not mode or pl.direction != DIR_BWD_FILTER or getattr(handle, "arch", None) != "sm_90":
        return pl
    pb = pl.problem
    if wgrad_mm_refusal(pb) is not None:
        return pl
    rows = pb.n * pb.out3[0] * pb.out3[1] * pb.out3[2]
    if mode != "always" and (pb.c * pb.k < MIN_CK or rows < MIN_ROWS):
        return pl
    try:
        return plan_wgrad_mm(handle, pb, pl.algo, pl)
    except PydnnError:
        return pl


register_top(wgrad_mm_top, scope="own")
