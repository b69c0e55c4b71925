"""The C API fuzzed from C (CPU): a driver generated from the C API declaration calls every function of
include/pydnn.h with random arguments - edge integers and enum values, NULL and garbage opaque pointers,
live, unset and destroyed descriptors (created by the Create calls, destroyed by the random Destroy calls),
NULL and non-NULL out-pointers, random host scalars and arrays, junk device addresses - and requires every
returned status to be a known pydnnStatus_t other than INTERNAL_ERROR, with a non-empty last-error string
on failure, and no crash. The caller's side of C's contract is kept: an out-array is as long as the count
passed with it (counts stay within the driver's buffers).

PYDNN_CAPI_FUZZ_CALLS (default 20000) calls per run; the run's counts are printed (pytest -s).
"""
import os
import re
import subprocess
import sys

import pytest

from pydnn import enums
from pydnn.capi import decl, impl

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from cprog import CC, config_flags  # noqa: E402

CALLS = int(os.environ.get("PYDNN_CAPI_FUZZ_CALLS", "20000"))
COUNT_NAME = re.compile(r"^(nbDims|requested|arrayLength)|(ArraySize|SizeRequested)$")

HARNESS = r"""
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pydnn.h>

static unsigned long long rng = 88172645463325252ULL;
static unsigned rnd(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return (unsigned)(rng >> 11); }
static int r_int(void) {
  static const int v[] = {0, 1, 2, 3, 4, 5, 7, 8, 16, 64, -1, -2, 1000, 1001, 4096, INT_MAX, INT_MIN};
  return rnd() % 3 == 0 ? (int)(rnd() % 40) - 2 : v[rnd() % (sizeof v / sizeof v[0])];
}
static int r_count(void) { static const int v[] = {-1, 0, 1, 2, 3, 4, 5, 8, 16}; return v[rnd() % 9]; }
static size_t r_size(void) {
  static const size_t v[] = {0, 1, 4, 16, 1024, 1 << 20, (size_t)-1, (size_t)-4, 4096};
  return v[rnd() % 9];
}
static size_t r_size_count(void) { return (size_t)(rnd() % 17); }
static double r_double(void) {
  static const double v[] = {0.0, 1.0, -1.0, 0.5, 1e-5, 2.0, 1e300, -0.0, 0.125};
  unsigned k = rnd() % 12;
  return k == 9 ? NAN : k == 10 ? INFINITY : k == 11 ? -INFINITY : v[k];
}
static void *r_devptr(void) {
  static const uintptr_t v[] = {0, 0x10000, 0x7f0000000000ULL, 1, (uintptr_t)-8, 0x100000002ULL};
  return (void *)v[rnd() % 6];
}
static double scratch[1 << 13];  /* out-pointers, scalars, struct arrays: 64 KiB */
static int ints[1 << 16];        /* input arrays (a caller's int arrays) */
static void *r_out(void) { return rnd() % 8 == 0 ? NULL : (void *)&scratch[(rnd() % 8) * 64]; }
static void *r_scalar(void) {
  if (rnd() % 8 == 0) return NULL;
  double *p = &scratch[4096 + (rnd() % 8) * 2];
  p[0] = r_double();
  return p;
}
static int *r_arr(void) {
  if (rnd() % 8 == 0) return NULL;
  for (int i = 0; i < 64; i++) ints[i] = rnd() % 4 == 0 ? r_int() : (int)(rnd() % 9);
  return ints;
}
#define NTYPES @NTYPES@
#define POOL 8
static void *pool[NTYPES][POOL];
static int pool_n[NTYPES];
static void *r_obj(int t) {
  unsigned k = rnd() % 10;
  if (k == 0 || pool_n[t] == 0) return NULL;
  if (k == 1) return (void *)(uintptr_t)0x1234;  /* never created by pydnn */
  return pool[t][rnd() % pool_n[t]];
}
static void keep(int t, void *o) {
  if (o == NULL) return;
  if (pool_n[t] < POOL) pool[t][pool_n[t]++] = o; else pool[t][rnd() % POOL] = o;
}
static const int known[] = {@STATUSES@};
static int is_known(int s) {
  for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) if (known[i] == s) return 1;
  return 0;
}
static long counts[8];  /* success, bad param, not supported, not initialized, other known, internal, unknown */
static long failures;
static void check(const char *fn, pydnnStatus_t st) {
  char msg[1024];
  int s = (int)st;
  if (s == 0) { counts[0]++; return; }
  pydnnGetLastErrorString(msg, sizeof msg);
  int bad = !is_known(s) || s == PYDNN_STATUS_INTERNAL_ERROR || msg[0] == 0;
  counts[s / 1000 == 2 ? 1 : s / 1000 == 3 ? 2 : s == PYDNN_STATUS_NOT_INITIALIZED ? 3 : !is_known(s) ? 6
         : s == PYDNN_STATUS_INTERNAL_ERROR ? 5 : 4]++;
  if (bad) {
    failures++;
    if (failures <= 25) printf("FAIL %s -> %d: %s\n", fn, s, msg);
  }
}

int main(int argc, char **argv) {
  long calls = argc > 1 ? atol(argv[1]) : 20000;
  if (argc > 2) rng ^= strtoull(argv[2], NULL, 10) * 0x9E3779B97F4A7C15ULL;
  void *o;
@CREATES@
  for (long it = 0; it < calls; it++) {
    switch (rnd() % @NFUNCS@) {
@CASES@
    }
  }
  printf("cases %ld functions %d: success %ld, BAD_PARAM* %ld, NOT_SUPPORTED* %ld, NOT_INITIALIZED %ld, "
         "other %ld, INTERNAL_ERROR %ld, unknown %ld\n", calls, @NFUNCS@, counts[0], counts[1], counts[2],
         counts[3], counts[4], counts[5], counts[6]);
  printf("%s\n", failures ? "FAILED" : "done");
  return failures ? 1 : 0;
}
"""


