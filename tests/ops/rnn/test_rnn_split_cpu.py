"""The split-K choice of the STANDARD engine's per-step recurrent GEMMs (pydnn/ops/rnn/engine.py split_k): for
float (tuning.rnn.SPLIT_F32_TIME, default) the split with the least estimated time, which for issue 16's fp32
LSTM (batch 64, hidden 1024, 132 SMs) is forward 8 slices and backward 32 on 64 x 128 tiles (no tile row past
the batch, every SM busy, at most 3 blocks an SM); with the switch off the blocks are counted with the tile
matmul's chooser takes (forward 4 slices of 32 tiles, backward 16 of 8); half / bfloat16 keep their 64 x 64
count; float problems run with 16 and 32 slices on the emulated device match the reference."""
import pytest

import os
import sys

from pydnn import enums as E
from pydnn import tuning
from pydnn.ops import matmul
from pydnn.ops.rnn import engine

sys.path.insert(0, os.path.dirname(__file__))
import rnn_emulator  # noqa: E402
from rnn_harness import Case, run_case  # noqa: E402


def test_float_split_by_time():
    f, b = engine.split_k(64, 4096, 1024, 132, True), engine.split_k(64, 1024, 4096, 132, True)
    assert (f, b) == (8, 32)
    for m, n, k, s in ((64, 4096, 1024, f), (64, 1024, 4096, b)):
        t = matmul._choose_simt_tile(m, n, s, 132, k // s)
        assert (t.bm, t.bn) == (64, 128)  # no row of a tile past the batch
        blocks = -(-m // t.bm) * -(-n // t.bn) * s
        assert 132 < blocks <= t.per_sm * 132 and k // s >= engine.SPLIT_MIN_K_F32_TIME
        # cheaper than the fill-the-SMs choice by the estimate, by more than the partial sums it adds
        old = 4 if n == 4096 else 16
        assert engine._f32_split_cost(m, n, k, s, 132) < 0.8 * engine._f32_split_cost(m, n, k, old, 132)
    # the choice stays within the switch's bounds for other shapes (a divisor, K slices >= 128)
    for m, n, k in ((32, 1024, 256), (64, 3072, 1024), (64, 1024, 3072), (1, 64, 64), (256, 8192, 2048)):
        s = engine.split_k(m, n, k, 132, True)
        assert s == 1 or (k % (16 * s) == 0 and k // s >= engine.SPLIT_MIN_K_F32_TIME and s <= 32)


def test_float_split_fills_the_sms(monkeypatch):
    monkeypatch.setattr(tuning.rnn, "SPLIT_F32_TIME", False)
    f, b = engine.split_k(64, 4096, 1024, 132, True), engine.split_k(64, 1024, 4096, 132, True)
    assert (f, b) == (4, 16)
    for m, n, k, s in ((64, 4096, 1024, f), (64, 1024, 4096, b)):
        t = matmul._choose_simt_tile(m, n, s, 132, k // s)
        blocks = -(-m // t.bm) * -(-n // t.bn) * s
        assert 66 < blocks <= 132 and k // s >= engine.SPLIT_MIN_K


def test_half_split_unchanged():
    assert (engine.split_k(64, 4096, 1024, 132), engine.split_k(64, 1024, 4096, 132)) == (2, 8)


@pytest.mark.parametrize("by_time", [False, True])
def test_float_split_16_on_the_emulated_device(monkeypatch, by_time):
    monkeypatch.setattr(tuning.rnn, "SPLIT_F32_TIME", by_time)
    monkeypatch.setattr(engine, "SPLIT_MIN_K", 1)
    monkeypatch.setattr(engine, "SPLIT_MIN_K_F32_TIME", 4)
    monkeypatch.setattr(engine, "F32_PART_COST", 0)  # the estimate then takes the most slices
    c = Case(hidden=32, input_size=5, lengths=(4, 3, 4), T=4, dirs=2)
    assert engine.split_k(3, 32, 128, 132, True) == (8 if by_time else 16)
    assert not by_time or engine.split_k(3, 128, 32 * 4, 132, True) == 8
    dev = rnn_emulator.Device()
    calls = rnn_emulator.install(monkeypatch, dev, E.PYDNN_DATA_FLOAT)
    run_case(rnn_emulator.fake_handle(), dev, c)
    assert any(m[0] == "gemm" for m in calls)


def test_forced_float_forward_split(monkeypatch):
    """tuning.rnn.SPLIT_F32_FWD (measurements) sets the float forward's split where it divides K in 16s; the
    backward's stays split_k's; half keeps its own."""
    from pydnn.ops.rnn.descriptors import set_data, set_rnn
    import pydnn

    def geom(dt, H=1024, B=64):
        r = pydnn.create_rnn_descriptor()
        pydnn.set_rnn_descriptor_v8(r, E.PYDNN_RNN_ALGO_STANDARD, E.PYDNN_LSTM, E.PYDNN_RNN_DOUBLE_BIAS,
                                    E.PYDNN_UNIDIRECTIONAL, E.PYDNN_LINEAR_INPUT, dt, E.PYDNN_DATA_FLOAT,
                                    E.PYDNN_DEFAULT_MATH, H, H, H, 1, None, 1)
        x = pydnn.create_rnn_data_descriptor()
        pydnn.set_rnn_data_descriptor(x, dt, 0, 4, B, H, [4] * B, None)
        return engine.Geometry(set_rnn(r), set_data(x, "x"), 132)

    g = geom(E.PYDNN_DATA_FLOAT)
    assert (g.split_f, g.split_b) == (8, 32)
    monkeypatch.setattr(tuning.rnn, "SPLIT_F32_FWD", 16)
    g = geom(E.PYDNN_DATA_FLOAT)
    assert (g.split_f, g.split_b) == (16, 32)
    assert geom(E.PYDNN_DATA_FLOAT, H=128).split_f != 16  # 128 is not 16 * 16
    assert geom(E.PYDNN_DATA_HALF).split_f == 2
