"""Fused attention on the CPU: the descriptor, every validation error of the calls (status + the argument
it names), the workspace sizes, and the float64 reference (finite differences, GQA as repeated heads,
variable lengths as truncation, the two causal alignments, empty rows)."""
import numpy as np
import pytest

import pydnn
from pydnn.ops import attention as A
from pydnn.reference import attention as R
from test_fuzz_cpu import _call, cpu_handle

F32, F16, BF16 = pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DATA_HALF, pydnn.PYDNN_DATA_BFLOAT16
NONE, TL, BR = (pydnn.PYDNN_ATTN_MASK_NONE, pydnn.PYDNN_ATTN_MASK_CAUSAL_TOP_LEFT,
                pydnn.PYDNN_ATTN_MASK_CAUSAL_BOTTOM_RIGHT)
BAD, NS = pydnn.PYDNN_STATUS_BAD_PARAM, pydnn.PYDNN_STATUS_NOT_SUPPORTED
NULL, MIS = pydnn.PYDNN_STATUS_BAD_PARAM_NULL_POINTER, pydnn.PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER
NOINIT = pydnn.PYDNN_STATUS_NOT_INITIALIZED  # everything valid: the CPU-only handle refuses at kernel lookup
Q, K, V, O, LSE, DO, DQ, DK, DV, WS = (i << 36 for i in range(1, 11))


def _check(fn, args, status, needle):
    st = _call(fn, *args)
    msg = pydnn.get_last_error_string()
    assert st == status, (st, msg)
    assert needle in msg, msg


def _t(dims, dtype=BF16, layout="bhsd", strides=None):
    d = pydnn.create_tensor_descriptor()
    if strides is None:
        b, h, s, e = dims
        strides = (h * s * e, s * e, e, 1) if layout == "bhsd" else (s * h * e, e, h * e, 1)
    pydnn.set_tensor_nd_descriptor(d, dtype, 4, dims, strides)
    return d


def _attn(hq=4, hkv=2, d=64, scale=0.125, mask=NONE, p=0.0, seed=0):
    a = pydnn.create_attention_descriptor()
    pydnn.set_attention_descriptor(a, hq, hkv, d, scale, mask, p, seed)
    return a


# ----------------------------------------------------------------------------- descriptor

def test_descriptor_set_get_destroy():
    a = _attn(8, 2, 128, 0.5, BR, 0.0, 7)
    assert pydnn.get_attention_descriptor(a) == (8, 2, 128, 0.5, BR, 0.0, 7)
    pydnn.destroy_attention_descriptor(a)
    pydnn.destroy_attention_descriptor(None)
    _check(pydnn.get_attention_descriptor, (a,), BAD, "attnDesc: not a live attention descriptor")
    fresh = pydnn.create_attention_descriptor()
    _check(pydnn.get_attention_descriptor, (fresh,), BAD, "attnDesc: descriptor was never set")


@pytest.mark.parametrize("args,needle", [
    ((0, 1, 64, 1.0, NONE, 0.0, 0), "numHeadsQ: 0"),
    ((4, 0, 64, 1.0, NONE, 0.0, 0), "numHeadsKV: 0"),
    ((4, 1, -64, 1.0, NONE, 0.0, 0), "headDim: -64"),
    ((6, 4, 64, 1.0, NONE, 0.0, 0), "numHeadsQ: 6 is not a multiple of numHeadsKV (4)"),
    ((4, 2, 64, 0.0, NONE, 0.0, 0), "softmaxScale: 0.0 must be positive"),
    ((4, 2, 64, float("inf"), NONE, 0.0, 0), "softmaxScale: inf"),
    ((4, 2, 64, "x", NONE, 0.0, 0), "softmaxScale: expected a number"),
    ((4, 2, 64, 1.0, 3, 0.0, 0), "maskMode: 3 is not a pydnnAttentionMaskMode_t"),
    ((4, 2, 64, 1.0, NONE, 1.0, 0), "dropoutProbability: 1.0 is outside [0, 1)"),
    ((4, 2, 64, 1.0, NONE, -0.1, 0), "dropoutProbability"),
    ((4, 2, 64, 1.0, NONE, 0.0, -1), "seed: -1"),
    ((4.0, 2, 64, 1.0, NONE, 0.0, 0), "numHeadsQ: expected an integer"),
])
def test_descriptor_validation(args, needle):
    a = pydnn.create_attention_descriptor()
    _check(pydnn.set_attention_descriptor, (a,) + args, BAD, needle)
    assert not a.is_set  # nothing changed
    _check(pydnn.set_attention_descriptor, ("a",) + args, BAD, "attnDesc: not a live")


