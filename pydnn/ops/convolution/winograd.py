"""Convolution WINOGRAD_NONFUSED, F(4x4, 3x3) (F(2x2, 3x3) where 36 x groups GEMMs would not fit the
grid): forward (CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED), backward data
(CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED) and backward filter
(CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED: see "backward filter" below, plan_winograd_wgrad). Kernels: ptx/conv_winograd.cu (templated on the tile
m; params: ptx/conv_winograd_params.h). alpha = m + 2, P = alpha^2 transform positions (36 or 16).

Four launches, the transforms in the workspace:
    filter transform  V[b] = G f G^T             (b: the P positions of the alpha x alpha transform)
    input transform   U[b] = B^T d B             (d: alpha x alpha input patches at stride m)
    P GEMMs           M[b] = U[b] V[b]^T         (over the input channels of a group)
    output transform  y = A^T M A                (m x m outputs per tile, + alpha / beta, or the fused
                                                  bias + activation epilogue)
The P (x groups) GEMMs, for float accumulation (float, half, bfloat16 data), are ONE batched launch of the
matmul family's CUDA-core gemm_simt (pydnn/ops/matmul.py: 128 x 128 or 64 x 128 tiles, 8 x 8 outputs a
thread), batch z = b * groups + g at uniform strides into the workspace (gemm_view below); for double data
they are the family's CUDA-core implicit GEMM run as one grouped 1x1 convolution with P * groups groups
(group b * groups + g reads U[b]'s channels of group g).
The transforms and the GEMM run in float (double for double data); half / bfloat16 data is converted at
the two ends (fp32 accumulation throughout). Multiplies per output: P / m^2 * C instead of 9 * C (4x fewer
for F(4x4), 2.25x for F(2x2)); workspace expansion of x and y: P / m^2 (2.25x, 4x).

Backward data is the same forward-form problem on dy: dx = corr(pad(dy, 2 - pad), rot180(w) with the
channel roles swapped) (filter transform flag BWD; pad must be <= 2).

Supported: 2 spatial dims, a 3 x 3 filter, stride 1, dilation 1, at most 4095 groups (NOT_SUPPORTED with
the reason otherwise); any tensor strides, NCHW / NHWC filters, groups, both modes, every dtype.
Deterministic (each output is written once by one thread in a fixed order; the GEMM is deterministic).
Workspace (Acc = 4 or 8 bytes): P * Acc * (T * C + K * C/g + T * K), T = N * ceil(OH / m) * ceil(OW / m)
(each part 256-byte aligned).
"""
import ctypes

from ... import enums as E
from ... import tuning
from ..._build.params import FLAG_BETA, FLAG_NAN_PROP, kernel_params
from ...status import PydnnError
from .. import matmul as MM
from .._elementwise import CTYPE
from ..common import FLOAT_TAGS, cdiv, prod
from .plans import kernel_units as _family_units, LAUNCH_MS, StepPlan, SubGemm, add_kernels, planner, register, round_up
from .problem import DIR_BWD_DATA, DIR_BWD_FILTER, DIR_FWD, ConvParams

NS = E.PYDNN_STATUS_NOT_SUPPORTED
FLAG_Z, FLAG_BIAS, FLAG_FLIP, FLAG_BWD = 4, 8, 16, 1024


@kernel_params("conv_winograd_params.h", "WinoParams")
class WinoParams(ctypes.Structure):
    _fields_ = [
        ("in_", ctypes.c_void_p), ("w", ctypes.c_void_p), ("out", ctypes.c_void_p),
        ("u", ctypes.c_void_p), ("v", ctypes.c_void_p), ("m", ctypes.c_void_p),
        ("z", ctypes.c_void_p), ("bias", ctypes.c_void_p),
        ("alpha", ctypes.c_double), ("beta", ctypes.c_double), ("alpha2", ctypes.c_double),
        ("coef", ctypes.c_double),
        ("batch", ctypes.c_int), ("groups", ctypes.c_int), ("cin_g", ctypes.c_int), ("cout_g", ctypes.c_int),
        ("in_h", ctypes.c_int), ("in_w", ctypes.c_int), ("out_h", ctypes.c_int), ("out_w", ctypes.c_int),
        ("pad_h", ctypes.c_int), ("pad_w", ctypes.c_int), ("tiles_h", ctypes.c_int), ("tiles_w", ctypes.c_int),
        ("act", ctypes.c_int), ("flags", ctypes.c_uint), ("tiles", ctypes.c_longlong),
        ("is_", ctypes.c_longlong * 4), ("os", ctypes.c_longlong * 4), ("zs", ctypes.c_longlong * 4),
        ("ws", ctypes.c_longlong * 4), ("bias_stride", ctypes.c_longlong),
        ("u_m", ctypes.c_longlong), ("u_c", ctypes.c_longlong), ("m_m", ctypes.c_longlong),
        ("m_c", ctypes.c_longlong), ("u_b", ctypes.c_longlong), ("chunk", ctypes.c_longlong),
        ("u_s", ctypes.c_longlong), ("splits", ctypes.c_int), ("spare", ctypes.c_int),
    ]
    C_NAMES = {"in_": "in", "is_": "is"}


