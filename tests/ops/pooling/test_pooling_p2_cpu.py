"""Pooling's p2 kernels (p2_fwd / p2_bwd: 2-d non-adaptive pooling on the scalar path of NCHW-like layouts, a
thread per element) on the CPU: which calls take them, that every instantiation compiles for sm_80 and sm_90
without spills, and an emulation of each launch with the kernels' own arithmetic (four 32-bit divisions per
item, the predicated window, the covering windows in (oh, ow) order with the first-match rule, 32-bit
offsets) against the float64 reference, every element written once."""
import re

import numpy as np
import pytest

from pydnn import tuning
from pydnn.ops import pooling as P
import test_pooling_cpu as T
from test_fuzz_cpu import _desc, cpu_handle

F32, F64, F16, BF16 = T.F32, T.F64, T.F16, T.BF16
MAX, INC, EXC, MAXD = T.MAX, T.INC, T.EXC, T.MAXD
NOPROP, PROP = T.NOPROP, T.PROP


def _kernels(xdims, g, layout="nchw", dt=BF16, kmode=MAX):
    h = cpu_handle()
    geo = ("pool",) + g
    yd_ = T._ydims(xdims, geo)
    xd, yd = _desc(xdims, dt, T._layout(xdims, layout)), _desc(yd_, dt, T._layout(yd_, layout))
    pd = T._poolnd(kmode, NOPROP, *g)
    fwd = P.plan_summary(h, yd, xd, geometry=P._validate_fwd("pool", pd, xd, yd))
    bwd = P.plan_summary(h, xd, xd, yd, kmode=P.KMODE[kmode], geometry=P._validate_bwd("pool", pd, yd, yd, xd, xd))
    name = lambda rows: [r[0].split("<")[0].split("::")[-1] for r in rows]  # noqa: E731
    return name(fwd), name(bwd)


def test_p2_plans(monkeypatch):
    monkeypatch.setattr(tuning.pooling, "P2T_BWD", False)  # p2t_bwd's own plans: test_pooling_p2t_cpu.py
    # the sweep's NCHW pools: max 3x3/2 pad 1, average 2x2/2 on odd sizes; both directions, every dtype
    for dt in (F32, F16, BF16, F64):
        assert _kernels((101, 38, 50, 50), ((3, 3), (1, 1), (2, 2)), dt=dt) == (["p2_fwd"], ["p2_bwd"])
        # channels-last with channels off the vector: p2 along c
        assert _kernels((10, 933, 13, 13), ((2, 2), (0, 0), (2, 2)), layout="nhwc", dt=dt, kmode=INC) == (
            ["p2_fwd"], ["p2_bwd"])
        assert _kernels((151, 279, 11, 11), ((2, 2), (0, 0), (2, 2)), dt=dt, kmode=INC) == (["p2_fwd"], ["p2_bwd"])
    assert _kernels((2, 8, 16, 16), ((2, 2), (0, 0), (1, 1)), kmode=EXC) == (["p2_fwd"], ["p2_bwd"])  # 2 covering
    assert _kernels((2, 3, 19), ((3,), (1,), (2,))) == (["p2_fwd"], ["p2_bwd"])                  # 1-d
    assert _kernels((2, 6, 8, 16), ((3, 3), (1, 1), (2, 2)), layout="gapsw") == (["p2_fwd"], ["p2_bwd"])
    # win2 keeps its windows (the demo's 2x2/2), p2 the unaligned fallback
    assert _kernels((256, 64, 32, 32), ((2, 2), (0, 0), (2, 2))) == (["win2_fwd", "p2_fwd"], ["win2_bwd", "p2_bwd"])
    # not p2: 3 covering windows (backward only), windows over 3 (forward only), 3-d, channels-last, off
    assert _kernels((2, 8, 9, 9), ((3, 3), (1, 1), (1, 1))) == (["p2_fwd"], ["bwd"])
    assert _kernels((2, 8, 9, 9), ((4, 4), (1, 1), (2, 2))) == (["fwd"], ["p2_bwd"])
    assert _kernels((1, 3, 5, 6, 7), ((3, 2, 2), (0, 1, 1), (1, 2, 3))) == (["fwd"], ["bwd"])
    f, b = _kernels((2, 16, 9, 9), ((3, 3), (1, 1), (2, 2)), layout="nhwc")  # vectors first, p2 (along c) unaligned
    assert f[-1] == "p2_fwd" and b[-1] == "p2_bwd" and "p2_fwd" not in f[:-1] and "p2_bwd" not in b[:-1]
    monkeypatch.setattr(tuning.pooling, "P2_CLAST", False)
    assert _kernels((2, 5, 9, 9), ((3, 3), (1, 1), (2, 2)), layout="nhwc") == (["fwd"], ["bwd"])
    monkeypatch.setattr(tuning.pooling, "P2_BWD", False)  # the backward only
    assert _kernels((101, 38, 50, 50), ((3, 3), (1, 1), (2, 2))) == (["p2_fwd"], ["bwd"])
    monkeypatch.setattr(tuning.pooling, "P2_BWD", True)
    monkeypatch.setattr(tuning.pooling, "P2", False)
    assert _kernels((101, 38, 50, 50), ((3, 3), (1, 1), (2, 2))) == (["fwd"], ["bwd"])


