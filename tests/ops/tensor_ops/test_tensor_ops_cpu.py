"""Tensor ops on the CPU: the op-tensor descriptor, every validation error (status and the argument the
message names), the kernel each problem is given (tiled transpose, vector or strided map; every choice
exists in the manifest), SetTensor's value conversion, the references, and NVRTC compilation of the
units for sm_90."""
import ctypes

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pydnn
from pydnn._build import build, cache, manifest
from pydnn._build.params import FLAG_IN_BF16, FLAG_OUT_BF16, MapParams
from pydnn.ops import _elementwise as ew
from pydnn.ops import tensor_ops as T
from pydnn.reference import tensor_ops as ref
from pydnn.tensor import packed_strides
from test_fuzz_cpu import _call, _desc, cpu_handle, junk

F32, F64, F16, BF16 = (pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DATA_DOUBLE, pydnn.PYDNN_DATA_HALF,
                       pydnn.PYDNN_DATA_BFLOAT16)
I8, U8, I32, I64 = pydnn.PYDNN_DATA_INT8, pydnn.PYDNN_DATA_UINT8, pydnn.PYDNN_DATA_INT32, pydnn.PYDNN_DATA_INT64
ALL = [F32, F64, F16, BF16, I8, U8, I32, I64]
BAD, NULL, NOSUP, PASSED = (pydnn.PYDNN_STATUS_BAD_PARAM, pydnn.PYDNN_STATUS_BAD_PARAM_NULL_POINTER,
                            pydnn.PYDNN_STATUS_NOT_SUPPORTED, pydnn.PYDNN_STATUS_NOT_INITIALIZED)
P1, P2, P3 = 1 << 40, 1 << 41, 1 << 42  # device addresses (never dereferenced on the CPU handle)


def _expect(status, needle, fn, *args):
    got = _call(fn, *args)
    msg = pydnn.get_last_error_string()
    assert got == status, (got, msg)
    if needle:
        assert needle in msg, msg


def _op(op=pydnn.PYDNN_OP_TENSOR_ADD, comp=F32, nan=pydnn.PYDNN_NOT_PROPAGATE_NAN):
    d = pydnn.create_op_tensor_descriptor()
    pydnn.set_op_tensor_descriptor(d, op, comp, nan)
    return d


# ------------------------------------------------------------------------------ op-tensor descriptor
def test_op_tensor_descriptor_round_trip_and_errors():
    d = pydnn.create_op_tensor_descriptor()
    for op in range(6):
        for comp in (F32, F64):
            for nan in (pydnn.PYDNN_NOT_PROPAGATE_NAN, pydnn.PYDNN_PROPAGATE_NAN):
                pydnn.set_op_tensor_descriptor(d, op, comp, nan)
                assert pydnn.get_op_tensor_descriptor(d) == (op, comp, nan)
    for bad in (42, -1, 6, 1.0, None, True, "0"):
        _expect(BAD, "opTensorOp", pydnn.set_op_tensor_descriptor, d, bad, F32, 0)
    assert pydnn.get_op_tensor_descriptor(d) == (5, F64, 1)  # a refused set changes nothing
    for bad in (I8, F16, BF16, 99, None):
        _expect(BAD, "opTensorCompType", pydnn.set_op_tensor_descriptor, d, 0, bad, 0)
    for bad in (2, -1, None):
        _expect(BAD, "opTensorNanOpt", pydnn.set_op_tensor_descriptor, d, 0, F32, bad)
    pydnn.destroy_op_tensor_descriptor(d)
    _expect(BAD, "opTensorDesc", pydnn.get_op_tensor_descriptor, d)
    _expect(BAD, "opTensorDesc", pydnn.set_op_tensor_descriptor, d, 0, F32, 0)
    _expect(BAD, "opTensorDesc", pydnn.destroy_op_tensor_descriptor, d)
    _expect(BAD, "opTensorDesc", pydnn.get_op_tensor_descriptor, _desc((2, 3)))
    pydnn.destroy_op_tensor_descriptor(None)  # NULL: nothing to do


