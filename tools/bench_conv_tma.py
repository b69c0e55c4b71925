#!/usr/bin/env python3
"""fwd_tma (the warp-specialized TMA + mbarrier forward, tuning.conv.FWD_TMA; pydnn/ops/convolution/conv_tma.py)
against the plan it replaces (fwd_wgmma, FWD_TMA off) and cuDNN, bf16 NHWC, in one run, on forward rows of
the convolution sweep that run fwd_wgmma (tools/PERF.md "Session 30: conv": its main loop 0.51-0.69x cuDNN).

    python3 tools/bench_conv_tma.py [--rows 0,1,..] [--reps 5] [--budget-s S] [--out DIR]

Per row: IMPLICIT_PRECOMP_GEMM's plan with FWD_TMA off (`model`: the model's plan today, split or not), the
unsplit fwd_wgmma plan fwd_tma replaces (`wgmma`: the model's, or its 128x128 tile forced where the model's is
another kernel or split), fwd_tma (FWD_TMA "always", conv_tma._bn's tile width) and, with --bns, fwd_tma at
forced widths; each checked against PyTorch first (y poisoned, max error / max |ref| <= 2e-2), then device
ms per call from CUDA graphs of back-to-back calls (sweep_common.graph_ms), and cuDNN's conv2d through
PyTorch (cudnn.benchmark). Ratio = cuDNN ms / pydnn ms.
"""
import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (name, N, C, K, H = W, R, pad)
ROWS = [
    ("issue 3x3 64->64 @56", 64, 64, 64, 56, 3, 1),
    ("unet 3x3 256->256 @32", 128, 256, 256, 32, 3, 1),
    ("r50 3x3 512->512 @7", 128, 512, 512, 7, 3, 1),
    ("r50 3x3 128->128 @28", 32, 128, 128, 28, 3, 1),
    ("r50 3x3 256->256 @14", 32, 256, 256, 14, 3, 1),
    ("unet 3x3 128->128 @64", 32, 128, 128, 64, 3, 1),
    ("unet 3x3 64->64 @128", 8, 64, 64, 128, 3, 1),
    ("r50 1x1 256->64 @56", 32, 256, 64, 56, 1, 0),
    ("r50 1x1 512->2048 @7", 128, 512, 2048, 7, 1, 0),
    ("rand 5x5 96->192 @28", 16, 96, 192, 28, 5, 2),
    ("unet 3x3 512->512 @16", 32, 512, 512, 16, 3, 1),
]
WGM_TILE = (128, 128, 4, 1, 1)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--budget-s", type=float, default=1e9)
    ap.add_argument("--bns", default="", help="also time fwd_tma with these forced tile widths (64,128,256)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    import torch
    import pydnn
    import sweep_common as SC
    from bench import desc
    from pydnn import tuning
    from pydnn.ops.convolution import conv_tma as CTMA, plans as CP, problem as CPb

    torch.backends.cudnn.benchmark = True
    bns = [int(b) for b in args.bns.split(",") if b]
    h = pydnn.create()
    pydnn.set_stream(h, torch.cuda.current_stream().cuda_stream)
    FWD = pydnn.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM
    bf, cl = torch.bfloat16, torch.channels_last

    def timer(fn):
        return SC.graph_ms_fit(h, fn, args.reps)

    idx = [int(i) for i in args.rows.split(",") if i] or range(len(ROWS))
    rows = []
    os.makedirs(args.out, exist_ok=True)
    jf = open(os.path.join(args.out, "bench_conv_tma.jsonl"), "w")
    for i in idx:
        if time.monotonic() - t0 > args.budget_s:
            print(f"budget spent: row {i} and after not run", flush=True)
            break
        name, n, c, k, hw, r, pad = ROWS[i]
        row = dict(case=f"N{n} {name}", flops=2.0 * n * k * hw * hw * c * r * r)
        dev = SC.DEV   # "cuda" (a dry run on the CPU sets "cpu")
        x = torch.randn(n, c, hw, hw, device=dev, dtype=bf).contiguous(memory_format=cl)
        w = (torch.randn(k, c, r, r, device=dev, dtype=bf) / math.sqrt(c * r * r)).contiguous(memory_format=cl)
        y = torch.empty(n, k, hw, hw, device=dev, dtype=bf).contiguous(memory_format=cl)
        xd, yd = desc(x, dtype=pydnn.PYDNN_DATA_BFLOAT16), desc(y, dtype=pydnn.PYDNN_DATA_BFLOAT16)
        wd = pydnn.create_filter_descriptor()
        pydnn.set_filter4d_descriptor(wd, pydnn.PYDNN_DATA_BFLOAT16, pydnn.PYDNN_TENSOR_NHWC, k, c, r, r)
        conv = pydnn.create_convolution_descriptor()
        pydnn.set_convolution2d_descriptor(conv, pad, pad, 1, 1, 1, 1, pydnn.PYDNN_CROSS_CORRELATION,
                                           pydnn.PYDNN_DATA_FLOAT)
        ref = torch.nn.functional.conv2d(x, w, None, 1, pad)

        def plan_with(tma, bn, force):
            saved = tuning.conv.FWD_TMA, tuning.conv.FWD_TMA_BN, tuning.conv.TC_FORCE.get(CPb.DIR_FWD)
            try:
                tuning.conv.FWD_TMA, tuning.conv.FWD_TMA_BN = tma, bn
                if force:
                    tuning.conv.TC_FORCE[CPb.DIR_FWD] = WGM_TILE
                return CP.new_plan(h, CPb.DIR_FWD, FWD, conv, xd, wd, yd)
            finally:
                tuning.conv.FWD_TMA, tuning.conv.FWD_TMA_BN = saved[0], saved[1]
                if saved[2] is None:
                    tuning.conv.TC_FORCE.pop(CPb.DIR_FWD, None)
                else:
                    tuning.conv.TC_FORCE[CPb.DIR_FWD] = saved[2]

        def run(route, pl):
            """Check against PyTorch (y poisoned), then time: row[route + '_ms']."""
            try:
                ws = torch.empty(max(pl.workspace, 1), dtype=torch.uint8, device=dev)
                fn = lambda: CP.run_plan(h, pl, x.data_ptr(), w.data_ptr(), y.data_ptr(),  # noqa: E731
                                         ws.data_ptr(), 1.0, 0.0)
                y.fill_(float("nan"))
                fn()
                if dev == "cuda":
                    torch.cuda.synchronize()
                err = ((y.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
                row[f"{route}_err"] = err
                if not err <= 2e-2:
                    row["note"] = row.get("note", "") + f" {route} CHECK FAILED {err:.3g}"
                row[f"{route}_ms"] = timer(fn)
            except Exception as e:  # noqa: BLE001 - a failure is a row
                row["note"] = row.get("note", "") + f" {route}: {type(e).__name__}: {str(e)[:160]}"

        base = plan_with(False, None, False)   # the model's plan today (FWD_TMA off)
        row["model_kernel"] = getattr(base, "gemm_expr", type(base).__name__)
        run("model", base)
        forced = not (type(base) is CP.Plan and "fwd_wgmma<" in base.gemm_expr and base.fold is None)
        if forced:   # not an unsplit fwd_wgmma plan: fwd_wgmma's 128x128 tile forced, as fwd_tma's base
            wg = plan_with(False, None, True)
            row["wgmma_kernel"] = wg.gemm_expr
            run("wgmma", wg)
        else:
            row["wgmma_kernel"], row["wgmma_ms"] = row["model_kernel"], row.get("model_ms")
        for bn in [None] + bns:
            route = "tma" if bn is None else f"tma{bn}"
            pl = plan_with("always", bn, forced)
            if not isinstance(pl, CTMA.TmaPlan):
                row["note"] = row.get("note", "") + f" {route} not taken ({CTMA.tma_refusal(h, pl.problem)})"
                continue
            if bn is None:
                row["box"] = (pl.q.tw, pl.q.th, pl.q.tn, pl.bn)
            run(route, pl)
        if forced:
            row["forced"] = True
        row["cudnn_ms"] = timer(lambda: torch.nn.functional.conv2d(x, w, None, 1, pad))
        for route in ["model", "wgmma", "tma"] + [f"tma{b}" for b in bns]:
            if row.get(f"{route}_ms"):
                row[f"{route}_ratio"] = row["cudnn_ms"] / row[f"{route}_ms"]
                row[f"{route}_tflops"] = row["flops"] / row[f"{route}_ms"] / 1e9
        if row.get("tma_ms") and row.get("wgmma_ms"):
            row["tma_over_wgmma"] = row["wgmma_ms"] / row["tma_ms"]
        rows.append(row)
        jf.write(json.dumps(row) + "\n")
        jf.flush()
        g = lambda key, sp=".4f": format(row[key], sp) if row.get(key) is not None else "-"  # noqa: E731
        extra = "".join(f" tma{b} {g(f'tma{b}_ms')} ({g(f'tma{b}_ratio', '.3f')}x)" for b in bns)
        print(f"{row['case']:32s} model {g('model_ms')} ({g('model_ratio', '.3f')}x) wgmma {g('wgmma_ms')} "
              f"({g('wgmma_ratio', '.3f')}x) tma {g('tma_ms')} ({g('tma_ratio', '.3f')}x){extra} cuDNN {g('cudnn_ms')} "
              f"tma/wgmma speed {g('tma_over_wgmma', '.3f')} box (tw, th, tn, BN) {row.get('box')} "
              f"{'forced ' if forced else ''}{row.get('note', '')} [{row.get('model_kernel')}]", flush=True)
        x = w = y = ref = None  # noqa: F841 - freed before the next row
        torch.cuda.empty_cache()
    jf.close()
    for key in ["model_ratio", "wgmma_ratio", "tma_ratio", "tma_over_wgmma"] + [f"tma{b}_ratio" for b in bns]:
        v = [r[key] for r in rows if r.get(key)]
        if v:
            print(f"{key}: geomean {math.exp(sum(map(math.log, v)) / len(v)):.3f} over {len(v)}")
    print(f"elapsed {time.monotonic() - t0:.1f} s")
    return rows


if __name__ == "__main__":
    main()
