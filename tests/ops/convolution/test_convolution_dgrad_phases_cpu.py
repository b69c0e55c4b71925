"""Strided backward data as stride-1 phase sub-problems (pydnn/ops/convolution/dgrad_phases.py), on the
CPU: the per-dim phase arithmetic against a literal enumeration of which taps reach which dx position;
every phase plan's real parameter structs run through the kernels' address arithmetic (the emulator of
test_convolution_cpu.py) at the plan's dx / filter offsets, plus dgrad_phase_fill's masks, giving the
float64 reference on odd shapes with stride 2 and 3, padding, dilation, 1-d / 2-d / 3-d, both modes,
NHWC and padded-NHWC dx, grouped (filter_group_pack's copy of each phase's sub-filter emulated too; every
dx element written exactly once); the routing (which problems take the
phases, the kernels the phases get on sm_90 / sm_80, the switch that turns them off, v7's ranking, the
workspace query), and the fill's parameter layout."""
import itertools

import numpy as np
import pytest

import pydnn
from pydnn import tuning
from pydnn.ops.convolution import (algorithms as CA, dgrad_phases as D, grouped as G, plans as CP, problem as CPb,
                                   tensor_core as CT)
from pydnn.reference import convolution as ref
from pydnn.tensor import packed_strides
from test_convolution_cpu import _gather_tensor, _scatter, cdesc, emulate, fdesc, tdesc
from test_fuzz_cpu import cpu_handle

BF16, F16 = pydnn.PYDNN_DATA_BFLOAT16, pydnn.PYDNN_DATA_HALF
NHWC = pydnn.PYDNN_TENSOR_NHWC
CONV, XCORR = pydnn.PYDNN_CONVOLUTION, pydnn.PYDNN_CROSS_CORRELATION
BD1 = pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_1


# ----------------------------------------------------------------------------- the phase arithmetic

@pytest.mark.parametrize("size,filt,pad,stride,dil", [
    (size, filt, pad, stride, dil)
    for size in (1, 2, 5, 8, 13) for filt in (1, 2, 3, 5, 7) for pad in (0, 1, 2, 3, 6)
    for stride in (2, 3, 4) for dil in (1, 2, 3) if (filt - 1) * dil + 1 <= size + 2 * pad])
