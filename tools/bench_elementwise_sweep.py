#!/usr/bin/env python3
"""map_contig geometry and cache-policy variants on the tools/bench.py element-wise cases (64M elements),
for tuning ptx/common/elementwise.cuh; results and notes in tools/PERF.md ("Element-wise").

    python3 tools/bench_elementwise_sweep.py [--elements 64M] [--out FILE]

Each variant is one instantiation map_contig<TI, TO, Op, VEC, THREADS, UNROLL, HINT> (compiled here in
private units, so the sweep never touches the installed cache's units) launched on a grid that covers every
tile once; MINB (a register cap for that many blocks per SM) 1 leaves the registers to the compiler.
Each output is checked against PyTorch's, and every case is timed like tools/bench.py (time_ms), twice,
in two passes over all variants, so the spread between the passes shows the noise. Earlier versions of an
op can be compared through bench-only functors (VARIANTS_SRC, compiled from a file the sweep writes into
the kernel sources for its run and removes), and the activation cases are also timed through
pydnn.activation_forward ("pydnn API" rows: the product's kernel and host path on the same buffers).
"""
import argparse
import os
import sys
from concurrent.futures import ThreadPoolExecutor

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import desc, time_ms  # noqa: E402

import pydnn  # noqa: E402
from pydnn._build import build, cache, loader  # noqa: E402
from pydnn._build.manifest import KernelUnit  # noqa: E402
from pydnn._build.params import FLAG_BETA, MapParams  # noqa: E402
from pydnn._cuda import driver  # noqa: E402
from pydnn.ops import _elementwise as ew  # noqa: E402

TAGS = {"bf16": ("bf16", torch.bfloat16), "fp32": ("f32", torch.float32)}
PDT = {"bf16": pydnn.PYDNN_DATA_BFLOAT16, "fp32": pydnn.PYDNN_DATA_FLOAT}
# Cases also timed through pydnn.activation_forward (the product's kernel and host path, as tools/bench.py
# calls it), next to the direct launches of the same buffers: the API row and the direct row of the
# product's geometry differ only by the host path.
API_MODES = {"relu forward": pydnn.PYDNN_ACTIVATION_RELU, "relu forward, input next to the output":
             pydnn.PYDNN_ACTIVATION_RELU, "gelu_erf forward": pydnn.PYDNN_ACTIVATION_GELU_ERF,
             "gelu_tanh forward": pydnn.PYDNN_ACTIVATION_GELU_TANH, "sigmoid forward": pydnn.PYDNN_ACTIVATION_SIGMOID,
             "swish forward": pydnn.PYDNN_ACTIVATION_SWISH}

# (label, threads, elements per thread (whole vectors, at least one), hint, MINB (0: the kernel's rule)).
# Dropped after the first sweep (2026-11-23, tools/PERF.md): 256 threads x 4 vectors (the old geometry),
# 256 x 16 elements, 512 x 8, inputs through ld.global.nc.L1::no_allocate (same as cs), persistent grids.
# A variant whose elements per thread are fewer than one vector of the type (e4 for bf16) is skipped.
GEOMS = [
    ("t128 e8", 128, 8, 0, 0),
    ("t128 e8 cs", 128, 8, 1, 0),
    ("t128 e8 cs regs free", 128, 8, 1, 1),
    ("t128 e16 cs", 128, 16, 1, 0),
    ("t128 e4 cs", 128, 4, 1, 0),
]

# Bench-only functors, compiled from a source file the sweep writes next to the kernels for its run (and
# removes): earlier versions of an op, to compare with the current one in the same run.
# GeluErfV4: v4/v5's 16-bit erf GELU, alpha * x * phi_fast(x) (Phi's select and 1 - h), element by element
# (MapExact: no paired unpack / cvt.rn.bf16x2); its case passes alpha2 = 0, so map_contig's alpha == 1
# whole-tile variant is not taken either: v5's instruction stream.
VARIANTS = "_sweep_variants.cu"
VARIANTS_SRC = """#include "activation.cu"
namespace pydnn {
namespace sweep {
template <bool FAST> struct GeluErfV4 {
  static constexpr unsigned reads = 1;
  template <class A> __device__ static A apply(A x, A, A, const MapParams&, A alpha, A) {
    return alpha * x * act::gelu_cdf<FAST>(x);
  }
};
}  // namespace sweep
template <bool FAST> struct MapExact<sweep::GeluErfV4<FAST>> { static constexpr bool value = true; };
}  // namespace pydnn
"""

