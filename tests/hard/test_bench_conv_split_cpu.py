"""tools/bench_conv_split.py end to end on the CPU (test_sweeps_cpu's dry handle: plans, workspaces and the
row bookkeeping run for real, launches do nothing): it picks the points the split model splits, runs the
named controls, and prints its summary."""
import os
import sys

import pytest

TOOLS = os.path.join(os.path.dirname(__file__), "..", "..", "tools")
sys.path.insert(0, os.path.abspath(TOOLS))

import bench_conv_split as BS  # noqa: E402
import sweep_conv as SV  # noqa: E402
from test_sweeps_cpu import _AnyKernel, dry, dry_main  # noqa: E402,F401


def test_dry_bench_conv_split(dry_main, tmp_path, monkeypatch, capsys):
    pytest.importorskip("torch")
    small = [SV.problem("random", "s", 2, 256, 256, 7, 3, 1, 1, 1),     # 4 blocks of 36 K tiles: split
             SV.problem("issue", "c", 2, 16, 16, 8, 3, 1, 1, 1),        # whole (a control)
             SV.problem("random", "w", 2, 16, 16, 8, 3, 1, 1, 1)]       # whole, not a control: skipped
    monkeypatch.setattr(SV, "grid", lambda seed=0, quick=False: (small, dict(seed=seed)))
    import pydnn
    from pydnn.handle import Handle

    def create():   # one handle a call (the tool keeps the split and the whole plans on two handles)
        h = Handle.__new__(Handle)
        h.ctx, h.device, h.arch, h.sm_count, h.stream, h.cu_stream, h.alive = None, 0, "sm_90", 132, 0, None, True
        h._funcs, h.prepared = _AnyKernel(), {}
        return h
    monkeypatch.setattr(pydnn, "create", create)
    BS.main(["--controls", "issue N2", "--out", str(tmp_path)])
    text = open(tmp_path / "bench_conv_split.txt").read()
    lines = [ln for ln in text.splitlines() if " S=" in ln]
    assert len(lines) == 4, text   # the split shape's fwd and bwd data, the control's fwd and bwd data
    assert all("random N2 3x3 256->256 @7" in ln and "S=1 " not in ln for ln in lines[:2])
    assert all("(control)" in ln and "S=1 " in ln for ln in lines[2:])
    assert "split points: 2" in text
