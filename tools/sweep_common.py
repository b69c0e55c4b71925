"""Shared parts of the sweep benchmarks (tools/sweep_conv.py, sweep_attention.py, sweep_memory.py).

Everything here but `gpu_timer` runs without a GPU (tests/hard/test_sweeps_cpu.py): the command line,
the time budget, result rows, summaries (geometric mean, minimum, counts below a threshold), the
markdown table, the JSON of raw results and the PNG of ratios sorted per group.

A result row is a dict with at least `group` (a direction or family: what a summary and a plot panel
gather), `case` (the shape, as text), `dtype`, `status` and, for an OK row, `ms_pydnn`, `ms_ref` and
`ratio` (ms_ref / ms_pydnn: above 1 pydnn is faster). Status is one of OK, NOT_SUPPORTED (pydnn or the
reference refused the configuration), OOM (a buffer did not fit), ERROR (anything else: the message is in
`note`); a sweep never stops on one point.

Timing (gpu_timer) is tools/bench.py's time_ms: CUDA events on the current stream around back-to-back
calls after warm-up, median of the repetitions.
"""
import argparse
import json
import math
import os
import struct
import sys
import time
import zlib

OK, NOT_SUPPORTED, OOM, ERROR = "OK", "NOT_SUPPORTED", "OOM", "ERROR"
DEV = "cuda"  # where the sweeps allocate (tests/hard/test_sweeps_cpu.py's dry run sets "cpu")


# ----------------------------------------------------------------------------------- command line
def parse_args(description, full_budget_s, argv=None, extra=()):
    """The common options; `extra`: (flag, argparse keywords) pairs of a tool's own."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a small subset (<= 45 s on one GPU)")
    p.add_argument("--budget-s", type=float, default=None,
                   help=f"stop sampling new points after this many seconds (default {full_budget_s:.0f}, "
                        "quick 30)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampled grid (default 0)")
    p.add_argument("--out", default=None, help="folder for sweep.md, sweep.json and the PNGs")
    p.add_argument("--reps", type=int, default=None, help="timed repetitions per side (default per tool)")
    p.add_argument("--only", default="", help="comma-separated parts to run (sweep_conv: issue, random, resnet50, "
                   "resnext50, unet, fused; sweep_attention: train, decode; sweep_memory: family names)")
    p.add_argument("--render", default=None, metavar="JSON",
                   help="no GPU: rewrite the markdown and PNGs from a JSON this tool wrote (into --out, default "
                        "the JSON's folder; a .partial.json of a run cut short works too)")
    for flag, kw in extra:
        p.add_argument(flag, **kw)
    a = p.parse_args(argv)
    if a.budget_s is None:
        a.budget_s = 30.0 if a.quick else full_budget_s
    return a


class Budget:
    """Wall-clock budget of a sweep: points are sampled while `left() > 0`; what was not sampled is counted
    and said in the summary."""

    def __init__(self, seconds, clock=time.monotonic):
        self.seconds = float(seconds)
        self.clock = clock
        self.t0 = clock()
        self.skipped = 0       # points of the grid not sampled because the budget was spent
        self.stopped_at = None  # elapsed seconds when the first point was skipped

    def elapsed(self):
        return self.clock() - self.t0

    def left(self):
        return self.seconds - self.elapsed()

    def take(self):
        """True when one more point may be sampled; otherwise counts it as skipped."""
        if self.left() > 0:
            return True
        if self.stopped_at is None:
            self.stopped_at = self.elapsed()
        self.skipped += 1
        return False

    def note(self):
        if not self.skipped:
            return f"every point of the grid sampled in {self.elapsed():.1f} s (budget {self.seconds:.0f} s)"
        return (f"BUDGET SPENT: {self.skipped} point(s) of the grid not sampled (budget {self.seconds:.0f} s "
                f"spent at {self.stopped_at:.1f} s; run with a larger --budget-s to sample them)")


# ----------------------------------------------------------------------------------- statistics
def geomean(values):
    v = [x for x in values if x is not None and x > 0 and math.isfinite(x)]
    if not v:
        return float("nan")
    return math.exp(sum(math.log(x) for x in v) / len(v))


def ok_rows(rows, group=None, pred=None):
    return [r for r in rows if r.get("status") == OK and r.get("ratio") is not None
            and math.isfinite(r["ratio"]) and (group is None or r["group"] == group)
            and (pred is None or pred(r))]


def summarize(rows, key="ratio", below=1.0, pred=None):
    """{n, geomean, min, min_case, below: count under `below`, statuses: {status: count}} over the OK rows
    (of `pred`)."""
    sel = [r for r in rows if pred is None or pred(r)]
    oks = [r for r in ok_rows(sel) if r.get(key) is not None and math.isfinite(r[key])]
    statuses = {}
    for r in sel:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    out = dict(n=len(oks), geomean=geomean([r[key] for r in oks]), statuses=statuses, below=0,
               min=float("nan"), min_case="-")
    if oks:
        worst = min(oks, key=lambda r: r[key])
        out.update(min=worst[key], min_case=f"{worst['group']} {worst['case']} {worst.get('dtype', '')}".strip(),
                   below=sum(1 for r in oks if r[key] < below))
    return out


def groups_of(rows):
    seen = []
    for r in rows:
        if r["group"] not in seen:
            seen.append(r["group"])
    return seen


# ----------------------------------------------------------------------------------- output
def fmt(v, spec=".3f"):
    if v is None:
        return "-"
    if isinstance(v, float):
        if not math.isfinite(v):
            return "-"
        return format(v, spec)
    return str(v)


def markdown_table(rows, columns):
    """columns: [(header, key or callable(row), format spec)]."""
    head = "| " + " | ".join(c[0] for c in columns) + " |"
    sep = "|" + "|".join("---" if i < 3 else "---:" for i in range(len(columns))) + "|"
    lines = [head, sep]
    for r in rows:
        cells = []
        for _, k, spec in columns:
            v = k(r) if callable(k) else r.get(k)
            cells.append(fmt(v, spec) if spec else ("-" if v is None else str(v)))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def checks_lines(checks):
    """The report's line of correctness spot checks ({direction: {case, err, ok}}), or none."""
    if not checks:
        return []
    return ["", "Correctness spot checks (pydnn vs PyTorch, max error / max |ref|, tolerance 2e-2): "
            + "; ".join(f"{d}: {c['case']} {c['err']:.2e} {'ok' if c['ok'] else 'FAILED'}" for d, c in checks.items())]


