"""The shared NVVM pass (pydnn/_build/ptxas.py): which units share it, and that a unit built that way holds the
same kernels as NVRTC's own compile for sm_90 (every .text section byte for byte), on CPU."""
import pytest

from pydnn._build import build, cache, manifest, ptxas
from pydnn._cuda import nvrtc


def _nvrtc_or_skip():
    try:
        return nvrtc.version()
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"NVRTC unavailable: {e}")


def _todo(*names):
    out = []
    for a in ("sm_80", "sm_90"):
        units = manifest.unit_by_name(a)
        out += [(units[n], a) for n in names if n in units and manifest.unit_arch(units[n], a)]
    return out


@pytest.fixture
def fake_ptxas(monkeypatch):
    """A found ptxas, so that the pairing rules are tested without one."""
    monkeypatch.setattr(ptxas, "find", lambda: "/bin/ptxas")
    monkeypatch.delenv(ptxas.ENV, raising=False)


def test_pairs_only_arch_neutral_units_with_the_same_instantiations(fake_ptxas):
    _nvrtc_or_skip()
    names = ("activation.h16", "softmax.f32", "matmul.f16.nn", "normalization.f16", "normalization.f16.a80",
             "normalization.f16.a90", "convolution.wgmma.f16", "rnn.h16", "attention.d256.f16", "convolution.narrow.bf16")
    jobs = {(u.name, a, b) for u, a, b in build._pair_jobs(_todo(*names))}
    # units without arch-dependent code (matmul.cu's and convolution.cu's __CUDA_ARCH__ are the sm_90a guard and
    # cluster-only kernel templates), and normalization.f16's common part (PTX verified, ptx_verified.py): one job
    for n in ("activation.h16", "softmax.f32", "rnn.h16", "matmul.f16.nn", "convolution.narrow.bf16",
              "normalization.f16"):
        assert (n, "sm_80", "sm_90") in jobs, n
        assert not any(j[0] == n and j[1] == "sm_90" for j in jobs), n
    # common/attn_mma.cuh's red_add2 is a vector red from sm_90 on (attention.d256's backward: its PTX differs);
    # each arch's own rest of normalization; the wgmma unit is sm_90a only: all compile per arch
    assert ("attention.d256.f16", "sm_80", None) in jobs and ("attention.d256.f16", "sm_90", None) in jobs
    assert ("normalization.f16.a80", "sm_80", None) in jobs and ("normalization.f16.a90", "sm_90", None) in jobs
    assert ("convolution.wgmma.f16", "sm_90", None) in jobs
    # every (unit, arch) item is built once
    items = [(n, a) for n, a, _ in jobs] + [(n, b) for n, _, b in jobs if b]
    assert sorted(items) == sorted((u.name, a) for u, a in _todo(*names))


def test_no_pairs_when_off_or_under_other_options(fake_ptxas, monkeypatch):
    _nvrtc_or_skip()
    todo = _todo("activation.h16")
    monkeypatch.setenv(ptxas.ENV, "0")
    assert all(b is None for _, _, b in build._pair_jobs(todo))
    monkeypatch.delenv(ptxas.ENV)
    monkeypatch.setenv(manifest.LINEINFO_ENV, "1")
    assert all(b is None for _, _, b in build._pair_jobs(todo))
    monkeypatch.delenv(manifest.LINEINFO_ENV)
    monkeypatch.setenv(manifest.FAST_COMPILE_ENV, "1")
    assert all(b is None for _, _, b in build._pair_jobs(todo))
    monkeypatch.delenv(manifest.FAST_COMPILE_ENV)
    assert any(b for _, _, b in build._pair_jobs(todo))


def test_no_ptxas_of_the_release_means_no_pairs(monkeypatch):
    _nvrtc_or_skip()
    monkeypatch.delenv(ptxas.ENV, raising=False)
    monkeypatch.setattr(ptxas, "_found", None)
    monkeypatch.setattr(ptxas, "candidates", lambda: ["/bin/true"])
    monkeypatch.setattr(ptxas, "_release", lambda p: (1, 0))   # another release than NVRTC's
    assert ptxas.find() is None
    assert all(b is None for _, _, b in build._pair_jobs(_todo("activation.h16")))
    monkeypatch.setattr(ptxas, "_found", None)


def test_types_cuh_arch_branch_shows_in_the_ptx(tmp_path, monkeypatch):
    """types.cuh's double -> bfloat16 store differs by arch; reduce.f32 instantiates it (its expressions do not
    say so): the sm_80 PTX shows it, and compile_shared then compiles sm_90 with NVRTC."""
    _nvrtc_or_skip()
    u = manifest.unit_by_name("sm_90")["activation.h16"]
    assert ptxas.arch_neutral(u)
    assert ptxas.arch_dependent_ptx(b"  cvt.rz.f32.f64 \t%f1, %fd1;") and not ptxas.arch_dependent_ptx(b"cvt.rn.f32.f64")
    monkeypatch.setenv("PYDNN_CACHE_DIR", str(tmp_path))
    calls = []
    real = build.compile_unit

    def spy(unit, arch, nv=None, ptx_out=None):
        calls.append(arch)
        if ptx_out is not None:
            ptx_out.append(b"// a double -> bf16 store\n cvt.rz.f32.f64 %f1, %fd1;")
            return b"\x7fELF", {}
        return b"\x7fELF", {}
    monkeypatch.setattr(build, "compile_unit", spy)
    monkeypatch.setattr(ptxas, "assemble", lambda *a, **k: pytest.fail("assembled an arch-dependent PTX"))
    build.compile_shared(u, "sm_80", "sm_90")
    assert calls == ["sm_80", "sm_90"]
    monkeypatch.setattr(build, "compile_unit", real)
    assert not ptxas.arch_neutral(manifest.unit_by_name("sm_90")["attention.d256.f16"])   # attn_mma.cuh red_add2
    assert not ptxas.arch_neutral(manifest.unit_by_name("sm_90")["matmul.f32big"])   # NOT_SHARED: NVVM's order


