#!/usr/bin/env python3
"""The CNN demo's training step (examples/train_cnn.py: its model, bf16 autocast, AdamW, one-cycle schedule,
batch 256), pydnn.torch beside PyTorch (cuDNN) in one process, variants interleaved round by round.

    python tools/bench_cnn_step.py                                      # 20 rounds of 10 steps each
    PYDNN_TUNING="torch.BLOCK_LEAN=False" python tools/bench_cnn_step.py  # pydnn with a switch set (A / B: one
                                                                         # process each, alternated)
    python tools/bench_cnn_step.py --rounds 30 --steps 10 --json $OUT/bench_cnn_step.json

Each backend has its own model (the same initialisation), optimizer and schedule; a round runs `--steps` steps of
each in turn (the order alternates every round), so a host whose load drifts falls on both alike, and every round
starts a backend right after the other one ran (as the demo's interleaved epochs do). Switches are set once, at
import (PYDNN_TUNING): setting one moves pydnn's records generation (tuning.RECORDS_GEN), which makes every call
record stale, so variants of pydnn are separate processes. Per step: its time
between CUDA events recorded before and after it (the demo's StepTimer: host-bound steps measure the host's time)
and the host's own time of its parts (perf_counter, no synchronisation: forward + loss, backward, optimizer +
schedule). Reported per variant: medians over every step, the median of each position in a round (position 0:
the first step after another variant's steps), and the ratio to PyTorch's median. Figures are the card's and
host's of the run: name them with the device printed.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "examples")]

import train_cnn  # noqa: E402


def data(dev, batch):
    try:
        xtr, ytr, _, _ = train_cnn.load_digits(dev, 0)
    except SystemExit:  # no scikit-learn: random images of the same shape (timing does not read values)
        print("scikit-learn missing: random 3x32x32 images stand in for the digits", flush=True)
        xtr = torch.randn(1438, 3, 32, 32, device=dev)
        ytr = torch.randint(0, 10, (1438,), device=dev)
    g = torch.Generator(device="cpu").manual_seed(0)
    out = []
    for _ in range(4):
        idx = torch.randperm(len(ytr), generator=g)[:batch].to(dev)
        out.append((xtr[idx].contiguous(), ytr[idx]))
    return out


class _HostEvent:
    """--cpu: perf_counter stands in for a CUDA event (a smoke test of the script, no GPU figures)."""

    def __init__(self, enable_timing=True):
        self.t = None

    def record(self):
        self.t = time.perf_counter()

    def elapsed_time(self, other):
        return (other.t - self.t) * 1e3


class Variant:
    def __init__(self, label, backend, init, dev, total_steps):
        self.label = label
        self.model = train_cnn.build(backend).to(dev)
        self.model.load_state_dict(init)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=3e-3, weight_decay=0.05)
        self.sched = torch.optim.lr_scheduler.OneCycleLR(self.opt, 3e-3, total_steps=total_steps)
        self.ev, self.host, self.parts, self.pos = [], [], [], []
        self.event = torch.cuda.Event if dev.type == "cuda" else _HostEvent
        self.losses = []

    def step(self, xb, yb, pos, record=True):
        a = self.event(enable_timing=True)
        b = self.event(enable_timing=True)
        t0 = time.perf_counter()
        a.record()
        with torch.autocast(xb.device.type, dtype=torch.bfloat16):
            loss = F.cross_entropy(self.model(xb), yb)
        t1 = time.perf_counter()
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        t2 = time.perf_counter()
        self.opt.step()
        self.sched.step()
        b.record()
        t3 = time.perf_counter()
        if record:
            self.ev.append((a, b))
            self.host.append((t3 - t0) * 1e3)
            self.parts.append(((t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3))
            self.pos.append(pos)
            self.losses.append(loss.detach())

    def run(self, batches, n, start, record=True, evaluate=None):
        for i in range(n):
            xb, yb = batches[(start + i) % len(batches)]
            self.step(xb, yb, i, record)
        if evaluate is not None:  # the demo's evaluation after each epoch (eval mode, no_grad, ends in .item())
            train_cnn.evaluate(self.model, *evaluate)


def med(v):
    return statistics.median(v) if v else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--steps", type=int, default=10, help="steps of each variant per round")
    ap.add_argument("--warmup", type=int, default=10, help="untimed steps of each variant first")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--eval", action="store_true",
                    help="after each backend's steps in a round, its evaluation on 359 images (as the demo's epochs)")
    ap.add_argument("--json", default="")
    ap.add_argument("--cpu", action="store_true", help="smoke-test the script on the CPU (PyTorch's ops: no figures)")
    args = ap.parse_args()
    if args.cpu:
        dev = torch.device("cpu")
    elif not torch.cuda.is_available():
        sys.exit("bench_cnn_step.py needs a CUDA GPU")
    else:
        dev = torch.device("cuda", torch.cuda.current_device())
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    batches = data(dev, args.batch)
    ev = (torch.cat([b[0] for b in batches])[:359], torch.cat([b[1] for b in batches])[:359]) if args.eval else None
    torch.manual_seed(0)
    init = train_cnn.build("torch").state_dict()
    total = (args.warmup + args.rounds * args.steps) * 2 + 10
    variants = [Variant("pydnn", "pydnn", init, dev, total)]
    if not args.no_torch:
        variants.append(Variant("torch", "torch", init, dev, total))
    for v in variants:
        v.run(batches, args.warmup, 0, record=False)
    sync()
    for r in range(args.rounds):
        k = r % len(variants)
        for v in variants[k:] + variants[:k]:
            v.run(batches, args.steps, r * args.steps, evaluate=ev)
    sync()
    res = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu (smoke test)", "torch": torch.__version__, "rounds": args.rounds,
           "steps": args.steps, "batch": args.batch, "eval": args.eval, "PYDNN_TUNING": os.environ.get("PYDNN_TUNING", ""),
           "variants": {}}
    tref = None
    for v in variants:
        ms = [a.elapsed_time(b) for a, b in v.ev]
        per_pos = {}
        for p, t in zip(v.pos, ms):
            per_pos.setdefault(p, []).append(t)
        d = {"step_ms": med(ms), "mean_ms": statistics.fmean(ms), "host_ms": med(v.host),
             "fwd_host_ms": med([p[0] for p in v.parts]), "bwd_host_ms": med([p[1] for p in v.parts]),
             "opt_host_ms": med([p[2] for p in v.parts]),
             "by_position_ms": [round(med(per_pos[p]), 4) for p in sorted(per_pos)],
             "final_loss": float(v.losses[-1])}
        res["variants"][v.label] = d
        if v.label == "torch":
            tref = d["step_ms"]
    print(f"{res['device']}, torch {res['torch']}, batch {args.batch}, {args.rounds} rounds x {args.steps} steps "
          f"a backend (interleaved, alternating order{', an evaluation after each' if args.eval else ''}); "
          f"PYDNN_TUNING={res['PYDNN_TUNING']!r}")
    print(f"{'variant':44s} {'step ms':>8s} {'/torch':>7s} {'host ms':>8s} {'fwd':>6s} {'bwd':>6s} {'opt':>6s} "
          f"{'loss':>7s}  by position in the round (ms)")
    for label, d in res["variants"].items():
        ratio = d["step_ms"] / tref if tref else float("nan")
        d["ratio_to_torch"] = ratio
        print(f"{label:44s} {d['step_ms']:8.3f} {ratio:7.3f} {d['host_ms']:8.3f} {d['fwd_host_ms']:6.3f} "
              f"{d['bwd_host_ms']:6.3f} {d['opt_host_ms']:6.3f} {d['final_loss']:7.4f}  "
              + " ".join(f"{t:.2f}" for t in d["by_position_ms"]))
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
