"""The fused 1x1 route (gemm.FusedMM, tuning.conv_gemm.MM_FUSED) planned on CPU-only handles (sm_90 / 132
SMs): which fused calls it takes (fused_mm_key: alpha1 1, beta 0, a bias, z unscaled through y's strides,
IDENTITY / RELU without NaN propagation) and which it leaves to the implicit GEMM; the graph it builds is
ONE launch on the fusion engine (the generated epilogue compiled by NVRTC for sm_90a), NHWC and NCHW."""
import sys
from pathlib import Path

import pytest

import pydnn
from pydnn import tuning
from pydnn._build.params import FLAG_NAN_PROP
from pydnn.ops.convolution import gemm as G, plans as CP, problem as CPb

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools"))
from plan_digest import cpu_handle  # noqa: E402

BF16 = pydnn.PYDNN_DATA_BFLOAT16
NHWC, NCHW = pydnn.PYDNN_TENSOR_NHWC, pydnn.PYDNN_TENSOR_NCHW
FWD_GEMM = pydnn.PYDNN_CONVOLUTION_FWD_ALGO_GEMM


@pytest.fixture
def h(monkeypatch):
    # the GEMM plan itself: tuning.conv.TMA_1X1 would move its short-reduction 1x1 plans to fwd_tma (conv_tma.py)
    monkeypatch.setattr(tuning.conv, "TMA_1X1", False)
    return cpu_handle("sm_90", 132)


def _plan(h, n, c, k, hw, fmt, r=1, pad=0):
    xd, yd = pydnn.create_tensor_descriptor(), pydnn.create_tensor_descriptor()
    p = hw + 2 * pad - r + 1
    pydnn.set_tensor4d_descriptor(xd, fmt, BF16, n, c, hw, hw)
    pydnn.set_tensor4d_descriptor(yd, fmt, BF16, n, k, p, p)
    wd = pydnn.create_filter_descriptor()
    pydnn.set_filter4d_descriptor(wd, BF16, fmt, k, c, r, r)
    cv = pydnn.create_convolution_descriptor()
    pydnn.set_convolution2d_descriptor(cv, pad, pad, 1, 1, 1, 1, pydnn.PYDNN_CROSS_CORRELATION, pydnn.PYDNN_DATA_FLOAT)
    return CP.new_plan(h, CPb.DIR_FWD, FWD_GEMM, cv, xd, wd, yd)


def _epilogue(pl, act, nan=False, alpha2=0.0, zs=None, bias_stride=1):
    """The fields _fused_run sets on the plan's ConvParams for a call."""
    p = pl.gemm
    p.act, p.alpha2, p.bias_stride = act, alpha2, bias_stride
    p.flags = (p.flags | FLAG_NAN_PROP) if nan else (p.flags & ~FLAG_NAN_PROP)
    for i, s in enumerate(zs if zs is not None else pl.problem.ys):
        p.zs[i] = s


def test_key_takes_bias_relu_identity_and_unscaled_z(h):
    pl = _plan(h, 32, 512, 2048, 7, NHWC)
    assert pl.direct
    _epilogue(pl, G.ACT_RELU)
    assert G.fused_mm_key(pl, 1.0, 0.0, 0, 0x1000) == (G.ACT_RELU, False, 1)
    assert G.fused_mm_key(pl, 1.0, 0.0, 0x2000, 0x1000) is None          # z given, alpha2 0 -> its fields: 0
    _epilogue(pl, G.ACT_RELU, alpha2=1.0)
    assert G.fused_mm_key(pl, 1.0, 0.0, 0x2000, 0x1000) == (G.ACT_RELU, True, 1)
    _epilogue(pl, G.ACT_IDENTITY, bias_stride=2)
    assert G.fused_mm_key(pl, 1.0, 0.0, 0, 0x1000) == (G.ACT_IDENTITY, False, 2)