def test_workspace_sizes():
    h, a = cpu_handle(), _attn(4, 2, 64)
    q, k = _t((3, 4, 100, 64)), _t((3, 2, 80, 64))
    assert pydnn.get_attention_forward_workspace_size(h, a, q, k) == 0
    assert pydnn.get_attention_backward_workspace_size(h, a, q, k) == 3 * 4 * 100 * 4 * (1 + 64)
    _check(pydnn.get_attention_backward_workspace_size, (h, a, k, k), BAD, "qDesc: dims[1] = 2 heads")


# ----------------------------------------------------------------------------- forward validation

def _fwd_args(a=None, q=None, k=None, v=None, o=None, st="default", ptrs=None, lens=(None, None), ws=(None, 0)):
    a = a or _attn(4, 2, 64)
    q = q or _t((2, 4, 33, 64))
    k = k or _t((2, 2, 17, 64))
    v = v or _t((2, 2, 17, 64))
    o = o or _t((2, 4, 33, 64))
    if st == "default":
        st = _t((2, 4, 33, 1), F32)
    p = dict(q=Q, k=K, v=V, o=O, lse=LSE)
    p.update(ptrs or {})
    return (cpu_handle(), a, q, p["q"], k, p["k"], v, p["v"], o, p["o"], st, p["lse"], lens[0], lens[1], ws[0], ws[1])


def test_forward_valid_reaches_kernel_lookup():
    f = pydnn.attention_forward
    _check(f, _fwd_args(), NOINIT, "")
    _check(f, _fwd_args(st=None), NOINIT, "")  # no statistics (inference)
    bshd = dict(q=_t((2, 4, 33, 64), layout="bshd"), k=_t((2, 2, 17, 64), layout="bshd"),
                v=_t((2, 2, 17, 64), layout="bshd"), o=_t((2, 4, 33, 64), layout="bshd"))
    _check(f, _fwd_args(**bshd), NOINIT, "")
    _check(f, _fwd_args(a=_attn(4, 2, 128), q=_t((2, 4, 33, 128), F16), k=_t((2, 2, 17, 128), F16),
                        v=_t((2, 2, 17, 128), F16), o=_t((2, 4, 33, 128), F16)), NOINIT, "")
    _check(f, _fwd_args(a=_attn(4, 1, 64), k=_t((2, 1, 17, 64)), v=_t((2, 1, 17, 64))), NOINIT, "")  # MQA
    _check(f, _fwd_args(lens=(LSE + 4096, LSE + 8192)), NOINIT, "")
    _check(f, _fwd_args(a=_attn(4, 2, 64, p=0.1, seed=2**64 - 1)), NOINIT, "")  # dropout


