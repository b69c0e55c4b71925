#!/usr/bin/env python3
"""Host time of each pydnn call of the CNN demo's training step (examples/train_cnn.py: batch 256, 32x32, conv
3->64 and 64->128 3x3 pad 1, batch norm + ReLU, 2x2 max pool, a linear layer; bf16), at the demo's shapes and
with the descriptors the bridge makes (the 64->128 convolution on NHWC copies, tuning.torch.CONV_NHWC_*).

    python tools/bench_host_cnn.py [--cpu] [--calls N] [--only conv_fwd,bn_fwd_ex,...] [--out table.md]

On a GPU machine: real launches on PyTorch's stream, each call timed host only (bursts of 16 calls with a
synchronize between bursts, outside the timed part: these kernels take 10-200 µs of GPU time, so a plain loop
would time the GPU) with int pointers (what pydnn.torch passes) and with torch tensors as buffers.
On the CPU (`--cpu`, the default without a GPU): bench_host's CPU handle and no-op launch, fake addresses;
each row also gives the Python-level function calls of one repeated call (sys.setprofile), the count
tests/core/test_call_path_cnn_cpu.py bounds.
"""
import argparse
import contextlib
import functools
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for p in (ROOT, os.path.dirname(os.path.abspath(__file__))):
    if p not in sys.path:
        sys.path.insert(0, p)

import pydnn as P  # noqa: E402
import bench_host as BH  # noqa: E402

BF16, F32 = P.PYDNN_DATA_BFLOAT16, P.PYDNN_DATA_FLOAT
N = 256


def td(dims, fmt=P.PYDNN_TENSOR_NCHW, dtype=BF16):
    d = P.create_tensor_descriptor()
    P.set_tensor_nd_descriptor_ex(d, fmt, dtype, len(dims), list(dims))
    return d


def fd(k, c, r, s, fmt=P.PYDNN_TENSOR_NCHW, dtype=BF16):
    d = P.create_filter_descriptor()
    P.set_filter4d_descriptor(d, dtype, fmt, k, c, r, s)
    return d


def conv_descs(c, k, hw, fmt):
    xd, wd, yd = td((N, c, hw, hw), fmt), fd(k, c, 3, 3, fmt), td((N, k, hw, hw), fmt)
    cd = P.create_convolution_descriptor()
    P.set_convolution2d_descriptor(cd, 1, 1, 1, 1, 1, 1, P.PYDNN_CROSS_CORRELATION, F32)
    P.set_convolution_math_type(cd, P.PYDNN_TENSOR_OP_MATH)
    return xd, wd, yd, cd


def _best(perfs):
    return next(p.algo for p in perfs if p.status == P.PYDNN_STATUS_SUCCESS)


class Ctx:
    """A case's buffers: b(nbytes) -> (int pointer, object) from the run's allocator; kept alive here."""

    def __init__(self, h, buf):
        self.h, self.buf, self.keep = h, buf, []

    def __call__(self, nbytes):
        r = self.buf(max(nbytes, 16))
        self.keep.append(r)
        return r


# each case: (name, setup(ctx) -> (call(buffers), ints, objs))
def case_conv_fwd(c):
    h = c.h
    xd, wd, yd, cd = conv_descs(64, 128, 32, P.PYDNN_TENSOR_NHWC)
    algo = _best(P.get_convolution_forward_algorithm_v7(h, xd, wd, cd, yd, 8))
    ws = P.get_convolution_forward_workspace_size(h, xd, wd, cd, yd, algo)
    bs = [c(N * 64 * 32 * 32 * 2), c(128 * 64 * 9 * 2), c(N * 128 * 32 * 32 * 2), c(ws)]
    return (lambda b: P.convolution_forward(h, 1.0, xd, b[0], wd, b[1], cd, algo, b[3], ws, 0.0, yd, b[2])), bs