def finish(out_dir, name, rows, meta, budget, t0, render, plots, written_rows=None):
    """A sweep's end: the budget note (and where a lost CUDA context stopped it) into meta, the report
    render(note, elapsed) printed up to its table of every point, the outputs written (written_rows, default
    rows), one closing line. Returns rows."""
    elapsed = time.monotonic() - t0
    note = budget.note() + (f"; CUDA CONTEXT LOST, the sweep stopped at: {meta['context_lost']}"
                            if meta.get("context_lost") else "")
    meta.update(elapsed_s=elapsed, budget_note=note)
    md = render(note, elapsed)
    print(md.split("## Every point")[0])
    write_outputs(out_dir, name, md, rows if written_rows is None else written_rows, meta, plots(rows))
    print(f"{name}: {len(rows)} rows, elapsed {elapsed:.1f} s", flush=True)
    return rows


def write_outputs(out_dir, name, md, rows, meta, plots):
    """<name>.md, <name>.json (meta + rows) and the PNGs ({file name: (title, {panel: ratios}, lines[,
    force_builtin])})."""
    if not out_dir:
        return []
    os.makedirs(out_dir, exist_ok=True)
    written = []
    p = os.path.join(out_dir, f"{name}.md")
    with open(p, "w") as f:
        f.write(md)
    written.append(p)
    p = os.path.join(out_dir, f"{name}.json")
    with open(p, "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1, default=_json_default)
    written.append(p)
    partial = os.path.join(out_dir, f"{name}.partial.json")
    if os.path.exists(partial) and os.path.abspath(partial) != os.path.abspath(meta.get("rendered_from", "")):
        os.remove(partial)  # the run finished: its complete JSON replaces the partial one
    for fname, (title, panels, lines, *builtin) in plots.items():
        p = os.path.join(out_dir, fname)
        plot_sorted(p, title, panels, lines, force_builtin=bool(builtin and builtin[0]))
        written.append(p)
    return written


_last_partial = {}


def write_partial(out_dir, name, rows, meta, every_s=2.0):
    """The JSON so far (called after every point, written at most every `every_s` seconds): a sweep cut
    short by a timeout still leaves its rows."""
    if not out_dir:
        return
    now = time.monotonic()
    if now - _last_partial.get(name, -1e9) < every_s:
        return
    _last_partial[name] = now
    os.makedirs(out_dir, exist_ok=True)
    tmp = os.path.join(out_dir, f".{name}.json.tmp")
    with open(tmp, "w") as f:
        json.dump(dict(meta=dict(meta, partial=True), rows=rows), f, default=_json_default)
    os.replace(tmp, os.path.join(out_dir, f"{name}.partial.json"))


def load(path):
    """(rows, meta) of a JSON written by write_outputs or write_partial."""
    with open(path) as f:
        data = json.load(f)
    rows = data["rows"]
    for r in rows:  # JSON null back to NaN where a float was not finite
        for k, v in r.items():
            if v is None and k.startswith(("ms_", "ratio", "tflops", "pct_", "us_", "gbs")):
                r[k] = float("nan")
    return rows, data.get("meta", {})


def render(args, name, report_fn, plots_fn):
    """--render: the tool's report and plots from its saved JSON, without a GPU. Returns the rows."""
    rows, meta = load(args.render)
    meta["rendered_from"] = os.path.abspath(args.render)
    out = args.out or os.path.dirname(os.path.abspath(args.render))
    md = report_fn(rows, meta)
    write_outputs(out, name, md, rows, meta, plots_fn(rows))
    print(md.split("## Every point")[0])
    return rows


def _json_default(o):
    if isinstance(o, float) and not math.isfinite(o):
        return None
    return str(o)


# ----------------------------------------------------------------------------------- PNG
def plot_sorted(path, title, panels, lines=(1.0,), force_builtin=False):
    """One panel per group: the OK ratios sorted ascending as bars on a log2 axis (1/8x .. 8x, clipped),
    with horizontal lines at `lines` (1.0 red, others grey). matplotlib when it imports (and not
    force_builtin); otherwise a built-in rasterizer (no text but the tick labels)."""
    panels = {k: sorted(v) for k, v in panels.items()}
    if not force_builtin:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
            import matplotlib.ticker  # noqa: F401 - (matplotlib.ticker below)
        except Exception:  # noqa: BLE001 - no matplotlib on the GPU machine: the built-in writer
            plt = None
        if plt is not None:
            n = max(1, len(panels))
            fig, axes = plt.subplots(n, 1, figsize=(10, 2.6 * n), squeeze=False)
            for ax, (name, vals) in zip(axes[:, 0], panels.items()):
                xs = range(len(vals))
                ax.bar(xs, [v - 1.0 for v in vals], bottom=1.0, width=1.0,  # from 1x to the value
                       color=["#c0392b" if v < 1.0 else "#2e86c1" for v in vals])
                for y in lines:
                    ax.axhline(y, color="red" if y == 1.0 else "grey", lw=1, ls="-" if y == 1.0 else "--")
                ax.set_yscale("log", base=2)
                if vals:  # at least 1/2x .. 2x in view, whatever the points
                    ax.set_ylim(min(0.5, min(vals) / 1.1), max(2.0, max(vals) * 1.1))
                ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}x"))
                ax.set_ylabel("pydnn speed / ref")
                g = geomean(vals)
                ax.set_title(f"{name}: {len(vals)} points, geomean {fmt(g, '.2f')}x, "
                             f"min {fmt(min(vals) if vals else float('nan'), '.2f')}x", fontsize=9)
                ax.set_xlim(-0.5, max(len(vals), 1) - 0.5)
            fig.suptitle(title, fontsize=10)
            fig.tight_layout()
            fig.savefig(path, dpi=80)
            plt.close(fig)
            return path
    _plot_builtin(path, panels, lines)
    return path