def _arg(kind, base, name, types, c_name):
    if kind == "obj_in":
        return f"({base})r_obj({types[base]})"
    if kind == "obj_out":
        return f"({base} *)(rnd() % 8 ? (void *)&o : NULL)"
    if kind in ("out", "arr_out", "struct_out"):
        if base == "fill":
            return "r_out()"
        typ = "void *" if base == "void *" else base
        return f"({typ} *)r_out()"
    if kind == "devptr":
        return "r_devptr()"
    if kind == "scalar":
        return "r_scalar()"
    if kind == "fill_in":
        return "r_scalar()"
    if kind == "arr_in":
        return f"(const {base} *)r_arr()"
    assert kind == "in", kind
    if COUNT_NAME.search(name):
        return "r_size_count()" if base == "size_t" else "r_count()"
    if base in ("double", "float"):
        return f"({base})r_double()"
    if base == "size_t":
        return "r_size()"
    if base == "cudaStream_t":
        return "(cudaStream_t)r_devptr()"
    if base in ("unsigned", "unsigned long long"):
        return f"({base})r_int()"
    return f"({base})r_int()"


def generate():
    types = {t: i for i, (t, _) in enumerate(decl.OPAQUE_TYPES)}
    statuses = sorted(set(enums.ENUMS["pydnnStatus_t"].values()))
    creates, cases = [], []
    n = 0
    for proto in decl.prototypes():
        ret, c_name, params = impl.parse(proto)
        if c_name == "pydnnGetLastErrorString":
            call = "{ char m[64]; pydnnGetLastErrorString(rnd() % 4 ? m : NULL, rnd() % 65); }"
        elif ret == "const char *":
            call = (f'if ({c_name}((pydnnStatus_t)r_int()) == NULL) {{ failures++; '
                    f'printf("FAIL {c_name} returned NULL\\n"); }}')
        elif ret != "pydnnStatus_t":
            call = f"(void){c_name}();"
        else:
            args = ", ".join(_arg(k, b, nm, types, c_name) for k, b, nm in params)
            call = f"o = NULL; check(\"{c_name}\", {c_name}({args}));"
            outs = [b for k, b, _ in params if k == "obj_out"]
            if c_name.startswith("pydnnCreate") and len(outs) == 1:
                call += f" keep({types[outs[0]]}, o);"
                creates.append(f"  for (int i = 0; i < 3; i++) {{ o = NULL; {c_name}(({outs[0]} *)&o); "
                               f"keep({types[outs[0]]}, o); }}")
        cases.append(f"      case {n}: {{ {call} }} break;")
        n += 1
    text = (HARNESS.replace("@NTYPES@", str(len(types))).replace("@STATUSES@", ", ".join(map(str, statuses)))
            .replace("@CREATES@", "\n".join(creates)).replace("@CASES@", "\n".join(cases))
            .replace("@NFUNCS@", str(n)))
    return text, n


def test_c_api_fuzz(tmp_path):
    if CC is None:
        pytest.skip("no C compiler")
    text, n = generate()
    src = tmp_path / "fuzz_capi.c"
    src.write_text(text)
    exe = tmp_path / "fuzz_capi"
    subprocess.run([CC, "-std=c99", "-Wall", "-Werror", str(src), *config_flags(), "-lm",
                    "-o", str(exe)], check=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env["CUDA_VISIBLE_DEVICES"] = ""  # the same test with or without a GPU: every handle call fails cleanly
    r = subprocess.run([str(exe), str(CALLS), os.environ.get("PYDNN_CAPI_FUZZ_SEED", "1")], capture_output=True,
                       text=True, env=env, timeout=1800)
    print(r.stdout[-3000:], r.stderr[-3000:])
    assert r.returncode == 0 and r.stdout.rstrip().endswith("done"), r.stdout[-3000:] + r.stderr[-3000:]
    assert f"cases {CALLS} functions {n}:" in r.stdout
