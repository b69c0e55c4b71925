"""RNN descriptors, the weight-space layout, the size queries and every validation path of the RNN calls,
on the CPU (the calls fail before touching the GPU; a handle record stands in for a real one)."""
import os
import sys

import numpy as np
import pytest

import pydnn
from pydnn import enums as E
from pydnn.status import PydnnError

sys.path.insert(0, os.path.dirname(__file__))
from rnn_emulator import fake_handle  # noqa: E402

F32, F16, F64 = E.PYDNN_DATA_FLOAT, E.PYDNN_DATA_HALF, E.PYDNN_DATA_DOUBLE
BAD, NS = E.PYDNN_STATUS_BAD_PARAM, E.PYDNN_STATUS_NOT_SUPPORTED


def rnn(cell=E.PYDNN_LSTM, bias=E.PYDNN_RNN_DOUBLE_BIAS, dirs=1, skip=False, dt=F32, prec=F32, I=5, H=8, P=None,
        L=2, algo=E.PYDNN_RNN_ALGO_STANDARD, drop=None, aux=E.PYDNN_RNN_PADDED_IO_ENABLED, math=E.PYDNN_DEFAULT_MATH):
    d = pydnn.create_rnn_descriptor()
    pydnn.set_rnn_descriptor_v8(d, algo, cell, bias, E.PYDNN_BIDIRECTIONAL if dirs == 2 else E.PYDNN_UNIDIRECTIONAL,
                                E.PYDNN_SKIP_INPUT if skip else E.PYDNN_LINEAR_INPUT, dt, prec, math, I, H,
                                H if P is None else P, L, drop, aux)
    return d


def data(vec, lengths=(3, 2), T=3, dt=F32, layout=E.PYDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED, fill=None):
    d = pydnn.create_rnn_data_descriptor()
    pydnn.set_rnn_data_descriptor(d, dt, layout, T, len(lengths), vec, list(lengths), fill)
    return d


def raises(status, words, fn, *a, **kw):
    with pytest.raises(PydnnError) as e:
        fn(*a, **kw)
    assert e.value.status == status, e.value
    for w in words:
        assert w in str(e.value), (w, str(e.value))
    return e.value


def test_rnn_descriptor_round_trip_and_clip():
    d = rnn(cell=E.PYDNN_LSTM, bias=E.PYDNN_RNN_SINGLE_REC_BIAS, dirs=2, dt=F16, prec=F16, I=7, H=16, P=12, L=3,
            math=E.PYDNN_TENSOR_OP_MATH)
    assert pydnn.get_rnn_descriptor_v8(d) == (E.PYDNN_RNN_ALGO_STANDARD, E.PYDNN_LSTM, E.PYDNN_RNN_SINGLE_REC_BIAS,
                                              E.PYDNN_BIDIRECTIONAL, E.PYDNN_LINEAR_INPUT, F16, F16,
                                              E.PYDNN_TENSOR_OP_MATH, 7, 16, 12, 3, None, 1)
    assert pydnn.rnn_get_clip_v9(d) == (E.PYDNN_RNN_CLIP_NONE, E.PYDNN_NOT_PROPAGATE_NAN, 0.0, 0.0)
    pydnn.rnn_set_clip_v9(d, E.PYDNN_RNN_CLIP_MINMAX, E.PYDNN_PROPAGATE_NAN, -2.5, 3.0)
    assert pydnn.rnn_get_clip_v9(d) == (E.PYDNN_RNN_CLIP_MINMAX, E.PYDNN_PROPAGATE_NAN, -2.5, 3.0)
    pydnn.set_rnn_descriptor_v8(d, 0, E.PYDNN_LSTM, 2, 0, 0, F32, F32, 0, 4, 4, 4, 1, None, 0)
    assert pydnn.rnn_get_clip_v9(d)[0] == E.PYDNN_RNN_CLIP_NONE  # a Set resets the clip
    pydnn.destroy_rnn_descriptor(d)
    raises(BAD, ["rnnDesc", "live"], pydnn.get_rnn_descriptor_v8, d)
    raises(BAD, ["never set"], pydnn.get_rnn_descriptor_v8, pydnn.create_rnn_descriptor())


