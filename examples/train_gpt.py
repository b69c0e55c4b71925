"""Train a small decoder-only transformer (pre-LN, GQA attention, GELU MLP, RMSNorm or LayerNorm)
byte-by-byte on the Python standard library's own source files, with bf16 autocast: first on pydnn
(pydnn.torch: fused attention, norms, GELU), then the same model, initialisation and batches in plain
PyTorch (SDPA on cuDNN where it takes the problem). Prints loss and tokens per second side by side.

    python examples/train_gpt.py                        # both backends, 500 steps
    python examples/train_gpt.py --steps 100            # a short run
    torchrun --nproc_per_node=2 examples/train_gpt.py   # data-parallel (NCCL), one pydnn handle per rank

The default model (12 layers, d 768, 12 query / 4 key-value heads of 64, ~85M parameters) and batch (64
sequences of 1024 bytes, 65536 tokens a step) make a step GPU-bound on an H100 / H200 (about 0.16 s with
pydnn): at the first default (6 layers, d 384, 64 x 256 tokens) both backends spent a step mostly in
host code, so a second GPU could not speed it up (0.89x measured for pydnn, 2 x H200, same global batch).
The global batch is split over the ranks, so a 2-GPU run sees the same batches as a 1-GPU run.
Linear layers of the pydnn run are pydnn.torch.Linear: pydnn.matmul where this pydnn has the public matmul
(the graph API's), else PyTorch's F.linear; --torch-linear keeps them on cuBLAS.
"""
import argparse
import glob
import math
import os
import sys
import sysconfig

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import Dist, StepTimer, gpu_idle_share, progress  # noqa: E402


def corpus(max_bytes):
    """The standard library's .py files (sorted paths, concatenated as bytes) up to max_bytes."""
    root = sysconfig.get_paths()["stdlib"]
    files = sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True))
    chunks, n = [], 0
    for f in files:
        if "site-packages" in f:
            continue
        try:
            with open(f, "rb") as fh:
                b = fh.read()
        except OSError:
            continue
        chunks.append(b)
        n += len(b)
        if n >= max_bytes:
            break
    data = np.frombuffer(b"".join(chunks)[:max_bytes], dtype=np.uint8)
    return torch.from_numpy(data.astype(np.int64)), len(chunks), root


class Attention(nn.Module):
    def __init__(self, d, n_head, n_kv, attn, Linear):
        super().__init__()
        self.n_head, self.n_kv, self.hd, self.attn = n_head, n_kv, d // n_head, attn
        self.qkv = Linear(d, (n_head + 2 * n_kv) * self.hd, bias=False)
        self.proj = Linear(n_head * self.hd, d, bias=False)

    def forward(self, x):
        b, t, _ = x.shape
        qkv = self.qkv(x).view(b, t, self.n_head + 2 * self.n_kv, self.hd)
        q, k, v = qkv.split([self.n_head, self.n_kv, self.n_kv], 2)  # (B, T, H, D) views: BSHD strides
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        o = self.attn(q, k, v, is_causal=True, enable_gqa=self.n_head != self.n_kv)
        return self.proj(o.transpose(1, 2).reshape(b, t, self.n_head * self.hd))


class Block(nn.Module):
    def __init__(self, d, n_head, n_kv, L, norm, attn, dropout, Linear):
        super().__init__()
        Norm = L.RMSNorm if norm == "rms" else L.LayerNorm
        self.n1, self.n2 = Norm(d), Norm(d)
        self.attn = Attention(d, n_head, n_kv, attn, Linear)
        self.mlp = nn.Sequential(Linear(d, 4 * d, bias=False), L.GELU(approximate="tanh"),
                                 Linear(4 * d, d, bias=False), L.Dropout(dropout))
        self.drop = L.Dropout(dropout)

    def forward(self, x):
        x = x + self.drop(self.attn(self.n1(x)))
        return x + self.mlp(self.n2(x))


