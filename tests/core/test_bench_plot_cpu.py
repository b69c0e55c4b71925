"""tools/bench.py --plot on the CPU with fake results: the PNG charts (one per family and a summary) and the
rows' JSON are written next to the markdown, and tools/bench_plot.py draws them again from the JSON."""
import json
import os
import sys

import pytest

pytest.importorskip("matplotlib")
TOOLS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tools")
sys.path.insert(0, TOOLS)

import bench_plot  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


def fake_rows():
    nan = float("nan")
    return [
        dict(family="activation", case="relu fwd", dtype="bf16", pydnn_gbs=2900.0, pct_copy=91.0, torch_gbs=2700.0,
             ratio=1.07, torch="torch.relu", ms_pydnn=0.1, ms_torch=0.107),
        dict(family="activation", case="gelu bwd", dtype="fp32", pydnn_gbs=2500.0, pct_copy=78.5, torch_gbs=2800.0,
             ratio=0.89, torch="gelu_backward", ms_pydnn=0.2, ms_torch=0.178),
        dict(family="convolution", case="resnet 3x3 64", dtype="bf16", pydnn_tflops=610.0, torch_tflops=650.0,
             pct_peak=61.7, ratio=0.94, torch="cudnn", ms_pydnn=1.0, ms_torch=0.94),
        dict(family="convolution", case="1x1 256 / 2", dtype="fp16", pydnn_tflops=500.0, torch_tflops=nan,
             pct_peak=nan, ratio=1.3, torch="cudnn", ms_pydnn=1.0, ms_torch=1.3),
        dict(family="matmul", case="4096^3", dtype="bf16", pydnn_tflops=700.0, torch_tflops=720.0, pct_peak=70.8,
             ratio=nan, torch="cublas", ms_pydnn=1.0, ms_torch=0),   # no PyTorch time: not drawn
    ]


def _check_pngs(paths, folder, stem, families):
    want = [os.path.join(folder, f"{stem}_{f}.png") for f in families] + [os.path.join(folder, f"{stem}_summary.png")]
    assert sorted(paths) == sorted(want)
    for p in want:
        with open(p, "rb") as f:
            head = f.read(8)
        assert head == PNG and os.path.getsize(p) > 5000, p


def test_plot_writes_one_chart_per_family_and_a_summary(tmp_path):
    paths = bench_plot.plot(fake_rows(), 3200.0, str(tmp_path), "run1", "Fake GPU")
    _check_pngs(paths, str(tmp_path), "run1", ["activation", "convolution"])   # matmul: no finite ratio
    assert bench_plot._limit(fake_rows()[0], 3200.0) == (91.0, 100 * 2700.0 / 3200.0)
    p, t = bench_plot._limit(fake_rows()[2], 3200.0)
    assert p == 61.7 and abs(t - 61.7 * 650 / 610) < 1e-9


def test_replot_from_the_saved_rows(tmp_path, capsys):
    js = tmp_path / "run2.json"
    bench_plot.save_rows(str(js), fake_rows(), 3200.0, "Fake GPU")
    assert json.loads(js.read_text())["copy_gbs"] == 3200.0
    bench_plot.main([str(js)])
    printed = capsys.readouterr().out.split()
    _check_pngs(printed, str(tmp_path), "run2", ["activation", "convolution"])


def test_bench_main_plot_flag_writes_charts_next_to_the_markdown(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    import bench

    class FakeBench:
        def __init__(self, n):
            self.rows, self.copy_gbs = fake_rows(), 3200.0

    monkeypatch.setattr(bench, "Bench", FakeBench)
    monkeypatch.setattr(bench, "run_family", lambda b, fam: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake GPU")
    out = tmp_path / "res" / "bench.md"
    out.parent.mkdir()
    monkeypatch.setattr(sys, "argv", ["bench.py", "--families", "activation", "--out", str(out), "--plot"])
    bench.main()
    assert out.read_text().startswith("device: Fake GPU")
    assert (out.parent / "bench.json").is_file()
    pngs = sorted(str(p) for p in out.parent.glob("*.png"))
    _check_pngs(pngs, str(out.parent), "bench", ["activation", "convolution"])
