"""activation_forward's C entry (pydnn/_build/fastcall.py's act_fwd, tuning.callpath.C_ENTRY) without a GPU.

In a child process over tools/bench_host_cpu.py's stand-in libcuda.so.1 (which keeps each launch's
function, grid, block, stream and whole parameter struct): the entry answers exactly the cached calls the
Python function's cached path answers and launches the same bytes (int pointers, torch tensors - a
stand-in type spelled like torch.Tensor -, misaligned pointers: the scalar kernel, beta != 0: the beta
flag); it declines everything else (int scalars, a dead handle, a changed descriptor, NULL, negative, too
small or host buffers, PYDNN_CHECKED, a replaced launch_args, keywords, a wrong argument count) and the
Python function then launches or raises as before: the same errors."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "tools"))

SCRIPT = r'''
import ctypes, json, sys
sys.path.insert(0, sys.argv[1])
import bench_host as B, bench_host_cpu as C
import pydnn as P
from pydnn import buffers, tuning
from pydnn._build import fastcall
from pydnn._build.params import MapParams
from pydnn._cuda import driver
from pydnn.ops import activation as A

NP = ctypes.sizeof(MapParams)
log = C.LaunchLog(NP)  # the stand-in's launches: each one's function, stream, dims; the last one's whole params
drain = log.drain

tuning.callpath.C_LAUNCH = True
fastcall.install()
h, addr = C.real_stub_handle(), B.CpuBuffers()
h.stream = 0x7000
h.cu_stream = driver._driver().CUstream(0x7000)
TL = C._torch_like_type()
d = B._td((1, 1, 1, 1000))
a = P.create_activation_descriptor()
P.set_activation_descriptor(a, P.PYDNN_ACTIVATION_RELU, P.PYDNN_NOT_PROPAGATE_NAN, 0.0)
x0, y0 = addr(4000)[0], addr(4000)[0]
P.activation_forward(h, a, 1.0, d, x0, 0.0, d, y0)  # plans; sets the entry up
assert A._c_entry is not A._no_entry, "the C entry was not set up"
out = {}

def both(label, args, **kw):
    """(entry's answer, launches through the public function, launches through the Python function)"""
    drain()
    ans = A._c_entry(*args) if not kw else "keywords"
    drain()
    try:
        P.activation_forward(*args, **kw)
        r1 = drain()
    except Exception as e:
        r1 = [type(e).__name__, getattr(e, "status", None), str(e)]
    drain()
    saved, A._c_entry = A._c_entry, A._no_entry
    try:
        A._activation_forward(*args, **kw)
        r2 = drain()
    except Exception as e:
        r2 = [type(e).__name__, getattr(e, "status", None), str(e)]
    finally:
        A._c_entry = saved
    out[label] = [None if ans is None else str(ans), r1, r2]

both("ints", (h, a, 1.0, d, x0, 0.0, d, y0))
both("torch", (h, a, 1.0, d, TL(x0, 4000), 0.0, d, TL(y0, 4000)))
both("torch again", (h, a, 1.0, d, TL(x0, 4000), 0.0, d, TL(y0, 4000)))
class _Mem:
    def __init__(self, p):
        self.ptr = p

class _Flags:
    def __init__(self, c):
        self.c_contiguous = c

def _cai(self):
    return {"data": (self.data.ptr, False), "shape": self.shape, "typestr": "|u1",
            "strides": None if self._c else self.strides, "version": 3}

CL = type("ndarray", (), {  # a stand-in spelled like cupy.ndarray (the attributes buffers._cupy_ptr reads)
    "__init__": lambda self, p, n, c=True: self.__dict__.update(data=_Mem(p), nbytes=n, _c=c, shape=(n,),
                                                                  strides=(1 if c else 2,), itemsize=1),
    "flags": property(lambda self: _Flags(self._c)), "__cuda_array_interface__": property(_cai)})
CL.__module__, CL.__qualname__ = "cupy", "ndarray"
both("cupy", (h, a, 1.0, d, CL(x0, 4000), 0.0, d, CL(y0, 4000)))
both("cupy again", (h, a, 1.0, d, CL(x0, 4000), 0.0, d, CL(y0, 4000)))
both("cupy too small", (h, a, 1.0, d, CL(x0, 4000), 0.0, d, CL(y0, 3996)))
both("cupy strided", (h, a, 1.0, d, CL(x0, 4000, False), 0.0, d, CL(y0, 4000)))
both("cupy NULL", (h, a, 1.0, d, CL(0, 4000), 0.0, d, CL(y0, 4000)))
both("misaligned", (h, a, 1.0, d, x0 + 4, 0.0, d, y0))
both("beta", (h, a, 0.5, d, x0, 2.0, d, y0))
both("int alpha", (h, a, 1, d, x0, 0.0, d, y0))
both("keywords", (h, a, 1.0, d, x0, 0.0, d), y=y0)
both("torch too small", (h, a, 1.0, d, TL(x0, 4000), 0.0, d, TL(y0, 3996)))
cpu_t = TL(x0, 4000); cpu_t.is_cuda = False
both("host tensor", (h, a, 1.0, d, cpu_t, 0.0, d, TL(y0, 4000)))
both("NULL", (h, a, 1.0, d, 0, 0.0, d, y0))
both("negative", (h, a, 1.0, d, x0, 0.0, d, -5))
both("None", (h, a, 1.0, d, None, 0.0, d, y0))
P.set_tensor_nd_descriptor_ex(d, P.PYDNN_TENSOR_NCHW, P.PYDNN_DATA_FLOAT, 4, [1, 1, 1, 1000])  # a new version
both("descriptor set again", (h, a, 1.0, d, x0, 0.0, d, y0))
both("cached again", (h, a, 1.0, d, x0, 0.0, d, y0))
buffers.CHECKED = True
both("checked", (h, a, 1.0, d, x0, 0.0, d, y0))
buffers.CHECKED = False
la = driver.launch_args
driver.launch_args = lambda *args: la(*args)
both("launch_args replaced", (h, a, 1.0, d, x0, 0.0, d, y0))
driver.launch_args = la
both("too many", (h, a, 1.0, d, x0, 0.0, d, y0, 1))
P.destroy(h) if False else None
h.alive = False
both("dead handle", (h, a, 1.0, d, x0, 0.0, d, y0))
h.alive = True
# the call-site slots (tuning.callpath.C_ENTRY_SITES): a repeated call skips the lookups; every Set / Destroy /
# switch change moves the records' generation, and the next call looks up again (and declines if the key is new)
lib = fastcall._state["lib"]
site = {}
hits0 = lib.act_stats()[0]
both("slot", (h, a, 1.0, d, x0, 0.0, d, y0))
site["hit"] = lib.act_stats()[0] - hits0
g0 = tuning.RECORDS_GEN[0]
P.set_activation_descriptor(a, P.PYDNN_ACTIVATION_RELU, P.PYDNN_NOT_PROPAGATE_NAN, 0.0)  # same values, new version
site["gen moved by set"] = tuning.RECORDS_GEN[0] != g0
hits0 = lib.act_stats()[0]
both("slot after set", (h, a, 1.0, d, x0, 0.0, d, y0))
both("slot again", (h, a, 1.0, d, x0, 0.0, d, y0))
site["hits after set"] = lib.act_stats()[0] - hits0
g0 = tuning.RECORDS_GEN[0]
tuning.callpath.MHA_PLANS = True  # any switch
site["gen moved by tuning"] = tuning.RECORDS_GEN[0] != g0
a.version += 1  # a version moved without any Set (no code of pydnn's does this): the slot must not answer...
a.version -= 1  # ...but the key is the same again: answered after one lookup
hits0 = lib.act_stats()[0]
both("slot after tuning", (h, a, 1.0, d, x0, 0.0, d, y0))
site["hits after tuning"] = lib.act_stats()[0] - hits0
try:  # the entry's direct reads of a real torch.Tensor's attributes (CPU tensors: the same descriptors)
    import torch
except ImportError:
    torch = None
if torch is not None:
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    probes = []
    for t in (base, base.t(), base[:, ::2], torch.zeros(1).expand(50), base[1:]):
        got = list(lib.act_probe(torch.Tensor, t))
        probes.append([got, [t.is_cuda, t.nbytes, t.is_contiguous(), t.data_ptr(), True]])
    site["torch probes"] = probes
print(json.dumps(site))
print(json.dumps(out))
'''

TAKEN = ["ints", "torch again", "cupy again", "misaligned", "beta", "cached again", "slot", "slot again",
         "slot after tuning"]


def test_entry_answers_what_the_cached_path_answers(tmp_path, monkeypatch):
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler")
    pytest.importorskip("cuda.bindings")
    import bench_host as B
    import bench_host_cpu

    import pydnn as P

    # the activation kernels compiled here, into the cache the child reads (no NVRTC under the stand-in)
    monkeypatch.setenv("PYDNN_CACHE_DIR", str(tmp_path))
    with B.no_launch():
        h = B.cpu_handle()
        d = B._td((1, 1, 1, 1000))
        a = P.create_activation_descriptor()
        P.set_activation_descriptor(a, P.PYDNN_ACTIVATION_RELU, P.PYDNN_NOT_PROPAGATE_NAN, 0.0)
        P.activation_forward(h, a, 1.0, d, 1 << 32, 0.0, d, 1 << 33)
    env = bench_host_cpu.stand_in_env(ROOT)
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(ROOT / "tools")], capture_output=True, text=True, env=env,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    site = json.loads(r.stdout.strip().splitlines()[-2])
    # the slot answers a repeated call without lookups (1 hit: the entry's own call; the public function's
    # call hits again); a Set or a switch change makes the next call look up first (then it is remembered)
    assert site["hit"] == 2 and site["gen moved by set"] and site["gen moved by tuning"], site
    # after the Set: a new key, no record (declined, the Python function plans); then looked up and remembered
    assert site["hits after set"] == 1 and site["hits after tuning"] == 1, site
    try:
        import torch  # noqa: F401
        assert len(site["torch probes"]) == 5
    except ImportError:
        pass
    for got, want in site.get("torch probes", []):  # read through torch._C.TensorBase's own descriptors
        assert got == want, (got, want)
    for label, (answer, public, python) in out.items():
        assert public == python, label  # the same launch bytes, or the same exception, status and message
        if label in TAKEN:
            assert answer is None, label  # answered in C
            launches, _ = public
            assert len(launches) == 1 and launches[0][1] == 0x7000, label
        else:
            assert answer == "False" or answer == "keywords", (label, answer)
    # the launches the entry made differ where they must: the scalar kernel for a misaligned x, the beta flag
    # (the first torch call declines: its type is verified against the array interface by the Python path)
    assert out["ints"][1] == out["torch"][1] == out["torch again"][1] == out["cached again"][1]
    assert out["ints"][1] == out["cupy"][1] == out["cupy again"][1] == out["cupy strided"][1]
    assert out["misaligned"][1][0][0][0] != out["ints"][1][0][0][0]
    assert out["beta"][1][1] != out["ints"][1][1]
    for label, status in (("torch too small", P.PYDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT),
                          ("cupy too small", P.PYDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT),
                          ("cupy NULL", P.PYDNN_STATUS_BAD_PARAM_NULL_POINTER),
                          ("host tensor", P.PYDNN_STATUS_BAD_PARAM), ("NULL", P.PYDNN_STATUS_BAD_PARAM_NULL_POINTER),
                          ("negative", P.PYDNN_STATUS_BAD_PARAM), ("None", P.PYDNN_STATUS_BAD_PARAM_NULL_POINTER),
                          ("dead handle", P.PYDNN_STATUS_BAD_PARAM)):
        assert out[label][1][0] == "PydnnError" and out[label][1][1] == status, (label, out[label])
    assert out["too many"][1][0] == "TypeError"
    # ("checked": PYDNN_CHECKED's allocation query fails on the stand-in driver, in both paths alike)
    for label in ("int alpha", "keywords", "descriptor set again", "launch_args replaced"):
        assert len(out[label][1][0]) == 1, label  # launched by the Python function
