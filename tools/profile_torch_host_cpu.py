#!/usr/bin/env python3
"""Host cost of each pydnn call a PyTorch-demo step makes, without a GPU.

    python tools/profile_torch_host_cpu.py                 # the CNN demo's step (batch 256)
    python tools/profile_torch_host_cpu.py --demo gpt      # the GPT demo's default size, 1 layer, batch 8

1. The demo's model (examples/train_cnn.py / train_gpt.py, converted as the demos do) runs one training step
   on the CPU under bf16 autocast with pydnn.torch's GPU path emulated (tests/torch/test_torch_emulated_cpu.py's
   fakes compute the results; --null: nothing is computed, only recorded), and every pydnn compute call the
   bridge makes is recorded with its arguments;
2. each recorded call is replayed through the real pydnn function on a stub handle over a no-op libcuda
   (tools/bench_host_cpu.py's: cuLaunchKernel returns at once), so pydnn's Python - checks, the cached plan or
   launch record, the parameter patching and cuda.bindings' launch wrapper - is timed, not the driver;
3. per call: microseconds of this process's CPU time (median of 5 loops), Python-level function calls
   (sys.setprofile) and the kernels it launched (the stub handle's lookups on its first call).
Absolute times are this machine's; the ratios and call counts carry over. The real launch adds the driver's
cuLaunchKernel (~2-4 us a kernel on an H100 / H200 host).
"""
import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tools"), os.path.join(ROOT, "tests", "torch"), os.path.join(ROOT, "examples")]

import bench_host_cpu as BC  # noqa: E402

_QUERIES = ("get_", "find_", "dropout_get", "set_dropout", "restore_dropout")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--demo", choices=["cnn", "gpt"], default="cnn")
    ap.add_argument("--batch", type=int, default=0, help="batch (default: cnn 256, gpt 8 sequences of 1024)")
    ap.add_argument("--loops", type=int, default=300, help="calls per timing loop")
    ap.add_argument("--null", action="store_true", help="record only (no emulated compute: faster, values garbage)")
    ap.add_argument("--bridge", action="store_true",
                    help="CNN: the bridge's own host time: the whole step (forward, backward) with every pydnn "
                         "compute call a no-op, at tiny shapes (the demo's layers on 4x4 images, batch 1), "
                         "against PyTorch's CPU step of the same model; and a cProfile of the bridge's step")
    ap.add_argument("--real", action="store_true",
                    help="--bridge: every pydnn compute call runs the real pydnn function on the stub handle "
                         "(pydnn's Python and the stubbed launch included; values not computed)")
    ap.add_argument("--steps", type=int, default=400, help="--bridge: steps per timing sample")
    ap.add_argument("--top", type=int, default=30, help="--bridge: rows of the profile")
    args = ap.parse_args()
    if os.environ.get("PYDNN_FAKE_CUDA") is None:
        d = BC.fake_libcuda_dir()
        if d is None:
            sys.exit("needs a C compiler (the stand-in libcuda.so.1 of tools/bench_host_cpu.py)")
        env = dict(os.environ, PYDNN_FAKE_CUDA=d,
                   LD_LIBRARY_PATH=os.pathsep.join(x for x in (d, os.environ.get("LD_LIBRARY_PATH")) if x))
        os.execve(sys.executable, [sys.executable] + sys.argv, env)

    import pytest
    import torch

    import bench_host as B
    import pydnn
    import pydnn.torch as pt
    import test_torch_emulated_cpu as T
    from pydnn.torch import _core as C

    h = BC.real_stub_handle()
    looked = []
    inner = h._funcs

    class Funcs(dict):
        def get(self, key, default=None):
            looked.append(key)
            return inner.get(key)
    h._funcs = Funcs()

    rec = []
    mp = pytest.MonkeyPatch()
    for f in dict.fromkeys(T.FAKES):
        n = f.__name__
        real = getattr(pydnn, n)
        if n.startswith(_QUERIES):  # the real queries on the stub handle (plans as on an sm_90 GPU) ...
            if n.startswith("find_"):  # ... but Find times kernels: the fake's answer
                mp.setattr(pydnn, n, f)
            continue

        def mk(real, fake):
            def call(*a, **k):
                rec.append((real, a, k))
                if args.real:
                    return real(*a, **k)
                return None if args.null else fake(*a, **k)
            call.__name__ = real.__name__
            return call
        mp.setattr(pydnn, n, mk(real, f))
    mp.setattr(C, "handle_for", lambda d: h)
    mp.setattr(C, "on_cuda", lambda *ts: True)
    mp.setattr(C, "device_index", lambda d: 0)
    mp.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    mp.setattr(C, "_current_stream", lambda idx: 7)
    mp.setattr(C, "autocast_dtype", lambda: torch.bfloat16)
    mp.setattr(pydnn.buffers, "CHECKED", False)

    if args.bridge:
        return bridge(args, step_model=_bridge_models(pt), mp=mp)
    if args.demo == "cnn":
        import train_cnn
        bsz = args.batch or 256
        model = train_cnn.build("pydnn")
        x, y = torch.randn(bsz, 3, 32, 32), torch.randint(0, 10, (bsz,))

        def step():
            torch.nn.functional.cross_entropy(model(x).float(), y).backward()
    else:
        import argparse as ap_
        import train_gpt
        bsz = args.batch or 8
        a = ap_.Namespace(d_model=768, n_head=12, n_kv_head=4, seq=1024, n_layer=1, norm="rms", dropout=0.0)
        model = train_gpt.GPT(a, "pydnn", pt.scaled_dot_product_attention)
        x = torch.randint(0, 256, (bsz, 1024))

        def step():
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(model(x).float().view(-1, 256), x.view(-1))
            loss.backward()
    for _ in range(2):  # the second step's calls: plans and descriptors already made, as in training
        rec.clear()
        step()
    print(f"{args.demo}, batch {bsz}: {len(rec)} pydnn compute calls a step; "
          f"fallbacks: {pt.fallback_report() or 'none'}")
    lines = ["| # | call | µs (CPU) | Python calls | kernels (first call) |", "|---|---|---:|---:|---|"]
    total = 0.0
    for i, (real, a, k) in enumerate(rec):
        looked.clear()
        h.prepared.clear()  # the first call again: its kernels looked up (then cached as in training)
        try:
            real(*a, **k)
        except Exception as e:  # noqa: BLE001 - report and go on
            print(f"{i:3d} {real.__name__}: FAILED {type(e).__name__}: {str(e)[:160]}")
            continue
        kernels = sorted({key[1].split("<")[0].replace("pydnn::", "") for key in looked})
        if os.environ.get("PROFILE_UNITS"):
            print("   units:", sorted({str(key[0]) for key in looked}))
        real(*a, **k)
        samples = []
        for _ in range(5):
            t0 = time.process_time()
            for _ in range(args.loops):
                real(*a, **k)
            samples.append((time.process_time() - t0) / args.loops * 1e6)
        us = statistics.median(samples)
        npy = B.python_calls(lambda: real(*a, **k))[0]
        total += us
        print(f"{i:3d} {real.__name__:42s} {us:7.2f} us {npy:4d} Python calls  {', '.join(kernels)}", flush=True)
        lines.append(f"| {i} | `{real.__name__}` | {us:.2f} | {npy} | {', '.join(kernels)} |")
    lines.append(f"| | (total) | {total:.1f} | | |")
    print("\n" + "\n".join(lines))


