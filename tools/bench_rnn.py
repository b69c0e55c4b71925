"""RNNs (cuDNN's RNN API, pydnn/ops/rnn/) vs PyTorch nn.LSTM / nn.GRU (cuDNN underneath), side by side in
one run, on issue 16's shapes (STANDARD and PERSIST_STATIC rows; --mid ran on an H200 mid-session, the README
has its numbers).

Each case: the same weights (PyTorch's parameters copied into pydnn's weight space through
GetRNNWeightParams), sequence-major input (T, B, I) with every sequence full length, hx / cx given.
Timed (device events on the current stream, warm-up, median; bench.time_ms):
  fwd    training forward: pydnn RNNForward(TRAINING) vs torch module(x) with parameters requiring grad
  fwd+bwd  pydnn RNNForward(TRAINING) + RNNBackwardData_v8 + RNNBackwardWeights_v8(ADD) vs torch forward +
         autograd backward of sum(y * dy)
FLOPs (the GEMMs only): forward 2 * T * B * sum over pseudo-layers of G * H * (in + out) (+ 2 * T * B * P * H
for a projection); forward+backward 3x that. TFLOP/s = flops / time; ratio = torch time / pydnn time (> 1:
pydnn faster). PERSIST_STATIC rows also time the forward's other exchange ("fwd tag", "all tag": the tagged
words, tuning.rnn.PERSIST_XCHG flipped from its default, the barrier). Also prints the largest
|y_pydnn - y_torch| / max |y_torch| as a sanity check.

The layer wavefront (multi-layer unidirectional stacks, LSTM projections included; on by default): --ab=
rnn.WAVEFRONT=False (and rnn.WAVE_CHUNK=N, rnn.WAVE_BWD=True) against it, e.g. `--case="lstm fp16 2L" --case="lstm
fp16 2L proj" --ab=rnn.WAVEFRONT=False` (the "proj" case: nn.LSTM(proj_size=512), projSize 512; its projection
GEMM split-K: --ab=rnn.PROJ_SPLIT=4).

A/B in one run: --ab=rnn.SWITCH=VALUE (repeatable; VALUE a Python literal) adds rows "fwd SWITCH=VALUE" /
"all SWITCH=VALUE" timed with that tuning switch set (the workspace is sized for every setting). --stamps
(PERSIST_STATIC rows): one more forward per setting with block 0's clock64 stamped at the phases of every step
(persist.stamps_buffer), printed as the mean cycles a step spends in each: wait (the barrier), h (h_{t-1}
into shared memory), gemm, cell (pass 1: gates, h out), arrive+p2 (the arrival and pass 2's stores), loop.

Usage: python tools/bench_rnn.py [--quick] [--only=SUBSTR] [--case=NAME] [--no-split] [--no-record] [--no-dir-batch]
       [--ab=rnn.SWITCH=VALUE[+rnn.SWITCH=VALUE] ...] [--stamps]
  --case=NAME: that case exactly (repeatable, with --only too); --ab settings of PERSIST_* switches apply to
  the PERSIST_STATIC rows only, the others to the rest; each "fwd SETTING" row also prints its own y's
  largest relative difference from the default setting's (NaN: some of y not written)
  --quick: only issue 16's small-hidden case (LSTM fp16 H 256, B 32, T 512), STANDARD and PERSIST_STATIC
  (about 10 s with the kernels compiled); --only=SUBSTR: the cases whose name contains SUBSTR (repeatable;
  "PS": the PERSIST_STATIC rows); --no-split: the recurrent GEMMs without split-K
  (pydnn.tuning.rnn.SPLIT_K); --no-record: every call rebuilds its launches (tuning.rnn.RECORD), to see the
  host cost that recording removes; --no-dir-batch: a bidirectional layer's directions one after the other
  (tuning.rnn.DIR_BATCH).
"""
import ast
import os
import sys

import torch

import pydnn
from pydnn import tuning
from pydnn import enums as E
from pydnn.ops.rnn import persist

sys.path.insert(0, os.path.dirname(__file__))
from bench import time_ms  # noqa: E402

