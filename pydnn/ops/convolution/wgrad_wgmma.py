"""Convolution backward filter (BWD_FILTER_ALGO_1, half / bfloat16) on Hopper's warpgroup MMA: the kernel
wgrad_tc_wgmma in ptx/conv_wgrad_wgmma.cu (units convolution.wgrad.<tag>, compiled for sm_90a only), the
deterministic split-K fold of ptx/convolution.cu (conv::fold, unit convolution.<tag>) when the reduction is
split.

The GEMM is wgrad_pipe_tc's: M = K, N = taps * C (c innermost), the reduction over N * OD * OH * OW output
positions; dy ([pos][k]) and x gathered ([pos][(tap, c)]) are both MN-major wgmma operands in 128B-swizzled
slabs. Where it applies (sm_90, the tensor-core backward filter's conditions: NHWC x and dy with channel
counts % 8, one group, plus wgrad_pipe_tc's: packed NHWC dy, 32-bit spans) tensor_core.plan_wgrad_tc hands
the problem here (ENABLED), else wgrad_pipe_tc / wgrad_tc run. Any filter layout (dw written through its
strides), any stride / dilation / padding, both modes.

Plan: (tile, splits) from a busiest-SM model (tiling below), and one launch of wgrad_tc_wgmma whose blocks
are either whole tiles (the whole reduction; dw written with alpha / beta by the block) or slices of split
tiles (fp32 partials per tile in the workspace, [split][tile][BM][BN]), then, where tiles are split,
wgrad_fold adding the partials in split order (bitwise reproducible run to run; a forced other split count
may differ in the last bits). The hybrid plan (the 512 @7 layer: 144 128 x 128 tiles on 132 SMs, where
every split count or wider tile loses a wave to quantization or the fold's traffic) runs the first wave's
tiles whole and splits the other 12 tiles' reductions across the SMs, in the same launch.

Performance (H200, bf16 NHWC 3x3, N = 64, the ResNet-50 layers 64->64 @56 / 128->128 @28 / 256->256 @14 /
512->512 @7, 14.8 GFLOP each; TFLOP/s and the ratio to cuDNN in the same run: cuDNN's own times vary
10-40% between runs (cudnn.benchmark picks). tools/bench_conv_wgrad_wgmma.py times every tiling,
tools/bench_convolution.py's backward-filter rows the model's choice. Which version brought what, the
predictions and the old text of these notes: tools/notes/convolution.md.)
  The model's choices: 258.5 / 380.3 / 345.7 / 316.2 = 0.76 / 0.98 / 0.80 / 0.65x cuDNN (339.7 / 386.4 /
    433.8 / 483.0 in that run), 1.44 / 1.78 / 1.82 / 1.87x wgrad_pipe_tc (mma.sync; 179.4 / 214.0 / 190.0 /
    169.1 in the same run).
  The copy loop (V 2): a per-K-tile position table (threads 0..63 decompose the tile's 64 positions once
    into shared memory, each B row adds its tap: ~16 PTX instructions a row, no branch per chunk) runs
    1.08-1.22x V 1, where each B row steps its own position digits (~40 instructions a row), in the same
    run.
  Splits: one wave of blocks matters most (128->128 @28 at 128x128: 7 splits = 63 blocks 193, 14 = 126
    blocks 332, 28 = 252 blocks 296). Deeper rings did not pay (128x128 6 stages 339 against 4 stages 342;
    64x256 5 stages 223 against 216).
  The hybrid (HYBRID): at 512 @7 every tiling is either < 132 blocks or 2 rounds (128x128 unsplit 194, 2
    splits 178; 64x128 two an SM 199; V 1's loop). Running the first wave's tiles whole and splitting the other 12
    tiles in the same launch (whole tiles first, the split tiles' slices after them, no kernel boundary;
    the direct epilogue steps (tap, channel) instead of dividing per column) gives 316.2, +10% over the
    same plan as two launches (287.4); tail splits 5 / 17: 308.8 / 302.0.
  Where the time goes (estimates from the tilings' spread, not profiled): one block of 8 warps an SM runs
    128 x 128 tiles at ~3 TFLOP/s an SM (40% of the tensor peak), 128 x 256 at ~3.4; splits that leave SMs
    idle or add a partial round cost most (the model's busiest-SM term); the fold's fp32 traffic caps the
    split counts. The model's absolute times are off by up to 15% (the 512 @7 layer's K tiles run ~30%
    slower than the 128 @28 layer's at the same tile, not understood), its ranking matched the measured
    best tiling on all four layers. Next levers: warp-specialized producers (TMA) to take the copies off
    the MMA warps, two-CTA clusters multicasting the shared operand to halve the L2 reads.
"""
import ctypes