# ------------------------------------------------------------------------------ OpTensor validation
def _op_call(op_desc=None, a=(2, 3, 4, 5), b=(2, 3, 4, 5), c=(2, 3, 4, 5), at=F32, bt=F32, ct=F32, ptrs=(P1, P2, P3),
             handle=None):
    op_desc = _op() if op_desc is None else op_desc
    ad = _desc(a, at) if isinstance(a, tuple) else a
    bd = _desc(b, bt) if isinstance(b, tuple) else b
    cd = _desc(c, ct) if isinstance(c, tuple) else c
    return (pydnn.op_tensor, handle or cpu_handle(), op_desc, 1.0, ad, ptrs[0], 1.0, bd, ptrs[1], 0.0, cd, ptrs[2])


def test_op_tensor_passes_validation_with_broadcasts():
    for a, b in [((2, 3, 4, 5), (1, 3, 1, 1)), ((1, 3, 1, 5), (2, 3, 4, 5)), ((1, 1, 1, 1), (2, 1, 4, 1))]:
        _expect(PASSED, None, *_op_call(a=a, b=b))
    _expect(PASSED, None, *_op_call(_op(comp=F64), at=F64, bt=F64, ct=F64))
    for t in (F16, BF16):
        _expect(PASSED, None, *_op_call(at=t, bt=t, ct=t))


@pytest.mark.parametrize("a, b, c, needle", [
    ((2, 3, 4, 5), (2, 3, 4, 2), (2, 3, 4, 5), "bDesc: dim 3 is 2"),
    ((2, 3, 4, 3), (2, 3, 4, 5), (2, 3, 4, 5), "aDesc: dim 3 is 3"),
    ((2, 3, 4, 5), (2, 3, 4), (2, 3, 4, 5), "bDesc: has 3 dims"),
    ((2, 3, 4, 5, 1), (2, 3, 4, 5), (2, 3, 4, 5), "aDesc: has 5 dims"),
    ((2, 3, 4, 5), (2, 3, 4, 5), (2, 3, 4, 1), "aDesc: dim 3 is 5"),
])
def test_op_tensor_shape_errors(a, b, c, needle):
    _expect(BAD, needle, *_op_call(a=a, b=b, c=c))


def test_op_tensor_type_errors():
    _expect(NOSUP, "bDesc: data type", *_op_call(bt=F16))
    _expect(NOSUP, "aDesc: data type", *_op_call(at=BF16))
    _expect(NOSUP, "aDesc: data type", *_op_call(at=F16, bt=F16))          # half A, B into float C
    _expect(NOSUP, "cDesc: data type", *_op_call(at=I8, bt=I8, ct=I8))
    _expect(NOSUP, "cDesc: data type", *_op_call(ct=I32))
    _expect(NOSUP, "opTensorDesc: compute type", *_op_call(_op(comp=F64)))  # float data, DOUBLE compute
    _expect(NOSUP, "opTensorDesc: compute type", *_op_call(_op(comp=F32), at=F64, bt=F64, ct=F64))


def test_op_tensor_descriptor_and_pointer_errors():
    never_set = pydnn.create_op_tensor_descriptor()
    _expect(BAD, "opTensorDesc: descriptor was never set", *_op_call(never_set))
    dead = _op()
    pydnn.destroy_op_tensor_descriptor(dead)
    _expect(BAD, "opTensorDesc", *_op_call(dead))
    _expect(BAD, "opTensorDesc", *_op_call(_desc((2, 3))))
    _expect(BAD, "aDesc", *_op_call(a=None))
    _expect(BAD, "bDesc", *_op_call(b=pydnn.create_tensor_descriptor()))
    _expect(BAD, "cDesc", *_op_call(c=_op()))
    _expect(NULL, "A: NULL", *_op_call(ptrs=(0, P2, P3)))
    _expect(NULL, "B: NULL", *_op_call(ptrs=(P1, 0, P3)))
    _expect(NULL, "C: NULL", *_op_call(ptrs=(P1, P2, 0)))
    _expect(NULL, "B: NULL", *_op_call(ptrs=(P1, None, P3)))
    _expect(BAD, "cDesc: strides", *_op_call(c=_desc((2, 3, 4, 5), F32, (60, 20, 5, 2))))
    _expect(BAD, "handle", *_op_call(handle=object()))
    for name, pos in (("alpha1", 3), ("alpha2", 6), ("beta", 9)):
        args = list(_op_call())
        args[pos] = "x"
        _expect(BAD, name, *args)


