"""row_split_fwd (ptx/softmax_split.cu: one row over a thread-block cluster, sm_90) on the GPU against the
float64 reference: the issue-20 sweep's single long rows (1 x 65536 fp32, 1 x 16384 bf16), odd lengths,
up to 16 rows, 4-d INSTANCE, rows misaligned congruently (heads and tails), blending, in place, -inf / NaN
rows, every algorithm, outputs poisoned (beta 0 never reads y, nothing written outside the tensor); each
case's plan asserted to be the cluster kernel, and the same inputs through the one-block kernels
(tuning.softmax.SPLIT off) for the same answer."""
import numpy as np
import pytest

import pydnn
from devtensor import DevTensor, assert_close
from pydnn import tuning
from pydnn._cuda import driver
from pydnn.ops import softmax as S
from pydnn.reference import softmax as ref

pytestmark = pytest.mark.gpu

F32, F16, BF16 = pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DATA_HALF, pydnn.PYDNN_DATA_BFLOAT16
FAST, ACCURATE, LOG = pydnn.PYDNN_SOFTMAX_FAST, pydnn.PYDNN_SOFTMAX_ACCURATE, pydnn.PYDNN_SOFTMAX_LOG
INSTANCE, CHANNEL = pydnn.PYDNN_SOFTMAX_MODE_INSTANCE, pydnn.PYDNN_SOFTMAX_MODE_CHANNEL

CASES = [  # dims, dtype, mode
    ((1, 65536), F32, INSTANCE),
    ((1, 16384), BF16, INSTANCE),
    ((1, 1, 1, 16384), F16, INSTANCE),
    ((3, 40001), F32, INSTANCE),        # odd length: each row's head differs (rows 40001 elements apart)
    ((16, 8195), BF16, INSTANCE),       # 16 rows (16 * 8 blocks), odd length
    ((2, 8, 64, 72), BF16, INSTANCE),   # 4-d INSTANCE: rows of C * H * W
    ((5, 131072, 1, 1), F32, CHANNEL),  # the longest fp32 row a cluster holds
    ((1, 262143), BF16, INSTANCE),
]


@pytest.fixture(autouse=True)
def _sm90(handle):
    if handle.arch != "sm_90":
        pytest.skip("row_split_fwd is an sm_90 kernel (thread-block clusters)")


def _check(handle, algo, mode, x, y, xv, alpha, beta, y0, what):
    pydnn.softmax_forward(handle, algo, mode, alpha, x.desc, x.ptr, beta, y.desc, y.ptr)
    want = ref.forward(algo, mode, alpha, xv, beta, y0)
    scale = abs(alpha) * ref.forward_terms(algo, mode, xv) + (np.abs(beta * y0) if beta != 0 else 0)
    got = y.download()
    assert_close(got, want, x.dtype, what, scale=scale)
    y.check_untouched()
    return got


