"""CPU: the split layer / RMS backward in the rowx frame (tuning.norm.XSPLIT: bwd_xsplit_dx, bwd_xsplit_params,
finish_rowx) for rows of any length: which rows take it (rowx rows whose backward takes a cluster per row or no
vector kernel, at least as many as the SMs; XSPLIT_ANY: bwd_rowx's rows too), its launches (a bwd_xsplit_dx block
per row; bwd_xsplit_params' (class, chunk) slots and vector tiles cover every (row, position) once), a float64
emulation of both kernels' frame walks (edge masks, class walk, slot order) against pydnn.reference, and the
kernels compile for sm_80 / sm_90 without spills."""
import math
import os
import sys

import numpy as np
import pytest

import pydnn
from pydnn.reference import normalization as ref
from pydnn import tuning
from pydnn.ops import normalization as N

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "core"))
from test_fuzz_cpu import cpu_handle  # noqa: E402

F32, F16, BF16 = pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DATA_HALF, pydnn.PYDNN_DATA_BFLOAT16
LAYER, RMS = pydnn.PYDNN_NORM_KIND_LAYER, pydnn.PYDNN_NORM_KIND_RMS
VEC = {F32: 4, F16: 8, BF16: 8}


def _plan(h, rows, length, dtype=F32, kind=LAYER, stride=None):
    nd = pydnn.create_norm_descriptor()
    pydnn.set_norm_descriptor(nd, kind, 1, 1, 1e-5, None)
    x = pydnn.create_tensor_descriptor()
    pydnn.set_tensor_nd_descriptor(x, dtype, 2, (rows, length), (stride or length, 1))
    return N._plan(h, N._set(nd), x, x, x, None, True)


@pytest.fixture(autouse=True)
def _xsplit(monkeypatch):
    monkeypatch.setattr(tuning.norm, "XSPLIT", True)
    monkeypatch.setattr(tuning.norm, "XSPLIT_ANY", False)
    monkeypatch.setattr(tuning.norm, "XSPLIT_SLOTS", False)


