"""Fused attention benchmark: pydnn vs PyTorch's scaled_dot_product_attention with the cuDNN backend and
with the flash backend, in the same run (bf16, BHSD, batch 4, sequence 4096).

FLOPs: forward 4 * B * Hq * S^2 * D (two GEMMs of 2 * S^2 * D per head), half of it when causal;
backward 2.5x the forward's count (five GEMMs, the one of S recomputed not counted separately, the
convention of FlashAttention's papers and of the issue). The floor is compute: ~790 TFLOP/s measured dense
bf16 (990 datasheet) with wgmma; mma.sync tops out lower on the H100 (about 2/3 of wgmma's rate).

Configurations (issue 5): head dim 128 with heads 32/32, 64/8, 128/8; head dim 64 with 32/32; causal and
not. Target: forward >= 0.6x cuDNN, backward >= 0.5x.

Versions (H200, torch 2.11 / cuDNN 9.19 in the same run; TFLOP/s, ratio to cuDNN / to flash):
  v1  forward fwd<T, D> 128-row CTAs, 4 warps x 32 rows, Q in smem for D = 128 (registers for D = 64),
      K/V tiles double-buffered with cp.async (64 keys; 32 at D = 128, where 64 spilled 104 bytes);
      backward = preprocess + dK/dV kernel (64 keys per CTA, loops over the group's heads) + a separate
      dQ kernel (64 rows per CTA), no atomics (deterministic).
      Prediction: forward 250-330, backward 150-200 (the dQ pass recomputes S and dP: 7 GEMMs of work
      against the 5 counted). Measured:
        fwd  d128 32/32 269 (0.39x cuDNN 684, 0.78x flash)  causal 250 (0.42x, 0.84x)
             d128 64/8  274 (0.46x, 0.79x)                  causal 259 (0.42x, 0.81x)
             d128 128/8 276 (0.46x, 0.79x)                  causal 263 (0.50x, 0.80x)
             d64  32/32 277 (0.58x, 0.96x)                  causal 254 (0.59x, 0.90x)
        bwd  d128 32/32 179 (0.35x cuDNN 506, 0.62x flash)  causal 170 (0.38x, 0.65x)
             d128 64/8  178 (0.35x, 0.61x)                  causal 164 (0.37x, 0.62x)
             d128 128/8 179 (0.35x, 0.60x)                  causal 164 (0.37x, 0.62x)
             d64  32/32 174 (0.41x, 0.65x)                  causal 165 (0.42x, 0.72x)
      Prediction held for the forward's lower end; D = 64 (64-key tiles, Q in registers) is at flash's
      rate, D = 128 (32-key tiles) at 0.8x of it: per-tile overhead (two barriers, the softmax's
      shuffles) is paid twice as often.
  v2  (a) forward: fwd<T, D, BN, BNL> (keys per compute step / per K/V tile in smem); at D = 128 the
      tiles 32/32 (v1's), 32/64 (two steps per barrier pair) and 64/64 (spills ~100 bytes) are all
      instantiated and measured ([tile n/nl] rows: the plain row is the default, 32/32); the O rescale
      of the online softmax skipped when no row of the warp moved its maximum (warp vote).
      (b) backward: the dK/dV kernel's per-tile lse / dsum were plain global loads stalling warp 0
      before each tile (everyone then waits at the barrier): now cp.async with the tile.
      (c) deterministic = 0 (the plain bwd rows): dQ by fp32 atomics (red.global.add.v2.f32) from the
      dK/dV kernel, dS^T staged in smem, each warp a quarter of the head dim; no dQ pass.
      deterministic = 1 keeps v1's dQ pass ([deterministic] rows).
      Prediction: forward +5-15% at D = 128 (32/64), +0-5% at D = 64; backward atomic +30-50% over v1.
      Measured (same run as cuDNN / flash; the GPU tests of that run stopped on a test-harness bug, so
      these v2 paths were timed but not yet checked against the reference on the GPU):
        fwd  d128 32/32 265 (0.40x cuDNN 665, 0.78x flash)  causal 242 (0.41x, 0.81x)
             d128 64/8  273 (0.46x, 0.79x)                  causal 254 (0.42x, 0.80x)
             d128 128/8 275 (0.46x, 0.80x)                  causal 258 (0.48x, 0.79x)
             d64  32/32 264 (0.54x, 0.88x)                  causal 239 (0.55x, 0.84x)
             tiles 32/64 and 64/64 within -1%..+2% of 32/32 everywhere: the barrier count is not
             what holds D = 128 back.
        bwd atomic (det 0)   d128 32/32 206 (0.40x cuDNN 511, 0.71x flash)  causal 197 (0.43x, 0.75x)
                             d128 64/8  202 (0.40x, 0.68x)                  causal 177 (0.39x, 0.68x)
                             d128 128/8 202 (0.40x, 0.68x)                  causal 172 (0.38x, 0.65x)
                             d64  32/32 198 (0.46x, 0.73x)                  causal 186 (0.48x, 0.81x)
        bwd deterministic    d128 181 / 174c, 183 / 169c, 184 / 168c; d64 175 / 167c (0.35-0.43x cuDNN)
      Outcome: backward atomic +12-15% over v1 non-causal, +3-13% causal (predicted +30-50%: the
      atomics and the dQ GEMM's smem traffic cost more than the saved recompute); the async lse gave
      the deterministic path +2-3%. The forward's rescale skip cost 1-5% (D = 64 most): reverted, so
      the forward is v1's again (v1 numbers above). Defaults: forward tile 32/32; bwd by the flag.
  Next (not done): the D = 128 forward at 0.8x of flash is what separates it from flash's ~345; after
  that mma.sync itself is the ceiling (cuDNN's 600-680 here is wgmma + TMA + warp specialization: the
  planned port swaps tile_qk / tile_pv / load_tile for wgmma / TMA versions).
  v3 forward on wgmma (ptx/attention_wgmma.cu, sm_90a units; the dispatcher takes it on sm_90 without
      dropout; [mma.sync n/nl] rows time v1's kernel in the same run, [wgmma bn N plain] the variant
      without the overlap): 128 query rows per CTA = two warpgroups x 64 rows, K/V tiles of 128 keys
      double-buffered with cp.async in the 128B-swizzled layout (160 KiB smem at D = 128: one CTA per
      SM, 176-230 registers, no spills), S = Q K^T by SS wgmma m64n128k16, softmax on the accumulator
      fragment, O += P V by the register-A wgmma (P stays in registers); pipe: S_j issued together
      with P_{j-1} V_{j-1}, tile j's softmax runs while that P V is on the tensor cores.
      Count per 128-key tile and SM: 8.4 MFLOP of MMA (~1.4 us at the measured 790 TFLOP/s / 132 SMs)
      against 16K exp2 on MUFU (16 / clock / SM: ~0.6 us) plus the max / FMA / pack work.
      Prediction: plain (no overlap) 330-420 at D = 128 (MMA and softmax in series: ~2.1 us a tile),
      pipe 420-520 (the softmax hidden behind the P V half); D = 64 lower in TFLOP/s (half the MMA per
      exp2): pipe 330-420. Non-causal vs causal within 10% (longest blocks first, the diagonal tile
      masked per warpgroup).
      Measured (v3a = pipe, 2 stages, the copies issued right after the barrier; run 3 of the session,
      the same code as run 1; cuDNN / flash in the same run; TFLOP/s, ratio to cuDNN / to flash):
        fwd  d128 32/32 440 (0.65x cuDNN 680, 1.27x flash)  causal 406 (0.68x, 1.37x)
             d128 64/8  438 (0.72x, 1.27x)                  causal 407 (0.67x, 1.25x)
             d128 128/8 430 (0.72x, 1.23x)                  causal 411 (0.77x, 1.25x)
             d64  32/32 333 (0.69x, 1.10x)                  causal 306 (0.70x, 1.08x)
        (run 1: 438 / 405, 439 / 408, 435 / 408, 331 / 306: within 1%.) v1's mma.sync in the same run:
        269 / 246, 274 / 255, 279 / 259, 277 / 246 (x1.6 at d128, x1.2 at d64).
      Outcome: the 0.6x target is met everywhere (0.65-0.77x), inside the predicted band at d128 but
      not for the reason predicted: plain (no overlap) runs 421-429 / 385-395 at d128 and 326 / 294 at
      d64, within 0-5% of pipe, so the overlap buys almost nothing. Diagnostics ([diag] rows, wrong
      results, benchmark-only units: the same loop without softmax / without wgmma), d128 32/32:
      no softmax 582 (1.90 us a 128-key tile and SM), no wgmma 686 (1.61 us), full 440 (2.52 us); d64:
      549 / 461 / 333. Neither half is near its floor alone: the MMA-and-copy loop runs at 0.74x of
      the 790 measured peak and the softmax-and-copy loop takes more than the exp2 count explains (1.6
      us against ~0.6 us of MUFU). Both carry the cp.async copies (64 KiB a tile and SM at d128, 256
      threads x 16 copies with their address math; every CTA streams all of its head's K/V through
      L2: ~8.6 GB per h32/32 forward, ~14 TB/s at 440) and one CTA-wide barrier a tile, which keeps
      the two warpgroups in lockstep (their softmaxes run at the same time, so the tensor cores only
      have the P V half to overlap with). Tried and not kept (the letters are runs' variants):
        (b) the copies issued after the S wgmma's wait<1> (during P V): -3% at d128, -8% at d64 (they
            delay the softmax on the critical path); issued between the wgmmas and that wait, ptxas
            serializes the wgmmas (C7514).
        (c) 3 stages (copies two tiles ahead, 230 KB of smem at d128): -2%..+1% at d128, -7% at d64
            (latency is not what limits).
  v3b load_tile with one pointer and one shared address per thread advanced by constants, and the row
      test only on a tile crossing the length (v3a: per-chunk index math and a 64-bit multiply; 230 ->
      203 registers at d128). Prediction: +2-5% (the copies are issued ahead of the S wgmma, on the
      critical path). Measured (run 4, same run as cuDNN / flash):
        fwd  d128 32/32 459 (0.71x cuDNN 644, 1.35x flash)  causal 422 (0.71x, 1.37x)
             d128 64/8  452 (0.75x, 1.31x)                  causal 424 (0.71x, 1.32x)
             d128 128/8 451 (0.75x, 1.30x)                  causal 428 (0.79x, 1.31x)
             d64  32/32 pipe 316 (0.65x), plain 335 (0.69x cuDNN 486, 1.10x flash)
                        causal pipe 292 (0.67x), plain 306 (0.70x cuDNN 438, 1.08x flash)
      diag d128 32/32: no softmax 651 (was 582: the copies weighed on the MMA floor too), no wgmma 781.
      Outcome: +3-5% at d128 as predicted; at d64 pipe lost 5% (its registers went 174 -> 160 and
      ptxas scheduled it differently) while plain gained 3%: d64 now defaults to plain (TILE), d128 to
      pipe. Final defaults: 0.69-0.79x cuDNN, 1.08-1.37x flash, everywhere >= the 0.6x target.
  Next (not done): TMA for K/V (no per-thread copy instructions, one elected thread, mbarrier
  completion) with a producer warp and per-buffer full / empty mbarriers instead of __syncthreads, so
  the two consumer warpgroups can run out of phase (FA3's ping-pong: one's softmax under the other's
  GEMMs); TMA multicast over a 2-CTA cluster to halve the L2 traffic of K/V.
  v4 backward on wgmma (ptx/attention_wgmma_bwd.cu, sm_90a; the plain and [deterministic] bwd rows):
      the dK/dV kernel moved to wgmma, FA3-like but without warp specialization: a CTA of two
      warpgroups owns 128 keys (64 each, wgmma M = 64) and loops over the group's heads and query
      tiles (64 rows at D = 128, 128 at D = 64; Q, dO, lse, dsum double-buffered with cp.async in
      128B-swizzled smem). S^T = K Q^T and dP^T = V dO^T as SS wgmma (one group), P^T / dS^T in
      registers, dV += P^T dO and dK += dS^T Q as register-A wgmma (MmaRS, first use on a GPU), and
      (deterministic = 0) dS^T staged in smem, dQ = dS K as one more SS wgmma per warpgroup (half
      the head dim, or half the query rows at D = 64) added with red.global.add.v2 (half the
      atomics per FLOP of v2: 128-key blocks). deterministic = 1: this kernel without dQ + v1's
      mma.sync dQ pass. bwd_pre / bwd_dq_convert unchanged; dropout stays on mma.sync.
      Prediction (before measuring): atomic bwd d128 230-300 TFLOP/s (0.45-0.6x cuDNN), causal
      10-15% lower; d64 200-260; deterministic 200-250 (the mma.sync dQ pass, an estimated ~45% of
      v2's time, stays). The phases of a warpgroup are serial (MMA, softmax, MMA, barrier, MMA, atomics): the
      other warpgroup is the only overlap, which is what keeps it under FA3 / cuDNN.
      Measured (first GPU run; 52/52 wgmma backward tests passed, MmaRS's fragment layout as
      documented; same run as cuDNN / flash; the forward rows of that run are the other helper's):
        bwd atomic (det 0)   d128 32/32 328 (0.64x cuDNN 510, 1.13x flash)  causal 298 (0.65x, 1.13x)
                             d128 64/8  332 (0.65x, 1.13x)                  causal 280 (0.63x, 1.06x)
                             d128 128/8 334 (0.66x, 1.13x)                  causal 273 (0.61x, 1.03x)
                             d64  32/32 272 (0.62x, 1.01x)                  causal 242 (0.62x, 1.04x)
        bwd deterministic    d128 246 / 231c, 247 / 228c, 249 / 227c; d64 206 / 190c (0.47-0.51x cuDNN)
      Outcome: atomic over v2 +51-65% at d128, +30-37% at d64 (0.61-0.66x cuDNN, above the
      prediction's top); deterministic +33-36% at d128, +14-18% at d64, held back by the mma.sync dQ
      pass (0.47-0.51x).
  v4b (a) deterministic dQ on wgmma too: bwd_dq_wg, 128 query rows per CTA (64 per warpgroup), K / V
      tiles of 64 keys double-buffered; S = Q K^T, dP = dO V^T (SS), dQ += dS K (MmaRS, K MN-major);
      2 CTAs / SM at D = 64 (126 registers). (b) both kernels: S in its own wgmma group, so the
      exponentials of P run while the dP MMAs do (wait<1>, then wait<0> before dS).
      Prediction: deterministic 290-320 at d128 (>= 0.55x), 240-260 at d64; atomic +0-5% from (b).
      Measured (second GPU run: 52/52 wgmma backward tests and tests/ops/attention/test_attention_gpu.py passed; cuDNN
      and flash in the same run):
        bwd atomic (det 0)   d128 32/32 326 (0.64x cuDNN 509, 1.13x flash)  causal 295 (0.64x, 1.13x)
                             d128 64/8  329 (0.65x, 1.12x)                  causal 280 (0.62x, 1.07x)
                             d128 128/8 331 (0.65x, 1.11x)                  causal 278 (0.61x, 1.04x)
                             d64  32/32 279 (0.61x, 1.05x)                  causal 247 (0.64x, 1.07x)
        bwd deterministic    d128 32/32 306 (0.60x, 1.06x)                  causal 276 (0.60x, 1.06x)
                             d128 64/8  313 (0.61x, 1.07x)                  causal 272 (0.61x, 1.04x)
                             d128 128/8 312 (0.61x, 1.05x)                  causal 274 (0.60x, 1.03x)
                             d64  32/32 266 (0.58x, 1.00x)                  causal 238 (0.61x, 1.03x)
      Outcome: (a) deterministic +19-27% at d128, +25-29% at d64 over v4 (now 0.58-0.61x cuDNN, within
      1-6% of the atomic mode), as predicted at d128 (causal at its low end), above it at d64.
      (b) -1..+2% at d128 (noise), +2-3% at d64: kept (no register or spill cost). Both modes
      >= 0.58x cuDNN on every configuration.
  Next for the backward (not done): warp specialization (a producer warp with TMA and setmaxnreg, as
  FA3) so that the two warpgroups' MMAs overlap each other's softmax and the dQ step; the dQ atomics
  through TMA reduce-add; the barrier between dS^T's store and the dQ MMA is the one CTA-wide sync
  left per tile besides the tile's own.
  v5 (issue 19) head dims 96 / 256 and decode ([run_hdim] and [run_decode] rows, `--families
      attention.run_hdim` / `attention.run_decode` alone). Forward on wgmma: D = 96 as D = 128 with 32
      zero columns in smem (S over the 6 real k16 steps, P V over 128 columns: 195 registers), D = 256
      with 64-key tiles (237 registers). Backward: D = 96 on wgmma (D = 128's tiles, zero padding),
      D = 256 on mma.sync with dK / dV split in head-dim halves over two CTAs (S^T and dP^T twice) and
      16-row / 16-key tiles. Decode (sq <= 16, no dropout): dec + dec_combine, the K/V length split so
      that a single sequence gives every SM two CTAs; bytes counted are K + V (+ Q, O), against the
      ~3.0 TB/s copy rate.
      Prediction (before measuring): d256 forward 0.55-0.7x cuDNN (d128's wgmma reached 0.71-0.79x;
      half the keys per tile); d256 backward 0.25-0.35x (mma.sync and the doubled S / dP); d96 forward
      0.5-0.6x (d128's wgmma rate per padded FLOP, x 0.75), backward 0.45-0.55x (d128's 0.6-0.65x, x
      0.75). Decode: >= 1.5 TB/s at b 1 for kv >= 32k (against ~0.2 TB/s with one split: 8 CTAs),
      >= 0.8x the faster of cuDNN / flash.
      First GPU run (H200, mid-session, at 354bad6: before the D = 96 wgmma backward): 47 / 47 bf16
      tests passed (decode: every split count, GQA rows, causal, lengths, capture; d96 / d256 forward and
      backward on mma.sync; the d96 / d256 wgmma forward); not yet timed.
  v6 (issue 19, branch decode) decode at small batch. The H200 decode sweep of 2026-11-28 (s26a) had
      14 of 32 points below 0.8x the faster of cuDNN / flash, all at batch 1..16: (a) the split count
      asked for two CTAs an SM rounded up, so b4 made 9 x 32 = 288 CTAs on 264 places and b16 3 x 128 =
      384: a second wave of a few CTAs as long as the first (0.65-0.70x at b4, ~3.0 TB/s); now
      split_cost counts whole waves and best_splits picks 8 / 2 / 33 (256 / 256 / 264 CTAs); (b)
      dec_combine summed the splits one after another in one warp per row (a load round trip per split:
      ~33 at b1); now one CTA per row, four warps over the splits, four 16-byte loads in flight a lane;
      (c) a call cost ~80 Python calls (~39 us on the 2-core CPU stub, tools/bench_host_cpu.py), above the
      GPU time of the b1 / b4 kv 4k-16k points (the sweep's back-to-back timing shows host time there:
      cuDNN's own floor was ~35 us); now a repeated call replays a record kept on the handle (9 Python
      calls, ~5 us on the stub, plus the launches). `--decode-splits` times forced split counts around
      the pick and the host-bound floor.
      Prediction (before measuring): every decode point >= 0.9x; b4 / b16 at 4.2-4.5 TB/s of K + V
      (b64 ran 4.4-4.6); b1 / b4 at kv 4k-16k at 15-25 us, i.e. 1.3-2x cuDNN's host-bound 35 us.
      Mid-session run (H200, at 6003af5: whole waves of 2 CTAs an SM): decode sweep geomean 0.995 (was
      0.805), min 0.854, none below 0.8x (was 14), 5 below 0.9x: b4 kv16k-128k 0.85-0.86 on one of the
      two head counts each (the same grid on the other ran 0.96-0.98: 3.4-3.9 against 4.3-4.4 TB/s), b16
      / b4 kv4096 h64 0.89; b1 kv4096 1.6-1.85x (13.5-16 us against cuDNN's 25 us: host-bound both).
      Host floor (back-to-back calls): pydnn 10.5 us one launch, 12.6 us dec + combine; SDPA cuDNN
      17.6-24.7 us, flash 28 us. --decode-splits (ms, K + V TB/s):
        b1 kv131072:  16 splits (128 CTAs) 0.1296 4.14 | 24 (192) 0.1377 | 32 (256) 0.1305 | 33 (264) 0.1310
                      | 48 (384) 0.1500 | 64 (512) 0.1358
        b4 kv65536:   4 (128) 0.2454 4.38 | 5 (160) 0.2683 | 6 (192) 0.2657 | 8 (256) 0.2469 | 9 (288) 0.3355
                      | 12 (384) 0.2808 | 16 (512) 0.2492
        b16 kv65536:  1 (128) 0.9295 4.62 | 2 (256) 0.9472 | 3 (384) 1.0771 | 4 (512) 0.9426
        b4 kv16384:   4 (128) 0.0697 3.85 | 8 (256) 0.0710 | 9 (288) 0.0962 | 16 (512) 0.0748
        b64 kv16384:  1 (512) 0.9350 4.59 | 2 (1024) 0.9409
      So one CTA an SM already streams at the full rate (its two 32 KiB tiles in flight: ~1/132 of DRAM),
      a tail past the resident slots costs a whole chunk, and 2-vs-1 CTAs per SM ~10%: split_cost was
      refitted to this (the model's costs within 6% of these timings, 12% at 12 splits) and picks the
      fewest splits within 3%: 128 CTAs for b1 (16 splits), b4 (4), b16 (none: no combine kernel), 512
      for b64. Not yet timed on a GPU (the final run): expected b4 / b16 at the calibration's 4.4-4.6 TB/s.
  v7 (issue 19, branch attn) the forward warp specialized as FlashAttention-3 (ptx/attention_ws.cu,
      pydnn/ops/attention_ws.py; d 64 / 128 / 256): TMA producer warpgroup, mbarrier K / V rings, two
      ping-pong consumer warpgroups, persistent snake-ordered grid. `--fwd-ab` times it against the old
      kernel and cuDNN; the design, predictions and both mid-session runs are in tools/PERF.md ("attn").
      H200: d128 geomean 0.877-0.893x cuDNN (old 0.69x), d64 0.83x, d256 0.84x.
"""
import statistics

