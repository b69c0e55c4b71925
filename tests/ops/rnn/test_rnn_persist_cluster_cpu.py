"""PERSIST_STATIC's cluster forward (tuning.rnn.PERSIST_CLUSTER, ptx/rnn_persist.cu persist_fwd_c8 / _c16)
without a GPU: the engine with the kernel re-stated in numpy (rnn_persist_emulator.py: one cluster of CL
blocks per direction, each block's GEMM reading only its own shared memory's h buffer s & 1, each block's
new h slice broadcast into buffer (s + 1) & 1 of every block; with PERSIST_CLUSTER_BWD the backward data the
same way, the staged recurrent gradients broadcast) against the float64 reference; the planner's
choice (cluster size 16, else 8, else the grid kernel; off by default, never before sm_90); the layouts.
NVRTC compilation of the kernels (sm_80 stubs, sm_90 without spills) is test_rnn_persist_cpu.py's
test_persist_units_compile_without_spills (the units hold persist_fwd_c8 / _c16)."""
import os
import sys

import pytest

from pydnn import enums as E
from pydnn import tuning

sys.path.insert(0, os.path.dirname(__file__))
import rnn_emulator  # noqa: E402
from rnn_harness import Case, run_case  # noqa: E402

from pydnn.ops.rnn import persist  # noqa: E402

PS = E.PYDNN_RNN_ALGO_PERSIST_STATIC
F32, F16, BF16 = E.PYDNN_DATA_FLOAT, E.PYDNN_DATA_HALF, E.PYDNN_DATA_BFLOAT16
PACKED = E.PYDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED


def _c(**kw):
    return Case(algo=PS, **kw)


# (the CPU emulation has no bfloat16 path: the GPU tests cover it)
# (case, the cluster size expected): hidden 128 -> 16 blocks of 8 units; hidden 64 -> 8 blocks of 8 (16 would
# be 4 units)
CASES = {
    "lstm-f16-128": (_c(dtype=F16, hidden=128, input_size=6, lengths=(4, 2, 4, 3, 1), T=4), 16),
    "lstm-f32-64-bi-2layer-nostate": (_c(hidden=64, input_size=5, dirs=2, layers=2, states=False,
                                         lengths=(4, 2, 3), T=4, fill=-3.0), 8),
    "gru-f16-64-packed": (_c(cell=E.PYDNN_GRU, dtype=F16, hidden=64, input_size=7, layout=PACKED,
                              lengths=(4, 4, 2), T=4), 8),
    "tanh-f16-128-skip-bi": (_c(cell=E.PYDNN_RNN_TANH, dtype=F16, hidden=128, skip=True, dirs=2,
                                lengths=(3, 1, 3), T=3), 16),
    "lstm-f32-64-clip": (_c(hidden=64, input_size=4, clip=(-0.4, 0.5), lengths=(4, 1, 3), T=4), 8),
    "relu-f32-128-nobias": (_c(cell=E.PYDNN_RNN_RELU, bias_mode=E.PYDNN_RNN_NO_BIAS, hidden=128, input_size=3,
                               lengths=(3, 3), T=3), 16),
}


