"""The warp-specialized forward's wide K / V tiles (ptx/attention_ws.cu: BN = 176 at d 128, units
attention.ws.n176.*, tuning.attention.WS_BN176; BN = 192 at d 64, attention.ws.n192.*, WS_BN192) on the
CPU: the switches' dispatch (non-causal calls only under "noncausal", every call of the head dim under
True, nothing else), the launch's kernel and shared memory, and the units compiling for sm_90a without
spills (the d 128 TMA kernel with FA3's 24 / 240 registers)."""
import pytest

from pydnn import tuning
from pydnn.ops import attention as A
from pydnn.ops import attention_ws as WS
from test_attention_cpu import F32, NONE, TL, _attn, _fwd_args, _t
from test_attention_hdim_cpu import _run_fwd, launches  # noqa: F401 - the fixture
from test_attention_paged_cpu import _compile


def test_bn_of():
    p = A.AttnParams()
    assert WS.bn_of(128, p) == 128 and WS.bn_of(64, p) == 128  # default off
    with tuning.override({"attention.WS_BN176": "noncausal"}):
        assert WS.bn_of(128, p) == 176 and WS.bn_of(64, p) == 128 and WS.bn_of(256, p) == 64
        p.mask = TL
        assert WS.bn_of(128, p) == 128
    p.mask = NONE
    with tuning.override({"attention.WS_BN192": "noncausal"}):
        assert WS.bn_of(64, p) == 192 and WS.bn_of(128, p) == 128
    with tuning.override({"attention.WS_BN176": True, "attention.WS_BN192": True}):
        p.mask = TL
        assert WS.bn_of(128, p) == 176 and WS.bn_of(64, p) == 192
    assert WS.smem_bytes(128, 176) == (128 + 4 * 176) * 256 + 10 * 8 + 1024 == 214096 <= 232448
    assert WS.smem_bytes(64, 192) == (128 + 4 * 192) * 128 + 10 * 8 + 1024 <= 232448


@pytest.mark.parametrize("d,sw,mask,bn", [(128, "WS_BN176", NONE, 176), (128, "WS_BN176", TL, 128),
                                          (64, "WS_BN192", NONE, 192), (64, "WS_BN192", TL, 128)])
def test_dispatch(launches, monkeypatch, d, sw, mask, bn):
    monkeypatch.setattr(tuning.attention, "DECODE", False)
    with tuning.override({f"attention.{sw}": "noncausal"}):
        _run_fwd(_fwd_args(a=_attn(4, 2, d, mask=mask), q=_t((2, 4, 300, d)), k=_t((2, 2, 517, d)),
                           v=_t((2, 2, 517, d)), o=_t((2, 4, 300, d)), st=_t((2, 4, 300, 1), F32)))
    (f,) = launches
    qs = WS.q2_of(d, bn)  # (two Q buffers with 128-key tiles: the default since session 30)
    assert f["f"] == (WS._expr("bf16", d, bn=bn) if bn != 128 else WS._expr("bf16", d, qs=qs))
    assert f["smem"] == WS.smem_bytes(d, bn, qs) and f["threads"] == 384


@pytest.mark.parametrize("name,d,bn", [("attention.ws.n176.bf16", 128, 176), ("attention.ws.n192.bf16", 64, 192)])
def test_unit_compiles_without_spills(name, d, bn):
    (u,) = [u for u in WS.kernel_units() if u.name == name]
    assert u.exprs == (WS._expr("bf16", d, bn=bn), WS._expr("bf16", d, tma=True, bn=bn))
    log = _compile(u, "sm_90a")
    for code in ("C7514", "C7520", "C7508", "C7510"):
        assert code not in log, log
    spills = [ln for ln in log.splitlines() if "bytes spill stores" in ln and "warning" not in ln]
    assert len(spills) == 2 and all(" 0 bytes spill stores" in ln for ln in spills), log
    assert log.count("Used 168 registers") == 2, log
