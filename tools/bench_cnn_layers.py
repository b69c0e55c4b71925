"""The CNN demo's (examples/train_cnn.py) convolution pieces at its shapes (batch 256, bf16, NCHW), pydnn.torch
beside PyTorch (cuDNN), with CUDA events; small enough to compile and run in ~30 s on a cold kernel cache (up
to its last row it needs only the wgmma, wgrad, transform and conv_bias units, not ptx/convolution.cu's large
CUDA-core / mma.sync unit; the NCHW rows come last, rows are saved as they are measured):

  bias   ConvolutionBackwardBias (pydnn, ptx/conv_bias.cu) against dy.sum((0, 2, 3)) (PyTorch) on the two
         convolutions' dy: (256, 64, 32, 32) and (256, 128, 16, 16)
  conv2  the second convolution (64 -> 128, 3x3 pad 1, 16x16): its backward data + filter + bias on
         pydnn.torch's NHWC path (pydnn.tuning.torch.CONV_NHWC_BWD: NHWC copies, wgmma kernels on sm_90, copies
         back), each piece of it, and aten.convolution_backward (cuDNN); its forward with bias on the NHWC path
         (CONV_NHWC_FWD), on pydnn's NCHW algorithm (im2col GEMM) and F.conv2d (cuDNN); with --nchw also pydnn's
         NCHW backward algorithms (Winograd backward data, im2col GEMM backward filter; more units to compile)

    python tools/bench_cnn_layers.py                # ~10 s warm
    python tools/bench_cnn_layers.py --nchw --reps 50
Results: printed, and OUT/bench_cnn_layers.json (OUT: --out, else $OUT, else .).
"""
import argparse
import json
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import pydnn  # noqa: E402
from pydnn.torch import _core as C  # noqa: E402
from pydnn.torch import functional as PF  # noqa: E402


