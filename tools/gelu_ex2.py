"""GELU with one MUFU (issue 22; ptx/graph_pointwise.cuh gelu_ex2): its fit and its exhaustive float32 scan.

  GELU(x) = x Phi(x) = max(x, 0) - a Phi(-a),  a = |x|,   Phi(-a) = 2^h(a),  h(a) = log2 Phi(-a)

h is smooth on [0, inf) (-1 at 0, ~ -a^2 / (2 ln 2) - log2(a sqrt(2 pi)) far out), so one polynomial of degree 9 in
a itself holds it on [0, 12.95] (past that Phi(-a) < 2^-126 and ex2.approx.ftz flushes it anyway) and ONE MUFU
(EX2) makes Phi(-a): no reciprocal, no transformed variable. gelu_fast5 needs two (RCP for t = 1 / (1 + a / 2
sqrt 2), EX2) and 15 instructions an output with the bias add; gelu_ex2 14: the bias FFMA, a = min.NaN(|x|, 13)
(FMNMX: the clamp keeps the polynomial in its range, +-inf finite, and NaN NaN), 9 FFMA, MUFU.EX2, max(x, 0)
(FMNMX), the final FFMA.

  python3 tools/gelu_ex2.py fit          the coefficients (minimax by linear programming on a dense grid, each
                                         rounded to float32 from the top down and the rest re-fitted)
  python3 tools/gelu_ex2.py scan [--step S] [--jobs J]
                                         every float32 bit pattern (S = 1; S > 1: every S-th) through the exact
                                         float32 emulation of the instruction sequence (emulate below: each FFMA
                                         one float32 rounding, ex2 exact then rounded and flushed below 2^-126),
                                         against x Phi(x) in float64; prints the largest relative error by range
                                         (where x Phi(x) is a normal float32; subnormal ones as absolute error).
The relative error bound does not include MUFU.EX2's own (about 2 ulp: CUDA documents exp2f, which is MUFU.EX2 alone,
at 2 ulp, ~2.4e-7) beyond the float32 rounding of its result that the emulation has.
"""
import math
import os
import re
import sys

import numpy as np

LN2 = math.log(2.0)
CLAMP = 13.0  # a is clamped here: 2^h(13) = 2^-126.94 flushes to 0 (ftz), so x <= -13 gives -0, x >= 13 gives x
FIT_HI = 12.95  # Phi(-12.95) ~ 2^-126: below that ex2's result is subnormal and flushed
DEG = 9


def h(a):
    from scipy.special import log_ndtr

    return log_ndtr(-np.asarray(a, np.float64)) / LN2


def _lp(a, y, d, fixed, scale):
    from scipy.optimize import linprog

    free = [k for k in range(d + 1) if k not in fixed]
    r = y - sum(v * a ** k for k, v in fixed.items()) if fixed else y.copy()
    V = np.vander(a / scale, d + 1, increasing=True)[:, free]
    n = len(free)
    one = np.ones((len(a), 1))
    res = linprog(np.r_[np.zeros(n), 1.0], A_ub=np.vstack([np.hstack([V, -one]), np.hstack([-V, -one])]),
                  b_ub=np.r_[r, -r], bounds=[(None, None)] * n + [(0, None)], method="highs")
    coef = dict(fixed)
    for k, bk in zip(free, res.x[:n]):
        coef[k] = bk / scale ** k
    return coef, res.x[-1]


def fit(d=DEG, hi=FIT_HI, points=6000):
    """Coefficients c_0 .. c_d (float32 values) of h on [0, hi]."""
    a = np.cos(np.linspace(0.0, np.pi, points)) * hi / 2 + hi / 2
    y = h(a)
    fixed = {}
    for k in range(d, -1, -1):
        coef, _ = _lp(a, y, d, fixed, hi)
        fixed[k] = float(np.float32(coef[k]))
    return [fixed[k] for k in range(d + 1)]


def source_coefficients(src=None):
    """The coefficients as ptx/graph_pointwise.cuh's gelu_ex2 has them (c_d first, as Horner uses them)."""
    if src is None:
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        src = open(os.path.join(here, "ptx", "graph_pointwise.cuh")).read()
    body = src.split("float gelu_ex2(float x) {", 1)[1].split("\n}", 1)[0]
    return [float(c) for c in re.findall(r"([-+]?\d\.\d{9}e[-+]\d\d)f", body)]


