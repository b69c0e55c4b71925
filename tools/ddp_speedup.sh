#!/usr/bin/env bash
# Data-parallel speed-up of the PyTorch demos on pydnn.torch: each demo under
# `torchrun --nproc_per_node=1` and `=2` with the same global batch (the demos split it over the ranks), then
# tokens/s (GPT) or step time (CNN), the speed-up of 2 GPUs over 1 and the final loss of each run. About
# 3 minutes on two GPUs with the defaults (kernels cached; the first run of a fresh checkout compiles).
#
#   tools/ddp_speedup.sh                         # pydnn, both demos
#   BACKENDS="pydnn torch" tools/ddp_speedup.sh  # PyTorch (cuDNN) too, for its own speed-up
#   DEMOS=gpt GPT_STEPS=500 tools/ddp_speedup.sh
# Logs and the demos' JSON go to $OUT (default ddp_logs/); the table is printed and written to
# $OUT/ddp_speedup.md.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-ddp_logs}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
BACKENDS=${BACKENDS:-pydnn}
DEMOS=${DEMOS:-gpt cnn}
GPT_STEPS=${GPT_STEPS:-300}
CNN_EPOCHS=${CNN_EPOCHS:-10}
ngpu=$(python3 -c "import torch; print(torch.cuda.device_count())")
if [ "$ngpu" -lt 2 ]; then
  echo "ddp_speedup.sh: needs 2 GPUs ($ngpu visible)"; exit 1
fi
status=0
for demo in $DEMOS; do
  for b in $BACKENDS; do
    for n in 1 2; do
      if [ "$demo" = gpt ]; then
        args=(examples/train_gpt.py --backend "$b" --steps "$GPT_STEPS" --eval-every 100 --plot "")
      else
        args=(examples/train_cnn.py --backend "$b" --epochs "$CNN_EPOCHS" --plot "")
      fi
      echo "== $demo $b on $n GPU(s): torchrun --nproc_per_node=$n ${args[*]}"
      start=$(date +%s)
      python3 -m torch.distributed.run --standalone --nproc_per_node="$n" "${args[@]}" \
        --json "$out/${demo}_${b}_${n}.json" >"$out/${demo}_${b}_${n}.log" 2>&1 || {
        echo "   FAILED (see $out/${demo}_${b}_${n}.log)"; tail -20 "$out/${demo}_${b}_${n}.log"; status=1; }
      echo "   $(($(date +%s) - start)) s; $(grep -E 'tokens/s|step time|final' "$out/${demo}_${b}_${n}.log" | tail -1)"
    done
  done
done
python3 - "$out" "$DEMOS" "$BACKENDS" <<'PY'
import json, os, sys
out, demos, backends = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
rows = ["| demo | backend | 1 GPU | 2 GPUs | speed-up | final loss 1 GPU | final loss 2 GPUs | loss difference |",
        "|---|---|---|---|---|---|---|---|"]
for demo in demos:
    for b in backends:
        r = {}
        for n in (1, 2):
            p = os.path.join(out, f"{demo}_{b}_{n}.json")
            if os.path.exists(p):
                with open(p) as fh:
                    r[n] = json.load(fh)[b]
        if len(r) < 2:
            rows.append(f"| {demo} | {b} | {'ok' if 1 in r else 'failed'} | {'ok' if 2 in r else 'failed'} | | | | |")
            continue
        if demo == "gpt":
            v1, v2 = r[1]["tokens_per_s"], r[2]["tokens_per_s"]
            c1, c2, sp = f"{v1 / 1e6:.3f} M tokens/s", f"{v2 / 1e6:.3f} M tokens/s", v2 / v1
        else:
            v1, v2 = r[1]["step_ms"], r[2]["step_ms"]
            c1, c2, sp = f"{v1:.3f} ms/step", f"{v2:.3f} ms/step", v1 / v2
        l1, l2 = r[1]["final_train_loss"], r[2]["final_train_loss"]
        rows.append(f"| {demo} | {b} | {c1} | {c2} | {sp:.2f}x | {l1:.4f} | {l2:.4f} | {100 * (l2 - l1) / l1:+.2f}% |")
text = "\n".join(rows)
print("\n" + text)
import torch
dev = torch.cuda.get_device_name(0)
with open(os.path.join(out, "ddp_speedup.md"), "w") as fh:
    fh.write(f"Data-parallel speed-up on {torch.cuda.device_count()} x {dev} (same global batch; GPT: global "
             f"tokens/s of the median step; CNN: median step time)\n\n{text}\n")
# One figure per demo: the training loss of the 1-GPU and the 2-GPU run (same global batch) on one axis, and
# the throughput of each, so the README can show that the curves match and what the second GPU buys.
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    plt = None
for demo in demos if plt else ():
    runs = {}
    for b in backends:
        for n in (1, 2):
            p = os.path.join(out, f"{demo}_{b}_{n}.json")
            if os.path.exists(p):
                with open(p) as fh:
                    runs[(b, n)] = json.load(fh)[b]
    if not runs:
        continue
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    for (b, n), r in sorted(runs.items()):
        c = r["curve"]
        x = c.get("step") or list(range(1, len(c["loss"]) + 1))
        ax.plot(x, c["loss"], label=f"{b}, {n} GPU{'s' if n > 1 else ''}")
    ax.set_xlabel("step" if demo == "gpt" else "epoch"); ax.set_ylabel("training loss"); ax.legend()
    ax.set_title(f"{demo}: loss, same global batch")
    labels = [f"{b}\n{n} GPU{'s' if n > 1 else ''}" for (b, n) in sorted(runs)]
    if demo == "gpt":
        vals = [runs[k]["tokens_per_s"] / 1e6 for k in sorted(runs)]; bx.set_ylabel("M tokens/s")
    else:
        vals = [1e3 / runs[k]["step_ms"] for k in sorted(runs)]; bx.set_ylabel("steps/s")
    bx.bar(labels, vals, color="tab:blue"); bx.set_title(f"{demo}: throughput on {dev}")
    fig.tight_layout(); fig.savefig(os.path.join(out, f"ddp_{demo}.png"), dpi=110); plt.close(fig)
    print(f"plot: {os.path.join(out, f'ddp_{demo}.png')}")
PY
exit $status
