"""Where a training step of the PyTorch demos spends its time, pydnn.torch beside plain PyTorch (cuDNN).

For each demo (examples/train_cnn.py's digits CNN, examples/train_gpt.py's byte-level GPT; the demos' own
models, optimizers, bf16 autocast and batch sizes) and each backend:
  1. N training steps under torch.profiler (CPU + CUDA activity): the wall time per step, the GPU-busy time
     per step (the union of every kernel / copy / memset interval inside the steps' window) and the GPU-idle
     share = 1 - busy / wall, and the top host-side costs (the profiler's CPU ops by self time per step);
  2. N steps under cProfile: the top Python functions by own time per step (pydnn.torch's and pydnn's host
     code shows up here, which the profiler's op list does not name);
  3. CNN only: per-layer timing with CUDA events recorded by module hooks (forward: pre-hook to hook;
     backward: full backward pre-hook to full backward hook), pydnn and PyTorch side by side, so the gap in
     step time can be attributed to layers (event-to-event device time: includes GPU idle inside a layer
     when the host is slower than the kernels).

    python tools/profile_torch_step.py                    # both demos, 30 profiled steps each
    python tools/profile_torch_step.py --quick            # ~25 s: fewer steps, a smaller GPT corpus
    python tools/profile_torch_step.py --demos cnn --steps 50 --out prof/
    python tools/profile_torch_step.py --demos rnn        # pydnn.torch.LSTM against nn.LSTM (cuDNN)
    python tools/profile_torch_step.py --prebuild-only --demos gpt,cnn   # compile the demos' units (~30 s)
    python tools/profile_torch_step.py --demos gpt --gpt-size demo --ab torch.LINEAR_DW_KSPLIT=0
    python tools/profile_torch_step.py --ops-only         # the GPT demo's ops one at a time (gpt_ops), ~10 s
    python tools/profile_torch_step.py --graph-check 30   # eager vs whole-step CUDA graph losses (diverges)
Results: printed, and written to OUT/profile_torch_step.{md,json} (OUT: --out, else $OUT, else .).
"""
import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import sys
import time
from types import SimpleNamespace

import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))
sys.path.insert(0, ROOT)

import train_cnn  # noqa: E402
import train_gpt  # noqa: E402


# ------------------------------------------------------------------------------------------ the demos
class Dev:
    """The piece of examples/_common.Dist the demos' helpers read (one GPU, rank 0)."""
    world, rank, local_rank, main = 1, 0, 0, True

    def __init__(self):
        self.device = torch.device("cuda", torch.cuda.current_device())


def cnn_setup(backend, dev, batch, channels_last=False, cuda_graph=False, fuse=True):
    torch.manual_seed(0)
    try:
        xtr, ytr, _, _ = train_cnn.load_digits(dev.device, 0)
    except SystemExit:  # no scikit-learn here: the same shapes of random data (timing does not read values)
        print("scikit-learn missing: random 3x32x32 images stand in for the digits", flush=True)
        xtr = torch.randn(1438, 3, 32, 32, device=dev.device)
        ytr = torch.randint(0, 10, (1438,), device=dev.device)
    init = train_cnn.build("torch").state_dict()
    model = train_cnn.build(backend, fuse=fuse).to(dev.device)
    model.load_state_dict(init)
    mf = torch.channels_last if channels_last else torch.contiguous_format
    model.to(memory_format=mf)
    undo = cuda_graph != "step_keep"  # (graph_check: the warm-up's steps kept, PyTorch's recipe as it is)
    if cuda_graph == "step_keep":
        cuda_graph = "step"
    whole = cuda_graph == "step"
    if whole or cuda_graph == "capturable":  # --cuda-graph step: capturable AdamW, tensor learning rate
        opt = torch.optim.AdamW(model.parameters(), lr=torch.tensor(3e-3, device=dev.device), weight_decay=0.05,
                                capturable=True)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.05)
    g = torch.Generator(device="cpu").manual_seed(0)
    batches = []
    for _ in range(4):
        idx = torch.randperm(len(ytr), generator=g)[:batch].to(dev.device)
        batches.append((xtr[idx].contiguous(memory_format=mf), ytr[idx]))
    if cuda_graph == "capturable":
        cuda_graph = ""  # (graph_check: the eager step with the step graph's optimizer)
    if cuda_graph and not whole:  # the demo's --cuda-graph: forward and backward replayed as CUDA graphs
        model = train_cnn.graphed(model, batches[0][0], channels_last)
    state = {"i": 0}
    if whole:  # the whole step one graph (train_cnn.graphed_step; diverges: PERF.md, session 29)
        replay = train_cnn.graphed_step(model, opt, *batches[0], undo=undo)

        def step():
            xb, yb = batches[state["i"] % len(batches)]
            state["i"] += 1
            return replay(xb, yb)
        return model, step, batches[0][0]

    def step():
        xb, yb = batches[state["i"] % len(batches)]
        state["i"] += 1
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(xb), yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss
    return model, step, batches[0][0]


def gpt_args(quick, torch_linear=False, size="small", layers=0):
    """small: 6 x d384, 64 x 256 tokens (host-bound; the demo's first default); demo: train_gpt.py's default
    (12 x d768, 12:4 heads, 64 x 1024 tokens); layers > 0 overrides the layer count (a shorter demo-size step)."""
    if size == "demo":
        a = SimpleNamespace(batch_size=64, seq=1024, d_model=768, n_layer=12, n_head=12, n_kv_head=4)
    else:
        a = SimpleNamespace(batch_size=64, seq=256, d_model=384, n_layer=6, n_head=6, n_kv_head=2)
    if layers:
        a.n_layer = layers
    a.__dict__.update(norm="rms", dropout=0.0, lr=1e-3, torch_linear=torch_linear, torch_sdpa="cudnn",
                      corpus_mb=1.0 if quick else 4.0)
    return a


def gpt_setup(backend, dev, args):
    import pydnn.torch as pt
    data, _, _ = train_gpt.corpus(int(args.corpus_mb * 2 ** 20))
    if backend == "pydnn":
        attn = pt.scaled_dot_product_attention
    else:
        attn = train_gpt.torch_attention(train_gpt.probe_torch_attention(args, dev.device))
    torch.manual_seed(0)
    init = train_gpt.GPT(args, "torch", None).state_dict()
    model = train_gpt.GPT(args, backend, attn).to(dev.device)
    model.load_state_dict(init)
    train_gpt.fuse(model, backend, args)
    decay = [p for _, p in model.named_parameters() if p.dim() == 2]
    other = [p for _, p in model.named_parameters() if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), fused=True)
    gen = torch.Generator().manual_seed(0)
    batches = [train_gpt.batches(data, args, dev, gen) for _ in range(4)]
    state = {"i": 0}

    def step():
        x, y = batches[state["i"] % len(batches)]
        state["i"] += 1
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x).float().view(-1, 256), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss
    return model, step


