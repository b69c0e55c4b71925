"""Compile kernel units to the cache: the install-time build and `python -m pydnn build`.

Units compile in parallel threads (NVRTC releases the GIL while it compiles). An entry already in the
cache with a valid digest is skipped, so rebuilding unchanged sources compiles nothing.
"""
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed

from .._cuda import nvrtc
from . import cache
from .manifest import all_units, common_options, install_units, unit_arch

DEFAULT_ARCHS = ("sm_80", "sm_90")
BUILD_ALL_ENV = "PYDNN_BUILD_ALL"
# Rough SASS kilobytes per instantiation of each source on sm_90 (tools/build_stats.py; compile time follows
# the code size, about 20 CPU-seconds per MB): the cost model of units that unit_costs.py has not measured.
# (session 32, measured: conv_tma.cu's one-instantiation units 1.8-15.8 CPU s, mean 7.8, where the default weight
# guessed 0.3; attention_ws.cu's ~1.1 s an instantiation against 120's 2.4)
_WEIGHT = {"convolution.cu": 200, "conv_wgrad_wgmma.cu": 200, "normalization.cu": 150, "matmul.cu": 100,
           "attention.cu": 70, "attention_wgmma.cu": 70, "attention_wgmma_bwd.cu": 70, "attention_ws.cu": 55,
           "conv_tma.cu": 390, "reduce.cu": 55, "pooling.cu": 35, "softmax.cu": 30}


def _cost(unit, arch=None):
    """A unit's estimated NVRTC CPU seconds on `arch`: the measured seconds of unit_costs.py scaled by its
    instantiation count now against then, else the SASS-size model. The build starts the costliest units
    first, so that the last one to finish is a small one and no core idles through a long tail (a 2-core
    build ends within about half the last unit's time of sum / 2)."""
    from .unit_costs import COSTS

    n = len(getattr(unit, "exprs", ()))
    table = COSTS.get(arch or "sm_90", {})
    # a split-off part (<unit>.a80 / .a90, .rare<i>) unmeasured itself: its family unit's seconds an instantiation
    # (the SASS-size model put normalization.f16.a90 at 30 s against 25.7 measured for the whole family unit)
    got = table.get(getattr(unit, "name", "")) or table.get(getattr(unit, "home", "") or None)
    if got is not None and got[1]:
        return got[0] * n / got[1]
    return n * _WEIGHT.get(getattr(unit, "source", ""), 15) * 0.02


def build_everything():
    """PYDNN_BUILD_ALL=1: the install (and `python -m pydnn build`) compiles the first-use units too."""
    return os.environ.get(BUILD_ALL_ENV, "0") not in ("", "0")


def _norm_arch(a):
    a = a.strip().lower()
    if a.startswith("compute_"):
        a = "sm_" + a[len("compute_"):]
    if not a.startswith("sm_"):
        a = "sm_" + a.replace(".", "")
    return a


def target_archs(archs=None):
    """PYDNN_CUDA_ARCHS (comma separated: 'sm_80,sm_90' or '8.0,9.0'), else the GPUs present, else
    sm_80 and sm_90."""
    if archs:
        return sorted({_norm_arch(a) for a in archs})
    env = os.environ.get("PYDNN_CUDA_ARCHS")
    if env:
        return sorted({_norm_arch(a) for a in env.split(",") if a.strip()})
    try:
        from .._cuda import driver

        if driver.available():
            return sorted({driver.device_arch(i) for i in range(driver.device_count())})
    except Exception:  # noqa: BLE001 - no driver: fall back to the defaults
        pass
    return list(DEFAULT_ARCHS)


def compile_unit(unit, arch, nv_version=None, ptx_out=None):
    """Compile one unit for one arch and store it; returns (cubin, lowered). `arch` is the device's
    ('sm_90'); the unit's own target (unit_arch: 'sm_90a' for an arch-specific unit) is compiled and keyed.
    ptx_out: a list that NVRTC's PTX is appended to (compile_shared)."""
    target = unit_arch(unit, arch)
    if target is None:
        raise ValueError(f"kernel unit {unit.name} is not built for {arch} (only {', '.join(unit.archs)})")
    arch = target
    nv_version = nv_version or nvrtc.version()
    key = cache.unit_key(unit, arch, nv_version)
    text, _ = cache.unit_inputs(unit)
    cubin, lowered, _log = nvrtc.compile_cubin(text, unit.source, unit.exprs, arch,
                                               common_options() + tuple(unit.options), [str(cache.ptx_dir())],
                                               unit=unit.name, ptx_out=ptx_out)
    cache.write_entry(cache.entry_path(unit, arch, key), cubin, lowered)
    return cubin, lowered


