"""NVRTC options common to every kernel unit (pydnn/_build/manifest.py re-exports them). A module of its own so
that the cache, which keys entries by them, imports no manifest (the import graph stays acyclic: manifest -> rare ->
ptxas -> cache)."""
import os

# NVRTC options for every unit (the arch and include path are added by the compiler wrapper). No
# -lineinfo by default: it embeds the PTX text and line tables in every cubin (about 60% of its bytes);
# PYDNN_LINEINFO=1 adds it (source lines in compute-sanitizer and profiler reports; keyed separately).
COMMON_OPTIONS = ("-std=c++17", "--ptxas-options=--warn-on-spills")
LINEINFO_ENV = "PYDNN_LINEINFO"


# PYDNN_FAST_COMPILE=1 adds --Ofast-compile=min (NVRTC 13): 37% fewer NVRTC CPU seconds over 12 sampled sm_90
# units (108 -> 68 s, NVRTC 13.5), but slower kernels: H200, NVRTC 13.0, tools/probe_fast_compile.py (mid-session
# run, 2026-11-28): gemm_tc 1.71-1.89x the time, gemm_tma 1.08-1.20x, fwd_wgmma 1.27-1.43x, softmax 1.04x.
# So off, and not for installs: only for compile checks that do not run the kernels. Keyed separately.
FAST_COMPILE_ENV = "PYDNN_FAST_COMPILE"
FAST_COMPILE_OPTION = "--Ofast-compile=min"


def common_options():
    """COMMON_OPTIONS, plus -lineinfo when PYDNN_LINEINFO=1 and --Ofast-compile=min when PYDNN_FAST_COMPILE=1
    (read at each call: the cache key follows them)."""
    opts = COMMON_OPTIONS
    if os.environ.get(LINEINFO_ENV, "0") not in ("", "0"):
        opts = opts[:1] + ("-lineinfo",) + opts[1:]
    if os.environ.get(FAST_COMPILE_ENV, "0") not in ("", "0"):
        opts = opts + (FAST_COMPILE_OPTION,)
    return opts