def timed(fn, reps):
    """Median ms per call of fn() over reps calls, each between two events (after two warm-up calls)."""
    fn(), fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        ts.append((a, b))
    torch.cuda.synchronize()
    ms = sorted(a.elapsed_time(b) for a, b in ts)
    return ms[len(ms) // 2]


def linear_rows(h, dt, dev, g, args, report, res):
    """The demo's classifier forward, y (256 x 10) = x (256 x 8192) @ W^T: pydnn.matmul (the bridge's Linear; few
    output tiles, K walked by 4 blocks), F.linear (cuBLAS), and the same product as a 1x1 convolution's
    backward filter (dw (256, 10) = sum over 8192 'pixels' of dy (256 channels) x (10 channels); its algorithms
    split that reduction into fp32 partials and fold them in order), each supported algorithm."""
    import torch.nn.functional as F
    m, k, n = 256, 8192, 10
    x2 = torch.randn(m, k, device=dev, generator=g).to(dt)
    w = (torch.randn(n, k, device=dev, generator=g) * 0.01).to(dt)
    y = torch.empty(m, n, dtype=dt, device=dev)
    xd, wtd, yd = C.tdesc(x2), C.tensor_desc(dt, (k, n), (1, k)), C.tdesc(y)
    report("linear fwd pydnn.matmul", timed(lambda: pydnn.matmul(h, 1.0, xd, x2.data_ptr(), wtd, w.data_ptr(), 0.0,
                                                                 yd, y.data_ptr()), args.reps))
    report("linear fwd torch F.linear (cuBLAS)", timed(lambda: F.linear(x2, w), args.reps))
    want = F.linear(x2.double(), w.double())
    cx = C.tensor_desc(dt, (1, n, k, 1), (n * k, k, 1, 1))
    cdy = C.tensor_desc(dt, (1, m, k, 1), (m * k, k, 1, 1))
    cw = C.filter_desc(dt, (m, n, 1, 1), pydnn.PYDNN_TENSOR_NCHW)
    cd = PF._conv_desc(((1, 1), (0, 0), (1, 1), 1), dt)
    perfs = pydnn.get_convolution_backward_filter_algorithm_v7(h, cx, cdy, cd, cw, 8)
    res["linear_wgrad_ranking"] = [(p.algo, p.status) for p in perfs]
    for p in perfs:
        if p.status != pydnn.PYDNN_STATUS_SUCCESS:
            continue
        nws = pydnn.get_convolution_backward_filter_workspace_size(h, cx, cdy, cd, cw, p.algo)
        ws = torch.empty(max(nws, 1), dtype=torch.uint8, device=dev)

        def run(a=p.algo, nws=nws, ws=ws):
            pydnn.convolution_backward_filter(h, 1.0, cx, w.data_ptr(), cdy, x2.data_ptr(), cd, a, ws.data_ptr(), nws,
                                              0.0, cw, y.data_ptr())
        report(f"linear fwd as convolution_backward_filter algo {p.algo}", timed(run, args.reps))
        err = ((y.double() - want).abs().max() / want.abs().max()).item()
        print(f"  algo {p.algo}: max-norm relative difference to float64 {err:.2e}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--nchw", action="store_true", help="also pydnn's NCHW backward (Winograd / im2col GEMM)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    dev = torch.device("cuda")
    dt = torch.bfloat16
    h = C.handle_for(dev)
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "ms": {}}
    out = res["ms"]

    os.makedirs(args.out, exist_ok=True)

    def save():
        with open(os.path.join(args.out, "bench_cnn_layers.json"), "w") as fh:
            json.dump(res, fh, indent=1)

    def report(name, ms):
        out[name] = ms
        print(f"{name:58s} {ms * 1e3:9.1f} us", flush=True)
        save()  # after each row: a run cut short keeps what it measured

    t0 = time.perf_counter()
    g = torch.Generator(device="cuda").manual_seed(0)
    for shape in ((256, 64, 32, 32), (256, 128, 16, 16)):
        dy = torch.randn(shape, device=dev, generator=g).to(dt)
        k = shape[1]
        db = torch.empty(k, dtype=dt, device=dev)
        dyd = C.tdesc(dy)
        bd = C.tensor_desc(dt, (1, k, 1, 1), (k, 1, 1, 1))
        tag = "x".join(map(str, shape))
        report(f"bias {tag} pydnn", timed(lambda: pydnn.convolution_backward_bias(
            h, 1.0, dyd, dy.data_ptr(), 0.0, bd, db.data_ptr()), args.reps))
        report(f"bias {tag} torch dy.sum((0, 2, 3))", timed(lambda: dy.sum((0, 2, 3)), args.reps))
        want = dy.double().sum((0, 2, 3))
        err = ((db.double() - want).abs().max() / want.abs().max()).item()
        print(f"  bias {tag}: max-norm relative difference to float64 {err:.2e}")

    # the second convolution
    n, c, kk, hw = 256, 64, 128, 16
    x = torch.randn(n, c, hw, hw, device=dev, generator=g).to(dt)
    w = (torch.randn(kk, c, 3, 3, device=dev, generator=g) * 0.05).to(dt)
    dy = torch.randn(n, kk, hw, hw, device=dev, generator=g).to(dt)
    spec = ((1, 1), (1, 1), (1, 1), 1)
    fmt = pydnn.PYDNN_TENSOR_NCHW
    pl = PF.conv_plan(h, x, w, spec, fmt)
    ph = PF._nhwc_plan(h, pl, x, w, spec)
    print(f"  NHWC plan algorithms: backward data {ph.bwd_data} (ws {ph.bwd_data_ws}), backward filter "
          f"{ph.bwd_filter} (ws {ph.bwd_filter_ws})")
    cl = torch.channels_last
    dyh = torch.empty_like(dy, memory_format=cl)
    xh = torch.empty_like(x, memory_format=cl)
    wh = torch.empty_like(w, memory_format=cl)
    dxh = torch.empty_like(x, memory_format=cl)
    dwh = torch.empty_like(w, memory_format=cl)
    PF._transform(h, dy, dyh), PF._transform(h, x, xh), PF._transform(h, w, wh)
    report("conv2 transform dy NCHW->NHWC", timed(lambda: PF._transform(h, dy, dyh), args.reps))
    report("conv2 transform x NCHW->NHWC", timed(lambda: PF._transform(h, x, xh), args.reps))
    report("conv2 transform dx NHWC->NCHW", timed(lambda: PF._transform(h, dxh, torch.empty_like(x)), args.reps))

    def bwd_data():
        ws, wsp = C.workspace(ph.bwd_data_ws, dev)
        pydnn.convolution_backward_data(h, 1.0, ph.wd, wh.data_ptr(), ph.yd, dyh.data_ptr(), ph.cd, ph.bwd_data,
                                        wsp, ph.bwd_data_ws, 0.0, ph.xd, dxh.data_ptr())

    def bwd_filter():
        ws, wsp = C.workspace(ph.bwd_filter_ws, dev)
        pydnn.convolution_backward_filter(h, 1.0, ph.xd, xh.data_ptr(), ph.yd, dyh.data_ptr(), ph.cd,
                                          ph.bwd_filter, wsp, ph.bwd_filter_ws, 0.0, ph.wd, dwh.data_ptr())

    report("conv2 NHWC backward data (kernel)", timed(bwd_data, args.reps))
    report("conv2 NHWC backward filter (kernel)", timed(bwd_filter, args.reps))
    db = torch.empty(kk, dtype=dt, device=dev)

    def pydnn_nhwc():
        PF._conv_backward_nhwc(h, ph, x, w, dy, True, True)
        pydnn.convolution_backward_bias(h, 1.0, pl.yd, dy.data_ptr(), 0.0, pl.bd, db.data_ptr())

    report("conv2 backward pydnn NHWC path (dx, dw, db, transforms)", timed(pydnn_nhwc, args.reps))

    def torch_bwd():
        torch.ops.aten.convolution_backward(dy, x, w, [kk], [1, 1], [1, 1], [1, 1], False, [0, 0], 1,
                                            [True, True, True])

    report("conv2 backward torch aten.convolution_backward (cuDNN)", timed(torch_bwd, args.reps))
    dx_t, dw_t, db_t = torch.ops.aten.convolution_backward(dy, x, w, [kk], [1, 1], [1, 1], [1, 1], False, [0, 0],
                                                           1, [True, True, True])
    dx_p, dw_p = PF._conv_backward_nhwc(h, ph, x, w, dy, True, True)
    for name, a, b in (("dx", dx_p, dx_t), ("dw", dw_p, dw_t)):
        err = ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()
        print(f"  conv2 {name}: pydnn NHWC against cuDNN, max-norm relative difference {err:.2e}")
    b = (torch.randn(kk, device=dev, generator=g) * 0.1).to(dt)

    def fwd_nhwc():
        xh2 = PF._transform(h, x, torch.empty_like(x, memory_format=cl))
        wh2 = PF._transform(h, w, torch.empty_like(w, memory_format=cl))
        return PF._transform(h, PF._conv_forward(h, ph, xh2, wh2, b, None), torch.empty_like(dy))

    report("conv2 forward + bias pydnn NHWC path (transforms incl.)", timed(fwd_nhwc, args.reps))
    report("conv2 forward + bias pydnn NHWC kernel only", timed(lambda: PF._conv_forward(h, ph, xh, wh, b, None),
                                                               args.reps))
    report("conv2 forward + bias torch F.conv2d (cuDNN)",
           timed(lambda: torch.nn.functional.conv2d(x, w, b, padding=1), args.reps))
    y_t = torch.nn.functional.conv2d(x, w, b, padding=1)
    err = ((fwd_nhwc().double() - y_t.double()).abs().max() / y_t.double().abs().max()).item()
    print(f"  conv2 forward: pydnn NHWC against cuDNN, max-norm relative difference {err:.2e}")
    res["seconds_nhwc"] = time.perf_counter() - t0
    report("conv2 forward + bias pydnn NCHW algorithm", timed(lambda: PF._conv_forward(h, pl, x, w, b, None),
                                                              args.reps))
    if args.nchw:
        PF._bwd_algos(h, pl, pl.yd)
        print(f"  NCHW plan algorithms: backward data {pl.bwd_data}, backward filter {pl.bwd_filter}")
        dx = torch.empty_like(x)
        dw = torch.empty_like(w)

        def nchw_data():
            ws, wsp = C.workspace(pl.bwd_data_ws, dev)
            pydnn.convolution_backward_data(h, 1.0, pl.wd, w.data_ptr(), pl.yd, dy.data_ptr(), pl.cd, pl.bwd_data,
                                            wsp, pl.bwd_data_ws, 0.0, pl.xd, dx.data_ptr())

        def nchw_filter():
            ws, wsp = C.workspace(pl.bwd_filter_ws, dev)
            pydnn.convolution_backward_filter(h, 1.0, pl.xd, x.data_ptr(), pl.yd, dy.data_ptr(), pl.cd,
                                              pl.bwd_filter, wsp, pl.bwd_filter_ws, 0.0, pl.wd, dw.data_ptr())

        report("conv2 NCHW backward data (pydnn's NCHW algorithm)", timed(nchw_data, args.reps))
        report("conv2 NCHW backward filter (pydnn's NCHW algorithm)", timed(nchw_filter, args.reps))
    linear_rows(h, dt, dev, g, args, report, res)
    res["seconds"] = time.perf_counter() - t0
    save()
    print(f"{res['device']}; {res['seconds']:.1f} s; written {args.out}/bench_cnn_layers.json")


if __name__ == "__main__":
    main()