def test_unary_ops_ignore_b():
    for op in (pydnn.PYDNN_OP_TENSOR_SQRT, pydnn.PYDNN_OP_TENSOR_NOT):
        _expect(PASSED, None, *_op_call(_op(op), b=None, ptrs=(P1, None, P3)))
        _expect(PASSED, None, *_op_call(_op(op), b=(7, 7), bt=I8, ptrs=(P1, 0, P3)))
        _expect(PASSED, None, *_op_call(_op(op), a=(1, 3, 1, 1)))
        _expect(NULL, "A: NULL", *_op_call(_op(op), b=None, ptrs=(0, None, P3)))


# ------------------------------------------------------------------------------ Add / Scale / Set
def test_add_tensor_errors():
    h = cpu_handle()
    c = _desc((2, 3, 4, 5))
    _expect(PASSED, None, pydnn.add_tensor, h, 1.0, _desc((1, 3, 1, 1)), P1, 1.0, c, P2)
    _expect(PASSED, None, pydnn.add_tensor, h, 1.0, _desc((1, 1, 1, 1)), P1, 1.0, c, P2)
    _expect(BAD, "aDesc: dim 1 is 2", pydnn.add_tensor, h, 1.0, _desc((1, 2, 1, 1)), P1, 0.0, c, P2)
    _expect(BAD, "aDesc: has 2 dims", pydnn.add_tensor, h, 1.0, _desc((3, 1)), P1, 0.0, c, P2)
    _expect(BAD, "aDesc: data type", pydnn.add_tensor, h, 1.0, _desc((1, 3, 1, 1), F16), P1, 0.0, c, P2)
    _expect(NOSUP, "aDesc", pydnn.add_tensor, h, 1.0, _desc((2, 3), I8), P1, 0.0, _desc((2, 3), I8), P2)
    _expect(NOSUP, "cDesc", pydnn.add_tensor, h, 1.0, _desc((2, 3)), P1, 0.0, _desc((2, 3), I32), P2)
    _expect(NULL, "A: NULL", pydnn.add_tensor, h, 1.0, c, 0, 0.0, c, P2)
    _expect(NULL, "C: NULL", pydnn.add_tensor, h, 1.0, c, P1, 0.0, c, 0)
    _expect(BAD, "cDesc: strides", pydnn.add_tensor, h, 1.0, _desc((2, 3)), P1, 0.0, _desc((2, 3), F32, (1, 1)), P2)
    _expect(BAD, "aDesc: not a live", pydnn.add_tensor, h, 1.0, None, P1, 0.0, c, P2)
    _expect(BAD, "beta", pydnn.add_tensor, h, 1.0, c, P1, "one", c, P2)


def test_scale_and_set_errors():
    h = cpu_handle()
    d = _desc((2, 3))
    _expect(PASSED, None, pydnn.scale_tensor, h, d, P1, 2.0)
    _expect(NOSUP, "yDesc: data type", pydnn.scale_tensor, h, _desc((2, 3), I8), P1, 2.0)
    _expect(NULL, "y: NULL", pydnn.scale_tensor, h, d, 0, 2.0)
    _expect(BAD, "alpha", pydnn.scale_tensor, h, d, P1, None)
    _expect(BAD, "yDesc: strides", pydnn.scale_tensor, h, _desc((2, 3), F32, (1, 1)), P1, 2.0)
    for t in ALL:
        _expect(PASSED, None, pydnn.set_tensor, h, _desc((2, 3), t), P1, 3)
    _expect(NULL, "y: NULL", pydnn.set_tensor, h, d, 0, 3)
    _expect(BAD, "valuePtr", pydnn.set_tensor, h, d, P1, "3")
    _expect(BAD, "valuePtr", pydnn.set_tensor, h, _desc((2, 3), I64), P1, None)
    _expect(BAD, "yDesc", pydnn.set_tensor, h, None, P1, 3)
    _expect(BAD, "yDesc: strides", pydnn.set_tensor, h, _desc((2, 3), F32, (1, 1)), P1, 3)


