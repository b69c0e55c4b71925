"""The sweep benchmarks' parts that need no GPU (tools/sweep_conv.py, sweep_attention.py, sweep_memory.py,
sweep_common.py): the seeded grids stay inside the issues' ranges and hold the named layers, the
summaries count what they say, the budget stops sampling, and the outputs (markdown, JSON, PNG) are
written from fake timings."""
import json
import math
import os
import random
import struct
import sys
import time
import zlib

import pytest

TOOLS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools")
sys.path.insert(0, os.path.abspath(TOOLS))

import sweep_attention as SA  # noqa: E402
import sweep_common as SC  # noqa: E402
import sweep_conv as SV  # noqa: E402
import sweep_memory as SM  # noqa: E402


# ----------------------------------------------------------------------------------- common
def test_geomean_and_summary():
    assert SC.geomean([1.0, 4.0]) == pytest.approx(2.0)
    assert math.isnan(SC.geomean([]))
    assert SC.geomean([2.0, None, float("nan"), 0.0]) == pytest.approx(2.0)  # not-OK values are left out
    rows = [dict(group="a", case="x", dtype="bf16", status=SC.OK, ratio=0.5),
            dict(group="a", case="y", dtype="bf16", status=SC.OK, ratio=2.0),
            dict(group="a", case="z", dtype="bf16", status=SC.OK, ratio=0.69),
            dict(group="b", case="w", dtype="bf16", status=SC.NOT_SUPPORTED),
            dict(group="b", case="v", dtype="bf16", status=SC.OOM)]
    s = SC.summarize(rows, below=0.7, pred=lambda r: r["group"] == "a")
    assert s["n"] == 3 and s["below"] == 2 and s["min"] == 0.5 and s["min_case"] == "a x bf16"
    assert s["geomean"] == pytest.approx((0.5 * 2.0 * 0.69) ** (1 / 3))
    s = SC.summarize(rows)
    assert s["statuses"] == {SC.OK: 3, SC.NOT_SUPPORTED: 1, SC.OOM: 1}
    assert SC.groups_of(rows) == ["a", "b"]


def test_budget_stops_and_counts():
    now = [0.0]
    b = SC.Budget(10, clock=lambda: now[0])
    assert b.take()
    now[0] = 9.9
    assert b.take()
    now[0] = 10.5
    assert not b.take() and not b.take()
    assert b.skipped == 2 and b.stopped_at == pytest.approx(10.5)
    assert "BUDGET SPENT: 2 point(s)" in b.note()
    assert "every point" in SC.Budget(5, clock=lambda: 0.0).note()


def test_parse_args_defaults():
    a = SC.parse_args("d", 150.0, [])
    assert a.budget_s == 150.0 and not a.quick and a.seed == 0 and a.out is None
    a = SC.parse_args("d", 150.0, ["--quick", "--seed", "3", "--out", "o"])
    assert a.budget_s == 30.0 and a.quick and a.seed == 3 and a.out == "o"
    a = SC.parse_args("d", 150.0, ["--budget-s", "7", "--find"], extra=[("--find", dict(action="store_true"))])
    assert a.budget_s == 7.0 and a.find


class _PydnnLike(Exception):
    pass


def test_classify():
    pydnn = pytest.importorskip("pydnn")
    st, _ = SC.classify(pydnn.PydnnError(pydnn.PYDNN_STATUS_NOT_SUPPORTED, "headDim 256"))
    assert st == SC.NOT_SUPPORTED
    st, _ = SC.classify(pydnn.PydnnError(pydnn.PYDNN_STATUS_NOT_SUPPORTED_SHAPE, "x"))
    assert st == SC.NOT_SUPPORTED
    st, note = SC.classify(pydnn.PydnnError(pydnn.PYDNN_STATUS_BAD_PARAM, "x: bad"))
    assert st == SC.ERROR and "x: bad" in note
    assert SC.classify(RuntimeError("CUDA out of memory. Tried to allocate"))[0] == SC.OOM
    assert SC.classify(ValueError("boom"))[0] == SC.ERROR


def _read_png(path):
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    w, h = struct.unpack(">II", data[16:24])
    pos, idat = 8, b""
    while pos < len(data):
        n = struct.unpack(">I", data[pos:pos + 4])[0]
        tag = data[pos + 4:pos + 8]
        if tag == b"IDAT":
            idat += data[pos + 8:pos + 8 + n]
        crc = struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])[0]
        assert crc == zlib.crc32(tag + data[pos + 8:pos + 8 + n]) & 0xFFFFFFFF
        pos += 12 + n
    return w, h, zlib.decompress(idat)


