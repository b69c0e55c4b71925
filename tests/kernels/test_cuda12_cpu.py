"""CUDA 12 on the CPU: pydnn with cuda-bindings 12 and NVRTC 12 (what `pip install "pydnn[cu12]"` brings).

The CUDA 12 packages live in a folder of their own (PYDNN_CU12_DIR, default .ci/cu12, which .ci/run
fills with `pip install --no-deps --target .ci/cu12 "cuda-bindings>=12.9,<13" "nvidia-cuda-nvrtc-cu12>=12.4,<13"`);
each check runs in a fresh interpreter with that folder first on sys.path, so this process keeps its
CUDA 13 bindings. Without the folder the tests skip. Not testable here: a CUDA 12 driver (no GPU): loading
and running the NVRTC 12 cubins is the GPU run's (tools/gpu_check.sh on a CUDA 12 machine).
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pydnn._cuda import compat

ROOT = Path(__file__).resolve().parents[2]
CU12 = Path(os.environ.get("PYDNN_CU12_DIR") or ROOT / ".ci" / "cu12")


def _have_cu12():
    return (CU12 / "cuda" / "bindings").is_dir() and compat.find_nvrtc(12, [str(CU12)]) is not None


needs_cu12 = pytest.mark.skipif(not _have_cu12(), reason=f"no CUDA 12 packages in {CU12} (see .ci/run)")


def _run(code, cu12=True, env=None, timeout=600):
    e = dict(os.environ, **(env or {}))
    e["PYTHONPATH"] = os.pathsep.join(([str(CU12)] if cu12 else []) + [str(ROOT)])
    out = subprocess.run([sys.executable, "-c", code], env=e, cwd=str(ROOT), capture_output=True, text=True,
                         timeout=timeout)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def _used_names():
    """Every cuda.bindings.driver name pydnn's driver layer uses (d.cuX, _drv.cuX, d.CUenum.MEMBER, the
    CU_*_ATTRIBUTE_* members it names by string)."""
    text = "".join(p.read_text() for p in (ROOT / "pydnn" / "_cuda").glob("*.py"))
    names = set(re.findall(r"\b(?:d|_d|_drv|drv)\.((?:cu|CU)[A-Za-z0-9_]+(?:\.[A-Z][A-Z0-9_]+)?)", text))
    enums = {"CU_DEVICE_ATTRIBUTE_": "CUdevice_attribute", "CU_POINTER_ATTRIBUTE_": "CUpointer_attribute"}
    everywhere = "".join(p.read_text() for p in (ROOT / "pydnn").rglob("*.py"))
    for m in set(re.findall(r'"(CU_(?:DEVICE|POINTER)_ATTRIBUTE_[A-Z0-9_]+)"', everywhere)):
        names.add(next(v for k, v in enums.items() if m.startswith(k)) + "." + m)
    return sorted(names)


PROBE = """
import inspect, json, sys
from cuda.bindings import driver as d, nvrtc as n
import cuda.bindings
out = {"version": cuda.bindings.__version__}
def sig(f):
    try:
        return str(inspect.signature(f))
    except (TypeError, ValueError):
        return ((f.__doc__ or "").strip().splitlines() or [""])[0]
for name in json.loads(sys.argv[1]):
    mod, obj = (n, n) if name.startswith("nvrtc") else (d, d)
    for part in name.split("."):
        obj = getattr(obj, part, None)
    out[name] = None if obj is None else (sig(obj) if callable(obj) and name[:2] in ("cu", "nv") else "ok")
print(json.dumps(out))
"""

NVRTC_CALLS = ["nvrtcVersion", "nvrtcCreateProgram", "nvrtcDestroyProgram", "nvrtcAddNameExpression",
               "nvrtcCompileProgram", "nvrtcGetProgramLogSize", "nvrtcGetProgramLog", "nvrtcGetCUBINSize",
               "nvrtcGetCUBIN", "nvrtcGetLoweredName"]


@needs_cu12
def test_bindings_12_and_13_agree_on_every_call_pydnn_makes():
    names = _used_names() + NVRTC_CALLS
    assert "cuLaunchKernel" in names and "CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT" in names
    code = PROBE.replace("json.loads(sys.argv[1])", f"json.loads({json.dumps(json.dumps(names))})")
    v13 = json.loads(_run(code, cu12=False))
    v12 = json.loads(_run(code))
    assert v13.pop("version").startswith("13.") and v12.pop("version").startswith("12.")
    missing = sorted(k for k, v in v12.items() if v is None)
    assert not missing, f"absent from cuda-bindings 12: {missing}"
    differ = {k: (v12[k], v13[k]) for k in names if v12[k] != v13[k]}
    assert not differ, differ


@needs_cu12
def test_pydnn_runs_on_bindings_12_with_nvrtc_12():
    code = """
