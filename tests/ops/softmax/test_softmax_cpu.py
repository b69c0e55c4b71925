"""Softmax on the CPU: every validation error (status + the argument it names), the float64 reference
against direct formulas, that the kernel units compile with NVRTC (and the hot kernels do not spill),
the kernel choice for the layouts that matter, and an emulation of the kernels over the host's launch
plans: each launch's index arithmetic is replayed from its real parameter struct (row offsets, vector
heads and tails, alignment of every 16-byte access, channel tiles, the coordinate walker, the group and
column reductions), proving every element of every row is read and written exactly once, where it
belongs, and that nothing outside the tensors is touched."""
import re

import numpy as np
import pytest

import pydnn
from pydnn import tuning
from pydnn.ops import softmax as S
from pydnn.reference import softmax as ref
from pydnn.tensor import packed_strides
from test_fuzz_cpu import _call, _desc, cpu_handle

F32, F64, F16, BF16 = (pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DATA_DOUBLE, pydnn.PYDNN_DATA_HALF,
                       pydnn.PYDNN_DATA_BFLOAT16)
FAST, ACCURATE, LOG = pydnn.PYDNN_SOFTMAX_FAST, pydnn.PYDNN_SOFTMAX_ACCURATE, pydnn.PYDNN_SOFTMAX_LOG
INSTANCE, CHANNEL = pydnn.PYDNN_SOFTMAX_MODE_INSTANCE, pydnn.PYDNN_SOFTMAX_MODE_CHANNEL
BAD, NS = pydnn.PYDNN_STATUS_BAD_PARAM, pydnn.PYDNN_STATUS_NOT_SUPPORTED
NULL, MIS = pydnn.PYDNN_STATUS_BAD_PARAM_NULL_POINTER, pydnn.PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER
NOINIT = pydnn.PYDNN_STATUS_NOT_INITIALIZED  # everything valid: the CPU-only handle refuses at kernel lookup
X, Y, DY, DX = 1 << 40, 1 << 41, 1 << 42, 1 << 43


def _check(fn, args, status, needle):
    st = _call(fn, *args)
    msg = pydnn.get_last_error_string()
    assert st == status, (st, msg)
    assert needle in msg, msg


# ----------------------------------------------------------------------------- validation

def test_forward_validation():
    h = cpu_handle()
    fwd = pydnn.softmax_forward
    d = _desc((2, 3, 4, 5))
    _check(fwd, (h, ACCURATE, CHANNEL, 1.0, d, X, 0.0, d, Y), NOINIT, "")
    _check(fwd, (h, 9, CHANNEL, 1.0, d, X, 0.0, d, Y), BAD, "softmax_forward: algo: 9 is not")
    _check(fwd, (h, -1, CHANNEL, 1.0, d, X, 0.0, d, Y), BAD, "algo:")
    _check(fwd, (h, True, CHANNEL, 1.0, d, X, 0.0, d, Y), BAD, "algo:")
    _check(fwd, (h, ACCURATE, 2, 1.0, d, X, 0.0, d, Y), BAD, "softmax_forward: mode: 2 is not")
    _check(fwd, (h, ACCURATE, "1", 1.0, d, X, 0.0, d, Y), BAD, "mode:")
    _check(fwd, (h, ACCURATE, CHANNEL, 1.0, d, X, 0.0, _desc((2, 3, 4, 6)), Y), BAD, "yDesc: dims (2, 3, 4, 6) differ")
    _check(fwd, (h, ACCURATE, CHANNEL, 1.0, d, X, 0.0, _desc((2, 3, 4)), Y), BAD, "yDesc: dims")
    _check(fwd, (h, ACCURATE, CHANNEL, 1.0, d, X, 0.0, _desc((2, 3, 4, 5), F16), Y), BAD, "yDesc: data type")
    _check(fwd, (h, ACCURATE, CHANNEL, 1.0, _desc((2, 3, 4, 5), F64), X, 0.0, d, Y), BAD, "yDesc: data type")
    _check(fwd, (h, ACCURATE, CHANNEL, 1.0, _desc((2, 3), pydnn.PYDNN_DATA_INT8), X, 0.0,
                 _desc((2, 3), pydnn.PYDNN_DATA_INT8), Y), NS, "xDesc: data type")
    _check(fwd, (h, ACCURATE, CHANNEL, 1.0, d, X, 0.0, _desc((2, 3, 4, 5), pydnn.PYDNN_DATA_INT32), Y), NS,
           "yDesc: data type")
    _check(fwd, (h, ACCURATE, CHANNEL, 1.0, None, X, 0.0, d, Y), BAD, "xDesc:")
    _check(fwd, (h, ACCURATE, CHANNEL, 1.0, d, X, 0.0, "y", Y), BAD, "yDesc:")
    unset = pydnn.create_tensor_descriptor()
    _check(fwd, (h, ACCURATE, CHANNEL, 1.0, unset, X, 0.0, d, Y), BAD, "xDesc: descriptor was never set")
    _check(fwd, ("h", ACCURATE, CHANNEL, 1.0, d, X, 0.0, d, Y), BAD, "handle:")
    one = _desc((7,))
    _check(fwd, (h, ACCURATE, CHANNEL, 1.0, one, X, 0.0, one, Y), BAD, "yDesc: softmax needs at least 2 dims")
    overlap = _desc((2, 3, 4, 5), F32, (1, 1, 1, 1))
    _check(fwd, (h, ACCURATE, CHANNEL, 1.0, d, X, 0.0, overlap, Y), BAD, "yDesc: strides")
    _check(fwd, (h, ACCURATE, CHANNEL, 1.0, overlap, X, 0.0, d, Y), NOINIT, "")  # an input may overlap
    _check(fwd, (h, ACCURATE, CHANNEL, 1.0, d, 0, 0.0, d, Y), NULL, "x: NULL")
    _check(fwd, (h, ACCURATE, CHANNEL, 1.0, d, X, 0.0, d, None), NULL, "y: NULL")
    _check(fwd, (h, ACCURATE, CHANNEL, 1.0, d, X + 2, 0.0, d, Y), MIS, "x: 0x")
    _check(fwd, (h, ACCURATE, CHANNEL, 1.0, d, X, 0.0, d, Y + 1), MIS, "y: 0x")
    hd = _desc((2, 3, 4, 5), F16)
    _check(fwd, (h, ACCURATE, CHANNEL, 1.0, hd, X + 2, 0.0, hd, Y + 6), NOINIT, "")  # 2-byte aligned is enough
    _check(fwd, (h, ACCURATE, CHANNEL, "one", d, X, 0.0, d, Y), NOINIT, "")  # descriptors first, then scalars:
    # (the CPU handle stops at kernel lookup before the scalars are read; on a GPU "alpha:" is reported)


