"""Convolution algorithms beyond the implicit GEMMs: WINOGRAD_NONFUSED (forward, backward data) and GEMM
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
    tests/test_convolution_algos_gpu.py covers both tiles on the GPU.
  GEMM (im2col + implicit GEMM on CUDA cores): 5.1 / 6.4 / 7.3 / 7.7 TFLOP/s = 0.68 / 0.83 / 0.92 /
    0.97x IMPLICIT_GEMM on the 3x3 layers, 3.7 (0.66x) on the 7x7/2 stem: the im2col pass costs what
    the cleaner 1x1 GEMM saves. As predicted, slower on CUDA cores; v7 ranks it below IMPLICIT_GEMM.
Next: a register-blocked batched GEMM (or the tensor-core kernels with TF32 / 16-bit transforms) for
the per-position products, and the input transform fused into the GEMM's A loads (WINOGRAD, fused).
"""
import torch

import pydnn
from bench import desc, time_ms
from pydnn.ops import convolution_winograd as Wg

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


def _layer(b, name, c, k, hw, r, stride, pad):
    pdt = pydnn.PYDNN_DATA_FLOAT
    x = torch.randn(N, c, hw, hw, device="cuda")
    w = torch.randn(k, c, r, r, device="cuda") * 0.1
    y = torch.nn.functional.conv2d(x, w, stride=stride, padding=pad)
    dy, dx = torch.randn_like(y), torch.empty_like(x)
    xd, yd = desc(x, dtype=pdt), desc(y, dtype=pdt)
    wd = pydnn.create_filter_descriptor()
    pydnn.set_filter4d_descriptor(wd, pdt, pydnn.PYDNN_TENSOR_NCHW, *w.shape)
    conv = pydnn.create_convolution_descriptor()
    pydnn.set_convolution2d_descriptor(conv, pad, pad, stride, stride, 1, 1, pydnn.PYDNN_CROSS_CORRELATION, pdt)
    flops = 2 * N * k * y.shape[2] * y.shape[3] * c * r * r
    h = b.h
    xp, wp, yp, dyp, dxp = (t.data_ptr() for t in (x, w, y, dy, dx))
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


def _tile(h, tile):
    """Pin the Winograd tile (None: the default) and drop cached plans, which were made for the other one."""
    Wg.PREFERRED_TILE = tile or _DEFAULT_TILE
    h.prepared.clear()


_DEFAULT_TILE = Wg.PREFERRED_TILE


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
    pdt, pad = pydnn.PYDNN_DATA_FLOAT, r // 2
    x = torch.randn(n, c, hw, hw, device="cuda")
    w = torch.randn(k, c, r, r, device="cuda") * 0.05
    y = torch.nn.functional.conv2d(x, w, padding=pad)
    dy, dx = torch.randn_like(y), torch.empty_like(x)
    xd, yd = desc(x, dtype=pdt), desc(y, dtype=pdt)
    wd = pydnn.create_filter_descriptor()
    pydnn.set_filter4d_descriptor(wd, pdt, pydnn.PYDNN_TENSOR_NCHW, *w.shape)
    conv = pydnn.create_convolution_descriptor()
    pydnn.set_convolution2d_descriptor(conv, pad, pad, 1, 1, 1, 1, pydnn.PYDNN_CROSS_CORRELATION, pdt)
    flops = 2 * n * k * y.shape[2] * y.shape[3] * c * r * r
    h = b.h
    xp, wp, yp, dyp, dxp = (t.data_ptr() for t in (x, w, y, dy, dx))

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
