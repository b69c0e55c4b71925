"""The RNN family on the GPU (NOT YET RUN ON A GPU when written: the engine's Python and ptx/rnn.cu's own
source were checked on the CPU (test_rnn_engine_emulated_cpu.py, test_rnn_kernels_host_cpu.py: the
kernels compiled with g++ on an emulated device), and every kernel compiles with NVRTC for sm_80 / sm_90;
this file is the first real run).

1. rnn_harness.run_case on the device: every output poisoned, weights written through GetRNNWeightParams
   into a poisoned weight space, x / dy padding positions NaN; RNNForward (INFERENCE and TRAINING),
   RNNBackwardData_v8, RNNBackwardWeights_v8 (ADD) against the float64 reference.
2. PyTorch's nn.LSTM / nn.GRU / nn.RNN (cuDNN) state dicts copied in through GetRNNWeightParams: outputs,
   final states and (fp32) every gradient compared with PyTorch's autograd."""
import os
import sys

import pytest

import pydnn
from pydnn import enums as E

sys.path.insert(0, os.path.dirname(__file__))
from rnn_harness import Case, GpuDevice, run_case  # noqa: E402

pytestmark = pytest.mark.gpu

F32, F16, BF16 = E.PYDNN_DATA_FLOAT, E.PYDNN_DATA_HALF, E.PYDNN_DATA_BFLOAT16
PACKED, BATCH_MAJOR = E.PYDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED, E.PYDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED

CASES = {
    "lstm": Case(),
    "lstm-bi-2layer-nostate": Case(layers=2, dirs=2, states=False, lengths=(4, 2, 3), fill=-3.0),
    "lstm-proj-clip": Case(proj=5, clip=(-0.4, 0.5), layers=2, lengths=(4, 1, 3)),
    "lstm-proj-bi": Case(proj=3, dirs=2, layout=BATCH_MAJOR, fill=2.0),
    "gru-bi-packed": Case(cell=E.PYDNN_GRU, dirs=2, layers=2, layout=PACKED, lengths=(4, 4, 2)),
    "gru-skip-rec-bias": Case(cell=E.PYDNN_GRU, skip=True, bias_mode=E.PYDNN_RNN_SINGLE_REC_BIAS, dirs=2),
    "relu-nobias": Case(cell=E.PYDNN_RNN_RELU, bias_mode=E.PYDNN_RNN_NO_BIAS, layers=2),
    "tanh-inp-bias-batch-major": Case(cell=E.PYDNN_RNN_TANH, bias_mode=E.PYDNN_RNN_SINGLE_INP_BIAS,
                                      layout=BATCH_MAJOR, lengths=(1, 4, 2)),
    "lstm-skip-bi": Case(skip=True, dirs=2, layers=2),
    "lstm-half": Case(dtype=F16, dirs=2),
    "gru-dropout-3layer-bi": Case(cell=E.PYDNN_GRU, layers=3, dirs=2, dropout=0.4),
    "lstm-proj-dropout-packed": Case(proj=5, layers=2, dropout=0.3, layout=PACKED, lengths=(4, 3, 1)),
    "lstm-bf16": Case(dtype=BF16, dirs=2, layers=2),
    "gru-half-packed": Case(cell=E.PYDNN_GRU, dtype=F16, layout=PACKED, lengths=(6, 5, 5, 2), T=6),
    # sizes that take the tensor-core matmul's aligned path (multiples of 8) and more steps
    "lstm-half-64": Case(dtype=F16, hidden=64, input_size=32, lengths=(12, 9, 12, 3, 7, 12, 1, 5), T=12, layers=2,
                         dirs=2),
    "gru-bf16-64": Case(cell=E.PYDNN_GRU, dtype=BF16, hidden=64, input_size=48, lengths=(10,) * 8, T=10),
    "lstm-f32-64-proj": Case(hidden=64, input_size=40, proj=32, lengths=(9, 8, 8, 2), T=9, layers=2),
    "tanh-f32-96": Case(cell=E.PYDNN_RNN_TANH, hidden=96, input_size=17, lengths=(7, 3, 5), T=7, dirs=2),
}
F64 = E.PYDNN_DATA_DOUBLE
DOUBLE_CASES = {  # double on the plain path (STANDARD): ptx/gemm_f64.cu's GEMMs, double state and gate math
    "double-lstm-proj-clip": Case(dtype=F64, proj=5, clip=(-0.4, 0.5), layers=2, lengths=(4, 1, 3)),
    "double-lstm-bi-2layer-nostate": Case(dtype=F64, layers=2, dirs=2, states=False, lengths=(4, 2, 3), fill=-3.0),
    "double-gru-bi-packed": Case(dtype=F64, cell=E.PYDNN_GRU, dirs=2, layers=2, layout=PACKED, lengths=(4, 4, 2)),
    "double-relu-skip-rec-bias-batch-major": Case(dtype=F64, cell=E.PYDNN_RNN_RELU, skip=True,
                                                  bias_mode=E.PYDNN_RNN_SINGLE_REC_BIAS, layout=BATCH_MAJOR, fill=2.0),
    "double-tanh-dropout-3layer": Case(dtype=F64, cell=E.PYDNN_RNN_TANH, layers=3, dropout=0.3,
                                       bias_mode=E.PYDNN_RNN_SINGLE_INP_BIAS),
    "double-lstm-proj-bi-nobias": Case(dtype=F64, proj=3, dirs=2, bias_mode=E.PYDNN_RNN_NO_BIAS),
    # more than one 64 x 64 GEMM tile, K not a multiple of 16, and (batch 70) several cell blocks
    "double-lstm-96-big": Case(dtype=F64, hidden=96, input_size=37, lengths=(9,) * 40 + (5,) * 30, T=9, layers=2),
    "double-gru-80-bi": Case(dtype=F64, cell=E.PYDNN_GRU, hidden=80, input_size=19, lengths=(6, 2, 6, 5), T=6,
                             dirs=2),
}
CASES.update(DOUBLE_CASES)


