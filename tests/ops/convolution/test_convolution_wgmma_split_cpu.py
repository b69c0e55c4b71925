"""fwd_wgmma's split-K on the CPU (tensor_core.split_wgmma, ptx/convolution.cu fwd_wgmma's FLAG_PARTIAL and
fwd_split_fold): which plans the model splits (the sweep's few-block layers, not the large ones), that
only a call's own plan is split (plans.register_top: the phase and GEMM sub-plans run without a workspace),
the forced switch, the workspace query, and an emulation of the kernel's slice start (the K tile kbeg's
digits decomposed once) and of the partials + fold against the float64 reference."""
import numpy as np
import pytest

import pydnn
from pydnn import tuning
from pydnn.ops.convolution import plans as CP, problem as CPb, tensor_core as CT
from pydnn.ops.common import cdiv
from pydnn.reference import convolution as ref
from test_fuzz_cpu import cpu_handle

BF16, F16 = pydnn.PYDNN_DATA_BFLOAT16, pydnn.PYDNN_DATA_HALF
NHWC = pydnn.PYDNN_TENSOR_NHWC
XCORR = pydnn.PYDNN_CROSS_CORRELATION
FWD_PRE = pydnn.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM
BWD_D1 = pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_1


def _descs(n, c, k, h, r, stride=1, pad=None, dtype=BF16):
    pad = r // 2 if pad is None else pad
    x = pydnn.create_tensor_descriptor()
    pydnn.set_tensor4d_descriptor(x, NHWC, dtype, n, c, h, h)
    w = pydnn.create_filter_descriptor()
    pydnn.set_filter4d_descriptor(w, dtype, NHWC, k, c, r, r)
    conv = pydnn.create_convolution_descriptor()
    pydnn.set_convolution2d_descriptor(conv, pad, pad, stride, stride, 1, 1, XCORR, pydnn.PYDNN_DATA_FLOAT)
    p = (h + 2 * pad - r) // stride + 1
    y = pydnn.create_tensor_descriptor()
    pydnn.set_tensor4d_descriptor(y, NHWC, dtype, n, k, p, p)
    return conv, x, w, y


def _plan(h, direction, *shape, **kw):
    conv, x, w, y = _descs(*shape, **kw)
    algo = FWD_PRE if direction == CPb.DIR_FWD else BWD_D1
    return CP.new_plan(h, direction, algo, conv, x, w, y), (conv, x, w, y)


@pytest.mark.parametrize("direction,shape", [(d, s) for d in (CPb.DIR_FWD, CPb.DIR_BWD_DATA)
                                             for s in ((8, 512, 512, 7, 3), (8, 1024, 1024, 8, 3))]
                         + [(CPb.DIR_FWD, (8, 2048, 512, 7, 1)), (CPb.DIR_BWD_DATA, (8, 512, 2048, 7, 1))])
def test_model_splits_the_few_block_layers(direction, shape):
    """The sweep's N8 layers whose 128 x BN tiles are 32-64 blocks of 32-144 K tiles: split, the workspace
    query reports the partials, the slices cover every K tile once."""
    h = cpu_handle()
    pl, (conv, x, w, y) = _plan(h, direction, *shape)
    assert pl.gemm_expr.startswith("pydnn::conv::fwd_wgmma<")
    assert pl.splits > 1 and type(pl.fold) is CPb.ConvParams, (pl.splits, pl.gemm_expr)
    p = pl.gemm
    ktiles = p.filt[0] * p.filt[1] * p.filt[2] * cdiv(p.cg, 64)
    assert p.splits == pl.splits == pl.gemm_grid[2]
    assert (p.splits - 1) * p.k_per_split < ktiles <= p.splits * p.k_per_split
    assert p.flags & CPb.FLAG_PARTIAL and not pl.fold.flags & CPb.FLAG_PARTIAL
    assert pl.workspace >= p.splits * p.gm * p.gn * 4 and pl.workspace % 256 == 0
    assert pl.fold_expr == "pydnn::conv::fwd_split_fold<pydnn::bf16_t>"
    assert pl.unit == "convolution.wgmma.split.bf16" and pl.gemm_expr.endswith(", 1>")
    assert pl.fold_expr in CT.split_exprs("bf16") and pl.gemm_expr in CT.split_exprs("bf16")
    units = {u.name: u for u in CT.split_units()}
    assert set(units) == {"convolution.wgmma.split.f16", "convolution.wgmma.split.bf16"}
    assert units["convolution.wgmma.split.bf16"].exprs == CT.split_exprs("bf16")
    assert all(u.archs == ("sm_90a",) for u in units.values())
    assert pl.gemm_expr.count(",") == 7   # <T, BN, STAGES, MINB, LEAN, BKN, FB, SPLIT = 1>
    if direction == CPb.DIR_FWD:
        assert pydnn.get_convolution_forward_workspace_size(h, x, w, conv, y, FWD_PRE) == pl.workspace
    else:
        assert pydnn.get_convolution_backward_data_workspace_size(h, w, y, conv, x, BWD_D1) == pl.workspace


