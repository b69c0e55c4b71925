# conv (issue 18): three routes onto fwd_tma, each against the plan it replaces and cuDNN on the sweep's points
# (bf16 NHWC, one H200): DGRAD_TMA_PHASES (strided backward data's phases), TMA_1X1 (the direct 1x1 GEMM plans on
# gemm_tc), FWD_TMA_STRIDED (strided forwards: x's box with element strides). Holds timing: do not share the GPU.
# Timings first, then the new GPU tests, then the sweep with what time is left (a sample: --budget-s).
mkdir -p "$OUT"
T0=$SECONDS
left() { echo $(( 146 - (SECONDS - T0) )); }
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv 2>&1 | tail -1
git log --oneline -1 2>/dev/null | cat
U=convolution.tma.bf16,convolution.tma_dgrad.bn64.bf16,convolution.tma_dgrad.bn128.bf16,convolution.tma_dgrad.bn256.bf16
U=$U,convolution.tma_phase.bn64.bf16,convolution.tma_phase.bn128.bf16,convolution.tma_phase.bn256.bf16
U=$U,convolution.bf16,convolution.wgmma.bf16,convolution.wgmma.split.bf16,conv_dgrad.bf16,conv_gemm.bf16,matmul.bf16
timeout 55 python3 -m pydnn build --all --only "$U" --arch sm_90 > "$OUT/build.txt" 2>&1
echo "build rc $? at $((SECONDS - T0)) s"; tail -2 "$OUT/build.txt"
timeout 24 python3 tools/bench_dgrad_tma.py --phases --reps 5 --budget-s 18 --out "$OUT" > "$OUT/phases.txt" 2>&1
echo "phases rc $? at $((SECONDS - T0)) s"; cat "$OUT/phases.txt" | cut -c1-230
timeout 26 python3 tools/bench_conv_tma_routes.py --set 1x1 --reps 5 --budget-s 20 --out "$OUT" > "$OUT/r1x1.txt" 2>&1
echo "1x1 rc $? at $((SECONDS - T0)) s"; cat "$OUT/r1x1.txt" | cut -c1-260
timeout 24 python3 tools/bench_conv_tma_routes.py --set strided --reps 5 --budget-s 18 --out "$OUT" > "$OUT/rstr.txt" 2>&1
echo "strided rc $? at $((SECONDS - T0)) s"; cat "$OUT/rstr.txt" | cut -c1-260
L=$(left); [ "$L" -gt 30 ] && L=30
if [ "$L" -gt 8 ]; then
  timeout "$L" python3 -m pytest -q -x -p no:cacheprovider tests/ops/convolution/test_convolution_tma_gpu.py \
    -k "strided or 1x1" > "$OUT/tests.txt" 2>&1
  echo "tests rc $? at $((SECONDS - T0)) s"; tail -5 "$OUT/tests.txt"
fi
L=$(left)
if [ "$L" -gt 10 ]; then
  timeout "$L" python3 -m pytest -q -x -p no:cacheprovider tests/ops/convolution/test_convolution_tma_dgrad_gpu.py \
    -k "phases" > "$OUT/tests_phases.txt" 2>&1
  echo "phase tests rc $? at $((SECONDS - T0)) s"; tail -3 "$OUT/tests_phases.txt"
fi
echo "done at $((SECONDS - T0)) s"
