"""The warp-specialized forward's two Q buffers (ptx/attention_ws.cu QS = 2, units attention.ws.q2.*,
tuning.attention.WS_Q2), rotated key order (ROT, attention.ws.rot.*, WS_ROT), three consumer warpgroups at d 64 (NC = 3,
attention.ws.c3.*, WS_C3) and polynomial exponentials (EMU, units attention.ws.emu.*, WS_EMU) on the CPU: the
switches' dispatch (128-key tiles at d 64 / 128 only; EMU only where instantiated and with TMA), the
launch's kernel and shared memory, exp2_poly's arithmetic emulated in float32, and the units compiling for
sm_90a without spills."""
import random

import numpy as np
import pytest

from pydnn import tuning
from pydnn.ops import attention as A
from pydnn.ops import attention_ws as WS
from test_attention_cpu import F32, NONE, TL, _attn, _fwd_args, _t
from test_attention_hdim_cpu import _run_fwd, launches  # noqa: F401 - the fixture
from test_attention_paged_cpu import _compile

SMEM_LIMIT = 227 * 1024


def test_q2_of_and_emu_of():
    assert tuning.attention.WS_Q2 and tuning.attention.WS_EMU == {64: 2}  # the defaults (session 30's mid run)
    assert WS.emu_of(64, 2) == 2 and WS.emu_of(128, 2) == 0
    with tuning.override({"attention.WS_Q2": False}):
        assert WS.q2_of(128, 128) == 1 and WS.q2_of(64, 128) == 1
    with tuning.override({"attention.WS_Q2": True}):
        assert WS.q2_of(128, 128) == 2 and WS.q2_of(64, 128) == 2
        assert WS.q2_of(256, 64) == 1 and WS.q2_of(128, 176) == 1 and WS.q2_of(64, 192) == 1
    with tuning.override({"attention.WS_EMU": 0}):
        assert WS.emu_of(64, 2) == 0
    with tuning.override({"attention.WS_EMU": 2}):
        assert WS.emu_of(64, 2) == 2 and WS.emu_of(128, 2) == 2 and WS.emu_of(64, 1) == 0 and WS.emu_of(256, 2) == 0
    with tuning.override({"attention.WS_EMU": 3}):
        assert WS.emu_of(64, 2) == 3 and WS.emu_of(128, 2) == 0  # (3: d 64 only)
    with tuning.override({"attention.WS_EMU": {64: 3}}):
        assert WS.emu_of(64, 2) == 3 and WS.emu_of(128, 2) == 0


