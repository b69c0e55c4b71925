#!/usr/bin/env python3
"""PNG charts of a tools/bench.py run: pydnn against cuDNN / PyTorch per family.

    python tools/bench.py --families ... --out results/bench.md --plot    (charts next to bench.md)
    python tools/bench_plot.py results/bench.json [--dir DIR]             (again, from the saved rows)

One chart per family (`<stem>_<family>.png`), one row per case (case and dtype): on the left pydnn's speed
over PyTorch's (time of PyTorch / time of pydnn; the line at 1 is parity, right of it pydnn is faster), on
the right how close each gets to the hardware's limit: bandwidth over a device-to-device copy's measured in
the same run for the memory-bound cases, TFLOP/s over the dtype's dense peak for the compute-bound ones
(the line at 100%). Plus `<stem>_summary.png`: each family's geometric mean of the speed ratio and the
range of its cases. matplotlib with the Agg backend (no display needed).
"""
import argparse
import json
import math
import os
import re
from collections import OrderedDict


def _finite(x):
    return isinstance(x, (int, float)) and math.isfinite(x)


def _limit(r, copy_gbs):
    """(pydnn's, PyTorch's) fraction of the hardware limit in percent, nan where unknown."""
    if "pydnn_tflops" in r:
        p = r.get("pct_peak", float("nan"))
        t = p * r["torch_tflops"] / r["pydnn_tflops"] if _finite(p) and r.get("pydnn_tflops") else float("nan")
        return p, t
    p = r.get("pct_copy", float("nan"))
    t = 100 * r["torch_gbs"] / copy_gbs if copy_gbs and _finite(r.get("torch_gbs")) else float("nan")
    return p, t


def by_family(rows):
    fams = OrderedDict()
    for r in rows:
        if _finite(r.get("ratio")):
            fams.setdefault(r["family"], []).append(r)
    return fams


def _slug(name):
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "family"


def plot(rows, copy_gbs, out_dir, stem="bench", device=""):
    """Write the charts; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir or ".", exist_ok=True)
    paths = []
    fams = by_family(rows)
    for fam, rs in fams.items():
        labels = [f"{r['case']} {r['dtype']}" for r in rs]
        ratios = [r["ratio"] for r in rs]
        lim = [_limit(r, copy_gbs) for r in rs]
        compute = all("pydnn_tflops" in r for r in rs)
        h = max(2.5, 0.32 * len(rs) + 1.4)
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, h), sharey=True, gridspec_kw={"width_ratios": [1, 1]})
        y = list(range(len(rs)))
        colors = ["#2a9d8f" if q >= 1 else "#e76f51" for q in ratios]
        a1.barh(y, ratios, color=colors)
        a1.axvline(1.0, color="black", lw=1)
        a1.set_yticks(y)
        a1.set_yticklabels(labels, fontsize=8)
        a1.invert_yaxis()
        a1.set_xlabel("pydnn speed / PyTorch (>1: pydnn faster)")
        for yi, q in zip(y, ratios):
            a1.text(q, yi, f" {q:.2f}x", va="center", fontsize=7)
        a1.set_xlim(0, max(1.2, max(ratios) * 1.18))
        w = 0.38
        pp = [p if _finite(p) else 0 for p, _ in lim]
        tt = [t if _finite(t) else 0 for _, t in lim]
        a2.barh([v - w / 2 for v in y], pp, height=w, color="#264653", label="pydnn")
        a2.barh([v + w / 2 for v in y], tt, height=w, color="#e9c46a", label="PyTorch")
        a2.axvline(100, color="black", lw=1, ls="--")
        a2.set_xlabel("% of the hardware limit (" + ("dense peak TFLOP/s" if compute else
                      "device-to-device copy bandwidth") + ")")
        a2.set_xlim(0, max(110, max(pp + tt + [0]) * 1.1))
        a2.legend(loc="lower right", fontsize=7)
        fig.suptitle(f"{fam}: pydnn vs PyTorch" + (f" ({device})" if device else ""), fontsize=10)
        fig.tight_layout()
        path = os.path.join(out_dir, f"{stem}_{_slug(fam)}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    if fams:
        names = list(fams)
        gm = [math.exp(sum(math.log(r["ratio"]) for r in rs if r["ratio"] > 0) / max(1, sum(r["ratio"] > 0 for r in rs)))
              for rs in fams.values()]
        lo = [min(r["ratio"] for r in rs) for rs in fams.values()]
        hi = [max(r["ratio"] for r in rs) for rs in fams.values()]
        fig, ax = plt.subplots(figsize=(9, max(2.5, 0.4 * len(names) + 1.2)))
        y = list(range(len(names)))
        ax.barh(y, gm, color=["#2a9d8f" if g >= 1 else "#e76f51" for g in gm])
        ax.errorbar(gm, y, xerr=[[g - a for g, a in zip(gm, lo)], [b - g for g, b in zip(gm, hi)]], fmt="none",
                    ecolor="black", capsize=3, lw=1)
        ax.axvline(1.0, color="black", lw=1)
        ax.set_yticks(y)
        ax.set_yticklabels(names)
        ax.invert_yaxis()
        ax.set_xlabel("pydnn speed / PyTorch: geometric mean of the family's cases (bars: min to max)")
        ax.set_title("pydnn vs PyTorch per family" + (f" ({device})" if device else ""), fontsize=10)
        fig.tight_layout()
        path = os.path.join(out_dir, f"{stem}_summary.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def save_rows(path, rows, copy_gbs, device=""):
    with open(path, "w") as f:
        json.dump({"device": device, "copy_gbs": copy_gbs, "rows": rows}, f, indent=1, default=float)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", help="the rows tools/bench.py --plot saved (<stem>.json)")
    ap.add_argument("--dir", default=None, help="where the PNGs go (default: beside the JSON)")
    args = ap.parse_args(argv)
    with open(args.json) as f:
        data = json.load(f)
    stem = os.path.splitext(os.path.basename(args.json))[0]
    for p in plot(data["rows"], data.get("copy_gbs"), args.dir or os.path.dirname(args.json) or ".", stem,
                  data.get("device", "")):
        print(p)


if __name__ == "__main__":
    main()
