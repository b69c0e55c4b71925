"""The warp-specialized Hopper attention forward (ptx/attention_ws.cu, pydnn/ops/attention_ws.py) on the
CPU: its units compile for sm_90a without spills; the dispatcher sends sm_90 d 128 calls without dropout
to it (one persistent launch) and everything else where it went before; the scheduler's unit order
(every unit once, longest causal row blocks first in a section, snake rounds); and an emulation of the
kernel's synchronization (producer / consumer mbarrier rings, the Q buffer, the ping-pong named barriers)
under random interleavings: no deadlock, no buffer overwritten before every reader released it."""
import random

import pytest

from pydnn import tuning
from pydnn.ops import attention as A
from pydnn.ops import attention_wgmma as W
from pydnn.ops import attention_ws as WS
from test_attention_cpu import BF16, F16, F32, NONE, TL, BR, _attn, _fwd_args, _t
from test_attention_hdim_cpu import _run_fwd, _short, launches  # noqa: F401 - the fixture

SMEM_LIMIT = 227 * 1024


# ----------------------------------------------------------------------------- units and dispatch

def test_units():
    units = {u.name: u for u in WS.kernel_units()}
    assert sorted(units) == ["attention.ws.bf16", "attention.ws.c3.bf16", "attention.ws.c3.f16",
                             "attention.ws.cl.bf16", "attention.ws.cl.f16", "attention.ws.d256.bf16", "attention.ws.d256.f16",
                             "attention.ws.emu.bf16", "attention.ws.emu.f16", "attention.ws.f16",
                             "attention.ws.gh.bf16", "attention.ws.gh.f16",
                             "attention.ws.n176.bf16", "attention.ws.n176.f16", "attention.ws.n192.bf16",
                             "attention.ws.n192.f16", "attention.ws.paged.bf16", "attention.ws.paged.f16",
                             "attention.ws.q2.bf16", "attention.ws.q2.f16", "attention.ws.rot.bf16",
                             "attention.ws.rot.f16", "attention.ws.xu.bf16", "attention.ws.xu.f16"]
    # (paged, n176, q2 / emu / rot / c3: test_attention_paged_cpu, _ws_n176_cpu, _ws_q2_cpu)
    for t in ("bf16", "f16"):
        u = units[f"attention.ws.{t}"]
        assert u.archs == ("sm_90a",) and u.source == "attention_ws.cu"
        assert u.exprs[:2] == tuple(WS._expr(t, d) for d in WS.INSTANTIATED)
        assert u.exprs[2:] == (((WS._expr(t, 128, False),) if t == "bf16" else ())
                               + (WS._expr(t, 64, tma=True), WS._expr(t, 128, tma=True)))
        assert WS._expr(t, 128, tma=True).startswith("pydnn::attn_ws::fwd_ws_tma<")
        assert units[f"attention.ws.d256.{t}"].exprs == (WS._expr(t, 256), WS._expr(t, 256, tma=True))
        assert WS._expr(t, 256).endswith(", 256, 64, 2, true>")
    assert {u.name for u in WS.kernel_units()} <= {u.name for u in W.kernel_units()}  # registered via W
    for d in WS.INSTANTIATED + (256,):
        assert WS.smem_bytes(d) <= SMEM_LIMIT
    assert WS.smem_bytes(128) == (128 + 4 * 128) * 128 * 2 + 10 * 8 + 1024 == 164944
    assert WS.smem_bytes(256) == (128 + 4 * 64) * 256 * 2 + 10 * 8 + 1024 == 197712
    stages = WS.STAGES
    try:
        WS.STAGES = WS.STAGES3
        assert WS.smem_bytes(128) == (128 + 6 * 128) * 128 * 2 + 14 * 8 + 1024 == 230512 <= 232448
    finally:
        WS.STAGES = stages


