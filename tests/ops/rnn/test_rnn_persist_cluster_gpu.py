"""PERSIST_STATIC's cluster forward on the GPU (sm_90; tuning.rnn.PERSIST_CLUSTER on, monkeypatched: the
switch is off by default until this file and tools/bench_rnn.py's "fwd cl" rows have run). NOT YET RUN on a GPU
when written (no device for this branch): written for the lead's final run.

1. rnn_harness.run_case with algo PERSIST_STATIC and the switch on: every output poisoned, RNNForward
   (INFERENCE, TRAINING), RNNBackwardData_v8 (the grid kernel, reading the reserve space the cluster forward
   wrote), RNNBackwardWeights_v8 against the float64 reference; LSTM / GRU / RNN_TANH / RNN_RELU, fp16 / bf16 /
   fp32, hidden 64 (clusters of 8) .. 512 (16), variable lengths, hx / cx NULL, both directions (one cluster
   each), several layers, clipping; each test checks that the planner did pick the cluster kernel (the plan's
   cluster size), so a driver refusal (cuOccupancyMaxActiveClusters, the non-portable size 16) fails loudly
   instead of silently timing the grid kernel.
2. The cluster forward against STANDARD on the same weights and inputs (test_rnn_persist_gpu's comparison).
2b. The same two with tuning.rnn.PERSIST_CLUSTER_BWD on too (backward data in clusters; kept in tests of their
   own so that a backward failure does not hide the forward's result).
3. Clusters of 8 forced (persist.CLUSTERS monkeypatched) where 16 would be chosen; a shape whose weights do not
   fit a cluster (LSTM fp16 hidden 512) falls back to the grid kernel and stays correct."""
import os
import sys

import pytest

from pydnn import enums as E
from pydnn import tuning

sys.path.insert(0, os.path.dirname(__file__))
from rnn_harness import Case, GpuDevice, run_case  # noqa: E402

pytestmark = pytest.mark.gpu

F32, F16, BF16 = E.PYDNN_DATA_FLOAT, E.PYDNN_DATA_HALF, E.PYDNN_DATA_BFLOAT16
PACKED, BATCH_MAJOR = E.PYDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED, E.PYDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED
PS = E.PYDNN_RNN_ALGO_PERSIST_STATIC


def _c(**kw):
    return Case(algo=PS, **kw)


def _cluster_sizes(handle, bwd=False):
    """The cluster size of every PERSIST_STATIC plan made with the switch on (0: the grid kernel); bwd: the
    backward's, of the training plans made with PERSIST_CLUSTER_BWD on."""
    if bwd:
        return [v.clb for k, v in handle.prepared.items() if k and k[0] == "rnn.persist.plan" and k[7][1] and k[8]]
    return [v.cl for k, v in handle.prepared.items() if k and k[0] == "rnn.persist.plan" and k[7][0]]


@pytest.fixture
def cluster_on(monkeypatch):
    monkeypatch.setattr(tuning.rnn, "PERSIST_CLUSTER", True)


def _need_sm90(handle):
    if int(handle.arch[3:].rstrip("a")) < 90:
        pytest.skip("thread-block clusters need sm_90")


# (case, expected cluster size)
CASES = {
    "lstm-f16-256": (_c(dtype=F16, hidden=256, input_size=64, lengths=(12, 9, 12, 3, 7, 12, 1, 5) * 4, T=12), 16),
    "lstm-f16-256-nostate-bi": (_c(dtype=F16, hidden=256, input_size=32, dirs=2, states=False,
                                   lengths=(8, 8, 6, 2) * 8, T=8, fill=-2.0), 16),
    "lstm-bf16-128-2layer": (_c(dtype=BF16, hidden=128, input_size=24, layers=2, lengths=(7, 7, 5, 1, 7) * 4,
                                T=7), 16),
    "lstm-f32-64-clip-bi": (_c(hidden=64, input_size=40, dirs=2, clip=(-0.5, 0.6), lengths=(9, 8, 2, 9, 5), T=9), 8),
    "lstm-f32-256": (_c(hidden=256, input_size=16, lengths=(6, 6, 3, 1) * 4, T=6), 16),
    "gru-bf16-128-bi-packed": (_c(cell=E.PYDNN_GRU, dtype=BF16, hidden=128, input_size=48, dirs=2, layout=PACKED,
                                  lengths=(10, 10, 4) * 6, T=10), 16),
    "gru-f16-64-skip-rec-bias": (_c(cell=E.PYDNN_GRU, dtype=F16, hidden=64, skip=True,
                                    bias_mode=E.PYDNN_RNN_SINGLE_REC_BIAS, lengths=(5, 3, 5), T=5), 8),
    "gru-f32-256-batch-major": (_c(cell=E.PYDNN_GRU, hidden=256, input_size=8, layout=BATCH_MAJOR,
                                   lengths=(4, 1, 3, 4), T=4, fill=1.5), 16),
    "tanh-f16-512": (_c(cell=E.PYDNN_RNN_TANH, dtype=F16, hidden=512, input_size=32, lengths=(6, 2, 6) * 8, T=6), 16),
    "tanh-bf16-64-nostate": (_c(cell=E.PYDNN_RNN_TANH, dtype=BF16, hidden=64, input_size=8, states=False,
                                lengths=(5, 5, 1), T=5), 8),
    "relu-f32-128-nobias": (_c(cell=E.PYDNN_RNN_RELU, bias_mode=E.PYDNN_RNN_NO_BIAS, hidden=128, input_size=9,
                               lengths=(4, 3), T=4), 16),
    # SKIP_INPUT, one layer, no BackwardWeights: no matmul GEMM (only the rnn and rnn_persist units compile)
    "mid-lstm-f16-256-skip": (_c(dtype=F16, hidden=256, skip=True, lengths=(12, 9, 12, 3, 7, 12, 1, 5) * 4, T=12,
                                 weights=False), 16),
}


