"""The wgmma backward filter's plan on the CPU (no GPU needed): when plan_wgrad_tc hands a problem to it
(sm_90, 16-bit NHWC x and packed NHWC dy, channel counts % 8, one group, ENABLED, no other kernel forced)
and when not; the split model's parameters (whole 64-position K tiles per slice, no empty slice, the
digits of the tile depth), the workspace of fp32 partials and the fold's channel-innermost columns; forced
tilings; the v7 heuristic; the units (sm_90a only); a misaligned x refused before any launch."""
import pytest

import pydnn
from pydnn._build import manifest
from pydnn import tuning
from pydnn.ops.convolution import implicit as CI, plans as CP, problem as CPb, tensor_core as CT
from pydnn.ops.convolution import wgrad_wgmma as W
from test_convolution_cpu import BF16, F32, NCHW, NHWC, X, Y, WS, W as WPTR, _check, cdesc, fdesc, tdesc
from test_fuzz_cpu import cpu_handle

F1 = pydnn.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_1
RESNET = ((64, 56), (128, 28), (256, 14), (512, 7))


def _plan(h, x, y, w, c=None):
    return CP.new_plan(h, CPb.DIR_BWD_FILTER, F1, c or cdesc((1, 1), (1, 1), (1, 1)), x, w, y)


def _resnet(cc, hw, fmt=NHWC, n=64):
    x = tdesc((n, cc, hw, hw), BF16, NHWC)
    return x, x, fdesc((cc, cc, 3, 3), BF16, fmt=fmt)


