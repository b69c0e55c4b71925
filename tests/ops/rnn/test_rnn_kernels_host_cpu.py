"""ptx/rnn.cu's own source, compiled for the host with g++ (host_shim/: CUDA builtins and the type helpers
on the CPU; a kernel runs once per (block, thread) in order) and driven by the engine's real Python on the
emulated device (rnn_emulator.py: numpy GEMM, real host addresses), against the float64 reference: the
kernels' index math and arithmetic are checked without a GPU, for float, half and bfloat16."""
import ctypes
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pydnn import enums as E
from pydnn import tuning

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import rnn_emulator  # noqa: E402
from rnn_harness import Case, run_case  # noqa: E402
from test_rnn_engine_emulated_cpu import CASES  # noqa: E402

CXX = shutil.which("g++") or shutil.which("c++")


@pytest.fixture(scope="module")
def host_lib(tmp_path_factory):
    if CXX is None:
        pytest.skip("no C++ compiler")
    d = tmp_path_factory.mktemp("rnn_host")
    ptx = HERE.parents[2] / "ptx"
    (d / "common").mkdir()
    for f in ("rnn.cu", "rnn_params.h"):
        shutil.copy(ptx / f, d / f)
    for f in ("types.cuh", "h16.cuh"):
        shutil.copy(HERE / "host_shim" / "common" / f, d / "common" / f)
    shutil.copy(HERE / "host_shim" / "rnn_host.cpp", d / "rnn_host.cpp")
    so = d / "rnn_host.so"
    r = subprocess.run([CXX, "-O1", "-std=c++17", "-shared", "-fPIC", "-Wall", "-Wno-unused-function", "-I", str(d),
                        str(d / "rnn_host.cpp"), "-o", str(so)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lib = ctypes.CDLL(str(so))
    for tag in ("f32", "f16", "bf16", "f64"):
        fn = getattr(lib, f"rnn_host_{tag}")
        fn.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
        fn.restype = ctypes.c_int
    return lib


HOST_CASES = dict(CASES)
HOST_CASES.update({
    "lstm-bf16-bi-2layer": Case(dtype=E.PYDNN_DATA_BFLOAT16, dirs=2, layers=2),
    "gru-bf16-packed": Case(cell=E.PYDNN_GRU, dtype=E.PYDNN_DATA_BFLOAT16,
                            layout=E.PYDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED, lengths=(5, 5, 3, 2), T=5),
    "lstm-half-proj-clip-dropout": Case(dtype=E.PYDNN_DATA_HALF, proj=6, clip=(-0.3, 0.4), layers=2, dropout=0.25),
    "relu-half-skip": Case(cell=E.PYDNN_RNN_RELU, dtype=E.PYDNN_DATA_HALF, skip=True, dirs=2, layers=2),
    "tanh-f32-wide": Case(cell=E.PYDNN_RNN_TANH, hidden=300, input_size=7, lengths=(3, 2), T=3),  # > 1 block of 256
})


@pytest.mark.parametrize("name", list(HOST_CASES))
def test_rnn_cu_on_the_host(name, host_lib, monkeypatch):
    c = HOST_CASES[name]
    dev = rnn_emulator.Device()
    rnn_emulator.install(monkeypatch, dev, c.dtype, host_lib=host_lib)
    run_case(rnn_emulator.fake_handle(), dev, c)


SPLIT_CASES = {  # K slices of 16 elements (SPLIT_MIN_K lowered): splits of 2 to 8 in both directions' GEMMs
    "lstm-proj-bi": Case(hidden=64, input_size=8, proj=32, dirs=2, layers=2, lengths=(4, 2, 3)),
    "gru-half": Case(cell=E.PYDNN_GRU, dtype=E.PYDNN_DATA_HALF, hidden=32, input_size=16, dirs=2),
    "tanh-bf16": Case(cell=E.PYDNN_RNN_TANH, dtype=E.PYDNN_DATA_BFLOAT16, hidden=64, input_size=8, layers=2),
}


@pytest.mark.parametrize("name", list(SPLIT_CASES))
def test_rnn_cu_on_the_host_with_split_k(name, host_lib, monkeypatch):
    from pydnn.ops.rnn import engine
    monkeypatch.setattr(engine, "SPLIT_MIN_K", 16)
    c = SPLIT_CASES[name]
    r_out = c.proj or c.hidden
    g = {E.PYDNN_LSTM: 4, E.PYDNN_GRU: 3}.get(c.cell, 1) * c.hidden
    assert engine.split_k(3, g, r_out, 132) > 1 and engine.split_k(3, r_out, g, 132) > 1
    dev = rnn_emulator.Device()
    calls = rnn_emulator.install(monkeypatch, dev, c.dtype, host_lib=host_lib)
    run_case(rnn_emulator.fake_handle(), dev, c)
    assert any(m[0] == "gemm" for m in calls)


@pytest.mark.parametrize("name", ["lstm-bi-2layer-nostate", "gru-bi-packed", "lstm-skip-bi", "lstm-bf16-bi-2layer"])
def test_rnn_cu_on_the_host_directions_one_after_the_other(name, host_lib, monkeypatch):
    """DIR_BATCH off: the bidirectional layers' directions in separate launches (the other path)."""
    from pydnn.ops.rnn import engine
    monkeypatch.setattr(tuning.rnn, "DIR_BATCH", False)
    c = HOST_CASES[name]
    dev = rnn_emulator.Device()
    rnn_emulator.install(monkeypatch, dev, c.dtype, host_lib=host_lib)
    run_case(rnn_emulator.fake_handle(), dev, c)
