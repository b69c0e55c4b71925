"""Digests of every convolution plan over a seeded set of generated problems, on a CPU-only handle.

A refactor of the convolution planners must not change what they plan: this prints (or writes) one
digest per (problem, direction, algorithm, device) case, built from everything a plan holds (its kernel
parameter structs byte for byte, kernel expressions, grids, workspace, sub-plans) or from the status and
message of the error it raised. tests/ops/convolution/test_plan_stability_cpu.py compares the digests with
the ones committed in tests/ops/convolution/plan_digests.json (written by this script before a refactor).

    python tools/plan_digest.py --write tests/ops/convolution/plan_digests.json   # record
    python tools/plan_digest.py --check tests/ops/convolution/plan_digests.json   # compare
"""
import argparse
import ctypes
import hashlib
import json
import random
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pydnn  # noqa: E402
from pydnn.handle import Handle  # noqa: E402

DTYPES = (pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DATA_DOUBLE, pydnn.PYDNN_DATA_HALF, pydnn.PYDNN_DATA_BFLOAT16)
DEVICES = (("sm_90", 132), ("sm_80", 108))


class _NoKernels(dict):
    def get(self, key, default=None):
        raise pydnn.PydnnError(pydnn.PYDNN_STATUS_NOT_INITIALIZED, "CPU-only handle: no kernels")


def cpu_handle(arch, sms):
    h = Handle.__new__(Handle)
    h.ctx, h.device, h.arch, h.sm_count, h.stream, h.cu_stream, h.alive = None, 0, arch, sms, 0, None, True
    h._funcs, h.prepared = _NoKernels(), {}
    return h


def _internals():
    """(new_plan, the fused call's adapt, directions, implemented algorithms)."""
    from pydnn.ops.convolution import plans as P, problem as Pb, tensor_core as T
    return P.new_plan, T.fused_bias_in_registers, (Pb.DIR_FWD, Pb.DIR_BWD_DATA, Pb.DIR_BWD_FILTER), P.implemented()


def _walk(v, out, depth=0):
    """A canonical text of a plan: class names, attributes in sorted order, structs as bytes; addresses
    (argument arrays, loaded functions) and modules left out."""
    if depth > 12:
        out.append("<deep>")
        return
    if v is None or isinstance(v, (bool, int, float, str)):
        out.append(repr(v))
    elif isinstance(v, tuple) and len(v) == 3 and isinstance(v[0], ctypes.Array):
        out.append("<argv>")  # driver.kernel_args: (array, its address, the struct)
        _walk(v[2], out, depth + 1)
    elif isinstance(v, (tuple, list)):
        out.append("[")
        for x in v:
            _walk(x, out, depth + 1)
        out.append("]")
    elif isinstance(v, dict):
        out.append("{")
        for k in sorted(v, key=repr):
            out.append(repr(k))
            _walk(v[k], out, depth + 1)
        out.append("}")
    elif isinstance(v, ctypes.Structure):
        out.append(type(v).__name__ + ":" + bytes(v).hex())
    elif isinstance(v, ctypes.Array) or isinstance(v, (types.ModuleType, types.FunctionType, types.MethodType)):
        out.append("<skip>")
    elif type(v).__name__ in ("TensorDescriptor", "FilterDescriptor", "ConvolutionDescriptor"):
        out.append(type(v).__name__ + repr((getattr(v, "dims", None), getattr(v, "strides", None),
                                            getattr(v, "dtype", None))))
    else:
        out.append(type(v).__name__ + "(")
        names = set(getattr(v, "__dict__", {}))
        for cls in type(v).__mro__:
            names.update(getattr(cls, "__slots__", ()))
        for n in sorted(names):
            if n.startswith("__") or n in ("gemm_argv", "fold_argv", "swap_argv") or n.endswith("_func"):
                continue
            if not hasattr(v, n):
                continue
            x = getattr(v, n)
            if isinstance(x, (types.ModuleType, types.FunctionType, types.MethodType)):
                continue  # code, not data (a module handle kept for calls, say): where it lives may move
            if callable(x) and not isinstance(x, (ctypes.Structure,)) and not hasattr(x, "__slots__") \
                    and not hasattr(x, "__dict__"):
                continue
            out.append(n + "=")
            _walk(x, out, depth + 1)
        out.append(")")


def digest(pl):
    out = []
    _walk(pl, out)
    return hashlib.sha256("".join(out).encode()).hexdigest()[:20]


def _tensor(dims, dtype, nhwc):
    d = pydnn.create_tensor_descriptor()
    if len(dims) == 4:
        fmt = pydnn.PYDNN_TENSOR_NHWC if nhwc else pydnn.PYDNN_TENSOR_NCHW
        pydnn.set_tensor4d_descriptor(d, fmt, dtype, *dims)
    else:
        fmt = pydnn.PYDNN_TENSOR_NHWC if nhwc else pydnn.PYDNN_TENSOR_NCHW
        pydnn.set_tensor_nd_descriptor_ex(d, fmt, dtype, len(dims), list(dims))
    return d


