#!/usr/bin/env python3
"""Memory-bound families sweep (issue 20): pydnn against PyTorch's equivalent op in the same run, over a
seeded grid of shapes, fp32 / fp16 / bf16.

    python3 tools/sweep_memory.py [--quick] [--budget-s S] [--seed 0] [--out DIR] [--reps N] [--only FAMS]
        [--points 'family [layout] shape [variant] dtype;...'] [--torch-stats]

--budget-s defaults to 140 s (30 s with --quick) so that the full sweep ends in about 150 s on an H100 / H200
(the elapsed time is printed at the end, and the summary says whether points were left unsampled).

Families (FAMILIES; `--only` takes their names):
  rows x hidden (row-wise):  act_fwd (relu / gelu_tanh / sigmoid / tanh by point), act_bwd (relu / sigmoid),
      op_add (OpTensor c = a + b), add_tensor (c += a, same shape or a bias row by point), reduce (sum / max /
      average over hidden, by point), softmax_instance (dims rows x 1 x 1 x hidden), ln_* / rms_* (layer / RMS norm: fwd_train,
      fwd_infer, bwd), dropout_fwd / dropout_bwd (p = 0.1);
  N x C x H x W, NCHW or NHWC by point (spatial):  softmax_channel, pool_fwd / pool_bwd (max 3x3/2 pad 1 or
      average 2x2/2 by point, smaller windows for H < 3), bn_train / bn_infer / bn_bwd (batch norm, SPATIAL),
      gn_* / in_* (group norm with the largest of 32..1 groups dividing C, instance norm: fwd_train,
      fwd_infer, bwd).
Grid (grid(); built without a GPU, checked by tests/hard/test_sweeps_cpu.py): per family and dtype
POINTS_PER shapes, one per slice of the size range (the input tensor's bytes, 4 KB .. 4 GB, cut into
POINTS_PER log-equal slices), drawn with a seeded generator: hidden 64 .. 65536 (a third powers of two, a
third multiples of 8 that are not, a third any integer), rows 1 .. 1M; N 1 .. 256, C 3 .. 2048, H = W
1 .. 224 (log-uniform). Points run round-robin over (family, dtype) until --budget-s is spent. A point
whose buffers would take more than MEM_FRACTION of the free memory is an OOM row (not run).

Per point: ratio = PyTorch ms / pydnn ms (above 1: pydnn faster); for inputs of 64 MB and more the % of
copy bandwidth (the fewest bytes the op must move, as tools/bench.py counts them, over a device-to-device
copy's bandwidth measured in the same run); for inputs under 1 MB the time per call minus an empty
kernel's (launched through the driver on the same stream, timed the same way). Timing: tools/bench.py's
time_ms (events, warm-up, median of back-to-back calls: for the smallest tensors that is the rate at which
calls can be issued, host time included, on both sides); under 1 MB also the device time per call from a
CUDA graph of 20 calls (sweep_common.graph_ms), minus the empty kernel's in a graph: the launch's fixed
cost on the GPU without the host's. One point per family and dtype is checked
against PyTorch before timing (max error relative to the largest |value|; fp32 1e-4, fp16 4e-3, bf16
2e-2; dropout: the kept elements against x / (1 - p) and the dropped fraction).
Targets (issue 20): >= 1.0x on every point, >= 1.2x geomean; >= 90% of copy (geomean per family, >= 64 MB),
no point below 80%; under 1 MB within 1.5 us of the empty kernel.
"""
import math
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sweep_common as SC  # noqa: E402

DTYPES = ("fp32", "fp16", "bf16")
ES = {"fp32": 4, "fp16": 2, "bf16": 2}
TOL = {"fp32": 1e-4, "fp16": 4e-3, "bf16": 2e-2}
MIN_BYTES, MAX_BYTES = 4 << 10, 4 << 30
BIG, SMALL = 64 << 20, 1 << 20
POINTS_PER = 6
MEM_FRACTION = 0.7
P_DROP = 0.1

ROW_FAMILIES = ("act_fwd", "act_bwd", "op_add", "add_tensor", "reduce", "softmax_instance",
                "ln_fwd_train", "ln_fwd_infer", "ln_bwd", "rms_fwd_train", "rms_fwd_infer", "rms_bwd",
                "dropout_fwd", "dropout_bwd")
SPATIAL_FAMILIES = ("softmax_channel", "pool_fwd", "pool_bwd", "bn_train", "bn_infer", "bn_bwd",
                    "gn_fwd_train", "gn_fwd_infer", "gn_bwd", "in_fwd_train", "in_fwd_infer", "in_bwd")
FAMILIES = ROW_FAMILIES + SPATIAL_FAMILIES
# buffers of the input's size a point holds at once (pydnn's and PyTorch's outputs, the spot check's float
# copies and autograd's saved tensors included, roughly): the memory cap
NBUF = {"act_fwd": 4, "act_bwd": 5, "op_add": 5, "add_tensor": 4, "reduce": 3, "softmax_instance": 4,
        "ln_fwd_train": 4, "ln_fwd_infer": 4, "ln_bwd": 7, "rms_fwd_train": 4, "rms_fwd_infer": 4, "rms_bwd": 8,
        "dropout_fwd": 5, "dropout_bwd": 8, "softmax_channel": 4, "pool_fwd": 4, "pool_bwd": 7, "bn_train": 4,
        "bn_infer": 4, "bn_bwd": 7, "gn_fwd_train": 4, "gn_fwd_infer": 4, "gn_bwd": 8, "in_fwd_train": 4,
        "in_fwd_infer": 4, "in_bwd": 8}
VARIANTS = {"act_fwd": ("relu", "gelu_tanh", "sigmoid", "tanh"), "act_bwd": ("relu", "sigmoid"),
            "add_tensor": ("same", "bias"), "reduce": ("sum", "max", "avg"), "pool_fwd": ("max", "avg"),
            "pool_bwd": ("max", "avg")}
# spatial families that need more than one value per channel / instance (PyTorch refuses otherwise)
NEEDS_SPATIAL = {"bn_train": "nhw", "bn_bwd": "nhw", "in_fwd_train": "hw", "in_fwd_infer": "hw", "in_bwd": "hw"}


def _logu(rng, lo, hi):
    return max(lo, min(hi, int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))))


