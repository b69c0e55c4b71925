#!/usr/bin/env python3
"""Strided backward data (issue 18): pydnn's BWD_DATA_ALGO_1 on its stride-1 phases
(pydnn/ops/convolution/dgrad_phases.py) against the stride-s kernel it replaces (tuning.conv.DGRAD_PHASES
off) and cuDNN through PyTorch (aten.convolution_backward, cudnn.benchmark on), same run, bf16 NHWC.

    python3 tools/bench_dgrad_strided.py [--shapes quick|all] [--reps N] [--out DIR]

Shapes are tools/sweep_conv.py's (its problem(), tensors and call wrappers): ResNet-50's strided layers and
the sweep's worst strided random draws. Each row: ms of pydnn (phases), pydnn (stride-s kernel, skipped
where it is known to take > 5 ms), cuDNN; ratio = cuDNN / pydnn; the phases' kernels; a check of the
phases' dx against PyTorch's (max error relative to the largest |value|, bf16 tolerance 2e-2). Timing:
tools/bench.py's time_ms (events, median). Writes dgrad_strided.md / .json under --out (default $OUT).
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# (tag, name, N, C, K, H, R, stride, pad, run the stride-s kernel too[, groups])
SHAPES = [
    ("resnet50", "l3 3x3/2 256->256 @28", 128, 256, 256, 28, 3, 2, 1, True),
    ("resnet50", "l2 3x3/2 128->128 @56", 32, 128, 128, 56, 3, 2, 1, True),
    ("resnet50", "l4 3x3/2 512->512 @14", 32, 512, 512, 14, 3, 2, 1, True),
    ("resnet50", "l2 downsample 1x1/2 256->512 @56", 32, 256, 512, 56, 1, 2, 0, True),
    ("resnet50", "l4 downsample 1x1/2 1024->2048 @14", 128, 1024, 2048, 14, 1, 2, 0, True),
    ("random", "3x3/2 248->112 @67", 21, 248, 112, 67, 3, 2, 1, True),
    ("random", "3x3/2 104->104 @13", 104, 104, 104, 13, 3, 2, 1, True),
    ("random", "7x7/2 320->64 @14", 108, 320, 64, 14, 7, 2, 3, True),
    ("resnext50", "l3 3x3/2 g32 512->512 @28", 32, 512, 512, 28, 3, 2, 1, True, 32),
    ("random", "7x7/2 152->672 @103", 11, 152, 672, 103, 7, 2, 3, False),
    ("random", "5x5/2 8->216 @73", 213, 8, 216, 73, 5, 2, 2, False),
]
QUICK = SHAPES[:6] + SHAPES[8:9]
# stride-1 shapes of the sweep whose dy channels (K) are not multiples of 64 (bwd_data_tc today), for the
# forced-tiling variants below
STRIDE1 = [
    ("random", "3x3 448->880 @19", 163, 448, 880, 19, 3, 1, 1, False),
    ("random", "1x1 176->752 @37", 93, 176, 752, 37, 1, 1, 0, False),
]
# (column, forced TC_FORCE tiling for backward data): fwd_wgmma's two model tiles and the pipelined 128x64
VARIANTS = [("wgm128x64", (128, 64, 4, 2, 1)), ("wgm128x128", (128, 128, 4, 1, 1)),
            ("pipe128x64", (128, 64, 4, 1, 3, 0))]


def short(expr):
    """'pydnn::conv::fwd_wgmma<pydnn::bf16_t, 128, 4, 1, 1, 1>' -> 'fwd_wgmma<128, 4, 1, 1, 1>'."""
    head, _, args = expr.partition("<")
    return f"{head.split('::')[-1]}<{args.split(', ', 1)[-1]}" if ", " in args else head.split("::")[-1]


def _time_plan(h, t, algo, timer):
    """ms of a fresh plan of the current switches (new_plan: the handle's plan cache is not consulted)."""
    import torch
    from pydnn.ops.convolution import plans as CP, problem as CPb
    pl = CP.new_plan(h, CPb.DIR_BWD_DATA, algo, t["conv"], t["xd"], t["wd"], t["yd"])
    ws = torch.empty(max(pl.workspace, 1), dtype=torch.uint8, device="cuda")
    args = (t["dy"].data_ptr(), t["w"].data_ptr(), t["dx"].data_ptr(), ws.data_ptr() if pl.workspace else 0)
    return timer(lambda: CP.run_plan(h, pl, *args, 1.0, 0.0))


def report(rows, dev, versions, elapsed):
    """The markdown table (and per-phase lines) of the rows."""
    import sweep_common as SC
    lines = [f"# Strided backward data, bf16 NHWC, {dev} ({versions})", "",
             "| " + " | ".join(["shape", "pydnn ms", "stride-s kernel ms", "cuDNN ms", "cuDNN / pydnn", "TFLOP/s",
                                 "check", "kernels"] + [f"{v} ms" for v, _ in VARIANTS]) + " |",
             "|---|---:|---:|---:|---:|---:|---|---|" + "---:|" * len(VARIANTS)]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['case']} | error: {r['error']} | | | | | | |")
            continue
        so = f"{r['ms_stride_s']:.4f}" if "ms_stride_s" in r else "-"
        lines.append(f"| {r['case']} | {r['ms_phases']:.4f} | {so} | {r['ms_cudnn']:.4f} | {r['ratio']:.2f} | "
                     f"{r['tflops']:.0f} | {r['check_err']:.1e} {'ok' if r['check_ok'] else 'FAIL'} | "
                     f"{', '.join(r.get('phases', [r.get('kernel') or '?']))} |"
                     + "".join(f" {r[f'ms_{v}']:.4f} |" if r.get(f"ms_{v}") else " - |" for v, _ in VARIANTS))
    ok = [r["ratio"] for r in rows if "ratio" in r]
    if ok:
        lines += ["", f"geomean cuDNN / phases: {SC.geomean(ok):.3f} over {len(ok)} shapes; "
                      f"elapsed {elapsed:.1f} s"]
    for r in rows:
        if r.get("phase_ms"):
            lines.append(f"- {r['case']}: " + "; ".join(f"taps {'x'.join(map(str, f[1:]))} {k} {ms:.4f} ms" for f, k, ms in r["phase_ms"]))
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", choices=("quick", "all"), default="quick")
    ap.add_argument("--stride1", action="store_true", help="also the STRIDE1 shapes")
    ap.add_argument("--variants", action="store_true", help="also time the forced tilings (VARIANTS)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)

    import torch
    import pydnn
    from pydnn import tuning
    import sweep_common as SC
    import sweep_conv as SW

    torch.backends.cudnn.benchmark = True
    h = pydnn.create()
    pydnn.set_stream(h, torch.cuda.current_stream().cuda_stream)
    timer = SC.gpu_timer(args.reps, 2)
    dev = torch.cuda.get_device_name()
    t0 = time.time()
    rows = []
    from pydnn.ops.convolution import problem as CPb
    global VARIANTS
    VARIANTS = VARIANTS if args.variants else []
    shapes = (SHAPES if args.shapes == "all" else QUICK) + (STRIDE1 if args.stride1 else [])
    for tag, name, n, c, k, hw, r, s, p, old, *g in shapes:
        pr = SW.problem(tag, name, n, c, k, hw, r, s, p, g[0] if g else 1)
        row = dict(case=f"{tag} N{n} {name}", flops=pr["flops"])
        try:
            t = SW._setup(h, pr)
            algo, ws_n = SW._v7(h, t, "bwd data")
            ws = torch.empty(max(ws_n, 1), dtype=torch.uint8, device="cuda")
            fp, ft, out = SW._direction_fns(h, pr, t, "bwd data", algo, ws, ws_n)
            row["algo"] = algo
            row["kernel"] = SW._kernel(h, t, "bwd data", algo)
            from pydnn.ops.convolution import plans as CP
            pl = CP.get_plan(h, 1, algo, t["conv"], t["xd"], t["wd"], t["yd"])
            if hasattr(pl, "subs"):
                row["phases"] = [short(sp.gemm_expr) for sp, _, _, _ in pl.subs] + (
                    ["fill"] if pl.fill is not None else [])
                # each phase alone (its taps, its kernel, ms), to see where the time goes
                dyp, wp, dxp, it = t["dy"].data_ptr(), t["w"].data_ptr(), t["dx"].data_ptr(), pl.itemsize
                wsp = ws.data_ptr() if ws_n else 0
                row["phase_ms"] = [
                    (list(spb.filt3), short(sp.gemm_expr),
                     timer(lambda sp=sp, a=dxo, b=wo: CP.run_plan(h, sp, dyp, wp + b * it, dxp + a * it, wsp, 1.0, 0.0)))
                    for sp, dxo, wo, spb in pl.subs]
            out.fill_(float("nan"))
            fp()
            ref = ft()
            row["check_err"], row["check_ok"] = SC.close_rel(out, ref, 2e-2)
            row["ms_phases"] = timer(fp)
            row["ms_cudnn"] = timer(ft)
            a1 = pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_1
            if old:  # the stride-s kernel (a fresh plan: the handle's cache holds the phases')
                with tuning.override({"conv.DGRAD_PHASES": False}):
                    row["ms_stride_s"] = _time_plan(h, t, a1, timer)
            for vname, tile in VARIANTS:  # forced tilings of the (phases') stride-1 plans
                with tuning.override({"conv.TC_FORCE": {CPb.DIR_BWD_DATA: tile}}):
                    try:
                        row[f"ms_{vname}"] = _time_plan(h, t, a1, timer)
                    except pydnn.PydnnError as e:
                        row[f"ms_{vname}"] = None
                        row[f"note_{vname}"] = str(e)[:120]
            row["ratio"] = row["ms_cudnn"] / row["ms_phases"]
            row["tflops"] = pr["flops"] / row["ms_phases"] / 1e9
            del t, ws
        except Exception as e:  # noqa: BLE001 - a row, not the end of the run
            row["error"] = f"{type(e).__name__}: {e}"[:300]
        rows.append(row)
        print(json.dumps(row), flush=True)
        torch.cuda.empty_cache()
    md = report(rows, dev, f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}", time.time() - t0)
    print(md)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "dgrad_strided.md"), "w") as f:
        f.write(md + "\n")
    with open(os.path.join(args.out, "dgrad_strided.json"), "w") as f:
        json.dump(dict(device=dev, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
