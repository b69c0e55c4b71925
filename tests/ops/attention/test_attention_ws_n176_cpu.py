"""The warp-specialized forward's 176-key tiles at d 128 (ptx/attention_ws.cu BN = 176, units
attention.ws.n176.*, tuning.attention.WS_BN176) on the CPU: the switch's dispatch (non-causal calls only
under "noncausal", every d 128 call under True, nothing else), the launch's kernel and shared memory, and
the unit compiling for sm_90a without spills (the TMA kernel with FA3's 24 / 240 registers)."""
import pytest

from pydnn import tuning
from pydnn.ops import attention as A
from pydnn.ops import attention_ws as WS
from test_attention_cpu import F32, NONE, TL, _attn, _fwd_args, _t
from test_attention_hdim_cpu import _run_fwd, launches  # noqa: F401 - the fixture
from test_attention_paged_cpu import _compile


def test_bn_of():
    p = A.AttnParams()
    assert WS.bn_of(128, p) == 128  # default off
    with tuning.override({"attention.WS_BN176": "noncausal"}):
        assert WS.bn_of(128, p) == 176 and WS.bn_of(64, p) == 128 and WS.bn_of(256, p) == 64
        p.mask = TL
        assert WS.bn_of(128, p) == 128
    with tuning.override({"attention.WS_BN176": True}):
        assert WS.bn_of(128, p) == 176
    assert WS.smem_bytes(128, 176) == (128 + 4 * 176) * 256 + 10 * 8 + 1024 == 214096 <= 232448


@pytest.mark.parametrize("mask,bn", [(NONE, 176), (TL, 128)])
def test_dispatch(launches, monkeypatch, mask, bn):
    monkeypatch.setattr(tuning.attention, "DECODE", False)
    with tuning.override({"attention.WS_BN176": "noncausal"}):
        _run_fwd(_fwd_args(a=_attn(4, 2, 128, mask=mask), q=_t((2, 4, 300, 128)), k=_t((2, 2, 517, 128)),
                           v=_t((2, 2, 517, 128)), o=_t((2, 4, 300, 128)), st=_t((2, 4, 300, 1), F32)))
    (f,) = launches
    assert f["f"] == (WS._expr("bf16", 128, bn=176) if bn == 176 else WS._expr("bf16", 128))
    assert f["smem"] == WS.smem_bytes(128, bn) and f["threads"] == 384


def test_unit_compiles_without_spills():
    (u,) = [u for u in WS.kernel_units() if u.name == "attention.ws.n176.bf16"]
    assert u.exprs == (WS._expr("bf16", 128, bn=176), WS._expr("bf16", 128, tma=True, bn=176))
    log = _compile(u, "sm_90a")
    for code in ("C7514", "C7520", "C7508", "C7510"):
        assert code not in log, log
    spills = [ln for ln in log.splitlines() if "bytes spill stores" in ln and "warning" not in ln]
    assert len(spills) == 2 and all(" 0 bytes spill stores" in ln for ln in spills), log
    assert log.count("Used 168 registers") == 2, log
