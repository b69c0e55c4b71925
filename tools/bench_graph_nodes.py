"""Graph API node benchmark (issue 22, the normalization fusion): device events, medians of alternating rounds
(bench.time_pair), GB/s of the bytes the op must move (x read, y written) against a device-to-device copy.

Rows (layer norm over the last dim, scale / bias fp32, then y * s2 + b2 and GELU):
  fused       the graph as ONE launch (the normalization kernel with the generated epilogue)
  nodes       the same graph on the node engine (the norm call, then three pointwise kernels)
  plain LN    pydnn's norm_forward_inference alone (what the fusion adds to)
  torch       F.gelu(F.layer_norm(x, (d,), w, b) * s2 + b2), eager

    python tools/bench_graph_nodes.py [--quick]      (about 10 s on an H100 / H200 after the compiles;
                                                       --quick: bf16 16384 x 4096, fused and torch only)
"""
import argparse

import torch
import torch.nn.functional as F

import pydnn
from bench import time_pair
from pydnn.graph import Graph

TDT = {pydnn.PYDNN_DATA_BFLOAT16: torch.bfloat16, pydnn.PYDNN_DATA_HALF: torch.float16,
       pydnn.PYDNN_DATA_FLOAT: torch.float32}
NAME = {pydnn.PYDNN_DATA_BFLOAT16: "bf16", pydnn.PYDNN_DATA_HALF: "fp16", pydnn.PYDNN_DATA_FLOAT: "fp32"}


def ln_graph(h, io, n, d, mode):
    g = Graph(io_data_type=io, handle=h)
    x = g.tensor(name="x", dim=[n, d])
    sc = g.tensor(name="scale", dim=[1, d], data_type=pydnn.PYDNN_DATA_FLOAT)
    b = g.tensor(name="bias", dim=[1, d], data_type=pydnn.PYDNN_DATA_FLOAT)
    y, _, _ = g.layernorm(x, sc, b, 1e-5, norm_forward_phase=pydnn.PYDNN_NORM_FWD_INFERENCE)
    s2, b2 = g.tensor(name="s2", dim=[1, d]), g.tensor(name="b2", dim=[1, d])
    g.gelu(g.add(g.mul(y, s2), b2)).set_output(True).set_name("out")
    g.build_operation_graph().create_execution_plans([mode]).build_plans()
    return g


def bench(h, io, n, d, copy_ms, quick):
    t = TDT[io]
    x = torch.randn(n, d, device="cuda", dtype=t)
    w, b = torch.rand(d, device="cuda") + 0.5, torch.randn(d, device="cuda")
    s2, b2 = torch.randn(d, device="cuda", dtype=t), torch.randn(d, device="cuda", dtype=t)
    out = torch.empty_like(x)
    fused = ln_graph(h, io, n, d, pydnn.PYDNN_HEUR_MODE_A)
    assert fused.engine_index() == 1 and fused.launches() == 1
    bufs = {"x": x.data_ptr(), "scale": w.data_ptr(), "bias": b.data_ptr(), "s2": s2.data_ptr(),
            "b2": b2.data_ptr(), "out": out.data_ptr()}
    nd = pydnn.create_norm_descriptor()
    pydnn.set_norm_descriptor(nd, pydnn.PYDNN_NORM_KIND_LAYER, 1, 1, 1e-5, None)
    xd = pydnn.create_tensor_descriptor()
    pydnn.set_tensor_nd_descriptor(xd, io, 2, [n, d], [d, 1])
    sbd = pydnn.create_tensor_descriptor()
    pydnn.set_tensor_nd_descriptor(sbd, pydnn.PYDNN_DATA_FLOAT, 2, [1, d], [d, 1])

    def plain():
        pydnn.norm_forward_inference(h, nd, 1.0, 0.0, xd, x.data_ptr(), xd, out.data_ptr(), sbd, w.data_ptr(),
                                     b.data_ptr())

    def torch_ref():
        return F.gelu(F.layer_norm(x, (d,), w.to(t), b.to(t)) * s2 + b2)

    rounds = 3 if quick else 6
    nbytes = 2 * x.numel() * x.element_size()
    res = {}
    res["fused"], res["torch"] = time_pair(lambda: fused.execute(bufs, 0), torch_ref, rounds=rounds)
    if not quick:  # (these load the install-time normalization unit: a long first compile when it is cold)
        nodes = ln_graph(h, io, n, d, pydnn.PYDNN_HEUR_MODE_FALLBACK)
        assert nodes.engine_index() == 0
        ws = torch.empty(max(nodes.get_workspace_size(), 1), device="cuda", dtype=torch.uint8)
        res["nodes"], res["plain LN"] = time_pair(lambda: nodes.execute(bufs, ws.data_ptr()), plain, rounds=rounds)
    copy_gbs = nbytes / copy_ms / 1e6
    print(f"LN + scale + bias + GELU, {NAME[io]} {n} x {d} (copy {copy_gbs:.0f} GB/s)")
    for k, ms in res.items():
        gbs = nbytes / ms / 1e6
        print(f"  {k:9s} {ms * 1e3:9.1f} us  {gbs:7.0f} GB/s  {100 * gbs / copy_gbs:5.1f}% of copy  "
              f"fused is {ms / res['fused']:.2f}x faster than this")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    h = pydnn.create()
    pydnn.set_stream(h, torch.cuda.current_stream().cuda_stream)
    print(torch.cuda.get_device_name())
    shapes = [(pydnn.PYDNN_DATA_BFLOAT16, 16384, 4096)] + ([] if args.quick else [
        (pydnn.PYDNN_DATA_BFLOAT16, 65536, 1024), (pydnn.PYDNN_DATA_FLOAT, 8192, 4096)])
    for io, n, d in shapes:
        a = torch.empty(n, d, device="cuda", dtype=TDT[io])
        bb = torch.empty_like(a)
        copy_ms, _ = time_pair(lambda: bb.copy_(a), lambda: bb.copy_(a), rounds=2)
        bench(h, io, n, d, copy_ms, args.quick)


if __name__ == "__main__":
    main()