def test_cl_of_and_grid():
    p = A.AttnParams()
    assert not WS.cl_of(128, 2, p)  # (default off)
    with tuning.override({"attention.WS_CL": True}):
        assert WS.cl_of(128, 2, p) and WS.cl_of(64, 2, p) and not WS.cl_of(128, 1, p) and not WS.cl_of(256, 2, p)
        p.mask = TL
        assert not WS.cl_of(128, 2, p)
        p.mask = NONE
        p.lens_q = 1 << 30
        assert not WS.cl_of(128, 2, p)

    class H:
        sm_count = 132
    assert WS.grid_size(H, 2, 4, 300, 128, 2) == 2 * 2 * 4 * 2
    assert WS.grid_size(H, 2, 4, 300) == 2 * 4 * 3
    assert WS.grid_size(H, 4, 32, 4096, 128, 2) == 132 and WS.grid_size(H, 1, 1, 100, 128, 2) == 2
    # the kernel's pairs: row blocks 2i, 2i + 1 of a unit i (an odd count: the last pair's second block empty)
    nmb = 3
    pairs = -(-nmb // 2)
    assert sorted(2 * i + r for i in range(pairs) for r in (0, 1)) == [0, 1, 2, 3] and pairs == 2


def test_c3_of():
    assert WS.c3_of(64, 2) == 3  # (the default since session 30's run 3 / 4)
    with tuning.override({"attention.WS_C3": False}):
        assert WS.c3_of(64, 2) == 2
    with tuning.override({"attention.WS_C3": True}):
        assert WS.c3_of(64, 2) == 3 and WS.c3_of(64, 1) == 2 and WS.c3_of(128, 2) == 2
    assert WS.smem_bytes(64, qs=2, bm=192) == (384 + 4 * 128) * 128 + 12 * 8 + 1024 <= SMEM_LIMIT


def test_smem():
    assert WS.smem_bytes(128, qs=2) == (256 + 4 * 128) * 256 + 12 * 8 + 1024 == 197728 <= SMEM_LIMIT
    assert WS.smem_bytes(64, qs=2) == (256 + 4 * 128) * 128 + 12 * 8 + 1024 <= SMEM_LIMIT
    assert WS.smem_bytes(128) == 164944  # (one Q buffer: as before)


def test_units():
    units = {u.name: u for u in WS.kernel_units()}
    for t in ("bf16", "f16"):
        assert units[f"attention.ws.q2.{t}"].exprs == tuple(WS._expr(t, d, tma=m, qs=2) for d in (64, 128)
                                                             for m in (True, False))
        assert units[f"attention.ws.xu.{t}"].exprs == (WS._expr(t, 64, tma=True, qs=2, emu=2, xu=True),
                                                       WS._expr(t, 128, tma=True, qs=2, xu=True))
        assert units[f"attention.ws.cl.{t}"].exprs == (WS._cl_expr(t, 64), WS._cl_expr(t, 128))
        assert WS._cl_expr(t, 64).endswith(", 64, 128, 2, 2>") and WS._cl_expr(t, 128).endswith(", 128, 128, 2, 0>")
        assert units[f"attention.ws.c3.{t}"].exprs == (WS._expr(t, 64, tma=True, qs=2, nc=3),)
        assert units[f"attention.ws.rot.{t}"].exprs == tuple(WS._expr(t, d, tma=True, qs=2, rot=True)
                                                             for d in (64, 128))
        assert units[f"attention.ws.emu.{t}"].exprs == (WS._expr(t, 64, tma=True, qs=2, emu=2),
                                                        WS._expr(t, 64, tma=True, qs=2, emu=3),
                                                        WS._expr(t, 128, tma=True, qs=2, emu=2))
    assert WS._expr("bf16", 128, tma=True, qs=2, emu=2) == \
        "pydnn::attn_ws::fwd_ws_tma<pydnn::bf16_t, 128, 128, 2, true, 2, 2>"
    assert WS._expr("bf16", 128) == "pydnn::attn_ws::fwd_ws<pydnn::bf16_t, 128, 128, 2, true>"  # (as before)
    assert WS._expr("bf16", 64, tma=True, qs=2, nc=3) == \
        "pydnn::attn_ws::fwd_ws_tma<pydnn::bf16_t, 64, 128, 2, true, 2, 0, false, 3>"
    assert WS._expr("bf16", 64, qs=2) == "pydnn::attn_ws::fwd_ws<pydnn::bf16_t, 64, 128, 2, true, 2>"
    assert WS._expr("bf16", 128, tma=True, qs=2, xu=True) == \
        "pydnn::attn_ws::fwd_ws_tma<pydnn::bf16_t, 128, 128, 2, true, 2, 0, false, 2, true>"
    assert WS._expr("bf16", 64, tma=True, qs=2, rot=True) == \
        "pydnn::attn_ws::fwd_ws_tma<pydnn::bf16_t, 64, 128, 2, true, 2, 0, true>"


@pytest.mark.parametrize("d,over,mask,expr", [
    (128, {"attention.WS_Q2": True}, NONE, ("q2", 2, 0)),
    (64, {"attention.WS_Q2": True}, TL, ("q2", 2, 0)),
    (128, {"attention.WS_Q2": True, "attention.WS_BN176": True}, NONE, ("n176", 1, 0)),  # (wide tiles: one Q)
    (64, {"attention.WS_Q2": True, "attention.WS_EMU": 3}, NONE, ("emu", 2, 3)),
    (128, {"attention.WS_Q2": True, "attention.WS_EMU": 2}, TL, ("emu", 2, 2)),
    (128, {"attention.WS_EMU": 2}, NONE, ("ws", 1, 0)),  # (EMU without Q2: not instantiated)
    (256, {"attention.WS_Q2": True}, NONE, ("d256", 1, 0)),
    (128, {"attention.WS_Q2": True, "attention.WS_ROT": True}, NONE, ("rot", 2, 0)),
    (64, {"attention.WS_Q2": True, "attention.WS_ROT": True, "attention.WS_EMU": 2}, NONE, ("rot", 2, 0)),
    (128, {"attention.WS_Q2": True, "attention.WS_ROT": True}, TL, ("q2", 2, 0)),  # (causal: not rotated)
    (128, {"attention.WS_ROT": True}, NONE, ("ws", 1, 0)),
    (64, {"attention.WS_Q2": True, "attention.WS_C3": True}, NONE, ("c3", 2, 0)),
    (64, {"attention.WS_Q2": True, "attention.WS_C3": True, "attention.WS_EMU": 2}, TL, ("c3", 2, 0)),
    (128, {"attention.WS_Q2": True, "attention.WS_C3": True}, NONE, ("q2", 2, 0)),  # (d 64 only)
    (64, {"attention.WS_C3": True}, NONE, ("ws", 1, 0)),  # (with two Q buffers only)
    (128, {"attention.WS_Q2": True, "attention.WS_CL": True}, NONE, ("cl", 2, 0)),
    (64, {"attention.WS_Q2": True, "attention.WS_CL": True, "attention.WS_EMU": 2}, NONE, ("cl", 2, 2)),
    (64, {"attention.WS_Q2": True, "attention.WS_CL": True}, NONE, ("q2", 2, 0)),  # (EMU not CL_EMU's: no cluster)
    (128, {"attention.WS_Q2": True, "attention.WS_CL": True}, TL, ("q2", 2, 0)),  # (causal: no cluster)
    (128, {"attention.WS_Q2": True, "attention.WS_CL": True, "attention.WS_ROT": True}, NONE, ("cl", 2, 0)),
    (128, {"attention.WS_Q2": True, "attention.WS_XU": True}, TL, ("xu", 2, 0)),
    (64, {"attention.WS_Q2": True, "attention.WS_XU": True, "attention.WS_EMU": 2}, NONE, ("xu", 2, 2)),
    (64, {"attention.WS_Q2": True, "attention.WS_XU": True}, NONE, ("q2", 2, 0)),  # (EMU not 2 at d 64)
    (128, {"attention.WS_XU": True}, NONE, ("ws", 1, 0)),  # (one Q buffer: no)
])
@pytest.mark.parametrize("tma", [True, False], ids=["tma", "cp.async"])
def test_dispatch(launches, monkeypatch, d, over, mask, expr, tma):
    monkeypatch.setattr(tuning.attention, "DECODE", False)
    over = {"attention.WS_Q2": False, "attention.WS_EMU": 0, "attention.WS_C3": False, "attention.WS_GH": {},
            **over}  # (the row's switches on top of all off)
    monkeypatch.setattr(WS, "takes_tma", lambda d_, p: tma)
    monkeypatch.setattr(WS, "tma_maps", lambda *a, **k: WS.TmaMaps())
    monkeypatch.setattr(WS.driver, "_driver", lambda: type("D", (), {"cuLaunchKernel": staticmethod(
        lambda f, *a: launches.append({"f": f, "smem": a[6], "threads": a[3], "grid": a[0]}) or (0,))})())
    with tuning.override(over):
        _run_fwd(_fwd_args(a=_attn(4, 2, d, mask=mask), q=_t((2, 4, 300, d)), k=_t((2, 2, 517, d)),
                           v=_t((2, 2, 517, d)), o=_t((2, 4, 300, d)), st=_t((2, 4, 300, 1), F32)))
    (f,) = launches
    kind, qs, emu = expr
    bn = 176 if kind == "n176" else WS.BN[d]
    emu = emu if tma else 0
    if kind in ("rot", "c3", "cl", "xu") and not tma:  # (the cp.async producer: none of these; EMU neither)
        kind = "q2"
    nc = 3 if kind == "c3" else 2
    want = WS._expr("bf16", d, tma=tma, bn=None if bn == WS.BN[d] else bn, qs=qs, emu=emu, rot=kind == "rot", nc=nc,
                    xu=kind == "xu")
    if kind == "cl":
        want = WS._cl_expr("bf16", d)
        assert f["grid"] == 2 * min(2 * 4 * 2, 66)  # (2 x 4 heads x 2 pairs of row blocks)
    assert f["f"] == want
    bm = 192 if nc == 3 else 128
    assert f["smem"] == WS.smem_bytes(d, bn, qs, bm) and f["threads"] == (512 if nc == 3 else 384)


def _exp2_poly(x):
    """ptx/attention_ws.cu exp2_poly in float32, step by step (round to nearest, fmaf as float64 then
    rounded once: a float32 fma)."""
    f32 = np.float32
    x = np.maximum(x.astype(f32), f32(-126))
    t = (x + f32(12582912.0)).astype(f32)
    f = (x - (t - f32(12582912.0)).astype(f32)).astype(f32)

    def fma(a, b, c):
        return (np.float64(a) * np.float64(b) + np.float64(c)).astype(f32)
    p = fma(f32(0.0551716685295105), f, f32(0.24261115491390228))
    p = fma(p, f, f32(0.6932609677314758))
    p = fma(p, f, f32(0.9999280571937561))
    bits = (p.view(np.int32).astype(np.int64) + (t.view(np.int32).astype(np.int64) << 23)) & 0xFFFFFFFF
    return bits.astype(np.uint32).view(f32)


def test_exp2_poly_accuracy():
    x = np.concatenate([np.linspace(-30, 0, 300001), -np.random.default_rng(0).exponential(4, 100000),
                        [0.0, -0.5, -1.5, -125.0, -125.9]]).astype(np.float32)
    got = _exp2_poly(x).astype(np.float64)
    ref = np.exp2(x.astype(np.float64))
    assert np.all(np.abs(got / ref - 1) < 8e-5)  # (the fit: 7.5e-5; below f16's half ulp 2.4e-4)
    tiny = _exp2_poly(np.array([-200.0, -1e30], np.float32))  # clamped at -126: a denormal's worth, >= 0
    assert np.all(tiny >= 0) and np.all(tiny < 2e-38)


@pytest.mark.parametrize("name", ["attention.ws.q2.bf16", "attention.ws.emu.bf16", "attention.ws.rot.bf16",
                                  "attention.ws.c3.bf16", "attention.ws.cl.bf16", "attention.ws.xu.bf16",
                                  "attention.ws.q2.f16", "attention.ws.emu.f16", "attention.ws.rot.f16",
                                  "attention.ws.c3.f16", "attention.ws.cl.f16", "attention.ws.xu.f16"])
def test_unit_compiles_without_spills(name):
    (u,) = [u for u in WS.kernel_units() if u.name == name]
    log = _compile(u, "sm_90a")
    for code in ("C7514", "C7520", "C7508", "C7510"):
        assert code not in log, log
    spills = [ln for ln in log.splitlines() if "bytes spill stores" in ln and "warning" not in ln]
    assert len(spills) == len(u.exprs) and all(" 0 bytes spill stores" in ln for ln in spills), log
    assert log.count("Used 128 registers" if ".c3." in name else "Used 168 registers") == len(u.exprs), log


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("mask", [NONE, TL], ids=["none", "tl"])
def test_defaults(d, mask):
    """the default switches' kernels: two Q buffers at d 64 / 128; on the TMA path at d 64 three consumer
    warpgroups (192-row units) with ghost tiles and end-aligned blocks, at d 256 ghost tiles under a causal
    mask (session 31); without TMA two warpgroups"""
    p = A.AttnParams()
    p.mask = mask
    unit, expr, smem, threads, bm, cl = WS.pick("bf16", d, p, True)
    want = {64: ("attention.ws.gh.bf16", WS._expr("bf16", 64, tma=True, qs=2, nc=3, gh=True, al=True)),
            128: ("attention.ws.q2.bf16", WS._expr("bf16", 128, tma=True, qs=2)),
            256: ("attention.ws.d256.bf16", WS._expr("bf16", 256, tma=True)) if mask == NONE else
            ("attention.ws.gh.bf16", WS._expr("bf16", 256, tma=True, gh=True))}[d]
    assert (unit, expr) == want and threads == (512 if d == 64 else 384) and bm == (192 if d == 64 else 128)
    assert cl == 1 and smem == WS.smem_bytes(d, qs=1 if d == 256 else 2, bm=bm) <= SMEM_LIMIT
    unit, expr, smem, threads, bm, cl = WS.pick("f16", d, p, False)
    assert (unit, expr) == ((WS.unit_name("f16", 256), WS._expr("f16", 256)) if d == 256 else
                            ("attention.ws.q2.f16", WS._expr("f16", d, qs=2)))


# ----------------------------------------------------------------------------- the synchronization, emulated
# (test_attention_ws_cpu.py's emulation of the one-CTA kernel, widened to fwd_ws_body's QS Q buffers, NC
# consumer warpgroups taking turns round robin, and CL = 2: two CTAs whose producers each copy half of a K / V
# tile into both, full barriers with transaction counts, empty barriers counting both CTAs' consumers)

class _TxBar:
    """An mbarrier with a transaction count (mbarrier.arrive.expect_tx / complete_tx)."""

    def __init__(self, count):
        self.count, self.pending, self.tx, self.phase = count, count, 0, 0

    def _flip(self):
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count

    def arrive(self, n=1, expect=0):
        self.tx += expect
        self.pending -= n
        assert self.pending >= 0, "more arrivals than the barrier's count"
        self._flip()

    def complete(self, nbytes):
        self.tx -= nbytes  # (may run ahead of the expect: the phase waits for its arrival)
        self._flip()

    def done(self, parity):
        return (self.phase & 1) != parity


def _emulate_cl(units, cl, nc, qs, seed, stages=2, empty_count=None, xu=False):
    """units: key tiles per (cluster) unit, alike for the cluster's CTAs. Every K / V half lands after a
    random delay on the destination CTA's full barrier; a consumer checks both halves of what it reads
    until it releases them, and Q until its epilogue released it."""
    rng = random.Random(seed)
    ncw = 4 * nc
    full = [[[_TxBar(1) for _ in range(stages)] for _ in "KV"] for _ in range(cl)]   # [cta][K / V][stage]
    empty = [[[_TxBar(empty_count or ncw * cl) for _ in range(stages)] for _ in "KV"] for _ in range(cl)]
    qfull = [[_TxBar(1) for _ in range(qs)] for _ in range(cl)]
    qempty = [[_TxBar(ncw) for _ in range(qs)] for _ in range(cl)]
    buf = [[[[None] * cl for _ in range(stages)] for _ in "KV"] for _ in range(cl)]  # [cta][K/V][stage][half]
    qbuf = [[None] * qs for _ in range(cl)]
    turn = [[0] * nc for _ in range(cl)]
    landing = []  # [time left, store function, barrier, bytes]

    def land(store, bar, nbytes):
        landing.append([rng.randint(0, 4), store, bar, nbytes])

    def producer(r):
        kc = tc = 0
        for ui, nt in enumerate(units):
            if nt == 0:
                continue

            def load_q(tc=tc, ui=ui):
                b = tc % qs
                yield lambda: qempty[r][b].done(((tc // qs) & 1) ^ 1)
                qfull[r][b].arrive(1, expect=2)
                land(lambda: qbuf[r].__setitem__(b, ("Q", ui, r)), qfull[r][b], 2)
            if qs > 1:
                yield from load_q()
            for j in range(nt + 1):
                for kv, jj, go in ((0, j, j < nt), (1, j - 1, j > 0)):
                    if kv == 1 and j == 0 and qs == 1:
                        yield from load_q()
                    if not go:
                        continue
                    c = kc + jj
                    s = c % stages
                    yield lambda s=s, c=c, kv=kv: empty[r][kv][s].done(((c // stages) & 1) ^ 1)
                    full[r][kv][s].arrive(1, expect=2)  # (the whole tile: 2 units of bytes)
                    for dst in range(cl):  # this CTA's half (the whole tile when cl = 1) into every CTA
                        land(lambda dst=dst, kv=kv, s=s, jj=jj, ui=ui: buf[dst][kv][s].__setitem__(
                            r, ("KV"[kv], ui, jj)), full[dst][kv][s], 2 // cl)
            kc += nt
            tc += 1

    def consumer(r, cw):
        def sync_turn():
            yield lambda: turn[r][cw] > 0
            turn[r][cw] -= 1

        def arrive_next():
            turn[r][(cw + 1) % nc] += 1

        def release(kv, s):
            for dst in range(cl):
                empty[dst][kv][s].arrive(4)

        def check(kv, s, jj, ui):
            want = ("KV"[kv], ui, jj)
            assert buf[r][kv][s] == [want] * cl, (buf[r][kv][s], want)

        if cw == nc - 1:
            turn[r][0] += 1
        kc = tc = 0
        carry = False  # (xu) this unit's tile 0 issued in the previous unit's tail
        for ui, nt in enumerate(units):
            if nt == 0:
                continue
            b = tc % qs
            if not carry:
                yield lambda b=b, tc=tc: qfull[r][b].done((tc // qs) & 1)
            # xu: the next unit (the next in the list, when it sees a key) starts in this one's tail
            nxt = xu and ui + 1 < len(units) and units[ui + 1] > 0
            for j in range(1 if carry else 0, nt + 1):  # j = nt: the last P V (xu: with the next S_0)
                c = kc + j
                sc, sp = c % stages, (c - 1) % stages
                q2 = (tc + 1) % qs
                if j < nt or nxt:
                    yield lambda sc=sc, c=c: full[r][0][sc].done((c // stages) & 1)
                if j == nt and nxt:
                    yield lambda q2=q2, tc=tc: qfull[r][q2].done(((tc + 1) // qs) & 1)
                if j > 0:
                    yield lambda sp=sp, c=c: full[r][1][sp].done(((c - 1) // stages) & 1)
                yield from sync_turn()
                assert qbuf[r][b] == ("Q", ui, r)
                if j < nt:
                    check(0, sc, j, ui)
                elif nxt:
                    check(0, sc, 0, ui + 1)
                    assert qbuf[r][q2] == ("Q", ui + 1, r)
                if j > 0:
                    check(1, sp, j - 1, ui)
                arrive_next()
                yield lambda: True  # the wgmmas run
                if j < nt or nxt:
                    check(0, sc, j, ui) if j < nt else check(0, sc, 0, ui + 1)
                    release(0, sc)
                if j > 0:
                    yield lambda: True
                    check(1, sp, j - 1, ui)
                    release(1, sp)
            kc += nt
            tc += 1
            yield lambda: True  # the epilogue stages O in this unit's Q buffer
            assert qbuf[r][b] == ("Q", ui, r)
            qempty[r][b].arrive(4)
            carry = nxt

    actors = [producer(r) for r in range(cl)] + [consumer(r, cw) for r in range(cl) for cw in range(nc)]
    conds = [lambda: True] * len(actors)
    live = [True] * len(actors)
    steps = 0
    while any(live) or landing:
        steps += 1
        assert steps < 200000
        for x in landing:
            x[0] -= 1
        for x in [x for x in landing if x[0] < 0]:
            landing.remove(x)
            x[1]()
            x[2].complete(x[3])
        ready = [i for i in range(len(actors)) if live[i] and conds[i]()]
        if not ready:
            assert landing, "deadlock: every actor waits and no copy is in flight"
            continue
        i = rng.choice(ready)
        try:
            conds[i] = next(actors[i])
        except StopIteration:
            live[i] = False


@pytest.mark.parametrize("cl,nc,qs,xu", [(1, 2, 1, False), (1, 2, 2, False), (1, 3, 2, False), (2, 2, 2, False),
                                         (1, 2, 2, True)])
@pytest.mark.parametrize("seed", range(10))
def test_synchronization_emulated(cl, nc, qs, xu, seed):
    rng = random.Random(2000 + seed)
    units = [rng.choice([0, 1, 1, 2, 3, 5, 8]) for _ in range(rng.randint(1, 7))]
    _emulate_cl(units, cl, nc, qs, seed, xu=xu)


def test_cluster_emulation_catches_a_local_only_release():
    """The emulation can fail: empty barriers that count only their own CTA's consumers let a producer
    overwrite (multicast) a stage the peer's consumers still read, or deadlock."""
    with pytest.raises(AssertionError):
        for seed in range(30):
            _emulate_cl([8, 5, 3, 8], 2, 2, 2, seed, empty_count=8)
