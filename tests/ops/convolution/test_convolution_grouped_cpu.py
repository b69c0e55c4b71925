"""The grouped tensor-core convolutions (ops/convolution/grouped.py) on the CPU: which plans the planner
and Get..._v7 pick for ResNeXt-50's grouped 3x3 layers, where the path passes (and the NOT_SUPPORTED
messages stay as they were), the packing rule, a numpy emulation of the kernels' group / supergroup index
mapping (filter_group_pack, group_view's channel offsets, the dense supergroup GEMM, fold_group_diag over
split partials) against the float64 reference, and NVRTC compiles of every new instantiation."""
import os
import sys
from pathlib import Path

import numpy as np
import pytest

import pydnn
from pydnn.ops.convolution import dgrad_phases as D, grouped as G, plans as P, problem as Pb
from pydnn.reference import convolution as ref

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools"))
from plan_digest import cpu_handle, descriptors  # noqa: E402

BF16, F16, F32 = pydnn.PYDNN_DATA_BFLOAT16, pydnn.PYDNN_DATA_HALF, pydnn.PYDNN_DATA_FLOAT
XCORR, CONV = pydnn.PYDNN_CROSS_CORRELATION, pydnn.PYDNN_CONVOLUTION
FWD_PRE = pydnn.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM
BWD_D1, BWD_F1 = pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_1, pydnn.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_1


@pytest.fixture(autouse=True)
def _packed_path(monkeypatch):
    """This module covers grouped.py's packed supergroups: the direct kernel (grouped_direct.py, which
    ranks first where C/g == K/g <= 32) is switched off here; test_convolution_grouped_direct_* cover it."""
    from pydnn import tuning
    monkeypatch.setattr(tuning.conv, "GROUPED_DIRECT", False)


