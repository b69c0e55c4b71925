"""Grouped convolutions on the tensor cores (half / bfloat16, NHWC-like x and y; ResNeXt's grouped 3x3):

    forward          IMPLICIT_PRECOMP_GEMM  filter_group_pack + implicit_gemm_pipe_tc_grouped (C/g packed
                                            to 64-channel multiples) or fwd_tc_grouped
    backward data    ALGO_1                 filter_group_pack + implicit_gemm_pipe_tc_grouped (stride 1) or
                                            bwd_data_tc_grouped
    backward filter  ALGO_1                 wgrad_pipe_tc_grouped into fp32 partials + fold_group_diag
                                            (split order fixed: deterministic); where its rule refuses
                                            (dy not packed NHWC) the CUDA-core split serves, as before

Packing. Groups are narrow (ResNeXt-50 32x4d: C/g = K/g = 4, 8, 16, 32), the kernels' channel tiles 64
wide. P consecutive groups (the most, dividing the group count, with P * K/g <= 64) form a supergroup of
P * C/g input and P * K/g output channels whose filter is block-diagonal: filter_group_pack writes it dense
(zeros off the diagonal) into the workspace, and the dense kernels run one supergroup per grid.z with the
operands' bases moved to its channels (group_view in ptx/convolution.cu). Counting, for K/g = C/g = 16:
a 16-wide N tile would keep the MMAs 1/4 busy in the 64-wide tiles the kernels have (and BK = 64 deep K
tiles over 16 channels of a tap, 1/4 filled too: 1/16 useful), where packing 4 groups fills both the N
tile and the K tile with 4x the flops (1/4 useful): packing does 4x fewer tensor-core instructions than
the per-group tile, and keeps the pipelined 64-deep kernels. The backward filter computes each
supergroup's dense dw (K/g x C/g x taps x P^2 of it) and fold_group_diag keeps the P diagonal blocks.

Predicted time (a comment for the lead to check against tools/sweep_conv.py): ResNeXt-50 N32 3x3 g32
512->512 @14, bf16, H100 / H200 (132 SMs): P = 4, 8 supergroups of 64 -> 64, M = N * 14 * 14 = 6272,
real flops 2 * 6272 * 512 * 16 * 9 = 0.925 GF, packed 4x = 3.70 GF.
  forward: implicit_gemm_pipe_tc_grouped 128x64, 49 x 1 x 8 = 392 blocks = 3 a SM (one wave, 12 warps an
    SM), 9 K tiles each. At the 190-250 TF/s the pipelined kernel reaches on the dense ResNet 3x3 layers
    with the same tile: 15-20 us; x and y (6.4 MB each) move under it; + filter_group_pack (0.6 MB, one
    launch) ~3-4 us -> predicted 0.020-0.025 ms (cuDNN 0.076, pydnn before 0.529).
  backward data: the same GEMM on dy (stride 1: the pipelined kernel) -> 0.020-0.025 ms (cuDNN 0.040,
    before 0.163). With stride 2 the bwd_data_tc gather meets zeros in 3/4 of its MMAs: ~4x that.
  backward filter: wgrad_pipe_tc_grouped 64x128, 5 N tiles x 8 supergroups x 9 splits = 360 blocks, 11
    K tiles each: 3.70 GF (+11% of empty N tile) at 150-200 TF/s = 20-25 us, + the partials (9 x 8 x 64 x
    576 x 4 B = 10.6 MB written, read back by fold_group_diag) ~7 us -> predicted 0.030-0.035 ms (cuDNN
    0.025, before 1.111): ~0.75x, the direction most likely to need a leaner fold (fewer splits, or the
    diagonal blocks only written by the kernel's epilogue).
"""
import types

from ... import enums as E
from ..._build.params import FLAG_BETA
from ..._cuda import driver
from ...status import PydnnError
from ...tensor import DTYPES
from .._elementwise import CTYPE
from ..common import cdiv, prod
from .plans import LAUNCH_MS, StepPlan, Plan, add_kernels, base_params, digit_step, register, round_up, run_plan
from .problem import (DIR_BWD_DATA, DIR_BWD_FILTER, DIR_FWD, FLAG_CIN, FLAG_PARTIAL, FLAG_FLIP, INT_MAX, NS,
                      TC_TAGS, TCP_BK, ConvAuxParams, wgp_refusal)
