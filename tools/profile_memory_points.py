#!/usr/bin/env python3
"""Where a memory-sweep point's time goes: each kernel of pydnn's call and of PyTorch's, device time per call
(torch.profiler / CUPTI), beside the eager time per call as tools/sweep_memory.py measures it:

    python3 tools/profile_memory_points.py [--reps N] [--set 'switch=value;...'] \\
        --points 'bn_bwd NHWC 2x1305x45x45 bf16;bn_bwd NHWC 195x93x38x38 bf16'

Points as the sweep's log names them (sweep_memory.parse_point). Per point and side: the kernels in launch
order with their mean device us, their sum, and the eager median (the gap between the sum and the eager time
is host time and launch gaps). --set applies tuning switches (pydnn.tuning.override) to every point.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _settings(text):
    out = {}
    for item in (t for t in text.split(";") if t.strip()):
        k, v = (w.strip() for w in item.split("=", 1))
        if v in ("True", "False"):
            out[k] = v == "True"
        elif v.lstrip("-").isdigit():
            out[k] = int(v)
        else:
            out[k] = float(v)
    return out


def _device_events(prof):
    """(name, device us) of every GPU activity the profiler saw (driver-API launches included: CUPTI)."""
    try:
        out = []
        for e in prof.profiler.kineto_results.events():
            if e.device_type().name == "CUDA":
                out.append((e.name(), e.duration_ns() / 1000.0))
        if out:
            return out
    except Exception:  # noqa: BLE001 - another torch version: its FunctionEvents
        pass
    return [(ev.name, ev.time_range.elapsed_us()) for ev in prof.events() if ev.device_type.name == "CUDA"]


def _kernels(fn, reps):
    """[(name, mean device us per call)] in first-launch order, from reps calls under the profiler."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    order, tot = [], {}
    for name, us in _device_events(prof):
        if "memcpy" in name.lower() or "memset" in name.lower():
            continue
        if name not in tot:
            order.append(name)
            tot[name] = 0.0
        tot[name] += us
    return [(n, tot[n] / reps) for n in order]


def _short(name, width=70):
    name = name.replace("pydnn::", "").replace("void ", "")
    return name if len(name) <= width else name[:width - 3] + "..."


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", required=True)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--set", default="", help="tuning switches for every point: 'family.NAME=value;...'")
    ap.add_argument("--no-torch", action="store_true", help="profile pydnn's call only")
    args = ap.parse_args(argv)
    import torch
    import sweep_common as SC
    import sweep_memory as M
    from bench import Bench, time_ms
    from pydnn import tuning

    torch.manual_seed(0)
    b = Bench(64 << 20)
    c = M.Ctx()
    c.h, c.copy_gbs = b.h, b.copy_gbs
    c.timer = SC.gpu_timer(10, 2)
    c.empty_ms = None
    print(f"device copy {c.copy_gbs:.0f} GB/s", flush=True)
    settings = _settings(args.set)
    with tuning.override(settings):
        for spec in (s for s in args.points.split(";") if s.strip()):
            p = M.parse_point(spec)
            try:
                case = M.build(c, p)
                sides = [("pydnn", case["p"])] + ([] if args.no_torch else [("torch", case["t"])])
                line = []
                for side, fn in sides:
                    eager = time_ms(fn, reps=args.reps) * 1000
                    ks = _kernels(fn, args.reps)
                    s = sum(t for _, t in ks)
                    line.append(f"{side} {eager:.1f} us")
                    print(f"{spec} [{side}] eager {eager:.1f} us/call, kernels {s:.1f} us", flush=True)
                    for n, t in ks:
                        print(f"    {t:8.1f} us  {_short(n)}", flush=True)
                gb = case["nbytes"] / 1e9
                print(f"{spec}: {' / '.join(line)}; floor bytes {case['nbytes'] / 2**20:.1f} MiB "
                      f"({gb / (c.copy_gbs / 1e6):.1f} us at copy rate)", flush=True)
            except Exception as e:  # noqa: BLE001 - one point's failure should not stop the rest
                print(f"{spec}: FAILED {type(e).__name__}: {e}", flush=True)


if __name__ == "__main__":
    main()
