"""The layer wavefront (pydnn/ops/rnn/engine.py's _fwd_wavefront, tuning.rnn.WAVEFRONT) on the CPU: its schedule
respects the dependences, the planner takes it only where it applies, and the engine's real Python with it runs on
the emulated device (numpy kernels, and ptx/rnn.cu itself compiled for the host) against the float64 reference:
forward in both modes, and the backward calls on the reserve space it filled. Both orders are run."""
import os
import sys

import pytest

import pydnn
from pydnn import enums as E
from pydnn import tuning

sys.path.insert(0, os.path.dirname(__file__))
import rnn_emulator  # noqa: E402
from rnn_harness import Case, run_case  # noqa: E402

PACKED, BATCH_MAJOR = E.PYDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED, E.PYDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED
WAVE_CASES = {  # (case, chunk)
    "lstm-3layer-c2": (Case(layers=3, T=7, lengths=(7, 5, 2)), 2),
    "lstm-2layer-c1-nostate": (Case(layers=2, states=False, lengths=(4, 2, 3), fill=-3.0), 1),
    "gru-2layer-packed-c3": (Case(cell=E.PYDNN_GRU, layers=2, layout=PACKED, T=8, lengths=(8, 6, 3)), 3),
    "relu-3layer-nobias-c16": (Case(cell=E.PYDNN_RNN_RELU, bias_mode=E.PYDNN_RNN_NO_BIAS, layers=3), 16),
    "tanh-4layer-inp-bias-batch-major-c2": (Case(cell=E.PYDNN_RNN_TANH, bias_mode=E.PYDNN_RNN_SINGLE_INP_BIAS,
                                                 layers=4, layout=BATCH_MAJOR, lengths=(1, 4, 2)), 2),
    "lstm-clip-half-c2": (Case(dtype=E.PYDNN_DATA_HALF, layers=2, clip=(-0.4, 0.5), T=6, lengths=(6, 6, 1)), 2),
    "gru-double-3layer-c1": (Case(dtype=E.PYDNN_DATA_DOUBLE, cell=E.PYDNN_GRU, layers=3, T=5, lengths=(5, 3, 5)), 1),
    "lstm-input-eq-hidden-c2": (Case(layers=3, input_size=8, T=6, lengths=(6, 4, 6)), 2),  # one GEMM run
    "tanh-10layer-c1": (Case(cell=E.PYDNN_RNN_TANH, layers=10, T=12, lengths=(12, 9), hidden=4, input_size=3), 1),
    "lstm-skip-3layer-c2": (Case(skip=True, layers=3, T=6, lengths=(6, 3, 5)), 2),
    "gru-dropout-3layer-c2": (Case(cell=E.PYDNN_GRU, layers=3, dropout=0.4, T=7, lengths=(7, 5, 2)), 2),
    "lstm-dropout-packed-c3": (Case(layers=2, dropout=0.3, layout=PACKED, T=8, lengths=(8, 6, 3)), 3),
    "gru-skip-double-2layer-c1": (Case(cell=E.PYDNN_GRU, dtype=E.PYDNN_DATA_DOUBLE, skip=True, layers=2,
                                       bias_mode=E.PYDNN_RNN_SINGLE_REC_BIAS), 1),
}


def _wave(monkeypatch, on, chunk=16):
    monkeypatch.setattr(tuning.rnn, "WAVEFRONT", on)
    monkeypatch.setattr(tuning.rnn, "WAVE_CHUNK", chunk)


def test_schedule_respects_the_dependences():
    from pydnn.ops.rnn.engine import wave_schedule
    for T, L, C in ((7, 3, 2), (5, 4, 1), (4, 2, 16), (12, 10, 1), (9, 3, 4)):
        at = {}
        for w, act in wave_schedule(T, L, C):
            assert [l for l, _, _ in act] == sorted({l for l, _, _ in act})
            for l, t, starts in act:
                assert (l, t) not in at
                at[(l, t)] = w
                assert starts == (t % C == 0)
        assert set(at) == {(l, t) for l in range(L) for t in range(T)}
        for (l, t), w in at.items():
            if t:
                assert at[(l, t - 1)] < w
            if l:  # the chunk input GEMM of layer l at its chunk start reads layer l - 1's whole chunk
                c0 = t - t % C
                assert all(at[(l - 1, s)] < at[(l, c0)] for s in range(c0, min(c0 + C, T)))


