#!/usr/bin/env python3
"""Host cost of pydnn's calls without a GPU, with the driver's launch stubbed at the bottom.

    python tools/bench_host_cpu.py [--calls N] [--families activation,...] [--mha] [--out table.md]

A stand-in libcuda.so.1 (built here with the C compiler: cuLaunchKernel and the few entry points
cuda.bindings asks for, all returning success without doing anything) goes first on LD_LIBRARY_PATH, so a
call runs everything it runs on a GPU machine - pydnn's Python, cuda.bindings' own cuLaunchKernel wrapper
and its argument conversion - except the driver's work. The handle is a CPU handle (tools/bench_host.py's)
whose kernels are fake CUfunction values; buffers are fake device addresses as ints, as objects spelled like
torch tensors (module `torch`, name `Tensor`, the attributes pydnn's fast path reads; Python-level
attributes, so slower than torch's own) and as __cuda_array_interface__ objects.

Per case: microseconds of this process's CPU time per call (median of 5 loops; wall time on a shared
machine counts other processes' load) and the Python-level function calls of one call
(sys.setprofile), and `launch` rows for driver.launch_args alone (the stubbed launch's own cost). Absolute
times are this machine's; ratios and call counts carry over to the GPU machine (tools/bench_host.py there).
Without a C compiler it falls back to tools/bench_host.py --cpu's Python no-op launch.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

FAKE_CUDA = r"""
#include <string.h>
typedef unsigned long long u64;
static int ok(void) { return 0; }
/* what the last launches were given (tests/hard/test_fastcall_cpu.py reads them with fake_launches) */
typedef struct { u64 func, stream, smem; unsigned dims[6]; unsigned char params[64]; } rec_t;
static rec_t recs[4096];
static unsigned long nrecs;
int fake_launches(rec_t *out, unsigned long cap) {
  unsigned long n = nrecs < cap ? nrecs : cap;
  memcpy(out, recs, n * sizeof(rec_t));
  nrecs = 0;
  return (int)n;
}
/* the whole parameter struct of the last launch, when a test says how large it is (fake_capture) */
static unsigned char last_params[8192];
static unsigned long capture;
void fake_capture(unsigned long n) { capture = n < sizeof last_params ? n : sizeof last_params; }
int fake_last_params(unsigned char *out, unsigned long cap) {
  unsigned long n = capture < cap ? capture : cap;
  memcpy(out, last_params, n);
  return (int)n;
}
static int launch(void *f, unsigned a, unsigned b, unsigned c, unsigned d, unsigned e, unsigned g, unsigned s,
                  void *st, void **p, void **x) {
  if (capture) memcpy(last_params, p[0], capture);
  if (nrecs < 4096) {
    rec_t *r = &recs[nrecs++];
    unsigned dims[6] = {a, b, c, d, e, g};
    r->func = (u64)f; r->stream = (u64)st; r->smem = s;
    memcpy(r->dims, dims, sizeof dims);
    memcpy(r->params, p[0], 64);
  }
  return 0;
}
static int copy(u64 dst, u64 src, size_t n, void *st) { return 0; }
static int version(int *v) { *v = 13000; return 0; }
int cuLaunchKernel(void *f, unsigned a, unsigned b, unsigned c, unsigned d, unsigned e, unsigned g, unsigned s,
                   void *st, void **p, void **x) { return launch(f, a, b, c, d, e, g, s, st, p, x); }
int cuMemcpyDtoDAsync_v2(u64 dst, u64 src, size_t n, void *st) { return copy(dst, src, n, st); }
int cuDriverGetVersion(int *v) { *v = 13000; return 0; }
int cuInit(unsigned f) { return 0; }
int cuGetProcAddress_v2(const char *sym, void **pfn, int ver, u64 flags, int *status) {
  if (status) *status = 0;
  if (!strcmp(sym, "cuLaunchKernel")) { *pfn = (void *)launch; return 0; }
  if (!strcmp(sym, "cuDriverGetVersion")) { *pfn = (void *)version; return 0; }
  if (!strcmp(sym, "cuInit")) { *pfn = (void *)ok; return 0; }
  if (!strcmp(sym, "cuMemcpyDtoDAsync")) { *pfn = (void *)copy; return 0; }
  *pfn = 0;
  if (status) *status = 1;
  return 500;
}
int cuGetProcAddress(const char *sym, void **pfn, int ver, u64 flags) { return cuGetProcAddress_v2(sym, pfn, ver, flags, 0); }
"""


def fake_libcuda_dir():
    """A folder holding the stand-in libcuda.so.1 (None without a C compiler)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    import hashlib

    tag = hashlib.sha256(FAKE_CUDA.encode()).hexdigest()[:10]
    d = os.path.join(tempfile.gettempdir(), f"pydnn-fake-cuda-{os.getuid()}-{tag}")
    lib = os.path.join(d, "libcuda.so.1")
    if not os.path.exists(lib):
        os.makedirs(d, exist_ok=True)
        src = os.path.join(d, "fake.c")
        with open(src, "w") as f:
            f.write(FAKE_CUDA)
        subprocess.run([cc, "-O2", "-shared", "-fPIC", src, "-o", lib + ".tmp"], check=True)
        os.replace(lib + ".tmp", lib)
    return d


