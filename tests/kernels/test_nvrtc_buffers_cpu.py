"""NVRTC's output buffers (CPU, NVRTC only): compiling a unit must leave the interpreter's shared bytes
objects alone.

pydnn/_cuda/nvrtc.py once handed NVRTC `b" " * size` to write the program log and the cubin into. bytes are
immutable and shared: for an empty log (size 1, just the NUL) `b" " * 1` is CPython's one cached b" ", which
every 1-byte slice or read of the byte 0x20 returns, and NVRTC's NUL turned it into b"\\x00" for the rest of
the process. One in-process compile (tests/ops/rnn/test_rnn_kernels_cpu.py's) made a later torch.load read
an LSTM's weight_ih_l0 dimension 32 (0x20 in the pickle stream) as 0, and other cases' storage offsets 32
as 0 (uninitialised padding read back as weights)."""
import io
import pickle

import pytest

from pydnn._cuda import nvrtc

SRC = 'extern "C" __global__ void k(float* x) { x[threadIdx.x] = 1.0f; }\n'


def _nvrtc_or_skip():
    try:
        nvrtc.version()
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"NVRTC unavailable: {e}")


def _space_is_intact():
    """The cached 1-byte bytes object for 0x20 still holds 0x20 (compared by value as an int: bytes([0x20])
    is that same cached object), and a pickle read from a file object (one read() per opcode, as torch.load
    reads data.pkl) still brings back 32."""
    return (b"a b"[1:2][0] == 0x20 and io.BytesIO(b"a b").read(3)[1:2][0] == 0x20
            and pickle.load(io.BytesIO(pickle.dumps((32, 5), protocol=2))) == (32, 5))


def test_empty_log_compile_leaves_shared_bytes_alone():
    _nvrtc_or_skip()
    assert _space_is_intact()
    cubin, lowered, log = nvrtc.compile_cubin(SRC, "k.cu", [], "sm_80", [], [])
    assert log == ""  # the case that wrote into b" ": a log of size 1
    assert _space_is_intact(), "an NVRTC compile wrote into a shared bytes object"
    assert type(cubin) is bytes and cubin[:4] == b"\x7fELF"


def test_log_and_cubin_come_back_whole():
    """A compile with a warning: the whole log comes back as text (no NUL), the cubin as bytes."""
    _nvrtc_or_skip()
    src = 'extern "C" __global__ void k(float* x) { int unused_var = 3; x[0] = 1.0f; }\n'
    cubin, _, log = nvrtc.compile_cubin(src, "w.cu", [], "sm_90", [], [])
    assert type(cubin) is bytes and cubin[:4] == b"\x7fELF" and len(cubin) > 64
    assert 'variable "unused_var" was declared but never referenced' in log and "\0" not in log
    assert log.rstrip().endswith('"-diag-suppress <warning-number>"')
    assert _space_is_intact()


def test_compile_error_log_reaches_the_error():
    _nvrtc_or_skip()
    from pydnn import PydnnError
    with pytest.raises(PydnnError) as e:
        nvrtc.compile_cubin('extern "C" __global__ void k(float* x) { x[0] = ; }\n', "e.cu", [], "sm_80", [], [])
    assert "e.cu(1): error" in str(e.value)
    assert _space_is_intact()