def _hidden(rng):
    kind = rng.randrange(3)
    if kind == 0:
        return 2 ** rng.randint(6, 16)
    while True:
        h = _logu(rng, 64, 65536)
        if kind == 1:
            h = max(64, h // 8 * 8)
            if h & (h - 1):
                return h
        else:
            return h


def _groups(c):
    return next(g for g in (32, 16, 8, 4, 2, 1) if c % g == 0)


def point_bytes(p):
    if "rows" in p:
        return p["rows"] * p["hidden"] * ES[p["dtype"]]
    return p["n"] * p["c"] * p["hw"] ** 2 * ES[p["dtype"]]


def _row_point(rng, fam, dt, lo, hi):
    es = ES[dt]
    for _ in range(2000):
        hidden = _hidden(rng)
        target = math.exp(rng.uniform(math.log(lo), math.log(hi)))
        rows = max(1, min(1 << 20, int(round(target / (hidden * es)))))
        p = dict(family=fam, dtype=dt, rows=rows, hidden=hidden)
        if lo <= point_bytes(p) < hi:
            return p
    return p


def _spatial_ok(fam, n, hw):
    need = NEEDS_SPATIAL.get(fam)
    return not need or (hw * hw if need == "hw" else n * hw * hw) >= 2


def _spatial_point(rng, fam, dt, lo, hi):
    for _ in range(4000):
        n, c, hw = _logu(rng, 1, 256), _logu(rng, 3, 2048), _logu(rng, 1, 224)
        p = dict(family=fam, dtype=dt, n=n, c=c, hw=hw, layout=rng.choice(("NCHW", "NHWC")))
        if lo <= point_bytes(p) < hi and _spatial_ok(fam, n, hw):
            return p
    p.update(n=max(2, p["n"]), hw=max(2, p["hw"]))  # (only when the slice could not be hit: the last draw)
    return p


def family_points(rng, fam, dt, count):
    edges = [math.exp(math.log(MIN_BYTES) + (math.log(MAX_BYTES) - math.log(MIN_BYTES)) * i / count)
             for i in range(count + 1)]
    pts = []
    for i in range(count):
        lo, hi = edges[i], edges[i + 1]
        p = (_row_point if fam in ROW_FAMILIES else _spatial_point)(rng, fam, dt, lo, hi)
        vs = VARIANTS.get(fam)
        if vs:
            p["variant"] = vs[rng.randrange(len(vs))]
        pts.append(p)
    rng.shuffle(pts)
    return pts


QUICK_DTYPE = {"act_fwd": "fp32", "ln_fwd_train": "fp16"}  # --quick: bf16 elsewhere (few kernel units to load)


def grid(seed=0, quick=False, points_per=POINTS_PER, families=FAMILIES):
    """(points in run order, meta): round-robin over (family, dtype) lists."""
    rng = random.Random(seed)
    lists = []
    for fam in families:
        for dt in DTYPES:
            pts = family_points(rng, fam, dt, points_per)
            if quick:
                if dt != QUICK_DTYPE.get(fam, "bf16"):
                    continue
                # one mid-size point (64 KB .. 16 MB) per family: compiled kernels, not bandwidth, are the question
                sub = random.Random(f"{seed}-{fam}")
                p = (_row_point if fam in ROW_FAMILIES else _spatial_point)(sub, fam, dt, 64 << 10, 16 << 20)
                if VARIANTS.get(fam):
                    p["variant"] = VARIANTS[fam][0]
                pts = [p]
            lists.append(pts)
    order = []
    for i in range(max(len(x) for x in lists)):
        order += [x[i] for x in lists if i < len(x)]
    return order, dict(seed=seed, points_per=points_per, quick=quick)


def parse_point(spec):
    """A point from its log line's words, 'family [NCHW|NHWC] RxH|NxCxHxW [variant] dtype' (e.g. 'gn_fwd_infer
    NCHW 3x103x99x99 fp32', 'reduce 53513x2824 avg fp32'): --points re-runs chosen points of a sweep."""
    words = spec.split()
    fam, dt = words[0], words[-1]
    if fam not in FAMILIES or dt not in DTYPES:
        raise ValueError(f"--points: {spec!r}: want 'family [layout] shape [variant] dtype'")
    p = dict(family=fam, dtype=dt)
    for w in words[1:-1]:
        if w in ("NCHW", "NHWC"):
            p["layout"] = w
        elif "x" in w and all(v.isdigit() for v in w.split("x")):
            dims = [int(v) for v in w.split("x")]
            if fam in ROW_FAMILIES:
                p.update(rows=dims[0], hidden=dims[1])
            else:
                p.update(n=dims[0], c=dims[1], hw=dims[2])
        else:
            p["variant"] = w
    if fam in SPATIAL_FAMILIES:
        p.setdefault("layout", "NCHW")
    if VARIANTS.get(fam) and p.get("variant") not in VARIANTS[fam]:
        raise ValueError(f"--points: {spec!r}: {fam} takes a variant of {VARIANTS[fam]}")
    return p


def case_name(p):
    v = f" {p['variant']}" if p.get("variant") else ""
    if "rows" in p:
        return f"{p['rows']}x{p['hidden']}{v}"
    return f"{p['layout']} {p['n']}x{p['c']}x{p['hw']}x{p['hw']}{v}"


def pool_window(hw, mode):
    """(window, stride, pad) for an H = W input: max 3x3/2 pad 1, average 2x2/2; smaller for H < 3."""
    if hw == 1:
        return 1, 1, 0
    if mode == "max" and hw >= 3:
        return 3, 2, 1
    return 2, 2, 0


# ----------------------------------------------------------------------------------- GPU part
class Ctx:
    """What a point needs of the run: h (handle), timer, copy_gbs, empty_ms, graph_timer, graph_empty_ms."""
    graph_timer = None
    graph_empty_ms = None  # None: no CUDA-graph timing (unavailable, or a capture failed earlier)
    torch_stats = False    # --torch-stats: norm backward points take their saved statistics from PyTorch
    paired = 0             # --paired N: both sides timed in N alternating rounds (bench.time_pair), not one block each
    warm_ms = 0.0          # --warm-ms T: both sides called alternately for >= T ms of device time before the timing


def _tdt(dt):
    import torch
    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dt]


