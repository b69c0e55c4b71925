"""Measure the kernel build: NVRTC CPU seconds (user + sys) and wall per unit, and cubin bytes per unit and
per arch, from what the build writes. The machine this runs on may be shared, so CPU seconds are the figure
to compare; the compile runs in this process, one unit at a time.

    python tools/build_stats.py --arch sm_90 [--sample 4] [--units conv,matmul] [--options=-lineinfo]
        [--all] [--json out.json] [--procs 14]

--sample N times every N-th unit of each source (at least one per source) and extrapolates each source's
time by its units' name-expression counts; --all (the default without --sample) times every unit. Sizes
come from compiling too (what the build would write). --cached reads sizes from the existing cache instead
of compiling (no timing). --rare includes the first-use units (KernelUnit.install=False).

    python tools/build_stats.py --model [--jobs 2] [--scale 0.72] [--families]

--model replays this tree's default install (sm_80 + sm_90, the shared NVVM pass's pairing as the build makes
it) on the build's own cost model (build._job_cost: unit_costs.py scaled by instantiations), `jobs` workers
longest first, and prints the end in model seconds and x --scale (default CALIBRATION: the host's measured
2-core seconds per model second).

    python tools/build_stats.py --predict sm80.json sm90.json [--jobs 2] [--scale 0.7]
    python tools/build_stats.py --write-costs sm80.json sm90.json

--predict reads the --json files of full runs (every install unit of an arch timed; rows of other units,
or of units no longer in the install, are left out) and replays the build: its longest-first order
(build._cost), `jobs` workers each taking the next unit when free. It prints the sum of CPU seconds, sum /
jobs, the longest unit and the simulated end (the predicted wall time on `jobs` dedicated cores; --scale
multiplies every unit's seconds, e.g. by another machine's ratio measured on a sample). --write-costs
writes pydnn/_build/unit_costs.py (the build's order) from such files.
"""
import argparse
import json
import os
import sys
import time
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pydnn._build import cache, manifest  # noqa: E402
from pydnn._cuda import nvrtc  # noqa: E402


