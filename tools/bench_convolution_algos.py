"""Convolution algorithms beyond the implicit GEMMs: WINOGRAD_NONFUSED (forward, backward data, backward
filter: run_wgrad) and GEMM
(im2col + GEMM, forward) on the ResNet-50 layer shapes at N = 64, fp32 NCHW (and the 7x7 stem for GEMM),
beside pydnn's IMPLICIT_GEMM / BWD_DATA_ALGO_0 and cuDNN through PyTorch (cudnn.benchmark on, TF32 off).
Selected with PYDNN_BENCH_FAMILIES=convolution_algos (tools/bench.py loads tools/bench_<family>.py).

Flops counted: the direct convolution's 2 * N * K * P * Q * C * R * S for every algorithm (Winograd does
2.25x fewer multiplies; its TFLOP/s are "effective", as cuDNN's are usually reported).

Model (before measuring): F(2x2, 3x3) runs 16 GEMMs with 1/2.25 of the direct multiplies through the same
CUDA-core implicit-GEMM kernel (~7-8 TFLOP/s), plus the transforms, memory-bound: per layer x once,
U (4x x) written and read, M (4x y) written and read, y once, ~0.25 ms on the 56² layer. Predicted
1.5-1.8x IMPLICIT_GEMM on the 3x3 fp32 layers (less on 7², where the K = 512 GEMM is small per
position). GEMM: IMPLICIT_GEMM's own kernel plus the im2col pass (9x x written, read back): slower than
IMPLICIT_GEMM on CUDA cores by the im2col time; it exists for the tensor-core view of odd-channel
16-bit problems and as cuDNN's algorithm.

Measured (H200, cuDNN 9.19 through torch 2.11, fp32 NCHW, N = 64; TFLOP/s as counted above):
  v1 F(2x2, 3x3) only (hand-written transforms):
    forward   Winograd 8.6 / 11.6 / 14.0 / 11.9 TFLOP/s (56², 28², 14², 7²) = 1.16 / 1.50 / 1.78 / 1.50x
              IMPLICIT_GEMM (7.4 / 7.7 / 7.9 / 7.9), 0.21 / 0.15 / 0.21 / 0.39x cuDNN (41 / 76 / 66 / 31)
    bwd data  8.6 / 11.5 / 14.0 / 11.9 = 1.33 / 1.74 / 2.11 / 1.77x ALGO_0; 0.13 / 0.15 / 0.48 / 0.44x cuDNN
    Prediction 1.5-1.8x met on 28² / 14² / 7², missed on 56² (1.16x): the C = K = 64 GEMMs are short
    (4 k-steps of 16 per 64 x 64 tile) and the 4x-expanded U and M dominate there.
    The 1x1 GEMMs run the implicit-GEMM kernel at 12-14 TFLOP/s (vs 7-8 on the 3x3 convolution itself:
    no tap decomposition, no bounds checks in its loads).
  v2 templated transforms, F(4x4, 3x3) added (4x fewer multiplies, 2.25x expansion) and made the default
    (float with < 4 channels per group keeps F(2x2), see convolution_winograd.tile_for):
    forward   F(4x4) 14.2 / 19.3 / 18.1 / 20.0 TFLOP/s = 1.91 / 2.48 / 2.29 / 2.51x IMPLICIT_GEMM,
              0.34 / 0.25 / 0.27 / 0.65x cuDNN; F(2x2) unchanged (8.6 / 11.6 / 14.1 / 11.9)
    bwd data  F(4x4) 14.2 / 19.3 / 18.1 / 19.9 = 2.19 / 2.91 / 2.70 / 2.96x ALGO_0, 0.22 / 0.24 / 0.62 /
              0.74x cuDNN
    v7 ranks WINOGRAD_NONFUSED first on all four fp32 3x3 layers (it is the fastest pydnn algorithm there).
    NOTE: the v2 kernels' results were not checked on the GPU in this run (the test module failed to
    import through another file); they were checked on the host instead (the kernel source compiled as
    C++, test_winograd_kernels_on_the_host: F(4x4) float errors <= 0.35x of float's tolerance), and
    tests/ops/convolution/test_convolution_algos_gpu.py covers both tiles on the GPU.
  GEMM (im2col + implicit GEMM on CUDA cores): 5.1 / 6.4 / 7.3 / 7.7 TFLOP/s = 0.68 / 0.83 / 0.92 /
    0.97x IMPLICIT_GEMM on the 3x3 layers, 3.7 (0.66x) on the 7x7/2 stem: the im2col pass costs what
    the cleaner 1x1 GEMM saves. As predicted, slower on CUDA cores; v7 ranks it below IMPLICIT_GEMM.
  v3 (issue 4, fifth session): the P GEMMs as one batched launch of matmul's rewritten gemm_simt (float
    accumulation; convolution_winograd.gemm_view: NCHW C_z = V_z . U_z, m = K, n = tiles, k = C, V read
    row-major and transposed into shared memory by the kernel; NHWC C_z = U_z . V_z^T with the batches
    side by side in M's rows) instead of the implicit GEMM's grouped 1x1 convolution (~7.8 TFLOP/s).
    Per-launch rows (run_wino) time the filter / input transforms, the GEMM and the output transform alone.
    Before (v2): 28² forward 0.77 ms = 19.3 TFLOP/s effective, of which the GEMM (3.7 GFLOP at ~7.8) is
    ~0.47 ms and the transforms ~0.3 ms (their floor, ~167 MB through HBM, is ~55 us).
    Prediction (before measuring): the GEMM at 30-38 TFLOP/s (~0.1-0.12 ms on 28²); the transforms
    unchanged (~0.3 ms), so forward 28² ~0.4 ms = ~37 TFLOP/s effective (~0.5x cuDNN), the transforms now
    the larger part on every layer: the next thing to fix.
    Measured (H200, first device run of the session, run_wino; all Winograd GPU tests passed, every dtype):
      forward   57.1 / 74.1 / 72.5 / 68.1 TFLOP/s effective (56², 28², 14², 7²) = 1.38 / 0.96 / 1.09 /
                2.22x cuDNN (41.4 / 77.4 / 66.5 / 30.7); v2: 14.2 / 19.3 / 18.1 / 20.0 (3.7-4.0x faster)
      bwd data  56.7 / 73.5 / 71.7 / 66.5 = 0.88 / 0.92 / 2.45 / 2.46x cuDNN (64.2 / 80.0 / 29.3 / 27.0)
      launches alone (ms; forward): filter / input / GEMM / output
        56²  0.0045 / 0.0543 / 0.1182 (31.3 TFLOP/s, 64x128 tile) / 0.0849   sum 0.262, whole 0.259
        28²  0.0042 / 0.0302 / 0.1140 (32.5, 128x128)             / 0.0531   sum 0.202, whole 0.200
        14²  0.0046 / 0.0191 / 0.1453 (33.2)                      / 0.0332   sum 0.202, whole 0.204
        7²   0.0138 / 0.0122 / 0.1669 (29.0)                      / 0.0209   sum 0.214, whole 0.217
    Outcome: far above the prediction: the transforms were never ~0.3 ms (they move their bytes at 3.1-3.9
    TB/s, 75-93% of the 4.19 TB/s copy, on 56² to 14²), so v2's time was almost all the implicit GEMM
    (~0.6 ms on 28², ~6 TFLOP/s at these shapes). Issue 4's 0.8x cuDNN is met on all four layers in both
    directions. The GEMM is now 45-78% of each layer's time: the next gain is there (gemm_simt at 29-33
    TFLOP/s on these shapes vs 42.6 on 4096^3; the 56² output transform, 0.085 ms for 231 MB, ~2.7 TB/s, is
    the slowest transform). The v7 model (convolution_winograd GEMM_TFLOPS / TRANSFORM_GBPS) was refitted on
    these rows: 0.29 / 0.21 / 0.23 / 0.24 ms against 0.26 / 0.20 / 0.20 / 0.22 measured; v7 ranks
    WINOGRAD_NONFUSED first in both directions on all four (as before; cuDNN's rows above are faster only
    at 28² / 56² bwd data).
  v4 the output transform stores each row's 4 outputs as one 16-byte store where they are contiguous and
    aligned (NCHW y, width a multiple of 4), instead of 4 scalar stores 16 bytes apart across the warp; and
    matmul's persistent gemm_simt candidates (one wave of blocks, each block's K loop running on into its
    next tile: only its first tile waits for global loads), forced in the "with SimtTile(..., persistent)"
    lines. Prediction (before measuring): 56² output transform 0.085 -> ~0.055 ms (the input transform's
    3.1 TB/s), 28² 0.053 -> ~0.04, 14² / 7² little change; persistent GEMM +5-15% on 28² / 14² (the
    exposed first loads of 1-block-per-SM tiles), ~0 on 56² (3 blocks per SM already overlap).
    Measured (second device run; all Winograd GPU tests passed):
      forward   61.4 / 82.1 / 76.2 / 68.6 TFLOP/s = 1.48 / 1.06 / 1.15 / 2.24x cuDNN
      bwd data  61.1 / 81.6 / 75.5 / 66.9 = 0.94 / 1.02 / 2.58 / 2.48x cuDNN
      output transform 56² 0.0849 -> 0.0635 ms, 28² 0.0531 -> 0.0349, 14² 0.0332 -> 0.0251, 7² 0.0209 ->
      0.0223; persistent GEMM: 56² 0.1212 -> 0.1184, 28² 0.1137 -> 0.1093, 14² 0.1441 -> 0.1415, 7²
      0.1641 -> 0.1628 ms (whole forward -1 .. -2.4%).
    Outcome: the 16-byte stores as predicted on 56² (0.064 vs ~0.055) and better on 28² (0.035 vs ~0.04);
    the persistent GEMM +1-4% (below the prediction; adopted in matmul, see tools/bench_matmul.py f32 v3).
    28² forward now 1.06x cuDNN, backward data 1.02x. The v7 model was refitted again
    (convolution_winograd.py: the transforms' own traffic at 3 TB/s plus a launch each, the GEMM at 36
    TFLOP/s per busy SM): 0.227 / 0.174 / 0.188 / 0.198 ms for the four layers.
  v5 matmul's chooser gives the 14² / 7² GEMMs the 64x128 tile (measured 13-16% faster than the 128x128 on
    their shapes in the v4 run). Prediction: 14² forward 0.194 -> ~0.177 ms, 7² 0.216 -> ~0.19.
    Measured (third device run; all Winograd GPU tests passed; H200, cuDNN 9.19, fp32 NCHW, N = 64):
      forward   62.1 / 84.3 / 83.3 / 76.1 TFLOP/s = 1.50 / 1.09 / 1.25 / 2.49x cuDNN (41.4 / 77.5 / 66.5 / 30.6)
      bwd data  61.7 / 83.4 / 82.4 / 74.3 = 0.95 / 1.05 / 2.81 / 2.76x cuDNN (64.6 / 79.5 / 29.3 / 27.0)
      forward launches (ms): filter / input / GEMM / output
        56²  0.0059 / 0.0544 / 0.1186 (31.2 TFLOP/s, 64x128) / 0.0636   whole 0.238 (v7 model 0.227)
        28²  0.0042 / 0.0301 / 0.1092 (33.9, 128x128)        / 0.0350   whole 0.176 (model 0.174)
        14²  0.0056 / 0.0192 / 0.1269 (38.1, 64x128)         / 0.0252   whole 0.178 (model 0.188)
        7²   0.0138 / 0.0120 / 0.1419 (34.1, 64x128)         / 0.0228   whole 0.194 (model 0.198)
    Outcome: 14² 0.194 -> 0.178 ms, 7² 0.216 -> 0.194 (as predicted). Against v2 (start of the session):
    forward 14.2 / 19.3 / 18.1 / 20.0 -> 62.1 / 84.3 / 83.3 / 76.1 TFLOP/s (3.8-4.6x), backward data
    likewise; issue 4's >= 0.8x cuDNN met on all four layers in both directions (lowest: 56² backward
    data, 0.95x). v7 ranks WINOGRAD_NONFUSED first for fp32 forward and backward data on all four.
    Where the time is now: the GEMM is 50-73% of each layer (31-38 TFLOP/s, ~half the FMA peak); then
    the 56² transforms (U and M are 2.25x x and y: 0.12 ms at 2.7 TB/s of their own traffic). Next: a
    faster gemm_simt (see tools/bench_matmul.py), the input transform fused into the GEMM's B loads.
  v6 (issue 4, sixth session) backward filter BWD_FILTER_ALGO_WINOGRAD_NONFUSED, F(4x4) (run_wgrad; the
    fp32 rows of tools/bench_convolution.py time it as v7's pick): U = B^T x B (the forward's input
    transform), D = A dy A^T (grad_transform), 36 x S GEMMs M[s][b] (kg x cg) = D^T U over chunk s of the
    T tiles as one gemm_simt launch, filter_grad adds the S partials in order and applies G^T . G.
    Before: ALGO_0 / ALGO_1 / FFT at 6.7 / 8.8 / 7.5 / 7.4 TFLOP/s against cuDNN's 27.6 / 67.8 / 83.2 /
    90.6 (issue 4's 0.8x: 22 / 54 / 67 / 73).
    Prediction (before measuring; the split model, WGRAD_K_OVERHEAD 32, GEMM at 36 TFLOP/s a busy SM,
    transforms at 3 TB/s): S = 11 / 7 / 4 / 1 (56², 28², 14², 7²), chunks of 1141 / 448 / 256 / 256
    tiles; GEMM 0.21 / 0.12 / 0.16 / 0.16 ms (56²: 64 x 64 outputs per position in 64 x 128 tiles, half
    of each idle), transforms' traffic 341 / 184 / 141 / 98 MB; whole 0.34 / 0.19 / 0.21 / 0.20 ms =
    44 / 78 / 69 / 74 TFLOP/s effective (1.6 / 1.15 / 0.83 / 0.82x cuDNN): 56² and 28² clear the target,
    14² and 7² at its edge (the 7² tiles cover 8 x 8 for 7 x 7 outputs: 1.31x the GEMM work).
    Measured, run 1 (H100 80GB HBM3, copy 2976 GB/s, cuDNN 9.19 in the same run; 9015957; its GPU tests, 90,
    all passed):
      whole (ms / TFLOP/s)  0.426 / 34.7   0.208 / 71.0   0.203 / 73.1   0.190 / 77.7
      cuDNN                 0.585 / 25.3   0.230 / 64.4   0.184 / 80.5   0.170 / 86.9
      = 1.37 / 1.10 / 0.91 / 0.89x cuDNN (issue 4's 0.8x: met on all four; the H200 targets 22 / 54 / 67 /
      73 TFLOP/s met too); v7 picks it and Find's fastest is it on all four (1.00x).
      launches alone (ms): x transform / dy transform / GEMM (TFLOP/s of its own flops, model ms) / filter_grad
        56²  0.1058 / 0.0986 / 0.2016 (18.4: half of each 64 x 128 tile idle, model 0.211) / 0.0178
        28²  0.0369 / 0.0361 / 0.1124 (32.9, 128 x 128, model 0.115)                        / 0.0129
        14²  0.0236 / 0.0222 / 0.1331 (36.3, 64 x 128, model 0.156)                         / 0.0196
        7²   0.0121 / 0.0099 / 0.1342 (36.0, model 0.156)                                   / 0.0319
      forced: the other layout 1.02 / 0.99 / 0.97 / 1.02x the model's plan (a tie), S / 2 0.82 / 0.87 /
      0.97 / -, 2 S 0.91 / 0.85 / 0.87 / 0.88x: the model's S was the fastest tried on every layer but
      14² (S 2, within 3%). Prediction: GEMMs as modelled (within 3% at 56² / 28², 14-16% pessimistic at
      14² / 7²); the transforms missed: 56²'s x / dy transforms move their 167 MB each at 1.6 TB/s (the
      forward's input transform ran ~3 TB/s on the H200), so 56² ran 0.43 ms against the 0.34 predicted.
      SASS (nvdisasm): input_transform<float, 4> calls the 64-bit division subroutine 5 times a thread
      (split_index, tile_coords, the chunk's tile_offset). Then (v6 b, predictions before the run):
      those divisions in 32 bits where the operands fit (all four layers; the forward's transforms
      too), filter_grad in 64-thread blocks when it has few threads (56²: 4096 threads in 16 blocks).
      Predicted: 56² x / dy transforms 0.10 -> ~0.07 ms each, filter_grad 0.018 -> ~0.01, whole 0.43 ->
      ~0.36 ms (~41 TFLOP/s); 28² ~0.19; 14² / 7² within 5%; the forward's input / output transforms
      (run_wino) faster by a similar share.
    Measured, run 2 (the same H100, warm, 1a11fd8; the GPU tests first: the backward-filter file and every
    Winograd forward / backward-data test, all passed): no change. 56² x / dy transforms 0.1056 / 0.0980
    ms, whole 0.426 (34.7 TFLOP/s), 28² 0.208 (71.2), 14² 0.204 (72.4), 7² 0.191 (77.4); filter_grad
    56² 0.0168 (-6%). Prediction failed: the divisions were not the limit (kept: they cost nothing and
    leave the 64-bit path for > 2^32 indices). What the run does show: the forward's input transform,
    the SAME kernel, wrote 56²'s same 167 MB in 0.068 ms (2.45 TB/s), and the backward filter's x
    transform at 28² / 14² / 7² (448- / 256-tile chunks) runs at the forward's rate too; only 56²'s
    1141-tile chunks are slow: rows of U and D 4564 bytes long, off 128-byte alignment in every channel
    but the first. Then (v6 c, NOT measured: the session's device calls were spent) chunks rounded up to
    32 tiles from 256 on (convolution_winograd._wgrad_chunk; 56²: 1152 tiles, S 11; the other three
    layers' plans unchanged). Predicted: 56² x / dy transforms ~0.07 ms each, whole ~0.36 ms (~41
    TFLOP/s); the GEMM unchanged (0.20 ms: 64 x 64 outputs a position in 64 x 128 tiles, half of each
    idle, is its bound at ~18 TFLOP/s useful).
Next: a register-blocked batched GEMM (or the tensor-core kernels with TF32 / 16-bit transforms) for
the per-position products, and the input transform fused into the GEMM's A loads (WINOGRAD, fused).
"""
import torch