def _pdt(dt):
    import pydnn
    return {"fp32": pydnn.PYDNN_DATA_FLOAT, "fp16": pydnn.PYDNN_DATA_HALF, "bf16": pydnn.PYDNN_DATA_BFLOAT16}[dt]


def _nd_desc(t, pdt):
    import pydnn
    d = pydnn.create_tensor_descriptor()
    pydnn.set_tensor_nd_descriptor(d, pdt, t.dim(), list(t.shape), list(t.stride()))
    return d


def _x(p, scale=1.0):
    import torch
    tdt = _tdt(p["dtype"])
    if "rows" in p:
        return torch.randn(p["rows"], p["hidden"], dtype=tdt, device=SC.DEV) * scale
    x = torch.randn(p["n"], p["c"], p["hw"], p["hw"], dtype=tdt, device=SC.DEV) * scale
    return x.contiguous(memory_format=torch.channels_last) if p["layout"] == "NHWC" else x


def _case(p_fn, t_fn, nbytes, out=None, ref=None, check=None):
    return dict(p=p_fn, t=t_fn, nbytes=nbytes, out=out, ref=ref, check=check)


def build(c, p):
    """The point's pydnn and PyTorch calls: {p, t, nbytes, out + ref or check}."""
    import torch
    import torch.nn.functional as F
    import pydnn
    from bench import desc

    h, fam, dt = c.h, p["family"], p["dtype"]
    tdt, pdt = _tdt(dt), _pdt(dt)
    var = p.get("variant")
    x = _x(p)
    es = x.element_size()
    n = x.numel()
    f32 = dict(dtype=torch.float32, device=SC.DEV)

    if fam == "act_fwd":
        mode, tfn = {"relu": (pydnn.PYDNN_ACTIVATION_RELU, torch.relu),
                     "gelu_tanh": (pydnn.PYDNN_ACTIVATION_GELU_TANH, lambda v: F.gelu(v, approximate="tanh")),
                     "sigmoid": (pydnn.PYDNN_ACTIVATION_SIGMOID, torch.sigmoid),
                     "tanh": (pydnn.PYDNN_ACTIVATION_TANH, torch.tanh)}[var]
        y = torch.empty_like(x)
        a = pydnn.create_activation_descriptor()
        pydnn.set_activation_descriptor(a, mode, pydnn.PYDNN_NOT_PROPAGATE_NAN, 0.0)
        d = desc(x, dtype=pdt)
        return _case(lambda: pydnn.activation_forward(h, a, 1.0, d, x.data_ptr(), 0.0, d, y.data_ptr()),
                     lambda: tfn(x), 2 * n * es, y, lambda: tfn(x))
    if fam == "act_bwd":
        a = pydnn.create_activation_descriptor()
        d = desc(x, dtype=pdt)
        g, dx = torch.randn_like(x), torch.empty_like(x)
        if var == "relu":
            pydnn.set_activation_descriptor(a, pydnn.PYDNN_ACTIVATION_RELU, pydnn.PYDNN_NOT_PROPAGATE_NAN, 0.0)
            y = torch.relu(x)
            tfn = lambda: torch.ops.aten.threshold_backward(g, x, 0.0)  # noqa: E731
        else:
            pydnn.set_activation_descriptor(a, pydnn.PYDNN_ACTIVATION_SIGMOID, pydnn.PYDNN_NOT_PROPAGATE_NAN, 0.0)
            y = torch.sigmoid(x)
            tfn = lambda: torch.ops.aten.sigmoid_backward(g, y)  # noqa: E731
        # relu backward reads x (and dy), sigmoid backward y (and dy): 3 tensors moved either way
        return _case(lambda: pydnn.activation_backward(h, a, 1.0, d, y.data_ptr(), d, g.data_ptr(), d, x.data_ptr(),
                                                       0.0, d, dx.data_ptr()), tfn, 3 * n * es, dx, tfn)
    if fam == "op_add":
        b, out = torch.randn_like(x), torch.empty_like(x)
        d = desc(x, dtype=pdt)
        op = pydnn.create_op_tensor_descriptor()
        pydnn.set_op_tensor_descriptor(op, pydnn.PYDNN_OP_TENSOR_ADD, pydnn.PYDNN_DATA_FLOAT,
                                       pydnn.PYDNN_NOT_PROPAGATE_NAN)
        tout = torch.empty_like(x)
        return _case(lambda: pydnn.op_tensor(h, op, 1.0, d, x.data_ptr(), 1.0, d, b.data_ptr(), 0.0, d, out.data_ptr()),
                     lambda: torch.add(x, b, out=tout), 3 * n * es, out, lambda: x + b)
    if fam == "add_tensor":
        cc = torch.randn_like(x)
        if var == "bias":
            a = torch.randn(1, x.shape[1], dtype=tdt, device=SC.DEV)
            nbytes = 2 * n * es
        else:
            a = torch.randn_like(x)
            nbytes = 3 * n * es
        da, dc = desc(a, dtype=pdt), desc(cc, dtype=pdt)

        def check():
            want = (cc.float() + a.float()).to(tdt)
            pydnn.add_tensor(h, 1.0, da, a.data_ptr(), 1.0, dc, cc.data_ptr())
            return SC.close_rel(cc, want, TOL[dt])
        return _case(lambda: pydnn.add_tensor(h, 1.0, da, a.data_ptr(), 1.0, dc, cc.data_ptr()),
                     lambda: cc.add_(a), nbytes, check=check)
    if fam == "reduce":
        y = torch.empty(x.shape[0], 1, dtype=tdt, device=SC.DEV)
        dx_, dy_ = desc(x, dtype=pdt), desc(y, dtype=pdt)
        op, tfn, rfn = {"sum": (pydnn.PYDNN_REDUCE_TENSOR_ADD, lambda: x.sum(dim=1), lambda v: v.sum(dim=1)),
                        "max": (pydnn.PYDNN_REDUCE_TENSOR_MAX, lambda: x.amax(dim=1), lambda v: v.amax(dim=1)),
                        "avg": (pydnn.PYDNN_REDUCE_TENSOR_AVG, lambda: x.mean(dim=1), lambda v: v.mean(dim=1))}[var]
        r = pydnn.create_reduce_tensor_descriptor()
        pydnn.set_reduce_tensor_descriptor(r, op, pydnn.PYDNN_DATA_FLOAT,
                                           pydnn.PYDNN_NOT_PROPAGATE_NAN, pydnn.PYDNN_REDUCE_TENSOR_NO_INDICES,
                                           pydnn.PYDNN_32BIT_INDICES)
        ws_n = pydnn.get_reduction_workspace_size(h, r, dx_, dy_)
        ws = torch.empty(max(ws_n, 1), dtype=torch.uint8, device=SC.DEV)
        return _case(lambda: pydnn.reduce_tensor(h, r, None, 0, ws.data_ptr(), ws_n, 1.0, dx_, x.data_ptr(), 0.0, dy_,
                                                 y.data_ptr()),
                     tfn, n * es, y, lambda: rfn(x.float()))
    if fam in ("softmax_instance", "softmax_channel"):
        if fam == "softmax_instance":
            x4 = x.view(x.shape[0], 1, 1, x.shape[1])
            mode, tfn = pydnn.PYDNN_SOFTMAX_MODE_INSTANCE, (lambda: torch.softmax(x, dim=-1))
        else:
            x4 = x
            mode, tfn = pydnn.PYDNN_SOFTMAX_MODE_CHANNEL, (lambda: torch.softmax(x, dim=1))
        y = torch.empty_like(x4)
        d = _nd_desc(x4, pdt)
        return _case(lambda: pydnn.softmax_forward(h, pydnn.PYDNN_SOFTMAX_ACCURATE, mode, 1.0, d, x4.data_ptr(), 0.0, d,
                                                   y.data_ptr()),
                     tfn, 2 * n * es, y, lambda: tfn().view(y.shape))
    if fam in ("pool_fwd", "pool_bwd"):
        k, s, pad = pool_window(p["hw"], var)
        mode = pydnn.PYDNN_POOLING_MAX if var == "max" else pydnn.PYDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING
        pd = pydnn.create_pooling_descriptor()
        pydnn.set_pooling2d_descriptor(pd, mode, pydnn.PYDNN_NOT_PROPAGATE_NAN, k, k, pad, pad, s, s)
        if var == "max":
            tf = lambda: F.max_pool2d(x, k, s, pad)  # noqa: E731
        else:
            tf = lambda: F.avg_pool2d(x, k, s, pad)  # noqa: E731
        y = tf().contiguous(memory_format=torch.channels_last if p["layout"] == "NHWC" else torch.contiguous_format)
        xd, yd = _nd_desc(x, pdt), _nd_desc(y, pdt)
        if fam == "pool_fwd":
            yp = torch.empty_like(y)
            return _case(lambda: pydnn.pooling_forward(h, pd, 1.0, xd, x.data_ptr(), 0.0, yd, yp.data_ptr()), tf,
                         (x.numel() + y.numel()) * es, yp, tf)
        dy, dx = torch.randn_like(y), torch.empty_like(x)
        if var == "max":
            _, idx = F.max_pool2d(x, k, s, pad, return_indices=True)
            tb = lambda: torch.ops.aten.max_pool2d_with_indices_backward(dy, x, [k, k], [s, s], [pad, pad], [1, 1],  # noqa
                                                                         False, idx)
            nbytes = 2 * (x.numel() + y.numel()) * es
        else:
            tb = lambda: torch.ops.aten.avg_pool2d_backward(dy, x, [k, k], [s, s], [pad, pad], False, True, None)  # noqa
            nbytes = (x.numel() + y.numel()) * es
        return _case(lambda: pydnn.pooling_backward(h, pd, 1.0, yd, y.data_ptr(), yd, dy.data_ptr(), xd, x.data_ptr(),
                                                    0.0, xd, dx.data_ptr()), tb, nbytes, dx, tb)
    if fam in ("bn_train", "bn_infer", "bn_bwd"):
        C = p["c"]
        S = pydnn.PYDNN_BATCHNORM_SPATIAL
        xd = _nd_desc(x, pdt)
        bd = pydnn.create_tensor_descriptor()
        pydnn.derive_bn_tensor_descriptor(bd, xd, S)
        w, bias = torch.rand(C, **f32) + 0.5, torch.randn(C, **f32)
        rm, rv = torch.zeros(C, **f32), torch.ones(C, **f32)
        trm, trv = rm.clone(), rv.clone()
        sm, si = torch.empty(C, **f32), torch.empty(C, **f32)
        y = torch.empty_like(x)
        if fam == "bn_train":
            return _case(lambda: pydnn.batch_normalization_forward_training(
                h, S, 1.0, 0.0, xd, x.data_ptr(), xd, y.data_ptr(), bd, w.data_ptr(), bias.data_ptr(), 0.1,
                rm.data_ptr(), rv.data_ptr(), 1e-5, sm.data_ptr(), si.data_ptr()),
                lambda: F.batch_norm(x, trm, trv, w, bias, training=True, momentum=0.1, eps=1e-5), 2 * n * es, y,
                lambda: F.batch_norm(x, trm.clone(), trv.clone(), w, bias, training=True, momentum=0.1, eps=1e-5))
        if fam == "bn_infer":
            rm.uniform_(-0.5, 0.5)
            rv.uniform_(0.5, 1.5)
            return _case(lambda: pydnn.batch_normalization_forward_inference(
                h, S, 1.0, 0.0, xd, x.data_ptr(), xd, y.data_ptr(), bd, w.data_ptr(), bias.data_ptr(), rm.data_ptr(),
                rv.data_ptr(), 1e-5),
                lambda: F.batch_norm(x, rm, rv, w, bias, training=False, eps=1e-5), 2 * n * es, y,
                lambda: F.batch_norm(x, rm, rv, w, bias, training=False, eps=1e-5))
        dy, dx = torch.randn_like(x), torch.empty_like(x)
        ds, db = torch.empty(C, **f32), torch.empty(C, **f32)
        pydnn.batch_normalization_forward_training(h, S, 1.0, 0.0, xd, x.data_ptr(), xd, y.data_ptr(), bd,
                                                   w.data_ptr(), bias.data_ptr(), 0.1, rm.data_ptr(), rv.data_ptr(),
                                                   1e-5, sm.data_ptr(), si.data_ptr())
        _, tsm, tsi = torch.ops.aten.native_batch_norm(x, w, bias, trm, trv, True, 0.1, 1e-5)[:3]
        tb = lambda: torch.ops.aten.native_batch_norm_backward(dy, x, w, trm, trv, tsm, tsi, True, 1e-5,  # noqa: E731
                                                               [True, True, True])
        return _case(lambda: pydnn.batch_normalization_backward(
            h, S, 1.0, 0.0, 1.0, 0.0, xd, x.data_ptr(), xd, dy.data_ptr(), xd, dx.data_ptr(), bd, w.data_ptr(),
            ds.data_ptr(), db.data_ptr(), 1e-5, sm.data_ptr(), si.data_ptr()), tb, 3 * n * es, dx, lambda: tb()[0])
    if fam.split("_")[0] in ("ln", "rms", "gn", "in"):
        kind_name, what = fam.split("_", 1)
        kind = {"ln": pydnn.PYDNN_NORM_KIND_LAYER, "rms": pydnn.PYDNN_NORM_KIND_RMS,
                "gn": pydnn.PYDNN_NORM_KIND_GROUP, "in": pydnn.PYDNN_NORM_KIND_INSTANCE}[kind_name]
        if kind_name in ("ln", "rms"):
            L, R = x.shape[1], x.shape[0]
            nstat, nparam, G = R, L, 1
        else:
            G = _groups(p["c"]) if kind_name == "gn" else p["c"]
            nstat, nparam = p["n"] * G, p["c"]
        nd = pydnn.create_norm_descriptor()
        pydnn.set_norm_descriptor(nd, kind, G if kind_name == "gn" else 1, 1, 1e-5, None)
        xd = _nd_desc(x, pdt)
        sb, st = pydnn.create_tensor_descriptor(), pydnn.create_tensor_descriptor()
        pydnn.derive_norm_param_descriptors(sb, st, xd, nd)
        w = torch.rand(nparam, **f32) + 0.5
        bias = None if kind_name == "rms" else torch.randn(nparam, **f32)
        bp = bias.data_ptr() if bias is not None else 0
        wt, bt = w.to(tdt), (bias.to(tdt) if bias is not None else None)
        mean, inv = torch.empty(nstat, **f32), torch.empty(nstat, **f32)
        y = torch.empty_like(x)
        if kind_name == "ln":
            tf = lambda xx=x: F.layer_norm(xx, [L], wt, bt, 1e-5)  # noqa: E731
        elif kind_name == "rms":
            tf = lambda xx=x: F.rms_norm(xx, [L], wt, 1e-5)  # noqa: E731
        elif kind_name == "gn":
            tf = lambda xx=x: F.group_norm(xx, G, wt, bt, 1e-5)  # noqa: E731
        else:
            tf = lambda xx=x: F.instance_norm(xx, weight=wt, bias=bt, eps=1e-5)  # noqa: E731
        fwd_train = (lambda: pydnn.norm_forward_training(h, nd, 1.0, 0.0, xd, x.data_ptr(), xd, y.data_ptr(), sb,
                                                         w.data_ptr(), bp, st, mean.data_ptr(), inv.data_ptr()))
        if what == "fwd_train":
            tt = (lambda: torch.ops.aten.native_layer_norm(x, [L], wt, bt, 1e-5)) if kind_name == "ln" else tf
            return _case(fwd_train, tt, 2 * n * es, y, tf)
        if what == "fwd_infer":
            return _case(lambda: pydnn.norm_forward_inference(h, nd, 1.0, 0.0, xd, x.data_ptr(), xd, y.data_ptr(), sb,
                                                              w.data_ptr(), bp),
                         lambda: _no_grad(tf), 2 * n * es, y, tf)
        dy, dx = torch.randn_like(x), torch.empty_like(x)
        dw, db = torch.empty(nparam, **f32), torch.empty(nparam, **f32)
        dbp = db.data_ptr() if bias is not None else 0
        if c.torch_stats:  # (--torch-stats: the saved statistics from PyTorch, no pydnn forward kernel needed)
            xs = x.float().reshape(nstat, -1)
            var = (xs * xs).mean(dim=1) if kind_name == "rms" else xs.var(dim=1, unbiased=False)
            mean.copy_(xs.mean(dim=1))
            inv.copy_(torch.rsqrt(var + 1e-5))
        else:
            fwd_train()
        ws_n = pydnn.get_norm_backward_workspace_size(h, nd, xd, xd, xd, sb, st)
        ws = torch.empty(max(1, ws_n), dtype=torch.uint8, device=SC.DEV)
        if kind_name == "ln":
            _, tm, tr = torch.ops.aten.native_layer_norm(x, [L], wt, bt, 1e-5)
            tb = lambda: torch.ops.aten.native_layer_norm_backward(dy, x, [L], tm, tr, wt, bt,  # noqa: E731
                                                                   [True, True, True])
        else:
            xr = x.detach().clone().requires_grad_(True)
            wr = wt.detach().clone().requires_grad_(True)
            br = bt.detach().clone().requires_grad_(True) if bt is not None else None
            if kind_name == "rms":
                yr = F.rms_norm(xr, [L], wr, 1e-5)
            elif kind_name == "gn":
                yr = F.group_norm(xr, G, wr, br, 1e-5)
            else:
                yr = F.instance_norm(xr, weight=wr, bias=br, eps=1e-5)
            ins = tuple(v for v in (xr, wr, br) if v is not None)
            tb = lambda: torch.autograd.grad(yr, ins, dy, retain_graph=True)  # noqa: E731
        return _case(lambda: pydnn.norm_backward(h, nd, 1.0, 0.0, 1.0, 0.0, xd, x.data_ptr(), xd, dy.data_ptr(), xd,
                                                 dx.data_ptr(), sb, w.data_ptr(), bp, dw.data_ptr(), dbp, st,
                                                 mean.data_ptr(), inv.data_ptr(), ws.data_ptr(), ws_n),
                     tb, 3 * n * es, dx, lambda: tb()[0])
    if fam in ("dropout_fwd", "dropout_bwd"):
        # the checks read the keep mask back as y != 0, so x must have no exact zeros: torch.randn gives some
        # (Box-Muller with u1 = 1.0, about one in 2^24 elements; ~15 in a 262M-element bf16 point, which then
        # read as dropped where pydnn kept them)
        x.masked_fill_(x == 0, 1.0)
        d = desc(x, dtype=pdt)
        nst = pydnn.dropout_get_states_size(h)
        states = torch.zeros(max(nst, 8), dtype=torch.uint8, device=SC.DEV)
        drop = pydnn.create_dropout_descriptor()
        pydnn.set_dropout_descriptor(drop, h, P_DROP, states.data_ptr(), nst, 1234)
        nres = pydnn.dropout_get_reserve_space_size(d)
        r = torch.empty(max(nres, 1), dtype=torch.uint8, device=SC.DEV)
        y = torch.empty_like(x)
        nbytes = 2 * n * es + nres
        fwd = lambda: pydnn.dropout_forward(h, drop, d, x.data_ptr(), d, y.data_ptr(), r.data_ptr(), nres)  # noqa
        if fam == "dropout_fwd":
            def check():
                y.fill_(float("nan"))
                fwd()
                kept = y != 0
                frac = 1.0 - kept.float().mean().item()
                want = (x.float() / (1 - P_DROP))
                err = ((y.float() - want).abs() * kept).max().item() / max(want.abs().max().item(), 1e-6)
                ok = err <= TOL[dt] and (n < 4096 or abs(frac - P_DROP) < 0.03) and not torch.isnan(y).any().item()
                return err, ok
            return _case(fwd, lambda: F.dropout(x, P_DROP, training=True), nbytes, check=check)
        fwd()
        g, gx = torch.randn_like(x), torch.empty_like(x)
        _, tmask = torch.native_dropout(x, P_DROP, True)

        def check_b():
            gx.fill_(float("nan"))
            pydnn.dropout_backward(h, drop, d, g.data_ptr(), d, gx.data_ptr(), r.data_ptr(), nres)
            want = torch.where(y != 0, g.float() / (1 - P_DROP), torch.zeros_like(g, dtype=torch.float32))
            return SC.close_rel(gx, want, TOL[dt])
        return _case(lambda: pydnn.dropout_backward(h, drop, d, g.data_ptr(), d, gx.data_ptr(), r.data_ptr(), nres),
                     lambda: torch.ops.aten.native_dropout_backward(g, tmask, 1.0 / (1.0 - P_DROP)), nbytes,
                     check=check_b)
    raise ValueError(f"unknown family {fam}")


