"""Batch norm's nc kernels (packed NCHW / NCDHW SPATIAL: nc_stats over items of a channel, fwd_final /
bwd_final<A, true>, the flat nc_apply, nc_head) on the CPU: which calls take them and with what launches
and scratch, the Ex workspace sizes, that every instantiation compiles for sm_80 and sm_90 without
spills, and numpy emulations of their addressing (each item's VEC-aligned slots cover exactly its elements;
the items of a channel cover its planes once; part_count<true> is each item's element count; nc_apply's
per-lane channel) and of the statistics' order against numpy."""
import re

import numpy as np
import pytest

import pydnn
from pydnn import tuning
from pydnn.ops import batchnorm as B
from pydnn.tensor import packed_strides
from test_fuzz_cpu import _desc, cpu_handle

F32, F64, F16, BF16 = (pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DATA_DOUBLE, pydnn.PYDNN_DATA_HALF,
                       pydnn.PYDNN_DATA_BFLOAT16)
SPATIAL, PER_ACT = pydnn.PYDNN_BATCHNORM_SPATIAL, pydnn.PYDNN_BATCHNORM_PER_ACTIVATION
OPS_BN = pydnn.PYDNN_BATCHNORM_OPS_BN
VEC = {F32: 4, F64: 2, F16: 8, BF16: 8}
ISZ = {F32: 4, F64: 8, F16: 2, BF16: 2}


def _nchw(dims, dtype):
    return _desc(dims, dtype, packed_strides(dims, pydnn.PYDNN_TENSOR_NCHW))


def _summary(h, direction, d, ex=False):
    others = (d,) if direction != "bwd" else (d, d)
    return B.plan_summary(h, direction, SPATIAL, d, *others, ex=ex)


@pytest.fixture(autouse=True)
def _no_nc_res(monkeypatch):
    monkeypatch.setattr(tuning.batchnorm, "NC_RES", False)  # (packed NCHW up to NC_RES_MAX: nc_res, its own tests)


