"""Convolution benchmark: ResNet-50 layer shapes at N = 64, forward / backward data / backward filter,
pydnn beside cuDNN through PyTorch (torch.backends.cudnn.benchmark = True, so cuDNN picks its fastest
algorithm; TF32 off for fp32).

Flops counted: 2 * N * K * P * Q * C * R * S for each direction (the multiply-adds of the GEMM; padding
taps included, as everyone counts them). Peaks for "% of peak": dense bf16 tensor-core 990 TFLOP/s
(datasheet; ~790 measured through GEMM), fp32 FMA ~67 TFLOP/s.

Versions and notes:
  v1 (this commit) CUDA-core implicit GEMM for every direction and dtype (64 x 64 x 16 tiles, 256
     threads, 4 x 4 outputs per thread, operands converted to fp32 in shared memory). Prediction before
     measuring: ~10-20 TFLOP/s fp32 (15-30% of the FMA peak: 140-190 registers leave one block per SM,
     and scalar shared-memory reads feed only 2 FMAs each); bf16 the same rate, so a small fraction of
     cuDNN's tensor-core rate. The tensor-core IMPLICIT_PRECOMP_GEMM (mma.sync) is the next step.
     Measured (H200, cuDNN 9.19): fp32 4.2-8.3 TFLOP/s (6-12% of FMA peak, 0.08-0.76x cuDNN); bf16 the
     same few TFLOP/s (0.01-0.04x cuDNN). Prediction met for fp32's rate, not for its ratio.
  v2 tensor-core forward (IMPLICIT_PRECOMP_GEMM): 128 x 128 x 32 tiles, 8 warps of 64 x 32, mma.sync
     m16n8k16 + ldmatrix, 2-stage cp.async, scalar epilogue. Predicted ~150 TFLOP/s on the 3x3 layers.
     Measured: 3x3 58 / 105 / 127 / 99 TFLOP/s (0.17 / 0.36 / 0.26 / 0.20x cuDNN), 1x1 38 and 18
     TFLOP/s; fused bias + ReLU 1.13x the plain kernel. Missed: the 64-channel layers leave half of each
     128-wide tile empty, the short-K 1x1 layers are dominated by the per-element epilogue, and two
     stages do not hide the global latency.
  v3 3-stage pipeline in dynamic shared memory, BN = 64 tiles (32 x 32 warp tiles) for K <= 64, an
     epilogue with a fast path for plain forward and 32-bit channel-pair stores; tensor-core backward
     data (BWD_DATA_ALGO_1, B as [k][n] through ldmatrix.trans). Predicted: 3x3 layers 150-250 TFLOP/s,
     the 64-channel 3x3 ~2x v2, 1x1 layers 1.5-2x v2; backward data like forward for stride 1.
     Measured (same run as the cuDNN column; cuDNN itself moves 10-20% between runs):
       forward 3x3   109 / 153 / 131 / 110 TFLOP/s = 0.39 / 0.52 / 0.40 / 0.31x cuDNN (56², 28², 14², 7²)
       forward 1x1   81 (256->64, 0.46x), 48 (64->256, 0.30x)
       bwd data 3x3  98 / 129 / 110 / 86 = 0.46 / 0.55 / 0.28 / 0.22x; 1x1 48 (0.31x), 77 (0.45x)
       fused bias + ReLU: 1.24x the plain forward (the plain path got the fast epilogue, the fused one
       still reads the bias per element and runs the activation switch).
     The 64-channel 3x3 layer doubled (BN = 64), the 1x1 layers gained 2-2.7x (epilogue), the deep
     3x3 layers only 3-50%: below the 150-250 prediction. Likely limits, untested for lack of device
     time: one 128 x BN tile per block with 8 warps and 2 blocks per SM leaves the tensor cores idle
     during the A-address arithmetic (each thread recomputes 2 A and 1-2 B addresses with bounds checks
     per 32-deep step) and the epilogue's scalar decomposition; the 7x7 / 14x14 layers also fill only
     98-196 blocks (partial waves on 132 SMs). Next: 64-deep k steps (fewer barriers per MMA), a
     swizzled smem layout for 128-byte rows, a shared-memory staged epilogue with 16-byte stores, and
     Hopper wgmma with TMA (the MmaSm80 engine is the slot for it).
  v4 (this commit) tensor-core backward filter (BWD_FILTER_ALGO_1 for fp16 / bf16 with NHWC x and dy,
     C, K % 8): wgrad_tc, M = K, N = taps * C (c innermost), the N * P * Q reduction split over grid.z
     into fp32 partials added in split order by conv::fold (deterministic; one split writes dw
     directly). Both operands are k-major in shared memory ([pos][k], [pos][c] rows padded by 16 bytes)
     and read with ldmatrix .trans (MmaSm80::step_tt); BM x 128 x 32 tiles (BM 128, or 64 for K = 64 and
     where it quantizes better), 8 warps, 4-stage cp.async, 2 blocks per SM (128 registers, no spills).
     (BM, splits) from a model: rounds of blocks per SM x k tiles + the fold's traffic. Model picks for
     the 3x3 layers: 64x128 x 52 splits (56²), 128x128 x 29 (28²), 128x128 x 7 (14²), 64x128 x 1 (7²,
     no fold). Forward / backward data: BM x BN tiles (128 or 64 each, TC_TILES) chosen by a wave model
     (_tc_tiling: rounds of one block per SM x tile work / the tile's measured speed), 4 stages.
     Predicted: backward filter 150-300 TFLOP/s on the 3x3 layers (0.4-0.8x cuDNN; 50-100x the
     CUDA-core ALGO_1); forward / backward data 10-30% from the tiles and the 4th stage.
     Measured (H200; cuDNN's backward filter through PyTorch 267-361 TFLOP/s in this run, 308-486 in a
     second run an hour later: cuDNN's own numbers move 20-40% between runs):
       bwd filter 114 / 148 / 139 / 95 TFLOP/s = 0.43 / 0.53 / 0.38 / 0.29x cuDNN (56², 28², 14², 7²):
       30-45x the CUDA-core ALGO_1, at the low end of the prediction. The model's (BM, splits) was the
       fastest of the forced alternatives within 5% on every layer (e.g. 28²: 29 splits 148, 14 splits
       135, 58 splits 132; 14²: 7 splits 139, 14 splits 130, 3 splits 116, 1 split 44).
       fwd 113 / 157 / 129 / 113 (0.32 / 0.37 / 0.27 / 0.23x), bwd data 102 / 136 / 118 / 91 (0.26 /
       0.27 / 0.31 / 0.33x), each with the tile the model now picks: no better than v3's 3 stages
       (prediction missed). 128 x 128 beats 128 x 64 and 64 x 128 by ~20%, 64 x 64 by ~40%, even where
       the smaller tiles fill the waves better (7²: 100 blocks of 128 x 128 alone on their SMs 113, 392
       of 64 x 64 102): one block per SM runs about as fast per SM as two. Per SM that is ~1.2 TFLOP/s,
       a 128 x 128 x 32 tile every ~1700 clocks against ~400 for its MMAs at the mma.sync rate.
  v5 (tried in the same session, measured, and reverted: none of it paid): the tap-gathered operand
     copied through L1 (cp.async.ca; the 9 taps of a 3x3 filter read mostly the same pixels), 256 x 128
     tiles (8 warps of 64 x 64 warp tiles, one block per SM, 25% fewer bytes per flop), BK = 64 stages
     (3 deep; half the barriers per MMA), fragment double buffering in the engine (the next k16 step's
     ldmatrix issued before this step's MMAs) and non-volatile mma asm. Predicted, on the theory that
     L2 -> SM traffic (16 KB per 128 x 128 x 32 tile, ~2.4 TB/s over the GPU) was the limit: 1.3-1.6x
     from the L1 gather, ~1.2x from 256 x 128, 0-10% from the rest. Measured: L1 gather +0-2% (so L2
     traffic is not the limit), 256 x 128 slower on 3 of 4 layers (fwd 14² 147 vs 127 the only gain),
     BK 64 +2-10% on forward (fwd 123 / 157 / 144 / 113), nothing on backward data, double buffering
     nothing measurable. The limit is elsewhere: the likeliest remaining suspects are the per-chunk
     address arithmetic in the same warps as the MMAs (no warp specialization) and mma.sync's own rate
     on Hopper; a wgmma + TMA engine (the MmaSm80 slot) is the step that changes both.
  v6 forward and stride-1 backward data on matmul's main-loop structure (implicit_gemm_pipe_tc in
     ptx/convolution.cu, the loop in ptx/common/mma_pipe.cuh). Instruction comparison first (NVRTC PTX,
     sm_90; no SASS disassembler here): v4's fwd_tc spends per 32-deep k tile and thread ~200 PTX
     instructions on the gather (12 mul.lo.s64, 19 cvt.s64.s32, 18 param loads, the digit stepping, 3 dims
     x 2 rows of bounds checks) for 32 mma + 12 ldmatrix per warp and one barrier; matmul's pipeline 2
     spends a pointer increment per 16-byte chunk on 128 mma per warp per barrier. Not the difference:
     bank conflicts (v4's 80-byte rows put an ldmatrix's 8 rows in 8 bank groups), ldmatrix (both use
     it), spills (v4: none, 126 registers). New: 64-deep K tiles = 64 channels of ONE filter tap (K
     ordered (tap, channel block)), so a tap's offset is the same for every row; each thread keeps per
     row a 32-bit offset and a tap-validity mask (bits t * R + r and 16 + s) from one decomposition at
     the start ("precomputed" iterators), and a tile costs per chunk a mask test, an add and a cp.async;
     swizzled 128-byte shared rows, 3 stages, matmul's barrier placement; optional fragment double
     buffering (DB). Needs channels % 64 for the model to pick it (other channel counts zero-fill the
     block: forced tilings only), T * R <= 16, S <= 16, offsets < 2^31, stride 1 for backward data.
     Predicted: matmul's ~1240 FLOP/clk/SM, i.e. ~300 TFLOP/s where the waves fill.
     Measured (H200, two runs, the same numbers within 2%; cuDNN 359 / 513 / 517 / 510 forward, 385 /
     501 / 527 / 531 backward data):
       tile (warps, blocks/SM cap, DB)   fwd 56² / 28² / 14² / 7²     bwd data 56² / 28² / 14² / 7²
       v4 fwd_tc / bwd_data_tc, best     113 / 158 / 134 / 114          104 / 137 / 117 /  94
       128x64  (4x1, 2, DB)              125 / 171 / 158 / 175          144 / 196 / 181 / 201
       128x64  (4x1, 2, no DB)           126 / 174 / 160 / 178          149 / 202 / 187 / 207
       128x64  (4x1, 3, no DB)           149 / 188 / 228 / 180          166 / 212 / 249 / 199
       128x128 (4x2, 2, no DB)           104 / 222 / 194 / 166          107 / 223 / 198 / 165
       128x128 (2x2, 2, no DB)            63 / 128 / 179 / 113           89 / 182 / 212 / 163
       256x128 (4x2, 1, no DB)            63 / 133 / 177 / 106           94 / 178 / 208 / 116
       64x64   (2x1, 4, no DB)           109 / 145 / 130 / 141          144 / 192 / 176 / 195
       (128x256 / 256x128 / 128x128 with 64x64 warp tiles AND double buffering spilled 44-164 bytes at
       255 registers and ran 30-190 TFLOP/s; dropped.)
     The model now picks 128x64 (4x1, 3) for 56², 14², 7² and 128x128 (4x2, 2) for 28²: forward 149 /
     222 / 228 / 180 = 0.41 / 0.43 / 0.44 / 0.35x cuDNN, backward data 166 / 223 / 249 / 199 = 0.43 /
     0.44 / 0.47 / 0.37x (1.3-1.7x v4 forward, 1.6-2.1x backward data). Per SM at 1.98 GHz: a
     128 x 128 x 32 tile-equivalent every 1200-1840 clocks forward, 1100-1650 backward data (v4:
     1700-2900; matmul: ~845). Prediction missed (0.35-0.47x against the 0.6x target). What the table
     says: the rate follows the warps resident per SM, not the warp tile or the per-chunk cost: 12-16
     warps (128x64 x 3 blocks, 128x128 x 8 warps x 2) beat 8 warps by 20-60%, matmul's own best shape
     (64x64 warp tiles, 8 warps, one block per SM) is the worst here, and double buffering the fragments
     buys nothing (as in v5). The loop is latency bound: short reductions (9 to 72 K tiles per block
     against matmul's 64 at 4096^3) leave each block's pipeline fill (2 tiles of global latency), the
     tap-mask setup and the epilogue exposed unless other blocks cover them. Next: a persistent kernel
     that prefetches the next output tile's first stages during the epilogue (or split-K for 7²), 4
     stages for the 12-warp tile, and wgmma + TMA (the producer / consumer split of mma_pipe.cuh).
     Backward filter (wgrad_tc) unchanged: 115 / 150 / 141 / 95 (0.37 / 0.40 / 0.33 / 0.19x).
  v7 (this session) three changes, predictions written before the device run:
     (a) Fused conv + bias + ReLU at 1.90x the plain forward. Found on the CPU: the fused call plans the
     very same kernel, tile and grid as the plain one (implicit_gemm_pipe_tc 128x64, 4x1 warps, 3 blocks
     per SM, 1568 blocks at 56²; no fallback, no extra pass), and its host work is 11 µs against 6 µs,
     far under the kernel's ~100 µs. So the difference is inside the kernel, in the epilogue: the fused
     path ran epilogue_value per element, unrolled over the warp tile (2 x 2 x 8 channel pairs = 64
     inlined copies), each with the activation switch and its sigmoid / tanh / expm1 code inlined, and
     the bias read per element behind data-dependent branches. The kernel's SASS was 235 KB (0x39700,
     readelf on the NVRTC cubin) for a main loop of a few KB: the fused path walks ~200 KB of code per
     block, so every block's epilogue runs from instruction-cache misses, while the plain path's
     epilogue is a short branch. Fix: the plain (alpha-only) case keeps the register epilogue; every
     other case (beta, z, bias, activation) stages the accumulators in shared memory (fp32, rows of
     BN + 8 floats) and finishes groups of 8 channels in a rolled loop: 16-byte loads of z / y and of
     the 8 biases, one activation switch per group, 16-byte stores (fwd_staged_epilogue; scalar tails
     where a layout forbids vectors). Kernel text 95 KB. Side effect: ptxas spilled 20-28 bytes in the
     128x64 forward tile once both epilogues were inlined (HEAD: 8 bytes); an opaque asm on the
     epilogue's row base keeps its decompositions below the main loop: 0 bytes now.
     Predicted: fused <= 1.05x plain (from 1.90x); plain forward unchanged within 3% (its 8-byte spill
     gone); the plain forward through the staged epilogue (TC_STAGED_PLAIN, bench row) within 5%.
     (b) Backward filter on the pipelined loop: wgrad_pipe_tc (64-position K tiles, both operands k-major
     in swizzled [64][BM] / [64][BN] tiles read by ldmatrix .trans, dy's positions as one 32-bit offset
     stepped by 64 (packed NHWC dy, host-checked), x's gathered rows stepped by the digits of 64, 3
     stages), tiles 128x128 (4x2 warps, 2 per SM: 128 registers, no spill) and 64x128 (2x2 warps, 3 per
     SM), (tile, splits) from the pipelined forward's warp-speed model (_wgrad_pipe_tiling). Model
     picks 64x128 x 79 splits (56²), 128x128 x 28 (28²), 128x128 x 7 (14²), 64x128 x 1 (7²).
     Predicted 1.3-1.6x v4's wgrad_tc (forward / backward data gained 1.3-2.1x moving to this loop):
     56² 150-180, 28² 200-240, 14² 190-230, 7² 150-190 TFLOP/s (0.45-0.55x cuDNN).
     (c) v7's backward filter ranking (the heuristic in pydnn/ops/convolution_algos.py): the CUDA-core
     backward filter's fill counted waves of 2 blocks per SM, so ALGO_0's 144 blocks (fp32 256->256
     @14) and ALGO_1's 288 half-length blocks tied and ALGO_0 (listed first) won; the busiest SM runs 2
     full blocks against 3 half blocks, 1.33x, which is what Find measured. New fill: the busiest SM's
     blocks (a lone block at 0.75 of a pair's per-SM rate). Only that layer's pick changes (checked on
     the CPU over every bench layer and dtype). Predicted: v7 vs Find 1.0x there, 42/42.
     Measured, run 1 (H200; cuDNN this run: fwd 348 / 482 / 500 / 526, bwd filter 279 / 283 / 436 / 489):
       fused bias + ReLU 1.094x plain (from 1.90x), fused z + bias + ReLU 1.245x, the plain forward
       through the staged epilogue 1.039x the register one: the code-size cause is confirmed (a 1.7x
       gain), the rest is the staging (2 barriers, 32 KB through shared memory, a division-heavy row
       decomposition per group) and, with z, one exposed memory latency per group in the rolled loop.
       plain forward 171 / 236 / 246 / 195 TFLOP/s (v6: 149 / 222 / 228 / 180): +6-14% in this run,
       but runs 2 and 3 measured 165 / 217-222 / 233-235 / 184-185, i.e. +10% on 56² (the 128x64 tile's
       8-byte spill gone) and 0-3% elsewhere: the prediction (within 3%) held except on 56². Backward
       data unchanged (163 / 224 / 247 / 196).
       backward filter (tile, splits: TFLOP/s)            56²         28²         14²         7²
         v4 wgrad_tc, its model's choice                 114.7       148.8       142.2        94.9
         wgrad_pipe_tc, the model's choice (above)       178.6       192.9       183.0       156.4
         64x128 (2x2, 3/SM)                     39 sp 136.8 / 158 sp 164.8   181.8 (28)  174.2 (7)   138.1 (2 sp)
         128x128 (4x2, 2/SM)                    79 sp 104.9   14 sp 169.4 / 56 sp 165.3   3 sp 143.4 / 14 sp 161.1   132.6 (1 sp)
       = 0.64 / 0.68 / 0.42 / 0.32x cuDNN, 1.29-1.65x v4: inside the prediction on 56², 28², 7², below
       it on 14² (183 vs 190-230). The model's (tile, splits) was the fastest measured on every layer.
       v7 vs Find, fp32 256->256 @14 backward filter: v7 picks ALGO_1, Find's fastest, 1.00x (met).
     Then: bias + IDENTITY / RELU / CLIPPED_RELU without z or beta back in the register epilogue (the
     activation a template argument, the bias read once per column pair: 4 instantiations of the
     unrolled epilogue, no per-element switch), and the staged epilogue's common case (16-byte layouts,
     a clamp-type activation) one unrolled pass per thread: its channel group is fixed, so the 8 biases
     are read once, and all its rows' z / y loads are issued before the first is used. A third
     pipelined backward-filter tile, 128x64 (4x1 warps, 3/SM), as a forced variant (the model ranks it
     below the others). Predicted: fused bias + ReLU 1.00-1.04x plain; with z 1.08-1.15x (z's 26 MB
     read is ~8% of the kernel's time at the copy rate).
     Measured, run 2 (cuDNN: fwd 340 / 513 / 515 / 522, bwd filter 307 / 395 / 430 / 481):
       fused bias + ReLU 1.047x plain, fused z + bias + ReLU 1.140x, plain through the staged epilogue
       1.098x (so the plain op keeps the register epilogue). Plain forward 165 / 217 / 233 / 184, 3-8%
       under run 1 (cuDNN's own forward moved -2 to +6% between the runs; the plain path's code did not
       change).
       128x64 (4x1 warps, 3/SM) backward filter at the other tiles' splits: 106.4 (56², a half-empty
       tile) / 200.3 (28 sp) / 188.8 (7 sp) / 168.9 (1 sp): the fastest tile on 28², 14², 7² (+4%, +4%,
       +8% over the model's picks, which again measured 177.9 / 191.6 / 181.5 / 156.6). The model
       counted 16 warps of 128x128 as 18% faster per flop than 12 and had no tile term: now
       WGP_TILE_SPEED (128x128 0.8, 64x128 1.0, 128x64 1.08), which picks 64x128 x 79 (56²), 128x64 x
       22 (28²), x 7 (14²), x 1 (7²).
     Then: the fused ReLU (NOT_PROPAGATE_NAN) epilogue as one FFMA (alpha * acc + bias) and one FMNMX
     per element (was FMUL, FADD and a NaN test with two selects), the fused row timed with time_pair.
     Predicted: fused bias + ReLU 1.00-1.03x; backward filter 178 / 200 / 189 / 169.
     Measured, run 3 (cuDNN: fwd 352 / 516 / 521 / 527, bwd filter 306 / 385 / 432 / 489):
       fused bias + ReLU 1.025x plain (target <= 1.05x: met; 1.90x at the start of the session),
       fused z + bias + ReLU 1.141x, plain through the staged epilogue 1.096x.
       backward filter, the model's picks: 178.0 (64x128 x 79) / 212.5 (128x64 x 22) / 189.5 (128x64
       x 7) / 170.7 (128x64 x 1) TFLOP/s = 0.58 / 0.55 / 0.44 / 0.35x cuDNN, 1.33-1.79x v4's wgrad_tc
       (114 / 149 / 142 / 96), the fastest of every forced alternative on each layer (28²: 64x128 x 22
       196.5, 128x64 x 44 199.8, x 11 167.3; 14²: 128x128 x 7 183.4, 64x128 174.3, 128x64 x 14 179.1;
       7²: 64x128 157.4, 128x64 x 2 147.3, 128x128 133.3). Prediction met except 28² (above it).
       forward 165 / 222 / 235 / 185, backward data 165 / 223 / 250 / 199 (as run 2).
     Still short of 0.6x cuDNN: forward 0.35-0.47x, backward data 0.37-0.47x, backward filter 0.35-0.58x.
     What the runs say: tiles with 12 resident warps (3 blocks of 4) win on every direction; split-K
     beyond one round of blocks per SM loses (the fold's traffic and each block's fill); at 7² the backward filter runs 49 K tiles per block (3136 positions) and
     the forward / backward data 72 over only 196 output positions per image, and all three sit lowest. Next, as before: a persistent kernel prefetching the next tile's
     first stages during the epilogue, 4 stages for the 12-warp tiles, and (wgrad) the gathered rows'
     positions computed once per K tile in shared memory instead of per thread (each thread now steps
     4 position digits per row and K tile); the z epilogue (1.14x) could read z for the whole block with
     cp.async into the freed stages before the accumulators are staged.
  v8 (this session) the forward on Hopper's wgmma (fwd_wgmma in ptx/convolution.cu, units
     convolution.wgmma.<tag> compiled for sm_90a only): the pipelined forward's gather unchanged (per-row
     32-bit offsets + tap masks, cp.async zero-fill, one K tile = 64 channels of one tap) into the same
     swizzled [rows][64] tiles, which ARE wgmma's K-major 128B-swizzled slabs once each stage starts on a
     1024-byte boundary; two warpgroups of wgmma.m64nBNk16 (64 x BN each) read A (x gathered) and B (w as
     [k_out][k]) straight from shared memory; gemm_wgmma's ring (ptx/matmul.cu: wait, proxy fence, one
     barrier, 4 wgmmas as one group, wait until one group is pending, refill the stage of tile kt - 2);
     the pipelined kernel's epilogues through an adapter presenting the wgmma fragment as m16n8 ones.
     Tiles (ptxas, sm_90a): 128x64 4 stages 2 blocks/SM (94 registers, no spill; m64n64k16 added to
     common/wgmma.cuh), 128x128 4 stages 1/SM (174 registers, no spill). Dropped before measuring:
     128x128 3 stages 2/SM (176-byte spill at the 128-register cap), 128x256 4 stages (228-byte spill:
     the unrolled register epilogue over 32 n8 columns), 128x64 3 stages 3/SM (ptxas C7515: wgmma
     serialized, accumulator registers moved between the MMAs).
     Predicted before the device run: matmul gained 1.6x going to wgmma at long K; here the reductions
     are short (9-72 K tiles a block) and the loop was latency bound by resident warps (v6), which the
     new tiles lower (8 warps a block, 16 / 8 per SM), so less: 1.15-1.4x the pipelined forward, i.e.
     56² 190-230 (128x64), 28² 250-310, 14² 260-320, 7² 200-250 TFLOP/s (128x128), ~0.5-0.6x cuDNN;
     fused bias + ReLU on the wgmma tile within 1.05x its plain forward.
     Measured (H200, one run; its tests first: 40 wgmma tests, every TC_CASES case x both tiles x both
     types, plain / beta / every activation with and without z, all passed; cuDNN this run 344 / 521 /
     519 / 522 forward):
       forward (TFLOP/s)              56²     28²     14²     7²
       pipe_tc, the model's pick     164.3   221.6   233.5   183.1   (v7: 165 / 222 / 235 / 185)
       wgmma 128x64 (4 st, 2/SM)     197.3   255.0   278.5   237.1
       wgmma 128x128 (4 st, 1/SM)    114.7   258.7   234.7   260.5
       best wgmma / pipe_tc          1.20x   1.17x   1.19x   1.42x
       best wgmma / cuDNN            0.57x   0.50x   0.54x   0.50x
     Inside the prediction on every layer (1.17-1.42x against 1.15-1.4x; 7² at its top), short of the
     0.6x target by 5-17%. Fused bias + ReLU on the 128x64 wgmma tile (56²): 186.8 TFLOP/s, 1.059x its
     plain forward (pipe_tc's pair in the same run 1.025x; the prediction of <= 1.05x missed by 1%),
     and 1.16x pipe_tc's fused 160.8. The 128-wide tile wins where both tiles put the same work on the
     busiest SM (28²: 3 rounds each, 7²: 100 blocks of 128x128 vs 200 of 128x64 on 132 SMs), the 64-wide
     where it holds less (14²: 3 blocks of 128x64 vs 2 of 128x128 on the busiest SM; 56²: K = 64).
     The model (pydnn/ops/convolution.py USE_WGM, _wgm_tiling: blocks on the busiest SM x tile flops /
     WGM_TILE_SPEED, 128x128 at 1.1) now takes fwd_wgmma on sm_90 for the forward where channels % 64 ==
     0 and a block has >= 9 K tiles (the measured range; the 1x1 layers' 1-4 K tiles were not measured
     and keep pipe_tc), and picks the faster tile on each of the 4 layers above. Not yet verified on
     the device: the model path itself (its kernels and tiles are the ones the forced tests checked);
     fp16 timed only through the tests (the same instruction rate as bf16). Next: the producer /
     consumer split (a copy warpgroup feeding two MMA warpgroups through mbarriers, setmaxnreg) or TMA
     for B, a persistent tile loop that overlaps the epilogue with the next tile's first stages, and the
     same engine for backward data (stride 1 is the same gather with B as [k][n]: MN-major wgmma B).
  v9 (this session) backward data on the wgmma forward, and two fwd_wgmma variants. Predictions written
     before the device run:
     (a) Stride-1 backward data = the forward of dy with w'[c][tap][k] = w[k][tap][c] taken in the other
     mode, padding (R - 1) * dil - pad (pydnn/ops/convolution.py _plan_bwd_wgmma): filter_kc_swap writes
     w' to the workspace (K * C * 9 * 2 bytes: 74 KB / 295 KB / 1.2 MB / 4.7 MB, read + written at ~2 TB/s:
     0.1-5 us plus a launch), then fwd_wgmma with the forward's model tile. Predicted: the forward's wgmma
     rate less the swap: 56² ~195, 28² ~250, 14² ~270, 7² ~235 TFLOP/s (0.50 / 0.50 / 0.52 / 0.44x cuDNN),
     1.1-1.2x v6's pipe_tc ALGO_1.
     (b) The gathered operand through L1 (cp.async.ca, FLAG_GATHER_L1; v5 tried it on mma.sync at ~120
     TFLOP/s for +0-2%). At v8's rates the K tiles move 24-32 KB per 1-2 MFLOP from L2, 4.0-6.4 TB/s
     over the GPU, near what L2 delivers; consecutive taps re-read 56-99% of the same pixels. Predicted:
     +5-20% if L2 -> SM traffic is the limit, within 3% if not.
     (c) 128x128 with 6 stages (4 tiles in flight instead of 2; 193 KB of shared memory, 1 block/SM):
     +0-10% on 28² and 7² (the 128-wide tile's layers) if the ring's depth is what is exposed.
     Measured, run 1 (H200; its tests first: every wgmma forward / bias test and the new backward-data
     ones, 86 passed; cuDNN this run: fwd 363 / 516 / 506 / 520, bwd data 386 / 498 / 516 / 532):
       (TFLOP/s)                              56²     28²     14²     7²
       fwd, fwd_wgmma (model's tile)         190.0   254.8   258.2   257.2
       bwd data, pipe_tc (v6, best tile)     165.3   221.8   247.7   197.0
       bwd data, swap + fwd_wgmma (model)    180.0   241.6   239.1   220.1   = 0.47 / 0.48 / 0.46 / 0.41x
       fwd, A through L1 (b), model's tile   189.7   256.2   249.9   258.6
       fwd, 128x128 6 stages (c)             115.5   258.3   233.6   256.9   (4 stages: 112.1 / 255.1 / 232.5 / 257.3)
     (a) +9% / +9% / -3.5% / +12% over pipe_tc: below the prediction. Per call the backward data took
     2.2-9.7 us more than the forward's kernel at the same flops (7²: 67.3 against 57.6 us), where the
     swap's bytes at 2 TB/s are 0.1-4.7 us: the first filter_kc_swap moved one 2-byte element per
     thread and load (~1 TB/s on 7²'s 9.4 MB). Rewritten: 64 x 64 tiles, 16-byte loads along c and
     16-byte stores along k, the shared tile XOR-swizzled by k / 8 (the transposed reads conflict-free).
     Predicted: swap ~2-4 us on 7² (~2.5 TB/s), bwd data within 2-6% of the forward: 56² ~185, 28² ~248,
     14² ~250, 7² ~240 TFLOP/s.
     Measured, run 2 (cuDNN: fwd 352 / 513 / 519 / 521, bwd data 388 / 493 / 517 / 480; then the whole
     convolution GPU suite: 797 passed, 12 skipped):
       (TFLOP/s)                              56²     28²     14²     7²
       fwd, fwd_wgmma (model's tile)         198.8   259.6   278.7   259.8   = 0.56 / 0.51 / 0.54 / 0.50x
       bwd data, pipe_tc (v6, best tile)     165.9   222.8   248.2   198.1
       bwd data, swap + fwd_wgmma (model)    189.1   247.0   262.1   240.2   = 0.49 / 0.50 / 0.51 / 0.50x
     Inside the prediction (185 / 248 / 250 / 240): 1.14 / 1.11 / 1.06 / 1.21x pipe_tc, 5-8% under the
     forward kernel at the same flops (the swap and its launch). The model's tile was the faster wgmma
     tile on every layer. Target 0.6x cuDNN missed by 0.09-0.11x: backward data is now bounded by
     fwd_wgmma (0.50-0.56x), which (b) and (c) did not move.
     (b) did not pay (-4% to +1%), (c) neither (-0.2% to +1.3% on its layers): neither the L2 -> SM
     traffic nor the ring's depth is the limit of fwd_wgmma; both reverted (kernel, flag, instantiation).
     What is left, untested: the per-K-tile barrier + proxy fence + wgmma wait<1> serializing the two
     warpgroups with the copies (a producer warp with mbarriers, as gemm_wgmma's next step), and at
     7² / 14² the partial waves (100 / 196 blocks of 128x128 on 132 SMs).
  v10 (fourth session, integrator) the fused bias on fwd_wgmma: v8 / v9 measured the fused bias + ReLU at
     1.057-1.062x the plain forward. Reading: each thread's 16-32 scalar bias loads are issued at the start
     of the register epilogue, one L2 latency (~0.5-1 us) on every block's critical path, ~12 waves of
     blocks at 56². Change (5baa480): threads < BN load their bias element before the K walk (raw 16 bits in
     a register), park it in shared memory after the walk (BN floats past the stages), one barrier; the
     epilogue reads the floats from shared memory. The other kernels' code is unchanged (PTX identical but
     for debug names). Predicted: fused / plain 1.057 -> 1.01-1.03x. Measured (H200, 2c02706 and 442e36b):
     1.047x / 1.048x (the model's tile), 1.052x / 1.051x (the 128x64 tile forced); the fused rate 182-183
     TFLOP/s (was 187 at 1.057x in a run whose plain forward was faster). Under the prediction: the bias was
     ~1% of the gap, not ~5%; the rest is unexplained (next: compare the SASS of the fused and plain
     epilogues, the fused one's activation and the pairs' predicates). The 1.05x target sits within the
     run-to-run noise.
  v11 (fourth session) fwd_wgmma with two wgmma groups in flight (a template parameter Q, run as forced
     tilings beside the model's WGM_TILES; reverted after the run below). Reading: per K tile each warpgroup
     commits tile kt's 4 wgmmas, waits until only that group is pending (wait<1>), then copies tile kt + D,
     waits for its own chunks of tile kt + 1, fences and passes the block barrier before it can queue tile
     kt + 1: the tensor cores hold one group (128x128: ~256 clocks a warpgroup, ~512 for both) while that
     path runs, and any of it beyond one group's run idles them. Timing says that path is long: a 128x128
     block spends ~1.07 us (~2000 clocks) per K tile at 28² against ~512 clocks of MMA, gemm_wgmma's
     128x128 at 2 blocks/SM ~1.26 us a K tile for each of its two blocks; neither L2 traffic (v9 b) nor
     copy depth (v9 c, 6 stages with one group) moved it. With Q = 2 (wait<2>, the refill to the stage of
     tile kt - 3, D = STAGES - 3 copies ahead) tiles kt - 1 and kt are queued, two groups' time for it.
     Variants: 128x128 6 stages 1/SM (D = 3; v9 c's 6-stage tile had D = 4 with one group), 128x64 4
     stages 2/SM (D = 1: one copy ahead, the other block covering), 128x64 6 stages 1/SM (D = 3).
     ptxas (sm_90a): 147 / 82 / 90 registers, no spill, no C7515 (the accumulators are not touched
     between the groups). Predicted before the device run: if the copy / barrier path between the
     groups is the limit, the 128x128 Q = 2 tile +10-25% on 28², 14², 7² (255 -> 280-320 TFLOP/s, 0.55-0.62x
     cuDNN); the 128x64 4-stage Q = 2 tile within +-5% of its Q = 1 twin (one copy ahead exposes about
     as much copy latency as the queue hides); the 128x64 6-stage 1/SM tile at 56² 150-200 (one block per SM
     exposes each block's 2-tile prologue of its 9 K tiles). If the 128x128 Q = 2 tile gains under 3%, the
     serialization is not the limit either, and what is left is the copy issue itself in the MMA warps
     (a producer warp with TMA im2col) and the partial waves.
     Measured (H200, one run at 1361eaf + this change; its tests first: every wgmma forward / bias /
     backward-data test over the 2 + 3 tiles, 172 passed, 12 skipped; cuDNN this run: fwd 353 / 523 / 514 /
     522, bwd data 389 / 492 / 524 / 521 TFLOP/s):
       (TFLOP/s)                                   56²     28²     14²     7²
       fwd, the model's tile (v8, Q = 1)          190.6   256.3   268.9   259.8   = 0.54 / 0.49 / 0.52 / 0.50x
       fwd 128x128 4 st (Q = 1)                   114.9   256.6   235.1   259.5
       fwd 128x128 6 st Q = 2 (D = 3)             117.3   258.2   234.6   257.9   (+2.1 / +0.6 / -0.2 / -0.6%)
       fwd 128x64 4 st 2/SM (Q = 1)               191.4   246.4   269.4   235.1
       fwd 128x64 4 st 2/SM Q = 2 (D = 1)         174.6   230.5   206.0   223.2   (-9 / -6 / -24 / -5%)
       fwd 128x64 6 st 1/SM Q = 2 (D = 3)         150.4   214.0   261.2   226.4
       bwd data, the model's tile                 183.3   244.2   255.3   240.0   = 0.47 / 0.50 / 0.49 / 0.46x
       bwd data 128x128 6 st Q = 2                114.3   246.0   223.4   238.9
       bwd data 128x128 4 st (Q = 1)              111.8   244.9   223.6   240.4
     Outcome: the second group in flight pays nowhere (128x128: -0.6% .. +2%, noise), so the copy / barrier
     path between the groups is not what the tensor cores wait on either; with one copy ahead (D = 1) the
     128x64 tile loses 5-24% (the copy latency is exposed at D = 1 and covered at D = 2, as v9 c's D = 4
     showed no further gain); the 1-block 128x64 loses at 56² as predicted (150). Reverted (template
     parameter, variants, their tests and rows). Target missed as before: 0.49-0.54x forward, 0.46-0.50x
     backward data.
     Read after the run (SASS of the loop, nvdisasm of the NVRTC cubin, sm_90a): the loop of the 128x128
     tile is 255 instructions a thread and K tile: 86 IMAD, 6 branches, the 8 LDGSTS each behind its own
     tap-offset multiply-adds and a branch (NVRTC sinks `v ? A + (aoff + tap) : A`'s arithmetic into a
     branch per chunk); the proxy fence is MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC.S. See v12.
  v12 (fourth session) fwd_wgmma<..., LEAN = true> (pydnn/ops/convolution.py; first as forced
     WGM_VARIANTS beside the model's tiles, since the run below the model's WGM_TILES): the tap
     offsets of A and B computed once per K tile (pinned by an empty asm so that they are not sunk into
     the chunks), each chunk's source selected without a branch (32-bit offset or 0, one 64-bit add), and
     the k16 steps' descriptors as the K tile's + 2 each. SASS of the loop: 128x128 255 -> 178
     instructions (IMAD 86 -> 30, branches 6 -> 2), 128x64 209 -> 164; registers unchanged (147 / 82), no
     spill. Prediction (to be measured): matmul's v4 (its copy test per chunk removed) gained 1.6x on the
     same ring, but there the copies were the larger share; here the loop loses ~30% of its instructions,
     and if per-thread issue / dependency latency in the copy path is what stretches a K tile to ~1 us, the
     LEAN tiles gain +10-25% (28² / 7² 128x128 ~285-320, 56² / 14² 128x64 ~210-330 TFLOP/s, 0.55-0.62x
     cuDNN); within 3% if not, which would leave the proxy fence (MEMBAR.ALL.CTA each K tile, if it
     waits for the in-flight LDGSTS the ring is one deep whatever STAGES says) and TMA as the suspects.
     Measured (H200, the integrator's run of the helper's tree; every wgmma test over the four tilings
     passed: forward, fused epilogues, backward data; cuDNN fwd 345 / 519 / 525 / 512, bwd data 388 / 501
     / 523 / 528 TFLOP/s in the same run):
       (TFLOP/s)                      56²            28²            14²            7²
       fwd 128x64  v8 / lean      191.7 / 209.9  246.4 / 284.4  269.1 / 325.6  234.4 / 280.5
       fwd 128x128 v8 / lean      115.1 / 123.7  256.7 / 323.2  234.5 / 318.9  259.8 / 368.1
       bwd data 128x64 v8 / lean  182.5 / 198.5  235.3 / 269.4  254.9 / 304.9  218.3 / 257.0
       bwd data 128x128 v8 / lean 111.8 / 119.8  244.8 / 304.2  223.8 / 298.9  240.9 / 331.4
     The model's tile (128x64 at 56² / 14², 128x128 at 28² / 7²) is the faster lean tile on every layer:
     forward 209.9 / 323.2 / 325.6 / 368.1 = 0.61 / 0.62 / 0.62 / 0.72x cuDNN (v8's 0.55 / 0.49 / 0.51 /
     0.51x), backward data 198.5 / 304.2 / 304.9 / 331.4 = 0.51 / 0.61 / 0.58 / 0.63x (v8's 0.47 / 0.49 /
     0.49 / 0.46x): +7-42%, above the prediction's top at 28² / 7² (the 128-wide tile's loop lost the most
     instructions). The instruction count of the copy path was the limit the ring depth and the two groups
     in flight (v11) could not move. LEAN is the model's loop since (WGM_TILES); v8's stays as WGM_VARIANTS.
     Still under 0.6x: backward data at 56² (0.51x) and 14² (0.58x).
  v13 (fifth session) fwd_wgmma_persist (ptx/convolution.cu; WGM_PERSIST in pydnn/ops/convolution.py,
     forced tilings first): the LEAN loop as a persistent kernel. Reading (HEAD 6a9e1df, 64->64 @56: 9 K
     tiles a 128x64 block, 1568 blocks = 5.9 rounds of 264 resident blocks, ~71 us against a ~15 us compute
     floor): a block lives ~12 us, ~1.3 us a K tile with its SM twin, and pays on its own critical path the
     ring's fill (2 K tiles of global latency before its first wgmma), the tap_row setup and the epilogue's
     stores; the twin covers part of it. Change: grid = min(tiles, SMs x MINB); block b computes tiles b,
     b + grid, ... (M block fastest: resident blocks cover adjacent rows, x's halos stay in L2); its K
     tiles over all its tiles are one copy stream, D = 2 positions ahead of the MMAs across tile
     boundaries, so the next tile's first K tiles (and its tap_row setup) are in flight while the register
     epilogue stores; the accumulators restart by scale-d 0 on a tile's first k16 step (zeroing them made
     ptxas inject a wgmma wait, C7517); the fused bias read at a tile's first K tile and parked in shared
     memory before the barrier of its last (no extra barrier but for 1-K-tile tiles); the staged epilogue
     (beta, z, non-clamp activations) reuses the stages, so there the copies stop at each tile's end.
     ptxas (sm_90a, bf16): 128x64 4 stages 2/SM 119 registers, 128x128 4 stages 1/SM 200, no spill.
     Predicted before the device run: the fill + epilogue is ~10-15% of a 9-K-tile block's life at 56²:
     forward 56² 209 -> 225-245 TFLOP/s, backward data 200 -> 215-235 (issue 4's 0.6x: ~231); 28² / 14² /
     7² (18-72 K tiles) +0-8%; fused bias + ReLU / plain on the persistent tile <= 1.05x (its epilogue
     overlaps the next tile's copies either way); the 1x1 layers (1 and 4 K tiles a block, where the fill
     and epilogue ARE the block) on the persistent tile 1.2-1.6x implicit_gemm_pipe_tc.
     Measured, run 1 (H200; 158 tests: every wgmma test on the persistent tiles, and new ones with the
     grid capped at 2-3 blocks so that each walks 4-12 tiles: forward plain / beta, the fused epilogues
     over every activation and z kind, backward data; all passed; cuDNN fwd 340 / 458 / 514 / 457):
       persistent 128x64 fwd 195.9 / 268.7 / 247.4 / 274.9 against the LEAN tile's 209.9 / 285.0 / 326.6 /
       280.5; 128x128 113.7 / 290.1 / 272.9 / 310.1 against 123.5 / 325.6 / 319.4 / 367.1 (56² / 28² / 14²
       / 7²): 2-24% SLOWER everywhere, backward data alike, the 1x1 layers unchanged (41-43 and 111-119
       against 42-44 and 113-121), fused / plain 1.035x on the persistent tile. Read after the run (SASS,
       nvdisasm): its copy went through one general path (a tile start test, the stream counters), ptxas
       held 200 registers (the epilogue now inside the tile loop, the loop state live across it) and
       rematerialized parameters and thread offsets in the loop: 213 instructions a K tile against the
       LEAN loop's 179 (128x128). 7² has 100 tiles of 128x128 for 132 SMs, one a block, so there the
       schedule is fwd_wgmma's and the loss (-16%) is the loop alone. Rewritten (run 2): the LEAN copy on
       the per-K-tile path, the next tile set up only in a tile's last D K tiles, the copy's constants in
       locals: 171 / 191 instructions (LEAN 166 / 179; BN 64 / 128).
     Measured, run 2 (158 tests passed; cuDNN fwd 347 / 520 / 514 / 518, bwd data 387 / 490 / 535 / 534):
       (TFLOP/s)                        56²            28²            14²            7²
       fwd 128x64  LEAN / persistent   211.4 / 206.6  285.3 / 284.2  329.2 / 268.4  282.9 / 300.2
       fwd 128x128 LEAN / persistent   125.2 / 119.6  323.8 / 302.0  321.5 / 292.6  371.9 / 342.2
       bwd data 128x64                 199.4 / 194.7  270.1 / 271.0  307.4 / 253.5  260.4 / 274.6
       bwd data 128x128                120.4 / 115.3  304.8 / 288.2  301.8 / 277.2  335.4 / 310.5
       fused / plain on the persistent 128x64 tile 1.052x (the LEAN tile's 1.057x); 1x1 unchanged.
     Outcome: the prediction failed. At 56² (5.9 tiles a block) the persistent tile is 2% under the LEAN
     one with 3% more instructions a K tile: the overlap of the fill and epilogue with the next tile buys
     ~1%, because the SM's second block already covers them (2 blocks / SM). 14² (392 tiles on 264
     blocks) loses 18%: a static tile schedule puts 2 tiles on some blocks and 1 on others, and the
     blocks of 2 need not share SMs evenly (the hardware's block placement); 7² (one tile a block) loses
     8% on the loop's instructions alone. Reverted (kernel, WGM_PERSIST, its tests and rows). What the
     two runs do say: the loop's time follows its instruction count a K tile (as v12 found: +7% SASS
     instructions -> -8% at 7²), so the lever is the copy path's instructions, not the schedule: v14.
  v14 (fifth session) fwd_wgmma<..., LEAN = 2>, the model's tiles (WGM_TILES; v12's LEAN = 1 and v8's
     loop stay as WGM_VARIANTS, forced). SASS of v12's loop (nvdisasm, 128x64): 166 instructions a thread
     and K tile, of which ~25 build the 8 wgmma descriptors from the thread index (ptxas recomputes wg's
     slab offset from SR_TID in every K tile and moves each descriptor into uniform registers), ~15
     recompute the thread's swizzled shared offset, channel bound and B rows from SR_TID, and each chunk's
     64-bit source is a sign extension + 2 selects + LEA / LEA.HI.X. v14: the offsets unsigned (a valid
     chunk's is >= 0, an invalid one's 0: no sign extension, one select), the descriptors' low words of
     stage 0 once (A's through a shuffle, B's uniform) plus the stage's offset, the high word a constant
     (so they stay in the uniform datapath: 4 UIADD3.64 a K tile instead of ~25 instructions), and the
     thread's copy constants (shared offset, channel bound, B base and mask) through a shuffle with its
     own lane, which ptxas does not recompute in the loop. SASS a K tile: 128x64 166 -> 119, 128x128
     179 -> 134 (-28% / -25%); registers and spills (0) as before.
     Predicted before the device run: if the loop stays issue bound as v12 and v13 say, +15-30% on every
     layer: fwd 56² 211 -> 240-270, 28² 324 -> 370-420, 14² 329 -> 375-425, 7² 372 -> 425-480; bwd data
     56² 200 -> 230-260 (issue 4's 0.6x: ~231), the 1x1 layers forced on wgmma +10-25%; fused / plain
     unchanged within noise (~1.05x: the epilogue's share grows as the loop shrinks, so possibly 1.06x).
     Measured, run 1 (H200; every wgmma test over the six tilings passed, 206 + 12 skipped; cuDNN fwd 340 /
     479 / 514 / 526, bwd data 325 / 457 / 531 / 532):
       (TFLOP/s)                        56²            28²            14²            7²
       fwd 128x64  v12 / v14           210.2 / 221.7  284.9 / 300.9  326.5 / 302.8  281.1 / 334.3
       fwd 128x128 v12 / v14           129.3 / 131.3  327.7 / 349.6  323.6 / 358.7  374.4 / 424.1
       bwd data 128x64  v12 / v14      201.1 / 209.9  271.0 / 285.3  305.5 / 284.0  258.5 / 303.3
       bwd data 128x128 v12 / v14      125.0 / 128.0  308.4 / 328.9  303.2 / 334.6  335.8 / 374.0
       1x1 256->64 fwd 128x64 v12 / v14 120.9 / 122.3 (pipe_tc, the model's: 103.9); 64->256 bwd data
       113.7 / 115.6 (pipe_tc 103.8); the 1-K-tile directions 41-45 on every wgmma tile (pipe_tc 53-54)
       fused / plain on the v14 tile 1.055x (v12's 1.055x)
     +4-19% on each layer's best tile, under the prediction's +15-30% (the instruction count fell 25-28%:
     the loop is not issue bound alone), and one anomaly: the 128x64 tile at 14² lost 7% (forward and
     backward data alike) while the 128x128 one gained 11%. Since: WGM_TILE_SPEED of the 128x128 tile
     1.4 (measured 1.16-1.58x per flop at equal work on the busiest SM), so that the model takes it at 14²
     as well: 56² 221.7 / 209.9 (0.65 / 0.65x cuDNN; backward data 0.6x: met), 28² 349.6 / 328.9 (0.73 /
     0.72x), 14² 358.7 / 334.6 (0.70 / 0.63x), 7² 424.1 / 374.0 (0.81 / 0.70x); and WGM_MIN_KTILES 4, so
     the 1x1 layers over 256 channels (4 K tiles) take the 128x64 wgmma tile (+11-18% over pipe_tc), those
     over 64 (1 K tile) keep pipe_tc. Then the fused bias parked without a barrier (v14 only): threads <
     BN store it in K tile ktiles - 2 (the last D K tiles copy nothing, so the branch is off the per-K-tile
     path), the last K tile's barrier publishes it; one-K-tile problems keep the extra barrier. Predicted:
     fused / plain 1.055x -> 1.03-1.045x (the barrier made each block's two warpgroups wait for each other
     before the epilogue); the plain forward unchanged.
     Measured, run 2 (503 tests passed, 12 skipped: every wgmma, fused, tensor-core forward and backward
     data test; cuDNN fwd 341 / 476 / 509 / 523): fused / plain 1.040-1.044x (v12's pair in the same run
     1.054x), but the plain v14 tiles 7-24% SLOWER than in run 1: fwd 205.1 / 295.5 / 282.6 / 323.1,
     bwd data 195.7 / 278.8 / 266.5 / 293.6, the forced v14 128x64 plain 206.8 against v12's 211.3 in the
     same run (run 1: 222.9 against 211.7). The SASS says why: the parking's `t < BN` is a branch that
     diverges inside a warp, so ptxas wrapped the whole K-tile body in a convergence region (BSSY / BSYNC)
     that run 1's loop did not have. Fixed: every thread holds the bias of column t % BN and the
     parking stores it unconditionally (threads t and t + BN write the same value), so the branch is
     uniform (kt == ktiles - 2, has_bias): no BSSY in the loop, 119 / 134 instructions a K tile again.
     Predicted: the plain rows back at run 1's (56² ~221, 28² ~349, 14² ~358, 7² ~424 forward), fused /
     plain ~1.04x.
     Measured, run 3 (503 passed, 12 skipped, the same tests; cuDNN fwd 344 / 470 / 512 / 516):
       (TFLOP/s)                        56²            28²            14²            7²
       fwd 128x64  v12 / v14           217.6 / 209.8  298.9 / 287.3  346.5 / 278.2  304.6 / 294.7
       fwd 128x128 v12 / v14           129.6 / 119.8  345.6 / 292.7  350.9 / 280.4  411.9 / 316.7
       bwd data 128x64  v12 / v14      207.7 / 200.9  283.7 / 272.7  322.4 / 261.8  278.5 / 269.8
       bwd data 128x128 v12 / v14      125.6 / 116.8  324.1 / 277.5  325.9 / 264.1  362.1 / 288.6
       fused / plain: v14 1.047-1.050x, v12 1.058x; 1x1 256->64 fwd (the model's 128x64 v14) 120.8, v12
       121.3; 64->256 bwd data 113.7 / 114.9 (pipe_tc 52.8-53.9 on the 1-K-tile directions, unchanged).
     Prediction failed: v14 stayed 3-25% under v12 with the divergent branch gone. So the BSSY was not
     the cause either, and the v14 loop of run 1 (no parking) and of runs 2-3 have the same SASS on the
     K-tile path (119 / 134 instructions, diffed with nvdisasm; the whole kernels differ by 18 lines: the
     parking). Yet the same binary rows moved between runs: v12 was 5-10% faster in run 3 than in run 1
     (7² 128x128 374 -> 412, 14² 128x64 327 -> 347) while v14 went 424 -> 317, and v8 did not move
     (266 / 265, 194 / 198). Unexplained; the device budget ended here. Decision: the model stays on v12
     (WGM_TILES, LEAN = 1, WGM_TILE_SPEED as before: 128x64 at 56² and 14², 128x128 at 28² and 7²); v14
     (LEAN = 2, with the parking) stays a forced variant (WGM_VARIANTS, bench rows, every wgmma test runs
     it) for a run that repeats v12 / v14 several times in one process. Kept from v14: WGM_MIN_KTILES 4
     (the 1x1 layers over 256 channels on the wgmma 128x64 tile: v12 121 / 115 in run 3, 121 / 114 in
     run 1, against pipe_tc's 104 / 104: +11-17%, 1x1 256->64 forward and 64->256 backward data), the 1x1
     layers over 64 channels (one K tile) stay on pipe_tc (every wgmma tile ~0.8x of it, persistent or
     not). Issue 4 after this session, v12's rows (the model's): bwd data 56² 199-208 TFLOP/s = 0.51-0.64x
     cuDNN depending on cuDNN's run (cuDNN's own 56² backward data read 325-391 across these runs), fused
     bias + ReLU 1.054-1.058x plain (target 1.05x: missed by <1%; v14's barrier-free parking measured
     1.040-1.050x but only on the v14 loop).
     Run 6 (integrator, the same session, HEAD 5c80618, PYDNN_BENCH_CONV_TC=1 PYDNN_BENCH_CONV_WGM=1 three
     times back to back; each row moved < 1% between the three runs): v14 is under v12 on every row,
       fwd 128x64  v12 / v14           217.9 / 209.9  297.4 / 285.5  343.3 / 275.5  303.4 / 292.7
       fwd 128x128 v12 / v14           129.4 / 119.7  342.3 / 290.9  348.7 / 278.4  410.8 / 315.7
       bwd data 128x64  v12 / v14      206.0 / 198.7  282.9 / 271.0  319.6 / 260.1  276.3 / 267.1
       bwd data 128x128 v12 / v14      124.9 / 116.0  322.7 / 275.1  322.8 / 261.4  360.9 / 286.3
     (3-23% slower; run 1's v14 lead did not come back). Fused / plain on v14's 128x64 1.049x against
     v12's 1.060x, but v14's plain is 3% slower, so fused v14 is slower than fused v12 too. Decision: v14
     reverted (fwd_wgmma keeps LEAN as an int: 0 v8's copies, 1 v12's); WGM_MIN_KTILES 4 kept.
  v15 (sixth session, issue 4's fp32 backward filter) BWD_FILTER_ALGO_WINOGRAD_NONFUSED (algo 5,
     pydnn/ops/convolution_winograd.py; the details and per-launch times in tools/bench_convolution_algos.py
     v6). The fp32 rows time v7's pick for each direction; a 3x3 stride-1 fp32 layer whose v7 pick is not
     algo 5 also gets a forced "bwd filter (algo 5, forced)" row. Before: ALGO_0 / ALGO_1 / FFT at 6.7 /
     8.8 / 7.5 / 7.4 TFLOP/s (H200) against cuDNN's 27.6 / 67.8 / 83.2 / 90.6. Predicted (the split
     model): 44 / 78 / 69 / 74 TFLOP/s. Measured (H100 80GB HBM3, two runs on one warm machine, cuDNN in
     the same runs; PYDNN_BENCH_CONV_ONLY = the four fp32 3x3 layers):
       bwd filter (algo 5, v7's pick)  34.7-34.8 / 71.1-71.2 / 72.6-73.0 / 77.2-77.6 TFLOP/s
       cuDNN                           25.2-25.3 / 64.2-64.4 / 80.2-80.3 / 86.4-87.0
       = 1.37-1.38 / 1.10-1.11 / 0.90-0.91 / 0.89x cuDNN: issue 4's 0.8x met on all four (and the H200
       targets 22 / 54 / 67 / 73 TFLOP/s). v7 vs Find, backward filter: 1.00x on all four (algo 5 is v7's
       pick and Find's fastest); forward (WINOGRAD_NONFUSED) and backward data 1.00x as before. Under the
       prediction at 56² (the transforms; see bench_convolution_algos.py v6), within 10% elsewhere.
  v16 (seventh session) fwd_wgmma's fused bias in registers. Reading: v10's bias (one element a thread,
     parked in shared memory after the K walk behind a barrier) left the fused bias + ReLU at 1.047-1.060x
     the plain forward; at 56² a block walks only 9 K tiles, so whatever the epilogue adds is not small
     against a block. Change: each thread loads the BN / 4 biases of its own epilogue columns (WgAccEng's
     col_of) before the K walk, as raw 16 bits in registers (uniform branch: the plain forward skips the
     loads and their address arithmetic), converts them after the walk and hands them to the register
     epilogue; no shared memory, no barrier (the launch drops its + BN floats). ptxas: 78 registers at
     BN = 64 (82 before; the cap at MINB = 2 is 128), 132 at BN = 128, no stack. Predicted fused / plain
     ~1.03-1.04x. Measured (H100 80GB HBM3, one process per build, alternated base / new / base / new on
     one machine, time_pair with 8 rounds, 3 repetitions each; the ResNet 3x3 64->64 @56 layer, bf16 NHWC,
     N = 64, the model's 128x64 tile):
       fused bias + ReLU / plain       base 1.044-1.052x   new 1.027-1.033x
       fused bias + IDENTITY / plain   base 1.057-1.059x   new 1.025-1.034x
       fused ReLU, y elsewhere / plain base 1.050-1.052x   new 1.032-1.033x
       plain / plain (y elsewhere)     0.998-0.999x        0.998-1.000x (the noise floor of the ratio)
       plain forward                   70.8-72.6 us        69.6-71.4 us (+1.5-2.5%)
     The plain forward gained at 56² too, which I first read as the 256 bytes of shared memory no longer
     reserved. Wrong: after v17 and v18 were merged, the whole convolution bench (the model, H100) read
     the bf16 14² forward / backward data at 274 / 276 TFLOP/s = 0.53 / 0.52x cuDNN (0.61 / 0.60x before).
     The SASS said why: the BN / 4 registers live through the K loop changed the loop itself (163
     instructions a K tile against 167; ptxas moved the tap arithmetic to the uniform datapath), on
     every fwd_wgmma instantiation, plain ones included. Then three builds alternated in one process each,
     twice (89d92fb = "base", v16 everywhere = "regs", the split below = "split"), TFLOP/s, the model's
     tiles (128x64 at 56² and 14², 128x128 at 28² and 7²; backward data of base through the swap):
                     56² fwd / bwd     28² fwd / bwd     14² fwd / bwd     7² fwd / bwd      fused / plain
       base          205-206 / 196     314-317 / 294-296 318-319 / 295-296 363 / 324        1.056-1.057x
       regs          209-210 / 211-212 326-332 / 328-334 299-302 / 280-287 392 / 392        1.031-1.034x
       split (FB=0)  205-206 / 206-207 312-324 / 316-325 319-326 / 319-321 361-365 / 366-369 1.015-1.016x
     So the registers help the 128x128 tile (+3-8%) and hurt the 128x64 one at 14² (-6%). Decision
     (4ddd33a): the bias in registers (BREG) is the 128x128 tile's code always, and the 128x64 tile's in
     a separate instantiation, FB = 1, which only the fused call's plans run (convolution.py
     _fused_bias_in_registers); the 128x64 tile's plain forward and backward data keep v10's code (K loop
     SASS identical to 89d92fb's; the 128x128 loops identical to "regs"). The whole bench after it (H100,
     cuDNN in the same run): bf16 3x3 forward 0.67 / 0.69 / 0.61 / 0.75x, backward data 0.62 / 0.71 /
     0.60 / 0.75x, backward filter 0.94 / 0.95 / 0.80 / 0.63x; fused bias + ReLU / plain 1.016x (the
     forced 128x64 tile 1.011x). Issue 4's fused target (<= 1.05x) met; the 14² backward data margin
     over 0.6x is thin (319.7 against cuDNN's 528.6).
  v17 (seventh session, issue 4's bf16 backward data at 56²: 0.59x cuDNN on the H100, 0.62x on an H200)
     Reading: backward data (stride 1, 16-bit, K % 64) ran as filter_kc_swap (grid (1, 1, 9) at 64->64,
     74 KB) + fwd_wgmma on the swapped copy; the GEMM is the forward's (M = N * H * W, N = C, K = taps x
     K), and the forward kernel at 56² runs 0.61-0.65x: the H100 README rows say 216.8 forward against
     205.9 backward data (5%), v14 run 6 (H200) 5.5-6% at 56² / 28², 7% at 14², 12% at 7² (the larger
     filters: 4.7 MB swapped at 7²). So the gap is the swap kernel and the launch boundary before
     fwd_wgmma (its ramp, the swap's tail), ~3-4 us of ~70 us at 56².
     Change: fwd_wgmma<..., BKN = 1> reads B straight from w (KRSC): for backward data B[(tap, k)][c] =
     w[k][tap][c], and 8 consecutive c of one (k, tap) are 16 contiguous bytes, so a thread's cp.async
     chunks fill [64 k rows][64 c] slabs whose 128-byte rows, with the 128B swizzle, sit at the very
     shared offsets of the K-major tile; wgmma reads them MN-major (trans-b = 1, LBO = the 8 KiB slab
     stride, a k16 step 2048 bytes on: as gemm_wgmma's non-transposed B and wgrad_tc_wgmma). The filter
     strides handed to the kernel are (1, w's k stride, w's tap strides), the flip the swap plan's (the
     opposite mode). One launch, no workspace (the query now says 0). SASS (sm_90a, nvdisasm): the
     forward instantiations are unchanged instruction for instruction; the BKN loop is 163 / 180
     instructions a K tile (128x64 / 128x128) against the forward's 167 / 180, registers 82 / 147, no
     spill. filter_kc_swap + the K-major forward stay for filters BKN cannot read (none that the
     tensor-core refusal lets through today: packed NHWC filters with C % 8) and behind WGM_BWD_SWAP,
     which the bench uses for a same-run A/B (time_pair, "swap / direct").
     Predicted before the device run: backward data at the forward kernel's rate (same GEMM, same loop
     length, same shared format; the one unknown the transposed-B wgmma's rate, full for 16-bit types):
     swap / direct 1.04-1.07x at 56², 28², 14², 1.08-1.13x at 7²; H100 56² 206 -> 214-220 TFLOP/s, i.e.
     0.59x -> 0.61-0.63x cuDNN; 28² / 14² +4-7%, 7² +8-13%; forward and backward filter unchanged.
     Measured (H100 80GB HBM3, two device runs at c371b3e / c058818, each with the bench twice: a pass
     with the forced tilings, then PYDNN_BENCH_CONV_VARIANTS=none; cuDNN in the same pass; TFLOP/s):
       bwd data, the model's plan (now BKN)   56²            28²            14²            7²
         run 1 pass 1 / pass 2              205.8 / 205.2  323.1 / 321.9  324.9 / 322.4  377.4 / 373.1
         run 2 pass 1 / pass 2              204.6 / 204.8  320.9 / 320.8  325.8 / 323.6  376.8 / 377.1
         cuDNN, the same four passes        334 321 334 334  475 338 462 488  522 388 535 538  535 329 532 550
         pydnn / cuDNN                      .62 .64 .61 .61  .68 .95 .69 .66  .62 .83 .61 .60  .71 1.14 .71 .69
       time_pair direct / v9 swap (r1 p1)  207.8 / 197.2  320.4 / 298.4  320.9 / 297.6  376.1 / 334.1
         swap / direct, the four passes     1.054 - 1.050  1.074 - 1.080  1.076 - 1.083  1.125 - 1.131
         the swap path / cuDNN: 0.59 / 0.61 / 0.59 / 0.59 at 56², 0.56-0.57 at 14² (cuDNN's 522-538 passes)
       fwd (code unchanged)                 204.5-206.0    316.7-319.7    320.1-323.2    370.0-373.1
         = 0.62-0.65 / 0.68-0.72 / 0.61-0.62 / 0.69-0.70x cuDNN
       bwd filter (untouched)               257.9-263.2    366.0-377.3    336.4-349.9    311.6-315.7
         = 0.85-1.30 / 0.95-1.60 / 0.78-0.92 / 0.63-1.11x cuDNN (cuDNN's own moved 199-308 at 56²)
       fused bias + ReLU / plain 1.051-1.053x (as before)
     (Run 1 pass 1 had a transient of a second or two: cuDNN's 14² forward read 54.7, the 7² forced
     backward-data tiles 74-108 and the 7² backward filter 242.6 TFLOP/s; the same rows in the other three
     passes read 281 / 371 / 236 / 263 and 311.6-315.7, so those are left out of the ranges above.)
     Outcome: swap / direct 1.050-1.054x at 56², 1.074-1.083x at 28² / 14², 1.125-1.131x at 7², steady
     over four passes in two runs: inside the prediction at 56² and 7², above it at 28² / 14² (the
     0.3 / 1.2 MB swaps cost more than their bytes say). Backward data now runs at the forward kernel's rate
     on every layer (205 vs 205, 321 vs 319, 324 vs 322, 376 vs 372), so issue 4's row is met on the H100:
     56² 0.61-0.64x cuDNN in all four passes (the swap path in the same passes 0.59-0.61x); 28² 0.66-0.95x,
     14² 0.60-0.83x (was 0.56-0.57x through the swap in the passes where cuDNN ran at 522-538), 7²
     0.69-1.14x. The absolute prediction (214-220 at 56²) was too high: it assumed the README's 206 for the
     swap path, which ran 197 in these runs. Decision: the direct plan is the model's (no workspace); the
     swap stays for filters BKN cannot read and as WGM_BWD_SWAP for this A/B. What is left at 56² is
     fwd_wgmma's own rate there (0.61-0.65x; 9 K tiles a block, see v13 / v14).
  v18 (issue 4's last fp32 row) the 7x7/2 stem's backward filter: BWD_FILTER_ALGO_3's implicit variant
     (pydnn/ops/convolution_gemm.py v5: one CUDA-core kernel, wgrad_implicit, gathers each block's 147
     columns of x and its dy rows into shared memory with cp.async and runs an 8 x 8-per-thread fp32 FMA
     tile of 64 k x 160 columns over a slot of pixels, then the fixed-order fold of the slots' partials;
     no im2col, no dy pack, no matmul; deterministic). Bytes: x 38.5 MB + dy 205.5 MB once, partials 15 MB
     twice (~0.26 GB, ~0.09 ms: compute-bound); flops 15.1 G useful, 16.4 G of tile work. Before: 12.1
     TFLOP/s = 0.65x cuDNN's 18.6 (im2col 0.35 + pack_rows 0.19 + gemm_simt 0.66 + fold 0.02 ms).
     Predicted (before the device run): ~0.42 ms, ~36 TFLOP/s, ~1.9x. Measured (H100 80GB HBM3, one run
     at 221cdbf, cuDNN 9.19 through torch in the same run; PYDNN_BENCH_CONV_ONLY="@224 fp32"):
       7x7/2 3->64 @224 bwd filter (algo 3)   22.9 TFLOP/s vs cuDNN 18.6 = 1.23x   (target 0.8x: met)
       fwd (algo 2) 18.1 / 20.6 = 0.88x and bwd data (algo 1) 12.2 / 14.5 = 0.85x in the same run (unchanged)
     v7 vs Find 1.00x in all three directions (bwd filter: algo 3 both, 0.670 ms). Short of the prediction
     by 1.6x (the tile at 25.7 TFLOP/s, ~38% of the FMA peak; the notes in convolution_gemm.py v5 say
     where the time likely goes and what was tried).
  PYDNN_BENCH_CONV_TC=1 limits the run to the bf16 3x3 layers with the tensor-core algorithms pinned
  (IMPLICIT_PRECOMP_GEMM, BWD_DATA_ALGO_1, BWD_FILTER_ALGO_1) instead of the heuristic's first choice,
  plus the fused rows (with PYDNN_BENCH_CONV_ONLY: the bf16 layers it names, and the fused rows if it
  names "fused"); PYDNN_BENCH_CONV_VARIANTS=fwd,bwd data,bwd filter (the default) names the
  directions whose forced tilings are timed too; PYDNN_BENCH_CONV_WGM=1 times, for forward and backward
  data, only the wgmma tilings forced (WGM_TILES and WGM_VARIANTS).
  PYDNN_BENCH_CONV_ONLY=<substring>[,...] keeps the layers whose "name dtype"
  contains one of them (e.g. "256->256 @14 fp32"), with their v7-against-Find lines.
  Not on tensor cores yet: backward filter for fp32 / NCHW / groups (CUDA-core ALGO_0 / ALGO_1),
  the 7x7 stem (C = 3 is not a multiple of 8), fp32 (no TF32 path). Backward data of the strided 7x7
  stem is pathological on the CUDA-core gather (0.1 TFLOP/s: dx has 3 channels in a 64-wide tile and
  3/4 of the taps miss the stride).
"""
import os