@pytest.mark.parametrize("kw,status,needle", [
    (dict(a=_attn(4, 2, 80)), NS, "attnDesc: headDim 80 is not supported (fused attention has (64, 96, 128, 256))"),
    (dict(a=_attn(8, 2, 64)), BAD, "qDesc: dims[1] = 4 heads, the descriptor says 8"),
    (dict(a=_attn(4, 4, 64)), BAD, "kDesc: dims[1] = 2 heads, the descriptor says 4"),
    (dict(q=_t((2, 4, 33, 128))), BAD, "qDesc: dims[3] = 128, the descriptor's headDim is 64"),
    (dict(q=_t((2, 4, 33, 64), F32)), NS, "qDesc: data type 0 is not supported by fused attention"),
    (dict(k=_t((2, 2, 17, 64), F16)), BAD, "kDesc: data type 2 differs from qDesc's 9"),
    (dict(k=_t((3, 2, 17, 64))), BAD, "kDesc: batch 3 differs from qDesc's 2"),
    (dict(v=_t((2, 2, 18, 64))), BAD, "vDesc: dims (2, 2, 18, 64) differ from kDesc dims"),
    (dict(o=_t((2, 4, 32, 64))), BAD, "oDesc: dims (2, 4, 32, 64) differ from qDesc"),
    (dict(o=_t((2, 4, 33, 64), F16)), BAD, "oDesc: data type 2 differs"),
    (dict(q=_t((2, 4, 33, 64), strides=(4 * 33 * 128, 33 * 128, 128, 2))), NS,
     "qDesc: strides[3] = 2; the head dim must be contiguous"),
    (dict(k=_t((2, 2, 17, 64), strides=(2 * 17 * 68, 17 * 68, 68, 1))), NS,
     "kDesc: strides[2] = 68 is not a multiple of 8"),
    (dict(o=_t((2, 4, 33, 64), strides=(0x10000, 0x4000, 8, 1))), BAD, "oDesc: strides"),  # overlapping output
    (dict(st=_t((2, 4, 33, 2), F32)), BAD, "statsDesc: dims (2, 4, 33, 2) must be (2, 4, 33, 1)"),
    (dict(st=_t((2, 4, 33, 1), BF16)), BAD, "statsDesc: the statistics are float"),
    (dict(ptrs=dict(q=0)), NULL, "q: NULL"),
    (dict(ptrs=dict(o=None)), NULL, "o: NULL"),
    (dict(ptrs=dict(k=K + 8)), MIS, "k: 0x"),
    (dict(ptrs=dict(v=V + 2)), MIS, "v: 0x"),
    (dict(ptrs=dict(lse=LSE + 2)), MIS, "stats: 0x"),
    (dict(ptrs=dict(lse=0)), NULL, "stats: NULL"),
    (dict(lens=(LSE + 2, None)), MIS, "seqLensQ: 0x"),
    (dict(ws=(None, -1)), BAD, "workSpaceSizeInBytes: -1 is less than"),
])
def test_forward_validation(kw, status, needle):
    _check(pydnn.attention_forward, _fwd_args(**kw), status, "attention_forward: " + needle)


def test_forward_validation_bad_objects():
    args = list(_fwd_args())
    for i, name in ((0, "handle:"), (1, "attnDesc: not a live"), (2, "qDesc: not a live tensor"),
                    (4, "kDesc:"), (6, "vDesc:"), (8, "oDesc:"), (10, "statsDesc:")):
        bad = list(args)
        bad[i] = "junk"
        _check(pydnn.attention_forward, tuple(bad), BAD, name)
    bad = list(args)
    bad[1] = pydnn.create_attention_descriptor()
    _check(pydnn.attention_forward, tuple(bad), BAD, "attnDesc: descriptor was never set")
    bad = list(args)
    bad[2] = pydnn.create_tensor_descriptor()
    _check(pydnn.attention_forward, tuple(bad), BAD, "qDesc: descriptor was never set")
    bad = list(args)
    bad[2] = pydnn.create_tensor_descriptor()
    pydnn.set_tensor_nd_descriptor(bad[2], BF16, 3, (4, 33, 64), (33 * 64, 64, 1))
    _check(pydnn.attention_forward, tuple(bad), BAD, "qDesc: expected 4 dims")


# ----------------------------------------------------------------------------- backward validation

