#!/usr/bin/env python3
"""map_contig geometry and cache-policy variants on the tools/bench.py element-wise cases (64M elements),
for tuning ptx/common/elementwise.cuh; results and notes in tools/PERF.md ("Element-wise").

    python3 tools/bench_elementwise_sweep.py [--elements 64M] [--out FILE]

Each variant is one instantiation map_contig<TI, TO, Op, VEC, THREADS, UNROLL, HINT> (compiled here in
private units, so the sweep never touches the installed cache's units) launched on a grid that covers every
tile once; MINB (a register cap for that many blocks per SM) 1 leaves the registers to the compiler.
Each output is checked against PyTorch's, and every case is timed like tools/bench.py (time_ms), twice,
in two passes over all variants, so the spread between the passes shows the noise.
"""
import argparse
import os
import sys
from concurrent.futures import ThreadPoolExecutor

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import time_ms  # noqa: E402

import pydnn  # noqa: E402
from pydnn._build import build, loader  # noqa: E402
from pydnn._build.manifest import KernelUnit  # noqa: E402
from pydnn._build.params import FLAG_BETA, MapParams  # noqa: E402
from pydnn._cuda import driver  # noqa: E402
from pydnn.ops import _elementwise as ew  # noqa: E402

TAGS = {"bf16": ("bf16", torch.bfloat16), "fp32": ("f32", torch.float32)}

# (label, threads, elements per thread (whole vectors, at least one), hint, MINB (0: the kernel's rule)).
# Dropped after the first sweep (2026-11-23, tools/PERF.md): 256 threads x 4 vectors (the old geometry),
# 256 x 16 elements, 512 x 8, inputs through ld.global.nc.L1::no_allocate (same as cs), persistent grids.
GEOMS = [
    ("t128 e8", 128, 8, 0, 0),
    ("t128 e8 cs", 128, 8, 1, 0),
    ("t128 e8 regs free", 128, 8, 0, 1),
    ("t128 e8 cs regs free", 128, 8, 1, 1),
    ("t128 e16", 128, 16, 0, 0),
    ("t128 e16 cs", 128, 16, 1, 0),
]

# (label, source, functor (FAST for 16-bit filled in), inputs, blend, torch fn(inputs, out), bytes per element)
CASES = [
    ("relu forward", "activation.cu", "pydnn::act::Relu<{fast}>", 1, False, lambda i, o: torch.relu(i[0]), 2),
    ("gelu_erf forward", "activation.cu", "pydnn::act::GeluErf<{fast}>", 1, False,
     lambda i, o: torch.nn.functional.gelu(i[0]), 2),
    ("gelu_tanh forward", "activation.cu", "pydnn::act::GeluTanh<{fast}>", 1, False,
     lambda i, o: torch.nn.functional.gelu(i[0], approximate="tanh"), 2),
    ("sigmoid forward", "activation.cu", "pydnn::act::Sigmoid<{fast}>", 1, False, lambda i, o: torch.sigmoid(i[0]), 2),
    ("swish forward", "activation.cu", "pydnn::act::Swish<{fast}>", 1, False,
     lambda i, o: torch.nn.functional.silu(i[0]), 2),
    ("op_tensor add (c=a+b)", "tensor_ops.cu", "pydnn::tensor::OpAdd", 2, False,
     lambda i, o: torch.add(i[0], i[1], out=o), 3),
    ("add_tensor (c+=a)", "tensor_ops.cu", "pydnn::tensor::Scaled", 1, True, lambda i, o: o.add_(i[0]), 3),
]