def test_p2_compile_for_sm80_and_sm90():
    from pydnn._build import cache
    from pydnn._build.manifest import COMMON_OPTIONS
    from pydnn._cuda import nvrtc

    for unit in P.kernel_units():
        exprs = tuple(e for e in unit.exprs if "::p2_" in e)
        assert len(exprs) == 8, unit.name
        text, _ = cache.unit_inputs(unit)
        for arch in ("sm_80", "sm_90"):
            _, lowered, log = nvrtc.compile_cubin(text, unit.source, exprs, arch,
                                                  COMMON_OPTIONS + ("--ptxas-options=-v",), [str(cache.ptx_dir())])
            assert set(lowered) == set(exprs)
            spills = [int(v) for v in re.findall(r"(\d+) bytes spill stores", log)]
            assert len(spills) >= 8 and not any(spills), (unit.name, arch, log)


def _i32(v):
    assert -2**31 <= v < 2**31
    return v


def _emulate_p2(lc, mem, backward):
    """p2_fwd / p2_bwd over every item with the kernel's arithmetic."""
    p = lc.params
    prop = bool(p.flags & 2)
    targs = lc.expr[lc.expr.index("<") + 1:-1].split(", ")
    is_max, clast = targs[1] == "true", len(targs) > 2 and targs[2] == "true"
    assert lc.vec == 1 and is_max == (p.mode == 0) and p.total < 2**31
    out, written = mem["out"], np.zeros(len(mem["out"]), int)
    W, H, C = p.size[4], p.size[3], p.size[1]
    for item in range(p.total):
        if clast:  # c fastest, then w, h, n
            q = item // C
            c = item - q * C
            r = q // W
            w = q - r * W
            n = r // H
            h = r - n * H
        else:  # w fastest, then h, c, n
            row = item // W
            w = item - row * W
            nc = row // H
            h = row - nc * H
            n = nc // C
            c = nc - n * C
        if not backward:
            hlo, hhi = T._window(p, 1, h)
            wlo, whi = T._window(p, 2, w)
            first = _i32(n * p.xs[0] + c * p.xs[1]) + hlo * p.xs[3] + wlo * p.xs[4]
            vals = [mem["x"][first + i * p.xs[3] + j * p.xs[4]] for i in range(3) for j in range(3)
                    if hlo + i < hhi and wlo + j < whi]
            assert len(vals) == (hhi - hlo) * (whi - wlo)  # the window fits 3 x 3
            if is_max:
                r = vals[0]
                for v in vals[1:]:
                    r = np.maximum(r, v) if prop else np.fmax(r, v)
            else:
                r = sum(vals) / (p.win[1] * p.win[2] if p.mode == 1 else (hhi - hlo) * (whi - wlo))
        else:
            ohlo, ohhi = T._covering(p, 1, h)
            owlo, owhi = T._covering(p, 2, w)
            assert ohhi - ohlo < 2 and owhi - owlo < 2  # at most kP2Cov per dim
            xnc = _i32(n * p.xs[0] + c * p.xs[1])
            gb, yb = _i32(n * p.ps[0] + c * p.ps[1]), _i32(n * p.ys[0] + c * p.ys[1])
            xe = mem["x"][xnc + h * p.xs[3] + w * p.xs[4]] if is_max else 0.0
            r = 0.0
            for i in range(2):
                for j in range(2):
                    if not (ohlo + i <= ohhi and owlo + j <= owhi):
                        continue
                    oh, ow = ohlo + i, owlo + j
                    hlo, hhi = T._window(p, 1, oh)
                    wlo, whi = T._window(p, 2, ow)
                    g = mem["dy"][gb + oh * p.ps[3] + ow * p.ps[4]]
                    if is_max:
                        mv = mem["y"][yb + oh * p.ys[3] + ow * p.ys[4]]
                        if not T._match(np.array([xe]), np.array([mv]))[0]:
                            continue
                        mine = True
                        for hh in range(hlo, h + 1):
                            for ww in range(wlo, whi if hh < h else w):
                                if T._match(np.array([mem["x"][xnc + hh * p.xs[3] + ww * p.xs[4]]]), np.array([mv]))[0]:
                                    mine = False
                                    break
                            if not mine:
                                break
                        if mine:
                            r += g
                    else:
                        cnt = p.win[1] * p.win[2] if p.mode == 1 else (hhi - hlo) * (whi - wlo)
                        r += g * (1.0 / cnt)
        a = _i32(n * p.os[0] + c * p.os[1] + h * p.os[3] + w * p.os[4])
        old = out[a]
        out[a] = p.alpha * r + (p.beta * old if p.flags & 1 else 0)
        written[a] += 1
    return written