def cpu_now():
    t = os.times()
    return t.user + t.system


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--sample", type=int, default=0)
    ap.add_argument("--units", default="", help="comma-separated unit-name prefixes")
    ap.add_argument("--options", default=None, help="replace manifest.COMMON_OPTIONS (space separated)")
    ap.add_argument("--cached", action="store_true", help="sizes of the existing cache entries, no compiling")
    ap.add_argument("--rare", action="store_true", help="also the first-use (install=False) units")
    ap.add_argument("--json", default=None)
    ap.add_argument("--predict", nargs="+", default=None, metavar="JSON")
    ap.add_argument("--write-costs", nargs="+", default=None, metavar="JSON")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--procs", type=int, default=1, help="time the units in this many worker processes at once "
                    "(each unit's CPU seconds are its worker's; for a wide, otherwise idle machine)")
    ap.add_argument("--scale", type=float, default=None)
    ap.add_argument("--model", action="store_true", help="replay this tree's default install on the cost model")
    ap.add_argument("--families", action="store_true", help="with --model: each job's model seconds, the build's order")
    ap.add_argument("--check-shared", action="store_true", help="for every unit that shares one NVVM pass "
                    "(pydnn/_build/ptxas.py): NVRTC for sm_80 (+PTX) and for sm_90, ptxas of the PTX for sm_90; "
                    "CPU seconds of each, and whether every kernel's SASS (.text) is the same both ways")
    ap.add_argument("--verify-ptx", action="store_true", help="for the units whose sources have __CUDA_ARCH__ paths: "
                    "compare NVRTC's PTX for compute_80 and compute_90 of their common install part and write the "
                    "identical ones to pydnn/_build/ptx_verified.py (they then share one NVVM pass)")
    ap.add_argument("--phases", action="store_true", help="NVRTC's own split of each unit (--time): front end, "
                    "NVVM optimizer, PTX to SASS, in ms of wall (one compile at a time: ~ CPU)")
    args = ap.parse_args(argv)
    if args.model:
        return model(args.jobs, CALIBRATION if args.scale is None else args.scale, args.families)
    if args.scale is None:
        args.scale = 1.0
    if args.predict:
        return predict(args.predict, args.jobs, args.scale)
    if args.write_costs:
        return write_costs(args.write_costs)
    if args.check_shared:
        return check_shared(args.units, args.json)
    if args.verify_ptx:
        return verify_ptx(args.units)

    units = manifest.all_units(args.arch) if args.rare else manifest.install_units(args.arch)
    if args.units:
        pre = tuple(p.strip() for p in args.units.split(",") if p.strip())
        units = [u for u in units if u.name.startswith(pre)]
    units = [u for u in units if manifest.unit_arch(u, args.arch) is not None]
    by_src = defaultdict(list)
    for u in units:
        by_src[u.source].append(u)
    if args.sample:
        chosen = [u for us in by_src.values() for i, u in enumerate(us) if i % args.sample == 0]
    else:
        chosen = units
    opts = manifest.common_options() if args.options is None else tuple(args.options.split())
    nv = nvrtc.version()
    rows = []
    if args.procs > 1 and not args.cached:   # a pool of processes, each timing its own units (a wide machine)
        rows = _time_in_pool(chosen, args.arch, opts, args.procs, args.json)
        chosen = []
    for u in chosen:
        target = manifest.unit_arch(u, args.arch)
        if args.cached:
            entry = cache.read_entry(cache.entry_path(u, target, cache.unit_key(u, target, nv)))
            if entry is None:
                print(f"{u.name}: not cached", file=sys.stderr)
                continue
            rows.append(dict(unit=u.name, source=u.source, exprs=len(u.exprs), cpu=None, wall=None,
                             bytes=len(entry[0])))
            continue
        text, _ = cache.unit_inputs(u)
        tfile = _phase_file() if args.phases else None
        extra = (f"--time={tfile}",) if tfile else ()
        c0, w0 = cpu_now(), time.time()
        cubin, _lowered, _log = nvrtc.compile_cubin(text, u.source, u.exprs, target,
                                                    opts + tuple(u.options) + extra,
                                                    [str(cache.ptx_dir())], unit=u.name)
        cpu, wall = cpu_now() - c0, time.time() - w0
        row = dict(unit=u.name, source=u.source, exprs=len(u.exprs), cpu=cpu, wall=wall, bytes=len(cubin))
        ph = ""
        if tfile:
            row["phases"] = _read_phases(tfile)
            ph = "  " + " ".join(f"{k} {v / 1e3:5.1f}s" for k, v in row["phases"].items())
        rows.append(row)
        print(f"{u.name:40s} {len(u.exprs):4d} exprs  cpu {cpu:6.1f}s  wall {wall:6.1f}s  "
              f"{len(cubin) / 1e6:6.2f} MB{ph}", flush=True)
        if args.json:
            with open(args.json + ".partial", "a") as f:
                f.write(json.dumps(dict(row, arch=args.arch)) + "\n")

    # per source: measured units, extrapolated to all units of the source by name-expression counts
    total_cpu = total_bytes = 0.0
    print(f"\n{'source':28s} units  cpu(s, est)   MB(est)")
    summary = {}
    for src, us in sorted(by_src.items()):
        got = [r for r in rows if r["source"] == src]
        if not got:
            continue
        e_all = sum(len(u.exprs) for u in us)
        e_got = sum(r["exprs"] for r in got)
        scale = e_all / e_got if e_got else 1.0
        cpu = sum(r["cpu"] or 0 for r in got) * scale
        mb = sum(r["bytes"] for r in got) * scale / 1e6
        total_cpu += cpu
        total_bytes += mb
        summary[src] = dict(units=len(us), cpu=cpu, mb=mb)
        print(f"{src:28s} {len(us):5d}  {cpu:9.0f}   {mb:8.1f}")
    print(f"{'total ' + args.arch:28s} {len(units):5d}  {total_cpu:9.0f}   {total_bytes:8.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(arch=args.arch, nvrtc=nv, options=list(opts), rows=rows, summary=summary,
                           total_cpu=total_cpu, total_mb=total_bytes), f, indent=1)


