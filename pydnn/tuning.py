"""Tuning switches: every knob that changes which kernel, tiling or path a planner picks, in one place.

The planners read these when they make a plan (not per launch), so a change applies to plans made after
it; a handle's cached plans keep what they were made with. The defaults are what the benchmarks in
tools/ chose (the reasons are beside each switch and, in full, in tools/PERF.md). Three ways to set them:

* tests and code: `pydnn.tuning.conv.USE_WGM = False`, pytest's `monkeypatch.setattr(tuning.conv,
  "USE_WGM", False)`, or `with pydnn.tuning.override({"conv.USE_WGM": False}): ...`;
* the environment, read once at import (for benchmarks): `PYDNN_TUNING="conv.USE_WGM=False;
  conv_gemm.COL_LIMIT=1048576"` (values are Python literals; `;` or `,` between settings);
* `python -m pydnn tuning` lists every switch with its value and what it does.

This module imports nothing else of pydnn: every layer may read it.
"""
import ast
import builtins
import contextlib
import ctypes
import itertools
import logging
import os

_log = logging.getLogger("pydnn")


# bumped by every set or reset of a switch: a record that keeps what a call decided under the switches can key
# on it (session 30's batch-norm replay did; removed in session 31)
GENERATION = [0]

# The call records' generation, readable from C: bumped (bump_records) by every set or reset of a switch and,
# through status.api, by every call that changes a descriptor or a handle (a Set*, Destroy*, Derive*, restore,
# backend attribute / finalize, set_stream). Records that skip those checks are valid only while it is
# unchanged: libpydnn's C fast path (pydnn/capi/fastpath.py) and activation_forward's compiled entry
# (pydnn/_build/fastcall.py's act_fwd). Each bump stores a value never stored before (a count, not `+= 1`, so
# two threads bumping at once cannot store the same value twice); an aligned 8-byte store, read by C without
# the GIL. Not in GENERATION: _replay's keys must survive descriptor Sets of other descriptors.
RECORDS_GEN = (ctypes.c_uint64 * 1)(1)
_records_count = itertools.count(2)


def bump_records():
    RECORDS_GEN[0] = next(_records_count)


def records_gen_address():
    return ctypes.addressof(RECORDS_GEN)


class Switches:
    """One family's switches: plain attributes, documented, resettable to their defaults."""

    def __init__(self, family, doc, **switches):
        object.__setattr__(self, "_family", family)
        object.__setattr__(self, "_doc", doc)
        object.__setattr__(self, "_defaults", {k: v for k, (v, _) in switches.items()})
        object.__setattr__(self, "_docs", {k: d for k, (_, d) in switches.items()})
        for k, (v, _) in switches.items():
            object.__setattr__(self, k, _fresh(v))
        FAMILIES[family] = self

    def __setattr__(self, name, value):
        if name not in self._defaults:
            raise AttributeError(f"pydnn.tuning.{self._family} has no switch {name!r} "
                                 f"(switches: {', '.join(self._defaults)})")
        object.__setattr__(self, name, value)
        GENERATION[0] += 1
        bump_records()

    def names(self):
        return tuple(self._defaults)

    def reset(self):
        for k, v in self._defaults.items():
            object.__setattr__(self, k, _fresh(v))
        GENERATION[0] += 1
        bump_records()

    def describe(self):
        lines = [f"{self._family}: {self._doc}"]
        for k in self._defaults:
            lines.append(f"  {self._family}.{k} = {getattr(self, k)!r}   (default {self._defaults[k]!r})")
            lines.append(f"      {self._docs[k]}")
        return "\n".join(lines)


def _fresh(v):
    """A default's own copy (a dict / set switch such as conv.TC_FORCE is mutated in place by callers)."""
    return type(v)(v) if isinstance(v, (dict, builtins.set)) else v


FAMILIES = {}


def _split(name):
    family, _, switch = name.partition(".")
    if family not in FAMILIES or switch not in FAMILIES[family].names():
        raise KeyError(f"unknown tuning switch {name!r} (families: {', '.join(FAMILIES)})")
    return FAMILIES[family], switch


def get(name):
    fam, switch = _split(name)
    return getattr(fam, switch)


def set(name, value):  # noqa: A001 - the natural verb beside get
    fam, switch = _split(name)
    setattr(fam, switch, value)


@contextlib.contextmanager
def override(settings):
    """Set {"family.SWITCH": value, ...} for the duration of a with block, then restore."""
    saved = {name: get(name) for name in settings}
    try:
        for name, value in settings.items():
            set(name, value)
        yield
    finally:
        for name, value in saved.items():
            set(name, value)


def reset():
    for fam in FAMILIES.values():
        fam.reset()


def describe():
    return "\n\n".join(fam.describe() for fam in FAMILIES.values())


def _items(text):
    """`text` split at ';' and at ',' outside brackets (a tuple or set literal keeps its commas)."""
    out, depth, cur = [], 0, []
    for ch in text:
        depth += (ch in "([{") - (ch in ")]}")
        if ch == ";" or (ch == "," and depth <= 0):
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return out


def apply_environment(text=None):
    """Apply PYDNN_TUNING (or `text`): `family.SWITCH=literal` settings separated by ';' or ',' (commas inside
    brackets belong to the literal: `activation.PLAIN_ACCESS=(1, 2)`)."""
    text = os.environ.get("PYDNN_TUNING", "") if text is None else text
    for item in _items(text):
        if not item.strip():
            continue
        name, eq, value = item.partition("=")
        try:
            if not eq:
                raise ValueError("expected family.SWITCH=value")
            set(name.strip(), ast.literal_eval(value.strip()))
        except (KeyError, ValueError, SyntaxError, AttributeError) as e:
            _log.warning("PYDNN_TUNING: ignoring %r: %s", item.strip(), e)


# ----------------------------------------------------------------------------- convolution

conv = Switches(
    "conv", "the tensor-core implicit GEMMs (pydnn/ops/convolution/tensor_core.py)",
    USE_WGM=(True, "sm_90: the model picks fwd_wgmma (Hopper wgmma) over implicit_gemm_pipe_tc where it "
                   "applies (channels % 64 == 0, >= WGM_MIN_KTILES K tiles a block): 1.11-1.42x on the "
                   "ResNet layers (tools/bench_convolution.py)"),
    WGM_SPLIT=(None, "fwd_wgmma's split-K (forward and stride-1 backward data on too few blocks for the SMs: "
                     "fp32 partials of K-tile slices, fwd_split_fold ends the call): None the model "
                     "(tensor_core._wgm_split), 1 never, S > 1 forced S slices (where the kernel applies and "
                     "the reduction has S K tiles; the GPU tests' form). Issue 18's sweep: 63 fwd_wgmma points "
                     "at under half a wave read 0.56x cuDNN (N8 3x3 512->512 @7: 32 blocks of 72 K tiles)"),
    FWD_TMA=(True, "sm_90: a call's own unsplit fwd_wgmma forward plan runs fwd_tma instead (the warp-specialized "
                    "TMA + mbarrier kernel, pydnn/ops/convolution/conv_tma.py) where it applies (16-bit NHWC, "
                    "stride 1, 2-d, one group, packed KRSC filter, C % 8 == 0): True where K >= conv_tma.MIN_K "
                    "and no tiling is forced, \"always\" also under a forced tiling (tests, benchmarks), False "
                    "never (tools/bench_conv_tma.py; H200 mid-session run 3: 1.10-1.30x fwd_wgmma on 11 forward "
                    "rows, geomean vs cuDNN 0.594 -> 0.706)"),
    FWD_TMA_STRIDED=(True, "sm_90: FWD_TMA for strided forwards too (stride 2..8 along H / W): x's TMA box spans "
                           "tw * stride columns (th * stride rows) and loads every stride-th pixel (the map's element "
                           "strides), so a strided tap's window is one box as a stride-1 one. True where FWD_TMA takes "
                           "the problem and fwd_tma has a wave of items (conv_tma.STRIDED_MIN_WAVES), \"always\" also "
                           "under a wave, False never. H200 (session 33 mid-session run, plain stores, "
                           "tools/bench_conv_tma_routes.py --set strided, the sweep's 24 one-group strided forwards on "
                           "fwd_wgmma): fwd_tma / fwd_wgmma 1.205 geomean over the 10 points with >= a wave of items "
                           "(0.878-1.364), 0.978 over the 14 under a wave (0.774-1.253)"),
    FWD_TMA_WIDE=(True, "fwd_tma's plain epilogue (alpha only) stores 16 bytes a lane (a quad's 4 x 4 transpose of "
                        "packed pairs, ptx/common/quad.cuh, as matmul's gemm_tma WIDE store: whole 32-byte sectors a "
                        "warp store instead of half ones) where y's channels are contiguous, its rows 16-byte aligned "
                        "and K % 8 == 0; the fused bias (+ ReLU) without z too (so the fused call keeps the plain "
                        "call's stores: not timed apart). H200 (session 33 mid-session run, "
                        "tools/bench_conv_tma_routes.py --set 1x1: "
                        "30 memory-bound 1x1 points on fwd_tma): 2.1-3.0x the 4-byte pair stores at the same tile "
                        "(0.335 -> 0.802 of cuDNN geomean; e.g. N64 1x1 64->256 @56 0.1415 -> 0.0459 ms, cuDNN 0.0406)"),
    FWD_TMA_BN=(None, "fwd_tma's tile width in output channels (64, 128 or 256); None: conv_tma._bn's choice"),
    DGRAD_TMA=(True, "sm_90: a call's own unsplit stride-1 backward-data plan on fwd_wgmma runs fwd_tma instead "
                     "(the forward of dy; B read MN-major from the packed KRSC filter by TMA, or from "
                     "filter_kc_swap's copy where the replaced plan is the swap's; conv_tma.tma_dgrad_top): True "
                     "where C >= conv_tma.MIN_K, no tiling is forced and conv_tma.slower_than_replaced does not "
                     "object (its under-a-wave mark: fwd_tma at the 64-wide tile, conv_tma.UNDER_WAVE), \"always\" "
                     "also under a forced tiling (tests, benchmarks), False never (tools/bench_dgrad_tma.py; H200 "
                     "session 32: fwd_tma / fwd_wgmma 1.10-1.30x on 11 rows, 1.146x geomean over the sweep's 82 "
                     "stride-1 points with the rule; session 33: BN 64 under a wave 1.13-1.50x on 12; its units "
                     "compile on first use, pydnn/_build/rare.py)"),
    DGRAD_TMA_PHASES=(True, "as DGRAD_TMA for the stride-1 phases of a strided backward data (dgrad_phases.py): "
                            "each phase's fwd_wgmma plan on fwd_tma (B through a 4-d map of the phase's sub-filter "
                            "view). True where the phase's output tiles are at least conv_tma.PHASE_MIN_FILL full "
                            "(dx's C / (BN * tiles)), \"always\" every phase fwd_tma takes, False never. H200 (session "
                            "33 mid-session run, plain stores, tools/bench_dgrad_tma.py --phases, the sweep's 15 "
                            "strided one-group points): phases on fwd_tma / on fwd_wgmma 1.134 geomean over the 12 "
                            "with tiles >= 0.9 full (0.896-1.758), 0.638 over the 3 under (fill 0.59-0.63)"),
    TMA_1X1=(True, "sm_90: a call's own direct 1x1 GEMM-algorithm plan (gemm.py: matmul on x / dy itself, 16-bit "
                   "NHWC) whose matmul runs the mma.sync gemm_tc tile (reductions under matmul.WG_MIN_K: one block a "
                   "tile, its loads not overlapped with its stores, ~1.1 TB/s) runs fwd_tma instead (forward: the "
                   "problem itself; backward data: DgradTmaPlan), the GEMM plan kept as the fallback and the "
                   "estimate: True where fwd_tma takes it (conv_tma.gemm1x1_top), \"always\" the same, False never. "
                   "H200 (session 33 mid-session run, tools/bench_conv_tma_routes.py --set 1x1, the sweep's 30 such "
                   "points): fwd_tma with the 16-byte store (FWD_TMA_WIDE) / the GEMM plan 2.11x geomean (0.97-2.57), "
                   "0.380 -> 0.802 of cuDNN (0.881 at the best tile width); with 4-byte stores it was 0.88x"),
    WGRAD_MM=(True, "sm_90: a call's own 1x1 stride-1 unpadded backward filter of 16-bit NHWC x / dy runs as one "
                    "pydnn.ops.matmul GEMM, dw = dy^T x over the N * P pixels, with matmul's split-K "
                    "(pydnn/ops/convolution/wgrad_mm.py), the replaced plan kept as the fallback and the estimate: "
                    "True where C * K >= wgrad_mm.MIN_CK and N * P >= MIN_ROWS, \"always\" wherever it fits, False "
                    "never. H200 (session 33, tools/bench_conv_tma_routes.py --set wgrad, the sweep's 73 1x1 backward "
                    "filters): 1.209x geomean over the 17 the rule takes (0.959-1.475), 0.317x over the rest"),
    WGM_BWD_SWAP=(False, "backward data on fwd_wgmma through filter_kc_swap + the forward even where "
                         "fwd_wgmma reads B straight from the filter (the direct plan: no swap, no "
                         "workspace, 1.05-1.13x the swap on the H100)"),
    DGRAD_PHASES=(True, "backward data with a stride > 1 on tensor cores as stride-1 phase sub-problems "
                        "(pydnn/ops/convolution/dgrad_phases.py: no tap gathered that the stride zeroes); "
                        "off: the stride-s bwd_data_tc, which visits every tap for every dx position"),
    BWD_TAIL_FILL=(0.5, "backward data: the model takes the pipelined / wgmma kernels for a dy channel count K "
                        "that is not a multiple of 64 where K / (64 * ceil(K / 64)) is at least this (the "
                        "rest of the last K tile zero-filled); above 1: never (bwd_data_tc). H200, forced "
                        "fwd_wgmma against bwd_data_tc: K 112 (3x3/2 phases) 0.114 vs 0.158 ms, K 880 (3x3) "
                        "0.97-1.45 vs 2.80 ms, K 752 (1x1) 0.19-0.21 vs 0.34 ms"),
    FWD_TAIL_FILL=(0.5, "forward: the model takes the pipelined / wgmma kernels for a channel count C that is not "
                        "a multiple of 64 where C / (64 * ceil(C / 64)) is at least this (the last K tile's "
                        "rest zero-filled, the kernels' channel tails: GPU-tested under forced tilings); above "
                        "1: never (fwd_tc, 32-deep K tiles). Issue 18: C = 96, 144, 152, 176 ran on fwd_tc at "
                        "~86 TFLOP/s (median, H200) where fwd_wgmma runs ~340 on full tiles"),
    WG_PIPE=(True, "the backward filter's model picks wgrad_pipe_tc where it applies (else wgrad_tc)"),
    GROUPED_DIRECT_ALWAYS=(False, "the direct grouped kernels wherever they apply; off: where they measured "
                                  "faster than grouped.py's packed plan (grouped_direct._direct_measured_faster: "
                                  "forward / backward data, not the large strided forwards, the backward filter "
                                  "for C/g = 4 only); the GPU tests of the direct kernels turn it on"),
    NARROW_1X1=(True, "1x1 stride-1 unpadded convolutions with K <= 8 output channels (8 <= C <= 256, packed NHWC, "
                      "16-bit): memory-bound streams (narrow.py) ranked by the model; the UNet head 64 -> 2 ran "
                      "the CUDA-core implicit GEMM at 0.05-0.08x cuDNN (issue 18's sweep)"),
    STREAM_1X1=(True, "1x1 stride-1 unpadded 16-bit convolutions with a short reduction (forward C, backward data "
                      "K: a multiple of 8 up to 128; the other side up to 512, on sm_90 up to 128 where the reduction "
                      "is >= matmul.WG_PERSIST_MIN_K: stream.wgmma_takes; packed NHWC) as persistent tensor-core "
                      "streams (stream.py: the filter in shared memory, 64-pixel tiles through a 4-deep cp.async "
                      "ring). H200, the whole sweep with it on: its 14 1x1 rows 0.54-1.14x cuDNN where "
                      "implicit_gemm_pipe_tc / fwd_tma ran 0.27-1.12x (N32 64 -> 64 forward 0.27 -> 0.62, 32 -> 400 "
                      "0.40 -> 0.90, 40 -> 280 0.32 -> 0.79), and the sub-plans of the UNet's 3x3 3 -> 64 "
                      "(0.52-0.62 -> 0.78-1.31)"),
    GROUPED_DIRECT=(True, "grouped convolutions with C/g == K/g in 4..32 (ResNeXt's grouped 3x3): forward and "
                          "stride-1 backward data on the direct tensor-core kernel (grouped_direct.py: one "
                          "launch over all groups, the halo read once, block-diagonal MMAs only) before "
                          "grouped.py's packed supergroups (0.28-0.61x cuDNN on the sweep's ResNeXt layers)"),
    GROUPED_RING_S2=(False, "the direct grouped forward at stride 2 with more tiles than 4 rounds of 3 resident "
                            "blocks (ResNeXt's N >= 32 strided layers) on one block a SM with a ring of up to 6 "
                            "halo buffers in flight instead of 2 blocks of 2; off: measured slower (H200, N128: "
                            "0.235 / 0.123 / 0.069 ms against 0.187 / 0.099 / 0.065), the packed plan serves"),
    GROUPED_RING_S1=(False, "the same ring for the stride-1 direct forward and backward data (as measured: 3 blocks "
                            "a SM of two buffers; the ring is the candidate for N128's 7 x 7 / 14 x 14 layers)"),
    GROUPED_WGRAD_BLOCKS=(0, "blocks a SM the direct grouped backward filter's splits plan for (0: as measured, "
                             "grouped_direct.WGRAD_MEASURED, else 1)"),
    GROUPED_RING_ROUNDS=(4, "GROUPED_RING_S2 applies past this many rounds of 3 resident blocks a SM (below it, two "
                            "buffers in 2-3 blocks a SM)"),
    TC_STAGED_PLAIN=(False, "the plain tensor-core forward through the shared-memory staged epilogue too "
                            "(FLAG_STAGED; the fused bias / z / activation and beta != 0 always take it)"),
    TC_FORCE=({}, "direction -> a tiling used instead of the model's choice: (BM, BN) for fwd_tc / "
                  "bwd_data_tc, a TCP_TILES entry for the pipelined kernels, a WGM_TILES / WGM_VARIANTS "
                  "entry for fwd_wgmma, (BM, splits) for wgrad_tc or (a WGP_TILES entry, splits) for "
                  "wgrad_pipe_tc, (a wgrad_wgmma TILES entry, splits[, full, tail_splits]) for the wgmma "
                  "backward filter; each used where its kernel applies, else the model's choice"),
)

