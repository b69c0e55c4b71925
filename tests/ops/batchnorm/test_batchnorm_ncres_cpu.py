"""CPU: batch norm's nc_res (a packed NCHW channel in one block's registers, tuning.batchnorm.NC_RES): which calls
plan and pick it (training forward and backward, packed NCHW / NCDHW, N * H * W <= NC_RES_MAX, not f64, not
inference, not NHWC / padded), its launch shape (PER elements a thread, blocks of whole warps, a block per
channel), that its kernels compile for sm_80 / sm_90 (sm_90 without spills), and a numpy emulation of its
incremental (plane, offset) walk: every element of a channel exactly once, at the packed NCHW offset."""
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
SPATIAL, PER_ACT = pydnn.PYDNN_BATCHNORM_SPATIAL, pydnn.PYDNN_BATCHNORM_PER_ACTIVATION


@pytest.fixture(autouse=True)
def _defaults(monkeypatch):
    monkeypatch.setattr(tuning.batchnorm, "NC_RES", True)
    monkeypatch.setattr(tuning.batchnorm, "NC_RES_MAX", 16384)
    monkeypatch.setattr(tuning.batchnorm, "NCHW_SPLIT", True)


def _plan(dims, dtype, direction, fmt=pydnn.PYDNN_TENSOR_NCHW, strides=None, ex=False, mode=SPATIAL):
    d = pydnn.create_tensor_descriptor()
    pydnn.set_tensor_nd_descriptor(d, dtype, len(dims), dims, strides or packed_strides(dims, fmt))
    tag = B.TAG[dtype]
    outs = (B.OP_Y,) if direction in ("fwd", "infer") else (B.OP_DY, B.OP_DX)
    ops = {B.OP_X: d.strides, **{k: d.strides for k in outs}}
    return B._make_plan(cpu_handle(), tag, B._geometry(mode, dims, ops, B.vec_width(tag, tag)), direction, ex)


