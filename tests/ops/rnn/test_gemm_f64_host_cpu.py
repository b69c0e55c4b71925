"""ptx/gemm_f64.cu (the RNN double path's GEMM) compiled for the host with g++ (host_shim/gemm_f64_host.cpp: a
block is 256 threads meeting at a barrier) and run through pydnn/ops/rnn/gemm_f64.py's Plan on numpy memory:
every transpose, partial tiles, K not a multiple of 16, leading dimensions past the widths, batch strides,
alpha / beta / bias, and nothing written outside C's [m, n] blocks."""
import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
CXX = shutil.which("g++") or shutil.which("c++")


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    if CXX is None:
        pytest.skip("no C++ compiler")
    d = tmp_path_factory.mktemp("gemm_f64_host")
    ptx = HERE.parents[2] / "ptx"
    (d / "common").mkdir()
    for f in ("gemm_f64.cu", "gemm_f64_params.h"):
        shutil.copy(ptx / f, d / f)
    shutil.copy(HERE / "host_shim" / "common" / "types.cuh", d / "common" / "types.cuh")
    shutil.copy(HERE / "host_shim" / "gemm_f64_host.cpp", d / "gemm_f64_host.cpp")
    so = d / "gemm_f64_host.so"
    r = subprocess.run([CXX, "-O1", "-std=c++20", "-pthread", "-shared", "-fPIC", "-Wall", "-Wno-unused-function",
                        "-Wno-unknown-pragmas", "-I", str(d), str(d / "gemm_f64_host.cpp"), "-o", str(so)],
                       capture_output=True, text=True)
    if r.returncode and "barrier" in r.stderr:
        pytest.skip("the C++ compiler has no <barrier> (C++20)")
    assert r.returncode == 0, r.stderr
    lib = ctypes.CDLL(str(so))
    lib.gemm_f64_host.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint,
                                  ctypes.c_uint]
    return lib


CASES = [(70, 130, 37, 1, 0.0, False), (5, 3, 200, 3, 0.5, True), (129, 64, 16, 2, 0.0, True),
         (64, 64, 0, 1, 0.0, True), (1, 65, 17, 1, -1.0, False)]


@pytest.mark.parametrize("ta,tb", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_gemm_f64_kernel_on_the_host(ta, tb, lib):
    from pydnn.ops.rnn import gemm_f64
    rng = np.random.default_rng(7)
    for m, n, k, batch, beta, bias in CASES:
        ra, ca = (k, m) if ta else (m, k)
        rb, cb = (n, k) if tb else (k, n)
        lda, ldb, ldc = max(ca, 1) + 3, max(cb, 1) + 1, n + 2
        sa, sb, sc = ra * lda + 5, rb * ldb + 2, m * ldc + 7
        A = rng.uniform(-1, 1, max(batch * sa, 1))
        Bm = rng.uniform(-1, 1, max(batch * sb, 1))
        C0 = rng.uniform(-1, 1, batch * sc)
        C = C0.copy() if beta else np.full(batch * sc, np.nan)
        bv = rng.uniform(-1, 1, n)
        pl = gemm_f64.Plan(m, n, k, bool(ta), bool(tb), lda, ldb, ldc, batch, sa, sb, sc)
        prm = pl.params(A.ctypes.data, Bm.ctypes.data, C.ctypes.data, 1.5, beta, bv.ctypes.data if bias else 0)
        assert lib.gemm_f64_host(ta, tb, ctypes.byref(prm), *pl.grid) == 0
        for z in range(batch):
            a = A[z * sa:z * sa + ra * lda].reshape(ra, lda)[:, :ca] if k else np.zeros((ra, ca))
            b = Bm[z * sb:z * sb + rb * ldb].reshape(rb, ldb)[:, :cb] if k else np.zeros((rb, cb))
            ref = 1.5 * ((a.T if ta else a) @ (b.T if tb else b))
            if beta:
                ref = ref + beta * C0[z * sc:z * sc + m * ldc].reshape(m, ldc)[:, :n]
            if bias:
                ref = ref + bv
            c = C[z * sc:z * sc + m * ldc].reshape(m, ldc)
            np.testing.assert_allclose(c[:, :n], ref, rtol=1e-13, atol=1e-13)
            outside = c[:, n:]
            if beta:
                assert (outside == C0[z * sc:z * sc + m * ldc].reshape(m, ldc)[:, n:]).all()
            else:
                assert np.isnan(outside).all()
        if not beta:
            gaps = [C[z * sc + m * ldc:(z + 1) * sc] for z in range(batch)]
            assert all(np.isnan(g).all() for g in gaps)


def test_plan_validation():
    from pydnn.ops.rnn import gemm_f64
    from pydnn.status import PydnnError
    for kw, word in ((dict(m=0), "m"), (dict(lda=3), "lda"), (dict(ldc=2), "ldc"),
                     (dict(batch=2, stride_c=5), "stride_c"), (dict(stride_a=-1), "stride_a")):
        args = dict(m=4, n=4, k=4)
        args.update(kw)
        with pytest.raises(PydnnError) as e:
            gemm_f64.Plan(**args)
        assert str(e.value).split(": ", 1)[1].startswith(word)
    with pytest.raises(PydnnError):
        gemm_f64.Plan(4, 4, 4).params(8, 12, 16)  # b not 8-byte aligned
