"""Narrow grouped convolutions as one direct tensor-core launch over all groups (ptx/conv_grouped.cu):

    forward          IMPLICIT_PRECOMP_GEMM  grouped_frag_pack + grouped_direct_tc
    backward data    ALGO_1 (stride 1)      grouped_frag_pack (transposed, flipped) + grouped_direct_tc on
                                            the virtual forward of dy (padding (R - 1) * dil - pad)
                     ALGO_1 (stride 2)      the same pack + grouped_direct_tc MODE 1: 8 x 16 dx tiles, a
                                            warp per phase, only the taps that reach its pixels (one launch
                                            where dgrad_phases ran 4 phases x (pack + kernel) + a fill)

    backward filter  ALGO_1                 grouped_wgrad_tc (fp32 partials over splits of the output
                                            tiles, the diagonal entries only) + grouped_wgrad_fold (the
                                            splits added in order: deterministic)

for C/g == K/g in 4, 8, 16, 32 (ResNeXt-50 32x4d's grouped 3x3: 4, 8, 16, 32), 2-d, half / bfloat16,
x and y channels contiguous, C a multiple of 64. Tried before grouped.py's packed supergroups (which stay
for the rest: C/g != K/g, 64, strided backward data's phases, the backward filter).

Why (issue 18's sweep, H200, 2026-11-28): the packed supergroups ran a dense 64 x 64 filter per tap (16x
the useful MMAs at C/g = 4, 2x at 32) on the pipelined implicit GEMM, which re-gathers every input pixel
for each of the 9 taps: 0.28-0.61x cuDNN on the ResNeXt layers, and the N = 8 stage-1 forward fell to
the CUDA-core implicit_gemm (0.017x). The direct kernel reads each input pixel of a block's tile once
into shared memory (the halo), points ldmatrix at it tap by tap, and issues only the MMAs on the block
diagonal (conv_grouped.cu's header): memory-bound layers move x and y about once.

Model (Get..._v7): the larger of the DRAM time (x's halo-inflated bytes, y, the packed filter at
DRAM_GBPS) and the shared-memory time (A fragments: 128 bytes a pixel a tap, at SMEM_BYTES_PER_CLK a SM),
plus the pack launch.
"""
from ... import enums as E
from ..._build.params import FLAG_BETA
from ..._cuda import driver
from ...status import PydnnError
from .._elementwise import CTYPE
from ..common import cdiv, prod
from .plans import LAUNCH_MS, StepPlan, add_kernels, base_params, load_function, register, round_up
from .problem import DIR_BWD_DATA, DIR_BWD_FILTER, DIR_FWD, FLAG_FLIP, FLAG_PAIR, NS, TC_TAGS, ConvAuxParams

SOURCE = "conv_grouped.cu"
CHANNELS = 64                     # channels of a block (kGdChannels)
THREADS = 128
WTHREADS = 256                    # the backward filter's 8 warps (kGwThreads)
MAX_STAGES = 6                    # kGdMaxStages: ring buffers
RING_SMEM = 200 * 1024            # one block a SM: the ring's budget on sm_90 (its 227 KiB opt-in less a margin;
RING_SMEM_SM80 = 160 * 1024       # sm_80: 163 KiB; other archs MAX_SMEM_SMALL: 99 KiB)
MAX_SMEM_SMALL = 96 * 1024
WGRAD_RED_BYTES = 4 * 9 * 8 * 32 * 4   # the backward filter's end: warps h = 1 hand 9 x 8 sums a lane over
TILES = ((8, 16), (8, 8))         # output tile (TH, TW): 8 x 16 where the rows are wide, else 8 x 8
TILE2 = (8, 16)                   # stride-2 backward data (MODE 1): the dx tile
WIDTHS = (4, 8, 16, 32)           # C/g == K/g served
MAX_SMEM = 160 * 1024             # a block's fragments + 2 halos (3 blocks a SM need <= 75 KiB, 2 <= 113)
RESIDENT = 3                      # blocks a SM the persistent grid plans for (registers: 3 of 128 threads)
PACK_TRANSPOSE = 4096             # kGdPackTranspose
DRAM_GBPS = 3000.0                # the model's rates (H200: ~4.8 TB/s peak, ~3 sustained by copies)
L2_GBPS = 6000.0                  # L2 -> SM copies (the backward filter's row blocks re-read a tile there)
SMEM_BYTES_PER_CLK = 128
CLOCK_GHZ = 1.7