import pydnn
from bench import desc, time_ms
from pydnn.ops.convolution import winograd as Wg

N = 64
LAYERS = [  # name, C, K, H, R, stride, pad
    ("3x3 64->64 @56", 64, 64, 56, 3, 1, 1),
    ("3x3 128->128 @28", 128, 128, 28, 3, 1, 1),
    ("3x3 256->256 @14", 256, 256, 14, 3, 1, 1),
    ("3x3 512->512 @7", 512, 512, 7, 3, 1, 1),
    ("7x7/2 3->64 @224", 3, 64, 224, 7, 2, 3),
]
PEAK = 67.0  # fp32 FMA TFLOP/s
IG = pydnn.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM
GEMM = pydnn.PYDNN_CONVOLUTION_FWD_ALGO_GEMM
WINO = pydnn.PYDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED
BD0 = pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_0
BWINO = pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED


def _f32_problem(n, c, k, hw, r, stride, pad, wscale):
    """An fp32 NCHW layer: torch tensors x, w, y (the reference forward), dy, dx, their pydnn descriptors
    xd, yd, wd, conv, the direct convolution's flops, and the data pointers (x, w, y, dy, dx)."""
    pdt = pydnn.PYDNN_DATA_FLOAT
    x = torch.randn(n, c, hw, hw, device="cuda")
    w = torch.randn(k, c, r, r, device="cuda") * wscale
    y = torch.nn.functional.conv2d(x, w, stride=stride, padding=pad)
    dy, dx = torch.randn_like(y), torch.empty_like(x)
    xd, yd = desc(x, dtype=pdt), desc(y, dtype=pdt)
    wd = pydnn.create_filter_descriptor()
    pydnn.set_filter4d_descriptor(wd, pdt, pydnn.PYDNN_TENSOR_NCHW, *w.shape)
    conv = pydnn.create_convolution_descriptor()
    pydnn.set_convolution2d_descriptor(conv, pad, pad, stride, stride, 1, 1, pydnn.PYDNN_CROSS_CORRELATION, pdt)
    flops = 2 * n * k * y.shape[2] * y.shape[3] * c * r * r
    ptrs = tuple(t.data_ptr() for t in (x, w, y, dy, dx))
    return x, w, y, dy, dx, xd, yd, wd, conv, flops, ptrs


