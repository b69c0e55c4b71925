"""Multi-head attention with projections: cuDNN's legacy MHA API (cudnnSetAttnDescriptor,
cudnnMultiHeadAttnForward, ...), built from pydnn's tensor-core matmul (pydnn/ops/matmul.py) for the
Q / K / V / O projections and the fused attention kernel (pydnn/ops/attention.py) for the core.

    Q_h = W_Q[h] q + b_Q[h],  K_h = W_K[h] k + b_K[h],  V_h = W_V[h] v + b_V[h]     (per head h)
    head_h(t) = sum_j softmax_j(smScaler * Q_h(t) . K_h(j)) V_h(j),  j in [loWinIdx[t], hiWinIdx[t])
    out(t) = sum_h W_O[h] head_h(t) + b_O  (+ residuals(t))

Sequence data (pydnnSeqDataDescriptor_t): 4 dims indexed by pydnnSeqDataAxis_t (dimA[TIME], dimA[BATCH],
dimA[BEAM], dimA[VECT]); axes[] lists them from the outermost to the innermost in memory, VECT last;
packed. seqLengthArray holds batch * beam lengths, batch-major (entry b * beam + m), each in
[0, dimA[TIME]]; devSeqLengthsQO / KV are the same numbers in int32 device memory (the kernels read those).
paddingFill (NULL, or a value of the data type; from Python a number or None): when oDesc has one,
the forward writes it into every output position past its sequence's length.

The attention descriptor: attnMode = query map (ALL_TO_ONE: K / V have beam 1, shared by the query beams;
ONE_TO_ONE: one K / V beam per query beam) | projection biases (ENABLE / DISABLE_PROJ_BIASES); a
projection size 0 means no projection (each head sees the whole input vector; oProjSize 0: the heads
concatenated, nHeads * vProj wide). qProjSize must equal kProjSize (qSize == kSize when both are 0).

The weight buffer (pydnn's layout, what pydnnGetMultiHeadAttnWeights describes): Q, K, V, O weights, then
Q, K, V, O biases, each region starting on a 256-byte boundary, in the data type:
    Q / K / V weights  dims (nHeads, projSize, size)      strides (projSize * size, size, 1)
    O weights          dims (nHeads, oProjSize, vProj)    strides (vProj, nHeads * vProj, 1)
    (i.e. one [oProjSize, nHeads * vProj] row-major matrix that multiplies the concatenated heads)
    Q / K / V biases   dims (nHeads, projSize, 1)         strides (projSize, 1, 1)
    O biases           dims (1, oProjSize, 1)             strides (oProjSize, 1, 1)
A kind that does not exist (projection size 0, biases disabled) has wAddr NULL and leaves wDesc as it was.

Calls. Forward: reserveSpace NULL is inference (currIdx >= 0: only that query time-step is computed and
only its output rows are written, for every sequence, also those shorter than currIdx + 1 (padding);
currIdx < 0: every step); reserveSpace given is training (currIdx must
be negative) and keeps the projected Q, K, V, the heads and the softmax statistics for the backward.
BackwardData (after a training forward with the same arguments) writes dqueries / dkeys / dvalues
(the residual's share of dqueries, dout itself, is not included, as in cuDNN) and keeps the projected
gradients in the reserve space; BackwardWeights (after BackwardData) writes (SET) or adds (ADD) dweights in
the weight buffer's layout. Padding rows of dout must hold finite numbers (they meet zero heads).

What the GPU path supports (each other case is NOT_SUPPORTED with a message naming the argument):
half / bfloat16 data with float compute precision; projections of Q, K and V (sizes > 0) with
qProjSize == kProjSize == vProjSize in {64, 128} (the fused kernel's head dims); attention windows that the
fused kernel expresses: loWinIdx[t] <= 0 for every t, and hiWinIdx[t] either past every key (no mask), t + 1
(causal, top-left), or t + 1 + (kvLength - qoLength) with that difference the same for every sequence
(causal, bottom-right); in inference at one step, any hiWinIdx[currIdx] >= 1; query map ONE_TO_ONE, or
ALL_TO_ONE with beam 1; dropout on the attention probabilities (attnDropoutDesc, training only, with the
fused kernel's Philox stream seeded by the dropout descriptor's seed) when the batch entries and beams of
the data fold into one batch stride; no post dropout (postDropoutDesc NULL or probability 0).
Workspace / reserve sizes come from the descriptor's maxima (pydnnGetMultiHeadAttnBuffers).
"""
import numpy as np

from .. import buffers as _buffers, enums as E, tuning
from .._cuda import driver
from ..buffers import device_ptr
from ..handle import check_handle
from ..status import PydnnError, api
from ..tensor import DTYPES, TensorDescriptor, _int, _live as _live_tensor
from . import _replay
from . import attention as FA
from . import matmul
from .common import enum_arg, scalar
from . import tensor_ops
from .dropout import DropoutDescriptor

__all__ = ["AttnDescriptor", "SeqDataDescriptor", "create_attn_descriptor", "set_attn_descriptor",
           "get_attn_descriptor", "destroy_attn_descriptor", "create_seq_data_descriptor",
           "set_seq_data_descriptor", "get_seq_data_descriptor", "destroy_seq_data_descriptor",
           "get_multi_head_attn_buffers", "get_multi_head_attn_weights", "multi_head_attn_forward",
           "multi_head_attn_backward_data", "multi_head_attn_backward_weights"]

_A, _S, _D = "pydnnAttnDescriptor_t", "pydnnSeqDataDescriptor_t", "pydnnDropoutDescriptor_t"
C_API = [("Multi-head attention with projections (cuDNN's legacy MHA API)", [
    (f"pydnnStatus_t pydnnCreateAttnDescriptor({_A} *attnDesc);",
     "A new multi-head attention descriptor, unset until pydnnSetAttnDescriptor."),
    (f"pydnnStatus_t pydnnSetAttnDescriptor({_A} attnDesc, unsigned attnMode, int nHeads, double smScaler, "
     "pydnnDataType_t dataType, pydnnDataType_t computePrec, pydnnMathType_t mathType, "
     f"{_D} attnDropoutDesc, {_D} postDropoutDesc, int qSize, int kSize, int vSize, int qProjSize, "
     "int kProjSize, int vProjSize, int oProjSize, int qoMaxSeqLength, int kvMaxSeqLength, int maxBatchSize, "
     "int maxBeamSize);",
     "Query map | projection biases, heads, softmax scaler, types, dropouts (NULL: none), vector and projection sizes, maxima."),
    (f"pydnnStatus_t pydnnGetAttnDescriptor({_A} attnDesc, unsigned *attnMode, int *nHeads, double *smScaler, "
     "pydnnDataType_t *dataType, pydnnDataType_t *computePrec, pydnnMathType_t *mathType, "
     f"{_D} *attnDropoutDesc, {_D} *postDropoutDesc, int *qSize, int *kSize, int *vSize, int *qProjSize, "
     "int *kProjSize, int *vProjSize, int *oProjSize, int *qoMaxSeqLength, int *kvMaxSeqLength, "
     "int *maxBatchSize, int *maxBeamSize);", "The multi-head attention descriptor's settings."),
    (f"pydnnStatus_t pydnnDestroyAttnDescriptor({_A} attnDesc);",
     "Release a multi-head attention descriptor (NULL: nothing to do)."),
    (f"pydnnStatus_t pydnnCreateSeqDataDescriptor({_S} *seqDataDesc);",
     "A new sequence data descriptor, unset until pydnnSetSeqDataDescriptor."),
    (f"pydnnStatus_t pydnnSetSeqDataDescriptor({_S} seqDataDesc, pydnnDataType_t dataType, int nbDims, "
     "const int dimA[], const pydnnSeqDataAxis_t axes[], size_t seqLengthArraySize, const int seqLengthArray[], "
     "void *paddingFill);",
     "4 dims by pydnnSeqDataAxis_t, their memory order (outermost first, VECT last), batch*beam lengths, fill (NULL: none)."),
    (f"pydnnStatus_t pydnnGetSeqDataDescriptor(const {_S} seqDataDesc, pydnnDataType_t *dataType, int *nbDims, "
     "int nbDimsRequested, int dimA[], pydnnSeqDataAxis_t axes[], size_t *seqLengthArraySize, "
     "size_t seqLengthSizeRequested, int seqLengthArray[], void *paddingFill);",
     "The sequence data descriptor's settings (paddingFill NULL: not returned)."),
    (f"pydnnStatus_t pydnnDestroySeqDataDescriptor({_S} seqDataDesc);",
     "Release a sequence data descriptor (NULL: nothing to do)."),
    (f"pydnnStatus_t pydnnGetMultiHeadAttnBuffers(pydnnHandle_t handle, const {_A} attnDesc, "
     "size_t *weightSizeInBytes, size_t *workSpaceSizeInBytes, size_t *reserveSpaceSizeInBytes);",
     "Bytes of the weight buffer, the workspace and (training) the reserve space (NULL: not returned)."),
    (f"pydnnStatus_t pydnnGetMultiHeadAttnWeights(pydnnHandle_t handle, const {_A} attnDesc, "
     "pydnnMultiHeadAttnWeightKind_t wKind, size_t weightSizeInBytes, const void *weights, "
     "pydnnTensorDescriptor_t wDesc, void **wAddr);",
     "Where one weight or bias tensor lies in the weight buffer (wAddr NULL: the kind does not exist)."),
    (f"pydnnStatus_t pydnnMultiHeadAttnForward(pydnnHandle_t handle, const {_A} attnDesc, int currIdx, "
     "const int loWinIdx[], const int hiWinIdx[], const void *devSeqLengthsQO, const void *devSeqLengthsKV, "
     f"const {_S} qDesc, const void *queries, const void *residuals, const {_S} kDesc, const void *keys, "
     f"const {_S} vDesc, const void *values, const {_S} oDesc, void *out, size_t weightSizeInBytes, "
     "const void *weights, size_t workSpaceSizeInBytes, void *workSpace, size_t reserveSpaceSizeInBytes, "
     "void *reserveSpace);",
     "out = sum_h W_O attention_h(W_Q q, W_K k, W_V v) + b_O (+ residuals); reserveSpace NULL: inference."),
    (f"pydnnStatus_t pydnnMultiHeadAttnBackwardData(pydnnHandle_t handle, const {_A} attnDesc, "
     "const int loWinIdx[], const int hiWinIdx[], const void *devSeqLengthsDQDO, const void *devSeqLengthsDKDV, "
     f"const {_S} doDesc, const void *dout, const {_S} dqDesc, void *dqueries, const void *queries, "
     f"const {_S} dkDesc, void *dkeys, const void *keys, const {_S} dvDesc, void *dvalues, const void *values, "
     "size_t weightSizeInBytes, const void *weights, size_t workSpaceSizeInBytes, void *workSpace, "
     "size_t reserveSpaceSizeInBytes, void *reserveSpace);",
     "dqueries, dkeys, dvalues of a training forward (the residual's dout is not added to dqueries)."),
    (f"pydnnStatus_t pydnnMultiHeadAttnBackwardWeights(pydnnHandle_t handle, const {_A} attnDesc, "
     f"pydnnWgradMode_t addGrad, const {_S} qDesc, const void *queries, const {_S} kDesc, const void *keys, "
     f"const {_S} vDesc, const void *values, const {_S} doDesc, const void *dout, size_t weightSizeInBytes, "
     "const void *weights, void *dweights, size_t workSpaceSizeInBytes, void *workSpace, "
     "size_t reserveSpaceSizeInBytes, void *reserveSpace);",
     "Weight and bias gradients (after pydnnMultiHeadAttnBackwardData), added (ADD) or written (SET)."),
])]
C_OPAQUE_TYPES = [(_A, "pydnnAttnStruct"), (_S, "pydnnSeqDataStruct")]
C_NULLABLE = {"pydnnSetAttnDescriptor": ("attnDropoutDesc", "postDropoutDesc"),
              "pydnnGetMultiHeadAttnBuffers": ("reserveSpaceSizeInBytes",),
              "pydnnGetSeqDataDescriptor": ("paddingFill",)}

