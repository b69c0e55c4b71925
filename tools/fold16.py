#!/usr/bin/env python3
"""Half and bfloat16 folded into one instantiation (pydnn::h16_t, ptx/common/h16.cuh; issue 21's install time):
compare a folded unit with its typed twins, the same instantiations with pydnn::half_t and pydnn::bf16_t.

CPU (no GPU needed):
  python3 tools/fold16.py --arch sm_90 activation.h16 tensor_ops.h16
    each unit and its two typed twins compiled one at a time: NVRTC CPU seconds (the build saves the typed pair's
    sum minus the folded unit's), and per kernel registers, spills and SASS instructions (cuobjdump, where found:
    $PYDNN_CUOBJDUMP, PATH, /usr/local/cuda/bin).
GPU (--gpu): the families' public calls on 16-bit tensors, folded (the install's kernels) and typed (the same
planners with the fold off: _elementwise.set_fold16(False), the typed units registered with the loader), the
outputs compared bit for bit and each launch timed (median of CUDA-event timed repeats):
  python3 tools/fold16.py --gpu [--out DIR]
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import replace

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

TYPED = {"f16": "pydnn::half_t", "bf16": "pydnn::bf16_t"}


def typed_twins(unit):
    """The typed (half, bfloat16) units of a folded unit: h16_t -> half_t / bf16_t, names *.f16 / *.bf16."""
    out = []
    for tag, ct in TYPED.items():
        exprs = tuple(dict.fromkeys(e.replace("pydnn::h16_t", ct) for e in unit.exprs))
        out.append(replace(unit, name=unit.name.replace("h16", tag) + ".typed", exprs=exprs, home=""))
    return out


def _cuobjdump():
    for c in (os.environ.get("PYDNN_CUOBJDUMP"), shutil.which("cuobjdump"), "/usr/local/cuda/bin/cuobjdump"):
        if c and os.path.exists(c):
            return c
    return None


def compile_stats(unit, arch):
    """(CPU seconds, {lowered name: (registers, spill bytes, SASS instructions or None)}, {expr: lowered})."""
    from pydnn._build import cache
    from pydnn._build.options import common_options
    from pydnn._cuda import nvrtc

    text, _ = cache.unit_inputs(unit)
    t0 = os.times()
    cubin, lowered, log = nvrtc.compile_cubin(text, unit.source, unit.exprs, arch,
                                              common_options() + tuple(unit.options) + ("--ptxas-options=-v",),
                                              [str(cache.ptx_dir())], unit=unit.name)
    t1 = os.times()
    cpu = (t1.user - t0.user) + (t1.system - t0.system) + (t1.children_user - t0.children_user)
    kern, cur = {}, None
    for line in (log or "").splitlines():
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            cur = m.group(1)
            kern[cur] = [0, 0, None]
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and cur:
            kern[cur][1] = int(m.group(1)) + int(m.group(2))
        m = re.search(r"Used (\d+) registers", line)
        if m and cur:
            kern[cur][0] = int(m.group(1))
    tool = _cuobjdump()
    if tool:
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(cubin)
            f.flush()
            sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True).stdout
        fn = None
        for line in sass.splitlines():
            m = re.search(r"Function : (\S+)", line)
            if m:
                fn = m.group(1)
                if fn in kern:
                    kern[fn][2] = 0
            elif fn in kern and re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+\S", line):
                kern[fn][2] += 1
    return cpu, {k: tuple(v) for k, v in kern.items()}, lowered


def cpu_main(args):
    from pydnn._build import manifest

    units = {u.name: u for u in manifest.install_units(args.arch)}
    units.update({u.name: u for u in manifest.all_units(args.arch)})
    total_f = total_t = 0.0
    for name in args.units:
        u = units[name]
        cf, kf, lf = compile_stats(u, args.arch)
        twins = typed_twins(u)
        res = [compile_stats(t, args.arch) for t in twins]
        ct = sum(r[0] for r in res)
        total_f, total_t = total_f + cf, total_t + ct
        print(f"{name} ({len(u.exprs)} kernels) {args.arch}: folded {cf:.1f} CPU s; typed "
              f"{' + '.join(f'{r[0]:.1f}' for r in res)} = {ct:.1f}")
        for e in u.exprs:
            f = kf.get(lf.get(e), (None, None, None))
            row = [f"  {e[:110]}", f"folded r{f[0]} s{f[1]} i{f[2]}"]
            for t, (_, kt, lt) in zip(twins, res):
                te = e.replace("pydnn::h16_t", TYPED["f16" if ".f16." in t.name + "." else "bf16"])
                k = kt.get(lt.get(te), (None, None, None))
                row.append(f"{'f16' if '.f16' in t.name else 'bf16'} r{k[0]} s{k[1]} i{k[2]}")
            if args.kernels:
                print(" | ".join(row))
    print(f"all: folded {total_f:.1f} CPU s, typed pairs {total_t:.1f} ({args.arch})")


# ------------------------------------------------------------------------------------------------ GPU
def _time(fn, reps):
    """Median microseconds of `reps` CUDA-event timed calls (after one warm-up call)."""
    import torch

    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    return statistics.median(ts)


_DT = {}


def _td(dt, dims, fmt=None):
    import pydnn

    d = pydnn.create_tensor_descriptor()
    pydnn.set_tensor_nd_descriptor_ex(d, fmt if fmt is not None else pydnn.PYDNN_TENSOR_NCHW, _DT[dt], len(dims), list(dims))
    return d


def gpu_cases():
    """(name, make(handle, dtype) -> (run(), output tensor)) for the folded families' common calls."""
    import torch
    import pydnn

    def rnd(shape, seed, dt, scale=1.0):
        g = torch.Generator(device="cuda").manual_seed(seed)
        return (torch.randn(shape, device="cuda", generator=g) * scale).to(dt)

    def act(mode, shape, bwd=False):
        def make(h, dt):
            x, y = rnd(shape, 1, dt, 3.0), torch.empty(shape, device="cuda", dtype=dt)
            d = pydnn.create_activation_descriptor()
            pydnn.set_activation_descriptor(d, mode, pydnn.PYDNN_NOT_PROPAGATE_NAN, 0.0)
            td = _td(dt, shape)
            if not bwd:
                return (lambda: pydnn.activation_forward(h, d, 1.0, td, x.data_ptr(), 0.0, td, y.data_ptr())), y
            dy, yy = rnd(shape, 2, dt), torch.empty_like(x)
            pydnn.activation_forward(h, d, 1.0, td, x.data_ptr(), 0.0, td, yy.data_ptr())
            return (lambda: pydnn.activation_backward(h, d, 1.0, td, yy.data_ptr(), td, dy.data_ptr(), td,
                                                      x.data_ptr(), 0.0, td, y.data_ptr())), y
        return make

    def optensor(op, shape, bshape):
        def make(h, dt):
            a, b, c = rnd(shape, 3, dt), rnd(bshape, 4, dt), torch.empty(shape, device="cuda", dtype=dt)
            od = pydnn.create_op_tensor_descriptor()
            pydnn.set_op_tensor_descriptor(od, op, pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_NOT_PROPAGATE_NAN)
            ad, bd = _td(dt, shape), _td(dt, bshape)
            return (lambda: pydnn.op_tensor(h, od, 1.0, ad, a.data_ptr(), 0.5, bd, b.data_ptr(), 0.0, ad,
                                            c.data_ptr())), c
        return make

    def transform(shape, other, dst_fmt):
        def make(h, dt):  # other: from the other 16-bit type (a conversion between the two formats)
            src = {torch.float16: torch.bfloat16, torch.bfloat16: torch.float16}[dt] if other else dt
            x, y = rnd(shape, 6, src), torch.empty(shape, device="cuda", dtype=dt)
            xd, yd = _td(src, shape), _td(dt, shape, dst_fmt)
            return (lambda: pydnn.transform_tensor(h, 1.0, xd, x.data_ptr(), 0.0, yd, y.data_ptr())), y
        return make

    def reduce(op, shape, cshape):
        def make(h, dt):
            x, y = rnd(shape, 7, dt), torch.empty(cshape, device="cuda", dtype=dt)
            r = pydnn.create_reduce_tensor_descriptor()
            pydnn.set_reduce_tensor_descriptor(r, op, pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_NOT_PROPAGATE_NAN,
                                               pydnn.PYDNN_REDUCE_TENSOR_NO_INDICES, pydnn.PYDNN_32BIT_INDICES)
            xd, yd = _td(dt, shape), _td(dt, cshape)
            ws = pydnn.get_reduction_workspace_size(h, r, xd, yd)
            w = torch.empty(max(ws, 8), device="cuda", dtype=torch.uint8)
            return (lambda: pydnn.reduce_tensor(h, r, None, 0, w.data_ptr() if ws else None, ws, 1.0, xd,
                                                x.data_ptr(), 0.0, yd, y.data_ptr())), y
        return make

    n = (64, 512, 32, 32)  # 32M elements
    A = pydnn
    return [("relu fwd", act(A.PYDNN_ACTIVATION_RELU, n)),
            ("gelu_erf fwd", act(A.PYDNN_ACTIVATION_GELU_ERF, n)),
            ("gelu_tanh fwd", act(A.PYDNN_ACTIVATION_GELU_TANH, n)),
            ("swish fwd", act(A.PYDNN_ACTIVATION_SWISH, n)),
            ("sigmoid bwd", act(A.PYDNN_ACTIVATION_SIGMOID, n, bwd=True)),
            ("gelu_erf bwd", act(A.PYDNN_ACTIVATION_GELU_ERF, n, bwd=True)),
            ("op add", optensor(A.PYDNN_OP_TENSOR_ADD, n, n)),
            ("op mul bias rows", optensor(A.PYDNN_OP_TENSOR_MUL, (32768, 1024), (1, 1024))),
            ("transform nchw->nhwc", transform(n, False, A.PYDNN_TENSOR_NHWC)),
            ("transform other 16-bit", transform(n, True, A.PYDNN_TENSOR_NCHW)),
            ("transform other 16-bit -> nhwc", transform(n, True, A.PYDNN_TENSOR_NHWC)),
            ("reduce add rows", reduce(A.PYDNN_REDUCE_TENSOR_ADD, (32768, 1024), (32768, 1))),
            ("reduce max cols", reduce(A.PYDNN_REDUCE_TENSOR_MAX, (1024, 32768), (1, 32768))),
            ("reduce avg nchw->c", reduce(A.PYDNN_REDUCE_TENSOR_AVG, n, (1, 512, 1, 1)))]


