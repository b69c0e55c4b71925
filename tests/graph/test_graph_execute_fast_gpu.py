"""Graph.execute's compiled launch (fastcall.patch_launch) and its inline torch-tensor reading on the GPU.

The 8-op chain (a fused pointwise plan, one generated kernel) executed through the compiled path (no
launch counter installed: a counter replaces driver.launch_args and so turns the compiled path off) gives
bitwise the results of the Python path (driver.launch_args, counted: one launch) and matches float64
numpy, with int pointers aligned and misaligned (the vector flag), with torch tensors as buffers, and when
captured into a CUDA graph and replayed on new inputs. Tensors that fail a check (too small, on the CPU)
are still refused with the errors plans.run gives, naming the uid."""
import numpy as np
import pytest

import pydnn as P
from devtensor import assert_close
from pydnn._build import fastcall
from pydnn.graph import Graph
from test_graph_gpu import Launches, _chain_ref

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
BF16, F16 = P.PYDNN_DATA_BFLOAT16, P.PYDNN_DATA_HALF
TDT = {BF16: torch.bfloat16, F16: torch.float16}
XD, SD, BD = (3, 8, 1024), (1, 8, 1), (1, 1, 1024)


def _chain(handle, io):
    g = Graph(io_data_type=io, handle=handle)
    x = g.tensor(name="x", dim=list(XD))
    s = g.tensor(name="s", dim=list(SD))
    b = g.tensor(name="b", dim=list(BD))
    v = g.gelu(g.add(g.mul(x, s), b))
    v = g.tanh(g.relu(g.sub(g.mul(v, x), b), upper_clip=4.0))
    g.add(v, x, name="y").set_output(True)
    g.build_operation_graph().create_execution_plans().build_plans()
    assert g.engine_index() == 1 and g.launches() == 1
    return g


def _f64(t):
    return t.float().cpu().numpy().astype(np.float64)


def _need_compiled():
    if fastcall.patch_launcher() is None:
        pytest.skip("the launch helper is not available here (no C compiler or Python headers)")


def _buffers(io, off=(0, 0, 0, 0), seed=0):
    """x, s, b, y as views `off` elements into poisoned bf16 / f16 allocations (off 0: 256-byte aligned)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    out = []
    for dims, o in zip((XD, SD, BD, XD), off):
        n = int(np.prod(dims))
        base = torch.full((n + o + 8,), float("nan"), device="cuda", dtype=TDT[io])
        v = base[o:o + n].view(dims)
        out.append((base, v))
    for _, v in out[:3]:
        v.copy_(torch.rand(v.shape, device="cuda", generator=gen) * 4 - 2)
    return out


@pytest.mark.parametrize("off", [(0, 0, 0, 0), (1, 0, 0, 0), (0, 1, 5, 0), (0, 0, 0, 3), (8, 0, 0, 8)])
@pytest.mark.parametrize("io", [BF16, F16], ids=["bf16", "f16"])
def test_compiled_execute_equals_the_python_launch(th, monkeypatch, io, off):
    _need_compiled()
    g = _chain(th, io)
    bufs = _buffers(io, off, seed=sum(off) + io)
    (xb, x), (_, s), (_, b), (yb, y) = bufs
    ptrs = {"x": x.data_ptr(), "s": s.data_ptr(), "b": b.data_ptr(), "y": y.data_ptr()}
    g.execute(ptrs, 0)  # the compiled path (no counter installed)
    step = g._plan_obj.built.steps[0]
    assert step.crec_addr, "the compiled launch was not used"
    torch.cuda.synchronize()
    y_fast = y.clone()
    assert not torch.isnan(y_fast).any()
    # the stored flags word is the one the C call wrote: vector loads only where every contiguous operand is
    # aligned (s is broadcast along the innermost dim: its alignment does not matter)
    assert step.params.flags == (1 if off[0] % 8 == 0 and off[2] % 8 == 0 and off[3] % 8 == 0 else 0)
    y.fill_(float("nan"))
    g.execute({"x": x, "s": s, "b": b, "y": y}, 0)  # torch tensors: read inline, the same launch
    torch.cuda.synchronize()
    assert torch.equal(y, y_fast)
    y.fill_(float("nan"))
    count = Launches(monkeypatch)  # the Python path
    g.execute(ptrs, 0)
    assert count.n == 1
    torch.cuda.synchronize()
    assert torch.equal(y, y_fast)
    xv, sv, bv = _f64(x), _f64(s), _f64(b)
    want = _chain_ref(xv, sv, bv)
    assert_close(_f64(y_fast), want, io, f"chain offsets {off}", scale=np.abs(want) + np.abs(xv) + 1)
    assert torch.isnan(yb[:off[3]]).all() and torch.isnan(yb[off[3] + y.numel():]).all()


def test_torch_tensor_errors_still_name_the_uid(th):
    g = _chain(th, BF16)
    (_, x), (_, s), (_, b), (_, y) = _buffers(BF16)
    uid = {t.name: t.uid for t in g.tensors}
    g.execute({"x": x, "s": s, "b": b, "y": y}, 0)
    with pytest.raises(P.PydnnError) as e:
        g.execute({"x": x, "s": s, "b": b, "y": y[:2]}, 0)  # too small
    assert e.value.status == P.PYDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT
    assert f"variantPack: uid {uid['y']}" in e.value.message
    with pytest.raises(P.PydnnError) as e:
        g.execute({"x": x.cpu(), "s": s, "b": b, "y": y}, 0)  # host memory
    assert e.value.status == P.PYDNN_STATUS_BAD_PARAM and "not CUDA memory" in e.value.message
    assert f"uid {uid['x']}" in e.value.message
    # a strided view that spans enough is taken (the exact span, through plans.run)
    wide = torch.empty(XD[0], XD[1], 2 * XD[2], device="cuda", dtype=torch.bfloat16)
    g.execute({"x": x, "s": s, "b": b, "y": wide[:, :, ::2]}, 0)
    torch.cuda.synchronize()


def test_execute_with_torch_tensors_is_graph_capturable(th):
    _need_compiled()
    g = _chain(th, BF16)
    (_, x), (_, s), (_, b), (_, y) = _buffers(BF16)
    stream = torch.cuda.Stream()
    bufs = {"x": x, "s": s, "b": b, "y": y}
    with torch.cuda.stream(stream):
        P.set_stream(th, stream.cuda_stream)
        g.execute(bufs, 0)  # warm-up on the capture stream
        stream.synchronize()
        cg = torch.cuda.CUDAGraph()
        with torch.cuda.graph(cg, stream=stream):
            g.execute(bufs, 0)
    torch.cuda.synchronize()
    for seed in (1, 2):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        x.copy_(torch.rand(x.shape, device="cuda", generator=gen) * 4 - 2)
        y.fill_(float("nan"))
        torch.cuda.synchronize()
        cg.replay()
        torch.cuda.synchronize()
        xv = _f64(x)
        want = _chain_ref(xv, _f64(s), _f64(b))
        assert_close(_f64(y), want, BF16, f"replay {seed}", scale=np.abs(want) + np.abs(xv) + 1)
    P.set_stream(th, torch.cuda.current_stream().cuda_stream)
