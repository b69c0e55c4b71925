#!/usr/bin/env bash
# The GPU suite under compute-sanitizer (issue 21): memcheck over every GPU test, and racecheck + synccheck
# over one case of each kernel variant that uses shared memory, clusters or mbarriers. Counts the errors
# each tool reports and writes a summary. Run on a GPU machine after `tools/gpu_check.sh` (or with the
# checkout on PYTHONPATH: kernels missing from the cache are compiled on first use, outside the sanitizer's
# count but inside its time).
#
#   tools/sanitize.sh [LOGDIR]                   LOGDIR defaults to $OUT, else ./gpu_logs
#   PYDNN_SANITIZE_TOOLS=memcheck,racecheck,synccheck   which tools (default: all three)
#   PYDNN_SANITIZE_SHARDS=8                      memcheck: the GPU suite dealt round robin over N processes
#   PYDNN_SANITIZE_BUDGET=480                    seconds for each tool's run (a shard still running then is
#                                                stopped and its unfinished tests are reported, not hidden)
#   PYDNN_SANITIZE_K='not huge'                  a pytest -k expression for memcheck (default: every GPU test)
#
# Why shards: memcheck slows every kernel by 10-100x, and most GPU tests are launch- and host-bound, so N
# processes sharing the GPU finish the suite about N times sooner (as tools/gpu_check.sh's test shards).
# Why a selection for racecheck / synccheck: they instrument every shared-memory access and barrier, which
# is what needs checking, and cost far more than memcheck; one case of each variant covers every kernel body.
set -uo pipefail
cd "$(dirname "$0")/.."
logs=${1:-${OUT:-gpu_logs}}
mkdir -p "$logs"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
tools=${PYDNN_SANITIZE_TOOLS:-memcheck,racecheck,synccheck}
budget=${PYDNN_SANITIZE_BUDGET:-480}
summary=$logs/sanitize_summary.md
command -v compute-sanitizer >/dev/null || { echo "compute-sanitizer not found" | tee "$summary"; exit 2; }
echo "| tool | scope | processes | tests passed | failed | errors | not finished | seconds |" >"$summary"
echo "|---|---|---:|---:|---:|---:|---:|---:|" >>"$summary"
status=0

# pytest's last line ("N passed, M failed ...") and the sanitizer's "ERROR SUMMARY: K errors" of one log
count() {  # log -> "passed failed errors finished(0/1)"
  # pytest -v prints one line per test as it ends, so a shard stopped by the budget still shows what ran
  local log=$1 p f e fin=1
  p=$(grep -Ec ' PASSED( |$)' "$log")
  f=$(grep -Ec ' (FAILED|ERROR)( |$)' "$log")
  e=$(grep -Eo 'ERROR SUMMARY: [0-9]+' "$log" | awk '{s += $3} END {print s + 0}')
  grep -Eq '^=+ .*[0-9]+ (passed|failed|skipped|deselected).* in [0-9.]+s' "$log" || fin=0
  grep -q 'KeyboardInterrupt' "$log" && fin=0
  echo "$p $f $e $fin"
}

run_tool() {  # tool scope nproc pytest-args...
  local tool=$1 scope=$2 n=$3; shift 3
  local extra=()
  case $tool in
    racecheck) extra=(--racecheck-report all) ;;
  esac
  local t0=$SECONDS pids=() i
  for ((i = 0; i < n; i++)); do
    PYDNN_TEST_SHARD="$i/$n" timeout -s INT "$budget" compute-sanitizer --tool "$tool" "${extra[@]}" \
      --print-limit 50 --error-exitcode 9 python3 -m pytest -v -p no:cacheprovider -rfE "$@" \
      >"$logs/$tool.$i.log" 2>&1 &
    pids+=($!)
  done
  local P=0 F=0 E=0 U=0 c
  for ((i = 0; i < n; i++)); do
    wait "${pids[$i]}"
    read -r p f e fin <<<"$(count "$logs/$tool.$i.log")"
    P=$((P + p)); F=$((F + f)); E=$((E + e)); [ "$fin" = 1 ] || U=$((U + 1))
  done
  echo "| $tool | $scope | $n | $P | $F | $E | $U shard(s) | $((SECONDS - t0)) |" >>"$summary"
  [ "$F" = 0 ] && [ "$E" = 0 ] && [ "$U" = 0 ] || status=1
  echo "$tool: $P passed, $F failed, $E sanitizer errors, $U unfinished shard(s), $((SECONDS - t0)) s"
  grep -h -E ' (FAILED|ERROR)( |$)' "$logs/$tool".*.log | head -30
  grep -h -B2 -A12 -E '^========= (Invalid|Race|Barrier|Error|Program hit)' "$logs/$tool".*.log | head -60
}

# One case of each kernel variant with shared memory, clusters or mbarriers (the cases tools/gpu_check.sh's
# memcheck slices name, plus the newer families).
VARIANTS="test_every_variant or (test_forward_tensor_cores and case0) or (test_backward_data_tensor_cores and case0) \
or (test_backward_filter_tensor_cores and case0) or (test_wgmma_forward and case0) or (test_wgmma_backward_data and case0) \
or (test_wgmma_backward_filter and case0) or (test_each_tile and trans0) or (test_wgmma_tiles and trans0) \
or (test_simt_tiles and trans0) or (test_winograd_forward and case0) or (test_fft_forward and case0) \
or test_group_norm_nhwc_clusters or (test_backward_ring_configs and 1-9) or (test_backward_wgmma_long) \
or test_inference_matches_training or test_nan_rules or test_global_average or test_backward_blend \
or (test_forward and 1-9) or test_transform_nchw"
# The kernels added since (warp-specialized attention, grouped / narrow convolutions, fused TMA GEMM epilogues,
# RNN wavefronts, pooling gathers, the graph's chains): the first case of each test function, so that every
# kernel body runs once without racecheck's cost growing with the parametrization.
NEWER="(test_backward_ws and bf16) or (test_tma and bf16) or test_persistent_schedule_tma or test_narrow_forward \
or test_narrow_backward_filter or test_fused_tma_bias_gelu_f16 or test_fused_tma_bias_row_max \
or test_wavefront_against_float64_reference or test_proj_wavefront_against_reference_and_layer_order \
or test_p2t_against_reference or test_p2_against_reference or test_win2_against_reference \
or (test_grouped_direct_forward and bf16) or (test_grouped_direct_backward_data and bf16) or test_chain8"
mapfile -t SEL < <({ python3 -m pytest --collect-only -q -p no:cacheprovider -m gpu tests/ops tests/graph -k "$VARIANTS"
  python3 -m pytest --collect-only -q -p no:cacheprovider -m gpu tests/ops tests/graph -k "$NEWER" \
    | awk -F'[' '/::/ && !seen[$1]++'; } | grep '::' | sort -u)
echo "racecheck / synccheck selection: ${#SEL[@]} tests"

for tool in $(echo "$tools" | tr ',' ' '); do
  case $tool in
    memcheck) run_tool memcheck "every GPU test${PYDNN_SANITIZE_K:+ (-k $PYDNN_SANITIZE_K)}" "${PYDNN_SANITIZE_SHARDS:-8}" \
                -m gpu ${PYDNN_SANITIZE_K:+-k "$PYDNN_SANITIZE_K"} tests ;;
    racecheck|synccheck) run_tool "$tool" "one case per kernel variant" "${PYDNN_SANITIZE_SHARDS:-8}" "${SEL[@]}" ;;
    *) echo "unknown tool $tool" ;;
  esac
done
cat "$summary"
exit $status