def rnn_setup(backend, dev):
    """A 2-layer LSTM (input 256, hidden 512, sequence 64, batch 32) with a linear head, bf16 autocast, AdamW:
    pydnn.torch.LSTM against nn.LSTM (cuDNN)."""
    import pydnn.torch as pt
    torch.manual_seed(0)
    ref = nn.LSTM(256, 512, num_layers=2)
    lstm = pt.LSTM(256, 512, num_layers=2) if backend == "pydnn" else nn.LSTM(256, 512, num_layers=2)
    lstm.load_state_dict(ref.state_dict())
    head = nn.Linear(512, 256)
    model = nn.ModuleDict({"lstm": lstm, "head": head}).to(dev.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    x = torch.randn(64, 32, 256, device=dev.device)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = model["head"](model["lstm"](x)[0])
            loss = F.mse_loss(y.float(), x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss
    return model, step


# The kernel units a CNN-demo step loads (bf16 autocast, NCHW, batch 256, this tree's default planners): found
# by replaying the step's pydnn calls on a stub handle (every kernel lookup recorded). --prebuild compiles them
# in parallel before the first step instead of one at a time on first use (a fresh machine: ~30 s, most of it
# convolution.bf16); a unit this list misses still compiles on first use.
CNN_UNITS = ("batchnorm.bf16", "conv_bias.bf16", "conv_gemm.bf16", "convolution.bf16", "convolution.wgmma.bf16",
             "convolution.wgrad.bf16", "matmul.bf16.nn", "matmul.bf16.tn", "matmul.wgmma.bf16",
             "matmul.wgmmas.bf16", "pooling.bf16", "tensor_ops.transform.h16",
             "convolution.tma.bf16.bn128",  # (the second block's NHWC forward; the tma units are split by tile N)
             "tensor_ops.transform.f32",  # (tuning.torch.BLOCK_NHWC: the float32 weight cast in its NHWC transform)
             "tensor_ops.h16", "tensor_ops.rows.h16")  # (tuning.torch.LINEAR_LEAN: the bias by add_tensor)
# The GPT demo's (default size, 64 x 1024 tokens; the same stub replay over tools/profile_torch_host_cpu.py
# --demo gpt --batch 64), with the units its variants take: LINEAR_DW_SPLITK (convolution.wgrad: wgrad_tc_wgmma
# + wgrad_fold), LINEAR_DW_KSPLIT (the batched dW on gemm_tma / gemm_wgmma_p) and the split-K matmul; and
# attention.ws_bwd, which the stub cannot show (its driver encodes no tensor maps, so the replay's backward
# falls back to attn_wgb; a GPU runs bwd_ws); the forward at d 64: attention.ws.gh (TMA: WS_C3 + WS_GH + WS_AL),
# attention.ws.q2 (cp.async where TMA is refused)
GPT_UNITS = ("activation.h16", "attention.bf16", "attention.wgmma_bwd.bf16", "attention.ws.gh.bf16", "attention.ws.q2.bf16",
             "attention.ws_bwd.bf16", "matmul.bf16.tn",
             "matmul.tma.bf16", "matmul.wgmmap.bf16", "matmul.wgmmas.bf16", "normalization.f32",
             "convolution.wgrad.bf16")


def prebuild(names, mlp=False):
    """Compile the named kernel units (those this GPU's arch builds) that the cache lacks, in parallel; with
    mlp, meanwhile (another thread: NVRTC releases the GIL) the fused MLP's two generated GEMMs (the GPT demo's
    bf16 tanh block, tuning.torch.FUSE_MLP), which its graphs would otherwise compile at their first call."""
    import threading
    from pydnn._build import build, manifest
    t0 = time.perf_counter()
    # the device arch's units: a family's expression lists differ by arch (convolution.bf16 for sm_90 is not the
    # generic manifest's), so the generic ones compiled units the GPU never loads (session 31's mid-session runs:
    # each demo then compiled convolution.bf16 itself)
    try:
        major, minor = torch.cuda.get_device_capability()
        arch = f"sm_{major}{minor}"
    except Exception:  # noqa: BLE001 - no GPU (a CPU test): the generic manifest
        arch = None
    by_name = manifest.unit_by_name(arch)
    units = [by_name[n] for n in names if n in by_name]
    missing = [n for n in names if n not in by_name]
    th = None
    if mlp:
        def graphs():
            from pydnn.torch import _core as C
            from pydnn.torch import functional as PF
            t1 = time.perf_counter()
            try:
                PF._mlp_build(C.handle_for(torch.device("cuda")), torch.bfloat16, 65536, 768, 3072, 768, "tanh")
                print(f"prebuild: the fused MLP's graphs built in {time.perf_counter() - t1:.1f} s", flush=True)
            except Exception as e:  # noqa: BLE001 - reported; the demo then builds (or falls back) itself
                print(f"prebuild: the fused MLP's graphs failed: {type(e).__name__}: {e}", flush=True)
        th = threading.Thread(target=graphs)
        th.start()
    # progress lines on stderr: a prebuild killed by a time limit still shows how far it got
    compiled, cached = build.build_all(units=units, progress=True)
    if th is not None:
        th.join()
    print(f"prebuild: {compiled} kernel units compiled, {cached} cached in {time.perf_counter() - t0:.1f} s"
          + (f" (not in this tree's manifest: {missing})" if missing else ""), flush=True)


# ------------------------------------------------------------------------------------------ measurements
def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _union(iv):
    iv = sorted(iv)
    total, cur = 0.0, None
    for a, b in iv:
        if cur is None or a > cur[1]:
            if cur is not None:
                total += cur[1] - cur[0]
            cur = [a, b]
        else:
            cur[1] = max(cur[1], b)
    if cur is not None:
        total += cur[1] - cur[0]
    return total


# GPU kernel name -> the op family it belongs to (pydnn's and PyTorch's / cuDNN's / cuBLAS's names), first match
_KFAM = (("optimizer (AdamW)", ("multi_tensor_apply", "fused_adam", "adamw")),
         ("attention", ("attention", "attn", "fmha", "flash", "sdpa", "cudnn_generated_fort_native_sdpa")),
         ("conv bias gradient", ("bias_grad",)),
         ("convolution", ("conv::", "conv_wgrad", "conv_gemm", "conv_wino", "convolve", "convolution", "dgrad", "wgrad",
                          "fprop", "implicit_gemm", "implicitgemm", "xmma_fprop", "im2col", "cutlass__5x_cudnn")),
         ("matmul", ("matmul", "gemm", "cutlass", "cublas", "sm90_xmma", "splitk", "nvjet", "ampere_bf16",
                     "sm80_xmma")),
         ("batch norm", ("bn::", "batch_norm", "batchnorm", "bn_fw", "bn_bw")),
         ("layer / RMS norm", ("norm",)),
         ("pooling", ("pool",)),
         ("layout copies (NCHW <-> NHWC)", ("transpose", "nchwtonhwc", "nhwctonchw", "map_strided", "transform")),
         ("loss (log_softmax / nll)", ("softmax", "nll_loss", "cross_entropy")),
         ("embedding", ("embedding", "indexing_backward", "index_select", "gather", "scatter")),
         ("activation", ("act_", "act::", "gelu", "relu", "silu", "threshold", "activation")),
         ("reductions (sum)", ("reduce_kernel", "reduce")),
         ("fill / copy / dtype cast", ("fill", "copy", "memset", "memcpy")),
         ("element-wise (add, mul, cast)", ("elementwise", "vectorized", "unrolled", "binary", "add", "mul")))


# families whose forward and backward kernels are told apart by name (pydnn's "bwd", cuDNN's "bprop",
# PyTorch's "Backward"): the GPT demo's attention, norms and GELU, each side's own share
_SPLIT_FAM = ("attention", "layer / RMS norm", "activation")
_BWD_KEYS = ("bwd", "bprop", "backward", "dq_convert", "dkdv", "norm::finish")


def kernel_family(name):
    low = name.lower()
    for fam, keys in _KFAM:
        if any(k in low for k in keys):
            if fam in _SPLIT_FAM:
                return fam + (" backward" if any(k in low for k in _BWD_KEYS) else " forward")
            return fam
    return "other"


def profile_steps(step, n, top):
    """n steps under torch.profiler -> dict: wall ms / step, GPU-busy ms / step, idle share over the wall
    window and over the GPU's own span, kernels per step, top host ops by self CPU time per step."""
    from torch.profiler import ProfilerActivity, profile, record_function
    _sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(n):
            with record_function("train_step"):
                step()
        _sync()
        wall_ms = (time.perf_counter() - t0) * 1e3
    steps, gpu = [], []
    kern = {}  # GPU activity name -> [total µs, count]
    for e in prof.events():
        dt = str(getattr(e, "device_type", ""))
        # record_function ranges ("train_step", "Optimizer.step#AdamW.step") are mirrored on the GPU timeline
        # as user annotations spanning the whole step: counted as busy, they made the idle share ~0 (torch 2.11)
        if dt.endswith("CUDA") and (getattr(e, "is_user_annotation", False) or e.name == "train_step"
                                    or "#" in e.name):
            continue
        if dt.endswith("CUDA"):
            gpu.append((e.time_range.start, e.time_range.end))
            k = kern.setdefault(e.name, [0.0, 0])
            k[0] += e.time_range.end - e.time_range.start
            k[1] += 1
        elif e.name == "train_step":
            steps.append((e.time_range.start, e.time_range.end))
    res = {"steps": n, "wall_ms_per_step": wall_ms / n, "kernels_per_step": len(gpu) / n}
    if steps and gpu:
        w0 = min(a for a, _ in steps)
        w1 = max(max(b for _, b in steps), max(b for _, b in gpu))
        inside = [(max(a, w0), min(b, w1)) for a, b in gpu if b > w0 and a < w1]
        busy = _union(inside)
        span = max(b for _, b in gpu) - max(w0, min(a for a, _ in gpu))
        res.update(window_ms_per_step=(w1 - w0) / 1e3 / n, gpu_busy_ms_per_step=busy / 1e3 / n,
                   gpu_idle_share=1.0 - busy / (w1 - w0),
                   gpu_idle_share_of_gpu_span=max(0.0, 1.0 - busy / span) if span > 0 else float("nan"),
                   host_ms_per_step=sum(b - a for a, b in steps) / 1e3 / n)
    fams = {}
    for name, v in kern.items():
        f = fams.setdefault(kernel_family(name), [0.0, 0])
        f[0] += v[0]
        f[1] += v[1]
    res["gpu_by_family"] = {k: {"us_per_step": round(v[0] / n, 1), "kernels_per_step": round(v[1] / n, 2)}
                            for k, v in sorted(fams.items(), key=lambda kv: -kv[1][0])}
    res["top_gpu_kernels"] = [{"kernel": name, "us_per_step": round(v[0] / n, 1), "calls_per_step": round(v[1] / n, 2)}
                              for name, v in sorted(kern.items(), key=lambda kv: -kv[1][0])[:top]]
    rows = []
    for a in prof.key_averages():
        if a.key == "train_step" or str(getattr(a, "device_type", "")).endswith("CUDA"):
            continue
        self_us = getattr(a, "self_cpu_time_total", 0.0)
        if self_us <= 0:
            continue
        rows.append((self_us / n, a.count / n, a.key))
    rows.sort(reverse=True)
    res["top_host_ops"] = [{"op": k, "self_us_per_step": round(us, 1), "calls_per_step": round(c, 2)}
                           for us, c, k in rows[:top]]
    return res


def _bucket(fn, name):
    """Who owns a cProfile entry's own time: the bridge (pydnn/torch), a pydnn op family (pydnn/ops/<x>),
    pydnn's launch / build / driver layer, the rest of pydnn, PyTorch's Python, PyTorch's C functions called
    from Python (tensor allocation, casts, ...), or other Python / C."""
    f = fn.replace("\\", "/")
    if "/pydnn/torch/" in f:
        return "pydnn.torch (the bridge)"
    if "/pydnn/ops/" in f:
        return "pydnn.ops." + f.split("/pydnn/ops/", 1)[1].split("/", 1)[0].removesuffix(".py")
    if "/pydnn/graph/" in f:
        return "pydnn.graph"
    if "/pydnn/_cuda/" in f or "/pydnn/_build/" in f or "cuda/bindings" in f or "cuda.bindings" in name:
        return "pydnn launch / driver"
    if "/pydnn/" in f:
        return "pydnn (other: api wrapper, descriptors, buffers)"
    if "/torch/" in f:
        return "torch (Python)"
    if fn == "~":
        if "torch" in name or "Tensor" in name or "Engine" in name:
            return "torch (C, called from Python)"
        return "builtins"
    return "other Python"


def entry_hits():
    """{public function: calls its compiled entry answered so far} (pydnn/_build/fastcall.py: activation_forward's
    act_stats and the map kinds' map_stats; calls that never enter Python, so cProfile does not see them); {} where
    the compiled entries are not built."""
    from pydnn._build import fastcall

    lib = fastcall._state.get("lib")
    if lib is None or not hasattr(lib, "map_stats"):
        return {}
    hits = lib.map_stats()[0]
    out = {name: hits[k] for name, k in fastcall.MAP_KINDS.items() if k < len(hits)}
    out["activation_forward"] = lib.act_stats()[0]
    return out


def cprofile_steps(step, n, top, details=None):
    """n steps under cProfile: the top Python functions by own time (tottime) per step. With a dict as
    `details`, also fills details["buckets"] (own time per owner, _bucket) and details["api"] (every public
    pydnn function the step called: its cumulative time and calls per step, from the entries that the
    pydnn.status api wrapper calls) and details["entries"] (calls per step that compiled entries answered: no Python
    frame, so not in the other two)."""
    _sync()
    h0 = entry_hits()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(n):
        step()
    _sync()
    pr.disable()
    h1 = entry_hits()
    st = pstats.Stats(pr, stream=io.StringIO())
    rows = []
    buckets, api = {}, []
    for (fn, line, name), (cc, nc, tt, ct, callers) in st.stats.items():
        short = fn.replace(ROOT + os.sep, "")
        if "site-packages" in short:
            short = "..." + short.split("site-packages", 1)[1]
        rows.append((tt / n * 1e6, ct / n * 1e6, nc / n, f"{short}:{line}({name})"))
        b = _bucket(fn, name)
        buckets[b] = buckets.get(b, 0.0) + tt / n * 1e6
        # a public function's body: called by status.api's wrapper (every pydnn.<function> goes through it)
        if any(c[0].replace("\\", "/").endswith("pydnn/status.py") and c[2] == "wrapper" for c in callers):
            api.append({"function": name, "cum_us_per_step": round(ct / n * 1e6, 1), "calls_per_step": round(nc / n, 2),
                        "us_per_call": round(ct / max(nc, 1) * 1e6, 1), "where": f"{short}:{line}"})
    rows.sort(reverse=True)
    if details is not None:
        details["buckets"] = {k: round(v, 1) for k, v in sorted(buckets.items(), key=lambda kv: -kv[1])}
        details["api"] = sorted(api, key=lambda r: -r["cum_us_per_step"])
        details["entries"] = {k: round((h1[k] - h0.get(k, 0)) / n, 2) for k in sorted(h1) if h1[k] > h0.get(k, 0)}
    return [{"function": f, "own_us_per_step": round(t, 1), "cum_us_per_step": round(c, 1),
             "calls_per_step": round(k, 2)} for t, c, k, f in rows[:top]]


def timed_steps(step, n):
    """n steps without any profiler, as the demos time them (examples/_common.StepTimer: CUDA events around
    each step, no sync inside the loop): median step ms (events) and mean ms per step from the first step's
    start event to the last one's end event (gaps between steps included)."""
    ev = []
    _sync()
    t0 = time.perf_counter()
    for _ in range(n):
        a = torch.cuda.Event(enable_timing=True)
        a.record()
        step()
        b = torch.cuda.Event(enable_timing=True)
        b.record()
        ev.append((a, b))
    host_ms = (time.perf_counter() - t0) * 1e3 / n  # the host's own pace (it may run ahead of the GPU)
    _sync()
    ms = sorted(a.elapsed_time(b) for a, b in ev)
    return {"steps": n, "median_ms": ms[len(ms) // 2], "mean_ms": ev[0][0].elapsed_time(ev[-1][1]) / n,
            "host_ms_per_step": host_ms}


def layer_times(model, step, n):
    """Per leaf module: mean forward and backward device time (CUDA events from module hooks) over n steps."""
    names = {m: n_ for n_, m in model.named_modules() if not list(m.children()) and not isinstance(m, nn.Identity)}
    rec = {n_: {"f": [], "b": []} for n_ in names.values()}
    live = {}
    hooks = []

    def ev():
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    for m, name in names.items():
        hooks.append(m.register_forward_pre_hook(lambda mod, inp, name=name: live.__setitem__((name, "f"), ev())))
        hooks.append(m.register_forward_hook(
            lambda mod, inp, out, name=name: rec[name]["f"].append((live.pop((name, "f")), ev()))))
        hooks.append(m.register_full_backward_pre_hook(
            lambda mod, gout, name=name: live.__setitem__((name, "b"), ev())))
        hooks.append(m.register_full_backward_hook(
            lambda mod, gin, gout, name=name: rec[name]["b"].append((live.pop((name, "b")), ev())
                                                                    if (name, "b") in live else None)))
    try:
        step()  # the hooks' own first-use costs
        for v in rec.values():
            v["f"].clear(), v["b"].clear()
        torch.cuda.synchronize()
        t0 = ev()
        for _ in range(n):
            step()
        t1 = ev()
        torch.cuda.synchronize()
    finally:
        for h in hooks:
            h.remove()
    out = {}
    for name, v in rec.items():
        f = [a.elapsed_time(b) for a, b in v["f"]]
        b = [x[0].elapsed_time(x[1]) for x in v["b"] if x is not None]
        out[name] = {"type": type(dict((nm, m) for m, nm in names.items())[name]).__name__,
                     "fwd_ms": sum(f) / n if f else 0.0, "bwd_ms": sum(b) / n if b else 0.0}
    return out, t0.elapsed_time(t1) / n


def graph_check(dev, backends, batch, n):
    """The CNN demo's step n times: eager with the plain AdamW, eager with the capturable AdamW (tensor
    learning rate), and replayed as train_cnn.graphed_step, all from the same initialisation on the same
    batches; every step's loss printed (where a NaN first shows). The graph modes differ in what happens between
    replays: 'graph' reads each loss at once (a sync, and the loss tensor freed before the next replay), 'graph
    kept' keeps every loss tensor and reads them at the end (no sync between replays), 'graph kept+sync' keeps
    them and synchronises after each replay. Session 30 (H200): 'graph' diverged from the third replay (531.8
    where the eager step gives 12.01) while --graph-diag's replays (loss tensors kept across an eager twin's
    step) and the demo's --cuda-graph step (losses kept in a list) did not: these modes tell the sync from the
    loss tensor's freed block."""
    for backend in backends:
        rows = {}
        for mode in ("eager", "eager capturable", "graph", "graph kept", "graph kept+sync", "graph (no undo)"):
            model, step, _ = cnn_setup(backend, dev, batch, False, "step" if mode.startswith("graph") and
                                       "undo" not in mode else "step_keep" if mode == "graph (no undo)" else
                                       ("capturable" if mode == "eager capturable" else ""))
            if mode == "graph kept":
                outs = [step() for _ in range(n)]
                rows[mode] = [float(t) for t in outs]
            elif mode == "graph kept+sync":
                outs = []
                for _ in range(n):
                    outs.append(step())
                    torch.cuda.synchronize()
                rows[mode] = [float(t) for t in outs]
            else:
                rows[mode] = [float(step()) for _ in range(n)]
            del model, step
        for mode, ls in rows.items():
            bad = next((i for i, v in enumerate(ls) if v != v), None)
            print(f"[graph_check/{backend}] {mode:17s} first NaN at step {bad}; losses "
                  + " ".join(f"{v:.4f}" for v in ls), flush=True)


def _opt_for(kind, params, dev):
    """The optimizer of a graph_diag variant (its eager twin gets the same kind)."""
    lr = torch.tensor(3e-3, device=dev)
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.05, capturable=True)
    if kind == "adamw_fused":
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.05, capturable=True, fused=True)
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.02, momentum=0.9)
    raise ValueError(kind)


