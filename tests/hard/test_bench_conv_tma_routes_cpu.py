"""tools/bench_conv_tma_routes.py end to end on the CPU (test_sweeps_cpu's dry handle: plans run for real, launches do
nothing, the tensor maps cannot be encoded without a driver): the grid's points each set's switch moves to fwd_tma
(TMA_1X1: the direct 1x1 GEMM plans on gemm_tc; FWD_TMA_STRIDED: strided forwards), and per row the replaced plan,
fwd_tma at the chooser's and the forced tile widths (plain and 16-byte stores), and cuDNN's side are planned, run and
written. Its numbers need
the GPU."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from test_sweeps_cpu import _AnyKernel, dry, dry_main  # noqa: E402,F401 - fixtures


@pytest.mark.parametrize("which", ["1x1", "strided", "wide", "few", "wgrad"])
def test_sweep_rows(dry_main, which):
    import bench_conv_tma_routes as B
    import pydnn
    table, looked = B.sweep_rows(pydnn.create(), which)
    assert 0 < len(table) <= (2 if which in ("1x1", "few") else 1) * looked
    for name, d, n, c, k, hw, r, pad, stride in table:
        if which == "1x1":
            assert (r, stride) == (1, 1) and d in ("fwd", "bwd data")
        elif which == "few":
            assert stride == 1 and d in ("fwd", "bwd data")
        elif which == "wgrad":
            assert (r, stride, pad, d) == (1, 1, 0, "bwd filter")
        else:
            assert d == "fwd" and (stride > 1) == (which == "strided")


def test_bench_wide_dry(dry_main, tmp_path, monkeypatch):
    """--set wide: the model route is fwd_tma with the plain store, `tma` the 16-byte one."""
    pytest.importorskip("torch")
    import bench_conv_tma_routes as B
    import pydnn
    from pydnn.ops.convolution import conv_tma as CTMA
    table, looked = B.sweep_rows(pydnn.create(), "wide")
    monkeypatch.setattr(B, "sweep_rows", lambda h, w="1x1": ([table[0]], looked))
    seen = []
    real = CTMA.TmaPlan.launch
    monkeypatch.setattr(CTMA.TmaPlan, "launch", lambda self, *a, **kw: (seen.append(self.wide_ok), real(self, *a, **kw)))
    rows = B.main(["--set", "wide", "--out", str(tmp_path), "--reps", "1", "--bns", "", "--wide", "0"])
    assert len(rows) == 1 and "model_ms" in rows[0] and "tma_ms" in rows[0]
    assert False in seen and True in seen


@pytest.mark.parametrize("which", ["1x1", "strided", "few"])
def test_bench_dry(dry_main, tmp_path, monkeypatch, which):
    pytest.importorskip("torch")
    import bench_conv_tma_routes as B
    import pydnn
    table, looked = B.sweep_rows(pydnn.create(), which)
    monkeypatch.setattr(B, "sweep_rows", lambda h, w="1x1": ([table[0], table[-1]], looked))
    rows = B.main(["--set", which, "--out", str(tmp_path), "--reps", "1", "--bns", "64,256"])
    assert len(rows) == 2
    for r in rows:
        assert "model_ms" in r and "tma_ms" in r and "cudnn_ms" in r and r["bn"] in (64, 128, 256), r
        assert all(f"bn{b}_ms" in r and f"wide{b}_ms" in r for b in (64, 256) if b != r["bn"])
        assert "wide_ms" in r   # the 16-byte store (FWD_TMA_WIDE) at the chooser's width
        assert "maps not encoded" in r.get("note", "")   # (a CPU handle: the fallback ran)
    assert (tmp_path / f"bench_conv_tma_{which}.jsonl").exists()


def test_bench_wgrad_dry(dry_main, tmp_path, monkeypatch):
    """--set wgrad: the 1x1 backward filter's v7 plan against one matmul (WGRAD_MM), both planned, run, written."""
    pytest.importorskip("torch")
    import bench_conv_tma_routes as B
    import pydnn
    table, looked = B.sweep_rows(pydnn.create(), "wgrad")
    monkeypatch.setattr(B, "sweep_rows", lambda h, w="1x1": ([table[0], table[-1]], looked))
    rows = B.main(["--set", "wgrad", "--out", str(tmp_path), "--reps", "1", "--bns", "", "--wide", "0"])
    assert len(rows) == 2
    for r in rows:
        assert "model_ms" in r and "tma_ms" in r and "cudnn_ms" in r and "matmul::" not in r["mm_kernel"], r
        assert r["direction"] == "bwd filter" and r["mm_kernel"].startswith("gemm_")   # (dry: nothing computed)