@pytest.mark.parametrize("direction", [CPb.DIR_FWD, CPb.DIR_BWD_DATA])
@pytest.mark.parametrize("shape", [(128, 256, 256, 32, 3), (128, 64, 64, 128, 3), (32, 512, 512, 16, 3),
                                   (2, 64, 64, 20, 3)])
def test_model_keeps_full_waves_and_small_problems_whole(direction, shape):
    """Layers with waves of blocks (N128 / N32 UNet) and tiny problems (the GPU tests' shapes) stay one
    launch without a workspace."""
    pl, _ = _plan(cpu_handle(), direction, *shape)
    assert pl.splits == 1 and pl.fold is None and pl.workspace == 0


def test_forced_switch_and_forced_tiling(monkeypatch):
    h = cpu_handle()
    monkeypatch.setattr(tuning.conv, "WGM_SPLIT", 1)
    pl, _ = _plan(h, CPb.DIR_FWD, 8, 512, 512, 7, 3)
    assert pl.splits == 1 and pl.workspace == 0
    monkeypatch.setattr(tuning.conv, "WGM_SPLIT", None)
    monkeypatch.setitem(tuning.conv.TC_FORCE, CPb.DIR_FWD, CT.WGM_TILES[1])
    pl, _ = _plan(h, CPb.DIR_FWD, 8, 512, 512, 7, 3)
    assert pl.splits == 1 and "fwd_wgmma<pydnn::bf16_t, 128," in pl.gemm_expr   # a forced tiling runs as forced
    monkeypatch.setattr(tuning.conv, "WGM_SPLIT", 3)
    monkeypatch.setitem(tuning.conv.TC_FORCE, CPb.DIR_FWD, CT.WGM_VARIANTS[0])
    pl, _ = _plan(h, CPb.DIR_FWD, 8, 512, 512, 7, 3)
    assert pl.splits == 1 and pl.fold is None   # the plain-loop variants have no split twin
    monkeypatch.delitem(tuning.conv.TC_FORCE, CPb.DIR_FWD)
    monkeypatch.setattr(tuning.conv, "WGM_SPLIT", 5)
    pl, _ = _plan(h, CPb.DIR_FWD, 2, 64, 64, 20, 3)   # 9 K tiles: slices of 2, 5 of them
    assert pl.splits == 5 and pl.gemm.k_per_split == 2
    monkeypatch.setattr(tuning.conv, "WGM_SPLIT", 4)
    pl, _ = _plan(h, CPb.DIR_FWD, 2, 64, 64, 20, 3)   # slices of 3: 3 of them cover the 9 K tiles
    assert pl.splits == 3 and pl.gemm.k_per_split == 3


def test_sub_plans(monkeypatch):
    """The stride-2 backward data's phases may split (the phase plan reserves the largest phase's partials,
    the phases run one after the other); the GEMM algorithm's fused 1x1 sub-plan runs without a workspace of
    its own and never splits."""
    h = cpu_handle()
    monkeypatch.setattr(tuning.conv, "WGM_SPLIT", 3)
    pl, _ = _plan(h, CPb.DIR_BWD_DATA, 8, 512, 512, 14, 3, stride=2)
    assert type(pl).__name__ == "PhasePlan"
    assert all(sp.splits > 1 for sp, _, _, _ in pl.subs)
    assert pl.workspace == max(sp.workspace for sp, _, _, _ in pl.subs) > 0
    conv, x, w, y = _descs(32, 512, 2048, 7, 1)
    pl = CP.new_plan(h, CPb.DIR_FWD, pydnn.PYDNN_CONVOLUTION_FWD_ALGO_GEMM, conv, x, w, y)
    if getattr(pl, "direct", False):
        assert pl.sub.plan.fold is None and pl.sub.plan.workspace == 0


