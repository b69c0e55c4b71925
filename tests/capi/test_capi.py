"""The C face: the committed header is the generated one; every declared function is documented and maps
onto a Python function; a C program compiled with only the flags `python -m pydnn config --cflags --libs`
prints links to libpydnn and runs (CPU checks here, numbers on the GPU in the gpu-marked test)."""
import inspect
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

import pydnn
from pydnn.capi import decl, impl, library
from cprog import CC, ROOT, build_and_run, pydnn_cli

OUT_KINDS = ("out", "obj_out", "arr_out", "struct_out")


def test_committed_header_is_generated():
    committed = (ROOT / "include" / "pydnn.h").read_text()
    assert committed == decl.header_text(), "include/pydnn.h is stale: run python tools/gen_header.py"


def test_every_function_is_documented_and_maps_onto_python():
    names = set()
    for _, entries in decl.FUNCTIONS:
        for proto, doc in entries:
            ret, c_name, params = impl.parse(proto)
            assert c_name not in names, f"{c_name} declared twice"
            names.add(c_name)
            assert doc and "\n" not in doc and "*/" not in doc, f"{c_name}: needs a one-line description"
            if c_name == "pydnnGetLastErrorString":
                continue  # its C form fills a buffer; Python's returns the string
            fn = getattr(pydnn, impl.snake(c_name[len("pydnn"):]), None)
            assert fn is not None, f"{c_name}: pydnn.{impl.snake(c_name[5:])} does not exist"
            inputs = [p for p in params if p[0] not in OUT_KINDS]
            py_params = list(inspect.signature(fn).parameters)
            assert len(py_params) == len(inputs), f"{c_name}: C inputs {[p[2] for p in inputs]} vs Python {py_params}"


def test_missing_python_function_is_not_supported(monkeypatch):
    import cffi

    proto = next(p for p in decl.prototypes() if "pydnnSoftmaxForward(" in p)
    m = impl.Marshal(cffi.FFI(), proto)
    monkeypatch.delattr(pydnn, "softmax_forward")
    with pytest.raises(pydnn.PydnnError) as e:
        m.python_function()
    assert e.value.status == pydnn.PYDNN_STATUS_NOT_SUPPORTED and "softmax_forward" in e.value.message


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


def test_include_dir_for_an_install(tmp_path, monkeypatch):
    """Without the checkout's include/, --cflags points at the library's folder, holding the current header."""
    monkeypatch.setenv("PYDNN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(library, "REPO_INCLUDE", tmp_path / "no-such-include")
    d = library.include_dir()
    assert d == library.library_dir() and str(d).startswith(str(tmp_path))
    assert (d / "pydnn.h").read_text() == decl.header_text()
    assert library.config_flags(cflags=True) == f"-I{d}"


def test_library_is_not_rebuilt_from_another_folder(tmp_path):
    flags = pydnn_cli("config", "--libs")
    lib = Path(shlex.split(flags)[0][2:]) / "libpydnn.so"
    before = lib.stat().st_mtime_ns
    assert pydnn_cli("config", "--libs", cwd=tmp_path) == flags
    assert lib.stat().st_mtime_ns == before


@pytest.mark.parametrize("pythonpath", [None, "/nonexistent/pydnn-test-path"])
def test_c_program_on_cpu(tmp_path, pythonpath):
    from conftest import HAVE_GPU

    r = build_and_run("capi_cpu", tmp_path, pythonpath=pythonpath)
    print(r.stdout, r.stderr)
    lines = r.stdout.splitlines()
    assert not [x for x in lines if x.startswith("FAIL")], r.stdout + r.stderr
    assert sum(x.startswith("ok ") for x in lines) >= 50, r.stdout + r.stderr
    assert r.returncode == 0, r.stdout + r.stderr
    # the caller's environment is as it was: no PYTHONPATH, or its own
    assert f"env PYTHONPATH={pythonpath or '(unset)'}" in lines
    create = [x for x in lines if x.startswith("create status")][0]
    expected = 0 if HAVE_GPU else 1001  # PYDNN_STATUS_NOT_INITIALIZED without a GPU
    assert create == f"create status {expected}"


@pytest.mark.gpu
def test_c_program_on_gpu(tmp_path):
    r = build_and_run("capi_gpu", tmp_path, extra=["-ldl", "-lm"])
    print(r.stdout, r.stderr)
    assert "FAIL" not in r.stdout and r.returncode == 0, r.stdout + r.stderr
    for what in ("sigmoid numbers", "softmax numbers", "double alpha/beta numbers", "set tensor numbers"):
        assert f"ok {what}" in r.stdout, r.stdout + r.stderr