from ... import enums as E
from ... import tuning
from ..._build.params import kernel_params
from ..._cuda import driver
from ...status import PydnnError
from .._elementwise import CTYPE
from ..common import cdiv, prod
from .plans import kernel_units as _family_units, StepPlan, add_kernels, base_params, digit_step, register
from .problem import DIR_BWD_FILTER, INT_MAX, ConvParams, algo_name, tc_refusal, wgp_refusal

NS = E.PYDNN_STATUS_NOT_SUPPORTED
FLAG_BETA, FLAG_FLIP = 1, 16   # PYDNN_FLAG_BETA, PYDNN_CONV_FLAG_FLIP
ARCH = "sm_90"          # tensor_core.WGM_ARCH
TAGS = ("f16", "bf16")
BK = 64                 # positions per K tile
# wgrad_tc_wgmma<T, BM, BN, STAGES, MINB> instantiations (the copy loop V 2): BM x BN tiles of two
# warpgroups (BM 128: stacked along M, each 64 x BN; BM 64: side by side along N, each 64 x BN / 2),
# STAGES-deep cp.async ring, MINB blocks per SM for the register cap
TILES = ((128, 128, 4, 1), (64, 256, 4, 1), (64, 128, 4, 2), (128, 256, 4, 1))
# more instantiations that only a forced tiling runs (benchmarks): a fifth entry is the copy loop's version
# (V: 1 = each B row steps its own position digits; default 2 = a per-K-tile position table)
VARIANTS = ((128, 128, 4, 1, 1), (64, 128, 4, 2, 1))
# the split model (fit to tools/bench_conv_wgrad_wgmma.py's per-tiling sweep, H200, with the V 1 copy loop;
# the position table and the one-launch hybrid left its rankings as they were; a ranking, not a promise):
# one SM's rate running 128 x 128 tiles, each tile's speed per flop relative to it (wider tiles move fewer
# bytes per flop), the speed of a MINB 2 tile alone on its SM, the partials' traffic rate (written, then
# read by the fold; mostly L2) and the cost of the fold's launch
SM_FLOPS = 2.9e12
TILE_SPEED = {(128, 128): 1.0, (64, 256): 0.9, (64, 128): 0.87, (128, 256): 1.16}
LONE_SPEED = 0.75
FOLD_GBPS = 5000.0
LAUNCH_S = 1.5e-6
MAX_SPLITS = 1024
HYBRID = True           # a plan may run the tiles of whole waves unsplit and split the rest (see tiling)


@kernel_params("conv_wgrad_wgmma_params.h", "WgradWgmmaParams")
class WgradWgmmaParams(ctypes.Structure):
    _fields_ = [("c", ConvParams), ("part", ctypes.c_void_p), ("direct", ctypes.c_int), ("tile_first", ctypes.c_int),
                ("tiles", ctypes.c_int), ("m_tiles", ctypes.c_int)]


@kernel_params("conv_wgrad_wgmma_params.h", "WgradFoldParams")
class WgradFoldParams(ctypes.Structure):
    _fields_ = [
        ("out", ctypes.c_void_p), ("in_", ctypes.c_void_p), ("alpha", ctypes.c_double), ("beta", ctypes.c_double),
        ("gm", ctypes.c_int), ("gn", ctypes.c_int), ("cg", ctypes.c_int), ("filt", ctypes.c_int * 3),
        ("splits", ctypes.c_int), ("tile_first", ctypes.c_int), ("tiles", ctypes.c_int), ("m_tiles", ctypes.c_int),
        ("bm", ctypes.c_int), ("bn", ctypes.c_int), ("flags", ctypes.c_uint), ("pad_", ctypes.c_int),
        ("ws", ctypes.c_longlong * 5),
    ]
    C_NAMES = {"in_": "in"}


def _expr(tag, cfg):
    return f"pydnn::conv_wgrad::wgrad_tc_wgmma<{CTYPE[tag]}, {', '.join(map(str, cfg))}>"


def _fold_expr(tag):
    return f"pydnn::conv_wgrad::wgrad_fold<{CTYPE[tag]}>"


