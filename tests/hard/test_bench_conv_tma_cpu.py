"""tools/bench_conv_tma.py end to end on the CPU (test_sweeps_cpu's dry handle: plans run for real, launches do
nothing, the tensor maps cannot be encoded without a driver): per row the model's plan, the fwd_wgmma base
(forced where the model's is another kernel), fwd_tma at the chooser's and at forced widths are planned, and
the rows and summary are written. Its numbers need the GPU."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from test_sweeps_cpu import _AnyKernel, dry, dry_main  # noqa: E402,F401 - fixtures


def test_bench_conv_tma_dry(dry_main, tmp_path, monkeypatch):
    pytest.importorskip("torch")
    import bench_conv_tma as B
    monkeypatch.setattr(B, "ROWS", [("3x3 64", 2, 64, 64, 8, 3, 1), ("5x5 96", 1, 96, 192, 6, 5, 2)])
    rows = B.main(["--out", str(tmp_path), "--bns", "64,256", "--reps", "1"])
    assert len(rows) == 2
    assert all("model_ms" in r and "cudnn_ms" in r for r in rows)
    assert all("fwd_wgmma<" in r["wgmma_kernel"] for r in rows)   # the plan fwd_tma replaces
    assert rows[0]["box"][3] == 64 and rows[1]["box"][3] == 128    # K 64: the 64-wide tile; K 192: 128
    assert (tmp_path / "bench_conv_tma.jsonl").exists()