def elf_sections(elf):
    """{section name: bytes} of an ELF64 cubin (SHT_NOBITS sections empty)."""
    import struct

    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    hdrs = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    stro = hdrs[shstrndx][4]
    out = {}
    for h in hdrs:
        name = elf[stro + h[0]: elf.index(b"\0", stro + h[0])].decode()
        out[name] = elf[h[4]:h[4] + h[5]] if h[1] != 8 else b""
    return out


def sass(elf):
    """{kernel section: code} of a cubin's .text sections; the hash in internal-linkage names (it follows the
    options, so the arch) is blanked."""
    import re

    return {re.sub(r"_cu_[0-9a-f]{8}_", "_cu_X_", k): v for k, v in elf_sections(elf).items() if k.startswith(".text")}


def check_shared(prefixes="", json_path=None):
    """--check-shared: each install unit that shares one NVVM pass (build._pair_jobs with every unit of both
    archs to do), compiled the three ways; rows (and .partial lines) with CPU seconds, phases and the verdict."""
    import resource
    from pydnn._build import build, ptxas

    if ptxas.find() is None:
        print("no ptxas of NVRTC's release: " + "; ".join(ptxas.describe()))
        return 1
    todo = [(u, a) for a in ("sm_80", "sm_90") for u in manifest.install_units(a) if manifest.unit_arch(u, a)]
    shared = [(u, a, b) for u, a, b in build._pair_jobs(todo) if b]
    if prefixes:
        pre = tuple(p.strip() for p in prefixes.split(",") if p.strip())
        shared = [j for j in shared if j[0].name.startswith(pre)]
    print(f"{len(shared)} shared units; ptxas {ptxas.find()}", flush=True)
    rows, bad = [], 0
    part = open(json_path + ".partial", "a") if json_path else None
    for u, a, b in shared:
        text, _ = cache.unit_inputs(u)
        opts = manifest.common_options() + tuple(u.options)
        row = dict(unit=u.name, exprs=len(u.exprs))
        for arch in (a, b):
            tfile = _phase_file()
            ptx = []
            c0 = cpu_now()
            cub, _, _ = nvrtc.compile_cubin(text, u.source, u.exprs, arch, opts + (f"--time={tfile}",),
                                            [str(cache.ptx_dir())], unit=u.name, ptx_out=ptx)
            row[f"cpu_{arch}"] = cpu_now() - c0
            row[f"phases_{arch}"] = _read_phases(tfile)
            if arch == a:
                first_ptx = ptx[0]
            else:
                direct = cub
        if ptxas.arch_dependent_ptx(first_ptx):   # the build compiles this one's sm_90 with NVRTC (compile_shared)
            row.update(cpu_ptxas=row[f"cpu_{b}"], kernels=None, sass_same=True, sass_differ=[], fallback=True)
            rows.append(row)
            print(f"{u.name:36s} NVRTC {a} {row[f'cpu_{a}']:5.1f}s  NVRTC {b} {row[f'cpu_{b}']:5.1f}s  "
                  f"arch-dependent PTX (double -> bfloat16): the build compiles {b} with NVRTC", flush=True)
            if part:
                part.write(json.dumps(row) + "\n")
                part.flush()
            continue
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        c0 = cpu_now()
        asm = ptxas.assemble(first_ptx, b, opts, unit=u.name)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        row["cpu_ptxas"] = (cpu_now() - c0) + (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
        sa, sb = sass(direct), sass(asm)
        row["kernels"] = len(sa)
        row["sass_same"] = sa == sb
        row["sass_differ"] = sorted(k for k in set(sa) | set(sb) if sa.get(k) != sb.get(k))
        bad += not row["sass_same"]
        rows.append(row)
        print(f"{u.name:36s} NVRTC {a} {row[f'cpu_{a}']:5.1f}s  NVRTC {b} {row[f'cpu_{b}']:5.1f}s  "
              f"ptxas {b} {row['cpu_ptxas']:5.1f}s  {row['kernels']:3d} kernels, SASS "
              f"{'identical' if row['sass_same'] else 'DIFFERS in %d' % len(row['sass_differ'])}", flush=True)
        if part:
            part.write(json.dumps(row) + "\n")
            part.flush()
    n80 = sum(r["cpu_sm_80"] for r in rows)
    n90 = sum(r["cpu_sm_90"] for r in rows)
    px = sum(r["cpu_ptxas"] for r in rows)
    print(f"\n{len(rows)} units: NVRTC sm_80 {n80:.0f} CPU s + NVRTC sm_90 {n90:.0f} -> sm_80 {n80:.0f} + ptxas sm_90 "
          f"{px:.0f} (saves {n90 - px:.0f} CPU s); SASS different in {bad} units")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(dict(nvrtc=nvrtc.version(), ptxas=ptxas.find(), rows=rows), f, indent=1)
    return 1 if bad else 0


def _ptx(unit, arch):
    """NVRTC's PTX of `unit` for the virtual arch `arch` (compute_80): front end and NVVM only."""
    from cuda.bindings import nvrtc as n

    text, _ = cache.unit_inputs(unit)
    _, prog = n.nvrtcCreateProgram(text.encode(), unit.source.encode(), 0, [], [])
    try:
        for e in unit.exprs:
            n.nvrtcAddNameExpression(prog, e.encode())
        opts = [f"--gpu-architecture={arch}", *manifest.common_options(), *unit.options,
                f"--include-path={cache.ptx_dir()}"]
        err = n.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        if err[0] != n.nvrtcResult.NVRTC_SUCCESS:
            raise RuntimeError(f"{unit.name} {arch}: {err[0]}")
        _, size = n.nvrtcGetPTXSize(prog)
        buf = bytearray(size)
        n.nvrtcGetPTX(prog, buf)
        return bytes(buf).rstrip(b"\0").decode(errors="replace")
    finally:
        n.nvrtcDestroyProgram(prog)


def _ptx_body(ptx):
    """PTX without its .version / .target lines and comments, the internal-linkage hash (it follows the options)
    blanked."""
    import re

    return [re.sub(r"_cu_[0-9a-f]{8}_", "_cu_X_", line) for line in ptx.splitlines()
            if not line.startswith((".version", ".target", "//"))]


def verify_ptx(prefixes=""):
    """--verify-ptx: every family unit built for sm_80 and sm_90 whose common install part (rare.py's rules of
    both) is not arch-neutral by its text alone; PTX of both compared; pydnn/_build/ptx_verified.py rewritten with
    the identical ones (and the entries of units not checked now kept as they were)."""
    from dataclasses import replace
    from pydnn._build import ptxas, rare

    try:
        from pydnn._build.ptx_verified import VERIFIED
    except ImportError:
        VERIFIED = {}
    keep = dict(VERIFIED)
    pre = tuple(p.strip() for p in prefixes.split(",") if p.strip())
    for f in manifest.family_units():
        if f.archs or not f.install or (pre and not f.name.startswith(pre)):
            continue
        k80 = [e for e in f.exprs if not rare.is_rare(f.name, e, "sm_80")]
        k90 = [e for e in f.exprs if not rare.is_rare(f.name, e, "sm_90")]
        common = tuple(e for e in k80 if e in k90)
        if not common:
            continue
        u = replace(f, exprs=common)
        text, headers = cache.unit_inputs(u)
        if not (ptxas._arch_text(text) or any(ptxas._arch_text(b) for p, b in headers
                                              if p.replace(os.sep, "/") != "common/types.cuh")):
            continue   # arch-neutral by its text
        c0 = cpu_now()
        same = _ptx_body(_ptx(u, "compute_80")) == _ptx_body(_ptx(u, "compute_90"))
        print(f"{u.name:32s} {len(common):3d} common instantiations: PTX {'identical' if same else 'DIFFERS'} "
              f"({cpu_now() - c0:.1f} CPU s)", flush=True)
        keep.pop(u.name, None)
        if same:
            keep[u.name] = ptxas.digest(u)
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pydnn", "_build",
                        "ptx_verified.py")
    with open(path) as fh:
        head = fh.read().split("VERIFIED = {")[0]
    with open(path, "w") as fh:
        fh.write(head + "VERIFIED = {\n" + "".join(f"    {n!r}: {d!r},\n" for n, d in sorted(keep.items())) + "}\n")
    print(f"wrote {path}: {len(keep)} units (NVRTC {'.'.join(map(str, nvrtc.version()))})")
    return 0


