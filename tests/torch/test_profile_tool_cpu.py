"""tools/profile_torch_step.py's own logic on the CPU: the busy-time union, the profiler / cProfile passes on
a small step (no GPU activity: no idle share), and the report's tables."""
import importlib.util
import os

import pytest

torch = pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _tool():
    spec = importlib.util.spec_from_file_location("profile_torch_step",
                                                  os.path.join(ROOT, "tools", "profile_torch_step.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_union_of_busy_intervals():
    P = _tool()
    assert P._union([]) == 0.0
    assert P._union([(0, 2), (1, 3), (5, 6), (5.5, 5.7)]) == 4.0
    assert P._union([(3, 4), (0, 1)]) == 2.0
    assert P._union([(0, 10), (2, 3), (4, 5)]) == 10.0


def test_passes_and_report(tmp_path):
    P = _tool()
    lin = torch.nn.Linear(8, 8)

    def step():
        lin(torch.randn(4, 8)).sum().backward()

    r = P.profile_steps(step, 3, 5)
    assert r["steps"] == 3 and r["wall_ms_per_step"] > 0 and len(r["top_host_ops"]) <= 5
    assert any("addmm" in row["op"] or "linear" in row["op"] for row in r["top_host_ops"])
    c = P.cprofile_steps(step, 2, 4)
    assert len(c) == 4 and all(row["calls_per_step"] > 0 for row in c)
    layers = {"pydnn": ({"0": {"type": "Conv2d", "fwd_ms": 1.5, "bwd_ms": 2.0}}, 6.0),
              "torch": ({"0": {"type": "Conv2d", "fwd_ms": 1.0, "bwd_ms": 2.0}}, 5.0)}
    md = tmp_path / "p.md"
    P.report({("cnn", "pydnn"): {"torch_profiler": r, "cprofile": c}}, layers, str(md))
    text = md.read_text()
    assert "| cnn | pydnn |" in text and "| 0 | Conv2d | 1.500 | 2.000 | 1.000 | 2.000 | +0.500 |" in text


def test_cprofile_details_name_the_owners_and_the_pydnn_api(tmp_path):
    """The per-owner buckets and the pydnn API table: a step that makes pydnn API calls (descriptor set-up,
    which runs on the CPU) and a PyTorch op."""
    import pydnn
    P = _tool()
    lin = torch.nn.Linear(8, 8)

    def step():
        d = pydnn.create_tensor_descriptor()
        pydnn.set_tensor_nd_descriptor(d, pydnn.PYDNN_DATA_FLOAT, 4, [1, 2, 3, 4], [24, 12, 4, 1])
        lin(torch.randn(4, 8)).sum().backward()

    det = {}
    P.cprofile_steps(step, 2, 4, det)
    names = {r["function"]: r for r in det["api"]}
    assert {"create_tensor_descriptor", "set_tensor_nd_descriptor"} <= set(names)
    assert names["set_tensor_nd_descriptor"]["calls_per_step"] == 1.0
    assert "torch (Python)" in det["buckets"] or "torch (C, called from Python)" in det["buckets"]
    assert P._bucket("/x/pydnn/torch/functional.py", "forward") == "pydnn.torch (the bridge)"
    assert P._bucket("/x/pydnn/ops/convolution/api.py", "f") == "pydnn.ops.convolution"
    assert P._bucket("/x/pydnn/ops/batchnorm.py", "f") == "pydnn.ops.batchnorm"
    assert P._bucket("/x/pydnn/_cuda/driver.py", "launch") == "pydnn launch / driver"
    r = P.profile_steps(step, 2, 3)
    timed = {"steps": 3, "median_ms": 2.0, "mean_ms": 2.5, "host_ms_per_step": 1.5}
    res = {("cnn", "pydnn"): {"torch_profiler": r, "cprofile": [], "cprofile_details": det, "timed": timed},
           ("cnn", "torch"): {"torch_profiler": r, "timed": dict(timed, median_ms=1.0)}}
    md = tmp_path / "p.md"
    P.report(res, {}, str(md))
    text = md.read_text()
    assert "| cnn | pydnn | 2.000 | 2.500 | 1.500 | 2.000x |  |" in text
    assert "`set_tensor_nd_descriptor` |" in text and "| pydnn.torch (the bridge) |" not in text


def test_compiled_entry_calls_are_counted_and_reported(tmp_path, monkeypatch):
    """Calls a compiled entry answered never enter Python: cprofile_steps counts them per step from the entries'
    hit counters (entry_hits: fastcall's act_stats / map_stats) and the report lists them in their own table."""
    P = _tool()
    from pydnn._build import fastcall

    real = P.entry_hits()
    assert real == {} or set(real) == set(fastcall.MAP_KINDS) | {"activation_forward"}, real
    counter = {"activation_forward": 0, "convolution_forward": 0, "add_tensor": 0}

    def step():  # stands for a step whose calls the entries answered: 2 activations and a convolution a step
        counter["activation_forward"] += 2
        counter["convolution_forward"] += 1

    monkeypatch.setattr(P, "entry_hits", lambda: dict(counter))
    det = {}
    P.cprofile_steps(step, 4, 3, det)
    assert det["entries"] == {"activation_forward": 2.0, "convolution_forward": 1.0}, det["entries"]
    r = P.profile_steps(step, 2, 3)
    timed = {"steps": 3, "median_ms": 2.0, "mean_ms": 2.5, "host_ms_per_step": 1.5}
    res = {("cnn", "pydnn"): {"torch_profiler": r, "cprofile": [], "cprofile_details": det, "timed": timed}}
    md = tmp_path / "p.md"
    P.report(res, {}, str(md))
    text = md.read_text()
    assert "answered by compiled entries" in text and "| `activation_forward` | 2 |" in text, text
    assert "| `convolution_forward` | 1 |" in text and "add_tensor" not in text


def test_kernel_families_and_their_table(tmp_path):
    P = _tool()
    fam = P.kernel_family
    assert fam("void pydnn::conv::bias_grad_rows<pydnn::bf16_t, 8>(ConvAuxParams)") == "conv bias gradient"
    assert fam("void pydnn::bn::nc_stats<pydnn::bf16_t, 8, true>(BnParams)") == "batch norm"
    assert fam("void at::native::batch_norm_backward_kernel<c10::BFloat16, float, float, int>") == "batch norm"
    assert fam("void cudnn::engines_precompiled::nchwToNhwcKernel<__nv_bfloat16>") == "layout copies (NCHW <-> NHWC)"
    assert fam("void pydnn::tensor::transpose<pydnn::bf16_t, pydnn::bf16_t, Copy, false>") == \
        "layout copies (NCHW <-> NHWC)"
    assert fam("sm90_xmma_dgrad_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc") == "convolution"
    assert fam("void pydnn::matmul::gemm_tc<pydnn::bf16_t, 64, 64>(MatmulParams)") == "matmul"
    assert fam("nvjet_hsh_128x256_64x4_2x1_v_bz_coopB_NTN") == "matmul"
    assert fam("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<...>") == "optimizer (AdamW)"
    assert fam("cudnn_generated_fort_native_sdpa_sm90_flash_fprop") == "attention forward"
    assert fam("void pydnn::act_fwd<pydnn::bf16_t, pydnn::GeluTanh, 8>") == "activation forward"
    assert fam("void at::native::(anonymous namespace)::max_pool_backward_nchw<c10::BFloat16>") == "pooling"
    assert fam("something new") == "other"
    mk = {"steps": 1, "wall_ms_per_step": 1.0, "kernels_per_step": 2, "top_gpu_kernels": [], "top_host_ops": []}
    res = {("cnn", "pydnn"): {"torch_profiler": dict(mk, gpu_by_family={
               "batch norm": {"us_per_step": 100.0, "kernels_per_step": 4}})},
           ("cnn", "torch"): {"torch_profiler": dict(mk, gpu_by_family={
               "batch norm": {"us_per_step": 250.0, "kernels_per_step": 6},
               "pooling": {"us_per_step": 50.0, "kernels_per_step": 2}})}}
    md = tmp_path / "f.md"
    P.report(res, {}, str(md))
    text = md.read_text()
    assert "| batch norm | 100.0 (4) | 250.0 (6) | -150.0 |" in text
    assert "| pooling | 0.0 (0) | 50.0 (2) | -50.0 |" in text and "| (sum) | 100.0 | 300.0 | -200.0 |" in text


def test_timed_steps_with_stand_in_events(monkeypatch):
    """The timed pass's bookkeeping (CUDA events stood in for by stamps of a fake clock that each step moves by
    2 ms, so the figures are exact and the test does not depend on this machine's load)."""
    P = _tool()
    clock = [0.0]

    class Ev:
        def __init__(self, enable_timing=False):
            self.t = None

        def record(self):
            self.t = clock[0]

        def elapsed_time(self, other):
            return (other.t - self.t) * 1e3

    def step():
        clock[0] += 0.002

    monkeypatch.setattr(torch.cuda, "Event", Ev)
    monkeypatch.setattr(P, "_sync", lambda: None)
    monkeypatch.setattr(P.time, "perf_counter", lambda: clock[0])
    r = P.timed_steps(step, 5)
    assert r["steps"] == 5
    assert r["median_ms"] == pytest.approx(2.0) and r["mean_ms"] == pytest.approx(2.0)
    assert r["host_ms_per_step"] == pytest.approx(2.0)


def test_ab_variants_in_the_step_table(tmp_path):
    P = _tool()
    mk = {"steps": 1, "wall_ms_per_step": 1.0, "kernels_per_step": 2, "top_gpu_kernels": [], "top_host_ops": []}
    t = {"steps": 3, "median_ms": 2.0, "mean_ms": 2.0, "host_ms_per_step": 2.0}
    res = {("cnn", "pydnn"): {"torch_profiler": mk, "timed": t, "final_loss": 0.5},
           ("cnn", "torch"): {"torch_profiler": mk, "timed": dict(t, median_ms=4.0), "final_loss": 0.5},
           ("cnn", "pydnn[nofuse]"): {"torch_profiler": mk, "timed": dict(t, median_ms=3.0), "final_loss": 0.5}}
    md = tmp_path / "ab.md"
    P.report(res, {}, str(md))
    text = md.read_text()
    assert "| cnn | pydnn[nofuse] | 3.000 | 2.000 | 2.000 | 0.750x | 0.5000 |" in text
    assert "| cnn | pydnn | 2.000 | 2.000 | 2.000 | 0.500x | 0.5000 |" in text


def test_kernel_families_split_forward_and_backward():
    P = _tool()
    assert P.kernel_family("void pydnn::attn_ws::fwd_ws<pydnn::bf16_t, 64>(AttnParams)") == "attention forward"
    assert P.kernel_family("void pydnn::attn_wgb::bwd_dkdv_wg<pydnn::bf16_t>(AttnParams)") == "attention backward"
    assert P.kernel_family("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16") == "attention backward"
    assert P.kernel_family("void pydnn::norm::finish<float>(NormParams)") == "layer / RMS norm backward"
    assert P.kernel_family("void pydnn::norm::fwd_rows<float, 4, 2>(NormParams)") == "layer / RMS norm forward"
    assert P.kernel_family("void pydnn::act::map_contig<pydnn::bf16_t, 8>(ActParams)") == "activation forward"
    assert P.kernel_family("void at::native::vectorized_elementwise_kernel<4, at::native::GeluBackwardCUDAKernelImpl"
                           ">") == "activation backward"
    assert P.kernel_family("void pydnn::matmul::gemm_tc<pydnn::bf16_t, 128, 256>(MatmulParams)") == "matmul"


def test_forced_split_plan_on_a_cpu_handle():
    """The planner patch the GPT ops table times: S splits of the tokens on gemm_wgmma_s + splitk_reduce,
    the workspace S fp32 partials, and pydnn.ops.matmul._split_k restored."""
    import sys
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import bench_host as B
    from pydnn.ops import matmul as M
    P = _tool()
    real = M._split_k
    h = B.cpu_handle()
    for s in (4, 11):
        plan = P.forced_split_plan(h, 65536, 3072, 768, s)
        assert plan is not None and plan.split[0] == s, plan and plan.split
        assert plan.ws_bytes == s * 3072 * 768 * 4
        assert "gemm_wgmma_s" in plan.split_fast.expr and "splitk_reduce" in plan.reduce.expr
    assert M._split_k is real
    # without the patch, and with the split limited to one wave (tuning.matmul.SPLIT_WAVES off), the whole-K
    # problem does not split (72 tiles of 128 x 256: room for one split); over several waves (the default) it does
    from pydnn.graph import matmul_api
    from pydnn import tuning
    import pydnn
    dt = pydnn.PYDNN_DATA_BFLOAT16
    _, kw = matmul_api.layout((dt, (3072, 65536), (1, 3072)), (dt, (65536, 768), (768, 1)), (dt, (3072, 768), (768, 1)))
    with tuning.override({"matmul.SPLIT_WAVES": False}):
        assert M.gemm_plan(h, split_k=True, **kw).ws_bytes == 0
    with tuning.override({"matmul.SPLIT_WAVES": True}):
        assert M.gemm_plan(h, split_k=True, **kw).ws_bytes > 0


def test_gpt_ops_table_on_the_cpu(monkeypatch, tmp_path):
    """gpt_ops' cases at a tiny size on the CPU (pydnn.torch falls back to PyTorch there; events faked): every
    op has both backends' times, and the report's rows."""
    from types import SimpleNamespace
    P = _tool()
    monkeypatch.setattr(P, "_events_ms", lambda fn, reps: (fn(), 1.0)[1])
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    a = SimpleNamespace(batch_size=2, seq=16, d_model=32, n_layer=1, n_head=4, n_kv_head=2, norm="rms",
                        dropout=0.0, lr=1e-3, torch_linear=False, torch_sdpa="cudnn", corpus_mb=1.0)
    dev = SimpleNamespace(device=torch.device("cpu"))
    ops = P.gpt_ops(None, dev, rounds=1, reps=1, dw_variants=False, a=a)
    ops_ = {r["op"].split(" (")[0]: r for r in ops["rows"]}
    for op in ("linear qkv fwd", "linear fc1 dW", "linear head dX", "attention fwd", "attention bwd",
               "rms norm fwd", "rms norm bwd", "gelu tanh fwd", "gelu tanh bwd"):
        assert ops_[op]["pydnn_ms"] == 1.0 and ops_[op]["torch_ms"] == 1.0, op
    text = P.ops_report(ops)
    assert "| linear fc1 dW | 1.000 | 1.000 | 1.00x | 12 -> +0.00 |" in text
    assert "| rms norm fwd (float32 in, autocast) | 1.000 | 1.000 | 1.00x | 25 -> +0.00 |" in text


def test_prebuild_builds_the_fused_mlp_graphs_beside_the_units(monkeypatch):
    """prebuild(mlp=True): the GPT demo's fused-MLP graphs (bf16, tanh, 64 x 1024 tokens, d 768) are built in a
    thread while the units compile (stubbed here: no units, the graph build recorded)."""
    from pydnn._build import build
    from pydnn.torch import _core as C
    from pydnn.torch import functional as PF
    P = _tool()
    got = []
    monkeypatch.setattr(C, "handle_for", lambda dev: "handle")
    monkeypatch.setattr(PF, "_mlp_build", lambda *a: got.append(a))
    monkeypatch.setattr(build, "build_all", lambda units, progress: (0, len(units)))
    P.prebuild((), mlp=True)
    assert got == [("handle", torch.bfloat16, 65536, 768, 3072, 768, "tanh")]


def test_prebuild_compiles_the_device_arch_units(monkeypatch):
    """prebuild() takes the units of the GPU's own arch: convolution.bf16's expressions for sm_90 are not the
    generic manifest's (session 31: the generic unit was compiled, and each demo run compiled the sm_90 one)."""
    from pydnn._build import build, manifest
    P = _tool()
    got = []
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(build, "build_all", lambda units, progress: (got.extend(units), (len(units), 0))[1])
    P.prebuild(("convolution.bf16", "batchnorm.bf16"))
    want = manifest.unit_by_name("sm_90")
    assert [u.name for u in got] == ["convolution.bf16", "batchnorm.bf16"]
    assert got[0].exprs == want["convolution.bf16"].exprs
    assert got[0].exprs != manifest.unit_by_name()["convolution.bf16"].exprs  # (the premise: they differ)


def test_demo_units_are_in_the_sm90_manifest():
    """Every unit CNN_UNITS / GPT_UNITS name is one of sm_90's (a renamed unit is skipped by prebuild() with a note
    and compiles on first use inside the timed run: session 32's second mid-session run lost four of five
    bench_cnn_step processes to convolution.tma.bf16, split into convolution.tma.bf16.bn64 / bn128 / bn256)."""
    from pydnn._build import manifest
    P = _tool()
    have = manifest.unit_by_name("sm_90")
    assert [n for n in P.CNN_UNITS + P.GPT_UNITS if n not in have] == []
