"""NVRTC: compile one CUDA C translation unit to a cubin for one arch, with template instantiations
requested by name expression (their mangled names come back for cuModuleGetFunction)."""
from .. import enums
from ..status import PydnnError


_loaded = False


def _preload_from_sys_path():
    """Load the NVRTC wheel's library from the first sys.path entry that has it.

    cuda-pathfinder looks for wheel libraries under site.getsitepackages(), which inside pip's isolated
    build environment does not hold the build requirements (they are on sys.path only): the install-time
    kernel build then finds no NVRTC. pathfinder takes a library that is already loaded, so load it here,
    privately (RTLD_LOCAL: a global load would let NVRTC's symbols interpose on libraries loaded later,
    such as PyTorch's), from where Python imports packages from. Only used when the normal lookup fails."""
    import ctypes
    import glob
    import os
    import sys

    for root in sys.path:
        for rel in ("nvidia/cu13/lib", "nvidia/cuda_nvrtc/lib"):
            lib = os.path.join(root or ".", rel, "libnvrtc.so.13")
            if os.path.isfile(lib):
                try:
                    for builtins in sorted(glob.glob(os.path.join(os.path.dirname(lib), "libnvrtc-builtins.so.*"))):
                        ctypes.CDLL(builtins)
                    ctypes.CDLL(lib)
                except OSError:
                    continue
                return True
    return False


def _nvrtc():
    global _loaded
    try:
        from cuda.bindings import nvrtc
    except ImportError as e:  # pragma: no cover - dependency missing
        raise PydnnError(enums.PYDNN_STATUS_NOT_INITIALIZED, f"NVRTC unavailable: {e}") from None
    if not _loaded:
        try:
            nvrtc.nvrtcVersion()  # loads the library the normal way (cuda-pathfinder)
        except Exception:  # noqa: BLE001 - pathfinder's not-found error; retry with the sys.path copy
            if not _preload_from_sys_path():
                raise PydnnError(enums.PYDNN_STATUS_NOT_INITIALIZED, "NVRTC library not found") from None
        _loaded = True
    return nvrtc


def version():
    """(major, minor) of the NVRTC library in use."""
    n = _nvrtc()
    err, major, minor = n.nvrtcVersion()
    if err != n.nvrtcResult.NVRTC_SUCCESS:
        raise PydnnError(enums.PYDNN_STATUS_NOT_INITIALIZED, f"nvrtcVersion failed: {err}")
    return int(major), int(minor)


def _check(n, result, what, prog=None):
    err = result[0]
    if err != n.nvrtcResult.NVRTC_SUCCESS:
        log = _log(n, prog) if prog is not None else ""
        raise PydnnError(enums.PYDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED, f"{what}: {err}\n{log}")
    return result[1] if len(result) == 2 else result[1:]


def _log(n, prog):
    err, size = n.nvrtcGetProgramLogSize(prog)
    buf = b" " * size
    n.nvrtcGetProgramLog(prog, buf)
    return buf.rstrip(b"\0 ").decode(errors="replace")


def compile_cubin(source, filename, name_exprs, arch, options, include_dirs):
    """Compile `source` for `arch` (e.g. 'sm_90'); return (cubin bytes, {expr: lowered name}, log)."""
    n = _nvrtc()
    prog = _check(n, n.nvrtcCreateProgram(source.encode(), filename.encode(), 0, [], []), "nvrtcCreateProgram")
    try:
        for expr in name_exprs:
            _check(n, n.nvrtcAddNameExpression(prog, expr.encode()), f"nvrtcAddNameExpression({expr})")
        opts = [f"--gpu-architecture={arch}".encode()] + [o.encode() for o in options]
        opts += [f"--include-path={d}".encode() for d in include_dirs]
        _check(n, n.nvrtcCompileProgram(prog, len(opts), opts), f"compiling {filename} for {arch}", prog)
        log = _log(n, prog)
        size = _check(n, n.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
        cubin = b" " * size
        _check(n, n.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
        lowered = {}
        for expr in name_exprs:
            name = _check(n, n.nvrtcGetLoweredName(prog, expr.encode()), f"nvrtcGetLoweredName({expr})")
            lowered[expr] = name.decode()
        return cubin, lowered, log
    finally:
        n.nvrtcDestroyProgram(prog)
