"""Matmul (GEMM) benchmark: pydnn.ops.matmul vs torch.matmul (cuBLAS) in the same run.

FLOPs counted: 2 * m * n * k per GEMM (times batch), the usual convention; the epilogue (alpha, beta,
bias) is not counted. Each case also checks pydnn's result against torch's (max |diff| over max |ref|,
printed), so the large shapes the tests do not reach are verified too.

Floor: compute. H200 (= H100 SXM compute: 132 SMs, ~1.83-1.98 GHz): dense bf16 / fp16 989 TFLOP/s on the
datasheet, reached only through wgmma; mma.sync m16n8k16 issues at about 2/3 of that rate on Hopper
(see tools/bench_attention.py), so ~660 TFLOP/s is this kernel family's realistic ceiling and cuBLAS
(wgmma + TMA) measured ~700-800 on the H100. float without TF32: 67 TFLOP/s FMA (datasheet).
Target (issue 5 via the helper brief): bf16 4096^3 >= 0.6x torch.matmul.

Cases: square 4096^3 (nn: A m x k, B k x n), the projection shape of multi-head attention (x W^T:
m = 16384 tokens, n = 4096, k = 4096, B transposed, as nn.Linear stores W), a small 512^3, a batched
per-head shape, fp16 and float (torch with TF32 off), and the general (unaligned) path.
--fused [--pp] [--wg] [--power S] [--shapes ...] [--kinds gelu,gelu16,relu,residual,rowmax] (issue 22's fused
target): the graph's fused GEMMs against the plain matmul, F.gelu(torch.addmm) and torch.mm (see fused()); the
default, every FUSED_SHAPES entry with gelu, residual and row MAX, takes ~1 min on an H200 with its compiles.
[tile ...] rows force one tile (the plain rows use the chooser's); [bench variant ...] rows are extra
instantiations compiled only here (unit matmul.bench.*), to measure candidates before they go in the
manifest.

Versions (H200; TFLOP/s and ratio to torch.matmul in the same run; torch's cuBLAS: 757-790 on 4096^3):
  v1  gemm_tc pipeline 1: 128x256 (2x4 warps of 64x64, 1 block/SM, 255 registers), 128x128 (2x4 warps
      of 64x32, 2 blocks/SM, capped at 128 registers: 8-150 bytes of spills in some transposition cases)
      and 64x64 (2x2 warps) tiles; BK = 64, 3 cp.async stages, XOR-swizzled shared tiles, ldmatrix
      (.trans where the operand's contiguous dim is not K), register -> global epilogue (column pairs);
      tile raster in groups of 8 tile rows. float: 128x128 FMA tiles, 8x8 per thread, register prefetch.
      Prediction: bf16 4096^3 380-480 TFLOP/s (0.5-0.65x cuBLAS). float 20-30 (0.4-0.6x).
      Measured (first device run, 2026-11-23):
        bf16 4096^3 nn 272.1 (0.34x), tn 244.3 (0.31x), tt 269.7 (0.34x); fp16 nn 267.1 (0.35x)
        projection x W^T 16384x4096x4096 (nt) 272.6 (0.35x)
        small 512^3 33.9 (1.99x: torch's 17.0 is launch-bound), 1024^3 124.4 (0.90x)
        batched 32 x (1024x1024x128) nt 94.4 (0.32x)
        tiles forced on 4096^3 nn: 128x256 272.1, 128x128 200.6, 64x64 149.9
        variants (bf16 nn / nt): 128x256 with 4 stages 271.2 / 265.5; 256x128 (4x2 warps) 270.2 /
        260.7; 128x128 (2x4 warps) 4 stages, 1 block/SM 188.9 / 208.0
        float 4096^3 25.5 (0.50x cuBLAS's 50.9 without TF32), 1024^3 tt 13.8 (0.34x)
        general path (A 2 bytes off 16) 2048^3 71.4 (0.53x torch on aligned data)
      Prediction missed by ~30%: stages and tile shape change nothing (all 128x256-class tiles 260-272),
      so neither the pipeline depth nor L2 traffic limits; the warp's instruction stream does: per
      K tile every warp first issues its copies (12 cp.async with per-chunk bounds and 64-bit address
      arithmetic) after the barrier, then per k16 step loads its fragments and only then issues its
      mmas, with 2 warps per SM sub-partition to hide the ldmatrix latency.
  v2  pipeline 2: fragments double-buffered in registers (step kk + 1's ldmatrix issued before step kk's
      mmas), the barrier moved to just before the first read of the next stage, the next stage's copy
      issued after the first step's fragment loads, and a per-thread Copier (one pointer, a row mask and
      a byte count set up once; tiles advance by one add; a ragged last K tile masked by the K left).
      Tiles: 128x256 (2x4 warps) and 128x128 with 2x2 warps of 64x64 (2 independent blocks per SM, so
      one block's barrier and copy phase can overlap the other's mmas). Spills: 16-44 bytes (255
      registers). Prediction: +15-35% (310-370 TFLOP/s).
      Measured (second device run, as candidates; all of them passed the GPU tests first):
        128x256 pipe 2: 4096^3 nn 325.2 (0.41x), nt 324.5 (0.41x), tn 314.7 (0.41x), tt 300.2 (0.38x),
                        fp16 nn 306.0 (0.40x); projection 16384x4096x4096 nt 322.8 (0.42x)
        128x128 2x2 warps pipe 2: nn 291.1, nt 287.4, tn 294.6, tt 268.4 (0.35-0.38x); projection 294.3
        128x128 2x2 warps pipe 1: 178.6-247.0 (pipeline 2 is what pays, not the second block per SM)
        bench only, bf16: 256x128 (4x2 warps) pipe 2 nn 325.5, nt 332.4 (0.42x); 128x256 4 stages
        pipe 2 nn 331.9, nt 306.6
      Outcome: +19% (272 -> 325 on the square nn, 273 -> 323 on the projection), inside the predicted
      range but at its low end; 0.41-0.42x cuBLAS against the 0.6x target. Adopted: TC_TILES is now
      128x256 pipe 2, 128x128 (2x2 warps) pipe 2, 64x64 pipe 1 (small problems; also the general path).
      The rows above without [...] were still v1 in that run; the next run's plain rows are v2.
  v3  gemm_wgmma (sm_90a; ptx/common/wgmma.cuh): 128 x BN tiles, two warpgroups each issuing
      wgmma.m64nBNk16 straight from shared memory (4 per K tile of 64, one commit group, wait until only
      the newest group is pending), all 256 threads copying with v2's Copier into 128B-swizzled slabs
      (K-major or MN-major per transposition, through the instruction's transpose flags), STAGES - 2
      copies in flight, one barrier per K tile, the same register epilogue. Tiles: 128x256 with 4 stages
      (192 KiB, 192-196 registers, no spills) and 128x128 with 6 stages (125-128 registers).
      (Rows labelled "early copy" or "stages 6" below are the v3b variants, since removed.)
      Prediction (before measuring): 128x256 bf16 4096^3 480-600 TFLOP/s (0.6-0.75x cuBLAS), about the
      same on every transposition and the projection; 128x128 400-500. What could hold it lower: the
      copy instructions are issued by the same warps that issue the MMAs, and the per-tile barrier makes
      both warpgroups wait for the slower one's copies (no producer warp, no TMA yet).
      Measured (third device run, 2026-11-23, as forced tiles; all wgmma GPU tests passed first try; the
      mma.sync rows of the same run were ~20% below the v2 run's, torch's 790-810, so compare ratios):
        128x256: 4096^3 nn 412.8 (0.51x), nt 441.7 (0.56x), tn 378.4 (0.49x), tt 370.8 (0.47x); fp16 nn
                 380.0 (0.49x); projection 16384x4096x4096 nt 418.9 (0.53x); 1024^3 nn 73.2 (0.61x)
        128x128 (6 stages): nn 304.0, nt 312.1, tn 306.0, tt 313.0 (0.38-0.39x); projection 320.5 (0.41x);
                 1024^3 105.9 (0.85x)
        same run, mma.sync 128x256 pipe 2 (chooser): nn 260.2 (0.32x), tn 215.4, tt 248.4; projection
                 271.2 (0.34x); 64x64 on 1024^3 102.9 (0.86x)
      Outcome: 1.55-1.6x the mma.sync kernel on the large problems (0.32-0.34x -> 0.51-0.56x cuBLAS), at
      the low end of the prediction for nn / nt and below it for tn / tt (A M-major: 8% slower; not
      understood yet). 128x128 misses (1.17x mma.sync). Small problems lose: 1024^3 has 32 blocks of
      128x256 for 132 SMs, each a lone block whose 16 K tiles are latency bound. Adopted: USE_WGMMA (the
      chooser takes the wgmma tiles on sm_90 when they fill a wave of blocks and K >= 512).
  v3b candidates (WG_CANDIDATES): EARLY copy (the refill of the stage of tile kt - 2 is issued right after
      tile kt's wgmmas, before the wait for tile kt - 1's group: that stage is already free, so the copy
      starts about one MMA group sooner: ~3 K tiles of latency cover instead of ~2), for 128x256 / 4 and
      128x128 / 6 stages; and 128x128 with 3 stages and 2 blocks per SM (128 registers; one block's
      barrier and copies overlap the other's MMAs, as v2's 128x128 did).
      Prediction: EARLY +5-15% on 128x256 (450-480 TFLOP/s nn); the 2-blocks-per-SM 128x128 350-420.
      Measured (fourth device run; all 181 matmul GPU tests passed, the chooser's rows now on wgmma):
        chooser (128x256 wgmma): 4096^3 nn 410.3 (0.51x), fp16 nn 403.5 (0.52x), tn 368.7 (0.47x), tt
                 386.6 (0.49x); projection 16384x4096x4096 nt 435.0 (0.55x); 2048^3 nn (128x128 / 6
                 then) 268.9 vs mma.sync 128x256 229.1
        128x256 wgmma, same run: nn 413.7, nt 437.7, tn 389.9, tt 358.0; 2048^3 320.8 (128 blocks)
        128x256 EARLY: nn 406.9, nt 440.7, tn 385.5, tt 357.6, projection 399.4 (-2% .. +1%: no gain)
        128x128 / 6 stages: nn 321.4 (EARLY 328.2); 2048^3 273.4
        128x128 / 3 stages, 2 blocks/SM, EARLY: nn 337.9, nt 327.2, tn 350.5, tt 311.5, projection 342.8,
                 2048^3 313.0, 1024^3 97.5 (0.77x)
      Outcome: EARLY does not pay on the 1-block tiles (the copy latency is not what limits them: the
      per-tile barrier and copy issue in the MMA warps are the next suspects); kept only in the 3-stage
      tile, where a single copy is in flight (its value there not isolated: the candidate below). The
      2-blocks-per-SM 128x128 beats the 6-stage one by 5-15% and replaces it in WG_TILES; the chooser now
      takes wgmma tiles from 3/4 of a wave of blocks (2048^3: 128 blocks of 128x256, 321 vs 273).
      Missed: 0.6x cuBLAS (at 0.51-0.56x on nn / nt / projection, 0.47-0.49x with A transposed).
  v3c candidate: the 2-blocks-per-SM 128x128 without EARLY (to isolate it). Prediction: 3-8% slower.
      Measured (fifth device run; all 167 matmul GPU tests passed, candidates included):
        chooser: 4096^3 nn 411.0 (0.51x), fp16 nn 403.3 (0.52x), tn 388.0 (0.49x), tt 380.7 (0.49x);
                 projection 16384x4096x4096 nt 451.8 (0.58x); 2048^3 nn 343.1 (0.49x; mma.sync 128x256
                 forced 227.9); 1024^3 98.2 (gemm_tc 64x64; torch 82.5)
        128x256 wgmma forced: nn 412.4 (0.52x), nt 441.8 (0.57x), tn 367.1, tt 367.5, projection 390.2
                 (0.52x; the chooser's row of the same shape 451.8: run-to-run spread ~15%), fp16 334.0
        128x128 2 blocks/SM, EARLY: nn 334.3, nt 336.3, tn 361.3, tt 312.1, projection 341.1, 2048^3 323.8
        128x128 2 blocks/SM, plain: nn 332.5, nt 341.9, tn 362.2, tt 308.8, projection 348.9, 2048^3 328.2
      Outcome: EARLY pays nowhere (-1% .. +2%, noise): reverted from the kernel (the template parameter is
      gone); WG_TILES' 128x128 is the plain 2-blocks-per-SM tile measured here. Prediction missed: the copy
      issue point is not the limit.
      Against the baseline at the start of this session (mma.sync, 0.32-0.34x cuBLAS in the same runs):
      4096^3 bf16 nn 255 -> 411-413 TFLOP/s, projection 271 -> 390-452, 2048^3 228 -> 320-343.
  v4  (integrator, after v3c) the Copier's per-chunk test. A memcheck fix earlier in the session (commit
      6ae7f12: a chunk cut by a row's end is read with plain loads, since compute-sanitizer counts a
      partial-src-size cp.async as a 16-byte read past an allocation's end) had put a test for a partial
      chunk on every cp.async of the main loop; all of v3 was measured with it, and the mma.sync rows of
      those runs read ~20% below the previous session's (128x256 forced: 260 vs 325-340). Now the Copier
      tests once per copy whether this thread's chunks are whole (every tile but the ragged last K tile and
      the edge columns) and takes a plain cp.async loop then. Prediction: the mma.sync tiles back to
      ~325; wgmma +10-20%. Measured (H200, same run; matmul + MHA GPU tests 165 passed, memcheck of every
      tile 0 errors):
        chooser: 4096^3 nn 664.9 (0.83x cuBLAS), fp16 nn 644.9 (0.84x), tn 575.2 (0.83x), tt 525.8
                 (0.71x); projection 16384x4096x4096 nt 650.1 (0.94x); 2048^3 nn 508.0 (0.75x);
                 1024^3 94.4 (0.72x; gemm_tc, where the forced wgmma 128x128 ran 112.4)
        128x256 wgmma forced: nn 660.1, nt 644.2, tn 576.4, tt 520.9, projection 576.5, fp16 553.4
        128x128 wgmma forced: nn 420.5, nt 459.7, tn 445.4, tt 391.8, projection 453.3, 1024^3 112.4
        mma.sync forced: 128x256 307.8, 128x128 331.6 (2048^3 128x256: 263.4)
      Outcome: far above the prediction for wgmma (411 -> 665, +62%): the test had been the main cost of
      the wgmma loop, whose warps issue the copies between their MMAs. mma.sync back within 5-10% of the
      previous session. Untuned: the chooser's thresholds (1024^3 would now gain from the 128x128 wgmma
      tile); the v3 notes below on where the rest is were written before this fix.
  f32 v2 (issue 4, fifth session; gemm_simt rewritten, ptx/matmul.cu): 32 x 64 warp tiles (lanes 4 x 8, 8 x 8
      outputs a thread as 2 x 2 blocks of 4 x 4), both operands K-major in shared memory ([BK][tile + 4]:
      two 16-byte fragment loads per operand per k step, 4 / 8 distinct addresses a warp), fragments
      double-buffered in registers, global loads 16 bytes wide where a chunk is whole and aligned (element
      by element otherwise: any ld / alignment), the next K tile's loads in flight during the current FMAs,
      one barrier per K tile; the K-contiguous operand stored transposed (4 scalar stores a chunk, conflict-
      free). Tiles: 128x128 (8 warps, MINB 1: 162-168 registers, no spills) and 64x128 (4 warps, MINB 3: 167)
      for m <= 64 / short waves; candidates 128x128 MINB 2 (128 registers, 20-32 bytes spilled) and BK 16.
      v1 (same run of the last session): 4096^3 nn 25.5 (0.50x cuBLAS's 50.9), 1024^3 tt 13.8 (0.34x).
      Prediction (before measuring): 128x128 4096^3 40-48 TFLOP/s (0.8-0.95x cuBLAS) on every
      transposition (the transposed-store side costs < 5%); MINB 2 within +-5% (spills against a second
      block's latency hiding); BK 16 +0-5%. Winograd shapes (batch 36): 64x12544x64 25-30 (8 K tiles:
      prologue and epilogue weigh), 128x3136x128 30-38, 256x1024x256 35-40, 512x256x512 ~30 (288 blocks
      of 128x128 on 132 SMs: 2.2 waves).
      Measured (H200, first device run of the session; 50 float matmul GPU tests passed, candidates
      included; torch's cuBLAS without TF32 49-52 on 4096^3):
        chooser (128x128): 4096^3 nn 42.6 (0.83x), nt 41.6 (0.83x), tn 44.6 (0.86x), tt 43.5 (0.89x);
                 1024^3 tt 20.9 (0.52x: 64 blocks for 132 SMs)
        Winograd shapes (batch 36): 64x12544x64 31.2 (1.04x cuBLAS, the 64x128 tile), 128x3136x128 32.6
                 (0.92x), 256x1024x256 33.2 (0.87x), 512x256x512 29.0 (0.88x)
        forced, 4096^3 nn / Winograd 56^2 / 28^2: 128x128 MINB 1 42.6 / 14.7 / 32.4; 64x128 MINB 3 39.8 /
                 31.2 / 33.1; 128x128 MINB 2 (spills) 41.9 / 17.0 / 30.4; 128x128 BK 16 43.3 / 14.7 / 33.2
      Outcome: 25.5 -> 42.6 TFLOP/s on 4096^3 nn (1.67x; 0.50x -> 0.83x cuBLAS), inside the predicted
      40-48 at its low end, and every transposition within 7% of the others. Winograd shapes 29-33 (at or
      a little above the prediction's low end; 0.87-1.04x cuBLAS's batched GEMM). MINB 2 does not pay (its
      spills cost more than the second block hides); BK 16 is +2% on 4096^3 and +2% on the 28^2 shape
      (within noise: not adopted). The 64x128 tile is what m = 64 needs (2.1x the 128x128 on 56^2).
      Where the rest is (not profiled): at 4096^3 one block of 8 warps per SM (2 per scheduler) waits at
      every K tile's barrier for the slowest warp's shared stores; at the Winograd shapes (K = 64-512:
      8-64 K tiles) each block's first global loads and its epilogue are exposed (1 block per SM).
  f32 v3 candidates: persistent tiles (SIMT_CANDIDATES: 128x128 MINB 1 and 64x128 MINB 3, one wave of
      blocks walking the (batch, tile) items; every tile's K loop fetches the next item's first K tile
      during its last one, so only a block's first item waits for its first loads; the build's tiles run
      the same loop across their batches). ptxas: 159-167 registers, no spills. Prediction: +5-15% on the
      Winograd shapes with 1 block per SM (128x3136x128, 256x1024x256), ~0 on 4096^3 (512 K tiles an
      item) and on 64x12544x64 (the 64x128 tile's 3 blocks per SM already overlap their prologues).
      Measured (second device run; 170 GPU tests passed incl. a many-items case per tile; same run's
      build tiles in parentheses): 128x128 persistent 4096^3 43.2 (43.3), 64x12544x64 15.2 (14.4),
      128x3136x128 34.0 (32.5), 256x1024x256 34.1 (33.6), 512x256x512 29.7 (29.5); 64x128 persistent
      40.0 (37.5), 31.4 (30.6), 32.1 (32.5), 38.0 (37.9), 34.1 (34.2).
      Outcome: +0-5% (below the predicted 5-15%: the first loads were not the main loss); adopted (the
      kernel is now always persistent: grid = one wave, per_sm x SMs blocks; the z-loop is gone). The
      same run showed the 64x128 tile 13-16% faster than the 128x128 on 256x1024x256 and 512x256x512
      (its 3 blocks per SM fill the SMs more evenly and overlap each other's prologue / epilogue), which
      the chooser (eff 0.9 then) did not take: eff_short = 1.0 for k <= 512 and ties to the smaller tile
      (_choose_simt_tile). Prediction for the next run: 14^2 / 7^2 Winograd GEMMs at ~38 / ~34 TFLOP/s
      through the chooser, 4096^3 unchanged (128x128).
      Measured (third device run; 162 GPU tests passed): chooser 4096^3 nn 43.5 (0.85x cuBLAS), nt 41.0
      (0.81x), tn 43.7 (0.84x), tt 43.0 (0.87x); Winograd shapes 31.2 / 33.9 / 38.1 / 34.2 (1.04 / 0.95 /
      0.99 / 1.03x cuBLAS's batched GEMM); 1024^3 tt 20.7 (0.51x, unchanged: 64 items of 128x128, the
      64x128 tile not measured there). As predicted.
  f32 summary (session start -> now, same benchmark): 4096^3 nn 25.5 -> 43.5 TFLOP/s (0.50x -> 0.85x
  cuBLAS without TF32). Next: the 1024^3-class problems (under a wave of 128x128 items: split-K or the
  64x128 tile; eff for a partial wave is not modelled), the nt case (41 vs 43.5: B's transposed stores),
  and the ~35% to the FMA peak at 4096^3 (one 8-warp block per SM; a 2-blocks-per-SM 128x128 needs <= 128
  registers without spilling: single-buffered fragments, or 64-bit address math moved out of the loop).
  Tried on the CPU only (ptxas, not run): the 128x128 tile with MINB 2 and single-buffered fragments still
  spills 56-92 bytes (32-40 byte frames) in every transposition, like v2's MINB 2 tile (-2% measured):
  dropped without a device run. The 64-bit address math of the loads is the next register to win back.
  f32 v4 candidates (issue 22, 2026-11-28, branch gemm; --f32: 8192^3 nn and the 7B projections x @ W^T, against
      torch.mm without TF32; 0.84x cuBLAS before): gemm_simt's thread block generalized to SUBM x SUBN sub-blocks
      of 4 x 4 (the build's 2 x 2 unchanged), SIMT_CANDIDATES c1 128x128 with 4 warps of 32 x 128 (8 x 16 a thread,
      128 accumulators, 6 fragment loads for 128 FMAs a k step), two blocks an SM (243-247 registers: 2 x 128 x
      256 = 64 Ki), c2 the same as 16 x 8 (warps 64 x 64), c3 128x256 with 8 warps of 32 x 128 (one block an SM,
      half the L2 bytes a FLOP), c4 c1 at BK 16. ptxas sm_90: 241-251 registers, no spills, every transposition.
      Prediction (before measuring): c1 / c2 +5-12% over the build's tile (two independent blocks an SM: one's
      barrier and global-load wait under the other's FMAs; fewer fragment loads a FLOP), so 0.88-0.94x cuBLAS;
      c3 +0-5% (one block an SM keeps the barrier stalls); c4 within 2% of c1.
      Measured (H200, mid-session runs 2 and 3, ratios to torch.mm in the same run, every result bitwise cuBLAS's):
        8192^3 nn / 7B 16384x4096x4096 nt / 16384x11008x4096 nt: base 0.838 / 0.797 / 0.796; c1 0.856 / 0.866 /
        0.862; c2 0.911 / 0.894 / 0.890; c3 0.917 / 0.870 / 0.869; c4 0.826 / 0.809 / 0.810; run 3 added c5
        (256x128, 8 warps of 64 x 64) 0.916 / 0.916 / 0.917 and c6 (128x256, 8 warps of 64 x 64) 0.928 / 0.920 /
        0.919 (c2 0.911 / 0.893 / 0.891 again). torch 51.0-52.3 TFLOP/s (76-78% of the FMA peak), c6 46.9-48.0.
      Outcome: c2 inside its prediction (+9-12%), c1 below (+2-9%), c3 above (+4-9%); the 64 x 64 warp tile is
      what pays most (c2 over c1, c6 over c3: +3-6%), the block's size or count an SM less. Adopted: c6 as
      SIMT_BIG_TILE (unit matmul.f32big, tuning.matmul.SIMT_BIG "big"), where K > SHORT_K and its items fill 2
      waves; issue 22's fp32 >= 0.9x: met on the three shapes.
  Next for wgmma (where the remaining 0.45x to cuBLAS is, by elimination, not profiled): every K tile
  still ends in a block-wide barrier after each thread waits for its own cp.async chunks, so both
  warpgroups idle whenever any copy is late, and the MMA warps issue 12 copies (+ address math) per tile.
  cuBLAS / CUTLASS: a producer warp issuing TMA (one instruction per tile, the swizzle done by the copy
  engine) into an mbarrier-tracked ring, consumer warpgroups waiting only on their stage's barrier (no
  __syncthreads), setmaxnreg to give the consumers 240 registers, a persistent tile scheduler, and an
  epilogue staged through shared memory. The TMA descriptor (CUtensorMap, 128 bytes) would ride in the
  params struct (cuTensorMapEncodeTiled at plan time).
  Where the rest is (not measured with a profiler: no device time for ncu): mma.sync with ldmatrix reads
  every A / B fragment from shared memory per warp; a 64x64 warp tile moves 4 KB of ldmatrix traffic
  per 32 mmas, so an SM's 8 warps need ~1 KB of shared reads per 8 KFLOP: at 128 B/clock that is about
  as long as the tensor pipe at full rate, before the cp.async writes (384 clocks per 1024 mmas). Larger
  warp tiles do not fit in 255 registers. cuBLAS here is wgmma (operands straight from shared memory,
  no register staging) + TMA; the same port is planned for attention. Next for mma.sync: the 256x128 /
  4-stage candidates (+0-2%), an epilogue through shared memory (16-byte stores), split-K for skinny
  problems (the batched per-head case is at 0.32x).
"""
import re
import torch

