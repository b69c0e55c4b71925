"""The warp-specialized forward's TMA maps (attention_ws.tma_maps / paged_maps), on the CPU: the Q / K / V maps are
encoded with the tensors' dims, strides and boxes, in that order, once per set of pointers and shapes."""
from types import SimpleNamespace

import pytest

from pydnn.ops import attention_ws as W


@pytest.fixture
def encoded(monkeypatch):
    calls = []

    def fake(tag, ptr, dims, strides, rows):
        calls.append((tag, ptr, tuple(dims), tuple(strides), rows))
        return bytes([len(calls)]) * 128

    monkeypatch.setattr(W, "_encode", fake)
    monkeypatch.setattr(W, "_MAPS", {})
    return calls


def params(**kw):
    p = dict(batch=3, heads_q=8, heads_kv=2, seq_q=77, seq_kv=130, q=0x1000, k=0x2000, v=0x3000, page_size=64,
             stride=[[8 * 77 * 128, 77 * 128, 128], [2 * 130 * 128, 130 * 128, 128], [2 * 130 * 128, 130 * 128, 136]])
    p.update(kw)
    return SimpleNamespace(**p)


def test_tma_maps_encode_q_k_v_once(encoded):
    p = params()
    m = W.tma_maps("bf16", 128, p)
    bn = W.BN[128]
    assert encoded == [("bf16", 0x1000, (128, 77, 8, 3), (128, 77 * 128, 8 * 77 * 128), W.BM),
                       ("bf16", 0x2000, (128, 130, 2, 3), (128, 130 * 128, 2 * 130 * 128), bn),
                       ("bf16", 0x3000, (128, 130, 2, 3), (136, 130 * 128, 2 * 130 * 128), bn)]
    assert bytes(m.raw) == bytes([1]) * 128 + bytes([2]) * 128 + bytes([3]) * 128
    assert W.tma_maps("bf16", 128, p) is m and len(encoded) == 3      # cached: nothing encoded again
    W.tma_maps("bf16", 128, params(k=0x2100))                           # another pointer: encoded anew
    assert len(encoded) == 6


def test_paged_maps_take_the_pools_and_a_box_of_one_page(encoded):
    p = params(page_size=16)
    m = W.paged_maps("f16", 128, p, 40)
    assert [c[2] for c in encoded] == [(128, 77, 8, 3), (128, 16, 2, 40), (128, 16, 2, 40)]
    assert [c[4] for c in encoded] == [W.BM, 16, 16]
    assert W.paged_maps("f16", 128, p, 40) is m and len(encoded) == 3
    W.paged_maps("f16", 128, params(page_size=256), 40)
    assert [c[4] for c in encoded[3:]] == [W.BM, W.BN[128], W.BN[128]]   # pages larger than a tile: a tile a box
