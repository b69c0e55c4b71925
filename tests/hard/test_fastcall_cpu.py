"""The compiled launch paths (pydnn/_build/fastcall.py: map_launch, launch_items, driver.launch_args') without a GPU: a stand-in libcuda.so.1
(tools/bench_host_cpu.py's, which keeps what each launch was given) under cuda.bindings and the helper, in a
child process (LD_LIBRARY_PATH must be set before the start). Every family's cheapest call and the MHA
plans launch the same kernels with the same grids, blocks, shared memory, stream and parameter bytes with
tuning.callpath.C_LAUNCH on (map_launch / launch_items) as off (driver.launch_args, cuda.bindings)."""
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
from pydnn import tuning
from pydnn.ops import _elementwise as ew

class Rec(ctypes.Structure):
    _fields_ = [("func", ctypes.c_uint64), ("stream", ctypes.c_uint64), ("smem", ctypes.c_uint64),
                ("dims", ctypes.c_uint32 * 6), ("params", ctypes.c_uint8 * 64)]

fake = ctypes.CDLL("libcuda.so.1")

def drain():
    buf = (Rec * 4096)()
    n = fake.fake_launches(buf, 4096)
    return [[r.func, r.stream, r.smem, list(r.dims), bytes(r.params).hex()] for r in buf[:n]]

out, used = {}, {}
for on in (False, True):
    tuning.callpath.C_LAUNCH = on
    from pydnn._build import fastcall
    fastcall.install()  # as a handle's creation does: driver.launch_args through the helper (or not)
    h, addr = C.real_stub_handle(), B.CpuBuffers()
    runs = []
    for fam, name, setup in B.CASES + B.MHA_CASES:
        call, ints, _, _ = setup(h, addr)
        call(ints)
        drain()
        call(ints)
        call(tuple(p + 512 for p in ints))  # other addresses: patched
        runs.append([name, drain()])
    tuning.callpath.MHA_PLANS = False  # the MHA calls in full: their GEMMs and attention through launch_args
    for fam, name, setup in B.MHA_CASES:
        call, ints, _, _ = setup(h, addr)
        drain()
        call(ints)
        runs.append([name + " (full)", drain()])
    tuning.callpath.MHA_PLANS = True
    out[str(on)] = runs
    from pydnn._cuda import driver
    used[str(on)] = [sum(1 for r in h.prepared.values() if getattr(r, "crec", 0)),
                     sum(1 for r in h.prepared.values() if getattr(r, "citems", None)),
                     int(driver._fast is not None)]
print(json.dumps({"out": out, "used": used}))
'''


def test_compiled_launches_equal_the_python_ones(tmp_path):
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler")
    pytest.importorskip("cuda.bindings")
    import bench_host_cpu

    env = bench_host_cpu.stand_in_env(ROOT)
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(ROOT / "tools")], capture_output=True, text=True, env=env,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    off, on = res["out"]["False"], res["out"]["True"]
    assert res["used"]["False"] == [0, 0, 0]
    # map records, MHA plans, driver.launch_args (softmax, pooling, reduce, ... and the MHA recordings)
    assert res["used"]["True"][0] >= 5 and res["used"]["True"][1] >= 4 and res["used"]["True"][2], res["used"]
    for (name, a), (name2, b) in zip(off, on):
        assert name == name2
        assert a and a == b, name
