"""The legacy MHA layer's recorded plans on the GPU (pydnn/ops/_replay.py): a training step (forward,
backward data, backward weights) made with plans off, then with plans on at other addresses (the plan made
with one set of buffers, replayed with its pointers patched for another, and again), and in place of the
same buffers (self-attention: queries = keys = values): every output equals the plans-off one bit for bit
(the same kernels on the same inputs; the backward runs deterministically)."""
import pytest

import pydnn
from pydnn import tuning

pytestmark = pytest.mark.gpu

T_, B_, M_, V_ = (pydnn.PYDNN_SEQDATA_TIME_DIM, pydnn.PYDNN_SEQDATA_BATCH_DIM, pydnn.PYDNN_SEQDATA_BEAM_DIM,
                  pydnn.PYDNN_SEQDATA_VECT_DIM)
BF16 = pydnn.PYDNN_DATA_BFLOAT16


def _layer(h, batch, seq, emb, heads, causal):
    d = pydnn.create_seq_data_descriptor()
    dims = [0] * 4
    dims[T_], dims[B_], dims[M_], dims[V_] = seq, batch, 1, emb
    pydnn.set_seq_data_descriptor(d, BF16, 4, dims, [B_, M_, T_, V_], batch, [seq] * batch, None)
    a = pydnn.create_attn_descriptor()
    pydnn.set_attn_descriptor(a, pydnn.PYDNN_ATTN_QUERYMAP_ONE_TO_ONE | pydnn.PYDNN_ATTN_ENABLE_PROJ_BIASES, heads,
                              (emb // heads) ** -0.5, BF16, pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_TENSOR_OP_MATH,
                              None, None, emb, emb, emb, emb // heads, emb // heads, emb // heads, emb, seq, seq,
                              batch, 1)
    lo = [0] * seq
    hi = [t + 1 for t in range(seq)] if causal else [seq] * seq
    return a, d, lo, hi


def _step(torch, h, a, d, lo, hi, sizes, buf, self_attn):
    wsize, wssize, rssize = sizes
    p = {k: v.data_ptr() for k, v in buf.items()}
    k_, v_ = (p["q"], p["q"]) if self_attn else (p["k"], p["v"])
    pydnn.multi_head_attn_forward(h, a, -1, lo, hi, p["lens"], p["lens"], d, p["q"], None, d, k_, d, v_, d, p["o"],
                                  wsize, p["w"], wssize, p["ws"], rssize, p["rs"])
    pydnn.multi_head_attn_backward_data(h, a, lo, hi, p["lens"], p["lens"], d, p["do"], d, p["dq"], p["q"], d,
                                        p["dk"], k_, d, p["dv"], v_, wsize, p["w"], wssize, p["ws"], rssize,
                                        p["rs"])
    pydnn.multi_head_attn_backward_weights(h, a, pydnn.PYDNN_WGRAD_MODE_SET, d, p["q"], d, k_, d, v_, d, p["do"],
                                           wsize, p["w"], p["dw"], wssize, p["ws"], rssize, p["rs"])
    pydnn.multi_head_attn_forward(h, a, -1, lo, hi, p["lens"], p["lens"], d, p["q"], None, d, k_, d, v_, d, p["oi"],
                                  wsize, p["w"], wssize, p["ws"], 0, None)  # inference
    torch.cuda.synchronize()
    return {k: buf[k].clone() for k in ("o", "oi", "dq", "dk", "dv", "dw")}


def _buffers(torch, src, batch, seq, emb, sizes):
    wsize, wssize, rssize = sizes
    n = batch * seq * emb
    b = {k: torch.empty(n, dtype=torch.bfloat16, device="cuda") for k in ("q", "k", "v", "do")}
    for k in b:
        b[k].copy_(src[k])
    b.update({k: torch.full((n,), float("nan"), dtype=torch.bfloat16, device="cuda")
              for k in ("o", "oi", "dq", "dk", "dv")})
    b["w"] = src["w"].clone()
    b["dw"] = torch.full_like(b["w"], float("nan"))
    b["ws"] = torch.empty(max(wssize, 16), dtype=torch.uint8, device="cuda")
    b["rs"] = torch.empty(max(rssize, 16), dtype=torch.uint8, device="cuda")
    b["lens"] = src["lens"].clone()
    return b


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("self_attn", [False, True])
def test_replayed_plans_match_the_full_calls(handle, causal, self_attn):
    torch = pytest.importorskip("torch")
    batch, seq, emb, heads = 2, 96, 256, 4
    pydnn.set_stream(handle, torch.cuda.current_stream().cuda_stream)
    a, d, lo, hi = _layer(handle, batch, seq, emb, heads, causal)
    sizes = pydnn.get_multi_head_attn_buffers(handle, a)
    g = torch.Generator(device="cuda").manual_seed(7)
    n = batch * seq * emb
    src = {k: torch.randn(n, generator=g, device="cuda").to(torch.bfloat16) for k in ("q", "k", "v", "do")}
    src["w"] = (torch.randn(sizes[0] // 2, generator=g, device="cuda") * emb ** -0.5).to(torch.bfloat16)
    # full lengths: padded rows would be computed from uninitialised workspace, different in every run
    src["lens"] = torch.full((batch,), seq, dtype=torch.int32, device="cuda")
    try:
        tuning.callpath.MHA_PLANS = False
        want = _step(torch, handle, a, d, lo, hi, sizes, _buffers(torch, src, batch, seq, emb, sizes), self_attn)
        tuning.callpath.MHA_PLANS = True
        for _ in range(3):  # a plan made at the first buffers' addresses, then replayed at new ones, patched
            got = _step(torch, handle, a, d, lo, hi, sizes, _buffers(torch, src, batch, seq, emb, sizes), self_attn)
            for k in want:
                assert torch.equal(got[k].view(torch.int16), want[k].view(torch.int16)), k
        keep = _buffers(torch, src, batch, seq, emb, sizes)
        for _ in range(2):  # the same addresses again: replayed without patching
            got = _step(torch, handle, a, d, lo, hi, sizes, keep, self_attn)
            for k in want:
                assert torch.equal(got[k].view(torch.int16), want[k].view(torch.int16)), k
    finally:
        tuning.callpath.reset()
