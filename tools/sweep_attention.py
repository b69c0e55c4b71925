#!/usr/bin/env python3
"""Fused attention sweep (issue 19): pydnn against cuDNN SDPA through PyTorch (the backend forced with
torch.nn.attention.sdpa_kernel) in the same run, bf16, BHSD.

    python3 tools/sweep_attention.py [--quick] [--budget-s S] [--seed 0] [--out DIR] [--reps N] [--dirs bwd]
                                     [--only train]

--budget-s defaults to 140 s (30 s with --quick) so that the full sweep ends in about 150 s on an H100 / H200
(the elapsed time is printed at the end, and the summary says whether points were left unsampled).

Grid (grid(); built without a GPU, checked by tests/hard/test_sweeps_cpu.py):
  * training shapes: B * S = 16384 tokens, S in 512 .. 16384 (powers of two), heads Hq / Hkv 32/32, 64/8,
    128/8, head dim 64 / 128 / 256, causal (top left) and not; forward and backward of each. A head dim
    pydnn refuses stays in the grid as a NOT_SUPPORTED row (the refusal is pydnn's own PydnnError).
  * decode: one query row against a KV cache of 4k .. 128k keys, batch 1 .. 64, GQA 32/8 and 64/8 at
    d128 (no mask), against the faster of cuDNN and PyTorch's flash backend. A point whose K + V would
    take more than DECODE_MEM_FRACTION of the free memory is an OOM row (not run).
The points run in a seeded order (the training points shuffled, the decode points interleaved) until
--budget-s is spent; the summary counts what was not sampled. Most of a point's time is PyTorch's first
calls (cuDNN builds its SDPA graphs per shape: ~2 s a training point on the H200 of the mid-session run),
so a full sweep samples part of the grid within its budget.

FLOPs: forward 4 * B * Hq * Sq * Skv * d (half of it when causal), backward 2.5x the forward's (the
convention of tools/bench_attention.py). pydnn's forward writes the log-sum-exp (training form); its
backward runs with deterministic = 0 (dQ by atomics, the default of tools/bench_attention.py's plain rows).
Ratio = reference ms / pydnn ms. Timing: tools/bench.py's time_ms. One forward and one backward point are
checked against PyTorch before timing (bf16 tolerance 2e-2 of the largest |value|).
Targets (issue 19): forward >= 1.0x and backward >= 0.9x cuDNN at d128 (geometric mean), no point below
0.8x; d64 / d256 >= 0.9x; decode >= 0.9x the faster of cuDNN and flash.

Mid-session run (H200, torch 2.11 / cuDNN 9.19, --quick with a 4 s budget: one point): b8 s2048 h32/32 d128
forward 0.66x cuDNN (447 against 677 TFLOP/s), backward 0.57x (307 against 542); spot checks 2.0e-3 / 4.8e-3.
"""
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sweep_common as SC  # noqa: E402

TOKENS = 16384
SEQS = (512, 1024, 2048, 4096, 8192, 16384)
HEADS = ((32, 32), (64, 8), (128, 8))
DIMS = (64, 128, 256)
DECODE_KV = (4096, 16384, 65536, 131072)
DECODE_BATCH = (1, 4, 16, 64)
DECODE_HEADS = ((32, 8), (64, 8))
DECODE_D = 128
DECODE_MEM_FRACTION = 0.4