def _rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item()


def graph_diag(dev, backends, batch, n):
    """Where a whole-step CUDA graph (train_cnn.graphed_step) departs from the eager step: for each optimizer
    variant, model A trains by graph replays and its twin B eagerly; before each step B is given A's exact state
    (weights, batch-norm statistics, optimizer moments and step counts), so every step is compared from the same
    state: the loss, the gradients, the optimizer's moments and the weights after the step (max-norm relative
    differences; the worst parameter named). Variants: capturable AdamW (foreach, the demo's), the same on one
    batch every step (adamw_same: the static input's contents never change), capturable fused AdamW, SGD with
    momentum, and 'fwdbwd' (only forward + backward in the graph, AdamW eager after the replay)."""
    xtr, ytr, _, _ = train_cnn.load_digits(dev.device, 0)
    g = torch.Generator(device="cpu").manual_seed(0)
    batches = []
    for _ in range(4):
        idx = torch.randperm(len(ytr), generator=g)[:batch].to(dev.device)
        batches.append((xtr[idx].contiguous(), ytr[idx]))
    for backend in backends:
        for var in ("adamw", "adamw_same", "adamw_fused", "sgd", "fwdbwd"):
            torch.manual_seed(0)
            init = train_cnn.build("torch").state_dict()
            models = []
            for _ in range(2):
                m = train_cnn.build(backend).to(dev.device)
                m.load_state_dict(init)
                models.append(m)
            a, b = models
            kind = "adamw" if var in ("fwdbwd", "adamw_same") else var
            oa, ob = _opt_for(kind, a.parameters(), dev.device), _opt_for(kind, b.parameters(), dev.device)
            try:
                if var == "fwdbwd":
                    replay = train_cnn.graphed_step(a, oa, *batches[0], with_opt=False)
                else:
                    replay = train_cnn.graphed_step(a, oa, *batches[0])
            except Exception as e:  # noqa: BLE001 - reported, the next variant runs
                print(f"[graph_diag/{backend}/{var}] capture failed: {type(e).__name__}: {e}", flush=True)
                continue
            pa, pb = list(a.parameters()), list(b.parameters())
            names = [k for k, _ in a.named_parameters()]
            for k in range(n):
                xb, yb = batches[0 if var == "adamw_same" else k % len(batches)]
                with torch.no_grad():  # B from A's exact state
                    for ta, tb in zip(a.state_dict().values(), b.state_dict().values()):
                        tb.copy_(ta)
                    for p, q in zip(pa, pb):
                        sa, sb = oa.state.get(p, {}), ob.state.get(q)
                        if sb is not None:
                            for key, t in sa.items():
                                if torch.is_tensor(t):
                                    sb[key].copy_(t)
                        elif sa and any(torch.is_tensor(t) and t.abs().max() > 0 for t in sa.values()):
                            ob.state[q] = {key: t.clone() for key, t in sa.items()}
                la = replay(xb, yb)
                if var == "fwdbwd":
                    oa.step()
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    lb = F.cross_entropy(b(xb), yb)
                ob.zero_grad(set_to_none=True)
                lb.backward()
                ob.step()
                torch.cuda.synchronize()
                gd = max((_rel(p.grad, q.grad), nm) for p, q, nm in zip(pa, pb, names))
                wd = max((_rel(p, q), nm) for p, q, nm in zip(pa, pb, names))
                md = []
                for key in ("exp_avg", "exp_avg_sq", "momentum_buffer", "step"):
                    vals = [(_rel(oa.state[p][key], ob.state[q][key]), nm) for p, q, nm in zip(pa, pb, names)
                            if key in oa.state.get(p, {}) and key in ob.state.get(q, {})]
                    if vals:
                        md.append(f"{key} {max(vals)[0]:.2e} ({max(vals)[1]})")
                stp = ""
                st0 = oa.state.get(pa[0], {}).get("step")
                if torch.is_tensor(st0):
                    stp = f" step A {float(st0):.0f} B {float(ob.state[pb[0]]['step']):.0f};"
                print(f"[graph_diag/{backend}/{var}] step {k + 1}: loss A {float(la):.5f} B {float(lb):.5f};"
                      f"{stp} grads {gd[0]:.2e} ({gd[1]}); weights after {wd[0]:.2e} ({wd[1]}); " + "; ".join(md),
                      flush=True)
            del a, b, models, oa, ob, replay
            torch.cuda.synchronize()