def unit(tag, k_parts=1):
    """The forward / backward-data kernels of one NK (and the pack); three small units a data type (with
    wunit's) so that a first use or a prebuild compiles them in parallel (~25 s each on one 2-core CPU)."""
    return f"convolution.gdirect{k_parts}.{tag}"


def wunit(tag):
    return f"convolution.gwgrad.{tag}"


def nk(width):
    return 2 if width >= 32 else 1


def expr(tag, k_parts, tile, mode=0):
    return f"pydnn::conv::grouped_direct_tc<{CTYPE[tag]}, {k_parts}, {tile[0]}, {tile[1]}, {mode}>"


def pack_expr(tag):
    return f"pydnn::conv::grouped_frag_pack<{CTYPE[tag]}>"


WGRAD_NT = (9, 3, 0)               # the 8-warp kernel's compile-time tap counts (0: RB * S at run time)


def wgrad_expr(tag, k_parts, tile, nt=0):
    return f"pydnn::conv::grouped_wgrad_tc<{CTYPE[tag]}, {k_parts}, {tile[0]}, {tile[1]}, {nt}>"


def wfold_expr(tag):
    return f"pydnn::conv::grouped_wgrad_fold<{CTYPE[tag]}>"


def exprs(tag, k_parts):
    return [expr(tag, k_parts, t) for t in TILES] + [expr(tag, k_parts, TILE2, 1), pack_expr(tag)]


def wexprs(tag):
    return [wgrad_expr(tag, k, t, nt) for nt in WGRAD_NT for k in (1, 2) for t in TILES] + [wfold_expr(tag)]


def wgrad_max_taps(width):
    """grouped_wgrad_tc's MAXT: the taps a block sums in registers (every width: 8 warps of 16 x 16 channels)."""
    return 9


def wgrad_rows(width, filt):
    """RB, the filter rows a backward-filter block covers: all where they fit MAXT, else one (None: a row
    exceeds MAXT)."""
    if filt[0] * filt[1] <= wgrad_max_taps(width):
        return filt[0]
    return 1 if filt[1] <= wgrad_max_taps(width) else None


def wgrad_stage(tile, rows, filt, stride, dil):
    """One ring stage: dy's tile and the x halo of the block's filter rows."""
    hh = (tile[0] - 1) * stride[0] + (rows - 1) * dil[0] + 1
    hw = (tile[1] - 1) * stride[1] + (filt[1] - 1) * dil[1] + 1
    return (tile[0] * tile[1] + hh * hw) * CHANNELS * 2


def wgrad_smem(tile, rows, filt, stride, dil, stages=2):
    """`stages` ring stages (at least the end's hand-over of the sums)."""
    return max(stages * wgrad_stage(tile, rows, filt, stride, dil), WGRAD_RED_BYTES)


def ring_smem(arch):
    """A one-block-a-SM ring's shared-memory budget on `arch` ('sm_90')."""
    try:
        cc = int(str(arch)[3:].rstrip("a"))
    except ValueError:
        cc = 0
    return RING_SMEM if cc >= 90 else RING_SMEM_SM80 if cc in (80, 87) else MAX_SMEM_SMALL


def ring_stages(stage_bytes, fixed_bytes, tiles_per_block, budget=RING_SMEM):
    """The most ring stages (2 .. MAX_STAGES) that fit `budget` beside fixed_bytes, no more than a block's
    tiles need (one computed, the rest in flight)."""
    st = (budget - fixed_bytes) // max(stage_bytes, 1)
    return max(2, min(MAX_STAGES, st, tiles_per_block + 1))


