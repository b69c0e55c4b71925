"""The narrow 1x1 convolutions (ops/convolution/narrow.py, ptx/conv_narrow.cu: K <= 8 output channels)
on the CPU: where they serve, a numpy emulation of the kernels' grid-stride walk (every pixel once, by
block / warp / pixel group / round / unroll step), their lane-group channel split and shuffle trees, the
backward filter's per-block partials and the fold, against the float64 reference; NVRTC compiles."""
import os
import sys
from pathlib import Path

import numpy as np
import pytest

import pydnn
from pydnn import tuning
from pydnn.ops.convolution import narrow as NW, plans as P, problem as Pb
from pydnn.reference import convolution as ref

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools"))
from plan_digest import cpu_handle, descriptors  # noqa: E402

BF16, F16, F32 = pydnn.PYDNN_DATA_BFLOAT16, pydnn.PYDNN_DATA_HALF, pydnn.PYDNN_DATA_FLOAT
XCORR = pydnn.PYDNN_CROSS_CORRELATION
FWD0, BWD_D0, BWD_F0 = (pydnn.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_0,
                        pydnn.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_0)
DIRS = ((Pb.DIR_FWD, FWD0), (Pb.DIR_BWD_DATA, BWD_D0), (Pb.DIR_BWD_FILTER, BWD_F0))


def _descs(n, c, k, hw, dtype=BF16, nhwc=True, filt=1, pad=0, stride=1, groups=1):
    p = (dtype, nhwc, True, n, c, k, groups, list(hw), [filt] * len(hw), [pad] * len(hw), [stride] * len(hw),
         [1] * len(hw), XCORR, pydnn.PYDNN_DEFAULT_MATH)
    return descriptors(p)


def test_where_the_narrow_kernels_serve():
    h = cpu_handle("sm_90", 132)
    conv, x, w, y = _descs(8, 64, 2, (128, 128))
    for d, algo in DIRS:
        pl = P.new_plan(h, d, algo, conv, x, w, y)
        assert type(pl) is NW.NarrowPlan and pl.g == 8 and pl.deterministic
    for args, why in (((8, 64, 8, (16, 16)), "K 8"), ((8, 12, 2, (16, 16)), "C 12"), ((8, 512, 2, (16, 16)), "C 512"),
                      ((8, 64, 2, (16, 16), BF16, False), "packed NHWC"), ((8, 64, 2, (16, 16), F32), "half"),
                      ((8, 64, 2, (16, 16), BF16, True, 3, 1), "1x1"), ((8, 64, 2, (16, 16), BF16, True, 1, 0, 2), "1x1"),
                      ((8, 64, 2, (16, 16), BF16, True, 1, 0, 1, 2), "groups")):
        conv, x, w, y = _descs(*args)
        assert why in NW.refusal(Pb.problem(conv, x, w, y))
    conv, x, w, y = _descs(8, 64, 2, (128, 128))
    with tuning.override({"conv.NARROW_1X1": False}):
        assert type(P.new_plan(h, Pb.DIR_FWD, FWD0, conv, x, w, y)) is not NW.NarrowPlan


def _walk(pl):
    """Every (pixel, lane sub) the grid-stride walk visits, per block: {block: [pixels...]} (lane groups
    in warp order, rounds, unroll steps), as the kernels' NarrowWalk computes them."""
    G, P_ = pl.g, pl.pixels
    per_warp, warps = 32 // G, pl.blocks * NW.THREADS // 32
    stride = warps * per_warp
    seen = {}
    for gw in range(warps):
        blk = gw // (NW.THREADS // 32)
        base = gw * per_warp
        while base < P_:
            for i in range(NW.UNROLL):
                for slot in range(per_warp):
                    pix = base + i * stride + slot
                    if pix < P_:
                        seen.setdefault(blk, []).append(pix)
            base += stride * NW.UNROLL
    return seen


@pytest.mark.parametrize("n,c,k,hw", [(2, 64, 2, (37, 19)), (1, 24, 3, (9, 7)), (3, 256, 7, (5, 11)),
                                      (1, 8, 1, (40, 40)), (2, 96, 5, (6, 6, 5))])