import torch
import torch.nn.functional as F

import pydnn
from pydnn import tuning
from bench import time_ms

PEAK = 790.0  # measured dense bf16 TFLOP/s (H100/H200 class); the datasheet's is ~990

CONFIGS = [  # (hq, hkv, d)
    (32, 32, 128), (64, 8, 128), (128, 8, 128), (32, 32, 64),
]
HDIM_CONFIGS = [(32, 32, 96), (32, 32, 256), (64, 8, 256)]  # run_hdim: the mma.sync kernels on every arch
B, S = 4, 4096
# run_decode: one query row (and 4, causal) against a long K/V cache, Llama-style GQA 32 / 8 at d 128
# (and d 64 / 256); (batch, hq, hkv, sq, skv, d). Bytes counted: K and V read once (+ Q and O).
DECODE_CASES = [
    (1, 32, 8, 1, 4096, 128), (1, 32, 8, 1, 32768, 128), (1, 32, 8, 1, 131072, 128),
    (8, 32, 8, 1, 4096, 128), (8, 32, 8, 1, 32768, 128), (8, 32, 8, 1, 131072, 128),
    (64, 32, 8, 1, 4096, 128), (64, 32, 8, 1, 32768, 128),
    (1, 32, 8, 4, 32768, 128), (1, 32, 8, 1, 32768, 64), (1, 32, 8, 1, 32768, 256), (1, 32, 32, 1, 32768, 128),
]