@pytest.mark.parametrize("kw,status,words", [
    (dict(algo=7), BAD, ["algo", "pydnnRNNAlgo_t"]),
    (dict(cell=4), BAD, ["cellMode"]),
    (dict(bias=9), BAD, ["biasMode"]),
    (dict(math=9), BAD, ["mathType"]),
    (dict(H=0), BAD, ["hiddenSize", "positive"]),
    (dict(L=0), BAD, ["numLayers"]),
    (dict(I=-1), BAD, ["inputSize"]),
    (dict(P=9), BAD, ["projSize", "larger than hiddenSize"]),
    (dict(cell=E.PYDNN_GRU, P=4), BAD, ["projSize", "only for LSTM"]),
    (dict(cell=E.PYDNN_RNN_TANH, P=4), BAD, ["projSize", "only for LSTM"]),
    (dict(skip=True, I=5, H=8), BAD, ["inputSize", "SKIP_INPUT"]),
    (dict(aux=2), BAD, ["auxFlags"]),
    (dict(dt=E.PYDNN_DATA_INT8), NS, ["dataType"]),
    (dict(dt=77), BAD, ["dataType"]),
    (dict(dt=F32, prec=F16), NS, ["mathPrec"]),
    (dict(dt=F64, prec=F32), NS, ["mathPrec"]),
    (dict(drop=object()), BAD, ["dropoutDesc"]),
])
def test_rnn_descriptor_errors_name_the_argument(kw, status, words):
    raises(status, words, rnn, **kw)


def test_half_may_compute_in_float_and_dropout_descriptor_round_trips():
    rnn(dt=F16, prec=F32)
    rnn(dt=E.PYDNN_DATA_BFLOAT16, prec=F32)
    dd = pydnn.create_dropout_descriptor()
    raises(BAD, ["dropoutDesc", "never set"], rnn, drop=dd)


def test_clip_errors():
    d = rnn(cell=E.PYDNN_GRU)
    raises(BAD, ["clipMode", "LSTM"], pydnn.rnn_set_clip_v9, d, E.PYDNN_RNN_CLIP_MINMAX, 0, -1.0, 1.0)
    pydnn.rnn_set_clip_v9(d, E.PYDNN_RNN_CLIP_NONE, 0, 0.0, 0.0)
    d = rnn()
    raises(BAD, ["lclip"], pydnn.rnn_set_clip_v9, d, E.PYDNN_RNN_CLIP_MINMAX, 0, 2.0, 1.0)
    raises(BAD, ["clipMode"], pydnn.rnn_set_clip_v9, d, 5, 0, 0.0, 1.0)
    raises(BAD, ["clipNanOpt"], pydnn.rnn_set_clip_v9, d, 1, 7, 0.0, 1.0)


@pytest.mark.parametrize("layout", [0, 1, 2])
def test_data_descriptor_round_trip(layout):
    d = data(6, (5, 3, 3, 1), T=5, layout=layout, fill=-1.5)
    assert pydnn.get_rnn_data_descriptor(d, 10) == (F32, layout, 5, 4, 6, [5, 3, 3, 1], -1.5)
    assert pydnn.get_rnn_data_descriptor(d, 2)[5] == [5, 3]
    assert d.rows() == (12 if layout == 1 else 20)
    assert d.packed_offsets() == [0, 4, 7, 10, 11]


@pytest.mark.parametrize("args,status,words", [
    ((F32, 0, 3, 2, 4, [3, 0], None), BAD, ["seqLengthArray[1]", "outside [1, 3]"]),
    ((F32, 0, 3, 2, 4, [4, 1], None), BAD, ["seqLengthArray[0]", "outside [1, 3]"]),
    ((F32, 1, 3, 2, 4, [2, 3], None), BAD, ["seqLengthArray[1]", "decreasing"]),
    ((F32, 0, 3, 2, 4, [3], None), BAD, ["seqLengthArray", "batchSize 2"]),
    ((F32, 3, 3, 2, 4, [3, 3], None), BAD, ["layout"]),
    ((F32, 0, 0, 2, 4, [3, 3], None), BAD, ["maxSeqLength"]),
    ((F32, 0, 3, 0, 4, [], None), BAD, ["batchSize"]),
    ((F32, 0, 3, 2, 0, [3, 3], None), BAD, ["vectorSize"]),
    ((E.PYDNN_DATA_INT32, 0, 3, 2, 4, [3, 3], None), NS, ["dataType"]),
    ((F32, 0, 3, 2, 4, [3, 3], "x"), BAD, ["paddingFill"]),
])
def test_data_descriptor_errors(args, status, words):
    raises(status, words, pydnn.set_rnn_data_descriptor, pydnn.create_rnn_data_descriptor(), *args)


