"""The C face: the committed header is the generated one; a C program compiled with only the flags
`python -m pydnn config --cflags --libs` prints links to libpydnn and runs (CPU checks here, numbers on
the GPU in the gpu-marked test)."""
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CC = shutil.which("cc") or shutil.which("gcc")


def test_committed_header_is_generated():
    from pydnn.capi import decl

    committed = (ROOT / "include" / "pydnn.h").read_text()
    assert committed == decl.header_text(), "include/pydnn.h is stale: run python tools/gen_header.py"


def test_header_compiles_as_c_and_cxx(tmp_path):
    if CC is None:
        pytest.skip("no C compiler")
    src = tmp_path / "h.c"
    src.write_text('#include <pydnn.h>\nint main(void) { return PYDNN_STATUS_SUCCESS; }\n')
    subprocess.run([CC, "-Wall", "-Werror", "-pedantic", "-std=c99", "-I", str(ROOT / "include"), "-c",
                    str(src), "-o", str(tmp_path / "h.o")], check=True)
    cxx = shutil.which("c++")
    if cxx:
        subprocess.run([cxx, "-Wall", "-Werror", "-x", "c++", "-I", str(ROOT / "include"), "-c", str(src),
                        "-o", str(tmp_path / "hpp.o")], check=True)


def _config_flags():
    out = subprocess.run([sys.executable, "-m", "pydnn", "config", "--cflags", "--libs"], check=True,
                         capture_output=True, text=True, cwd=ROOT).stdout
    return shlex.split(out)


def _build_and_run(name, tmp_path, extra=()):
    if CC is None:
        pytest.skip("no C compiler")
    exe = tmp_path / name
    subprocess.run([CC, str(ROOT / "tests" / "c" / f"{name}.c"), *_config_flags(), *extra, "-o", str(exe)],
                   check=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the library finds pydnn and cffi itself
    return subprocess.run([str(exe)], capture_output=True, text=True, env=env, timeout=300)


def test_c_program_on_cpu(tmp_path):
    from conftest import HAVE_GPU

    r = _build_and_run("capi_cpu", tmp_path)
    print(r.stdout, r.stderr)
    lines = r.stdout.splitlines()
    assert not [x for x in lines if x.startswith("FAIL")], r.stdout
    assert sum(x.startswith("ok ") for x in lines) >= 30
    assert r.returncode == 0
    create = [x for x in lines if x.startswith("create status")][0]
    expected = 0 if HAVE_GPU else 1001  # PYDNN_STATUS_NOT_INITIALIZED without a GPU
    assert create == f"create status {expected}"


@pytest.mark.gpu
def test_c_program_on_gpu(tmp_path):
    r = _build_and_run("capi_gpu", tmp_path, extra=["-ldl", "-lm"])
    print(r.stdout, r.stderr)
    assert "FAIL" not in r.stdout and r.returncode == 0, r.stdout + r.stderr
    assert "ok sigmoid numbers" in r.stdout and "ok softmax numbers" in r.stdout
