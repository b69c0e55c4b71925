"""The Hopper (wgmma) attention backward (ptx/attention_wgmma_bwd.cu: dK / dV with the atomic dQ share, and
the deterministic dQ pass) against the float64 reference, on the wgmma path explicitly
(attention_wgmma_bwd.ENABLED forced on, its launches counted so a silent fallback fails): odd lengths
(partial 128-key blocks and query tiles), several key blocks and query tiles per CTA, no mask and both
causal alignments, variable lengths, MHA / GQA / MQA, d64 and d128, fp16 / bf16, both dQ modes (atomic;
deterministic: bit-identical reruns), outputs poisoned and gaps checked untouched. Also the mma.sync
backward with the switch off (the existing GPU tests take the wgmma path on sm_90). The checks are
tests/ops/attention/test_attention_gpu.py's; the forward producing O and lse here is the mma.sync one."""
import pytest

from pydnn import tuning
from pydnn.ops import attention_wgmma as WF
from pydnn.ops import attention_wgmma_bwd as W
from test_attention_gpu import BF16, BR, CASES, F16, NONE, TL, Problem, _check_backward, _check_forward

pytestmark = pytest.mark.gpu


@pytest.fixture
def wg_path(handle, monkeypatch):
    """The wgmma backward forced on; returns the list of its launches (atomic flags)."""
    if handle.arch != W.ARCH:
        pytest.skip(f"the wgmma backward needs an {W.ARCH} device (this is {handle.arch})")
    monkeypatch.setattr(tuning.attention_bwd, "ENABLED", True)
    monkeypatch.setattr(tuning.attention_bwd, "WS", False)  # (the warp-specialized one: test_attention_ws_bwd_gpu.py)
    # the forward (which produces O and lse here) on its validated mma.sync kernel: these tests are the
    # backward's (the wgmma forward has its own)
    monkeypatch.setattr(tuning.attention, "ENABLED", False, raising=False)
    calls = []
    real_kv, real_dq = W.launch_dkdv, W.launch_dq

    def kv(handle, tag, d, atomic, *args):
        calls.append("dkdv atomic" if atomic else "dkdv")
        return real_kv(handle, tag, d, atomic, *args)

    def dq(*args):
        calls.append("dq")
        return real_dq(*args)

    monkeypatch.setattr(W, "launch_dkdv", kv)
    monkeypatch.setattr(W, "launch_dq", dq)
    return calls


# the wgmma launches of one backward call per mode (deterministic = 1 is checked twice: same bits)
_LAUNCHES = {0: ["dkdv atomic"], 1: ["dkdv", "dq", "dkdv", "dq"]}


def _run(handle, rng, pb, calls, modes=(0, 1)):
    _check_forward(handle, pb)
    _check_backward(handle, pb, rng, modes=modes)
    want = [c for m in modes for c in _LAUNCHES[m]]
    assert calls == want, f"wgmma backward launches {calls}, expected {want}"


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "f16"])
@pytest.mark.parametrize("mask", [NONE, TL, BR], ids=["none", "tl", "br"])
@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}x{c[1]}/{c[2]}x{c[3]}x{c[4]}d{c[5]}{c[6]}" for c in CASES])
def test_backward_wgmma(handle, rng, wg_path, dtype, mask, case):
    b, hq, hkv, sq, skv, d, layout = case
    _run(handle, rng, Problem(rng, b, hq, hkv, sq, skv, d, dtype, mask, layout), wg_path)


LONG_CASES = [  # several 128-key blocks and query tiles per CTA, partial last ones
    (1, 8, 2, 300, 333, 128, "bshd"),   # GQA 4
    (2, 4, 1, 333, 300, 64, "bhsd"),    # MQA
    (1, 2, 2, 512, 512, 128, "bhsd"),   # whole tiles
    (1, 2, 2, 385, 129, 64, "bshd"),    # more queries than keys: one key past a block boundary
]


@pytest.mark.parametrize("mask", [NONE, TL, BR], ids=["none", "tl", "br"])
@pytest.mark.parametrize("case", LONG_CASES, ids=[f"{c[0]}x{c[1]}/{c[2]}x{c[3]}x{c[4]}d{c[5]}{c[6]}" for c in LONG_CASES])
def test_backward_wgmma_long(handle, rng, wg_path, mask, case):
    b, hq, hkv, sq, skv, d, layout = case
    _run(handle, rng, Problem(rng, b, hq, hkv, sq, skv, d, BF16, mask, layout), wg_path)


@pytest.mark.parametrize("mask", [NONE, TL, BR], ids=["none", "tl", "br"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "f16"])
def test_backward_wgmma_variable_lengths(handle, rng, wg_path, dtype, mask, d):
    # padded rows in the strides (pad 8) so the gaps are checked untouched; an empty batch, short keys
    pb = Problem(rng, 3, 4, 2, 230, 260, d, dtype, mask, "bshd", lens=([230, 37, 0], [5, 260, 129]), pad=8)
    _run(handle, rng, pb, wg_path)


@pytest.mark.parametrize("d", [64, 128])
def test_backward_switch_off_runs_mma_sync(handle, rng, monkeypatch, d):
    """ENABLED = False: the mma.sync dK / dV kernels (the only path on other devices)."""
    monkeypatch.setattr(tuning.attention_bwd, "ENABLED", False)
    monkeypatch.setattr(tuning.attention, "ENABLED", False, raising=False)
    calls = []
    monkeypatch.setattr(W, "launch_dkdv", lambda *a: calls.append(a))
    monkeypatch.setattr(W, "launch_dq", lambda *a: calls.append(a))
    pb = Problem(rng, 2, 4, 2, 150, 211, d, BF16, BR, "bshd", lens=([150, 77], [211, 100]))
    _check_forward(handle, pb)
    _check_backward(handle, pb, rng, modes=(0, 1))
    assert not calls


def test_dropout_stays_on_mma_sync(handle, rng, wg_path):
    """Dropout: the wgmma kernel does not take it (the mma.sync kernels replay the Philox mask)."""
    pb = Problem(rng, 1, 2, 2, 70, 130, 128, BF16, NONE, "bhsd", dropout=(0.2, 7))
    _check_forward(handle, pb)
    _check_backward(handle, pb, rng, modes=(0,))
    assert wg_path == []


def test_usable_rules(handle, monkeypatch):
    monkeypatch.setattr(tuning.attention_bwd, "ENABLED", True)
    on = handle.arch == W.ARCH
    assert W.usable(handle, 128, "bf16", 0.0) is on
    assert W.usable(handle, 64, "f16", 0.0) is on
    assert not W.usable(handle, 128, "bf16", 0.1)
    monkeypatch.setattr(tuning.attention_bwd, "ENABLED", False)
    assert not W.usable(handle, 128, "bf16", 0.0)
