"""Train a small CNN with batch norm on scikit-learn's handwritten digits (8x8, resized to 32x32, 3 channels)
with bf16 autocast, on pydnn (pydnn.torch) and then the same model, initialisation and data order in plain
PyTorch (cuDNN): loss and test accuracy per epoch, step times side by side, curves to a PNG.

    python examples/train_cnn.py                       # both backends, 30 epochs
    python examples/train_cnn.py --epochs 3            # a short run
    torchrun --nproc_per_node=2 examples/train_cnn.py  # data-parallel (NCCL), one pydnn handle per rank

The model is the seed's CNN (conv 3->64, conv 64->128, 3x3 pad 1, ReLU, 2x2 max pool after each, a linear
classifier) with batch norm after each convolution, built from PyTorch's modules; the pydnn run converts it
with pydnn.torch.convert(model, fuse=True): each batch norm + ReLU one fused pydnn call, and each block (conv,
batch norm, ReLU, max pool) one autograd node in training, the float32 weights cast to bf16 inside it
(tuning.torch.FUSE_BLOCK, FOLD_CASTS); --no-fuse keeps them apart.

Both backends run eagerly by default (the step times printed are those of the eager steps); --cuda-graph
replays each backend's forward and backward as CUDA graphs (the optimizer eager), for both backends alike.
"""
import argparse
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import Dist, StepTimer, gpu_idle_share, progress  # noqa: E402


def build(backend, fuse=True):
    """The model in PyTorch's modules; for pydnn, the same converted by pydnn.torch.convert (and, with fuse,
    each batch norm's ReLU fused into it: BatchNormalizationForwardTrainingEx's BN_ACTIVATION; the max pool
    after it run in the batch norm's autograd Function, tuning.torch.FUSE_POOL; the batch norm in the
    convolution's, tuning.torch.FUSE_BLOCK)."""
    model = _build()
    if backend == "pydnn":
        import pydnn.torch
        pydnn.torch.convert(model, fuse=fuse)
    return model


def _build():
    return nn.Sequential(
        nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(128 * 8 * 8, 10))


def load_digits(device, seed):
    try:
        from sklearn.datasets import load_digits as _load
    except ImportError:
        sys.exit("this demo needs scikit-learn (pip install scikit-learn): its digits data set ships with it")
    d = _load()
    x = torch.tensor(d.images, dtype=torch.float32)[:, None] / 16.0          # (1797, 1, 8, 8) in [0, 1]
    x = F.interpolate(x, size=(32, 32), mode="bilinear", align_corners=False).repeat(1, 3, 1, 1)
    x = (x - x.mean()) / x.std()
    y = torch.tensor(d.target, dtype=torch.int64)
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(y), generator=g)
    n_test = len(y) // 5
    te, tr = perm[:n_test], perm[n_test:]
    return x[tr].to(device), y[tr].to(device), x[te].to(device), y[te].to(device)


def evaluate(model, x, y, bs=512):
    model.eval()
    correct, loss = 0, 0.0
    with torch.no_grad(), torch.autocast(x.device.type, dtype=torch.bfloat16):
        for i in range(0, len(y), bs):
            out = model(x[i:i + bs])
            loss += F.cross_entropy(out.float(), y[i:i + bs], reduction="sum").item()
            correct += (out.argmax(1) == y[i:i + bs]).sum().item()
    model.train()
    return loss / len(y), 100.0 * correct / len(y)


def graphed(model, sample, channels_last):
    """The model's forward and backward as CUDA graphs (torch.cuda.make_graphed_callables, captured under the
    demo's bf16 autocast): a step replays two graphs instead of launching each layer's kernels from Python.
    Its warm-up runs three training-mode forwards, which move the batch-norm running statistics three
    momentum steps (the eager run does not have them)."""
    if channels_last:
        sample = sample.contiguous(memory_format=torch.channels_last)
    with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
        return torch.cuda.make_graphed_callables(model, (sample.clone(),))


