"""pydnn.ops.matmul on the CPU: every validation error (status + the argument it names) before any GPU
work, the float64 reference against direct loops, the kernel choice (tile, fast or general path, float's
kernel), the params struct layout, and that the kernel units compile with NVRTC for sm_80 and sm_90."""
import numpy as np
import pytest

import pydnn
from pydnn import tuning
from pydnn.ops import matmul as M
from pydnn.reference import matmul as ref
from test_fuzz_cpu import cpu_handle

F32, F64, F16, BF16 = (pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DATA_DOUBLE, pydnn.PYDNN_DATA_HALF,
                       pydnn.PYDNN_DATA_BFLOAT16)
BAD, NS = pydnn.PYDNN_STATUS_BAD_PARAM, pydnn.PYDNN_STATUS_NOT_SUPPORTED
NULL, MIS = pydnn.PYDNN_STATUS_BAD_PARAM_NULL_POINTER, pydnn.PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER
NOINIT = pydnn.PYDNN_STATUS_NOT_INITIALIZED  # everything valid: the CPU-only handle refuses at kernel lookup
A, B, C, BIAS = 1 << 40, 1 << 41, 1 << 42, 1 << 43


def _raises(status, needle, fn, *args, **kw):
    with pytest.raises(pydnn.PydnnError) as e:
        fn(*args, **kw)
    assert e.value.status == status, e.value
    assert needle in str(e.value), e.value


# ----------------------------------------------------------------------------- validation

@pytest.mark.parametrize("kw, status, needle", [
    (dict(dtype=99), BAD, "dtype"),
    (dict(dtype=F64), NS, "dtype"),
    (dict(dtype=pydnn.PYDNN_DATA_INT8), NS, "dtype"),
    (dict(dtype=None), BAD, "dtype"),
    (dict(m=-1), BAD, "m:"),
    (dict(n="8"), BAD, "n:"),
    (dict(k=2**31), BAD, "k:"),
    (dict(m=True), BAD, "m:"),
    (dict(lda=15), BAD, "lda"),
    (dict(lda=0), BAD, "lda"),
    (dict(trans_a=True, lda=7), BAD, "lda"),        # A is k x m: rows of m = 8
    (dict(ldb=9), BAD, "ldb"),
    (dict(trans_b=True, ldb=15), BAD, "ldb"),       # B is n x k: rows of k = 16
    (dict(ldc=9), BAD, "ldc"),
    (dict(batch=0), BAD, "batch"),
    (dict(batch=2, stride_c=0), BAD, "stride_c"),   # the batches of C would overlap
    (dict(batch=2, stride_c=7 * 10 + 9), BAD, "stride_c"),
    (dict(stride_a=-1), BAD, "stride_a"),
    (dict(stride_b=1.5), BAD, "stride_b"),
    (dict(trans_a=2), BAD, "trans_a"),
    (dict(trans_b="yes"), BAD, "trans_b"),
    (dict(bias=[1]), BAD, "bias"),
    (dict(allow_tf32=None), BAD, "allow_tf32"),
])
def test_plan_validation(kw, status, needle):
    args = dict(dtype=BF16, m=8, n=10, k=16, ldc=10)
    args.update(kw)
    _raises(status, needle, M.gemm_plan, cpu_handle(), **args)


def test_cached_plan_is_kept_per_problem():
    """cached_plan returns the handle's plan for a repeated problem, a new one for another problem or
    another handle, and raises for a bad problem every time (errors are not kept)."""
    h, h2 = cpu_handle(), cpu_handle()
    p = M.cached_plan(h, BF16, 64, 32, 16, trans_b=True, ldb=16, bias=True)
    assert M.cached_plan(h, BF16, 64, 32, 16, trans_b=True, ldb=16, bias=True) is p
    assert M.cached_plan(h, BF16, 64, 32, 16, trans_b=True, ldb=16, bias=False) is not p
    assert M.cached_plan(h, BF16, 64, 48, 16, trans_b=True, ldb=16, bias=True) is not p
    assert M.cached_plan(h2, BF16, 64, 32, 16, trans_b=True, ldb=16, bias=True) is not p
    assert (p.m, p.n, p.k, p.trans_b, p.bias) == (64, 32, 16, True, True)
    for _ in range(2):
        _raises(BAD, "ldc", M.cached_plan, h, BF16, 8, 10, 16, ldc=9)


def test_handle_checked():
    _raises(BAD, "handle", M.gemm_plan, None, BF16, 8, 8, 8)
    h = cpu_handle()
    plan = M.gemm_plan(h, BF16, 8, 8, 8)
    h.alive = False
    _raises(BAD, "handle", plan.launch, h, A, B, C)
    _raises(BAD, "handle", M.gemm, h, BF16, 8, 8, 8, A, B, C)


@pytest.mark.parametrize("dtype", [F32, F16, BF16])
def test_launch_validation(dtype):
    h = cpu_handle()
    es = 4 if dtype == F32 else 2
    plan = M.gemm_plan(h, dtype, 8, 8, 8)
    bplan = M.gemm_plan(h, dtype, 8, 8, 8, bias=True)
    _raises(NULL, "a:", plan.launch, h, 0, B, C)
    _raises(NULL, "b:", plan.launch, h, A, None, C)
    _raises(NULL, "c:", plan.launch, h, A, B, 0)
    _raises(BAD, "a:", plan.launch, h, -16, B, C)
    _raises(MIS, "c:", plan.launch, h, A, B, C + 1)
    if es == 4:
        _raises(MIS, "b:", plan.launch, h, A, B + 2, C)
    _raises(BAD, "alpha", plan.launch, h, A, B, C, "1")
    _raises(BAD, "beta", plan.launch, h, A, B, C, 1.0, None)
    _raises(BAD, "bias", plan.launch, h, A, B, C, 1.0, 0.0, BIAS)          # the plan has no bias
    _raises(NULL, "bias", bplan.launch, h, A, B, C)
    _raises(MIS, "bias", bplan.launch, h, A, B, C, 1.0, 0.0, BIAS + 1)
    _raises(BAD, "overlaps a", plan.launch, h, A, B, A + 8 * es)            # C inside A
    _raises(BAD, "overlaps b", plan.launch, h, A, B, B - 8 * es)            # C's tail over B
    _raises(BAD, "overlaps bias", bplan.launch, h, A, B, C, 1.0, 0.0, C + 4 * es)
    # all valid: the CPU handle refuses only at kernel lookup (every check ran before)
    _raises(NOINIT, "no kernels", plan.launch, h, A, B, C, 0.5, 0.0)
    _raises(NOINIT, "no kernels", bplan.launch, h, A, B, C, 0.5, 1.0, BIAS)
    _raises(NOINIT, "no kernels", M.gemm, h, dtype, 8, 8, 8, A, B, C, bias=BIAS)


def test_empty_and_k_zero():
    """m or n = 0: nothing to do (no kernel lookup, pointers unchecked); k = 0: A and B are not read, so
    their pointers are not checked either (C = beta * C + bias still runs)."""
    h = cpu_handle()
    for m, n in ((0, 5), (5, 0)):
        plan = M.gemm_plan(h, F16, m, n, 7)
        assert plan.describe() is None
        plan.launch(h, 0, 0, 0)
    plan = M.gemm_plan(h, F16, 5, 6, 0)
    _raises(NULL, "c:", plan.launch, h, 0, 0, 0)
    _raises(NOINIT, "no kernels", plan.launch, h, 0, 0, C)


# ----------------------------------------------------------------------------- kernel choice

