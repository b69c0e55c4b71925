#!/usr/bin/env bash
# install (session 32, issue 21) on one H200, <= 90 s: the first-use paths rare.py now takes, on the GPU (grouped
# convolutions: their units prebuilt in parallel, as `python -m pydnn build --only ... --all` would; the
# warp-specialized forward's older forms compiled by the loader on first use, one log line each), the CPU tests of
# the install split, and the CPU seconds a first use of the grouped / attention units costs (each alone).
# (Mid-session run 1 ran an earlier form of this script with softmax's fold, since reverted: tools/notes/install.md.)
# The 2-core build's timing is its own call: CORES=<2 idle cores> bash tools/time_build.sh
# Run from the tree root: PYTHONPATH=$PWD:... PYDNN_CACHE_DIR=... OUT=... bash tools/mid/install.sh
set -u
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
T0=$(date +%s)
el() { echo "[install.sh +$(( $(date +%s) - T0 )) s] $*"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader > "$OUT/gpu.txt" 2>&1
python3 -c "from pydnn._cuda import nvrtc; print('NVRTC', nvrtc.version())" >> "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
el "build, sm_90: the install parts the tests load, and the grouped first-use units (one parallel build)"
timeout 25 python3 - > "$OUT/build.log" 2>&1 <<'PY'
from pydnn._build import build, manifest
arch = "sm_90"
PRE = ("convolution", "conv_", "attention.ws", "tensor_ops", "activation")
GROUPED = ("convolution.grouped.", "convolution.gdirect", "convolution.gwgrad.")
units = [u for u in manifest.all_units(arch) if manifest.unit_arch(u, arch)
         and ((u.install and u.name.startswith(PRE)) or (not u.install and u.name.startswith(GROUPED)))]
print(len(units), "units", flush=True)
print(build.build_all(archs=[arch], units=units))
PY
el "build rc=$?"; tail -2 "$OUT/build.log"
el "GPU tests: grouped convolutions (first-use units), the forward's older forms (first use in the loader)"
PYDNN_LOGDEST="$OUT/first_use.log" timeout 30 python3 -m pytest -q -p no:cacheprovider \
  tests/ops/convolution/test_convolution_grouped_gpu.py tests/ops/convolution/test_convolution_grouped_direct_gpu.py \
  tests/ops/attention/test_attention_ws_gh_gpu.py tests/ops/attention/test_attention_ws_q2_gpu.py \
  -k "grouped or (d64 and gh- and grid4) or (c3 and grid4 and bf16)" > "$OUT/test_gpu.log" 2>&1
el "rc=$?"; tail -3 "$OUT/test_gpu.log"; cat "$OUT/first_use.log"
el "CPU tests of the install split"
timeout 20 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_install_choices_cpu.py \
  tests/kernels/test_rare_cpu.py > "$OUT/test_cpu.log" 2>&1
el "rc=$?"; tail -3 "$OUT/test_cpu.log"
el "first-use units, sm_90 (CPU s each)"
timeout 10 python3 tools/build_stats.py --arch sm_90 --rare --procs 14 --json "$OUT/first_use_sm90.json" \
  --units convolution.grouped.bf16.rare,convolution.gdirect1.bf16.rare,convolution.gdirect2.bf16.rare,\
convolution.gwgrad.bf16.rare,attention.ws.bf16.rare,attention.ws.q2.bf16.rare,attention.ws.c3.bf16.rare,\
attention.ws.gh.bf16.rare > "$OUT/first_use_sm90.log" 2>&1
el "rc=$?"; grep -v "^$" "$OUT/first_use_sm90.log" | tail -6
el "done"
