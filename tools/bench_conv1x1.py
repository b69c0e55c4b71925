#!/usr/bin/env python3
"""1x1 convolutions (issue 18): pydnn's implicit GEMMs against the 1x1-as-matmul routes and cuDNN, bf16 NHWC,
forward and backward data, in one run.

    python3 tools/bench_conv1x1.py [--out DIR] [--reps 5] [--quick] [--shapes a,b] [--find]

Per shape: forward IMPLICIT_PRECOMP_GEMM (fwd_wgmma / implicit_gemm_pipe_tc) and FWD_ALGO_GEMM (one
pydnn.ops.matmul on x itself for stride 1, the gather + matmul for a strided 1x1); backward data ALGO_1
(the implicit GEMMs, stride phases) and ALGO_0 (its 16-bit 1x1 GEMM form: one matmul into dx, or into a
column matrix + col2im when strided); the algorithm Get..._v7 puts first (its pick and modelled ms for
each route); cuDNN through PyTorch (cudnn.benchmark on) in the same run. Every pydnn route is checked
against PyTorch first (its output poisoned with NaN; max error / max |ref|, bf16 tolerance 2e-2).
Timing: device ms per call from a CUDA graph of back-to-back calls (~2 ms of work a replay) (sweep_common.graph_ms; events around
back-to-back calls where a capture fails), pydnn's plans launched through plans.run_plan (the plan of each
route built under its switches), cuDNN through PyTorch. Ratio = cuDNN ms / pydnn ms.

The shapes: the issue "Convolution"'s two 1x1 layers at N = 64, ResNet-50's 1x1 layers (stride 1 and the
strided downsamples) at N = 8 / 32 / 128, and the sweep's random 1x1 shapes that ran below 0.7x.
"""
import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# (name, N, C, K, H, stride[, R]): R x R filters with padding R // 2 (forward only) time the GEMM algorithm's
# column matrix on matmul against its implicit 1x1 view (tuning.conv_gemm.MM_COLS True / False)
SHAPES = [
    ("issue 1x1 256->64 @56", 64, 256, 64, 56, 1),
    ("issue 1x1 64->256 @56", 64, 64, 256, 56, 1),
    ("issue 7x7/2 3->64 @224 (stem)", 64, 3, 64, 224, 2, 7),
    ("r50 l3 1x1 512->256 @28", 128, 512, 256, 28, 1),
    ("r50 l1 1x1 256->64 @56", 128, 256, 64, 56, 1),
    ("r50 l4 1x1 512->2048 @7", 128, 512, 2048, 7, 1),
    ("r50 l2 ds 1x1/2 256->512 @56", 128, 256, 512, 56, 2),
    ("rand 1x1 176->752 @37", 93, 176, 752, 37, 1),
    ("rand 5x5 144->48 @35", 12, 144, 48, 35, 1, 5),
    ("unet 3x3 96->96 @28", 64, 96, 96, 28, 1, 3),
    ("rand 7x7/2 152->672 @103", 11, 152, 672, 103, 2, 7),
    ("r50 l1 1x1 64->64 @56", 128, 64, 64, 56, 1),
    ("r50 l3 1x1 1024->256 @14", 128, 1024, 256, 14, 1),
    ("r50 l4 1x1 2048->512 @7", 128, 2048, 512, 7, 1),
    ("r50 l4 ds 1x1/2 1024->2048 @14", 128, 1024, 2048, 14, 2),
    ("r50 l4 1x1 512->2048 @7", 32, 512, 2048, 7, 1),
    ("r50 l3 1x1 256->1024 @14", 32, 256, 1024, 14, 1),
    ("r50 l3 1x1 1024->256 @14", 8, 1024, 256, 14, 1),
    ("r50 l1 1x1 64->64 @56", 8, 64, 64, 56, 1),
    ("rand 1x1 32->400 @32", 122, 32, 400, 32, 1),
    ("rand 1x1 40->280 @49", 99, 40, 280, 49, 1),
    ("rand 1x1/2 56->440 @45", 54, 56, 440, 45, 2),
    ("rand 7x7 24->392 @10", 162, 24, 392, 10, 1, 7),
    ("issue 3x3 64->64 @56", 64, 64, 64, 56, 1, 3),
    ("rand 3x3 448->880 @19", 163, 448, 880, 19, 1, 3),
    ("r50 l4 1x1 2048->512 @7", 8, 2048, 512, 7, 1),
    ("r50 l1 1x1 64->64 @56", 32, 64, 64, 56, 1),       # the sweep's worst rows (2026-11-29: 0.267x / 0.268x)
    ("rnx l1 1x1 64->128 @56", 32, 64, 128, 56, 1),
    ("r50 l1 1x1 64->256 @56", 32, 64, 256, 56, 1),
]
# the short-reduction rows the streaming kernels serve (tuning.conv.STREAM_1X1): --shapes of these
STREAM = [0, 1, 4, 11, 18, 19, 20, 26, 27, 28]  # (27: its backward data too, reduction 128)
QUICK = [0, 1, 2, 3, 8, 9]