for _t in TAGS:   # built and loadable for sm_90 only, as sm_90a (wgmma)
    add_kernels(f"convolution.wgrad.{_t}", "conv_wgrad_wgmma.cu",
                tuple(_expr(_t, c) for c in TILES + VARIANTS) + (_fold_expr(_t),), archs=(ARCH + "a",))


def smem_bytes(cfg):
    """Dynamic shared memory of a tile: its stages plus 1 KiB of slack to align them to 1 KiB."""
    bm, bn, stages = cfg[:3]
    table = 0 if len(cfg) > 4 and cfg[4] == 1 else 2 * BK * 16   # V 2's position table
    return stages * (bm + bn) * BK * 2 + table + 1024


def refusal(handle, pb):
    """Why this kernel cannot serve a backward filter (None when it can)."""
    if not tuning.conv_wgrad_wgmma.ENABLED:
        return "disabled (tuning.conv_wgrad_wgmma.ENABLED)"
    if getattr(handle, "arch", None) != ARCH:
        return f"the wgmma backward filter needs an {ARCH} device (got {getattr(handle, 'arch', None)})"
    why = tc_refusal(pb, DIR_BWD_FILTER) or wgp_refusal(pb)
    if why:
        return why
    if cdiv(pb.k, 64) * cdiv(pb.c * prod(pb.filt3), 64) > 2**31 - 1:
        return "too many tiles for the grid"
    return None


# ----------------------------------------------------------------------------- the split model

def _launch_s(sms, cfg, tiles, splits, ktiles):
    """Modelled seconds of one GEMM launch: the busiest SM runs ceil(blocks / SMs) blocks, each (its K
    tiles + 2 for the fill and the epilogue) x the tile's time."""
    bm, bn, minb = cfg[0], cfg[1], cfg[3]
    per = cdiv(ktiles, splits)
    load = cdiv(tiles * splits, sms)
    speed = TILE_SPEED[(bm, bn)] * (LONE_SPEED if minb > 1 and load < minb else 1.0)
    return load * (per + 2) * 2.0 * bm * bn * BK / (SM_FLOPS * speed)


def _fold_s(cfg, tiles, splits):
    return 2.0 * splits * tiles * cfg[0] * cfg[1] * 4 / (FOLD_GBPS * 1e9) + LAUNCH_S


def _splits_of(ktiles, splits):
    """The slices a split count makes (whole K tiles each, no empty slice)."""
    return cdiv(ktiles, cdiv(ktiles, max(1, min(splits, ktiles))))


def plan_time(sms, gm, gn, gk, cfg, splits, full=0, tail_splits=1):
    """Modelled seconds of (cfg, splits) or, with `full` > 0, of the hybrid: tiles [0, full) unsplit, the
    rest with tail_splits."""
    tiles, ktiles = cdiv(gm, cfg[0]) * cdiv(gn, cfg[1]), cdiv(gk, BK)
    if full:  # one launch: the slices start as the whole tiles finish
        t = _launch_s(sms, cfg, full, 1, ktiles)
        return t + _launch_s(sms, cfg, tiles - full, tail_splits, ktiles) + _fold_s(cfg, tiles - full, tail_splits)
    t = _launch_s(sms, cfg, tiles, splits, ktiles)
    return t + (_fold_s(cfg, tiles, splits) if splits > 1 else 0.0)


def tiling(sms, gm, gn, gk):
    """(a TILES entry, splits, full, tail_splits): the least modelled time over the tiles (a BM 128 tile
    skipped for K <= 64: half empty) and split counts, and the hybrid: where the tiles overfill whole waves
    of blocks by a few (the 512 @7 ResNet layer: 144 128 x 128 tiles on 132 SMs), the first waves' tiles
    unsplit (dw written directly) and the rest split across the SMs."""
    ktiles = cdiv(gk, BK)
    best = None
    for cfg in TILES:
        if cfg[0] == 128 and gm <= 64:
            continue
        tiles = cdiv(gm, cfg[0]) * cdiv(gn, cfg[1])
        cands = [(s, 0, 1) for s in range(1, min(MAX_SPLITS, ktiles, 65535) + 1) if _splits_of(ktiles, s) == s]
        wave = sms * cfg[3]
        full = tiles // wave * wave
        if HYBRID and 0 < full < tiles:
            cands += [(1, full, s) for s in range(2, min(MAX_SPLITS, ktiles) + 1) if _splits_of(ktiles, s) == s]
        for splits, f, ts in cands:
            t = plan_time(sms, gm, gn, gk, cfg, splits, f, ts)
            if best is None or t < best[0] * 0.999:
                best = (t, cfg, splits, f, ts)
    return best[1:]


