"""The double path against PyTorch on the CPU without a GPU: rnn_harness.pytorch_double_case (a float64
nn.LSTM / nn.GRU / nn.RNN's parameters copied in through GetRNNWeightParams; outputs, final states and every
gradient) on the emulated device with ptx/rnn.cu compiled for the host (test_rnn_kernels_host_cpu.py's
library) and the numpy GEMM; test_rnn_gpu.py runs the same function on the GPU."""
import os
import sys

import pytest

from pydnn import enums as E
from pydnn import tuning

sys.path.insert(0, os.path.dirname(__file__))
import rnn_emulator  # noqa: E402
from rnn_harness import pytorch_double_case  # noqa: E402
from test_rnn_gpu import DOUBLE_TORCH_CASES  # noqa: E402


@pytest.fixture(scope="module")
def host_lib(tmp_path_factory):
    import test_rnn_kernels_host_cpu as hk
    return hk.host_lib.__wrapped__(tmp_path_factory)


@pytest.mark.parametrize("wave", [False, True], ids=["layers", "wave"])
@pytest.mark.parametrize("case", DOUBLE_TORCH_CASES)
def test_pytorch_double_on_the_emulated_device(case, wave, host_lib, monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(tuning.rnn, "WAVEFRONT", wave)
    monkeypatch.setattr(tuning.rnn, "WAVE_CHUNK", 2)
    dev = rnn_emulator.Device()
    rnn_emulator.install(monkeypatch, dev, E.PYDNN_DATA_DOUBLE, host_lib=host_lib)
    pytorch_double_case(torch, case, rnn_emulator.fake_handle(), dev)
