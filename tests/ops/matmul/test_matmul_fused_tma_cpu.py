"""The graph API's fused GEMMs on gemm_tma, on the CPU: the kernel choice (gemm_tma where the plain planner runs
it, the wgmma tile where the driver cannot encode a map or the plan has no gemm_tma), the execute path (the maps
of the call's A and B copied into the __grid_constant__ params, encoded once per base address; the WIDE flag
where C's rows are 16-byte aligned; one launch), the generated source, and NVRTC / ptxas for sm_90a: the fused
bias + GELU, bias + residual and bias + row MAX kernels compile without spills, the GELU one reads the bias
once per column pair for both rows and stores 16 bytes a lane, and the row MAX's barriers after the start
are named ones over the 256 consumer threads (bar.sync 1, 256: the producer warpgroup never joins them)."""
import ctypes
import os
import re
import sys
from collections import Counter

import pytest

import pydnn as P
from pydnn import tuning
from pydnn._build import cache
from pydnn._build.manifest import COMMON_OPTIONS
from pydnn._cuda import nvrtc
from pydnn._cuda import tensormap as TM
from pydnn.graph import Graph
from pydnn.graph import codegen as cg
from pydnn.graph import engines as EN
from pydnn.ops import matmul as M

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "tools"))
import bench_host as B  # noqa: E402
from sass import sass_of  # noqa: E402

BF16, F32 = P.PYDNN_DATA_BFLOAT16, P.PYDNN_DATA_FLOAT


def _fake_bytes(address):
    return (address.to_bytes(8, "little") + b"\x05") * 14 + bytes(2)


@pytest.fixture
def sm90(tmp_path, monkeypatch):
    """A CPU handle of an sm_90 device (132 SMs), launches counted and never made, kernels not compiled, maps
    encoded by a fake that records the addresses."""
    monkeypatch.setenv("PYDNN_CACHE_DIR", str(tmp_path))
    for k, v in (("USE_WGMMA", True), ("WG_PERSIST", True), ("USE_TMA", True)):
        monkeypatch.setattr(tuning.matmul, k, v)
    enc = []

    def fake_encode(self, address):
        enc.append(address)
        return _fake_bytes(address)
    monkeypatch.setattr(TM.TiledMap, "encode", fake_encode)
    units = []
    monkeypatch.setattr(EN, "_compile", lambda handle, unit: units.append(unit))

    class Counters:  # the row reduction's zeroed counters (device memory on a GPU)
        ptr = 0x7000000
    monkeypatch.setattr(EN, "_zeroed_u32", lambda handle, n: Counters())
    with B.no_launch() as drv:
        yield B.cpu_handle("sm_90", 132), B.CpuBuffers(), drv, enc, units


def _graph(h, kind, m, n, k, tb=False, batch=1):
    g = Graph(io_data_type=BF16, intermediate_data_type=F32, compute_data_type=F32, handle=h)
    x = g.tensor(name="x", dim=[batch, m, k])
    w = g.tensor(name="w", dim=[1, k, n], stride=[k * n, 1, k] if tb else [k * n, n, 1])
    v = g.add(g.matmul(x, w), g.tensor(name="b", dim=[1, 1, n]))
    if kind == "gelu":
        v = g.gelu(v)
    elif kind == "residual":
        v = g.add(v, g.tensor(name="r", dim=[batch, m, n]))
    else:
        v = g.reduction(v, P.PYDNN_REDUCE_TENSOR_MAX, dim=[batch, m, 1])
    v.set_output(True).set_name("y")
    g.build_operation_graph().create_execution_plans().check_support().build_plans()
    assert g.engine_index() == 1 and g.launches() == 1
    return g, g._plan_obj.built.steps[0]


def _staged_bytes():
    """A consumer warp's staged bias (256 bf16 columns): 512 bytes, 1 KiB widened to float (EPI_WIDEN)."""
    return 1024 if tuning.matmul.EPI_WIDEN else 512


def _stsm(kind, sb):
    """The shared memory tuning.matmul.EPI_STSM (on) adds to a fused gemm_tma launch of `kind` (a stored C: not the
    row MAX graph) with sb staged bytes."""
    return cg.stsm_smem(sb) if tuning.matmul.EPI_STSM and kind != "rowmax" else 0


def _buffers(buf, kind, m, n, k, batch=1):
    names = {"x": batch * m * k * 2, "w": k * n * 2, "b": n * 2, "y": batch * m * (1 if kind == "rowmax" else n) * 2}
    if kind == "residual":
        names["r"] = batch * m * n * 2
    return {nm: buf(nb)[0] for nm, nb in names.items()}


@pytest.mark.parametrize("kind", ["gelu", "residual", "rowmax"])
def test_fused_graph_runs_on_gemm_tma(sm90, kind):
    """Where the plain planner runs gemm_tma (2048^2 x 512 bf16 on 132 SMs: 128 tiles of 128x256), the fused
    graph's fast kernel is gemm_tma_body with the generated epilogue (one unit: it and the general path);
    execute copies the call's maps into the params (each base address encoded once), sets PAIR | C16 for a C
    whose rows are 16-byte aligned, and launches once; the row MAX's workspace holds a partial per tile
    column (one warp column on gemm_tma) and row."""
    h, buf, drv, enc, units = sm90
    m, n, k = 2048, 2048, 512
    assert M.gemm_plan(h, BF16, m, n, k).tma is not None
    g, step = _graph(h, kind, m, n, k)
    rec, expr, (arr, _, q, e) = step.recs[0]
    assert rec.maps is not None and isinstance(q, M.MatmulTmaParams) and expr.endswith("_f")
    # (FUSED_STAGE, on: the bias + GELU epilogue's bias staged, 8 warp buffers of 512 bytes more; 1 KiB widened)
    sb = _staged_bytes() if kind == "gelu" and tuning.matmul.FUSED_STAGE else 0
    smem = M.TMA_TILE.smem + cg.stage_smem(sb) + _stsm(kind, sb)
    assert rec.grid == (128, 1, 1) and rec.block == (384, 1, 1) and rec.smem == smem
    assert len(units) == 1 and set(units[0].exprs) == {expr, step.recs[1][1]} and units[0].archs == ("sm_90a",)
    text, _ = cache.unit_inputs(units[0])
    assert "gemm_tma_body<pydnn::bf16_t, 256, 4, false, false, 1, true>" in text
    assert "const __grid_constant__ MatmulTmaParams q" in text and "{e, q.p}" in text
    if kind == "rowmax":
        # a float a row per column part: the general path's 64x64 tile has the most (32 tiles x 2 warp
        # columns; gemm_tma's 8 x 1)
        assert g.get_workspace_size() == 64 * m * 4
        assert step.counters is not None
    bufs = _buffers(buf, kind, m, n, k)
    ws = buf(max(g.get_workspace_size(), 1))[0]
    before = drv.launches
    for _ in range(2):
        g.execute(bufs, ws)
    assert drv.launches == before + 2
    assert enc[-2:] == [bufs["x"], bufs["w"]] and len(enc) == 2 + 2  # the probe's two, then x's and w's, once
    assert bytes(q.map_a) == _fake_bytes(bufs["x"]) and bytes(q.map_b) == _fake_bytes(bufs["w"])
    p = q.p
    assert (p.a, p.b, p.m, p.n, p.k, p.tiles_m, p.tiles_n) == (bufs["x"], bufs["w"], m, n, k, 16, 8)
    assert (p.bias or 0, p.alpha, p.beta) == (0, 1.0, 0.0)
    if kind == "rowmax":
        assert (p.c or 0) == 0 and step.e.ptr[step.red_slot] == ws
    else:
        assert p.c == bufs["y"] and p.flags == M.FLAG_PAIR | M.FLAG_C16
    # the argument array: the params struct (maps first), then the epilogue's
    assert arr[0] == ctypes.addressof(q) and arr[1] == ctypes.addressof(e)