KERNELS = ("filter_transform", "input_transform", "output_transform", "grad_transform", "filter_grad")
TILES = (2, 4)          # F(2x2, 3x3) and F(4x4, 3x3) instantiations
MAX_GRID_Z = 65535
# The Get..._v7 model's rates for the float path, fitted on the H200 (fp32 NCHW ResNet-50 3x3 layers, N = 64,
# F(4x4), tools/bench_convolution_algos.py's run_wino, each launch timed alone): gemm_simt ran the 36 GEMMs at 31-38
# TFLOP/s, 31.5-39 per fully busy SM (GEMM_TFLOPS, stretched by the busiest SM's share of the items); the
# three transforms moved their own traffic (`moved`: x, U, M and y once each, the filter and V) at 1.8-2.7
# TB/s, which bytes / 3 TB/s plus a launch each matches within 10% (0.124 / 0.068 / 0.044 / 0.042 ms against
# 0.122 / 0.069 / 0.049 / 0.048 measured). Model vs measured, whole layer: see the bench's notes.
GEMM_TFLOPS = 36.0
TRANSFORM_GBPS = 3000.0
# 16-bit data: the transforms and the GEMM run in float on CUDA cores while the implicit-GEMM algorithms run
# on tensor cores at 5-10x the rate (bf16 3x3 layers: 330-510 TFLOP/s measured), which the model's tensor-core
# rate (algorithms.TENSOR_CORE_TFLOPS, 150, stretched by partial waves) understates by 2-7x on these
# layers; Winograd's estimate for 16-bit data carries that factor so that Get..._v7 ranks it behind them as Find
# does (see tests/test_convolution_cpu.py::test_bwd_data_wgmma_choice).
HALF_DATA_SCALE = 3.0


def _expr(kernel, tag, tile):
    return f"pydnn::conv_wino::{kernel}<{CTYPE[tag]}, {tile}>"


for _t in FLOAT_TAGS:
    add_kernels(f"conv_winograd.{_t}", "conv_winograd.cu", tuple(_expr(k, _t, m) for m in TILES for k in KERNELS))


MIN_F4_CHANNELS_F32 = 4   # float data: F(4x4) only where the reduction has this many channels per group


def tile_for(pb, cin_g):
    """tuning.conv_winograd.PREFERRED_TILE (4) unless its alpha^2 * groups GEMM groups overflow the launch grid, or the data is
    float with fewer than 4 channels per group to reduce over: F(4x4)'s transforms (coefficients up to 8
    and 1/24) cost ~10x F(2x2)'s rounding error relative to sum |x||w|; a float32 emulation with the
    kernels' summation order puts a single-channel (depthwise) reduction at ~0.9x of float's tolerance
    (rtol 1e-5) and 4 channels at ~0.3x. Half / bfloat16 outputs round far above either; double has room."""
    m = tuning.conv_winograd.PREFERRED_TILE
    if (m + 2) ** 2 * pb.groups > MAX_GRID_Z:
        m = 2
    if m == 4 and pb.dtype == E.PYDNN_DATA_FLOAT and cin_g < MIN_F4_CHANNELS_F32:
        m = 2
    return m


def _shape_refusal(pb, name):
    """Why the F(m x m, 3 x 3) transforms cannot take a problem's shape (None when they can)."""
    if pb.nspatial != 2:
        return f"{name} serves 2-d convolutions only (this one has {pb.nspatial} spatial dims)"
    if tuple(pb.filt3[1:]) != (3, 3):
        return f"{name} needs a 3 x 3 filter (got {pb.filt3[1]} x {pb.filt3[2]})"
    if tuple(pb.stride3[1:]) != (1, 1):
        return f"{name} needs stride 1 (got {pb.stride3[1]} x {pb.stride3[2]})"
    if tuple(pb.dil3[1:]) != (1, 1):
        return f"{name} needs dilation 1 (got {pb.dil3[1]} x {pb.dil3[2]})"
    return None