TIME, BATCH, BEAM, VECT = (E.PYDNN_SEQDATA_TIME_DIM, E.PYDNN_SEQDATA_BATCH_DIM, E.PYDNN_SEQDATA_BEAM_DIM,
                           E.PYDNN_SEQDATA_VECT_DIM)
QW, KW, VW, OW, QB, KB, VB, OB = (E.PYDNN_MH_ATTN_Q_WEIGHTS, E.PYDNN_MH_ATTN_K_WEIGHTS, E.PYDNN_MH_ATTN_V_WEIGHTS,
                                  E.PYDNN_MH_ATTN_O_WEIGHTS, E.PYDNN_MH_ATTN_Q_BIASES, E.PYDNN_MH_ATTN_K_BIASES,
                                  E.PYDNN_MH_ATTN_V_BIASES, E.PYDNN_MH_ATTN_O_BIASES)
KINDS = (QW, KW, VW, OW, QB, KB, VB, OB)
ONE_TO_ONE, BIASES = E.PYDNN_ATTN_QUERYMAP_ONE_TO_ONE, E.PYDNN_ATTN_ENABLE_PROJ_BIASES
MODE_BITS = ONE_TO_ONE | BIASES
FLOAT_DTYPES = (E.PYDNN_DATA_HALF, E.PYDNN_DATA_BFLOAT16, E.PYDNN_DATA_FLOAT, E.PYDNN_DATA_DOUBLE)
GPU_DTYPES = (E.PYDNN_DATA_HALF, E.PYDNN_DATA_BFLOAT16)
ALIGN = 256  # every region of the weight, work and reserve buffers starts on this boundary
INT_MAX = 2**31 - 1


def kernel_units():
    """None of its own: the projections are pydnn.ops.matmul's, the core is pydnn.ops.attention's."""
    return []