_FONT = {  # 3x5 glyphs (rows top to bottom) for the built-in writer's labels; letters drawn upper case
    "0": "111101101101111", "1": "010110010010111", "2": "111001111100111", "3": "111001111001111",
    "4": "101101111001001", "5": "111100111001111", "6": "111100111101111", "7": "111001001001001",
    "8": "111101111101111", "9": "111101111001111", ".": "000000000000010", "/": "001001010100100",
    "x": "000101010101000", ":": "000010000010000", "-": "000000111000000", ",": "000000000010100",
    "(": "010100100100010", ")": "010001001001010", "%": "101001010100101", "=": "000111000111000",
    "<": "001010100010001", ">": "100010001010100", "+": "000010111010000", "_": "000000000000111",
    "A": "010101111101101", "B": "110101110101110", "C": "011100100100011", "D": "110101101101110",
    "E": "111100110100111", "F": "111100110100100", "G": "011100101101011", "H": "101101111101101",
    "I": "111010010010111", "J": "001001001101010", "K": "101101110101101", "L": "100100100100111",
    "M": "101111111101101", "N": "110101101101101", "O": "010101101101010", "P": "110101110100100",
    "Q": "010101101110011", "R": "110101110101101", "S": "011100010001110", "T": "111010010010010",
    "U": "101101101101111", "V": "101101101101010", "W": "101101111111101", "X": "101101010101101",
    "Y": "101101010010010", "Z": "111001010100111",
}


