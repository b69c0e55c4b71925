#!/usr/bin/env python3
"""Convolution sweep (issue 18): pydnn against cuDNN (through PyTorch, torch.backends.cudnn.benchmark =
True) in the same run, bf16 NHWC, forward / backward data / backward filter.

    python3 tools/sweep_conv.py [--quick] [--budget-s S] [--seed 0] [--out DIR] [--find] [--reps N]
                                [--full] [--prebuild] [--timing graph|events] [--only TAGS] [--match NAMES]

    python3 tools/sweep_conv.py --full --match g32,head     # ResNeXt's grouped layers and the UNet head only

--budget-s defaults to 135 s (30 s with --quick) so that the full sweep ends in about 150 s on an H100 / H200
(the elapsed time is printed at the end, and the summary says whether points were left unsampled).

The whole grid in one run (issue 18's resolution): `--full --prebuild` (no budget: every point; the bf16
convolution and matmul kernel units compiled first, in parallel, PREBUILD, their seconds reported apart).
How long it takes: the grid's 213 shapes (639 points) ran in 79.5 s of points on the H200 on 2026-11-27
(every point sampled at the default budget; median 0.16 s a shape, the slowest 4.9 s with first-use
compiles), so about 80-90 s plus the prebuild (~30-60 s of parallel NVRTC on 16 cores, once per machine).
Every run prints the projected time of the rest of the grid as it goes (`eta`), and the summary states
the whole grid's estimate when a budget cut it short.

--timing graph (default): each side's device time per call from a CUDA graph of back-to-back calls
(sweep_common.graph_ms; about 2 ms of work a replay), so the host's per-call cost (Python for pydnn, C++ for
PyTorch) drops out of kernels of ~10 us; a side that cannot be captured falls back to events (the row's
`timing` says which). --timing events: tools/bench.py's time_ms on both sides (the sweeps before issue 18).

The grid (grid(); built without a GPU, checked by tests/hard/test_sweeps_cpu.py):
  * issue   the issue "Convolution"'s layers (tools/bench_convolution.py's LAYERS at N = 64);
  * random  a seeded sample of RANDOM_COUNT shapes: N in 1..256, C and K multiples of 8 in 8..1024, H = W
            in 7..112 (N, C, K, H log-uniform), filter 1 / 3 / 5 / 7 with padding filter // 2, stride 1 or
            2; a draw whose forward exceeds MAX_FLOPS or whose x + y + w exceed MAX_BYTES is drawn again
            (the redraws are counted in the JSON's meta) so that one shape cannot take the whole budget;
  * resnet50 / resnext50 (32x4d: the grouped 3x3) / unet (input 128, 64..1024 channels): every distinct
            conv layer at batch sizes 8, 32 and 128.
Points run in that order (issue, random, then the network layers in a seeded shuffle) until --budget-s is
spent; the summary says how many were not sampled.

Per shape and direction pydnn runs the algorithm its Get..._v7 heuristic puts first (--find: also
Find...AlgorithmEx's fastest, in its own column), cuDNN runs through torch.nn.functional.conv2d /
aten.convolution_backward after warm-up (benchmark mode picks its algorithm in the first calls). Ratio =
cuDNN ms / pydnn ms (above 1: pydnn faster). TFLOP/s count 2 * N * K * P * Q * C / groups * R * S per
direction. Timing: tools/bench.py's time_ms (events, warm-up, median). One shape per direction is checked
against PyTorch before timing (max error relative to the largest |value|, bf16 tolerance 2e-2).
Also: fused conv + bias + ReLU (ConvolutionBiasActivationForward) against the plain forward for a few
ResNet-50 layers at N = 32 (time_pair; target <= 1.03x).
Targets (issue 18): geometric mean >= 0.9x cuDNN, no shape below 0.7x, the issue's layers >= 0.9x.

Mid-session run (H200, torch 2.11 / cuDNN 9.19, --quick, kernels compiled on first use; ratio = cuDNN / pydnn):
  issue 3x3 64->64 @56 N64: fwd 0.61x (fwd_wgmma<64, ...> 210 TFLOP/s vs 344), bwd data 0.69x, bwd filter 1.09x;
  random N163 3x3 448->880 @19: fwd 1.27x, bwd data 0.21x (bwd_data_tc<128, 128>: the mma.sync kernel, 148 vs
  706 TFLOP/s), bwd filter 0.75x; ResNeXt l3 3x3 g32 512->512 @14 N32: fwd 0.14x, bwd data 0.25x, bwd filter
  0.02x (grouped layers run the CUDA-core implicit_gemm / Winograd today); fused conv + bias + ReLU / plain
  1.013x (3x3 64->64 @56 N32). Spot checks: fwd 2.8e-3, bwd data 2.7e-3, bwd filter 3.9e-3 (tolerance 2e-2).
  Three shapes took ~9 s with first-use compiles and cuDNN's benchmark-mode trials.
"""
import math
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sweep_common as SC  # noqa: E402

DIRECTIONS = ("fwd", "bwd data", "bwd filter")
BATCHES = (8, 32, 128)
RANDOM_COUNT = 44
MAX_FLOPS = 1.5e12       # forward FLOPs of one random shape (~2.5 ms at 600 TFLOP/s)
MAX_BYTES = 2 << 30      # x + y + w of one random shape

