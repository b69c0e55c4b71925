"""CPU: tuning.norm.ROWS_FIT's plans (which rows take 5 items, on which kernel) and its instantiations."""
import os
import sys

import pytest

import pydnn
from pydnn import tuning
from pydnn.ops import normalization as N

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "core"))
from test_fuzz_cpu import cpu_handle  # noqa: E402

F32, F16, BF16 = pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DATA_HALF, pydnn.PYDNN_DATA_BFLOAT16
LAYER, RMS = pydnn.PYDNN_NORM_KIND_LAYER, pydnn.PYDNN_NORM_KIND_RMS

# kind, rows, length, dtype, plan off, plan on (the CPU handle has 132 SMs)
CASES = [
    (RMS, 199454, 4336, F16, "fwd_rows vec=8 G=256 block=256 items=4", "fwd_rowx vec=8 G=128 block=128 items=5"),
    (RMS, 22392, 2296, BF16, "fwd_rows vec=8 G=128 block=128 items=4", "fwd_rowx vec=8 G=64 block=128 items=5"),
    (LAYER, 8204, 39856, BF16, "fwd_rowx vec=8 G=1024 block=1024 items=8", "fwd_rowx vec=8 G=1024 block=1024 items=5"),
    (LAYER, 26676, 9576, F16, "fwd_rows vec=8 G=512 block=512 items=4", "fwd_rowx vec=8 G=256 block=256 items=5"),
    (LAYER, 16384, 4096, BF16, "fwd_rows vec=8 G=128 block=128 items=4", "fwd_rows vec=8 G=128 block=128 items=4"),
    (LAYER, 100, 160, F32, "fwd_rows vec=4 G=16 block=128 items=4", "fwd_rows vec=4 G=8 block=128 items=5"),
    (RMS, 135, 4336, F32, "fwd_rows vec=4 G=512 block=512 items=4", "fwd_rows vec=4 G=256 block=256 items=5"),
    (LAYER, 100, 2296, F16, "fwd_rows vec=8 G=128 block=128 items=4", "fwd_rows vec=8 G=128 block=128 items=4"),
    (LAYER, 1000, 2770, F16, "fwd_rowx vec=8 G=128 block=128 items=4", "fwd_rowx vec=8 G=128 block=128 items=4"),
]


@pytest.mark.parametrize("kind,rows,length,dtype,off,on", CASES)
def test_rows_fit_plans(kind, rows, length, dtype, off, on, monkeypatch):
    monkeypatch.setattr(tuning.norm, "FWD_PERSIST", False)
    h = cpu_handle()
    nd = pydnn.create_norm_descriptor()
    pydnn.set_norm_descriptor(nd, kind, 1, 1, 1e-5, None)
    x = pydnn.create_tensor_descriptor()
    pydnn.set_tensor_nd_descriptor(x, dtype, 2, [rows, length], [length, 1])
    for fit, want in ((False, off), (True, on)):
        monkeypatch.setattr(tuning.norm, "ROWS_FIT", fit)
        alts, _ = N.plan_summary(h, nd, x)
        assert alts[0][0].startswith(want + " "), (fit, alts)
    units = {u.name: set(u.exprs) for u in N.kernel_units()}
    tag = {F32: "f32", F16: "f16", BF16: "bf16"}[dtype]
    v = 4 if dtype == F32 else 8
    assert N._rowx_expr(tag, v, N.ROWS_FIT_ITEMS) in units[f"normalization.rowx.{tag}"]
    if dtype == F32:
        assert N._rows_expr(tag, v, N.ROWS_FIT_ITEMS, 1, False) in units["normalization.f32"]


@pytest.mark.parametrize("vec,G,items", [(8, 128, 4), (4, 64, 4), (8, 16, 4), (4, 512, 4)])
@pytest.mark.parametrize("L", [37, 1001, 2770, 4231, 100, 6830])
def test_rowx_ws16_gather(vec, G, items, L):
    """ROWX_BWD_WS16's read of position j's partial (frame j + a: vector vi, lane vi mod G, item vi / G, half h,
    component (j + a) mod 4) is the float the per-thread walk stores at j, for every row offset a."""
    Q = vec // 4
    for a in range(vec):
        nsv = -(-(a + L) // vec)
        if nsv > G * items:
            continue
        owner = {}  # float index in the group's float4 array -> position j (the per-thread walk's stores)
        for lane in range(G):
            for k in range(items):
                vi = lane + k * G
                if vi >= nsv:
                    continue
                j0 = vi * vec - a
                for h in range(Q):
                    for e in range(4):
                        j = j0 + 4 * h + e
                        if 0 <= j < L:
                            owner[((k * 2 * Q + h) * G + lane) * 4 + e] = j
        got = {}
        for j in range(L):
            pos = j + a
            vi, ee = divmod(pos, vec)
            h, k, l = ee >> 2, vi // G, vi % G
            got[((k * 2 * Q + h) * G + l) * 4 + (ee & 3)] = j
        assert got == owner


@pytest.mark.parametrize("kind,dims,dtype,kernel", [(RMS, (140, 4336), F16, "fwd_rowx"), (LAYER, (140, 2296), BF16, "fwd_rowx"),
                                                    (LAYER, (133, 9576), F16, "fwd_rowx"), (RMS, (135, 4336), F32, "fwd_rows"),
                                                    (LAYER, (100, 160), F32, "fwd_rows"), (LAYER, (9, 39856), BF16, None)])
def test_rows_fit_emulated(kind, dims, dtype, kernel, monkeypatch):
    """The 5-item launches ROWS_FIT plans (fwd_rows<float, 4, 5>, fwd_rowx<T, 8, 5>): every element of x and y once,
    at its row's address, with its parameter (test_normalization_cpu.py's emulations of the two kernels)."""
    import numpy as np

    import test_normalization_cpu as T

    monkeypatch.setattr(tuning.norm, "ROWS_FIT", True)
    monkeypatch.setattr(tuning.norm, "FWD_PERSIST", False)
    h = cpu_handle()
    nd = T._nd(kind)
    x = T._desc(dims, dtype)
    pl = N._plan(h, nd, x, x, None, T._params(x, nd)[1], False)
    lc = pl.alternatives[0][0]
    if kernel is None:  # (fewer rows than SMs: not a rows kernel of 5 items)
        assert "5" not in lc.expr.split(",")[2], lc.desc
        return
    assert f"::{kernel}<" in lc.expr and lc.expr.split(",")[2].strip().startswith("5"), lc.expr
    for operand in (0, 1):
        emu = T._emulate_rowx if kernel == "fwd_rowx" else T._emulate_rows
        addr, sset, spar, stats = emu(lc.params, lc, operand)
        want = (np.arange(dims[0])[:, None] * dims[1] + np.arange(dims[1])[None, :]).ravel()
        assert sorted(addr.tolist()) == want.tolist()
        assert ((addr - sset * dims[1]) == spar).all()
        assert len(stats) == dims[0]