def case_conv_bias_act(c):
    h = c.h
    xd, wd, yd, cd = conv_descs(3, 64, 32, P.PYDNN_TENSOR_NCHW)
    bd = td((1, 64, 1, 1))
    ad = P.create_activation_descriptor()
    P.set_activation_descriptor(ad, P.PYDNN_ACTIVATION_IDENTITY, P.PYDNN_NOT_PROPAGATE_NAN, 0.0)
    algo = _best(P.get_convolution_forward_algorithm_v7(h, xd, wd, cd, yd, 8))
    ws = P.get_convolution_forward_workspace_size(h, xd, wd, cd, yd, algo)
    bs = [c(N * 3 * 32 * 32 * 2), c(64 * 3 * 9 * 2), c(N * 64 * 32 * 32 * 2), c(64 * 2), c(ws)]
    return (lambda b: P.convolution_bias_activation_forward(h, 1.0, xd, b[0], wd, b[1], cd, algo, b[4], ws, 0.0, yd,
                                                            b[2], bd, b[3], ad, yd, b[2])), bs


def case_conv_bwd_data(c):
    h = c.h
    xd, wd, yd, cd = conv_descs(64, 128, 32, P.PYDNN_TENSOR_NHWC)
    algo = _best(P.get_convolution_backward_data_algorithm_v7(h, wd, yd, cd, xd, 8))
    ws = P.get_convolution_backward_data_workspace_size(h, wd, yd, cd, xd, algo)
    bs = [c(128 * 64 * 9 * 2), c(N * 128 * 32 * 32 * 2), c(N * 64 * 32 * 32 * 2), c(ws)]
    return (lambda b: P.convolution_backward_data(h, 1.0, wd, b[0], yd, b[1], cd, algo, b[3], ws, 0.0, xd, b[2])), bs


def case_conv_bwd_filter(c, nhwc=True):
    h = c.h
    if nhwc:
        xd, wd, yd, cd = conv_descs(64, 128, 32, P.PYDNN_TENSOR_NHWC)
        sizes = (N * 64 * 32 * 32 * 2, N * 128 * 32 * 32 * 2, 128 * 64 * 9 * 2)
    else:
        xd, wd, yd, cd = conv_descs(3, 64, 32, P.PYDNN_TENSOR_NCHW)
        sizes = (N * 3 * 32 * 32 * 2, N * 64 * 32 * 32 * 2, 64 * 3 * 9 * 2)
    algo = _best(P.get_convolution_backward_filter_algorithm_v7(h, xd, yd, cd, wd, 8))
    ws = P.get_convolution_backward_filter_workspace_size(h, xd, yd, cd, wd, algo)
    bs = [c(sizes[0]), c(sizes[1]), c(sizes[2]), c(ws)]
    return (lambda b: P.convolution_backward_filter(h, 1.0, xd, b[0], yd, b[1], cd, algo, b[3], ws, 0.0, wd,
                                                    b[2])), bs


def _bn_setup(c, ch=64, hw=32):
    xd = td((N, ch, hw, hw))
    sd = P.create_tensor_descriptor()
    P.derive_bn_tensor_descriptor(sd, xd, P.PYDNN_BATCHNORM_SPATIAL)
    ad = P.create_activation_descriptor()
    P.set_activation_descriptor(ad, P.PYDNN_ACTIVATION_RELU, P.PYDNN_NOT_PROPAGATE_NAN, 0.0)
    return xd, sd, ad, N * ch * hw * hw * 2, ch * 4


def case_bn_fwd(c):
    h = c.h
    xd, sd, ad, xb, pb = _bn_setup(c)
    m = P.PYDNN_BATCHNORM_SPATIAL
    bs = [c(xb), c(xb)] + [c(pb) for _ in range(6)]
    return (lambda b: P.batch_normalization_forward_training(h, m, 1.0, 0.0, xd, b[0], xd, b[1], sd, b[2], b[3], 0.1,
                                                             b[4], b[5], 1e-5, b[6], b[7])), bs