def test_builtin_png(tmp_path):
    p = str(tmp_path / "b.png")
    SC.plot_sorted(p, "t", {"fwd": [0.5, 2.0, 1.1], "bwd": [0.9]}, (1.0, 0.9), force_builtin=True)
    w, h, raw = _read_png(p)
    assert w == 900 and h == 2 * 220 and len(raw) == h * (1 + 3 * w)
    # bars were drawn: both the blue (>= 1) and the red (< 1) colour appear
    assert bytes((46, 134, 193)) in raw and bytes((192, 57, 43)) in raw
    SC.plot_sorted(str(tmp_path / "e.png"), "t", {}, force_builtin=True)  # nothing to plot: still a PNG
    _read_png(str(tmp_path / "e.png"))


def test_matplotlib_png(tmp_path):
    pytest.importorskip("matplotlib")
    p = str(tmp_path / "m.png")
    SC.plot_sorted(p, "t", {"fwd": [0.5, 2.0, 1.1]}, (1.0,))
    assert open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_markdown_table():
    rows = [dict(a="x", b=1.23456, c=None), dict(a="y", b=float("nan"), c="n")]
    md = SC.markdown_table(rows, [("A", "a", None), ("B", "b", ".2f"), ("C", "c", None), ("D", lambda r: 2.0, ".1f")])
    lines = md.splitlines()
    assert lines[0] == "| A | B | C | D |" and lines[2] == "| x | 1.23 | - | 2.0 |" and lines[3] == "| y | - | n | 2.0 |"


# ----------------------------------------------------------------------------------- convolution
def test_conv_grid_ranges_and_named_layers():
    probs, meta = SV.grid(seed=0)
    rand = [p for p in probs if p["tag"] == "random"]
    assert len(rand) >= 40 and meta["random_count"] == len(rand)
    for p in rand:
        assert 1 <= p["n"] <= 256 and 7 <= p["h"] <= 112 and p["r"] in (1, 3, 5, 7) and p["stride"] in (1, 2)
        assert p["c"] % 8 == 0 and p["k"] % 8 == 0 and 8 <= p["c"] <= 1024 and 8 <= p["k"] <= 1024
        assert p["flops"] <= SV.MAX_FLOPS and SV.nbytes(p) <= SV.MAX_BYTES and p["pad"] == p["r"] // 2
    assert len({(p["n"], p["c"], p["k"], p["h"], p["r"], p["stride"]) for p in rand}) == len(rand)
    # seeded: the same seed draws the same shapes, another seed others
    assert [p["name"] for p in SV.grid(seed=0)[0]] == [p["name"] for p in probs]
    assert [(p["n"], p["c"]) for p in SV.random_problems(1)[0]] != [(p["n"], p["c"]) for p in rand]
    # every layer of the three networks at every batch size (shared layers once), the issue's layers at N = 64
    have = {(p["n"], p["c"], p["k"], p["h"], p["r"], p["stride"], p["pad"], p["groups"]) for p in probs}
    for _, layers in SV.NETWORKS:
        for name, c, k, h, r, s, pad, g in layers:
            for n in SV.BATCHES:
                assert (n, c, k, h, r, s, pad, g) in have, (name, n)
    issue = [p for p in probs if p["tag"] == "issue"]
    assert [(p["c"], p["k"], p["h"], p["r"], p["stride"], p["pad"], p["n"]) for p in issue] == \
        [(c, k, h, r, s, pad, SV.ISSUE_N) for _, c, k, h, r, s, pad, _ in SV.ISSUE_LAYERS]
    assert any(p["groups"] == 32 and p["r"] == 3 for p in probs)  # ResNeXt's grouped 3x3
    assert probs.index(issue[0]) == 0 and probs.index(rand[0]) == len(issue)  # issue, random, then networks


def test_conv_issue_layers_match_bench_convolution():
    pytest.importorskip("torch")
    import bench_convolution as BC
    assert [tuple(l[:7]) for l in SV.ISSUE_LAYERS] == [tuple(l) for l in BC.LAYERS]
    assert SV.ISSUE_N == BC.N


