"""CPU checks of the activation kernels' numerics that need no GPU: the fast normal CDF of 16-bit GELU."""
import math
import re
from pathlib import Path

import numpy as np

SRC = Path(__file__).resolve().parents[1] / "ptx" / "activation.cu"


def _phi_fast_coefficients():
    """Q's coefficients (highest degree first) and the two scale constants, read from phi_fast's source."""
    body = SRC.read_text().split("float phi_fast(float x) {", 1)[1].split("\n}", 1)[0]
    consts = [float(c) for c in re.findall(r"([-+]?\d+\.\d+e[-+]\d+)f", body)]
    scale = float(re.search(r"fabsf\(x\), ([0-9.]+)f", body).group(1))
    half_log2e = float(re.search(r"x \* x, (-[0-9.]+)f", body).group(1))
    return consts, scale, half_log2e


def _phi_fast_f32(x):
    """phi_fast evaluated step by step in float32 (each fma rounded once), exact rcp and exp2."""
    f = np.float32
    q_coefs, scale, half_log2e = _phi_fast_coefficients()
    x = x.astype(f)
    t = (1.0 / (np.abs(x).astype(np.float64) * float(f(scale)) + 1.0).astype(f).astype(np.float64)).astype(f)
    q = np.full_like(t, f(q_coefs[0]))
    for c in q_coefs[1:]:
        q = (q.astype(np.float64) * t + float(f(c))).astype(f)
    xx = (x.astype(np.float64) ** 2).astype(f)
    h = (t.astype(np.float64) * np.exp2((xx.astype(np.float64) * float(f(half_log2e)) + q).astype(f))).astype(f)
    return np.where(x < 0, h, (1.0 - h.astype(np.float64)).astype(f)).astype(np.float64), x.astype(np.float64)


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