def test_backward_validation():
    h = cpu_handle()
    bwd = pydnn.softmax_backward
    d, other = _desc((2, 3, 4, 5)), _desc((2, 3, 5, 5))
    _check(bwd, (h, LOG, INSTANCE, 1.0, d, Y, d, DY, 0.0, d, DX), NOINIT, "")
    _check(bwd, (h, 3, INSTANCE, 1.0, d, Y, d, DY, 0.0, d, DX), BAD, "softmax_backward: algo:")
    _check(bwd, (h, LOG, 7, 1.0, d, Y, d, DY, 0.0, d, DX), BAD, "softmax_backward: mode:")
    _check(bwd, (h, LOG, INSTANCE, 1.0, d, Y, other, DY, 0.0, d, DX), BAD, "dyDesc: dims")
    _check(bwd, (h, LOG, INSTANCE, 1.0, d, Y, d, DY, 0.0, other, DX), BAD, "dxDesc: dims")
    _check(bwd, (h, LOG, INSTANCE, 1.0, d, Y, _desc((2, 3, 4, 5), BF16), DY, 0.0, d, DX), BAD, "dyDesc: data type")
    _check(bwd, (h, LOG, INSTANCE, 1.0, d, Y, d, DY, 0.0, _desc((2, 3, 4, 5), F64), DX), BAD, "dxDesc: data type")
    i8 = _desc((2, 3), pydnn.PYDNN_DATA_UINT8)
    _check(bwd, (h, LOG, INSTANCE, 1.0, i8, Y, i8, DY, 0.0, i8, DX), NS, "yDesc: data type")
    one = _desc((7,))
    _check(bwd, (h, 1, 1, 1.0, one, Y, one, DY, 0.0, one, DX), BAD, "at least 2 dims")
    overlap = _desc((2, 3, 4, 5), F32, (1, 1, 1, 1))
    _check(bwd, (h, LOG, INSTANCE, 1.0, d, Y, d, DY, 0.0, overlap, DX), BAD, "dxDesc: strides")
    _check(bwd, (h, LOG, INSTANCE, 1.0, d, Y, d, 0, 0.0, d, DX), NULL, "dy: NULL")
    _check(bwd, (h, LOG, INSTANCE, 1.0, d, Y + 3, d, DY, 0.0, d, DX), MIS, "y: 0x")
    _check(bwd, (h, LOG, INSTANCE, 1.0, d, Y, d, DY, 0.0, d, DX + 2), MIS, "dx: 0x")


# ----------------------------------------------------------------------------- reference