def problems(count, seed):
    """Seeded convolution problems: (dtype, nhwc, filter nhwc, N, C, K, groups, spatial, filter, pad, stride,
    dilation, mode, math)."""
    rng = random.Random(seed)
    for _ in range(count):
        nsp = rng.choice((2, 2, 2, 2, 1, 3))
        dtype = rng.choice(DTYPES + (pydnn.PYDNN_DATA_HALF, pydnn.PYDNN_DATA_BFLOAT16))
        groups = rng.choice((1, 1, 1, 1, 2, 4, 0))
        c = rng.choice((3, 8, 16, 32, 64, 64, 96, 128, 192, 256, 512, 17))
        k = rng.choice((8, 16, 32, 64, 64, 128, 256, 512, 12))
        if groups == 0:
            groups, k = c, c   # depthwise
        c = max(groups, c // groups * groups)
        k = max(groups, k // groups * groups)
        n = rng.choice((1, 2, 4, 8, 32, 64, 128))
        filt = [rng.choice((1, 1, 3, 3, 5, 7)) for _ in range(nsp)]
        if rng.random() < 0.7:
            filt = [filt[0]] * nsp
        size = rng.choice((1, 3, 7, 14, 28, 56, 112, 224)) if nsp < 3 else rng.choice((4, 8, 16, 32))
        sp = [max(size, f) for f in filt]
        pad = [f // 2 if rng.random() < 0.8 else 0 for f in filt]
        stride = [rng.choice((1, 1, 1, 2)) for _ in range(nsp)]
        dil = [rng.choice((1, 1, 1, 1, 2)) for _ in range(nsp)]
        nhwc = rng.random() < (0.7 if dtype in (pydnn.PYDNN_DATA_HALF, pydnn.PYDNN_DATA_BFLOAT16) else 0.3)
        fnhwc = nhwc if rng.random() < 0.85 else not nhwc
        mode = rng.choice((pydnn.PYDNN_CROSS_CORRELATION, pydnn.PYDNN_CROSS_CORRELATION, pydnn.PYDNN_CONVOLUTION))
        math = rng.choice((pydnn.PYDNN_DEFAULT_MATH, pydnn.PYDNN_DEFAULT_MATH, pydnn.PYDNN_TENSOR_OP_MATH,
                           pydnn.PYDNN_FMA_MATH))
        yield (dtype, nhwc, fnhwc, n, c, k, groups, sp, filt, pad, stride, dil, mode, math)


def descriptors(p):
    dtype, nhwc, fnhwc, n, c, k, groups, sp, filt, pad, stride, dil, mode, math = p
    ct = pydnn.PYDNN_DATA_DOUBLE if dtype == pydnn.PYDNN_DATA_DOUBLE else pydnn.PYDNN_DATA_FLOAT
    conv = pydnn.create_convolution_descriptor()
    pydnn.set_convolution_nd_descriptor(conv, len(sp), pad, stride, dil, mode, ct)
    pydnn.set_convolution_group_count(conv, groups)
    pydnn.set_convolution_math_type(conv, math)
    x = _tensor([n, c] + sp, dtype, nhwc)
    w = pydnn.create_filter_descriptor()
    pydnn.set_filter_nd_descriptor(w, dtype, pydnn.PYDNN_TENSOR_NHWC if fnhwc else pydnn.PYDNN_TENSOR_NCHW,
                                   2 + len(sp), [k, c // groups] + filt)
    out = pydnn.get_convolution_nd_forward_output_dim(conv, x, w, 2 + len(sp))
    y = _tensor(list(out), dtype, nhwc)
    return conv, x, w, y


def run(count, seed):
    new_plan, adapt, dirs, implemented = _internals()
    result = {}
    for i, p in enumerate(problems(count, seed)):
        try:
            conv, x, w, y = descriptors(p)
        except pydnn.PydnnError as e:
            result[f"{i}"] = f"descriptors: {int(e.status)} {e}"
            continue
        for arch, sms in DEVICES:
            h = cpu_handle(arch, sms)
            for d in dirs:
                for a in implemented[d]:
                    key = f"{i}/{arch}/{d}/{a}"
                    try:
                        pl = new_plan(h, d, a, conv, x, w, y)
                        result[key] = digest(pl)
                        if d == dirs[0]:
                            adapt(pl)
                            result[key + "/fused"] = digest(pl)
                    except pydnn.PydnnError as e:
                        result[key] = "error " + hashlib.sha256(f"{int(e.status)} {e}".encode()).hexdigest()[:20]
            for name, fn, args in (("v7fwd", pydnn.get_convolution_forward_algorithm_v7, (x, w, conv, y)),
                                   ("v7bwdd", pydnn.get_convolution_backward_data_algorithm_v7, (w, y, conv, x)),
                                   ("v7bwdf", pydnn.get_convolution_backward_filter_algorithm_v7, (x, y, conv, w))):
                try:
                    text = repr(fn(h, *args, 16))
                except pydnn.PydnnError as e:
                    text = f"error {int(e.status)} {e}"
                result[f"{i}/{arch}/{name}"] = hashlib.sha256(text.encode()).hexdigest()[:20]
    return result


def by_problem(res):
    """One digest per generated problem over all of its cases (the committed form: small, still exact)."""
    groups = {}
    for k in sorted(res):
        groups.setdefault(k.split("/")[0], []).append(k + "=" + res[k])
    return {i: hashlib.sha256("\n".join(v).encode()).hexdigest()[:16] for i, v in groups.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=1500)
    ap.add_argument("--seed", type=int, default=20261127)
    ap.add_argument("--write")
    ap.add_argument("--check")
    a = ap.parse_args()
    res = run(a.count, a.seed)
    if a.write:
        Path(a.write).write_text(json.dumps({"count": a.count, "seed": a.seed, "cases": len(res),
                                             "digests": by_problem(res)}, indent=0, sort_keys=True) + "\n")
    if a.check:
        want = json.loads(Path(a.check).read_text())["digests"]
        got = by_problem(res)
        bad = [k for k in want if got.get(k) != want[k]]
        print(f"{len(res)} cases of {len(want)} problems, {len(bad)} problems differ", bad[:20])
        return 1 if bad else 0
    errors = sum(v.startswith("error") for v in res.values())
    print(f"{len(res)} cases ({errors} errors)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