import torch

import pydnn
from bench import desc, time_ms, time_pair

N = 64
LAYERS = [  # name, C, K, H, R, stride, pad
    ("3x3 64->64 @56", 64, 64, 56, 3, 1, 1),
    ("3x3 128->128 @28", 128, 128, 28, 3, 1, 1),
    ("3x3 256->256 @14", 256, 256, 14, 3, 1, 1),
    ("3x3 512->512 @7", 512, 512, 7, 3, 1, 1),
    ("1x1 256->64 @56", 256, 64, 56, 1, 1, 0),
    ("1x1 64->256 @56", 64, 256, 56, 1, 1, 0),
    ("7x7/2 3->64 @224", 3, 64, 224, 7, 2, 3),
]
PEAK = {"bf16": 990.0, "fp32": 67.0}


def _filter_desc(w, pdt, nhwc):
    d = pydnn.create_filter_descriptor()
    pydnn.set_filter4d_descriptor(d, pdt, pydnn.PYDNN_TENSOR_NHWC if nhwc else pydnn.PYDNN_TENSOR_NCHW,
                                  *w.shape)
    return d


def _layer(b, name, c, k, hw, r, stride, pad, dname):
    tdt, pdt = {"bf16": (torch.bfloat16, pydnn.PYDNN_DATA_BFLOAT16),
                "fp32": (torch.float32, pydnn.PYDNN_DATA_FLOAT)}[dname]
    nhwc = dname == "bf16"
    fmt = torch.channels_last if nhwc else torch.contiguous_format
    x = torch.randn(N, c, hw, hw, device="cuda", dtype=tdt).to(memory_format=fmt)
    w = (torch.randn(k, c, r, r, device="cuda", dtype=tdt) * 0.1).to(memory_format=fmt)
    y = torch.nn.functional.conv2d(x, w, stride=stride, padding=pad)
    y = y.contiguous(memory_format=fmt)
    dy = torch.randn_like(y)
    dx, dw = torch.empty_like(x), torch.empty_like(w)
    xd, yd = desc(x, dtype=pdt), desc(y, dtype=pdt)
    wd = _filter_desc(w, pdt, nhwc)
    conv = pydnn.create_convolution_descriptor()
    pydnn.set_convolution2d_descriptor(conv, pad, pad, stride, stride, 1, 1, pydnn.PYDNN_CROSS_CORRELATION,
                                       pydnn.PYDNN_DATA_FLOAT)
    flops = 2 * N * k * y.shape[2] * y.shape[3] * c * r * r
    h = b.h
    # the heuristic's first choices: forward IMPLICIT_PRECOMP_GEMM (tensor cores) where it applies;
    # backward filter ALGO_1 (split reduction, workspace) for long reductions over few output tiles
    fwd_algo = pydnn.get_convolution_forward_algorithm_v7(h, xd, wd, conv, yd, 1)[0].algo
    dalgo = pydnn.get_convolution_backward_data_algorithm_v7(h, wd, yd, conv, xd, 1)[0].algo
    falgo = pydnn.get_convolution_backward_filter_algorithm_v7(h, xd, yd, conv, wd, 1)[0].algo
    if _tc_only():  # the tensor-core kernels themselves, whatever the heuristic prefers
        fwd_algo = pydnn.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM
        dalgo = pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_1
        falgo = pydnn.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_1
    # one workspace, as large as the largest of the three chosen algorithms asks (Winograd, GEMM, split K)
    need = max(pydnn.get_convolution_forward_workspace_size(h, xd, wd, conv, yd, fwd_algo),
               pydnn.get_convolution_backward_data_workspace_size(h, wd, yd, conv, xd, dalgo),
               pydnn.get_convolution_backward_filter_workspace_size(h, xd, yd, conv, wd, falgo))
    wwino = pydnn.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED   # issue 4's fp32 row, whatever v7 picks
    wino_row = dname == "fp32" and r == 3 and stride == 1 and falgo != wwino and not _tc_only()
    if wino_row:
        need = max(need, pydnn.get_convolution_backward_filter_workspace_size(h, xd, yd, conv, wd, wwino))
    ws = torch.empty(max(need, 1), dtype=torch.uint8, device="cuda")
    wsp = ws.data_ptr()
    xp, wp, yp, dyp, dxp, dwp = (t.data_ptr() for t in (x, w, y, dy, dx, dw))
    cases = [
        (f"fwd (algo {fwd_algo})", lambda: pydnn.convolution_forward(h, 1.0, xd, xp, wd, wp, conv, fwd_algo, wsp, need,
                                                                     0.0, yd, yp),
         lambda: torch.nn.functional.conv2d(x, w, stride=stride, padding=pad)),
        (f"bwd data (algo {dalgo})", lambda: pydnn.convolution_backward_data(h, 1.0, wd, wp, yd, dyp, conv, dalgo, wsp,
                                                                             need, 0.0, xd, dxp),
         lambda: torch.ops.aten.convolution_backward(dy, x, w, None, [stride] * 2, [pad] * 2, [1, 1], False, [0, 0], 1,
                                                     [True, False, False])),
        (f"bwd filter (algo {falgo})", lambda: pydnn.convolution_backward_filter(h, 1.0, xd, xp, yd, dyp, conv, falgo,
                                                                                 wsp, need, 0.0, wd, dwp),
         lambda: torch.ops.aten.convolution_backward(dy, x, w, None, [stride] * 2, [pad] * 2, [1, 1], False, [0, 0], 1,
                                                     [False, True, False])),
    ]
    if wino_row:
        cases.append((f"bwd filter (algo {wwino}, forced)", lambda: pydnn.convolution_backward_filter(
            h, 1.0, xd, xp, yd, dyp, conv, wwino, wsp, need, 0.0, wd, dwp), cases[2][2]))
    ms_torch = {}
    for what, fp, ft in cases:
        reps = 10 if flops > 5e10 else 20
        ms_p = time_ms(fp, reps=reps, warmup=2)
        ms_t = ms_torch[what.split(" (")[0]] = time_ms(ft, reps=reps, warmup=3)
        b.row_flops("conv", f"{name} {what}{_kernel_label(h, what, conv, xd, wd, yd, fwd_algo, dalgo, falgo)}", dname,
                    flops, ms_p, ms_t, "cudnn", peak_tflops=PEAK[dname])
        if _tc_only() and (any(what.startswith(v) for v in os.environ.get("PYDNN_BENCH_CONV_VARIANTS",
                                                                           "fwd,bwd data,bwd filter").split(","))
                           or (_wgm_only() and not what.startswith("bwd filter"))):
            _tc_variants(b, name, what, conv, cases, flops, ms_t, (x, xd, wd, yd, dy, dw))
    if _tc_only():
        _bwd_data_swap_pair(b, name, conv, (xd, wd, yd), (wp, dyp, dxp), cases[1][1], flops, ms_torch["bwd data"],
                            stride, pad)
    if not _tc_only():
        _v7_against_find(h, name, dname, conv, (xd, wd, yd), (xp, wp, yp, dyp, dxp, dwp), (fwd_algo, dalgo, falgo))