def test_reference_matches_direct_formulas():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 4, 5))
    for algo in (FAST, ACCURATE):
        y = ref.forward(algo, CHANNEL, 1.0, x, 0.0, None)
        assert np.allclose(y, np.exp(x) / np.exp(x).sum(axis=1, keepdims=True), rtol=1e-14, atol=0)
        y = ref.forward(algo, INSTANCE, 1.0, x, 0.0, None)
        assert np.allclose(y, np.exp(x) / np.exp(x).sum(axis=(1, 2, 3), keepdims=True), rtol=1e-14, atol=0)
    y = ref.forward(LOG, INSTANCE, 1.0, x, 0.0, None)
    assert np.allclose(y, x - np.log(np.exp(x).sum(axis=(1, 2, 3), keepdims=True)), rtol=1e-13, atol=1e-15)
    y = ref.forward(LOG, CHANNEL, 1.0, x, 0.0, None)
    assert np.allclose(y, np.log(np.exp(x) / np.exp(x).sum(axis=1, keepdims=True)), rtol=1e-13, atol=1e-15)
    y0 = rng.standard_normal(x.shape)
    y = ref.forward(ACCURATE, CHANNEL, 0.5, x, -2.0, y0)
    assert np.allclose(y, 0.5 * np.exp(x) / np.exp(x).sum(axis=1, keepdims=True) - 2.0 * y0, rtol=1e-14)
    # 5-d: CHANNEL reduces dim 1 only, INSTANCE every dim after N
    x5 = rng.standard_normal((2, 3, 2, 2, 2))
    assert np.allclose(ref.forward(ACCURATE, CHANNEL, 1.0, x5, 0.0, None).sum(axis=1), 1.0)
    assert np.allclose(ref.forward(ACCURATE, INSTANCE, 1.0, x5, 0.0, None).sum(axis=(1, 2, 3, 4)), 1.0)
    # large inputs: the reference subtracts the max, so it does not overflow either
    big = np.array([[1e4, -1e4, 0.0, 88.0, 1e4, -50.0]]).reshape(1, 6, 1, 1)
    assert ref.forward(ACCURATE, CHANNEL, 1.0, big, 0.0, None).ravel().tolist() == [0.5, 0, 0, 0, 0.5, 0]


def test_reference_backward_is_the_vjp_of_forward():
    rng = np.random.default_rng(1)
    v, dy = rng.standard_normal(6), rng.standard_normal(6)
    s = np.exp(v) / np.exp(v).sum()
    jac = np.diag(s) - np.outer(s, s)  # d softmax / d x
    got = ref.backward(ACCURATE, CHANNEL, 1.0, s.reshape(1, 6, 1, 1), dy.reshape(1, 6, 1, 1), 0.0, None).ravel()
    assert np.allclose(got, jac.T @ dy, rtol=1e-12)
    ls = np.log(s)
    jac_log = np.eye(6) - np.outer(np.ones(6), s)  # d log_softmax / d x
    got = ref.backward(LOG, CHANNEL, 1.0, ls.reshape(1, 6, 1, 1), dy.reshape(1, 6, 1, 1), 0.0, None).ravel()
    assert np.allclose(got, jac_log.T @ dy, rtol=1e-12)
    # and by finite differences on the forward reference
    eps = 1e-6
    num = np.array([(ref.forward(ACCURATE, CHANNEL, 1.0, (v + eps * np.eye(6)[i]).reshape(1, 6, 1, 1), 0, None)
                     - ref.forward(ACCURATE, CHANNEL, 1.0, (v - eps * np.eye(6)[i]).reshape(1, 6, 1, 1), 0, None))
                    .ravel() @ dy / (2 * eps) for i in range(6)])
    got = ref.backward(ACCURATE, CHANNEL, 1.0, s.reshape(1, 6, 1, 1), dy.reshape(1, 6, 1, 1), 0.0, None).ravel()
    assert np.allclose(got, num, rtol=1e-6, atol=1e-9)


# ----------------------------------------------------------------------------- kernels compile

def test_kernel_units_compile_for_sm80_and_sm90():
    from pydnn._build import build

    # every unit of the family in each arch's install / first-use split (the cache entries the loader reads)
    build.build_all(archs=["sm_80", "sm_90"], prefixes=("softmax.",), everything=True, progress=False)


def test_hot_kernels_do_not_spill():
    """The row and col kernels keep the row in registers; a spill to local memory costs a large share of
    the bandwidth (it did in the previous bf16 version). ptxas reports spills per kernel."""
    from pydnn._build import cache
    from pydnn._build.manifest import COMMON_OPTIONS
    from pydnn._cuda import nvrtc

    for unit in S.kernel_units():
        if unit.name not in ("softmax.bf16", "softmax.f32", "softmax.split.bf16", "softmax.split.f32"):
            continue
        text, _ = cache.unit_inputs(unit)
        _, lowered, log = nvrtc.compile_cubin(text, unit.source, unit.exprs, "sm_90",
                                              COMMON_OPTIONS + ("--ptxas-options=-v",), [str(cache.ptx_dir())])
        names = {v: k for k, v in lowered.items()}
        spills = {}
        current = None
        for line in log.splitlines():
            m = re.search(r"Function properties for (\S+)", line)
            if m:
                current = names.get(m.group(1))
            m = re.search(r"(\d+) bytes spill stores", line)
            if m and current:
                spills[current] = int(m.group(1))
        hot = [e for e in unit.exprs if "::row_" in e or "::col_" in e]
        assert hot and all(e in spills for e in hot), (unit.name, sorted(spills))
        assert all(spills[e] == 0 for e in hot), {e: spills[e] for e in hot if spills[e]}