def test_conv_layer_shapes():
    # ResNet-50's output sizes chain: a layer's input is the previous stage's output
    assert SV.out_hw(224, 7, 2, 3) == 112 and SV.out_hw(56, 3, 2, 1) == 28 and SV.out_hw(56, 1, 2, 0) == 28
    p = SV.problem("x", "n", 8, 64, 128, 56, 3, 1, 1, 32)
    assert p["flops"] == 2 * 8 * 128 * 56 * 56 * 2 * 9
    quick, _ = SV.grid(quick=True)
    assert 4 <= len(quick) <= 10 and {p["tag"] for p in quick} == {"issue", "random", "resnext50", "unet"}


def _fake_conv_rows():
    rng = random.Random(5)
    probs, _ = SV.grid(0)
    rows = []
    for p in probs[:30]:
        for d in SV.DIRECTIONS:
            r = dict(case=SV.case_name(p), group=d, dtype="bf16", tag=p["tag"], status=SC.OK)
            r["ms_pydnn"], r["ms_ref"] = rng.uniform(0.1, 1), rng.uniform(0.1, 1)
            r["ratio"] = r["ms_ref"] / r["ms_pydnn"]
            rows.append(r)
    rows.append(dict(case="big", group="fwd", dtype="bf16", tag="random", status=SC.OOM, note="out of memory"))
    return rows


def test_conv_report_and_outputs(tmp_path):
    rows = _fake_conv_rows()
    fused = [dict(group="fused", case="l1 3x3", status=SC.OK, ms_plain=1.0, ms_fused=1.02, ms_torch_fused=1.1,
                  fused_over_plain=1.02, ratio_vs_torch=1.1 / 1.02)]
    meta = dict(seed=0, checks={"fwd": dict(case="c", err=1e-3, ok=True)})
    md = SV.report(rows, fused, meta, "note", 12.0)
    s = SC.summarize(rows, below=0.7)
    assert f"| all | {s['n']} | {SC.fmt(s['geomean'])} |" in md
    assert "3x3 64->64 @56" in md and "1.020x" in md and "OOM" in md and "elapsed 12.0 s" in md
    files = SC.write_outputs(str(tmp_path), "sweep_conv", md, rows + fused, meta, SV.plots(rows))
    assert {os.path.basename(f) for f in files} == {"sweep_conv.md", "sweep_conv.json", "sweep_conv.png"}
    data = json.load(open(tmp_path / "sweep_conv.json"))
    assert len(data["rows"]) == len(rows) + 1 and data["meta"]["seed"] == 0
    panels = SV.plots(rows)["sweep_conv.png"][1]
    assert set(panels) == set(SV.DIRECTIONS) and all(len(v) == 30 for v in panels.values())


# ----------------------------------------------------------------------------------- attention
def test_attention_grid():
    pts, meta = SA.grid(0)
    tr = [p for p in pts if p["kind"] == "train"]
    de = [p for p in pts if p["kind"] == "decode"]
    assert len(tr) == len(SA.SEQS) * len(SA.HEADS) * len(SA.DIMS) * 2 == meta["grid_train"]
    assert len(de) == len(SA.DECODE_KV) * len(SA.DECODE_BATCH) * len(SA.DECODE_HEADS) == meta["grid_decode"]
    for p in tr:
        assert p["b"] * p["s"] == 16384 and 512 <= p["s"] <= 16384
        assert (p["hq"], p["hkv"]) in ((32, 32), (64, 8), (128, 8)) and p["d"] in (64, 128, 256)
    assert {p["d"] for p in tr} == {64, 128, 256} and {p["causal"] for p in tr} == {False, True}
    for p in de:
        assert p["s"] == 1 and 4096 <= p["skv"] <= 131072 and 1 <= p["b"] <= 64 and p["hq"] > p["hkv"]
    # a seeded shuffle (a spent budget leaves a sample of every length, head and dim); the whole grid, once each
    assert {p["s"] for p in tr[:30]} == set(SA.SEQS) and {p["d"] for p in tr[:30]} == set(SA.DIMS)
    assert any(p["kind"] == "decode" for p in pts[:20])
    keys = [SA.case_name(p) for p in pts]
    assert len(set(keys)) == len(keys)
    assert [SA.case_name(p) for p in SA.grid(0)[0]] == keys and [SA.case_name(p) for p in SA.grid(1)[0]] != keys
    q, _ = SA.grid(0, quick=True)
    assert any(p["d"] == 256 for p in q) and any(p["kind"] == "decode" for p in q) and len(q) <= 8