TORCH_SHAPES = [  # cell, I, H, layers, bidirectional, proj, bias
    (E.PYDNN_LSTM, 10, 16, 2, True, 0, True), (E.PYDNN_LSTM, 10, 16, 3, False, 6, True),
    (E.PYDNN_LSTM, 10, 16, 2, True, 5, False), (E.PYDNN_GRU, 7, 12, 2, True, 0, True),
    (E.PYDNN_GRU, 7, 12, 1, False, 0, False), (E.PYDNN_RNN_TANH, 3, 9, 3, True, 0, True),
    (E.PYDNN_RNN_RELU, 3, 9, 1, False, 0, False)]


@pytest.mark.parametrize("shape", TORCH_SHAPES)
def test_weight_space_matches_pytorch_parameter_count_and_shapes(shape):
    """The weight space holds exactly PyTorch's parameters, part for part (each GetRNNWeightParams region
    has the shape of the slice of PyTorch's tensor it stands for), without overlap or gap."""
    torch = pytest.importorskip("torch")
    cell, I, H, L, bi, P, bias = shape
    dirs = 2 if bi else 1
    d = rnn(cell=cell, I=I, H=H, L=L, dirs=dirs, P=P or H,
            bias=E.PYDNN_RNN_DOUBLE_BIAS if bias else E.PYDNN_RNN_NO_BIAS)
    kw = dict(num_layers=L, bidirectional=bi, bias=bias)
    mod = (torch.nn.LSTM(I, H, proj_size=P, **kw) if cell == E.PYDNN_LSTM else torch.nn.GRU(I, H, **kw)
           if cell == E.PYDNN_GRU else torch.nn.RNN(I, H, **kw))
    n = sum(p.numel() for p in mod.parameters())
    h = fake_handle()
    size = pydnn.get_rnn_weight_space_size(h, d)
    assert size == 4 * n
    base = 1 << 30
    md, bd = pydnn.create_tensor_descriptor(), pydnn.create_tensor_descriptor()
    covered = np.zeros(size // 4, int)
    G = {E.PYDNN_LSTM: 4, E.PYDNN_GRU: 3}.get(cell, 1)
    sd = mod.state_dict()
    for pl in range(L * dirs):
        sfx = f"l{pl // dirs}" + ("_reverse" if pl % dirs else "")
        for lin in range(9 if cell == E.PYDNN_LSTM else 2 * G):
            ma, ba = pydnn.get_rnn_weight_params(h, d, pl, size, base, lin, md, bd)
            if lin == 8:
                want = sd.get(f"weight_hr_{sfx}")
                assert (ma != 0) == (want is not None) and ba == 0
                if want is None:
                    assert pydnn.get_tensor_nd_descriptor(md, 3)[1] == 0
                    continue
                rows, cols = want.shape
            else:
                w = sd[f"weight_{'ih' if lin < G else 'hh'}_{sfx}"]
                rows, cols = w.shape[0] // G, w.shape[1]
            _, nb, dims, strides = pydnn.get_tensor_nd_descriptor(md, 3)
            assert (nb, dims, strides) == (3, [1, rows, cols], [rows * cols, cols, 1])
            o = (ma - base) // 4
            covered[o:o + rows * cols] += 1
            if lin < 8:
                assert (ba != 0) == bias
                if bias:
                    assert pydnn.get_tensor_nd_descriptor(bd, 3)[2] == [1, H, 1]
                    o = (ba - base) // 4
                    covered[o:o + H] += 1
    assert (covered == 1).all()


def test_weight_params_absent_parts_and_errors():
    h = fake_handle()
    d = rnn(cell=E.PYDNN_GRU, skip=True, I=8, H=8, bias=E.PYDNN_RNN_SINGLE_INP_BIAS, L=2)
    size = pydnn.get_rnn_weight_space_size(h, d)
    # layer 0: no input matrices (SKIP_INPUT) but input biases; no recurrent biases anywhere
    assert size == 4 * (3 * 8 * 8 + 3 * 8 + (3 * 8 * 8 * 2 + 3 * 8))
    md = pydnn.create_tensor_descriptor()
    ma, ba = pydnn.get_rnn_weight_params(h, d, 0, size, 4096, 0, md, None)
    assert ma == 0 and ba == 4096 + 4 * 3 * 8 * 8 and pydnn.get_tensor_nd_descriptor(md, 3)[1] == 0
    ma, ba = pydnn.get_rnn_weight_params(h, d, 0, size, 4096, 4, None, None)
    assert ma == 4096 + 4 * 8 * 8 and ba == 0
    ma, _ = pydnn.get_rnn_weight_params(h, d, 1, size, 4096, 0, None, None)
    assert ma != 0
    raises(BAD, ["pseudoLayer", "[0, 2)"], pydnn.get_rnn_weight_params, h, d, 2, size, 4096, 0, None, None)
    raises(BAD, ["linLayerID", "[0, 6)"], pydnn.get_rnn_weight_params, h, d, 0, size, 4096, 6, None, None)
    raises(BAD, ["weightSpaceSize"], pydnn.get_rnn_weight_params, h, d, 0, size - 4, 4096, 0, None, None)
    raises(BAD, ["mDesc"], pydnn.get_rnn_weight_params, h, d, 0, size, 4096, 0, object(), None)
    raises(BAD, ["handle"], pydnn.get_rnn_weight_params, None, d, 0, size, 4096, 0, None, None)


def test_temp_space_sizes():
    h = fake_handle()
    d = rnn(I=5, H=8, L=2, dirs=2)
    x = data(5, (3, 2))
    ws_i, rs_i = pydnn.get_rnn_temp_space_sizes(h, d, E.PYDNN_FWD_MODE_INFERENCE, x)
    ws_t, rs_t = pydnn.get_rnn_temp_space_sizes(h, d, E.PYDNN_FWD_MODE_TRAINING, x)
    assert rs_i == 0 and rs_t > 0 and ws_i > 0 and ws_t > 0
    raises(BAD, ["xDesc", "vectorSize 6", "inputSize 5"], pydnn.get_rnn_temp_space_sizes, h, d, 0, data(6))
    raises(BAD, ["xDesc", "data type"], pydnn.get_rnn_temp_space_sizes, h, d, 0, data(5, dt=F16))
    raises(BAD, ["fwdMode"], pydnn.get_rnn_temp_space_sizes, h, d, 2, x)


def test_build_rnn_dynamic():
    h = fake_handle()
    pydnn.build_rnn_dynamic(h, rnn(), 4)
    raises(NS, ["PERSIST_DYNAMIC"], pydnn.build_rnn_dynamic, h, rnn(algo=E.PYDNN_RNN_ALGO_PERSIST_DYNAMIC), 4)
    raises(BAD, ["miniBatch"], pydnn.build_rnn_dynamic, h, rnn(), 0)


class _Fwd:
    """Arguments of a valid RNNForward (L=2 bidirectional LSTM, fp32) whose pointers are never touched: each
    test breaks one thing and checks the call fails naming it, before any launch."""

    def __init__(self, **kw):
        self.h = fake_handle()
        self.r = rnn(I=5, H=8, L=2, dirs=2, **kw)
        dt = kw.get("dt", F32)
        self.x, self.y = data(5, dt=dt), data(16, dt=dt)
        self.hd, self.cd = _hd([4, 2, 8], dt), _hd([4, 2, 8], dt)
        self.wsize = pydnn.get_rnn_weight_space_size(self.h, self.r)
        self.ws, self.rs = pydnn.get_rnn_temp_space_sizes(self.h, self.r, E.PYDNN_FWD_MODE_TRAINING, self.x)

    def args(self, **over):
        a = dict(handle=self.h, rnn_desc=self.r, fwd_mode=E.PYDNN_FWD_MODE_TRAINING, dev_seq_lengths=1 << 20,
                 x_desc=self.x, x=1 << 21, y_desc=self.y, y=1 << 22, h_desc=self.hd, hx=0, hy=0, c_desc=self.cd,
                 cx=0, cy=0, weight_space_size=self.wsize, weight_space=1 << 23, work_space_size=self.ws,
                 work_space=1 << 24, reserve_space_size=self.rs, reserve_space=1 << 25)
        a.update(over)
        return a


def _hd(dims, dt=F32):
    d = pydnn.create_tensor_descriptor()
    pydnn.set_tensor_nd_descriptor(d, dt, 3, dims, [dims[1] * dims[2], dims[2], 1])
    return d


@pytest.mark.parametrize("over,status,words", [
    (dict(y_desc="y16b"), BAD, ["yDesc", "vectorSize 12", "16"]),
    (dict(y_desc="ylen"), BAD, ["yDesc", "seqLengthArray"]),
    (dict(x_desc="x6"), BAD, ["xDesc", "inputSize"]),
    (dict(h_desc="h3"), BAD, ["hDesc", "dims"]),
    (dict(h_desc="hstride"), BAD, ["hDesc", "strides"]),
    (dict(h_desc="hf16"), BAD, ["hDesc", "data type"]),
    (dict(c_desc=None), BAD, ["cDesc", "NULL"]),
    (dict(c_desc="c7"), BAD, ["cDesc", "dims"]),
    (dict(work_space_size="small"), BAD, ["workSpaceSize", "less than"]),
    (dict(reserve_space_size="small"), BAD, ["reserveSpaceSize", "less than"]),
    (dict(weight_space_size="small"), BAD, ["weightSpaceSize", "less than"]),
    (dict(dev_seq_lengths=0), E.PYDNN_STATUS_BAD_PARAM_NULL_POINTER, ["devSeqLengths"]),
    (dict(dev_seq_lengths=(1 << 20) + 2), E.PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER, ["devSeqLengths"]),
    (dict(fwd_mode=3), BAD, ["fwdMode"]),
    (dict(work_space=(1 << 24) + 16), E.PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER, ["workSpace"]),
])
def test_forward_validation(over, status, words):
    f = _Fwd()
    subst = {"y16b": data(12), "ylen": data(16, (3, 1)), "x6": data(6), "h3": _hd([3, 2, 8]),
             "hf16": _hd([4, 2, 8], F16), "c7": _hd([4, 2, 7]), "small": None}
    hs = pydnn.create_tensor_descriptor()
    pydnn.set_tensor_nd_descriptor(hs, F32, 3, [4, 2, 8], [16, 8, 2])
    subst["hstride"] = hs
    a = f.args()
    for k, v in over.items():
        if v == "small":
            a[k] = a[k] - 1
        else:
            a[k] = subst.get(v, v) if isinstance(v, str) else v
    raises(status, words, pydnn.rnn_forward, *a.values())


def test_forward_not_supported():
    for kw, word in ((dict(algo=E.PYDNN_RNN_ALGO_PERSIST_DYNAMIC), "algo"),):
        f = _Fwd(**kw)
        raises(NS, [word], pydnn.rnn_forward, *f.args().values())
    # double runs on the plain path only (STANDARD; PERSIST_STATIC's kernels have no double instance): the size
    # query says so already; STANDARD double sizes its spaces (double state: 8-byte elements)
    r = rnn(I=5, H=8, L=2, dirs=2, algo=E.PYDNN_RNN_ALGO_PERSIST_STATIC, dt=F64, prec=F64)
    raises(NS, ["PERSIST_STATIC"], pydnn.get_rnn_temp_space_sizes, fake_handle(), r, E.PYDNN_FWD_MODE_TRAINING,
           data(5, dt=F64))
    f64, f32 = _Fwd(dt=F64, prec=F64), _Fwd()
    assert f64.rs > f32.rs and f64.ws > f32.ws


def test_gru_forward_needs_no_cdesc_and_backward_checks():
    f = _Fwd(cell=E.PYDNN_GRU)
    h = fake_handle()
    r = f.r
    # backward data: dy / dx buffers are validated like forward's; a too-small workspace is named
    raises(BAD, ["workSpaceSize"], pydnn.rnn_backward_data_v8, h, r, 1 << 20, f.y, 1 << 22, 1 << 22, f.x, 1 << 21,
           f.hd, 0, 0, 0, None, 0, 0, 0, f.wsize, 1 << 23, f.ws - 1, 1 << 24, f.rs, 1 << 25)
    raises(BAD, ["addGrad"], pydnn.rnn_backward_weights_v8, h, r, 5, 1 << 20, f.x, 1 << 21, f.hd, 0, f.y, 1 << 22,
           f.wsize, 1 << 23, f.ws, 1 << 24, f.rs, 1 << 25)
    raises(BAD, ["reserveSpaceSize"], pydnn.rnn_backward_weights_v8, h, r, 0, 1 << 20, f.x, 1 << 21, f.hd, 0, f.y,
           1 << 22, f.wsize, 1 << 23, f.ws, 1 << 24, f.rs - 1, 1 << 25)


def test_dropout_between_layers_takes_reserve_space_in_training_only():
    from pydnn.ops.dropout import DropoutDescriptor
    dd = DropoutDescriptor()  # a set dropout descriptor stands in (pydnn's setter needs the GPU)
    dd.is_set, dd.dropout = True, 0.5
    h = fake_handle()
    x = data(5, (3, 2))
    plain, drop = rnn(I=5, H=8, L=3, dirs=2), rnn(I=5, H=8, L=3, dirs=2, drop=dd)
    for mode in (E.PYDNN_FWD_MODE_INFERENCE, E.PYDNN_FWD_MODE_TRAINING):
        a = pydnn.get_rnn_temp_space_sizes(h, plain, mode, x)
        b = pydnn.get_rnn_temp_space_sizes(h, drop, mode, x)
        if mode == E.PYDNN_FWD_MODE_INFERENCE:
            assert a == b
        else:  # two layer boundaries: the dropped output (6 rows of 16, fp32) and its mask bits, 256-aligned
            assert b[0] == a[0] and b[1] == a[1] + 2 * (512 + 256)  # 384 bytes and 12 bytes, 256-aligned