def _no_grad(fn):
    import torch
    with torch.no_grad():
        return fn()


def run_point(c, p, rows, checked):
    import torch

    nb = point_bytes(p)
    row = dict(group=p["family"], case=case_name(p), dtype=p["dtype"], bytes_in=nb, status=SC.OK,
               **{k: v for k, v in p.items() if k not in ("family", "dtype")})
    need = NBUF[p["family"]] * nb
    free = SC.free_bytes(need)
    if need > MEM_FRACTION * free:
        row.update(status=SC.OOM, note=f"{need / 2**30:.1f} GiB of buffers > {MEM_FRACTION} of the "
                                       f"{free / 2**30:.1f} GiB free (memory cap)")
        rows.append(row)
        return
    case = None
    try:
        case = build(c, p)
        key = (p["family"], p["dtype"])
        if key not in checked:  # correctness spot check (not timed)
            if case["check"] is not None:
                err, ok = case["check"]()
            else:
                case["out"].fill_(float("nan"))
                case["p"]()
                err, ok = SC.close_rel(case["out"], case["ref"]().reshape(case["out"].shape), TOL[p["dtype"]])
            checked[key] = dict(case=row["case"], err=err, ok=ok)
            row["check_err"] = err
            if not ok:
                row["note"] = f"CHECK FAILED: max rel err {err:.3g}"
        if c.warm_ms:
            warm(case["p"], case["t"], c.warm_ms)
        if c.paired:  # (alternating rounds: a drift of the clocks over the point falls on both sides alike)
            from bench import time_pair
            row["ms_pydnn"], row["ms_ref"] = time_pair(case["p"], case["t"], rounds=c.paired, reps=c.reps)
        else:
            row["ms_pydnn"] = c.timer(case["p"])
            row["ms_ref"] = c.timer(case["t"])
        row["ratio"] = row["ms_ref"] / row["ms_pydnn"]
        row["moved_bytes"] = case["nbytes"]
        row["gbs_pydnn"] = case["nbytes"] / row["ms_pydnn"] / 1e6
        if nb >= BIG:
            row["pct_copy"] = 100 * row["gbs_pydnn"] / c.copy_gbs
            row["pct_copy_ref"] = 100 * case["nbytes"] / row["ms_ref"] / 1e6 / c.copy_gbs
        if nb < SMALL and c.empty_ms is not None:
            row["us_over_empty"] = 1000 * (row["ms_pydnn"] - c.empty_ms)
            row["us_over_empty_ref"] = 1000 * (row["ms_ref"] - c.empty_ms)
            if c.graph_empty_ms is not None:  # device time per call from CUDA graphs (no host time)
                # pydnn's call only: a PyTorch reference that fails its capture (autograd.grad did, on the
                # H200) leaves PyTorch's CUDA generator in capture state, and every later torch.randn of
                # the run then raises; a pydnn call that cannot be captured is a pydnn bug, reported in
                # the row, and graph timing stops for the rest of the run for the same reason
                try:
                    gp = c.graph_timer(case["p"])
                    row.update(us_graph=1000 * gp, us_over_empty_graph=1000 * (gp - c.graph_empty_ms))
                except Exception as e:  # noqa: BLE001 - a call that cannot be captured: this row's eager numbers
                    c.graph_empty_ms = None
                    row["note"] = (row.get("note", "") + " pydnn call not capturable, no graph timing from here: "
                                   f"{SC.classify(e)[1][:80]}").strip()
    except Exception as e:  # noqa: BLE001 - a refused or failed point is a row
        row["status"], note = SC.classify(e)
        row["note"] = (row.get("note", "") + " " + note).strip()
        row.pop("ratio", None)
    rows.append(row)
    del case
    if nb >= BIG:
        torch.cuda.empty_cache()