import pydnn
from bench import time_ms
from pydnn.ops import matmul as M

PEAK_16 = 989.0   # dense bf16 / fp16 datasheet (H100 / H200 SXM)
PEAK_32 = 67.0    # float FMA datasheet
TDT = {pydnn.PYDNN_DATA_BFLOAT16: torch.bfloat16, pydnn.PYDNN_DATA_HALF: torch.float16,
       pydnn.PYDNN_DATA_FLOAT: torch.float32}
NAME = {pydnn.PYDNN_DATA_BFLOAT16: "bf16", pydnn.PYDNN_DATA_HALF: "fp16", pydnn.PYDNN_DATA_FLOAT: "fp32"}
BF16 = pydnn.PYDNN_DATA_BFLOAT16

def _operands(dtype, m, n, k, ta, tb, batch=1):
    t = TDT[dtype]
    a = torch.randn(batch, *((k, m) if ta else (m, k)), device="cuda").to(t)
    b = torch.randn(batch, *((n, k) if tb else (k, n)), device="cuda").to(t)
    c = torch.empty(batch, m, n, device="cuda", dtype=t)
    return a, b, c


def _torch_fn(a, b, ta, tb, out):
    x = a.transpose(1, 2) if ta else a
    y = b.transpose(1, 2) if tb else b
    if a.shape[0] == 1:
        return lambda: torch.mm(x[0], y[0], out=out[0])
    return lambda: torch.bmm(x, y, out=out)