@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[0])) + f"-{c[1]}")
def test_split_forward(handle, rng, case):
    dims, dtype, mode = case
    for algo in (ACCURATE, LOG, FAST):
        x, y = DevTensor(dims, dtype), DevTensor(dims, dtype)
        kinds = [k for k, *_ in S.plan_summary(handle, algo, mode, x.desc, y.desc)[1]]
        assert kinds[0] == "row_split_fwd", (dims, kinds)
        xv = x.random(rng, -6, 6)
        got = _check(handle, algo, mode, x, y, xv, 1.0, 0.0, None, f"split {dims} algo {algo}")
        y0 = y.random(rng)
        alpha, beta = float(rng.uniform(-2, 2)), float(rng.uniform(-2, 2))
        _check(handle, algo, mode, x, y, xv, alpha, beta, y0, f"split blend {dims} algo {algo}")
        with tuning.override({"softmax.SPLIT": False}):  # new descriptors: a plan of their own
            x1, y1 = DevTensor(dims, dtype), DevTensor(dims, dtype)
            assert S.plan_summary(handle, algo, mode, x1.desc, y1.desc)[1][0][0] != "row_split_fwd"
            x1.upload(xv)
            one = _check(handle, algo, mode, x1, y1, xv, 1.0, 0.0, None, f"one block {dims} algo {algo}")
        assert_close(got, one, dtype, f"split vs one block {dims}", scale=np.abs(one) + 1e-30)


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_split_heads_tails_in_place(handle, rng, dtype):
    """Pointers 1..3 elements off 16 bytes (all the same: the vector launch, heads and tails by rank 0's
    threads), and x == y."""
    dims = (2, 20011)
    item = 4 if dtype == F32 else 2
    np_dtype = np.float32 if dtype == F32 else np.uint16
    n = 2 * 20011
    x = DevTensor(dims, dtype)
    kinds = [k for k, *_ in S.plan_summary(handle, ACCURATE, INSTANCE, x.desc, x.desc)[1]]
    assert kinds[0] == "row_split_fwd"
    xv = x.random(rng, -5, 5)
    want = ref.forward(ACCURATE, INSTANCE, 1.0, xv, 0.0, None)
    for off in (1, 2, 3):
        xbuf, ybuf = pydnn.DeviceArray((n + 8,), np_dtype), pydnn.DeviceArray((n + 8,), np_dtype)
        xbuf.copy_from_numpy(np.concatenate([np.zeros(off, np_dtype), x.buf.to_numpy(), np.zeros(8 - off, np_dtype)]))
        ybuf.fill_bytes(0xFF)
        pydnn.softmax_forward(handle, ACCURATE, INSTANCE, 1.0, x.desc, xbuf.ptr + off * item, 0.0, x.desc,
                              ybuf.ptr + off * item)
        driver.synchronize()
        flat = ybuf.to_numpy()
        got = flat[off:off + n]
        got = (got.astype(np.uint32) << 16).view(np.float32) if dtype == BF16 else got
        assert_close(got.reshape(dims).astype(np.float64), want, dtype, f"offset {off}",
                     scale=ref.forward_terms(ACCURATE, INSTANCE, xv))
        assert (flat[:off].view(np.uint8) == 0xFF).all() and (flat[off + n:].view(np.uint8) == 0xFF).all()
    for algo in (ACCURATE, LOG):
        x2 = DevTensor(dims, dtype)
        v = x2.random(rng, -5, 5)
        pydnn.softmax_forward(handle, algo, INSTANCE, 1.0, x2.desc, x2.ptr, 0.0, x2.desc, x2.ptr)
        assert_close(x2.download(), ref.forward(algo, INSTANCE, 1.0, v, 0.0, None), dtype, f"in place {algo}",
                     scale=ref.forward_terms(algo, INSTANCE, v))


def test_split_special_values(handle, rng):
    """A row with -inf entries (0 out), a row with one NaN (all NaN), a row far from 0 (the max is taken
    over every block of the cluster before any exp)."""
    dims = (3, 30000)
    x, y = DevTensor(dims, F32), DevTensor(dims, F32)
    assert S.plan_summary(handle, ACCURATE, INSTANCE, x.desc, y.desc)[1][0][0] == "row_split_fwd"
    v = rng.uniform(-3, 3, dims)
    v[0, ::7] = -np.inf
    v[1, 29000] = np.nan
    v[2] += 500.0
    v[2, 29999] = 520.0  # the max sits in the last block's chunk
    x.upload(v)
    pydnn.softmax_forward(handle, ACCURATE, INSTANCE, 1.0, x.desc, x.ptr, 0.0, y.desc, y.ptr)
    got = y.download()
    assert (got[0, ::7] == 0).all()
    assert np.isnan(got[1]).all()
    ok = np.array([0, 2])
    assert_close(got[ok], ref.forward(ACCURATE, INSTANCE, 1.0, v[ok], 0.0, None), F32, "special rows",
                 scale=ref.forward_terms(ACCURATE, INSTANCE, v[ok]))
    y.check_untouched()
