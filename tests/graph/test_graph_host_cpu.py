"""Graph.execute's host path, counted (not timed) so that its fast path cannot silently go away (CPU).

A built plan on a handle whose kernels are placeholders and whose launches are no-ops (tools/bench_host.py's
CPU harness): one execute with int pointers makes a bounded number of Python-level function calls
(sys.setprofile "call" events), launches exactly one kernel for a fused graph, and does no per-plan work
(key maps, buffer resolution of ints, function lookups, code generation) again."""
import os
import sys

import pytest

import pydnn
from pydnn.graph import Graph

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))
import bench_host as B  # noqa: E402

BF16 = pydnn.PYDNN_DATA_BFLOAT16
# Python function calls of one execute (the test's lambda and the no-op cuLaunchKernel included): 7 for
# both when the fast path went in; before it 28 (fused matmul) and 22 (chain): a name search per buffer,
# device_ptr per buffer, a generator per pointer and a function lookup per launch. On this CPU harness
# (no-op launch, a shared 2-core machine) a call went from 119 / 87 us to 29 / 31 us.
BUDGET = {"matmul_gelu": 8, "chain": 8}
PLANNING = ("_key_map", "_uid_of", "device_ptr", "_functions", "function", "gemm_plan", "kernel_unit",
            "matmul_unit", "collapse", "launch_shape", "params", "_need_plan")


def _calls(fn):
    names = []

    def prof(frame, event, arg):
        if event == "call":
            names.append(frame.f_code.co_name)

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return names


def _matmul_gelu(h, m=64, n=128, k=64):
    g = Graph(io_data_type=BF16, intermediate_data_type=pydnn.PYDNN_DATA_FLOAT,
              compute_data_type=pydnn.PYDNN_DATA_FLOAT, handle=h)
    x = g.tensor(name="x", dim=[1, m, k])
    w = g.tensor(name="w", dim=[1, k, n])
    b = g.tensor(name="b", dim=[1, 1, n])
    g.gelu(g.add(g.matmul(x, w), b)).set_output(True).set_name("y")
    return g, dict(x=m * k * 2, w=k * n * 2, b=n * 2, y=m * n * 2)


def _chain(h, n=4, c=8, w=32):
    g = Graph(io_data_type=BF16, handle=h)
    x = g.tensor(name="x", dim=[n, c, w])
    s = g.tensor(name="s", dim=[1, c, 1])
    b = g.tensor(name="b", dim=[1, 1, w])
    v = g.gelu(g.add(g.mul(x, s), b))
    v = g.tanh(g.relu(g.sub(g.mul(v, x), b), upper_clip=4.0))
    g.add(v, x).set_output(True).set_name("y")
    e = n * c * w * 2
    return g, dict(x=e, s=c * 2, b=w * 2, y=e)


@pytest.fixture
def cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("PYDNN_CACHE_DIR", str(tmp_path))
    with B.no_launch() as drv:
        yield B.cpu_handle(), B.CpuBuffers(), drv


@pytest.mark.parametrize("case", ["matmul_gelu", "chain"])
def test_execute_python_work_is_bounded(cpu, case):
    h, buf, drv = cpu
    g, sizes = {"matmul_gelu": _matmul_gelu, "chain": _chain}[case](h)
    g.build_operation_graph().create_execution_plans().check_support().build_plans()
    assert g.engine_index() == 1 and g.launches() == 1
    bufs = {name: buf(nbytes)[0] for name, nbytes in sizes.items()}
    g.execute(bufs, 0)  # the first call makes the key map and looks the kernels up
    before = drv.launches
    names = _calls(lambda: g.execute(bufs, 0))
    assert drv.launches == before + 1
    assert len(names) <= BUDGET[case], names
    for planning in PLANNING:
        assert planning not in names, (planning, names)
    # tensors and uids as keys take the same path; a renamed tensor is found under its new name
    by_tensor = {t: bufs[t.name] for t in g.tensors if not t.virtual}
    assert len(_calls(lambda: g.execute(by_tensor, 0))) <= BUDGET[case]
    t = next(t for t in g.tensors if t.name == "x")
    t.set_name("x2")
    bufs["x2"] = bufs.pop("x")
    g.execute(bufs, 0)
    assert drv.launches == before + 3


def test_execute_errors_still_name_the_tensor(cpu):
    h, buf, drv = cpu
    g, sizes = _chain(h)
    g.build_operation_graph().create_execution_plans().build_plans()
    bufs = {name: buf(nbytes)[0] for name, nbytes in sizes.items()}
    g.execute(bufs, 0)
    with pytest.raises(pydnn.PydnnError, match="no data pointer for tensor uid"):
        g.execute({k: v for k, v in bufs.items() if k != "s"}, 0)
    with pytest.raises(pydnn.PydnnError, match="no tensor named 'nope'"):
        g.execute(dict(bufs, nope=1), 0)
    with pytest.raises(pydnn.PydnnError, match="NULL|null"):
        g.execute(dict(bufs, x=0), 0)


@pytest.mark.parametrize("case", ["matmul_gelu", "chain"])
def test_execute_with_torch_tensors_reads_them_inline(cpu, case):
    """Torch tensors (a stand-in type spelled like torch.Tensor, verified once against its array interface)
    are read inline by Graph.execute: the int path's calls plus the tensors' own data_ptr / is_contiguous
    (C methods of a real tensor; Python functions of this stand-in), no device_ptr or _torch_ptr a tensor."""
    import bench_host_cpu as BC

    h, buf, drv = cpu
    g, sizes = {"matmul_gelu": _matmul_gelu, "chain": _chain}[case](h)
    g.build_operation_graph().create_execution_plans().check_support().build_plans()
    tl = BC._torch_like_type()
    ints = {name: buf(nbytes)[0] for name, nbytes in sizes.items()}
    objs = {name: tl(p, sizes[name]) for name, p in ints.items()}
    g.execute(ints, 0)
    g.execute(objs, 0)  # the first object of its type: verified through plans.run's device_ptr
    int_names = _calls(lambda: g.execute(ints, 0))
    before = drv.launches
    names = _calls(lambda: g.execute(objs, 0))
    assert drv.launches == before + 1
    assert "device_ptr" not in names and "_torch_ptr" not in names and "run" in names, names
    assert len(names) == len(int_names) + 2 * len(objs), (names, int_names)
