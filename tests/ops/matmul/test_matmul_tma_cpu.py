"""gemm_tma (the TMA + warp-specialised sm_90 GEMM) on the CPU: the tensor-map encoding arguments per
transposition and their validation (pydnn/_cuda/tensormap.py), the encoder's call into cuda.bindings
(a fake driver function, the real enum types), the plan's choice (sm_90 only, USE_TMA, the 128x256 tile,
operands TMA can address), the launch path (maps encoded once per base address, copied into the
__grid_constant__ params, no device allocation), the producer / consumer ring protocol replayed, and the
units compiled by NVRTC for sm_90a (no spills; SASS with UTMALDG and HGMMA where cuobjdump exists)."""
import ctypes
import types

import pytest

import pydnn
from pydnn import tuning
from pydnn._cuda import tensormap as TM
from pydnn.ops import matmul as M
from test_fuzz_cpu import cpu_handle

F32, F16, BF16 = pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DATA_HALF, pydnn.PYDNN_DATA_BFLOAT16
TRANS = [(False, False), (False, True), (True, False), (True, True)]


@pytest.fixture
def sm90(monkeypatch):
    h = cpu_handle()
    monkeypatch.setattr(h, "arch", "sm_90")
    for k, v in (("USE_WGMMA", True), ("WG_PERSIST", True), ("USE_TMA", True)):
        monkeypatch.setattr(tuning.matmul, k, v)
    return h


# ----------------------------------------------------------------------------- map arguments

@pytest.mark.parametrize("ta, tb", TRANS)
def test_map_arguments_per_transposition(sm90, monkeypatch, ta, tb):
    """A K-major operand (A plain, B transposed) is one box of 64 K x the tile's rows; an MN-major one boxes
    of 64 x 64 (one per 64-column slab): the layouts gemm_tma's wgmma descriptors read. Dims (contiguous,
    other, batch), strides in bytes."""
    monkeypatch.setattr(M, "_choose_tile", lambda *a: M.WG_PERSIST_TILE)  # too few tiles for the chooser
    m, n, k = 1000, 1536, 520
    lda, ldb = (1008 if ta else 528), (528 if tb else 1544)
    pl = M.gemm_plan(sm90, BF16, m, n, k, trans_a=ta, trans_b=tb, lda=lda, ldb=ldb)
    assert pl.tma is not None and pl.describe()[0] == M.TMA_TILE.expr("bf16", ta, tb)
    ma, mb = (c.map for c in pl.tma.maps)
    ra, ca = (k, m) if ta else (m, k)
    rb, cb = (n, k) if tb else (k, n)
    assert ma.dims == (ca, ra, 1) and ma.strides == (lda * 2, ra * lda * 2)
    assert mb.dims == (cb, rb, 1) and mb.strides == (ldb * 2, rb * ldb * 2)
    assert ma.box == ((64, 64, 1) if ta else (64, 128, 1))
    assert mb.box == ((64, 256, 1) if tb else (64, 64, 1))
    args = ma.args(0x7F0000001000)
    assert args[0] == "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16" and args[1] == 3 and args[2] == 0x7F0000001000
    assert args[6] == (1, 1, 1) and args[8] == "CU_TENSOR_MAP_SWIZZLE_128B"
    assert args[10] == "CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE"  # zeros past the edges (not NaN)
    # the bytes a stage's copies bring equal the full barrier's expect-tx count (ptx: STAGE_BYTES)
    a_boxes = 2 if ta else 1
    b_boxes = 4 if not tb else 1
    stage = a_boxes * 2 * ma.box[0] * ma.box[1] + b_boxes * 2 * mb.box[0] * mb.box[1]
    assert stage == (128 + 256) * 64 * 2
    f16 = M.gemm_plan(sm90, F16, m, n, k, trans_a=ta, trans_b=tb, lda=lda, ldb=ldb)
    assert f16.tma.maps[0].map.args(16)[0] == "CU_TENSOR_MAP_DATA_TYPE_FLOAT16"