# ----------------------------------------------------------------------------- the plan

class WgradWgmmaPlan(StepPlan):
    """wgrad_tc_wgmma (+ wgrad_fold where tiles are split): a multi-launch plan (plans.run_plan calls
    `launch`, the Get..._v7 heuristic `estimate_ms`) with the Plan attributes the family reads. steps: [kind, grid,
    params, argv, func, smem], kind "gemm" (its whole tiles write dw, its slices the workspace) or "fold"."""

    def __init__(self, pb, algo, cfg, splits, full, tail_splits):
        super().__init__(DIR_BWD_FILTER, algo, pb)
        self.cfg, self.splits, self.full, self.tail_splits = cfg, splits, full, tail_splits
        self.align = 16   # x and dy are read in 16-byte chunks
        self.unit = f"convolution.wgrad.{pb.tag}"
        self.gemm_expr, self.fold_expr = _expr(pb.tag, cfg), _fold_expr(pb.tag)
        self.smem = smem_bytes(cfg)
        self.gm, self.gn, self.gk = pb.k, pb.c * prod(pb.filt3), pb.n * prod(pb.out3)
        self.m_tiles = cdiv(self.gm, cfg[0])
        self.tiles = self.m_tiles * cdiv(self.gn, cfg[1])
        self.fold = None
        self.workspace = 0
        direct = full if full else (self.tiles if splits == 1 else 0)
        split_splits = tail_splits if full else splits
        self._gemm(pb, direct, self.tiles - direct, split_splits)
        self.gemm_grid = self.steps[0][1]

    def _gemm(self, pb, direct, tiles, splits):
        """The GEMM launch: tiles [0, direct) whole, then tiles [direct, direct + tiles) in `splits` slices
        (+ the fold of those tiles)."""
        kps = cdiv(cdiv(self.gk, splits), BK) * BK
        splits = cdiv(self.gk, kps) if tiles else 1
        P = WgradWgmmaParams()
        p = base_params(pb, DIR_BWD_FILTER)
        p.gm, p.gn, p.gk = self.gm, self.gn, self.gk
        red = [pb.n] + list(pb.out3)
        for i in range(4):
            p.red_size[i] = red[i]
        for i, v in enumerate(digit_step(BK, red)):
            p.red_step[i] = v
        p.splits, p.k_per_split = splits, kps
        P.c, P.direct, P.tile_first, P.tiles, P.m_tiles = p, direct, direct, tiles, self.m_tiles
        blocks = direct + tiles * splits
        if blocks > 2**31 - 1:
            raise PydnnError(NS, f"{blocks} blocks exceed the launch grid")
        self.gemm = P.c
        self.steps.append(["gemm", (blocks, 1, 1), P, driver.kernel_args(P), None, self.smem])
        if not tiles:
            return
        f = WgradFoldParams()
        f.gm, f.gn, f.cg = self.gm, self.gn, pb.c
        for i in range(3):
            f.filt[i] = pb.filt3[i]
        for i in range(5):
            f.ws[i] = pb.ws[i]
        f.splits, f.tile_first, f.tiles, f.m_tiles, f.bm, f.bn = splits, direct, tiles, self.m_tiles, *self.cfg[:2]
        f.flags = FLAG_FLIP if pb.flip else 0
        self.fold = f
        self.workspace = splits * tiles * self.cfg[0] * self.cfg[1] * 4
        self.steps.append(["fold", (cdiv(tiles * self.cfg[0] * self.cfg[1], 256), 1, 1), f, driver.kernel_args(f),
                           None, 0])

    def launch(self, handle, a_ptr, b_ptr, out_ptr, ws_ptr, alpha, beta, z_ptr=0, bias_ptr=0):
        """a = dy, b = x, out = dw (convolution_backward_filter's order)."""
        if a_ptr % self.align or b_ptr % self.align:
            raise PydnnError(E.PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER,
                             f"{algo_name(self.direction, self.algo)} reads x and dy in {self.align}-byte "
                             f"vectors: both must be {self.align}-byte aligned (dy {a_ptr:#x}, x {b_ptr:#x})")
        bflag = FLAG_BETA if beta != 0 else 0
        for st in self.steps:
            kind, grid, p = st[0], st[1], st[2]
            if st[4] is None:
                st[4] = handle.function(self.unit, self.gemm_expr if kind == "gemm" else self.fold_expr, st[5])
            if kind == "gemm":
                c = p.c
                c.x, c.w, c.out, c.alpha, c.beta = a_ptr, b_ptr, out_ptr, alpha, beta
                p.part = ws_ptr or None
                c.flags = (c.flags & ~FLAG_BETA) | bflag
            else:
                p.out, p.in_, p.alpha, p.beta = out_ptr, ws_ptr, alpha, beta
                p.flags = (p.flags & ~FLAG_BETA) | bflag
            driver.launch_args(st[4], grid, (256, 1, 1), st[5], handle.cu_stream, st[3])

    def estimate_ms(self, handle, base_estimate):
        """The split model's time (the family's model is per launch and knows no hybrid)."""
        return 1e3 * plan_time(max(handle.sm_count, 1), self.gm, self.gn, self.gk, self.cfg, self.splits, self.full,
                               self.tail_splits)


