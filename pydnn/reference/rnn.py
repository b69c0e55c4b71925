"""float64 reference of cuDNN's RNN family (cudnnRNNForward, cudnnRNNBackwardData_v8, cudnnRNNBackwardWeights_v8).

Data is sequence-major and padded: x [T, B, inputSize], y [T, B, dirs * outSize] (outSize = projSize for an
LSTM with projection, else hiddenSize), hx / hy [layers * dirs, B, outSize], cx / cy [layers * dirs, B,
hiddenSize]. lengths[b] in [1, T]: sequence b is active at times t < lengths[b]; outputs past it are the
padding fill, and hy / cy are each sequence's state after its own last step (time lengths[b] - 1 forward,
time 0 for the reverse direction, which starts at time lengths[b] - 1).

Weights: one dict per pseudo-layer (layer * dirs + dir), cuDNN's matrices and biases by gate:
    "W": [G, H, in] input matrices (None for SKIP_INPUT on layer 0: the input itself enters every gate)
    "R": [G, H, rec] recurrent matrices (rec = outSize)
    "bW", "bR": [G, H] input / recurrent biases (None where the bias mode has none)
    "P": [projSize, H] the LSTM projection (None without)
G = 1 (RNN_RELU / RNN_TANH), 4 (LSTM: i, f, g, o), 3 (GRU: r, z, n). Cells (cuDNN's equations):
    RNN:  h' = act(W x + bW + R h + bR)
    LSTM: i, f, o = sigmoid(W_k x + bW_k + R_k h + bR_k), g = tanh(...); c' = f c + i g (clipped to
          [lclip, rclip] when clip is given); m = o tanh(c'); h' = P m with projection, else m
    GRU:  r, z = sigmoid(...); n = tanh(W_n x + bW_n + r * (R_n h + bR_n)); h' = (1 - z) n + z h
Bidirectional: each direction reads the whole input; the layer output is [forward, reverse] concatenated.
"""
import numpy as np

RNN_RELU, RNN_TANH, LSTM, GRU = 0, 1, 2, 3
GATES = {RNN_RELU: 1, RNN_TANH: 1, LSTM: 4, GRU: 3}


def _sig(v):
    return 1.0 / (1.0 + np.exp(-v))


def random_weights(rng, cell, input_size, hidden, layers, dirs, proj=0, skip=False, bias_w=True, bias_r=True,
                   scale=None):
    """Random float64 weights in the structure above (uniform in +-1/sqrt(hidden), as PyTorch's init)."""
    g = GATES[cell]
    out = proj if proj else hidden
    s = 1.0 / np.sqrt(hidden) if scale is None else scale
    u = lambda *shape: rng.uniform(-s, s, size=shape)  # noqa: E731
    ws = []
    for layer in range(layers):
        for _ in range(dirs):
            isz = input_size if layer == 0 else out * dirs
            ws.append({"W": None if (skip and layer == 0) else u(g, hidden, isz), "R": u(g, hidden, out),
                       "bW": u(g, hidden) if bias_w else None, "bR": u(g, hidden) if bias_r else None,
                       "P": u(proj, hidden) if proj else None})
    return ws


def _step(cell, w, xt, h, c, relu, clip):
    """One step for all rows: (h', c', saved values for the backward)."""
    g = GATES[cell]
    xa = np.stack([xt] * g) if w["W"] is None else np.einsum("ghi,bi->gbh", w["W"], xt)
    if w["bW"] is not None:
        xa = xa + w["bW"][:, None, :]
    ha = np.einsum("ghr,br->gbh", w["R"], h)
    if w["bR"] is not None:
        ha = ha + w["bR"][:, None, :]
    if cell in (RNN_RELU, RNN_TANH):
        a = xa[0] + ha[0]
        hn = np.maximum(a, 0.0) if cell == RNN_RELU else np.tanh(a)
        return hn, c, {"hn": hn, "a": a}
    if cell == LSTM:
        a = xa + ha
        i, f, gg, o = _sig(a[0]), _sig(a[1]), np.tanh(a[2]), _sig(a[3])
        craw = f * c + i * gg
        cn = craw if clip is None else np.clip(craw, clip[0], clip[1])
        m = o * np.tanh(cn)
        hn = m if w["P"] is None else m @ w["P"].T
        return hn, cn, {"i": i, "f": f, "g": gg, "o": o, "craw": craw, "c": cn, "cprev": c, "m": m}
    r = _sig(xa[0] + ha[0])
    z = _sig(xa[1] + ha[1])
    n = np.tanh(xa[2] + r * ha[2])
    hn = (1.0 - z) * n + z * h
    return hn, c, {"r": r, "z": z, "n": n, "han": ha[2], "hprev": h}


