"""Graph.execute's compiled launch (pydnn/_build/fastcall.py's patch_launch, PwStep) without a GPU.

tools/bench_host_cpu.py's stand-in libcuda.so.1 (which keeps what each launch was given, the whole
parameter struct included) under cuda.bindings and the helper, in a child process (LD_LIBRARY_PATH must be
set before the start). The 8-op chain's fused kernel is launched with int pointers, with torch-like tensors
and with misaligned pointers (the scalar form) through patch_launch (tuning.callpath.C_LAUNCH on) and
through driver.launch_args (off): the same function, grid, block, shared memory, stream and parameter bytes
each time, and the compiled path really used (one C call, no launch_args)."""
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
sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[2])
import bench_host as B, bench_host_cpu as C
import test_graph_host_cpu as T
from pydnn import tuning
from pydnn._build import fastcall
from pydnn._cuda import driver
from pydnn.graph import codegen as cg, engines

class Rec(ctypes.Structure):
    _fields_ = [("func", ctypes.c_uint64), ("stream", ctypes.c_uint64), ("smem", ctypes.c_uint64),
                ("dims", ctypes.c_uint32 * 6), ("params", ctypes.c_uint8 * 64)]

fake = ctypes.CDLL("libcuda.so.1")
NP = ctypes.sizeof(cg.GraphPwParams)
fake.fake_capture(NP)

def drain():
    buf = (Rec * 64)()
    n = fake.fake_launches(buf, 64)
    full = (ctypes.c_uint8 * NP)()
    fake.fake_last_params(full, NP)
    return [[r.func, r.stream, r.smem, list(r.dims)] for r in buf[:n]], bytes(full).hex()

TL = C._torch_like_type()
out, used = {}, {}
for on in (False, True):
    tuning.callpath.C_LAUNCH = on
    engines._PATCH[0] = None
    fastcall.install()  # as a handle's creation does
    h, addr = C.real_stub_handle(), B.CpuBuffers()
    h.stream = 0x5000  # a stream address the launch must carry
    h.cu_stream = driver._driver().CUstream(0x5000)
    g, sizes = T._chain(h)
    g.build_operation_graph().create_execution_plans().build_plans()
    ints = {n: addr(nb)[0] for n, nb in sizes.items()}
    runs = []
    calls = {"launch_args": 0}
    la = driver.launch_args
    for label, bufs in (("ints", ints), ("torch-like", {n: TL(p, sizes[n]) for n, p in ints.items()}),
                        ("misaligned", {n: p + 2 for n, p in ints.items()}),
                        ("one misaligned", dict(ints, s=ints["s"] + 2)), ("ints again", ints)):
        g.execute(bufs, 0)
        g.execute(bufs, 0)
        drain()
        g.execute(bufs, 0)
        runs.append([label, drain()])
    step = g._plan_obj.built.steps[0]
    out[str(on)] = runs
    used[str(on)] = bool(step.crec_addr)
print(json.dumps({"out": out, "used": used}))
'''


def test_patch_launch_equals_the_python_launch(tmp_path, monkeypatch):
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler")
    pytest.importorskip("cuda.bindings")
    import bench_host as B
    import bench_host_cpu

    sys.path.insert(0, str(ROOT / "tests" / "graph"))
    import test_graph_host_cpu as T

    # the chain's kernel compiled here, into the cache the child reads (NVRTC is not run under the stand-in)
    monkeypatch.setenv("PYDNN_CACHE_DIR", str(tmp_path))
    with B.no_launch():
        g, _ = T._chain(B.cpu_handle())
        g.build_operation_graph().create_execution_plans().build_plans()
    env = bench_host_cpu.stand_in_env(ROOT)
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(ROOT / "tools"), str(ROOT / "tests" / "graph")],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["used"] == {"False": False, "True": True}
    off, on = res["out"]["False"], res["out"]["True"]
    assert [x[0] for x in off] == [x[0] for x in on]
    for (label, (launches_off, params_off)), (_, (launches_on, params_on)) in zip(off, on):
        assert len(launches_on) == 1, label  # one kernel a call
        assert launches_on == launches_off, label
        assert launches_on[0][1] == 0x5000, label  # the handle's stream
        assert params_on == params_off, label
    # the vector flag followed the pointers: aligned and misaligned calls differ in the flags word
    by = dict((label, p) for label, (_, p) in on)
    assert by["ints"] != by["misaligned"] and by["ints"] == by["ints again"]
    assert by["ints"] == by["torch-like"]
