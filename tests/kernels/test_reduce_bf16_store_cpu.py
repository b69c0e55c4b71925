"""ptx/reduce.cu's bf16_of(double): double -> bfloat16 by round-to-odd into float, then round-to-nearest-even, in
the same instructions on every arch (so that reduce's PTX is the same for sm_80 and sm_90 and its sm_90 code comes
from the sm_80 PTX through ptxas: pydnn/_build/ptxas.py). Emulated here in numpy step by step as the kernel does it,
against an exact rounding of each double to the bfloat16 grid (nearest, ties to even; beyond the largest finite
bfloat16 by half a step or more: infinity); and the reduce units' sm_80 PTX carries no arch sign any more."""
import numpy as np
import pytest


def _bf16_of(v):
    """The kernel's steps: f = rn(v) as float32; if inexact: one ulp toward zero when |f| > |v|, then the last bit
    set; then float32 -> bfloat16 round to nearest even (cvt.rn.bf16.f32). Returns the bfloat16 bits."""
    with np.errstate(over="ignore", invalid="ignore"):
        f = v.astype(np.float32)
        b = f.view(np.uint32).copy()
        inexact = (v == v) & (f.astype(np.float64) != v)
        away = inexact & (np.abs(f.astype(np.float64)) > np.abs(v))
        b[away] -= np.uint32(1)
        b[inexact] |= np.uint32(1)
    # float32 -> bfloat16, nearest even (finite and inf: add the rounding bias to the upper half; NaN stays NaN)
    nan = (b & 0x7FFFFFFF) > 0x7F800000
    r = ((b.astype(np.uint64) + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)
    r[nan] = ((b[nan] >> 16) | 0x40).astype(np.uint16)
    return r


def _exact(v):
    """v (finite doubles) rounded to the bfloat16 grid, nearest, ties to even; as bfloat16 bits."""
    out = np.empty(v.shape, np.uint16)
    for i, x in enumerate(v.tolist()):
        if x == 0.0:
            out[i] = 0x8000 if np.signbit(x) else 0
            continue
        e = max(int(np.floor(np.log2(abs(x)))), -126)
        if 2.0 ** (e + 1) <= abs(x):  # (log2 rounding at binade edges)
            e += 1
        if e > -126 and 2.0 ** e > abs(x):
            e -= 1
        q = 2.0 ** (max(e, -126) - 7)
        y = float(np.rint(x / q)) * q   # (x / q exact: a power-of-two scaling of a normal double)
        if abs(y) >= 2.0 ** 128:
            y = np.copysign(np.inf, x)
        out[i] = (np.array([y], np.float32).view(np.uint32)[0] >> 16)
    return out


def test_round_to_odd_then_nearest_is_the_exact_rounding():
    rng = np.random.default_rng(7)
    parts = [
        rng.standard_normal(20000) * 10.0 ** rng.integers(-45, 39, 20000),
        # ties and near-ties of the bfloat16 grid, and of the float grid below it
        (np.float64(rng.integers(1, 255, 4000)) + 0.5) * 2.0 ** rng.integers(-140, 120, 4000),
        (np.float64(rng.integers(1, 255, 4000)) + 0.5 + 2.0 ** -30) * 2.0 ** rng.integers(-140, 120, 4000),
        (np.float64(rng.integers(1, 255, 4000)) + 0.5 - 2.0 ** -30) * 2.0 ** rng.integers(-140, 120, 4000),
        np.array([3.3895313892515355e38, 3.3961e38, 3.396e38, 3.4028234663852886e38, 3.41e38, 1e300, 1e-300,
                  2.0 ** -126, 2.0 ** -133, 2.0 ** -134, 1.5 * 2.0 ** -134, 2.0 ** -149, 2.0 ** -150, 1.0, -0.0, 0.0]),
    ]
    v = np.concatenate(parts)
    v = np.concatenate([v, -v])
    got, want = _bf16_of(v), _exact(v)
    bad = np.nonzero(got != want)[0]
    assert bad.size == 0, [(v[i], hex(got[i]), hex(want[i])) for i in bad[:10]]


def test_nan_stays_nan():
    r = _bf16_of(np.array([np.nan, -np.nan]))
    assert all((x & 0x7FFF) > 0x7F80 for x in r.tolist())


@pytest.mark.parametrize("name", ["reduce.f32", "reduce.h16"])
def test_reduce_ptx_has_no_arch_sign(name, tmp_path, monkeypatch):
    """NVRTC's compute_80 PTX of the reduce units has no PTX_ARCH_SIGNS (it had cvt.rz.f32.f64 from types.cuh's
    sm_80 double -> bfloat16 form), so compile_shared assembles their sm_90 code with ptxas."""
    from pydnn._build import build, cache, manifest, ptxas

    monkeypatch.setenv("PYDNN_CACHE_DIR", str(tmp_path))
    u = manifest.unit_by_name("sm_80")[name]
    out = []
    build.compile_unit(u, "sm_80", ptx_out=out)
    assert out and not ptxas.arch_dependent_ptx(out[0])
    assert ptxas.arch_neutral(u)
