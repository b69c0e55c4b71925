"""The float64 RNN reference (pydnn/reference/rnn.py) on the CPU: its backward against central finite
differences of its forward, and its forward against PyTorch's CPU nn.RNN / nn.LSTM / nn.GRU (which use
cuDNN's equations, GRU's recurrent bias inside the reset product included)."""
import numpy as np
import pytest

from pydnn.reference import rnn as R

CASES = [  # cell, layers, dirs, proj, skip, bias (w, r), clip
    (R.RNN_TANH, 1, 1, 0, False, (True, True), None),
    (R.RNN_RELU, 2, 2, 0, False, (True, False), None),
    (R.LSTM, 2, 2, 0, False, (True, True), None),
    (R.LSTM, 2, 1, 3, False, (False, True), None),
    (R.LSTM, 1, 2, 0, False, (True, True), (-0.3, 0.25)),
    (R.GRU, 2, 2, 0, False, (True, True), None),
    (R.GRU, 1, 1, 0, True, (False, True), None),
    (R.LSTM, 1, 1, 0, True, (True, False), None),
    (R.GRU, 3, 2, 0, False, (True, True), "dropout"),
]


def _loss(cell, x, lengths, ws, layers, dirs, H, proj, hx, cx, clip, dy, dhy, dcy, masks=None):
    y, hy, cy = R.rnn_forward(cell, x, lengths, ws, layers, dirs, H, proj, hx, cx, clip, masks=masks)
    T = x.shape[0]
    valid = (np.arange(T)[:, None] < np.asarray(lengths)[None, :])[:, :, None]
    s = np.sum(np.where(valid, y, 0.0) * dy) + np.sum(hy * dhy)
    return s + (np.sum(cy * dcy) if cy is not None else 0.0)


@pytest.mark.parametrize("case", CASES)
def test_backward_matches_finite_differences(case):
    cell, layers, dirs, proj, skip, (bw, br), clip = case
    rng = np.random.default_rng(7)
    masks = None
    if clip == "dropout":  # dropout between layers: fixed masks of 0 and 1 / (1 - p)
        clip = None
        masks = [np.where(rng.uniform(size=(4, 3, dirs * (proj or 4))) < 0.3, 0.0, 1 / 0.7) for _ in range(layers - 1)]
    T, B, H = 4, 3, 4
    I = H if skip else 5
    out = proj or H
    lengths = np.array([4, 2, 3])
    ws = R.random_weights(rng, cell, I, H, layers, dirs, proj, skip, bw, br, scale=0.6)
    x = rng.standard_normal((T, B, I))
    hx = rng.standard_normal((layers * dirs, B, out)) * 0.5
    cx = rng.standard_normal((layers * dirs, B, H)) * 0.5
    dy = rng.standard_normal((T, B, dirs * out))
    dhy = rng.standard_normal(hx.shape)
    dcy = rng.standard_normal(cx.shape)
    args = (cell, x, lengths, ws, layers, dirs, H, proj, hx, cx, clip, dy, dhy, dcy, masks)
    dx, dhx, dcx, dws = R.rnn_backward(cell, x, lengths, ws, layers, dirs, H, dy, dhy, dcy, proj, hx, cx, clip,
                                       masks)
    eps = 1e-6

    def fd(arr, idx):
        old = arr[idx]
        arr[idx] = old + eps
        a = _loss(*args)
        arr[idx] = old - eps
        b = _loss(*args)
        arr[idx] = old
        return (a - b) / (2 * eps)

    checked = 0
    for name, arr, grad in [("x", x, dx), ("hx", hx, dhx)] + ([("cx", cx, dcx)] if cell == R.LSTM else []):
        for idx in np.ndindex(arr.shape):
            if name == "x" and idx[0] >= lengths[idx[1]]:
                assert grad[idx] == 0.0  # padding positions of x get no gradient
                continue
            assert abs(fd(arr, idx) - grad[idx]) < 1e-6, (name, idx)
            checked += 1
    for pl, (w, dw) in enumerate(zip(ws, dws)):
        for k, arr in w.items():
            if arr is None:
                assert dw[k] is None
                continue
            for idx in list(np.ndindex(arr.shape))[::3]:
                assert abs(fd(arr, idx) - dw[k][idx]) < 1e-6, (pl, k, idx)
                checked += 1
    assert checked > 50