@pytest.mark.parametrize("tag, value, want", [
    ("i8", 2.5, 2), ("i8", 3.5, 4), ("i8", -2.5, -2), ("i8", 1000, 127), ("i8", -1e30, -128),
    ("i8", float("nan"), 0), ("u8", -1, 0), ("u8", 255.5, 255), ("u8", float("inf"), 255),
    ("i32", 2**40, 2**31 - 1), ("i32", -2.5, -2), ("i64", 2**62 + 1, 2**62 + 1), ("i64", -2**70, -2**63),
    ("i64", np.int64(-7), -7), ("i64", 1e19, 2**63 - 1), ("i64", float("-inf"), -2**63),
    ("f16", 1 + 2**-11, 1.0), ("f16", 1e6, float("inf")), ("bf16", 1 + 3 * 2**-8, 1 + 2**-6),
    ("bf16", -0.0, -0.0), ("f32", 0.1, float(np.float32(0.1))), ("f64", 0.1, 0.1), ("f32", True, None),
    ("f64", -10**400, float("-inf")), ("f16", 10**400, float("inf")), ("i32", 10**400, 2**31 - 1),
])
def test_set_tensor_value_conversion(tag, value, want):
    if want is None:
        with pytest.raises(pydnn.PydnnError):
            T._fill_value(tag, value)
        return
    got = T._fill_value(tag, value)
    assert got == want and type(got) is (int if tag[0] in "iu" else float)
    if tag == "bf16" and value == 0:
        assert np.signbit(got)


def test_int64_value_lands_in_coef_bits():
    p = MapParams()
    v = -(2**62) - 12345
    ctypes.c_int64.from_address(ctypes.addressof(p) + T._COEF_OFFSET).value = v
    assert np.array([p.coef], np.float64).view(np.int64)[0] == v


# ------------------------------------------------------------------------------ TransformTensor
def test_transform_errors():
    h = cpu_handle()
    d = _desc((2, 3, 4, 5))
    for ti in ALL:
        for to in ALL:
            _expect(PASSED, None, pydnn.transform_tensor, h, 1.0, _desc((2, 3, 4, 5), ti), P1, 0.0,
                    _desc((2, 3, 4, 5), to, packed_strides((2, 3, 4, 5), pydnn.PYDNN_TENSOR_NHWC)), P2)
    _expect(BAD, "yDesc: dims", pydnn.transform_tensor, h, 1.0, d, P1, 0.0, _desc((2, 3, 5, 4)), P2)
    _expect(BAD, "yDesc: dims", pydnn.transform_tensor, h, 1.0, d, P1, 0.0, _desc((2, 3, 20)), P2)
    _expect(BAD, "yDesc: strides", pydnn.transform_tensor, h, 1.0, d, P1, 0.0,
            _desc((2, 3, 4, 5), F32, (60, 20, 5, 2)), P2)
    _expect(NULL, "x: NULL", pydnn.transform_tensor, h, 1.0, d, 0, 0.0, d, P2)
    _expect(NULL, "y: NULL", pydnn.transform_tensor, h, 1.0, d, P1, 0.0, d, 0)
    _expect(BAD, "xDesc", pydnn.transform_tensor, h, 1.0, pydnn.create_tensor_descriptor(), P1, 0.0, d, P2)
    _expect(BAD, "alpha", pydnn.transform_tensor, h, [1.0], d, P1, 0.0, d, P2)
    # an input may alias itself (stride 0 is refused by the descriptor, but overlapping strides are not)
    _expect(PASSED, None, pydnn.transform_tensor, h, 1.0, _desc((2, 3), F32, (1, 1)), P1, 0.0, _desc((2, 3)), P2)