def warm(fa, fb, ms, most=200):
    """Call fa and fb alternately until at least `ms` milliseconds of device time have passed (at most `most` pairs):
    the GPU's clocks up before the first side is timed. Why: act_bwd relu fp32 297888x256 read pydnn 0.236 ms in
    three sweeps' (one-block, pydnn-first) timing, right after its point's setup, and 0.211-0.212 in every other
    timing of the point in the same runs (paired, or after a spot-check call), PyTorch 0.212 throughout (H200,
    session 33); a 1.26 ms point timed the same way (15 ms of samples) did not move."""
    import torch

    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for i in range(most):
        fa()
        fb()
        b.record()
        b.synchronize()
        if a.elapsed_time(b) >= ms:
            return i + 1
    return most


def empty_kernel(h):
    """A launch function of an empty kernel (one block of 32 threads) on the handle's stream."""
    import ctypes
    from pydnn._cuda import driver, nvrtc

    cubin, lowered, _ = nvrtc.compile_cubin("__global__ void sweep_empty(int) {}\n", "sweep_empty.cu",
                                            ["sweep_empty"], h.arch, [], [])
    with driver.pushed(h.ctx):  # into the handle's context, as pydnn's loader does
        mod = driver.module_load(cubin)
        func = driver.module_function(mod, lowered["sweep_empty"])

    class P(ctypes.Structure):
        _fields_ = [("v", ctypes.c_int)]

    argv = driver.kernel_args(P(0))
    return lambda: driver.launch_args(func, (1, 1, 1), (32, 1, 1), 0, h.cu_stream, argv), mod