def _layer(b, name, c, k, hw, r, stride, pad):
    x, w, y, dy, dx, xd, yd, wd, conv, flops, (xp, wp, yp, dyp, dxp) = _f32_problem(N, c, k, hw, r, stride, pad, 0.1)
    h = b.h
    reps = 10 if flops > 5e10 else 20
    winograd = r == 3 and stride == 1

    def fwd(algo, tile=None):
        _tile(h, tile)
        need = pydnn.get_convolution_forward_workspace_size(h, xd, wd, conv, yd, algo)
        ws = torch.empty(max(need, 1), dtype=torch.uint8, device="cuda")
        return time_ms(lambda: pydnn.convolution_forward(h, 1.0, xd, xp, wd, wp, conv, algo, ws.data_ptr(), need, 0.0,
                                                         yd, yp), reps=reps, warmup=2)

    def bwd(algo, tile=None):
        _tile(h, tile)
        need = pydnn.get_convolution_backward_data_workspace_size(h, wd, yd, conv, xd, algo)
        ws = torch.empty(max(need, 1), dtype=torch.uint8, device="cuda")
        return time_ms(lambda: pydnn.convolution_backward_data(h, 1.0, wd, wp, yd, dyp, conv, algo, ws.data_ptr(), need,
                                                               0.0, xd, dxp), reps=reps, warmup=2)

    t_fwd = time_ms(lambda: torch.nn.functional.conv2d(x, w, stride=stride, padding=pad), reps=reps, warmup=3)
    ig = fwd(IG)
    b.row_flops("conv_algos", f"{name} fwd IMPLICIT_GEMM", "fp32", flops, ig, t_fwd, "cudnn", peak_tflops=PEAK)
    runs = [(GEMM, "GEMM", None)] + ([(WINO, f"WINOGRAD_NONFUSED F({m}x{m})", m) for m in Wg.TILES] if winograd else [])
    for algo, label, tile in runs:
        ms = fwd(algo, tile)
        b.row_flops("conv_algos", f"{name} fwd {label} ({ig / ms:.2f}x IMPLICIT_GEMM)", "fp32", flops, ms, t_fwd,
                    "cudnn", peak_tflops=PEAK)
    if winograd:
        t_bwd = time_ms(lambda: torch.ops.aten.convolution_backward(dy, x, w, None, [stride] * 2, [pad] * 2, [1, 1],
                                                                    False, [0, 0], 1, [True, False, False]),
                        reps=reps, warmup=3)
        a0 = bwd(BD0)
        b.row_flops("conv_algos", f"{name} bwd data ALGO_0", "fp32", flops, a0, t_bwd, "cudnn", peak_tflops=PEAK)
        for m in Wg.TILES:
            wg = bwd(BWINO, m)
            b.row_flops("conv_algos", f"{name} bwd data WINOGRAD_NONFUSED F({m}x{m}) ({a0 / wg:.2f}x ALGO_0)", "fp32",
                        flops, wg, t_bwd, "cudnn", peak_tflops=PEAK)
        _tile(h, None)
        v7 = pydnn.get_convolution_forward_algorithm_v7(h, xd, wd, conv, yd, 1)[0].algo
        print(f"conv_algos {name}: v7 forward first choice {v7}", flush=True)