STD, PS = E.PYDNN_RNN_ALGO_STANDARD, E.PYDNN_RNN_ALGO_PERSIST_STATIC
# name, cell, dtype, T, B, H (input = H), layers, bidirectional, algo
CASES = [
    ("lstm fp16 2L", E.PYDNN_LSTM, "float16", 256, 64, 1024, 2, False, STD),
    ("gru fp16 2L", E.PYDNN_GRU, "float16", 256, 64, 1024, 2, False, STD),
    ("lstm fp16 2L bi", E.PYDNN_LSTM, "float16", 256, 64, 1024, 2, True, STD),
    ("lstm fp16 2L proj", E.PYDNN_LSTM, "float16", 256, 64, 1024, 2, False, STD),  # projSize 512 (PROJ)
    ("lstm fp16 small-h", E.PYDNN_LSTM, "float16", 512, 32, 256, 1, False, STD),
    ("lstm fp16 small-h PS", E.PYDNN_LSTM, "float16", 512, 32, 256, 1, False, PS),
    ("gru fp16 small-h PS", E.PYDNN_GRU, "float16", 512, 32, 256, 1, False, PS),
    ("lstm bf16 small-h bi PS", E.PYDNN_LSTM, "bfloat16", 512, 32, 256, 1, True, PS),
    ("lstm fp32 small-h", E.PYDNN_LSTM, "float32", 512, 32, 256, 1, False, STD),
    ("lstm fp32 small-h PS", E.PYDNN_LSTM, "float32", 512, 32, 256, 1, False, PS),
    ("lstm fp16 1L PS", E.PYDNN_LSTM, "float16", 256, 64, 1024, 1, False, PS),
    # persist_fwd_r's 8-k-step instance (KR 8: batch 16, hidden 1024, 128 blocks); not an issue 16 target
    ("lstm fp16 1L b16 PS", E.PYDNN_LSTM, "float16", 256, 16, 1024, 1, False, PS),
    ("lstm fp32 1L PS", E.PYDNN_LSTM, "float32", 256, 64, 1024, 1, False, PS),
    ("lstm fp16 2L PS", E.PYDNN_LSTM, "float16", 256, 64, 1024, 2, False, PS),
    ("gru fp16 2L PS", E.PYDNN_GRU, "float16", 256, 64, 1024, 2, False, PS),
    ("lstm fp32 2L PS", E.PYDNN_LSTM, "float32", 256, 64, 1024, 2, False, PS),
    ("lstm fp32 2L", E.PYDNN_LSTM, "float32", 256, 64, 1024, 2, False, STD),
    # small batches, several layers: launches and latency dominate (the layer wavefront's case, tuning.rnn.WAVEFRONT)
    ("lstm fp16 4L small-b", E.PYDNN_LSTM, "float16", 256, 8, 256, 4, False, STD),
    ("gru fp16 2L small-b", E.PYDNN_GRU, "float16", 256, 16, 512, 2, False, STD),
]
# LSTM projection (projSize < hiddenSize; torch nn.LSTM(proj_size=...)): name -> projSize
PROJ = {"lstm fp16 2L proj": 512}
# --quick: issue 16's small-hidden case only, STANDARD and PERSIST_STATIC (each next to cuDNN)
QUICK = ("lstm fp16 small-h", "lstm fp16 small-h PS")
G = {E.PYDNN_LSTM: 4, E.PYDNN_GRU: 3}


def _flops(cell, T, B, H, layers, dirs, P=0):
    """P: the LSTM projection's size (0: none; the layer output is then H wide)."""
    f, out = 0, P or H
    for layer in range(layers):
        inp = H if layer == 0 else out * dirs
        f += dirs * 2 * T * B * (G[cell] * H * (inp + out) + (P * H if P else 0))
    return f


