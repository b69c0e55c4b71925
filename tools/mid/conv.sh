# conv (issue 18): routes onto faster kernels, each against the plan it replaces and cuDNN on the sweep's points (bf16
# NHWC, one H200): TMA_1X1 (the direct 1x1 GEMM plans on gemm_tc -> fwd_tma; beside them matmul's gemm_tma on the GEMM
# plan, `mmtma`; FWD_TMA_WIDE's 16-byte stores, `wide`), WGRAD_MM (1x1 backward filters as one matmul with split-K),
# DGRAD_TMA_PHASES (strided backward data's phases on fwd_tma), FWD_TMA_STRIDED (strided forwards: x's TMA box with
# element strides). Holds timing: do not share the GPU. Timings first, then the new GPU tests (bf16), then (time left)
# fwd_tma whole on the stride-1 points that stay on fwd_wgmma today (--set few).
mkdir -p "$OUT"
T0=$SECONDS
left() { echo $(( 146 - (SECONDS - T0) )); }
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv 2>&1 | tail -1
U=convolution.tma.bf16,convolution.tma_dgrad.bn64.bf16,convolution.tma_dgrad.bn128.bf16,convolution.tma_dgrad.bn256.bf16
U=$U,convolution.tma_phase.bn64.bf16,convolution.tma_phase.bn128.bf16,convolution.tma_phase.bn256.bf16
U=$U,convolution.bf16,convolution.wgmma.bf16,convolution.wgmma.split.bf16,conv_dgrad.bf16,conv_gemm.bf16
U=$U,convolution.wgrad.bf16,matmul.bf16,matmul.tma.bf16,matmul.wgmma.bf16,matmul.wgmmas.bf16
timeout 50 python3 -m pydnn build --all --only "$U" --arch sm_90 > "$OUT/build.txt" 2>&1
echo "build rc $? at $((SECONDS - T0)) s"; tail -2 "$OUT/build.txt"
R=tools/bench_conv_tma_routes.py
timeout 30 python3 $R --set 1x1 --bns 256 --budget-s 25 --out "$OUT" > "$OUT/r1x1.txt" 2>&1
echo "1x1 rc $? at $((SECONDS - T0)) s"; cut -c1-300 "$OUT/r1x1.txt"
timeout 19 python3 $R --set wgrad --bns "" --wide 0 --budget-s 15 --out "$OUT" > "$OUT/rwgrad.txt" 2>&1
echo "wgrad rc $? at $((SECONDS - T0)) s"; cut -c1-300 "$OUT/rwgrad.txt"
timeout 17 python3 tools/bench_dgrad_tma.py --phases --budget-s 12 --out "$OUT" > "$OUT/phases.txt" 2>&1
echo "phases rc $? at $((SECONDS - T0)) s"; cut -c1-230 "$OUT/phases.txt"
timeout 15 python3 $R --set strided --bns "" --wide 0 --budget-s 10 --out "$OUT" > "$OUT/rstr.txt" 2>&1
echo "strided rc $? at $((SECONDS - T0)) s"; cut -c1-260 "$OUT/rstr.txt"
L=$(left); [ "$L" -gt 30 ] && L=30
if [ "$L" -gt 8 ]; then
  timeout "$L" python3 -m pytest -q -p no:cacheprovider tests/ops/convolution/test_convolution_tma_gpu.py \
    tests/ops/convolution/test_convolution_wgrad_mm_gpu.py -k "(strided or 1x1 or wide or wgrad) and not half" \
    > "$OUT/tests.txt" 2>&1
  echo "tests rc $? at $((SECONDS - T0)) s"; grep -E "passed|failed|Error|assert" "$OUT/tests.txt" | tail -8
fi
L=$(left)
if [ "$L" -gt 10 ]; then
  timeout "$L" python3 -m pytest -q -p no:cacheprovider tests/ops/convolution/test_convolution_tma_dgrad_gpu.py \
    -k "phases and not half" > "$OUT/tests_phases.txt" 2>&1
  echo "phase tests rc $? at $((SECONDS - T0)) s"; grep -E "passed|failed|Error|assert" "$OUT/tests_phases.txt" | tail -4
fi
L=$(( $(left) - 3 ))
if [ "$L" -gt 10 ]; then
  timeout "$L" python3 $R --set few --bns 64 --wide 0 --budget-s $((L - 5)) --out "$OUT" > "$OUT/rfew.txt" 2>&1
  echo "few rc $? at $((SECONDS - T0)) s"; cut -c1-260 "$OUT/rfew.txt"
fi
echo "done at $((SECONDS - T0)) s"