def typed_family_units():
    """The folded families' typed 16-bit units (called with the fold off: activation.f16, reduce.bf16, ...)."""
    from pydnn.ops import activation, reduce, tensor_ops

    return [u for m in (activation, tensor_ops, reduce) for u in m.kernel_units() if re.search(r"\.b?f16$", u.name)]


def gpu_main(args):
    import torch
    import pydnn
    from pydnn._build import build, loader
    from pydnn._cuda import driver
    from pydnn.ops import _elementwise as ew

    _DT.update({torch.float16: pydnn.PYDNN_DATA_HALF, torch.bfloat16: pydnn.PYDNN_DATA_BFLOAT16,
                torch.float32: pydnn.PYDNN_DATA_FLOAT})
    from pydnn._build import rare

    arch = driver.device_arch(0)
    ew.set_fold16(False)
    # the typed units' install parts only (what the cases' common calls take: the rules name the folded units),
    # under the family names
    def common(u):
        name = re.sub(r"\.b?f16$", ".h16", u.name)
        return replace(u, exprs=tuple(e for e in u.exprs if not rare.is_rare(
            name, e.replace("pydnn::half_t", "pydnn::h16_t").replace("pydnn::bf16_t", "pydnn::h16_t"), arch)))
    typed = [common(u) for u in typed_family_units()]
    ew.set_fold16(True)
    build.build_all(archs=[arch], units=typed, progress=False)   # (in parallel, before any timing)
    loader.register_units(typed)
    rows, bad = [], 0
    for name, make in gpu_cases():
        if args.only and not re.search(args.only, name):
            continue
        for dt in (torch.float16, torch.bfloat16):
            res = {}
            for fold in (True, False, True, False):   # alternating: drift shows as a difference between rounds
                ew.set_fold16(fold)
                h = pydnn.create()
                try:
                    run, out = make(h, dt)
                    out.fill_(float("nan"))
                    run()
                    torch.cuda.synchronize()
                    bits = out.view(torch.int16).clone()
                    t = _time(run, args.reps)
                finally:
                    pydnn.destroy(h)
                    ew.set_fold16(True)
                prev = res.get(fold)
                res[fold] = (bits, min(t, prev[1]) if prev else t)
            same = torch.equal(res[True][0], res[False][0])
            bad += not same
            t_f, t_t = res[True][1], res[False][1]
            rows.append(f"| {name} | {str(dt)[6:]} | {t_t:.1f} | {t_f:.1f} | {t_f / t_t:.3f} | "
                        f"{'identical' if same else 'DIFFER'} |")
            print(rows[-1], flush=True)
    text = "\n".join(["| case | dtype | typed us | folded us | folded / typed | outputs |",
                      "|---|---|---:|---:|---:|---|"] + rows)
    text += (f"\n\n{torch.cuda.get_device_name()} ({arch}); times: the better of two alternating rounds, each the "
             f"median of {args.reps} event-timed calls; {bad} cases differ\n")
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "fold16_gpu.md"), "w") as f:
            f.write(text)
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("units", nargs="*")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--kernels", action="store_true", help="print every kernel's row")
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--out")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--only", help="--gpu: cases whose names match this regular expression")
    args = ap.parse_args()
    if args.gpu:
        sys.exit(gpu_main(args))
    cpu_main(args)


if __name__ == "__main__":
    main()
