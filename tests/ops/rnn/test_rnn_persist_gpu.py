"""PYDNN_RNN_ALGO_PERSIST_STATIC on the GPU (ptx/rnn_persist.cu through pydnn/ops/rnn/persist.py). The MID and
MID_CHUNKED cases (SKIP_INPUT, no matmul) passed on an H200 in the mid-session run (HEAD at 23:00 UTC,
22fa6f7..d0badbe; both exchanges); the rest is written for the final run.

1. rnn_harness.run_case with algo PERSIST_STATIC: every output poisoned, RNNForward (INFERENCE: the state
   slots ping-pong; TRAINING: the reserve space STANDARD's backward layout), RNNBackwardData_v8,
   RNNBackwardWeights_v8 (ADD) against the float64 reference with the STANDARD tests' tolerances; every cell,
   the three data types, both directions, several layers, variable lengths, hx / cx NULL, SKIP_INPUT, clipping,
   and sizes with many blocks meeting at the grid barrier.
2. PERSIST_STATIC and STANDARD on the same weights and inputs: every output within the data type's tolerance.
3. NOT_SUPPORTED with the reason where the weights do not fit on chip, or with a projection."""
import os
import sys

import numpy as np
import pytest

import pydnn
from pydnn import enums as E
from pydnn.status import PydnnError

sys.path.insert(0, os.path.dirname(__file__))
from rnn_harness import TOL, Case, GpuDevice, run_case  # noqa: E402

pytestmark = pytest.mark.gpu

F32, F16, BF16 = E.PYDNN_DATA_FLOAT, E.PYDNN_DATA_HALF, E.PYDNN_DATA_BFLOAT16
PACKED, BATCH_MAJOR = E.PYDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED, E.PYDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED
PS = E.PYDNN_RNN_ALGO_PERSIST_STATIC


def _c(**kw):
    kw.setdefault("hidden", 8)
    return Case(algo=PS, **kw)


CASES = {
    "lstm": _c(),
    "lstm-f16": _c(dtype=F16),
    "lstm-bf16-bi-2layer": _c(dtype=BF16, dirs=2, layers=2),
    "lstm-bi-2layer-nostate": _c(layers=2, dirs=2, states=False, lengths=(4, 2, 3), fill=-3.0),
    "lstm-clip": _c(clip=(-0.4, 0.5), layers=2, lengths=(4, 1, 3)),
    "gru-bi-packed": _c(cell=E.PYDNN_GRU, dirs=2, layers=2, layout=PACKED, lengths=(4, 4, 2)),
    "gru-skip-rec-bias-f16": _c(cell=E.PYDNN_GRU, skip=True, bias_mode=E.PYDNN_RNN_SINGLE_REC_BIAS, dirs=2,
                                dtype=F16),
    "relu-nobias": _c(cell=E.PYDNN_RNN_RELU, bias_mode=E.PYDNN_RNN_NO_BIAS, layers=2),
    "tanh-inp-bias-batch-major-bf16": _c(cell=E.PYDNN_RNN_TANH, bias_mode=E.PYDNN_RNN_SINGLE_INP_BIAS,
                                         layout=BATCH_MAJOR, lengths=(1, 4, 2), dtype=BF16),
    "lstm-skip-bi": _c(skip=True, dirs=2, layers=2),
    "gru-dropout-2layer-bi": _c(cell=E.PYDNN_GRU, layers=2, dirs=2, dropout=0.4),
    # many blocks at the barrier (hidden / 8 of them), batch past one 16-row tile, longer sequences
    "lstm-f16-256": _c(dtype=F16, hidden=256, input_size=64, lengths=(12, 9, 12, 3, 7, 12, 1, 5) * 3, T=12),
    "gru-bf16-128-bi": _c(cell=E.PYDNN_GRU, dtype=BF16, hidden=128, input_size=48, lengths=(10,) * 20, T=10, dirs=2),
    "lstm-f32-64": _c(hidden=64, input_size=40, lengths=(9, 8, 8, 2, 9), T=9, layers=2),
    "tanh-f32-96-bi": _c(cell=E.PYDNN_RNN_TANH, hidden=96, input_size=17, lengths=(7, 3, 5), T=7, dirs=2),
    "relu-f16-64": _c(cell=E.PYDNN_RNN_RELU, dtype=F16, hidden=64, input_size=16, lengths=(6, 6, 5), T=6),
    # more mma work items than warps (batch 40: 3 row tiles x 4 column tiles = 12): two mma chains per warp
    "lstm-f16-128-batch-40": _c(dtype=F16, hidden=128, input_size=24, lengths=(7, 7, 5, 1, 7) * 8, T=7),
    "gru-bf16-64-batch-64-bi": _c(cell=E.PYDNN_GRU, dtype=BF16, hidden=64, input_size=8, lengths=(5, 3, 5, 5) * 16,
                                  T=5, dirs=2),
}