def _setup(h, cell, tdt, T, B, H, layers, bi, algo, skip=False, P=0):
    dt = {torch.float16: E.PYDNN_DATA_HALF, torch.bfloat16: E.PYDNN_DATA_BFLOAT16}.get(tdt, E.PYDNN_DATA_FLOAT)
    dirs = 2 if bi else 1
    out = P or H
    kw = dict(num_layers=layers, bidirectional=bi, device="cuda", dtype=tdt)
    mod = torch.nn.LSTM(H, H, proj_size=P, **kw) if cell == E.PYDNN_LSTM else torch.nn.GRU(H, H, **kw)
    r = pydnn.create_rnn_descriptor()
    pydnn.set_rnn_descriptor_v8(r, algo, cell, E.PYDNN_RNN_DOUBLE_BIAS,
                                E.PYDNN_BIDIRECTIONAL if bi else E.PYDNN_UNIDIRECTIONAL,
                                E.PYDNN_SKIP_INPUT if skip else E.PYDNN_LINEAR_INPUT, dt,
                                E.PYDNN_DATA_FLOAT, E.PYDNN_TENSOR_OP_MATH, H, H, out, layers, None,
                                E.PYDNN_RNN_PADDED_IO_ENABLED)
    wsize = pydnn.get_rnn_weight_space_size(h, r)
    w = torch.empty(wsize // torch.tensor([], dtype=tdt).element_size(), dtype=tdt, device="cuda")
    g = G[cell]
    for layer in range(layers):
        for d in range(dirs):
            sfx = f"l{layer}" + ("_reverse" if d else "")
            pl = layer * dirs + d
            for lin in range(2 * g):
                k = lin % g
                wt = getattr(mod, f"weight_{'ih' if lin < g else 'hh'}_{sfx}")[k * H:(k + 1) * H]
                bt = getattr(mod, f"bias_{'ih' if lin < g else 'hh'}_{sfx}")[k * H:(k + 1) * H]
                ma, ba = pydnn.get_rnn_weight_params(h, r, pl, wsize, w, lin, None, None)
                es = w.element_size()
                if ma:  # (SKIP_INPUT: layer 0 has no input matrices)
                    w[(ma - w.data_ptr()) // es:][:wt.numel()].copy_(wt.detach().reshape(-1))
                w[(ba - w.data_ptr()) // es:][:bt.numel()].copy_(bt.detach())
            if P:  # the projection (linLayerID 8): weight_hr [P, H]
                ma, _ = pydnn.get_rnn_weight_params(h, r, pl, wsize, w, 8, None, None)
                wt = getattr(mod, f"weight_hr_{sfx}")
                w[(ma - w.data_ptr()) // w.element_size():][:wt.numel()].copy_(wt.detach().reshape(-1))
    xd, yd = pydnn.create_rnn_data_descriptor(), pydnn.create_rnn_data_descriptor()
    lens = [T] * B
    pydnn.set_rnn_data_descriptor(xd, dt, E.PYDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED, T, B, H, lens, None)
    pydnn.set_rnn_data_descriptor(yd, dt, E.PYDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED, T, B, dirs * out, lens, None)
    hd, cd = pydnn.create_tensor_descriptor(), pydnn.create_tensor_descriptor()
    pydnn.set_tensor_nd_descriptor(hd, dt, 3, [layers * dirs, B, out], [B * out, out, 1])
    pydnn.set_tensor_nd_descriptor(cd, dt, 3, [layers * dirs, B, H], [B * H, H, 1])
    wss, rss = pydnn.get_rnn_temp_space_sizes(h, r, E.PYDNN_FWD_MODE_TRAINING, xd)
    return dict(mod=mod, r=r, w=w, wsize=wsize, xd=xd, yd=yd, hd=hd, cd=cd, wss=wss, rss=rss, dirs=dirs, out=out,
                ws=torch.empty(wss, dtype=torch.uint8, device="cuda"),
                rs=torch.empty(rss, dtype=torch.uint8, device="cuda"),
                lens=torch.tensor(lens, dtype=torch.int32, device="cuda"))


def main():
    quick = "--quick" in sys.argv
    # --mid: PERSIST_STATIC small-hidden rows with SKIP_INPUT and without BackwardWeights: no matmul kernel is
    # compiled (the mid-session GPU run's budget); pydnn's times then lack the input GEMM (cuDNN's include it):
    # the forward rows also print "est", pydnn's time plus torch.mm's for the input GEMM's shape, and its ratio
    mid = "--mid" in sys.argv
    tuning.rnn.SPLIT_K = "--no-split" not in sys.argv
    tuning.rnn.RECORD = "--no-record" not in sys.argv
    tuning.rnn.DIR_BATCH = "--no-dir-batch" not in sys.argv
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    h = pydnn.create()
    pydnn.set_stream(h, torch.cuda.current_stream().cuda_stream)
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
          f"split-K {tuning.rnn.SPLIT_K}, record {tuning.rnn.RECORD}, direction batching {tuning.rnn.DIR_BATCH}")
    print(f"{'case':22s} {'what':8s} {'pydnn ms':>9s} {'torch ms':>9s} {'pydnn TF/s':>10s} {'torch TF/s':>10s} "
          f"{'ratio':>6s}")
    only = [a.split("=", 1)[1] for a in sys.argv if a.startswith("--only=")]
    ab = []  # (label, {switch: value})
    for a in sys.argv:
        if a.startswith("--ab="):  # rnn.SWITCH=VALUE[+rnn.SWITCH=VALUE ...]
            sets = {}
            for one in a[5:].split("+"):
                name, val = one.split("=", 1)
                fam, sw = name.split(".", 1)
                assert fam == "rnn", a
                sets[sw] = ast.literal_eval(val)
            ab.append(("+".join(f"{k}={v}" for k, v in sets.items()), sets))
    exact = [a.split("=", 1)[1] for a in sys.argv if a.startswith("--case=")]
    stamps = "--stamps" in sys.argv
    for name, cell, tname, T, B, H, layers, bi, algo in CASES:
        if (quick and name not in QUICK) or ((only or exact) and not any(o in name for o in only)
                                             and name not in exact):
            continue
        # the settings that concern this case: PERSIST_* switches on PERSIST_STATIC rows, the others elsewhere
        ab_case = [(lab, sets) for lab, sets in ab if all(k.startswith("PERSIST") == (algo == PS) for k in sets)]
        if mid and (algo != PS or layers != 1):
            continue
        tdt = getattr(torch, tname)
        try:
            s = _setup(h, cell, tdt, T, B, H, layers, bi, algo, skip=mid, P=PROJ.get(name, 0))
        except pydnn.PydnnError as e:
            print(f"{name:22s} {e}")
            continue
        dirs, lstm, out = s["dirs"], cell == E.PYDNN_LSTM, s["out"]
        x = torch.randn(T, B, H, device="cuda", dtype=tdt)
        hx = torch.randn(layers * dirs, B, out, device="cuda", dtype=tdt) * 0.5
        cx = torch.randn(layers * dirs, B, H, device="cuda", dtype=tdt) * 0.5
        y = torch.empty(T, B, dirs * out, device="cuda", dtype=tdt)
        hy, cy = torch.empty_like(hx), torch.empty_like(cx)
        dy = torch.randn_like(y)
        dx, dhx, dcx = torch.empty_like(x), torch.empty_like(hx), torch.empty_like(cx)
        dw = torch.zeros_like(s["w"])
        r, w, wsize, xd, yd, hd, cd = s["r"], s["w"], s["wsize"], s["xd"], s["yd"], s["hd"], s["cd"]
        for _, sets in ab_case:  # the workspace / reserve space for every setting
            with tuning.override({f"rnn.{k}": v for k, v in sets.items()}):
                try:
                    wss, rss = pydnn.get_rnn_temp_space_sizes(h, r, E.PYDNN_FWD_MODE_TRAINING, xd)
                except pydnn.PydnnError:
                    continue
            if wss > s["wss"]:
                s["wss"], s["ws"] = wss, torch.empty(wss, dtype=torch.uint8, device="cuda")
            if rss > s["rss"]:
                s["rss"], s["rs"] = rss, torch.empty(rss, dtype=torch.uint8, device="cuda")

        def p_fwd():
            pydnn.rnn_forward(h, r, E.PYDNN_FWD_MODE_TRAINING, s["lens"], xd, x, yd, y, hd, hx, hy, cd,
                              cx if lstm else 0, cy if lstm else 0, wsize, w, s["wss"], s["ws"], s["rss"], s["rs"])

        def p_all():
            p_fwd()
            pydnn.rnn_backward_data_v8(h, r, s["lens"], yd, y, dy, xd, dx, hd, hx, 0, dhx, cd, cx if lstm else 0, 0,
                                       dcx if lstm else 0, wsize, w, s["wss"], s["ws"], s["rss"], s["rs"])
            if mid:
                return
            pydnn.rnn_backward_weights_v8(h, r, E.PYDNN_WGRAD_MODE_ADD, s["lens"], xd, x, hd, hx, yd, y, wsize, dw,
                                          s["wss"], s["ws"], s["rss"], s["rs"])

        mod = s["mod"]
        h0 = (hx, cx) if lstm else hx

        def t_fwd():
            return mod(x, h0)[0]

        def t_all():
            out = mod(x, h0)[0]
            out.backward(dy)

        with torch.no_grad():
            p_fwd()
            ref = mod(x, h0)[0]
        torch.cuda.synchronize()
        diff = float((y.float() - ref.float()).abs().max() / ref.float().abs().max())
        y0 = y.float().clone()  # the default setting's y: each other setting's is compared with it
        flops = _flops(cell, T, B, H, layers, dirs, PROJ.get(name, 0))
        default = tuning.rnn.PERSIST_XCHG
        runs = [("fwd", p_fwd, t_fwd, 1, default), ("fwd+bwd", p_all, t_all, 3, default)]
        if algo == PS:  # the forward's other exchange (tuning.rnn.PERSIST_XCHG flipped)
            other = "tag" if not default else "bar"
            runs += [(f"fwd {other}", p_fwd, t_fwd, 1, not default), (f"all {other}", p_all, t_all, 3, not default)]
        runs = [(what, pf, tf, mult, {"PERSIST_XCHG": xchg}) for what, pf, tf, mult, xchg in runs]
        for label, sets in ab_case:
            runs += [(f"fwd {label}", p_fwd, t_fwd, 1, sets), (f"all {label}", p_all, t_all, 3, sets)]
        gemm_ms = None
        if mid:  # SKIP_INPUT leaves the input GEMM out of pydnn's time: torch.mm of its shape stands in for it
            xi = x.reshape(T * B, H)
            wi = torch.randn(G[cell] * H * dirs, H, device="cuda", dtype=tdt)
            gemm_ms = time_ms(lambda: torch.mm(xi, wi.t()), reps=5, warmup=2)
            print(f"{name:22s} --mid: the input GEMM [{T * B}, {H}] x [{H}, {G[cell] * H * dirs}] (torch.mm) "
                  f"{gemm_ms:.3f} ms, added to pydnn's forward times as 'est'", flush=True)
        for what, pf, tf, mult, sets in runs:
            check = ""
            with tuning.override({f"rnn.{k}": v for k, v in sets.items()}):
                try:
                    if what.startswith("fwd "):  # the setting's own y against the default setting's
                        y.fill_(float("nan"))
                        p_fwd()
                        torch.cuda.synchronize()
                        dd = float((y.float() - y0).abs().max() / y0.abs().max())
                        check = f", max rel diff y from the default's {dd:.2e}"
                    pm = time_ms(pf, reps=5, warmup=2)
                except pydnn.PydnnError as e:
                    print(f"{name:22s} {what:8s} {e}")
                    continue
            tm = time_ms(tf, reps=5, warmup=2)
            f = flops * mult
            print(f"{name:22s} {what:8s} {pm:9.3f} {tm:9.3f} {f / pm / 1e9:10.1f} {f / tm / 1e9:10.1f} "
                  f"{tm / pm:6.2f}" + (f"   max rel diff y {diff:.2e}, {pm / T * 1e3:.2f} us/step" if what == "fwd"
                                       else f"   {pm / T * 1e3:.2f} us/step{check}" if what.startswith("fwd ")
                                       else "")
                  + (f", est {pm + gemm_ms:.3f} ms ratio {tm / (pm + gemm_ms):.2f}"
                     if gemm_ms is not None and (what == "fwd" or what.startswith("fwd ")) else ""),
                  flush=True)
        if stamps and algo == PS:
            buf = torch.zeros(T * persist.STAMPS, dtype=torch.int64, device="cuda")
            for label, sets in [("default", {})] + ab_case:
                with tuning.override({f"rnn.{k}": v for k, v in sets.items()}):
                    buf.zero_()
                    persist.stamps_buffer = buf.data_ptr()
                    try:
                        p_fwd()
                    finally:
                        persist.stamps_buffer = 0
                    torch.cuda.synchronize()
                st = buf.view(T, persist.STAMPS).cpu().double()
                ph = ["wait", "h", "gemm", "cell", "arrive+p2"]
                d = [(st[1:T - 1, k + 1] - st[1:T - 1, k]).mean().item() for k in range(5)]
                loop = (st[2:T, 0] - st[1:T - 1, 5]).mean().item()
                step = (st[2:T, 0] - st[1:T - 1, 0]).mean().item()
                print(f"{name:22s} stamps {label:18s} cycles/step {step:7.0f}: "
                      + ", ".join(f"{n} {v:.0f}" for n, v in zip(ph, d)) + f", loop {loop:.0f}", flush=True)
        s = None  # free the buffers before the next case
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
