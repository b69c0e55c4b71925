"""tuning.callpath.CALL_REPLAY's batch-norm plans on the real launch path without a GPU: cuda.bindings and the
compiled launch over tools/bench_host_cpu.py's stand-in libcuda.so.1, in a child process (LD_LIBRARY_PATH must be
set before the start), the CNN demo's first layer at batch 8 (tests/core/test_call_path_cnn_gpu.py's case).

Session 30's final GPU run: no batch-norm call kept a plan (_replay.record compared the tagged recording with the
first real one, made on a fresh parameter struct, while the tagged run started from the leftovers the call's
later launches leave in it: chunk_rows / row_end). This reproduces that path (tests/core/test_call_path_cnn_cpu.py's
Python stand-in launch did not) and checks that a plan is kept and that its replayed launches carry, byte for
byte, what the batch-norm function itself launches on a repeated call with the same addresses."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "tools"))

SCRIPT = r'''
import json, sys
sys.path.insert(0, sys.argv[1])
import torch
import bench_host_cpu as BC, bench_host_cnn as BHC
from pydnn import tuning
from pydnn._cuda import driver
from pydnn.ops import _replay

h = BC.real_stub_handle()
BHC.N = 8
keep = []

def alloc(n):
    t = torch.empty(max(n, 16) + 8192, dtype=torch.uint8)
    keep.append(t)
    p = t.data_ptr()
    return p + (-p % 512), t

launched = []
orig = _replay.Plan.launch

def launch(self, handle):
    launched.append([[str(it[1]), list(it[2]), list(it[3]), it[4], bytes(_replay._buf(it)).hex()] for it in self.items])
    return orig(self, handle)

_replay.Plan.launch = launch
out = {}
for kind in ("bn_fwd", "bn_fwd_ex", "bn_bwd", "bn_bwd_ex"):
    tuning.callpath.CALL_REPLAY = True
    call, bs = getattr(BHC, "case_" + kind)(BHC.Ctx(h, alloc))
    p = tuple(x for x, _ in bs)
    launched.clear()
    call(p)  # recorded; launched from the plan
    plans = sum(isinstance(v, _replay.Plan) for v in h.prepared.values())
    q = tuple(x + 4096 for x in p)  # other addresses, the same low bits: repatched
    launched.clear()
    call(q)
    rep = list(launched)
    tuning.callpath.CALL_REPLAY = False
    call2, _ = getattr(BHC, "case_" + kind)(BHC.Ctx(h, alloc))  # fresh descriptors: the function itself
    call2(q)
    with driver.recording() as full:
        call2(q)  # its repeated call (the parameter struct as a repeated call leaves it)
    out[kind] = {"plans": plans, "replayed": rep,
                 "full": [[str(it[1]), list(it[2]), list(it[3]), it[4], it[5].hex()] for it in full]}
print(json.dumps(out))
'''


def test_bn_replay_keeps_a_plan_and_launches_what_the_function_does():
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler")
    pytest.importorskip("cuda.bindings")
    pytest.importorskip("torch")
    import bench_host_cpu

    d = bench_host_cpu.fake_libcuda_dir()
    env = dict(os.environ, LD_LIBRARY_PATH=os.pathsep.join(x for x in (d, os.environ.get("LD_LIBRARY_PATH")) if x),
               PYTHONPATH=os.pathsep.join(x for x in (str(ROOT), os.environ.get("PYTHONPATH")) if x))
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(ROOT / "tools")], capture_output=True, text=True, env=env,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    for kind, v in res.items():
        assert v["plans"] >= 1, kind  # session 30's defect: 0
        assert len(v["replayed"]) == 1, kind  # the repeated call was one replay
        rep, full = v["replayed"][0], v["full"]
        assert len(rep) == len(full) >= 3, kind
        for a, b in zip(rep, full):
            assert a == b, kind