def test_map_arguments_batched(sm90, monkeypatch):
    monkeypatch.setattr(M, "_choose_tile", lambda *a: M.WG_TILES[0])
    m, n, k, b = 512, 768, 640, 3
    pl = M.gemm_plan(sm90, BF16, m, n, k, batch=b, stride_a=m * k + 64, stride_b=k * n, stride_c=m * n)
    ma, mb = (c.map for c in pl.tma.maps)
    assert ma.dims == (k, m, b) and ma.strides == (k * 2, (m * k + 64) * 2)
    assert mb.dims == (n, k, b) and mb.strides == (n * 2, k * n * 2)


@pytest.mark.parametrize("args, needle", [
    (("bf16", 100, 64, 60, 1, 0, 64, 64), "ld 60 < cols"),
    (("bf16", 100, 60, 60, 1, 0, 64, 64), "multiple of 16 bytes"),
    (("bf16", 100, 64, 64, 2, 0, 64, 64), "broadcast"),
    (("bf16", 100, 64, 64, 2, 64 * 99, 64, 64), "overlapping"),
    (("bf16", 100, 64, 64, 2, 64 * 100 + 4, 64, 64), "batch stride"),
    (("bf16", 100, 64, 64, 1, 0, 128, 64), "box_cols"),
    (("bf16", 100, 64, 64, 1, 0, 64, 512), "box_rows"),
    (("bf16", 0, 64, 64, 1, 0, 64, 64), "rows 0"),
    (("i8", 10, 64, 64, 1, 0, 64, 64), "no tensor map type"),
])
def test_map_problems(args, needle):
    why = TM.map_problem(*args)
    assert why is not None and needle in why, why
    with pytest.raises(ValueError, match=needle.split()[0]):
        TM.TiledMap(*args)


def test_map_problem_none_for_good_maps():
    assert TM.map_problem("bf16", 8192, 8192, 8192, 1, 0, 64, 128) is None
    assert TM.map_problem("f16", 7, 9, 16, 4, 7 * 16, 64, 64) is None
    assert TM.map_problem("f32", 7, 9, 12, 1, 0, 32, 64) is None


def test_encode_calls_the_driver_with_its_enums(monkeypatch):
    """TiledMap.encode resolves every enum by name in cuda.bindings.driver (the real module's types) and
    returns the 128 bytes at the CUtensorMap's address."""
    d = pytest.importorskip("cuda.bindings.driver")
    from pydnn._cuda import driver

    seen = []

    real = d.cuTensorMapEncodeTiled

    def fake_encode(dt, rank, addr, dims, strides, box, estr, il, sw, l2, oob):
        # the real binding's argument conversion accepts them (it raises TypeError for plain ints in the
        # arrays); past it, without a driver, it fails to load libcuda (or, with one, encodes)
        try:
            real(dt, rank, addr, dims, strides, box, estr, il, sw, l2, oob)
        except (TypeError, ValueError):
            raise
        except Exception:  # noqa: BLE001 - no driver library here
            pass
        assert isinstance(dt, d.CUtensorMapDataType) and isinstance(sw, d.CUtensorMapSwizzle)
        assert isinstance(il, d.CUtensorMapInterleave) and isinstance(l2, d.CUtensorMapL2promotion)
        assert isinstance(oob, d.CUtensorMapFloatOOBfill)
        seen.append((dt, rank, addr, dims, strides, box, estr, sw))
        t = d.CUtensorMap()
        ctypes.memmove(t.getPtr(), bytes(range(128)), 128)
        return d.CUresult.CUDA_SUCCESS, t

    fake = types.SimpleNamespace(**{n: getattr(d, n) for n in ("CUtensorMapDataType", "CUtensorMapInterleave",
                                                               "CUtensorMapSwizzle", "CUtensorMapL2promotion",
                                                               "CUtensorMapFloatOOBfill", "CUresult")})
    fake.cuTensorMapEncodeTiled = fake_encode
    fake.cuuint64_t, fake.cuuint32_t = d.cuuint64_t, d.cuuint32_t
    monkeypatch.setattr(driver, "_driver", lambda: fake)
    monkeypatch.setattr(driver, "check", lambda r, what: None)
    m = TM.TiledMap("bf16", 300, 200, 208, 1, 0, 64, 128)
    assert m.encode(4096) == bytes(range(128))
    dt, rank, addr, dims, strides, box, estr, sw = seen[0]
    assert dt == d.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 and rank == 3 and addr == 4096
    assert all(isinstance(v, d.cuuint64_t) for v in dims + strides) and all(isinstance(v, d.cuuint32_t)
                                                                             for v in box + estr)
    ints = lambda vs: [int(v) for v in vs]  # noqa: E731
    assert ints(dims) == [200, 300, 1] and ints(strides) == [416, 300 * 416] and ints(box) == [64, 128, 1]
    assert ints(estr) == [1, 1, 1]
    assert sw == d.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B