@pytest.mark.parametrize("name", list(CASES))
def test_rnn_against_float64_reference(name, handle):
    run_case(handle, GpuDevice(), CASES[name])


# ----------------------------------------------------------------------------- PyTorch

def _module(torch, cell, I, H, L, bi, proj, dtype):
    kw = dict(num_layers=L, bidirectional=bi, bias=True, device="cuda", dtype=dtype)
    if cell == E.PYDNN_LSTM:
        return torch.nn.LSTM(I, H, proj_size=proj, **kw)
    if cell == E.PYDNN_GRU:
        return torch.nn.GRU(I, H, **kw)
    return torch.nn.RNN(I, H, nonlinearity="tanh" if cell == E.PYDNN_RNN_TANH else "relu", **kw)


def _torch_parts(mod, cell, L, dirs):
    """{(pseudo-layer, linLayerID, 'm' | 'b'): torch tensor (a view of the module's parameter)}."""
    G = {E.PYDNN_LSTM: 4, E.PYDNN_GRU: 3}.get(cell, 1)
    parts = {}
    for layer in range(L):
        for d in range(dirs):
            sfx = f"l{layer}" + ("_reverse" if d else "")
            pl = layer * dirs + d
            w_ih, w_hh = getattr(mod, f"weight_ih_{sfx}"), getattr(mod, f"weight_hh_{sfx}")
            b_ih, b_hh = getattr(mod, f"bias_ih_{sfx}"), getattr(mod, f"bias_hh_{sfx}")
            H = w_ih.shape[0] // G
            for k in range(G):
                parts[(pl, k, "m")] = w_ih[k * H:(k + 1) * H]
                parts[(pl, G + k, "m")] = w_hh[k * H:(k + 1) * H]
                parts[(pl, k, "b")] = b_ih[k * H:(k + 1) * H]
                parts[(pl, G + k, "b")] = b_hh[k * H:(k + 1) * H]
            if hasattr(mod, f"weight_hr_{sfx}"):
                parts[(pl, 8, "m")] = getattr(mod, f"weight_hr_{sfx}")
    return parts


TORCH_CASES = [  # cell, I, H, layers, bidirectional, proj, dtype name, lengths
    (E.PYDNN_LSTM, 24, 32, 2, True, 0, "float32", (7, 7, 5, 2)),
    (E.PYDNN_LSTM, 24, 32, 2, False, 16, "float32", (6, 6, 6)),
    (E.PYDNN_GRU, 16, 48, 2, True, 0, "float32", (5, 4, 4, 1)),
    (E.PYDNN_RNN_TANH, 8, 16, 3, True, 0, "float32", (4, 3)),
    (E.PYDNN_RNN_RELU, 8, 16, 1, False, 0, "float32", (4, 4)),
    (E.PYDNN_LSTM, 64, 128, 2, True, 0, "float16", (16, 12, 9, 3)),
    (E.PYDNN_GRU, 64, 128, 1, False, 0, "float16", (16, 16)),
]