from . import tensor_core as TC

MAX_PACK = 16     # at most 16 groups a supergroup (16x the useful flops: C/g = K/g = 4); depthwise stays off
GRID_Z = 65535
# the forward / backward-data tiles (TCP_TILES and TC_TILES entries) and backward-filter tiles instantiated
G_TCP = (TC.TCP_TILES[0],)                 # (128, 64, 4, 1, 3, 0)
G_TC = ((128, 64), (64, 64))
G_WGP = (TC.WGP_TILES[1], TC.WGP_TILES[2])  # (64, 128, 2, 2, 3), (128, 64, 4, 1, 3)
G_TENSOR_TFLOPS = 150.0    # the Get..._v7 model's tensor-core rate (algorithms.TENSOR_CORE_TFLOPS)


def _tc_tiling(handle, gm, gn):
    """A G_TC tile for fwd_tc_grouped / bwd_data_tc_grouped (tensor_core._tc_tiling's model over the
    instantiated tiles; handle.sm_count: the SMs a supergroup's blocks have)."""
    best = None
    for cfg in G_TC:
        t = cdiv(cdiv(gm, cfg[0]) * cdiv(gn, cfg[1]), handle.sm_count) * cfg[0] * cfg[1] / TC.TC_TILE_SPEED[cfg]
        if best is None or t < best[0] * 0.999:
            best = (t, cfg)
    return best[1]


def _wgrad_pipe_tiling(handle, gm, gn, gk, g2=1):
    """(a G_WGP entry, splits): tensor_core._wgrad_pipe_tiling's model over the instantiated tiles, for one
    of g2 supergroups on handle.sm_count SMs (its share); the partials' traffic is the whole GPU's, g2 times
    one supergroup's, through the same share of bandwidth."""
    sms = max(handle.sm_count, 1)
    ktiles = cdiv(gk, TCP_BK)
    best = None
    for cfg in G_WGP:
        bm, bn, wm, wn = cfg[:4]
        if bm == 128 and gm <= 64:
            continue
        tiles = cdiv(gm, bm) * cdiv(gn, bn)
        tile_s = 2.0 * bm * bn * TCP_BK / TC.WGP_SM_FLOPS / TC.WGP_TILE_SPEED[(bm, bn)]
        for splits in range(1, min(TC.MAX_WG_SPLITS, ktiles, 65535) + 1):
            per = cdiv(ktiles, splits)
            if cdiv(ktiles, per) != splits:
                continue
            per_sm = cdiv(tiles * splits, sms)
            t = per_sm * (per + 2) * tile_s / TC._warp_speed(min(per_sm, TC.WGP_PER_SM[cfg]) * wm * wn)
            t += 2.0 * splits * gm * gn * 4 * g2 / 4e12   # the partials (always written: the diagonal fold)
            if best is None or t < best[0] * 0.999:
                best = (t, cfg, splits)
    return best[1], best[2]


def unit(tag):
    return f"convolution.grouped.{tag}"


def expr(tag, direction, cfg):
    t = CTYPE[tag]
    cfg = tuple(cfg)
    if direction == DIR_BWD_FILTER:
        return f"pydnn::conv::wgrad_pipe_tc_grouped<{t}, {', '.join(map(str, cfg))}>"
    if len(cfg) == 6:
        return (f"pydnn::conv::implicit_gemm_pipe_tc_grouped<{direction}, {t}, {', '.join(map(str, cfg[:5]))}, "
                f"{'true' if cfg[5] else 'false'}>")
    name = "fwd_tc_grouped" if direction == DIR_FWD else "bwd_data_tc_grouped"
    return f"pydnn::conv::{name}<{t}, {cfg[0]}, {cfg[1]}>"


def pack_expr(tag):
    return f"pydnn::conv::filter_group_pack<{CTYPE[tag]}>"


def fold_diag_expr(tag):
    return f"pydnn::conv::fold_group_diag<{CTYPE[tag]}>"