class _Recorder(dict):
    """Kernel table of a CPU handle that hands back (unit, expr) for every lookup."""

    def get(self, key, default=None):
        return key


def _rec_handle():
    h = cpu_handle()
    h._funcs = _Recorder()
    return h


def _units():
    return {u.name: set(u.exprs) for u in T.kernel_units()}


def _plan_transform(dims, xs, ys, ti=F32, to=F32, copy=True):
    x, y = _desc(dims, ti, xs), _desc(dims, to, ys)
    op = T.COPY if copy else T.SCALED
    return T._prepare_transform(_rec_handle(), op, T.TAG[ti], T.TAG[to], x, y)


NHWC = pydnn.PYDNN_TENSOR_NHWC


def test_transform_kernel_choice():
    units = _units()

    def check(rec):
        for unit, expr in (rec.vec_func, rec.scalar_func):
            assert expr in units[unit], (unit, expr)
        return rec

    d = (2, 64, 16, 16)
    # NCHW -> NHWC: the vector transpose, x = tiles along HW (input dense), y = along C, z = N
    r = check(_plan_transform(d, None, packed_strides(d, NHWC)))
    assert "transpose<float, float, pydnn::tensor::Copy, true>" in r.vec_func[1]
    assert "false>" in r.scalar_func[1]
    assert r.vec_grid == (4, 1, 2) and r.block == (32, 8, 1) and r.in_masks == r.out_mask == 15
    p = r.params
    assert p.ndim == 3 and list(p.size)[:3] == [2, 256, 64]
    assert list(p.stride[0])[:3] == [16384, 64, 1] and list(p.stride[1])[:3] == [16384, 1, 256]
    # NHWC -> NCHW, bf16 -> half with alpha (Scaled): the one 16-bit instantiation (pydnn::h16_t), the formats
    # in the flags (bfloat16 in, half out)
    r = check(_plan_transform(d, packed_strides(d, NHWC), None, BF16, F16, copy=False))
    assert "transpose<pydnn::h16_t, pydnn::h16_t, pydnn::tensor::Scaled, true>" in r.vec_func[1]
    assert r.vec_func[0] == "tensor_ops.transform.h16"
    assert r.vec_grid == (1, 4, 2) and r.base_flags == FLAG_IN_BF16
    r = check(_plan_transform(d, packed_strides(d, NHWC), None, F16, BF16, copy=False))
    assert r.vec_func[1].endswith("transpose<pydnn::h16_t, pydnn::h16_t, pydnn::tensor::Scaled, true>")
    assert r.base_flags == FLAG_OUT_BF16
    # odd extents: the scalar transpose only (no alignment to check)
    d2 = (2, 37, 5, 7)
    r = check(_plan_transform(d2, None, packed_strides(d2, NHWC)))
    assert r.vec_func == r.scalar_func and "false>" in r.vec_func[1] and r.in_masks == r.out_mask == 0
    # int8: 35 is not a multiple of 16 elements on the input side
    d3 = (1, 128, 5, 7)
    r = check(_plan_transform(d3, None, packed_strides(d3, NHWC), I8, I8))
    assert "false>" in r.vec_func[1]
    r = check(_plan_transform((1, 128, 4, 8), None, packed_strides((1, 128, 4, 8), NHWC), I8, F32, copy=False))
    assert "true>" in r.vec_func[1]
    # too few channels to tile: the strided map
    d4 = (2, 3, 16, 16)
    r = check(_plan_transform(d4, None, packed_strides(d4, NHWC)))
    assert "map_strided<float, float, pydnn::tensor::Copy>" in r.vec_func[1]
    # same layout: the vector map; conversions use the Scaled map of the pair
    r = check(_plan_transform(d, None, None, F32, BF16, copy=False))
    assert "map_contig<float, pydnn::h16_t, pydnn::tensor::Scaled, 4," in r.vec_func[1]
    assert r.base_flags == FLAG_OUT_BF16
    r = check(_plan_transform(d, None, None, F32, F16, copy=False))
    assert r.vec_func[1].startswith("pydnn::map_contig<float, pydnn::h16_t, ") and r.base_flags == 0
    r = check(_plan_transform(d, None, None, BF16, BF16))
    assert "map_contig<pydnn::h16_t, pydnn::h16_t, pydnn::tensor::Copy, 8," in r.vec_func[1]
    assert r.base_flags == FLAG_IN_BF16 | FLAG_OUT_BF16
    r = check(_plan_transform(d, None, None, I64, I64))
    assert "map_contig<pydnn::i64, pydnn::i64, pydnn::tensor::Copy, 2," in r.vec_func[1]
    # two batch dims, and more batches than grid.z
    A, B, M, K = 3, 5, 24, 40
    r = check(_plan_transform((A, B, M, K), None, (K * M, A * K * M, 1, M)))
    assert r.params.ndim == 4 and list(r.params.size)[:4] == [B, A, K, M] and r.vec_grid == (1, 1, 15)
    r = check(_plan_transform((70001, 16, 16, 1), None, (256, 1, 16, 1), U8, U8))
    assert r.vec_grid == (1, 1, 65535)


