"""Head dims 96 / 256 and the split-KV decode forward on the CPU: NOT_SUPPORTED / BAD_PARAM messages, the
forward workspace size (decode partials) and its plan (split counts that fill the SMs), the launches the
dispatch makes (recorded, not run), the kernels' shared memory, NVRTC compilation of every new
instantiation for sm_80 and sm_90a (with ptxas' spill report), and a numpy emulation of the decode
kernels' split / merge / combine arithmetic (the kernel's tiles, warps, row mapping and masks) against the
float64 reference."""
import math

import numpy as np
import pytest

import pydnn
from pydnn import tuning
from pydnn._cuda import driver
from pydnn.ops import attention as A
from pydnn.ops import attention_wgmma as W
from pydnn.ops import attention_wgmma_bwd as WB
from pydnn.reference import attention as R
from test_attention_cpu import BAD, BF16, BR, F16, F32, NOINIT, NONE, NS, TL, _attn, _bwd_args, _check, _fwd_args, _t
from test_fuzz_cpu import cpu_handle

SMEM_LIMIT = 227 * 1024  # sm_90's opt-in maximum per block (sm_80: 163 KiB)
SM80_LIMIT = 163 * 1024


# ----------------------------------------------------------------------------- messages

@pytest.mark.parametrize("d", [32, 80, 160, 512])
def test_unsupported_head_dims_name_the_supported_ones(d):
    a = _attn(4, 2, d)
    q, k = _t((2, 4, 33, d)), _t((2, 2, 17, d))
    _check(pydnn.attention_forward, _fwd_args(a=a, q=q, k=k, v=_t((2, 2, 17, d)), o=_t((2, 4, 33, d))), NS,
           f"attention_forward: attnDesc: headDim {d} is not supported (fused attention has (64, 96, 128, 256))")
    over = dict(a=a, q=q, k=k, v=_t((2, 2, 17, d)), o=_t((2, 4, 33, d)), do=_t((2, 4, 33, d)), dq=_t((2, 4, 33, d)),
                dk=_t((2, 2, 17, d)), dv=_t((2, 2, 17, d)))
    _check(pydnn.attention_backward, _bwd_args(**over), NS, f"headDim {d} is not supported")


def _over(d, sq=33, skv=17, dtype=BF16, **kw):
    a = kw.pop("a", None) or _attn(4, 2, d)
    kw.setdefault("st", _t((2, 4, sq, 1), F32))
    return dict(a=a, q=_t((2, 4, sq, d), dtype), k=_t((2, 2, skv, d), dtype), v=_t((2, 2, skv, d), dtype),
                o=_t((2, 4, sq, d), dtype), **kw)


@pytest.mark.parametrize("d", [96, 256])
def test_new_head_dims_reach_the_kernel_lookup(d):
    _check(pydnn.attention_forward, _fwd_args(**_over(d)), NOINIT, "")
    _check(pydnn.attention_forward, _fwd_args(**_over(d, dtype=F16)), NOINIT, "")
    _check(pydnn.attention_forward, _fwd_args(**_over(d, a=_attn(4, 2, d, p=0.1, seed=5))), NOINIT, "")
    _check(pydnn.attention_forward, _fwd_args(**_over(d, sq=1, skv=5000)), NOINIT, "")  # decode
    b = dict(_over(d, st=_t((2, 4, 33, 1), F32)), do=_t((2, 4, 33, d)), dq=_t((2, 4, 33, d)), dk=_t((2, 2, 17, d)), dv=_t((2, 2, 17, d)))
    _check(pydnn.attention_backward, _bwd_args(**b), NOINIT, "")
    _check(pydnn.attention_backward, _bwd_args(det=0, ws=2 * 4 * 33 * 4 * (d + 1), **b), NOINIT, "")
    _check(pydnn.attention_backward, _bwd_args(det=0, ws=2 * 4 * 33 * 4 * (d + 1) - 16, **b), BAD,
           f"workSpaceSizeInBytes: {2 * 4 * 33 * 4 * (d + 1) - 16} is less than the {1056 + 2 * 4 * 33 * 4 * d} bytes")
    _check(pydnn.attention_forward, _fwd_args(**_over(d), ptrs=dict(q=0)), pydnn.PYDNN_STATUS_BAD_PARAM_NULL_POINTER,
           "q: NULL")


