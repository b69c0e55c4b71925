#!/usr/bin/env python3
"""Host time of pydnn's cheapest call per family: what a framework pays per op on tiny tensors.

    python tools/bench_host.py [--cpu] [--calls N] [--families activation,tensor,...] [--c] [--graph]

On a GPU machine (the default there): a real handle on PyTorch's stream, 1-element-ish tensors, each call
timed with perf_counter over many calls, three ways: int pointers, torch tensors as buffers, and the PyTorch
op doing the same where there is one. Two timings of each: a plain loop (queued: once the GPU runs each tiny
kernel slower than the host enqueues it, the queue fills and the loop measures the GPU) and host only
(bursts of 64 calls with a synchronize between bursts, outside the timed part). `--c` also times the same
calls from C (tests/c/bench_host.c, built against libpydnn) and the driver's own cuLaunchKernel of empty
kernels under it. `--graph`: Graph.execute on a built plan (issue 22's host target).

    python tools/bench_host.py --quick --families activation --no-c-launch-off --graph --out $OUT/host.md
    python tools/bench_host.py --families activation --ab --calls 2000     (session 31: the entry's parts A/B)
    python tools/bench_host.py --c-only --calls 3000 --c-rounds 9          (C: fast path vs bare launches, rounds)

`--cpu` (the default without a GPU): everything pydnn does on the host for a call except the driver's
cuLaunchKernel, which is replaced by a no-op (a fake handle whose kernels are placeholders): descriptor
checks, the plan cache, buffer resolution, argument packing. Buffers are int pointers or objects with
__cuda_array_interface__ (a stand-in for a framework tensor), and each case also reports the Python-level
function calls of one call (sys.setprofile events), the count tests/hard/test_call_path_cpu.py bounds.
"""
import argparse
import contextlib
import functools
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import pydnn  # noqa: E402
from pydnn.handle import Handle  # noqa: E402

P = pydnn


# ---------------------------------------------------------------- CPU stand-ins for the GPU
class _Funcs(dict):
    """A CPU handle's kernel table: every (unit, expr) is a placeholder CUfunction."""

    def get(self, key, default=None):
        return ("kernel", key)


class _NoLaunchDriver:
    """cuda.bindings.driver as far as the launch path needs it: cuLaunchKernel counts and returns success."""

    def __init__(self):
        self.launches = 0

    def cuLaunchKernel(self, *args):
        self.launches += 1
        return (0,)

    def CUstream(self, s):
        return s


def cpu_handle(arch="sm_90", sm_count=132):
    """A handle that passes every check and whose kernels are placeholders (never touches a driver)."""
    h = Handle.__new__(Handle)
    h.ctx, h.device, h.arch, h.sm_count, h.stream, h.cu_stream, h.alive = 0, 0, arch, sm_count, 0, 0, True
    h._funcs, h.prepared = _Funcs(), {}
    return h


@contextlib.contextmanager
def no_launch():
    """Replace the driver's launch (and function-attribute) calls by no-ops for the block."""
    from pydnn._cuda import driver

    saved = (driver._drv, driver.function_set_max_dynamic_smem)
    fake = _NoLaunchDriver()
    driver._drv = fake
    driver.function_set_max_dynamic_smem = lambda func, nbytes: None
    try:
        yield fake
    finally:
        driver._drv, driver.function_set_max_dynamic_smem = saved


class FakeCAI:
    """A device-array stand-in exposing only __cuda_array_interface__ (as numba / JAX / others do)."""

    def __init__(self, ptr, nbytes):
        self.__cuda_array_interface__ = {"data": (ptr, False), "shape": (nbytes,), "typestr": "|u1",
                                         "strides": None, "version": 3}


class CpuBuffers:
    """Fake device addresses (256-byte aligned, never dereferenced) and their CAI objects."""

    def __init__(self):
        self.next = 1 << 32

    def __call__(self, nbytes):
        ptr = self.next
        self.next += (max(nbytes, 1) + 255) // 256 * 256 + 256
        return ptr, FakeCAI(ptr, nbytes)


class TorchBuffers:
    def __init__(self):
        import torch

        self.torch = torch

    def __call__(self, nbytes):
        t = self.torch.empty(max(nbytes, 1), dtype=self.torch.uint8, device="cuda")
        return t.data_ptr(), t


# ---------------------------------------------------------------- the cases: (family, name, setup)
def _td(dims, dtype=P.PYDNN_DATA_FLOAT):
    d = P.create_tensor_descriptor()
    P.set_tensor_nd_descriptor_ex(d, P.PYDNN_TENSOR_NCHW, dtype, len(dims), list(dims))
    return d


def _act(h, buf):
    d = _td((1, 1, 1, 1))
    a = P.create_activation_descriptor()
    P.set_activation_descriptor(a, P.PYDNN_ACTIVATION_RELU, P.PYDNN_NOT_PROPAGATE_NAN, 0.0)
    (xp, x), (yp, y) = buf(4), buf(4)
    return (lambda b: P.activation_forward(h, a, 1.0, d, b[0], 0.0, d, b[1])), (xp, yp), (x, y), "relu"


def _act_py(h, buf):
    """_act through the Python function behind activation_forward's C entry (tuning.callpath.C_ENTRY)."""
    from pydnn.ops import activation as A

    f = A._activation_forward
    d = _td((1, 1, 1, 1))
    a = P.create_activation_descriptor()
    P.set_activation_descriptor(a, P.PYDNN_ACTIVATION_RELU, P.PYDNN_NOT_PROPAGATE_NAN, 0.0)
    (xp, x), (yp, y) = buf(4), buf(4)
    return (lambda b: f(h, a, 1.0, d, b[0], 0.0, d, b[1])), (xp, yp), (x, y), "relu"


def _act_bwd(h, buf):
    d = _td((1, 1, 1, 1))
    a = P.create_activation_descriptor()
    P.set_activation_descriptor(a, P.PYDNN_ACTIVATION_RELU, P.PYDNN_NOT_PROPAGATE_NAN, 0.0)
    bufs = [buf(4) for _ in range(4)]
    return ((lambda b: P.activation_backward(h, a, 1.0, d, b[0], d, b[1], d, b[2], 0.0, d, b[3])),
            tuple(p for p, _ in bufs), tuple(o for _, o in bufs), "threshold_backward")