def test_arch_text_rules():
    guard = ("#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)\n"
             "  static_assert(sizeof(T) == 0, \"needs sm_90a\");\n#endif\n")
    cluster = ("#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900\ntemplate <class T, int BN>\n"
               "__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(384, 1) k(const P q) {\n"
               "  body<T, BN, 2>(q);\n}\n#endif\n")
    assert not ptxas._arch_text("int x;\n" + guard + cluster)
    # an sm_90 path inside a function, or a kernel with an #else stub, changes the PTX: not harmless
    assert ptxas._arch_text("void f() {\n#if __CUDA_ARCH__ >= 900\n  asm(\"x;\");\n#endif\n}\n")
    assert ptxas._arch_text(cluster.replace("#endif", "#else\ntemplate <class T, int BN>\n"
                                            "__global__ void k(const P) { __trap(); }\n#endif"))


def test_shared_build_writes_nvrtc_identical_sass(tmp_path, monkeypatch):
    """Needs a ptxas of NVRTC's release (the nvidia-cuda-nvcc wheel, a CUDA toolkit): the build's shared path
    stores sm_90 kernels whose code is NVRTC's own for sm_90, with the same lowered names."""
    _nvrtc_or_skip()
    monkeypatch.setattr(ptxas, "_found", None)
    if ptxas.find() is None:
        pytest.skip("no ptxas of NVRTC's release: " + "; ".join(ptxas.describe()))
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
    from build_stats import sass

    monkeypatch.setenv("PYDNN_CACHE_DIR", str(tmp_path))
    names = ("conv_bias.f16", "rnn.h16")
    todo = _todo(*names)
    assert all(b == "sm_90" for _, _, b in build._pair_jobs(todo))
    compiled, skipped = build.build_all(archs=["sm_80", "sm_90"], progress=False, prefixes=names, install_only=True)
    assert (compiled, skipped) == (4, 0)
    nv = nvrtc.version()
    for name in names:
        u = manifest.unit_by_name("sm_90")[name]
        cubin, lowered = cache.read_entry(cache.entry_path(u, "sm_90", cache.unit_key(u, "sm_90", nv)))
        text, _ = cache.unit_inputs(u)
        direct, direct_lowered, _ = nvrtc.compile_cubin(text, u.source, u.exprs, "sm_90", manifest.common_options(),
                                                        [str(cache.ptx_dir())], unit=name)
        assert lowered == direct_lowered
        assert sass(cubin) == sass(direct) and len(sass(cubin)) == len(set(lowered.values())), name


def test_a_ptx_verification_holds_for_the_unit_as_it_was(monkeypatch):
    """pydnn/_build/ptx_verified.py: a unit whose source has sm_90 paths shares the NVVM pass only while its digest
    (source, headers, instantiations) is the verified one; normalization.f16's install parts then split into the
    part sm_80 and sm_90 share and each arch's own rest."""
    _nvrtc_or_skip()
    from dataclasses import replace

    from pydnn._build import ptx_verified, rare
    fam = next(u for u in manifest.family_units() if u.name == "normalization.f16")
    k80 = [e for e in fam.exprs if not rare.is_rare(fam.name, e, "sm_80")]
    k90 = [e for e in fam.exprs if not rare.is_rare(fam.name, e, "sm_90")]
    common = replace(fam, exprs=tuple(e for e in k80 if e in k90))
    assert ptxas._arch_text(cache.unit_inputs(common)[0])   # normalization.cu: sm_90 paths (cluster helpers)
    monkeypatch.setattr(ptx_verified, "VERIFIED", {})
    assert not ptxas.arch_neutral(common)
    assert manifest.unit_by_name("sm_80")["normalization.f16"].exprs != manifest.unit_by_name("sm_90")[
        "normalization.f16"].exprs
    monkeypatch.setattr(ptx_verified, "VERIFIED", {"normalization.f16": ptxas.digest(common)})
    assert ptxas.arch_neutral(common)
    assert not ptxas.arch_neutral(replace(common, exprs=common.exprs[:-1]))   # other instantiations: not verified
    t80, t90 = manifest.unit_by_name("sm_80"), manifest.unit_by_name("sm_90")
    assert t80["normalization.f16"].exprs == t90["normalization.f16"].exprs == common.exprs
    assert t80["normalization.f16.a80"].install and t90["normalization.f16.a90"].install
    assert set(t90["normalization.f16"].exprs) | set(t90["normalization.f16.a90"].exprs) == set(k90)


def test_verified_entries_name_units_of_both_archs():
    """(A stale digest only costs build time; a renamed unit leaves an entry that matches nothing: rerun
    tools/build_stats.py --verify-ptx.)"""
    from pydnn._build.ptx_verified import VERIFIED
    names = set(manifest.unit_by_name("sm_80")) & set(manifest.unit_by_name("sm_90"))
    assert set(VERIFIED) <= names