# (name, C, K, H, R, stride, pad, groups); H is the input's height = width
ISSUE_N = 64
ISSUE_LAYERS = [  # tools/bench_convolution.py's LAYERS (the issue "Convolution"), groups 1
    ("3x3 64->64 @56", 64, 64, 56, 3, 1, 1, 1),
    ("3x3 128->128 @28", 128, 128, 28, 3, 1, 1, 1),
    ("3x3 256->256 @14", 256, 256, 14, 3, 1, 1, 1),
    ("3x3 512->512 @7", 512, 512, 7, 3, 1, 1, 1),
    ("1x1 256->64 @56", 256, 64, 56, 1, 1, 0, 1),
    ("1x1 64->256 @56", 64, 256, 56, 1, 1, 0, 1),
    ("7x7/2 3->64 @224", 3, 64, 224, 7, 2, 3, 1),
]

RESNET50 = [  # torchvision resnet50 (v1.5: the stride on the 3x3), input 224
    ("stem 7x7/2 3->64 @224", 3, 64, 224, 7, 2, 3, 1),
    ("l1 1x1 64->64 @56", 64, 64, 56, 1, 1, 0, 1),
    ("l1 3x3 64->64 @56", 64, 64, 56, 3, 1, 1, 1),
    ("l1 1x1 64->256 @56 (+downsample)", 64, 256, 56, 1, 1, 0, 1),
    ("l1 1x1 256->64 @56", 256, 64, 56, 1, 1, 0, 1),
    ("l2 1x1 256->128 @56", 256, 128, 56, 1, 1, 0, 1),
    ("l2 3x3/2 128->128 @56", 128, 128, 56, 3, 2, 1, 1),
    ("l2 1x1 128->512 @28", 128, 512, 28, 1, 1, 0, 1),
    ("l2 downsample 1x1/2 256->512 @56", 256, 512, 56, 1, 2, 0, 1),
    ("l2 1x1 512->128 @28", 512, 128, 28, 1, 1, 0, 1),
    ("l2 3x3 128->128 @28", 128, 128, 28, 3, 1, 1, 1),
    ("l3 1x1 512->256 @28", 512, 256, 28, 1, 1, 0, 1),
    ("l3 3x3/2 256->256 @28", 256, 256, 28, 3, 2, 1, 1),
    ("l3 1x1 256->1024 @14", 256, 1024, 14, 1, 1, 0, 1),
    ("l3 downsample 1x1/2 512->1024 @28", 512, 1024, 28, 1, 2, 0, 1),
    ("l3 1x1 1024->256 @14", 1024, 256, 14, 1, 1, 0, 1),
    ("l3 3x3 256->256 @14", 256, 256, 14, 3, 1, 1, 1),
    ("l4 1x1 1024->512 @14", 1024, 512, 14, 1, 1, 0, 1),
    ("l4 3x3/2 512->512 @14", 512, 512, 14, 3, 2, 1, 1),
    ("l4 1x1 512->2048 @7", 512, 2048, 7, 1, 1, 0, 1),
    ("l4 downsample 1x1/2 1024->2048 @14", 1024, 2048, 14, 1, 2, 0, 1),
    ("l4 1x1 2048->512 @7", 2048, 512, 7, 1, 1, 0, 1),
    ("l4 3x3 512->512 @7", 512, 512, 7, 3, 1, 1, 1),
]

RESNEXT50 = [  # torchvision resnext50_32x4d: widths 128 / 256 / 512 / 1024, 32 groups on the 3x3
    ("stem 7x7/2 3->64 @224", 3, 64, 224, 7, 2, 3, 1),
    ("l1 1x1 64->128 @56", 64, 128, 56, 1, 1, 0, 1),
    ("l1 3x3 g32 128->128 @56", 128, 128, 56, 3, 1, 1, 32),
    ("l1 1x1 128->256 @56", 128, 256, 56, 1, 1, 0, 1),
    ("l1 downsample 1x1 64->256 @56", 64, 256, 56, 1, 1, 0, 1),
    ("l1 1x1 256->128 @56", 256, 128, 56, 1, 1, 0, 1),
    ("l2 1x1 256->256 @56", 256, 256, 56, 1, 1, 0, 1),
    ("l2 3x3/2 g32 256->256 @56", 256, 256, 56, 3, 2, 1, 32),
    ("l2 1x1 256->512 @28", 256, 512, 28, 1, 1, 0, 1),
    ("l2 downsample 1x1/2 256->512 @56", 256, 512, 56, 1, 2, 0, 1),
    ("l2 1x1 512->256 @28", 512, 256, 28, 1, 1, 0, 1),
    ("l2 3x3 g32 256->256 @28", 256, 256, 28, 3, 1, 1, 32),
    ("l3 1x1 512->512 @28", 512, 512, 28, 1, 1, 0, 1),
    ("l3 3x3/2 g32 512->512 @28", 512, 512, 28, 3, 2, 1, 32),
    ("l3 1x1 512->1024 @14", 512, 1024, 14, 1, 1, 0, 1),
    ("l3 downsample 1x1/2 512->1024 @28", 512, 1024, 28, 1, 2, 0, 1),
    ("l3 1x1 1024->512 @14", 1024, 512, 14, 1, 1, 0, 1),
    ("l3 3x3 g32 512->512 @14", 512, 512, 14, 3, 1, 1, 32),
    ("l4 1x1 1024->1024 @14", 1024, 1024, 14, 1, 1, 0, 1),
    ("l4 3x3/2 g32 1024->1024 @14", 1024, 1024, 14, 3, 2, 1, 32),
    ("l4 1x1 1024->2048 @7", 1024, 2048, 7, 1, 1, 0, 1),
    ("l4 downsample 1x1/2 1024->2048 @14", 1024, 2048, 14, 1, 2, 0, 1),
    ("l4 1x1 2048->1024 @7", 2048, 1024, 7, 1, 1, 0, 1),
    ("l4 3x3 g32 1024->1024 @7", 1024, 1024, 7, 3, 1, 1, 32),
]

