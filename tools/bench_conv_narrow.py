"""Narrow 1x1 convolutions (issue 18's sweep: the UNet head 1x1 64 -> 2 @128 ran at 0.05-0.08x cuDNN):
pydnn's narrow kernels (ops/convolution/narrow.py: IMPLICIT_GEMM / ALGO_0 / ALGO_0) beside cuDNN through
PyTorch (cudnn.benchmark on), bf16 NHWC, CUDA-graph device time on both sides (sweep_common.graph_ms),
with the algorithm Get..._v7 ranks first named, the achieved DRAM rate and an error check per row.

    python3 tools/bench_conv_narrow.py                       # N 8, 32, 128 (about 10 s)
    python3 tools/bench_conv_narrow.py --n 8 --n 128 --out $OUT
"""
import argparse
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pydnn  # noqa: E402
import sweep_common as SC  # noqa: E402
from bench import desc, time_ms  # noqa: E402

LAYERS = [(64, 2, 128)]   # C, K, H = W


def _ms(h, fn):
    try:
        return SC.graph_ms(h, fn), "graph"
    except Exception:  # noqa: BLE001
        return time_ms(fn, reps=20, warmup=3), "events"


def _err(got, want):
    got, want = got.float(), want.float()
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-30))


def layer(h, n, c, k, hw):
    x = torch.randn(n, c, hw, hw, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    w = (torch.randn(k, c, 1, 1, device="cuda", dtype=torch.bfloat16) * 0.1).to(memory_format=torch.channels_last)
    y = torch.nn.functional.conv2d(x, w).contiguous(memory_format=torch.channels_last)
    dy = torch.randn_like(y)
    dx, dw = torch.empty_like(x), torch.empty_like(w)
    dt = pydnn.PYDNN_DATA_BFLOAT16
    xd, yd = desc(x, dtype=dt), desc(y, dtype=dt)
    wd = pydnn.create_filter_descriptor()
    pydnn.set_filter4d_descriptor(wd, dt, pydnn.PYDNN_TENSOR_NHWC, *w.shape)
    conv = pydnn.create_convolution_descriptor()
    pydnn.set_convolution2d_descriptor(conv, 0, 0, 1, 1, 1, 1, pydnn.PYDNN_CROSS_CORRELATION, pydnn.PYDNN_DATA_FLOAT)
    v7 = (pydnn.get_convolution_forward_algorithm_v7(h, xd, wd, conv, yd, 1)[0].algo,
          pydnn.get_convolution_backward_data_algorithm_v7(h, wd, yd, conv, xd, 1)[0].algo,
          pydnn.get_convolution_backward_filter_algorithm_v7(h, xd, yd, conv, wd, 1)[0].algo)
    fa, da, wa = (pydnn.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_0,
                  pydnn.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_0)
    need = pydnn.get_convolution_backward_filter_workspace_size(h, xd, yd, conv, wd, wa)
    ws = torch.empty(max(need, 1), dtype=torch.uint8, device="cuda")
    wsp = ws.data_ptr()
    xp, wp, yp, dyp, dxp, dwp = (t.data_ptr() for t in (x, w, y, dy, dx, dw))
    args = ([1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    big = n * hw * hw * c * 2
    rows = [
        ("fwd", v7[0], lambda: pydnn.convolution_forward(h, 1.0, xd, xp, wd, wp, conv, fa, 0, 0, 0.0, yd, yp),
         lambda: torch.nn.functional.conv2d(x, w), lambda: (y, torch.nn.functional.conv2d(x, w))),
        ("bwd data", v7[1], lambda: pydnn.convolution_backward_data(h, 1.0, wd, wp, yd, dyp, conv, da, 0, 0, 0.0, xd, dxp),
         lambda: torch.ops.aten.convolution_backward(dy, x, w, None, *args, [True, False, False]),
         lambda: (dx, torch.ops.aten.convolution_backward(dy, x, w, None, *args, [True, False, False])[0])),
        ("bwd filter", v7[2], lambda: pydnn.convolution_backward_filter(h, 1.0, xd, xp, yd, dyp, conv, wa, wsp, need, 0.0,
                                                                        wd, dwp),
         lambda: torch.ops.aten.convolution_backward(dy, x, w, None, *args, [False, True, False]),
         lambda: (dw, torch.ops.aten.convolution_backward(dy, x, w, None, *args, [False, True, False])[1])),
    ]
    out = []
    for (what, top, fp, ft, check), o in zip(rows, (y, dx, dw)):
        o.fill_(float("nan"))   # poisoned: the check reads what pydnn wrote (y held PyTorch's)
        fp()
        torch.cuda.synchronize()
        err = _err(*check())
        (ms_p, tp), (ms_t, tt) = _ms(h, fp), _ms(h, ft)
        out.append((what, int(top), ms_p, ms_t, err, big / ms_p / 1e9, tp + "/" + tt))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, action="append")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    torch.backends.cudnn.benchmark = True
    h = pydnn.create()
    pydnn.set_stream(h, torch.cuda.current_stream().cuda_stream)
    lines = []

    def say(t):
        print(t, flush=True)
        lines.append(t)

    say(f"device: {torch.cuda.get_device_name()}  cuDNN {torch.backends.cudnn.version()}")
    say(f"{'layer':28s} {'dir':10s} {'v7':>3s} {'narrow ms':>9s} {'cudnn ms':>9s} {'ratio':>6s} {'TB/s':>5s} {'err':>8s} timing")
    ratios = []
    for n in a.n or [8, 32, 128]:
        for c, k, hw in LAYERS:
            name = f"N{n} 1x1 {c}->{k} @{hw}"
            for what, top, ms_p, ms_t, err, tbs, tm in layer(h, n, c, k, hw):
                ratios.append(ms_t / ms_p)
                say(f"{name:28s} {what:10s} {top:3d} {ms_p:9.4f} {ms_t:9.4f} {ms_t / ms_p:6.2f}x {tbs:5.2f} {err:8.1e} {tm}"
                    + ("  ERROR > 2e-2" if not err <= 2e-2 else ""))
    geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    say(f"geomean {geo:.3f}x cuDNN, min {min(ratios):.3f}x over {len(ratios)} rows (the narrow kernels, forced)")
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "bench_conv_narrow.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