def _add(h, buf):
    d = _td((1, 1, 1, 1))
    (ap, a), (cp, c) = buf(4), buf(4)
    return (lambda b: P.add_tensor(h, 1.0, d, b[0], 1.0, d, b[1])), (ap, cp), (a, c), "add_"


def _op(h, buf):
    d = _td((1, 1, 1, 1))
    op = P.create_op_tensor_descriptor()
    P.set_op_tensor_descriptor(op, P.PYDNN_OP_TENSOR_ADD, P.PYDNN_DATA_FLOAT, P.PYDNN_NOT_PROPAGATE_NAN)
    (ap, a), (bp, b_), (cp, c) = buf(4), buf(4), buf(4)
    return ((lambda b: P.op_tensor(h, op, 1.0, d, b[0], 1.0, d, b[1], 0.0, d, b[2])), (ap, bp, cp), (a, b_, c),
            "add")


def _scale(h, buf):
    d = _td((1, 1, 1, 1))
    (yp, y) = buf(4)
    return (lambda b: P.scale_tensor(h, d, b[0], 2.0)), (yp,), (y,), "mul_"


def _transform(h, buf):
    d = _td((1, 1, 1, 1))
    (xp, x), (yp, y) = buf(4), buf(4)
    return (lambda b: P.transform_tensor(h, 1.0, d, b[0], 0.0, d, b[1])), (xp, yp), (x, y), "copy_"


def _softmax(h, buf):
    d = _td((1, 4, 1, 1))
    (xp, x), (yp, y) = buf(16), buf(16)
    return ((lambda b: P.softmax_forward(h, P.PYDNN_SOFTMAX_ACCURATE, P.PYDNN_SOFTMAX_MODE_CHANNEL, 1.0, d, b[0],
                                         0.0, d, b[1])), (xp, yp), (x, y), "softmax")


def _reduce(h, buf):
    dx, dy = _td((1, 4, 1, 1)), _td((1, 1, 1, 1))
    r = P.create_reduce_tensor_descriptor()
    P.set_reduce_tensor_descriptor(r, P.PYDNN_REDUCE_TENSOR_ADD, P.PYDNN_DATA_FLOAT, P.PYDNN_NOT_PROPAGATE_NAN,
                                   P.PYDNN_REDUCE_TENSOR_NO_INDICES, P.PYDNN_32BIT_INDICES)
    ws = P.get_reduction_workspace_size(h, r, dx, dy)
    (xp, x), (yp, y), (wp, w) = buf(16), buf(4), buf(max(ws, 1))
    return ((lambda b: P.reduce_tensor(h, r, None, 0, b[2], ws, 1.0, dx, b[0], 0.0, dy, b[1])),
            (xp, yp, wp), (x, y, w), "sum")


def _pool(h, buf):
    pd = P.create_pooling_descriptor()
    P.set_pooling2d_descriptor(pd, P.PYDNN_POOLING_MAX, P.PYDNN_NOT_PROPAGATE_NAN, 2, 2, 0, 0, 2, 2)
    dx, dy = _td((1, 1, 2, 2)), _td((1, 1, 1, 1))
    (xp, x), (yp, y) = buf(16), buf(4)
    return (lambda b: P.pooling_forward(h, pd, 1.0, dx, b[0], 0.0, dy, b[1])), (xp, yp), (x, y), "max_pool2d"


def _bn(h, buf):
    dx = _td((1, 2, 1, 1))
    sb = P.create_tensor_descriptor()
    P.derive_bn_tensor_descriptor(sb, dx, P.PYDNN_BATCHNORM_SPATIAL)
    bufs = [buf(8) for _ in range(6)]
    mode = P.PYDNN_BATCHNORM_SPATIAL
    return ((lambda b: P.batch_normalization_forward_inference(h, mode, 1.0, 0.0, dx, b[0], dx, b[1], sb, b[2],
                                                               b[3], b[4], b[5], 1e-5)),
            tuple(p for p, _ in bufs), tuple(o for _, o in bufs), "batch_norm")


def _norm(h, buf):
    dx = _td((1, 4, 1, 1))
    nd = P.create_norm_descriptor()
    P.set_norm_descriptor(nd, P.PYDNN_NORM_KIND_LAYER, 1, 3, 1e-5, None)
    sb, mi = P.create_tensor_descriptor(), P.create_tensor_descriptor()
    P.derive_norm_param_descriptors(sb, mi, dx, nd)
    (xp, x), (yp, y), (sp, s), (bp, b_) = buf(16), buf(16), buf(16), buf(16)
    return ((lambda b: P.norm_forward_inference(h, nd, 1.0, 0.0, dx, b[0], dx, b[1], sb, b[2], b[3])),
            (xp, yp, sp, bp), (x, y, s, b_), "layer_norm")


def _conv(h, buf):
    xd, yd = _td((1, 1, 1, 1)), _td((1, 1, 1, 1))
    wd = P.create_filter_descriptor()
    P.set_filter4d_descriptor(wd, P.PYDNN_DATA_FLOAT, P.PYDNN_TENSOR_NCHW, 1, 1, 1, 1)
    cd = P.create_convolution_descriptor()
    P.set_convolution2d_descriptor(cd, 0, 0, 1, 1, 1, 1, P.PYDNN_CROSS_CORRELATION, P.PYDNN_DATA_FLOAT)
    algo = P.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM
    (xp, x), (wp, w), (yp, y) = buf(4), buf(4), buf(4)
    return ((lambda b: P.convolution_forward(h, 1.0, xd, b[0], wd, b[1], cd, algo, None, 0, 0.0, yd, b[2])),
            (xp, wp, yp), (x, w, y), "conv2d")


def _conv_bias(h, buf):
    """convolution_backward_bias: its launch goes through driver.launch (a by-value struct, no argv kept)."""
    dy, db = _td((1, 4, 2, 2)), _td((1, 4, 1, 1))
    (yp, y), (bp, b) = buf(64), buf(16)
    return (lambda q: P.convolution_backward_bias(h, 1.0, dy, q[0], 0.0, db, q[1])), (yp, bp), (y, b), None


