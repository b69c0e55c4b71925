# conv (issue 18), second batch: the convolution sweep (tools/sweep_conv.py, bf16 NHWC, cuDNN 9.19 beside it) at this
# branch's defaults, for a current figure; the kernel units first (timed apart), then the grid's points in its order
# until the time left is spent (the summary counts what was not sampled). Holds timing: do not share the GPU.
mkdir -p "$OUT"
T0=$SECONDS
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv 2>&1 | tail -1
U=$(python3 -c "import sys; sys.path.insert(0, 'tools'); import sweep_conv; print(','.join(sweep_conv.PREBUILD))")
timeout 60 python3 -m pydnn build --only "$U" --arch sm_90 > "$OUT/build.txt" 2>&1
echo "build rc $? at $((SECONDS - T0)) s"; tail -1 "$OUT/build.txt"
B=$(( 140 - (SECONDS - T0) - 12 ))
timeout $(( 144 - (SECONDS - T0) )) python3 tools/sweep_conv.py --budget-s "$B" --out "$OUT" > "$OUT/sweep.txt" 2>&1
echo "sweep rc $? at $((SECONDS - T0)) s (budget $B s)"
grep -A8 "^| direction" "$OUT"/sweep_conv*.md 2>/dev/null | head -10 || tail -20 "$OUT/sweep.txt"
