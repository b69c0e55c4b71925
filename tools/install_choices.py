"""Which installed kernel instantiations no common call takes (candidates for pydnn/_build/rare.py), on the CPU.

Records every kernel the calls of tests/kernels/test_install_choices_cpu.py look up (PYDNN_RECORD_CHOICES; a CPU
handle of sm_80 / sm_90, launches listed, not enqueued), plus a scan of convolution layers (ResNet-50, MobileNet-v2,
EfficientNet-B0, VGG-16, UNet, ResNeXt, grouped and depthwise layers at N 1 / 8 / 32 / 128, 16-bit NCHW and NHWC,
each direction with Get..._v7's first algorithm), then lists per install unit the instantiations none of them took.
A listed instantiation is only a candidate: a planner's choice by size may still take it for a shape not scanned
(tools/notes/install.md, session 29, says how the rules were judged).

    python tools/install_choices.py [--arch sm_90] [--no-scan] [--json out.json]
"""
import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests", "kernels"), os.path.join(ROOT, "tests", "core"),
                os.path.join(ROOT, "tests", "ops", "attention"), os.path.join(ROOT, "tests")]

# (C, K, H = W, filter, pad, stride, groups)
SCAN_LAYERS = [
    (3, 64, 224, 7, 3, 2, 1), (64, 64, 56, 3, 1, 1, 1), (64, 256, 56, 1, 0, 1, 1), (256, 64, 56, 1, 0, 1, 1),
    (128, 128, 28, 3, 1, 1, 1), (256, 256, 14, 3, 1, 1, 1), (512, 512, 7, 3, 1, 1, 1), (1024, 2048, 14, 1, 0, 2, 1),
    (3, 32, 224, 3, 1, 2, 1), (32, 32, 112, 3, 1, 1, 32), (32, 16, 112, 1, 0, 1, 1), (16, 96, 112, 1, 0, 1, 1),
    (96, 96, 112, 3, 1, 2, 96), (96, 24, 56, 1, 0, 1, 1), (24, 144, 56, 1, 0, 1, 1), (144, 24, 56, 1, 0, 1, 1),
    (144, 144, 56, 3, 1, 2, 144), (144, 32, 28, 1, 0, 1, 1), (32, 192, 28, 1, 0, 1, 1), (192, 64, 14, 1, 0, 1, 1),
    (384, 96, 14, 1, 0, 1, 1), (96, 576, 14, 1, 0, 1, 1), (576, 160, 7, 1, 0, 1, 1), (160, 960, 7, 1, 0, 1, 1),
    (960, 320, 7, 1, 0, 1, 1), (320, 1280, 7, 1, 0, 1, 1), (40, 240, 28, 1, 0, 1, 1), (240, 40, 28, 1, 0, 1, 1),
    (80, 480, 14, 1, 0, 1, 1), (112, 672, 14, 1, 0, 1, 1), (672, 112, 14, 1, 0, 1, 1), (192, 1152, 7, 1, 0, 1, 1),
    (1152, 320, 7, 1, 0, 1, 1), (240, 240, 28, 5, 2, 1, 240), (672, 672, 14, 5, 2, 2, 672),
    (3, 64, 224, 3, 1, 1, 1), (64, 128, 112, 3, 1, 1, 1), (128, 256, 56, 3, 1, 1, 1), (256, 512, 28, 3, 1, 1, 1),
    (512, 512, 14, 3, 1, 1, 1), (32, 32, 256, 3, 1, 1, 1), (32, 64, 128, 3, 1, 1, 1), (64, 32, 256, 3, 1, 1, 1),
    (96, 32, 56, 3, 1, 1, 1), (160, 128, 28, 1, 0, 1, 1), (128, 32, 28, 3, 1, 1, 1), (320, 128, 14, 1, 0, 1, 1),
    (128, 128, 56, 3, 1, 1, 32), (256, 256, 28, 3, 1, 2, 32), (512, 512, 14, 3, 1, 1, 32), (1024, 1024, 7, 3, 1, 1, 32),
    (64, 1, 128, 1, 0, 1, 1), (64, 3, 128, 1, 0, 1, 1), (32, 2, 256, 1, 0, 1, 1), (128, 128, 56, 3, 1, 1, 8),
    (224, 224, 56, 3, 1, 1, 2), (448, 448, 28, 3, 1, 2, 4), (64, 64, 56, 3, 1, 1, 64), (256, 256, 56, 7, 3, 1, 256)]


def record_tests(out):
    env = dict(os.environ, PYDNN_RECORD_CHOICES=out, PYTHONPATH=ROOT)
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    os.path.join(ROOT, "tests", "kernels", "test_install_choices_cpu.py")], env=env, check=False,
                   stdout=subprocess.DEVNULL)
    with open(out) as f:
        return {tuple(json.loads(line)) for line in f}


def scan_convolutions(archs):
    import pydnn
    import test_install_choices_cpu as T
    from pydnn._cuda import driver
    from test_fuzz_cpu import cpu_handle

    driver.function_set_max_dynamic_smem = lambda f, n: None
    types = [(pydnn.PYDNN_DATA_BFLOAT16, True), (pydnn.PYDNN_DATA_HALF, True), (pydnn.PYDNN_DATA_HALF, False),
             (pydnn.PYDNN_DATA_BFLOAT16, False)]
    seen = set()
    for arch in archs:
        for (c, k, hw, f, p, s, g), n, (dt, nhwc) in itertools.product(SCAN_LAYERS, (1, 8, 32, 128), types):
            if n == 128 and hw > 56:
                continue
            for call in T._conv_calls((n, c, k, hw, f, p, s, g), dt, nhwc):
                h = cpu_handle()
                h.arch, h.sm_count, h._funcs = arch, T.ARCHS[arch], T._Lookups()
                try:
                    with driver.recording():
                        call(h)
                except pydnn.PydnnError:
                    continue
                seen.update((arch, T._where(arch, u, e).name, e) for u, e in dict.fromkeys(h._funcs.seen))
    return seen


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", action="append", help="sm_80 / sm_90 (default both)")
    ap.add_argument("--no-scan", action="store_true", help="only the install-choice test's calls")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    from pydnn._build import manifest

    archs = args.arch or ["sm_80", "sm_90"]
    with tempfile.TemporaryDirectory() as d:
        seen = record_tests(os.path.join(d, "choices.jsonl"))
    if not args.no_scan:
        seen |= scan_convolutions(archs)
    rows = []
    for arch in archs:
        for u in manifest.install_units(arch):
            if manifest.unit_arch(u, arch) is None:
                continue
            idle = [e for e in u.exprs if (arch, u.name, e) not in seen]
            if idle:
                rows.append(dict(arch=arch, unit=u.name, idle=idle, exprs=len(u.exprs)))
                print(f"{arch} {u.name}: {len(idle)} of {len(u.exprs)} taken by no recorded call")
                for e in idle:
                    print(f"      {e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
