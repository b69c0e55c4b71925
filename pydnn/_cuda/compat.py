"""CUDA 12 and CUDA 13: which major pydnn's cubins are for, and NVRTC of a given major by path.

pydnn runs on a CUDA 13 driver with cuda-bindings 13 and NVRTC 13 (`pip install "pydnn[cu13]"`) and on a
CUDA 12 driver (12.4 or later) with cuda-bindings 12 and NVRTC 12 (`pip install "pydnn[cu12]"`). Every
driver call and NVRTC call pydnn makes has the same Python signature in cuda-bindings 12.9 and 13
(tests/kernels/test_cuda12_cpu.py compares them), so the driver layer needs no shim; what differs is the
NVRTC that must build the cubins: a cubin from NVRTC 13 does not load on a CUDA 12 driver, while one
from NVRTC 12.x loads on any 12.x driver of at least 12.4 (minor version compatibility).

cuda_major(): the major the cubins are built for: PYDNN_CUDA_MAJOR (12 or 13) when set, else that of
cuda-bindings, unless the installed driver's (libcuda's cuDriverGetVersion through ctypes: no cuInit, no
GPU needed) is older: a driver loads the cubins of its major and of older ones. NVRTC of the bindings' major goes through cuda.bindings.nvrtc (pydnn/_cuda/nvrtc.py);
another major (the install-time build for CUDA 12 runs in a build environment with cuda-bindings 13, and
CI compiles every kernel with NVRTC 12 as well) through CtypesNVRTC, the library found by path.
"""
import ctypes
import glob
import os
import sys

from .. import enums
from ..status import PydnnError

MAJOR_ENV = "PYDNN_CUDA_MAJOR"
MIN_DRIVER = {12: 12040, 13: 13000}   # the oldest driver of each major pydnn runs on (cuDriverGetVersion)
# where the NVRTC wheels put the library, relative to a sys.path entry
NVRTC_DIRS = {12: ("nvidia/cuda_nvrtc/lib",), 13: ("nvidia/cu13/lib", "nvidia/cuda_nvrtc/lib")}


def bindings_major():
    """The major version of the installed cuda-bindings, or None."""
    try:
        from cuda.bindings import __version__ as v
    except ImportError:
        return None
    try:
        return int(str(v).split(".")[0])
    except ValueError:
        return None


