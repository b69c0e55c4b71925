# gemm2's final check (<= 60 s, one H200; holds timing): the fused bias + GELU with the new defaults (EPI_WIDEN +
# EPI_CHUNK: kind gelu) beside the old defaults (gelu1s: gelu_ex2 + stmatrix only) and plain, then the GPU tests the
# defaults reach (bias + GELU bf16 / f16, staged bias over 2 blocks, widen without stmatrix, chunk alone).
mkdir -p "$OUT"
timeout 35 python3 tools/gemm_timeline.py --variants coop --kinds plain,gelu,gelu1s --bench 3 --bench-kinds gelu,gelu1s \
  --power 0.3 --out "$OUT" > "$OUT/timeline.txt" 2>&1
echo "timeline rc $?"
grep -v "^ *[0-9]\+ \|^  *|" "$OUT/timeline.txt" | grep -v "^$" | grep -v "^  wg\|^  prod\|block 0:" | head -30
T=tests/ops/matmul/test_matmul_fused_tma_gpu.py
timeout 22 python3 -m pytest -q "$T::test_fused_tma_bias_gelu" "$T::test_fused_tma_bias_gelu_f16" \
  "$T::test_fused_tma_staged_bias[gelu_edges_2_blocks]" "$T::test_fused_tma_gelu_ex2_stsm[edges_batched-ex2]" \
  "$T::test_fused_tma_widen_chunk[edges_batched-bf16-chunk]" 2>&1 | tail -3