def exprs(tag):
    return ([expr(tag, d, c) for d in (DIR_FWD, DIR_BWD_DATA) for c in G_TCP + G_TC]
            + [expr(tag, DIR_BWD_FILTER, c) for c in G_WGP]
            + [pack_expr(tag), fold_diag_expr(tag)])


for _t in TC_TAGS:
    add_kernels(unit(_t), "convolution.cu", exprs(_t))


def packing(pb):
    """P, the groups a supergroup holds: the most that divides the group count with P * K/g <= 64 (1 where
    K/g > 64), P <= MAX_PACK; None where P * C/g or P * K/g is not a multiple of 8 (16-byte chunks)."""
    best = None
    for p in range(1, min(MAX_PACK, pb.groups) + 1):
        if pb.groups % p or (p > 1 and p * pb.kg > 64):
            continue
        if (p * pb.cg) % 8 == 0 and (p * pb.kg) % 8 == 0:
            best = p
    return best


def applies(pb, direction):
    """Whether the grouped tensor-core path serves pb (else the planner passes, so the other candidates'
    reasons stay the NOT_SUPPORTED message)."""
    if pb.groups == 1 or pb.tag not in TC_TAGS or pb.math_type == E.PYDNN_FMA_MATH:
        return False
    if pb.cg < 4 or pb.kg < 4:
        return False   # depthwise and near-depthwise: 16x+ waste
    if packing(pb) is None:
        return False
    for st in (pb.xs, pb.ys):   # x and y (dx, dy) read / written in 16-byte chunks of channels
        if st[1] != 1 or any(s % 8 for i, s in enumerate(st) if i != 1):
            return False
    if direction == DIR_BWD_FILTER and wgp_refusal(super_problem(pb, packing(pb), direction)) is not None:
        return False   # wgrad_pipe_tc_grouped's rules (dy packed NHWC, 32-bit offsets)
    return True


def super_problem(pb, P, direction):
    """The dense problem of one supergroup (groups / P of them): cg, kg = P * C/g, P * K/g; forward and
    backward data read the packed filter [K][taps][P * C/g] (NHWC strides)."""
    s = pb.copy()
    s.groups, s.cg, s.kg = pb.groups // P, P * pb.cg, P * pb.kg
    t, r, q = pb.filt3
    if direction != DIR_BWD_FILTER:
        s.ws = (t * r * q * s.cg, 1, r * q * s.cg, q * s.cg, s.cg)
        s.w_format = E.PYDNN_TENSOR_NHWC
    return s


