"""tools/sweep_memory.py --points: a point named as the sweep's log names it is the grid's point again (same
case name, bytes), so a chosen set of a full sweep's points can be re-run alone."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))
import sweep_memory as M  # noqa: E402


def test_points_round_trip_the_grid():
    pts, _ = M.grid(0)
    for p in pts:
        words = [p["family"]] + M.case_name(p).split() + [p["dtype"]]
        q = M.parse_point(" ".join(words))
        assert M.case_name(q) == M.case_name(p) and q["family"] == p["family"] and q["dtype"] == p["dtype"]
        assert M.point_bytes(q) == M.point_bytes(p)


@pytest.mark.parametrize("bad", ["gn_fwd NCHW 2x3x4x4 fp32", "reduce 5x64 fp32", "act_fwd 5x64 fp64"])
def test_points_refused(bad):
    with pytest.raises(ValueError):
        M.parse_point(bad)