conv_gemm = Switches(
    "conv_gemm", "the explicit-GEMM convolutions (pydnn/ops/convolution/gemm.py)",
    IMPLICIT=(True, "BWD_FILTER_ALGO_3's implicit variant (wgrad_implicit) serves the float problems it "
                    "applies to (<= 160 columns): the fp32 7x7/2 stem 1.23x cuDNN where the explicit GEMMs "
                    "ran 0.65x; off, they take the explicit GEMMs"),
    COL_LIMIT=(256 << 20, "workspace bytes of column matrix (+ packed dy) per chunk of images"),
    PART_LIMIT=(64 << 20, "workspace bytes of partial dw's (per-image plans over it add later chunks "
                          "into the first chunk's partials)"),
    MIN_SPLIT_ROWS=(256, "a backward-filter split's reduction is at least this many rows (shorter ones "
                         "are all epilogue)"),
    MM_1X1=(True, "16-bit 1x1, stride-1, unpadded convolutions through pydnn.ops.matmul (issue 18): "
                  "FWD_ALGO_GEMM as one matmul on x itself, BWD_DATA_ALGO_0 as one matmul into dx (H200: "
                  "1.2-1.6x the implicit GEMMs on the N128 ResNet 1x1 layers with C >= 512); Get..._v7 ranks them "
                  "against the implicit GEMMs by the tile model (gemm.mm16_ms), Find by timing. Off: the "
                  "GEMM algorithm's im2col + implicit 1x1, ALGO_0 the CUDA-core gather"),
    VIEW_TAIL_FILL=(2.0, "the GEMM algorithm's tensor-core 1x1 view of its column matrix takes the pipelined / wgmma "
                         "kernels for a column count whose tail fills at least this of its 64-deep K tile (as "
                         "tuning.conv.FWD_TAIL_FILL for the forward itself); above 1: never (fwd_tc, as measured "
                         "on the stem: 0.227 ms over 152 columns, H200)"),
    MM_COLS=(False, "16-bit FWD_ALGO_GEMM over an im2col of several taps (3x3, 5x5, 7x7): the column matrix times "
                   "the filter on pydnn.ops.matmul (True), on the tensor-core implicit 1x1 view (False), or "
                   "whichever the model (gemm.mm16_ms against the view's estimate) says is faster (None). False until "
                   "measured: the stem's view (fwd_tc 0.227 ms) beat matmul's gemm_tc (0.296, H200)"),
    MM_FUSED=(True, "ConvolutionBiasActivationForward on a direct 16-bit 1x1 GEMM plan (FWD_ALGO_GEMM on x itself) "
                    "as the graph API's fused matmul (pydnn.ops.matmul's tile, the bias + activation generated into "
                    "its epilogue; alpha1 1, alpha2 0 or 1, IDENTITY or RELU NOT_PROPAGATE_NAN); off or otherwise: "
                    "the tensor-core implicit GEMM of the problem with its own epilogue (1.50x the plain call on "
                    "N32 1x1 512->2048 @7, H200, session 29); \"tma\": fwd_tma's fused epilogue (conv_tma.py) "
                    "where it takes the problem"),
)

conv_winograd = Switches(
    "conv_winograd", "WINOGRAD_NONFUSED (pydnn/ops/convolution/winograd.py)",
    PREFERRED_TILE=(4, "the output tile m of F(m x m, 3 x 3) (2 or 4): F(4x4) does 4x fewer multiplies "
                       "than direct (F(2x2) 2.25x) for a 2.25x expansion of x and y in the workspace (4x); "
                       "tests pin each tile through this"),
    WGRAD_FORCE_SPLITS=(None, "the backward filter's split S of the tiles (None: the model's choice)"),
    WGRAD_LAYOUT=(None, "the backward filter's U / D layout: 'tile' (tiles fastest) or 'chan' (channels "
                        "fastest, one group); None: channels fastest for NHWC-like x, else tiles"),
)

conv_wgrad_wgmma = Switches(
    "conv_wgrad_wgmma", "the wgmma backward filter (pydnn/ops/convolution/wgrad_wgmma.py)",
    ENABLED=(True, "BWD_FILTER_ALGO_1 on sm_90 takes wgrad_tc_wgmma where it applies"),
    FORCE=(None, "(a TILES / VARIANTS entry, splits[, full, tail_splits]) instead of the model's choice"),
)

# ----------------------------------------------------------------------------- the other families