def test_fused_graph_pair_stores_and_the_general_path(sm90):
    """B transposed with n = 2050: C's rows are 4-byte but not 16-byte aligned, so the fused gemm_tma kernel
    runs without C16 (the pair stores); an x 8 bytes off 16 takes the general (mma.sync) kernel, no map."""
    h, buf, drv, enc, units = sm90
    m, n, k = 2048, 2050, 512
    g, step = _graph(h, "gelu", m, n, k, tb=True)
    rec, _, (_, _, q, _) = step.recs[0]
    assert rec.maps is not None
    text, _ = cache.unit_inputs(units[0])
    assert "gemm_tma_body<pydnn::bf16_t, 256, 4, false, true, 1, true>" in text
    bufs = _buffers(buf, "gelu", m, n, k)
    g.execute(bufs, 0)
    assert q.p.flags == M.FLAG_PAIR and q.p.c == bufs["y"]
    n_enc = len(enc)
    bufs["x"] += 8
    before = drv.launches
    g.execute(bufs, 0)
    assert drv.launches == before + 1 and len(enc) == n_enc
    gp = step.recs[1][2][2]
    assert gp.a == bufs["x"] and "_g" in step.recs[1][1]


def test_fused_graph_stays_on_wgmma(sm90, monkeypatch):
    """No gemm_tma for the fused kernel where the plain plan has none (a problem too small for the 128x256
    tile; USE_TMA off) or the driver cannot encode a map (the probe fails: a CPU stand-in, old bindings): the
    wgmma tile's body, as before."""
    h, buf, drv, enc, units = sm90
    _, step = _graph(h, "gelu", 1024, 1024, 512)  # 32 tiles of 128x256: not the wgmma 128x256 tile
    assert step.recs[0][0].maps is None and "gemm_tma_body" not in cache.unit_inputs(units[-1])[0]
    monkeypatch.setattr(tuning.matmul, "USE_TMA", False)
    _, step = _graph(h, "gelu", 2048, 2048, 512)
    assert step.recs[0][0].maps is None and "gemm_wgmma_body" in cache.unit_inputs(units[-1])[0]
    monkeypatch.setattr(tuning.matmul, "USE_TMA", True)

    def refuse(self, address):
        raise P.PydnnError(P.PYDNN_STATUS_NOT_SUPPORTED, "cuTensorMapEncodeTiled unavailable")
    monkeypatch.setattr(TM.TiledMap, "encode", refuse)
    g, step = _graph(h, "residual", 2048, 2048, 512)
    assert step.recs[0][0].maps is None and "gemm_wgmma_body" in cache.unit_inputs(units[-1])[0]
    before = drv.launches
    g.execute(_buffers(buf, "residual", 2048, 2048, 512), 0)
    assert drv.launches == before + 1


# ----------------------------------------------------------------------------- NVRTC / ptxas (sm_90a)

def _programs():
    add = P.PYDNN_POINTWISE_ADD
    gelu = cg.PwProgram([("bf16", "in")], [cg.PwNode(add, x=("acc", 0), b=("op", 0)),
                                           cg.PwNode(P.PYDNN_POINTWISE_GELU_FWD, x=("v", 0))], [])
    res = cg.PwProgram([("bf16", "in"), ("bf16", "in")], [cg.PwNode(add, x=("acc", 0), b=("op", 0)),
                                                          cg.PwNode(add, x=("v", 0), b=("op", 1))], [])
    rmax = cg.PwProgram([("bf16", "in"), ("bf16", "out")], [cg.PwNode(add, x=("acc", 0), b=("op", 0))], [])
    return {"gelu": (gelu, ("v", 1), ["C"], None), "residual": (res, ("v", 1), ["C", "c"], None),
            "rowmax": (rmax, ("v", 0), ["C", "g"], dict(mode="MAX", y=1))}


def _fast_sass(cubin, fe_lowered):
    sass = sass_of(cubin)
    if sass is None:
        return None
    part = [s for s in sass.split("Function : ")[1:] if s.split("\n", 1)[0].strip() == fe_lowered]
    assert len(part) == 1
    return [ln for ln in part[0].split("\n") if re.match(r"\s+/\*[0-9a-f]+\*/", ln)]


