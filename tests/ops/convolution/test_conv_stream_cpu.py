"""The streaming 1x1 convolutions (ops/convolution/stream.py, ptx/conv_stream.cu; tuning.conv.STREAM_1X1) on the
CPU: where they serve; a numpy emulation of the kernel's schedule (each block's grid-stride tiles, the 4-deep
cp.async ring's slots, the zero-filled rows / columns / reduction tail, the 8 warps' 16 x NT/2 parts, the 16-byte
stores of the plain epilogue after the quad transpose and the pair stores of the fused one) against the float64
reference, every output element written once; the plan's launch and parameters; NVRTC compiles the largest
instantiations without spills (in 128 registers where 2 blocks of 256 threads share a SM)."""
import sys
from pathlib import Path

import numpy as np
import pytest

import pydnn
from pydnn import tuning
from pydnn._cuda import driver
from pydnn.ops.convolution import plans as P, problem as Pb, stream as S
from pydnn.reference import convolution as ref

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools"))
from plan_digest import cpu_handle, descriptors  # noqa: E402

BF16, F16, F32 = pydnn.PYDNN_DATA_BFLOAT16, pydnn.PYDNN_DATA_HALF, pydnn.PYDNN_DATA_FLOAT
XCORR = pydnn.PYDNN_CROSS_CORRELATION
FWD1, BWD_D1 = pydnn.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_1
DIRS = ((Pb.DIR_FWD, FWD1), (Pb.DIR_BWD_DATA, BWD_D1))


def _descs(n, c, k, hw, dtype=BF16, nhwc=True, filt=1, pad=0, stride=1, groups=1, math=pydnn.PYDNN_TENSOR_OP_MATH):
    p = (dtype, nhwc, True, n, c, k, groups, list(hw), [filt] * len(hw), [pad] * len(hw), [stride] * len(hw),
         [1] * len(hw), XCORR, math)
    return descriptors(p)


@pytest.fixture
def on():
    with tuning.override({"conv.STREAM_1X1": True}):
        yield


