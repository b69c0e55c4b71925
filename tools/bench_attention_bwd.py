"""The attention backward's warp-specialized variants side by side (tools/bench_attention.py bwd_ab with a
chosen variant list), cuDNN SDPA in the same run:

  python3 tools/bench_attention_bwd.py [--shapes 4x4096x32x32x128,...] [--variants bulk,bulk+ord,...]
                                       [--det 0] [--reps N] [--out FILE]

A variant "default+<v>" or "<mode>+<v>" runs tuning.attention_bwd.WS_VAR = <v> (pydnn/ops/attention_ws_bwd.py VARS: the
probes "noexp", "nored", "noload", whose results are wrong: what a part of the tile costs). "<name>#<n>" repeats a
variant under another column name (the run's drift; the column right after cuDNN reads low on long points).
A variant ending in "+np" runs the backward's memory passes in attention.cu's form (tuning.attention_bwd.PREP_VEC
off: bwd_pre / bwd_dq_convert, a warp a row) instead of ptx/attention_prep.cu's. A variant is "d256-red" / "d256-bulkw" / "d256-bulkw2" (tuning.attention_bwd.WS_DQ_D256, the d 256 kernel's dQ), a WS_DQ mode ("bulk", "bulkw", "bulkwpp", "bulkwpp1", "red", "redpp"; WS_DQ_CAUSAL off)
with optional "+ord" (tuning.attention_bwd.WS_ORDER: the longest-walk-first 1-d grid) and "+3st" (WS_STAGES 3
where instantiated, d 128 bulk / bulkw), or "old" (the older wgmma kernel), or "default" (tuning's defaults). TFLOP/s count 2.5x the forward's
FLOPs (half under the causal mask).

  python3 tools/bench_attention_bwd.py --kernels [--shapes ...] [--reps N]

prints each kernel's mean time (torch.profiler) in a backward with deterministic = 0 and 1, causal and not:
at d 256 bwd_ws256 with dQ by red.global.add against the same kernel without dQ (the dQ atomics' cost)."""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_attention as BA  # noqa: E402
from pydnn.ops import attention_ws_bwd as WSB  # noqa: E402


def overrides(name):
    if "#" in name:  # a repeated variant under another column name (default#2: the run's drift, same kernel)
        return overrides(name.split("#")[0])
    if name.endswith("+np"):  # any variant with the backward's memory passes in attention.cu's form (PREP_VEC off)
        return {**overrides(name[:-3]), "attention_bwd.PREP_VEC": False}
    if name == "old":
        return {"attention_bwd.WS": False}
    if name == "default":  # the warp-specialized kernel with tuning's defaults
        return {"attention_bwd.WS": True}
    base, _, var = name.partition("+")
    if base == "default" and var in WSB.VARS:  # the defaults with a WS_VAR variant / probe: default+branchy, ...
        return {"attention_bwd.WS": True, "attention_bwd.WS_VAR": var}
    if name.startswith("d256-"):  # bwd_ws256's dQ mode (tuning.attention_bwd.WS_DQ_D256): d256-red, d256-bulkw(2)
        return {"attention_bwd.WS": True, "attention_bwd.WS_DQ_D256": name[5:]}
    mode, *opts = name.split("+")
    over = {"attention_bwd.WS": True, "attention_bwd.WS_DQ": mode, "attention_bwd.WS_DQ_CAUSAL": None,
            "attention_bwd.WS_ORDER": "ord" in opts,
            "attention_bwd.WS_STAGES": 3 if "3st" in opts else 2}
    var = [o for o in opts if o in WSB.VARS]
    if var:
        over["attention_bwd.WS_VAR"] = var[0]
    unknown = set(opts) - {"ord", "3st"} - set(WSB.VARS)
    if unknown:
        raise SystemExit(f"unknown variant options {unknown}")
    return over


