"""The graph API's fused GEMMs on gemm_tma (sm_90: where the plain planner runs gemm_tma, the fused graph's
kernel is gemm_tma_body with the generated epilogue): matmul + bias + GELU, matmul + bias + residual add and
matmul + bias + row MAX, each ONE launch (counted), against float64 numpy. Interior tiles (the WIDE 16-byte
stores where C's rows are 16-byte aligned, the pair stores where they are not), edge tiles in m and n, a
ragged K, batches, B transposed through strides; handle.sm_count patched small where a case needs the
chooser's 128x256 tile on a small problem (then a grid of that many blocks walks many tiles: the row
reduction's counters are reached by one block several times). Outputs start poisoned and their gaps are
checked untouched; a second execute of the row reduction gives bitwise the same rows (its counters left 0)."""
import numpy as np
import pytest

import pydnn as P
from devtensor import DevTensor, assert_close
from pydnn._cuda import driver
from pydnn.graph import Graph
from pydnn.ops import matmul as M
from pydnn.reference import graph as ref

pytestmark = pytest.mark.gpu
F32, BF16, F16 = P.PYDNN_DATA_FLOAT, P.PYDNN_DATA_BFLOAT16, P.PYDNN_DATA_HALF


class Launches:
    """Counts cuLaunchKernel calls made through pydnn's launch paths."""

    def __init__(self, monkeypatch):
        self.n = 0
        for name in ("launch_args", "launch"):
            orig = getattr(driver, name)

            def counted(*a, _orig=orig, **k):
                self.n += 1
                return _orig(*a, **k)
            monkeypatch.setattr(driver, name, counted)


def _sm90(handle, monkeypatch, sm_count):
    if handle.arch != M.WG_ARCH:
        pytest.skip(f"gemm_tma runs on {M.WG_ARCH} only")
    if sm_count:
        monkeypatch.setattr(handle, "sm_count", sm_count)


def _graph(handle, io, kind, m, n, k, batch, tb):
    """gelu(x @ W + b), x @ W + b + r, or max over n of (x @ W + b) (intermediate FLOAT); W [batch, k, n],
    given transposed ([n, k] in memory) when tb."""
    g = Graph(io_data_type=io, intermediate_data_type=F32, compute_data_type=F32, handle=handle)
    a = g.tensor(name="a", dim=[batch, m, k])
    # W batched like A: a broadcast B (batch stride 0) has no TMA map (tensormap.map_problem), so such a graph
    # stays on the wgmma tile
    w = g.tensor(name="w", dim=[batch, k, n], stride=[k * n, 1, k] if tb else [k * n, n, 1])
    bias = g.tensor(name="bias", dim=[1, 1, n])
    v = g.add(g.matmul(a, w), bias)
    r = None
    if kind == "gelu":
        y = g.gelu(v)
    elif kind == "residual":
        r = g.tensor(name="r", dim=[batch, m, n])
        y = g.add(v, r)
    else:
        y = g.reduction(v, P.PYDNN_REDUCE_TENSOR_MAX, dim=[batch, m, 1])
    y.set_output(True)
    return g, (a, w, bias, r, y)


