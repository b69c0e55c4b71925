"""The sweep benchmarks' per-point code on the GPU, untimed (a timer that calls once): every point's
correctness spot check (pydnn against PyTorch, the sweeps' own tolerances) passes on small shapes of each
convolution direction, attention direction and memory-bound family, and the rows come out OK (or
NOT_SUPPORTED where pydnn refuses a configuration, e.g. attention head dim 256 today). No timing is
asserted (timings live in the tools)."""
import os
import sys

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools")))

import sweep_attention as SA  # noqa: E402
import sweep_common as SC  # noqa: E402
import sweep_conv as SV  # noqa: E402
import sweep_memory as SM  # noqa: E402


@pytest.fixture(scope="module")
def h():
    import pydnn
    if not torch.cuda.is_available():
        pytest.skip("PyTorch without CUDA")
    hh = pydnn.create()
    pydnn.set_stream(hh, torch.cuda.current_stream().cuda_stream)
    return hh


def _once(fn, reps=1, warmup=0):
    fn()
    return 1.0


def _failed(rows, checked):
    """Rows that are neither OK nor a refusal (pydnn's NOT_SUPPORTED, PyTorch's NO_REFERENCE), and failed checks."""
    bad = [(r["group"], r["case"], r.get("dtype"), r["status"], r.get("note")) for r in rows
           if r["status"] not in (SC.OK, SC.NOT_SUPPORTED, "NO_REFERENCE") or "CHECK FAILED" in (r.get("note") or "")]
    bad += [(k, c["case"], c["err"]) for k, c in checked.items() if not c["ok"]]
    return bad


CONV = [SV.problem("t", "3x3", 2, 64, 64, 14, 3, 1, 1, 1), SV.problem("t", "3x3/2", 3, 32, 96, 15, 3, 2, 1, 1),
        SV.problem("t", "1x1/2", 2, 8, 16, 9, 1, 2, 0, 1), SV.problem("t", "5x5", 1, 24, 40, 11, 5, 1, 2, 1),
        SV.problem("t", "7x7/2 C3", 2, 3, 64, 32, 7, 2, 3, 1), SV.problem("t", "g32", 2, 64, 64, 8, 3, 2, 1, 32)]


@pytest.mark.parametrize("pr", CONV, ids=[p["name"] for p in CONV])
def test_conv_point(h, pr):
    rows, checked = [], {}
    SV.run_problem(h, pr, _once, checked, False, rows)
    assert [r["group"] for r in rows] == list(SV.DIRECTIONS)
    assert not _failed(rows, checked)
    assert all(r["status"] == SC.OK for r in rows) and set(checked) == set(SV.DIRECTIONS)


def test_conv_fused(h):
    rows = []
    SV.run_fused(h, [("3x3 64->64 @8", 64, 64, 8, 3, 1, 1, 1)], _once, lambda a, b: (_once(a), _once(b)), rows)
    assert rows[0]["status"] == SC.OK and "CHECK FAILED" not in (rows[0].get("note") or ""), rows


ATTN = [dict(kind="train", b=2, s=256, hq=4, hkv=2, d=64, causal=True),
        dict(kind="train", b=1, s=192, hq=2, hkv=2, d=128, causal=False),
        dict(kind="train", b=1, s=128, hq=2, hkv=2, d=256, causal=False),
        dict(kind="decode", b=2, s=1, skv=1024, hq=8, hkv=2, d=128, causal=False)]


@pytest.mark.parametrize("p", ATTN, ids=[SA.case_name(p) for p in ATTN])
def test_attention_point(h, p):
    rows, checked = [], {}
    SA.run_point(h, p, _once, checked, rows)
    assert not _failed(rows, checked)
    if p["d"] in (64, 128):
        assert all(r["status"] in (SC.OK, "NO_REFERENCE") for r in rows) and len(checked) == len(rows)


def _mem_points():
    out = []
    for fam in SM.FAMILIES:
        for i, (dt, layout) in enumerate((("fp32", "NCHW"), ("bf16", "NHWC"), ("fp16", "NCHW"))):
            if fam in SM.ROW_FAMILIES:
                p = dict(family=fam, dtype=dt, rows=(7, 33, 2)[i], hidden=(72, 1000, 4096)[i])
            else:
                p = dict(family=fam, dtype=dt, n=(2, 3, 1)[i], c=(6, 64, 5)[i], hw=(5, 7, 9)[i], layout=layout)
            if SM.VARIANTS.get(fam):
                p["variant"] = SM.VARIANTS[fam][i % len(SM.VARIANTS[fam])]
            out.append(p)
    return out


MEM = _mem_points()


@pytest.mark.parametrize("p", MEM, ids=[f"{p['family']}-{p['dtype']}-{SM.case_name(p)}" for p in MEM])
def test_memory_point(h, p):
    c = SM.Ctx()
    c.h, c.timer, c.copy_gbs, c.empty_ms = h, _once, 3000.0, 0.002
    rows, checked = [], {}
    SM.run_point(c, p, rows, checked)
    assert not _failed(rows, checked)
    assert rows[0]["status"] == SC.OK and len(checked) == 1


def test_graph_timing_and_empty_kernel(h):
    """sweep_common.graph_ms captures pydnn and PyTorch calls (and the empty kernel) and gives a positive
    time per call; pydnn's handle is back on PyTorch's stream after."""
    import pydnn
    empty, _mod = SM.empty_kernel(h)
    assert SC.graph_ms(h, empty) > 0
    x = torch.randn(1000, device="cuda")
    y = torch.empty_like(x)
    d = pydnn.create_tensor_descriptor()
    pydnn.set_tensor_nd_descriptor(d, pydnn.PYDNN_DATA_FLOAT, 4, [1000, 1, 1, 1], [1, 1, 1, 1])
    a = pydnn.create_activation_descriptor()
    pydnn.set_activation_descriptor(a, pydnn.PYDNN_ACTIVATION_RELU, pydnn.PYDNN_NOT_PROPAGATE_NAN, 0.0)
    fn = lambda: pydnn.activation_forward(h, a, 1.0, d, x.data_ptr(), 0.0, d, y.data_ptr())  # noqa: E731
    assert SC.graph_ms(h, fn) > 0 and SC.graph_ms(h, lambda: torch.relu(x)) > 0
    assert pydnn.get_stream(h) == torch.cuda.current_stream().cuda_stream
    y.fill_(float("nan"))
    fn()
    torch.cuda.synchronize()
    assert torch.equal(y, torch.relu(x))