def test_where_the_stream_kernels_serve(on):
    h = cpu_handle("sm_90", 132)
    conv, x, w, y = _descs(32, 64, 64, (56, 56))
    for d, algo in DIRS:
        pl = P.new_plan(h, d, algo, conv, x, w, y)
        assert type(pl) is S.StreamPlan and pl.blocks == 2 * 132 and pl.align == 16
        assert pl.gemm_expr == S._expr("bf16", 64, 64, d == Pb.DIR_BWD_DATA)
        assert pl.smem == S.smem_bytes(64, 64, d == Pb.DIR_BWD_DATA) <= 227 * 1024 // 2
        assert (pl.gemm.gm, pl.gemm.gn, pl.gemm.gk) == (32 * 56 * 56, 64, 64)
    conv, x, w, y = _descs(2, 40, 520, (5, 7), F16)
    pl = P.new_plan(h, Pb.DIR_FWD, FWD1, conv, x, w, y)
    assert type(pl) is not S.StreamPlan   # output side 520 > 512
    conv, x, w, y = _descs(2, 40, 264, (5, 7), F16)   # forward: reduction 40 (KP 64), two column chunks
    pl = P.new_plan(h, Pb.DIR_FWD, FWD1, conv, x, w, y)
    assert type(pl) is S.StreamPlan and pl.chunks == 2 and pl.gemm.splits == 2 and pl.blocks == 2 * 2  # 2 tiles a chunk
    conv, x, w, y = _descs(2, 40, 248, (5, 7), F16)
    pl = P.new_plan(h, Pb.DIR_FWD, FWD1, conv, x, w, y)
    assert type(pl) is S.StreamPlan and pl.gemm_expr == S._expr("f16", 64, 256, False)
    assert "reduction 248" in S.refusal(Pb.problem(conv, x, w, y), Pb.DIR_BWD_DATA)
    for args, why in (((8, 136, 64, (16, 16)), "reduction 136"), ((8, 12, 64, (16, 16)), "reduction 12"),
                      ((8, 64, 60, (16, 16)), "output channels 60"),
                      ((8, 64, 64, (16, 16), BF16, False), "packed NHWC"),
                      ((8, 64, 64, (16, 16), F32), "half"), ((8, 64, 64, (16, 16), BF16, True, 3, 1), "1x1"),
                      ((8, 64, 64, (16, 16), BF16, True, 1, 0, 2), "1x1"),
                      ((8, 64, 64, (16, 16), BF16, True, 1, 0, 1, 2), "groups"),
                      ((8, 64, 64, (16, 16), BF16, True, 1, 0, 1, 1, pydnn.PYDNN_FMA_MATH), "FMA math"),
                      ((2**31 // 64 + 1, 16, 16, (8, 8)), "2^31")):
        conv, x, w, y = _descs(*args)
        assert why in S.refusal(Pb.problem(conv, x, w, y), Pb.DIR_FWD)
    # sm_90: an output side past 128 with a reduction of at least matmul.WG_PERSIST_MIN_K goes to the persistent
    # wgmma GEMM (stream.wgmma_takes); sm_80, or a shorter reduction, keeps the streaming kernels
    conv, x, w, y = _descs(8, 64, 256, (28, 28))
    pb = Pb.problem(conv, x, w, y)
    assert S.wgmma_takes(h, pb, Pb.DIR_FWD) and not S.wgmma_takes(h, pb, Pb.DIR_BWD_DATA)   # (bwd data: 256 -> 64)
    assert type(P.new_plan(h, Pb.DIR_FWD, FWD1, conv, x, w, y)) is not S.StreamPlan
    assert type(P.new_plan(h, Pb.DIR_BWD_DATA, BWD_D1, conv, x, w, y)) is not S.StreamPlan   # (reduction 256)
    assert type(P.new_plan(cpu_handle("sm_80", 108), Pb.DIR_FWD, FWD1, conv, x, w, y)) is S.StreamPlan
    with tuning.override({"matmul.WG_PERSIST_MIN_K": 128}):
        assert type(P.new_plan(h, Pb.DIR_FWD, FWD1, conv, x, w, y)) is S.StreamPlan
    conv, x, w, y = _descs(32, 64, 64, (56, 56))
    with tuning.override({"conv.STREAM_1X1": False}):
        for d, algo in DIRS:
            assert type(P.new_plan(h, d, algo, conv, x, w, y)) is not S.StreamPlan


def _emulate(pl, a, b, alpha, beta, out0, z=None, bias=None, relu=False, zmap=None):
    """The kernel's schedule over numpy data: a [M][R] (x or dy, packed), b the filter as the kernel reads it
    ([N][R] forward, [R][N] backward data), out0 the output before (NaN: poisoned). Returns (out, times each
    element was stored)."""
    p = pl.gemm
    M, N, R = p.gm, p.gn, p.gk
    kp = next(k for k in S.KPS if k >= R)
    nt = next((t for t in S.NTS if t >= N), S.NTS[-1])
    chunks = p.splits
    assert chunks == -(-N // nt) and pl.blocks % chunks == 0
    kn = pl.direction == Pb.DIR_BWD_DATA
    out, stores = out0.copy(), np.zeros(out0.shape, int)
    tiles, grid = -(-M // S.BM), pl.blocks
    step = grid // chunks
    plain = beta == 0 and z is None and bias is None and not relu
    for blk in range(grid):
        n0 = (blk % chunks) * nt   # this block's column chunk: its part of the filter in shared memory
        sb = np.zeros((kp, nt)) if kn else np.zeros((nt, kp))   # zero past N / R
        if kn:
            part = b[:R, n0:n0 + nt]
            sb[:R, :part.shape[1]] = part
        else:
            part = b[n0:n0 + nt, :R]
            sb[:part.shape[0], :R] = part
        bnk = sb.T if kn else sb                                 # [n][k] either way for the product
        ring = [None] * S.STAGES

        def load(tile, slot):
            t_ = np.zeros((S.BM, kp))
            rows = a[tile * S.BM:(tile + 1) * S.BM, :R]
            t_[:rows.shape[0], :R] = rows
            ring[slot] = (tile, t_)

        t = blk // chunks
        for s in range(S.STAGES - 1):    # the prologue: tiles t, t + step, ... into slots 0, 1, 2
            if t + s * step < tiles:
                load(t + s * step, s)
        it = 0
        while t < tiles:
            tn = t + (S.STAGES - 1) * step
            if tn < tiles:
                load(tn, (it + S.STAGES - 1) % S.STAGES)
            tile, at = ring[it % S.STAGES]
            assert tile == t, "the ring slot holds this iteration's tile"
            for warp in range(8):
                wm, wn = warp & 3, warp >> 2
                acc = at[wm * 16:wm * 16 + 16] @ bnk[wn * nt // 2:(wn + 1) * nt // 2].T   # 16 x NT/2
                row_base, col_base = t * S.BM + wm * 16, n0 + wn * nt // 2
                for lane in range(32):
                    g, q = lane >> 2, lane & 3
                    for hh in range(2):
                        row = row_base + g + 8 * hh
                        if plain:   # lane q: 8 columns of one row a 4-tile group (after the quad transpose)
                            for jj in range(nt // 2 // 32):
                                col = col_base + 32 * jj + 8 * q
                                if row < M and col < N:
                                    out[row, col:col + 8] = alpha * acc[g + 8 * hh, col - col_base:col - col_base + 8]
                                    stores[row, col:col + 8] += 1
                        else:       # pairs: n8 tile j's columns 2q, 2q + 1
                            for j in range(nt // 2 // 8):
                                col = col_base + 8 * j + 2 * q
                                if row < M and col < N:
                                    v = alpha * acc[g + 8 * hh, col - col_base:col - col_base + 2]
                                    if beta:
                                        v = v + beta * out[row, col:col + 2]
                                    if z is not None:
                                        v = v + z[zmap(row), col:col + 2]
                                    if bias is not None:
                                        v = v + bias[col:col + 2]
                                    if relu:
                                        v = np.maximum(v, 0)
                                    out[row, col:col + 2] = v
                                    stores[row, col:col + 2] += 1
            it += 1
            t += step
    return out, stores


@pytest.mark.parametrize("n,c,k,hw,grid", [(2, 64, 64, (9, 11), 3), (1, 40, 24, (13, 7), 2), (3, 16, 200, (5, 6), 4),
                                           (1, 8, 8, (3, 3), 1), (2, 56, 136, (8, 9), 132),
                                           (2, 32, 400, (7, 9), 2), (1, 40, 280, (11, 5), 3), (1, 24, 120, (6, 7), 2),
                                           (2, 104, 256, (5, 9), 5)])
def test_emulated_stream_kernel_matches_reference(on, n, c, k, hw, grid):
    """Tails everywhere: pixels not a multiple of 64, the output side not of NT / 2, the reduction not of 16; a
    grid of fewer blocks than tiles (each block walks several tiles through the ring) and of more (idle blocks);
    output sides past 256 (column chunks: 400, 280). On an sm_80 handle: the schedule does not depend on the
    arch, and sm_90 sends the wide-output, long-reduction cases to the wgmma GEMM (stream.wgmma_takes)."""
    h = cpu_handle("sm_80", 108)
    rng = np.random.default_rng(11)
    conv, x, w, y = _descs(n, c, k, hw)
    xv, wv, dyv = (rng.standard_normal((n, c) + hw), rng.standard_normal((k, c, 1, 1)),
                   rng.standard_normal((n, k) + hw))
    xf, dyf, wm = np.moveaxis(xv, 1, -1).reshape(-1, c), np.moveaxis(dyv, 1, -1).reshape(-1, k), wv.reshape(k, c)
    pad, st, dil = (0, 0), (1, 1), (1, 1)
    for d, algo in DIRS:
        pl = P.new_plan(h, d, algo, conv, x, w, y)
        if S.refusal(Pb.problem(conv, x, w, y), d):   # (backward data of C 200 / 136: a reduction past 64)
            assert type(pl) is not S.StreamPlan and k > S.MAX_R
            continue
        assert type(pl) is S.StreamPlan
        pl.blocks = grid * pl.chunks   # (blocks per chunk: grid)
        if d == Pb.DIR_FWD:
            a, b, want = xf, wm, np.moveaxis(ref.forward_raw(xv, wv, pad, st, dil), 1, -1).reshape(-1, k)
        else:
            a, b, want = dyf, wm, np.moveaxis(ref.backward_data_raw(wv, dyv, hw, pad, st, dil), 1, -1).reshape(-1, c)
        poisoned = np.full(want.shape, np.nan)
        got, stores = _emulate(pl, a, b, 0.5, 0.0, poisoned)
        assert (stores == 1).all(), "every element stored once"
        np.testing.assert_allclose(got, 0.5 * want, rtol=1e-12, atol=1e-12)
        old = rng.standard_normal(want.shape)
        got, stores = _emulate(pl, a, b, -1.5, 0.25, old)
        assert (stores == 1).all()
        np.testing.assert_allclose(got, -1.5 * want + 0.25 * old, rtol=1e-12, atol=1e-12)
        if d == Pb.DIR_FWD:   # the fused forward: + z + bias, then ReLU
            zv, bv = rng.standard_normal(want.shape), rng.standard_normal(k)
            got, stores = _emulate(pl, a, b, 1.0, 0.0, poisoned, z=zv, bias=bv, relu=True, zmap=lambda r: r)
            assert (stores == 1).all()
            np.testing.assert_allclose(got, np.maximum(want + zv + bv, 0), rtol=1e-12, atol=1e-12)


def test_launch_and_parameters(on):
    """The plan's launch: its grid / block / shared memory, the ConvParams' pointers and sizes, beta's flag, and the
    misaligned pointers it refuses."""
    h = cpu_handle("sm_90", 132)
    conv, x, w, y = _descs(4, 32, 48, (10, 10))
    for d, algo in DIRS:
        pl = P.new_plan(h, d, algo, conv, x, w, y)
        assert type(pl) is S.StreamPlan
        pl.gemm_func = 0x1234   # (a CPU handle's kernels are placeholders: the launch is recorded, not made)
        with driver.recording() as items:
            P.run_plan(h, pl, 1 << 32, 2 << 32, 3 << 32, 0, 1.0, 0.5)
        (kind, func, grid, block, smem, params), = items
        assert (kind, func, grid, block, smem) == ("k", 0x1234, (pl.blocks, 1, 1), (256, 1, 1), pl.smem)
        got = Pb.ConvParams.from_buffer_copy(params)
        assert (got.x, got.w, got.out, got.z, got.bias) == (1 << 32, 2 << 32, 3 << 32, None, None)
        assert (got.alpha, got.beta, got.flags & 1) == (1.0, 0.5, 1)
        assert (got.gm, got.gn, got.gk) == (400, 48 if d == Pb.DIR_FWD else 32, 32 if d == Pb.DIR_FWD else 48)
        with pytest.raises(pydnn.PydnnError) as e:
            P.run_plan(h, pl, (1 << 32) + 8, 2 << 32, 3 << 32, 0, 1.0, 0.0)
        assert e.value.status == pydnn.PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER and "16-byte" in str(e.value)


@pytest.mark.parametrize("kp,nt,kn", [(64, 256, False), (64, 256, True), (128, 256, False), (128, 256, True),
                                      (128, 128, False)])
def test_largest_instantiations_compile_without_spills(kp, nt, kn):
    nvrtc = pytest.importorskip("pydnn._cuda.nvrtc")
    try:
        nvrtc.version()
    except Exception as e:  # noqa: BLE001 - no NVRTC here
        pytest.skip(f"no NVRTC: {e}")
    from pydnn._build import cache
    u = [u for u in P.kernel_units(S.unit("bf16")) if u.name == S.unit("bf16")][0]
    text, _ = cache.unit_inputs(u)
    expr = S._expr("bf16", kp, nt, kn)
    cubin, lowered, log = nvrtc.compile_cubin(text, u.source, (expr,), "sm_90", ("-std=c++17", "--ptxas-options=-v"),
                                              [str(cache.ptx_dir())])
    assert cubin and set(lowered) == {expr}
    regs = [int(line.split("Used ")[1].split()[0]) for line in log.splitlines() if "Used " in line]
    per_sm = S.blocks_per_sm(kp, nt, kn)   # (StreamMinBlocks: __launch_bounds__(256, 2) caps at 128 registers)
    assert regs and max(regs) <= (128 if per_sm == 2 else 255), log
    assert per_sm == (2 if kp <= 64 or nt <= 128 else 1) and per_sm * S.smem_bytes(kp, nt, kn) <= S.SMEM_PER_SM
    assert "0 bytes spill stores, 0 bytes spill loads" in log, log