def test_decode_forward_validation():
    """The decode forward takes the same arguments as the regular one: its own checks are the workspace's."""
    f = pydnn.attention_forward
    kw = _over(128, sq=1, skv=8192)
    _check(f, _fwd_args(**kw, ws=(None, -1)), BAD, "workSpaceSizeInBytes: -1 is less than the 0 bytes")
    n = pydnn.get_attention_forward_workspace_size(cpu_handle(), kw["a"], kw["q"], kw["k"])
    assert n > 0
    _check(f, _fwd_args(**kw, ws=(0, n)), pydnn.PYDNN_STATUS_BAD_PARAM_NULL_POINTER, "workSpace: NULL")
    _check(f, _fwd_args(**kw, ws=((1 << 40) + 8, n)), pydnn.PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER,
           "workSpace: 0x10000000008 is not 16-byte aligned")
    _check(f, _fwd_args(**kw, ws=(1 << 40, n)), NOINIT, "")
    _check(f, _fwd_args(**kw, ws=(None, 0)), NOINIT, "")  # no workspace: one split, nothing to check


# ----------------------------------------------------------------------------- workspace and plan

def _ws(hq, hkv, d, sq, skv, b=2, mask=NONE, p=0.0):
    a = _attn(hq, hkv, d, mask=mask, p=p)
    return pydnn.get_attention_forward_workspace_size(cpu_handle(), a, _t((b, hq, sq, d)), _t((b, hkv, skv, d)))


def test_forward_workspace_sizes():
    assert _ws(4, 2, 64, 33, 17) == 0                       # regular forward: none
    assert _ws(4, 2, 64, 17, 8192) == 0                     # more rows than DECODE_MAX_SQ
    assert _ws(4, 2, 64, 1, 100) == 0                       # decode, one split: none
    assert _ws(4, 2, 64, 1, 8192, mask=TL) == 0             # top-left causal: the first key only
    assert _ws(4, 2, 64, 1, 8192, p=0.1) == 0               # dropout: the regular forward
    for d in A.HEAD_DIMS:
        pl = A.decode_plan(132, 2, 4, 2, 1, 8192, d, NONE)
        assert pl.splits > 1
        rows = 2 * 4 * 1
        assert _ws(4, 2, d, 1, 8192) == pl.ws == rows * pl.splits * d * 4 + (rows * pl.splits * 4 + 15) // 16 * 16
    with tuning.override({"attention.DECODE": False}):
        assert _ws(4, 2, 64, 1, 8192) == 0
    with tuning.override({"attention.DECODE_SPLITS": 5}):
        assert _ws(4, 2, 64, 3, 8192, mask=BR) == 2 * 4 * 3 * 5 * (64 + 1) * 4
    with tuning.override({"attention.DECODE_MAX_SQ": 32}):
        assert _ws(4, 2, 64, 17, 8192) > 0


@pytest.mark.parametrize("b,hq,hkv,sq,skv", [
    (1, 32, 8, 1, 4096), (1, 32, 8, 1, 131072), (4, 32, 8, 1, 32768), (64, 32, 8, 1, 4096),
    (1, 64, 64, 1, 65536), (1, 128, 8, 4, 16384), (2, 8, 1, 16, 4096), (1, 8, 8, 1, 100), (3, 6, 2, 5, 777)])
