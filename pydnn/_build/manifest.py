"""The kernel manifest: which template instantiations of which source exist.

A KernelUnit is one NVRTC translation unit: one source file in ptx/ compiled with a list of template
instantiations (name expressions). Each op family declares its units next to the code that chooses among
them (a `kernel_units()` function in its module), so the list of variants and the chooser cannot drift;
FAMILIES below names those modules. Units are the granularity of the cache and of the parallel build.
"""
import importlib
from dataclasses import dataclass, field

# Op-family modules that declare kernel units; the build compiles all of them.
FAMILIES = (
    "pydnn.ops.activation",
    "pydnn.ops.tensor_ops",
    "pydnn.ops.softmax",
    "pydnn.ops.reduce",
    "pydnn.ops.pooling",
    "pydnn.ops.batchnorm",
    "pydnn.ops.normalization",
    "pydnn.ops.dropout",
    "pydnn.ops.convolution",
    "pydnn.ops.attention",
    "pydnn.ops.attention_wgmma",
    "pydnn.ops.attention_wgmma_bwd",
    "pydnn.ops.matmul",
    "pydnn.ops.mha",
    "pydnn.ops.rnn",
)

from .options import COMMON_OPTIONS, FAST_COMPILE_ENV, FAST_COMPILE_OPTION, LINEINFO_ENV, common_options  # noqa: F401


@dataclass(frozen=True)
class KernelUnit:
    name: str                 # unique, used in cache file names: "activation.f32"
    source: str               # file under ptx/: "activation.cu"
    exprs: tuple              # name expressions: "pydnn::act_fwd<float, pydnn::Relu, 4>"
    options: tuple = field(default=())
    # The only targets the unit is built for, () = every arch. An arch-specific target ("sm_90a": wgmma,
    # setmaxnreg) is used when the target arch is its base ("sm_90"); other archs skip the unit (not
    # built, not loadable): see unit_arch.
    archs: tuple = field(default=())
    # False: rare variants (pydnn/_build/rare.py) not compiled at install but on first use (one log line),
    # into the same cache; `home` is then the family unit whose expressions these are (the name planners
    # and handle.function use: the loader finds an expression's unit through it).
    install: bool = field(default=True)
    home: str = field(default="")


def unit_arch(unit, arch):
    """The NVRTC target `unit` compiles to for the device arch `arch` ('sm_90' -> 'sm_90a' for a unit
    restricted to sm_90a), or None when the unit does not exist for that arch."""
    if not unit.archs:
        return arch
    for a in unit.archs:
        if a == arch or (a.endswith("a") and a[:-1] == arch):
            return a
    return None


def install_units(arch=None):
    """The units the install-time build compiles for `arch` (KernelUnit.install); the rest compile on first
    use. arch None: the split of the rules that hold on every arch."""
    return [u for u in all_units(arch) if u.install]


def family_units():
    """Every family's units as the families declare them (before the install / first-use split)."""
    units = []
    for mod in FAMILIES:
        units.extend(importlib.import_module(mod).kernel_units())
    return units


def all_units(arch=None):
    """Every unit the cache can hold for `arch`: each family unit whose expressions include rare variants
    on that arch (pydnn/_build/rare.py) split into the unit of the rest, under its own name, compiled at
    install, and `<name>.rare<i>` units, compiled on first use. arch None: the rules of every arch only."""
    from .rare import split

    units = split(family_units(), arch)
    names = [u.name for u in units]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise AssertionError(f"duplicate kernel unit names: {sorted(dup)}")
    return units


def unit_by_name(arch=None):
    return {u.name: u for u in all_units(arch)}