@pytest.mark.parametrize("layout", ["nchw", "gapsw", "nhwc", "gaps"])
@pytest.mark.parametrize("mode,nan", [(MAX, NOPROP), (MAXD, PROP), (INC, NOPROP), (EXC, NOPROP)])
def test_emulated_p2(mode, nan, layout, rng, monkeypatch):
    """The scalar launch of NCHW calls is p2's: emulated, against the reference (small-integer x with ties
    and NaN; blended)."""
    emulate = T._emulate

    def dispatch(lc, mem, itemsize, backward):
        if "::p2_" in lc.expr:
            return _emulate_p2(lc, mem, backward)
        raise AssertionError(f"not a p2 launch: {lc.expr}")

    monkeypatch.setattr(T, "_emulate", dispatch)
    try:
        for xdims, g in (((2, 3, 7, 8), ((3, 3), (1, 1), (2, 2))), ((1, 2, 9, 7), ((2, 2), (0, 0), (2, 2))),
                         ((2, 2, 5, 6), ((2, 3), (1, 1), (1, 2))), ((2, 3, 9), ((3,), (1,), (2,))),
                         ((1, 2, 8, 9), ((3, 3), (0, 0), (3, 3)))):
            geo = ("pool",) + g
            for alpha, beta in ((1.0, 0.0), (-1.5, 0.5)):
                got = T._run_emulated("pool", mode, nan, F32, xdims, T._ydims(xdims, geo), layout, geo, rng,
                                      alpha=alpha, beta=beta, misalign=True)
                assert got == {False: 1, True: 1}
    finally:
        monkeypatch.setattr(T, "_emulate", emulate)