def stand_in_env(root):
    """The environment of a child process that runs over the stand-in libcuda.so.1 (first on LD_LIBRARY_PATH; the
    loader reads it at the start) and imports pydnn from `root`."""
    d = fake_libcuda_dir()
    join = lambda *xs: os.pathsep.join(str(x) for x in xs if x)  # noqa: E731
    return dict(os.environ, LD_LIBRARY_PATH=join(d, os.environ.get("LD_LIBRARY_PATH")),
                PYTHONPATH=join(root, os.environ.get("PYTHONPATH")))


class LaunchLog:
    """What the stand-in libcuda.so.1 was given (in a process that loaded it: LD_LIBRARY_PATH set before the start):
    drain() -> [[[func, stream, smem, grid + block], ...] of the launches since the last drain, the whole parameter
    struct of the last launch as hex (capture(n) bytes of it)]; records(cap) -> the raw records (their first 64
    parameter bytes in .params)."""

    def __init__(self, capture=0, cap=64):
        import ctypes

        class Rec(ctypes.Structure):
            _fields_ = [("func", ctypes.c_uint64), ("stream", ctypes.c_uint64), ("smem", ctypes.c_uint64),
                        ("dims", ctypes.c_uint32 * 6), ("params", ctypes.c_uint8 * 64)]

        self.ctypes, self.Rec, self.cap = ctypes, Rec, cap
        self.fake = ctypes.CDLL("libcuda.so.1")
        self.capture(capture)

    def capture(self, n):
        self.n = n
        self.fake.fake_capture(n)

    def records(self, cap=None):
        buf = (self.Rec * (cap or self.cap))()
        return buf[:self.fake.fake_launches(buf, cap or self.cap)]

    def drain(self):
        recs = self.records()
        full = (self.ctypes.c_uint8 * max(self.n, 1))()
        self.fake.fake_last_params(full, self.n)
        return [[[r.func, r.stream, r.smem, list(r.dims)] for r in recs], bytes(full[:self.n]).hex()]


def _torch_like_type():
    ns = {"is_cuda": True, "requires_grad": False, "__init__": lambda self, p, n: self.__dict__.update(_p=p, nbytes=n),
          "data_ptr": lambda self: self._p, "is_contiguous": lambda self: True, "device": "cuda:0",
          "stride": lambda self: (1,), "element_size": lambda self: 1,
          "shape": property(lambda self: (self.nbytes,)),
          "__cuda_array_interface__": property(lambda self: {"data": (self._p, False), "shape": (self.nbytes,),
                                                             "typestr": "|u1", "strides": None, "version": 3})}
    t = type("Tensor", (), ns)
    t.__module__, t.__qualname__ = "torch", "Tensor"
    return t


class TorchLikeBuffers:
    def __init__(self):
        import bench_host as B

        self.addr, self.t = B.CpuBuffers(), _torch_like_type()

    def __call__(self, nbytes):
        p, _ = self.addr(nbytes)
        return p, self.t(p, nbytes)