def case_bn_fwd_ex(c):
    h = c.h
    xd, sd, ad, xb, pb = _bn_setup(c)
    m, ops = P.PYDNN_BATCHNORM_SPATIAL_PERSISTENT, P.PYDNN_BATCHNORM_OPS_BN_ACTIVATION
    ws = P.get_batch_normalization_forward_training_ex_workspace_size(h, m, ops, xd, None, xd, sd, ad)
    rs = P.get_batch_normalization_training_ex_reserve_space_size(h, m, ops, ad, xd)
    bs = [c(xb), c(xb)] + [c(pb) for _ in range(6)] + [c(ws), c(rs)]
    return (lambda b: P.batch_normalization_forward_training_ex(h, m, ops, 1.0, 0.0, xd, b[0], None, None, xd, b[1],
                                                                sd, b[2], b[3], 0.1, b[4], b[5], 1e-5, b[6], b[7], ad,
                                                                b[8], ws, b[9], rs)), bs


def case_bn_bwd(c):
    h = c.h
    xd, sd, ad, xb, pb = _bn_setup(c)
    m = P.PYDNN_BATCHNORM_SPATIAL
    bs = [c(xb), c(xb), c(xb)] + [c(pb) for _ in range(5)]
    return (lambda b: P.batch_normalization_backward(h, m, 1.0, 0.0, 1.0, 0.0, xd, b[0], xd, b[1], xd, b[2], sd, b[3],
                                                     b[4], b[5], 1e-5, b[6], b[7])), bs


def case_bn_bwd_ex(c):
    h = c.h
    xd, sd, ad, xb, pb = _bn_setup(c)
    m, ops = P.PYDNN_BATCHNORM_SPATIAL_PERSISTENT, P.PYDNN_BATCHNORM_OPS_BN_ACTIVATION
    ws = P.get_batch_normalization_backward_ex_workspace_size(h, m, ops, xd, xd, xd, None, xd, sd, ad)
    rs = P.get_batch_normalization_training_ex_reserve_space_size(h, m, ops, ad, xd)
    bs = [c(xb), c(xb), c(xb), c(xb)] + [c(pb) for _ in range(6)] + [c(ws), c(rs)]
    return (lambda b: P.batch_normalization_backward_ex(h, m, ops, 1.0, 0.0, 1.0, 0.0, xd, b[0], xd, b[1], xd, b[2],
                                                        None, None, xd, b[3], sd, b[4], b[5], b[6], b[7], 1e-5, b[8],
                                                        b[9], ad, b[10], ws, b[11], rs)), bs


def case_bn_infer(c):
    h = c.h
    xd, sd, ad, xb, pb = _bn_setup(c)
    m = P.PYDNN_BATCHNORM_SPATIAL
    bs = [c(xb), c(xb)] + [c(pb) for _ in range(4)]
    return (lambda b: P.batch_normalization_forward_inference(h, m, 1.0, 0.0, xd, b[0], xd, b[1], sd, b[2], b[3], b[4],
                                                              b[5], 1e-5)), bs


def _pool_setup():
    pd = P.create_pooling_descriptor()
    P.set_pooling2d_descriptor(pd, P.PYDNN_POOLING_MAX, P.PYDNN_NOT_PROPAGATE_NAN, 2, 2, 0, 0, 2, 2)
    return pd, td((N, 64, 32, 32)), td((N, 64, 16, 16)), N * 64 * 32 * 32 * 2, N * 64 * 16 * 16 * 2


def case_pool_fwd(c):
    h = c.h
    pd, xd, yd, xb, yb = _pool_setup()
    bs = [c(xb), c(yb)]
    return (lambda b: P.pooling_forward(h, pd, 1.0, xd, b[0], 0.0, yd, b[1])), bs


def case_pool_bwd(c):
    h = c.h
    pd, xd, yd, xb, yb = _pool_setup()
    bs = [c(yb), c(yb), c(xb), c(xb)]
    return (lambda b: P.pooling_backward(h, pd, 1.0, yd, b[0], yd, b[1], xd, b[2], 0.0, xd, b[3])), bs


