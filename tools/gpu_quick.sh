#!/usr/bin/env bash
# A focused GPU run for one family while it is being written (the full check is tools/gpu_check.sh):
# no install, the checkout on PYTHONPATH, kernels compiled on first use for the GPU present (one log line
# each), then pytest with the given arguments and, optionally, benchmark families. Logs go to $OUT.
#
#   tools/gpu_quick.sh tests/ops/pooling/test_pooling_gpu.py -x -k nhwc        (pytest arguments)
#   PYDNN_BENCH_FAMILIES=pooling tools/gpu_quick.sh tests/ops/pooling/test_pooling_gpu.py
#   PYDNN_SANITIZE=1 ...    run the pytest part under compute-sanitizer memcheck instead
#   PYDNN_PREBUILD=matmul,conv ...  first compile, in parallel, the units whose names start with these
#                                   (on-first-use compiles run one at a time, inside the tests' time)
set -uo pipefail
cd "$(dirname "$0")/.."
logs=${OUT:-gpu_logs}
mkdir -p "$logs"
export PYTHONUNBUFFERED=1 PYDNN_CACHE_DIR=${PYDNN_CACHE_DIR:-/tmp/pydnn-cache}
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/pydnn-site \
    .whl/*.whl >/dev/null || exit 1
  export PYTHONPATH=/tmp/pydnn-site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
status=0
if [ -n "${PYDNN_PREBUILD:-}" ]; then
  python3 - "$PYDNN_PREBUILD" <<'PY' || exit 1
import sys
from pydnn._build import build, manifest
build.build_all(prefixes=tuple(sys.argv[1].split(",")))   # every unit of those names, first-use ones too
PY
fi
if [ $# -gt 0 ]; then
  pre=()
  [ "${PYDNN_SANITIZE:-0}" = 1 ] && pre=(compute-sanitizer --tool memcheck --error-exitcode 9)
  "${pre[@]}" python3 -m pytest -q -p no:cacheprovider -rfE "$@" 2>&1 | tee "$logs/quick_tests.log" | tail -60
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
if [ -n "${PYDNN_BENCH_FAMILIES:-}" ]; then
  python3 tools/bench.py --families "$PYDNN_BENCH_FAMILIES" --out "$logs/quick_bench.md" 2>&1 \
    | tee "$logs/quick_bench.log" | grep -v '^|' | tail -40
  cat "$logs/quick_bench.md"
fi
exit $status
