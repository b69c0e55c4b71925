"""Pooling's p2t_bwd (max backward of NCHW-like layouts over a shared-memory tile of covering windows) on the
CPU: which calls take it and with which bands, that every instantiation compiles for sm_80 and sm_90 without
spills, and an emulation of its launch (blocks over (plane, band), phase 1 a winner per covering window,
phase 2 a gather per dx element, the kernel's 32-bit arithmetic) against the float64 reference, every dx
element written once, the windows a block holds within P2T_WIN."""
import re

import numpy as np
import pytest

from pydnn import tuning
from pydnn.ops import pooling as P
import test_pooling_cpu as T
from test_pooling_p2_cpu import _i32, _kernels

F32, F64, F16, BF16 = T.F32, T.F64, T.F16, T.BF16
MAX, INC, EXC, MAXD = T.MAX, T.INC, T.EXC, T.MAXD
NOPROP, PROP = T.NOPROP, T.PROP


def test_p2t_plans(monkeypatch):
    for dt in (F32, F16, BF16, F64):  # the sweep's NCHW max 3x3/2 backward points
        assert _kernels((101, 38, 50, 50), ((3, 3), (1, 1), (2, 2)), dt=dt) == (["p2_fwd"], ["p2t_bwd"])
        assert _kernels((2, 168, 55, 55), ((3, 3), (1, 1), (2, 2)), dt=dt) == (["p2_fwd"], ["p2t_bwd"])
    # averages, channels-last, small planes, windows over 3 keep p2_bwd
    assert _kernels((151, 279, 11, 11), ((2, 2), (0, 0), (2, 2)), kmode=INC) == (["p2_fwd"], ["p2_bwd"])
    assert _kernels((2, 5, 40, 40), ((3, 3), (1, 1), (2, 2)), layout="nhwc") == (["p2_fwd"], ["p2_bwd"])
    assert _kernels((2, 8, 16, 16), ((3, 3), (1, 1), (2, 2))) == (["p2_fwd"], ["p2_bwd"])  # 256 < P2T_MIN_PLANE
    assert _kernels((2, 8, 40, 40), ((4, 4), (1, 1), (2, 2))) == (["fwd"], ["p2_bwd"])
    monkeypatch.setattr(tuning.pooling, "P2T_BWD", False)
    assert _kernels((101, 38, 50, 50), ((3, 3), (1, 1), (2, 2))) == (["p2_fwd"], ["p2_bwd"])


def _geo(xdims, win, pad, stride):
    ins = (1,) * (5 - len(xdims)) + tuple(xdims[2:])
    outs = tuple(T.ref.pooled_size(n, w, p, s) for n, w, p, s in zip(ins[2:], win, pad, stride))
    one = lambda v, f: (f,) * (3 - len(v)) + tuple(v)  # noqa: E731
    return (ins[2:], one(outs, 1) if len(outs) == 3 else (1,) + outs, one(win, 1), one(pad, 0), one(stride, 1))