def run_wino(b):
    """WINOGRAD_NONFUSED F(4x4) only (PYDNN_BENCH_FAMILIES=convolution_algos.run_wino): per 3x3 layer the
    forward and backward data against cuDNN, then each of the forward plan's four launches timed alone
    (filter transform, input transform, the batched GEMM, output transform), and the v7 model's estimate."""
    from pydnn import tuning
    from pydnn.ops.convolution import implicit as CI, plans as CP, problem as CPb, tensor_core as CT
    from pydnn.ops.convolution import algorithms as CA
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    h = b.h
    _tile(h, None)
    for name, c, k, hw, r, stride, pad in LAYERS[:4]:   # the 3x3 stride-1 layers
        x, w, y, dy, dx, xd, yd, wd, conv, flops, (xp, wp, yp, dyp, dxp) = _f32_problem(N, c, k, hw, r, 1, pad, 0.1)
        need = max(pydnn.get_convolution_forward_workspace_size(h, xd, wd, conv, yd, WINO),
                   pydnn.get_convolution_backward_data_workspace_size(h, wd, yd, conv, xd, BWINO))
        ws = torch.empty(need, dtype=torch.uint8, device="cuda")
        wsp = ws.data_ptr()
        t_fwd = time_ms(lambda: torch.nn.functional.conv2d(x, w, padding=pad), warmup=3)
        ms = time_ms(lambda: pydnn.convolution_forward(h, 1.0, xd, xp, wd, wp, conv, WINO, wsp, need, 0.0, yd, yp))
        ref_y = torch.nn.functional.conv2d(x, w, padding=pad)
        torch.cuda.synchronize()
        err = float((y - ref_y).abs().max() / ref_y.abs().max())
        b.row_flops("conv_algos", f"{name} fwd WINOGRAD F(4x4) (max rel diff {err:.1e})", "fp32", flops, ms, t_fwd,
                    "cudnn", peak_tflops=PEAK)
        t_bwd = time_ms(lambda: torch.ops.aten.convolution_backward(dy, x, w, None, [1, 1], [pad] * 2, [1, 1], False,
                                                                    [0, 0], 1, [True, False, False]), warmup=3)
        ms_b = time_ms(lambda: pydnn.convolution_backward_data(h, 1.0, wd, wp, yd, dyp, conv, BWINO, wsp, need, 0.0,
                                                               xd, dxp))
        b.row_flops("conv_algos", f"{name} bwd data WINOGRAD F(4x4)", "fp32", flops, ms_b, t_bwd, "cudnn",
                    peak_tflops=PEAK)
        pl = CP.new_plan(h, CPb.DIR_FWD, WINO, conv, xd, wd, yd)
        pl.launch(h, xp, wp, yp, wsp, 1.0, 0.0)  # sets the pointers the steps read
        steps = [("filter", lambda: pl.run_step(h, 0)), ("input", lambda: pl.run_step(h, 1)),
                 ("gemm", lambda: pl.run_gemm(h)), ("output", lambda: pl.run_step(h, 2))]
        parts = [(lbl, time_ms(fn)) for lbl, fn in steps]
        gemm_tf = pl.gemm_flops / (parts[2][1] * 1e9)
        est = CA._estimate_ms(h, pl)
        print(f"conv_algos {name} fwd F(4x4) steps (ms): " + ", ".join(f"{lbl} {t:.4f}" for lbl, t in parts) +
              f"; sum {sum(t for _, t in parts):.4f} vs whole {ms:.4f}; gemm {gemm_tf:.1f} TFLOP/s "
              f"({pl.mm.describe()[0] if pl.mm else 'implicit'}); v7 estimate {est:.4f} ms; cudnn fwd {t_fwd:.4f}",
              flush=True)
        _persistent_gemm(h, name, pl, conv, xd, wd, yd, (xp, wp, yp, wsp), ms)
        v7 = pydnn.get_convolution_forward_algorithm_v7(h, xd, wd, conv, yd, 1)[0].algo
        v7b = pydnn.get_convolution_backward_data_algorithm_v7(h, wd, yd, conv, xd, 1)[0].algo
        print(f"conv_algos {name}: v7 first choice forward {v7}, backward data {v7b}", flush=True)


