"""Run-time kernel loading: the cubin for (unit, arch) from the cache, loaded once per context.

A unit missing from the cache (an arch the install did not build, or a cleared cache) is compiled here,
once, with one log line; importing pydnn never compiles.
"""
import threading

from .._cuda import driver, nvrtc
from .._log import log
from . import cache
from .manifest import unit_by_name

_lock = threading.Lock()
_modules = {}  # (context address, unit name) -> (CUmodule, {expr: lowered})
_units = None
_nv = None


def _unit(name):
    global _units
    if _units is None:
        _units = unit_by_name()
    return _units[name]


def load_unit(arch, unit):
    """(cubin, lowered) for `unit` on `arch`, compiling into the cache on a miss."""
    global _nv
    if _nv is None:
        _nv = nvrtc.version()
    path = cache.entry_path(unit, arch, cache.unit_key(unit, arch, _nv))
    entry = cache.read_entry(path)
    if entry is None:
        log.warning("pydnn: compiling kernel unit %s for %s (not in the cache at %s)",
                    unit.name, arch, cache.cache_dir())
        from .build import compile_unit

        entry = compile_unit(unit, arch, _nv)
    return entry


def get_function(ctx, arch, unit_name, expr):
    key = (int(ctx), unit_name)
    with _lock:
        mod = _modules.get(key)
        if mod is None:
            unit = _unit(unit_name)
            cubin, lowered = load_unit(arch, unit)
            with driver.pushed(ctx):  # load into the handle's context, whatever is current
                mod = (driver.module_load(cubin), lowered)
            _modules[key] = mod
    module, lowered = mod
    if expr not in lowered:
        raise KeyError(f"kernel {expr!r} is not instantiated in unit {unit_name!r}")
    return driver.module_function(module, lowered[expr])
