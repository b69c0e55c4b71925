"""row_split_fwd (ptx/softmax_split.cu, issue 20): which forward problems take it (few long contiguous rows on
sm_90, the vector launch only; the scalar launch, backward, double, other archs and the switch off keep the
one-block kernels), its launch shape, and the kernel's index arithmetic emulated: every whole vector of a
row owned by exactly one (block, thread, item), every head / tail element by one thread of rank 0."""
import numpy as np
import pytest

import pydnn
from pydnn import tuning
from pydnn.ops import softmax as S
from test_fuzz_cpu import _desc, cpu_handle

F32, F64, F16, BF16 = (pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DATA_DOUBLE, pydnn.PYDNN_DATA_HALF,
                       pydnn.PYDNN_DATA_BFLOAT16)
ACCURATE, LOG, FAST = pydnn.PYDNN_SOFTMAX_ACCURATE, pydnn.PYDNN_SOFTMAX_LOG, pydnn.PYDNN_SOFTMAX_FAST
INSTANCE, CHANNEL = pydnn.PYDNN_SOFTMAX_MODE_INSTANCE, pydnn.PYDNN_SOFTMAX_MODE_CHANNEL


def _launches(dims, dt=F32, backward=False, handle=None, algo=ACCURATE, mode=INSTANCE):
    h = handle or cpu_handle()
    d = _desc(dims, dt)
    descs = [d, d, d] if backward else [d, d]
    return S._plan(h, backward, algo, mode, descs).launches


@pytest.mark.parametrize("dims,dt,block", [((1, 65536), F32, 512), ((1, 16384), BF16, 128),
                                           ((1, 1, 1, 16384), F16, 128), ((16, 65536), F32, 512), ((3, 131072), F32, 1024), ((1, 8192), F32, 128),
                                           ((2, 262144), BF16, 1024), ((1, 40001), F32, 512)])
def test_few_long_rows_take_the_cluster(dims, dt, block):
    for algo in (ACCURATE, LOG, FAST):
        lcs = _launches(dims, dt, algo=algo)
        lc = lcs[0]
        rows = int(np.prod(dims[:-1]))
        assert lc.kernel == "row_split_fwd" and lc.unit == f"softmax.split.{S.TAG[dt]}"
        assert lc.block == (block, 1, 1) and lc.grid == (rows * S.SPLIT_CL, 1, 1)
        assert lc.expr in {u.name: u.exprs for u in S.kernel_units()}[lc.unit]
        assert lcs[-1].kernel != "row_split_fwd" and lcs[-1].vec == 1  # misaligned pointers: the scalar launch


@pytest.mark.parametrize("dims,dt", [((17, 65536), F32), ((1, 8191), F32), ((1, 140000), F32), ((1, 300000), BF16),
                                     ((2, 3727), F32), ((20, 8192), F16)])
def test_other_rows_keep_one_block(dims, dt):
    assert all(lc.kernel != "row_split_fwd" for lc in _launches(dims, dt))


def test_backward_double_arch_switch():
    assert all(lc.kernel != "row_split_fwd" for lc in _launches((1, 65536), F32, backward=True))
    assert all(lc.kernel != "row_split_fwd" for lc in _launches((1, 65536), F64))
    h = cpu_handle()
    h.arch = "sm_80"
    assert all(lc.kernel != "row_split_fwd" for lc in _launches((1, 65536), F32, handle=h))
    with tuning.override({"softmax.SPLIT": False}):
        assert all(lc.kernel != "row_split_fwd" for lc in _launches((1, 65536), F32))
    with tuning.override({"softmax.SPLIT_MIN_LEN": 100}):
        assert _launches((4, 1000), F32)[0].kernel == "row_split_fwd"


def test_split_units_only_on_sm_90():
    from pydnn._build import manifest
    units = manifest.unit_by_name("sm_90")
    for t in S.SPLIT_TAGS:
        u = units[f"softmax.split.{t}"]
        assert manifest.unit_arch(u, "sm_90") == "sm_90" and manifest.unit_arch(u, "sm_80") is None


def _emulate(length, vec, block, mis):
    """Owner counts of every element of a row: whole vectors per (rank, thread, item), head / tail per
    thread of rank 0 (softmax.cu's split / extra_index, the kernel's chunking)."""
    head = min(length, (vec - mis) & (vec - 1))
    nvec = (length - head) // vec
    tail = length - head - nvec * vec
    seen = np.zeros(length, np.int64)
    chunk = -(-nvec // S.SPLIT_CL)
    for rank in range(S.SPLIT_CL):
        lo, hi = rank * chunk, min(nvec, rank * chunk + chunk)
        covered = set()
        for t in range(block):
            for k in range(S.SPLIT_ITEMS):
                i = lo + t + k * block
                if i < hi:
                    seen[head + i * vec: head + i * vec + vec] += 1
                    covered.add(i)
            if rank == 0:
                if t < head:
                    seen[t] += 1
                elif t - head < tail:
                    seen[nvec * vec + t] += 1
        assert covered == set(range(lo, max(lo, hi)))
    return seen


@pytest.mark.parametrize("length,dt", [(65536, F32), (16384, BF16), (40001, F32), (8193, F16), (131072, F32),
                                       (262143, BF16), (8192, F32)])
def test_emulated_ownership(length, dt):
    vec = 16 // {F32: 4, F16: 2, BF16: 2}[dt]
    block = S.split_group(cpu_handle(), False, S.TAG[dt], 1, length, vec)
    assert block is not None
    for mis in range(vec):
        assert (_emulate(length, vec, block, mis) == 1).all(), (length, mis)
