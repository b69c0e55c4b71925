"""The RNN family from C: tests/c/rnn_cpu.c (descriptors, no GPU) and tests/c/rnn_gpu.c (forward against a
double-precision LSTM written in C, backward data / weights, errors)."""
import pytest

from cprog import build_and_run


def _run(name, tmp_path, extra=()):
    r = build_and_run(name, tmp_path, extra=list(extra))
    print(r.stdout, r.stderr)
    lines = r.stdout.splitlines()
    assert not [x for x in lines if x.startswith("FAIL")], r.stdout + r.stderr
    assert r.returncode == 0, r.stdout + r.stderr
    return lines


def test_rnn_c_program_on_cpu(tmp_path):
    lines = _run("rnn_cpu", tmp_path)
    assert sum(x.startswith("ok ") for x in lines) >= 20


@pytest.mark.gpu
def test_rnn_c_program_on_gpu(tmp_path):
    lines = _run("rnn_gpu", tmp_path, ["-ldl", "-lm"])
    for what in ("forward y", "forward hy", "forward cy", "backward data finite", "weights ADD doubles"):
        assert f"ok {what}" in lines
