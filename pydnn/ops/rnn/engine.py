"""cudnnRNNForward / cudnnRNNBackwardData_v8 / cudnnRNNBackwardWeights_v8 and the size queries, with the
STANDARD algorithm:

  per layer and direction: one GEMM for the input projection of every step (pydnn.ops.matmul: [T*B, in] x
  [in, G*H]), then per step the recurrent GEMM ([B, out] x [out, G*H]) and one fused cell kernel
  (ptx/rnn.cu fwd_cell: gates, f32 state, h, the layer output; rows past their sequence's length carry
  the state). The LSTM projection is one more GEMM per step and a commit kernel. The two directions of a
  bidirectional layer (without a projection) step together: one GEMM batched over them and one cell launch
  (gridDim.y = 2). Backward data walks the
  steps in reverse with the mirror-image kernels (bwd_cell: pre-activation gradients, f32 dc and carried
  dh) and the recurrent GEMM [B, G*H] x [G*H, out]; dx of each layer is one GEMM; backward weights are one
  GEMM per matrix over all steps and two deterministic column-sum passes per bias.

double (STANDARD only): the GEMMs on ptx/gemm_f64.cu (pydnn/ops/rnn/gemm_f64.py: pydnn's matmul has no double),
the cells' state, gate values, carried gradients and bias partial sums in double (the "f32" buffers below are of
the state type: float, double for double; Geometry.ss).

The layer wavefront (tuning.rnn.WAVEFRONT; multi-layer unidirectional, LSTM projections included): the forward and
RNNBackwardData_v8 step all layers together, layer l lagging layer l - 1 by WAVE_CHUNK steps (see _fwd_wavefront /
_bwd_wavefront).

Internally data is sequence-major and padded ([T, B, width], padding rows 0); x is gathered from (and y
scattered to) the user's layout by one kernel. States are kept per time index: h_prev of time t is state
index t (forward direction) or t + 1 (reverse), its output t + 1 (forward) or t (reverse); index 0
(forward) / T (reverse) holds hx. The f32 state holds c (LSTM) or h (GRU).

Workspace (regions 256-byte aligned): x gathered [T*B, inputSize]; the input projections [dirs][T*B, G*H];
the recurrent projection [split_f][B, G*H] (split-K partial sums, see split_k); the projected h [B, out];
inference only: two layer outputs [T*B, dirs*out], two states per direction (dtype [B, out] and f32 [B, H]), m [B, H]; training only (the backward
calls' scratch): two layer gradients [T*B, max(dirs*out, inputSize)], per direction f32 dh [B, out], its
recurrent share [split_b][B, out] and f32 dc [B, H], dm [B, H], the bias gradients' f32 partial sums [BIAS_CHUNKS, G*H].
Reserve space (training), per pseudo-layer: states dtype [T+1, B, out] and f32 [T+1, B, H], the gate values
f32 [T*B, GA*H] (GA = 4 for LSTM and GRU: i f g o / r z n (R_n h + b_Rn); 1 for RNN: h), m [T*B, H]
(projection), then written by BackwardData: input pre-activation gradients [T*B, G*H], recurrent ones (GRU)
[T*B, G*H], dh [T*B, out] (projection); per layer: the layer output [T*B, dirs*out], and with dropout
between layers (training, probability > 0, every layer but the last) the dropped output (the next layer's
input) and DropoutForward's mask bits (ceil(T*B*dirs*out / 8) bytes, its reserve-space layout).
"""
import os

from ... import enums as E
from ... import tuning
from ..._cuda import driver
from ...buffers import device_ptr
from ...handle import check_handle
from ...status import PydnnError, api
from ...tensor import TensorDescriptor, _int
from .. import matmul
from ..common import TAG, cdiv, element_aligned, enum_arg
from . import gemm_f64
from . import kernels as K
from . import persist
from .descriptors import GRU, LSTM, PROJ_ID, _bad, _ns, set_data, set_rnn

ALIGN = 256
CHECKED = os.environ.get("PYDNN_CHECKED", "0") == "1"
FWD_MODES = (E.PYDNN_FWD_MODE_INFERENCE, E.PYDNN_FWD_MODE_TRAINING)
WGRAD_MODES = (E.PYDNN_WGRAD_MODE_ADD, E.PYDNN_WGRAD_MODE_SET)
GPU_DTYPES = (E.PYDNN_DATA_FLOAT, E.PYDNN_DATA_HALF, E.PYDNN_DATA_BFLOAT16, E.PYDNN_DATA_DOUBLE)


