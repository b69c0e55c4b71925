"""Dropout benchmark: pydnn vs torch.nn.functional.dropout(training=True) (PyTorch's fused Philox kernel)
in the same run, 64M elements (b.n), p = 0.1; plus a channels-last (NHWC) bf16 forward.

Bytes (the fewest the op must move; the torch column is timed on the same count, its own kernel moves
more since it keeps a 1-byte-per-element bool mask):
  forward   x read + y written + the reserve space written (1 bit per element): n * (2 * size + 1/8)
  backward  dy read + reserve read + dx written:                                   n * (2 * size + 1/8)
The floor is that byte count at the copy bandwidth measured in the same run (~4.1 TB/s on the H200).
Target (issue 3): forward >= 85% of copy.

Compute per element (bf16, the tight case): one Philox-4x32-10 call per 8 elements (10 rounds of two
32x32->64 multiplies, two 3-input XORs, the key schedule: ~70 instructions) plus ~6 per element (slice
compare, select, scale, convert): ~15 integer/float instructions per element. At 4.1 TB/s / 4.125 B per
element = 1.0e12 elements/s that is ~1.5e13 instructions/s against ~3.3e13 issue slots/s
(132 SMs x 4 schedulers x 32 lanes x ~1.98 GHz): about half the issue rate, so the kernel should stay
memory-bound. (32 random bits per element would have cost ~25 instructions per element for the Philox
alone and made bf16 issue-bound; hence 16-bit slices, 2^-16 resolution of p.)

Versions (H200, copy ~4140 GB/s in the same run; PyTorch 2.11):
  v1 dense kernel: 256 threads, each lane one whole group of 8 (64 bytes of input in flight per thread),
     all loads issued before the Philox calls, one mask byte per group (a warp writes 32 consecutive
     bytes), (seed, offset) read once per block after the loads, the offset advanced by the last block.
     Strided kernel for anything else (a thread per group, logical-order walk).
     Prediction: bf16 and fp32 90-95% of copy both ways; NHWC far below (informational).
     Measured: forward bf16 86.1% (1.49x torch), fp32 78.8% (1.13x); backward bf16 93.4% (1.14x), fp32
     81.5% (0.89x); NHWC 64x64x128x128 bf16 forward 4.3% (0.07x).
     Reading: fp32 is slower than bf16 in BOTH directions, so not Philox: a lane's two float4 of a group
     are 16 bytes apart from the next lane's, so each store instruction fills half of each sector. bf16
     forward vs backward (86 vs 93%): the Philox work shows (47 registers, 5 blocks per SM). NHWC: the
     walk along H*W touches one 2-byte element per sector.
  v2 warp tiles (lane l loads vectors l, 32 + l, ... of a 32-group tile; a vector takes its group's bits
     from the owning lane with a shuffle): every access instruction is contiguous for every type.
     Register caps from __launch_bounds__ (51 for vector launches: 5 blocks per SM, 64 for element
     launches), no spills. A tile kernel for channels-last layouts (64 x 64 tiles through shared memory,
     read and written along C, processed in logical order).
     Prediction: fp32 forward and backward up to the bf16 backward's ~93%; bf16 unchanged (~86% forward,
     ~93% backward); NHWC bf16 forward 40-60% (scalar 2-byte accesses, like the first transposes of
     tools/PERF.md).
     Measured (copy 4165 GB/s): forward bf16 81.8% (1.41x torch), fp32 92.2% (1.32x); backward bf16
     93.2% (1.14x), fp32 96.5% (1.06x); NHWC bf16 forward 29.2% (0.50x).
     Reading: fp32 as predicted (+13 and +15 points): the half-sector accesses were the fp32 problem.
     bf16 forward LOST 4.3 points although its lane mapping is the same as v1's (NV = 1: no shuffles);
     the one change it sees is the register cap (48 registers, no spill, same 5 blocks per SM, against
     v1's uncapped 47 registers + a 4-byte spill), so ptxas's schedule of the four Philox chains is the
     suspect: target (85%) missed by 3.2 points in this run. Not re-measured (device budget): next try
     MinBlocks<8> = 1 (v1's allocation) and, failing that, 8 groups per thread for 16-bit types.
     NHWC below the prediction: 2-byte scalar accesses along C (128 bytes per warp pair) and only 32
     bytes in flight per thread; next: 16-byte vectors along C and a taller tile.
  v3 (this commit) fwd_packed<T> for the 16-bit dense forward (FWD_PACKED; the "[v2: fwd<T, 8>]" row times
     v2 in the same run). The bytes are counted as above (the 1-bit-per-element reserve space is 1/32 of the
     bf16 bytes, so it is not what separates bf16 from fp32). bf16 moves half fp32's bytes per element, so
     its per-element instructions show: v2 did ~17 per element (Philox ~7 with its key schedule repeated per
     call, keep_bits8 ~3, and per element an unpack, a multiply, a single conversion, a bit test + select
     and the merge into the word). fwd_packed: the thread's 4 Philox calls run round by round (the key bumped
     once per round for all four, four independent chains), and each word of x and of the Philox block is a
     pair of elements: keep = compare of the word's halves with the threshold (high half: word >= t << 16),
     two shift / and unpacks, two multiplies, two selects, one cvt.rn.bf16x2.f32. Same bits as v2 (a GPU test
     compares y and the mask bit for bit, with inf / NaN / -0 / subnormals, p = 0, 0.1, 0.5, 1). PTX count
     952 vs 1433 instructions (the same G = 4 groups, 48 registers, no spills).
     Prediction: bf16 forward 83% -> 87-90% of copy (~12 instead of ~17 instructions per element).
     Measured (two runs, copy 4180 / 4181 GB/s): bf16 forward 3744 / 3678 GB/s = 89.6% / 88.0% of copy
     (1.54x / 1.50x torch; v2 in the same runs 82.9% / 82.9%). Target (85%) met. fp32 forward (unchanged
     kernel) 92.5% / 90.2%: run-to-run spread of ~2 points. A G = 8 variant (128 bytes in flight per
     thread) spilled under any cap that keeps 3 blocks per SM and was dropped before measuring.
"""
import torch
import torch.nn.functional as F