def sw128(rows, r, ch):
    """wgmma.cuh sw128<ROWS>: element offset of 16-byte chunk ch of row r in the 128B-swizzled tile."""
    return (ch >> 3) * (rows * 64) + r * 64 + (((ch & 7) ^ (r & 7)) << 3)


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("rows", [64, 128])
def test_copy_tile_mapping(d, rows):
    """attention_ws.cu copy_tile's thread -> (row, chunk) map and its constant address steps, emulated:
    every 16-byte chunk of the tile written once, at sw128's place, from its row and column."""
    nt, ch = 128, d // 8
    tpr = min(ch, 16)
    per, rs = ch // tpr, nt // tpr
    n = rows // rs
    seen = {}
    for tid in range(nt):
        r0, c = divmod(tid, tpr)
        dst = 2 * sw128(rows, r0, c)           # bytes
        src = r0 * d + c * 8                   # elements of a dense [rows][d] source
        for i in range(n):
            for k in range(per):
                byte = dst + k * (rows * 64 * 2) * 2
                el = src + k * 128
                row, col = divmod(el, d)
                assert byte == 2 * sw128(rows, row, col // 8), (tid, i, k)
                assert byte not in seen
                seen[byte] = (row, col)
            src += rs * d
            dst += rs * 128
    assert len(seen) == rows * ch


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "f16"])
@pytest.mark.parametrize("mask", [NONE, TL, BR], ids=["none", "tl", "br"])
def test_dispatch_d128_sm90(launches, dtype, mask):
    a = _attn(4, 2, 128, mask=mask)
    _run_fwd(_fwd_args(a=a, q=_t((2, 4, 300, 128), dtype), k=_t((2, 2, 517, 128), dtype),
                       v=_t((2, 2, 517, 128), dtype), o=_t((2, 4, 300, 128), dtype), st=_t((2, 4, 300, 1), F32)))
    (f,) = launches
    tag = "bf16" if dtype == BF16 else "f16"
    qs = WS.q2_of(128, 128)  # (the default: two Q buffers since session 30)
    assert f["f"] == WS._expr(tag, 128, qs=qs) == WS.pick(tag, 128, A.AttnParams(), False)[1]
    assert f["grid"] == (2 * 4 * 3, 1, 1) and f["threads"] == 384 and f["smem"] == WS.smem_bytes(128, qs=qs)


def test_dispatch_grid_is_persistent(launches):
    # 2 x 4 heads x 32 row blocks = 256 units > 132 SMs: one CTA an SM
    _run_fwd(_fwd_args(a=_attn(4, 2, 128), q=_t((2, 4, 4096, 128)), k=_t((2, 2, 4096, 128)), v=_t((2, 2, 4096, 128)),
                       o=_t((2, 4, 4096, 128)), st=_t((2, 4, 4096, 1), F32)))
    (f,) = launches
    assert f["grid"] == (132, 1, 1)


@pytest.mark.parametrize("d", [64, 256])
def test_dispatch_d64_d256(launches, d):
    _run_fwd(_fwd_args(a=_attn(4, 2, d), q=_t((2, 4, 300, d)), k=_t((2, 2, 517, d)), v=_t((2, 2, 517, d)),
                       o=_t((2, 4, 300, d)), st=_t((2, 4, 300, 1), F32)))
    (f,) = launches  # (the TMA try needs the driver: on the CPU the cp.async variant)
    qs = WS.q2_of(d, WS.BN[d])
    assert f["f"] == WS._expr("bf16", d, qs=qs) and f["grid"] == (2 * 4 * 3, 1, 1)
    assert f["smem"] == WS.smem_bytes(d, qs=qs)