def refusal(pb, direction, fwd):
    """Why the Winograd transforms cannot serve a problem (None when it can)."""
    name = "WINOGRAD_NONFUSED"
    why = _shape_refusal(pb, name)
    if why:
        return why
    if 16 * pb.groups > MAX_GRID_Z:
        return f"{name} supports at most {MAX_GRID_Z // 16} groups (got {pb.groups}): its GEMMs are grid.z blocks"
    if not fwd and max(pb.pad3[1:]) > 2:
        return f"backward data {name} needs padding <= 2 (got {pb.pad3[1]} x {pb.pad3[2]})"
    return None


def _view(pb, fwd):
    """The forward-form problem: (in strides, in hw, out strides, out hw, cin_g, cout_g, pad, flip)."""
    def s4(s):
        return (s[0], s[1], s[3], s[4])
    if fwd:
        return s4(pb.xs), pb.in3[1:], s4(pb.ys), pb.out3[1:], pb.cg, pb.kg, pb.pad3[1:], pb.flip
    return (s4(pb.ys), pb.out3[1:], s4(pb.xs), pb.in3[1:], pb.kg, pb.cg, tuple(2 - p for p in pb.pad3[1:]),
            not pb.flip)


def _grouped_1x1(pb, n, groups, cg, kg, xs, ys):
    """pb's GEMMs as one grouped 1x1 convolution on the family's kernels: n "images" (tiles), `groups`
    groups of cg input and kg output channels, x and y strides (image, channel), the filter packed
    (K, cg) NCHW, cross-correlation, default math."""
    s = pb.copy()
    s.n, s.groups, s.cg, s.kg, s.c, s.k = n, groups, cg, kg, groups * cg, groups * kg
    s.in3 = s.out3 = s.filt3 = (1, 1, 1)
    s.pad3, s.stride3, s.dil3 = (0, 0, 0), (1, 1, 1), (1, 1, 1)
    s.xs, s.ys, s.ws = tuple(xs) + (0, 0, 0), tuple(ys) + (0, 0, 0), (cg, 1, 0, 0, 0)
    s.flip, s.w_format, s.math_type = False, E.PYDNN_TENSOR_NCHW, E.PYDNN_DEFAULT_MATH
    s.w_dims = (s.k, cg, 1, 1)
    return s


def _gemm_problem(pb, acc_dtype, tiles, cin_g, cout_g, u, mm, positions):
    """The alpha^2 * groups GEMMs as one grouped 1x1 convolution over U (n = tiles, channels (b, ci))."""
    s = _grouped_1x1(pb, tiles, positions * pb.groups, cin_g, cout_g, u[:2], mm[:2])
    s.dtype, s.tag = acc_dtype, ("f64" if acc_dtype == E.PYDNN_DATA_DOUBLE else "f32")
    return s


def gemm_view(pos, groups, tiles, cin_g, cout_g, u, mm):
    """The P * groups GEMMs as one batched row-major matmul problem over the workspace: (m, n, k, keyword
    arguments of matmul.gemm_plan). Batch z = b * groups + g; U's element (tile t, channel g*cin_g + i) of
    position b is at t * u[0] + (z * cin_g + i) * u[1], M's (t, g*cout_g + o) at t * mm[0] + (z * cout_g + o)
    * mm[1], V's (o, i) at (z * cout_g + o) * cin_g + i. With M tile-contiguous (mm[0] == 1, NCHW output)
    C_z = M_z as cout_g x tiles = V_z (cout_g x cin_g) . U_z^T; with M channel-contiguous (NHWC) C_z is
    tiles x cout_g = U_z . V_z^T, the batches side by side within M's rows (stride cout_g)."""
    batch = pos * groups
    v = dict(stride_a=cout_g * cin_g, lda=cin_g)  # V_z, cout_g x cin_g, row major
    if mm[0] == 1:  # C_z[o][t] at o * mm[1] + t
        b = (dict(trans_b=False, ldb=u[1], stride_b=cin_g * u[1]) if u[0] == 1
             else dict(trans_b=True, ldb=u[0], stride_b=cin_g))
        return cout_g, tiles, cin_g, dict(trans_a=False, **v, **b, ldc=mm[1], stride_c=cout_g * mm[1], batch=batch)
    a = (dict(trans_a=True, lda=u[1], stride_a=cin_g * u[1]) if u[0] == 1
         else dict(trans_a=False, lda=u[0], stride_a=cin_g))
    return tiles, cout_g, cin_g, dict(**a, trans_b=True, ldb=cin_g, stride_b=v["stride_a"], ldc=mm[0],
                                      stride_c=cout_g, batch=batch)


