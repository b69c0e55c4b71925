"""A compiled launch for the element-wise launch records (pydnn/ops/_elementwise.py's run_map).

run_map's per-call work - writing the pointers, scalars and flags into the record's params struct, picking
the vector or the scalar kernel by alignment, and cuLaunchKernel through cuda.bindings - is one C call here:
pydnn_map_launch(record, stream, out, in0, in1, in2, alpha, alpha2, beta, n). The record is a small C struct
kept beside the launch record (kernels, grids, blocks, masks, where the params struct is); cuLaunchKernel is
the driver's own entry point (dlsym of the libcuda cuda.bindings loaded). About 0.3 us of Python and
cuda.bindings argument conversion per call are saved (tools/bench_host_cpu.py).

Built with cffi on first use (one log line, about a second) into the cache (<cache>/lib/<python tag>/),
keyed by the source; without a C compiler or cffi, or with tuning.callpath.C_LAUNCH off, run_map launches
through driver.launch_args as before. Launches made while driver.launch_args is replaced (tests) or while
a plan is being recorded (pydnn/ops/_replay.py) take the Python path too (run_map checks).
"""
import ctypes
import hashlib
import importlib.util
import os
import sys
import tempfile
import threading

from .._cuda import driver
from .cache import cache_dir

CDEF = """
typedef struct {
    uint64_t params, argv, vec_func, scalar_func;
    uint32_t vec_grid[3], vec_block[3], scalar_grid[3], scalar_block[3];
    uint64_t in_masks, out_mask;
    uint32_t base_flags, flag_beta, flags_off, map_inputs;
} pydnn_map_rec_t;
int pydnn_fc_init(void);
int pydnn_map_launch(uintptr_t rec, uintptr_t stream, uintptr_t out, uintptr_t i0, uintptr_t i1, uintptr_t i2,
                     double alpha, double alpha2, double beta, int n);
"""

SOURCE = r"""
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    uint64_t params, argv, vec_func, scalar_func;
    uint32_t vec_grid[3], vec_block[3], scalar_grid[3], scalar_block[3];
    uint64_t in_masks, out_mask;
    uint32_t base_flags, flag_beta, flags_off, map_inputs;
} pydnn_map_rec_t;

typedef int (*pydnn_launch_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              void *, void **, void **);
static pydnn_launch_t pydnn_fc_launch;

int pydnn_fc_init(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!lib) lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (lib) pydnn_fc_launch = (pydnn_launch_t)dlsym(lib, "cuLaunchKernel");
    return pydnn_fc_launch != 0;
}

/* run_map's patch and launch: the params struct starts with out, in[map_inputs], alpha, alpha2, beta
   (pydnn/ops/_elementwise.py asserts the layout); flags at flags_off. Returns the driver's status. */
int pydnn_map_launch(uintptr_t rec, uintptr_t stream, uintptr_t out, uintptr_t i0, uintptr_t i1, uintptr_t i2,
                     double alpha, double alpha2, double beta, int n) {
    const pydnn_map_rec_t *r = (const pydnn_map_rec_t *)rec;
    unsigned char *p = (unsigned char *)(uintptr_t)r->params;
    uint64_t o = out, ins[3] = {i0, i1, i2};
    uint64_t mask = n == 0 ? 0 : n == 1 ? i0 : n == 2 ? (i0 | i1) : (i0 | i1 | i2);
    memcpy(p, &o, 8);
    for (unsigned k = 0; k < r->map_inputs && k < 3; k++) memcpy(p + 8 + 8 * k, &ins[k], 8);
    size_t sc = 8 + 8 * (size_t)r->map_inputs;
    memcpy(p + sc, &alpha, 8);
    memcpy(p + sc + 8, &alpha2, 8);
    memcpy(p + sc + 16, &beta, 8);
    uint32_t flags = r->base_flags | (beta != 0.0 ? r->flag_beta : 0);
    memcpy(p + r->flags_off, &flags, 4);
    int vec = (mask & r->in_masks) == 0 && (o & r->out_mask) == 0;
    const uint32_t *g = vec ? r->vec_grid : r->scalar_grid, *b = vec ? r->vec_block : r->scalar_block;
    return pydnn_fc_launch((void *)(uintptr_t)(vec ? r->vec_func : r->scalar_func), g[0], g[1], g[2], b[0], b[1],
                           b[2], 0, (void *)stream, (void **)(uintptr_t)r->argv, 0);
}
"""