def rnn_forward(cell, x, lengths, weights, layers, dirs, hidden, proj=0, hx=None, cx=None, clip=None,
                padding_fill=0.0, keep=False, masks=None):
    """(y, hy, cy) in float64 (cy None for cells other than LSTM); keep=True adds the saved values the
    backward needs as a fourth result. masks: dropout between layers, one [T, B, dirs * outSize] array of
    multipliers (0 or 1 / (1 - p)) per layer but the last, applied to its output before the next layer."""
    x = np.asarray(x, np.float64)
    T, B, _ = x.shape
    lengths = np.asarray(lengths)
    out = proj if proj else hidden
    hy = np.zeros((layers * dirs, B, out))
    cy = np.zeros((layers * dirs, B, hidden))
    saved = []
    inp = x
    for layer in range(layers):
        ly = np.zeros((T, B, dirs * out))
        for d in range(dirs):
            pl = layer * dirs + d
            w = weights[pl]
            h = np.zeros((B, out)) if hx is None else np.array(hx[pl], np.float64)
            c = np.zeros((B, hidden)) if cx is None else np.array(cx[pl], np.float64)
            steps = {}
            order = range(T) if d == 0 else range(T - 1, -1, -1)
            for t in order:
                act = (t < lengths)[:, None]
                hn, cn, sv = _step(cell, w, inp[t], h, c, cell == RNN_RELU, clip)
                sv["h"], sv["act"], sv["x"] = h, act, inp[t]
                steps[t] = sv
                h = np.where(act, hn, h)
                c = np.where(act, cn, c)
                ly[t, :, d * out:(d + 1) * out] = np.where(act, hn, 0.0)
            hy[pl], cy[pl] = h, c
            saved.append(steps)
        inp = ly if masks is None or layer == layers - 1 else ly * masks[layer]
    y = np.where((np.arange(T)[:, None] < lengths[None, :])[:, :, None], inp, padding_fill)
    res = (y, hy, cy if cell == LSTM else None)
    return res + (saved,) if keep else res


