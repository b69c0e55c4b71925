"""The layer wavefront of LSTM projection stacks (projSize < hiddenSize; pydnn/ops/rnn/engine.py's _fwd_wavefront /
_bwd_wavefront) on the GPU: each case in three orders (the wavefront forward and backward data, the wavefront
forward with the layer order's backward (WAVE_BWD off), the layer order) through rnn_harness.run_case against the
float64 reference (poisoned outputs; forward in both modes, then both backward calls on the reserve space the
forward filled), and the wavefront's outputs against the layer order's within the data type's tolerance (not bit
for bit on the GPU: the chunked input projections and dx GEMMs have another M, for which matmul may choose another
kernel; test_rnn_wavefront_proj_cpu.py checks the bits on the emulated device). Odd sizes, varied lengths, hx / cx
NULL and not, dropout between layers (no cross-order comparison there: the wavefront draws its masks per chunk),
float, half, bfloat16 and double; plus PyTorch nn.LSTM(proj_size=...) (cuDNN) against the wavefront's forward."""
import os
import sys

import numpy as np
import pytest

import pydnn

from pydnn import enums as E
from pydnn import tuning

sys.path.insert(0, os.path.dirname(__file__))
from rnn_harness import Case, GpuDevice, _close, run_case  # noqa: E402

pytestmark = pytest.mark.gpu

F64, F16, F32, BF16 = E.PYDNN_DATA_DOUBLE, E.PYDNN_DATA_HALF, E.PYDNN_DATA_FLOAT, E.PYDNN_DATA_BFLOAT16
PACKED, BATCH_MAJOR = E.PYDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED, E.PYDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED
CASES = {  # (case, chunk)
    "half-proj-h100-p36-3layer-c4": (Case(dtype=F16, hidden=100, input_size=37, proj=36, layers=3, T=13,
                                          lengths=(13, 9, 13, 3, 7, 13, 1, 5)), 4),
    "float-proj-h72-p29-nostate-c3": (Case(dtype=F32, hidden=72, input_size=33, proj=29, layers=2, T=11,
                                           lengths=(11, 4, 9), states=False, fill=-1.5), 3),
    "double-proj-h9-p7-4layer-c1": (Case(dtype=F64, hidden=9, input_size=5, proj=7, layers=4, T=7,
                                         lengths=(7, 5, 2)), 1),
    "half-proj-dropout-3layer-c2": (Case(dtype=F16, hidden=64, input_size=16, proj=24, layers=3, dropout=0.3, T=9,
                                         lengths=(9, 8, 8, 2)), 2),
    "double-proj-dropout-packed-c3": (Case(dtype=F64, hidden=10, proj=8, layers=2, dropout=0.4, layout=PACKED, T=8,
                                           lengths=(8, 6, 3)), 3),
    "bf16-proj-batch-major-c2": (Case(dtype=BF16, hidden=48, input_size=20, proj=20, layers=2, T=10,
                                      layout=BATCH_MAJOR, lengths=(10, 10, 6, 1)), 2),
    "float-proj-clip-9layer-c1": (Case(dtype=F32, hidden=12, input_size=6, proj=5, layers=9, T=12,
                                       lengths=(12, 9), clip=(-0.4, 0.5)), 1),
    "double-proj-nostate-one-chunk-c16": (Case(dtype=F64, hidden=11, proj=3, layers=2, states=False, T=6,
                                               lengths=(6, 2, 5)), 16),
}
ORDERS = (("wave", True, True), ("wave-fwd-only", True, False), ("layers", False, False))


@pytest.mark.parametrize("name", list(CASES))
def test_proj_wavefront_against_reference_and_layer_order(name, handle, monkeypatch):
    c, chunk = CASES[name]
    monkeypatch.setattr(tuning.rnn, "WAVE_CHUNK", chunk)
    caps = {}
    for label, wave, bwd in ORDERS:
        monkeypatch.setattr(tuning.rnn, "WAVEFRONT", wave)
        monkeypatch.setattr(tuning.rnn, "WAVE_BWD", bwd)
        caps[label] = {}
        run_case(handle, GpuDevice(), c, capture=caps[label])
    if c.dropout:
        return
    ref = caps["layers"]
    for label in ("wave", "wave-fwd-only"):
        assert set(caps[label]) == set(ref)
        for k, v in caps[label].items():  # (values as float64; y / dx: the user layout, padding included)
            _close(np.nan_to_num(v, nan=0.0), np.nan_to_num(ref[k], nan=0.0), c.dtype, f"{label} {k} vs layers")


TORCH_CASES = {  # cell, I, H, layers, bidirectional, proj, dtype name, lengths (decreasing), chunk
    # fp16: y, hy, cy of the training forward
    "half-3layer-c1": ((E.PYDNN_LSTM, 96, 128, 3, False, 48, "float16", (40,) * 12 + (33, 20, 7, 1)), 1),
    "half-3layer-c16": ((E.PYDNN_LSTM, 96, 128, 3, False, 48, "float16", (40,) * 12 + (33, 20, 7, 1)), 16),
    # fp32: also dx, dhx, dcx and every weight gradient (the backward wavefront, WAVE_BWD on)
    "float-3layer-c2": ((E.PYDNN_LSTM, 24, 40, 3, False, 17, "float32", (9, 9, 6, 2)), 2),
}


@pytest.mark.parametrize("name", list(TORCH_CASES))
def test_proj_wavefront_matches_pytorch(name, handle, monkeypatch):
    """LSTM stacks with a projection against PyTorch's nn.LSTM(proj_size=...) (cuDNN), weights copied in through
    GetRNNWeightParams (test_rnn_gpu.py's _pytorch_case), run as the wavefront."""
    torch = pytest.importorskip("torch")
    from test_rnn_gpu import _pytorch_case
    case, chunk = TORCH_CASES[name]
    monkeypatch.setattr(tuning.rnn, "WAVEFRONT", True)
    monkeypatch.setattr(tuning.rnn, "WAVE_BWD", True)
    monkeypatch.setattr(tuning.rnn, "WAVE_CHUNK", chunk)
    flags = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    try:
        _pytorch_case(torch, case, handle)
    finally:
        pydnn.set_stream(handle, 0)
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = flags


@pytest.mark.parametrize("order", ["wave", "layers"])
@pytest.mark.parametrize("split", [2, 4])
def test_projection_split_k(split, order, handle, monkeypatch):
    """tuning.rnn.PROJ_SPLIT: the projection GEMM (K = hidden 64) in 2 / 4 K slices, proj_commit adding the partial
    sums; against the float64 reference in both orders (fp16, dropout-free, hx / cx given)."""
    c = Case(dtype=F16, hidden=64, input_size=24, proj=40, layers=3, T=10, lengths=(10, 7, 10, 2, 9))
    monkeypatch.setattr(tuning.rnn, "PROJ_SPLIT", split)
    monkeypatch.setattr(tuning.rnn, "WAVEFRONT", order == "wave")
    monkeypatch.setattr(tuning.rnn, "WAVE_BWD", True)
    monkeypatch.setattr(tuning.rnn, "WAVE_CHUNK", 3)
    run_case(handle, GpuDevice(), c)
