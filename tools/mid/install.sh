#!/usr/bin/env bash
# install (session 32, issue 21) on one H200, <= 90 s: the first-use paths rare.py now takes, on the GPU: grouped
# convolutions (the first grouped call compiles all of its data type's grouped units at once, in parallel: rare.py's
# `together`, loader.load_unit) and the warp-specialized forward's older forms (one unit at a time), one log line
# each, against the float64 references; then the CPU tests of the install split.
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
el "build, sm_90: the install parts the tests load (one parallel build; the first-use units left to the loader)"
timeout 20 python3 - > "$OUT/build.log" 2>&1 <<'PY'
from pydnn._build import build, manifest
arch = "sm_90"
PRE = ("convolution", "conv_", "attention.ws", "tensor_ops", "activation")
units = [u for u in manifest.all_units(arch) if manifest.unit_arch(u, arch) and u.install and u.name.startswith(PRE)]
print(len(units), "units", flush=True)
print(build.build_all(archs=[arch], units=units))
PY
el "build rc=$?"; tail -2 "$OUT/build.log"
el "GPU tests: grouped convolutions and the forward's older forms, through their first use in the loader"
PYDNN_LOGDEST="$OUT/first_use.log" timeout 48 python3 -m pytest -q -p no:cacheprovider \
  tests/ops/attention/test_attention_ws_gh_gpu.py tests/ops/attention/test_attention_ws_q2_gpu.py \
  tests/ops/convolution/test_convolution_grouped_gpu.py tests/ops/convolution/test_convolution_grouped_direct_gpu.py \
  -k "grouped or (d64 and gh- and grid4) or (c3 and grid4 and bf16)" > "$OUT/test_gpu.log" 2>&1
el "rc=$?"; tail -3 "$OUT/test_gpu.log"; cat "$OUT/first_use.log"
el "CPU tests of the install split"
timeout 15 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_install_choices_cpu.py \
  tests/kernels/test_rare_cpu.py > "$OUT/test_cpu.log" 2>&1
el "rc=$?"; tail -3 "$OUT/test_cpu.log"
el "done"