def _check_steps(pl, pb_k, pb_gn, ws_strides):
    """One GEMM launch: tiles [0, direct) whole, then tiles [direct, all) in slices (whole 64-position K
    tiles each, no empty slice), followed by the fold of the sliced tiles; the workspace holds their
    partials."""
    bm, bn = pl.cfg[:2]
    tiles = -(-pb_k // bm) * -(-pb_gn // bn)
    kind, grid, prm, _, _, smem = pl.steps[0]
    p = prm.c
    assert kind == "gemm" and smem == pl.smem and prm.m_tiles == -(-pb_k // bm)
    assert prm.tile_first == prm.direct and prm.direct + prm.tiles == tiles
    assert grid == (prm.direct + prm.tiles * p.splits, 1, 1)
    assert p.k_per_split % 64 == 0 and (p.splits - 1) * p.k_per_split < p.gk <= p.splits * p.k_per_split
    if prm.tiles == 0:
        assert len(pl.steps) == 1 and pl.workspace == 0 and pl.fold is None and p.splits == 1
        return ["gemm"]
    kind, grid, f, _, _, _ = pl.steps[1]
    assert kind == "fold" and len(pl.steps) == 2 and f is pl.fold
    assert (f.tile_first, f.tiles, f.splits, f.m_tiles) == (prm.tile_first, prm.tiles, p.splits, prm.m_tiles)
    assert (f.bm, f.bn, f.gm, f.gn) == (bm, bn, pb_k, pb_gn) and tuple(f.ws) == tuple(ws_strides)
    assert grid == (-(-prm.tiles * bm * bn // 256), 1, 1) and pl.workspace == p.splits * prm.tiles * bm * bn * 4
    return ["gemm", "fold"]


@pytest.mark.parametrize("layer", RESNET)
@pytest.mark.parametrize("fmt", [NHWC, NCHW])
def test_plan_resnet_layers(layer, fmt):
    cc, hw = layer
    h = cpu_handle()
    x, y, w = _resnet(cc, hw, fmt)
    pl = _plan(h, x, y, w)
    assert isinstance(pl, W.WgradWgmmaPlan) and pl.deterministic and pl.align == 16
    assert pl.unit == "convolution.wgrad.bf16" and pl.gemm_expr == W._expr("bf16", pl.cfg) and pl.cfg in W.TILES
    p = pl.gemm
    assert (p.gm, p.gn, p.gk) == (cc, 9 * cc, 64 * hw * hw)
    assert list(p.red_size) == [64, 1, hw, hw] and list(p.red_step) == CP.digit_step(64, [64, 1, hw, hw])
    # the stages, the position table (2 x 64 x 16 bytes) and 1 KiB to align the stages
    assert pl.smem == pl.cfg[2] * (pl.cfg[0] + pl.cfg[1]) * 64 * 2 + 2048 + 1024 <= 227 * 1024
    assert pl.cfg[3] == 1 or pl.cfg[3] * (pl.smem + 1024) <= 228 * 1024   # MINB blocks fit an SM
    kinds = _check_steps(pl, cc, 9 * cc, CPb.strides5(w.strides))
    if cc == 512:  # 144 128 x 128 tiles on 132 SMs: the first wave unsplit, the other 12 tiles split
        assert pl.full == 132 == pl.steps[0][2].direct and pl.cfg[:2] == (128, 128) and kinds == ["gemm", "fold"]
        assert pl.steps[0][2].tiles == 12 and pl.tail_splits == pl.gemm.splits > 1
    else:
        assert pl.full == 0 and kinds == (["gemm", "fold"] if pl.splits > 1 else ["gemm"])
    assert pydnn.get_convolution_backward_filter_workspace_size(h, x, y, cdesc((1, 1), (1, 1), (1, 1)), w, F1) == \
        pl.workspace
    r = pydnn.get_convolution_backward_filter_algorithm_v7(h, x, y, cdesc((1, 1), (1, 1), (1, 1)), w, 7)
    assert r[0].algo == F1 and r[0].determinism == pydnn.PYDNN_DETERMINISTIC and r[0].memory == pl.workspace
    assert 0 < pl.estimate_ms(h, None) < 1.0


def test_model_choices():
    """The model: a BM 128 tile never for K <= 64; the splits it returns are the slices a plan makes; the
    hybrid only where the tiles overfill whole waves."""
    for gm, gn, gk in ((64, 576, 200704), (128, 1152, 50176), (256, 2304, 12544), (512, 4608, 3136),
                       (8, 72, 60), (136, 216, 135)):
        cfg, splits, full, ts = W.tiling(132, gm, gn, gk)
        assert cfg in W.TILES and 1 <= splits <= -(-gk // 64)
        if gm <= 64:
            assert cfg[0] == 64
        kt = -(-gk // 64)
        assert W._splits_of(kt, splits) == splits and W._splits_of(kt, ts) == ts
        tiles = -(-gm // cfg[0]) * -(-gn // cfg[1])
        assert full == 0 or (splits == 1 and full % (132 * cfg[3]) == 0 and 0 < full < tiles and ts > 1)
    assert W.tiling(132, 512, 4608, 3136)[2] == 132


def test_refusals(monkeypatch):
    """The other kernels serve what this one does not: another arch, ENABLED off, C % 8, dy not packed,
    float data, groups; a forced wgrad_pipe_tc / wgrad_tc tiling is obeyed, a forced TILES entry runs here."""
    x, y, w = _resnet(64, 28, n=8)
    h = cpu_handle()
    h.arch = "sm_80"
    assert "wgrad_pipe_tc<" in _plan(h, x, y, w).gemm_expr
    assert "needs an sm_90 device" in W.refusal(h, CPb.problem(cdesc((1, 1), (1, 1), (1, 1)), x, w, y))
    h = cpu_handle()
    monkeypatch.setattr(tuning.conv_wgrad_wgmma, "ENABLED", False)
    assert "wgrad_pipe_tc<" in _plan(h, x, y, w).gemm_expr
    monkeypatch.setattr(tuning.conv_wgrad_wgmma, "ENABLED", True)
    assert isinstance(_plan(h, x, y, w), W.WgradWgmmaPlan)
    # dy's positions not evenly spaced: wgrad_tc
    yg = tdesc((8, 64, 28, 28), BF16, strides=(28 * 64 * 64, 1, 64 * 64, 64))
    assert "pydnn::conv::wgrad_tc<" in _plan(h, x, yg, w).gemm_expr
    # C % 8, fp32: CUDA cores
    xx, yy = tdesc((2, 12, 8, 8), BF16, NHWC), tdesc((2, 8, 8, 8), BF16, NHWC)
    assert _plan(h, xx, yy, fdesc((8, 12, 3, 3), BF16, fmt=NHWC)).gemm_expr.startswith("pydnn::conv::implicit_gemm<2")
    xf = tdesc((2, 16, 8, 8), F32, NHWC)
    assert _plan(h, xf, tdesc((2, 8, 8, 8), F32, NHWC), fdesc((8, 16, 3, 3), F32, fmt=NHWC)).gemm_expr.startswith(
        "pydnn::conv::implicit_gemm<2")
    # groups: not the tensor-core kernels
    g2 = cdesc((1, 1), (1, 1), (1, 1), groups=2)
    assert not isinstance(_plan(h, x, y, fdesc((64, 32, 3, 3), BF16, fmt=NHWC), g2), W.WgradWgmmaPlan)
    # forced tilings
    monkeypatch.setitem(tuning.conv.TC_FORCE, CPb.DIR_BWD_FILTER, (CT.WGP_TILES[0], 2))
    assert "wgrad_pipe_tc<" in _plan(h, x, y, w).gemm_expr
    monkeypatch.setitem(tuning.conv.TC_FORCE, CPb.DIR_BWD_FILTER, (128, 2))
    assert "pydnn::conv::wgrad_tc<" in _plan(h, x, y, w).gemm_expr
    for cfg in W.TILES:
        monkeypatch.setitem(tuning.conv.TC_FORCE, CPb.DIR_BWD_FILTER, (cfg, 3))
        pl = _plan(h, x, y, w)
        tiles = -(-64 // cfg[0]) * -(-576 // cfg[1])
        assert isinstance(pl, W.WgradWgmmaPlan) and pl.cfg == cfg and pl.splits == 3
        assert pl.workspace == 3 * tiles * cfg[0] * cfg[1] * 4 and [st[0] for st in pl.steps] == ["gemm", "fold"]
        assert pl.steps[0][2].direct == 0
    for cfg in W.VARIANTS:   # bench-only instantiations, forced
        monkeypatch.setitem(tuning.conv.TC_FORCE, CPb.DIR_BWD_FILTER, (cfg, 1))
        assert _plan(h, x, y, w).gemm_expr == W._expr("bf16", cfg)
    # a forced hybrid: tiles [0, 3) unsplit, the others with 2 splits
    monkeypatch.setitem(tuning.conv.TC_FORCE, CPb.DIR_BWD_FILTER, (W.TILES[2], 1, 3, 2))
    pl = _plan(h, x, y, w)
    assert pl.full == 3 and [st[0] for st in pl.steps] == ["gemm", "fold"] and pl.steps[0][2].direct == 3
    assert _check_steps(pl, 64, 576, CPb.strides5(w.strides)) and pl.workspace == 2 * 2 * 64 * 128 * 4
    monkeypatch.delitem(tuning.conv.TC_FORCE, CPb.DIR_BWD_FILTER)
    monkeypatch.setattr(tuning.conv_wgrad_wgmma, "FORCE", (W.TILES[1], 1))
    pl = _plan(h, x, y, w)
    assert pl.cfg == W.TILES[1] and pl.splits == 1 and pl.workspace == 0 and pl.fold is None


def test_many_splits_capped():
    """A forced split count above the K tiles gives one K tile per slice (no empty slice)."""
    x, y, w = _resnet(64, 7, n=2)   # 98 positions: 2 K tiles
    pl = W.plan(cpu_handle(), CPb.problem(cdesc((1, 1), (1, 1), (1, 1)), x, w, y), F1, W.TILES[0], 50)
    assert pl.splits == 2 and pl.gemm.k_per_split == 64
    pl = W.plan(cpu_handle(), CPb.problem(cdesc((1, 1), (1, 1), (1, 1)), x, w, y), F1, W.TILES[0], 1, 99, 3)
    assert pl.full == 0 and pl.splits == 1 and pl.workspace == 0   # "full" past the tiles: no hybrid


def test_misaligned_x_refused():
    """x and dy are read in 16-byte chunks: an element-aligned but not 16-byte aligned x is refused
    (MISALIGNED_POINTER, before any kernel lookup); an aligned call reaches the lookup (NOT_INITIALIZED)."""
    x, y, w = _resnet(64, 28, n=8)
    h = cpu_handle()
    c = cdesc((1, 1), (1, 1), (1, 1))
    need = pydnn.get_convolution_backward_filter_workspace_size(h, x, y, c, w, F1)
    bf = pydnn.convolution_backward_filter
    _check(bf, (h, 1.0, x, X + 2, y, Y, c, F1, WS, need, 0.0, w, WPTR), pydnn.PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER,
           "16-byte aligned")
    _check(bf, (h, 1.0, x, X, y, Y, c, F1, WS, need, 0.0, w, WPTR), pydnn.PYDNN_STATUS_NOT_INITIALIZED, "")


def test_units():
    """One unit per 16-bit type, every TILES entry, sm_90a only, listed by the convolution family."""
    units = {u.name: u for u in manifest.family_units() if u.name.startswith("convolution.wgrad.")}
    assert set(units) == {"convolution.wgrad.f16", "convolution.wgrad.bf16"}
    for tag, u in ((t, units[f"convolution.wgrad.{t}"]) for t in ("f16", "bf16")):
        assert u.source == "conv_wgrad_wgmma.cu" and u.archs == ("sm_90a",)
        assert u.exprs == tuple(W._expr(tag, cfg) for cfg in W.TILES + W.VARIANTS) + (W._fold_expr(tag),)
        assert manifest.unit_arch(u, "sm_90") == "sm_90a" and manifest.unit_arch(u, "sm_80") is None