def emulate(x, hc):
    """gelu_ex2 on float32 values x, each step as the device computes it (hc: c_d .. c_0, float32 values)."""
    f32 = np.float32
    x64 = np.asarray(x, f32).astype(np.float64)
    a = np.minimum(np.abs(x64), CLAMP)
    a[np.isnan(x64)] = np.nan  # min.NaN
    q = np.full_like(a, hc[0])
    for c in hc[1:]:
        q = (q * a + c).astype(f32).astype(np.float64)  # FFMA: the product is exact in float64
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        e = np.exp2(q).astype(f32).astype(np.float64)
        e[e < 2.0 ** -126] = 0.0  # .ftz
        return (np.maximum(x64, 0.0) - a * e).astype(f32).astype(np.float64)  # fmaxf(NaN, 0) = 0; the FFMA NaN


def exact(x64):
    from scipy.special import ndtr

    return x64 * ndtr(x64)


def rel_error(x, hc):
    """(relative error, x as float64, exact) with exact == 0 -> |y|."""
    y = emulate(x, hc)
    x64 = np.asarray(x, np.float32).astype(np.float64)
    ex = exact(x64)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.abs(y / ex - 1.0)
    z = ex == 0
    rel[z] = np.abs(y[z])
    return rel, x64, ex, y


# the ranges the scan reports: (label, |x| low, |x| high (exclusive), sign: -1, +1 or 0 both)
RANGES = (("x in [-6, 6]", 0.0, 6.0, 0), ("x in (-12.9, -6)", 6.0, 12.9, -1), ("x in (6, 13)", 6.0, 13.0, 1),
          ("x in (-13, -12.9] (Phi(x) near 2^-126)", 12.9, 13.0, -1), ("|x| >= 13", 13.0, np.inf, 0))
# (each over x whose GELU is a normal float32; the subnormal ones separately)


def _scan_chunk(args):
    lo, hi, step, hc = args
    bits = np.arange(lo, hi, step, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    x = x[np.isfinite(x)]
    rel, x64, ex, y = rel_error(x, hc)
    out = {}
    ax = np.abs(x64)
    normal = np.abs(ex) >= 2.0 ** -126
    for label, alo, ahi, sg in RANGES:
        sel = (ax >= alo) & (ax < ahi) & normal
        if sg:
            sel &= np.sign(x64) == sg
        if sel.any():
            i = np.argmax(np.where(sel, rel, -1.0))
            out[label] = (float(rel[i]), float(x64[i]), int(sel.sum()))
    # a subnormal true value with x > -12.9 (|x| < ~2^-125): float32 holds it to 2^-149; the error beyond that
    # rounding, relative: (|y - exact| - 2^-150) / |exact|
    sub = ~normal & (x64 > -12.9) & (ex != 0)
    if sub.any():
        err = np.maximum(np.abs(y - ex)[sub] - 2.0 ** -150, 0.0) / np.abs(ex[sub])
        i = np.argmax(err)
        out["x > -12.9, GELU(x) subnormal: rel beyond the rounding"] = (float(err[i]), float(x64[sub][i]),
                                                                        int(sub.sum()))
    # x <= -12.9: the largest |GELU(x)| that came out flushed to zero
    fl = (x64 <= -12.9) & (y == 0) & (ex != 0)
    if fl.any():
        i = np.argmax(np.abs(ex[fl]))
        out["x <= -12.9 flushed to -0: largest |GELU(x)|"] = (float(abs(ex[fl][i])), float(x64[fl][i]), int(fl.sum()))
    return out


def scan(step=1, jobs=2, hc=None):
    """Every step-th float32 bit pattern (finite ones); {range label: (max rel error, at x, count)}."""
    from concurrent.futures import ProcessPoolExecutor

    hc = hc or source_coefficients()
    chunk = 1 << 24
    todo = [(lo, lo + chunk, step, hc) for lo in range(0, 1 << 32, chunk)]
    best = {}
    with ProcessPoolExecutor(jobs) as ex:
        for part in ex.map(_scan_chunk, todo):
            for k, (r, xv, n) in part.items():
                b = best.get(k, (-1.0, 0.0, 0))
                best[k] = (max(b[0], r), xv if r > b[0] else b[1], b[2] + n)
    return best


def main():
    if sys.argv[1:2] == ["fit"]:
        c = fit()
        print("c_0 .. c_9:", ", ".join(f"{v:.9e}" for v in c))
        xs = np.linspace(-12.9, 12.9, 400001, dtype=np.float32)
        rel, *_ = rel_error(xs, c[::-1])
        print(f"max relative error on [-12.9, 12.9] (400001 points): {rel.max():.3e}")
    elif sys.argv[1:2] == ["scan"]:
        step = int(sys.argv[sys.argv.index("--step") + 1]) if "--step" in sys.argv else 1
        jobs = int(sys.argv[sys.argv.index("--jobs") + 1]) if "--jobs" in sys.argv else 2
        for k, (r, xv, n) in scan(step, jobs).items():
            print(f"{k:42s} max relative error {r:.3e} at x = {xv!r} ({n} values)")
    else:
        print(__doc__)


if __name__ == "__main__":
    main()