batchnorm = Switches(
    "batchnorm", 'batch normalization (pydnn/ops/batchnorm.py)',
    FAST16=(True, '16-bit data with 16-byte vectors (FAST16): kUnroll16 rows in flight in fwd_stats (bf16) and the '
                  'plain forward apply (fwd_apply_plain, with fwd_head_batched); stats launched as one wave of '
                  'STATS16_BLOCKS_PER_SM long blocks per SM (...; the reasons: pydnn/ops/batchnorm.py'),
    INFER_SMEM=(True, "inference with vector launches: infer_rows_smem (the block's per-feature set-up computed once"
                      " per feature into shared memory, after the first rows' loads are issued), blocks of "
                      'INFER_STEPS kUnroll-row steps per thread; the reasons: pydnn/ops/batchnorm.py'),
    INFER_STEPS=(2, "kUnroll-row steps per thread of infer_rows_smem's blocks: 2 steps 88.3% of copy, 4: 86.0%, 8: "
                    '82.5% (H200, bf16 64x256x56x56); the reasons: pydnn/ops/batchnorm.py'),
    APPLY_SAVED=(True, 'The plain training forward with saved statistics (resultSaveMean / resultSaveInvVariance '
                       "given): its apply is fwd_apply_saved (infer_rows_smem's short blocks, INFER_STEPS steps, "
                       'constants from bnScale / bnBias and the saved mean /...; the reasons: pydnn/ops/batchnorm.py'),
    PLANES=(True, 'fwd_planes / bwd_planes: the gen kernels (a block per feature) with 16-byte vectors along a '
                  'contiguous innermost reduction dim (NCHW SPATIAL, H * W a multiple of the vector); False: the '
                  'scalar gen kernels; the reasons: pydnn/ops/batchnorm.py'),
    NCHW_SPLIT=(True, 'packed NCHW / NCDHW SPATIAL through the nc kernels (stats split over items of a channel, '
                      'final, a flat 16-byte apply; inference a flat apply); False: gen / planes (a block per '
                      'channel); the reasons: pydnn/ops/batchnorm.py'),
    NC_GEN_ROWS=(2048, 'the training forward keeps gen / planes (one launch, a block per channel) when N * H * W '
                       '<= this; 0: the nc kernels for every packed NCHW shape they fit; the reasons: '
                       'pydnn/ops/batchnorm.py'),
    ROWS_MID=(False, 'row kernels (NHWC SPATIAL) at a narrower vector (8- / 4-byte accesses) when the channel '
                     'count or a row stride is not a multiple of the 16-byte vector but of that one (else 1-element '
                     'accesses); GPU-tested, not yet timed on its own, so off; the reasons: pydnn/ops/batchnorm.py'),
    ROWS_FLAT=(False, 'NHWC rows whose channel count is not a multiple of the 16-byte vector: the statistics on the '
                      'row kernels, the apply on nc_apply with flat 16-byte vectors (each lane its own channel). '
                      'Off: slower on the H200 (bn_bwd NHWC 105x405x82x82 bf16 5.01 ms against 1.89 on the '
                      'scalar rows, 39x1315x23x23 fp32 0.372 against 0.276 ms); the reasons: '
                      'pydnn/ops/batchnorm.py'),
    GEN_TINY=(262144, 'training / backward calls of at most this many elements (and at most 4096 reduction rows) '
                     'take the single gen launch instead of the rows / nc sequences; 0: off; the reasons: '
                     'pydnn/ops/batchnorm.py'),
    RECORDS=(True, 'forward training and backward (plain and Ex) keep a launch record per handle and descriptors '
                   '(their versions): a repeated call checks only its per-call arguments (19-23 Python calls '
                   'instead of 81-96); False: every call validates in full; the reasons: pydnn/ops/batchnorm.py'),
    ROWS1_U=(8, 'rows in flight per thread of the 1-element row kernels (NHWC with C off every vector): 4 (the '
                 'kernels\' kUnroll) or 8; the reasons: pydnn/ops/batchnorm.py'),
    SUPER_ROWS=(True, 'packed NHWC backward whose channel count is no multiple of the 16-byte vector (odd C): the '
                      'row kernels at the full vector width over super-rows of lcm(C, vector) elements (each '
                      'thread a fixed 16-byte position, its channels j mod C); False: the 1-element row kernels; '
                      'the reasons: pydnn/ops/batchnorm.py'),
    SR_BLOCKS=(4, 'super-row statistics: blocks aimed at per SM (the stats chunks, and so the items the final '
                  'kernel merges per channel); the reasons: pydnn/ops/batchnorm.py'),
    BWD_SUMS=(True, 'backward with the saved mean and inverse std: the statistics pass keeps sums of dy and dy (x - mean) '
                    '(bwd_sums) instead of four merged moments (bwd_stats); the reasons: pydnn/ops/batchnorm.py'),
    BWD_APPLY_SAVED=(True, 'non-Ex backward with the saved statistics, betaParamDiff 0: the apply computes its '
                           'constants from dscale / dbias and the saved statistics, over every row (no head launch); '
                           'the reasons: pydnn/ops/batchnorm.py'),
    FWD_APPLY_SAVED=(True, 'non-Ex training forward with saved statistics on the 1-element rows / super-rows / srh: '
                           'the apply takes its constants from scale, bias and the saved statistics over every row '
                           '(no head launch); read when a plan is made; the reasons: pydnn/ops/batchnorm.py'),
    SR_HYBRID=(True, 'super-rows with position tiles under SR_TILED_BYTES: the 1-element rows\' statistics, then the '
                     'super-rows\' 16-byte apply (sequence srh); False: the 1-element apply; the reasons: '
                     'pydnn/ops/batchnorm.py'),
    SR_MIN_ROUNDS=(4, 'super-row backward statistics: the fewest kUnroll steps a thread of a stats chunk takes (fewer, longer '
                      'chunks for small tensors); the reasons: pydnn/ops/batchnorm.py'),
    SR_ROUNDS_WAVE=(True, 'SR_MIN_ROUNDS\'s longer super-row stats chunks only while they leave a chunk per SM (else '
                          'one step a thread, up to the SMs); the reasons: pydnn/ops/batchnorm.py'),
    SR_TILED_BYTES=(64 << 20, 'super-rows longer than one block (L / VEC > 256 positions, position tiles) only for x of at '
                              'least this many bytes; the reasons: pydnn/ops/batchnorm.py'),
    NC_RES=(True, 'packed NCHW training forward / backward with at most NC_RES_MAX elements per channel: nc_res, one '
                  'block per channel holding it in registers (one launch, each byte read once) before the nc / gen '
                  'sequences; the reasons: pydnn/ops/batchnorm.py'),
    NC_RES_WAVE=(True, 'NC_RES where its register-resident blocks need more than one wave: the streaming form (4 '
                       'elements a thread in registers, the rest read in each pass, blocks that keep every channel in '
                       'one wave); the reasons: pydnn/ops/batchnorm.py'),
    NC_RES_SU=(1, "NC_RES_WAVE's streaming passes: elements a thread loads together per step (1, or 4: the "
                  'batched form, compiled on first use); the reasons: pydnn/ops/batchnorm.py'),
    NC_RES_STREAM_WIDE=(True, "NC_RES_WAVE's streaming form: 512-thread blocks too where they keep every channel "
                               'in one wave (else 256 / 128 / 64); the reasons: pydnn/ops/batchnorm.py'),
    NC_RES_MAX=(16384, 'NC_RES\'s limit on the elements per channel (N * H * W; at most 16384, 16 a thread); the '
                       'reasons: pydnn/ops/batchnorm.py'),
    GEN_WAVE=(True, 'the fused gen kernels (a block per feature): a row a thread, the threads halved while the blocks '
                    'take more than one wave (down to 4 rows a thread); off: a row a thread; the reasons: '
                    'pydnn/ops/batchnorm.py'),
    GEN_TINY_ROWS=(4096, 'GEN_TINY\'s limit on the reduction rows (gen walks them with one block per feature); the '
                         'reasons: pydnn/ops/batchnorm.py'),
)

norm = Switches(
    "norm", 'layer / RMS / group / instance normalization (pydnn/ops/normalization.py)',
    STAGED_FWD=(False, 'the 16-byte-vector forward on the staged kernels (off: the register-tile kernels, 1-3 points'
                       ' of copy above them); the reasons: pydnn/ops/normalization.py'),
    STAGED_BWD=(True, 'the 16-byte-vector backward on the staged kernels (persistent, cp.async two-stage pipeline; '
                      '1.6x the register-tile backward on rows of 4096, H200); the reasons: '
                      'pydnn/ops/normalization.py'),
    ROWS_FIT=(True, 'fwd_rows: rows whose 16-byte vectors fill a power-of-two group of 4 items poorly take 5 items '
                     'where that leaves fewer idle threads; the reasons: pydnn/ops/normalization.py'),
    ROWS_FWD=(True, 'Forward of contiguous layer / RMS norm rows without activation (`fwd_rows`): G threads per row '
                    'hold ITEMS 16-byte vectors of each of R rows; R > 1 keeps scale / bias in registers for the R '
                    'rows; the reasons: pydnn/ops/normalization.py'),
    BWD_ROWS=(True, 'Backward of the same rows (`bwd_rows`): persistent, G threads per row, ITEMS vectors per '
                    'thread, x / dy of DEPTH rows in registers (a ring: DEPTH - 1 rows of loads in flight while one '
                    'is reduced); the reasons: pydnn/ops/normalization.py'),
    BWD_RING=(True, 'Backward of the same rows from a cp.async ring (`bwd_ring`): bwd_rows with x / dy of DEPTH rows'
                    ' in shared memory instead of registers; the reasons: pydnn/ops/normalization.py'),
    FWD_PERSIST=(False, 'Forward of the same 16-bit rows in a persistent grid (`fwd_persist`): scale / bias loaded '
                        'once per thread into registers (fwd_rows reads them from L1 for every row), x of DEPTH rows'
                        ' in a register ring; the reasons: pydnn/ops/normalization.py'),
    STREAM=({"fwd_rows", "gn_reg"}, 'kernels whose y / dx stores take the evict-first policy (st.global.cs): '
                                    'fwd_rows +3.5 points of copy on RMS bf16, +5.7 on LN fp32, gn_reg +0.5 (H200); '
                                    'the reasons: pydnn/ops/normalization.py'),
    BWD_RING_WARPSTAT=(True, "bwd_ring: a row's mean / invstd copied into the ring once per warp, not once per "
                             'thread, when G >= 32; the reasons: pydnn/ops/normalization.py'),
    ROWX=(True, 'Layer / RMS rows of any length (`fwd_rowx`): 16-byte vectors in the row\'s aligned frame (edge '
                'elements masked, parameters read at the shifted positions) for the contiguous rows fwd_rows does '
                'not take (lengths not a multiple of the vector, rows beyond its block); the reasons: '
                'pydnn/ops/normalization.py'),
    BWD_SPLIT=(True, 'whole-vector fp32 layer / RMS rows whose one-pass backward needs an 8-block cluster per row, at '
                     'least a wave of them: bwd_split_dx (a block per row, two passes) + bwd_split_params (dscale / '
                     'dbias per row chunk) + finish_rowx (LN fp32 3673 x 8552: 0.559x -> 1.222x PyTorch, H200); the '
                     'reasons: pydnn/ops/normalization.py'),
    BWD_SPLIT_16=(True, 'BWD_SPLIT for 16-bit rows as well (RMS bf16 1478 x 32768: 0.551x -> 1.116x PyTorch, H200; '
                        'False: float only); the reasons: pydnn/ops/normalization.py'),
    XSPLIT=(True, 'layer / RMS rows of any length whose backward takes a cluster per row (bwd_rowx_cl) or no vector '
                  'kernel, at least as many as the SMs: bwd_xsplit_dx (a block per row, two passes, the aligned '
                  'frame) + bwd_xsplit_params (dscale / dbias per alignment class and row chunk) + finish_rowx (LN '
                  'fp16 2402 x 34823: bwd_rowx_cl 0.63-0.69x PyTorch, H200); the reasons: pydnn/ops/normalization.py'),
    XSPLIT_ANY=(False, 'XSPLIT for every rowx row backward with rows >= SMs, bwd_rowx (one block a row) too (LN bf16 '
                       '417 x 2770: bwd_rowx 0.58-0.67x PyTorch, H200); the reasons: pydnn/ops/normalization.py'),
    XSPLIT_FILL=(0.6, "XSPLIT also where bwd_rowx's group would hold a row's vectors in under this fraction of its slots "
                      '(idle lanes: fewer bytes in flight) and the tensor is at least XSPLIT_FILL_BYTES (RMS fp16 17244 x '
                      '4231: 0.975x -> 1.19x PyTorch, bf16 81995 x 9188: 1.05x -> 1.24x, H200); 0: off; the reasons: '
                      'pydnn/ops/normalization.py'),
    XSPLIT_FILL_BYTES=(32 << 20, 'XSPLIT_FILL: tensors of at least this many bytes (RMS bf16 665 x 2277, 3 MB, 56% full, '
                                 'keeps bwd_rowx: 0.0189 against 0.0281 ms); the reasons: pydnn/ops/normalization.py'),
    XSPLIT_SLOTS=(False, "XSPLIT for bwd_rowx's one-block rows where its dscale / dbias slots (written and read back) "
                         'outweigh the split\'s second read of x and dy (LN bf16 417 x 2770: 18.6 MB against 4.6; '
                         'measured slower than bwd_rowx with ROWX_BWD_WS16: 0.0339 against 0.0260 ms, H200); the '
                         'reasons: pydnn/ops/normalization.py'),
    XSPLIT_DX_BLOCK=(512, "bwd_xsplit_dx's largest block (1024: alone on its SM at 64 registers); the reasons: "
                          'pydnn/ops/normalization.py'),
    ROWX_BWD_LONG=(True, 'whole-vector layer / RMS rows whose backward the whole-vector kernels serve only with the '
                         '8-block cluster kernel: bwd_rowx when one block holds the row and the rows are at least '
                         'the SMs (RMS fp32 5315 x 8192 0.73x -> 1.31x PyTorch, H200; rows the whole-vector kernels '
                         'serve not at all take bwd_rowx regardless, not gen); the reasons: '
                         'pydnn/ops/normalization.py'),
    ROWX_BWD_ROWS=(1, "bwd_rowx's grid: each group walks at least this many rows of its alignment class (1: as many "
                      'blocks as rows up to the resident limit; more: fewer dscale / dbias partial slots for finish; '
                      '8 gave LN bf16 417 x 2770 34.3 us against 35.1, H200); the reasons: pydnn/ops/normalization.py'),
    ROWX_BWD_WS16=(True, "bwd_rowx (no cluster): the dscale / dbias slot written in order with 16-byte stores instead "
                         "of one float at a time (LN bf16 417 x 2770 0.93x -> 1.27x PyTorch, H200); the reasons: "
                         "pydnn/ops/normalization.py"),
    ROWX_BWD_CL_BLOCK=(256, "bwd_rowx_cl's blocks: at most this many threads when a cluster of 2 / 4 / 8 holds the "
                            'row so (two blocks per SM; 512: one); the reasons: pydnn/ops/normalization.py'),
    FINISH=((32, 32), "finish's block: FINISH = (parameters, slot groups); see finish in the .cu; the reasons: "
                      'pydnn/ops/normalization.py'),
    GN_FWD=(True, 'Group norm with channels innermost (`gn_fwd` / `gn_bwd`; NHWC / channels_last): a cluster of 8 '
                  "blocks per unit (one sample's GC consecutive groups over all positions), each block's tile of "
                  'positions x GC * cg channels held in shar...; the reasons: pydnn/ops/normalization.py'),
    GN_THREADS=(256, "gn_fwd / gn_bwd's block size (at most): 256 was the best of the sweep (H200); the reasons: "
                     'pydnn/ops/normalization.py'),
    GN_FILL=(2, 'gn_fwd / gn_bwd: GC the largest divisor of G whose units still number GN_FILL blocks per SM; the '
                'reasons: pydnn/ops/normalization.py'),
    GN_ONE=(True, 'GN_ONE: 16-bit gn_fwd with one-pass shifted statistics (one cluster reduction instead of two) and'
                  ' the tile copied in 4 commit groups, summed as each lands (see gn_fwd in the .cu for the error '
                  'bound); the reasons: pydnn/ops/normalization.py'),
    GN_BWD=(True, 'gn_bwd: the backward on the same units (x and dy tiles: 2x the bytes); the reasons: '
                  'pydnn/ops/normalization.py'),
    GN_REG=(True, "GN_REG (`gn_reg` / `gn_reg_cl`): the NHWC forward with each block's share of a unit held in "
                  'registers (GN_REG_ITEMS 16-byte vectors per thread, 64 registers) and SI more vectors per thread '
                  "in the thread's own slots of a shared-mem...; the reasons: pydnn/ops/normalization.py"),
    GN_REG_PICK=((8, 4, 8), "gn_reg's (CL, GC, SI): (8, 4, 8) 74.3% of copy on bf16 32 x 512 x 64 x 64 against "
                            "gn_fwd's 72.6% (H200); the reasons: pydnn/ops/normalization.py"),
    PF_BYTES=({"fwd_rows": 0, "gn_reg": 8 << 20}, 'L2 prefetch (NormParams.pf): block b of fwd_rows / gn_reg pulls '
                                                  'into L2 (prefetch.global.L2) the x that block b + pf will read, '
                                                  'pf = PF_BYTES[kernel] / the bytes of x one block reads (at least '
                                                  '1; 0 bytes: off); the reasons: pydnn/ops/normalization.py'),
    GS=(True, 'Group / instance norm split kernels (gsp_fwd / gsc_fwd, gsp_bpart / gsc_bpart + gs_bred + gs_bset + '
              'gs_bapply) for packed NCHW / NHWC without activation when a set holds GS_MIN_BYTES or more; the '
              'reasons: pydnn/ops/normalization.py'),
    GS_MIN_BYTES=(2048, 'gs_*: the split kernels serve sets of at least this many bytes of x (smaller sets keep '
                            'the register-tile kernels); the reasons: pydnn/ops/normalization.py'),
    GS_FLAT=(True, 'gsf_fwd: NHWC float group / instance forward whose C takes no 4-element channel vector walked '
                   'in super-rows of lcm(C, 4) elements with 16-byte loads (else gsc_fwd with 1- / 2-element '
                   'vectors): in_fwd_train NHWC 38x495x212x212 fp32 3.43 ms against 5.29 (H200); the reasons: '
                   'pydnn/ops/normalization.py'),
    GS_FWD_F32=(True, 'gs_*: float data forward on the split kernels too (their mean from the unshifted sum of x: '
                      'the shifted one put an error ~ eps * |first element| into it, y missed the fp32 tolerance '
                      'near a small mean in the H200 run of 2026-11-28; see gs_stats in ptx/normalization_gs.cu); '
                      'gn_fwd_infer NCHW 3x103x99x99 fp32 0.09x -> 10.9x PyTorch, in_fwd_infer NHWC 144x1660x50x50 '
                      '0.64x -> 3.5x (H200); False: float forwards keep the tile kernels'),
)