def test_attention_flops():
    p = dict(kind="train", b=4, s=4096, hq=32, hkv=32, d=128, causal=False)
    assert SA.flops(p) == 4 * 4 * 32 * 4096 * 4096 * 128
    assert SA.flops(dict(p, causal=True), backward=True) == 2.5 * SA.flops(p) / 2
    dp = dict(kind="decode", b=2, s=1, skv=4096, hq=32, hkv=8, d=128, causal=False)
    assert SA.flops(dp) == 4 * 2 * 32 * 4096 * 128 and SA.kv_bytes(dp) == 2 * 2 * 8 * 4096 * 128 * 2


def test_attention_report(tmp_path):
    rng = random.Random(2)
    pts, _ = SA.grid(0)
    rows = []
    for p in pts:
        dirs = ("decode",) if p["kind"] == "decode" else ("fwd", "bwd")
        for d in dirs:
            r = dict(case=SA.case_name(p), group=d, dtype="bf16", d=p["d"], status=SC.OK)
            if p["d"] == 256:
                r.update(status=SC.NOT_SUPPORTED, note="headDim 256")
            else:
                r.update(ms_pydnn=rng.uniform(1, 2), ms_ref=rng.uniform(1, 2))
                r["ratio"] = r["ms_ref"] / r["ms_pydnn"]
            rows.append(r)
    md = SA.report(rows, dict(seed=0), "note", 3.0)
    d128 = [r["ratio"] for r in rows if r["group"] == "fwd" and r["d"] == 128]
    assert f"| fwd d128 | {len(d128)} | {SC.fmt(SC.geomean(d128))} |" in md
    n256 = sum(1 for r in rows if r["d"] == 256 and r["group"] == "fwd")
    assert f"| fwd d256 | 0 | - | - | - | 0 | {n256} | 0 |" in md
    assert md.count("NOT_SUPPORTED") >= 2 * n256
    pl = SA.plots(rows)["sweep_attention.png"][1]
    assert "fwd d256" not in pl and len(pl["decode"]) == sum(1 for p in pts if p["kind"] == "decode")
    SC.write_outputs(str(tmp_path), "sweep_attention", md, rows, {}, SA.plots(rows))
    assert (tmp_path / "sweep_attention.png").exists()


# ----------------------------------------------------------------------------------- memory
def test_memory_grid_ranges():
    pts, meta = SM.grid(0)
    assert len(pts) == len(SM.FAMILIES) * len(SM.DTYPES) * SM.POINTS_PER
    fams = {(p["family"], p["dtype"]) for p in pts}
    assert fams == {(f, d) for f in SM.FAMILIES for d in SM.DTYPES}
    hidden = set()
    for p in pts:
        nb = SM.point_bytes(p)
        assert SM.MIN_BYTES <= nb <= SM.MAX_BYTES, (p, nb)
        if p["family"] in SM.ROW_FAMILIES:
            assert 64 <= p["hidden"] <= 65536 and 1 <= p["rows"] <= 1 << 20
            hidden.add(p["hidden"])
        else:
            assert 1 <= p["n"] <= 256 and 3 <= p["c"] <= 2048 and 1 <= p["hw"] <= 224
            assert p["layout"] in ("NCHW", "NHWC") and SM._spatial_ok(p["family"], p["n"], p["hw"])
    pow2 = {h for h in hidden if h & (h - 1) == 0}
    mult8 = {h for h in hidden if h % 8 == 0 and h not in pow2}
    odd = {h for h in hidden if h % 8}
    assert pow2 and mult8 and odd  # powers of two, other multiples of 8 and not multiples of 8
    sizes = sorted(SM.point_bytes(p) for p in pts)
    assert sizes[0] < 64 << 10 and sizes[-1] > 1 << 30  # the size range is covered end to end
    assert {p["layout"] for p in pts if "layout" in p} == {"NCHW", "NHWC"}
    # round-robin: the first len(FAMILIES) * 3 points hold every (family, dtype) once
    head = pts[:len(SM.FAMILIES) * len(SM.DTYPES)]
    assert len({(p["family"], p["dtype"]) for p in head}) == len(head)
    assert [SM.case_name(p) for p in SM.grid(0)[0]] == [SM.case_name(p) for p in pts]
    q, _ = SM.grid(0, quick=True)
    assert len(q) == len(SM.FAMILIES) and all(64 << 10 <= SM.point_bytes(p) < 16 << 20 for p in q)


