#!/usr/bin/env python3
"""Two routes onto fwd_tma (pydnn/ops/convolution/conv_tma.py) against the plans they replace and cuDNN, bf16 NHWC,
in one run:
  --set 1x1      tuning.conv.TMA_1X1 (conv_tma.gemm1x1_top): the direct 1x1 GEMM plans (gemm.py's matmul on x / dy
                 itself) whose matmul runs the mma.sync gemm_tc tile, forward and backward data;
  --set strided  tuning.conv.FWD_TMA_STRIDED: strided forwards (x's TMA box walks every stride-th pixel) in place of
                 their fwd_wgmma plan;
  --set wide     tuning.conv.FWD_TMA_WIDE: the stride-1 forwards already on fwd_tma, the 16-byte epilogue store on
                 (`tma`) against off (`model`); use with --wide 0;
  --set few      stride-1 forwards / backward data whose plan stays off fwd_tma today (fwd_wgmma split-K over too
                 few blocks, or kept by conv_tma.slower_than_replaced): fwd_tma whole (FEW_ON) against that plan;
  --set wgrad    tuning.conv.WGRAD_MM: the 1x1 stride-1 backward filters as one matmul with its split-K
                 (pydnn/ops/convolution/wgrad_mm.py; the `tma` route is that plan here), against the v7 plan.

    python3 tools/bench_conv_tma_routes.py --set 1x1|strided|wide|few|wgrad [--rows 0,1,..] [--bns 64,128,256] [--reps 5]
                                           [--budget-s S] [--out DIR]

Rows: every point of tools/sweep_conv.py's grid (forward / backward data) whose Get..._v7 plan the set's switch moves
to fwd_tma on this device (planned here with the switch "always" and off; `default_takes`: whether its True rules take
the point), in the grid's order until --budget-s is spent.
Per row: `model` (the switch off: the plan it replaces), `tma` (on, conv_tma._bn's tile width) and `bn<W>` (the width
forced through tuning.conv.FWD_TMA_BN) for each --bns width other than the chooser's; each route's output checked
against PyTorch first (poisoned with NaN, max error / max |ref| <= 2e-2), then device ms per call from CUDA graphs of
back-to-back calls (sweep_common.graph_ms), and cuDNN (conv2d / aten.convolution_backward, cudnn.benchmark) in the
same run; with --wide 1 (default) also `wide` / `wide<W>`: the same with the 16-byte store (tuning.conv.FWD_TMA_WIDE);
--set 1x1 with --mmtma 1 (default) also `mmtma`: the GEMM plan with its matmul on gemm_tma (matmul's persistent TMA
tile, which it takes only from K >= 256 / 512 today: the limits lowered for that plan only).
Ratio = cuDNN ms / pydnn ms. `GB/s`: x (or dy) read once and y (or dx) written once over the time.
"""
import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_dgrad_tma import _descs  # noqa: E402 - bf16 NHWC descriptors of (n, c, k, h, r, pad, stride)


SWITCH = {"1x1": "conv.TMA_1X1", "strided": "conv.FWD_TMA_STRIDED", "wide": "conv.FWD_TMA_WIDE", "few": "few",
          "wgrad": "conv.WGRAD_MM"}
# --set few: the stride-1 points whose v7 plan stays off fwd_tma (fwd_wgmma split-K over too few blocks, or kept by
# conv_tma.slower_than_replaced): on = fwd_tma taken whole ("always", no split), off = the defaults
FEW_ON = {"conv.FWD_TMA": "always", "conv.DGRAD_TMA": "always", "conv.WGM_SPLIT": 1}


def _switches(switch, mode):
    """The overrides of a set's switch at mode (False / True / "always")."""
    if switch == "few":
        return dict(FEW_ON) if mode else {}
    return {switch: mode}


def _v7(h, d, conv, xd, wd, yd):
    import pydnn
    if d == "fwd":
        return pydnn.get_convolution_forward_algorithm_v7(h, xd, wd, conv, yd, 1)[0].algo
    if d == "bwd filter":
        return pydnn.get_convolution_backward_filter_algorithm_v7(h, xd, yd, conv, wd, 1)[0].algo
    return pydnn.get_convolution_backward_data_algorithm_v7(h, wd, yd, conv, xd, 1)[0].algo


def _moved(pl):
    """Whether a plan is one of the routes this tool compares (fwd_tma's, or the 1x1 backward filter's matmul)."""
    from pydnn.ops.convolution import conv_tma as CTMA, wgrad_mm as WM
    return isinstance(pl, (CTMA.TmaPlan, WM.WgradMMPlan))