@pytest.mark.parametrize("name", list(CASES))
def test_cluster_forward_against_float64_reference(name, handle, cluster_on):
    _need_sm90(handle)
    c, cl = CASES[name]
    run_case(handle, GpuDevice(), c)
    sizes = _cluster_sizes(handle)
    assert sizes and all(s == cl for s in sizes), f"cluster sizes {sizes}, expected {cl} (0: the grid kernel)"


@pytest.mark.parametrize("name", list(CASES))
def test_cluster_backward_against_float64_reference(name, handle, cluster_on, monkeypatch):
    """PERSIST_CLUSTER_BWD on too: backward data in clusters (every case's operand fits, at the same size)."""
    _need_sm90(handle)
    monkeypatch.setattr(tuning.rnn, "PERSIST_CLUSTER_BWD", True)
    c, cl = CASES[name]
    run_case(handle, GpuDevice(), c)
    sizes, bsizes = _cluster_sizes(handle), _cluster_sizes(handle, bwd=True)
    assert sizes and all(s == cl for s in sizes), f"forward cluster sizes {sizes}, expected {cl}"
    assert bsizes and all(s == cl for s in bsizes), f"backward cluster sizes {bsizes}, expected {cl}"


@pytest.mark.parametrize("name", ["lstm-f16-256", "gru-bf16-128-bi-packed", "lstm-f32-256"])
def test_clusters_of_8_forced(name, handle, cluster_on, monkeypatch):
    _need_sm90(handle)
    from pydnn.ops.rnn import persist
    monkeypatch.setattr(persist, "CLUSTERS", (8,))
    run_case(handle, GpuDevice(), CASES[name][0])
    sizes = _cluster_sizes(handle)
    assert sizes and all(s == 8 for s in sizes), sizes


def test_too_large_for_a_cluster_falls_back(handle, cluster_on):
    _need_sm90(handle)
    c = _c(dtype=F16, hidden=512, input_size=16, lengths=(4, 2, 4) * 8, T=4)
    run_case(handle, GpuDevice(), c)
    sizes = _cluster_sizes(handle)
    assert sizes and all(s == 0 for s in sizes), sizes


@pytest.mark.parametrize("cell,dt,D", [(E.PYDNN_LSTM, F16, 1), (E.PYDNN_GRU, BF16, 2), (E.PYDNN_LSTM, F32, 1),
                                       (E.PYDNN_RNN_TANH, F16, 1)])
def test_cluster_forward_matches_standard(cell, dt, D, handle, cluster_on):
    """test_rnn_persist_gpu's comparison (hidden 256, batch 24, T 16, variable lengths) with the switch on."""
    _need_sm90(handle)
    from test_rnn_persist_gpu import test_persist_matches_standard
    test_persist_matches_standard(cell, dt, D, handle)
    sizes = _cluster_sizes(handle)
    assert sizes and all(s == 16 for s in sizes), sizes


@pytest.mark.parametrize("cell,dt,D", [(E.PYDNN_LSTM, F16, 1), (E.PYDNN_GRU, BF16, 2), (E.PYDNN_RNN_TANH, F16, 1)])
def test_cluster_backward_matches_standard(cell, dt, D, handle, cluster_on, monkeypatch):
    _need_sm90(handle)
    monkeypatch.setattr(tuning.rnn, "PERSIST_CLUSTER_BWD", True)
    from test_rnn_persist_gpu import test_persist_matches_standard
    test_persist_matches_standard(cell, dt, D, handle)
    bsizes = _cluster_sizes(handle, bwd=True)
    assert bsizes and all(s == 16 for s in bsizes), bsizes
