"""The wgmma backward filter's tilings on the ResNet-50 bf16 3x3 layers (N = 64, NHWC), beside cuDNN
(torch.ops.aten.convolution_backward, weight gradient only) and the mma.sync kernel it replaces
(wgrad_pipe_tc: convolution_wgrad_wgmma.ENABLED off): the data pydnn/ops/convolution_wgrad_wgmma.py's split
model is fit to. Flops: 2 * N * K * P * Q * C * 9. Notes: that module's docstring.

    PYDNN_BENCH_FAMILIES=conv_wgrad_wgmma bash tools/gpu_quick.sh
"""
import pydnn
import torch
from bench import desc, time_ms

from pydnn import tuning

from pydnn.ops.convolution import implicit as CI, plans as CP, problem as CPb, tensor_core as CT
from pydnn.ops.convolution import wgrad_wgmma as W

N = 64
LAYERS = ((64, 56), (128, 28), (256, 14), (512, 7))
F1 = pydnn.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_1


def _layer(b, cc, hw):
    h = b.h
    x = torch.randn(N, cc, hw, hw, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    dy = torch.randn(N, cc, hw, hw, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    w = torch.empty(cc, cc, 3, 3, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    xd, yd = desc(x, dtype=pydnn.PYDNN_DATA_BFLOAT16), desc(dy, dtype=pydnn.PYDNN_DATA_BFLOAT16)
    wd = pydnn.create_filter_descriptor()
    pydnn.set_filter_nd_descriptor(wd, pydnn.PYDNN_DATA_BFLOAT16, pydnn.PYDNN_TENSOR_NHWC, 4, (cc, cc, 3, 3))
    conv = pydnn.create_convolution_descriptor()
    pydnn.set_convolution2d_descriptor(conv, 1, 1, 1, 1, 1, 1, pydnn.PYDNN_CROSS_CORRELATION, pydnn.PYDNN_DATA_FLOAT)
    flops = 2 * N * cc * hw * hw * cc * 9
    ms_t = time_ms(lambda: torch.ops.aten.convolution_backward(dy, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1,
                                                               [False, True, False]))

    def timed(label):
        pydnn.set_convolution_math_type(conv, pydnn.PYDNN_DEFAULT_MATH)  # a new version: a new plan
        pl = CP.new_plan(h, CPb.DIR_BWD_FILTER, F1, conv, xd, wd, yd)
        need = pydnn.get_convolution_backward_filter_workspace_size(h, xd, yd, conv, wd, F1)
        ws = torch.empty(max(need, 1), dtype=torch.uint8, device="cuda")
        ms = time_ms(lambda: pydnn.convolution_backward_filter(h, 1.0, xd, x.data_ptr(), yd, dy.data_ptr(), conv, F1,
                                                               ws.data_ptr(), need, 0.0, wd, w.data_ptr()))
        name = pl.gemm_expr[:-1].split("<", 1)[0].split("::")[-1]
        tile = "x".join(pl.gemm_expr[:-1].split(", ")[1:])
        extra = f" (tiles from {pl.full}: splits {pl.tail_splits})" if getattr(pl, "full", 0) else ""
        b.row_flops("conv", f"{cc}->{cc} @{hw} bwd filter [{label}: {name} {tile} splits {pl.splits}{extra}]", "bf16",
                    flops, ms, ms_t, "cudnn", peak_tflops=990.0)
        return pl

    def forced(tiling):
        tuning.conv_wgrad_wgmma.FORCE = tiling
        try:
            timed("wgmma forced")
        finally:
            tuning.conv_wgrad_wgmma.FORCE = None

    tuning.conv_wgrad_wgmma.ENABLED = False
    try:
        timed("before: wgrad_pipe_tc, its model")
    finally:
        tuning.conv_wgrad_wgmma.ENABLED = True
    pl = timed("wgmma, the model's choice")
    tried = {(pl.cfg, pl.splits, pl.full, pl.tail_splits)}
    gm, gn, gk = cc, 9 * cc, N * hw * hw
    kt = -(-gk // 64)
    for cfg in W.TILES:
        if cfg[0] == 128 and cc <= 64:
            continue
        _, s_best = min((W.plan_time(h.sm_count, gm, gn, gk, cfg, s), s) for s in range(1, 257)
                        if W._splits_of(kt, s) == s)
        for s in (s_best, W._splits_of(kt, 2 * s_best)):
            if (cfg, s, 0, 1) not in tried:
                tried.add((cfg, s, 0, 1))
                forced((cfg, s))
        base = [v for v in W.VARIANTS if v[:2] == cfg[:2]]
        for v in base:  # a deeper ring at the same split
            forced((v, s_best))
    if pl.full:  # the hybrid's tail at half and twice its splits
        for ts in {W._splits_of(kt, max(2, pl.tail_splits // 2)), W._splits_of(kt, 2 * pl.tail_splits)}:
            forced((pl.cfg, 1, pl.full, ts))


def run(b):
    if b.h.arch != W.ARCH:
        print(f"conv_wgrad_wgmma: needs {W.ARCH} (device {b.h.arch})")
        return
    torch.backends.cudnn.benchmark = True
    for cc, hw in LAYERS:
        _layer(b, cc, hw)