class WinogradPlan(StepPlan):
    def launch(self, handle, a_ptr, b_ptr, out_ptr, ws_ptr, alpha, beta, z_ptr=0, bias_ptr=0):
        p, h = self.params, self.gemm  # h: the epilogue fields ConvolutionBiasActivationForward set
        p.in_, p.w, p.out = a_ptr, b_ptr, out_ptr
        p.u, p.v, p.m = ws_ptr + self.offsets[0], ws_ptr + self.offsets[1], ws_ptr + self.offsets[2]
        p.z, p.bias = z_ptr or None, bias_ptr or None
        p.alpha, p.beta = alpha, beta
        p.flags = self.base_flags | (FLAG_BETA if beta != 0 else 0)
        if bias_ptr:
            p.flags |= h.flags & (FLAG_Z | FLAG_BIAS | FLAG_NAN_PROP)
            p.act, p.coef, p.alpha2, p.bias_stride = h.act, h.coef, h.alpha2, h.bias_stride
            for i, j in enumerate((0, 1, 3, 4)):
                p.zs[i] = h.zs[j]
        else:
            p.act = 0
        self.run_step(handle, 0)   # filter transform
        self.run_step(handle, 1)   # input transform
        self.run_gemm(handle)
        self.run_step(handle, 2)   # output transform

    def run_gemm(self, handle):
        """The P GEMMs, reading U and V and writing M in the workspace set by the last launch."""
        p = self.params
        if self.mm is not None:  # the GEMM's operands: (U or V, V or U) as gemm_view oriented them
            a, b = (p.v, p.u) if self.v_is_a else (p.u, p.v)
            self.mm.launch(handle, a, b, p.m)
        else:
            self.sub.run(handle, p.u, p.v, p.m, 1.0, 0.0)

    def estimate_ms(self, handle, base_estimate):
        if self.mm is None:
            gemm = base_estimate(handle, self.sub.plan)
        else:  # gemm_simt: its flops at GEMM_TFLOPS, stretched by the busiest SM's share of the items
            tile = self.gemm_tile
            items = cdiv(self.mm.m, tile.bm) * cdiv(self.mm.n, tile.bn) * self.mm.batch
            sms = max(handle.sm_count, 1)
            gemm = self.gemm_flops / (GEMM_TFLOPS * 1e9) * cdiv(items, sms) * sms / items
        t = gemm + self.moved / (TRANSFORM_GBPS * 1e6) + 3 * LAUNCH_MS
        return t * HALF_DATA_SCALE if self.itemsize == 2 else t


def plan_winograd(handle, pb, direction, algo):
    """A WINOGRAD_NONFUSED plan (forward or backward data) or NOT_SUPPORTED with the reason."""
    fwd = direction == DIR_FWD
    why = refusal(pb, direction, fwd)
    if why:
        raise PydnnError(NS, f"algo: {why}")
    ins, in_hw, outs, out_hw, cin_g, cout_g, pad, flip = _view(pb, fwd)
    acc_dtype = E.PYDNN_DATA_DOUBLE if pb.dtype == E.PYDNN_DATA_DOUBLE else E.PYDNN_DATA_FLOAT
    acc = 8 if acc_dtype == E.PYDNN_DATA_DOUBLE else 4
    tile = tile_for(pb, cin_g)
    pos = (tile + 2) ** 2   # alpha^2 transform positions
    th, tw = cdiv(out_hw[0], tile), cdiv(out_hw[1], tile)
    tiles = pb.n * th * tw
    cin, kout = pb.groups * cin_g, pb.groups * cout_g
    # layouts follow the tensors: channels fastest when the tensor's channels are (NHWC)
    u = (pos * cin, 1) if ins[1] == 1 and cin > 1 else (1, tiles)
    mm = (pos * kout, 1) if outs[1] == 1 and kout > 1 else (1, tiles)
    sizes = (pos * tiles * cin * acc, pos * kout * cin_g * acc, pos * tiles * kout * acc)
    pl = WinogradPlan(direction, algo, pb)
    pl.tile = tile
    pl.offsets = (0, round_up(sizes[0]), round_up(sizes[0]) + round_up(sizes[1]))
    pl.workspace = pl.offsets[2] + round_up(sizes[2])
    pl.gemm_flops = 2.0 * pos * tiles * kout * cin_g
    pl.mm = pl.sub = None
    if acc_dtype == E.PYDNN_DATA_FLOAT:
        gm, gn, gk, kw = gemm_view(pos, pb.groups, tiles, cin_g, cout_g, u, mm)
        pl.mm = MM.gemm_plan(handle, E.PYDNN_DATA_FLOAT, gm, gn, gk, **kw)
        pl.v_is_a = mm[0] == 1
        pl.gemm_tile = MM._choose_simt_tile(gm, gn, kw["batch"], handle.sm_count, gk)
    else:
        spb = _gemm_problem(pb, acc_dtype, tiles, cin_g, cout_g, u, mm, pos)
        pl.sub = SubGemm(planner(DIR_FWD, E.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM)(handle, spb, algo), spb)
    pl.gemm = ConvParams()          # holds the fused epilogue's settings between the caller and launch
    pl.gemm_expr = "winograd"
    item = pl.itemsize
    # the transforms' own traffic: x, U, M, y once each, the filter and V (the GEMM's reads are its own)
    pl.moved = (prod(in_hw) * pb.n * cin * item + sizes[0] + sizes[2] + prod(out_hw) * pb.n * kout * item
                + kout * cin_g * 9 * item + sizes[1])
    p = WinoParams()
    p.batch, p.groups, p.cin_g, p.cout_g = pb.n, pb.groups, cin_g, cout_g
    p.in_h, p.in_w, p.out_h, p.out_w = in_hw[0], in_hw[1], out_hw[0], out_hw[1]
    p.pad_h, p.pad_w, p.tiles_h, p.tiles_w, p.tiles = pad[0], pad[1], th, tw, tiles
    for i in range(4):
        p.is_[i], p.os[i] = ins[i], outs[i]
    ws = pb.ws
    for i, v in enumerate((ws[0], ws[1], ws[3], ws[4])):
        p.ws[i] = v
    p.u_m, p.u_c, p.m_m, p.m_c = u[0], u[1], mm[0], mm[1]
    p.u_b, p.chunk = cin * u[1], tiles   # one chunk: tile m at m * u_m
    pl.base_flags = (FLAG_FLIP if flip else 0) | (0 if fwd else FLAG_BWD)
    pl.params = p
    unit = f"conv_winograd.{pb.tag}"
    for kernel, n in zip(KERNELS[:3], (kout * cin_g, tiles * cin, tiles * kout)):
        pl.add_step(unit, _expr(kernel, pb.tag, tile), (cdiv(n, 256), 1, 1), (256, 1, 1), p)
    return pl


