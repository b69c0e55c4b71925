#!/usr/bin/env python3
"""Named points of tools/sweep_memory.py's batch norm and pooling families, measured exactly as the sweep
measures them (its build() and run_point(): the same pydnn and PyTorch calls, spot check, timer), pydnn
against PyTorch in one run; with --before, each point again with a tuning switch changed (the path it
replaced), so before / after come from the same device and run.

    python3 tools/bench_bnpool.py [--points default|worst|demo|"p1;p2"] [--before batchnorm.NCHW_SPLIT=False]
                                  [--before-points N] [--budget-s 20] [--out DIR] [--only bn_train,...]

Points: the worst of the H200 sweep of 2026-11-28 (notes s26a) and the CNN demo's shapes. A point is
"family layout NxCxHxW [variant] dtype" (the sweep's case names).
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

WORST = [  # the first six: the worst of each family, NHWC pooling (with --before-points 6)
    "bn_train NCHW 243x555x81x81 fp16", "bn_infer NCHW 17x1329x147x147 bf16", "bn_bwd NCHW 5x1481x23x23 fp32",
    "pool_bwd NCHW 101x38x50x50 max fp32", "pool_fwd NCHW 18x468x75x75 avg fp32",
    "pool_bwd NHWC 39x66x53x53 avg bf16",
    "bn_train NCHW 187x3x81x81 fp16", "bn_train NCHW 43x58x111x111 fp16",
    "bn_train NCHW 167x599x25x25 bf16", "bn_train NCHW 49x1977x72x72 fp32", "bn_train NCHW 6x348x14x14 fp32",
    "bn_train NCHW 2x127x17x17 fp16", "bn_train NCHW 21x413x9x9 fp16", "bn_train NCHW 209x29x2x2 fp32",
    "bn_infer NCHW 125x105x122x122 bf16", "bn_infer NCHW 169x422x30x30 fp16",
    "bn_infer NCHW 2x211x171x171 fp32", "bn_infer NCHW 28x1121x5x5 fp16",
    "bn_bwd NCHW 30x309x125x125 fp32", "bn_bwd NCHW 110x251x115x115 fp16",
    "bn_bwd NCHW 152x6x26x26 bf16", "bn_bwd NCHW 4x664x2x2 bf16", "bn_bwd NCHW 77x76x76x76 fp16",
    "pool_bwd NCHW 2x168x55x55 max fp16", "pool_bwd NCHW 151x279x11x11 avg fp16",
    "pool_fwd NCHW 62x981x40x40 max bf16", "pool_fwd NCHW 146x228x195x195 max bf16",
    "pool_bwd NHWC 10x933x103x103 avg fp32", "pool_bwd NHWC 54x277x163x163 avg fp16",
    "pool_fwd NHWC 62x1100x13x13 max bf16",
]
DEMO = ["bn_train NCHW 256x64x32x32 bf16", "bn_bwd NCHW 256x64x32x32 bf16", "bn_train NCHW 256x128x16x16 bf16",
        "bn_bwd NCHW 256x128x16x16 bf16", "pool_fwd NCHW 256x64x32x32 avg bf16", "pool_bwd NCHW 256x64x32x32 avg bf16"]
TINY = ["bn_train NHWC 7x35x5x5 bf16", "bn_train NHWC 36x33x2x2 fp16", "bn_train NCHW 209x29x2x2 fp32",
        "bn_bwd NHWC 18x5x9x9 fp16", "bn_bwd NHWC 12x11x14x14 fp16", "bn_bwd NCHW 4x664x2x2 bf16"]
SETS = {"worst": WORST, "demo": DEMO, "tiny": TINY, "default": WORST + DEMO}


def parse_point(spec):
    """'family layout NxCxHxW [variant] dtype' -> the sweep's point dict."""
    parts = spec.split()
    fam, layout, shape, dt = parts[0], parts[1], parts[2], parts[-1]
    n, c, h, w = (int(v) for v in shape.split("x"))
    assert h == w, spec
    p = dict(family=fam, dtype=dt, n=n, c=c, hw=h, layout=layout)
    if len(parts) == 5:
        p["variant"] = parts[3]
    return p


def _set_switch(assign):
    """'family.NAME=value' -> (switches object, name, old value) after setting it."""
    from pydnn import tuning
    lhs, rhs = assign.split("=", 1)
    fam, name = lhs.split(".")
    sw = tuning.FAMILIES[fam]
    old = getattr(sw, name)
    val = {"True": True, "False": False}.get(rhs)
    if val is None:
        val = type(old)(rhs)
    setattr(sw, name, val)
    return sw, name, old


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--points", default="default", help="default, worst, demo, or ';'-separated point names")
    ap.add_argument("--only", default="", help="comma-separated families to keep")
    ap.add_argument("--before", action="append", default=[],
                    help="family.SWITCH=value: also time each point with it (repeatable; all applied together)")
    ap.add_argument("--before-points", type=int, default=None, help="only the first N points also run --before")
    ap.add_argument("--tiny-before", action="append", default=[],
                    help="family.SWITCH=value: first the tiny set (TINY), each point also with this")
    ap.add_argument("--budget-s", type=float, default=60.0, help="stop starting points after this many seconds")
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    specs = SETS.get(args.points) or [s.strip() for s in args.points.split(";") if s.strip()]
    only = [o for o in args.only.split(",") if o]
    pts = [(parse_point(s), args.before, args.before_points is None or i < args.before_points)
           for i, s in enumerate(specs)]
    if args.tiny_before:
        pts = [(parse_point(s), args.tiny_before, True) for s in TINY] + pts
    pts = [t for t in pts if not only or t[0]["family"] in only]

    t0 = time.monotonic()
    import torch
    import sweep_common as SC
    import sweep_memory as M
    from bench import Bench

    torch.manual_seed(0)
    b = Bench(64 << 20)
    c = M.Ctx()
    c.h, c.copy_gbs = b.h, b.copy_gbs
    c.timer = SC.gpu_timer(args.reps, 2)
    c.empty_ms = None
    c.graph_empty_ms = None
    meta = dict(SC.device_meta(), copy_gbs=c.copy_gbs, before=args.before)
    print(f"bench_bnpool: {meta.get('device', '?')}  copy {c.copy_gbs:.0f} GB/s", flush=True)
    rows = []
    for p, befores, with_before in pts:
        if time.monotonic() - t0 > args.budget_s:
            print(f"budget spent: {p['family']} {M.case_name(p)} {p['dtype']} and later not run", flush=True)
            break
        for tag in (["after"] + (["before"] if befores and with_before else [])):
            undo = []
            try:
                if tag == "before":
                    undo = [_set_switch(a) for a in befores]
                c.h.prepared.clear()
                got = []
                M.run_point(c, p, got, {})
            finally:
                for sw, name, old in undo:
                    setattr(sw, name, old)
                c.h.prepared.clear()
            for r in got:
                r["which"] = tag
                rows.append(r)
                print(f"{tag:6s} {r['group']:9s} {r['case']:28s} {r['dtype']:4s} {r['status']:6s} pydnn "
                      f"{SC.fmt(r.get('ms_pydnn'), '.4f')} ms torch {SC.fmt(r.get('ms_ref'), '.4f')} ms "
                      f"{SC.fmt(r.get('ratio'), '.2f')}x {SC.fmt(r.get('pct_copy'), '.1f')}% {r.get('note', '')[:90]}",
                      flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "bench_bnpool.json"), "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1, default=str)
    print(f"bench_bnpool: {len(rows)} rows in {time.monotonic() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
