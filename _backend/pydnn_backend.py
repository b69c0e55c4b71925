"""pydnn's build backend: setuptools' (setup.py compiles the kernels), with the NVRTC the install-time
build needs chosen for the CUDA major the cubins are for.

The build environment is made before pip installs the package's extras, so it cannot follow
`pydnn[cu12]` / `pydnn[cu13]`; it follows what pydnn/_cuda/compat.py's cuda_major() follows instead:
PYDNN_CUDA_MAJOR (12 or 13) when set, else the installed driver's major (libcuda through ctypes, no GPU
needed), else 13. CUDA 12 builds with cuda-bindings 12 and the nvidia-cuda-nvrtc-cu12 wheel, CUDA 13 with
cuda-bindings 13 and nvidia-cuda-nvrtc. (This file cannot import pydnn: the build requirements, numpy
among them, are not installed yet when pip asks for them.)
"""
import ctypes
import os

from setuptools import build_meta as _orig
from setuptools.build_meta import *  # noqa: F401,F403 - every hook setuptools has

NVRTC = {
    12: ["cuda-bindings>=12.9,<13", "nvidia-cuda-nvrtc-cu12>=12.4,<13", "nvidia-cuda-nvcc-cu12>=12.4,<13"],
    13: ["cuda-bindings>=13.0,<14", "nvidia-cuda-nvrtc>=13.0,<14", "nvidia-cuda-nvcc>=13.0,<14"],
}
# nvidia-cuda-nvcc: its ptxas lets the kernel build compile the arch-neutral units once for sm_80 and sm_90
# (pydnn/_build/ptxas.py: one NVVM pass, the same SASS); used only when its release is NVRTC's, so a resolver
# that picks different versions of the two just builds as before. PYDNN_PTXAS=0 turns it off.


def cuda_major():
    env = os.environ.get("PYDNN_CUDA_MAJOR", "").strip()
    if env in ("12", "13"):
        return int(env)
    for name in ("libcuda.so.1", "libcuda.so"):
        try:
            lib = ctypes.CDLL(name)
            v = ctypes.c_int(0)
            if lib.cuDriverGetVersion(ctypes.byref(v)) == 0 and v.value // 1000 in NVRTC:
                return v.value // 1000
        except (OSError, AttributeError):
            continue
    return 13


def _nvrtc_requires():
    if os.environ.get("PYDNN_SKIP_BUILD") == "1":
        return []
    return list(NVRTC[cuda_major()])


def get_requires_for_build_wheel(config_settings=None):
    return _orig.get_requires_for_build_wheel(config_settings) + _nvrtc_requires()


def get_requires_for_build_editable(config_settings=None):
    return _orig.get_requires_for_build_editable(config_settings) + _nvrtc_requires()
