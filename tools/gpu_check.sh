#!/usr/bin/env bash
# One command for a GPU machine with no network: install pydnn into its python3, run the whole test suite
# (GPU tests included), optionally under compute-sanitizer, run the benchmarks, write logs to a folder.
#
#   tools/gpu_check.sh [LOGDIR]            LOGDIR defaults to $OUT, else ./gpu_logs
#   PYDNN_SANITIZE=1 tools/gpu_check.sh    also run the activation/softmax GPU tests under memcheck
#   PYDNN_BENCH_FAMILIES=activation,host   benchmark families (default: all)
#   PYDNN_BENCH_SCRIPTS=rnn,graph,host_c   the families with benchmarks of their own (default: these three;
#                                          '' for none): tools/bench_rnn.py, bench_graph.py, bench_host.py --c
#   PYDNN_SKIP_TESTS=1 / PYDNN_SKIP_BENCH=1
#   PYDNN_TEST_SHARDS=2                    the test suite in 2 concurrent pytest processes (logs tests.N.log)
#
# Missing Python packages (cffi, pycparser) come from wheels in .whl/ (tools/fetch_wheels.sh makes them).
set -uo pipefail
cd "$(dirname "$0")/.."
logs=${1:-${OUT:-gpu_logs}}
mkdir -p "$logs"
export PYTHONUNBUFFERED=1
status=0

if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/pydnn-site \
    .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/pydnn-site${PYTHONPATH:+:$PYTHONPATH}
fi

echo "== install (offline, editable; compiles every kernel and libpydnn)" | tee "$logs/install.log"
t0=$(date +%s)
# every unit, the first-use ones too (pydnn/_build/rare.py): in parallel here rather than one at a time
# inside the tests
PYDNN_BUILD_ALL=${PYDNN_BUILD_ALL:-1} python3 -m pip install --no-index --no-deps --no-build-isolation -v -e . >>"$logs/install.log" 2>&1 \
  || { echo "install failed"; tail -40 "$logs/install.log"; exit 1; }
grep -E "^pydnn:|compiled|C library" "$logs/install.log" | tr '\r' '\n' | grep -v '^\s*$' | tail -4
echo "install took $(( $(date +%s) - t0 )) s"
python3 -m pydnn info 2>&1 | tee "$logs/info.log"

if [ "${PYDNN_SKIP_TESTS:-0}" != 1 ]; then
  shards=${PYDNN_TEST_SHARDS:-1}
  if [ "$shards" -le 1 ]; then
    echo "== tests"
    python3 -m pytest -q -p no:cacheprovider -rfE tests 2>&1 | tee "$logs/tests.log" | tail -25
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
  else
    # the suite in $shards pytest processes sharing the GPU (the tests are mostly launch- and host-bound,
    # so they overlap well), the collected tests dealt out round robin (PYDNN_TEST_SHARD, tests/conftest.py)
    # so that no shard gets a slow file whole; PYDNN_TEST_MARK=gpu keeps the GPU tests only (the CPU ones
    # run in CI)
    echo "== tests ($shards shards${PYDNN_TEST_MARK:+, -m $PYDNN_TEST_MARK})"
    declare -a pids
    # each shard's numpy (the float64 references) gets its share of the cores, not all of them: 24 shards with
    # BLAS free to use all 32 cores reached only a quarter of the attention tests in 300 s (session 32)
    threads=$(( $(nproc) / shards )); [ "$threads" -ge 1 ] || threads=1
    for ((i = 0; i < shards; i++)); do
      OMP_NUM_THREADS=${OMP_NUM_THREADS:-$threads} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-$threads} \
      PYDNN_TEST_SHARD="$i/$shards" python3 -m pytest -q -p no:cacheprovider -rfE ${PYDNN_TEST_MARK:+-m "$PYDNN_TEST_MARK"} \
        tests >"$logs/tests.$i.log" 2>&1 &
      pids[$i]=$!
    done
    for ((i = 0; i < shards; i++)); do
      wait "${pids[$i]}" || status=1
      echo "-- shard $i:"; grep -E "^(FAILED|ERROR)" "$logs/tests.$i.log" | head -20; tail -1 "$logs/tests.$i.log"
    done
  fi
fi