# ----------------------------------------------------------------------------- backward filter
#
# Supported: 2 spatial dims, 3 x 3, stride 1, dilation 1 (any padding), any strides and filter format, groups
# (float: any count; double: at most 4095, its GEMMs are grid.z blocks of the implicit GEMM), float / half /
# bfloat16 (fp32 transforms and GEMM; 16-bit read and written at the ends), double (the GEMMs as the
# family's CUDA-core 1x1 backward filter with S * P * groups groups). Deterministic. Workspace (Acc = 4 or
# 8 bytes): P * S * chunk * (C + K) * Acc + S * P * K * C/g * Acc (each part 256-byte aligned), chunk =
# ceil(T / S). Timings and the model's predictions: tools/bench_convolution_algos.py (run_wgrad; H100 80GB).
#
# BWD_FILTER_ALGO_WINOGRAD_NONFUSED: dw[o][i] = G^T (sum over tiles of D[o] . U[i]) G with U = B^T x B (the
# forward's input transform of x), D = A dy A^T (grad_transform: dy's m x m tiles), one GEMM per transform
# position b reducing over the T = N * tiles_h * tiles_w tiles. T is long (12544 at 56^2) and each GEMM's
# output small (64 x 64 there), so the tiles split into S chunks, each chunk its own GEMMs (batch
# z = (s * P + b) * groups + g) writing a partial M_s; filter_grad adds the S partials in a fixed order
# (bitwise reproducible), applies G^T . G, alpha / beta and the flip. S: the least modelled time
# (_wgrad_splits). U and D are laid out per chunk, [s][b][channel][tile] (tile fastest: the GEMM's operands
# K-major, trans_a False / trans_b True; any groups) or, for one group, [s][b][tile][channel] (channels
# fastest: trans_a True / trans_b False, the kernel's shared-memory layout without the transposing
# stores); tuning.conv_winograd.WGRAD_LAYOUT picks ("tile", "chan"; None: channels fastest for NHWC-like
# x, else tiles).
# Float data: the border taps of small outputs. A corner tap of dw sums only the output positions whose
# input is not padding, while the transforms mix the whole tile, so its rounding error is that of the
# tile's magnitude against a sum of few products. "clear" = min(OH - pad_h, OW - pad_w), about the
# positions a corner tap sees per row / column. A float32 emulation with the kernels' transforms (F(4x4) /
# F(2x2), C = K = 16, N = 1 / 3, pads 0-2, outputs 2-16; 3-6 seeds) puts the worst error at <= 0.61x
# float's tolerance with clear >= 4 (F(4x4)) and <= 0.35x with clear >= 2 (F(2x2)), and at 1.1-9.6x below
# those (e.g. clear 3 under F(4x4): 2.0x; one GPU case, 3 x 2 outputs with pad 1 under F(4x4), missed the
# tolerance on 26 of 11880 elements). So float takes F(4x4) from clear 4, F(2x2) from 2, and refuses
# below; half / bfloat16 (tolerances 100x float's) and double keep tuning.conv_winograd.PREFERRED_TILE.
WGRAD_F4_MIN_CLEAR, WGRAD_F2_MIN_CLEAR = 4, 2
WGRAD_K_OVERHEAD = 32   # a GEMM item's fixed cost (first loads, epilogue) in K steps: the split model's
MAX_WGRAD_SPLITS = 64


