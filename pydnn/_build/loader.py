"""Run-time kernel loading: the cubin for (unit, arch) from the cache, loaded once per context.

A unit missing from the cache (an arch the install did not build, or a cleared cache) is compiled here,
once, with one log line; importing pydnn never compiles.
"""
import threading

from .._cuda import driver, nvrtc
from .._log import log
from . import cache
from .manifest import unit_arch, unit_by_name

_lock = threading.Lock()
_modules = {}  # (context address, unit name) -> (CUmodule, {expr: lowered})
_units = None
_nv = None


def _unit(name):
    global _units
    if _units is None:
        _units = unit_by_name()
    return _units[name]


def register_units(units):
    """Make the loader know `units` that are outside the build (benchmark candidates and diagnostics):
    compile on first use finds units by name here; a no-op for units it already knows."""
    global _units
    if _units is None:
        _units = unit_by_name()
    for u in units:
        _units.setdefault(u.name, u)


def load_unit(arch, unit):
    """(cubin, lowered) for `unit` on `arch` (the device's: the unit's own target, unit_arch, is loaded),
    compiling into the cache on a miss. A unit that does not exist for `arch` raises KeyError."""
    global _nv
    if _nv is None:
        _nv = nvrtc.version()
    target = unit_arch(unit, arch)
    if target is None:
        raise KeyError(f"kernel unit {unit.name!r} is not built for {arch} (only {', '.join(unit.archs)})")
    path = cache.entry_path(unit, target, cache.unit_key(unit, target, _nv))
    entry = cache.read_entry(path)
    if entry is None:
        # the graph API's generated units (runtime fusion) compile here by design: info, not a warning
        (log.info if unit.name.startswith("graph.") else log.warning)(
            "pydnn: compiling kernel unit %s for %s (not in the cache at %s)", unit.name, arch, cache.cache_dir())
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