def _plot_builtin(path, panels, lines):
    W, PH, L, T = 900, 220, 40, 10
    H = max(1, len(panels)) * PH
    img = bytearray(b"\xff" * (W * H * 3))

    def px(x, y, c):
        if 0 <= x < W and 0 <= y < H:
            i = (y * W + x) * 3
            img[i:i + 3] = bytes(c)

    def rect(x0, y0, x1, y1, c):
        x0, x1 = max(0, x0), min(W, x1)
        if x1 <= x0:
            return
        line = bytes(c) * (x1 - x0)
        for y in range(max(0, y0), min(H, y1)):
            row = (y * W) * 3
            img[row + 3 * x0:row + 3 * x1] = line

    def text(x, y, s, c=(0, 0, 0)):
        for ch in s:
            g = _FONT.get(ch) or _FONT.get(ch.upper())
            if g:
                for i, b in enumerate(g):
                    if b == "1":
                        r, k = divmod(i, 3)
                        rect(x + 2 * k, y + 2 * r, x + 2 * k + 2, y + 2 * r + 2, c)
            x += 8

    lo, hi = -3.0, 3.0  # log2 of 1/8x .. 8x
    for p, (name, vals) in enumerate(panels.items()):
        top = p * PH + T + 14
        ph = PH - 2 * T - 14
        label = (f"{name}: {len(vals)} points, geomean {fmt(geomean(vals), '.2f')}x, "
                 f"min {fmt(min(vals) if vals else float('nan'), '.2f')}x")
        text(L, p * PH + 6, label)
        yof = lambda r: top + int((hi - max(lo, min(hi, math.log2(r)))) / (hi - lo) * ph)  # noqa: E731
        rect(L, top, L + 1, top + ph, (0, 0, 0))
        for t in (0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0):
            y = yof(t)
            rect(L - 4, y, L, y + 1, (0, 0, 0))
            text(2, y - 4, ("1/" + str(int(1 / t))) if t < 1 else f"{int(t)}x")
        n = len(vals)
        if n:
            bw = (W - L - 10) / n
            y1 = yof(1.0)
            for i, v in enumerate(vals):
                x0, x1 = L + 1 + int(i * bw), L + 1 + max(int((i + 1) * bw) - (1 if bw > 3 else 0), int(i * bw) + 1)
                yv = yof(v) if v > 0 else top + ph
                c = (192, 57, 43) if v < 1.0 else (46, 134, 193)
                rect(x0, min(yv, y1), x1, max(yv, y1) + 1, c)
        for ln in lines:
            y = yof(ln)
            for x in range(L, W - 10, 1 if ln == 1.0 else 4):
                px(x, y, (255, 0, 0) if ln == 1.0 else (120, 120, 120))
    raw = b"".join(b"\x00" + bytes(img[y * W * 3:(y + 1) * W * 3]) for y in range(H))

    def chunk(tag, data):
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", W, H, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))
    with open(path, "wb") as f:
        f.write(png)