def _err(got, want):
    return float((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-30))


def _case(bh, dtype, label, m, n, k, ta=False, tb=False, batch=1, tile=None, check=True):
    b = bh
    a, bb, c = _operands(dtype, m, n, k, ta, tb, batch)
    kw = dict(trans_a=ta, trans_b=tb, batch=batch, stride_a=a[0].numel() if batch > 1 else 0,
              stride_b=bb[0].numel() if batch > 1 else 0, stride_c=c[0].numel() if batch > 1 else 0)
    if tile is not None:
        from pydnn import tuning

        # a forced wgmma tile runs itself (not gemm_tma in its place); a TmaTile runs through the 128x256 choice
        tma = isinstance(tile, M.TmaTile)
        name = "_choose_simt_tile" if isinstance(tile, M.SimtTile) else "_choose_tile"
        orig, orig_tma, orig_use = getattr(M, name), M._tma_tile, tuning.matmul.USE_TMA
        orig_big = tuning.matmul.SIMT_BIG
        setattr(M, name, (lambda *x: M.WG_PERSIST_TILE) if tma else (lambda *x: tile))
        M._tma_tile = (lambda: tile) if tma else orig_tma
        tuning.matmul.USE_TMA = tma
        tuning.matmul.SIMT_BIG = ""  # (a forced float tile runs as itself)
        try:
            plan = M.gemm_plan(b.h, dtype, m, n, k, **kw)
        finally:
            setattr(M, name, orig)
            M._tma_tile, tuning.matmul.USE_TMA, tuning.matmul.SIMT_BIG = orig_tma, orig_use, orig_big
    else:
        plan = M.gemm_plan(b.h, dtype, m, n, k, **kw)
    ap, bp, cp = a.data_ptr(), bb.data_ptr(), c.data_ptr()
    ms_p = time_ms(lambda: plan.launch(b.h, ap, bp, cp))
    out = torch.empty_like(c)
    tfn = _torch_fn(a, bb, ta, tb, out)
    ms_t = time_ms(tfn)
    err = ""
    if check:
        plan.launch(b.h, ap, bp, cp)
        tfn()
        torch.cuda.synchronize()
        err = f" (max rel diff to torch {_err(c, out):.1e})"
    peak = PEAK_32 if dtype == pydnn.PYDNN_DATA_FLOAT else PEAK_16
    tname = "torch.mm" if batch == 1 else "torch.bmm"
    b.row_flops("matmul", label + err, NAME[dtype], 2.0 * m * n * k * batch, ms_p, ms_t, tname, peak)
    del a, bb, c, out


def run(b):
    prev_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        for dtype in (BF16, pydnn.PYDNN_DATA_HALF):
            _case(b, dtype, "square 4096^3 nn", 4096, 4096, 4096)
        _case(b, BF16, "projection x W^T 16384x4096x4096 (nt)", 16384, 4096, 4096, tb=True)
        _case(b, BF16, "square 4096^3 tn", 4096, 4096, 4096, ta=True)
        _case(b, BF16, "square 4096^3 tt", 4096, 4096, 4096, ta=True, tb=True)
        _case(b, BF16, "small 512^3", 512, 512, 512)
        _case(b, BF16, "small 1024x1024x1024", 1024, 1024, 1024)
        _case(b, BF16, "batched 32 x (1024x1024x128) nt", 1024, 1024, 128, tb=True, batch=32)
        for t in M.TC_TILES:
            _case(b, BF16, f"square 4096^3 nn [tile {t}]", 4096, 4096, 4096, tile=t, check=False)
        _case(b, BF16, "2048^3 nn", 2048, 2048, 2048)
        _case(b, BF16, f"2048^3 nn [tile {M.TC_TILES[0]}]", 2048, 2048, 2048, tile=M.TC_TILES[0], check=False)
        # (the mma.sync CANDIDATE_TILES rows, measured in v1 and v2, are no longer run: device time)
        _f32(b)
        _general(b)
        _split_k(b)
        _wgmma(b)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev_tf32


F32 = pydnn.PYDNN_DATA_FLOAT
# The Winograd F(4x4, 3x3) GEMMs of the ResNet-50 3x3 layers at N = 64, as convolution_winograd.gemm_view
# makes them for NCHW (C_z = V_z . U_z: m = K, n = tiles, k = C, batch 36): (label, m, n, k).
WINO_SHAPES = (("64->64 @56", 64, 12544, 64), ("128->128 @28", 128, 3136, 128), ("256->256 @14", 256, 1024, 256),
               ("512->512 @7", 512, 256, 512))


def _f32(b):
    """float (CUDA-core gemm_simt; torch with TF32 off): the chooser's tile on the square and the
    Winograd shapes, then every SIMT tile and candidate forced on 4096^3 nn and the 28^2 Winograd shape."""
    for ta, tb in ((False, False), (False, True), (True, False), (True, True)):
        tn = ("t" if ta else "n") + ("t" if tb else "n")
        _case(b, F32, f"square 4096^3 {tn} (torch TF32 off)", 4096, 4096, 4096, ta, tb)
    _case(b, F32, "1024^3 tt", 1024, 1024, 1024, ta=True, tb=True)
    for label, m, n, k in WINO_SHAPES:
        _case(b, F32, f"winograd 36 x ({m}x{n}x{k}) {label}", m, n, k, batch=36)
    M.simt_extra_units()
    for t in M.SIMT_TILES + (M.SIMT_BIG_TILE,) + M.SIMT_CANDIDATES:
        _case(b, F32, f"4096^3 nn [{t}]", 4096, 4096, 4096, tile=t, check=False)
        for label, m, n, k in WINO_SHAPES:
            _case(b, F32, f"winograd {label} [{t}]", m, n, k, batch=36, tile=t, check=False)


def run_f32(b):
    """The float rows only (PYDNN_BENCH_FAMILIES=matmul.run_f32)."""
    prev_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        _f32(b)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev_tf32


def _general(b):
    """The general path: A's pointer 2 bytes off 16 (lda packed), timed against torch on aligned data."""
    m = n = k = 2048
    a = torch.randn(m * k + 1, device="cuda").to(torch.bfloat16)
    bb = torch.randn(k, n, device="cuda").to(torch.bfloat16)
    c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    plan = M.gemm_plan(b.h, BF16, m, n, k)
    ap = a.data_ptr() + 2
    ms_p = time_ms(lambda: plan.launch(b.h, ap, bb.data_ptr(), c.data_ptr()))
    x = a[1:].view(m, k)
    out = torch.empty_like(c)
    ms_t = time_ms(lambda: torch.mm(x, bb, out=out))
    torch.cuda.synchronize()
    err = _err(c, out)
    b.row_flops("matmul", f"general path 2048^3 (A 2 bytes off) (max rel diff {err:.1e})", "bf16",
                2.0 * m * n * k, ms_p, ms_t, "torch.mm", PEAK_16)