def choice(handle, pb):
    """(cfg, splits, full, tail_splits) of a problem: FORCE, or tuning.conv.TC_FORCE[DIR_BWD_FILTER] when
    it names a TILES entry ((cfg, splits) or (cfg, splits, full, tail_splits)), else the model's."""
    gm, gn, gk = pb.k, pb.c * prod(pb.filt3), pb.n * prod(pb.out3)
    forced = tuning.conv_wgrad_wgmma.FORCE or tuning.conv.TC_FORCE.get(DIR_BWD_FILTER)
    if _names_tile(forced):
        cfg, splits = tuple(forced[0]), max(1, int(forced[1]))
        full, ts = (tuple(forced[2:4]) + (0, 1))[:2]
        return cfg, splits, full, ts
    return tiling(max(handle.sm_count, 1), gm, gn, gk)


def _names_tile(forced):
    return forced is not None and type(forced[0]) is tuple and tuple(forced[0]) in TILES + VARIANTS


def maybe_plan(handle, pb, algo):
    """The plan when this kernel applies and no other tensor-core backward-filter kernel is forced
    (tuning.conv.TC_FORCE), else None (plan_wgrad_tc goes on with wgrad_pipe_tc / wgrad_tc)."""
    forced = tuning.conv_wgrad_wgmma.FORCE or tuning.conv.TC_FORCE.get(DIR_BWD_FILTER)
    if forced is not None and not _names_tile(forced):
        return None
    if refusal(handle, pb) is not None:
        return None
    return plan(handle, pb, algo, *choice(handle, pb))


def plan(handle, pb, algo, cfg, splits, full=0, tail_splits=1):
    """WgradWgmmaPlan for (cfg, splits) (splits rounded to whole K tiles per slice), or the hybrid: tiles
    [0, full) unsplit, the rest with tail_splits."""
    gm, gn, gk = pb.k, pb.c * prod(pb.filt3), pb.n * prod(pb.out3)
    if max(gm, gn, gk) > INT_MAX:
        raise PydnnError(NS, "the implicit GEMM exceeds 2^31 - 1 rows (split the batch)")
    ktiles = cdiv(gk, BK)
    tiles = cdiv(gm, cfg[0]) * cdiv(gn, cfg[1])
    if not 0 < full < tiles:
        full, tail_splits = 0, 1
    return WgradWgmmaPlan(pb, algo, cfg, _splits_of(ktiles, splits) if not full else 1, full,
                          _splits_of(ktiles, tail_splits))


@register(DIR_BWD_FILTER, E.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_1, order=0,
          refusal=lambda pb: tc_refusal(pb, DIR_BWD_FILTER))
def plan_wgrad_wgmma(handle, pb, direction, algo):
    """BWD_FILTER_ALGO_1's first candidate: this kernel where it applies, else None (the mma.sync
    tensor-core kernels go on; they also refuse a GEMM past 2^31 - 1 rows, with the reason)."""
    if max(pb.k, pb.c * prod(pb.filt3), pb.n * prod(pb.out3)) > INT_MAX:
        return None
    return maybe_plan(handle, pb, algo)


def kernel_units():
    """This module's kernel units."""
    return _family_units("convolution.wgrad.")