_PHASE_KEYS = {"CUDA C++ Frontend": "fe", "NVVM Optimizer": "nvvm", "PTX Translation": "ptxas"}


def _phase_file():
    import tempfile

    fd, path = tempfile.mkstemp(prefix="pydnn_nvrtc_time_", suffix=".csv")
    os.close(fd)
    os.unlink(path)   # NVRTC appends to the file: start from none
    return path


def _read_phases(path):
    """{fe, nvvm, ptxas: ms} summed over the CSV that NVRTC's --time wrote (every file of the unit: a source
    that includes another .cu lists it too), other phases under their own names; the file is removed."""
    out = {}
    try:
        with open(path) as f:
            next(f, None)
            for line in f:
                parts = [p.strip() for p in line.split(",")]
                if len(parts) >= 3:
                    k = _PHASE_KEYS.get(parts[1], parts[1])
                    out[k] = out.get(k, 0.0) + float(parts[2])
    finally:
        if os.path.exists(path):
            os.unlink(path)
    return out


def _time_one(job):
    """(row) of one unit compiled in this worker process: its CPU seconds are the process's own."""
    name, arch, opts = job
    u = manifest.unit_by_name(arch)[name]
    target = manifest.unit_arch(u, arch)
    text, _ = cache.unit_inputs(u)
    c0, w0 = cpu_now(), time.time()
    cubin, _lowered, _log = nvrtc.compile_cubin(text, u.source, u.exprs, target, tuple(opts) + tuple(u.options),
                                                [str(cache.ptx_dir())], unit=u.name)
    return dict(unit=u.name, source=u.source, exprs=len(u.exprs), cpu=cpu_now() - c0, wall=time.time() - w0,
                bytes=len(cubin))