# ----------------------------------------------------------------------------- plan choice

def test_tma_choice(sm90, monkeypatch):
    """gemm_tma where the chooser takes the 128x256 wgmma tile on sm_90 with USE_TMA; plan.fast stays the
    wgmma launch (the graph API's fused kernels and the RNN engine use it); never on another arch, with
    USE_TMA off, unaligned leading dims (the general path), broadcast batches, or small problems."""
    pl = M.gemm_plan(sm90, BF16, 8192, 8192, 8192)
    assert pl.describe() == (M.TMA_TILE.expr("bf16", False, False), (132, 1, 1), (384, 1, 1), M.TMA_TILE.smem)
    assert pl.tma.unit == "matmul.tma.bf16" and pl.fast.expr == M.WG_PERSIST_TILE.expr("bf16", False, False)
    q = pl.tma.params
    assert isinstance(q, M.MatmulTmaParams) and (q.p.m, q.p.n, q.p.k, q.p.tiles_m, q.p.tiles_n, q.p.group_m) == (
        8192, 8192, 8192, 64, 32, 8)
    for m, n, k in ((16384, 4096, 4096), (16384, 11008, 4096), (16384, 4096, 11008)):
        assert M.gemm_plan(sm90, BF16, m, n, k, trans_b=True).tma is not None, (m, n, k)
    assert M.gemm_plan(sm90, BF16, 8192, 8192, 8192, batch=2, stride_a=0, stride_b=8192 * 8192,
                       stride_c=8192 * 8192).tma is None  # A broadcast
    assert M.gemm_plan(sm90, BF16, 8192, 8192, 8192, lda=8196).tma is None  # lda: 8 bytes off: general path
    assert M.gemm_plan(sm90, BF16, 1024, 1024, 1024).tma is None  # the 128x256 tile is not chosen
    assert M.gemm_plan(sm90, F32, 8192, 8192, 8192).tma is None
    monkeypatch.setattr(tuning.matmul, "USE_TMA", False)
    assert M.gemm_plan(sm90, BF16, 8192, 8192, 8192).tma is None
    monkeypatch.setattr(tuning.matmul, "USE_TMA", True)
    for arch in ("sm_80", "sm_89", "sm_100"):
        monkeypatch.setattr(sm90, "arch", arch)
        assert M.gemm_plan(sm90, BF16, 8192, 8192, 8192).tma is None, arch
    monkeypatch.setattr(sm90, "arch", "sm_90")
    monkeypatch.setattr(sm90, "sm_count", 4)
    assert M.gemm_plan(sm90, BF16, 8192, 8192, 8192).tma.grid == (4, 1, 1)