def real_stub_handle():
    """A CPU handle whose kernels are CUfunction values, on the real cuda.bindings over the stand-in libcuda."""
    import bench_host as B
    from cuda.bindings import driver as d

    from pydnn._cuda import driver

    driver._driver()  # cuInit of the stand-in
    driver.function_set_max_dynamic_smem = lambda f, n: None
    funcs = {}

    class Funcs(dict):
        def get(self, key, default=None):
            f = funcs.get(key)
            if f is None:
                f = funcs[key] = d.CUfunction(0x10000 + 16 * len(funcs))
            return f

    h = B.cpu_handle()
    h._funcs, h.cu_stream = Funcs(), d.CUstream(0)
    return h


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--families", default="")
    p.add_argument("--mha", action="store_true", help="also the legacy MHA layer (plans off / on)")
    p.add_argument("--out")
    p.add_argument("--no-fake-libcuda", action="store_true", help="the Python no-op launch (bench_host --cpu)")
    args = p.parse_args()
    if not args.no_fake_libcuda and os.environ.get("PYDNN_FAKE_CUDA") is None:
        d = fake_libcuda_dir()
        if d is not None:
            env = dict(os.environ, PYDNN_FAKE_CUDA=d,
                       LD_LIBRARY_PATH=os.pathsep.join(x for x in (d, os.environ.get("LD_LIBRARY_PATH")) if x))
            os.execve(sys.executable, [sys.executable] + sys.argv, env)
    import contextlib

    import bench_host as B

    import pydnn

    import time
    import types

    # this process's CPU time, not wall time: on a shared machine other processes' load stays out
    B.time = types.SimpleNamespace(perf_counter=time.process_time)
    fake = os.environ.get("PYDNN_FAKE_CUDA") is not None and not args.no_fake_libcuda
    families = {f.strip() for f in args.families.split(",") if f.strip()}
    print(f"pydnn {pydnn.__version__} ({pydnn.__file__}), python {sys.version.split()[0]}, launch: "
          f"{'cuda.bindings over a no-op libcuda' if fake else 'Python no-op (bench_host --cpu)'}", flush=True)
    lines = ["| family | call | int µs | Py calls | torch-like µs | Py calls | CAI µs | Py calls |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    ctx = contextlib.nullcontext() if fake else B.no_launch()
    with ctx:
        h = real_stub_handle() if fake else B.cpu_handle()
        addr, torch_like = B.CpuBuffers(), TorchLikeBuffers()
        for fam, name, setup in B.CASES:
            if families and fam not in families:
                continue
            ints_call, ints, cai, _ = setup(h, addr)
            call2, _, tl, _ = setup(h, torch_like)
            ints_call(ints)
            call2(tl)
            r = [B.time_us(lambda: ints_call(ints), args.calls), B.python_calls(lambda: ints_call(ints))[0],
                 B.time_us(lambda: call2(tl), args.calls), B.python_calls(lambda: call2(tl))[0],
                 B.time_us(lambda: ints_call(cai), args.calls), B.python_calls(lambda: ints_call(cai))[0]]
            print(f"{fam:13s} {name:45s} int {r[0]:6.2f} us ({r[1]:3d}) | torch-like {r[2]:6.2f} us ({r[3]:3d}) | "
                  f"CAI {r[4]:6.2f} us ({r[5]:3d})", flush=True)
            lines.append(f"| {fam} | {name} | {r[0]:.2f} | {r[1]} | {r[2]:.2f} | {r[3]} | {r[4]:.2f} | {r[5]} |")
        rec = next((x for x in h.prepared.values() if hasattr(x, "vec_func")), None)
        if rec is not None:
            from pydnn._cuda import driver

            la, st = driver.launch_args, h.cu_stream
            us = B.time_us(lambda: la(rec.vec_func, rec.vec_grid, rec.vec_block, 0, st, rec.argv), args.calls)
            print(f"{'launch':13s} {'driver.launch_args alone':45s} {us:6.2f} us", flush=True)
            lines.append(f"| launch | driver.launch_args alone | {us:.2f} | | | | | |")
        if args.mha:
            from pydnn import tuning

            lines += ["", "| MHA call | full µs | Py calls | plan µs | Py calls |", "|---|---:|---:|---:|---:|"]
            for fam, name, setup in B.MHA_CASES:
                call, ints, _, _ = setup(h, addr)
                r = []
                for on in (False, True):
                    tuning.callpath.MHA_PLANS = on
                    call(ints)
                    r += [B.time_us(lambda: call(ints), max(20, args.calls // 100), 3),
                          B.python_calls(lambda: call(ints))[0]]
                tuning.callpath.reset()
                print(f"{'mha':13s} {name:52s} full {r[0]:8.1f} us ({r[1]}) | plan {r[2]:7.1f} us ({r[3]})", flush=True)
                lines.append(f"| {name} | {r[0]:.1f} | {r[1]} | {r[2]:.1f} | {r[3]} |")
    md = "\n".join(lines) + "\n"
    print("\n" + md)
    if args.out:
        with open(args.out, "w") as f:
            f.write(md)


if __name__ == "__main__":
    main()