def graphed_step(model, opt, x0, y0, undo=True, with_opt=True):
    """--cuda-graph step. History: in session 29 (tools/profile_torch_step.py --graph-check 30, both backends)
    the third replay of the version before gave 531.8 where the eager capturable step gives 12.01. In session 30
    (H200, --graph-diag 3: each replay against the eager step from the same state) every replay equalled the
    eager step exactly -- loss, gradients, AdamW moments, step counts and weights -- for capturable foreach and
    fused AdamW, SGD, and the forward-backward-only graph, on both backends (tools/PERF.md, "Session 30: cnn").
    This version differs from session 29's in restoring the learning rates before the capture instead of after;
    whether that was the cause is not established.

    The whole training step (forward, loss, backward, the optimizer) as one CUDA graph, PyTorch's whole-network
    capture: `opt` must be capturable; tensor learning rates are read by the graph (a scheduler fills them in
    place), float ones are baked in at capture. Three warm-up steps run first on a side stream with the learning
    rates at 0; the weights, batch-norm statistics and the optimizer's state are then put back in place (the
    graph holds their addresses), so training starts from the same state as the eager run. with_opt=False:
    forward, loss and backward only (the caller steps the optimizer after each replay). Returns step(xb, yb) ->
    loss: the batch copied into the graph's static inputs, one replay."""
    static_x, static_y = x0.clone(), y0.clone()
    saved = {k: v.detach().clone() for k, v in model.state_dict().items()}
    lrs = [g["lr"] for g in opt.param_groups]
    lr_vals = [float(v) for v in lrs]

    def set_lrs(vals):
        for g, v in zip(opt.param_groups, vals):
            if torch.is_tensor(g["lr"]):
                g["lr"].fill_(v)
            else:
                g["lr"] = v

    def fwd_bwd():
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
            loss = F.cross_entropy(model(static_x), static_y)
        loss.backward()
        if with_opt:
            opt.step()
        return loss

    set_lrs([0.0 if undo else v for v in lr_vals])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            fwd_bwd()
    torch.cuda.current_stream().wait_stream(side)
    set_lrs(lr_vals)  # (before the capture: a float learning rate is baked into the captured kernels)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)  # the graph's backward allocates the gradients from its pool
    with torch.cuda.graph(graph):
        static_loss = fwd_bwd()
    if undo:
        with torch.no_grad():
            for k, v in model.state_dict().items():
                v.copy_(saved[k])
            for st in opt.state.values():
                for t in st.values():
                    if torch.is_tensor(t):
                        t.zero_()

    def step(xb, yb):
        static_x.copy_(xb)
        static_y.copy_(yb)
        graph.replay()
        return static_loss.detach().clone()
    return step


