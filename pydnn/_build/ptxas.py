"""One front end and NVVM pass for both default archs: a unit whose PTX does not depend on the arch is compiled
by NVRTC for sm_80 (cubin and PTX), and that PTX is assembled for sm_90 by the standalone ptxas of the same CUDA
release, instead of a second NVRTC run.

Why: NVRTC's time per unit is front end ~1%, NVVM optimizer ~40%, PTX to SASS ~58% (tools/build_stats.py
--phases, NVRTC 13.5, every install unit; tools/PERF.md "Session 30: install"); a precompiled header can save
only the 1%, but the NVVM pass is the same work for sm_80 and sm_90 where the source has no arch-dependent code.
The SASS is the same: ptxas of release X.Y given NVRTC X.Y's compute_80 PTX and -arch=sm_90 writes the same
kernel code (every .text section byte for byte) as NVRTC X.Y compiling for sm_90
(tests/kernels/test_ptxas_shared_cpu.py checks a sample; tools/build_stats.py --check-shared every unit). Only
the names of internal-linkage globals differ (their hash follows the options).

When: ptxas is found (PYDNN_PTXAS, the nvidia-cuda-nvcc wheel of the NVRTC's major, a CUDA toolkit's bin, PATH)
and its release is NVRTC's (major and minor); PYDNN_PTXAS=0 turns the shared path off. A unit shares when it is
built for both archs in one build with the same instantiations and options, and its PTX cannot depend on the
arch: no __CUDA_ARCH__ in its source or headers but blocks that cannot change an sm_80 unit's code (_HARMLESS),
and common/types.cuh's one use (double -> bfloat16 stores), which the sm_80 PTX shows (PTX_ARCH_SIGNS: then NVRTC
compiles sm_90 too); and no option that changes NVVM's output per arch. Otherwise the
unit compiles per arch as before. The cache entry is the same either way (same key: the kernels are the same).
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading

from .._cuda import nvrtc

ENV = "PYDNN_PTXAS"
_found = None
_lock = threading.Lock()

# relative to a sys.path entry: the nvidia-cuda-nvcc wheel's ptxas per CUDA major
# (nvidia-cuda-nvcc 13.5.37 has nvidia/cu13/bin/ptxas; the older layout, and the -cu12 wheel's, nvidia/cuda_nvcc/bin)
_WHEEL_DIRS = {13: ("nvidia/cu13/bin", "nvidia/cuda_nvcc/bin"), 12: ("nvidia/cuda_nvcc/bin",)}
# the archs whose units may share one NVVM pass: (the arch NVRTC compiles, the arch ptxas assembles its PTX for)
PAIRS = (("sm_80", "sm_90"),)


def _release(path):
    """(major, minor) of a ptxas binary, or None."""
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"release (\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else None


def candidates():
    """Every ptxas this process could use, in the order tried: PYDNN_PTXAS, the nvcc wheel of NVRTC's major on
    sys.path, $CUDA_HOME / $CUDA_PATH / /usr/local/cuda bin, PATH."""
    env = os.environ.get(ENV, "")
    if env and env != "0":
        return [env]
    out = []
    try:
        major = nvrtc.version()[0]
    except Exception:  # noqa: BLE001 - no NVRTC: nothing to pair with
        return []
    for root in sys.path:
        for rel in _WHEEL_DIRS.get(major, ()):
            p = os.path.join(root or ".", rel, "ptxas")
            if os.path.isfile(p) and p not in out:
                out.append(p)
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            p = os.path.join(home, "bin", "ptxas")
            if os.path.isfile(p) and p not in out:
                out.append(p)
    p = shutil.which("ptxas")
    if p and p not in out:
        out.append(p)
    return out


def find():
    """The ptxas of NVRTC's release (major and minor), or None (then every unit compiles per arch)."""
    global _found
    with _lock:
        if _found is None:
            _found = ""
            if os.environ.get(ENV, "") != "0":
                want = nvrtc.version()
                for p in candidates():
                    if os.access(p, os.X_OK) and _release(p) == tuple(want):
                        _found = p
                        break
        return _found or None


def describe():
    """Lines saying which ptxas were found, their releases, NVRTC's, and which one the build uses."""
    lines = [f"NVRTC {'.'.join(map(str, nvrtc.version()))}"]
    for p in candidates():
        r = _release(p)
        lines.append(f"ptxas {p}: release {'.'.join(map(str, r)) if r else '?'}")
    off = "off (PYDNN_PTXAS=0)" if os.environ.get(ENV, "") == "0" else "off (no ptxas of the same release)"
    lines.append(f"shared NVVM pass: {find() or off}")
    return lines


_ARCH_TEXT = re.compile(r"__CUDA_ARCH__")
# __CUDA_ARCH__ blocks that cannot make an sm_80-compilable unit's PTX differ by arch: the sm_90a-only guard (a
# static_assert that fails any other target, so no unit built for sm_80 instantiates what holds it), and kernel
# templates defined only from sm_90 on (thread-block clusters: a unit naming one does not compile for sm_80)
_HARMLESS = (
    re.compile(r"#if defined\(__CUDA_ARCH__\) && !defined\(__CUDA_ARCH_FEAT_SM90_ALL\)\n\s*static_assert\([^;]*\);\n"
               r"#endif"),
    re.compile(r"#if (?:!defined\(__CUDA_ARCH__\) \|\| )?__CUDA_ARCH__ >= 900\n"
               r"(?:template <[^\n]*>\n__global__[^{;]*\{[^{}]*\}\n\s*)+#endif"),
)


