"""NVRTC: compile one CUDA C translation unit to a cubin for one arch, with template instantiations
requested by name expression (their mangled names come back for cuModuleGetFunction).

One NVRTC per process, of the CUDA major the cubins are for (compat.cuda_major(): PYDNN_CUDA_MAJOR, else
the driver's, else cuda-bindings'): cuda.bindings.nvrtc when the bindings have that major, else the
library of that major found by path (compat.CtypesNVRTC; the install-time build for CUDA 12 in a build
environment with cuda-bindings 13). version() is in every cache key, so cubins of one major never load
for another."""
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

    from . import compat

    major = compat.bindings_major() or 13
    for root in sys.path:
        for rel in compat.NVRTC_DIRS.get(major, ()):
            lib = os.path.join(root or ".", rel, f"libnvrtc.so.{major}")
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


_other = None   # a CtypesNVRTC when the process compiles with another major than the bindings'
_select_lock = __import__("threading").Lock()


def _select():
    """Once per process: None to use cuda.bindings.nvrtc, or the CtypesNVRTC of the wanted major."""
    global _other
    if _other is not None:
        return _other or None
    with _select_lock:
        if _other is not None:
            return _other or None
        from . import compat

        want, have = compat.cuda_major(), compat.bindings_major()
        if want == have:
            # cuda-pathfinder may hand the bindings another major's library when several NVRTC wheels are
            # installed: then the wanted one by path, if there is one
            try:
                ok = _bindings_version()[0] == want
            except PydnnError:
                ok = False
            if ok or compat.find_nvrtc(want) is None:
                _other = False
                return None
        path = compat.find_nvrtc(want)
        if path is None:
            raise PydnnError(enums.PYDNN_STATUS_NOT_INITIALIZED,
                             f"NVRTC {want} not found (CUDA {want} wanted: {compat.MAJOR_ENV} or the driver; "
                             f"cuda-bindings is {have}): install \"pydnn[cu{want}]\" or nvidia-cuda-nvrtc"
                             f"{'-cu12' if want == 12 else ''}")
        _other = compat.CtypesNVRTC(path)
    return _other


def version():
    """(major, minor) of the NVRTC library in use."""
    other = _select()
    if other is not None:
        return other.version()
    return _bindings_version()


def _bindings_version():
    n = _nvrtc()
    err, major, minor = n.nvrtcVersion()
    if err != n.nvrtcResult.NVRTC_SUCCESS:
        raise PydnnError(enums.PYDNN_STATUS_NOT_INITIALIZED, f"nvrtcVersion failed: {err}")
    return int(major), int(minor)


def _check(n, result, what, prog=None):
    err = result[0]
    if err != n.nvrtcResult.NVRTC_SUCCESS:
        log = _log(n, prog) if prog is not None else ""
        raise PydnnError(enums.PYDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED, f"{what}: {_result_name(err)}\n{log}")
    return result[1] if len(result) == 2 else result[1:]


def _result_name(err):
    name = getattr(err, "name", None)
    return name if name else str(err)


DUMP_ENV = "PYDNN_DUMP_CUDA_SOURCE_ON_ERROR"


def numbered_source(source, filename):
    """The source with 1-based line numbers, as CuPy's CUPY_DUMP_CUDA_SOURCE_ON_ERROR shows it."""
    lines = source.splitlines()
    width = len(str(len(lines))) if lines else 1
    body = "\n".join(f"{i:{width}d} {line}" for i, line in enumerate(lines, 1))
    return f"==== {filename} ====\n{body}\n==== end of {filename} ===="


def _dump_source(source, filename, stream=None):
    """With PYDNN_DUMP_CUDA_SOURCE_ON_ERROR=1, print the failed unit's numbered source (read when a
    compilation fails, so it can be set at any time)."""
    import os
    import sys

    if os.environ.get(DUMP_ENV, "0") not in ("", "0"):
        print(numbered_source(source, filename), file=stream or sys.stderr, flush=True)
        return True
    return False


