"""CPU: batch norm's super-row training forward and backward (tuning.batchnorm.SUPER_ROWS: {fwd,bwd}_stats /
_final / _apply<..., true> over super-rows of lcm(C, VEC) elements for packed NHWC with C off the 16-byte vector): which calls get the
"sr" sequence and pick it, the kernels compile for sm_80 / sm_90 without spills, and a float64 emulation of the
launches (the kernels' block / chunk / tail index math, part_count's counts, the apply's and head's coverage, the
scratch bytes) against numpy's per-channel sums."""
import os
import re
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
SIZE = {F32: 4, F16: 2, BF16: 2, F64: 8}

# dims, dtype: tails of 0 .. k - 1 rows, C below / above the vector, one / several position tiles
CASES = [((3, 93, 7, 9), BF16), ((2, 477, 5, 6), F32), ((9, 5, 11, 13), F16), ((40, 50, 9, 9), F32),
         ((5, 405, 4, 7), BF16), ((7, 3, 13, 11), BF16), ((4, 1315, 3, 3), F32), ((6, 12, 25, 25), F16),
         ((195, 93, 38, 38), BF16), ((39, 1315, 23, 23), F32), ((105, 405, 82, 82), BF16), ((2, 17, 9, 5), F32),
         ((13, 35, 6, 7), F16)]


def _nhwc(dims, dtype):
    d = pydnn.create_tensor_descriptor()
    pydnn.set_tensor_nd_descriptor(d, dtype, 4, dims, packed_strides(dims, pydnn.PYDNN_TENSOR_NHWC))
    return d


def _plan(h, dims, dtype, ex, direction="bwd"):
    d = _nhwc(dims, dtype)
    tag = B.TAG[dtype]
    ops = {B.OP_X: d.strides}
    ops.update({k: d.strides for k in ((B.OP_DY, B.OP_DX) if direction == "bwd" else (B.OP_Y,))})
    return B._make_plan(h, tag, B._geometry(SPATIAL, dims, ops, B.vec_width(tag, tag)), direction, ex), d


@pytest.fixture(autouse=True)
def _defaults(monkeypatch):
    monkeypatch.setattr(tuning.batchnorm, "SUPER_ROWS", True)
    monkeypatch.setattr(tuning.batchnorm, "SR_TILED_BYTES", 0)  # (position tiles on small shapes too)
    monkeypatch.setattr(tuning.batchnorm, "ROWS_FLAT", False)
    monkeypatch.setattr(tuning.batchnorm, "ROWS_MID", False)


def _part_count(c, chunk, rows, k, chunks=None):
    """part_count<false, 1> (ptx/batchnorm.cu); with chunks, part_count<false, 2> (one tile)."""
    r = rows // k
    if chunks is not None:
        return min(chunk, r - c * chunk) * k + (rows - r * k if c == chunks - 1 else 0)
    ch, kk = c // k, c % k
    c0 = ch * chunk
    if c0 < r:
        return min(chunk, r - c0)
    return 1 if kk < rows - r * k else 0