def test_tma_launch_encodes_once_per_address(sm90, monkeypatch):
    """plan.launch on a TMA plan: the maps for the call's A and B copied into the params (encoded once per
    base address), the pointers and scalars into its MatmulParams, one launch, no device allocation;
    unaligned pointers take the general (mma.sync) path."""
    from pydnn._cuda import driver, memory

    enc = []

    def fake_bytes(address):
        return (address.to_bytes(8, "little") + b"\x03") * 14 + bytes(2)

    def fake_encode(self, address):
        enc.append(address)
        return fake_bytes(address)
    monkeypatch.setattr(TM.TiledMap, "encode", fake_encode)
    monkeypatch.setattr(M._Launch, "function", lambda self, handle: self.expr)
    got = []
    monkeypatch.setattr(driver, "launch_args", lambda f, g, b, s, st, a: got.append((f, g, b, s, bytes(a[2]))))

    def no_alloc(*a, **k):
        raise AssertionError("a launch allocated device memory")
    monkeypatch.setattr(memory, "DeviceArray", no_alloc)
    pl = M.gemm_plan(sm90, BF16, 4096, 4096, 4096, trans_b=True, bias=True)
    a, b, c, bias = 1 << 32, 2 << 32, 3 << 32, 4 << 32
    pl.launch(sm90, a, b, c, 0.5, 0.25, bias)
    pl.launch(sm90, a, b, c, 0.5, 0.25, bias)
    assert enc == [a, b]
    q = M.MatmulTmaParams.from_buffer_copy(got[-1][4])
    assert bytes(q.map_a) == fake_bytes(a) and bytes(q.map_b) == fake_bytes(b)
    assert (q.p.a, q.p.b, q.p.c, q.p.bias, q.p.alpha, q.p.beta) == (a, b, c, bias, 0.5, 0.25)
    assert q.p.flags == M.FLAG_BETA | M.FLAG_BIAS | M.FLAG_PAIR | M.FLAG_C16  # ldc 4096, c 16-byte aligned
    assert got[-1][:4] == (pl.tma.expr, pl.tma.grid, (384, 1, 1), M.TMA_TILE.smem)
    pl.launch(sm90, a + 4096, b, c, 1.0, 0.0, bias)
    assert enc == [a, b, a + 4096]  # B's map kept
    q = M.MatmulTmaParams.from_buffer_copy(got[-1][4])
    assert q.p.a == a + 4096 and bytes(q.map_a) == fake_bytes(a + 4096)
    n_enc = len(enc)
    pl.launch(sm90, a + 8, b, c, 1.0, 0.0, bias)  # 8-byte aligned only: the general path, no map
    assert len(enc) == n_enc and got[-1][0] == pl.general.expr


def test_tma_plan_falls_back_when_the_driver_cannot_encode(sm90, monkeypatch):
    """A driver that cannot encode (tools/bench_host.py's CPU stand-in has no cuTensorMapEncodeTiled; old
    bindings; a map refused): the plan launches its wgmma kernel, from then on, and says why (tma_off)."""
    from pydnn._cuda import driver

    monkeypatch.setattr(M._Launch, "function", lambda self, handle: self.expr)
    got = []
    monkeypatch.setattr(driver, "launch_args", lambda f, g, b, s, st, a: got.append(f))
    monkeypatch.setattr(driver, "_driver", lambda: types.SimpleNamespace())  # no encoder at all
    pl = M.gemm_plan(sm90, BF16, 4096, 4096, 4096)
    assert pl.tma is not None
    pl.launch(sm90, 1 << 32, 2 << 32, 3 << 32)
    assert got == [pl.fast.expr] and pl.tma is None and "AttributeError" in pl.tma_off
    assert pl.describe()[0] == pl.fast.expr


def test_tma_params_layout_matches_the_header():
    """MatmulTmaParams: the maps at 0 and 128 (64-byte aligned in C), MatmulParams at 256, 384 bytes (the C
    struct's size: a multiple of its 64-byte alignment). tests/kernels/test_params_layout.py compiles the
    header for the offsets."""
    assert M.MatmulTmaParams.map_a.offset == 0 and M.MatmulTmaParams.map_b.offset == 128
    assert M.MatmulTmaParams.p.offset == 256 and ctypes.sizeof(M.MatmulTmaParams) == 384


def test_cluster_candidate_plan(sm90, monkeypatch):
    """The 2-CTA cluster candidate (gemm_tma_c, bf16 only): B's K-major box split between the two CTAs (64 K
    x 128 rows each, multicast), MN-major B's slabs unchanged (two of the four each); the grid in whole
    clusters of units of 2 tile rows, at most one block an SM; fp16 plans keep gemm_tma (no unit)."""
    cand = M.TMA_CANDIDATES[0]
    assert cand.cm == 2 and cand.expr("bf16", False, True).startswith("pydnn::matmul::gemm_tma_c<")
    monkeypatch.setattr(M, "_tma_tile", lambda: cand)
    pl = M.gemm_plan(sm90, BF16, 8192, 8192, 8192, trans_b=True)
    assert pl.describe()[0] == cand.expr("bf16", False, True) and pl.tma.unit == "matmul.tmac.bf16"
    assert pl.tma.grid == (132, 1, 1) and pl.tma.maps[1].map.box == (64, 128, 1)
    assert pl.tma.maps[0].map.box == (64, 128, 1)
    assert M.gemm_plan(sm90, BF16, 8192, 8192, 8192).tma.maps[1].map.box == (64, 64, 1)
    assert M.gemm_plan(sm90, F16, 8192, 8192, 8192).tma.expr == M.TMA_TILE.expr("f16", False, False)
    # 3 tile rows x 2 tile columns: units of 2 rows -> 2 x 2 = 4 units, 8 blocks at most
    assert cand.grid(3, 2, 1, 132) == (8, 1, 1) and cand.grid(3, 2, 1, 5) == (4, 1, 1)
    assert cand.grid(64, 32, 1, 132) == (132, 1, 1) and cand.grid(1, 1, 3, 132) == (6, 1, 1)
    assert M.TMA_TILE.grid(3, 2, 1, 132) == (6, 1, 1) and M.TMA_TILE.grid(64, 32, 1, 132) == (132, 1, 1)


