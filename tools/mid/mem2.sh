#!/usr/bin/env bash
# mem (issue 20), branch mem, SECOND batch (session 33): the defaults the first batch decided (GEN_WAVE, COL_FILL 1,
# tanh_fast, NC_RES_SU 1) re-timed beside their off side; more A/Bs (reduce's ROW_ROUNDS_WIDE on its two steady
# deficits, max pooling backward p2t / p2, nc_res's 512-thread streaming blocks: NC_RES_STREAM_WIDE); the whole
# sweep; then the GPU tests the first batch could not run at this code (softmax's CASES under COL_FILL, test_gen_tiny
# under GEN_WAVE, the wide streaming form). ~130 s.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/mem_out}; mkdir -p "$OUT"
t0=$(date +%s)
el() { echo "[mem] $(( $(date +%s) - t0 )) s: $*"; }
timeout 45 python3 -m pydnn build --arch sm_90 \
  --only activation,tensor_ops,reduce,softmax,pooling,batchnorm,normalization,dropout > "$OUT/build.txt" 2>&1
el "built"; tail -2 "$OUT/build.txt"
timeout 35 python3 tools/bench_memory_points.py --points \
bn_bwd_2x477x13_fp32,gen_train_20x300x4_fp32,gen_bwd_4x200x8_fp16,gen_train_51x175x2_bf16,\
smc_40x601x3_bf16,smc_8x1000x7_fp16,smc_2x2048x5_fp32,tanh_12701x65536_bf16,ncrsu_bwd_nchw_5x1481x23_fp32,\
ncrsu_bwd_nchw_4x139x64_fp16,ncrsu_train_nchw_4x256x64_bf16,ncrw_bwd_nchw_1x140x99_bf16,\
rrw_avg_53513x2824_fp32,rrw_sum_19501x61373_bf16,poolb_2x168x55_max_fp16 2>&1 | tee "$OUT/points.txt"
el "points"
timeout 40 python3 tools/sweep_memory.py --budget-s 30 --out "$OUT/sweep" > "$OUT/sweep.txt" 2>&1
el "sweep"; grep -E "^\| all " "$OUT/sweep/sweep_memory.md" 2>/dev/null
left() { local l=$(( 146 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; echo $l; }
timeout $(left) python3 -m pytest -q -p no:cacheprovider tests/ops/batchnorm/test_batchnorm_nc_gpu.py::test_gen_tiny \
  tests/ops/batchnorm/test_batchnorm_ncres_gpu.py::test_ncres_stream_wide tests/ops/softmax/test_softmax_gpu.py \
  > "$OUT/tests.txt" 2>&1
el "tests rc $?"; tail -3 "$OUT/tests.txt"