def test_p2t_bands():
    # whole planes when they fit and give enough blocks; bands of >= 1024 elements when planes are few
    assert P._p2t_band(((1, 50, 50), (1, 25, 25), (1, 3, 3), (0, 1, 1), (1, 2, 2)), 3838) == (50, 1)
    th, nb = P._p2t_band(((1, 224, 224), (1, 112, 112), (1, 3, 3), (0, 1, 1), (1, 2, 2)), 2)
    assert th * 224 <= P.P2T_ELEMS and nb == -(-224 // th) and th * 224 >= 1024
    # every band's windows within P2T_WIN: a wide plane
    th, nb = P._p2t_band(((1, 64, 2000), (1, 32, 1000), (1, 3, 3), (0, 1, 1), (1, 2, 2)), 100)
    assert th == 2 and nb == 32  # two rows (stride 2) meet 2 window rows: 2000 windows
    assert P._p2t_band(((1, 64, 3000), (1, 32, 1500), (1, 3, 3), (0, 1, 1), (1, 2, 2)), 100) is None


def test_p2t_compile_for_sm80_and_sm90():
    from pydnn._build import cache
    from pydnn._build.manifest import COMMON_OPTIONS
    from pydnn._cuda import nvrtc

    for unit in P.kernel_units():
        exprs = tuple(e for e in unit.exprs if "::p2t_" in e)
        assert len(exprs) == 1, unit.name
        text, _ = cache.unit_inputs(unit)
        for arch in ("sm_80", "sm_90"):
            _, lowered, log = nvrtc.compile_cubin(text, unit.source, exprs, arch,
                                                  COMMON_OPTIONS + ("--ptxas-options=-v",), [str(cache.ptx_dir())])
            assert set(lowered) == set(exprs)
            spills = [int(v) for v in re.findall(r"(\d+) bytes spill stores", log)]
            assert spills and not any(spills), (unit.name, arch, log)


def _cov(p, k, e):
    return T._covering(p, k, e)


def _emulate_p2t(lc, mem):
    """p2t_bwd block by block with the kernel's arithmetic."""
    p = lc.params
    assert "::p2t_bwd<" in lc.expr and lc.vec == 1 and p.mode == 0
    bands, th = p.div[0], p.div[1]
    C, H, W, OW = p.size[1], p.size[3], p.size[4], p.out_dim[2]
    out, written = mem["out"], np.zeros(len(mem["out"]), int)
    assert lc.grid[0] == p.size[0] * C * bands
    for blk in range(lc.grid[0]):
        plane, band = blk // bands, blk % bands
        n, c = plane // C, plane % C
        h0 = band * th
        h1 = min(h0 + th, H)
        ohlo, ohhi = _cov(p, 1, h0)[0], _cov(p, 1, h1 - 1)[1]
        nwin = (ohhi - ohlo + 1) * OW if ohhi >= ohlo else 0
        assert nwin <= P.P2T_WIN
        xb, gb, yb = (_i32(n * p.xs[0] + c * p.xs[1]), _i32(n * p.ps[0] + c * p.ps[1]),
                      _i32(n * p.ys[0] + c * p.ys[1]))
        s_win, s_g = [None] * nwin, [None] * nwin
        for t in range(nwin):
            r = t // OW
            ow, oh = t - r * OW, ohlo + r
            hlo, hhi = T._window(p, 1, oh)
            wlo, whi = T._window(p, 2, ow)
            assert hhi - hlo <= 3 and whi - wlo <= 3
            mv = mem["y"][yb + oh * p.ys[3] + ow * p.ys[4]]
            win = -1
            for k in reversed(range(9)):
                a, b = k // 3, k % 3
                if hlo + a < hhi and wlo + b < whi:
                    v = mem["x"][xb + (hlo + a) * p.xs[3] + (wlo + b) * p.xs[4]]
                    if T._match(np.array([v]), np.array([mv]))[0]:
                        win = (hlo + a) * W + wlo + b
            s_win[t], s_g[t] = win, mem["dy"][gb + oh * p.ps[3] + ow * p.ps[4]]
        for t in range((h1 - h0) * W):
            r = t // W
            w, h = t - r * W, h0 + r
            ehlo, ehhi = _cov(p, 1, h)
            ewlo, ewhi = _cov(p, 2, w)
            acc = 0.0
            for i in range(2):
                for j in range(2):
                    if ehlo + i <= ehhi and ewlo + j <= ewhi:
                        k = (ehlo + i - ohlo) * OW + ewlo + j
                        assert 0 <= k < nwin
                        if s_win[k] == h * W + w:
                            acc += s_g[k]
            a = _i32(n * p.os[0] + c * p.os[1] + h * p.os[3] + w * p.os[4])
            old = out[a]
            out[a] = p.alpha * acc + (p.beta * old if p.flags & 1 else 0)
            written[a] += 1
    return written


@pytest.mark.parametrize("layout", ["nchw", "gapsw"])
@pytest.mark.parametrize("mode,nan", [(MAX, NOPROP), (MAXD, PROP)])
def test_emulated_p2t(mode, nan, layout, rng, monkeypatch):
    """Small planes forced onto p2t (P2T_MIN_PLANE 1) with small tiles (P2T_WIN / P2T_ELEMS) so that planes
    split into bands: emulated, against the reference (small-integer x with ties and NaN; blended)."""
    from test_pooling_p2_cpu import _emulate_p2
    emulate = T._emulate
    bands = []  # (bands per plane) of each p2t launch

    def dispatch(lc, mem, itemsize, backward):
        if "::p2t_" in lc.expr:
            assert backward
            bands.append(lc.params.div[0])
            return _emulate_p2t(lc, mem)
        if "::p2_" in lc.expr:  # the forward; a backward whose band does not fit the small caps
            return _emulate_p2(lc, mem, backward)
        raise AssertionError(f"not a p2 / p2t launch: {lc.expr}")

    monkeypatch.setattr(T, "_emulate", dispatch)
    monkeypatch.setattr(tuning.pooling, "P2T_MIN_PLANE", 1)
    try:
        for win_cap, elems in ((2048, 8192), (12, 24), (5, 9)):
            monkeypatch.setattr(P, "P2T_WIN", win_cap)
            monkeypatch.setattr(P, "P2T_ELEMS", elems)
            for xdims, g in (((2, 3, 7, 8), ((3, 3), (1, 1), (2, 2))), ((1, 2, 9, 7), ((2, 2), (0, 0), (2, 2))),
                             ((2, 2, 5, 6), ((2, 3), (1, 1), (1, 2))), ((2, 3, 9), ((3,), (1,), (2,))),
                             ((1, 2, 8, 9), ((3, 3), (0, 0), (3, 3))), ((1, 2, 11, 4), ((3, 3), (1, 1), (2, 2))),
                             ((1, 1, 10, 5), ((1, 1), (0, 0), (2, 2)))):
                geo = ("pool",) + g
                for alpha, beta in ((1.0, 0.0), (-1.5, 0.5)):
                    got = T._run_emulated("pool", mode, nan, F32, xdims, T._ydims(xdims, geo), layout, geo, rng,
                                          alpha=alpha, beta=beta, misalign=True)
                    assert got == {False: 1, True: 1}
        assert len(bands) >= 30 and max(bands) >= 3, bands  # p2t taken, planes split into bands
    finally:
        monkeypatch.setattr(T, "_emulate", emulate)