def test_planner_takes_the_wavefront_only_where_it_applies(monkeypatch):
    from pydnn.ops.rnn import engine
    _wave(monkeypatch, True)
    dev = rnn_emulator.Device()
    r = pydnn.create_rnn_descriptor()

    def setr(dirs=E.PYDNN_UNIDIRECTIONAL, layers=2, proj=8, mode=E.PYDNN_LINEAR_INPUT, drop=None, I=8):
        pydnn.set_rnn_descriptor_v8(r, 0, E.PYDNN_LSTM, E.PYDNN_RNN_DOUBLE_BIAS, dirs, mode, E.PYDNN_DATA_FLOAT,
                                    E.PYDNN_DATA_FLOAT, 0, I, 8, proj, layers, drop, 1)
        return engine.wavefront_ok(r)

    assert setr()
    assert not setr(dirs=E.PYDNN_BIDIRECTIONAL)
    assert not setr(layers=1)
    assert setr(proj=4)  # (LSTM projection stacks too)
    assert setr(mode=E.PYDNN_SKIP_INPUT)  # (layer 0's cells in a launch of their own)
    assert setr(drop=rnn_emulator.dropout_descriptor(dev, 0.2))  # (per chunk of rows)
    assert setr(drop=rnn_emulator.dropout_descriptor(dev, 0.0))
    _wave(monkeypatch, False)
    assert not setr()


