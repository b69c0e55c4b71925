# gemm2 (issue 22, round 2): the fused bias + GELU on gemm_tma's cooperative tile. Holds timing: do not share the GPU.
# kinds: plain; gelu (the defaults: gelu_ex2 + stmatrix stores, bias staged); gelu1sw (+ EPI_WIDEN: the staged bias
# widened to float while the last K tile's wgmmas run); gelu1sc (+ EPI_CHUNK: the epilogue computes and stores 64
# columns at a time); gelu1swc (both); gelu1swc32 (both, 32-column chunks). Timing first, then GPU tests.
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv 2>&1 | tail -2
timeout 62 python3 tools/gemm_timeline.py --variants coop --kinds plain,gelu,gelu1sw,gelu1sc,gelu1swc,gelu1swc32 \
  --bench 5 --bench-kinds gelu,gelu1sw,gelu1sc,gelu1swc,gelu1swc32 --power 0.3 --out "$OUT" > "$OUT/timeline.txt" 2>&1
echo "timeline rc $?"
grep -v "^ *[0-9]\+ \|^  *|" "$OUT/timeline.txt" | grep -v "^$" | grep -v "^  wg1\|^  prod" | head -80
T=tests/ops/matmul/test_matmul_fused_tma_gpu.py::test_fused_tma_widen_chunk
timeout 26 python3 -m pytest -q -x "$T[interior-bf16-both]" "$T[edges_batched-bf16-both]" "$T[nt_pairs-bf16-both]" \
  "$T[edges_batched-bf16-both32]" "$T[interior-bf16-both32]" "$T[edges_batched-f16-widen]" \
  "$T[edges_batched-bf16-chunk]" 2>&1 | tail -4
