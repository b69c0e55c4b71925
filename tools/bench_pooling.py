"""Pooling benchmark: pydnn vs PyTorch in the same run, on the issue's problem: x 64x64x112x112 NHWC
(channels_last), window 3x3, stride 2, padding 1 -> y 64x64x56x56.

Bytes (the fewest the op must move; the torch column is timed on the same count):
  forward           x read once + y written once                     (bf16: 102.8 + 25.7 MB)
  max backward      x read + y read + dy read + dx written (x[e] is matched against y[o]; PyTorch reads
                    int64 indices instead of x and y; pydnn keeps cuDNN's interface: no indices)
  average backward  dy read + dx written
The floor is that byte count at the copy bandwidth measured in the same run. Overlapping windows re-read x
(each element 2.25 times on average) but those reads hit L1 / L2. Target (issue 3): forward >= 75% of copy
and >= 3x PyTorch (torch.nn.functional.max_pool2d / avg_pool2d on a channels_last tensor).

Kernel (ptx/pooling.cu): one thread per 8 channels (16 bytes) of one written element (v1, v2); forward v3:
one thread per 8 channels of 4 consecutive outputs along w (fwd_rows).

Versions (H200, copy ~4150 GB/s in the same run):
  v1 forward: 2 window loads in flight (64-register cap), max by unpacking to float with the first-max /
     NaN rule per element; backward: per covering window, recompute its maximum from x (9 loads) in
     64-bit window arithmetic. Measured (bf16): max fwd 27.1% (1.93x torch), avg fwd 43.7% (5.1x),
     max bwd 3.0% (0.27x), avg bwd 7.5% (2.7x); fp32 max fwd 39.5%; NCHW max fwd 6.2% (0.42x).
     Both directions instruction-bound: max forward did ~9 instructions per channel-element, backward
     ~6 64-bit divisions per dx vector plus 9 loads + compares per covering window.
  v2: forward issues the whole window (up to 9 vectors) before using any, max in the packed
     max{.NaN}.bf16x2 form (4 instructions per 16-byte vector), window bounds in 32-bit ints, separate
     max / average instantiations (80 registers, 3 blocks per SM). Backward matches x[e] against y[o]
     (cuDNN's contract: y is the forward's output), scanning earlier window elements only on a match (a
     possible tie), the covering windows' dy / y loads batched 4 at a time; averages multiply by 1 / count.
     Prediction: forward 70-85% of copy (>= 3x torch for max, ~5x+ for avg); max backward 40-60%
     (~2 dependent round trips per dx vector at 512 threads per SM, ~450 instructions per thread);
     average backward 50-65%.
     Measured (copy 4175 GB/s): bf16 max fwd 2801 GB/s 67.1% (4.72x torch), avg fwd 54.6% / 55.1%
     (incl. / excl. padding, 6.3x), max bwd 447 GB/s 10.7% (0.85x), avg bwd 635 GB/s 15.2% (5.4x); fp32 max
     fwd 72.7% (2.73x), avg fwd 69.5% (4.13x), max bwd 18.4% (0.76x), avg bwd 16.1% (2.78x); NCHW bf16 max
     fwd 11.8% (0.80x); global average 256x2048x7x7 67.1% (1.18x). Forward gained 2.5x / 1.3x but missed
     the 75% target; backward gained 3.5x / 2x and is far below the prediction.
     Reading: every kernel costs about the same ~8 SM-cycles per thread (forward avg: 46 us for 1.6M
     threads; backward avg: 202 us for 6.4M threads, each only 1-4 dy loads), i.e. ~1000 issued
     instructions per thread: the fixed per-thread work (10 runtime 32-bit div / mod for the coordinates,
     64-bit offset products, the window and covering bounds, the blend) dominates, not the loads.
  v3 (this commit): (a) forward of 1-d / 2-d vector problems whose offsets fit 32 bits: fwd_rows, a thread
     reduces 4 consecutive outputs along w (kRowOut) of one channel vector; coordinates from the launch shape
     (grid N*OH rows x w strips x channel blocks, block 8..32 channel vectors x strips: one division per
     thread instead of 10 div / mod per output), 32-bit offsets, the h window and base offsets shared by the
     strip; max with alpha 1 / beta 0 stores the packed maximum as it is (no unpack / blend / repack);
     averages multiply by one reciprocal per output instead of VEC divisions. Each output still reduces its
     window in fwd's order (max bitwise fwd's; a GPU test compares the two kernels' bits); small blocks
     (< 64 threads), 3-d and adaptive problems keep fwd. Loads are NOT shared between the 4 outputs (the
     shared column is re-read from L1): the fixed work was the cost, not the loads.
     (b) max backward (vector launches): the tie check as ONE packed max of the earlier window elements
     compared with y (earlier_max_rule; 4 instructions per 16-byte vector) instead of VEC unpacked NaN-aware
     matches per earlier element; with random data ~60% of (dx vector, covering window) pairs have a channel
     matching y, so this check ran for most of them. Same elements get the gradient (bitwise same dx).
     Prediction (bf16): max fwd 67% -> 78-85% of copy, avg fwd 55% -> 70-80% (their remaining cost: the 9
     loads and the unpack / add per element); fp32 fwd ~75-85%; max bwd 10.7% -> 14-18% of copy
     (1.1-1.5x torch): the coordinate divisions and covering windows remain.
     Measured (copy 4178 GB/s; all GPU tests pass, incl. the fwd_rows / fwd bitwise comparison): bf16 max fwd
     3238 GB/s 77.5% (5.45x torch; was 67.1%), avg fwd 67.4% / 67.7% incl. / excl. padding (7.8x; was
     54.6%), max bwd 549 GB/s 13.1% (1.04x; was 10.7%, 0.85x), avg bwd unchanged 15.2%; fp32 max fwd 89.0%
     (3.35x; was 72.7%), avg fwd 87.7% (5.21x; was 69.5%), max bwd 18.6% (0.76x; unchanged: fp32's tie check
     was already cheap, 4 channels per vector). Max forward and fp32 forward are inside or above the
     prediction; bf16 average forward is below it (67% vs 70-80%): still instruction-bound on the per-element
     unpack + add (8 channels x 9 loads x 2 instructions per output, vs 4 packed max per load); bf16 max
     backward at the low end (the fixed per-thread work now dominates it).
  v4 (this commit): why average was slower than max (bf16 68% vs 78%, fp32 88% vs 89%): per output of 8
     bf16 channels, counted from the source (PTX as the proxy; no SASS tool here): scan's walk ~5-6
     instructions per load (pointer step, wrap counters, the count predicate) = ~50; the sum 9 x (8 unpacks
     + 8 adds) = ~144; the store through store_blend: 8 multiplies by alpha, 8 single conversions and ~16
     shift / mask merges into the words (Frag::set) = ~40. Max pays the walk too but only 36 packed maxes and
     no conversion; fp32 averages have no unpack and half the channels per 16 bytes. So: not the division
     (one reciprocal per output since v3), not the exclude count (the same two rows measure the same), not
     bytes in flight (the same 9 loads of 16 bytes as max): the per-element instructions of 16-bit data.
     (a) FAST3 (PYDNN_POOL_FLAG_FAST3, ROWS_FAST3): an output whose in-bounds window is 3 x 3 loads it with
     straight-line offsets (9 per thread, computed once) instead of scan's walk: the same elements in the same
     order, so bitwise the scan path (GPU test, max and averages, plain and blended). (b) 16-bit outputs are
     converted in pairs (cvt.rn.bf16x2.f32 / f16x2: the same rounding, no merge), and the plain average
     (alpha 1, beta 0) skips store_blend. (c) COLS variant (PYDNN_POOL_FLAG_COLS, off): 3 x 3 / 2 averages
     sum each x column of a strip once (27 loads per 4 outputs instead of 36, ~1/3 fewer unpack + add),
     different addition order (tolerance, not bitwise).
     Prediction: bf16 avg 68% -> 76-78% with (a)+(b) (~190 instead of ~245 instructions per output), COLS a
     few points more; max 78% -> 82-85% (~65 instead of ~105).
     Measured (copy 4181 GB/s, v3 timed in the same run as "[v3: no FAST3]"; all 371 GPU tests of the three
     families pass): bf16 max fwd 3411 GB/s 81.6% (5.74x torch; v3 78.3%), avg incl. pad 81.4% (9.41x; v3
     68.4%), avg excl. pad 81.2% (9.27x; v3 68.3%); fp32 max 92.2% (3.46x), avg 91.5% (5.44x). Averages
     gained 13 points, above the prediction, and now match max: the walk and the store were the cost. COLS
     measured SLOWER (bf16 75.2%, fp32 86.0%): fewer loads but 6 instead of 9 in flight per step and longer
     dependent add chains; kept off (a tested variant). Backward unchanged (max 13.1%, avg 15.2%).
  Next (not measured): max backward (13% of copy) is the family's gap: coordinates from the launch shape as
  fwd_rows does (a thread per strip of dx along w sharing its covering rows), or a block per dx tile
  computing each covering window's first maximum once into shared memory (the tie scans of ~60% of
  (element, window) pairs are most of its loads).

CNN cases (`python3 tools/bench.py --families pooling.run_cnn`, issue 20 as issue 17's demo shows it): the
two 2x2 / 2 max pools of examples/train_cnn.py at batch 256, bf16 NCHW (contiguous, as the demo's autocast
conv outputs are), forward and backward, pydnn beside PyTorch (max_pool2d / max_pool2d_with_indices_backward
on the same tensors) and beside pydnn's scalar kernels (WIN2 off) in the same run.
  pool 1  x 256x64x32x32 -> y 256x64x16x16   fwd x + y = 33.6 + 8.4 MB; bwd x + y + dy + dx = 83.9 MB
  pool 2  x 256x128x16x16 -> y 256x128x8x8   fwd 16.8 + 4.2 MB;         bwd 42.0 MB
Accounting of the demo's gap (H200 profile: pool 1 bwd 0.580 ms vs PyTorch 0.196; pool 2 0.227 + 0.365 vs
0.077 + 0.122): NCHW has no contiguous channels, so both directions took the scalar VEC = 1 kernels: one thread
per 2-byte element, 5 runtime 32-bit div / mod for its coordinates, 64-bit offset products, the window /
covering bounds per thread; backward gathered from the covering window (one here) reading x (2 B), y and dy
(2 B each, 4 threads per element) and, after ReLU, most windows are all zeros, so most elements MATCH y and
scan the earlier window elements (the tie check: up to 3 more loads + compares). About 8.4M threads of
~150-250 instructions each for 84 MB: instruction-bound at ~15% of copy. The bridge adds no copy: dx comes
from torch.empty_like (no memset), dy is made dense only when it is not (it is), one launch per call.
v5 (this commit): win2_fwd / win2_bwd, kh x 2 windows with stride kh x 2, no padding, tiling x exactly, w
contiguous (WIN2): a thread per 16 bytes of x along w of each of the window's rows (8 bf16 = 4 outputs),
x / dx in 16-byte vectors, y / dy in 8-byte ones, 3 32-bit div / mod per thread (not per element), each dx
element written once from its one window with the first-match rule applied in registers (no earlier-element
re-loads). Bitwise the scalar kernels' y and dx (GPU test).
  Prediction (H200, copy ~4150 GB/s): pool 1 bwd 0.025-0.035 ms (60-80% of copy; scalar ~0.13-0.2), fwd
  0.012-0.016 ms; pool 2 bwd 0.014-0.02 ms, fwd 0.007-0.01 ms (smaller than L2 + launch tail: 50-70%);
  >= 2x PyTorch's kernels on all four rows.
"""
import torch
import torch.nn.functional as F