UNET = [  # the original UNet's double 3x3 convolutions (padded), input 128 x 128, 3 channels in, 2 out
    ("enc1 3x3 3->64 @128", 3, 64, 128, 3, 1, 1, 1),
    ("enc1 3x3 64->64 @128", 64, 64, 128, 3, 1, 1, 1),
    ("enc2 3x3 64->128 @64", 64, 128, 64, 3, 1, 1, 1),
    ("enc2 3x3 128->128 @64", 128, 128, 64, 3, 1, 1, 1),
    ("enc3 3x3 128->256 @32", 128, 256, 32, 3, 1, 1, 1),
    ("enc3 3x3 256->256 @32", 256, 256, 32, 3, 1, 1, 1),
    ("enc4 3x3 256->512 @16", 256, 512, 16, 3, 1, 1, 1),
    ("enc4 3x3 512->512 @16", 512, 512, 16, 3, 1, 1, 1),
    ("mid 3x3 512->1024 @8", 512, 1024, 8, 3, 1, 1, 1),
    ("mid 3x3 1024->1024 @8", 1024, 1024, 8, 3, 1, 1, 1),
    ("dec4 3x3 1024->512 @16", 1024, 512, 16, 3, 1, 1, 1),
    ("dec3 3x3 512->256 @32", 512, 256, 32, 3, 1, 1, 1),
    ("dec2 3x3 256->128 @64", 256, 128, 64, 3, 1, 1, 1),
    ("dec1 3x3 128->64 @128", 128, 64, 128, 3, 1, 1, 1),
    ("head 1x1 64->2 @128", 64, 2, 128, 1, 1, 0, 1),
]
NETWORKS = (("resnet50", RESNET50), ("resnext50", RESNEXT50), ("unet", UNET))

# the kernel units a bf16 sweep loads (build_all prefixes; --prebuild compiles them in parallel first)
PREBUILD = ("convolution.bf16", "convolution.wgmma.bf16", "convolution.wgmma.split.bf16", "convolution.wgrad.bf16", "convolution.grouped.bf16",
            "conv_gemm.bf16", "conv_dgrad.bf16", "conv_bias.bf16", "conv_winograd.bf16", "matmul.bf16",
            "matmul.wgmma.bf16", "matmul.wgmmap.bf16", "matmul.wgmmas.bf16", "convolution.tma.bf16")
PREBUILD += tuple(f"convolution.{u}.bn{bn}.bf16" for u in ("tma_dgrad", "tma_phase") for bn in (64, 128, 256))   # fwd_tma

FUSED_N = 32
FUSED_LAYERS = [RESNET50[2], RESNET50[4], RESNET50[16], RESNET50[19]]
QUICK_FUSED = [RESNET50[2]]


def out_hw(h, r, stride, pad):
    return (h + 2 * pad - r) // stride + 1