@pytest.mark.parametrize("name", list(CASES))
def test_persist_against_float64_reference(name, handle):
    run_case(handle, GpuDevice(), CASES[name])


# SKIP_INPUT, one layer, no BackwardWeights: no matmul GEMM anywhere (forward, backward data: the persistent
# kernels, the rnn.cu ones and skip_dx), so these run on the rnn and rnn_persist units alone
MID = {
    "mid-lstm-f16-256": _c(dtype=F16, hidden=256, skip=True, lengths=(12, 9, 12, 3, 7, 12, 1, 5) * 3, T=12,
                           weights=False),
    "mid-lstm-f16-256-nostate": _c(dtype=F16, hidden=256, skip=True, states=False, lengths=(8, 8, 6, 2) * 5, T=8,
                                   weights=False),
    "mid-gru-bf16-128-bi": _c(cell=E.PYDNN_GRU, dtype=BF16, hidden=128, skip=True, dirs=2, lengths=(10, 4, 10) * 6,
                              T=10, weights=False),
    "mid-lstm-f32-64-bi-clip": _c(hidden=64, skip=True, dirs=2, clip=(-0.5, 0.6), lengths=(9, 8, 2, 9, 5), T=9,
                                  weights=False),
    "mid-tanh-f32-96": _c(cell=E.PYDNN_RNN_TANH, hidden=96, skip=True, lengths=(7, 3, 5), T=7, weights=False),
    "mid-relu-f16-32-packed": _c(cell=E.PYDNN_RNN_RELU, dtype=F16, hidden=32, skip=True, layout=PACKED,
                                 lengths=(6, 6, 5, 2), T=6, weights=False),
    "mid-gru-f16-8-batch-major": _c(cell=E.PYDNN_GRU, dtype=F16, skip=True, layout=BATCH_MAJOR, lengths=(4, 1, 3),
                                    fill=1.5, weights=False),
    "mid-lstm-f16-128-batch-40": _c(dtype=F16, hidden=128, skip=True, lengths=(6, 2, 6, 6, 4) * 8, T=6,
                                    weights=False),
}


@pytest.mark.parametrize("xchg", [True, False], ids=["tagged", "barrier"])
@pytest.mark.parametrize("name", list(MID))
def test_persist_skip_input_without_gemms(name, xchg, handle, monkeypatch):
    """Both forward exchanges: the grid barrier (default) and the tagged words (tuning.rnn.PERSIST_XCHG on)."""
    from pydnn import tuning
    monkeypatch.setattr(tuning.rnn, "PERSIST_XCHG", xchg)
    run_case(handle, GpuDevice(), MID[name])


# tuning.rnn.PERSIST_MAX_CHUNK 64: the [batch, K] operands through shared memory in chunks of 64 columns (two
# buffers), as the large shapes (hidden 1024, batch 64) need; still no matmul GEMM
MID_CHUNKED = {
    "mid-lstm-f16-256-chunks": _c(dtype=F16, hidden=256, skip=True, lengths=(9, 4, 9, 1) * 5, T=9, weights=False),
    "mid-gru-f32-128-bi-chunks": _c(cell=E.PYDNN_GRU, hidden=128, skip=True, dirs=2, lengths=(6, 6, 3), T=6,
                                    weights=False),
    "mid-tanh-bf16-192-chunks": _c(cell=E.PYDNN_RNN_TANH, dtype=BF16, hidden=192, skip=True, lengths=(5, 2, 5) * 6,
                                   T=5, weights=False),
}


@pytest.mark.parametrize("xchg", [True, False], ids=["tagged", "barrier"])
@pytest.mark.parametrize("name", list(MID_CHUNKED))
def test_persist_skip_input_in_chunks(name, xchg, handle, monkeypatch):
    from pydnn import tuning
    monkeypatch.setattr(tuning.rnn, "PERSIST_XCHG", xchg)
    monkeypatch.setattr(tuning.rnn, "PERSIST_MAX_CHUNK", 64)
    run_case(handle, GpuDevice(), MID_CHUNKED[name])