if [ "${PYDNN_SANITIZE:-0}" = 1 ] && command -v compute-sanitizer >/dev/null; then
  echo "== compute-sanitizer memcheck"
  # a slice of every kernel family (memcheck slows kernels down a hundredfold), each run time-boxed
  san() { timeout "${PYDNN_SANITIZE_TIMEOUT:-240}" compute-sanitizer --tool memcheck --error-exitcode 9 \
            python3 -m pytest -q -p no:cacheprovider -x "$@"; }
  san tests/ops/activation/test_activation_gpu.py tests/ops/softmax/test_softmax_gpu.py tests/ops/tensor_ops/test_tensor_ops_gpu.py tests/ops/reduce/test_reduce_gpu.py \
    -k "(test_forward and (1-9 or 1-1-9 or 2-0-2)) or test_backward[1-9] or test_transform_nchw or test_add_scale_set[9] or test_alpha_beta or test_nan_propagation" \
    2>&1 | tee "$logs/memcheck.log" | tail -4
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  san tests/ops/pooling/test_pooling_gpu.py tests/ops/batchnorm/test_batchnorm_gpu.py tests/ops/normalization/test_normalization_gpu.py tests/ops/dropout/test_dropout_gpu.py \
    tests/ops/convolution/test_convolution_gpu.py tests/ops/attention/test_attention_gpu.py \
    -k "test_nan_rules or test_global_average or test_backward_blend or test_in_place_forward or test_p_zero_and_one or test_in_place or test_backward_filter_split or test_bias_activation_tensor_cores or test_variable_lengths" \
    2>&1 | tee "$logs/memcheck_families.log" | tail -4
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  # the tensor-core, matmul, Winograd, GEMM, FFT, group-norm / ring cluster and wgmma attention kernels: one
  # case of each variant
  san tests/ops/matmul/test_matmul_gpu.py tests/ops/convolution/test_convolution_gpu.py tests/ops/convolution/test_convolution_algos_gpu.py \
    tests/ops/convolution/test_convolution_fft_gpu.py tests/ops/normalization/test_normalization_gpu.py tests/ops/attention/test_mha_gpu.py \
    tests/ops/attention/test_attention_wgmma_gpu.py tests/ops/attention/test_attention_wgmma_bwd_gpu.py \
    tests/ops/convolution/test_convolution_wgrad_wgmma_gpu.py tests/ops/convolution/test_convolution_gemm_gpu.py \
    -k "(test_wgmma_backward_filter and case0) or (test_gemm_backward_data and case0) or (test_gemm_bias_activation and case0) or (test_simt_tiles and trans0) or (test_group_norm_nhwc_reg and 9) or test_every_variant or (test_backward_wgmma_variable_lengths and bf16) or (test_backward_wgmma_long) or (test_backward_ring_configs and 1-9) or (test_wgmma_bias_activation and tiling0-6-9) or (test_wgmma_backward_data and tiling1-9-case0) or (test_fft_backward_filter and 0-case0) or (test_each_tile and trans0) or (test_wgmma_tiles and trans0) or (test_wgmma_forward and case0) or (test_winograd_forward and case0) or (test_winograd_backward_data and case0) or (test_gemm_forward and case0) or (test_fft_forward and case0) or (test_fft_backward_data and case0) or test_group_norm_nhwc_clusters or (test_forward_tensor_cores and case0) or (test_backward_data_tensor_cores and case0) or (test_backward_filter_tensor_cores and case0) or test_inference_matches_training" \
    2>&1 | tee "$logs/memcheck_matrix.log" | tail -4
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  # the backward-filter algorithms of issue 4's later sessions (ALGO_3: wgrad_implicit, im2col / pack_rows /
  # wgrad_fold; WINOGRAD_NONFUSED: input / grad transforms, filter_grad), backward data on fwd_wgmma
  # reading the filter itself (BKN) and batch norm's fwd_apply_saved
  san tests/ops/convolution/test_convolution_gemm_wgrad_gpu.py tests/ops/convolution/test_convolution_wino_wgrad_gpu.py tests/ops/batchnorm/test_batchnorm_gpu.py \
    tests/ops/convolution/test_convolution_gpu.py \
    -k "(test_gemm_backward_filter and (True-0-case0 or False-0-case0 or False-9-case1)) or (test_implicit_backward_filter and many-case5) or (test_winograd_backward_filter and (4-0-case0 or 2-9-case0)) or (test_forward_fast16 and 9-True-True) or (test_wgmma_backward_data and None-9-case3)" \
    2>&1 | tee "$logs/memcheck_wgrad.log" | tail -4
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi

if [ "${PYDNN_SKIP_BENCH:-0}" != 1 ]; then
  echo "== benchmarks"
  python3 tools/bench.py --families "${PYDNN_BENCH_FAMILIES:-activation,tensor,softmax,reduce,pooling,batchnorm,normalization,dropout,convolution,convolution_algos,attention,matmul,mha,host}" \
    --out "$logs/bench.md" 2>&1 | tee "$logs/bench.log" | grep -v '^|' | tail -40
  cat "$logs/bench.md"
  for b in $(echo "${PYDNN_BENCH_SCRIPTS-rnn,graph,host_c}" | tr ',' ' '); do
    case $b in
      rnn) cmd=(python3 tools/bench_rnn.py) ;;
      graph) cmd=(python3 tools/bench_graph.py) ;;
      host_c) cmd=(python3 tools/bench_host.py --c) ;;
      *) echo "unknown benchmark script $b"; continue ;;
    esac
    echo "== ${cmd[*]}"
    timeout "${PYDNN_BENCH_TIMEOUT:-300}" "${cmd[@]}" 2>&1 | tee "$logs/bench_$b.log" | tail -30
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
  done
fi
exit $status
