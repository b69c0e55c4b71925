"""Fused attention backward on Hopper wgmma (sm_90a units attention.wgmma_bwd.bf16 / .f16, kernels in
ptx/attention_wgmma_bwd.cu): the dK / dV kernel (with the atomic dQ share when deterministic = 0) and the
deterministic mode's dQ pass, used by pydnn/ops/attention.py's attention_backward on compute capability
9.0 devices when `usable` says so; everything else (other devices, dropout, ENABLED = False) runs the
mma.sync kernels of attention.cu.

The preprocess (bwd_pre) and the atomic mode's dQ conversion (bwd_dq_convert) are attention.cu's: the
workspace is the same (rowsum(dO * O) and the fp32 dQ accumulator), so
get_attention_backward_workspace_size is valid for both paths.

ENABLED: module switch (tests force either path; tools/bench_attention.py may compare them).
"""
from .. import enums as E
from .. import tuning
from .._build.manifest import KernelUnit
from .._cuda import driver

# ENABLED: a switch, pydnn.tuning.attention_bwd.ENABLED (default True)
ARCH = "sm_90"          # the units are compiled for sm_90a: only such devices can load them
# D = 96 runs D = 128's tiles with the last 32 columns zero in shared memory (Pad in the kernels), in units
# of its own (attention.wgmma_bwd.d96.<tag>). D = 256 stays on mma.sync: dK + dV of 64 keys x 256 per
# warpgroup would be 256 registers a thread.
HEAD_DIMS = (64, 96, 128)
THREADS = 256           # kThreads: two warpgroups
KEYS = 128              # kBN: keys per CTA of bwd_dkdv_wg
DQ_ROWS, DQ_KEYS = 128, 64  # CfgDq<D>: bwd_dq_wg's query rows per CTA and keys per K / V tile
TAGS = ("bf16", "f16")


def query_rows(d):
    """Cfg<D>::BM: query rows per tile (the S^T / dP^T accumulators and dK / dV fit 192 registers)."""
    return 64 if d > 64 else 128


def _pad(d):
    return 128 if d == 96 else d


def smem_bytes(d):
    """Cfg<D>::SMEM: K, V, two stages of Q and dO, the dS^T tile, lse / dsum [2][BM], 1 KiB alignment slack."""
    bm, dp = query_rows(d), _pad(d)
    return 2 * KEYS * dp * 2 + 4 * bm * dp * 2 + KEYS * bm * 2 + 4 * bm * 4 + 1024


def dq_smem_bytes(d):
    """CfgDq<D>::SMEM: Q and dO (128 rows), two stages of K and V (64 keys), 1 KiB alignment slack."""
    dp = _pad(d)
    return 2 * DQ_ROWS * dp * 2 + 4 * DQ_KEYS * dp * 2 + 1024


def _expr(tag, d, atomic=None):
    """bwd_dkdv_wg<T, D, ATOMIC>, or (atomic None) bwd_dq_wg<T, D>."""
    t = "pydnn::bf16_t" if tag == "bf16" else "pydnn::half_t"
    if atomic is None:
        return f"pydnn::attn_wgb::bwd_dq_wg<{t}, {d}>"
    return f"pydnn::attn_wgb::bwd_dkdv_wg<{t}, {d}, {'true' if atomic else 'false'}>"


def unit_name(tag, d):
    """attention.wgmma_bwd.<tag> (D 64, 128), attention.wgmma_bwd.d96.<tag>."""
    return f"attention.wgmma_bwd.d96.{tag}" if d == 96 else f"attention.wgmma_bwd.{tag}"


def kernel_units():
    """These units, and the warp-specialized backward's (pydnn/ops/attention_ws_bwd.py: registered here, the
    build manifest lists this module)."""
    from . import attention_ws_bwd
    return [KernelUnit(unit_name(tag, g[0]), "attention_wgmma_bwd.cu",
                       tuple(_expr(tag, d, at) for d in g for at in (True, False, None)), archs=(ARCH + "a",))
            for g in ((64, 128), (96,)) for tag in TAGS] + attention_ws_bwd.kernel_units()


def _function(handle, tag, d, expr, smem):
    return handle.function(unit_name(tag, d), expr, smem)


def usable(handle, d, tag, dropout):
    """Whether the wgmma dK / dV kernel runs this problem: an sm_90 device, no dropout, a head dim and type
    it is instantiated for, and the module switch on."""
    return tuning.attention_bwd.ENABLED and handle.arch == ARCH and dropout == 0 and d in HEAD_DIMS and tag in TAGS


def launch_dkdv(handle, tag, d, atomic, batch, heads_kv, seq_kv, params):
    """bwd_dkdv_wg over (128-key blocks, K/V heads, batch) with `params` (an AttnParams)."""
    smem = smem_bytes(d)
    f = _function(handle, tag, d, _expr(tag, d, atomic), smem)
    driver.launch(f, ((seq_kv + KEYS - 1) // KEYS, heads_kv, batch), (THREADS, 1, 1), smem, handle.cu_stream, params)


def launch_dq(handle, tag, d, batch, heads_q, seq_q, params):
    """bwd_dq_wg (the deterministic mode's dQ) over (128-row blocks, query heads, batch)."""
    smem = dq_smem_bytes(d)
    f = _function(handle, tag, d, _expr(tag, d), smem)
    driver.launch(f, ((seq_q + DQ_ROWS - 1) // DQ_ROWS, heads_q, batch), (THREADS, 1, 1), smem, handle.cu_stream,
                  params)
