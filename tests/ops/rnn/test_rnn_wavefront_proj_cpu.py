"""The layer wavefront of LSTM projection stacks (projSize < hiddenSize; pydnn/ops/rnn/engine.py's _fwd_wavefront /
_bwd_wavefront) on the CPU: the engine's real Python on the emulated device (numpy kernels, and ptx/rnn.cu itself
compiled for the host) against the float64 reference in both orders; per wave one cell, one projection GEMM per run
of layers and one proj_commit launch (forward), one bwd_proj_pre, projection GEMM, bwd_cell (backward); and the
wavefront's results bit for bit those of the layer order where the arithmetic is the same (no split-K, no dropout:
only the grouping of the launches differs; the emulated GEMM row by row, so that a row's bits do not depend on the
GEMM's M, as the chunked input projections and dx GEMMs change M). GPU twin: test_rnn_wavefront_proj_gpu.py."""
import os
import sys

import numpy as np
import pytest

import pydnn
from pydnn import enums as E
from pydnn import tuning

sys.path.insert(0, os.path.dirname(__file__))
import rnn_emulator  # noqa: E402
from rnn_harness import Case, run_case  # noqa: E402

F16, F64, BF16 = E.PYDNN_DATA_HALF, E.PYDNN_DATA_DOUBLE, E.PYDNN_DATA_BFLOAT16
PACKED, BATCH_MAJOR = E.PYDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED, E.PYDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED
PROJ_CASES = {  # (case, chunk): LSTM, proj < hidden (8 unless given)
    "proj5-3layer-c2": (Case(layers=3, proj=5, T=7, lengths=(7, 5, 2)), 2),
    "proj3-2layer-c1-nostate": (Case(layers=2, proj=3, states=False, lengths=(4, 2, 3), fill=-3.0), 1),
    "proj6-half-clip-c2": (Case(dtype=F16, layers=2, proj=6, clip=(-0.4, 0.5), T=6, lengths=(6, 6, 1)), 2),
    "proj4-double-4layer-c1": (Case(dtype=F64, layers=4, proj=4, T=6, lengths=(6, 3, 5)), 1),
    "proj5-input-eq-proj-3layer-c2": (Case(layers=3, proj=5, input_size=5, T=6, lengths=(6, 4, 6)), 2),  # one run
    "proj7-bf16-packed-c3": (Case(dtype=BF16, layers=2, proj=7, layout=PACKED, T=8, lengths=(8, 6, 3)), 3),  # host
    "proj5-batch-major-inp-bias-c2": (Case(layers=3, proj=5, bias_mode=E.PYDNN_RNN_SINGLE_INP_BIAS,
                                           layout=BATCH_MAJOR, lengths=(1, 4, 2)), 2),
    "proj3-9layer-c1": (Case(layers=9, proj=3, hidden=4, input_size=3, T=12, lengths=(12, 9)), 1),  # MAXY groups
    "proj8-dropout-3layer-c2": (Case(layers=3, hidden=12, proj=8, dropout=0.4, T=7, lengths=(7, 5, 2)), 2),  # B * P % 8 == 0
    "proj5-skip-3layer-c2": (Case(skip=True, layers=3, proj=5, T=6, lengths=(6, 3, 5)), 2),
    "proj4-one-chunk-c16": (Case(layers=2, proj=4, T=5, lengths=(5, 2, 4)), 16),  # the layers one after the other
}


def _wave(monkeypatch, on, chunk=16, bwd=True):
    monkeypatch.setattr(tuning.rnn, "WAVEFRONT", on)
    monkeypatch.setattr(tuning.rnn, "WAVE_CHUNK", chunk)
    monkeypatch.setattr(tuning.rnn, "WAVE_BWD", bwd)


def _items(h, fn):
    return [v for k, v in h.prepared.items() if k[0] == "rnn.call" and k[1] == fn][0]


def _kernels(items, name):
    return [it for it in items if it[5][:2] == ("rnn", name)]


