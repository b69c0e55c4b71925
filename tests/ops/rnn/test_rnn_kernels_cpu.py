"""Every ptx/rnn.cu instantiation compiles with NVRTC for sm_80 and sm_90 (no GPU needed), and the unit list
is what the engine launches."""
import pytest

from pydnn.ops.rnn import kernels as K


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_rnn_units_compile(arch, tmp_path, monkeypatch):
    build = pytest.importorskip("pydnn._build.build")
    try:
        build.nvrtc.version()
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"NVRTC unavailable: {e}")
    monkeypatch.setenv("PYDNN_CACHE_DIR", str(tmp_path))
    units = [u for u in K.kernel_units() if u.name.startswith("rnn.")]  # rnn_persist.*: test_rnn_persist_cpu.py
    assert {u.name for u in units} == {"rnn.f32", "rnn.h16", "rnn.f64"}   # half and bfloat16 share rnn.h16
    assert K.unit_name("f16") == K.unit_name("bf16") == "rnn.h16"
    assert K.expr("fwd_cell", "f16", 2) == K.expr("fwd_cell", "bf16", 2) == "pydnn::rnn::fwd_cell<pydnn::h16_t, 2>"
    for u in units:
        cubin, lowered = build.compile_unit(u, arch)
        assert cubin[:4] == b"\x7fELF"
        assert set(lowered) == set(u.exprs)
        for cell in range(4):
            assert K.expr("fwd_cell", u.name.split(".")[1], cell) in lowered
            assert K.expr("bwd_cell", u.name.split(".")[1], cell) in lowered
        for name in K.PLAIN:
            assert K.expr(name, u.name.split(".")[1]) in lowered


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_gemm_f64_unit_compiles(arch, tmp_path, monkeypatch):
    """ptx/gemm_f64.cu (the double path's GEMMs): every transpose instantiation compiles."""
    build = pytest.importorskip("pydnn._build.build")
    try:
        build.nvrtc.version()
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"NVRTC unavailable: {e}")
    from pydnn.ops.rnn import gemm_f64
    monkeypatch.setenv("PYDNN_CACHE_DIR", str(tmp_path))
    (u,) = gemm_f64.kernel_units()
    cubin, lowered = build.compile_unit(u, arch)
    assert cubin[:4] == b"\x7fELF"
    assert set(lowered) == {gemm_f64.expr(a, b) for a in (0, 1) for b in (0, 1)}


def test_units_are_in_the_manifest():
    from pydnn._build import manifest
    names = {u.name for u in manifest.family_units()}  # (as declared: before the first-use split)
    assert {"rnn.f32", "rnn.h16", "rnn.f64", "gemm.f64", "rnn_persist.f32", "rnn_persist.f16",
            "rnn_persist.bf16"} <= names