def test_kernel_unit_names_cover_every_plan():
    units = {u.name: set(u.exprs) for u in S.kernel_units()}
    h = cpu_handle()
    for dt in (F32, F64, F16, BF16):
        for dims, strides in (((4, 4096), None), ((4, 100000), None), ((2, 7, 3, 5), None), ((2, 600, 4, 4), None),
                              ((3, 5, 4, 6), (400, 80, 16, 2)), ((5, 3, 1, 1), None), ((2, 37, 4, 8), None)):
            d = _desc(dims, dt, strides)
            for algo in (FAST, ACCURATE, LOG):
                for mode in (INSTANCE, CHANNEL):
                    for backward in (False, True):
                        descs = [d, d, d] if backward else [d, d]
                        pl = S._plan(h, backward, algo, mode, descs)
                        for lc in pl.launches:
                            assert lc.expr in units[lc.unit or pl.unit], lc.expr


# ----------------------------------------------------------------------------- kernel choice

def _summary(dims, dt=F32, strides=None, mode=CHANNEL, backward=False, algo=ACCURATE):
    d = _desc(dims, dt, strides)
    if backward:
        return S.plan_summary(cpu_handle(), algo, mode, d, d, d, backward=True)
    return S.plan_summary(cpu_handle(), algo, mode, d, d)


def test_kernel_choice():
    # the benchmark: rows of 4096, register kernel, one block of G threads per row, 16-byte vectors
    assert _summary((16384, 4096, 1, 1), BF16) == ("row", [("row_fwd", 8, 128, 16384), ("row_fwd", 1, 256, 16384)])
    # float ACCURATE / LOG: 8 fragments per thread up to rows of 8192 (G = 128 here); FAST keeps 4 (G = 256)
    assert _summary((16384, 4096, 1, 1), F32) == ("row", [("row_fwd", 4, 128, 16384), ("row_fwd", 1, 256, 16384)])
    assert _summary((16384, 4096, 1, 1), F32, algo=LOG)[1][0] == ("row_fwd", 4, 128, 16384)
    assert _summary((16384, 4096, 1, 1), F32, algo=FAST)[1][0] == ("row_fwd", 4, 256, 16384)
    with tuning.override({"softmax.SPLIT": False}):  # (16 rows: the cluster kernel by default, below)
        assert _summary((16, 8193, 1, 1), F32)[1][0] == ("row_fwd", 4, 1024, 16)  # 4 fragments past 8192
    assert _summary((16, 8193, 1, 1), F32)[1][0] == ("row_split_fwd", 4, 128, 16 * S.SPLIT_CL)
    assert _summary((17, 8193, 1, 1), F32)[1][0] == ("row_fwd", 4, 1024, 17)
    assert _summary((16384, 4096, 1, 1), F32, backward=True)[1][0] == ("row_bwd", 4, 256, 16384)
    assert _summary((16384, 4096), BF16, mode=INSTANCE)[1][0] == ("row_fwd", 8, 128, 16384)
    assert _summary((16384, 4096, 1, 1), BF16, backward=True)[1][0] == ("row_bwd", 8, 128, 16384)
    # short rows: a sub-warp group per row, several rows per block
    assert _summary((1000, 64, 1, 1), F32) == ("row", [("row_fwd", 4, 8, 63), ("row_fwd", 1, 4, 32)])
    assert _summary((5, 3, 1, 1)) == ("row", [("row_fwd", 1, 1, 1)])
    # NHWC CHANNEL and NCHW INSTANCE are contiguous rows
    assert _summary((2, 37, 3, 5), strides=packed_strides((2, 37, 3, 5), pydnn.PYDNN_TENSOR_NHWC))[0] == "row"
    assert _summary((2, 37, 3, 5), mode=INSTANCE)[0] == "row"
    # rows too long for registers
    with tuning.override({"softmax.SPLIT": False}):
        assert [k for k, *_ in _summary((2, 20000), F32)[1]] == ["row_loop_fwd", "gen_fwd"]
        assert [k for k, *_ in _summary((2, 20000), BF16)[1]] == ["row_fwd", "gen_fwd"]
    assert [k for k, *_ in _summary((2, 20000), F32)[1]] == ["row_split_fwd", "gen_fwd"]  # few long rows
    assert [k for k, *_ in _summary((2, 20000), BF16)[1]] == ["row_split_fwd", "gen_fwd"]
    assert [k for k, *_ in _summary((2, 40000), BF16, backward=True)[1]] == ["row_loop_bwd", "gen_bwd"]
    # CHANNEL on NCHW: channels strided, spatial contiguous
    assert _summary((2, 37, 3, 5)) == ("col", [("col_fwd", 1, (16, 16), 2)])
    assert _summary((64, 21, 64, 64), BF16) == ("col", [("col_fwd", 8, (32, 8), 1024), ("col_fwd", 1, (32, 8), 8192)])
    with tuning.override({"softmax.COL_FILL": 0}):  # streamed channels, a sector per channel line
        assert _summary((8, 4096, 8, 8), F32) == ("col", [("col_loop_fwd", 4, (2, 128), 64),
                                                          ("col_loop_fwd", 1, (8, 32), 64)])
    # COL_FILL (the default, 1): 64 blocks < 132 SMs, so the tiles narrow (128 / 256 blocks)
    assert _summary((8, 4096, 8, 8), F32) == ("col", [("col_loop_fwd", 4, (1, 256), 128),
                                                      ("col_loop_fwd", 1, (2, 128), 256)])
    assert _summary((140, 4096, 8, 8), F32) == ("col", [("col_loop_fwd", 4, (2, 128), 1120),
                                                        ("col_loop_fwd", 1, (8, 32), 1120)])  # (enough blocks)
    # and where the channels then fit the registers, col (3 x 1000 x 7 x 7: 147 one-position blocks)
    assert _summary((40, 601, 3, 3), BF16) == ("col", [("col_loop_fwd", 1, (2, 128), 200)])
    assert _summary((3, 1000, 7, 7), F32) == ("col", [("col_fwd", 1, (1, 256), 147)])
    # gaps inside the reduced dims
    assert _summary((3, 5, 4, 6), strides=(400, 80, 16, 2))[0] == "gen"
    assert _summary((3, 5, 4, 6), strides=(400, 80, 16, 2), mode=INSTANCE)[0] == "gen"