def test_emulated_narrow_kernels_match_reference(n, c, k, hw):
    conv, x, w, y = _descs(n, c, k, hw)
    h = cpu_handle("sm_90", 132)
    rng = np.random.default_rng(5)
    xv = rng.standard_normal((n, c) + tuple(hw))
    wv = rng.standard_normal((k, c) + (1,) * len(hw))
    dyv = rng.standard_normal((n, k) + tuple(hw))
    xf = np.moveaxis(xv, 1, -1).reshape(-1, c)       # packed NHWC: pixel p's channels at p * C
    dyf = np.moveaxis(dyv, 1, -1).reshape(-1, k)
    wm = wv.reshape(k, c)
    pad, st, dil = [0] * len(hw), [1] * len(hw), [1] * len(hw)
    for d, algo in DIRS:
        pl = P.new_plan(h, d, algo, conv, x, w, y)
        assert type(pl) is NW.NarrowPlan
        G = pl.g
        assert G & (G - 1) == 0 and G * 8 >= c and (G == 1 or G * 4 < c) and G <= 32
        seen = _walk(pl)
        allpix = sorted(p for v in seen.values() for p in v)
        assert allpix == list(range(pl.pixels)), "every pixel once"
        lanes_ok = [s for s in range(G) if s * 8 < c]
        if d == Pb.DIR_FWD:   # per pixel: the G lanes' 8-channel partial sums, the xor tree over the group
            out = np.full((pl.pixels, k), np.nan)
            for p_ in allpix:
                s = [xf[p_, 8 * sub:8 * sub + 8] @ wm[:, 8 * sub:8 * sub + 8].T if sub in lanes_ok else np.zeros(k)
                     for sub in range(G)]
                off = G >> 1
                while off:
                    s = [s[i] + s[i ^ off] for i in range(G)]
                    off >>= 1
                out[p_] = s[0]
            want = ref.forward_raw(xv, wv, pad, st, dil)
            np.testing.assert_allclose(out, np.moveaxis(want, 1, -1).reshape(-1, k), rtol=1e-10, atol=1e-10)
        elif d == Pb.DIR_BWD_DATA:
            out = np.full((pl.pixels, c), np.nan)
            for p_ in allpix:
                for sub in lanes_ok:
                    out[p_, 8 * sub:8 * sub + 8] = dyf[p_] @ wm[:, 8 * sub:8 * sub + 8]
            want = ref.backward_data_raw(wv, dyv, tuple(hw), pad, st, dil)
            np.testing.assert_allclose(out, np.moveaxis(want, 1, -1).reshape(-1, c), rtol=1e-10, atol=1e-10)
        else:   # per block: its pixels' sums; the partials [block][K][C] added in block order by the fold
            assert pl.fold_params.splits == pl.blocks and pl.workspace >= pl.blocks * k * c * 4
            part = np.zeros((pl.blocks, k, c))
            for blk, pix in seen.items():
                part[blk] = dyf[pix].T @ xf[pix]
            got = part.sum(axis=0)
            want = ref.backward_filter_raw(xv, dyv, (1,) * len(hw), pad, st, dil)
            np.testing.assert_allclose(got, want.reshape(k, c), rtol=1e-10, atol=1e-10)


def test_unet_head_ranks_and_blocks():
    """The UNet head (N 8, 32, 128): Get..._v7 puts the narrow plans first in every direction."""
    h = cpu_handle("sm_90", 132)
    for n in (8, 32, 128):
        conv, x, w, y = _descs(n, 64, 2, (128, 128))
        assert pydnn.get_convolution_forward_algorithm_v7(h, x, w, conv, y, 4)[0].algo == FWD0
        assert pydnn.get_convolution_backward_data_algorithm_v7(h, w, y, conv, x, 4)[0].algo == BWD_D0
        assert pydnn.get_convolution_backward_filter_algorithm_v7(h, x, y, conv, w, 4)[0].algo == BWD_F0
        pl = P.new_plan(h, Pb.DIR_BWD_FILTER, BWD_F0, conv, x, w, y)
        assert pl.blocks == NW.WGRAD_BLOCKS_PER_SM * 132 and pl.fold_step is not None
        pl = P.new_plan(h, Pb.DIR_FWD, FWD0, conv, x, w, y)
        assert pl.blocks == min(16 * 132, -(-n * 128 * 128 // (8 * 4 * 4)))


def _nvrtc_ok():
    try:
        from pydnn._cuda import nvrtc
        nvrtc.version()
        return True
    except Exception:  # noqa: BLE001
        return False


@pytest.mark.skipif(not _nvrtc_ok() or os.environ.get("PYDNN_SKIP_SLOW_COMPILE") == "1", reason="no NVRTC")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("tag", ["bf16", "f16"])
def test_narrow_unit_compiles(arch, tag):
    from pydnn._build.build import compile_unit
    unit = [u for u in P.kernel_units(NW.unit(tag)) if u.name == NW.unit(tag)][0]
    assert list(unit.exprs) == NW.exprs(tag)
    cubin, lowered = compile_unit(unit, arch)
    assert len(cubin) > 0 and all(e in lowered for e in unit.exprs)
