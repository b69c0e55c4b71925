"""pydnn.ops.matmul (GEMM) on the GPU against the float64 reference: float / half / bfloat16, every
transposition, odd sizes (1, 7, 33, 129 ...), each tensor-core tile forced in turn, batches with padded
leading dims and strides (0 included), alpha / beta blending, bias, k = 0, the general (unaligned) path,
and the cached gemm() call. Every buffer starts poisoned (NaN bytes): C so that beta == 0 proves C is
never read, the gaps of A and B (leading-dim padding, batch gaps) so that reading outside the operands
shows, and C's gaps are checked untouched afterwards. Tolerances are pydnn.reference.dtypes' per output
type, relative to the magnitude the result is summed from (|alpha| |A||B| + |beta| |C| + |bias|), as the
convolution tests do for their long reductions."""
import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

import pydnn
from pydnn import tuning
from devtensor import POISON, assert_close
from pydnn.ops import matmul as M
from pydnn.reference import dtypes as rd
from pydnn.reference import matmul as ref
from pydnn.tensor import DTYPES

pytestmark = pytest.mark.gpu

F32, F16, BF16 = pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DATA_HALF, pydnn.PYDNN_DATA_BFLOAT16
TRANS = [(False, False), (False, True), (True, False), (True, True)]


class Flat:
    """A device buffer standing for an operand: `span` elements after `off` leading ones (to misalign
    the operand's pointer), all poisoned; `fill` writes values at the operand's element positions only."""

    def __init__(self, dtype, span, off=0):
        self.dtype, self.span, self.off = dtype, max(span, 1), off
        self.esize, self.np_dtype = DTYPES[dtype]
        self.buf = pydnn.DeviceArray((self.span + off,), self.np_dtype)
        self.buf.fill_bytes(POISON)
        self.values = np.full(self.span, np.nan)

    @property
    def ptr(self):
        return self.buf.ptr + self.off * self.esize

    def positions(self, batch, stride, rows, cols, ld):
        idx = as_strided(np.arange(self.span), (batch, rows, cols), (stride * 8, ld * 8, 8))
        return np.unique(idx.ravel())

    def fill(self, rng, pos, lo=-3.0, hi=3.0):
        flat = self.buf.to_numpy()
        v = rng.uniform(lo, hi, len(pos)).astype(np.float32).astype(np.float64)
        stored = rd.to_storage(v, self.dtype)
        flat[self.off + pos] = stored
        self.buf.copy_from_numpy(flat)
        self.values[pos] = rd.from_storage(stored, self.dtype)

    def download(self):
        return rd.from_storage(self.buf.to_numpy()[self.off:], self.dtype)

    def raw(self):
        return self.buf.to_numpy()[self.off:]


