#!/usr/bin/env python3
"""Backward data on fwd_tma (tuning.conv.DGRAD_TMA; pydnn/ops/convolution/conv_tma.py plan_dgrad_tma) against the
plan it replaces (the model's plan with DGRAD_TMA off: fwd_wgmma reading B from the filter) and cuDNN, bf16 NHWC,
in one run.

    python3 tools/bench_dgrad_tma.py [--rows 0,1,..] [--sweep] [--phases] [--swap] [--reps 5] [--budget-s S]
                                     [--out DIR]

Rows: ROWS (the backward data of bench_conv_tma.py's forward layers), or with --sweep every backward-data point of
tools/sweep_conv.py's grid that DGRAD_TMA True takes on this device (stride 1, one group; the plan is planned
here and the point kept only where it is a DgradTmaPlan), in the grid's order until --budget-s is spent.
Per row: `model` (DGRAD_TMA off: the plan fwd_tma replaces), `tma` (DGRAD_TMA "always", over fwd_wgmma's 128x128
tile forced where the model's plan is not an unsplit fwd_wgmma one: such a row says `forced`; a row where the default
True keeps fwd_wgmma (conv_tma.slower_than_replaced) says default "fwd_wgmma"), with --swap
`swap` (WGM_BWD_SWAP: filter_kc_swap into the workspace, then fwd_tma K-major); each route's dx checked against
PyTorch first (dx poisoned with NaN, max error / max |ref| <= 2e-2), then device ms per call from CUDA graphs
of back-to-back calls (sweep_common.graph_ms), and cuDNN's dgrad (aten.convolution_backward, cudnn.benchmark)
in the same run. Ratio = cuDNN ms / pydnn ms.
--phases: the grid's strided one-group points instead, whose dgrad_phases plan DGRAD_TMA_PHASES True puts on
fwd_tma (a phase at least); `model` with both switches off, `tma` with DGRAD_TMA_PHASES True. Each row says
whether fwd_tma's maps encoded (`encoded`; else its calls ran the fwd_wgmma fallback).
"""
import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (name, N, C, K, H = W, R, pad[, stride]): dx has C channels, dy K
ROWS = [
    ("issue 3x3 64->64 @56", 64, 64, 64, 56, 3, 1),
    ("unet 3x3 256->256 @32", 128, 256, 256, 32, 3, 1),
    ("r50 3x3 512->512 @7", 128, 512, 512, 7, 3, 1),
    ("r50 3x3 128->128 @28", 32, 128, 128, 28, 3, 1),
    ("r50 3x3 256->256 @14", 32, 256, 256, 14, 3, 1),
    ("unet 3x3 128->128 @64", 32, 128, 128, 64, 3, 1),
    ("unet 3x3 64->64 @128", 8, 64, 64, 128, 3, 1),
    ("r50 1x1 64->256 @56", 32, 64, 256, 56, 1, 0),
    ("r50 1x1 2048->512 @7", 128, 2048, 512, 7, 1, 0),
    ("rand 5x5 96->192 @28", 16, 96, 192, 28, 5, 2),
    ("unet 3x3 512->512 @16", 32, 512, 512, 16, 3, 1),
]
WGM_TILE = (128, 128, 4, 1, 1)


def _descs(n, c, k, hh, r, pad, stride=1):
    import pydnn
    bf = pydnn.PYDNN_DATA_BFLOAT16
    p = (hh + 2 * pad - r) // stride + 1
    xd, yd = pydnn.create_tensor_descriptor(), pydnn.create_tensor_descriptor()
    pydnn.set_tensor4d_descriptor(xd, pydnn.PYDNN_TENSOR_NHWC, bf, n, c, hh, hh)
    pydnn.set_tensor4d_descriptor(yd, pydnn.PYDNN_TENSOR_NHWC, bf, n, k, p, p)
    wd = pydnn.create_filter_descriptor()
    pydnn.set_filter4d_descriptor(wd, bf, pydnn.PYDNN_TENSOR_NHWC, k, c, r, r)
    conv = pydnn.create_convolution_descriptor()
    pydnn.set_convolution2d_descriptor(conv, pad, pad, stride, stride, 1, 1, pydnn.PYDNN_CROSS_CORRELATION,
                                       pydnn.PYDNN_DATA_FLOAT)
    return conv, xd, wd, yd


def on_tma(pl):
    """Whether a plan runs fwd_tma for backward data: a DgradTmaPlan, or a phase plan with one among its phases."""
    from pydnn.ops.convolution import conv_tma as CTMA
    subs = getattr(pl, "subs", ())
    return isinstance(pl, CTMA.DgradTmaPlan) or any(isinstance(s[0], CTMA.DgradTmaPlan) for s in subs)


