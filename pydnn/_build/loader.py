"""Run-time kernel loading: the cubin for (unit, arch) from the cache, loaded once per context.

A unit missing from the cache (an arch the install did not build, a rare variant the install leaves to
first use: pydnn/_build/rare.py, or a cleared cache) is compiled here, once, with one log line; importing
pydnn never compiles. Planners name a kernel by its family unit and expression; on each arch the loader
finds the unit that holds the expression after the install / first-use split (KernelUnit.home).
"""
import threading

from .._cuda import driver, nvrtc
from .._log import log
from . import cache
from .manifest import unit_arch, unit_by_name

_lock = threading.Lock()
_modules = {}  # (context address, unit name) -> (CUmodule, {expr: lowered})
_units = {}     # arch number -> {unit name: KernelUnit} (the split of that arch)
_homes = {}     # arch number -> {(family unit name, expr): unit name} for the expressions split off
_extra = {}     # units registered from outside the build (register_units), every arch
_nv = None


def _tables(arch):
    from .rare import arch_number

    n = arch_number(arch)
    units = _units.get(n)
    if units is None:
        units = unit_by_name(arch)
        for name, u in _extra.items():
            units.setdefault(name, u)
        _homes[n] = {(u.home, e): u.name for u in units.values() if u.home for e in u.exprs}
        _units[n] = units
    return units, _homes[n]


def _unit(name, arch=None):
    return _tables(arch)[0][name]


def resolve(arch, unit_name, expr):
    """The name of the unit that holds `expr` of the family unit `unit_name` on `arch`."""
    return _tables(arch)[1].get((unit_name, expr), unit_name)


def register_units(units):
    """Make the loader know `units` that are outside the build (benchmark candidates and diagnostics):
    compile on first use finds units by name here; a no-op for units it already knows."""
    for u in units:
        _extra.setdefault(u.name, u)
        for table in _units.values():
            table.setdefault(u.name, u)


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
        why = ("first use: not built at install" if not unit.install
               else f"not in the cache at {cache.cache_dir()}")
        (log.info if unit.name.startswith("graph.") else log.warning)(
            "pydnn: compiling kernel unit %s for %s (%s)", unit.name, arch, why)
        from .build import compile_unit

        others = _together(arch, unit)
        if not others:
            return compile_unit(unit, arch, _nv)
        # a `together` rule's units (rare.py: e.g. grouped convolutions): all of this data type now, in parallel
        # (NVRTC releases the GIL), so that a model's first step waits for the longest, not for their sum
        from concurrent.futures import ThreadPoolExecutor
        from .build import _usable_cpus

        for u in others:
            log.warning("pydnn: compiling kernel unit %s for %s (first use, with %s: not built at install)",
                        u.name, arch, unit.name)
        with ThreadPoolExecutor(max_workers=min(len(others) + 1, max(1, _usable_cpus()))) as pool:
            futs = [pool.submit(compile_unit, u, arch, _nv) for u in (unit, *others)]
            entry = futs[0].result()
            for f in futs[1:]:
                f.result()
    return entry


def _together(arch, unit):
    """The other first-use units of `unit`'s together group (rare.together_key) that `arch` lacks in the cache."""
    from .rare import together_key

    key = together_key(unit)
    if key is None:
        return []
    out = []
    for u in _tables(arch)[0].values():
        target = unit_arch(u, arch)
        if u.name == unit.name or target is None or together_key(u) != key:
            continue
        if cache.read_entry(cache.entry_path(u, target, cache.unit_key(u, target, _nv))) is None:
            out.append(u)
    return out


def get_function(ctx, arch, unit_name, expr):
    with _lock:
        unit_name = resolve(arch, unit_name, expr)
        key = (int(ctx), unit_name)
        mod = _modules.get(key)
        if mod is None:
            unit = _unit(unit_name, arch)
            cubin, lowered = load_unit(arch, unit)
            with driver.pushed(ctx):  # load into the handle's context, whatever is current
                mod = (driver.module_load(cubin), lowered)
            _modules[key] = mod
    module, lowered = mod
    if expr not in lowered:
        raise KeyError(f"kernel {expr!r} is not instantiated in unit {unit_name!r}")
    return driver.module_function(module, lowered[expr])
