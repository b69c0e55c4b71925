"""ReduceTensor on the GPU against the float64 reference: every op, type pair, subset of reduced dims,
layouts, alpha/beta, indices (ties, NaN), a long full reduction, and bitwise determinism."""
import itertools

import numpy as np
import pytest

import pydnn
from devtensor import DevTensor, assert_close
from pydnn.reference import reduce as ref
from pydnn.tensor import packed_strides

pytestmark = pytest.mark.gpu

OPS = list(pydnn.ENUMS["pydnnReduceTensorOp_t"].values())
PAIRS = [(pydnn.PYDNN_DATA_FLOAT,) * 2, (pydnn.PYDNN_DATA_DOUBLE,) * 2, (pydnn.PYDNN_DATA_HALF,) * 2,
         (pydnn.PYDNN_DATA_BFLOAT16,) * 2, (pydnn.PYDNN_DATA_HALF, pydnn.PYDNN_DATA_FLOAT),
         (pydnn.PYDNN_DATA_BFLOAT16, pydnn.PYDNN_DATA_FLOAT)]
INDEXED = (pydnn.PYDNN_REDUCE_TENSOR_MIN, pydnn.PYDNN_REDUCE_TENSOR_MAX, pydnn.PYDNN_REDUCE_TENSOR_AMAX)


def _rdesc(op, indices=False, nan=0):
    r = pydnn.create_reduce_tensor_descriptor()
    pydnn.set_reduce_tensor_descriptor(r, op, pydnn.PYDNN_DATA_FLOAT, nan,
                                       pydnn.PYDNN_REDUCE_TENSOR_FLATTENED_INDICES if indices else 0,
                                       pydnn.PYDNN_32BIT_INDICES)
    return r


def _run(handle, r, a, c, alpha=1.0, beta=0.0):
    ws = pydnn.get_reduction_workspace_size(handle, r, a.desc, c.desc)
    isz = pydnn.get_reduction_indices_size(handle, r, a.desc, c.desc)
    wbuf = pydnn.DeviceArray((max(ws, 1),), np.uint8)
    ibuf = pydnn.DeviceArray((max(isz // 4, 1),), np.int32)
    ibuf.fill_bytes(0xFF)
    pydnn.reduce_tensor(handle, r, ibuf.ptr, isz, wbuf.ptr, ws, alpha, a.desc, a.ptr, beta, c.desc, c.ptr)
    return ibuf.to_numpy()[: isz // 4] if isz else None


def _values(rng, a, op):
    if op in (pydnn.PYDNN_REDUCE_TENSOR_MUL, pydnn.PYDNN_REDUCE_TENSOR_MUL_NO_ZEROS):
        v = rng.uniform(0.7, 1.4, a.dims)
        if op == pydnn.PYDNN_REDUCE_TENSOR_MUL_NO_ZEROS:
            v[rng.random(a.dims) < 0.3] = 0
        return a.upload(v)
    if op in INDEXED:  # few distinct values: ties happen
        return a.upload(rng.integers(-4, 5, a.dims).astype(np.float64) / 2)
    return a.random(rng)


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{p[0]}-{p[1]}")
@pytest.mark.parametrize("op", OPS)
def test_every_subset_of_dims(handle, rng, op, pair):
    ta, tc = pair
    dims = (2, 3, 5, 7)
    for layout in ("nchw", "nhwc", "gaps"):
        strides = {"nchw": None, "nhwc": packed_strides(dims, pydnn.PYDNN_TENSOR_NHWC),
                   "gaps": (400, 120, 21, 2)}[layout]
        a = DevTensor(dims, ta, strides)
        av = _values(rng, a, op)
        for mask in itertools.product((0, 1), repeat=4):
            cdims = tuple(1 if m else d for m, d in zip(mask, dims))
            c = DevTensor(cdims, tc)
            want, widx, scale = ref.reduce(op, 1.0, av, 0.0, None, cdims)
            idx = _run(handle, _rdesc(op, indices=op in INDEXED), a, c)
            assert_close(c.download(), want, tc, f"op {op} {layout} {cdims}", scale=scale)
            if op in INDEXED and ref.reduced_axes(dims, cdims):
                assert (idx.reshape(cdims) == widx).all(), f"indices op {op} {layout} {cdims}"


@pytest.mark.parametrize("op", OPS)
def test_alpha_beta(handle, rng, op):
    a = DevTensor((4, 6, 9, 10), pydnn.PYDNN_DATA_FLOAT)
    av = _values(rng, a, op)
    c = DevTensor((4, 1, 9, 1), pydnn.PYDNN_DATA_FLOAT)
    c0 = c.random(rng)
    _run(handle, _rdesc(op), a, c, alpha=-1.5, beta=0.5)
    want, _, scale = ref.reduce(op, -1.5, av, 0.5, c0, c.dims)
    assert_close(c.download(), want, pydnn.PYDNN_DATA_FLOAT, "alpha/beta", scale=scale)


def test_nan_propagation_and_first_index(handle, rng):
    dims = (3, 50)
    a = DevTensor(dims, pydnn.PYDNN_DATA_FLOAT)
    v = rng.uniform(-1, 1, dims)
    v[0, 7] = v[0, 30] = np.nan
    av = a.upload(v)
    for nan in (0, 1):
        c = DevTensor((3, 1), pydnn.PYDNN_DATA_FLOAT)
        idx = _run(handle, _rdesc(pydnn.PYDNN_REDUCE_TENSOR_MAX, True, nan), a, c)
        want, widx, _ = ref.reduce(pydnn.PYDNN_REDUCE_TENSOR_MAX, 1.0, av, 0.0, None, (3, 1), propagate_nan=bool(nan))
        out = c.download()
        assert np.isnan(out[0, 0]) == bool(nan)
        assert_close(out, want, pydnn.PYDNN_DATA_FLOAT, "nan")
        assert idx.tolist() == widx.ravel().tolist()


def test_long_full_reduction_is_accurate_and_deterministic(handle, rng):
    n = 2**27 + 13
    a = DevTensor((n,), pydnn.PYDNN_DATA_FLOAT)
    av = a.random(rng, -1, 1)
    for op in (pydnn.PYDNN_REDUCE_TENSOR_ADD, pydnn.PYDNN_REDUCE_TENSOR_NORM2, pydnn.PYDNN_REDUCE_TENSOR_AMAX):
        c = DevTensor((1,), pydnn.PYDNN_DATA_FLOAT)
        r = _rdesc(op, indices=op == pydnn.PYDNN_REDUCE_TENSOR_AMAX)
        assert pydnn.get_reduction_workspace_size(handle, r, a.desc, c.desc) > 0  # takes the two-pass path
        idx1 = _run(handle, r, a, c)
        first = c.buf.to_numpy().tobytes()
        idx2 = _run(handle, r, a, c)
        assert c.buf.to_numpy().tobytes() == first, "not bitwise reproducible"
        want, widx, scale = ref.reduce(op, 1.0, av, 0.0, None, (1,))
        assert_close(c.download(), want, pydnn.PYDNN_DATA_FLOAT, f"op {op} over 2^27", scale=scale)
        if widx is not None:
            assert idx1.tolist() == idx2.tolist() == widx.ravel().tolist()