def _desc(t, dtype):
    d = pydnn.create_tensor_descriptor()
    pydnn.set_tensor_nd_descriptor(d, dtype, 4, list(t.shape), list(t.stride()))
    return d


def _torch_ms(backend, q, k, v, causal, backward, attn_mask=None, reps=None):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    be = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend]
    gqa = q.shape[1] != k.shape[1]
    try:
        with sdpa_kernel(be):
            if not backward:
                fn = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=causal,  # noqa: E731
                                                            enable_gqa=gqa)
                return time_ms(fn, reps=reps, warmup=2) if reps else time_ms(fn)
            qq, kk, vv = (x.detach().requires_grad_() for x in (q, k, v))
            o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal, enable_gqa=gqa)
            g = torch.randn_like(o)
            return time_ms(lambda: torch.autograd.grad(o, (qq, kk, vv), g, retain_graph=True))
    except Exception as e:  # noqa: BLE001 - a backend may refuse a configuration (GQA, head dim)
        print(f"  torch {backend}: {type(e).__name__}: {str(e)[:120]}")
        return None


def run(b):
    """The sweep of issue 5 (d 64 / 128), then head dims 96 / 256 (run_hdim) and decode (run_decode)."""
    _run_configs(b, CONFIGS)
    run_hdim(b)
    run_decode(b)


