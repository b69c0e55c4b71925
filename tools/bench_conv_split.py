#!/usr/bin/env python3
"""fwd_wgmma's split-K (tuning.conv.WGM_SPLIT, pydnn/ops/convolution/tensor_core.py split_wgmma) against the
same algorithm whole and cuDNN, in one run, on the convolution sweep's points (tools/sweep_conv.py's grid,
bf16 NHWC) whose forward or backward data the model splits, plus control points it leaves whole.

    python3 tools/bench_conv_split.py [--max N] [--controls NAMES] [--reps R] [--out DIR]

Per point: pydnn's Get..._v7 algorithm with the split (default), the same algorithm with WGM_SPLIT = 1 (one
launch, no workspace: the code before the split, the same kernel), and cuDNN through PyTorch (benchmark
mode), each as device time from a CUDA graph (sweep_conv.GraphTimer). The split output is checked against
PyTorch (max error / max |ref|, 2e-2). Printed: a row per point (ms whole / split / cuDNN, both ratios) and the
geomean of each ratio over the split points, and what the change would do to the sweep's 639-point geomean
(the log-ratio gain spread over 639).
"""
import argparse
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import sweep_common as SC  # noqa: E402
import sweep_conv as SW  # noqa: E402

DIRS = ("fwd", "bwd data")
CONTROLS = ("unet N128 3x3 256->256 @32", "resnet50 N128 3x3 512->512 @7", "issue N64 3x3 64->64 @56")


def _split_plan(h, t, d, algo):
    from pydnn.ops.convolution import plans as CP, problem as CPb
    direction = CPb.DIR_FWD if d == "fwd" else CPb.DIR_BWD_DATA
    return CP.new_plan(h, direction, algo, t["conv"], t["xd"], t["wd"], t["yd"])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max", type=int, default=40, help="at most this many split points (grid order)")
    ap.add_argument("--controls", default=",".join(CONTROLS), help="comma-separated case-name prefixes run too")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--budget-s", type=float, default=1e9, help="stop starting points after this many seconds")
    ap.add_argument("--forced", default="2,4,8", help="slice counts also timed, forced (WGM_SPLIT), on the first "
                                                     "--forced-points split points: the split model's calibration")
    ap.add_argument("--forced-points", type=int, default=8)
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    import torch
    import pydnn
    from pydnn import tuning

    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    t0 = time.monotonic()
    h_split, h_whole = pydnn.create(), pydnn.create()   # each handle caches its own plans
    forced = [int(v) for v in args.forced.split(",") if v]
    h_forced = {sv: pydnn.create() for sv in forced}
    for h in (h_split, h_whole, *h_forced.values()):
        pydnn.set_stream(h, torch.cuda.current_stream().cuda_stream)
    timer_ev = SC.gpu_timer(args.reps, 1)
    tm_split = SW.GraphTimer(h_split, args.reps, timer_ev)
    tm_whole = SW.GraphTimer(h_whole, args.reps, timer_ev)
    tm_ref = SW.GraphTimer(h_split, args.reps, timer_ev)
    probs, _ = SW.grid(0)
    controls = [c for c in args.controls.split(",") if c]
    lines, rows = [], []
    picked = 0
    for pr in probs:
        if time.monotonic() - t0 > args.budget_s:
            lines.append(f"budget: stopped after {time.monotonic() - t0:.1f} s")
            break
        name = SW.case_name(pr)
        control = any(name.startswith(c) for c in controls)
        if pr["groups"] != 1:
            continue
        t = SW._setup(h_split, pr)
        for d in DIRS:
            algo, ws_n = SW._v7(h_split, t, d)
            try:
                pl = _split_plan(h_split, t, d, algo)
            except pydnn.PydnnError:
                continue
            split = getattr(pl, "splits", 1) if type(pl.fold).__name__ == "ConvParams" else 1
            if split <= 1 and not control:
                continue
            if split > 1:
                picked += 1
                if picked > args.max:
                    continue
            ws = torch.empty(max(ws_n, 1), dtype=torch.uint8, device=SC.DEV)
            fp, ft, out = SW._direction_fns(h_split, pr, t, d, algo, ws, ws_n)
            out.fill_(float("nan"))
            fp()
            err, ok = SC.close_rel(out, ft(), 2e-2)
            ms_split = tm_split(fp)
            with tuning.override({"conv.WGM_SPLIT": 1}):
                wn = {"fwd": pydnn.get_convolution_forward_workspace_size,
                      "bwd data": pydnn.get_convolution_backward_data_workspace_size}[d]
                args_ws = ((h_whole, t["xd"], t["wd"], t["conv"], t["yd"], algo) if d == "fwd"
                           else (h_whole, t["wd"], t["yd"], t["conv"], t["xd"], algo))
                n2 = wn(*args_ws)
                ws2 = torch.empty(max(n2, 1), dtype=torch.uint8, device=SC.DEV)
                fw, _, _ = SW._direction_fns(h_whole, pr, t, d, algo, ws2, n2)
                ms_whole = tm_whole(fw)   # (its plan is made here, under the switch, and cached on h_whole)
            ms_ref = tm_ref(ft)
            ms_forced = {}
            if split > 1 and picked <= args.forced_points:
                for sv, hf in h_forced.items():
                    with tuning.override({"conv.WGM_SPLIT": sv}):
                        pf = _split_plan(hf, t, d, algo)
                        wsf = torch.empty(max(pf.workspace, 1), dtype=torch.uint8, device=SC.DEV)
                        ff, _, _ = SW._direction_fns(hf, pr, t, d, algo, wsf, pf.workspace)
                        ms_forced[pf.splits] = SW.GraphTimer(hf, args.reps, timer_ev)(ff)
            r = dict(case=name, dir=d, split=split, kernel=SW._kernel(h_split, t, d, algo), ms_whole=ms_whole,
                     ms_split=ms_split, ms_ref=ms_ref, err=err, ok=ok, control=control and split <= 1)
            rows.append(r)
            line = (f"{name[:52]:52s} {d:8s} S={split:<2d} whole {ms_whole:.4f} split {ms_split:.4f} cuDNN "
                    f"{ms_ref:.4f} ms  ratio {ms_ref / ms_whole:.3f} -> {ms_ref / ms_split:.3f}  err {err:.1e}"
                    f"{'' if ok else ' CHECK FAILED'}{'  (control)' if r['control'] else ''}"
                    + "".join(f"  S={k}: {v:.4f}" for k, v in sorted(ms_forced.items())))
            print(line, flush=True)
            lines.append(line)
            del ws
        del t
        torch.cuda.empty_cache()
    sp = [r for r in rows if r["split"] > 1]
    if sp:
        g0 = SC.geomean([r["ms_ref"] / r["ms_whole"] for r in sp])
        g1 = SC.geomean([r["ms_ref"] / r["ms_split"] for r in sp])
        gain = sum(math.log(r["ms_whole"] / r["ms_split"]) for r in sp)
        lines.append(f"split points: {len(sp)}  geomean vs cuDNN whole {g0:.3f} -> split {g1:.3f}  "
                     f"(x{math.exp(gain / 639):.4f} on the 639-point sweep geomean; worst split/whole "
                     f"{max(r['ms_split'] / r['ms_whole'] for r in sp):.3f})")
    lines.append(f"elapsed {time.monotonic() - t0:.1f} s; checks failed: {sum(not r['ok'] for r in rows)}")
    print("\n".join(lines[-2:]))
    if args.out:
        with open(os.path.join(args.out, "bench_conv_split.txt"), "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