def rnn_backward(cell, x, lengths, weights, layers, dirs, hidden, dy, dhy=None, dcy=None, proj=0, hx=None, cx=None,
                 clip=None, masks=None):
    """(dx, dhx, dcx, dweights): gradients of sum(y * dy) + sum(hy * dhy) + sum(cy * dcy) (padding positions
    of dy ignored). dweights has the structure of `weights` (None where a part is absent)."""
    x = np.asarray(x, np.float64)
    T, B, _ = x.shape
    lengths = np.asarray(lengths)
    out = proj if proj else hidden
    _, _, _, saved = rnn_forward(cell, x, lengths, weights, layers, dirs, hidden, proj, hx, cx, clip, keep=True,
                                 masks=masks)
    valid = (np.arange(T)[:, None] < lengths[None, :])[:, :, None]
    dly = np.where(valid, np.asarray(dy, np.float64), 0.0)
    dhx = np.zeros((layers * dirs, B, out))
    dcx = np.zeros((layers * dirs, B, hidden))
    dws = [None] * (layers * dirs)
    for layer in range(layers - 1, -1, -1):
        isz = x.shape[2] if layer == 0 else out * dirs
        dinp = np.zeros((T, B, isz))
        for d in range(dirs):
            pl = layer * dirs + d
            w = weights[pl]
            steps = saved[pl]
            dw = {k: (None if v is None else np.zeros_like(v)) for k, v in w.items()}
            dh = np.zeros((B, out)) if dhy is None else np.array(dhy[pl], np.float64)
            dc = np.zeros((B, hidden)) if dcy is None else np.array(dcy[pl], np.float64)
            order = range(T - 1, -1, -1) if d == 0 else range(T)
            for t in order:
                sv = steps[t]
                act = sv["act"]
                dht = dh + dly[t, :, d * out:(d + 1) * out]
                if cell in (RNN_RELU, RNN_TANH):
                    da = dht * ((sv["a"] > 0) if cell == RNN_RELU else (1.0 - sv["hn"] ** 2))
                    dxa = dha = da[None]
                    direct = 0.0
                elif cell == LSTM:
                    if w["P"] is not None:
                        dw["P"] += (dht * act).T @ sv["m"]
                        dm = dht @ w["P"]
                    else:
                        dm = dht
                    tc = np.tanh(sv["c"])
                    dct = dc + dm * sv["o"] * (1.0 - tc ** 2)
                    if clip is not None:
                        dct = dct * ((sv["craw"] > clip[0]) & (sv["craw"] < clip[1]))
                    i, f, g, o = sv["i"], sv["f"], sv["g"], sv["o"]
                    dxa = dha = np.stack([dct * g * i * (1 - i), dct * sv["cprev"] * f * (1 - f),
                                          dct * i * (1 - g ** 2), dm * tc * o * (1 - o)])
                    dcp = dct * f
                    dc = np.where(act, dcp, dc)
                    direct = 0.0
                else:
                    r, z, n = sv["r"], sv["z"], sv["n"]
                    dn = dht * (1 - z) * (1 - n ** 2)
                    dz = dht * (sv["hprev"] - n) * z * (1 - z)
                    dr = dn * sv["han"] * r * (1 - r)
                    dxa = np.stack([dr, dz, dn])
                    dha = np.stack([dr, dz, dn * r])
                    direct = dht * z
                dxa = dxa * act[None]
                dha = dha * act[None]
                dh_prev = np.einsum("gbh,ghr->br", dha, w["R"]) + direct
                dh = np.where(act, dh_prev, dh)
                dw["R"] += np.einsum("gbh,br->ghr", dha, sv["h"])
                if w["bR"] is not None:
                    dw["bR"] += dha.sum(1)
                if w["bW"] is not None:
                    dw["bW"] += dxa.sum(1)
                if w["W"] is None:
                    dinp[t] += dxa.sum(0)
                else:
                    dw["W"] += np.einsum("gbh,bi->ghi", dxa, sv["x"])
                    dinp[t] += np.einsum("gbh,ghi->bi", dxa, w["W"])
            dhx[pl], dcx[pl] = dh, dc
            dws[pl] = dw
        dly = dinp if masks is None or layer == 0 else dinp * masks[layer - 1]
    return dly, dhx, (dcx if cell == LSTM else None), dws


# ----------------------------------------------------------------------------- layouts

SEQ_MAJOR_UNPACKED, SEQ_MAJOR_PACKED, BATCH_MAJOR_UNPACKED = 0, 1, 2


def to_layout(a, lengths, layout, fill=0.0):
    """A padded [T, B, V] array in an RNN data layout: [T, B, V], packed rows (time-major, the sequences
    active at each step; lengths must not increase), or [B, T, V]. Padding positions get `fill`."""
    a = np.asarray(a)
    T, B, V = a.shape
    lengths = np.asarray(lengths)
    valid = (np.arange(T)[:, None] < lengths[None, :])[:, :, None]
    a = np.where(valid, a, fill)
    if layout == SEQ_MAJOR_UNPACKED:
        return a
    if layout == BATCH_MAJOR_UNPACKED:
        return np.ascontiguousarray(a.transpose(1, 0, 2))
    return np.concatenate([a[t, :int((lengths > t).sum())] for t in range(T)], 0)


def from_layout(a, lengths, layout, T, fill=0.0):
    """The inverse of to_layout: a padded [T, B, V] array (padding positions `fill`)."""
    a = np.asarray(a)
    lengths = np.asarray(lengths)
    B = len(lengths)
    if layout == SEQ_MAJOR_UNPACKED:
        out = np.array(a, dtype=np.float64)
    elif layout == BATCH_MAJOR_UNPACKED:
        out = np.array(a.transpose(1, 0, 2), dtype=np.float64)
    else:
        out = np.zeros((T, B, a.shape[-1]))
        row = 0
        for t in range(T):
            k = int((lengths > t).sum())
            out[t, :k] = a[row:row + k]
            row += k
    valid = (np.arange(T)[:, None] < lengths[None, :])[:, :, None]
    return np.where(valid, out, fill)
