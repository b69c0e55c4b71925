"""cuDNN source compatibility (CPU): include/cudnn_compat/cudnn.h is the generated one, maps every pydnn
name, and a program written against cuDNN's API (tests/c/cudnn_compat_cpu.c) builds unchanged as C and C++
with `python -m pydnn config --cudnn-compat --cflags --libs` and runs."""
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from pydnn import enums
from pydnn.capi import decl, library

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from cprog import CC, ROOT, pydnn_cli  # noqa: E402

HEADER = ROOT / "include" / "cudnn_compat" / "cudnn.h"


def test_committed_compat_header_is_generated():
    assert HEADER.read_text() == decl.compat_header_text(), \
        "include/cudnn_compat/cudnn.h is stale: run python tools/gen_header.py"


def test_every_name_is_mapped():
    text = HEADER.read_text()
    for proto in decl.prototypes():
        name = proto.split("(", 1)[0].split()[-1].lstrip("*")
        assert f"#define cudnn{name[5:]} {name}\n" in text
    for members in enums.ENUMS.values():
        for m in members:
            assert f"#define CUDNN_{m[6:]} {m}\n" in text
    for t in enums.ENUMS:
        assert f"typedef {t} cudnn{t[5:]};" in text
    assert "#define CUDNN_MAJOR 9\n" in text
    # nothing maps to a name pydnn.h does not declare
    pydnn_h = (ROOT / "include" / "pydnn.h").read_text()
    for target in re.findall(r"^#define \w+ (pydnn\w+|PYDNN_\w+)$", text, re.M):
        assert re.search(rf"\b{target}\b", pydnn_h), target


def test_config_flags():
    flags = pydnn_cli("config", "--cudnn-compat", "--cflags").split()
    assert flags == [f"-I{ROOT / 'include' / 'cudnn_compat'}", f"-I{ROOT / 'include'}"]


def test_compat_dir_for_an_install(tmp_path, monkeypatch):
    monkeypatch.setenv("PYDNN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(library, "REPO_INCLUDE", tmp_path / "no-such-include")
    d = library.compat_include_dir()
    assert str(d).startswith(str(tmp_path)) and (d / "cudnn.h").read_text() == decl.compat_header_text()


def _flags():
    return shlex.split(pydnn_cli("config", "--cudnn-compat", "--cflags", "--libs"))


def test_cudnn_program_builds_and_runs_as_c(tmp_path):
    if CC is None:
        pytest.skip("no C compiler")
    exe = tmp_path / "cudnn_compat_cpu"
    subprocess.run([CC, "-std=c99", "-Wall", "-Werror", str(ROOT / "tests" / "c" / "cudnn_compat_cpu.c"),
                    *_flags(), "-o", str(exe)], check=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([str(exe)], capture_output=True, text=True, env=env, timeout=300)
    print(r.stdout, r.stderr)
    assert r.returncode == 0 and "FAIL" not in r.stdout and r.stdout.rstrip().endswith("done"), r.stdout + r.stderr
    assert r.stdout.count("\nok ") >= 8


def test_cudnn_program_compiles_as_cxx(tmp_path):
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    cflags = shlex.split(pydnn_cli("config", "--cudnn-compat", "--cflags"))
    subprocess.run([cxx, "-Wall", "-Werror", "-x", "c++", "-c", str(ROOT / "tests" / "c" / "cudnn_compat_cpu.c"),
                    *cflags, "-o", str(tmp_path / "prog.o")], check=True)


def cuda_runtime_dirs():
    """(include dir with a complete cuda_runtime.h or None, lib dir, libcudart file name) from the NVIDIA
    wheels on sys.path (nvidia/cu13, nvidia/cuda_runtime, nvidia/cu12), $CUDA_HOME or /usr/local/cuda*; None
    without a libcudart. A wheel's include/ lacks crt/host_config.h (it comes with nvcc): then None, and the
    program is compiled with tests/c/cudart_shim (the declarations it uses) against the real libcudart."""
    import glob

    roots = [os.path.join(p, "nvidia", sub) for p in sys.path if p for sub in ("cu13", "cuda_runtime", "cu12")]
    homes = [os.environ.get("CUDA_HOME", ""), os.environ.get("CUDA_PATH", "")]
    homes += sorted(glob.glob("/usr/local/cuda*"), reverse=True)
    for h in homes:
        if h:
            roots += [h, *glob.glob(os.path.join(h, "targets", "*"))]
    inc = next((os.path.join(r, "include") for r in roots
                if os.path.isfile(os.path.join(r, "include", "cuda_runtime.h"))
                and os.path.isfile(os.path.join(r, "include", "crt", "host_config.h"))), None)
    for root in roots:
        for libdir in (os.path.join(root, "lib"), os.path.join(root, "lib64")):
            libs = sorted(glob.glob(os.path.join(libdir, "libcudart.so.*[0-9]")) or
                          glob.glob(os.path.join(libdir, "libcudart.so")))
            if libs:
                return inc, libdir, os.path.basename(libs[-1])
    return None


def build_runtime_program(tmp_path, shim=False):
    """Compile and link tests/c/cudnn_compat_gpu.cpp (CUDA runtime + cuDNN names) with c++; the path."""
    cxx = shutil.which("c++") or shutil.which("g++")
    found = cuda_runtime_dirs()
    if cxx is None or found is None:
        pytest.skip("no C++ compiler or no libcudart (nvidia-cuda-runtime wheel, CUDA_HOME)")
    inc, libdir, lib = found
    if shim or inc is None:
        inc = str(ROOT / "tests" / "c" / "cudart_shim")
    exe = tmp_path / "cudnn_compat_gpu"
    subprocess.run([cxx, "-Wall", "-Werror", str(ROOT / "tests" / "c" / "cudnn_compat_gpu.cpp"), f"-I{inc}",
                    *_flags(), f"-L{libdir}", f"-l:{lib}", f"-Wl,-rpath,{libdir}", "-o", str(exe)], check=True)
    return exe


@pytest.mark.parametrize("shim", [False, True], ids=["runtime-headers", "shim"])
def test_runtime_program_builds(tmp_path, shim):
    """The CUDA-runtime program (cudaMalloc, cudnnFind..., workspace, CPU check) compiles and links on the CPU
    too, with the runtime's own headers where complete ones exist and with the shim; the GPU test runs it."""
    if not shim and (cuda_runtime_dirs() or (None,))[0] is None:
        pytest.skip("no complete CUDA runtime headers here")
    assert build_runtime_program(tmp_path, shim=shim).is_file()