# ------------------------------------------------------------------------------------------ GPT ops
def _events_ms(fn, reps):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / reps


def forced_split_plan(h, m, n, k, splits):
    """pydnn.matmul's plan of dW (n x k) = dy^T x (dy m x n, x m x k; bf16, contiguous) with its split-K
    forced to `splits` splits of the m rows (pydnn.ops.matmul._split_k replaced for the call): the planner
    change the MLP weight gradients would need (their 72 output tiles of 128 x 256 fill less than one wave,
    where _split_k finds room for one split only). None where no split plan results."""
    import pydnn
    from pydnn.graph import matmul_api
    from pydnn.ops import matmul as M
    dt = pydnn.PYDNN_DATA_BFLOAT16
    _, kw = matmul_api.layout((dt, (n, m), (1, n)), (dt, (m, k), (k, 1)), (dt, (n, k), (k, 1)))
    kt = -(-m // M.BK)
    chunk = -(-kt // splits)
    real = M._split_k
    M._split_k = lambda *_a: (-(-kt // chunk), chunk * M.BK)
    try:
        plan = M.gemm_plan(h, split_k=True, **kw)
    finally:
        M._split_k = real
    return plan if plan.ws_bytes and plan.tma is None else None


def _ops_cases(cases, be, f, at, roles, xs, ws, gs, grad_fn, B, T, d, H, KV, hd, m, dv, bf, pt):
    """gpt_ops' cases of one backend (f: its linear, at: its attention) appended to `cases`."""
    for role, k, n in roles:
        x, w, g = xs[k], ws[(k, n)], gs[n]
        cases.append((f"linear {role} fwd ({m}x{k} @ {k}x{n})", be, lambda f=f, x=x, w=w: f(x, w)))
        xg = x.detach().requires_grad_(True)
        cases.append((f"linear {role} dX", be, grad_fn(f(xg, w), xg, g)))
        wg = w.detach().requires_grad_(True)
        cases.append((f"linear {role} dW", be, grad_fn(f(x, wg), wg, g)))
    qkv = torch.randn(B, T, H + 2 * KV, hd, device=dv, dtype=bf, requires_grad=True)
    q, k_, v = (z.transpose(1, 2) for z in qkv.split([H, KV, KV], 2))
    cases.append((f"attention fwd (B{B} H{H}:{KV} S{T} D{hd}, causal)", be,
                  lambda at=at, q=q, k_=k_, v=v: at(q, k_, v, is_causal=True, enable_gqa=True)))
    o = at(q, k_, v, is_causal=True, enable_gqa=True)
    cases.append(("attention bwd (dq, dk, dv)", be, grad_fn(o, qkv, torch.randn_like(o))))
    norm = (pt.RMSNorm(d) if be == "pydnn" else nn.RMSNorm(d)).to(dv)
    xr = torch.randn(B, T, d, device=dv, requires_grad=True)

    def nf(norm=norm, xr=xr):
        with torch.autocast("cuda", dtype=bf):
            return norm(xr)
    cases.append(("rms norm fwd (float32 in, autocast)", be, nf))
    y = nf()
    cases.append(("rms norm bwd (dx, dweight)", be, grad_fn(y, [xr, norm.weight], torch.randn_like(y))))
    gelu = pt.GELU(approximate="tanh") if be == "pydnn" else nn.GELU(approximate="tanh")
    hh = torch.randn(m, 4 * d, device=dv, dtype=bf, requires_grad=True)
    cases.append((f"gelu tanh fwd ({m}x{4 * d})", be, lambda gelu=gelu, hh=hh: gelu(hh)))
    y = gelu(hh)
    cases.append(("gelu tanh bwd", be, grad_fn(y, hh, torch.randn_like(y))))


def _mlp_cases(cases, x, w1, w2, g, grad_fn, tuning, PF):
    """The GPT MLP block's forward and backward (dX, dW1, dW2): pydnn with tuning.torch.FUSE_MLP on (one
    fused Function, PF.mlp) and off (linear, gelu, linear), and PyTorch's F.linear / F.gelu."""
    def switched(fn, on):
        def run():
            old = tuning.torch.FUSE_MLP
            tuning.torch.FUSE_MLP = on
            try:
                return fn()
            finally:
                tuning.torch.FUSE_MLP = old
        return run
    xg, w1g, w2g = (t.detach().requires_grad_(True) for t in (x, w1, w2))
    for label, be, on, f in (("fused (FUSE_MLP)", "pydnn", True, lambda: PF.mlp(xg, w1g, w2g, "tanh")),
                             ("", "pydnn", False, lambda: PF.mlp(xg, w1g, w2g, "tanh")),
                             ("", "torch", False,
                              lambda: F.linear(F.gelu(F.linear(xg, w1g), approximate="tanh"), w2g))):
        fwd = switched(f, on)
        cases.append((f"mlp block fwd{' ' + label if label else ''}", be, fwd))
        y = fwd()
        cases.append((f"mlp block bwd (dX, dW1, dW2){' ' + label if label else ''}", be,
                       grad_fn(y, [xg, w1g, w2g], g)))


def gpt_ops(args, dev, rounds=3, reps=3, dw_variants=True, a=None):
    """The GPT demo's operations one at a time at its default size (64 x 1024 tokens, d 768, 12:4 heads of 64),
    pydnn.torch against PyTorch (SDPA on cuDNN): GPU ms per call from CUDA events around `reps` calls (the
    minimum over `rounds` rounds, the backends' rounds alternating). Linear rows per role (forward, dX alone,
    dW alone: the other operand needs no gradient), bf16 operands (the autocast casts left out); attention on
    the model's BSHD views of one qkv buffer, causal, GQA; RMS norm on the float residual stream under bf16
    autocast (as in the model); GELU (tanh) on the MLP's hidden activations. With dw_variants, the MLP weight
    gradients again on pydnn's other paths: tuning.torch.LINEAR_DW_SPLITK (1x1 wgrad), LINEAR_DW_KSPLIT S (a
    batched matmul of S row chunks + torch.sum) and pydnn.matmul's own split-K plan forced to S splits
    (gemm_wgmma_s + splitk_reduce, matmul.py's _split_k patched for the call: a planner change to try)."""
    import pydnn.torch as pt
    from pydnn import tuning
    from pydnn.torch import _core as C
    from pydnn.torch import functional as PF
    a = a or gpt_args(False, size="demo")
    B, T, d, H, KV = a.batch_size, a.seq, a.d_model, a.n_head, a.n_kv_head
    hd, m = d // H, a.batch_size * a.seq
    dv, bf = dev.device, torch.bfloat16
    torch.manual_seed(0)
    kinds = {"pydnn": "pydnn", "torch": train_gpt.probe_torch_attention(a, dv)}
    lin = {"pydnn": PF.linear, "torch": F.linear}
    sdpa = {"pydnn": pt.scaled_dot_product_attention, "torch": train_gpt.torch_attention(kinds["torch"])}
    cases = []  # (op, backend, fn)

    def grad_fn(out, inputs, g):
        return lambda: torch.autograd.grad(out, inputs, g, retain_graph=True)

    roles = (("qkv", d, (H + 2 * KV) * hd), ("proj", d, d), ("fc1", d, 4 * d), ("fc2", 4 * d, d), ("head", d, 256))
    xs = {k: torch.randn(m, k, device=dv, dtype=bf) for k in {r[1] for r in roles}}
    ws = {(k, n): torch.randn(n, k, device=dv, dtype=bf) * k ** -0.5 for _, k, n in roles}
    gs = {n: torch.randn(m, n, device=dv, dtype=bf) for n in {r[2] for r in roles}}
    for be in ("pydnn", "torch"):
        try:
            _ops_cases(cases, be, lin[be], sdpa[be], roles, xs, ws, gs, grad_fn, B, T, d, H, KV, hd, m, dv, bf, pt)
        except Exception as e:  # noqa: BLE001 - the cases made so far are timed
            print(f"[gpt_ops] {be}: {type(e).__name__}: {e}", flush=True)
    if dw_variants:
        h = C.handle_for(dv)
        for role, k, n in roles[2:4]:
            x, w, g = xs[k], ws[(k, n)], gs[n]
            ref = g.t().float() @ x.float()

            def err(dw, ref=ref):
                return ((dw.float() - ref).abs().max() / ref.abs().max()).item()
            for sw, val, label in (("LINEAR_DW_SPLITK", True, "1x1 wgrad (LINEAR_DW_SPLITK)"),
                                   ("LINEAR_DW_KSPLIT", 2, "batched S=2 (LINEAR_DW_KSPLIT)"),
                                   ("LINEAR_DW_KSPLIT", 4, "batched S=4"),
                                   ("LINEAR_DW_KSPLIT", 8, "batched S=8"),
                                   ("LINEAR_DW_KSPLIT", 16, "batched S=16")):
                saved = getattr(tuning.torch, sw)
                setattr(tuning.torch, sw, val)
                try:
                    wg = w.detach().requires_grad_(True)
                    y = PF.linear(x, wg)

                    def fn(y=y, wg=wg, g=g, sw=sw, val=val):
                        old = getattr(tuning.torch, sw)
                        setattr(tuning.torch, sw, val)
                        try:
                            return torch.autograd.grad(y, wg, g, retain_graph=True)
                        finally:
                            setattr(tuning.torch, sw, old)
                    er = err(fn()[0])
                    cases.append((f"linear {role} dW: {label} (err {er:.1e})", "pydnn", fn))
                except Exception as e:  # a variant that fails is reported, the others run
                    print(f"[gpt_ops] {role} dW {label}: {type(e).__name__}: {e}", flush=True)
                finally:
                    setattr(tuning.torch, sw, saved)
            # pydnn.matmul's split-K plan forced to S splits of the token dimension (dW = dy^T x)
            for sp in (4, 6, 11, 16):
                plan = forced_split_plan(h, m, n, k, sp)
                if plan is None:
                    print(f"[gpt_ops] {role} dW: no forced split plan of {sp}", flush=True)
                    continue
                buf = torch.empty(plan.ws_bytes, dtype=torch.uint8, device=dv)
                dw = torch.empty(n, k, device=dv, dtype=bf)
                fn = (lambda plan=plan, g=g, x=x, dw=dw, buf=buf:
                      plan.launch(h, g.data_ptr(), x.data_ptr(), dw.data_ptr(), workspace=buf.data_ptr(),
                                  workspace_size=plan.ws_bytes))
                fn()
                cases.append((f"linear {role} dW: matmul split-K S={plan.split[0]} (planner patch; "
                              f"err {err(dw):.1e})", "pydnn", fn))
    if dw_variants:  # the MLP block (Linear -> GELU tanh -> Linear, no biases) whole: fused, unfused, PyTorch
        try:
            _mlp_cases(cases, xs[d], ws[(d, 4 * d)], ws[(4 * d, d)], gs[d], grad_fn, tuning, PF)
        except Exception as e:  # noqa: BLE001
            print(f"[gpt_ops] mlp block: {type(e).__name__}: {e}", flush=True)
    ok = []
    for c in cases:  # first calls: plans, kernel loads, cuDNN's graph builds; a case that fails is left out
        try:
            c[2]()
            ok.append(c)
        except Exception as e:  # noqa: BLE001
            print(f"[gpt_ops] {c[0]} / {c[1]}: {type(e).__name__}: {str(e)[:200]}", flush=True)
    cases = ok
    torch.cuda.synchronize()
    best = {}
    for _ in range(rounds):
        for op, be, fn in cases:
            t = _events_ms(fn, reps)
            best[(op, be)] = min(best.get((op, be), t), t)
    rows, seen = [], []
    for op, _, _ in cases:
        if op not in seen:
            seen.append(op)
    for op in seen:
        rows.append({"op": op, "pydnn_ms": best.get((op, "pydnn")), "torch_ms": best.get((op, "torch"))})
    return {"torch_sdpa": kinds["torch"], "rows": rows, "rounds": rounds, "reps": reps}


def ops_report(ops):
    out = [f"\n## GPT demo ops one at a time (default size; CUDA events, min over {ops['rounds']} rounds of "
           f"{ops['reps']} calls; PyTorch SDPA backend {ops['torch_sdpa']})\n",
           "| op | pydnn ms | PyTorch ms | pydnn / PyTorch | x per step (12 layers) -> pydnn - PyTorch ms |",
           "|---|---:|---:|---:|---:|"]
    per_step = {"head": 1, "rms": 25}
    for r in ops["rows"]:
        p, t = r["pydnn_ms"], r["torch_ms"]
        n = next((v for k, v in per_step.items() if k in r["op"]), 12)
        ratio = f"{p / t:.2f}x" if p and t else ""
        diff = f"{n} -> {n * (p - t):+.2f}" if p and t else ""
        out.append(f"| {r['op']} | {'' if p is None else f'{p:.3f}'} | {'' if t is None else f'{t:.3f}'} | "
                   f"{ratio} | {diff} |")
    return "\n".join(out)


# ------------------------------------------------------------------------------------------ report
def fmt_pct(x):
    return "-" if x is None or x != x else f"{100 * x:.1f}%"


def report(results, layers, md):
    out = []
    p = out.append
    p("# pydnn.torch training-step profile\n")
    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    p(f"{dev}; torch {torch.__version__}; bf16 autocast; the demos' models and batch sizes.\n")
    p("| demo | backend | wall ms/step | GPU busy ms/step | GPU idle (of wall) | GPU idle (of GPU span) | "
      "host ms/step (step ranges) | kernels/step |")
    p("|---|---|---|---|---|---|---|---|")
    for (demo, backend), r in results.items():
        t = r["torch_profiler"]
        p(f"| {demo} | {backend} | {t['wall_ms_per_step']:.3f} | {t.get('gpu_busy_ms_per_step', float('nan')):.3f} | "
          f"{fmt_pct(t.get('gpu_idle_share'))} | {fmt_pct(t.get('gpu_idle_share_of_gpu_span'))} | "
          f"{t.get('host_ms_per_step', float('nan')):.3f} | {t['kernels_per_step']:.0f} |")
    timed = [(k, r["timed"]) for k, r in results.items() if r.get("timed")]
    if timed:
        p("\n## Step time without a profiler (CUDA events around each step, as the demos time it)\n")
        p("| demo | backend | median ms/step | mean ms/step (gaps incl.) | host ms/step (enqueue pace) | "
          "pydnn / torch (median) | loss after the run |")
        p("|---|---|---|---|---|---|---|")
        for (demo, backend), t in timed:
            ref = results.get((demo, "torch"), {}).get("timed")
            ratio = f"{t['median_ms'] / ref['median_ms']:.3f}x" if ref and backend != "torch" else ""
            loss = results[(demo, backend)].get("final_loss")
            p(f"| {demo} | {backend} | {t['median_ms']:.3f} | {t['mean_ms']:.3f} | {t['host_ms_per_step']:.3f} | "
              f"{ratio} | {'' if loss is None else f'{loss:.4f}'} |")
    demos = list(dict.fromkeys(d for d, _ in results))
    for demo in demos:
        bk = [(b, results[(d, b)]["torch_profiler"].get("gpu_by_family")) for d, b in results
              if d == demo and results[(d, b)]["torch_profiler"].get("gpu_by_family")]
        if not bk:
            continue
        p(f"\n## {demo}: GPU time by op family (µs per step, kernels per step; the kernels' own time, overlaps "
          "counted twice)\n")
        p("| op family | " + " | ".join(b for b, _ in bk) + (" | pydnn - torch |" if len(bk) == 2 else " |"))
        p("|---|" + "---|" * len(bk) + ("---|" if len(bk) == 2 else ""))
        fams = list(dict.fromkeys(f for _, d in bk for f in d))
        for f in fams:
            cells = [d.get(f, {"us_per_step": 0.0, "kernels_per_step": 0}) for _, d in bk]
            diff = f" {cells[0]['us_per_step'] - cells[1]['us_per_step']:+.1f} |" if len(bk) == 2 else ""
            p(f"| {f} | " + " | ".join(f"{c['us_per_step']:.1f} ({c['kernels_per_step']:g})" for c in cells) + " |"
              + diff)
        tot = [sum(v["us_per_step"] for v in d.values()) for _, d in bk]
        p("| (sum) | " + " | ".join(f"{t:.1f}" for t in tot) + " |"
          + (f" {tot[0] - tot[1]:+.1f} |" if len(bk) == 2 else ""))
    for demo in demos:
        bk = [(b, results[(d, b)]["cprofile_details"]) for d, b in results
              if d == demo and results[(d, b)].get("cprofile_details")]
        if not bk:
            continue
        p(f"\n## {demo}: host Python time by owner (cProfile own time, µs per step; cProfile inflates Python "
          "time, compare rows)\n")
        p("| owner | " + " | ".join(b for b, _ in bk) + " |")
        p("|---|" + "---|" * len(bk))
        owners = list(dict.fromkeys(o for _, d in bk for o in d["buckets"]))
        for o in owners:
            p(f"| {o} | " + " | ".join(f"{d['buckets'].get(o, 0.0):.1f}" for _, d in bk) + " |")
        p("| (total) | " + " | ".join(f"{sum(d['buckets'].values()):.1f}" for _, d in bk) + " |")
        for b, d in bk:
            if d.get("api"):
                p(f"\n## {demo} / {b}: pydnn API calls per step (cProfile cumulative time)\n")
                p("| function | cum µs/step | calls/step | µs/call | body |")
                p("|---|---|---|---|---|")
                for row in d["api"]:
                    p(f"| `{row['function']}` | {row['cum_us_per_step']:.1f} | {row['calls_per_step']:g} | "
                      f"{row['us_per_call']:.1f} | `{row['where'][:60]}` |")
            if d.get("entries"):
                p(f"\n## {demo} / {b}: pydnn calls per step answered by compiled entries (no Python frame: not in "
                  "cProfile's tables)\n")
                p("| function | calls/step |")
                p("|---|---|")
                for name, k in sorted(d["entries"].items(), key=lambda kv: -kv[1]):
                    p(f"| `{name}` | {k:g} |")
    for (demo, backend), r in results.items():
        if r["torch_profiler"].get("top_gpu_kernels"):
            p(f"\n## {demo} / {backend}: top GPU kernels (device time per step)\n")
            p("| kernel | µs/step | calls/step |")
            p("|---|---|---|")
            for row in r["torch_profiler"]["top_gpu_kernels"]:
                p(f"| `{row['kernel'][:110]}` | {row['us_per_step']:.1f} | {row['calls_per_step']:g} |")
        p(f"\n## {demo} / {backend}: top host-side ops (torch.profiler, self CPU time per step)\n")
        p("| op | self µs/step | calls/step |")
        p("|---|---|---|")
        for row in r["torch_profiler"]["top_host_ops"]:
            p(f"| `{row['op'][:70]}` | {row['self_us_per_step']:.1f} | {row['calls_per_step']:g} |")
        if r.get("cprofile"):
            p(f"\n## {demo} / {backend}: top Python functions (cProfile, own time per step; cProfile inflates "
              "Python time, compare rows, not totals)\n")
            p("| function | own µs/step | cum µs/step | calls/step |")
            p("|---|---|---|---|")
            for row in r["cprofile"]:
                p(f"| `{row['function'][:90]}` | {row['own_us_per_step']:.1f} | {row['cum_us_per_step']:.1f} | "
                  f"{row['calls_per_step']:g} |")
    if layers:
        p("\n## CNN per layer (CUDA events from module hooks, ms per step)\n")
        bks = list(layers)
        # every backend's layers in the model's order (pydnn's fused ReLU / max pool modules are Identity: absent)
        names = sorted(dict.fromkeys(n for b in bks for n in layers[b][0]),
                       key=lambda n: [(0, int(q), "") if q.isdigit() else (1, 0, q) for q in n.split(".")])
        p("| layer | type | " + " | ".join(f"{b} fwd | {b} bwd" for b in bks) + " | pydnn - torch (fwd+bwd) |")
        p("|---|---|" + "---|---|" * len(bks) + "---|")
        tot = {b: [0.0, 0.0] for b in bks}
        for n in names:
            cells = []
            for b in bks:
                r = layers[b][0].get(n, {"fwd_ms": 0.0, "bwd_ms": 0.0})
                cells += [f"{r['fwd_ms']:.3f}", f"{r['bwd_ms']:.3f}"]
                tot[b][0] += r["fwd_ms"]
                tot[b][1] += r["bwd_ms"]
            diff = ""
            if "pydnn" in layers and "torch" in layers:
                a, c = layers["pydnn"][0].get(n), layers["torch"][0].get(n)
                if a and c:
                    diff = f"{a['fwd_ms'] + a['bwd_ms'] - c['fwd_ms'] - c['bwd_ms']:+.3f}"
            typ = next((layers[b][0][n]["type"] for b in bks if n in layers[b][0]), "")
            p(f"| {n} | {typ} | " + " | ".join(cells) + f" | {diff} |")
        p("| (sum of layers) | | " + " | ".join(f"{tot[b][0]:.3f} | {tot[b][1]:.3f}" for b in bks) + " | |")
        p("| (whole step, events) | | " + " | ".join(f"{layers[b][1]:.3f} | " for b in bks) + " | |")
        p("\nThe rest of a step (whole step minus the layers' sum) is the loss, the optimizer, zero_grad and the "
          "gaps between layers. The first layer's backward reads ~0: its input needs no gradient, so its full "
          "backward hook fires before its weight-gradient kernels run (they land in the rest). pydnn's fused "
          "batch norm + ReLU + max pool shows under the batch norm (its ReLU and pool modules are Identity, not "
          "listed; their PyTorch rows read 0 for pydnn).")
    text = "\n".join(out)
    print(text)
    if md:
        with open(md, "w") as fh:
            fh.write(text + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--demos", default="cnn,gpt",
                    help="comma list of cnn, cnn_graph (the CNN with --cuda-graph: forward and backward graphed), "
                         "cnn_step_graph (the whole step one graph, train_cnn.graphed_step: it diverges from the third "
                         "replay, see --graph-check; its times are not a training's), gpt, rnn (a 2-layer LSTM)")
    ap.add_argument("--backends", default="pydnn,torch")
    ap.add_argument("--steps", type=int, default=30, help="profiled steps per demo and backend")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--timed-steps", type=int, default=30,
                    help="steps timed without a profiler (CUDA events, as the demos), before the profiled ones")
    ap.add_argument("--cprofile-steps", type=int, default=10, help="0: no cProfile pass")
    ap.add_argument("--layer-steps", type=int, default=20, help="CNN per-layer timing steps (0: none)")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--cnn-batch", type=int, default=256)
    ap.add_argument("--channels-last", action="store_true", help="CNN: NHWC activations and filters (both backends)")
    ap.add_argument("--cuda-graph", action="store_true",
                    help="CNN: forward and backward as CUDA graphs (train_cnn.py --cuda-graph), both backends")
    ap.add_argument("--gpt-torch-linear", action="store_true",
                    help="GPT, pydnn run: Linear layers on cuBLAS (separates the matmul's share of the gap)")
    ap.add_argument("--gpt-size", choices=["small", "demo"], default="small",
                    help="GPT: small (6 x d384, 64 x 256 tokens) or the demo's default (12 x d768, 64 x 1024)")
    ap.add_argument("--gpt-layers", type=int, default=0, help="GPT: this many layers instead (0: the size's)")
    ap.add_argument("--quick", action="store_true", help="about 25 s: few steps, a 1 MiB GPT corpus")
    ap.add_argument("--ab", action="append", default=[],
                    help="also run the pydnn backend with these PYDNN_TUNING settings ('torch.LINEAR_FWD_SPLITK="
                         "False'), or 'nofuse' (convert without fused activations); repeatable")
    ap.add_argument("--budget", type=float, default=0.0,
                    help="seconds: skip the (demo, backend) pairs not started within it (0: none; --quick: 25)")
    ap.add_argument("--prebuild", action="store_true",
                    help="first compile the demos' kernel units in parallel (CNN_UNITS, GPT_UNITS; a fresh machine)")
    ap.add_argument("--ops", action="store_true",
                    help="also time the GPT demo's operations one at a time at its default size, both backends "
                         "(gpt_ops: Linear roles forward / dX / dW, attention, RMS norm, GELU; the MLP dW variants)")
    ap.add_argument("--ops-only", action="store_true", help="--ops and no demo steps")
    ap.add_argument("--prebuild-only", action="store_true",
                    help="compile the --demos' kernel units (and the fused MLP's generated GEMMs for gpt) and exit")
    ap.add_argument("--graph-diag", type=int, default=0,
                    help="CNN: N steps of the whole-step CUDA graph against the eager step from the same state each "
                         "step (per optimizer variant: loss, gradients, moments, weights), where they part")
    ap.add_argument("--graph-check", type=int, default=0,
                    help="N: the CNN step N times eagerly (capturable AdamW, tensor learning rate) and as the whole-"
                         "step CUDA graph (train_cnn.graphed_step) from the same state, each step's loss printed")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    if args.quick:
        args.steps, args.warmup, args.cprofile_steps, args.layer_steps, args.top = 8, 4, 3, 6, 10
        args.timed_steps = min(args.timed_steps, 15)
        args.budget = args.budget or 25.0
    if not torch.cuda.is_available():
        sys.exit("profile_torch_step.py needs a CUDA GPU")
    import pydnn.torch as pt
    from pydnn import tuning
    os.makedirs(args.out, exist_ok=True)
    if args.prebuild or args.prebuild_only:
        demos = args.demos.split(",")
        gpt = "gpt" in demos or args.ops or args.ops_only
        prebuild(tuple(dict.fromkeys((GPT_UNITS if gpt else ())
                                     + (CNN_UNITS if any(d.startswith("cnn") for d in demos) else ()))), mlp=gpt)
        if args.prebuild_only:
            return
    dev = Dev()
    if args.graph_check:
        return graph_check(dev, args.backends.split(","), args.cnn_batch, args.graph_check)
    if args.graph_diag:
        return graph_diag(dev, args.backends.split(","), args.cnn_batch, args.graph_diag)
    results, layers = {}, {}
    t_start = time.perf_counter()
    ops = None
    if args.ops or args.ops_only:
        ops = gpt_ops(args, dev)
        text = ops_report(ops)
        print(text, flush=True)
        with open(os.path.join(args.out, "profile_torch_ops.md"), "w") as fh:
            fh.write(text + "\n")
        with open(os.path.join(args.out, "profile_torch_ops.json"), "w") as fh:
            json.dump(dict(ops, device=torch.cuda.get_device_name()), fh, indent=1)
        torch.cuda.empty_cache()
        if args.ops_only:
            return
    for demo in args.demos.split(","):
        for label in args.backends.split(",") + [f"pydnn[{v}]" for v in args.ab]:
            # "pydnn[<variant>]": the pydnn backend again with PYDNN_TUNING-style settings applied, or with
            # 'nofuse' the model converted without fused activations (train_cnn.py --no-fuse)
            backend, variant = (label.split("[", 1)[0], label.split("[", 1)[1][:-1]) if "[" in label else (label, "")
            t0 = time.perf_counter()
            if args.budget and t0 - t_start > args.budget:
                print(f"[{demo}/{label}] skipped: past the {args.budget:.0f} s budget", flush=True)
                continue
            try:
                if variant and variant != "nofuse":
                    tuning.apply_environment(variant)
                if demo in ("cnn", "cnn_graph", "cnn_step_graph"):
                    mode = ("step" if demo == "cnn_step_graph" else
                            "model" if args.cuda_graph or demo == "cnn_graph" else "")
                    model, step, _ = cnn_setup(backend, dev, args.cnn_batch, args.channels_last, mode,
                                               fuse=variant != "nofuse")
                elif demo == "rnn":
                    model, step = rnn_setup(backend, dev)
                else:
                    model, step = gpt_setup(backend, dev, gpt_args(args.quick, args.gpt_torch_linear, args.gpt_size,
                                                                   args.gpt_layers))
                for _ in range(args.warmup):
                    step()
                torch.cuda.synchronize()
                r = {}
                if args.timed_steps:
                    r["timed"] = timed_steps(step, args.timed_steps)
                r["torch_profiler"] = profile_steps(step, args.steps, args.top)
                if args.cprofile_steps and not demo.endswith("graph") and not variant:
                    r["cprofile_details"] = {}
                    r["cprofile"] = cprofile_steps(step, args.cprofile_steps, args.top, r["cprofile_details"])
                # (graph replays run no module hooks; the variants: the step time and the profile only)
                if demo == "cnn" and args.layer_steps and not args.cuda_graph and not variant:
                    layers[backend] = layer_times(model, step, args.layer_steps)
                # both backends ran the same steps from the same initialisation on the same batches: the loss of
                # one more step is a check of the whole pydnn step against PyTorch's (bf16: close, not equal)
                r["final_loss"] = float(step())
            except Exception as e:  # noqa: BLE001 - one pair's failure is reported; the others still run
                import traceback
                traceback.print_exc()
                print(f"[{demo}/{label}] failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
                tuning.reset()
                tuning.apply_environment()
                torch.cuda.synchronize()
                continue
            results[(demo, label)] = r
            if variant:
                tuning.reset()
                tuning.apply_environment()  # back to the defaults and PYDNN_TUNING's settings
            tm = r.get("timed")
            print(f"[{demo}/{label}] loss {r['final_loss']:.4f}; "
                  + (f"step {tm['median_ms']:.3f} ms median (events, no profiler), host "
                     f"{tm['host_ms_per_step']:.3f} ms/step; " if tm else "")
                  + f"profiled {r['torch_profiler']['wall_ms_per_step']:.3f} ms/step, GPU idle "
                  f"{fmt_pct(r['torch_profiler'].get('gpu_idle_share'))} ({time.perf_counter() - t0:.1f} s)"
                  + (f"; pydnn.torch fell back for {pt.fallback_report()}" if pt.fallbacks else ""), flush=True)
            del model, step
            torch.cuda.empty_cache()
            with open(os.path.join(args.out, "profile_torch_step.partial.json"), "w") as fh:
                json.dump({f"{d}/{b}": r for (d, b), r in results.items()}, fh, indent=1)
            with contextlib.redirect_stdout(io.StringIO()):  # the tables so far (a run cut short keeps them)
                report(results, layers, os.path.join(args.out, "profile_torch_step.partial.md"))
    from pydnn.torch import _core as C
    print(f"pydnn.torch handle_for through PyTorch's C getters: {C._fast['on']}")
    if pt.fallbacks:
        print("pydnn.torch fell back to PyTorch for:", pt.fallback_report())
    report(results, layers, os.path.join(args.out, "profile_torch_step.md"))
    with open(os.path.join(args.out, "profile_torch_step.json"), "w") as fh:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "results": {f"{d}/{b}": r for (d, b), r in results.items()},
                   "cnn_layers": {b: {"layers": v[0], "step_ms": v[1]} for b, v in layers.items()},
                   "fallbacks": dict(pt.fallbacks), "bridge_fast_getters": C._fast["on"],
                   "seconds": time.perf_counter() - t_start}, fh, indent=1)
    print(f"total {time.perf_counter() - t_start:.1f} s; written {args.out}/profile_torch_step.{{md,json}}")


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        main()