def _want(m):
    """(PER, threads) of the register-resident form for m elements a channel."""
    for per, cap in ((4, 128), (8, 512), (16, 1024)):
        t = -(-(-(-m // per)) // 32) * 32
        if t <= cap:
            return per, t
    return None


REGS = {("fwd", 4): 32, ("fwd", 8): 32, ("fwd", 16): 64, ("bwd", 4): 32, ("bwd", 8): 56, ("bwd", 16): 64}


def _bpsm(threads, regs):
    return max(1, min(2048 // threads, 32, 65536 // (threads * regs)))


def _want_launch(m, c, direction, sms=132, wave=True, su=1, wide=True):
    """(u, threads): the resident form where its blocks hold every channel in one wave (or NC_RES_WAVE off), else
    the streaming form (4 a thread, (512 with NC_RES_STREAM_WIDE,) 256 / 128 / 64 threads: the first that keeps one
    wave, else 64; the registers of SU 1 / SU 4's kernels)."""
    per, t = _want(m)
    b = "true" if direction == "bwd" else "false"
    if not wave or c <= sms * _bpsm(t, REGS[direction, per]):
        return f"{per}, {b}", t
    sr = {("fwd", 1): 32, ("bwd", 1): 48, ("fwd", 4): 40, ("bwd", 4): 56}[direction, su]
    for st in ((512,) if wide else ()) + (256, 128, 64):
        st = min(st, -(-(-(-m // 4)) // 32) * 32)
        if c <= sms * _bpsm(st, sr):
            break
    return f"4, {b}, true" + (", 1" if su == 1 else ""), st  # (NC_RES_SU 1, the default: one element a step)


CASES = [((5, 1481, 23, 23), F32), ((1, 306, 99, 99), BF16), ((4, 256, 64, 64), BF16), ((4, 139, 64, 64), F16), ((2, 3, 77, 77), BF16), ((21, 413, 9, 9), F16),
         ((72, 37, 8, 8), F16), ((14, 6, 10, 10), F32), ((2, 4, 3, 5, 7), BF16), ((1, 2, 1, 2), F32),
         ((4, 8, 64, 64), F32), ((3, 5, 7, 9), F16)]


@pytest.mark.parametrize("ex", [False, True])
@pytest.mark.parametrize("direction", ["fwd", "bwd"])
@pytest.mark.parametrize("dims,dtype", CASES)
def test_ncres_plans_and_pick(dims, dtype, direction, ex):
    pl = _plan(dims, dtype, direction, ex=ex)
    n, c = dims[0], dims[1]
    m = n * int(np.prod(dims[2:]))
    seq = pl.seqs["ncr"]
    assert len(seq) == 1
    lc = seq[0]
    u, threads = _want_launch(m, c, direction)
    assert (lc.kernel, lc.vec, lc.grid, lc.block, lc.fields, lc.u) == ("nc_res", None, (c, 1, 1), (threads, 1, 1), {}, u)
    per = int(u.split(",")[0])
    stream = u.endswith(", true, true, 1") or u.endswith(", false, true, 1")
    assert (per * threads >= m or stream) and threads % 32 == 0
    assert threads <= B.NC_RES_THREADS
    with tuning.override({"batchnorm.NC_RES_WAVE": False}):
        lr = _plan(dims, dtype, direction, ex=ex).seqs["ncr"][0]
        assert (lr.u, lr.block[0]) == _want_launch(m, c, direction, wave=False)
    with tuning.override({"batchnorm.NC_RES_SU": 4}):  # (the streaming form loading 4 elements a step)
        l4 = _plan(dims, dtype, direction, ex=ex).seqs["ncr"][0]
        assert (l4.u, l4.block[0]) == _want_launch(m, c, direction, su=4)
        assert B._expr(l4.kernel, pl.tag, l4.vec, l4.u) in set(next(u for u in B.kernel_units()
                                                                   if u.name == pl.unit).exprs)
    with tuning.override({"batchnorm.NC_RES_STREAM_WIDE": False}):  # (no 512-thread streaming blocks)
        lw = _plan(dims, dtype, direction, ex=ex).seqs["ncr"][0]
        assert (lw.u, lw.block[0]) == _want_launch(m, c, direction, wide=False)
    assert (pl.params.nc_n, pl.params.nc_hw) == (n, int(np.prod(dims[2:])))
    exprs = set(next(u for u in B.kernel_units() if u.name == pl.unit).exprs)
    assert B._expr(lc.kernel, pl.tag, lc.vec, lc.u) in exprs
    # picked for any pointers, scratch usable or not, tiny or not (before GEN_TINY)
    for ptrs, ok in (((256, 512, 1024, 0), True), ((2, 6, 10, 0), False), ((256, 512, 1024, 0), False)):
        assert B._pick(pl, ptrs, ok, 0) is seq
    if direction == "bwd":  # (no sums form: the kernel takes the saved statistics itself)
        assert id(seq) not in pl.sums and id(seq) not in pl.sums0
    with tuning.override({"batchnorm.NC_RES": False}):  # (read per call too)
        assert B._pick(pl, (256, 512, 1024, 0), True, 0) is not seq


@pytest.mark.parametrize("direction", ["fwd", "bwd", "infer"])
def test_ncres_not_taken(direction):
    def has(pl):
        return "ncr" in pl.seqs
    assert has(_plan((5, 1481, 23, 23), F32, direction)) == (direction != "infer")
    assert not has(_plan((5, 6, 23, 23), F64, direction))                        # double: not instantiated
    assert not has(_plan((5, 6, 23, 23), F32, direction, pydnn.PYDNN_TENSOR_NHWC))  # NHWC: the rows layout
    assert not has(_plan((2, 3, 4, 5), F32, direction, strides=[70, 20, 5, 1]))  # padded NCHW
    assert not has(_plan((4, 8, 4, 4), BF16, direction, mode=PER_ACT))
    assert not has(_plan((2, 5, 91, 91), F32, direction))                        # 16562 elements a channel
    assert has(_plan((2, 5, 90, 90), F32, direction)) == (direction != "infer")  # 16200
    with tuning.override({"batchnorm.NC_RES_MAX": 4096}):
        assert not has(_plan((1, 306, 99, 99), BF16, direction))
        assert has(_plan((1, 306, 64, 64), BF16, direction)) == (direction != "infer")
    with tuning.override({"batchnorm.NC_RES": False}):
        assert not has(_plan((5, 1481, 23, 23), F32, direction))


def _walk(n, hw, g, per):
    """nc_res's (plane, offset) walk per thread, as the kernel steps it: {(t, k): (plane, offset)} for j < m."""
    m = n * hw
    qg, rg = g // hw, g % hw
    out = {}
    for t in range(g):
        pn, s = t // hw, t % hw
        for k in range(per):
            if t + k * g < m:
                out[(t, k)] = (pn, s)
            s += rg
            pn += qg
            if s >= hw:
                s -= hw
                pn += 1
    return out


@pytest.mark.parametrize("n,hw", [(5, 529), (1, 9801), (2, 5929), (21, 81), (72, 64), (14, 100), (300, 9), (2, 2),
                                  (1, 16384), (3, 1), (7, 1000)])
@pytest.mark.parametrize("stream", [False, True])
def test_ncres_walk_covers_each_element_once(n, hw, stream):
    """(stream: 4 elements a thread in registers, then the same walk continued past them, as nc_res<.., true>'s
    passes go on from element 4 G + t.)"""
    m = n * hw
    per, g = _want(m)
    if stream:
        g = 64
        per = -(-m // g)
    w = _walk(n, hw, g, per)
    seen = sorted(pn * hw + s for pn, s in w.values())
    assert seen == list(range(m))
    for (t, k), (pn, s) in w.items():
        j = t + k * g
        assert (pn, s) == divmod(j, hw) and 0 <= s < hw
    c, ch = 7, 3  # the packed NCHW offset of channel ch: base ch * hw, plane stride c * hw (32-bit)
    offs = [ch * hw + pn * c * hw + s for pn, s in w.values()]
    assert sorted(offs) == sorted(ch * hw + q * c * hw + r for q in range(n) for r in range(hw))


@pytest.mark.parametrize("unit_name", ["batchnorm.f32", "batchnorm.bf16", "batchnorm.f16"])
def test_ncres_kernels_compile(unit_name):
    import re

    from pydnn._build import cache
    from pydnn._build.manifest import COMMON_OPTIONS
    from pydnn._cuda import nvrtc

    unit = next(u for u in B.kernel_units() if u.name == unit_name)
    exprs = tuple(e for e in unit.exprs if "::nc_res<" in e)
    assert len(exprs) == 2 * len(B.NC_RES_PER) + 4  # (+ the STREAM forms, SU 4 and 1)
    text, _ = cache.unit_inputs(unit)
    for arch in ("sm_80", "sm_90"):
        _, lowered, log = nvrtc.compile_cubin(text, unit.source, exprs, arch, COMMON_OPTIONS + ("--ptxas-options=-v",),
                                              [str(cache.ptx_dir())])
        assert set(lowered) == set(exprs)
        # spill stores per kernel (each "Compiling entry function" line, then its properties)
        per = dict(re.findall(r"Compiling entry function '(\w+)'.*?\n.*?\n.*?(\d+) bytes spill stores", log))
        assert len(per) >= len(exprs), log
        if arch == "sm_90":  # (sm_80: bf16 <16, true> spills 12 bytes at the 64-register cap)
            assert not any(int(v) for v in per.values()), log
    assert not any(e for e in next(u for u in B.kernel_units() if u.name == "batchnorm.f64").exprs if "::nc_res<" in e)


def _emulate_fwd(x, scale, bias, alpha, beta, y0, factor, rm, rv, eps):
    """nc_res<T, PER, false>'s arithmetic per channel (float64; ma: the mean rounded to float)."""
    C = x.shape[1]
    xs = np.moveaxis(x, 1, 0).reshape(C, -1)
    m = xs.shape[1]
    md = xs.sum(axis=1) / m
    ma = md.astype(np.float32).astype(np.float64)
    e = md - ma
    m2 = np.maximum(0.0, ((xs - ma[:, None]) ** 2).sum(axis=1) - m * e * e)
    var = m2 / m
    invstd = 1.0 / np.sqrt(var + eps)
    unb = m2 / (m - 1) if m > 1 else var
    nrm, nrv = (1 - factor) * rm + factor * md, (1 - factor) * rv + factor * unb
    sh = (1, C) + (1,) * (x.ndim - 2)
    y = alpha * ((x - md.reshape(sh)) * (scale * invstd).reshape(sh) + bias.reshape(sh))
    if beta != 0:
        y = y + beta * y0
    return y, nrm, nrv, md, invstd


def _emulate_bwd(x, dy, scale, ad, bd, ap, bp, dx0, ds0, db0, eps, smean, sinv):
    C = x.shape[1]
    xs, ys = np.moveaxis(x, 1, 0).reshape(C, -1), np.moveaxis(dy, 1, 0).reshape(C, -1)
    m = xs.shape[1]
    if smean is not None:
        md = smean.astype(np.float64)
        ma = md
    else:
        md = xs.sum(axis=1) / m
        ma = md.astype(np.float32).astype(np.float64)
    d = xs - ma[:, None]
    sy, sxy, q = ys.sum(axis=1), (ys * d).sum(axis=1), (d * d).sum(axis=1)
    e = md - ma
    m2 = np.maximum(0.0, q - m * e * e)
    invstd = sinv.astype(np.float64) if smean is not None else 1.0 / np.sqrt(m2 / m + eps)
    dgamma = (sxy - e * sy) * invstd
    ds, db = ap * dgamma, ap * sy
    if bp != 0:
        ds, db = ds + bp * ds0, db + bp * db0
    k1 = ad * scale * invstd
    c1, c3 = -k1 * invstd * dgamma / m, sy / m
    sh = (1, C) + (1,) * (x.ndim - 2)
    dx = k1.reshape(sh) * (dy - c3.reshape(sh)) + c1.reshape(sh) * (x - md.reshape(sh))
    if bd != 0:
        dx = dx + bd * dx0
    return dx, ds, db


@pytest.mark.parametrize("dims", [(5, 7, 23, 23), (1, 3, 99, 99), (3, 5, 7, 9), (2, 4, 3, 5, 7), (1, 2, 1, 2)])
def test_ncres_arithmetic_against_reference(dims):
    """The kernel's finishes (res_fwd_finish / res_bwd_finish: the sums about the float-rounded mean, corrected by
    e = md - ma; dscale / dbias; the constants k1, k2, mean, mean dy) reproduce pydnn.reference.batchnorm."""
    from pydnn.reference import batchnorm as ref

    rng = np.random.default_rng(7)
    C = dims[1]
    x = rng.uniform(-3, 3, dims) + 5.0
    dy, y0, dx0 = rng.standard_normal(dims), rng.standard_normal(dims), rng.standard_normal(dims)
    pshape = (1, C) + (1,) * (len(dims) - 2)
    scale, bias = rng.uniform(0.5, 1.5, C), rng.standard_normal(C)
    rm, rv = rng.standard_normal(C), rng.uniform(0.5, 2.0, C)
    ds0, db0 = rng.standard_normal(C), rng.standard_normal(C)
    eps = 1e-5
    for alpha, beta, factor in ((1.0, 0.0, 0.1), (0.5, -0.75, 1.0)):
        y, nrm, nrv, md, inv = _emulate_fwd(x, scale, bias, alpha, beta, y0, factor, rm, rv, eps)
        wy, wrm, wrv, wm, winv, _ = ref.forward_training(SPATIAL, alpha, beta, x, y0 if beta else None,
                                                         scale.reshape(pshape), bias.reshape(pshape), factor,
                                                         rm.reshape(pshape), rv.reshape(pshape), eps)
        np.testing.assert_allclose(y, wy, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(nrm, np.ravel(wrm), rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(nrv, np.ravel(wrv), rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(md, np.ravel(wm), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(inv, np.ravel(winv), rtol=1e-9)
    sm, si = md.astype(np.float32), inv.astype(np.float32)
    for saved in (True, False):
        for ad, bd, ap, bp in ((1.0, 0.0, 1.0, 0.0), (0.5, 0.25, 2.0, -1.0)):
            smn, sin = (sm, si) if saved else (None, None)
            dx, ds, db = _emulate_bwd(x, dy, scale, ad, bd, ap, bp, dx0, ds0, db0, eps, smn, sin)
            w = ref.backward(SPATIAL, ad, bd, ap, bp, x, dy, dx0 if bd else None, scale.reshape(pshape),
                             ds0.reshape(pshape) if bp else None, db0.reshape(pshape) if bp else None, eps,
                             sm.reshape(pshape).astype(np.float64) if saved else None,
                             si.reshape(pshape).astype(np.float64) if saved else None)
            np.testing.assert_allclose(dx, w[0], rtol=1e-8, atol=1e-9)
            np.testing.assert_allclose(ds, np.ravel(w[1]), rtol=1e-8, atol=1e-8)
            np.testing.assert_allclose(db, np.ravel(w[2]), rtol=1e-8, atol=1e-8)


@pytest.mark.parametrize("n,hw,G", [(5, 529, 64), (1, 9801, 256), (4, 4096, 256), (2, 5929, 128), (3, 37, 64),
                                    (1, 300, 64)])
def test_ncres_stream_passes_cover_each_element_once(n, hw, G):
    """nc_res<T, 4, .., true>'s passes as the kernel runs them: the 4 register elements a thread (t + k G), then
    res_stream_load's steps of kResSU = 4 elements from j1 + t (j1 = 4 G), the walk advanced kResSU a call, the
    output pass's walk copied before each load step: every element once per pass, at its packed offset."""
    m, per, su = n * hw, 4, 4

    class Walk:
        def __init__(self, j0):
            self.qg, self.rg = divmod(G, hw)
            self.n, self.s = divmod(j0, hw)

        def off(self):
            return self.n * hw + self.s

        def next(self):
            self.s += self.rg
            self.n += self.qg
            if self.s >= hw:
                self.s -= hw
                self.n += 1

    def stream_load(w, j, mm):  # -> offsets loaded (u with j + u G < mm)
        offs = []
        for _ in range(su):
            offs.append(w.off())
            w.next()
        return [o for u, o in enumerate(offs) if j + u * G < mm]

    sums, outs = [], []
    for t in range(G):
        w = Walk(t)  # the register loop
        regs = []
        for k in range(per):
            if t + k * G < m:
                regs.append(w.off())
            w.next()
        ws = Walk(per * G + t)  # a sums pass
        j = per * G + t
        while j < m:
            sums += stream_load(ws, j, m)
            j += su * G
        for o in regs:  # the output pass: registers, then the stream from where the register walk stopped
            outs.append(o)
        j = per * G + t
        while j < m:
            w0 = Walk(0)
            w0.n, w0.s, w0.qg, w0.rg = w.n, w.s, w.qg, w.rg
            got = stream_load(w, j, m)
            for u in range(su):
                if j + u * G < m:
                    outs.append(w0.off())
                w0.next()
            assert got == outs[-len(got):] if got else True
            j += su * G
        sums += regs
    assert sorted(sums) == list(range(m)) and sorted(outs) == list(range(m))


@pytest.mark.parametrize("dims,dtype,direction,want,off", [
    ((2, 477, 13, 13), F32, "bwd", 128, 512),   # the mid-session run's points (H200: the fastest of those timed)
    ((4, 200, 8, 8), F16, "bwd", 256, 256),
    ((20, 300, 4, 4), F32, "fwd", 256, 512),
    ((51, 175, 2, 2), BF16, "fwd", 256, 256),
    ((1, 1000, 7, 7), F32, "bwd", 64, 64),
    ((2, 2048, 7, 7), F32, "bwd", 64, 128),     # shared memory caps 64 and 32 alike (10 an SM): the more threads
    ((1, 4000, 2, 2), F32, "fwd", 32, 32),
    ((9, 3, 40, 40), F32, "fwd", 1024, 1024),   # (few features: one wave at the cap)
])
def test_gen_wave_threads(dims, dtype, direction, want, off):
    """GEN_WAVE: the gen kernels' block (on 132 SMs, sm_90): the most threads (a row each at most) of the fewest
    waves, down to 4 rows a thread; off: a row a thread."""
    pl = _plan(dims, dtype, direction, fmt=pydnn.PYDNN_TENSOR_NHWC)
    assert [(lc.kernel, lc.block) for lc in pl.seqs["gen"]] == [(f"{direction}_fused_gen", (want, 1, 1))]
    with tuning.override({"batchnorm.GEN_WAVE": False}):
        assert _plan(dims, dtype, direction, fmt=pydnn.PYDNN_TENSOR_NHWC).seqs["gen"][0].block == (off, 1, 1)
