"""The install / first-use split of the kernel units (pydnn/_build/rare.py), on the CPU: the rules still
match, the split loses and duplicates nothing on any arch, the loader finds every family expression's unit,
the install builds the install part only, and a first-use unit compiles once with one log line."""
import logging

import pytest

from pydnn._build import build, cache, loader, manifest, rare

ARCHS = (None, "sm_80", "sm_86", "sm_90")


def test_every_rule_matches_something():
    assert rare.unmatched_rules(manifest.family_units()) == []


@pytest.mark.parametrize("arch", ARCHS)
def test_split_keeps_every_instantiation_once(arch):
    family = {(u.name, e) for u in manifest.family_units() for e in u.exprs}
    units = manifest.all_units(arch)
    split = [(u.home or u.name, e) for u in units for e in u.exprs]
    assert len(split) == len(set(split)), "an instantiation is in two units"
    assert set(split) == family
    names = {u.name: u for u in units}
    own = f"{{}}.a{rare.arch_number(arch)}"
    for u in units:
        if u.home and u.install:   # this arch's own rest of an install part the SHARED_ARCHS do not all install
            assert u.name == own.format(u.home) and u.home in names and names[u.home].install
            assert not any(rare.is_rare(u.home, e, arch) for e in u.exprs)
            # the family unit's own name holds what every SHARED_ARCHS arch installs: the same on each
            for a in rare.SHARED_ARCHS:
                assert not any(rare.is_rare(u.home, e, a) for e in names[u.home].exprs), a
            assert all(any(rare.is_rare(u.home, e, a) for a in rare.SHARED_ARCHS) for e in u.exprs)
            continue
        assert u.install == (not u.home)
        if u.home:
            assert u.name.startswith(u.home + ".rare")
            assert all(rare.is_rare(u.home, e, arch) for e in u.exprs)
            assert 1 <= len(u.exprs) <= rare.CHUNK
        else:
            assert not any(rare.is_rare(u.name, e, arch) for e in u.exprs)


def test_common_install_part_is_the_same_on_the_shared_archs():
    """convolution.f16's install part differs between sm_80 and sm_90 (sm_90 leaves three mma.sync tiles to
    fwd_wgmma / wgrad_tc_wgmma): the family name holds the common part on both, and sm_80 adds convolution.f16.a80."""
    t80, t90 = manifest.unit_by_name("sm_80"), manifest.unit_by_name("sm_90")
    for n in ("convolution.f16", "convolution.bf16"):
        assert t80[n].exprs == t90[n].exprs and t80[n].install and t90[n].install
        assert t80[f"{n}.a80"].install and t80[f"{n}.a80"].home == n and f"{n}.a90" not in t90
        assert set(t80[n].exprs) | set(t80[f"{n}.a80"].exprs) == {e for u in manifest.install_units("sm_80")
                                                                   if (u.home or u.name) == n for e in u.exprs}


@pytest.mark.parametrize("arch", ARCHS[1:])
def test_loader_resolves_every_family_expression(arch):
    table = manifest.unit_by_name(arch)
    for u in manifest.family_units():
        if manifest.unit_arch(u, arch) is None:
            continue
        for e in u.exprs:
            name = loader.resolve(arch, u.name, e)
            assert e in table[name].exprs, (u.name, e, name)
            assert loader._unit(name, arch) == table[name]


def test_rules_by_arch():
    cl = "pydnn::norm::bwd_staged_cluster<pydnn::half_t, 8, 2, true>"
    assert rare.is_rare("normalization.f16", cl, "sm_80") and rare.is_rare("normalization.f16", cl, "sm_86")
    assert not rare.is_rare("normalization.f16", cl, "sm_90") and not rare.is_rare("normalization.f16", cl, None)
    assert rare.is_rare("activation.f64", "pydnn::map_contig<double, double, pydnn::act::Relu<false>, 1>")
    assert not rare.is_rare("activation.h16", "pydnn::map_contig<pydnn::h16_t, pydnn::h16_t, pydnn::act::Relu<true>, 8, 128, 1, 1>")
    assert rare.is_rare("activation.h16", "pydnn::map_strided<pydnn::h16_t, pydnn::h16_t, pydnn::act::Relu<true>>")
    # (forced-only) the plain-loop fwd_wgmma variants, not the lean tiles the model picks
    assert rare.is_rare("convolution.wgmma.bf16", "pydnn::conv::fwd_wgmma<pydnn::bf16_t, 128, 4, 1>")
    assert not rare.is_rare("convolution.wgmma.bf16", "pydnn::conv::fwd_wgmma<pydnn::bf16_t, 128, 4, 1, 1>")
    assert rare.arch_number("sm_90a") == 90 and rare.arch_number(None) is None
    # least=90: bwd_ring with clusters of 1 is the main path below sm_90, the cluster form's fallback from it on
    ring = "pydnn::norm::bwd_ring<pydnn::bf16_t, 8, 2, 4>"
    assert rare.is_rare("normalization.bf16", ring, "sm_90") and rare.is_rare("normalization.bf16", ring, "sm_100")
    assert not rare.is_rare("normalization.bf16", ring, "sm_80") and not rare.is_rare("normalization.bf16", ring, None)
    # at=(90,): the mma.sync attention forward is Hopper's fallback only (Blackwell has no sm_90a wgmma units)
    fwd = "pydnn::attn::fwd<pydnn::half_t, 64, 64, 64, false>"
    assert rare.is_rare("attention.f16", fwd, "sm_90") and rare.is_rare("attention.f16", fwd, "sm_90a")
    for arch in ("sm_80", "sm_89", "sm_100", None):
        assert not rare.is_rare("attention.f16", fwd, arch), arch
    assert rare.is_rare("attention.dropx.f16", "pydnn::attn::fwd<pydnn::half_t, 96, 32, 64, true>", "sm_80")


