"""Build and run a C program of tests/c/ against libpydnn, with only what `python -m pydnn config` prints.

Used by test_capi.py and by each family's C test: `build_and_run("pooling_gpu", tmp_path)` compiles
tests/c/pooling_gpu.c and returns the finished process (stdout holds its `ok ...` / `FAIL ...` lines)."""
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CC = shutil.which("cc") or shutil.which("gcc")


def pydnn_cli(*args, cwd=ROOT):
    """`python -m pydnn ...` importing this checkout's pydnn from any folder."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    return subprocess.run([sys.executable, "-m", "pydnn", *args], check=True, capture_output=True, text=True,
                          cwd=cwd, env=env).stdout


def config_flags():
    return shlex.split(pydnn_cli("config", "--cflags", "--libs"))


def library_path():
    """libpydnn as the C programs get it (`python -m pydnn config --libs`), for tests that load it into their
    own process: the same build (its key holds the import path, so a build from this process's path would
    rebuild the library the C programs use, and back)."""
    flags = config_flags()
    libdir = next(f[2:] for f in flags if f.startswith("-L"))
    return Path(libdir) / "libpydnn.so"


def build_and_run(name, tmp_path, extra=(), pythonpath=None):
    if CC is None:
        pytest.skip("no C compiler")
    exe = tmp_path / name
    subprocess.run([CC, str(ROOT / "tests" / "c" / f"{name}.c"), *config_flags(), *extra, "-o", str(exe)],
                   check=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the library finds pydnn and cffi itself
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run([str(exe)], capture_output=True, text=True, env=env, timeout=300)