pooling = Switches(
    "pooling", 'pooling (pydnn/ops/pooling.py)',
    BWD_PACKED_TIES=(True, 'vector max backward: bwd<T, VEC, true, true>, checking ties with one packed max of the '
                           'earlier window elements instead of matching each one; False: the per-element match for '
                           'all; the reasons: pydnn/ops/pooling.py'),
    ROWS_FORWARD=(True, 'fwd_rows (ptx/pooling.cu): a thread reduces ROW_OUT consecutive outputs along w (kRowOut); '
                        'used for the vector forward of 1-d / 2-d non-adaptive pooling when its offsets fit 32 bits;'
                        ' the reasons: pydnn/ops/pooling.py'),
    ROWS_MIN_BLOCK=(64, 'smaller blocks (few channels and a narrow output) keep the flat kernel; the reasons: '
                        'pydnn/ops/pooling.py'),
    ROWS_FAST3=(True, 'fwd_rows: outputs whose in-bounds window is 3 x 3 load it with straight-line offsets '
                      '(PYDNN_POOL_FLAG_FAST3); False: every output walks its window with scan; the reasons: '
                      'pydnn/ops/pooling.py'),
    ROWS_COLS=(False, 'fwd_rows, averages: 3 x 3 / 2 strips of full windows sum each column once '
                      '(PYDNN_POOL_FLAG_COLS); the reasons: pydnn/ops/pooling.py'),
    WIN2=(True, 'win2_fwd / win2_bwd (ptx/pooling.cu): kh x 2 windows with stride kh x 2, no padding, tiling x, w '
                'contiguous (NCHW): 16-byte x / dx rows per thread, each dx element written once from its own '
                'window; False: the scalar fwd / bwd; the reasons: pydnn/ops/pooling.py'),
    P2=(True, 'p2_fwd / p2_bwd (ptx/pooling.cu): 2-d pooling on the scalar path writing along w (NCHW), windows '
              '<= 3 x 3 forward, <= 2 covering windows per dim backward: a thread per element, four 32-bit '
              'divisions and an unrolled window; False: the scalar fwd / bwd; the reasons: pydnn/ops/pooling.py'),
    P2_BWD=(True, 'p2_bwd for the backward where P2 allows it (False: the backward takes the scalar bwd, the '
                  'forward keeps p2_fwd; max 3x3/2 101x38x50x50 fp32 0.475 ms on p2_bwd, 0.602 without, H200); '
                  'the reasons: pydnn/ops/pooling.py'),
    P2_CLAST=(True, 'p2 with threads along c for channels-last layouts whose channels take no vectors (C not a '
                    'multiple of the vector); False: the scalar fwd / bwd there; the reasons: pydnn/ops/pooling.py'),
    P2T_BWD=(True, 'p2t_bwd (ptx/pooling.cu) for the max backward p2_bwd takes along w (NCHW) with windows <= 3 x 3 '
                   'and planes of >= P2T_MIN_PLANE elements: a block per band of a plane, each covering window\'s '
                   'winner found once into shared memory, then a gather per dx element (p2_bwd: up to 4 windows '
                   're-derived and re-scanned per element); False: p2_bwd; the reasons: pydnn/ops/pooling.py'),
    P2T_MIN_PLANE=(1024, 'p2t_bwd: smaller planes keep p2_bwd (a block of 256 threads per plane would idle)'),
)

dropout = Switches(
    "dropout", 'dropout (pydnn/ops/dropout.py)',
    USE_TILE=(True, 'False: channels-last layouts take the strided kernel; the reasons: pydnn/ops/dropout.py'),
    FWD_PACKED=(True, '16-bit dense forward with 16-byte vectors: fwd_packed (Philox calls round by round, pairs of '
                      "elements per word: fewer instructions per element, bitwise fwd's output and mask); the "
                      'reasons: pydnn/ops/dropout.py'),
)

matmul = Switches(
    "matmul", 'matmul (pydnn/ops/matmul.py)',
    USE_WGMMA=(True, 'sm_90: the wgmma GEMM (gemm_wgmma) where its conditions hold (K >= WG_MIN_K ...), else the '
                     'mma.sync tiles; the reasons: pydnn/ops/matmul.py'),
    WG_PERSIST=(True, 'sm_90: the 128x256 wgmma tile runs persistent (gemm_wgmma_p: one wave of blocks, the '
                      "K loop running on into the next tile's first K tiles), for plain and fused (graph) GEMMs; "
                      'False: one block per tile (gemm_wgmma); the reasons: pydnn/ops/matmul.py'),
    WG_PERSIST_MIN_K=(64, 'sm_90: the shortest reduction K for which the chooser considers the persistent 128x256 '
                          'wgmma tile (WG_PERSIST; the one-block-a-tile wgmma tiles keep K >= WG_MIN_K); the '
                          'reasons: pydnn/ops/matmul.py at WG_MIN_K'),
    SPLIT_K=(True, 'sm_90: plans made with split_k=True (pydnn.matmul) cut a long K into splits when the '
                   '128x256 tiles fill less than 3/4 of a wave (gemm_wgmma_s + splitk_reduce, a plan-owned '
                   'workspace); the reasons: pydnn/ops/matmul.py at WG_SPLIT_TILE'),
    SPLIT_WAVES=(True, 'with SPLIT_K: the split count S may take several waves of (split, tile) items (the S that '
                       'minimizes waves x (K tiles a split + SPLIT_ITEM_KT) + the partials\' reduction; the GPT '
                       "demo's MLP weight gradients, 72 tiles of 128 x 256 over K = 65536: S = 9, 4.9 waves); "
                       'False: at most one wave (S <= SMs / tiles: S = 1 there, no split)'),
    SIMT_BIG=("big", 'float GEMMs (matmul, graph, convolution, RNN) where the chooser takes the 128x128 CUDA-core '
                     'tile, K > SHORT_K and the items fill SIMT_BIG_WAVES waves: "big" runs SIMT_BIG_TILE (128x256, '
                     '16x8 outputs a thread; 8192^3 and the 7B shapes 0.92-0.93x cuBLAS where the 128x128 tile ran '
                     '0.80-0.84x), a SIMT_CANDIDATES name ("c1" ...) that candidate (units compiled on first use), '
                     '"": the 128x128 tile; the reasons: pydnn/ops/matmul.py at SIMT_BIG_TILE'),
    USE_TMA=(True, 'sm_90: where the chooser picks the 128x256 wgmma tile and both operands suit TMA, plain GEMMs '
                   'and the graph API\'s fused GEMMs run gemm_tma (TMA copies, a producer warpgroup, two consumer '
                   'warpgroups, persistent) instead; the reasons: pydnn/ops/matmul.py at TMA_TILE'),
    FUSED_PP=(False, 'sm_90, where a fused (graph) GEMM runs gemm_tma: its kernel is the ping-pong form (TMA_PP_TILE: '
                     "a consumer warpgroup's epilogue overlaps the other's wgmmas) instead of TMA_TILE, except a row "
                     'reduction; the reasons: pydnn/ops/matmul.py at TMA_PP_TILE'),
    EPI_STSM=(True, 'sm_90, a fused (graph) GEMM on gemm_tma\'s cooperative tile with 16-bit outputs: its WIDE store '
                    'through stmatrix and a 2 KiB shared buffer a consumer warp (ptx/matmul.cu stsm_store_tile: 4 STSM + '
                    '4 LDS.128 + 4 STG.128 a 64-column chunk) instead of quad transposes in registers (256 SEL + 64 SHFL a '
                    'thread a tile); +16 KiB of shared memory (218 KiB a block with the staged bias). H200 timeline: the '
                    'bias + GELU epilogue 7.88 -> 7.13 kc a tile (16384x4096x4096), 7.90 -> 7.14 (16384x11008x4096); the '
                    'plain kernel gains the same way (gemm_tma_ps, a candidate: 3.11 -> 2.43 kc) but is not switched yet'),
    EPI_WIDEN=(True, 'sm_90, a fused (graph) GEMM on gemm_tma\'s cooperative 256-column tile with staged 16-bit column '
                     'operands (a bias; FUSED_STAGE): held as float in the staged buffer (+512 bytes a consumer warp), '
                     'widened once a tile while the last K tile\'s wgmmas run, so the epilogue reads float pairs '
                     '(bfloat16 bias: 65 fewer instructions a thread a tile, SASS). H200 timeline (session 32, gemm2): '
                     'the bias + GELU epilogue 6.81 -> 6.53 kc a tile (16384x4096x4096), 6.83 -> 6.54 (x11008x); with '
                     'EPI_CHUNK 6.20 / 6.18'),
    EPI_CHUNK=(True, 'sm_90, a fused (graph) GEMM on gemm_tma\'s cooperative tile with EPI_STSM and staged column '
                     'operands: the interior tile\'s epilogue computes and stores 64 columns at a time (a chunk\'s '
                     'stmatrix / shared load / global store beside the next chunk\'s math, not all stores after all '
                     'of it); 32: 32 columns at a time (stsm_store_chunk32). H200 timeline (session 32, gemm2): the '
                     'bias + GELU epilogue 6.81 -> 6.32 kc a tile (16384x4096x4096), 6.83 -> 6.30 (x11008x); with '
                     'EPI_WIDEN 6.20 / 6.18, the fused tile 1.048x / 1.047x the plain in cycles; 32 columns 6.65 / 6.63'),
    FUSED_STAGE=(True, 'sm_90, a fused (graph) GEMM on gemm_tma (cooperative tile, no row reduction, every input a '
                       'column operand): its column operands (a bias) are copied into shared memory by cp.async at '
                       'the start of each tile (hidden by the K loop) and read from there in the epilogue, instead of '
                       'global loads issued in the epilogue, where the tensor cores idle (pydnn/graph/codegen.py '
                       'stage_plan). H200, session 31, tools/gemm_timeline.py (clock64 stamps, every SM): the bias + '
                       'GELU epilogue 8.60 -> 7.88 kc a tile on 16384x4096x4096 and 8.67 -> 7.89 on 16384x11008x4096 '
                       '(K loop unchanged; a 128x256 tile 75.6 -> 75.1 kc against plain 70.1: 1.079 -> 1.071x); '
                       'session 30\'s event-timed rounds had measured it both ways (1.066 / 1.110 -> 1.053 / 1.085, '
                       'then 1.075 / 1.081 -> 1.089 / 1.121): clock noise larger than the effect'),
)

