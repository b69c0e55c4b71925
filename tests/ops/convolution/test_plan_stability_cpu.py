"""Every convolution plan (kernel parameters byte for byte, expressions, grids, workspace, sub-plans) and
every v7 ranking of 1500 seeded problems on two CPU handles (sm_90 / 132 SMs, sm_80 / 108 SMs) is the
one recorded in plan_digests.json (tools/plan_digest.py). A change that means to plan differently
re-records it, and says so in its commit; a refactor must leave it alone."""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tools"))

import plan_digest  # noqa: E402


def test_plans_match_the_recorded_digests():
    want = json.loads((Path(__file__).parent / "plan_digests.json").read_text())
    got = plan_digest.by_problem(plan_digest.run(want["count"], want["seed"]))
    differ = [k for k in want["digests"] if got.get(k) != want["digests"][k]]
    assert not differ, f"{len(differ)} of {len(want['digests'])} problems plan differently: {differ[:10]}"


def test_the_digest_sees_a_change(monkeypatch):
    """The check can fail: a tiling model that picks differently changes the digests."""
    from pydnn import tuning
    base = plan_digest.by_problem(plan_digest.run(40, 7))
    monkeypatch.setattr(tuning.conv, "USE_WGM", False)
    changed = plan_digest.by_problem(plan_digest.run(40, 7))
    assert base != changed