# ----------------------------------------------------------------------------- emulation of the kernels

def _row_offsets(p, row, nops):
    off = [0] * nops
    for d in range(p.row_ndim - 1, -1, -1):
        s = p.row_size[d]
        c = row % s
        row //= s
        for k in range(nops):
            off[k] += c * p.row_stride[k][d]
    return off


def _split(addr, length, vec):
    if vec == 1:
        return 0, length, 0
    mis = addr % vec
    head = min(length, (vec - mis) & (vec - 1))
    nvec = (length - head) // vec
    return head, nvec, length - head - nvec * vec


def _extra(head, nvec, tail, lane, vec):
    if vec == 1:
        return -1
    if lane < head:
        return lane
    if lane - head < tail:
        return nvec * vec + lane
    return -1


class _Walk:
    """Walk<NOPS> in softmax.cu: coordinates and offsets of a thread's elements, advanced by red_step."""

    def __init__(self, p, e, nops):
        self.p, self.nops = p, nops
        self.c = [0] * 8
        for d in range(p.red_ndim - 1, -1, -1):
            if d > 0:
                e, self.c[d] = divmod(e, p.red_size[d])
            else:
                self.c[d] = e
        self._offsets()

    def _offsets(self):
        p = self.p
        self.off = [sum(self.c[d] * p.red_stride[k][d] for d in range(p.red_ndim)) for k in range(self.nops)]

    def next(self):
        p = self.p
        if p.red_ndim == 1:
            self.c[0] += p.red_step[0]
            self.off = [o + p.red_step[0] * p.red_stride[k][0] for k, o in enumerate(self.off)]
            return
        carry = 0
        for d in range(p.red_ndim - 1, 0, -1):
            v = self.c[d] + p.red_step[d] + carry
            carry = int(v >= p.red_size[d])
            self.c[d] = v - p.red_size[d] if carry else v
            assert self.c[d] < p.red_size[d]
        self.c[0] += p.red_step[0] + carry
        self._offsets()


def _element_offset(p, e, k):
    off = 0
    for d in range(p.red_ndim - 1, -1, -1):
        if d > 0:
            e, c = divmod(e, p.red_size[d])
        else:
            c = e
        off += c * p.red_stride[k][d]
    return off


def _row_items(lc):
    return int(re.search(r"<[^,]+, \d+, (\d+), \d>", lc.expr).group(1))