def _emulate(pl, seq, dims, ex, rng, direction):
    """The sr launches on float64 data: per-channel (n, mean x, M2 x, mean dy, C) from the partials as final
    merges them, and the elements the apply / head write (each once)."""
    g, p = pl.geom, pl.params
    C, rows = g.feats, g.rows
    k = p.sr_k
    v = B.vec_width(pl.tag, pl.tag)
    L, R = k * C, rows // k
    x = rng.standard_normal(rows * C)
    dy = rng.standard_normal(rows * C)
    stats, final, apply = seq[:3]
    d = direction
    bx, by, _ = stats.block
    tiles, gy, _ = stats.grid
    one = tiles == 1
    assert (stats.kernel, stats.u, final.kernel, final.u, apply.kernel, apply.u) == (
        f"{d}_stats", B.SR_U, f"{d}_final", B.SR_FINAL1 if one else B.SR_FINAL, f"{d}_apply", B.SR_U)
    assert bx * by <= B.THREADS and by & (by - 1) == 0 and stats.block == apply.block
    assert one == (L // v <= B.THREADS) and (not one or bx == L // v)
    chunk = stats.fields["chunk_rows"]
    assert final.fields == {"chunk_rows": chunk, "chunks": gy if one else gy * k}
    # stats: partial (block row y, slot j) over super-rows [y * chunk, min(R, ...)), or the tail's element
    part = np.zeros((gy, L, 4))
    cnt = np.zeros((gy, L), int)
    seen = np.zeros(rows * C, int)
    for y in range(gy):
        r0, r1 = y * chunk, min(R, y * chunk + chunk)
        for t in range(tiles):
            for tx in range(bx):
                f0 = (t * bx + tx) * v
                if f0 >= L:
                    continue
                for e in range(v):
                    j = f0 + e
                    if r0 < R:
                        idx = np.arange(r0, r1) * L + j
                    else:
                        tail = (rows - R * k) * C
                        idx = np.array([R * L + j]) if j < tail else np.array([], int)
                    seen[idx] += 1
                    xs, ds = x[idx], dy[idx]
                    cnt[y, j] = len(idx)
                    if len(idx):
                        part[y, j] = (xs.mean(), ((xs - xs.mean()) ** 2).sum(), ds.mean(),
                                      ((xs - xs.mean()) * (ds - ds.mean())).sum())
    if one:  # the block merges channel c's k slots (and the last block the tail rows): a partial per channel
        assert not any(r0 >= R for r0 in range(0, gy * chunk, chunk))  # (no tail chunk of its own)
        tail = rows - R * k
        seen = np.zeros(rows * C, int)  # (counted again, by the merged partials)
        part1, cnt1 = np.zeros((gy, C, 4)), np.zeros((gy, C), int)
        for y in range(gy):
            for c in range(C):
                idx = np.concatenate([np.arange(y * chunk, min(R, y * chunk + chunk)) * L + c + i * C
                                      for i in range(k)] + ([R * L + np.arange(tail) * C + c] if y == gy - 1 else []))
                seen[idx] += 1
                xs, ds = x[idx], dy[idx]
                cnt1[y, c] = len(idx)
                part1[y, c] = (xs.mean(), ((xs - xs.mean()) ** 2).sum(), ds.mean(),
                               ((xs - xs.mean()) * (ds - ds.mean())).sum())
    assert (seen == 1).all()  # every element in exactly one partial
    # final: channel f merges items c (partial c * C + f of the C-wide view) with part_count's counts
    items = gy if one else gy * k
    flat, fcnt = (part1, cnt1) if one else (part.reshape(gy * k, C, 4), cnt.reshape(gy * k, C))
    for f in range(C):
        n = mx = m2 = my = cc = 0.0
        for c in range(items):
            nb = _part_count(c, chunk, rows, k, gy if one else None)
            assert nb == fcnt[c, f], (c, f)
            if nb == 0:
                continue
            a = flat[c, f]
            nn = n + nb
            dx_, dy_ = a[0] - mx, a[2] - my
            mx += dx_ * nb / nn
            my += dy_ * nb / nn
            m2 += a[1] + dx_ * dx_ * n * nb / nn
            cc += a[3] + dx_ * dy_ * n * nb / nn
            n = nn
        xs, ds = x[f::C], dy[f::C]
        assert n == rows
        np.testing.assert_allclose([mx, m2, my, cc], [xs.mean(), ((xs - xs.mean()) ** 2).sum(), ds.mean(),
                                                      ((xs - xs.mean()) * (ds - ds.mean())).sum()], rtol=1e-9,
                                   atol=1e-9)
    # apply: block (t, y) walks super-rows [start, end), start = row_begin + (grid y - 1 - y) * chunk; block y 0
    # also the tail; its channel of element i is (j mod C) for j = i mod L; head: rows [0, row_end)
    wrote = np.zeros(rows * C, int)
    ab, ae, ach = apply.fields["row_begin"], apply.fields["row_end"], apply.fields["chunk_rows"]
    assert ae == R
    agy = apply.grid[1]
    for y in range(agy):
        start = ab + (agy - 1 - y) * ach
        end = min(ae, start + ach)
        for t in range(tiles):
            for tx in range(bx):
                f0 = (t * bx + tx) * v
                if f0 >= L:
                    continue
                for e in range(v):
                    j = f0 + e
                    if end > start:
                        wrote[np.arange(start, end) * L + j] += 1
                    if y == 0 and j < (rows - R * k) * C:
                        assert (R * L + j) % C == j % C
                        wrote[R * L + j] += 1
    if ex:
        assert len(seq) == 3 and ab == 0
    else:
        head = seq[3]
        assert head.kernel == f"{d}_head_batched" and head.fields == {"row_begin": 0, "row_end": ab * k}
        wrote[:ab * k * C] += 1
        cbytes = C * 4 * pl.asize
        assert ab * L * pl.isize >= cbytes  # the apply's first byte is past the constants
        slot = (4 if d == "bwd" else 2) * pl.asize
        assert pl.scratch[0] + gy * (C if one else L) * slot <= rows * C * pl.isize  # partials inside dx / y
    assert (wrote == 1).all()
    return gy * (C if one else L) * (4 if d == "bwd" else 2) * pl.asize


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
@pytest.mark.parametrize("ex", [False, True])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_sr_emulated(case, ex, direction, rng, monkeypatch):
    monkeypatch.setattr(tuning.batchnorm, "GEN_TINY", 0)
    dims, dtype = CASES[case]
    h = cpu_handle()
    pl, d = _plan(h, dims, dtype, ex, direction)
    assert "sr" in pl.seqs, dims
    v = B.vec_width(pl.tag, pl.tag)
    assert pl.params.sr_k == v // np.gcd(dims[1], v)
    if dims[0] * dims[2] * dims[3] * dims[1] > 3_000_000:  # (the big sweep shapes: plan and pick only)
        seq = pl.seqs["sr"]
    else:
        seq = pl.seqs["sr"]
        pbytes = _emulate(pl, seq, dims, ex, rng, direction)
        if ex:
            assert pl.ws_need >= pl.scratch[0] + pbytes
            bd = pydnn.create_tensor_descriptor()
            pydnn.derive_bn_tensor_descriptor(bd, d, SPATIAL)
            ops = pydnn.PYDNN_BATCHNORM_OPS_BN
            if direction == "bwd":
                got = pydnn.get_batch_normalization_backward_ex_workspace_size(h, SPATIAL, ops, d, None, d, None, d,
                                                                               bd, None)
            else:
                got = pydnn.get_batch_normalization_forward_training_ex_workspace_size(h, SPATIAL, ops, d, None, d,
                                                                                       bd, None)
            assert got == pl.ws_need
    base = 1 << 20
    assert B._pick(pl, (base, 2 * base), True, base) is seq
    assert B._pick(pl, (base + SIZE[dtype], 2 * base), True, base) is pl.seqs["rows1"]  # (off the vector)
    assert B._pick(pl, (base, 2 * base), True, base + 4) is pl.seqs["rows1"]            # (scratch off 16 bytes)


def test_sr_not_taken(monkeypatch):
    """Not for: whole-vector C, strided rows, double, fewer rows than a super-row, inference, position tiles under
    SR_TILED_BYTES, the switch off."""
    monkeypatch.setattr(tuning.batchnorm, "GEN_TINY", 0)
    h = cpu_handle()
    monkeypatch.setattr(tuning.batchnorm, "SR_TILED_BYTES", 64 << 20)
    assert "sr" not in _plan(h, (9, 1315, 20, 20), F32, True)[0].seqs    # 18 MiB, 6 position tiles
    assert "sr" in _plan(h, (39, 1315, 20, 20), F32, True)[0].seqs       # 78 MiB
    assert "sr" in _plan(h, (9, 93, 20, 20), F32, True)[0].seqs          # one tile: any size
    monkeypatch.setattr(tuning.batchnorm, "SR_TILED_BYTES", 0)
    assert "sr" not in _plan(h, (4, 16, 5, 7), F32, False)[0].seqs
    assert "sr" not in _plan(h, (3, 37, 5, 7), F64, False)[0].seqs
    assert "sr" not in _plan(h, (1, 99, 1, 3), F32, True)[0].seqs  # 3 rows, k = 4
    assert "sr" in _plan(h, (1, 99, 1, 4), F32, True)[0].seqs
    # non-Ex: dx (2040 bytes) holds the constants and one tile's per-channel partials (272 bytes a chunk); with
    # position tiles (C = 299: 1196 per chunk and slot row, 4 of them) 5980 bytes cannot hold them: Ex can
    assert "sr" in _plan(h, (2, 17, 3, 5), F32, False)[0].seqs
    assert "sr" not in _plan(h, (1, 299, 1, 5), F32, False)[0].seqs
    assert "sr" in _plan(h, (1, 299, 1, 5), F32, True)[0].seqs
    d = _nhwc((3, 37, 5, 7), F32)
    g = B._geometry(SPATIAL, (3, 37, 5, 7), {B.OP_X: d.strides, B.OP_Y: d.strides}, 4)
    assert "sr" in B._make_plan(h, "f32", g, "fwd", False).seqs
    assert "sr" not in B._make_plan(h, "f32", g, "infer", False).seqs
    st = (37 * 35 + 3, 1, 37 * 7, 37)  # x with padded images: not packed
    g = B._geometry(SPATIAL, (3, 37, 5, 7), {B.OP_X: st, B.OP_DY: st, B.OP_DX: st}, 4)
    assert g.layout == "gen" or B._sr_geom("f32", g) is None
    monkeypatch.setattr(tuning.batchnorm, "SUPER_ROWS", False)
    assert "sr" not in _plan(h, (3, 37, 5, 7), F32, False)[0].seqs
    assert "sr" not in _plan(h, (3, 37, 5, 7), F32, True)[0].seqs


def test_sr_blocks():
    """Positions per super-row L / VEC: one tile of exactly them (by a power of two) up to 256, else tiles of
    a multiple of 32 threads."""
    class G:
        layout, vec_ok = "rows", False
    for c, tag, want in ((93, "bf16", (93, 2, 1)), (3, "bf16", (3, 64, 1)), (17, "f32", (17, 8, 1)),
                         (477, "f32", (256, 1, 2)), (1315, "f32", (224, 1, 6)), (150, "bf16", (75, 2, 1))):
        g = G()
        g.feats, g.rows, g.ld = c, 1000, {0: c, 3: c, 4: c}
        sg = B._sr_geom(tag, g)
        assert sg[4:] == want, (c, tag, sg)
        assert sg[4] * sg[6] >= sg[1] // B.vec_width(tag, tag)


def test_sr_kernels_compile_without_spills():
    from pydnn._build import cache
    from pydnn._build.manifest import COMMON_OPTIONS
    from pydnn._cuda import nvrtc

    for unit in B.kernel_units():
        exprs = tuple(e for e in unit.exprs if (e.endswith(", 4, true>") and ("::bwd_" in e or "::fwd_" in e))
                      or e.endswith(f"final<float, {B.SR_FINAL}>") or e.endswith(f"final<float, {B.SR_FINAL1}>"))
        if unit.name.endswith("f64"):
            assert not exprs
            continue
        assert len(exprs) == 9, (unit.name, exprs)  # (bwd_sums<T, VEC, 4, true> the ninth)
        text, _ = cache.unit_inputs(unit)
        for arch in ("sm_80", "sm_90"):
            _, lowered, log = nvrtc.compile_cubin(text, unit.source, exprs, arch,
                                                  COMMON_OPTIONS + ("--ptxas-options=-v",), [str(cache.ptx_dir())])
            assert set(lowered) == set(exprs)
            spills = [int(s) for s in re.findall(r"(\d+) bytes spill stores", log)]
            assert len(spills) == 9 and not any(spills), (unit.name, arch, log)


@pytest.mark.parametrize("dims,dtype,wave,plain", [((162, 4, 9, 9), pydnn.PYDNN_DATA_BFLOAT16, 7, 2),
                                                   ((37, 12, 146, 146), pydnn.PYDNN_DATA_HALF, 386, 386),
                                                   ((1, 700, 32, 32), pydnn.PYDNN_DATA_BFLOAT16, 103, 32)])
def test_sr_rounds_wave(dims, dtype, wave, plain, monkeypatch):
    """SR_ROUNDS_WAVE: the backward's SR_MIN_ROUNDS-long stats chunks only down to a chunk per SM (132 on the CPU
    handle) or one step a thread; the forward (one round) is unchanged."""
    monkeypatch.setattr(tuning.batchnorm, "SR_MIN_ROUNDS", 4)
    monkeypatch.setattr(tuning.batchnorm, "SR_TILED_BYTES", 64 << 20)
    monkeypatch.setattr(tuning.batchnorm, "SUPER_ROWS", True)
    h = cpu_handle()
    d = pydnn.create_tensor_descriptor()
    pydnn.set_tensor_nd_descriptor(d, dtype, 4, dims, packed_strides(dims, pydnn.PYDNN_TENSOR_NHWC))
    got = {}
    for w in (True, False):
        monkeypatch.setattr(tuning.batchnorm, "SR_ROUNDS_WAVE", w)
        _, sq, _ = B.plan_summary(h, "bwd", pydnn.PYDNN_BATCHNORM_SPATIAL, d, d, d)
        st = sq["sr"][0]
        assert st[0] == "bwd_stats" and st[4]["chunks"] == st[2][1]
        got[w] = st[2][1]
        _, fq, _ = B.plan_summary(h, "fwd", pydnn.PYDNN_BATCHNORM_SPATIAL, d, d)
        got[("fwd", w)] = fq["sr"][0][2][1]
    assert (got[True], got[False]) == (wave, plain)
    assert got[("fwd", True)] == got[("fwd", False)]