@pytest.mark.parametrize("d", A.HEAD_DIMS)
def test_decode_plan_fills_the_gpu(b, hq, hkv, sq, skv, d):
    sms = 132
    pl = A.decode_plan(sms, b, hq, hkv, sq, skv, d, NONE)
    tiles = math.ceil(skv / A.DEC_N)
    assert pl.rblocks == math.ceil(hq // hkv * sq / 16)
    assert pl.split_len % A.DEC_N == 0
    assert (pl.splits - 1) * pl.split_len < skv <= pl.splits * pl.split_len  # every split has keys
    assert pl.splits == 1 or pl.split_len >= A.DEC_MIN_TILES * A.DEC_N
    ctas = pl.splits * b * hkv * pl.rblocks
    if tiles >= A.DEC_MIN_TILES * sms:  # keys enough to fill every SM: a single sequence does (D = 256,
        assert ctas >= 0.9 * sms       # one CTA an SM: 16 splits of 8 heads, 128 CTAs, is a whole wave)
    per_sm = min(2, (227 * 1024) // (A.smem_bytes("dec", d) + 1024))
    # at most ~4 waves of per_sm CTAs an SM (split_cost: whole waves, fewer splits on a tie)
    assert ctas <= 4 * per_sm * sms + b * hkv * pl.rblocks or pl.splits == 1
    assert pl.ws == A.decode_ws(b * hq * sq, pl.splits, d)
    # a smaller workspace: the largest count that fits
    if pl.splits > 2:
        lim = A.decode_ws(b * hq * sq, pl.splits - 1, d)
        assert A.decode_plan(sms, b, hq, hkv, sq, skv, d, NONE, lim).ws <= lim
        assert A.decode_plan(sms, b, hq, hkv, sq, skv, d, NONE, 0).splits == 1


def test_decode_plan_single_sequence_long_kv():
    pl = A.decode_plan(132, 1, 32, 8, 1, 131072, 128, NONE)
    assert pl.splits * 8 >= 0.9 * 132 and pl.splits <= A.DEC_MAX_SPLITS  # ~one CTA an SM (16 x 8 = 128)
    pl = A.decode_plan(132, 64, 32, 8, 1, 4096, 128, NONE)  # 512 CTAs without splitting
    assert pl.splits == 1 and pl.ws == 0


# ----------------------------------------------------------------------------- dispatch (recorded)

class _Recorded(dict):
    def get(self, key, default=None):
        return key[1]


@pytest.fixture
def launches(monkeypatch):
    got = []

    def rec(f, grid, block, smem, stream, p):
        got.append(dict(f=f, grid=grid, threads=block[0], smem=smem, splits=p.splits, split_len=p.split_len,
                        part_o=p.part_o, part_lse=p.part_lse))
    monkeypatch.setattr(driver, "launch", rec)
    # (the decode forward launches through launch_args: its params struct is argv[2])
    monkeypatch.setattr(driver, "launch_args", lambda f, grid, block, smem, stream, argv: rec(
        f, grid, block, smem, stream, argv[2]))
    monkeypatch.setattr(driver, "function_set_max_dynamic_smem", lambda f, n: None)
    return got


def _run_fwd(args, arch="sm_90"):
    args = list(args)
    h = args[0]
    h.arch, h._funcs = arch, _Recorded()
    pydnn.attention_forward(*args)


def _short(f):
    return f.split("<")[0].split("::")[-1] + f[f.index("<"):]


def test_decode_dispatch(launches):
    kw = _over(128, sq=1, skv=8192)
    n = pydnn.get_attention_forward_workspace_size(cpu_handle(), kw["a"], kw["q"], kw["k"])
    pl = A.decode_plan(132, 2, 4, 2, 1, 8192, 128, NONE)
    _run_fwd(_fwd_args(**kw, ws=(1 << 40, n)))
    assert [_short(x["f"]) for x in launches] == ["dec<pydnn::bf16_t, 128>", "dec_combine<pydnn::bf16_t, 128>"]
    dec, comb = launches
    assert dec["grid"] == (pl.splits, 2 * 1, 2) and dec["threads"] == 128 and dec["smem"] == A.smem_bytes("dec", 128)
    assert dec["splits"] == pl.splits > 1 and dec["split_len"] == pl.split_len
    assert dec["part_o"] == 1 << 40 and dec["part_lse"] == (1 << 40) + 2 * 4 * pl.splits * 128 * 4
    assert comb["grid"] == (2 * 4 * 1, 1, 1) and comb["smem"] == 0  # one CTA per query row


def test_decode_dispatch_without_workspace(launches):
    _run_fwd(_fwd_args(**_over(128, sq=1, skv=8192)))  # ws (None, 0): one split, no combine
    assert [_short(x["f"]) for x in launches] == ["dec<pydnn::bf16_t, 128>"]
    assert launches[0]["grid"] == (1, 2, 2) and launches[0]["splits"] == 1 and launches[0]["split_len"] >= 8192


def test_decode_dispatch_gqa_rows(launches):
    # 16 query heads on 2 K/V heads, 3 query rows: 8 x 3 = 24 rows per K/V head -> 2 blocks of 16
    a = _attn(16, 2, 64, mask=BR)
    kw = dict(a=a, q=_t((1, 16, 3, 64)), k=_t((1, 2, 9000, 64)), v=_t((1, 2, 9000, 64)), o=_t((1, 16, 3, 64)))
    with tuning.override({"attention.DECODE_SPLITS": 7}):
        n = pydnn.get_attention_forward_workspace_size(cpu_handle(), a, kw["q"], kw["k"])
        assert n == A.decode_ws(16 * 3, 7, 64)
        _run_fwd(_fwd_args(**kw, st=_t((1, 16, 3, 1), F32), ws=(1 << 40, n)))
    assert launches[0]["grid"] == (7, 2 * 2, 1) and launches[0]["split_len"] == math.ceil(141 / 7) * 64


@pytest.mark.parametrize("why", ["dropout", "long", "switch"])
def test_decode_not_taken(launches, why):
    a = _attn(4, 2, 64, p=0.1, seed=1) if why == "dropout" else _attn(4, 2, 64)
    sq = 17 if why == "long" else 1
    kw = _over(64, sq=sq, skv=8192, a=a)
    with tuning.override({"attention.DECODE": why != "switch"}):
        _run_fwd(_fwd_args(**kw))
    assert not any("dec" in x["f"] for x in launches)


@pytest.mark.parametrize("d", [96, 256])
def test_new_head_dims_forward_on_sm90_is_wgmma(launches, monkeypatch, d):
    monkeypatch.setattr(tuning.attention, "WS", False)  # (d 256: the warp-specialized one otherwise, test_attention_ws_cpu)
    _run_fwd(_fwd_args(**_over(d, sq=300, skv=17)))
    (fwd,) = launches
    assert fwd["f"] == W._expr("bf16", d, W.TILE[d]) and W.TILE[d][0] == (64 if d == 256 else 128)
    assert fwd["grid"] == (3, 4, 2) and fwd["threads"] == 256 and fwd["smem"] == W.smem_bytes(d, W.TILE[d])
    pad = 128 if d == 96 else d  # D = 96 in D = 128's tiles
    assert W.smem_bytes(d, W.TILE[d]) == (128 + 4 * W.TILE[d][0]) * pad * 2 + 1024 <= SMEM_LIMIT
    launches.clear()
    with tuning.override({"attention.ENABLED": False}):
        _run_fwd(_fwd_args(**_over(d, sq=300, skv=17)))
    n, nl = A.FWD_N[d]
    assert _short(launches[0]["f"]).startswith(f"fwd<pydnn::bf16_t, {d}, {n}, {nl}, false>")


def test_wgmma_units():
    units = {u.name: u for u in W.kernel_units()}
    assert sorted(units) == ["attention.wgmma.bf16", "attention.wgmma.d256.bf16", "attention.wgmma.d256.f16",
                             "attention.wgmma.d96.bf16", "attention.wgmma.d96.f16", "attention.wgmma.f16",
                             "attention.ws.bf16", "attention.ws.c3.bf16", "attention.ws.c3.f16",
                             "attention.ws.cl.bf16", "attention.ws.cl.f16", "attention.ws.d256.bf16", "attention.ws.d256.f16", "attention.ws.emu.bf16",
                             "attention.ws.emu.f16", "attention.ws.f16", "attention.ws.gh.bf16", "attention.ws.gh.f16",
                             "attention.ws.n176.bf16",
                             "attention.ws.n176.f16", "attention.ws.n192.bf16", "attention.ws.n192.f16",
                             "attention.ws.paged.bf16", "attention.ws.paged.f16", "attention.ws.q2.bf16",
                             "attention.ws.q2.f16", "attention.ws.rot.bf16", "attention.ws.rot.f16",
                             "attention.ws.xu.bf16", "attention.ws.xu.f16"]
    # (ws: test_attention_ws_cpu.py, _ws_q2_cpu.py; paged: test_attention_paged_cpu.py)
    for t in ("bf16", "f16"):
        for d in (96, 256):
            u = units[f"attention.wgmma.d{d}.{t}"]
            assert u.archs == ("sm_90a",) and set(u.exprs) == {W._expr(t, d, tile) for tile in W.TILES[d]}
        assert len(units[f"attention.wgmma.{t}"].exprs) == 4  # D 64 / 128 as before
    assert W.unit_name("bf16", 256) == "attention.wgmma.d256.bf16" and W.unit_name("f16", 128) == "attention.wgmma.f16"
    sm90 = type("H", (), {"arch": "sm_90"})()
    assert W.usable(sm90, 256, 0.0) and W.usable(sm90, 96, 0.0) and not W.usable(sm90, 96, 0.1)


@pytest.mark.parametrize("d", [96, 256])
def test_new_head_dims_dispatch(launches, d):
    _run_fwd(_fwd_args(**_over(d, sq=300, skv=17)), arch="sm_80")  # (sm_90 at D = 256: wgmma, above)
    (fwd,) = launches
    tile = A.FWD_N[d]
    assert _short(fwd["f"]) == f"fwd<pydnn::bf16_t, {d}, {tile[0]}, {tile[1]}, false>"
    assert fwd["grid"] == (math.ceil(300 / A.FWD_ROWS[d]), 4, 2) and fwd["smem"] == A.smem_bytes("fwd", d)
    launches.clear()
    args = list(_bwd_args(det=0, ws=2 * 4 * 33 * 4 * (d + 1), a=_attn(4, 2, d), q=_t((2, 4, 33, d)),
                          k=_t((2, 2, 200, d)), v=_t((2, 2, 200, d)), o=_t((2, 4, 33, d)), do=_t((2, 4, 33, d)),
                          dq=_t((2, 4, 33, d)), dk=_t((2, 2, 200, d)), dv=_t((2, 2, 200, d))))
    args[0].arch, args[0]._funcs = "sm_80", _Recorded()
    pydnn.attention_backward(*args)
    names = [_short(x["f"]) for x in launches]
    assert names == [f"bwd_pre_v<pydnn::bf16_t, {d}>", f"bwd_dkdv<pydnn::bf16_t, {d}, true, false>",
                     f"bwd_dq_convert_v<pydnn::bf16_t, {d}>"]
    assert launches[1]["grid"] == (math.ceil(200 / 64) * A.DSPLIT[d], 2, 2)
    assert launches[1]["smem"] == A.smem_bytes("bwd_dkdv", d, True)
    launches.clear()
    args[0].arch = "sm_90"  # D = 96: the wgmma dK / dV (D = 128's tiles); D = 256 stays on mma.sync
    pydnn.attention_backward(*args)
    names = [_short(x["f"]) for x in launches]
    if d == 96:
        assert names[1] == "bwd_dkdv_wg<pydnn::bf16_t, 96, true>"
        assert launches[1]["grid"] == (2, 2, 2) and launches[1]["smem"] == WB.smem_bytes(96) == WB.smem_bytes(128)
    else:
        assert names[1] == "bwd_dkdv<pydnn::bf16_t, 256, true, false>"


def test_unit_names():
    assert A.unit_name("fwd", 64, "bf16") == "attention.bf16"
    assert A.unit_name("bwd_dq", 96, "f16") == "attention.d96.f16"
    assert A.unit_name("bwd_dkdv", 256, "bf16") == "attention.d256.bf16"
    assert A.unit_name("bwd_dkdv", 256, "bf16", drop=True) == A.unit_name("fwd", 96, "bf16", True) == "attention.dropx.bf16"
    assert A.unit_name("fwd", 128, "bf16", True) == "attention.bf16"
    by_unit = {u.name: set(u.exprs) for u in A.kernel_units()}
    for d in (96, 256):
        for drop in (False, True):
            for k in ("fwd", "bwd_dq", "bwd_dkdv"):
                assert A._expr(k, "f16", d, A._targs(k, d, drop, True)) in by_unit[A.unit_name(k, d, "f16", drop)]
    assert A.unit_name("dec", 128, "bf16") == A.unit_name("dec_combine", 96, "bf16") == "attention.dec.bf16"
    exprs = {e for u in A.kernel_units() for e in u.exprs}
    for d in A.HEAD_DIMS:
        for t in ("bf16", "f16"):
            for k in ("dec", "dec_combine", "bwd_pre", "bwd_dq_convert"):
                assert A._expr(k, t, d) in exprs
            for k in ("bwd_pre_v", "bwd_dq_convert_v"):  # (ptx/attention_prep.cu, every head dim)
                assert A.prep_expr(k, t, d) in by_unit[A.prep_unit(t)]
            for drop in (False, True):
                assert A._expr("fwd", t, d, A._targs("fwd", d, drop)) in exprs
                assert A._expr("bwd_dq", t, d, A._targs("bwd_dq", d, drop)) in exprs
                for at in (False, True):
                    assert A._expr("bwd_dkdv", t, d, A._targs("bwd_dkdv", d, drop, at)) in exprs


# ----------------------------------------------------------------------------- shared memory

@pytest.mark.parametrize("d", A.HEAD_DIMS)
def test_smem_fits(d):
    sizes = {k: A.smem_bytes(k, d, at) for k, at in (("fwd", False), ("bwd_dq", False), ("bwd_dkdv", False),
                                                     ("bwd_dkdv", True), ("dec", False))}
    for k, n in sizes.items():
        assert n <= SM80_LIMIT, (k, n)  # every kernel also loads on sm_80
    pt = 128 if d == 96 else d
    assert A.smem_bytes("fwd", 256 if d == 256 else d) == (A.FWD_ROWS[d] + 4 * A.FWD_N[d][1]) * pt * 2
    assert A.smem_bytes("fwd", d) <= SMEM_LIMIT // 2  # two forward CTAs per SM at every head dim
    # the decode kernel's merge reuses its K/V ring: 2 x 64 floats of row stats + 4 warps x 16 rows x D floats
    ring = 2 * A.DEC_STAGES[d] * A.DEC_N * pt * 2
    assert ring >= 2 * 64 * 4 + 4 * 16 * d * 4
    assert A.smem_bytes("dec", d) == A.DEC_ROWS * pt * 2 + ring


# ----------------------------------------------------------------------------- NVRTC

NEW_UNITS = ([u for u in A.kernel_units() if not (u.name in ("attention.bf16", "attention.f16"))]
             + [u for u in W.kernel_units() + WB.kernel_units() if "d256" in u.name or "d96" in u.name])
# ptxas spills accepted, by kernel (bytes of spill stores): the decode kernel at D = 256 (O 128 + S + the
# row bookkeeping on the 255-register edge)
# (dec<T, D, PAGED = false, PIPE = false>: the plain kernel's name carries the default arguments)
SPILL_OK = {"_ZN5pydnn4attn3decINS_6bf16_tELi256ELb0ELb0EEEv10AttnParams": 16,
            "_ZN5pydnn4attn3decINS_6half_tELi256ELb0ELb0EEEv10AttnParams": 16}


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("unit", NEW_UNITS, ids=[u.name for u in NEW_UNITS])
def test_new_units_compile_without_spills(unit, arch):
    if unit.archs and arch not in unit.archs:
        pytest.skip(f"{unit.name} is built for {unit.archs} only")
    from pydnn._build import cache
    from pydnn._build.manifest import COMMON_OPTIONS
    from pydnn._cuda import nvrtc
    try:
        nvrtc.version()
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"NVRTC unavailable: {e}")
    text, _ = cache.unit_inputs(unit)
    cubin, lowered, log = nvrtc.compile_cubin(text, unit.source, unit.exprs, arch,
                                              COMMON_OPTIONS + ("--ptxas-options=-v",), [str(cache.ptx_dir())],
                                              unit=unit.name)
    assert cubin[:4] == b"\x7fELF" and set(lowered) == set(unit.exprs)
    log = log.decode() if isinstance(log, bytes) else log
    entry, spills = None, {}
    for line in log.splitlines():
        if "Compiling entry function" in line:
            entry = line.split("'")[1]
        elif "bytes spill stores" in line and "warning" not in line:
            n = int(line.split("bytes stack frame,")[1].split("bytes spill stores")[0])
            if n:
                spills[entry] = n
    for k, n in spills.items():
        assert n <= SPILL_OK.get(k, 0), (k, n, spills)


# ----------------------------------------------------------------------------- the decode math, emulated

LOG2E = 1.4426950408889634


def emulate_decode(q, k, v, scale, mask, group, pl, lens_q=None, lens_kv=None):
    """The decode kernels' arithmetic in float64: per (split, K/V head, row block, batch) CTA the 16 rows
    r = hh * Sq + i of the K/V head's group, 64-key tiles of the split's key range with 16 keys per warp,
    each warp's online softmax (log2 units, masks as the kernel's), the four warps merged, then (more than
    one split) the partials (O normalized by its own sum, lse natural) combined. Returns (O, lse)."""
    B, Hq, Sq, D = q.shape
    Skv = k.shape[2]
    rows = group * Sq
    splits, L = pl.splits, pl.split_len
    o = np.zeros(q.shape)
    lse = np.full((B, Hq, Sq), -np.inf)
    po = np.zeros((B, Hq, Sq, splits, D))
    plse = np.full((B, Hq, Sq, splits), -np.inf)
    kp = np.concatenate([k, np.zeros((B, k.shape[1], L * splits + 64, D))], axis=2)  # zero-filled rows
    vp = np.concatenate([v, np.zeros((B, k.shape[1], L * splits + 64, D))], axis=2)
    for b in range(B):
        len_q = Sq if lens_q is None else min(max(lens_q[b], 0), Sq)
        len_kv = Skv if lens_kv is None else min(max(lens_kv[b], 0), Skv)
        causal = mask != NONE
        offset = len_kv - len_q if mask == BR else 0
        n_all = min(len_kv, max(0, len_q + offset)) if causal else len_kv
        for hk in range(k.shape[1]):
            for rb in range(pl.rblocks):
                rr = rb * 16 + np.arange(16)
                hh, i = rr // Sq, rr % Sq
                ok = (rr < rows) & (i < len_q)
                qr = np.zeros((16, D))
                qr[ok] = q[b, hk * group + hh[ok], i[ok]]
                lim = i + offset if causal else np.full(16, 1 << 40)
                for sp in range(splits):
                    k0 = sp * L
                    k1 = min(k0 + L, n_all)
                    ntiles = (k1 - k0 + 63) // 64 if k1 > k0 else 0
                    ms, ls, os_ = [], [], []
                    for w in range(4):
                        m = np.full(16, -np.inf)
                        lsum = np.zeros(16)
                        acc = np.zeros((16, D))
                        for j in range(ntiles):
                            n0 = k0 + j * 64 + w * 16
                            cols = n0 + np.arange(16)
                            s = qr @ kp[b, hk, cols].T
                            hide = (cols[None, :] >= k1) | (cols[None, :] > lim[:, None])
                            s = np.where(hide, -np.inf, s)
                            mx = np.max(s, axis=1) * scale * LOG2E
                            m_new = np.maximum(m, mx)
                            m_use = np.where(m_new == -np.inf, 0.0, m_new)
                            corr = np.exp2(m - m_use)
                            p = np.exp2(s * scale * LOG2E - m_use[:, None])
                            lsum = lsum * corr + p.sum(axis=1)
                            acc = acc * corr[:, None] + p @ vp[b, hk, cols]
                            m = m_new
                        ms.append(m), ls.append(lsum), os_.append(acc)
                    ms, ls, os_ = np.array(ms), np.array(ls), np.array(os_)
                    M = ms.max(axis=0)
                    f = np.where(ms == -np.inf, 0.0, np.exp2(ms - np.where(M == -np.inf, 0.0, M)[None]))
                    lt = (ls * f).sum(axis=0)
                    acc = (os_ * f[:, :, None]).sum(axis=0)
                    live = ok & (lt > 0)
                    inv = np.where(live, 1.0 / np.where(lt > 0, lt, 1.0), 0.0)
                    lrow = np.where(live, M * math.log(2) + np.log(np.where(lt > 0, lt, 1.0)), -np.inf)
                    for r in range(16):
                        if rr[r] >= rows:
                            continue
                        h = hk * group + hh[r]
                        if splits == 1:
                            o[b, h, i[r]] = acc[r] * inv[r]
                            lse[b, h, i[r]] = lrow[r]
                        elif i[r] < len_q:
                            po[b, h, i[r], sp] = acc[r] * inv[r]
                            plse[b, h, i[r], sp] = lrow[r]
    if splits > 1:  # dec_combine
        for b in range(B):
            len_q = Sq if lens_q is None else min(max(lens_q[b], 0), Sq)
            for h in range(Hq):
                for i in range(Sq):
                    pl_ = plse[b, h, i]
                    mx = pl_.max() if i < len_q else -np.inf
                    if mx == -np.inf:
                        continue  # O = 0, lse = -inf
                    tot = mx + np.log(np.exp(pl_ - mx).sum())
                    lse[b, h, i] = tot
                    o[b, h, i] = (np.exp(pl_ - tot)[:, None] * po[b, h, i]).sum(axis=0)
    return o, lse


EMU_CASES = [  # b, hq, hkv, sq, skv, mask, lens_q, lens_kv, splits
    (1, 4, 1, 1, 700, NONE, None, None, None),
    (2, 8, 2, 1, 1000, NONE, None, [1000, 333], 3),
    (1, 6, 2, 5, 900, BR, None, None, 4),          # GQA, causal with Sq > 1 (bottom-right), 2 row blocks
    (2, 4, 4, 3, 520, TL, None, None, 2),          # top-left: the first keys only (splits clipped)
    (2, 16, 2, 3, 1300, BR, [3, 1], [1300, 64], 6),  # 24 rows per K/V head, lengths, empty splits
    (1, 2, 2, 2, 64, NONE, None, [0], 1),          # no key at all
]


@pytest.mark.parametrize("case", EMU_CASES, ids=[f"c{i}" for i in range(len(EMU_CASES))])
def test_emulated_decode_matches_the_reference(rng, case):
    b, hq, hkv, sq, skv, mask, lq, lkv, forced = case
    d = 16  # the arithmetic does not depend on D
    q, k, v = rng.standard_normal((b, hq, sq, d)), rng.standard_normal((b, hkv, skv, d)), rng.standard_normal((b, hkv, skv, d))
    scale = 0.4
    with tuning.override({"attention.DECODE_SPLITS": forced}):
        pl = A.decode_plan(8, b, hq, hkv, sq, skv, 64, mask)  # 8 SMs: automatic counts split too
    if forced:
        assert pl.splits == min(forced, pl.splits)
    o, lse = emulate_decode(q, k, v, scale, mask, hq // hkv, pl, lq, lkv)
    ro, rlse, _, _ = R.forward(q, k, v, scale, mask, lq, lkv)
    np.testing.assert_allclose(o, ro, rtol=1e-12, atol=1e-12)
    assert (np.isneginf(lse) == np.isneginf(rlse)).all()
    fin = np.isfinite(rlse)
    np.testing.assert_allclose(lse[fin], rlse[fin], rtol=1e-12)


def test_emulated_decode_uses_several_splits(rng):
    """The emulation really exercises the combine (the automatic plan splits a 1-row, 8-SM problem)."""
    pl = A.decode_plan(8, 1, 4, 1, 1, 700, 64, NONE)
    assert pl.splits == 2  # 11 tiles, at least 4 per split
    with tuning.override({"attention.DECODE_SPLITS": 3}):
        assert A.decode_plan(8, 1, 4, 1, 1, 700, 64, NONE).splits == 3