attention = Switches(
    "attention", 'the wgmma attention forward (pydnn/ops/attention_wgmma.py)',
    ENABLED=(True, 'False: attention_forward always takes the mma.sync kernel (tests force either path); the '
                   'reasons: pydnn/ops/attention_wgmma.py'),
    DIAG=(None, 'benchmark only: a (unit, expr) of diag_units that launch runs instead; the reasons: '
                'pydnn/ops/attention_wgmma.py'),
    WS=(True, 'sm_90, d 64 / 128 / 256: the warp-specialized forward (FA3-style producer / consumer '
              'warpgroups, ping-pong; pydnn/ops/attention_ws.py); False: the older wgmma forward (A/B)'),
    WS_TMA=(True, 'the warp-specialized forward loads Q / K / V with TMA (tensor maps encoded per call) where it '
                  'can (no per-batch key lengths, no launch recorder); False: its producer warpgroup copies with '
                  'cp.async (mid-session H200 run, d 128: TMA geomean 0.893x cuDNN against 0.863x)'),
    DECODE=(True, 'the split-KV decode forward (dec + dec_combine) for queries of at most DECODE_MAX_SQ rows '
                  'without dropout; False: such calls take the regular forward (pydnn/ops/attention.py)'),
    DECODE_MAX_SQ=(16, 'the longest query sequence the decode forward takes (its CTAs hold 16 rows of a K/V '
                       "head's group: a longer one is the regular forward's shape)"),
    DECODE_SPLITS=(None, 'None: the split count fills the SMs (pydnn/ops/attention.py decode_plan); an int '
                         'forces it (tests, benchmarks); the workspace size query follows it'),
    DECODE_IMBALANCE=(0.1, "decode_plan's model: the extra cost, in chunks of one split, of a wave that puts two "
                           'CTAs on some SMs and one on others (measured ~10% on the H200); the reasons: '
                           'pydnn/ops/attention.py split_cost'),
    WS_BN176=(False, 'd 128 on the warp-specialized forward: K / V tiles of 176 keys (FlashAttention-3\'s non-causal '
                     'd 128 tile; units attention.ws.n176.*) for "noncausal" calls, or True: every call; False: 128 '
                     '(an A/B knob until a GPU run decides; pydnn/ops/attention_ws.py bn_of)'),
    WS_BN192=(False, 'd 64 on the warp-specialized forward: K / V tiles of 192 keys (units attention.ws.n192.*) for '
                     '"noncausal" calls, or True: every call; False: 128 (an A/B knob, as WS_BN176)'),
    WS_Q2=(True, 'd 64 / 128 on the warp-specialized forward (128-key tiles): two Q buffers, the next work unit\'s '
                 'Q copied while the current one runs (units attention.ws.q2.*); False: one, copied after both '
                 'consumer warpgroups\' epilogues (mid-session H200 run, session 30: d 128 geomean 0.912x cuDNN '
                 'against 0.877x, s 512 +5-12%; d 64 0.803x against 0.800x)'),
    WS_EMU=({64: 2}, 'with WS_Q2 and TMA: eighths of an unmasked tile\'s exponentials computed by a polynomial on '
                     'the FMA pipe instead of MUFU.EX2 (FlashAttention-4\'s trick), an int for every instantiated '
                     'head dim or a dict {head dim: eighths}; instantiated (units attention.ws.emu.*): d 64 2 / 3, '
                     'd 128 2; 0: none. WS_C3 takes d 64 first, so EMU runs only with WS_C3 off (mid-session H200 '
                     'run, session 30: d 64 2 eighths 0.827x cuDNN against 0.803x without, better on all 6 points, '
                     '3 eighths 0.813x; d 128 2 eighths 0.876x against 0.912x: not there)'),
    WS_ROT=(False, 'with WS_Q2 and TMA, non-causal calls: each unit walks its key tiles from tile (CTA index mod '
                   'tiles) on (units attention.ws.rot.*; WS_EMU is not combined with it); False: from tile 0 '
                   '(mid-session H200 runs 3 / 4, session 30: d 128 geomean 0.898x cuDNN against 0.916 / 0.912x '
                   'unrotated: off)'),
    WS_C3=(True, 'd 64 with WS_Q2 and TMA: three consumer warpgroups of 64 query rows (192-row units, 512 threads: '
                 'FlashAttention-3\'s d 64 tile; units attention.ws.c3.*; not combined with WS_EMU); False: two '
                 '(mid-session H200 runs 3 / 4, session 30: d 64 geomean 0.917 / 0.913x cuDNN against 0.816 / 0.818x '
                 'with two warpgroups and EMU 2, s 4096 +17-24%, s 512 causal -1%)'),
    WS_CL=(False, 'd 64 / 128 with WS_Q2 and TMA, non-causal calls without per-batch lengths: clusters of 2 CTAs on '
                  'a head\'s row blocks 2i, 2i + 1 sharing K / V by TMA multicast (each copies half of every tile into '
                  'both: half the L2 -> SM traffic; units attention.ws.cl.*); False: one CTA, its own copies '
                  '(mid-session H200 run 4: d 128 0.906x cuDNN against 0.912x, non-causal s 4096 -1..-2%: off)'),
    WS_XU=(False, 'd 64 / 128 with WS_Q2 and TMA (and d 64 with WS_EMU at 2): a consumer warpgroup issues the next '
                  'unit\'s first S with this unit\'s last P V and runs its first softmax under it (units '
                  'attention.ws.xu.*; WS_C3 / WS_ROT / WS_CL take precedence); False: each unit starts alone '
                  '(mid-session H200 run 4: d 128 0.890x cuDNN against 0.912x, s 512 causal -9%; d 64 0.785x '
                  'against 0.818x: off)'),
    WS_GH=({64: "all", 256: "causal"}, 'the head dims whose warp-specialized TMA forward runs ghost tiles, {head dim: "all" | "causal" '
                        '(causal masks only)} or a tuple of head dims ("all"): d 64 on WS_C3\'s three warpgroups, d 256; '
                        'each consumer warpgroup computes only the key tiles its own 64 rows see (the causal diagonal, rows '
                        'past the length) and walks the unit\'s others without issuing (units attention.ws.gh.*); {}: every '
                        'warpgroup computes the unit\'s tiles. Mid-session H200 run 1, session 31 (8 points s 512 / 1024): '
                        'd 64 0.883x cuDNN against 0.835x (with WS_AL 0.928x); d 256 0.877x against 0.881x (causal +1-4% at '
                        's 512, non-causal -2..-4%); run 2 (s 2048 / 4096): d 64 with WS_AL 1.058x against 1.023x (12 '
                        'points, all better), d 256 0.873x against 0.868x, causal 4 points -2.9..+2.2%: d 256 under causal '
                        'masks (6 of 8 causal points higher, ~+1%, the counted saving 1-10%)'),
    WS_AL=(True, 'with WS_GH at d 64 on three warpgroups: 192-row blocks aligned to the sequence\'s end, the partial '
                 'block the first (its rows above 0 ghosts) instead of the last (causal: the longest); False: from '
                 'row 0. Mid-session H200 run 1, session 31: d 64 0.928x cuDNN against 0.883x (gh alone) and 0.835x '
                 '(neither), every one of the 8 points better (causal s 1024 0.756 -> 0.959)'),
    PAGED_WS=(True, 'sm_90, d 64 / 128 / 256: the paged forward (attention_forward_paged) of more than '
                    'DECODE_MAX_SQ query rows runs the warp-specialized kernel with paged K / V loads; False: the '
                    'decode kernel takes every paged call (any arch; 16 rows a CTA, slow for a prefill)'),
    PAGED_DEC_PIPE=(False, 'the paged decode kernel loads each tile\'s page ids an iteration before it stores their '
                           'row offsets (dec<T, D, true, true>) instead of loading and storing them in one step (a '
                           'stall a tile: the mid-session H200 run measured the paged decode at 0.58-0.61x the '
                           'contiguous one); off until a GPU run has tested and timed it'),
    PAGED_TMA_SMALL=(True, 'PAGED_TMA for pages smaller than the K / V tile too (a multiple of 8 keys dividing it: '
                           'one TMA box a page, BN / page size boxes a tile); False: such pages take the cp.async '
                           'producer'),
    PAGED_TMA=(True, 'the paged warp-specialized forward loads K / V by TMA over the page pools where the page size '
                     'is a multiple of its K / V tile (128 keys; 64 at d 256) and WS_TMA holds; False: its '
                     'producer warpgroup copies rows with cp.async through the page table (any page size)'),
)

