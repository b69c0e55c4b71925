"""Strided backward data (BWD_DATA_ALGO_1 on tensor cores, stride > 1) as stride-1 phase sub-problems.

With stride s, dx position x (per spatial dim) receives dy[(x + pad - r * dil) / s] * w[r] from the taps
r whose (x + pad - r * dil) is a multiple of s, and from no other. Split dx by x's residue ph = x mod s
(a phase, x = s * i + ph): the taps that reach phase ph are those with r * dil = ph + pad (mod s), an
arithmetic progression r = r0 + t * j (t = s / gcd(dil, s), j = 0 .. n - 1) when one exists, and for
them the dy position is i + q - j * (dil / gcd(dil, s)) with q = (ph + pad - r0 * dil) / s exact. So each
phase is a STRIDE-1 backward data:

    dx_ph[i] = sum_j dy[i + q - j * dil'] * w_eff[r0 + t * j]     (per dim; the product over 1-3 dims)

of dy (unchanged) into the dx positions s * i + ph (dx's pointer moved by ph positions, its spatial
strides times s), with padding q, dilation dil' = dil / gcd(dil, s), and the sub-filter of the n taps
r0 + t * j (the filter's pointer moved to its first tap in memory, its tap strides times t). In
CONVOLUTION mode the effective filter is w flipped; the sub-filter is then the memory taps
R - 1 - r0 - t * (n - 1) .. R - 1 - r0 step t, read flipped by the kernel (FLAG_FLIP over the n taps),
which is the same set in the order the phase wants. The phase problems are planned by the family's
stride-1 backward data (plans.planner: fwd_wgmma on sm_90 where it applies, implicit_gemm_pipe_tc,
bwd_data_tc; grouped problems grouped.py's packed supergroups on implicit_gemm_pipe_tc_grouped or
bwd_data_tc_grouped), so no kernel multiplies a zero that the stride put there: the stride-s kernel gathered
every tap for every dx position and kept 1 / s^d of them (3x3 stride 2: 1 tap of 4 useful on average,
measured 0.04-0.3x cuDNN on the H200), the phases do exactly the convolution's work.

Phases that no tap reaches (a 1x1 stride-2 layer: 3 of 4; a filter smaller than the stride) only take
dx = beta * dx, or zeros: one dgrad_phase_fill launch (ptx/conv_dgrad.cu) for all of them. Every dx
element belongs to exactly one phase and is written once: deterministic, alpha / beta as cuDNN's.
Workspace: the largest a phase's plan needs (fwd_wgmma's swapped filter where it is asked for), reused
phase after phase (stream order). tuning.conv.DGRAD_PHASES off: the stride-s kernels as before.
Launches: one per phase with taps (s^d of them at most, 4 for a 2-d stride 2) + the fill.
"""
import ctypes
import itertools
from math import gcd

from ... import enums as E
from ... import tuning
from ..._build.params import FLAG_BETA, kernel_params
from ..._cuda import driver
from .._elementwise import CTYPE
from ..common import cdiv, prod
from ...status import PydnnError
from . import grouped, grouped_direct
from .plans import LAUNCH_MS, StepPlan, add_kernels, apply_top, planner, register, run_plan
from .problem import DIR_BWD_DATA, NS, TC_TAGS, tc_refusal

MAX_STRIDE = 64           # dgrad_phase_fill's residue masks are 64 bits
FILL_GBPS = 2000.0        # the model's rate for dgrad_phase_fill (bytes read + written / time; a ranking)
FILL_BLOCKS_PER_SM = 16   # dgrad_phase_fill's grid: about this many blocks an SM (grid.z over n * d)
ALGO_1 = E.PYDNN_CONVOLUTION_BWD_DATA_ALGO_1


@kernel_params("conv_dgrad_params.h", "DgradFillParams")
class DgradFillParams(ctypes.Structure):
    _fields_ = [
        ("out", ctypes.c_void_p), ("beta", ctypes.c_double), ("flags", ctypes.c_uint),
        ("channels", ctypes.c_int), ("chunks", ctypes.c_int), ("batch", ctypes.c_int), ("size", ctypes.c_int * 3),
        ("stride", ctypes.c_int * 3), ("empty", ctypes.c_ulonglong * 3), ("xs", ctypes.c_longlong * 5),
    ]


def fill_expr(tag, vec):
    """dgrad_phase_fill: VEC 1 moves 8 channels (16 bytes) a thread, 0 one channel."""
    return f"pydnn::conv::dgrad_phase_fill<{CTYPE[tag]}, {int(bool(vec))}>"


for _t in TC_TAGS:
    add_kernels(f"conv_dgrad.{_t}", "conv_dgrad.cu", (fill_expr(_t, 1), fill_expr(_t, 0)))


# ----------------------------------------------------------------------------- the phases