def run_hdim(b):
    """Head dims 96 and 256 (`--families attention.run_hdim` alone), against cuDNN / flash SDPA."""
    _run_configs(b, HDIM_CONFIGS)


def run_decode(b):
    """Decode-shaped forward (`--families attention.run_decode`): pydnn's split-KV kernels (the default
    plan, [1 split], and [regular fwd]: tuning.attention.DECODE off) against SDPA's cuDNN and flash backends
    in the same run; GB/s of K / V / Q / O traffic."""
    from pydnn.ops import attention as A
    h = b.h
    bf = pydnn.PYDNN_DATA_BFLOAT16
    for bb, hq, hkv, sq, skv, d in DECODE_CASES:
        q = torch.randn(bb, hq, sq, d, dtype=torch.bfloat16, device="cuda")
        k = torch.randn(bb, hkv, skv, d, dtype=torch.bfloat16, device="cuda")
        v = torch.randn(bb, hkv, skv, d, dtype=torch.bfloat16, device="cuda")
        o = torch.empty_like(q)
        lse = torch.empty(bb, hq, sq, 1, dtype=torch.float32, device="cuda")
        tq, tk, tv, to = _desc(q, bf), _desc(k, bf), _desc(v, bf), _desc(o, bf)
        tl = _desc(lse, pydnn.PYDNN_DATA_FLOAT)
        causal = sq > 1
        a = pydnn.create_attention_descriptor()
        mask = pydnn.PYDNN_ATTN_MASK_CAUSAL_BOTTOM_RIGHT if causal else pydnn.PYDNN_ATTN_MASK_NONE
        pydnn.set_attention_descriptor(a, hq, hkv, d, d ** -0.5, mask, 0.0, 0)
        nbytes = 2 * k.numel() * 2 + 2 * q.numel() * 2
        case = f"decode b{bb} h{hq}/{hkv} q{sq} kv{skv} d{d}{' causal' if causal else ''}"
        # (torch's is_causal is top-left; bottom-right is what a decode step with sq > 1 means: its mask)
        if causal:
            i = torch.arange(sq, device="cuda")[:, None]
            j = torch.arange(skv, device="cuda")[None, :]
            am = j <= i + skv - sq
            t_f = {n: _torch_ms(n, q, k, v, False, False, attn_mask=am) for n in ("cudnn", "flash")}
        else:
            t_f = {n: _torch_ms(n, q, k, v, False, False) for n in ("cudnn", "flash")}
        for tag, over in (("", {}), (" [1 split]", {"attention.DECODE_SPLITS": 1}),
                          (" [regular fwd]", {"attention.DECODE": False})):
            with tuning.override(over):
                n = pydnn.get_attention_forward_workspace_size(h, a, tq, tk)
                ws = torch.empty(max(n, 16), dtype=torch.uint8, device="cuda")

                def fwd():
                    pydnn.attention_forward(h, a, tq, q.data_ptr(), tk, k.data_ptr(), tv, v.data_ptr(), to,
                                            o.data_ptr(), tl, lse.data_ptr(), None, None, ws.data_ptr(), n)
                fwd()
                ms_p = time_ms(fwd)
                if tag == "":
                    pl = A.decode_plan(h.sm_count, bb, hq, hkv, sq, skv, d, mask)
                    print(f"  {case}: {pl}", flush=True)
            for name in ("cudnn", "flash"):
                b.row("attention", f"{case}{tag}", "bf16", nbytes, ms_p, t_f[name], f"sdpa {name}")
        del q, k, v, o, ws


def _run_configs(b, configs):
    h = b.h
    for hq, hkv, d in configs:
        q = torch.randn(B, hq, S, d, dtype=torch.bfloat16, device="cuda")
        k = torch.randn(B, hkv, S, d, dtype=torch.bfloat16, device="cuda")
        v = torch.randn(B, hkv, S, d, dtype=torch.bfloat16, device="cuda")
        o = torch.empty_like(q)
        lse = torch.empty(B, hq, S, 1, dtype=torch.float32, device="cuda")
        do, dq, dk, dv = torch.randn_like(q), torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        bf = pydnn.PYDNN_DATA_BFLOAT16
        tq, tk, tv, to = _desc(q, bf), _desc(k, bf), _desc(v, bf), _desc(o, bf)
        tl = _desc(lse, pydnn.PYDNN_DATA_FLOAT)
        for causal in (False, True):
            a = pydnn.create_attention_descriptor()
            mask = pydnn.PYDNN_ATTN_MASK_CAUSAL_TOP_LEFT if causal else pydnn.PYDNN_ATTN_MASK_NONE
            pydnn.set_attention_descriptor(a, hq, hkv, d, d ** -0.5, mask, 0.0, 0)
            ws_n = pydnn.get_attention_backward_workspace_size(h, a, tq, tk)
            ws = torch.empty(ws_n, dtype=torch.uint8, device="cuda")

            def fwd():
                pydnn.attention_forward(h, a, tq, q.data_ptr(), tk, k.data_ptr(), tv, v.data_ptr(), to, o.data_ptr(),
                                        tl, lse.data_ptr(), None, None, None, 0)

            def bwd(det):
                return lambda: pydnn.attention_backward(
                    h, a, tq, q.data_ptr(), tk, k.data_ptr(), tv, v.data_ptr(), to, o.data_ptr(), to, do.data_ptr(),
                    tl, lse.data_ptr(), tq, dq.data_ptr(), tk, dk.data_ptr(), tv, dv.data_ptr(), None, None, det,
                    ws.data_ptr(), ws_n)

            flops = 4 * B * hq * S * S * d * (0.5 if causal else 1.0)
            case = f"b{B} s{S} h{hq}/{hkv} d{d}{' causal' if causal else ''}"
            t_f = {n: _torch_ms(n, q, k, v, causal, False) for n in ("cudnn", "flash")}
            t_b = {n: _torch_ms(n, q, k, v, causal, True) for n in ("cudnn", "flash")}
            for tag, setup, undo in _fwd_variants(h, d):  # the default path first, then every other variant
                setup()
                fwd()
                ms_p = time_ms(fwd)
                undo()
                for name in ("cudnn", "flash"):
                    b.row_flops("attention", f"fwd {case}{tag}", "bf16", flops, ms_p, t_f[name], f"sdpa {name}", PEAK)
            fwd()
            for det in (0, 1):
                bwd(det)()
                ms_p = time_ms(bwd(det))
                tag = " [deterministic]" if det else ""
                for name in ("cudnn", "flash"):
                    b.row_flops("attention", f"bwd {case}{tag}", "bf16", 2.5 * flops, ms_p, t_b[name], f"sdpa {name}",
                                PEAK)
        del q, k, v, o, do, dq, dk, dv, ws


def _fwd_variants(h, d):
    """(row tag, setup, undo) per forward variant: what attention_forward picks (untagged), each other
    wgmma variant instantiated ([wgmma bn N pipe|plain sS]; sm_90 only), each mma.sync tile ([mma.sync n/nl])."""
    from pydnn.ops import attention as A
    from pydnn.ops import attention_wgmma as W
    out = [("", lambda: None, lambda: None)]
    wg = W.usable(h, d, 0.0)
    if wg:
        dflt = W.TILE[d]
        for t in W.TILES[d]:
            if t != dflt:
                out.append((f" [wgmma bn {t[0]} {'pipe' if t[1] else 'plain'} s{t[2]}]",
                            lambda t=t: W.TILE.__setitem__(d, t), lambda: W.TILE.__setitem__(d, dflt)))
        diag = W.diag_units()  # the default tile without softmax / without wgmma: floors, wrong results
        for g, what in ((1, "no softmax"), (2, "no wgmma")) if (d, 1) in diag else ():
            out.append((f" [diag {what}]", lambda g=g: setattr(tuning.attention, "DIAG", diag[(d, g)]),
                        lambda: setattr(tuning.attention, "DIAG", None)))
    n0, en = A.FWD_N[d], tuning.attention.ENABLED
    for n in A.FWD_TILES[d]:
        if wg or n != n0:
            def setup(n=n):
                tuning.attention.ENABLED = False
                A.FWD_N[d] = n

            def undo():
                tuning.attention.ENABLED = en
                A.FWD_N[d] = n0
            out.append((f" [mma.sync {n[0]}/{n[1]}]", setup, undo))
    return out


