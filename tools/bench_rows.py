#!/usr/bin/env python3
"""Issue 20's row-wise points, one at a time: pydnn against PyTorch in one run with tools/sweep_memory.py's
own calls (sweep_memory.build), each output checked against PyTorch's first (sweep_memory's tolerances).

    python3 tools/bench_rows.py [--cases NAME,...] [--set family.SWITCH=value ...] [--reps N] [--budget-s S] [--out DIR]

CASES: the worst points of the H200 sweep of 2026-11-28 (/work/notes/s26a, ratio = PyTorch ms / pydnn ms
then) that the rowx kernels (layer / RMS rows of any length) and map_rows (bias rows) serve. --set flips a
tuning switch for the whole run (norm.ROWX=False: the previous kernels), to time both sides of a change on
one machine. Prints one line per point (ms, GB/s of the bytes sweep_memory counts, ratio, check) and writes
bench_rows.json under --out.
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# (family, dtype, rows, hidden, variant, the sweep's ratio on 2026-11-28, H200)
CASES = [
    ("ln_fwd_train", "bf16", 2683, 6830, None, 0.42),
    ("ln_fwd_train", "fp32", 6532, 27723, None, 0.46),
    ("ln_fwd_infer", "bf16", 17602, 7549, None, 0.40),
    ("ln_fwd_infer", "bf16", 8204, 39856, None, 0.44),
    ("ln_fwd_infer", "fp16", 77128, 1194, None, 0.80),
    ("rms_fwd_infer", "fp16", 1587, 38005, None, 0.39),
    ("rms_fwd_infer", "fp32", 727, 6455, None, 0.67),
    ("rms_fwd_train", "fp32", 3603, 30264, None, 0.77),
    ("rms_fwd_infer", "fp32", 2271, 40275, None, 0.51),
    ("ln_bwd", "fp16", 35, 30693, None, 0.50),
    ("ln_bwd", "fp16", 2402, 34823, None, 0.50),
    ("rms_bwd", "bf16", 1, 64254, None, 0.53),
    ("ln_bwd", "fp32", 486865, 2015, None, 0.52),
    ("rms_bwd", "bf16", 81995, 9188, None, 0.34),
    ("rms_bwd", "fp16", 17244, 4231, None, 0.38),
    ("add_tensor", "bf16", 188158, 4096, "bias", 0.42),
    ("add_tensor", "fp16", 2991, 1024, "bias", 0.46),
    ("add_tensor", "fp16", 76284, 984, "bias", 0.46),
]


def name(c):
    return f"{c[0]}:{c[1]}:{c[2]}x{c[3]}" + (f":{c[4]}" if c[4] else "")


def _set(spec):
    from pydnn import tuning
    key, val = spec.split("=", 1)
    fam, sw = key.split(".")
    setattr(getattr(tuning, fam), sw, eval(val, {}, {}))  # noqa: S307 - a literal from the command line


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="", help="comma-separated names (family:dtype:RxH[:variant]); all if empty")
    ap.add_argument("--set", action="append", default=[], help="family.SWITCH=value (a Python literal)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", default="")
    ap.add_argument("--budget-s", type=float, default=0.0, help="start no point after this many seconds (0: none)")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    import torch
    import pydnn
    import sweep_common as SC
    import sweep_memory as SM
    from bench import time_ms

    for s in args.set:
        _set(s)
    want = [c for c in args.cases.split(",") if c]
    cases = [c for c in CASES if not want or name(c) in want]
    c = SM.Ctx()
    c.h = pydnn.create()
    pydnn.set_stream(c.h, torch.cuda.current_stream().cuda_stream)
    print(f"device: {torch.cuda.get_device_name()}  set: {args.set or 'defaults'}", flush=True)
    rows = []
    for fam, dt, r, hdim, var, before in cases:
        if args.budget_s and time.monotonic() - t0 > args.budget_s:
            print(f"bench_rows: budget spent, {name((fam, dt, r, hdim, var))} not run", flush=True)
            continue
        p = dict(family=fam, dtype=dt, rows=r, hidden=hdim)
        if var:
            p["variant"] = var
        row = dict(case=name((fam, dt, r, hdim, var)), before_ratio=before)
        try:
            k = SM.build(c, p)
            if k["check"] is not None:
                err, ok = k["check"]()
            else:
                k["p"]()
                torch.cuda.synchronize()
                err, ok = SC.close_rel(k["out"], k["ref"](), SM.TOL[dt])
            ms_p = time_ms(k["p"], reps=args.reps)
            ms_t = time_ms(k["t"], reps=args.reps)
            row.update(ms_pydnn=ms_p, ms_torch=ms_t, ratio=ms_t / ms_p, gbs=k["nbytes"] / ms_p / 1e6, err=err, ok=ok)
            print(f"{row['case']:36s} pydnn {ms_p:.4f} ms ({row['gbs']:.0f} GB/s)  torch {ms_t:.4f} ms  "
                  f"{row['ratio']:.2f}x (sweep before: {before:.2f}x)  check {'ok' if ok else 'FAILED'} {err:.1e}",
                  flush=True)
            del k
        except Exception as e:  # noqa: BLE001 - report the point and go on
            row.update(error=f"{type(e).__name__}: {e}"[:300])
            print(f"{row['case']:36s} ERROR {row['error']}", flush=True)
        rows.append(row)
        torch.cuda.empty_cache()
    print(f"bench_rows: {len(rows)} points in {time.monotonic() - t0:.1f} s", flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "bench_rows.json"), "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), set=args.set, rows=rows), f, indent=1)
    return 0 if all(r.get("ok") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