def train_points():
    return [dict(kind="train", b=TOKENS // s, s=s, hq=hq, hkv=hkv, d=d, causal=causal)
            for s in SEQS for hq, hkv in HEADS for d in DIMS for causal in (False, True)]


def decode_points():
    return [dict(kind="decode", b=b, s=1, skv=kv, hq=hq, hkv=hkv, d=DECODE_D, causal=False)
            for kv in DECODE_KV for b in DECODE_BATCH for hq, hkv in DECODE_HEADS]


def grid(seed=0, quick=False):
    """(points in run order, meta). A training point is run forward then backward."""
    rng = random.Random(seed)
    tr, de = train_points(), decode_points()
    if quick:
        want = [dict(kind="train", b=8, s=2048, hq=32, hkv=32, d=128, causal=False),
                dict(kind="train", b=4, s=4096, hq=64, hkv=8, d=128, causal=True),
                dict(kind="train", b=16, s=1024, hq=32, hkv=32, d=64, causal=False),
                dict(kind="train", b=8, s=2048, hq=32, hkv=32, d=256, causal=False),
                dict(kind="decode", b=4, s=1, skv=16384, hq=32, hkv=8, d=128, causal=False),
                dict(kind="decode", b=16, s=1, skv=65536, hq=64, hkv=8, d=128, causal=False)]
        return want, dict(seed=seed, grid_train=len(tr), grid_decode=len(de))
    order = list(tr)  # a seeded shuffle of every length: a budget that runs out leaves a sample of the grid
    rng.shuffle(order)
    rng.shuffle(de)
    # interleave: one decode point after every len(tr) // len(de) training points
    step = max(1, len(order) // max(1, len(de)))
    out = []
    for i, p in enumerate(order):
        out.append(p)
        if i % step == step - 1 and de:
            out.append(de.pop(0))
    out += de
    return out, dict(seed=seed, grid_train=len(tr), grid_decode=len(decode_points()))


def flops(p, backward=False):
    skv = p.get("skv", p["s"])
    f = 4 * p["b"] * p["hq"] * p["s"] * skv * p["d"] * (0.5 if p["causal"] else 1.0)
    return 2.5 * f if backward else f


def kv_bytes(p):
    return 2 * p["b"] * p["hkv"] * p.get("skv", p["s"]) * p["d"] * 2


def case_name(p):
    if p["kind"] == "decode":
        return f"decode b{p['b']} kv{p['skv']} h{p['hq']}/{p['hkv']} d{p['d']}"
    return f"b{p['b']} s{p['s']} h{p['hq']}/{p['hkv']} d{p['d']}{' causal' if p['causal'] else ''}"


# ----------------------------------------------------------------------------------- GPU part
def _desc(t, dtype):
    import pydnn
    d = pydnn.create_tensor_descriptor()
    pydnn.set_tensor_nd_descriptor(d, dtype, 4, list(t.shape), list(t.stride()))
    return d


def _backend(name):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel({"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[name])


def _torch_fns(backend, q, k, v, causal, do):
    """(forward fn, backward fn or None) through F.scaled_dot_product_attention; call them inside
    _backend(backend) (entered once around the timing, not per call: its host cost would count against
    PyTorch on the microsecond decode points)."""
    import torch
    import torch.nn.functional as F

    gqa = q.shape[1] != k.shape[1]

    def fwd():
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)

    if do is None:
        return fwd, None
    qq, kk, vv = (x.detach().requires_grad_() for x in (q, k, v))
    with _backend(backend):
        o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal, enable_gqa=gqa)
    return fwd, (lambda: torch.autograd.grad(o, (qq, kk, vv), do, retain_graph=True))


def _torch_out(backend, q, k, v, causal, do):
    """PyTorch's O (do None) or dQ through one backend."""
    f, b = _torch_fns(backend, q, k, v, causal, do)
    with _backend(backend):
        return f() if do is None else b()[0]


def _ref_ms(timer, backend, q, k, v, causal, do, backward):
    """(ms, note): None and the reason when the backend refuses the configuration."""
    try:
        f, b = _torch_fns(backend, q, k, v, causal, do if backward else None)
        with _backend(backend):
            return timer(b if backward else f), ""
    except Exception as e:  # noqa: BLE001 - a backend may refuse (GQA, head dim, one query row)
        return None, f"{backend}: {SC.classify(e)[1][:80]}"


def run_point(h, p, timer, checked, rows, dirs=("fwd", "bwd")):
    """One point; dirs: the training directions timed (--dirs; "bwd" alone still runs pydnn's forward, untimed, for
    the backward's O and log-sum-exp)."""
    import torch
    import pydnn

    base = dict(case=case_name(p), dtype="bf16", kind=p["kind"], b=p["b"], s=p["s"], skv=p.get("skv", p["s"]),
                hq=p["hq"], hkv=p["hkv"], d=p["d"], causal=p["causal"])
    fwd_untimed = p["kind"] != "decode" and "fwd" not in dirs
    dirs = ("decode",) if p["kind"] == "decode" else tuple(x for x in ("fwd", "bwd") if x in dirs)
    if p["kind"] == "decode" and kv_bytes(p) > DECODE_MEM_FRACTION * SC.free_bytes(3 * kv_bytes(p)):
        for d in dirs:
            rows.append(dict(base, group=d, status=SC.OOM,
                             note=f"K + V {kv_bytes(p) / 2**30:.1f} GiB > {DECODE_MEM_FRACTION} of free memory"))
        return
    t = {}
    try:
        bf = torch.bfloat16
        skv = p.get("skv", p["s"])
        t["q"] = torch.randn(p["b"], p["hq"], p["s"], p["d"], dtype=bf, device=SC.DEV)
        t["k"] = torch.randn(p["b"], p["hkv"], skv, p["d"], dtype=bf, device=SC.DEV)
        t["v"] = torch.randn(p["b"], p["hkv"], skv, p["d"], dtype=bf, device=SC.DEV)
        t["o"] = torch.empty_like(t["q"])
        t["lse"] = torch.empty(p["b"], p["hq"], p["s"], 1, dtype=torch.float32, device=SC.DEV)
        if p["kind"] != "decode":
            t["do"] = torch.randn_like(t["q"])
            t["dq"], t["dk"], t["dv"] = torch.empty_like(t["q"]), torch.empty_like(t["k"]), torch.empty_like(t["v"])
    except Exception as e:  # noqa: BLE001
        st, note = SC.classify(e)
        for d in dirs:
            rows.append(dict(base, group=d, status=st, note=note))
        t.clear()
        torch.cuda.empty_cache()
        return
    q, k, v, o, lse = t["q"], t["k"], t["v"], t["o"], t["lse"]
    bfp = pydnn.PYDNN_DATA_BFLOAT16
    tq, tk, tv, to, tl = _desc(q, bfp), _desc(k, bfp), _desc(v, bfp), _desc(o, bfp), _desc(lse, pydnn.PYDNN_DATA_FLOAT)
    a = pydnn.create_attention_descriptor()
    mask = pydnn.PYDNN_ATTN_MASK_CAUSAL_TOP_LEFT if p["causal"] else pydnn.PYDNN_ATTN_MASK_NONE
    ws = None
    if fwd_untimed:  # the backward's O / lse from pydnn's forward (not timed, not a row)
        try:
            pydnn.set_attention_descriptor(a, p["hq"], p["hkv"], p["d"], p["d"] ** -0.5, mask, 0.0, 0)
            ws_n = pydnn.get_attention_forward_workspace_size(h, a, tq, tk)
            ws = torch.empty(max(ws_n, 1), dtype=torch.uint8, device=SC.DEV)
            pydnn.attention_forward(h, a, tq, q.data_ptr(), tk, k.data_ptr(), tv, v.data_ptr(), to, o.data_ptr(), tl,
                                    lse.data_ptr(), None, None, ws.data_ptr(), ws_n)
        except Exception as e:  # noqa: BLE001 - the backward's row says what failed
            st, note = SC.classify(e)
            rows.append(dict(base, group="bwd", status=st, note="forward (untimed): " + note))
            t.clear()
            torch.cuda.empty_cache()
            return
    for d in dirs:
        row = dict(base, group=d, status=SC.OK, flops=flops(p, d == "bwd"))
        try:
            pydnn.set_attention_descriptor(a, p["hq"], p["hkv"], p["d"], p["d"] ** -0.5, mask, 0.0, 0)
            if d in ("fwd", "decode"):
                train = d == "fwd"
                # the forward's workspace as the size query reports it (the decode forward's split partials;
                # with none it runs unsplit: the H200 sweep of 2026-11-27 passed none and timed batch 1 / 4
                # decode unsplit)
                ws_n = pydnn.get_attention_forward_workspace_size(h, a, tq, tk)
                ws = torch.empty(max(ws_n, 1), dtype=torch.uint8, device=SC.DEV)
                fp = (lambda: pydnn.attention_forward(h, a, tq, q.data_ptr(), tk, k.data_ptr(), tv, v.data_ptr(), to,
                                                      o.data_ptr(), tl if train else None,
                                                      lse.data_ptr() if train else 0, None, None, ws.data_ptr(),
                                                      ws_n))
                out, ref_fn = o, (lambda: _torch_out("cudnn", q, k, v, p["causal"], None))
            else:
                ws_n = pydnn.get_attention_backward_workspace_size(h, a, tq, tk)
                ws = torch.empty(max(ws_n, 1), dtype=torch.uint8, device=SC.DEV)
                do, dq, dk, dv = t["do"], t["dq"], t["dk"], t["dv"]
                fp = (lambda: pydnn.attention_backward(
                    h, a, tq, q.data_ptr(), tk, k.data_ptr(), tv, v.data_ptr(), to, o.data_ptr(), to, do.data_ptr(),
                    tl, lse.data_ptr(), tq, dq.data_ptr(), tk, dk.data_ptr(), tv, dv.data_ptr(), None, None, 0,
                    ws.data_ptr(), ws_n))
                out = dq

                def ref_fn():
                    return _torch_out("cudnn", q, k, v, p["causal"], do)
            if d not in checked:  # correctness spot check (not timed); the backward's o / lse are pydnn's forward's
                out.fill_(float("nan"))
                fp()
                try:
                    ref = ref_fn()
                except Exception:  # noqa: BLE001 - cuDNN refused: the flash backend
                    ref = _torch_out("flash", q, k, v, p["causal"], t["do"] if d == "bwd" else None)
                err, ok = SC.close_rel(out, ref, 2e-2)
                checked[d] = dict(case=row["case"], err=err, ok=ok)
                row["check_err"] = err
                if not ok:
                    row["note"] = f"CHECK FAILED: max rel err {err:.3g}"
            row["ms_pydnn"] = timer(fp)
            if d == "decode":
                ms_c, n_c = _ref_ms(timer, "cudnn", q, k, v, False, None, False)
                ms_f, n_f = _ref_ms(timer, "flash", q, k, v, False, None, False)
                row.update(ms_cudnn=ms_c, ms_flash=ms_f)
                avail = [(m, n) for m, n in ((ms_c, "cudnn"), (ms_f, "flash")) if m is not None]
                if avail:
                    row["ms_ref"], row["ref"] = min(avail)
                notes = "; ".join(x for x in (n_c, n_f) if x)
                if notes:
                    row["note"] = (row.get("note", "") + " " + notes).strip()
                row["gbs_pydnn"] = kv_bytes(p) / row["ms_pydnn"] / 1e6
            else:
                row["ms_ref"], note = _ref_ms(timer, "cudnn", q, k, v, p["causal"], t["do"], d == "bwd")
                row["ref"] = "cudnn"
                if note:
                    row["note"] = (row.get("note", "") + " " + note).strip()
            row["tflops_pydnn"] = row["flops"] / row["ms_pydnn"] / 1e9
            if row.get("ms_ref"):
                row["ratio"] = row["ms_ref"] / row["ms_pydnn"]
                row["tflops_ref"] = row["flops"] / row["ms_ref"] / 1e9
            else:
                row["status"] = "NO_REFERENCE"
        except Exception as e:  # noqa: BLE001
            row["status"], note = SC.classify(e)
            row["note"] = (row.get("note", "") + " " + note).strip()
            row.pop("ratio", None)
        rows.append(row)
    ws = None  # noqa: F841 - the workspace freed with the point's tensors
    t.clear()
    torch.cuda.empty_cache()


# ----------------------------------------------------------------------------------- report
def report(rows, meta, budget_note, elapsed):
    lines = ["# Fused attention sweep (issue 19): pydnn vs cuDNN SDPA, bf16", "",
             f"{meta.get('device', '?')}, torch {meta.get('torch', '?')}, cuDNN {meta.get('cudnn', '?')}, "
             f"seed {meta.get('seed')}; {budget_note}; elapsed {elapsed:.1f} s.", "",
             "Ratio = reference ms / pydnn ms (cuDNN for fwd / bwd; the faster of cuDNN and flash for decode). "
             "Targets: d128 fwd >= 1.0x, bwd >= 0.9x (geomean), no point < 0.8x; d64 / d256 >= 0.9x; "
             "decode >= 0.9x.", "", "## Summary", "",
             "| part | points | geomean | min | min at | < 0.8x | NOT_SUPPORTED | other not OK |",
             "|---|---:|---:|---:|---|---:|---:|---:|"]
    parts = [(f"{g} d{d}", lambda r, g=g, d=d: r["group"] == g and r["d"] == d) for g in ("fwd", "bwd") for d in DIMS]
    parts += [("decode", lambda r: r["group"] == "decode"), ("all", lambda r: True)]
    for name, pred in parts:
        s = SC.summarize(rows, below=0.8, pred=pred)
        ns = s["statuses"].get(SC.NOT_SUPPORTED, 0)
        other = sum(v for k, v in s["statuses"].items() if k not in (SC.OK, SC.NOT_SUPPORTED))
        lines.append(f"| {name} | {s['n']} | {SC.fmt(s['geomean'])} | {SC.fmt(s['min'])} | {s['min_case']} | "
                     f"{s['below']} | {ns} | {other} |")
    lines += SC.checks_lines(meta.get("checks", {}))
    cols = [("shape", "case", None), ("direction", "group", None), ("status", "status", None),
            ("pydnn ms", "ms_pydnn", ".4f"), ("ref ms", "ms_ref", ".4f"), ("ref", "ref", None),
            ("ratio", "ratio", ".3f"), ("pydnn TFLOP/s", "tflops_pydnn", ".1f"), ("ref TFLOP/s", "tflops_ref", ".1f"),
            ("cuDNN ms (decode)", "ms_cudnn", ".4f"), ("flash ms (decode)", "ms_flash", ".4f"),
            ("pydnn KV GB/s (decode)", "gbs_pydnn", ".0f"), ("point s", "point_s", ".2f"), ("note", "note", None)]
    lines += ["", "## Every point", "", SC.markdown_table(rows, cols), ""]
    return "\n".join(lines)


def plots(rows):
    panels = {f"{g} d{d}": [r["ratio"] for r in SC.ok_rows(rows, g, lambda r, d=d: r["d"] == d)]
              for g in ("fwd", "bwd") for d in DIMS}
    panels["decode"] = [r["ratio"] for r in SC.ok_rows(rows, "decode")]
    return {"sweep_attention.png": ("pydnn / cuDNN SDPA (decode: / the faster of cuDNN and flash), bf16, sorted",
                                    {k: v for k, v in panels.items() if v}, (1.0, 0.9, 0.8))}


def main(argv=None):
    args = SC.parse_args(__doc__, 140.0, argv, extra=(("--dirs", dict(
        default="fwd,bwd", help="training directions to time: fwd,bwd (default), bwd (the forward runs untimed for "
                                "the backward's inputs) or fwd")),))
    if args.render:
        return SC.render(args, "sweep_attention", lambda rows, meta: report(
            rows, meta, meta.get("budget_note", "rendered from " + args.render), meta.get("elapsed_s", float("nan"))),
            plots)
    t0 = time.monotonic()
    import torch
    import pydnn

    torch.manual_seed(args.seed)
    h = pydnn.create()
    pydnn.set_stream(h, torch.cuda.current_stream().cuda_stream)
    reps = args.reps or 5
    timer = SC.gpu_timer(reps, 2)
    budget = SC.Budget(args.budget_s)
    pts, meta = grid(args.seed, args.quick)
    meta.update(SC.device_meta(), quick=args.quick, budget_s=args.budget_s, reps=reps, dirs=args.dirs)
    only = [o for o in args.only.split(",") if o]
    rows, checked = [], {}
    for p in pts:
        if only and p["kind"] not in only:
            continue
        if not budget.take() or meta.get("context_lost"):
            continue
        n0 = len(rows)
        n_before, t_point = len(rows), time.monotonic()
        run_point(h, p, timer, checked, rows, tuple(x for x in args.dirs.split(",") if x))
        for r in rows[n_before:]:  # the point's wall time (setup, check, both sides' timing)
            r["point_s"] = time.monotonic() - t_point
        lost = SC.sticky(rows[n_before:])
        if lost:  # the CUDA context is unusable from here: stop sampling and say why
            meta["context_lost"] = lost
            print(f"CUDA context lost, sweep stopped: {lost}", flush=True)
        for r in rows[n0:]:
            print(f"attn {r['case']:36s} {r['group']:6s} {r['status']:13s} pydnn {SC.fmt(r.get('ms_pydnn'), '.4f')} ms "
                  f"ref {SC.fmt(r.get('ms_ref'), '.4f')} ms {SC.fmt(r.get('ratio'), '.2f')}x "
                  f"{SC.fmt(r.get('tflops_pydnn'), '.0f')} TFLOP/s {r.get('note', '')[:100]}", flush=True)
        SC.write_partial(args.out, "sweep_attention", rows, meta)
    meta["checks"] = checked
    return SC.finish(args.out, "sweep_attention", rows, meta, budget, t0,
                     lambda note, elapsed: report(rows, meta, note, elapsed), plots)


if __name__ == "__main__":
    main()
