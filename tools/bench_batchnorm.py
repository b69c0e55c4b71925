"""Batch normalization benchmark: pydnn vs PyTorch in the same run, on the issue's problem: x
64x256x56x56 bf16 NHWC (channels_last), SPATIAL, with running statistics and saved mean / invstd.

Bytes (the fewest the op must move; the torch column is timed on the same count):
  training forward   x read once + y written once                  (bf16: 102.8 + 102.8 MB)
                     pydnn's rows path reads x twice (stats pass, apply pass): 308 MB actually move
                     (x is 2x the 50 MB L2, so the second read comes mostly from DRAM). The floor at
                     one read is 2 x 102.8 MB / copy bandwidth; the two-pass floor is 1.5x that.
  inference          x read once + y written once
  backward           x and dy read once + dx written once           (3 x 102.8 MB); pydnn reads x and dy
                     twice (stats pass, apply pass): 5 x 102.8 MB actually move
  Ex BN_ADD_ACTIVATION forward: x, z read + y written (the 1-byte mask per element is not counted)
Target (issue 3): training forward >= 2x PyTorch (F.batch_norm(training=True) on channels_last);
inference >= 85% of copy.

Kernels (ptx/batchnorm.cu, rows layout): fwd_stats (a block per chunk of rows, 16-byte loads of 8
channels per thread, per-thread Chan merges, ~8 blocks per SM in one wave), fwd_final (per channel, merge
the chunks in order), fwd_apply (one pass, 4 rows of 16 bytes in flight per thread), fwd_head (the 8 rows
whose bytes held the constants; non-Ex only). The "alone" rows time each launch of the sequence by itself
(final: the partials' bytes; head: ~8 KB, its time is what matters).

Measured on an NVIDIA H200 (copy 4166-4169 GB/s), PyTorch 2.11 / cuDNN 9.19 in the same run; GB/s on the
one-read byte counts above; ratio = PyTorch time / pydnn time.

  v1  prediction: ~57% of copy, ~1.4x PyTorch (stats and apply each near the bandwidth).
      got: training forward bf16 991 GB/s (23.8%, 1.13x PyTorch's 879), fp32 1974 (47.4%, 0.87x);
      inference bf16 3207 (76.9%, 1.33x), fp32 3881 (93.1%, 1.60x); backward bf16 996 (0.60x), fp32 1966
      (0.85x); NCHW (gen) bf16 166 (0.26x). bf16 and fp32 took the same time per element: the final kernel
      (8 blocks, each thread merging 132 partials one dependent L2 load + double division at a time).
  v2  (this) final: 32 chunk lanes per channel, 4 loads in flight; paired bf16x2 / f16x2 conversions;
      apply / inference prefetch only x (80 / 68 registers: 3 blocks per SM); apply walks its chunks last
      first (the stats pass left the end of x in L2); gen: 1024 threads, 4 loads in flight, 32-bit index
      arithmetic. Prediction: bf16 training ~100-110 us (~2x PyTorch).
      got: training forward bf16 1318 GB/s (31.6%, 1.50x PyTorch's 881), fp32 2294 (55.1%, 1.01x; 617 MB
      actually moved = 83% of copy); Ex BN bf16 1386 (1.56x); Ex BN+add+ReLU bf16 1540 (1.78x), fp32 2532
      (1.74x); inference bf16 3344 (80.3%, 1.38x), fp32 3860 (92.7%, 1.59x); backward bf16 1255 (30.1%,
      0.76x), fp32 2145 (51.5%, 0.93x); NCHW (gen) bf16 296 (0.46x), fp32 589 (0.30x).
      Breakdown bf16 (alone): stats 61 us (40% of copy on 102.8 MB), final 15.6 us, apply 80 us (61%),
      head ~8 us; fp32: stats 91%, apply 92%, final 12.5 us. So fp32 is at the two-read floor and bf16 is
      not: its stats and apply blocks are half as long (same block count, half the bytes per element) and
      do twice the arithmetic per byte.
  Next (not measured): bf16 stats with fewer, longer blocks (4 per SM) or two vectors per thread per row;
      merge the chunks inside the stats kernel (last block per channel group merges, in chunk order) to
      drop the final launch; fold the head rows into that last block; target ~93 us = ~2.5x PyTorch.
      Inference bf16: 80.3% vs the 85% target (fp32 92.7%): the same 16-bit per-byte overhead.
      NCHW: a planes kernel (channel-major, contiguous H*W runs) instead of gen.
  v3  FAST16 (16-bit data with 16-byte vectors; pydnn/ops/batchnorm.py FAST16 = False gives v2 back; the
      "[v2: FAST16 off]" rows time v2 in the same run). ptxas (sm_90) said what v2 did not: fwd_stats<bf16, 8>
      used 75-79 registers, so 3 blocks of 256 per SM were resident and the 1056 stats blocks (8 per SM
      aimed) ran in 2.7 waves of short blocks (191 rows, 6 steps of 4 rows per thread).
      a) bf16 stats: 8 rows in flight per thread (packed loads, converted where used: 80 registers, no
         spills under a 3-blocks cap), launched as ONE wave of 3 blocks per SM (396 chunks of 507 rows).
         Prediction: stats 61 -> ~30 us (~85% of copy on one read); final merges 396 partials, not 1056:
         15.6 -> ~7 us. (half keeps v2 stats: the same kernel spills 44 bytes for half.)
      b) plain forward apply (no z / ReLU / blending): fwd_apply_plain, 8 rows of 16 bytes in flight,
         alpha folded into (alpha * scale * invstd, alpha * bias) held in registers for the thread's 8
         channels, pointer-stepped addressing; 256-row blocks (784 = ~2 waves). Prediction: 80 -> ~62 us
         (~80% of copy on x + y).
      c) head: fwd_head_batched, 8 elements per thread with their loads issued together (2 round trips,
         not ~12): ~8 -> ~3 us.
      d) inference: infer_rows with 8 rows in flight (80 registers, no spills): 80.3% -> ~87% of copy.
         (infer_rows also folds alpha into its (a, b) and steps pointers: bitwise the same for alpha == 1.)
      Prediction, training forward bf16: ~105 us in sequence (~2.2x PyTorch).
      got (copy 4146 GB/s; v2 timed in the same run): training forward bf16 1756 GB/s (42.4%, 117 us,
      2.03x PyTorch's 865; v2 1469 GB/s = 140 us in this run); Ex BN bf16 1907 (2.19x), Ex BN+add+ReLU
      bf16 1807 (2.11x: its apply is still v2, the stats are new). Alone: a) stats 31.8 us (78.0%; v2 42.8
      us, 57.9% in this run, 61 us in the v2 run: run-to-run spread, or v2's stats
      now keeping their loads packed too, 79 -> 72 registers), final 11.9 us (v2 15.2 us): both as predicted or close; b) fwd_apply_plain 66.5 us
      (74.5%; v2 80.4 us, 61.7%), predicted ~62; c) head: the breakdown's GB/s column rounds to 1 for both
      (~5-15 us), not resolved; d) inference bf16 80.9% vs v2 80.3% in the same run: no gain, so dropped
      (FAST16 inference takes the U = 4 kernel; the rows in flight are not what limits it). fp32 unchanged
      (training 2301 GB/s 1.01x, inference 92.0%).
  Next (not measured): fwd_final is now 10% of the bf16 forward for 0.8 MB of partials (32 blocks, latency
      bound): merge the chunks in the stats kernel (last block done per channel group, chunk order) or give
      final more blocks; the head timed with its own byte count; 16-bit inference / apply sit at 75-81% of
      copy with twice fp32's rows in flight, so the limiter is something else (profile: DRAM read/write
      turnaround, issue slots for the conversions); f16 stats at U = 8 spill under the 3-block cap.
  v4  inference: infer_rows_smem (INFER_SMEM; "[v3: infer_rows]" times v3 in the same run). Per thread,
      infer_rows computes (a, b) for its VEC features before issuing any load: 4 parameter loads, a division
      and a square root per feature, repeated by each of the block's 8 row threads, on a block of 4 steps x
      4 rows = 256 bytes of x per thread. bf16 has VEC = 8 features per 16 bytes (fp32: 4), so twice the
      set-up per byte, and every block opens with a gap in its memory traffic of one dependent L2 round trip
      plus the division. infer_rows_smem issues the first step's loads first, then the block computes each
      feature's (a, b) once (thread i: feature i) into shared memory, one barrier, same expressions (bitwise
      v3). Block length INFER_STEPS measured, since v3's U = 8 result pointed away from bytes in flight.
      Prediction: bf16 82% -> 85-88%, fp32 unchanged (~92%).
      Measured (copy 4180 / 4181 GB/s, two runs): bf16 at 2 / 4 / 8 / 16 / 64 steps 88.3% / 85.5-86.0% /
      82.5-82.9% / 81.9% / 65.5%, v3 82.2% / 81.9% in the same runs; fp32 93.7% / 93.2-93.5% / 91.4-91.6% /
      89.8% / 87.2%, v3 92.5%. Shorter blocks win (more waves, a smaller tail: 64 steps is 98 blocks for
      396 slots); the default is 2 steps: bf16 3690 GB/s 88.3% (1.51x PyTorch's 2451), target (85%) met;
      fp32 93.7%.
  v5  (H100 80GB HBM3, copy 2972-2978 GB/s; the issue's targets are set on the H100.) The run at c39b3a3 put
      the bf16 training forward at 1462 GB/s (49.1% of copy, 140.6 us), 1.79x PyTorch's 815: short of 2x on
      this GPU (2.03x on the H200). Alone: stats 41.5 us (83.1%), final 6.8 us, fwd_apply_plain 81.9 us (84.3%
      on x + y), head ~8 us (one block, latency-bound); the sum is 138 us, ~2.4 us of gaps. The inference
      kernel (infer_rows_smem: 2-step blocks, per-block constants in shared memory) does apply's work at 93%
      of copy in the same run, and the Ex BN form (no head: the constants sit in the workspace) ran 1.90x.
      Change: the plain forward of a call that keeps the saved statistics (as frameworks do) applies through
      fwd_apply_saved, infer_rows_smem's code (one rows_affine, TRAIN = true) with the constants taken from
      bnScale / bnBias and the saved mean / inverse std that fwd_final just wrote, blocks last chunk first
      (the L2 trick of v2); nothing in y needs protecting, so every row is applied and the head launch is
      gone. Prediction: apply 81.9 -> ~74 us, head and one gap gone: ~124 us, ~2.03x.
      Measured (5361fed, same run, APPLY_SAVED off timed as "[v3: apply + head, APPLY_SAVED off]"): bf16
      1660 GB/s (55.9%, 2.05x PyTorch's 811; the v3 sequence 1443 GB/s, 1.78x), fwd_apply_saved alone 94.1%
      of copy (fwd_apply_plain 84.3% in the previous run); fp32 1839 GB/s (1.03x; v3 1764, 0.99x),
      fwd_apply_saved alone 97.8%. Ex BN bf16 2.06x (it takes the same apply). Target (2x) met on the H100,
      by 2.5%. Calls without saved statistics keep v3 (apply_plain + head).
  Not done: backward bf16 (0.76x PyTorch): bwd_stats alone runs at 41% of copy on 2 reads (x, dy) vs fp32's
      82%; the same 16-bit per-element overhead as v2's stats had, likely the same cure (fwd_stats' v3:
      packed loads, 8 rows in flight, one wave); not attempted in this session.

CNN cases (`python3 tools/bench.py --families batchnorm.run_cnn`; issue 20 as issue 17's demo shows it): the
two batch norms of examples/train_cnn.py at batch 256, bf16 NCHW, BN + ReLU through the Ex forms (as
pydnn.torch's BatchNorm2d + ReLU calls them), training forward and backward, beside PyTorch (F.batch_norm +
relu; aten.native_batch_norm_backward after threshold_backward) and beside the scalar gen kernels (PLANES
off) in the same run.
  bn 1  x 256x64x32x32   fwd x + y + mask = 33.6 + 33.6 + 16.8 MB; bwd x + dy + mask + dx = 117 MB
  bn 2  x 256x128x16x16  fwd 16.8 + 16.8 + 8.4 MB;                bwd 58.7 MB
  (byte floors at ~4 TB/s: bn 1 fwd 21 us, bwd 29 us; bn 2 fwd 11 us, bwd 15 us)
Accounting of the demo's gap (H200 profile: bn 1 0.486 + 0.907 ms vs PyTorch 0.356 + 0.497; bn 2 0.456 +
0.234 vs 0.155 + 0.152): NCHW SPATIAL is not the rows layout (the channels are not innermost), so every call
took the gen kernels: ONE block per channel (64 / 128 blocks on 132 SMs: half the GPU idle for bn 1), 1024
(fwd) / 512 (bwd) threads each walking the channel's N * H * W elements one 2-byte element at a time, a
32-bit div / mod (red_off) and double-precision conversion per element, two passes (statistics, then
outputs). Per SM ~4 loads of 2 bytes in flight per thread: ~240 GB/s overall for bn 1's forward (~6% of
copy). The bridge adds no copy or memset: y / dx from empty_like, the Ex workspace size 0 for gen (no
workspace allocation), the reserve space is the mask, one launch per call.
v6 (this commit): fwd_planes / bwd_planes (PLANES): the same two passes and block-per-channel order, with
16-byte vectors along the contiguous H * W run (one red_off per 8 bf16 elements, packed loads, kUnroll = 4
vectors = 64 bytes in flight per thread in the statistics pass and the forward's output pass, 2 vectors of
x and dy in backward's output pass (4 spill at the 128-register cap of its 512 threads), 512 threads), mask
as 8-byte vectors; Chan batches of up to 32 values. Still one block per channel (a split over N with a fixed-order combine would be the next step for
C < #SMs).
  Prediction (H200): bn 1 fwd 60-100 us (64 SMs at ~25-35 GB/s each, x re-read from L2), bwd 100-160 us;
  bn 2 fwd 20-40 us, bwd 35-60 us; each >= 2x PyTorch's time and >= 4x the gen kernels'.
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


def _breakdown(b, h, op, dname, n):
    """Each launch of the last rows-path plan of `op` timed alone (its parameters as the last call left
    them: every launch only reads what the sequence before it wrote, so repeating one is harmless)."""
    from pydnn._cuda import driver

    plans = [v for k, v in h.prepared.items() if isinstance(k, tuple) and k and k[0] == op and k[1] is False]
    if not plans:
        return
    pl = plans[-1]
    seq = next((s for name, s in pl.seqs.items() if name.startswith("rows") and all(lc.func for lc in s)), None)
    if seq is None:
        return
    g = pl.geom
    part = pl.scratch[2] * g.feats * (2 if op == "bn_fwd" else 4) * pl.asize
    nbytes = {"stats": n if op == "bn_fwd" else 2 * n, "apply": 2 * n if op == "bn_fwd" else 3 * n,
              "final": part, "head": 2 * 16 * g.feats}  # final: the partials read; head: ~its rows read + written
    for lc in seq:
        def one(lc=lc):
            for k, v in lc.fields.items():
                setattr(pl.params, k, v)
            driver.launch_args(lc.func, lc.grid, lc.block, 0, h.cu_stream, pl.argv)
        ms = time_ms(one)
        kind = lc.kernel.split("_")[1]
        b.row("batchnorm", f"  {lc.kernel} alone (grid {lc.grid[0]}x{lc.grid[1]}, block {lc.block[0]}x{lc.block[1]})",
              dname, nbytes.get(kind, 1), ms, None, "-")


_BN_KEYS = ("bn_fwd", "bn_infer", "bn_bwd", "bn_fwd_rec", "bn_bwd_rec")  # plans and launch records


def _forget(h):
    for k in [k for k in h.prepared if isinstance(k, tuple) and k and k[0] in _BN_KEYS]:
        del h.prepared[k]


def _v2(b, h, fn, case, dname, nbytes, op=None, n=0):
    """The same call with FAST16 off (the v2 kernels), in the same run, for the comparison."""
    from pydnn.ops import batchnorm as B

    tuning.batchnorm.FAST16, tuning.batchnorm.APPLY_SAVED = False, False
    _forget(h)
    try:
        ms = time_ms(fn)
        if op:
            _breakdown(b, h, op, dname + "v2", n)
        b.row("batchnorm", case + " [v2: FAST16 off]", dname, nbytes, ms, None, "-")
    finally:
        tuning.batchnorm.FAST16, tuning.batchnorm.APPLY_SAVED = True, True
        _forget(h)


def _infer_variants(b, h, fn, dname, nbytes):
    """Inference with the v3 kernel (infer_rows) and infer_rows_smem at other block lengths, same run."""
    from pydnn.ops import batchnorm as B

    saved = tuning.batchnorm.INFER_SMEM, tuning.batchnorm.INFER_STEPS
    try:
        for smem, steps, label in ((False, B.APPLY_STEPS, "v3: infer_rows"), (True, 4, "v4 steps 4"),
                                   (True, 8, "v4 steps 8")):
            tuning.batchnorm.INFER_SMEM, tuning.batchnorm.INFER_STEPS = smem, steps
            _forget(h)
            b.row("batchnorm", f"inference NHWC [{label}]", dname, nbytes, time_ms(fn), None, "-")
    finally:
        tuning.batchnorm.INFER_SMEM, tuning.batchnorm.INFER_STEPS = saved
        _forget(h)


def run(b):
    h = b.h
    cl = torch.channels_last
    S = pydnn.PYDNN_BATCHNORM_SPATIAL_PERSISTENT
    for dname in ("bf16", "fp32"):
        tdt, pdt = DT[dname]
        x = torch.randn(64, 256, 56, 56, dtype=tdt, device="cuda").contiguous(memory_format=cl)
        y = torch.empty_like(x)
        dy = torch.randn_like(x)
        dx = torch.empty_like(x)
        z = torch.randn_like(x)
        C = x.shape[1]
        f32 = dict(dtype=torch.float32, device="cuda")
        w, bias = torch.rand(C, **f32) + 0.5, torch.randn(C, **f32)
        rm, rv = torch.zeros(C, **f32), torch.ones(C, **f32)
        sm, si = torch.empty(C, **f32), torch.empty(C, **f32)
        ds, db = torch.empty(C, **f32), torch.empty(C, **f32)
        xd = _desc(x, pdt)
        bd = pydnn.create_tensor_descriptor()
        pydnn.derive_bn_tensor_descriptor(bd, xd, S)
        es = x.element_size()
        n = x.numel() * es
        xp, yp, dyp, dxp, zp = x.data_ptr(), y.data_ptr(), dy.data_ptr(), dx.data_ptr(), z.data_ptr()
        P = [t.data_ptr() for t in (w, bias, rm, rv, sm, si, ds, db)]

        def fwd():
            pydnn.batch_normalization_forward_training(h, S, 1.0, 0.0, xd, xp, xd, yp, bd, P[0], P[1], 0.1, P[2], P[3],
                                                       1e-5, P[4], P[5])

        trm, trv = rm.clone(), rv.clone()
        ms_p = time_ms(fwd)
        _breakdown(b, h, "bn_fwd", dname, n)
        ms_t = time_ms(lambda: F.batch_norm(x, trm, trv, w, bias, training=True, momentum=0.1, eps=1e-5))
        b.row("batchnorm", "training forward NHWC 64x256x56x56 (x read once + y)", dname, 2 * n, ms_p, ms_t,
              "F.batch_norm(training=True)")
        from pydnn.ops import batchnorm as B
        tuning.batchnorm.APPLY_SAVED = False   # v5's comparison: the same call on the v3 apply + head sequence, same run
        try:
            ms_h = time_ms(fwd)
        finally:
            tuning.batchnorm.APPLY_SAVED = True
        b.row("batchnorm", "training forward NHWC [v3: apply + head, APPLY_SAVED off]", dname, 2 * n, ms_h, ms_t, "-")
        if es == 2:
            _v2(b, h, fwd, "training forward NHWC", dname, 2 * n, "bn_fwd", n)

        act = pydnn.create_activation_descriptor()
        pydnn.set_activation_descriptor(act, pydnn.PYDNN_ACTIVATION_RELU, pydnn.PYDNN_NOT_PROPAGATE_NAN, 0.0)
        add = pydnn.PYDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION
        wn = max(pydnn.get_batch_normalization_forward_training_ex_workspace_size(h, S, add, xd, xd, xd, bd, act),
                 pydnn.get_batch_normalization_backward_ex_workspace_size(h, S, add, xd, xd, xd, xd, xd, bd, act))
        rn = pydnn.get_batch_normalization_training_ex_reserve_space_size(h, S, add, act, xd)
        ws = torch.empty(max(wn, 16), dtype=torch.uint8, device="cuda")
        res = torch.empty(max(rn, 16), dtype=torch.uint8, device="cuda")
        for ops, name, nb in ((pydnn.PYDNN_BATCHNORM_OPS_BN, "Ex BN forward (workspace)", 2 * n),
                              (add, "Ex BN+add+ReLU forward (x, z, y)", 3 * n)):
            def fwd_ex(ops=ops):
                pydnn.batch_normalization_forward_training_ex(h, S, ops, 1.0, 0.0, xd, xp, xd, zp, xd, yp, bd, P[0],
                                                              P[1], 0.1, P[2], P[3], 1e-5, P[4], P[5], act,
                                                              ws.data_ptr(), wn, res.data_ptr(), rn)
            ms_p = time_ms(fwd_ex)
            if ops == add:
                ms_t = time_ms(lambda: F.relu(F.batch_norm(x, trm, trv, w, bias, training=True) + z))
            else:
                ms_t = time_ms(lambda: F.batch_norm(x, trm, trv, w, bias, training=True, momentum=0.1, eps=1e-5))
            b.row("batchnorm", name, dname, nb, ms_p, ms_t, "F.batch_norm(training=True)" + (" + z, relu" if ops == add else ""))

        ms_p = time_ms(lambda: pydnn.batch_normalization_forward_inference(h, S, 1.0, 0.0, xd, xp, xd, yp, bd, P[0], P[1],
                                                                           P[2], P[3], 1e-5))
        ms_t = time_ms(lambda: F.batch_norm(x, rm, rv, w, bias, training=False, eps=1e-5))
        b.row("batchnorm", "inference NHWC 64x256x56x56", dname, 2 * n, ms_p, ms_t, "F.batch_norm(training=False)")
        _infer_variants(b, h, lambda: pydnn.batch_normalization_forward_inference(h, S, 1.0, 0.0, xd, xp, xd, yp, bd,
                                                                                  P[0], P[1], P[2], P[3], 1e-5),
                        dname, 2 * n)

        fwd()  # saved statistics for backward
        ms_p = time_ms(lambda: pydnn.batch_normalization_backward(h, S, 1.0, 0.0, 1.0, 0.0, xd, xp, xd, dyp, xd, dxp, bd,
                                                                  P[0], P[6], P[7], 1e-5, P[4], P[5]))
        try:
            ms_t = time_ms(lambda: torch.ops.aten.native_batch_norm_backward(dy, x, w, rm, rv, sm, si, True, 1e-5,
                                                                             [True, True, True]))
        except Exception:  # noqa: BLE001 - torch without that op: no comparison
            ms_t = None
        b.row("batchnorm", "backward, saved stats (x, dy read + dx)", dname, 3 * n, ms_p, ms_t,
              "aten.native_batch_norm_backward")
        ms_p = time_ms(lambda: pydnn.batch_normalization_backward(h, S, 1.0, 0.0, 1.0, 0.0, xd, xp, xd, dyp, xd, dxp, bd,
                                                                  P[0], P[6], P[7], 1e-5, 0, 0))
        b.row("batchnorm", "backward, recomputed stats", dname, 3 * n, ms_p, None, "-")
        _breakdown(b, h, "bn_bwd", dname, n)
        # NCHW for comparison (the nc kernels; NCHW_SPLIT off: a block per channel)
        xn = x.contiguous()
        yn = torch.empty_like(xn)
        xnd = _desc(xn, pdt)
        ms_p = time_ms(lambda: pydnn.batch_normalization_forward_training(h, S, 1.0, 0.0, xnd, xn.data_ptr(), xnd,
                                                                          yn.data_ptr(), bd, P[0], P[1], 0.1, P[2],
                                                                          P[3], 1e-5, P[4], P[5]))
        ms_t = time_ms(lambda: F.batch_norm(xn, trm, trv, w, bias, training=True, momentum=0.1, eps=1e-5))
        b.row("batchnorm", "training forward NCHW (nc kernels)", dname, 2 * n, ms_p, ms_t,
              "F.batch_norm(training=True)")


def run_cnn(b):
    """The CNN demo's NCHW batch norms + ReLU (Ex forms): nc, planes (NCHW_SPLIT off) and PyTorch."""
    h = b.h
    tdt, pdt = DT["bf16"]
    S = pydnn.PYDNN_BATCHNORM_SPATIAL
    act = pydnn.create_activation_descriptor()
    pydnn.set_activation_descriptor(act, pydnn.PYDNN_ACTIVATION_RELU, pydnn.PYDNN_NOT_PROPAGATE_NAN, 0.0)
    OPS = pydnn.PYDNN_BATCHNORM_OPS_BN_ACTIVATION
    for name, shape in (("bn 1", (256, 64, 32, 32)), ("bn 2", (256, 128, 16, 16))):
        x = torch.randn(shape, dtype=tdt, device="cuda")
        y, dy, dx = torch.empty_like(x), torch.randn_like(x), torch.empty_like(x)
        C = shape[1]
        f32 = dict(dtype=torch.float32, device="cuda")
        w, bias = torch.rand(C, **f32) + 0.5, torch.randn(C, **f32)
        rm, rv = torch.zeros(C, **f32), torch.ones(C, **f32)
        sm, si = torch.empty(C, **f32), torch.empty(C, **f32)
        ds, db = torch.empty(C, **f32), torch.empty(C, **f32)
        xd = _desc(x, pdt)
        bd = pydnn.create_tensor_descriptor()
        pydnn.derive_bn_tensor_descriptor(bd, xd, S)
        n = x.numel() * 2
        rn = pydnn.get_batch_normalization_training_ex_reserve_space_size(h, S, OPS, act, xd)
        res = torch.empty(max(rn, 16), dtype=torch.uint8, device="cuda")
        P = [t.data_ptr() for t in (w, bias, rm, rv, sm, si, ds, db)]

        wf = pydnn.get_batch_normalization_forward_training_ex_workspace_size(h, S, OPS, xd, None, xd, bd, act)
        wb = pydnn.get_batch_normalization_backward_ex_workspace_size(h, S, OPS, xd, xd, xd, None, xd, bd, act)
        ws = torch.empty(max(wf, wb, 16), dtype=torch.uint8, device="cuda")  # nc: constants and partials

        def fwd():
            wn = wf
            pydnn.batch_normalization_forward_training_ex(h, S, OPS, 1.0, 0.0, xd, x.data_ptr(), None, 0, xd,
                                                          y.data_ptr(), bd, P[0], P[1], 0.1, P[2], P[3], 1e-5, P[4],
                                                          P[5], act, ws.data_ptr(), wn,
                                                          res.data_ptr(), rn)

        def bwd():
            wn = wb
            pydnn.batch_normalization_backward_ex(h, S, OPS, 1.0, 0.0, 1.0, 0.0, xd, x.data_ptr(), xd, y.data_ptr(),
                                                  xd, dy.data_ptr(), None, 0, xd, dx.data_ptr(), bd, P[0], P[1],
                                                  P[6], P[7], 1e-5, P[4], P[5], act,
                                                  ws.data_ptr(), wn, res.data_ptr(), rn)

        trm, trv = rm.clone(), rv.clone()
        tfwd = lambda: F.relu(F.batch_norm(x, trm, trv, w, bias, training=True, momentum=0.1, eps=1e-5))  # noqa: E731
        yt = tfwd()

        def tbwd():
            g = torch.ops.aten.threshold_backward(dy, yt, 0)
            return torch.ops.aten.native_batch_norm_backward(g, x, w, rm, rv, sm, si, True, 1e-5, [True, True, True])

        fb, bb = 2 * n + n // 2, 3 * n + n // 2
        tag = "x".join(map(str, shape))
        h.prepared.clear()
        fwd()
        ms_f, ms_b = time_ms(fwd), time_ms(bwd)
        b.row("batchnorm", f"cnn {name} BN+ReLU Ex NCHW {tag} fwd", "bf16", fb, ms_f, time_ms(tfwd),
              "F.batch_norm(training) + relu")
        b.row("batchnorm", f"cnn {name} BN+ReLU Ex NCHW {tag} bwd", "bf16", bb, ms_b, time_ms(tbwd),
              "threshold_backward + native_batch_norm_backward")
        tuning.batchnorm.NCHW_SPLIT = False
        h.prepared.clear()
        try:
            ms_f0, ms_b0 = time_ms(fwd), time_ms(bwd)
        finally:
            tuning.batchnorm.NCHW_SPLIT = True
            h.prepared.clear()
        b.row("batchnorm", f"cnn {name} BN+ReLU Ex NCHW {tag} fwd [planes: NCHW_SPLIT off]", "bf16", fb, ms_f0, None,
              "-")
        b.row("batchnorm", f"cnn {name} BN+ReLU Ex NCHW {tag} bwd [planes: NCHW_SPLIT off]", "bf16", bb, ms_b0, None,
              "-")