import pydnn
from pydnn import tuning
from bench import DT, time_ms


def _desc(t, pdt):
    d = pydnn.create_tensor_descriptor()
    pydnn.set_tensor_nd_descriptor(d, pdt, t.dim(), list(t.shape), list(t.stride()))
    return d


def _pool(mode):
    d = pydnn.create_pooling_descriptor()
    pydnn.set_pooling2d_descriptor(d, mode, pydnn.PYDNN_NOT_PROPAGATE_NAN, 3, 3, 1, 1, 2, 2)
    return d


def run(b):
    h = b.h
    cl = torch.channels_last
    for dname in ("bf16", "fp32"):
        tdt, pdt = DT[dname]
        x = torch.randn(64, 64, 112, 112, dtype=tdt, device="cuda").contiguous(memory_format=cl)
        y = torch.empty(64, 64, 56, 56, dtype=tdt, device="cuda").contiguous(memory_format=cl)
        xd, yd = _desc(x, pdt), _desc(y, pdt)
        es = x.element_size()
        fwd_bytes = (x.numel() + y.numel()) * es
        xp, yp = x.data_ptr(), y.data_ptr()
        cases = [("max", pydnn.PYDNN_POOLING_MAX, lambda: F.max_pool2d(x, 3, 2, 1), "max_pool2d"),
                 ("avg incl. pad", pydnn.PYDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING,
                  lambda: F.avg_pool2d(x, 3, 2, 1), "avg_pool2d")]
        if dname == "bf16":
            cases.append(("avg excl. pad", pydnn.PYDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING,
                          lambda: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False), "avg_pool2d(no pad count)"))
        for name, mode, tfn, tname in cases:
            pd = _pool(mode)
            ms_p = time_ms(lambda: pydnn.pooling_forward(h, pd, 1.0, xd, xp, 0.0, yd, yp))
            ms_t = time_ms(tfn)
            b.row("pooling", f"{name} 3x3/2 NHWC fwd", dname, fwd_bytes, ms_p, ms_t, tname)
            if dname == "bf16":  # v3 (no FAST3) in the same run
                from pydnn.ops import pooling as P
                tuning.pooling.ROWS_FAST3 = False
                h.prepared.clear()
                try:
                    ms_v3 = time_ms(lambda: pydnn.pooling_forward(h, pd, 1.0, xd, xp, 0.0, yd, yp))
                finally:
                    tuning.pooling.ROWS_FAST3 = True
                    h.prepared.clear()
                b.row("pooling", f"{name} 3x3/2 NHWC fwd [v3: no FAST3]", dname, fwd_bytes, ms_v3, None, "-")
            if mode != pydnn.PYDNN_POOLING_MAX:  # the shared column sums (COLS), same run
                from pydnn.ops import pooling as P
                tuning.pooling.ROWS_COLS = True
                h.prepared.clear()
                try:
                    ms_c = time_ms(lambda: pydnn.pooling_forward(h, pd, 1.0, xd, xp, 0.0, yd, yp))
                finally:
                    tuning.pooling.ROWS_COLS = False
                    h.prepared.clear()
                b.row("pooling", f"{name} 3x3/2 NHWC fwd [COLS]", dname, fwd_bytes, ms_c, None, "-")
        # backward
        dy = torch.randn_like(y)
        dx = torch.empty_like(x)
        dyp, dxp = dy.data_ptr(), dx.data_ptr()
        pd = _pool(pydnn.PYDNN_POOLING_MAX)
        ms_p = time_ms(lambda: pydnn.pooling_backward(h, pd, 1.0, yd, yp, yd, dyp, xd, xp, 0.0, xd, dxp))
        _, idx = F.max_pool2d(x, 3, 2, 1, return_indices=True)
        ms_t = time_ms(lambda: torch.ops.aten.max_pool2d_with_indices_backward(dy, x, [3, 3], [2, 2], [1, 1], [1, 1],
                                                                               False, idx))
        b.row("pooling", "max 3x3/2 NHWC bwd", dname, 2 * (x.numel() + dy.numel()) * es, ms_p, ms_t,
              "max_pool2d_with_indices_backward")
        pd = _pool(pydnn.PYDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING)
        ms_p = time_ms(lambda: pydnn.pooling_backward(h, pd, 1.0, yd, yp, yd, dyp, xd, xp, 0.0, xd, dxp))
        ms_t = time_ms(lambda: torch.ops.aten.avg_pool2d_backward(dy, x, [3, 3], [2, 2], [1, 1], False, True, None))
        b.row("pooling", "avg 3x3/2 NHWC bwd", dname, (x.numel() + dy.numel()) * es, ms_p, ms_t, "avg_pool2d_backward")

    # NCHW (informational) and global average pooling (ResNet head: 256x2048x7x7 NHWC)
    tdt, pdt = DT["bf16"]
    x = torch.randn(64, 64, 112, 112, dtype=tdt, device="cuda")
    y = torch.empty(64, 64, 56, 56, dtype=tdt, device="cuda")
    xd, yd = _desc(x, pdt), _desc(y, pdt)
    pd = _pool(pydnn.PYDNN_POOLING_MAX)
    ms_p = time_ms(lambda: pydnn.pooling_forward(h, pd, 1.0, xd, x.data_ptr(), 0.0, yd, y.data_ptr()))
    ms_t = time_ms(lambda: F.max_pool2d(x, 3, 2, 1))
    b.row("pooling", "max 3x3/2 NCHW fwd", "bf16", (x.numel() + y.numel()) * 2, ms_p, ms_t, "max_pool2d")
    del x, y
    x = torch.randn(256, 2048, 7, 7, dtype=tdt, device="cuda").contiguous(memory_format=cl)
    y = torch.empty(256, 2048, 1, 1, dtype=tdt, device="cuda").contiguous(memory_format=cl)
    xd, yd = _desc(x, pdt), _desc(y, pdt)
    ms_p = time_ms(lambda: pydnn.global_average_pooling_forward(h, 1.0, xd, x.data_ptr(), 0.0, yd, y.data_ptr()))
    ms_t = time_ms(lambda: F.adaptive_avg_pool2d(x, 1))
    b.row("pooling", "global avg 256x2048x7x7 NHWC fwd", "bf16", (x.numel() + y.numel()) * 2, ms_p, ms_t,
          "adaptive_avg_pool2d(1)")


