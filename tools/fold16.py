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
    for c in (os.environ.get("PYDNN_CUOBJDUMP"), shutil.which("cuobjdump"), "/usr/local/cuda/bin/cuobjdump",
              "/tmp/gf/cuo/nvidia/cu13/bin/cuobjdump"):
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
def _time(fn, reps=50):
    from pydnn._cuda import driver

    fn()
    driver.synchronize() if hasattr(driver, "synchronize") else None
    import torch

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


def gpu_cases():
    """(name, dtype, make(handle) -> (run(), output tensor)) for the folded families."""
    import torch
    import pydnn

    cases = []

    def act(mode, shape, bwd=False):
        def make(h, dt):
            g = torch.Generator(device="cuda").manual_seed(1)
            x = (torch.randn(shape, device="cuda", generator=g) * 3).to(dt)
            y = torch.empty_like(x)
            d = pydnn.create_activation_descriptor()
            pydnn.set_activation_descriptor(d, mode, pydnn.PYDNN_NOT_PROPAGATE_NAN, 0.0)
            td = pydnn.create_tensor_descriptor()
            pydnn.set_tensor_nd_descriptor_ex(td, pydnn.PYDNN_TENSOR_NCHW, _DT[dt], len(shape), list(shape))
            if not bwd:
                return (lambda: pydnn.activation_forward(h, d, 1.0, td, x.data_ptr(), 0.0, td, y.data_ptr())), y
            dy = torch.randn(shape, device="cuda", generator=g).to(dt)
            yy = torch.empty_like(x)
            pydnn.activation_forward(h, d, 1.0, td, x.data_ptr(), 0.0, td, yy.data_ptr())
            return (lambda: pydnn.activation_backward(h, d, 1.0, td, yy.data_ptr(), td, dy.data_ptr(), td,
                                                      x.data_ptr(), 0.0, td, y.data_ptr())), y
        return make

    def optensor(op, shape, bshape):
        def make(h, dt):
            g = torch.Generator(device="cuda").manual_seed(2)
            a = torch.randn(shape, device="cuda", generator=g).to(dt)
            b = torch.randn(bshape, device="cuda", generator=g).to(dt)
            c = torch.randn(shape, device="cuda", generator=g).to(dt)
            od = pydnn.create_op_tensor_descriptor()
            pydnn.set_op_tensor_descriptor(od, op, pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_NOT_PROPAGATE_NAN)
            ad, bd = pydnn.create_tensor_descriptor(), pydnn.create_tensor_descriptor()
            pydnn.set_tensor_nd_descriptor_ex(ad, pydnn.PYDNN_TENSOR_NCHW, _DT[dt], len(shape), list(shape))
            pydnn.set_tensor_nd_descriptor_ex(bd, pydnn.PYDNN_TENSOR_NCHW, _DT[dt], len(bshape), list(bshape))
            return (lambda: pydnn.op_tensor(h, od, 1.0, ad, a.data_ptr(), 0.5, bd, b.data_ptr(), 0.25, ad,
                                            c.data_ptr())), c
        return make

    def transform(shape, other, dst_fmt):
        def make(h, dt):  # other: from the other 16-bit type (a conversion between the formats)
            src = ({torch.float16: torch.bfloat16, torch.bfloat16: torch.float16}[dt] if other else dt)
            g = torch.Generator(device="cuda").manual_seed(3)
            x = torch.randn(shape, device="cuda", generator=g).to(src)
            y = torch.empty(shape, device="cuda", dtype=dt)
            xd, yd = pydnn.create_tensor_descriptor(), pydnn.create_tensor_descriptor()
            pydnn.set_tensor_nd_descriptor_ex(xd, pydnn.PYDNN_TENSOR_NCHW, _DT[src], len(shape), list(shape))
            pydnn.set_tensor_nd_descriptor_ex(yd, dst_fmt, _DT[dt], len(shape), list(shape))
            return (lambda: pydnn.transform_tensor(h, 1.0, xd, x.data_ptr(), 0.0, yd, y.data_ptr())), y
        return make

    n = (64, 1024, 32, 32)  # 64M elements
    cases += [("relu fwd", act(pydnn.PYDNN_ACTIVATION_RELU, n)),
              ("gelu_erf fwd", act(pydnn.PYDNN_ACTIVATION_GELU_ERF, n)),
              ("gelu_tanh fwd", act(pydnn.PYDNN_ACTIVATION_GELU_TANH, n)),
              ("sigmoid bwd", act(pydnn.PYDNN_ACTIVATION_SIGMOID, n, bwd=True)),
              ("gelu_erf bwd", act(pydnn.PYDNN_ACTIVATION_GELU_ERF, n, bwd=True)),
              ("op add", optensor(pydnn.PYDNN_OP_TENSOR_ADD, n, n)),
              ("op mul bias rows", optensor(pydnn.PYDNN_OP_TENSOR_MUL, (65536, 1024), (1, 1024))),
              ("transform nchw->nhwc", transform(n, False, pydnn.PYDNN_TENSOR_NHWC)),
              ("transform other 16-bit -> nhwc", transform(n, True, pydnn.PYDNN_TENSOR_NHWC)),
              ("transform other 16-bit", transform(n, True, pydnn.PYDNN_TENSOR_NCHW))]
    return cases


_DT = {}


def typed_family_units():
    """The folded families' typed 16-bit units (called with the fold off: activation.f16, tensor_ops.bf16, ...)."""
    from pydnn.ops import activation, tensor_ops

    return [u for m in (activation, tensor_ops) for u in m.kernel_units() if re.search(r"\.b?f16$", u.name)]


def gpu_main(args):
    import torch
    import pydnn
    from pydnn.ops import _elementwise as ew
    from pydnn._build import loader, manifest

    _DT.update({torch.float16: pydnn.PYDNN_DATA_HALF, torch.bfloat16: pydnn.PYDNN_DATA_BFLOAT16,
                torch.float32: pydnn.PYDNN_DATA_FLOAT})
    rows, bad = [], 0
    for name, make in gpu_cases():
        for dt in (torch.float16, torch.bfloat16):
            res = {}
            for fold in (True, False):
                ew.set_fold16(fold)
                if not fold:
                    loader.register_units(typed_family_units())
                h = pydnn.create()
                run, out = make(h, dt)
                out.fill_(float("nan"))
                run()
                torch.cuda.synchronize()
                res[fold] = (out.view(torch.int16).clone(), _time(run))
                pydnn.destroy(h)
            ew.set_fold16(True)
            same = torch.equal(res[True][0], res[False][0])
            bad += not same
            t_f, t_t = res[True][1], res[False][1]
            rows.append(f"| {name} | {str(dt)[6:]} | {t_t:.1f} | {t_f:.1f} | {t_f / t_t:.3f} | "
                        f"{'identical' if same else 'DIFFER'} |")
    text = "\n".join(["| case | dtype | typed us | folded us | folded / typed | outputs |", "|---|---|---:|---:|---:|---|"]
                     + rows) + f"\n\n{torch.cuda.get_device_name()}; {bad} cases differ\n"
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
    args = ap.parse_args()
    if args.gpu:
        sys.exit(gpu_main(args))
    cpu_main(args)


if __name__ == "__main__":
    main()
