#!/usr/bin/env python3
"""Softmax forward launch variants on the tools/bench.py case (16384 rows of 4096, CHANNEL on N x C x 1 x 1),
for tuning the row kernels; notes and results in tools/bench_softmax_notes.md.

    python3 tools/bench_softmax_sweep.py

Each variant is one kernel instantiation of ptx/softmax.cu (compiled here in a private unit, so the
sweep's extra instantiations never reach the installed cache's softmax units) with a group size G, a
block and a grid; it is checked against torch.softmax (max abs error) and timed like tools/bench.py.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import DT, desc, time_ms  # noqa: E402

import pydnn  # noqa: E402
from pydnn._build import loader  # noqa: E402
from pydnn._build.manifest import KernelUnit  # noqa: E402
from pydnn._cuda import driver  # noqa: E402
from pydnn.ops import softmax as S  # noqa: E402

ROWS, COLS = 16384, 4096
CT = {"bf16": "pydnn::bf16_t", "fp32": "float"}


def variants(sm):
    """(dtype, label, kernel, G, block, grid)."""
    b, f = "bf16", "fp32"
    rf = lambda t, v, it, k: f"pydnn::softmax::row_fwd<{CT[t]}, {v}, {it}, {k}>"  # noqa: E731
    groups = lambda g, blk: -(-ROWS // (blk // g))  # noqa: E731
    return [  # bf16 then fp32; "planner": what pydnn/ops/softmax.py launches for this case
        (b, "row_fwd items4 G128 b128 (planner)", rf(b, 8, 4, 0), 128, 128, groups(128, 128)),
        (b, "row_fwd items4 G128 b256", rf(b, 8, 4, 0), 128, 256, groups(128, 256)),
        (b, "row_fwd items4 G128 b512", rf(b, 8, 4, 0), 128, 512, groups(128, 512)),
        (b, "row_fwd items4 G128 b128 grid 8/SM (grid-stride)", rf(b, 8, 4, 0), 128, 128, 8 * sm),
        (f, "row_fwd items4 G256 b256", rf(f, 4, 4, 1), 256, 256, groups(256, 256)),
        (f, "row_fwd items8 G128 b128 (planner)", rf(f, 4, 8, 1), 128, 128, groups(128, 128)),
        (f, "row_fwd items8 G128 b256", rf(f, 4, 8, 1), 128, 256, groups(128, 256)),
        (f, "row_fwd items4 G256 b512", rf(f, 4, 4, 1), 256, 512, groups(256, 512)),
    ]


def main():
    h = pydnn.create()
    pydnn.set_stream(h, torch.cuda.current_stream().cuda_stream)
    src = torch.empty(ROWS * COLS * 4, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy = 2 * src.numel() / time_ms(lambda: dst.copy_(src)) / 1e6
    del src, dst
    print(f"sweep: copy {copy:.0f} GB/s, {h.sm_count} SMs", flush=True)
    vs = variants(h.sm_count)
    loader.register_units([KernelUnit("softmax.sweep", "softmax.cu", tuple(sorted({v[2] for v in vs})))])
    for dname in ("bf16", "fp32"):
        tdt, pdt = DT[dname]
        x = torch.randn(ROWS, COLS, 1, 1, dtype=tdt, device="cuda")
        y = torch.empty_like(x)
        d = desc(x, dtype=pdt)
        ref = torch.softmax(x.view(ROWS, COLS).float(), dim=-1)
        base = S._plan(h, False, pydnn.PYDNN_SOFTMAX_ACCURATE, pydnn.PYDNN_SOFTMAX_MODE_CHANNEL, [d, d])
        nbytes = 2 * x.numel() * x.element_size()
        ms_t = time_ms(lambda: torch.softmax(x.view(ROWS, COLS), dim=-1))
        print(f"sweep {dname}: torch.softmax {nbytes / ms_t / 1e6:.0f} GB/s ({100 * nbytes / ms_t / 1e6 / copy:.1f}%)")
        for t, label, expr, g, block, grid in vs:
            if t != dname:
                continue
            p = S.SoftmaxParams()
            ctypes_copy(base.launches[0].params, p)
            p.group, p.out, p.in0, p.in1, p.alpha, p.beta, p.flags = g, y.data_ptr(), x.data_ptr(), None, 1.0, 0.0, 4
            argv = driver.kernel_args(p)
            try:
                func = h.function("softmax.sweep", expr)
            except Exception as e:  # noqa: BLE001
                print(f"sweep {dname} {label}: FAILED to load: {e}")
                continue
            fn = lambda: driver.launch_args(func, (grid, 1, 1), (block, 1, 1), 0, h.cu_stream, argv)  # noqa: E731
            y.fill_(float("nan"))
            fn()
            torch.cuda.synchronize()
            err = (y.view(ROWS, COLS).float() - ref).abs().max().item()
            ms = time_ms(fn)
            g_p = nbytes / ms / 1e6
            print(f"sweep {dname} {label:46s} {g_p:6.0f} GB/s {100 * g_p / copy:5.1f}% copy "
                  f"{ms_t / ms:4.2f}x torch  maxerr {err:.2e}", flush=True)
        del x, y, ref


def ctypes_copy(a, b):
    import ctypes
    ctypes.memmove(ctypes.addressof(b), ctypes.addressof(a), ctypes.sizeof(a))


if __name__ == "__main__":
    main()