def test_group_key_gathers_one_ops_variants():
    k = rare.group_key
    relu = [k("pydnn::map_contig<double, double, pydnn::act::Relu<false>, 2, 128, 4, 1>"),
            k("pydnn::map_contig<double, double, pydnn::act::Relu<false>, 1>"),
            k("pydnn::map_strided<double, double, pydnn::act::Relu<false>>")]
    assert relu[0] == relu[1] == relu[2]
    assert relu[0] != k("pydnn::map_strided<double, double, pydnn::act::Elu<false>>")


def test_install_builds_the_install_part_and_all_builds_everything(monkeypatch, tmp_path):
    monkeypatch.setenv("PYDNN_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(build.BUILD_ALL_ENV, raising=False)
    done = []
    monkeypatch.setenv("PYDNN_PTXAS", "0")   # one compile_unit call per unit and arch (no shared NVVM pass)
    monkeypatch.setattr(build, "compile_unit", lambda u, a, nv=None: done.append((u.name, a)))
    build.build_all(archs=["sm_80", "sm_90"], progress=False)
    want = {(u.name, a) for a in ("sm_80", "sm_90") for u in manifest.install_units(a)
            if manifest.unit_arch(u, a) is not None}
    assert set(done) == want and len(done) == len(want)
    assert not any(".rare" in n for n, _ in done)
    # the costliest units go first (the parallel build ends on small ones)
    costs = [build._cost(manifest.unit_by_name(a)[n], a) for n, a in done]
    assert costs[0] == max(costs)
    done.clear()
    monkeypatch.setenv(build.BUILD_ALL_ENV, "1")
    build.build_all(archs=["sm_90"], progress=False)
    assert {n for n, _ in done} == {u.name for u in manifest.all_units("sm_90")}
    done.clear()
    build.build_all(archs=["sm_90"], progress=False, prefixes=("tensor_ops.i32",))
    assert sorted(n for n, _ in done) == ["tensor_ops.i32.rare0"]


def test_first_use_unit_compiles_once_with_a_log_line(tmp_path, monkeypatch):
    monkeypatch.setenv("PYDNN_CACHE_DIR", str(tmp_path))
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logger = logging.getLogger("pydnn")
    handler = Keep(level=logging.WARNING)
    logger.addHandler(handler)
    try:
        name = loader.resolve("sm_90", "tensor_ops.i32", "pydnn::map_strided<int, int, pydnn::tensor::Set>")
        assert name == "tensor_ops.i32.rare0"
        u = loader._unit(name, "sm_90")
        cubin, lowered = loader.load_unit("sm_90", u)
        assert cubin[:4] == b"\x7fELF" and set(lowered) == set(u.exprs)
        assert records == ["pydnn: compiling kernel unit tensor_ops.i32.rare0 for sm_90 (first use: not built at install)"]
        loader.load_unit("sm_90", u)
        assert len(records) == 1, records
        nv = build.nvrtc.version()
        assert cache.read_entry(cache.entry_path(u, "sm_90", cache.unit_key(u, "sm_90", nv))) is not None
    finally:
        logger.removeHandler(handler)


def test_lineinfo_is_opt_in(monkeypatch):
    monkeypatch.delenv(manifest.LINEINFO_ENV, raising=False)
    assert "-lineinfo" not in manifest.common_options()
    u = manifest.install_units("sm_90")[0]
    k = cache.unit_key(u, "sm_90", (13, 0))
    monkeypatch.setenv(manifest.LINEINFO_ENV, "1")
    assert "-lineinfo" in manifest.common_options()
    assert cache.unit_key(u, "sm_90", (13, 0)) != k
    monkeypatch.delenv(manifest.LINEINFO_ENV)
    monkeypatch.delenv(manifest.FAST_COMPILE_ENV, raising=False)
    assert manifest.FAST_COMPILE_OPTION not in manifest.common_options()   # off by default (different SASS)
    monkeypatch.setenv(manifest.FAST_COMPILE_ENV, "1")
    assert manifest.common_options()[-1] == manifest.FAST_COMPILE_OPTION
    assert cache.unit_key(u, "sm_90", (13, 0)) != k


def test_build_only_prefixes_install_part(monkeypatch, tmp_path):
    """`python -m pydnn build --only P` compiles the install's units named P... (a GPU check then compiles the
    first-use ones as a user would); with --all, or build_all(prefixes=...) as tools/gpu_quick.sh calls it, every
    such unit, first-use ones too."""
    from pydnn import __main__ as cli
    from pydnn._build import build

    done = []
    monkeypatch.setenv("PYDNN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("PYDNN_PTXAS", "0")   # one compile_unit call per unit and arch (no shared NVVM pass)
    monkeypatch.setattr(build, "compile_unit", lambda u, a, nv=None: done.append((u.name, a)))
    monkeypatch.setattr(build.nvrtc, "version", lambda: (13, 0))
    cli.main(["build", "--arch", "sm_90", "--only", "convolution.bf16,rnn_persist", "--no-lib"])
    assert sorted(done) == [("convolution.bf16", "sm_90")]
    done.clear()
    cli.main(["build", "--arch", "sm_90", "--only", "convolution.bf16,rnn_persist", "--all", "--no-lib"])
    names = {n for n, _ in done}
    assert "convolution.bf16" in names and any(n.startswith("convolution.bf16.rare") for n in names)
    assert any(n.startswith("rnn_persist.bf16.rare") for n in names)   # (every one first use: no install part)
    assert any(n.startswith("rnn_persist_r.bf16.rare") for n in names)
    done.clear()
    build.build_all(archs=["sm_90"], prefixes=("rnn_persist.f16",), progress=False)
    assert done and all(n.startswith("rnn_persist.f16.rare") for n, _ in done)


def test_split_parts_cost_their_family_units_seconds_an_instantiation():
    """A split-off part that unit_costs.py has not measured (<unit>.a90 / .a80) costs its family unit's measured
    seconds an instantiation (build._cost: the order of the build and tools/build_stats.py --model's prediction),
    not the SASS-size model's guess."""
    from pydnn._build.unit_costs import COSTS

    units = manifest.unit_by_name("sm_90")
    part = units["normalization.f16.a90"]
    assert "normalization.f16.a90" not in COSTS["sm_90"] and part.home == "normalization.f16"
    sec, n = COSTS["sm_90"]["normalization.f16"]
    assert build._cost(part, "sm_90") == pytest.approx(sec * len(part.exprs) / n)


def test_install_build_model_within_budget():
    """Issue 21: a 2-core CPU-only install of the default archs in <= 300 s. tools/build_stats.py --model
    replays this tree's install on the build's cost model, calibrated on the host's 2-core measurement (346 s
    for 479.0 model s of that tree, session 31). Units added to the install push this up: move rare ones to first use
    (rare.py) or fold types (tools/fold16.py) to stay within it."""
    import os
    import sys

    from pydnn._build import ptxas

    if ptxas.find() is None:
        pytest.skip("no ptxas of NVRTC's release: the build has no shared NVVM pass here")
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))
    import build_stats

    got = build_stats.model()
    assert got["predicted"] <= 300, got