def case_act_bwd(c):
    h = c.h
    d = td((N, 64, 32, 32))
    ad = P.create_activation_descriptor()
    P.set_activation_descriptor(ad, P.PYDNN_ACTIVATION_RELU, P.PYDNN_NOT_PROPAGATE_NAN, 0.0)
    nb = N * 64 * 32 * 32 * 2
    bs = [c(nb) for _ in range(3)]
    return (lambda b: P.activation_backward(h, ad, 1.0, d, b[0], d, b[1], d, b[0], 0.0, d, b[2])), bs


def case_matmul(c):
    h = c.h
    ad, bd, cd = td((N, 8192)), td((8192, 10)), td((N, 10))
    bs = [c(N * 8192 * 2), c(8192 * 10 * 2), c(N * 10 * 2)]
    return (lambda b: P.matmul(h, 1.0, ad, b[0], bd, b[1], 0.0, cd, b[2])), bs


def case_matmul_dw(c):  # the Linear's weight gradient: dW (10 x 8192) = dY^T (10 x 256) @ X (256 x 8192)
    h = c.h
    ad, bd, cd = P.create_tensor_descriptor(), td((N, 8192)), td((10, 8192))
    P.set_tensor_nd_descriptor(ad, BF16, 2, [10, N], [1, 10])
    bs = [c(N * 10 * 2), c(N * 8192 * 2), c(8192 * 10 * 2)]
    return (lambda b: P.matmul(h, 1.0, ad, b[0], bd, b[1], 0.0, cd, b[2])), bs


def case_matmul_ex(c):  # the Linear forward: matmul_ex with its split-K workspace (the bridge's call)
    h = c.h
    ad, cd = td((N, 8192)), td((N, 10))
    bd = P.create_tensor_descriptor()  # W^T: the (10, 8192) weight read column-major
    P.set_tensor_nd_descriptor(bd, BF16, 2, [8192, 10], [1, 8192])
    ws = P.get_matmul_ex_workspace_size(h, ad, bd, cd)
    bs = [c(N * 8192 * 2), c(8192 * 10 * 2), c(N * 10 * 2), c(ws)]
    return (lambda b: P.matmul_ex(h, 1.0, ad, b[0], bd, b[1], 0.0, cd, b[2], b[3], ws)), bs


def case_conv_bias(c):
    h = c.h
    dyd, dbd = td((N, 64, 32, 32)), td((1, 64, 1, 1))
    bs = [c(N * 64 * 32 * 32 * 2), c(64 * 2)]
    return (lambda b: P.convolution_backward_bias(h, 1.0, dyd, b[0], 0.0, dbd, b[1])), bs


CASES = [
    ("conv_fwd", "convolution_forward 64->128 NHWC", case_conv_fwd),
    ("conv_bias_act", "convolution_bias_activation_forward 3->64 NCHW", case_conv_bias_act),
    ("conv_bwd_data", "convolution_backward_data 64->128 NHWC", case_conv_bwd_data),
    ("conv_bwd_filter", "convolution_backward_filter 64->128 NHWC", case_conv_bwd_filter),
    ("conv_bwd_filter1", "convolution_backward_filter 3->64 NCHW", functools.partial(case_conv_bwd_filter, nhwc=False)),
    ("conv_bias", "convolution_backward_bias 64 channels", case_conv_bias),
    ("bn_fwd", "batch_normalization_forward_training", case_bn_fwd),
    ("bn_fwd_ex", "batch_normalization_forward_training_ex relu", case_bn_fwd_ex),
    ("bn_bwd", "batch_normalization_backward", case_bn_bwd),
    ("bn_bwd_ex", "batch_normalization_backward_ex relu", case_bn_bwd_ex),
    ("bn_infer", "batch_normalization_forward_inference", case_bn_infer),
    ("pool_fwd", "pooling_forward max 2x2", case_pool_fwd),
    ("pool_bwd", "pooling_backward max 2x2", case_pool_bwd),
    ("act_bwd", "activation_backward relu", case_act_bwd),
    ("matmul", "matmul 256x8192 @ 8192x10", case_matmul),
    ("matmul_dw", "matmul 10x256 (col-major) @ 256x8192", case_matmul_dw),
    ("matmul_ex", "matmul_ex 256x8192 @ (10x8192)^T, split K", case_matmul_ex),
]