class DimPhase:
    """One residue ph of one spatial dim: `count` dx positions ph, ph + s, ...; taps None when no tap
    reaches them, else the sub-filter r0 + step * j (j < n), the sub-problem's padding q and dilation."""

    __slots__ = ("ph", "count", "r0", "step", "n", "q", "dil")

    def __init__(self, ph, count, r0=None, step=1, n=0, q=0, dil=1):
        self.ph, self.count, self.r0, self.step, self.n, self.q, self.dil = ph, count, r0, step, n, q, dil

    @property
    def empty(self):
        return self.n == 0

    def mem_first(self, filt, flip):
        """The sub-filter's first tap in memory (its lowest memory index)."""
        return filt - 1 - self.r0 - self.step * (self.n - 1) if flip else self.r0

    def __repr__(self):
        return (f"DimPhase(ph={self.ph}, count={self.count}, r0={self.r0}, step={self.step}, n={self.n}, "
                f"q={self.q}, dil={self.dil})")


def dim_phases(size, filt, pad, stride, dil):
    """The residues of one spatial dim of dx (size positions) that hold positions: [DimPhase]."""
    out = []
    t = stride // gcd(dil, stride)
    for ph in range(min(stride, size)):
        count = cdiv(size - ph, stride)
        r0 = next((r for r in range(min(filt, t)) if (ph + pad - r * dil) % stride == 0), None)
        if r0 is None:
            out.append(DimPhase(ph, count))
            continue
        n = len(range(r0, filt, t))
        q = (ph + pad - r0 * dil) // stride
        out.append(DimPhase(ph, count, r0, t, n, q, dil // gcd(dil, stride)))
    return out


def phases(pb):
    """[(DimPhase per dim (d, h, w))] for every phase of dx: the product of the dims' residues."""
    per_dim = [dim_phases(pb.in3[i], pb.filt3[i], pb.pad3[i], pb.stride3[i], pb.dil3[i]) for i in range(3)]
    return list(itertools.product(*per_dim))


def sub_problem(pb, ph):
    """The stride-1 backward-data Problem of a phase with taps in every dim, and its (dx, w) element
    offsets (where its dx positions and its sub-filter start)."""
    s = pb.copy()
    s.in3 = tuple(d.count for d in ph)
    s.filt3 = tuple(d.n for d in ph)
    s.pad3 = tuple(d.q for d in ph)
    s.dil3 = tuple(d.dil for d in ph)
    s.stride3 = (1, 1, 1)
    s.xs = tuple(pb.xs[:2]) + tuple(pb.xs[2 + i] * pb.stride3[i] for i in range(3))
    s.ws = tuple(pb.ws[:2]) + tuple(pb.ws[2 + i] * ph[i].step for i in range(3))
    s.w_dims = tuple(pb.w_dims[:2]) + s.filt3[3 - pb.nspatial:]
    dx_off = sum(ph[i].ph * pb.xs[2 + i] for i in range(3))
    w_off = sum(ph[i].mem_first(pb.filt3[i], pb.flip) * pb.ws[2 + i] for i in range(3))
    return s, dx_off, w_off


def phase_refusal(pb):
    """Why the phase split does not serve a problem (None when it does): it serves the tensor-core
    backward data with a stride > 1, one group (tc_refusal) or grouped where the grouped tensor-core path
    (grouped.py: packed supergroups) serves the phases."""
    if not tuning.conv.DGRAD_PHASES:
        return "tuning.conv.DGRAD_PHASES is off"
    if all(st == 1 for st in pb.stride3):
        return "stride 1 (no phases)"
    if max(pb.stride3) > MAX_STRIDE:
        return f"stride {tuple(pb.stride3)} > {MAX_STRIDE}"
    if pb.in3[1] > 65535:
        return f"dx height {pb.in3[1]} > 65535 (the fill's grid)"
    if pb.groups != 1:
        return None if grouped.applies(pb, DIR_BWD_DATA) else "groups: the grouped tensor-core path refuses"
    return tc_refusal(pb, DIR_BWD_DATA)


# ----------------------------------------------------------------------------- the plan

class PhasePlan(StepPlan):
    """Backward data as its phases' stride-1 plans (+ dgrad_phase_fill for the phases without taps)."""

    def __init__(self, pb, algo, subs, fill, fill_elems=0, handle_sms=132):
        super().__init__(DIR_BWD_DATA, algo, pb)
        self.fill_elems = fill_elems   # the dx elements the fill writes
        self.subs = subs    # [(plan, dx element offset, w element offset, sub-problem)]
        self.fill = fill    # DgradFillParams or None
        self.fill_argv = driver.kernel_args(fill) if fill is not None else None
        self.fill_funcs = {}
        # 16 bytes a thread where dx's channels are innermost and its other strides multiples of 8 (and the
        # pointer 16-byte aligned, checked per call)
        self.fill_vec = pb.xs[1] == 1 and pb.c % 8 == 0 and all(pb.xs[i] % 8 == 0 for i in (0, 2, 3, 4))
        self.fill_expr = fill_expr(pb.tag, self.fill_vec)
        self.fill_grid = None
        if fill is not None:
            fill.chunks = pb.c // 8 if self.fill_vec else pb.c
            gx, rows = cdiv(pb.in3[2] * fill.chunks, 256), pb.n * pb.in3[0]
            # blocks over n * d: about FILL_BLOCKS_PER_SM blocks an SM in all, each thread walking the rest
            # of n * d (a block per (row, n, d) measured ~1.3 TB/s on the H200: 30 us for 1x1/2's 38 MB)
            self.fill_grid = (gx, pb.in3[1], max(1, min(rows, 65535, cdiv(FILL_BLOCKS_PER_SM * max(handle_sms, 1),
                                                                          gx * pb.in3[1]))))
        self.workspace = max([sp.workspace for sp, _, _, _ in subs] + [0])
        self.align = max([sp.align for sp, _, _, _ in subs] + [0])
        self.deterministic = all(sp.deterministic for sp, _, _, _ in subs)
        # what the family's tools read of a one-launch plan: the biggest phase's kernel
        big = max(subs, key=lambda e: e[3].flops)[0] if subs else None
        self.gemm = big.gemm if big is not None else None
        self.gemm_expr = big.gemm_expr if big is not None else self.fill_expr
        self.unit = big.unit if big is not None else f"conv_dgrad.{pb.tag}"

    def launch(self, handle, a_ptr, b_ptr, out_ptr, ws_ptr, alpha, beta, z_ptr=0, bias_ptr=0):
        """a = dy, b = w, out = dx."""
        it = self.itemsize
        for sp, dx_off, w_off, _ in self.subs:
            run_plan(handle, sp, a_ptr, b_ptr + w_off * it, out_ptr + dx_off * it, ws_ptr, alpha, beta)
        if self.fill is not None:
            vec = self.fill_vec and out_ptr % 16 == 0
            func = self.fill_funcs.get(vec)
            if func is None:
                func = self.fill_funcs[vec] = handle.function(f"conv_dgrad.{self.problem.tag}",
                                                              fill_expr(self.problem.tag, vec))
            f = self.fill
            f.out, f.beta = out_ptr, beta
            f.flags = FLAG_BETA if beta != 0 else 0
            f.chunks = self.problem.c // 8 if vec else self.problem.c
            grid = self.fill_grid
            if vec != self.fill_vec:  # a dx pointer that is not 16-byte aligned: one channel a thread
                grid = (cdiv(self.problem.in3[2] * f.chunks, 256),) + grid[1:]
            driver.launch_args(func, grid, (256, 1, 1), 0, handle.cu_stream, self.fill_argv)

    def estimate_ms(self, handle, base_estimate):
        t = sum(base_estimate(handle, sp) for sp, _, _, _ in self.subs)
        t += LAUNCH_MS * max(0, len(self.subs) - 1)
        if self.fill is not None:  # its elements read (beta) and written
            t += LAUNCH_MS + 2 * self.fill_elems * self.itemsize / (FILL_GBPS * 1e6)
        return t


def _fill_params(pb, phs):
    """DgradFillParams for the phases without taps (None when every phase has taps), and how many dx
    elements it writes."""
    empty_masks = [0, 0, 0]
    for ph in phs:
        for i, d in enumerate(ph):
            if d.empty:
                empty_masks[i] |= 1 << d.ph
    if not any(empty_masks):
        return None, 0
    f = DgradFillParams()
    f.channels, f.chunks, f.batch = pb.c, pb.c, pb.n
    for i in range(3):
        f.size[i], f.stride[i], f.empty[i] = pb.in3[i], pb.stride3[i], empty_masks[i]
    for i in range(5):
        f.xs[i] = pb.xs[i]
    elems = pb.n * pb.c * sum(prod(d.count for d in ph) for ph in phs if any(d.empty for d in ph))
    return f, elems


@register(DIR_BWD_DATA, ALGO_1, order=-2)   # before grouped.py's planner (-1), which serves strided groups too
def plan_phases(handle, pb, direction, algo):
    """The phase plan of a strided tensor-core backward data, or None (the next candidate: the stride-s
    kernels, or the refusal's reason from them) where phase_refusal says no or a phase cannot be planned.
    One group: each phase on tensor_core.py's stride-1 plans; grouped: on grouped.py's (each phase packs
    its sub-filter into the workspace, one phase after the other)."""
    if phase_refusal(pb) is not None:
        return None
    phs = phases(pb)
    stride1 = planner(DIR_BWD_DATA, ALGO_1)
    subs = []
    for ph in phs:
        if any(d.empty for d in ph):
            continue
        spb, dx_off, w_off = sub_problem(pb, ph)
        try:
            sp = stride1(handle, spb, algo)
        except PydnnError as e:
            if e.status != NS:
                raise
            return None   # (a phase the stride-1 kernels refuse: the whole problem takes the stride-s ones)
        if pb.groups != 1 and not isinstance(sp, (grouped.GroupedPlan, grouped_direct.GroupedDirectPlan)):
            return None
        sp.problem = spb
        sp = apply_top(handle, sp)   # a phase's fwd_wgmma split-K (its partials in the shared workspace)
        subs.append((sp, dx_off, w_off, spb))
    fill, elems = _fill_params(pb, phs)
    return PhasePlan(pb, algo, subs, fill, elems, handle.sm_count)