class GPT(nn.Module):
    def __init__(self, args, backend, attn):
        super().__init__()
        if backend == "pydnn":
            import pydnn.torch as L
        else:
            L = nn
        d = args.d_model
        Linear = nn.Linear if getattr(args, "torch_linear", False) else L.Linear
        self.tok = nn.Embedding(256, d)
        self.pos = nn.Embedding(args.seq, d)
        self.blocks = nn.ModuleList(Block(d, args.n_head, args.n_kv_head, L, args.norm, attn, args.dropout, Linear)
                                    for _ in range(args.n_layer))
        self.norm = (L.RMSNorm if args.norm == "rms" else L.LayerNorm)(d)
        self.head = Linear(d, 256, bias=False)
        self.head.weight = self.tok.weight  # tied
        for n, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * args.n_layer) if n.endswith(("proj.weight", "mlp.2.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        return self.head(self.norm(x))


def fuse(model, backend, args):
    """The pydnn run's model through pydnn.torch.convert(fuse=True) (its modules are pydnn.torch's already:
    nothing is swapped): with pydnn.tuning.torch.FUSE_MLP each block's Linear -> GELU -> Linear runs as one
    fused MLP (the GELU and its gradient in GEMM epilogues). Not with --torch-linear (convert would swap its
    nn.Linear layers)."""
    if backend == "pydnn" and not getattr(args, "torch_linear", False):
        import pydnn.torch as pt
        pt.convert(model, fuse=True)
    return model


def torch_attention(kind):
    """PyTorch's SDPA restricted to one backend ('cudnn', 'flash', 'efficient') or its default choice."""
    if kind == "default":
        return F.scaled_dot_product_attention
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
               "efficient": SDPBackend.EFFICIENT_ATTENTION}[kind]

    def attn(q, k, v, is_causal, enable_gqa):
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=enable_gqa)
    return attn


