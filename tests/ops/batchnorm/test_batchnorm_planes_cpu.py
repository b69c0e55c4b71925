"""Batch norm's planes kernels (fwd_planes / bwd_planes: the gen kernels with 16-byte vectors along a
contiguous innermost reduction dim, e.g. NCHW SPATIAL) on the CPU: which calls take them, that every
instantiation compiles for sm_80 and sm_90 without spills, and an emulation of their addressing (each
feature's vectors cover exactly its elements, aligned) and of the forward statistics' order (per-thread
Chan batches of kUnroll vectors, then the block's fixed tree) against numpy."""
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
VEC = {F32: 4, F64: 2, F16: 8, BF16: 8}
UNROLL = 4  # kUnroll


def _nchw(dims, dtype):
    return _desc(dims, dtype, packed_strides(dims, pydnn.PYDNN_TENSOR_NCHW))


def _gapped(dims, dtype):
    """NCHW with rows padded by 8 elements, planes by 16 and samples by 32."""
    st, inner = [1], 1
    for k, gap in zip(range(len(dims) - 1, 0, -1), (8, 16, 32)):
        inner = inner * dims[k] + gap
        st.append(inner)
    return _desc(dims, dtype, tuple(st[::-1]))


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_planes_plans(direction, monkeypatch):
    h = cpu_handle()
    monkeypatch.setattr(tuning.batchnorm, "NCHW_SPLIT", False)  # packed NCHW takes the nc kernels by default

    def seqs(d, dtype=None):
        others = (d,) if direction == "fwd" else (d, d)
        return B.plan_summary(h, direction, SPATIAL, d, *others)

    for dims, dtype, blocks in (((256, 64, 32, 32), BF16, 64), ((256, 128, 16, 16), BF16, 128),
                                ((8, 16, 10, 10), F32, 16), ((3, 5, 4, 4), F64, 5), ((2, 3, 4, 2), F16, 3)):
        layout, sq, ws = seqs(_nchw(dims, dtype))
        assert layout == "gen" and ws == 0 and set(sq) == {"gen", "planes"}, (dims, sq)
        (kernel, vec, grid, block, _), = sq["planes"]
        n = dims[0] * dims[2] * dims[3] // VEC[dtype]
        assert (kernel, vec, grid) == (f"{direction}_planes", VEC[dtype], (blocks, 1, 1))
        assert block == (max(32, min(512, 1 << (n - 1).bit_length())), 1, 1)
    assert "planes" in seqs(_gapped((2, 3, 4, 16), BF16))[1]
    # H * W not a multiple of the vector, channels-last, per-activation rows, the switch off: no planes
    assert set(seqs(_nchw((2, 3, 5, 5), BF16))[1]) == {"gen"}
    assert set(seqs(_nchw((2, 3, 5, 6), F32))[1]) == {"gen"}
    nhwc = _desc((2, 8, 4, 4), BF16, packed_strides((2, 8, 4, 4), pydnn.PYDNN_TENSOR_NHWC))
    assert "planes" not in seqs(nhwc)[1]
    assert "planes" not in B.plan_summary(h, direction, PER_ACT, _nchw((4, 8, 4, 4), BF16),
                                          *((_nchw((4, 8, 4, 4), BF16),) * (1 if direction == "fwd" else 2)))[1]
    monkeypatch.setattr(tuning.batchnorm, "PLANES", False)
    assert set(seqs(_nchw((256, 64, 32, 32), BF16))[1]) == {"gen"}


