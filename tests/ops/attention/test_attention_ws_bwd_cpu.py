"""The warp-specialized Hopper attention backward (ptx/attention_ws_bwd.cu, pydnn/ops/attention_ws_bwd.py) on
the CPU: its units compile for sm_90a without spills (ptxas -v); attention_backward sends sm_90 d 64 / 128
calls without dropout or per-batch lengths to it (when HEAD_DIMS lists the head dim and the switch is on)
with its grid, block, shared memory and two kernel arguments, and everything else where it went before;
the GPU tests' cases reach it; and an emulation of the kernel's synchronization (the producer warp's TMA
+ lse / dsum stage ring on mbarriers with transaction counts, the two consumer warpgroups' releases, the
dS^T double buffer behind one named barrier) under random interleavings: no deadlock, no stage or dS^T
buffer overwritten while a reader still needs it, and the emulation fails when a release or the dS^T
double buffer is taken away."""
import ctypes
import random

import pytest

import pydnn
from pydnn import tuning
from pydnn._cuda import driver
from pydnn.ops import attention as A
from pydnn.ops import attention_wgmma_bwd as W
from pydnn.ops import attention_ws_bwd as WSB
from test_attention_cpu import BF16, F16, F32, NONE, TL, BR, _t
from test_fuzz_cpu import cpu_handle
from test_attention_hdim_cpu import _Recorded, launches  # noqa: F401 - the fixture

SMEM_LIMIT = 227 * 1024


def test_units():
    units = {u.name: u for u in WSB.kernel_units()}
    assert sorted(units) == ["attention.ws_bwd.bf16", "attention.ws_bwd.f16"]
    for t in ("bf16", "f16"):
        u = units[f"attention.ws_bwd.{t}"]
        assert u.archs == ("sm_90a",) and u.source == "attention_ws_bwd.cu"
        assert u.exprs == (tuple(WSB._expr(t, d, m) for d in (64, 128)
                                 for m in ("none", "red", "bulk", "redpp", "bulkw", "bulkwpp", "bulkwpp1")
                                 if (d, m) != (64, "bulkwpp"))
                           + tuple(WSB._expr(t, 256, m) for m in WSB.D256_MODES)
                           + (WSB._expr(t, 128, "bulk", 3), WSB._expr(t, 128, "bulkw", 3),
                              WSB._expr(t, 128, "bulkwpp1", 3))
                           + tuple(WSB._expr(t, d, m, 2, v)
                                   for d, m in ((64, "bulkwpp1"), (128, "bulkwpp1"), (128, "bulkwpp"))
                                   for v in (1, 2, 4, 8)))
    assert WSB._expr("bf16", 128, "bulk") == "pydnn::attn_wsb::bwd_ws<pydnn::bf16_t, 128, 2, 2>"
    assert WSB._expr("bf16", 64, "bulkwpp1", 2, 4) == "pydnn::attn_wsb::bwd_ws_var<pydnn::bf16_t, 64, 7, 2, 4>"
    assert WSB._expr("f16", 64, "none") == "pydnn::attn_wsb::bwd_ws<pydnn::half_t, 64, 0, 2>"
    assert WSB._expr("bf16", 128, "bulkw", 3) == "pydnn::attn_wsb::bwd_ws<pydnn::bf16_t, 128, 4, 3>"
    assert WSB._expr("f16", 256, "red") == "pydnn::attn_wsb::bwd_ws256<pydnn::half_t, 1>"
    assert set(units) <= {u.name for u in W.kernel_units()}  # registered through attention_wgmma_bwd
    # Cfg<D, STAGES>::SMEM, by hand: K + V, Q + dO stages, two dS^T, lse / dsum, the fp32 dQ tile, barriers,
    # slack
    assert WSB.smem_bytes(128) == (2 * 128 * 128 * 2 + 2 * 2 * 64 * 128 * 2 + 2 * 128 * 64 * 2 + 2 * 64 * 8
                                   + 64 * 128 * 4 + 13 * 8 + 16 + 1024) == 198776
    assert WSB.smem_bytes(64) == (2 * 128 * 64 * 2 + 2 * 2 * 128 * 64 * 2 + 2 * 128 * 128 * 2 + 2 * 128 * 8
                                  + 128 * 64 * 4 + 13 * 8 + 16 + 1024) == 199800
    for d in (64, 128):
        assert WSB.smem_bytes(d) <= SMEM_LIMIT
    assert WSB.smem_bytes(128, 2, "bulkwpp") == WSB.smem_bytes(128) + 64 * 128 * 4 == 231544 <= SMEM_LIMIT
    assert WSB.smem_bytes(128, 3) == 232072 <= SMEM_LIMIT < WSB.smem_bytes(64, 3)  # (3 stages: d 128 only)
    assert all(d == 128 and WSB.smem_bytes(d, st) <= SMEM_LIMIT for d, _, st in WSB.DEEP)
    # every instantiation fits (d 64 bulkwpp would not: 120 bytes over; the mid-session run's driver refused it)
    assert WSB.SMEM_LIMIT == SMEM_LIMIT == 232448 < WSB.smem_bytes(64, 2, "bulkwpp") == 232568
    modes = {v: k for k, v in WSB.DQ_MODES.items()}
    for t in ("bf16", "f16"):
        for e in units[f"attention.ws_bwd.{t}"].exprs:
            args = [int(x) for x in e.split("<", 1)[1].rstrip(">").split(", ")[1:]]
            d, m, st = args[:3] if "bwd_ws256<" not in e else (256, args[0], 2)  # bwd_ws256<T, DQ>; bwd_ws_var<.., VAR>
            assert WSB.smem_bytes(d, st, modes[m]) <= SMEM_LIMIT, e
    # Cfg256: K, V of 64 keys, 2 stages of Q / dO (64 rows), 2 x (P^T, dS^T) of 64 x 64, lse / dsum, 7
    # mbarriers, slack: 968 bytes under the limit (bulkw stages its dQ tile in the Q / dO buffers)
    assert WSB.smem_bytes(256) == WSB.smem_bytes(256, 2, "bulkw") == (2 * 64 * 256 * 2 + 2 * 2 * 64 * 256 * 2
                                                                      + 4 * 64 * 64 * 2 + 2 * 64 * 8 + 7 * 8 + 1024)
    assert WSB.smem_bytes(256) == 231480 == SMEM_LIMIT - 968
    # bulkw's fp32 dQ halves (64 rows x 128 columns) fill a Q / dO stage buffer exactly
    assert 64 * 128 * 4 == 64 * 256 * 2


def _dq_byte(bm, rr, cc):
    """attention_ws_bwd.cu kDqBulk's tile: byte offset of float (row rr, column cc) (TMA's 128B swizzle on
    slabs of 32 fp32 columns)."""
    w = cc & 31
    return (cc >> 5) * (bm * 128) + rr * 128 + (((w >> 2) ^ (rr & 7)) << 4) + (w & 3) * 4