import pydnn
from pydnn import tuning
from bench import DT, time_ms

P = 0.1


def _desc(t, dtype):
    d = pydnn.create_tensor_descriptor()
    dims, strides = list(t.shape), list(t.stride())
    pydnn.set_tensor_nd_descriptor(d, dtype, len(dims), dims, strides)
    return d


def run(b):
    h = b.h
    states = torch.zeros(4, dtype=torch.int64, device="cuda")
    drop = pydnn.create_dropout_descriptor()
    pydnn.set_dropout_descriptor(drop, h, P, states.data_ptr(), 32, 1234)
    for dname in ("bf16", "fp32"):
        tdt, pdt = DT[dname]
        x = torch.randn(b.n, dtype=tdt, device="cuda")
        y = torch.empty_like(x)
        dx = _desc(x, pdt)
        nres = pydnn.dropout_get_reserve_space_size(dx)
        r = torch.empty(nres, dtype=torch.uint8, device="cuda")
        xp, yp, rp = x.data_ptr(), y.data_ptr(), r.data_ptr()
        nbytes = 2 * x.numel() * x.element_size() + nres
        ms_p = time_ms(lambda: pydnn.dropout_forward(h, drop, dx, xp, dx, yp, rp, nres))
        ms_t = time_ms(lambda: F.dropout(x, P, training=True))
        b.row("dropout", "forward p=0.1", dname, nbytes, ms_p, ms_t, "F.dropout(training=True)")
        if dname == "bf16":  # v2's kernel (fwd<T, 8>) in the same run
            from pydnn.ops import dropout as D
            tuning.dropout.FWD_PACKED = False
            h.prepared.clear()
            try:
                ms_v2 = time_ms(lambda: pydnn.dropout_forward(h, drop, dx, xp, dx, yp, rp, nres))
            finally:
                tuning.dropout.FWD_PACKED = True
                h.prepared.clear()
            b.row("dropout", "forward p=0.1 [v2: fwd<T, 8>]", dname, nbytes, ms_v2, None, "-")
        # backward: dx = dy * mask / (1 - p)
        g = torch.randn_like(x)
        gx = torch.empty_like(x)
        gp, gxp = g.data_ptr(), gx.data_ptr()
        _, tmask = torch.native_dropout(x, P, True)
        ms_p = time_ms(lambda: pydnn.dropout_backward(h, drop, dx, gp, dx, gxp, rp, nres))
        ms_t = time_ms(lambda: torch.ops.aten.native_dropout_backward(g, tmask, 1.0 / (1.0 - P)))
        b.row("dropout", "backward p=0.1", dname, nbytes, ms_p, ms_t, "native_dropout_backward")
    # channels-last: the tile kernel (the mask follows the logical NCHW order)
    tdt, pdt = DT["bf16"]
    n, c = 64, 64
    side = int((b.n // (n * c)) ** 0.5)
    x = torch.randn(n, c, side, side, dtype=tdt, device="cuda").to(memory_format=torch.channels_last)
    y = torch.empty_like(x)
    dx = _desc(x, pdt)
    nres = pydnn.dropout_get_reserve_space_size(dx)
    r = torch.empty(nres, dtype=torch.uint8, device="cuda")
    xp, yp, rp = x.data_ptr(), y.data_ptr(), r.data_ptr()
    ms_p = time_ms(lambda: pydnn.dropout_forward(h, drop, dx, xp, dx, yp, rp, nres))
    ms_t = time_ms(lambda: F.dropout(x, P, training=True))
    b.row("dropout", f"forward NHWC {n}x{c}x{side}x{side} (tile)", "bf16", 2 * x.numel() * 2 + nres, ms_p, ms_t,
          "F.dropout(training=True)")