def _split_k(b):
    """Split-K (sm_90, gemm_plan(split_k=True)) on the GPT demo's weight gradients (A transposed, K = 16384
    tokens) against the chooser's kernel without it and torch.mm."""
    if b.h.arch != M.WG_ARCH:
        return
    for m, n, k in ((384, 1152, 16384), (1536, 384, 16384), (768, 768, 32768)):
        for split in (False, True):
            a, bb, c = _operands(BF16, m, n, k, True, False)
            plan = M.gemm_plan(b.h, BF16, m, n, k, trans_a=True, split_k=split)
            ap, bp, cp = a.data_ptr(), bb.data_ptr(), c.data_ptr()
            ws = torch.empty(max(plan.ws_bytes, 1), dtype=torch.uint8, device="cuda")  # split-K: the caller's
            wp, wn = ws.data_ptr(), plan.ws_bytes
            ms_p = time_ms(lambda: plan.launch(b.h, ap, bp, cp, 1.0, 0.0, 0, wp, wn))
            out = torch.empty_like(c)
            tfn = _torch_fn(a, bb, True, False, out)
            ms_t = time_ms(tfn)
            plan.launch(b.h, ap, bp, cp, 1.0, 0.0, 0, wp, wn)
            tfn()
            torch.cuda.synchronize()
            label = f"wgrad {m}x{n}x{k} tn [{'split ' + str(plan.split) if plan.split else 'no split'}]"
            b.row_flops("matmul", f"{label} (max rel diff {_err(c, out):.1e})", "bf16", 2.0 * m * n * k, ms_p, ms_t,
                        "torch.mm", PEAK_16)


def _wgmma(b):
    """gemm_wgmma (sm_90 only), each tile forced; last, so that a fault cannot cost the rows above."""
    if b.h.arch != M.WG_ARCH:
        return
    M.wgmma_extra_units()
    for t in M.WG_TILES + (M.WG_PERSIST_TILE,) + M.WG_CANDIDATES + (M.TMA_TILE,) + M.TMA_CANDIDATES:
        for ta, tb in ((False, False), (False, True), (True, False), (True, True)):
            tn = ("t" if ta else "n") + ("t" if tb else "n")
            _case(b, BF16, f"4096^3 {tn} [wgmma {t}]", 4096, 4096, 4096, ta, tb, tile=t)
        _case(b, BF16, f"projection 16384x4096x4096 nt [wgmma {t}]", 16384, 4096, 4096, tb=True, tile=t)
        _case(b, pydnn.PYDNN_DATA_HALF, f"4096^3 nn [wgmma {t}]", 4096, 4096, 4096, tile=t)
        _case(b, BF16, f"1024^3 nn [wgmma {t}]", 1024, 1024, 1024, tile=t)
        _case(b, BF16, f"2048^3 nn [wgmma {t}]", 2048, 2048, 2048, tile=t, check=False)


# ----------------------------------------------------------------------------- gemm_tma (--mid)

MID_SHAPES = (("8192^3 nn", 8192, 8192, 8192, False, False),
              ("7B 16384x4096x4096 nn (x @ W)", 16384, 4096, 4096, False, False),
              ("7B 16384x4096x4096 nt (x @ W^T)", 16384, 4096, 4096, False, True),
              ("7B 16384x11008x4096 nn (x @ W)", 16384, 11008, 4096, False, False),
              ("7B 16384x11008x4096 nt (x @ W^T)", 16384, 11008, 4096, False, True))


GROUP_ROWS = ("8192^3 nn", "7B 16384x4096x4096 nn (x @ W)", "7B 16384x4096x4096 nt (x @ W^T)")
L2_ROWS = ("7B 16384x4096x4096 nt (x @ W^T)",)


def mid(out=None, rounds=5, shapes=MID_SHAPES, old_kernel=True):
    """gemm_tma (the chooser's pick on sm_90 with tuning.matmul.USE_TMA), the cluster candidate gemm_tma_c
    (TMA_CANDIDATES[0]), the persistent wgmma kernel (USE_TMA off) and torch.mm, bf16, timed in alternating
    rounds (each round: the four, 10 samples each; medians), ratios printed as torch time / pydnn time (> 1:
    pydnn faster). Each result checked against torch's (max |diff| / max |ref|)."""
    import json
    import statistics

    from pydnn import tuning

    h = pydnn.create()
    pydnn.set_stream(h, torch.cuda.current_stream().cuda_stream)
    dev = torch.cuda.get_device_name()
    rows = []
    try:
        for label, m, n, k, ta, tb in shapes:
            a, bb, c = _operands(BF16, m, n, k, ta, tb)
            c2 = torch.empty_like(c)
            out_t = torch.empty_like(c)
            tuning.matmul.USE_TMA = True
            new = M.gemm_plan(h, BF16, m, n, k, trans_a=ta, trans_b=tb)
            orig = M._tma_tile
            try:
                M._tma_tile = lambda: M.TMA_CANDIDATES[0]
                clu = M.gemm_plan(h, BF16, m, n, k, trans_a=ta, trans_b=tb)
                M._tma_tile = lambda: M.TMA_TILE if M.TMA_TILE.wide else M.TMA_CANDIDATES[1]
                wide = M.gemm_plan(h, BF16, m, n, k, trans_a=ta, trans_b=tb)
            finally:
                M._tma_tile = orig
            tuning.matmul.USE_TMA = False
            old = M.gemm_plan(h, BF16, m, n, k, trans_a=ta, trans_b=tb) if old_kernel else new
            tuning.matmul.USE_TMA = True
            c3 = torch.empty_like(c)
            c4 = torch.empty_like(c)
            ap, bp = a.data_ptr(), bb.data_ptr()
            fns = {"tma": lambda: new.launch(h, ap, bp, c.data_ptr()),
                   "tma_c": lambda: clu.launch(h, ap, bp, c3.data_ptr()),
                   "tma_w": lambda: wide.launch(h, ap, bp, c4.data_ptr()),
                   "wgmma_p": lambda: old.launch(h, ap, bp, c2.data_ptr()),
                   "torch": _torch_fn(a, bb, ta, tb, out_t)}
            if not old_kernel:
                fns["wgmma_p"] = fns["tma"]  # (its column repeats gemm_tma's; no rounds spent on it)
            for f in fns.values():
                f()
            torch.cuda.synchronize()
            # --no-old: c2 was never written (the old kernel's column repeats gemm_tma's): its diff is gemm_tma's
            errs = (_err(c, out_t), _err(c2 if old_kernel else c, out_t), _err(c3, out_t), _err(c4, out_t))
            t = {name: [] for name in fns}
            for _ in range(rounds):
                for name, f in fns.items():
                    if name != "wgmma_p" or old_kernel:
                        t[name].append(time_ms(f, reps=10, warmup=2))
            if not old_kernel:
                t["wgmma_p"] = t["tma"]
            med = {name: statistics.median(v) for name, v in t.items()}
            fl = 2.0 * m * n * k
            r = dict(case=label, device=dev, kernel_new=new.describe()[0].split("<")[0].split("::")[-1],
                     kernel_old=old.describe()[0].split("<")[0].split("::")[-1],
                     ms=med, tflops={name: fl / v / 1e9 for name, v in med.items()},
                     kernel_cluster=clu.describe()[0].split("<")[0].split("::")[-1],
                     ratio_tma=med["torch"] / med["tma"], ratio_wgmma_p=med["torch"] / med["wgmma_p"],
                     ratio_tma_c=med["torch"] / med["tma_c"], ratio_tma_w=med["torch"] / med["tma_w"],
                     err_tma=errs[0], err_wgmma_p=errs[1], err_tma_c=errs[2], err_tma_w=errs[3])
            rows.append(r)
            print(f"{label:34s} {r['kernel_new']:10s} {r['tflops']['tma']:6.1f} TFLOP/s ({r['ratio_tma']:.3f}x torch) | "
                  f"{r['kernel_cluster']:10s} {r['tflops']['tma_c']:6.1f} ({r['ratio_tma_c']:.3f}x) | "
                  f"wide {r['tflops']['tma_w']:6.1f} ({r['ratio_tma_w']:.3f}x) | "
                  f"{r['kernel_old']:12s} {r['tflops']['wgmma_p']:6.1f} ({r['ratio_wgmma_p']:.3f}x) | torch.mm "
                  f"{r['tflops']['torch']:6.1f} | rel diff {errs[0]:.1e} / {errs[2]:.1e} / {errs[3]:.1e} / {errs[1]:.1e}",
                  flush=True)
            if label in GROUP_ROWS and new.tma is not None:
                # the raster's group of tile rows (L2 reuse; MatmulParams.group_m, 8 in the plans)
                for gm in (4, 16):
                    q = new.tma.params.p
                    q.group_m = min(gm, q.tiles_m)
                    tt, tp = [], []
                    for _ in range(rounds):
                        tp.append(time_ms(fns["tma"], reps=10, warmup=2))
                        tt.append(time_ms(fns["torch"], reps=10, warmup=2))
                    q.group_m = min(8, q.tiles_m)
                    ratio = statistics.median(tt) / statistics.median(tp)
                    r[f"ratio_tma_group{gm}"] = ratio
                    print(f"{label:34s} gemm_tma group_m {gm:2d}: {fl / statistics.median(tp) / 1e9:6.1f} TFLOP/s "
                          f"({ratio:.3f}x torch)", flush=True)
            if label in L2_ROWS and new.tma is not None:
                # the maps' L2 promotion (DRAM -> L2 fetch size; 256B in the plans)
                from pydnn._cuda import tensormap as TMm

                keep = new.tma.maps
                for l2 in ("NONE", "L2_128B"):
                    new.tma.maps = tuple(TMm.MapCache(TMm.TiledMap.__new__(TMm.TiledMap)) for _ in keep)
                    for mc, kc in zip(new.tma.maps, keep):
                        for f in kc.map.__slots__:
                            setattr(mc.map, f, getattr(kc.map, f))
                        mc.map.l2 = l2
                    tt, tp = [], []
                    for _ in range(rounds):
                        tp.append(time_ms(fns["tma"], reps=10, warmup=2))
                        tt.append(time_ms(fns["torch"], reps=10, warmup=2))
                    ratio = statistics.median(tt) / statistics.median(tp)
                    r[f"ratio_tma_l2_{l2}"] = ratio
                    print(f"{label:34s} gemm_tma L2 promotion {l2:7s}: {fl / statistics.median(tp) / 1e9:6.1f} TFLOP/s "
                          f"({ratio:.3f}x torch)", flush=True)
                new.tma.maps = keep
            del a, bb, c, c2, c3, c4, out_t
            if out:  # after every shape (a run cut short keeps the rows done)
                with open(out, "w") as f:
                    json.dump(rows, f, indent=1)
    finally:
        pydnn.destroy(h)
    return rows


# ----------------------------------------------------------------------------- float without TF32 (--f32)

# issue 22's fp32 target (>= 0.9x cuBLAS without TF32): 8192^3 and the 7B projections (x @ W^T, nn.Linear's W)
F32_SHAPES = (("8192^3 nn", 8192, 8192, 8192, False, False),
              ("7B 16384x4096x4096 nt", 16384, 4096, 4096, False, True),
              ("7B 16384x11008x4096 nt", 16384, 11008, 4096, False, True),
              ("7B 16384x4096x4096 nn", 16384, 4096, 4096, False, False),
              ("7B 16384x11008x4096 nn", 16384, 11008, 4096, False, False))