for _t in TC_TAGS:
    for _k in (1, 2):
        add_kernels(unit(_t, _k), SOURCE, exprs(_t, _k))
    add_kernels(wunit(_t), SOURCE, wexprs(_t))


def _halo(tile, filt, stride, dil, mode=0):
    if mode == 1:   # the dy pixels an even-origin dx tile gathers from (a bound: the kernel's HH / HW)
        return [(tile[i] - 1 + (filt[i] - 1) * dil[i]) // 2 + 2 for i in range(2)]
    return [(tile[i] - 1) * stride[i] + (filt[i] - 1) * dil[i] + 1 for i in range(2)]


def smem_bytes(width, tile, filt, stride, dil, mode=0, stages=2):
    """The fragments + `stages` halo buffers (the next stages - 1 tiles' copied while this one's MMAs run)."""
    hh, hw = _halo(tile, filt, stride, dil, mode)
    return prod(filt) * nk(width) * 2048 + stages * hh * hw * CHANNELS * 2


def choose_tile(pb_out_w, width, filt, stride, dil):
    """8 x 16 where the output rows are wider than 8 and the halo fits, else 8 x 8 (None: neither fits)."""
    for tile in TILES:
        if tile[1] > 8 and (pb_out_w <= 8 or max(stride) > 1):
            continue   # stride 2: 8 x 16's halo is 17 x 33 pixels (72 KiB), 2 blocks a SM
        if smem_bytes(width, tile, filt, stride, dil) <= MAX_SMEM:
            return tile
    return None


def refusal(pb, direction):
    """Why the direct kernel does not serve pb (None: it does)."""
    if pb.groups == 1 or pb.tag not in TC_TAGS or pb.math_type == E.PYDNN_FMA_MATH:
        return "not a 16-bit grouped convolution"
    if pb.cg != pb.kg or pb.cg not in WIDTHS:
        return f"C/g {pb.cg}, K/g {pb.kg}: the direct grouped kernel wants C/g == K/g in {WIDTHS}"
    if pb.c % CHANNELS:
        return f"C {pb.c} is not a multiple of {CHANNELS}"
    if pb.filt3[0] != 1 or pb.in3[0] != 1 or pb.out3[0] != 1:
        return "3-d"
    if direction == DIR_BWD_DATA and tuple(pb.stride3) not in ((1, 1, 1), (1, 2, 2)):
        return "backward data with a stride other than 2 x 2 (dgrad_phases / grouped.py serve it)"
    if direction not in (DIR_FWD, DIR_BWD_DATA, DIR_BWD_FILTER):
        return "direction"
    for st in (pb.xs, pb.ys):   # 16-byte chunks of channels
        if st[1] != 1 or any(s % 8 for i, s in enumerate(st) if i != 1):
            return "x / y channels not contiguous in 16-byte chunks"
    if max(pb.n * pb.xs[0], pb.n * pb.ys[0]) >= 2**62:
        return "too large"
    stride = (1, 1) if direction == DIR_BWD_DATA else pb.stride3[1:]
    dil = pb.dil3[1:]
    if direction == DIR_BWD_FILTER:
        rows = wgrad_rows(pb.cg, pb.filt3[1:])
        if rows is None:
            return f"a filter row of {pb.filt3[2]} taps exceeds the backward filter's {wgrad_max_taps(pb.cg)}"
        if wgrad_smem(wgrad_tile(pb.out3[2], stride), rows, pb.filt3[1:], stride, dil) > MAX_SMEM:
            return "the halo exceeds shared memory"
        return None
    if direction == DIR_BWD_DATA and _mode(pb, direction) == 1:
        if smem_bytes(pb.cg, TILE2, pb.filt3[1:], (2, 2), dil, 1) > MAX_SMEM:
            return "the halo and filter exceed shared memory"
        return None
    ow = pb.in3[2] if direction == DIR_BWD_DATA else pb.out3[2]
    if choose_tile(ow, pb.cg, pb.filt3[1:], stride, dil) is None:
        return "the halo and filter exceed shared memory"
    return None


def _mode(pb, direction):
    """0: the forward or its stride-1 backward-data view; 1: backward data at stride 2 x 2."""
    return 1 if direction == DIR_BWD_DATA and tuple(pb.stride3[1:]) == (2, 2) else 0


class GroupedDirectPlan(StepPlan):
    """grouped_frag_pack into the workspace, then grouped_direct_tc (see the module docstring)."""

    def __init__(self, handle, pb, direction, algo):
        super().__init__(direction, algo, pb)
        self.align = 16
        width, taps = pb.cg, prod(pb.filt3)
        self.k_parts = nk(width)
        self.unit = unit(pb.tag, self.k_parts)
        p = base_params(pb, direction)
        p.flags = 0
        filt = pb.filt3[1:]
        self.mode = _mode(pb, direction)
        if direction == DIR_FWD:
            in_hw, out_hw, xs, ys = pb.in3[1:], pb.out3[1:], pb.xs, pb.ys
            pad, stride = pb.pad3[1:], pb.stride3[1:]
        elif self.mode == 1:   # the real problem: dy in, dx out, stride 2
            in_hw, out_hw, xs, ys = pb.out3[1:], pb.in3[1:], pb.ys, pb.xs
            pad, stride = pb.pad3[1:], (2, 2)
        else:  # the virtual forward on dy: dy in, dx out, padding (R - 1) * dil - pad, stride 1
            in_hw, out_hw, xs, ys = pb.out3[1:], pb.in3[1:], pb.ys, pb.xs
            pad = tuple((filt[i] - 1) * pb.dil3[1 + i] - pb.pad3[1 + i] for i in range(2))
            stride = (1, 1)
        dil = pb.dil3[1:]
        for i in range(2):
            p.in_size[1 + i], p.out_size[1 + i] = in_hw[i], out_hw[i]
            p.pad[1 + i], p.stride[1 + i], p.dil[1 + i] = pad[i], stride[i], dil[i]
        for i in range(5):
            p.xs[i], p.ys[i] = xs[i], ys[i]
        self.tile = TILE2 if self.mode == 1 else choose_tile(out_hw[1], width, filt, stride, dil)
        if (self.mode == 0 and self.tile == TILES[0]
                and pb.n * cdiv(out_hw[0], 8) * cdiv(out_hw[1], 16) * (pb.c // CHANNELS) < max(handle.sm_count, 1)):
            self.tile = TILES[1]   # fewer 8 x 16 tiles than SMs (small batches): twice as many 8 x 8 blocks
        th, tw = self.tile
        self.tiles = pb.n * cdiv(out_hw[0], th) * cdiv(out_hw[1], tw)
        cbs = pb.c // CHANNELS
        sms = max(handle.sm_count, 1)
        self.stages, self.resident = 2, RESIDENT
        from ... import tuning
        ring = (tuning.conv.GROUPED_RING_S2 if direction == DIR_FWD and max(stride) > 1
                else tuning.conv.GROUPED_RING_S1 and self.mode == 0)
        if ring and self.tiles * cbs > tuning.conv.GROUPED_RING_ROUNDS * RESIDENT * sms:
            # the large strided forwards: one block a SM, a deeper ring of halos in flight
            hh, hw = _halo(self.tile, filt, stride, dil)
            frag = taps * self.k_parts * 2048
            st = ring_stages(hh * hw * CHANNELS * 2, frag, cdiv(self.tiles * cbs, sms), ring_smem(handle.arch))
            if st > 2:
                self.stages, self.resident = st, 1
        self.smem = smem_bytes(width, self.tile, filt, stride, dil, self.mode, self.stages)
        slots = self.resident * sms
        # persistent where the tiles fill more than two rounds of the resident blocks: per_block tiles a block
        per_block = (1 if self.resident > 1 and self.tiles * cbs <= 2 * slots   # (the ring: always persistent)
                     else cdiv(self.tiles * cbs, slots))
        blocks_x = cdiv(self.tiles, per_block)
        if blocks_x > 2**31 - 1:
            raise PydnnError(NS, "the grouped direct kernel's grid exceeds 2^31 - 1 blocks (split the batch)")
        self.grid = (blocks_x, cbs, 1)
        p.gn = self.stages
        self.gemm = p
        self.gemm_expr = expr(pb.tag, self.k_parts, self.tile, self.mode)
        self.gemm_argv = driver.kernel_args(p)
        self.gemm_func = None
        self.in_hw, self.out_hw, self.conv_stride, self.conv_dil = tuple(in_hw), tuple(out_hw), stride, dil
        self.frag_bytes = pb.c // CHANNELS * taps * self.k_parts * 2048
        self.workspace = round_up(self.frag_bytes)
        f = ConvAuxParams()
        f.groups, f.kg, f.cg, f.taps, f.channels = pb.groups, width, width, taps, pb.c
        for i in range(3):
            f.filt[i] = pb.filt3[i]
        for i in range(5):
            f.in_stride[i] = pb.ws[i]
        f.flags = (FLAG_FLIP if pb.flip else 0) | (PACK_TRANSPOSE if direction == DIR_BWD_DATA else 0)
        self.pack = f
        self.pack_step = self.add_step(self.unit, pack_expr(pb.tag), (cdiv(self.frag_bytes // 4, 256), 1, 1),
                                       (256, 1, 1), f)

    def launch(self, handle, a_ptr, b_ptr, out_ptr, ws_ptr, alpha, beta, z_ptr=0, bias_ptr=0):
        """forward: a = x, b = w, out = y; backward data: a = dy, b = w, out = dx."""
        if a_ptr % 16:
            raise PydnnError(E.PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER,
                             f"the grouped direct kernel reads its input in 16-byte vectors: {a_ptr:#x} is not "
                             f"16-byte aligned")
        f = self.pack
        f.in_, f.out = b_ptr, ws_ptr
        self.run_step(handle, self.pack_step)
        if self.gemm_func is None:
            self.gemm_func = load_function(handle, self.unit, self.gemm_expr, self.smem)
        p = self.gemm
        p.x, p.w, p.out, p.z, p.bias = a_ptr, ws_ptr, out_ptr, z_ptr or None, bias_ptr or None
        p.alpha, p.beta = alpha, beta
        p.flags = (p.flags & ~(FLAG_BETA | FLAG_PAIR)) | (FLAG_BETA if beta != 0 else 0) | (
            FLAG_PAIR if out_ptr % 4 == 0 else 0)
        driver.launch_args(self.gemm_func, self.grid, (THREADS, 1, 1), self.smem, handle.cu_stream, self.gemm_argv)

    def estimate_ms(self, handle, base_estimate):
        """max(DRAM time, shared-memory time) over the filled part of the last wave, plus the pack."""
        pb, it = self.problem, 2
        th, tw = self.tile
        hh, hw = _halo(self.tile, self.problem.filt3[1:], self.conv_stride, self.conv_dil, self.mode)
        blocks = self.tiles * self.grid[1]   # tile-blocks (the persistent grid walks them)
        in_bytes = blocks * hh * hw * CHANNELS * it            # the halos (neighbours' overlap from L2)
        in_bytes = min(in_bytes, 1.5 * pb.n * prod(self.in_hw) * pb.c * it)
        out_bytes = pb.n * prod(self.out_hw) * pb.c * it
        t_dram = (in_bytes + out_bytes + self.frag_bytes) / (DRAM_GBPS * 1e6)
        taps = prod(pb.filt3) if self.mode == 0 else cdiv(pb.filt3[1], 2) * cdiv(pb.filt3[2], 2)  # the busiest warp
        a_bytes = blocks * cdiv(th * tw, 64) * 64 * taps * CHANNELS * it
        sms = max(handle.sm_count, 1)
        t_smem = a_bytes / (sms * SMEM_BYTES_PER_CLK * CLOCK_GHZ * 1e6)
        per_wave = self.resident * sms
        fill = blocks / (cdiv(blocks, per_wave) * per_wave)
        return max(t_dram, t_smem) / max(fill, 0.25) + 2 * LAUNCH_MS


def wgrad_tile(out_w, stride=(1, 1)):
    """8 x 16 where the rows are wide and the stride 1 (two stages of a stride-2 8 x 16 halo: 176 KiB)."""
    return TILES[0] if out_w > 8 and max(stride) == 1 else TILES[1]


WGRAD_BLOCKS_PER_SM = 1     # splits: one block of 8 warps a SM (its ring up to RING_SMEM)
WGRAD_MAX_PARTIALS = 64 << 20
# (C/g, strided) -> blocks a SM the direct backward filter's splits plan for (0: WGRAD_BLOCKS_PER_SM) where it
# measured faster than grouped.py's packed plan; absent: the packed plan (_direct_measured_faster;
# tuning.conv.GROUPED_WGRAD_BLOCKS overrides the blocks).
# Mid-session run 3 (H200, graph timing, ms direct 8-warp NT / packed, cuDNN):
#   C/g 4:  N128 0.141 / -, 0.252 (1.79x); N8 0.019 / -, 0.031 (1.60x)   (the 4-warp kernel: 0.292 at N128)
#   C/g 8:  N128 0.090 / 0.163, 0.072; N8 0.0187 / 0.0197, 0.0147; stride 2 N128 0.184 / 0.164, N8 0.0245 /
#           0.0195: direct at stride 1 only
#   C/g 16: N128 0.109 / 0.091 (stride 2 0.196 / 0.092), N8 0.023 / 0.015; C/g 32: N128 0.098 / 0.057, N8
#           0.024 / 0.017: packed
WGRAD_MEASURED = {(4, False): 0, (4, True): 0, (8, False): 0}


def wgrad_model_ms(pb, sms, tile, rows, splits):
    """The backward filter's model: max(DRAM: dy, x's halos (a tile's row blocks run side by side: their
    repeats from L2, the loads capped at 1.5x dy and x), the fp32 partials written and read by the fold;
    L2: every block's copies; shared memory: the B fragments, 128 bytes a pixel a tap and k16 part, and A)
    over the filled part of one block a SM, plus two launches."""
    it = 2
    th, tw = tile
    filt, stride, dil = pb.filt3[1:], pb.stride3[1:], pb.dil3[1:]
    row_blocks = filt[0] // rows
    hh = (th - 1) * stride[0] + (rows - 1) * dil[0] + 1
    hw = (tw - 1) * stride[1] + (filt[1] - 1) * dil[1] + 1
    cbs = pb.c // CHANNELS
    tiles = pb.n * cdiv(pb.out3[1], th) * cdiv(pb.out3[2], tw)
    partial_bytes = splits * pb.k * prod(filt) * pb.cg * 4
    loads = tiles * cbs * row_blocks * (th * tw + hh * hw) * CHANNELS * it
    dram = min(loads, 1.5 * (pb.n * prod(pb.out3) + pb.n * prod(pb.in3)) * pb.c * it) + 2 * partial_bytes
    t_dram = dram / (DRAM_GBPS * 1e6)
    t_l2 = loads / (L2_GBPS * 1e6)
    smem = tiles * cbs * th * tw * CHANNELS * it * (prod(filt) * nk(pb.cg) + row_blocks)
    t_smem = smem / (sms * SMEM_BYTES_PER_CLK * CLOCK_GHZ * 1e6)
    fill = min(1.0, splits * row_blocks * cbs / sms)
    return max(t_dram, t_l2, t_smem) / max(fill, 0.25) + 2 * LAUNCH_MS


class GroupedWgradPlan(StepPlan):
    """grouped_wgrad_tc into fp32 partials, then grouped_wgrad_fold (see the module docstring)."""

    def __init__(self, handle, pb, algo):
        super().__init__(DIR_BWD_FILTER, algo, pb)
        self.unit = wunit(pb.tag)
        self.align = 16
        width, taps = pb.cg, prod(pb.filt3)
        self.k_parts = nk(width)
        filt, stride, dil = pb.filt3[1:], pb.stride3[1:], pb.dil3[1:]
        from ... import tuning
        measured = WGRAD_MEASURED.get((width, max(stride) > 1)) or 0
        per_sm = tuning.conv.GROUPED_WGRAD_BLOCKS or measured or WGRAD_BLOCKS_PER_SM
        self.tile = wgrad_tile(pb.out3[2], stride)
        th, tw = self.tile
        cbs = pb.c // CHANNELS
        self.tiles = pb.n * cdiv(pb.out3[1], th) * cdiv(pb.out3[2], tw)
        if self.tiles >= 2**31:
            raise PydnnError(NS, "the grouped backward filter walks at most 2^31 - 1 tiles (split the batch)")
        per_split = pb.k * taps * width * 4
        sms = max(handle.sm_count, 1)
        # all the filter rows a block, or one (more blocks a split: fewer splits of partials where the
        # tiles are few), by the model
        best = None
        for rows in dict.fromkeys((wgrad_rows(width, filt), 1)):
            row_blocks = filt[0] // rows
            # the NT = 3, C/g <= 16 kernels hold <= 122 registers: two blocks a SM (half the ring each)
            pair = 2 if rows * filt[1] == 3 and self.k_parts == 1 else 1
            splits = cdiv(per_sm * pair * sms, row_blocks * cbs)
            splits = max(1, min(splits, self.tiles, WGRAD_MAX_PARTIALS // per_split, 65535 * 16 // row_blocks))
            cost = wgrad_model_ms(pb, sms, self.tile, rows, splits)
            if best is None or cost < best[0]:
                best = (cost, rows, row_blocks, splits, pair)
        _, self.rows, self.row_blocks, splits, self.resident = best
        self.splits = splits
        self.stages = ring_stages(wgrad_stage(self.tile, self.rows, filt, stride, dil), 0, cdiv(self.tiles, splits),
                                  ring_smem(handle.arch) // self.resident)
        self.smem = wgrad_smem(self.tile, self.rows, filt, stride, dil, self.stages)
        self.grid = (splits * self.row_blocks, cbs, 1)
        p = base_params(pb, DIR_BWD_FILTER)
        p.flags = 0
        p.gk, p.gm, p.gn, p.splits = self.rows, self.row_blocks, self.stages, splits
        self.gemm = p
        self.nt = self.rows * filt[1] if self.rows * filt[1] in WGRAD_NT else 0
        self.gemm_expr = wgrad_expr(pb.tag, self.k_parts, self.tile, self.nt)
        self.gemm_argv = driver.kernel_args(p)
        self.gemm_func = None
        self.partial_bytes = splits * per_split
        self.workspace = round_up(self.partial_bytes)
        f = ConvAuxParams()
        f.groups, f.kg, f.cg, f.taps, f.splits = pb.groups, width, width, taps, splits
        f.channels = self.fold_lanes = min(32, 1 << max(0, (splits - 1).bit_length()))   # G lanes an element
        for i in range(3):
            f.filt[i] = pb.filt3[i]
        for i in range(5):
            f.out_stride[i] = pb.ws[i]
        f.flags = FLAG_FLIP if pb.flip else 0
        self.fold_params = f
        self.fold_step = self.add_step(self.unit, wfold_expr(pb.tag),
                                       (cdiv(per_split // 4 * self.fold_lanes, 256), 1, 1), (256, 1, 1), f)

    def launch(self, handle, a_ptr, b_ptr, out_ptr, ws_ptr, alpha, beta, z_ptr=0, bias_ptr=0):
        """a = dy, b = x, out = dw."""
        if a_ptr % 16 or b_ptr % 16:
            raise PydnnError(E.PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER,
                             f"the grouped backward filter reads dy and x in 16-byte vectors: both must be "
                             f"16-byte aligned (dy {a_ptr:#x}, x {b_ptr:#x})")
        if self.gemm_func is None:
            self.gemm_func = load_function(handle, self.unit, self.gemm_expr, self.smem)
        p = self.gemm
        p.x, p.w, p.out = a_ptr, b_ptr, ws_ptr
        driver.launch_args(self.gemm_func, self.grid, (WTHREADS, 1, 1), self.smem, handle.cu_stream, self.gemm_argv)
        f = self.fold_params
        f.out, f.in_, f.alpha, f.beta = out_ptr, ws_ptr, alpha, beta
        f.flags = (f.flags & ~FLAG_BETA) | (FLAG_BETA if beta != 0 else 0)
        self.run_step(handle, self.fold_step)

    def estimate_ms(self, handle, base_estimate):
        return wgrad_model_ms(self.problem, max(handle.sm_count, 1), self.tile, self.rows, self.splits)


def _packed_rival(handle, pb, direction, algo):
    """grouped.py's packed-supergroup plan of the same problem (None where it does not apply, and for
    stride-2 backward data, whose rival is dgrad_phases' several launches)."""
    from . import grouped
    if direction == DIR_BWD_DATA and _mode(pb, direction) == 1:
        return None
    if not grouped.applies(pb, direction):
        return None
    try:
        return grouped.GroupedPlan(handle, pb, direction, algo, grouped.packing(pb))
    except PydnnError:
        return None


def _direct_measured_faster(handle, pb, direction, pl):
    """Where the direct kernels beat the packed supergroups (mid-session run 2, H200, ResNeXt-50's grouped
    layers at N 128 and 8, graph timing, ms direct / packed):
      forward, backward data at stride 1: always (N128 stage 1 0.121 / 0.342, stage 4 0.034 / 0.055; N8
        0.0075-0.0144 / 0.019-0.027); stride-2 backward data has no packed rival here (dgrad_phases).
      forward at stride 2: at N 8 (0.0088-0.0141 / 0.019-0.021), not at N 128 (0.187 / 0.178, 0.099 / 0.097,
        0.065 / 0.054): direct while its tiles fill at most 4 rounds of the resident blocks.
      backward filter (the first, 4-warp kernel): only C/g = 4 (N128 0.292 / 0.307, N8 0.0315 / 0.0325);
        1.1-2.7x slower than the packed plan for C/g = 8, 16, 32. The 8-warp kernel with compile-time taps:
        C/g = 4 and C/g = 8 at stride 1 (WGRAD_MEASURED holds run 3's numbers).
    The large strided forwards on one block a SM with the deeper ring (tuning.conv.GROUPED_RING_S2) too."""
    if direction == DIR_BWD_FILTER:
        return (pb.cg, max(pb.stride3) > 1) in WGRAD_MEASURED
    if direction == DIR_FWD and max(pb.stride3) > 1:
        return pl.stages > 2 or pl.tiles * pl.grid[1] <= 4 * RESIDENT * max(handle.sm_count, 1)
    return True


def _planner(direction):
    def plan(handle, pb, d, algo):
        from ... import tuning
        if not tuning.conv.GROUPED_DIRECT or refusal(pb, direction) is not None:
            return None   # pass: grouped.py's packed supergroups (or their refusal) answer
        if direction == DIR_BWD_FILTER:
            pl = GroupedWgradPlan(handle, pb, algo)
        else:
            pl = GroupedDirectPlan(handle, pb, direction, algo)
        if not tuning.conv.GROUPED_DIRECT_ALWAYS and _packed_rival(handle, pb, direction, algo) is not None:
            if not _direct_measured_faster(handle, pb, direction, pl):
                return None   # grouped.py's packed supergroups serve (the next candidate)
        return pl
    return plan


register(DIR_FWD, E.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, order=-3)(_planner(DIR_FWD))
register(DIR_BWD_DATA, E.PYDNN_CONVOLUTION_BWD_DATA_ALGO_1, order=-3)(_planner(DIR_BWD_DATA))
register(DIR_BWD_FILTER, E.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_1, order=-3)(_planner(DIR_BWD_FILTER))