attention_bwd = Switches(
    "attention_bwd", 'the wgmma attention backward (pydnn/ops/attention_wgmma_bwd.py)',
    ENABLED=(True, 'False: the attention backward always takes the mma.sync kernels (tests force either path)'),
    WS=(True, 'sm_90, the head dims of pydnn/ops/attention_ws_bwd.py HEAD_DIMS, no per-batch lengths: the '
              'warp-specialized dK / dV kernel (TMA producer warp, mbarrier ring, two consumer warpgroups); '
              'False: the older wgmma one (A/B)'),
    WS_DQ=("bulkwpp1", 'the warp-specialized backward\'s atomic dQ: "bulk" (FA3\'s way: the two warpgroups\' halves in '
                   'one 128B-swizzled fp32 tile in shared memory, added by bulk tensor reductions), "red" '
                   '(red.global.add.v2 from the registers) or "redpp" (red, the consumer warpgroups taking turns '
                   'at S^T / dP^T, each adding the previous tile\'s dQ). Mid-session H200 run 2, b4 s4096, six '
                   'points (d128 / d64 / GQA 64/8, causal and not): geomean over cuDNN bulk 0.832, redpp 0.778, '
                   'red 0.755, the older kernel 0.615; "bulkw": bulk with FA3\'s dedicated dQ writer warp (the '
                   'consumers store their halves and go on; no meeting on the tile, no consumer thread issuing); "bulkwpp": '
                   'the writer with redpp\'s ping-pong (two dQ tiles). Session 29 (same run, with WS_ORDER): '
                   'bulkw 1.00x bulk, bulkwpp 0.95-1.02x (WS_DQ_CAUSAL); "bulkwpp1" (session 33, the default): bulkwpp '
                   'with one dQ tile (fits d 64). Session 33 mid-session H200 run (16 points, against bulk): non-causal '
                   's >= 1024 +2.3..+12% (d64 s4096 1.111 against 0.990x cuDNN, GQA d128 s1024 1.068 against 1.012), '
                   's 512 -0.9%; d 64 causal -1% (s512) .. +6% (s4096); the second run: 16 points 0.967 against bulk\'s '
                   '0.924x cuDNN'),
    WS_DQ_CAUSAL=("bulkwpp", 'WS_DQ under a causal mask (None: WS_DQ). Mid-session H200 run (session 29, b4 s4096): '
                             'bulkwpp 1.02x bulkw at d128 causal h32 / h64/8 (414 / 402 against 406 / 393 TFLOP/s) '
                             'but 0.96x at h64/8 non-causal, so causal only; d 64 runs its one-tile form "bulkwpp1" '
                             '(bulkwpp\'s two dQ tiles do not fit there: attention_ws_bwd.py MODE_DIMS / dq_mode). Session '
                             '33 mid-session run: bulkwpp1 against bulkwpp at d128 causal -0.5..-1.7% (4 points): kept'),
    WS_ORDER=(True, 'the warp-specialized backward launched as a 1-d grid the kernel orders in chunks of 4 (K/V head, '
                    'batch) pairs, the longest (causal) key-block walks first; False: the 3-d grid\'s order (key '
                    'blocks fastest). Mid-session H200 run (session 29, b4 s4096, bulk): causal d128 h32 / d64 / '
                    'h64/8 1.074x / 1.030x / 1.065x, non-causal 0.99-1.02x; the reasons: ptx/attention_ws_bwd.cu '
                    'kOrderChunk'),
    WS_DQ_D256=("bulkw", 'the d 256 backward\'s (bwd_ws256) atomic dQ: "red" (red.global.add.v2 from the registers) or '
                       '"bulkw" (bulk tensor reductions by the writer warp, the fp32 tile staged in the stage\'s Q / dO '
                       'buffers), "bulkw2" (the same, each warpgroup\'s dQ into the bytes its own dV / dK read: no '
                       'meeting); the modes pydnn/ops/attention_ws_bwd.py D256_MODES instantiates (bulkw; the others by '
                       'adding them there). Session 30 mid-session H200 runs: red 17.3 ms at b4 s4096 h32 where the '
                       'kernel without dQ takes 8.76; geomean over cuDNN red 0.778 / bulkw 0.918 (6 points), red 0.799 / '
                       'bulkw 0.929 / bulkw2 0.919 (4 points, bulkw2 1.06 at h128/8 but 0.84 at h32)'),
    PREP_VEC=(True, 'the backward\'s memory passes (dsum = rowsum(dO * O) with the fp32 dQ accumulator zeroed, and the '
                    'atomic mode\'s dQ conversion) in 16-byte accesses, several rows a thread (ptx/attention_prep.cu, '
                    'every arch); False: attention.cu\'s bwd_pre / bwd_dq_convert (a warp a row, 4- / 8-byte loads). '
                    'Session 32 mid-session H200 run, b32 s512 h32/32 d64: pre 0.124 -> 0.069 ms, convert 0.099 -> '
                    '0.049 ms (cuDNN\'s two 0.069-0.071 / 0.058); backward 0.754 -> 0.853x cuDNN (causal 0.727 -> '
                    '0.839), 6 points 0.783 -> 0.832x'),
    WS_VAR=(None, 'probes of the warp-specialized backward\'s default kernels (d 64 / 128, "bulkwpp1" and '
                  '"bulkwpp"; pydnn/ops/attention_ws_bwd.py VARS, first-use units): "noexp" / "nored" / "noload" '
                  '(no exponentials / no dQ reductions / no Q, dO reloads: wrong results, timing only); None: the '
                  'default kernels'),
    WS_STAGES=(2, 'the warp-specialized backward\'s Q / dO ring depth: 2, or 3 where instantiated (d 128, bulk / '
                  'bulkw / bulkwpp1: pydnn/ops/attention_ws_bwd.py DEEP). Session 29 mid-session run, bulkw: 3 stages '
                  '0.98x (d128 causal) to 1.01x; session 33, bulkwpp1: 0.963 against 0.967x cuDNN (16 points)'),
)

activation = Switches(
    "activation", 'activations (pydnn/ops/activation.py)',
    PLAIN_ACCESS=((1, 0), 'Modes whose kernels keep the plain cache policy (map_contig HINT 0): RELU (1), SIGMOID (0) '
                          '(ReLU backward fp32 297888 x 256 0.95x -> 1.00x PyTorch plain, H200); the others stream '
                          '(evict-first); the reasons: pydnn/ops/activation.py'),
    TANH_FAST=(True, '16-bit TANH forward on tanh_fast (ex2 / rcp approximations, relative error < 1.5e-6: 16.0 '
                     'instructions an element in the vector kernel) instead of tanhf (19.1; compiled on first use); '
                     'the reasons: pydnn/ops/activation.py'),
    TANH_ELEMS=(8, '16-bit TANH forward: elements per thread (8: one 16-byte vector, or 16: two, as the GELU / swish '
                   'forwards take; compiled on first use); the reasons: pydnn/ops/activation.py'),
)

softmax = Switches(
    "softmax", 'softmax (pydnn/ops/softmax.py)',
    SPLIT=(True, 'sm_90: the forward of few long contiguous rows (rows * SPLIT_CL blocks within the SMs) over a '
                 'cluster of blocks (row_split_fwd, max and sum through distributed shared memory) instead of one '
                 'block a row; the reasons: pydnn/ops/softmax.py (SPLIT_CL)'),
    SPLIT_MIN_LEN=(8192, 'row_split_fwd: rows of at least this many elements'),
    COL_FILL=(1, 'channel softmax with fewer (outer x tile) blocks than SMs: tiles narrower than a 32-byte sector '
                 'until the blocks fill the SMs (1; the col kernel where the channels then fit its registers), or '
                 'down to the width whose channels fit the registers (2); 0: off; the reasons: pydnn/ops/softmax.py'),
)

tensor_ops = Switches(
    "tensor_ops", 'tensor ops (pydnn/ops/tensor_ops.py)',
    BROADCAST_ROWS=(True, 'AddTensor / OpTensor with an input broadcast as one row over the output\'s rows (a bias '
                          '1 x H onto R x H): map_rows (the row loaded once per thread for ROWS rows, 16-byte '
                          'vectors) instead of map_strided; the reasons: pydnn/ops/tensor_ops.py'),
    BROADCAST_ROWS_SCALAR=(True, 'map_rows with 1-element accesses for rows whose length or strides are not a '
                                 'multiple of the 16-byte vector (else map_strided: bias 8659 x 50083 fp32 at '
                                 '0.49x PyTorch, 1.02x with it, H200); the reasons: pydnn/ops/tensor_ops.py'),
    PLAIN_BYTES=(1 << 40, 'dense ScaleTensor / AddTensor / OpTensor whose operands (output and inputs) total at '
                          'most this many bytes keep the plain cache policy (map_contig HINT 0) instead of '
                          'evict-first streaming (1 TiB: all; 40 MiB, the L2, before session 32: OpTensor ADD fp32 '
                          '5070 x 32768 0.95x -> 1.00x PyTorch plain, H200); 0: always stream; the reasons: '
                          'pydnn/ops/tensor_ops.py'),
)

reduce = Switches(
    "reduce", 'ReduceTensor (pydnn/ops/reduce.py)',
    ROW_ROUNDS=(2, "rows_vec: a row's group G is the power of two that leaves each thread about ROW_ROUNDS rounds "
                   "of kUnroll vector loads (G = next_pow2(units / (ROW_ROUNDS * kUnroll)), at most a block); 1 "
                   'ran AVG 53513 x 2824 fp32 at 0.300 ms against 0.219 (H200); the reasons: pydnn/ops/reduce.py'),
    SEG_ROUNDS=(4, 'rows / columns split into segments (a second pass over the partials): at least this many rounds '
                   'of kUnroll loads a thread in a segment; the reasons: pydnn/ops/reduce.py'),
    ROW_ROUNDS_WIDE=(8, 'rows_vec with many rows: ROW_ROUNDS_WIDE rounds per thread where that leaves groups of >= 32 '
                        'threads and >= a wave of threads over all rows (AVG 53513 x 2824 fp32 0.217 -> 0.159 ms, '
                        'H200); 0: ROW_ROUNDS everywhere; the reasons: pydnn/ops/reduce.py'),
)

rnn = Switches(
    "rnn", "the RNN family's STANDARD engine (pydnn/ops/rnn/engine.py)",
    SPLIT_K=(True, "split-K of the per-step recurrent GEMMs where even 64 x 64 tiles leave SMs idle (the backward's "
                   "[B, out] GEMM at B 64 is 16 tiles for 132 SMs); off for measurements"),
    SPLIT_F32_TIME=(True, "float recurrent GEMMs: the split-K with the least estimated step time (tiles at their full "
                          "size, so a 128-row tile at batch 64 counts double; issue 16's fp32 LSTM: forward 8 slices "
                          "of 64 x 128 tiles, backward 32); off: the most slices whose blocks fit the SMs (4 / 16 "
                          "slices of 128 x 128 tiles, half their rows past the batch)"),
    SPLIT_F32_FWD=(0, "float forward's recurrent GEMM: this many K slices where they divide K in multiples of 16 "
                      "(0: split_k's choice); for measurements"),
    WAVEFRONT=(True, "multi-layer unidirectional stacks (LSTM projections included): forward and backward data as "
                      "the layer wavefront, layer l running step t at wave t + l * WAVE_CHUNK, one batched recurrent "
                      "GEMM and one cell launch per wave for all active layers (with a projection also the projection "
                      "GEMMs batched over runs of layers and one proj_commit / bwd_proj_pre launch per wave; "
                      "pydnn/ops/rnn/engine.py's _fwd_wavefront / _bwd_wavefront); False: layer after layer; None "
                      "(auto): the wavefront where a layer's step is at most engine.WAVE_AUTO_MACS multiply-adds "
                      "(engine.step_macs: the projection's counted). Measured on the H200 (training "
                      "forward / forward + backward, ms, wavefront against layer order): LSTM fp16 2L B 64 H 1024 "
                      "7.35 / 17.4 against 10.06 / 20.4; LSTM fp16 4L B 8 H 256 3.99 / 11.5 against 10.8 / 21.9; "
                      "GRU fp16 2L B 16 H 512 4.26 / 13.0 against 6.32 / 13.4"),
    WAVE_SPLIT=(None, "the wavefront's waves with several layers: True: each layer's recurrent GEMM on its own with "
                      "the layer order's split-K (one GEMM launch per layer); False: one GEMM batched over the layers, "
                      "K whole; None (auto): split where the K loop it saves outweighs the launches it adds "
                      "(engine.Geometry.wave_split, with the measurements; the backward decides once per call)"),
    WAVE_BWD=(None, "with WAVEFRONT, RNNBackwardData_v8 as the layer wavefront too (the top layer first; a layer's dy "
                    "from the layer above's dx GEMM chunk by chunk); False: the forward only; None (auto): LSTM "
                    "projection stacks, and others where a layer's step is at most engine.WAVE_AUTO_MACS multiply-adds "
                    "(measured on the H200: LSTM fp32 2L B 64 H 1024 backward 35.4 ms as the wavefront against 32.7 "
                    "layer after layer, the chunked dx GEMMs filling half the SMs; fp16 10.05 / 9.94; LSTM fp16 4L B 8 "
                    "H 256 7.5 / 11.3; LSTM fp16 2L B 64 H 1024 P 512 14.7 / 18.7: four launches a layer-step merged, "
                    "dx GEMMs of N = P)"),
    PROJ_SPLIT=(None, "the LSTM projection's per-step GEMM ([B, P] = m [B, H] x P^T, K = hidden) in this many K "
                      "slices where they divide hidden in multiples of 16 (partial sums added by proj_commit; more "
                      "blocks for the B x P output: 8 tiles at B 64, P 512); 1: K whole. The wavefront then runs each "
                      "layer's split GEMM instead of one batched over the wave's layers. None (auto): engine.split_k's "
                      "block-count rule (4 at B 64, P 512, hidden 1024 on 132 SMs). Measured on the H200, LSTM fp16 2L "
                      "B 64 H 1024 P 512 training forward: 4 slices 10.68 ms against K whole 11.69 (wavefront), 14.25 "
                      "against 18.99 (layer order)"),
    WAVE_CHUNK=(16, "the wavefront's lag between layers in steps, and the rows (steps) of a layer's chunked input "
                    "projection GEMM"),
    DIR_BATCH=(True, "a bidirectional layer's two directions step together in one GEMM and one cell launch; off: one "
                     "after the other (for measurements)"),
    RECORD=(True, "each call's launches are recorded on the handle and replayed when the same call repeats (no "
                  "Python per step); off: every call rebuilds its launches"),
    PERSIST_XCHG=(False, "PERSIST_STATIC forward: the blocks exchange h as tagged words (no barrier, see "
                         "ptx/rnn_persist.cu) where one round of loads covers the operand; off (default): the grid "
                         "barrier and the h load (measured faster on the H200: 4.58 vs 5.18 us a step, LSTM fp16 "
                         "hidden 256 batch 32)"),
    PERSIST_FLAGS=(False, "PERSIST_STATIC forward and backward: the blocks meet through one flag per block (a release "
                          "store of the step, polled by warp 0 with one coalesced acquire load) instead of the counter "
                          "(red.release); measured slower on the H200 (5.18 vs 5.11 us a step, LSTM fp16 hidden 256 "
                          "batch 32): off"),
    PERSIST_CHAIN2=(True, "PERSIST_STATIC 16-bit, forward and backward: a warp whose block GEMM has one tile runs two "
                          "accumulator chains (even and odd k steps); measured on the H200: 5.11 -> 4.82 us a step (the "
                          "GEMM phase 2550 -> 2031 cycles), forward + backward 5.37 -> 5.10 ms"),
    PERSIST_XS_AHEAD=(True, "PERSIST_STATIC forward (one chunk, the barrier): the input projection slice of step s + 1 "
                            "fetched during step s into a second buffer; measured 5.11 -> 4.87 us a step (off: fetched "
                            "just before the barrier, the step's wait for it showed in the barrier phase)"),
    PERSIST_FAST_MATH=(True, "PERSIST_STATIC forward, half / bfloat16: the cell's tanh and sigmoid on the hardware's "
                             "tanh.approx.f32 (~2^-11 relative, about half an fp16 ulp; y within 5e-4 of the exact "
                             "math's); measured 5.11 -> 4.90 us a step (cell phase 1579 -> 1175 cycles); float keeps "
                             "tanhf and 1 / (1 + exp)"),
    PERSIST_LEAN=(True, "PERSIST_STATIC forward with one K chunk and the barrier: persist_fwd's LEAN instance, the "
                        "tagged exchange and the chunk loop compiled out (a smaller step body); measured on the H200 "
                        "(2026-11-28 rnnp, the general kernel, 16-bit): LSTM H 256 B 32 4.36 -> 4.01 us a step, GRU "
                        "3.90 -> 3.70, bf16 bidirectional 4.59 -> 4.23, LSTM H 1024 B 16 5.81 -> 5.55: on"),
    PERSIST_REG=(True, "PERSIST_STATIC forward, half / bfloat16, 8 units a block (persist.reg_shape): persist_fwd_r, the "
                       "weight fragments in registers, h_{t-1} from L2 straight into the mma fragments (a permuted "
                       "K order), warps over (m tile, K slice) with every gate of a row in one thread, the cell "
                       "state and the next step's x in registers; measured on the H200 (SKIP_INPUT, us a step "
                       "against persist_fwd's): LSTM fp16 H 256 B 32 2.76 vs 4.36 (forward 1.414 ms, cuDNN 1.684 "
                       "with its input GEMM), GRU 2.66 vs 3.90, LSTM bf16 bidirectional 2.84 vs 4.59, LSTM fp16 "
                       "H 1024 B 16 3.39 vs 5.81; off: persist_fwd"),
    PERSIST_REG_XCHG=(False, "PERSIST_STATIC forward on persist_fwd_r (PERSIST_REG, at most 4 k steps a warp): the "
                             "blocks exchange h as tagged words (persist_fwd's format) read straight into the mma "
                             "fragments, no grid barrier; measured slower on the H200: 2.86 vs 2.76 us a step (LSTM "
                             "fp16 H 256 B 32; the gather's wait replaces the barrier's: h 1957 vs wait 566 + "
                             "arrive 1168 cycles): off"),
    PERSIST_REG_SLEEP=(False, "with PERSIST_REG_XCHG: a __nanosleep(64) between the tagged gather's rounds; measured "
                              "slower on the H200: 3.00 vs 2.86 us a step: off"),
    PERSIST_REG_ONE=(True, "persist_fwd_r with 4 or 8 K slices (one combo a thread: LSTM H 256 B 32) and fast math: "
                           "its ONE instance, the other combos' code and the exact math compiled out (18 KB of SASS "
                           "against 46); measured on the H200 (mid-session run 2): LSTM fp16 H 256 B 32 2.87 -> 2.66 "
                           "us a step (forward 1.361 ms, cuDNN 1.682), GRU 2.78 -> 2.58, LSTM bf16 bi 2.96 -> 2.75: on"),
    PERSIST_REG_CG=(False, "persist_fwd_r with the barrier: h_{t-1} through weak ld.global.cg loads (L1 bypassed) "
                           "instead of ld.relaxed.gpu; measured on the H200: no difference (2.88 vs 2.87 us a step): "
                           "off"),
    PERSIST_BWD_REG=(True, "PERSIST_STATIC backward data, half / bfloat16, 8 units a block, one chunk "
                           "(persist.bwd_reg_shape): persist_bwd_r, persist_fwd_r's scheme (W^T fragments in "
                           "registers, d_prev from L2 into the mma fragments, dh / dc carried in registers); "
                           "measured on the H200 (--mid: forward + backward data): LSTM fp16 H 256 B 32 4.083 -> "
                           "3.119 ms (cuDNN 4.651 with its weight gradients), GRU 3.802 -> 3.111, LSTM bf16 bi "
                           "4.269 -> 3.268: on"),
    PERSIST_UNITS=(0, "PERSIST_STATIC: at least this many hidden units a block (0: the fewest that fit, 8 at hidden "
                      "256: 32 blocks); more units, fewer blocks at the barrier and more work each (measured: 16 "
                      "units 6.28, 32 units 9.38 us a step against 8 units' 5.11)"),
    PERSIST_MAX_CHUNK=(0, "PERSIST_STATIC: the widest K chunk of the [batch, K] operand (0: no cap; the operand passes "
                          "through shared memory in chunks only where it does not fit at once); tests set it to force "
                          "several chunks"),
)