def test_memory_variants_and_windows():
    pts, _ = SM.grid(0)
    for p in pts:
        if p["family"] in SM.VARIANTS:
            assert p["variant"] in SM.VARIANTS[p["family"]]
    for hw in (1, 2, 3, 224):
        for mode in ("max", "avg"):
            k, s, pad = SM.pool_window(hw, mode)
            assert (hw + 2 * pad - k) // s + 1 >= 1 and pad <= k // 2
    assert SM._groups(96) == 32 and SM._groups(3) == 1 and SM._groups(20) == 4


def _fake_memory_rows():
    rng = random.Random(3)
    pts, _ = SM.grid(0)
    rows = []
    for p in pts:
        nb = SM.point_bytes(p)
        r = dict(group=p["family"], case=SM.case_name(p), dtype=p["dtype"], bytes_in=nb, status=SC.OK)
        r["ms_pydnn"], r["ms_ref"] = rng.uniform(0.01, 1), rng.uniform(0.01, 1)
        r["ratio"] = r["ms_ref"] / r["ms_pydnn"]
        if nb >= SM.BIG:
            r["pct_copy"] = rng.uniform(50, 99)
        if nb < SM.SMALL:
            r["us_over_empty"] = rng.uniform(0, 4)
        rows.append(r)
    rows[0] = dict(rows[0], status=SC.OOM, note="memory cap")
    rows[0].pop("ratio")
    return rows


def test_memory_summary_and_outputs(tmp_path):
    rows = _fake_memory_rows()
    fam = "ln_bwd"
    s = SM.family_summary(rows, fam)
    mine = [r for r in rows if r["group"] == fam and r["status"] == SC.OK]
    big = [r["pct_copy"] for r in mine if "pct_copy" in r]
    small = [r["us_over_empty"] for r in mine if "us_over_empty" in r]
    assert s["n"] == len(mine) and s["below"] == sum(1 for r in mine if r["ratio"] < 1.0)
    assert s["big_n"] == len(big) and s["big_below_80"] == sum(1 for v in big if v < 80)
    if big:
        assert s["pct_copy_min"] == min(big) and s["pct_copy_geomean"] == pytest.approx(SC.geomean(big))
    assert s["small_n"] == len(small) and s["small_over_1_5"] == sum(1 for v in small if v > 1.5)
    md = SM.report(rows, dict(seed=0, copy_gbs=3000.0, empty_ms=0.002), SC.Budget(1).note(), 5.0)
    for f in SM.FAMILIES:
        assert f"| {f} | " in md
    assert "| all | " in md and "OOM" in md
    plots = SM.plots(rows)
    assert set(plots) == {f"sweep_memory_{f}.png" for f in SM.FAMILIES} | {"sweep_memory.png"}
    assert all(v[3] for v in plots.values())  # the built-in writer (fast)
    assert all(len(v[1]) == len(SM.DTYPES) for k, v in plots.items() if k != "sweep_memory.png")
    assert set(plots["sweep_memory.png"][1]) == set(SM.FAMILIES)
    t0 = time.monotonic()
    files = SC.write_outputs(str(tmp_path), "sweep_memory", md, rows, {}, plots)
    assert time.monotonic() - t0 < 30
    assert sorted(os.path.basename(f) for f in files if f.endswith(".png")) == sorted(plots)
    SC.write_partial(str(tmp_path), "sweep_memory", rows[:3], {}, every_s=0)
    assert len(json.load(open(tmp_path / "sweep_memory.partial.json"))["rows"]) == 3
    SC.write_partial(str(tmp_path), "sweep_memory", rows[:4], {}, every_s=60)  # too soon: not rewritten
    assert len(json.load(open(tmp_path / "sweep_memory.partial.json"))["rows"]) == 3


# ----------------------------------------------------------------------------------- dry run on the CPU
class _AnyKernel(dict):
    """Kernel table of a CPU-only handle whose lookups succeed (the launches are stubbed too)."""

    def get(self, key, default=None):
        return object()


