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

# NVRTC options for every unit (the arch and include path are added by the compiler wrapper).
COMMON_OPTIONS = ("-std=c++17", "-lineinfo", "--ptxas-options=--warn-on-spills")


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


def unit_arch(unit, arch):
    """The NVRTC target `unit` compiles to for the device arch `arch` ('sm_90' -> 'sm_90a' for a unit
    restricted to sm_90a), or None when the unit does not exist for that arch."""
    if not unit.archs:
        return arch
    for a in unit.archs:
        if a == arch or (a.endswith("a") and a[:-1] == arch):
            return a
    return None


def all_units():
    units = []
    for mod in FAMILIES:
        units.extend(importlib.import_module(mod).kernel_units())
    names = [u.name for u in units]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise AssertionError(f"duplicate kernel unit names: {sorted(dup)}")
    return units


def unit_by_name():
    return {u.name: u for u in all_units()}