def wgrad_refusal(pb):
    """Why the backward-filter Winograd cannot serve a problem (None when it can)."""
    name = "BWD_FILTER_ALGO_WINOGRAD_NONFUSED"
    why = _shape_refusal(pb, name)
    if why:
        return why
    clear = _wgrad_clear(pb)
    if pb.dtype == E.PYDNN_DATA_FLOAT and clear < WGRAD_F2_MIN_CLEAR:
        return (f"{name} needs, for float data, outputs at least {WGRAD_F2_MIN_CLEAR} positions past the padding "
                f"in each dim (min(OH - pad_h, OW - pad_w) = {clear}): the border taps' rounding would exceed "
                f"float's accuracy")
    if pb.dtype == E.PYDNN_DATA_DOUBLE and 16 * pb.groups > MAX_GRID_Z:
        return (f"{name} supports at most {MAX_GRID_Z // 16} groups for double data (got {pb.groups}): its GEMMs "
                f"are grid.z blocks")
    return None


def _wgrad_clear(pb):
    return min(pb.out3[1] - max(pb.pad3[1], 0), pb.out3[2] - max(pb.pad3[2], 0))


def wgrad_tile(pb):
    """tuning.conv_winograd.PREFERRED_TILE, but F(2x2) for float data whose outputs are too small for F(4x4)'s rounding
    (WGRAD_F4_MIN_CLEAR above)."""
    if pb.dtype == E.PYDNN_DATA_FLOAT and _wgrad_clear(pb) < WGRAD_F4_MIN_CLEAR:
        return 2
    return tuning.conv_winograd.PREFERRED_TILE


def _wgrad_chunk(tiles, splits):
    """Tiles per chunk: ceil(T / S) rounded up to 32 tiles (128-byte rows of U and D in the "tile" layout)
    from 256 on, else to 4 (16 bytes: the GEMM's vector loads along K). Measured (H100 80GB,
    tools/bench_convolution_algos.py's run_wgrad): with 1141-tile chunks (56^2, S 11) the x / dy transforms wrote
    their 167 MB each at 1.6 TB/s against the forward's input transform's 2.45 TB/s on the same bytes
    (448 / 256-tile chunks elsewhere ran at the forward's rate)."""
    c = cdiv(tiles, splits)
    return round_up(c, 32) if c >= 256 else round_up(c, 4)


def _wgrad_gemm_ms(handle, kg, cg, batch, chunk):
    """The model's time of the batched GEMMs (gemm_simt): rounds of per_sm items an SM, each item
    bm x bn x (chunk + WGRAD_K_OVERHEAD) multiply-adds at GEMM_TFLOPS over the SMs."""
    sms = max(handle.sm_count, 1)
    t = MM._choose_simt_tile(kg, cg, batch, sms, chunk)
    items = cdiv(kg, t.bm) * cdiv(cg, t.bn) * batch
    rounds = cdiv(items, t.per_sm * sms)
    return rounds * t.per_sm * 2.0 * t.bm * t.bn * (chunk + WGRAD_K_OVERHEAD) / (GEMM_TFLOPS * 1e9 / sms)