def test_tile_choice():
    h = cpu_handle()
    h.arch = "sm_80"  # the mma.sync tiles (sm_90 may choose wgmma: test_wgmma_choice_only_on_sm90)
    big = M.gemm_plan(h, BF16, 4096, 4096, 4096)
    assert big.describe()[0] == M.TC_TILES[0].expr("bf16", False, False, True)
    bm, bn = M.TC_TILES[0].bm, M.TC_TILES[0].bn
    assert big.describe()[1] == (4096 // bm * 4096 // bn, 1, 1) and big.describe()[2] == (256, 1, 1)
    small = M.gemm_plan(h, F16, 64, 64, 64, trans_a=True)
    assert small.describe()[0] == M.TC_TILES[2].expr("f16", True, False, True)
    batched = M.gemm_plan(h, BF16, 100, 100, 64, batch=100000, stride_a=6400, stride_b=6400, stride_c=10000)
    assert batched.describe()[1][2] == 65535  # the kernels loop over batches past the grid's z


def test_wgmma_choice_only_on_sm90(monkeypatch):
    """The wgmma tiles are chosen only on an sm_90 device and only with USE_WGMMA; never on another arch
    (their units do not exist there: the loader refuses them). USE_TMA off: the wgmma tiles themselves
    (gemm_tma's choice: tests/ops/matmul/test_matmul_tma_cpu.py)."""
    h = cpu_handle()
    monkeypatch.setattr(tuning.matmul, "USE_WGMMA", True)
    monkeypatch.setattr(tuning.matmul, "USE_TMA", False)
    for arch in ("sm_80", "sm_86", "sm_89", "sm_100"):
        monkeypatch.setattr(h, "arch", arch)
        plan = M.gemm_plan(h, BF16, 4096, 4096, 4096)
        assert "gemm_wgmma" not in plan.describe()[0], arch
    monkeypatch.setattr(h, "arch", "sm_90")
    plan = M.gemm_plan(h, BF16, 4096, 4096, 4096, trans_b=True)
    t = M._choose_tile(4096, 4096, 1, 132, "sm_90", 4096)
    assert isinstance(t, M.WgTile) and plan.describe()[0] == t.expr("bf16", False, True)
    assert M._choose_tile(10240, 384, 1, 132, "sm_90", 536) is M.WG_TILES[1]  # tests/ops/matmul/test_matmul_gpu.py
    # too few blocks for a wave, or a short K: gemm_tc
    short = tuning.matmul.WG_PERSIST_MIN_K if tuning.matmul.WG_PERSIST else M.WG_MIN_K
    for m, n, k in ((1024, 1024, 1024), (4096, 4096, short - 8), (512, 512, 4096)):
        assert "gemm_wgmma" not in M.gemm_plan(h, BF16, m, n, k).describe()[0], (m, n, k)
    assert plan.describe()[2] == (256, 1, 1) and plan.describe()[3] == t.smem
    assert plan.fast.unit == ("matmul.wgmmap.bf16" if tuning.matmul.WG_PERSIST else "matmul.wgmma.bf16")
    assert plan.general.expr == M.TC_GENERAL.expr("bf16", False, True, False)  # unaligned: gemm_tc
    monkeypatch.setattr(tuning.matmul, "USE_WGMMA", False)
    assert "gemm_wgmma" not in M.gemm_plan(h, BF16, 4096, 4096, 4096).describe()[0]


@pytest.mark.parametrize("batch", [1, 3])
def test_wgmma_persistent_plan(monkeypatch, batch):
    """WG_PERSIST: the 128x256 wgmma tile runs as gemm_wgmma_p on a grid of at most one wave of blocks (its
    own unit, sm_90a); off: gemm_wgmma with one block per tile. The 128x128 tile is never persistent."""
    h = cpu_handle()
    monkeypatch.setattr(tuning.matmul, "USE_TMA", False)
    monkeypatch.setattr(h, "arch", "sm_90")
    monkeypatch.setattr(tuning.matmul, "USE_WGMMA", True)
    sms = h.sm_count
    kw = dict(batch=batch, stride_a=4096 * 4096, stride_b=4096 * 4096, stride_c=4096 * 4096) if batch > 1 else {}
    monkeypatch.setattr(tuning.matmul, "WG_PERSIST", True)
    plan = M.gemm_plan(h, BF16, 4096, 4096, 4096, **kw)
    items = 32 * 16 * batch
    assert plan.describe()[0] == M.WG_PERSIST_TILE.expr("bf16", False, False)
    assert "gemm_wgmma_p<" in plan.describe()[0] and plan.fast.unit == "matmul.wgmmap.bf16"
    assert plan.describe()[1] == (min(items, sms), 1, 1) and plan.describe()[3] == M.WG_TILES[0].smem
    p = plan.fast.params
    assert (p.tiles_m, p.tiles_n, p.group_m) == (32, 16, 8)
    assert M._choose_tile(10240, 384, 1, 132, "sm_90", 536) is M.WG_TILES[1]
    monkeypatch.setattr(tuning.matmul, "WG_PERSIST", False)
    plan = M.gemm_plan(h, BF16, 4096, 4096, 4096, **kw)
    assert plan.describe()[0] == M.WG_TILES[0].expr("bf16", False, False) and plan.fast.unit == "matmul.wgmma.bf16"
    assert plan.describe()[1] == (32 * 16, 1, batch)


def _tile_coords_of(tiles_m, tiles_n, group_m, tid):
    per_group = group_m * tiles_n
    g = tid // per_group
    first = g * group_m
    rows = min(tiles_m - first, group_m)
    r = tid - g * per_group
    return first + r % rows, r // rows


@pytest.mark.parametrize("tiles_m, tiles_n, batch, grid", [(32, 16, 1, 132), (5, 3, 4, 132), (128, 16, 1, 132),
                                                           (3, 7, 2, 5), (9, 1, 1, 4)])
def test_wgmma_persistent_items_cover_each_tile_once(tiles_m, tiles_n, batch, grid):
    """gemm_wgmma_body's item walk (block b: items b, b + grid, ...; item = z * per_batch + tile id through
    tile_coords_of's raster), replayed: every (z, tm, tn) exactly once; the first wave in the same order as
    the one-block-per-tile grid's blocks 0.. (its L2 raster)."""
    group_m = min(8, tiles_m)
    per_batch = tiles_m * tiles_n
    items = per_batch * batch
    g = min(grid, items)
    walks = [[(it // per_batch,) + _tile_coords_of(tiles_m, tiles_n, group_m, it % per_batch)
              for it in range(b, items, g)] for b in range(g)]
    seen = [t for w in walks for t in w]
    assert sorted(seen) == [(z, tm, tn) for z in range(batch) for tm in range(tiles_m) for tn in range(tiles_n)]
    # the first wave: block b's first tile is the one-block-per-tile grid's block b (same raster)
    assert [w[0] for w in walks] == [(b // per_batch,) + _tile_coords_of(tiles_m, tiles_n, group_m, b % per_batch)
                                     for b in range(g)]


def test_wgmma_short_k(monkeypatch):
    """The persistent run-on tile takes K >= tuning.matmul.WG_PERSIST_MIN_K (the GPT demo's d384 projections,
    K = 384); the one-block-a-tile forms keep WG_MIN_K."""
    h = cpu_handle()
    monkeypatch.setattr(h, "arch", "sm_90")
    monkeypatch.setattr(tuning.matmul, "USE_WGMMA", True)
    monkeypatch.setattr(tuning.matmul, "USE_TMA", False)
    monkeypatch.setattr(tuning.matmul, "WG_PERSIST", True)
    assert M.gemm_plan(h, BF16, 16384, 1152, 384, trans_b=True).describe()[0] == M.WG_PERSIST_TILE.expr("bf16", False,
                                                                                                        True)
    assert "gemm_wgmma" not in M.gemm_plan(h, BF16, 16384, 1152, tuning.matmul.WG_PERSIST_MIN_K - 8).describe()[0]
    monkeypatch.setattr(tuning.matmul, "WG_PERSIST", False)
    assert "gemm_wgmma" not in M.gemm_plan(h, BF16, 16384, 1152, 384, trans_b=True).describe()[0]


def test_wgmma_units_are_sm90a_only():
    from pydnn._build import loader, manifest

    units = {u.name: u for u in M.kernel_units()}
    for tag, name in [(t, f"matmul.{kind}.{t}") for t in ("f16", "bf16")
                      for kind in ("wgmma", "wgmmap", "wgmmas", "tma")]:
        u = units[name]
        assert u.archs == ("sm_90a",)
        assert manifest.unit_arch(u, "sm_90") == "sm_90a"
        assert manifest.unit_arch(u, "sm_90a") == "sm_90a"
        for arch in ("sm_80", "sm_86", "sm_89", "sm_100"):
            assert manifest.unit_arch(u, arch) is None
            with pytest.raises(KeyError, match="not built for"):
                loader.load_unit(arch, u)
    for name, u in units.items():
        if not name.startswith(("matmul.wgmma.", "matmul.wgmmap.", "matmul.wgmmas.", "matmul.tma.", "matmul.tmac.",
                                 "matmul.tmaw.")):
            assert u.archs == () and manifest.unit_arch(u, "sm_80") == "sm_80"
    with pytest.raises(ValueError):
        M.WG_TILES[0].expr("bf16", False, False, False)  # no general path
    cand = {u.name: u for u in M.wgmma_units(M.WG_TILES[:1], "matmul.wgcand")}  # how candidates get units
    assert all(u.archs == ("sm_90a",) for u in cand.values()) and set(cand) == {"matmul.wgcand.f16",
                                                                                "matmul.wgcand.bf16"}
    assert M.wgmma_units((), "matmul.wgcand") == []


def test_fast_and_general_paths():
    h = cpu_handle()
    assert M.gemm_plan(h, BF16, 16, 16, 16).vec_ok
    assert not M.gemm_plan(h, BF16, 16, 16, 16, lda=17).vec_ok
    assert not M.gemm_plan(h, BF16, 16, 16, 16, trans_b=True, ldb=20).vec_ok
    assert not M.gemm_plan(h, F16, 16, 16, 16, batch=2, stride_a=260, stride_b=256, stride_c=256).vec_ok
    assert M.gemm_plan(h, F16, 16, 16, 16, batch=2, stride_a=0, stride_b=256, stride_c=256).vec_ok
    g = M.gemm_plan(h, BF16, 16, 16, 16, lda=17)
    assert g.general.expr == M.TC_GENERAL.expr("bf16", False, False, False)
    f = M.gemm_plan(h, F32, 300, 200, 100, trans_a=True, trans_b=True, allow_tf32=True)
    assert f.describe()[0] == M.SIMT_TILES[0].expr("f32", True, True)


def test_simt_tile_choice(monkeypatch):
    """float: the 128 x 128 tile for large problems, the 64 x 128 one where m <= 64 (half the big tile idle)
    (the chooser's build tiles: SIMT_BIG off; test_simt_candidates_and_switch has SIMT_BIG_TILE's rule)."""
    monkeypatch.setattr(tuning.matmul, "SIMT_BIG", "")
    h = cpu_handle()
    big, small = M.SIMT_TILES
    assert M.gemm_plan(h, F32, 4096, 4096, 4096).describe()[0] == big.expr("f32")
    d = M.gemm_plan(h, F32, 64, 12544, 64, trans_a=True, batch=36, stride_a=4096, stride_b=64 * 12544,
                    stride_c=64 * 12544).describe()
    assert d[0] == small.expr("f32", True, False) and d[2] == (small.threads, 1, 1)
    assert d[1] == (small.per_sm * h.sm_count, 1, 1)  # one wave of persistent blocks for 98 x 36 items
    # k <= SHORT_K: the small tile where it fills the SMs better (the 14^2 / 7^2 Winograd shapes), the big
    # one where the waves tie for it (28^2); a long K prefers the big tile
    assert M.gemm_plan(h, F32, 256, 1024, 256, batch=36, stride_a=0, stride_b=0, stride_c=256 * 1024).describe()[0] == small.expr("f32")
    assert M.gemm_plan(h, F32, 128, 3136, 128, batch=36, stride_a=0, stride_b=0, stride_c=128 * 3136).describe()[0] == big.expr("f32")
    assert M.gemm_plan(h, F32, 256, 1024, 1024, batch=36, stride_a=0, stride_b=0, stride_c=256 * 1024).describe()[0] == big.expr("f32")
    assert M.gemm_plan(h, F32, 5, 7, 3).describe()[1] == (1, 1, 1)  # fewer items than a wave


def test_simt_candidates_and_switch(monkeypatch):
    """The float candidates (SIMT_CANDIDATES): one one-kernel unit per (candidate, transposition), their block
    shapes cover BM x BN with 4 SUBM x 4 SUBN outputs a thread exactly once (the kernel's am / bn mapping,
    emulated); tuning.matmul.SIMT_BIG puts one in place of the 128 x 128 tile in pydnn.matmul's plans only (the
    64 x 128 choice stays), an unknown name is refused; the build's tile expressions keep their form."""
    import numpy as np
    from pydnn._build import loader

    h = cpu_handle()
    units = M.simt_candidate_units()
    assert len(units) == 4 * len(M.SIMT_CANDIDATES) and len({u.name for u in units}) == len(units)
    assert all(len(u.exprs) == 1 for u in units)
    assert M.SIMT_TILES[0].expr("f32") == "pydnn::matmul::gemm_simt<128, 128, 8, 4, 2, 1, false, false>"
    for t in M.SIMT_TILES + M.SIMT_CANDIDATES:
        cnt = np.zeros((t.bm, t.bn), int)
        for th in range(t.threads):
            warp, lane = th >> 5, th & 31
            am = (warp // t.wn) * 16 * t.subm + (lane >> 3) * 4
            bn = (warp % t.wn) * 32 * t.subn + (lane & 7) * 4
            for i in range(4 * t.subm):
                for j in range(4 * t.subn):
                    cnt[am + (i >> 2) * 16 + (i & 3), bn + (j >> 2) * 32 + (j & 3)] += 1
        assert (cnt == 1).all(), t
        assert t.threads * t.per_sm <= 1024 or t.per_sm == 1
    regs = []
    monkeypatch.setattr(loader, "register_units", lambda us: regs.extend(us))
    for t in M.SIMT_CANDIDATES:
        monkeypatch.setattr(tuning.matmul, "SIMT_BIG", t.name)
        pl = M.gemm_plan(h, F32, 4096, 4096, 4096, trans_b=True)
        assert pl.fast.expr == t.expr("f32", False, True) and pl.fast.unit == f"matmul.f32c.{t.name}.nt"
        assert pl.describe()[2] == (t.threads, 1, 1)
        assert pl.describe()[1] == (min((4096 // t.bm) * (4096 // t.bn), t.per_sm * h.sm_count), 1, 1)
        # the 64 x 128 choice (m <= 64) is not replaced, nor the 128 x 128 one for k <= SHORT_K or under
        # SIMT_BIG_WAVES waves of the candidate's blocks
        small = M.gemm_plan(h, F32, 64, 12544, 64, batch=36, stride_b=64 * 12544, stride_c=64 * 12544)
        assert small.fast.expr == M.SIMT_TILES[1].expr("f32")
        assert M.gemm_plan(h, F32, 4096, 4096, M.SHORT_K).fast.expr == M.SIMT_TILES[0].expr("f32")
        assert M.gemm_plan(h, F32, 1024, 1024, 4096).fast.expr == M.SIMT_TILES[0].expr("f32")
    assert {u.name for u in regs} >= {u.name for u in units}
    monkeypatch.setattr(tuning.matmul, "SIMT_BIG", "nope")
    with pytest.raises(ValueError, match="SIMT_BIG"):
        M.gemm_plan(h, F32, 4096, 4096, 4096)
    # the default: SIMT_BIG_TILE (c6's instantiation) from the build's unit matmul.f32big, same rule
    monkeypatch.setattr(tuning.matmul, "SIMT_BIG", tuning.matmul._defaults["SIMT_BIG"])
    big = M.SIMT_BIG_TILE
    assert big.expr("f32") == "pydnn::matmul::gemm_simt<128, 256, 8, 2, 4, 1, false, false, 4, 2>"  # (run 3's c6)
    for ta, tb in ((False, False), (False, True), (True, False), (True, True)):
        pl = M.gemm_plan(h, F32, 8192, 8192, 8192, trans_a=ta, trans_b=tb)
        assert (pl.fast.unit, pl.fast.expr) == ("matmul.f32big", big.expr("f32", ta, tb))
        assert pl.describe()[1:3] == ((min(64 * 32, h.sm_count), 1, 1), (256, 1, 1))
    assert M.gemm_plan(h, F32, 4096, 4096, M.SHORT_K).fast.expr == M.SIMT_TILES[0].expr("f32")
    assert M.gemm_plan(h, F32, 1024, 1024, 4096).fast.expr == M.SIMT_TILES[0].expr("f32")


def test_simt_candidates_do_not_spill():
    """Each float candidate (nn; the other transpositions differ only in the copiers) and the build's SIMT_BIG_TILE
    unit (every transposition) fit 255 registers without spilling (ptxas, sm_90): 128 accumulators a thread."""
    import re
    from pydnn._build import cache
    from pydnn._build.manifest import COMMON_OPTIONS
    from pydnn._cuda import nvrtc

    big = next(u for u in M.kernel_units() if u.name == "matmul.f32big")
    for u in M.simt_candidate_units(trans=("nn",)) + [big]:
        text, _ = cache.unit_inputs(u)
        _, _, log = nvrtc.compile_cubin(text, u.source, u.exprs, "sm_90", COMMON_OPTIONS + ("--ptxas-options=-v",),
                                        [str(cache.ptx_dir())])
        frames = re.findall(r"(\d+) bytes stack frame, (\d+) bytes spill stores", log)
        assert len(frames) == len(u.exprs) and all(f == ("0", "0") for f in frames), (u.name, frames)


def test_batches_side_by_side():
    """C's batches may interleave within a row (stride_c >= n, all inside ldc); overlapping ones are refused."""
    h = cpu_handle()
    pl = M.gemm_plan(h, F32, 50, 16, 8, ldc=36 * 16, batch=36, stride_a=50 * 8, stride_b=8 * 16, stride_c=16)
    assert pl.span_c == 35 * 16 + 49 * 36 * 16 + 16
    _raises(BAD, "stride_c", M.gemm_plan, h, F32, 50, 16, 8, ldc=36 * 16, batch=36, stride_c=15)
    _raises(BAD, "stride_c", M.gemm_plan, h, F32, 50, 16, 8, ldc=35 * 16, batch=36, stride_c=16)


def test_every_expr_is_in_a_unit():
    units = {u.name: set(u.exprs) for u in M.kernel_units()}
    assert len(units) == 19
    assert units["matmul.f32big"] == {M.SIMT_BIG_TILE.expr("f32", ta, tb) for ta in (False, True)
                                      for tb in (False, True)}
    for tag in ("f16", "bf16"):
        for ta in (False, True):
            for tb in (False, True):
                exprs = units[M._unit_name(tag, ta, tb)]
                assert {t.expr(tag, ta, tb, True) for t in M.TC_TILES} <= exprs
                assert M.TC_GENERAL.expr(tag, ta, tb, False) in exprs
    assert units["matmul.f32"] == {t.expr("f32", ta, tb) for t in M.SIMT_TILES for ta in (False, True)
                                   for tb in (False, True)}
    for tag in ("f16", "bf16"):
        assert units[f"matmul.wgmma.{tag}"] == {t.expr(tag, ta, tb) for t in M.WG_TILES for ta in (False, True)
                                                for tb in (False, True)}
        assert units[f"matmul.wgmmap.{tag}"] == {M.WG_PERSIST_TILE.expr(tag, ta, tb) for ta in (False, True)
                                                 for tb in (False, True)}
        assert units[f"matmul.tma.{tag}"] == {M.TMA_TILE.expr(tag, ta, tb) for ta in (False, True)
                                              for tb in (False, True)}
    assert units["matmul.tmac.bf16"] == {M.TMA_CANDIDATES[0].expr("bf16", ta, tb) for ta in (False, True)
                                         for tb in (False, True)}


def test_smem_fits():
    """Every tile's shared memory fits an sm_80 / sm_90 block (227 KiB opt-in), per_sm of them an SM."""
    for t in M.TC_TILES + M.WG_TILES + (M.WG_PERSIST_TILE, M.TMA_TILE) + M.TMA_CANDIDATES:
        assert t.smem * t.per_sm <= 227 * 1024, (t.bm, t.bn)


# ----------------------------------------------------------------------------- reference

def test_reference_against_loops():
    rng = np.random.default_rng(0)
    m, n, k, batch = 3, 4, 5, 2
    for ta in (False, True):
        for tb in (False, True):
            lda, ldb, ldc = (m if ta else k) + 2, (k if tb else n) + 1, n + 3
            sa, sb, sc = 40, 0, 30
            a, b, c = rng.normal(size=200), rng.normal(size=200), rng.normal(size=200)
            bias = rng.normal(size=n)
            got = ref.gemm(a, b, c, m, n, k, 0.5, -2.0, ta, tb, lda, ldb, ldc, batch, sa, sb, sc, bias)
            for z in range(batch):
                for i in range(m):
                    for j in range(n):
                        s = 0.0
                        for q in range(k):
                            av = a[z * sa + q * lda + i] if ta else a[z * sa + i * lda + q]
                            bv = b[z * sb + j * ldb + q] if tb else b[z * sb + q * ldb + j]
                            s += av * bv
                        want = 0.5 * s - 2.0 * c[z * sc + i * ldc + j] + bias[j]
                        assert abs(got[z, i, j] - want) < 1e-12


def test_reference_beta_zero_ignores_c():
    c = np.full(16, np.nan)
    got = ref.gemm(np.ones(4), np.ones(4), c, 2, 2, 2)
    assert (got == 2.0).all()


# ----------------------------------------------------------------------------- layout and compilation

def test_params_layout(tmp_path):
    from test_params_layout import test_param_structs_match_c_layout

    assert any(c == "MatmulParams" for _, c, _ in __import__("pydnn._build.params", fromlist=["x"]).REGISTRY)
    test_param_structs_match_c_layout(tmp_path)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_units_compile(arch):
    from pydnn._build import build, cache

    from pydnn._build.manifest import unit_arch

    from pydnn._build import manifest

    # the family's units in the arch's install / first-use split (the cache entries the loader reads)
    build.build_all(archs=[arch], progress=False, prefixes=("matmul.",), everything=True)
    units = [u for u in manifest.all_units(arch) if u.name.startswith("matmul.")]
    nv = build.nvrtc.version()
    for u in units:
        target = unit_arch(u, arch)
        if u.name.startswith(("matmul.wgmma.", "matmul.wgmmap.", "matmul.wgmmas.", "matmul.tma.",
                              "matmul.tmac.", "matmul.tmaw.")):  # sm_90a only: built as such on sm_90, absent elsewhere
            assert target == ("sm_90a" if arch == "sm_90" else None), (u.name, arch)
            if target is None:
                continue
        entry = cache.read_entry(cache.entry_path(u, target, cache.unit_key(u, target, nv)))
        assert entry is not None and set(entry[1]) == set(u.exprs), u.name


# ----------------------------------------------------------------------------- kernel emulation
# gemm_tc's index arithmetic replayed in numpy, line for line with ptx/matmul.cu: load_tile's chunks and
# the XOR swizzle (every shared element written once, zeros past the edges), the ldmatrix lane addresses
# (plain / .trans per transposition; each 8-lane phase free of bank conflicts), the mma.m16n8k16 fragment
# layouts, and the epilogue's (row, col) of each accumulator. The product must equal A @ B.

def _swz(COLS, r, c):
    return r * COLS + ((c ^ (r & 7)) << 3)

def _load_tile(s, base, ROWS, COLS, THREADS, G, r0, rows, c0, cols):
    CPR = COLS // 8
    written = set()
    for i in range(ROWS * CPR // THREADS):
        for tid in range(THREADS):
            idx = tid + i * THREADS
            r, ch = idx // CPR, idx % CPR
            gr, gc = r0 + r, c0 + ch * 8
            off = base + _swz(COLS, r, ch)
            assert off not in written
            written.add(off)
            for e in range(8):
                s[off + e] = G[gr, gc + e] if (gr < rows and gc + e < cols) else 0.0
    assert len(written) == ROWS * CPR

def _copier_tile(s, base, ROWS, COLS, THREADS, KROWS, G, r0, rows, c0, cols, kt):
    """Pipeline 2's Copier: init(r0, rows, c0, cols) for K tile 0, then copy() of tile kt (g advanced kt times)."""
    CPR = COLS // 8
    RS, N = THREADS // CPR, None
    N = ROWS // RS
    assert THREADS % CPR == 0 and RS % 8 == 0 and ROWS % RS == 0
    k = rows if KROWS else cols  # K's extent
    krem = k - kt * 64
    written = set()
    for tid in range(THREADS):
        r, ch = tid // CPR, tid % CPR
        soff = _swz(COLS, r, ch)
        grow, gcol = r0 + r + (kt * 64 if KROWS else 0), c0 + ch * 8 + (0 if KROWS else kt * 64)
        mask = [KROWS or r0 + r + i * RS < rows for i in range(N)]
        nbytes = min(max(cols - (c0 + ch * 8), 0), 8) if KROWS else 8
        kbytes = min(max(krem - ch * 8, 0), 8)
        for i in range(N):
            ok = mask[i] and (not KROWS or r + i * RS < krem)
            nb = (nbytes if KROWS else kbytes) if ok else 0
            off = base + soff + i * RS * COLS
            assert off not in written
            written.add(off)
            for e in range(8):
                s[off + e] = G[grow + i * RS, gcol + e] if e < nb else 0.0
    assert len(written) == ROWS * CPR


def _ldsm(s, addrs, trans):
    # addrs[lane] -> row address of matrix lane//8, row lane%8; returns r[t][j] = (v0, v1)
    for j in range(4):  # one 8-lane phase: 8 rows of 16 bytes in 8 different bank groups (no conflict)
        assert len({(addrs[8 * j + r] * 2 // 16) % 8 for r in range(8)}) == 8, "ldmatrix bank conflict"
    mats = [np.array([s[addrs[8 * j + r]: addrs[8 * j + r] + 8] for r in range(8)]) for j in range(4)]
    out = []
    for t in range(32):
        g, q = t // 4, t % 4
        regs = []
        for j in range(4):
            Mj = mats[j].T if trans else mats[j]
            regs.append((Mj[g, 2 * q], Mj[g, 2 * q + 1]))
        out.append(regs)
    return out

def _mma(acc, a, b0, b1):
    # a[t] = 4 regs, b0[t], b1[t]: reconstruct
    A = np.zeros((16, 16)); B = np.zeros((16, 8))
    for t in range(32):
        g, q = t // 4, t % 4
        A[g, 2*q:2*q+2] = a[t][0]; A[g+8, 2*q:2*q+2] = a[t][1]
        A[g, 2*q+8:2*q+10] = a[t][2]; A[g+8, 2*q+8:2*q+10] = a[t][3]
        B[2*q:2*q+2, g] = b0[t]; B[2*q+8:2*q+10, g] = b1[t]
    C = A @ B
    for t in range(32):
        g, q = t // 4, t % 4
        acc[t][0] += C[g, 2*q]; acc[t][1] += C[g, 2*q+1]; acc[t][2] += C[g+8, 2*q]; acc[t][3] += C[g+8, 2*q+1]

def _emulate_tc(Aop, Bop, m, n, k, BM, BN, WARPS_M, WARPS_N, TA, TB, pipe=1):
    """Aop: global A as stored (m x k, or k x m when TA); Bop: (k x n, or n x k when TB)."""
    BK, THREADS = 64, WARPS_M * WARPS_N * 32
    WM, WN = BM // WARPS_M, BN // WARPS_N
    TM, TN = WM // 16, WN // 8
    pad = lambda X: np.pad(X, ((0, 300), (0, 300)))
    Ag, Bg = pad(Aop), pad(Bop)
    C = np.full((m, n), np.nan)
    for tm in range((m + BM - 1) // BM):
        for tn in range((n + BN - 1) // BN):
            m0, n0 = tm * BM, tn * BN
            accs = {}
            for kt in range((k + BK - 1) // BK):
                k0 = kt * BK
                s = np.full((BM + BN) * BK, np.nan)
                sb = BM * BK
                if pipe == 2:
                    if TA: _copier_tile(s, 0, BK, BM, THREADS, True, Ag, 0, k, m0, m, kt)
                    else: _copier_tile(s, 0, BM, BK, THREADS, False, Ag, m0, m, 0, k, kt)
                    if TB: _copier_tile(s, sb, BN, BK, THREADS, False, Bg, n0, n, 0, k, kt)
                    else: _copier_tile(s, sb, BK, BN, THREADS, True, Bg, 0, k, n0, n, kt)
                else:
                    if TA: _load_tile(s, 0, BK, BM, THREADS, Ag, k0, k, m0, m)
                    else: _load_tile(s, 0, BM, BK, THREADS, Ag, m0, m, k0, k)
                    if TB: _load_tile(s, sb, BN, BK, THREADS, Bg, n0, n, k0, k)
                    else: _load_tile(s, sb, BK, BN, THREADS, Bg, k0, k, n0, n)
                for warp in range(WARPS_M * WARPS_N):
                    wm0, wn0 = (warp // WARPS_N) * WM, (warp % WARPS_N) * WN
                    acc = accs.setdefault(warp, [[[[0.0]*4 for _ in range(32)] for j in range(TN)] for i in range(TM)])
                    for kk in range(BK // 16):
                        a = []
                        for i in range(TM):
                            addrs = []
                            for lane in range(32):
                                mat, r8 = lane >> 3, lane & 7
                                if TA:
                                    kr, ch = kk*16 + (mat >> 1)*8 + r8, (wm0 + i*16 + (mat & 1)*8) >> 3
                                    addrs.append(_swz(BM, kr, ch))
                                else:
                                    row, ch = wm0 + i*16 + (lane & 15), kk*2 + (lane >> 4)
                                    addrs.append(_swz(BK, row, ch))
                            a.append(_ldsm(s, addrs, TA))
                        b = [None] * TN
                        for j in range(0, TN, 2):
                            addrs = []
                            for lane in range(32):
                                mat, r8 = lane >> 3, lane & 7
                                if TB:
                                    nr, ch = wn0 + j*8 + (mat >> 1)*8 + r8, kk*2 + (mat & 1)
                                    addrs.append(sb + _swz(BK, nr, ch))
                                else:
                                    kr, ch = kk*16 + (mat & 1)*8 + r8, (wn0 + j*8 + (mat >> 1)*8) >> 3
                                    addrs.append(sb + _swz(BN, kr, ch))
                            r = _ldsm(s, addrs, not TB)
                            b[j] = ([r[t][0] for t in range(32)], [r[t][1] for t in range(32)])
                            b[j + 1] = ([r[t][2] for t in range(32)], [r[t][3] for t in range(32)])
                        for i in range(TM):
                            for j in range(TN):
                                _mma(acc[i][j], a[i], b[j][0], b[j][1])
            for warp in range(WARPS_M * WARPS_N):
                wm0, wn0 = (warp // WARPS_N) * WM, (warp % WARPS_N) * WN
                acc = accs.get(warp)
                for lane in range(32):
                    for i in range(TM):
                        for h in range(2):
                            row = m0 + wm0 + i*16 + (lane >> 2) + h*8
                            if row >= m: continue
                            for j in range(TN):
                                col = n0 + wn0 + j*8 + (lane & 3)*2
                                for e in range(2):
                                    if col + e < n:
                                        C[row, col + e] = acc[i][j][lane][2*h + e] if acc else 0.0
    return C



@pytest.mark.parametrize("tile, shape, pipe", [((64, 64, 2, 2), (70, 45, 90), 1), ((128, 256, 2, 4), (150, 270, 70), 1),
                                               ((128, 128, 2, 4), (130, 20, 64), 1),
                                               ((128, 256, 2, 4), (150, 270, 70), 2),
                                               ((128, 128, 2, 2), (130, 20, 150), 2)])
@pytest.mark.parametrize("ta, tb", [(False, False), (False, True), (True, False), (True, True)])
def test_emulated_tc_kernel(tile, shape, pipe, ta, tb):
    rng = np.random.default_rng(1)
    m, n, k = shape
    a, b = rng.normal(size=(m, k)), rng.normal(size=(k, n))
    got = _emulate_tc(a.T.copy() if ta else a, b.T.copy() if tb else b, m, n, k, *tile, ta, tb, pipe)
    assert np.abs(got - a @ b).max() < 1e-9


# gemm_wgmma's data path replayed in numpy: the Copier in wgmma's slab layout (wgmma.cuh: sw128), the
# descriptors the kernel builds (start, LBO, SBO per operand and k16 step), read back through the PTX
# ISA's canonical 128B-swizzled layouts (K-major: row r, element k at start + (r / 8) SBO + (r % 8) 128 +
# 2k; MN-major: at start + (mn / 64) LBO + (k / 8) SBO + (k % 8) 128 + 2 (mn % 64); then the swizzle XORs
# address bits [4:6] with bits [7:9]), the product into the m64nNk16 accumulator fragment, and the
# epilogue's (row, col) of each register. The result must equal A @ B.

def _sw128(ROWS, r, ch):
    return (ch >> 3) * (ROWS * 64) + r * 64 + (((ch & 7) ^ (r & 7)) << 3)


def _wg_copier_tile(s, base, ROWS, COLS, THREADS, KROWS, G, r0, rows, c0, cols, kt):
    CPR = COLS // 8
    RS = THREADS // CPR
    N = ROWS // RS
    assert THREADS % CPR == 0 and RS % 8 == 0 and ROWS % RS == 0
    krem = (rows if KROWS else cols) - kt * 64
    written = set()
    for tid in range(THREADS):
        r, ch = tid // CPR, tid % CPR
        soff = _sw128(ROWS, r, ch)
        grow, gcol = r0 + r + (kt * 64 if KROWS else 0), c0 + ch * 8 + (0 if KROWS else kt * 64)
        nbytes = min(max(cols - (c0 + ch * 8), 0), 8) if KROWS else 8
        kbytes = min(max(krem - ch * 8, 0), 8)
        for i in range(N):
            ok = (KROWS or r0 + r + i * RS < rows) and (not KROWS or r + i * RS < krem)
            nb = (nbytes if KROWS else kbytes) if ok else 0
            off = base + soff + i * RS * 64
            assert off not in written
            written.add(off)
            s[off: off + 8] = [G[grow + i * RS, gcol + e] if e < nb else 0.0 for e in range(8)]
    assert len(written) == ROWS * CPR


def _desc_read(s, start, lbo, sbo, rows, mn_major):
    """The rows x 16 operand (rows along M or N, 16 along K) a 128B-swizzled descriptor describes."""
    assert start % 16 == 0
    r, k = np.meshgrid(np.arange(rows), np.arange(16), indexing="ij")
    if mn_major:
        addr = start + (r // 64) * lbo + (k // 8) * sbo + (k % 8) * 128 + 2 * (r % 64)
    else:
        addr = start + (r // 8) * sbo + (r % 8) * 128 + 2 * k
    addr = addr ^ (((addr >> 7) & 7) << 4)
    return s[addr // 2]


def _emulate_wgmma(Aop, Bop, m, n, k, BN, TA, TB):
    BM, BK, THREADS, SLAB = 128, 64, 256, 64 * 64 * 2
    Ag, Bg = np.pad(Aop, ((0, 300), (0, 300))), np.pad(Bop, ((0, 300), (0, 300)))
    C = np.full((m, n), np.nan)
    for m0 in range(0, m, BM):
        for n0 in range(0, n, BN):
            acc = np.zeros((2, 128, BN // 2))  # [warpgroup][thread][register]
            for kt in range((k + BK - 1) // BK):
                s = np.full((BM + BN) * BK, np.nan)
                sb = BM * BK  # elements
                if TA: _wg_copier_tile(s, 0, BK, BM, THREADS, True, Ag, 0, k, m0, m, kt)
                else: _wg_copier_tile(s, 0, BM, BK, THREADS, False, Ag, m0, m, 0, k, kt)
                if TB: _wg_copier_tile(s, sb, BN, BK, THREADS, False, Bg, n0, n, 0, k, kt)
                else: _wg_copier_tile(s, sb, BK, BN, THREADS, True, Bg, 0, k, n0, n, kt)
                sa_b, sb_b = 0, sb * 2  # byte addresses (the stage base is 1024-aligned)
                for wg in range(2):
                    for kk in range(BK // 16):
                        if TA: a = _desc_read(s, sa_b + wg * SLAB + kk * 2048, SLAB, 1024, 64, True)
                        else: a = _desc_read(s, sa_b + wg * SLAB + kk * 32, 16, 1024, 64, False)
                        if TB: b = _desc_read(s, sb_b + kk * 32, 16, 1024, BN, False)
                        else: b = _desc_read(s, sb_b + kk * 2048, SLAB, 1024, BN, True)
                        D = a @ b.T  # 64 x BN
                        for t in range(128):
                            w, l = t // 32, t % 32
                            for j in range(BN // 8):
                                for h in range(2):
                                    for e in range(2):
                                        acc[wg, t, 4 * j + 2 * h + e] += D[16 * w + l // 4 + 8 * h, 8 * j + 2 * (l % 4) + e]
            for wg in range(2):
                for t in range(128):
                    warp, lane = t // 32, t % 32
                    for h in range(2):
                        row = m0 + wg * 64 + warp * 16 + (lane >> 2) + h * 8
                        if row >= m:
                            continue
                        for j in range(BN // 8):
                            col = n0 + j * 8 + (lane & 3) * 2
                            for e in range(2):
                                if col + e < n:
                                    C[row, col + e] = acc[wg, t, 4 * j + 2 * h + e]
    return C


@pytest.mark.parametrize("bn, shape", [(128, (150, 140, 70)), (256, (130, 270, 130))])
@pytest.mark.parametrize("ta, tb", [(False, False), (False, True), (True, False), (True, True)])
def test_emulated_wgmma_kernel(bn, shape, ta, tb):
    rng = np.random.default_rng(2)
    m, n, k = shape
    a, b = rng.normal(size=(m, k)), rng.normal(size=(k, n))
    got = _emulate_wgmma(a.T.copy() if ta else a, b.T.copy() if tb else b, m, n, k, bn, ta, tb)
    assert np.abs(got - a @ b).max() < 1e-9


def test_simt_tiles_do_not_spill():
    """gemm_simt's tiles fit their register caps (MINB) without spilling (ptxas, sm_90): a spill in the
    FMA loop costs more than the occupancy it buys (tools/bench_matmul.py, f32 v2's MINB 2 tile)."""
    import re
    from pydnn._build import cache
    from pydnn._build.manifest import COMMON_OPTIONS
    from pydnn._cuda import nvrtc

    unit = next(u for u in M.kernel_units() if u.name == "matmul.f32")
    text, _ = cache.unit_inputs(unit)
    _, _, log = nvrtc.compile_cubin(text, unit.source, unit.exprs, "sm_90", COMMON_OPTIONS + ("--ptxas-options=-v",),
                                    [str(cache.ptx_dir())])
    frames = re.findall(r"(\d+) bytes stack frame, (\d+) bytes spill stores", log)
    assert len(frames) == len(unit.exprs) == 4 * len(M.SIMT_TILES)
    assert all(int(a) == 0 and int(b) == 0 for a, b in frames), frames


def _wgmma_ring_schedule(stages, lead, runon, ktiles, nitems):
    """gemm_wgmma_body's ring, replayed for one block walking `nitems` items (PERSIST): every copy, commit,
    wait and barrier in program order. A K tile is read only after the commit group that copied it is
    complete (cp.async.wait_group at the top of its iteration) and holds that tile; a stage is overwritten
    only after every warpgroup is done reading it: a warpgroup's wgmma.wait<1> in iteration G finishes its
    reads of G - 1, which all warpgroups have done after the next barrier (the top of G + 1; with LEAD =
    STAGES - 1 the second barrier right after that wait); wgmma.wait<0> at an item's end, likewise."""
    D = lead
    slot = [None] * stages            # (item, kt, group) of the tile copied there
    reads = {}                        # slot -> global iteration of its last read, until done for all
    groups = []                       # commit groups: list of (slot, item, kt) copies
    pending = []                      # copies of the open group
    own_done = -1                     # reads of global iterations <= own_done: done in this warpgroup

    def copy(s, item, kt):
        assert s not in reads, f"stage {s} overwritten (item {item} K tile {kt}) before every read of it ended"
        slot[s] = (item, kt, len(groups))
        pending.append(s)

    def commit():
        groups.append(list(pending))
        pending.clear()

    def barrier():
        for s, g in list(reads.items()):
            if g <= own_done:
                del reads[s]

    def prologue(item):
        for s in range(D):
            if s < ktiles:
                copy(s, item, s)
            commit()

    G = 0  # global K iteration
    prologue(0)
    g0 = 0
    for item in range(nitems):
        run_on = runon and item + 1 < nitems and ktiles >= D
        for kt in range(ktiles):
            done_groups = len(groups) - (D - 1)  # cp.async.wait_group D - 1
            barrier()
            s = (g0 + kt) % stages
            it, k, grp = slot[s]
            assert (it, k) == (item, kt), f"item {item} K tile {kt} read stage {s} holding item {it} tile {k}"
            assert grp < done_groups, f"item {item} K tile {kt} read before its copy group completed"
            reads[s] = G
            own_done = G - 1  # wgmma.wait<1>
            if lead == stages - 1:
                barrier()
            nxt = kt + D
            if nxt < ktiles:
                copy((g0 + nxt) % stages, item, nxt)
            elif run_on:
                copy((g0 + nxt) % stages, item + 1, nxt - ktiles)
            commit()
            G += 1
        own_done = G - 1  # wgmma.wait<0>
        if not run_on:
            barrier()  # cp.async.wait_group 0 and __syncthreads
            assert not reads
            if item + 1 < nitems:
                prologue(item + 1)
        g0 = (g0 + ktiles) % stages if run_on else 0


@pytest.mark.parametrize("lead, runon", [(2, False), (3, False), (2, True), (3, True)])
@pytest.mark.parametrize("ktiles", [1, 2, 3, 4, 5, 9, 64])
def test_wgmma_ring_schedule(lead, runon, ktiles):
    """The persistent ring (gemm_wgmma_p and its candidates: LEAD 2 or 3 of 4 stages, run-on or not) for
    one and several items: no K tile read before it lands or from the wrong stage, no stage overwritten
    while a warpgroup may still read it."""
    for nitems in (1, 2, 5):
        _wgmma_ring_schedule(4, lead, runon, ktiles, nitems)


def test_wgmma_ring_schedule_catches_a_short_ring():
    """The replay fails a wrong schedule: 3 K tiles copied ahead in a ring of 3 stages (the copy of K tile
    kt + 3 goes to the stage tile kt is being read from)."""
    with pytest.raises(AssertionError):
        _wgmma_ring_schedule(3, 3, False, 9, 2)


# ----------------------------------------------------------------------------- split-K

def test_split_k_plan(monkeypatch):
    """gemm_plan(split_k=True) on sm_90 cuts a long K into splits when the 128x256 tiles fill less than 3/4
    of a wave: the GPT demo's weight gradients (the lead's profile) get gemm_wgmma_s (batch = the splits,
    C = the fp32 partials) and splitk_reduce; never without split_k, off sm_90, with SPLIT_K off, batched,
    with a short K, or for a problem that fills the SMs."""
    h = cpu_handle()
    monkeypatch.setattr(h, "arch", "sm_90")
    monkeypatch.setattr(tuning.matmul, "USE_WGMMA", True)
    monkeypatch.setattr(tuning.matmul, "SPLIT_K", True)
    pl = M.gemm_plan(h, BF16, 384, 1152, 16384, trans_a=True, split_k=True)
    assert pl.split == (8, 2048) and pl.split_fast.expr == M.WG_SPLIT_TILE.expr("bf16", True, False)
    assert "gemm_wgmma_s<" in pl.split_fast.expr and pl.split_fast.unit == "matmul.wgmmas.bf16"
    assert pl.reduce.expr == "pydnn::matmul::splitk_reduce<pydnn::bf16_t>" and pl.reduce.unit == pl.split_fast.unit
    # without the caller's workspace the plan runs the whole-K launch the chooser takes (plan.fast: also
    # what the RNN engine launches from the record)
    whole = M.gemm_plan(h, BF16, 384, 1152, 16384, trans_a=True)
    assert pl.describe() == whole.describe() and "gemm_wgmma_s<" not in pl.describe()[0]
    p = pl.split_fast.params
    assert (p.batch, p.k_split, p.k, p.ldc, p.stride_c, p.tiles_m, p.tiles_n) == (8, 2048, 16384, 1152,
                                                                                   384 * 1152, 3, 5)
    assert pl.split_fast.grid == (min(15 * 8, h.sm_count), 1, 1) and pl.ws_bytes == 8 * 384 * 1152 * 4
    r = pl.reduce.params
    assert (r.batch, r.lda, r.stride_a, r.m, r.n, r.ldc) == (8, 1152, 384 * 1152, 384, 1152, 1152)
    pl = M.gemm_plan(h, BF16, 1536, 384, 16384, trans_a=True, split_k=True)
    assert pl.split == (5, 3328)  # 256 K tiles in splits of 52: the last one 48
    odd = M.gemm_plan(h, BF16, 130, 77, 5000, trans_b=True, lda=5000, ldb=5000, split_k=True)
    assert odd.split is not None and odd.split_fast.params.ldc == 78 and odd.ws_bytes == odd.split[0] * 130 * 78 * 4
    assert M.gemm_plan(h, BF16, 384, 1152, 16384, trans_a=True).split is None  # split_k not asked
    for kw in (dict(m=4096, n=4096, k=4096), dict(m=384, n=1152, k=512), dict(m=384, n=1152, k=16384, batch=2,
                                                                            stride_a=384 * 16384,
                                                                            stride_b=1152 * 16384,
                                                                            stride_c=384 * 1152),
               dict(m=384, n=1152, k=16384, lda=16388)):
        assert M.gemm_plan(h, BF16, trans_a=False, split_k=True, **kw).split is None, kw
    monkeypatch.setattr(tuning.matmul, "SPLIT_K", False)
    assert M.gemm_plan(h, BF16, 384, 1152, 16384, trans_a=True, split_k=True).split is None
    monkeypatch.setattr(tuning.matmul, "SPLIT_K", True)
    monkeypatch.setattr(h, "arch", "sm_80")
    assert M.gemm_plan(h, BF16, 384, 1152, 16384, trans_a=True, split_k=True).split is None


def test_split_k_several_waves(monkeypatch):
    """tuning.matmul.SPLIT_WAVES: the split count may take several waves of (split, tile) items. The GPT demo's
    MLP weight gradients (3072 x 768 and 768 x 3072 over K = 65536 tokens: 72 tiles of 128 x 256, more than
    half a wave, so at most one split fits a wave and the one-wave rule does not split) take S = 9 (648 items,
    4.9 waves of 132; S = 11's 6 full waves cost one more reduction partial a tile for a near-equal K walk);
    the one-wave plans keep their S where a second wave buys nothing (384 x 1152 x 16384: 8; 1536 x 384: 5; qkv);
    the workspace stays under SPLIT_WS_MAX; with the switch off, the one-wave rule."""
    h = cpu_handle()
    monkeypatch.setattr(h, "arch", "sm_90")
    monkeypatch.setattr(h, "sm_count", 132)
    monkeypatch.setattr(tuning.matmul, "USE_WGMMA", True)
    monkeypatch.setattr(tuning.matmul, "SPLIT_K", True)
    assert tuning.matmul.SPLIT_WAVES is True
    for m, n in ((3072, 768), (768, 3072)):
        pl = M.gemm_plan(h, BF16, m, n, 65536, trans_a=True, split_k=True)
        assert pl.split == (9, 114 * 64) and pl.ws_bytes == 9 * m * n * 4 <= M.SPLIT_WS_MAX
        assert pl.split_fast.grid == (132, 1, 1) and pl.split_fast.params.batch == 9
    # qkv's 30 tiles: S = 4 (120 items, one wave) against 13 (390, 3 waves) nearly tie in the model; S = 4
    # measured 2% faster (H200, session 30: 0.208 against 0.212 ms)
    assert M.gemm_plan(h, BF16, 1280, 768, 65536, trans_a=True, split_k=True).split == (4, 16384)
    assert M.gemm_plan(h, BF16, 384, 1152, 16384, trans_a=True, split_k=True).split == (8, 2048)
    assert M.gemm_plan(h, BF16, 1536, 384, 16384, trans_a=True, split_k=True).split == (5, 3328)
    # the cost model: S = 9 against the whole K on 72 tiles (1 wave of 1024 K tiles)
    cost = lambda s: -(-72 * s // 132) * (-(-1024 // s) + M.SPLIT_ITEM_KT) + M.SPLIT_REDUCE_KT * s * 72  # noqa: E731
    assert cost(9) < cost(11) < 0.61 * (1024 + M.SPLIT_ITEM_KT)
    # a cap on the partials: 3072 x 768 fp32 is 9 MiB a split
    monkeypatch.setattr(M, "SPLIT_WS_MAX", 5 * 3072 * 768 * 4)
    assert M.gemm_plan(h, BF16, 3072, 768, 65536, trans_a=True, split_k=True).split[0] <= 5
    # K too short for 2 splits of SPLIT_MIN_KTILES, or for a second wave to pay (16 K tiles: 2 waves of 8 + fill
    # cost more than 1 of 16), on small problems too
    for m, n, k in ((3072, 768, 64), (3072, 768, 15 * 64), (3072, 768, 16 * 64), (64, 10, 16), (600, 4096, 16)):
        assert M.gemm_plan(h, BF16, m, n, k, trans_a=True, split_k=True).split is None, (m, n, k)
    monkeypatch.setattr(tuning.matmul, "SPLIT_WAVES", False)
    assert M.gemm_plan(h, BF16, 3072, 768, 65536, trans_a=True, split_k=True).split is None
    assert M.gemm_plan(h, BF16, 1280, 768, 65536, trans_a=True, split_k=True).split == (4, 16384)


@pytest.mark.parametrize("ta, tb", [(False, False), (False, True), (True, False), (True, True)])
@pytest.mark.parametrize("m, n, k", [(70, 50, 1000), (33, 20, 640), (9, 7, 64 * 9 + 5)])
def test_split_k_emulation(ta, tb, m, n, k):
    """gemm_wgmma_s's operand offsets replayed in numpy: split z reads K range [z k_split, min((z + 1)
    k_split, k)) at A + (ta ? k0 lda : k0), B + (tb ? k0 : k0 ldb) over the flat operands (leading dims
    padded); the partials summed in split order as splitk_reduce does equal A @ B."""
    rng = np.random.default_rng(7)
    a, b = rng.normal(size=(m, k)), rng.normal(size=(k, n))
    lda, ldb = (m + 3 if ta else k + 5), (k + 2 if tb else n + 4)
    A = np.zeros((k if ta else m) * lda)
    B = np.zeros((n if tb else k) * ldb)
    for i in range(m):
        for q in range(k):
            A[q * lda + i if ta else i * lda + q] = a[i, q]
    for q in range(k):
        for j in range(n):
            B[j * ldb + q if tb else q * ldb + j] = b[q, j]
    kt = -(-k // 64)
    for s in (2, 3, 5):
        chunk = -(-kt // s)
        splits, ks = -(-kt // chunk), chunk * 64
        total = np.zeros((m, n))
        for z in range(splits):
            k0 = z * ks
            klen = min(ks, k - k0)
            assert klen > 0
            ao, bo = (k0 * lda if ta else k0), (k0 if tb else k0 * ldb)
            opa = np.array([[A[ao + q * lda + i] if ta else A[ao + i * lda + q] for q in range(klen)] for i in range(m)])
            opb = np.array([[B[bo + j * ldb + q] if tb else B[bo + q * ldb + j] for j in range(n)] for q in range(klen)])
            total = total + opa @ opb
        np.testing.assert_allclose(total, a @ b, rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("m, n, splits", [(5, 7, 3), (4, 8, 2), (1, 1, 4), (3, 130, 5)])
def test_splitk_reduce_emulation(m, n, splits):
    """splitk_reduce's loop replayed: thread i takes row i / pairs, columns 2 (i % pairs) and the next where it
    exists, reads split s's partial at row * ldw + col + s * m * ldw (ldw: n rounded up to even, so the pair
    load is 8-byte aligned) and sums the splits in order; every element of C once, the sum equals numpy's."""
    rng = np.random.default_rng(3)
    ldw = n + (n & 1)
    parts = rng.normal(size=(splits, m, ldw))
    flat = parts.reshape(-1)
    pairs = (n + 1) // 2
    out = np.full((m, n), np.nan)
    for i in range(m * pairs):
        row, col = i // pairs, (i % pairs) * 2
        base = row * ldw + col
        assert base % 2 == 0
        v0 = v1 = 0.0
        for s in range(splits):
            v0 += flat[base + s * m * ldw]
            if col + 1 < n:
                v1 += flat[base + s * m * ldw + 1]
        assert np.isnan(out[row, col])
        out[row, col] = v0
        if col + 1 < n:
            assert np.isnan(out[row, col + 1])
            out[row, col + 1] = v1
    np.testing.assert_allclose(out, parts.sum(0)[:, :n], rtol=1e-12)


def test_split_k_launch_uses_the_callers_workspace_only(monkeypatch):
    """A split-K plan launches gemm_wgmma_s into the caller's workspace and splitk_reduce from it only when the
    workspace holds ws_bytes (16-byte aligned); otherwise (none, too small, misaligned) its whole-K launch,
    plan.fast. No launch allocates device memory (CUDA-graph capture; the brief's rule)."""
    from pydnn._cuda import driver, memory

    h = cpu_handle()
    monkeypatch.setattr(tuning.matmul, "USE_WGMMA", True)
    monkeypatch.setattr(tuning.matmul, "SPLIT_K", True)
    monkeypatch.setattr(M._Launch, "function", lambda self, handle: self.expr)
    got = []
    monkeypatch.setattr(driver, "launch_args", lambda f, g, b, s, st, a: got.append((f, a[2].c, a[2].a)))

    def no_alloc(*a, **k):
        raise AssertionError("a launch allocated device memory")
    monkeypatch.setattr(memory, "DeviceArray", no_alloc)
    pl = M.gemm_plan(h, BF16, 384, 1152, 16384, trans_a=True, split_k=True)
    assert pl.split is not None and pl.ws_bytes > 0
    a, b, c, ws = 1 << 32, 2 << 32, 3 << 32, 4 << 32
    for w, size in ((0, 0), (ws, pl.ws_bytes - 1), (ws + 8, pl.ws_bytes)):
        got.clear()
        pl.launch(h, a, b, c, 1.0, 0.0, 0, w, size)
        assert [g[0] for g in got] == [pl.fast.expr] and got[0][1] == c, (w, size)
    got.clear()
    pl.launch(h, a, b, c, 1.0, 0.0, 0, ws, pl.ws_bytes)
    assert [g[0] for g in got] == [pl.split_fast.expr, pl.reduce.expr]
    assert got[0][1] == ws and got[1][2] == ws and got[1][1] == c