def test_together_rule_compiles_its_data_types_units_at_once(tmp_path, monkeypatch):
    """A `together` rule (grouped convolutions): the first use of one of its units compiles every first-use unit
    of that rule and data type for the arch, in parallel, one log line each; the other data type's stay; once
    cached, nothing compiles again."""
    monkeypatch.setenv("PYDNN_CACHE_DIR", str(tmp_path))
    done, records = [], []

    def fake_compile(u, arch, nv=None):
        done.append((u.name, arch))
        entry = (b"\x7fELF" + u.name.encode(), {e: e for e in u.exprs})
        target = manifest.unit_arch(u, arch)
        cache.write_entry(cache.entry_path(u, target, cache.unit_key(u, target, nv)), *entry)
        return entry

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    monkeypatch.setattr(build, "compile_unit", fake_compile)
    logger = logging.getLogger("pydnn")
    handler = Keep(level=logging.WARNING)
    logger.addHandler(handler)
    try:
        name = loader.resolve("sm_90", "convolution.grouped.bf16", "pydnn::conv::filter_group_pack<pydnn::bf16_t>")
        assert name.startswith("convolution.grouped.bf16.rare")
        u = loader._unit(name, "sm_90")
        cubin, lowered = loader.load_unit("sm_90", u)
        assert cubin == b"\x7fELF" + name.encode() and set(lowered) == set(u.exprs)
        want = {x.name for x in manifest.all_units("sm_90") if not x.install
                and x.home in ("convolution.grouped.bf16", "convolution.gdirect1.bf16", "convolution.gdirect2.bf16",
                               "convolution.gwgrad.bf16")}
        assert {n for n, _ in done} == want and len(done) == len(want) >= 9
        assert records[0] == f"pydnn: compiling kernel unit {name} for sm_90 (first use: not built at install)"
        assert len(records) == len(want) and all("first use" in r for r in records)
        done.clear()
        for n in want:
            loader.load_unit("sm_90", loader._unit(n, "sm_90"))
        assert done == []
        # a unit of no together rule compiles alone
        one = loader._unit(loader.resolve("sm_90", "tensor_ops.i32", "pydnn::map_strided<int, int, pydnn::tensor::Set>"),
                           "sm_90")
        loader.load_unit("sm_90", one)
        assert done == [(one.name, "sm_90")]
    finally:
        logger.removeHandler(handler)