def _time_in_pool(units, arch, opts, procs, json_path=None):
    """--procs N: the units timed in N worker processes, longest first (build._cost); each row is written to
    `json_path`.partial as it comes (a run cut short by a time limit keeps what it measured)."""
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from pydnn._build import build

    units = sorted(units, key=lambda u: -build._cost(u, arch))
    rows = []
    part = open(json_path + ".partial", "w") if json_path else None
    with ProcessPoolExecutor(max_workers=procs) as pool:
        futs = [pool.submit(_time_one, (u.name, arch, list(opts))) for u in units]
        for f in as_completed(futs):
            r = f.result()
            rows.append(r)
            print(f"{r['unit']:40s} {r['exprs']:4d} exprs  cpu {r['cpu']:6.1f}s  wall {r['wall']:6.1f}s  "
                  f"{r['bytes'] / 1e6:6.2f} MB", flush=True)
            if part:
                part.write(json.dumps(dict(r, arch=arch)) + "\n")
                part.flush()
    if part:
        part.close()
    return rows


def _measured(paths):
    """{arch: {unit: (cpu s, instantiations)}} from --json files (the latest file wins for a unit)."""
    out = {}
    for path in paths:
        with open(path) as f:
            d = json.load(f)
        for r in d["rows"]:
            if r.get("cpu") is not None:
                out.setdefault(d["arch"], {})[r["unit"]] = (r["cpu"], r["exprs"])
    return out


def schedule(costs, jobs):
    """The end time of `jobs` workers taking the (name, seconds) items in order, each the next when free:
    ThreadPoolExecutor's behaviour on the build's sorted list."""
    import heapq

    free = [0.0] * jobs
    for _, sec in costs:
        heapq.heapreplace(free, free[0] + sec)
    return max(free)


