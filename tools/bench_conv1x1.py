#!/usr/bin/env python3
"""1x1 convolutions (issue 18): pydnn's implicit GEMMs against the 1x1-as-matmul routes and cuDNN, bf16 NHWC,
forward and backward data, in one run.

    python3 tools/bench_conv1x1.py [--out DIR] [--reps 5] [--quick] [--shapes a,b] [--find]

Per shape: forward IMPLICIT_PRECOMP_GEMM (fwd_wgmma / implicit_gemm_pipe_tc) and FWD_ALGO_GEMM (one
pydnn.ops.matmul on x itself for stride 1, the gather + matmul for a strided 1x1); backward data ALGO_1
(the implicit GEMMs, stride phases) and ALGO_0 (its 16-bit 1x1 GEMM form: one matmul into dx, or into a
column matrix + col2im when strided); the algorithm Get..._v7 puts first (its pick and modelled ms for
each route); cuDNN through PyTorch (cudnn.benchmark on) in the same run. Every pydnn route is checked
against PyTorch first (its output poisoned with NaN; max error / max |ref|, bf16 tolerance 2e-2).
Timing: tools/bench.py's time_ms (events, back-to-back calls, median). Ratio = cuDNN ms / pydnn ms.

The shapes: the issue "Convolution"'s two 1x1 layers at N = 64, ResNet-50's 1x1 layers (stride 1 and the
strided downsamples) at N = 8 / 32 / 128, and the sweep's random 1x1 shapes that ran below 0.7x.
"""
import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# (name, N, C, K, H, stride)
SHAPES = [
    ("issue 1x1 256->64 @56", 64, 256, 64, 56, 1),
    ("issue 1x1 64->256 @56", 64, 64, 256, 56, 1),
    ("r50 l3 1x1 512->256 @28", 128, 512, 256, 28, 1),
    ("r50 l1 1x1 256->64 @56", 128, 256, 64, 56, 1),
    ("r50 l1 1x1 64->64 @56", 128, 64, 64, 56, 1),
    ("r50 l3 1x1 1024->256 @14", 128, 1024, 256, 14, 1),
    ("r50 l4 1x1 512->2048 @7", 128, 512, 2048, 7, 1),
    ("r50 l4 1x1 2048->512 @7", 128, 2048, 512, 7, 1),
    ("r50 l2 ds 1x1/2 256->512 @56", 128, 256, 512, 56, 2),
    ("r50 l4 ds 1x1/2 1024->2048 @14", 128, 1024, 2048, 14, 2),
    ("r50 l4 1x1 512->2048 @7", 32, 512, 2048, 7, 1),
    ("r50 l3 1x1 256->1024 @14", 32, 256, 1024, 14, 1),
    ("r50 l3 1x1 1024->256 @14", 8, 1024, 256, 14, 1),
    ("r50 l1 1x1 64->64 @56", 8, 64, 64, 56, 1),
    ("r50 l4 1x1 2048->512 @7", 8, 2048, 512, 7, 1),
    ("rand 1x1 176->752 @37", 93, 176, 752, 37, 1),
    ("rand 1x1 32->400 @32", 122, 32, 400, 32, 1),
    ("rand 1x1 40->280 @49", 99, 40, 280, 49, 1),
    ("rand 1x1/2 56->440 @45", 54, 56, 440, 45, 2),
]
QUICK = [0, 1, 2, 8, 12, 15]


def _setup(pydnn, torch, n, c, k, hh, s):
    from bench import desc
    cl, bf, pdt = torch.channels_last, torch.bfloat16, pydnn.PYDNN_DATA_BFLOAT16
    p = (hh - 1) // s + 1
    t = dict(x=torch.randn(n, c, hh, hh, device="cuda", dtype=bf).contiguous(memory_format=cl),
             w=(torch.randn(k, c, 1, 1, device="cuda", dtype=bf) / math.sqrt(c)).contiguous(memory_format=cl),
             y=torch.empty(n, k, p, p, device="cuda", dtype=bf).contiguous(memory_format=cl))
    t["dy"], t["dx"] = torch.randn_like(t["y"]), torch.empty_like(t["x"])
    t["xd"], t["yd"] = desc(t["x"], dtype=pdt), desc(t["y"], dtype=pdt)
    t["wd"] = pydnn.create_filter_descriptor()
    pydnn.set_filter4d_descriptor(t["wd"], pdt, pydnn.PYDNN_TENSOR_NHWC, k, c, 1, 1)
    t["conv"] = pydnn.create_convolution_descriptor()
    pydnn.set_convolution2d_descriptor(t["conv"], 0, 0, s, s, 1, 1, pydnn.PYDNN_CROSS_CORRELATION, pydnn.PYDNN_DATA_FLOAT)
    return t


