"""CPU: the split layer / RMS backward (tuning.norm.BWD_SPLIT): which rows take it (whole-vector fp32 rows the
one-pass kernels serve only with an 8-block cluster, at least as many as the SMs), its launches (every row one
bwd_split_dx block; bwd_split_params' tiles and row chunks cover every (row, vector) once; finish over its
slots; the workspace), a float64 emulation of bwd_split_params' slots and finish's sums against numpy, and the
kernels compile for sm_80 / sm_90 without spills."""
import os
import re
import sys

import numpy as np
import pytest

import pydnn
from pydnn import tuning
from pydnn.ops import normalization as N

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "core"))
from test_fuzz_cpu import cpu_handle  # noqa: E402

F32, BF16 = pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DATA_BFLOAT16
LAYER, RMS = pydnn.PYDNN_NORM_KIND_LAYER, pydnn.PYDNN_NORM_KIND_RMS


def _plan(h, rows, length, dtype=F32, kind=LAYER):
    nd = pydnn.create_norm_descriptor()
    pydnn.set_norm_descriptor(nd, kind, 1, 1, 1e-5, None)
    x = pydnn.create_tensor_descriptor()
    pydnn.set_tensor_nd_descriptor(x, dtype, 2, (rows, length), (length, 1))
    return N._plan(h, N._set(nd), x, x, x, None, True)


@pytest.fixture(autouse=True)
def _split(monkeypatch):
    monkeypatch.setattr(tuning.norm, "BWD_SPLIT", True)


@pytest.mark.parametrize("rows,length,kind", [(3673, 8552, LAYER), (200, 12288, RMS), (140, 16384, LAYER),
                                              (1000, 32768, LAYER), (133, 8200, RMS)])
def test_split_plan_covers(rows, length, kind, rng):
    h = cpu_handle()
    pl = _plan(h, rows, length, kind=kind)
    par, dx, fin = pl.alternatives[0]  # (params first: dx may be dy or x, in place)
    assert "bwd_split_dx<float, 4>" in dx.expr and "bwd_split_params<float, 4>" in par.expr
    assert "finish_rowx" in fin.expr and dx.unit == par.unit == fin.unit == "normalization.rowx.f32"
    nvec = length // 4
    g = dx.block[0]
    assert dx.grid == (rows, 1, 1) and 128 <= g <= 1024 and g & (g - 1) == 0 and g * 8 >= min(nvec, 8 * 1024) // 1
    bx, by, _ = par.block
    tiles, chunks, _ = par.grid
    chunk = par.params.group
    assert bx * by == N.SPLIT_PARAMS_THREADS and by & (by - 1) == 0
    assert tiles * bx >= nvec > (tiles - 1) * bx and chunks * chunk >= rows > (chunks - 1) * chunk
    assert fin.params.slots == chunks and pl.workspace >= chunks * 2 * length * 4
    # bwd_split_params' partials as the kernel writes them ([slot][2][nparams]), then finish's slot-order sums
    if rows * length <= 2_000_000:
        x = rng.standard_normal((rows, length))
        dy = rng.standard_normal((rows, length))
        mean, inv = x.mean(1), 1 / x.std(1)
        if kind == RMS:
            mean = np.zeros(rows)
        ws = np.full((chunks, 2, length), np.nan)
        for c in range(chunks):
            r0, r1 = c * chunk, min(rows, c * chunk + chunk)
            for t in range(tiles):
                for tx in range(bx):
                    vi = t * bx + tx
                    if vi >= nvec:
                        continue
                    cols = slice(vi * 4, vi * 4 + 4)
                    xh = (x[r0:r1, cols] - mean[r0:r1, None]) * inv[r0:r1, None]
                    ws[c, 0, cols] = (dy[r0:r1, cols] * xh).sum(0)
                    ws[c, 1, cols] = dy[r0:r1, cols].sum(0)
        assert not np.isnan(ws).any()
        xh = (x - mean[:, None]) * inv[:, None]
        np.testing.assert_allclose(ws[:, 0].sum(0), (dy * xh).sum(0), rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(ws[:, 1].sum(0), dy.sum(0), rtol=1e-9, atol=1e-9)


def test_split_not_taken(monkeypatch):
    h = cpu_handle()
    assert "bwd_split" not in _plan(h, 100, 8552).alternatives[0][0].expr           # fewer rows than SMs
    assert "bwd_split" not in _plan(h, 16384, 4096).alternatives[0][0].expr         # no cluster: staged
    monkeypatch.setattr(tuning.norm, "BWD_SPLIT_16", False)
    assert "bwd_split" not in _plan(h, 3673, 8552, BF16).alternatives[0][0].expr    # 16-bit: its own switch
    monkeypatch.setattr(tuning.norm, "BWD_SPLIT_16", True)
    assert "bwd_split_dx<pydnn::bf16_t, 8>" in _plan(h, 3673, 8552, BF16).alternatives[0][1].expr
    assert "bwd_split" not in _plan(h, 3673, 8551).alternatives[0][0].expr          # not whole vectors: rowx
    monkeypatch.setattr(tuning.norm, "BWD_SPLIT", False)
    assert "bwd_split" not in _plan(h, 3673, 8552).alternatives[0][0].expr


def test_split_kernels_compile_without_spills():
    compile_without_spills("::bwd_split_")


def compile_without_spills(pattern):
    """The rowx units' two instantiations whose names hold `pattern` compile for sm_80 and sm_90 without spills."""
    from pydnn._build import cache
    from pydnn._build.manifest import COMMON_OPTIONS
    from pydnn._cuda import nvrtc

    for unit in N.kernel_units():
        if not unit.name.startswith("normalization.rowx."):
            continue
        exprs = tuple(e for e in unit.exprs if pattern in e)
        assert len(exprs) == 2, (unit.name, exprs)
        text, _ = cache.unit_inputs(unit)
        for arch in ("sm_80", "sm_90"):
            _, lowered, log = nvrtc.compile_cubin(text, unit.source, exprs, arch,
                                                  COMMON_OPTIONS + ("--ptxas-options=-v",), [str(cache.ptx_dir())])
            assert set(lowered) == set(exprs)
            spills = [int(s) for s in re.findall(r"(\d+) bytes spill stores", log)]
            assert spills and not any(spills), (unit.name, arch, log)
