"""The install-time build's progress (CPU): tqdm or rich on a terminal, plain log lines otherwise."""
import io
import sys
import types

import pytest

from pydnn._build import build


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_plain_lines_for_logs(monkeypatch):
    monkeypatch.delenv("PYDNN_PROGRESS", raising=False)
    out = io.StringIO()  # not a terminal (pip's captured output, CI logs)
    p = build.Progress(40, out)
    assert p.style == "plain"
    for i in range(40):
        p.step(f"unit{i} sm_90")
    p.close()
    lines = out.getvalue().splitlines()
    assert 15 <= len(lines) <= 25  # about one line per 5%, and the last
    assert lines[0].startswith("pydnn: compiled 1/40 kernel units (2%)")
    assert lines[-1].startswith("pydnn: compiled 40/40 kernel units (100%)") and "unit39 sm_90" in lines[-1]


def test_tqdm_on_a_terminal(monkeypatch):
    monkeypatch.delenv("PYDNN_PROGRESS", raising=False)
    calls = []

    class FakeTqdm:
        def __init__(self, total, file, **kw):
            calls.append(("new", total))

        def set_postfix_str(self, s, refresh=True):
            calls.append(("postfix", s))

        def update(self, n):
            calls.append(("update", n))

        def close(self):
            calls.append(("close",))

    monkeypatch.setitem(sys.modules, "tqdm", types.SimpleNamespace(tqdm=FakeTqdm))
    p = build.Progress(2, _Tty())
    assert p.style == "tqdm"
    p.step("a sm_80")
    p.step("b sm_80")
    p.close()
    assert calls == [("new", 2), ("postfix", "a sm_80"), ("update", 1), ("postfix", "b sm_80"), ("update", 1),
                     ("close",)]


def test_terminal_without_tqdm_or_rich_is_plain(monkeypatch):
    monkeypatch.delenv("PYDNN_PROGRESS", raising=False)
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import fails
    monkeypatch.setitem(sys.modules, "rich", None)
    assert build.Progress(3, _Tty()).style == "plain"


def test_switch(monkeypatch):
    monkeypatch.setenv("PYDNN_PROGRESS", "none")
    out = io.StringIO()
    p = build.Progress(3, out)
    p.step()
    p.close()
    assert out.getvalue() == ""


def test_build_all_reports_each_unit(monkeypatch, capsys):
    """build_all with compilation stubbed out: the header line, then the progress through every unit."""
    monkeypatch.setenv("PYDNN_PROGRESS", "plain")
    units = [types.SimpleNamespace(name=f"u{i}", archs=("sm_80", "sm_90")) for i in range(3)]
    monkeypatch.setattr(build.nvrtc, "version", lambda: (13, 0))
    monkeypatch.setattr(build, "unit_arch", lambda u, a: a)
    monkeypatch.setattr(build.cache, "unit_key", lambda u, a, nv: f"{u.name}-{a}")
    monkeypatch.setattr(build.cache, "entry_path", lambda u, a, k: k)
    monkeypatch.setattr(build.cache, "read_entry", lambda path: None)
    compiled = []
    monkeypatch.setattr(build, "compile_unit", lambda u, a, nv: compiled.append((u.name, a)))
    assert build.build_all(archs=["sm_80", "sm_90"], units=units, jobs=2) == (6, 0)
    err = capsys.readouterr().err
    assert "pydnn: 6 kernel units to compile for sm_80,sm_90" in err
    assert "pydnn: compiled 6/6 kernel units (100%)" in err
    assert sorted(compiled) == sorted((u.name, a) for u in units for a in ("sm_80", "sm_90"))


def test_a_compile_error_still_stops_the_build(monkeypatch):
    monkeypatch.setenv("PYDNN_PROGRESS", "plain")
    units = [types.SimpleNamespace(name="bad", archs=("sm_80",))]
    monkeypatch.setattr(build.nvrtc, "version", lambda: (13, 0))
    monkeypatch.setattr(build, "unit_arch", lambda u, a: a)
    monkeypatch.setattr(build.cache, "unit_key", lambda u, a, nv: "k")
    monkeypatch.setattr(build.cache, "entry_path", lambda u, a, k: k)
    monkeypatch.setattr(build.cache, "read_entry", lambda path: None)

    def fail(u, a, nv):
        raise RuntimeError("NVRTC could not compile kernel unit bad")

    monkeypatch.setattr(build, "compile_unit", fail)
    with pytest.raises(RuntimeError, match="kernel unit bad"):
        build.build_all(archs=["sm_80"], units=units)