def test_outputs_past_the_length_are_the_fill_and_hy_is_the_last_step():
    rng = np.random.default_rng(1)
    T, B, I, H = 5, 3, 2, 3
    ws = R.random_weights(rng, R.LSTM, I, H, 1, 2)
    lengths = np.array([5, 1, 3])
    x = rng.standard_normal((T, B, I))
    y, hy, cy = R.rnn_forward(R.LSTM, x, lengths, ws, 1, 2, H, padding_fill=-7.0)
    assert np.all(y[1:, 1] == -7.0) and np.all(y[3:, 2] == -7.0) and np.all(y[:1, 1] != -7.0)
    # a sequence run alone, truncated to its length, gives the same outputs and final states
    for b in range(B):
        L = lengths[b]
        y1, hy1, cy1 = R.rnn_forward(R.LSTM, x[:L, b:b + 1], [L], ws, 1, 2, H)
        np.testing.assert_allclose(y[:L, b:b + 1], y1, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(hy[:, b:b + 1], hy1, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(cy[:, b:b + 1], cy1, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("layout", [R.SEQ_MAJOR_UNPACKED, R.SEQ_MAJOR_PACKED, R.BATCH_MAJOR_UNPACKED])
def test_layouts_round_trip(layout):
    rng = np.random.default_rng(2)
    a = rng.standard_normal((4, 3, 2))
    lengths = np.array([4, 3, 1])
    b = R.to_layout(a, lengths, layout, fill=0.5)
    rows = {R.SEQ_MAJOR_UNPACKED: (4, 3, 2), R.BATCH_MAJOR_UNPACKED: (3, 4, 2), R.SEQ_MAJOR_PACKED: (8, 2)}
    assert b.shape == rows[layout]
    back = R.from_layout(b, lengths, layout, 4, fill=0.5)
    np.testing.assert_array_equal(back, R.from_layout(R.to_layout(a, lengths, 0), lengths, 0, 4, fill=0.5))
    if layout == R.SEQ_MAJOR_PACKED:
        np.testing.assert_array_equal(b[:3], a[0]) and np.testing.assert_array_equal(b[3:5], a[1, :2])


def _torch_module(torch, cell, I, H, layers, dirs, proj, bias):
    kw = dict(num_layers=layers, bidirectional=dirs == 2, bias=bias, dtype=torch.float64)
    if cell == R.LSTM:
        return torch.nn.LSTM(I, H, proj_size=proj, **kw)
    if cell == R.GRU:
        return torch.nn.GRU(I, H, **kw)
    return torch.nn.RNN(I, H, nonlinearity="relu" if cell == R.RNN_RELU else "tanh", **kw)


def torch_weights(mod, cell, layers, dirs, bias):
    """PyTorch's state dict as the reference's weights (its gate order is cuDNN's)."""
    g = R.GATES[cell]
    sd = {k: v.detach().numpy() for k, v in mod.state_dict().items()}
    ws = []
    for layer in range(layers):
        for d in range(dirs):
            sfx = f"l{layer}" + ("_reverse" if d else "")
            w_ih, w_hh = sd[f"weight_ih_{sfx}"], sd[f"weight_hh_{sfx}"]
            H = w_ih.shape[0] // g
            ws.append({"W": w_ih.reshape(g, H, -1), "R": w_hh.reshape(g, H, -1),
                       "bW": sd[f"bias_ih_{sfx}"].reshape(g, H) if bias else None,
                       "bR": sd[f"bias_hh_{sfx}"].reshape(g, H) if bias else None,
                       "P": sd.get(f"weight_hr_{sfx}")})
    return ws


@pytest.mark.parametrize("cell,layers,dirs,proj,bias", [
    (R.RNN_TANH, 2, 2, 0, True), (R.RNN_RELU, 1, 1, 0, False), (R.LSTM, 2, 2, 0, True),
    (R.LSTM, 2, 2, 3, True), (R.GRU, 2, 2, 0, True), (R.GRU, 1, 1, 0, False)])
def test_forward_matches_pytorch_cpu(cell, layers, dirs, proj, bias):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    T, B, I, H = 5, 3, 4, 6
    mod = _torch_module(torch, cell, I, H, layers, dirs, proj, bias)
    ws = torch_weights(mod, cell, layers, dirs, bias)
    out = proj or H
    rng = np.random.default_rng(3)
    lengths = np.array([5, 4, 2])
    x = rng.standard_normal((T, B, I))
    hx = rng.standard_normal((layers * dirs, B, out))
    cx = rng.standard_normal((layers * dirs, B, H))
    y, hy, cy = R.rnn_forward(cell, x, lengths, ws, layers, dirs, H, proj, hx, cx if cell == R.LSTM else None)
    packed = torch.nn.utils.rnn.pack_padded_sequence(torch.from_numpy(x), torch.from_numpy(lengths))
    h0 = (torch.from_numpy(hx), torch.from_numpy(cx)) if cell == R.LSTM else torch.from_numpy(hx)
    with torch.no_grad():
        ty, th = mod(packed, h0)
    ty, _ = torch.nn.utils.rnn.pad_packed_sequence(ty, total_length=T)
    np.testing.assert_allclose(y, ty.numpy(), rtol=1e-10, atol=1e-12)
    if cell == R.LSTM:
        np.testing.assert_allclose(hy, th[0].numpy(), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(cy, th[1].numpy(), rtol=1e-10, atol=1e-12)
    else:
        np.testing.assert_allclose(hy, th.numpy(), rtol=1e-10, atol=1e-12)