def python_calls(fn):
    return BH.python_calls(fn)[0]


def time_host(fn, calls, sync, burst=16, repeats=5):
    return BH.time_us_host(fn, calls, sync, burst=burst, repeats=repeats)


def _launches(fn):
    """The launches one call of fn makes, as (launch function, its arguments): driver.launch_args and
    driver.launch wrapped for the call (the call itself still launches)."""
    from pydnn._cuda import driver

    got = []
    la, lp = driver.launch_args, driver.launch

    def rec_la(*a):
        got.append((la, a))
        return la(*a)

    def rec_lp(*a):
        got.append((lp, a))
        return lp(*a)

    driver.launch_args, driver.launch = rec_la, rec_lp
    try:
        fn()
    finally:
        driver.launch_args, driver.launch = la, lp
    return got


def _replay(launches):
    def run():
        for f, a in launches:
            f(*a)
    return run


def _measure(setup, h, buf, calls, gpu, sync, floor=False):
    c = Ctx(h, buf)
    call, bs = setup(c)
    ints, objs = tuple(p for p, _ in bs), tuple(o for _, o in bs)
    call(ints)
    call(ints)
    sync()
    r = {}
    if floor:  # the same launches (kernels, grids, parameters) enqueued with nothing else: the call's floor
        ls = _launches(functools.partial(call, ints))
        sync()
        r["launches"] = len(ls)
        r["floor_us"] = time_host(_replay(ls), calls, sync) if gpu else BH.time_us(_replay(ls), calls, 3)
        sync()
    for form, b in (("int", ints), ("obj", objs)):
        f = functools.partial(call, b)
        f()
        sync()
        r[form + "_calls"] = python_calls(f)
        r[form + "_us"] = time_host(f, calls, sync) if gpu else BH.time_us(f, calls, 3)
        sync()
    return r


def run(only, calls, gpu, rounds=1):
    """Each case with tuning.callpath.CALL_RECORDS off (every call validates in full: the path
    before them) and on, on fresh descriptors each time, in `rounds` alternating rounds; medians over rounds."""
    from pydnn import tuning

    rows = []
    ctx = contextlib.nullcontext() if gpu else BH.no_launch()
    with ctx:
        if gpu:
            import torch

            h = P.create()
            P.set_stream(h, torch.cuda.current_stream().cuda_stream)
            buf, sync = BH.TorchBuffers(), torch.cuda.synchronize
        else:
            h, buf, sync = BH.cpu_handle(), BH.CpuBuffers(), (lambda: None)
        for key, name, setup in CASES:
            if only and key not in only:
                continue
            samples = {False: [], True: []}
            try:
                for _ in range(rounds):
                    for on in (False, True):
                        tuning.callpath.CALL_RECORDS = on
                        samples[on].append(_measure(setup, h, buf, calls, gpu, sync, floor=on))
            except P.PydnnError as e:
                print(f"{key:16s} {name:48s} skipped: {e}", flush=True)
                continue
            finally:
                tuning.callpath.reset()
            r = {"key": key, "case": name}
            for on, tag in ((False, "full"), (True, "rec")):
                for k in ("int_us", "obj_us"):
                    r[f"{tag}_{k}"] = statistics.median(s[k] for s in samples[on])
                for k in ("int_calls", "obj_calls"):
                    r[f"{tag}_{k}"] = samples[on][-1][k]
            r["launches"] = samples[True][-1]["launches"]
            r["floor_us"] = statistics.median(s["floor_us"] for s in samples[True])
            rows.append(r)
            print(f"{key:16s} {name:48s} launches {r['launches']}: alone {r['floor_us']:6.2f} us | full: int "
                  f"{r['full_int_us']:6.2f} us ({r['full_int_calls']:3d} py) obj "
                  f"{r['full_obj_us']:6.2f} us ({r['full_obj_calls']:3d} py) | records: int {r['rec_int_us']:6.2f} us "
                  f"({r['rec_int_calls']:3d} py) obj {r['rec_obj_us']:6.2f} us ({r['rec_obj_calls']:3d} py)",
                  flush=True)
        if gpu:
            sync()
            P.destroy(h)
    return rows