def test_key_declines(h):
    pl = _plan(h, 32, 512, 2048, 7, NHWC)
    _epilogue(pl, G.ACT_RELU)
    assert G.fused_mm_key(pl, 0.8, 0.0, 0, 0x1000) is None      # alpha1 != 1
    assert G.fused_mm_key(pl, 1.0, 0.0, 0, 0) is None           # no bias: not the fused call
    _epilogue(pl, G.ACT_RELU, nan=True)
    assert G.fused_mm_key(pl, 1.0, 0.0, 0, 0x1000) is None      # PROPAGATE_NAN
    _epilogue(pl, 2)                                            # CLIPPED_RELU
    assert G.fused_mm_key(pl, 1.0, 0.0, 0, 0x1000) is None
    _epilogue(pl, G.ACT_RELU, alpha2=-0.5)
    assert G.fused_mm_key(pl, 1.0, 0.0, 0x2000, 0x1000) is None  # a scaled z
    ys = list(pl.problem.ys)
    _epilogue(pl, G.ACT_RELU, alpha2=1.0, zs=[ys[0], 1, 0, ys[3] * 2, ys[4]])
    assert G.fused_mm_key(pl, 1.0, 0.0, 0x2000, 0x1000) is None  # z in another layout than y
    _epilogue(pl, G.ACT_RELU)
    tuning.conv_gemm.MM_FUSED = False
    try:
        assert G.fused_mm_key(pl, 1.0, 0.0, 0, 0x1000) is None
    finally:
        tuning.conv_gemm.MM_FUSED = True
    pl3 = _plan(h, 2, 64, 64, 14, NHWC, r=3, pad=1)             # not a direct plan
    assert not pl3.direct
    assert G.fused_mm_key(pl3, 1.0, 0.0, 0, 0x1000) is None


@pytest.mark.parametrize("fmt", [NHWC, NCHW], ids=["nhwc", "nchw"])
def test_graph_is_one_fused_launch(h, fmt):
    """bias + z + max(v, 0) on the GEMM: the fusion engine, one launch, no workspace (compiled for sm_90a
    here: NVRTC, no GPU)."""
    pl = _plan(h, 4, 128, 256, 7, fmt)
    fm = G.FusedMM(h, pl, (G.ACT_RELU, True, 1))
    g = fm.graph
    assert g.engine_index() == 1 and g.launches() == 1 and g.get_workspace_size() == 0
    assert fm.zero_t is not None and fm.z is not None
    fm2 = G.FusedMM(h, pl, (G.ACT_IDENTITY, False, 1))
    assert fm2.zero_t is None and fm2.z is None
    # the plan caches one FusedMM per epilogue key
    _epilogue(pl, G.ACT_IDENTITY)
    a = pl.fused_mm(h, 1.0, 0.0, 0, 0x1000)
    assert a is not None and pl.fused_mm(h, 1.0, 0.0, 0, 0x1000) is a


def test_tma_route_copies_the_epilogue(h, monkeypatch):
    """MM_FUSED "tma": the fused call on fwd_tma of the problem itself (the implicit sub-plan its fallback), with the
    call's epilogue fields copied from the plan's ConvParams."""
    from pydnn.ops.convolution import conv_tma as T
    monkeypatch.setattr(tuning.conv_gemm, "MM_FUSED", "tma")
    pl = _plan(h, 32, 512, 2048, 7, NHWC)
    _epilogue(pl, G.ACT_RELU, alpha2=1.0, bias_stride=2)
    pl.gemm.flags |= CPb.FLAG_BIAS | CPb.FLAG_Z
    t = pl.fused_tma(h)
    assert isinstance(t, T.TmaPlan) and t.fallback is pl.sub.plan and pl.fused_tma(h) is t
    g = t.gemm
    assert (g.act, g.alpha2, g.bias_stride) == (G.ACT_RELU, 1.0, 2) and list(g.zs) == list(pl.problem.ys)
    assert g.flags & CPb.FLAG_BIAS and g.flags & CPb.FLAG_Z and not g.flags & FLAG_NAN_PROP
    assert _plan(h, 4, 12, 16, 7, NHWC).fused_tma(h) is None   # C % 8: fwd_tma refuses


def test_no_device_memory_runs_the_implicit_epilogue(h):
    """ReLU's zero element cannot be allocated on a CPU handle: ready() says no (once, remembered) and the call
    takes the implicit GEMM's epilogue; IDENTITY needs no element."""
    pl = _plan(h, 4, 128, 256, 7, NHWC)
    fm = G.FusedMM(h, pl, (G.ACT_RELU, False, 1))
    assert fm.ready(h) is False and fm.zero is False and fm.ready(h) is False
    assert G.FusedMM(h, pl, (G.ACT_IDENTITY, False, 1)).ready(h) is True