def _emulate(lc, nops, addrs):
    """{row key: [[offset per operand] per element, in row order]} for one launch; asserts every
    element is visited once, vector accesses are aligned, and (row kernels) fit the group's registers."""
    p, vec = lc.params, lc.vec
    rows = {}
    if lc.kernel == "row_split_fwd":  # a row per cluster of SPLIT_CL blocks, chunk `rank` of the vectors each
        B, CL, IT = lc.block[0], S.SPLIT_CL, S.SPLIT_ITEMS
        assert B & (B - 1) == 0 and 128 <= B <= 1024 and lc.grid[0] == p.rows * CL and vec > 1
        for row in range(p.rows):
            off = _row_offsets(p, row, nops)
            head, nvec, tail = _split(addrs[1] + off[1], p.len, vec)
            chunk = -(-nvec // CL)
            assert chunk <= IT * B, "the chunk does not fit the block's registers"
            seen = []
            for rank in range(CL):
                lo, hi = rank * chunk, min(nvec, rank * chunk + chunk)
                for t in range(B):
                    for k in range(IT):
                        i = lo + t + k * B
                        if i < hi:
                            for q in range(nops):
                                assert (addrs[q] + off[q] + head + i * vec) % vec == 0, "misaligned vector"
                            seen += [head + i * vec + e for e in range(vec)]
                    if rank == 0:
                        xi = _extra(head, nvec, tail, t, vec)
                        if xi >= 0:
                            seen.append(xi)
            assert sorted(seen) == list(range(p.len))
            rows[row] = [[off[k] + e for k in range(nops)] for e in range(p.len)]
    elif lc.kernel.startswith("row"):
        G, block = p.group, lc.block[0]
        per_block = block // G
        items = _row_items(lc) if lc.kernel in ("row_fwd", "row_bwd") else None
        assert block % 32 == 0 and G & (G - 1) == 0 and block % G == 0 and block <= 1024
        if vec > 1:
            assert G >= 2 * vec - 2
        for b in range(lc.grid[0]):
            first = b * per_block
            while first < p.rows:
                for sub in range(per_block):
                    row = first + sub
                    if row >= p.rows:
                        continue
                    off = _row_offsets(p, row, nops)
                    head, nvec, tail = _split(addrs[1] + off[1], p.len, vec)
                    if items is not None:
                        assert nvec <= items * G, "the row does not fit the group's registers"
                    seen = []
                    for lane in range(G):
                        for i in range(lane, nvec, G):
                            for k in range(nops):
                                assert (addrs[k] + off[k] + head + i * vec) % vec == 0, "misaligned vector"
                            seen += [head + i * vec + e for e in range(vec)]
                        xi = _extra(head, nvec, tail, lane, vec)
                        if xi >= 0:
                            seen.append(xi)
                    assert sorted(seen) == list(range(p.len))
                    assert row not in rows
                    rows[row] = [[off[k] + e for k in range(nops)] for e in range(p.len)]
                first += lc.grid[0] * per_block
    elif lc.kernel.startswith("col"):
        bx, by = lc.block[0], lc.block[1]
        assert bx * by == S.COL_THREADS and bx & (bx - 1) == 0
        C, nv = p.len, p.cols // vec
        assert p.cols % vec == 0
        resident = lc.kernel in ("col_fwd", "col_bwd")
        assert resident == (C <= by * S.COL_ITEMS)
        blocks = p.rows * p.tiles
        for b in range(lc.grid[0]):
            while b < blocks:
                o, tile = divmod(b, p.tiles)
                off = _row_offsets(p, o, nops)
                for tx in range(bx):
                    j = tile * bx + tx
                    if j >= nv:
                        continue
                    chans = []
                    for ty in range(by):
                        chans += [ty + k * by for k in range(S.COL_ITEMS) if ty + k * by < C] if resident else \
                            list(range(ty, C, by))
                    assert sorted(chans) == list(range(C))
                    for c in range(C):
                        for k in range(nops):
                            assert (addrs[k] + off[k] + j * vec + c * p.red_stride[k][0]) % vec == 0
                    for e in range(vec):
                        key = (o, j * vec + e)
                        assert key not in rows
                        rows[key] = [[off[k] + j * vec + e + c * p.red_stride[k][0] for k in range(nops)]
                                     for c in range(C)]
                b += lc.grid[0]
        assert len(rows) == p.rows * p.cols
    else:  # gen
        G = p.group
        per_block = S.GEN_THREADS // G
        for b in range(lc.grid[0]):
            first = b * per_block
            while first < p.rows:
                for sub in range(per_block):
                    row = first + sub
                    if row >= p.rows:
                        continue
                    off = _row_offsets(p, row, nops)
                    seen = {}
                    for lane in range(G):
                        w = _Walk(p, lane, nops)
                        for e in range(lane, p.len, G):
                            for k in range(nops):
                                assert w.off[k] == _element_offset(p, e, k), "walker off its element"
                            assert e not in seen
                            seen[e] = [off[k] + w.off[k] for k in range(nops)]
                            w.next()
                    assert sorted(seen) == list(range(p.len))
                    rows[row] = [seen[e] for e in range(p.len)]
                first += lc.grid[0] * per_block
    return rows


def _strided(flat, dims, strides):
    return np.lib.stride_tricks.as_strided(flat, dims, [s * flat.itemsize for s in strides])


def _run_emulated(dims, dtype, strides_in, strides_out, mode, algo, backward, misalign, rng, alpha=1.0, beta=0.0):
    """Plan on the CPU handle, pick the launch the pointers would pick, replay it and compute each row in
    float64 at the offsets the kernel would use. Returns (result, want, kernel)."""
    h = cpu_handle()
    din = _desc(dims, dtype, strides_in)
    dout = _desc(dims, dtype, strides_out)
    size = din.itemsize
    nops = 3 if backward else 2
    descs = [dout, din, din] if backward else [dout, din]
    S._validate(algo, mode, [(d, f"d{i}") for i, d in enumerate(descs)], "d0")
    pl = S._plan(h, backward, algo, mode, descs)
    addrs = [(1 << 20) * (k + 1) + misalign[k] for k in range(nops)]  # element addresses
    ptrs = [a * size for a in addrs]
    lc = pl.launches[0] if len(pl.launches) == 1 or S._aligned(pl.align, ptrs) else pl.launches[-1]
    rows = _emulate(lc, nops, addrs)
    spans = [d.span_bytes() // size for d in descs]
    bufs = [np.full(n, np.nan) for n in spans]
    ins = []
    for k in range(1, nops):
        v = rng.uniform(-3, 3, dims)
        if backward and k == 1:
            v = ref.forward(LOG if algo == LOG else ACCURATE, mode, 1.0, v, 0.0, None)  # a valid y
        _strided(bufs[k], dims, descs[k].strides)[...] = v
        ins.append(v)
    old = rng.uniform(-1, 1, dims)
    _strided(bufs[0], dims, dout.strides)[...] = old
    before = bufs[0].copy()
    written = np.zeros(spans[0], int)
    for elems in rows.values():
        o = np.array([e[0] for e in elems])
        a = np.array([bufs[1][e[1]] for e in elems])
        if backward:
            d = np.array([bufs[2][e[2]] for e in elems])
            r = d - np.exp(a) * d.sum() if algo == LOG else a * (d - (d * a).sum())
        else:
            z = a - a.max()
            r = z - np.log(np.exp(z).sum()) if algo == LOG else np.exp(z) / np.exp(z).sum()
        bufs[0][o] = alpha * r + (beta * before[o] if beta != 0 else 0.0)
        written[o] += 1
    mask = np.zeros(spans[0], bool)
    mask[_strided(np.arange(spans[0]), dims, dout.strides).ravel()] = True
    assert (written[mask] == 1).all(), "an output element written other than once"
    assert (written[~mask] == 0).all() and np.isnan(bufs[0][~mask]).all(), "a write outside the tensor"
    got = _strided(bufs[0], dims, dout.strides).copy()
    if backward:
        want = ref.backward(algo, mode, alpha, ins[0], ins[1], beta, old)
    else:
        want = ref.forward(algo, mode, alpha, ins[0], beta, old)
    return got, want, lc.kernel


def _nhwc(dims):
    return packed_strides(dims, pydnn.PYDNN_TENSOR_NHWC)


EMU_CASES = [  # dims, in strides (None: packed NCHW), out strides ("same": as the input), misalign (elements)
    ((3, 37, 1, 1), None, "same", (0, 0, 0)),
    ((3, 37, 1, 1), None, "same", (3, 3, 3)),            # congruent, not 16-byte aligned: heads and tails
    ((3, 37, 1, 1), None, "same", (1, 0, 0)),            # not congruent: the scalar launch
    ((4, 37, 1, 1), (41, 1, 1, 1), "same", (0, 0, 0)),   # padded rows: each row misaligned differently
    ((2, 70, 1, 1), None, None, (0, 0, 0)),
    ((3, 1, 1, 1), None, "same", (0, 0, 0)),
    ((5, 3, 1, 1), None, "same", (0, 0, 0)),
    ((2, 37, 3, 5), None, "same", (0, 0, 0)),
    ((2, 12, 4, 8), None, "same", (0, 0, 0)),            # col with 16-byte vectors
    ((2, 12, 4, 8), None, "same", (1, 1, 1)),            # col, pointers unaligned: the scalar launch
    ((2, 37, 3, 5), "nhwc", "same", (0, 0, 0)),
    ((2, 37, 3, 5), "nhwc", None, (0, 0, 0)),            # x NHWC, y NCHW
    ((3, 5, 4, 6), (400, 80, 16, 2), "same", (0, 0, 0)),  # gaps everywhere
    ((2, 3, 2, 2, 3), None, "same", (2, 2, 2)),          # 5-d
    ((2, 1200, 2, 4), None, "same", (0, 0, 0)),          # col_loop: channels streamed
    ((2, 1100, 3, 5), None, "same", (0, 0, 0)),          # col_loop, scalar
    ((2, 5, 3), (1, 2, 10), "same", (0, 0, 0)),          # N innermost
    ((3, "long"), None, "same", (0, 0, 0)),              # rows past the registers: row_loop
    ((2, "long"), None, "same", (1, 0, 0)),              # the same, unaligned: gen
    ((2, "long"), None, "same", (3, 3, 3)),              # few long rows (row_split_fwd), heads and tails
    ((2, 20000), None, "same", (0, 0, 0)),               # registers for 16-bit data, row_loop for the others
]


def _dims(dims, dtype):
    """'long': past the register capacity of the row kernels (16384 elements of 4 bytes, 32768 of 2)."""
    return tuple((40000 if dtype in (F16, BF16) else 20000) if d == "long" else d for d in dims)


@pytest.mark.parametrize("dtype", [F32, BF16, F64])
@pytest.mark.parametrize("case", range(len(EMU_CASES)))
@pytest.mark.parametrize("mode", [INSTANCE, CHANNEL])
def test_emulated_kernels(case, dtype, mode):
    dims, sin, sout, mis = EMU_CASES[case]
    dims = _dims(dims, dtype)
    rng = np.random.default_rng(case)
    sin = _nhwc(dims) if sin == "nhwc" else sin
    sout = sin if sout == "same" else sout
    for backward in (False, True):
        for algo in (ACCURATE, LOG):
            got, want, kernel = _run_emulated(dims, dtype, sin, sout, mode, algo, backward, mis, rng)
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14, err_msg=f"{kernel} {algo}")
    got, want, _ = _run_emulated(dims, dtype, sin, sout, mode, FAST, False, mis, rng, alpha=-0.5, beta=1.5)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


def test_emulation_reaches_every_kernel():
    rng = np.random.default_rng(0)
    seen = set()
    for split in (True, False):  # the long rows take row_split_fwd by default, row_loop_fwd without it
        with tuning.override({"softmax.SPLIT": split}):
            for dims, sin, sout, mis in EMU_CASES:
                for dtype in (F32, BF16):
                    for mode in (INSTANCE, CHANNEL):
                        for backward in (False, True):
                            d = _dims(dims, dtype)
                            s_in = _nhwc(d) if sin == "nhwc" else sin
                            s_out = s_in if sout == "same" else sout
                            _, _, k = _run_emulated(d, dtype, s_in, s_out, mode, ACCURATE, backward, mis, rng)
                            seen.add(k)
    assert seen == {"row_fwd", "row_bwd", "row_loop_fwd", "row_loop_bwd", "col_fwd", "col_bwd", "col_loop_fwd",
                    "col_loop_bwd", "gen_fwd", "gen_bwd", "row_split_fwd"}, seen


@pytest.mark.parametrize("block", [128, 256, 512, 1024])
def test_group_reduce_combines_exactly_its_group(block):
    """group_reduce: xor shuffles inside the warp (masks < min(G, 32)), then one partial per warp in
    shared memory, each thread folding the G / 32 warps of its group."""
    for G in (1, 2, 8, 16, 32, 64, 128, 256, 512, 1024):
        if G > block:
            continue
        v = [{t} for t in range(block)]
        m = min(G, 32) >> 1
        while m:
            v = [v[t] | v[t ^ m] for t in range(block)]
            m >>= 1
        if G > 32:
            sm = {t >> 5: v[t] for t in range(block) if t % 32 == 0}
            v = [set().union(*(sm[((t & ~(G - 1)) >> 5) + w] for w in range(G >> 5))) for t in range(block)]
        for t in range(block):
            g0 = t - t % G
            assert v[t] == set(range(g0, g0 + G)), (G, t)


def test_col_reduce_combines_exactly_a_column():
    """col_reduce: thread t = ty * BX + tx; xor shuffles over the ty bits inside a warp, partials in
    shared memory slot (t / W) * BX + tx (W = max(BX, 32)), each thread folding R = 256 / W slots."""
    n = S.COL_THREADS
    bx = 1
    while bx <= n:
        by = n // bx
        v = [{t} for t in range(n)]
        if bx < 32:
            mk = bx
            while mk < 32:
                v = [v[t] | v[t ^ mk] for t in range(n)]
                mk <<= 1
        W = max(bx, 32)
        sm = {}
        for t in range(n):
            if t % W < bx:
                slot = (t // W) * bx + t % bx
                assert slot not in sm and slot < n
                sm[slot] = v[t]
        R = n // W
        for t in range(n):
            tx = t % bx
            got = set().union(*(sm[q * bx + tx] for q in range(R)))
            assert got == {ty * bx + tx for ty in range(by)}, (bx, t)
        bx *= 2