def _f32_base_unit(ta, tb, big=False):
    return f"matmul.f32{'bb' if big else 'b'}.{'t' if ta else 'n'}{'t' if tb else 'n'}"


def _f32_prebuild(h, shapes, trans_all=False, cands=None):
    """Compile in parallel threads the one-kernel units --f32 runs: the build's 128x128 tile (as its own bench
    unit per transposition, where matmul.f32 would compile its 8 kernels one after another) and every
    SIMT_CANDIDATES entry; trans_all: every transposition (so that the GPU tests after find them cached)."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    from pydnn._build import loader
    from pydnn._build.manifest import KernelUnit

    tns = M.TRANS if trans_all else sorted({("t" if s[4] else "n") + ("t" if s[5] else "n") for s in shapes})
    units = [KernelUnit(_f32_base_unit(tn[0] == "t", tn[1] == "t", big), "matmul.cu",
                        (t.expr("f32", tn[0] == "t", tn[1] == "t"),))
             for big, t in ((False, M.SIMT_TILES[0]), (True, M.SIMT_BIG_TILE)) for tn in tns]
    units += M.simt_candidate_units(cands, trans=tns)
    loader.register_units(units)
    M.simt_extra_units()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(16) as ex:
        list(ex.map(lambda u: loader.load_unit(h.arch, u), units))
    print(f"prebuild: {len(units)} units in {time.perf_counter() - t0:.1f} s", flush=True)


def f32(out=None, rounds=3, shapes=F32_SHAPES, trans_all=False, cands=None):
    """float GEMMs without TF32 (CUDA-core FMA, gemm_simt) against torch.mm with TF32 off, timed in alternating
    rounds (each round every function, 3 samples each; medians): the build's 128x128 tile (8 x 8 a thread), its
    SIMT_BIG_TILE ("big", what these shapes run by default) and each SIMT_CANDIDATES entry (or `cands`) forced,
    each result checked against torch's (max |diff| / max |ref|). Prints
    TFLOP/s, the ratio to torch (> 1: faster) and the fraction of the 67 TFLOP/s FMA peak."""
    import json
    import statistics

    from pydnn import tuning

    prev_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    h = pydnn.create()
    pydnn.set_stream(h, torch.cuda.current_stream().cuda_stream)
    dev = torch.cuda.get_device_name()
    rows = []
    pick = tuple(t for t in M.SIMT_CANDIDATES if cands is None or t.name in cands)
    tiles = (("base", M.SIMT_TILES[0]), ("big", M.SIMT_BIG_TILE)) + tuple((t.name, t) for t in pick)
    try:
        _f32_prebuild(h, shapes, trans_all, pick)
        for label, m, n, k, ta, tb in shapes:
            a, bb, c = _operands(F32, m, n, k, ta, tb)
            ap, bp = a.data_ptr(), bb.data_ptr()
            outs, fns, kernels = {}, {}, {}
            for name, t in tiles:
                orig, big = M._choose_simt_tile, tuning.matmul.SIMT_BIG
                M._choose_simt_tile = lambda *x, t=t: t
                tuning.matmul.SIMT_BIG = ""  # (the 128x128 tile as itself)
                try:
                    plan = M.gemm_plan(h, F32, m, n, k, trans_a=ta, trans_b=tb)
                finally:
                    M._choose_simt_tile, tuning.matmul.SIMT_BIG = orig, big
                if name in ("base", "big"):
                    plan.fast.unit = _f32_base_unit(ta, tb, name == "big")  # the same instantiation, prebuilt alone
                assert plan.fast.expr == t.expr("f32", ta, tb), (plan.fast.expr, t)
                o = torch.empty_like(c) if outs else c
                outs[name] = o
                kernels[name] = repr(t)
                fns[name] = (lambda plan=plan, cp=o.data_ptr(): plan.launch(h, ap, bp, cp))
            out_t = torch.empty_like(c)
            fns["torch"] = _torch_fn(a, bb, ta, tb, out_t)
            for f in fns.values():
                f()
            torch.cuda.synchronize()
            errs = {name: _err(o, out_t) for name, o in outs.items()}
            t = {name: [] for name in fns}
            for _ in range(rounds):
                for name, f in fns.items():
                    t[name].append(time_ms(f, reps=3, warmup=1))
            med = {name: statistics.median(v) for name, v in t.items()}
            fl = 2.0 * m * n * k
            r = dict(case=label, device=dev, ms=med, tflops={nm: fl / v / 1e9 for nm, v in med.items()},
                     vs_torch={nm: med["torch"] / v for nm, v in med.items()}, errs=errs, kernels=kernels)
            rows.append(r)
            print(f"{label:26s} torch {r['tflops']['torch']:5.1f} TFLOP/s ({r['tflops']['torch'] / PEAK_32:.0%} of FMA peak) | "
                  + " | ".join(f"{nm} {r['tflops'][nm]:5.1f} ({r['vs_torch'][nm]:.3f}x, {errs[nm]:.0e})" for nm in outs),
                  flush=True)
            del a, bb, c, out_t, outs, fns
            if out:
                with open(out, "w") as f:
                    json.dump(rows, f, indent=1)
    finally:
        pydnn.destroy(h)
        torch.backends.cuda.matmul.allow_tf32 = prev_tf32
    return rows


# ----------------------------------------------------------------------------- fused epilogues (--fused)

FUSED_SHAPES = (("8192^3 nn", 8192, 8192, 8192, False),
                ("7B 16384x4096x4096 nn", 16384, 4096, 4096, False),
                ("7B 16384x4096x4096 nt", 16384, 4096, 4096, True),
                ("7B 16384x11008x4096 nn", 16384, 11008, 4096, False),
                ("7B 16384x11008x4096 nt", 16384, 11008, 4096, True))


def _fused_graph(h, m, n, k, tb, kind):
    """gelu(x @ W + b) (kind "gelu"), x @ W + b + r ("residual") or max over n of x @ W + b ("rowmax"), bf16 in
    and out, FLOAT inside; W [k, n], stored [n, k] when tb (nn.Linear's weight). "bias": x @ W + b alone;
    "gelu_nob": gelu(x @ W) (no bias: no epilogue load); a suffix "_st" / "_ns": the same graph built with the
    bias staged per tile / read in the epilogue (tuning.matmul.FUSED_STAGE on / off, _build; none: the default)."""
    from pydnn.graph import Graph

    kind = _base(kind)

    f32 = pydnn.PYDNN_DATA_FLOAT
    g = Graph(io_data_type=BF16, intermediate_data_type=f32, compute_data_type=f32, handle=h)
    x = g.tensor(name="x", dim=[1, m, k])
    w = g.tensor(name="w", dim=[1, k, n], stride=[k * n, 1, k] if tb else [k * n, n, 1])
    v = g.matmul(x, w)
    if kind != "gelu_nob":
        v = g.add(v, g.tensor(name="b", dim=[1, 1, n]))
    if kind in ("gelu", "gelu16", "gelu_erf", "gelu_nob") or _form(kind) is not None:
        v = g.gelu(v)
    elif kind == "bias":
        pass
    elif kind == "relu":
        v = g.relu(v)
    elif kind == "residual":
        v = g.add(v, g.tensor(name="r", dim=[1, m, n]))
    else:
        v = g.reduction(v, pydnn.PYDNN_REDUCE_TENSOR_MAX, dim=[1, m, 1])
    v.set_output(True).set_name("y")
    return g


def _variants(pp, wg=False, ppc=False):
    """(suffix, gemm_tma tile) of each form --fused times: the chooser's TMA_TILE, with pp the ping-pong
    candidate TMA_PP_TILE (its unit registered here: outside the build), with ppc its 2-CTA cluster form
    TMA_PPC_TILE, with wg the wgmma kernels the fused GEMMs ran on before (USE_TMA off: gemm_wgmma_p; tile None;
    the gelu graph only)."""
    if pp or ppc:
        M.pp_units()
    return ((("", M.TMA_TILE),) + ((("_pp", M.TMA_PP_TILE),) if pp else ()) +
            ((("_ppc", M.TMA_PPC_TILE),) if ppc else ()) + ((("_wg", None),) if wg else ()))


def _expr(tile, tb):
    return (tile or M.WG_PERSIST_TILE).expr("bf16", False, tb)


class _TmaTile:
    """Plans made inside take `tile` as their gemm_tma tile (pydnn.ops.matmul._tma_tile patched); None: no
    gemm_tma (tuning.matmul.USE_TMA off)."""

    def __init__(self, tile):
        self.tile = tile

    def __enter__(self):
        from pydnn import tuning

        self.orig, self.use = M._tma_tile, tuning.matmul.USE_TMA
        M._tma_tile = lambda: self.tile or M.TMA_TILE
        tuning.matmul.USE_TMA = self.tile is not None

    def __exit__(self, *exc):
        from pydnn import tuning

        M._tma_tile, tuning.matmul.USE_TMA = self.orig, self.use


def _form(kind):
    """(ex2, stsm, widen) of a session-32 GELU kind: "gelu5" (gelu_fast5), "gelu1" (gelu_ex2), then "s" (EPI_STSM
    on; off without), then "w" (EPI_WIDEN on), then "c" / "c32" (EPI_CHUNK 64 / 32 columns): e.g. "gelu1swc";
    None for any other kind."""
    m = re.fullmatch(r"gelu([15])(s?)(w?)(c32|c)?", kind)
    return None if m is None else (m.group(1) == "1", m.group(2) == "s", m.group(3) == "w",
                                   {"c": 64, "c32": 32}.get(m.group(4), 0))


def _base(kind):
    return kind[:-3] if kind.endswith(("_st", "_ns")) else kind


PS_UNIT = "matmul.tmabenchps{}.bf16"  # "plain_s": gemm_tma_ps, the plain store through stmatrix (a candidate)


def _ps_expr(tb):
    return _expr(M.TMA_TILE, tb).replace("gemm_tma<", "gemm_tma_ps<", 1)


def _kinds_of(tile, kinds):
    """The fused graphs a variant runs: on the ping-pong tile no row reduction, no "_st" / "_ns" or diagnostic
    ("bias", "gelu_nob") forms; the gelu one alone on wgmma. ("plain_s" is no graph: the plain kernel's
    stmatrix-store candidate, on TMA_TILE only.)"""
    kinds = tuple(kd for kd in kinds if kd != "plain_s")
    if tile is None:
        return tuple(kd for kd in kinds if kd.startswith("gelu") and kd == _base(kd) and kd != "gelu_nob")
    if tile.pp:
        return tuple(kd for kd in kinds if kd in ("gelu", "gelu16", "gelu_erf", "relu", "residual"))
    return tuple(kinds)


def _tma_bench_unit(tile, tb):
    name = ("wgbench" if tile is None else "tmabenchppc" if tile.pp and tile.cm == 2 else "tmabenchpp" if tile.pp
            else "tmabench")
    return f"matmul.{name}{'nt' if tb else 'nn'}.bf16"


def _build(g, kind):
    """build_plans; kind "gelu": the graph's defaults (a bfloat16 output: gelu_fast5, tuning.graph.PW_GELU_FAST and
    PW_GELU_DEG5, <= 1.5e-5 relative); "gelu16": the degree-7 gelu_fast (PW_GELU_DEG5 off, <= 7.9e-6);
    "gelu_erf": erff's form (PW_GELU_FAST off; what "gelu" measured before the chain's defaults); "gelu1": the
    one-MUFU gelu_ex2 (tuning.graph.EPI_GELU_EX2 on, <= 4e-5); "gelu5": gelu_fast5 (EPI_GELU_EX2 off); a suffix
    "s": the WIDE store through stmatrix (tuning.matmul.EPI_STSM on; off in the others)."""
    from pydnn import tuning

    keep = (tuning.graph.PW_GELU_FAST, tuning.graph.PW_GELU_DEG5, tuning.matmul.FUSED_STAGE, tuning.graph.EPI_GELU_EX2,
            tuning.matmul.EPI_STSM, tuning.matmul.EPI_WIDEN, tuning.matmul.EPI_CHUNK)
    if kind.endswith(("_st", "_ns")):
        tuning.matmul.FUSED_STAGE = kind.endswith("_st")
    kind = _base(kind)
    if kind == "gelu16":
        tuning.graph.PW_GELU_FAST, tuning.graph.PW_GELU_DEG5 = True, False
    elif kind == "gelu_erf":
        tuning.graph.PW_GELU_FAST = False
    elif _form(kind) is not None:
        tuning.graph.PW_GELU_FAST, tuning.graph.PW_GELU_DEG5 = True, True
        (tuning.graph.EPI_GELU_EX2, tuning.matmul.EPI_STSM, tuning.matmul.EPI_WIDEN,
         tuning.matmul.EPI_CHUNK) = _form(kind)
    try:
        g.build_operation_graph().create_execution_plans().check_support().build_plans()
    finally:
        (tuning.graph.PW_GELU_FAST, tuning.graph.PW_GELU_DEG5, tuning.matmul.FUSED_STAGE,
         tuning.graph.EPI_GELU_EX2, tuning.matmul.EPI_STSM, tuning.matmul.EPI_WIDEN, tuning.matmul.EPI_CHUNK) = keep
    return g


def _prebuild_fused(h, shapes, kinds, variants, compile=True):
    """Compile every unit --fused needs in parallel threads (NVRTC releases the GIL): gemm_tma's and the fused
    graphs' generated units (collected by building each graph once with the compile deferred). compile False:
    return the units instead (tools/gemm_timeline.py compiles them in its own pool)."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    from pydnn._build import loader
    from pydnn._build.manifest import KernelUnit
    from pydnn.graph import engines

    # the plain gemm_tma kernels as one unit each (bench only: they compile in parallel, where matmul.tma.bf16
    # compiles its four transpositions one after another); fused() points its plans at them
    tbs = sorted({s[4] for s in shapes})
    units = [KernelUnit(_tma_bench_unit(t, tb), "matmul.cu", (_expr(t, tb),), archs=(M.WG_ARCH + "a",))
             for _, t in variants for tb in tbs]
    if "plain_s" in kinds:
        units += [KernelUnit(PS_UNIT.format("nt" if tb else "nn"), "matmul.cu", (_ps_expr(tb),),
                             archs=(M.WG_ARCH + "a",)) for tb in tbs]
    loader.register_units(units)
    orig = engines._compile
    engines._compile = lambda handle, unit: units.append(unit)
    try:
        _, m, n, k, _ = shapes[0]
        for _, t in variants:
            with _TmaTile(t):
                for tb in tbs:
                    for kind in _kinds_of(t, kinds):
                        _build(_fused_graph(h, m, n, k, tb, kind), kind)
    finally:
        engines._compile = orig
    t0 = time.perf_counter()
    todo = list({u.name: u for u in units}.values())
    if not compile:
        return todo
    with ThreadPoolExecutor(16) as ex:
        list(ex.map(lambda u: loader.load_unit(h.arch, u), todo))
    print(f"prebuild: {len(todo)} units in {time.perf_counter() - t0:.1f} s", flush=True)


