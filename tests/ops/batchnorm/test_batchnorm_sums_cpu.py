"""CPU: batch norm's backward with the saved mean on bwd_sums / bwd_sums_final (tuning.batchnorm.BWD_SUMS): which
sequences get the sums form and that a call with saved statistics takes it (and one without does not), the kernels
compile for sm_80 / sm_90 without spills, and a float64 emulation of bwd_sums's index math (blocks, chunks,
the super-rows' slots, one tile's per-channel merge and the rows past the super-rows, the tail's chunk) and of
bwd_sums_final's reads against numpy's per-channel sums of dy and dy (x - mean)."""
import os
import sys

import numpy as np
import pytest

import pydnn
from pydnn import tuning
from pydnn.ops import batchnorm as B
from pydnn.tensor import packed_strides

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "core"))
from test_fuzz_cpu import cpu_handle  # noqa: E402

F32, F16, BF16, F64 = pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DATA_HALF, pydnn.PYDNN_DATA_BFLOAT16, pydnn.PYDNN_DATA_DOUBLE
SPATIAL = pydnn.PYDNN_BATCHNORM_SPATIAL

# dims (NHWC), dtype, SR_TILED_BYTES, the sequence the pick takes (16-byte aligned pointers)
CASES = [((4, 16, 5, 7), F32, None, "rows4"), ((64, 32, 14, 14), BF16, None, "rows8"), ((3, 37, 5, 7), F64, None, "rows1"),
         ((2, 1305, 9, 9), BF16, None, "srh"), ((3, 93, 7, 9), BF16, None, "sr"), ((40, 50, 9, 9), F32, None, "sr"),
         ((4, 1315, 3, 3), F32, 0, "sr"), ((5, 405, 4, 7), BF16, 0, "sr"), ((9, 5, 11, 13), F16, None, "sr"),
         ((2, 17, 9, 5), F32, None, "sr")]


def _plan(h, dims, dtype, ex):
    d = pydnn.create_tensor_descriptor()
    pydnn.set_tensor_nd_descriptor(d, dtype, 4, dims, packed_strides(dims, pydnn.PYDNN_TENSOR_NHWC))
    tag = B.TAG[dtype]
    ops = {B.OP_X: d.strides, B.OP_DY: d.strides, B.OP_DX: d.strides}
    return B._make_plan(h, tag, B._geometry(SPATIAL, dims, ops, B.vec_width(tag, tag)), "bwd", ex)


@pytest.fixture(autouse=True)
def _defaults(monkeypatch):
    monkeypatch.setattr(tuning.batchnorm, "GEN_TINY", 0)
    monkeypatch.setattr(tuning.batchnorm, "SUPER_ROWS", True)
    monkeypatch.setattr(tuning.batchnorm, "ROWS_FLAT", False)
    monkeypatch.setattr(tuning.batchnorm, "ROWS_MID", False)
    monkeypatch.setattr(tuning.batchnorm, "NC_RES", False)  # (packed NCHW up to NC_RES_MAX: nc_res, its own tests)