@pytest.fixture
def dry(monkeypatch):
    """A CPU handle on which every pydnn check, plan and workspace computation runs for real and the
    launches do nothing; the sweeps allocate on the CPU and PyTorch's side runs there. What this proves:
    each point's setup, both sides' calls and the row bookkeeping run without an exception of their own
    (pydnn's outputs stay poisoned, so the spot checks report CHECK FAILED: that part needs the GPU)."""
    pytest.importorskip("torch")
    pytest.importorskip("pydnn")
    from pydnn._cuda import driver
    from pydnn.handle import Handle

    for name in ("launch", "launch_args", "function_set_max_dynamic_smem", "memset_d8", "memcpy_dtod_async"):
        monkeypatch.setattr(driver, name, lambda *a, **k: None)
    monkeypatch.setattr(SC, "DEV", "cpu")
    h = Handle.__new__(Handle)
    h.ctx, h.device, h.arch, h.sm_count, h.stream, h.cu_stream, h.alive = None, 0, "sm_90", 132, 0, None, True
    h._funcs, h.prepared = _AnyKernel(), {}
    calls = []

    def timer(fn, reps=1, warmup=0):
        fn()
        calls.append(fn)
        return 0.25 + 0.05 * (len(calls) % 2)

    return h, timer


def _no_errors(rows):
    bad = [r for r in rows if r["status"] not in (SC.OK, SC.NOT_SUPPORTED)]
    assert not bad, [(r["group"], r["case"], r["status"], r.get("note")) for r in bad]


def test_dry_run_conv(dry):
    h, timer = dry
    rows, fused, checked = [], [], {}
    for p in (SV.problem("issue", "t", 2, 16, 16, 8, 3, 1, 1, 1), SV.problem("resnext50", "g", 2, 64, 64, 8, 3, 2, 1, 32),
              SV.problem("random", "s", 1, 8, 24, 9, 5, 2, 2, 1), SV.problem("unet", "h", 2, 64, 2, 8, 1, 1, 0, 1)):
        SV.run_problem(h, p, timer, checked, False, rows)
    SV.run_fused(h, [("f", 16, 16, 8, 3, 1, 1, 1)], timer, lambda a, b: (timer(a), timer(b)), fused)
    _no_errors(rows + fused)
    assert len(rows) == 12 and [r["group"] for r in rows[:3]] == list(SV.DIRECTIONS)
    assert all(r["ratio"] > 0 and r["tflops_pydnn"] > 0 and "algo" in r and r["kernel"] for r in rows)
    assert set(checked) == set(SV.DIRECTIONS) and fused[0]["fused_over_plain"] > 0
    SV.report(rows, fused, dict(checks=checked), "n", 1.0)


def test_dry_run_attention(dry, monkeypatch):
    import contextlib
    h, timer = dry
    monkeypatch.setattr(SA, "_backend", lambda name: contextlib.nullcontext())  # PyTorch's CPU SDPA (math)
    rows, checked = [], {}
    for p in (dict(kind="train", b=2, s=128, hq=4, hkv=2, d=64, causal=True),
              dict(kind="train", b=1, s=128, hq=2, hkv=2, d=80, causal=False),  # a head dim pydnn refuses
              dict(kind="decode", b=2, s=1, skv=256, hq=4, hkv=2, d=128, causal=False)):
        SA.run_point(h, p, timer, checked, rows)
    _no_errors(rows)
    assert [(r["group"], r["status"]) for r in rows] == [("fwd", SC.OK), ("bwd", SC.OK), ("fwd", SC.NOT_SUPPORTED),
                                                         ("bwd", SC.NOT_SUPPORTED), ("decode", SC.OK)]
    assert rows[-1]["ref"] in ("cudnn", "flash") and rows[-1]["gbs_pydnn"] > 0
    SA.report(rows, dict(checks=checked), "n", 1.0)


def test_dry_run_memory(dry):
    h, timer = dry
    c = SM.Ctx()
    c.h, c.timer, c.copy_gbs, c.empty_ms = h, timer, 3000.0, 0.002
    rows, checked = [], {}
    for fam in SM.FAMILIES:
        for i, (dt, layout) in enumerate((("fp32", "NCHW"), ("bf16", "NHWC"))):
            if fam in SM.ROW_FAMILIES:
                p = dict(family=fam, dtype=dt, rows=6, hidden=(72, 100)[i])
            else:
                p = dict(family=fam, dtype=dt, n=2, c=6, hw=5, layout=layout)
            if SM.VARIANTS.get(fam):
                p["variant"] = SM.VARIANTS[fam][i]
            SM.run_point(c, p, rows, checked)
    _no_errors(rows)
    assert len(rows) == 2 * len(SM.FAMILIES) and len(checked) == len(rows)
    assert all(r["us_over_empty"] == pytest.approx(1000 * (r["ms_pydnn"] - 0.002)) for r in rows)
    # the memory cap: a point too large for the free memory is an OOM row, not run
    SM.run_point(c, dict(family="act_fwd", dtype="fp32", rows=1 << 20, hidden=1 << 16, variant="relu"), rows, checked)
    assert rows[-1]["status"] == SC.OOM and "memory cap" in rows[-1]["note"]


