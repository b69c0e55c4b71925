"""The cubin cache and the build, on the CPU: every kernel compiles for sm_90; keys; corruption; reuse."""
import os

import pytest

from pydnn._build import build, cache, loader, manifest


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PYDNN_CACHE_DIR", str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_every_kernel_unit_compiles(arch):
    """NVRTC compiles every instantiation in the manifest, the first-use ones too (pydnn/_build/rare.py),
    in the arch's split (uses the shared cache: after the install only the first-use units compile)."""
    units = manifest.all_units(arch)
    assert units, "the manifest is empty"
    build.build_all(archs=[arch], progress=False, everything=True)
    nv = build.nvrtc.version()
    # Arch-restricted units (KernelUnit.archs: matmul.wgmma.* sm_90a, softmax.split.* sm_90 for its clusters)
    # exist on their base arch only, compiled for the target they name; on any other arch they are absent.
    specific = {u.name: manifest.unit_arch(u, arch) for u in units if u.archs}
    if arch == "sm_90":
        assert specific and all(t in ("sm_90", "sm_90a") for t in specific.values()), specific
        assert any(t == "sm_90a" for t in specific.values()), specific
    else:
        assert all(t is None for t in specific.values()), specific
    for u in units:
        target = manifest.unit_arch(u, arch)
        if target is None:
            continue
        entry = cache.read_entry(cache.entry_path(u, target, cache.unit_key(u, target, nv)))
        assert entry is not None, u.name
        cubin, lowered = entry
        assert cubin[:4] == b"\x7fELF"
        assert set(lowered) == set(u.exprs)


def _small_unit():
    return [u for u in manifest.all_units() if u.name == "activation.f32"][:1]


def test_rebuild_compiles_nothing_and_corruption_is_rebuilt(tmp_cache):
    units = _small_unit()
    assert build.build_all(archs=["sm_90"], progress=False, units=units) == (1, 0)
    assert build.build_all(archs=["sm_90"], progress=False, units=units) == (0, 1)
    path = next((tmp_cache / "cubin").glob("*.cubin"))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # truncated entry
    assert cache.read_entry(path) is None
    assert build.build_all(archs=["sm_90"], progress=False, units=units) == (1, 0)
    flipped = bytearray(path.read_bytes())
    flipped[-100] ^= 0xFF  # one corrupt byte in the cubin
    path.write_bytes(bytes(flipped))
    assert cache.read_entry(path) is None
    assert build.build_all(archs=["sm_90"], progress=False, units=units) == (1, 0)
    assert cache.read_entry(path) is not None
    assert not list((tmp_cache / "cubin").glob(".tmp-*")), "temporary files left behind"


def test_key_depends_on_arch_nvrtc_options_and_sources(monkeypatch):
    u = _small_unit()[0]
    k = cache.unit_key(u, "sm_90", (13, 0))
    assert k != cache.unit_key(u, "sm_80", (13, 0))
    assert k != cache.unit_key(u, "sm_90", (13, 1))
    other = manifest.KernelUnit(u.name, u.source, u.exprs, ("-DPYDNN_EXTRA=1",))
    assert k != cache.unit_key(other, "sm_90", (13, 0))
    fewer = manifest.KernelUnit(u.name, u.source, u.exprs[:-1])
    assert k != cache.unit_key(fewer, "sm_90", (13, 0))
    assert k != cache.unit_key(u, "sm_90a", (13, 0))  # an arch-specific target is keyed as such
    # a change in an included header changes the key
    text, headers = cache.unit_inputs(u)
    assert any(p.endswith("elementwise.cuh") for p, _ in headers)
    monkeypatch.setitem(cache._source_memo, u.source, (text, [(p, t + "//x") for p, t in headers]))
    assert k != cache.unit_key(u, "sm_90", (13, 0))


def test_missing_arch_compiles_once_with_a_log_line(tmp_cache):
    import logging

    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logger = logging.getLogger("pydnn")
    handler = Keep(level=logging.WARNING)
    logger.addHandler(handler)
    try:
        u = _small_unit()[0]
        cubin, lowered = loader.load_unit("sm_80", u)
        assert cubin[:4] == b"\x7fELF"
        assert records == [f"pydnn: compiling kernel unit activation.f32 for sm_80 (not in the cache at {tmp_cache})"]
        loader.load_unit("sm_80", u)
        assert len(records) == 1, records
    finally:
        logger.removeHandler(handler)


def test_target_archs(monkeypatch):
    monkeypatch.setenv("PYDNN_CUDA_ARCHS", "8.0, sm_90,compute_86")
    assert build.target_archs() == ["sm_80", "sm_86", "sm_90"]
    assert build.target_archs(["9.0"]) == ["sm_90"]
    monkeypatch.delenv("PYDNN_CUDA_ARCHS")
    from pydnn._cuda import driver

    if not driver.available():
        assert build.target_archs() == ["sm_80", "sm_90"]


def test_import_never_compiles(tmp_path):
    """A fresh interpreter importing pydnn with an empty cache compiles nothing and creates no cache."""
    import subprocess
    import sys

    env = dict(os.environ, PYDNN_CACHE_DIR=str(tmp_path / "c"))
    code = "import pydnn, sys; assert 'cuda.bindings.nvrtc' not in sys.modules, 'nvrtc imported'"
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert not (tmp_path / "c").exists()


def test_prune_removes_only_stale_entries(tmp_cache):
    units = _small_unit()
    build.build_all(archs=["sm_90"], progress=False, units=units)
    stale = tmp_cache / "cubin" / "activation.f32.sm_90.000000000000000000000000.cubin"
    stale.write_bytes(b"old")
    live = cache.entry_path(units[0], "sm_90", cache.unit_key(units[0], "sm_90", build.nvrtc.version()))
    assert cache.prune([live]) == 1
    assert live.exists() and not stale.exists()