@pytest.mark.parametrize("name", list(WAVE_CASES))
@pytest.mark.parametrize("on", [True, False], ids=["wave", "layers"])
def test_wavefront_on_emulated_device(name, on, monkeypatch):
    c, chunk = WAVE_CASES[name]
    _wave(monkeypatch, on, chunk)
    dev = rnn_emulator.Device()
    calls = rnn_emulator.install(monkeypatch, dev, c.dtype)
    h = rnn_emulator.fake_handle()
    run_case(h, dev, c)
    fwd = [v for k, v in h.prepared.items() if k[0] == "rnn.call" and k[1] == "_run_forward"]
    cells = [m for m in (it[5] for it in fwd[0]) if m[:2] == ("rnn", "fwd_cell")]
    if on:  # one cell launch per wave (groups of MAXY layers)
        from pydnn.ops.rnn import kernels as K
        C = min(chunk, c.T)
        waves = c.T + (c.layers - 1) * C
        # (SKIP_INPUT: layer 0's cells in a launch of their own)
        assert waves <= len(cells) <= waves * (-(-c.layers // K.MAXY) + c.skip)
        bwd = [v for k, v in h.prepared.items() if k[0] == "rnn.call" and k[1] == "_run_backward_data"][0]
        bcells = [it for it in bwd if it[5][:2] == ("rnn", "bwd_cell")]
        assert waves <= len(bcells) <= waves * -(-c.layers // K.MAXY)
        if C < c.T:  # (a chunk of all T steps: the layers one after the other)
            assert len(cells) < c.T * c.layers or c.skip
            assert any(it[1][1] > 1 for it in fwd[0] if it[5][:2] == ("rnn", "fwd_cell")) or c.layers == 2 and c.skip
            assert any(it[1][1] > 1 for it in bcells)
    else:
        assert len(cells) == c.T * c.layers
    assert calls


SPLIT_CASES = {  # 16-bit (split_k by block count), K = out of 32 / 64: SPLIT_MIN_K 16 splits it 2 to 4 ways
    "lstm-half-64-3layer-c2": (Case(dtype=E.PYDNN_DATA_HALF, hidden=64, input_size=8, layers=3, T=6,
                                    lengths=(6, 4, 6)), 2),
    "gru-half-32-2layer-c1": (Case(cell=E.PYDNN_GRU, dtype=E.PYDNN_DATA_HALF, hidden=32, input_size=16, layers=2), 1),
}


@pytest.mark.parametrize("name", list(SPLIT_CASES))
def test_wavefront_split_each_layer(name, monkeypatch):
    """WAVE_SPLIT: each layer's recurrent GEMM with split-K (SPLIT_MIN_K lowered so that it splits) in every
    wave, their partial sums read by one cell launch."""
    from pydnn.ops.rnn import engine
    monkeypatch.setattr(engine, "SPLIT_MIN_K", 16)
    monkeypatch.setattr(tuning.rnn, "WAVE_SPLIT", True)
    c, chunk = SPLIT_CASES[name]
    _wave(monkeypatch, True, chunk)
    dev = rnn_emulator.Device()
    calls = rnn_emulator.install(monkeypatch, dev, c.dtype)
    h = rnn_emulator.fake_handle()
    run_case(h, dev, c)
    fwd = [v for k, v in h.prepared.items() if k[0] == "rnn.call" and k[1] == "_run_forward"][0]
    assert any(it[4][2].nsplit > 1 for it in fwd if it[5][:2] == ("rnn", "fwd_cell") and it[1][1] > 1)
    assert calls


def test_wavefront_gemms_batch_over_layers(monkeypatch):
    """inputSize == hiddenSize: every pseudo-layer's weights a fixed distance apart, so each wave with several
    layers runs ONE recurrent GEMM batched over them, forward and backward."""
    c, chunk = WAVE_CASES["lstm-input-eq-hidden-c2"]
    _wave(monkeypatch, True, chunk)
    dev = rnn_emulator.Device()
    rnn_emulator.install(monkeypatch, dev, c.dtype)
    h = rnn_emulator.fake_handle()
    run_case(h, dev, c)
    for fn in ("_run_forward", "_run_backward_data"):
        items = [v for k, v in h.prepared.items() if k[0] == "rnn.call" and k[1] == fn][0]
        cells = [it[1][1] for it in items if it[5][0] == "rnn" and it[5][1] in ("fwd_cell", "bwd_cell")]
        gemms = [it[4][2].batch for it in items if it[5][0] == "gemm" and (it[4][2].m, it[4][2].k) in
                 ((3, 8), (3, 32))]  # the recurrent GEMMs: M = batch 3, K = out (forward) / G * H (backward)
        assert len(gemms) == len(cells) and sorted(gemms) == sorted(cells), fn


@pytest.mark.parametrize("name", ["lstm-3layer-c2", "gru-2layer-packed-c3"])
def test_wavefront_forward_only(name, monkeypatch):
    """WAVE_BWD off: the wavefront's forward, the layer order's backward on its reserve space."""
    monkeypatch.setattr(tuning.rnn, "WAVE_BWD", False)
    c, chunk = WAVE_CASES[name]
    _wave(monkeypatch, True, chunk)
    dev = rnn_emulator.Device()
    rnn_emulator.install(monkeypatch, dev, c.dtype)
    h = rnn_emulator.fake_handle()
    run_case(h, dev, c)
    bwd = [v for k, v in h.prepared.items() if k[0] == "rnn.call" and k[1] == "_run_backward_data"][0]
    assert len([it for it in bwd if it[5][:2] == ("rnn", "bwd_cell")]) == c.T * c.layers


@pytest.fixture(scope="module")
def host_lib(tmp_path_factory):
    import test_rnn_kernels_host_cpu as hk
    return hk.host_lib.__wrapped__(tmp_path_factory)


@pytest.mark.parametrize("name", ["lstm-3layer-c2", "gru-2layer-packed-c3", "gru-double-3layer-c1", "tanh-10layer-c1",
                                  "lstm-clip-half-c2", "lstm-skip-3layer-c2", "gru-skip-double-2layer-c1",
                                  "gru-dropout-3layer-c2"])
def test_wavefront_rnn_cu_on_the_host(name, host_lib, monkeypatch):
    """ptx/rnn.cu's fwd_cell with gridDim.y = the wave's layers (RnnDir2 entries 1 .. 7) run for real."""
    c, chunk = WAVE_CASES[name]
    _wave(monkeypatch, True, chunk)
    dev = rnn_emulator.Device()
    rnn_emulator.install(monkeypatch, dev, c.dtype, host_lib=host_lib)
    run_case(rnn_emulator.fake_handle(), dev, c)


def test_wavefront_workspace(monkeypatch):
    """Inference keeps every layer's states and the chunk buffers; the reserve space is the same either way."""
    from pydnn.ops.rnn import engine
    r = pydnn.create_rnn_descriptor()
    pydnn.set_rnn_descriptor_v8(r, 0, E.PYDNN_LSTM, E.PYDNN_RNN_DOUBLE_BIAS, 0, 0, E.PYDNN_DATA_HALF,
                                E.PYDNN_DATA_FLOAT, 0, 64, 64, 64, 3, None, 1)
    x = pydnn.create_rnn_data_descriptor()
    pydnn.set_rnn_data_descriptor(x, E.PYDNN_DATA_HALF, 0, 40, 8, 64, [40] * 8, None)
    _wave(monkeypatch, False)
    g0 = engine.Geometry(r, x, 132)
    _wave(monkeypatch, True, 16)
    g1 = engine.Geometry(r, x, 132)
    assert g1.wave and not g0.wave
    assert g1.reserve_size(True) == g0.reserve_size(True)
    assert g1.ws_inf.size > g0.ws_inf.size
    assert g1.ws_inf.off["xpw"] is not None and g1.ws_train.off["xpw"] is not None


def test_auto_split_decisions(monkeypatch):
    """WAVE_SPLIT None (auto, Geometry.wave_split): issue 16's 2-layer LSTM fp16 (B 64, H 1024) splits the
    backward's recurrent GEMMs (K 4096) but batches the forward's (split 2 for 2 layers); a 4-layer B 8 H 256
    stack batches both (4 layers, split 4: no K loop saved); True / False force it."""
    from pydnn.ops.rnn import engine
    _wave(monkeypatch, True, 16)
    monkeypatch.setattr(tuning.rnn, "WAVE_SPLIT", None)
    monkeypatch.setattr(tuning.rnn, "WAVE_BWD", True)

    def geo(B, H, L, cell=E.PYDNN_LSTM):
        r = pydnn.create_rnn_descriptor()
        pydnn.set_rnn_descriptor_v8(r, 0, cell, E.PYDNN_RNN_DOUBLE_BIAS, 0, 0, E.PYDNN_DATA_HALF,
                                    E.PYDNN_DATA_FLOAT, 0, H, H, H, L, None, 1)
        x = pydnn.create_rnn_data_descriptor()
        pydnn.set_rnn_data_descriptor(x, E.PYDNN_DATA_HALF, 0, 256, B, H, [256] * B, None)
        return engine.Geometry(r, x, 132)

    g = geo(64, 1024, 2)
    assert g.wave and g.split_b > 1 and g.wave_split_b == g.split_b
    assert not g.wave_split(64, 4096, 1024, max(g.split_f, 2), 2)
    g = geo(8, 256, 4)
    assert g.wave_split_b == 1 and not g.wave_split(8, 1024, 256, 2, 4)
    g = geo(16, 512, 2, E.PYDNN_GRU)  # backward K 1536 in 4 slices: split (measured 6.4 against 8.8 ms)
    assert g.split_b == 4 and g.wave_split_b == 4
    monkeypatch.setattr(tuning.rnn, "WAVE_SPLIT", True)
    assert geo(8, 256, 4).wave_split_b == geo(8, 256, 4).split_b > 1
    monkeypatch.setattr(tuning.rnn, "WAVE_SPLIT", False)
    assert geo(64, 1024, 2).wave_split_b == 1


def test_auto_wavefront_takes_small_steps(monkeypatch):
    """WAVEFRONT None (auto): the wavefront where a layer's step is at most WAVE_AUTO_MACS multiply-adds."""
    from pydnn.ops.rnn import engine
    monkeypatch.setattr(tuning.rnn, "WAVEFRONT", None)
    r = pydnn.create_rnn_descriptor()
    pydnn.set_rnn_descriptor_v8(r, 0, E.PYDNN_LSTM, E.PYDNN_RNN_DOUBLE_BIAS, 0, 0, E.PYDNN_DATA_HALF,
                                E.PYDNN_DATA_FLOAT, 0, 256, 256, 256, 4, None, 1)
    small = 8 * 4 * 256 * 256
    assert small <= engine.WAVE_AUTO_MACS
    assert engine.wavefront_ok(r, 8) and not engine.wavefront_ok(r)
    big = engine.WAVE_AUTO_MACS // (4 * 256 * 256) + 1
    assert not engine.wavefront_ok(r, big)


def test_dropout_wavefront_needs_byte_aligned_chunks(monkeypatch):
    """Dropout between layers in the wavefront: each chunk's mask bits start on a byte (B * out % 8 == 0), else
    the layer order."""
    from pydnn.ops.rnn import engine
    _wave(monkeypatch, True, 2)
    dev = rnn_emulator.Device()
    r = pydnn.create_rnn_descriptor()
    x = pydnn.create_rnn_data_descriptor()
    for B, H, ok in ((3, 8, True), (3, 5, False), (8, 5, True)):
        pydnn.set_rnn_descriptor_v8(r, 0, E.PYDNN_GRU, E.PYDNN_RNN_DOUBLE_BIAS, 0, 0, E.PYDNN_DATA_FLOAT,
                                    E.PYDNN_DATA_FLOAT, 0, 4, H, H, 2, rnn_emulator.dropout_descriptor(dev, 0.5), 1)
        pydnn.set_rnn_data_descriptor(x, E.PYDNN_DATA_FLOAT, 0, 5, B, 4, [5] * B, None)
        assert engine.Geometry(r, x, 132).wave == ok, (B, H)


def test_auto_backward_wavefront_takes_small_steps(monkeypatch):
    """WAVE_BWD None (auto): the backward wavefront where a layer's step is at most WAVE_AUTO_MACS multiply-adds
    (issue 16's B 64 H 1024 shapes keep the layer order's backward); True / False force it."""
    from pydnn.ops.rnn import engine
    _wave(monkeypatch, True, 16)
    monkeypatch.setattr(tuning.rnn, "WAVE_BWD", None)
    r = pydnn.create_rnn_descriptor()
    x = pydnn.create_rnn_data_descriptor()

    def geo(B, H):
        pydnn.set_rnn_descriptor_v8(r, 0, E.PYDNN_LSTM, E.PYDNN_RNN_DOUBLE_BIAS, 0, 0, E.PYDNN_DATA_FLOAT,
                                    E.PYDNN_DATA_FLOAT, 0, H, H, H, 2, None, 1)
        pydnn.set_rnn_data_descriptor(x, E.PYDNN_DATA_FLOAT, 0, 64, B, H, [64] * B, None)
        return engine.Geometry(r, x, 132)

    big, small = geo(64, 1024), geo(8, 256)
    assert big.wave and not big.wave_bwd and big.wave_split_b == 1
    assert small.wave and small.wave_bwd
    monkeypatch.setattr(tuning.rnn, "WAVE_BWD", True)
    assert geo(64, 1024).wave_bwd
    monkeypatch.setattr(tuning.rnn, "WAVE_BWD", False)
    assert not geo(8, 256).wave_bwd