def _bwd_args(det=1, ws=None, **over):
    a = over.pop("a", None) or _attn(4, 2, 64)
    t = dict(q=_t((2, 4, 33, 64)), k=_t((2, 2, 17, 64)), v=_t((2, 2, 17, 64)), o=_t((2, 4, 33, 64)),
             do=_t((2, 4, 33, 64)), st=_t((2, 4, 33, 1), F32), dq=_t((2, 4, 33, 64)), dk=_t((2, 2, 17, 64)),
             dv=_t((2, 2, 17, 64)))
    p = dict(q=Q, k=K, v=V, o=O, do=DO, st=LSE, dq=DQ, dk=DK, dv=DV)
    for key, val in over.items():
        (p if key.endswith("_p") else t)[key.removesuffix("_p")] = val
    need = 2 * 4 * 33 * 4
    return (cpu_handle(), a, t["q"], p["q"], t["k"], p["k"], t["v"], p["v"], t["o"], p["o"], t["do"], p["do"],
            t["st"], p["st"], t["dq"], p["dq"], t["dk"], p["dk"], t["dv"], p["dv"], None, None, det, WS,
            need if ws is None else ws)


def test_backward_valid_reaches_kernel_lookup():
    _check(pydnn.attention_backward, _bwd_args(), NOINIT, "")
    _check(pydnn.attention_backward, _bwd_args(det=0, ws=2 * 4 * 33 * 4 * 65), NOINIT, "")
    _check(pydnn.attention_backward, _bwd_args(a=_attn(4, 2, 64, p=0.5, seed=3)), NOINIT, "")


@pytest.mark.parametrize("kw,status,needle", [
    (dict(st=None), BAD, "statsDesc: NULL; the backward needs"),
    (dict(do=_t((2, 4, 34, 64))), BAD, "dODesc: dims (2, 4, 34, 64) differ from qDesc"),
    (dict(dq=_t((2, 4, 33, 64), F16)), BAD, "dQDesc: data type 2 differs"),
    (dict(dk=_t((2, 4, 17, 64))), BAD, "dKDesc: dims[1] = 4 heads, the descriptor says 2"),
    (dict(dv=_t((2, 2, 16, 64))), BAD, "dVDesc: dims (2, 2, 16, 64) differ from vDesc"),
    (dict(dv=_t((2, 2, 17, 64), strides=(64, 64, 64, 1))), BAD, "dVDesc: strides"),
    (dict(det=2), BAD, "deterministic: 2 must be 0 or 1"),
    (dict(ws=100), BAD, "workSpaceSizeInBytes: 100 is less than the 1056 bytes"),
    (dict(det=0, ws=1056), BAD, "workSpaceSizeInBytes: 1056 is less than the 68640 bytes"),
    (dict(dq_p=DQ + 4), MIS, "dQ: 0x"),
    (dict(do_p=0), NULL, "dO: NULL"),
])
def test_backward_validation(kw, status, needle):
    _check(pydnn.attention_backward, _bwd_args(**kw), status, "attention_backward: " + needle)


def test_checked_lengths():
    A.check_lengths([3, 0, 7], "seqLensQ", 7)
    with pytest.raises(pydnn.PydnnError, match=r"seqLensKV\[1\]: length 9 is outside \[0, 7\]"):
        A.check_lengths([3, 9], "seqLensKV", 7)
    with pytest.raises(pydnn.PydnnError, match=r"seqLensQ\[0\]: length -1"):
        A.check_lengths([-1], "seqLensQ", 7)