def _bridge_models(pt):
    """(pydnn model, torch model, x, y): the demo's CNN on 4x4 images (its Linear 128 -> 10), batch 1."""
    import torch
    import torch.nn as nn

    def build():
        return nn.Sequential(
            nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(128, 10))
    torch.manual_seed(0)
    ref = build()
    model = build()
    model.load_state_dict(ref.state_dict())
    pt.convert(model, fuse=True)
    return model, ref, torch.randn(1, 3, 4, 4), torch.randint(0, 10, (1,))


def bridge(args, step_model, mp):
    """The bridge's own CPU time a step (pydnn's compute calls no-ops, its queries real)."""
    import cProfile
    import pstats

    import torch

    model, ref, x, y = step_model
    torch.set_num_threads(1)  # a shared 2-core machine: intra-op threads only add contention at these sizes

    def step(m, autocast):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = torch.nn.functional.cross_entropy(m(x).float(), y)
        loss.backward()

    import contextlib

    from pydnn import tuning

    def override(sw):  # (the defaults without an override: it bumps tuning.GENERATION)
        return tuning.override(sw) if sw else contextlib.nullcontext()
    variants = [("bridge (defaults)", lambda: step(model, False), {}),
                ("bridge (FAST_CALLS=False)", lambda: step(model, False), {"torch.FAST_CALLS": False}),
                ("bridge (FUSE_POOL=False)", lambda: step(model, False), {"torch.FUSE_POOL": False}),
                ("bridge (both False: the path before)", lambda: step(model, False),
                 {"torch.FAST_CALLS": False, "torch.FUSE_POOL": False}),
                ("PyTorch CPU step (its kernels included)", lambda: step(ref, True), {})]
    for _, fn, sw in variants:
        with override(sw):
            for _ in range(20):
                fn()
    # interleaved samples (a shared machine's load moves): each variant's median and min per step
    samples = {v[0]: [] for v in variants}
    for _ in range(7):
        for name, fn, sw in variants:
            with override(sw):
                t0 = time.process_time()
                for _ in range(args.steps):
                    fn()
                samples[name].append((time.process_time() - t0) / args.steps * 1e6)
    import bench_host as B
    for name, fn, sw in variants:
        with override(sw):
            npy = B.python_calls(fn)[0]  # (deterministic, unlike the times on a shared machine)
        v = samples[name]
        print(f"{name:44s} CPU us a step: median {statistics.median(v):7.0f}  min {min(v):7.0f}  "
              f"Python calls {npy}")
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(args.steps):
        step(model, False)
    pr.disable()
    st = pstats.Stats(pr)
    st.sort_stats("tottime").print_stats(args.top)
    # the calls a step makes, by function (deterministic, unlike the times on a shared machine)
    rows = sorted(((v[1] / args.steps, v[2] / args.steps * 1e6, f"{k[0].split('/')[-1]}:{k[1]}({k[2]})")
                   for k, v in st.stats.items()), reverse=True)
    total = sum(r[0] for r in rows)
    print(f"{total:.0f} Python-level calls a step (cProfile); by count:")
    for n, us, name in rows[:args.top]:
        print(f"  {n:6.1f}  {us:7.1f} us own  {name}")


if __name__ == "__main__":
    main()