def _run(handle, rng, monkeypatch, io, kind, m, n, k, batch, tb, sm_count, tma=True):
    _sm90(handle, monkeypatch, sm_count)
    g, (a, w, bias, r, y) = _graph(handle, io, kind, m, n, k, batch, tb)
    g.build_operation_graph().create_execution_plans().check_support().build_plans()
    assert g.engine_index() == 1 and g.launches() == 1
    step = g._plan_obj.built.steps[0]
    rec = step.recs[0][0]
    if tma:
        assert rec.maps is not None and "gemm_tma" in rec.expr, "the fused GEMM is not on gemm_tma"
    else:
        assert rec.maps is None and "gemm_wgmma" in rec.expr
    ta = DevTensor(a.dim, io)
    tw = DevTensor(w.dim, io, strides=w.stride)
    tb_, ty = DevTensor(bias.dim, io), DevTensor(y.dim, io)
    av, wv, bv = ta.random(rng, -1, 1), tw.random(rng, -1, 1), tb_.random(rng, -1, 1)
    bufs = {a: ta.ptr, w: tw.ptr, bias: tb_.ptr, y: ty.ptr}
    c = np.matmul(av, wv) + bv
    scale = np.matmul(np.abs(av), np.abs(wv)) + np.abs(bv)
    if r is not None:
        tr = DevTensor(r.dim, io)
        rv = tr.random(rng, -1, 1)
        bufs[r] = tr.ptr
        c, scale = c + rv, scale + np.abs(rv)
    n_ws = g.get_workspace_size()
    ws = P.DeviceArray((max(n_ws, 1),), np.uint8) if n_ws else None
    count = Launches(monkeypatch)
    g.execute(bufs, ws.ptr if ws else 0, handle=handle)
    assert count.n == 1
    got = ty.download()
    if kind == "gelu":
        assert_close(got, ref.pointwise("GELU_FWD", c), io, f"fused tma gelu {m}x{n}x{k}", scale=scale)
    elif kind == "residual":
        assert_close(got, c, io, f"fused tma residual {m}x{n}x{k}", scale=scale)
    else:
        assert_close(got, c.max(-1, keepdims=True), io, f"fused tma row max {m}x{n}x{k}",
                     scale=scale.max(-1, keepdims=True))
    ty.check_untouched()
    if kind == "rowmax":  # the counters were left 0: again, bitwise the same rows
        ty.poison()
        g.execute(bufs, ws.ptr, handle=handle)
        np.testing.assert_array_equal(ty.download(), got)
    return step


# (m, n, k, batch, B transposed, sm_count): interior tiles on the real grid; edges (m % 128, n % 256), a ragged
# K (k % 64 = 8), batches and a grid of 2 blocks walking the tiles; C rows not 16-byte aligned (n % 8 = 2,
# B transposed so that its rows stay 16-byte aligned): the pair stores
GELU_CASES = [(2048, 2048, 512, 1, False, 0), (1000, 1096, 520, 2, False, 2), (520, 1090, 264, 1, True, 2)]


@pytest.mark.parametrize("m, n, k, batch, tb, sms", GELU_CASES, ids=["interior", "edges_batched", "nt_pairs"])
def test_fused_tma_bias_gelu(handle, rng, monkeypatch, m, n, k, batch, tb, sms):
    _run(handle, rng, monkeypatch, BF16, "gelu", m, n, k, batch, tb, sms)


def test_fused_tma_bias_gelu_f16(handle, rng, monkeypatch):
    _run(handle, rng, monkeypatch, F16, "gelu", 600, 712, 520, 1, False, 2)


@pytest.mark.parametrize("m, n, k, batch, tb, sms", [(600, 712, 520, 2, False, 2), (2048, 2048, 512, 1, True, 0)],
                         ids=["edges_batched", "interior_nt"])
def test_fused_tma_bias_residual(handle, rng, monkeypatch, m, n, k, batch, tb, sms):
    _run(handle, rng, monkeypatch, BF16, "residual", m, n, k, batch, tb, sms)


@pytest.mark.parametrize("m, n, k, batch, sms", [(700, 600, 512, 2, 2), (2048, 2048, 512, 1, 0)],
                         ids=["walk_2_blocks", "full_grid"])
def test_fused_tma_bias_row_max(handle, rng, monkeypatch, m, n, k, batch, sms):
    """The row reduction's block barriers on gemm_tma are named ones over the consumer warpgroups (epi_sync):
    a hang or a wrong row here is that protocol."""
    _run(handle, rng, monkeypatch, BF16, "rowmax", m, n, k, batch, False, sms)


@pytest.mark.parametrize("kind", ["gelu", "rowmax"])
def test_fused_wgmma_with_tma_off(handle, rng, monkeypatch, kind):
    """tuning.matmul.USE_TMA off: the fused GEMM stays on the persistent wgmma tile (gemm_wgmma_body), the path
    tests/graph's fused tests took before gemm_tma took their shapes."""
    from pydnn import tuning

    monkeypatch.setattr(tuning.matmul, "USE_TMA", False)
    _run(handle, rng, monkeypatch, BF16, kind, 700, 712, 520, 2, False, 2, tma=False)