def _bwd_data_swap_pair(b, name, conv, descs, ptrs, direct, flops, ms_t, stride, pad):
    """v17: backward data as the model plans it (fwd_wgmma reading B from the filter, BKN) against v9's
    filter_kc_swap + the same fwd_wgmma tile (WGM_BWD_SWAP, on a second convolution descriptor whose
    plan is made while the switch is on), timed in alternating rounds (time_pair); sm_90 wgmma plans only."""
    from pydnn import tuning
    from pydnn.ops.convolution import implicit as CI, plans as CP, problem as CPb, tensor_core as CT

    h = b.h
    xd, wd, yd = descs
    wp, dyp, dxp = ptrs
    dalgo = pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_1
    if h.arch != CT.WGM_ARCH or "fwd_wgmma<" not in CP.new_plan(h, CPb.DIR_BWD_DATA, dalgo, conv, xd, wd, yd).gemm_expr:
        return
    conv2 = pydnn.create_convolution_descriptor()
    pydnn.set_convolution2d_descriptor(conv2, pad, pad, stride, stride, 1, 1, pydnn.PYDNN_CROSS_CORRELATION,
                                       pydnn.PYDNN_DATA_FLOAT)
    tuning.conv.WGM_BWD_SWAP = True
    try:
        need = pydnn.get_convolution_backward_data_workspace_size(h, wd, yd, conv2, xd, dalgo)
        ws = torch.empty(max(need, 1), dtype=torch.uint8, device="cuda")

        def swap():
            pydnn.convolution_backward_data(h, 1.0, wd, wp, yd, dyp, conv2, dalgo, ws.data_ptr(), need, 0.0, xd, dxp)

        swap()  # its plan (the swap) made and cached now
    finally:
        tuning.conv.WGM_BWD_SWAP = False
    assert "filter_kc_swap" in getattr(CP.get_plan(h, CPb.DIR_BWD_DATA, dalgo, conv2, xd, wd, yd), "swap_expr", "")
    ms_d, ms_s = time_pair(direct, swap)
    b.row_flops("conv", f"{name} bwd data [time_pair, direct (BKN); swap / direct {ms_s / ms_d:.3f}x]", "bf16",
                flops, ms_d, ms_t, "cudnn", peak_tflops=PEAK["bf16"])
    b.row_flops("conv", f"{name} bwd data [time_pair, v9 swap + fwd_wgmma]", "bf16", flops, ms_s, ms_t, "cudnn",
                peak_tflops=PEAK["bf16"])


