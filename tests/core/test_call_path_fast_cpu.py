"""The compiled fast paths of the cheapest calls, counted (not timed) so that they cannot silently go away.

In a child process over tools/bench_host_cpu.py's stand-in libcuda.so.1 (cuda.bindings and the launch
helper see a driver; launches do nothing), with tuning.callpath.C_LAUNCH on as a GPU machine runs:
- activation_forward on int pointers is no Python frame at all: pydnn.activation_forward is the compiled
  entry object (fastcall's act_entry: the cached path, answered from its call-site slot under the records'
  generation, and the launch); on torch tensors (a stand-in type spelled like torch.Tensor) only the tensor's
  own data_ptr() / is_contiguous() (C methods of a real tensor), no device_ptr;
- Graph.execute of a fused pointwise graph is execute and the step's run, then one C call
  (fastcall.patch_launch); with torch tensors no device_ptr either; a fused matmul graph adds only
  launch_args.
Every `<lambda>` counted below the call's own two is a stand-in tensor method."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "tools"))

SCRIPT = r'''
import gc, json, sys
sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[2])
import bench_host as B, bench_host_cpu as C
import test_graph_host_cpu as T
from pydnn import tuning
from pydnn._build import fastcall

def calls(fn):
    names = []
    def prof(frame, event, arg):
        if event == "call":
            names.append(frame.f_code.co_name)
    gc.collect(); gc.disable()
    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None); gc.enable()
    return names

tuning.callpath.C_LAUNCH = True
fastcall.install()
h, addr = C.real_stub_handle(), B.CpuBuffers()
TL = C._torch_like_type()
res = {}
call, ints, _, _ = B._act(h, addr)
objs = (TL(ints[0], 4), TL(ints[1], 4))
lib = fastcall._state["lib"]
for label, b in (("act int", ints), ("act torch", objs)):
    call(b); call(b)
    h0 = lib.act_stats()[0]
    res[label] = calls(lambda: call(b))
    res[label + " slot hits"] = lib.act_stats()[0] - h0
maps = {"act_bwd": B._act_bwd, "add": B._add, "op": B._op, "scale": B._scale, "transform": B._transform,
        "softmax": B._softmax, "pool": B._pool, "reduce": B._reduce, "bn": B._bn, "norm": B._norm}
for case, setup in maps.items():  # the map kinds' entries (tuning.callpath.C_ENTRY_MAP)
    # int addresses, and stand-in tensors of their sizes (of TL: the one stand-in type buffers verifies)
    call, ints, objs, _ = setup(h, lambda nb: (lambda q: (q, TL(q, nb)))(addr(nb)[0]))
    for label, b in (("int", ints), ("torch", objs)):
        call(b); call(b)
        h0 = sum(lib.map_stats()[0])
        res[f"{case} {label}"] = calls(lambda: call(b))
        res[f"{case} {label} slot hits"] = sum(lib.map_stats()[0]) - h0
for case in ("chain", "matmul_gelu"):
    g, sizes = getattr(T, "_" + case)(h)
    g.build_operation_graph().create_execution_plans().build_plans()
    bi = {n: addr(nb)[0] for n, nb in sizes.items()}
    bt = {n: TL(p, sizes[n]) for n, p in bi.items()}
    for label, b in (("int", bi), ("torch", bt)):
        g.execute(b, 0); g.execute(b, 0)
        res[f"{case} {label}"] = calls(lambda: g.execute(b, 0))
print(json.dumps(res))
'''

# The Python frames of one call once the stand-in's tensor methods (`<lambda>`, two a tensor: data_ptr and
# is_contiguous) are set aside; measured when these paths went in. Before: activation_forward was the api
# wrapper, the function and run_map and, for each torch tensor, device_ptr and _torch_ptr (7 frames with
# torch tensors); Graph.execute
# through EnginePlan.execute, PwStep.run's ctypes writes and launch_args (5 frames), and plans.run with a
# device_ptr and a _torch_ptr a tensor (14 frames with the chain's four tensors).
EXPECTED = {
    "act int": [],  # session 31: the entry object (session 30: its def's frame, ["activation_forward"])
    "act torch": [],
    # session 33: the element-wise family's other calls as compiled entries too (were the api wrapper, the
    # function and run_map: 3 frames with int pointers, and a device_ptr a torch tensor)
    # and softmax_forward / pooling_forward / reduce_tensor (their plans' launches patched in C: plan_core) and
    # batch_normalization_forward_inference (bn_core) and norm_forward_inference (nm_core)
    **{f"{c} {b}": [] for c in ("act_bwd", "add", "op", "scale", "transform", "softmax", "pool", "reduce", "bn",
                                "norm")
       for b in ("int", "torch")},
    "chain int": ["execute", "run"],
    "chain torch": ["execute", "run"],
    "matmul_gelu int": ["execute", "run", "launch_args"],
    "matmul_gelu torch": ["execute", "run", "launch_args"],
}
TENSORS = {"act": 2, "chain": 4, "matmul_gelu": 4, "act_bwd": 4, "add": 2, "op": 3, "scale": 2, "transform": 2,
           "softmax": 2, "pool": 2, "reduce": 2, "bn": 6, "norm": 4}


def test_fast_paths_python_frames(tmp_path, monkeypatch):
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler")
    pytest.importorskip("cuda.bindings")
    import bench_host as B
    import bench_host_cpu

    sys.path.insert(0, str(ROOT / "tests" / "graph"))
    import test_graph_host_cpu as T

    # the graphs' kernels compiled here, into the cache the child reads (no NVRTC under the stand-in)
    monkeypatch.setenv("PYDNN_CACHE_DIR", str(tmp_path))
    with B.no_launch():
        for case in (T._chain, T._matmul_gelu):
            g, _ = case(B.cpu_handle())
            g.build_operation_graph().create_execution_plans().build_plans()
    env = bench_host_cpu.stand_in_env(ROOT)
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(ROOT / "tools"), str(ROOT / "tests" / "graph")],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    for label in [k[:-len(" slot hits")] for k in res if k.endswith(" slot hits")]:  # answered from the call
        assert res.pop(label + " slot hits") == 1, label  # site's slot, not by a lookup
    for label, names in res.items():
        own = 1 if label.split()[0] in ("chain", "matmul_gelu") else 2  # the case's lambdas
        assert names[:own] == ["<lambda>"] * own, (label, names)
        rest = names[own:]
        frames = [n for n in rest if n != "<lambda>"]
        assert frames == EXPECTED[label], (label, names)
        methods = len(rest) - len(frames)
        want = 2 * TENSORS[label.split()[0]] if label.endswith("torch") else 0
        assert methods == want, (label, names)
