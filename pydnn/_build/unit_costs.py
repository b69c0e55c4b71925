"""NVRTC CPU seconds of kernel units, measured one unit at a time (tools/build_stats.py --json,
then --write-costs; NVRTC 13.5 on the 2-core development machine, session 29, under other helpers' load:
the units unchanged since session 28 read 1.12 (sm_90) / 1.18 (sm_80) times their light-load figures, so
these are for the order, not for wall-time sums): build._cost orders the build by them, longest first.
{device arch: {unit: (CPU seconds, instantiations then)}}; a unit missing here, or whose instantiations
changed, falls back to (or is scaled by) the SASS-size model.
Session 32 added the install units the SASS-size model had guessed (convolution.tma.* at 0.3 s measured 1.8-15.8,
convolution.wgmma.split.* at 20 measured 1.5-2.1, attention.ws.q2 / gh / c3 at ~3x their cost, matmul.f32big): this
machine's CPU seconds (loaded) / 0.71, the ratio of reference units measured in the same run to their figures here
(convolution.wgmma.bf16 14.3 / 20.8, matmul.f32 3.9 / 5.3 and 4.2 / 5.9 on sm_80, attention.ws.d256.bf16 1.8 / 2.6)."""
COSTS = {
    'sm_80': {
        'activation.f32': (2.5, 24),
        'activation.h16': (3.8, 24),   # session 31 (h16: the typed pair x folded / typed)
        'attention.bf16': (6.2, 12),
        'attention.d256.bf16': (3.6, 6),
        'attention.d256.f16': (3.6, 6),
        'attention.d96.bf16': (2.8, 6),
        'attention.d96.f16': (2.8, 6),
        'attention.dec.bf16': (2.9, 8),
        'attention.dec.f16': (2.9, 8),
        'attention.f16': (6.1, 12),
        'attention.prep.bf16': (1.0, 8),   # session 32 (0.7 CPU s measured under load / 0.71)
        'attention.prep.f16': (1.0, 8),   # session 32
        'batchnorm.bf16': (8.8, 29),
        'batchnorm.f16': (8.5, 28),
        'batchnorm.f32': (6.8, 26),
        'conv_bias.bf16': (0.5, 2),
        'conv_bias.f16': (0.5, 2),
        'conv_bias.f32': (0.4, 2),
        'conv_dgrad.bf16': (0.1, 2),
        'conv_dgrad.f16': (0.1, 2),
        'conv_gemm.bf16': (0.3, 5),
        'conv_gemm.f16': (0.3, 5),
        'conv_gemm.f32': (0.9, 6),
        'conv_winograd.bf16': (1.7, 5),
        'conv_winograd.f16': (1.7, 5),
        'conv_winograd.f32': (2.2, 10),
        'convolution.bf16': (25.7, 17),
        'convolution.f16': (26.1, 17),
        'convolution.f32': (2.8, 5),
        'convolution.gdirect1.bf16': (7.5, 4),
        'convolution.gdirect1.f16': (6.3, 4),
        'convolution.gdirect2.bf16': (1.3, 2),
        'convolution.gdirect2.f16': (1.6, 2),
        'convolution.grouped.bf16': (12.9, 9),
        'convolution.grouped.f16': (10.9, 9),
        'convolution.gwgrad.bf16': (1.9, 2),
        'convolution.gwgrad.f16': (1.8, 2),
        'convolution.narrow.bf16': (3.8, 13),
        'convolution.narrow.f16': (3.8, 13),
        'dropout.bf16': (1.4, 9),
        'dropout.f16': (1.4, 9),
        'dropout.f32': (0.9, 8),
        'dropout.misc': (0.1, 2),
        'matmul.bf16.nn': (11.8, 4),
        'matmul.bf16.nt': (12.1, 4),
        'matmul.bf16.tn': (11.8, 4),
        'matmul.f16.nn': (11.6, 4),
        'matmul.f16.nt': (11.7, 4),
        'matmul.f16.tn': (11.0, 4),
        'matmul.f32': (5.9, 6),
        'matmul.f32big': (5.9, 3),   # session 32 (measured / 0.71: below)
        'normalization.bf16': (16.3, 15),
        'normalization.f16': (16.2, 15),
        'normalization.f32': (12.3, 11),
        'normalization.rowx.bf16': (3.4, 9),   # session 32 (xsplit: 2.4 CPU s measured under load / 0.71)
        'normalization.rowx.f16': (3.4, 9),   # session 32
        'normalization.rowx.f32': (2.5, 9),   # session 32
        'normalization_gs.bf16': (2.4, 11),
        'normalization_gs.f16': (2.3, 11),
        'normalization_gs.f32': (2.7, 12),
        'pooling.bf16': (6.0, 24),
        'pooling.f16': (6.5, 24),
        'pooling.f32': (5.6, 24),
        'reduce.f32': (7.0, 17),
        'reduce.h16': (9.8, 17),   # session 31 (h16: the typed pair x folded / typed)
        'rnn.h16': (2.3, 18),   # session 30: rnn.f16 and rnn.bf16 in one (pydnn::h16_t), measured as one of them
        'rnn.f32': (2.2, 18),
        'softmax.bf16': (8.3, 24),
        'softmax.f16': (8.4, 24),
        'softmax.f32': (7.8, 26),
        'tensor_ops.f32': (1.0, 16),
        'tensor_ops.h16': (1.4, 16),   # session 31 (h16: the typed pair x folded / typed)
        'tensor_ops.plain.f32': (0.7, 7),
        'tensor_ops.plain.h16': (1.0, 7),   # session 31 (h16: the typed pair x folded / typed)
        'tensor_ops.rows.f32': (0.4, 6),
        'tensor_ops.rows.h16': (0.7, 6),   # session 31 (h16: the typed pair x folded / typed)
        'tensor_ops.transform.f32': (1.9, 20),
        'tensor_ops.transform.h16': (1.7, 15),   # session 31 (h16: the typed pair x folded / typed)
    },
    'sm_90': {
        'activation.f32': (2.8, 24),
        'activation.h16': (4.1, 24),   # session 31 (h16: the typed pair x folded / typed)
        'attention.bf16': (0.2, 4),
        'attention.d256.bf16': (2.8, 5),
        'attention.d256.f16': (2.7, 5),
        'attention.d96.bf16': (0.1, 2),
        'attention.d96.f16': (0.1, 2),
        'attention.dec.bf16': (3.1, 8),
        'attention.dec.f16': (3.1, 8),
        'attention.f16': (0.2, 4),
        'attention.wgmma.d96.bf16': (1.4, 2),
        'attention.wgmma.d96.f16': (1.3, 2),
        'attention.wgmma_bwd.bf16': (4.4, 6),
        'attention.wgmma_bwd.d96.bf16': (2.1, 3),
        'attention.wgmma_bwd.d96.f16': (2.0, 3),
        'attention.wgmma_bwd.f16': (4.3, 6),
        'attention.prep.bf16': (1.1, 8),   # session 32 (0.8 CPU s measured under load / 0.71)
        'attention.prep.f16': (1.1, 8),   # session 32
        'attention.ws.bf16': (4.1, 4),
        'attention.ws.c3.bf16': (1.0, 1),   # session 32 (measured / 0.71: below)
        'attention.ws.c3.f16': (1.0, 1),   # session 32 (as bf16)
        'attention.ws.d256.bf16': (2.6, 2),
        'attention.ws.d256.f16': (2.6, 2),
        'attention.ws.f16': (4.1, 4),
        'attention.ws.gh.bf16': (2.3, 2),   # session 32
        'attention.ws.gh.f16': (2.5, 2),   # session 32
        'attention.ws.q2.bf16': (3.2, 3),   # session 32
        'attention.ws.q2.f16': (3.1, 3),   # session 32
        'attention.ws_bwd.bf16': (2.9, 4),
        'attention.ws_bwd.f16': (2.9, 4),
        'batchnorm.bf16': (11.5, 29),
        'batchnorm.f16': (10.9, 28),
        'batchnorm.f32': (7.7, 26),
        'conv_bias.bf16': (0.6, 2),
        'conv_bias.f16': (0.6, 2),
        'conv_bias.f32': (0.5, 2),
        'conv_dgrad.bf16': (0.1, 2),
        'conv_dgrad.f16': (0.1, 2),
        'conv_gemm.bf16': (0.3, 5),
        'conv_gemm.f16': (0.3, 5),
        'conv_gemm.f32': (1.1, 6),
        'conv_winograd.bf16': (1.8, 5),
        'conv_winograd.f16': (1.8, 5),
        'conv_winograd.f32': (2.5, 10),
        'convolution.bf16': (24.6, 14),
        'convolution.f16': (24.5, 14),
        'convolution.f32': (3.1, 5),
        'convolution.gdirect1.bf16': (9.8, 4),
        'convolution.gdirect1.f16': (9.9, 4),
        'convolution.gdirect2.bf16': (1.8, 2),
        'convolution.gdirect2.f16': (1.8, 2),
        'convolution.grouped.bf16': (14.6, 9),
        'convolution.grouped.f16': (14.7, 9),
        'convolution.gwgrad.bf16': (2.4, 2),
        'convolution.gwgrad.f16': (2.3, 2),
        'convolution.narrow.bf16': (4.5, 13),
        'convolution.narrow.f16': (4.4, 13),
        'convolution.tma.bf16.bn128': (5.9, 1),   # session 32
        'convolution.tma.bf16.bn256': (18.4, 1),   # session 32; x1.21 session 33 (16-byte store: 6.8 -> 8.25 s)
        'convolution.tma.bf16.bn64': (1.8, 1),   # session 32
        'convolution.tma.f16.bn128': (5.8, 1),   # session 32
        'convolution.tma.f16.bn256': (19.1, 1),   # session 32; x1.21 session 33 (bf16 twin measured)
        'convolution.tma.f16.bn64': (2.0, 1),   # session 32
        'convolution.wgmma.bf16': (20.8, 6),
        'convolution.wgmma.f16': (20.7, 6),
        'convolution.wgmma.split.bf16': (2.1, 5),   # session 32
        'convolution.wgmma.split.f16': (1.5, 5),   # session 32
        'convolution.wgrad.bf16': (3.2, 5),
        'convolution.wgrad.f16': (3.2, 5),
        'dropout.bf16': (1.6, 9),
        'dropout.f16': (1.6, 9),
        'dropout.f32': (1.2, 8),
        'dropout.misc': (0.1, 2),
        'matmul.bf16.nn': (10.1, 4),
        'matmul.bf16.nt': (10.6, 4),
        'matmul.bf16.tn': (10.3, 4),
        'matmul.f16.nn': (10.6, 4),
        'matmul.f16.nt': (10.8, 4),
        'matmul.f16.tn': (9.7, 4),
        'matmul.f32': (5.3, 6),
        'matmul.f32big': (6.5, 3),   # session 32
        'matmul.tma.bf16': (6.3, 3),
        'matmul.tma.f16': (6.1, 3),
        'matmul.wgmma.bf16': (3.9, 3),
        'matmul.wgmma.f16': (3.6, 3),
        'matmul.wgmmap.bf16': (13.9, 3),
        'matmul.wgmmap.f16': (14.2, 3),
        'matmul.wgmmas.bf16': (5.2, 4),
        'matmul.wgmmas.f16': (5.1, 4),
        'normalization.bf16': (22.3, 22),
        'normalization.f16': (25.7, 22),
        'normalization.f32': (25.0, 17),
        'normalization.rowx.bf16': (7.9, 8),
        'normalization.rowx.f16': (7.7, 8),
        'normalization.rowx.f32': (4.7, 8),
        'normalization_gs.bf16': (4.1, 15),
        'normalization_gs.f16': (3.6, 15),
        'normalization_gs.f32': (4.8, 17),
        'pooling.bf16': (6.6, 24),
        'pooling.f16': (6.7, 24),
        'pooling.f32': (6.5, 24),
        'reduce.f32': (7.8, 17),
        'reduce.h16': (11.0, 17),   # session 31 (h16: the typed pair x folded / typed)
        'rnn.h16': (2.3, 18),   # session 30: rnn.f16 and rnn.bf16 in one (pydnn::h16_t), measured as one of them
        'rnn.f32': (2.2, 18),
        'softmax.bf16': (9.2, 24),
        'softmax.f16': (9.2, 24),
        'softmax.f32': (8.7, 26),
        'softmax.split.bf16': (0.6, 2),
        'softmax.split.f16': (0.6, 2),
        'softmax.split.f32': (0.8, 3),
        'tensor_ops.f32': (1.1, 16),
        'tensor_ops.h16': (1.8, 16),   # session 31 (h16: the typed pair x folded / typed)
        'tensor_ops.plain.f32': (0.7, 7),
        'tensor_ops.plain.h16': (1.1, 7),   # session 31 (h16: the typed pair x folded / typed)
        'tensor_ops.rows.f32': (0.5, 6),
        'tensor_ops.rows.h16': (0.8, 6),   # session 31 (h16: the typed pair x folded / typed)
        'tensor_ops.transform.f32': (2.1, 20),
        'tensor_ops.transform.h16': (2.3, 15),   # session 31 (h16: the typed pair x folded / typed)
    },
}
