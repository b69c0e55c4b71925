"""The tensor-core implicit GEMMs of ptx/convolution.cu, for half and bfloat16 NHWC data (C % 8 == 0, one
group; the operand rules are problem.tc_refusal; grouped problems run the *_grouped wrappers of these
kernels through grouped.py):

    forward          IMPLICIT_PRECOMP_GEMM  on sm_90 fwd_wgmma (Hopper wgmma) where channels % 64 == 0 (or
                                            their tail fills tuning.conv.FWD_TAIL_FILL of its 64-deep K tile,
                                            the rest zero-filled) and a block has >= WGM_MIN_KTILES K tiles,
                                            else implicit_gemm_pipe_tc (mma.sync m16n8k16, ldmatrix, cp.async,
                                            a 3-stage pipeline) under the same channel rule, else fwd_tc;
                                            tiles from the models below
    backward data    ALGO_1                 the same kernels on dy (K % 8 too); on sm_90 with stride 1 the
                                            forward of dy on fwd_wgmma reading the filter as [k][c] tiles
                                            (_plan_bwd_wgmma; conv_tma.py moves it to fwd_tma where
                                            tuning.conv.DGRAD_TMA says so); with a stride > 1 these stride-1
                                            plans run on the stride's phases (dgrad_phases.py; DGRAD_PHASES
                                            off: bwd_data_tc's stride-s gather); elsewhere the explicit GEMM
                                            (gemm.py) serves
    backward filter  ALGO_1                 wgrad_pipe_tc or wgrad_tc, (tile, split) by a model, split-K
                                            partials added by conv::fold in a fixed order (one split writes
                                            dw directly); on sm_90 wgrad_wgmma.py is tried first

All deterministic; no workspace except split-K partials and the filter swap. The fused bias + activation
(and beta, z) of ConvolutionBiasActivationForward run in the forward kernels' epilogue: bias + IDENTITY /
RELU / CLIPPED_RELU in registers, the rest staged through shared memory. The tiling models are rankings
fit to tools/bench_convolution.py's forced tilings, not promises; Find measures.
"""
from ... import enums as E
from ... import tuning
from ..._cuda import driver
from ...status import PydnnError
from ...tensor import DTYPES
from .._elementwise import CTYPE
from ..common import cdiv, prod
from .plans import (Plan, StepPlan, add_kernels, base_params, digit_step, fold_expr, kernel_units, register,
                    register_top, round_up, run_plan)
from .problem import (DIR_BWD_DATA, DIR_BWD_FILTER, DIR_FWD, FLAG_CIN, FLAG_FLIP, FLAG_PARTIAL, FLAG_STAGED,
                      INT_MAX, NS, TC_TAGS, TCP_BK, ConvAuxParams, ConvParams, tc_refusal, wgp_refusal)

THREADS = 256   # kThreads of fwd_tc / bwd_data_tc / wgrad_tc
TC_BK, TC_LD, TC_STAGES = 32, 40, 4   # kTcBK, kTcLd, TcShape::STAGES
TC_TILES = ((128, 128), (128, 64), (64, 128), (64, 64))   # fwd_tc / bwd_data_tc<T, BM, BN> instantiations
WG_BMS, WG_BN, WG_STAGES = (128, 64), 128, 4   # wgrad_tc<T, BM> instantiations; kWgBN, WgShape::STAGES
# implicit_gemm_pipe_tc<DIR, T, BM, BN, WARPS_M, WARPS_N, MINB, DB> instantiations (forward and stride-1
# backward data on the pipelined main loop, ptx/common/mma_pipe.cuh): BM x BN tiles of WARPS_M x WARPS_N
# warps, MINB blocks per SM for the register cap, DB 1: fragments double-buffered; TCP_BK-deep K tiles,
# TCP_STAGES stages
TCP_TILES = ((128, 64, 4, 1, 3, 0), (128, 128, 4, 2, 2, 0))
TCP_STAGES = 3   # mma::kPipeStages (the K tile, TCP_BK, is in problem.py)
# wgrad_pipe_tc<T, BM, BN, WARPS_M, WARPS_N, MINB> instantiations (backward filter on the pipelined loop)
WGP_TILES = ((128, 128, 4, 2, 2), (64, 128, 2, 2, 3), (128, 64, 4, 1, 3))
# fwd_wgmma<T, BN, STAGES, MINB, LEAN, BKN, FB> instantiations (the forward on Hopper's wgmma; units
# convolution.wgmma.<tag>, compiled for sm_90a only): (BM = 128, BN, STAGES, MINB) tiles, two warpgroups
# (256 threads), the pipelined forward's gather into 1 KiB-aligned 128B-swizzled stages. Backward data runs
# as the forward of dy, its B read from the filter as [k][c] (or after filter_kc_swap: _plan_bwd_wgmma). A
# forced tiling (tuning.conv.TC_FORCE) may name one; it runs where implicit_gemm_pipe_tc applies on a
# device of arch WGM_ARCH. tuning.conv.USE_WGM: the model picks it instead of implicit_gemm_pipe_tc (sm_90,
# channels % 64 == 0, at least WGM_MIN_KTILES K tiles a block): measured faster on the ResNet 3x3 layers'
# 9-72 K tiles (1.17-1.42x) and the 1x1-over-256-channel layers' 4 K tiles (1.11-1.17x), slower (~0.8x)
# with 1 K tile (1x1 over 64 channels). WGM_TILE_SPEED: a tile's speed per flop at equal work on the busiest
# SM (the 128-wide tile ~10% faster where both tiles load the SMs alike), see _wgm_tiling. Entries (BM, BN,
# STAGES, MINB, LEAN): LEAN = 1 is the lean copy loop (the per-K-tile tap offsets computed once, no branch
# per chunk, the k16 descriptors by increments: 1.07-1.42x the plain loop on the bf16 3x3 layers, H200).
# WGM_VARIANTS keeps the plain loop (LEAN = 0) as forced tilings only, so the benchmark times both in one
# run. History of these loops: tools/notes/convolution_ptx.md.
WGM_TILES = ((128, 64, 4, 2, 1), (128, 128, 4, 1, 1))
WGM_VARIANTS = ((128, 64, 4, 2), (128, 128, 4, 1))
WGM_ARCH = "sm_90"
WGM_MIN_KTILES = 4
WGM_TILE_SPEED = {(128, 64, 4, 2, 1): 1.0, (128, 128, 4, 1, 1): 1.1}