FIND_WORKSPACE = 1 << 30  # what Find may use per algorithm (1 GiB)


def _v7_against_find(h, name, dname, conv, descs, ptrs, picks):
    """Issue 4: v7's first choice must run within 1.2x of the fastest algorithm Find measures. Prints, per
    direction, Find's fastest, the time Find measured for v7's pick, and their ratio."""
    (xd, wd, yd), (xp, wp, yp, dyp, dxp, dwp) = descs, ptrs
    buf = torch.empty(FIND_WORKSPACE, dtype=torch.uint8, device="cuda")
    bp = buf.data_ptr()
    os.environ["PYDNN_CONV_TUNING_CACHE"] = "0"  # time for real in this run
    try:
        found = [
            pydnn.find_convolution_forward_algorithm_ex(h, xd, xp, wd, wp, conv, yd, yp, 8, bp, FIND_WORKSPACE),
            pydnn.find_convolution_backward_data_algorithm_ex(h, wd, wp, yd, dyp, conv, xd, dxp, 6, bp,
                                                              FIND_WORKSPACE),
            pydnn.find_convolution_backward_filter_algorithm_ex(h, xd, xp, yd, dyp, conv, wd, dwp, 7, bp,
                                                                FIND_WORKSPACE),
        ]
    finally:
        del os.environ["PYDNN_CONV_TUNING_CACHE"]
    for what, perfs, pick in zip(("fwd", "bwd data", "bwd filter"), found, picks):
        ok = [p for p in perfs if p.status == pydnn.PYDNN_STATUS_SUCCESS]
        mine = next((p for p in ok if p.algo == pick), None)
        ratio = mine.time / ok[0].time if mine else float("nan")
        verdict = "met" if ratio <= 1.2 else "MISSED"
        print(f"v7 vs Find {name} {what} {dname}: Find's fastest algo {ok[0].algo} {ok[0].time:.3f} ms, "
              f"v7's pick algo {pick} {mine.time if mine else float('nan'):.3f} ms: {ratio:.2f}x (<= 1.2x {verdict})",
              flush=True)