def test_planner_takes_projection_stacks(monkeypatch):
    from pydnn.ops.rnn import engine
    _wave(monkeypatch, True)
    r = pydnn.create_rnn_descriptor()

    def setr(dirs=E.PYDNN_UNIDIRECTIONAL, layers=2, proj=4, algo=E.PYDNN_RNN_ALGO_STANDARD):
        pydnn.set_rnn_descriptor_v8(r, algo, E.PYDNN_LSTM, E.PYDNN_RNN_DOUBLE_BIAS, dirs, E.PYDNN_LINEAR_INPUT,
                                    E.PYDNN_DATA_FLOAT, E.PYDNN_DATA_FLOAT, 0, 8, 8, proj, layers, None, 1)
        return engine.wavefront_ok(r, 4)

    assert setr()
    assert not setr(dirs=E.PYDNN_BIDIRECTIONAL)
    assert not setr(layers=1)
    # WAVEFRONT None (auto): a step's multiply-adds count the projection's (B * H * P) too
    monkeypatch.setattr(tuning.rnn, "WAVEFRONT", None)
    setr()
    assert engine.step_macs(r, 4) == 4 * (4 + 1) * 8 * 4
    pydnn.set_rnn_descriptor_v8(r, 0, E.PYDNN_LSTM, E.PYDNN_RNN_DOUBLE_BIAS, 0, 0, E.PYDNN_DATA_HALF,
                                E.PYDNN_DATA_FLOAT, 0, 1024, 1024, 512, 2, None, 1)
    # the bench's 2-layer proj LSTM (B 64, H 1024, P 512): 5 * 2^25 multiply-adds a step, not auto
    assert engine.step_macs(r, 64) == 5 * engine.WAVE_AUTO_MACS and not engine.wavefront_ok(r, 64)
    assert engine.wavefront_ok(r, 12) and not engine.wavefront_ok(r, 13)  # 12 * 5 * 2^19 <= 2^25 < 13 * ...


def test_projection_workspace(monkeypatch):
    """The wavefront keeps m (inference), hn and dm per layer; the reserve space is the same either way."""
    from pydnn.ops.rnn import engine
    r = pydnn.create_rnn_descriptor()
    pydnn.set_rnn_descriptor_v8(r, 0, E.PYDNN_LSTM, E.PYDNN_RNN_DOUBLE_BIAS, 0, 0, E.PYDNN_DATA_HALF,
                                E.PYDNN_DATA_FLOAT, 0, 64, 128, 32, 3, None, 1)
    x = pydnn.create_rnn_data_descriptor()
    pydnn.set_rnn_data_descriptor(x, E.PYDNN_DATA_HALF, 0, 40, 8, 64, [40] * 8, None)
    _wave(monkeypatch, False)
    g0 = engine.Geometry(r, x, 132)
    _wave(monkeypatch, True, 16)
    g1 = engine.Geometry(r, x, 132)
    assert g1.wave and not g0.wave
    assert g1.reserve_size(True) == g0.reserve_size(True)
    for w0, w1, names in ((g0.ws_inf, g1.ws_inf, ("hn", "m")), (g0.ws_train, g1.ws_train, ("hn", "dm"))):
        for n in names:
            nxt = lambda w, n=n: min([o for o in w.off.values() if o > w.off[n]] + [w.size])  # noqa: E731
            assert nxt(w1) - w1.off[n] >= 3 * (nxt(w0) - w0.off[n]) > 0, n


NUMPY_CASES = [n for n, (c, _) in PROJ_CASES.items() if c.dtype != BF16]  # (bf16: the host-compiled kernels only)