def compile_shared(unit, first, second, nv_version=None):
    """Compile `unit` for the arch `first` with NVRTC and assemble the same PTX for `second` with the paired
    ptxas (pydnn/_build/ptxas.py: the same SASS as NVRTC's own compile for `second`, without a second front end
    and NVVM pass); store both entries. Falls back to NVRTC for `second` when NVRTC gave no PTX."""
    from . import ptxas

    nv_version = nv_version or nvrtc.version()
    ptx = []
    _, lowered = compile_unit(unit, first, nv_version, ptx_out=ptx)
    if not ptx or ptxas.arch_dependent_ptx(ptx[0]):   # (a double -> bfloat16 store: types.cuh's arch branch)
        return compile_unit(unit, second, nv_version)
    cubin = ptxas.assemble(ptx[0], second, common_options() + tuple(unit.options), unit=unit.name)
    cache.write_entry(cache.entry_path(unit, second, cache.unit_key(unit, second, nv_version)), cubin, lowered)
    return cubin, lowered


def _pair_jobs(todo):
    """[(unit, arch, second arch or None)]: the (unit, arch) items of `todo`, those of a unit that can share one
    NVVM pass between the archs of ptxas.PAIRS (same instantiations and options on both, arch-neutral source,
    default options, a ptxas of NVRTC's release: pydnn/_build/ptxas.py) joined into one job."""
    from . import ptxas
    from .manifest import KernelUnit

    jobs = [(u, a, None) for u, a in todo]
    if os.environ.get(ptxas.ENV, "") == "0":
        return jobs
    index = {(u.name, a): i for i, (u, a) in enumerate(todo)}
    drop, found = set(), None
    for first, second in ptxas.PAIRS:
        for i, (u, a) in enumerate(todo):
            j = index.get((u.name, second))
            if a != first or j is None:
                continue
            v = todo[j][0]
            if not (isinstance(u, KernelUnit) and isinstance(v, KernelUnit)):
                continue
            if (v.exprs != u.exprs or v.options != u.options or v.source != u.source
                    or unit_arch(u, first) != first or unit_arch(v, second) != second):
                continue
            if not (ptxas.options_ok(common_options() + tuple(u.options)) and ptxas.arch_neutral(u)):
                continue
            if found is None:
                found = ptxas.find() is not None
            if not found:
                return jobs
            jobs[i] = (u, first, second)
            drop.add(j)
    return [job for k, job in enumerate(jobs) if k not in drop]


def _job_cost(job):
    u, a, b = job
    # the second arch's share of a shared job: ptxas only, 0.52 of that arch's NVRTC time on average (build_stats
    # --check-shared, 58 units, NVRTC 13.5 here and 13.0 on the H200 host: 0.23 rnn.f32 .. 0.80 conv_bias.f16, a small unit)
    return _cost(u, a) + (0.52 * _cost(u, b) if b else 0.0)


def _run_job(job, nv):
    u, a, b = job
    return compile_shared(u, a, b, nv) if b else compile_unit(u, a, nv)