# ----------------------------------------------------------------------------- the ping-pong candidate

@pytest.mark.parametrize("kind, m, n, k, batch, tb, sms", [("gelu", 1000, 1096, 520, 2, False, 2),
                                                           ("gelu", 2048, 2048, 512, 1, False, 0),
                                                           ("residual", 600, 712, 520, 2, True, 3)],
                         ids=["gelu_edges_2_blocks", "gelu_full_grid", "residual_nt_3_blocks"])
@pytest.mark.parametrize("tile", ["pp", "ppc"])
def test_pp_candidate_fused(handle, rng, monkeypatch, kind, m, n, k, batch, tb, sms, tile):
    """The ping-pong candidate (TMA_PP_TILE: each consumer warpgroup a whole 128 x 128 tile, every other item,
    the K loops taking turns through named barriers 2 / 3) with the fused epilogues: an odd number of items a
    block, edges, a ragged K, batches, B transposed. ppc: its 2-CTA cluster form (TMA_PPC_TILE, B multicast; an
    odd tiles_m in the residual case: a pair past it stores nothing; 3 SMs make one cluster)."""
    M.pp_units()
    t = M.TMA_PPC_TILE if tile == "ppc" else M.TMA_PP_TILE
    monkeypatch.setattr(M, "_tma_tile", lambda: t)
    step = _run(handle, rng, monkeypatch, BF16, kind, m, n, k, batch, tb, sms)
    assert step.recs[0][0].expr == t.expr("bf16", False, tb)


@pytest.mark.parametrize("ta, tb", [(False, False), (False, True), (True, False), (True, True)])
@pytest.mark.parametrize("tile", ["pp", "ppc"])
def test_pp_candidate_plain(handle, rng, monkeypatch, ta, tb, tile):
    """The plain ping-pong kernel (alpha, beta, bias through its NoEpi epilogue) on 3 blocks walking the tiles
    of a problem with edges in m, n and K, 2 batches, every transposition, against float64. ppc: the cluster
    form on one cluster of 2 blocks (m 456: 4 tile rows; and m 584: 5, a pair past the last)."""
    from devtensor import POISON
    from pydnn.reference import dtypes as rd

    _sm90(handle, monkeypatch, 3)
    M.pp_units()
    t = M.TMA_PPC_TILE if tile == "ppc" else M.TMA_PP_TILE
    monkeypatch.setattr(M, "_tma_tile", lambda: t)
    m, n, k, batch = (584 if tile == "ppc" and ta else 456), 392, 328, 2
    plan = M.gemm_plan(handle, BF16, m, n, k, trans_a=ta, trans_b=tb, batch=batch, stride_a=m * k, stride_b=k * n,
                       stride_c=m * n, bias=True)
    assert plan.tma is not None and plan.tma.expr == t.expr("bf16", ta, tb)
    sa = (batch, k, m) if ta else (batch, m, k)
    sb = (batch, n, k) if tb else (batch, k, n)
    # float32-exact draws (bf16 storage rounds through float32: pydnn.reference.dtypes)
    av, bv, cv, biasv = (rng.uniform(-1, 1, shape).astype(np.float32).astype(np.float64)
                         for shape in (sa, sb, (batch, m, n), (n,)))
    bufs = []
    for v in (av, bv, cv, biasv):
        d = P.DeviceArray(v.shape, np.uint16)
        d.fill_bytes(POISON)
        d.copy_from_numpy(rd.to_storage(v, BF16))
        bufs.append(d)
    av, bv, cv, biasv = (rd.from_storage(rd.to_storage(v, BF16), BF16) for v in (av, bv, cv, biasv))
    plan.launch(handle, bufs[0].ptr, bufs[1].ptr, bufs[2].ptr, 0.5, 0.25, bufs[3].ptr)
    A = np.swapaxes(av, 1, 2) if ta else av
    Bm = np.swapaxes(bv, 1, 2) if tb else bv
    want = 0.5 * np.matmul(A, Bm) + 0.25 * cv + biasv
    scale = 0.5 * np.matmul(np.abs(A), np.abs(Bm)) + 0.25 * np.abs(cv) + np.abs(biasv)
    got = rd.from_storage(bufs[2].to_numpy(), BF16)
    assert_close(got, want, BF16, f"pp plain ta={ta} tb={tb}", scale=scale)


