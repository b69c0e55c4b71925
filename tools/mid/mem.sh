#!/usr/bin/env bash
# mem (issue 20), branch mem: timings first (bench points with A/B settings, then the whole memory sweep), GPU tests
# after. Needs ~140 s; each stage has its own cap. Writes $OUT/build.txt, points.txt, sweep/, tests.txt.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/mem_out}; mkdir -p "$OUT"
t0=$(date +%s)
el() { echo "[mem] $(( $(date +%s) - t0 )) s: $*"; }
# the memory families' install units for sm_90, and the A/B's first-use forms (activation.h16's tanh forms,
# batch norm's NC_RES_SU 4, reduce's indexed MAX for the tests), so no compile lands in a timing
timeout 45 python3 -m pydnn build --arch sm_90 \
  --only activation,tensor_ops,reduce,softmax,pooling,batchnorm,normalization,dropout > "$OUT/build.txt" 2>&1
timeout 25 python3 -m pydnn build --arch sm_90 --all \
  --only activation.h16,batchnorm.f32,batchnorm.f16,batchnorm.bf16,reduce.f32,reduce.h16 \
  >> "$OUT/build.txt" 2>&1
el "built"; tail -2 "$OUT/build.txt"
# named points (eager ms as the sweep times them, PyTorch in the same run; each setting against the default)
timeout 45 python3 tools/bench_memory_points.py --points \
tanh_12701x65536_bf16,tanh_3000x8192_fp16,tanh_2048x1000_bf16,ncrsu_bwd_nchw_5x1481x23_fp32,\
ncrsu_bwd_nchw_4x139x64_fp16,ncrsu_bwd_nchw_1x306x99_bf16,ncrsu_train_nchw_4x256x64_bf16,bn_bwd_2x477x13_fp32,\
gen_train_51x175x2_bf16,gen_bwd_4x200x8_fp16,gen_bwd_1x1000x7_fp32,gen_train_20x300x4_fp32,\
smc_40x601x3_bf16,smc_8x1000x7_fp16,smc_2x2048x5_fp32,smc_16x300x9_fp32,\
rmsi_1693x6776_bf16,reduce_sum_18x65536_fp32,reduce_max_9x65536_bf16,reduce_avg_40x100000_fp32,\
addplain_7167x8272_fp16,actb_relu_297888x256_fp32 2>&1 | tee "$OUT/points.txt"
el "points"
# the whole sweep (468 points, ~18-30 s)
timeout 45 python3 tools/sweep_memory.py --budget-s 35 --out "$OUT/sweep" > "$OUT/sweep.txt" 2>&1
el "sweep"; grep -E "^\| (all|act_fwd|bn_bwd|bn_train) " "$OUT/sweep/sweep_memory.md" 2>/dev/null
# the sweep's points below 1.0x once more (a second reading of each: noise against a real deficit)
python3 - "$OUT" > "$OUT/below.txt" <<'PY'
import json, sys
d = json.load(open(sys.argv[1] + "/sweep/sweep_memory.json"))
print(";".join(f"{r['group']} {r['case']} {r['dtype']}" for r in d["rows"] if r.get("ratio") is not None and r["ratio"] < 1.0))
PY
[ -s "$OUT/below.txt" ] && timeout 20 python3 tools/sweep_memory.py --points "$(cat "$OUT/below.txt")" --budget-s 12 \
  --out "$OUT/below" > "$OUT/below_sweep.txt" 2>&1
el "below-1.0 points again"
# and once more in alternating rounds (pydnn, PyTorch, x3): does the sweep's one-block order move them?
[ -s "$OUT/below.txt" ] && timeout 20 python3 tools/sweep_memory.py --points "$(cat "$OUT/below.txt")" --budget-s 12 \
  --paired 3 --out "$OUT/below_paired" > "$OUT/below_paired.txt" 2>&1
el "below-1.0 points paired"
# GPU tests of what changed (the rest, if cut, in the final command)
left() { local l=$(( 146 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; echo $l; }
timeout $(left) python3 -m pytest -q -p no:cacheprovider tests/ops/activation/test_activation_gpu.py \
  -k "tanh_16bit or extreme or in_place" > "$OUT/tests.txt" 2>&1
el "activation tests rc $?"; tail -2 "$OUT/tests.txt"
timeout $(left) python3 -m pytest -q -p no:cacheprovider tests/ops/reduce/test_reduce_tail_gpu.py::test_seg_rounds \
  >> "$OUT/tests.txt" 2>&1
el "reduce segment tests rc $?"; tail -2 "$OUT/tests.txt"
timeout $(left) python3 -m pytest -q -p no:cacheprovider tests/ops/softmax/test_softmax_gpu.py::test_col_fill \
  >> "$OUT/tests.txt" 2>&1
el "softmax COL_FILL tests rc $?"; tail -2 "$OUT/tests.txt"
timeout $(left) python3 -m pytest -q -p no:cacheprovider tests/ops/batchnorm/test_batchnorm_nc_gpu.py::test_gen_tiny \
  tests/ops/batchnorm/test_batchnorm_ncres_gpu.py >> "$OUT/tests.txt" 2>&1
el "batch norm nc_res / gen tests rc $?"; tail -2 "$OUT/tests.txt"