def _descs(c, k, hw, groups, stride=1, dtype=BF16, n=32, nhwc=True, filt=3, math=pydnn.PYDNN_DEFAULT_MATH):
    p = (dtype, nhwc, True, n, c, k, groups, [hw, hw], [filt, filt], [filt // 2] * 2, [stride, stride], [1, 1],
         XCORR, math)
    return descriptors(p)


RESNEXT = [(128, 56, 1), (256, 28, 1), (512, 14, 1), (1024, 7, 1), (256, 56, 2), (512, 28, 2), (1024, 14, 2)]


@pytest.mark.parametrize("arch,sms", [("sm_90", 132), ("sm_80", 108)])
@pytest.mark.parametrize("c,hw,stride", RESNEXT)
def test_resnext_layers_pick_the_grouped_tensor_core_plans(arch, sms, c, hw, stride):
    conv, x, w, y = _descs(c, c, hw, 32, stride)
    h = cpu_handle(arch, sms)
    for fn, args, d, algo in ((pydnn.get_convolution_forward_algorithm_v7, (x, w, conv, y), Pb.DIR_FWD, FWD_PRE),
                              (pydnn.get_convolution_backward_data_algorithm_v7, (w, y, conv, x), Pb.DIR_BWD_DATA,
                               BWD_D1),
                              (pydnn.get_convolution_backward_filter_algorithm_v7, (x, y, conv, w),
                               Pb.DIR_BWD_FILTER, BWD_F1)):
        top = fn(h, *args, 16)[0]
        assert top.algo == algo and top.status == pydnn.PYDNN_STATUS_SUCCESS
        assert top.determinism == pydnn.PYDNN_DETERMINISTIC
        pl = P.new_plan(h, d, algo, conv, x, w, y)
        if d == Pb.DIR_BWD_DATA and stride > 1:  # the stride's phases, each a grouped plan (dgrad_phases.py)
            assert type(pl) is D.PhasePlan and len(pl.subs) == 4 and pl.fill is None
            assert pl.workspace == max(sp.workspace for sp, _, _, _ in pl.subs)
            pl = pl.subs[-1][0]
        assert type(pl) is G.GroupedPlan
        cg = c // 32
        assert pl.P == min(16, 64 // cg) and pl.spb.cg == pl.P * cg and pl.spb.groups == 32 // pl.P
        g = pl.sub.gemm_grid
        assert g[2] == pl.spb.groups * (pl.splits if d == Pb.DIR_BWD_FILTER else 1)
        if d in (Pb.DIR_FWD, Pb.DIR_BWD_DATA):   # (backward data with stride 2: each phase at stride 1)
            assert "implicit_gemm_pipe_tc_grouped" in pl.gemm_expr   # 64 packed channels: the 64-deep pipe
        else:
            assert "wgrad_pipe_tc_grouped" in pl.gemm_expr
        assert pl.workspace > 0 and pl.workspace % 256 == 0


def test_packing_rule():
    class Pbx:
        pass

    def pk(groups, cg, kg):
        p = Pbx()
        p.groups, p.cg, p.kg = groups, cg, kg
        return G.packing(p)

    assert pk(32, 4, 4) == 16 and pk(32, 8, 8) == 8 and pk(32, 16, 16) == 4 and pk(32, 32, 32) == 2
    assert pk(4, 64, 64) == 1 and pk(2, 128, 128) == 1
    assert pk(4, 16, 8) == 4          # K/g 8: 4 groups (P * K/g = 32 <= 64, P divides 4)
    assert pk(4, 24, 24) == 2         # 48 channels a supergroup
    assert pk(3, 4, 4) is None        # P 1 or 3: 4 or 12 channels, not multiples of 8
    assert pk(6, 4, 4) == 6           # 24 channels (a multiple of 8)


def test_where_the_grouped_path_passes_and_messages_stay():
    h = cpu_handle("sm_90", 132)
    # fp32: refused by the tensor-core rule, message as before
    conv, x, w, y = _descs(256, 256, 14, 32, dtype=F32)
    with pytest.raises(pydnn.PydnnError) as e:
        P.new_plan(h, Pb.DIR_FWD, FWD_PRE, conv, x, w, y)
    assert e.value.status == pydnn.PYDNN_STATUS_NOT_SUPPORTED
    assert str(e.value).endswith("algo: IMPLICIT_PRECOMP_GEMM runs on tensor cores for half and bfloat16 data "
                                 "only (float would need TF32, not implemented)") or "half and bfloat16" in str(e.value)
    # NCHW data: the grouped path passes; IMPLICIT_PRECOMP_GEMM's reason names the groups as before
    conv, x, w, y = _descs(256, 256, 14, 32, nhwc=False)
    with pytest.raises(pydnn.PydnnError) as e:
        P.new_plan(h, Pb.DIR_FWD, FWD_PRE, conv, x, w, y)
    assert "needs groupCount 1 (got 32)" in str(e.value)
    # FMA math: no tensor cores
    conv, x, w, y = _descs(256, 256, 14, 32, math=pydnn.PYDNN_FMA_MATH)
    with pytest.raises(pydnn.PydnnError) as e:
        P.new_plan(h, Pb.DIR_FWD, FWD_PRE, conv, x, w, y)
    assert "FMA math type" in str(e.value)
    # depthwise: not packed (64x waste); backward filter ALGO_1 stays the CUDA-core split
    conv, x, w, y = _descs(64, 64, 14, 64)
    pl = P.new_plan(h, Pb.DIR_BWD_FILTER, BWD_F1, conv, x, w, y)
    assert type(pl) is not G.GroupedPlan and "implicit_gemm<2" in pl.gemm_expr
    # one group: the dense tensor-core plans, unchanged
    conv, x, w, y = _descs(64, 64, 14, 1)
    assert type(P.new_plan(h, Pb.DIR_FWD, FWD_PRE, conv, x, w, y)) is not G.GroupedPlan


# ----------------------------------------------------------------------------- numpy emulation

def _pack(w_kcrs, groups, P_):
    """filter_group_pack, element by element as the kernel indexes (w given as [K][cg][R][S], read through
    its strides there): out[i], i = ((k * taps) + tap) * cg2 + c2."""
    K, cg, R, S = w_kcrs.shape
    kg, taps, cg2 = K // groups, R * S, P_ * cg
    out = np.zeros(K * taps * cg2)
    for i in range(out.size):
        c2, tap, k = i % cg2, i // cg2 % taps, i // (cg2 * taps)
        j = (k // kg) % P_
        if c2 // cg == j:
            out[i] = w_kcrs[k, c2 % cg, tap // S, tap % S]
    return out.reshape(K, R, S, cg2)


def _dense_nhwc_forward(x, wp, pad, stride):
    """One dense NHWC forward: x [N][H][W][C], wp [K][R][S][C] -> y [N][OH][OW][K] (cross-correlation)."""
    N, H, W, C = x.shape
    K, R, S, _ = wp.shape
    OH, OW = (H + 2 * pad - R) // stride + 1, (W + 2 * pad - S) // stride + 1
    xp = np.zeros((N, H + 2 * pad, W + 2 * pad, C))
    xp[:, pad:pad + H, pad:pad + W] = x
    y = np.zeros((N, OH, OW, K))
    for r in range(R):
        for s in range(S):
            win = xp[:, r:r + stride * OH:stride, s:s + stride * OW:stride, :]
            y += win @ wp[:, r, s, :].T
    return y


@pytest.mark.parametrize("groups,cg,kg,stride", [(8, 4, 4, 1), (4, 16, 8, 2), (4, 24, 24, 1), (2, 32, 32, 1)])
def test_emulated_supergroup_forward_matches_reference(groups, cg, kg, stride):
    rng = np.random.default_rng(7)
    N, H, W, R = 2, 7, 5, 3
    x = rng.standard_normal((N, groups * cg, H, W))
    w = rng.standard_normal((groups * kg, cg, R, R))
    P_ = G.packing(type("p", (), {"groups": groups, "cg": cg, "kg": kg})())
    wp = _pack(w, groups, P_)
    xn = x.transpose(0, 2, 3, 1)
    cg2, kg2, g2 = P_ * cg, P_ * kg, groups // P_
    outs = []
    for g in range(g2):   # grid.z = g: group_view's offsets (x channels g * cg2, filter rows / y channels g * kg2)
        outs.append(_dense_nhwc_forward(xn[..., g * cg2:(g + 1) * cg2], wp[g * kg2:(g + 1) * kg2], 1, stride))
    y = np.concatenate(outs, axis=-1).transpose(0, 3, 1, 2)
    want = ref.forward_raw(x, w, (1, 1), (stride, stride), (1, 1), groups, True)
    np.testing.assert_allclose(y, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("groups,cg,kg,splits", [(8, 4, 4, 3), (4, 16, 8, 2), (2, 32, 32, 1)])
def test_emulated_supergroup_wgrad_and_diagonal_fold_match_reference(groups, cg, kg, splits):
    """wgrad_*_grouped's partials [split][supergroup][kg2][tap][cg2] over fixed reduction slices, then
    fold_group_diag's indexing (the diagonal blocks, flipped in CONVOLUTION mode) against the reference."""
    rng = np.random.default_rng(11)
    N, H, W, R, S = 3, 6, 5, 3, 3
    for cross in (True, False):
        x = rng.standard_normal((N, groups * cg, H, W))
        dy = rng.standard_normal((N, groups * kg, H, W))
        P_ = G.packing(type("p", (), {"groups": groups, "cg": cg, "kg": kg})())
        cg2, kg2, g2, taps = P_ * cg, P_ * kg, groups // P_, R * S
        xn = np.zeros((N, H + 2, W + 2, groups * cg))
        xn[:, 1:1 + H, 1:1 + W] = x.transpose(0, 2, 3, 1)
        dyn = dy.transpose(0, 2, 3, 1).reshape(N * H * W, groups * kg)
        pos = N * H * W
        kps = -(-pos // splits)
        part = np.zeros((splits, g2, kg2, taps * cg2))
        for sl in range(splits):
            lo, hi = sl * kps, min(pos, (sl + 1) * kps)
            for g in range(g2):
                a = dyn[lo:hi, g * kg2:(g + 1) * kg2]                   # A: dy channels g * kg2
                cols = []
                for tap in range(taps):                                 # B: x channels g * cg2, (tap, c)
                    r, s = tap // S, tap % S
                    xw = xn[:, r:r + H, s:s + W, g * cg2:(g + 1) * cg2].reshape(pos, cg2)[lo:hi]
                    cols.append(xw)
                part[sl, g] = a.T @ np.concatenate(cols, axis=1)
        flat = part.reshape(-1)
        dw = np.zeros((groups * kg, cg, R, S))
        per_group = kg * cg * taps
        for i in range(per_group * groups):   # fold_group_diag's thread i
            gg, rr = i // per_group, i % per_group
            c, rr = rr % cg, rr // cg
            tap, m = rr % taps, rr // taps
            sg, j = gg // P_, gg % P_
            gn, per_sg = cg2 * taps, kg2 * cg2 * taps
            col = tap * cg2 + j * cg + c
            base = sg * per_sg + (j * kg + m) * gn + col
            v = sum(flat[sl * g2 * per_sg + base] for sl in range(splits))
            r, s = tap // S, tap % S
            if not cross:
                r, s = R - 1 - r, S - 1 - s
            dw[gg * kg + m, c, r, s] = v
        want = ref.backward_filter_raw(x, dy, (R, S), (1, 1), (1, 1), (1, 1), groups, cross)
        np.testing.assert_allclose(dw, want, rtol=1e-10, atol=1e-10)


# ----------------------------------------------------------------------------- NVRTC

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
def test_grouped_unit_compiles(arch, tag):
    """Every instantiation of the grouped unit compiles (NVRTC, no GPU needed) and lowers to a name."""
    from pydnn._build.build import compile_unit
    unit = [u for u in P.kernel_units(G.unit(tag)) if u.name == G.unit(tag)][0]
    assert len(unit.exprs) == len(G.exprs(tag))
    cubin, lowered = compile_unit(unit, arch)
    assert len(cubin) > 0 and all(e in lowered for e in unit.exprs)


# the GPU test's cases (test_convolution_grouped_gpu.CASES, repeated here: that module needs a device):
# every direction plans the grouped path on both devices, with the kernels the GPU test means to cover
GPU_CASES = [  # xdims, k, filt, pad, stride, dil, groups, filter NHWC
    ((2, 128, 13, 11), 128, (3, 3), (1, 1), (1, 1), (1, 1), 32, True),
    ((2, 256, 9, 7), 256, (3, 3), (1, 1), (1, 1), (1, 1), 32, True),
    ((3, 512, 7, 9), 512, (3, 3), (1, 1), (2, 2), (1, 1), 32, True),
    ((2, 1024, 5, 3), 1024, (3, 3), (1, 1), (1, 1), (1, 1), 32, True),
    ((2, 64, 11, 13), 64, (3, 3), (1, 1), (1, 1), (1, 1), 2, False),
    ((2, 256, 9, 9), 256, (3, 3), (1, 1), (1, 1), (1, 1), 4, True),
    ((2, 64, 10, 7), 32, (3, 3), (1, 1), (2, 2), (1, 1), 4, True),
    ((2, 64, 7, 7), 128, (1, 1), (0, 0), (1, 1), (1, 1), 2, True),
    ((2, 96, 9, 11), 96, (3, 3), (2, 0), (1, 1), (2, 1), 4, False),
    ((1, 32, 6, 5), 64, (3, 3), (1, 1), (2, 1), (1, 1), 4, True),
    ((8, 512, 14, 14), 512, (3, 3), (1, 1), (1, 1), (1, 1), 32, True),
]


def test_gpu_cases_plan_the_grouped_path():
    seen = set()
    for arch, sms in (("sm_90", 132), ("sm_80", 108)):
        h = cpu_handle(arch, sms)
        for xd, k, filt, pad, st, dil, groups, fnhwc in GPU_CASES:
            for dtype in (BF16, F16):
                for mode in (XCORR, CONV):
                    p = (dtype, True, fnhwc, xd[0], xd[1], k, groups, list(xd[2:]), list(filt), list(pad), list(st),
                         list(dil), mode, pydnn.PYDNN_DEFAULT_MATH)
                    conv, x, w, y = descriptors(p)
                    for d, algo in ((Pb.DIR_FWD, FWD_PRE), (Pb.DIR_BWD_DATA, BWD_D1), (Pb.DIR_BWD_FILTER, BWD_F1)):
                        pl = P.new_plan(h, d, algo, conv, x, w, y)
                        # strided backward data: the stride's phases (dgrad_phases.py), each a grouped plan
                        subs = [sp for sp, _, _, _ in pl.subs] if type(pl) is D.PhasePlan else [pl]
                        assert type(pl) is not D.PhasePlan or (d == Pb.DIR_BWD_DATA and max(st) > 1)
                        for sp in subs:
                            assert type(sp) is G.GroupedPlan, (xd, k, groups, d)
                            assert sp.workspace > 0 and sp.deterministic
                            seen.add(sp.gemm_expr.split("<")[0].split("::")[-1] + str(sp.cfg))
    # the cases cover every kernel family of the unit (both pipe directions, both tc directions, both wgrads
    # where their rules send them)
    names = {s.split("(")[0] for s in seen}
    assert {"implicit_gemm_pipe_tc_grouped", "fwd_tc_grouped", "bwd_data_tc_grouped",
            "wgrad_pipe_tc_grouped"} <= names, names