# ----------------------------------------------------------------------------- staged column operands

@pytest.mark.parametrize("kind, m, n, k, batch, sms", [("gelu", 2048, 2048, 512, 1, 0),
                                                      ("gelu", 1000, 1096, 520, 2, 2),
                                                      ("residual", 600, 712, 520, 2, 2)],
                         ids=["gelu_interior", "gelu_edges_2_blocks", "residual_edges"])
def test_fused_tma_staged_bias(handle, rng, monkeypatch, kind, m, n, k, batch, sms):
    """tuning.matmul.FUSED_STAGE: the bias (a column operand) copied into each consumer warp's shared buffer by
    cp.async before the K loop and read from there in the epilogue of the tiles inside n (the last tile column
    of n = 1096 reads it from global memory); 2 blocks walking many tiles reuse the buffers. Bias + residual
    (a row-moving input beside the bias) does not stage: the same kernel as with the switch off."""
    from pydnn import tuning
    from pydnn.graph import codegen as cg

    monkeypatch.setattr(tuning.matmul, "FUSED_STAGE", True)
    step = _run(handle, rng, monkeypatch, BF16, kind, m, n, k, batch, False, sms)
    sb = 256 * (4 if tuning.matmul.EPI_WIDEN else 2) if kind == "gelu" else 0  # widened: float
    assert step.recs[0][0].smem == (M.TMA_TILE.smem + cg.stage_smem(sb) +
                                    (cg.stsm_smem(sb) if tuning.matmul.EPI_STSM else 0))


def test_fused_tma_staged_bias_unaligned(handle, rng, monkeypatch):
    """A bias 4 bytes off 16 cannot be staged by 16-byte copies (stage_ok): every tile reads it from global
    memory, pairs still (the same FAST tile); the result as with any bias."""
    from pydnn import tuning

    monkeypatch.setattr(tuning.matmul, "FUSED_STAGE", True)
    _sm90(handle, monkeypatch, 0)
    m, n, k = 2048, 2048, 512
    g, (a, w, bias, _, y) = _graph(handle, BF16, "gelu", m, n, k, 1, False)
    g.build_operation_graph().create_execution_plans().check_support().build_plans()
    assert g._plan_obj.built.steps[0].recs[0][0].maps is not None
    ta, tw, ty = DevTensor(a.dim, BF16), DevTensor(w.dim, BF16), DevTensor(y.dim, BF16)
    tbias = DevTensor([1, 1, n + 8], BF16)
    av, wv, bfull = ta.random(rng, -1, 1), tw.random(rng, -1, 1), tbias.random(rng, -1, 1)
    bv = bfull[..., 2:2 + n]
    g.execute({a: ta.ptr, w: tw.ptr, bias: tbias.ptr + 4, y: ty.ptr}, 0, handle=handle)
    c = np.matmul(av, wv) + bv
    scale = np.matmul(np.abs(av), np.abs(wv)) + np.abs(bv)
    assert_close(ty.download(), ref.pointwise("GELU_FWD", c), BF16, "staged bias, unaligned", scale=scale)
    ty.check_untouched()


# ----------------------------------------------------------------------------- one-MUFU GELU, stmatrix stores

@pytest.mark.parametrize("ex2, stsm, stage", [(True, False, True), (False, True, True), (True, True, True),
                                              (True, True, False), (False, False, True)],
                         ids=["ex2", "stsm", "ex2_stsm", "ex2_stsm_nostage", "neither"])
