# cnn2 (issue 17), the final GPU call (<= 89 s, one H200; results under $OUT): the kernels the CNN demo needs
# (convolution.tma.bf16.bn128: the mid-session run compiled it in each timed process; main's DGRAD_TMA units
# compile on first use, pydnn/_build/rare.py: the bf16 widths ahead, in parallel), tools/bench_cnn_step.py (pydnn
# beside PyTorch, interleaved; defaults: FUSE_CHAIN, BLOCK_LEAN, BLOCK_ARENA), the demo's own default command (30
# epochs, interleaved, batch 256), then the GPU tests of the changed code (BLOCK_ARENA / BLOCK_LEAN / LINEAR_LEAN
# against the general paths, the chain against the module path). Timings first.
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"
t0=$(date +%s)
el() { echo "[cnn2 $(( $(date +%s) - t0 )) s] $*"; }
timeout 20 python3 -m pydnn build --all --arch sm_90 --no-lib --only \
  convolution.tma.bf16.bn128,convolution.tma_dgrad.bn64.bf16,convolution.tma_dgrad.bn128.bf16,convolution.tma_dgrad.bn256.bf16 \
  > "$OUT/build.log" 2>&1
timeout 18 python3 tools/profile_torch_step.py --prebuild-only --demos cnn >> "$OUT/build.log" 2>&1; el "prebuild rc $?"
timeout 15 python3 tools/bench_cnn_step.py --rounds 10 --steps 10 --json "$OUT/bench_cnn_step.json" 2>&1 | tail -3
el bench
timeout 20 python3 examples/train_cnn.py --plot '' --json "$OUT/train_cnn.json" > "$OUT/train_cnn.log" 2>&1
el "demo rc $?"; tail -4 "$OUT/train_cnn.log"
timeout 16 python3 -m pytest -q tests/torch/test_torch_block_lean_gpu.py tests/torch/test_torch_chain_gpu.py \
  > "$OUT/tests.log" 2>&1; el "tests rc $?"; tail -4 "$OUT/tests.log"