def _setup(pydnn, torch, n, c, k, hh, s, r=1, nchw=False):
    import sweep_common as SC   # SC.DEV: "cuda" (a dry run on the CPU sets "cpu")
    from bench import desc
    cl, bf, pdt = torch.channels_last, torch.bfloat16, pydnn.PYDNN_DATA_BFLOAT16
    if nchw:
        cl = torch.contiguous_format
    pad = r // 2
    p = (hh + 2 * pad - r) // s + 1
    dev = SC.DEV
    t = dict(x=torch.randn(n, c, hh, hh, device=dev, dtype=bf).contiguous(memory_format=cl),
             w=(torch.randn(k, c, r, r, device=dev, dtype=bf) / math.sqrt(c * r * r)).contiguous(memory_format=cl),
             y=torch.empty(n, k, p, p, device=dev, dtype=bf).contiguous(memory_format=cl), pad=pad)
    t["dy"], t["dx"] = torch.randn_like(t["y"]), torch.empty_like(t["x"])
    t["xd"], t["yd"] = desc(t["x"], dtype=pdt), desc(t["y"], dtype=pdt)
    t["wd"] = pydnn.create_filter_descriptor()
    pydnn.set_filter4d_descriptor(t["wd"], pdt, pydnn.PYDNN_TENSOR_NCHW if nchw else pydnn.PYDNN_TENSOR_NHWC, k, c, r, r)
    t["conv"] = pydnn.create_convolution_descriptor()
    pydnn.set_convolution2d_descriptor(t["conv"], pad, pad, s, s, 1, 1, pydnn.PYDNN_CROSS_CORRELATION,
                                       pydnn.PYDNN_DATA_FLOAT)
    return t


def _label(pl):
    expr = getattr(pl, "gemm_expr", "") or type(pl).__name__
    head, _, args = expr.partition("<")
    return f"{head.split('::')[-1]}<{args.split(', ', 1)[-1]}" if ", " in args else head.split("::")[-1]


# the sweep's fused layers whose forward v7 may put on the GEMM algorithm (the 3x3 ones stay implicit)
FUSED = [("r50 l4 1x1 512->2048 @7", 32, 512, 2048, 7, 1), ("r50 l1 1x1 256->64 @56", 32, 256, 64, 56, 1)]