# ----------------------------------------------------------------------------- kernel instantiations
# Each plan names its kernel by the instantiation's expression string (the unit's lowered-name key).

def _tc_expr(tag, direction, config):
    """The tensor-core kernel of a direction and tiling: (BM, BN) (fwd_tc / bwd_data_tc), a TCP_TILES entry
    (implicit_gemm_pipe_tc), or for the backward filter (BM,) (wgrad_tc) or a WGP_TILES entry
    (wgrad_pipe_tc)."""
    t = CTYPE[tag]
    cfg = tuple(config)
    if direction == DIR_BWD_FILTER:
        if len(cfg) == 5:
            assert cfg in WGP_TILES, cfg
            return f"pydnn::conv::wgrad_pipe_tc<{t}, {', '.join(map(str, cfg))}>"
        assert cfg[0] in WG_BMS, cfg
        return f"pydnn::conv::wgrad_tc<{t}, {cfg[0]}>"
    if len(cfg) == 6:
        assert cfg in TCP_TILES, cfg
        return (f"pydnn::conv::implicit_gemm_pipe_tc<{direction}, {t}, {', '.join(map(str, cfg[:5]))}, "
                f"{'true' if cfg[5] else 'false'}>")
    assert cfg in TC_TILES, cfg
    return f"pydnn::conv::{'fwd_tc' if direction == DIR_FWD else 'bwd_data_tc'}<{t}, {cfg[0]}, {cfg[1]}>"


def _tc_exprs(tag):
    """Every mma.sync instantiation of a 16-bit type (added to the family's convolution.<tag> unit)."""
    return ([_tc_expr(tag, d, cfg) for d in (DIR_FWD, DIR_BWD_DATA) for cfg in TC_TILES]
            + [_tc_expr(tag, DIR_BWD_FILTER, (bm,)) for bm in WG_BMS]
            + [_tc_expr(tag, d, cfg) for d in (DIR_FWD, DIR_BWD_DATA) for cfg in TCP_TILES]
            + [_tc_expr(tag, DIR_BWD_FILTER, cfg) for cfg in WGP_TILES])


def _wgm_expr(tag, cfg, bkn=False, fb=False):
    """The fwd_wgmma instantiation of a WGM_TILES / WGM_VARIANTS entry (a fifth entry: LEAN, 1 the lean
    copies; without it, or 0, the plain loop). bkn: B read as [k][n] (MN-major; backward data straight from the KRSC filter).
    fb: the fused bias loaded into registers before the K walk (FB = 1; the fused forward on WGM_TILES)."""
    lean = cfg[4] if len(cfg) == 5 else 0
    tail = f", {lean}, 0, 1" if fb else f", {lean}, 1" if bkn else (f", {lean}" if lean else "")
    return f"pydnn::conv::fwd_wgmma<{CTYPE[tag]}, {cfg[1]}, {cfg[2]}, {cfg[3]}{tail}>"


def fused_bias_in_registers(pl):
    """convolution_bias_activation_forward's plan on the 128x64 model fwd_wgmma tile runs its FB = 1
    instantiation (the bias in registers, BREG): the plan is the fused call's own (cached under its own
    key; get_plan's adapt, once per plan), so the plain forward keeps FB = 0, whose K loop the registers
    would change (ptx/convolution.cu). The GEMM algorithm's direct 1x1 plan (matmul for the plain call,
    gemm.py) runs its fused call on the implicit GEMM of the problem itself (`sub`): that plan is adapted."""
    if getattr(pl, "direct", False) and getattr(pl, "sub", None) is not None:
        pl = pl.sub.plan
    if type(pl) is Plan and pl.direction == DIR_FWD and pl.gemm_expr in _FB_EXPRS:
        pl.gemm_expr, pl.gemm_func = _FB_EXPRS[pl.gemm_expr], None


def _is_wgm(cfg):
    """Whether a tiling names a fwd_wgmma instantiation (a WGM_TILES or WGM_VARIANTS entry)."""
    return cfg is not None and tuple(cfg) in WGM_TILES + WGM_VARIANTS


def _swap_expr(tag):
    """filter_kc_swap: the filter with K and C swapped (backward data on fwd_wgmma), in the wgmma unit."""
    return f"pydnn::conv::filter_kc_swap<{CTYPE[tag]}>"


def _split_fold_expr(tag):
    """fwd_split_fold: a split fwd_wgmma's partials summed in split order through the forward's epilogue."""
    return f"pydnn::conv::fwd_split_fold<{CTYPE[tag]}>"


def wgm_exprs(tag):
    """The fwd_wgmma unit of a 16-bit type: every WGM_TILES and WGM_VARIANTS entry, the same with B read as
    [k][n] (backward data from the filter itself), filter_kc_swap, then the FB = 1 instantiations."""
    return (tuple(_wgm_expr(tag, c, bkn) for bkn in (False, True) for c in WGM_TILES + WGM_VARIANTS)
            + (_swap_expr(tag),) + tuple(_wgm_expr(tag, c, fb=True) for c in WGM_TILES if c[1] == 64))


def _wgm_split_expr(expr):
    """The SPLIT = 1 twin of a fwd_wgmma expression (LEAN, BKN, FB written out, then SPLIT)."""
    head, args = expr.split("<", 1)
    a = [x.strip() for x in args.rstrip(">").split(",")]
    a += ["0"] * (7 - len(a))
    return f"{head}<{', '.join(a)}, 1>"


def split_exprs(tag):
    """The split unit (convolution.wgmma.split.<tag>): the SPLIT twins of the model's tiles (B K-major, and read
    as [k][n] for backward data), then fwd_split_fold."""
    return (tuple(_wgm_split_expr(_wgm_expr(tag, c, bkn)) for bkn in (False, True) for c in WGM_TILES)
            + (_split_fold_expr(tag),))