def _arch_text(body):
    for pat in _HARMLESS:
        body = pat.sub("", body)
    return _ARCH_TEXT.search(body) is not None
# common/types.cuh's one arch branch, Store<bf16_t>::from(double) (cvt.rn.bf16.f64 from sm_90 on; before it,
# __double2float_rz with round-to-odd, then to_bf16), leaves this in the PTX of a unit that stores a double into
# bfloat16 (__double2float_rz appears nowhere else under ptx/): such a unit's sm_90 code is compiled by NVRTC for
# sm_90 (compile_shared). (reduce's rows_gen and reduce_finish did, until session 31 gave reduce.cu an arch-neutral
# double -> bfloat16 store, bf16_of: tests/kernels/test_reduce_bf16_store_cpu.py; no install unit carries it now.)
PTX_ARCH_SIGNS = (b"cvt.rz.f32.f64",)


def arch_dependent_ptx(ptx):
    """Whether `ptx` (NVRTC's, for the first arch) holds code that a known arch branch chose (PTX_ARCH_SIGNS)."""
    return any(sign in ptx for sign in PTX_ARCH_SIGNS)


def digest(unit):
    """What a PTX verification holds for: the unit's source and header texts, instantiations and own options (not
    the arch, not NVRTC's version)."""
    import hashlib

    from . import cache

    text, headers = cache.unit_inputs(unit)
    h = hashlib.sha256()
    for part in (unit.source, text, *[f"{p}\n{t}" for p, t in headers], "\n".join(unit.exprs), " ".join(unit.options)):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def verified(unit):
    """Whether tools/build_stats.py --verify-ptx found this unit's PTX the same for sm_80 and sm_90 as it is now
    (pydnn/_build/ptx_verified.py: its digest; any edit of its source, headers or instantiations drops it)."""
    try:
        from .ptx_verified import VERIFIED
    except ImportError:
        return False
    return VERIFIED.get(unit.name) == digest(unit)


# Units whose SASS differed although their text is arch-neutral: NVVM itself may order a kernel's PTX by target.
# matmul.f32big: NVRTC 13.5's PTX of gemm_simt<128, 256, ...> for compute_80 and compute_90 has the same
# instructions in another order (register numbering), so ptxas's sm_90 code differs (build_stats --check-shared;
# identical with NVRTC 13.0 on the H200 host). Such a unit compiles per arch.
NOT_SHARED = frozenset({"matmul.f32big"})


def arch_neutral(unit):
    """Whether the unit's PTX cannot depend on the target arch: no __CUDA_ARCH__ in its source or headers but the
    _HARMLESS blocks and common/types.cuh's (Store<bf16_t>::from(double)), which the PTX shows
    (arch_dependent_ptx: checked on every shared compile); or a PTX verification of the unit as it is now
    (verified: the normalization units' common parts, whose sources have sm_90 paths their kernels do not reach)."""
    from . import cache

    if unit.name in NOT_SHARED:
        return False
    text, headers = cache.unit_inputs(unit)
    if _arch_text(text):
        return verified(unit)
    for path, body in headers:
        if _arch_text(body) and path.replace(os.sep, "/") != "common/types.cuh":
            return verified(unit)
    return True


def options_ok(options):
    """NVRTC options under which the shared path gives the same SASS: the defaults (no -lineinfo, no
    --Ofast-compile, no -G) plus ptxas options, which ptxas is given too."""
    for o in options:
        if o in ("-std=c++17",) or o.startswith("--ptxas-options="):
            continue
        return False
    return True


def ptxas_options(options):
    """The ptxas arguments of NVRTC's --ptxas-options=... entries."""
    out = []
    for o in options:
        if o.startswith("--ptxas-options="):
            out.extend(o[len("--ptxas-options="):].split(","))
    return out


def assemble(ptx, arch, options, unit=None):
    """The cubin of `ptx` for `arch` by the paired ptxas (whole-program, as NVRTC's own), with the ptxas options
    of `options`."""
    path = find()
    if path is None:
        raise RuntimeError("no ptxas of NVRTC's release")
    with tempfile.TemporaryDirectory(prefix="pydnn-ptxas-") as d:
        src, dst = os.path.join(d, "unit.ptx"), os.path.join(d, "unit.cubin")
        with open(src, "wb") as f:
            f.write(ptx)
        r = subprocess.run([path, f"-arch={arch}", *ptxas_options(options), src, "-o", dst], capture_output=True,
                           text=True)
        if r.returncode != 0:
            from .. import enums
            from ..status import PydnnError

            raise PydnnError(enums.PYDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED,
                             f"ptxas {path} could not assemble kernel unit {unit} for {arch}: {r.stderr.strip()}")
        with open(dst, "rb") as f:
            return f.read()