@pytest.mark.parametrize("name", NUMPY_CASES)
@pytest.mark.parametrize("on", [True, False], ids=["wave", "layers"])
def test_proj_wavefront_on_emulated_device(name, on, monkeypatch):
    from pydnn.ops.rnn import kernels as K
    c, chunk = PROJ_CASES[name]
    _wave(monkeypatch, on, chunk)
    dev = rnn_emulator.Device()
    rnn_emulator.install(monkeypatch, dev, c.dtype)
    h = rnn_emulator.fake_handle()
    run_case(h, dev, c)
    fwd, bwd = _items(h, "_run_forward"), _items(h, "_run_backward_data")
    cells, commits = _kernels(fwd, "fwd_cell"), _kernels(fwd, "proj_commit")
    bcells, pres = _kernels(bwd, "bwd_cell"), _kernels(bwd, "bwd_proj_pre")
    # the projection GEMMs: forward [B, P] = m [B, H] x P^T (k = H), backward dm [B, H] = dh [B, P] x P (k = P)
    B, H, P = len(c.lengths), c.hidden, c.proj
    fproj = [it[4][2] for it in fwd if it[5][0] == "gemm" and it[5][3:] == (B, P, H)]
    bproj = [it[4][2] for it in bwd if it[5][0] == "gemm" and it[5][3:] == (B, H, P)]
    wave = on and not (c.dropout and B * P % 8)
    if wave:
        C = min(chunk, c.T)
        waves = c.T + (c.layers - 1) * C
        groups = -(-c.layers // K.MAXY)
        assert waves <= len(commits) <= waves * groups  # one proj_commit launch per wave (and group of MAXY)
        assert waves <= len(cells) <= waves * (groups + c.skip)
        assert waves <= len(pres) == len(bcells) <= waves * groups
        # every layer-step projected once: the GEMMs' batches add up to L * T
        assert sum(p.batch for p in fproj) == sum(p.batch for p in bproj) == c.layers * c.T
        assert sum(it[1][1] for it in commits) == sum(it[1][1] for it in pres) == c.layers * c.T
        if C < c.T:
            assert any(it[1][1] > 1 for it in commits) and any(it[1][1] > 1 for it in pres)
    else:
        assert len(cells) == len(commits) == len(bcells) == len(pres) == len(fproj) == len(bproj) == c.T * c.layers


def test_proj_gemms_batch_over_layers(monkeypatch):
    """inputSize == projSize: every pseudo-layer's weights a fixed distance apart, so each wave with several layers
    runs ONE projection GEMM batched over them (forward and backward), like the recurrent GEMMs."""
    c, chunk = PROJ_CASES["proj5-input-eq-proj-3layer-c2"]
    _wave(monkeypatch, True, chunk)
    dev = rnn_emulator.Device()
    rnn_emulator.install(monkeypatch, dev, c.dtype)
    h = rnn_emulator.fake_handle()
    run_case(h, dev, c)
    B, H, P = len(c.lengths), c.hidden, c.proj
    for fn, cell, shape in (("_run_forward", "proj_commit", (B, P, H)), ("_run_backward_data", "bwd_proj_pre",
                                                                          (B, H, P))):
        items = _items(h, fn)
        grid_y = [it[1][1] for it in _kernels(items, cell)]
        batches = [it[4][2].batch for it in items if it[5][0] == "gemm" and it[5][3:] == shape]
        assert batches == grid_y and max(batches) == 3, fn


def _compare_orders(monkeypatch, c, chunk, host_lib=None):
    """Both orders of one case on fresh emulated devices (the same inputs): every output's bits equal."""
    monkeypatch.setattr(rnn_emulator, "ROWWISE", True)
    caps = []
    for on in (True, False):
        _wave(monkeypatch, on, chunk)
        dev = rnn_emulator.Device()
        rnn_emulator.install(monkeypatch, dev, c.dtype, host_lib=host_lib)
        h = rnn_emulator.fake_handle()
        cap = {}
        run_case(h, dev, c, capture=cap)
        caps.append(cap)
        fwd = _items(h, "_run_forward")
        # (the wavefront ran: grouped cell launches; the layer order: one per layer and step)
        assert (max(it[1][1] for it in _kernels(fwd, "fwd_cell")) > 1) == (on and min(chunk, c.T) < c.T)
    wave, layers = caps
    assert set(wave) == set(layers) and "dw" in wave
    for k in wave:
        a, b = np.ascontiguousarray(wave[k]), np.ascontiguousarray(layers[k])
        assert a.shape == b.shape and np.array_equal(a.view(np.uint8), b.view(np.uint8)), k


BITWISE = ["proj5-3layer-c2", "proj3-2layer-c1-nostate", "proj6-half-clip-c2", "proj4-double-4layer-c1",
           "proj5-input-eq-proj-3layer-c2", "proj3-9layer-c1", "proj5-skip-3layer-c2", "proj4-one-chunk-c16"]


@pytest.mark.parametrize("name", BITWISE)
def test_proj_wavefront_bitwise_equals_layer_order(name, monkeypatch):
    c, chunk = PROJ_CASES[name]
    _compare_orders(monkeypatch, c, chunk)


@pytest.mark.parametrize("name", ["lstm-3layer-c2", "gru-2layer-packed-c3", "tanh-10layer-c1", "lstm-skip-3layer-c2"])
def test_plain_wavefront_bitwise_equals_layer_order(name, monkeypatch):
    """The same for stacks without a projection (test_rnn_wavefront_cpu.py's cases, no split-K at these sizes)."""
    from test_rnn_wavefront_cpu import WAVE_CASES
    c, chunk = WAVE_CASES[name]
    _compare_orders(monkeypatch, c, chunk)


@pytest.fixture(scope="module")
def host_lib(tmp_path_factory):
    import test_rnn_kernels_host_cpu as hk
    return hk.host_lib.__wrapped__(tmp_path_factory)


@pytest.mark.parametrize("name", ["proj5-3layer-c2", "proj6-half-clip-c2", "proj4-double-4layer-c1",
                                  "proj7-bf16-packed-c3", "proj3-9layer-c1", "proj8-dropout-3layer-c2",
                                  "proj5-skip-3layer-c2"])
def test_proj_wavefront_rnn_cu_on_the_host(name, host_lib, monkeypatch):
    """ptx/rnn.cu's proj_commit / bwd_proj_pre / fwd_cell / bwd_cell with gridDim.y = the wave's layers (RnnDir2's
    dm, aux, aux_in offsets) run for real, against the reference."""
    c, chunk = PROJ_CASES[name]
    _wave(monkeypatch, True, chunk)
    dev = rnn_emulator.Device()
    rnn_emulator.install(monkeypatch, dev, c.dtype, host_lib=host_lib)
    run_case(rnn_emulator.fake_handle(), dev, c)


@pytest.mark.parametrize("name", ["proj5-3layer-c2", "proj6-half-clip-c2", "proj7-bf16-packed-c3"])
def test_proj_wavefront_bitwise_on_the_host(name, host_lib, monkeypatch):
    c, chunk = PROJ_CASES[name]
    _compare_orders(monkeypatch, c, chunk, host_lib=host_lib)


@pytest.mark.parametrize("name", ["proj5-3layer-c2", "proj8-dropout-3layer-c2"])
def test_proj_wavefront_forward_only(name, monkeypatch):
    """WAVE_BWD off: the wavefront's forward, the layer order's backward on its reserve space."""
    c, chunk = PROJ_CASES[name]
    _wave(monkeypatch, True, chunk, bwd=False)
    dev = rnn_emulator.Device()
    rnn_emulator.install(monkeypatch, dev, c.dtype)
    h = rnn_emulator.fake_handle()
    run_case(h, dev, c)
    bwd = _items(h, "_run_backward_data")
    assert len(_kernels(bwd, "bwd_proj_pre")) == len(_kernels(bwd, "bwd_cell")) == c.T * c.layers
    assert max(it[1][1] for it in _kernels(_items(h, "_run_forward"), "proj_commit")) > 1


def test_proj_wavefront_split_each_layer(monkeypatch):
    """WAVE_SPLIT: each layer's recurrent GEMM split-K (SPLIT_MIN_K lowered; K = proj 32 forward, G * H 256
    backward) in every wave; the cell launch (forward) and bwd_proj_pre (backward) add the partial sums."""
    from pydnn.ops.rnn import engine
    monkeypatch.setattr(engine, "SPLIT_MIN_K", 16)
    monkeypatch.setattr(tuning.rnn, "WAVE_SPLIT", True)
    c = Case(dtype=F16, hidden=64, input_size=8, proj=32, layers=3, T=6, lengths=(6, 4, 6))
    _wave(monkeypatch, True, 2)
    dev = rnn_emulator.Device()
    rnn_emulator.install(monkeypatch, dev, c.dtype)
    h = rnn_emulator.fake_handle()
    run_case(h, dev, c)
    fwd, bwd = _items(h, "_run_forward"), _items(h, "_run_backward_data")
    assert any(it[4][2].nsplit > 1 for it in _kernels(fwd, "fwd_cell") if it[1][1] > 1)
    assert any(it[4][2].nsplit > 1 for it in _kernels(bwd, "bwd_proj_pre") if it[1][1] > 1)


SPLIT_P_CASES = {  # tuning.rnn.PROJ_SPLIT: the projection GEMM (K = hidden 64) in 2 / 4 slices
    "half-64-p24-3layer-s4-c2": (Case(dtype=F16, hidden=64, input_size=8, proj=24, layers=3, T=6, lengths=(6, 4, 6)),
                                 2, 4),
    "double-32-p5-2layer-s2-c1": (Case(dtype=F64, hidden=32, input_size=5, proj=5, layers=2, T=5, lengths=(5, 2, 4),
                                       states=False), 1, 2),
}


@pytest.mark.parametrize("name", list(SPLIT_P_CASES))
@pytest.mark.parametrize("on", [True, False], ids=["wave", "layers"])
def test_projection_split_k(name, on, monkeypatch):
    """PROJ_SPLIT: one split-K projection GEMM per layer and step (batch = the slices, K = hidden / slices), whose
    partial sums proj_commit adds; against the reference in both orders."""
    c, chunk, sp = SPLIT_P_CASES[name]
    monkeypatch.setattr(tuning.rnn, "PROJ_SPLIT", sp)
    _wave(monkeypatch, on, chunk)
    dev = rnn_emulator.Device()
    rnn_emulator.install(monkeypatch, dev, c.dtype)
    h = rnn_emulator.fake_handle()
    run_case(h, dev, c)
    fwd = _items(h, "_run_forward")
    B, H, P = len(c.lengths), c.hidden, c.proj
    proj = [it[4][2] for it in fwd if it[5][0] == "gemm" and it[5][3:] == (B, P, H // sp)]
    assert len(proj) == c.layers * c.T and all(q.batch == sp for q in proj)
    assert all(it[4][2].nsplit == sp for it in _kernels(fwd, "proj_commit"))


@pytest.mark.parametrize("name", list(SPLIT_P_CASES))
def test_projection_split_k_bitwise_on_the_host(name, host_lib, monkeypatch):
    """With PROJ_SPLIT both orders run the same per-layer split GEMMs: the wavefront's bits are the layer order's
    (ptx/rnn.cu's proj_commit adding the partial sums, compiled for the host)."""
    c, chunk, sp = SPLIT_P_CASES[name]
    monkeypatch.setattr(tuning.rnn, "PROJ_SPLIT", sp)
    _compare_orders(monkeypatch, c, chunk, host_lib=host_lib)


def test_projection_split_choice(monkeypatch):
    """PROJ_SPLIT None (auto): split_k's block-count rule, 4 slices at the bench's B 64, H 1024, P 512 (8 output
    tiles on 132 SMs); 1 where K = hidden is short or does not divide; an explicit count only where it divides."""
    from pydnn.ops.rnn import engine
    r = pydnn.create_rnn_descriptor()
    x = pydnn.create_rnn_data_descriptor()

    def split(H, P, B=64, v=None):
        monkeypatch.setattr(tuning.rnn, "PROJ_SPLIT", v)
        pydnn.set_rnn_descriptor_v8(r, 0, E.PYDNN_LSTM, E.PYDNN_RNN_DOUBLE_BIAS, 0, 0, E.PYDNN_DATA_HALF,
                                    E.PYDNN_DATA_FLOAT, 0, 64, H, P, 2, None, 1)
        pydnn.set_rnn_data_descriptor(x, E.PYDNN_DATA_HALF, 0, 8, B, 64, [8] * B, None)
        return engine.Geometry(r, x, 132).split_p

    assert split(1024, 512) == 4
    assert split(256, 128) == 1 and split(1000, 512) == 1  # K 256: slices under SPLIT_MIN_K; 1000 % 32
    assert split(1024, 1024) == 1  # (no projection)
    assert split(1024, 512, v=1) == 1 and split(1024, 512, v=8) == 8 and split(1000, 512, v=8) == 1


def test_auto_backward_wavefront_takes_projection_stacks(monkeypatch):
    """WAVE_BWD None (auto): projection stacks' backward as the wavefront at any step size (the bench's B 64 H 1024
    P 512: 14.7 ms against 18.7 layer after layer on the H200), plain stacks only where the step is small."""
    from pydnn.ops.rnn import engine
    _wave(monkeypatch, True, 16, bwd=None)
    r = pydnn.create_rnn_descriptor()
    x = pydnn.create_rnn_data_descriptor()

    def geo(P):
        pydnn.set_rnn_descriptor_v8(r, 0, E.PYDNN_LSTM, E.PYDNN_RNN_DOUBLE_BIAS, 0, 0, E.PYDNN_DATA_HALF,
                                    E.PYDNN_DATA_FLOAT, 0, 1024, 1024, P, 2, None, 1)
        pydnn.set_rnn_data_descriptor(x, E.PYDNN_DATA_HALF, 0, 64, 64, 1024, [64] * 64, None)
        return engine.Geometry(r, x, 132)

    assert geo(512).wave_bwd and geo(512).split_p == 4  # (PROJ_SPLIT's default: auto)
    assert geo(1024).wave and not geo(1024).wave_bwd
    monkeypatch.setattr(tuning.rnn, "WAVE_BWD", False)
    assert not geo(512).wave_bwd