def _fast_kernel_ops(name, text):
    """NVRTC + ptxas (sm_90a) of a generated fused GEMM: (ptxas log, the fast kernel's SASS lines and opcodes, both
    None where cuobjdump is missing), its fast kernel checked for no spill and <= 168 registers at entry."""
    fe = f"pydnn::graph::{name}_f"
    cubin, lowered, log = nvrtc.compile_cubin(text, f"graph/{name}.cu", (fe,), "sm_90a",
                                              COMMON_OPTIONS + ("--ptxas-options=-v",), [str(cache.ptx_dir())])
    log = log if isinstance(log, str) else log.decode()
    props = {f: (int(a), int(b)) for f, a, b in re.findall(
        r"Function properties for (\S+)[^\n]*\n[^\n]*?(\d+) bytes stack frame, (\d+) bytes spill stores", log)}
    assert props.get(lowered[fe]) == (0, 0), log
    regs = dict(re.findall(r"Compiling entry function '(\S+)'[\s\S]*?Used (\d+) registers", log))
    assert int(regs[lowered[fe]]) <= 168, log
    lines = _fast_sass(cubin, lowered[fe])
    if lines is None:
        return log, None, None
    return log, lines, [re.findall(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Za-z0-9_.]+)", ln)[0]
                        for ln in lines]


@pytest.mark.parametrize("kind", ["gelu", "residual", "rowmax"])
def test_fused_tma_kernels_compile_without_spills(kind):
    """ptxas (sm_90a) on the fused gemm_tma kernel: no spills, 168 registers at the 384-thread entry (the
    consumers' setmaxnreg raises theirs); SASS where cuobjdump exists: the TMA loads, 4 HGMMA a K tile, the
    WIDE stores (STG.E.128) in the epilogue; GELU: the fast tile's epilogue (between the last mbarrier wait and
    the last wide store) reads the bias with 32 pair loads (one per column pair, both rows); row MAX: one
    block-wide barrier (the start) and the rest named barrier 1 over 256 threads."""
    prog, final, access, red = _programs()[kind]
    name, text = cg.matmul_source(prog, final, "bf16", M.TMA_TILE, M.TC_GENERAL, False, False, access=access, red=red)
    _, lines, ops = _fast_kernel_ops(name, text)
    if lines is None:
        return
    c = Counter(ops)
    assert c["HGMMA.64x256x16.F32.BF16"] == 4 and c["UTMALDG.3D"] >= 2 and "USETMAXREG.DEALLOC.CTAPOOL" in c
    assert c["STG.E.128"] == 16 or (kind == "rowmax" and c["STG.E.128"] >= 16)
    assert not any(o.startswith(("LDL", "STL")) for o in ops)
    if kind == "gelu":
        wide = [i for i, o in enumerate(ops) if o == "STG.E.128"]
        waits = [i for i, o in enumerate(ops) if o.startswith("SYNCS") and i < wide[0]]
        region = ops[waits[-1]:wide[-1] + 1]
        assert Counter(o for o in region if o.startswith("LDG")) == {"LDG.E.CONSTANT": 32}, Counter(region)
    if kind == "rowmax":
        bars = [ln.split("BAR.SYNC.DEFER_BLOCKING", 1)[1].split(";")[0].strip() for ln in lines
                if "BAR.SYNC" in ln]
        assert bars.count("0x0") == 1 and bars.count("0x1, 0x100") == 3 and len(bars) == 4, bars


# ----------------------------------------------------------------------------- the ping-pong candidate

