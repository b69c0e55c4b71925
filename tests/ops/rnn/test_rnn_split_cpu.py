"""The split-K choice of the STANDARD engine's per-step recurrent GEMMs (pydnn/ops/rnn/engine.py split_k): for
float the blocks are counted with the CUDA-core tile matmul's chooser takes, so issue 16's fp32 LSTM (batch
64, hidden 1024, 132 SMs) fills the SMs (forward 4 slices of 32 tiles, backward 16 of 8); half / bfloat16
keep their 64 x 64 count; a float problem run with 16 slices on the emulated device matches the reference."""
import os
import sys

from pydnn import enums as E
from pydnn.ops import matmul
from pydnn.ops.rnn import engine

sys.path.insert(0, os.path.dirname(__file__))
import rnn_emulator  # noqa: E402
from rnn_harness import Case, run_case  # noqa: E402


def test_float_split_fills_the_sms():
    f, b = engine.split_k(64, 4096, 1024, 132, True), engine.split_k(64, 1024, 4096, 132, True)
    assert (f, b) == (4, 16)
    for m, n, k, s in ((64, 4096, 1024, f), (64, 1024, 4096, b)):
        t = matmul._choose_simt_tile(m, n, s, 132, k // s)
        blocks = -(-m // t.bm) * -(-n // t.bn) * s
        assert 66 < blocks <= 132 and k // s >= engine.SPLIT_MIN_K


def test_half_split_unchanged():
    assert (engine.split_k(64, 4096, 1024, 132), engine.split_k(64, 1024, 4096, 132)) == (2, 8)


def test_float_split_16_on_the_emulated_device(monkeypatch):
    monkeypatch.setattr(engine, "SPLIT_MIN_K", 1)
    c = Case(hidden=32, input_size=5, lengths=(4, 3, 4), T=4, dirs=2)
    assert engine.split_k(3, 32, 128, 132, True) == 16
    dev = rnn_emulator.Device()
    calls = rnn_emulator.install(monkeypatch, dev, E.PYDNN_DATA_FLOAT)
    run_case(rnn_emulator.fake_handle(), dev, c)
    assert any(m[0] == "gemm" for m in calls)
