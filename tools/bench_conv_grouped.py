"""Grouped convolution benchmark (issue 18): ResNeXt-50 32x4d's grouped 3x3 layers, bf16 NHWC, forward /
backward data / backward filter, pydnn (the algorithm Get..._v7 ranks first, the plan's kernel named)
beside cuDNN through PyTorch (cudnn.benchmark on), in the same run.

    python3 tools/bench_conv_grouped.py              # N = 32, the 7 layers (about 20 s with compiles)
    python3 tools/bench_conv_grouped.py --n 8 --n 128
    python3 tools/bench_conv_grouped.py --n 8 --n 128 --dirs fwd,bwd_data --layers 0,1,2,3 --out $OUT
    python3 tools/bench_conv_grouped.py --n 128 --n 32 --n 8 --dirs fwd,bwd_filter --fwd-layers 4,5,6
        (every backward filter, the strided forwards: about 30 rows, ~20 s after the kernels are built)

Timing: CUDA-graph device time on both sides (sweep_common.graph_ms, as tools/sweep_conv.py), events where
a side cannot be captured (--events: always events). Each row also checks pydnn's result against PyTorch's
(max error / max |ref|; bf16 tolerance 2e-2).

Predicted (ops/convolution/grouped.py's docstring, before any device run) for N32 512->512 @14:
forward 0.020-0.025 ms, backward data 0.020-0.025 ms, backward filter 0.030-0.035 ms (cuDNN measured on
an H200 at 0.076 / 0.040 / 0.025; pydnn before this path 0.529 / 0.163 / 1.111).
"""
import argparse
import math
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pydnn  # noqa: E402
import sweep_common as SC  # noqa: E402
from bench import desc, time_ms  # noqa: E402

DIRS = ("fwd", "bwd_data", "bwd_filter")

LAYERS = [  # C = K, H = W, stride (ResNeXt-50 32x4d's grouped 3x3 convolutions, groups 32)
    (128, 56, 1), (256, 28, 1), (512, 14, 1), (1024, 7, 1), (256, 56, 2), (512, 28, 2), (1024, 14, 2)]
GROUPS = 32


def _kernel(h, direction, algo, conv, xd, wd, yd):
    from pydnn.ops.convolution import plans as CP
    pl = CP.new_plan(h, direction, algo, conv, xd, wd, yd)
    e = getattr(pl, "gemm_expr", None) or type(pl).__name__
    e = e.split("<")[0].split("::")[-1]
    if hasattr(pl, "stages"):   # grouped_direct: the ring's stages (and the backward filter's splits)
        e += f" st{pl.stages}" + (f" sp{pl.splits} r{pl.rows} nt{pl.nt} b{pl.resident}" if hasattr(pl, "partial_bytes") else "")
    return e


def _ms(h, fn, events):
    if not events:
        try:
            return SC.graph_ms(h, fn), "graph"
        except Exception:  # noqa: BLE001 - a side that cannot be captured: events
            pass
    return time_ms(fn, reps=20, warmup=3), "events"


def _err(got, want):
    got, want = got.float(), want.float()
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-30))