def run_cnn(b):
    """The CNN demo's NCHW 2x2 / 2 max pools (see the docstring), win2 beside the scalar kernels and PyTorch."""
    h = b.h
    tdt, pdt = DT["bf16"]
    for name, shape in (("pool 1", (256, 64, 32, 32)), ("pool 2", (256, 128, 16, 16))):
        x = torch.relu(torch.randn(shape, dtype=tdt, device="cuda"))
        yshape = shape[:2] + (shape[2] // 2, shape[3] // 2)
        y = torch.empty(yshape, dtype=tdt, device="cuda")
        dy = torch.randn(yshape, dtype=tdt, device="cuda")
        dx = torch.empty_like(x)
        xd, yd = _desc(x, pdt), _desc(y, pdt)
        xp, yp, dyp, dxp = x.data_ptr(), y.data_ptr(), dy.data_ptr(), dx.data_ptr()
        pd = pydnn.create_pooling_descriptor()
        pydnn.set_pooling2d_descriptor(pd, pydnn.PYDNN_POOLING_MAX, pydnn.PYDNN_PROPAGATE_NAN, 2, 2, 0, 0, 2, 2)
        fwd = lambda: pydnn.pooling_forward(h, pd, 1.0, xd, xp, 0.0, yd, yp)  # noqa: E731
        bwd = lambda: pydnn.pooling_backward(h, pd, 1.0, yd, yp, yd, dyp, xd, xp, 0.0, xd, dxp)  # noqa: E731
        _, idx = F.max_pool2d(x, 2, 2, return_indices=True)
        fb = (x.numel() + y.numel()) * 2
        bb = 2 * (x.numel() + y.numel()) * 2
        tag = "x".join(map(str, shape))
        h.prepared.clear()
        ms_f, ms_b = time_ms(fwd), time_ms(bwd)
        b.row("pooling", f"cnn {name} max 2x2/2 NCHW {tag} fwd", "bf16", fb, ms_f, time_ms(lambda: F.max_pool2d(x, 2, 2)),
              "max_pool2d")
        b.row("pooling", f"cnn {name} max 2x2/2 NCHW {tag} bwd", "bf16", bb, ms_b,
              time_ms(lambda: torch.ops.aten.max_pool2d_with_indices_backward(dy, x, [2, 2], [2, 2], [0, 0], [1, 1],
                                                                              False, idx)),
              "max_pool2d_with_indices_backward")
        tuning.pooling.WIN2 = False
        h.prepared.clear()
        try:
            ms_f0, ms_b0 = time_ms(fwd), time_ms(bwd)
        finally:
            tuning.pooling.WIN2 = True
            h.prepared.clear()
        b.row("pooling", f"cnn {name} max 2x2/2 NCHW {tag} fwd [scalar: WIN2 off]", "bf16", fb, ms_f0, None, "-")
        b.row("pooling", f"cnn {name} max 2x2/2 NCHW {tag} bwd [scalar: WIN2 off]", "bf16", bb, ms_b0, None, "-")