def _wgrad_splits(handle, pb, pos, tiles, acc):
    """S (chunks of the tile reduction): the least modelled GEMM time plus the partials' traffic (written
    by the GEMMs, read by filter_grad)."""
    z0 = pos * pb.groups
    cap = MAX_WGRAD_SPLITS if pb.dtype != E.PYDNN_DATA_DOUBLE else max(1, MAX_GRID_Z // z0)
    if tuning.conv_winograd.WGRAD_FORCE_SPLITS:
        return max(1, min(tuning.conv_winograd.WGRAD_FORCE_SPLITS, cap, tiles))
    best = None
    for s in range(1, min(cap, tiles) + 1):
        chunk = _wgrad_chunk(tiles, s)
        if cdiv(tiles, chunk) != s:
            continue  # the same chunks as a smaller S
        t = (_wgrad_gemm_ms(handle, pb.kg, pb.cg, z0 * s, chunk)
             + 2.0 * s * pos * pb.k * pb.cg * acc / (TRANSFORM_GBPS * 1e6))
        if best is None or t < best[0]:
            best = (t, s)
    return best[1]


def wgrad_view(pos, groups, splits, chunk, kg, cg, kout, cin, chan_fast):
    """The splits * P * groups GEMMs as one batched matmul problem: (m, n, k, keyword arguments of
    matmul.gemm_plan). C_z = M_z (kg x cg, row major, z = (s * P + b) * groups + g) = D_z^T U_z over the
    chunk's tiles; D's element (tile t, channel g * kg + o) of chunk s and position b is at
    ((s * P + b) * K + g * kg + o) * chunk + t ("tile" layout) or ((s * P + b) * chunk + t) * K + o
    ("chan" layout, one group), U's likewise with C and cg."""
    if chan_fast:  # opA[o][t] = D[z * chunk * K + t * K + o], opB[t][i] = U[z * chunk * C + t * C + i]
        kw = dict(trans_a=True, lda=kout, stride_a=chunk * kout, trans_b=False, ldb=cin, stride_b=chunk * cin)
    else:          # opA[o][t] = D[(z * kg + o) * chunk + t], opB[t][i] = U[(z * cg + i) * chunk + t]
        kw = dict(trans_a=False, lda=chunk, stride_a=kg * chunk, trans_b=True, ldb=chunk, stride_b=cg * chunk)
    return kg, cg, chunk, dict(**kw, ldc=cg, stride_c=kg * cg, batch=splits * pos * groups)


def _wgrad_gemm_problem(pb, tiles_per_chunk, z, kg, cg):
    """Double data: the GEMMs as one grouped 1x1 backward filter (z groups, n = the chunk's tiles) on the
    family's CUDA-core kernel, over the "tile" layout: x = U (channel stride chunk), dy = D, dw = M."""
    return _grouped_1x1(pb, tiles_per_chunk, z, cg, kg, (1, tiles_per_chunk), (1, tiles_per_chunk))


class WinogradWgradPlan(StepPlan):
    def launch(self, handle, a_ptr, b_ptr, out_ptr, ws_ptr, alpha, beta, z_ptr=0, bias_ptr=0):
        """a_ptr = dy, b_ptr = x, out_ptr = dw (plans.run_plan's backward-filter order)."""
        px, pd, pf = self.px, self.pd, self.pf
        u, d, m = (ws_ptr + o for o in self.offsets)
        px.in_, px.u = b_ptr, u
        pd.in_, pd.u = a_ptr, d
        pf.m, pf.out, pf.alpha, pf.beta = m, out_ptr, alpha, beta
        pf.flags = self.base_flags | (FLAG_BETA if beta != 0 else 0)
        self.run_step(handle, 0)   # U = B^T x B
        self.run_step(handle, 1)   # D = A dy A^T
        if self.mm is not None:
            self.mm.launch(handle, d, u, m)
        else:
            self.sub.run(handle, d, u, m, 1.0, 0.0)
        self.run_step(handle, 2)   # dw = G^T (sum of the partials) G

    def estimate_ms(self, handle, base_estimate):
        gemm = base_estimate(handle, self.sub.plan) if self.mm is None else self.gemm_ms
        t = gemm + self.moved / (TRANSFORM_GBPS * 1e6) + 3 * LAUNCH_MS
        return t * HALF_DATA_SCALE if self.itemsize == 2 else t


def plan_winograd_wgrad(handle, pb, algo):
    """A BWD_FILTER_ALGO_WINOGRAD_NONFUSED plan or NOT_SUPPORTED with the reason."""
    why = wgrad_refusal(pb)
    if why:
        raise PydnnError(NS, f"algo: {why}")
    double = pb.dtype == E.PYDNN_DATA_DOUBLE
    acc = 8 if double else 4
    tile = wgrad_tile(pb)
    pos = (tile + 2) ** 2
    oh, ow = pb.out3[1:]
    th, tw = cdiv(oh, tile), cdiv(ow, tile)
    tiles = pb.n * th * tw
    splits = _wgrad_splits(handle, pb, pos, tiles, acc)
    chunk = _wgrad_chunk(tiles, splits)
    splits = cdiv(tiles, chunk)
    layout = tuning.conv_winograd.WGRAD_LAYOUT or ("chan" if pb.xs[1] == 1 and pb.c > 1 else "tile")
    chan_fast = layout == "chan" and pb.groups == 1 and not double
    padded = splits * chunk
    sizes = (pos * padded * pb.c * acc, pos * padded * pb.k * acc, splits * pos * pb.k * pb.cg * acc)
    pl = WinogradWgradPlan(DIR_BWD_FILTER, algo, pb)
    pl.tile, pl.splits, pl.chunk, pl.layout = tile, splits, chunk, "chan" if chan_fast else "tile"
    pl.offsets = (0, round_up(sizes[0]), round_up(sizes[0]) + round_up(sizes[1]))
    pl.workspace = pl.offsets[2] + round_up(sizes[2])
    pl.gemm_flops = 2.0 * pos * tiles * pb.k * pb.cg
    pl.mm = pl.sub = None
    z = splits * pos * pb.groups
    if double:
        spb = _wgrad_gemm_problem(pb, chunk, z, pb.kg, pb.cg)
        pl.sub = SubGemm(planner(DIR_BWD_FILTER, E.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_0)(handle, spb, algo), spb)
    else:
        gm, gn, gk, kw = wgrad_view(pos, pb.groups, splits, chunk, pb.kg, pb.cg, pb.k, pb.c, chan_fast)
        pl.mm = MM.gemm_plan(handle, E.PYDNN_DATA_FLOAT, gm, gn, gk, **kw)
        pl.gemm_ms = _wgrad_gemm_ms(handle, pb.kg, pb.cg, z, chunk)
    pl.gemm = ConvParams()
    pl.gemm_expr = "winograd_wgrad"
    item = pl.itemsize
    # the transforms' own traffic: x and dy read, U and D written, the partials read, dw written
    pl.moved = ((prod(pb.in3) * pb.c + prod(pb.out3) * pb.k) * pb.n * item + sizes[0] + sizes[1] + sizes[2]
                + pb.k * pb.cg * 9 * item)
    s4 = lambda s: (s[0], s[1], s[3], s[4])  # noqa: E731
    unit = f"conv_winograd.{pb.tag}"
    steps = []
    for src, hw, chans, cg, pad in ((pb.xs, pb.in3[1:], pb.c, pb.cg, pb.pad3[1:]),
                                    (pb.ys, pb.out3[1:], pb.k, pb.kg, (0, 0))):
        p = WinoParams()
        p.batch, p.groups, p.cin_g, p.tiles_h, p.tiles_w = pb.n, pb.groups, cg, th, tw
        p.tiles, p.chunk = padded, chunk
        p.in_h, p.in_w, p.pad_h, p.pad_w = hw[0], hw[1], pad[0], pad[1]
        for i, v in enumerate(s4(src)):
            p.is_[i] = v
        if chan_fast:   # [s][b][t][c]
            p.u_m, p.u_c, p.u_b = chans, 1, chunk * chans
        else:           # [s][b][c][t]
            p.u_m, p.u_c, p.u_b = 1, chunk, chans * chunk
        p.u_s = pos * chans * chunk
        steps.append((p, padded * chans))
    pf = WinoParams()
    pf.groups, pf.cin_g, pf.cout_g, pf.splits = pb.groups, pb.cg, pb.kg, splits
    for i, v in enumerate(s4(pb.ws)):
        pf.ws[i] = v
    steps.append((pf, pb.k * pb.cg))
    pl.px, pl.pd, pl.pf = steps[0][0], steps[1][0], pf
    pl.base_flags = FLAG_FLIP if pb.flip else 0
    for kernel, (p, n) in zip(("input_transform", "grad_transform", "filter_grad"), steps):
        # filter_grad's threads are few (K * C/g: 4096 at 56^2) and each reads S * P partials in turn:
        # blocks of 64 spread them over 4x the SMs where 256-thread blocks would leave most SMs idle
        t = 64 if kernel == "filter_grad" and n < 2 * 256 * max(handle.sm_count, 1) else 256
        pl.add_step(unit, _expr(kernel, pb.tag, tile), (cdiv(n, t), 1, 1), (t, 1, 1), p)
    return pl


@register(DIR_FWD, E.PYDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED)
@register(DIR_BWD_DATA, E.PYDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED)
def plan_transformed(handle, pb, direction, algo):
    return plan_winograd(handle, pb, direction, algo)


@register(DIR_BWD_FILTER, E.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED)
def plan_filter_gradient(handle, pb, direction, algo):
    return plan_winograd_wgrad(handle, pb, algo)


def kernel_units():
    """This module's kernel units."""
    return _family_units("conv_winograd.")
