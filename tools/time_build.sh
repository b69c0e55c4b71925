#!/usr/bin/env bash
# Time the default install-time kernel build alone on 2 cores (issue 21: <= 300 s for sm_80 + sm_90 on a 2-core
# CPU-only machine), from an empty cache of its own, and print the wall time, the build's CPU seconds, the cache
# size per arch, and how much else ran on those cores meanwhile (a timing beside a test suite is not the figure).
#
#   bash tools/time_build.sh                      # the install units, sm_80 + sm_90, on cores 0,1
#   CORES=2,3 ARCHS=sm_90 bash tools/time_build.sh
#   MODE=pip bash tools/time_build.sh             # the whole `pip install .` (no build isolation, no deps, into a
#                                                 # temporary --target: setuptools, the kernel build, libpydnn);
#                                                 # needs setuptools, wheel, cffi and cuda-bindings + NVRTC present
#   KEEP=1 ...                                    # keep the cache folder (printed) to look at afterwards
#   ONLY=activation,tensor_ops ...                # only the install units whose names start with these (a
#                                                 # small A/B, e.g. with PYDNN_PTXAS=0: no shared NVVM pass)
#   SPLIT=1 ...                                   # one build per arch, one after the other (each arch's own
#                                                 # wall time; the sum is a little above the joint build's)
#   LIMIT=70 ...                                  # stop each build after 70 s (a smoke test of this script; the
#                                                 # figures are then of a partial build)
#
# Prints (and writes $OUT/time_build.txt when OUT is set):
#   cache sm_80: <units> units, <MB> MB        (sm_90a units counted with sm_90)
#   wall <s>   build CPU <s> (/ wall <r>)   other processes on cores 0,1: <s> CPU s (<p>% of the cores' time)
# The wall time is the figure when "other processes" is near 0 and the two cores are not hyperthread siblings
# of one physical core (printed first). Expected on 2 dedicated cores: tools/PERF.md, "Session 30: install".
set -uo pipefail
cd "$(dirname "$0")/.."
export TB_CORES=${CORES:-0,1} TB_ARCHS=${ARCHS:-sm_80,sm_90} TB_MODE=${MODE:-build} TB_KEEP=${KEEP:-0} \
  TB_LIMIT=${LIMIT:-0} TB_SPLIT=${SPLIT:-0} TB_ONLY=${ONLY:-} TB_REPORT=${OUT:+$OUT/time_build.txt}
exec python3 - <<'PY'
import os, platform, re, resource, shutil, subprocess, sys, tempfile, time

cores, archs, mode = os.environ["TB_CORES"], os.environ["TB_ARCHS"], os.environ["TB_MODE"]
limit = float(os.environ["TB_LIMIT"] or 0)
report = os.environ.get("TB_REPORT") or None
lines = []


def say(s):
    print(s, flush=True)
    lines.append(s)


def busy(cpus):
    """Busy seconds of those CPUs since boot (/proc/stat: user nice system irq softirq steal)."""
    hz = os.sysconf("SC_CLK_TCK")
    tot = 0
    for l in open("/proc/stat"):
        f = l.split()
        if f[0].startswith("cpu") and f[0][3:].isdigit() and int(f[0][3:]) in cpus:
            tot += sum(int(f[i]) for i in (1, 2, 3, 6, 7, 8))
    return tot / hz


cpus = [int(c) for c in cores.split(",")]
sib = {}
for c in cpus:
    try:
        sib[c] = open(f"/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list").read().strip()
    except OSError:
        sib[c] = "?"
model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
say(f"host {platform.node()}: {os.cpu_count()} CPUs ({model}); cores {cores} (hyperthread siblings {sib}); "
    f"load average {' '.join(open('/proc/loadavg').read().split()[:3])}")

try:   # which ptxas the build pairs with NVRTC (pydnn/_build/ptxas.py): the shared NVVM pass is on or off
    said = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, '.'); from pydnn._build import ptxas; "
                           "print('; '.join(ptxas.describe()))"], capture_output=True, text=True, timeout=120)
    say(said.stdout.strip() or said.stderr.strip()[-300:])
except Exception as e:  # noqa: BLE001
    say(f"ptxas: could not tell ({e})")


def one(archs):
    """One build of `archs` (comma separated) from an empty cache; returns its exit status and wall seconds."""
    work = tempfile.mkdtemp(prefix="pydnn-time-build.")
    env = dict(os.environ, PYDNN_CACHE_DIR=os.path.join(work, "cache"), PYDNN_CUDA_ARCHS=archs,
               CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1")
    env.setdefault("PYDNN_PROGRESS", "plain")
    for k in ("PYDNN_BUILD_ALL", "PYDNN_LINEINFO", "PYDNN_FAST_COMPILE", "PYDNN_SKIP_BUILD"):
        env.pop(k, None)
    if mode == "pip":
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-cache-dir",
               "--target", os.path.join(work, "site"), "."]
    else:
        only = tuple(p for p in os.environ.get("TB_ONLY", "").split(",") if p) or None
        cmd = [sys.executable, "-c", "import sys; sys.path.insert(0, '.'); from pydnn._build import build; "
               f"c, s = build.build_all(archs={archs.split(',')!r}, progress=True, prefixes={only!r}, "
               "install_only=True); print(f'compiled {c} kernel units, {s} already cached')"]
    say(f"mode {mode}, archs {archs}{', only ' + os.environ['TB_ONLY'] if os.environ.get('TB_ONLY') else ''}, "
        f"PYDNN_PTXAS={os.environ.get('PYDNN_PTXAS', '(unset: the shared NVVM pass where a ptxas of NVRTC release is)')}"
        f", cache {env['PYDNN_CACHE_DIR']} (empty)")
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    b0, t0 = busy(cpus), time.time()
    proc = subprocess.Popen(["taskset", "-c", cores] + cmd, env=env)
    try:
        rc = proc.wait(timeout=limit or None)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = proc.wait()
        say(f"stopped after LIMIT={limit:g} s: the figures below are of a partial build")
    t1, b1 = time.time(), busy(cpus)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    own = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
    per = {}
    folder = os.path.join(work, "cache", "cubin")
    if os.path.isdir(folder):
        for name in os.listdir(folder):
            m = re.search(r"\.(sm_\d+)a?\.[0-9a-f]{24}\.cubin$", name)
            if m:
                n, b = per.get(m.group(1), (0, 0))
                per[m.group(1)] = (n + 1, b + os.path.getsize(os.path.join(folder, name)))
    for arch, (n, b) in sorted(per.items()):
        say(f"cache {arch}: {n} units, {b / 1e6:.1f} MB (sm_90a units counted with sm_90)")
    wall, other = t1 - t0, max(0.0, (b1 - b0) - own)
    say(f"wall {wall:.0f} s   build CPU {own:.0f} s (/ wall {own / wall:.2f})   other processes on cores {cores}: "
        f"{other:.0f} CPU s ({100 * other / (wall * len(cpus)):.0f}% of the cores' time)   exit {rc}   [{archs}]")
    if os.environ["TB_KEEP"] == "1":
        say(f"cache kept in {work}/cache")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return rc, wall


builds = archs.split(",") if os.environ["TB_SPLIT"] == "1" else [archs]
rcs, walls = zip(*[one(a) for a in builds])
rc = next((r for r in rcs if r), 0)
if len(builds) > 1:
    say(f"wall, the builds one after the other: {sum(walls):.0f} s")
if report:
    with open(report, "w") as f:
        f.write("\n".join(lines) + "\n")
sys.exit(rc)
PY