# the forward's variants (tuning.rnn switches; run_case runs the backward data too, which takes PERSIST_FLAGS
# and PERSIST_CHAIN2 as well): PERSIST_FLAGS (one flag per block instead of the counter),
# PERSIST_CHAIN2 (two accumulator chains in a warp with one mma tile; an odd count of k steps a warp at hidden 8
# and 32), PERSIST_UNITS (16 units a block: half the blocks; hidden 8 keeps 8), PERSIST_XS_AHEAD (the next
# step's x slice fetched during this one), PERSIST_FAST_MATH (tanh.approx.f32 in the 16-bit cells; float
# cases keep the exact math), PERSIST_LEAN (persist_fwd's instance without the tagged exchange and the chunk
# loop; the chunked case keeps the general one), all six; chunked operands too (no x buffers there); the data
# type's tolerances. The defaults (CHAIN2, XS_AHEAD, FAST_MATH on) run under every other test. PERSIST_REG (on:
# persist_fwd_r for 16-bit data at 8 units a block, see reg_shape) runs under every default 16-bit test; "general"
# and the general kernel's own switches turn it off, "exact" runs persist_fwd_r with tanhf / expf, "regx" its
# tagged exchange (PERSIST_REG_XCHG, where at most 4 k steps a warp), "bwdreg" the backward's persist_bwd_r
# (PERSIST_BWD_REG, off by default; where persist.bwd_reg_shape allows), "regone" persist_fwd_r's ONE instance
# (PERSIST_REG_ONE: one combo a thread, at 4 or 8 K slices and KR 4; on by default since mid-session run 2,
# "regmany" the generic instance there), "regcg" its h loads as ld.global.cg. "general", "flags" and "chain2" turn
# persist_bwd_r (PERSIST_BWD_REG, on by default) off as well.
VARIANTS = {"general": dict(PERSIST_REG=False, PERSIST_BWD_REG=False),
            "flags": dict(PERSIST_FLAGS=True, PERSIST_REG=False, PERSIST_BWD_REG=False),
            "chain2": dict(PERSIST_CHAIN2=True, PERSIST_REG=False, PERSIST_BWD_REG=False),
            "units16": dict(PERSIST_UNITS=16),
            "ahead": dict(PERSIST_XS_AHEAD=True, PERSIST_REG=False), "fast": dict(PERSIST_FAST_MATH=True),
            "exact": dict(PERSIST_FAST_MATH=False), "lean": dict(PERSIST_LEAN=True, PERSIST_REG=False),
            "regx": dict(PERSIST_REG_XCHG=True), "regxs": dict(PERSIST_REG_XCHG=True, PERSIST_REG_SLEEP=True),
            "bwdreg": dict(PERSIST_BWD_REG=True), "regone": dict(PERSIST_REG_ONE=True),
            "regmany": dict(PERSIST_REG_ONE=False),
            "regcg": dict(PERSIST_REG_CG=True),
            "all": dict(PERSIST_FLAGS=True, PERSIST_CHAIN2=True, PERSIST_UNITS=16, PERSIST_XS_AHEAD=True,
                        PERSIST_FAST_MATH=True, PERSIST_LEAN=True)}
VARIANT_CASES = ("mid-lstm-f16-256", "mid-gru-bf16-128-bi", "mid-lstm-f32-64-bi-clip", "mid-relu-f16-32-packed",
                 "mid-gru-f16-8-batch-major", "mid-lstm-f16-128-batch-40")


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("name", VARIANT_CASES + ("mid-lstm-f16-256-chunks",))
def test_persist_forward_variants(name, variant, handle, monkeypatch):
    from pydnn import tuning
    for k, v in VARIANTS[variant].items():
        monkeypatch.setattr(tuning.rnn, k, v)
    if name in MID_CHUNKED:
        monkeypatch.setattr(tuning.rnn, "PERSIST_MAX_CHUNK", 64)
    run_case(handle, GpuDevice(), MID[name] if name in MID else MID_CHUNKED[name])


def _problem(handle, dev, algo, cell, dt, T, B, I, H, D, lens):
    r = pydnn.create_rnn_descriptor()
    pydnn.set_rnn_descriptor_v8(r, algo, cell, E.PYDNN_RNN_DOUBLE_BIAS,
                                E.PYDNN_BIDIRECTIONAL if D == 2 else E.PYDNN_UNIDIRECTIONAL, E.PYDNN_LINEAR_INPUT,
                                dt, F32, E.PYDNN_DEFAULT_MATH, I, H, H, 1, None, E.PYDNN_RNN_PADDED_IO_ENABLED)
    xd, yd = pydnn.create_rnn_data_descriptor(), pydnn.create_rnn_data_descriptor()
    pydnn.set_rnn_data_descriptor(xd, dt, 0, T, B, I, list(lens), 0.0)
    pydnn.set_rnn_data_descriptor(yd, dt, 0, T, B, D * H, list(lens), 0.0)
    hd = pydnn.create_tensor_descriptor()
    pydnn.set_tensor_nd_descriptor(hd, dt, 3, [D, B, H], [B * H, H, 1])
    wss, rss = pydnn.get_rnn_temp_space_sizes(handle, r, E.PYDNN_FWD_MODE_TRAINING, xd)
    return r, xd, yd, hd, wss, rss


