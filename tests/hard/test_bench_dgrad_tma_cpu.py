"""tools/bench_dgrad_tma.py end to end on the CPU (test_sweeps_cpu's dry handle: plans run for real, launches do
nothing, the tensor maps cannot be encoded without a driver): per row the model's plan, fwd_tma's direct and swap
routes are planned and run, and the rows and summary are written; --sweep picks the grid's stride-1 one-group points
that DGRAD_TMA True plans on fwd_tma. Its numbers need the GPU."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from test_sweeps_cpu import _AnyKernel, dry, dry_main  # noqa: E402,F401 - fixtures


def test_bench_dgrad_tma_dry(dry_main, tmp_path):
    pytest.importorskip("torch")
    import bench_dgrad_tma as B
    rows = B.main(["--out", str(tmp_path), "--rows", "0,9", "--swap", "--reps", "1"])
    assert len(rows) == 2
    assert all("model_ms" in r and "tma_ms" in r and "swap_ms" in r and "cudnn_ms" in r for r in rows)
    assert all("fwd_wgmma<" in r["model_kernel"] for r in rows)   # the plan fwd_tma replaces
    assert rows[0]["box"][3] == 64 and rows[1]["box"][3] == 128    # C 64: the 64-wide tile; C 96: 128
    assert (tmp_path / "bench_dgrad_tma.jsonl").exists()


def test_bench_dgrad_tma_sweep_rows(dry_main):
    import bench_dgrad_tma as B
    import pydnn
    table, looked = B.sweep_rows(pydnn.create())
    assert 0 < len(table) < looked
    assert all(r >= 1 and c >= 64 and stride == 1 for _, n, c, k, hw, r, pad, stride in table)


def test_bench_dgrad_tma_phases_dry(dry_main, tmp_path, monkeypatch):
    pytest.importorskip("torch")
    import bench_dgrad_tma as B
    import pydnn
    table, looked = B.sweep_rows(pydnn.create(), phases=True)
    assert 0 < len(table) < looked and all(row[7] > 1 for row in table)
    monkeypatch.setattr(B, "sweep_rows", lambda h, phases=False: ([table[0], table[-1]], looked))
    rows = B.main(["--out", str(tmp_path), "--phases", "--reps", "1"])
    assert len(rows) == 2 and all("model_ms" in r and "tma_ms" in r and "cudnn_ms" in r for r in rows)
    assert all(r["tma_encoded"] is False for r in rows)   # (a CPU handle cannot encode maps: the fallback ran)
