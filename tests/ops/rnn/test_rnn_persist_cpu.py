"""PYDNN_RNN_ALGO_PERSIST_STATIC without a GPU: the engine's Python with the persistent kernels re-stated in
numpy block by block (rnn_persist_emulator.py: the slice mapping, the shared memory layout the host chose,
the K slices, the state slots, the barrier order) against the float64 reference; the plan's shared memory
layouts; NOT_SUPPORTED with its reasons; the workspace sizes; NVRTC compilation of ptx/rnn_persist.cu for
sm_80 and sm_90 with no spills."""
import os
import sys

import numpy as np
import pytest

import pydnn
from pydnn import enums as E
from pydnn.status import PydnnError

sys.path.insert(0, os.path.dirname(__file__))
import rnn_emulator  # noqa: E402
from rnn_harness import Case, run_case  # noqa: E402

from pydnn.ops.rnn import engine, persist  # noqa: E402

PS, STD = E.PYDNN_RNN_ALGO_PERSIST_STATIC, E.PYDNN_RNN_ALGO_STANDARD
F32, F16, BF16 = E.PYDNN_DATA_FLOAT, E.PYDNN_DATA_HALF, E.PYDNN_DATA_BFLOAT16
PACKED, BATCH_MAJOR = E.PYDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED, E.PYDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED


def _c(**kw):
    kw.setdefault("hidden", 8)
    return Case(algo=PS, **kw)


CASES = {
    "lstm": _c(),
    "lstm-half-16": _c(dtype=F16, hidden=16, lengths=(4, 3, 4, 1)),
    "lstm-bi-2layer-nostate": _c(layers=2, dirs=2, states=False, lengths=(4, 2, 3), fill=-3.0),
    "lstm-clip-2layer": _c(clip=(-0.4, 0.5), layers=2, lengths=(4, 1, 3)),
    "gru-bi-packed": _c(cell=E.PYDNN_GRU, dirs=2, layers=2, layout=PACKED, lengths=(4, 4, 2)),
    "gru-skip-rec-bias": _c(cell=E.PYDNN_GRU, skip=True, bias_mode=E.PYDNN_RNN_SINGLE_REC_BIAS, dirs=2),
    "relu-nobias": _c(cell=E.PYDNN_RNN_RELU, bias_mode=E.PYDNN_RNN_NO_BIAS, layers=2),
    "tanh-inp-bias-batch-major": _c(cell=E.PYDNN_RNN_TANH, bias_mode=E.PYDNN_RNN_SINGLE_INP_BIAS,
                                    layout=BATCH_MAJOR, lengths=(1, 4, 2)),
    "lstm-skip-bi": _c(skip=True, dirs=2, layers=2),
    "gru-half-dropout": _c(cell=E.PYDNN_GRU, dtype=F16, layers=2, dropout=0.3),
    # several blocks (hidden / units), batch rows past one 16-row tile (half) / 4-row group (float)
    "lstm-half-32-many-rows": _c(dtype=F16, hidden=32, input_size=6, lengths=(5, 5, 4, 1, 5, 3) * 3, T=5),
    "tanh-f32-24-bi": _c(cell=E.PYDNN_RNN_TANH, hidden=24, input_size=7, lengths=(5, 3, 5, 2, 1), T=5, dirs=2),
}


@pytest.mark.parametrize("name", list(CASES))
def test_persist_engine_on_emulated_device(name, monkeypatch):
    c = CASES[name]
    dev = rnn_emulator.Device()
    calls = rnn_emulator.install(monkeypatch, dev, c.dtype)
    h = rnn_emulator.fake_handle()
    run_case(h, dev, c)
    kinds = {m[1] for m in calls if m[0] == "persist"}
    tag = {F32: "f32", F16: "f16", BF16: "bf16"}[c.dtype]
    reg = persist.reg_shape(tag, len(c.lengths), c.hidden, 8)  # tuning.rnn.PERSIST_REG's default: on
    G = {E.PYDNN_LSTM: 4, E.PYDNN_GRU: 3}.get(c.cell, 1)
    breg = persist.bwd_reg_shape(tag, len(c.lengths), c.hidden, G, 8)  # PERSIST_BWD_REG's default: on
    assert kinds == {"persist_reset", "persist_fwd_r" if reg else "persist_fwd",
                     "persist_bwd_r" if breg else "persist_bwd"}
    fwd = [it[4][2] for k, items in h.prepared.items() if k[0] == "rnn.call" and k[1] == "_run_forward"
           for it in items if it[5][:2] in (("persist", "persist_fwd"), ("persist", "persist_fwd_r"))]
    assert fwd and not any(q.dir[0].xchg for q in fwd)  # the barrier (tuning.rnn.PERSIST_XCHG's default)
    assert not [m for m in calls if m[0] == "rnn" and m[1] in ("fwd_cell", "bwd_cell")]


CHUNKED = {  # tuning.rnn.PERSIST_MAX_CHUNK 64: the [batch, K] operands pass through shared memory in chunks
    "lstm-half-128": (_c(dtype=F16, hidden=128, input_size=6, lengths=(4, 2, 4, 3, 1), T=4), (2, 8)),
    "gru-f32-64-bi": (_c(cell=E.PYDNN_GRU, hidden=64, input_size=6, dirs=2, lengths=(4, 3, 4), T=4), (1, 3)),
    "tanh-half-192": (_c(cell=E.PYDNN_RNN_TANH, dtype=F16, hidden=192, input_size=5, lengths=(3, 1, 3), T=3), (3, 3)),
}