WWINO = pydnn.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED


def run_wgrad(b):
    """BWD_FILTER_ALGO_WINOGRAD_NONFUSED (PYDNN_BENCH_FAMILIES=convolution_algos.run_wgrad): per 3x3 layer
    the model's plan against cuDNN's backward filter, its four launches timed alone (x transform, dy
    transform, the batched GEMM, filter_grad), the v7 estimate, and the forced alternatives the split model
    and the layout choice are judged by (S / 2, 2 S, the other workspace layout)."""
    from pydnn import tuning
    from pydnn.ops.convolution import implicit as CI, plans as CP, problem as CPb, tensor_core as CT
    from pydnn.ops.convolution import algorithms as CA
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    h = b.h
    for name, c, k, hw, r, stride, pad in LAYERS[:4]:
        x, w, y, dy, dx, xd, yd, wd, conv, flops, (xp, wp, yp, dyp, dxp) = _f32_problem(N, c, k, hw, r, 1, pad, 0.1)
        dw = torch.empty_like(w)
        t_cudnn = time_ms(lambda: torch.ops.aten.convolution_backward(dy, x, w, None, [1, 1], [pad] * 2, [1, 1], False,
                                                                      [0, 0], 1, [False, True, False]), warmup=3)

        def plan(layout=None, splits=None):
            tuning.conv_winograd.WGRAD_LAYOUT, tuning.conv_winograd.WGRAD_FORCE_SPLITS = layout, splits
            h.prepared.clear()
            try:
                return CP.new_plan(h, CPb.DIR_BWD_FILTER, WWINO, conv, xd, wd, yd)
            finally:
                tuning.conv_winograd.WGRAD_LAYOUT = tuning.conv_winograd.WGRAD_FORCE_SPLITS = None

        pl = plan()
        ws = torch.empty(max(pl.workspace, 1), dtype=torch.uint8, device="cuda")
        wsp = ws.data_ptr()
        ms = time_ms(lambda: pydnn.convolution_backward_filter(h, 1.0, xd, xp, yd, dyp, conv, WWINO, wsp,
                                                               pl.workspace, 0.0, wd, dw.data_ptr()))
        ref_dw = torch.ops.aten.convolution_backward(dy, x, w, None, [1, 1], [pad] * 2, [1, 1], False, [0, 0], 1,
                                                     [False, True, False])[1]
        torch.cuda.synchronize()
        err = float((dw - ref_dw).abs().max() / ref_dw.abs().max())
        b.row_flops("conv_algos", f"{name} bwd filter WINOGRAD F(4x4) S {pl.splits} {pl.layout} (max rel diff "
                    f"{err:.1e})", "fp32", flops, ms, t_cudnn, "cudnn", peak_tflops=PEAK)
        pl.launch(h, dyp, xp, dw.data_ptr(), wsp, 1.0, 0.0)  # sets the pointers the steps read
        u, d, m = (wsp + o for o in pl.offsets)
        parts = [("x", time_ms(lambda: pl.run_step(h, 0))), ("dy", time_ms(lambda: pl.run_step(h, 1))),
                 ("gemm", time_ms(lambda: pl.mm.launch(h, d, u, m))), ("filter", time_ms(lambda: pl.run_step(h, 2)))]
        print(f"conv_algos {name} bwd filter F(4x4) steps (ms): " + ", ".join(f"{lbl} {t:.4f}" for lbl, t in parts)
              + f"; sum {sum(t for _, t in parts):.4f} vs whole {ms:.4f}; gemm {pl.gemm_flops / (parts[2][1] * 1e9):.1f}"
              f" TFLOP/s ({pl.mm.describe()[0].split('<')[1][:-1]}, model {pl.gemm_ms:.4f}); v7 estimate "
              f"{CA._estimate_ms(h, pl):.4f} ms; cudnn {t_cudnn:.4f}", flush=True)
        other = "chan" if pl.layout == "tile" else "tile"
        for layout, splits in ((other, pl.splits), (pl.layout, max(1, pl.splits // 2)), (pl.layout, 2 * pl.splits)):
            pv = plan(layout, splits)
            wv = torch.empty(max(pv.workspace, 1), dtype=torch.uint8, device="cuda")
            mv = time_ms(lambda: pv.launch(h, dyp, xp, dw.data_ptr(), wv.data_ptr(), 1.0, 0.0))
            print(f"conv_algos {name} bwd filter forced {pv.layout} S {pv.splits}: {mv:.4f} ms = "
                  f"{flops / (mv * 1e9):.1f} TFLOP/s ({ms / mv:.2f}x the model's plan; v7 estimate "
                  f"{CA._estimate_ms(h, pv):.4f})", flush=True)
        h.prepared.clear()
        v7 = pydnn.get_convolution_backward_filter_algorithm_v7(h, xd, yd, conv, wd, 1)[0].algo
        print(f"conv_algos {name}: v7 backward filter first choice {v7}", flush=True)


def _persistent_gemm(h, name, pl, conv, xd, wd, yd, ptrs, ms_whole):
    """The forward plan again with matmul's candidate of the same tile shape forced (SIMT_CANDIDATES, when
    there are any): its GEMM alone and the whole forward."""
    from pydnn import tuning
    from pydnn.ops.convolution import implicit as CI, plans as CP, problem as CPb, tensor_core as CT
    from pydnn.ops import matmul as M
    cands = [t for t in M.SIMT_CANDIDATES if t.bm == pl.gemm_tile.bm and t.bn == pl.gemm_tile.bn]
    if pl.mm is None or not cands:
        return
    M.simt_extra_units()
    orig = M._choose_simt_tile
    M._choose_simt_tile = lambda *a: cands[0]
    try:
        pc = CP.new_plan(h, CPb.DIR_FWD, WINO, conv, xd, wd, yd)
    finally:
        M._choose_simt_tile = orig
    pc.launch(h, *ptrs, 1.0, 0.0)
    t_g = time_ms(lambda: pc.run_gemm(h))
    t_all = time_ms(lambda: pc.launch(h, *ptrs, 1.0, 0.0))
    print(f"conv_algos {name} fwd F(4x4) with {cands[0]}: gemm {t_g:.4f} ms ({pc.gemm_flops / (t_g * 1e9):.1f} "
          f"TFLOP/s), whole {t_all:.4f} ms (build tile: {ms_whole:.4f})", flush=True)


def _tile(h, tile):
    """Pin the Winograd tile (None: the default) and drop cached plans, which were made for the other one."""
    tuning.conv_winograd.PREFERRED_TILE = tile or _DEFAULT_TILE
    h.prepared.clear()


_DEFAULT_TILE = tuning.conv_winograd.PREFERRED_TILE


def run(b):
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    for layer in LAYERS:
        _layer(b, *layer)
    run_fft(b)


# ----------------------------------------------------------------------------- FFT (large filters)
#
# FFT (convolution_fft.py) on "same"-padded large filters, fp32 NCHW, beside IMPLICIT_GEMM / BWD_DATA_ALGO_0
# and cuDNN (cudnn.benchmark: it may pick its own FFT). Flops counted: the direct 2 * N * K * P * Q * C * R * S.
# Model (before measuring; v7 uses it): IMPLICIT_GEMM runs ~7.5 TFLOP/s whatever the filter, so 9x9 / 11x11 /
# 13x13 at N = 32, C = K = 64, 56^2 take ~9 / ~13 / ~19 ms. FFT (64 x 64 transforms, double spectra):
# 8192 transforms of 64 x 64 (~2 GFLOP double, shared-memory bound, ~0.2 ms), per-bin products 8 N K C bins
# = 2.2 GFLOP double (bound by the loads of the 277 MB of spectra: ~0.3-0.5 ms), independent of the filter
# size: predicted >= 10x IMPLICIT_GEMM on all three.
FFT_LAYERS = [  # name, N, C, K, H, R
    ("9x9 64->64 @56", 32, 64, 64, 56, 9),
    ("11x11 64->64 @56", 32, 64, 64, 56, 11),
    ("13x13 64->64 @56", 32, 64, 64, 56, 13),
    ("9x9 128->128 @28", 32, 128, 128, 28, 9),
]
FFT = pydnn.PYDNN_CONVOLUTION_FWD_ALGO_FFT
BFFT = pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_FFT
WFFT = pydnn.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT
WF0, WF1 = pydnn.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_0, pydnn.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_1
# Backward filter FFT (2026-11-23, fourth session; before measuring): the same transforms as the forward
# (C N + K N inputs of 64 x 64, C K inverses: 12288 at 64 / 64 channels, N 32) and per-bin products of
# 8 C K N bins double flops (the forward's count with the roles moved): predicted within 1.3x of the
# forward FFT's time on each layer, so ~10x BWD_FILTER_ALGO_0/1 at 9x9-13x13 (they run ~6-8 TFLOP/s).
# Measured (H200, 2c02706): 1.01-1.07x the forward FFT's time (49.4 / 73.6 / 102.5 / 64.5 TFLOP/s-equivalent),
# 6.9-13.7x the faster of ALGO_0 / 1, 0.24x / 0.98x / 0.98x / 0.66x cuDNN. On the fp32 3x3 ResNet layers
# (tools/bench_convolution.py, N = 64, f32ccc7) it is the fastest backward filter at 56^2 / 28^2 / 14^2
# (6.8 / 8.9 / 7.7 TFLOP/s against ALGO_1's ~6.2) and 2.3x slower than ALGO_1 at 7^2 (F 8 x 8: 327680
# transform blocks, each a fixed cost larger than its flops; the product kernel keeps 40 of 256 threads busy
# per block); the v7 model was refitted on these twelve runs (convolution_fft.py: rates and a cost per
# round of transform blocks) and ranks it as Find does on all of them.


def _fft_layer(b, name, n, c, k, hw, r):
    pad = r // 2
    x, w, y, dy, dx, xd, yd, wd, conv, flops, (xp, wp, yp, dyp, dxp) = _f32_problem(n, c, k, hw, r, 1, pad, 0.05)
    h = b.h

    def fwd(algo):
        need = pydnn.get_convolution_forward_workspace_size(h, xd, wd, conv, yd, algo)
        ws = torch.empty(max(need, 1), dtype=torch.uint8, device="cuda")
        return time_ms(lambda: pydnn.convolution_forward(h, 1.0, xd, xp, wd, wp, conv, algo, ws.data_ptr(), need, 0.0,
                                                         yd, yp), reps=5, warmup=1)

    def bwd(algo):
        need = pydnn.get_convolution_backward_data_workspace_size(h, wd, yd, conv, xd, algo)
        ws = torch.empty(max(need, 1), dtype=torch.uint8, device="cuda")
        return time_ms(lambda: pydnn.convolution_backward_data(h, 1.0, wd, wp, yd, dyp, conv, algo, ws.data_ptr(), need,
                                                               0.0, xd, dxp), reps=5, warmup=1)

    t_fwd = time_ms(lambda: torch.nn.functional.conv2d(x, w, padding=pad), reps=5, warmup=2)
    ig, ff = fwd(IG), fwd(FFT)
    b.row_flops("conv_algos", f"{name} fwd IMPLICIT_GEMM", "fp32", flops, ig, t_fwd, "cudnn", peak_tflops=PEAK)
    b.row_flops("conv_algos", f"{name} fwd FFT ({ig / ff:.2f}x IMPLICIT_GEMM)", "fp32", flops, ff, t_fwd, "cudnn",
                peak_tflops=PEAK)
    t_bwd = time_ms(lambda: torch.ops.aten.convolution_backward(dy, x, w, None, [1, 1], [pad] * 2, [1, 1], False,
                                                                [0, 0], 1, [True, False, False]), reps=5, warmup=2)
    a0, bf = bwd(BD0), bwd(BFFT)
    b.row_flops("conv_algos", f"{name} bwd data ALGO_0", "fp32", flops, a0, t_bwd, "cudnn", peak_tflops=PEAK)
    b.row_flops("conv_algos", f"{name} bwd data FFT ({a0 / bf:.2f}x ALGO_0)", "fp32", flops, bf, t_bwd, "cudnn",
                peak_tflops=PEAK)
    dw = torch.empty_like(w)

    def wgrad(algo):
        need = pydnn.get_convolution_backward_filter_workspace_size(h, xd, yd, conv, wd, algo)
        ws = torch.empty(max(need, 1), dtype=torch.uint8, device="cuda")
        return time_ms(lambda: pydnn.convolution_backward_filter(h, 1.0, xd, xp, yd, dyp, conv, algo, ws.data_ptr(),
                                                                 need, 0.0, wd, dw.data_ptr()), reps=5, warmup=1)

    t_wgrad = time_ms(lambda: torch.ops.aten.convolution_backward(dy, x, w, None, [1, 1], [pad] * 2, [1, 1], False,
                                                                  [0, 0], 1, [False, True, False]), reps=5, warmup=2)
    w0, w1, wf = wgrad(WF0), wgrad(WF1), wgrad(WFFT)
    best = min(w0, w1)
    b.row_flops("conv_algos", f"{name} bwd filter ALGO_{0 if w0 <= w1 else 1} (the faster of 0 / 1)", "fp32", flops,
                best, t_wgrad, "cudnn", peak_tflops=PEAK)
    b.row_flops("conv_algos", f"{name} bwd filter FFT ({best / wf:.2f}x ALGO_0/1)", "fp32", flops, wf, t_wgrad,
                "cudnn", peak_tflops=PEAK)
    v7 = pydnn.get_convolution_forward_algorithm_v7(h, xd, wd, conv, yd, 1)[0].algo
    v7w = pydnn.get_convolution_backward_filter_algorithm_v7(h, xd, yd, conv, wd, 1)[0].algo
    print(f"conv_algos {name}: v7 forward first choice {v7}, backward filter {v7w}", flush=True)


def run_fft(b):
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    for layer in FFT_LAYERS:
        _fft_layer(b, *layer)