def installed_driver_version():
    """cuDriverGetVersion of the installed libcuda (12040 for 12.4), or None without a driver. Through
    ctypes: it needs no cuInit and no GPU, and works whatever the bindings' major."""
    for name in ("libcuda.so.1", "libcuda.so"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        v = ctypes.c_int(0)
        try:
            if lib.cuDriverGetVersion(ctypes.byref(v)) == 0 and v.value > 0:
                return v.value
        except AttributeError:
            pass
    return None


def cuda_major():
    """The CUDA major pydnn builds its cubins for (see the module's text)."""
    env = os.environ.get(MAJOR_ENV, "").strip()
    if env:
        if env not in ("12", "13"):
            raise PydnnError(enums.PYDNN_STATUS_BAD_PARAM, f"{MAJOR_ENV}: {env!r} must be 12 or 13")
        return int(env)
    b, v = bindings_major(), installed_driver_version()
    drv = v // 1000 if v is not None and v // 1000 in MIN_DRIVER else None
    if drv is None:
        return b or 13
    # a driver runs the cubins of its own major and older ones: the bindings' major unless it is newer
    return drv if b is None else min(b, drv)


def check_driver(version, bindings=None):
    """Why a driver of cuDriverGetVersion `version` cannot run this installation (None when it can): older
    than 12.4, or older than the major of the installed cuda-bindings (pydnn[cu13] on a CUDA 12 driver)."""
    bindings = bindings_major() if bindings is None else bindings
    major, minor = version // 1000, version % 1000 // 10
    if version < MIN_DRIVER[12]:
        return f"the CUDA driver is {major}.{minor}; pydnn needs 12.4 or later"
    if bindings and major < bindings:
        return (f"the CUDA driver is {major}.{minor} but cuda-bindings {bindings} is installed: install "
                f'"pydnn[cu{major}]" (cuda-bindings and NVRTC of CUDA {major})')
    return None


def find_nvrtc(major, roots=None):
    """The path of libnvrtc.so.<major> in an NVRTC wheel under one of `roots` (default sys.path), or None."""
    for root in sys.path if roots is None else roots:
        for rel in NVRTC_DIRS.get(major, ()):
            lib = os.path.join(root or ".", rel, f"libnvrtc.so.{major}")
            if os.path.isfile(lib):
                return lib
    return None


class CtypesNVRTC:
    """NVRTC of any major loaded by path through ctypes (RTLD_LOCAL: its symbols stay private, so it can
    live beside another major's library in the same process). version() and compile_cubin() as
    pydnn/_cuda/nvrtc.py's; ctypes releases the GIL during each call, so the build's threads overlap."""

    def __init__(self, path):
        self.path = path
        folder = os.path.dirname(path)
        # its builtins library first: libnvrtc finds it by soname, and it may not be on the loader's path
        for builtins in sorted(glob.glob(os.path.join(folder, "libnvrtc-builtins.so.*"))):
            if ".alt." not in builtins:
                ctypes.CDLL(builtins)
        lib = ctypes.CDLL(path)
        P, I, S = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
        sigs = {
            "nvrtcVersion": (ctypes.POINTER(I), ctypes.POINTER(I)),
            "nvrtcGetErrorString": (I,),
            "nvrtcCreateProgram": (ctypes.POINTER(P), ctypes.c_char_p, ctypes.c_char_p, I, P, P),
            "nvrtcDestroyProgram": (ctypes.POINTER(P),),
            "nvrtcAddNameExpression": (P, ctypes.c_char_p),
            "nvrtcCompileProgram": (P, I, ctypes.POINTER(ctypes.c_char_p)),
            "nvrtcGetProgramLogSize": (P, ctypes.POINTER(S)),
            "nvrtcGetProgramLog": (P, ctypes.c_char_p),
            "nvrtcGetCUBINSize": (P, ctypes.POINTER(S)),
            "nvrtcGetCUBIN": (P, ctypes.c_char_p),
            "nvrtcGetLoweredName": (P, ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p)),
        }
        for name, args in sigs.items():
            f = getattr(lib, name)
            f.argtypes = args
            f.restype = ctypes.c_char_p if name == "nvrtcGetErrorString" else I
        self.lib = lib

    def version(self):
        a, b = ctypes.c_int(), ctypes.c_int()
        self._check(self.lib.nvrtcVersion(ctypes.byref(a), ctypes.byref(b)), "nvrtcVersion")
        return a.value, b.value

    def _error(self, code):
        return (self.lib.nvrtcGetErrorString(code) or b"").decode() or f"nvrtcResult {code}"

    def _check(self, code, what, log=""):
        if code != 0:
            raise PydnnError(enums.PYDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED,
                             f"{what}: {self._error(code)}\n{log}")

    def _log(self, prog):
        size = ctypes.c_size_t()
        if self.lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)) != 0 or size.value <= 1:
            return ""
        buf = ctypes.create_string_buffer(size.value)
        self.lib.nvrtcGetProgramLog(prog, buf)
        return buf.value.decode(errors="replace")

    def compile_cubin(self, source, filename, name_exprs, arch, options, include_dirs, unit=None, on_error=None):
        """As nvrtc.compile_cubin; on_error(source, filename) -> a hint for the message (nvrtc.py's prints
        the numbered source under PYDNN_DUMP_CUDA_SOURCE_ON_ERROR)."""
        prog = ctypes.c_void_p()
        self._check(self.lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), filename.encode(), 0,
                                                None, None), "nvrtcCreateProgram")
        try:
            for expr in name_exprs:
                self._check(self.lib.nvrtcAddNameExpression(prog, expr.encode()), f"nvrtcAddNameExpression({expr})")
            opts = [f"--gpu-architecture={arch}"] + list(options) + [f"--include-path={d}" for d in include_dirs]
            argv = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
            err = self.lib.nvrtcCompileProgram(prog, len(opts), argv)
            if err != 0:
                hint = on_error(source, filename) if on_error else ""
                self._check(err, f"NVRTC {self.path} could not compile kernel unit {unit or filename} ({filename}) "
                                 f"for {arch} with options {' '.join(opts)}{hint}", self._log(prog))
            log = self._log(prog)
            size = ctypes.c_size_t()
            self._check(self.lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "nvrtcGetCUBINSize")
            buf = ctypes.create_string_buffer(size.value)
            self._check(self.lib.nvrtcGetCUBIN(prog, buf), "nvrtcGetCUBIN")
            lowered = {}
            for expr in name_exprs:
                name = ctypes.c_char_p()
                self._check(self.lib.nvrtcGetLoweredName(prog, expr.encode(), ctypes.byref(name)),
                            f"nvrtcGetLoweredName({expr})")
                lowered[expr] = name.value.decode()
            return buf.raw[:size.value], lowered, log
        finally:
            self.lib.nvrtcDestroyProgram(ctypes.byref(prog))