# ----------------------------------------------------------------------------------- GPU side
def gpu_timer(reps, warmup, slow_ms=50.0):
    """time_ms of tools/bench.py with these repetitions (imported here: bench.py needs torch and pydnn).
    One call is timed first: a call slower than `slow_ms` (a fallback kernel on a large shape) gets a third
    of the repetitions and no warm-up beyond that call, so that one shape cannot spend the budget."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch
    from bench import time_ms

    def one(fn):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        return a.elapsed_time(b)

    def timer(fn, reps=reps, warmup=warmup):
        # (a first call may be slow for its own reasons: cuDNN's benchmark mode tries algorithms on it)
        if one(fn) > slow_ms and one(fn) > slow_ms:
            return time_ms(fn, reps=max(2, reps // 3), warmup=0)
        return time_ms(fn, reps=reps, warmup=warmup)

    return timer


def graph_ms_fit(h, fn, reps, work_ms=2.0):
    """graph_ms with about work_ms of calls a replay (a one-call graph first says how long a call is; 1-20 calls)."""
    one = graph_ms(h, fn, calls=1, reps=1)
    return graph_ms(h, fn, calls=max(1, min(20, int(work_ms / max(one, 1e-3)))), reps=reps)


def graph_ms(h, fn, calls=20, reps=10):
    """Device milliseconds per call of `fn`, from a CUDA graph of `calls` back-to-back calls replayed `reps`
    times between events (median): the host's per-call cost, which time_ms includes when a kernel is
    shorter than its launch, drops out. pydnn's handle is pointed at the capture stream for the capture
    and back at PyTorch's current stream after. Raises what the capture raises (the caller gives up on
    graph timing then)."""
    import statistics

    import torch
    import pydnn

    main = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    side.wait_stream(main)
    try:
        with torch.cuda.stream(side):  # a warm call on a side stream first, as torch.cuda.graph asks
            pydnn.set_stream(h, side.cuda_stream)
            fn()
        main.wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            pydnn.set_stream(h, torch.cuda.current_stream().cuda_stream)
            for _ in range(calls):
                fn()
    finally:
        pydnn.set_stream(h, main.cuda_stream)
    g.replay()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for a, b in ev:
        a.record()
        g.replay()
        b.record()
    torch.cuda.synchronize()
    ms = statistics.median(a.elapsed_time(b) for a, b in ev) / calls
    del g
    return ms


def classify(exc):
    """(status, note) of an exception raised while setting up or running a point."""
    name = type(exc).__name__
    msg = str(exc).splitlines()[0][:200] if str(exc) else name
    try:
        import pydnn
        if isinstance(exc, pydnn.PydnnError):
            st = getattr(exc, "status", None)
            if isinstance(st, int) and st // 1000 == pydnn.PYDNN_STATUS_NOT_SUPPORTED // 1000:
                return NOT_SUPPORTED, msg   # NOT_SUPPORTED and its sub-codes (3000..3999, as cuDNN 9)
            if st in (pydnn.PYDNN_STATUS_ALLOC_FAILED, pydnn.PYDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED):
                return OOM, msg
            return ERROR, f"PydnnError {st}: {msg}"
    except ImportError:
        pass
    if "OutOfMemory" in name or "out of memory" in msg.lower():
        return OOM, msg
    if isinstance(exc, NotImplementedError) or "not supported" in msg.lower() or "No available kernel" in msg:
        return NOT_SUPPORTED, msg
    return ERROR, f"{name}: {msg}"


_STICKY = ("illegal memory access", "illegal address", "unspecified launch failure", "misaligned address",
           "ILLEGAL_ADDRESS", "LAUNCH_FAILED", "MISALIGNED_ADDRESS", "illegal instruction", "ILLEGAL_INSTRUCTION")


def sticky(rows):
    """The note of the first row whose error leaves the CUDA context unusable (an illegal address, a launch
    failure): every later point of the process would fail too, so a sweep stops there and says so."""
    for r in rows:
        if r.get("status") == ERROR and any(k in (r.get("note") or "") for k in _STICKY):
            return f"{r['group']} {r['case']}: {r['note']}"
    return None


def device_meta():
    import torch
    import pydnn
    return dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                cudnn=torch.backends.cudnn.version(), pydnn=getattr(pydnn, "__version__", "?"))


def free_bytes(need=0):
    """Free device memory; when `need` is a large part of it, PyTorch's cached blocks are released first
    (the driver counts them as used)."""
    import torch
    if DEV != "cuda":
        return 1 << 36
    free, _ = torch.cuda.mem_get_info()
    if need > free // 4:
        torch.cuda.empty_cache()
        free, _ = torch.cuda.mem_get_info()
    return free


def close_rel(a, b, tol):
    """max |a - b| / max(|b|, tiny) on the GPU, as float; (err, ok)."""
    a, b = a.float(), b.float()
    den = max(b.abs().max().item(), 1e-6)
    err = (a - b).abs().max().item() / den
    return err, err <= tol
