"""The layer wavefront (tuning.rnn.WAVEFRONT, pydnn/ops/rnn/engine.py's _fwd_wavefront) on the GPU: the same
cases in both orders (wavefront and layer after layer) against the float64 reference through rnn_harness.run_case
(poisoned outputs; forward in both modes, then both backward calls on the reserve space the forward filled;
RNNBackwardData_v8 as the wavefront too, tuning.rnn.WAVE_BWD, and without it),
in double (ptx/gemm_f64.cu), half and float; plus a PyTorch nn.LSTM (cuDNN) comparison of the wavefront's
forward at a multi-wave shape. First run: the mid-session H200 run of 2026-11-28 (all passed; CPU twin:
test_rnn_wavefront_cpu.py)."""
import os
import sys

import pytest

from pydnn import enums as E
from pydnn import tuning

sys.path.insert(0, os.path.dirname(__file__))
from rnn_harness import Case, GpuDevice, run_case  # noqa: E402

pytestmark = pytest.mark.gpu

F64, F16, F32 = E.PYDNN_DATA_DOUBLE, E.PYDNN_DATA_HALF, E.PYDNN_DATA_FLOAT
PACKED = E.PYDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED
CASES = {  # (case, chunk)
    "double-lstm-3layer-c2": (Case(dtype=F64, layers=3, T=7, lengths=(7, 5, 2)), 2),
    "double-gru-2layer-packed-c3": (Case(dtype=F64, cell=E.PYDNN_GRU, layers=2, layout=PACKED, T=8,
                                         lengths=(8, 6, 3)), 3),
    "double-tanh-10layer-c1": (Case(dtype=F64, cell=E.PYDNN_RNN_TANH, layers=10, T=12, lengths=(12, 9), hidden=4,
                                    input_size=3), 1),
    "double-lstm-clip-nostate-c1": (Case(dtype=F64, layers=2, clip=(-0.4, 0.5), states=False, fill=1.5), 1),
    "half-lstm-64-3layer-c4": (Case(dtype=F16, hidden=64, input_size=32, layers=3, T=12,
                                    lengths=(12, 9, 12, 3, 7, 12, 1, 5)), 4),
    "double-lstm-skip-3layer-c2": (Case(dtype=F64, skip=True, layers=3, T=6, lengths=(6, 3, 5)), 2),
    "double-gru-dropout-3layer-c2": (Case(dtype=F64, cell=E.PYDNN_GRU, layers=3, dropout=0.4, T=7,
                                          lengths=(7, 5, 2)), 2),
    "float-gru-96-2layer-c2": (Case(dtype=F32, cell=E.PYDNN_GRU, hidden=96, input_size=96, layers=2, T=9,
                                    lengths=(9, 8, 8, 2)), 2),
}


@pytest.mark.parametrize("on", [True, "fwd", False], ids=["wave", "wave-fwd-only", "layers"])
@pytest.mark.parametrize("name", list(CASES))
def test_wavefront_against_float64_reference(name, on, handle, monkeypatch):
    c, chunk = CASES[name]
    monkeypatch.setattr(tuning.rnn, "WAVEFRONT", bool(on))
    monkeypatch.setattr(tuning.rnn, "WAVE_BWD", on is True)
    monkeypatch.setattr(tuning.rnn, "WAVE_CHUNK", chunk)
    run_case(handle, GpuDevice(), c)


@pytest.mark.parametrize("chunk", [1, 16])
def test_wavefront_lstm_half_matches_pytorch(chunk, handle, monkeypatch):
    """3-layer LSTM fp16 (hidden 128, batch 16, T 40): y, hy, cy of the wavefront's training forward against
    PyTorch's nn.LSTM (cuDNN), weights copied in through GetRNNWeightParams."""
    torch = pytest.importorskip("torch")
    from test_rnn_gpu import _pytorch_case
    monkeypatch.setattr(tuning.rnn, "WAVEFRONT", True)
    monkeypatch.setattr(tuning.rnn, "WAVE_CHUNK", chunk)
    _pytorch_case(torch, (E.PYDNN_LSTM, 128, 128, 3, False, 0, "float16", (40,) * 12 + (33, 20, 7, 1)), handle)


@pytest.mark.parametrize("name", ["half-lstm-64-3layer-c4", "double-lstm-3layer-c2"])
def test_wavefront_split_each_layer(name, handle, monkeypatch):
    """WAVE_SPLIT: every wave's layers each with a split-K recurrent GEMM (SPLIT_MIN_K lowered: K = 64 / 8 in
    slices of 16 / ... where they divide), the cell launch adding each layer's partial sums."""
    from pydnn.ops.rnn import engine
    c, chunk = CASES[name]
    monkeypatch.setattr(engine, "SPLIT_MIN_K", 16)
    monkeypatch.setattr(tuning.rnn, "WAVEFRONT", True)
    monkeypatch.setattr(tuning.rnn, "WAVE_SPLIT", True)
    monkeypatch.setattr(tuning.rnn, "WAVE_CHUNK", chunk)
    run_case(handle, GpuDevice(), c)