@pytest.mark.parametrize("direction", ["fwd", "bwd", "infer"])
def test_nc_plans(direction, monkeypatch):
    h = cpu_handle()
    monkeypatch.setattr(tuning.batchnorm, "NC_GEN_ROWS", 0)  # small N * H * W too (the rule: below)
    for dims, dtype in (((243, 555, 81, 81), F16), ((5, 1481, 23, 23), F32), ((187, 3, 81, 81), F16),
                        ((2, 127, 17, 17), BF16), ((3, 5, 4, 6, 7), F64), ((1, 4, 181, 181), F32)):
        d = _nchw(dims, dtype)
        layout, sq, ws = _summary(h, direction, d)
        v = VEC[dtype]
        total = int(np.prod(dims))
        assert layout == "gen" and ws == 0
        assert {f"nc{v}", "nc1"} <= set(sq), (dims, sq)
        seq = sq[f"nc{v}"]
        if direction == "infer":
            (k, vec, grid, block, f), = seq
            assert (k, vec, f["row_begin"], f["row_end"]) == ("nc_apply", v, 0, total)
            assert grid[0] * f["chunk_rows"] >= total // v and block == (256, 1, 1)
            continue
        names = [lc[0] for lc in seq]
        assert names == ["nc_stats", f"{direction}_final", "nc_apply", "nc_head"]
        stats, final, apply, head = seq
        c = dims[1]
        nper = stats[4]["chunks"]
        assert stats[2] == (nper * c, 1, 1) and final[4]["chunks"] == nper
        cbytes = c * 4 * (8 if dtype == F64 else 4)
        want_head = -(-(-(-cbytes // ISZ[dtype])) // 16) * 16
        assert head[4] == {"row_begin": 0, "row_end": want_head} and head[2] == (1, 1, 1)
        assert head[1] == v and head[3] == (512, 1, 1) and want_head % 16 == 0
        assert apply[4]["row_begin"] == want_head and apply[4]["row_end"] == total
        if direction == "fwd":  # the saved-statistics apply: every element, no head
            assert [lc[0] for lc in sq[f"nc{v}s"]] == ["nc_stats", "fwd_final", "nc_apply"]
            assert sq[f"nc{v}s"][2][4]["row_begin"] == 0
        # Ex: the workspace holds constants and partials; no head
        layout, sq, ws = _summary(h, direction, d, ex=True)
        pslot = (2 if direction == "fwd" else 4) * (8 if dtype == F64 else 4)
        assert ws == -(-cbytes // 256) * 256 + nper * c * pslot
        assert [lc[0] for lc in sq[f"nc{v}"]] == ["nc_stats", f"{direction}_final", "nc_apply"]
    # not taken: NHWC, per-activation, padded NCHW, one channel, tiny tensors (non-Ex), the switch off
    nhwc = _desc((4, 8, 5, 5), BF16, packed_strides((4, 8, 5, 5), pydnn.PYDNN_TENSOR_NHWC))
    assert not any(k.startswith("nc") for k in _summary(h, direction, nhwc)[1])
    padded = _desc((2, 3, 4, 5), F32, (70, 20, 5, 1))
    assert not any(k.startswith("nc") for k in _summary(h, direction, padded)[1])
    others = (_nchw((4, 8, 4, 4), BF16),) * (1 if direction != "bwd" else 2)
    assert not any(k.startswith("nc") for k in B.plan_summary(h, direction, PER_ACT, _nchw((4, 8, 4, 4), BF16),
                                                               *others)[1])
    if direction != "infer":
        tiny = _nchw((1, 300, 2, 2), F16)  # 1200 elements: 2400 bytes hold less than 300 channels' constants
        assert not any(k.startswith("nc") for k in _summary(h, direction, tiny)[1])
        assert "nc8" in _summary(h, direction, tiny, ex=True)[1]
        monkeypatch.setattr(tuning.batchnorm, "NC_GEN_ROWS", 2048)  # the default: forward of N * H * W <= 2048
        assert ("nc8" in _summary(h, direction, _nchw((21, 413, 9, 9), F16))[1]) == (direction == "bwd")
        assert ("nc8" in _summary(h, direction, _nchw((21, 3, 9, 9), F16))[1]) == (direction == "bwd")
        assert "nc8" in _summary(h, direction, _nchw((26, 3, 9, 9), F16))[1]  # 2106 rows
        monkeypatch.setattr(tuning.batchnorm, "NC_GEN_ROWS", 0)
    monkeypatch.setattr(tuning.batchnorm, "NCHW_SPLIT", False)
    assert not any(k.startswith("nc") for k in _summary(h, direction, _nchw((243, 555, 81, 81), F16))[1])


def test_nc_workspace_queries_match_plans(monkeypatch):
    h = cpu_handle()
    monkeypatch.setattr(tuning.batchnorm, "NC_GEN_ROWS", 0)
    for dims, dtype in (((7, 5, 9, 11), F16), ((2, 300, 3, 3), F32), ((4, 6, 2, 3, 5), F64)):
        d = _nchw(dims, dtype)
        bd = pydnn.create_tensor_descriptor()
        pydnn.derive_bn_tensor_descriptor(bd, d, SPATIAL)
        got = pydnn.get_batch_normalization_forward_training_ex_workspace_size(h, SPATIAL, OPS_BN, d, None, d, bd,
                                                                               None)
        assert got == _summary(h, "fwd", d, ex=True)[2] > 0
        got = pydnn.get_batch_normalization_backward_ex_workspace_size(h, SPATIAL, OPS_BN, d, d, d, None, d, bd, None)
        assert got == _summary(h, "bwd", d, ex=True)[2] > 0


def test_nc_compile_for_sm80_and_sm90():
    from pydnn._build import cache
    from pydnn._build.manifest import COMMON_OPTIONS
    from pydnn._cuda import nvrtc

    for unit in B.kernel_units():
        exprs = tuple(e for e in unit.exprs if ("::nc_" in e and "::nc_res<" not in e) or e.endswith("final<float, true>")
                      or e.endswith("final<double, true>"))  # (the super-row kernels: test_batchnorm_sr_cpu.py)
        assert len(exprs) == 22, (unit.name, exprs)  # (BWD_SUMS: nc_stats<.., true, true>, nc_apply kNcBwdSaved; 2 widths)
        text, _ = cache.unit_inputs(unit)
        for arch in ("sm_80", "sm_90"):
            _, lowered, log = nvrtc.compile_cubin(text, unit.source, exprs, arch,
                                                  COMMON_OPTIONS + ("--ptxas-options=-v",), [str(cache.ptx_dir())])
            assert set(lowered) == set(exprs)
            spills = [int(v) for v in re.findall(r"(\d+) bytes spill stores", log)]
            assert len(spills) >= len(exprs) and not any(spills), (unit.name, arch, log)


# ------------------------------------------------------------------ emulations

def _items(h, dims, dtype):
    n, c = dims[0], dims[1]
    hw = int(np.prod(dims[2:]))
    g, k, ln, nper = B._nc_items(h, n, c, hw, VEC[dtype])
    return n, c, hw, g, k, ln, nper


def _part_count(n, hw, g, k, ln, j):
    ng, kk = divmod(j, k)
    return min(g, n - ng * g) * min(ln, hw - kk * ln)


def _slots(n, c, hw, g, k, ln, vec, item):
    """nc_stats' slots of block `item`: [(address, lo, hi)] in slot order."""
    j, ch = divmod(item, c)
    ng, kk = divmod(j, k)
    n0, gc = ng * g, min(g, n - ng * g)
    s0 = kk * ln
    length = min(ln, hw - s0)
    wp = length if vec == 1 else (length + 2 * vec - 2) // vec
    out = []
    for w in range(gc * wp):
        gg, q = divmod(w, wp)
        base = ((n0 + gg) * c + ch) * hw + s0
        end = base + length
        a = (base // vec) * vec + q * vec
        out.append((a, max(0, min(vec, base - a)), max(0, min(vec, end - a))))
    return out


@pytest.mark.parametrize("dims,dtype,sms", [((7, 5, 9, 11), F16, 132), ((2, 3, 181, 181), F32, 132),
                                            ((300, 2, 3, 3), BF16, 132), ((4, 6, 2, 3, 5), F64, 132),
                                            ((3, 4, 45, 45), F16, 2), ((9, 7, 1, 2), F32, 132)])
def test_emulated_nc_stats(dims, dtype, sms, rng):
    """Every element of x is in exactly one slot lane of one item of its channel; full slots are
    VEC-aligned; the items' counts are part_count<true>'s; the statistics in the kernel's order (threads
    of kNcU slots per Chan batch, the block's fixed tree, then the items merged in order) give numpy's."""
    h = cpu_handle()
    h.sm_count = sms
    vec = VEC[dtype]
    n, c, hw, g, k, ln, nper = _items(h, dims, dtype)
    total = n * c * hw
    assert ln % vec == 0 or k == 1
    xv = (rng.normal(size=total) * 3 + 5).reshape(n, c, hw)
    flat = xv.ravel()
    seen = np.zeros(total, int)
    for ch in range(c):
        stats = []
        for j in range(nper):
            item = j * c + ch
            slots = _slots(n, c, hw, g, k, ln, vec, item)
            cnt = 0
            for a, lo, hi in slots:
                if lo == 0 and hi == vec:
                    assert a % vec == 0
                for e in range(lo, hi):
                    seen[a + e] += 1
                    assert ((a + e) // hw) % c == ch
                cnt += max(0, hi - lo)
            assert cnt == _part_count(n, hw, g, k, ln, j)
            # the kernel's order: thread t takes slots t, t + T, ...; kNcU of them per batch
            T, U = B.NC_THREADS, B.NC_U
            threads = []
            for t in range(T):
                nn = m = m2 = 0.0
                for w0 in range(t, len(slots), T * U):
                    vals = [flat[a + e] for w in range(w0, min(len(slots), w0 + T * U), T)
                            for a, lo, hi in [slots[w]] for e in range(lo, hi)]
                    if not vals:
                        continue
                    vals = np.array(vals)
                    nb, mb = float(len(vals)), vals.mean()
                    qb = ((vals - mb) ** 2).sum()
                    tot = nn + nb
                    dd, ff = mb - m, nb / tot
                    m, m2, nn = m + dd * ff, m2 + qb + dd * dd * nn * ff, tot
                threads.append([nn, m, m2])
            s = T // 2
            while s:
                for t in range(s):
                    a, b = threads[t], threads[t + s]
                    if b[0]:
                        tot = a[0] + b[0]
                        dd, ff = b[1] - a[1], b[0] / tot
                        threads[t] = [tot, a[1] + dd * ff, a[2] + b[2] + dd * dd * a[0] * ff]
                s //= 2
            assert threads[0][0] == cnt
            stats.append(threads[0])
        nn = m = m2 = 0.0
        for j, (nb, mb, qb) in enumerate(stats):  # fwd_final's merge (chunk order; its lanes only regroup it)
            tot = nn + nb
            dd, ff = mb - m, nb / tot
            m, m2, nn = m + dd * ff, m2 + qb + dd * dd * nn * ff, tot
        want = xv[:, ch, :]
        assert nn == want.size
        np.testing.assert_allclose(m, want.mean(), rtol=1e-12)
        np.testing.assert_allclose(m2 / nn, want.var(), rtol=1e-10)
    assert (seen == 1).all()


@pytest.mark.parametrize("total_dims,vec,begin", [((3, 5, 3), 8, 0), ((2, 3, 7), 4, 16), ((4, 2, 1 * 2), 8, 0),
                                                  ((5, 3, 13), 2, 4), ((1, 7, 9), 8, 32),
                                                  # HW = 1: batchnorm's flat apply of NHWC rows (ROWS_FLAT),
                                                  # rows x C with the channel = i % C, C odd
                                                  ((169, 477, 1), 4, 1908), ((13, 93, 1), 8, 64),
                                                  ((7, 75, 1), 8, 0), ((3, 50, 1), 4, 200)])
def test_emulated_nc_apply_channels(total_dims, vec, begin):
    """nc_apply's vectors (and the last, partial one in VEC = 1 lanes) cover [begin, total) once, each lane
    with its channel (i / HW) % C, as the kernel derives it (the vector's first lane, then the plane steps)."""
    n, c, hw = total_dims
    total = n * c * hw
    got = {}
    wfull = total // vec
    for w in range(begin // vec, -(-total // vec)):
        if w >= wfull:
            for i in range(w * vec, total):
                got[i] = (i // hw) % c
            continue
        i0 = w * vec
        plane = i0 // hw
        r, ch = i0 - plane * hw, plane % c
        for e in range(vec):
            if r == hw:
                r, ch = 0, (0 if ch + 1 == c else ch + 1)
            r += 1
            assert i0 + e not in got
            got[i0 + e] = ch
    assert sorted(got) == list(range(begin, total))
    assert all(ch == (i // hw) % c for i, ch in got.items())