@pytest.mark.parametrize("m, n, k, batch, tb, sms", GELU_CASES, ids=["interior", "edges_batched", "nt_pairs"])
def test_fused_tma_gelu_ex2_stsm(handle, rng, monkeypatch, ex2, stsm, stage, m, n, k, batch, tb, sms):
    """tuning.graph.EPI_GELU_EX2 (GELU_FWD as the one-MUFU gelu_ex2; on) and tuning.matmul.EPI_STSM (the WIDE
    store through stmatrix and a 2 KiB shared buffer a consumer warp; on), each on and off, with and without the
    staged bias: the same tolerance as every fused GELU (interior tiles, edges with 2 blocks walking batched
    tiles and a ragged K, pair-store rows)."""
    from pydnn import tuning
    from pydnn._build import cache
    from pydnn.graph import codegen as cg

    monkeypatch.setattr(tuning.graph, "EPI_GELU_EX2", ex2)
    monkeypatch.setattr(tuning.matmul, "EPI_STSM", stsm)
    monkeypatch.setattr(tuning.matmul, "FUSED_STAGE", stage)
    step = _run(handle, rng, monkeypatch, BF16, "gelu", m, n, k, batch, tb, sms)
    text = cache.unit_inputs(step.unit)[0]
    assert ("gelu_ex2(" in text) == ex2 and ("gelu_fast5(" in text) != ex2
    assert ("kStsm = true" in text) == stsm
    sb = cg.stage_plan(_graph_prog_for_smem(), ["C"], 256, tuning.matmul.EPI_WIDEN)[1] if stage else 0
    assert step.recs[0][0].smem == M.TMA_TILE.smem + cg.stage_smem(sb) + (cg.stsm_smem(sb) if stsm else 0)


def _graph_prog_for_smem():
    from pydnn.graph import codegen as cg

    add = P.PYDNN_POINTWISE_ADD
    return cg.PwProgram([("bf16", "in")], [cg.PwNode(add, x=("acc", 0), b=("op", 0)),
                                           cg.PwNode(P.PYDNN_POINTWISE_GELU_FWD, x=("v", 0))], [])


def test_fused_tma_stsm_residual(handle, rng, monkeypatch):
    """EPI_STSM with bias + residual (no staging: a row-moving input) on edges and 2 blocks."""
    from pydnn import tuning

    monkeypatch.setattr(tuning.matmul, "EPI_STSM", True)
    _run(handle, rng, monkeypatch, BF16, "residual", 600, 712, 520, 2, False, 2)


# ------------------------------------------------------------- widened staged bias, chunked epilogue (gemm2)

@pytest.mark.parametrize("widen, chunk", [(True, False), (False, True), (True, True), (True, 32)],
                         ids=["widen", "chunk", "both", "both32"])
@pytest.mark.parametrize("io", [BF16, F16], ids=["bf16", "f16"])
@pytest.mark.parametrize("m, n, k, batch, tb, sms", GELU_CASES, ids=["interior", "edges_batched", "nt_pairs"])
def test_fused_tma_widen_chunk(handle, rng, monkeypatch, widen, chunk, io, m, n, k, batch, tb, sms):
    """tuning.matmul.EPI_WIDEN (the staged 16-bit bias held as float, widened while the last K tile's wgmmas run)
    and tuning.matmul.EPI_CHUNK (the interior tile computed and stored 64, or 32, columns at a time), with EPI_STSM and
    the staged bias: the same tolerance as every fused GELU; the unit has kWiden / kChunk as asked and the launch
    the widened buffer's shared memory (a 256-column tile: 1 KiB a warp)."""
    from pydnn import tuning
    from pydnn._build import cache
    from pydnn.graph import codegen as cg

    monkeypatch.setattr(tuning.matmul, "EPI_STSM", True)
    monkeypatch.setattr(tuning.matmul, "FUSED_STAGE", True)
    monkeypatch.setattr(tuning.matmul, "EPI_WIDEN", widen)
    monkeypatch.setattr(tuning.matmul, "EPI_CHUNK", chunk)
    step = _run(handle, rng, monkeypatch, io, "gelu", m, n, k, batch, tb, sms)
    text = cache.unit_inputs(step.unit)[0]
    assert ("kWiden = true" in text) == widen and ("kChunk = 32" in text) == (chunk == 32)
    assert ("kChunk = 64" in text) == (chunk is True)
    sb = cg.stage_plan(_graph_prog_for_smem(), ["C"], 256, widen)[1]
    assert sb == (1024 if widen else 512)
    assert step.recs[0][0].smem == M.TMA_TILE.smem + cg.stage_smem(sb) + cg.stsm_smem(sb)