@pytest.mark.parametrize("name", list(CHUNKED))
def test_persist_engine_in_chunks(name, monkeypatch):
    from pydnn import tuning
    monkeypatch.setattr(tuning.rnn, "PERSIST_MAX_CHUNK", 64)
    c, (nf, nb) = CHUNKED[name]
    for xchg in (True, False):
        monkeypatch.setattr(tuning.rnn, "PERSIST_XCHG", xchg)
        dev = rnn_emulator.Device()
        rnn_emulator.install(monkeypatch, dev, c.dtype)
        h = rnn_emulator.fake_handle()
        run_case(h, dev, c)
        plans = [v for k, v in h.prepared.items() if k[0] == "rnn.persist.plan" and k[-2]]
        assert plans and all((p.fwd.nchunk, p.bwd.nchunk) == (nf, nb) for p in plans)


@pytest.mark.parametrize("name", ["lstm-bi-2layer-nostate", "gru-bi-packed", "tanh-f32-24-bi",
                                  "lstm-half-32-many-rows"])
def test_persist_engine_with_the_tagged_exchange(name, monkeypatch):
    """tuning.rnn.PERSIST_XCHG on: the forward exchanges h as tagged words (the emulation checks every tag)."""
    from pydnn import tuning
    monkeypatch.setattr(tuning.rnn, "PERSIST_XCHG", True)
    c = CASES[name]
    dev = rnn_emulator.Device()
    rnn_emulator.install(monkeypatch, dev, c.dtype)
    h = rnn_emulator.fake_handle()
    run_case(h, dev, c)
    fwd = [v for k, v in h.prepared.items() if k[0] == "rnn.call" and k[1] == "_run_forward"]
    launches = [it[4][2] for items in fwd for it in items if it[5][:2] == ("persist", "persist_fwd")]
    assert launches and all(q.dir[0].xchg for q in launches)


def test_persist_blocks_and_directions(monkeypatch):
    """hidden 32 with 1 SM per 2 slices: the plan widens the slice (16 units, 2 blocks); a bidirectional
    layer whose 2 * blocks exceed the SMs launches per direction."""
    c = _c(hidden=32, input_size=4, dirs=2, lengths=(3, 2), T=3)
    dev = rnn_emulator.Device()
    calls = rnn_emulator.install(monkeypatch, dev, c.dtype)
    h = rnn_emulator.fake_handle()
    h.sm_count = 2
    run_case(h, dev, c)
    fwd = [m for m in calls if m[0] == "persist" and m[1] == "persist_fwd"]
    assert fwd
    plans = [v for k, v in h.prepared.items() if k[0] == "rnn.persist.plan"]
    assert plans and all(p.units == 16 and p.blocks == 2 and not p.both for p in plans)


def _desc(algo=PS, cell=E.PYDNN_LSTM, dt=F16, H=256, proj=None, D=1, I=None):
    r = pydnn.create_rnn_descriptor()
    pydnn.set_rnn_descriptor_v8(r, algo, cell, E.PYDNN_RNN_DOUBLE_BIAS,
                                E.PYDNN_BIDIRECTIONAL if D == 2 else E.PYDNN_UNIDIRECTIONAL, E.PYDNN_LINEAR_INPUT, dt,
                                dt if dt == E.PYDNN_DATA_DOUBLE else F32, E.PYDNN_DEFAULT_MATH, I or H, H, proj or H,
                                1, None, 1)
    return r


def _x(dt, T, B, I):
    x = pydnn.create_rnn_data_descriptor()
    pydnn.set_rnn_data_descriptor(x, dt, 0, T, B, I, [T] * B, None)
    return x


@pytest.mark.parametrize("kw,words", [
    (dict(proj=128), "projection"),
    (dict(H=100), "multiple of 8"),
    (dict(dt=E.PYDNN_DATA_DOUBLE), "float, half and bfloat16"),
    (dict(H=2048, dt=F32), "shared memory per block"),
])
def test_not_supported_reasons(kw, words):
    h = rnn_emulator.fake_handle()
    dt = kw.get("dt", F16)
    r = _desc(**kw)
    x = _x(dt, 8, 64, kw.get("H", 256))
    for mode in (E.PYDNN_FWD_MODE_INFERENCE, E.PYDNN_FWD_MODE_TRAINING):
        with pytest.raises(PydnnError) as e:
            pydnn.get_rnn_temp_space_sizes(h, r, mode, x)
        assert e.value.status == E.PYDNN_STATUS_NOT_SUPPORTED and words in str(e.value), str(e.value)
        assert "PERSIST_STATIC" in str(e.value)


def test_large_operands_pass_in_chunks():
    """Issue 16's main shapes (hidden 1024, batch 64): the [64, 1024] h tile (forward) and the [64, 4096] gate
    gradient tile (backward) do not fit shared memory next to the weight slice; they pass through it in chunks
    (two buffers) and the plan fits on an H100 / H200 (227 KiB per block), 128 blocks of 8 units."""
    h = rnn_emulator.fake_handle()
    for dt in (F16, F32):
        r, x = _desc(H=1024, dt=dt), _x(dt, 8, 64, 1024)
        g = engine.Geometry(engine.set_rnn(r), engine.set_data(x, "x"), 132)
        pl = persist.plan(h, engine.set_rnn(r), g, True)
        assert pl.units == 8 and pl.blocks == 128
        assert pl.bwd.nchunk > 1 and pl.bwd.kp * pl.bwd.nchunk == 4096
        assert max(pl.fwd.smem, pl.bwd.smem) <= persist.SMEM_OPTIN["sm_90"]
        assert (pl.fwd.nchunk > 1) == (dt == F32)