# ----------------------------------------------------------------------------- decode split calibration
# (b, kv, split counts to time) at GQA 32/8, d 128, bf16: the split model's inputs (pydnn/ops/attention.py
# split_cost: whole waves of 2 CTAs per SM, a partial last wave), measured around the planner's pick
SPLIT_CASES = [
    (1, 131072, (16, 24, 32, 33, 48, 64, 66)),
    (4, 65536, (4, 5, 6, 8, 9, 12, 16)),
    (16, 65536, (1, 2, 3, 4)),
    (4, 16384, (4, 8, 9, 16)),
    (64, 16384, (1, 2)),
]


def decode_splits(out=None):
    """`python3 tools/bench_attention.py --decode-splits [--out FILE]`: pydnn's decode forward at forced
    split counts (tuning.attention.DECODE_SPLITS) against the planner's pick, in TB/s of K + V, with the
    CTA count and the waves on this device (2 CTAs per SM); then the host-bound floor (a one-split call
    and a split one on a small cache: back-to-back calls, so the per-call host cost) beside SDPA's."""
    from pydnn.ops import attention as A
    h = pydnn.create()
    pydnn.set_stream(h, torch.cuda.current_stream().cuda_stream)
    bf = pydnn.PYDNN_DATA_BFLOAT16
    name = torch.cuda.get_device_name()
    lines = [f"# decode split calibration, {name}, {h.sm_count} SMs", "",
             "| case | splits | CTAs | waves | ms | K+V TB/s | planner's |", "|---|---:|---:|---:|---:|---:|---|"]

    def setup(bb, skv, hq=32, hkv=8, d=128):
        q = torch.randn(bb, hq, 1, d, dtype=torch.bfloat16, device="cuda")
        k = torch.randn(bb, hkv, skv, d, dtype=torch.bfloat16, device="cuda")
        v = torch.randn_like(k)
        o = torch.empty_like(q)
        a = pydnn.create_attention_descriptor()
        pydnn.set_attention_descriptor(a, hq, hkv, d, d ** -0.5, pydnn.PYDNN_ATTN_MASK_NONE, 0.0, 0)
        tq, tk = _desc(q, bf), _desc(k, bf)

        def call_for(n, ws):
            return lambda: pydnn.attention_forward(h, a, tq, q.data_ptr(), tk, k.data_ptr(), tk, v.data_ptr(), tq,
                                                   o.data_ptr(), None, 0, None, None, ws.data_ptr(), n)
        return q, k, v, a, tq, tk, call_for

    for bb, skv, counts in SPLIT_CASES:
        q, k, v, a, tq, tk, call_for = setup(bb, skv)
        pick = A.decode_plan(h.sm_count, bb, 32, 8, 1, skv, 128, pydnn.PYDNN_ATTN_MASK_NONE).splits
        for s in sorted(set(counts) | {pick}):
            with tuning.override({"attention.DECODE_SPLITS": s}):
                n = pydnn.get_attention_forward_workspace_size(h, a, tq, tk)
                ws = torch.empty(max(n, 16), dtype=torch.uint8, device="cuda")
                fn = call_for(n, ws)
                fn()
                ms = time_ms(fn, reps=10, warmup=2)
            ctas = bb * 8 * s
            tbs = 2 * k.numel() * 2 / ms / 1e9
            row = (f"| b{bb} kv{skv} | {s} | {ctas} | {ctas / (2 * h.sm_count):.2f} | {ms:.4f} | {tbs:.2f} | "
                   f"{'<- pick' if s == pick else ''} |")
            print(row, flush=True)
            lines.append(row)
        del q, k, v
        torch.cuda.empty_cache()
    lines += ["", "| host-bound floor | ms per call |", "|---|---:|"]
    for bb, skv in ((1, 256), (1, 4096)):
        q, k, v, a, tq, tk, call_for = setup(bb, skv)
        n = pydnn.get_attention_forward_workspace_size(h, a, tq, tk)
        ws = torch.empty(max(n, 16), dtype=torch.uint8, device="cuda")
        fn = call_for(n, ws)
        fn()
        rows = [(f"pydnn b{bb} kv{skv} ({'1 launch' if n == 0 else 'dec + combine'})", time_ms(fn, reps=10))]
        for be in ("cudnn", "flash"):
            rows.append((f"sdpa {be} b{bb} kv{skv}", _torch_ms(be, q, k, v, False, False)))
        for label, ms in rows:
            row = f"| {label} | {'-' if ms is None else f'{ms:.4f}'} |"
            print(row, flush=True)
            lines.append(row)
    if out:
        with open(out, "w") as f:
            f.write("\n".join(lines) + "\n")


# ----------------------------------------------------------------------------- forward A/B (issue 19)
# B * S = 16384 tokens (the sweep), d 128, bf16, BHSD: (S, hq, hkv)
AB_SHAPES = [(s, hq, hkv) for s in (1024, 4096, 8192) for hq, hkv in ((32, 32), (64, 8))]