def _error_hint(source, filename):
    """After a failed compilation: the numbered source printed (PYDNN_DUMP_CUDA_SOURCE_ON_ERROR=1), or the
    hint how to get it."""
    return "" if _dump_source(source, filename) else f" (set {DUMP_ENV}=1 to print the numbered source)"


def _out_buffer(size):
    """A writable buffer of `size` bytes for NVRTC to fill (nvrtcGetProgramLog / nvrtcGetCUBIN write
    through the char* they are handed). Never a bytes object: bytes are immutable and shared, and
    `b" " * 1` is CPython's one cached b" " (every 1-byte slice or read of 0x20 in the process returns
    it): an empty log (size 1, just the NUL) written into it turned every later b" " into b"\\x00"
    (in pickle streams too, e.g. torch.load read a tensor's dimension 32 as 0)."""
    return bytearray(int(size))


def _log(n, prog):
    err, size = n.nvrtcGetProgramLogSize(prog)
    buf = _out_buffer(size)
    n.nvrtcGetProgramLog(prog, buf)
    return bytes(buf).rstrip(b"\0 ").decode(errors="replace")


def compile_cubin(source, filename, name_exprs, arch, options, include_dirs, unit=None, ptx_out=None):
    """Compile `source` for `arch` (e.g. 'sm_90'); return (cubin bytes, {expr: lowered name}, log). With
    `ptx_out` (a list), the PTX NVRTC made on the way is appended to it (pydnn/_build/ptxas.py assembles it
    for another arch; the bindings' NVRTC only: another major's appends nothing).

    A failed compilation raises INTERNAL_ERROR_COMPILATION_FAILED naming the kernel unit, the file, the arch
    and the options, followed by NVRTC's log; with PYDNN_DUMP_CUDA_SOURCE_ON_ERROR=1 the numbered source is
    printed to stderr as well."""
    other = _select()
    if other is not None:
        return other.compile_cubin(source, filename, name_exprs, arch, options, include_dirs, unit=unit,
                                   on_error=_error_hint)
    n = _nvrtc()
    prog = _check(n, n.nvrtcCreateProgram(source.encode(), filename.encode(), 0, [], []), "nvrtcCreateProgram")
    try:
        for expr in name_exprs:
            _check(n, n.nvrtcAddNameExpression(prog, expr.encode()), f"nvrtcAddNameExpression({expr})")
        opts = [f"--gpu-architecture={arch}"] + list(options) + [f"--include-path={d}" for d in include_dirs]
        what = (f"NVRTC could not compile kernel unit {unit or filename} ({filename}) for {arch} "
                f"with options {' '.join(opts)}")
        err = n.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        if err[0] != n.nvrtcResult.NVRTC_SUCCESS:
            dumped = _dump_source(source, filename)
            hint = "" if dumped else f" (set {DUMP_ENV}=1 to print the numbered source)"
            _check(n, err, what + hint, prog)
        log = _log(n, prog)
        size = _check(n, n.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
        buf = _out_buffer(size)
        _check(n, n.nvrtcGetCUBIN(prog, buf), "nvrtcGetCUBIN")
        cubin = bytes(buf)
        if ptx_out is not None:
            size = _check(n, n.nvrtcGetPTXSize(prog), "nvrtcGetPTXSize")
            pbuf = _out_buffer(size)
            _check(n, n.nvrtcGetPTX(prog, pbuf), "nvrtcGetPTX")
            ptx_out.append(bytes(pbuf).rstrip(b"\0"))
        lowered = {}
        for expr in name_exprs:
            name = _check(n, n.nvrtcGetLoweredName(prog, expr.encode()), f"nvrtcGetLoweredName({expr})")
            lowered[expr] = name.decode()
        return cubin, lowered, log
    finally:
        n.nvrtcDestroyProgram(prog)