def _emulate(pl, seq, rng):
    """bwd_sums and bwd_sums_final on float64 data: the per-channel sums final sees, each element counted once."""
    g, p = pl.geom, pl.params
    C, rows = g.feats, g.rows
    sr = seq[0].u == B.SR_U
    k = p.sr_k if sr else 1
    fv, rv = (k * C, rows // k) if sr else (C, rows)  # the kernel's view: feats, rows (ld = feats: packed)
    x, dy = rng.standard_normal(rows * C), rng.standard_normal(rows * C)
    mean = rng.standard_normal(C)
    ch = np.arange(rows * C) % C
    a, b = dy, (x - mean[ch]) * dy
    st, fi = seq[0], seq[1]
    assert (st.kernel, fi.kernel) == ("bwd_sums", "bwd_sums_final")
    bx, by, _ = st.block
    tiles, gy, _ = st.grid
    v = st.vec
    chunk = st.fields["chunk_rows"]
    one = sr and tiles == 1
    width = C if one else fv
    part = np.full((gy * width, 2), np.nan)
    seen = np.zeros(rows * C, int)
    for y in range(gy):
        r0, r1 = y * chunk, min(rv, y * chunk + chunk)
        slots = {}
        for t in range(tiles):
            for tx in range(bx):
                f0 = (t * bx + tx) * v
                if f0 >= fv:
                    continue
                for e in range(v):
                    j = f0 + e
                    if r0 < rv:
                        idx = np.arange(r0, r1) * fv + j if r1 > r0 else np.array([], int)
                    else:  # (super-rows, position tiles: the tail's chunk)
                        assert sr and not one
                        tail = (rows - rv * k) * C
                        idx = np.array([rv * fv + j]) if j < tail else np.array([], int)
                    slots[j] = idx
        if one:
            assert r0 < rv and sorted(slots) == list(range(fv))
            t = rows - rv * k if y == gy - 1 else 0
            for c in range(C):
                idx = np.concatenate([slots[c + i * C] for i in range(k)] + [rv * fv + np.arange(t) * C + c])
                seen[idx] += 1
                part[y * C + c] = a[idx].sum(), b[idx].sum()
        else:
            for j, idx in slots.items():
                seen[idx] += 1
                part[y * fv + j] = a[idx].sum(), b[idx].sum()
    assert (seen == 1).all()  # every element in exactly one partial
    items = fi.fields["chunks"]
    assert items == (gy if (one or not sr) else gy * k)
    flat = part[:items * C].reshape(items, C, 2)  # final: item c of feature f at (c * feats + f) * 2
    assert not np.isnan(flat).any()
    got = flat.sum(axis=0)
    want = np.stack([np.bincount(ch, a, C), np.bincount(ch, b, C)], axis=1)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert pl.scratch[0] + items * C * 2 * pl.asize <= pl.scratch[0] + gy * width * 4 * pl.asize  # within bwd_stats's


@pytest.mark.parametrize("ex", [False, True])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_sums_emulated(case, ex, rng, monkeypatch):
    dims, dtype, tiled, name = CASES[case]
    if tiled is not None:
        monkeypatch.setattr(tuning.batchnorm, "SR_TILED_BYTES", tiled)
    pl = _plan(cpu_handle(), dims, dtype, ex)
    seq = B._pick(pl, [1 << 20], True, 1 << 20)
    assert seq is pl.seqs[name], (name, [k for k, s in pl.seqs.items() if s is seq])
    sums = pl.sums[id(seq)]
    assert [lc.kernel for lc in sums[:2]] == ["bwd_sums", "bwd_sums_final"] and sums[2:] == seq[2:]
    assert (sums[0].grid, sums[0].block, sums[0].fields, sums[0].vec, sums[0].u) == (
        seq[0].grid, seq[0].block, seq[0].fields, seq[0].vec, seq[0].u)
    exprs = set(next(u for u in B.kernel_units() if u.name == pl.unit).exprs)
    for lc in sums[:2]:
        assert B._expr(lc.kernel, pl.tag, lc.vec, lc.u) in exprs
    _emulate(pl, sums, rng)


def test_call_takes_sums_with_saved_stats(monkeypatch):
    """_bwd_go launches the sums form when savedMean is given and BWD_SUMS is on (non-Ex with betaParamDiff 0 and
    alphaParamDiff != 0: the SC apply over every row, no head; else with the head), else the four-moment form."""
    pl = _plan(cpu_handle(), (3, 93, 7, 9), BF16, False)
    launched = []
    monkeypatch.setattr(B, "_run", lambda h, p, seq: launched.append([(lc.kernel, lc.u) for lc in seq]))

    def call(ap, bp, sv):
        B._bwd_go(None, pl, False, False, 1.0, 0.0, ap, bp, 1e-5, 1 << 20, 2 << 20, 3 << 20, 0, 0, 4 << 20, 5 << 20,
                  6 << 20, sv, True, 3 << 20)

    saved = (7 << 20, 8 << 20)
    call(1.0, 0.0, saved)
    call(1.0, 0.5, saved)
    call(0.0, 0.0, saved)
    call(1.0, 0.0, (0, 0))
    monkeypatch.setattr(tuning.batchnorm, "BWD_APPLY_SAVED", False)
    call(1.0, 0.0, saved)
    monkeypatch.setattr(tuning.batchnorm, "BWD_SUMS", False)
    call(1.0, 0.0, saved)
    k = [[n for n, _ in s] for s in launched]
    sc = ["bwd_sums", "bwd_sums_final", "bwd_apply"]
    head = ["bwd_sums", "bwd_sums_final", "bwd_apply", "bwd_head_batched"]
    moments = ["bwd_stats", "bwd_final", "bwd_apply", "bwd_head_batched"]
    assert k == [sc, head, head, moments, head, moments], k
    assert launched[0][2][1] == B.SR_U + B.SC_SUFFIX and launched[1][2][1] == B.SR_U


@pytest.mark.parametrize("name,dims,dtype,tiled", [("rows8", (64, 32, 14, 14), BF16, None),
                                                   ("rows1", (3, 37, 5, 7), F64, None),
                                                   ("rows1", (3, 37, 5, 7), F32, 1 << 40),
                                                   ("sr", (3, 93, 7, 9), BF16, None), ("sr", (5, 405, 4, 7), BF16, 0),
                                                   ("srh", (2, 1305, 9, 9), BF16, None)])
def test_sums0_plans(name, dims, dtype, tiled, monkeypatch):
    """pl.sums0 (non-Ex only): sums, final, the SC apply over rows (super-rows) [0, end) with the same block and
    chunk size, every row covered, no head; its kernels instantiated."""
    if tiled is not None:
        monkeypatch.setattr(tuning.batchnorm, "SR_TILED_BYTES", tiled)
    if name == "rows1" and dtype == F32:
        monkeypatch.setattr(tuning.batchnorm, "SUPER_ROWS", False)
    pl = _plan(cpu_handle(), dims, dtype, False)
    seq = pl.seqs[name]
    s0 = pl.sums0[id(seq)]
    a, a0 = seq[2], s0[2]
    assert [lc.kernel for lc in s0] == ["bwd_sums", "bwd_sums_final", "bwd_apply"] and s0[:2] == pl.sums[id(seq)][:2]
    assert (a0.block, a0.vec, a0.grid[0], a0.fields["row_begin"], a0.fields["row_end"]) == (
        a.block, a.vec, a.grid[0], 0, a.fields["row_end"])
    assert a0.u == B._sc_u(a.u) and a0.grid[1] * a0.fields["chunk_rows"] >= a0.fields["row_end"]
    assert (a0.grid[1] - 1) * a0.fields["chunk_rows"] < a0.fields["row_end"]
    assert a0.fields["row_end"] == (pl.geom.rows // pl.params.sr_k if a.u == B.SR_U else pl.geom.rows)
    exprs = set(next(u for u in B.kernel_units() if u.name == pl.unit).exprs)
    assert B._expr(a0.kernel, pl.tag, a0.vec, a0.u) in exprs
    assert _plan(cpu_handle(), dims, dtype, True).sums0 == {}


@pytest.mark.parametrize("ex", [False, True])
@pytest.mark.parametrize("dims,dtype", [((4, 16, 5, 7), F32), ((5, 1481, 23, 23), F32), ((1, 306, 99, 99), BF16),
                                        ((2, 3, 77, 77), BF16), ((3, 5, 7, 9), F64)])
def test_nc_sums(dims, dtype, ex):
    """NCHW: the nc sequences' sums form (nc_stats<T, VEC, true, true>, bwd_sums_final over the same items: item
    j * C + c at (j * C + c) * 2, chunks = items a channel); gen has none; the forward has none."""
    h = cpu_handle()
    d = pydnn.create_tensor_descriptor()
    pydnn.set_tensor_nd_descriptor(d, dtype, 4, dims, packed_strides(dims, pydnn.PYDNN_TENSOR_NCHW))
    tag = B.TAG[dtype]
    ops = {B.OP_X: d.strides, B.OP_DY: d.strides, B.OP_DX: d.strides}
    pl = B._make_plan(h, tag, B._geometry(SPATIAL, dims, ops, B.vec_width(tag, tag)), "bwd", ex)
    ncs = [n for n in pl.seqs if n.startswith("nc")]
    assert ncs and id(pl.seqs["gen"]) not in pl.sums
    exprs = set(next(u for u in B.kernel_units() if u.name == pl.unit).exprs)
    for n in ncs:
        seq, sums = pl.seqs[n], pl.sums[id(pl.seqs[n])]
        st, fi = seq[0], seq[1]
        assert (sums[0].kernel, sums[0].u, sums[0].grid, sums[0].block, sums[0].fields, sums[0].vec) == (
            "nc_stats", "true, true", st.grid, st.block, st.fields, st.vec)
        assert (sums[1].kernel, sums[1].grid, sums[1].block, sums[1].fields) == ("bwd_sums_final", fi.grid, fi.block,
                                                                                  fi.fields)
        assert sums[2:] == seq[2:] and st.grid[0] == fi.fields["chunks"] * dims[1]  # (items: chunks x C blocks)
        for lc in sums[:2]:
            assert B._expr(lc.kernel, pl.tag, lc.vec, lc.u) in exprs
        if ex:
            assert id(seq) not in pl.sums0
        else:  # (nc_apply kNcBwdSaved over every element, no nc_head)
            s0 = pl.sums0[id(seq)]
            a, a0 = seq[2], s0[2]
            assert s0[:2] == sums[:2] and len(s0) == 3 and seq[3].kernel == "nc_head"
            assert (a0.kernel, a0.u, a0.vec, a0.block, a0.fields["row_begin"], a0.fields["row_end"]) == (
                "nc_apply", B.NC_MODES["bwd_saved"], a.vec, a.block, 0, a.fields["row_end"])
            nv = -(-a0.fields["row_end"] // a0.vec)
            assert a0.grid[0] * a0.fields["chunk_rows"] >= nv > (a0.grid[0] - 1) * a0.fields["chunk_rows"]
            assert B._expr("nc_apply", pl.tag, a0.vec, a0.u) in exprs
    pf = B._make_plan(h, tag, B._geometry(SPATIAL, dims, {B.OP_X: d.strides, B.OP_Y: d.strides}, 4), "fwd", ex)
    assert pf.sums == {}


@pytest.mark.parametrize("unit_name", ["batchnorm.bf16", "batchnorm.f32"])
def test_sums_kernels_compile_without_spills(unit_name):
    import re

    from pydnn._build import cache
    from pydnn._build.manifest import COMMON_OPTIONS
    from pydnn._cuda import nvrtc

    unit = next(u for u in B.kernel_units() if u.name == unit_name)
    exprs = tuple(e for e in unit.exprs if "::nc_res<" not in e and (
        "::bwd_sums" in e or e.endswith(", true, true>") or e.endswith(", false, true>")))
    # bwd_sums: vector, 1 element (kUnroll, ROWS1_U), super-rows; the final; nc_stats<.., true, true> at 2 widths;
    # bwd_apply<.., SC>: vector, 1 element (two), super-rows; fwd_apply<.., SC>: 1 element (two), super-rows
    assert len(exprs) == 14, exprs
    text, _ = cache.unit_inputs(unit)
    for arch in ("sm_80", "sm_90"):
        _, lowered, log = nvrtc.compile_cubin(text, unit.source, exprs, arch, COMMON_OPTIONS + ("--ptxas-options=-v",),
                                              [str(cache.ptx_dir())])
        assert set(lowered) == set(exprs)
        spills = [int(s) for s in re.findall(r"(\d+) bytes spill stores", log)]
        assert len(spills) == 14 and not any(spills), (arch, log)


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
@pytest.mark.parametrize("ex", [False, True])
@pytest.mark.parametrize("dims,dtype", [((2, 1305, 45, 45), BF16), ((7, 337, 93, 93), BF16), ((2, 1305, 9, 9), BF16),
                                        ((3, 1315, 5, 5), F32), ((2, 1029, 7, 7), F16), ((5, 405, 4, 7), BF16)])
def test_srh_plan(dims, dtype, ex, direction, monkeypatch):
    """srh (SR_HYBRID; position tiles under SR_TILED_BYTES): rows1's stats and final, then the super-rows' apply
    from super-row cdiv(head rows, k) and the head over the rows before it; every element written once; picked for
    16-byte aligned pointers (rows1 otherwise); off: no srh."""
    monkeypatch.setattr(tuning.batchnorm, "SR_TILED_BYTES", 64 << 20)
    d = pydnn.create_tensor_descriptor()
    pydnn.set_tensor_nd_descriptor(d, dtype, 4, dims, packed_strides(dims, pydnn.PYDNN_TENSOR_NHWC))
    tag = B.TAG[dtype]
    ops = {B.OP_X: d.strides}
    ops.update({k: d.strides for k in ((B.OP_DY, B.OP_DX) if direction == "bwd" else (B.OP_Y,))})
    g = B._geometry(SPATIAL, dims, ops, B.vec_width(tag, tag))
    pl = B._make_plan(cpu_handle(), tag, g, direction, ex)
    assert "sr" not in pl.seqs and "srh" in pl.seqs
    seq, rows1 = pl.seqs["srh"], pl.seqs["rows1"]
    assert seq[0] is rows1[0] and seq[1] is rows1[1]
    k, L, R, tail, bx, by, tiles = B._sr_geom(tag, g, any_size=True)
    assert tiles > 1 and pl.params.sr_k == k
    apply = seq[2]
    assert (apply.kernel, apply.u, apply.vec, apply.block, apply.grid[0]) == (f"{direction}_apply", B.SR_U,
                                                                              B.vec_width(tag, tag), (bx, by, 1), tiles)
    C, rows = g.feats, g.rows
    head_rows = 0 if ex else rows1[3].fields["row_end"]
    hs = apply.fields["row_begin"]
    assert hs == -(-head_rows // k) and apply.fields["row_end"] == R
    wrote = np.zeros(rows * C, int)
    ach, agy = apply.fields["chunk_rows"], apply.grid[1]
    for y in range(agy if rows * C <= 1 << 20 else 0):  # (the big shapes: plan and pick only)
        start = hs + (agy - 1 - y) * ach
        end = min(R, start + ach)
        for t in range(tiles):
            for tx in range(bx):
                f0 = (t * bx + tx) * apply.vec
                for e in range(apply.vec if f0 < L else 0):
                    j = f0 + e
                    if end > start:
                        wrote[np.arange(start, end) * L + j] += 1
                    if y == 0 and j < tail * C:
                        wrote[R * L + j] += 1
    if ex:
        assert len(seq) == 3 and hs == 0
    else:
        assert seq[3].kernel == f"{direction}_head_batched" and seq[3].fields == {"row_begin": 0, "row_end": hs * k}
        wrote[:hs * k * C] += 1
    assert (wrote == 1).all() or rows * C > 1 << 20
    assert B._pick(pl, [1 << 20], True, 1 << 20) is seq and B._pick(pl, [(1 << 20) + 4], True, 1 << 20) is rows1
    if direction == "bwd":
        assert [lc.kernel for lc in pl.sums[id(seq)]] == ["bwd_sums", "bwd_sums_final"] + [lc.kernel for lc in seq[2:]]
    monkeypatch.setattr(tuning.batchnorm, "SR_HYBRID", False)
    assert "srh" not in B._make_plan(cpu_handle(), tag, g, direction, ex).seqs


@pytest.mark.parametrize("name,dims,dtype,tiled", [("rows1", (3, 37, 5, 7), F64, None), ("sr", (3, 93, 7, 9), BF16, None),
                                                   ("sr", (5, 405, 4, 7), BF16, 0), ("srh", (2, 1305, 9, 9), BF16, None),
                                                   ("sr", (40, 50, 9, 9), F32, None)])
def test_fwd_saved_plans(name, dims, dtype, tiled, monkeypatch):
    """The non-Ex forward's {name}s (FWD_APPLY_SAVED): stats and final, fwd_apply<.., SC> over rows (super-rows)
    [0, end), no head; _pick_plain takes it with saved statistics; Ex plans and FWD_APPLY_SAVED off have none."""
    if tiled is not None:
        monkeypatch.setattr(tuning.batchnorm, "SR_TILED_BYTES", tiled)
    d = pydnn.create_tensor_descriptor()
    pydnn.set_tensor_nd_descriptor(d, dtype, 4, dims, packed_strides(dims, pydnn.PYDNN_TENSOR_NHWC))
    tag = B.TAG[dtype]
    g = B._geometry(SPATIAL, dims, {B.OP_X: d.strides, B.OP_Y: d.strides}, B.vec_width(tag, tag))
    pl = B._make_plan(cpu_handle(), tag, g, "fwd", False)
    seq, s = pl.seqs[name], pl.seqs[name + "s"]
    a, a0 = seq[2], s[2]
    assert s[:2] == seq[:2] and len(s) == 3 and seq[3].kernel == "fwd_head_batched"
    assert (a0.kernel, a0.u, a0.vec, a0.block, a0.grid[0], a0.fields["row_begin"], a0.fields["row_end"]) == (
        "fwd_apply", B._sc_u(a.u), a.vec, a.block, a.grid[0], 0, a.fields["row_end"])
    assert a0.grid[1] * a0.fields["chunk_rows"] >= a0.fields["row_end"] > (a0.grid[1] - 1) * a0.fields["chunk_rows"]
    assert B._pick_plain(pl, seq, B.FLAG_SAVE) is s and B._pick_plain(pl, seq, 0) is seq
    assert B._pick_plain(pl, seq, B.FLAG_SAVE | B.FLAG_BETA) is seq
    exprs = set(next(u for u in B.kernel_units() if u.name == pl.unit).exprs)
    assert B._expr("fwd_apply", tag, a0.vec, a0.u) in exprs
    assert name + "s" not in B._make_plan(cpu_handle(), tag, g, "fwd", True).seqs
    monkeypatch.setattr(tuning.batchnorm, "FWD_APPLY_SAVED", False)
    assert name + "s" not in B._make_plan(cpu_handle(), tag, g, "fwd", False).seqs