@pytest.mark.parametrize("bwd", [False, True], ids=["fwd", "fwd-bwd"])
@pytest.mark.parametrize("name", list(CASES))
def test_cluster_forward_on_emulated_device(name, bwd, monkeypatch):
    """PERSIST_CLUSTER (the forward) and with bwd PERSIST_CLUSTER_BWD too (backward data in clusters)."""
    c, cl = CASES[name]
    monkeypatch.setattr(tuning.rnn, "PERSIST_CLUSTER", True)
    monkeypatch.setattr(tuning.rnn, "PERSIST_CLUSTER_BWD", bwd)
    dev = rnn_emulator.Device()
    calls = rnn_emulator.install(monkeypatch, dev, c.dtype)
    h = rnn_emulator.fake_handle()
    run_case(h, dev, c)
    kinds = {m[1] for m in calls if m[0] == "persist"}
    if bwd:  # no counter, no reset
        assert kinds == {f"persist_fwd_c{cl}", f"persist_bwd_c{cl}"}, kinds
    else:  # the backward data stays the grid kernel (with its counter's reset)
        assert kinds == {f"persist_fwd_c{cl}", "persist_reset", "persist_bwd"}, kinds
    fwd = [it for k, items in h.prepared.items() if k[0] == "rnn.call" and k[1] == "_run_forward" for it in items
           if it[5][:2] == ("persist", f"persist_fwd_c{cl}")]
    assert fwd and all(it[1] == (cl, c.dirs, 1) and it[4][2].units == c.hidden // cl for it in fwd)


def test_switch_off_or_before_sm90_takes_the_grid_kernel(monkeypatch):
    c, _ = CASES["lstm-f16-128"]
    for on, arch in ((False, "sm_90"), (True, "sm_80")):
        monkeypatch.setattr(tuning.rnn, "PERSIST_CLUSTER", on)
        dev = rnn_emulator.Device()
        calls = rnn_emulator.install(monkeypatch, dev, c.dtype)
        h = rnn_emulator.fake_handle()
        h.arch = arch
        run_case(h, dev, c)
        kinds = {m[1] for m in calls if m[0] == "persist"}
        assert kinds == {"persist_fwd", "persist_reset", "persist_bwd"}, (on, arch, kinds)




@pytest.mark.parametrize("cell,dt,H,B,want", [
    (E.PYDNN_LSTM, F16, 256, 32, 16),   # issue 16's small case: 16 blocks of 16 units
    (E.PYDNN_LSTM, F16, 512, 32, 0),    # 32 units a block: 130 KiB of weights + 65 KiB of h: past 227 KiB
    (E.PYDNN_LSTM, F32, 512, 32, 0),    # 256 KiB of weights a block even at 16: the grid kernel
    (E.PYDNN_GRU, BF16, 64, 8, 8),
    (E.PYDNN_RNN_TANH, F16, 512, 32, 16),
    (E.PYDNN_GRU, F32, 256, 16, 16),
    (E.PYDNN_LSTM, F16, 96, 4, 0),      # 96 is no multiple of 8 * 8
    (E.PYDNN_LSTM, F16, 1024, 64, 0),   # 64 units a block: 516 KiB of weights
])
def test_cluster_options(cell, dt, H, B, want, monkeypatch):
    """cluster_options: the first size that fits the sm_90 opt-in shared memory, its regions disjoint, 16-byte
    aligned, the A region two whole [bp][pitch] buffers (one chunk)."""
    monkeypatch.setattr(tuning.rnn, "PERSIST_CLUSTER", True)
    G = {E.PYDNN_LSTM: 4, E.PYDNN_GRU: 3}.get(cell, 1)
    es = {F32: 4, F16: 2, BF16: 2}[dt]
    opts = persist.cluster_options(H, B, G, es, 4 if G > 1 else 1, persist.SMEM_OPTIN["sm_90"], "sm_90")
    assert (opts[0][0] if opts else 0) == want
    for cl, lay in opts:
        assert H % (8 * cl) == 0 and lay.units == H // cl and lay.nchunk == 1 and lay.kp == H
        assert lay.smem <= persist.SMEM_OPTIN["sm_90"]
        offs = sorted(lay.off.values())
        assert all(o % 16 == 0 for o in offs)
        a_next = min(o for o in lay.off.values() if o > lay.off["a"])
        assert a_next - lay.off["a"] >= 2 * lay.bp * lay.pitch * es
        assert (lay.pitch * es) % 16 == 0 and (lay.units * es) % 16 == 0
    assert persist.cluster_options(H, B, G, es, 4, persist.SMEM_OPTIN["sm_90"], "sm_80") == []
    monkeypatch.setattr(tuning.rnn, "PERSIST_CLUSTER", False)
    assert persist.cluster_options(H, B, G, es, 4, persist.SMEM_OPTIN["sm_90"], "sm_90") == []


@pytest.mark.parametrize("cell,dt,H,B,want", [
    (E.PYDNN_LSTM, F16, 256, 32, 16),   # W^T 33 KiB + 2 x [32][1032] fp16 (129 KiB)
    (E.PYDNN_LSTM, F32, 256, 32, 0),    # 2 x [32][1028] f32 = 257 KiB: the grid kernel
    (E.PYDNN_GRU, BF16, 128, 40, 16),
    (E.PYDNN_RNN_TANH, F32, 64, 8, 8),
])
def test_backward_cluster_options(cell, dt, H, B, want, monkeypatch):
    monkeypatch.setattr(tuning.rnn, "PERSIST_CLUSTER_BWD", True)
    G = {E.PYDNN_LSTM: 4, E.PYDNN_GRU: 3}.get(cell, 1)
    es = {F32: 4, F16: 2, BF16: 2}[dt]
    opts = persist.cluster_options(H, B, G, es, 4 if G > 1 else 1, persist.SMEM_OPTIN["sm_90"], "sm_90", bwd=True)
    assert (opts[0][0] if opts else 0) == want
    for cl, lay in opts:
        assert lay.kp == G * H and lay.nchunk == 1 and lay.n == H // cl
        a_next = min(o for o in lay.off.values() if o > lay.off["a"])
        assert a_next - lay.off["a"] >= 2 * lay.bp * lay.pitch * es
        h_next = min([o for o in lay.off.values() if o > lay.off["h"]] + [lay.smem])
        assert h_next - lay.off["h"] >= B * G * lay.units * es


def test_broadcast_mapping_covers_every_peer_once():
    """persist_fwd_cl's broadcast loop, re-stated: item q -> rank q % CL, chunk q / CL (row b, columns
    j0 + k .. + E): every (rank, row, 16-byte chunk of the slice) exactly once, within the row's slice."""
    import numpy as np
    for cl in persist.CLUSTERS:
        for es, U, B in ((2, 8, 3), (2, 16, 32), (4, 8, 5), (4, 32, 64), (2, 32, 40)):
            E_ = 16 // es
            cpr = U // E_
            hits = np.zeros((cl, B, U), int)
            for q in range(B * cpr * cl):
                c = q // cl
                b, k = c // cpr, (c % cpr) * E_
                hits[q % cl, b, k:k + E_] += 1
            assert (hits == 1).all()
            # persist_bwd_cl: item q -> rank q % CL, chunk q / CL = (row b, gate g, units k .. k + E)
            for G in (1, 3, 4):
                H = U * cl
                hits = np.zeros((cl, B, G * H), int)
                j0 = 0
                for q in range(B * G * cpr * cl):
                    c = q // cl
                    bg, k = c // cpr, (c % cpr) * E_
                    b, g = bg // G, bg % G
                    hits[q % cl, b, g * H + j0 + k:g * H + j0 + k + E_] += 1
                want = np.zeros((cl, B, G * H), int)
                for g in range(G):
                    want[:, :, g * H + j0:g * H + j0 + U] = 1
                assert (hits == want).all()
