"""Fused attention forward on Hopper, warp specialized as FlashAttention-3 builds it (ptx/attention_ws.cu;
units attention.ws.bf16 / .f16, compiled for sm_90a only). pydnn/ops/attention.py's attention_forward
validates the call and builds the params; `usable` says whether this path takes it (an sm_90 device, a
head dim of HEAD_DIMS, no dropout, tuning.attention.WS) ahead of the older wgmma forward
(pydnn/ops/attention_wgmma.py, which WS = False selects for A/B) and `launch`es it.

Kernel shape: 384 threads, one persistent CTA per SM: a producer warpgroup (32 registers) copies Q and
the K / V tiles into STAGES-deep rings with cp.async, completion signalled on mbarriers; two consumer
warpgroups (232 registers) of 64 query rows each run S = Q K^T / softmax / O += P V on wgmma, the
softmax of tile j under P_{j-1} V_{j-1} (intra-warpgroup overlap), taking turns at the tensor cores
(ping-pong on named barriers). Work units of 128 query rows go round the CTAs in snake order, longest
causal row blocks first within sections of sched_heads (batch, head) pairs whose K / V fit in L2.
"""
from .. import tuning
from .._build.manifest import KernelUnit
from .._cuda import driver

ARCH = "sm_90"
HEAD_DIMS = (128,)      # the ones the planner sends here; d 64 / 256 are instantiated too (tests, the benchmark)
INSTANTIATED = (64, 128)  # attention.ws.<tag>; d 256 in its own unit (attention.ws.d256.<tag>, built in parallel)
THREADS, BM = 384, 128  # kThreadsWS, kBM in ptx/attention_ws.cu
BN = {64: 128, 128: 128, 256: 64}  # keys a tile (d 256: O takes 128 registers a thread, as the old kernel's)
STAGES = {64: 2, 128: 2, 256: 2}  # K and V buffers each (FA3's count at d 128: 160 KiB of tiles)
CTYPE = {"bf16": "pydnn::bf16_t", "f16": "pydnn::half_t"}
L2_SHARE = 0.5          # the share of L2 a section's K / V may fill
_L2 = {}


# PINGPONG: a benchmark knob (tools/bench_attention.py --fwd-ab), not a tuning switch: False launches the
# d 128 bf16 variant whose consumer warpgroups do not take turns (the one other instantiation)
PINGPONG = True


def _expr(tag, d, pp=True):
    return f"pydnn::attn_ws::fwd_ws<{CTYPE[tag]}, {d}, {BN[d]}, {STAGES[d]}, {'true' if pp else 'false'}>"


def unit_name(tag, d=128):
    return f"attention.ws.d256.{tag}" if d == 256 else f"attention.ws.{tag}"


def kernel_units():
    out = []
    for tag in ("bf16", "f16"):
        exprs = tuple(_expr(tag, d) for d in INSTANTIATED) + ((_expr(tag, 128, False),) if tag == "bf16" else ())
        out.append(KernelUnit(unit_name(tag), "attention_ws.cu", exprs, archs=(ARCH + "a",)))
        out.append(KernelUnit(unit_name(tag, 256), "attention_ws.cu", (_expr(tag, 256),), archs=(ARCH + "a",)))
    return out


def smem_bytes(d):
    """Q (128 x d), STAGES K and STAGES V tiles (16-bit), the mbarriers (4 per stage + 2, 8 bytes each),
    +1 KiB to align the swizzle atoms (d 128: 164944 bytes; d 256: 197712)."""
    return (BM + 2 * STAGES[d] * BN[d]) * d * 2 + (4 * STAGES[d] + 2) * 8 + 1024


def usable(handle, head_dim, dropout):
    return (tuning.attention.WS and tuning.attention.ENABLED and handle.arch == ARCH
            and head_dim in HEAD_DIMS and dropout == 0)


L2_DEFAULT = 50 << 20   # the H100's / H200's L2, where the driver cannot be asked (CPU-only test handles)


def l2_bytes(handle):
    n = _L2.get(handle.device)
    if n is None:
        try:
            n = int(driver.device_attribute(handle.device, "CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE"))
        except Exception:  # noqa: BLE001 - no driver (the CPU test handles): the Hopper value
            return L2_DEFAULT
        _L2[handle.device] = n
    return n


def sched_heads(l2, skv, d, group):
    """(batch, head) pairs per scheduling section: as many as keep their K and V (group query heads
    share one K / V head) within L2_SHARE of L2, at least one."""
    per_head = 2 * skv * d * 2 / max(1, group)
    return max(1, int(L2_SHARE * l2 // max(1.0, per_head)))


def grid_size(handle, b, hq, sq):
    units = b * hq * ((sq + BM - 1) // BM)
    return max(1, min(units, handle.sm_count))


def launch(handle, tag, d, b, hq, sq, skv, group, p):
    """One forward launch (params p built and checked by attention_forward)."""
    smem = smem_bytes(d)
    f = handle.function(unit_name(tag, d), _expr(tag, d, PINGPONG or tag != "bf16" or d != 128), smem)
    p.sched_heads = sched_heads(l2_bytes(handle), skv, d, group)
    driver.launch(f, (grid_size(handle, b, hq, sq), 1, 1), (THREADS, 1, 1), smem, handle.cu_stream, p)
