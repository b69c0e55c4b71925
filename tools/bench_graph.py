"""Graph API benchmark (issue 22): pydnn vs PyTorch (cuBLAS) in one run, device events, medians of
alternating rounds (bench.time_pair), ratios and TFLOP/s.

Rows:
  matmul      pydnn.matmul (tensor descriptors) vs torch.mm: bf16 8192^3, the 7B projections 16384 x 4096 x
              4096 and 16384 x 11008 x 4096 (x @ W, W row-major K x N), fp32 4096^3 without TF32.
  fused       the graph gelu(x @ W + b) (one generated kernel: GEMM + epilogue) vs the plain pydnn matmul of
              the same shape (target: <= 1.05x its time) and vs F.gelu(torch.addmm(b, x, W)) and
              F.gelu(x @ W + b) (target: faster than both).
  residual    x @ W + b + r, fused, vs torch.addmm(b, x, W) + r.
  rowmax      max(x @ W, -1) as one fused launch (the row reduction in the GEMM epilogue) vs the plain pydnn
              matmul and torch.mm(x, W).amax(-1).
  chain8      8 pointwise ops over 3 inputs in one kernel, y = tanh(clip(gelu(x * s + b) * x - b, 0, 4)) + x,
              x [N, C, W]; s [1, C, 1], b [1, 1, W] (broadcast: x read and y written are the bytes moved) and
              s, b [N, C, W] (four full tensors moved): GB/s of those bytes against device-to-device copy,
              vs torch eager.
  norm        gelu(layernorm(x)) [16384, 4096] bf16 as one fused launch vs the plain layernorm graph and torch
              (--norm alone: ~10 s, ~40 s with its first compiles).
  build       build_plans of a fused graph: first (compiles with NVRTC, or finds the cubin on disk) and
              again for a new Graph of the same shape (cache hit): milliseconds.
  host        host microseconds of one Graph.execute on a built plan (a small fused graph, 500 calls
              between syncs, int pointers and torch tensors).

    python tools/bench_graph.py [--quick [--ab]] [--chain] [--norm]

--chain (~20 s with its compiles): the 8-op chain's generated kernel in each form of pydnn.tuning.graph
(CHAIN_FORMS: exact (erff, tanh_nonneg) and the 16-bit forms (gelu_fast, tanh.approx), runs a thread, grid,
launch bounds), with s and b broadcast (x and y moved) and with s and b full-size (four tensors moved),
against torch eager and the copy bandwidth of the same run; then the host-side targets on the chain
(build_plans with the kernel cached, Graph.execute's host time: bench_chain_host).

--quick --ab (the graph branch's mid-session run, ~40 s with its compiles): the 128x256 wgmma tile one block a
tile, persistent (tuning.matmul.WG_PERSIST) and each WG_CANDIDATES entry, plain on 16384x4096x4096 and 8192^3
(the persistent one also with the raster's group_m at 4 and 16) and fused gelu(x@W+b), each against torch in
alternating rounds; the GPT demo's weight gradients (384x1152x16384, 1536x384x16384, A transposed: the
chooser, split-K, the wgmma tiles forced); then the rowmax and chain rows. Every unit it needs is compiled
first in parallel threads.
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import pydnn
from bench import time_ms, time_pair
from pydnn.graph import Graph

TDT = {pydnn.PYDNN_DATA_BFLOAT16: torch.bfloat16, pydnn.PYDNN_DATA_HALF: torch.float16,
       pydnn.PYDNN_DATA_FLOAT: torch.float32}
NAME = {pydnn.PYDNN_DATA_BFLOAT16: "bf16", pydnn.PYDNN_DATA_HALF: "fp16", pydnn.PYDNN_DATA_FLOAT: "fp32"}
BF16 = pydnn.PYDNN_DATA_BFLOAT16
ROWS = []


def row(kind, case, dtype, ms_p, ms_t, torch_name, flops=None, nbytes=None, copy_gbs=None, note=""):
    r = dict(kind=kind, case=case, dtype=dtype, ms_pydnn=ms_p, ms_torch=ms_t, ratio=ms_t / ms_p, torch=torch_name)
    extra = ""
    if flops:
        r["pydnn_tflops"], r["torch_tflops"] = flops / ms_p / 1e9, flops / ms_t / 1e9
        extra = f"pydnn {r['pydnn_tflops']:7.1f} TFLOP/s | {torch_name} {r['torch_tflops']:7.1f} TFLOP/s"
    if nbytes:
        g = nbytes / ms_p / 1e6
        r["pydnn_gbs"], r["pct_copy"] = g, 100 * g / copy_gbs
        extra = f"pydnn {g:7.0f} GB/s ({r['pct_copy']:.0f}% of copy) | {torch_name} {nbytes / ms_t / 1e6:7.0f} GB/s"
    ROWS.append(r)
    print(f"{kind:9s} {case:36s} {dtype:5s} {ms_p * 1e3:9.1f} us vs {ms_t * 1e3:9.1f} us  {extra}  "
          f"torch/pydnn time {r['ratio']:.3f}x {note}", flush=True)


def desc(t):
    d = pydnn.create_tensor_descriptor()
    dt = {torch.bfloat16: BF16, torch.float16: pydnn.PYDNN_DATA_HALF, torch.float32: pydnn.PYDNN_DATA_FLOAT}[t.dtype]
    pydnn.set_tensor_nd_descriptor(d, dt, t.dim(), list(t.shape), list(t.stride()))
    return d


def bench_matmul(h, dtype, m, n, k, label):
    t = TDT[dtype]
    x = torch.randn(m, k, device="cuda").to(t)
    w = torch.randn(k, n, device="cuda").to(t)
    c, out = torch.empty(m, n, device="cuda", dtype=t), torch.empty(m, n, device="cuda", dtype=t)
    dx, dw, dc = desc(x), desc(w), desc(c)
    xp, wp, cp = x.data_ptr(), w.data_ptr(), c.data_ptr()
    ms_p, ms_t = time_pair(lambda: pydnn.matmul(h, 1.0, dx, xp, dw, wp, 0.0, dc, cp), lambda: torch.mm(x, w, out=out))
    torch.cuda.synchronize()
    err = float((c.float() - out.float()).abs().max() / out.float().abs().max())
    row("matmul", f"{label} (rel diff {err:.1e})", NAME[dtype], ms_p, ms_t, "torch.mm", flops=2.0 * m * n * k)
    return ms_p


def fused_graph(h, m, n, k, residual=False):
    g = Graph(io_data_type=BF16, intermediate_data_type=pydnn.PYDNN_DATA_FLOAT, compute_data_type=pydnn.PYDNN_DATA_FLOAT,
              handle=h)
    x = g.tensor(name="x", dim=[1, m, k])
    w = g.tensor(name="w", dim=[1, k, n])
    b = g.tensor(name="b", dim=[1, 1, n])
    v = g.add(g.matmul(x, w), b)
    if residual:
        v = g.add(v, g.tensor(name="r", dim=[1, m, n]))
    else:
        v = g.gelu(v)
    v.set_output(True).set_name("y")
    return g


def bench_fused(h, m, n, k, plain_ms, rounds=6, residual=True):
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(k, n, device="cuda", dtype=torch.bfloat16) * 0.02
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    g = fused_graph(h, m, n, k)
    g.build_operation_graph().create_execution_plans().check_support().build_plans()
    assert g.engine_index() == 1 and g.launches() == 1, (g.engine_index(), g.launches())
    bufs = {"x": x.data_ptr(), "w": w.data_ptr(), "b": b.data_ptr(), "y": y.data_ptr()}
    run = lambda: g.execute(bufs, 0)  # noqa: E731
    ms_p, ms_addmm = time_pair(run, lambda: F.gelu(torch.addmm(b, x, w)), rounds=rounds)
    _, ms_plain = time_pair(run, lambda: F.gelu(x @ w + b), rounds=rounds)
    torch.cuda.synchronize()
    ref = F.gelu(torch.addmm(b, x, w).float())
    err = float((y.float() - ref).abs().max() / ref.abs().max())
    flops = 2.0 * m * n * k
    row("fused", f"gelu(x@W+b) {m}x{n}x{k} (rel {err:.1e})", "bf16", ms_p, ms_addmm, "gelu(addmm)", flops=flops,
        note=f"| fused/plain pydnn matmul time {ms_p / plain_ms:.3f}x (target <= 1.05)")
    row("fused", f"gelu(x@W+b) {m}x{n}x{k}", "bf16", ms_p, ms_plain, "gelu(x@w+b)", flops=flops)
    if not residual:
        return
    r = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    g2 = fused_graph(h, m, n, k, residual=True)
    g2.build_operation_graph().create_execution_plans().build_plans()
    bufs2 = dict(bufs, r=r.data_ptr())
    ms_p2, ms_t2 = time_pair(lambda: g2.execute(bufs2, 0), lambda: torch.addmm(b, x, w) + r, rounds=rounds)
    row("residual", f"x@W+b+r {m}x{n}x{k} (engine {g2.engine_index()})", "bf16", ms_p2, ms_t2, "addmm+r", flops=flops)


def _rowmax_graph(h, m, n, k):
    g = Graph(io_data_type=BF16, intermediate_data_type=pydnn.PYDNN_DATA_FLOAT,
              compute_data_type=pydnn.PYDNN_DATA_FLOAT, handle=h)
    xt = g.tensor(name="x", dim=[1, m, k])
    wt = g.tensor(name="w", dim=[1, k, n])
    g.reduction(g.matmul(xt, wt), pydnn.PYDNN_REDUCE_TENSOR_MAX, dim=[1, m, 1]).set_output(True).set_name("y")
    return g


def bench_rowmax(h, m, n, k, plain_ms, rounds=6):
    """matmul + row max as one fused launch (the reduction in the GEMM's epilogue, C never written) vs
    the plain pydnn matmul of the same shape and vs torch.mm(x, w).amax(-1)."""
    g = _rowmax_graph(h, m, n, k)
    g.build_operation_graph().create_execution_plans().build_plans()
    assert g.engine_index() == 1 and g.launches() == 1, (g.engine_index(), g.launches())
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    y = torch.empty(m, 1, device="cuda", dtype=torch.bfloat16)
    ws = torch.empty(max(g.get_workspace_size(), 1), device="cuda", dtype=torch.uint8)
    bufs = {"x": x.data_ptr(), "w": w.data_ptr(), "y": y.data_ptr()}
    ms_p, ms_t = time_pair(lambda: g.execute(bufs, ws.data_ptr()), lambda: torch.mm(x, w).amax(-1, keepdim=True),
                           rounds=rounds)
    torch.cuda.synchronize()
    ref = torch.mm(x.float(), w.float()).amax(-1, keepdim=True)
    err = float((y.float() - ref).abs().max() / ref.abs().max())
    row("rowmax", f"max(x@W, -1) {m}x{n}x{k} (rel {err:.1e})", "bf16", ms_p, ms_t, "mm.amax", flops=2.0 * m * n * k,
        note=f"| fused/plain pydnn matmul time {ms_p / plain_ms:.3f}x")


def _chain_graph(h, n=64, c=1024, w=4096, full=False):
    """The 8-op chain y = tanh(clip(gelu(x * s + b) * x - b, 0, 4)) + x; s [1, C, 1] and b [1, 1, W]
    (broadcast: the bytes moved are x and y), or (full) s and b of x's shape (four full tensors moved)."""
    g = Graph(io_data_type=BF16, handle=h)
    x = g.tensor(name="x", dim=[n, c, w])
    s = g.tensor(name="s", dim=[n, c, w] if full else [1, c, 1])
    b = g.tensor(name="b", dim=[n, c, w] if full else [1, 1, w])
    v = g.gelu(g.add(g.mul(x, s), b))
    v = g.tanh(g.relu(g.sub(g.mul(v, x), b), upper_clip=4.0))
    g.add(v, x).set_output(True).set_name("y")
    return g, None


def _chain_bytes(*tensors):
    """The bytes the chain must move: each input read once and y written once, every tensor at its own size
    (a broadcast s [1, C, 1] is C elements, not the output's N C W; 10 KB of the 1.07 GB here)."""
    return sum(t.numel() * t.element_size() for t in tensors)


def bench_chain(h, copy_gbs, n=64, c=1024, w=4096, rounds=6):
    """The chain at the defaults, s and b broadcast (x and y moved) and full-size (four tensors moved)."""
    for full in (False, True):
        g, _ = _chain_graph(h, n, c, w, full)
        g.build_operation_graph().create_execution_plans().build_plans()
        assert g.launches() == 1
        tx = torch.randn(n, c, w, device="cuda", dtype=torch.bfloat16)
        ts = torch.randn(*((n, c, w) if full else (1, c, 1)), device="cuda", dtype=torch.bfloat16)
        tb = torch.randn(*((n, c, w) if full else (1, 1, w)), device="cuda", dtype=torch.bfloat16)
        ty = torch.empty_like(tx)
        bufs = {"x": tx.data_ptr(), "s": ts.data_ptr(), "b": tb.data_ptr(), "y": ty.data_ptr()}

        def torch_chain():
            v = F.gelu(tx * ts + tb)
            return torch.tanh((v * tx - tb).clamp(0, 4)) + tx

        ms_p, ms_t = time_pair(lambda: g.execute(bufs, 0), torch_chain, rounds=rounds)
        what = "s, b full" if full else "s, b broadcast"
        row("chain8", f"8 ops, 3 inputs ({what}), {n}x{c}x{w}", "bf16", ms_p, ms_t, "torch eager",
            nbytes=_chain_bytes(tx, ts, tb, ty), copy_gbs=copy_gbs, note="(target >= 85% of copy)")
        del tx, ts, tb, ty


# --chain: the pointwise kernel's forms (pydnn.tuning.graph), label -> switches; "exact" is erff and tanhf /
# tanh_nonneg (PW_GELU_FAST and PW_TANH_FAST off: the defaults until the chain branch's second sitting),
# "fast" gelu_fast and tanh.approx.f32 (every output bfloat16: the defaults now)
EXACT = dict(PW_GELU_FAST=False, PW_TANH_FAST=False)
FAST = dict(PW_GELU_FAST=True, PW_TANH_FAST=True)
# (run 1's forms, H200 08:00, copy 4148 GB/s, us, broadcast: exact 4 runs 480.3; fast 16/SM 4 runs 338.6, 2 runs
# 323.1, 1 run 343.0; fast 4 waves 4 runs 339.1, 2 runs 319.2; fast 32/SM 1 run 332.0; deg 5 4 runs 330.2;
# prefetch 2 runs 324.3, 1 run 340.6; gelu_fast + tanh_nonneg 416.4. Full: exact 540.4, fast 500.5, fast
# prefetch 2 runs 508.0, fast 1 run 508.4)
def _f(runs, grid, minb=0, **kw):
    return dict(PW_SPLIT=True, PW_RUNS=runs, PW_GRID=grid, PW_MIN_BLOCKS=minb, **{**FAST, **kw})


CHAIN_FORMS = [
    ("exact, 16/SM, 4 runs (before)", dict(PW_SPLIT=True, PW_RUNS=4, PW_GRID=16, PW_MIN_BLOCKS=0, **EXACT)),
    ("fast, 16/SM, 4 runs (run 1 defaults)", _f(4, 16)),
    ("fast, 4 waves, 2 runs", _f(2, -4)),
    ("fast, 16/SM, 2 runs, min blocks 8", _f(2, 16, 8)),
    ("fast, 4 waves, 2 runs, min blocks 8", _f(2, -4, 8)),
    ("fast, deg 5, 16/SM, 2 runs, min blocks 8", _f(2, 16, 8, PW_GELU_DEG5=True)),
    ("fast, deg 5, 4 waves, 2 runs, min blocks 8", _f(2, -4, 8, PW_GELU_DEG5=True)),
    ("fast, deg 5, 4 waves, 2 runs", _f(2, -4, PW_GELU_DEG5=True)),
    ("fast, deg 5, 16/SM, 2 runs", _f(2, 16, PW_GELU_DEG5=True)),
    ("fast, deg 5, 8 waves, 2 runs, min blocks 8 (defaults)", _f(2, -8, 8, PW_GELU_DEG5=True)),
    ("fast, deg 5, 1 wave, 2 runs, min blocks 8", _f(2, 0, 8, PW_GELU_DEG5=True)),
    ("fast, deg 5, 32/SM, 1 run", _f(1, 32, PW_GELU_DEG5=True)),
    ("fast, deg 5, prefetch, 4 waves, 2 runs", _f(2, -4, PW_GELU_DEG5=True, PW_PREFETCH=True)),
]
CHAIN_FULL_FORMS = ("exact, 16/SM, 4 runs (before)", "fast, 16/SM, 4 runs (run 1 defaults)", "fast, 4 waves, 2 runs",
                    "fast, deg 5, 8 waves, 2 runs, min blocks 8 (defaults)")
# run 2 (H200, copy 4173 GB/s, us, broadcast / full): exact 476.0 / 541.4; fast 16/SM 4 runs 335.3 / 503.6; fast 4
# waves 2 runs 316.8 / 507.8; + min blocks 8: 16/SM 322.0, 4 waves 311.0; deg 5 + min blocks 8: 16/SM 307.3, 4 waves
# 295.7 (full, min blocks forced: 631.0, spilled), 8 waves 290.9 (88% of copy), 1 wave 333.7; deg 5 without min
# blocks: 4 waves 306.9, 16/SM 311.6; deg 5 32/SM 1 run 316.3; deg 5 prefetch 4 waves 313.6. The defaults now:
# the 8-waves form, where PW_MIN_BLOCKS_RUNS keeps the launch bounds off the full-size reading.
# SASS (sm_90, NVRTC 13.5, cuobjdump) of the vector loop, instructions an element: exact 46.6 (62 registers),
# gelu_fast + tanh_nonneg 38.5, fast 27.4 / 29.0 / 32.1 at 4 / 2 / 1 runs (54 / 38 / 32 registers; the
# prefetch form 29.0 at 2 runs in 61 registers, 96 at 4 runs, 40 at 1). The broadcast chain
# moves 1.07 GB: 0.259 ms at ~4150 GB/s copy = 32.2 cycles of one SM sub-partition a warp-element at 1.98
# GHz, against 27.4 issue cycles and 24 MUFU cycles (3 an element, 8 cycles a warp each) for the fast form.
# the first mid-session run (H200, copy 4166 GB/s, us; s, b broadcast / full): first form with tanhf 589.2 /
# 587.7, with tanh_nonneg 554.8 / -, split 524.0 / -, one wave 548.8 / 562.0, one wave 2 runs 553.9 / 552.6,
# one wave 4 runs 531.7 / 553.0, 16/SM 2 runs 497.0 / -, 16/SM 4 runs 480.6 / -, gelu_fast one wave 4 runs
# 446.6 / 512.1 (tools/PERF.md, "Graph: the 8-op pointwise chain")


def bench_chain_forms(h, copy_gbs, n=64, c=1024, w=4096, rounds=3):
    """Each CHAIN_FORMS form of the 8-op chain, broadcast s / b and full-size s / b, against torch eager in
    alternating rounds; GB/s of the bytes each must move against the copy measured in this run. Every
    kernel is compiled first, in parallel threads."""
    from concurrent.futures import ThreadPoolExecutor

    from pydnn import tuning
    from pydnn._build import loader
    from pydnn.graph import engines

    graphs, units = {}, []
    orig = engines._compile
    engines._compile = lambda handle, unit: units.append(unit)
    try:
        for full in (False, True):
            for label, sw in CHAIN_FORMS:
                if full and label not in CHAIN_FULL_FORMS:
                    continue
                with tuning.override({f"graph.{k}": v for k, v in sw.items()}):
                    g, _ = _chain_graph(h, n, c, w, full)
                    g.build_operation_graph().create_execution_plans().build_plans()
                graphs[(full, label)] = g
    finally:
        engines._compile = orig
    units = list({u.name: u for u in units}.values())  # forms differing in the grid only share a unit
    t0 = time.perf_counter()
    with ThreadPoolExecutor(16) as ex:
        list(ex.map(lambda u: loader.load_unit(h.arch, u), units))
    print(f"prebuild: {len(units)} units in {time.perf_counter() - t0:.1f} s", flush=True)
    for full in (False, True):
        tx = torch.randn(n, c, w, device="cuda", dtype=torch.bfloat16)
        shp = (n, c, w)
        ts = torch.randn(*(shp if full else (1, c, 1)), device="cuda", dtype=torch.bfloat16)
        tb = torch.randn(*(shp if full else (1, 1, w)), device="cuda", dtype=torch.bfloat16)
        ty = torch.empty_like(tx)
        bufs = {"x": tx.data_ptr(), "s": ts.data_ptr(), "b": tb.data_ptr(), "y": ty.data_ptr()}
        nbytes = _chain_bytes(tx, ts, tb, ty)
        want = torch.tanh((F.gelu(tx.float() * ts.float() + tb.float()) * tx.float() - tb.float()).clamp(0, 4)) \
            + tx.float()

        def torch_chain():
            v = F.gelu(tx * ts + tb)
            return torch.tanh((v * tx - tb).clamp(0, 4)) + tx

        what = "s, b full" if full else "s, b broadcast"
        for label, _ in CHAIN_FORMS:
            if (full, label) not in graphs:
                continue
            g = graphs[(full, label)]
            st = g._plan_obj.built.steps[0]
            ty.fill_(float("nan"))
            ms_p, ms_t = time_pair(lambda: g.execute(bufs, 0), torch_chain, rounds=rounds)
            torch.cuda.synchronize()
            err = float(((ty.float() - want).abs() / (want.abs() + tx.float().abs() + 1)).max())
            row("chain8", f"{what} [{label}] grid {st.grid[0]} (err {err:.1e})", "bf16", ms_p, ms_t, "torch eager",
                nbytes=nbytes, copy_gbs=copy_gbs, note="(target >= 85% of copy)")
        del tx, ts, tb, ty, want


def _norm_graph(h, rows, d, gelu):
    g = Graph(io_data_type=BF16, handle=h)
    x = g.tensor(name="x", dim=[rows, 1, d])
    sc = g.tensor(name="scale", dim=[1, 1, d], data_type=pydnn.PYDNN_DATA_FLOAT)
    b = g.tensor(name="bias", dim=[1, 1, d], data_type=pydnn.PYDNN_DATA_FLOAT)
    y, _, _ = g.layernorm(x, sc, b, 1e-5, norm_forward_phase=pydnn.PYDNN_NORM_FWD_INFERENCE)
    (g.gelu(y) if gelu else y).set_output(True).set_name("y")
    return g


def bench_norm_gelu(h, copy_gbs, rows=16384, d=4096, rounds=4):
    """gelu(layernorm(x) * scale + bias) as one graph (the GELU in the normalization kernel's epilogue: one
    launch) against the plain layer norm graph of the same shape (the issue's one-launch case should cost
    about the same) and torch F.gelu(F.layer_norm(...)); GB/s of x read and y written."""
    from pydnn import tuning

    gs = {}
    for gelu in (True, False, "fast"):
        with tuning.override({"graph.PW_GELU_FAST": gelu == "fast"}):
            g = _norm_graph(h, rows, d, bool(gelu))
            g.build_operation_graph().create_execution_plans().build_plans()
        assert not gelu or (g.engine_index() == 1 and g.launches() == 1), (g.engine_index(), g.launches())
        gs[gelu] = g  # the plain one: the node engine's layer norm call
    x = torch.randn(rows, 1, d, device="cuda", dtype=torch.bfloat16)
    sc = torch.rand(d, device="cuda") + 0.5
    b = torch.randn(d, device="cuda")
    y = torch.empty_like(x)
    bufs = {"x": x.data_ptr(), "scale": sc.data_ptr(), "bias": b.data_ptr(), "y": y.data_ptr()}
    scb, bb = sc.to(torch.bfloat16), b.to(torch.bfloat16)
    nbytes = 2 * x.numel() * 2
    ws = {k: torch.empty(max(g.get_workspace_size(), 1), device="cuda", dtype=torch.uint8) for k, g in gs.items()}
    wsp = {k: (w.data_ptr() if gs[k].get_workspace_size() else 0) for k, w in ws.items()}
    ms_f, ms_t = time_pair(lambda: gs[True].execute(bufs, wsp[True]),
                           lambda: F.gelu(F.layer_norm(x, (d,), scb, bb, 1e-5)), rounds=rounds)
    torch.cuda.synchronize()
    ref = F.gelu(F.layer_norm(x.float(), (d,), sc, b, 1e-5))
    err = float((y.float() - ref).abs().max())
    ms_n, ms_tn = time_pair(lambda: gs[False].execute(bufs, wsp[False]), lambda: F.layer_norm(x, (d,), scb, bb, 1e-5),
                        rounds=rounds)
    row("norm", f"gelu(layernorm) erff {rows}x{d} (abs err {err:.1e})", "bf16", ms_f, ms_t, "gelu(layer_norm)",
        nbytes=nbytes, copy_gbs=copy_gbs, note=f"| fused / plain layernorm graph time {ms_f / ms_n:.3f}x")
    row("norm", f"layernorm {rows}x{d} (plain, node engine)", "bf16", ms_n, ms_tn, "layer_norm", nbytes=nbytes,
        copy_gbs=copy_gbs)
    ms_q, ms_t = time_pair(lambda: gs["fast"].execute(bufs, wsp["fast"]),
                           lambda: F.gelu(F.layer_norm(x, (d,), scb, bb, 1e-5)), rounds=rounds)
    torch.cuda.synchronize()
    err = float((y.float() - ref).abs().max())
    row("norm", f"gelu(layernorm) gelu_fast (the 16-bit default) (abs err {err:.1e})", "bf16", ms_q, ms_t,
        "gelu(layer_norm)", nbytes=nbytes, copy_gbs=copy_gbs, note=f"| / plain layernorm graph time {ms_q / ms_n:.3f}x")


def bench_build(h, m=4096, n=4096, k=4096):
    t0 = time.perf_counter()
    g = fused_graph(h, m, n, k)
    g.build_operation_graph().create_execution_plans().build_plans()
    first = time.perf_counter() - t0
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        g = fused_graph(h, m, n, k)
        g.build_operation_graph().create_execution_plans().build_plans()
        times.append(time.perf_counter() - t0)
    print(f"build     fused matmul+bias+gelu: first build_plans {first * 1e3:.1f} ms (compile or disk cache), "
          f"cached {statistics.median(times) * 1e3:.2f} ms median (target <= 5 ms)", flush=True)
    bench_host(h)


def bench_host(h, m=128, n=256, k=64, reps=500):
    """Host microseconds of one Graph.execute on a built plan: a small fused graph (its kernel much shorter
    than the call, so the GPU queue never pushes back), `reps` calls between two syncs (fewer than the
    launch queue holds), median of 5 such runs; int pointers and torch tensors as buffers."""
    g = fused_graph(h, m, n, k)
    g.build_operation_graph().create_execution_plans().build_plans()
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    for label, bufs in (("int pointers", {"x": x.data_ptr(), "w": w.data_ptr(), "b": b.data_ptr(), "y": y.data_ptr()}),
                        ("torch tensors", {"x": x, "w": w, "b": b, "y": y})):
        g.execute(bufs, 0)
        torch.cuda.synchronize()
        runs = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(reps):
                g.execute(bufs, 0)
            runs.append((time.perf_counter() - t0) / reps)
            torch.cuda.synchronize()
        print(f"host      Graph.execute on a built plan ({label}, fused {m}x{n}x{k}): {statistics.median(runs) * 1e6:.1f} "
              f"us per call (target <= 10 us)", flush=True)


def bench_chain_host(h, dims=(4, 64, 256), reps=500, builds=20):
    """The host-side targets on the 8-op chain (a fused pointwise graph): build_plans of a graph whose kernel
    is already in the cache (a new Graph of the same program: the cubin is found by key, nothing compiles),
    median of `builds`, alone and with the graph's construction; host microseconds of one Graph.execute on
    the built plan (a small shape: the kernel is much shorter than the call, so the queue never pushes
    back), `reps` calls between syncs, median of 5 such runs, int pointers and torch tensors."""
    t0 = time.perf_counter()
    g, _ = _chain_graph(h, *dims)
    g.build_operation_graph().create_execution_plans().build_plans()
    first = time.perf_counter() - t0
    full, alone = [], []
    for _ in range(builds):
        t0 = time.perf_counter()
        g, _ = _chain_graph(h, *dims)
        g.build_operation_graph().create_execution_plans()
        t1 = time.perf_counter()
        g.build_plans()
        t2 = time.perf_counter()
        full.append(t2 - t0)
        alone.append(t2 - t1)
    print(f"build     8-op chain {dims}: first build {first * 1e3:.1f} ms (compile or disk cache); cached: "
          f"build_plans {statistics.median(alone) * 1e3:.2f} ms, with the graph's construction "
          f"{statistics.median(full) * 1e3:.2f} ms, medians of {builds} (target <= 5 ms)", flush=True)
    n, c, w = dims
    tx = torch.randn(n, c, w, device="cuda", dtype=torch.bfloat16)
    ts = torch.randn(1, c, 1, device="cuda", dtype=torch.bfloat16)
    tb = torch.randn(1, 1, w, device="cuda", dtype=torch.bfloat16)
    ty = torch.empty_like(tx)
    for label, bufs in (("int pointers", {"x": tx.data_ptr(), "s": ts.data_ptr(), "b": tb.data_ptr(),
                                          "y": ty.data_ptr()}),
                        ("torch tensors", {"x": tx, "s": ts, "b": tb, "y": ty})):
        g.execute(bufs, 0)
        torch.cuda.synchronize()
        runs = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(reps):
                g.execute(bufs, 0)
            runs.append((time.perf_counter() - t0) / reps)
            torch.cuda.synchronize()
        print(f"host      Graph.execute on a built plan ({label}, 8-op chain {dims}): "
              f"{statistics.median(runs) * 1e6:.1f} us per call (target <= 10 us)", flush=True)


def _forced_plan(h, dtype, m, n, k, tile):
    """pydnn.ops.matmul's plan with `tile` forced (None: the chooser's)."""
    from pydnn.ops import matmul as M

    orig = M._choose_tile
    if tile is not None:
        M._choose_tile = lambda *a: tile
    try:
        return M.gemm_plan(h, dtype, m, n, k)
    finally:
        M._choose_tile = orig


def _variants():
    """(label, tile, WG_PERSIST) of the wgmma 128x256 forms compared by --ab."""
    from pydnn.ops import matmul as M

    # the one-block-a-tile form from a unit of its nn kernel alone (compile time: matmul.wgmma.bf16 has 8)
    one = M.WgTile(256, 4, 1.6, unit="matmul.wgbench")
    return [("one block a tile", one, False), ("persistent", M.WG_PERSIST_TILE, True)] + \
        [(f"cand {t}", t, True) for t in M.WG_CANDIDATES]


def prebuild_ab(h, shapes):
    """Compile every unit --ab uses in parallel threads first (NVRTC releases the GIL): the wgmma units and
    the fused graphs' generated units (collected by building each graph once with the compile deferred)."""
    from concurrent.futures import ThreadPoolExecutor

    from pydnn import tuning
    from pydnn._build import loader
    from pydnn.graph import engines
    from pydnn.ops import matmul as M

    from pydnn._build.manifest import KernelUnit

    M.wgmma_extra_units()
    loader.register_units([KernelUnit("matmul.wgbench.bf16", "matmul.cu", (M.WG_TILES[0].expr("bf16", False, False),),
                                      archs=(M.WG_ARCH + "a",)),
                           KernelUnit("matmul.wgbench2.bf16", "matmul.cu", (M.WG_TILES[1].expr("bf16", True, False),),
                                      archs=(M.WG_ARCH + "a",))])
    units = []
    orig = engines._compile
    engines._compile = lambda handle, unit: units.append(unit)
    try:
        for _, tile, persist in _variants():
            tuning.matmul.WG_PERSIST = persist
            g = _fused_forced(h, shapes[0], tile)
        tuning.matmul.reset()
        for build in (lambda: _rowmax_graph(h, *shapes[0]), lambda: _chain_graph(h)[0],
                      lambda: fused_graph(h, *shapes[0], residual=True)):
            g = build()
            g.build_operation_graph().create_execution_plans().build_plans()
    finally:
        engines._compile = orig
        tuning.matmul.reset()
    names = {"matmul.wgbench.bf16", "matmul.wgbench2.bf16", "matmul.wgmmap.bf16", "matmul.bf16.tn",
             "matmul.wgmmas.bf16"} | \
        {f"{t.unit}.bf16" for t in M.WG_CANDIDATES}
    units += [loader._unit(nm, h.arch) for nm in sorted(names)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(16) as ex:
        list(ex.map(lambda u: loader.load_unit(h.arch, u), units))
    print(f"prebuild: {len(units)} units in {time.perf_counter() - t0:.1f} s", flush=True)
    del g


def _fused_forced(h, shape, tile):
    from pydnn.ops import matmul as M

    orig = M._choose_tile
    M._choose_tile = lambda *a: tile
    try:
        g = fused_graph(h, *shape)
        g.build_operation_graph().create_execution_plans().check_support().build_plans()
    finally:
        M._choose_tile = orig
    return g


def bench_wgrad_shapes(h, tiles=True):
    """The GPT demo's Linear weight gradients dW = dY^T X (A transposed: [K][M] row-major, K = 16384 tokens,
    small M x N): the chooser's kernel and, forced, the wgmma tiles, against torch.mm(dy.t(), x)."""
    from pydnn.ops import matmul as M

    for m, n, k in ((384, 1152, 16384), (1536, 384, 16384)):
        a = torch.randn(k, m, device="cuda").to(torch.bfloat16)   # dY: [tokens][m], used transposed
        b = torch.randn(k, n, device="cuda").to(torch.bfloat16)   # X: [tokens][n]
        c, out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16), torch.empty(m, n, device="cuda",
                                                                                      dtype=torch.bfloat16)
        wg128 = M.WgTile(128, 3, 1.3, per_sm=2, unit="matmul.wgbench2")  # WG_TILES[1] from a one-kernel unit
        variants = [("chooser", None), ("split-K", "split")] + \
            ([(f"{t}", t) for t in (wg128, M.WG_PERSIST_TILE)] if tiles else [])
        for label, tile in variants:
            orig = M._choose_tile
            if tile is not None and tile != "split":
                M._choose_tile = lambda *x, _t=tile: _t
            try:
                plan = M.gemm_plan(h, BF16, m, n, k, trans_a=True, split_k=tile == "split")
            finally:
                M._choose_tile = orig
            if tile == "split":
                label += f" {plan.split}"
            ap, bp, cp = a.data_ptr(), b.data_ptr(), c.data_ptr()
            ws = torch.empty(max(plan.ws_bytes, 1), dtype=torch.uint8, device="cuda")  # split-K: the caller's
            wp, wn = ws.data_ptr(), plan.ws_bytes
            ms_p, ms_t = time_pair(lambda: plan.launch(h, ap, bp, cp, 1.0, 0.0, 0, wp, wn),
                                   lambda: torch.mm(a.t(), b, out=out), rounds=3)
            torch.cuda.synchronize()
            err = float((c.float() - out.float()).abs().max() / out.float().abs().max())
            row("wgrad", f"{m}x{n}x{k} tn [{label}] (rel {err:.1e})", "bf16", ms_p, ms_t, "torch.mm",
                flops=2.0 * m * n * k, note=plan.describe()[0].split("<")[0].split("::")[-1])
        del a, b, c, out


def bench_ab(h, copy_gbs):
    """The mid-session comparison (branch graph): the 128x256 wgmma tile one block a tile, persistent, and
    the WG_CANDIDATES, plain (16384x4096x4096 and 8192^3) and fused gelu(x@W+b), each against torch in
    alternating rounds; then the rowmax, chain and host rows at the defaults."""
    from pydnn import tuning

    s = (16384, 4096, 4096)
    prebuild_ab(h, [s])
    plain = {}
    for shape in (s, (8192, 8192, 8192)):
        m, n, k = shape
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        w = torch.randn(k, n, device="cuda").to(torch.bfloat16)
        c, out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16), torch.empty(m, n, device="cuda",
                                                                                      dtype=torch.bfloat16)
        for label, tile, _ in _variants():
            plan = _forced_plan(h, BF16, m, n, k, tile)
            xp, wp, cp = x.data_ptr(), w.data_ptr(), c.data_ptr()
            ms_p, ms_t = time_pair(lambda: plan.launch(h, xp, wp, cp), lambda: torch.mm(x, w, out=out), rounds=3)
            torch.cuda.synchronize()
            err = float((c.float() - out.float()).abs().max() / out.float().abs().max())
            row("matmul", f"{m}x{n}x{k} [{label}] (rel {err:.1e})", "bf16", ms_p, ms_t, "torch.mm",
                flops=2.0 * m * n * k)
            plain[(shape, label)] = ms_p
            if label == "persistent":  # the raster's group of tile rows (a launch parameter)
                for gm in (4, 16):
                    plan.fast.params.group_m = min(gm, plan.fast.params.tiles_m)
                    ms_p, ms_t = time_pair(lambda: plan.launch(h, xp, wp, cp), lambda: torch.mm(x, w, out=out),
                                           rounds=3)
                    row("matmul", f"{m}x{n}x{k} [{label}, group_m {gm}]", "bf16", ms_p, ms_t, "torch.mm",
                        flops=2.0 * m * n * k)
        del x, w, c, out
    m, n, k = s
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(k, n, device="cuda", dtype=torch.bfloat16) * 0.02
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    bufs = {"x": x.data_ptr(), "w": w.data_ptr(), "b": b.data_ptr(), "y": y.data_ptr()}
    ref = F.gelu(torch.addmm(b, x, w).float())
    for label, tile, persist in _variants():
        tuning.matmul.WG_PERSIST = persist
        g = _fused_forced(h, s, tile)
        tuning.matmul.reset()
        assert g.launches() == 1
        ms_p, ms_t = time_pair(lambda: g.execute(bufs, 0), lambda: F.gelu(torch.addmm(b, x, w)), rounds=3)
        torch.cuda.synchronize()
        err = float((y.float() - ref).abs().max() / ref.abs().max())
        row("fused", f"gelu(x@W+b) {m}x{n}x{k} [{label}] (rel {err:.1e})", "bf16", ms_p, ms_t, "gelu(addmm)",
            flops=2.0 * m * n * k, note=f"| fused/plain same tile {ms_p / plain[(s, label)]:.3f}x, "
                                        f"/plain one-block {ms_p / plain[(s, 'one block a tile')]:.3f}x")
    del x, w, b, y, ref
    bench_wgrad_shapes(h)
    bench_rowmax(h, *s, plain[(s, "persistent")], rounds=2)
    bench_chain(h, copy_gbs, rounds=2)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true", help="small shapes only (a smoke run)")
    p.add_argument("--ab", action="store_true", help="with --quick: the wgmma forms compared (bench_ab)")
    p.add_argument("--chain", action="store_true", help="the 8-op chain's kernel forms only (bench_chain_forms)")
    p.add_argument("--norm", action="store_true", help="layernorm + GELU fused vs plain only (bench_norm_gelu)")
    args = p.parse_args()
    h = pydnn.create()
    pydnn.set_stream(h, torch.cuda.current_stream().cuda_stream)
    torch.backends.cuda.matmul.allow_tf32 = False
    src = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy_gbs = 2 * src.numel() / time_ms(lambda: dst.copy_(src)) / 1e6
    print(f"device: {torch.cuda.get_device_name()}  copy {copy_gbs:.0f} GB/s  torch {torch.__version__}", flush=True)
    if args.chain or args.norm:
        if args.chain:  # the host rows first: a timeout cuts the last forms, not them
            bench_chain_host(h)
            bench_chain_forms(h, copy_gbs)
        if args.norm:
            bench_norm_gelu(h, copy_gbs)
        return
    if args.quick and args.ab:
        bench_ab(h, copy_gbs)
        return
    if args.quick:  # the mid-session check: one 7B projection shape, the chain, the host time
        s = (16384, 4096, 4096)
        plain = bench_matmul(h, BF16, *s, f"7B projection {s[0]}x{s[1]}x{s[2]}")
        bench_fused(h, *s, plain, rounds=2, residual=False)
        bench_rowmax(h, *s, plain, rounds=2)
        bench_chain(h, copy_gbs, rounds=2)
        bench_host(h)
        return
    bench_matmul(h, BF16, 8192, 8192, 8192, "8192^3")
    shapes = ((16384, 4096, 4096), (16384, 11008, 4096))
    plain = {s: bench_matmul(h, BF16, *s, f"7B projection {s[0]}x{s[1]}x{s[2]}") for s in shapes}
    bench_matmul(h, pydnn.PYDNN_DATA_FLOAT, 4096, 4096, 4096, "4096^3 (no TF32)")
    for s in shapes:
        bench_fused(h, *s, plain[s])
        bench_rowmax(h, *s, plain[s])
    bench_chain(h, copy_gbs)
    bench_norm_gelu(h, copy_gbs)
    bench_build(h)


if __name__ == "__main__":
    main()
