"""CPU: why gsp_fwd / gsc_fwd take a float set's mean from the unshifted sum of x (gs_stats in
ptx/normalization_gs.cu). gsp_fwd's pass-1 summation is replayed in float32 in the kernel's own order (per
thread: head scalars, tail scalars, then VEC-element vectors strided by the unit's CL * block threads; a warp
xor tree; the block's warps in order; the cluster's blocks in rank order) on the shape that failed on the H200
(NCHW 3 x 103 x 19 x 21, one group: 41097-element sets, clusters of 8 blocks of 256 threads): the mean as
K + sum(x - K) / n (K the set's first element) errs by ~ eps * |K|, more than y's fp32 tolerance allows where
x lies at a small mean; the mean as sum(x) / n stays far inside it."""
import numpy as np

F32 = np.float32


def _pass1(x, NT, VEC, base, CL):
    """(sum d, sum d^2, sum x) as the kernel's float32 adds make them (d = x - K, K = x[0])."""
    L = len(x)
    h = min((VEC - base % VEC) % VEC, L)
    nv = (L - h) // VEC
    t0 = h + nv * VEC
    order = [[] for _ in range(NT)]
    for i in range(h):
        order[i % NT].append(i)
    for i in range(t0, L):
        order[(i - t0) % NT].append(i)
    for j in range(nv):
        order[j % NT].extend(range(h + j * VEC, h + (j + 1) * VEC))
    m = max(len(o) for o in order)
    idx = np.full((NT, m), -1)
    for t, o in enumerate(order):
        idx[t, :len(o)] = o
    K = x[0]
    acc = np.zeros((3, NT), F32)
    for k in range(m):
        ii = idx[:, k]
        ok = ii >= 0
        a = x[ii[ok]]
        d = (a - K).astype(F32)
        acc[0, ok] += d
        acc[1, ok] += (d * d).astype(F32)
        acc[2, ok] += a
    w = acc.reshape(3, -1, 32)
    for s in (16, 8, 4, 2, 1):
        w = (w + w[:, :, np.arange(32) ^ s]).astype(F32)
    warps = w[:, :, 0]
    wpb = warps.shape[1] // CL
    blocks = np.zeros((3, CL), F32)
    for b in range(CL):
        t = np.zeros(3, F32)
        for k in range(wpb):
            t = (t + warps[:, b * wpb + k]).astype(F32)
        blocks[:, b] = t
    tot = np.zeros(3, F32)
    for b in range(CL):
        tot = (tot + blocks[:, b]).astype(F32)
    return K, tot


def _far_shift_set(rng, L):
    """Mean exactly 0 by pairs (v, -v), first element 2.9, 2% of the elements within 2e-3 of the mean."""
    half = L // 2
    v = rng.uniform(-3, 3, half)
    near = rng.random(half) < 0.02
    v[near] = rng.uniform(-2e-3, 2e-3, near.sum())
    v[0] = 2.9
    v = v.astype(F32)
    row = np.concatenate([v, -rng.permutation(v)] + ([np.zeros(1, F32)] if L % 2 else []))
    row[1:] = rng.permutation(row[1:])
    return row


def test_shifted_mean_misses_the_tolerance_unshifted_holds():
    L = 103 * 19 * 21          # the failing case's set
    NT, VEC, CL = 8 * 256, 4, 8  # its launch: gsp_fwd vec=4 cl=8 block=256 (3 sets)
    # y = alpha (x - mean) invstd scale; where x = mean the fp32 tolerance is atol 1e-7 plus 1e-5 * (|x| +
    # |mean|) * invstd * |scale| (reference forward_terms): with scale 1.5 and invstd ~ 1 / sqrt(3) the mean
    # may err by at most ~1.15e-7
    budget = 1e-7 / (1.5 / np.sqrt(3.0))
    rng = np.random.default_rng(20)
    worst_shifted = worst_plain = 0.0
    for s in range(6):
        x = _far_shift_set(rng, L) if s % 2 else rng.uniform(-3, 3, L).astype(F32)
        true = x.astype(np.float64).mean()
        K, (s1, s2, s0) = _pass1(x, NT, VEC, (s % 3) * L, CL)
        shifted = F32(float(K) + float(s1) / L)   # gs_stats before: K + s1 / n, rounded to float
        plain = F32(float(s0) / L)                # gs_stats now (float data): s0 / n
        worst_shifted = max(worst_shifted, abs(float(shifted) - true))
        worst_plain = max(worst_plain, abs(float(plain) - true))
        # the variance from the shifted sums stays accurate (the shift's purpose)
        m1 = float(s1) / L
        var = float(s2) / L - m1 * m1
        assert abs(var - x.astype(np.float64).var()) <= 1e-5 * x.astype(np.float64).var()
    assert worst_shifted > budget, worst_shifted        # the cause: reproduces the failure's size (~1.5e-7)
    assert worst_plain < budget / 10, worst_plain        # the fix: more than 10x inside it
