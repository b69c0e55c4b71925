# conv (issue 18), second batch, at this branch's new defaults (FWD_TMA_WIDE, TMA_1X1, FWD_TMA_STRIDED and
# DGRAD_TMA_PHASES on, from the first batch): (1) the 16-byte store on the stride-1 forwards already on fwd_tma
# (compute-bound 3x3 mostly: --set wide, plain vs 16-byte stores), (2) the 1x1 backward filter as one matmul with
# split-K (--set wgrad, WGRAD_MM: off until this), (3) the convolution sweep with the time left (a sample: its summary
# counts what was not sampled; cuDNN 9.19 beside it); first the GPU tests of the new default paths (bf16: the
# 16-byte store incl. the fused bias, strided forwards, the 1x1 routes, BN 64 under a wave, WGRAD_MM). Holds timing.
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
R=tools/bench_conv_tma_routes.py
timeout 24 python3 $R --set wide --bns "" --wide 0 --budget-s 20 --out "$OUT" > "$OUT/rwide.txt" 2>&1
echo "wide rc $? at $((SECONDS - T0)) s"; cut -c1-250 "$OUT/rwide.txt"
timeout 20 python3 $R --set wgrad --bns "" --wide 0 --budget-s 16 --out "$OUT" > "$OUT/rwgrad.txt" 2>&1
echo "wgrad rc $? at $((SECONDS - T0)) s"; cut -c1-300 "$OUT/rwgrad.txt"
B=$(( 146 - (SECONDS - T0) - 14 ))
if [ "$B" -gt 15 ]; then
  timeout $(( 146 - (SECONDS - T0) )) python3 tools/sweep_conv.py --budget-s "$B" --out "$OUT" > "$OUT/sweep.txt" 2>&1
  echo "sweep rc $? at $((SECONDS - T0)) s (budget $B s)"
  grep -A6 "^| direction" "$OUT"/*.md 2>/dev/null | head -8; tail -4 "$OUT/sweep.txt"
fi
echo "done at $((SECONDS - T0)) s"