@pytest.mark.parametrize("d", [64, 128])
def test_dq_tile_layout_and_banks(d):
    """The swizzled dQ tile: every float of the [BM][d] tile at its own place, TMA's layout for a box of
    32 fp32 columns (row r of a slab at 128 r, 16-byte chunk k at k ^ (r & 7)); one warp instruction's
    float2 stores (lane g * 4 + q4: row r0 + g, column c0 + 8 j + 2 q4) take 2 wavefronts, the minimum
    (a row-major tile: 8)."""
    bm = WSB.query_rows(d)
    offs = {_dq_byte(bm, r, c) for r in range(bm) for c in range(d)}
    assert offs == set(range(0, bm * d * 4, 4))
    for r in range(bm):
        for c in range(d):
            k = (c % 32) // 4
            assert _dq_byte(bm, r, c) == (c // 32) * bm * 128 + r * 128 + 16 * (k ^ (r % 8)) + 4 * (c % 4)

    def wavefronts(addr):
        banks = {}
        for lane in range(32):
            g, q4 = divmod(lane, 4)
            a = addr(16 + g, 64 + 8 * 3 + 2 * q4) if d == 128 else addr(16 + g, 8 * 3 + 2 * q4)
            for byte in (a, a + 4):
                banks.setdefault((byte // 4) % 32, set()).add(byte // 4)
        return max(len(v) for v in banks.values())
    assert wavefronts(lambda r, c: _dq_byte(bm, r, c)) == 2
    assert wavefronts(lambda r, c: 4 * (r * d + c)) == 8


# ----------------------------------------------------------------------------- dispatch

def _bwd(hq=4, hkv=2, sq=300, skv=517, d=128, mask=NONE, det=0, dtype=BF16, dropout=0.0, arch="sm_90"):
    a = pydnn.create_attention_descriptor()
    pydnn.set_attention_descriptor(a, hq, hkv, d, d ** -0.5, mask, dropout, 0)
    b = 2
    qd, kd = (b, hq, sq, d), (b, hkv, skv, d)
    tq, tk, tst = _t(qd, dtype), _t(kd, dtype), _t((b, hq, sq, 1), F32)
    h = cpu_handle()
    h.arch, h._funcs = arch, _Recorded()
    n = pydnn.get_attention_backward_workspace_size(h, a, tq, tk)
    base = 1 << 32
    ptr = [base + i * (1 << 28) for i in range(10)]
    pydnn.attention_backward(h, a, tq, ptr[0], tk, ptr[1], tk, ptr[2], tq, ptr[3], tq, ptr[4], tst, ptr[5],
                             tq, ptr[6], tk, ptr[7], tk, ptr[8], None, None, det, ptr[9], n)


@pytest.fixture
def on(monkeypatch, launches):
    monkeypatch.setattr(tuning.attention_bwd, "ENABLED", True)
    monkeypatch.setattr(tuning.attention_bwd, "WS", True)
    monkeypatch.setattr(tuning.attention_bwd, "WS_DQ_CAUSAL", None)  # (WS_DQ as each test sets it)
    monkeypatch.setattr(tuning.attention_bwd, "WS_ORDER", False)
    monkeypatch.setattr(WSB, "HEAD_DIMS", (64, 128, 256))
    monkeypatch.setattr(WSB, "HEAD_DIMS_DET", (64, 128, 256))
    monkeypatch.setattr(WSB, "maps", lambda tag, d, p, mode="none": WSB.Maps())  # (no driver to encode with here)
    return launches


def _names(launches):
    return [x["f"].split("<")[0].split("::")[-1] for x in launches]


@pytest.mark.parametrize("dq", ["bulk", "red", "redpp", "bulkw", "bulkwpp"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("det", [0, 1])
@pytest.mark.parametrize("mask", [NONE, TL, BR], ids=["none", "tl", "br"])
@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "f16"])
def test_dispatch(on, monkeypatch, d, det, mask, dtype, dq):
    monkeypatch.setattr(tuning.attention_bwd, "WS_DQ", dq)
    _bwd(d=d, det=det, mask=mask, dtype=dtype)
    names = _names(on)
    assert names == (["bwd_pre_v", "bwd_ws", "bwd_dq_wg"] if det else ["bwd_pre_v", "bwd_ws", "bwd_dq_convert_v"])
    ws = on[1]
    tag = "bf16" if dtype == BF16 else "f16"
    mode = "none" if det else "bulkwpp1" if (d, dq) == (64, "bulkwpp") else dq
    assert ws["f"] == WSB._expr(tag, d, mode)
    assert ws["grid"] == (-(-517 // 128), 2, 2) and ws["threads"] == 384 and ws["smem"] == WSB.smem_bytes(d, 2, mode)


@pytest.mark.parametrize("var", sorted(WSB.VARS))
@pytest.mark.parametrize("d, dq, mask", [(64, "bulkwpp1", NONE), (64, "bulkwpp", TL), (128, "bulkwpp1", NONE),
                                         (128, "bulkwpp", TL), (128, "bulk", NONE), (256, "bulkw", TL)])
def test_dispatch_var(on, monkeypatch, var, d, dq, mask):
    """tuning.attention_bwd.WS_VAR picks bwd_ws_var<..., VAR> for VAR_CASES' (d, mode) pairs (d 64's bulkwpp runs
    bulkwpp1: a VAR case), the default kernel elsewhere (another mode, d 256, deterministic), and refuses a name
    that is not a probe."""
    monkeypatch.setattr(tuning.attention_bwd, "WS_DQ", dq)
    monkeypatch.setattr(tuning.attention_bwd, "WS_VAR", var)
    mode = "bulkwpp1" if (d, dq) == (64, "bulkwpp") else dq
    for det in (0, 1):
        del on[:]
        _bwd(d=d, det=det, mask=mask)
        m = "none" if det else mode
        v = WSB.VARS[var] if (d, m) in WSB.VAR_CASES else 0
        assert on[1]["f"] == WSB._expr("bf16", d, m, 2, v)
        assert (v == 0) == ("bwd_ws_var<" not in on[1]["f"]) and (v == 0 or on[1]["f"].endswith(f", {v}>"))
    monkeypatch.setattr(tuning.attention_bwd, "WS_VAR", "nope")
    with pytest.raises(ValueError, match="WS_VAR"):
        WSB.var_of(64, "bulkwpp1", 2)


@pytest.mark.parametrize("order", [False, True])
@pytest.mark.parametrize("dq", ["red", "bulkw", "bulkw2"])
@pytest.mark.parametrize("det", [0, 1])
@pytest.mark.parametrize("mask", [NONE, TL, BR], ids=["none", "tl", "br"])
@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "f16"])
def test_dispatch_d256(on, monkeypatch, det, mask, dtype, dq, order):
    """d 256: bwd_ws256 (64-key CTAs: 9 blocks of 517 keys), dQ by WS_DQ_D256 whatever WS_DQ says (bwd_ws's
    modes), deterministic: the mma.sync dQ pass after it."""
    monkeypatch.setattr(tuning.attention_bwd, "WS_DQ", "bulkwpp")
    monkeypatch.setattr(tuning.attention_bwd, "WS_DQ_D256", dq)
    monkeypatch.setattr(tuning.attention_bwd, "WS_ORDER", order)
    _bwd(d=256, det=det, mask=mask, dtype=dtype)
    assert WSB.D256_MODES[0] == "none" and set(WSB.D256_MODES[1:]) <= {"red", "bulkw", "bulkw2"}
    dq = dq if dq in WSB.D256_MODES else WSB.D256_MODES[1]  # (a mode not instantiated: the first atomic one)
    names = _names(on)
    assert names == (["bwd_pre_v", "bwd_ws256", "bwd_dq"] if det else ["bwd_pre_v", "bwd_ws256", "bwd_dq_convert_v"])
    ws = on[1]
    tag = "bf16" if dtype == BF16 else "f16"
    mode = "none" if det else dq
    assert ws["f"] == WSB._expr(tag, 256, mode) and ws["threads"] == 384 and ws["smem"] == WSB.smem_bytes(256) <= SMEM_LIMIT
    assert ws["grid"] == ((9 * 2 * 2, 1, 1) if order else (9, 2, 2))


@pytest.mark.parametrize("why", ["switch", "head_dims", "dropout", "sm_80", "refused", "lengths"])
def test_dispatch_d256_elsewhere(on, monkeypatch, why):
    """d 256 that bwd_ws256 does not take: the mma.sync dK / dV kernel, as before."""
    kw = {}
    if why == "switch":
        monkeypatch.setattr(tuning.attention_bwd, "WS", False)
    elif why == "head_dims":
        monkeypatch.setattr(WSB, "HEAD_DIMS", (64, 128))
    elif why == "dropout":
        kw["dropout"] = 0.1
    elif why == "sm_80":
        kw["arch"] = "sm_80"
    elif why == "refused":
        def refuse(*a):
            raise pydnn.PydnnError(9, "no")
        monkeypatch.setattr(WSB, "maps", refuse)
    elif why == "lengths":
        monkeypatch.setattr(WSB, "usable", lambda *a, **k: False)
    _bwd(d=256, **kw)
    names = _names(on)
    assert "bwd_ws256" not in names and "bwd_dkdv" in names, names


@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("order", [False, True])
@pytest.mark.parametrize("dq", ["bulk", "bulkw", "red", "bulkwpp", "bulkwpp1"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("det", [0, 1])
def test_dispatch_order_and_stages(on, monkeypatch, d, det, dq, order, stages):
    """WS_ORDER: the same CTAs as a 1-d grid (blocks x K/V heads x batch); WS_STAGES 3: the 3-stage
    instantiation and its shared memory where DEEP has it (d 128 bulk / bulkw), else the 2-stage one."""
    monkeypatch.setattr(tuning.attention_bwd, "WS_DQ", dq)
    monkeypatch.setattr(tuning.attention_bwd, "WS_ORDER", order)
    monkeypatch.setattr(tuning.attention_bwd, "WS_STAGES", stages)
    _bwd(d=d, det=det, mask=TL)
    ws = on[1]
    mode = "none" if det else "bulkwpp1" if (d, dq) == (64, "bulkwpp") else dq
    st = 3 if stages == 3 and d == 128 and mode in ("bulk", "bulkw", "bulkwpp1") else 2
    assert ws["f"] == WSB._expr("bf16", d, mode, st) and ws["smem"] == WSB.smem_bytes(d, st, mode)
    assert ws["grid"] == ((5 * 2 * 2, 1, 1) if order else (5, 2, 2))


def _order_map(lin, nx, hkv, b, chunk=4):
    """attention_ws_bwd.cu's 1-d grid: linear block -> (key block, K/V head, batch)."""
    c = lin // (nx * chunk)
    n = min(chunk, hkv * b - c * chunk)
    r = lin - c * nx * chunk
    hb = c * chunk + r % n
    return r // n, hb % hkv, hb // hkv


@pytest.mark.parametrize("nx,hkv,b", [(5, 2, 2), (32, 32, 4), (1, 1, 1), (7, 1, 1), (3, 5, 3), (32, 8, 4), (2, 3, 1)])
def test_order_covers_every_cta_once(nx, hkv, b):
    """The 1-d grid's order: a bijection onto (key block, K/V head, batch); inside a chunk the key blocks
    ascend (a causal walk's length does not grow with the block); one pair: the 3-d grid's order."""
    got = [_order_map(i, nx, hkv, b) for i in range(nx * hkv * b)]
    assert sorted(got) == sorted((x, h, bb) for x in range(nx) for h in range(hkv) for bb in range(b))
    for i in range(1, len(got)):
        if (i // (nx * 4)) == ((i - 1) // (nx * 4)):
            assert got[i][0] >= got[i - 1][0]
    if hkv * b == 1:
        assert got == [(x, 0, 0) for x in range(nx)]


def _makespan(jobs, sms=132):
    import heapq
    h = [0.0] * sms
    for j in jobs:
        heapq.heappush(h, heapq.heappop(h) + j)
    return max(h)


@pytest.mark.parametrize("hq,hkv,d,tail_nat,tail_ord", [(32, 32, 128, 0.034, 0.0014), (64, 8, 128, 0.14, 0.0002)])
def test_order_schedule_emulated(hq, hkv, d, tail_nat, tail_ord):
    """kOrderChunk's comment: b4 s4096 causal, 132 SMs dispatching CTAs in launch order to the first free
    SM, a CTA's cost its query tiles x group heads + 1.5: the last SM's end past the average, natural order
    against the chunked one."""
    b, s, bm = 4, 4096, WSB.query_rows(d)
    nx = s // 128
    cost = [(s - 128 * x) // bm * (hq // hkv) + 1.5 for x in range(nx)]
    avg = sum(cost) * hkv * b / 132
    nat = _makespan([cost[x] for _ in range(hkv * b) for x in range(nx)]) / avg - 1
    order = _makespan([cost[_order_map(i, nx, hkv, b)[0]] for i in range(nx * hkv * b)]) / avg - 1
    assert nat == pytest.approx(tail_nat, abs=0.002) and order == pytest.approx(tail_ord, abs=0.001)


def test_launch_passes_params_and_maps(on, monkeypatch):
    got = []
    monkeypatch.setattr(driver, "launch_args", lambda f, grid, block, smem, stream, argv: got.append(argv))
    _bwd()
    (argv,) = [a for a in got if len(a) == 4]
    arr, addr, p, m = argv
    assert addr == ctypes.addressof(arr) and arr[0] == ctypes.addressof(p) and arr[1] == ctypes.addressof(m)
    assert ctypes.sizeof(m) == 640 and p.dq_acc  # the atomic mode's accumulator


@pytest.mark.parametrize("why", ["switch", "head_dims", "det_head_dims", "d96", "dropout", "sm_80", "recorder"])
def test_dispatch_elsewhere(on, monkeypatch, why):
    kw = {}
    if why == "switch":
        monkeypatch.setattr(tuning.attention_bwd, "WS", False)
    elif why == "head_dims":
        monkeypatch.setattr(WSB, "HEAD_DIMS", (64,))
    elif why == "det_head_dims":
        monkeypatch.setattr(WSB, "HEAD_DIMS_DET", (64,))
        kw["det"] = 1
    elif why == "d96":
        kw["d"] = 96
    elif why == "dropout":
        kw["dropout"] = 0.1
    elif why == "sm_80":
        kw["arch"] = "sm_80"
    elif why == "recorder":
        monkeypatch.setattr(driver, "_recorders", 1)
    if why == "recorder":
        assert not WSB.usable(type("H", (), {"arch": "sm_90"})(), 128, "bf16", 0.0, A.AttnParams())
        return
    _bwd(**kw)
    assert "bwd_ws" not in _names(on)
    if why in ("switch", "head_dims", "det_head_dims", "d96"):
        assert "bwd_dkdv_wg" in _names(on)


def test_lengths_and_refused_maps_take_the_older_kernel(on, monkeypatch):
    p = A.AttnParams()
    h = type("H", (), {"arch": "sm_90"})()
    assert WSB.usable(h, 128, "bf16", 0.0, p)
    p.lens_kv = 1 << 30
    assert not WSB.usable(h, 128, "bf16", 0.0, p)
    p.lens_kv, p.lens_q = None, 1 << 30
    assert not WSB.usable(h, 128, "bf16", 0.0, p)

    def refuse(*a):
        raise pydnn.PydnnError(9, "no")
    monkeypatch.setattr(WSB, "maps", refuse)
    _bwd()
    assert _names(on) == ["bwd_pre_v", "bwd_dkdv_wg", "bwd_dq_convert_v"]


def _gpu_cases():
    import test_attention_ws_bwd_gpu as G
    return G.CASES + G.LONG_CASES


@pytest.mark.parametrize("case", _gpu_cases(), ids=lambda c: f"{c[0]}x{c[1]}/{c[2]}x{c[3]}x{c[4]}d{c[5]}{c[6]}")
def test_gpu_cases_take_this_kernel(on, case):
    b, hq, hkv, sq, skv, d, layout = case
    _bwd(hq=hq, hkv=hkv, sq=sq, skv=skv, d=d, mask=BR)
    assert _names(on)[1] == "bwd_ws"


# ----------------------------------------------------------------------------- the synchronization, emulated

class _Mbar:
    """An mbarrier: an arrival count per phase and a transaction count (expect_tx raises it, landed
    bytes lower it); the phase completes when both reach zero."""

    def __init__(self, count):
        self.count, self.pending, self.tx, self.phase = count, count, 0, 0

    def _check(self):
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count

    def arrive(self, n=1, expect_tx=0):
        self.tx += expect_tx
        self.pending -= n
        assert self.pending >= 0, "more arrivals than the barrier's count"
        self._check()

    def complete_tx(self, n):
        self.tx -= n
        assert self.tx >= 0
        self._check()

    def done(self, parity):  # mbarrier.try_wait.parity
        return (self.phase & 1) != parity


class _Named:
    """bar.sync over `count` warpgroups: the generation moves on when all arrived."""

    def __init__(self, count):
        self.count, self.arrived, self.gen = count, 0, 0

    def sync(self):
        g = self.gen
        self.arrived += 1
        if self.arrived == self.count:
            self.arrived, self.gen = 0, self.gen + 1
        return lambda: self.gen > g


def _emulate(iters, stages, seed, atomic=True, ds_buffers=2, bulk=True, wait_read=True, pp=False, ds_wait=True,
             writer=False, dq_wait=True, ndq=None):
    """One CTA of bwd_ws: the producer warp and the two consumer warpgroups as generators yielding wait
    conditions, run in a random interleaving; TMA boxes land after a random delay (their bytes on the
    full barrier). Checks that every stage a consumer reads holds its iteration's Q / dO / lse / dsum
    until the consumer released it, that each dS^T buffer holds both halves of the iteration being
    read while a warpgroup's dQ wgmma reads it, and that everything finishes. writer (kDqBulkW): the dQ
    tile goes through dqfull / dqempty and the writer warp instead of kBarDQ and thread 128 (wait_read:
    the writer's wait_group.read before dqempty; dq_wait: the consumers' dqempty wait)."""
    rng = random.Random(seed)
    kv = _Mbar(1)
    full = [_Mbar(33) for _ in range(stages)]
    empty = [_Mbar(8) for _ in range(stages)]
    kvbuf = [None]
    qbuf, lbuf = [None] * stages, [None] * stages
    dsb = [[None, None] for _ in range(ds_buffers)]
    named, named_dq = _Named(2), _Named(2)
    turn = [0, 0]   # kDqRedPP: pending bar.arrive counts on the turn barriers (one per arriving warpgroup)
    dsfull = [_Mbar(8) for _ in range(2)]
    dsempty = [_Mbar(8) for _ in range(2)]
    ndq = ndq or (2 if pp and writer else 1)     # kDqBulkWPP: two dQ tiles (kDqBulkWPP1: ndq = 1)
    dqt = [[None, None] for _ in range(ndq)]
    dqfull, dqempty = [_Mbar(8) for _ in range(ndq)], [_Mbar(1) for _ in range(ndq)]
    reducing = []   # kDqBulk(W(PP)): [time left, tile, buffer] while the reduction reads the dQ tile
    landing = []    # [time left, buffer, index, value, barrier, bytes]

    def tma(buf, i, val, bar, nbytes):
        landing.append([rng.randint(0, 4), buf, i, val, bar, nbytes])

    def producer():
        if iters == 0:
            return
        kv.arrive(1, expect_tx=2)
        tma(kvbuf, 0, "KV", kv, 2)
        for it in range(iters):
            s, n = it % stages, it // stages
            yield lambda s=s, n=n: empty[s].done((n & 1) ^ 1)
            full[s].arrive(1, expect_tx=2)          # lane 0: arrive.expect_tx, then the Q and dO boxes
            tma(qbuf, s, ("Q", it), full[s], 2)
            yield lambda: True
            lbuf[s] = ("L", it)                     # the lanes' lse / dsum stores, then their arrivals
            full[s].arrive(32)

    def dq_writer():
        """kDqBulkW's writer (thread 32): tile it's reductions once both halves are stored."""
        for t in range(iters):
            i = t % ndq
            yield lambda t=t, i=i: dqfull[i].done((t // ndq) & 1)
            assert dqt[i] == [t, t], "the writer reduces a tile whose halves are not both stored"
            reducing.append([rng.randint(0, 6), t, i])
            if wait_read:
                yield lambda: not reducing          # wait_group.read
            dqempty[i].arrive(1)
        yield lambda: not reducing                  # wait_group (before the CTA ends)

    def put_dq(cw, t):
        """kDqBulkW(PP): the warpgroup's half of dQ tile t into buffer t % ndq, then 4 warp arrivals."""
        i = t % ndq
        if dq_wait:
            yield lambda: dqempty[i].done(((t // ndq) & 1) ^ 1)
        dqt[i][cw] = t
        dqfull[i].arrive(4)

    def consumer_pp(cw):
        """kDqRedPP: S^T / dP^T issued on the warpgroup's turn, dS^T published on dsfull, the previous
        iteration's dQ taken from it, its buffer released on dsempty."""
        if cw == 1:
            turn[0] += 1
        if iters == 0:
            return
        yield lambda: kv.done(0)
        for it in range(iters):
            s, n = it % stages, it // stages
            yield lambda s=s, n=n: full[s].done(n & 1)
            yield lambda: turn[cw] > 0
            turn[cw] -= 1
            assert qbuf[s] == ("Q", it) and lbuf[s] == ("L", it)
            turn[cw ^ 1] += 1
            yield lambda: True                      # S^T, dP^T run; P^T, dS^T; dV issued
            b, u = it & 1, it >> 1
            if ds_wait:
                yield lambda b=b, u=u: dsempty[b].done((u & 1) ^ 1)
            dsb[b][cw] = it
            dsfull[b].arrive(4)
            if it > 0:
                pb, pu = (it - 1) & 1, (it - 1) >> 1
                yield lambda pb=pb, pu=pu: dsfull[pb].done(pu & 1)
                assert dsb[pb] == [it - 1, it - 1]
                yield lambda: True                  # the dQ wgmma reads both halves
                assert dsb[pb] == [it - 1, it - 1], "a dS^T half rewritten under the other's dQ"
                if writer:
                    yield from put_dq(cw, it - 1)
                dsempty[pb].arrive(4)
            assert qbuf[s] == ("Q", it)
            empty[s].arrive(4)
        last = iters - 1
        yield lambda: dsfull[last & 1].done((last >> 1) & 1)
        assert dsb[last & 1] == [last, last]
        yield lambda: True
        assert dsb[last & 1] == [last, last]
        if writer:
            yield from put_dq(cw, last)

    def consumer(cw):
        if pp:
            yield from consumer_pp(cw)
            return
        if iters == 0:
            return
        yield lambda: kv.done(0)
        assert kvbuf[0] == "KV"
        for it in range(iters):
            s, n = it % stages, it // stages
            yield lambda s=s, n=n: full[s].done(n & 1)
            assert qbuf[s] == ("Q", it) and lbuf[s] == ("L", it)
            yield lambda: True                      # S^T, dP^T, P^T, dS^T, the dV / dK wgmmas issued
            assert qbuf[s] == ("Q", it) and lbuf[s] == ("L", it)
            if atomic:
                b = it % ds_buffers
                dsb[b][cw] = it                     # this warpgroup's half of dS^T
                if bulk and not writer and cw == 0 and wait_read:  # thread 128: the last reduction's reads done
                    yield lambda: not reducing
                yield named.sync()
                assert dsb[b] == [it, it]
                yield lambda: True                  # the dQ wgmma reads both halves
                assert dsb[b] == [it, it] and qbuf[s] == ("Q", it)
            empty[s].arrive(4)                      # after wait<0>: one arrival per warp
            if atomic and writer:
                yield from put_dq(cw, it)
            elif atomic and bulk:
                assert not reducing, "a dQ half stored while the bulk reduction reads the tile"
                dqt[0][cw] = it
                yield named_dq.sync()
                if cw == 0:                         # thread 128 issues the reduction (it reads for a while)
                    reducing.append([rng.randint(0, 6), it, 0])

    actors = [producer(), consumer(0), consumer(1)] + ([dq_writer()] if writer and atomic and iters else [])
    conds = [lambda: True] * len(actors)
    live = [True] * len(actors)
    steps = 0
    while any(live) or landing or reducing:
        steps += 1
        assert steps < 100000
        for x in reducing:
            assert dqt[x[2]] == [x[1], x[1]], "the dQ tile changed under the bulk reduction"
            x[0] -= 1
        reducing[:] = [x for x in reducing if x[0] >= 0]
        for x in landing:
            x[0] -= 1
        for x in [x for x in landing if x[0] < 0]:
            landing.remove(x)
            _, buf, i, val, bar, nbytes = x
            buf[i] = val
            bar.complete_tx(nbytes)
        ready = [i for i in range(len(actors)) if live[i] and conds[i]()]
        if not ready:
            assert landing or reducing or not any(live), "deadlock: every warpgroup waits and no copy is in flight"
            continue
        i = rng.choice(ready)
        try:
            conds[i] = next(actors[i])
        except StopIteration:
            live[i] = False


@pytest.mark.parametrize("mode", ["none", "red", "bulk", "redpp", "bulkw", "bulkwpp", "bulkwpp1"])
@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("seed", range(10))
def test_synchronization_emulated(mode, stages, seed):
    rng = random.Random(2000 + seed)
    _emulate(rng.choice([0, 1, 2, 3, 5, 9, 16]), stages, seed, mode != "none",
             bulk=mode in ("bulk", "bulkw", "bulkwpp", "bulkwpp1"), pp=mode in ("redpp", "bulkwpp", "bulkwpp1"),
             writer=mode in ("bulkw", "bulkwpp", "bulkwpp1"), ndq=1 if mode == "bulkwpp1" else None)


@pytest.mark.parametrize("pp, ndq", [(False, None), (True, None), (True, 1)], ids=["bulkw", "bulkwpp", "bulkwpp1"])
@pytest.mark.parametrize("what", ["dq_wait", "wait_read"])
def test_emulation_catches_a_missing_writer_wait(what, pp, ndq):
    """kDqBulkW(PP(1)) without the consumers' dqempty wait, or without the writer's wait_group.read before it
    arrives: a half stored while the reduction still reads the tile."""
    with pytest.raises(AssertionError):
        for seed in range(300):
            _emulate(12, 2, seed, writer=True, pp=pp, ndq=ndq, **{what: False})


def test_emulation_catches_a_missing_ds_release():
    """kDqRedPP without the dsempty wait: a warpgroup an iteration ahead rewrites its dS^T half while the
    other's (delayed) dQ still reads the buffer."""
    with pytest.raises(AssertionError):
        for seed in range(200):
            _emulate(12, 2, seed, pp=True, ds_wait=False)


def test_emulation_catches_a_missing_bulk_read_wait():
    """kDqBulk without thread 128's wait_group.read: a half stored while the reduction still reads."""
    with pytest.raises(AssertionError):
        for seed in range(60):
            _emulate(12, 2, seed, wait_read=False)


def test_emulation_catches_a_missing_release():
    """A producer that skips the empty-barrier wait overwrites a stage a consumer still reads."""
    real = _Mbar.done
    try:
        _Mbar.done = lambda self, parity: True if self.count == 8 else real(self, parity)
        with pytest.raises(AssertionError):
            for seed in range(30):
                _emulate(12, 2, seed)
    finally:
        _Mbar.done = real


def test_emulation_catches_a_single_ds_buffer():
    """kDqRed with one dS^T buffer: a warpgroup runs ahead and writes its next half while the other's dQ
    reads. (kDqBulk's second barrier a tile would make one buffer enough: emulated too.)"""
    with pytest.raises(AssertionError):
        for seed in range(60):
            _emulate(12, 2, seed, ds_buffers=1, bulk=False)
    for seed in range(20):
        _emulate(12, 2, seed, ds_buffers=1, bulk=True)


# ----------------------------------------------------------------------------- NVRTC

# ptxas spills accepted (bytes of spill stores; f16 the same as bf16): the dQ writer's bulkw at d 64 (the
# prologue's values across the setmaxnreg: attention_ws_bwd.cu's writer comment; 2-4 L1 reloads an iteration)
def _emulate256(iters, seed, mode="bulkw", meet=True, wait_read=True, ds_buffers=2):
    """One CTA of bwd_ws256 (2 stages): the producer warp, the two consumer warpgroups and (bulkw / bulkw2) the
    dQ writer as generators in a random interleaving, TMA boxes landing after a random delay. A stage's Q and
    dO buffers are modelled in two regions each (bytes 16 KiB w ..: head-dim slabs 2 w, 2 w + 1, what warpgroup
    w's dK / dV read; S^T / dP^T read both). Checks that every region holds its iteration's data while a wgmma
    reads it, that each P^T / dS^T buffer holds both halves of the iteration read, that the writer reduces a
    stage holding dQ in all four regions and that no TMA load or dQ store lands under the reduction, and that
    everything finishes. bulkw: warpgroup 0's dQ into both dO regions after kBarDQ (both dVs), 1's into both Q
    regions after kBarDQ2 (both dKs); bulkw2: warpgroup w's into its own regions after its own dV / dK, no
    meeting. meet: bulkw's meetings; wait_read: the writer's wait_group.read before it releases the stage."""
    rng = random.Random(seed)
    stages = 2
    bulk = mode != "red"
    kv = _Mbar(1)
    full = [_Mbar(33) for _ in range(stages)]
    empty = [_Mbar(1 if bulk else 8) for _ in range(stages)]
    dqfull = [_Mbar(8) for _ in range(stages)]
    stage = [[[None, None], [None, None]] for _ in range(stages)]   # [Q regions, dO regions] of each stage
    lbuf = [None] * stages
    dsb = [[None, None] for _ in range(ds_buffers)]
    named, named_dq, named_dq2 = _Named(2), _Named(2), _Named(2)
    reducing = []   # [time left, iteration, stage]
    landing = []    # [time left, stage, value, barrier, bytes]

    def every(s, val):
        return all(x == val for buf in stage[s] for x in buf)

    def producer():
        if iters == 0:
            return
        kv.arrive(1, expect_tx=2)
        kv.complete_tx(2)
        for it in range(iters):
            s, n = it % stages, it // stages
            yield lambda s=s, n=n: empty[s].done((n & 1) ^ 1)
            full[s].arrive(1, expect_tx=2)
            landing.append([rng.randint(0, 4), s, ("Q", it), full[s], 2])
            yield lambda: True
            lbuf[s] = ("L", it)
            full[s].arrive(32)

    def writer():
        for it in range(iters):
            s = it % stages
            yield lambda s=s, it=it: dqfull[s].done((it // stages) & 1)
            assert every(s, ("dQ", it)), "the writer reduces a stage without the whole dQ tile"
            reducing.append([rng.randint(0, 6), it, s])
            if wait_read:
                yield lambda: not reducing
            empty[s].arrive(1)
        yield lambda: not reducing

    def consumer(cw):
        if iters == 0:
            return
        yield lambda: kv.done(0)
        for it in range(iters):
            s, n = it % stages, it // stages
            yield lambda s=s, n=n: full[s].done(n & 1)
            assert every(s, ("Q", it)) and lbuf[s] == ("L", it)
            yield lambda: True                      # S^T, dP^T (every region of Q / dO), P^T, dS^T
            assert every(s, ("Q", it)), "a stage rewritten under S^T / dP^T"
            b = it % ds_buffers
            dsb[b][cw] = it
            yield named.sync()
            assert dsb[b] == [it, it]
            yield lambda: True                      # dV, dQ read both P^T / dS^T halves, dV its dO region
            assert dsb[b] == [it, it], "a P^T / dS^T half rewritten under the other's wgmmas"
            assert stage[s][1][cw] == ("Q", it), "the dO buffer rewritten under dV"
            if not bulk:
                yield lambda: True                  # dK
                assert stage[s][0][cw] == ("Q", it)
                empty[s].arrive(4)
                continue
            assert not any(x[2] == s for x in reducing)
            if mode == "bulkw2":                    # its own regions, after its own dV, then its own dK
                stage[s][1][cw] = ("dQ", it)
                yield lambda: True
                assert stage[s][0][cw] == ("Q", it), "the Q buffer rewritten under dK"
                stage[s][0][cw] = ("dQ", it)
            elif cw == 0:                           # after wait<1>: dV, dQ done
                if meet:
                    yield named_dq.sync()           # (warpgroup 1's dV done too)
                stage[s][1] = [("dQ", it), ("dQ", it)]   # its 128 columns fill the dO buffer, under dK
                yield lambda: True
                assert stage[s][0][cw] == ("Q", it), "the Q buffer rewritten under dK"
                if meet:
                    named_dq2.sync()                # (arrive: its dK done)
            else:
                if meet:
                    named_dq.sync()                 # (arrive: its dV done)
                yield lambda: True
                assert stage[s][0][cw] == ("Q", it), "the Q buffer rewritten under dK"
                if meet:
                    yield named_dq2.sync()          # (warpgroup 0's dK done too)
                stage[s][0] = [("dQ", it), ("dQ", it)]
            dqfull[s].arrive(4)

    actors = [producer(), consumer(0), consumer(1)] + ([writer()] if bulk and iters else [])
    conds = [lambda: True] * len(actors)
    live = [True] * len(actors)
    steps = 0
    while any(live) or landing or reducing:
        steps += 1
        assert steps < 100000
        for x in reducing:
            assert every(x[2], ("dQ", x[1])), "a stage changed under the dQ reduction"
            x[0] -= 1
        reducing[:] = [x for x in reducing if x[0] >= 0]
        for x in landing:
            x[0] -= 1
        for x in [x for x in landing if x[0] < 0]:
            landing.remove(x)
            _, st, val, bar, nbytes = x
            stage[st] = [[val, val], [val, val]]
            bar.complete_tx(nbytes)
        ready = [i for i in range(len(actors)) if live[i] and conds[i]()]
        if not ready:
            assert landing or reducing or not any(live), "deadlock: every warpgroup waits and no copy is in flight"
            continue
        i = rng.choice(ready)
        try:
            conds[i] = next(actors[i])
        except StopIteration:
            live[i] = False


@pytest.mark.parametrize("mode", ["red", "bulkw", "bulkw2"])
@pytest.mark.parametrize("seed", range(20))
def test_synchronization_emulated_d256(mode, seed):
    rng = random.Random(3000 + seed)
    _emulate256(rng.choice([0, 1, 2, 3, 5, 9, 16]), seed, mode=mode)


@pytest.mark.parametrize("what", ["meet", "wait_read", "wait_read2", "ds_buffers"])
def test_emulation_d256_catches_a_missing_wait(what):
    """bwd_ws256 bulkw without the kBarDQ / kBarDQ2 meetings (a warpgroup stores its dQ half into a stage buffer
    the other's dV / dK still reads), bulkw / bulkw2 without the writer's wait_group.read (the producer refills a
    stage under the reduction), or red with one P^T / dS^T buffer."""
    kw = {"ds_buffers": 1, "mode": "red"} if what == "ds_buffers" else \
        {"wait_read": False, "mode": "bulkw2"} if what == "wait_read2" else {what: False}
    with pytest.raises(AssertionError):
        for seed in range(300):
            _emulate256(12, seed, **kw)


SPILL_OK = {"_ZN5pydnn8attn_wsb6bwd_wsINS_6bf16_tELi64ELi4ELi2EEEv10AttnParamsNS0_4MapsE": 44,
            # (d 64 bulkw: 28 bytes before session 33's exponentials' loop, 44 after: the prologue's values across the
            # setmaxnreg, ~6 LDL a tile from L1 in the consumers; not a default mode) bulkwpp1 at d 64: its writer and
            # the ping-pong's tile coordinates, 1 STL + 2 LDL a tile in the consumers
            "_ZN5pydnn8attn_wsb6bwd_wsINS_6bf16_tELi64ELi7ELi2EEEv10AttnParamsNS0_4MapsE": 20,
            # (its probes, bwd_ws_var, the same)
            **{f"_ZN5pydnn8attn_wsb10bwd_ws_varINS_6bf16_tELi64ELi7ELi2ELi{v}EEEv10AttnParamsNS0_4MapsE": 20
               for v in (1, 2, 4)},
            # l2pf (kVarL2Pf): the next item's coordinates under the producer's 24 registers (its spills are the
            # producer's, after the setmaxnreg; the consumers' as their default kernels')
            "_ZN5pydnn8attn_wsb10bwd_ws_varINS_6bf16_tELi64ELi7ELi2ELi8EEEv10AttnParamsNS0_4MapsE": 32,
            "_ZN5pydnn8attn_wsb10bwd_ws_varINS_6bf16_tELi128ELi7ELi2ELi8EEEv10AttnParamsNS0_4MapsE": 12,
            "_ZN5pydnn8attn_wsb10bwd_ws_varINS_6bf16_tELi128ELi5ELi2ELi8EEEv10AttnParamsNS0_4MapsE": 12,
            # bwd_ws256 bulkw: the writer's walk under the producer's 24 registers (as bwd_ws's writer at d 64)
            "_ZN5pydnn8attn_wsb9bwd_ws256INS_6bf16_tELi4EEEv10AttnParamsNS0_4MapsE": 12,
            "_ZN5pydnn8attn_wsb9bwd_ws256INS_6bf16_tELi6EEEv10AttnParamsNS0_4MapsE": 12}


@pytest.mark.parametrize("unit", WSB.kernel_units(), ids=[u.name for u in WSB.kernel_units()])
def test_units_compile_without_spills(unit):
    """sm_90a, ptxas -v: no spills but SPILL_OK's (the producer's 24 registers and the consumers' 240: ptxas
    allocates each side of setmaxnreg with its own budget), no wgmma serialization (C7514 / C7520), setmaxnreg honoured
    (C7508 / C7510), 168 registers at entry (__launch_bounds__(384, 1))."""
    from pydnn._build import cache
    from pydnn._build.manifest import COMMON_OPTIONS
    from pydnn._cuda import nvrtc
    try:
        nvrtc.version()
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"NVRTC unavailable: {e}")
    text, _ = cache.unit_inputs(unit)
    cubin, lowered, log = nvrtc.compile_cubin(text, unit.source, unit.exprs, "sm_90a",
                                              COMMON_OPTIONS + ("--ptxas-options=-v",), [str(cache.ptx_dir())],
                                              unit=unit.name)
    assert cubin[:4] == b"\x7fELF" and set(lowered) == set(unit.exprs)
    log = log.decode() if isinstance(log, bytes) else log
    for code in ("C7514", "C7520", "C7508", "C7510"):
        assert code not in log, log
    spills = [ln for ln in log.splitlines() if "bytes spill stores" in ln and "warning" not in ln]
    assert len(spills) == len(unit.exprs), log
    # bytes of spill stores by kernel: ptxas -v prints each function's properties line before its spill line
    lines = log.splitlines()
    for i, ln in enumerate(lines):
        if "bytes spill stores" in ln and "warning" not in ln:
            fn = lines[i - 1].split("Function properties for ")[-1].strip()
            got = int(ln.split("bytes spill stores")[0].split(",")[-1])
            assert got <= SPILL_OK.get(fn.replace("half_t", "bf16_t"), 0), f"{fn}: {got} bytes spilled\n{log}"
    assert log.count("Used 168 registers") == len(unit.exprs), log


# ----------------------------------------------------------------------------- the tiling, emulated in numpy

def _emulate_bwd_ws(q, k, v, do, lse, dsum, scale, mask):
    """bwd_ws's walk in float64 numpy, CTA by CTA as the kernel's index math has it (key blocks of 128,
    the first query tile of a causal block, the group heads x query tiles, TMA's zero rows past the
    tensor, lse +inf / dsum 0 past len_q, the masks, the dQ tile's rows that exist added to the fp32
    accumulator, dK scaled, dQ scaled afterwards as bwd_dq_convert does) -> dQ, dK, dV."""
    import numpy as np
    b, hq, sq, d = q.shape
    hkv, skv = k.shape[1], k.shape[2]
    group = hq // hkv
    bm, bn = WSB.query_rows(d), WSB.keys(d)  # (d 256: bwd_ws256's 64-key blocks)
    log2e = 1.4426950408889634
    causal = mask != NONE
    offset = skv - sq if mask == BR else 0
    dq_acc = np.zeros((b, hq, sq, d))
    dk, dv = np.zeros_like(k), np.zeros_like(v)

    def rows(x, r0, n):  # n rows from r0, zeros past the tensor (TMA's out-of-bounds fill)
        out = np.zeros((n,) + x.shape[1:])
        m = max(0, min(n, x.shape[0] - r0))
        out[:m] = x[r0:r0 + m]
        return out

    for bi in range(b):
        for hk in range(hkv):
            for bx in range(-(-skv // bn)):
                n0 = bx * bn
                i_first = max(0, n0 - offset) if causal and n0 < skv else 0
                mt0 = i_first // bm
                mtiles = -(-sq // bm) - mt0 if (n0 < skv and i_first < sq) else 0
                kt, vt = rows(k[bi, hk], n0, bn), rows(v[bi, hk], n0, bn)
                keys = n0 + np.arange(bn)
                adk, adv = np.zeros((bn, d)), np.zeros((bn, d))
                for it in range(mtiles * group):
                    h, m0 = hk * group + it // mtiles, (mt0 + it % mtiles) * bm
                    qt, dot = rows(q[bi, h], m0, bm), rows(do[bi, h], m0, bm)
                    qi = m0 + np.arange(bm)
                    lv = np.array([lse[bi, h, i] * log2e if i < sq and lse[bi, h, i] > -np.inf else np.inf for i in qi])
                    dd = np.array([dsum[bi, h, i] if i < sq else 0.0 for i in qi])
                    st = kt @ qt.T                                    # S^T: keys x queries
                    hide = (keys[:, None] >= skv) | (causal & (keys[:, None] > qi[None, :] + offset))
                    st = np.where(hide, -np.inf, st)
                    pt = np.exp2(st * scale * log2e - lv[None, :])
                    dpt = vt @ dot.T
                    dst = pt * (dpt - dd[None, :])
                    adv += pt @ dot
                    adk += dst @ qt
                    dqt = dst.T @ kt                                  # dQ tile: queries x d
                    nr = min(bm, sq - m0)
                    dq_acc[bi, h, m0:m0 + nr] += dqt[:nr]
                live = min(bn, skv - n0)
                dk[bi, hk, n0:n0 + live] = adk[:live] * scale
                dv[bi, hk, n0:n0 + live] = adv[:live]
    return dq_acc * scale, dk, dv


@pytest.mark.parametrize("mask", [NONE, TL, BR], ids=["none", "tl", "br"])
@pytest.mark.parametrize("case", [(1, 4, 2, 150, 200, 64), (1, 2, 1, 200, 97, 128), (2, 2, 2, 130, 300, 64),
                                  (1, 4, 4, 64, 129, 128), (1, 4, 2, 150, 200, 256), (2, 2, 1, 200, 97, 256),
                                  (1, 2, 2, 33, 31, 256)], ids=lambda c: "x".join(map(str, c)))
def test_tiling_emulated_matches_the_reference(mask, case):
    """The emulated walk (every key block, query tile and group head the kernel's bounds give) sums to the
    float64 reference's gradients: no tile skipped or taken twice, causal starts, partial tiles, GQA."""
    import numpy as np
    from pydnn.reference import attention as R
    b, hq, hkv, sq, skv, d = case
    rng = np.random.default_rng(sum(case) + mask)
    q, do = (rng.uniform(-2, 2, (b, hq, sq, d)) for _ in range(2))
    k, v = (rng.uniform(-2, 2, (b, hkv, skv, d)) for _ in range(2))
    scale = d ** -0.5
    o, lse = R.forward(q, k, v, scale, mask)[:2]
    dsum = (do * o).sum(axis=-1)
    got = _emulate_bwd_ws(q, k, v, do, lse, dsum, scale, mask)
    want = R.backward(q, k, v, do, scale, mask)[:3]
    for g, w, name in zip(got, want, ("dQ", "dK", "dV")):
        np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-9, err_msg=name)


@pytest.mark.parametrize("det", [0, 1])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_default_dispatch_takes_this_kernel(launches, monkeypatch, d, det):
    """With the defaults (measured faster than bwd_dkdv_wg on the H200: HEAD_DIMS, HEAD_DIMS_DET), an sm_90
    d 64 / 128 backward without lengths or dropout runs bwd_ws (dQ by bulk tensor reductions with the ping-pong and
    one dQ tile, WS_DQ's default bulkwpp1; under a causal mask WS_DQ_CAUSAL's bulkwpp, at d 64 its one-tile form
    bulkwpp1), as the ordered 1-d grid (WS_ORDER) with 2 stages."""
    monkeypatch.setattr(WSB, "maps", lambda tag, d, p, mode="none": WSB.Maps())
    assert tuning.attention_bwd.WS and tuning.attention_bwd.WS_DQ == "bulkwpp1"
    assert tuning.attention_bwd.WS_DQ_CAUSAL == "bulkwpp" and tuning.attention_bwd.WS_ORDER
    assert tuning.attention_bwd.WS_STAGES == 2
    assert d in WSB.HEAD_DIMS and d in WSB.HEAD_DIMS_DET
    for mask in (NONE, TL, BR):
        del launches[:]
        _bwd(d=d, det=det, mask=mask)
        mode = "none" if det else "bulkwpp1" if mask == NONE or d == 64 else "bulkwpp"  # (d 64: bulkwpp does not fit)
        mode = tuning.attention_bwd.WS_DQ_D256 if d == 256 and not det else mode  # (d 256: bwd_ws256)
        assert d != 256 or mode in WSB.D256_MODES
        assert launches[1]["f"] == WSB._expr("bf16", d, mode)
        nx = 9 if d == 256 else 5
        assert launches[1]["grid"] == (nx * 2 * 2, 1, 1) and launches[1]["smem"] == WSB.smem_bytes(d, 2, mode)
