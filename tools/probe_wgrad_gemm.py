"""Per-launch times of the backward filter BWD_FILTER_ALGO_3 (the stem: its implicit variant with forced
blocks per SM / waves of slots, and the explicit GEMMs) and the direct 1x1 backward data on the fp32 NCHW
ResNet-50 layers (N = 64): where the time goes, for the notes in pydnn/ops/convolution_gemm.py. Run on
the GPU:
    PYTHONPATH=$PWD python3 tools/probe_wgrad_gemm.py"""
import torch

import pydnn
from pydnn import tuning
from pydnn.ops.convolution import implicit as CI, plans as CP, problem as CPb, tensor_core as CT
from pydnn.ops.convolution import gemm as G
from bench import desc, time_ms

N = 64


def _setup(c, k, hw, r, st, pad):
    o = (hw + 2 * pad - r) // st + 1
    x = torch.randn(N, c, hw, hw, device="cuda")
    dy = torch.randn(N, k, o, o, device="cuda")
    w = torch.empty(k, c, r, r, device="cuda")
    xd, yd = desc(x, dtype=pydnn.PYDNN_DATA_FLOAT), desc(dy, dtype=pydnn.PYDNN_DATA_FLOAT)
    wd = pydnn.create_filter_descriptor()
    pydnn.set_filter4d_descriptor(wd, pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_TENSOR_NCHW, k, c, r, r)
    conv = pydnn.create_convolution_descriptor()
    pydnn.set_convolution2d_descriptor(conv, pad, pad, st, st, 1, 1, pydnn.PYDNN_CROSS_CORRELATION,
                                       pydnn.PYDNN_DATA_FLOAT)
    return x, dy, w, xd, yd, wd, conv, 2 * N * k * o * o * c * r * r


def _steps(h, pl, x, dy, w, ws):
    """Each launch of the plan timed alone (same pointers as the plan's own launch)."""
    es = 4
    out = []
    if pl.implicit:
        p = pl.steps[pl.gather][4]
        p.x, p.dy, p.part = x.data_ptr(), dy.data_ptr(), ws + pl.part_off
        t = time_ms(lambda: pl.run_step(h, pl.gather))
        tile = 2.0 * G.WI_KT * G.WI_JT * p.npix * pl.steps[pl.gather][2][1] * pl.steps[pl.gather][2][2]
        out.append((f"wgrad_implicit grid {pl.steps[pl.gather][2]} ({tile / t / 1e9:.1f} TFLOP/s of tile work)", t))
        f = pl.steps[pl.fold][4]
        f.part, f.dw, f.alpha, f.beta = ws + pl.part_off, w.data_ptr(), 1.0, 0.0
        out.append((f"fold ({pl.parts} partials)", time_ms(lambda: pl.run_step(h, pl.fold))))
        return out
    part = ws + pl.part_off
    n0, kind, slot0, first = pl.chunks[0]
    base = {"dy": dy.data_ptr(), "x": x.data_ptr(), "col": ws + pl.col_off, "pack": ws + pl.pack_off}
    im2col, pack, gemms = pl.kinds[kind]
    if im2col is not None:
        p = pl.steps[im2col][4]
        p.x, p.col = base["x"], base["col"]
        out.append(("im2col (first chunk)", time_ms(lambda: pl.run_step(h, im2col))))
    if pack is not None:
        q = pl.steps[pack][4]
        q.in_, q.out = base["dy"], base["pack"]
        out.append(("pack_rows (first chunk)", time_ms(lambda: pl.run_step(h, pack))))
    for mp, a, aoff, b, boff, slot in gemms:
        lab = f"matmul m {mp.m} n {mp.n} k {mp.k} batch {mp.batch} {mp.fast.expr.split('<')[1][:-1]}"
        out.append((lab, time_ms(lambda: mp.launch(h, base[a] + aoff * es, base[b] + boff * es,
                                                   part + (slot0 + slot) * pl.slot * es, 1.0, 0.0))))
    f = pl.steps[pl.fold][4]
    f.part, f.dw, f.alpha, f.beta = part, w.data_ptr(), 1.0, 0.0
    out.append((f"fold ({pl.parts} partials)", time_ms(lambda: pl.run_step(h, pl.fold))))
    return out


def run():
    h = pydnn.create()
    pydnn.set_stream(h, torch.cuda.current_stream().cuda_stream)
    layers = [("7x7/2 3->64 @224", 3, 64, 224, 7, 2, 3), ("1x1 256->64 @56", 256, 64, 56, 1, 1, 0),
              ("1x1 64->256 @56", 64, 256, 56, 1, 1, 0)]
    for name, *shape in layers:
        x, dy, w, xd, yd, wd, conv, flops = _setup(*shape)
        variants = [("default", {})]
        if shape[3] == 7:
            # (a MINB 4 instantiation, timed at 221cdbf, is no longer in the manifest: see convolution_gemm.py v5)
            variants = [("default", {}), ("implicit, 2 waves", {"WI_WAVES": 2}), ("implicit, 4 waves", {"WI_WAVES": 4}),
                        ("explicit", {"IMPLICIT": False})]
        for vname, over in variants:
            saved = {k: getattr(G, k) for k in over}
            for k2, v in over.items():
                setattr(G, k2, v)
            try:
                pydnn.set_convolution_math_type(conv, pydnn.PYDNN_DEFAULT_MATH)   # a new plan
                pl = CP.new_plan(h, CPb.DIR_BWD_FILTER, 3, conv, xd, wd, yd)
                ws_t = torch.empty(max(pl.workspace, 1), dtype=torch.uint8, device="cuda")
                ms = time_ms(lambda: pydnn.convolution_backward_filter(h, 1.0, xd, x.data_ptr(), yd, dy.data_ptr(), conv,
                                                                       3, ws_t.data_ptr(), pl.workspace, 0.0, wd,
                                                                       w.data_ptr()), reps=10)
                form = (f"implicit, {pl.parts} slots of {pl.per_slot} pixels, MINB {pl.minb}" if pl.implicit
                        else f"chunks {[c[1] for c in pl.chunks]}")
                print(f"{name} bwd filter ALGO_3 [{vname}]: {ms:.3f} ms {flops / ms / 1e9:.1f} TFLOP/s, {form}, "
                      f"parts {pl.parts}, workspace {pl.workspace >> 20} MiB, model {pl.estimate_ms(h, None):.3f} ms",
                      flush=True)
                if vname in ("default", "explicit") or pl.implicit:
                    for lab, t in _steps(h, pl, x, dy, w, ws_t.data_ptr()):
                        print(f"    {lab}: {t:.3f} ms", flush=True)
            finally:
                for k2, v in saved.items():
                    setattr(G, k2, v)
        if shape[3] == 1:
            pl = CP.new_plan(h, CPb.DIR_BWD_DATA, 1, conv, xd, wd, yd)
            dx = torch.empty_like(x)
            ms = time_ms(lambda: pydnn.convolution_backward_data(h, 1.0, wd, w.data_ptr(), yd, dy.data_ptr(), conv, 1,
                                                                 0, 0, 0.0, xd, dx.data_ptr()))
            print(f"{name} bwd data ALGO_1 direct: {ms:.3f} ms {flops / ms / 1e9:.1f} TFLOP/s, model "
                  f"{pl.estimate_ms(h, None):.3f} ms, {pl.mm.fast.expr.split('<')[1][:-1]}", flush=True)


if __name__ == "__main__":
    run()
