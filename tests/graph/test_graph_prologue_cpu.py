"""A pointwise prologue on a matmul's operands in the fusion engine (pydnn/graph/prologue.py) on the CPU:
the plan (one generated pointwise kernel per computed operand, then the fused GEMM), launch counts,
workspace, the operand's storage type, the reasons for graphs it does not take, serialization."""
import pytest

import pydnn as P
from pydnn.graph import Graph
from pydnn.graph import engines as EN
from test_fuzz_cpu import cpu_handle

BF16, F16, F32 = P.PYDNN_DATA_BFLOAT16, P.PYDNN_DATA_HALF, P.PYDNN_DATA_FLOAT


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("PYDNN_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "prologuecache"))


def graph(m=128, n=96, k=64, on_b=False, inter=F32, red=False, reuse=False):
    """gelu(relu(x * s) @ w + bias) (on_b: and w = tanh(w0) + 0.5 too)."""
    g = Graph(io_data_type=BF16, intermediate_data_type=inter, handle=cpu_handle())
    x = g.tensor(name="x", dim=[1, m, k])
    s = g.tensor(name="s", dim=[1, 1, k])
    w = g.tensor(name="w", dim=[1, k, n])
    bias = g.tensor(name="bias", dim=[1, 1, n])
    a = g.relu(g.mul(x, s))
    b = g.add(g.tanh(w), g.tensor(name="h", dim=[1, 1, 1])) if on_b else w
    v = g.gelu(g.add(g.matmul(a, b), bias))
    if reuse:
        v = g.add(v, g.tensor(name="z", dim=[1, m, n]))
    if red:
        g.reduction(v, P.PYDNN_REDUCE_TENSOR_MAX, dim=[1, m, 1]).set_output(True).set_name("rmax")
    else:
        v.set_output(True).set_name("y")
    return g


def test_prologue_on_a_is_two_launches():
    g = graph()
    g.build_operation_graph().create_execution_plans([P.PYDNN_HEUR_MODE_A, P.PYDNN_HEUR_MODE_FALLBACK])
    assert g.engines()[0] == 1
    g.build_plans()
    assert g.engine_index() == 1 and g.launches() == 2
    steps = g._plan_obj.built.steps
    assert [type(s).__name__ for s in steps] == ["PwStep", "FusedMatmulStep"]
    assert g.get_workspace_size() >= 128 * 64 * 2  # the bf16 operand in the workspace
    (uid, off), = g._plan_obj.built.offsets.items()
    assert off == 0  # no reduction partials before it
    blob = g.serialize()
    g2 = Graph.deserialize(cpu_handle(), blob)
    assert g2.engine_index() == 1 and g2.launches() == 2


def test_prologue_on_both_operands_and_a_row_reduction(monkeypatch):
    class Zeroed:  # the reduction's counters: device memory at build, none on the CPU
        ptr = 0
    monkeypatch.setattr(EN, "_zeroed_u32", lambda handle, n: Zeroed())
    g = graph(on_b=True, red=True)
    g.build_operation_graph().create_execution_plans().build_plans()
    assert g.engine_index() == 1 and g.launches() == 3
    built = g._plan_obj.built
    mm = built.steps[-1]
    assert type(mm).__name__ == "FusedMatmulStep" and mm.red_slot is not None
    offs = sorted(built.offsets.values())
    assert offs[0] >= mm.workspace_size and offs[0] % EN.ALIGN == 0  # after the reduction's partials
    assert g.get_workspace_size() >= offs[1] + 64 * 96 * 2


def test_prologue_reasons():
    from pydnn.graph.prologue import PrologueFuser

    fuser = PrologueFuser()
    g = graph()
    g.build_operation_graph()
    assert isinstance(fuser.analyze(g._opgraph.state), dict)
    # the prologue's result in FLOAT with a FLOAT other operand: no 16-bit type to store it in
    g = Graph(io_data_type=F32, handle=cpu_handle())
    x, w = g.tensor(name="x", dim=[1, 8, 8]), g.tensor(name="w", dim=[1, 8, 8])
    g.matmul(g.relu(x), w).set_output(True).set_name("y")
    g.build_operation_graph()
    why = fuser.analyze(g._opgraph.state)
    assert isinstance(why, str) and "HALF or BFLOAT16" in why
    # a prologue value also read after the matmul
    g = Graph(io_data_type=BF16, handle=cpu_handle())
    x, w = g.tensor(name="x", dim=[1, 8, 8]), g.tensor(name="w", dim=[1, 8, 8])
    r = g.relu(x)
    g.add(g.matmul(r, w), r).set_output(True).set_name("y")
    g.build_operation_graph()
    why = fuser.analyze(g._opgraph.state)
    assert isinstance(why, str) and "read after the matmul" in why
    # no prologue: not this fuser's graph
    g = Graph(io_data_type=BF16, handle=cpu_handle())
    x, w = g.tensor(name="x", dim=[1, 8, 8]), g.tensor(name="w", dim=[1, 8, 8])
    g.matmul(x, w).set_output(True).set_name("y")
    g.build_operation_graph()
    assert fuser.analyze(g._opgraph.state) is None