def sweep_rows(h, which="1x1"):
    """sweep_conv's grid: the one-group (direction, point)s whose v7 plan the set's switch moves to fwd_tma (1x1: 1x1
    stride-1 forward and backward data; strided: stride > 1 forward), as (name, direction, N, C, K, H, R, pad,
    stride), plus how many candidate points were looked at."""
    import pydnn
    import sweep_conv
    from pydnn import tuning
    from pydnn.ops.convolution import conv_tma as CTMA, plans as CP, problem as CPb

    probs, _ = sweep_conv.grid(0, False)
    out, seen, looked = [], set(), 0
    dirs = ((("fwd", CPb.DIR_FWD), ("bwd data", CPb.DIR_BWD_DATA)) if which in ("1x1", "few")
            else (("bwd filter", CPb.DIR_BWD_FILTER),) if which == "wgrad" else (("fwd", CPb.DIR_FWD),))
    for pr in probs:
        if pr["groups"] != 1:
            continue
        if which in ("1x1", "wgrad") and (pr["r"] != 1 or pr["stride"] != 1 or pr["pad"] != 0):
            continue
        if (which == "strided" and pr["stride"] == 1) or (which in ("wide", "few") and pr["stride"] != 1):
            continue
        key = (pr["n"], pr["c"], pr["k"], pr["h"], pr["r"], pr["pad"], pr["stride"])
        if key in seen:
            continue
        seen.add(key)
        looked += 1
        conv, xd, wd, yd = _descs(*key)
        for d, D in dirs:
            try:
                algo = _v7(h, d, conv, xd, wd, yd)
                with tuning.override(_switches(SWITCH[which], "always")):
                    pl = CP.new_plan(h, D, algo, conv, xd, wd, yd)
                with tuning.override(_switches(SWITCH[which], False)):
                    base = CP.new_plan(h, D, algo, conv, xd, wd, yd)
            except pydnn.PydnnError:
                continue
            if which == "wide":   # the stride-1 forwards already on fwd_tma: the 16-byte store on / off
                if isinstance(pl, CTMA.TmaPlan) and pl.wide_ok:
                    out.append((sweep_conv.case_name(pr), d) + key)
            elif _moved(pl) and not _moved(base):
                out.append((sweep_conv.case_name(pr), d) + key)
    return out, looked


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--set", default="1x1", choices=sorted(SWITCH))
    ap.add_argument("--rows", default="")
    ap.add_argument("--bns", default="64,128,256", help="tile widths to force beside the chooser's")
    ap.add_argument("--wide", type=int, default=1, help="1: also time the 16-byte store (FWD_TMA_WIDE)")
    ap.add_argument("--mmtma", type=int, default=1, help="--set 1x1: also time matmul's gemm_tma on the GEMM plan")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--budget-s", type=float, default=1e9)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    import torch
    import pydnn
    import sweep_common as SC
    import sweep_conv
    from pydnn import tuning
    from pydnn.ops.convolution import conv_tma as CTMA, plans as CP, problem as CPb

    torch.backends.cudnn.benchmark = True
    h = pydnn.create()
    pydnn.set_stream(h, torch.cuda.current_stream().cuda_stream)
    bf, cl = torch.bfloat16, torch.channels_last

    def timer(fn):
        return SC.graph_ms_fit(h, fn, args.reps)

    table, looked = sweep_rows(h, args.set)
    switch = SWITCH[args.set]
    print(f"sweep: {len(table)} (direction, point)s of {looked} one-group shapes ({args.set}) moved to fwd_tma by "
          f"{switch} True", flush=True)
    idx = [int(i) for i in args.rows.split(",") if i] or range(len(table))
    bns = [int(b) for b in args.bns.split(",") if b]
    rows = []
    os.makedirs(args.out, exist_ok=True)
    jf = open(os.path.join(args.out, f"bench_conv_tma_{args.set}.jsonl"), "w")
    for i in idx:
        if time.monotonic() - t0 > args.budget_s:
            print(f"budget spent: row {i} and after not run", flush=True)
            break
        name, d, n, c, k, hw, r, pad, stride = table[i]
        fwd = d == "fwd"
        D = {"fwd": CPb.DIR_FWD, "bwd data": CPb.DIR_BWD_DATA, "bwd filter": CPb.DIR_BWD_FILTER}[d]
        p = sweep_conv.out_hw(hw, r, stride, pad)
        row = dict(case=name, direction=d, flops=2.0 * n * k * p * p * c * r * r,
                   bytes=2.0 * (n * hw * hw * c + n * p * p * k + c * k * r * r))
        dev = SC.DEV
        x = torch.randn(n, c, hw, hw, device=dev, dtype=bf).contiguous(memory_format=cl)
        w = (torch.randn(k, c, r, r, device=dev, dtype=bf) / math.sqrt((c if fwd else k) * r * r)).contiguous(
            memory_format=cl)
        dy = torch.randn(n, k, p, p, device=dev, dtype=bf).contiguous(memory_format=cl)
        out = torch.empty_like(dy if fwd else w if d == "bwd filter" else x)
        conv, xd, wd, yd = _descs(n, c, k, hw, r, pad, stride)
        algo = _v7(h, d, conv, xd, wd, yd)
        row["algo"] = algo

        if fwd:
            def cudnn():
                return torch.nn.functional.conv2d(x, w, None, stride, pad)
            a_ptr, b_ptr = x.data_ptr(), w.data_ptr()
        elif d == "bwd filter":
            def cudnn():
                return torch.ops.aten.convolution_backward(dy, x, w, None, [stride] * 2, [pad] * 2, [1, 1], False,
                                                           [0, 0], 1, [False, True, False])[1]
            a_ptr, b_ptr = dy.data_ptr(), x.data_ptr()
        else:
            def cudnn():
                return torch.ops.aten.convolution_backward(dy, x, w, None, [stride] * 2, [pad] * 2, [1, 1], False,
                                                           [0, 0], 1, [True, False, False])[0]
            a_ptr, b_ptr = dy.data_ptr(), w.data_ptr()
        ref = cudnn().float()

        def plan_with(mode, bn=None, wide=False):
            with tuning.override({"conv.FWD_TMA_BN": bn, "conv.FWD_TMA_WIDE": wide, **_switches(switch, mode)}):
                return CP.new_plan(h, D, algo, conv, xd, wd, yd)

        def run(route, pl):
            """Check against PyTorch (output poisoned), then time: row[route + '_ms']."""
            try:
                ws = torch.empty(max(pl.workspace, 1), dtype=torch.uint8, device=dev)
                fn = lambda: CP.run_plan(h, pl, a_ptr, b_ptr, out.data_ptr(), ws.data_ptr(), 1.0, 0.0)  # noqa: E731
                out.fill_(float("nan"))
                fn()
                if dev == "cuda":
                    torch.cuda.synchronize()
                err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
                row[f"{route}_err"] = err
                if not err <= 2e-2:
                    row["note"] = row.get("note", "") + f" {route} CHECK FAILED {err:.3g}"
                row[f"{route}_ms"] = timer(fn)
                if isinstance(pl, CTMA.TmaPlan) and not pl.maps[1].known:
                    row["note"] = row.get("note", "") + f" {route}: maps not encoded (the fallback ran)"
            except Exception as e:  # noqa: BLE001 - a failure is a row
                row["note"] = row.get("note", "") + f" {route}: {type(e).__name__}: {str(e)[:160]}"

        base = plan_with(False)
        row["model_kernel"] = getattr(base, "gemm_expr", type(base).__name__)
        run("model", base)
        if args.set == "1x1" and args.mmtma:
            # for comparison: the same GEMM plan on matmul's persistent gemm_tma, which pydnn.ops.matmul takes only
            # from K >= WG_PERSIST_MIN_K / WG_MIN_K (the limits lowered here for this plan only)
            from pydnn.ops import matmul as MM
            saved = MM.WG_MIN_K, tuning.matmul.WG_PERSIST_MIN_K
            try:
                MM.WG_MIN_K = tuning.matmul.WG_PERSIST_MIN_K = 16
                mp_plan = plan_with(False)
            finally:
                MM.WG_MIN_K, tuning.matmul.WG_PERSIST_MIN_K = saved
            mm = mp_plan.mm[0] if fwd else mp_plan.mm
            row["mmtma_kernel"] = (mm.tma or mm.fast).expr.replace("pydnn::matmul::", "").replace("pydnn::", "")[:60]
            if mm.tma is not None:
                run("mmtma", mp_plan)
            else:
                row["note"] = row.get("note", "") + " mmtma: matmul did not take gemm_tma"
        tp = plan_with("always")
        row["default_takes"] = _moved(plan_with(True)) if args.set != "wide" else True   # (the switch's True rules)
        routes = ["model"] + (["mmtma"] if row.get("mmtma_ms") else [])
        if _moved(tp) and not isinstance(tp, CTMA.TmaPlan):   # the 1x1 backward filter on matmul
            row["mm_kernel"] = tp.gemm_expr.replace("pydnn::matmul::", "").replace("pydnn::", "")[:60]
            row["mm_split"] = tp.mm.split
            run("tma", tp)
            routes.append("tma")
        elif isinstance(tp, CTMA.TmaPlan):
            row["bn"], row["items"], row["box"] = tp.bn, tp.items, (tp.q.tw, tp.q.th, tp.q.tn)
            run("tma", tp)
            routes.append("tma")
            for bn in bns:
                if bn != tp.bn:
                    run(f"bn{bn}", plan_with("always", bn))
                    routes.append(f"bn{bn}")
            if args.wide:   # the 16-byte store (FWD_TMA_WIDE) at the chooser's width and the forced ones
                for bn in [None] + [b for b in bns if b != tp.bn]:
                    wp = plan_with("always", bn, True)
                    route = "wide" if bn is None else f"wide{bn}"
                    if not wp.wide_ok:
                        row["note"] = row.get("note", "") + f" {route}: not taken"
                        continue
                    run(route, wp)
                    routes.append(route)
        else:
            row["note"] = row.get("note", "") + f" not moved ({type(tp).__name__})"
        row["cudnn_ms"] = timer(cudnn)
        routes.append("cudnn")
        for route in routes:
            if row.get(f"{route}_ms"):
                row[f"{route}_ratio"] = row["cudnn_ms"] / row[f"{route}_ms"]
                row[f"{route}_gbps"] = row["bytes"] / row[f"{route}_ms"] / 1e6
        if row.get("tma_ms") and row.get("model_ms"):
            row["tma_over_model"] = row["model_ms"] / row["tma_ms"]
        best = min((r for r in routes if r not in ("model", "cudnn") and row.get(f"{r}_ms")),
                   key=lambda r: row[f"{r}_ms"], default=None)
        row["best"] = best
        rows.append(row)
        jf.write(json.dumps(row) + "\n")
        jf.flush()
        g = lambda key, sp=".4f": format(row[key], sp) if row.get(key) is not None else "-"  # noqa: E731
        extra = " ".join(f"{r} {g(f'{r}_ms')}" for r in routes if r not in ("model", "tma", "cudnn", "mmtma"))
        if row.get("mmtma_ms"):
            extra = f"mmtma {g('mmtma_ms')} ({g('mmtma_ratio', '.3f')}x) " + extra
        print(f"{d:8s} {name:52s} model {g('model_ms')} ({g('model_ratio', '.3f')}x, {g('model_gbps', '.0f')} GB/s) "
              f"tma {g('tma_ms')} ({g('tma_ratio', '.3f')}x, {g('tma_gbps', '.0f')} GB/s) BN {row.get('bn')} {extra} "
              f"cuDNN {g('cudnn_ms')} ({g('cudnn_gbps', '.0f')} GB/s) tma/model {g('tma_over_model', '.3f')} "
              f"items {row.get('items')} {row.get('note', '')}"
              + (f" [{row['mm_kernel']} split {row.get('mm_split')}]" if row.get("mm_kernel") else ""), flush=True)
        x = w = dy = out = ref = None  # noqa: F841 - freed before the next row
        torch.cuda.empty_cache()
    jf.close()
    keys = (["model_ratio", "mmtma_ratio", "tma_ratio"] + [f"bn{b}_ratio" for b in bns] + ["wide_ratio"]
            + [f"wide{b}_ratio" for b in bns] + ["tma_over_model"])
    for key in keys:
        v = [r[key] for r in rows if r.get(key)]
        if v:
            print(f"{key}: geomean {SC.geomean(v):.3f} over {len(v)} "
                  f"(min {min(v):.3f}, max {max(v):.3f})")
    for label, pre in (("plain store", ["tma"] + [f"bn{b}" for b in bns]),
                       ("16-byte store", ["wide"] + [f"wide{b}" for b in bns])):
        v = [r["cudnn_ms"] / min(r[f"{x}_ms"] for x in pre if r.get(f"{x}_ms")) for r in rows
             if any(r.get(f"{x}_ms") for x in pre)]
        if v:
            print(f"best width per row vs cuDNN, {label}: geomean {SC.geomean(v):.3f} "
                  f"over {len(v)}")
    print(f"elapsed {time.monotonic() - t0:.1f} s")
    return rows


if __name__ == "__main__":
    main()