def problem(tag, name, n, c, k, h, r, stride, pad, groups):
    p = out_hw(h, r, stride, pad)
    return dict(tag=tag, name=name, n=n, c=c, k=k, h=h, r=r, stride=stride, pad=pad, groups=groups, p=p,
                flops=2 * n * k * p * p * (c // groups) * r * r)


def nbytes(pr, es=2):
    return es * (pr["n"] * pr["c"] * pr["h"] ** 2 + pr["n"] * pr["k"] * pr["p"] ** 2
                 + pr["k"] * (pr["c"] // pr["groups"]) * pr["r"] ** 2)


def _loguniform_int(rng, lo, hi):
    return max(lo, min(hi, int(round(math.exp(rng.uniform(math.log(lo), math.log(hi + 0.5)))))))


def random_problems(seed, count=RANDOM_COUNT):
    """(problems, redraws): `count` seeded shapes in the issue's ranges under MAX_FLOPS / MAX_BYTES."""
    rng = random.Random(seed)
    out, redraws = [], 0
    while len(out) < count:
        n = _loguniform_int(rng, 1, 256)
        c = 8 * _loguniform_int(rng, 1, 128)
        k = 8 * _loguniform_int(rng, 1, 128)
        h = _loguniform_int(rng, 7, 112)
        r = rng.choice((1, 3, 5, 7))
        stride = rng.choice((1, 2))
        pr = problem("random", f"rand{len(out):02d} {r}x{r}{'/2' if stride == 2 else ''} {c}->{k} @{h}",
                     n, c, k, h, r, stride, r // 2, 1)
        if pr["flops"] > MAX_FLOPS or nbytes(pr) > MAX_BYTES:
            redraws += 1
            continue
        out.append(pr)
    return out, redraws


def network_problems(batches=BATCHES):
    """Every distinct layer of the three networks at each batch size (a layer two networks share is run
    once, under the first network's tag, its name listing both)."""
    out, seen = [], {}
    for n in batches:
        for tag, layers in NETWORKS:
            for name, c, k, h, r, stride, pad, groups in layers:
                key = (n, c, k, h, r, stride, pad, groups)
                if key in seen:
                    seen[key]["also"].append(f"{tag} {name}")
                    continue
                pr = problem(tag, name, n, c, k, h, r, stride, pad, groups)
                pr["also"] = []
                seen[key] = pr
                out.append(pr)
    return out


def grid(seed=0, quick=False):
    """(problems in run order, meta)."""
    issue = [problem("issue", name, ISSUE_N, *rest) for name, *rest in ISSUE_LAYERS]
    rand, redraws = random_problems(seed)
    nets = network_problems((32, 8, 128))
    if quick:  # an issue layer, a random shape, a grouped ResNeXt layer, a UNet layer (few kernel units to load)
        pick = lambda lst, tag, name: next(p for p in lst if p["tag"] == tag and p["name"] == name)  # noqa: E731
        probs = ([issue[0], rand[1]]
                 + [pick(nets, "resnext50", "l3 3x3 g32 512->512 @14"), pick(nets, "unet", "enc3 3x3 256->256 @32")])
    else:  # the network layers in a seeded shuffle: a budget that runs out leaves a sample of every network and batch
        random.Random(seed + 1).shuffle(nets)
        probs = issue + rand + nets
    return probs, dict(random_redraws=redraws, random_count=len(rand), seed=seed)


# ----------------------------------------------------------------------------------- GPU part
def _setup(h, pr):
    import torch
    import pydnn
    from bench import desc

    cl = torch.channels_last
    bf, pdt = torch.bfloat16, pydnn.PYDNN_DATA_BFLOAT16
    n, c, k, hh, r, g = pr["n"], pr["c"], pr["k"], pr["h"], pr["r"], pr["groups"]
    x = torch.randn(n, c, hh, hh, device=SC.DEV, dtype=bf).contiguous(memory_format=cl)
    w = (torch.randn(k, c // g, r, r, device=SC.DEV, dtype=bf) / math.sqrt(c // g * r * r)).contiguous(memory_format=cl)
    y = torch.empty(n, k, pr["p"], pr["p"], device=SC.DEV, dtype=bf).contiguous(memory_format=cl)
    dy = torch.randn_like(y)
    dx, dw = torch.empty_like(x), torch.empty_like(w)
    xd, yd = desc(x, dtype=pdt), desc(y, dtype=pdt)
    wd = pydnn.create_filter_descriptor()
    pydnn.set_filter4d_descriptor(wd, pdt, pydnn.PYDNN_TENSOR_NHWC, k, c // g, r, r)
    conv = pydnn.create_convolution_descriptor()
    pydnn.set_convolution2d_descriptor(conv, pr["pad"], pr["pad"], pr["stride"], pr["stride"], 1, 1,
                                       pydnn.PYDNN_CROSS_CORRELATION, pydnn.PYDNN_DATA_FLOAT)
    if g > 1:
        pydnn.set_convolution_group_count(conv, g)
    return dict(x=x, w=w, y=y, dy=dy, dx=dx, dw=dw, xd=xd, yd=yd, wd=wd, conv=conv)


def _direction_fns(h, pr, t, d, algo, ws, ws_n):
    """(pydnn fn, torch fn, pydnn output tensor) of one direction with one algorithm."""
    import torch
    import pydnn

    s, pd, g = [pr["stride"]] * 2, [pr["pad"]] * 2, pr["groups"]
    x, w, y, dy, dx, dw = t["x"], t["w"], t["y"], t["dy"], t["dx"], t["dw"]
    xd, yd, wd, conv = t["xd"], t["yd"], t["wd"], t["conv"]
    wsp = ws.data_ptr() if ws is not None else 0
    if d == "fwd":
        return (lambda: pydnn.convolution_forward(h, 1.0, xd, x.data_ptr(), wd, w.data_ptr(), conv, algo, wsp, ws_n,
                                                  0.0, yd, y.data_ptr()),
                lambda: torch.nn.functional.conv2d(x, w, None, s, pd, 1, g), y)
    if d == "bwd data":
        return (lambda: pydnn.convolution_backward_data(h, 1.0, wd, w.data_ptr(), yd, dy.data_ptr(), conv, algo, wsp,
                                                        ws_n, 0.0, xd, dx.data_ptr()),
                lambda: torch.ops.aten.convolution_backward(dy, x, w, None, s, pd, [1, 1], False, [0, 0], g,
                                                            [True, False, False])[0], dx)
    return (lambda: pydnn.convolution_backward_filter(h, 1.0, xd, x.data_ptr(), yd, dy.data_ptr(), conv, algo, wsp,
                                                      ws_n, 0.0, wd, dw.data_ptr()),
            lambda: torch.ops.aten.convolution_backward(dy, x, w, None, s, pd, [1, 1], False, [0, 0], g,
                                                        [False, True, False])[1], dw)


def _v7(h, t, d):
    import pydnn
    xd, yd, wd, conv = t["xd"], t["yd"], t["wd"], t["conv"]
    if d == "fwd":
        algo = pydnn.get_convolution_forward_algorithm_v7(h, xd, wd, conv, yd, 1)[0].algo
        return algo, pydnn.get_convolution_forward_workspace_size(h, xd, wd, conv, yd, algo)
    if d == "bwd data":
        algo = pydnn.get_convolution_backward_data_algorithm_v7(h, wd, yd, conv, xd, 1)[0].algo
        return algo, pydnn.get_convolution_backward_data_workspace_size(h, wd, yd, conv, xd, algo)
    algo = pydnn.get_convolution_backward_filter_algorithm_v7(h, xd, yd, conv, wd, 1)[0].algo
    return algo, pydnn.get_convolution_backward_filter_workspace_size(h, xd, yd, conv, wd, algo)


FIND_WS = 256 << 20


def _find(h, t, d, buf):
    """(algo, workspace bytes) of Find...AlgorithmEx's fastest successful result."""
    import pydnn
    x, w, y, dy, dx, dw = t["x"], t["w"], t["y"], t["dy"], t["dx"], t["dw"]
    xd, yd, wd, conv = t["xd"], t["yd"], t["wd"], t["conv"]
    bp = buf.data_ptr()
    if d == "fwd":
        res = pydnn.find_convolution_forward_algorithm_ex(h, xd, x.data_ptr(), wd, w.data_ptr(), conv, yd, y.data_ptr(),
                                                          8, bp, FIND_WS)
    elif d == "bwd data":
        res = pydnn.find_convolution_backward_data_algorithm_ex(h, wd, w.data_ptr(), yd, dy.data_ptr(), conv, xd,
                                                                dx.data_ptr(), 6, bp, FIND_WS)
    else:
        res = pydnn.find_convolution_backward_filter_algorithm_ex(h, xd, x.data_ptr(), yd, dy.data_ptr(), conv, wd,
                                                                  dw.data_ptr(), 7, bp, FIND_WS)
    ok = [p for p in res if p.status == pydnn.PYDNN_STATUS_SUCCESS]
    if not ok:
        raise pydnn.PydnnError(pydnn.PYDNN_STATUS_NOT_SUPPORTED, "Find: no algorithm succeeded")
    return ok[0].algo, ok[0].memory


def _kernel(h, t, d, algo):
    """Best effort: the kernel (template name and tile) of the plan pydnn ran, from its plan cache."""
    try:
        from pydnn.ops.convolution import plans as CP, problem as CPb
        direction = {"fwd": CPb.DIR_FWD, "bwd data": CPb.DIR_BWD_DATA, "bwd filter": CPb.DIR_BWD_FILTER}[d]
        pl = CP.get_plan(h, direction, algo, t["conv"], t["xd"], t["wd"], t["yd"])
        expr = getattr(pl, "gemm_expr", "") or ""
        if not expr:
            return type(pl).__name__
        head, _, args = expr.partition("<")
        return f"{head.split('::')[-1]}<{args.split(', ', 1)[-1]}" if ", " in args else head.split("::")[-1]
    except Exception:  # noqa: BLE001 - a label only
        return None


def case_name(pr):
    g = f" g{pr['groups']}" if pr["groups"] > 1 else ""
    st = f"/{pr['stride']}" if pr["stride"] > 1 else ""
    return (f"{pr['tag']} N{pr['n']} {pr['r']}x{pr['r']}{st}{g} {pr['c']}->{pr['k']} @{pr['h']}"
            + (f" ({pr['name']})" if pr["tag"] not in ("random", "issue") else ""))


def run_problem(h, pr, timer, checked, find, rows):
    import torch

    base = dict(case=case_name(pr), dtype="bf16", tag=pr["tag"], n=pr["n"], c=pr["c"], k=pr["k"], h=pr["h"],
                r=pr["r"], stride=pr["stride"], groups=pr["groups"], flops=pr["flops"])
    try:
        t = _setup(h, pr)
    except Exception as e:  # noqa: BLE001 - an OOM or refused shape is a row, not the end of the sweep
        st, note = SC.classify(e)
        for d in DIRECTIONS:
            rows.append(dict(base, group=d, status=st, note=note))
        torch.cuda.empty_cache()
        return
    for d in DIRECTIONS:
        row = dict(base, group=d, status=SC.OK)
        try:
            algo, ws_n = _v7(h, t, d)
            row["algo"] = algo
            ws = torch.empty(max(ws_n, 1), dtype=torch.uint8, device=SC.DEV)
            fp, ft, out = _direction_fns(h, pr, t, d, algo, ws, ws_n)
            if d not in checked:  # correctness spot check, not timed: pydnn's output (poisoned first) vs PyTorch's
                out.fill_(float("nan"))
                fp()
                ref = ft()
                err, ok = SC.close_rel(out, ref, 2e-2)
                checked[d] = dict(case=row["case"], err=err, ok=ok)
                row["check_err"] = err
                if not ok:
                    row["note"] = f"CHECK FAILED: max rel err {err:.3g}"
            row["ms_pydnn"] = timer(fp)
            row["timing"] = getattr(timer, "last", "events")
            row["kernel"] = _kernel(h, t, d, algo)
            row["ms_ref"] = timer(ft)
            if getattr(timer, "last", "events") != row["timing"]:
                row["timing"] += "/" + timer.last
            row["ratio"] = row["ms_ref"] / row["ms_pydnn"]
            row["tflops_pydnn"] = pr["flops"] / row["ms_pydnn"] / 1e9
            row["tflops_ref"] = pr["flops"] / row["ms_ref"] / 1e9
            if find:  # (a failure here is a note: the v7 row stands)
                try:
                    buf = torch.empty(FIND_WS, dtype=torch.uint8, device=SC.DEV)
                    falgo, fws = _find(h, t, d, buf)
                    buf = None
                    row["find_algo"] = falgo
                    if falgo == algo:
                        row["ms_find"] = row["ms_pydnn"]
                    else:
                        wsf = torch.empty(max(fws, 1), dtype=torch.uint8, device=SC.DEV)
                        row["ms_find"] = timer(_direction_fns(h, pr, t, d, falgo, wsf, fws)[0])
                except Exception as e:  # noqa: BLE001
                    row["note"] = (row.get("note", "") + f" Find: {SC.classify(e)[1][:100]}").strip()
            del ws
        except Exception as e:  # noqa: BLE001
            row["status"], row["note"] = SC.classify(e)
            row.pop("ratio", None)
        rows.append(row)
    del t
    torch.cuda.empty_cache()


class GraphTimer:
    """Device ms per call from a CUDA graph of back-to-back calls (sweep_common.graph_ms), `calls` chosen from
    a one-call graph so that a replay is about REPLAY_MS of work; a function that cannot be captured is timed
    by `fallback` (events around back-to-back calls). `last`: "graph" or "events", for the row."""

    REPLAY_MS = 2.0

    def __init__(self, h, reps, fallback):
        self.h, self.reps, self.fallback, self.last = h, reps, fallback, "graph"

    def __call__(self, fn):
        import sweep_common as SCm   # (looked up at the call: the dry run fakes graph_ms)
        try:
            one = SCm.graph_ms(self.h, fn, calls=1, reps=1)
            calls = max(1, min(20, int(self.REPLAY_MS / max(one, 1e-3))))
            ms = SCm.graph_ms(self.h, fn, calls=calls, reps=self.reps)
            self.last = "graph"
            return ms
        except Exception:  # noqa: BLE001 - not capturable: time it with events instead
            try:
                import torch
                torch.cuda.synchronize()
            except Exception:  # noqa: BLE001
                pass
            self.last = "events"
            return self.fallback(fn)


def prebuild(prefixes=PREBUILD):
    """Compile the sweep's kernel units in parallel (build_all: a unit already in the cache costs a lookup);
    returns the seconds it took."""
    t = time.monotonic()
    from pydnn._build import build
    build.build_all(prefixes=tuple(prefixes))
    return time.monotonic() - t


def run_fused(h, layers, timer, timer_pair, rows):
    """Fused conv + bias + ReLU vs the plain forward (same algorithm: v7's), time_pair; and PyTorch's
    conv2d(bias) + relu_ for reference."""
    import torch
    import pydnn
    from bench import desc

    for name, c, k, hh, r, stride, pad, g in layers:
        pr = problem("fused", name, FUSED_N, c, k, hh, r, stride, pad, g)
        row = dict(group="fused", case=case_name(pr), dtype="bf16", status=SC.OK, flops=pr["flops"])
        try:
            t = _setup(h, pr)
            algo, ws_n = _v7(h, t, "fwd")
            ws = torch.empty(max(ws_n, 1), dtype=torch.uint8, device=SC.DEV)
            bias = torch.randn(1, k, 1, 1, device=SC.DEV, dtype=torch.bfloat16)
            bd = desc(bias, dtype=pydnn.PYDNN_DATA_BFLOAT16)
            act = pydnn.create_activation_descriptor()
            pydnn.set_activation_descriptor(act, pydnn.PYDNN_ACTIVATION_RELU, pydnn.PYDNN_NOT_PROPAGATE_NAN, 0.0)
            x, w, y, xd, yd, wd, conv = t["x"], t["w"], t["y"], t["xd"], t["yd"], t["wd"], t["conv"]
            plain = lambda: pydnn.convolution_forward(h, 1.0, xd, x.data_ptr(), wd, w.data_ptr(), conv, algo,  # noqa
                                                      ws.data_ptr(), ws_n, 0.0, yd, y.data_ptr())
            fused = lambda: pydnn.convolution_bias_activation_forward(  # noqa: E731
                h, 1.0, xd, x.data_ptr(), wd, w.data_ptr(), conv, algo, ws.data_ptr(), ws_n, 0.0, yd, y.data_ptr(),
                bd, bias.data_ptr(), act, yd, y.data_ptr())
            y.fill_(float("nan"))
            fused()
            ref = torch.relu(torch.nn.functional.conv2d(x, w, bias.view(-1), stride, pad, 1, g))
            row["check_err"], ok = SC.close_rel(y, ref, 2e-2)
            if not ok:
                row["note"] = f"CHECK FAILED: max rel err {row['check_err']:.3g}"
            ms_plain, ms_fused = timer_pair(plain, fused)
            ms_t = timer(lambda: torch.relu_(torch.nn.functional.conv2d(x, w, bias.view(-1), stride, pad, 1, g)))
            row.update(algo=algo, ms_plain=ms_plain, ms_fused=ms_fused, ms_torch_fused=ms_t,
                       fused_over_plain=ms_fused / ms_plain, ratio_vs_torch=ms_t / ms_fused)
            t = ws = None  # noqa: F841 - freed before the next layer
        except Exception as e:  # noqa: BLE001
            row["status"], row["note"] = SC.classify(e)
        rows.append(row)
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------------- report
def report(rows, fused_rows, meta, budget_note, elapsed):
    lines = ["# Convolution sweep (issue 18): pydnn vs cuDNN, bf16 NHWC", "",
             f"{meta.get('device', '?')}, torch {meta.get('torch', '?')}, cuDNN {meta.get('cudnn', '?')}, "
             f"seed {meta.get('seed')}; {budget_note}; elapsed {elapsed:.1f} s"
             + (f"; the whole grid ({meta['grid_shapes']} shapes) ~{meta['full_grid_estimate_s']:.0f} s of points "
                f"by this run's mean" if meta.get("full_grid_estimate_s") else "")
             + (f"; prebuild {meta['prebuild_s']:.1f} s" if meta.get("prebuild_s") else "")
             + (f"; timing: {meta['timing']}" if meta.get("timing") else "") + ".", "",
             "Ratio = cuDNN ms / pydnn ms (above 1: pydnn faster). Targets: geomean >= 0.9x, none below 0.7x, "
             "the issue's layers >= 0.9x.", "", "## Summary", "",
             "| direction | points | geomean | min | min at | < 0.7x | not OK |", "|---|---:|---:|---:|---|---:|---:|"]
    for d in list(DIRECTIONS) + ["all"]:
        s = SC.summarize(rows, below=0.7, pred=(lambda r, d=d: d == "all" or r["group"] == d))
        bad = sum(v for k, v in s["statuses"].items() if k != SC.OK)
        lines.append(f"| {d} | {s['n']} | {SC.fmt(s['geomean'])} | {SC.fmt(s['min'])} | {s['min_case']} | "
                     f"{s['below']} | {bad} |")
    lines += ["", "Per part of the grid:", "", "| part | points | geomean | min | < 0.7x |", "|---|---:|---:|---:|---:|"]
    for tag in ("issue", "random", "resnet50", "resnext50", "unet"):
        s = SC.summarize(rows, below=0.7, pred=lambda r, tag=tag: r.get("tag") == tag)
        if s["n"] or s["statuses"]:
            lines.append(f"| {tag} | {s['n']} | {SC.fmt(s['geomean'])} | {SC.fmt(s['min'])} | {s['below']} |")
    for n in BATCHES:
        s = SC.summarize(rows, below=0.7, pred=lambda r, n=n: r.get("tag") in ("resnet50", "resnext50", "unet")
                         and r.get("n") == n)
        if s["n"] or s["statuses"]:
            lines.append(f"| networks at N = {n} | {s['n']} | {SC.fmt(s['geomean'])} | {SC.fmt(s['min'])} | "
                         f"{s['below']} |")
    issue = [r for r in rows if r.get("tag") == "issue"]
    if issue:
        lines += ["", "The issue \"Convolution\"'s layers (N = 64; target every cell >= 0.9x):", "",
                  "| layer | fwd | bwd data | bwd filter |", "|---|---:|---:|---:|"]
        by = {}
        for r in issue:
            by.setdefault(r["case"], {})[r["group"]] = r
        for case, ds in by.items():
            cells = [SC.fmt(ds[d].get("ratio"), ".2f") + "x" if d in ds and ds[d]["status"] == SC.OK
                     else (ds[d]["status"] if d in ds else "-") for d in DIRECTIONS]
            lines.append(f"| {case} | " + " | ".join(cells) + " |")
    if fused_rows:
        lines += ["", "Fused conv + bias + ReLU vs the plain forward (pydnn, same algorithm; target <= 1.03x):", "",
                  "| layer | plain ms | fused ms | fused / plain | PyTorch conv+bias, relu_ ms | pydnn fused speed / PyTorch |",
                  "|---|---:|---:|---:|---:|---:|"]
        for r in fused_rows:
            if r["status"] != SC.OK:
                lines.append(f"| {r['case']} | {r['status']} | {r.get('note', '')} | | | |")
                continue
            lines.append(f"| {r['case']} | {r['ms_plain']:.4f} | {r['ms_fused']:.4f} | {r['fused_over_plain']:.3f}x | "
                         f"{r['ms_torch_fused']:.4f} | {r['ratio_vs_torch']:.2f}x |")
    lines += SC.checks_lines(meta.get("checks", {}))
    cols = [("shape", "case", None), ("direction", "group", None), ("status", "status", None),
            ("algo", "algo", None), ("pydnn kernel", "kernel", None), ("pydnn ms", "ms_pydnn", ".4f"), ("cuDNN ms", "ms_ref", ".4f"),
            ("ratio", "ratio", ".3f"), ("pydnn TFLOP/s", "tflops_pydnn", ".1f"), ("cuDNN TFLOP/s", "tflops_ref", ".1f")]
    if any("ms_find" in r for r in rows):
        cols.insert(6, ("pydnn Find ms", "ms_find", ".4f"))
    cols.append(("point s", "point_s", ".2f"))
    if any("timing" in r for r in rows):
        cols.append(("timing", "timing", None))
    cols.append(("note", "note", None))
    lines += ["", "## Every point", "", SC.markdown_table(rows, cols), ""]
    return "\n".join(lines)


def plots(rows):
    return {"sweep_conv.png": ("pydnn / cuDNN, bf16 NHWC convolution, sorted per direction",
                               {d: [r["ratio"] for r in SC.ok_rows(rows, d)] for d in DIRECTIONS}, (1.0, 0.9, 0.7))}


def main(argv=None):
    args = SC.parse_args(__doc__, 135.0, argv, extra=[
        ("--find", dict(action="store_true", help="also time Find...AlgorithmEx's fastest algorithm per point")),
        ("--full", dict(action="store_true", help="every point of the grid: no budget (overrides --budget-s)")),
        ("--prebuild", dict(action="store_true", help="compile the bf16 convolution / matmul units in parallel "
                                                      "before the first point (seconds reported apart)")),
        ("--timing", dict(choices=("graph", "events"), default="graph",
                          help="device time from CUDA graphs (default) or events around back-to-back calls")),
        ("--match", dict(default="", help="only the shapes whose name contains one of these comma-separated "
                                          "strings (e.g. 'g32' for ResNeXt's grouped layers, 'head' for the UNet "
                                          "head); the fused rows are skipped with it"))])
    find = args.find
    if args.full:
        args.budget_s = float("inf")
    if args.render:
        return SC.render(args, "sweep_conv", lambda rows, meta: report(
            [r for r in rows if r["group"] != "fused"], [r for r in rows if r["group"] == "fused"], meta,
            meta.get("budget_note", "rendered from " + args.render), meta.get("elapsed_s", float("nan"))),
            lambda rows: plots([r for r in rows if r["group"] != "fused"]))
    prebuild_s = prebuild() if args.prebuild else None
    t0 = time.monotonic()
    import torch
    import pydnn
    from bench import time_pair

    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(args.seed)
    h = pydnn.create()
    pydnn.set_stream(h, torch.cuda.current_stream().cuda_stream)
    reps = args.reps or 5
    timer = SC.gpu_timer(reps, 1)
    if args.timing == "graph":
        timer = GraphTimer(h, reps, timer)
    budget = SC.Budget(args.budget_s)
    probs, meta = grid(args.seed, args.quick)
    meta.update(SC.device_meta(), quick=args.quick, budget_s=args.budget_s, reps=reps, find=find,
                timing=args.timing, prebuild_s=prebuild_s)
    only = [o for o in args.only.split(",") if o]
    match = [m for m in args.match.split(",") if m]
    if match:   # --match: the named shapes only
        probs = [pr for pr in probs if any(m in case_name(pr) for m in match)]
    n_run = sum(1 for pr in probs if not only or pr["tag"] in only)
    point_times = []
    rows, fused_rows, checked = [], [], {}
    for i, pr in enumerate(probs):
        if only and pr["tag"] not in only:
            continue
        if not budget.take() or meta.get("context_lost"):
            continue
        n_before, t_point = len(rows), time.monotonic()
        run_problem(h, pr, timer, checked, find, rows)
        point_times.append(time.monotonic() - t_point)
        for r in rows[n_before:]:  # the point's wall time (setup, check, both sides' timing)
            r["point_s"] = point_times[-1]
        left = n_run - len(point_times)
        if left and len(point_times) % 20 == 0:   # the projected time of the rest of the grid
            mean = sum(point_times) / len(point_times)
            print(f"eta: {len(point_times)} of {n_run} shapes in {budget.elapsed():.1f} s, the other {left} "
                  f"~{left * mean:.0f} s more at {mean:.2f} s a shape", flush=True)
        lost = SC.sticky(rows[n_before:])
        if lost:  # the CUDA context is unusable from here: stop sampling and say why
            meta["context_lost"] = lost
            print(f"CUDA context lost, sweep stopped: {lost}", flush=True)
        for r in rows[-3:]:
            print(f"conv {r['case']:58s} {r['group']:10s} {r['status']:13s} "
                  f"pydnn {SC.fmt(r.get('ms_pydnn'), '.4f')} ms  cuDNN {SC.fmt(r.get('ms_ref'), '.4f')} ms  "
                  f"{SC.fmt(r.get('ratio'), '.2f')}x {r.get('note', '')}", flush=True)
        SC.write_partial(args.out, "sweep_conv", rows, meta)
    if (not only or "fused" in only) and not match and not meta.get("context_lost"):
        run_fused(h, QUICK_FUSED if args.quick else FUSED_LAYERS, timer, time_pair, fused_rows)
    meta["checks"] = checked
    if point_times:
        mean = sum(point_times) / len(point_times)
        meta["grid_shapes"], meta["shapes_run"] = n_run, len(point_times)
        meta["full_grid_estimate_s"] = sum(point_times) + (n_run - len(point_times)) * mean
    return SC.finish(args.out, "sweep_conv", rows, meta, budget, t0,
                     lambda note, elapsed: report(rows, fused_rows, meta, note, elapsed), plots,
                     written_rows=rows + fused_rows)


if __name__ == "__main__":
    main()
