#!/usr/bin/env bash
# install (session 32, issue 21), mid-session batch: the first-use paths of what rare.py moved out of the install
# (grouped convolutions; the warp-specialized forward's older forms) on the H200. No GPU timing: the CPU seconds of
# those first-use compiles (each unit alone in a worker process, like a first use), then the GPU tests that load
# them through the loader's first-use compile (one log line each) against the float64 references. <= 150 s.
# Run from the tree root: PYTHONPATH=$PWD:... PYDNN_CACHE_DIR=... OUT=... bash tools/mid/install.sh
set -u
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
T0=$(date +%s)
el() { echo "[install.sh +$(( $(date +%s) - T0 )) s] $*"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader > "$OUT/gpu.txt" 2>&1
nproc >> "$OUT/gpu.txt"
python3 -c "from pydnn._cuda import nvrtc; print('NVRTC', nvrtc.version())" >> "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
# 1. a first use's compile cost: every sm_90 first-use unit of the moved families, each alone in a worker (CPU s)
el "first-use units, sm_90 (CPU s each)"
timeout 30 python3 tools/build_stats.py --arch sm_90 --rare --procs 12 --json "$OUT/first_use_sm90.json" \
  --units convolution.grouped.bf16.rare,convolution.gdirect1.bf16.rare,convolution.gdirect2.bf16.rare,\
convolution.gwgrad.bf16.rare,attention.ws.bf16.rare,attention.ws.q2.bf16.rare,attention.ws.c3.bf16.rare,\
attention.ws.gh.bf16.rare > "$OUT/first_use_sm90.log" 2>&1
el "rc=$?"; grep -v "^$" "$OUT/first_use_sm90.log" | tail -25
# 2. the install parts those tests load (sm_90, every core), then the tests: their first-use units compile in
#    the loader (log lines kept)
el "build install parts (convolution, attention, matmul, element-wise)"
timeout 40 python3 -m pydnn build --arch sm_90 --no-lib \
  --only convolution,conv_,attention,matmul,tensor_ops,activation,reduce > "$OUT/build.log" 2>&1
el "build rc=$?"; tail -2 "$OUT/build.log"
el "grouped convolution GPU tests (first use of convolution.grouped / gdirect / gwgrad)"
PYDNN_LOGDEST="$OUT/first_use_conv.log" timeout 55 python3 -m pytest -q -x -p no:cacheprovider \
  tests/ops/convolution/test_convolution_grouped_gpu.py tests/ops/convolution/test_convolution_grouped_direct_gpu.py \
  > "$OUT/test_conv.log" 2>&1
el "rc=$?"; tail -4 "$OUT/test_conv.log"; grep -c "first use" "$OUT/first_use_conv.log"; head -30 "$OUT/first_use_conv.log"
el "attention GPU tests (gh without AL, c3, q2's d 64 TMA: first use)"
PYDNN_LOGDEST="$OUT/first_use_attn.log" timeout 30 python3 -m pytest -q -p no:cacheprovider \
  tests/ops/attention/test_attention_ws_gh_gpu.py tests/ops/attention/test_attention_ws_q2_gpu.py \
  -k "(d64 and gh- and grid4) or (c3 and grid4) or (forward_q2 and tma and grid4 and 64)" > "$OUT/test_attn.log" 2>&1
el "rc=$?"; tail -4 "$OUT/test_attn.log"; cat "$OUT/first_use_attn.log"
el "done"
