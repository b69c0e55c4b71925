"""CPU checks of the activation kernels' numerics that need no GPU: the fast normal CDF of 16-bit GELU."""
import math
import re
from pathlib import Path

import numpy as np

SRC = Path(__file__).resolve().parents[3] / "ptx" / "activation.cu"


def _phi_fast_coefficients():
    """Q's coefficients (highest degree first) and the two scale constants, read from phi_fast_parts's source
    (the polynomial and exponent that phi_fast and gelu_fast share)."""
    body = SRC.read_text().split("float phi_fast_parts(float x, float& t) {", 1)[1].split("\n}", 1)[0]
    consts = [float(c) for c in re.findall(r"([-+]?\d+\.\d+e[-+]\d+)f", body)]
    scale = float(re.search(r"fabsf\(x\), ([0-9.]+)f", body).group(1))
    half_log2e = float(re.search(r"x \* x, (-[0-9.]+)f", body).group(1))
    return consts, scale, half_log2e


def _phi_fast_parts_f32(x):
    """phi_fast_parts evaluated step by step in float32 (each fma rounded once), exact rcp and exp2:
    (x, t, e) as float64 arrays holding float32 values, Phi(-|x|) = t * e."""
    f = np.float32
    q_coefs, scale, half_log2e = _phi_fast_coefficients()
    x = x.astype(f)
    t = (1.0 / (np.abs(x).astype(np.float64) * float(f(scale)) + 1.0).astype(f).astype(np.float64)).astype(f)
    q = np.full_like(t, f(q_coefs[0]))
    for c in q_coefs[1:]:
        q = (q.astype(np.float64) * t + float(f(c))).astype(f)
    xx = (x.astype(np.float64) ** 2).astype(f)
    e = np.exp2((xx.astype(np.float64) * float(f(half_log2e)) + q).astype(f)).astype(f)
    return x.astype(np.float64), t.astype(np.float64), e.astype(np.float64)


def _phi_fast_f32(x):
    """phi_fast in float32: Phi(-|x|) = t * e, then 1 - that for x >= 0."""
    f = np.float32
    x, t, e = _phi_fast_parts_f32(x)
    h = (t * e).astype(f)
    return np.where(x < 0, h, (1.0 - h.astype(np.float64)).astype(f)).astype(np.float64), x


def _gelu_fast_f32(x):
    """gelu_fast in float32: max(x, 0) - min(|x|, 1e30) t * e, the product and the fma each rounded once."""
    f = np.float32
    x, t, e = _phi_fast_parts_f32(x)
    u = (np.minimum(np.abs(x), float(f(1e30))) * t).astype(f).astype(np.float64)
    return (np.maximum(x, 0.0) - u * e).astype(f).astype(np.float64), x


def test_phi_fast_error_is_far_below_a_16_bit_ulp():
    """The documented bounds: <= 4.6e-7 absolute everywhere, <= 8e-6 relative in Phi (both tails, |x| < 13).
    A half ulp is 2.4e-4 relative for fp16 and 2.0e-3 for bf16."""
    q_coefs, _, _ = _phi_fast_coefficients()
    assert len(q_coefs) == 8  # degree 7
    phi, x = _phi_fast_f32(np.linspace(-13.0, 13.0, 400001))
    exact = np.array([0.5 * math.erfc(-v / math.sqrt(2.0)) for v in x])
    assert np.abs(phi - exact).max() <= 5e-7
    rel = np.abs(phi / exact - 1.0)
    assert rel.max() <= 1e-5, (rel.max(), x[rel.argmax()])
    assert rel[np.abs(x) <= 6].max() <= 3e-6


def test_gelu_fast_error_is_far_below_a_16_bit_ulp():
    """16-bit GELU (erf form) as gelu_fast computes it, max(x, 0) - |x| Phi(-|x|): relative error <= 1e-5
    everywhere (both tails, |x| < 13; <= 3e-6 for |x| <= 6), the bounds of phi_fast itself, and no
    cancellation near 0 or for large positive x. A half ulp is 2.4e-4 relative for fp16, 2.0e-3 for bf16."""
    y, x = _gelu_fast_f32(np.concatenate([np.linspace(-13.0, 13.0, 400001), [-1e-30, 1e-30, 3e-8, -3e-8]]))
    exact = np.array([v * 0.5 * math.erfc(-v / math.sqrt(2.0)) for v in x])
    rel = np.abs(y / exact - 1.0)
    rel[exact == 0] = np.abs(y[exact == 0])
    assert rel.max() <= 1e-5, (rel.max(), x[rel.argmax()])
    assert rel[np.abs(x) <= 6].max() <= 3e-6, (rel[np.abs(x) <= 6].max())
    y, _ = _gelu_fast_f32(np.array([np.inf, -np.inf, np.nan, 0.0]))
    assert y[0] == np.inf and y[1] == 0.0 and np.isnan(y[2]) and y[3] == 0.0
