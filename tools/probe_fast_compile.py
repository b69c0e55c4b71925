"""A/B of an NVRTC option that cuts compile time (default --Ofast-compile=min: 2.4-2.7x fewer NVRTC CPU
seconds on reduce.f16 / matmul.f16.nn, sm_90, NVRTC 13.5, with different SASS): the same calls timed on two
handles in alternating rounds (tools/bench.py time_pair), one loading the units as the build compiles them,
the other copies of those units compiled with the option (their own names and cache keys). Prints one line a
case: ms default, ms with the option, ratio (> 1: the option's kernels are slower). (NVRTC CPU seconds both
ways: tools/build_stats.py --options.)

    python tools/probe_fast_compile.py [--option=--Ofast-compile=min] [--jobs 8] [--out DIR]
"""
import argparse
import json
import os
import sys
import time
from dataclasses import replace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tools"))

import pydnn  # noqa: E402
from pydnn._build import build, loader, manifest  # noqa: E402
from pydnn._cuda import nvrtc  # noqa: E402
from pydnn.ops import matmul as M  # noqa: E402

UNITS = ("matmul.bf16.nn", "matmul.tma.bf16", "matmul.wgmmap.bf16", "convolution.wgmma.bf16", "softmax.bf16")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--option", default="--Ofast-compile=min")
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    import torch
    from bench import time_pair

    arch = build.target_archs()[0]
    table = manifest.unit_by_name(arch)
    base = [table[n] for n in UNITS if n in table]
    fast = [replace(u, name=u.name + ".fast", options=tuple(u.options) + (args.option,)) for u in base]
    loader.register_units(fast)
    t0 = time.time()
    build.build_all(archs=[arch], units=base, jobs=args.jobs, progress=False)
    build.build_all(archs=[arch], units=fast, jobs=args.jobs, progress=False)
    print(f"built {len(base)} units both ways in {time.time() - t0:.1f} s (NVRTC {nvrtc.version()})", flush=True)
    rows = []
    names = {f.name for f in fast}

    ha, hb = pydnn.create(), pydnn.create()
    stream = torch.cuda.current_stream().cuda_stream
    for h in (ha, hb):
        pydnn.set_stream(h, stream)

    class FastFuncs(dict):
        """hb's kernel table: a kernel of UNITS comes from its copy compiled with the option."""

        def get(self, key, default=None):
            f = dict.get(self, key)
            if f is None and isinstance(key, tuple) and len(key) == 2:
                name = loader.resolve(arch, key[0], key[1]) + ".fast"
                if name in names:
                    f = loader.get_function(hb.ctx, arch, name, key[1])
                    self[key] = f
            return f
    hb._funcs = FastFuncs()

    bf = pydnn.PYDNN_DATA_BFLOAT16
    cases = []
    for m, n, k in ((1024, 1024, 1024), (4096, 4096, 128), (4096, 4096, 4096), (8192, 8192, 8192)):
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        cases.append((f"matmul bf16 {m}x{n}x{k}", lambda h, a=a, b=b, c=c, m=m, n=n, k=k:
                      M.gemm(h, bf, m, n, k, a.data_ptr(), b.data_ptr(), c.data_ptr()), 2.0 * m * n * k))
    for rows_, length in ((16384, 4096), (4096, 50257)):
        x = torch.randn(rows_, length, device="cuda", dtype=torch.bfloat16)
        y = torch.empty_like(x)
        d = pydnn.create_tensor_descriptor()
        pydnn.set_tensor_nd_descriptor(d, bf, 4, [rows_, length, 1, 1], [length, 1, 1, 1])
        cases.append((f"softmax bf16 {rows_}x{length}", lambda h, d=d, x=x, y=y: pydnn.softmax_forward(
            h, pydnn.PYDNN_SOFTMAX_ACCURATE, pydnn.PYDNN_SOFTMAX_MODE_INSTANCE, 1.0, d, x.data_ptr(), 0.0, d,
            y.data_ptr()), None))
    for n_, c_, hw, k_, f_ in ((32, 64, 56, 64, 3), (32, 256, 14, 256, 3)):
        conv = pydnn.create_convolution_descriptor()
        pydnn.set_convolution2d_descriptor(conv, f_ // 2, f_ // 2, 1, 1, 1, 1, pydnn.PYDNN_CROSS_CORRELATION,
                                           pydnn.PYDNN_DATA_FLOAT)
        xd, yd = pydnn.create_tensor_descriptor(), pydnn.create_tensor_descriptor()
        wd = pydnn.create_filter_descriptor()
        pydnn.set_tensor4d_descriptor(xd, pydnn.PYDNN_TENSOR_NHWC, bf, n_, c_, hw, hw)
        pydnn.set_filter4d_descriptor(wd, bf, pydnn.PYDNN_TENSOR_NHWC, k_, c_, f_, f_)
        pydnn.set_tensor4d_descriptor(yd, pydnn.PYDNN_TENSOR_NHWC, bf, n_, k_, hw, hw)
        x = torch.randn(n_, hw, hw, c_, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(k_, f_, f_, c_, device="cuda", dtype=torch.bfloat16)
        y = torch.empty(n_, hw, hw, k_, device="cuda", dtype=torch.bfloat16)
        algo = pydnn.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM
        cases.append((f"conv fwd bf16 NHWC {n_}x{c_}x{hw}^2 -> {k_} {f_}x{f_}", lambda h, conv=conv, xd=xd, wd=wd,
                      yd=yd, x=x, w=w, y=y, algo=algo: pydnn.convolution_forward(
                          h, 1.0, xd, x.data_ptr(), wd, w.data_ptr(), conv, algo, None, 0, 0.0, yd, y.data_ptr()),
                      2.0 * n_ * hw * hw * k_ * c_ * f_ * f_))
    for name, fn, flops in cases:
        try:
            fn(ha)
            fn(hb)
            torch.cuda.synchronize()
            ta, tb = time_pair(lambda: fn(ha), lambda: fn(hb), rounds=4, reps=8)
        except Exception as e:  # noqa: BLE001 - a case that does not run here: say so, go on
            print(f"{name}: {type(e).__name__}: {str(e)[:160]}", flush=True)
            continue
        tf = f" ({flops / ta / 1e9:.0f} / {flops / tb / 1e9:.0f} TFLOP/s)" if flops else ""
        print(f"{name:44s} {ta:8.4f} ms  {tb:8.4f} ms  ratio {tb / ta:6.3f}{tf}", flush=True)
        rows.append(dict(case=name, ms_default=ta, ms_option=tb, ratio=tb / ta))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "fast_compile.json"), "w") as f:
            json.dump(dict(option=args.option, arch=arch, nvrtc=list(nvrtc.version()), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