def _usable_cpus():
    """The CPUs this process may run on (a container's or taskset's limit), not the host's count: one NVRTC
    thread a usable CPU."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 2


def build_all(archs=None, progress=True, jobs=None, units=None, everything=None, prefixes=None, install_only=False):
    """Compile the units of every target arch that the cache lacks: those the install builds
    (manifest.install_units; with `everything`, default PYDNN_BUILD_ALL, every unit, the first-use ones
    too), or the given `units` (KernelUnits, used as they are on every arch), or the units whose names
    start with one of `prefixes` (every such unit, first-use ones too, unless `install_only`: then only
    those the install builds, so that a test run afterwards compiles the first-use ones as a user would).
    Returns (compiled, skipped)."""
    archs = target_archs(archs)
    nv = nvrtc.version()
    everything = build_everything() if everything is None else everything
    todo, skipped = [], 0
    for arch in archs:
        if units is not None:
            arch_units = units
        else:
            arch_units = all_units(arch) if everything or (prefixes and not install_only) else install_units(arch)
            if prefixes:
                arch_units = [u for u in arch_units if u.name.startswith(tuple(prefixes))]
        for u in arch_units:
            target = unit_arch(u, arch)
            if target is None:
                continue  # an arch-specific unit (sm_90a) on another arch: not built, not counted
            if cache.read_entry(cache.entry_path(u, target, cache.unit_key(u, target, nv))) is None:
                todo.append((u, arch))
            else:
                skipped += 1
    out = sys.stderr
    if progress:
        print(f"pydnn: {len(todo)} kernel units to compile for {','.join(archs)} "
              f"({skipped} already cached; NVRTC {'.'.join(map(str, nv))}) into {cache.cache_dir()}", file=out,
              flush=True)
    if not todo:
        return 0, skipped
    work = sorted(_pair_jobs(todo), key=lambda j: -_job_cost(j))   # longest first: the build ends on small units
    jobs = jobs or min(len(work), max(2, _usable_cpus()))
    bar = Progress(len(todo), out) if progress else None
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futs = {pool.submit(_run_job, job, nv): job for job in work}
        try:
            for f in as_completed(futs):
                f.result()  # re-raise a compile error with its NVRTC log
                if bar is not None:
                    u, a, b = futs[f]
                    bar.step(f"{u.name} {a}")
                    if b:
                        bar.step(f"{u.name} {b} (ptxas)")
        finally:
            if bar is not None:
                bar.close()
    return len(todo), skipped


class Progress:
    """The install-time build's progress: a tqdm bar when tqdm is importable and `out` is a terminal, else a
    rich bar likewise, else plain lines a log keeps readable (one per ~5% and the last, with elapsed time and
    an estimate of what remains). PYDNN_PROGRESS=plain forces the lines, =none silences them."""

    def __init__(self, total, out=None, style=None):
        self.total, self.done, self.out = total, 0, out or sys.stderr
        self.t0 = time.time()
        self.style = style or os.environ.get("PYDNN_PROGRESS") or self._pick()
        self._bar = self._rich = None
        if self.style == "tqdm":
            from tqdm import tqdm

            self._bar = tqdm(total=total, file=self.out, unit="unit", desc="pydnn kernels", dynamic_ncols=True)
        elif self.style == "rich":
            from rich.progress import Progress as RichProgress

            self._rich = RichProgress(transient=False)
            self._rich.start()
            self._bar = self._rich.add_task("pydnn kernels", total=total)
        self._next_line = 0

    def _pick(self):
        isatty = getattr(self.out, "isatty", lambda: False)()
        if isatty:
            for name in ("tqdm", "rich"):
                try:
                    __import__(name)
                    return name
                except ImportError:
                    continue
        return "plain"

    def step(self, what=""):
        self.done += 1
        if self.style == "tqdm":
            self._bar.set_postfix_str(what, refresh=False)
            self._bar.update(1)
        elif self.style == "rich":
            self._rich.update(self._bar, advance=1, description=f"pydnn kernels {what}")
        elif self.style == "plain":
            if self.done >= self._next_line or self.done == self.total:
                self._next_line = self.done + max(1, self.total // 20)
                el = time.time() - self.t0
                eta = el / self.done * (self.total - self.done)
                print(f"pydnn: compiled {self.done}/{self.total} kernel units ({100 * self.done // self.total}%) "
                      f"in {el:.0f}s, about {eta:.0f}s left{f' (last: {what})' if what else ''}",
                      file=self.out, flush=True)

    def close(self):
        if self.style == "tqdm":
            self._bar.close()
        elif self.style == "rich":
            self._rich.stop()


def prune(archs=None):
    """Remove cached cubins that no current unit and arch maps to; returns how many."""
    nv = nvrtc.version()
    keep = [cache.entry_path(u, t, cache.unit_key(u, t, nv)) for a in target_archs(archs) for u in all_units(a)
            for t in [unit_arch(u, a)] if t is not None]
    return cache.prune(keep)