torch = Switches(
    "torch", "pydnn.torch's choices between pydnn calls (pydnn/torch/functional.py)",
    CONV_NHWC_FWD=(True, "the forward of such a convolution (see CONV_NHWC_BWD) on NHWC copies of x and the filter, "
                         "its output transposed back to NCHW: the direct NHWC tensor-core forward (fwd_wgmma on sm_90) "
                         "instead of the NCHW im2col GEMM (75 MB of columns at the CNN demo's second convolution); "
                         "the copies are kept for the backward, which then runs NHWC too"),
    LINEAR_FWD_SPLITK=(False, "Linear's forward y = x W^T with few output tiles and a long K (M, N <= 512, K >= 8 * "
                              "max(M, N), 16-bit) as the backward filter of a 1x1 convolution (pydnn.convolution_"
                              "backward_filter: the K reduction split over blocks into fp32 partials, folded in order) "
                              "instead of pydnn.matmul_ex. Off since pydnn.matmul splits K itself (gemm_wgmma_s + "
                              "splitk_reduce through the workspace the bridge asks for): at the CNN demo's classifier "
                              "(256 x 10 over K = 8192, H200, mid-session profile) the 1x1-conv path took ~49 us of "
                              "GPU time (implicit_gemm<2> 45.7 + fold 2.8), matmul_ex ~17; the step's GPU time 0.886 -> "
                              "0.854 ms. Before matmul's split-K (session 26): 114 us on pydnn.matmul"),
    CONV_NHWC_BWD=(True, "a 2-d NCHW half / bfloat16 convolution (groups 1) whose input and output channels are "
                         "multiples of 64 runs its backward data and backward filter on NHWC copies of dy, x and "
                         "the filter (pydnn.transform_tensor there and back), where the tensor-core kernels "
                         "(wgmma on sm_90) serve it, instead of the NCHW algorithms (Winograd / im2col GEMM); "
                         "the CNN demo's second convolution"),
    LINEAR_DW_SPLITK=(False, "Linear's weight gradient dW = dy^T x with a long reduction (tokens M >= 8 * max(N, K), "
                             "16-bit, contiguous) as the backward filter of a 1x1 NHWC convolution over M pixels "
                             "(pydnn.convolution_backward_filter, v7's first algorithm: wgrad_tc_wgmma splitting M "
                             "over blocks, fp32 partials folded in order) instead of pydnn.matmul_ex, whose plan for "
                             "the GPT demo's MLP weight gradients (3072 x 768 over M = 65536) is one whole-K "
                             "gemm_tc (mma.sync) launch of 72 blocks. Off until measured on the GPU"),
    LINEAR_DW_KSPLIT=(8, "S >= 2: Linear's weight gradient dW = dy^T x with a long reduction (tokens m >= 8 * max(N, "
                         "K), 16-bit, m a multiple of 8 S) as one batched pydnn.matmul of S chunks of m (the batch "
                         "multiplies the output tiles: the GPT demo's MLP dW is 72 tiles of 128 x 256, one wave at "
                         "55% of an H200's SMs, walking m = 65536 whole on gemm_tc) into S 16-bit partials, summed by "
                         "torch.sum in float (one extra rounding of each partial: max-norm error 4.1-4.4e-3 against "
                         "3.1e-3 whole-K); where pydnn.matmul asks no workspace to split K itself and "
                         "LINEAR_DW_SPLITK does not take it. 0: off. H200 (mid-session runs, session 29): the MLP "
                         "dW 1.62 / 1.59 ms -> 0.47 / 0.48 (S = 8; S = 2 / 4 / 16: 0.69 / 0.53 / 0.46; PyTorch "
                         "0.40 / 0.42); the GPT demo's step 124.7 -> 97.8 ms (PyTorch 92.9; second run 123.7 -> "
                         "99.2 against 93.5). S = 8: the value measured on the whole step"),
    FUSE_MLP=(False, "pydnn.torch.convert(fuse=True) runs an nn.Sequential's Linear -> GELU -> Linear (no biases; "
                     "the GPT demo's MLP) as one autograd Function (pydnn.torch.functional.mlp): the GELU in the "
                     "first GEMM's epilogue (which also writes the pre-activation for the backward) and its "
                     "gradient in the epilogue of the backward's dy @ W2, both through the graph API's fusion "
                     "engine. Off: slower on the H200 (session 29, GPT demo's block, 65536 tokens): forward 1.669 "
                     "ms fused against 1.152 unfused (the generated two-output GEMM is slower than gemm_tma + the "
                     "GELU kernel), backward 4.425 against 4.542; the step 103.5 ms against 99.2 (both with "
                     "LINEAR_DW_KSPLIT 8)"),
    FUSE_POOL=(True, "a BatchNorm2d that pydnn.torch.convert(fuse=True) gave the following MaxPool2d runs the pool in "
                     "its own autograd Function in training (batch norm [+ ReLU] then pooling_forward; backward "
                     "pooling_backward then the batch norm's): one node instead of two, without the pool module's "
                     "call, checks and Function entry (~30 us a block of host time on the 2-core dev CPU). False: "
                     "max_pool2d after the batch norm (eval mode always)"),
    FUSE_BLOCK=(True, "a Conv2d that pydnn.torch.convert(fuse=True) found followed by a BatchNorm2d (its ReLU and "
                      "max pool fused as above) runs conv + bias + batch norm [+ ReLU] [+ max pool] in one autograd "
                      "Function in training (ConvBatchNormFunction; the batch norm module passes its input through), "
                      "the convolution's float32 weight and bias cast to autocast's dtype inside it: one node and "
                      "module call a block instead of two, and no autograd nodes for the two casts. False (or eval "
                      "mode): the convolution, then the batch norm"),
    FOLD_CASTS=(True, "under autocast, Linear's float32 weight and bias go into its autograd Function as they are "
                      "and are cast to the autocast dtype there (their gradients cast back to float32 in its "
                      "backward): the values autocast's own casts give, without an autograd node (ToCopyBackward) "
                      "for each. False: autocast's casts before the Function"),
    BLOCK_NHWC=(True, "a fused block (FUSE_BLOCK) whose convolution runs on NHWC copies (CONV_NHWC_FWD: the CNN "
                      "demo's 64 -> 128 layer) keeps the NHWC convolution output for its batch norm and max pool "
                      "(the pool writes the block's output in x's NCHW layout; the backward's batch-norm gradient "
                      "goes to the NHWC convolution backward as it is), and under FOLD_CASTS casts the float32 "
                      "weight to the compute dtype in the transform that makes its NHWC copy (the weight gradient "
                      "back to float32 in the transform to NCHW): two transforms and two casts fewer a step (four "
                      "launches, four allocations and their pydnn / torch calls: a host-bound step's time). Eager "
                      "only (under CUDA graph capture the block takes the path without it: its NHWC-in / NCHW-out "
                      "max-pool backward took 191 us of GPU time where the NCHW window kernel takes ~20; H200). "
                      "False: the convolution's output back to NCHW before the batch norm, the casts by torch"),
    BLOCK_LEAN=(True, "a fused block (FUSE_BLOCK) with its ReLU and max pool, in training: the backward's "
                      "temporaries (the pool's and the batch norm's gradients, the NHWC gradient copies, the 16-bit "
                      "weight / bias gradients before their cast) are pointers into one workspace buffer (the "
                      "stream's kept one, tuning.torch.FAST_CALLS) instead of a torch allocation each, the "
                      "parameters' casts (float32 <-> autocast's dtype) are pydnn.transform_tensor calls instead of "
                      "Tensor.to, and the forward's 16-bit bias is a pointer into the workspace too: 11 torch "
                      "operations fewer a step of the CNN demo (6 casts; 9 allocations, each cast's included; "
                      "tests/torch/test_torch_block_lean_cpu.py, test_torch_step_work_cpu.py). On the H200 "
                      "(tools/bench_cnn_step.py, mid-session run of session 32) its own effect was within the "
                      "host's run-to-run spread: 1.054x PyTorch's step with it (one run), 1.096x / 1.028x without; "
                      "the chain's 1.011x / 1.014x ran with it. False: the block's general path"),
    BLOCK_ARENA=(True, "a BLOCK_LEAN block's training forward (affine batch norm) allocates the tensors that only "
                       "its backward reads (the NHWC copy of x, the 16-bit / NHWC filter, the convolution's output, "
                       "the batch norm's output and its statistics / reserve buffer) as one buffer, pydnn's calls "
                       "taking pointers into it (the backward's general path, where it runs, takes views of it): "
                       "7 torch allocations and 7 saved tensors fewer a CNN demo step (4 of 6 allocations in the "
                       "second block's forward, 3 of 5 in the first's). H200 (tools/bench_cnn_step.py, session 32's "
                       "second mid-session run, one process; its A/B runs were lost to a kernel compile): pydnn's "
                       "step 0.936x PyTorch's (2.565 / 2.741 ms), its forward's host time 0.875 ms against PyTorch's "
                       "0.895 (60-126 us over before). False: one allocation each"),
    LINEAR_LEAN=(False, "Linear under autocast with its casts folded (FOLD_CASTS), weights up to 2^18 elements (the "
                       "host-bound CNN demo's classifier; not the GPT demo's projections): the float32 weight and "
                       "bias cast "
                       "by pydnn.transform_tensor instead of Tensor.to (the 16-bit bias into the workspace buffer, "
                       "after the matmul's workspace), the bias added by pydnn.add_tensor instead of Tensor.add_, "
                       "the weight / bias gradients cast back by transform_tensor: 5 torch operations and an "
                       "allocation fewer a call (the same values: each cast rounds to nearest even, the bias sum is "
                       "float math rounded once). Off: not yet timed on the GPU (the first mid-session run of "
                       "session 32 had the tree before it, the second's A/B was killed by a kernel compile; on the "
                       "CPU stand-in its step time equals the default's; tests/torch/test_torch_block_lean_gpu.py "
                       "compares it on and off)"),
    FUSE_CHAIN=(True, "an nn.Sequential that pydnn.torch.convert(fuse=True) found made of fused conv + batch norm "
                       "blocks (FUSE_BLOCK), nn.Flatten and Linear (the CNN demo's model) runs its training forward "
                       "as one autograd Function (pydnn.torch.functional.ChainFunction: each stage's own forward and "
                       "backward bodies, one node) once every stage has its call record, without hooks on any "
                       "child: two Function entries and backward nodes and nine module calls fewer a CNN demo step "
                       "(read by convert(fuse=True), which then gives the Sequential pydnn.torch's Sequential class, "
                       "and at every call). Measured (H200, tools/bench_cnn_step.py, pydnn beside PyTorch in one "
                       "process, interleaved; mid-session run of session 32): 1.011x / 1.014x PyTorch's step in two "
                       "runs (pydnn's host time +82 / +114 us over PyTorch's) against 1.054x (+217 us) without it; "
                       "the same values as module by module (GPU test): on"),
    FAST_CALLS=(True, "the bridge's per-call host path: each functional op keeps a call record per (input shape, "
                      "strides, dtype, device, options) holding what its checks and plan lookups found the first "
                      "time (descriptors, output shapes and strides, workspace sizes, the convolution's plans), so "
                      "a repeated call goes from the record to the pydnn call; autograd Functions entered through "
                      "torch.autograd.Function's C entry (pydnn.torch._core.applier). False: every call checks "
                      "and looks up in full (the path before)"),
)