def _mha_setup(h, buf, batch=8, seq=512, emb=1024, heads=16, causal=True):
    """The legacy MHA layer (BERT-large-like, bf16): forward (inference, training), backward data, weights."""
    T_, B_, M_, V_ = (P.PYDNN_SEQDATA_TIME_DIM, P.PYDNN_SEQDATA_BATCH_DIM, P.PYDNN_SEQDATA_BEAM_DIM,
                      P.PYDNN_SEQDATA_VECT_DIM)
    bf16 = P.PYDNN_DATA_BFLOAT16
    d = P.create_seq_data_descriptor()
    dims = [0] * 4
    dims[T_], dims[B_], dims[M_], dims[V_] = seq, batch, 1, emb
    P.set_seq_data_descriptor(d, bf16, 4, dims, [B_, M_, T_, V_], batch, [seq] * batch, None)
    a = P.create_attn_descriptor()
    P.set_attn_descriptor(a, P.PYDNN_ATTN_QUERYMAP_ONE_TO_ONE | P.PYDNN_ATTN_ENABLE_PROJ_BIASES, heads,
                          (emb // heads) ** -0.5, bf16, P.PYDNN_DATA_FLOAT, P.PYDNN_TENSOR_OP_MATH, None, None, emb,
                          emb, emb, emb // heads, emb // heads, emb // heads, emb, seq, seq, batch, 1)
    wsize, wssize, rssize = P.get_multi_head_attn_buffers(h, a)
    nb = batch * seq * emb * 2
    names = ("q", "k", "v", "o", "do", "dq", "dk", "dv")
    b = {n: buf(nb) for n in names}
    b.update(w=buf(wsize), dw=buf(wsize), ws=buf(wssize), rs=buf(rssize), lens=buf(4 * batch))
    lo = [0] * seq
    hi = [t + 1 for t in range(seq)] if causal else [seq] * seq
    return a, d, b, (wsize, wssize, rssize), lo, hi


def _mha(kind):
    def setup(h, buf):
        a, d, b, (wsize, wssize, rssize), lo, hi = _mha_setup(h, buf)
        keys = {"forward inference": ("q", "k", "v", "o", "lens", "w", "ws"),
                "forward training": ("q", "k", "v", "o", "lens", "w", "ws", "rs"),
                "backward data": ("do", "dq", "q", "dk", "k", "dv", "v", "lens", "w", "ws", "rs"),
                "backward weights": ("q", "k", "v", "do", "w", "dw", "ws", "rs")}[kind]
        ints = tuple(b[k][0] for k in keys)
        objs = tuple(b[k][1] for k in keys)

        def call(x):
            p = dict(zip(keys, x))
            if kind.startswith("forward"):
                train = kind.endswith("training")
                P.multi_head_attn_forward(h, a, -1, lo, hi, p["lens"], p["lens"], d, p["q"], None, d, p["k"], d,
                                          p["v"], d, p["o"], wsize, p["w"], wssize, p["ws"], rssize if train else 0,
                                          p["rs"] if train else None)
            elif kind == "backward data":
                P.multi_head_attn_backward_data(h, a, lo, hi, p["lens"], p["lens"], d, p["do"], d, p["dq"], p["q"], d,
                                                p["dk"], p["k"], d, p["dv"], p["v"], wsize, p["w"], wssize, p["ws"],
                                                rssize, p["rs"])
            else:
                P.multi_head_attn_backward_weights(h, a, P.PYDNN_WGRAD_MODE_SET, d, p["q"], d, p["k"], d, p["v"], d,
                                                   p["do"], wsize, p["w"], p["dw"], wssize, p["ws"], rssize, p["rs"])
        return call, ints, objs, None
    return setup


MHA_CASES = [("mha", f"multi_head_attn {k} b8 s512 e1024 h16 causal", _mha(k))
             for k in ("forward inference", "forward training", "backward data", "backward weights")]

CASES = [
    ("activation", "activation_forward relu 1 elem", _act),
    ("activation", "activation_backward relu 1 elem", _act_bwd),
    ("tensor", "add_tensor 1 elem", _add),
    ("tensor", "op_tensor add 1 elem", _op),
    ("tensor", "scale_tensor 1 elem", _scale),
    ("tensor", "transform_tensor 1 elem", _transform),
    ("softmax", "softmax_forward 1x4", _softmax),
    ("reduce", "reduce_tensor add 4 -> 1", _reduce),
    ("pooling", "pooling_forward max 2x2", _pool),
    ("batchnorm", "batch_normalization_forward_inference 1x2", _bn),
    ("normalization", "norm_forward_inference layer 1x4", _norm),
    ("convolution", "convolution_forward 1x1 implicit gemm", _conv),
    ("convolution", "convolution_backward_bias 1x4x2x2", _conv_bias),
]


def time_us(fn, calls, repeats=5):
    """Median microseconds of one call over `repeats` loops of `calls` calls."""
    for _ in range(min(calls, 200)):
        fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(samples)


def time_us_host(fn, calls, sync, burst=64, repeats=5):
    """Median microseconds of one call's host work: bursts of `burst` calls timed, a synchronize between
    bursts outside the timed part, so the GPU's queue never fills. A plain loop (time_us) of tiny kernels
    measures max(host, GPU) per call once the GPU runs each kernel slower than the host enqueues it."""
    for _ in range(min(calls, 200)):
        fn()
    sync()
    bursts = max(1, calls // burst)
    samples = []
    for _ in range(repeats):
        tot = 0.0
        for _ in range(bursts):
            t0 = time.perf_counter()
            for _ in range(burst):
                fn()
            tot += time.perf_counter() - t0
            sync()
        samples.append(tot / (bursts * burst) * 1e6)
    return statistics.median(samples)


def python_calls(fn):
    """(Python function calls, C function calls) made by one call of fn (sys.setprofile events, fn's own
    frame included)."""
    counts = {"call": 0, "c_call": 0}

    def prof(frame, event, arg):
        if event in counts:
            counts[event] += 1

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return counts["call"], counts["c_call"] - 1  # the setprofile(None) call itself is a c_call


def run_cpu(families, calls):
    rows = []
    with no_launch() as drv:
        h, buf = cpu_handle(), CpuBuffers()
        for fam, name, setup in CASES:
            if families and fam not in families:
                continue
            try:
                call, ints, objs, _ = setup(h, buf)
                call(ints)  # plan once (validation, kernel lookup); then the cached path is timed
                before = drv.launches
                call(ints)
                assert drv.launches > before, "no launch reached"
            except pydnn.PydnnError as e:
                print(f"{fam:13s} {name:45s} skipped: {e}", flush=True)
                continue
            r = {"family": fam, "case": name,
                 "int_us": time_us(lambda: call(ints), calls),
                 "obj_us": time_us(lambda: call(objs), calls),
                 "int_calls": python_calls(lambda: call(ints)),
                 "obj_calls": python_calls(lambda: call(objs))}
            rows.append(r)
            print(f"{fam:13s} {name:45s} int {r['int_us']:6.2f} us ({r['int_calls'][0]:3d} py calls) | "
                  f"CAI objects {r['obj_us']:6.2f} us ({r['obj_calls'][0]:3d} py calls)", flush=True)
    return rows


def check_gpu(h):
    """The launch paths give the right answer: activation_forward on torch tensors (aligned and not, the vector
    and the scalar kernel) against torch.relu, exactly."""
    import torch

    x = torch.randn(4099, device="cuda")
    y = torch.full_like(x, float("nan"))
    a = P.create_activation_descriptor()
    P.set_activation_descriptor(a, P.PYDNN_ACTIVATION_RELU, P.PYDNN_NOT_PROPAGATE_NAN, 0.0)
    d = _td((1, 1, 1, 4096))
    ok = True
    for rep in range(3):
        for off in (0, 1, 3):
            xs, ys = x[off:off + 4096], y[off:off + 4096]
            P.activation_forward(h, a, 1.0, d, xs, 0.0, d, ys)
            ok &= bool(torch.equal(ys, torch.relu(xs)))
        x.normal_()
    torch.cuda.synchronize()
    print(f"check activation_forward (torch tensors, offsets 0 / 1 / 3) against torch.relu: {'ok' if ok else 'MISMATCH'}",
          flush=True)
    return ok


def run_ab(calls, rounds=5):
    """activation_forward's C entry against the Python function behind it, torch.relu and the bare compiled
    launch, in alternating rounds on one handle (a shared host's load moves between rounds; each round
    times every form once, queued and host only). Each form is a functools.partial, so no Python frame of
    the benchmark's own is timed (the per-family rows above go through two lambdas). Prints every round and
    the medians over rounds."""
    import functools

    import torch

    from pydnn.ops import _elementwise as ew
    from pydnn.ops import activation as A

    h = pydnn.create()
    pydnn.set_stream(h, torch.cuda.current_stream().cuda_stream)
    sync = torch.cuda.synchronize
    d = _td((1, 1, 1, 1))
    a = P.create_activation_descriptor()
    P.set_activation_descriptor(a, P.PYDNN_ACTIVATION_RELU, P.PYDNN_NOT_PROPAGATE_NAN, 0.0)
    x, y = torch.randn(1, device="cuda"), torch.empty(1, device="cuda")
    xp, yp = x.data_ptr(), y.data_ptr()
    for _ in range(2):  # plans, verifies torch.Tensor, sets the compiled entry up (pydnn.activation_forward)
        P.activation_forward(h, a, 1.0, d, x, 0.0, d, y)
    forms = {
        "entry, int pointers": functools.partial(P.activation_forward, h, a, 1.0, d, xp, 0.0, d, yp),
        "entry, torch tensors": functools.partial(P.activation_forward, h, a, 1.0, d, x, 0.0, d, y),
        "Python function, int pointers": functools.partial(A._activation_forward, h, a, 1.0, d, xp, 0.0, d, yp),
        "Python function, torch tensors": functools.partial(A._activation_forward, h, a, 1.0, d, x, 0.0, d, y),
        "torch.relu": functools.partial(torch.relu, x),
    }
    try:  # cupy arrays where cupy is installed (they go through the Python function: device_ptr's cupy reader)
        import cupy

        cx, cy = cupy.zeros(1, dtype=cupy.float32), cupy.zeros(1, dtype=cupy.float32)
        forms["entry, cupy arrays"] = functools.partial(P.activation_forward, h, a, 1.0, d, cx, 0.0, d, cy)
    except Exception as e:  # noqa: BLE001 - ImportError, or a cupy that cannot start here
        print(f"ab: no cupy form ({type(e).__name__}: {e})", flush=True)
    # session 31's parts taken away one at a time: the def in front of act_fwd (session 30's public entry,
    # a Python frame), and the call-site slots (every call looks the handle / key / record up)
    hooks = {}
    if getattr(A, "_python_entry", None) is not None and P.activation_forward is not A._python_entry:
        forms["session-30 def entry, torch tensors"] = functools.partial(A._python_entry, h, a, 1.0, d, x, 0.0, d, y)
    from pydnn._build import fastcall
    from pydnn._cuda import driver as _drv

    lib = fastcall._state.get("lib")
    if lib is not None and hasattr(lib, "act_stats"):
        from pydnn import buffers as _bufs
        from pydnn import tuning as _tun

        def setup(gen):
            return lambda: lib.act_setup(Handle, _drv, ew._LAUNCH_ARGS, _bufs, A._UNUSED_ALPHA2, gen)

        for kind, b in (("int pointers", (xp, yp)), ("torch tensors", (x, y))):
            k = f"entry without call-site slots, {kind}"
            forms[k] = functools.partial(P.activation_forward, h, a, 1.0, d, b[0], 0.0, d, b[1])
            hooks[k] = (setup(0), setup(_tun.records_gen_address()))
    for k, f in forms.items():
        hooks.get(k, (lambda: None, None))[0]()
        f()
        f()
        if k in hooks:
            hooks[k][1]()
    rec = h.prepared.get((0, a, a.version, d, d.version, d, d.version))
    if rec is not None and rec.crec:
        forms["compiled launch alone (map_launch)"] = functools.partial(ew._fast_launch, rec.crec, h.stream, yp, xp, 0, 0,
                                                                        1.0, 1.0, 0.0, 1)
    print(f"ab: the C entry {'in use' if A._c_entry is not None else 'NOT in use'}; pydnn.activation_forward is "
          f"{type(P.activation_forward).__name__}; call-site slot hits so far "
          f"{lib.act_stats() if lib is not None and hasattr(lib, 'act_stats') else 'n/a'}", flush=True)
    res = {k: ([], []) for k in forms}
    for r in range(rounds):
        line = []
        for k, f in forms.items():
            if k in hooks:
                hooks[k][0]()
            q = time_us(f, calls, 3)
            sync()
            ho = time_us_host(f, calls, sync, repeats=3)
            if k in hooks:
                hooks[k][1]()
            res[k][0].append(q)
            res[k][1].append(ho)
            line.append(f"{q:.2f}/{ho:.2f}")
        print(f"ab round {r}: " + " | ".join(line), flush=True)
    rows = []
    for k, (q, ho) in res.items():
        rows.append({"family": "ab", "case": f"activation_forward 1 elem: {k}" if k != "torch.relu" else k,
                     "int_us": statistics.median(q), "int_host": statistics.median(ho), "obj_us": float("nan"),
                     "torch_us": float("nan")})
        print(f"ab {k:40s} queued {statistics.median(q):6.2f} us (min {min(q):.2f}) | host only "
              f"{statistics.median(ho):6.2f} us (min {min(ho):.2f})", flush=True)
    sync()
    pydnn.destroy(h)
    return rows


def run_ab_map(calls, rounds=5):
    """The compiled entries of session 33 (tuning.callpath.C_ENTRY_MAP: activation_backward, add_tensor,
    scale_tensor, op_tensor, transform_tensor on 1 element, softmax_forward 1x4, pooling_forward 2x2, reduce_tensor
    4 -> 1, batch_normalization_forward_inference 1x2, norm_forward_inference 1x4) against the
    Python functions behind them and PyTorch's op, int pointers and torch tensors, in alternating rounds on one
    handle as run_ab (each form a functools.partial: no benchmark frame timed). Medians (min) over rounds, queued
    and host only."""
    import torch

    from pydnn._build import fastcall
    from pydnn.ops import _elementwise as ew

    h = pydnn.create()
    pydnn.set_stream(h, torch.cuda.current_stream().cuda_stream)
    sync = torch.cuda.synchronize
    d = _td((1, 1, 1, 1))
    a = P.create_activation_descriptor()
    P.set_activation_descriptor(a, P.PYDNN_ACTIVATION_RELU, P.PYDNN_NOT_PROPAGATE_NAN, 0.0)
    op = P.create_op_tensor_descriptor()
    P.set_op_tensor_descriptor(op, P.PYDNN_OP_TENSOR_ADD, P.PYDNN_DATA_FLOAT, P.PYDNN_NOT_PROPAGATE_NAN)
    t = [torch.randn(4, device="cuda") for _ in range(6)]
    ip = [x.data_ptr() for x in t]
    d4 = _td((1, 4, 1, 1))  # softmax over 4 channels
    pxd, pyd = _td((1, 1, 2, 2)), _td((1, 1, 1, 1))  # max pooling 2x2
    pd = P.create_pooling_descriptor()
    P.set_pooling2d_descriptor(pd, P.PYDNN_POOLING_MAX, P.PYDNN_NOT_PROPAGATE_NAN, 2, 2, 0, 0, 2, 2)
    sm = (P.PYDNN_SOFTMAX_ACCURATE, P.PYDNN_SOFTMAX_MODE_CHANNEL)
    bnx = _td((1, 2, 1, 1))  # batch norm inference, 2 channels
    bnsb = P.create_tensor_descriptor()
    P.derive_bn_tensor_descriptor(bnsb, bnx, P.PYDNN_BATCHNORM_SPATIAL)
    nd = P.create_norm_descriptor()  # layer norm over the 4 channels
    P.set_norm_descriptor(nd, P.PYDNN_NORM_KIND_LAYER, 1, 3, 1e-5, None)
    nsb, nmi = P.create_tensor_descriptor(), P.create_tensor_descriptor()
    P.derive_norm_param_descriptors(nsb, nmi, d4, nd)
    rd = P.create_reduce_tensor_descriptor()
    P.set_reduce_tensor_descriptor(rd, P.PYDNN_REDUCE_TENSOR_ADD, P.PYDNN_DATA_FLOAT, P.PYDNN_NOT_PROPAGATE_NAN,
                                   P.PYDNN_REDUCE_TENSOR_NO_INDICES, P.PYDNN_32BIT_INDICES)
    calls_of = {
        "activation_backward": lambda b: (h, a, 1.0, d, b[0], d, b[1], d, b[2], 0.0, d, b[3]),
        "add_tensor": lambda b: (h, 1.0, d, b[0], 1.0, d, b[1]),
        "scale_tensor": lambda b: (h, d, b[0], 2.0),
        "op_tensor": lambda b: (h, op, 1.0, d, b[0], 1.0, d, b[1], 0.0, d, b[2]),
        "transform_tensor": lambda b: (h, 1.0, d, b[0], 0.0, d, b[1]),
        "softmax_forward": lambda b: (h, *sm, 1.0, d4, b[0], 0.0, d4, b[1]),
        "pooling_forward": lambda b: (h, pd, 1.0, pxd, b[0], 0.0, pyd, b[1]),
        "reduce_tensor": lambda b: (h, rd, None, 0, None, 0, 1.0, d4, b[0], 0.0, d, b[1]),  # (no workspace)
        "batch_normalization_forward_inference": lambda b: (h, P.PYDNN_BATCHNORM_SPATIAL, 1.0, 0.0, bnx, b[0], bnx,
                                                            b[1], bnsb, b[2], b[3], b[4], b[5], 1e-5),
        "norm_forward_inference": lambda b: (h, nd, 1.0, 0.0, d4, b[0], d4, b[1], nsb, b[2], b[3]),
    }
    x = t[0][:1]
    x4, x22 = t[0], t[0].view(1, 1, 2, 2)
    torch_of = {"activation_backward": functools.partial(torch.ops.aten.threshold_backward, x, x, 0.0),
                "add_tensor": functools.partial(x.add_, x), "scale_tensor": functools.partial(x.mul_, 2.0),
                "op_tensor": functools.partial(torch.add, x, x), "transform_tensor": functools.partial(x.copy_, x),
                "softmax_forward": functools.partial(torch.softmax, x4, 0),
                "pooling_forward": functools.partial(torch.nn.functional.max_pool2d, x22, 2),
                "reduce_tensor": functools.partial(torch.sum, x4),
                "batch_normalization_forward_inference": functools.partial(
                    torch.nn.functional.batch_norm, t[0][:2].view(1, 2, 1, 1), t[4][:2], t[5][:2].abs() + 1,
                    t[2][:2], t[3][:2], False, 0.1, 1e-5),
                "norm_forward_inference": functools.partial(torch.nn.functional.layer_norm, x4, (4,), t[2], t[3],
                                                            1e-5)}
    for name, mk in calls_of.items():  # plans; the first compiled record sets the entries up; fills the slots
        for b in (ip, t):
            for _ in range(3):
                getattr(P, name)(*mk(b))
    forms = {}
    for name, mk in calls_of.items():
        py = getattr(ew._ENTRY_MODULES[name], "_py_" + name)
        for kind, b in (("int", ip), ("torch", t)):
            forms[f"{name} entry, {kind}"] = functools.partial(getattr(P, name), *mk(b))
            forms[f"{name} Python function, {kind}"] = functools.partial(py, *mk(b))
        forms[f"{name}: PyTorch's op"] = torch_of[name]
    lib = fastcall._state.get("lib")
    print(f"ab-map: pydnn.add_tensor is {type(P.add_tensor).__name__}; slot hits so far "
          f"{lib.map_stats() if lib is not None and hasattr(lib, 'map_stats') else 'n/a'}", flush=True)
    res = {k: ([], []) for k in forms}
    for r in range(rounds):
        for k, f in forms.items():
            q = time_us(f, calls, 3)
            sync()
            ho = time_us_host(f, calls, sync, repeats=3)
            res[k][0].append(q)
            res[k][1].append(ho)
        print(f"ab-map round {r + 1}/{rounds} done", flush=True)
    rows = []
    for k, (q, ho) in res.items():
        rows.append({"family": "ab-map", "case": k, "int_us": statistics.median(q), "int_host": statistics.median(ho),
                     "obj_us": float("nan"), "torch_us": float("nan")})
        print(f"ab-map {k:45s} queued {statistics.median(q):6.2f} us (min {min(q):.2f}) | host only "
              f"{statistics.median(ho):6.2f} us (min {min(ho):.2f})", flush=True)
    if lib is not None and hasattr(lib, "map_stats"):
        print(f"ab-map: slot hits {lib.map_stats()}", flush=True)
    sync()
    pydnn.destroy(h)
    return rows


def run_gpu(families, calls, label=""):
    import torch

    h = pydnn.create()
    pydnn.set_stream(h, torch.cuda.current_stream().cuda_stream)
    buf = TorchBuffers()
    rows = []
    x1 = torch.randn(1, device="cuda")
    torch_ops = {"relu": lambda: torch.relu(x1), "add_": lambda: x1.add_(x1), "add": lambda: torch.add(x1, x1),
                 "mul_": lambda: x1.mul_(1.0), "copy_": lambda: x1.copy_(x1),
                 "softmax": lambda: torch.softmax(x1, 0), "sum": lambda: x1.sum(),
                 "threshold_backward": lambda: torch.ops.aten.threshold_backward(x1, x1, 0.0)}
    cases = list(CASES)
    if not families or "activation" in families:  # the Python function itself, without its C entry (C_ENTRY)
        cases.insert(1, ("activation", "activation_forward [the Python function]", _act_py))
    for fam, name, setup in cases:
        if families and fam not in families:
            continue
        try:
            call, ints, objs, tname = setup(h, buf)
            call(ints)
            torch.cuda.synchronize()
        except pydnn.PydnnError as e:
            print(f"{fam:13s} {name:45s} skipped: {e}", flush=True)
            continue
        sync = torch.cuda.synchronize
        r = {"family": fam, "case": name + label, "int_us": time_us(lambda: call(ints), calls),
             "obj_us": time_us(lambda: call(objs), calls)}
        torch.cuda.synchronize()
        top = torch_ops.get(tname)
        r["torch_us"] = time_us(top, calls) if top else float("nan")
        torch.cuda.synchronize()
        r["int_host"] = time_us_host(lambda: call(ints), calls, sync)
        r["obj_host"] = time_us_host(lambda: call(objs), calls, sync)
        r["torch_host"] = time_us_host(top, calls, sync) if top else float("nan")
        rows.append(r)
        print(f"{fam:13s} {name + label:45s} int {r['int_us']:6.2f} us | torch tensors {r['obj_us']:6.2f} us | "
              f"torch.{tname} {r['torch_us']:6.2f} us || host only: int {r['int_host']:6.2f} | torch tensors "
              f"{r['obj_host']:6.2f} | torch.{tname} {r['torch_host']:6.2f} us", flush=True)
    # the floor: the same launch record enqueued directly (cuda.bindings' cuLaunchKernel and the driver)
    if not families or "activation" in families:
        call, ints, objs, _ = _act(h, buf)
        call(ints)
        rec = next(r for r in h.prepared.values() if hasattr(r, "vec_func"))
        from pydnn._cuda import driver

        la, stream = driver.launch_args, h.cu_stream
        sync = torch.cuda.synchronize
        fn = lambda: la(rec.vec_func, rec.vec_grid, rec.vec_block, 0, stream, rec.argv)  # noqa: E731
        us, hus = time_us(fn, calls), time_us_host(fn, calls, sync)
        torch.cuda.synchronize()
        print(f"{'launch':13s} {'driver.launch_args alone (cuLaunchKernel)':45s} {us:6.2f} us || host only "
              f"{hus:6.2f} us", flush=True)
        rows.append({"family": "launch", "case": "driver.launch_args alone", "int_us": us, "obj_us": float("nan"),
                     "torch_us": float("nan"), "int_host": hus})
        if getattr(rec, "crec", None):  # the compiled patch + launch (pydnn/_build/fastcall.py) alone
            from pydnn.ops import _elementwise as ew

            fl, c, s, y0, x0 = ew._fast_launch, rec.crec, h.stream, ints[1], ints[0]
            fn = lambda: fl(c, s, y0, x0, 0, 0, 1.0, 1.0, 0.0, 1)  # noqa: E731
            us, hus = time_us(fn, calls), time_us_host(fn, calls, sync)
            torch.cuda.synchronize()
            print(f"{'launch':13s} {'fastcall pydnn_map_launch alone':45s} {us:6.2f} us || host only {hus:6.2f} us",
                  flush=True)
            rows.append({"family": "launch", "case": "fastcall pydnn_map_launch alone", "int_us": us,
                         "obj_us": float("nan"), "torch_us": float("nan"), "int_host": hus})
        check_gpu(h)
    pydnn.destroy(h)
    return rows


def run_graph(calls, gpu, dims=(4, 64, 256), matmul=False):
    """Graph.execute's host time on a built plan (issue 22): the 8-op chain (one fused pointwise kernel,
    tools/bench_graph.py's graph at a small shape) with int pointers and with torch tensors, queued (a plain
    loop) and host only (bursts with a synchronize between them). On the CPU: launches stubbed, torch
    tensors stood in for by bench_host_cpu's torch-like type when torch has no CUDA."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "graph"))
    import test_graph_host_cpu as T

    rows = []
    ctx = contextlib.nullcontext() if gpu else no_launch()
    with ctx:
        if gpu:
            import torch

            h = pydnn.create()
            pydnn.set_stream(h, torch.cuda.current_stream().cuda_stream)
            sync = torch.cuda.synchronize
        else:
            h, sync = cpu_handle(), (lambda: None)
        cases = [("8-op chain", lambda: T._chain(h, *dims))]
        if matmul:  # a fused GEMM: compiles a matmul kernel on first use (seconds on the GPU machine)
            cases.append(("matmul + bias + GELU", lambda: T._matmul_gelu(h)))
        for label, make in cases:
            try:
                g, sizes = make()
                g.build_operation_graph().create_execution_plans().build_plans()
            except pydnn.PydnnError as e:
                print(f"graph {label}: skipped: {e}", flush=True)
                continue
            if gpu:
                dt = torch.bfloat16
                objs = {n: torch.empty(nb // 2, device="cuda", dtype=dt) for n, nb in sizes.items()}
                for t in objs.values():
                    t.normal_()
                ints = {n: t.data_ptr() for n, t in objs.items()}
            else:
                import bench_host_cpu as BC

                buf, tl = CpuBuffers(), BC._torch_like_type()
                ints = {n: buf(nb)[0] for n, nb in sizes.items()}
                objs = {n: tl(p, sizes[n]) for n, p in ints.items()}
            r = {"family": "graph", "case": f"Graph.execute {label}"}
            for key, b in (("int", ints), ("obj", objs)):
                g.execute(b, 0)
                sync()
                f = functools.partial(g.execute, b, 0)  # no benchmark frame timed
                r[key + "_us"] = time_us(f, calls)
                sync()
                r[key + "_host"] = time_us_host(f, calls, sync)
                r[key + "_calls"] = python_calls(f)[0]
            sync()
            r["torch_us"] = r["torch_host"] = float("nan")
            rows.append(r)
            print(f"{'graph':13s} {r['case']:45s} int {r['int_us']:6.2f} us ({r['int_calls']} py calls) | torch "
                  f"tensors {r['obj_us']:6.2f} us ({r['obj_calls']} py calls) || host only: int {r['int_host']:6.2f} | "
                  f"torch tensors {r['obj_host']:6.2f} us (target <= 10 us)", flush=True)
        if gpu:
            sync()
            pydnn.destroy(h)
    return rows


def run_mha(calls, gpu):
    """The legacy MHA layer's host time per call: plans on and off (tuning.callpath.MHA_PLANS). On the GPU
    with real launches (kernels compiled on first use), else with launches replaced by no-ops."""
    from pydnn import tuning

    rows = []
    ctx = contextlib.nullcontext() if gpu else no_launch()
    with ctx:
        if gpu:
            import torch

            h = pydnn.create()
            pydnn.set_stream(h, torch.cuda.current_stream().cuda_stream)
            buf = TorchBuffers()
        else:
            h, buf = cpu_handle(), CpuBuffers()
        for fam, name, setup in MHA_CASES:
            call, ints, objs, _ = setup(h, buf)
            r = {"family": fam, "case": name}
            for on in (False, True):
                tuning.callpath.MHA_PLANS = on
                call(ints)
                r["plans" if on else "full"] = time_us(lambda: call(ints), calls, 3)
                r["calls_plans" if on else "calls_full"] = python_calls(lambda: call(ints))[0]
                if gpu:
                    torch.cuda.synchronize()
            tuning.callpath.reset()
            rows.append(r)
            print(f"{fam:13s} {name:52s} full {r['full']:8.1f} us ({r['calls_full']} py calls) | plan "
                  f"{r['plans']:7.1f} us ({r['calls_plans']} py calls)", flush=True)
        if gpu:
            torch.cuda.synchronize()
            pydnn.destroy(h)
    return rows


def run_c(calls, rounds=7):
    """Build tests/c/bench_host.c against libpydnn and run it (it prints its own lines)."""
    import shlex
    import shutil
    import subprocess
    import tempfile

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        print("C: no compiler, skipped")
        return None
    from pydnn.capi import library

    flags = shlex.split(library.config_flags(cflags=True, libs=True))
    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, "bench_host")
        subprocess.run([cc, "-O2", os.path.join(ROOT, "tests", "c", "bench_host.c"), *flags, "-o", exe], check=True)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        out = subprocess.run([exe, str(calls), str(rounds)], capture_output=True, text=True, env=env, timeout=600)
        print(out.stdout + out.stderr, end="", flush=True)
        return out.stdout


def to_markdown(rows, gpu):
    if gpu:
        nan = float("nan")
        lines = ["| family | call | int pointers µs | torch tensors µs | PyTorch op µs | host only: int µs | "
                 "torch tensors µs | PyTorch op µs |", "|---|---|---:|---:|---:|---:|---:|---:|"]
        lines += [f"| {r['family']} | {r['case']} | {r['int_us']:.2f} | {r['obj_us']:.2f} | {r['torch_us']:.2f} | "
                  f"{r.get('int_host', nan):.2f} | {r.get('obj_host', nan):.2f} | {r.get('torch_host', nan):.2f} |"
                  for r in rows]
    else:
        lines = ["| family | call (no launch) | int pointers µs | Python calls | CAI objects µs | Python calls |",
                 "|---|---|---:|---:|---:|---:|"]
        lines += [f"| {r['family']} | {r['case']} | {r['int_us']:.2f} | {r['int_calls'][0]} | {r['obj_us']:.2f} | "
                  f"{r['obj_calls'][0]} |" for r in rows]
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu", action="store_true", help="host work without a GPU (launches replaced by no-ops)")
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--families", default="", help="comma-separated families (default: all)")
    p.add_argument("--c", action="store_true", help="also time the calls from C (GPU only)")
    p.add_argument("--c-only", action="store_true", help="only the C program (tests/c/bench_host.c), on a GPU")
    p.add_argument("--c-rounds", type=int, default=7, help="the C program's alternating rounds (fast path vs launch)")
    p.add_argument("--out", help="write the markdown table here")
    p.add_argument("--quick", action="store_true",
                   help="a short run: activation and tensor families, the launch floor, C, MHA host time "
                        "(launches stubbed unless --mha-gpu)")
    p.add_argument("--mha", action="store_true", help="also the legacy MHA layer (plans on / off)")
    p.add_argument("--mha-gpu", action="store_true", help="MHA with real launches (compiles matmul / attention)")
    p.add_argument("--graph", action="store_true",
                   help="also Graph.execute on built plans (the 8-op chain, matmul + bias + GELU)")
    p.add_argument("--ab", action="store_true",
                   help="activation_forward's C entry vs the Python function vs torch.relu, alternating rounds")
    p.add_argument("--ab-map", action="store_true",
                   help="the element-wise calls' compiled entries vs their Python functions vs PyTorch, alternating "
                        "rounds (session 33)")
    p.add_argument("--ab-rounds", type=int, default=5, help="rounds of --ab / --ab-map")
    p.add_argument("--graph-matmul", action="store_true", help="with --graph on a GPU: the fused matmul graph too")
    p.add_argument("--no-c-launch-off", action="store_true",
                   help="with --quick on a GPU: skip the pass with tuning.callpath.C_LAUNCH off")
    args = p.parse_args()
    if args.quick:
        args.families = args.families or "activation,tensor"
        args.calls = min(args.calls, 5000)
        args.c = args.mha = True
    families = {f.strip() for f in args.families.split(",") if f.strip()}
    from pydnn._cuda import driver

    gpu = not args.cpu and driver.available()
    if args.c_only:
        c_out = run_c(args.calls, args.c_rounds) if gpu else None
        if args.out and c_out:
            with open(args.out, "w") as f:
                f.write("From C (tests/c/bench_host.c):\n\n```\n" + c_out + "```\n")
        return
    print(f"pydnn {pydnn.__version__}, python {sys.version.split()[0]}, "
          f"{'GPU: real launches' if gpu else 'CPU: launches replaced by no-ops'}", flush=True)
    if gpu and args.quick and not args.no_c_launch_off:  # the compiled launch (C_LAUNCH) off, then on
        from pydnn import tuning

        tuning.callpath.C_LAUNCH = False
        rows = run_gpu(families, args.calls, " [C_LAUNCH off]")
        tuning.callpath.C_LAUNCH = True
        rows += run_gpu(families, args.calls)
    else:
        rows = run_gpu(families, args.calls) if gpu else run_cpu(families, args.calls)
    if gpu and args.ab:
        rows += run_ab(args.calls, args.ab_rounds)
    if gpu and args.ab_map:
        rows += run_ab_map(args.calls, args.ab_rounds)
    md = to_markdown(rows, gpu)
    if args.graph:
        grows = run_graph(args.calls, gpu, matmul=args.graph_matmul or not gpu)
        md += ("\nGraph.execute on a built plan (" + ("GPU" if gpu else "CPU, launches stubbed") + "):\n\n"
               "| call | int µs | Python calls | torch tensors µs | Python calls | host only: int µs | "
               "torch tensors µs |\n|---|---:|---:|---:|---:|---:|---:|\n")
        md += "".join(f"| {r['case']} | {r['int_us']:.2f} | {r['int_calls']} | {r['obj_us']:.2f} | {r['obj_calls']} | "
                      f"{r['int_host']:.2f} | {r['obj_host']:.2f} |\n" for r in grows)
    if gpu and args.c:
        c_out = run_c(args.calls, args.c_rounds)
        if c_out:
            md += "\nFrom C (tests/c/bench_host.c):\n\n```\n" + c_out + "```\n"
    if args.mha:
        mrows = run_mha(max(20, args.calls // 100), gpu and args.mha_gpu)
        md += ("\nLegacy MHA layer, host time per call (" + ("real launches" if gpu and args.mha_gpu else
                                                          "launches stubbed") + "):\n\n"
               "| call | full µs | Python calls | plan µs | Python calls |\n|---|---:|---:|---:|---:|\n")
        md += "".join(f"| {r['case']} | {r['full']:.1f} | {r['calls_full']} | {r['plans']:.1f} | {r['calls_plans']} |\n"
                      for r in mrows)
    print("\n" + md)
    if args.out:
        with open(args.out, "w") as f:
            f.write(md)


if __name__ == "__main__":
    main()