@pytest.mark.parametrize("cell", [E.PYDNN_LSTM, E.PYDNN_GRU, E.PYDNN_RNN_TANH])
@pytest.mark.parametrize("dt", [F32, F16, BF16])
def test_workspace_is_standard_plus_the_barrier_and_the_exchange(cell, dt):
    """STANDARD's workspace + the barrier counters + the tagged exchange [dirs][2][B, H] words (u32; float:
    u64), whatever tuning.rnn.PERSIST_XCHG says (the size must not depend on a switch); the same reserve."""
    h = rnn_emulator.fake_handle()
    x = _x(dt, 16, 32, 256)
    for D in (1, 2):
        xb = D * 2 * 32 * 256 * (8 if dt == F32 else 4)
        for mode in (E.PYDNN_FWD_MODE_INFERENCE, E.PYDNN_FWD_MODE_TRAINING):
            ws_p, rs_p = pydnn.get_rnn_temp_space_sizes(h, _desc(PS, cell, dt, D=D), mode, x)
            ws_s, rs_s = pydnn.get_rnn_temp_space_sizes(h, _desc(STD, cell, dt, D=D), mode, x)
            assert ws_p == ws_s + persist.BAR_BYTES + xb and rs_p == rs_s


@pytest.mark.parametrize("dt", [F32, F16])
@pytest.mark.parametrize("cell", [E.PYDNN_LSTM, E.PYDNN_GRU, E.PYDNN_RNN_RELU])
@pytest.mark.parametrize("H,B", [(8, 3), (256, 32), (64, 17), (512, 64), (24, 100)])
def test_layouts(dt, cell, H, B):
    """Both kernels' shared memory regions are 16-byte aligned, disjoint and big enough; the K slices divide
    the padded K into whole k-steps; the grid fits the SMs."""
    r, x = _desc(PS, cell, dt, H), _x(dt, 4, B, H)
    g = engine.Geometry(engine.set_rnn(r), engine.set_data(x, "x"), 132)
    try:
        pl = persist.Plan(engine.set_rnn(r), g, 132, persist.SMEM_OPTIN["sm_90"], True)
    except PydnnError as e:
        assert e.status == E.PYDNN_STATUS_NOT_SUPPORTED and (H, B) == (512, 64)
        return
    assert pl.blocks * pl.units == H and pl.blocks <= 132
    es = g.es
    for lay, bwd in ((pl.fwd, False), (pl.bwd, True)):
        G = g.G
        n, k = (pl.units, G * H) if bwd else (G * pl.units, H)
        assert lay.n == n and lay.k == k and lay.bp >= B and lay.pitch > lay.kp
        assert lay.kp >= k if lay.nchunk == 1 else lay.kp * lay.nchunk == k
        assert lay.wpitch > (lay.kp if lay.nchunk == 1 else k)
        step = 16 if es == 2 else 4
        assert lay.kp % (step * lay.ksplit) == 0 and lay.bp % (16 if es == 2 else 4) == 0
        need = {"w": n * lay.wpitch * es, "a": (2 if lay.nchunk > 1 else 1) * lay.bp * lay.pitch * es,
                "part": lay.ksplit * lay.bp * n * 4, "h": 0 if bwd else B * pl.units * es,
                "g": 0 if bwd else B * pl.units * g.GA * 4,
                "x": B * pl.units * (4 * g.GA + (8 if G > 1 else 0) + es) if bwd else B * n * es,
                "b": 0 if bwd else 2 * n * 4, "s": B * pl.units * 4,
                "s2": B * pl.units * 4 if bwd else 0, "lens": B * 4}
        spans = sorted((lay.off[name], lay.off[name] + size) for name, size in need.items() if size)
        assert all(a % 16 == 0 for a, _ in spans)
        assert all(spans[i][1] <= spans[i + 1][0] for i in range(len(spans) - 1))
        assert spans[-1][1] <= lay.smem <= persist.SMEM_OPTIN["sm_90"]
        assert (lay.pitch * es) % 16 == 0 and (lay.wpitch * es) % 16 == 0


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_persist_units_compile_without_spills(arch, tmp_path, monkeypatch):
    build = pytest.importorskip("pydnn._build.build")
    try:
        build.nvrtc.version()
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"NVRTC unavailable: {e}")
    from pydnn._build import cache
    from pydnn._build.manifest import COMMON_OPTIONS
    monkeypatch.setenv("PYDNN_CACHE_DIR", str(tmp_path))
    for u in persist.kernel_units():
        text, _ = cache.unit_inputs(u)
        cubin, lowered, log = build.nvrtc.compile_cubin(text, u.source, u.exprs, arch,
                                                        COMMON_OPTIONS + ("--ptxas-options=-v",),
                                                        [str(cache.ptx_dir())], unit=u.name)
        assert cubin[:4] == b"\x7fELF" and set(lowered) == set(u.exprs)
        log = log if isinstance(log, str) else log.decode()
        assert log.count("Compiling entry") == len(u.exprs)
        assert "0 bytes spill stores, 0 bytes spill loads" in log
        assert " bytes spill stores" not in log.replace("0 bytes spill stores", "")
        assert "bytes stack frame" in log and " 0 bytes stack frame" in log