# ----------------------------------------------------------------------------------- report
def family_summary(rows, fam=None):
    pred = (lambda r: True) if fam is None else (lambda r: r["group"] == fam)
    s = SC.summarize(rows, below=1.0, pred=pred)
    big = [r["pct_copy"] for r in SC.ok_rows(rows, fam) if r.get("pct_copy") is not None]
    # under 1 MB: the CUDA-graph (device) time over the empty kernel's where measured, else the eager one
    small = [r["us_over_empty_graph"] if r.get("us_over_empty_graph") is not None else r["us_over_empty"]
             for r in SC.ok_rows(rows, fam) if r.get("us_over_empty") is not None]
    s.update(big_n=len(big), pct_copy_geomean=SC.geomean(big), pct_copy_min=min(big) if big else float("nan"),
             big_below_80=sum(1 for v in big if v < 80), small_n=len(small),
             small_us_median=sorted(small)[len(small) // 2] if small else float("nan"),
             small_over_1_5=sum(1 for v in small if v > 1.5))
    return s


def report(rows, meta, budget_note, elapsed):
    lines = ["# Memory-bound families sweep (issue 20): pydnn vs PyTorch", "",
             f"{meta.get('device', '?')}, torch {meta.get('torch', '?')}, seed {meta.get('seed')}; copy "
             f"{meta.get('copy_gbs', float('nan')):.0f} GB/s; empty kernel "
             f"{SC.fmt(meta.get('empty_ms') and 1000 * meta['empty_ms'], '.2f')} us per call back to back "
             f"({SC.fmt(meta.get('graph_empty_ms') and 1000 * meta['graph_empty_ms'], '.2f')} us in a CUDA graph); "
             f"{budget_note}; elapsed {elapsed:.1f} s.", "",
             "Under 1 MB the summary's 'us over empty' is the CUDA-graph time per call (device time, no host "
             "cost) minus the empty kernel's in a graph, where the call could be captured; else the eager time "
             "minus the eager empty kernel's (host time included on both).", "",
             "Ratio = PyTorch ms / pydnn ms (above 1: pydnn faster). Targets: >= 1.0x every point, >= 1.2x geomean; "
             ">= 64 MB: >= 90% of copy (geomean), none < 80%; < 1 MB: within 1.5 us of the empty kernel.", "",
             "## Summary", "",
             "| family | points | geomean | min | min at | < 1.0x | >= 64 MB: n | % copy geomean | % copy min | "
             "< 80% | < 1 MB: n | us over empty (median) | > 1.5 us | not OK |",
             "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for fam in [f for f in FAMILIES if any(r["group"] == f for r in rows)] + ["all"]:
        s = family_summary(rows, None if fam == "all" else fam)
        bad = sum(v for k, v in s["statuses"].items() if k != SC.OK)
        lines.append(f"| {fam} | {s['n']} | {SC.fmt(s['geomean'])} | {SC.fmt(s['min'])} | {s['min_case']} | "
                     f"{s['below']} | {s['big_n']} | {SC.fmt(s['pct_copy_geomean'], '.1f')} | "
                     f"{SC.fmt(s['pct_copy_min'], '.1f')} | {s['big_below_80']} | {s['small_n']} | "
                     f"{SC.fmt(s['small_us_median'], '.2f')} | {s['small_over_1_5']} | {bad} |")
    checks = meta.get("checks", {})
    if checks:
        failed = [f"{k}: {c['case']} {c['err']:.2e}" for k, c in checks.items() if not c["ok"]]
        lines += ["", f"Correctness spot checks: {len(checks)} (family, dtype) pairs, "
                  f"{len(checks) - len(failed)} within tolerance"
                  + (("; FAILED: " + "; ".join(failed)) if failed else ".")]
    cols = [("family", "group", None), ("shape", "case", None), ("dtype", "dtype", None), ("status", "status", None),
            ("input MB", lambda r: r["bytes_in"] / 1e6, ".3f"), ("pydnn ms", "ms_pydnn", ".4f"),
            ("PyTorch ms", "ms_ref", ".4f"), ("ratio", "ratio", ".3f"), ("pydnn GB/s", "gbs_pydnn", ".0f"),
            ("% copy", "pct_copy", ".1f"), ("PyTorch % copy", "pct_copy_ref", ".1f"),
            ("us over empty", "us_over_empty", ".2f"), ("PyTorch us over empty", "us_over_empty_ref", ".2f"),
            ("graph us over empty", "us_over_empty_graph", ".2f"),
            ("point s", "point_s", ".2f"), ("note", "note", None)]
    lines += ["", "## Every point", "", SC.markdown_table(rows, cols), ""]
    return "\n".join(lines)


def plots(rows):
    """sweep_memory.png: one panel per family (every dtype, sorted); sweep_memory_<family>.png: one panel per
    dtype; all through the built-in writer (26 matplotlib figures took ~90 s of CPU here, 47 s the
    26-panel overview)."""
    out, overview = {}, {}
    for fam in FAMILIES:
        panels = {f"{fam} {dt}": [r["ratio"] for r in SC.ok_rows(rows, fam, lambda r, dt=dt: r["dtype"] == dt)]
                  for dt in DTYPES}
        panels = {k: v for k, v in panels.items() if v}
        if panels:
            out[f"sweep_memory_{fam}.png"] = (f"pydnn / PyTorch, {fam}, sorted", panels, (1.0, 1.2), True)
            overview[fam] = [r["ratio"] for r in SC.ok_rows(rows, fam)]
    if overview:
        out["sweep_memory.png"] = ("pydnn / PyTorch per family (all dtypes), sorted", overview, (1.0, 1.2), True)
    return out


def main(argv=None):
    args = SC.parse_args(__doc__, 140.0, argv, extra=[("--points", dict(
        default="", help="';'-separated points to run instead of the grid, as the log names them: 'family "
                         "[layout] shape [variant] dtype' (e.g. 'gn_fwd_infer NCHW 3x103x99x99 fp32;rms_bwd 1x56616 "
                         "fp32')")), ("--torch-stats", dict(
        action="store_true", help="layer / RMS / group / instance backward points take the saved mean / "
                                  "inverse std from PyTorch instead of pydnn's forward (no forward kernel compiled)")),
        ("--warm-ms", dict(type=float, default=0.0, metavar="T",
                           help="before each point's timing, call both sides alternately for >= T ms of device time "
                                "(the clocks up before the first side is timed; 0: off)")),
        ("--paired", dict(type=int, default=0, metavar="N",
                          help="time pydnn and PyTorch in N alternating rounds each (tools/bench.py's time_pair) "
                               "instead of one block of --reps samples each, pydnn first"))])
    if args.render:
        return SC.render(args, "sweep_memory", lambda rows, meta: report(
            rows, meta, meta.get("budget_note", "rendered from " + args.render), meta.get("elapsed_s", float("nan"))),
            plots)
    t0 = time.monotonic()
    import torch
    from bench import Bench, time_ms

    torch.manual_seed(args.seed)
    b = Bench(64 << 20)  # pydnn handle on PyTorch's stream, and the copy bandwidth (256 MiB each way)
    c = Ctx()
    c.h, c.copy_gbs = b.h, b.copy_gbs
    c.torch_stats = args.torch_stats
    reps = args.reps or (10 if args.quick else 12)
    c.paired, c.reps, c.warm_ms = args.paired, reps, args.warm_ms
    c.timer = SC.gpu_timer(reps, 2)
    c.graph_timer = lambda fn: SC.graph_ms(c.h, fn)
    empty = None
    try:
        empty, _mod = empty_kernel(c.h)
        c.empty_ms = time_ms(empty, reps=30)
    except Exception as e:  # noqa: BLE001 - no empty-kernel baseline in this run: the < 1 MB columns stay empty
        c.empty_ms = None
        print(f"sweep_memory: empty kernel unavailable: {SC.classify(e)[1]}", flush=True)
    try:
        c.graph_empty_ms = c.graph_timer(empty) if empty is not None else None
    except Exception as e:  # noqa: BLE001 - no graph timing in this run
        c.graph_empty_ms = None
        print(f"sweep_memory: CUDA graph timing unavailable: {SC.classify(e)[1]}", flush=True)
    print(f"sweep_memory: empty kernel {SC.fmt(c.empty_ms and 1000 * c.empty_ms, '.2f')} us per call (back-to-back, "
          f"same stream), {SC.fmt(c.graph_empty_ms and 1000 * c.graph_empty_ms, '.2f')} us in a CUDA graph", flush=True)
    budget = SC.Budget(args.budget_s)
    only = [o for o in args.only.split(",") if o]
    pts, meta = grid(args.seed, args.quick, families=tuple(f for f in FAMILIES if not only or f in only))
    if args.points:
        pts = [parse_point(q) for q in args.points.split(";") if q.strip()]
        meta["points"] = args.points
    meta.update(SC.device_meta(), budget_s=args.budget_s, reps=reps, paired=args.paired, warm_ms=args.warm_ms,
                copy_gbs=c.copy_gbs,
                empty_ms=c.empty_ms,
                graph_empty_ms=c.graph_empty_ms)
    rows, checked = [], {}
    for p in pts:
        if not budget.take() or meta.get("context_lost"):
            continue
        n_before, t_point = len(rows), time.monotonic()
        run_point(c, p, rows, checked)
        for r in rows[n_before:]:  # the point's wall time (setup, check, both sides' timing)
            r["point_s"] = time.monotonic() - t_point
        lost = SC.sticky(rows[n_before:])
        if lost:  # the CUDA context is unusable from here: stop sampling and say why
            meta["context_lost"] = lost
            print(f"CUDA context lost, sweep stopped: {lost}", flush=True)
        r = rows[-1]
        print(f"mem {r['group']:16s} {r['case']:34s} {r['dtype']:4s} {r['status']:13s} pydnn "
              f"{SC.fmt(r.get('ms_pydnn'), '.4f')} ms torch {SC.fmt(r.get('ms_ref'), '.4f')} ms "
              f"{SC.fmt(r.get('ratio'), '.2f')}x"
              + (f" {r['pct_copy']:.1f}% copy (torch {r['pct_copy_ref']:.1f}%)" if r.get("pct_copy") is not None else "")
              + (f" +{r['us_over_empty_graph']:.2f} us graph" if r.get("us_over_empty_graph") is not None else "")
              + f" {r.get('note', '')[:100]}", flush=True)
        SC.write_partial(args.out, "sweep_memory", rows, meta)
    c.empty_ms_end = time_ms(empty, reps=30) if empty is not None else None
    meta["checks"] = {f"{k[0]} {k[1]}": v for k, v in checked.items()}
    meta["empty_ms_end"] = c.empty_ms_end
    return SC.finish(args.out, "sweep_memory", rows, meta, budget, t0,
                     lambda note, elapsed: report(rows, meta, note, elapsed), plots)


if __name__ == "__main__":
    main()