def _kernel_label(h, what, conv, xd, wd, yd, fwd_algo, dalgo, falgo):
    """' [kernel<tile>]' of the plan a row times (the model's choice), for the tensor-core runs."""
    if not _tc_only():
        return ""
    from pydnn import tuning
    from pydnn.ops.convolution import implicit as CI, plans as CP, problem as CPb, tensor_core as CT

    direction, algo = ((CPb.DIR_FWD, fwd_algo) if what.startswith("fwd") else (CPb.DIR_BWD_DATA, dalgo)
                       if what.startswith("bwd data") else (CPb.DIR_BWD_FILTER, falgo))
    expr = CP.new_plan(h, direction, algo, conv, xd, wd, yd).gemm_expr
    head, args = expr[:-1].split("<", 1)
    kernel = head.split("::")[-1]
    label = f" [model: {kernel} {'x'.join(args.split(', ')[2 if kernel.startswith('implicit_gemm_pipe') else 1:])}"
    if direction == CPb.DIR_BWD_FILTER:
        label += f" splits {CP.new_plan(h, direction, algo, conv, xd, wd, yd).splits}"
    return label + "]"


def _tc_variants(b, name, what, conv, cases, flops, ms_t, tensors):
    """The same direction with each forced tiling (pydnn.ops.convolution.TC_FORCE): the data the tiling
    models are fit to. A new descriptor version makes each a new plan."""
    from pydnn import tuning
    from pydnn.ops.convolution import implicit as CI, plans as CP, problem as CPb, tensor_core as CT

    x, xd, wd, yd, dy, dw = tensors
    h = b.h
    if what.startswith("fwd") or what.startswith("bwd data"):
        direction = CPb.DIR_FWD if what.startswith("fwd") else CPb.DIR_BWD_DATA
        fp = cases[0][1] if direction == CPb.DIR_FWD else cases[1][1]
        variants = ([(t, f"v4 fwd_tc/bwd_data_tc tile {t[0]}x{t[1]}") for t in CT.TC_TILES]
                    + [(t, f"v6 pipe_tc {t[0]}x{t[1]} warps {t[2]}x{t[3]} minb {t[4]} db {t[5]}") for t in CT.TCP_TILES])
        if h.arch == CT.WGM_ARCH:  # v8: the wgmma forward (sm_90a units); v9: backward data on it, its variants
            lean = lambda t: t[4] if len(t) == 5 else 0  # noqa: E731
            names = {0: ("v8", ""), 1: ("v12", " lean copies")}
            wgm = [(t, f"{names[lean(t)][0]} wgmma {t[0]}x{t[1]} stages {t[2]} minb {t[3]}{names[lean(t)][1]}")
                   for t in CT.WGM_TILES + CT.WGM_VARIANTS]
            variants = wgm if _wgm_only() else variants + wgm  # PYDNN_BENCH_CONV_WGM=1: the wgmma tiles only
    else:
        direction, fp = CPb.DIR_BWD_FILTER, None
        falgo = pydnn.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_1
        tuning.conv.TC_FORCE.pop(direction, None)
        pl = CP.new_plan(h, direction, falgo, conv, xd, wd, yd)
        sp, alts = pl.splits, set()
        if "wgrad_pipe_tc" in pl.gemm_expr:  # the model's pipelined tile at half and twice its splits, the other tile
            cfg = tuple(int(v) for v in pl.gemm_expr[:-1].split(", ")[1:])
            alts = ({(cfg, max(1, sp // 2)), (cfg, 2 * sp)} | {(c2, sp) for c2 in CT.WGP_TILES if c2 != cfg}) - {(cfg, sp)}
        tuning.conv.WG_PIPE = False   # v4's kernel with its own model's choice
        try:
            po = CP.new_plan(h, direction, falgo, conv, xd, wd, yd)
        finally:
            tuning.conv.WG_PIPE = True
        bm_old = 128 if po.gemm_expr.endswith("128>") else 64
        variants = [((bm_old, po.splits), f"v4 wgrad_tc BM {bm_old} splits {po.splits}")] + [
            ((c2, s2), f"v7 wgrad_pipe_tc {c2[0]}x{c2[1]} warps {c2[2]}x{c2[3]} minb {c2[4]} splits {s2}")
            for c2, s2 in sorted(alts)]
    for tiling, label in variants:
        tuning.conv.TC_FORCE[direction] = tiling
        pydnn.set_convolution_math_type(conv, pydnn.PYDNN_DEFAULT_MATH)  # a new version: a new plan
        try:
            if direction == CPb.DIR_BWD_FILTER:
                need = pydnn.get_convolution_backward_filter_workspace_size(h, xd, yd, conv, wd, falgo)
                ws = torch.empty(max(need, 1), dtype=torch.uint8, device="cuda")
                fp = (lambda ws=ws, need=need: pydnn.convolution_backward_filter(
                    h, 1.0, xd, x.data_ptr(), yd, dy.data_ptr(), conv, falgo, ws.data_ptr(), need, 0.0, wd,
                    dw.data_ptr()))
            ms_p = time_ms(fp, reps=10, warmup=2)
            b.row_flops("conv", f"{name} {what} [{label}]", "bf16", flops, ms_p, ms_t, "cudnn",
                        peak_tflops=PEAK["bf16"])
        finally:
            tuning.conv.TC_FORCE.pop(direction, None)
    pydnn.set_convolution_math_type(conv, pydnn.PYDNN_DEFAULT_MATH)


def _fused(b):
    """Fused conv + bias + ReLU against the plain convolution (target: <= 1.05x its time), bf16 NHWC."""
    x = torch.randn(N, 64, 56, 56, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    w = (torch.randn(64, 64, 3, 3, device="cuda", dtype=torch.bfloat16) * 0.1).to(memory_format=torch.channels_last)
    y = torch.empty_like(x)
    bias = torch.randn(1, 64, 1, 1, device="cuda", dtype=torch.bfloat16)
    pdt = pydnn.PYDNN_DATA_BFLOAT16
    xd, yd, bd = desc(x, dtype=pdt), desc(y, dtype=pdt), desc(bias, dtype=pdt)
    wd = _filter_desc(w, pdt, True)
    conv = pydnn.create_convolution_descriptor()
    pydnn.set_convolution2d_descriptor(conv, 1, 1, 1, 1, 1, 1, pydnn.PYDNN_CROSS_CORRELATION, pydnn.PYDNN_DATA_FLOAT)
    act = pydnn.create_activation_descriptor()
    pydnn.set_activation_descriptor(act, pydnn.PYDNN_ACTIVATION_RELU, pydnn.PYDNN_NOT_PROPAGATE_NAN, 0.0)
    algo = pydnn.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM
    h = b.h
    xp, wp, yp, bp = x.data_ptr(), w.data_ptr(), y.data_ptr(), bias.data_ptr()
    flops = 2 * N * 64 * 56 * 56 * 64 * 9
    # plain and fused timed in alternating rounds (time_pair): their ratio sits near 1.0, where a clock
    # drift between two separately timed blocks decided 2-5% of it
    def plain():
        pydnn.convolution_forward(h, 1.0, xd, xp, wd, wp, conv, algo, 0, 0, 0.0, yd, yp)

    def fused():
        pydnn.convolution_bias_activation_forward(h, 1.0, xd, xp, wd, wp, conv, algo, 0, 0, 0.0, yd, yp, bd, bp, act,
                                                  yd, yp)

    ms_plain, ms_fused = time_pair(plain, fused)
    z = torch.randn_like(x)
    zp = z.data_ptr()
    ms_resid = time_ms(lambda: pydnn.convolution_bias_activation_forward(h, 1.0, xd, xp, wd, wp, conv, algo, 0, 0, 1.0,
                                                                         yd, zp, bd, bp, act, yd, yp))
    ms_torch = time_ms(lambda: torch.relu_(torch.nn.functional.conv2d(x, w, bias.view(-1), padding=1)))
    b.row_flops("conv", "3x3 64->64 @56 fused bias+relu (pydnn fused vs plain: "
                f"{ms_fused / ms_plain:.3f}x)", "bf16", flops, ms_fused, ms_torch, "cudnn conv+bias, relu_",
                peak_tflops=PEAK["bf16"])
    b.row_flops("conv", "3x3 64->64 @56 fused z + bias+relu (pydnn fused vs plain: "
                f"{ms_resid / ms_plain:.3f}x)", "bf16", flops, ms_resid, ms_torch, "cudnn conv+bias, relu_",
                peak_tflops=PEAK["bf16"])
    from pydnn import tuning
    from pydnn.ops.convolution import implicit as CI, plans as CP, problem as CPb, tensor_core as CT
    tuning.conv.TC_STAGED_PLAIN = True   # the plain forward through the staged epilogue as well (a new plan)
    try:
        pydnn.set_convolution_math_type(conv, pydnn.PYDNN_DEFAULT_MATH)
        ms_staged = time_ms(plain)
    finally:
        tuning.conv.TC_STAGED_PLAIN = False
        pydnn.set_convolution_math_type(conv, pydnn.PYDNN_DEFAULT_MATH)
    b.row_flops("conv", "3x3 64->64 @56 plain through the staged epilogue (vs register epilogue: "
                f"{ms_staged / ms_plain:.3f}x)", "bf16", flops, ms_staged, ms_torch, "cudnn conv+bias, relu_",
                peak_tflops=PEAK["bf16"])
    if h.arch == CT.WGM_ARCH:  # v8: the same pair on the wgmma forward (its BN = 64 tile), plain and fused
        tuning.conv.TC_FORCE[CPb.DIR_FWD] = CT.WGM_TILES[0]
        try:
            pydnn.set_convolution_math_type(conv, pydnn.PYDNN_DEFAULT_MATH)
            ms_wp, ms_wf = time_pair(plain, fused)
        finally:
            tuning.conv.TC_FORCE.pop(CPb.DIR_FWD, None)
            pydnn.set_convolution_math_type(conv, pydnn.PYDNN_DEFAULT_MATH)
        b.row_flops("conv", "3x3 64->64 @56 wgmma 128x64 forced plain (vs the model's plain above: "
                    f"{ms_wp / ms_plain:.3f}x)", "bf16", flops, ms_wp, ms_torch, "cudnn conv+bias, relu_",
                    peak_tflops=PEAK["bf16"])
        b.row_flops("conv", "3x3 64->64 @56 wgmma 128x64 forced fused bias+relu (vs its plain: "
                    f"{ms_wf / ms_wp:.3f}x)", "bf16", flops, ms_wf, ms_torch, "cudnn conv+bias, relu_",
                    peak_tflops=PEAK["bf16"])


def _tc_only():
    return os.environ.get("PYDNN_BENCH_CONV_TC", "0") == "1"


def _wgm_only():
    return os.environ.get("PYDNN_BENCH_CONV_WGM", "0") == "1"


def run(b):
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    only = [o for o in os.environ.get("PYDNN_BENCH_CONV_ONLY", "").split(",") if o]
    if _tc_only():  # the bf16 3x3 layers and the fused rows, or the layers (and "fused") ONLY names
        for layer in LAYERS[:4] if not only else LAYERS:
            if not only or any(o in f"{layer[0]} bf16" for o in only):
                _layer(b, *layer, "bf16")
        if not only or "fused" in only:
            _fused(b)
        return
    for dname in ("bf16", "fp32"):
        for layer in LAYERS:
            if not only or any(o in f"{layer[0]} {dname}" for o in only):
                _layer(b, *layer, dname)
    if not only:
        _fused(b)
