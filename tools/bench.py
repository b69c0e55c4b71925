#!/usr/bin/env python3
"""pydnn vs PyTorch (cuDNN / its own kernels) side by side, on one GPU, in one run.

    python tools/bench.py [--families activation,tensor,softmax,reduce,host] [--elements 64M] [--out FILE]
                          [--plot]   (PNG charts per family next to FILE, and FILE's rows as <stem>.json:
                                      tools/bench_plot.py)

Families after the foundation live in tools/bench_<family>.py, each with `run(b)` taking this Bench
(b.h: a pydnn handle on PyTorch's stream; b.row(...) for bandwidth-bound cases, b.row_flops(...) for
compute-bound ones; time_ms and desc from this module). Their docstrings hold the byte / flop counts,
the floor and the notes on each version.

Each case is timed with CUDA events around back-to-back calls (after warm-up; see time_ms), median of
many repetitions, on buffers larger than L2; the element-wise families alternate pydnn's and PyTorch's
rounds (time_pair), because their ratio sits near 1.0 where a drift over the run would decide it.
Bandwidth counts the fewest bytes the op must move (inputs read once, output written once); "% copy" is
that bandwidth over a device-to-device copy's, measured in the same run.
Host time is the Python-side cost of one small call (a 1-element tensor), from perf_counter over many calls.
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np

import pydnn

try:
    import torch
except ImportError:  # pragma: no cover
    sys.exit("bench needs PyTorch on the GPU machine")

REPS, WARMUP = 30, 5
DT = {"bf16": (torch.bfloat16, pydnn.PYDNN_DATA_BFLOAT16), "fp32": (torch.float32, pydnn.PYDNN_DATA_FLOAT),
      "fp16": (torch.float16, pydnn.PYDNN_DATA_HALF)}


def time_ms(fn, reps=REPS, warmup=WARMUP):
    """Median milliseconds of one call, with events on the current stream.

    Each sample times `inner` back-to-back calls between two events and divides by `inner`: with one call
    per sample, a kernel shorter than its caller's launch overhead (tens of microseconds of GPU time
    against a few of Python) leaves the GPU waiting on the host between the events, which is host time,
    not the kernel's. `inner` is chosen from one timed call so that a sample lasts about half a
    millisecond (1 for long kernels); pydnn and PyTorch are timed the same way."""
    for _ in range(warmup):
        fn()
    s0, e0 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s0.record()
    fn()
    e0.record()
    torch.cuda.synchronize()
    inner = max(1, min(16, int(0.5 / max(s0.elapsed_time(e0), 1e-3))))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(starts, ends):
        s.record()
        for _ in range(inner):
            fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)) / inner


def time_pair(fn_a, fn_b, rounds=6, reps=10):
    """Median milliseconds of fn_a and of fn_b, timed in alternating rounds (a, b, a, b, ...) of `reps`
    samples each (see time_ms), so that a slow drift of the clocks over the run (power, heat) falls on
    both sides alike instead of on whichever was timed second: the ratio of two ops that sit at the
    bandwidth limit moved 1-3% between runs when each was timed in one block."""
    a, b = [], []
    for _ in range(rounds):
        a.append(time_ms(fn_a, reps=reps, warmup=2))
        b.append(time_ms(fn_b, reps=reps, warmup=2))
    return statistics.median(a), statistics.median(b)


def desc(t, fmt=None, dtype=None):
    d = pydnn.create_tensor_descriptor()
    dims = list(t.shape)
    strides = list(t.stride())
    while len(dims) < 4:
        dims.append(1)
        strides.append(1)
    pydnn.set_tensor_nd_descriptor(d, dtype, len(dims), dims, strides)
    return d


class Bench:
    def __init__(self, elements):
        self.n = elements
        self.h = pydnn.create()
        pydnn.set_stream(self.h, torch.cuda.current_stream().cuda_stream)
        self.rows = []
        src = torch.empty(elements * 4, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        ms = time_ms(lambda: dst.copy_(src))
        self.copy_gbs = 2 * src.numel() / ms / 1e6
        print(f"device: {torch.cuda.get_device_name()}  copy bandwidth {self.copy_gbs:.0f} GB/s "
              f"({src.numel() / 2**20:.0f} MiB each way)", flush=True)

    def row(self, family, case, dtype, nbytes, ms_pydnn, ms_torch, torch_name):
        g_p = nbytes / ms_pydnn / 1e6
        g_t = nbytes / ms_torch / 1e6 if ms_torch else float("nan")
        r = dict(family=family, case=case, dtype=dtype, pydnn_gbs=g_p, pct_copy=100 * g_p / self.copy_gbs,
                 torch_gbs=g_t, ratio=(ms_torch / ms_pydnn) if ms_torch else float("nan"), torch=torch_name,
                 ms_pydnn=ms_pydnn, ms_torch=ms_torch)
        self.rows.append(r)
        print(f"{family:10s} {case:28s} {dtype:5s} pydnn {g_p:7.0f} GB/s {r['pct_copy']:5.1f}% copy | "
              f"torch {g_t:7.0f} GB/s | pydnn/torch speed {r['ratio']:.2f}x", flush=True)

    def row_flops(self, family, case, dtype, flops, ms_pydnn, ms_torch, torch_name, peak_tflops=None):
        """A compute-bound case: TFLOP/s of both, their ratio, and the fraction of `peak_tflops` (the
        hardware rate for this dtype, e.g. dense bf16 tensor-core) when given."""
        t_p = flops / ms_pydnn / 1e9
        t_t = flops / ms_torch / 1e9 if ms_torch else float("nan")
        r = dict(family=family, case=case, dtype=dtype, pydnn_tflops=t_p, torch_tflops=t_t,
                 pct_peak=(100 * t_p / peak_tflops) if peak_tflops else float("nan"),
                 ratio=(ms_torch / ms_pydnn) if ms_torch else float("nan"), torch=torch_name,
                 ms_pydnn=ms_pydnn, ms_torch=ms_torch)
        self.rows.append(r)
        print(f"{family:10s} {case:40s} {dtype:5s} pydnn {t_p:7.1f} TFLOP/s | torch {t_t:7.1f} TFLOP/s | "
              f"pydnn/torch speed {r['ratio']:.2f}x", flush=True)

    # ------------------------------------------------------------ families
    def activation(self):
        modes = [("relu", pydnn.PYDNN_ACTIVATION_RELU, torch.relu),
                 ("gelu_erf", pydnn.PYDNN_ACTIVATION_GELU_ERF, torch.nn.functional.gelu),
                 ("gelu_tanh", pydnn.PYDNN_ACTIVATION_GELU_TANH,
                  lambda x: torch.nn.functional.gelu(x, approximate="tanh")),
                 ("sigmoid", pydnn.PYDNN_ACTIVATION_SIGMOID, torch.sigmoid),
                 ("swish", pydnn.PYDNN_ACTIVATION_SWISH, torch.nn.functional.silu)]
        for dname in ("bf16", "fp32"):
            tdt, pdt = DT[dname]
            x = torch.randn(self.n, dtype=tdt, device="cuda")
            y = torch.empty_like(x)
            dx, dy = desc(x, dtype=pdt), desc(y, dtype=pdt)
            nbytes = 2 * x.numel() * x.element_size()
            for name, mode, tfn in modes:
                a = pydnn.create_activation_descriptor()
                pydnn.set_activation_descriptor(a, mode, pydnn.PYDNN_NOT_PROPAGATE_NAN, 0.0)
                xp, yp = x.data_ptr(), y.data_ptr()
                # PyTorch's functional ops write a freshly allocated output per call; pydnn writes into one
                # from the same allocator per call too, so both store to the same kind of block. Writing
                # into one fixed y measured 2% slower for the same kernel (the [into one fixed y] rows, bf16 and
                # fp32 relu, H200, 2026-11-23), enough to decide a ratio that sits at 1.0.
                fresh = lambda: pydnn.activation_forward(self.h, a, 1.0, dx, xp, 0.0, dy,  # noqa: E731
                                                         torch.empty_like(x).data_ptr())
                ms_p, ms_t = time_pair(fresh, lambda: tfn(x))
                self.row("activation", f"{name} forward", dname, nbytes, ms_p, ms_t, name)
                if name == "relu":
                    fixed = lambda: pydnn.activation_forward(self.h, a, 1.0, dx, xp, 0.0, dy, yp)  # noqa: E731
                    self.row("activation", "relu forward [into one fixed y]", dname, nbytes,
                             *time_pair(fixed, lambda: tfn(x)), name)
            # backward (relu): reads dy and x, writes dx (a fresh dx per call on both sides, as above)
            a = pydnn.create_activation_descriptor()
            pydnn.set_activation_descriptor(a, pydnn.PYDNN_ACTIVATION_RELU, pydnn.PYDNN_NOT_PROPAGATE_NAN, 0.0)
            g = torch.randn_like(x)
            ms_p, ms_t = time_pair(lambda: pydnn.activation_backward(self.h, a, 1.0, dy, y.data_ptr(), dx,
                                                                     g.data_ptr(), dx, x.data_ptr(), 0.0, dx,
                                                                     torch.empty_like(x).data_ptr()),
                                   lambda: torch.ops.aten.threshold_backward(g, x, 0.0))
            self.row("activation", "relu backward", dname, 3 * x.numel() * x.element_size(), ms_p, ms_t,
                     "threshold_backward")
            del x, y, g

    def tensor(self):
        if not hasattr(pydnn, "op_tensor"):
            print("tensor: pydnn.op_tensor not available, skipped")
            return
        for dname in ("bf16", "fp32"):
            tdt, pdt = DT[dname]
            a = torch.randn(self.n, dtype=tdt, device="cuda")
            b = torch.randn_like(a)
            c = torch.empty_like(a)
            da = desc(a, dtype=pdt)
            op = pydnn.create_op_tensor_descriptor()
            pydnn.set_op_tensor_descriptor(op, pydnn.PYDNN_OP_TENSOR_ADD, pydnn.PYDNN_DATA_FLOAT,
                                           pydnn.PYDNN_NOT_PROPAGATE_NAN)
            es = a.element_size()
            ms_p, ms_t = time_pair(lambda: pydnn.op_tensor(self.h, op, 1.0, da, a.data_ptr(), 1.0, da, b.data_ptr(),
                                                           0.0, da, c.data_ptr()),
                                   lambda: torch.add(a, b, out=c))
            self.row("tensor", "op_tensor add (c=a+b)", dname, 3 * a.numel() * es, ms_p, ms_t, "add(out=)")
            ms_p, ms_t = time_pair(lambda: pydnn.add_tensor(self.h, 1.0, da, a.data_ptr(), 1.0, da, c.data_ptr()),
                                   lambda: c.add_(a))
            self.row("tensor", "add_tensor (c+=a)", dname, 3 * a.numel() * es, ms_p, ms_t, "add_")
            # NCHW -> NHWC
            n, ch = 64, 64
            hw = self.n // (n * ch)
            side = int(hw ** 0.5)
            x = torch.randn(n, ch, side, side, dtype=tdt, device="cuda")
            y = torch.empty_like(x, memory_format=torch.channels_last)
            dxn, dyn = desc(x, dtype=pdt), desc(y, dtype=pdt)
            ms_p = time_ms(lambda: pydnn.transform_tensor(self.h, 1.0, dxn, x.data_ptr(), 0.0, dyn, y.data_ptr()))
            ms_t = time_ms(lambda: y.copy_(x))
            self.row("tensor", f"transform NCHW->NHWC {n}x{ch}x{side}x{side}", dname, 2 * x.numel() * es,
                     ms_p, ms_t, "copy_ to channels_last")
            del a, b, c, x, y

    def softmax(self):
        if not hasattr(pydnn, "softmax_forward"):
            print("softmax: pydnn.softmax_forward not available, skipped")
            return
        cols = 4096
        rows = self.n // cols
        for dname in ("bf16", "fp32"):
            tdt, pdt = DT[dname]
            x = torch.randn(rows, cols, 1, 1, dtype=tdt, device="cuda")
            y = torch.empty_like(x)
            d = desc(x, dtype=pdt)
            ms_p = time_ms(lambda: pydnn.softmax_forward(self.h, pydnn.PYDNN_SOFTMAX_ACCURATE,
                                                         pydnn.PYDNN_SOFTMAX_MODE_CHANNEL, 1.0, d, x.data_ptr(),
                                                         0.0, d, y.data_ptr()))
            x2 = x.view(rows, cols)
            ms_t = time_ms(lambda: torch.softmax(x2, dim=-1))
            self.row("softmax", f"forward rows of {cols}", dname, 2 * x.numel() * x.element_size(), ms_p, ms_t,
                     "torch.softmax")
            g = torch.randn_like(x)
            dxo = torch.empty_like(x)
            ms_p = time_ms(lambda: pydnn.softmax_backward(self.h, pydnn.PYDNN_SOFTMAX_ACCURATE,
                                                          pydnn.PYDNN_SOFTMAX_MODE_CHANNEL, 1.0, d, y.data_ptr(), d,
                                                          g.data_ptr(), 0.0, d, dxo.data_ptr()))
            y2, g2 = y.view(rows, cols), g.view(rows, cols)
            ms_t = time_ms(lambda: torch.ops.aten._softmax_backward_data(g2, y2, -1, tdt))
            self.row("softmax", f"backward rows of {cols}", dname, 3 * x.numel() * x.element_size(), ms_p, ms_t,
                     "_softmax_backward_data")
            del x, y, g, dxo

    def reduce(self):
        if not hasattr(pydnn, "reduce_tensor"):
            print("reduce: pydnn.reduce_tensor not available, skipped")
            return
        cols = 4096
        rows = self.n // cols
        for dname in ("bf16", "fp32"):
            tdt, pdt = DT[dname]
            x = torch.randn(rows, cols, 1, 1, dtype=tdt, device="cuda")
            y = torch.empty(rows, 1, 1, 1, dtype=tdt, device="cuda")
            dx, dy = desc(x, dtype=pdt), desc(y, dtype=pdt)
            r = pydnn.create_reduce_tensor_descriptor()
            pydnn.set_reduce_tensor_descriptor(r, pydnn.PYDNN_REDUCE_TENSOR_ADD, pydnn.PYDNN_DATA_FLOAT,
                                               pydnn.PYDNN_NOT_PROPAGATE_NAN, pydnn.PYDNN_REDUCE_TENSOR_NO_INDICES,
                                               pydnn.PYDNN_32BIT_INDICES)
            ws = pydnn.get_reduction_workspace_size(self.h, r, dx, dy)
            wbuf = torch.empty(max(ws, 1), dtype=torch.uint8, device="cuda")
            ms_p = time_ms(lambda: pydnn.reduce_tensor(self.h, r, None, 0, wbuf.data_ptr(), ws, 1.0, dx,
                                                       x.data_ptr(), 0.0, dy, y.data_ptr()))
            x2 = x.view(rows, cols)
            ms_t = time_ms(lambda: x2.sum(dim=1))
            self.row("reduce", f"sum rows of {cols}", dname, x.numel() * x.element_size(), ms_p, ms_t, "sum(dim=1)")
            del x

    def host(self):
        """Python host time of one small call: what a framework pays per op on tiny tensors."""
        x = torch.randn(1, device="cuda")
        y = torch.empty_like(x)
        d = desc(x, dtype=pydnn.PYDNN_DATA_FLOAT)
        a = pydnn.create_activation_descriptor()
        pydnn.set_activation_descriptor(a, pydnn.PYDNN_ACTIVATION_RELU, 0, 0.0)
        xp, yp, h = x.data_ptr(), y.data_ptr(), self.h
        calls = 20000
        results = {}
        for name, fn in (("pydnn.activation_forward (int pointers)",
                          lambda: pydnn.activation_forward(h, a, 1.0, d, xp, 0.0, d, yp)),
                         ("pydnn.activation_forward (torch tensors)",
                          lambda: pydnn.activation_forward(h, a, 1.0, d, x, 0.0, d, y)),
                         ("torch.relu", lambda: torch.relu(x))):
            for _ in range(1000):
                fn()
            torch.cuda.synchronize()
            samples = []
            for _ in range(5):
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                samples.append((time.perf_counter() - t0) / calls * 1e6)
                torch.cuda.synchronize()
            results[name] = statistics.median(samples)
            print(f"host       {name:42s} {results[name]:6.2f} us per call", flush=True)
        self.host_us = results


def to_markdown(b):
    lines = [f"Copy bandwidth measured in the same run: {b.copy_gbs:.0f} GB/s.", "",
             "| family | case | dtype | pydnn GB/s | % of copy | PyTorch GB/s | pydnn speed / PyTorch |",
             "|---|---|---|---:|---:|---:|---:|"]
    for r in b.rows:
        if "pydnn_tflops" in r:
            continue
        lines.append(f"| {r['family']} | {r['case']} | {r['dtype']} | {r['pydnn_gbs']:.0f} | {r['pct_copy']:.1f}% | "
                     f"{r['torch_gbs']:.0f} | {r['ratio']:.2f}x |")
    flops = [r for r in b.rows if "pydnn_tflops" in r]
    if flops:
        lines += ["", "| family | case | dtype | pydnn TFLOP/s | % of peak | PyTorch TFLOP/s | pydnn speed / PyTorch |",
                  "|---|---|---|---:|---:|---:|---:|"]
        lines += [f"| {r['family']} | {r['case']} | {r['dtype']} | {r['pydnn_tflops']:.1f} | {r['pct_peak']:.1f}% | "
                  f"{r['torch_tflops']:.1f} | {r['ratio']:.2f}x |" for r in flops]
    if getattr(b, "host_us", None):
        lines += ["", "| host time per small call | µs |", "|---|---:|"]
        lines += [f"| {k} | {v:.2f} |" for k, v in b.host_us.items()]
    return "\n".join(lines) + "\n"


def run_family(b, fam):
    """A method of Bench (foundation families) or tools/bench_<fam>.py's run(b) (`fam.entry`: that module's
    entry(b) instead, e.g. convolution_algos.run_fft); a failing family is reported and the others still run."""
    fam, _, entry = fam.partition(".")
    try:
        if hasattr(b, fam):
            getattr(b, fam)()
            return
        import importlib
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        try:
            mod = importlib.import_module(f"bench_{fam}")
        except ModuleNotFoundError as e:
            if e.name != f"bench_{fam}":
                raise
            print(f"{fam}: no benchmark yet (tools/bench_{fam}.py), skipped", flush=True)
            return
        getattr(mod, entry or "run")(b)
    except Exception:  # noqa: BLE001 - one family's failure must not hide the others' numbers
        import traceback
        print(f"{fam}: benchmark FAILED", flush=True)
        traceback.print_exc()
        b.failed = True
    finally:
        torch.cuda.empty_cache()


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--families", default="activation,tensor,softmax,reduce,host")
    p.add_argument("--elements", default="64M", help="elements per tensor (K/M/G suffixes)")
    p.add_argument("--out", help="write the markdown table here")
    p.add_argument("--plot", action="store_true", help="PNG charts per family (pydnn / PyTorch speed, %% of the "
                   "hardware limit) next to --out (else in the current folder), and the rows as JSON")
    args = p.parse_args()
    mult = {"K": 2**10, "M": 2**20, "G": 2**30}
    e = args.elements.upper()
    n = int(e[:-1]) * mult[e[-1]] if e[-1] in mult else int(e)
    torch.manual_seed(0)
    np.random.seed(0)
    b = Bench(n)
    for fam in args.families.split(","):
        run_family(b, fam.strip())
    md = to_markdown(b)
    if getattr(b, "failed", False):
        md += "\nSome benchmark families FAILED: see the log.\n"
    print("\n" + md)
    if args.out:
        with open(args.out, "w") as f:
            f.write(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
                    f"cuDNN {torch.backends.cudnn.version()}, pydnn {pydnn.__version__}\n\n" + md)
    if args.plot:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import bench_plot

        out_dir = os.path.dirname(os.path.abspath(args.out)) if args.out else os.getcwd()
        stem = os.path.splitext(os.path.basename(args.out))[0] if args.out else "bench"
        device = torch.cuda.get_device_name()
        bench_plot.save_rows(os.path.join(out_dir, stem + ".json"), b.rows, b.copy_gbs, device)
        for path in bench_plot.plot(b.rows, b.copy_gbs, out_dir, stem, device):
            print(f"chart: {path}")


if __name__ == "__main__":
    main()
