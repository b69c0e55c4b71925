"""Dense ScaleTensor / AddTensor / OpTensor whose operands fit in tuning.tensor_ops.PLAIN_BYTES take map_contig
with the plain cache policy (HINT 0, unit tensor_ops.plain.<t>), the others the streaming one (issue 20):
the planner's choice through the public calls on a CPU handle that records kernel lookups and launches,
the threshold's edge, the switch, broadcast / double / misaligned problems untouched, and every chosen
instantiation present in its unit."""
import pytest

import pydnn
from pydnn import tuning
from pydnn._cuda import driver
from pydnn.ops import _elementwise as ew
from pydnn.ops import tensor_ops as T
from test_tensor_ops_cpu import P1, P2, P3, _desc, _op, _rec_handle

F32, F64, F16, BF16 = (pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DATA_DOUBLE, pydnn.PYDNN_DATA_HALF,
                       pydnn.PYDNN_DATA_BFLOAT16)
TAG = {F32: "f32", F64: "f64", F16: "f16", BF16: "bf16"}
SIZE = {F32: 4, F64: 8, F16: 2, BF16: 2}


@pytest.fixture
def launches(monkeypatch):
    """driver.launch_args replaced by a recorder (run_map then skips its compiled fast path)."""
    seen = []
    monkeypatch.setattr(driver, "launch_args", lambda func, grid, block, smem, stream, argv: seen.append(func))
    return seen


def _units():
    return {u.name: set(u.exprs) for u in T.kernel_units()}


def _op_add(dims, dtype, launches, ptrs=(P1, P2, P3), bdims=None):
    h = _rec_handle()
    c = _desc(dims, dtype)
    b = _desc(bdims or dims, dtype)
    del launches[:]
    pydnn.op_tensor(h, _op(comp=F64 if dtype == F64 else F32), 1.0, c, ptrs[0], 1.0, b, ptrs[1], 0.0, c, ptrs[2])
    assert len(launches) == 1
    return launches[0]


@pytest.mark.parametrize("dims,dtype", [((82918, 64), BF16), ((13423, 160), F32), ((22923, 256), F16),
                                        ((12, 512), F32), ((1934, 80), F16), ((827, 1162), F16)])
def test_op_add_fitting_in_l2_takes_plain(dims, dtype, launches):
    unit, expr = _op_add(dims, dtype, launches)
    t = TAG[dtype]
    assert unit == f"tensor_ops.plain.{ew.ktag(t)}" and expr == ew.contig_expr(T.OPS[pydnn.PYDNN_OP_TENSOR_ADD], t, hint=0)
    assert expr.endswith(", 0>") and expr in _units()[unit]


@pytest.mark.parametrize("dims,dtype", [((7167, 8272), F16), ((5070, 32768), F32), ((107126, 2493), BF16)])
def test_op_add_beyond_l2(dims, dtype, launches):
    """Beyond L2: plain with the default (PLAIN_BYTES 1 TiB since session 32, measured 0.95x -> 1.00x PyTorch on
    these three), streaming with the L2-sized limit of before (40 MiB)."""
    t = TAG[dtype]
    unit, expr = _op_add(dims, dtype, launches)
    assert unit == f"tensor_ops.plain.{ew.ktag(t)}" and expr == ew.contig_expr(T.OPS[pydnn.PYDNN_OP_TENSOR_ADD], t, hint=0)
    with tuning.override({"tensor_ops.PLAIN_BYTES": 40 << 20}):
        unit, expr = _op_add(dims, dtype, launches)
    assert unit == f"tensor_ops.{ew.ktag(t)}" and expr == ew.contig_expr(T.OPS[pydnn.PYDNN_OP_TENSOR_ADD], t)
    assert expr.endswith(f", {ew.CONTIG_HINT}>") and expr in _units()[unit]


def test_threshold_edge_and_switch(launches):
    """3 operands of n elements: plain at exactly PLAIN_BYTES, streaming one vector above; 0 turns it off."""
    limit = tuning.tensor_ops.PLAIN_BYTES
    n = limit // (3 * 4)
    n -= n % 4
    assert _op_add((n,), F32, launches)[0] == "tensor_ops.plain.f32"
    assert _op_add((n + (limit - 3 * 4 * n) // 12 + 4,), F32, launches)[0] == "tensor_ops.f32"
    with tuning.override({"tensor_ops.PLAIN_BYTES": 0}):
        assert _op_add((64, 64), F32, launches)[0] == "tensor_ops.f32"


def test_untouched_problems(launches):
    """double (no plain unit), a broadcast input (map_rows), misaligned pointers (the scalar kernel)."""
    assert _op_add((100, 64), F64, launches)[0] == "tensor_ops.f64"
    assert _op_add((100, 64), BF16, launches, bdims=(1, 64)) == ("tensor_ops.rows.h16",
                                                                 T.rows_expr(T.OPS[pydnn.PYDNN_OP_TENSOR_ADD], "bf16"))
    unit, expr = _op_add((100, 64), BF16, launches, ptrs=(P1 + 2, P2, P3))
    assert unit == "tensor_ops.h16" and expr == ew.map_exprs(T.OPS[pydnn.PYDNN_OP_TENSOR_ADD], "bf16")[1]


@pytest.mark.parametrize("dtype", [F32, F16, BF16])
def test_add_and_scale_tensor_plain(dtype, launches):
    t = TAG[dtype]
    h = _rec_handle()
    c = _desc((300, 77), dtype)
    pydnn.add_tensor(h, 1.0, c, P1, 1.0, c, P2)
    pydnn.scale_tensor(h, c, P2, 0.5)
    assert launches == [(f"tensor_ops.plain.{ew.ktag(t)}", ew.contig_expr(T.SCALED, t, hint=0))] * 2
    big = _desc((tuning.tensor_ops.PLAIN_BYTES // SIZE[dtype],), dtype)  # two operands of PLAIN_BYTES
    pydnn.add_tensor(h, 1.0, big, P1, 1.0, big, P2)
    assert launches[-1] == (f"tensor_ops.{ew.ktag(t)}", ew.contig_expr(T.SCALED, t))


def test_plain_units_hold_every_op():
    units = _units()
    for t in T.PLAIN_TAGS:
        assert units[f"tensor_ops.plain.{ew.ktag(t)}"] == {ew.contig_expr(op, t, hint=0) for op in T.PLAIN_OPS}
    assert "tensor_ops.plain.f64" not in units
