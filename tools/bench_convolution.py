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
  Not on tensor cores yet: backward filter (CUDA-core ALGO_0 / ALGO_1 only: 0.01-0.05x cuDNN for bf16),
  the 7x7 stem (C = 3 is not a multiple of 8), fp32 (no TF32 path). Backward data of the strided 7x7
  stem is pathological on the CUDA-core gather (0.1 TFLOP/s: dx has 3 channels in a 64-wide tile and
  3/4 of the taps miss the stride).
"""
import torch

import pydnn
from bench import desc, time_ms

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
    need = pydnn.get_convolution_backward_filter_workspace_size(h, xd, yd, conv, wd, falgo)
    ws = torch.empty(max(need, 1), dtype=torch.uint8, device="cuda")
    xp, wp, yp, dyp, dxp, dwp = (t.data_ptr() for t in (x, w, y, dy, dx, dw))
    cases = [
        (f"fwd (algo {fwd_algo})", lambda: pydnn.convolution_forward(h, 1.0, xd, xp, wd, wp, conv, fwd_algo, 0, 0, 0.0,
                                                                     yd, yp),
         lambda: torch.nn.functional.conv2d(x, w, stride=stride, padding=pad)),
        (f"bwd data (algo {dalgo})", lambda: pydnn.convolution_backward_data(h, 1.0, wd, wp, yd, dyp, conv, dalgo, 0, 0,
                                                                             0.0, xd, dxp),
         lambda: torch.ops.aten.convolution_backward(dy, x, w, None, [stride] * 2, [pad] * 2, [1, 1], False, [0, 0], 1,
                                                     [True, False, False])),
        (f"bwd filter (algo {falgo})", lambda: pydnn.convolution_backward_filter(h, 1.0, xd, xp, yd, dyp, conv, falgo,
                                                                                 ws.data_ptr(), need, 0.0, wd, dwp),
         lambda: torch.ops.aten.convolution_backward(dy, x, w, None, [stride] * 2, [pad] * 2, [1, 1], False, [0, 0], 1,
                                                     [False, True, False])),
    ]
    for what, fp, ft in cases:
        reps = 10 if flops > 5e10 else 20
        ms_p = time_ms(fp, reps=reps, warmup=2)
        ms_t = time_ms(ft, reps=reps, warmup=3)
        b.row_flops("conv", f"{name} {what}", dname, flops, ms_p, ms_t, "cudnn", peak_tflops=PEAK[dname])


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
    ms_plain = time_ms(lambda: pydnn.convolution_forward(h, 1.0, xd, xp, wd, wp, conv, algo, 0, 0, 0.0, yd, yp))
    ms_fused = time_ms(lambda: pydnn.convolution_bias_activation_forward(h, 1.0, xd, xp, wd, wp, conv, algo, 0, 0, 0.0,
                                                                         yd, yp, bd, bp, act, yd, yp))
    ms_torch = time_ms(lambda: torch.relu_(torch.nn.functional.conv2d(x, w, bias.view(-1), padding=1)))
    b.row_flops("conv", "3x3 64->64 @56 fused bias+relu (pydnn fused vs plain: "
                f"{ms_fused / ms_plain:.3f}x)", "bf16", flops, ms_fused, ms_torch, "cudnn conv+bias, relu_",
                peak_tflops=PEAK["bf16"])


def run(b):
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    for dname in ("bf16", "fp32"):
        for layer in LAYERS:
            _layer(b, *layer, dname)
    _fused(b)