def _unroll(elems, vec):
    return max(1, elems // vec)


def _expr(case, dname, geom):
    tag = TAGS[dname][0]
    op = case[2].format(fast="true" if tag == "bf16" else "false")
    vec = ew.vec_width(tag, tag)
    e = ew.contig_expr(op, tag, tag, threads=geom[1], unroll=_unroll(geom[2], vec), hint=geom[3])
    return f"{e[:-1]}, {geom[4]}>" if geom[4] else e


def _units():
    units = {}
    for case in CASES:
        for dname in TAGS:
            name = f"ew_sweep.{case[1].split('.')[0]}.{dname}"
            exprs = units.setdefault(name, (case[1], set()))[1]
            exprs.update(_expr(case, dname, g) for g in GEOMS)
    return {n: KernelUnit(n, src, tuple(sorted(e))) for n, (src, e) in units.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--elements", default="64M")
    ap.add_argument("--out")
    args = ap.parse_args()
    e = args.elements.upper()
    n = int(e[:-1]) * {"K": 2**10, "M": 2**20}[e[-1]] if e[-1] in "KM" else int(e)
    h = pydnn.create()
    pydnn.set_stream(h, torch.cuda.current_stream().cuda_stream)
    src = torch.empty(n * 4, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy = 2 * src.numel() / time_ms(lambda: dst.copy_(src)) / 1e6
    del src, dst
    print(f"sweep: copy {copy:.0f} GB/s, {h.sm_count} SMs, {n} elements", flush=True)

    loader._unit("activation.f32")  # the table of units exists
    units = _units()
    loader._units.update(units)
    with ThreadPoolExecutor(max_workers=len(units)) as pool:
        for f in [pool.submit(build.compile_unit, u, h.arch) for u in units.values()]:
            f.result()
    print(f"sweep: {sum(len(u.exprs) for u in units.values())} kernels compiled", flush=True)

    results = {}  # (case, dtype, geom label) -> [GB/s per pass]; (case, dtype, "torch") likewise
    lines = []
    for dname, (tag, tdt) in TAGS.items():
        g = torch.Generator(device="cuda").manual_seed(0)
        ins = [torch.randn(n, dtype=tdt, device="cuda", generator=g) for _ in range(2)]
        out = torch.empty_like(ins[0])
        for case in CASES:
            label, _, _, nin, blend, tfn, per = case
            nbytes = per * n * ins[0].element_size()
            p = MapParams()
            p.n, p.ndim, p.size[0] = n, 1, n
            for k in range(4):
                p.stride[k][0] = 1
            p.out = out.data_ptr()
            for k in range(nin):
                p.in_[k] = ins[k].data_ptr()
            p.alpha, p.alpha2, p.beta, p.coef2 = 1.0, 1.0, 1.0 if blend else 0.0, 1.0  # coef2: swish beta
            p.flags = FLAG_BETA if blend else 0
            argv = driver.kernel_args(p)
            # correctness once per variant, from a fresh output
            base = torch.randn(n, dtype=tdt, device="cuda", generator=g) if blend else None
            want = tfn(ins, base.clone() if blend else out.clone()).float()
            launches = []
            for geom in GEOMS:
                expr = _expr(case, dname, geom)
                func = h.function(f"ew_sweep.{case[1].split('.')[0]}.{dname}", expr)
                vec = ew.vec_width(tag, tag)
                tiles = -(-(n // vec) // (geom[1] * _unroll(geom[2], vec)))
                grid = tiles
                fn = (lambda f=func, gr=grid, b=geom[1]:
                      driver.launch_args(f, (gr, 1, 1), (b, 1, 1), 0, h.cu_stream, argv))
                if blend:
                    out.copy_(base)
                else:
                    out.fill_(float("nan"))
                fn()
                err = (out.float() - want).abs().max().item()
                ok = err <= (0.02 if tag == "bf16" else 1e-5) * max(1.0, want.abs().max().item())
                if not ok:
                    print(f"sweep {dname} {label} {geom[0]}: WRONG (max abs error {err})", flush=True)
                launches.append((geom, fn, ok))
            tref = lambda: tfn(ins, out)  # noqa: E731
            for _pass in range(2):
                ms_t = time_ms(tref)
                results.setdefault((label, dname, "torch"), []).append(nbytes / ms_t / 1e6)
                for geom, fn, ok in launches:
                    ms = time_ms(fn)
                    results.setdefault((label, dname, geom[0]), []).append(nbytes / ms / 1e6)
            t = results[(label, dname, "torch")]
            tmean = sum(t) / len(t)
            print(f"sweep {dname} {label}: torch {tmean:.0f} GB/s ({100 * tmean / copy:.1f}% copy; passes "
                  f"{t[0]:.0f} / {t[1]:.0f})", flush=True)
            for geom, fn, ok in launches:
                r = results[(label, dname, geom[0])]
                m = sum(r) / len(r)
                row = (f"| {label} | {dname} | {geom[0]} | {m:.0f} | {100 * m / copy:.1f}% | {m / tmean:.3f}x | "
                       f"{r[0]:.0f} / {r[1]:.0f} |{'' if ok else ' WRONG'}")
                print("sweep " + row, flush=True)
                lines.append(row)
        del ins, out
        torch.cuda.empty_cache()
    md = (f"copy {copy:.0f} GB/s, {torch.cuda.get_device_name()}\n\n| case | dtype | variant | GB/s | % copy | "
          "vs torch | passes |\n|---|---|---|---:|---:|---:|---|\n" + "\n".join(lines) + "\n")
    print("\n" + md)
    if args.out:
        with open(args.out, "w") as f:
            f.write(md)


if __name__ == "__main__":
    main()
