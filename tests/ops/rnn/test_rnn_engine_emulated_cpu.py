"""The RNN engine's Python (pydnn/ops/rnn/engine.py: buffer layout, pointer arithmetic, the order of GEMMs
and kernels) run on a CPU emulation of the device (rnn_emulator.py: matmul's formula and each ptx/rnn.cu
kernel re-stated in numpy), against the float64 reference: forward (training and inference), backward
data, backward weights (ADD). The same harness runs on the GPU in test_rnn_gpu.py."""
from pydnn import tuning
import os
import sys

import pytest

from pydnn import enums as E

sys.path.insert(0, os.path.dirname(__file__))
import rnn_emulator  # noqa: E402
from rnn_harness import Case, run_case  # noqa: E402

CASES = {
    "lstm": Case(),
    "lstm-bi-2layer-nostate": Case(layers=2, dirs=2, states=False, lengths=(4, 2, 3), fill=-3.0),
    "lstm-proj-clip": Case(proj=5, clip=(-0.4, 0.5), layers=2, lengths=(4, 1, 3)),
    "lstm-proj-bi": Case(proj=3, dirs=2, layout=E.PYDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED, fill=2.0),
    "gru-bi-packed": Case(cell=E.PYDNN_GRU, dirs=2, layers=2, layout=E.PYDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED,
                          lengths=(4, 4, 2)),
    "gru-skip-rec-bias": Case(cell=E.PYDNN_GRU, skip=True, bias_mode=E.PYDNN_RNN_SINGLE_REC_BIAS, dirs=2),
    "relu-nobias": Case(cell=E.PYDNN_RNN_RELU, bias_mode=E.PYDNN_RNN_NO_BIAS, layers=2),
    "tanh-inp-bias-batch-major": Case(cell=E.PYDNN_RNN_TANH, bias_mode=E.PYDNN_RNN_SINGLE_INP_BIAS,
                                      layout=E.PYDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED, lengths=(1, 4, 2)),
    "lstm-skip-bi": Case(skip=True, dirs=2, layers=2),
    "lstm-half": Case(dtype=E.PYDNN_DATA_HALF, dirs=2),
    "gru-dropout-3layer-bi": Case(cell=E.PYDNN_GRU, layers=3, dirs=2, dropout=0.4),
    "lstm-proj-dropout-packed": Case(proj=5, layers=2, dropout=0.3, layout=E.PYDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED, lengths=(4, 3, 1)),
}
F64 = E.PYDNN_DATA_DOUBLE
DOUBLE_CASES = {  # the double path (ptx/gemm_f64.cu's GEMMs, double state): every cell, bias mode and layout
    "lstm-double-proj-clip": Case(dtype=F64, proj=5, clip=(-0.4, 0.5), layers=2, lengths=(4, 1, 3)),
    "lstm-double-bi-nostate": Case(dtype=F64, dirs=2, layers=2, states=False, lengths=(4, 2, 3), fill=-3.0),
    "gru-double-bi-packed": Case(dtype=F64, cell=E.PYDNN_GRU, dirs=2, layers=2,
                                 layout=E.PYDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED, lengths=(4, 4, 2)),
    "relu-double-skip-rec-bias-batch-major": Case(dtype=F64, cell=E.PYDNN_RNN_RELU, skip=True,
                                                  bias_mode=E.PYDNN_RNN_SINGLE_REC_BIAS,
                                                  layout=E.PYDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED, fill=2.0),
    "tanh-double-dropout-inp-bias": Case(dtype=F64, cell=E.PYDNN_RNN_TANH, layers=3, dropout=0.3,
                                         bias_mode=E.PYDNN_RNN_SINGLE_INP_BIAS),
    "lstm-double-proj-bi-nobias": Case(dtype=F64, proj=3, dirs=2, bias_mode=E.PYDNN_RNN_NO_BIAS),
}
CASES.update(DOUBLE_CASES)