@pytest.mark.parametrize("cell,dt,D", [(E.PYDNN_LSTM, F16, 1), (E.PYDNN_GRU, BF16, 2), (E.PYDNN_LSTM, F32, 1),
                                       (E.PYDNN_RNN_TANH, F16, 1)])
def test_persist_matches_standard(cell, dt, D, handle):
    """The same weights, inputs and states through both algorithms: y, hy, cy, dx, dhx, dcx and the weight
    gradients agree within the data type's tolerance (relative to each output's largest magnitude)."""
    from pydnn.reference import dtypes as rd
    from pydnn.tensor import DTYPES
    dev = GpuDevice()
    es, npdt = DTYPES[dt][0], DTYPES[dt][1]
    T, B, I, H = 16, 24, 32, 256
    lens = [16] * 20 + [11, 7, 3, 1]
    rng = np.random.default_rng(5)

    def rnd(n, scale):
        return rd.to_storage(rng.uniform(-scale, scale, n), dt)

    lstm = cell == E.PYDNN_LSTM
    probs = {a: _problem(handle, dev, a, cell, dt, T, B, I, H, D, lens) for a in (E.PYDNN_RNN_ALGO_STANDARD, PS)}
    wsize = pydnn.get_rnn_weight_space_size(handle, probs[PS][0])
    w = dev.alloc(wsize)
    dev.write(w, rnd(wsize // es, 1.0 / np.sqrt(H)))
    inputs = {}
    for name, n in (("x", T * B * I), ("hx", D * B * H), ("cx", D * B * H), ("dy", T * B * D * H),
                    ("dhy", D * B * H), ("dcy", D * B * H)):
        inputs[name] = dev.alloc(n * es)
        dev.write(inputs[name], rnd(n, 1.0))
    dlens = dev.alloc(4 * B)
    dev.write(dlens, np.array(lens, np.int32))
    out = {}
    for algo, (r, xd, yd, hd, wss, rss) in probs.items():
        o = {k: dev.alloc(n * es) for k, n in (("y", T * B * D * H), ("hy", D * B * H), ("cy", D * B * H),
                                               ("dx", T * B * I), ("dhx", D * B * H), ("dcx", D * B * H))}
        ws, rs = dev.alloc(wss), dev.alloc(rss)
        o["dw"] = dev.alloc(wsize)
        dev.write(o["dw"], np.zeros(wsize, np.uint8))
        pydnn.rnn_forward(handle, r, E.PYDNN_FWD_MODE_TRAINING, dlens, xd, inputs["x"], yd, o["y"], hd, inputs["hx"],
                          o["hy"], hd, inputs["cx"] if lstm else 0, o["cy"] if lstm else 0, wsize, w, wss, ws, rss, rs)
        pydnn.rnn_backward_data_v8(handle, r, dlens, yd, o["y"], inputs["dy"], xd, o["dx"], hd, inputs["hx"],
                                   inputs["dhy"], o["dhx"], hd, inputs["cx"] if lstm else 0,
                                   inputs["dcy"] if lstm else 0, o["dcx"] if lstm else 0, wsize, w, wss, ws, rss, rs)
        pydnn.rnn_backward_weights_v8(handle, r, E.PYDNN_WGRAD_MODE_ADD, dlens, xd, inputs["x"], hd, inputs["hx"], yd,
                                      o["y"], wsize, o["dw"], wss, ws, rss, rs)
        dev.sync()
        sizes = dict(y=T * B * D * H, hy=D * B * H, cy=D * B * H, dx=T * B * I, dhx=D * B * H, dcx=D * B * H,
                     dw=wsize // es)
        out[algo] = {k: rd.from_storage(dev.read(o[k], n, npdt), dt) for k, n in sizes.items()
                     if lstm or k not in ("cy", "dcx")}
    rtol, atol = TOL[dt]
    for k, ref in out[E.PYDNN_RNN_ALGO_STANDARD].items():
        got = out[PS][k]
        assert not np.isnan(got).any(), f"{k}: NaN"
        scale = max(1.0, float(np.abs(ref).max()))
        err = np.abs(got - ref)
        bad = err > 2 * (atol * scale + rtol * np.abs(ref))  # two roundings of the same value
        assert not bad.any(), f"{k}: {bad.sum()} of {bad.size} off, max err {err.max():.3g} (scale {scale:.3g})"


def test_persist_not_supported_reasons(handle):
    r = pydnn.create_rnn_descriptor()
    pydnn.set_rnn_descriptor_v8(r, PS, E.PYDNN_LSTM, E.PYDNN_RNN_DOUBLE_BIAS, E.PYDNN_UNIDIRECTIONAL,
                                E.PYDNN_LINEAR_INPUT, F32, F32, E.PYDNN_DEFAULT_MATH, 64, 2048, 2048, 1, None, 1)
    xd = pydnn.create_rnn_data_descriptor()
    pydnn.set_rnn_data_descriptor(xd, F32, 0, 4, 64, 64, [4] * 64, None)
    with pytest.raises(PydnnError) as e:
        pydnn.get_rnn_temp_space_sizes(handle, r, E.PYDNN_FWD_MODE_INFERENCE, xd)
    assert e.value.status == E.PYDNN_STATUS_NOT_SUPPORTED and "shared memory" in str(e.value)


# persist_fwd_r (tuning.rnn.PERSIST_REG, the default for 16-bit data where persist.reg_shape allows) on shapes
# the cases above leave out: 2 row tiles x 4 K slices at issue 16's small shape (batch 32, hidden 256), 4 x 2
# (batch 64: two combos a thread), 1 x 8 (batch 16, hidden 512 and 1024: 8 k steps a warp, 128 blocks), one
# slice (hidden 32: 4 combos a thread, one warp busy); SKIP_INPUT, no matmul
MID_REG = {
    "reg-lstm-f16-256-batch-32": _c(dtype=F16, hidden=256, skip=True, lengths=(10,) * 29 + (7, 3, 1), T=10,
                                    weights=False),
    "reg-lstm-bf16-256-batch-64-bi": _c(dtype=BF16, hidden=256, skip=True, dirs=2, lengths=(6, 5, 6, 2) * 16, T=6,
                                        weights=False),
    "reg-gru-f16-512-batch-16": _c(cell=E.PYDNN_GRU, dtype=F16, hidden=512, skip=True, lengths=(5, 5, 4, 1) * 4,
                                        T=5, weights=False),
    "reg-lstm-f16-1024-batch-16-clip": _c(dtype=F16, hidden=1024, skip=True, lengths=(4, 3) * 8, T=4,
                                          clip=(-0.5, 0.6), weights=False),
    "reg-tanh-bf16-32-batch-7-nostate": _c(cell=E.PYDNN_RNN_TANH, dtype=BF16, hidden=32, skip=True, states=False,
                                           lengths=(5, 1, 5, 4, 2, 5, 3), T=5, weights=False),
}


@pytest.mark.parametrize("reg,xchg,bwd,one", [(True, False, False, False), (True, True, False, False),
                                              (False, False, False, False), (True, False, True, False),
                                              (True, False, False, True), (True, False, True, True)],
                         ids=["reg", "reg-xchg", "general", "reg-bwd", "reg-one", "defaults"])
@pytest.mark.parametrize("name", list(MID_REG))
def test_persist_reg_shapes(name, reg, xchg, bwd, one, handle, monkeypatch):
    """reg-xchg: persist_fwd_r's tagged exchange where KR is 4 (batch 32 hidden 256, batch 16 hidden 512, hidden
    32), the barrier elsewhere."""
    from pydnn import tuning
    from pydnn.ops.rnn import persist
    monkeypatch.setattr(tuning.rnn, "PERSIST_REG", reg)
    monkeypatch.setattr(tuning.rnn, "PERSIST_REG_XCHG", xchg)
    monkeypatch.setattr(tuning.rnn, "PERSIST_BWD_REG", bwd)  # persist_bwd_r where bwd_reg_shape allows
    monkeypatch.setattr(tuning.rnn, "PERSIST_REG_ONE", one)  # the ONE instance where 4 or 8 K slices, KR 4
    c = MID_REG[name]
    assert persist.reg_shape({F16: "f16", BF16: "bf16"}[c.dtype], len(c.lengths), c.hidden, 8)
    run_case(handle, GpuDevice(), c)
