"""pydnn's command line: `python -m pydnn info | build [--arch ...] | config --cflags --libs`."""
import argparse
import sys


def cmd_info(_args):
    import pydnn
    from pydnn._build import cache
    from pydnn._cuda import driver, nvrtc

    print(f"pydnn {pydnn.__version__} (get_version() = {pydnn.get_version()})")
    try:
        print("NVRTC %d.%d" % nvrtc.version())
    except Exception as e:  # noqa: BLE001
        print(f"NVRTC: unavailable ({e})")
    try:
        v = driver.driver_version()
        print(f"CUDA driver {v // 1000}.{v % 1000 // 10}")
        for i in range(driver.device_count()):
            print(f"device {i}: {driver.device_name(i)} ({driver.device_arch(i)})")
    except pydnn.PydnnError as e:
        print(f"CUDA driver: none ({e.message})")
    counts, total = cache.describe()
    print(f"kernel cache: {cache.cache_dir()}")
    print(f"  kernel sources: {cache.ptx_dir()}")
    if counts:
        for arch, n in sorted(counts.items()):
            print(f"  {arch}: {n} cubins")
        print(f"  total {total / 1e6:.1f} MB")
    else:
        print("  empty (run: python -m pydnn build)")
    try:
        from pydnn.capi import library

        print(f"C library: {library.library_dir()}")
    except Exception as e:  # noqa: BLE001
        print(f"C library: unavailable ({e})")
    return 0


def cmd_build(args):
    from pydnn._build import build

    archs = [a for spec in (args.arch or []) for a in spec.split(",") if a]
    only = tuple(p for spec in (args.only or []) for p in spec.split(",") if p)
    compiled, skipped = build.build_all(archs=archs or None, progress=True, everything=args.all or None,
                                        prefixes=only or None, install_only=not args.all)
    print(f"compiled {compiled} kernel units, {skipped} already cached")
    if args.prune:
        print(f"pruned {build.prune(archs or None)} stale cache entries")
    if not args.no_lib:
        from pydnn.capi import library

        print(f"C library: {library.build_library(verbose=True)}")
    return 0


def cmd_config(args):
    from pydnn.capi import library

    if not (args.cflags or args.libs):
        print("config: give --cflags and/or --libs", file=sys.stderr)
        return 2
    print(library.config_flags(cflags=args.cflags, libs=args.libs, cudnn_compat=args.cudnn_compat))
    return 0


def cmd_tuning(args):
    import pydnn  # noqa: F401 - the families' modules, whose planners read the switches
    from . import tuning
    print(tuning.describe())
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m pydnn", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("info", help="versions, devices, kernel cache and C library locations")
    b = sub.add_parser("build", help="compile the kernels for the target archs (and the C library)")
    b.add_argument("--arch", action="append", help="e.g. sm_90 or 8.0,9.0 (default: PYDNN_CUDA_ARCHS, "
                   "else the GPUs present, else sm_80,sm_90)")
    b.add_argument("--all", action="store_true", help="also the rare variants that otherwise compile on first "
                   "use (pydnn/_build/rare.py; PYDNN_BUILD_ALL=1 does the same)")
    b.add_argument("--only", action="append", help="only the units whose names start with these (comma "
                   "separated: convolution.bf16,attention), the install's (with --all every such unit)")
    b.add_argument("--no-lib", action="store_true", help="skip building libpydnn")
    b.add_argument("--prune", action="store_true", help="delete cached cubins of other sources or archs")
    c = sub.add_parser("config", help="flags a C compiler needs to build against libpydnn")
    c.add_argument("--cflags", action="store_true")
    c.add_argument("--libs", action="store_true")
    sub.add_parser("tuning", help="every planner switch (pydnn.tuning): value, default and what it does")
    c.add_argument("--cudnn-compat", action="store_true",
                   help="with --cflags: also the folder of cudnn.h mapping cuDNN's names onto pydnn's")
    args = p.parse_args(argv)
    return {"info": cmd_info, "build": cmd_build, "config": cmd_config, "tuning": cmd_tuning}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