def fwd_ab(out=None, shapes=None, check=True, d=128, diag=True, reps=None, nvar=None, names=None, rounds=1):
    """`python3 tools/bench_attention.py --fwd-ab [--seqs 1024,4096] [--out FILE]`: the d 128 forward, the
    warp-specialized kernel (tuning.attention.WS, pydnn/ops/attention_ws.py: "new") against the older
    wgmma one ("old") and SDPA's cuDNN backend in the same run, causal and not; two diagnostics of the
    new one: "new" its cp.async producer, [tma] its loads by TMA (tuning.attention.WS_TMA, the default),
    [1sec] (TMA) the scheduler's units in one section (WS.L2_SHARE huge: longest-first over every head, no
    L2 grouping), [nopp] without the consumers' ping-pong (WS.PINGPONG). nvar: the first nvar of these
    (default all five at d 128, old / new / tma elsewhere). TFLOP/s, the ratios to
    cuDNN and their geometric means. check: the new kernel's O against the old one's (max |diff|).
    d 64 / 256 (`--d64`, `--d256`): the instantiated variants (forced on through WS.HEAD_DIMS), old / new
    only. names: the variants to time by tag (overrides nvar), e.g. old,tma,n176 ([n176]: TMA with 176-key
    K / V tiles on non-causal calls, tuning.attention.WS_BN176, d 128; [n192]: 192-key tiles at d 64,
    WS_BN192)."""
    import math
    from pydnn.ops import attention_ws as WS
    h = pydnn.create()
    pydnn.set_stream(h, torch.cuda.current_stream().cuda_stream)
    bf = pydnn.PYDNN_DATA_BFLOAT16
    name = torch.cuda.get_device_name()
    # (row tag, WS switch ("tma": WS and WS_TMA), WS module attribute, its value for the row)
    # (an attribute "attention.X" is a tuning switch, set for the row through tuning.override)
    every = (("old", False, "PINGPONG", True), ("new", True, "PINGPONG", True), ("tma", "tma", "PINGPONG", True),
             ("1sec", "tma", "L2_SHARE", 1e9), ("nopp", True, "PINGPONG", False),
             ("n176", "tma", "attention.WS_BN176", "noncausal"), ("n192", "tma", "attention.WS_BN192", "noncausal"),
             # (session 30) two Q buffers; with them, 2 / 3 eighths of the exponentials by polynomial
             ("q2", "tma", {"attention.WS_Q2": True}, None),
             ("emu2", "tma", {"attention.WS_Q2": True, "attention.WS_EMU": 2}, None),
             ("emu3", "tma", {"attention.WS_Q2": True, "attention.WS_EMU": 3}, None),
             ("rot", "tma", {"attention.WS_Q2": True, "attention.WS_ROT": True}, None),
             ("c3", "tma", {"attention.WS_Q2": True, "attention.WS_C3": True}, None),
             ("cl", "tma", {"attention.WS_Q2": True, "attention.WS_CL": True}, None),
             ("xu", "tma", {"attention.WS_Q2": True, "attention.WS_XU": True}, None),
             ("xu2", "tma", {"attention.WS_Q2": True, "attention.WS_XU": True, "attention.WS_EMU": {64: 2}}, None),
             # (session 31) ghost tiles (d 64 on three warpgroups, d 256), with end-aligned row blocks (d 64)
             ("gh", "tma", {"attention.WS_Q2": True, "attention.WS_C3": True, "attention.WS_GH": (64, 256)}, None),
             ("ghal", "tma", {"attention.WS_Q2": True, "attention.WS_C3": True, "attention.WS_GH": (64, 256),
                              "attention.WS_AL": True}, None),
             ("dflt", "tma", None, None))  # (the defaults as they are: no override)
    variants = (tuple(v for v in every if v[0] in names) if names else every[:nvar or (5 if diag else 3)])
    lines = [f"# attention forward d{d} A/B, {name}, bf16, B*S = 16384", "",
             "| case | cuDNN TF/s | " + " | ".join(f"{v[0]} TF/s" for v in variants) + " | "
             + " | ".join(f"{v[0]}/cuDNN" for v in variants) + " | max abs(variant - old, or - the first) |",
             "|---|" + "---:|" * (2 * len(variants) + 2)]
    ratios = {v[0]: [] for v in variants}
    dims = WS.HEAD_DIMS
    WS.HEAD_DIMS = tuple(sorted(set(dims) | {d}))
    for s, hq, hkv in shapes or AB_SHAPES:
        bb = 16384 // s
        q = torch.randn(bb, hq, s, d, dtype=torch.bfloat16, device="cuda")
        k = torch.randn(bb, hkv, s, d, dtype=torch.bfloat16, device="cuda")
        v = torch.randn(bb, hkv, s, d, dtype=torch.bfloat16, device="cuda")
        o = torch.empty_like(q)
        lse = torch.empty(bb, hq, s, 1, dtype=torch.float32, device="cuda")
        tq, tk, tv, to = _desc(q, bf), _desc(k, bf), _desc(v, bf), _desc(o, bf)
        tl = _desc(lse, pydnn.PYDNN_DATA_FLOAT)
        for causal in (False, True):
            a = pydnn.create_attention_descriptor()
            mask = pydnn.PYDNN_ATTN_MASK_CAUSAL_TOP_LEFT if causal else pydnn.PYDNN_ATTN_MASK_NONE
            pydnn.set_attention_descriptor(a, hq, hkv, d, d ** -0.5, mask, 0.0, 0)

            def fwd():
                pydnn.attention_forward(h, a, tq, q.data_ptr(), tk, k.data_ptr(), tv, v.data_ptr(), to, o.data_ptr(),
                                        tl, lse.data_ptr(), None, None, None, 0)
            flops = 4 * bb * hq * s * s * d * (0.5 if causal else 1.0)
            ms, outs = {}, {}
            WS.LAST_TMA = False
            samples = {"cudnn": []}
            for rnd in range(rounds):  # alternating rounds: a drift of the clocks (power, heat) falls on all alike
                t = _torch_ms("cudnn", q, k, v, causal, False, reps=reps)
                if t:
                    samples["cudnn"].append(t)
                for tag, ws, attr, val in variants:
                    # every variant's switches explicit (the defaults move): the row's, on top of all off
                    sw = {} if tag == "dflt" else {"attention.WS": bool(ws), "attention.WS_TMA": ws == "tma",
                                                   "attention.WS_Q2": False, "attention.WS_EMU": 0,
                                                   "attention.WS_ROT": False, "attention.WS_C3": False,
                                                   "attention.WS_GH": (), "attention.WS_AL": False}
                    mod = isinstance(attr, str) and not attr.startswith("attention.")
                    if isinstance(attr, dict):
                        sw.update(attr)
                    elif mod:
                        keep = getattr(WS, attr)
                        setattr(WS, attr, val)
                    elif attr:
                        sw[attr] = val
                    try:
                        with tuning.override(sw):
                            if rnd == 0 and check:
                                o.fill_(float("nan"))
                                fwd()
                                torch.cuda.synchronize()
                                outs[tag] = o.clone()
                            samples.setdefault(tag, []).append(time_ms(fwd, reps=reps, warmup=2) if reps else
                                                               time_ms(fwd))
                    finally:
                        if mod:
                            setattr(WS, attr, keep)
            ms = {x: statistics.median(v) for x, v in samples.items() if v}
            t_c = ms.pop("cudnn", None)
            ref_o = "old" if "old" in outs else next(iter(outs), None)  # (else against the first variant's O)
            diff = max((outs[x].float() - outs[ref_o].float()).abs().max().item() for x in outs if x != ref_o) \
                if check and len(outs) > 1 else float("nan")
            tc = flops / t_c / 1e9 if t_c else float("nan")
            for k_ in ratios:
                if t_c:
                    ratios[k_].append(t_c / ms[k_])
            case = f"b{bb} s{s} h{hq}/{hkv}{' causal' if causal else ''}"
            if "tma" in ms and not WS.LAST_TMA:
                case += " (tma refused: cp.async)"
            tfs = " | ".join(f"{flops / ms[x[0]] / 1e9:.0f}" for x in variants)
            rs = " | ".join(f"{t_c / ms[x[0]]:.3f}" if t_c else "-" for x in variants)
            row = f"| {case} | {tc:.0f} | {tfs} | {rs} | {diff:.4g} |"
            print(row, flush=True)
            lines.append(row)
            del outs
        del q, k, v, o, lse
        torch.cuda.empty_cache()
    lines.append("")
    for k_, r in ratios.items():
        if r:
            g = math.exp(sum(math.log(x) for x in r) / len(r))
            line = f"d{d} {k_}: geomean {g:.3f}x cuDNN, min {min(r):.3f}, over {len(r)} points"
            print(line, flush=True)
            lines.append(line)
    WS.HEAD_DIMS = dims
    if out:
        with open(out, "w") as f:
            f.write("\n".join(lines) + "\n")


BWD_SHAPES = [(4, 4096, 32, 32, 128)]  # --bwd-ab's default: (batch, sequence, heads q, heads kv, head dim)


