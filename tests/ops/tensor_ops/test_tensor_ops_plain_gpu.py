"""Dense ScaleTensor / AddTensor / OpTensor on the plain-cache map_contig (units tensor_ops.plain.<t>, operands
within tuning.tensor_ops.PLAIN_BYTES) and on the streaming one (PLAIN_BYTES 0), against the float64
reference: odd sizes (a partial tile, a scalar tail), every op, blending, beta 0 with a poisoned C, and each
record's kernel asserted to come from the unit the switch names."""
import numpy as np
import pytest

import pydnn
from devtensor import DevTensor, assert_close
from pydnn import tuning
from pydnn.ops import _elementwise as ew
from pydnn.ops import tensor_ops as T
from pydnn.reference import tensor_ops as ref

pytestmark = pytest.mark.gpu

F32, F16, BF16 = pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DATA_HALF, pydnn.PYDNN_DATA_BFLOAT16
TAGS = {F32: "f32", F16: "f16", BF16: "bf16"}
OPS = [pydnn.PYDNN_OP_TENSOR_ADD, pydnn.PYDNN_OP_TENSOR_MUL, pydnn.PYDNN_OP_TENSOR_MIN, pydnn.PYDNN_OP_TENSOR_MAX]
SHAPES = [(82918, 64), (1001, 77), (3, 5, 7), (2049,)]


def _fits(*descs):
    """The operands' byte spans within PLAIN_BYTES (the plain unit's rule; (82918, 64) float is 40.5 MiB with
    two operands, 60.7 with three: the streaming unit -- the H200 run of 2026-11-28 failed the float cases
    that expected the plain one there)."""
    return sum(d.span_bytes() for d in descs) <= tuning.tensor_ops.PLAIN_BYTES


def _rec(handle, key):
    rec = handle.prepared.get(key)
    assert rec is not None
    return rec


@pytest.mark.parametrize("plain", [True, False], ids=["plain", "stream"])
@pytest.mark.parametrize("dtype", [F32, F16, BF16])
def test_op_tensor_dense(handle, rng, dtype, plain):
    t = TAGS[dtype]
    with tuning.override({"tensor_ops.PLAIN_BYTES": tuning.tensor_ops.PLAIN_BYTES if plain else 0}):
        for dims in SHAPES:
            for op in OPS:
                a, b, c = DevTensor(dims, dtype), DevTensor(dims, dtype), DevTensor(dims, dtype)
                av, bv = a.random(rng), b.random(rng)
                d = pydnn.create_op_tensor_descriptor()
                pydnn.set_op_tensor_descriptor(d, op, F32, pydnn.PYDNN_NOT_PROPAGATE_NAN)
                a1, a2 = float(rng.uniform(-2, 2)), float(rng.uniform(-2, 2))
                pydnn.op_tensor(handle, d, a1, a.desc, a.ptr, a2, b.desc, b.ptr, 0.0, c.desc, c.ptr)  # C poisoned
                rec = _rec(handle, ("op", (d, d.version), (a.desc, a.desc.version), (c.desc, c.desc.version),
                                    (b.desc, b.desc.version)))
                p = plain and _fits(a.desc, b.desc, c.desc)
                unit = f"tensor_ops.plain.{ew.ktag(t)}" if p else f"tensor_ops.{ew.ktag(t)}"
                assert rec.vec_func == handle.function(unit, ew.contig_expr(T.OPS[op], t, hint=0 if p else None))
                scale = np.abs(a1 * av) + np.abs(a2 * bv)
                assert_close(c.download(), ref.op_tensor(op, a1, av, a2, bv, 0.0, None), dtype, f"op {op} {dims}",
                             scale=scale)
                c.check_untouched()
                c0 = c.random(rng)
                beta = float(rng.uniform(-2, 2))
                pydnn.op_tensor(handle, d, a1, a.desc, a.ptr, a2, b.desc, b.ptr, beta, c.desc, c.ptr)
                assert_close(c.download(), ref.op_tensor(op, a1, av, a2, bv, beta, c0), dtype, f"op {op} blend {dims}",
                             scale=scale + np.abs(beta * c0))


@pytest.mark.parametrize("plain", [True, False], ids=["plain", "stream"])
@pytest.mark.parametrize("dtype", [F32, BF16])
def test_add_and_scale_dense(handle, rng, dtype, plain):
    t = TAGS[dtype]
    with tuning.override({"tensor_ops.PLAIN_BYTES": tuning.tensor_ops.PLAIN_BYTES if plain else 0}):
        for dims in SHAPES:
            a, c = DevTensor(dims, dtype), DevTensor(dims, dtype)
            av = a.random(rng)
            alpha = float(rng.uniform(-2, 2))
            pydnn.add_tensor(handle, alpha, a.desc, a.ptr, 0.0, c.desc, c.ptr)  # C poisoned
            rec = _rec(handle, ("add", (a.desc, a.desc.version), (c.desc, c.desc.version)))
            p = plain and _fits(a.desc, c.desc)
            unit = f"tensor_ops.plain.{ew.ktag(t)}" if p else f"tensor_ops.{ew.ktag(t)}"
            assert rec.vec_func == handle.function(unit, ew.contig_expr(T.SCALED, t, hint=0 if p else None))
            assert_close(c.download(), alpha * av, dtype, f"add beta 0 {dims}", scale=np.abs(alpha * av))
            c.check_untouched()
            c0 = c.random(rng)
            beta = float(rng.uniform(-2, 2))
            pydnn.add_tensor(handle, alpha, a.desc, a.ptr, beta, c.desc, c.ptr)
            assert_close(c.download(), ref.scaled(alpha, av, beta, c0), dtype, f"add {dims}",
                         scale=np.abs(alpha * av) + np.abs(beta * c0))
            y = DevTensor(dims, dtype)
            yv = y.random(rng)
            pydnn.scale_tensor(handle, y.desc, y.ptr, alpha)
            assert_close(y.download(), alpha * yv, dtype, f"scale {dims}", scale=np.abs(alpha * yv))
            y.check_untouched()