graph = Switches(
    "graph", "the graph API's generated pointwise kernels (pydnn/graph/codegen.py, engines.PwStep)",
    PW_SPLIT=(True, "the vector and element-by-element forms of a generated pointwise kernel as two loops (the "
                    "kernel picks one by its alignment flag) instead of one loop testing the flag, where the compiler "
                    "predicates both forms' loads into the body (~30 issue slots an 8-element run of the 8-op chain)"),
    PW_RUNS=(2, "runs (16-byte vectors of an operand) a thread per iteration, a warp's span apart (1, 2, 4, ...; "
                "fewer where 32 x run x this does not divide the innermost dim): more loads in flight, one index "
                "walk for all (H200, the 8-op chain with s, b broadcast, exact math, 16 an SM: 1 run 522-524, 2 runs "
                "497, 4 runs 478-481, 8 runs 625 us: 104 registers; with the 16-bit forms, 16 an SM: 4 runs 339, 2 "
                "runs 323, 1 run 343 us: 2 runs leave room for more resident blocks)"),
    PW_GRID=(-8, "blocks of 256 an SM of a pointwise launch: 0 the blocks resident at once (one wave, the driver's "
                 "occupancy of the kernel, asked at the first launch on a handle), -k: k such waves (at most 8 "
                 "resident blocks a wave); n > 0: at most n an SM (H200, the broadcast chain, 16-bit forms, 2 runs, "
                 "8 resident: one wave 334, 16 an SM 307, 4 waves 296, 8 waves 291 us)"),
    PW_MIN_BLOCKS=(8, "__launch_bounds__(256, n) of a generated pointwise kernel (0: none): caps its registers at "
                      "65536 / (256 n) (8: 32 registers, 8 resident blocks), applied only to the class it was "
                      "measured on (engines.PwStep: sm_90, bfloat16 outputs, <= 8 nodes, at most "
                      "PW_MIN_BLOCKS_RUNS 16-byte runs held, no strided input; elsewhere 32 registers spilled). "
                      "H200, the broadcast chain, 16-bit forms, 2 runs, 4 waves: 38 registers / 6 blocks 307, "
                      "32 / 8 blocks 296 us"),
    PW_MIN_BLOCKS_RUNS=(4, "the most 16-byte runs a thread may hold (contiguous inputs x runs, doubled by "
                           "PW_PREFETCH) for PW_MIN_BLOCKS to apply; no strided input either (the chain with s, b "
                           "full, 3 x 2 runs, spilled 40 bytes at 32 registers: 631 instead of 508 us)"),
    PW_RANGE=(True, "TANH_FWD of a value a RELU_FWD clips into [0, 9] (slope 0) as tanh_nonneg: tanhf's bits there "
                    "without its saturation and sign steps (3 instructions an element less); off: tanhf"),
    PW_GELU_FAST=(True, "GELU_FWD in a generated kernel whose outputs are all 16-bit by the activation family's "
                        "16-bit GELU (gelu_fast: <= 7.9e-6 relative, >= 30x below a 16-bit half ulp; ~10 instructions "
                        "an element less than erff's form; pydnn.activation_forward computes 16-bit GELU so too); "
                        "off: erff (float outputs always). The 8-op chain with s, b broadcast is compute-bound "
                        "(tools/PERF.md): 46.6 -> 38.5 instructions an element"),
    PW_PREFETCH=(False, "the vector loop of a generated pointwise kernel as a software pipeline: the next "
                        "iteration's offsets and 16-byte loads issued before this iteration's arithmetic, held as "
                        "loaded (codegen._prefetch_block); a candidate for the broadcast 8-op chain, whose "
                        "arithmetic (27.4 issue cycles a warp-element) nearly matches its memory time (32.2)"),
    PW_GELU_DEG5=(True, "with PW_GELU_FAST, where every output is bfloat16: gelu_fast's polynomial at degree 5 "
                        "(gelu_fast5: <= 1.5e-5 relative, 130x below bfloat16's half ulp; 2 FFMA an element less: "
                        "the chain's loop 27.0 instructions an element at 2 runs; H200, broadcast chain, 2 runs, 8 "
                        "resident, 4 waves: 311 -> 296 us)"),
    EPI_GELU_EX2=(True, "with PW_GELU_FAST, GELU_FWD in a fused matmul epilogue whose every output is bfloat16 as "
                        "gelu_ex2 (one MUFU: max(x, 0) - |x| 2^h(|x|), h a degree-9 polynomial; <= 3.97e-5 relative, "
                        "every float32 scanned, tools/gelu_ex2.py) instead of gelu_fast5 (RCP + EX2): 14 instructions an "
                        "output with the bias add instead of 15, half the MUFU work. H200 timeline (clock64, every SM): "
                        "the bias + GELU epilogue 7.88 -> 7.57 kc a tile (16384x4096x4096) and 7.90 -> 7.59 "
                        "(16384x11008x4096); with EPI_STSM 7.13 -> 6.81 / 7.14 -> 6.83. Off: gelu_fast5 (<= 1.5e-5); "
                        "the pointwise chain keeps gelu_fast5 (not measured there)"),
    PW_TANH_FAST=(True, "TANH_FWD in a generated kernel whose outputs are all bfloat16 by tanh.approx.f32 (MUFU.TANH, "
                        "<= 2^-10.99 relative, a quarter of bfloat16's half ulp; the RNN's PERSIST_FAST_MATH form): 1 "
                        "instruction where tanhf takes ~15, tanh_nonneg 12; off: tanhf / tanh_nonneg. With PW_GELU_FAST "
                        "the chain's vector loop is 27.4 instructions an element (SASS, sm_90), under the 32 cycles a "
                        "warp-element of copy bandwidth"),
)

callpath = Switches(
    "callpath", "host work per call (pydnn/ops/_replay.py, pydnn/ops/mha.py's plans, libpydnn's C fast path)",
    MHA_PLANS=(True, "the legacy multi-head attention calls keep a recorded plan per descriptor set and replay it "
                     "(pointers patched); off: every call validates, plans and launches in full (for measurements)"),
    C_LAUNCH=(True, "element-wise launches (run_map) patch and launch in one compiled call (pydnn/_build/fastcall.py) "
                    "where a C compiler and cffi are present; off: struct.pack_into + cuda.bindings (read when a launch "
                    "record is first used)"),
    C_ENTRY=(True, "activation_forward's cached call answered by one compiled function (pydnn/_build/fastcall.py's "
                   "act_fwd: handle, key, scalars, int pointers / torch tensors and the launch, no Python frame but "
                   "the entry's; read when the first compiled launch record is made); off: the Python function. "
                   "H200 host, alternating rounds: 4.95 against 5.09 us a call with torch tensors, 4.38 against "
                   "4.46 with int pointers (the bare compiled launch 3.75)"),
    C_ENTRY_SITES=(True, "with C_ENTRY: the compiled entry remembers each call site's handle, descriptors and record "
                         "(16 slots) under the records' generation (RECORDS_GEN: moved by every Set / Destroy / "
                         "set_stream / switch change), so a repeated call skips the handle, version, key and record "
                         "lookups; off: every call looks them up (read when the entry is set up). H200 host, "
                         "alternating rounds: 3.73 against 4.17 us a call with int pointers, 4.34 against 4.71 "
                         "with torch tensors (the compiled launch alone 3.67)"),
    C_ENTRY_MAP=(True, "with C_ENTRY and C_ENTRY_SITES: activation_backward, add_tensor, scale_tensor, op_tensor, "
                       "transform_tensor, softmax_forward, pooling_forward, reduce_tensor, "
                       "batch_normalization_forward_inference, norm_forward_inference and convolution_forward / "
                       "backward_data / backward_filter (a one-launch plans.Plan) become compiled entries too "
                       "(pydnn/_build/fastcall.py's mk_try): a repeated call is answered from the call site's slot, which the Python function's cached path fills "
                       "(map_note), with activation_forward's checks of scalars and buffers and its launch; off: the "
                       "Python functions (read when the first compiled launch record is made). CPU stand-in "
                       "(tools/bench_host_cpu.py): add_tensor 3 -> 0 Python frames and 1.14 -> 0.19 us of CPU a "
                       "call, softmax_forward 5 -> 0 and 2.46 -> 0.38 us"),
    CALL_RECORDS=(True, "a call of convolution_forward / _backward_data / _backward_filter / "
                        "_bias_activation_forward / _backward_bias or pydnn.matmul / matmul_ex that passed its checks "
                        "leaves a call record (plan, spans) under its descriptors and their versions; a repeated call "
                        "checks only its scalars, buffers and workspace and runs the plan; off: no new records, every "
                        "call validates in full (for measurements). H200 host, the CNN demo's shapes "
                        "(tools/bench_host_cnn.py): conv forward 13.2-15.1 -> 7.8-9.7 us a call (its launch alone "
                        "5.4), backward data 11.9-12.9 -> 8.0-8.5, matmul 9.3-9.5 -> 7.2-8.0"),
    # (CALL_REPLAY, batch norm's training calls replayed from recorded launches, removed in session 31: the CNN
    # demo's buffers move between steps, so each replay re-patched its pointers in Python; H200, the demo's step in
    # tools/profile_torch_step.py: 4.20 ms with it against 3.08 without)
)

apply_environment()
