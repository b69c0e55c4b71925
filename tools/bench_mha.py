"""Multi-head attention with projections (cuDNN's legacy MHA API, pydnn/ops/mha.py) vs the same layer
written in PyTorch (F.linear on cuBLAS for the four projections, scaled_dot_product_attention with its
default backend for the core), bf16, in the same run.

The layer: self-attention shapes with separate query / key / value inputs (B, S, E), nHeads heads of
head dim d = E / nHeads, projections Q, K, V to nHeads * d and O back to E, with biases; no mask and
causal. pydnn's weights live in its weight buffer (the layout pydnnGetMultiHeadAttnWeights describes);
PyTorch's weights are views of the same buffer, so each case also prints the largest difference between
the two outputs over the largest output (a check on the large shapes the tests do not reach).

FLOPs: projections 4 * 2 * B * S * E^2 forward (Q, K, V, O), attention 4 * B * H * S^2 * d (half of it
causal). A training step (forward with the reserve space + BackwardData + BackwardWeights in pydnn;
forward + autograd backward in PyTorch) counts 3x the projections and 3.5x the attention (backward of a
GEMM: two GEMMs; backward of the attention: 2.5x, the convention of bench_attention.py). The floor is
compute: 989 TFLOP/s dense bf16 (datasheet; wgmma), and the parts run on pydnn's matmul (~325 TFLOP/s on
4096^3, tools/bench_matmul.py) and its fused attention (~270, tools/bench_attention.py), so the layer's
expected rate is the flop-weighted harmonic mean of those two.

Host time (2026-11-23, fourth session): the run at 3e2cfd8 printed 1.88 ms of Python per inference forward
against 1.89 ms of GPU time (b2 s2048 e4096): host-bound, which explains why the same kernels read 337 and
189 TFLOP/s in two earlier runs. cProfile of the call on the CPU (a CPU-only handle, up to the first launch):
4.0 ms, 90% of it in the window arrays: each of the 2 x S entries converted by _int, then scanned in Python
for the fused mask. Now: plain-int lists pass a C-speed type check, and the mask is remembered per (windows,
lengths): 0.26 ms on that CPU. Measured at 2c02706: 0.26-0.36 ms of host time per call; the large layer's
inference 364 -> 510 TFLOP/s (0.49x -> 0.68x PyTorch) with the wgmma attention of the same commit; the small
layer (0.33 ms of GPU time) is still about host-bound.

Configurations: Llama-2-7B's attention layer (E 4096, 32 heads of 128) at batch 2, sequence 2048; a
BERT-large-like layer (E 1024, 16 heads of 64) at batch 8, sequence 1024.
"""
import time

import torch
import torch.nn.functional as F

import pydnn
from bench import time_ms

PEAK = 989.0
CONFIGS = [(2, 2048, 4096, 32), (8, 1024, 1024, 16)]  # batch, sequence, embedding, heads
T_, B_, M_, V_ = (pydnn.PYDNN_SEQDATA_TIME_DIM, pydnn.PYDNN_SEQDATA_BATCH_DIM, pydnn.PYDNN_SEQDATA_BEAM_DIM,
                  pydnn.PYDNN_SEQDATA_VECT_DIM)
BF16 = pydnn.PYDNN_DATA_BFLOAT16
KINDS = ("Q_WEIGHTS", "K_WEIGHTS", "V_WEIGHTS", "O_WEIGHTS", "Q_BIASES", "K_BIASES", "V_BIASES", "O_BIASES")


def _seq_desc(batch, seq, vect):
    """(batch, beam 1, time, vect) packed, batch outermost: torch's (B, S, E) tensors."""
    d = pydnn.create_seq_data_descriptor()
    dims = [0] * 4
    dims[T_], dims[B_], dims[M_], dims[V_] = seq, batch, 1, vect
    pydnn.set_seq_data_descriptor(d, BF16, 4, dims, [B_, M_, T_, V_], batch, [seq] * batch, None)
    return d


def _weight_views(h, a, w, wsize):
    """torch views of the Q / K / V / O weights and biases inside pydnn's weight buffer."""
    views = {}
    for kind in KINDS:
        wd = pydnn.create_tensor_descriptor()
        addr = pydnn.get_multi_head_attn_weights(h, a, getattr(pydnn, f"PYDNN_MH_ATTN_{kind}"), wsize, w.data_ptr(),
                                                 wd)
        _, _, dims, _ = pydnn.get_tensor_nd_descriptor(wd, 3)
        off = (addr - w.data_ptr()) // w.element_size()
        n = dims[0] * dims[1] * dims[2]
        # Q/K/V weights (H, d, E) row-major = an (H*d, E) matrix; O weights one (E, H*d) row-major matrix
        views[kind] = w[off:off + n].view(-1, dims[2]) if kind.endswith("WEIGHTS") and kind != "O_WEIGHTS" \
            else w[off:off + n]
    e = views["O_BIASES"].numel()
    views["O_WEIGHTS"] = views["O_WEIGHTS"].view(e, -1)
    return views