def test_render_from_json(tmp_path):
    """--render rewrites each tool's markdown and PNGs from its JSON (also a partial one), without a GPU."""
    conv = _fake_conv_rows() + [dict(group="fused", case="f", status=SC.OK, ms_plain=1.0, ms_fused=1.01,
                                     ms_torch_fused=1.2, fused_over_plain=1.01, ratio_vs_torch=1.19)]
    SC.write_partial(str(tmp_path / "c"), "sweep_conv", conv, dict(seed=4), every_s=0)
    rows = SV.main(["--render", str(tmp_path / "c" / "sweep_conv.partial.json")])
    assert len(rows) == len(conv)
    md = open(tmp_path / "c" / "sweep_conv.md").read()
    assert "1.010x" in md and "seed 4" in md and (tmp_path / "c" / "sweep_conv.png").exists()
    mem = _fake_memory_rows()
    SC.write_outputs(str(tmp_path / "m"), "sweep_memory", "x", mem, dict(seed=1, copy_gbs=3000.0, empty_ms=0.002,
                                                                        elapsed_s=9.0), {})
    SM.main(["--render", str(tmp_path / "m" / "sweep_memory.json"), "--out", str(tmp_path / "m2")])
    md = open(tmp_path / "m2" / "sweep_memory.md").read()
    assert "elapsed 9.0 s" in md and "| ln_bwd | " in md and (tmp_path / "m2" / "sweep_memory_ln_bwd.png").exists()
    att = [dict(group="fwd", case="b1 s512 h32/32 d128", dtype="bf16", d=128, status=SC.OK, ms_pydnn=1.0, ms_ref=0.8,
                ratio=0.8)]
    SC.write_outputs(str(tmp_path / "a"), "sweep_attention", "x", att, {}, {})
    SA.main(["--render", str(tmp_path / "a" / "sweep_attention.json")])
    assert "| fwd d128 | 1 | 0.800 |" in open(tmp_path / "a" / "sweep_attention.md").read()


@pytest.fixture
def dry_main(dry, monkeypatch):
    """dry + the GPU pieces of the tools' main() faked (handle creation, PyTorch's stream, copy bandwidth,
    the empty kernel, event timing, CUDA graphs), so that each main() runs its --quick grid end to end."""
    import torch
    import pydnn
    import bench
    h, timer = dry

    class FakeBench:
        def __init__(self, n):
            self.h, self.copy_gbs = h, 3000.0

    class FakeStream:
        cuda_stream = 0

    monkeypatch.setattr(bench, "Bench", FakeBench)
    monkeypatch.setattr(bench, "time_ms", lambda fn, reps=1, warmup=0: timer(fn))
    monkeypatch.setattr(bench, "time_pair", lambda a, b, **k: (timer(a), timer(b)))
    monkeypatch.setattr(pydnn, "create", lambda: h)
    monkeypatch.setattr(pydnn, "set_stream", lambda hh, s: None)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: FakeStream())
    monkeypatch.setattr(SC, "gpu_timer", lambda reps, warmup, slow_ms=50.0: timer)
    monkeypatch.setattr(SC, "graph_ms", lambda hh, fn, calls=20, reps=10: (fn(), 0.001)[1])
    monkeypatch.setattr(SC, "device_meta", lambda: dict(device="CPU dry run", torch=torch.__version__, cudnn=0))
    monkeypatch.setattr(SM, "empty_kernel", lambda hh: ((lambda: None), None))
    return h


def test_dry_main_memory(dry_main, tmp_path):
    rows = SM.main(["--quick", "--budget-s", "1000", "--out", str(tmp_path)])
    _no_errors(rows)
    assert {r["group"] for r in rows} == set(SM.FAMILIES)
    md = open(tmp_path / "sweep_memory.md").read()
    assert "every point of the grid sampled" in md and "CPU dry run" in md
    data = json.load(open(tmp_path / "sweep_memory.json"))
    assert data["meta"]["graph_empty_ms"] == 0.001 and len(data["rows"]) == len(rows)
    assert not (tmp_path / "sweep_memory.partial.json").exists()
    assert all(r.get("us_over_empty_graph") is not None for r in rows if r["bytes_in"] < SM.SMALL)