# (label, source, functor (FAST for 16-bit filled in), inputs, blend, torch fn(inputs, out), bytes per element,
#  dtypes, alpha2, first input): the inputs are ins[first:], of ins[0], ins[1], out allocated in this order
# ("next to the output": the input allocated just before the output, as tools/bench.py allocates x, y).
BOTH = ("bf16", "fp32")
CASES = [
    ("relu forward", "activation.cu", "pydnn::act::Relu<{fast}>", 1, False, lambda i, o: torch.relu(i[0]), 2,
     BOTH, 1.0, 0),
    ("relu forward, input next to the output", "activation.cu", "pydnn::act::Relu<{fast}>", 1, False,
     lambda i, o: torch.relu(i[0]), 2, BOTH, 1.0, 1),
    ("gelu_erf forward", "activation.cu", "pydnn::act::GeluErf<{fast}>", 1, False,
     lambda i, o: torch.nn.functional.gelu(i[0]), 2, BOTH, 1.0, 0),
    ("gelu_erf forward, alpha2 0 (no alpha-1 tile)", "activation.cu", "pydnn::act::GeluErf<{fast}>", 1, False,
     lambda i, o: torch.nn.functional.gelu(i[0]), 2, ("bf16",), 0.0, 0),
    ("gelu_erf v5 form", VARIANTS, "pydnn::sweep::GeluErfV4<{fast}>", 1, False,
     lambda i, o: torch.nn.functional.gelu(i[0]), 2, ("bf16",), 0.0, 0),
    ("gelu_tanh forward", "activation.cu", "pydnn::act::GeluTanh<{fast}>", 1, False,
     lambda i, o: torch.nn.functional.gelu(i[0], approximate="tanh"), 2, BOTH, 1.0, 0),
    ("sigmoid forward", "activation.cu", "pydnn::act::Sigmoid<{fast}>", 1, False, lambda i, o: torch.sigmoid(i[0]),
     2, BOTH, 1.0, 0),
    ("swish forward", "activation.cu", "pydnn::act::Swish<{fast}>", 1, False,
     lambda i, o: torch.nn.functional.silu(i[0]), 2, BOTH, 1.0, 0),
    ("op_tensor add (c=a+b)", "tensor_ops.cu", "pydnn::tensor::OpAdd", 2, False,
     lambda i, o: torch.add(i[0], i[1], out=o), 3, BOTH, 1.0, 0),
    ("add_tensor (c+=a)", "tensor_ops.cu", "pydnn::tensor::Scaled", 1, True, lambda i, o: o.add_(i[0]), 3, BOTH,
     0.0, 0),
]


def _unroll(elems, vec):
    return max(1, elems // vec)


def _geoms(dname):
    vec = ew.vec_width(TAGS[dname][0], TAGS[dname][0])
    return [g for g in GEOMS if g[2] >= vec]


def _unit_name(case, dname):
    return f"ew_sweep.{case[1].split('.')[0].strip('_')}.{dname}"


def _expr(case, dname, geom):
    tag = TAGS[dname][0]
    op = case[2].format(fast="true" if tag == "bf16" else "false")
    vec = ew.vec_width(tag, tag)
    e = ew.contig_expr(op, tag, tag, threads=geom[1], unroll=_unroll(geom[2], vec), hint=geom[3])
    return f"{e[:-1]}, {geom[4]}>" if geom[4] else e


def _units():
    units = {}
    for case in CASES:
        for dname in case[7]:
            exprs = units.setdefault(_unit_name(case, dname), (case[1], set()))[1]
            exprs.update(_expr(case, dname, g) for g in _geoms(dname))
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

    units = _units()
    loader.register_units(units.values())
    variants = cache.ptx_dir() / VARIANTS
    variants.write_text(VARIANTS_SRC)
    try:
        with ThreadPoolExecutor(max_workers=len(units)) as pool:
            for f in [pool.submit(build.compile_unit, u, h.arch) for u in units.values()]:
                f.result()
    finally:
        variants.unlink()
    print(f"sweep: {sum(len(u.exprs) for u in units.values())} kernels compiled", flush=True)

    results = {}  # (case, dtype, geom label) -> [GB/s per pass]; (case, dtype, "torch") likewise
    lines = []
    for dname, (tag, tdt) in TAGS.items():
        g = torch.Generator(device="cuda").manual_seed(0)
        ins = [torch.randn(n, dtype=tdt, device="cuda", generator=g) for _ in range(2)]
        out = torch.empty_like(ins[0])
        for case in CASES:
            label, _, _, nin, blend, tfn, per, dnames, alpha2, first = case
            if dname not in dnames:
                continue
            cins = ins[first:]
            nbytes = per * n * ins[0].element_size()
            p = MapParams()
            p.n, p.ndim, p.size[0] = n, 1, n
            for k in range(4):
                p.stride[k][0] = 1
            p.out = out.data_ptr()
            for k in range(nin):
                p.in_[k] = cins[k].data_ptr()
            p.alpha, p.alpha2, p.beta, p.coef2 = 1.0, alpha2, 1.0 if blend else 0.0, 1.0  # coef2: swish beta
            p.flags = FLAG_BETA if blend else 0
            argv = driver.kernel_args(p)
            # correctness once per variant, from a fresh output
            base = torch.randn(n, dtype=tdt, device="cuda", generator=g) if blend else None
            want = tfn(cins, base.clone() if blend else out.clone()).float()
            launches = []
            for geom in _geoms(dname):
                expr = _expr(case, dname, geom)
                func = h.function(_unit_name(case, dname), expr)
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
            if label in API_MODES:
                ad = pydnn.create_activation_descriptor()
                pydnn.set_activation_descriptor(ad, API_MODES[label], pydnn.PYDNN_NOT_PROPAGATE_NAN, 0.0)
                td = desc(out, dtype=PDT[dname])
                fn = (lambda ad=ad, td=td, xp=cins[0].data_ptr(), yp=out.data_ptr():
                      pydnn.activation_forward(h, ad, 1.0, td, xp, 0.0, td, yp))
                out.fill_(float("nan"))
                fn()
                err = (out.float() - want).abs().max().item()
                ok = err <= (0.02 if tag == "bf16" else 1e-5) * max(1.0, want.abs().max().item())
                launches.append((("pydnn API",), fn, ok))
            tref = lambda: tfn(cins, out)  # noqa: E731
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