# Measured 2-core wall per model second (--model's end): 346 s on the H200 host (cores 62,63 alone, NVRTC 13.0,
# session 31's final call F1 at 2f3a5a0) against 479.0 model s for that tree (with the split parts' home costs and
# session 32's measured costs of the units the SASS-size model had guessed).
CALIBRATION = 346.0 / 479.0


def model(jobs=2, scale=CALIBRATION, families=False):
    from pydnn._build import build, ptxas

    todo = [(u, a) for a in build.DEFAULT_ARCHS for u in manifest.install_units(a)
            if manifest.unit_arch(u, a) is not None]
    work = sorted(build._pair_jobs(todo), key=lambda j: -build._job_cost(j))
    costs = [(f"{u.name} {a}{' + ' + b + ' (ptxas)' if b else ''}", build._job_cost((u, a, b))) for u, a, b in work]
    total = sum(c for _, c in costs)
    end = schedule(costs, jobs)
    if families:
        for name, c in costs:
            print(f"{c:8.2f}  {name}")
    print(f"{len(todo)} install units of {', '.join(build.DEFAULT_ARCHS)} in {len(work)} jobs (ptxas "
          f"{'found' if ptxas.find() else 'not found: no shared NVVM pass'}); model CPU s {total:.1f}, replayed on "
          f"{jobs} cores longest first: ends at {end:.1f} model s; x {scale:.4f} = {end * scale:.0f} s predicted")
    return dict(units=len(todo), jobs=len(work), sum=total, end=end, predicted=end * scale)


def predict(paths, jobs=2, scale=1.0):
    from pydnn._build import build

    got = _measured(paths)
    todo, missing = [], []
    for arch, table in sorted(got.items()):
        for u in manifest.install_units(arch):
            if manifest.unit_arch(u, arch) is None:
                continue
            m = table.get(u.name)
            if m is None or m[1] != len(u.exprs):
                missing.append(f"{u.name} {arch}")
                continue
            todo.append((u, arch, m[0] * scale))
    todo.sort(key=lambda t: -build._cost(t[0], t[1]))
    secs = [(f"{u.name} {a}", c) for u, a, c in todo]
    total = sum(c for _, c in secs)
    longest = max(secs, key=lambda t: t[1]) if secs else ("-", 0.0)
    end = schedule(secs, jobs)
    print(f"{len(secs)} install units of {', '.join(sorted(got))} timed (scale {scale:g}); "
          f"{len(missing)} not timed as they are now: {', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}")
    print(f"CPU seconds: sum {total:.0f}, sum / {jobs} = {total / jobs:.0f}, longest unit {longest[1]:.1f} "
          f"({longest[0]})")
    print(f"replayed build on {jobs} cores, longest first: ends at {end:.0f} s "
          f"(bound sum / {jobs} + longest / 2 = {total / jobs + longest[1] / 2:.0f} s)")
    return dict(units=len(secs), missing=missing, sum=total, end=end, longest=longest)


def write_costs(paths):
    got = _measured(paths)
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pydnn", "_build",
                        "unit_costs.py")
    nv = set()
    for p in paths:
        with open(p) as f:
            nv.add(".".join(map(str, json.load(f)["nvrtc"])))
    lines = ['"""NVRTC CPU seconds of kernel units, measured one unit at a time (tools/build_stats.py --json,',
             'then --write-costs; NVRTC ' + ", ".join(sorted(nv)) + ' on the 2-core development machine):',
             'build._cost orders the build by them, longest first. {device arch: {unit: (CPU seconds,',
             'instantiations then)}}; a unit missing here, or whose instantiations changed, falls back to',
             '(or is scaled by) the SASS-size model."""',
             "COSTS = {"]
    for arch in sorted(got):
        lines.append(f"    {arch!r}: {{")
        for name, (c, n) in sorted(got[arch].items()):
            lines.append(f"        {name!r}: ({c:.1f}, {n}),")
        lines.append("    },")
    lines.append("}")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {path}: {sum(len(v) for v in got.values())} units")


if __name__ == "__main__":
    main()
