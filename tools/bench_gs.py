#!/usr/bin/env python3
"""Group / instance norm on the shapes where tools/sweep_memory.py had pydnn behind PyTorch (the H200 run of
/work/notes/s26a: 59 gn_* / in_* points below 1.0x), pydnn against PyTorch in one run, each point checked
against PyTorch before timing (sweep_memory's run_point and tolerances), smallest first, until --budget-s is
spent. --old: also time pydnn with the split kernels off (tuning.norm.GS = False: the kernels before them).

    python3 tools/bench_gs.py [--budget-s 25] [--max-mb 600] [--reps 5] [--old] [--out DIR]
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# family layout NxCxHxW dtype, and the ratio (torch ms / pydnn ms) the H200 sweep measured before gs_*
BEFORE = """
gn_fwd_train NHWC 31x605x152x152 bf16 0.18
gn_fwd_infer NCHW 31x357x6x6 fp16 0.72
gn_fwd_infer NHWC 86x61x49x49 bf16 0.33
gn_bwd NHWC 34x950x9x9 fp32 0.86
gn_bwd NHWC 2x1608x133x133 fp16 0.03
gn_bwd NCHW 96x70x28x28 bf16 0.78
in_fwd_infer NCHW 6x688x158x158 fp16 0.40
in_fwd_infer NHWC 3x492x69x69 bf16 0.44
in_bwd NHWC 101x622x47x47 fp32 0.06
in_bwd NCHW 36x61x79x79 fp16 0.02
in_bwd NCHW 93x1362x91x91 bf16 0.01
gn_fwd_train NCHW 4x18x53x53 fp32 0.27
gn_fwd_train NHWC 122x1160x28x28 fp16 0.69
gn_fwd_infer NHWC 2x91x77x77 bf16 0.11
in_fwd_train NHWC 6x132x72x72 fp16 0.61
in_fwd_train NHWC 5x89x77x77 bf16 0.86
in_fwd_infer NHWC 117x91x34x34 fp32 0.86
in_bwd NCHW 48x343x155x155 fp16 0.01
gn_fwd_train NCHW 84x98x40x40 fp32 0.69
gn_fwd_train NCHW 11x277x11x11 bf16 0.20
gn_fwd_infer NCHW 64x277x96x96 fp32 0.16
gn_fwd_infer NCHW 134x151x75x75 fp16 0.18
gn_fwd_infer NHWC 1x1015x4x4 bf16 0.54
gn_bwd NCHW 12x1002x75x75 fp32 0.01
gn_bwd NHWC 101x833x39x39 bf16 0.20
in_fwd_infer NHWC 114x6x98x98 fp32 0.58
in_fwd_infer NCHW 19x1399x93x93 fp16 0.44
in_bwd NCHW 26x210x121x121 fp32 0.01
in_bwd NHWC 22x7x54x54 bf16 0.12
gn_fwd_train NHWC 5x15x199x199 fp32 0.11
gn_fwd_infer NCHW 3x103x99x99 fp32 0.09
gn_fwd_infer NHWC 7x69x179x179 fp16 0.16
gn_fwd_infer NHWC 5x1656x183x183 bf16 0.20
gn_bwd NHWC 2x28x77x77 fp32 0.63
gn_bwd NHWC 2x1853x11x11 fp16 0.24
gn_bwd NHWC 161x42x195x195 bf16 0.04
in_fwd_train NHWC 10x221x77x77 fp32 0.46
in_fwd_train NCHW 211x94x149x149 bf16 0.40
in_fwd_infer NHWC 22x1324x47x47 bf16 0.64
in_bwd NCHW 29x1106x39x39 bf16 0.42
gn_fwd_train NCHW 181x133x140x140 fp16 0.20
gn_fwd_train NCHW 8x12x159x159 bf16 0.14
gn_fwd_infer NHWC 6x216x174x174 fp32 0.22
gn_fwd_infer NCHW 38x553x127x127 fp16 0.15
gn_bwd NCHW 14x23x151x151 fp16 0.01
gn_bwd NCHW 8x5x162x162 bf16 0.05
in_fwd_train NHWC 222x1131x75x75 fp16 0.48
in_fwd_train NCHW 213x27x71x71 bf16 0.36
in_fwd_infer NHWC 144x1660x50x50 fp32 0.64
in_fwd_infer NHWC 61x21x76x76 fp16 0.58
in_bwd NHWC 73x42x156x156 fp16 0.01
gn_fwd_train NHWC 38x1253x52x52 fp32 0.20
gn_fwd_train NHWC 122x615x19x19 bf16 0.32
gn_fwd_infer NCHW 125x940x26x26 bf16 0.28
gn_bwd NHWC 182x178x170x170 fp32 0.14
gn_bwd NHWC 30x1036x85x85 fp16 0.23
in_fwd_train NHWC 38x495x212x212 fp32 0.44
in_fwd_infer NHWC 21x910x150x150 bf16 0.48
in_bwd NHWC 10x4x182x182 fp32 0.05
"""


def points():
    import sweep_memory as SM
    out = []
    for line in BEFORE.strip().splitlines():
        fam, layout, shape, dt, before = line.split()
        n, c, h, _ = (int(v) for v in shape.split("x"))
        p = dict(family=fam, dtype=dt, n=n, c=c, hw=h, layout=layout)
        out.append((SM.point_bytes(p), p, float(before)))
    return sorted(out, key=lambda t: t[0])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget-s", type=float, default=25.0)
    ap.add_argument("--max-mb", type=float, default=600.0)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--old", action="store_true")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    import sweep_common as SC
    import sweep_memory as SM
    from bench import Bench
    from pydnn import tuning
    import torch

    torch.manual_seed(0)
    b = Bench(64 << 20)
    c = SM.Ctx()
    c.h, c.copy_gbs = b.h, b.copy_gbs
    c.timer = SC.gpu_timer(args.reps, 2)
    c.graph_timer = None
    c.empty_ms = None
    meta = SC.device_meta()
    print(f"bench_gs: {meta.get('device', '?')}, copy {c.copy_gbs:.0f} GB/s", flush=True)
    rows = []
    for nb, p, before in points():
        if nb > args.max_mb * 2**20 or time.monotonic() - t0 > args.budget_s:
            continue
        r = []
        SM.run_point(c, p, r, {})  # (a fresh `checked`: every point checked against PyTorch)
        row = r[-1]
        row["ratio_before"] = before
        if args.old and row.get("ratio"):
            tuning.norm.GS = False
            try:
                case = SM.build(c, p)
                row["ms_old"] = c.timer(case["p"])
                del case
            finally:
                tuning.norm.GS = True
        rows.append(row)
        print(f"gs {row['group']:13s} {row['case']:26s} {row['dtype']:4s} {row['status']:4s} "
              f"pydnn {SC.fmt(row.get('ms_pydnn'), '.4f')} ms torch {SC.fmt(row.get('ms_ref'), '.4f')} ms "
              f"{SC.fmt(row.get('ratio'), '.2f')}x (before {before:.2f}x)"
              + (f" old {row['ms_old']:.4f} ms" if row.get("ms_old") else "") + f" {row.get('note', '')[:80]}",
              flush=True)
        if nb >= SM.BIG:
            torch.cuda.empty_cache()
    ok = [r["ratio"] for r in rows if r.get("ratio")]
    if ok:
        import math
        gm = math.exp(sum(math.log(v) for v in ok) / len(ok))
        print(f"bench_gs: {len(ok)} of {len(points())} points, geomean {gm:.2f}x, min {min(ok):.2f}x, "
              f"below 1.0x: {sum(v < 1 for v in ok)}, {time.monotonic() - t0:.1f} s", flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "bench_gs.json"), "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1, default=str)


if __name__ == "__main__":
    main()
