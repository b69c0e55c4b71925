"""The attention backward's warp-specialized variants side by side (tools/bench_attention.py bwd_ab with a
chosen variant list), cuDNN SDPA in the same run:

  python3 tools/bench_attention_bwd.py [--shapes 4x4096x32x32x128,...] [--variants bulk,bulk+ord,...]
                                       [--det 0] [--reps N] [--out FILE]

A variant is a WS_DQ mode ("bulk", "bulkw", "bulkwpp", "red", "redpp"; WS_DQ_CAUSAL off)
with optional "+ord" (tuning.attention_bwd.WS_ORDER: the longest-walk-first 1-d grid) and "+3st" (WS_STAGES 3
where instantiated, d 128 bulk / bulkw), or "old" (the older wgmma kernel), or "default" (tuning's defaults). TFLOP/s count 2.5x the forward's
FLOPs (half under the causal mask)."""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_attention as BA  # noqa: E402


def overrides(name):
    if name == "old":
        return {"attention_bwd.WS": False}
    if name == "default":  # the warp-specialized kernel with tuning's defaults
        return {"attention_bwd.WS": True}
    mode, *opts = name.split("+")
    over = {"attention_bwd.WS": True, "attention_bwd.WS_DQ": mode, "attention_bwd.WS_DQ_CAUSAL": None,
            "attention_bwd.WS_ORDER": "ord" in opts,
            "attention_bwd.WS_STAGES": 3 if "3st" in opts else 2}
    unknown = set(opts) - {"ord", "3st"}
    if unknown:
        raise SystemExit(f"unknown variant options {unknown}")
    return over


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="4x4096x32x32x128,4x4096x32x32x64,4x4096x64x8x128")
    ap.add_argument("--variants", default="bulk,default")  # (session 28's default against this one's)
    ap.add_argument("--det", default="0")
    ap.add_argument("--reps", type=int)
    ap.add_argument("--out")
    a = ap.parse_args()
    shapes = [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",")]
    variants = tuple((v, overrides(v)) for v in a.variants.split(","))
    for det in (int(x) for x in a.det.split(",")):
        out = a.out and (a.out if det == 0 else a.out.replace(".md", f"_det{det}.md"))
        BA.bwd_ab(out=out, shapes=shapes, reps=a.reps, det=det, variants=variants)


if __name__ == "__main__":
    main()