class GroupedPlan(StepPlan):
    """A grouped convolution on the tensor cores (see the module docstring): [pack] + the kernel [+ fold]."""

    def __init__(self, handle, pb, direction, algo, P):
        super().__init__(direction, algo, pb)
        self.P = P
        spb = self.spb = super_problem(pb, P, direction)
        g2, taps = spb.groups, prod(pb.filt3)
        self.unit = unit(pb.tag)
        self.itemsize = DTYPES[pb.dtype][0]
        self.align = 16
        if direction == DIR_BWD_FILTER:
            self._plan_wgrad(handle, spb, g2, taps)
        else:
            self._plan_dgrad_or_fwd(handle, spb, g2, taps, direction)

    # forward / backward data: the packed filter, then the kernel
    def _plan_dgrad_or_fwd(self, handle, spb, g2, taps, direction):
        pb = self.problem
        if direction == DIR_FWD:
            gm, gn, gk, rc = pb.n * prod(pb.out3), spb.kg, spb.cg * taps, spb.cg
        else:
            gm, gn, gk, rc = pb.n * prod(pb.in3), spb.cg, spb.kg * taps, spb.kg
        if max(gm, gn, gk) > INT_MAX or g2 > GRID_Z:
            raise PydnnError(NS, "the implicit GEMM exceeds 2^31 - 1 rows (split the batch)")
        pipe_ok = TC._tcp_refusal(spb, direction) is None and rc % TCP_BK == 0
        proxy = types.SimpleNamespace(sm_count=max(1, handle.sm_count // g2))
        cfg = G_TCP[0] if pipe_ok else _tc_tiling(proxy, gm, gn)
        p = base_params(spb, direction)
        p.gm, p.gn, p.gk = gm, gn, gk
        p.flags |= FLAG_CIN
        red = list(pb.filt3) + [rc]
        for i in range(4):
            p.red_size[i] = red[i]
        for i, v in enumerate(digit_step(TC.TC_BK, red)):
            p.red_step[i] = v
        p.splits, p.k_per_split = 1, gk
        sub = Plan()
        sub.direction, sub.algo, sub.unit = direction, self.algo, self.unit
        sub.itemsize, sub.acc_size, sub.deterministic, sub.splits = self.itemsize, 4, True, 1
        sub.gemm, sub.gemm_grid = p, (cdiv(gm, cfg[0]), cdiv(gn, cfg[1]), g2)
        if sub.gemm_grid[1] > 65535:
            raise PydnnError(NS, f"{gn} output channels exceed the tensor-core kernel's grid")
        sub.gemm_expr = expr(pb.tag, direction, cfg)
        sub.gemm_argv, sub.gemm_func = driver.kernel_args(p), None
        sub.fold = sub.fold_func = sub.fold_argv = None
        sub.workspace, sub.align = 0, 16
        if len(cfg) == 6:
            sub.threads = cfg[2] * cfg[3] * 32
            sub.smem = TC.TCP_STAGES * (cfg[0] + cfg[1]) * TCP_BK * 2
        else:
            sub.threads = TC.THREADS
            b_stage = cfg[1] * TC.TC_LD if direction == DIR_FWD else TC.TC_BK * (cfg[1] + 8)
            sub.smem = TC.TC_STAGES * (cfg[0] * TC.TC_LD + b_stage) * 2
        out_strides = pb.ys if direction == DIR_FWD else pb.xs
        sub.pair_ok = out_strides[1] == 1 and all(st % 2 == 0 for i, st in enumerate(out_strides) if i != 1)
        sub.problem = spb
        self.sub, self.cfg = sub, cfg
        self.gemm, self.gemm_expr = p, sub.gemm_expr
        self.filter_bytes = pb.k * taps * spb.cg * self.itemsize
        self.workspace = round_up(self.filter_bytes)
        f = ConvAuxParams()
        f.groups, f.kg, f.cg, f.taps, f.channels = pb.groups, pb.kg, pb.cg, taps, self.P
        for i in range(3):
            f.filt[i] = pb.filt3[i]
        for i in range(5):
            f.in_stride[i] = pb.ws[i]
        self.pack = f
        self.pack_grid = (cdiv(pb.k * taps * spb.cg, 256), 1, 1)
        self.pack_step = self.add_step(self.unit, pack_expr(pb.tag), self.pack_grid, (256, 1, 1), f)

    # backward filter: the dense supergroup dw as partials, then the diagonal fold
    def _plan_wgrad(self, handle, spb, g2, taps):
        pb = self.problem
        gm, gn, gk = spb.kg, spb.cg * taps, pb.n * prod(pb.out3)
        if max(gm, gn, gk) > INT_MAX:
            raise PydnnError(NS, "the implicit GEMM exceeds 2^31 - 1 rows (split the batch)")
        proxy = types.SimpleNamespace(sm_count=max(1, handle.sm_count // g2))
        cfg, splits = _wgrad_pipe_tiling(proxy, gm, gn, gk, g2)
        bk, bm, bn = TCP_BK, cfg[0], cfg[1]
        splits = min(splits, max(1, GRID_Z // g2))
        kps = cdiv(cdiv(gk, splits), bk) * bk
        splits = cdiv(gk, kps)
        p = base_params(spb, DIR_BWD_FILTER)
        p.gm, p.gn, p.gk = gm, gn, gk
        red = [pb.n] + list(pb.out3)
        for i in range(4):
            p.red_size[i] = red[i]
        for i, v in enumerate(digit_step(bk, red)):
            p.red_step[i] = v
        p.splits, p.k_per_split = splits, kps
        p.flags |= FLAG_PARTIAL
        sub = Plan()
        sub.direction, sub.algo, sub.unit = DIR_BWD_FILTER, self.algo, self.unit
        sub.itemsize, sub.acc_size, sub.deterministic, sub.splits = self.itemsize, 4, True, splits
        sub.gemm, sub.gemm_grid = p, (cdiv(gm, bm), cdiv(gn, bn), splits * g2)
        if sub.gemm_grid[1] > 65535 or sub.gemm_grid[2] > GRID_Z:
            raise PydnnError(NS, f"{gn} filter columns (taps x C) exceed the tensor-core kernel's grid")
        sub.gemm_expr = expr(pb.tag, DIR_BWD_FILTER, cfg)
        sub.gemm_argv, sub.gemm_func = driver.kernel_args(p), None
        sub.fold = sub.fold_func = sub.fold_argv = None
        sub.workspace, sub.align, sub.pair_ok = 0, 16, False
        sub.threads = cfg[2] * cfg[3] * 32
        sub.smem = TC.TCP_STAGES * (bm + bn) * TCP_BK * 2
        sub.problem = spb
        self.sub, self.cfg, self.splits = sub, cfg, splits
        self.gemm, self.gemm_expr = p, sub.gemm_expr
        self.partial_bytes = splits * g2 * gm * gn * 4
        self.workspace = round_up(self.partial_bytes)
        self.acc_size = 16
        f = ConvAuxParams()
        f.groups, f.kg, f.cg, f.taps, f.splits, f.channels = pb.groups, pb.kg, pb.cg, taps, splits, self.P
        for i in range(3):
            f.filt[i] = pb.filt3[i]
        for i in range(5):
            f.out_stride[i] = pb.ws[i]
        f.flags = FLAG_FLIP if pb.flip else 0
        self.fold_params = f
        self.fold_step = self.add_step(self.unit, fold_diag_expr(pb.tag),
                                       (cdiv(pb.k * pb.cg * taps, 256), 1, 1), (256, 1, 1), f)

    def launch(self, handle, a_ptr, b_ptr, out_ptr, ws_ptr, alpha, beta, z_ptr=0, bias_ptr=0):
        """forward: a = x, b = w, out = y; backward data: a = dy, b = w, out = dx; backward filter: a = dy,
        b = x, out = dw (run_plan's orders)."""
        if self.direction == DIR_BWD_FILTER:
            run_plan(handle, self.sub, a_ptr, b_ptr, ws_ptr, 0, 1.0, 0.0)
            f = self.fold_params
            f.out, f.in_, f.alpha, f.beta = out_ptr, ws_ptr, alpha, beta
            f.flags = (f.flags & ~FLAG_BETA) | (FLAG_BETA if beta != 0 else 0)
            self.run_step(handle, self.fold_step)
            return
        f = self.pack
        f.in_, f.out = b_ptr, ws_ptr
        self.run_step(handle, self.pack_step)
        run_plan(handle, self.sub, a_ptr, ws_ptr, out_ptr, 0, alpha, beta, z_ptr, bias_ptr)

    def estimate_ms(self, handle, base_estimate):
        """The packed flops (P x the real ones) at the tensor-core rate over the filled part of the waves
        (backward data's gather meets zeros in all but 1 / stride^d), plus the pack or the partials' fold."""
        g = self.sub.gemm_grid
        blocks = g[0] * g[1] * g[2]
        per_wave = 2 * max(handle.sm_count, 1)
        fill = blocks / (cdiv(blocks, per_wave) * per_wave)
        rate = G_TENSOR_TFLOPS
        if self.direction == DIR_BWD_DATA and len(self.cfg) == 2:
            rate /= prod(self.problem.stride3)
        t = self.problem.flops * self.P / (rate * 1e9) / max(fill, 1e-3)
        if self.direction == DIR_BWD_FILTER:
            t += 2 * self.partial_bytes / 3e9 + LAUNCH_MS
        else:
            t += 2 * self.filter_bytes / 2e9 + LAUNCH_MS
        return t


def _planner(direction):
    def plan(handle, pb, d, algo):
        if not applies(pb, direction):
            return None   # pass: the next candidate (or its refusal's reason) answers
        return GroupedPlan(handle, pb, direction, algo, packing(pb))
    return plan


register(DIR_FWD, E.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, order=-1)(_planner(DIR_FWD))
register(DIR_BWD_DATA, E.PYDNN_CONVOLUTION_BWD_DATA_ALGO_1, order=-1)(_planner(DIR_BWD_DATA))
register(DIR_BWD_FILTER, E.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_1, order=-1)(_planner(DIR_BWD_FILTER))
