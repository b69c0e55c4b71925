# conv (issue 18), a third check at the branch's final defaults: the GPU tests of the paths changed since the second
# batch (the fused bias on the 16-byte store, BN 64 under a wave, WGRAD_MM's rule), then the sweep's fused and issue
# parts (fused / plain: the issue's <= 1.03x, 1.34-1.78x in the second batch before the fused bias took the 16-byte
# store), then the sweep with the time left. Holds timing: do not share the GPU.
mkdir -p "$OUT"
T0=$SECONDS
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv 2>&1 | tail -1
U=$(python3 -c "import sys; sys.path.insert(0, 'tools'); import sweep_conv; print(','.join(sweep_conv.PREBUILD))")
timeout 40 python3 -m pydnn build --only "$U,matmul.tma.bf16" --arch sm_90 > "$OUT/build.txt" 2>&1
echo "build rc $? at $((SECONDS - T0)) s"; tail -1 "$OUT/build.txt"
timeout 25 python3 -m pytest -q -p no:cacheprovider tests/ops/convolution/test_convolution_tma_gpu.py \
  tests/ops/convolution/test_convolution_tma_dgrad_gpu.py tests/ops/convolution/test_convolution_wgrad_mm_gpu.py \
  -k "(wide or strided or 1x1 or under_a_wave or wgrad or bias) and not half" > "$OUT/tests.txt" 2>&1
echo "tests rc $? at $((SECONDS - T0)) s"; grep -E "passed|failed|Error|assert" "$OUT/tests.txt" | tail -6
timeout 25 python3 tools/sweep_conv.py --only fused,issue --out "$OUT/fi" > "$OUT/fused_issue.txt" 2>&1
echo "fused+issue rc $? at $((SECONDS - T0)) s"; grep -B2 -A8 "^| layer" "$OUT"/fi/*.md 2>/dev/null | head -24
B=$(( 140 - (SECONDS - T0) - 12 ))
if [ "$B" -gt 15 ]; then
  timeout $(( 146 - (SECONDS - T0) )) python3 tools/sweep_conv.py --budget-s "$B" --out "$OUT" > "$OUT/sweep.txt" 2>&1
  echo "sweep rc $? at $((SECONDS - T0)) s (budget $B s)"; grep -A6 "^| direction" "$OUT"/sweep_conv.md | head -8
fi
echo "done at $((SECONDS - T0)) s"
