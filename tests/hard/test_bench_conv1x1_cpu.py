"""tools/bench_conv1x1.py (issue 18's 1x1 / GEMM-route benchmark) end to end on a CPU handle: every route's
plan is built under its switches, launched (launches are no-ops: test_sweeps_cpu's `dry`), checked and
timed through the faked graph timer, and the report is written. What this proves: the tool runs without
an exception of its own on each kind of shape (1x1, strided 1x1, multi-tap with channel tails, the stem,
the fused rows); its numbers need the GPU."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from test_sweeps_cpu import _AnyKernel, dry, dry_main  # noqa: E402,F401 - fixtures


def test_bench_conv1x1_dry(dry_main, tmp_path, monkeypatch):
    import bench_conv1x1 as B
    monkeypatch.setattr(B, "SHAPES", [("1x1", 2, 64, 32, 8, 1), ("1x1/2", 2, 64, 32, 8, 2),
                                      ("stem", 1, 3, 16, 16, 2, 7), ("5x5 c144", 1, 144, 16, 9, 1, 5)])
    monkeypatch.setattr(B, "FUSED", [("f", 2, 64, 32, 8, 1)])
    rows = B.main(["--out", str(tmp_path), "--fused", "--reps", "1"])
    fwd = [r for r in rows if r["dir"] == "fwd"]
    assert len(fwd) == 4 and len([r for r in rows if r["dir"] == "bwd data"]) == 2
    assert all("gemm_ms" in r and "cudnn_ms" in r for r in fwd)          # every shape's GEMM algorithm ran
    assert "NOT_SUPPORTED" in fwd[2].get("implicit_note", "")    # the stem's C = 3: no tensor-core implicit
    assert all(k in fwd[3] for k in ("gemm_mm_ms", "gemm_auto_ms", "implicit_old_ms", "gemm_view_tails_ms"))
    assert "matmul" not in fwd[3]["implicit_kernel"] and "fwd_wgmma" in fwd[3]["implicit_kernel"]   # the channel tail
    assert "fwd_tc" in fwd[3]["implicit_old_kernel"]
    assert [r["algo"] for r in rows if r["dir"] == "fused"] == ["implicit", "gemm", "impl_tma"]   # fwd_tma's too
    md = (tmp_path / "bench_conv1x1.md").read_text()
    assert "best-of-both" in md and "Fused conv + bias + ReLU" in md