def sweep_rows(h, phases=False):
    """sweep_conv's grid: its one-group points of stride 1 (phases: > 1) whose backward data DGRAD_TMA True
    (DGRAD_TMA_PHASES True) plans on fwd_tma, as ROWS entries (name, N, C, K, H, R, pad, stride), plus how many
    such one-group points were looked at."""
    import pydnn
    import sweep_conv
    from pydnn import tuning
    from pydnn.ops.convolution import plans as CP, problem as CPb

    probs, _ = sweep_conv.grid(0, False)
    out, seen, looked = [], set(), 0
    for pr in probs:
        if (pr["stride"] != 1) != phases or pr["groups"] != 1:
            continue
        key = (pr["n"], pr["c"], pr["k"], pr["h"], pr["r"], pr["pad"], pr["stride"])
        if key in seen:
            continue
        seen.add(key)
        looked += 1
        conv, xd, wd, yd = _descs(*key)
        with tuning.override({"conv.DGRAD_TMA_PHASES" if phases else "conv.DGRAD_TMA": True}):
            try:
                algo = pydnn.get_convolution_backward_data_algorithm_v7(h, wd, yd, conv, xd, 1)[0].algo
                pl = CP.new_plan(h, CPb.DIR_BWD_DATA, algo, conv, xd, wd, yd)
            except pydnn.PydnnError:
                continue
        if on_tma(pl):
            out.append((sweep_conv.case_name(pr),) + key)
    return out, looked


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="")
    ap.add_argument("--sweep", action="store_true", help="the sweep's backward-data points DGRAD_TMA takes")
    ap.add_argument("--phases", action="store_true", help="the sweep's strided points DGRAD_TMA_PHASES takes")
    ap.add_argument("--swap", action="store_true", help="also time the swap route (WGM_BWD_SWAP)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--budget-s", type=float, default=1e9)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    import torch
    import pydnn
    import sweep_common as SC
    from pydnn import tuning
    from pydnn.ops.convolution import conv_tma as CTMA, plans as CP, problem as CPb

    torch.backends.cudnn.benchmark = True
    h = pydnn.create()
    pydnn.set_stream(h, torch.cuda.current_stream().cuda_stream)
    BWD = pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_1
    bf, cl = torch.bfloat16, torch.channels_last

    def timer(fn):
        return SC.graph_ms_fit(h, fn, args.reps)

    if args.sweep or args.phases:
        table, looked = sweep_rows(h, args.phases)
        print(f"sweep: {len(table)} of {looked} {'strided' if args.phases else 'stride-1'} one-group shapes planned "
              f"on fwd_tma by {'DGRAD_TMA_PHASES' if args.phases else 'DGRAD_TMA'} True", flush=True)
    else:
        table = ROWS
    switch = "conv.DGRAD_TMA_PHASES" if args.phases else "conv.DGRAD_TMA"
    idx = [int(i) for i in args.rows.split(",") if i] or range(len(table))
    rows = []
    os.makedirs(args.out, exist_ok=True)
    jf = open(os.path.join(args.out, "bench_dgrad_tma.jsonl"), "w")
    for i in idx:
        if time.monotonic() - t0 > args.budget_s:
            print(f"budget spent: row {i} and after not run", flush=True)
            break
        name, n, c, k, hw, r, pad, stride = (tuple(table[i]) + (1,))[:8]
        p = (hw + 2 * pad - r) // stride + 1
        row = dict(case=name if args.sweep or args.phases else f"N{n} {name}", flops=2.0 * n * k * p * p * c * r * r)
        dev = SC.DEV
        x = torch.empty(n, c, hw, hw, device=dev, dtype=bf).contiguous(memory_format=cl)
        w = (torch.randn(k, c, r, r, device=dev, dtype=bf) / math.sqrt(k * r * r)).contiguous(memory_format=cl)
        dy = torch.randn(n, k, p, p, device=dev, dtype=bf).contiguous(memory_format=cl)
        dx = torch.empty_like(x)
        conv, xd, wd, yd = _descs(n, c, k, hw, r, pad, stride)
        def cudnn():
            return torch.ops.aten.convolution_backward(dy, x, w, None, [stride] * 2, [pad, pad], [1, 1], False,
                                                       [0, 0], 1, [True, False, False])[0]
        ref = cudnn().float()

        def plan_with(mode, swap, force):
            over = {switch: mode, "conv.WGM_BWD_SWAP": swap}
            saved = tuning.conv.TC_FORCE.get(CPb.DIR_BWD_DATA)
            try:
                if force:
                    tuning.conv.TC_FORCE[CPb.DIR_BWD_DATA] = WGM_TILE
                with tuning.override(over):
                    return CP.new_plan(h, CPb.DIR_BWD_DATA, BWD, conv, xd, wd, yd)
            finally:
                if saved is None:
                    tuning.conv.TC_FORCE.pop(CPb.DIR_BWD_DATA, None)
                else:
                    tuning.conv.TC_FORCE[CPb.DIR_BWD_DATA] = saved

        def run(route, pl):
            """Check against PyTorch (dx poisoned), then time: row[route + '_ms']."""
            try:
                ws = torch.empty(max(pl.workspace, 1), dtype=torch.uint8, device=dev)
                fn = lambda: CP.run_plan(h, pl, dy.data_ptr(), w.data_ptr(), dx.data_ptr(),  # noqa: E731
                                         ws.data_ptr(), 1.0, 0.0)
                dx.fill_(float("nan"))
                fn()
                if dev == "cuda":
                    torch.cuda.synchronize()
                err = ((dx.float() - ref).abs().max() / ref.abs().max()).item()
                row[f"{route}_err"] = err
                if not err <= 2e-2:
                    row["note"] = row.get("note", "") + f" {route} CHECK FAILED {err:.3g}"
                row[f"{route}_ms"] = timer(fn)
            except Exception as e:  # noqa: BLE001 - a failure is a row
                row["note"] = row.get("note", "") + f" {route}: {type(e).__name__}: {str(e)[:160]}"

        base = plan_with(False, False, False)
        row["model_kernel"] = getattr(base, "gemm_expr", type(base).__name__)
        run("model", base)
        forced = not args.phases and not (type(base) is CP.Plan and "fwd_wgmma<" in base.gemm_expr
                                          and base.fold is None)
        routes = [("tma", False)] + ([("swap", True)] if args.swap else [])
        for route, swap in routes:
            pl = plan_with("always", swap, forced)
            if route == "tma" and not forced and not args.phases and not on_tma(plan_with(True, False, False)):
                row["default"] = "fwd_wgmma"   # DGRAD_TMA True keeps the replaced plan here (slower_than_replaced)
            if not on_tma(pl):
                row["note"] = row.get("note", "") + f" {route} not taken ({CTMA.dgrad_refusal(h, pl.problem, swap)})"
                continue
            tp = [s[0] for s in pl.subs if isinstance(s[0], CTMA.DgradTmaPlan)] if args.phases else [pl]
            if route == "tma":
                boxes = [(t.q.tw, t.q.th, t.q.tn, t.bn) for t in tp]
                row["box"] = boxes if args.phases else boxes[0]
            run(route, pl)
            row[f"{route}_encoded"] = all(len(t.maps[1].known) > 0 for t in tp)   # else the fallback ran
            if not row[f"{route}_encoded"]:
                row["note"] = row.get("note", "") + f" {route}: maps not encoded (the fwd_wgmma fallback ran)"
        if forced:
            row["forced"] = True
        row["cudnn_ms"] = timer(cudnn)
        for route in ["model", "tma", "swap"]:
            if row.get(f"{route}_ms"):
                row[f"{route}_ratio"] = row["cudnn_ms"] / row[f"{route}_ms"]
                row[f"{route}_tflops"] = row["flops"] / row[f"{route}_ms"] / 1e9
        if row.get("tma_ms") and row.get("model_ms"):
            row["tma_over_model"] = row["model_ms"] / row["tma_ms"]
        rows.append(row)
        jf.write(json.dumps(row) + "\n")
        jf.flush()
        g = lambda key, sp=".4f": format(row[key], sp) if row.get(key) is not None else "-"  # noqa: E731
        sw = f" swap {g('swap_ms')} ({g('swap_ratio', '.3f')}x)" if args.swap else ""
        marks = ("forced " if forced else "") + ("(default: fwd_wgmma) " if row.get("default") else "")
        print(f"{row['case']:44s} model {g('model_ms')} ({g('model_ratio', '.3f')}x) tma {g('tma_ms')} "
              f"({g('tma_ratio', '.3f')}x){sw} cuDNN {g('cudnn_ms')} tma/model speed {g('tma_over_model', '.3f')} "
              f"box {row.get('box')} {marks}{row.get('note', '')} [{row.get('model_kernel')}]", flush=True)
        x = w = dy = dx = ref = None  # noqa: F841 - freed before the next row
        torch.cuda.empty_cache()
    jf.close()
    for key in ["model_ratio", "tma_ratio", "swap_ratio", "tma_over_model"]:
        v = [r[key] for r in rows if r.get(key)]
        if v:
            print(f"{key}: geomean {math.exp(sum(map(math.log, v)) / len(v)):.3f} over {len(v)} "
                  f"(min {min(v):.3f}, max {max(v):.3f})")
    print(f"elapsed {time.monotonic() - t0:.1f} s")
    return rows


if __name__ == "__main__":
    main()