class MapRec(ctypes.Structure):
    _fields_ = [("params", ctypes.c_uint64), ("argv", ctypes.c_uint64), ("vec_func", ctypes.c_uint64),
                ("scalar_func", ctypes.c_uint64), ("vec_grid", ctypes.c_uint32 * 3),
                ("vec_block", ctypes.c_uint32 * 3), ("scalar_grid", ctypes.c_uint32 * 3),
                ("scalar_block", ctypes.c_uint32 * 3), ("in_masks", ctypes.c_uint64), ("out_mask", ctypes.c_uint64),
                ("base_flags", ctypes.c_uint32), ("flag_beta", ctypes.c_uint32), ("flags_off", ctypes.c_uint32),
                ("map_inputs", ctypes.c_uint32)]


_lock = threading.Lock()
_state = {}  # "lib": the loaded module's lib, or None once loading failed


def _module_path():
    tag = hashlib.sha256((CDEF + SOURCE).encode()).hexdigest()[:12]
    return cache_dir() / "lib" / sys.implementation.cache_tag / f"_pydnn_fastcall_{tag}"


def _build(target_dir, name):
    import cffi

    ffib = cffi.FFI()
    ffib.cdef(CDEF)
    ffib.set_source(name, SOURCE, libraries=["dl"])
    target_dir.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=target_dir, prefix=".build-")
    try:
        built = ffib.compile(tmpdir=tmp, verbose=False)
        final = target_dir / os.path.basename(built)
        os.replace(built, final)
        return final
    finally:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


def _load():
    import logging

    base = _module_path()
    name = base.name
    found = [p for p in base.parent.glob(name + ".*")] if base.parent.is_dir() else []
    path = found[0] if found else None
    if path is None:
        logging.getLogger("pydnn").info("pydnn: compiling the element-wise launch helper (%s)", name)
        path = _build(base.parent, name)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if not mod.lib.pydnn_fc_init():
        return None
    return mod.lib


def launcher():
    """lib.pydnn_map_launch, or None when the helper cannot be had here (no compiler, no cffi, no libcuda)."""
    if "lib" not in _state:
        with _lock:
            if "lib" not in _state:
                try:
                    lib = _load()
                except Exception:  # noqa: BLE001 - any failure: the Python launch path
                    lib = None
                _state["lib"] = lib
    lib = _state["lib"]
    return None if lib is None else lib.pydnn_map_launch


def record(pr):
    """The C record of a Prepared launch (kept alive by the Prepared), or None when its kernels are not
    driver functions (a CPU handle's placeholders)."""
    from .params import FLAG_BETA, MAP_INPUTS, MapParams

    try:
        vf, sf = int(pr.vec_func), int(pr.scalar_func)
    except (TypeError, ValueError):
        return None
    r = MapRec()
    r.params, r.argv = ctypes.addressof(pr.params), pr.argv[1]
    r.vec_func, r.scalar_func = vf, sf
    r.vec_grid[:], r.vec_block[:] = list(pr.vec_grid), list(pr.vec_block)
    r.scalar_grid[:], r.scalar_block[:] = list(pr.scalar_grid), list(pr.block)
    r.in_masks, r.out_mask = pr.in_masks, pr.out_mask
    r.base_flags, r.flag_beta, r.flags_off, r.map_inputs = pr.base_flags, FLAG_BETA, MapParams.flags.offset, MAP_INPUTS
    return r


def driver_launch_untouched():
    return driver.launch_args is _LAUNCH_ARGS and not driver._recorders


_LAUNCH_ARGS = driver.launch_args