def test_planes_compile_for_sm80_and_sm90():
    from pydnn._build import cache
    from pydnn._build.manifest import COMMON_OPTIONS
    from pydnn._cuda import nvrtc

    for unit in B.kernel_units():
        exprs = tuple(e for e in unit.exprs if "_planes<" in e)
        assert len(exprs) == 2, unit.name
        text, _ = cache.unit_inputs(unit)
        for arch in ("sm_80", "sm_90"):
            _, lowered, log = nvrtc.compile_cubin(text, unit.source, exprs, arch,
                                                  COMMON_OPTIONS + ("--ptxas-options=-v",), [str(cache.ptx_dir())])
            assert set(lowered) == set(exprs)
            spills = [int(v) for v in re.findall(r"(\d+) bytes spill stores", log)]
            assert len(spills) == 2 and not any(spills), (unit.name, arch, log)


def _geom(desc):
    ops = {B.OP_X: desc.strides, B.OP_Y: desc.strides}
    return B._geometry(SPATIAL, desc.dims, ops, VEC[desc.dtype])


def _feat_off(g, f):
    off = 0
    for d in range(len(g.fsize) - 1, -1, -1):
        f, c = divmod(f, g.fsize[d])
        off += c * g.fstride[B.OP_X][d]
    return off


def _red_off(g, i):
    off = 0
    for d in range(len(g.rsize) - 1, -1, -1):
        i, c = divmod(i, g.rsize[d])
        off += c * g.rstride[B.OP_X][d]
    return off


@pytest.mark.parametrize("dims,dtype,layout", [((4, 3, 4, 8), BF16, "nchw"), ((3, 5, 2, 6), F32, "nchw"),
                                               ((2, 3, 4, 16), BF16, "gapped"), ((5, 2, 3, 2), F64, "gapped")])
def test_emulated_planes(dims, dtype, layout, rng):
    """Each feature's vectors (item i: reduction index i * VEC) cover exactly its elements at VEC-aligned
    offsets; the forward's statistics in the kernel's order (threads G, kUnroll vectors per Chan batch, the
    fixed tree) give numpy's mean and variance."""
    d = (_nchw if layout == "nchw" else _gapped)(dims, dtype)
    g = _geom(d)
    vec = VEC[dtype]
    assert B._planes_ok(g, vec)
    span = sum((n - 1) * s for n, s in zip(d.dims, d.strides)) + 1
    mem = np.full(span, np.nan)
    xv = rng.normal(size=dims) * 3 + 1
    np.lib.stride_tricks.as_strided(mem, dims, [s * 8 for s in d.strides])[...] = xv
    nv = g.rows // vec
    G = max(32, min(B.PLANES_THREADS, 1 << (nv - 1).bit_length()))
    for f in range(g.feats):
        fo = _feat_off(g, f)
        offs = [fo + _red_off(g, i * vec) for i in range(nv)]
        assert all(o % vec == 0 for o in offs)
        got = sorted(o + e for o in offs for e in range(vec))
        want = sorted(fo + _red_off(g, j) for j in range(g.rows))
        assert got == want
        threads = []
        for t in range(G):  # per thread: kUnroll vectors per batch, merged with Chan's formula
            n = m = m2 = 0.0
            for i0 in range(t, nv, G * UNROLL):
                vals = np.concatenate([mem[offs[i]:offs[i] + vec] for i in range(i0, min(nv, i0 + UNROLL * G), G)])
                nb, mb = float(len(vals)), vals.mean()
                qb = ((vals - mb) ** 2).sum()
                nn = n + nb
                dd, ff = mb - m, nb / nn
                m, m2, n = m + dd * ff, m2 + qb + dd * dd * n * ff, nn
            threads.append([n, m, m2])
        s = G // 2
        while s:  # the block's fixed tree
            for t in range(s):
                a, b = threads[t], threads[t + s]
                if b[0]:
                    nn = a[0] + b[0]
                    dd, ff = b[1] - a[1], b[0] / nn
                    threads[t] = [nn, a[1] + dd * ff, a[2] + b[2] + dd * dd * a[0] * ff]
            s //= 2
        n, m, m2 = threads[0]
        ch = xv[:, f]
        assert n == ch.size
        np.testing.assert_allclose(m, ch.mean(), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(m2 / n, ch.var(), rtol=1e-12)