def _slice_start(kbeg, cblocks, filt):
    """fwd_wgmma's split start (ptx/convolution.cu): K tile kbeg's channel block and tap digits."""
    tap = kbeg // cblocks
    c0 = (kbeg - tap * cblocks) * 64
    ts = tap % filt[2]
    tap //= filt[2]
    return c0, tap // filt[1], tap % filt[1], ts


def _walk(ch, filt):
    """The fill's stepping from K tile 0 (c0 += 64; carry into ts, tr, tt): every tile's (c0, tt, tr, ts)."""
    c0 = tt = tr = ts = 0
    out = []
    for _ in range(filt[0] * filt[1] * filt[2] * cdiv(ch, 64)):
        out.append((c0, tt, tr, ts))
        c0 += 64
        if c0 >= ch:
            c0 = 0
            ts += 1
            if ts == filt[2]:
                ts = 0
                tr += 1
                if tr == filt[1]:
                    tr = 0
                    tt += 1
    return out


@pytest.mark.parametrize("ch,filt", [(64, (1, 3, 3)), (192, (1, 3, 3)), (96, (1, 5, 5)), (8, (2, 3, 3)),
                                     (512, (1, 1, 1)), (40, (1, 1, 5)), (136, (3, 2, 3))])
def test_slice_start_matches_the_walk(ch, filt):
    walk = _walk(ch, filt)
    for kbeg in range(len(walk)):
        assert _slice_start(kbeg, cdiv(ch, 64), filt) == walk[kbeg]


def test_partials_and_fold_emulated():
    """The forward as the split kernel computes it (each slice's K tiles of the implicit GEMM, fp32 sums
    of bf16-exact operands), folded in split order with alpha / beta, against the float64 reference."""
    rng = np.random.default_rng(0)
    n, c, k, hh, r = 2, 96, 24, 6, 3
    x = rng.standard_normal((n, c, hh, hh)).astype(np.float32)
    w = rng.standard_normal((k, c, r, r)).astype(np.float32)
    y0 = rng.standard_normal((n, k, hh, hh))
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    cb = cdiv(c, 64)
    filt = (1, r, r)
    ktiles = r * r * cb
    for splits in (2, 3, 5):
        per = cdiv(ktiles, splits)
        s = cdiv(ktiles, per)
        parts = np.zeros((s, n * hh * hh, k), np.float32)
        for z in range(s):
            for kt in range(z * per, min(ktiles, (z + 1) * per)):
                c0, _, tr, ts = _slice_start(kt, cb, filt)
                cs = slice(c0, min(c, c0 + 64))
                a = xp[:, cs, tr:tr + hh, ts:ts + hh].transpose(0, 2, 3, 1).reshape(n * hh * hh, -1)
                parts[z] += a @ w[:, cs, tr, ts].T
        acc = np.zeros_like(parts[0])
        for z in range(s):   # the fold's order
            acc += parts[z]
        got = 0.75 * acc.reshape(n, hh, hh, k).transpose(0, 3, 1, 2) - 0.5 * y0
        want = ref.forward(0.75, x.astype(np.float64), w.astype(np.float64), -0.5, y0, (1, 1), (1, 1), (1, 1), 1,
                           True)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_estimate_counts_the_split():
    """Get..._v7's model sees the split plan's blocks (its estimate falls below the whole plan's)."""
    from pydnn.ops.convolution import algorithms as CA
    h = cpu_handle()
    pl, _ = _plan(h, CPb.DIR_FWD, 8, 512, 512, 7, 3)
    with tuning.override({"conv.WGM_SPLIT": 1}):
        whole, _ = _plan(h, CPb.DIR_FWD, 8, 512, 512, 7, 3)
    assert pl.splits > 1 and CA._estimate_ms(h, pl) < CA._estimate_ms(h, whole)