def _gpu_sampler():
    """An nvidia-smi process sampling this device's SM clock (MHz) and board power (W) every 20 ms (None where
    nvidia-smi is missing), and the device's PCI bus id it filters on (None: every GPU, the busiest chosen)."""
    import shutil
    import subprocess

    tool = shutil.which("nvidia-smi")
    if not tool:
        return None, None
    bus = None
    try:
        pr = torch.cuda.get_device_properties(torch.cuda.current_device())
        bus = f"{pr.pci_domain_id:08X}:{pr.pci_bus_id:02X}:{pr.pci_device_id:02X}.0"
    except Exception:  # noqa: BLE001 - an older torch without the PCI ids
        pass
    proc = subprocess.Popen([tool, "--query-gpu=pci.bus_id,clocks.sm,power.draw", "--format=csv,noheader,nounits",
                             "-lms", "20"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return proc, bus


def _power(fns, seconds):
    """Each function run back to back for `seconds` (synchronizing every 8 calls) while nvidia-smi samples:
    ms a call (wall clock), mean SM clock and board power over the middle 60% of the window. A kernel held
    back by the power limit shows as a lower clock at the same power."""
    import time

    out = {}
    order = (("plain", "plain_s", "gelu") + tuple(k for k in fns if _form(k) is not None) +
             ("gelu_st", "gelu_ns", "gelu16", "gelu_erf", "relu", "plain_pp", "gelu_pp", "relu_pp", "plain_ppc",
              "gelu_ppc", "relu_ppc", "torch.mm", "gelu(addmm)"))
    for name in [nm for nm in order if nm in fns]:
        fn = fns[name]
        proc, bus = _gpu_sampler()
        if proc is None:
            print("power: no nvidia-smi", flush=True)
            return out
        time.sleep(0.1)
        torch.cuda.synchronize()
        t0, calls = time.perf_counter(), 0
        while time.perf_counter() - t0 < seconds:
            for _ in range(8):
                fn()
            calls += 8
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        proc.terminate()
        text = proc.communicate()[0]
        rows = [ln.split(", ") for ln in text.strip().splitlines() if ln.count(", ") == 2]
        if bus is None and rows:  # the busiest GPU
            byb = {}
            for b_, c_, p_ in rows:
                byb.setdefault(b_, []).append(float(p_))
            bus = max(byb, key=lambda b_: sum(byb[b_]) / len(byb[b_]))
        vals = [(float(c_), float(p_)) for b_, c_, p_ in rows if b_.upper().endswith(bus.upper()[-12:])]
        mid = vals[len(vals) // 5: max(len(vals) * 4 // 5, len(vals) // 5 + 1)]
        if not mid:
            continue
        clk, pw = sum(v[0] for v in mid) / len(mid), sum(v[1] for v in mid) / len(mid)
        out[name] = dict(ms=1e3 * dt / calls, mhz=clk, watts=pw, samples=len(mid))
        print(f"  power {name:12s} {1e3 * dt / calls:7.3f} ms/call  SM {clk:6.0f} MHz  {pw:6.1f} W  "
              f"({len(mid)} samples)", flush=True)
    return out


POWER_ON = ()  # --power-on: the shape labels (substrings) --power samples; empty: every shape


def _fused_shape(h, dev, label, m, n, k, tb, kinds, rounds, suf, tile, power=0.0):
    """One --fused row: the plain matmul and the fused graphs on `tile` (suffix suf), against torch; power > 0:
    then each function run alone for that many seconds with the SM clock and the board power sampled."""
    import statistics

    import torch.nn.functional as F

    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    wt = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    w = wt.t() if tb else wt.t().contiguous()  # [k, n]: a view of the [n, k] weight, or row-major
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    r = torch.randn(m, n, device="cuda", dtype=torch.bfloat16) if "residual" in kinds else None
    out_t = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    xp, wp = x.data_ptr(), w.data_ptr()
    fns = {"torch.mm": lambda: torch.mm(x, w, out=out_t)}
    outs, on_tma, kernels, keep = {}, {}, {}, []
    for vsuf, t in ((("", M.TMA_TILE),) + (((suf, tile),) if suf else ())):
        with _TmaTile(t):
            plan = M.gemm_plan(h, BF16, m, n, k, trans_b=tb)
            rec = plan.tma if plan.tma is not None else plan.fast
            if rec.expr == _expr(t, tb):
                rec.unit = _tma_bench_unit(t, tb)  # the prebuilt one-kernel unit (the same instantiation)
            c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            outs["plain" + vsuf] = c
            d = plan.describe()[0]  # e.g. pydnn::matmul::gemm_tma<pydnn::bf16_t, 256, 4, ...>: "gemm_tma 256/4"
            args = d.split("<", 1)[1].split(", ")
            kernels["plain" + vsuf] = f"{d.split('<')[0].split('::')[-1]} {args[1]}/{args[2]}"
            fns["plain" + vsuf] = (lambda plan=plan, cp=c.data_ptr(): plan.launch(h, xp, wp, cp))
            if vsuf == "" and "plain_s" in kinds and plan.tma is not None:
                from pydnn.graph import codegen as cg

                plan_s = M.gemm_plan(h, BF16, m, n, k, trans_b=tb)
                rs = plan_s.tma
                rs.expr, rs.unit = _ps_expr(tb), PS_UNIT.format("nt" if tb else "nn")
                rs.smem += cg.stsm_smem(0)
                cs = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
                outs["plain_s"] = cs
                kernels["plain_s"] = kernels["plain"] + " stsm"
                keep.append((plan_s, cs))
                fns["plain_s"] = (lambda plan=plan_s, cp=cs.data_ptr(): plan.launch(h, xp, wp, cp))
            if vsuf != suf:
                continue  # (the candidate's pass: gemm_tma's plain kernel only)
            for kind in _kinds_of(t, kinds):
                g = _fused_graph(h, m, n, k, tb, kind)
                _build(g, kind)
                assert g.engine_index() == 1 and g.launches() == 1, (kind, g.engine_index(), g.launches())
                yk = torch.empty(m, 1 if kind == "rowmax" else n, device="cuda", dtype=torch.bfloat16)
                wbuf = torch.empty(max(g.get_workspace_size(), 1), device="cuda", dtype=torch.uint8)
                bufs = {"x": xp, "w": wp, "y": yk.data_ptr()}
                if _base(kind) != "gelu_nob":
                    bufs["b"] = b.data_ptr()
                if kind == "residual":
                    bufs["r"] = r.data_ptr()
                keep.append((g, yk, wbuf))
                outs[kind + suf] = yk
                on_tma[kind + suf] = g._plan_obj.built.steps[0].recs[0][0].maps is not None
                fns[kind + suf] = (lambda g=g, bufs=bufs, wp_=wbuf.data_ptr(): g.execute(bufs, wp_))
    tnames = {"gelu": "gelu(addmm)", "gelu16": "gelu(addmm)",
              "gelu_erf": "gelu(addmm)", "relu": "relu(addmm)", "plain_s": "torch.mm",
              "residual": "addmm+r", "rowmax": "addmm.amax", "bias": "addmm", "gelu_nob": "gelu(mm)"}
    tnames.update({kd: "gelu(addmm)" for kd in kinds if _form(_base(kd)) is not None})
    has = {_base(kd[:-len(suf)] if suf and kd.endswith(suf) else kd) for kd in fns}
    has = {"gelu" if _form(kd) is not None else kd for kd in has}
    if has & {"gelu", "gelu16", "gelu_erf"}:
        fns["gelu(addmm)"] = lambda: F.gelu(torch.addmm(b, x, w))
    if "relu" in has:
        fns["relu(addmm)"] = lambda: F.relu(torch.addmm(b, x, w))
    if "residual" in has:
        fns["addmm+r"] = lambda: torch.addmm(b, x, w) + r
    if "rowmax" in has:
        fns["addmm.amax"] = lambda: torch.addmm(b, x, w).amax(-1, keepdim=True)
    if "bias" in has:
        fns["addmm"] = lambda: torch.addmm(b, x, w)
    if "gelu_nob" in has:
        fns["gelu(mm)"] = lambda: F.gelu(torch.mm(x, w))
    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    ref = torch.addmm(b, x, w).float()
    mm = torch.mm(x, w).float()
    want = {"plain": mm, "plain_s": mm, "gelu": F.gelu(ref), "relu": F.relu(ref), "gelu16": None,
            "residual": ref + r.float() if r is not None else None, "rowmax": ref.amax(-1, keepdim=True),
            "bias": ref, "gelu_nob": F.gelu(mm)}
    want["gelu16"] = want["gelu_erf"] = want["gelu"]
    want.update({kd: want["gelu"] for kd in kinds if _form(_base(kd)) is not None})
    errs = {name: _err(o, want[_base(name[:-len(suf)] if suf and name.endswith(suf) else name)])
            for name, o in outs.items()}
    del ref, want, mm
    t = {name: [] for name in fns}
    import random

    for rd in range(rounds):
        # each round in its own (seeded) order: a function's place after a heavier one (clocks, power) is not
        # the same in every round
        order = list(fns)
        random.Random(rd).shuffle(order)
        for name in order:
            t[name].append(time_ms(fns[name], reps=10, warmup=2))
    med = {name: statistics.median(v) for name, v in t.items()}
    # paired ratios (session 31): each round a fused graph timed between two timings of its plain kernel, the
    # ratio to their mean; the median over rounds. Clock states drift over a run by more than the effect (the same
    # plain kernel measured 0.72 and 0.81 ms on N = 4096 in one run), and a ratio of medians taken at different
    # moments carries that drift; adjacent timings share the state.
    pair = {}
    for kind in kinds:
        key, p_ = kind + suf, "plain" + suf
        if key not in fns:
            continue
        rs = []
        for _ in range(rounds):
            a_ = time_ms(fns[p_], reps=10, warmup=2)
            f_ = time_ms(fns[key], reps=10, warmup=2)
            b_ = time_ms(fns[p_], reps=10, warmup=2)
            rs.append(2.0 * f_ / (a_ + b_))
        pair[key] = statistics.median(rs)
    fl = 2.0 * m * n * k
    rr = dict(case=label + suf, device=dev, ms=med, tflops={name: fl / v / 1e9 for name, v in med.items()},
              kernels=kernels, fused_on_tma=on_tma, errs=errs, paired_over_plain=pair)
    p = "plain" + suf
    rr["plain_vs_torch"] = med["torch.mm"] / med[p]
    line = (f"{label:24s}{suf:3s} plain {kernels[p]:24s} {rr['tflops'][p]:6.1f} TFLOP/s "
            f"({rr['plain_vs_torch']:.3f}x torch.mm {rr['tflops']['torch.mm']:6.1f})")
    if suf:
        rr["plain_over_tma"] = med[p] / med["plain"]
        line += f" [{rr['plain_over_tma']:.3f}x gemm_tma's time]"
    for kind in kinds:
        key = kind + suf
        if key in fns:
            tn = tnames[_base(kind)]
            rr[kind + "_over_plain"] = med[key] / med[p]
            rr[kind + "_over_plain_tma"] = med[key] / med["plain"]
            rr[kind + "_vs_torch"] = med[tn] / med[key]
            line += (f" | {kind} {rr['tflops'][key]:6.1f}: {rr[kind + '_over_plain']:.3f}x its plain"
                     + (f" (paired {pair[key]:.3f}x)" if key in pair else "")
                     + (f" ({rr[kind + '_over_plain_tma']:.3f}x gemm_tma's)" if suf else "")
                     + f", {rr[kind + '_vs_torch']:.3f}x {tn} ({med[tn] / med['torch.mm']:.3f}x mm)")
    line += " | rel diff " + " ".join(f"{k_} {v:.1e}" for k_, v in errs.items())
    off = [k_ for k_, v in on_tma.items() if not v]
    line += f" | NOT ON gemm_tma: {off}" if off else ""
    print(line, flush=True)
    if power and tile is not None and (not POWER_ON or any(p_ in label for p_ in POWER_ON)):
        rr["power"] = _power(fns, power)
    del x, wt, w, b, r, out_t, outs, keep
    return rr


def fused(out=None, rounds=5, shapes=FUSED_SHAPES, kinds=("gelu", "residual", "rowmax"), pp=False, power=0.0,
          wg=False, ppc=False):
    """The graph's fused GEMMs (issue 22's target: gelu(x @ W + b) as one kernel at <= 1.05x the plain matmul's
    time and faster than F.gelu(torch.addmm(b, x, W))), bf16, timed in alternating rounds (each round every
    function, 10 samples each; medians): the plain pydnn matmul (gemm_tma), the fused gelu graph,
    F.gelu(torch.addmm(b, x, W)), torch.mm; with "residual": the fused x @ W + b + r and torch.addmm(b, x, W) + r;
    with "rowmax": the fused row max of x @ W + b and torch.addmm(b, x, W).amax(-1). Prints fused / plain time
    (the target's ratio, <= 1.05) and torch's unfused time / the fused one (> 1: the fused graph is faster);
    each result checked against torch's (max |diff| / max |ref|). pp: the same for the ping-pong candidate
    (TMA_PP_TILE: plain, gelu, residual; suffix _pp), its ratios against its own plain kernel and torch."""
    import json

    h = pydnn.create()
    pydnn.set_stream(h, torch.cuda.current_stream().cuda_stream)
    dev = torch.cuda.get_device_name()
    rows = []
    variants = _variants(pp, wg, ppc)
    try:
        _prebuild_fused(h, shapes, kinds, variants)
        # variant by variant (the chooser's tile first, every shape), so that a candidate that fails or hangs
        # leaves the rows before it printed and saved; each pass times torch's functions again, and the
        # candidate's pass gemm_tma's plain kernel too (its ratios to it)
        for suf, tile in variants:
            for label, m, n, k, tb in shapes:
                rows.append(_fused_shape(h, dev, label, m, n, k, tb, kinds, rounds, suf, tile, power))
                if out:
                    with open(out, "w") as f:
                        json.dump(rows, f, indent=1)
    finally:
        pydnn.destroy(h)
    return rows


# ----------------------------------------------------------------------------- weight gradients (--dw)

# The GPT demo's (examples/train_gpt.py defaults: d 768, MLP 3072, 12 / 4 heads of 64, vocab 256, 64 x 1024 =
# 65536 tokens a step) weight gradients dW = dy^T x as pydnn.matmul sees them: m x n = dW's shape, k = tokens,
# A = dy^T (a column-major view: trans_a).
DW_SHAPES = (("mlp fc1 dW 3072x768", 3072, 768, 65536), ("mlp fc2 dW 768x3072", 768, 3072, 65536),
             ("qkv dW 1280x768", 1280, 768, 65536), ("proj dW 768x768", 768, 768, 65536),
             ("head dW 256x768", 256, 768, 65536))


def _one_kernel_unit(rec):
    """Point launch record rec at a bench-only unit holding its one instantiation (so that the bench's kernels
    compile in parallel, where the build's units hold every transposition); the unit."""
    import hashlib

    from pydnn._build import loader
    from pydnn._build.manifest import KernelUnit

    sm90 = any(w in rec.expr for w in ("wgmma", "gemm_tma", "splitk_reduce"))
    name = hashlib.sha256(rec.expr.encode()).hexdigest()[:12]
    u = KernelUnit(f"matmul.bench1.{name}", "matmul.cu", (rec.expr,), archs=(M.WG_ARCH + "a",) if sm90 else ())
    loader.register_units([u])
    rec.unit = u.name
    return u


def _checked_medians(fns, outs, ref, rounds, reps, warmup):
    """Each function once, its output against ref (max |diff| / max |ref|), then `rounds` shuffled rounds of
    time_ms: ({name: error}, {name: median ms})."""
    import random
    import statistics

    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    errs = {name: _err(o, ref) for name, o in outs.items()}
    t = {name: [] for name in fns}
    for rd in range(rounds):
        order = list(fns)
        random.Random(rd).shuffle(order)
        for name in order:
            t[name].append(time_ms(fns[name], reps=reps, warmup=warmup))
    return errs, {name: statistics.median(v) for name, v in t.items()}


def _dw_plans(h, m, n, k):
    """{variant: (plan, workspace bytes)}: whole K (no split), the one-wave split cap (SPLIT_WAVES off), the
    planner's choice (several waves), S = 11 forced; and "ksplit8": the torch bridge's LINEAR_DW_KSPLIT = 8
    form (one batched matmul over 8 chunks of the tokens into bf16 partials; the caller sums them)."""
    from pydnn import tuning

    out = {"whole": M.gemm_plan(h, BF16, m, n, k, trans_a=True)}
    keep = tuning.matmul.SPLIT_WAVES
    try:
        tuning.matmul.SPLIT_WAVES = False
        out["split_1wave"] = M.gemm_plan(h, BF16, m, n, k, trans_a=True, split_k=True)
        tuning.matmul.SPLIT_WAVES = True
        out["split_waves"] = M.gemm_plan(h, BF16, m, n, k, trans_a=True, split_k=True)
        orig = M._split_k
        kt = -(-k // 64)
        M._split_k = lambda *a: (11, -(-kt // 11) * 64)
        try:
            out["split_S11"] = M.gemm_plan(h, BF16, m, n, k, trans_a=True, split_k=True)
        finally:
            M._split_k = orig
    finally:
        tuning.matmul.SPLIT_WAVES = keep
    s, mc = 8, k // 8
    out["ksplit8"] = M.gemm_plan(h, BF16, m, n, mc, trans_a=True, lda=m, batch=s, stride_a=mc * m, stride_b=mc * n,
                                 stride_c=m * n)
    units = []
    for name, pl in out.items():
        # what each runs: a split plan its split launches (the caller's workspace given), the others their
        # whole-K kernel (gemm_tma where the plan has it)
        for attr in (("split_fast", "reduce") if pl.split else ("tma",) if pl.tma is not None else ("fast",)):
            units.append(_one_kernel_unit(getattr(pl, attr)))
    return out, units


def dw_prepare(h, shapes=DW_SHAPES):
    """The plans of every --dw shape and their one-kernel units: ({label: (plans, units)}, [units])."""
    plans = {label: _dw_plans(h, m, n, k) for label, m, n, k in shapes}
    return plans, list({u.name: u for _, us in plans.values() for u in us}.values())


def dw(out=None, rounds=3, shapes=DW_SHAPES, h=None, prepared=None):
    """Issue 17's weight gradients: pydnn's matmul plans (whole K; split-K capped at one wave; the planner's
    several waves; S = 11) and the bridge's batched 8-chunk split + torch.sum against torch.matmul(dy.t(), x),
    in alternating rounds (ms medians); every result against a float32 torch reference (max |diff| / max |ref|).
    """
    import json
    import time
    from concurrent.futures import ThreadPoolExecutor

    from pydnn._build import loader

    own = h is None
    if own:
        h = pydnn.create()
        pydnn.set_stream(h, torch.cuda.current_stream().cuda_stream)
    rows = []
    try:
        plans, todo = prepared or dw_prepare(h, shapes)
        t0 = time.perf_counter()
        with ThreadPoolExecutor(16) as ex:
            list(ex.map(lambda u: loader.load_unit(h.arch, u), todo))
        print(f"dw prebuild: {len(todo)} units in {time.perf_counter() - t0:.1f} s", flush=True)
        for label, m, n, k in shapes:
            pls = plans[label][0]
            dy = torch.randn(k, m, device="cuda").to(torch.bfloat16)  # dy: tokens x m (A = dy^T, trans_a)
            x = torch.randn(k, n, device="cuda").to(torch.bfloat16)
            ref = torch.mm(dy.t().float(), x.float())
            outs, fns = {}, {}
            ws = torch.empty(max(max(pl.ws_bytes for pl in pls.values()), 1), dtype=torch.uint8, device="cuda")
            dp, xp, wp = dy.data_ptr(), x.data_ptr(), ws.data_ptr()
            for name, pl in pls.items():
                if name == "ksplit8":
                    part = torch.empty(8, m, n, device="cuda", dtype=torch.bfloat16)
                    c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)

                    def f(pl=pl, part=part, c=c):
                        pl.launch(h, dp, xp, part.data_ptr())
                        torch.sum(part, 0, out=c)
                    fns[name] = f
                else:
                    c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
                    fns[name] = (lambda pl=pl, cp=c.data_ptr(): pl.launch(h, dp, xp, cp, 1.0, 0.0, 0, wp, pl.ws_bytes))
                outs[name] = c
            tout = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            dyt = dy.t()
            fns["torch.matmul"] = lambda: torch.matmul(dyt, x, out=tout)
            outs["torch.matmul"] = tout
            errs, med = _checked_medians(fns, outs, ref, rounds, 10, 2)
            splits = {name: (pl.split[0] if pl.split else 1) for name, pl in pls.items() if name != "ksplit8"}
            row = dict(case=label, m=m, n=n, k=k, ms=med, errs=errs, splits=splits,
                       vs_torch={name: med["torch.matmul"] / v for name, v in med.items()})
            rows.append(row)
            print(f"{label:22s} torch.matmul {med['torch.matmul']:.4f} ms | " + " | ".join(
                f"{name}{'(S=' + str(splits[name]) + ')' if name in splits else ''} {med[name]:.4f} "
                f"({row['vs_torch'][name]:.3f}x torch, err {errs[name]:.1e})" for name in pls), flush=True)
            if out:
                with open(out, "w") as fo:
                    json.dump(rows, fo, indent=1)
            del dy, x, ref, outs, fns, ws
    finally:
        if own:
            pydnn.destroy(h)
    return rows


# --shortk: GEMMs with a short reduction (64 <= K < 256) and a wide output, where tuning.matmul.WG_PERSIST_MIN_K
# decides between the mma.sync tiles and the persistent 128x256 wgmma tile (issue 18's 1x1 convolutions run
# such GEMMs: N32 1x1 64->256 @56 is 100352 x 256 x 64); (label, m, n, k, B transposed)
SHORTK_SHAPES = (("1x1 64->256 @56 N32", 100352, 256, 64, True), ("1x1 128->512 @28 N32", 25088, 512, 128, True),
                 ("1x1 64->128 @56 N32", 100352, 128, 64, True), ("1x1 64->64 @56 N32", 100352, 64, 64, True),
                 ("linear 16384x1152x128", 16384, 1152, 128, True), ("linear 16384x4096x192", 16384, 4096, 192, True),
                 ("4096x4096x64 nn", 4096, 4096, 64, False), ("8192x8192x128 nn", 8192, 8192, 128, False),
                 ("rnn 8192x512x128", 8192, 512, 128, True))
SHORTK_MIN_K = (256, 64)


def shortk(out=None, rounds=5, shapes=SHORTK_SHAPES):
    """The plain matmul's plan at each SHORTK_MIN_K setting of tuning.matmul.WG_PERSIST_MIN_K against torch.mm,
    in shuffled rounds (ms medians), every result checked against a float32 reference."""
    import json

    from pydnn import tuning

    h = pydnn.create()
    pydnn.set_stream(h, torch.cuda.current_stream().cuda_stream)
    rows = []
    keep = tuning.matmul.WG_PERSIST_MIN_K
    try:
        for label, m, n, k, tb in shapes:
            a = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            b = torch.randn(n, k, device="cuda").to(torch.bfloat16) if tb else torch.randn(k, n, device="cuda").to(
                torch.bfloat16)
            bt = b.t() if tb else b
            ref = torch.mm(a.float(), bt.float())
            fns, outs, kern = {}, {}, {}
            for mk in SHORTK_MIN_K:
                tuning.matmul.WG_PERSIST_MIN_K = mk
                pl = M.gemm_plan(h, BF16, m, n, k, trans_b=tb)
                tuning.matmul.WG_PERSIST_MIN_K = keep
                c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
                name = f"min_k {mk}"
                fns[name] = (lambda pl=pl, cp=c.data_ptr(): pl.launch(h, a.data_ptr(), b.data_ptr(), cp, 1.0, 0.0))
                outs[name], kern[name] = c, pl.describe()[0].replace("pydnn::matmul::", "")[:48]
            tout = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            fns["torch.mm"] = lambda: torch.mm(a, bt, out=tout)
            outs["torch.mm"] = tout
            errs, med = _checked_medians(fns, outs, ref, rounds, 20, 3)
            flops = 2 * m * n * k
            rows.append(dict(case=label, m=m, n=n, k=k, ms=med, errs=errs, kernels=kern))
            print(f"{label:24s} torch.mm {med['torch.mm']:.4f} ms | " + " | ".join(
                f"{name} {med[name]:.4f} ({med['torch.mm'] / med[name]:.3f}x torch, {flops / med[name] / 1e9:.0f} "
                f"TFLOP/s, err {errs[name]:.1e}) {kern[name]}" for name in kern), flush=True)
            del a, b, ref, outs, fns
        if out:
            with open(out, "w") as fo:
                json.dump(rows, fo, indent=1)
    finally:
        tuning.matmul.WG_PERSIST_MIN_K = keep
        pydnn.destroy(h)
    return rows


if __name__ == "__main__":
    import argparse
    import os
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser()
    ap.add_argument("--shortk", action="store_true", help="short-K GEMMs at each SHORTK_MIN_K of "
                    "tuning.matmul.WG_PERSIST_MIN_K vs torch.mm")
    ap.add_argument("--mid", action="store_true", help="gemm_tma vs gemm_wgmma_p vs torch.mm on 8192^3 and the 7B shapes")
    ap.add_argument("--out", default=None)
    ap.add_argument("--f32", action="store_true", help="float without TF32: the build's tiles and SIMT_CANDIDATES vs "
                    "torch.mm (TF32 off) on 8192^3 and the 7B shapes (--shapes: labels of F32_SHAPES)")
    ap.add_argument("--cands", default=None, help="--f32: the SIMT_CANDIDATES names to time (default: all)")
    ap.add_argument("--trans-all", action="store_true", help="--f32: prebuild every transposition's kernels (for "
                    "GPU tests run after it)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--no-old", action="store_true", help="--mid without the gemm_wgmma_p column (its compile)")
    ap.add_argument("--fused", action="store_true", help="the fused graphs (bias + GELU, + residual, row max) vs the "
                    "plain matmul, F.gelu(torch.addmm) and torch.mm on 8192^3 and the 7B shapes (nn, nt)")
    ap.add_argument("--shapes", default=None, help="--fused / --f32: labels of their shapes to run (comma-separated "
                    "substrings, e.g. '4096x4096 nn,11008x4096 nt')")
    ap.add_argument("--kinds", default="gelu,residual,rowmax", help="--fused: fused graphs to time (gelu: the graph's "
                    "default GELU form for bf16 outputs, gelu16: the degree-7 gelu_fast, gelu_erf: erff's; relu, "
                    "residual, rowmax)")
    ap.add_argument("--pp", action="store_true", help="--fused: also the ping-pong candidate (TMA_PP_TILE)")
    ap.add_argument("--ppc", action="store_true", help="--fused: also the ping-pong cluster candidate (TMA_PPC_TILE)")
    ap.add_argument("--wg", action="store_true", help="--fused: also the fused gelu on the wgmma kernel (USE_TMA off)")
    ap.add_argument("--power", type=float, default=0.0, help="--fused: each function alone for this many seconds "
                    "with nvidia-smi sampling the SM clock and board power (is the GEMM held by the power limit?)")
    ap.add_argument("--dw", action="store_true", help="the GPT demo's weight gradients (issue 17): split-K plans vs "
                    "torch.matmul (DW_SHAPES; with --fused: after it, --dw-out its json)")
    ap.add_argument("--dw-out", default=None)
    ap.add_argument("--power-on", default="", help="--power: only the --fused shapes whose label holds one of these "
                    "comma-separated substrings")
    args = ap.parse_args()
    POWER_ON = tuple(p_ for p_ in args.power_on.split(",") if p_)
    if args.fused:
        sel = FUSED_SHAPES
        if args.shapes:
            sel = tuple(s for s in FUSED_SHAPES if any(p.strip() in s[0] for p in args.shapes.split(",")))
        th = None
        if args.dw:  # its kernels compile beside the fused ones (NVRTC releases the GIL)
            import threading
            from concurrent.futures import ThreadPoolExecutor

            from pydnn._build import loader

            h0 = pydnn.create()
            pydnn.set_stream(h0, torch.cuda.current_stream().cuda_stream)
            prep = dw_prepare(h0)

            def build_dw():
                with ThreadPoolExecutor(8) as ex:
                    list(ex.map(lambda u: loader.load_unit(h0.arch, u), prep[1]))
            th = threading.Thread(target=build_dw)
            th.start()
        try:
            fused(args.out, args.rounds, sel, tuple(args.kinds.split(",")), args.pp, args.power, args.wg, args.ppc)
        finally:
            if th is not None:
                th.join()
        if args.dw:
            dw(args.dw_out, args.rounds, h=h0, prepared=prep)
    elif args.dw:
        dw(args.dw_out or args.out, args.rounds)
    elif args.f32:
        sel = F32_SHAPES
        if args.shapes:
            sel = tuple(s for s in F32_SHAPES if any(p.strip() in s[0] for p in args.shapes.split(",")))
        f32(args.out, args.rounds, sel, args.trans_all, args.cands.split(",") if args.cands else None)
    elif args.shortk:
        shortk(args.out, args.rounds)
    elif args.mid:
        mid(args.out, args.rounds, old_kernel=not args.no_old)
    else:
        ap.error("run the full benchmark through tools/bench.py --families matmul")