def bwd_ab(out=None, shapes=None, reps=None, check=True, det=0, variants=None):
    """`python3 tools/bench_attention.py --bwd-ab [--bwd-shapes 4x4096x32x32x128,...] [--reps N]`: the
    backward (deterministic = det), the warp-specialized dK / dV kernel (tuning.attention_bwd.WS, forced on
    through attention_ws_bwd.HEAD_DIMS) with its atomic dQ modes ("bulk": the shared fp32 tile added by bulk
    tensor reductions, "red": red.global.add from registers, "redpp": red with the consumer warpgroups taking
    turns at S^T / dP^T and each taking the previous tile's dQ; tuning.attention_bwd.WS_DQ) against the older
    wgmma kernel ("old") and SDPA's cuDNN backend (autograd.grad of its output) in the same run, causal
    (top-left) and not; TFLOP/s (2.5x the forward's FLOPs), ratios to cuDNN, their geometric means, and
    check: the max |new - old| over dQ, dK, dV (fp32 atomics: the order of additions differs, so not 0).
    variants: ((name, tuning overrides), ...) instead (tools/bench_attention_bwd.py); without "old" the
    check is against the first."""
    import math
    from pydnn.ops import attention_ws_bwd as WSB
    h = pydnn.create()
    pydnn.set_stream(h, torch.cuda.current_stream().cuda_stream)
    bf = pydnn.PYDNN_DATA_BFLOAT16
    default_variants = (("old", {"attention_bwd.WS": False}),
                ("bulk", {"attention_bwd.WS": True, "attention_bwd.WS_DQ": "bulk", "attention_bwd.WS_DQ_CAUSAL": None}),
                ("red", {"attention_bwd.WS": True, "attention_bwd.WS_DQ": "red", "attention_bwd.WS_DQ_CAUSAL": None}),
                ("redpp", {"attention_bwd.WS": True, "attention_bwd.WS_DQ": "redpp",
                           "attention_bwd.WS_DQ_CAUSAL": None}))[:2 if det else 4]
    variants = variants or default_variants
    ref = "old" if any(v[0] == "old" for v in variants) else variants[0][0]
    names = [v[0] for v in variants]
    lines = [f"# attention backward A/B (deterministic={det}), {torch.cuda.get_device_name()}, bf16", "",
             "| case | cuDNN TF/s | " + " | ".join(f"{n} TF/s" for n in names) + " | "
             + " | ".join(f"{n}/cuDNN" for n in names) + " | max abs(new - old) |",
             "|---|" + "---:|" * (2 * len(names) + 2)]
    ratios = {n: [] for n in names}
    dims, dims_det = WSB.HEAD_DIMS, WSB.HEAD_DIMS_DET
    for bb, s, hq, hkv, d in shapes or BWD_SHAPES:
        WSB.HEAD_DIMS, WSB.HEAD_DIMS_DET = (tuple(sorted(set(x) | {d})) for x in (dims, dims_det))
        q, k, v = (torch.randn(bb, hh, s, d, dtype=torch.bfloat16, device="cuda") for hh in (hq, hkv, hkv))
        o, do = torch.empty_like(q), torch.randn_like(q)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        lse = torch.empty(bb, hq, s, 1, dtype=torch.float32, device="cuda")
        tq, tk, tv, to = _desc(q, bf), _desc(k, bf), _desc(v, bf), _desc(o, bf)
        tl = _desc(lse, pydnn.PYDNN_DATA_FLOAT)
        for causal in (False, True):
            a = pydnn.create_attention_descriptor()
            mask = pydnn.PYDNN_ATTN_MASK_CAUSAL_TOP_LEFT if causal else pydnn.PYDNN_ATTN_MASK_NONE
            pydnn.set_attention_descriptor(a, hq, hkv, d, d ** -0.5, mask, 0.0, 0)
            ws_n = pydnn.get_attention_backward_workspace_size(h, a, tq, tk)
            ws = torch.empty(max(ws_n, 16), dtype=torch.uint8, device="cuda")
            pydnn.attention_forward(h, a, tq, q.data_ptr(), tk, k.data_ptr(), tv, v.data_ptr(), to, o.data_ptr(),
                                    tl, lse.data_ptr(), None, None, None, 0)

            def bwd():
                pydnn.attention_backward(h, a, tq, q.data_ptr(), tk, k.data_ptr(), tv, v.data_ptr(), to, o.data_ptr(),
                                         to, do.data_ptr(), tl, lse.data_ptr(), tq, dq.data_ptr(), tk, dk.data_ptr(),
                                         tv, dv.data_ptr(), None, None, det, ws.data_ptr(), ws_n)
            flops = 2.5 * 4 * bb * hq * s * s * d * (0.5 if causal else 1.0)
            t_c = _torch_ms("cudnn", q, k, v, causal, True)
            ms, outs, note = {}, {}, ""
            for tag, over in variants:
                with tuning.override(over):
                    real, seen = WSB.launch_dkdv, []
                    WSB.launch_dkdv = lambda *a_, **k_: seen.append(real(*a_, **k_)) or seen[-1]
                    try:
                        for t in (dq, dk, dv):
                            t.fill_(float("nan"))
                        bwd()
                        torch.cuda.synchronize()
                    finally:
                        WSB.launch_dkdv = real
                    if over.get("attention_bwd.WS") and seen != [True]:
                        note = f" ({tag}: new kernel not launched, {seen})"
                    outs[tag] = [t.clone() for t in (dq, dk, dv)]
                    ms[tag] = time_ms(bwd, reps=reps, warmup=2) if reps else time_ms(bwd)
            diff = max((x.float() - y.float()).abs().max().item() for n in names if n != ref
                       for x, y in zip(outs[n], outs[ref])) if len(names) > 1 else 0.0
            tc = flops / t_c / 1e9 if t_c else float("nan")
            for k_ in ratios:
                if t_c:
                    ratios[k_].append(t_c / ms[k_])
            case = f"b{bb} s{s} h{hq}/{hkv} d{d}{' causal' if causal else ''}{note}"
            tfs = " | ".join(f"{flops / ms[n] / 1e9:.0f}" for n in names)
            rs = " | ".join(f"{t_c / ms[n]:.3f}" if t_c else "-" for n in names)
            row = f"| {case} | {tc:.0f} | {tfs} | {rs} | {diff:.4g} |"
            print(row, flush=True)
            lines.append(row)
            del outs, ws
        del q, k, v, o, do, dq, dk, dv, lse
        torch.cuda.empty_cache()
    WSB.HEAD_DIMS, WSB.HEAD_DIMS_DET = dims, dims_det
    lines.append("")
    for k_, r in ratios.items():
        if r:
            g = math.exp(sum(math.log(x) for x in r) / len(r))
            line = f"bwd {k_}: geomean {g:.3f}x cuDNN, min {min(r):.3f}, over {len(r)} points"
            print(line, flush=True)
            lines.append(line)
    if out:
        with open(out, "w") as f:
            f.write("\n".join(lines) + "\n")


# ----------------------------------------------------------------------------- paged K / V (attnf)
# (b, hq, hkv, sq, skv, d, page size, causal): decode against a long cache, vLLM's 16-key pages and larger
# ones; prefill with pages of one TMA box (128) and of 16 keys (the cp.async producer through the table)
PAGED_CASES = [
    (8, 32, 8, 1, 32768, 128, 16, False), (8, 32, 8, 1, 32768, 128, 128, False),
    (4, 32, 8, 4096, 4096, 128, 128, True), (4, 32, 8, 4096, 4096, 128, 16, True),
    (4, 32, 32, 4096, 4096, 64, 128, False),
]


