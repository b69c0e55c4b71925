"""Fused attention forward on Hopper wgmma (ptx/attention_wgmma.cu; units attention.wgmma.bf16 / .f16,
compiled for sm_90a only). pydnn/ops/attention.py's attention_forward validates the call and builds the
params, then asks `usable` whether this path takes it (an sm_90 device, no dropout, ENABLED) and
`launch`es it; everything else runs on the mma.sync kernels of ptx/attention.cu.

Kernel shape: 128 query rows per CTA (two warpgroups of 64 rows, 256 threads, one CTA per SM), K/V tiles
of BN keys double-buffered with cp.async in wgmma's 128B-swizzled layout, S = Q K^T by SS wgmma, the
online softmax on the accumulator fragment, O += P V by the register-A wgmma (P never leaves registers).
PIPE: the next tile's S is issued with the previous tile's P V, whose time the softmax overlaps;
STAGES: K/V buffers (3: copies two tiles ahead).
"""
from .. import enums as E
from .. import tuning
from .._build.manifest import KernelUnit
from .._cuda import driver

# ENABLED: a switch, pydnn.tuning.attention.ENABLED (default True); False: attention_forward always takes the mma.sync kernel (tests force either path)
ARCH = "sm_90"          # the device arch the units exist for (as sm_90a)
HEAD_DIMS = (64, 96, 128, 256)
THREADS, BM = 256, 128  # kThreads, kBM in ptx/attention_wgmma.cu
# Variants instantiated per head dim, (keys per tile, PIPE, STAGES), and the one used; the benchmark
# times each (tools/bench_attention.py). Pipe measured 1-4% faster at d 128, plain 5% faster at d 64
# (H200, with load_tile's hoisted addresses); 3 stages (230 KB of smem at d 128) measured -7%..+1%
# against 2: not instantiated.
_V = ((128, True, 2), (128, False, 2))
# D = 256: O takes 128 registers a thread, so 64-key tiles (S 32, P 16 more); its own units
# (attention.wgmma.d256.<tag>), compiled in parallel with the others.
# D = 96 runs D = 128's tiles with the last 32 columns zero in shared memory (Pad in the kernel): S takes
# the 6 real k16 steps, P V computes 128 columns (a quarter wasted, against mma.sync's ~2/3 of wgmma's rate).
TILES = {64: _V, 96: _V, 128: _V, 256: ((64, True, 2), (64, False, 2))}
TILE = {64: (128, False, 2), 96: (128, True, 2), 128: (128, True, 2), 256: (64, True, 2)}
CTYPE = {"bf16": "pydnn::bf16_t", "f16": "pydnn::half_t"}
# DIAG: a switch, pydnn.tuning.attention.DIAG (default None); benchmark only: a (unit, expr) of diag_units that launch runs instead


def _expr(tag, d, tile, diag=0):
    bn, pipe, stages = tile
    return f"pydnn::attn_wg::fwd<{CTYPE[tag]}, {d}, {bn}, {'true' if pipe else 'false'}, {stages}, {diag}>"


def unit_name(tag, d):
    """attention.wgmma.<tag> (D 64, 128), attention.wgmma.d96.<tag>, attention.wgmma.d256.<tag>."""
    return f"attention.wgmma.d{d}.{tag}" if d in (96, 256) else f"attention.wgmma.{tag}"


def kernel_units():
    """These units, and the warp-specialized forward's (pydnn/ops/attention_ws.py: registered here, the
    manifest lists this module)."""
    from . import attention_ws
    groups = ((64, 128), (96,), (256,))
    return [KernelUnit(unit_name(tag, g[0]), "attention_wgmma.cu",
                       tuple(_expr(tag, d, t) for d in g for t in TILES[d]), archs=(ARCH + "a",))
            for g in groups for tag in ("bf16", "f16")] + attention_ws.kernel_units()


def diag_units():
    """Benchmark-only diagnostics (wrong results; outside the build, registered with the loader like
    matmul's candidate units): the default tile without softmax (DIAG 1: the MMA + copy floor) and
    without wgmma (DIAG 2: the softmax + copy floor), bf16. Returns {(d, diag): (unit, expr)}."""
    from .._build import loader
    exprs = {(d, g): _expr("bf16", d, TILE[d], g) for d in (64, 128) for g in (1, 2)}
    unit = KernelUnit("attention.wgdiag.bf16", "attention_wgmma.cu", tuple(exprs.values()), archs=(ARCH + "a",))
    loader.register_units([unit])
    return {k: (unit.name, e) for k, e in exprs.items()}


def smem_bytes(d, tile):
    """Q (128 x d), STAGES K and STAGES V tiles (16-bit), +1 KiB to align wgmma's swizzle atoms (3 stages
    at d 128: 230400 bytes, within the 227 KiB an sm_90 block may opt in to)."""
    return (BM + 2 * tile[2] * tile[0]) * (128 if d == 96 else d) * 2 + 1024


def usable(handle, head_dim, dropout):
    """Whether the wgmma forward takes this call (dropout stays on the mma.sync kernel)."""
    return tuning.attention.ENABLED and handle.arch == ARCH and head_dim in HEAD_DIMS and dropout == 0


def launch(handle, tag, d, grid_yz, seq_q, p):
    """One forward launch (params p built and checked by attention_forward)."""
    tile = TILE[d]
    unit, expr = tuning.attention.DIAG or (unit_name(tag, d), _expr(tag, d, tile))
    smem = smem_bytes(d, tile)
    f = handle.function(unit, expr, smem)
    grid = ((seq_q + BM - 1) // BM,) + tuple(grid_yz)
    driver.launch(f, grid, (THREADS, 1, 1), smem, handle.cu_stream, p)