def wgm_units():
    """The fwd_wgmma KernelUnits (sm_90a only)."""
    return [u for u in kernel_units("convolution.wgmma.") if not u.name.startswith("convolution.wgmma.split.")]


def split_units():
    """The split-K twins' KernelUnits (convolution.wgmma.split.<tag>, sm_90a only)."""
    return kernel_units("convolution.wgmma.split.")


for _t in TC_TAGS:
    add_kernels(f"convolution.{_t}", "convolution.cu", _tc_exprs(_t))
for _t in TC_TAGS:   # built and loadable for sm_90 only, as sm_90a (wgmma)
    add_kernels(f"convolution.wgmma.{_t}", "convolution.cu", wgm_exprs(_t), archs=(WGM_ARCH + "a",))
    add_kernels(f"convolution.wgmma.split.{_t}", "convolution.cu", split_exprs(_t), archs=(WGM_ARCH + "a",))


# the 128x64 model tile's FB = 1 (the 128x128 tile's code has the bias in registers whatever FB says)
_FB_EXPRS = {_wgm_expr(t, c): _wgm_expr(t, c, fb=True) for t in TC_TAGS for c in WGM_TILES if c[1] == 64}
# the model tiles' SPLIT twins (split_wgmma: a fused call on a split plan adds its bias in fwd_split_fold, so
# the FB = 1 form has no twin)
_SPLIT_EXPRS = {_wgm_expr(t, c, bkn): _wgm_split_expr(_wgm_expr(t, c, bkn))
                for t in TC_TAGS for c in WGM_TILES for bkn in (False, True)}


MAX_WG_SPLITS = 1024
WG_SM_FLOPS = 3.5e12   # the split model's tensor-core rate of one SM in wgrad_tc (a ranking, not a promise)


def _wgrad_tiling(handle, gm, gn, gk):
    """(BM, splits) for wgrad_tc: the least modelled time = rounds of blocks per SM x k tiles per block
    (+3 for the pipeline's fill and the epilogue) x time per tile, plus the fold's traffic (the partials
    written and read back, mostly from L2) when the reduction is split. A round with at most one block
    per SM counts 1.4: 8 warps alone do not keep an SM's tensor cores busy."""
    sms = max(handle.sm_count, 1)
    ksteps = cdiv(gk, TC_BK)
    best = None
    for bm in WG_BMS:
        if bm == 128 and gm <= 64:
            continue  # a half-empty tile
        tiles = cdiv(gm, bm) * cdiv(gn, WG_BN)
        tile_s = 2.0 * bm * WG_BN * TC_BK / WG_SM_FLOPS * (1.0 if bm == 128 else 1.15)
        for splits in range(1, min(MAX_WG_SPLITS, ksteps, 65535) + 1):
            per = cdiv(ksteps, splits)
            if cdiv(ksteps, per) != splits:
                continue  # the same slices as fewer splits
            blocks = tiles * splits
            rounds = cdiv(blocks, sms) if blocks > sms else 1.4
            t = rounds * (per + 3) * tile_s
            if splits > 1:
                t += 2.0 * splits * gm * gn * 4 / 4e12 + gm * gn * 2 / 3e12
            if best is None or t < best[0]:
                best = (t, bm, splits)
    return best[1], best[2]