def _up(n):
    return -(-n // ALIGN) * ALIGN


class _Regions:
    """Byte offsets of named regions, each ALIGN-aligned."""

    def __init__(self):
        self.off, self.size = {}, 0

    def add(self, name, nbytes):
        if nbytes > 0:
            self.off[name] = self.size
            self.size += _up(nbytes)

    def __getitem__(self, name):
        return self.off[name]


# Split-K of the per-step recurrent GEMMs (M = batch rows only): when even the smallest (64 x 64) tiles
# leave SMs idle, K is cut into up to 8 batched slices (each >= 256 long, 16-byte aligned) whose partial
# sums the cell kernels add. The backward's [B, out] = [B, G*H] x [G*H, out] GEMM is the main case (B 64,
# out 1024: 16 tiles for 132 SMs). SPLIT_K = False turns it off (for measurements).
# SPLIT_K: a switch, pydnn.tuning.rnn.SPLIT_K (default True)
SPLIT_MAX = 8
SPLIT_MIN_K = 256  # the shortest K slice
WAVE_AUTO_MACS = 1 << 25  # tuning.rnn.WAVEFRONT None (auto): the largest step (B * G*H * out MACs) it takes
WAVE_SPLIT_K0 = 512  # the wavefront's auto split (Geometry.wave_split): a GEMM launch's fixed cost as K elements
# DIR_BATCH: the two directions of a bidirectional layer step together (see _fwd_steps_both); False: one
# after the other (for measurements)
# DIR_BATCH: a switch, pydnn.tuning.rnn.DIR_BATCH (default True)


# float: the recurrent GEMMs run on matmul's CUDA-core kernel, whose smallest tile is 64 x 128 and whose chooser
# takes the 128 x 128 one for these M = batch GEMMs (issue 16's fp32 LSTM: [64, 4096] x [4096, 1024]^T): counted
# as 64 x 64 tiles, the forward's split stopped at 2, 64 blocks for 132 SMs (half the SMs idle for the GEMM that
# is most of an fp32 step), the backward's [64, 1024] at 8 tiles x 8 = 64 blocks. So for float the blocks are
# counted with the tile the chooser takes (matmul._choose_simt_tile at that split and K).
# tuning.rnn.SPLIT_F32_TIME (default): the split with the least estimated step time (_f32_split_cost): the
# busiest SM's tiles at their full size (a 128-row tile at batch 64 computes 64 rows for nothing), a per-tile
# prologue / epilogue, and the partial sums the cell kernel reads back. Issue 16's fp32 LSTM: forward 8 slices
# (K 128) on 64 x 128 tiles, 2 per SM and no row wasted, against 4 slices of 128 x 128 tiles (half their rows
# past the batch: twice the FMA work per SM); backward 32 slices (64 x 128) against 16 (128 x 128).
# Off: up to 16 slices while the blocks fill the SMs (forward 4, backward 16), K slices >= SPLIT_MIN_K.
# SPLIT_F32_TIME: a switch, pydnn.tuning.rnn.SPLIT_F32_TIME (default True)
SPLIT_MAX_F32 = 16
SPLIT_MAX_F32_TIME = 32
SPLIT_MIN_K_F32_TIME = 128
F32_TILE_OVERHEAD_K = 32  # a tile's prologue and epilogue, as K steps of its FMA work
F32_PART_COST = 25        # one partial sum written by the GEMM and read by the cell, in FMAs of one SM's time


def _f32_split_cost(m, n, k, s, sm_count):
    """Estimated time of the float recurrent GEMM at s K slices plus the cell's reads of its partial sums, in
    FMAs of the busiest SM: its tiles (cdiv(items, SMs)) each bm x bn x (k / s + overhead) at the tile's
    efficiency, slower where its resident warps are fewer than 8 (a lone 4-warp block), plus s * m * n / SMs
    partial sums at F32_PART_COST each."""
    kk = k // s
    t = matmul._choose_simt_tile(m, n, s, sm_count, kk)
    items = cdiv(m, t.bm) * cdiv(n, t.bn) * s
    per_sm = cdiv(items, sm_count)
    rate = min(1.0, min(per_sm, t.per_sm) * t.wm * t.wn / 8.0)
    eff = t.eff_short if kk <= matmul.SHORT_K else t.eff
    return per_sm * t.bm * t.bn * (kk + F32_TILE_OVERHEAD_K) / (eff * rate) + F32_PART_COST * s * m * n / sm_count


def split_k(m, n, k, sm_count, f32=False):
    if not tuning.rnn.SPLIT_K or not sm_count:
        return 1
    if f32 and tuning.rnn.SPLIT_F32_TIME:
        best, best_cost = 1, _f32_split_cost(m, n, k, 1, sm_count)
        s = 2
        while s <= SPLIT_MAX_F32_TIME and k % (16 * s) == 0 and k // s >= SPLIT_MIN_K_F32_TIME:
            c = _f32_split_cost(m, n, k, s, sm_count)
            if c < best_cost:
                best, best_cost = s, c
            s *= 2
        return best
    if f32:
        def blocks(s):
            t = matmul._choose_simt_tile(m, n, s, sm_count, k // s)
            return cdiv(m, t.bm) * cdiv(n, t.bn) * s
        s = 1
        while (s < SPLIT_MAX_F32 and blocks(2 * s) <= sm_count and k % (16 * s) == 0
               and k // (2 * s) >= SPLIT_MIN_K):
            s *= 2
        return s
    blocks = cdiv(m, 64) * cdiv(n, 64)
    s = 1
    while s < SPLIT_MAX and 2 * s * blocks <= sm_count and k % (16 * s) == 0 and k // (2 * s) >= SPLIT_MIN_K:
        s *= 2
    return s


class Geometry:
    """The sizes of one problem (an RNN descriptor and an x descriptor) and its space layouts (sm_count:
    the device's, for the split-K choice; the workspace size depends on it, the reserve space's does not)."""

    def __init__(self, r, x, sm_count=0):
        self.r, self.x = r, x
        self.T, self.B, self.I = x.max_seq, x.batch, x.vector
        self.N = self.T * self.B
        self.G, self.H, self.P, self.D, self.L = r.gates, r.hidden, r.out, r.dirs, r.layers
        self.es = r.esize
        # the state type's size (c / h, saved gates, carried gradients, bias partial sums): ptx/rnn.cu's
        # Acc<T>, float for float / half / bfloat16, double for double
        self.ss = ss = 8 if r.dtype == E.PYDNN_DATA_DOUBLE else 4
        self.GH = self.G * self.H
        self.GA = 4 if r.cell in (LSTM, GRU) else 1
        self.s32 = r.cell in (LSTM, GRU)
        # dropout between layers (training): each layer's output but the last, through DropoutForward
        self.drop = r.dropout is not None and r.dropout.dropout > 0 and r.layers > 1
        self.mask_bytes = (self.N * r.dirs * r.out + 7) // 8
        # both directions of a bidirectional layer step together (not with a projection)
        self.dir_batch = tuning.rnn.DIR_BATCH and r.dirs == 2 and not r.proj
        # the layer wavefront (forward, see _fwd_wavefront): layer l runs step t at wave t + l * wave_chunk
        # (dropout between layers: per chunk of rows, whose mask bytes must start on a byte: B * out % 8 == 0)
        self.wave = wavefront_ok(r, self.B) and (not self.drop or self.B * r.out % 8 == 0)
        self.wave_chunk = max(1, int(tuning.rnn.WAVE_CHUNK))
        # RNNBackwardData_v8 as the wavefront too: WAVE_BWD True, or None (auto) where a layer's step is small
        # (the chunked dx GEMMs cost more than the launches saved on large steps: mid-session H200, LSTM fp32 2L
        # B 64 H 1024 backward 35.4 ms as the wavefront against 32.7 layer after layer; fp16 10.05 against 9.94),
        # and for LSTM projection stacks (four launches a layer-step merged, the chunked dx GEMMs' N = P: H200,
        # LSTM fp16 2L B 64 H 1024 P 512 backward 14.7 ms as the wavefront against 18.7 layer after layer)
        wb = tuning.rnn.WAVE_BWD
        self.wave_bwd = self.wave and (wb is True or (wb is None and (bool(r.proj) or step_macs(r, self.B)
                                                                      <= WAVE_AUTO_MACS)))
        f32 = r.dtype == E.PYDNN_DATA_FLOAT
        self.split_f = 1 if self.dir_batch else split_k(self.B, self.G * r.hidden, r.out, sm_count, f32)
        force = tuning.rnn.SPLIT_F32_FWD  # measurements: the float forward's split, where it divides K in 16s
        if f32 and force and not self.dir_batch and tuning.rnn.SPLIT_K and r.out % (16 * force) == 0:
            self.split_f = force
        self.split_b = split_k(self.B, r.out, self.G * r.hidden, sm_count, f32)
        # the projection GEMM's K slices (tuning.rnn.PROJ_SPLIT, where they divide hidden in multiples of 16; None:
        # split_k's block-count rule for [B, P] x K = hidden)
        sp = tuning.rnn.PROJ_SPLIT
        sp = split_k(self.B, r.out, r.hidden, sm_count, f32) if sp is None and r.proj else int(sp or 1)
        self.split_p = sp if r.proj and sp > 1 and r.hidden % (16 * sp) == 0 else 1
        # the backward wavefront's recurrent GEMMs: one split for every wave (a layer's partial sums are read by
        # the next wave's cell launch, which has one nsplit for all its layers)
        self.sm_count = sm_count
        self.wave_split_b = self.split_b if self.wave_bwd and self.wave_split(self.B, r.out, self.G * r.hidden,
                                                                           self.split_b, self.wave_max()) else 1
        es, N, B, H, P, D, GH = self.es, self.N, self.B, self.H, self.P, self.D, self.GH
        self.persist = r.algo == E.PYDNN_RNN_ALGO_PERSIST_STATIC
        for training in (False, True):
            w = _Regions()
            w.add("bar", persist.BAR_BYTES if self.persist else 0)  # PERSIST_STATIC's grid barrier counters
            # PERSIST_STATIC's tagged h exchange [dirs][2][B, H] words (persist.py)
            w.add("xchg", r.dirs * persist.xchg_bytes(r.dtype, self.B, r.hidden) if self.persist else 0)
            w.add("xin", N * self.I * es)
            w.add("xp", D * N * GH * es)
            w.add("hp", max(self.split_f, D if self.dir_batch else 1,
                            self.L * (self.split_f if tuning.rnn.WAVE_SPLIT is not False else 1) if self.wave else 1)
                  * B * GH * es)
            # the wavefront's input projections of layers >= 1, one chunk of steps each
            w.add("xpw", (self.L - 1) * min(self.wave_chunk, self.T) * B * GH * es if self.wave else 0)
            WL = self.L if self.wave else 1  # the wavefront: the projection's buffers per layer
            w.add("hn", WL * self.split_p * B * P * es if r.proj else 0)
            if not training:
                w.add("ly", 2 * N * D * P * es)
                SL = self.L if self.wave else D  # the wavefront: every layer's states live at once
                w.add("hs", SL * 2 * B * P * es)
                w.add("s32", SL * 2 * B * H * ss if self.s32 else 0)
                w.add("m", WL * B * H * es if r.proj else 0)
            else:
                self.dw = max(D * P, self.I)
                w.add("dly", 2 * N * self.dw * es)
                # per direction, or per layer for the backward wavefront (its GEMMs split-K only with WAVE_SPLIT)
                SL = max(D, self.L if self.wave else 1)
                w.add("gh", SL * B * P * ss)
                w.add("ghrec", max(D * self.split_b, self.L * self.wave_split_b if self.wave else 1) * B * P * es)
                w.add("gc", SL * B * H * ss)
                w.add("dm", WL * B * H * es if r.proj else 0)
                w.add("bpart", K.BIAS_CHUNKS * self.GH * ss)
            if training:
                self.ws_train = w
            else:
                self.ws_inf = w
        rs = _Regions()
        T = self.T
        for pl in range(r.pseudo_layers):
            rs.add(("hs", pl), (T + 1) * B * P * es)
            rs.add(("s32", pl), (T + 1) * B * H * ss if self.s32 else 0)
            rs.add(("act", pl), N * self.GA * H * ss)
            rs.add(("m", pl), N * H * es if r.proj else 0)
            rs.add(("dxa", pl), N * GH * es)
            rs.add(("dha", pl), N * GH * es if r.cell == GRU else 0)
            rs.add(("dhall", pl), N * P * es if r.proj else 0)
        for layer in range(self.L):
            rs.add(("ly", layer), N * D * P * es)
            if self.drop and layer < self.L - 1:
                rs.add(("lyd", layer), N * D * P * es)
                rs.add(("mask", layer), self.mask_bytes)
        self.rs = rs

    def wave_max(self):
        """The most layers a wave of the wavefront runs at once."""
        return min(self.L, cdiv(self.T, min(self.wave_chunk, self.T)))

    def wave_split(self, m, n, k, split, layers):
        """Whether a wave's `layers` recurrent GEMMs ([m, k] x [k, n]) run one per layer with `split` K slices
        (tuning.rnn.WAVE_SPLIT True) instead of one batched over the layers with K whole (False). None (auto): a
        wave's time as a GEMM launch's fixed cost plus the K loop of its blocks (the step's latency at these small
        M): batched, one launch and a K loop of k; split, `layers` launches one after the other, each a loop of k /
        split. Split where k (1 - layers / split) > WAVE_SPLIT_K0 (layers - 1): the K loop it saves outweighs the
        launches it adds. Measured on the H200 (mid-session run, forward + backward, ms): LSTM fp16 2L B 64 H 1024
        backward (k 4096, split 8, 2 layers) split 10.1 / batched 19.5; GRU fp16 2L B 16 H 512 backward (k 1536,
        split 4) split 6.4 / batched 8.8; LSTM fp16 4L B 8 H 256 backward (k 1024, split 4, 4 layers) split 9.3 /
        batched 7.5; the forwards (split 2, 2 layers) batched: 7.35 / 8.75 and 4.26 / 5.35."""
        mode = tuning.rnn.WAVE_SPLIT
        if split <= 1 or mode is False:
            return False
        if mode is True:
            return True
        return layers < split and k * (1 - layers / split) > WAVE_SPLIT_K0 * (layers - 1)

    def workspace_size(self, training):
        return (self.ws_train if training else self.ws_inf).size

    def reserve_size(self, training):
        return self.rs.size if training else 0

    def weight(self, w, pl, kind, lin):
        """Device address of a weight-space part (0 when absent)."""
        regs, _ = self.r.pseudo_layer_regions(pl)
        e = regs.get((kind, lin))
        return 0 if e is None else w + e[0] * self.es


def _geometry(r, x, handle):
    return Geometry(r, x, handle.sm_count)


# ----------------------------------------------------------------------------- size queries

@api
def get_rnn_weight_space_size(handle, rnn_desc):
    """cudnnGetRNNWeightSpaceSize -> bytes of the weight space (see pydnn/ops/rnn/descriptors.py's layout)."""
    check_handle(handle)
    r = set_rnn(rnn_desc)
    return r.weight_elements() * r.esize


def _x_for(r, x_desc, name="xDesc"):
    x = set_data(x_desc, name)
    if x.dtype != r.dtype:
        _bad(f"{name}: data type {x.dtype} differs from the RNN descriptor's dataType {r.dtype}")
    if x.vector != r.input_size:
        _bad(f"{name}: vectorSize {x.vector} differs from the RNN descriptor's inputSize {r.input_size}")
    return x


@api
def get_rnn_temp_space_sizes(handle, rnn_desc, fwd_mode, x_desc):
    """cudnnGetRNNTempSpaceSizes -> (workSpaceSize, reserveSpaceSize) for fwdMode (INFERENCE: no reserve
    space). The training sizes serve RNNForward in training and both backward calls. BAD_PARAM: fwdMode,
    xDesc (its data type and vectorSize must match the RNN descriptor)."""
    check_handle(handle)
    r = set_rnn(rnn_desc)
    mode = enum_arg("fwdMode", fwd_mode, FWD_MODES, "pydnnForwardMode_t")
    g = _geometry(r, _x_for(r, x_desc), handle)
    training = mode == E.PYDNN_FWD_MODE_TRAINING
    if g.persist:
        persist.plan(handle, r, g, training)
    return g.workspace_size(training), g.reserve_size(training)


@api
def get_rnn_weight_params(handle, rnn_desc, pseudo_layer, weight_space_size, weight_space, lin_layer_id, m_desc,
                          b_desc):
    """cudnnGetRNNWeightParams -> (mAddr, bAddr): the device addresses of the matrix and the bias of
    (pseudoLayer, linLayerID), and mDesc / bDesc (either may be None) set to their dims: matrix (1, rows,
    cols), bias (1, rows, 1), packed, in the data type. A part that does not exist (SKIP_INPUT's input
    matrices of layer 0, biases the bias mode leaves out, the projection's bias, the projection without
    one) has address 0 (NULL) and its descriptor set to 0 dims. linLayerID: 0 .. G-1 input, G .. 2G-1
    recurrent (G = 1 RNN, 4 LSTM (i, f, g, o), 3 GRU (r, z, n)), 8 the LSTM projection. BAD_PARAM:
    pseudoLayer outside [0, layers * dirs), linLayerID outside the cell's, weightSpaceSize smaller than
    the weight space, a dead descriptor."""
    check_handle(handle)
    r = set_rnn(rnn_desc)
    pl = _int("pseudoLayer", pseudo_layer)
    if not 0 <= pl < r.pseudo_layers:
        _bad(f"pseudoLayer: {pl} is outside [0, {r.pseudo_layers}) (numLayers * directions)")
    lin = _int("linLayerID", lin_layer_id)
    if not 0 <= lin < r.lin_ids():
        _bad(f"linLayerID: {lin} is outside [0, {r.lin_ids()}) for cellMode {r.cell}")
    need = r.weight_elements() * r.esize
    size = _int("weightSpaceSize", weight_space_size)
    if size < need:
        _bad(f"weightSpaceSize: {size} is less than the {need} bytes of the weight space")
    for d, name in ((m_desc, "mDesc"), (b_desc, "bDesc")):
        if d is not None and (type(d) is not TensorDescriptor or not d.alive):
            _bad(f"{name}: not a live tensor descriptor")
    base = device_ptr(weight_space, "weightSpace", need) if need else 0
    regs, _ = r.pseudo_layer_regions(pl)
    out = []
    for kind, d in (("m", m_desc), ("b", b_desc)):
        e = regs.get((kind, lin))
        if e is None:
            if d is not None:
                d._assign(r.dtype, (), ())
            out.append(0)
            continue
        off, dims = e
        if d is not None:
            d._assign(r.dtype, dims, (dims[1] * dims[2], dims[2], 1))
        out.append(base + off * r.esize)
    return tuple(out)


@api
def build_rnn_dynamic(handle, rnn_desc, mini_batch):
    """cudnnBuildRNNDynamic: prepares PERSIST_DYNAMIC kernels in cuDNN. pydnn has no PERSIST_DYNAMIC
    algorithm: for that algo NOT_SUPPORTED; for the others nothing needs building (SUCCESS, nothing done).
    BAD_PARAM: miniBatch not positive."""
    check_handle(handle)
    r = set_rnn(rnn_desc)
    mb = _int("miniBatch", mini_batch)
    if mb < 1:
        _bad(f"miniBatch: {mb} must be positive")
    if r.algo == E.PYDNN_RNN_ALGO_PERSIST_DYNAMIC:
        _ns("rnnDesc: algo PYDNN_RNN_ALGO_PERSIST_DYNAMIC is not implemented in pydnn (STANDARD is)")


# ----------------------------------------------------------------------------- call validation

class _Call:
    __slots__ = ("r", "x", "g", "tag")


def _state_desc(d, name, dims, dtype, required=True):
    if d is None:
        if required:
            _bad(f"{name}: NULL descriptor")
        return None
    if type(d) is not TensorDescriptor or not d.alive:
        _bad(f"{name}: not a live tensor descriptor")
    if not d.is_set:
        _bad(f"{name}: descriptor was never set")
    if d.dtype != dtype:
        _bad(f"{name}: data type {d.dtype} differs from the RNN descriptor's dataType {dtype}")
    if tuple(d.dims) != tuple(dims):
        _bad(f"{name}: dims {tuple(d.dims)} must be (numLayers * directions, batch, size) = {tuple(dims)}")
    want = (dims[1] * dims[2], dims[2], 1)
    if tuple(d.strides) != want:
        _bad(f"{name}: strides {tuple(d.strides)} must be the packed {want}")
    return d


def _validate(r, x_desc, y_desc, h_desc, c_desc, xname="xDesc", yname="yDesc", check_c=True):
    x = _x_for(r, x_desc, xname)
    if y_desc is not None:
        y = set_data(y_desc, yname)
        if y.dtype != r.dtype:
            _bad(f"{yname}: data type {y.dtype} differs from the RNN descriptor's dataType {r.dtype}")
        if (y.layout, y.max_seq, y.batch, y.lengths) != (x.layout, x.max_seq, x.batch, x.lengths):
            _bad(f"{yname}: layout, maxSeqLength, batchSize and seqLengthArray must equal {xname}'s")
        if y.vector != r.dirs * r.out:
            _bad(f"{yname}: vectorSize {y.vector} must be directions * {'projSize' if r.proj else 'hiddenSize'}"
                 f" = {r.dirs * r.out}")
    _state_desc(h_desc, "hDesc", (r.pseudo_layers, x.batch, r.out), r.dtype)
    if check_c:
        _state_desc(c_desc, "cDesc", (r.pseudo_layers, x.batch, r.hidden), r.dtype, required=r.cell == LSTM)
    return x


def _gpu_support(r, training):
    if r.algo not in (E.PYDNN_RNN_ALGO_STANDARD, E.PYDNN_RNN_ALGO_PERSIST_STATIC):
        _ns(f"rnnDesc: algo {r.algo} is not implemented in pydnn (PYDNN_RNN_ALGO_STANDARD and PERSIST_STATIC are; "
            "PERSIST_DYNAMIC is not)")
    if r.dtype not in GPU_DTYPES:
        _ns(f"rnnDesc: dataType {r.dtype} has no GPU path (float, half, bfloat16, double)")
    if r.dtype == E.PYDNN_DATA_DOUBLE and r.algo != E.PYDNN_RNN_ALGO_STANDARD:
        _ns(f"rnnDesc: dataType PYDNN_DATA_DOUBLE runs on the plain path only (algo PYDNN_RNN_ALGO_STANDARD), "
            f"not algo {r.algo}")


def _ptr(buf, name, nbytes, align):
    p = device_ptr(buf, name, nbytes)
    if p % align:
        _bad(f"{name}: {p:#x} is not {align}-byte aligned", E.PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER)
    return p


def _opt(buf, name, nbytes, align):
    if buf is None or (type(buf) is int and buf == 0):
        return 0
    return _ptr(buf, name, nbytes, align)


def _space(buf, size, need, name, size_name):
    n = _int(size_name, size)
    if n < need:
        _bad(f"{size_name}: {n} is less than the {need} bytes this call needs")
    return _ptr(buf, name, need, ALIGN) if need else 0


def _lens(buf, x):
    p = _opt(buf, "devSeqLengths", 4 * x.batch, 4)
    if not p:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM_NULL_POINTER, "devSeqLengths: NULL pointer (the int32 device "
                         "copy of the lengths is required)")
    if CHECKED:
        import ctypes

        from ..._cuda import driver
        host = (ctypes.c_int32 * x.batch)()
        driver.memcpy_dtoh(ctypes.addressof(host), p, 4 * x.batch)
        for i, (a, b) in enumerate(zip(host, x.lengths)):
            if a != b:
                _bad(f"devSeqLengths[{i}]: {a} differs from the descriptor's seqLengthArray[{i}] {b}"
                     + (f" (outside [1, {x.max_seq}])" if not 1 <= a <= x.max_seq else ""))
    return p


def _launcher(handle, tag):
    key = ("rnn.launcher", tag)
    lau = handle.prepared.get(key)
    if lau is None:
        lau = handle.remember(key, K.Launcher(handle, tag))
    return lau


# Each call's launches (kernel, grid, block, a params struct of its own) are recorded in the handle, keyed
# by the problem (the descriptors' contents) and every pointer and scalar of the call; the same call again
# replays them: one cuLaunchKernel each and no Python per step (a 2-layer LSTM of 256 steps is about a
# thousand launches). RECORD = False launches without recording (each call rebuilds its launches).
# RECORD: a switch, pydnn.tuning.rnn.RECORD (default True)


def _gemm_params(plan, a, b, c, beta):
    """The launch GemmPlan.launch (pydnn/ops/matmul.py) would make for these int pointers, with a params
    struct of its own (the plan's is shared by every launch of the plan): its checks, its kernel choice."""
    es = plan.esize
    c = element_aligned(c, "c", es)
    if plan.k:
        a, b = element_aligned(a, "a", es), element_aligned(b, "b", es)
        matmul._no_overlap(c, plan.span_c * es, a, plan.span_a * es, "a")
        matmul._no_overlap(c, plan.span_c * es, b, plan.span_b * es, "b")
    else:
        a = b = 0
    flags = matmul.FLAG_BETA if beta != 0.0 else 0
    if plan.pair_ok and c % (2 * es) == 0:
        flags |= matmul.FLAG_PAIR
    rec = plan.fast if (plan.vec_ok and (a | b) & 15 == 0) else plan.general
    p = matmul.MatmulParams.from_buffer_copy(rec.params)
    p.a, p.b, p.c, p.bias = a, b, c, 0
    p.alpha, p.beta, p.flags = 1.0, beta, flags
    return rec, p


def _launch(handle, f, grid, block, smem, args, meta):
    """One launch on the handle's stream (meta: ("rnn", kernel, cell) or ("gemm", trans_a, trans_b, m, n,
    k) for the tests' CPU emulation, which replaces this function), or ("call", fn, args): a call of another
    family's API (dropout between layers), made again on every replay."""
    if meta[0] == "call":
        meta[1](*meta[2])
        return
    driver.launch_args(f, grid, block, smem, handle.cu_stream, args)


class _Exec:
    """Launches one call's kernels and GEMMs (recording them when `record`)."""

    def __init__(self, handle, r, record):
        self.handle, self.dtype = handle, r.dtype
        self.lau = _launcher(handle, TAG[r.dtype])
        self.items = [] if record else None

    def reset(self):
        return self.lau.reset()

    def launch(self, name, threads, cell=None, blocks=None, grid_y=1):
        lau = self.lau
        f = self.handle.function(K.unit_name(lau.tag), K.expr(name, lau.tag, cell))
        grid = (blocks if blocks is not None else max(1, cdiv(threads, K.THREADS)), grid_y, 1)
        args = lau.args if self.items is None else driver.kernel_args(K.RnnParams.from_buffer_copy(lau.p))
        self._go(f, grid, (K.THREADS, 1, 1), 0, args, ("rnn", name, cell))

    def gemm(self, m, n, k, a, b, c, beta=0.0, trans_a=False, trans_b=False, lda=None, ldb=None, batch=1, stride_a=0,
             stride_b=0, stride_c=0, cached=True):
        """cached=False: a plan of its own, not kept in the handle (the batched-direction GEMMs: a new stride
        at every step; the recorded launch keeps what the replays need)."""
        if self.dtype == E.PYDNN_DATA_DOUBLE:  # pydnn's matmul has no double: ptx/gemm_f64.cu
            key = ("rnn.gemm_f64", m, n, k, trans_a, trans_b, lda, ldb, batch, stride_a, stride_b, stride_c)
            pl = self.handle.prepared.get(key) if cached else None
            if pl is None:
                pl = gemm_f64.Plan(m, n, k, trans_a, trans_b, lda, ldb, None, batch, stride_a, stride_b, stride_c)
                if cached:
                    self.handle.remember(key, pl)
            self._go(pl.function(self.handle), pl.grid, pl.block, 0, driver.kernel_args(pl.params(a, b, c, 1.0, beta)),
                     ("gemm", trans_a, trans_b, m, n, k))
            return
        plan = (matmul.cached_plan if cached else matmul.gemm_plan)(
            self.handle, self.dtype, m, n, k, trans_a, trans_b, lda, ldb, None, batch, stride_a, stride_b, stride_c)
        if plan.empty:
            return
        rec, params = _gemm_params(plan, a, b, c, beta)
        self._go(rec.function(self.handle), rec.grid, rec.block, rec.smem, driver.kernel_args(params),
                 ("gemm", trans_a, trans_b, m, n, k))

    def call(self, fn, *args):
        self._go(None, None, None, 0, None, ("call", fn, args))

    def _go(self, f, grid, block, smem, args, meta):
        if self.items is not None:
            self.items.append((f, grid, block, smem, args, meta))
        _launch(self.handle, f, grid, block, smem, args, meta)


def _flat_desc(handle, dtype, rows, cols):
    """A [rows, cols] packed tensor descriptor (kept in the handle: the dropout plans are keyed by it)."""
    key = ("rnn.flat", dtype, rows, cols)
    d = handle.prepared.get(key)
    if d is None:
        d = TensorDescriptor()
        d._assign(dtype, (rows, cols), (cols, 1))
        handle.remember(key, d)
    return d


def _dropout():
    from ..dropout import dropout_backward, dropout_forward
    return dropout_forward, dropout_backward


def _rnn_key(r):
    return (r.algo, r.cell, r.bias_mode, r.dir_mode, r.input_mode, r.dtype, r.math_prec, r.math_type, r.input_size,
            r.hidden, r.proj_size, r.layers, r.clip_mode, r.clip_nan, r.lclip, r.rclip, id(r.dropout),
            r.dropout is not None and r.dropout.dropout > 0)


def _run(handle, r, g, fn, *args):
    """fn(exec, r, g, *args), or the replay of its recorded launches for the same problem and arguments."""
    key = None
    if tuning.rnn.RECORD:
        x = g.x
        key = ("rnn.call", fn.__name__, _rnn_key(r), (x.dtype, x.layout, x.max_seq, x.batch, x.vector, x.lengths),
               args, g.wave and (g.wave_chunk, tuning.rnn.WAVE_SPLIT, tuning.rnn.WAVE_BWD), g.split_p,
               g.persist and persist.record_key(), g.split_f, g.split_b)
        items = handle.prepared.get(key)
        if items is not None:
            for f, grid, block, smem, a, meta in items:
                _launch(handle, f, grid, block, smem, a, meta)
            return
    ex = _Exec(handle, r, key is not None)
    fn(ex, r, g, *args)
    if key is not None:
        handle.remember(key, ex.items)


# ----------------------------------------------------------------------------- forward

@api
def rnn_forward(handle, rnn_desc, fwd_mode, dev_seq_lengths, x_desc, x, y_desc, y, h_desc, hx, hy, c_desc, cx, cy,
                weight_space_size, weight_space, work_space_size, work_space, reserve_space_size, reserve_space):
    """cudnnRNNForward: y (and hy, cy: each NULL-able, as hx and cx) from x. INFERENCE needs no reserve
    space; TRAINING fills it for the backward calls. devSeqLengths: the lengths as int32 in device memory
    (read by the kernels; compared with xDesc's in PYDNN_CHECKED=1 mode). Outputs past each sequence's
    length are yDesc's padding fill (unpacked layouts; untouched without a fill). hy / cy: each sequence's
    state after its own last step. BAD_PARAM: descriptors that disagree (data type, vector sizes, lengths,
    hDesc / cDesc dims (layers * dirs, batch, size) packed), spaces smaller than asked, fwdMode;
    NOT_SUPPORTED: algorithms other than STANDARD and PERSIST_STATIC, double data with PERSIST_STATIC. Dropout between layers (training only): the
    dropout descriptor's DropoutForward on each layer's output but the last (a new mask per call, from the
    descriptor's states), its mask kept in the reserve space for the backward calls."""
    check_handle(handle)
    r = set_rnn(rnn_desc)
    mode = enum_arg("fwdMode", fwd_mode, FWD_MODES, "pydnnForwardMode_t")
    training = mode == E.PYDNN_FWD_MODE_TRAINING
    xd = _validate(r, x_desc, y_desc, h_desc, c_desc)
    _gpu_support(r, training)
    g = _geometry(r, xd, handle)
    if g.persist:
        persist.plan(handle, r, g, training)
    es = g.es
    lens = _lens(dev_seq_lengths, xd)
    xp = _ptr(x, "x", xd.span_bytes(), es)
    yp = _ptr(y, "y", set_data(y_desc, "yDesc").span_bytes(), es)
    hbytes, cbytes = g.L * g.D * g.B * g.P * es, g.L * g.D * g.B * g.H * es
    hxp, hyp = _opt(hx, "hx", hbytes, es), _opt(hy, "hy", hbytes, es)
    lstm = r.cell == LSTM
    cxp = _opt(cx, "cx", cbytes, es) if lstm else 0
    cyp = _opt(cy, "cy", cbytes, es) if lstm else 0
    wp = _space(weight_space, weight_space_size, r.weight_elements() * es, "weightSpace", "weightSpaceSize")
    wsp = _space(work_space, work_space_size, g.workspace_size(training), "workSpace", "workSpaceSize")
    rsp = _space(reserve_space, reserve_space_size, g.reserve_size(training), "reserveSpace", "reserveSpaceSize")
    _run(handle, r, g, _run_forward, training, lens, xp, yp, set_data(y_desc, "yDesc").fill, hxp, hyp, cxp, cyp, wp,
         wsp, rsp)


def _pack(lau, g, lens, src, dst, vec, layout, mode, fill=0.0):
    p = lau.reset()
    p.lens, p.aux_in, p.aux = lens, src, dst
    p.seq, p.batch, p.vec, p.layout, p.mode, p.fill = g.T, g.B, vec, layout, mode, fill
    lau.launch("pack", 0, blocks=g.N)


def _state_index(g, d, t):
    """(index of h_prev, index of h_out) of time t in direction d."""
    return (t, t + 1) if d == 0 else (t + 1, t)


class _Dir:
    """One direction of one layer in a call: its weights and where its states live."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


def _dir2(p, ptrs0, ptrs1, t1, y=1):
    """Fill p.dir2[y - 1] so that blocks with blockIdx.y = y see ptrs1 (the reverse direction, or another layer
    of a wave) at time t1."""
    d2 = p.dir2[y - 1]
    for name, a in ptrs0.items():
        b = ptrs1[name]
        if (a == 0) != (b == 0):
            raise AssertionError(f"rnn: {name} is NULL in one direction only")
        setattr(d2, name, b - a if a else 0)
    d2.t = t1


def _fwd_cell_ptrs(g, dr, t, ly, training):
    """The pointer fields of fwd_cell for direction dr at time t (without a projection)."""
    es, B, H, P, D, GH = g.es, g.B, g.H, g.P, g.D, g.GH
    ip, io = _state_index(g, dr.d, t)
    if hasattr(dr, "xp_at"):  # the wavefront: layers >= 1 read their chunk buffer
        xp = dr.xp_at(t)
    elif dr.w_in:
        xp = dr.xpd + t * B * GH * es
    else:
        xp = dr.inp + t * B * dr.inp_w * es
    return dict(xp=xp, hp=dr.hp, bw=dr.b_in, br=dr.b_rec, h_prev=dr.hs_at(ip), h_out=dr.hs_at(io),
                s_prev=dr.s_at(ip), s_out=dr.s_at(io), y=ly + (t * B * D * P + dr.d * P) * es,
                act=dr.act0 + t * B * g.GA * H * g.ss if training else 0)


def _fwd_steps(lau, r, g, dr, ly, training, lens, wsp, rsp, ws, clip):
    """The recurrence of one direction: per step the recurrent GEMM (split-K), the cell kernel, and with a
    projection its GEMM and the commit kernel."""
    es, T, B, H, P, D, GH = g.es, g.T, g.B, g.H, g.P, g.D, g.GH
    rs = g.rs
    for s in range(T):
        t = s if dr.d == 0 else T - 1 - s
        ip, io = _state_index(g, dr.d, t)
        sf = g.split_f  # K = out in sf slices: partial sums sf * [B, G*H] apart
        lau.gemm(B, GH, P // sf, dr.hs_at(ip), dr.w_rec, dr.hp, trans_b=True, lda=P, ldb=P, batch=sf,
                 stride_a=P // sf, stride_b=P // sf, stride_c=B * GH)
        p = lau.reset()
        for name, v in _fwd_cell_ptrs(g, dr, t, ly, training).items():
            setattr(p, name, v)
        p.ld_xp, p.gs_xp = (GH, H) if dr.w_in else (dr.inp_w, 0)  # SKIP_INPUT: x itself enters every gate
        p.nsplit, p.split_stride, p.ld_y = sf, B * GH, D * P
        if r.proj:
            m_t = rsp + rs[("m", dr.pl)] + t * B * H * es if training else wsp + ws["m"]
            p.h_out, p.y = m_t, 0
        p.lens, p.t, p.batch, p.hidden, p.out = lens, t, B, H, P
        if clip:
            p.clip, p.lclip, p.rclip = 1, clip[0], clip[1]
        lau.launch("fwd_cell", B * H, cell=r.cell)
        if r.proj:
            _proj_gemm(lau, g, m_t, dr.w_proj, wsp + ws["hn"])
            p = lau.reset()
            p.aux_in, p.h_prev, p.h_out = wsp + ws["hn"], dr.hs_at(ip), dr.hs_at(io)
            p.nsplit, p.split_stride = g.split_p, B * P
            p.y, p.ld_y = ly + (t * B * D * P + dr.d * P) * es, D * P
            p.lens, p.t, p.batch, p.hidden, p.out = lens, t, B, H, P
            lau.launch("proj_commit", B * P)


def _proj_gemm(lau, g, m_t, w_proj, hn):
    """hn = m_t [B, H] x P^T: K whole (the call of before), or in g.split_p K slices, partial sums B * P apart."""
    B, H, P, sp = g.B, g.H, g.P, g.split_p
    if sp > 1:
        lau.gemm(B, P, H // sp, m_t, w_proj, hn, trans_b=True, lda=H, ldb=H, batch=sp, stride_a=H // sp,
                 stride_b=H // sp, stride_c=B * P)
    else:
        lau.gemm(B, P, H, m_t, w_proj, hn, trans_b=True)


def _fwd_steps_both(lau, r, g, dirs, ly, training, lens, hp, clip):
    """Both directions of a bidirectional layer (no projection) step by step together: one GEMM batched over
    the directions (their states and weights a fixed distance apart at each step) and one cell launch
    whose second row of blocks is the reverse direction (RnnDir2)."""
    es, T, B, H, P, D, GH = g.es, g.T, g.B, g.H, g.P, g.D, g.GH
    f, b = dirs
    f.hp, b.hp = hp, hp + B * GH * es
    for s in range(T):
        t0, t1 = s, T - 1 - s
        a0, a1 = f.hs_at(_state_index(g, 0, t0)[0]), b.hs_at(_state_index(g, 1, t1)[0])
        lau.gemm(B, GH, P, a0, f.w_rec, hp, trans_b=True, lda=P, ldb=P, batch=2, stride_a=(a1 - a0) // es,
                 stride_b=(b.w_rec - f.w_rec) // es, stride_c=B * GH, cached=False)
        p = lau.reset()
        ptrs0, ptrs1 = _fwd_cell_ptrs(g, f, t0, ly, training), _fwd_cell_ptrs(g, b, t1, ly, training)
        for name, v in ptrs0.items():
            setattr(p, name, v)
        _dir2(p, ptrs0, ptrs1, t1)
        p.ld_xp, p.gs_xp = (GH, H) if f.w_in else (f.inp_w, 0)
        p.nsplit, p.split_stride, p.ld_y = 1, 0, D * P
        p.lens, p.t, p.batch, p.hidden, p.out = lens, t0, B, H, P
        if clip:
            p.clip, p.lclip, p.rclip = 1, clip[0], clip[1]
        lau.launch("fwd_cell", B * H, cell=r.cell, grid_y=2)


def _layer_dirs(lau, r, g, layer, inp, inp_w, training, wp, wsp, rsp, hxp, cxp, in_gemm=True):
    """The directions of one layer: weights, state addresses, the input projection GEMM of every step (unless
    in_gemm is False: the wavefront's layers >= 1 project chunk by chunk) and state_init."""
    es, T, B, N, H, P, D, GH = g.es, g.T, g.B, g.N, g.H, g.P, g.D, g.GH
    ws = g.ws_train if training else g.ws_inf
    rs = g.rs
    dirs = []
    for d in range(D):
        pl = layer * D + d
        dr = _Dir(d=d, pl=pl, inp=inp, inp_w=inp_w, w_in=g.weight(wp, pl, "m", 0), w_rec=g.weight(wp, pl, "m", g.G),
                  w_proj=g.weight(wp, pl, "m", PROJ_ID) if r.proj else 0, b_in=g.weight(wp, pl, "b", 0),
                  b_rec=g.weight(wp, pl, "b", g.G), xpd=wsp + ws["xp"] + d * N * GH * es,
                  act0=rsp + rs[("act", pl)] if training else 0)
        if dr.w_in and in_gemm:
            lau.gemm(N, GH, inp_w, inp, dr.w_in, dr.xpd, trans_b=True)
        if training:
            hs0, hs_step = rsp + rs[("hs", pl)], B * P * es
            s0, s_step = (rsp + rs[("s32", pl)] if g.s32 else 0), B * H * g.ss
            dr.hs_at = lambda i, hs0=hs0, st=hs_step: hs0 + i * st  # noqa: E731
            dr.s_at = lambda i, s0=s0, st=s_step: s0 + i * st if s0 else 0  # noqa: E731
        else:
            k = pl if g.wave else d  # the wavefront keeps every layer's two states at once
            hs0 = wsp + ws["hs"] + k * 2 * B * P * es
            s0 = wsp + ws["s32"] + k * 2 * B * H * g.ss if g.s32 else 0
            dr.hs_at = lambda i, hs0=hs0: hs0 + (i % 2) * B * P * es  # noqa: E731
            dr.s_at = lambda i, s0=s0: s0 + (i % 2) * B * H * g.ss if s0 else 0  # noqa: E731
        first = 0 if d == 0 else T
        p = lau.reset()
        p.h_prev = hxp + pl * B * P * es if hxp else 0
        p.aux_in = cxp + pl * B * H * es if cxp else 0
        p.h_out, p.s_out = dr.hs_at(first), dr.s_at(first)
        p.batch, p.out, p.hidden, p.mode = B, P, H, r.cell
        lau.launch("state_init", B * max(P, H))
        dirs.append(dr)
    return dirs


def _state_out(lau, g, dirs, hyp, cyp):
    es, T, B, H, P = g.es, g.T, g.B, g.H, g.P
    for dr in dirs:
        last = T if dr.d == 0 else 0
        if hyp or cyp:
            p = lau.reset()
            p.h_prev, p.s_prev = dr.hs_at(last), dr.s_at(last)
            p.aux = hyp + dr.pl * B * P * es if hyp else 0
            p.dxa = cyp + dr.pl * B * H * es if cyp else 0
            p.batch, p.out, p.hidden = B, P, H
            lau.launch("state_out", B * max(P, H))


def _layer_out(g, training, layer, wsp, rsp):
    """Layer `layer`'s output [T*B, dirs*out]: in the reserve space (training), else one of two workspace
    buffers by the layer's parity."""
    if training:
        return rsp + g.rs[("ly", layer)]
    return wsp + g.ws_inf["ly"] + (layer % 2) * g.N * g.D * g.P * g.es


def _run_forward(lau, r, g, training, lens, xp, yp, fill, hxp, hyp, cxp, cyp, wp, wsp, rsp):
    es, N, D, P = g.es, g.N, g.D, g.P
    ws = g.ws_train if training else g.ws_inf
    rs = g.rs
    clip = r.clip()
    _pack(lau, g, lens, xp, wsp + ws["xin"], g.I, g.x.layout, 0)
    inp, inp_w = wsp + ws["xin"], g.I
    if g.wave:
        inp = _fwd_wavefront(lau, r, g, training, lens, inp, inp_w, hxp, hyp, cxp, cyp, wp, wsp, rsp, clip)
        inp_w = D * P
    for layer in range(0 if not g.wave else g.L, g.L):
        ly = _layer_out(g, training, layer, wsp, rsp)
        dirs = _layer_dirs(lau, r, g, layer, inp, inp_w, training, wp, wsp, rsp, hxp, cxp)
        if g.persist:
            persist.forward_layer(lau, r, g, persist.plan(lau.handle, r, g, training), dirs, ly, training, lens,
                                  wsp + ws["bar"], clip, wsp + ws["xchg"])
        elif g.dir_batch:
            _fwd_steps_both(lau, r, g, dirs, ly, training, lens, wsp + ws["hp"], clip)
        else:
            for dr in dirs:
                dr.hp = wsp + ws["hp"]
                _fwd_steps(lau, r, g, dr, ly, training, lens, wsp, rsp, ws, clip)
        _state_out(lau, g, dirs, hyp, cyp)
        if training and g.drop and layer < g.L - 1:
            td = _flat_desc(lau.handle, r.dtype, N, D * P)
            lyd = rsp + rs[("lyd", layer)]
            lau.call(_dropout()[0], lau.handle, r.dropout, td, ly, td, lyd, rsp + rs[("mask", layer)], g.mask_bytes)
            ly = lyd
        inp, inp_w = ly, D * P
    _pack(lau, g, lens, inp, yp, D * P, g.x.layout, 2 if fill is None else 1, 0.0 if fill is None else fill)


# ----------------------------------------------------------------------------- the layer wavefront
# Multi-layer unidirectional STANDARD stacks (dropout between layers per chunk of rows; LSTM projections too): layer
# l's step t needs only layer l - 1's output of step t and its own step t - 1, so the layers run as a wavefront with a
# lag of C steps (tuning.rnn.WAVE_CHUNK): at wave w layer l runs step t = w - l * C. Per wave ONE recurrent GEMM batched
# over the active layers (where their states, weights and outputs are a fixed distance apart: the reserve space's
# per-pseudo-layer regions are, layer 0's input weights can break the weights' stride: then runs of layers) and
# ONE cell launch (fwd_cell, gridDim.y = the active layers, RnnDir2 offsets per layer), instead of one of each
# per layer and step: T + (L - 1) C waves of 2 launches against L T steps of 2. A layer l >= 1 projects its
# input chunk by chunk: when its step t starts a chunk (t % C == 0), one GEMM of C * B rows reads layer l - 1's
# output of steps [t, t + C), which the lag of C steps has finished; one chunk buffer per layer suffices (the
# stream orders the next chunk's GEMM after this chunk's cells). Layer 0 projects all its steps at once, as
# the layer-by-layer order does. Waves with one active layer keep the split-K recurrent GEMM; waves with
# several run each layer's GEMM whole (the layers fill the SMs instead), or with tuning.rnn.WAVE_SPLIT one
# split-K GEMM per layer (more launches, the blocks of each as many as the layer order's).
# LSTM projection (projSize < hiddenSize): a layer's output (and the next layer's input, the recurrent GEMM's K) is
# the projected h, which its step t produces before its step t + 1 and layer l + 1's step t read it: the same
# dependences. Per wave, as the layer order per step but grouped over the wave's layers: the recurrent GEMM(s), ONE
# fwd_cell launch writing each layer's m, the projection GEMMs hn = m P^T (one per run of equal strides: batched
# over the layers where their m, P and hn are a fixed distance apart), ONE proj_commit launch (RnnDir2: h, y of
# every layer). m (inference) and hn are per layer. The backward mirrors it: ONE bwd_proj_pre launch (dh of the
# step from the carried gh, the recurrent share ghrec and dy), the dm = dh P GEMMs per run, ONE bwd_cell launch
# reading each layer's dm, the recurrent GEMMs. Each launch does per layer exactly the layer order's arithmetic, so
# with the same GEMM results (no split-K difference, the same dropout masks) the outputs are the layer order's bit
# for bit (test_rnn_wavefront_proj_cpu.py checks it on the emulated device).
# WAVEFRONT: a switch, pydnn.tuning.rnn.WAVEFRONT; WAVE_CHUNK: pydnn.tuning.rnn.WAVE_CHUNK; WAVE_SPLIT (None: auto,
# Geometry.wave_split); WAVE_BWD


def step_macs(r, batch):
    """The multiply-adds of one layer's step: the recurrent GEMM (batch * G * hidden * out) and the LSTM
    projection's (batch * hidden * out)."""
    return batch * (r.gates + (1 if r.proj else 0)) * r.hidden * r.out


def wavefront_ok(r, batch=None):
    """Whether the calls run as the layer wavefront: tuning.rnn.WAVEFRONT True and a problem it covers
    (STANDARD, unidirectional, more than one layer; LSTM projections included); None (auto): also only where a
    layer's step is small (step_macs at most WAVE_AUTO_MACS: launches and latency, not the GEMMs' work, set the
    step's time)."""
    mode = tuning.rnn.WAVEFRONT
    if mode is False or not (r.algo == E.PYDNN_RNN_ALGO_STANDARD and r.layers > 1 and r.dirs == 1):
        return False
    if mode is None:
        return batch is not None and step_macs(r, batch) <= WAVE_AUTO_MACS
    return bool(mode)


def wave_schedule(T, L, C):
    """[(wave, [(layer, t, starts_chunk), ...])]: the active layers of every wave, in layer order."""
    out = []
    for w in range(T + (L - 1) * C):
        act = [(l, w - l * C, (w - l * C) % C == 0) for l in range(L) if 0 <= w - l * C < T]
        out.append((w, act))
    return out


def _runs(addrs):
    """Split [(a, b, c), ...] (one per active layer) into runs whose consecutive differences are equal and
    positive: [(first index, count, (stride_a, stride_b, stride_c) in bytes)]."""
    runs, i, n = [], 0, len(addrs)
    while i < n:
        j = i + 1
        st = None
        if j < n:
            st = tuple(addrs[j][k] - addrs[i][k] for k in range(3))
            if min(st) <= 0:
                st = None
        if st is None:
            runs.append((i, 1, (0, 0, 0)))
            i += 1
            continue
        while j + 1 < n and tuple(addrs[j + 1][k] - addrs[j][k] for k in range(3)) == st:
            j += 1
        runs.append((i, j - i + 1, st))
        i = j + 1
    return runs


def _fwd_wavefront(lau, r, g, training, lens, inp0, inp0_w, hxp, hyp, cxp, cyp, wp, wsp, rsp, clip):
    """Every layer's forward as the wavefront (see above; with an LSTM projection per wave also the projection
    GEMMs and one proj_commit launch); returns the last layer's output."""
    es, T, B, H, P, GH, L = g.es, g.T, g.B, g.H, g.P, g.GH, g.L
    C = min(g.wave_chunk, T)
    ws = g.ws_train if training else g.ws_inf
    drop = training and g.drop
    layers = []
    for layer in range(L):
        inp, inp_w = (inp0, inp0_w) if layer == 0 else (layers[-1].lyd if drop else layers[-1].ly, P)
        (dr,) = _layer_dirs(lau, r, g, layer, inp, inp_w, training, wp, wsp, rsp, hxp, cxp, in_gemm=layer == 0)
        dr.ly = _layer_out(g, training, layer, wsp, rsp)
        if drop and layer < L - 1:  # DropoutForward per chunk of rows: ly -> lyd, the mask bits of those rows
            dr.lyd, dr.mask = rsp + g.rs[("lyd", layer)], rsp + g.rs[("mask", layer)]
        if layer == 0 and not dr.w_in:  # SKIP_INPUT: x itself enters every gate
            dr.xp_at = lambda t, x=inp0, w=inp0_w: x + t * B * w * es  # noqa: E731
        elif layer == 0:
            dr.xp_at = lambda t, x=dr.xpd: x + t * B * GH * es  # noqa: E731
        else:
            xc = wsp + ws["xpw"] + (layer - 1) * C * B * GH * es
            dr.xpc = xc
            dr.xp_at = lambda t, x=xc: x + (t % C) * B * GH * es  # noqa: E731
        if r.proj:  # m of step t (training: the reserve space's, every step; inference: one per layer) and hn
            if training:
                dr.m_at = lambda t, m0=rsp + g.rs[("m", layer)]: m0 + t * B * H * es  # noqa: E731
            else:
                dr.m_at = lambda t, m0=wsp + ws["m"] + layer * B * H * es: m0  # noqa: E731
            dr.hn = wsp + ws["hn"] + layer * g.split_p * B * P * es
        layers.append(dr)
    hp = wsp + ws["hp"]
    for _, act in wave_schedule(T, L, C):
        for l, t, starts in act:  # the input projection of a chunk of steps (layers >= 1)
            if l and starts:
                dr = layers[l]
                rows = min(C, T - t)
                if drop:  # (its own DropoutForward: a new offset of the stream, mask bits at element t * B * P)
                    src, n0, n = layers[l - 1], t * B * P, rows * B * P
                    td = _flat_desc(lau.handle, r.dtype, rows * B, P)
                    lau.call(_dropout()[0], lau.handle, r.dropout, td, src.ly + n0 * es, td, src.lyd + n0 * es,
                             src.mask + n0 // 8, cdiv(n, 8))
                lau.gemm(rows * B, GH, dr.inp_w, dr.inp + t * B * dr.inp_w * es, dr.w_in, dr.xpc, trans_b=True)
        for y0 in range(0, len(act), K.MAXY):
            grp = act[y0:y0 + K.MAXY]
            # split-K where one layer runs alone, or (WAVE_SPLIT) in every wave, each layer its own GEMM
            sf = g.split_f if len(grp) == 1 or g.wave_split(B, GH, P, g.split_f, len(grp)) else 1
            for j, (l, t, _) in enumerate(grp):
                layers[l].hp = hp + j * sf * B * GH * es
            addrs = [(layers[l].hs_at(t), layers[l].w_rec, layers[l].hp) for l, t, _ in grp]
            if sf > 1:
                for a, b, c in addrs:
                    lau.gemm(B, GH, P // sf, a, b, c, trans_b=True, lda=P, ldb=P, batch=sf, stride_a=P // sf,
                             stride_b=P // sf, stride_c=B * GH)
            else:
                for i0, n, st in _runs(addrs):
                    a, b, c = addrs[i0]
                    lau.gemm(B, GH, P, a, b, c, trans_b=True, lda=P, ldb=P, batch=n, stride_a=st[0] // es,
                             stride_b=st[1] // es, stride_c=st[2] // es)
            # one cell launch for the group (SKIP_INPUT: layer 0, which reads x with another pitch, one of its own)
            for seg in ([grp[:1], grp[1:]] if grp[0][0] == 0 and not layers[0].w_in else [grp]):
                if not seg:
                    continue
                p = lau.reset()
                ptrs = [_fwd_cell_ptrs(g, layers[l], t, layers[l].ly, training) for l, t, _ in seg]
                if r.proj:  # the cell writes m; proj_commit below writes h and y
                    for (l, t, _), q in zip(seg, ptrs):
                        q["h_out"], q["y"] = layers[l].m_at(t), 0
                for name, v in ptrs[0].items():
                    setattr(p, name, v)
                for j in range(1, len(seg)):
                    _dir2(p, ptrs[0], ptrs[j], seg[j][1], y=j)
                p.ld_xp, p.gs_xp = (GH, H) if layers[seg[0][0]].w_in else (inp0_w, 0)
                p.nsplit, p.split_stride, p.ld_y = sf, B * GH, P
                p.lens, p.t, p.batch, p.hidden, p.out = lens, seg[0][1], B, H, P
                if clip:
                    p.clip, p.lclip, p.rclip = 1, clip[0], clip[1]
                lau.launch("fwd_cell", B * H, cell=r.cell, grid_y=len(seg))
            if r.proj:  # hn = m x P^T of each layer (runs batched; PROJ_SPLIT: each layer's split-K), one proj_commit
                if g.split_p > 1:
                    for l, t, _ in grp:
                        _proj_gemm(lau, g, layers[l].m_at(t), layers[l].w_proj, layers[l].hn)
                else:
                    _gemm_runs(lau, es, [(layers[l].m_at(t), layers[l].w_proj, layers[l].hn) for l, t, _ in grp],
                               B, P, H, trans_b=True)
                _launch_dirs(lau, "proj_commit", B * P,
                             [dict(aux_in=layers[l].hn, h_prev=layers[l].hs_at(t), h_out=layers[l].hs_at(t + 1),
                                   y=layers[l].ly + t * B * P * es) for l, t, _ in grp], [t for _, t, _ in grp],
                             ld_y=P, lens=lens, batch=B, hidden=H, out=P, nsplit=g.split_p, split_stride=B * P)
    _state_out(lau, g, layers, hyp, cyp)
    return layers[-1].ly


def _gemm_runs(lau, es, addrs, m, n, k, trans_b=False):
    """One GEMM [m, k] x [k, n] (B transposed: trans_b) per (a, b, c) in addrs, batched over runs of equal
    positive strides (_runs); a run of one is the layer order's own call (the projection GEMMs of a wave)."""
    for i0, cnt, st in _runs(addrs):
        a, b, c = addrs[i0]
        if cnt == 1:
            lau.gemm(m, n, k, a, b, c, trans_b=trans_b)
        else:
            lau.gemm(m, n, k, a, b, c, trans_b=trans_b, lda=k, ldb=k if trans_b else n, batch=cnt,
                     stride_a=st[0] // es, stride_b=st[1] // es, stride_c=st[2] // es)


def _launch_dirs(lau, name, threads, ptrs, ts, **fields):
    """One launch of a RnnDir2 kernel (proj_commit, bwd_proj_pre) over len(ptrs) rows of blocks: row j sees
    the pointers ptrs[j] and time ts[j]; fields: the shared scalars."""
    p = lau.reset()
    for n, v in ptrs[0].items():
        setattr(p, n, v)
    for j in range(1, len(ptrs)):
        _dir2(p, ptrs[0], ptrs[j], ts[j], y=j)
    for n, v in fields.items():
        setattr(p, n, v)
    p.t = ts[0]
    lau.launch(name, threads, grid_y=len(ptrs))


def _bwd_wavefront(lau, r, g, lens, dly, dhyp, dhxp, dcyp, dcxp, wp, wsp, rsp):
    """RNNBackwardData_v8 of the layers as a wavefront (the forward's, mirrored): the top layer first, layer
    L - 1 - u running its step s (time T - 1 - s) at wave s + u * C. A layer's output gradient dy (the layer
    above's dx) is produced chunk by chunk: when layer l starts a chunk of C steps, one GEMM of the chunk's rows
    of layer l + 1's input pre-activation gradients (finished C waves ago) by its input weights. Per wave one
    bwd_cell launch for the active layers (RnnDir2) and one recurrent GEMM batched over them (runs of equal
    strides; WAVE_SPLIT: each layer's own, split-K); with an LSTM projection before the cells one bwd_proj_pre launch
    and the dm GEMMs (runs of equal strides). Two dy buffers alternate between the layers (layer l + 2
    overwrites a row of layer l's dy only after layer l read it: C waves later at least). Returns the index of
    the dly buffer that holds layer 0's dx."""
    es, T, B, N, H, P, GH, L = g.es, g.T, g.B, g.N, g.H, g.P, g.GH, g.L
    C = min(g.wave_chunk, T)
    ws, rs = g.ws_train, g.rs
    sb = g.wave_split_b
    clip = r.clip()
    layers = []
    for layer in range(L):
        pl = layer
        s0 = rsp + rs[("s32", pl)] if g.s32 else 0
        dr = _Dir(d=0, pl=pl, w_in=g.weight(wp, pl, "m", 0), w_rec=g.weight(wp, pl, "m", g.G),
                  s_at=lambda i, s0=s0: s0 + i * B * H * g.ss if s0 else 0, act0=rsp + rs[("act", pl)],
                  dxa0=rsp + rs[("dxa", pl)], dha0=rsp + rs[("dha", pl)] if r.cell == GRU else 0,
                  gh=wsp + ws["gh"] + layer * B * P * g.ss, ghrec=wsp + ws["ghrec"] + layer * sb * B * P * es,
                  gc=wsp + ws["gc"] + layer * B * H * g.ss, dy=dly[(L - 1 - layer) % 2])
        if r.proj:  # the projection's weights, dh of every step (reserve space) and dm (one per layer)
            dr.w_proj, dr.dhall0 = g.weight(wp, pl, "m", PROJ_ID), rsp + rs[("dhall", pl)]
            dr.dm = wsp + ws["dm"] + layer * B * H * es
        p = lau.reset()
        p.dy = dhyp + pl * B * P * es if dhyp else 0
        p.dm = dcyp + pl * B * H * es if dcyp else 0
        p.gh, p.aux, p.gc = dr.gh, dr.ghrec, dr.gc
        p.batch, p.out, p.hidden = B, P, H
        p.nsplit, p.split_stride = sb, B * P
        lau.launch("bwd_state_init", B * max(P, H))
        layers.append(dr)
    for _, act in wave_schedule(T, L, C):
        # in layer order (ascending addresses: the recurrent GEMMs batch over runs of positive strides)
        grp_all = sorted((L - 1 - u, T - 1 - s, st) for u, s, st in act)
        for l, t, starts in grp_all:  # layer l + 1's dx of this chunk: layer l's dy rows [t - C + 1, t]
            if l < L - 1 and starts:
                up, r0 = layers[l + 1], max(0, t - C + 1)
                rows = t - r0 + 1
                lau.gemm(rows * B, P, GH, up.dxa0 + r0 * B * GH * es, up.w_in, layers[l].dy + r0 * B * P * es)
                if g.drop:  # through the dropout on layer l's output, those rows' mask bits
                    n0, n = r0 * B * P, rows * B * P
                    td = _flat_desc(lau.handle, r.dtype, rows * B, P)
                    d = layers[l].dy + n0 * es
                    lau.call(_dropout()[1], lau.handle, r.dropout, td, d, td, d, rsp + rs[("mask", l)] + n0 // 8,
                             cdiv(n, 8))
        for y0 in range(0, len(grp_all), K.MAXY):
            grp = grp_all[y0:y0 + K.MAXY]
            ptrs = [_bwd_cell_ptrs(g, layers[l], t, layers[l].dy) for l, t, _ in grp]
            if r.proj:  # dh of the step (gh + ghrec + dy), then dm = dh x P (runs batched); the cell reads dm
                _launch_dirs(lau, "bwd_proj_pre", B * P,
                             [dict(gh=q["gh"], ghrec=q["ghrec"], dy=q["dy"], aux=layers[l].dhall0 + t * B * P * es)
                              for (l, t, _), q in zip(grp, ptrs)], [t for _, t, _ in grp],
                             ld_y=P, nsplit=sb, split_stride=B * P, lens=lens, batch=B, hidden=H, out=P)
                _gemm_runs(lau, es, [(layers[l].dhall0 + t * B * P * es, layers[l].w_proj, layers[l].dm)
                                     for l, t, _ in grp], B, H, P)
                for (l, t, _), q in zip(grp, ptrs):
                    q["dy"], q["dm"] = 0, layers[l].dm
            p = lau.reset()
            for name, v in ptrs[0].items():
                setattr(p, name, v)
            for j in range(1, len(grp)):
                _dir2(p, ptrs[0], ptrs[j], grp[j][1], y=j)
            p.ld_y, p.nsplit, p.split_stride = P, sb, B * P
            p.lens, p.t, p.batch, p.hidden, p.out = lens, grp[0][1], B, H, P
            if clip:
                p.clip, p.lclip, p.rclip = 1, clip[0], clip[1]
            lau.launch("bwd_cell", B * H, cell=r.cell, grid_y=len(grp))
            # ghrec of each layer for its next step: [B, G*H] x R [G*H, out]
            addrs = [((layers[l].dha0 or layers[l].dxa0) + t * B * GH * es, layers[l].w_rec, layers[l].ghrec)
                     for l, t, _ in grp]
            if sb > 1:
                for a, b, c in addrs:
                    lau.gemm(B, P, GH // sb, a, b, c, lda=GH, ldb=P, batch=sb, stride_a=GH // sb,
                             stride_b=(GH // sb) * P, stride_c=B * P)
            else:
                for i0, n, st in _runs(addrs):
                    a, b, c = addrs[i0]
                    lau.gemm(B, P, GH, a, b, c, lda=GH, ldb=P, batch=n, stride_a=st[0] // es, stride_b=st[1] // es,
                             stride_c=st[2] // es)
    for dr in layers:
        if dhxp or dcxp:
            _bwd_state_out(lau, dr, dhxp, dcxp, B, P, H, es, sb)
    # layer 0's dx (the call's dx, width inputSize) into the dy buffer layer 0 did not use
    out = L % 2
    if layers[0].w_in:
        lau.gemm(N, g.I, GH, layers[0].dxa0, layers[0].w_in, dly[out])
    else:  # SKIP_INPUT: the sum of the gates' pre-activation gradients
        p = lau.reset()
        p.aux, p.aux_in, p.rows, p.hidden, p.cols, p.ld_aux, p.mode = dly[out], layers[0].dxa0, N, H, g.G, g.I, 0
        lau.launch("skip_dx", N * H)
    return out


# ----------------------------------------------------------------------------- backward

@api
def rnn_backward_data_v8(handle, rnn_desc, dev_seq_lengths, y_desc, y, dy, x_desc, dx, h_desc, hx, dhy, dhx, c_desc,
                         cx, dcy, dcx, weight_space_size, weight_space, work_space_size, work_space,
                         reserve_space_size, reserve_space):
    """cudnnRNNBackwardData_v8: dx, dhx, dcx (each of dhy, dhx, dcy, dcx NULL-able: NULL inputs are zeros)
    from dy after a TRAINING forward with the same arguments, whose reserve space it reads and extends
    (the pre-activation gradients BackwardWeights needs). dx past each sequence's length is 0 (unpacked
    layouts). y and hx, cx are not read (the reserve space holds what is needed). Statuses as RNNForward."""
    check_handle(handle)
    r = set_rnn(rnn_desc)
    xd = _validate(r, x_desc, y_desc, h_desc, c_desc)
    _gpu_support(r, True)
    g = _geometry(r, xd, handle)
    if g.persist:
        persist.plan(handle, r, g, True)
    es = g.es
    lens = _lens(dev_seq_lengths, xd)
    yd = set_data(y_desc, "yDesc")
    dyp = _ptr(dy, "dy", yd.span_bytes(), es)
    dxp = _ptr(dx, "dx", xd.span_bytes(), es)
    hbytes, cbytes = g.L * g.D * g.B * g.P * es, g.L * g.D * g.B * g.H * es
    dhyp, dhxp = _opt(dhy, "dhy", hbytes, es), _opt(dhx, "dhx", hbytes, es)
    lstm = r.cell == LSTM
    dcyp = _opt(dcy, "dcy", cbytes, es) if lstm else 0
    dcxp = _opt(dcx, "dcx", cbytes, es) if lstm else 0
    wp = _space(weight_space, weight_space_size, r.weight_elements() * es, "weightSpace", "weightSpaceSize")
    wsp = _space(work_space, work_space_size, g.workspace_size(True), "workSpace", "workSpaceSize")
    rsp = _space(reserve_space, reserve_space_size, g.reserve_size(True), "reserveSpace", "reserveSpaceSize")
    _run(handle, r, g, _run_backward_data, lens, dyp, dxp, dhyp, dhxp, dcyp, dcxp, wp, wsp, rsp)


def _bwd_cell_ptrs(g, dr, t, dly):
    """The pointer fields of bwd_cell for direction dr at time t (without a projection)."""
    es, B, H, P, D, GH = g.es, g.B, g.H, g.P, g.D, g.GH
    ip, io = _state_index(g, dr.d, t)
    return dict(dy=dly + (t * B * D * P + dr.d * P) * es, act=dr.act0 + t * B * g.GA * H * g.ss,
                s_prev=dr.s_at(ip), s_out=dr.s_at(io), dxa=dr.dxa0 + t * B * GH * es,
                dha=dr.dha0 + t * B * GH * es if dr.dha0 else 0, gh=dr.gh, ghrec=dr.ghrec, gc=dr.gc)


def _bwd_state_out(lau, dr, dhxp, dcxp, B, P, H, es, sb):
    """dhx / dcx of one (pseudo-)layer from its carried gradients (either pointer may be 0): the same launch
    for the layer-order and the wavefront backward."""
    p = lau.reset()
    p.aux = dhxp + dr.pl * B * P * es if dhxp else 0
    p.dxa = dcxp + dr.pl * B * H * es if dcxp else 0
    p.gh, p.ghrec, p.gc = dr.gh, dr.ghrec, dr.gc
    p.nsplit, p.split_stride = sb, B * P
    p.batch, p.out, p.hidden = B, P, H
    lau.launch("bwd_state_out", B * max(P, H))


def _bwd_rec_gemm(lau, g, dr, t, w_rec):
    """ghrec = the step's recurrent pre-activation gradients x R: K = G*H in split_b slices, partial sums
    split_b * [B, out] apart."""
    es, B, P, GH, sb = g.es, g.B, g.P, g.GH, g.split_b
    lau.gemm(B, P, GH // sb, (dr.dha0 or dr.dxa0) + t * B * GH * es, w_rec, dr.ghrec, lda=GH, ldb=P, batch=sb,
             stride_a=GH // sb, stride_b=(GH // sb) * P, stride_c=B * P)


def _run_backward_data(lau, r, g, lens, dyp, dxp, dhyp, dhxp, dcyp, dcxp, wp, wsp, rsp):
    es, T, B, N, H, P, D, GH = g.es, g.T, g.B, g.N, g.H, g.P, g.D, g.GH
    ws, rs = g.ws_train, g.rs
    dly = [wsp + ws["dly"], wsp + ws["dly"] + N * g.dw * es]
    cur = 0
    _pack(lau, g, lens, dyp, dly[cur], D * P, g.x.layout, 0)
    if g.wave_bwd:
        cur = _bwd_wavefront(lau, r, g, lens, dly, dhyp, dhxp, dcyp, dcxp, wp, wsp, rsp)
        _pack(lau, g, lens, dly[cur], dxp, g.I, g.x.layout, 1, 0.0)
        return
    sb = g.split_b
    clip = r.clip()
    for layer in range(g.L - 1, -1, -1):
        in_w = r.layer_input(layer)
        nxt = dly[1 - cur]
        dirs = []
        for d in range(D):  # each direction's carried gradients have buffers of their own
            pl = layer * D + d
            s0 = rsp + rs[("s32", pl)] if g.s32 else 0
            dr = _Dir(d=d, pl=pl, w_in=g.weight(wp, pl, "m", 0), w_rec=g.weight(wp, pl, "m", g.G),
                      w_proj=g.weight(wp, pl, "m", PROJ_ID) if r.proj else 0,
                      s_at=lambda i, s0=s0: s0 + i * B * H * g.ss if s0 else 0, act0=rsp + rs[("act", pl)],
                      dxa0=rsp + rs[("dxa", pl)], dha0=rsp + rs[("dha", pl)] if r.cell == GRU else 0,
                      gh=wsp + ws["gh"] + d * B * P * g.ss, ghrec=wsp + ws["ghrec"] + d * sb * B * P * es,
                      gc=wsp + ws["gc"] + d * B * H * g.ss)
            p = lau.reset()
            p.dy = dhyp + pl * B * P * es if dhyp else 0
            p.dm = dcyp + pl * B * H * es if dcyp else 0
            p.gh, p.aux, p.gc = dr.gh, dr.ghrec, dr.gc
            p.batch, p.out, p.hidden = B, P, H
            p.nsplit, p.split_stride = sb, B * P
            lau.launch("bwd_state_init", B * max(P, H))
            dirs.append(dr)
        if g.persist:
            persist.backward_layer(lau, r, g, persist.plan(lau.handle, r, g, True), dirs, dly[cur], lens,
                                   wsp + ws["bar"], clip)
        elif g.dir_batch:  # both directions' cells in one launch (RnnDir2), each its own recurrent GEMM
            f, b = dirs
            for s in range(T):
                t0, t1 = T - 1 - s, s
                p = lau.reset()
                ptrs0, ptrs1 = _bwd_cell_ptrs(g, f, t0, dly[cur]), _bwd_cell_ptrs(g, b, t1, dly[cur])
                for name, v in ptrs0.items():
                    setattr(p, name, v)
                _dir2(p, ptrs0, ptrs1, t1)
                p.ld_y, p.nsplit, p.split_stride = D * P, sb, B * P
                p.lens, p.t, p.batch, p.hidden, p.out = lens, t0, B, H, P
                if clip:
                    p.clip, p.lclip, p.rclip = 1, clip[0], clip[1]
                lau.launch("bwd_cell", B * H, cell=r.cell, grid_y=2)
                _bwd_rec_gemm(lau, g, f, t0, f.w_rec)
                _bwd_rec_gemm(lau, g, b, t1, b.w_rec)
        else:
            for dr in dirs:
                for s in range(T):
                    t = T - 1 - s if dr.d == 0 else s
                    ptrs = _bwd_cell_ptrs(g, dr, t, dly[cur])
                    if r.proj:
                        dh_t = rsp + rs[("dhall", dr.pl)] + t * B * P * es
                        p = lau.reset()
                        p.gh, p.ghrec, p.dy, p.ld_y, p.aux = dr.gh, dr.ghrec, ptrs["dy"], D * P, dh_t
                        p.nsplit, p.split_stride = sb, B * P
                        p.lens, p.t, p.batch, p.hidden, p.out = lens, t, B, H, P
                        lau.launch("bwd_proj_pre", B * P)
                        lau.gemm(B, H, P, dh_t, dr.w_proj, wsp + ws["dm"])
                    p = lau.reset()
                    for name, v in ptrs.items():
                        setattr(p, name, v)
                    if r.proj:
                        p.dm, p.dy = wsp + ws["dm"], 0
                    p.ld_y, p.nsplit, p.split_stride = D * P, sb, B * P
                    p.lens, p.t, p.batch, p.hidden, p.out = lens, t, B, H, P
                    if clip:
                        p.clip, p.lclip, p.rclip = 1, clip[0], clip[1]
                    lau.launch("bwd_cell", B * H, cell=r.cell)
                    _bwd_rec_gemm(lau, g, dr, t, dr.w_rec)
        for dr in dirs:
            if dhxp or dcxp:
                _bwd_state_out(lau, dr, dhxp, dcxp, B, P, H, es, sb)
            if dr.w_in:
                lau.gemm(N, in_w, GH, dr.dxa0, dr.w_in, nxt, beta=0.0 if dr.d == 0 else 1.0)
            else:
                p = lau.reset()
                p.aux, p.aux_in, p.rows, p.hidden, p.cols, p.ld_aux = nxt, dr.dxa0, N, H, g.G, in_w
                p.mode = 0 if dr.d == 0 else K.MODE_ADD
                lau.launch("skip_dx", N * H)
        if g.drop and layer > 0:  # through the dropout on the previous layer's output
            td = _flat_desc(lau.handle, r.dtype, N, in_w)
            lau.call(_dropout()[1], lau.handle, r.dropout, td, nxt, td, nxt, rsp + rs[("mask", layer - 1)],
                     g.mask_bytes)
        cur = 1 - cur
    _pack(lau, g, lens, dly[cur], dxp, g.I, g.x.layout, 1, 0.0)


@api
def rnn_backward_weights_v8(handle, rnn_desc, add_grad, dev_seq_lengths, x_desc, x, h_desc, hx, y_desc, y,
                            weight_space_size, dweight_space, work_space_size, work_space, reserve_space_size,
                            reserve_space):
    """cudnnRNNBackwardWeights_v8: weight and bias gradients after RNNBackwardData_v8 (same arguments, its
    reserve space), added to dweightSpace (WGRAD_MODE_ADD, as cuDNN) or written (WGRAD_MODE_SET), in the
    weight space's layout. hx, y are not read (the reserve space holds the states and layer outputs);
    x is. Statuses as RNNForward; BAD_PARAM: addGrad."""
    check_handle(handle)
    r = set_rnn(rnn_desc)
    mode = enum_arg("addGrad", add_grad, WGRAD_MODES, "pydnnWgradMode_t")
    xd = _validate(r, x_desc, y_desc, h_desc, None, check_c=False)
    _gpu_support(r, True)
    g = _geometry(r, xd, handle)
    if g.persist:
        persist.plan(handle, r, g, True)
    es = g.es
    lens = _lens(dev_seq_lengths, xd)
    xp = _ptr(x, "x", xd.span_bytes(), es)
    dwp = _space(dweight_space, weight_space_size, r.weight_elements() * es, "dweightSpace", "weightSpaceSize")
    wsp = _space(work_space, work_space_size, g.workspace_size(True), "workSpace", "workSpaceSize")
    rsp = _space(reserve_space, reserve_space_size, g.reserve_size(True), "reserveSpace", "reserveSpaceSize")
    _run(handle, r, g, _run_backward_weights, mode == E.PYDNN_WGRAD_MODE_ADD, lens, xp, dwp, wsp, rsp)


def _run_backward_weights(lau, r, g, add, lens, xp, dwp, wsp, rsp):
    es, B, N, H, P, D, GH = g.es, g.B, g.N, g.H, g.P, g.D, g.GH
    ws, rs = g.ws_train, g.rs
    beta = 1.0 if add else 0.0
    _pack(lau, g, lens, xp, wsp + ws["xin"], g.I, g.x.layout, 0)
    for layer in range(g.L):
        inp = wsp + ws["xin"] if layer == 0 else rsp + rs[("lyd" if g.drop else "ly", layer - 1)]
        in_w = r.layer_input(layer)
        for d in range(D):
            pl = layer * D + d
            dxa0 = rsp + rs[("dxa", pl)]
            dha0 = rsp + rs[("dha", pl)] if r.cell == GRU else dxa0
            dw_in, dw_rec = g.weight(dwp, pl, "m", 0), g.weight(dwp, pl, "m", g.G)
            if dw_in:
                lau.gemm(GH, in_w, N, dxa0, inp, dw_in, beta=beta, trans_a=True)
            hprev = rsp + rs[("hs", pl)] + (0 if d == 0 else B * P * es)
            lau.gemm(GH, P, N, dha0, hprev, dw_rec, beta=beta, trans_a=True)
            if r.proj:
                lau.gemm(P, H, N, rsp + rs[("dhall", pl)], rsp + rs[("m", pl)],
                      g.weight(dwp, pl, "m", PROJ_ID), beta=beta, trans_a=True)
            for kind_src, lin in ((dxa0, 0), (dha0, g.G)):
                db = g.weight(dwp, pl, "b", lin)
                if db:  # column sums of the pre-activation gradients: row chunks, then the chunks in order
                    chunk = cdiv(N, K.BIAS_CHUNKS)
                    p = lau.reset()
                    p.aux_in, p.s_out, p.rows, p.cols, p.ld_aux, p.vec = kind_src, wsp + ws["bpart"], N, GH, GH, chunk
                    lau.launch("bias_partial", GH, grid_y=cdiv(N, chunk))
                    p = lau.reset()
                    p.aux, p.s_prev, p.cols, p.seq = db, wsp + ws["bpart"], GH, cdiv(N, chunk)
                    p.mode = K.MODE_ADD if add else 0
                    lau.launch("bias_final", GH)