def kernels(shapes, reps=5, dets=(0, 1)):
    """Per-kernel mean times (torch.profiler) of pydnn's backward (deterministic in dets; det 0 with the memory
    passes in both forms, tuning.attention_bwd.PREP_VEC) and of cuDNN SDPA's, causal and not."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    import pydnn
    from pydnn import tuning
    h = pydnn.create()
    pydnn.set_stream(h, torch.cuda.current_stream().cuda_stream)
    bf = pydnn.PYDNN_DATA_BFLOAT16
    for bb, s, hq, hkv, d in shapes:
        q, k, v = (torch.randn(bb, hh, s, d, dtype=torch.bfloat16, device="cuda") for hh in (hq, hkv, hkv))
        o, do = torch.empty_like(q), torch.randn_like(q)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        lse = torch.empty(bb, hq, s, 1, dtype=torch.float32, device="cuda")
        tq, tk, tv, to = BA._desc(q, bf), BA._desc(k, bf), BA._desc(v, bf), BA._desc(o, bf)
        tl = BA._desc(lse, pydnn.PYDNN_DATA_FLOAT)
        for causal in (False, True):
            a = pydnn.create_attention_descriptor()
            mask = pydnn.PYDNN_ATTN_MASK_CAUSAL_TOP_LEFT if causal else pydnn.PYDNN_ATTN_MASK_NONE
            pydnn.set_attention_descriptor(a, hq, hkv, d, d ** -0.5, mask, 0.0, 0)
            pydnn.attention_forward(h, a, tq, q.data_ptr(), tk, k.data_ptr(), tv, v.data_ptr(), to, o.data_ptr(),
                                    tl, lse.data_ptr(), None, None, None, 0)
            flops = 2.5 * 4 * bb * hq * s * s * d * (0.5 if causal else 1.0)
            for det, vec in ((dt, vc) for dt in dets for vc in ((True, False) if dt == 0 else (True,))):
                ws_n = pydnn.get_attention_backward_workspace_size(h, a, tq, tk)
                ws = torch.empty(max(ws_n, 16), dtype=torch.uint8, device="cuda")

                def bwd():
                    pydnn.attention_backward(h, a, tq, q.data_ptr(), tk, k.data_ptr(), tv, v.data_ptr(), to,
                                             o.data_ptr(), to, do.data_ptr(), tl, lse.data_ptr(), tq, dq.data_ptr(),
                                             tk, dk.data_ptr(), tv, dv.data_ptr(), None, None, det, ws.data_ptr(), ws_n)
                with tuning.override({"attention_bwd.PREP_VEC": vec}):
                    bwd()
                    torch.cuda.synchronize()
                    with profile(activities=[ProfilerActivity.CUDA]) as prof:
                        for _ in range(reps):
                            bwd()
                        torch.cuda.synchronize()
                tot = {}
                for e in prof.events():
                    if e.device_type.name == "CUDA":
                        n = e.name.split("<")[0].split("::")[-1] + ("<" + e.name.split("<", 1)[1][:24] if "<" in e.name else "")
                        tot[n] = tot.get(n, 0.0) + e.device_time / 1e3 / reps
                parts = ", ".join(f"{n} {ms:.3f} ms" for n, ms in sorted(tot.items(), key=lambda x: -x[1]))
                ker = max(tot.values()) if tot else float("nan")
                print(f"b{bb} s{s} h{hq}/{hkv} d{d}{' causal' if causal else ''} det={det}"
                      f"{'' if vec else ' (PREP_VEC off)'}: {parts}; total {sum(tot.values()):.3f} ms; "
                      f"largest kernel {flops / ker / 1e9:.0f} TF/s (backward FLOPs)", flush=True)
            # cuDNN SDPA's backward in the same process: its kernels (autograd.grad of the output)
            from torch.nn.attention import SDPBackend, sdpa_kernel
            qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                out = torch.nn.functional.scaled_dot_product_attention(qq, kk, vv, is_causal=causal,
                                                                       enable_gqa=hq != hkv)

                def cbwd():
                    torch.autograd.grad(out, (qq, kk, vv), do, retain_graph=True)
                cbwd()
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(reps):
                        cbwd()
                    torch.cuda.synchronize()
            tot = {}
            for e in prof.events():
                if e.device_type.name == "CUDA":
                    n = e.name[:60]
                    tot[n] = tot.get(n, 0.0) + e.device_time / 1e3 / reps
            parts = ", ".join(f"{n} {ms:.3f} ms" for n, ms in sorted(tot.items(), key=lambda x: -x[1]))
            print(f"b{bb} s{s} h{hq}/{hkv} d{d}{' causal' if causal else ''} cuDNN: {parts}; total "
                  f"{sum(tot.values()):.3f} ms", flush=True)
            del out, qq, kk, vv
        del q, k, v, o, do, dq, dk, dv, lse
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="4x4096x32x32x128,4x4096x32x32x64,4x4096x64x8x128")
    ap.add_argument("--variants", default="bulk,default")  # (session 28's default against this one's)
    ap.add_argument("--det", default="0")
    ap.add_argument("--reps", type=int)
    ap.add_argument("--out")
    ap.add_argument("--kernels", action="store_true", help="per-kernel times (torch.profiler), det 0 and 1")
    a = ap.parse_args()
    shapes = [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",")]
    if a.kernels:
        kernels(shapes, a.reps or 5, tuple(int(x) for x in a.det.split(",")))
        return
    variants = tuple((v, overrides(v)) for v in a.variants.split(","))
    for det in (int(x) for x in a.det.split(",")):
        out = a.out and (a.out if det == 0 else a.out.replace(".md", f"_det{det}.md"))
        BA.bwd_ab(out=out, shapes=shapes, reps=a.reps, det=det, variants=variants)


if __name__ == "__main__":
    main()