def torch_refs(calls):
    """PyTorch's own ops at the same shapes (cuDNN / ATen), host only, for scale."""
    import torch
    import torch.nn.functional as F

    sync, dev, bf = torch.cuda.synchronize, "cuda", torch.bfloat16
    cl = torch.channels_last
    x = torch.randn(N, 64, 32, 32, device=dev, dtype=bf).contiguous(memory_format=cl)
    w = torch.randn(128, 64, 3, 3, device=dev, dtype=bf).contiguous(memory_format=cl)
    xb = torch.randn(N, 64, 32, 32, device=dev, dtype=bf)
    g, b = torch.ones(64, device=dev), torch.zeros(64, device=dev)
    rm, rv = torch.zeros(64, device=dev), torch.ones(64, device=dev)
    a, lw = torch.randn(N, 8192, device=dev, dtype=bf), torch.randn(10, 8192, device=dev, dtype=bf)
    ops = [("torch conv2d 64->128 channels_last", lambda: F.conv2d(x, w, padding=1)),
           ("torch batch_norm training", lambda: F.batch_norm(xb, rm, rv, g, b, True, 0.1, 1e-5)),
           ("torch max_pool2d 2x2", lambda: F.max_pool2d(xb, 2)),
           ("torch linear 256x8192 -> 10", lambda: F.linear(a, lw))]
    rows = []
    for name, f in ops:
        try:
            f()
            sync()
            us = time_host(f, calls, sync)
        except Exception as e:  # noqa: BLE001 - a reference only
            print(f"{name}: skipped ({type(e).__name__}: {e})", flush=True)
            continue
        rows.append((name, us))
        print(f"{name:48s} host only {us:6.2f} us", flush=True)
    return rows


def to_markdown(rows, gpu):
    what = "host only (bursts of 16), GPU" if gpu else "CPU, launches stubbed"
    ob = "torch tensors" if gpu else "CAI objects"
    lines = [f"| call ({what}) | launches | alone µs | full: int µs | Python calls | {ob} µs | Python calls "
             f"| records: int µs | Python calls | {ob} µs | Python calls |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['case']} | {r['launches']} | {r['floor_us']:.2f} | {r['full_int_us']:.2f} | "
              f"{r['full_int_calls']} | {r['full_obj_us']:.2f} | "
              f"{r['full_obj_calls']} | {r['rec_int_us']:.2f} | {r['rec_int_calls']} | {r['rec_obj_us']:.2f} | "
              f"{r['rec_obj_calls']} |" for r in rows]
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu", action="store_true")
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--only", default="", help="comma-separated case keys (default: all)")
    p.add_argument("--rounds", type=int, default=1, help="alternating rounds (full / records) per case")
    p.add_argument("--no-torch", action="store_true", help="GPU: skip the PyTorch reference ops")
    p.add_argument("--out")
    a = p.parse_args()
    from pydnn._cuda import driver

    gpu = not a.cpu and driver.available()
    only = {s.strip() for s in a.only.split(",") if s.strip()}
    print(f"pydnn {P.__version__}, {'GPU: real launches' if gpu else 'CPU: launches stubbed'}", flush=True)
    rows = run(only, a.calls, gpu, a.rounds)
    md = to_markdown(rows, gpu)
    if gpu and not a.no_torch:
        md += "\n| PyTorch op (same shapes) | host only µs |\n|---|---:|\n"
        md += "".join(f"| {n} | {us:.2f} |\n" for n, us in torch_refs(a.calls))
    print("\n" + md)
    if a.out:
        with open(a.out, "w") as f:
            f.write(md)


if __name__ == "__main__":
    main()