def _emulate(rows, length, stride, vec, kind, dx_l, par_l, rng):
    """float64 emulation of bwd_xsplit_dx (per row: the frame's vectors, edge elements masked) and of
    bwd_xsplit_params' slots ([slot][2][len], each position written once per slot) plus finish's slot-order sums."""
    x = rng.standard_normal((rows, length))
    dy = rng.standard_normal((rows, length))
    w = rng.standard_normal(length)
    mean, inv = ref.statistics(kind, 0, 1, 1e-5, x)
    mean, inv = mean.reshape(rows), inv.reshape(rows)
    if kind == RMS:
        mean = np.zeros(rows)
    # dx: the frame of row r (a = r * stride mod vec), vectors vi < nsv, positions j = vi * vec + e - a
    dx = np.full((rows, length), np.nan)
    for r in range(rows):
        a = (r * stride) % vec
        nsv = (a + length + vec - 1) // vec
        assert nsv <= dx_l.block[0] * math.ceil(nsv / dx_l.block[0])
        j = np.arange(nsv * vec) - a
        ok = (j >= 0) & (j < length)
        xa = np.where(ok, x[r, np.clip(j, 0, length - 1)], mean[r])
        d = np.where(ok, dy[r, np.clip(j, 0, length - 1)], 0.0)
        wj = np.where(ok, w[np.clip(j, 0, length - 1)], 0.0)
        xh = (xa - mean[r]) * inv[r]
        g = d * wj
        m1 = 0.0 if kind == RMS else g.sum() / length
        m2 = (g * xh).sum() / length
        out = inv[r] * (g - m1 - xh * m2)
        assert np.isnan(dx[r, j[ok]]).all()  # each position once
        dx[r, j[ok]] = out[ok]
    want_dx, want_ds, want_db = ref.backward(kind, 0, 1, 1e-5, None, x, dy, w, np.zeros(length), mean, inv)
    np.testing.assert_allclose(dx, want_dx, rtol=1e-9, atol=1e-9)
    # params: slot y = chunk * P + class; the class's rows cls + P * t, t in [chunk * group, ... + group)
    P, group = par_l.params.pf, par_l.params.group
    bx = par_l.block[0]
    tiles, ys, _ = par_l.grid
    ws = np.full((ys, 2, length), np.nan)
    for y in range(ys):
        cls, chunk = y % P, y // P
        nrows = (rows - cls + P - 1) // P if cls < rows else 0
        t0, t1 = chunk * group, min(nrows, chunk * group + group)
        rr = cls + P * np.arange(t0, t1)
        a = (cls * stride) % vec
        nsv = (a + length + vec - 1) // vec
        for vi in range(min(nsv, tiles * bx)):
            for e in range(vec):
                j = vi * vec + e - a
                if 0 <= j < length:
                    assert np.isnan(ws[y, 0, j])
                    assert all((r * stride) % vec == a for r in rr)  # one alignment class: same positions
                    ws[y, 0, j] = (dy[rr, j] * (x[rr, j] - mean[rr]) * inv[rr]).sum()
                    ws[y, 1, j] = dy[rr, j].sum()
    assert not np.isnan(ws).any()  # every slot covers every position (empty chunks: zeros)
    np.testing.assert_allclose(ws[:, 0].sum(0), want_ds, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(ws[:, 1].sum(0), want_db, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("rows,length,dtype,kind,stride", [
    (2402, 34823, F16, LAYER, None),   # the sweep's point: bwd_rowx_cl before
    (3673, 8551, F32, LAYER, None),    # fp32, beyond one bwd_rowx block: a cluster before
    (140, 70001, F32, RMS, None),      # beyond 64K elements: no vector kernel before (gen)
    (133, 20001, BF16, LAYER, 20003),  # padded rows, stride off the vector: 8 classes
    (150, 17002, F32, RMS, 17006),     # stride 2 mod 4: 2 classes
])
def test_xsplit_plan_covers(rows, length, dtype, kind, stride, rng):
    h = cpu_handle()
    st = stride or length
    pl = _plan(h, rows, length, dtype, kind, stride)
    par, dx, fin = pl.alternatives[0]  # (params first: dx may be dy or x, in place)
    vec = VEC[dtype]
    assert f"bwd_xsplit_dx<{N.CTYPE[N.TAG[dtype]]}, {vec}>" in dx.expr and "bwd_xsplit_params" in par.expr
    assert "finish_rowx" in fin.expr and dx.unit == par.unit == fin.unit == f"normalization.rowx.{N.TAG[dtype]}"
    P = vec // math.gcd(st % vec, vec)
    nsv = -(-(length + vec - 1) // vec)
    g = dx.block[0]
    assert dx.grid == (rows, 1, 1) and 128 <= g <= tuning.norm.XSPLIT_DX_BLOCK and g & (g - 1) == 0
    assert g == tuning.norm.XSPLIT_DX_BLOCK or g * N.SPLIT_DX_VECS >= nsv
    bx, by, _ = par.block
    tiles, ys, _ = par.grid
    assert bx * by == N.SPLIT_PARAMS_THREADS and tiles * bx >= nsv > (tiles - 1) * bx
    assert par.params.pf == P and ys % P == 0
    chunks, group = ys // P, par.params.group
    rpc = -(-rows // P)
    assert chunks * group >= rpc > (chunks - 1) * group
    assert fin.params.slots == ys and pl.workspace >= ys * 2 * length * 4
    # the fallback (unaligned pointers) is the scalar / gen launch, as for every rowx plan
    assert len(pl.alternatives) == 2 and "xsplit" not in pl.alternatives[1][0].expr


def _emulate_plan(h, dtype, kind, rng, rows, length, stride):
    import unittest.mock as um
    with um.patch.object(tuning.norm, "XSPLIT_ANY", True):
        pl = _plan(h, rows, length, dtype, kind, stride if stride != length else None)
    par, dx, fin = pl.alternatives[0]  # (params first: dx may be dy or x, in place)
    assert "bwd_xsplit_dx" in dx.expr and "bwd_xsplit_params" in par.expr, dx.desc
    _emulate(rows, length, stride, VEC[dtype], kind, dx, par, rng)


@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("kind", [LAYER, RMS])
@pytest.mark.parametrize("rows,length,stride", [(140, 1037, 1037), (133, 301, 306), (137, 2770, 2770),
                                                (135, 19, 21)])
def test_xsplit_emulated(rows, length, stride, dtype, kind, rng, monkeypatch):
    h = cpu_handle()
    _emulate_plan(h, dtype, kind, rng, rows, length, stride)


def test_xsplit_taken_where(monkeypatch):
    h = cpu_handle()
    first = lambda *a, **k: _plan(h, *a, **k).alternatives[0][0].desc  # noqa: E731
    assert first(2402, 34823, F16).startswith("bwd_xsplit_params")          # a cluster per row before
    assert first(200, 70001, F32, RMS).startswith("bwd_xsplit_params")      # no vector kernel before
    assert first(100, 34823, F16).startswith("bwd_rowx ")               # fewer rows than SMs: the cluster kernel
    assert first(417, 2770, BF16).startswith("bwd_rowx ")               # one block a row: bwd_rowx
    assert first(3673, 8552).startswith("bwd_split_params")               # whole vectors: BWD_SPLIT's kernels
    # XSPLIT_FILL (0.6, 32 MiB): bwd_rowx's groups filled under 60%, tensors of 32 MiB or more
    assert first(17244, 4231, F16).startswith("bwd_xsplit_params")     # 529 vectors in 256 x 4: 52%, 146 MB
    assert first(81995, 9188, BF16, RMS).startswith("bwd_xsplit_params")  # 1149 in 512 x 4: 56%
    assert first(665, 2277, BF16).startswith("bwd_rowx ")               # 56%, but 3 MB
    assert first(486865, 2015).startswith("bwd_rowx ")                  # 504 in 128 x 4: 98%
    assert first(169308, 166, BF16).startswith("bwd_rowx ")             # 21 in 8 x 4: 66%
    monkeypatch.setattr(tuning.norm, "XSPLIT_FILL", 0)
    assert first(17244, 4231, F16).startswith("bwd_rowx ")
    monkeypatch.setattr(tuning.norm, "XSPLIT_SLOTS", True)  # bwd_rowx's slots outweigh the split's second read
    assert first(417, 2770, BF16).startswith("bwd_xsplit_params")      # 420 slots: 18.6 MB against 4.6
    assert first(665, 2277, BF16).startswith("bwd_xsplit_params")
    assert first(169308, 166, BF16).startswith("bwd_rowx ")             # 504 slots: 1.3 MB against 112
    assert first(17244, 4231, F16).startswith("bwd_rowx ")
    monkeypatch.setattr(tuning.norm, "XSPLIT_SLOTS", False)
    monkeypatch.setattr(tuning.norm, "XSPLIT_ANY", True)
    assert first(417, 2770, BF16).startswith("bwd_xsplit_params")
    assert first(169308, 166, BF16).startswith("bwd_xsplit_params")
    assert first(100, 2770, BF16).startswith("bwd_rowx ")
    monkeypatch.setattr(tuning.norm, "XSPLIT", False)
    assert first(417, 2770, BF16).startswith("bwd_rowx ")
    assert first(2402, 34823, F16).startswith("bwd_rowx ") and " cl=" in first(2402, 34823, F16)


def test_xsplit_kernels_compile_without_spills():
    from test_normalization_split_cpu import compile_without_spills
    compile_without_spills("::bwd_xsplit_")