def _up(n):
    return -(-n // ALIGN) * ALIGN


def _bad(msg, status=E.PYDNN_STATUS_BAD_PARAM):
    raise PydnnError(status, msg)


def _ns(msg):
    raise PydnnError(E.PYDNN_STATUS_NOT_SUPPORTED, msg)


# ----------------------------------------------------------------------------- the attention descriptor

class AttnDescriptor:
    """cudnnAttnDescriptor_t."""

    __slots__ = ("mode", "heads", "sm_scaler", "dtype", "comp", "math", "attn_drop", "post_drop", "q_size",
                 "k_size", "v_size", "q_proj", "k_proj", "v_proj", "o_proj", "qo_max", "kv_max", "max_batch",
                 "max_beam", "is_set", "alive", "version")

    def __init__(self):
        self.is_set, self.alive, self.version = False, True, 0

    # derived sizes (a projection size 0 means the head sees the whole vector)
    @property
    def dq(self):
        return self.q_proj or self.q_size

    @property
    def dv(self):
        return self.v_proj or self.v_size

    @property
    def o_size(self):
        return self.o_proj or self.heads * self.dv

    @property
    def one_to_one(self):
        return bool(self.mode & ONE_TO_ONE)

    @property
    def biases(self):
        return bool(self.mode & BIASES)


def _live_attn(desc, name="attnDesc"):
    if type(desc) is not AttnDescriptor or not desc.alive:
        _bad(f"{name}: not a live multi-head attention descriptor")
    return desc


def _set_attn(desc, name="attnDesc"):
    if not _live_attn(desc, name).is_set:
        _bad(f"{name}: descriptor was never set")
    return desc


@api
def create_attn_descriptor():
    """cudnnCreateAttnDescriptor."""
    return AttnDescriptor()


def _dropout_desc(d, name):
    if d is None or (type(d) is int and d == 0):
        return None
    if type(d) is not DropoutDescriptor or not d.alive:
        _bad(f"{name}: not a live dropout descriptor")
    if not d.is_set:
        _bad(f"{name}: dropout descriptor was never set")
    return d


def _float_type(name, v):
    t = _int(name, v)
    if t not in FLOAT_DTYPES:
        if t in E.ENUMS["pydnnDataType_t"].values():
            _ns(f"{name}: data type {t} is not supported by multi-head attention (half, bfloat16, float, double)")
        _bad(f"{name}: {t} is not a pydnnDataType_t value")
    return t


@api
def set_attn_descriptor(attn_desc, attn_mode, n_heads, sm_scaler, data_type, compute_prec, math_type,
                        attn_dropout_desc, post_dropout_desc, q_size, k_size, v_size, q_proj_size, k_proj_size,
                        v_proj_size, o_proj_size, qo_max_seq_length, kv_max_seq_length, max_batch_size,
                        max_beam_size):
    """cudnnSetAttnDescriptor. BAD_PARAM: attnMode bits other than the query map and biases, sizes not
    positive (projection sizes: negative), qProjSize != kProjSize (or qSize != kSize without those
    projections), smScaler negative or not finite, computePrec narrower than dataType, an unknown mathType,
    dropout descriptors not live / never set. NOT_SUPPORTED: a data type other than the float types."""
    _live_attn(attn_desc)
    mode = _int("attnMode", attn_mode)
    if mode < 0 or mode & ~MODE_BITS:
        _bad(f"attnMode: {mode:#x} has bits other than PYDNN_ATTN_QUERYMAP_* | PYDNN_ATTN_*_PROJ_BIASES")
    heads = _int("nHeads", n_heads)
    if not 0 < heads <= INT_MAX:
        _bad(f"nHeads: {heads} must be positive")
    sm = scalar("smScaler", sm_scaler)
    if not (sm >= 0 and np.isfinite(sm)):
        _bad(f"smScaler: {sm!r} must be finite and not negative")
    dt, comp = _float_type("dataType", data_type), _float_type("computePrec", compute_prec)
    if (comp != dt and comp not in (E.PYDNN_DATA_FLOAT, E.PYDNN_DATA_DOUBLE)
            or (dt == E.PYDNN_DATA_DOUBLE) != (comp == E.PYDNN_DATA_DOUBLE)):
        _bad(f"computePrec: {comp} cannot compute dataType {dt} (double needs double; others the same type or float)")
    math = enum_arg("mathType", math_type, tuple(E.ENUMS["pydnnMathType_t"].values()), "pydnnMathType_t")
    drops = _dropout_desc(attn_dropout_desc, "attnDropoutDesc"), _dropout_desc(post_dropout_desc, "postDropoutDesc")
    sizes = {}
    for n, v in (("qSize", q_size), ("kSize", k_size), ("vSize", v_size), ("qoMaxSeqLength", qo_max_seq_length),
                 ("kvMaxSeqLength", kv_max_seq_length), ("maxBatchSize", max_batch_size),
                 ("maxBeamSize", max_beam_size)):
        sizes[n] = _int(n, v)
        if not 0 < sizes[n] <= INT_MAX:
            _bad(f"{n}: {sizes[n]} must be positive")
    for n, v in (("qProjSize", q_proj_size), ("kProjSize", k_proj_size), ("vProjSize", v_proj_size),
                 ("oProjSize", o_proj_size)):
        sizes[n] = _int(n, v)
        if not 0 <= sizes[n] <= INT_MAX:
            _bad(f"{n}: {sizes[n]} must be 0 (no projection) or positive")
    if sizes["qProjSize"] != sizes["kProjSize"]:
        _bad(f"kProjSize: {sizes['kProjSize']} differs from qProjSize {sizes['qProjSize']} (Q.K needs one length)")
    if sizes["qProjSize"] == 0 and sizes["qSize"] != sizes["kSize"]:
        _bad(f"kSize: {sizes['kSize']} differs from qSize {sizes['qSize']} and there are no Q / K projections")
    a = attn_desc
    a.mode, a.heads, a.sm_scaler, a.dtype, a.comp, a.math = mode, heads, sm, dt, comp, math
    a.attn_drop, a.post_drop = drops
    (a.q_size, a.k_size, a.v_size, a.qo_max, a.kv_max, a.max_batch, a.max_beam, a.q_proj, a.k_proj, a.v_proj,
     a.o_proj) = sizes.values()
    a.is_set = True
    a.version += 1


@api
def get_attn_descriptor(attn_desc):
    """cudnnGetAttnDescriptor -> (attnMode, nHeads, smScaler, dataType, computePrec, mathType,
    attnDropoutDesc, postDropoutDesc, qSize, kSize, vSize, qProjSize, kProjSize, vProjSize, oProjSize,
    qoMaxSeqLength, kvMaxSeqLength, maxBatchSize, maxBeamSize)."""
    a = _set_attn(attn_desc)
    return (a.mode, a.heads, a.sm_scaler, a.dtype, a.comp, a.math, a.attn_drop, a.post_drop, a.q_size, a.k_size,
            a.v_size, a.q_proj, a.k_proj, a.v_proj, a.o_proj, a.qo_max, a.kv_max, a.max_batch, a.max_beam)


@api
def destroy_attn_descriptor(attn_desc):
    """cudnnDestroyAttnDescriptor (None / NULL: nothing to do)."""
    if attn_desc is None:
        return
    _live_attn(attn_desc).alive = False
    attn_desc.version += 1


# ----------------------------------------------------------------------------- sequence data

class SeqDataDescriptor:
    """cudnnSeqDataDescriptor_t: dims by axis, memory order, per-sequence lengths, padding fill."""

    __slots__ = ("dtype", "dims", "axes", "lengths", "fill", "strides", "is_set", "alive", "version")

    def __init__(self):
        self.is_set, self.alive, self.version = False, True, 0

    @property
    def t(self):
        return self.dims[TIME]

    @property
    def b(self):
        return self.dims[BATCH]

    @property
    def m(self):
        return self.dims[BEAM]

    @property
    def vect(self):
        return self.dims[VECT]

    @property
    def rows(self):
        return self.t * self.b * self.m

    def row_stride(self, axis):
        """Stride of TIME / BATCH / BEAM in whole vectors (packed layout)."""
        return self.strides[axis] // self.vect


def _live_seq(desc, name):
    if type(desc) is not SeqDataDescriptor or not desc.alive:
        _bad(f"{name}: not a live sequence data descriptor")
    return desc


def _set_seq(desc, name):
    if not _live_seq(desc, name).is_set:
        _bad(f"{name}: descriptor was never set")
    return desc


def _int_list(name, seq, n):
    try:
        vals = list(seq)
    except TypeError:
        _bad(f"{name}: expected a sequence of {n} integers")
    if len(vals) < n:
        _bad(f"{name}: has {len(vals)} entries, {n} are needed")
    vals = vals[:n]
    if set(map(type, vals)) <= {int}:  # plain ints (the usual case): nothing to convert, checked at C speed
        return vals
    return [_int(f"{name}[{i}]", vals[i]) for i in range(n)]


@api
def create_seq_data_descriptor():
    """cudnnCreateSeqDataDescriptor."""
    return SeqDataDescriptor()


@api
def set_seq_data_descriptor(seq_data_desc, data_type, nb_dims, dim_a, axes, seq_length_array_size,
                            seq_length_array, padding_fill):
    """cudnnSetSeqDataDescriptor. BAD_PARAM: nbDims not 4, dims not positive, axes not a permutation of
    pydnnSeqDataAxis_t with VECT last, seqLengthArraySize != batch * beam, a length outside [0, time],
    paddingFill not a number. NOT_SUPPORTED: a data type that is not a float type."""
    d = _live_seq(seq_data_desc, "seqDataDesc")
    dt = _float_type("dataType", data_type)
    nb = _int("nbDims", nb_dims)
    if nb != E.PYDNN_SEQDATA_DIM_COUNT:
        _bad(f"nbDims: {nb} must be PYDNN_SEQDATA_DIM_COUNT ({E.PYDNN_SEQDATA_DIM_COUNT})")
    dims = _int_list("dimA", dim_a, nb)
    for i, v in enumerate(dims):
        if not 0 < v <= INT_MAX:
            _bad(f"dimA[{i}]: {v} must be positive")
    order = _int_list("axes", axes, nb)
    for i, v in enumerate(order):
        if v not in (TIME, BATCH, BEAM, VECT):
            _bad(f"axes[{i}]: {v} is not a pydnnSeqDataAxis_t value")
    if sorted(order) != [TIME, BATCH, BEAM, VECT]:
        _bad(f"axes: {order} names an axis twice (a permutation of TIME, BATCH, BEAM, VECT is needed)")
    if order[3] != VECT:
        _bad(f"axes[3]: {order[3]}; the vectors must be innermost (PYDNN_SEQDATA_VECT_DIM last)")
    n = _int("seqLengthArraySize", seq_length_array_size)
    if n != dims[BATCH] * dims[BEAM]:
        _bad(f"seqLengthArraySize: {n} must be batch * beam = {dims[BATCH] * dims[BEAM]}")
    lens = _int_list("seqLengthArray", seq_length_array, n)
    for i, v in enumerate(lens):
        if not 0 <= v <= dims[TIME]:
            _bad(f"seqLengthArray[{i}]: {v} is outside [0, {dims[TIME]}] (dimA[PYDNN_SEQDATA_TIME_DIM])")
    fill = None if padding_fill is None else scalar("paddingFill", padding_fill)
    strides, acc = [0] * 4, 1
    for ax in reversed(order):
        strides[ax] = acc
        acc *= dims[ax]
    d.dtype, d.dims, d.axes, d.lengths, d.fill, d.strides = dt, tuple(dims), tuple(order), tuple(lens), fill, strides
    d.is_set = True
    d.version += 1


@api
def get_seq_data_descriptor(seq_data_desc, nb_dims_requested, seq_length_size_requested):
    """cudnnGetSeqDataDescriptor -> (dataType, nbDims, dimA[:nbDimsRequested], axes[:nbDimsRequested],
    seqLengthArraySize, seqLengthArray[:seqLengthSizeRequested], paddingFill (None: none))."""
    d = _set_seq(seq_data_desc, "seqDataDesc")
    req = _int("nbDimsRequested", nb_dims_requested)
    if req < 0:
        _bad(f"nbDimsRequested: {req} is negative")
    lreq = _int("seqLengthSizeRequested", seq_length_size_requested)
    if lreq < 0:
        _bad(f"seqLengthSizeRequested: {lreq} is negative")
    return (d.dtype, 4, list(d.dims[:req]), list(d.axes[:req]), len(d.lengths), list(d.lengths[:lreq]), d.fill)


@api
def destroy_seq_data_descriptor(seq_data_desc):
    """cudnnDestroySeqDataDescriptor (None / NULL: nothing to do)."""
    if seq_data_desc is None:
        return
    _live_seq(seq_data_desc, "seqDataDesc").alive = False
    seq_data_desc.version += 1


# ----------------------------------------------------------------------------- buffers and weights

def weight_regions(a):
    """kind -> (byte offset, dims, strides) of every weight / bias tensor that exists, and the total bytes."""
    h = a.heads
    shapes = {}
    for kind, proj, size in ((QW, a.q_proj, a.q_size), (KW, a.k_proj, a.k_size), (VW, a.v_proj, a.v_size)):
        if proj:
            shapes[kind] = ((h, proj, size), (proj * size, size, 1))
    if a.o_proj:
        shapes[OW] = ((h, a.o_proj, a.dv), (a.dv, h * a.dv, 1))
    if a.biases:
        for kind, proj in ((QB, a.q_proj), (KB, a.k_proj), (VB, a.v_proj)):
            if proj:
                shapes[kind] = ((h, proj, 1), (proj, 1, 1))
        if a.o_proj:
            shapes[OB] = ((1, a.o_proj, 1), (a.o_proj, 1, 1))
    item, off, regions = DTYPES[a.dtype][0], 0, {}
    for kind in KINDS:
        if kind in shapes:
            dims, strides = shapes[kind]
            regions[kind] = (off, dims, strides)
            off = _up(off + dims[0] * dims[1] * dims[2] * item)
    return regions, off


class _Sizes:
    """Byte offsets of the work and reserve regions for given dims (batch B, beams M / Mk, lengths)."""

    def __init__(self, a, b, m, tq, tk, mk):
        item, h = DTYPES[a.dtype][0], a.heads
        nq, nk = b * m * tq, b * mk * tk
        self.qp, self.kp, self.vp = nq * h * a.dq * item, nk * h * a.dq * item, nk * h * a.dv * item
        self.ao = nq * h * a.dv * item
        self.lse = b * m * h * tq * 4
        self.dsum = (b * m * h * tq * 4 + 15) // 16 * 16
        self.ones, self.mask = max(nq, nk) * item, nq * item
        # reserve: Qp Kp Vp Ao lse dQp dKp dVp
        r = {}
        off = 0
        for name, n in (("qp", self.qp), ("kp", self.kp), ("vp", self.vp), ("ao", self.ao), ("lse", self.lse),
                        ("dqp", self.qp), ("dkp", self.kp), ("dvp", self.vp)):
            r[name] = off
            off = _up(off + n)
        self.reserve_off, self.reserve = r, off
        # workspace: inference forward (Qp Kp Vp Ao) | backward data (dAo, dsum) | backward weights (mask)
        w, off = {}, 0
        for name, n in (("qp", self.qp), ("kp", self.kp), ("vp", self.vp), ("ao", self.ao)):
            w[name] = off
            off = _up(off + n)
        self.ws_fwd_off, self.ws_fwd = w, off
        self.ws_bwd = _up(_up(self.ao) + self.dsum)
        self.ws_wgt = _up(self.ones) + _up(self.mask)  # ones (bias sums), then the valid-row mask (dout's)
        self.workspace = max(self.ws_fwd, self.ws_bwd, self.ws_wgt)


@api
def get_multi_head_attn_buffers(handle, attn_desc):
    """cudnnGetMultiHeadAttnBuffers -> (weightSizeInBytes, workSpaceSizeInBytes, reserveSpaceSizeInBytes)
    for the descriptor's maxima (the workspace covers inference and training; the reserve is training's)."""
    check_handle(handle)
    a = _set_attn(attn_desc)
    m = a.max_beam
    s = _Sizes(a, a.max_batch, m, a.qo_max, a.kv_max, m if a.one_to_one else 1)
    return weight_regions(a)[1], s.workspace, s.reserve


@api
def get_multi_head_attn_weights(handle, attn_desc, w_kind, weight_size_in_bytes, weights, w_desc):
    """cudnnGetMultiHeadAttnWeights -> wAddr: the device address of one weight or bias tensor in the weight
    buffer, and wDesc set to its dims and strides (3-d, the data type); wAddr 0 (NULL) for a kind that does
    not exist (wDesc unchanged). BAD_PARAM: wKind, weightSizeInBytes smaller than the buffer, wDesc."""
    check_handle(handle)
    a = _set_attn(attn_desc)
    kind = enum_arg("wKind", w_kind, KINDS, "pydnnMultiHeadAttnWeightKind_t")
    regions, total = weight_regions(a)
    size = _int("weightSizeInBytes", weight_size_in_bytes)
    if size < total:
        _bad(f"weightSizeInBytes: {size} is less than the {total} bytes of the weight buffer")
    _live_tensor(w_desc, "wDesc")
    base = device_ptr(weights, "weights", total) if total else 0
    if kind not in regions:
        return 0
    off, dims, strides = regions[kind]
    w_desc._assign(a.dtype, dims, strides)
    return base + off


# ----------------------------------------------------------------------------- validation of the calls

class _Call:
    """What one forward / backward call works on, validated."""
    __slots__ = ("a", "q", "k", "v", "o", "mk", "sizes", "item")


def _seq_arg(desc, name, a, vect, vect_name):
    d = _set_seq(desc, name)
    if d.dtype != a.dtype:
        _bad(f"{name}: data type {d.dtype} differs from attnDesc's dataType {a.dtype}")
    if d.vect != vect:
        _bad(f"{name}: dimA[PYDNN_SEQDATA_VECT_DIM] = {d.vect}, the attention descriptor's {vect_name} is {vect}")
    if d.b > a.max_batch:
        _bad(f"{name}: batch {d.b} exceeds attnDesc's maxBatchSize {a.max_batch}")
    if d.m > a.max_beam:
        _bad(f"{name}: beam {d.m} exceeds attnDesc's maxBeamSize {a.max_beam}")
    return d


def _same_geometry(ref, rname, d, name, vect_ok=False):
    dims_eq = ref.dims[:3] == d.dims[:3] if vect_ok else ref.dims == d.dims
    if not dims_eq or ref.axes != d.axes:
        _bad(f"{name}: dims {d.dims} / axes {d.axes} differ from {rname}'s {ref.dims} / {ref.axes}")
    if ref.lengths != d.lengths:
        _bad(f"{name}: seqLengthArray differs from {rname}'s")


def _validate(a, q_desc, k_desc, v_desc, o_desc, names=("qDesc", "kDesc", "vDesc", "oDesc")):
    qn, kn, vn, on = names
    c = _Call()
    c.a = a
    c.q = _seq_arg(q_desc, qn, a, a.q_size, "qSize")
    c.k = _seq_arg(k_desc, kn, a, a.k_size, "kSize")
    c.v = _seq_arg(v_desc, vn, a, a.v_size, "vSize")
    c.o = _seq_arg(o_desc, on, a, a.o_size, "output size (oProjSize, or nHeads * vProjSize)")
    if c.q.t > a.qo_max:
        _bad(f"{qn}: time {c.q.t} exceeds attnDesc's qoMaxSeqLength {a.qo_max}")
    if c.k.t > a.kv_max:
        _bad(f"{kn}: time {c.k.t} exceeds attnDesc's kvMaxSeqLength {a.kv_max}")
    if c.k.b != c.q.b:
        _bad(f"{kn}: batch {c.k.b} differs from {qn}'s {c.q.b}")
    mk = c.q.m if a.one_to_one else 1
    if c.k.m != mk:
        how = "ONE_TO_ONE: one per query beam" if a.one_to_one else "ALL_TO_ONE: 1"
        _bad(f"{kn}: beam {c.k.m} must be {mk} ({how})")
    _same_geometry(c.k, kn, c.v, vn, vect_ok=True)
    _same_geometry(c.q, qn, c.o, on, vect_ok=True)
    c.mk = mk
    c.item = DTYPES[a.dtype][0]
    c.sizes = _Sizes(a, c.q.b, c.q.m, c.q.t, c.k.t, mk)
    return c


def _win_array(arr, name, n):
    """loWinIdx / hiWinIdx: n host ints (a sequence from Python; from C a reader of the caller's array)."""
    read = getattr(arr, "read", None)
    if read is not None:
        arr = read(n)
    if arr is None:
        _bad(f"{name}: NULL pointer", E.PYDNN_STATUS_BAD_PARAM_NULL_POINTER)
    return _int_list(name, arr, n)


def _windows(c, lo_win_idx, hi_win_idx, curr_idx):
    n = c.a.qo_max
    lo, hi = _win_array(lo_win_idx, "loWinIdx", n), _win_array(hi_win_idx, "hiWinIdx", n)
    t = curr_idx
    if t >= 0 and lo[t] >= hi[t]:  # all steps: empty windows are allowed (those rows see no key)
        _bad(f"loWinIdx[{t}]: {lo[t]} is not below hiWinIdx[{t}] = {hi[t]} (an empty attention window)")
    return lo, hi


# (windows, lengths, step) -> the fused mask: the scan below is O(sequence) Python work per call (~1 ms
# at S = 2048), which made the inference forward host-bound; a layer calls with the same windows every
# step, so the answer is kept for a few distinct problems. Errors are not cached (they raise each time).
_MASK_MEMO = {}
_MASK_MEMO_SIZE = 16


def _fused_mask(c, lo, hi, curr_idx):
    """The fused kernel's mask (and for one inference step, the number of keys) for the windows, or
    NOT_SUPPORTED naming the first entry it cannot express."""
    if curr_idx >= 0:
        return _scan_mask(c, lo, hi, curr_idx)
    key = (c.q.t, c.k.t, tuple(c.q.lengths), tuple(_kv_lengths(c)), tuple(lo[:c.q.t]), tuple(hi[:c.q.t]))
    got = _MASK_MEMO.get(key)
    if got is None:
        got = _scan_mask(c, lo, hi, curr_idx)
        if len(_MASK_MEMO) >= _MASK_MEMO_SIZE:
            _MASK_MEMO.pop(next(iter(_MASK_MEMO)))
        _MASK_MEMO[key] = got
    return got


def _scan_mask(c, lo, hi, curr_idx):
    for t in (range(c.q.t) if curr_idx < 0 else (curr_idx,)):
        if lo[t] > 0:
            _ns(f"loWinIdx[{t}]: {lo[t]} > 0; the fused attention kernel has no window that starts after "
                "key 0 (sliding windows are not supported)")
    if curr_idx >= 0:
        if hi[curr_idx] <= 0:
            _bad(f"hiWinIdx[{curr_idx}]: {hi[curr_idx]}; the window of step currIdx holds no key")
        return E.PYDNN_ATTN_MASK_NONE, min(hi[curr_idx], c.k.t)
    kv = _kv_lengths(c)
    lk = max(kv) if kv else 0
    q = list(c.q.lengths)
    rows = range(max(q) if q else 0)
    eff = [min(max(hi[t], 0), lk) for t in rows]
    if all(e == lk for e in eff):
        return E.PYDNN_ATTN_MASK_NONE, c.k.t
    if all(e == min(t + 1, lk) for t, e in zip(rows, eff)):
        return E.PYDNN_ATTN_MASK_CAUSAL_TOP_LEFT, c.k.t
    deltas = {kvl - ql for kvl, ql in zip(kv, q)}
    if len(deltas) == 1:
        dl = deltas.pop()
        if all(e == min(max(t + 1 + dl, 0), lk) for t, e in zip(rows, eff)):
            return E.PYDNN_ATTN_MASK_CAUSAL_BOTTOM_RIGHT, c.k.t
    bad = next((t for t, e in zip(rows, eff) if e not in (lk, min(t + 1, lk))), 0)
    _ns(f"hiWinIdx[{bad}]: {hi[bad]}; the fused attention kernel takes windows ending past every key, at "
        "t + 1 (causal, top-left) or at t + 1 + kvLength - qoLength with one difference for all sequences "
        "(causal, bottom-right)")


def _kv_lengths(c):
    """The K/V length each query sequence (b, m) sees, in the order of the query lengths."""
    k = c.k.lengths
    return [k[b * c.mk + (m if c.mk > 1 else 0)] for b in range(c.q.b) for m in range(c.q.m)]


def _fold(d):
    """(batch entries, beams) folded into one batch index b * M + m with one row stride, or None."""
    if d.m == 1:
        return d.row_stride(BATCH)
    if d.row_stride(BATCH) == d.m * d.row_stride(BEAM):
        return d.row_stride(BEAM)
    return None


def _groups(c):
    """[(first folded batch index, count, q row offset, k row offset, q batch stride, k batch stride)]: one
    group when both Q and K fold, else one per batch entry (each over its beams)."""
    fq, fk = _fold(c.q), _fold(c.k)
    if fq is not None and fk is not None:
        return [(0, c.q.b * c.q.m, 0, 0, fq, fk)]
    sq, sk = c.q.row_stride(BEAM), c.k.row_stride(BEAM)
    return [(b * c.q.m, c.q.m, b * c.q.row_stride(BATCH), b * c.k.row_stride(BATCH), sq, sk) for b in range(c.q.b)]


def _gpu_support(c, need_dropout):
    """NOT_SUPPORTED (naming the argument) for what the GPU path cannot do; returns the dropout (p, seed)."""
    a = c.a
    if a.dtype not in GPU_DTYPES:
        _ns(f"attnDesc: dataType {a.dtype}; the GPU path runs half and bfloat16 (the fused attention kernel's)")
    if a.comp != E.PYDNN_DATA_FLOAT:
        _ns(f"attnDesc: computePrec {a.comp}; the GPU path computes in float")
    for n, v in (("qProjSize", a.q_proj), ("kProjSize", a.k_proj), ("vProjSize", a.v_proj)):
        if v == 0:
            _ns(f"attnDesc: {n} 0 (no projection) is not supported on the GPU (only projected Q, K, V)")
    if a.q_proj not in FA.HEAD_DIMS:
        _ns(f"attnDesc: qProjSize {a.q_proj}; the fused attention kernel takes head dims {FA.HEAD_DIMS}")
    if a.v_proj != a.q_proj:
        _ns(f"attnDesc: vProjSize {a.v_proj} differs from qProjSize {a.q_proj} (the fused kernel has one head dim)")
    if a.sm_scaler <= 0:
        _ns("attnDesc: smScaler 0 (uniform attention) is not supported by the fused kernel")
    if not a.one_to_one and c.q.m > 1:
        _ns(f"qDesc: beam {c.q.m} with the ALL_TO_ONE query map (K / V shared by the beams) is not supported")
    if a.post_drop is not None and a.post_drop.dropout != 0:
        _ns("attnDesc: postDropoutDesc with a probability > 0 is not supported")
    p, seed = 0.0, 0
    if need_dropout and a.attn_drop is not None and a.attn_drop.dropout != 0:
        p, seed = a.attn_drop.dropout, a.attn_drop.seed
        if p >= 1.0:
            _ns("attnDesc: attnDropoutDesc probability 1 drops every weight; not supported")
        if len(_groups(c)) > 1:
            _ns("attnDesc: attention dropout needs the batch and beam axes of qDesc and kDesc to fold into one "
                "batch stride (batch just outside beam, or beam 1)")
    return p, seed


def _ptr(buf, name, nbytes, align=16):
    p = device_ptr(buf, name, nbytes)
    if p % align:
        _bad(f"{name}: {p:#x} is not {align}-byte aligned", E.PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER)
    return p


def _opt_ptr(buf):
    return buf is None or (type(buf) is int and buf == 0)


def _seq_bytes(d, item):
    return d.rows * d.vect * item


def _buffer(buf, size, need, name, size_name):
    n = _int(size_name, size)
    if n < need:
        _bad(f"{size_name}: {n} is less than the {need} bytes this call needs")
    return _ptr(buf, name, max(need, 1)) if need else 0


def _lens_ptr(buf, name, n):
    p = device_ptr(buf, name, 4 * n)
    if p % 4:
        _bad(f"{name}: {p:#x} is not 4-byte aligned (int32)", E.PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER)
    return p


# ----------------------------------------------------------------------------- GPU pieces

def _matmul():
    return matmul


class _Gemm:
    """One planned GEMM launch (planned before anything is launched, so a refusal leaves no half work)."""

    def __init__(self, mm, handle, dt, m, n, k, a, b, c, *, ta=False, tb=False, lda, ldb, ldc, alpha=1.0,
                 beta=0.0, bias=0):
        self.plan = mm.cached_plan(handle, dt, m, n, k, trans_a=ta, trans_b=tb, lda=lda, ldb=ldb, ldc=ldc,
                                   bias=bool(bias))
        self.args = (a, b, c, alpha, beta, bias)

    def __call__(self, handle):
        a, b, c, alpha, beta, bias = self.args
        self.plan.launch(handle, a, b, c, alpha=alpha, beta=beta, bias=bias)


def _tdesc(dt, dims, strides):
    t = TensorDescriptor()
    t._assign(dt, tuple(dims), tuple(strides))
    return t


def _fa_desc(c, mask, p, seed):
    fa = FA.AttentionDescriptor()
    FA.set_attention_descriptor(fa, c.a.heads, c.a.heads, c.a.q_proj, c.a.sm_scaler, mask, p, seed)
    return fa


def _head_desc(c, d, count, bstride, seq, t_stride, width):
    """A (count, H, seq, D) view of projected rows laid out like `d` (vectors of H * D)."""
    h = c.a.heads
    return _tdesc(c.a.dtype, (count, h, seq, width), (bstride * h * width, width, t_stride * h * width, 1))


def _rows_desc(dt, count, stride, width):
    """`count` vectors of `width` elements, `stride` vectors apart (4-d for the tensor ops)."""
    return _tdesc(dt, (1, 1, count, width), (count * stride * width, count * stride * width, stride * width, 1))


def _projection(mm, handle, c, x, d, w, bias, out, width):
    """out [rows, H*width] = x [rows, size] @ W^T + bias."""
    n = c.a.heads * width
    return _Gemm(mm, handle, c.a.dtype, d.rows, n, d.vect, x, w, out, tb=True, lda=d.vect, ldb=d.vect, ldc=n,
                 bias=bias)


def _fill_padding(handle, c, out, o, step=None):
    """paddingFill into every output vector past its sequence's length (step: only that time-step)."""
    st, sb, sm = o.row_stride(TIME), o.row_stride(BATCH), o.row_stride(BEAM)
    for b in range(o.b):
        for m in range(o.m):
            n = o.lengths[b * o.m + m]
            first, count = (n, o.t - n) if step is None else (step, 1 if step >= n else 0)
            if count > 0:
                row = b * sb + m * sm + first * st
                tensor_ops.set_tensor(handle, _rows_desc(o.dtype, count, st, o.vect), out + row * o.vect * c.item, o.fill)



# ----------------------------------------------------------------------------- plans (pydnn/ops/_replay.py)
# Everything a call decides from its descriptors, sizes and windows (validation, the weight regions and
# workspace offsets, the GEMM plans, the fused kernel's descriptors, masks and kernels) is decided once per
# (attnDesc and the sequence descriptors at their versions, the attention dropout descriptors' versions,
# currIdx, which optional buffers are given, the size arguments) and kept as a recorded plan on the handle;
# a repeated call checks its buffers and windows against the plan and launches it (pointers patched only
# when they changed). tuning.callpath.MHA_PLANS = False (or PYDNN_CHECKED=1) runs every call in full.

_PLAIN_KEY = frozenset((int, bool, type(None)))


def _plan_key(kind, attn_desc, descs, scalars):
    if not tuning.callpath.MHA_PLANS or _buffers.CHECKED:
        return None
    try:
        a = attn_desc
        key = [kind, a, a.version, a.attn_drop, a.post_drop]
        for dd in (a.attn_drop, a.post_drop):
            key.append(None if dd is None else dd.version)
        for d in descs:
            key.append(d)
            key.append(d.version)
    except AttributeError:
        return None
    for v in scalars:
        if type(v) not in _PLAIN_KEY:
            return None
        key.append(v)
    return tuple(key)


def _read_windows(arr, n):
    """A window array's first n entries as a list for comparing with a plan's (None: not comparable)."""
    read = getattr(arr, "read", None)
    if read is not None:
        return read(n)
    if type(arr) is list:
        return arr[:n] if len(arr) > n else arr
    if type(arr) is tuple:
        return list(arr[:n])
    tolist = getattr(arr, "tolist", None)  # a numpy array: its first n entries as Python ints
    if tolist is not None and getattr(arr, "ndim", 0) == 1 and getattr(arr.dtype, "kind", "") in "iu":
        vals = arr[:n].tolist()
        return vals if len(vals) == n else None
    return None


def _planned(handle, key, args, windows, full, bases):
    """Launch the call's plan if it has one that fits, else run it in full (making its plan)."""
    if key is None:
        return full(*args)
    plan = handle.prepared.get(key)
    if plan is not None:
        idx, names, n = plan.extra[0], plan.extra[1], plan.extra[2]
        ok = True
        if windows is not None:
            for arr, want in zip(windows, plan.extra[3]):
                got = _read_windows(arr, n)
                if got is None or got != want:
                    ok = False
                    break
        if ok:
            ptrs = _replay.resolve([args[i] for i in idx], names, plan.needs, plan.aligns)
            if ptrs is not None:
                if tuple(ptrs) == plan.last:
                    plan.launch(handle)
                    return None
                if _replay.signature(ptrs) == plan.sig and not _replay.overlapping(ptrs, plan.needs):
                    plan.repatch(ptrs)
                    plan.launch(handle)
                    return None
    try:
        spec, n = bases(args)
    except PydnnError:
        spec = None
    if spec is None:
        return full(*args)
    idx = [b[0] for b in spec]
    names, needs, aligns = [b[1] for b in spec], [b[2] for b in spec], [b[3] for b in spec]
    ptrs = _replay.resolve([args[i] for i in idx], names, needs, aligns)
    if ptrs is None or _replay.overlapping(ptrs, needs):
        return full(*args)

    def run(ps):
        a2 = list(args)
        for i, p in zip(idx, ps):
            a2[i] = p
        full(*a2)

    real, plan = _replay.record(run, ptrs)
    if plan is not None:
        wins = None if windows is None else tuple(_read_windows(w, n) for w in windows)
        if windows is None or all(w is not None for w in wins):
            plan.needs, plan.aligns = tuple(needs), tuple(aligns)
            plan.extra = (tuple(idx), tuple(names), n, tuple(list(w) for w in wins) if wins else None)
            handle.remember(key, plan)
        plan.launch(handle)
    else:
        _replay.launch_items(handle, real)
    return None

# ----------------------------------------------------------------------------- the calls

@api
def multi_head_attn_forward(handle, attn_desc, curr_idx, lo_win_idx, hi_win_idx, dev_seq_lengths_qo,
                            dev_seq_lengths_kv, q_desc, queries, residuals, k_desc, keys, v_desc, values, o_desc,
                            out, weight_size_in_bytes, weights, work_space_size_in_bytes, work_space,
                            reserve_space_size_in_bytes, reserve_space):
    """cudnnMultiHeadAttnForward. reserveSpace NULL: inference (currIdx >= 0 computes that query step only,
    negative: all); otherwise training (currIdx negative). Statuses: BAD_PARAM (descriptors that disagree
    with attnDesc or each other, currIdx, window arrays, sizes too small, residuals with oSize != qSize),
    BAD_PARAM_NULL_POINTER, BAD_PARAM_MISALIGNED_POINTER (buffers not 16-byte aligned, lengths not 4),
    NOT_SUPPORTED (see the module docstring)."""
    check_handle(handle)
    args = (handle, attn_desc, curr_idx, lo_win_idx, hi_win_idx, dev_seq_lengths_qo, dev_seq_lengths_kv, q_desc,
            queries, residuals, k_desc, keys, v_desc, values, o_desc, out, weight_size_in_bytes, weights,
            work_space_size_in_bytes, work_space, reserve_space_size_in_bytes, reserve_space)
    key = _plan_key("fwd", attn_desc, (q_desc, k_desc, v_desc, o_desc),
                    (curr_idx, _opt_ptr(residuals), _opt_ptr(reserve_space), weight_size_in_bytes,
                     work_space_size_in_bytes, reserve_space_size_in_bytes))
    _planned(handle, key, args, (lo_win_idx, hi_win_idx), _forward_full, _forward_bases)


def _forward_bases(args):
    """[(argument index, name, bytes needed, alignment)] of the forward's device buffers that it reads."""
    (handle, attn_desc, curr_idx, _, _, _, _, q_desc, _, residuals, k_desc, _, v_desc, _, o_desc, _, _, _, _, _, _,
     reserve_space) = args
    a = _set_attn(attn_desc)
    c = _validate(a, q_desc, k_desc, v_desc, o_desc)
    s, item = c.sizes, c.item
    out = [(8, "queries", _seq_bytes(c.q, item), 16), (11, "keys", _seq_bytes(c.k, item), 16),
           (13, "values", _seq_bytes(c.v, item), 16), (15, "out", _seq_bytes(c.o, item), 16)]
    if not _opt_ptr(residuals):
        out.append((9, "residuals", _seq_bytes(c.q, item), 16))
    out += [(5, "devSeqLengthsQO", 4 * c.q.b * c.q.m, 4), (6, "devSeqLengthsKV", 4 * c.k.b * c.k.m, 4),
            (17, "weights", weight_regions(a)[1], 16)]
    if _opt_ptr(reserve_space):
        out.append((19, "workSpace", s.ws_fwd, 16))
    else:
        out.append((21, "reserveSpace", s.reserve, 16))
    return [b for b in out if b[2] > 0], a.qo_max


def _forward_full(handle, attn_desc, curr_idx, lo_win_idx, hi_win_idx, dev_seq_lengths_qo, dev_seq_lengths_kv,
                  q_desc, queries, residuals, k_desc, keys, v_desc, values, o_desc, out, weight_size_in_bytes,
                  weights, work_space_size_in_bytes, work_space, reserve_space_size_in_bytes, reserve_space):
    a = _set_attn(attn_desc)
    c = _validate(a, q_desc, k_desc, v_desc, o_desc)
    idx = _int("currIdx", curr_idx)
    training = not _opt_ptr(reserve_space)
    if idx >= c.q.t:
        _bad(f"currIdx: {idx} is past qDesc's last time-step {c.q.t - 1}")
    if training and idx >= 0:
        _bad(f"currIdx: {idx}; training (reserveSpace given) computes every time-step, currIdx must be negative")
    lo, hi = _windows(c, lo_win_idx, hi_win_idx, idx)
    has_res = not _opt_ptr(residuals)
    if has_res and a.o_size != a.q_size:
        _bad(f"residuals: need an output size equal to qSize ({a.o_size} != {a.q_size})")
    s, item = c.sizes, c.item
    wtotal = weight_regions(a)[1]
    ptrs = {"queries": _ptr(queries, "queries", _seq_bytes(c.q, item)),
            "keys": _ptr(keys, "keys", _seq_bytes(c.k, item)),
            "values": _ptr(values, "values", _seq_bytes(c.v, item)),
            "out": _ptr(out, "out", _seq_bytes(c.o, item))}
    res = _ptr(residuals, "residuals", _seq_bytes(c.q, item)) if has_res else 0
    lq = _lens_ptr(dev_seq_lengths_qo, "devSeqLengthsQO", c.q.b * c.q.m)
    lk = _lens_ptr(dev_seq_lengths_kv, "devSeqLengthsKV", c.k.b * c.k.m)
    wp = _buffer(weights, weight_size_in_bytes, wtotal, "weights", "weightSizeInBytes")
    if training:
        ws = _buffer(work_space, work_space_size_in_bytes, 0, "workSpace", "workSpaceSizeInBytes")
        rs = _buffer(reserve_space, reserve_space_size_in_bytes, s.reserve, "reserveSpace", "reserveSpaceSizeInBytes")
        reg = {k: rs + v for k, v in s.reserve_off.items()}
    else:
        ws = _buffer(work_space, work_space_size_in_bytes, s.ws_fwd, "workSpace", "workSpaceSizeInBytes")
        reg = {k: ws + v for k, v in s.ws_fwd_off.items()}
    p, seed = _gpu_support(c, training)
    mask, kv_seq = _fused_mask(c, lo, hi, idx)
    _run_forward(handle, c, idx, ptrs, res, wp, reg, lq, lk, mask, kv_seq, p, seed, training)


def _run_forward(handle, c, idx, ptrs, res, wp, reg, lq, lk, mask, kv_seq, p, seed, training):
    mm, a, item = _matmul(), c.a, c.item
    regions = {k: wp + off for k, (off, _, _) in weight_regions(a)[0].items()}
    D, H, dt = a.q_proj, a.heads, a.dtype
    direct = a.o_proj == 0 and not training  # the heads are the output: the fused kernel writes `out`
    ao = ptrs["out"] if direct else reg["ao"]
    gemms = [_projection(mm, handle, c, ptrs["queries"], c.q, regions[QW], regions.get(QB, 0), reg["qp"], D),
             _projection(mm, handle, c, ptrs["keys"], c.k, regions[KW], regions.get(KB, 0), reg["kp"], D),
             _projection(mm, handle, c, ptrs["values"], c.v, regions[VW], regions.get(VB, 0), reg["vp"], D)]
    out_gemms = []
    o_rows = _step_rows(c, idx)
    if a.o_proj:
        for r0, count, stride in o_rows:
            out_gemms.append(_Gemm(mm, handle, dt, count, a.o_proj, H * D, ao + r0 * H * D * item, regions[OW],
                                   ptrs["out"] + r0 * a.o_proj * item, tb=True, lda=stride * H * D, ldb=H * D,
                                   ldc=stride * a.o_proj, bias=regions.get(OB, 0)))
    fa = _fa_desc(c, mask, p, seed)
    for g in gemms:
        g(handle)
    st_q, st_k = c.q.row_stride(TIME), c.k.row_stride(TIME)
    for bb0, count, rq, rk, bq, bk in _groups(c):
        sq = c.q.t if idx < 0 else 1
        t0 = 0 if idx < 0 else idx
        qoff = (rq + t0 * st_q) * H * D * item
        qd = _head_desc(c, c.q, count, bq, sq, st_q, D)
        kd = _head_desc(c, c.k, count, bk, kv_seq, st_k, D)
        stats_d, stats = None, 0
        if training:
            stats_d = _tdesc(E.PYDNN_DATA_FLOAT, (count, H, c.q.t, 1), (H * c.q.t, c.q.t, 1, 1))
            stats = reg["lse"] + bb0 * H * c.q.t * 4
        lens_q = 0 if idx >= 0 else lq + bb0 * 4
        lens_k = lk + (bb0 // c.q.m) * c.mk * 4
        FA.attention_forward(handle, fa, qd, reg["qp"] + qoff, kd, reg["kp"] + rk * H * D * item, kd,
                             reg["vp"] + rk * H * D * item, qd, ao + qoff, stats_d, stats, lens_q or None,
                             lens_k, None, 0)
    for g in out_gemms:
        g(handle)
    if a.o_proj == 0 and training:
        driver.memcpy_dtod_async(ptrs["out"], ao, _seq_bytes(c.o, item), handle.cu_stream)
    if res:
        for r0, count, stride in o_rows:
            tensor_ops.add_tensor(handle, 1.0, _rows_desc(dt, count, stride, a.q_size), res + r0 * a.q_size * item, 1.0,
                       _rows_desc(dt, count, stride, a.o_size), ptrs["out"] + r0 * a.o_size * item)
    if c.o.fill is not None:
        _fill_padding(handle, c, ptrs["out"], c.o, None if idx < 0 else idx)


def _step_rows(c, idx):
    """[(first row, rows, row stride)] covering the output rows computed: all of them, or those of step idx."""
    if idx < 0:
        return [(0, c.q.rows, 1)]
    st = c.q.row_stride(TIME)
    return [(idx * st + rq, count, bq) for _, count, rq, _, bq, _ in _groups(c)]


def _check_reserve(reserve_space, size, s):
    if _opt_ptr(reserve_space):
        _bad("reserveSpace: NULL; the backward needs the reserve space of a training forward",
             E.PYDNN_STATUS_BAD_PARAM_NULL_POINTER)
    return _buffer(reserve_space, size, s.reserve, "reserveSpace", "reserveSpaceSizeInBytes")


@api
def multi_head_attn_backward_data(handle, attn_desc, lo_win_idx, hi_win_idx, dev_seq_lengths_dqdo,
                                  dev_seq_lengths_dkdv, do_desc, dout, dq_desc, dqueries, queries, dk_desc, dkeys,
                                  keys, dv_desc, dvalues, values, weight_size_in_bytes, weights,
                                  work_space_size_in_bytes, work_space, reserve_space_size_in_bytes, reserve_space):
    """cudnnMultiHeadAttnBackwardData: dqueries, dkeys, dvalues (written, not added) after a training forward
    with the same descriptors, windows and buffers. Statuses as the forward, plus BAD_PARAM_NULL_POINTER for
    a NULL reserveSpace."""
    check_handle(handle)
    args = (handle, attn_desc, lo_win_idx, hi_win_idx, dev_seq_lengths_dqdo, dev_seq_lengths_dkdv, do_desc, dout,
            dq_desc, dqueries, queries, dk_desc, dkeys, keys, dv_desc, dvalues, values, weight_size_in_bytes,
            weights, work_space_size_in_bytes, work_space, reserve_space_size_in_bytes, reserve_space)
    key = _plan_key("bwd_data", attn_desc, (do_desc, dq_desc, dk_desc, dv_desc),
                    (_opt_ptr(reserve_space), weight_size_in_bytes, work_space_size_in_bytes,
                     reserve_space_size_in_bytes))
    _planned(handle, key, args, (lo_win_idx, hi_win_idx), _backward_data_full, _backward_data_bases)


def _backward_data_bases(args):
    (handle, attn_desc, _, _, _, _, do_desc, _, dq_desc, _, _, dk_desc, _, _, dv_desc, _, _, _, _, _, _, _,
     reserve_space) = args
    a = _set_attn(attn_desc)
    c = _validate(a, dq_desc, dk_desc, dv_desc, do_desc, ("dqDesc", "dkDesc", "dvDesc", "doDesc"))
    s, item = c.sizes, c.item
    if _opt_ptr(reserve_space):
        return None, 0  # an error the full path reports
    out = [(7, "dout", _seq_bytes(c.o, item), 16), (9, "dqueries", _seq_bytes(c.q, item), 16),
           (10, "queries", _seq_bytes(c.q, item), 16), (12, "dkeys", _seq_bytes(c.k, item), 16),
           (13, "keys", _seq_bytes(c.k, item), 16), (15, "dvalues", _seq_bytes(c.v, item), 16),
           (16, "values", _seq_bytes(c.v, item), 16), (4, "devSeqLengthsDQDO", 4 * c.q.b * c.q.m, 4),
           (5, "devSeqLengthsDKDV", 4 * c.k.b * c.k.m, 4), (18, "weights", weight_regions(a)[1], 16),
           (20, "workSpace", s.ws_bwd, 16), (22, "reserveSpace", s.reserve, 16)]
    return [b for b in out if b[2] > 0], a.qo_max


def _backward_data_full(handle, attn_desc, lo_win_idx, hi_win_idx, dev_seq_lengths_dqdo, dev_seq_lengths_dkdv,
                        do_desc, dout, dq_desc, dqueries, queries, dk_desc, dkeys, keys, dv_desc, dvalues, values,
                        weight_size_in_bytes, weights, work_space_size_in_bytes, work_space,
                        reserve_space_size_in_bytes, reserve_space):
    a = _set_attn(attn_desc)
    c = _validate(a, dq_desc, dk_desc, dv_desc, do_desc, ("dqDesc", "dkDesc", "dvDesc", "doDesc"))
    lo, hi = _windows(c, lo_win_idx, hi_win_idx, -1)
    s, item = c.sizes, c.item
    bufs = {"dout": (dout, c.o), "dqueries": (dqueries, c.q), "queries": (queries, c.q), "dkeys": (dkeys, c.k),
            "keys": (keys, c.k), "dvalues": (dvalues, c.v), "values": (values, c.v)}
    ptrs = {name: _ptr(buf, name, _seq_bytes(d, item)) for name, (buf, d) in bufs.items()}
    lq = _lens_ptr(dev_seq_lengths_dqdo, "devSeqLengthsDQDO", c.q.b * c.q.m)
    lk = _lens_ptr(dev_seq_lengths_dkdv, "devSeqLengthsDKDV", c.k.b * c.k.m)
    wp = _buffer(weights, weight_size_in_bytes, weight_regions(a)[1], "weights", "weightSizeInBytes")
    ws = _buffer(work_space, work_space_size_in_bytes, s.ws_bwd, "workSpace", "workSpaceSizeInBytes")
    rs = _check_reserve(reserve_space, reserve_space_size_in_bytes, s)
    p, seed = _gpu_support(c, True)
    mask, _ = _fused_mask(c, lo, hi, -1)
    _run_backward_data(handle, c, ptrs, wp, ws, rs, lq, lk, mask, p, seed)


def _run_backward_data(handle, c, ptrs, wp, ws, rs, lq, lk, mask, p, seed):
    mm, a, item = _matmul(), c.a, c.item
    regions = {k: wp + off for k, (off, _, _) in weight_regions(a)[0].items()}
    reg = {k: rs + v for k, v in c.sizes.reserve_off.items()}
    D, H, dt = a.q_proj, a.heads, a.dtype
    n = H * D
    dao = ws if a.o_proj else ptrs["dout"]
    dsum = ws + _up(c.sizes.ao)
    first = []
    if a.o_proj:
        first.append(_Gemm(mm, handle, dt, c.o.rows, n, a.o_proj, ptrs["dout"], regions[OW], dao,
                           lda=a.o_proj, ldb=n, ldc=n))
    last = [_Gemm(mm, handle, dt, d.rows, d.vect, n, reg[src], regions[w], ptrs[dst], lda=n, ldb=d.vect,
                  ldc=d.vect) for src, w, dst, d in (("dqp", QW, "dqueries", c.q), ("dkp", KW, "dkeys", c.k),
                                                     ("dvp", VW, "dvalues", c.v))]
    fa = _fa_desc(c, mask, p, seed)
    for g in first:
        g(handle)
    st_q, st_k = c.q.row_stride(TIME), c.k.row_stride(TIME)
    for bb0, count, rq, rk, bq, bk in _groups(c):
        qd = _head_desc(c, c.q, count, bq, c.q.t, st_q, D)
        kd = _head_desc(c, c.k, count, bk, c.k.t, st_k, D)
        stats_d = _tdesc(E.PYDNN_DATA_FLOAT, (count, H, c.q.t, 1), (H * c.q.t, c.q.t, 1, 1))
        qo, ko = rq * n * item, rk * n * item
        need = FA._ws_sizes(count, H, c.q.t, D)[0]
        FA.attention_backward(handle, fa, qd, reg["qp"] + qo, kd, reg["kp"] + ko, kd, reg["vp"] + ko, qd,
                              reg["ao"] + qo, qd, dao + qo, stats_d, reg["lse"] + bb0 * H * c.q.t * 4, qd,
                              reg["dqp"] + qo, kd, reg["dkp"] + ko, kd, reg["dvp"] + ko, lq + bb0 * 4,
                              lk + (bb0 // c.q.m) * c.mk * 4, 1, dsum, need)
    for g in last:
        g(handle)


@api
def multi_head_attn_backward_weights(handle, attn_desc, add_grad, q_desc, queries, k_desc, keys, v_desc, values,
                                     do_desc, dout, weight_size_in_bytes, weights, dweights,
                                     work_space_size_in_bytes, work_space, reserve_space_size_in_bytes,
                                     reserve_space):
    """cudnnMultiHeadAttnBackwardWeights: the weight and bias gradients in the weight buffer's layout, added to
    dweights (PYDNN_WGRAD_MODE_ADD) or written (SET), after pydnnMultiHeadAttnBackwardData. Statuses as the
    backward data call, plus BAD_PARAM for addGrad."""
    check_handle(handle)
    args = (handle, attn_desc, add_grad, q_desc, queries, k_desc, keys, v_desc, values, do_desc, dout,
            weight_size_in_bytes, weights, dweights, work_space_size_in_bytes, work_space,
            reserve_space_size_in_bytes, reserve_space)
    key = _plan_key("bwd_weights", attn_desc, (q_desc, k_desc, v_desc, do_desc),
                    (add_grad, _opt_ptr(reserve_space), weight_size_in_bytes, work_space_size_in_bytes,
                     reserve_space_size_in_bytes))
    _planned(handle, key, args, None, _backward_weights_full, _backward_weights_bases)


def _backward_weights_bases(args):
    (handle, attn_desc, _, q_desc, _, k_desc, _, v_desc, _, do_desc, _, _, _, _, _, _, _, reserve_space) = args
    a = _set_attn(attn_desc)
    c = _validate(a, q_desc, k_desc, v_desc, do_desc, ("qDesc", "kDesc", "vDesc", "doDesc"))
    s, item = c.sizes, c.item
    if _opt_ptr(reserve_space):
        return None, 0
    wtotal = weight_regions(a)[1]
    out = [(4, "queries", _seq_bytes(c.q, item), 16), (6, "keys", _seq_bytes(c.k, item), 16),
           (8, "values", _seq_bytes(c.v, item), 16), (10, "dout", _seq_bytes(c.o, item), 16),
           (12, "weights", wtotal, 16), (13, "dweights", wtotal, 16), (15, "workSpace", s.ws_wgt, 16),
           (17, "reserveSpace", s.reserve, 16)]
    return [b for b in out if b[2] > 0], 0


def _backward_weights_full(handle, attn_desc, add_grad, q_desc, queries, k_desc, keys, v_desc, values, do_desc,
                           dout, weight_size_in_bytes, weights, dweights, work_space_size_in_bytes, work_space,
                           reserve_space_size_in_bytes, reserve_space):
    a = _set_attn(attn_desc)
    mode = enum_arg("addGrad", add_grad, (E.PYDNN_WGRAD_MODE_ADD, E.PYDNN_WGRAD_MODE_SET), "pydnnWgradMode_t")
    c = _validate(a, q_desc, k_desc, v_desc, do_desc, ("qDesc", "kDesc", "vDesc", "doDesc"))
    s, item = c.sizes, c.item
    qp = _ptr(queries, "queries", _seq_bytes(c.q, item))
    kp = _ptr(keys, "keys", _seq_bytes(c.k, item))
    vp = _ptr(values, "values", _seq_bytes(c.v, item))
    dp = _ptr(dout, "dout", _seq_bytes(c.o, item))
    wtotal = weight_regions(a)[1]
    wp = _buffer(weights, weight_size_in_bytes, wtotal, "weights", "weightSizeInBytes")
    dwp = _ptr(dweights, "dweights", wtotal)
    ws = _buffer(work_space, work_space_size_in_bytes, s.ws_wgt, "workSpace", "workSpaceSizeInBytes")
    rs = _check_reserve(reserve_space, reserve_space_size_in_bytes, s)
    _gpu_support(c, False)
    del wp  # the weights' values are not needed: their gradients depend on the saved activations only
    _run_backward_weights(handle, c, mode, qp, kp, vp, dp, dwp, ws, rs)


def _run_backward_weights(handle, c, mode, qp, kp, vp, dp, dwp, ws, rs):
    mm, a, item = _matmul(), c.a, c.item
    dregions = {k: dwp + off for k, (off, _, _) in weight_regions(a)[0].items()}
    reg = {k: rs + v for k, v in c.sizes.reserve_off.items()}
    D, H, dt = a.q_proj, a.heads, a.dtype
    n = H * D
    beta = 1.0 if mode == E.PYDNN_WGRAD_MODE_ADD else 0.0
    nq = c.q.rows
    gemms = []
    for x, d, src, wk, bk in ((qp, c.q, "dqp", QW, QB), (kp, c.k, "dkp", KW, KB), (vp, c.v, "dvp", VW, VB)):
        gemms.append(_Gemm(mm, handle, dt, n, d.vect, d.rows, reg[src], x, dregions[wk], ta=True, lda=n,
                           ldb=d.vect, ldc=d.vect, beta=beta))
        if bk in dregions:  # column sums of the projected gradients (their padding rows are zero)
            gemms.append(_Gemm(mm, handle, dt, 1, n, d.rows, ws, reg[src], dregions[bk], lda=d.rows, ldb=n,
                               ldc=n, beta=beta))
    mask = ws + _up(c.sizes.ones)
    if a.o_proj:
        gemms.append(_Gemm(mm, handle, dt, a.o_proj, n, nq, dp, reg["ao"], dregions[OW], ta=True, lda=a.o_proj,
                           ldb=n, ldc=n, beta=beta))
        if OB in dregions:  # sum of dout over the rows inside the sequences only (the mask below)
            gemms.append(_Gemm(mm, handle, dt, 1, a.o_proj, nq, mask, dp, dregions[OB], lda=nq, ldb=a.o_proj,
                               ldc=a.o_proj, beta=beta))
    tensor_ops.set_tensor(handle, _rows_desc(dt, max(nq, c.k.rows), 1, 1), ws, 1.0)
    tensor_ops.set_tensor(handle, _rows_desc(dt, nq, 1, 1), mask, 1.0)
    o = c.q
    st, sb, sm = o.row_stride(TIME), o.row_stride(BATCH), o.row_stride(BEAM)
    for b in range(o.b):
        for m in range(o.m):
            ln = o.lengths[b * o.m + m]
            if ln < o.t:
                tensor_ops.set_tensor(handle, _rows_desc(dt, o.t - ln, st, 1), mask + (b * sb + m * sm + ln * st) * item, 0.0)
    for g in gemms:
        g(handle)