def test_transform_copy_only_for_unit_alpha_same_type():
    """The bit copy is chosen for alpha 1, beta 0 between one type; anything else scales."""
    h = cpu_handle()  # stops at the kernel lookup, after the choice
    d = (2, 64, 16, 16)
    x, y = _desc(d, I64), _desc(d, I64, packed_strides(d, NHWC))
    seen = []
    orig = T._prepare_transform

    def spy(handle, op, ti, to, xd, yd):
        seen.append(op)
        return orig(handle, op, ti, to, xd, yd)

    T._prepare_transform = spy
    try:
        for alpha, beta in ((1.0, 0.0), (2.0, 0.0), (1.0, 1.0)):
            _call(pydnn.transform_tensor, h, alpha, x, P1, beta, y, P2)
        _call(pydnn.transform_tensor, h, 1.0, x, P1, 0.0, _desc(d, I32), P2)
    finally:
        T._prepare_transform = orig
    assert seen == [T.COPY, T.SCALED, T.SCALED, T.SCALED]


def test_set_add_op_kernel_choice():
    units = _units()
    h = _rec_handle()
    c = _desc((2, 3, 5, 7), BF16)
    r = ew.prepare_map(h, "tensor_ops.h16", T.SET, "bf16", "bf16", c, ())
    assert r.vec_func[1] in units["tensor_ops.h16"] and "map_contig" in r.vec_func[1]
    assert r.base_flags == FLAG_IN_BF16 | FLAG_OUT_BF16
    r = ew.prepare_map(h, "tensor_ops.h16", T.SCALED, "bf16", "bf16", c, (_desc((1, 3, 1, 1), BF16),))
    assert r.vec_func[1] in units["tensor_ops.h16"] and "map_strided" in r.vec_func[1]
    r = ew.prepare_map(h, "tensor_ops.h16", T.SCALED, "f16", "f16", _desc((2, 3, 5, 7), F16), ())
    assert r.base_flags == 0
    for op in T.OPS.values():
        for t in ("f32", "f64", "f16", "bf16"):
            for variant in ew.map_exprs(op, t):
                assert variant in units[f"tensor_ops.{ew.ktag(t)}"]
    # half and bfloat16 share the h16 units (no typed 16-bit unit is built)
    assert not any(n.endswith((".f16", ".bf16")) for n in units if n.startswith("tensor_ops"))


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(ALL), st.sampled_from(ALL), junk, junk, junk, st.sampled_from([0, P1, None]))
def test_fuzz_scalars_and_pointers(ti, to, v1, v2, v3, ptr):
    """Junk values, scalars and pointers: a known status, never an internal error (_call checks)."""
    h = cpu_handle()
    x, y = _desc((2, 3), ti), _desc((2, 3), to)
    _call(pydnn.set_tensor, h, y, P1, v1)
    _call(pydnn.transform_tensor, h, v1, x, ptr, v2, y, P2)
    _call(pydnn.scale_tensor, h, y, ptr, v3)
    _call(pydnn.add_tensor, h, v1, x, P1, v2, y, ptr)
    _call(pydnn.op_tensor, h, _op(), v1, x, P1, v2, y, ptr, v3, y, P3)
    _call(pydnn.op_tensor, h, v1, 1.0, x, P1, 1.0, y, P2, 0.0, y, P3)
    _call(pydnn.set_op_tensor_descriptor, _op(), v1, v2, v3)