@pytest.mark.parametrize("name", list(CASES))
def test_engine_on_emulated_device(name, monkeypatch):
    c = CASES[name]
    dev = rnn_emulator.Device()
    calls = rnn_emulator.install(monkeypatch, dev, c.dtype)
    h = rnn_emulator.fake_handle()
    run_case(h, dev, c)
    # four recorded calls (forward inference, forward training, backward data, backward weights); the
    # training forward ran twice, the second time as a replay of the first's launches
    recorded = {k[1]: v for k, v in h.prepared.items() if k[0] == "rnn.call"}
    assert sorted(recorded) == ["_run_backward_data", "_run_backward_weights", "_run_forward"]
    assert len([k for k in h.prepared if k[0] == "rnn.call"]) == 4
    fwd = [v for k, v in h.prepared.items() if k[0] == "rnn.call" and k[1] == "_run_forward" and k[4][0]]
    n = len(fwd[0])
    assert any(calls[i:i + n] == calls[i + n:i + 2 * n] for i in range(len(calls) - 2 * n + 1))


def test_engine_without_recording(monkeypatch):
    from pydnn.ops.rnn import engine
    monkeypatch.setattr(tuning.rnn, "RECORD", False)
    c = CASES["lstm-proj-clip"]
    dev = rnn_emulator.Device()
    rnn_emulator.install(monkeypatch, dev, c.dtype)
    h = rnn_emulator.fake_handle()
    run_case(h, dev, c)
    assert not [k for k in h.prepared if k[0] == "rnn.call"]


def test_checked_mode_compares_the_device_lengths(monkeypatch):
    """PYDNN_CHECKED=1: devSeqLengths is read back and must equal the descriptor's lengths."""
    import ctypes

    import numpy as np

    import pydnn
    from pydnn._cuda import driver
    from pydnn.ops.rnn import engine
    from pydnn.status import PydnnError

    dev = rnn_emulator.Device()
    rnn_emulator.install(monkeypatch, dev, E.PYDNN_DATA_FLOAT)
    monkeypatch.setattr(engine, "CHECKED", True)
    monkeypatch.setattr(driver, "memcpy_dtoh", lambda dst, src, n: ctypes.memmove(dst, src, n))  # host addresses
    h = rnn_emulator.fake_handle()
    r = pydnn.create_rnn_descriptor()
    pydnn.set_rnn_descriptor_v8(r, 0, E.PYDNN_GRU, E.PYDNN_RNN_DOUBLE_BIAS, 0, 0, E.PYDNN_DATA_FLOAT,
                                E.PYDNN_DATA_FLOAT, 0, 4, 4, 4, 1, None, 1)
    x, y = pydnn.create_rnn_data_descriptor(), pydnn.create_rnn_data_descriptor()
    pydnn.set_rnn_data_descriptor(x, E.PYDNN_DATA_FLOAT, 0, 3, 2, 4, [3, 2], None)
    pydnn.set_rnn_data_descriptor(y, E.PYDNN_DATA_FLOAT, 0, 3, 2, 4, [3, 2], None)
    hd = pydnn.create_tensor_descriptor()
    pydnn.set_tensor_nd_descriptor(hd, E.PYDNN_DATA_FLOAT, 3, [1, 2, 4], [8, 4, 1])
    wsize = pydnn.get_rnn_weight_space_size(h, r)
    ws, rs = pydnn.get_rnn_temp_space_sizes(h, r, 0, x)
    args = [dev.alloc(24 * 4), y, dev.alloc(24 * 4), hd, 0, 0, None, 0, 0, wsize, dev.alloc(wsize), ws, dev.alloc(ws),
            0, 0]
    lens = dev.alloc(8)
    for bad, word in (([3, 5], "devSeqLengths[1]: 5 differs"), ([0, 2], "outside [1, 3]")):
        dev.write(lens, np.array(bad, np.int32))
        with pytest.raises(PydnnError) as e:
            pydnn.rnn_forward(h, r, 0, lens, x, *args)
        assert e.value.status == E.PYDNN_STATUS_BAD_PARAM and word in str(e.value)
    dev.write(lens, np.array([3, 2], np.int32))
    pydnn.rnn_forward(h, r, 0, lens, x, *args)