def test_kernel_units_and_smem():
    units = A.kernel_units()
    assert [u.name for u in units] == ["attention.bf16", "attention.f16", "attention.d96.bf16", "attention.d96.f16",
                                       "attention.d256.bf16", "attention.d256.f16", "attention.dropx.bf16",
                                       "attention.dropx.f16", "attention.dec.bf16", "attention.dec.f16",
                                       "attention.dec.paged.bf16", "attention.dec.paged.f16",
                                       "attention.prep.bf16", "attention.prep.f16"]
    # (fwd, dq, dkdv x2) x dropout x head dims + pre, convert per head dim (96 / 256: their dropout kernels
    # in attention.dropx); decode: dec, combine per head dim; prep: the 16-byte pre, convert per head dim
    assert [len(u.exprs) for u in units] == [20, 20, 6, 6, 6, 6, 8, 8, 8, 8, 8, 8, 8, 8]  # (paged dec: two per head dim)
    assert A.prep_rows(64) == 128 and A.prep_rows(96) == A.prep_rows(128) == 64 and A.prep_rows(256) == 32
    assert "pydnn::attn::bwd_dkdv<pydnn::bf16_t, 128, true, false>" in units[0].exprs
    for k, extra in (("fwd", (64, 64)), ("fwd", (32, 32)), ("bwd_dq", None), ("bwd_dkdv", "false"),
                     ("bwd_dkdv", "true")):
        assert A.smem_bytes(k, 128, extra) <= 227 * 1024 // 2  # two CTAs per SM on the H100


# ----------------------------------------------------------------------------- the reference

def _rand(rng, *shape):
    return rng.standard_normal(shape)


@pytest.mark.parametrize("mask", [NONE, TL, BR])
def test_reference_gradients_match_finite_differences(rng, mask):
    q, k, v = _rand(rng, 2, 4, 5, 8), _rand(rng, 2, 2, 7, 8), _rand(rng, 2, 2, 7, 8)
    do = _rand(rng, 2, 4, 5, 8)
    lq, lkv = [5, 3], [7, 2]
    dq, dk, dv, _ = R.backward(q, k, v, do, 0.3, mask, lq, lkv)

    def loss(q_, k_, v_):
        return (R.forward(q_, k_, v_, 0.3, mask, lq, lkv)[0] * do).sum()

    eps = 1e-6
    for which, grad in ((0, dq), (1, dk), (2, dv)):
        base = [q, k, v]
        for _ in range(6):
            idx = tuple(rng.integers(0, n) for n in base[which].shape)
            plus = [x.copy() for x in base]
            minus = [x.copy() for x in base]
            plus[which][idx] += eps
            minus[which][idx] -= eps
            fd = (loss(*plus) - loss(*minus)) / (2 * eps)
            assert abs(fd - grad[idx]) < 1e-6, (which, idx, fd, grad[idx])


def test_reference_gqa_is_repeated_heads(rng):
    q, k, v = _rand(rng, 1, 6, 9, 8), _rand(rng, 1, 2, 11, 8), _rand(rng, 1, 2, 11, 8)
    do = _rand(rng, 1, 6, 9, 8)
    kr, vr = np.repeat(k, 3, axis=1), np.repeat(v, 3, axis=1)
    o, lse, _, _ = R.forward(q, k, v, 0.5, BR)
    o2, lse2, _, _ = R.forward(q, kr, vr, 0.5, BR)
    np.testing.assert_allclose(o, o2)
    np.testing.assert_allclose(lse, lse2)
    dq, dk, dv, _ = R.backward(q, k, v, do, 0.5, BR)
    dq2, dk2, dv2, _ = R.backward(q, kr, vr, do, 0.5, BR)
    np.testing.assert_allclose(dq, dq2)
    np.testing.assert_allclose(dk, dk2.reshape(1, 2, 3, 11, 8).sum(axis=2))
    np.testing.assert_allclose(dv, dv2.reshape(1, 2, 3, 11, 8).sum(axis=2))


def test_reference_lengths_are_truncation(rng):
    q, k, v = _rand(rng, 2, 2, 9, 8), _rand(rng, 2, 2, 11, 8), _rand(rng, 2, 2, 11, 8)
    for mask in (NONE, TL, BR):
        o, lse, _, _ = R.forward(q, k, v, 0.5, mask, [6, 9], [4, 11])
        o1, lse1, _, _ = R.forward(q[:1, :, :6], k[:1, :, :4], v[:1, :, :4], 0.5, mask)
        np.testing.assert_allclose(o[:1, :, :6], o1)
        np.testing.assert_allclose(lse[:1, :, :6], lse1)
        assert (o[0, :, 6:] == 0).all() and np.isneginf(lse[0, :, 6:]).all()