def layer(h, n, c, hw, stride, dirs=DIRS, events=False):
    x = torch.randn(n, c, hw, hw, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    w = (torch.randn(c, c // GROUPS, 3, 3, device="cuda", dtype=torch.bfloat16) * 0.1).to(
        memory_format=torch.channels_last)
    y = torch.nn.functional.conv2d(x, w, stride=stride, padding=1, groups=GROUPS).contiguous(
        memory_format=torch.channels_last)
    dy = torch.randn_like(y)
    dx, dw = torch.empty_like(x), torch.empty_like(w)
    dt = pydnn.PYDNN_DATA_BFLOAT16
    xd, yd = desc(x, dtype=dt), desc(y, dtype=dt)
    wd = pydnn.create_filter_descriptor()
    pydnn.set_filter4d_descriptor(wd, dt, pydnn.PYDNN_TENSOR_NHWC, *w.shape)
    conv = pydnn.create_convolution_descriptor()
    pydnn.set_convolution2d_descriptor(conv, 1, 1, stride, stride, 1, 1, pydnn.PYDNN_CROSS_CORRELATION,
                                       pydnn.PYDNN_DATA_FLOAT)
    pydnn.set_convolution_group_count(conv, GROUPS)
    fa = pydnn.get_convolution_forward_algorithm_v7(h, xd, wd, conv, yd, 1)[0].algo
    da = pydnn.get_convolution_backward_data_algorithm_v7(h, wd, yd, conv, xd, 1)[0].algo
    wa = pydnn.get_convolution_backward_filter_algorithm_v7(h, xd, yd, conv, wd, 1)[0].algo
    need = max(pydnn.get_convolution_forward_workspace_size(h, xd, wd, conv, yd, fa),
               pydnn.get_convolution_backward_data_workspace_size(h, wd, yd, conv, xd, da),
               pydnn.get_convolution_backward_filter_workspace_size(h, xd, yd, conv, wd, wa))
    ws = torch.empty(max(need, 1), dtype=torch.uint8, device="cuda")
    wsp = ws.data_ptr()
    xp, wp, yp, dyp, dxp, dwp = (t.data_ptr() for t in (x, w, y, dy, dx, dw))
    args = ([stride] * 2, [1, 1], [1, 1], False, [0, 0], GROUPS)
    rows = [
        ("fwd", fa, 0, lambda: pydnn.convolution_forward(h, 1.0, xd, xp, wd, wp, conv, fa, wsp, need, 0.0, yd, yp),
         lambda: torch.nn.functional.conv2d(x, w, stride=stride, padding=1, groups=GROUPS)),
        ("bwd data", da, 1, lambda: pydnn.convolution_backward_data(h, 1.0, wd, wp, yd, dyp, conv, da, wsp, need, 0.0,
                                                                    xd, dxp),
         lambda: torch.ops.aten.convolution_backward(dy, x, w, None, *args, [True, False, False])),
        ("bwd filter", wa, 2, lambda: pydnn.convolution_backward_filter(h, 1.0, xd, xp, yd, dyp, conv, wa, wsp, need,
                                                                        0.0, wd, dwp),
         lambda: torch.ops.aten.convolution_backward(dy, x, w, None, *args, [False, True, False])),
    ]
    outs = {0: lambda: (y, ft0()), 1: lambda: (dx, ft1()[0]), 2: lambda: (dw, ft2()[1])}
    ft0, ft1, ft2 = rows[0][4], rows[1][4], rows[2][4]
    out = []
    for what, algo, d, fp, ft in rows:
        if DIRS[d] not in dirs:
            continue
        (y, dx, dw)[d].fill_(float("nan"))   # poisoned: the check reads what pydnn wrote (y held PyTorch's)
        fp()
        torch.cuda.synchronize()
        mine, want = outs[d]()
        err = _err(mine, want)
        (ms_p, tp), (ms_t, tt) = _ms(h, fp, events), _ms(h, ft, events)
        out.append((what, algo, _kernel(h, d, algo, conv, xd, wd, yd), ms_p, ms_t, err, tp + "/" + tt))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, action="append")
    ap.add_argument("--dirs", default=",".join(DIRS), help="comma-separated: fwd, bwd_data, bwd_filter")
    ap.add_argument("--layers", default="", help="indices into LAYERS, comma-separated (default: all)")
    ap.add_argument("--fwd-layers", default="", help="the forward rows only for these LAYERS indices (default: "
                    "those of --layers)")
    ap.add_argument("--variant", action="append", default=[], help="(repeatable) ""then the rows of --variant-dirs / --variant-layers again with "
                    "these tuning settings (PYDNN_TUNING syntax), e.g. conv.GROUPED_RING_ROUNDS=0")
    ap.add_argument("--variant-n", type=int, action="append", help="the variant's N (default: --n)")
    ap.add_argument("--variant-dirs", default="fwd", help="the variant's directions (comma-separated)")
    ap.add_argument("--variant-layers", default="", help="the variant's forward rows (LAYERS indices; default: "
                    "--fwd-layers)")
    ap.add_argument("--events", action="store_true", help="event timing (default: CUDA graphs)")
    ap.add_argument("--out", default="", help="also write the table to OUT/bench_conv_grouped.txt")
    ap.add_argument("--narrow-n", type=int, action="append", default=[],
                    help="first tools/bench_conv_narrow.py's rows at these N (one process: one torch start-up)")
    a = ap.parse_args()
    dirs = tuple(a.dirs.split(","))
    layers = [LAYERS[int(i)] for i in a.layers.split(",")] if a.layers else LAYERS
    fwd_layers = [LAYERS[int(i)] for i in a.fwd_layers.split(",")] if a.fwd_layers else layers
    lines = []

    def say(t):
        print(t, flush=True)
        lines.append(t)

    torch.backends.cudnn.benchmark = True
    h = pydnn.create()
    pydnn.set_stream(h, torch.cuda.current_stream().cuda_stream)
    say(f"device: {torch.cuda.get_device_name()}  cuDNN {torch.backends.cudnn.version()}")
    say(f"{'layer':34s} {'dir':10s} {'algo':>4s} {'kernel':30s} {'pydnn ms':>9s} {'cudnn ms':>9s} {'ratio':>6s} "
        f"{'err':>8s} timing")
    if a.narrow_n:
        import bench_conv_narrow as BN
        nr = []
        for n in a.narrow_n:
            for c, k, hw in BN.LAYERS:
                for what, top, ms_p, ms_t, err, tbs, tm in BN.layer(h, n, c, k, hw):
                    nr.append(ms_t / ms_p)
                    say(f"{f'N{n} 1x1 {c}->{k} @{hw}':34s} {what:10s} v7 {top} narrow {ms_p:9.4f} {ms_t:9.4f} "
                        f"{ms_t / ms_p:6.2f}x {tbs:5.2f} TB/s {err:8.1e} {tm}" + ("  ERROR > 2e-2" if not err <= 2e-2 else ""))
        say(f"narrow geomean {math.exp(sum(math.log(r) for r in nr) / len(nr)):.3f}x cuDNN over {len(nr)} rows")
    ratios = []
    for n in a.n or [32]:
        for c, hw, stride in layers:
            name = f"N{n} 3x3 g32 {c}->{c} @{hw}" + (f" /{stride}" if stride > 1 else "")
            ldirs = tuple(d for d in dirs if d != "fwd" or (c, hw, stride) in fwd_layers)
            if not ldirs:
                continue
            for what, algo, kern, ms_p, ms_t, err, tm in layer(h, n, c, hw, stride, ldirs, a.events):
                r = ms_t / ms_p
                ratios.append(r)
                say(f"{name:34s} {what:10s} {int(algo):4d} {kern:30s} {ms_p:9.4f} {ms_t:9.4f} {r:6.2f}x "
                    f"{err:8.1e} {tm}" + ("  ERROR > 2e-2" if not err <= 2e-2 else ""))
    geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    say(f"geomean {geo:.3f}x cuDNN, min {min(ratios):.3f}x over {len(ratios)} rows")
    from pydnn import tuning
    for vi, variant in enumerate(a.variant):
        tuning.reset()   # each variant on top of PYDNN_TUNING only
        tuning.apply_environment(os.environ.get("PYDNN_TUNING", "") + ";" + variant)
        say(f"variant {vi}: {variant}")
        vlayers = [LAYERS[int(i)] for i in a.variant_layers.split(",")] if a.variant_layers else fwd_layers
        for n in a.variant_n or a.n or [32]:
            for c, hw, stride in vlayers:
                name = f"N{n} 3x3 g32 {c}->{c} @{hw}" + (f" /{stride}" if stride > 1 else "") + f" [v{vi}]"
                vdirs = tuple(d for d in a.variant_dirs.split(",") if d != "fwd" or (c, hw, stride) in fwd_layers)
                if not vdirs:
                    continue
                for what, algo, kern, ms_p, ms_t, err, tm in layer(h, n, c, hw, stride, vdirs, a.events):
                    say(f"{name:34s} {what:10s} {int(algo):4d} {kern:30s} {ms_p:9.4f} {ms_t:9.4f} "
                        f"{ms_t / ms_p:6.2f}x {err:8.1e} {tm}" + ("  ERROR > 2e-2" if not err <= 2e-2 else ""))
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "bench_conv_grouped.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
