"""The wgmma attention backward's host side on the CPU: its kernel units (sm_90a only), the shared-memory
sizes it asks for, and attention_backward's dispatch (which kernels it launches, on which grid, for
sm_90 / other archs, both dQ modes, dropout, the module switch), with the driver calls recorded instead
of run."""
import pytest

import pydnn
from pydnn import tuning
from pydnn._cuda import driver
from pydnn.ops import attention_wgmma_bwd as W
from test_attention_cpu import _attn, _bwd_args

SMEM_LIMIT = 227 * 1024  # sm_90's opt-in maximum per block


def test_units_are_sm90a_only():
    units = [u for u in W.kernel_units() if u.source == "attention_wgmma_bwd.cu"]  # (+ attention_ws_bwd's, own test)
    assert [u.name for u in units] == ["attention.wgmma_bwd.bf16", "attention.wgmma_bwd.f16",
                                       "attention.wgmma_bwd.d96.bf16", "attention.wgmma_bwd.d96.f16"]
    assert [u.name for u in W.kernel_units()][4:] == ["attention.ws_bwd.bf16", "attention.ws_bwd.f16"]
    for u in units:
        assert u.archs == ("sm_90a",) and u.source == "attention_wgmma_bwd.cu"
    # {D 64, 128} x {dK/dV atomic, plain, dQ}; D = 96 (D = 128's tiles, zero padding) in units of its own
    assert [len(set(u.exprs)) for u in units] == [6, 6, 3, 3]


@pytest.mark.parametrize("d", W.HEAD_DIMS)
def test_smem_fits(d):
    assert W.smem_bytes(d) <= SMEM_LIMIT and W.dq_smem_bytes(d) <= SMEM_LIMIT
    # Cfg<D> / CfgDq<D> in ptx/attention_wgmma_bwd.cu, spelled out
    bm = 64 if d > 64 else 128
    d = 128 if d == 96 else d  # D = 96 in D = 128's tiles
    assert W.smem_bytes(d) == 128 * d * 4 + bm * d * 8 + 128 * bm * 2 + bm * 16 + 1024
    assert W.dq_smem_bytes(d) == 128 * d * 4 + 64 * d * 8 + 1024


class _Recorded(dict):
    """A kernel table that hands out the requested expression itself as the function."""

    def get(self, key, default=None):
        return key[1]


@pytest.fixture
def launches(monkeypatch):
    got = []
    monkeypatch.setattr(driver, "launch", lambda f, grid, block, smem, stream, p: got.append((f, grid, block[0], smem)))
    monkeypatch.setattr(driver, "function_set_max_dynamic_smem", lambda f, n: None)
    monkeypatch.setattr(tuning.attention_bwd, "ENABLED", True)
    # the older dK / dV kernel's dispatch (the warp-specialized one: test_attention_ws_bwd_cpu.py; on a
    # machine with a driver its tensor maps would encode and its launch go past this recorder)
    monkeypatch.setattr(tuning.attention_bwd, "WS", False)
    return got


def _backward(arch="sm_90", det=0, **over):
    args = list(_bwd_args(det=det, ws=2 * 4 * 33 * 4 * 65, **over))
    h = args[0]
    h.arch, h._funcs = arch, _Recorded()
    pydnn.attention_backward(*args)


def _names(got):
    """The kernels launched, without their namespace (pydnn::attn:: or pydnn::attn_wgb::)."""
    return [f.split("<")[0].split("::")[-1] + f[f.index("<"):] for f, *_ in got]


def test_sm90_atomic_runs_the_wgmma_dkdv(launches):
    _backward(det=0)  # B 2, Hq 4, Hkv 2, Sq 33, Skv 17, D 64
    assert _names(launches) == ["bwd_pre_v<pydnn::bf16_t, 64>", "bwd_dkdv_wg<pydnn::bf16_t, 64, true>",
                                "bwd_dq_convert_v<pydnn::bf16_t, 64>"]
    _, grid, threads, smem = launches[1]
    assert grid == (1, 2, 2) and threads == W.THREADS and smem == W.smem_bytes(64)


def test_sm90_deterministic_runs_the_wgmma_dq(launches):
    _backward(det=1)
    assert _names(launches) == ["bwd_pre_v<pydnn::bf16_t, 64>", "bwd_dkdv_wg<pydnn::bf16_t, 64, false>",
                                "bwd_dq_wg<pydnn::bf16_t, 64>"]
    _, grid, threads, smem = launches[2]
    assert grid == (1, 4, 2) and threads == W.THREADS and smem == W.dq_smem_bytes(64)


@pytest.mark.parametrize("why", ["sm_80", "dropout", "switch"])
def test_fallback_to_mma_sync(launches, monkeypatch, why):
    over = {"a": _attn(4, 2, 64, p=0.1, seed=3)} if why == "dropout" else {}
    if why == "switch":
        monkeypatch.setattr(tuning.attention_bwd, "ENABLED", False)
    _backward(arch="sm_80" if why == "sm_80" else "sm_90", det=1, **over)
    names = _names(launches)
    assert len(names) == 3 and not any("_wg<" in n for n in names), names
    assert names[1].startswith("bwd_dkdv<") and names[2].startswith("bwd_dq<")