class Problem:
    def __init__(self, rng, dtype, m, n, k, ta=False, tb=False, lda=None, ldb=None, ldc=None, batch=1, sa=0, sb=0,
                 sc=0, bias=False, offs=(0, 0, 0), pad8=False):
        """pad8: default leading dims rounded up to multiples of 8 (the cp.async path for any m, n, k)."""
        self.dtype, self.m, self.n, self.k, self.ta, self.tb, self.batch = dtype, m, n, k, ta, tb, batch
        up = (lambda v: -(-v // 8) * 8) if pad8 else (lambda v: v)
        self.lda = lda if lda is not None else up(max(m if ta else k, 1))
        self.ldb = ldb if ldb is not None else up(max(k if tb else n, 1))
        self.ldc = ldc if ldc is not None else up(max(n, 1))
        self.sa, self.sb, self.sc = sa, sb, sc
        ra, ca = (k, m) if ta else (m, k)
        rb, cb = (n, k) if tb else (k, n)
        self.a = Flat(dtype, M._span(batch, sa, ra, ca, self.lda), offs[0])
        self.b = Flat(dtype, M._span(batch, sb, rb, cb, self.ldb), offs[1])
        self.c = Flat(dtype, M._span(batch, sc, m, n, self.ldc), offs[2])
        self.a.fill(rng, self.a.positions(batch, sa, ra, ca, self.lda))
        self.b.fill(rng, self.b.positions(batch, sb, rb, cb, self.ldb))
        self.cpos = self.c.positions(batch, sc, m, n, self.ldc)
        self.bias = None
        if bias:
            self.bias = Flat(dtype, n)
            self.bias.fill(rng, np.arange(n))

    def kw(self):
        return dict(trans_a=self.ta, trans_b=self.tb, lda=self.lda, ldb=self.ldb, ldc=self.ldc, batch=self.batch,
                    stride_a=self.sa, stride_b=self.sb, stride_c=self.sc, bias=self.bias is not None)

    def plan(self, handle):
        return M.gemm_plan(handle, self.dtype, self.m, self.n, self.k, **self.kw())

    def run(self, handle, rng, alpha=1.0, beta=0.0, plan=None, workspace=0, workspace_size=0):
        """Launch (C poisoned for beta == 0, random otherwise) and check against the reference."""
        self.c.buf.fill_bytes(POISON)
        self.c.values[:] = np.nan
        if beta != 0.0:
            self.c.fill(rng, self.cpos)
        c0 = self.c.values.copy()
        plan = plan or self.plan(handle)
        bptr = self.bias.ptr if self.bias is not None else 0
        plan.launch(handle, self.a.ptr, self.b.ptr, self.c.ptr, alpha, beta, bptr, workspace, workspace_size)
        self.check(c0, alpha, beta)

    def check(self, c0, alpha, beta, what=""):
        args = (self.m, self.n, self.k, alpha, beta, self.ta, self.tb, self.lda, self.ldb, self.ldc, self.batch,
                self.sa, self.sb, self.sc, None if self.bias is None else self.bias.values)
        want = ref.gemm(self.a.values, self.b.values, c0, *args)
        scale = ref.gemm_magnitude(self.a.values, self.b.values, c0, *args)
        got = self.c.download()
        view = ref.view(got, self.batch, self.sc, self.m, self.n, self.ldc)
        tag = f"{what} m={self.m} n={self.n} k={self.k} trans={self.ta:d}{self.tb:d} batch={self.batch}"
        assert_close(view, want, self.dtype, tag, scale=scale)
        gaps = np.ones(self.c.span, bool)
        gaps[self.cpos] = False
        raw = self.c.raw().view(np.uint8).reshape(self.c.span, -1)[gaps]
        assert (raw == POISON).all(), f"{tag}: the kernel wrote outside C's elements"


SHAPES = [(1, 1, 1), (7, 5, 3), (33, 17, 65), (129, 130, 257), (64, 64, 64), (3, 300, 40)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("trans", TRANS)
@pytest.mark.parametrize("dtype", [F32, F16, BF16])
def test_shapes(handle, rng, dtype, trans, shape):
    pb = Problem(rng, dtype, *shape, *trans)
    pb.run(handle, rng)                        # beta = 0: C poisoned, never read
    pb.run(handle, rng, alpha=0.75, beta=-0.5)


@pytest.mark.parametrize("tile", range(len(M.TC_TILES)))
@pytest.mark.parametrize("trans", TRANS)
@pytest.mark.parametrize("dtype", [F16, BF16])
def test_each_tile(handle, rng, monkeypatch, dtype, trans, tile):
    """Each tensor-core tile on a problem with partial tiles on every edge (k not a multiple of 64 or 8)."""
    t = M.TC_TILES[tile]
    monkeypatch.setattr(M, "_choose_tile", lambda *a: t)
    pb = Problem(rng, dtype, 2 * t.bm + 37, t.bn + 91, 203, *trans, bias=True, pad8=True)
    plan = pb.plan(handle)
    assert plan.vec_ok and plan.describe()[0] == t.expr(M.TAG[dtype], *trans, True)
    pb.run(handle, rng, plan=plan)
    pb.run(handle, rng, alpha=-1.25, beta=0.5, plan=plan)


def _check_forced_tile(handle, rng, dtype, trans, t, m, n, k, batch, bias=True):
    """One problem on the tile `t` (forced through _choose_tile): leading dims rounded up to 8 (the fast
    path), a bias, the plan's kernel checked, then run plain and with alpha / beta. bias=False: no bias and
    beta 0 (the wgmma kernels' straight-line store of interior tiles), with alpha 1 and -1.25."""
    ta, tb = trans
    up = lambda v: -(-v // 8) * 8  # noqa: E731
    ra, lda = (k, up(m)) if ta else (m, up(k))
    rb, ldb = (n, up(k)) if tb else (k, up(n))
    pb = Problem(rng, dtype, m, n, k, *trans, batch=batch, sa=ra * lda, sb=rb * ldb, sc=m * up(n), bias=bias,
                 pad8=True)
    plan = pb.plan(handle)
    assert plan.vec_ok and plan.describe()[0] == t.expr(M.TAG[dtype], *trans, True)
    pb.run(handle, rng, plan=plan)
    pb.run(handle, rng, alpha=-1.25, beta=0.5 if bias else 0.0, plan=plan)
    assert plan.describe()[0] == t.expr(M.TAG[dtype], *trans, True), plan.tma_off  # gemm_tma: no fallback


@pytest.mark.parametrize("tile", range(len(M.CANDIDATE_TILES)))
@pytest.mark.parametrize("trans", TRANS)
@pytest.mark.parametrize("dtype", [F16, BF16])
def test_candidate_tiles(handle, rng, monkeypatch, dtype, trans, tile):
    """The tiles measured before they join the build (M.CANDIDATE_TILES, compiled here through
    extra_units): partial tiles on every edge, a ragged last K tile, a long K, and a batch."""
    t = M.CANDIDATE_TILES[tile]
    M.extra_units("cand", M.CANDIDATE_TILES)
    monkeypatch.setattr(M, "_choose_tile", lambda *a: t)
    for m, n, k, batch in ((2 * t.bm + 37, t.bn + 91, 203, 1), (t.bm, t.bn, 64 * 9, 1), (48, 72, 40, 3)):
        _check_forced_tile(handle, rng, dtype, trans, t, m, n, k, batch)


@pytest.mark.parametrize("trans", TRANS)
@pytest.mark.parametrize("dtype", [F32, F16, BF16])
def test_batched_strides(handle, rng, dtype, trans):
    """Padded leading dims (multiples of 8, so the fast path), batch gaps, and stride 0 (a broadcast A or B)."""
    m, n, k, batch = 72, 40, 96, 3
    ta, tb = trans
    lda, ldb, ldc = (m if ta else k) + 8, (k if tb else n) + 16, n + 8
    ra, rb = (k if ta else m), (n if tb else k)
    for sa, sb in ((ra * lda + 24, rb * ldb + 8), (0, rb * ldb), (ra * lda, 0)):
        pb = Problem(rng, dtype, m, n, k, ta, tb, lda, ldb, ldc, batch, sa, sb, m * ldc + 40, bias=dtype != F32)
        assert pb.plan(handle).vec_ok or dtype == F32
        pb.run(handle, rng)
        pb.run(handle, rng, alpha=0.5, beta=2.0)


@pytest.mark.parametrize("trans", TRANS)
@pytest.mark.parametrize("dtype", [F16, BF16])
def test_general_path(handle, rng, dtype, trans):
    """Operands cp.async cannot take: odd leading dims, a pointer one element off 16 bytes, odd strides."""
    m, n, k = 77, 66, 99
    ta, tb = trans
    pb = Problem(rng, dtype, m, n, k, ta, tb, (m if ta else k) + 3, (k if tb else n) + 1, n + 1, batch=2,
                 sa=(k if ta else m) * ((m if ta else k) + 3) + 5, sb=0, sc=m * (n + 1) + 1)
    assert not pb.plan(handle).vec_ok
    pb.run(handle, rng)
    pb.run(handle, rng, alpha=1.5, beta=-1.0)
    m, n, k = 72, 64, 96  # packed dims that are multiples of 8, but A and C start 2 bytes off
    pb = Problem(rng, dtype, m, n, k, ta, tb, offs=(1, 0, 1))
    plan = pb.plan(handle)
    assert plan.vec_ok and pb.a.ptr % 16
    pb.run(handle, rng, plan=plan)
    pb.run(handle, rng, alpha=1.0, beta=1.0, plan=plan)


@pytest.mark.parametrize("dtype", [F32, F16, BF16])
def test_k_zero(handle, rng, dtype):
    """k = 0: C = beta * C (+ bias); beta = 0 writes zeros (+ bias) over the poison."""
    pb = Problem(rng, dtype, 19, 23, 0, bias=True)
    pb.run(handle, rng)
    pb.run(handle, rng, alpha=2.0, beta=0.25)


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_large(handle, rng, dtype):
    """Many tiles and a long K (the multi-stage pipeline in steady state), the tile the chooser picks."""
    pb = Problem(rng, dtype, 1000, 1104, 1496, False, True)
    assert pb.plan(handle).vec_ok or dtype == F32
    pb.run(handle, rng, alpha=0.5, beta=1.0)


def test_gemm_cached(handle, rng):
    """gemm(): the plan is made once per handle and problem, then reused; results as with the plan."""
    pb = Problem(rng, BF16, 130, 72, 48, False, True, bias=True)
    for beta in (0.0, 0.5):
        pb.c.buf.fill_bytes(POISON)
        pb.c.values[:] = np.nan
        if beta:
            pb.c.fill(rng, pb.cpos)
        c0 = pb.c.values.copy()
        M.gemm(handle, BF16, 130, 72, 48, pb.a.ptr, pb.b.ptr, pb.c.ptr, 1.0, beta, trans_b=True, bias=pb.bias.ptr)
        pb.check(c0, 1.0, beta, "gemm()")
    keys = [k for k in handle.prepared if isinstance(k, tuple) and k[:1] == ("matmul",) and k[2:5] == (130, 72, 48)]
    assert len(keys) == 1


def test_matches_torch_bf16(handle, rng):
    """A projection-like shape against torch.matmul (both round to bf16 once; fp32 accumulation)."""
    torch = pytest.importorskip("torch")
    g = torch.Generator(device="cuda").manual_seed(int(rng.integers(2**31)))
    x = torch.randn(512, 768, device="cuda", generator=g).to(torch.bfloat16)
    w = torch.randn(1024, 768, device="cuda", generator=g).to(torch.bfloat16)
    y = torch.empty(512, 1024, device="cuda", dtype=torch.bfloat16)
    h = pydnn.create()
    try:
        pydnn.set_stream(h, torch.cuda.current_stream().cuda_stream)
        M.gemm(h, BF16, 512, 1024, 768, x.data_ptr(), w.data_ptr(), y.data_ptr(), trans_b=True)
        want = (x.double() @ w.double().t())
        scale = x.double().abs() @ w.double().abs().t()
        torch.cuda.synchronize()
        assert_close(y.double().cpu().numpy(), want.cpu().numpy(), BF16, "vs torch", scale=scale.cpu().numpy())
    finally:
        pydnn.destroy(h)


# Last in the file: a fault in the new path cannot take the rest of the suite's context with it.
WG_SHAPES = [(1, 1, 1, 1), (7, 5, 3, 1), (64, 64, 16, 1), (33, 17, 65, 1), (130, 72, 200, 1)]


WG_ALL = M.WG_TILES + (M.WG_PERSIST_TILE,) + M.WG_CANDIDATES


@pytest.mark.parametrize("tile", range(len(WG_ALL)))
@pytest.mark.parametrize("trans", TRANS)
@pytest.mark.parametrize("dtype", [F16, BF16])
def test_wgmma_tiles(handle, rng, monkeypatch, dtype, trans, tile):
    """gemm_wgmma (sm_90 only), each tile (and candidate) forced: small shapes first (one partial tile,
    k < 16, k = 1), then partial tiles on every edge with a ragged last K tile, exactly one tile with a
    long K (the ring wraps), several tiles with a long K, and a batch (the ring reused per batch)."""
    if handle.arch != M.WG_ARCH:
        pytest.skip(f"gemm_wgmma runs on {M.WG_ARCH} only (this device is {handle.arch})")
    t = WG_ALL[tile]
    M.wgmma_extra_units()
    monkeypatch.setattr(M, "_choose_tile", lambda *a: t)
    monkeypatch.setattr(tuning.matmul, "USE_TMA", False)  # the wgmma kernels themselves (gemm_tma: below)
    big = [(2 * t.bm + 37, t.bn + 91, 203, 1), (t.bm, t.bn, 64 * 9, 1), (3 * t.bm + 5, 2 * t.bn + 8, 1000, 1),
           (48, 72, 40, 3)]
    for m, n, k, batch in WG_SHAPES + big:
        _check_forced_tile(handle, rng, dtype, trans, t, m, n, k, batch)
    # no bias, beta 0: interior tiles take the straight-line store (edge tiles beside them do not)
    for m, n, k, batch in [(2 * t.bm, 2 * t.bn, 200, 2), (3 * t.bm + 5, 2 * t.bn + 8, 1000, 1)]:
        _check_forced_tile(handle, rng, dtype, trans, t, m, n, k, batch, bias=False)
    if t.persist:
        # a grid of 2 blocks: each walks several tiles (edges, ragged K, batches), copying the next tile's
        # first K tiles before each epilogue
        monkeypatch.setattr(handle, "sm_count", 2)
        for m, n, k, batch in [(3 * t.bm + 5, 2 * t.bn + 8, 1000, 1), (2 * t.bm + 37, t.bn + 91, 203, 3),
                               (48, 72, 40, 5), (t.bm, t.bn, 64, 3)]:
            _check_forced_tile(handle, rng, dtype, trans, t, m, n, k, batch)
        _check_forced_tile(handle, rng, dtype, trans, t, 3 * t.bm + 5, 2 * t.bn + 8, 300, 2, bias=False)


@pytest.mark.parametrize("shape, tile", [((2088, 2304), 0), ((10240, 384), 1)])
@pytest.mark.parametrize("trans", [(False, True), (True, False)])
def test_wgmma_chosen(handle, rng, trans, shape, tile):
    """The chooser's own pick on problems of a wave of blocks and K >= WG_MIN_K: gemm_wgmma on sm_90 (each
    WG_TILES entry once), gemm_tc elsewhere; checked with bias and beta."""
    m, n = shape
    pb = Problem(rng, BF16, m, n, M.WG_MIN_K + 24, *trans, bias=True)
    plan = pb.plan(handle)
    if handle.arch == M.WG_ARCH and tuning.matmul.USE_WGMMA:
        want = M.WG_PERSIST_TILE if tile == 0 and tuning.matmul.WG_PERSIST else M.WG_TILES[tile]
        if tile == 0 and tuning.matmul.USE_TMA:
            want = M.TMA_TILE
        assert plan.describe()[0] == want.expr("bf16", *trans)
    else:
        assert "gemm_wgmma" not in plan.describe()[0]
    pb.run(handle, rng, plan=plan)
    pb.run(handle, rng, alpha=0.5, beta=-1.0, plan=plan)


SIMT_BUILD = M.SIMT_TILES + (M.SIMT_BIG_TILE,)


@pytest.mark.parametrize("tile", range(len(SIMT_BUILD)))
@pytest.mark.parametrize("trans", TRANS)
def test_simt_tiles(handle, rng, monkeypatch, trans, tile):
    """Each float tile of the build forced (SIMT_BIG_TILE included): partial tiles on every edge with a ragged K
    and a bias; a batch with padded leading dims and gaps; odd leading dims with A and C one element off 16 bytes
    (the element-by-element loads and stores); more items than a wave of persistent blocks."""
    _simt_tile_cases(handle, rng, monkeypatch, trans, SIMT_BUILD[tile])


@pytest.mark.parametrize("name", [t.name for t in M.SIMT_CANDIDATES])
@pytest.mark.parametrize("trans", TRANS, ids=["nn", "nt", "tn", "tt"])
def test_simt_candidates(handle, rng, monkeypatch, trans, name):
    """Each float candidate (SIMT_CANDIDATES: 8 x 16 / 16 x 8 outputs a thread, 4-warp blocks two an SM, the
    128 x 256 block, BK 16; their units compiled here through simt_extra_units) forced, as test_simt_tiles."""
    M.simt_extra_units()
    _simt_tile_cases(handle, rng, monkeypatch, trans, next(t for t in M.SIMT_CANDIDATES if t.name == name))


@pytest.mark.parametrize("which", ["big", "c2"])
def test_simt_big_switch(handle, rng, monkeypatch, which):
    """tuning.matmul.SIMT_BIG: its default ("big": SIMT_BIG_TILE, the build's unit matmul.f32big) or a named
    candidate (units compiled on first use) runs a long-K float GEMM in the 128 x 128 tile's place, against the
    float64 reference."""
    t = M.SIMT_BIG_TILE if which == "big" else next(t for t in M.SIMT_CANDIDATES if t.name == which)
    monkeypatch.setattr(tuning.matmul, "SIMT_BIG", which)
    monkeypatch.setattr(M, "SIMT_BIG_WAVES", 0)  # (a problem the float64 reference takes quickly)
    pb = Problem(rng, F32, 700, 900, M.SHORT_K + 37, False, True, bias=True)
    plan = pb.plan(handle)
    assert plan.describe()[0] == t.expr("f32", False, True)
    pb.run(handle, rng, plan=plan)


def _simt_tile_cases(handle, rng, monkeypatch, trans, t):
    monkeypatch.setattr(M, "_choose_simt_tile", lambda *a: t)
    ta, tb = trans
    pb = Problem(rng, F32, 2 * t.bm + 37, t.bn + 91, 203, ta, tb, bias=True)
    plan = pb.plan(handle)
    assert plan.describe()[0] == t.expr("f32", ta, tb) and plan.describe()[2] == (t.threads, 1, 1)
    pb.run(handle, rng, plan=plan)
    pb.run(handle, rng, alpha=-1.25, beta=0.5, plan=plan)
    m, n, k, batch = t.bm + 5, t.bn - 3, 8 * 9 + 3, 3
    lda, ldb, ldc = (m if ta else k) + 4, (k if tb else n) + 8, n + 5
    ra, rb = (k if ta else m), (n if tb else k)
    pb = Problem(rng, F32, m, n, k, ta, tb, lda, ldb, ldc, batch, ra * lda + 12, rb * ldb, m * ldc + 7)
    pb.run(handle, rng)
    pb.run(handle, rng, alpha=0.5, beta=2.0)
    pb = Problem(rng, F32, 70, 45, 33, ta, tb, (70 if ta else 33) + 1, (33 if tb else 45) + 3, 47, offs=(1, 0, 1))
    pb.run(handle, rng, alpha=1.5, beta=-1.0)
    # more (batch, tile) items than a wave of blocks: a persistent tile's blocks run on from item to item
    # (the next item's first K tile fetched during the last one's); k = 0 walks the items with no K loop
    m, n = t.bm + 2, 2 * t.bn + 1
    batch = -(-5 * t.per_sm * handle.sm_count // (2 * 3 * 3))
    for k in (19, 0):
        pb = Problem(rng, F32, m, n, k, ta, tb, batch=batch, sa=m * k, sb=k * n, sc=m * n, bias=True)
        pb.run(handle, rng, alpha=0.5, beta=-2.0)


@pytest.mark.parametrize("trans", TRANS)
def test_simt_batches_side_by_side(handle, rng, trans):
    """C's batches interleaved within its rows (stride_c = n, ldc = batch * n + 3), as the Winograd GEMMs
    write an NHWC-ordered workspace; the gaps stay poisoned."""
    ta, tb = trans
    m, n, k, batch = 150, 24, 40, 5
    ra, rb = (k if ta else m), (n if tb else k)
    lda, ldb = (m if ta else k), (k if tb else n)
    pb = Problem(rng, F32, m, n, k, ta, tb, lda, ldb, batch * n + 3, batch, ra * lda, rb * ldb, n)
    pb.run(handle, rng)
    pb.run(handle, rng, alpha=0.5, beta=1.5)


@pytest.mark.parametrize("trans", TRANS)
@pytest.mark.parametrize("dtype", [F16, BF16])
def test_split_k(handle, rng, dtype, trans):
    """Split-K (sm_90, gemm_plan(split_k=True): gemm_wgmma_s + splitk_reduce): partial tiles on the m / n
    edges, an odd n (the workspace's row pitch rounded up), a ragged last split and a ragged last K tile,
    with bias, alpha and beta; the GEMM's launches repeated give bitwise the same C (the partials summed in
    split order)."""
    if handle.arch != M.WG_ARCH:
        pytest.skip(f"split-K runs on {M.WG_ARCH} only (this device is {handle.arch})")
    ta, tb = trans
    up = lambda v: -(-v // 8) * 8  # noqa: E731
    for m, n, k in [(130, 77, 5000), (257, 300, 64 * 20 + 24), (384, 1152, 8192)]:
        ra, lda = (k, up(m)) if ta else (m, up(k))
        rb, ldb = (n, up(k)) if tb else (k, up(n))
        pb = Problem(rng, dtype, m, n, k, ta, tb, lda=lda, ldb=ldb, ldc=up(n), bias=True, pad8=True)
        plan = M.gemm_plan(handle, dtype, m, n, k, split_k=True, **pb.kw())
        assert plan.split is not None and plan.split_fast.expr == M.WG_SPLIT_TILE.expr(M.TAG[dtype], ta, tb)
        ws = pydnn.DeviceArray((plan.ws_bytes,), np.uint8)
        pb.run(handle, rng, plan=plan, workspace=ws.ptr, workspace_size=plan.ws_bytes)
        if m * n * k > 10**8:
            continue  # the weight-gradient-like shape once (its float64 reference costs seconds)
        first = pb.c.download()
        pb.run(handle, rng, plan=plan, workspace=ws.ptr, workspace_size=plan.ws_bytes)
        np.testing.assert_array_equal(pb.c.download(), first)
        pb.run(handle, rng, alpha=-1.25, beta=0.5, plan=plan, workspace=ws.ptr, workspace_size=plan.ws_bytes)
        # without a workspace (or one too small) the same plan runs its whole-K launch
        pb.run(handle, rng, alpha=0.75, beta=0.25, plan=plan, workspace=ws.ptr, workspace_size=plan.ws_bytes - 1)
        pb.run(handle, rng, plan=plan)


def test_split_k_through_pydnn_matmul(handle, rng):
    """pydnn.matmul (the public call, which allows split-K) on a weight-gradient shape: dW = dY^T X with dY
    stored [K][M] (A column-major through its strides), against float64; C's gaps untouched."""
    from devtensor import DevTensor

    m, n, k = 384, 640, 8192
    a = DevTensor((m, k), BF16, strides=(1, m))
    b = DevTensor((k, n), BF16)
    c = DevTensor((m, n), BF16, strides=(n + 8, 1))
    av, bv = a.random(rng, -1, 1), b.random(rng, -1, 1)
    size = pydnn.get_matmul_ex_workspace_size(handle, a.desc, b.desc, c.desc)
    if handle.arch == M.WG_ARCH:
        assert size > 0
    ws = pydnn.DeviceArray((max(size, 1),), np.uint8)
    pydnn.matmul_ex(handle, 1.0, a.desc, a.ptr, b.desc, b.ptr, 0.0, c.desc, c.ptr, ws.ptr, size)
    assert_close(c.download(), av @ bv, BF16, "pydnn.matmul split-K", scale=np.abs(av) @ np.abs(bv))
    c.check_untouched()
    pydnn.matmul(handle, 1.0, a.desc, a.ptr, b.desc, b.ptr, 0.0, c.desc, c.ptr)  # no workspace: whole K
    assert_close(c.download(), av @ bv, BF16, "pydnn.matmul whole K", scale=np.abs(av) @ np.abs(bv))
    c.check_untouched()


def test_split_k_several_waves(handle, rng):
    """tuning.matmul.SPLIT_WAVES: 72 output tiles of 128 x 256 (dW = dY^T X, 1536 x 1536, K = 8192; more than half
    the SMs, so no second split fits one wave) split into S > 1 K ranges walked in several waves of (split,
    tile) items by pydnn.matmul_ex, against float64; C's gaps untouched; a second call bitwise the same."""
    from devtensor import DevTensor

    if handle.arch != M.WG_ARCH:
        pytest.skip(f"split-K runs on {M.WG_ARCH} only (this device is {handle.arch})")
    m, n, k = 1536, 1536, 8192
    plan = M.gemm_plan(handle, BF16, m, n, k, trans_a=True, ldc=n + 8, split_k=True)
    assert plan.split is not None and plan.split[0] * 72 > handle.sm_count, (plan.split, handle.sm_count)
    a = DevTensor((m, k), BF16, strides=(1, m))
    b = DevTensor((k, n), BF16)
    c = DevTensor((m, n), BF16, strides=(n + 8, 1))
    av, bv = a.random(rng, -1, 1), b.random(rng, -1, 1)
    size = pydnn.get_matmul_ex_workspace_size(handle, a.desc, b.desc, c.desc)
    assert size >= plan.ws_bytes
    ws = pydnn.DeviceArray((size,), np.uint8)
    pydnn.matmul_ex(handle, 1.0, a.desc, a.ptr, b.desc, b.ptr, 0.0, c.desc, c.ptr, ws.ptr, size)
    got = c.download()
    assert_close(got, av @ bv, BF16, "split-K over several waves", scale=np.abs(av) @ np.abs(bv))
    c.check_untouched()
    pydnn.matmul_ex(handle, 1.0, a.desc, a.ptr, b.desc, b.ptr, 0.0, c.desc, c.ptr, ws.ptr, size)
    np.testing.assert_array_equal(c.download(), got)


# ----------------------------------------------------------------------------- gemm_tma (sm_90)

def _sm90_only(handle):
    if handle.arch != M.WG_ARCH:
        pytest.skip(f"gemm_tma runs on {M.WG_ARCH} only (this device is {handle.arch})")


@pytest.mark.parametrize("trans", TRANS)
@pytest.mark.parametrize("dtype", [F16, BF16])
def test_tma_kernel(handle, rng, monkeypatch, dtype, trans):
    """gemm_tma (TMA copies, a producer warpgroup, two consumer warpgroups, persistent), forced through the
    chooser's 128x256 tile: one partial tile (k < 16, k = 1: the TMA boxes zero filled past every edge),
    partial tiles on every edge with a ragged last K tile, one tile with a long K (the ring wraps), several
    tiles, a batch (3-D maps); with bias, alpha and beta, and without (the straight-line store). Then a
    grid of 2 blocks walking several tiles each (the ring's phases running on across tiles)."""
    _sm90_only(handle)
    monkeypatch.setattr(tuning.matmul, "USE_TMA", True)
    monkeypatch.setattr(M, "_choose_tile", lambda *a: M.WG_PERSIST_TILE)
    t = M.TMA_TILE
    for m, n, k, batch in WG_SHAPES + [(2 * t.bm + 37, t.bn + 91, 203, 1), (t.bm, t.bn, 64 * 9, 1),
                                       (3 * t.bm + 5, 2 * t.bn + 8, 1000, 1), (48, 72, 40, 3)]:
        _check_forced_tile(handle, rng, dtype, trans, t, m, n, k, batch)
    for m, n, k, batch in [(2 * t.bm, 2 * t.bn, 200, 2), (3 * t.bm + 5, 2 * t.bn + 8, 1000, 1)]:
        _check_forced_tile(handle, rng, dtype, trans, t, m, n, k, batch, bias=False)
    monkeypatch.setattr(handle, "sm_count", 2)
    for m, n, k, batch in [(3 * t.bm + 5, 2 * t.bn + 8, 1000, 1), (2 * t.bm + 37, t.bn + 91, 203, 3),
                           (48, 72, 40, 5), (t.bm, t.bn, 64, 3)]:
        _check_forced_tile(handle, rng, dtype, trans, t, m, n, k, batch)
    _check_forced_tile(handle, rng, dtype, trans, t, 3 * t.bm + 5, 2 * t.bn + 8, 300, 2, bias=False)


def test_tma_new_pointers_reencode(handle, rng, monkeypatch):
    """One gemm_tma plan launched on two sets of buffers and back: the tensor maps follow the pointers
    (encoded per base address, kept per plan)."""
    _sm90_only(handle)
    monkeypatch.setattr(tuning.matmul, "USE_TMA", True)
    monkeypatch.setattr(M, "_choose_tile", lambda *a: M.WG_PERSIST_TILE)
    p1 = Problem(rng, BF16, 300, 520, 136, False, True, bias=True, pad8=True)
    p2 = Problem(rng, BF16, 300, 520, 136, False, True, bias=True, pad8=True)
    plan = p1.plan(handle)
    assert plan.tma is not None
    for pb in (p1, p2, p1):
        pb.run(handle, rng, plan=plan)
        pb.run(handle, rng, alpha=0.5, beta=2.0, plan=plan)


@pytest.mark.parametrize("m, n, k", [(2048, 11008, 4096), (1536, 4096, 4096)])
def test_tma_chosen_projection_vs_float64(handle, rng, m, n, k):
    """The chooser's own pick on 7B-model projection shapes (x @ W^T, bf16): gemm_tma on sm_90; against a
    float64 product on the GPU (torch), C's poisoned start never read."""
    torch = pytest.importorskip("torch")
    g = torch.Generator(device="cuda").manual_seed(int(rng.integers(2**31)))
    x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
    w = torch.randn(n, k, device="cuda", generator=g).to(torch.bfloat16)
    y = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    h = pydnn.create()
    try:
        pydnn.set_stream(h, torch.cuda.current_stream().cuda_stream)
        plan = M.gemm_plan(h, BF16, m, n, k, trans_b=True)
        if h.arch == M.WG_ARCH and tuning.matmul.USE_WGMMA and tuning.matmul.USE_TMA:
            assert plan.describe()[0] == M.TMA_TILE.expr("bf16", False, True)
        plan.launch(h, x.data_ptr(), w.data_ptr(), y.data_ptr())
        assert plan.tma_off is None, plan.tma_off
        want = x.double() @ w.double().t()
        scale = x.double().abs() @ w.double().abs().t()
        torch.cuda.synchronize()
        assert_close(y.double().cpu().numpy(), want.cpu().numpy(), BF16, "gemm_tma vs float64",
                     scale=scale.cpu().numpy())
    finally:
        pydnn.destroy(h)


@pytest.mark.parametrize("trans", TRANS)
def test_tma_cluster_candidate(handle, rng, monkeypatch, trans):
    """The 2-CTA cluster candidate (gemm_tma_c: B multicast to the CTA pair on tile rows 2i, 2i + 1; bf16),
    forced: one partial tile (the pair's second CTA past the matrix: zeros copied, nothing stored), an odd
    number of tile rows, edges everywhere with a ragged K, a batch; then grids of 1 and 2 clusters walking
    many pairs (the ring's phases running on across items, both CTAs in step)."""
    _sm90_only(handle)
    cand = M.TMA_CANDIDATES[0]
    monkeypatch.setattr(tuning.matmul, "USE_TMA", True)
    monkeypatch.setattr(M, "_choose_tile", lambda *a: M.WG_PERSIST_TILE)
    monkeypatch.setattr(M, "_tma_tile", lambda: cand)
    shapes = [(7, 5, 3, 1), (33, 17, 65, 1), (3 * 128, 256, 640, 1), (2 * 128 + 37, 256 + 91, 203, 1),
              (3 * 128 + 5, 2 * 256 + 8, 1000, 1), (48, 72, 40, 3)]
    for m, n, k, batch in shapes:
        _check_forced_tile(handle, rng, BF16, trans, cand, m, n, k, batch)
    _check_forced_tile(handle, rng, BF16, trans, cand, 4 * 128, 2 * 256, 200, 2, bias=False)
    for sms in (2, 4):
        monkeypatch.setattr(handle, "sm_count", sms)
        for m, n, k, batch in [(5 * 128 + 5, 2 * 256 + 8, 1000, 1), (2 * 128 + 37, 256 + 91, 203, 3)]:
            _check_forced_tile(handle, rng, BF16, trans, cand, m, n, k, batch)


@pytest.mark.parametrize("trans", TRANS)
def test_tma_wide_candidate(handle, rng, monkeypatch, trans):
    """gemm_tma's WIDE candidate (interior tiles without beta / bias store 16 bytes a lane after a quad
    transpose; bf16), forced: interior tiles (no bias, beta 0: the wide store) beside edge tiles, a batch,
    then with bias and beta (the pair stores), and C 2 elements off 16 bytes (no FLAG_C16: pair stores)."""
    _sm90_only(handle)
    cand = M.TMA_TILE if M.TMA_TILE.wide else M.TMA_CANDIDATES[1]
    monkeypatch.setattr(tuning.matmul, "USE_TMA", True)
    monkeypatch.setattr(M, "_choose_tile", lambda *a: M.WG_PERSIST_TILE)
    monkeypatch.setattr(M, "_tma_tile", lambda: cand)
    for m, n, k, batch in [(2 * 128, 2 * 256, 200, 2), (3 * 128 + 5, 2 * 256 + 8, 1000, 1), (128, 256, 64, 1)]:
        _check_forced_tile(handle, rng, BF16, trans, cand, m, n, k, batch, bias=False)
    _check_forced_tile(handle, rng, BF16, trans, cand, 2 * 128 + 37, 256 + 91, 203, 1)
    ta, tb = trans
    pb = Problem(rng, BF16, 256, 512, 128, ta, tb, offs=(0, 0, 2), pad8=True)
    plan = pb.plan(handle)
    assert plan.describe()[0] == cand.expr("bf16", ta, tb)
    pb.run(handle, rng, plan=plan)
