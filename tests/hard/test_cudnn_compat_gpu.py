"""The cuDNN-style C++ program that allocates with the CUDA runtime (tests/c/cudnn_compat_gpu.cpp), built
unchanged against pydnn's cudnn.h and run on the GPU: the runtime's context current before cudnnCreate,
cudnnFindConvolutionForwardAlgorithm, a workspace query, convolution + in-place ReLU checked on the CPU."""
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_cudnn_compat_cpu import build_runtime_program  # noqa: E402

pytestmark = pytest.mark.gpu


def test_runtime_program_runs(tmp_path):
    exe = build_runtime_program(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([str(exe)], capture_output=True, text=True, env=env, timeout=600)
    print(r.stdout, r.stderr)
    assert r.returncode == 0 and "FAIL" not in r.stdout and r.stdout.rstrip().endswith("done"), r.stdout + r.stderr
    assert "ok convolution + relu match the CPU" in r.stdout