import cuda.bindings, pydnn
from pydnn._build import build, manifest
from pydnn._cuda import compat, driver, nvrtc
assert cuda.bindings.__version__.startswith("12."), cuda.bindings.__version__
assert compat.bindings_major() == 12 and compat.cuda_major() == 12
assert nvrtc.version()[0] == 12, nvrtc.version()
u = manifest.unit_by_name("sm_90")["activation.h16"]
cubin, lowered = build.compile_unit(u, "sm_90")
assert cubin[:4] == b"\\x7fELF" and set(lowered) == set(u.exprs)
assert not driver.available()          # no GPU here: a clean NOT_INITIALIZED, not a crash
try:
    pydnn.create()
    raise SystemExit("create() without a driver")
except pydnn.PydnnError as e:
    assert e.status == pydnn.PYDNN_STATUS_NOT_INITIALIZED
print("ok", nvrtc.version())
"""
    out = _run(code)
    assert out.startswith("ok (12,")


def test_cuda_major_and_driver_checks(monkeypatch):
    monkeypatch.setenv(compat.MAJOR_ENV, "12")
    assert compat.cuda_major() == 12
    monkeypatch.setenv(compat.MAJOR_ENV, "11")
    with pytest.raises(Exception, match="must be 12 or 13"):
        compat.cuda_major()
    monkeypatch.delenv(compat.MAJOR_ENV)
    if compat.installed_driver_version() is None:
        assert compat.cuda_major() == (compat.bindings_major() or 13)
    assert compat.check_driver(12040, 12) is None and compat.check_driver(13000, 13) is None
    assert "12.4 or later" in compat.check_driver(12030, 12)
    assert 'pydnn[cu12]' in compat.check_driver(12080, 13)


@needs_cu12
def test_nvrtc_12_by_path_through_ctypes():
    """The library by path (what the install-time build for CUDA 12 uses beside cuda-bindings 13), in a
    fresh interpreter that keeps the CUDA 13 bindings: version, a unit, a compile error's message."""
    code = f"""
import pydnn
from pydnn._cuda import compat, nvrtc
from pydnn._build import cache, manifest
lib = compat.CtypesNVRTC(compat.find_nvrtc(12, [{str(CU12)!r}]))
assert lib.version()[0] == 12
u = manifest.unit_by_name("sm_90")["tensor_ops.h16"]
text, _ = cache.unit_inputs(u)
cubin, lowered, log = lib.compile_cubin(text, u.source, u.exprs, "sm_90", manifest.common_options(), [str(cache.ptx_dir())], unit=u.name)
assert cubin[:4] == b"\\x7fELF" and set(lowered) == set(u.exprs)
try:
    lib.compile_cubin("__global__ void k() {{ nope; }}", "bad.cu", [], "sm_90", (), [], unit="bad")
    raise SystemExit("compiled")
except pydnn.PydnnError as e:
    assert "kernel unit bad" in e.message and "sm_90" in e.message and "nope" in e.message, e.message
print("ok")
"""
    assert _run(code, cu12=False).strip() == "ok"


@needs_cu12
def test_every_kernel_unit_compiles_with_nvrtc_12():
    """NVRTC 12 compiles every instantiation for sm_90 (sm_90a for the wgmma units), first-use ones too,
    into the cache (keyed by NVRTC 12's version, beside NVRTC 13's entries): the cubins a CUDA 12 driver
    loads. PYDNN_TEST_NVRTC12_UNITS=prefix,... limits it (a local check); CI compiles everything."""
    only = os.environ.get("PYDNN_TEST_NVRTC12_UNITS", "")
    code = f"""
from pydnn._build import build, cache, manifest
from pydnn._cuda import nvrtc
nv = nvrtc.version()
assert nv[0] == 12, nv
prefixes = tuple(p for p in {only!r}.split(",") if p) or None
build.build_all(archs=["sm_90"], progress=False, everything=True, prefixes=prefixes)
n = 0
for u in manifest.all_units("sm_90"):
    if prefixes and not u.name.startswith(prefixes):
        continue
    t = manifest.unit_arch(u, "sm_90")
    e = cache.read_entry(cache.entry_path(u, t, cache.unit_key(u, t, nv)))
    assert e is not None and e[0][:4] == b"\\x7fELF" and set(e[1]) == set(u.exprs), u.name
    n += 1
print("ok", n, nv)
"""
    out = _run(code, timeout=7200)
    assert out.startswith("ok ")