@pytest.mark.parametrize("case", TORCH_CASES)
def test_pytorch_state_dict_copies_in(case, handle):
    torch = pytest.importorskip("torch")
    flags = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    try:
        _pytorch_case(torch, case, handle)
    finally:
        pydnn.set_stream(handle, 0)
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = flags


# issue 16's fp32 shape (batch 64, hidden 1024): the recurrent GEMMs split K 8 ways forward and 32 ways
# backward on 64 x 128 tiles (tuning.rnn.SPLIT_F32_TIME, engine.split_k), 4 / 16 ways on 128 x 128 tiles with it
# off; both against PyTorch's outputs and every gradient
@pytest.mark.parametrize("by_time", [True, False], ids=["split-by-time", "split-fill"])
def test_pytorch_fp32_batch_64_split_k(by_time, handle, monkeypatch):
    torch = pytest.importorskip("torch")
    from pydnn import tuning
    from pydnn.ops.rnn import engine
    monkeypatch.setattr(tuning.rnn, "SPLIT_F32_TIME", by_time)
    sm = handle.sm_count
    if by_time and sm >= 128:
        assert engine.split_k(64, 4096, 1024, sm, True) == 8 and engine.split_k(64, 1024, 4096, sm, True) == 32
    flags = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    try:
        _pytorch_case(torch, (E.PYDNN_LSTM, 256, 1024, 1, False, 0, "float32", (5,) * 40 + (4,) * 8 + (3,) * 8 + (1,) * 8),
                      handle)  # lengths in decreasing order (pack_padded_sequence's enforce_sorted)
    finally:
        pydnn.set_stream(handle, 0)
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = flags