# ------------------------------------------------------------------------------ references
def test_reference_conversions():
    x = np.array([-1000, -128.5, -2.5, -0.5, 0.5, 1.5, 127.4, 1e9, np.nan, np.inf, -np.inf, 254.5])
    assert ref.convert(x, I8).tolist() == [-128, -128, -2, 0, 0, 2, 127, 127, 0, 127, -128, 127]
    assert ref.convert(x, U8).tolist() == [0, 0, 0, 0, 0, 2, 127, 255, 0, 255, 0, 254]
    assert ref.convert([2**40, -2**40, 1.5], I32).tolist() == [2**31 - 1, -2**31, 2]
    assert ref.convert([70000.0, 1 + 2**-11], F16).tolist() == [np.inf, 1.0]
    assert ref.convert([1 + 2**-8], BF16).tolist() == [1.0]
    assert ref.transform(2.0, [63.75], 0.0, None, I8).tolist() == [127]
    assert ref.transform(0.5, [3.0], 1.0, [1.0], U8).tolist() == [2]  # 2.5 -> 2


def test_reference_op_tensor():
    a, b = np.array([1.0, np.nan, 4.0, np.nan]), np.array([2.0, 3.0, np.nan, np.nan])
    mx = pydnn.PYDNN_OP_TENSOR_MAX
    assert ref.op_tensor(mx, 1, a, 1, b, 0, None)[:3].tolist() == [2.0, 3.0, 4.0]
    assert np.isnan(ref.op_tensor(mx, 1, a, 1, b, 0, None)[3])
    assert np.isnan(ref.op_tensor(mx, 1, a, 1, b, 0, None, propagate_nan=True)[1:]).all()
    assert ref.op_tensor(pydnn.PYDNN_OP_TENSOR_NOT, 2.0, [0.25], 1, None, 0, None).tolist() == [0.5]
    assert ref.op_tensor(pydnn.PYDNN_OP_TENSOR_SQRT, 4.0, [4.0], 1, None, 1.0, [1.0]).tolist() == [5.0]
    bias = ref.op_tensor(pydnn.PYDNN_OP_TENSOR_ADD, 1, np.ones((2, 3, 1, 1)), 1, np.arange(3.0).reshape(1, 3, 1, 1),
                         0, None)
    assert bias.shape == (2, 3, 1, 1) and bias[1, 2, 0, 0] == 3.0


# ------------------------------------------------------------------------------ NVRTC
def test_units_compile_for_sm_90():
    units = T.kernel_units()
    names = [u.name for u in units]
    assert len(names) == len(set(names)) and all(n.startswith("tensor_ops.") for n in names)
    # the family's units in sm_90's install / first-use split (the cache entries the loader reads)
    build.build_all(archs=["sm_90"], progress=False, prefixes=("tensor_ops.",), everything=True)
    units = [u for u in manifest.all_units("sm_90") if u.name.startswith("tensor_ops.")]
    nv = build.nvrtc.version()
    for u in units:
        entry = cache.read_entry(cache.entry_path(u, "sm_90", cache.unit_key(u, "sm_90", nv)))
        assert entry is not None, u.name
        cubin, lowered = entry
        assert cubin[:4] == b"\x7fELF" and set(lowered) == set(u.exprs)