@pytest.mark.parametrize("why", ["ws_off", "d96", "dropout", "sm_80", "disabled"])
def test_dispatch_elsewhere(launches, monkeypatch, why):
    d = 96 if why == "d96" else 128
    a = _attn(4, 2, d, p=0.1, seed=3) if why == "dropout" else _attn(4, 2, d)
    if why == "ws_off":
        monkeypatch.setattr(tuning.attention, "WS", False)
    if why == "disabled":
        monkeypatch.setattr(tuning.attention, "ENABLED", False)
    _run_fwd(_fwd_args(a=a, q=_t((2, 4, 300, d)), k=_t((2, 2, 517, d)), v=_t((2, 2, 517, d)), o=_t((2, 4, 300, d)),
                       st=_t((2, 4, 300, 1), F32)), arch="sm_80" if why == "sm_80" else "sm_90")
    (f,) = launches
    assert "attn_ws" not in f["f"]
    if why in ("ws_off", "d96"):
        assert f["f"] == W._expr("bf16", d, W.TILE[d])


def test_sched_heads():
    l2 = 50 << 20
    # K + V of one head at 8192 keys, d 128: 4 MiB; half of L2 holds 6 of them; GQA 8 shares them
    assert WS.sched_heads(l2, 8192, 128, 1) == 6
    assert WS.sched_heads(l2, 8192, 128, 8) == 50
    assert WS.sched_heads(l2, 1 << 24, 128, 1) == 1
    # with the row blocks and the grid: whole pairs of snake rounds, 2 x 132 / gcd(nmb, 264) pairs a
    # multiple: 33 at 8 / 16 / 64 row blocks (rounded down from 50 / 200; up from 25, half again at most)
    assert WS.sched_heads(l2, 1024, 128, 1, 8, 132) == 33
    assert WS.sched_heads(l2, 2048, 128, 8, 16, 132) == 198
    assert WS.sched_heads(l2, 2048, 128, 1, 16, 132) == 33
    assert WS.sched_heads(l2, 8192, 128, 1, 64, 132) == 6  # (33 > 1.5 x 6: the L2 bound wins)
    assert WS.sched_heads(l2, 300, 128, 5, 5, 132) % 264 == 0


# ----------------------------------------------------------------------------- the scheduler

def unit_of(u, nmb, nheads, hs, hq):
    """attention_ws.cu unit_of: (mb, b, h)."""
    per = nmb * hs
    sec, r = divmod(u, per)
    nh = min(hs, nheads - sec * hs)
    mb = nmb - 1 - r // nh
    hh = sec * hs + r % nh
    return mb, hh // hq, hh % hq