def test_dim_phases_match_a_literal_enumeration(size, filt, pad, stride, dil):
    """For every dx position x = s * i + ph of one dim: the taps (r, dy position) the phase's sub-problem
    sums (r0 + step * j, i + q - j * dil') are exactly those with (x + pad - r * dil) a multiple of the
    stride and the dy position in range, in the same order of r; empty phases have no such tap."""
    out = (size + 2 * pad - (filt - 1) * dil - 1) // stride + 1
    got = D.dim_phases(size, filt, pad, stride, dil)
    assert [d.ph for d in got] == list(range(min(stride, size)))
    assert sum(d.count for d in got) == size
    for d in got:
        for i in range(d.count):
            x = stride * i + d.ph
            want = [(r, (x + pad - r * dil) // stride) for r in range(filt) if (x + pad - r * dil) % stride == 0]
            subs = [(d.r0 + d.step * j, i + d.q - j * d.dil) for j in range(d.n)]
            assert subs == want, (x, d)
            assert d.empty == (not want)


# ----------------------------------------------------------------------------- plans, emulated

PHASE_CASES = [  # xdims, k, filt, pad, stride, dil, dx layout
    ((2, 8, 13, 11), 16, (3, 3), (1, 1), (2, 2), (1, 1), "nhwc"),     # odd sizes, ResNet's 3x3/2
    ((1, 16, 9, 10), 8, (1, 1), (0, 0), (2, 2), (1, 1), "nhwc"),      # 1x1/2: 3 of 4 phases only filled
    ((2, 8, 11, 7), 24, (3, 2), (2, 0), (3, 2), (1, 1), "pad8"),      # stride 3 and 2, padded NHWC dx
    ((1, 8, 12, 9), 8, (3, 3), (2, 1), (2, 2), (2, 1), "nhwc"),       # dilation 2 with stride 2 (gcd 2)
    ((1, 8, 10, 11), 16, (5, 3), (3, 2), (2, 3), (3, 2), "nhwc"),     # dilation 3 / stride 2, 2 / 3 (coprime)
    ((2, 8, 17), 8, (7,), (3,), (2,), (1,), "nhwc"),                  # 1-d 7/2
    ((1, 8, 5, 6, 7), 16, (2, 3, 3), (1, 1, 0), (2, 2, 3), (1, 1, 1), "nhwc"),   # 3-d
    ((1, 8, 6, 7), 8, (1, 2), (1, 0), (3, 3), (1, 1), "nhwc"),        # filter smaller than the stride
    ((3, 24, 5, 7), 72, (3, 3), (1, 1), (2, 2), (1, 1), "nhwc"),      # C 24 > K tiles, K 72 (a channel tail)
    ((2, 16, 7, 9), 8, (1, 1), (0, 0), (2, 2), (1, 1), "nchw"),       # NCHW dx (dy NHWC): the one-channel fill
]


GROUPED_CASES = [  # xdims, k, filt, pad, stride, dil, dx layout, groups
    ((2, 64, 9, 10), 64, (3, 3), (1, 1), (2, 2), (1, 1), "nhwc", 4),      # P = 4 supergroups of 16 + 16
    ((1, 32, 7, 6), 64, (3, 3), (1, 1), (2, 1), (1, 1), "nhwc", 4),       # K/g 16, C/g 8; stride (2, 1)
    ((2, 32, 8, 9), 32, (1, 1), (0, 0), (2, 2), (1, 1), "nhwc", 2),       # 1x1/2 grouped: one phase + the fill
]


def _dx_strides(xd, layout):
    if layout == "pad8":  # channels innermost with 8 spare channels after each position
        s, acc = [0] * len(xd), xd[1] + 8
        s[1] = 1
        for i in reversed(range(2, len(xd))):
            s[i] = acc
            acc *= xd[i]
        s[0] = acc
        return tuple(s)
    return packed_strides(tuple(xd), pydnn.PYDNN_TENSOR_NCHW if layout == "nchw" else NHWC)


def _phase_problem(case, mode, dtype=BF16, groups=1):
    xd, k, filt, pad, st, dil, layout = case
    c = cdesc(pad, st, dil, mode, groups=groups)
    wd = (k, xd[1] // groups) + filt
    yd = (xd[0], k) + ref.out_dims(xd[2:], filt, pad, st, dil)
    xs, ys = _dx_strides(xd, layout), packed_strides(yd, NHWC)
    return c, xd, wd, yd, xs, ys, tdesc(xd, dtype, strides=xs), tdesc(yd, dtype, strides=ys), fdesc(wd, dtype, fmt=NHWC)


def _emulate_phases(pl, dybuf, wbuf, size):
    """The phase plan's launches on flat float64 buffers: each phase's stride-1 plan (through the kernels'
    address arithmetic, at its dx / filter offsets) writes its sums; the fill marks its positions
    (-> 0.0). Returns the dx buffer (NaN where nothing wrote) after checking no element is written twice."""
    out = np.full(size, np.nan)
    for sp, dx_off, w_off, _ in pl.subs:
        if isinstance(sp, G.GroupedPlan):  # filter_group_pack's copy of the sub-filter, then the supergroups
            got = emulate(sp.sub, CPb.DIR_BWD_DATA, dybuf, _group_pack_emulated(sp.pack, wbuf[w_off:]), size - dx_off)
        elif type(sp) is CP.Plan and "fwd_wgmma<" in sp.gemm_expr:  # the forward of dy, B read from w (BKN)
            got = emulate(sp, CPb.DIR_FWD, dybuf, wbuf[w_off:], size - dx_off)
        else:
            assert type(sp) is CP.Plan, type(sp)
            got = emulate(sp, CPb.DIR_BWD_DATA, dybuf, wbuf[w_off:], size - dx_off)
        wrote = ~np.isnan(got)
        assert np.isnan(out[dx_off:][wrote]).all(), "two phases write one dx element"
        out[dx_off:][wrote] = got[wrote]
    if pl.fill is not None:
        written = _fill_emulated(pl.fill, pl.fill_grid, pl.fill_vec)
        # the one-channel variant (a dx pointer that is not 16-byte aligned) writes the same elements
        assert written == _fill_emulated(pl.fill, None, False)
        for off in written:
            assert np.isnan(out[off]), "the fill writes an element a phase wrote"
            out[off] = 0.0
    return out


def _group_pack_emulated(f, wbuf):
    """filter_group_pack from its ConvAuxParams (in through in_stride), as the kernel indexes."""
    P_, cg2, taps = f.channels, f.channels * f.cg, f.taps
    out = np.zeros(f.groups * f.kg * taps * cg2)
    st = [int(v) for v in f.in_stride]
    for i in range(out.size):
        c2, tap, k = i % cg2, i // cg2 % taps, i // (cg2 * taps)
        if c2 // f.cg == (k // f.kg) % P_:
            q = tap
            s_, q = q % f.filt[2], q // f.filt[2]
            r, t = q % f.filt[1], q // f.filt[1]
            out[i] = wbuf[k * st[0] + (c2 % f.cg) * st[1] + t * st[2] + r * st[3] + s_ * st[4]]
    return out


def _fill_emulated(f, grid, vec):
    """The dx element offsets dgrad_phase_fill writes, from its params and grid as the kernel maps its
    threads: e = block x * 256 + thread -> (w, chunk), h = block y, n * D + d from block z on in steps of
    the grid's z; a VEC chunk is 8 consecutive channels. grid None: the launch's one-channel grid."""
    chunks = f.channels // 8 if vec else f.channels
    if grid is None:
        grid = (-(-f.size[2] * chunks // 256), f.size[1], min(f.batch * f.size[0], 65535))
    assert grid[0] * 256 >= f.size[2] * chunks and grid[1] == f.size[1]
    xs = [int(v) for v in f.xs]
    e = np.arange(grid[0] * 256)
    w, ch = e // chunks, e % chunks
    keep = w < f.size[2]
    w, ch = w[keep], ch[keep]
    out = set()
    for h in range(grid[1]):
        for z in range(grid[2]):
            for nd in range(z, f.batch * f.size[0], grid[2]):
                d, n = nd % f.size[0], nd // f.size[0]
                row = ((int(f.empty[1]) >> (h % f.stride[1])) & 1) | ((int(f.empty[0]) >> (d % f.stride[0])) & 1)
                emp = np.array([bool(row or (int(f.empty[2]) >> int(x % f.stride[2])) & 1) for x in w], bool)
                offs = n * xs[0] + d * xs[2] + h * xs[3] + w[emp] * xs[4] + ch[emp] * (8 if vec else xs[1])
                for o in offs.tolist():
                    out.update(range(o, o + 8) if vec else (o,))
    return out


@pytest.mark.parametrize("case", PHASE_CASES)
@pytest.mark.parametrize("mode", [XCORR, CONV])
@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_phase_plan_emulated(case, mode, arch, rng):
    """The phase plan's structs through the kernels' arithmetic = the float64 reference, every dx
    element written once (NaN-free: the phases and the fill cover dx, none twice)."""
    c, xd, wd, yd, xs, ys, xdsc, ydsc, wdsc = _phase_problem(case, mode)
    h = cpu_handle()
    h.arch, h.sm_count = arch, 132 if arch == "sm_90" else 108
    pl = CP.new_plan(h, CPb.DIR_BWD_DATA, BD1, c, xdsc, wdsc, ydsc)
    assert isinstance(pl, D.PhasePlan) and pl.deterministic and pl.workspace == 0
    assert len(pl.subs) <= int(np.prod(case[4]))
    for sp, _, _, spb in pl.subs:
        assert spb.stride3 == (1, 1, 1) and bool(sp.gemm.flags & CPb.FLAG_FLIP) == (
            mode == XCORR if "fwd_wgmma<" in sp.gemm_expr else mode == CONV)
        assert "bwd_data_tc<" in sp.gemm_expr or "fwd_wgmma<" in sp.gemm_expr or "pipe_tc<1," in sp.gemm_expr
    w, dy = rng.standard_normal(wd), rng.standard_normal(yd)
    size = sum((d - 1) * s for d, s in zip(xd, xs)) + 1
    got = _emulate_phases(pl, _scatter(dy, ys, int(np.prod(yd))), _scatter(w, wdsc.strides, int(np.prod(wd))), size)
    dx = _gather_tensor(got, xd, xs)
    assert not np.isnan(dx).any(), "dx elements no launch writes"
    np.testing.assert_allclose(dx, ref.backward_data_raw(w, dy, xd[2:], case[3], case[4], case[5], 1, mode == XCORR),
                               rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("case", GROUPED_CASES)
@pytest.mark.parametrize("mode", [XCORR, CONV])
@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_grouped_phase_plan_emulated(case, mode, arch, rng, monkeypatch):
    """Grouped strided backward data: each phase a grouped.py plan (its sub-filter packed into supergroups
    by filter_group_pack at the phase's filter offset, then the grouped stride-1 kernel over grid.z), the
    fill for the phases without taps; together the float64 reference, every dx element once (the direct kernel, grouped_direct.py, switched off: its phases are emulated in
    test_convolution_grouped_direct_cpu.py)."""
    monkeypatch.setattr(tuning.conv, "GROUPED_DIRECT", False)
    groups = case[7]
    c, xd, wd, yd, xs, ys, xdsc, ydsc, wdsc = _phase_problem(case[:7], mode, groups=groups)
    h = cpu_handle()
    h.arch, h.sm_count = arch, 132 if arch == "sm_90" else 108
    pl = CP.new_plan(h, CPb.DIR_BWD_DATA, BD1, c, xdsc, wdsc, ydsc)
    assert isinstance(pl, D.PhasePlan) and all(isinstance(sp, G.GroupedPlan) for sp, _, _, _ in pl.subs)
    assert pl.workspace == max(sp.workspace for sp, _, _, _ in pl.subs) > 0
    w, dy = rng.standard_normal(wd), rng.standard_normal(yd)
    size = sum((d - 1) * s for d, s in zip(xd, xs)) + 1
    got = _emulate_phases(pl, _scatter(dy, ys, int(np.prod(yd))), _scatter(w, wdsc.strides, int(np.prod(wd))), size)
    dx = _gather_tensor(got, xd, xs)
    assert not np.isnan(dx).any()
    np.testing.assert_allclose(dx, ref.backward_data_raw(w, dy, xd[2:], case[3], case[4], case[5], groups,
                                                         mode == XCORR), rtol=1e-10, atol=1e-10)


def test_phase_plan_on_wgmma_emulated(rng):
    """sm_90 with K % 64 == 0: the phases with enough K tiles run fwd_wgmma reading the sub-filter from w
    itself (BKN), the 1-tap phases the pipelined or mma.sync kernels; together the reference."""
    case = ((1, 16, 9, 7), 256, (3, 3), (1, 1), (2, 2), (1, 1), "nhwc")
    for mode in (XCORR, CONV):
        c, xd, wd, yd, xs, ys, xdsc, ydsc, wdsc = _phase_problem(case, mode)
        pl = CP.new_plan(cpu_handle(), CPb.DIR_BWD_DATA, BD1, c, xdsc, wdsc, ydsc)
        assert [sp.gemm_expr.endswith(", 1>") and "fwd_wgmma<" in sp.gemm_expr for sp, _, _, _ in pl.subs] == [True] * 4
        w, dy = rng.standard_normal(wd), rng.standard_normal(yd)
        got = _emulate_phases(pl, _scatter(dy, ys, int(np.prod(yd))), _scatter(w, wdsc.strides, int(np.prod(wd))),
                              int(np.prod(xd)))
        np.testing.assert_allclose(_gather_tensor(got, xd, xs),
                                   ref.backward_data_raw(w, dy, xd[2:], (1, 1), (2, 2), (1, 1), 1, mode == XCORR),
                                   rtol=1e-10, atol=1e-10)


# ----------------------------------------------------------------------------- routing

def _resnet_l3(h, n=128, cc=256, hw=28, r=3, s=2, p=1, k=None):
    k = k or cc
    o = (hw + 2 * p - r) // s + 1
    x, y = tdesc((n, cc, hw, hw), BF16, NHWC), tdesc((n, k, o, o), BF16, NHWC)
    return cdesc((p, p), (s, s), (1, 1)), x, fdesc((k, cc, r, r), BF16, NHWC), y


def test_routing_and_switch(monkeypatch):
    """Strided tensor-core backward data takes the phases (ALGO_1; v7 ranks it first, deterministic, no
    workspace; the workspace query agrees); stride 1, fp32 data, NCHW dy and groups do not; the switch
    off gives the stride-s bwd_data_tc back."""
    monkeypatch.setattr(tuning.conv, "DGRAD_TMA", False)   # the stride-1 plan compared below: fwd_wgmma's own
    monkeypatch.setattr(tuning.conv, "DGRAD_TMA_PHASES", False)   # the phases' fwd_wgmma plans themselves
    h = cpu_handle()
    c, x, w, y = _resnet_l3(h)
    pl = CP.new_plan(h, CPb.DIR_BWD_DATA, BD1, c, x, w, y)
    assert isinstance(pl, D.PhasePlan) and len(pl.subs) == 4 and pl.fill is None
    # the phases' sub-filters: 1x1, 1x2, 2x1, 2x2 taps of the 3x3 (pad 1: even dx rows take the middle tap)
    assert sorted(spb.filt3 for _, _, _, spb in pl.subs) == [(1, 1, 1), (1, 1, 2), (1, 2, 1), (1, 2, 2)]
    assert all("fwd_wgmma<" in sp.gemm_expr for sp, _, _, _ in pl.subs)
    r = pydnn.get_convolution_backward_data_algorithm_v7(h, w, y, c, x, 6)
    assert r[0].algo == BD1 and r[0].memory == 0 and r[0].determinism == pydnn.PYDNN_DETERMINISTIC
    assert pydnn.get_convolution_backward_data_workspace_size(h, w, y, c, x, BD1) == 0
    # fwd_wgmma through the swapped filter: each phase's copy in the same workspace, the largest reported
    monkeypatch.setattr(tuning.conv, "WGM_BWD_SWAP", True)
    sw = CP.new_plan(h, CPb.DIR_BWD_DATA, BD1, c, x, w, y)
    assert all(isinstance(sp, CT.BwdWgmmaPlan) for sp, _, _, _ in sw.subs)
    assert sw.workspace == max(sp.workspace for sp, _, _, _ in sw.subs) == -(-4 * 256 * 256 * 2 // 256) * 256
    h.prepared.clear()
    assert pydnn.get_convolution_backward_data_workspace_size(h, w, y, c, x, BD1) == sw.workspace
    monkeypatch.setattr(tuning.conv, "WGM_BWD_SWAP", False)
    monkeypatch.setattr(tuning.conv, "DGRAD_PHASES", False)
    old = CP.new_plan(h, CPb.DIR_BWD_DATA, BD1, c, x, w, y)
    assert type(old) is CP.Plan and "bwd_data_tc<" in old.gemm_expr
    # the model's time of the phases is below the stride-s kernel's (it wastes 3 of 4 gathers)
    monkeypatch.setattr(tuning.conv, "DGRAD_PHASES", True)
    assert CA._estimate_ms(h, pl) < CA._estimate_ms(h, old)
    # stride 1: the stride-1 plan itself
    c1, x1, w1, y1 = _resnet_l3(h, s=1)
    assert type(CP.new_plan(h, CPb.DIR_BWD_DATA, BD1, c1, x1, w1, y1)) is CP.Plan
    # fp32: not on tensor cores (ALGO_1's other candidates answer)
    xf, yf = tdesc((2, 16, 9, 9), pydnn.PYDNN_DATA_FLOAT, NHWC), tdesc((2, 16, 5, 5), pydnn.PYDNN_DATA_FLOAT, NHWC)
    wf = fdesc((16, 16, 3, 3), pydnn.PYDNN_DATA_FLOAT, NHWC)
    try:
        pf = CP.new_plan(h, CPb.DIR_BWD_DATA, BD1, cdesc((1, 1), (2, 2), (1, 1)), xf, wf, yf)
        assert not isinstance(pf, D.PhasePlan)
    except pydnn.PydnnError as e:
        assert e.status == pydnn.PYDNN_STATUS_NOT_SUPPORTED


def test_one_by_one_stride_two_fill(monkeypatch):
    """1x1 stride 2 without padding: one phase (even rows, even columns) is a GEMM into every other
    pixel; the other three only get the fill, whose masks name the odd residues."""
    monkeypatch.setattr(tuning.conv, "DGRAD_TMA_PHASES", False)   # (the phase's fwd_wgmma params read below)
    h = cpu_handle()
    c, x, w, y = _resnet_l3(h, n=32, cc=256, hw=56, r=1, s=2, p=0, k=512)
    pl = CP.new_plan(h, CPb.DIR_BWD_DATA, BD1, c, x, w, y)
    assert isinstance(pl, D.PhasePlan) and len(pl.subs) == 1
    sp, dx_off, w_off, spb = pl.subs[0]
    assert (dx_off, w_off) == (0, 0) and spb.in3 == (1, 28, 28) and spb.filt3 == (1, 1, 1)
    assert list(sp.gemm.ys if "fwd_wgmma<" in sp.gemm_expr else sp.gemm.xs)[3:] == [2 * 56 * 256, 2 * 256]
    f = pl.fill
    assert [int(v) for v in f.empty] == [0, 0b10, 0b10] and [int(v) for v in f.stride] == [1, 2, 2]
    assert (f.batch, f.channels) == (32, 256) and pl.fill_elems == 32 * 256 * (56 * 56 - 28 * 28)
    # NHWC dx: 16 bytes a thread, rows of W x C / 8 threads, one block row per h, ~16 blocks an SM over n x d
    assert pl.fill_vec and pl.fill_expr == D.fill_expr("bf16", 1) and pl.fill.chunks == 32
    assert pl.fill_grid == (56 * 32 // 256, 56, -(-16 * 132 // (7 * 56)))


def test_fill_params_layout_registered():
    """DgradFillParams is in the kernel-parameter registry that tests/kernels/test_params_layout.py checks
    against ptx/conv_dgrad_params.h, and its unit is in the family's units (f16 / bf16)."""
    from pydnn._build.params import REGISTRY
    assert ("conv_dgrad_params.h", "DgradFillParams", D.DgradFillParams) in REGISTRY
    names = {u.name: u for u in CP.kernel_units("conv_dgrad.")}
    assert set(names) == {"conv_dgrad.f16", "conv_dgrad.bf16"}
    assert names["conv_dgrad.bf16"].exprs == (D.fill_expr("bf16", 1), D.fill_expr("bf16", 0))


@pytest.mark.parametrize("mode", [XCORR, CONV])
def test_fill_grid_walks_several_rows_a_thread(mode, rng):
    """A fill grid with fewer z blocks than n x d rows (one SM's worth: each thread walks every row): the
    emulated fill still covers exactly the tapless phases."""
    case = ((3, 16, 9, 10), 8, (1, 1), (0, 0), (2, 2), (1, 1), "nhwc")
    c, xd, wd, yd, xs, ys, xdsc, ydsc, wdsc = _phase_problem(case, mode)
    h = cpu_handle()
    h.sm_count = 1
    pl = CP.new_plan(h, CPb.DIR_BWD_DATA, BD1, c, xdsc, wdsc, ydsc)
    assert pl.fill_grid[2] < 3   # (z blocks 0 walks rows 0 and 2)
    w, dy = rng.standard_normal(wd), rng.standard_normal(yd)
    got = _emulate_phases(pl, _scatter(dy, ys, int(np.prod(yd))), _scatter(w, wdsc.strides, int(np.prod(wd))),
                          int(np.prod(xd)))
    np.testing.assert_allclose(_gather_tensor(got, xd, xs),
                               ref.backward_data_raw(w, dy, xd[2:], (0, 0), (2, 2), (1, 1), 1, mode == XCORR),
                               rtol=1e-10, atol=1e-10)
