"""The convolutions' compiled entries (pydnn/_build/fastcall.py's cv_core; tuning.callpath.C_ENTRY_MAP) on the GPU:
each one-launch plan of tests/core/test_conv_entry_cpu.py's cases (float implicit GEMM, bfloat16 NHWC tensor-core
plans, split-K plans with their fold) called repeatedly through its public name, with torch tensors and with int
pointers, is answered from its call-site slot (map_stats' hits move) and computes, on fresh random inputs with the
output poisoned first, what a float64 numpy reference computes (alpha / beta blending included), bit for bit what
the Python function behind the entry computes."""
import sys
from pathlib import Path

import numpy as np
import pytest

import pydnn as P
from pydnn.ops.convolution import api as A
from pydnn.reference import convolution as ref

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "core"))
from devtensor import assert_close  # noqa: E402
from test_conv_entry_cpu import CASES, NAME, case_descs, operands, workspace_size  # noqa: E402

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


def _lib(th):
    """The compiled entries, set up by a first element-wise call."""
    from pydnn._build import fastcall

    d = P.create_tensor_descriptor()
    P.set_tensor_nd_descriptor_ex(d, P.PYDNN_TENSOR_NCHW, P.PYDNN_DATA_FLOAT, 4, [1, 1, 1, 64])
    a = P.create_activation_descriptor()
    P.set_activation_descriptor(a, P.PYDNN_ACTIVATION_RELU, P.PYDNN_NOT_PROPAGATE_NAN, 0.0)
    x, y = torch.randn(64, device="cuda"), torch.empty(64, device="cuda")
    for _ in range(2):
        P.activation_forward(th, a, 1.0, d, x, 0.0, d, y)
    lib = fastcall._state.get("lib")
    if lib is None or not hasattr(lib, "map_stats") or type(P.convolution_forward).__name__ != "Entry":
        pytest.skip("the compiled entries are not available here (no C compiler or Python headers)")
    return lib, fastcall.MAP_KINDS


def _tensor(rng, dims, fmt, tdt):
    """A random tensor of logical dims (n, c, h, w) stored in fmt: (torch tensor, its float64 values as NCHW)."""
    v = torch.from_numpy(rng.standard_normal(dims)).to(tdt)
    ref_v = v.double().numpy()
    t = v.permute(0, 2, 3, 1).contiguous() if fmt == "NHWC" else v.contiguous()
    return t.cuda(), ref_v


def _from(t, fmt):
    v = t.double().cpu()
    return (v.permute(0, 3, 1, 2) if fmt == "NHWC" else v).numpy()


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_conv_entry_results(th, rng, case):
    lib, kinds = _lib(th)
    label, dname, algo, (n, c, k, hw, r, dt, fmt, pad) = case
    name = NAME[dname]
    pdt = getattr(P, "PYDNN_DATA_" + dt)
    tdt = torch.float32 if dt == "FLOAT" else torch.bfloat16
    o = hw - r + 1 + 2 * pad
    xd, wd, yd, cd, _ = case_descs(P, n, c, k, hw, r, dt, fmt, pad)
    wsz = workspace_size(P, th, dname, algo, xd, wd, yd, cd)
    ws = torch.empty(max(wsz, 1), dtype=torch.uint8, device="cuda")
    k_id = kinds[name]
    hits = 0
    for rep, (al, be, as_int) in enumerate(((1.0, 0.0, False), (1.0, 0.0, False), (0.5, 0.0, True),
                                            (-1.5, 0.25, False), (1.0, 0.0, True))):
        x, xv = _tensor(rng, (n, c, hw, hw), fmt, tdt)
        w, wv = _tensor(rng, (k, c, r, r), fmt, tdt)
        dy, dyv = _tensor(rng, (n, k, o, o), fmt, tdt)
        if dname == "fwd":
            ins, out_dims, out_desc = (x, w), (n, k, o, o), yd
            want_raw = ref.forward_raw(xv, wv, (pad, pad), (1, 1), (1, 1))
            scale_raw = ref.forward_raw(np.abs(xv), np.abs(wv), (pad, pad), (1, 1), (1, 1))
        elif dname == "bwd_data":
            ins, out_dims, out_desc = (w, dy), (n, c, hw, hw), xd
            want_raw = ref.backward_data_raw(wv, dyv, (hw, hw), (pad, pad), (1, 1), (1, 1))
            scale_raw = ref.backward_data_raw(np.abs(wv), np.abs(dyv), (hw, hw), (pad, pad), (1, 1), (1, 1))
        else:
            ins, out_dims, out_desc = (x, dy), (k, c, r, r), wd
            want_raw = ref.backward_filter_raw(xv, dyv, (r, r), (pad, pad), (1, 1), (1, 1))
            scale_raw = ref.backward_filter_raw(np.abs(xv), np.abs(dyv), (r, r), (pad, pad), (1, 1), (1, 1))
        if be == 0.0:  # poisoned: an unwritten element fails
            out = torch.full(_store(out_dims, fmt), float("nan"), dtype=tdt, device="cuda")
        else:
            out, _ = _tensor(rng, out_dims, fmt, tdt)
        before = _from(out, fmt)
        ref_out = al * want_raw + be * (before if be else 0.0)
        scale = abs(al) * scale_raw + abs(be) * np.abs(before if be else 0.0)
        bufs = [t.data_ptr() if as_int else t for t in (*ins, out)]
        args = (th, al, operands(dname, xd, wd, yd)[0], bufs[0], operands(dname, xd, wd, yd)[1], bufs[1], cd, algo,
                ws.data_ptr() if as_int else ws, wsz, be, out_desc, bufs[2])
        h0 = lib.map_stats()[0][k_id]
        getattr(P, name)(*args)
        torch.cuda.synchronize()
        hits += lib.map_stats()[0][k_id] - h0
        got = _from(out, fmt)
        assert_close(got, ref_out, pdt, f"{label} rep {rep}", scale=scale)
        # the Python function behind the entry, on the same inputs: the same bits
        if be == 0.0:
            again = torch.full_like(out, float("nan"))
            args2 = args[:-1] + ((again.data_ptr() if as_int else again),)
            getattr(A, "_py_" + name)(*args2)
            torch.cuda.synchronize()
            assert torch.equal(again, out), f"{label} rep {rep}: the entry and the Python function differ"
    # the first call plans and fills the slot; the repeats (the Python function's own calls between them answer the
    # same site and refill it) are answered in C
    assert hits >= 3, (label, hits)


def _store(dims, fmt):
    n, c, h, w = dims
    return (n, h, w, c) if fmt == "NHWC" else (n, c, h, w)

