#!/usr/bin/env bash
# install (session 32, issue 21), mid-session batch on one H200 (<= 150 s). Timing first: softmax's half / bfloat16
# fold (softmax.h16) against the typed kernels, outputs compared bit for bit (tools/fold16.py --gpu); then the GPU
# tests of the changed kernels (softmax) and of the first-use paths rare.py now takes (grouped convolutions, the
# warp-specialized forward's older forms: their units compile in the loader, one log line each); last, the CPU
# seconds of those first-use compiles (each unit alone in a worker process, like a first use).
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
el "build, sm_90: the install parts the steps load, and the grouped first-use units (one parallel build)"
timeout 40 python3 - > "$OUT/build.log" 2>&1 <<'PY'
from pydnn._build import build, manifest
arch = "sm_90"
PRE = ("softmax", "convolution", "conv_", "attention.ws", "tensor_ops", "activation")
GROUPED = ("convolution.grouped.", "convolution.gdirect", "convolution.gwgrad.")
# (the grouped chunks prebuilt: a first use compiles them one at a time, longer than this run has; the attention
# chunks are left to the loader's first-use compile, one log line each)
units = [u for u in manifest.all_units(arch) if manifest.unit_arch(u, arch)
         and ((u.install and u.name.startswith(PRE)) or (not u.install and u.name.startswith(GROUPED)))]
print(len(units), "units", flush=True)
print(build.build_all(archs=[arch], units=units))
PY
el "build rc=$?"; tail -3 "$OUT/build.log"
# 1. softmax folded vs typed: bits and time (the typed units are built first, in parallel)
el "fold16 --gpu softmax"
timeout 35 python3 tools/fold16.py --gpu --only softmax --reps 20 --out "$OUT" > "$OUT/fold16_softmax.log" 2>&1
el "rc=$?"; tail -22 "$OUT/fold16_softmax.log"
# 2. softmax GPU tests (the folded kernels against the float64 references)
el "softmax GPU tests"
timeout 20 python3 -m pytest -q -p no:cacheprovider tests/ops/softmax/test_softmax_gpu.py \
  tests/ops/softmax/test_softmax_split_gpu.py > "$OUT/test_softmax.log" 2>&1
el "rc=$?"; tail -4 "$OUT/test_softmax.log"
# 3. grouped convolutions on their first-use units
el "grouped convolution GPU tests (their first-use units, prebuilt above)"
PYDNN_LOGDEST="$OUT/first_use_conv.log" timeout 30 python3 -m pytest -q -x -p no:cacheprovider \
  tests/ops/convolution/test_convolution_grouped_gpu.py tests/ops/convolution/test_convolution_grouped_direct_gpu.py \
  > "$OUT/test_conv.log" 2>&1
el "rc=$?"; tail -4 "$OUT/test_conv.log"; grep -c "first use" "$OUT/first_use_conv.log"; head -20 "$OUT/first_use_conv.log"
# 4. the warp-specialized forward's older forms through their first use
el "attention GPU tests (gh without AL, c3, q2's d 64 TMA: first use)"
PYDNN_LOGDEST="$OUT/first_use_attn.log" timeout 15 python3 -m pytest -q -p no:cacheprovider \
  tests/ops/attention/test_attention_ws_gh_gpu.py tests/ops/attention/test_attention_ws_q2_gpu.py \
  -k "(d64 and gh- and grid4) or (c3 and grid4 and bf16)" > "$OUT/test_attn.log" 2>&1
el "rc=$?"; tail -4 "$OUT/test_attn.log"; cat "$OUT/first_use_attn.log"
# 5. what a first use costs: the moved bfloat16 units of sm_90, each alone (CPU s; a first use compiles them in turn)
el "first-use units, sm_90 (CPU s each)"
timeout 15 python3 tools/build_stats.py --arch sm_90 --rare --procs 14 --json "$OUT/first_use_sm90.json" \
  --units convolution.grouped.bf16.rare,convolution.gdirect1.bf16.rare,convolution.gdirect2.bf16.rare,\
convolution.gwgrad.bf16.rare,attention.ws.bf16.rare,attention.ws.q2.bf16.rare,attention.ws.c3.bf16.rare,\
attention.ws.gh.bf16.rare > "$OUT/first_use_sm90.log" 2>&1
el "rc=$?"; grep -v "^$" "$OUT/first_use_sm90.log" | tail -20
el "done"