def run(backend, args, dist, data, init_state):
    """One backend's training, a generator: it yields after each epoch (main() interleaves the backends'
    epochs, so a shared host's changing load falls on both alike) and returns (history, median step ms, mean
    step ms, GPU idle share)."""
    xtr, ytr, xte, yte = data
    torch.manual_seed(args.seed)
    model = build(backend, fuse=not args.no_fuse).to(dist.device)
    model.load_state_dict(init_state)
    if args.channels_last:
        model.to(memory_format=torch.channels_last)
    ddp = dist.wrap(model)
    whole = args.cuda_graph == "step"
    if args.cuda_graph == "model":
        ddp = graphed(model, xtr[:args.batch_size // dist.world], args.channels_last)
    steps_per_epoch = len(ytr) // args.batch_size
    if whole:  # the optimizer inside the graph: capturable, its learning rate a tensor the scheduler fills
        opt = torch.optim.AdamW(model.parameters(), lr=torch.tensor(args.lr, device=dist.device), weight_decay=0.05,
                                capturable=True)
        # (beta1 is baked into the captured step: the one-cycle schedule's momentum cycling is off)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, args.lr, total_steps=args.epochs * steps_per_epoch,
                                                    cycle_momentum=False)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.05)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, args.lr, total_steps=args.epochs * steps_per_epoch)
    per_rank = args.batch_size // dist.world
    g = torch.Generator(device="cpu").manual_seed(args.seed)  # the same data order for both backends
    timer = StepTimer(dist.device)
    hist = {"loss": [], "test_loss": [], "acc": []}
    eval_ms = []  # wall ms of each evaluation after the first epoch's

    replay = None
    if whole:
        lr_t = torch.tensor(0.0, device=dist.device)

        def keep_lr_tensors():  # the graph reads each group's lr tensor: a scheduler that assigns floats
            for grp in opt.param_groups:  # (older PyTorch) has its value copied into the tensor instead
                if not torch.is_tensor(grp["lr"]):
                    lr_t.fill_(grp["lr"])
                    grp["lr"] = lr_t
        keep_lr_tensors()
        x0 = xtr[:per_rank].contiguous(memory_format=torch.channels_last) if args.channels_last else xtr[:per_rank]
        replay = graphed_step(model, opt, x0, ytr[:per_rank])

    def step(xb, yb, schedule=True):
        if replay is not None:  # --cuda-graph step: the whole step one replay
            loss = replay(xb, yb)
        else:
            with torch.autocast(dist.device.type, dtype=torch.bfloat16):
                loss = F.cross_entropy(ddp(xb), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        if schedule:
            sched.step()
            if replay is not None:
                keep_lr_tensors()
        return loss

    for epoch in range(args.epochs):
        perm = torch.randperm(len(ytr), generator=g).to(dist.device)
        losses = []
        for i in range(steps_per_epoch):
            idx = perm[i * args.batch_size:(i + 1) * args.batch_size]
            idx = idx[dist.rank * per_rank:(dist.rank + 1) * per_rank]  # this rank's share of the global batch
            xb, yb = xtr[idx], ytr[idx]
            if args.channels_last:
                xb = xb.contiguous(memory_format=torch.channels_last)
            timer.start(epoch)  # (the mean step: each epoch's window, gaps between its steps included)
            losses.append(step(xb, yb).detach())
            timer.stop()
            progress(i, steps_per_epoch, f"{backend} epoch {epoch + 1}", enabled=dist.main)
        train_loss = dist.all_mean(torch.stack(losses).mean().item())
        t_eval = time.perf_counter()
        test_loss, acc = evaluate(model, xte, yte)  # (ends in .item(): synchronised)
        if epoch:
            eval_ms.append((time.perf_counter() - t_eval) * 1e3)
        hist["loss"].append(train_loss), hist["test_loss"].append(test_loss), hist["acc"].append(acc)
        dist.print(f"{backend:5s} epoch {epoch + 1:3d}/{args.epochs}: train loss {train_loss:.4f}  "
                   f"test loss {test_loss:.4f}  test accuracy {acc:6.2f}%")
        yield
    gpu_ms, wall_ms = timer.results(skip=min(steps_per_epoch, len(timer.events) // 2))
    idle = float("nan")
    if args.profile:
        xb, yb = xtr[:per_rank], ytr[:per_rank]
        idle, _ = gpu_idle_share(lambda: step(xb, yb, schedule=False))
    hist["eval_ms"] = sorted(eval_ms)[len(eval_ms) // 2] if eval_ms else float("nan")
    hist["steps_ms"] = [round(t, 4) for t in timer.times]  # each timed step (the first epoch's skipped), in order
    return hist, gpu_ms, wall_ms, idle


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--batch-size", type=int, default=256, help="global batch (split over the ranks)")
    ap.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (AdamW, one-cycle schedule)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backend", choices=["both", "pydnn", "torch"], default="both")
    ap.add_argument("--channels-last", action="store_true", help="NHWC activations and filters")
    ap.add_argument("--no-fuse", action="store_true", help="pydnn: keep each batch norm's ReLU a separate op")
    ap.add_argument("--benchmark", action="store_true",
                    help="pydnn.torch.benchmark / torch.backends.cudnn.benchmark: pick convolutions by Find")
    ap.add_argument("--profile", action="store_true", help="measure the GPU-idle share of a step (profiler)")
    ap.add_argument("--cuda-graph", nargs="?", const="model", default="", choices=["model", "step"],
                    help="one GPU, both backends alike: 'model' (the default of the flag): the forward and backward "
                         "replayed as CUDA graphs (torch.cuda.make_graphed_callables; the optimizer stays eager); "
                         "'step': the whole step (forward, loss, backward, a capturable AdamW) one graph "
                         "(graphed_step; the one-cycle schedule without its momentum cycling)")
    ap.add_argument("--plot", default="train_cnn.png", help="PNG of the curves (needs matplotlib; '' for none)")
    ap.add_argument("--cpu", action="store_true", help="smoke-test the script on the CPU (PyTorch's ops)")
    ap.add_argument("--json", default="", help="write the results (per backend) to this JSON file")
    args = ap.parse_args()

    dist = Dist(cpu=args.cpu)
    if args.cuda_graph and (dist.world > 1 or args.cpu):
        sys.exit("--cuda-graph: one GPU only (not under DDP, not on the CPU)")
    if args.batch_size % dist.world:
        sys.exit(f"--batch-size {args.batch_size} is not a multiple of the {dist.world} ranks")
    torch.backends.cudnn.benchmark = args.benchmark
    if args.benchmark:
        import pydnn.torch
        pydnn.torch.benchmark = True
    data = load_digits(dist.device, args.seed)
    dist.print(f"digits: {len(data[1])} train / {len(data[3])} test images, 3x32x32; global batch "
               f"{args.batch_size} over {dist.world} GPU(s); bf16 autocast")
    torch.manual_seed(args.seed)
    init_state = build("torch").state_dict()  # one initialisation for both backends
    results, runs = {}, {}
    for backend in (["pydnn", "torch"] if args.backend == "both" else [args.backend]):
        runs[backend] = run(backend, args, dist, data, init_state)
    while runs:  # the backends' epochs interleaved: pydnn's first, PyTorch's first, pydnn's second, ...
        for backend in list(runs):
            try:
                next(runs[backend])
            except StopIteration as done:
                results[backend] = done.value
                del runs[backend]
    results = {b: results[b] for b in ("pydnn", "torch") if b in results}
    if args.backend in ("both", "pydnn"):
        import pydnn.torch
        if pydnn.torch.fallbacks and dist.main:
            print("pydnn.torch fell back to PyTorch for:", pydnn.torch.fallback_report())
    dist.print("\nbackend  final test acc  step (median)  step (mean, gaps incl.)  evaluation (median)  GPU idle")
    for b, (hist, gpu_ms, wall_ms, idle) in results.items():
        dist.print(f"{b:7s}  {hist['acc'][-1]:12.2f}%  {gpu_ms:10.3f} ms  {wall_ms:18.3f} ms  "
                   f"{hist['eval_ms']:16.3f} ms  {'%.1f%%' % (100 * idle) if idle == idle else '-':>8s}")
    if len(results) == 2:
        (p, t) = results["pydnn"], results["torch"]
        # the step time: the median of the steps' CUDA-event times; the mean over each epoch's window (its
        # first step's start to its last one's end) also holds the host's work between the steps
        dist.print(f"pydnn / PyTorch step time: {p[1] / t[1]:.3f}x (median); {p[2] / t[2]:.3f}x (mean, gaps incl.); "
                   f"accuracy difference {p[0]['acc'][-1] - t[0]['acc'][-1]:+.2f} points")
    if args.json and dist.main:
        import json
        with open(args.json, "w") as fh:
            json.dump({b: dict(final_accuracy=h["acc"][-1], final_train_loss=h["loss"][-1], step_ms=g,
                               mean_step_ms=w, eval_ms=h["eval_ms"], gpu_idle=None if i != i else i,
                               world=dist.world, curve=h)
                       for b, (h, g, w, i) in results.items()}, fh, indent=1)
    if args.plot and dist.main:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("matplotlib not installed: no plot")
        else:
            fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
            for b, (hist, *_rest) in results.items():
                ep = np.arange(1, len(hist["loss"]) + 1)
                a1.plot(ep, hist["loss"], label=f"{b} train")
                a1.plot(ep, hist["test_loss"], "--", label=f"{b} test")
                a2.plot(ep, hist["acc"], label=b)
            a1.set_xlabel("epoch"), a1.set_ylabel("loss"), a1.set_yscale("log"), a1.legend()
            a2.set_xlabel("epoch"), a2.set_ylabel("test accuracy (%)"), a2.legend()
            fig.suptitle(f"digits CNN, bf16 autocast, batch {args.batch_size}, {dist.world} GPU(s)")
            fig.tight_layout()
            fig.savefig(args.plot, dpi=120)
            print(f"curves: {args.plot}")
    dist.close()


if __name__ == "__main__":
    main()