def _cluster_units(tiles_m, tiles_n, batch, group_m, grid, cm):
    """gemm_tma_body's item walk (its coords lambda) replayed for every block: (z, tm, tn) per item."""
    units_m = -(-tiles_m // cm)
    group = max(group_m // cm, 1) if cm > 1 else group_m
    per_batch = units_m * tiles_n
    walks = {}
    for b in range(grid):
        rank, first, step = b % cm, b // cm, grid // cm
        w = []
        for item in range(first, per_batch * batch, step):
            z, i = divmod(item, per_batch)
            per_group = group * tiles_n
            g = i // per_group
            gfirst = g * group
            rows = min(units_m - gfirst, group)
            r = i - g * per_group
            w.append((z, (gfirst + r % rows) * cm + rank, r // rows))
        walks[b] = w
    return walks


@pytest.mark.parametrize("tiles_m, tiles_n, batch, grid", [(64, 32, 1, 132), (3, 7, 2, 6), (5, 3, 4, 132),
                                                           (1, 1, 1, 2), (9, 2, 1, 4)])
@pytest.mark.parametrize("cm", [1, 2])
def test_items_cover_each_tile_once(tiles_m, tiles_n, batch, grid, cm):
    """Every (z, tm, tn) with tm < tiles_m is some block's item exactly once (a cluster's rank-1 block past an
    odd tiles_m walks the pair too, storing nothing); the two blocks of a cluster walk the same tile
    column and batch at every step (they share B); CM 1 is tile_coords_of's raster."""
    group_m = min(8, tiles_m)
    t = M.TmaTile(256, 4, cm=cm)
    g = t.grid(tiles_m, tiles_n, batch, grid)[0]
    walks = _cluster_units(tiles_m, tiles_n, batch, group_m, g, cm)
    seen = [it for w in walks.values() for it in w if it[1] < tiles_m]
    assert sorted(seen) == [(z, a, b) for z in range(batch) for a in range(tiles_m) for b in range(tiles_n)]
    if cm == 2:
        for c in range(g // 2):
            w0, w1 = walks[2 * c], walks[2 * c + 1]
            assert len(w0) == len(w1)
            assert all(a[0] == b[0] and a[2] == b[2] and b[1] == a[1] + 1 for a, b in zip(w0, w1))
    else:
        import test_matmul_cpu as base

        for b, w in walks.items():
            for i, (z, tm, tn) in enumerate(w):
                item = b + i * g
                assert (z, tm, tn) == (item // (tiles_m * tiles_n),) + base._tile_coords_of(
                    tiles_m, tiles_n, group_m, item % (tiles_m * tiles_n))


# ----------------------------------------------------------------------------- ring protocol

def _replay_ring(stages, ktiles, items_per_block, order_seed):
    """gemm_tma's barrier protocol replayed with mbarrier semantics (a phase completes when its arrivals
    (and, for full, the bytes) are in; try_wait.parity(P) succeeds once the phase of parity P has completed,
    a fresh barrier counting as having completed parity 1): one producer, two consumer warpgroups, the
    three advancing in a seeded random interleaving. Every consumer must read each stage fill exactly once,
    in order, and the producer must never refill a stage a consumer has not released."""
    import random

    rnd = random.Random(order_seed)
    total = ktiles * items_per_block
    full = [dict(phase=0, arr=0) for _ in range(stages)]    # count 1
    empty = [dict(phase=0, arr=0) for _ in range(stages)]   # count 2
    content = [None] * stages
    readers = [set() for _ in range(stages)]

    def done(bar, parity):  # try_wait.parity: the phase of this parity has completed
        return (bar["phase"] & 1) != parity

    def arrive(bar, count):
        bar["arr"] += 1
        if bar["arr"] == count:
            bar["arr"] = 0
            bar["phase"] += 1

    prod = dict(it=0)
    cons = [dict(it=0, pending=None) for _ in range(2)]
    steps = 0
    while prod["it"] < total or any(c["it"] < total or c["pending"] is not None for c in cons):
        steps += 1
        assert steps < 100000, "deadlock"
        who = rnd.randrange(3)
        if who == 0 and prod["it"] < total:
            it = prod["it"]
            s = it % stages
            if done(empty[s], ((it // stages) & 1) ^ 1):
                assert readers[s] == ({0, 1} if content[s] is not None else set()), "refilled before released"
                content[s], readers[s] = it, set()
                arrive(full[s], 1)
                prod["it"] += 1
        elif who > 0:
            w, c = who - 1, cons[who - 1]
            if c["it"] < total:
                it = c["it"]
                s = it % stages
                if done(full[s], (it // stages) & 1):
                    assert content[s] == it, f"consumer {w} read fill {content[s]} as K tile {it}"
                    readers[s].add(w)
                    # wgmma of `it` issued; the previous one's stage released (wait<1>), except at an item start
                    if it % ktiles and c["pending"] is not None:
                        arrive(empty[c["pending"] % stages], 2)
                    c["pending"] = it
                    c["it"] += 1
                    if c["it"] % ktiles == 0:  # item end: wait<0>, release the last stage
                        arrive(empty[c["pending"] % stages], 2)
                        c["pending"] = None
    return True


@pytest.mark.parametrize("stages, ktiles, items", [(4, 1, 5), (4, 3, 4), (4, 9, 3), (3, 2, 7), (5, 4, 2)])
@pytest.mark.parametrize("seed", range(4))
def test_ring_protocol(stages, ktiles, items, seed):
    assert _replay_ring(stages, ktiles, items, seed)


def _replay_cluster_ring(stages, ktiles, items, seed):
    """The 2-CTA cluster protocol (gemm_tma_c) replayed: per CTA a producer and two consumer warpgroups;
    a producer waits its own empty barrier (4 arrivals: both CTAs' consumers), arrives (expect-tx) on its
    own full barrier and writes its half of the stage into both CTAs, each half completing bytes on that
    CTA's full barrier; a full barrier's phase completes on its producer's arrival plus both halves. Checks:
    a half never lands on a full barrier still in an earlier phase (the tx accounting stays per phase), no
    stage is overwritten while a consumer of that CTA may still read it, every consumer reads both halves
    of K tile `it` from the fill `it`, and nothing deadlocks."""
    import random

    rnd = random.Random(seed)
    total = ktiles * items
    full = [[dict(phase=0, arrived=False, halves=set()) for _ in range(stages)] for _ in range(2)]
    empty = [[dict(phase=0, arr=0) for _ in range(stages)] for _ in range(2)]
    content = [[[None, None] for _ in range(stages)] for _ in range(2)]
    reading = [[set() for _ in range(stages)] for _ in range(2)]  # consumers between read and release

    def done(phase, parity):
        return (phase & 1) != parity

    def full_check(c, s):
        f = full[c][s]
        if f["arrived"] and f["halves"] == {0, 1}:
            f["phase"] += 1
            f["arrived"], f["halves"] = False, set()

    prod = [0, 0]
    cons = [[dict(it=0, pending=None) for _ in range(2)] for _ in range(2)]
    steps = 0
    while min(prod) < total or any(w["it"] < total for c in cons for w in c):
        steps += 1
        assert steps < 200000, "deadlock"
        c = rnd.randrange(2)
        who = rnd.randrange(3)
        if who == 0 and prod[c] < total:
            it = prod[c]
            s, n = it % stages, it // stages
            if done(empty[c][s]["phase"], (n & 1) ^ 1):
                full[c][s]["arrived"] = True
                full_check(c, s)
                for dst in (0, 1):
                    assert full[dst][s]["phase"] == n, f"half {c} of fill {it} met phase {full[dst][s]['phase']}"
                    assert not reading[dst][s], f"stage {s} of CTA {dst} overwritten while read"
                    content[dst][s][c] = it
                    full[dst][s]["halves"].add(c)
                    full_check(dst, s)
                prod[c] += 1
        elif who > 0:
            w = cons[c][who - 1]
            if w["it"] < total:
                it = w["it"]
                s = it % stages
                if done(full[c][s]["phase"], (it // stages) & 1):
                    assert content[c][s] == [it, it], f"CTA {c} consumer read {content[c][s]} as K tile {it}"
                    reading[c][s].add(who)

                    def release(j):
                        reading[c][j % stages].discard(who)
                        for r in (0, 1):
                            e = empty[r][j % stages]
                            e["arr"] += 1
                            if e["arr"] == 4:
                                e["arr"] = 0
                                e["phase"] += 1
                    if it % ktiles and w["pending"] is not None:
                        release(w["pending"])
                    w["pending"] = it
                    w["it"] += 1
                    if w["it"] % ktiles == 0:
                        release(w["pending"])
                        w["pending"] = None
    return True


@pytest.mark.parametrize("stages, ktiles, items", [(4, 1, 5), (4, 3, 4), (4, 9, 3), (3, 2, 7)])
@pytest.mark.parametrize("seed", range(6))
def test_cluster_ring_protocol(stages, ktiles, items, seed):
    assert _replay_cluster_ring(stages, ktiles, items, seed)


# ----------------------------------------------------------------------------- compilation

def test_tma_units_compile_without_spills():
    """Every gemm_tma instantiation compiles for sm_90a: no spills, one block of 384 threads fits the
    register file at the launch bound (168), and where cuobjdump exists its SASS has the TMA loads
    (UTMALDG), the wgmmas (HGMMA 64x256x16) and the register hand-over (USETMAXREG)."""
    from pydnn._build import cache
    from pydnn._build.manifest import COMMON_OPTIONS
    from pydnn._cuda import nvrtc

    for u in M.tma_units() + [u for t in M.TMA_CANDIDATES for u in M.tma_units((t,), t.unit, ("bf16",))]:
        text, _ = cache.unit_inputs(u)
        cubin, _, log = nvrtc.compile_cubin(text, u.source, u.exprs, "sm_90a", COMMON_OPTIONS + ("--ptxas-options=-v",),
                                            [str(cache.ptx_dir())])
        log = log if isinstance(log, str) else log.decode()
        assert log.count("Compiling entry function") == 4, log
        assert log.count("0 bytes spill stores, 0 bytes spill loads") == 4, log
        regs = [int(x.split()[0]) for x in log.split("Used ")[1:]]
        assert len(regs) == 4 and max(regs) <= 168, regs
        from sass import sass_of

        sass = sass_of(cubin)
        if sass is not None:
            assert sass.count("UTMALDG.3D") >= 4 * 2 and "HGMMA.64x256x16.F32" in sass and "USETMAXREG" in sass
            if "tmac" in u.name:
                assert "UTMALDG.3D.MULTICAST" in sass and "UCGABAR_WAIT" in sass


FUSED_SRC = r'''
#include "matmul.cu"
namespace pydnn {
namespace matmul {
// An active epilogue of the protocol pydnn/graph/codegen.py generates (NoEpi's comment in ptx/matmul.cu):
// gelu(acc + bias[col]) (erf form), the bias read as aligned pairs on the FAST path.
struct BiasGelu {
  static constexpr bool kActive = true, kRed = false, kStoreC = true;
  const bf16_t* bias;
  struct Row { const bf16_t* b; };
  __device__ __forceinline__ Row row(long long, int) const { return Row{bias}; }
  __device__ __forceinline__ bool pairs_ok() const { return true; }
  template <bool FAST>
  __device__ __forceinline__ void pair(const Row& r, float& a0, float& a1, int col, bool two) const {
    float b0, b1 = 0.f;
    if (FAST) {
      const Vec<bf16_t, 2> v = *reinterpret_cast<const Vec<bf16_t, 2>*>(r.b + col);
      b0 = load<float>(v.v[0]);
      b1 = load<float>(v.v[1]);
    } else {
      b0 = load<float>(r.b[col]);
      if (two) b1 = load<float>(r.b[col + 1]);
    }
    a0 += b0;
    a1 += b1;
    a0 = 0.5f * a0 * (1.f + erff(a0 * 0.70710678f));
    a1 = 0.5f * a1 * (1.f + erff(a1 * 0.70710678f));
  }
  __device__ __forceinline__ float red_init() const { return 0.f; }
  __device__ __forceinline__ float red_map(float v) const { return v; }
  __device__ __forceinline__ float red_comb(float a, float) const { return a; }
  __device__ __forceinline__ void red_done(long long, int, float) const {}
  __device__ __forceinline__ float* red_ws() const { return nullptr; }
  __device__ __forceinline__ unsigned* red_cnt() const { return nullptr; }
};
template <bool TB, int CM>
__global__ void __launch_bounds__(384, 1) fused_tma(const __grid_constant__ MatmulTmaParams q, const bf16_t* bias) {
  gemm_tma_body<bf16_t, 256, 4, false, TB, CM>(q, BiasGelu{bias});
}
}  // namespace matmul
}  // namespace pydnn
'''


def test_tma_body_takes_an_active_epilogue():
    """gemm_tma_body with an active (non-reduction) epilogue of the graph API's protocol compiles for sm_90a
    without spills: the graph's fused GEMMs can move onto it (pydnn/graph builds its kernels from the body;
    today they stay on gemm_wgmma_body: the planner does not hand them gemm_tma)."""
    from pydnn._build import cache
    from pydnn._build.manifest import COMMON_OPTIONS
    from pydnn._cuda import nvrtc

    exprs = ("pydnn::matmul::fused_tma<true, 1>", "pydnn::matmul::fused_tma<false, 1>")
    _, _, log = nvrtc.compile_cubin(FUSED_SRC, "fused_tma.cu", exprs, "sm_90a",
                                    COMMON_OPTIONS + ("--ptxas-options=-v",), [str(cache.ptx_dir())])
    log = log if isinstance(log, str) else log.decode()
    assert log.count("Compiling entry function") == 2, log
    assert log.count("0 bytes spill stores, 0 bytes spill loads") == 2, log


def test_wide_store_transpose_emulated():
    """gemm_tma's WIDE store (wg_epilogue) replayed for a warp: the quad transposes (rot4, the 4 shuffles) give
    lane t of a quad group 4jj + t's 8 columns in order; every (row, column) of the warp's 16 x BN block is
    stored once with its accumulator value."""
    import numpy as np

    BN = 256
    rng = np.random.default_rng(1)
    D = rng.standard_normal((16, BN))
    acc = np.zeros((32, BN // 2))  # the m64nNk16 fragment, warp 0: d[4j + 2h + e] = D[l/4 + 8h][8j + 2(l%4) + e]
    for l in range(32):
        for j in range(BN // 8):
            for h in range(2):
                for e in range(2):
                    acc[l, 4 * j + 2 * h + e] = D[l // 4 + 8 * h, 8 * j + 2 * (l % 4) + e]

    def rot4(x, k):
        a = [x[(i + 1) & 3] if k & 1 else x[i] for i in range(4)]
        return [a[(i + 2) & 3] if k & 2 else a[i] for i in range(4)]

    out = np.full((16, BN), np.nan)
    for h in range(2):
        for jj in range(BN // 32):
            zr = {}
            for l in range(32):
                t = l & 3
                x = [(acc[l, 4 * (4 * jj + s) + 2 * h], acc[l, 4 * (4 * jj + s) + 2 * h + 1]) for s in range(4)]
                zr[l] = rot4([x[0], x[3], x[2], x[1]], (4 - t) & 3)
            for l in range(32):
                t, qb = l & 3, l & ~3
                y = rot4([zr[qb | ((t + d) & 3)][d] for d in range(4)], (4 - t) & 3)
                row, col = l // 4 + 8 * h, 8 * (4 * jj + t)
                vals = [v for pair in y for v in pair]
                assert np.isnan(out[row, col:col + 8]).all()
                out[row, col:col + 8] = vals
    np.testing.assert_array_equal(out, D)