@pytest.mark.parametrize("bwd", [False, True])
@pytest.mark.parametrize("cell", [E.PYDNN_LSTM, E.PYDNN_GRU, E.PYDNN_RNN_TANH])
@pytest.mark.parametrize("H,B", [(8, 3), (256, 32), (64, 17), (1024, 64), (24, 100)])
def test_float_block_gemm_covers_each_output_once(bwd, cell, H, B):
    """block_gemm<float>'s thread mapping (ptx/rnn_persist.cu), re-stated: thread item q -> columns n0 and
    n0 + n / 2, rows b0 .. b0 + 3, K slice ks: every (slice, row, column) of part written exactly once."""
    import numpy as np
    G = {E.PYDNN_LSTM: 4, E.PYDNN_GRU: 3}.get(cell, 1)
    units = 8 if H // 8 <= 132 else 16
    for kc in persist.chunks(G * H if bwd else H, 4):
        lay = persist.Layout(bwd, G, H, B, units, 4, 4 if G > 1 else 1, kc)
        n, bp, ks = lay.n, lay.bp, lay.ksplit
        np_ = n // 2
        items = np_ * (bp // 4)
        assert items * ks <= 256 or ks == 1
        hits = np.zeros((ks, bp, n), int)
        for q in range(items * ks):
            item, k = q % items, q // items
            n0, b0 = item % np_, (item // np_) * 4
            hits[k, b0:b0 + 4, n0] += 1
            hits[k, b0:b0 + 4, n0 + np_] += 1
        assert (hits == 1).all()
        assert (lay.kp // ks) % 4 == 0


@pytest.mark.parametrize("sets,bits,units", [
    ({}, 0, 8),
    ({"PERSIST_FLAGS": True}, persist.PV_FLAGS, 8),
    ({"PERSIST_CHAIN2": True}, persist.PV_CHAIN2, 8),
    ({"PERSIST_UNITS": 16}, 0, 16),
    ({"PERSIST_XS_AHEAD": True}, persist.PV_XS_AHEAD, 8),
    ({"PERSIST_FAST_MATH": True}, persist.PV_FAST_MATH, 8),
    ({"PERSIST_LEAN": True}, 0, 8),
    ({"PERSIST_LEAN": True, "PERSIST_XCHG": True}, 0, 8),  # the tagged exchange: the general instance
    ({"PERSIST_FLAGS": True, "PERSIST_CHAIN2": True, "PERSIST_UNITS": 12, "PERSIST_XS_AHEAD": True},
     persist.PV_FLAGS | persist.PV_CHAIN2 | persist.PV_XS_AHEAD, 16),
    # flags and the x buffers only where the counter barrier would run
    ({"PERSIST_FLAGS": True, "PERSIST_XS_AHEAD": True, "PERSIST_XCHG": True}, 0, 8),
])
def test_forward_variants_reach_the_kernel(sets, bits, units, monkeypatch):
    """The forward's tuning switches (PERSIST_FLAGS, PERSIST_CHAIN2, PERSIST_UNITS, PERSIST_XS_AHEAD) become the
    launches' variant bits and slice width; the emulated run still matches the reference (with the x slice of
    step s read from buffer s & 1 of the doubled region under PV_XS_AHEAD); each setting records its own
    launches (engine._run's key has persist.record_key())."""
    from pydnn import tuning
    for k in ("PERSIST_FLAGS", "PERSIST_CHAIN2", "PERSIST_XS_AHEAD", "PERSIST_FAST_MATH", "PERSIST_LEAN",
              "PERSIST_REG", "PERSIST_BWD_REG"):  # off (PERSIST_REG / _BWD_REG: the general kernels)
        monkeypatch.setattr(tuning.rnn, k, False)
    for k, v in sets.items():
        monkeypatch.setattr(tuning.rnn, k, v)
    c = _c(dtype=F16, hidden=32, input_size=6, lengths=(5, 5, 4, 1, 5, 3), T=5)
    dev = rnn_emulator.Device()
    rnn_emulator.install(monkeypatch, dev, c.dtype)
    h = rnn_emulator.fake_handle()
    run_case(h, dev, c)
    fwd = [v for k, v in h.prepared.items() if k[0] == "rnn.call" and k[1] == "_run_forward"]
    assert fwd and all(k[-3] == persist.record_key() for k in h.prepared if k[0] == "rnn.call")
    launches = [it for items in fwd for it in items if it[5][:2] == ("persist", "persist_fwd")]
    assert launches and all(it[4][2].variant == bits and it[4][2].units == units and not it[4][2].stamps
                            for it in launches)
    lean = 1 if sets.get("PERSIST_LEAN") and not sets.get("PERSIST_XCHG") else 0
    assert all(it[5][3] == lean for it in launches)  # persist_fwd's LEAN instance
    assert all(it[1][0] == 32 // units for it in launches)
    bwd = [it for k, items in h.prepared.items() if k[0] == "rnn.call" and k[1] == "_run_backward_data"
           for it in items if it[5][:2] == ("persist", "persist_bwd")]
    # the backward's share: the flag barrier (also where the forward exchanges tagged words) and the chains
    want = (persist.PV_FLAGS if sets.get("PERSIST_FLAGS") else 0) | (persist.PV_CHAIN2 if sets.get("PERSIST_CHAIN2")
                                                                     else 0)
    assert bwd and all(it[4][2].variant == want and it[4][2].units == units for it in bwd)


def test_units_switch_falls_back_and_flags_fit_the_barrier_words():
    """PERSIST_UNITS wider than hidden falls back to the default choice (the fewest units); the flags (one word a block after kFlagOff in a
    direction's BAR_STRIDE bytes) cover every block the plan can launch on a 132-SM device."""
    from pydnn import tuning
    h = rnn_emulator.fake_handle()
    with tuning.override({"rnn.PERSIST_UNITS": 64}):
        r, x = _desc(H=32, dt=F16), _x(F16, 4, 8, 32)
        g = engine.Geometry(engine.set_rnn(r), engine.set_data(x, "x"), 132)
        assert persist.plan(h, engine.set_rnn(r), g, True).units == 8
    with tuning.override({"rnn.PERSIST_UNITS": 20}):
        r, x = _desc(H=48, dt=F16), _x(F16, 4, 8, 48)
        g = engine.Geometry(engine.set_rnn(r), engine.set_data(x, "x"), 132)
        assert persist.plan(h, engine.set_rnn(r), g, True).units == 24
    assert persist.MAX_FLAG_BLOCKS >= 132 and persist.BAR_BYTES == 2 * persist.BAR_STRIDE
    src = open(os.path.join(os.path.dirname(persist.__file__), "..", "..", "..", "ptx", "rnn_persist.cu")).read()
    assert f"constexpr int kBarWords = {persist.BAR_STRIDE // 4};" in src
    assert f"constexpr int kFlagOff = {persist.FLAG_OFF};" in src


def test_fast_math_only_for_16_bit_data(monkeypatch):
    from pydnn import tuning
    monkeypatch.setattr(tuning.rnn, "PERSIST_FAST_MATH", True)
    h = rnn_emulator.fake_handle()
    for dt, bit in ((F16, persist.PV_FAST_MATH), (BF16, persist.PV_FAST_MATH), (F32, 0)):
        r, x = _desc(H=64, dt=dt), _x(dt, 4, 8, 64)
        g = engine.Geometry(engine.set_rnn(r), engine.set_data(x, "x"), 132)
        assert persist.variant(persist.plan(h, engine.set_rnn(r), g, True), False) & persist.PV_FAST_MATH == bit


def test_defaults_are_the_measured_ones():
    """The H200 mid-session run (2026-11-28) kept PERSIST_CHAIN2, PERSIST_XS_AHEAD and PERSIST_FAST_MATH and
    not PERSIST_FLAGS: a default 16-bit forward launch carries those three bits, a float one the first two."""
    from pydnn import tuning
    h = rnn_emulator.fake_handle()
    for dt, bits in ((F16, persist.PV_CHAIN2 | persist.PV_XS_AHEAD | persist.PV_FAST_MATH),
                     (F32, persist.PV_CHAIN2 | persist.PV_XS_AHEAD)):
        r, x = _desc(H=256, dt=dt), _x(dt, 4, 32, 256)
        g = engine.Geometry(engine.set_rnn(r), engine.set_data(x, "x"), 132)
        pl = persist.plan(h, engine.set_rnn(r), g, True)
        assert persist.variant(pl, False) == bits and pl.fwd.ahead
    assert not tuning.rnn.PERSIST_FLAGS and not tuning.rnn.PERSIST_XCHG
    # the rnnp mid-session run (H200): persist_fwd_r and the LEAN instance on, the register kernel's tagged
    # exchange and its sleep off
    assert tuning.rnn.PERSIST_REG and tuning.rnn.PERSIST_LEAN
    assert not tuning.rnn.PERSIST_REG_XCHG and not tuning.rnn.PERSIST_REG_SLEEP
    # run 2: the ONE instance and persist_bwd_r on, the cg loads off
    assert tuning.rnn.PERSIST_REG_ONE and tuning.rnn.PERSIST_BWD_REG and not tuning.rnn.PERSIST_REG_CG


def test_lean_kernel_is_built_and_only_for_one_chunk(monkeypatch):
    """persist_fwd<T, CELL, 1> is in every unit; with PERSIST_MAX_CHUNK forcing chunks the general one runs."""
    from pydnn import tuning
    for u in persist.kernel_units():
        assert sum(e.count(",") == 2 and e.endswith(", 1>") for e in u.exprs) == (0 if "_r." in u.name else 4)
    monkeypatch.setattr(tuning.rnn, "PERSIST_LEAN", True)
    monkeypatch.setattr(tuning.rnn, "PERSIST_MAX_CHUNK", 64)
    c = _c(dtype=F16, hidden=128, input_size=6, lengths=(4, 2, 4), T=4)
    dev = rnn_emulator.Device()
    rnn_emulator.install(monkeypatch, dev, c.dtype)
    h = rnn_emulator.fake_handle()
    run_case(h, dev, c)
    metas = [it[5] for k, items in h.prepared.items() if k[0] == "rnn.call" and k[1] == "_run_forward"
             for it in items if it[5][:2] == ("persist", "persist_fwd")]
    assert metas and all(m[3] == 0 for m in metas)


def test_x_buffers_only_in_one_chunk(monkeypatch):
    """PERSIST_XS_AHEAD with the operand in chunks (PERSIST_MAX_CHUNK 64 at hidden 128): no PV_XS_AHEAD, the x
    region single, the emulated run matches the reference."""
    from pydnn import tuning
    monkeypatch.setattr(tuning.rnn, "PERSIST_XS_AHEAD", True)
    monkeypatch.setattr(tuning.rnn, "PERSIST_MAX_CHUNK", 64)
    c = _c(dtype=F16, hidden=128, input_size=6, lengths=(4, 2, 4), T=4)
    dev = rnn_emulator.Device()
    rnn_emulator.install(monkeypatch, dev, c.dtype)
    h = rnn_emulator.fake_handle()
    run_case(h, dev, c)
    launches = [it[4][2] for k, items in h.prepared.items() if k[0] == "rnn.call" and k[1] == "_run_forward"
                for it in items if it[5][:2] == ("persist", "persist_fwd")]
    assert launches and all(q.nchunk == 2 and not q.variant & persist.PV_XS_AHEAD for q in launches)


# ---------------------------------------------------------------- persist_fwd_r (tuning.rnn.PERSIST_REG)
def _mma_ref(a, b):
    """mma.m16n8k16's fragments (PTX ISA, row.col): a [4 regs][32 lanes] of 2 halves, b [2][32], as the
    [16, 16] A and [8, 16] B (B[n][k]) they stand for; lane = 4 g + q."""
    A, Bm = np.zeros((16, 16)), np.zeros((8, 16))
    for lane in range(32):
        g, q = lane >> 2, lane & 3
        for e in range(2):
            A[g, 2 * q + e], A[g + 8, 2 * q + e] = a[0][lane][e], a[1][lane][e]
            A[g, 2 * q + 8 + e], A[g + 8, 2 * q + 8 + e] = a[2][lane][e], a[3][lane][e]
            Bm[g, 2 * q + e], Bm[g, 2 * q + 8 + e] = b[0][lane][e], b[1][lane][e]
    return A @ Bm.T


@pytest.mark.parametrize("ksw,kcol0", [(2, 0), (4, 64), (8, 128)])
def test_reg_fragments_cover_k_once(ksw, kcol0):
    """persist_fwd_r's loads: thread (g, q) takes the 16 bytes at physical column kcol0 + 32 i + 8 q of rows g
    and g + 8 (words 2p / 2p + 1: a0 / a2 resp. a1 / a3 of k step 2i + p) and the 8 bytes at kcol0 + 32 i + 8q
    + 4p of weight row g (b0, b1); the mma products over the warp's ksw k steps must equal the plain product
    over its K slice [kcol0, kcol0 + 16 ksw)."""
    rng = np.random.default_rng(ksw)
    K = kcol0 + 16 * ksw
    A, W = rng.standard_normal((16, K)), rng.standard_normal((8, K))
    out = np.zeros((16, 8))
    for kk in range(ksw):
        i, p = kk >> 1, kk & 1
        a = [[None] * 32 for _ in range(4)]
        b = [[None] * 32 for _ in range(2)]
        for lane in range(32):
            g, q = lane >> 2, lane & 3
            c0 = kcol0 + 32 * i + 8 * q
            rows = [A[g, c0:c0 + 8], A[g + 8, c0:c0 + 8]]  # the two 16-byte loads: 4 words of 2 halves
            words = [[r[2 * w:2 * w + 2] for w in range(4)] for r in rows]
            a[0][lane], a[1][lane] = words[0][2 * p], words[1][2 * p]
            a[2][lane], a[3][lane] = words[0][2 * p + 1], words[1][2 * p + 1]
            wb = W[g, c0 + 4 * p:c0 + 4 * p + 4]
            b[0][lane], b[1][lane] = wb[0:2], wb[2:4]
        out += _mma_ref(a, b)
    np.testing.assert_allclose(out, A[:, kcol0:] @ W[:, kcol0:].T, rtol=1e-12, atol=1e-12)


def test_reg_shape():
    """(m tiles, K slices): m tiles x slices <= 8 warps, each slice whole 32-column blocks and <= 8 k steps."""
    assert persist.reg_shape("f16", 32, 256, 8) == (2, 4)   # issue 16's small case: 4 k steps a warp
    assert persist.reg_shape("bf16", 64, 256, 8) == (4, 2)
    assert persist.reg_shape("f16", 16, 256, 8) == (1, 8)
    assert persist.reg_shape("f16", 40, 128, 8) == (4, 2)   # 3 row tiles rounded up to 4
    assert persist.reg_shape("f16", 18, 32, 8) == (2, 1)    # one 32-column block: one slice, 2 warps busy
    assert persist.reg_shape("f16", 128, 128, 8) == (8, 1)
    assert persist.reg_shape("f16", 128, 256, 8) is None    # 16 k steps a warp
    assert persist.reg_shape("f16", 32, 1024, 8) is None    # 16 k steps a warp at 4 slices
    assert persist.reg_shape("f16", 32, 512, 8) == (2, 4)
    assert persist.reg_shape("f16", 129, 256, 8) is None
    assert persist.reg_shape("f16", 32, 8, 8) is None       # hidden not a multiple of 32
    assert persist.reg_shape("f32", 32, 256, 8) is None
    assert persist.reg_shape("f16", 32, 256, 16) is None
    for tag in ("f16", "bf16"):
        for B in range(1, 129, 7):
            for H in range(32, 1025, 32):
                sh = persist.reg_shape(tag, B, H, 8)
                if sh:
                    mt, ks = sh
                    assert mt * 16 >= B and mt * ks <= persist.WARPS and H % (32 * ks) == 0
                    assert H // 16 // ks <= persist.REG_K


# persist_fwd_r's shapes: slices 1 / 2 / 4, row tiles 1 / 2 / 4, idle warps, past-batch rows (half only: the
# emulator's bfloat16 runs miss the reference for STANDARD as well; the GPU tests cover bfloat16)
REG_CASES = {
    "lstm-half-32-many-rows": CASES["lstm-half-32-many-rows"],
    "lstm-half-128-batch-40-clip": _c(dtype=F16, hidden=128, input_size=6, lengths=(3, 3, 2, 1, 3) * 8, T=3,
                                      clip=(-0.3, 0.4)),
    "gru-half-64-bi-skip": _c(cell=E.PYDNN_GRU, dtype=F16, hidden=64, skip=True, dirs=2, lengths=(4, 2, 4, 1), T=4),
    "tanh-half-256-2layer": _c(cell=E.PYDNN_RNN_TANH, dtype=F16, hidden=256, input_size=5, layers=2,
                               lengths=(2, 1, 2), T=2, bias_mode=E.PYDNN_RNN_SINGLE_INP_BIAS),
    "relu-half-32-nostate-packed": _c(cell=E.PYDNN_RNN_RELU, dtype=F16, hidden=32, input_size=4, states=False,
                                      layout=PACKED, lengths=(4, 4, 3, 1), T=4),
}


@pytest.mark.parametrize("name", list(REG_CASES))
def test_reg_forward_on_emulated_device(name, monkeypatch):
    """PERSIST_REG on (the default): the forward launches persist_fwd_r with reg_shape's (bp, ksplit), 16 KiB of
    shared memory and only the fast-math bit; the emulated run (rnn_persist_emulator.persist_fwd_r) matches the
    float64 reference through run_case (forward, backward data, weights)."""
    from pydnn import tuning
    monkeypatch.setattr(tuning.rnn, "PERSIST_REG", True)
    c = REG_CASES[name]
    dev = rnn_emulator.Device()
    rnn_emulator.install(monkeypatch, dev, c.dtype)
    h = rnn_emulator.fake_handle()
    run_case(h, dev, c)
    launches = [it for k, items in h.prepared.items() if k[0] == "rnn.call" and k[1] == "_run_forward"
                for it in items if it[5][:2] == ("persist", "persist_fwd_r")]
    tag = {F16: "f16", BF16: "bf16"}[c.dtype]
    mt, ks = persist.reg_shape(tag, len(c.lengths), c.hidden, 8)
    kr = 4 if c.hidden // 16 // ks <= 4 else 8
    assert launches and all(it[4][2].bp == 16 * mt and it[4][2].ksplit == ks and it[3] == persist.REG_SMEM
                            and it[4][2].variant == persist.PV_FAST_MATH and it[5][3] == kr
                            and not it[4][2].dir[0].xchg for it in launches)
    assert not [it for k, items in h.prepared.items() if k[0] == "rnn.call" for it in items
                if it[5][:2] == ("persist", "persist_fwd")]


def test_reg_off_and_where_it_does_not_apply(monkeypatch):
    """PERSIST_REG off, float data, the tagged exchange or forced chunks: persist_fwd runs."""
    from pydnn import tuning
    for sets, c in (({"PERSIST_REG": False}, REG_CASES["lstm-half-32-many-rows"]),
                    ({}, CASES["tanh-f32-24-bi"]),
                    ({"PERSIST_XCHG": True}, REG_CASES["lstm-half-32-many-rows"]),
                    ({"PERSIST_MAX_CHUNK": 64}, _c(dtype=F16, hidden=128, input_size=6, lengths=(4, 2, 4), T=4))):
        with tuning.override({f"rnn.{k}": v for k, v in sets.items()}):
            dev = rnn_emulator.Device()
            calls = rnn_emulator.install(monkeypatch, dev, c.dtype)
            h = rnn_emulator.fake_handle()
            run_case(h, dev, c)
            kinds = {m[1] for m in calls if m[0] == "persist"}
            assert "persist_fwd" in kinds and "persist_fwd_r" not in kinds, sets


def test_reg_kernel_is_built_for_16_bit_units():
    names = [u.name for u in persist.kernel_units()]
    assert names == ["rnn_persist.f32", "rnn_persist.f16", "rnn_persist_r.f16", "rnn_persist.bf16",
                     "rnn_persist_r.bf16"]
    for u in persist.kernel_units():
        regs = [e for e in u.exprs if "persist_fwd_r<" in e]
        assert len(regs) == (12 if "_r." in u.name else 0)
        assert sum(e.endswith(", 4, 1>") for e in regs) == (4 if "_r." in u.name else 0)
        assert sum("persist_bwd_r<" in e for e in u.exprs) == (4 if "_r." in u.name else 0)
        assert len(u.exprs) == (16 if "_r." in u.name else 13)
        assert all(e.endswith((", 4>", ", 8>", ", 4, 1>")) for e in regs)
    assert persist.reg_kr(256, 4) == 4 and persist.reg_kr(256, 2) == 8 and persist.reg_kr(32, 1) == 4


@pytest.mark.parametrize("name", ["lstm-half-32-many-rows", "lstm-half-128-batch-40-clip", "gru-half-64-bi-skip",
                                  "tanh-half-256-2layer"])
def test_reg_tagged_exchange_on_emulated_device(name, monkeypatch):
    """PERSIST_REG_XCHG on: persist_fwd_r's KR 4 launches get the tagged words (zeroed by persist_reset's wider
    grid; the emulation checks every tag of every step), a KR 8 launch keeps the barrier."""
    from pydnn import tuning
    monkeypatch.setattr(tuning.rnn, "PERSIST_REG", True)
    monkeypatch.setattr(tuning.rnn, "PERSIST_REG_XCHG", True)
    monkeypatch.setattr(tuning.rnn, "PERSIST_REG_SLEEP", True)
    c = REG_CASES[name]
    dev = rnn_emulator.Device()
    rnn_emulator.install(monkeypatch, dev, c.dtype)
    h = rnn_emulator.fake_handle()
    run_case(h, dev, c)
    items = [it for k, items in h.prepared.items() if k[0] == "rnn.call" and k[1] == "_run_forward" for it in items]
    launches = [it for it in items if it[5][:2] == ("persist", "persist_fwd_r")]
    assert launches
    for it in launches:
        q = it[4][2]
        tagged = it[5][3] == 4
        assert all(bool(q.dir[i].xchg) == tagged for i in range(it[1][1]))
        assert q.variant == persist.PV_FAST_MATH | (persist.PV_SLEEP if tagged else 0)
    resets = [it for it in items if it[5][:2] == ("persist", "persist_reset")]
    assert resets and all((it[1][0] > 1) == (launches[0][5][3] == 4) for it in resets)


def test_bwd_reg_shape():
    assert persist.bwd_reg_shape("f16", 32, 256, 4, 8) == (2, 4)    # issue 16's small case: K 1024, 16 k steps
    assert persist.bwd_reg_shape("f16", 32, 256, 3, 8) == (2, 4)    # GRU: 12 k steps
    assert persist.bwd_reg_shape("f16", 64, 256, 4, 8) is None      # 32 k steps a warp
    assert persist.bwd_reg_shape("bf16", 16, 512, 4, 8) == (1, 8)
    assert persist.bwd_reg_shape("f16", 18, 32, 1, 8) == (2, 1)
    assert persist.bwd_reg_shape("f32", 32, 256, 4, 8) is None
    assert persist.bwd_reg_shape("f16", 32, 256, 4, 16) is None


@pytest.mark.parametrize("name", list(REG_CASES))
def test_bwd_reg_on_emulated_device(name, monkeypatch):
    """PERSIST_BWD_REG on: backward data launches persist_bwd_r with bwd_reg_shape's (bp, ksplit) where it applies
    (else persist_bwd); run_case matches the float64 reference."""
    from pydnn import tuning
    monkeypatch.setattr(tuning.rnn, "PERSIST_BWD_REG", True)
    c = REG_CASES[name]
    dev = rnn_emulator.Device()
    rnn_emulator.install(monkeypatch, dev, c.dtype)
    h = rnn_emulator.fake_handle()
    run_case(h, dev, c)
    G = {E.PYDNN_LSTM: 4, E.PYDNN_GRU: 3}.get(c.cell, 1)
    sh = persist.bwd_reg_shape("f16", len(c.lengths), c.hidden, G, 8)
    items = [it for k, items in h.prepared.items() if k[0] == "rnn.call" and k[1] == "_run_backward_data"
             for it in items if it[5][0] == "persist" and it[5][1] in ("persist_bwd", "persist_bwd_r")]
    assert items and all(it[5][1] == ("persist_bwd_r" if sh else "persist_bwd") for it in items)
    if sh:
        assert all(it[4][2].bp == 16 * sh[0] and it[4][2].ksplit == sh[1] and it[3] == persist.BWD_REG_SMEM
                   for it in items)


@pytest.mark.parametrize("name", list(REG_CASES))
def test_reg_one_instance_where_it_applies(name, monkeypatch):
    """PERSIST_REG_ONE on: persist_fwd_r's ONE instance for 4 or 8 K slices with KR 4 and fast math, else the
    generic one; the emulated run matches the reference."""
    from pydnn import tuning
    monkeypatch.setattr(tuning.rnn, "PERSIST_REG_ONE", True)
    c = REG_CASES[name]
    dev = rnn_emulator.Device()
    rnn_emulator.install(monkeypatch, dev, c.dtype)
    h = rnn_emulator.fake_handle()
    run_case(h, dev, c)
    mt, ks = persist.reg_shape("f16", len(c.lengths), c.hidden, 8)
    kr = persist.reg_kr(c.hidden, ks)
    launches = [it for k, items in h.prepared.items() if k[0] == "rnn.call" and k[1] == "_run_forward"
                for it in items if it[5][:2] == ("persist", "persist_fwd_r")]
    assert launches and all(it[5][3:] == (kr, int(ks >= 4 and kr == 4)) for it in launches)


def test_reg_cg_bit(monkeypatch):
    """PERSIST_REG_CG on: persist_fwd_r's launches carry PV_CG (next to the fast-math bit); the run matches."""
    from pydnn import tuning
    monkeypatch.setattr(tuning.rnn, "PERSIST_REG_CG", True)
    c = REG_CASES["lstm-half-32-many-rows"]
    dev = rnn_emulator.Device()
    rnn_emulator.install(monkeypatch, dev, c.dtype)
    h = rnn_emulator.fake_handle()
    run_case(h, dev, c)
    launches = [it for k, items in h.prepared.items() if k[0] == "rnn.call" and k[1] == "_run_forward"
                for it in items if it[5][:2] == ("persist", "persist_fwd_r")]
    assert launches and all(it[4][2].variant == persist.PV_FAST_MATH | persist.PV_CG for it in launches)