def probe_torch_attention(args, device):
    """The first of --torch-sdpa, then flash, then PyTorch's default that runs this problem (forward and
    backward) on this GPU."""
    hd = args.d_model // args.n_head
    q = torch.randn(2, args.n_head, args.seq, hd, device=device, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(2, args.n_kv_head, args.seq, hd, device=device, dtype=torch.bfloat16, requires_grad=True)
    for kind in dict.fromkeys([args.torch_sdpa, "flash", "default"]):
        try:
            torch_attention(kind)(q, k, k, True, args.n_head != args.n_kv_head).sum().backward()
            return kind
        except RuntimeError as e:
            print(f"PyTorch SDPA backend {kind!r} does not take this problem ({str(e).splitlines()[0][:120]})")
    return "default"


def batches(data, args, dist, gen):
    """This rank's share of a global batch of random windows (the same global batch at any world size)."""
    ix = torch.randint(len(data) - args.seq - 1, (args.batch_size,), generator=gen)
    per = args.batch_size // dist.world
    ix = ix[dist.rank * per:(dist.rank + 1) * per]
    x = torch.stack([data[i:i + args.seq] for i in ix.tolist()])
    y = torch.stack([data[i + 1:i + 1 + args.seq] for i in ix.tolist()])
    return x.to(dist.device, non_blocking=True), y.to(dist.device, non_blocking=True)


def lr_at(step, args):
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    t = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


def run(backend, args, dist, train, val, init_state, attn):
    model = GPT(args, backend, attn).to(dist.device)
    model.load_state_dict(init_state)
    fuse(model, backend, args)
    ddp = dist.wrap(model)
    decay = [p for n, p in model.named_parameters() if p.dim() == 2]
    other = [p for n, p in model.named_parameters() if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), fused=dist.device.type == "cuda")
    gen = torch.Generator().manual_seed(args.seed)
    vgen = torch.Generator().manual_seed(args.seed + 1)
    val_batches = [batches(val, args, dist, vgen) for _ in range(args.eval_batches)]
    timer = StepTimer(dist.device)
    hist = {"step": [], "loss": [], "val_step": [], "val_loss": []}
    dt = dist.device.type

    def step(x, y, lr=None):
        if lr is not None:
            for g in opt.param_groups:
                g["lr"] = lr
        with torch.autocast(dt, dtype=torch.bfloat16):
            logits = ddp(x)
            loss = F.cross_entropy(logits.float().view(-1, 256), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.detach()

    def evaluate():
        model.eval()
        with torch.no_grad(), torch.autocast(dt, dtype=torch.bfloat16):
            ls = [F.cross_entropy(model(x).float().view(-1, 256), y.view(-1)) for x, y in val_batches]
        model.train()
        return dist.all_mean(torch.stack(ls).mean().item())

    losses = []
    nxt = batches(train, args, dist, gen)
    for s in range(args.steps):
        x, y = nxt
        timer.start()
        losses.append(step(x, y, lr_at(s, args)))
        timer.stop()
        nxt = batches(train, args, dist, gen)  # the next batch is built on the host while the GPU works
        progress(s % args.eval_every, args.eval_every, f"{backend} step {s + 1}", enabled=dist.main)
        if (s + 1) % args.eval_every == 0 or s + 1 == args.steps:
            tl = dist.all_mean(torch.stack(losses[-args.eval_every:]).mean().item())
            vl = evaluate()
            ms, _ = timer.results(skip=max(0, len(timer.events) - args.eval_every))
            hist["step"].append(s + 1), hist["loss"].append(tl)
            hist["val_step"].append(s + 1), hist["val_loss"].append(vl)
            tok_s = args.batch_size * args.seq / (ms / 1e3)
            dist.print(f"{backend:5s} step {s + 1:5d}/{args.steps}: train loss {tl:.4f}  val loss {vl:.4f}  "
                       f"{tok_s / 1e3:8.1f} k tokens/s  ({ms:.2f} ms/step)")
    skip = min(args.warmup, len(timer.events) // 2)
    ms, mean_ms = timer.results(skip=skip)
    tok_s = args.batch_size * args.seq / (ms / 1e3)
    final = dist.all_mean(torch.stack(losses[-min(50, len(losses)):]).mean().item())
    idle = float("nan")
    if args.profile:
        idle, _ = gpu_idle_share(lambda: step(*nxt))
    return hist, final, hist["val_loss"][-1], tok_s, ms, mean_ms, idle


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--batch-size", type=int, default=64, help="global batch in sequences (split over ranks)")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--d-model", type=int, default=768)
    ap.add_argument("--n-layer", type=int, default=12)
    ap.add_argument("--n-head", type=int, default=12)
    ap.add_argument("--n-kv-head", type=int, default=4, help="key/value heads (GQA when < --n-head)")
    ap.add_argument("--norm", choices=["rms", "layer"], default="rms")
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--eval-batches", type=int, default=8)
    ap.add_argument("--corpus-mb", type=float, default=16.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backend", choices=["both", "pydnn", "torch"], default="both")
    ap.add_argument("--torch-sdpa", choices=["cudnn", "flash", "efficient", "default"], default="cudnn",
                    help="PyTorch's SDPA backend for the reference run (falls back if it refuses the problem)")
    ap.add_argument("--torch-linear", action="store_true", help="the pydnn run's Linear layers on cuBLAS")
    ap.add_argument("--profile", action="store_true", help="measure the GPU-idle share of a step (profiler)")
    ap.add_argument("--plot", default="train_gpt.png", help="PNG of the loss curves (needs matplotlib)")
    ap.add_argument("--cpu", action="store_true", help="smoke-test the script on the CPU (PyTorch's ops)")
    ap.add_argument("--json", default="", help="write the results (per backend) to this JSON file")
    args = ap.parse_args()
    args.eval_every = min(args.eval_every, args.steps)
    args.warmup = min(args.warmup, max(1, args.steps // 10))

    dist = Dist(cpu=args.cpu)
    if args.batch_size % dist.world:
        sys.exit(f"--batch-size {args.batch_size} is not a multiple of the {dist.world} ranks")
    if args.d_model % args.n_head or args.n_head % args.n_kv_head:
        sys.exit("--d-model must be a multiple of --n-head, and --n-head of --n-kv-head")
    data, nfiles, root = corpus(int(args.corpus_mb * 2 ** 20))
    n_val = len(data) // 20
    train, val = data[:-n_val], data[-n_val:]
    hd = args.d_model // args.n_head
    dist.print(f"corpus: {len(data) / 2 ** 20:.1f} MiB of {nfiles} files under {root}; model: {args.n_layer} "
               f"layers, d {args.d_model}, {args.n_head} query / {args.n_kv_head} key-value heads of {hd}, "
               f"{args.norm} norm, seq {args.seq}, global batch {args.batch_size} on {dist.world} GPU(s), bf16 autocast")
    if hd not in (64, 128) and args.backend != "torch":
        dist.print(f"note: head dim {hd}: pydnn's fused attention takes 64 and 128; other sizes fall back")
    torch.manual_seed(args.seed)
    import pydnn
    import pydnn.torch as pt
    if args.backend != "torch":
        on = hasattr(pydnn, "matmul") and not args.torch_linear
        dist.print(f"pydnn run's Linear layers: {'pydnn.matmul' if on else 'PyTorch F.linear (cuBLAS)'}")
    init_state = GPT(args, "torch", None).state_dict()
    results = {}
    for backend in (["pydnn", "torch"] if args.backend == "both" else [args.backend]):
        if backend == "pydnn":
            attn = pt.scaled_dot_product_attention
        else:
            kind = probe_torch_attention(args, dist.device) if dist.device.type == "cuda" else "default"
            dist.print(f"PyTorch SDPA backend: {kind}")
            attn = torch_attention(kind)
        results[backend] = run(backend, args, dist, train, val, init_state, attn)
    if pt.fallbacks and dist.main:
        print("pydnn.torch fell back to PyTorch for:", pt.fallback_report())
    dist.print("\nbackend  final train loss  val loss  tokens/s (median step)  step ms  GPU idle")
    for b, (hist, final, vl, tok_s, ms, mean_ms, idle) in results.items():
        dist.print(f"{b:7s}  {final:16.4f}  {vl:8.4f}  {tok_s:22,.0f}  {ms:7.2f}  "
                   f"{'%.1f%%' % (100 * idle) if idle == idle else '-':>8s}")
    if len(results) == 2:
        p, t = results["pydnn"], results["torch"]
        dist.print(f"pydnn / PyTorch tokens/s: {p[3] / t[3]:.3f}x; final train loss difference "
                   f"{100 * (p[1] - t[1]) / t[1]:+.2f}%")
    if args.json and dist.main:
        import json
        with open(args.json, "w") as fh:
            json.dump({b: dict(final_train_loss=r[1], val_loss=r[2], tokens_per_s=r[3], step_ms=r[4],
                               mean_step_ms=r[5], gpu_idle=None if r[6] != r[6] else r[6], world=dist.world,
                               curve=r[0]) for b, r in results.items()}, fh, indent=1)
    if args.plot and dist.main:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("matplotlib not installed: no plot")
        else:
            fig, ax = plt.subplots(figsize=(7, 4))
            for b, (hist, *_rest) in results.items():
                ax.plot(hist["step"], hist["loss"], label=f"{b} train")
                ax.plot(hist["val_step"], hist["val_loss"], "--", label=f"{b} val")
            ax.set_xlabel("step"), ax.set_ylabel("loss (nats / byte)"), ax.legend()
            ax.set_title(f"byte-level GPT on the stdlib, bf16, {dist.world} GPU(s)")
            fig.tight_layout()
            fig.savefig(args.plot, dpi=120)
            print(f"curves: {args.plot}")
    dist.close()


if __name__ == "__main__":
    main()