def _label(pl):
    expr = getattr(pl, "gemm_expr", "") or type(pl).__name__
    head, _, args = expr.partition("<")
    return f"{head.split('::')[-1]}<{args.split(', ', 1)[-1]}" if ", " in args else head.split("::")[-1]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--shapes", default="", help="indices into SHAPES, comma-separated")
    ap.add_argument("--budget-s", type=float, default=1e9, help="stop starting shapes after this many seconds")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    import torch
    import pydnn
    from bench import time_ms
    from pydnn.ops.convolution import algorithms as A, plans as P, problem as Pb

    torch.backends.cudnn.benchmark = True
    h = pydnn.create()
    pydnn.set_stream(h, torch.cuda.current_stream().cuda_stream)
    idx = [int(i) for i in args.shapes.split(",") if i] or (QUICK if args.quick else range(len(SHAPES)))
    FWD_I, FWD_G = pydnn.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, pydnn.PYDNN_CONVOLUTION_FWD_ALGO_GEMM
    BWD_1, BWD_0 = pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_1, pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_0
    rows = []
    os.makedirs(args.out, exist_ok=True)
    jpath = os.path.join(args.out, "bench_conv1x1.jsonl")
    jf = open(jpath, "w")
    for i in idx:
        if time.monotonic() - t0 > args.budget_s:
            print(f"budget spent: shape {i} and after not run")
            break
        name, n, c, k, hh, s = SHAPES[i]
        t = _setup(pydnn, torch, n, c, k, hh, s)
        x, w, y, dy, dx = t["x"], t["w"], t["y"], t["dy"], t["dx"]
        xd, yd, wd, conv = t["xd"], t["yd"], t["wd"], t["conv"]
        flops = 2 * n * k * y.shape[2] * y.shape[3] * c
        for d in ("fwd", "bwd data"):
            row = dict(case=f"N{n} {name}", dir=d, flops=flops)
            if d == "fwd":
                direction, algos = Pb.DIR_FWD, {"implicit": FWD_I, "gemm": FWD_G}
                v7 = pydnn.get_convolution_forward_algorithm_v7(h, xd, wd, conv, yd, 8)
                ref_fn = lambda: torch.nn.functional.conv2d(x, w, None, s)  # noqa: E731
                out = y
            else:
                direction, algos = Pb.DIR_BWD_DATA, {"implicit": BWD_1, "gemm": BWD_0}
                v7 = pydnn.get_convolution_backward_data_algorithm_v7(h, wd, yd, conv, xd, 6)
                ref_fn = lambda: torch.ops.aten.convolution_backward(  # noqa: E731
                    dy, x, w, None, [s, s], [0, 0], [1, 1], False, [0, 0], 1, [True, False, False])[0]
                out = dx
            row["v7"] = v7[0].algo
            ref = ref_fn()
            for route, algo in algos.items():
                try:
                    pl = P.new_plan(h, direction, algo, conv, xd, wd, yd)
                    row[f"{route}_model_ms"] = A._estimate_ms(h, pl)
                    row[f"{route}_kernel"] = _label(pl)
                    ws_n = pl.workspace
                    ws = torch.empty(max(ws_n, 1), dtype=torch.uint8, device="cuda")
                    if d == "fwd":
                        fn = lambda ws=ws, ws_n=ws_n, algo=algo: pydnn.convolution_forward(  # noqa: E731
                            h, 1.0, xd, x.data_ptr(), wd, w.data_ptr(), conv, algo, ws.data_ptr(), ws_n, 0.0, yd,
                            y.data_ptr())
                    else:
                        fn = lambda ws=ws, ws_n=ws_n, algo=algo: pydnn.convolution_backward_data(  # noqa: E731
                            h, 1.0, wd, w.data_ptr(), yd, dy.data_ptr(), conv, algo, ws.data_ptr(), ws_n, 0.0, xd,
                            dx.data_ptr())
                    out.fill_(float("nan"))
                    fn()
                    err = ((out.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-30)).item()
                    row[f"{route}_err"] = err
                    row[f"{route}_ms"] = time_ms(fn, reps=args.reps, warmup=1)
                    if not (err <= 2e-2):
                        row[f"{route}_note"] = f"CHECK FAILED {err:.3g}"
                except Exception as e:  # noqa: BLE001 - a failure is a row
                    row[f"{route}_note"] = f"{type(e).__name__}: {str(e)[:160]}"
            row["cudnn_ms"] = time_ms(ref_fn, reps=args.reps, warmup=2)
            for route in algos:
                if f"{route}_ms" in row:
                    row[f"{route}_ratio"] = row["cudnn_ms"] / row[f"{route}_ms"]
            pick = "gemm" if row["v7"] == algos["gemm"] else "implicit" if row["v7"] == algos["implicit"] else None
            row["v7_route"] = pick
            if pick and f"{pick}_ms" in row:
                row["v7_ratio"] = row["cudnn_ms"] / row[f"{pick}_ms"]
            rows.append(row)
            jf.write(json.dumps(row) + "\n")
            jf.flush()
            f = lambda key: f"{row[key]:.4f}" if key in row else "-"  # noqa: E731
            r = lambda key: f"{row[key]:.2f}x" if key in row else "-"  # noqa: E731
            print(f"{row['case']:36s} {d:8s} impl {f('implicit_ms')} ({r('implicit_ratio')}) "
                  f"gemm {f('gemm_ms')} ({r('gemm_ratio')}) cudnn {f('cudnn_ms')} v7 {pick} "
                  f"model {f('implicit_model_ms')}/{f('gemm_model_ms')} "
                  f"{row.get('gemm_kernel', '')} {row.get('implicit_note', '')} {row.get('gemm_note', '')}",
                  flush=True)
        del t
        torch.cuda.empty_cache()
    jf.close()
    lines = ["# 1x1 convolutions, bf16 NHWC: implicit GEMM vs matmul vs cuDNN",
             f"{torch.cuda.get_device_name()}, cuDNN {torch.backends.cudnn.version()}; ratio = cuDNN / pydnn", "",
             "| shape | dir | implicit ms | gemm ms | cuDNN ms | implicit x | gemm x | v7 | v7 x | model impl / gemm | gemm kernel |",
             "|---|---|---:|---:|---:|---:|---:|---|---:|---|---|"]
    for row in rows:
        g = lambda key, sp=".4f": format(row[key], sp) if key in row else "-"  # noqa: E731
        lines.append(f"| {row['case']} | {row['dir']} | {g('implicit_ms')} | {g('gemm_ms')} | {g('cudnn_ms')} | "
                     f"{g('implicit_ratio', '.2f')} | {g('gemm_ratio', '.2f')} | {row.get('v7_route')} | "
                     f"{g('v7_ratio', '.2f')} | {g('implicit_model_ms')} / {g('gemm_model_ms')} | "
                     f"{row.get('gemm_kernel', '')} |")
    for d in ("fwd", "bwd data"):
        for key in ("implicit_ratio", "gemm_ratio", "v7_ratio"):
            v = [row[key] for row in rows if row["dir"] == d and key in row]
            if v:
                lines.append(f"\n{d} {key}: geomean {math.exp(sum(map(math.log, v)) / len(v)):.3f} over {len(v)}")
        best = [max(row.get("implicit_ratio", 0), row.get("gemm_ratio", 0)) for row in rows if row["dir"] == d]
        if best:
            lines.append(f"{d} best-of-both: geomean {math.exp(sum(math.log(max(b, 1e-9)) for b in best) / len(best)):.3f}")
    md = "\n".join(lines) + f"\n\nelapsed {time.monotonic() - t0:.1f} s\n"
    with open(os.path.join(args.out, "bench_conv1x1.md"), "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()