def test_dry_main_attention(dry_main, tmp_path, monkeypatch):
    import contextlib
    monkeypatch.setattr(SA, "_backend", lambda name: contextlib.nullcontext())
    small = [dict(kind="train", b=2, s=64, hq=2, hkv=2, d=64, causal=False),
             dict(kind="train", b=1, s=64, hq=2, hkv=1, d=80, causal=True),  # a head dim pydnn refuses
             dict(kind="decode", b=1, s=1, skv=128, hq=4, hkv=2, d=128, causal=False)]
    monkeypatch.setattr(SA, "grid", lambda seed=0, quick=False: (small, dict(seed=seed)))
    rows = SA.main(["--quick", "--budget-s", "1000", "--out", str(tmp_path)])
    _no_errors(rows)
    assert [r["status"] for r in rows] == [SC.OK, SC.OK, SC.NOT_SUPPORTED, SC.NOT_SUPPORTED, SC.OK]
    assert (tmp_path / "sweep_attention.md").exists() and (tmp_path / "sweep_attention.png").exists()


def test_dry_main_conv(dry_main, tmp_path, monkeypatch):
    small = [SV.problem("issue", "a", 2, 16, 16, 8, 3, 1, 1, 1), SV.problem("resnext50", "g", 1, 64, 64, 8, 3, 1, 1, 32)]
    monkeypatch.setattr(SV, "grid", lambda seed=0, quick=False: (small, dict(seed=seed)))
    monkeypatch.setattr(SV, "QUICK_FUSED", [("f", 16, 16, 8, 3, 1, 1, 1)])
    rows = SV.main(["--quick", "--budget-s", "1000", "--out", str(tmp_path)])
    _no_errors(rows)
    assert len(rows) == 6 and all(r["point_s"] >= 0 for r in rows)
    md = open(tmp_path / "sweep_conv.md").read()
    assert "Fused conv + bias + ReLU" in md and (tmp_path / "sweep_conv.png").exists()
    # the budget: spent at once, nothing sampled, and the summary says so
    rows = SV.main(["--quick", "--budget-s", "0", "--out", str(tmp_path / "b")])
    assert rows == [] and "BUDGET SPENT: 2 point(s)" in open(tmp_path / "b" / "sweep_conv.md").read()


def test_dry_main_stops_on_a_lost_context(dry_main, tmp_path, monkeypatch):
    """An error that leaves the CUDA context unusable (illegal address) stops the sweep at that point, and
    the summary says so; an ordinary error is a row and the sweep goes on."""
    real = SM.build

    def build(c, p):
        if p["family"] == "op_add":
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        if p["family"] == "act_bwd":
            raise ValueError("an ordinary failure")
        return real(c, p)
    monkeypatch.setattr(SM, "build", build)
    rows = SM.main(["--quick", "--budget-s", "1000", "--out", str(tmp_path)])
    fams = [r["group"] for r in rows]
    assert fams[-1] == "op_add" and "act_bwd" in fams and "reduce" not in fams
    assert rows[fams.index("act_bwd")]["status"] == SC.ERROR
    md = open(tmp_path / "sweep_memory.md").read()
    assert "CUDA CONTEXT LOST" in md and "op_add" in json.load(open(tmp_path / "sweep_memory.json"))["meta"]["context_lost"]
    assert SC.sticky([dict(status=SC.ERROR, group="g", case="c", note="ValueError: x")]) is None


def test_memory_warm_alternates_until_the_time(monkeypatch):
    """sweep_memory.warm (--warm-ms): both sides called alternately, pydnn's first, until the events say >= ms of
    device time (a fake clock of 0.3 ms a call here), at most `most` pairs."""
    torch = pytest.importorskip("torch")
    clock, calls = [0.0], []

    class Ev:
        def __init__(self, enable_timing=False):
            self.t = None

        def record(self):
            self.t = clock[0]

        def synchronize(self):
            pass

        def elapsed_time(self, other):
            return other.t - self.t

    monkeypatch.setattr(torch.cuda, "Event", Ev)

    def side(name):
        def f():
            calls.append(name)
            clock[0] += 0.3
        return f

    assert SM.warm(side("p"), side("t"), 2.0) == 4  # 4 pairs: 2.4 ms >= 2.0
    assert calls == ["p", "t"] * 4
    calls.clear()
    assert SM.warm(side("p"), side("t"), 1e9, most=3) == 3 and len(calls) == 6