def units_of_cta(bid, grid, total):
    """attention_ws.cu unit_at over the rounds: the CTA's units in order."""
    out = []
    for r in range((total + grid - 1) // grid):
        u = r * grid + (grid - 1 - bid if r & 1 else bid)
        if u < total:
            out.append(u)
    return out


@pytest.mark.parametrize("b,hq,nmb,grp,bound", [(1, 64, 64, 8, 1.003), (16, 32, 8, 1, 1.025), (16, 64, 8, 1, 1.03),
                                               (8, 64, 16, 1, 1.002), (4, 32, 32, 8, 1.007), (2, 32, 64, 1, 1.011)])
def test_launch_schedule_balance(b, hq, nmb, grp, bound):
    """The launch's sections (sched_heads with the row blocks and the grid) on the issue's sweep shapes
    (B * S = 16384, causal, 132 CTAs): the busiest CTA within `bound` of the mean (emulated)."""
    nheads, total, grid = b * hq, nmb * b * hq, 132
    hs = max(1, min(WS.sched_heads(50 << 20, nmb * 128, 128, grp, nmb, grid), nheads))
    work = [sum(unit_of(u, nmb, nheads, hs, hq)[0] + 1 for u in units_of_cta(bid, grid, total)) for bid in range(grid)]
    assert max(work) / (sum(work) / grid) < bound


@pytest.mark.parametrize("b,hq,nmb,hs,grid", [(2, 20, 8, 1, 132), (2, 20, 8, 3, 132), (1, 3, 5, 7, 4),
                                               (4, 32, 64, 6, 132), (1, 1, 1, 1, 1), (3, 5, 7, 2, 10)])
def test_schedule_covers_every_unit_once(b, hq, nmb, hs, grid):
    nheads = b * hq
    hs = max(1, min(hs, nheads))
    total = nmb * nheads
    grid = min(grid, total)
    seen = [unit_of(u, nmb, nheads, hs, hq) for bid in range(grid) for u in units_of_cta(bid, grid, total)]
    assert sorted(seen) == sorted((mb, bb, h) for mb in range(nmb) for bb in range(b) for h in range(hq))
    # within a section the row blocks descend (longest causal work first), heads fastest
    order = [unit_of(u, nmb, nheads, hs, hq) for u in range(total)]
    for s0 in range(0, total, nmb * hs):
        sec = order[s0:s0 + nmb * hs]
        assert [x[0] for x in sec] == sorted((x[0] for x in sec), reverse=True)
        heads = {x[1] * hq + x[2] for x in sec}
        assert len(heads) == min(hs, nheads - s0 // nmb) and max(heads) - min(heads) == len(heads) - 1


def test_snake_balances_causal_work():
    """Causal work per CTA (row block mb costs mb + 1 key tiles) with the snake order against plain
    round robin, GQA 64 / 8 at 8192 rows on 132 CTAs: the busiest CTA 1.9% over the mean (plain 4.8%);
    a section boundary inside a round is what is left (a static order's limit: a dynamic scheduler
    would need a per-launch counter)."""
    b, hq, nmb, grid = 1, 64, 64, 132
    nheads, total = b * hq, nmb * b * hq
    hs = WS.sched_heads(50 << 20, 8192, 128, 8)
    work = [sum(unit_of(u, nmb, nheads, hs, hq)[0] + 1 for u in units_of_cta(bid, grid, total)) for bid in range(grid)]
    plain = [sum(unit_of(u, nmb, nheads, hs, hq)[0] + 1 for u in range(bid, total, grid)) for bid in range(grid)]
    mean = sum(work) / grid
    assert sum(plain) == sum(work)
    assert max(work) / mean < 1.02 and max(plain) / mean > 1.04


# ----------------------------------------------------------------------------- the synchronization, emulated

class _Mbar:
    def __init__(self, count):
        self.count, self.pending, self.phase = count, count, 0

    def arrive(self, n=1):
        self.pending -= n
        assert self.pending >= 0, "more arrivals than the barrier's count"
        if self.pending == 0:
            self.phase += 1
            self.pending = self.count

    def done(self, parity):  # mbarrier.try_wait.parity
        return (self.phase & 1) != parity


def _emulate(units, stages, seed):
    """One CTA: the producer warpgroup and the two consumer warpgroups of fwd_ws as generators that yield
    a wait condition, run in a random interleaving. units: [nt per unit] (0: no key tile). Copies land
    after a random delay (cp.async arrive-on). Checks every buffer a consumer reads holds what it expects
    until it releases it, and that everything finishes."""
    rng = random.Random(seed)
    kfull = [_Mbar(128) for _ in range(stages)]
    vfull = [_Mbar(128) for _ in range(stages)]
    kempty = [_Mbar(8) for _ in range(stages)]
    vempty = [_Mbar(8) for _ in range(stages)]
    qfull, qempty = _Mbar(128), _Mbar(8)
    kbuf, vbuf, qbuf = [None] * stages, [None] * stages, [None]
    turn = [0, 0]   # pending bar.arrive counts on named barriers 1, 2 (one per arriving warpgroup)
    landing = []    # (time left, buffer list, index, value, barrier)

    def copy(buf, i, val, bar):
        landing.append([rng.randint(0, 3), buf, i, val, bar])

    def producer():
        kc = tc = 0
        for ui, nt in enumerate(units):
            if nt == 0:
                continue
            for j in range(nt + 1):
                if j < nt:
                    c = kc + j
                    s = c % stages
                    yield lambda s=s, c=c: kempty[s].done(((c // stages) & 1) ^ 1)
                    copy(kbuf, s, ("K", ui, j), kfull[s])
                if j == 0:
                    yield lambda tc=tc: qempty.done((tc & 1) ^ 1)
                    copy(qbuf, 0, ("Q", ui), qfull)
                if j > 0:
                    c = kc + j - 1
                    s = c % stages
                    yield lambda s=s, c=c: vempty[s].done(((c // stages) & 1) ^ 1)
                    copy(vbuf, s, ("V", ui, j - 1), vfull[s])
            kc += nt
            tc += 1

    def consumer(cw):
        def sync_turn():
            yield lambda: turn[cw] > 0
            turn[cw] -= 1

        def arrive_other():
            turn[cw ^ 1] += 1

        if cw == 1:
            turn[0] += 1
        kc = tc = 0
        for ui, nt in enumerate(units):
            if nt == 0:
                continue
            yield lambda tc=tc: qfull.done(tc & 1)
            assert qbuf[0] == ("Q", ui)
            for j in range(nt):
                c = kc + j
                sc, sp = c % stages, (c - 1) % stages
                yield lambda sc=sc, c=c: kfull[sc].done((c // stages) & 1)
                if j > 0:
                    yield lambda sp=sp, c=c: vfull[sp].done(((c - 1) // stages) & 1)
                yield from sync_turn()
                assert kbuf[sc] == ("K", ui, j) and qbuf[0] == ("Q", ui)
                if j > 0:
                    assert vbuf[sp] == ("V", ui, j - 1)
                arrive_other()
                yield lambda: True  # the wgmmas run
                assert kbuf[sc] == ("K", ui, j)
                kempty[sc].arrive(4)
                if j > 0:
                    yield lambda: True
                    assert vbuf[sp] == ("V", ui, j - 1)
                    vempty[sp].arrive(4)
            c = kc + nt - 1
            sc = c % stages
            yield lambda sc=sc, c=c: vfull[sc].done((c // stages) & 1)
            yield from sync_turn()
            arrive_other()
            yield lambda: True
            assert vbuf[sc] == ("V", ui, nt - 1) and qbuf[0] == ("Q", ui)  # (the epilogue stages O in sQ)
            vempty[sc].arrive(4)
            kc += nt
            tc += 1
            yield lambda: True
            assert qbuf[0] == ("Q", ui)
            qempty.arrive(4)

    actors = [producer(), consumer(0), consumer(1)]
    conds = [lambda: True] * 3
    live = [True] * 3
    steps = 0
    while any(live) or landing:
        steps += 1
        assert steps < 100000
        for x in landing:
            x[0] -= 1
        for x in [x for x in landing if x[0] < 0]:
            landing.remove(x)
            _, buf, i, val, bar = x
            buf[i] = val
            bar.arrive(128)
        ready = [i for i in range(3) if live[i] and conds[i]()]
        if not ready:
            assert landing, "deadlock: every warpgroup waits and no copy is in flight"
            continue
        i = rng.choice(ready)
        try:
            conds[i] = next(actors[i])
        except StopIteration:
            live[i] = False


@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("seed", range(12))
def test_synchronization_emulated(stages, seed):
    rng = random.Random(1000 + seed)
    units = [rng.choice([0, 1, 1, 2, 3, 5, 8]) for _ in range(rng.randint(1, 7))]
    _emulate(units, stages, seed)


def test_emulation_catches_a_missing_release():
    """The emulation can fail: a producer that skips the empty-barrier wait overwrites a K buffer that a
    consumer still reads (or deadlocks), and the emulation reports it."""
    real = _Mbar.done
    try:
        _Mbar.done = lambda self, parity: True if self.count == 8 else real(self, parity)
        with pytest.raises(AssertionError):
            for seed in range(20):
                _emulate([6, 6, 6], 2, seed)
    finally:
        _Mbar.done = real


# ----------------------------------------------------------------------------- NVRTC

_NOT_PAGED = [u for u in WS.kernel_units()  # (paged: test_attention_paged_cpu; gh: test_attention_ws_gh_cpu)
              if not u.name.startswith(("attention.ws.paged.", "attention.ws.gh."))]


@pytest.mark.parametrize("unit", _NOT_PAGED, ids=[u.name for u in _NOT_PAGED])
def test_units_compile_without_spills(unit):
    """sm_90a, ptxas -v: no spills (the producer's 32 registers and the consumers' 232 included: ptxas
    allocates each side of setmaxnreg with its own budget), no wgmma serialization (C7514 / C7520), and
    setmaxnreg not ignored (C7508: the entry's register count must be known, __launch_bounds__(384, 1))."""
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
    assert len(spills) == len(unit.exprs) and all(" 0 bytes spill stores" in ln for ln in spills), log
    regs = "Used 128 registers" if ".c3." in unit.name else "Used 168 registers"  # (c3: 512 threads)
    assert log.count(regs) == len(unit.exprs), log


# ----------------------------------------------------------------------------- the GPU tests' dispatch

def _gpu_cases():
    import test_attention_ws_gpu as G
    return G.CASES


@pytest.mark.parametrize("mask", [NONE, TL, BR], ids=["none", "tl", "br"])
@pytest.mark.parametrize("case", _gpu_cases(), ids=lambda c: f"{c[0]}x{c[1]}/{c[2]}x{c[3]}x{c[4]}d{c[5]}{c[6]}")
def test_gpu_cases_take_this_kernel(launches, monkeypatch, mask, case):
    """Each case of test_attention_ws_gpu.py, with its fixture's switches, reaches fwd_ws (one launch,
    the grid of its units) on a recorded sm_90 handle: what that test asserts, checked here first."""
    monkeypatch.setattr(tuning.attention, "ENABLED", True)
    monkeypatch.setattr(tuning.attention, "WS", True)
    monkeypatch.setattr(tuning.attention, "DECODE", False)
    monkeypatch.setattr(WS, "HEAD_DIMS", (64, 128, 256))
    b, hq, hkv, sq, skv, d, layout = case
    _run_fwd(_fwd_args(a=_attn(hq, hkv, d, mask=mask), q=_t((b, hq, sq, d), layout=layout),
                       k=_t((b, hkv, skv, d), layout=layout), v=_t((b, hkv, skv, d), layout=layout),
                       o=_t((b, hq, sq, d), layout=layout), st=_t((b, hq, sq, 1), F32)))
    (f,) = launches
    qs = WS.q2_of(d, WS.BN[d])
    assert f["f"] == WS._expr("bf16", d, qs=qs) and f["threads"] == 384 and f["smem"] == WS.smem_bytes(d, qs=qs)
    assert f["grid"] == (min(132, b * hq * -(-sq // 128)), 1, 1)


def test_tma_not_taken_without_the_switch_or_with_key_lengths(launches, monkeypatch):
    """WS_TMA off, or per-batch key lengths: the cp.async producer (fwd_ws). With the switch on (the
    default) and no lengths the call encodes tensor maps, which needs the driver: on the CPU the encode
    fails and the launch falls back to fwd_ws, which is what is recorded here."""
    kw = dict(a=_attn(4, 2, 128), q=_t((2, 4, 300, 128)), k=_t((2, 2, 517, 128)), v=_t((2, 2, 517, 128)),
              o=_t((2, 4, 300, 128)), st=_t((2, 4, 300, 1), F32))
    _run_fwd(_fwd_args(**kw))
    assert launches[-1]["f"] == WS._expr("bf16", 128, qs=WS.q2_of(128, 128))
    assert tuning.attention.WS_TMA
    p = A.AttnParams()
    p.lens_kv = 1 << 30
    assert not WS.takes_tma(128, p) and not WS.takes_tma(96, A.AttnParams())
    assert all(WS.takes_tma(d, A.AttnParams()) for d in (64, 128, 256))
    monkeypatch.setattr(tuning.attention, "WS_TMA", False)
    assert not WS.takes_tma(128, A.AttnParams())