def _torch_layer(views, heads, causal):
    def layer(q, k, v):
        bsz, s, _ = q.shape
        split = lambda x: x.view(bsz, s, heads, -1).transpose(1, 2)  # noqa: E731
        qh = split(F.linear(q, views["Q_WEIGHTS"], views["Q_BIASES"]))
        kh = split(F.linear(k, views["K_WEIGHTS"], views["K_BIASES"]))
        vh = split(F.linear(v, views["V_WEIGHTS"], views["V_BIASES"]))
        o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=causal)
        return F.linear(o.transpose(1, 2).reshape(bsz, s, -1), views["O_WEIGHTS"], views["O_BIASES"])
    return layer


def run(b):
    h = b.h
    for batch, seq, emb, heads in CONFIGS:
        d = emb // heads
        q, k, v = (torch.randn(batch, seq, emb, dtype=torch.bfloat16, device="cuda") for _ in range(3))
        out, dout = torch.empty_like(q), torch.randn_like(q)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        desc = _seq_desc(batch, seq, emb)
        lens = torch.full((batch,), seq, dtype=torch.int32, device="cuda")
        for causal in (False, True):
            a = pydnn.create_attn_descriptor()
            pydnn.set_attn_descriptor(a, pydnn.PYDNN_ATTN_QUERYMAP_ONE_TO_ONE | pydnn.PYDNN_ATTN_ENABLE_PROJ_BIASES,
                                      heads, d ** -0.5, BF16, pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_TENSOR_OP_MATH,
                                      None, None, emb, emb, emb, d, d, d, emb, seq, seq, batch, 1)
            wsize, wssize, rssize = pydnn.get_multi_head_attn_buffers(h, a)
            w = torch.randn(wsize // 2, dtype=torch.bfloat16, device="cuda") * emb ** -0.5
            dw = torch.empty_like(w)
            ws = torch.empty(max(wssize, 16), dtype=torch.uint8, device="cuda")
            rs = torch.empty(max(rssize, 16), dtype=torch.uint8, device="cuda")
            lo = [0] * seq
            hi = [t + 1 for t in range(seq)] if causal else [seq] * seq
            ptr = {n: x.data_ptr() for n, x in dict(q=q, k=k, v=v, o=out, do=dout, dq=dq, dk=dk, dv=dv, w=w, dw=dw,
                                                    ws=ws, rs=rs, lens=lens).items()}

            def forward(train):
                pydnn.multi_head_attn_forward(h, a, -1, lo, hi, ptr["lens"], ptr["lens"], desc, ptr["q"], None, desc,
                                              ptr["k"], desc, ptr["v"], desc, ptr["o"], wsize, ptr["w"], wssize,
                                              ptr["ws"], rssize if train else 0, ptr["rs"] if train else None)

            def step():
                forward(True)
                pydnn.multi_head_attn_backward_data(h, a, lo, hi, ptr["lens"], ptr["lens"], desc, ptr["do"], desc,
                                                    ptr["dq"], ptr["q"], desc, ptr["dk"], ptr["k"], desc, ptr["dv"],
                                                    ptr["v"], wsize, ptr["w"], wssize, ptr["ws"], rssize, ptr["rs"])
                pydnn.multi_head_attn_backward_weights(h, a, pydnn.PYDNN_WGRAD_MODE_SET, desc, ptr["q"], desc,
                                                       ptr["k"], desc, ptr["v"], desc, ptr["do"], wsize, ptr["w"],
                                                       ptr["dw"], wssize, ptr["ws"], rssize, ptr["rs"])

            layer = _torch_layer(_weight_views(h, a, w, wsize), heads, causal)
            forward(False)
            with torch.no_grad():
                want = layer(q, k, v)
            err = ((out.float() - want.float()).abs().max() / want.float().abs().max()).item()

            leaves = [x.detach().requires_grad_() for x in (q, k, v)]
            wleaves = {n: x.detach().requires_grad_() for n, x in _weight_views(h, a, w, wsize).items()}
            tlayer = _torch_layer(wleaves, heads, causal)

            def torch_step():
                o = tlayer(*leaves)
                torch.autograd.grad(o, leaves + list(wleaves.values()), dout)

            proj = 8 * batch * seq * emb * emb
            attn = 4 * batch * heads * seq * seq * d * (0.5 if causal else 1.0)
            case = f"b{batch} s{seq} e{emb} h{heads} d{d}{' causal' if causal else ''}"
            print(f"  mha {case}: max |pydnn - torch| / max |torch| = {err:.2e}", flush=True)
            with torch.no_grad():
                ms_t = time_ms(lambda: layer(q, k, v))
            # host time per call (the Python work of one forward: validation, planning, launches), against
            # the GPU time below: a row whose host time is the larger is host-bound
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(10):
                forward(False)
            host_ms = (time.perf_counter() - t0) * 100
            torch.cuda.synchronize()
            ms_p = time_ms(lambda: forward(False))
            print(f"  mha {case}: host time per inference forward {host_ms:.2f} ms, GPU time {ms_p:.2f} ms "
                  f"(timed again: {time_ms(lambda: forward(False)):.2f} ms)", flush=True)
            b.row_flops("mha", f"forward (inference) {case}", "bf16", proj + attn, ms_p, ms_t, "linear + sdpa", PEAK)
            b.row_flops("mha", f"training step {case}", "bf16", 3 * proj + 3.5 * attn, time_ms(step),
                        time_ms(torch_step), "linear + sdpa + autograd", PEAK)