# wgrad_pipe_tc's split model: an SM's rate at warp speed 1.0 (_warp_speed), and the blocks of each
# tiling an SM holds (3 stages of (BM + BN) x 64 x 2 bytes, the MINB register cap). A ranking model.
WGP_SM_FLOPS = 2.0e12
# a tiling's speed per flop at the same resident warps, fit to the forced tilings of tools/bench_convolution.py
# (H200: 128x64 beats 64x128 by 7-10% at 12 warps, and 128x128 at 16 warps runs below both, where the
# forward's warp-speed curve alone would put it 18% above)
WGP_TILE_SPEED = {(128, 128): 0.8, (64, 128): 1.0, (128, 64): 1.08}
WGP_PER_SM = {cfg: min(cfg[4], (227 * 1024) // (TCP_STAGES * (cfg[0] + cfg[1]) * TCP_BK * 2)) for cfg in WGP_TILES}


def _wgrad_pipe_tiling(handle, gm, gn, gk):
    """(a WGP_TILES entry, splits) for wgrad_pipe_tc: the least modelled time = the blocks the busiest SM
    runs x (K tiles per block + 2 for the pipeline's fill and the epilogue) x a tile's flops / the SM's
    rate with the warps it holds, plus the fold's traffic when the reduction is split."""
    sms = max(handle.sm_count, 1)
    ktiles = cdiv(gk, TCP_BK)
    best = None
    for cfg in WGP_TILES:
        bm, bn, wm, wn = cfg[:4]
        if bm == 128 and gm <= 64:
            continue  # a half-empty tile
        tiles = cdiv(gm, bm) * cdiv(gn, bn)
        tile_s = 2.0 * bm * bn * TCP_BK / WGP_SM_FLOPS / WGP_TILE_SPEED[(bm, bn)]
        for splits in range(1, min(MAX_WG_SPLITS, ktiles, 65535) + 1):
            per = cdiv(ktiles, splits)
            if cdiv(ktiles, per) != splits:
                continue  # the same slices as fewer splits
            per_sm = cdiv(tiles * splits, sms)
            t = per_sm * (per + 2) * tile_s / _warp_speed(min(per_sm, WGP_PER_SM[cfg]) * wm * wn)
            if splits > 1:
                t += 2.0 * splits * gm * gn * 4 / 4e12 + gm * gn * 2 / 3e12
            if best is None or t < best[0] * 0.999:
                best = (t, cfg, splits)
    return best[1], best[2]


def _wgrad_choice(handle, pb, gm, gn, gk):
    """(config, splits): config (BM,) for wgrad_tc or a WGP_TILES entry for wgrad_pipe_tc. A forced
    tiling (tuning.conv.TC_FORCE) is obeyed where its kernel applies."""
    pipe_ok = wgp_refusal(pb) is None
    forced = tuning.conv.TC_FORCE.get(DIR_BWD_FILTER)
    if forced is not None:
        cfg, splits = forced
        if type(cfg) is int:
            return (cfg,), splits
        if pipe_ok:
            return tuple(cfg), splits
    if tuning.conv.WG_PIPE and pipe_ok:
        return _wgrad_pipe_tiling(handle, gm, gn, gk)
    bm, splits = _wgrad_tiling(handle, gm, gn, gk)
    return (bm,), splits


def plan_wgrad_tc(handle, pb, algo):
    """Backward filter ALGO_1 on the mma.sync tensor cores (wgrad_pipe_tc or wgrad_tc in
    ptx/convolution.cu; on sm_90 the wgmma kernel, wgrad_wgmma.py, is tried first): M = K,
    N = taps * C (c innermost), the reduction over the N * output positions split over grid.z into fp32
    partials that conv::fold adds in split order (deterministic); one split writes dw directly (no
    workspace)."""
    gm, gn, gk = pb.k, pb.c * prod(pb.filt3), pb.n * prod(pb.out3)
    if max(gm, gn, gk) > INT_MAX:
        raise PydnnError(NS, "the implicit GEMM exceeds 2^31 - 1 rows (split the batch)")
    cfg, splits = _wgrad_choice(handle, pb, gm, gn, gk)
    pipe = len(cfg) == 5
    bk = TCP_BK if pipe else TC_BK
    bm, bn = (cfg[0], cfg[1]) if pipe else (cfg[0], WG_BN)
    kps = cdiv(cdiv(gk, splits), bk) * bk
    splits = cdiv(gk, kps)
    p = base_params(pb, DIR_BWD_FILTER)
    p.gm, p.gn, p.gk = gm, gn, gk
    red = [pb.n] + list(pb.out3)
    for i in range(4):
        p.red_size[i] = red[i]
    for i, v in enumerate(digit_step(bk, red)):
        p.red_step[i] = v
    p.splits, p.k_per_split = splits, kps
    pl = Plan()
    pl.direction, pl.algo, pl.unit = DIR_BWD_FILTER, algo, f"convolution.{pb.tag}"
    pl.itemsize, pl.acc_size, pl.deterministic, pl.splits = DTYPES[pb.dtype][0], 4, True, splits
    pl.gemm, pl.gemm_grid = p, (cdiv(gm, bm), cdiv(gn, bn), splits)
    if pl.gemm_grid[1] > 65535:
        raise PydnnError(NS, f"{gn} filter columns (taps x C) exceed the tensor-core kernel's grid")
    pl.gemm_expr = _tc_expr(pb.tag, DIR_BWD_FILTER, cfg)
    pl.fold = pl.fold_func = pl.fold_argv = None
    pl.workspace, pl.align, pl.pair_ok = 0, 16, False
    if pipe:
        pl.threads = cfg[2] * cfg[3] * 32
        pl.smem = TCP_STAGES * (bm + bn) * TCP_BK * 2
    else:
        pl.threads = THREADS
        pl.smem = WG_STAGES * TC_BK * (bm + 8 + WG_BN + 8) * 2
    if splits > 1:
        p.flags |= FLAG_PARTIAL
        pl.workspace = splits * gm * gn * 4
        f = ConvAuxParams()
        f.groups, f.kg, f.cg, f.taps, f.splits = 1, pb.k, pb.c, prod(pb.filt3), splits
        for i in range(3):
            f.filt[i] = pb.filt3[i]
        for i in range(5):
            f.out_stride[i] = pb.ws[i]
        f.flags = FLAG_CIN | (FLAG_FLIP if pb.flip else 0)
        pl.fold, pl.fold_expr = f, fold_expr(pb.tag)
        pl.fold_grid = (cdiv(gm * gn, 256), 1, 1)
        pl.fold_argv = driver.kernel_args(f)
    pl.gemm_argv, pl.gemm_func = driver.kernel_args(p), None
    return pl


# relative speed per flop of the forward / backward-data tiles (bigger tiles move fewer bytes and issue
# fewer ldmatrix per MMA): fit to the benchmark's forced tilings (H200, see tools/bench_convolution.py);
# a ranking model, not a promise
TC_TILE_SPEED = {(128, 128): 1.0, (128, 64): 0.8, (64, 128): 0.8, (64, 64): 0.6}


def _tc_tiling(handle, gm, gn):
    """(BM, BN) of fwd_tc / bwd_data_tc: the least modelled time = rounds of blocks per SM x flops per
    tile / the tiling's speed. (Measured: one block per SM runs nearly as fast per SM as two, so a round
    is one block per SM.) Tiles wider than the problem's N count their empty part."""
    sms = max(handle.sm_count, 1)
    best = None
    for cfg in TC_TILES:
        bm, bn = cfg
        blocks = cdiv(gm, bm) * cdiv(gn, bn)
        rounds = cdiv(blocks, sms)
        t = rounds * bm * bn / TC_TILE_SPEED[cfg]
        if best is None or t < best[0] * 0.999:  # ties: the earlier (bigger) tile
            best = (t, cfg)
    return best[1]


# The pipelined tiles' blocks per SM (shared memory: 3 stages of (BM + BN) x 64 x 2 bytes; registers:
# the MINB cap), and an SM's relative speed by the warps resident on it: the pipelined kernel is latency
# bound (tools/bench_convolution.py's forced tilings: 12 to 16 resident warps beat 4 to 8 by 20-60% whatever
# the warp tile), fit to the H200's ResNet 3x3 layers. A ranking model, not a promise.
TCP_PER_SM = {cfg: min(cfg[4], (227 * 1024) // (TCP_STAGES * (cfg[0] + cfg[1]) * TCP_BK * 2)) for cfg in TCP_TILES}
TCP_WARP_SPEED = ((4, 0.5), (8, 0.8), (12, 1.0), (16, 1.18))   # (resident warps, speed), interpolated


def _warp_speed(warps):
    pts = TCP_WARP_SPEED
    if warps <= pts[0][0]:
        return pts[0][1]
    for (w0, s0), (w1, s1) in zip(pts, pts[1:]):
        if warps <= w1:
            return s0 + (s1 - s0) * (warps - w0) / (w1 - w0)
    return pts[-1][1]


def _tcp_refusal(pb, direction):
    """Why the pipelined kernel (implicit_gemm_pipe_tc) cannot serve a problem that fwd_tc / bwd_data_tc
    can (None when it can): the tap masks hold T * R <= 16 and S <= 16 bits; backward data gathers with
    stride 1 only (a tap's dy offset is then the same for every dx row)."""
    t, r, s = pb.filt3
    if t * r > 16 or s > 16:
        return f"filter taps T * R = {t * r} > 16 or S = {s} > 16"
    if direction == DIR_BWD_DATA and any(st != 1 for st in pb.stride3):
        return f"backward data with stride {tuple(pb.stride3)}"
    a = pb.x_desc if direction == DIR_FWD else pb.y_desc   # the gathered operand
    a_span = 1 + sum((d - 1) * abs(st) for d, st in zip(a.dims, a.strides))
    w_span = 1 + sum((d - 1) * abs(st) for d, st in zip((pb.k, pb.cg) + tuple(pb.filt3), pb.ws))
    if max(a_span, w_span) > INT_MAX:
        return "a tensor spans 2^31 elements or more (the kernel's offsets are 32-bit)"
    return None


def _tcp_tiling(handle, gm, gn):
    """A TCP_TILES entry: the least modelled time = the blocks the busiest SM runs x a block's flops / the
    SM's speed with the warps it holds (its blocks, up to TCP_PER_SM, x the tile's warps). Tiles wider than
    the problem's N count their empty part; ties go to the earlier entry."""
    sms = max(handle.sm_count, 1)
    best = None
    for cfg in TCP_TILES:
        bm, bn, wm, wn = cfg[:4]
        blocks = cdiv(gm, bm) * cdiv(gn, bn)
        per_sm = cdiv(blocks, sms)
        t = per_sm * bm * bn / _warp_speed(min(per_sm, TCP_PER_SM[cfg]) * wm * wn)
        if best is None or t < best[0] * 0.999:
            best = (t, cfg)
    return best[1]


def _tc_choice(handle, pb, direction, gm, gn, rc):
    """The tiling of a tensor-core plan: a WGM_TILES entry (fwd_wgmma, forward and stride-1 backward data
    on sm_90, by _wgm_tiling) or a TCP_TILES entry (the pipelined kernel) where they apply and the
    reduction's channels fill their 64-deep K tiles (rc % 64 == 0; backward data: to at least
    tuning.conv.BWD_TAIL_FILL, _k_tiles_fill), else fwd_tc / bwd_data_tc's (BM, BN).
    A forced tiling (tuning.conv.TC_FORCE) is obeyed where its kernel applies."""
    pipe_ok = _tcp_refusal(pb, direction) is None
    forced = tuning.conv.TC_FORCE.get(direction)
    # fwd_wgmma serves the forward and (stride 1, which pipe_ok implies there) backward data as the forward
    # of dy with the filter's K and C roles swapped (_plan_bwd_wgmma)
    wgm_ok = direction in (DIR_FWD, DIR_BWD_DATA) and pipe_ok and getattr(handle, "arch", None) == WGM_ARCH
    if _is_wgm(forced):  # a fwd_wgmma tile: where it exists, else the model's choice
        if wgm_ok:
            return tuple(forced)
        forced = None
    if forced is not None and (len(forced) == 2 or pipe_ok):
        return tuple(forced)
    if forced is None and pipe_ok and _k_tiles_fill(direction, rc, getattr(pb, "view", None)):
        if tuning.conv.USE_WGM and wgm_ok and prod(pb.filt3) * cdiv(rc, TCP_BK) >= WGM_MIN_KTILES:
            return _wgm_tiling(handle, gm, gn)
        return _tcp_tiling(handle, gm, gn)
    return _tc_tiling(handle, gm, gn)


def _k_tiles_fill(direction, rc, view=None):
    """Whether the 64-deep K tiles of the pipelined / wgmma kernels take a reduction of rc channels per
    tap: multiples of 64, or where real channels fill at least tuning.conv.BWD_TAIL_FILL (backward data)
    / FWD_TAIL_FILL (forward) of the tiles' depth (the rest zero-filled: the kernels' channel tails), which
    still beats bwd_data_tc / fwd_tc's 32-deep tiles. The GEMM algorithm's 1x1 view of its column matrix
    (view "col") takes tuning.conv_gemm.VIEW_TAIL_FILL instead (fwd_tc over the stem's 152 columns measured
    0.227 ms against matmul's 0.296, H200; the tails there are not measured yet)."""
    if rc % TCP_BK == 0:
        return True
    fill = (tuning.conv.BWD_TAIL_FILL if direction == DIR_BWD_DATA
            else tuning.conv_gemm.VIEW_TAIL_FILL if view == "col" else tuning.conv.FWD_TAIL_FILL)
    return direction in (DIR_BWD_DATA, DIR_FWD) and rc / (cdiv(rc, TCP_BK) * TCP_BK) >= fill


def _wgm_tiling(handle, gm, gn):
    """The fwd_wgmma tile for the model (tuning.conv.USE_WGM): the least blocks on the busiest SM x a block's flops /
    WGM_TILE_SPEED (tiles wider than N count their empty part). Against the forced tilings' times (H200, N = 64
    ResNet 3x3 layers) it picks the faster tile on each: 128x64 at 56² and 14², 128x128 at 28² (a tie) and 7²."""
    sms = max(handle.sm_count, 1)
    best = None
    for cfg in WGM_TILES:
        bm, bn = cfg[:2]
        t = cdiv(cdiv(gm, bm) * cdiv(gn, bn), sms) * bm * bn / WGM_TILE_SPEED[cfg]
        if best is None or t < best[0] * 0.999:
            best = (t, cfg)
    return best[1]


def plan_tc(handle, pb, algo, direction=DIR_FWD, cfg=None, bkn=False):
    """A tensor-core plan (fwd_wgmma, implicit_gemm_pipe_tc, or fwd_tc / bwd_data_tc, in
    ptx/convolution.cu) or NOT_SUPPORTED with the reason. cfg: the tiling (else the model's or a forced
    one); bkn: a fwd_wgmma forward whose filter is read as [k][n] (backward data's view, _plan_bwd_wgmma)."""
    why = tc_refusal(pb, direction)
    if why:
        raise PydnnError(NS, f"algo: {why}")
    if direction == DIR_FWD:
        gm, gn, gk, rc, out_strides = pb.n * prod(pb.out3), pb.k, pb.c * prod(pb.filt3), pb.c, pb.ys
    else:
        gm, gn, gk, rc, out_strides = pb.n * prod(pb.in3), pb.c, pb.k * prod(pb.filt3), pb.k, pb.xs
    if max(gm, gn, gk) > INT_MAX:
        raise PydnnError(NS, "the implicit GEMM exceeds 2^31 - 1 rows (split the batch)")
    if cfg is None:
        cfg = _tc_choice(handle, pb, direction, gm, gn, rc)
    if direction == DIR_BWD_DATA and _is_wgm(cfg):
        return _plan_bwd_wgmma(handle, pb, algo, cfg)
    p = base_params(pb, direction)
    p.gm, p.gn, p.gk = gm, gn, gk
    p.flags |= FLAG_CIN | (FLAG_STAGED if direction == DIR_FWD and tuning.conv.TC_STAGED_PLAIN else 0)
    bm, bn = cfg[:2]
    red = list(pb.filt3) + [rc]
    for i in range(4):
        p.red_size[i] = red[i]
    for i, v in enumerate(digit_step(TC_BK, red)):
        p.red_step[i] = v
    p.splits, p.k_per_split = 1, gk
    pl = Plan()
    pl.direction, pl.algo, pl.unit = direction, algo, f"convolution.{pb.tag}"
    pl.itemsize, pl.acc_size, pl.deterministic, pl.splits = DTYPES[pb.dtype][0], 4, True, 1
    pl.gemm, pl.gemm_grid = p, (cdiv(gm, bm), cdiv(gn, bn), 1)
    if pl.gemm_grid[1] > 65535:
        raise PydnnError(NS, f"{gn} output channels exceed the tensor-core kernel's grid")
    wgm = _is_wgm(cfg)
    pl.gemm_expr = _wgm_expr(pb.tag, cfg, bkn) if wgm else _tc_expr(pb.tag, direction, cfg)
    if wgm:
        pl.unit = f"convolution.wgmma.{pb.tag}"
    pl.gemm_argv, pl.gemm_func = driver.kernel_args(p), None
    pl.fold = pl.fold_func = pl.fold_argv = None
    pl.workspace, pl.align = 0, 16
    if wgm:  # two warpgroups; STAGES x (BM + BN) x 64 swizzled stages + 1 KiB to align them to 1024 bytes
        pl.threads = 256  # + BN floats: FB = 0's fused bias parked for the epilogue
        pl.smem = cfg[2] * (bm + bn) * TCP_BK * 2 + 1024 + bn * 4
    elif len(cfg) == 6:  # the pipelined kernel: WARPS_M x WARPS_N warps, swizzled [rows][64] (or [64][BN]) tiles
        pl.threads = cfg[2] * cfg[3] * 32
        pl.smem = TCP_STAGES * (bm + bn) * TCP_BK * 2
    else:
        pl.threads = THREADS
        b_stage = bn * TC_LD if direction == DIR_FWD else TC_BK * (bn + 8)  # B as [n][k] or [k][n]
        pl.smem = TC_STAGES * (bm * TC_LD + b_stage) * 2
    # channel pairs as 32-bit stores: the output's channels contiguous, every other stride even (and the
    # output 4-byte aligned, checked per call)
    pl.pair_ok = out_strides[1] == 1 and all(st % 2 == 0 for i, st in enumerate(out_strides) if i != 1)
    return pl


# ----------------------------------------------------------------------------- split-K on fwd_wgmma
#
# A forward (or stride-1 backward data, the forward of dy) whose 128 x BN tiles are too few for the SMs
# (small N, 7 x 7 / 14 x 14 maps, few output channels) and whose reduction is long (3x3 over 512 channels:
# 72 K tiles) runs a few blocks that walk every K tile. Issue 18's sweep (H200, 2026-11-28 call B): the 63
# fwd_wgmma points at under half a wave of blocks read 0.56x cuDNN (N8 3x3 512->512 @7: 32 blocks of 72
# K tiles, 0.0313 ms against 0.0127). The split plan runs S slices of the K tiles as grid.z (fwd_wgmma<...,
# SPLIT = 1>, units convolution.wgmma.split.<tag>: raw fp32 sums to the workspace, [split][m][n]; the plan's
# params carry FLAG_PARTIAL as a label), then fwd_split_fold adds them in split order and applies the call's
# epilogue (alpha, beta, z, bias, activation), so every call the plain plan serves keeps its meaning;
# deterministic. Only a call's own plan is split (plans.register_top) and dgrad_phases' phases (apply_top:
# the phase plan reserves the largest phase's partials); the plans other plans run as steps without a
# workspace (the GEMM algorithm's fused 1x1) are never split. Measured (H200, tools/bench_conv_split.py, 23
# points of the sweep): 0.524 -> 1.109x cuDNN geomean, every point faster; tools/PERF.md "Session 30: conv".

WGM_SPLIT_SM_TFLOPS = 3.4    # one SM's fwd_wgmma rate with its blocks resident (~450 TFLOP/s / 132, the sweep's
                              # large 3x3 layers); a lone block of a MINB 2 tile on its SM runs ~0.75 of it
                              # (N8 3x3 512->512 @7: 0.42 us a K tile a block, 2.5 TFLOP/s)
WGM_SPLIT_LONE = 0.75
WGM_SPLIT_FILL = 2.0          # a block's pipeline fill and epilogue, in K tiles
WGM_SPLIT_GBPS = 2500.0       # the partials written, read back by the fold (mostly L2), and y written
WGM_SPLIT_LAUNCH_MS = 0.003   # the fold's launch
WGM_SPLIT_GAIN = 1.15         # split only where the model says at least this much faster
WGM_SPLIT_MIN_PER = 4         # K tiles a slice at least
WGM_SPLIT_MAX = 32
WGM_SPLIT_MIN_MACS = 1 << 25  # smaller problems are launch-bound whatever the split


def _wgm_cfg(expr):
    """(BN, MINB) of a fwd_wgmma expression (pydnn::conv::fwd_wgmma<T, BN, STAGES, MINB, ...>)."""
    args = [a.strip() for a in expr.split("<", 1)[1].rstrip(">").split(",")]
    return int(args[1]), int(args[3])


def _wgm_split_ms(handle, bn, minb, tiles, ktiles, splits, gm, gn):
    """The split model's time (ms) of S = splits slices: the busiest SM's blocks x (K tiles a slice + the
    fill) x a K tile's flops / the SM's rate (a lone block at WGM_SPLIT_LONE of it), plus the fold's traffic
    and launch when split. A ranking, not a promise."""
    sms = max(handle.sm_count, 1)
    per = cdiv(ktiles, splits)
    busiest = cdiv(tiles * splits, sms)
    speed = 1.0 if busiest >= minb else WGM_SPLIT_LONE + (1.0 - WGM_SPLIT_LONE) * (busiest - 1) / max(minb - 1, 1)
    t = busiest * (per + WGM_SPLIT_FILL) * 2.0 * 128 * bn * TCP_BK / (WGM_SPLIT_SM_TFLOPS * 1e9 * speed)
    if splits > 1:
        t += (2.0 * splits * gm * gn * 4 + gm * gn * 2) / (WGM_SPLIT_GBPS * 1e6) + WGM_SPLIT_LAUNCH_MS
    return t


def _wgm_split(handle, pl):
    """The split count for a fwd_wgmma plan: tuning.conv.WGM_SPLIT's, or the model's (1: no split)."""
    p = pl.gemm
    ktiles = prod(p.filt) * cdiv(p.cg, TCP_BK)
    forced = tuning.conv.WGM_SPLIT
    if forced is not None:
        return max(1, min(int(forced), ktiles, 65535))
    if tuning.conv.TC_FORCE.get(pl.direction) is not None:
        return 1   # a forced tiling runs as forced
    if p.gm * p.gn * p.gk < WGM_SPLIT_MIN_MACS or ktiles < 2 * WGM_SPLIT_MIN_PER:
        return 1
    bn, minb = _wgm_cfg(pl.gemm_expr)
    tiles = pl.gemm_grid[0] * pl.gemm_grid[1]
    base = _wgm_split_ms(handle, bn, minb, tiles, ktiles, 1, p.gm, p.gn)
    best = (base, 1)
    for s in range(2, min(WGM_SPLIT_MAX, ktiles // WGM_SPLIT_MIN_PER) + 1):
        if cdiv(ktiles, cdiv(ktiles, s)) != s:
            continue   # the same slices as fewer splits
        t = _wgm_split_ms(handle, bn, minb, tiles, ktiles, s, p.gm, p.gn)
        if t < best[0]:
            best = (t, s)
    return best[1] if best[0] * WGM_SPLIT_GAIN <= base else 1


def split_wgmma(handle, pl):
    """plans.register_top's hook: a call's own fwd_wgmma plan (forward, or backward data read straight from
    the filter) split over grid.z where _wgm_split says so; other plans unchanged."""
    if (type(pl) is not Plan or pl.fold is not None or pl.direction == DIR_BWD_FILTER
            or pl.gemm_expr not in _SPLIT_EXPRS):
        return pl   # (forced WGM_VARIANTS tilings have no split twin)
    splits = _wgm_split(handle, pl)
    if splits <= 1:
        return pl
    p = pl.gemm
    ktiles = prod(p.filt) * cdiv(p.cg, TCP_BK)
    per = cdiv(ktiles, splits)
    splits = cdiv(ktiles, per)
    if splits <= 1:
        return pl
    p.splits, p.k_per_split = splits, per
    q = ConvParams.from_buffer_copy(p)   # the fold's: y's sizes and strides, the call's epilogue per call
    p.flags |= FLAG_PARTIAL
    pl.gemm_grid = (pl.gemm_grid[0], pl.gemm_grid[1], splits)
    pl.splits = splits
    pl.workspace = round_up(splits * p.gm * p.gn * 4)
    tag = pl.unit.rsplit(".", 1)[1]
    pl.gemm_expr, pl.gemm_func, pl.unit = _SPLIT_EXPRS[pl.gemm_expr], None, f"convolution.wgmma.split.{tag}"
    pl.fold, pl.fold_expr, pl.fold_func = q, _split_fold_expr(tag), None
    pl.fold_grid = (cdiv(p.gm * p.gn, 256), 1, 1)
    pl.fold_argv = driver.kernel_args(q)
    pl.gemm_argv = driver.kernel_args(p)
    return pl


register_top(split_wgmma)


# ----------------------------------------------------------------------------- backward data on fwd_wgmma
#
# With stride 1, dx[i] = sum over taps r of dy[i + pad - r * dil] w[r] (cross-correlation; per spatial
# dim, channels contracted over K). That is a forward convolution of dy (K channels) producing dx (C
# channels) with padding (R - 1) * dil - pad and the filter w'[c][r][k] = w[k][r][c] taken flipped
# (tap R - 1 - r): so the forward of the opposite mode. Two plans:
#   direct (where _bkn_refusal allows: the filter's C contiguous, its other strides multiples of 8):
#     fwd_wgmma<..., BKN = 1> reads B = w'[c][tap][k] from w itself as [k][c] tiles (MN-major; its
#     filter strides ws = (1, w's k stride, w's tap strides)). One launch, no workspace.
#   swap (the filters BKN cannot read, or tuning.conv.WGM_BWD_SWAP): filter_kc_swap writes w' (packed, K
#     innermost) into the workspace, then fwd_wgmma runs that forward with B K-major.
# Either way fwd_wgmma's epilogue writes dx through dx's strides with alpha / beta. Deterministic
# (every dx element written once, no atomics).

def _bkn_refusal(pb):
    """Why fwd_wgmma cannot read backward data's B straight from the filter (None when it can): it copies
    16 bytes = 8 consecutive c of one (k, tap), so c's stride must be 1 and the others multiples of 8."""
    if pb.ws[1] != 1 or any(pb.ws[i] % 8 for i in (0, 2, 3, 4)):
        return f"filter strides {tuple(pb.ws)}"
    return None


def _bwd_wgm_problem(pb, direct=False):
    """The forward Problem whose output is pb's dx (stride 1): x = dy, y = dx, padding (R - 1) * dil - pad,
    the opposite mode; its filter (C, K, taps) is w itself through its strides (direct) or the packed
    (C, taps, K) copy in the workspace (the swap)."""
    s = pb.copy()
    t, r, q = pb.filt3
    s.n, s.c, s.k, s.groups, s.cg, s.kg = pb.n, pb.k, pb.c, 1, pb.k, pb.c
    s.in3, s.out3 = tuple(pb.out3), tuple(pb.in3)
    s.pad3 = tuple((f - 1) * d - p for f, d, p in zip(pb.filt3, pb.dil3, pb.pad3))
    s.stride3, s.dil3 = (1, 1, 1), tuple(pb.dil3)
    s.xs, s.ys = pb.ys, pb.xs
    s.ws = ((pb.ws[1], pb.ws[0]) + tuple(pb.ws[2:]) if direct
            else (t * r * q * pb.k, 1, r * q * pb.k, q * pb.k, pb.k))
    s.flip = not pb.flip
    s.w_format = E.PYDNN_TENSOR_NHWC
    s.x_desc, s.y_desc, s.w_dims = pb.y_desc, pb.x_desc, (pb.c, pb.k) + tuple(pb.filt3)
    return s


SWAP_GBPS = 2000.0   # the Get..._v7 model's rate for filter_kc_swap (bytes read + written / time; a ranking)
SWAP_LAUNCH_MS = 0.004


class BwdWgmmaPlan(StepPlan):
    """Backward data as filter_kc_swap + fwd_wgmma (see above): a multi-launch plan (run_plan's `launch`,
    the Get..._v7 model's `estimate_ms`), with the Plan attributes the family reads (StepPlan's)."""

    def __init__(self, pb, algo, sub, spb):
        super().__init__(DIR_BWD_DATA, algo, pb)
        self.sub, self.sub_problem = sub, spb
        sub.problem = spb
        self.align = sub.align            # dy is read in 16-byte vectors
        self.gemm, self.gemm_expr, self.unit = sub.gemm, sub.gemm_expr, sub.unit
        self.filter_bytes = prod(pb.filt3) * pb.c * pb.k * self.itemsize
        self.workspace = -(-self.filter_bytes // 256) * 256
        f = ConvAuxParams()
        f.kg, f.cg, f.taps = pb.k, pb.c, prod(pb.filt3)
        for i in range(3):
            f.filt[i] = pb.filt3[i]
        for i in range(5):
            f.in_stride[i] = pb.ws[i]
        self.swap, self.swap_argv, self.swap_func = f, driver.kernel_args(f), None
        self.swap_grid = (cdiv(pb.k, 64), cdiv(pb.c, 64), f.taps)
        self.swap_expr = _swap_expr(pb.tag)
        if max(self.swap_grid[1:]) > 65535:
            raise PydnnError(NS, f"algo: {self.swap_grid} blocks exceed the launch grid (too many channels)")

    def launch(self, handle, a_ptr, b_ptr, out_ptr, ws_ptr, alpha, beta, z_ptr=0, bias_ptr=0):
        """a = dy, b = w, out = dx; w' goes to the workspace, which fwd_wgmma then reads as its filter."""
        if self.swap_func is None:
            self.swap_func = handle.function(self.unit, self.swap_expr)
        self.swap.in_, self.swap.out = b_ptr, ws_ptr
        driver.launch_args(self.swap_func, self.swap_grid, (256, 1, 1), 0, handle.cu_stream, self.swap_argv)
        run_plan(handle, self.sub, a_ptr, ws_ptr, out_ptr, 0, alpha, beta)

    def estimate_ms(self, handle, base_estimate):
        return base_estimate(handle, self.sub) + 2 * self.filter_bytes / (SWAP_GBPS * 1e6) + SWAP_LAUNCH_MS


def _plan_bwd_wgmma(handle, pb, algo, cfg):
    if not tuning.conv.WGM_BWD_SWAP and _bkn_refusal(pb) is None:  # one launch: fwd_wgmma reading w as [k][c] tiles
        pl = plan_tc(handle, _bwd_wgm_problem(pb, direct=True), algo, DIR_FWD, cfg, bkn=True)
        pl.direction = DIR_BWD_DATA
        return pl
    spb = _bwd_wgm_problem(pb)
    sub = plan_tc(handle, spb, algo, DIR_FWD, cfg)
    sub.direction = DIR_FWD
    return BwdWgmmaPlan(pb, algo, sub, spb)


# ----------------------------------------------------------------------------- the planners


@register(DIR_FWD, E.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, refusal=lambda pb: tc_refusal(pb, DIR_FWD))
@register(DIR_BWD_DATA, E.PYDNN_CONVOLUTION_BWD_DATA_ALGO_1, refusal=lambda pb: tc_refusal(pb, DIR_BWD_DATA))
def plan_implicit_tc(handle, pb, direction, algo):
    return plan_tc(handle, pb, algo, direction)


@register(DIR_BWD_FILTER, E.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_1, order=1,
          refusal=lambda pb: tc_refusal(pb, DIR_BWD_FILTER))
def plan_wgrad_mma(handle, pb, direction, algo):
    return plan_wgrad_tc(handle, pb, algo)
