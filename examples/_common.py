"""Shared pieces of the training demos: distributed setup (torchrun + NCCL, one pydnn handle per rank),
a progress bar, step timing with CUDA events, and the GPU-idle share of a step from the profiler."""
import os
import sys
import time

import torch
import torch.distributed as dist


class Dist:
    """Rank / world size / device. Under torchrun (WORLD_SIZE > 1): the NCCL process group, one GPU per
    rank (LOCAL_RANK), made current before anything touches CUDA, so each rank's pydnn handle (created by
    pydnn.torch on first use) lives on its own device."""

    def __init__(self, cpu=False):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if cpu:  # a smoke test of the script itself: pydnn.torch falls back to PyTorch's ops on the CPU
            if self.world > 1:
                sys.exit("--cpu runs on one process")
            self.device = torch.device("cpu")
            return
        if not torch.cuda.is_available():
            sys.exit("these demos need a CUDA GPU (--cpu: a smoke test on the CPU)")
        torch.cuda.set_device(self.local_rank)
        self.device = torch.device("cuda", self.local_rank)
        if self.world > 1:
            dist.init_process_group("nccl", device_id=self.device)

    @property
    def main(self):
        return self.rank == 0

    def print(self, *a, **kw):
        if self.main:
            print(*a, **kw, flush=True)

    def all_mean(self, value):
        """The mean of a float over the ranks (the value itself on one GPU)."""
        if self.world == 1:
            return float(value)
        t = torch.tensor([float(value)], device=self.device)
        dist.all_reduce(t)
        return t.item() / self.world

    def wrap(self, model):
        if self.world == 1:
            return model
        from torch.nn.parallel import DistributedDataParallel as DDP
        return DDP(model, device_ids=[self.local_rank])

    def close(self):
        if self.world > 1:
            dist.barrier()
            dist.destroy_process_group()


def progress(i, n, prefix="", width=30, enabled=True, extra=""):
    if not enabled or not sys.stdout.isatty():
        return
    done = int(width * (i + 1) / n)
    sys.stdout.write(f"\r{prefix} [{'#' * done}{'.' * (width - done)}] {i + 1}/{n} {extra}")
    if i + 1 == n:
        sys.stdout.write("\r" + " " * (len(prefix) + width + 40) + "\r")
    sys.stdout.flush()


class StepTimer:
    """GPU time per step from CUDA events (recorded around each step, read once at the end: no sync in the
    loop), and wall time per step."""

    def __init__(self, device):
        self.events, self.times = [], []
        self.cuda = device.type == "cuda"

    def _event(self):
        if not self.cuda:
            return time.perf_counter()
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    @staticmethod
    def _ms(a, b):
        return (b - a) * 1e3 if isinstance(a, float) else a.elapsed_time(b)

    def start(self, group=None):
        """group: steps of one group (an epoch) form one window of the mean (see results)."""
        self.events.append([self._event(), None, group])

    def stop(self):
        self.events[-1][1] = self._event()

    def results(self, skip=0):
        """(median time per step in ms, mean time per step in ms from the first timed step's start to the
        last one's end, gaps between steps included): on the GPU both from CUDA events. Steps started with
        groups: the mean over each group's window (its first step's start to its last one's end) summed, so
        what runs between groups (another run's steps, an evaluation) is not counted."""
        if self.cuda:
            torch.cuda.synchronize()
        ev = self.events[skip:]
        if not ev:
            return float("nan"), float("nan")
        self.times = [self._ms(a, b) for a, b, _ in ev]  # in step order (the demos' --json: steps_ms)
        ms = sorted(self.times)
        total, first = 0.0, 0
        for i in range(1, len(ev) + 1):
            if i == len(ev) or ev[i][2] is None or ev[i][2] != ev[first][2]:
                total += self._ms(ev[first][0], ev[i - 1][1])
                first = i
        return ms[len(ms) // 2], total / len(ev)


def gpu_idle_share(step_fn, steps=5):
    """Runs step_fn `steps` times under the profiler; returns (idle share, wall ms per step): the share of
    the wall time in which no kernel or copy ran on the GPU (intervals of every CUDA activity merged)."""
    from torch.profiler import ProfilerActivity, profile
    if not torch.cuda.is_available():
        return float("nan"), float("nan")
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            step_fn()
        torch.cuda.synchronize()
        wall_us = (time.perf_counter() - t0) * 1e6
    iv = []
    for e in prof.events():
        if str(getattr(e, "device_type", "")).endswith("CUDA"):
            iv.append((e.time_range.start, e.time_range.end))
    if not iv:
        return float("nan"), wall_us / 1e3 / steps
    iv.sort()
    busy, (s, t) = 0.0, iv[0]
    for a, b in iv[1:]:
        if a > t:
            busy += t - s
            s, t = a, b
        else:
            t = max(t, b)
    busy += t - s
    span = max(t for _, t in iv) - min(s for s, _ in iv)
    return max(0.0, 1.0 - busy / span), wall_us / 1e3 / steps