def _pytorch_case(torch, case, handle):
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    cell, I, H, L, bi, proj, tname, lengths = case
    tdt = getattr(torch, tname)
    dt = F32 if tname == "float32" else F16
    dirs = 2 if bi else 1
    out = proj or H
    torch.manual_seed(0)
    mod = _module(torch, cell, I, H, L, bi, proj, tdt)
    T, B = max(lengths), len(lengths)
    lens = torch.tensor(lengths, dtype=torch.int64)
    stream = torch.cuda.current_stream().cuda_stream
    pydnn.set_stream(handle, stream)
    r = pydnn.create_rnn_descriptor()
    pydnn.set_rnn_descriptor_v8(r, E.PYDNN_RNN_ALGO_STANDARD, cell, E.PYDNN_RNN_DOUBLE_BIAS,
                                E.PYDNN_BIDIRECTIONAL if bi else E.PYDNN_UNIDIRECTIONAL, E.PYDNN_LINEAR_INPUT, dt, F32,
                                E.PYDNN_DEFAULT_MATH, I, H, proj or H, L, None, E.PYDNN_RNN_PADDED_IO_ENABLED)
    wsize = pydnn.get_rnn_weight_space_size(handle, r)
    w = torch.full((wsize // 2,), float("nan"), dtype=torch.float16, device="cuda").view(tdt)
    parts = _torch_parts(mod, cell, L, dirs)
    md, bd = pydnn.create_tensor_descriptor(), pydnn.create_tensor_descriptor()
    es = w.element_size()
    views = {}
    for (pl, lin, kind), tensor in parts.items():
        ma, ba = pydnn.get_rnn_weight_params(handle, r, pl, wsize, w, lin, md, bd)
        addr = ma if kind == "m" else ba
        assert addr, (pl, lin, kind)
        off = (addr - w.data_ptr()) // es
        v = w[off:off + tensor.numel()].view(tensor.shape)
        v.copy_(tensor.detach())
        views[(pl, lin, kind)] = off
    assert not torch.isnan(w).any(), "the weight space has a part PyTorch does not fill"
    x = torch.randn(T, B, I, device="cuda", dtype=tdt)
    hx = torch.randn(L * dirs, B, out, device="cuda", dtype=tdt) * 0.5
    cx = torch.randn(L * dirs, B, H, device="cuda", dtype=tdt) * 0.5
    xr = x.clone().requires_grad_(True)
    hr = hx.clone().requires_grad_(True)
    cr = cx.clone().requires_grad_(True)
    packed = torch.nn.utils.rnn.pack_padded_sequence(xr, lens)
    ty, th = mod(packed, (hr, cr) if cell == E.PYDNN_LSTM else hr)
    ty, _ = torch.nn.utils.rnn.pad_packed_sequence(ty, total_length=T)
    # pydnn, sequence-major padded
    xd, yd = pydnn.create_rnn_data_descriptor(), pydnn.create_rnn_data_descriptor()
    pydnn.set_rnn_data_descriptor(xd, dt, E.PYDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED, T, B, I, list(lengths), None)
    pydnn.set_rnn_data_descriptor(yd, dt, E.PYDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED, T, B, dirs * out,
                                  list(lengths), 0.0)
    hd, cd = pydnn.create_tensor_descriptor(), pydnn.create_tensor_descriptor()
    pydnn.set_tensor_nd_descriptor(hd, dt, 3, [L * dirs, B, out], [B * out, out, 1])
    pydnn.set_tensor_nd_descriptor(cd, dt, 3, [L * dirs, B, H], [B * H, H, 1])
    wss, rss = pydnn.get_rnn_temp_space_sizes(handle, r, E.PYDNN_FWD_MODE_TRAINING, xd)
    ws = torch.empty(wss, dtype=torch.uint8, device="cuda")
    rs = torch.empty(rss, dtype=torch.uint8, device="cuda")
    dlens = lens.to(torch.int32).cuda()
    y = torch.full((T, B, dirs * out), float("nan"), device="cuda", dtype=tdt)
    hy = torch.full_like(hx, float("nan"))
    cy = torch.full_like(cx, float("nan"))
    lstm = cell == E.PYDNN_LSTM
    pydnn.rnn_forward(handle, r, E.PYDNN_FWD_MODE_TRAINING, dlens, xd, x, yd, y, hd, hx, hy, cd, cx if lstm else 0,
                      cy if lstm else 0, wsize, w, wss, ws, rss, rs)
    torch.cuda.synchronize()
    tol = dict(rtol=2e-4, atol=2e-5) if dt == F32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(y.float(), ty.detach().float(), **tol)
    th_h = th[0] if lstm else th
    torch.testing.assert_close(hy.float(), th_h.detach().float(), **tol)
    if lstm:
        torch.testing.assert_close(cy.float(), th[1].detach().float(), **tol)
    if dt != F32:
        return
    # backward: gradients of sum(y * dy) + sum(hy * dhy) (+ sum(cy * dcy))
    dy = torch.randn_like(y)
    valid = (torch.arange(T, device="cuda")[:, None] < dlens[None, :])[:, :, None]
    dy = torch.where(valid, dy, torch.zeros_like(dy))
    dhy = torch.randn_like(hx)
    dcy = torch.randn_like(cx)
    loss = (ty * dy).sum() + (th_h * dhy).sum() + ((th[1] * dcy).sum() if lstm else 0)
    loss.backward()
    dx = torch.full_like(x, float("nan"))
    dhx = torch.full_like(hx, float("nan"))
    dcx = torch.full_like(cx, float("nan"))
    pydnn.rnn_backward_data_v8(handle, r, dlens, yd, y, dy, xd, dx, hd, hx, dhy, dhx, cd, cx if lstm else 0,
                               dcy if lstm else 0, dcx if lstm else 0, wsize, w, wss, ws, rss, rs)
    dw = torch.zeros_like(w)
    pydnn.rnn_backward_weights_v8(handle, r, E.PYDNN_WGRAD_MODE_ADD, dlens, xd, x, hd, hx, yd, y, wsize, dw, wss, ws,
                                  rss, rs)
    torch.cuda.synchronize()
    g = dict(rtol=1e-3, atol=1e-4)
    torch.testing.assert_close(torch.where(valid, dx, 0), torch.where(valid, xr.grad, 0), **g)
    torch.testing.assert_close(dhx, hr.grad, **g)
    if lstm:
        torch.testing.assert_close(dcx, cr.grad, **g)
    for (pl, lin, kind), tensor in parts.items():
        base = tensor._base if tensor._base is not None else tensor
        G = {E.PYDNN_LSTM: 4, E.PYDNN_GRU: 3}.get(cell, 1)
        if lin == 8:
            tg = base.grad
        else:
            k = lin % G
            tg = base.grad[k * H:(k + 1) * H]
        off = views[(pl, lin, kind)]
        got = dw[off:off + tensor.numel()].view(tensor.shape)
        torch.testing.assert_close(got, tg, **g, msg=lambda m: f"pseudo-layer {pl} linLayerID {lin} {kind}: {m}")


# ----------------------------------------------------------------------------- double, against PyTorch on the CPU

DOUBLE_TORCH_CASES = [  # cell, I, H, layers, bidirectional, proj, lengths
    (E.PYDNN_LSTM, 12, 16, 2, True, 0, (6, 6, 4, 2)),
    (E.PYDNN_LSTM, 12, 16, 2, False, 8, (5, 5, 3)),
    (E.PYDNN_GRU, 10, 24, 2, True, 0, (5, 4, 4, 1)),
    (E.PYDNN_RNN_TANH, 8, 16, 2, False, 0, (4, 3)),
]


@pytest.mark.parametrize("wave", [False, True], ids=["layers", "wave"])
@pytest.mark.parametrize("case", DOUBLE_TORCH_CASES)
def test_pytorch_double_cpu_state_dict_copies_in(case, wave, handle, monkeypatch):
    """A float64 PyTorch module on the CPU (no cuDNN: PyTorch's own math), its parameters copied in through
    GetRNNWeightParams: pydnn's double path on the GPU gives its outputs, final states and every gradient
    (rnn_harness.pytorch_double_case; its CPU twin runs the emulated device)."""
    torch = pytest.importorskip("torch")
    from pydnn import tuning
    from rnn_harness import pytorch_double_case
    monkeypatch.setattr(tuning.rnn, "WAVEFRONT", wave)  # (the unidirectional stacks, projections included)
    monkeypatch.setattr(tuning.rnn, "WAVE_CHUNK", 2)
    pytorch_double_case(torch, case, handle, GpuDevice())


# ----------------------------------------------------------------------------- the double GEMM itself

@pytest.mark.parametrize("ta,tb", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_gemm_f64_against_numpy(ta, tb, handle):
    """ptx/gemm_f64.cu: odd sizes (partial tiles, K not a multiple of 16), leading dimensions past the
    operands' widths, a batch with strides, alpha / beta / bias; C poisoned where beta = 0."""
    import numpy as np

    from pydnn._cuda import driver
    from pydnn.ops.rnn import gemm_f64
    from rnn_harness import GpuDevice
    dev = GpuDevice()
    rng = np.random.default_rng(7)
    for (m, n, k, batch, beta, bias) in ((70, 130, 37, 1, 0.0, False), (5, 3, 200, 3, 0.5, True),
                                         (129, 64, 16, 2, 0.0, True)):
        ra, ca = (k, m) if ta else (m, k)
        rb, cb = (n, k) if tb else (k, n)
        lda, ldb, ldc = ca + 3, cb + 1, n + 2
        sa, sb, sc = ra * lda + 5, rb * ldb + 2, m * ldc + 7
        A = rng.uniform(-1, 1, batch * sa)
        Bm = rng.uniform(-1, 1, batch * sb)
        C0 = rng.uniform(-1, 1, batch * sc)
        bv = rng.uniform(-1, 1, n)
        pa, pb, pc, pbias = dev.alloc(A.nbytes), dev.alloc(Bm.nbytes), dev.alloc(C0.nbytes), dev.alloc(bv.nbytes)
        dev.write(pa, A)
        dev.write(pb, Bm)
        dev.write(pbias, bv)
        if beta:
            dev.write(pc, C0)
        pl = gemm_f64.Plan(m, n, k, bool(ta), bool(tb), lda, ldb, ldc, batch, sa, sb, sc)
        prm = pl.params(pa, pb, pc, 1.5, beta, pbias if bias else 0)
        driver.launch_args(pl.function(handle), pl.grid, pl.block, 0, handle.cu_stream, driver.kernel_args(prm))
        got = dev.read(pc, batch * sc, np.float64)
        for z in range(batch):
            a = A[z * sa:z * sa + ra * lda].reshape(ra, lda)[:, :ca]
            b = Bm[z * sb:z * sb + rb * ldb].reshape(rb, ldb)[:, :cb]
            ref = 1.5 * ((a.T if ta else a) @ (b.T if tb else b))
            c0 = C0[z * sc:z * sc + m * ldc].reshape(m, ldc)[:, :n]
            if beta:
                ref = ref + beta * c0
            if bias:
                ref = ref + bv
            c = got[z * sc:z * sc + m * ldc].reshape(m, ldc)
            np.testing.assert_allclose(c[:, :n], ref, rtol=1e-13, atol=1e-13)
            if not beta:  # columns past n within the leading dimension: untouched (poison)
                assert np.isnan(c[:, n:]).all()