def test_reference_masks():
    vis = R.visible(4, 6, 4, 6, TL)
    assert vis.sum(axis=1).tolist() == [1, 2, 3, 4]
    vis = R.visible(4, 6, 4, 6, BR)
    assert vis.sum(axis=1).tolist() == [3, 4, 5, 6]
    vis = R.visible(6, 4, 6, 4, BR)  # more queries than keys: the first two rows see nothing
    assert vis.sum(axis=1).tolist() == [0, 0, 1, 2, 3, 4]
    q = np.ones((1, 1, 6, 8))
    kv = np.ones((1, 1, 4, 8))
    o, lse, _, _ = R.forward(q, kv, kv, 1.0, BR)
    assert (o[0, 0, :2] == 0).all() and np.isneginf(lse[0, 0, :2]).all()
    assert np.allclose(o[0, 0, 2:], 1.0)
    np.testing.assert_allclose(lse[0, 0, 2:], 8.0 + np.log([1, 2, 3, 4]))


def test_reference_matches_direct_formula(rng):
    q, k, v = _rand(rng, 1, 1, 5, 4), _rand(rng, 1, 1, 6, 4), _rand(rng, 1, 1, 6, 4)
    s = 0.7 * q[0, 0] @ k[0, 0].T
    p = np.exp(s) / np.exp(s).sum(axis=1, keepdims=True)
    o, lse, so, _ = R.forward(q, k, v, 0.7)
    np.testing.assert_allclose(o[0, 0], p @ v[0, 0])
    np.testing.assert_allclose(lse[0, 0], np.log(np.exp(s).sum(axis=1)))
    np.testing.assert_allclose(so[0, 0], p @ np.abs(v[0, 0]))


@pytest.mark.parametrize("mask", [NONE, BR])
def test_reference_dropout_gradients(rng, mask):
    """With dropout the mask is fixed by (seed, element index): gradients still match finite differences."""
    q, k, v = _rand(rng, 2, 4, 5, 8), _rand(rng, 2, 2, 7, 8), _rand(rng, 2, 2, 7, 8)
    do = _rand(rng, 2, 4, 5, 8)
    drop = (0.3, 1234)
    dq, dk, dv, _ = R.backward(q, k, v, do, 0.3, mask, None, [7, 4], dropout=drop)

    def loss(q_, k_, v_):
        return (R.forward(q_, k_, v_, 0.3, mask, None, [7, 4], dropout=drop)[0] * do).sum()

    eps = 1e-6
    for which, grad in ((0, dq), (1, dk), (2, dv)):
        base = [q, k, v]
        for _ in range(6):
            idx = tuple(rng.integers(0, n) for n in base[which].shape)
            plus = [x.copy() for x in base]
            minus = [x.copy() for x in base]
            plus[which][idx] += eps
            minus[which][idx] -= eps
            fd = (loss(*plus) - loss(*minus)) / (2 * eps)
            assert abs(fd - grad[idx]) < 1e-6, (which, idx, fd, grad[idx])


def test_reference_dropout_mask():
    from pydnn.reference import dropout as rdrop
    z = R.keep((2, 3, 40, 50), (0.25, 7))
    kept = z > 0
    assert abs(kept.mean() - 0.75) < 0.02
    np.testing.assert_allclose(z[kept], 1 / 0.75)
    # element (b, h, i, j) is number ((b * Hq + h) * Sq + i) * Skv + j of the stream
    flat = rdrop.keep_mask(7, 0, 2 * 3 * 40 * 50, 0.25)
    assert kept[1, 2, 39, 49] == flat[((1 * 3 + 2) * 40 + 39) * 50 + 49]
    assert (R.keep((1, 1, 3, 3), (0.0, 7)) == 1).all()
    assert A.drop_threshold(0.25) == rdrop.threshold(0.25) == 16384