def _fused(pydnn, torch, h, timer, fwd_i, fwd_g, layers, layouts=("nhwc",), tma=None):
    """Per FUSED layer, layout and algorithm (implicit, GEMM): the plain forward and
    ConvolutionBiasActivationForward (bias, ReLU) through the public calls, checked against PyTorch first;
    and cuDNN's conv2d(bias) + relu_ through PyTorch in the same layout (cudnn_fused_ms). tma: (handle, timer)
    of a handle of its own (its plan cache) for the implicit algorithm with tuning.conv.FWD_TMA "always"
    (fwd_tma's fused epilogue) as a third route."""
    from pydnn import tuning
    out = []
    from bench import desc
    for name, n, c, k, hh, s, lay in [(*ly, lay) for ly in layers for lay in layouts]:
        t = _setup(pydnn, torch, n, c, k, hh, s, nchw=lay == "nchw")
        x, w, y, xd, yd, wd, conv = t["x"], t["w"], t["y"], t["xd"], t["yd"], t["wd"], t["conv"]
        bias = torch.randn(1, k, 1, 1, device=x.device, dtype=torch.bfloat16)
        bd = desc(bias, dtype=pydnn.PYDNN_DATA_BFLOAT16)
        act = pydnn.create_activation_descriptor()
        pydnn.set_activation_descriptor(act, pydnn.PYDNN_ACTIVATION_RELU, pydnn.PYDNN_NOT_PROPAGATE_NAN, 0.0)
        ref = torch.relu(torch.nn.functional.conv2d(x, w, bias.view(-1), s))
        rows = []
        routes = [("implicit", fwd_i, h, timer, False), ("gemm", fwd_g, h, timer, False)]
        if tma is not None:
            routes.append(("impl_tma", fwd_i, tma[0], tma[1], "always"))
        for label, algo, hr, timer_r, tma_mode in routes:
            row = dict(case=f"N{n} {name} {lay}", dir="fused", algo=label)
            saved_tma = tuning.conv.FWD_TMA
            tuning.conv.FWD_TMA = tma_mode
            try:
                ws_n = pydnn.get_convolution_forward_workspace_size(hr, xd, wd, conv, yd, algo)
                ws = torch.empty(max(ws_n, 1), dtype=torch.uint8, device=x.device)
                plain = lambda algo=algo, ws=ws, ws_n=ws_n: pydnn.convolution_forward(  # noqa: E731
                    hr, 1.0, xd, x.data_ptr(), wd, w.data_ptr(), conv, algo, ws.data_ptr(), ws_n, 0.0, yd, y.data_ptr())
                fused = lambda algo=algo, ws=ws, ws_n=ws_n: pydnn.convolution_bias_activation_forward(  # noqa: E731
                    hr, 1.0, xd, x.data_ptr(), wd, w.data_ptr(), conv, algo, ws.data_ptr(), ws_n, 0.0, yd, y.data_ptr(),
                    bd, bias.data_ptr(), act, yd, y.data_ptr())
                y.fill_(float("nan"))
                fused()
                row["err"] = ((y.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
                if not row["err"] <= 2e-2:
                    row["note"] = f"CHECK FAILED {row['err']:.3g}"
                row["plain_ms"], _ = timer_r(plain)
                row["fused_ms"], _ = timer_r(fused)
                row["fused_over_plain"] = row["fused_ms"] / row["plain_ms"]
            except Exception as e:  # noqa: BLE001
                row["note"] = f"{type(e).__name__}: {str(e)[:160]}"
            finally:
                tuning.conv.FWD_TMA = saved_tma
            rows.append(row)
        best = min((r["plain_ms"] for r in rows if "plain_ms" in r), default=None)
        try:
            cud, _ = timer(lambda: torch.relu_(torch.nn.functional.conv2d(x, w, bias.view(-1), s)))
        except Exception:  # noqa: BLE001
            cud = None
        for r in rows:
            if best and "fused_ms" in r:
                r["fused_over_best_plain"] = r["fused_ms"] / best
            if cud and "fused_ms" in r:
                r["cudnn_fused_ms"], r["fused_over_cudnn_fused"] = cud, r["fused_ms"] / cud
            print(f"fused {r['case']:34s} {r['algo']:8s} plain {r.get('plain_ms', 0):.4f} fused {r.get('fused_ms', 0):.4f} "
                  f"{r.get('fused_over_plain', 0):.3f}x (of the best plain {r.get('fused_over_best_plain', 0):.3f}x) "
                  f"cuDNN fused {r.get('cudnn_fused_ms', 0):.4f} (pydnn / cuDNN {r.get('fused_over_cudnn_fused', 0):.3f}x) "
                  f"{r.get('note', '')}", flush=True)
        out += rows
        del t
    return out


# (format, N, C, K, H, W, epilogue keys (act, z, bias stride)) whose fused-matmul units --prebuild-fused compiles:
# the FUSED layers' bias + ReLU in NHWC and NCHW, and tests/ops/convolution/test_convolution_fused1x1_gpu.py's
# bf16 cases (nhwc0, nhwc2, nchw3)
_ALL_KEYS = ((1, False, 1), (0, False, 1), (1, True, 1), (0, True, 1))
PREBUILD_FUSED = [("nhwc", 32, 512, 2048, 7, 7, ((1, False, 1),)), ("nchw", 32, 512, 2048, 7, 7, ((1, False, 1),)),
                  ("nhwc", 4, 128, 256, 7, 7, _ALL_KEYS), ("nhwc", 3, 24, 40, 7, 9, _ALL_KEYS),
                  ("nchw", 2, 16, 24, 7, 5, _ALL_KEYS)]


def _prebuild_one(job):
    """Compile (into the cache) the graph API's fused-matmul unit of one (layout, shape, epilogue key) on a CPU
    handle (sm_90, 132 SMs: the H100 / H200 tile choice); NVRTC only, no GPU."""
    fmt, n, c, k, hh, ww, key = job
    import pydnn
    from plan_digest import cpu_handle
    from pydnn.ops.convolution import gemm as G, plans as CP, problem as CPb
    h = cpu_handle("sm_90", 132)
    f = pydnn.PYDNN_TENSOR_NCHW if fmt == "nchw" else pydnn.PYDNN_TENSOR_NHWC
    bf = pydnn.PYDNN_DATA_BFLOAT16
    xd, yd = pydnn.create_tensor_descriptor(), pydnn.create_tensor_descriptor()
    pydnn.set_tensor4d_descriptor(xd, f, bf, n, c, hh, ww)
    pydnn.set_tensor4d_descriptor(yd, f, bf, n, k, hh, ww)
    wd = pydnn.create_filter_descriptor()
    pydnn.set_filter4d_descriptor(wd, bf, f, k, c, 1, 1)
    cv = pydnn.create_convolution_descriptor()
    pydnn.set_convolution2d_descriptor(cv, 0, 0, 1, 1, 1, 1, pydnn.PYDNN_CROSS_CORRELATION, pydnn.PYDNN_DATA_FLOAT)
    pl = CP.new_plan(h, CPb.DIR_FWD, pydnn.PYDNN_CONVOLUTION_FWD_ALGO_GEMM, cv, xd, wd, yd)
    G.FusedMM(h, pl, key)
    return job


def prebuild_fused(procs=8):
    """The PREBUILD_FUSED units in parallel processes (a GPU run's compiles out of its time budget)."""
    import multiprocessing as mp
    jobs = [(fmt, n, c, k, hh, ww, key) for fmt, n, c, k, hh, ww, keys in PREBUILD_FUSED for key in keys]
    t = time.monotonic()
    with mp.get_context("spawn").Pool(procs) as pool:
        done = pool.map(_prebuild_one, jobs)
    print(f"prebuilt {len(done)} fused-matmul units in {time.monotonic() - t:.1f} s", flush=True)


def _timer(h, reps):
    """Device ms per call: a CUDA graph of back-to-back calls (sweep_common.graph_ms: the host's per-call
    cost drops out, which matters for kernels of ~10 us) where the capture works, else time_ms."""
    import sweep_common as SC
    from bench import time_ms

    def timer(fn):
        try:   # about 2 ms of work a replay (a one-call graph first says how long a call is)
            return SC.graph_ms_fit(h, fn, reps), "graph"
        except Exception:  # noqa: BLE001 - not capturable: events around back-to-back calls
            import torch
            torch.cuda.synchronize()
            return time_ms(fn, reps=reps, warmup=1), "events"
    return timer


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--stream", action="store_true", help="the short-reduction rows (STREAM) only")
    ap.add_argument("--shapes", default="", help="indices into SHAPES, comma-separated")
    ap.add_argument("--fused", type=int, nargs="?", const=len(FUSED), default=0,
                    help="also the fused conv + bias + ReLU rows of the first N FUSED layers (all without N)")
    ap.add_argument("--fused-nchw", action="store_true", help="the fused rows in NCHW too")
    ap.add_argument("--budget-s", type=float, default=1e9, help="stop starting shapes after this many seconds")
    ap.add_argument("--prebuild-fused", action="store_true",
                    help="only compile the fused-matmul units of PREBUILD_FUSED (parallel, no GPU) and exit")
    args = ap.parse_args(argv)
    if args.prebuild_fused:
        return prebuild_fused()
    t0 = time.monotonic()
    import torch
    import pydnn
    from pydnn import tuning
    from pydnn.ops import matmul as mm_mod
    from pydnn.ops.convolution import algorithms as A, plans as P, problem as Pb

    torch.backends.cudnn.benchmark = True
    h = pydnn.create()
    pydnn.set_stream(h, torch.cuda.current_stream().cuda_stream)
    timer = _timer(h, args.reps)
    idx = [int(i) for i in args.shapes.split(",") if i] or (QUICK if args.quick else STREAM if args.stream
                                                             else range(len(SHAPES)))
    fused_rows = []
    if args.fused:   # first: the issue's fused target, before the shapes spend the budget
        h_tma = pydnn.create()
        pydnn.set_stream(h_tma, torch.cuda.current_stream().cuda_stream)
        fused_rows = _fused(pydnn, torch, h, timer, pydnn.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
                            pydnn.PYDNN_CONVOLUTION_FWD_ALGO_GEMM, FUSED[:args.fused],
                            ("nhwc", "nchw") if args.fused_nchw else ("nhwc",), (h_tma, _timer(h_tma, args.reps)))
    FWD_I, FWD_G = pydnn.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, pydnn.PYDNN_CONVOLUTION_FWD_ALGO_GEMM
    BWD_1, BWD_0 = pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_1, pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_0
    rows = []
    os.makedirs(args.out, exist_ok=True)
    jf = open(os.path.join(args.out, "bench_conv1x1.jsonl"), "w")
    for i in idx:
        if time.monotonic() - t0 > args.budget_s:
            print(f"budget spent: shape {i} and after not run")
            break
        name, n, c, k, hh, s, *rr = SHAPES[i]
        r = rr[0] if rr else 1
        t = _setup(pydnn, torch, n, c, k, hh, s, r)
        x, w, y, dy, dx, pad = t["x"], t["w"], t["y"], t["dy"], t["dx"], t["pad"]
        xd, yd, wd, conv = t["xd"], t["yd"], t["wd"], t["conv"]
        flops = 2 * n * k * y.shape[2] * y.shape[3] * c * r * r
        for d in (("fwd", "bwd data") if r == 1 else ("fwd",)):
            row = dict(case=f"N{n} {name}", dir=d, flops=flops)
            if d == "fwd":
                direction = Pb.DIR_FWD
                routes = [("implicit", FWD_I, {}), ("gemm", FWD_G, {})]
                if r > 1:
                    routes += [("gemm_mm", FWD_G, {"conv_gemm.MM_COLS": True}),
                               ("gemm_auto", FWD_G, {"conv_gemm.MM_COLS": None})]
                if c % 64 or (r > 1 and (c * r * r) % 64):   # channel tails: before FWD_TAIL_FILL (fwd_tc)
                    routes += [("implicit_old", FWD_I, {"conv.FWD_TAIL_FILL": 2.0})]
                    if r > 1:   # the column matrix's view with its channel tail on the pipelined / wgmma kernels
                        routes += [("gemm_view_tails", FWD_G, {"conv_gemm.MM_COLS": False,
                                                               "conv_gemm.VIEW_TAIL_FILL": 0.5})]
                v7 = pydnn.get_convolution_forward_algorithm_v7(h, xd, wd, conv, yd, 8)
                ref_fn = lambda: torch.nn.functional.conv2d(x, w, None, s, pad)  # noqa: E731
                a_ptr, out = x.data_ptr(), y
            else:
                direction = Pb.DIR_BWD_DATA
                routes = [("implicit", BWD_1, {}), ("gemm", BWD_0, {})]
                v7 = pydnn.get_convolution_backward_data_algorithm_v7(h, wd, yd, conv, xd, 6)
                ref_fn = lambda: torch.ops.aten.convolution_backward(  # noqa: E731
                    dy, x, w, None, [s, s], [pad, pad], [1, 1], False, [0, 0], 1, [True, False, False])[0]
                a_ptr, out = dy.data_ptr(), dx
            if r == 1 and s == 1 and hasattr(tuning.conv, "STREAM_1X1"):   # the streaming kernels (stream.py)
                from pydnn.ops.convolution import stream as ST
                if ST.refusal(Pb.problem(conv, xd, wd, yd), direction) is None:
                    routes += [("stream", routes[0][1], {"conv.STREAM_1X1": True})]
            if r == 1 and s == 1 and (c if d == "fwd" else k) < 512 and hasattr(mm_mod, "WG_MIN_K"):
                # matmul's wgmma tiles for a short K too (its chooser takes them from K >= 512): for the gemm helper
                routes += [("gemm_wgK", routes[1][1], {"mm.WG_MIN_K": 64, "matmul.WG_PERSIST_MIN_K": 64}),
                           ("gemm_wgP", routes[1][1], {"matmul.WG_PERSIST_MIN_K": 64})]   # the persistent tile only
            row["v7"] = v7[0].algo
            ref = ref_fn()
            for route, algo, sw in routes:
                sw = {tuple(key.split(".")): v for key, v in sw.items()}
                owner = lambda fam: mm_mod if fam == "mm" else getattr(tuning, fam)  # noqa: E731
                saved = {key: getattr(owner(key[0]), key[1]) for key in sw}
                try:
                    for key, v in sw.items():
                        setattr(owner(key[0]), key[1], v)
                    pl = P.new_plan(h, direction, algo, conv, xd, wd, yd)
                    row[f"{route}_model_ms"] = A._estimate_ms(h, pl)
                    row[f"{route}_kernel"] = _label(pl)
                    ws = torch.empty(max(pl.workspace, 1), dtype=torch.uint8, device=x.device)
                    fn = lambda pl=pl, ws=ws: P.run_plan(h, pl, a_ptr, w.data_ptr(), out.data_ptr(),  # noqa: E731
                                                         ws.data_ptr(), 1.0, 0.0)
                    out.fill_(float("nan"))
                    fn()
                    err = ((out.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-30)).item()
                    row[f"{route}_err"] = err
                    row[f"{route}_ms"], row["timing"] = timer(fn)
                    if not (err <= 2e-2):
                        row[f"{route}_note"] = f"CHECK FAILED {err:.3g}"
                except Exception as e:  # noqa: BLE001 - a failure is a row
                    row[f"{route}_note"] = f"{type(e).__name__}: {str(e)[:160]}"
                finally:
                    for key, v in saved.items():
                        setattr(owner(key[0]), key[1], v)
            row["cudnn_ms"], row["cudnn_timing"] = timer(ref_fn)
            for route, _, _ in routes:
                if f"{route}_ms" in row:
                    row[f"{route}_ratio"] = row["cudnn_ms"] / row[f"{route}_ms"]
            pick = "gemm" if row["v7"] == routes[1][1] else "implicit" if row["v7"] == routes[0][1] else None
            row["v7_route"] = pick
            if pick and f"{pick}_ms" in row:
                row["v7_ratio"] = row["cudnn_ms"] / row[f"{pick}_ms"]
            rows.append(row)
            jf.write(json.dumps(row) + "\n")
            jf.flush()
            f = lambda key: f"{row[key]:.4f}" if key in row else "-"  # noqa: E731
            q = lambda key: f"{row[key]:.2f}x" if key in row else "-"  # noqa: E731
            extra = "".join(f" {rt} {f(rt + '_ms')} ({q(rt + '_ratio')})" for rt, _, _ in routes[2:])
            notes = " ".join(row.get(f"{rt}_note", "") for rt, _, _ in routes)
            print(f"{row['case']:36s} {d:8s} impl {f('implicit_ms')} ({q('implicit_ratio')}) "
                  f"gemm {f('gemm_ms')} ({q('gemm_ratio')}){extra} cudnn {f('cudnn_ms')} v7 {pick} "
                  f"model {f('implicit_model_ms')}/{f('gemm_model_ms')} [{row.get('implicit_kernel', '')} | "
                  f"{row.get('gemm_kernel', '')}] {notes}", flush=True)
        del t
        torch.cuda.empty_cache()
    for fr in fused_rows:
        jf.write(json.dumps(fr) + "\n")
    jf.close()
    import sweep_common as SC
    meta = SC.device_meta()
    lines = ["# 1x1 convolutions (and the GEMM algorithm's column matrix), bf16 NHWC: implicit GEMM vs matmul vs cuDNN",
             f"{meta['device']}, cuDNN {meta['cudnn']}; ratio = cuDNN / pydnn; "
             "device ms per call from CUDA graphs of back-to-back calls", "",
             "| shape | dir | implicit ms | gemm ms | gemm_wgK ms | gemm_mm / gemm_auto ms | implicit_old / gemm_view_tails ms | cuDNN ms | "
             "implicit x | gemm x | v7 | v7 x | model impl / gemm | kernels |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---|---|"]
    for row in rows:
        g = lambda key, sp=".4f": format(row[key], sp) if key in row else "-"  # noqa: E731
        lines.append(f"| {row['case']} | {row['dir']} | {g('implicit_ms')} | {g('gemm_ms')} | {g('gemm_wgK_ms')} | "
                     f"{g('gemm_mm_ms')} / {g('gemm_auto_ms')} | {g('implicit_old_ms')} / {g('gemm_view_tails_ms')} | "
                     f"{g('cudnn_ms')} | "
                     f"{g('implicit_ratio', '.2f')} | {g('gemm_ratio', '.2f')} | {row.get('v7_route')} | "
                     f"{g('v7_ratio', '.2f')} | {g('implicit_model_ms')} / {g('gemm_model_ms')} | "
                     f"{row.get('implicit_kernel', '')}; {row.get('gemm_kernel', '')} |")
    for d in ("fwd", "bwd data"):
        for key in ("implicit_ratio", "gemm_ratio", "v7_ratio"):
            v = [row[key] for row in rows if row["dir"] == d and key in row]
            if v:
                lines.append(f"\n{d} {key}: geomean {math.exp(sum(map(math.log, v)) / len(v)):.3f} over {len(v)}")
        best = [max(row.get("implicit_ratio", 0), row.get("gemm_ratio", 0)) for row in rows if row["dir"] == d]
        if best:
            lines.append(f"{d} best-of-both: geomean {math.exp(sum(math.log(max(b, 1e-9)) for b in best) / len(best)):.3f}")
    if fused_rows:
        lines += ["", "Fused conv + bias + ReLU (ConvolutionBiasActivationForward) against the plain forward, N = 32:", "",
                  "| shape | algo | plain ms | fused ms | fused / plain | fused / best plain | cuDNN fused ms | "
                  "fused / cuDNN fused |", "|---|---|---:|---:|---:|---:|---:|---:|"]
        for fr in fused_rows:
            lines.append(f"| {fr['case']} | {fr['algo']} | {fr.get('plain_ms', float('nan')):.4f} | "
                         f"{fr.get('fused_ms', float('nan')):.4f} | {fr.get('fused_over_plain', float('nan')):.3f} | "
                         f"{fr.get('fused_over_best_plain', float('nan')):.3f} | "
                         f"{fr.get('cudnn_fused_ms', float('nan')):.4f} | "
                         f"{fr.get('fused_over_cudnn_fused', float('nan')):.3f} | {fr.get('note', '')}")
    md = "\n".join(lines) + f"\n\nelapsed {time.monotonic() - t0:.1f} s\n"
    with open(os.path.join(args.out, "bench_conv1x1.md"), "w") as f:
        f.write(md)
    print(md)
    return rows + fused_rows


if __name__ == "__main__":
    main()