def _replay_pp_ring(stages, ktiles, items, seed, ordered=True):
    """gemm_tma_body's PP protocol replayed with mbarrier semantics (as test_matmul_tma_cpu's _replay_ring): one
    producer filling the ring with the block's items' K tiles in order, consumer warpgroup w taking local items
    w, w + 2, ... (ring positions i * ktiles ..), each stage's empty barrier counting one arrival (the reader's),
    the three advancing in a seeded random interleaving. Every fill is read exactly once, by its item's
    warpgroup, as the K tile it expects; no stage is refilled before its reader released it; no deadlock.
    The K loops take turns (the kernel's named barriers 2 and 3): item i's first wait only after the other
    warpgroup's K loop of item i - 1 passed its last full barrier. Without that turn a warpgroup whose first K
    tile sits at ring position >= stages waits on a fresh barrier for parity 1 and passes before the fill
    (ordered=False shows it)."""
    import random

    rnd = random.Random(seed)
    total = ktiles * items
    full = [dict(phase=0, arr=0) for _ in range(stages)]
    empty = [dict(phase=0, arr=0) for _ in range(stages)]
    content, readers = [None] * stages, [0] * stages

    def done(bar, parity):
        return (bar["phase"] & 1) != parity

    def arrive(bar):
        bar["arr"] += 1
        if bar["arr"] == 1:
            bar["arr"] = 0
            bar["phase"] += 1

    prod = dict(it=0)
    # per warpgroup: its items' ring positions in order
    todo = [[i * ktiles + kt for i in range(w, items, 2) for kt in range(ktiles)] for w in range(2)]
    cons = [dict(pos=0, pending=None) for _ in range(2)]
    reads, kloop_done = [], set()
    steps = 0
    while prod["it"] < total or any(c["pos"] < len(t) or c["pending"] is not None for c, t in zip(cons, todo)):
        steps += 1
        assert steps < 200000, "deadlock"
        who = rnd.randrange(3)
        if who == 0 and prod["it"] < total:
            it = prod["it"]
            s = it % stages
            if done(empty[s], ((it // stages) & 1) ^ 1):
                assert readers[s] == (1 if content[s] is not None else 0), "refilled before released"
                content[s], readers[s] = it, 0
                arrive(full[s])
                prod["it"] += 1
        elif who > 0:
            w, c = who - 1, cons[who - 1]
            if c["pos"] < len(todo[w]):
                it = todo[w][c["pos"]]
                s = it % stages
                item = it // ktiles
                if ordered and it % ktiles == 0 and item > 0 and item - 1 not in kloop_done:
                    continue  # bar.sync 2 + w: the other warpgroup's K loop of item - 1 is not through
                if done(full[s], (it // stages) & 1):
                    assert content[s] == it, f"warpgroup {w} read fill {content[s]} as K tile {it}"
                    assert (it // ktiles) % 2 == w
                    readers[s] += 1
                    reads.append(it)
                    if it % ktiles and c["pending"] is not None:
                        arrive(empty[c["pending"] % stages])
                    c["pending"] = it
                    c["pos"] += 1
                    if (it + 1) % ktiles == 0:  # item end: bar.arrive for the other's next item; wait<0>, release
                        kloop_done.add(item)
                        arrive(empty[c["pending"] % stages])
                        c["pending"] = None
            elif c["pending"] is not None:
                raise AssertionError("a pending stage at the end")
    assert sorted(reads) == list(range(total))
    return True


@pytest.mark.parametrize("stages, ktiles, items", [(7, 1, 5), (7, 3, 4), (7, 9, 3), (3, 2, 7), (7, 64, 3), (4, 5, 1)])
@pytest.mark.parametrize("seed", range(4))
def test_pp_ring_protocol(stages, ktiles, items, seed):
    assert _replay_pp_ring(stages, ktiles, items, seed)


def test_pp_ring_without_turns_reads_early():
    with pytest.raises(AssertionError, match="read fill None"):
        for seed in range(20):
            _replay_pp_ring(7, 9, 3, seed, ordered=False)


def test_pp_candidate_tile_and_fused_choice(sm90, monkeypatch):
    """TMA_PP_TILE: 128 x 128, 7 stages (224 KiB of ring: fits the 227 KiB a block may have), gemm_tma<..., wide,
    pp>; a fused graph built while plans take it (bench_matmul.py --fused --pp patches _tma_tile) runs on
    gemm_tma_body<..., 1, true, true>, except a row reduction, which stays on TMA_TILE."""
    h, buf, drv, enc, units = sm90
    t = M.TMA_PP_TILE
    assert t.smem <= 227 * 1024 and (t.bn, t.stages, t.pp, t.cm) == (128, 7, True, 1)
    assert t.expr("bf16", False, True) == "pydnn::matmul::gemm_tma<pydnn::bf16_t, 128, 7, false, true, true, true>"
    assert M.pp_units().exprs == tuple(t.expr("bf16", a, b) for a in (False, True) for b in (False, True))
    monkeypatch.setattr(M, "_tma_tile", lambda: t)
    plan = M.gemm_plan(h, BF16, 2048, 2048, 512)
    assert plan.tma.expr == t.expr("bf16", False, False) and plan.tma.params.p.tiles_n == 16
    _, step = _graph(h, "gelu", 2048, 2048, 512)
    assert "gemm_tma_body<pydnn::bf16_t, 128, 7, false, false, 1, true, true>" in cache.unit_inputs(units[-1])[0]
    assert step.recs[0][0].params.p.tiles_n == 16 and step.recs[0][0].smem == t.smem
    _, step = _graph(h, "rowmax", 2048, 2048, 512)
    assert "gemm_tma_body<pydnn::bf16_t, 256, 4, false, false, 1, true>" in cache.unit_inputs(units[-1])[0]


def test_fused_pp_switch(sm90, monkeypatch):
    """tuning.matmul.FUSED_PP: a fused GEMM where the plan runs gemm_tma takes the ping-pong tile (its own
    128x128 tiles: tiles_n 16 on n = 2048), the row reduction still TMA_TILE; off (the default): TMA_TILE."""
    h, buf, drv, enc, units = sm90
    assert tuning.matmul.FUSED_PP is False
    monkeypatch.setattr(tuning.matmul, "FUSED_PP", True)
    _, step = _graph(h, "residual", 2048, 2048, 512)
    rec = step.recs[0][0]
    assert rec.expr == M.TMA_PP_TILE.expr("bf16", False, False) and rec.params.p.tiles_n == 16
    assert "gemm_tma_body<pydnn::bf16_t, 128, 7, false, false, 1, true, true>" in cache.unit_inputs(units[-1])[0]
    _, step = _graph(h, "rowmax", 2048, 2048, 512)
    assert step.recs[0][0].expr == M.TMA_TILE.expr("bf16", False, False)


@pytest.mark.parametrize("tb", [False, True])
def test_pp_fused_kernel_compiles_without_spills(tb):
    """ptxas (sm_90a) on the fused bias + GELU kernel on the ping-pong candidate: no spills; SASS where cuobjdump
    exists: 8 HGMMA.64x128x16 a K tile (two m64 halves x 4 k16), the turn barriers (one BAR.SYNC on a register
    id, one BAR.ARV) besides the start's BAR.SYNC 0x0, and the WIDE stores."""
    prog, final, access, red = _programs()["gelu"]
    name, text = cg.matmul_source(prog, final, "bf16", M.TMA_PP_TILE, M.TC_GENERAL, False, tb, access=access)
    assert f"gemm_tma_body<pydnn::bf16_t, 128, 7, false, {'true' if tb else 'false'}, 1, true, true>" in text
    fe = f"pydnn::graph::{name}_f"
    cubin, lowered, log = nvrtc.compile_cubin(text, f"graph/{name}.cu", (fe,), "sm_90a",
                                              COMMON_OPTIONS + ("--ptxas-options=-v",), [str(cache.ptx_dir())])
    log = log if isinstance(log, str) else log.decode()
    props = {f: (int(a), int(b)) for f, a, b in re.findall(
        r"Function properties for (\S+)[^\n]*\n[^\n]*?(\d+) bytes stack frame, (\d+) bytes spill stores", log)}
    assert props.get(lowered[fe]) == (0, 0), log
    lines = _fast_sass(cubin, lowered[fe])
    if lines is None:
        return
    ops = [re.findall(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Za-z0-9_.]+)", ln)[0] for ln in lines]
    c = Counter(ops)
    assert c["HGMMA.64x128x16.F32.BF16"] == 8 and c["BAR.ARV"] == 1 and c["STG.E.128"] >= 16
    assert not any(o.startswith(("LDL", "STL")) for o in ops)
    bars = [ln.split("BAR.SYNC.DEFER_BLOCKING", 1)[1].split(";")[0].strip() for ln in lines if "BAR.SYNC" in ln]
    assert bars.count("0x0") == 1 and len(bars) == 2 and bars[1].endswith("0x100"), bars


# ----------------------------------------------------------------------------- staged column operands

def test_stage_plan():
    """The staged operands: inputs read along the columns only ("C": a bias), 2- or 4-byte elements, at most
    STAGE_MAX_BYTES a warp's buffer; nothing staged where a row-moving input ("c") or an output is."""
    add = P.PYDNN_POINTWISE_ADD

    def prog(tags):
        nodes = [cg.PwNode(add, x=("acc", 0), b=("op", 0))]
        nodes += [cg.PwNode(add, x=("v", i - 1), b=("op", i)) for i in range(1, len(tags))]
        return cg.PwProgram([(t, "in") for t in tags], nodes, [])
    assert cg.stage_plan(prog(["bf16"]), ["C"], 256) == ([(0, 0, 2)], 512)
    assert cg.stage_plan(prog(["f32"]), ["C"], 256) == ([(0, 0, 4)], 1024)
    assert cg.stage_plan(prog(["bf16", "bf16"]), ["C", "c"], 256) == ([], 0)  # a residual beside: none
    assert cg.stage_plan(prog(["bf16", "f16"]), ["C", "C"], 256) == ([(0, 0, 2), (1, 512, 2)], 1024)
    assert cg.stage_plan(prog(["bf16", "f32"]), ["C", "C"], 256) == ([], 0)  # 1536 bytes: over the limit
    assert cg.stage_plan(prog(["bf16"]), ["c"], 256) == ([], 0)
    assert cg.stage_plan(prog(["bf16"]), ["B"], 256) == ([], 0)
    assert cg.stage_smem(512) == 8 * 512 + 128 and cg.stage_smem(0) == 0
    assert M.TMA_TILE.smem + cg.stage_smem(cg.STAGE_MAX_BYTES) <= 227 * 1024
    # widen (tuning.matmul.EPI_WIDEN): 16-bit operands take 4 bytes an element; where that passes the limit, none
    assert cg.stage_plan(prog(["bf16"]), ["C"], 256, True) == ([(0, 0, 4)], 1024)
    assert cg.stage_plan(prog(["f32"]), ["C"], 256, True) == ([(0, 0, 4)], 1024)
    assert cg.stage_plan(prog(["bf16", "f16"]), ["C", "C"], 256, True) == ([], 0)
    with pytest.raises(ValueError, match="staged"):
        cg.matmul_source(prog(["bf16"]), ("v", 0), "bf16", M.TMA_PP_TILE, M.TC_GENERAL, False, False, access=["C"],
                         stage_bn=128)


@pytest.mark.parametrize("kind", ["gelu", "residual", "rowmax"])
def test_fused_stage_switch(sm90, monkeypatch, kind):
    """tuning.matmul.FUSED_STAGE on (the default since session 31): the fused gemm_tma kernel stages the bias
    (kStage 512: 256 bf16 columns) and its launch asks for 8 buffers of it more shared memory; neither the row
    reduction nor bias + residual (a row-moving input) stages; off: kStage 0, the tile's shared memory."""
    h, buf, drv, enc, units = sm90
    assert tuning.matmul.FUSED_STAGE is True
    monkeypatch.setattr(tuning.matmul, "FUSED_STAGE", False)
    _, step = _graph(h, kind, 2048, 2048, 512)
    assert "kStage = 0;" in cache.unit_inputs(units[-1])[0]
    assert step.recs[0][0].smem == M.TMA_TILE.smem + _stsm(kind, 0)
    monkeypatch.setattr(tuning.matmul, "FUSED_STAGE", True)
    g, step = _graph(h, kind, 2048, 2048, 512)
    text = cache.unit_inputs(units[-1])[0]
    staged = kind == "gelu"
    sb = _staged_bytes() if staged else 0
    assert (f"kStage = {sb};" in text) and ("kStage = 0;" in text) != staged
    assert step.recs[0][0].smem == M.TMA_TILE.smem + cg.stage_smem(sb) + _stsm(kind, sb)
    before = drv.launches
    g.execute(_buffers(buf, kind, 2048, 2048, 512), buf(max(g.get_workspace_size(), 1))[0])
    assert drv.launches == before + 1


@pytest.mark.parametrize("kind", ["gelu", "relu"])
def test_staged_kernel_compiles_without_spills(kind):
    """ptxas (sm_90a) on the fused gemm_tma kernel with the bias staged: no spills, 168 registers at entry;
    SASS where cuobjdump exists: one 16-byte LDGSTS a lane before the K loop (the stage), the 4 HGMMA a K tile,
    and the staged fast tile's epilogue (from the cp.async wait to its 16th wide store) reading the bias with
    32 LDS (one per column pair, both rows) and no global load."""
    prog, final, access, _ = _programs()["gelu"]
    if kind == "relu":
        prog = cg.PwProgram(prog.operands, [prog.nodes[0], cg.PwNode(P.PYDNN_POINTWISE_RELU_FWD, x=("v", 0))], [])
    name, text = cg.matmul_source(prog, final, "bf16", M.TMA_TILE, M.TC_GENERAL, False, False, access=access,
                                  stage_bn=256)
    assert "kStage = 512;" in text and "cp_async16" in text
    _, lines, ops = _fast_kernel_ops(name, text)
    if lines is None:
        return
    c = Counter(ops)
    assert c["LDGSTS.E.BYPASS.128"] == 1 and c["HGMMA.64x256x16.F32.BF16"] == 4
    assert not any(o.startswith(("LDL", "STL")) for o in ops)
    d = ops.index("DEPBAR.LE")  # cp.async.wait_all
    end = [i for i, o in enumerate(ops) if o == "STG.E.128" and i > d][15]
    region = Counter(ops[d:end + 1])
    assert region["LDS"] == 32, region
    assert not any(o.startswith("LDG") for o in region), region


# ----------------------------------------------------------------------------- the ping-pong cluster candidate

def _replay_ppc_ring(stages, ktiles, items, seed, peer=True):
    """gemm_tma_body's PP protocol in 2-CTA clusters (CM = 2) replayed with mbarrier semantics: per CTA a producer
    and two consumer warpgroups; the producer of CTA q, at ring position it, arrives on its own full barrier
    expecting the whole stage (3 parts: its A, both halves of B) and issues its A into its own stage and its half
    of B into both CTAs' (each copy lands later, in a seeded random order, completing one part on the barrier of
    the CTA it lands in); an empty barrier counts 2 arrivals (warpgroup w of each CTA, which read the stage in its
    CTA); the K loops of a CTA take turns (named barriers 2 / 3). Every read finds all 3 parts of its own ring
    position; no copy lands in a stage whose last fill a warpgroup has not released; no deadlock. peer=False: a
    warpgroup releases only its own CTA's stage (empty barriers of 1 arrival), which lets the peer's multicast
    land on a stage still being read."""
    import random

    rnd = random.Random(seed)
    total = ktiles * items
    CM = 2
    full = [[dict(phase=0, arr=0, tx=0) for _ in range(stages)] for _ in range(CM)]
    empty = [[dict(phase=0, arr=0) for _ in range(stages)] for _ in range(CM)]
    parts = [[dict() for _ in range(stages)] for _ in range(CM)]  # part -> ring position whose copy landed
    held = [[None] * stages for _ in range(CM)]  # ring position a warpgroup has read and not yet released

    def done(bar, parity):
        return (bar["phase"] & 1) != parity

    def full_step(bar):
        if bar["arr"] == 1 and bar["tx"] == 0:
            bar["arr"] = 0
            bar["phase"] += 1

    def arrive_empty(q, s):
        bar = empty[q][s]
        bar["arr"] += 1
        if bar["arr"] == (CM if peer else 1):
            bar["arr"] = 0
            bar["phase"] += 1
            held[q][s] = None

    prod = [0] * CM
    flight = []  # copies issued, not landed: (cta, stage, part, ring position)
    todo = [[i * ktiles + kt for i in range(w, items, 2) for kt in range(ktiles)] for w in range(2)]
    cons = [[dict(pos=0, pending=None) for _ in range(2)] for _ in range(CM)]
    kloop_done = [set() for _ in range(CM)]
    reads = [[] for _ in range(CM)]
    steps = 0

    def busy():
        return (any(p < total for p in prod) or flight or
                any(c["pos"] < len(todo[w]) or c["pending"] is not None for q in range(CM) for w, c in enumerate(cons[q])))

    while busy():
        steps += 1
        assert steps < 400000, "deadlock"
        who = rnd.randrange(2 * CM + 1 + CM)
        if who < CM:  # a producer
            q, it = who, prod[who]
            if it < total:
                s = it % stages
                if done(empty[q][s], ((it // stages) & 1) ^ 1):
                    full[q][s]["arr"] += 1
                    full[q][s]["tx"] += 3
                    flight.append((q, s, "A", it))
                    for r in range(CM):
                        flight.append((r, s, f"B{q}", it))
                    prod[q] += 1
                    full_step(full[q][s])
        elif who == CM:  # a copy lands
            if flight:
                r, s, part, it = flight.pop(rnd.randrange(len(flight)))
                assert held[r][s] is None or held[r][s] == it, f"copy of {it} landed on unreleased {held[r][s]}"
                parts[r][s][part] = it
                full[r][s]["tx"] -= 1
                full_step(full[r][s])
        else:  # a consumer warpgroup
            q, w = divmod(who - CM - 1, 2)
            if q >= CM:
                continue
            c = cons[q][w]
            if c["pos"] < len(todo[w]):
                it = todo[w][c["pos"]]
                s = it % stages
                item = it // ktiles
                if it % ktiles == 0 and item > 0 and item - 1 not in kloop_done[q]:
                    continue  # the turn
                if done(full[q][s], (it // stages) & 1):
                    assert parts[q][s] == {"A": it, "B0": it, "B1": it}, f"CTA {q} read {parts[q][s]} as {it}"
                    held[q][s] = it
                    reads[q].append(it)
                    if it % ktiles and c["pending"] is not None:
                        for r in (range(CM) if peer else (q,)):
                            arrive_empty(r, c["pending"] % stages)
                    c["pending"] = it
                    c["pos"] += 1
                    if (it + 1) % ktiles == 0:
                        kloop_done[q].add(item)
                        for r in (range(CM) if peer else (q,)):
                            arrive_empty(r, c["pending"] % stages)
                        c["pending"] = None
    assert all(sorted(rd) == list(range(total)) for rd in reads)
    return True


@pytest.mark.parametrize("stages, ktiles, items", [(7, 1, 5), (7, 3, 4), (7, 9, 3), (3, 2, 7), (7, 64, 3), (4, 5, 1)])
@pytest.mark.parametrize("seed", range(3))
def test_ppc_ring_protocol(stages, ktiles, items, seed):
    assert _replay_ppc_ring(stages, ktiles, items, seed)


def test_ppc_ring_without_peer_releases_overwrites():
    with pytest.raises(AssertionError, match=r"landed on unreleased|CTA \d read"):
        for seed in range(20):
            _replay_ppc_ring(7, 9, 3, seed, peer=False)


def test_ppc_candidate_tile_and_fused_choice(sm90, monkeypatch):
    """TMA_PPC_TILE: the ping-pong tile in 2-CTA clusters (gemm_tma_c<..., wide, pp>), grids in whole clusters
    (an odd SM count rounds down), B's boxes half the tile's columns where B is K-major; a fused graph built
    while plans take it runs on gemm_tma_body<..., 2, true, true> under __cluster_dims__(2, 1, 1); a row reduction
    stays on TMA_TILE. Plans never take it unasked (the build's units do not hold it)."""
    h, buf, drv, enc, units = sm90
    t = M.TMA_PPC_TILE
    assert (t.bn, t.stages, t.pp, t.cm, t.wide) == (128, 7, True, 2, True) and t.smem == M.TMA_PP_TILE.smem
    assert t.expr("bf16", False, True) == "pydnn::matmul::gemm_tma_c<pydnn::bf16_t, 128, 7, false, true, true, true>"
    assert t.map_shapes(False, True) == ((64, 128), (64, 64)) and t.map_shapes(False, False) == ((64, 128), (64, 64))
    assert t.grid(16, 16, 1, 131) == (130, 1, 1) and t.grid(3, 1, 1, 132) == (4, 1, 1)
    assert M.gemm_plan(h, BF16, 2048, 2048, 512).tma.expr == M.TMA_TILE.expr("bf16", False, False)
    M.pp_units()
    monkeypatch.setattr(M, "_tma_tile", lambda: t)
    plan = M.gemm_plan(h, BF16, 2048, 2048, 512)
    assert plan.tma.expr == t.expr("bf16", False, False) and plan.tma.params.p.tiles_n == 16
    assert plan.tma.grid == (132, 1, 1)  # 128 pairs of tile rows x 16 columns: 66 clusters
    _, step = _graph(h, "gelu", 2048, 2048, 512)
    text = cache.unit_inputs(units[-1])[0]
    assert "gemm_tma_body<pydnn::bf16_t, 128, 7, false, false, 2, true, true>" in text
    assert "__cluster_dims__(2, 1, 1) __launch_bounds__(384, 1)" in text
    assert step.recs[0][0].expr == t.expr("bf16", False, False) and step.recs[0][0].grid == (132, 1, 1)
    _, step = _graph(h, "rowmax", 2048, 2048, 512)
    assert "gemm_tma_body<pydnn::bf16_t, 256, 4, false, false, 1, true>" in cache.unit_inputs(units[-1])[0]


def test_ppc_fused_kernel_compiles_without_spills():
    """ptxas (sm_90a) on the fused bias + GELU kernel of the cluster candidate: no spills, 168 registers at entry;
    SASS where cuobjdump exists: 8 HGMMA.64x128x16 a K tile, A by a plain TMA load and this CTA's half of B by a
    multicast one, the releases as remote (cluster) arrivals, the turn barrier, the WIDE stores."""
    prog, final, access, red = _programs()["gelu"]
    name, text = cg.matmul_source(prog, final, "bf16", M.TMA_PPC_TILE, M.TC_GENERAL, False, False, access=access)
    _, lines, ops = _fast_kernel_ops(name, text)
    if lines is None:
        return
    c = Counter(ops)
    assert c["HGMMA.64x128x16.F32.BF16"] == 8 and c["UTMALDG.3D"] == 1 and c["UTMALDG.3D.MULTICAST"] == 1, c
    assert c["SYNCS.ARRIVE.TRANS64.RED.A1T0"] >= 2 and c["BAR.ARV"] == 1 and c["STG.E.128"] >= 16, c
    assert not any(o.startswith(("LDL", "STL")) for o in ops)


# ----------------------------------------------------------------------------- the debug timeline

def test_timeline_stamps_only_under_the_define():
    """-DPYDNN_GEMM_TL (tools/gemm_timeline.py's units only): the ping-pong kernel reads %clock64 / %globaltimer
    and still has no spills; without it (every installed unit) neither special register is read: the stamps are
    not in the compiled text. The same for the cooperative kernel's fused bias + GELU."""
    prog, final, access, red = _programs()["gelu"]
    name, gtext = cg.matmul_source(prog, final, "bf16", M.TMA_TILE, M.TC_GENERAL, False, False, access=access)
    mtext = (cache.ptx_dir() / "matmul.cu").read_text()
    cases = ((mtext, "matmul.cu", M.TMA_PP_TILE.expr("bf16", False, False)),
             (gtext, f"graph/{name}.cu", f"pydnn::graph::{name}_f"))
    for text, src, expr in cases:
        for tl in (False, True):
            opts = COMMON_OPTIONS + ("--ptxas-options=-v",) + (("-DPYDNN_GEMM_TL=128",) if tl else ())
            cubin, lowered, log = nvrtc.compile_cubin(text, src, (expr,), "sm_90a", opts, [str(cache.ptx_dir())])
            log = log if isinstance(log, str) else log.decode()
            props = {f: (int(a), int(b)) for f, a, b in re.findall(
                r"Function properties for (\S+)[^\n]*\n[^\n]*?(\d+) bytes stack frame, (\d+) bytes spill stores", log)}
            assert props.get(lowered[expr]) == (0, 0), log
            lines = _fast_sass(cubin, lowered[expr])
            if lines is None:
                continue
            clocks = sum(("SR_CLOCKLO" in ln or "SR_GLOBALTIMER" in ln) for ln in lines)
            assert (clocks > 0) == tl, (src, tl, clocks)


# ----------------------------------------------------------------------------- one-MUFU GELU, stmatrix stores
@pytest.mark.parametrize("stage", [True, False])
@pytest.mark.parametrize("kind", ["gelu", "residual", "rowmax"])
def test_stsm_plan_and_smem(sm90, monkeypatch, kind, stage):
    """tuning.matmul.EPI_STSM: the generated epilogue of a fused GEMM on gemm_tma's cooperative tile with a stored
    C gets kStsm and the launch 8 x 2 KiB more shared memory (stsm_smem; 128 bytes of alignment where nothing is
    staged), inside the SM's 227 KiB with the largest staging; a row reduction (no change to its store) keeps its
    kernel; tuning.graph.EPI_GELU_EX2 makes the GELU gelu_ex2 there and nowhere else (the pointwise chain, the
    normalization epilogues keep gelu_fast5)."""
    h, buf, drv, enc, units = sm90
    monkeypatch.setattr(tuning.matmul, "FUSED_STAGE", stage)
    monkeypatch.setattr(tuning.matmul, "EPI_STSM", True)
    monkeypatch.setattr(tuning.graph, "EPI_GELU_EX2", True)
    g, step = _graph(h, kind, 2048, 2048, 512)
    text = cache.unit_inputs(units[-1])[0]
    sb = _staged_bytes() if kind == "gelu" and stage else 0
    assert ("kStsm = true" in text) == (kind != "rowmax")  # the row MAX graph stores no C
    want = M.TMA_TILE.smem + cg.stage_smem(sb) + (cg.stsm_smem(sb) if "kStsm = true" in text else 0)
    assert step.recs[0][0].smem == want
    assert ("gelu_ex2(" in text) == (kind == "gelu") and "gelu_fast5(" not in text
    assert cg.stsm_smem(0) == 8 * 2048 + 128 and cg.stsm_smem(512) == 8 * 2048
    assert M.TMA_TILE.smem + cg.stage_smem(cg.STAGE_MAX_BYTES) + cg.stsm_smem(cg.STAGE_MAX_BYTES) <= 227 * 1024
    # the pointwise chain keeps gelu_fast5 under the switch
    prog = cg.PwProgram([("bf16", "in"), ("bf16", "out")], [cg.PwNode(P.PYDNN_POINTWISE_GELU_FWD, x=("op", 0))],
                        [(0, 1)])
    (_, e), = cg.expressions(prog)
    assert e.startswith("gelu_fast5(")
    (_, e), = cg.expressions(prog, gemm=True)
    assert e.startswith("gelu_ex2(")


def test_stsm_only_on_the_cooperative_tile():
    """matmul_source refuses kStsm on the ping-pong tile, a cluster tile, the wgmma tiles and float outputs."""
    prog, final, access, red = _programs()["gelu"]
    for tile, tag in ((M.TMA_PP_TILE, "bf16"), (M.TMA_PPC_TILE, "bf16"), (M.TC_TILES[0], "bf16"),
                      (M.TMA_TILE, "f32")):
        with pytest.raises(ValueError):
            cg.matmul_source(prog, final, tag, tile, M.TC_GENERAL, False, False, access=access, stsm=True)


def test_stsm_gelu_ex2_kernel_sass():
    """ptxas (sm_90a) on the fused bias + GELU kernel with EPI_GELU_EX2 and EPI_STSM (bias staged): 168 registers
    at entry, no spill in the fast kernel; SASS where cuobjdump exists: the staged fast tile's epilogue (the
    cp.async wait to the last wide store) has one MUFU an output (128 EX2 a thread, no RCP), 16 STSM (4 a
    64-column chunk), 16 LDS.128 and 16 STG.E.128, no SHFL, and the whole kernel no SHFL."""
    from pydnn import tuning as T

    keep = T.graph.EPI_GELU_EX2
    T.graph.EPI_GELU_EX2 = True
    try:
        prog, final, access, _ = _programs()["gelu"]
        name, text = cg.matmul_source(prog, final, "bf16", M.TMA_TILE, M.TC_GENERAL, False, False, access=access,
                                      stage_bn=256, stsm=True)
    finally:
        T.graph.EPI_GELU_EX2 = keep
    assert "gelu_ex2(" in text and "kStsm = true" in text
    log, lines, ops = _fast_kernel_ops(name, text)
    if ops is None:
        return
    assert not any(o.startswith(("LDL", "STL", "SHFL")) for o in ops)
    stsm = [i for i, o in enumerate(ops) if o.startswith("STSM")]
    assert len(stsm) == 16
    wide = [i for i, o in enumerate(ops) if o == "STG.E.128" and i > stsm[0]]
    waits = [i for i, o in enumerate(ops) if o.startswith("LDGDEPBAR") or o.startswith("DEPBAR")]
    start = max(i for i in waits if i < stsm[0]) if any(i < stsm[0] for i in waits) else 0
    region = Counter(ops[start:wide[15] + 1])
    assert region["MUFU.EX2"] == 128 and region["MUFU.RCP"] == 0, region
    assert region["LDS.128"] == 16 and region["STG.E.128"] == 16 and region["LDS"] == 32, region


@pytest.mark.parametrize("widen, chunk", [(True, False), (False, True), (True, True), (False, False), (True, 32)])
@pytest.mark.parametrize("kind", ["gelu", "residual"])
def test_widen_chunk_plan_and_smem(sm90, monkeypatch, kind, widen, chunk):
    """tuning.matmul.EPI_WIDEN / EPI_CHUNK (with EPI_STSM and staging): the staged bias (gelu) is held as float (1
    KiB a warp: the launch 8 x 512 bytes more) and widened once a tile (kWiden, widen()); the epilogue chunked
    (kChunk); a graph with nothing staged (bias + residual) gets neither and keeps its shared memory."""
    h, buf, drv, enc, units = sm90
    monkeypatch.setattr(tuning.matmul, "FUSED_STAGE", True)
    monkeypatch.setattr(tuning.matmul, "EPI_STSM", True)
    monkeypatch.setattr(tuning.matmul, "EPI_WIDEN", widen)
    monkeypatch.setattr(tuning.matmul, "EPI_CHUNK", chunk)
    g, step = _graph(h, kind, 2048, 2048, 512)
    text = cache.unit_inputs(units[-1])[0]
    staged = kind == "gelu"
    assert ("kWiden = true" in text) == (widen and staged) and ("kChunk = " in text) == bool(chunk and staged)
    assert ("kChunk = 32" in text) == (chunk == 32 and staged)
    assert ("lds2<float>" in text) == (widen and staged)
    sb = (1024 if widen else 512) if staged else 0
    assert step.recs[0][0].smem == M.TMA_TILE.smem + cg.stage_smem(sb) + cg.stsm_smem(sb)
    assert step.recs[0][0].smem <= 227 * 1024


def test_widen_chunk_kernel_sass():
    """ptxas (sm_90a) on the fused bias + GELU kernel with EPI_WIDEN and EPI_CHUNK (gelu_ex2, stmatrix, staged):
    no spill in the fast kernel, 168 registers; SASS where cuobjdump exists: the widening's 2 STS.128 before the
    last wgmma wait (WARPGROUP.DEPBAR.LE gsb0, 0x0), and the epilogues' bias reads LDS.64 with no 16-bit LDS;
    the first STSM before the last MUFU (chunked: stores begin while values remain to be computed)."""
    from pydnn import tuning as T

    keep = T.graph.EPI_GELU_EX2
    T.graph.EPI_GELU_EX2 = True
    try:
        prog, final, access, _ = _programs()["gelu"]
        name, text = cg.matmul_source(prog, final, "bf16", M.TMA_TILE, M.TC_GENERAL, False, False, access=access,
                                      stage_bn=256, stsm=True, widen=True, chunk=True)
    finally:
        T.graph.EPI_GELU_EX2 = keep
    assert "kWiden = true" in text and "kChunk = 64" in text
    log, lines, ops = _fast_kernel_ops(name, text)
    if ops is None:
        return
    assert not any(o.startswith(("LDL", "STL")) for o in ops)
    last_wait = [i for i, ln in enumerate(lines) if "WARPGROUP.DEPBAR.LE gsb0, 0x0" in ln][0]
    sts = [i for i, o in enumerate(ops) if o == "STS.128"]
    assert len(sts) == 2 and sts[-1] < last_wait
    # 32 a FAST epilogue copy (the chunked one and the unchunked one, taken where C is not 16-byte aligned)
    assert Counter(ops)["LDS.64"] == 64 and Counter(ops)["LDS"] < 32  # unwidened: 32 a copy more (3 elsewhere)
    stsm = [i for i, o in enumerate(ops) if o.startswith("STSM")]
    mufu = [i for i, o in enumerate(ops) if o == "MUFU.EX2"]
    assert len(stsm) == 32 and len(mufu) % 128 == 0 and stsm[0] < mufu[127]  # 2 stmatrix copies, 3 of the math