def paged(out=None, cases=None, reps=None):
    """`python3 tools/bench_attention.py --paged [--paged-cases 0,2] [--out FILE]`: pydnn's paged forward
    (attention_forward_paged: K / V pages scattered in a random order over the pool, every sequence at full
    length) against pydnn's contiguous forward on the same values and SDPA's cuDNN backend (contiguous) in
    the same run; ms, the paged / contiguous ratio, TFLOP/s (prefill) or K+V TB/s (decode), and the paged
    output's max |diff| from the contiguous one."""
    from pydnn.ops import attention as A
    from pydnn.ops import attention_ws as WS
    h = pydnn.create()
    pydnn.set_stream(h, torch.cuda.current_stream().cuda_stream)
    bf = pydnn.PYDNN_DATA_BFLOAT16
    name = torch.cuda.get_device_name()
    lines = [f"# paged K / V forward, {name}", "",
             "| case | path | paged ms | contiguous ms | paged / contig | sdpa cudnn ms | paged vs cudnn | rate | max diff |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for ci, (bb, hq, hkv, sq, skv, d, ps, causal) in enumerate(PAGED_CASES):
        if cases is not None and ci not in cases:
            continue
        q = torch.randn(bb, hq, sq, d, dtype=torch.bfloat16, device="cuda")
        k = torch.randn(bb, hkv, skv, d, dtype=torch.bfloat16, device="cuda")
        v = torch.randn_like(k)
        o, o2 = torch.empty_like(q), torch.empty_like(q)
        npg = skv // ps
        perm = torch.randperm(bb * npg, device="cuda")
        table = perm.view(bb, npg).to(torch.int32).contiguous()
        # pool (pages, hkv, ps, d): page table[b][j] holds keys j * ps .. of batch b
        kp = torch.empty(bb * npg, hkv, ps, d, dtype=torch.bfloat16, device="cuda")
        vp = torch.empty_like(kp)
        kp[table.view(-1).long()] = k.view(bb, hkv, npg, ps, d).permute(0, 2, 1, 3, 4).reshape(bb * npg, hkv, ps, d)
        vp[table.view(-1).long()] = v.view(bb, hkv, npg, ps, d).permute(0, 2, 1, 3, 4).reshape(bb * npg, hkv, ps, d)
        lens = torch.full((bb,), skv, dtype=torch.int32, device="cuda")
        a = pydnn.create_attention_descriptor()
        mask = pydnn.PYDNN_ATTN_MASK_CAUSAL_BOTTOM_RIGHT if causal else pydnn.PYDNN_ATTN_MASK_NONE
        pydnn.set_attention_descriptor(a, hq, hkv, d, d ** -0.5, mask, 0.0, 0)
        tq, tk, tkp, to = _desc(q, bf), _desc(k, bf), _desc(kp, bf), _desc(o, bf)
        tt = pydnn.create_tensor_descriptor()
        pydnn.set_tensor_nd_descriptor(tt, pydnn.PYDNN_DATA_INT32, 4, [bb, 1, npg, 1], [npg, npg, 1, 1])
        n = pydnn.get_attention_forward_paged_workspace_size(h, a, tq, tkp, tt, skv)
        n2 = pydnn.get_attention_forward_workspace_size(h, a, tq, tk)
        ws = torch.empty(max(n, n2, 16), dtype=torch.uint8, device="cuda")

        def fp():
            pydnn.attention_forward_paged(h, a, tq, q.data_ptr(), tkp, kp.data_ptr(), tkp, vp.data_ptr(), tt,
                                          table.data_ptr(), tt, table.data_ptr(), skv, to, o.data_ptr(), None, None,
                                          None, lens.data_ptr(), ws.data_ptr(), n)

        def fc():
            pydnn.attention_forward(h, a, tq, q.data_ptr(), tk, k.data_ptr(), tk, v.data_ptr(), to, o2.data_ptr(),
                                    None, None, None, None, ws.data_ptr(), n2)
        fp()
        path = A.LAST_PAGED_ROUTE + (f" {WS.LAST_PAGED}" if A.LAST_PAGED_ROUTE == "ws" else "")
        fc()
        torch.cuda.synchronize()
        diff = (o.float() - o2.float()).abs().max().item()
        kw = dict(reps=reps, warmup=2) if reps else {}
        ms_p, ms_c = time_ms(fp, **kw), time_ms(fc, **kw)
        if causal and sq == skv:
            ms_t = _torch_ms("cudnn", q, k, v, True, False, reps=reps)
        elif causal:  # (bottom-right, as a mask: torch's is_causal is top-left)
            am = torch.arange(skv, device="cuda")[None, :] <= torch.arange(sq, device="cuda")[:, None] + skv - sq
            ms_t = _torch_ms("cudnn", q, k, v, False, False, attn_mask=am, reps=reps)
        else:
            ms_t = _torch_ms("cudnn", q, k, v, False, False, reps=reps)
        if sq > 1:
            flops = 4 * bb * hq * sq * skv * d * (0.5 if causal else 1.0)
            rate = f"{flops / ms_p / 1e9:.0f} TFLOP/s"
        else:
            rate = f"{2 * k.numel() * 2 / ms_p / 1e9:.2f} TB/s"
        case = f"b{bb} h{hq}/{hkv} q{sq} kv{skv} d{d} ps{ps}{' causal' if causal else ''}"
        row = (f"| {case} | {path} | {ms_p:.4f} | {ms_c:.4f} | {ms_c / ms_p:.3f}x | "
               f"{'-' if ms_t is None else f'{ms_t:.4f}'} | {'-' if ms_t is None else f'{ms_t / ms_p:.3f}x'} | "
               f"{rate} | {diff:.3g} |")
        print(row, flush=True)
        lines.append(row)
        if A.LAST_PAGED_ROUTE == "dec":  # the decode kernel's pipelined page ids (tuning.attention.PAGED_DEC_PIPE)
            with tuning.override({"attention.PAGED_DEC_PIPE": True}):
                o.fill_(float("nan"))
                fp()
                torch.cuda.synchronize()
                d2 = (o.float() - o2.float()).abs().max().item()
                ms_q = time_ms(fp, **kw)
            row = (f"| {case} | dec pipe | {ms_q:.4f} | {ms_c:.4f} | {ms_c / ms_q:.3f}x | "
                   f"{'-' if ms_t is None else f'{ms_t:.4f}'} | {'-' if ms_t is None else f'{ms_t / ms_q:.3f}x'} | "
                   f"{2 * k.numel() * 2 / ms_q / 1e9:.2f} TB/s | {d2:.3g} |")
            print(row, flush=True)
            lines.append(row)
        del q, k, v, kp, vp, o, o2, ws
        torch.cuda.empty_cache()
    if out:
        with open(out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description="decode split calibration (the rest of this file runs under "
                                             "tools/bench.py)")
    ap.add_argument("--decode-splits", action="store_true")
    ap.add_argument("--fwd-ab", action="store_true", help="the d 128 forward: warp-specialized vs older wgmma vs cuDNN")
    ap.add_argument("--seqs", help="--fwd-ab: comma-separated sequence lengths (default 1024,4096,8192)")
    ap.add_argument("--d64", action="store_true", help="--fwd-ab: then d 64 at heads 32/32, old / new")
    ap.add_argument("--d256", action="store_true", help="--fwd-ab: then d 256 at heads 32/32, old / new")
    ap.add_argument("--reps", type=int, help="--fwd-ab: timed samples a variant (default bench.REPS)")
    ap.add_argument("--rounds", type=int, default=1, help="--fwd-ab: alternating rounds of every variant and "
                    "cuDNN, the median over them (a drift of the clocks falls on all alike)")
    ap.add_argument("--nvar", type=int, help="--fwd-ab d 128: time the first N variants (old new tma 1sec nopp)")
    ap.add_argument("--heads", help="--fwd-ab: comma-separated heads q/kv (default 32/32,64/8; --d64 / --d256: "
                                    "32/32)")
    ap.add_argument("--no-d128", action="store_true", help="--fwd-ab: skip the d 128 table (with --d64 / --d256)")
    ap.add_argument("--variants", help="--fwd-ab: comma-separated variant tags (old new tma 1sec nopp n176 n192)")
    ap.add_argument("--bwd-ab", action="store_true", help="the backward: warp-specialized vs older wgmma vs cuDNN")
    ap.add_argument("--bwd-shapes", help="--bwd-ab: comma-separated BxSxHQxHKVxD (default 4x4096x32x32x128)")
    ap.add_argument("--det", default="0", help="--bwd-ab: deterministic modes, comma-separated (0: atomic dQ)")
    ap.add_argument("--paged", action="store_true", help="the paged K / V forward vs contiguous and cuDNN")
    ap.add_argument("--paged-cases", help="--paged: comma-separated indices into PAGED_CASES (default all)")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.paged:
        paged(args.out, [int(x) for x in args.paged_cases.split(",")] if args.paged_cases else None, args.reps)
    if args.bwd_ab:
        sh = [tuple(int(y) for y in x.split("x")) for x in args.bwd_shapes.split(",")] if args.bwd_shapes else None
        for det in (int(x) for x in args.det.split(",")):
            bwd_ab(args.out and args.out.replace(".md", f"_det{det}.md"), sh, reps=args.reps, det=det)
    if args.decode_splits:
        decode_splits(args.out)
    if args.fwd_ab:
        seqs = [int(x) for x in args.seqs.split(",")] if args.seqs else None
        heads = [tuple(int(y) for y in x.split("/")) for x in args.heads.split(",")] if args.heads else None
        shapes = AB_SHAPES if seqs is None and heads is None else [
            (s, hq, hkv) for s in (seqs or (1024, 4096, 8192)) for hq, hkv in (heads or ((32, 32), (64, 8)))]
        names = args.variants.split(",") if args.variants else None
        if not args.no_d128:
            fwd_ab(args.out, shapes, reps=args.reps, nvar=args.nvar, names=names, rounds=args.rounds)
        for d, on in ((64, args.d64), (256, args.d256)):
            if on:  # (names: the d 128-only ones leave their rows equal to tma's)
                fwd_ab(args.out and args.out.replace(".md", f"_d{d}.md"),
                       shapes if heads else [x for x in shapes if x[1] == x[2]], d=d,
                       diag=False, reps=args.reps, names=names, rounds=args.rounds)
