# cnn2 (issue 17): the CNN demo's eager step. Timings first: tools/bench_cnn_step.py A/B of tuning.torch.BLOCK_ARENA
# (new, on) and LINEAR_LEAN (off, candidate), one process each (pydnn beside PyTorch, interleaved rounds); then the
# demo's own command (default eager, interleaved epochs, batch 256) with 4 epochs; then the GPU tests of the
# changed code. Needs the GPU alone (timings). Runs from the tree root; results under $OUT. <= 100 s.
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"
t0=$(date +%s)
el() { echo "[cnn2 $(( $(date +%s) - t0 )) s] $*"; }
left() { echo $(( 100 - ($(date +%s) - t0) )); }
el prebuild
timeout 30 python3 tools/profile_torch_step.py --prebuild-only --demos cnn > "$OUT/prebuild.log" 2>&1; el "prebuild rc $?"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader > "$OUT/gpu.txt" 2>&1
b() { tag=$1; shift; env "$@" timeout 13 python3 tools/bench_cnn_step.py --rounds 12 --steps 10 \
        --json "$OUT/bench_${tag}.json" 2>&1 | tail -3; el "bench $tag"; }
b def_1 PYDNN_TUNING=
b noarena_1 PYDNN_TUNING="torch.BLOCK_ARENA=False"
b ll_1 PYDNN_TUNING="torch.LINEAR_LEAN=True"
b def_2 PYDNN_TUNING=
b noarena_2 PYDNN_TUNING="torch.BLOCK_ARENA=False"
# the measure: the demo's own command (default eager, interleaved epochs, batch 256), 4 epochs
if [ "$(left)" -gt 28 ]; then
  timeout 15 python3 examples/train_cnn.py --epochs 4 --plot '' --json "$OUT/train_cnn.json" > "$OUT/train_cnn.log" 2>&1
  el "demo rc $?"; tail -4 "$OUT/train_cnn.log"
fi
tl=$(( $(left) - 2 )); [ "$tl" -lt 8 ] && tl=8
timeout "$tl" python3 -m pytest -q tests/torch/test_torch_block_lean_gpu.py tests/torch/test_torch_chain_gpu.py \
  tests/torch/test_torch_fuse_block_gpu.py > "$OUT/tests.log" 2>&1; el "tests rc $?"
tail -8 "$OUT/tests.log"
