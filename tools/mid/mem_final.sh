#!/usr/bin/env bash
# mem (issue 20), session 33: the final GPU call's line (<= 90 s on one H200): the GPU tests of the files this branch
# changed, then the bench line of its defaults beside their off side (PyTorch in the same run). Writes $OUT/mem_*.
set -u
OUT=${OUT:-/tmp/mem_out}; mkdir -p "$OUT"
t0=$(date +%s)
timeout 30 python3 -m pydnn build --arch sm_90 --only activation,softmax,reduce,batchnorm > "$OUT/mem_build.txt" 2>&1
timeout 45 python3 -m pytest -q -p no:cacheprovider tests/ops/activation/test_activation_gpu.py \
  tests/ops/softmax/test_softmax_gpu.py tests/ops/reduce/test_reduce_tail_gpu.py \
  tests/ops/batchnorm/test_batchnorm_nc_gpu.py::test_gen_tiny tests/ops/batchnorm/test_batchnorm_ncres_gpu.py \
  > "$OUT/mem_tests.txt" 2>&1
echo "[mem] $(( $(date +%s) - t0 )) s: tests rc $?"; tail -3 "$OUT/mem_tests.txt"
left=$(( 88 - ($(date +%s) - t0) )); [ $left -lt 5 ] && left=5
timeout $left python3 tools/bench_memory_points.py --points \
bn_bwd_2x477x13_fp32,smc_40x601x3_bf16,ncrsu_bwd_nchw_4x139x64_fp16,ncrw_bwd_nchw_1x140x99_bf16,\
ncrsu_train_nchw_4x256x64_bf16,ncrsu_bwd_nchw_5x1481x23_fp32,tanh_12701x65536_bf16 2>&1 | tee "$OUT/mem_points.txt"
echo "[mem] $(( $(date +%s) - t0 )) s: done"
