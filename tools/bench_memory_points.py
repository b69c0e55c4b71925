#!/usr/bin/env python3
"""Named points of tools/sweep_memory.py (its build() and run_point(): the same calls, the same timing),
each run with the planner's defaults and, where a tuning switch turns the newer path off, without it (or with each
of a list of settings):

    python3 tools/bench_memory_points.py [--reps N] [--points NAME,...]

The default points are the issue-20 misses of the 2026-11-28 H200 sweep (/work/notes/s26a/mem.log) that the
`rowsb` branch addressed: OpTensor ADD with operands inside L2 (tuning.tensor_ops.PLAIN_BYTES: the plain
cache policy, against 0 = always streaming), ADD beyond L2 (no switch applies: the default twice), reduce AVG
/ SUM over rows of 2824 fp32 (walk_row's batched tail: no switch, the kernel itself changed), softmax of
few long rows (tuning.softmax.SPLIT: the cluster kernel, against one block a row); batch norm backward NHWC
with C off the 16-byte vector (tuning.batchnorm.SUPER_ROWS: the super-row kernels, against the 1-element rows).
About 20 s on an H100 / H200 with the default reps (the bn_bwd points: a few seconds more).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

POINTS = {  # name: (sweep point, {switch: value turning the new path off} or None)
    "add_82918x64_bf16": (dict(family="op_add", dtype="bf16", rows=82918, hidden=64), {"tensor_ops.PLAIN_BYTES": 0}),
    "add_13423x160_fp32": (dict(family="op_add", dtype="fp32", rows=13423, hidden=160),
                           {"tensor_ops.PLAIN_BYTES": 0}),
    "add_22923x256_fp16": (dict(family="op_add", dtype="fp16", rows=22923, hidden=256),
                           {"tensor_ops.PLAIN_BYTES": 0}),
    "add_7167x8272_fp16": (dict(family="op_add", dtype="fp16", rows=7167, hidden=8272), None),
    "reduce_avg_53513x2824_fp32": (dict(family="reduce", dtype="fp32", variant="avg", rows=53513, hidden=2824), None),
    "reduce_sum_53513x2824_fp32": (dict(family="reduce", dtype="fp32", variant="sum", rows=53513, hidden=2824), None),
    "softmax_1x65536_fp32": (dict(family="softmax_instance", dtype="fp32", rows=1, hidden=65536),
                             {"softmax.SPLIT": False}),
    "softmax_1x16384_bf16": (dict(family="softmax_instance", dtype="bf16", rows=1, hidden=16384),
                             {"softmax.SPLIT": False}),
    "softmax_8x32768_fp16": (dict(family="softmax_instance", dtype="fp16", rows=8, hidden=32768),
                             {"softmax.SPLIT": False}),
    # batch norm backward, NHWC with C off the 16-byte vector: the super-row kernels against the 1-element rows
    "bn_bwd_195x93x38_bf16": (dict(family="bn_bwd", dtype="bf16", layout="NHWC", n=195, c=93, hw=38),
                              [{"batchnorm.SUPER_ROWS": False}, {"batchnorm.SR_BLOCKS": 2}, {"batchnorm.SR_BLOCKS": 8}]),
    "bn_bwd_105x405x82_bf16": (dict(family="bn_bwd", dtype="bf16", layout="NHWC", n=105, c=405, hw=82),
                               {"batchnorm.SUPER_ROWS": False}),
    "bn_bwd_39x1315x23_fp32": (dict(family="bn_bwd", dtype="fp32", layout="NHWC", n=39, c=1315, hw=23),
                               {"batchnorm.SUPER_ROWS": False}),
    "bn_bwd_2x1305x45_bf16": (dict(family="bn_bwd", dtype="bf16", layout="NHWC", n=2, c=1305, hw=45),
                              [{"batchnorm.SUPER_ROWS": False}, {"batchnorm.SR_TILED_BYTES": 0}]),
    "bn_bwd_37x12x146_fp16": (dict(family="bn_bwd", dtype="fp16", layout="NHWC", n=37, c=12, hw=146),
                              {"batchnorm.SUPER_ROWS": False}),
    "bn_bwd_64x150x28_fp32": (dict(family="bn_bwd", dtype="fp32", layout="NHWC", n=64, c=150, hw=28),
                              [{"batchnorm.SUPER_ROWS": False}, {"batchnorm.SR_BLOCKS": 2}, {"batchnorm.SR_BLOCKS": 8}]),
    "bn_bwd_162x4x9_bf16": (dict(family="bn_bwd", dtype="bf16", layout="NHWC", n=162, c=4, hw=9),
                            {"batchnorm.SUPER_ROWS": False}),
    "bn_train_187x50x14_fp32": (dict(family="bn_train", dtype="fp32", layout="NHWC", n=187, c=50, hw=14),
                                {"batchnorm.SUPER_ROWS": False}),
    "bn_train_7x337x93_bf16": (dict(family="bn_train", dtype="bf16", layout="NHWC", n=7, c=337, hw=93),
                               [{"batchnorm.SUPER_ROWS": False}, {"batchnorm.SR_TILED_BYTES": 0}]),
    "bn_train_64x93x38_bf16": (dict(family="bn_train", dtype="bf16", layout="NHWC", n=64, c=93, hw=38),
                               {"batchnorm.SUPER_ROWS": False}),
    "bn_train_66x1737x104_bf16": (dict(family="bn_train", dtype="bf16", layout="NHWC", n=66, c=1737, hw=104),
                                  {"batchnorm.SUPER_ROWS": False}),
    # session 30: the backward with the saved mean on the sums kernels (BWD_SUMS) against the four-moment ones;
    # small super-row tensors with longer stats chunks (SR_MIN_ROUNDS)
    "sums_bwd_195x93x38_bf16": (dict(family="bn_bwd", dtype="bf16", layout="NHWC", n=195, c=93, hw=38),
                                [{"batchnorm.BWD_SUMS": False}]),
    "sums_bwd_39x1315x23_fp32": (dict(family="bn_bwd", dtype="fp32", layout="NHWC", n=39, c=1315, hw=23),
                                 [{"batchnorm.BWD_SUMS": False}]),
    "sums_bwd_105x405x82_bf16": (dict(family="bn_bwd", dtype="bf16", layout="NHWC", n=105, c=405, hw=82),
                                 [{"batchnorm.BWD_SUMS": False}]),
    "sums_bwd_2x1305x45_bf16": (dict(family="bn_bwd", dtype="bf16", layout="NHWC", n=2, c=1305, hw=45),
                                [{"batchnorm.BWD_SUMS": False}, {"batchnorm.SR_HYBRID": False}]),
    "sums_bwd_42x118x77_fp32": (dict(family="bn_bwd", dtype="fp32", layout="NHWC", n=42, c=118, hw=77),
                                [{"batchnorm.BWD_SUMS": False}]),
    "sums_bwd_64x256x56_bf16": (dict(family="bn_bwd", dtype="bf16", layout="NHWC", n=64, c=256, hw=56),
                                [{"batchnorm.BWD_SUMS": False}]),
    "sums_bwd_1x700x32_bf16": (dict(family="bn_bwd", dtype="bf16", layout="NHWC", n=1, c=700, hw=32),
                               [{"batchnorm.BWD_SUMS": False}, {"batchnorm.BWD_APPLY_SAVED": False},
                                {"batchnorm.SR_MIN_ROUNDS": 4}]),
    "sums_bwd_37x12x146_fp16": (dict(family="bn_bwd", dtype="fp16", layout="NHWC", n=37, c=12, hw=146),
                                [{"batchnorm.BWD_SUMS": False}, {"batchnorm.SR_MIN_ROUNDS": 4}]),
    "sums_bwd_nchw_5x1481x23_fp32": (dict(family="bn_bwd", dtype="fp32", layout="NCHW", n=5, c=1481, hw=23),
                                     [{"batchnorm.BWD_SUMS": False}]),
    "sums_bwd_nchw_1x306x99_bf16": (dict(family="bn_bwd", dtype="bf16", layout="NCHW", n=1, c=306, hw=99),
                                    [{"batchnorm.BWD_SUMS": False}, {"batchnorm.BWD_APPLY_SAVED": False}]),
    "sums_bwd_nchw_110x251x115_fp16": (dict(family="bn_bwd", dtype="fp16", layout="NCHW", n=110, c=251, hw=115),
                                       [{"batchnorm.BWD_SUMS": False}]),
    "sr_train_187x50x14_fp32": (dict(family="bn_train", dtype="fp32", layout="NHWC", n=187, c=50, hw=14),
                                [{"batchnorm.FWD_APPLY_SAVED": False}, {"batchnorm.SR_MIN_ROUNDS": 4},
                                 {"batchnorm.SR_MIN_ROUNDS": 16}]),
    "sr_train_29x63x31_fp16": (dict(family="bn_train", dtype="fp16", layout="NHWC", n=29, c=63, hw=31),
                               [{"batchnorm.SR_MIN_ROUNDS": 4}, {"batchnorm.SR_MIN_ROUNDS": 16}]),
    "rows1_train_7x1473x21_bf16": (dict(family="bn_train", dtype="bf16", layout="NHWC", n=7, c=1473, hw=21),
                                   [{"batchnorm.SR_HYBRID": False}, {"batchnorm.FWD_APPLY_SAVED": False}]),
    "srh_train_7x337x93_bf16": (dict(family="bn_train", dtype="bf16", layout="NHWC", n=7, c=337, hw=93),
                                [{"batchnorm.SR_HYBRID": False}]),
    # session 31: packed NCHW with at most NC_RES_MAX elements a channel on nc_res (a channel in one block's registers,
    # one launch) against the nc / gen sequences
    "ncr_bwd_nchw_5x1481x23_fp32": (dict(family="bn_bwd", dtype="fp32", layout="NCHW", n=5, c=1481, hw=23),
                                    [{"batchnorm.NC_RES": False}, {"batchnorm.NC_RES_WAVE": False}]),
    "ncr_bwd_nchw_1x306x99_bf16": (dict(family="bn_bwd", dtype="bf16", layout="NCHW", n=1, c=306, hw=99),
                                   [{"batchnorm.NC_RES": False}, {"batchnorm.NC_RES_WAVE": False}]),
    "ncr_bwd_nchw_2x3x77_bf16": (dict(family="bn_bwd", dtype="bf16", layout="NCHW", n=2, c=3, hw=77),
                                 [{"batchnorm.NC_RES": False}, {"batchnorm.NC_RES_WAVE": False}]),
    "ncr_bwd_nchw_4x664x2_bf16": (dict(family="bn_bwd", dtype="bf16", layout="NCHW", n=4, c=664, hw=2),
                                  [{"batchnorm.NC_RES": False}, {"batchnorm.NC_RES_WAVE": False}]),
    "ncr_bwd_nchw_62x92x16_bf16": (dict(family="bn_bwd", dtype="bf16", layout="NCHW", n=62, c=92, hw=16),
                                   [{"batchnorm.NC_RES": False}, {"batchnorm.NC_RES_WAVE": False}]),
    "ncr_bwd_nchw_4x139x64_fp16": (dict(family="bn_bwd", dtype="fp16", layout="NCHW", n=4, c=139, hw=64),
                                   [{"batchnorm.NC_RES": False}, {"batchnorm.NC_RES_WAVE": False}]),
    "ncr_train_nchw_21x413x9_fp16": (dict(family="bn_train", dtype="fp16", layout="NCHW", n=21, c=413, hw=9),
                                     [{"batchnorm.NC_RES": False}, {"batchnorm.NC_RES_WAVE": False}]),
    "ncr_train_nchw_72x37x8_fp16": (dict(family="bn_train", dtype="fp16", layout="NCHW", n=72, c=37, hw=8),
                                    [{"batchnorm.NC_RES": False}, {"batchnorm.NC_RES_WAVE": False}]),
    "ncr_train_nchw_14x6x10_fp32": (dict(family="bn_train", dtype="fp32", layout="NCHW", n=14, c=6, hw=10),
                                    [{"batchnorm.NC_RES": False}, {"batchnorm.NC_RES_WAVE": False}]),
    "ncr_train_nchw_6x348x14_fp32": (dict(family="bn_train", dtype="fp32", layout="NCHW", n=6, c=348, hw=14),
                                     [{"batchnorm.NC_RES": False}, {"batchnorm.NC_RES_WAVE": False}]),
    "ncr_train_nchw_20x12x56_bf16": (dict(family="bn_train", dtype="bf16", layout="NCHW", n=20, c=12, hw=56),
                                     [{"batchnorm.NC_RES": False}, {"batchnorm.NC_RES_WAVE": False}]),
    "ncr_train_nchw_4x256x64_bf16": (dict(family="bn_train", dtype="bf16", layout="NCHW", n=4, c=256, hw=64),
                                     [{"batchnorm.NC_RES": False}, {"batchnorm.NC_RES_WAVE": False}]),
    "srw_bwd_162x4x9_bf16": (dict(family="bn_bwd", dtype="bf16", layout="NHWC", n=162, c=4, hw=9),
                             [{"batchnorm.SR_ROUNDS_WAVE": False}, {"batchnorm.SR_MIN_ROUNDS": 1}]),
    "srw_bwd_37x12x146_fp16": (dict(family="bn_bwd", dtype="fp16", layout="NHWC", n=37, c=12, hw=146),
                               [{"batchnorm.SR_ROUNDS_WAVE": False}]),
    "srw_bwd_1x700x32_bf16": (dict(family="bn_bwd", dtype="bf16", layout="NHWC", n=1, c=700, hw=32),
                              [{"batchnorm.SR_ROUNDS_WAVE": False}]),
    # session 31, the sweep's normalization points below 1.0x (diagnosis: the existing switches)
    "rmsi_199454x4336_fp16": (dict(family="rms_fwd_infer", dtype="fp16", rows=199454, hidden=4336),
                              [{"norm.ROWS_FIT": True}, {"norm.STREAM": {"gn_reg"}},
                               {"norm.PF_BYTES": {"fwd_rows": 8 << 20, "gn_reg": 8 << 20}}]),
    "rmsi_22392x2296_bf16": (dict(family="rms_fwd_infer", dtype="bf16", rows=22392, hidden=2296),
                             [{"norm.ROWS_FIT": True}, {"norm.STREAM": {"gn_reg"}}]),
    "lnfi_8204x39856_bf16": (dict(family="ln_fwd_infer", dtype="bf16", rows=8204, hidden=39856),
                             [{"norm.ROWS_FIT": True}]),
    "lnft_26676x9576_fp16": (dict(family="ln_fwd_train", dtype="fp16", rows=26676, hidden=9576),
                             [{"norm.ROWS_FIT": True}]),
    "rmsi_1587x38005_fp16": (dict(family="rms_fwd_infer", dtype="fp16", rows=1587, hidden=38005),
                             [{"norm.ROWS_FIT": True}]),
    "ln_bwd_417x2770_bf16": (dict(family="ln_bwd", dtype="bf16", rows=417, hidden=2770),
                             [{"norm.XSPLIT_ANY": True}, {"norm.ROWX_BWD_WS16": True},
                              {"norm.ROWX_BWD_WS16": True, "norm.ROWX_BWD_ROWS": 2},
                              {"norm.ROWX_BWD_WS16": True, "norm.ROWX_BWD_ROWS": 4}, {"norm.ROWX_BWD_ROWS": 4}]),
    # session 32: the split backward in the rowx frame (XSPLIT: rows bwd_rowx serves only with a cluster;
    # XSPLIT_ANY: bwd_rowx's one-block rows too) against the previous kernels
    "ln_bwd_2402x34823_fp16": (dict(family="ln_bwd", dtype="fp16", rows=2402, hidden=34823),
                               [{"norm.XSPLIT": False}, {"norm.XSPLIT_DX_BLOCK": 1024}]),
    "rms_bwd_17244x4231_fp16": (dict(family="rms_bwd", dtype="fp16", rows=17244, hidden=4231),
                                [{"norm.XSPLIT_ANY": True}, {"norm.ROWX_BWD_WS16": True}]),
    "rms_bwd_665x2277_bf16": (dict(family="rms_bwd", dtype="bf16", rows=665, hidden=2277),
                              [{"norm.XSPLIT_ANY": True}, {"norm.ROWX_BWD_WS16": True}]),
    "rms_bwd_81995x9188_bf16": (dict(family="rms_bwd", dtype="bf16", rows=81995, hidden=9188),
                                [{"norm.XSPLIT_ANY": True}, {"norm.ROWX_BWD_WS16": True}]),
    "ln_bwd_486865x2015_fp32": (dict(family="ln_bwd", dtype="fp32", rows=486865, hidden=2015),
                                [{"norm.XSPLIT_ANY": True}, {"norm.ROWX_BWD_WS16": True}]),
    "ln_bwd_169308x166_bf16": (dict(family="ln_bwd", dtype="bf16", rows=169308, hidden=166),
                               [{"norm.XSPLIT_ANY": True}, {"norm.ROWX_BWD_WS16": True}]),
    "ln_bwd_96x275_bf16": (dict(family="ln_bwd", dtype="bf16", rows=96, hidden=275),
                           [{"norm.ROWX_BWD_WS16": True}]),
    "ln_bwd_21x1439_fp32": (dict(family="ln_bwd", dtype="fp32", rows=21, hidden=1439),
                            [{"norm.ROWX_BWD_WS16": True}]),
    # session 32: OpTensor ADD beyond L2 with the plain cache policy (PLAIN_BYTES 1 TiB: every dense add) against
    # evict-first streaming (the default there): the sweep's adds at 0.90-0.95x near copy bandwidth
    "addplain_5070x32768_fp32": (dict(family="op_add", dtype="fp32", rows=5070, hidden=32768),
                                 {"tensor_ops.PLAIN_BYTES": 1 << 40}),
    "addplain_107126x2493_bf16": (dict(family="op_add", dtype="bf16", rows=107126, hidden=2493),
                                  {"tensor_ops.PLAIN_BYTES": 1 << 40}),
    "addplain_7167x8272_fp16": (dict(family="op_add", dtype="fp16", rows=7167, hidden=8272),
                                {"tensor_ops.PLAIN_BYTES": 1 << 40}),
    # session 32: activations beyond L2 (default settings only: map_contig's cache policy is a unit's instantiation,
    # so the other side runs in a process of its own: PYDNN_TUNING="activation.PLAIN_ACCESS=()" streams every mode,
    # "activation.PLAIN_ACCESS=(0, 1, 2)" keeps sigmoid, ReLU and tanh plain; the default since session 32: (1, 0))
    "act_tanh_12701x65536_bf16": (dict(family="act_fwd", dtype="bf16", variant="tanh", rows=12701, hidden=65536),
                                  None),
    # session 33: the 16-bit TANH forward on tanh_fast (TANH_FAST, the default) against tanhf, at 8 and 16 elements
    # a thread (TANH_ELEMS): every form is an instantiation of activation.h16 (first use for the non-default ones)
    "tanh_12701x65536_bf16": (dict(family="act_fwd", dtype="bf16", variant="tanh", rows=12701, hidden=65536),
                              [{"activation.TANH_FAST": False}, {"activation.TANH_ELEMS": 16},
                               {"activation.TANH_FAST": False, "activation.TANH_ELEMS": 16}]),
    "tanh_3000x8192_fp16": (dict(family="act_fwd", dtype="fp16", variant="tanh", rows=3000, hidden=8192),
                            [{"activation.TANH_FAST": False}, {"activation.TANH_ELEMS": 16}]),
    "tanh_2048x1000_bf16": (dict(family="act_fwd", dtype="bf16", variant="tanh", rows=2048, hidden=1000),
                            [{"activation.TANH_FAST": False}, {"activation.TANH_ELEMS": 16}]),
    # session 33: the final sweep's other worst points (H200, session 32: 0.888-0.90x), defaults only (diagnosis)
    # gen's threads per block on GEN_TINY's one-launch calls: GEN_WAVE (the default) against a row a thread
    "bn_bwd_2x477x13_fp32": (dict(family="bn_bwd", dtype="fp32", layout="NHWC", n=2, c=477, hw=13),
                             [{"batchnorm.GEN_WAVE": False}]),
    "gen_train_51x175x2_bf16": (dict(family="bn_train", dtype="bf16", layout="NHWC", n=51, c=175, hw=2),
                                [{"batchnorm.GEN_WAVE": False}]),
    "gen_bwd_4x200x8_fp16": (dict(family="bn_bwd", dtype="fp16", layout="NHWC", n=4, c=200, hw=8),
                             [{"batchnorm.GEN_WAVE": False}]),
    "gen_bwd_1x1000x7_fp32": (dict(family="bn_bwd", dtype="fp32", layout="NHWC", n=1, c=1000, hw=7),
                              [{"batchnorm.GEN_WAVE": False}]),
    "gen_train_20x300x4_fp32": (dict(family="bn_train", dtype="fp32", layout="NHWC", n=20, c=300, hw=4),
                                [{"batchnorm.GEN_WAVE": False}]),
    "rmsi_1693x6776_bf16": (dict(family="rms_fwd_infer", dtype="bf16", rows=1693, hidden=6776),
                            [{"norm.ROWS_FIT": False}, {"norm.STREAM": {"gn_reg"}},
                             {"norm.PF_BYTES": {"fwd_rows": 8 << 20, "gn_reg": 8 << 20}}]),
    # session 33: channel softmax over few (outer, tile) blocks: COL_FILL 1 (the default: narrower tiles) against
    # the sector-wide col_loop (0) and 2 (down to the register kernel)
    "smc_40x601x3_bf16": (dict(family="softmax_channel", dtype="bf16", layout="NCHW", n=40, c=601, hw=3),
                          [{"softmax.COL_FILL": 0}, {"softmax.COL_FILL": 2}]),
    "smc_8x1000x7_fp16": (dict(family="softmax_channel", dtype="fp16", layout="NCHW", n=8, c=1000, hw=7),
                          [{"softmax.COL_FILL": 0}, {"softmax.COL_FILL": 2}]),
    "smc_2x2048x5_fp32": (dict(family="softmax_channel", dtype="fp32", layout="NCHW", n=2, c=2048, hw=5),
                          [{"softmax.COL_FILL": 0}]),
    "smc_16x300x9_fp32": (dict(family="softmax_channel", dtype="fp32", layout="NCHW", n=16, c=300, hw=9),
                          [{"softmax.COL_FILL": 2}]),
    # session 33, second look at the mid-session sweep's steady deficits (each read below 1.0x three times):
    # reduce's group for many rows (ROW_ROUNDS_WIDE 8: G 32 at 2824 fp32, 256 at 61373 bf16) and max pooling's
    # backward on p2t_bwd against p2_bwd
    "rrw_avg_53513x2824_fp32": (dict(family="reduce", dtype="fp32", variant="avg", rows=53513, hidden=2824),
                                [{"reduce.ROW_ROUNDS_WIDE": 4}]),
    "rrw_sum_19501x61373_bf16": (dict(family="reduce", dtype="bf16", variant="sum", rows=19501, hidden=61373),
                                 [{"reduce.ROW_ROUNDS_WIDE": 16}, {"reduce.ROW_ROUNDS_WIDE": 32}]),
    "poolb_2x168x55_max_fp16": (dict(family="pool_bwd", dtype="fp16", layout="NCHW", variant="max", n=2, c=168,
                                     hw=55), [{"pooling.P2T_BWD": False}]),
    "reduce_sum_18x65536_fp32": (dict(family="reduce", dtype="fp32", variant="sum", rows=18, hidden=65536),
                                 [{"reduce.SEG_ROUNDS": 1}, {"reduce.SEG_ROUNDS": 2}]),
    "reduce_max_9x65536_bf16": (dict(family="reduce", dtype="bf16", variant="max", rows=9, hidden=65536),
                                [{"reduce.SEG_ROUNDS": 1}, {"reduce.SEG_ROUNDS": 2}]),
    "reduce_avg_40x100000_fp32": (dict(family="reduce", dtype="fp32", variant="avg", rows=40, hidden=100000),
                                  [{"reduce.SEG_ROUNDS": 1}, {"reduce.SEG_ROUNDS": 2}]),
    "act_relu_7549x25760_fp32": (dict(family="act_fwd", dtype="fp32", variant="relu", rows=7549, hidden=25760), None),
    "actb_relu_297888x256_fp32": (dict(family="act_bwd", dtype="fp32", variant="relu", rows=297888, hidden=256),
                                  None),
    "actb_relu_14073x32768_fp32": (dict(family="act_bwd", dtype="fp32", variant="relu", rows=14073, hidden=32768),
                                   None),
    "actb_sigmoid_1048576x761_bf16": (dict(family="act_bwd", dtype="bf16", variant="sigmoid", rows=1048576,
                                           hidden=761), None),
    # session 32: nc_res's streaming passes, one element a thread a step (NC_RES_SU 1, the default since session 33)
    # against 4 a step (NC_RES_SU 4, session 32's default; first use), on the points that stream; session 33: the
    # 512-thread streaming blocks (NC_RES_STREAM_WIDE, the default) against 256 at most
    "ncrsu_bwd_nchw_5x1481x23_fp32": (dict(family="bn_bwd", dtype="fp32", layout="NCHW", n=5, c=1481, hw=23),
                                      [{"batchnorm.NC_RES_SU": 4}]),
    "ncrsu_bwd_nchw_1x306x99_bf16": (dict(family="bn_bwd", dtype="bf16", layout="NCHW", n=1, c=306, hw=99),
                                     [{"batchnorm.NC_RES_SU": 4}]),
    "ncrsu_bwd_nchw_4x139x64_fp16": (dict(family="bn_bwd", dtype="fp16", layout="NCHW", n=4, c=139, hw=64),
                                     [{"batchnorm.NC_RES_SU": 4}, {"batchnorm.NC_RES_STREAM_WIDE": False}]),
    "ncrsu_train_nchw_4x256x64_bf16": (dict(family="bn_train", dtype="bf16", layout="NCHW", n=4, c=256, hw=64),
                                       [{"batchnorm.NC_RES_SU": 4}, {"batchnorm.NC_RES_STREAM_WIDE": False}]),
    "ncrw_bwd_nchw_1x140x99_bf16": (dict(family="bn_bwd", dtype="bf16", layout="NCHW", n=1, c=140, hw=99),
                                    [{"batchnorm.NC_RES_STREAM_WIDE": False}]),
    # layer norm backward, long fp32 rows: the staged cluster kernel against the split kernels (BWD_SPLIT) and
    # the register-tile cluster kernel
    "ln_bwd_3673x8552_fp32": (dict(family="ln_bwd", dtype="fp32", rows=3673, hidden=8552),
                              [{"norm.BWD_SPLIT": False}, {"norm.BWD_SPLIT": False, "norm.STAGED_BWD": False}]),
    "rms_bwd_1024x16384_fp32": (dict(family="rms_bwd", dtype="fp32", rows=1024, hidden=16384),
                                [{"norm.BWD_SPLIT": False}]),
    "rms_bwd_1478x32768_bf16": (dict(family="rms_bwd", dtype="bf16", rows=1478, hidden=32768),
                                [{"norm.BWD_SPLIT": True, "norm.BWD_SPLIT_16": True}]),
}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--points", default="", help="comma-separated names (default: all of POINTS)")
    args = ap.parse_args(argv)
    import torch
    import sweep_common as SC
    import sweep_memory as M
    from bench import Bench
    from pydnn import tuning

    torch.manual_seed(0)
    b = Bench(64 << 20)
    c = M.Ctx()
    c.h, c.copy_gbs = b.h, b.copy_gbs
    c.timer = SC.gpu_timer(args.reps, 2)
    c.empty_ms = None
    names = [n for n in args.points.split(",") if n] or list(POINTS)
    print(f"device copy {c.copy_gbs:.0f} GB/s; ratio = PyTorch ms / pydnn ms")
    for name in names:
        p, off = POINTS[name]
        alts = off if isinstance(off, list) else [off]  # (a list: several settings, each against the default)
        for label, settings in [("default", {})] + [(";".join(f"{k}={v}" for k, v in a.items()) if a else "off", a)
                                                     for a in alts if a is not None]:
            if settings is None:
                continue
            rows = []
            with tuning.override(settings):
                M.run_point(c, dict(p), rows, {})
            r = rows[-1]
            print(f"{name:28s} {label:24s} {r['status']:6s} pydnn {SC.fmt(r.get('ms_pydnn'), '.4f')} ms  torch "
                  f"{SC.fmt(r.get('ms_ref'), '.4f')} ms  {SC.fmt(r.get('ratio'), '.3f')}x  "
                  f"{SC.fmt(r.get('gbs_pydnn'), '.0f')} GB/s  check {SC.fmt(r.get('check_err'), '.2e')} "
                  f"{r.get('note', '')[:80]}", flush=True)


if __name__ == "__main__":
    main()
