"""Batch normalization: cudnnDeriveBNTensorDescriptor, cudnnBatchNormalizationForwardTraining /
ForwardInference / Backward and the fused Ex forms (kernels in ptx/batchnorm.cu).

Modes: PER_ACTIVATION (statistics over N, one per (C, spatial) element), SPATIAL and SPATIAL_PERSISTENT
(over N and the spatial dims, one per channel; persistent takes the spatial kernels). x of 4 or 5 dims,
any strides, float / double / half / bfloat16 (float arithmetic for the 16-bit types). The parameter
tensors (scale, bias, running / saved statistics, dscale, dbias) have the dims DeriveBNTensorDescriptor
gives, packed, in float for float / half / bfloat16 data and double for double data.

    forward training   y = alpha * act((x - mean) * invstd * scale + bias [+ z]) + beta * y
                       mean, var over the batch (biased); invstd = 1 / sqrt(var + epsilon)
                       running = (1 - factor) * running + factor * batch, the variance unbiased
                       (var * n / (n - 1)), as cuDNN; saved mean and invstd written when given
    inference          y = alpha * ((x - estimatedMean) / sqrt(estimatedVariance + eps) * scale + bias)
                       + beta * y
    backward           dxhat = dy' * scale;  dx = alphaDataDiff * invstd * (dxhat - mean(dxhat)
                       - xhat * mean(dxhat * xhat)) + betaDataDiff * dx
                       dScale = alphaParamDiff * sum(dy' * xhat) + betaParamDiff * dScale, dBias likewise
                       with sum(dy'); savedMean / savedInvVariance used when given, recomputed when NULL
    Ex forms           bnOps BN (as above), BN_ACTIVATION (ReLU after the normalization), BN_ADD_ACTIVATION
                       (y = relu(bn(x) + z)); backward: dy' = dy where the ReLU's input was > 0 (the mask
                       forward kept in the reserve space), dz = alphaDataDiff * dy' + betaDataDiff * dz.

Reserve space (Ex with an activation): one byte per element of x's span, at x's element offsets, 1 where
the ReLU's input was positive (so backward must see an xDesc with the forward's strides). y is not read
by BackwardEx (the mask holds what it needs). Only PYDNN_ACTIVATION_RELU is fused (NOT_SUPPORTED else).

How the statistics are reduced (variance by Welford / Chan merges, see ptx/batchnorm.cu), by layout:
  rows  the features are contiguous in every operand (NHWC SPATIAL, NCHW PER_ACTIVATION): x is a matrix
        of `rows` x `feats`. Three kernels: stats (each block one chunk of rows: per-feature (mean, M2)
        partials), final (per feature: merge the chunks in order; saved / running statistics; 4 constants),
        apply (one pass writing y). 16-byte accesses when the layout and the pointers allow.
  gen   anything else (NCHW SPATIAL among them): one block per feature reads its elements twice (stats,
        then outputs); no memory beyond the operands. Coalesced along the contiguous reduction dims.
  planes  gen layouts whose innermost reduction dim is contiguous in every operand, with its size and the
        other strides multiples of the 16-byte vector (NCHW SPATIAL with H * W % 8 == 0 for 16-bit data):
        fwd_planes / bwd_planes, gen's block per feature and two passes with 16-byte accesses (PLANES;
        aligned pointers, mask included, checked per call; else gen).
  nc    packed NCHW / NCDHW SPATIAL (any H * W): nc_stats splits each channel into items (planes x
        elements) over the whole GPU, fwd_final / bwd_final merge them per channel, nc_apply writes the
        outputs flat in 16-byte vectors (each lane's channel from its plane), nc_head the elements whose
        bytes held the constants (non-Ex); inference is nc_apply alone (NCHW_SPLIT; see _nc_layout).
  ncr   packed NCHW / NCDHW SPATIAL training / backward with N * H * W <= NC_RES_MAX: nc_res, one launch, a block
        per channel holding it in registers (each byte read once), or where those blocks would take more than one
        wave its streaming form (a few elements a thread in registers, the rest read in each pass); before the
        others, tiny calls included (NC_RES, NC_RES_WAVE).
  Tiny training / backward calls take gen's single launch (GEN_TINY).
The partials and constants need memory. The Ex forms use the caller's workspace
(GetBatchNormalization*ExWorkspaceSize gives poff + chunks * feats * slot bytes for the rows and nc layouts,
0 for gen). The non-Ex forms have no workspace, so they keep them in the output they are about to overwrite
(y forward, dx backward): the partials anywhere after the constants, the constants in the first bytes.
Stream order makes this safe: stats writes partials, final reads them and writes the constants, apply
writes every row after those holding the constants, and one last single-block `head` launch copies every
constant to shared memory before writing the first rows. This needs an output that is packed, not
blended (beta == 0), not overlapping the inputs, and features whose constants fit a block's shared
memory (2048 float / 1024 double features); otherwise the call takes the gen kernels (a block per
feature, slower for NHWC, still one kernel). Every reduction order is fixed: results are reproducible.
16-bit data with 16-byte vectors (FAST16, on by default): 8 rows in flight per thread where the registers
allow it: bf16 stats as one wave of long blocks (3 per SM), the plain forward (no z / ReLU / blending) with
fwd_apply_plain and a batched head (see tools/bench_batchnorm.py). A plain forward that keeps the saved
statistics (APPLY_SAVED) applies instead through fwd_apply_saved, whose constants come from bnScale /
bnBias and the saved mean / inverse std (fwd_final wrote them), over every row: no head pass.
Traffic of the rows path: training forward reads x twice (stats, apply; the second read mostly from DRAM
for tensors larger than L2) and writes y once; backward reads x and dy twice and writes dx.
"""
import ctypes
import math
import struct
import sys

from .. import enums as E
from .. import tuning
from .._build.manifest import KernelUnit
from .._build.params import kernel_params
from .._cuda import driver
from ..buffers import device_ptr
from .. import buffers as _buffers
from ..handle import Handle, check_handle
from ..status import PydnnError, api
from ..tensor import TensorDescriptor, _int, check_tensor, packed_strides
from . import activation as _act
from .common import (
    FLOAT_TAGS, TAG, cdiv, enum_arg, float_tensor, next_pow2, no_partial_alias, output_tensor, prod, same_shape,
    same_type, scalar,
)
from ._elementwise import CTYPE, _SIZES, cached, vec_width
from . import _elementwise as _ew
from .._build import fastcall

__all__ = [
    "derive_bn_tensor_descriptor",
    "batch_normalization_forward_training",
    "batch_normalization_forward_inference",
    "batch_normalization_backward",
    "get_batch_normalization_forward_training_ex_workspace_size",
    "get_batch_normalization_backward_ex_workspace_size",
    "get_batch_normalization_training_ex_reserve_space_size",
    "batch_normalization_forward_training_ex",
    "batch_normalization_backward_ex",
]

_T = "const pydnnTensorDescriptor_t"
C_API = [("Batch normalization", [
    (f"pydnnStatus_t pydnnDeriveBNTensorDescriptor(pydnnTensorDescriptor_t derivedBnDesc, {_T} xDesc, "
     "pydnnBatchNormMode_t mode);",
     "Set derivedBnDesc to the scale / bias / statistics descriptor of x for mode (1xCx1x1 or 1xCxHxW, float for half data)."),
    (f"pydnnStatus_t pydnnBatchNormalizationForwardTraining(pydnnHandle_t handle, pydnnBatchNormMode_t mode, "
     f"const void *alpha, const void *beta, {_T} xDesc, const void *x, {_T} yDesc, void *y, "
     f"{_T} bnScaleBiasMeanVarDesc, const void *bnScale, const void *bnBias, double exponentialAverageFactor, "
     "void *resultRunningMean, void *resultRunningVariance, double epsilon, void *resultSaveMean, "
     "void *resultSaveInvVariance);",
     "y = alpha * bn(x) + beta * y with batch statistics; running statistics (unbiased variance) and saved ones when given."),
    (f"pydnnStatus_t pydnnBatchNormalizationForwardInference(pydnnHandle_t handle, pydnnBatchNormMode_t mode, "
     f"const void *alpha, const void *beta, {_T} xDesc, const void *x, {_T} yDesc, void *y, "
     f"{_T} bnScaleBiasMeanVarDesc, const void *bnScale, const void *bnBias, const void *estimatedMean, "
     "const void *estimatedVariance, double epsilon);",
     "y = alpha * ((x - mean) / sqrt(var + epsilon) * scale + bias) + beta * y."),
    (f"pydnnStatus_t pydnnBatchNormalizationBackward(pydnnHandle_t handle, pydnnBatchNormMode_t mode, "
     "const void *alphaDataDiff, const void *betaDataDiff, const void *alphaParamDiff, const void *betaParamDiff, "
     f"{_T} xDesc, const void *x, {_T} dyDesc, const void *dy, {_T} dxDesc, void *dx, {_T} dBnScaleBiasDesc, "
     "const void *bnScale, void *dBnScaleResult, void *dBnBiasResult, double epsilon, const void *savedMean, "
     "const void *savedInvVariance);",
     "dx, dScale, dBias with alpha / beta blending; savedMean / savedInvVariance NULL: statistics recomputed."),
    (f"pydnnStatus_t pydnnGetBatchNormalizationForwardTrainingExWorkspaceSize(pydnnHandle_t handle, "
     f"pydnnBatchNormMode_t mode, pydnnBatchNormOps_t bnOps, {_T} xDesc, {_T} zDesc, {_T} yDesc, "
     f"{_T} bnScaleBiasMeanVarDesc, const pydnnActivationDescriptor_t activationDesc, size_t *sizeInBytes);",
     "Workspace bytes of pydnnBatchNormalizationForwardTrainingEx (zDesc / activationDesc may be NULL when unused)."),
    (f"pydnnStatus_t pydnnGetBatchNormalizationBackwardExWorkspaceSize(pydnnHandle_t handle, "
     f"pydnnBatchNormMode_t mode, pydnnBatchNormOps_t bnOps, {_T} xDesc, {_T} yDesc, {_T} dyDesc, "
     f"{_T} dzDesc, {_T} dxDesc, {_T} dBnScaleBiasDesc, const pydnnActivationDescriptor_t activationDesc, "
     "size_t *sizeInBytes);",
     "Workspace bytes of pydnnBatchNormalizationBackwardEx."),
    ("pydnnStatus_t pydnnGetBatchNormalizationTrainingExReserveSpaceSize(pydnnHandle_t handle, "
     "pydnnBatchNormMode_t mode, pydnnBatchNormOps_t bnOps, const pydnnActivationDescriptor_t activationDesc, "
     f"{_T} xDesc, size_t *sizeInBytes);",
     "Reserve-space bytes forward training Ex writes and backward Ex reads (the ReLU mask: one byte per element of x's span)."),
    (f"pydnnStatus_t pydnnBatchNormalizationForwardTrainingEx(pydnnHandle_t handle, pydnnBatchNormMode_t mode, "
     f"pydnnBatchNormOps_t bnOps, const void *alpha, const void *beta, {_T} xDesc, const void *xData, "
     f"{_T} zDesc, const void *zData, {_T} yDesc, void *yData, {_T} bnScaleBiasMeanVarDesc, "
     "const void *bnScale, const void *bnBias, double exponentialAverageFactor, void *resultRunningMean, "
     "void *resultRunningVariance, double epsilon, void *resultSaveMean, void *resultSaveInvVariance, "
     "const pydnnActivationDescriptor_t activationDesc, void *workspace, size_t workSpaceSizeInBytes, "
     "void *reserveSpace, size_t reserveSpaceSizeInBytes);",
     "Training forward fused with a residual add (z) and ReLU as bnOps says; the mask goes to the reserve space."),
    ("pydnnStatus_t pydnnBatchNormalizationBackwardEx(pydnnHandle_t handle, pydnnBatchNormMode_t mode, "
     "pydnnBatchNormOps_t bnOps, const void *alphaDataDiff, const void *betaDataDiff, "
     f"const void *alphaParamDiff, const void *betaParamDiff, {_T} xDesc, const void *xData, {_T} yDesc, "
     f"const void *yData, {_T} dyDesc, const void *dyData, {_T} dzDesc, void *dzData, {_T} dxDesc, "
     f"void *dxData, {_T} dBnScaleBiasDesc, const void *bnScaleData, const void *bnBiasData, "
     "void *dBnScaleData, void *dBnBiasData, double epsilon, const void *savedMean, const void *savedInvVariance, "
     "const pydnnActivationDescriptor_t activationDesc, void *workSpace, size_t workSpaceSizeInBytes, "
     "void *reserveSpace, size_t reserveSpaceSizeInBytes);",
     "Backward of the Ex forward: ReLU mask from the reserve space, dz for BN_ADD_ACTIVATION, then as pydnnBatchNormalizationBackward."),
])]
C_OPAQUE_TYPES = []
C_NULLABLE = {
    "pydnnBatchNormalizationForwardTrainingEx": ("zDesc", "activationDesc"),
    "pydnnBatchNormalizationBackwardEx": ("yDesc", "dzDesc", "activationDesc"),
    "pydnnGetBatchNormalizationForwardTrainingExWorkspaceSize": ("zDesc", "activationDesc"),
    "pydnnGetBatchNormalizationBackwardExWorkspaceSize": ("yDesc", "dzDesc", "activationDesc"),
    "pydnnGetBatchNormalizationTrainingExReserveSpaceSize": ("activationDesc",),
}

MODES = (E.PYDNN_BATCHNORM_PER_ACTIVATION, E.PYDNN_BATCHNORM_SPATIAL, E.PYDNN_BATCHNORM_SPATIAL_PERSISTENT)
BN_OPS = (E.PYDNN_BATCHNORM_OPS_BN, E.PYDNN_BATCHNORM_OPS_BN_ACTIVATION, E.PYDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION)

# ptx/batchnorm_params.h
OPS, OP_X, OP_Y, OP_Z, OP_DY, OP_DX, OP_DZ = 6, 0, 1, 2, 3, 4, 5
MAX_FDIMS, MAX_RDIMS = 4, 8
FLAG_BETA, FLAG_RELU, FLAG_Z, FLAG_MASK, FLAG_SAVED = 1, 4, 8, 16, 32
FLAG_RUNNING, FLAG_SAVE, FLAG_PBETA, FLAG_DZ, FLAG_IDX32 = 64, 128, 256, 512, 1024

# ptx/batchnorm.cu
THREADS = 256          # kThreads
GEN_THREADS = 1024     # kGenThreads: gen kernels' block (a feature's elements), at most
GEN_THREADS_BWD = 512  # kGenThreadsBwd
UNROLL = 4             # kUnroll
FINAL_BLOCK = (8, 32)  # kFinalX, kFinalY
HEAD_SMEM = 32768      # kHeadSmemBytes: the head kernels' constants (4 per feature)
# The non-Ex heads ({fwd,bwd}_head_batched<T, HEAD_U>): one block of HEAD_THREADS (kHeadThreads), HEAD_U elements
# per thread with their loads issued together. Why: fwd_head / bwd_head (256 threads, one element a step, one
# memory round trip each) took ~8 us for 8 rows of 256 channels and ~30 us for 8 rows of 1305 (bn_bwd NHWC bf16
# 2x1305x45x45 at 0.46-0.60x PyTorch, 62 us; H200). Predicted: 2-3 round trips, ~2-3 us.
HEAD_THREADS = 1024    # kHeadThreads
HEAD_U = 8             # rows in flight per thread (a thread per channel)
HEAD_U64 = {"fwd": 4, "bwd": 2}  # double (its heads are 4 rows): the widest without spills under the 64-register
                                 # cap of 1024 threads (sm_90: fwd 8 / bwd 4 spilled, fwd 2 spilled 8 bytes)


def _head_u(tag, direction):
    return HEAD_U64[direction] if tag == "f64" else HEAD_U
BLOCKS_PER_SM = 8      # stats: blocks aimed at per SM (one wave of partials)
# 16-bit data with 16-byte vectors (FAST16): kUnroll16 rows in flight in fwd_stats (bf16) and the plain
# forward apply (fwd_apply_plain, with fwd_head_batched); stats launched as one wave of STATS16_BLOCKS_PER_SM
# long blocks per SM (the kernel's register cap keeps 3 resident), so fewer partials for fwd_final.
# False: the 4-rows-in-flight kernels that every other type takes. Why: bf16 training forward 2.03x PyTorch
# against 1.70x without (H200, 1756 against 1469 GB/s; stats 78.0% of copy against 57.9%).
# FAST16: a switch, pydnn.tuning.batchnorm.FAST16 (default True)
UNROLL16 = 8           # kUnroll16
STATS16_BLOCKS_PER_SM = 3
APPLY_STEPS = 4        # apply: kUnroll-row steps per thread per block
# inference with vector launches: infer_rows_smem (the block's per-feature set-up computed once per feature
# into shared memory, after the first rows' loads are issued), blocks of INFER_STEPS kUnroll-row steps per
# thread. False: infer_rows, APPLY_STEPS steps (bf16 82.2% of copy in the same runs as below).
# Shorter blocks measured faster (H200, bf16 64x256x56x56: 2 steps 88.3% of copy, 4: 86.0%, 8: 82.5%, 16:
# 81.9%, 64: 65.5%; tools/bench_batchnorm.py): more waves, a smaller tail.
# INFER_SMEM: a switch, pydnn.tuning.batchnorm.INFER_SMEM (default True)
# INFER_STEPS: a switch, pydnn.tuning.batchnorm.INFER_STEPS (default 2)
# The plain training forward with saved statistics (resultSaveMean / resultSaveInvVariance given): its apply
# is fwd_apply_saved (infer_rows_smem's short blocks, INFER_STEPS steps, constants from bnScale / bnBias and
# the saved mean / inverse std), over every row, so the non-Ex call drops the head pass. Why: bf16 training
# forward 2.05x PyTorch against 1.78x with apply + head (H100; fwd_apply_saved alone 94.1% of copy,
# fwd_apply_plain 84.3%; tools/bench_batchnorm.py). False: fwd_apply_plain + fwd_head_batched, as calls
# without saved statistics still take. Read per call.
# APPLY_SAVED: a switch, pydnn.tuning.batchnorm.APPLY_SAVED (default True)
MAX_GRID_Y = 65535
PART_ALIGN = 256       # partials start this far into the scratch, past the constants


@kernel_params("batchnorm_params.h", "BnParams")
class BnParams(ctypes.Structure):
    _fields_ = [
        ("x", ctypes.c_void_p), ("y", ctypes.c_void_p), ("z", ctypes.c_void_p), ("dy", ctypes.c_void_p),
        ("dx", ctypes.c_void_p), ("dz", ctypes.c_void_p), ("mask", ctypes.c_void_p),
        ("scale", ctypes.c_void_p), ("bias", ctypes.c_void_p), ("mean", ctypes.c_void_p), ("var", ctypes.c_void_p),
        ("save_mean", ctypes.c_void_p), ("save_invvar", ctypes.c_void_p),
        ("dscale", ctypes.c_void_p), ("dbias", ctypes.c_void_p),
        ("partial", ctypes.c_void_p), ("consts", ctypes.c_void_p),
        ("alpha", ctypes.c_double), ("beta", ctypes.c_double), ("alpha_p", ctypes.c_double),
        ("beta_p", ctypes.c_double), ("eps", ctypes.c_double), ("factor", ctypes.c_double),
        ("rows", ctypes.c_longlong), ("feats", ctypes.c_longlong), ("chunk_rows", ctypes.c_longlong),
        ("chunks", ctypes.c_longlong), ("row_begin", ctypes.c_longlong), ("row_end", ctypes.c_longlong),
        ("flags", ctypes.c_uint), ("nfd", ctypes.c_int), ("nrd", ctypes.c_int), ("sr_k", ctypes.c_int),
        ("ld", ctypes.c_longlong * OPS),
        ("fsize", ctypes.c_longlong * MAX_FDIMS), ("fstride", (ctypes.c_longlong * MAX_FDIMS) * OPS),
        ("rsize", ctypes.c_longlong * MAX_RDIMS), ("rstride", (ctypes.c_longlong * MAX_RDIMS) * OPS),
        ("nc_n", ctypes.c_longlong), ("nc_hw", ctypes.c_longlong), ("nc_g", ctypes.c_longlong),
        ("nc_k", ctypes.c_longlong), ("nc_l", ctypes.c_longlong),
    ]


# ----------------------------------------------------------------------------- kernel variants

def _acc(tag):
    return "double" if tag == "f64" else "float"


def _expr(kernel, tag, vec=None, u=None):
    if kernel in ("fwd_final", "bwd_final", "bwd_sums_final"):
        return f"pydnn::bn::{kernel}<{_acc(tag)}>" if u is None else f"pydnn::bn::{kernel}<{_acc(tag)}, {u}>"
    if vec is None:
        return f"pydnn::bn::{kernel}<{CTYPE[tag]}>" if u is None else f"pydnn::bn::{kernel}<{CTYPE[tag]}, {u}>"
    if u is not None:
        return f"pydnn::bn::{kernel}<{CTYPE[tag]}, {vec}, {u}>"
    return f"pydnn::bn::{kernel}<{CTYPE[tag]}, {vec}>"


def _fast16(tag, v):
    """The FAST16 kernels serve this dtype and vector width (16-bit data, 16-byte vectors)."""
    return tuning.batchnorm.FAST16 and _SIZES[tag] == 2 and v == vec_width(tag, tag)


FAST16_KERNELS = ("fwd_apply_plain",)  # infer_rows<T, 8, 8> measured no faster than <T, 8> (80.9 vs 80.3%)
STATS16_TAGS = ("bf16",)  # fwd_stats<half_t, 8, 8> spills under the 3-blocks-per-SM register cap (the
                          # half -> float conversions stay live): half keeps the kUnroll stats


def _stats16(tag, direction, v):
    """The long one-wave fwd_stats variant (kUnroll16 rows in flight) serves this call."""
    return direction == "fwd" and tag in STATS16_TAGS and _fast16(tag, v)


ROW_KERNELS = ("fwd_stats", "fwd_apply", "bwd_stats", "bwd_apply", "infer_rows")
ONE_KERNELS = ("fwd_fused_gen", "bwd_fused_gen", "infer_gen", "fwd_final", "bwd_final")


def kernel_units():
    units = []
    for t in FLOAT_TAGS:
        exprs = [_expr(k, t, v) for k in ROW_KERNELS for v in (vec_width(t, t), *_mid_widths(vec_width(t, t)), 1)]
        exprs += [_expr(k, t) for k in ONE_KERNELS]
        exprs += [_expr(f"{d}_head_batched", t, None, _head_u(t, d)) for d in ("fwd", "bwd")]
        if _SIZES[t] == 2:
            exprs += [_expr(k, t, vec_width(t, t), UNROLL16) for k in FAST16_KERNELS]
        if t in STATS16_TAGS:
            exprs.append(_expr("fwd_stats", t, vec_width(t, t), UNROLL16))
        if t != "f64":
            exprs += [_expr(k, t, 1, u) for k in ROWS1_U_KERNELS for u in ROWS1_U_VALUES]
        u1s = (None,) + (ROWS1_U_VALUES if t != "f64" else ())  # (1-element rows: kUnroll or ROWS1_U rows in flight)
        exprs += [_expr("bwd_sums", t, vec_width(t, t)), _expr("bwd_sums_final", t),
                  _expr("bwd_apply", t, vec_width(t, t), _sc_u(None))]
        exprs += [_expr(k, t, 1, _sc_u(u) if k.endswith("apply") else u) for u in u1s
                  for k in ("bwd_sums", "bwd_apply", "fwd_apply")]
        if t in SR_TAGS:
            exprs += [_expr("bwd_sums", t, vec_width(t, t), SR_U)]
            exprs += [_expr(f"{d}_apply", t, vec_width(t, t), _sc_u(SR_U)) for d in ("fwd", "bwd")]
            exprs += [_expr(f"{d}_{k}", t, vec_width(t, t), SR_U) for d in ("fwd", "bwd") for k in ("stats", "apply")]
            exprs += [_expr(f"{d}_final", t, None, u) for d in ("fwd", "bwd") for u in (SR_FINAL, SR_FINAL1)]
        if vec_width(t, t) > 1:
            exprs += [_expr(k, t, vec_width(t, t)) for k in ("infer_rows_smem", "fwd_apply_saved")]
            exprs += [_expr(k, t, vec_width(t, t)) for k in PLANES_KERNELS]
        exprs += _nc_exprs(t)
        units.append(KernelUnit(f"batchnorm.{t}", "batchnorm.cu", tuple(exprs)))
    return units


# ----------------------------------------------------------------------------- descriptors and checks

def _bad(msg):
    return PydnnError(E.PYDNN_STATUS_BAD_PARAM, msg)


def _param_type(dtype):
    return E.PYDNN_DATA_DOUBLE if dtype == E.PYDNN_DATA_DOUBLE else E.PYDNN_DATA_FLOAT


def _derived_dims(dims, mode):
    if mode == E.PYDNN_BATCHNORM_PER_ACTIVATION:
        return (1,) + tuple(dims[1:])
    return (1, dims[1]) + (1,) * (len(dims) - 2)


def _check_x(desc, name):
    float_tensor(desc, name)
    if len(desc.dims) not in (4, 5):
        raise _bad(f"{name}: batch normalization takes 4 or 5 dims (N, C, [D,] H, W), got {len(desc.dims)}")
    return desc


@api
def derive_bn_tensor_descriptor(derived_bn_desc, x_desc, mode):
    """cudnnDeriveBNTensorDescriptor: 1xCx1x1 (spatial modes) or 1xCxHxW (PER_ACTIVATION), 5-d alike;
    packed; float for float / half / bfloat16 x, double for double x."""
    if type(derived_bn_desc) is not TensorDescriptor or not derived_bn_desc.alive:
        raise _bad("derivedBnDesc: not a live tensor descriptor")
    _check_x(x_desc, "xDesc")
    mode = enum_arg("mode", mode, MODES, "pydnnBatchNormMode_t")
    dims = _derived_dims(x_desc.dims, mode)
    derived_bn_desc._assign(_param_type(x_desc.dtype), dims, packed_strides(dims, E.PYDNN_TENSOR_NCHW))


def _check_bn_desc(desc, name, x_desc, mode):
    """A parameter descriptor must be what DeriveBNTensorDescriptor gives for x and mode."""
    check_tensor(desc, name)
    want = _derived_dims(x_desc.dims, mode)
    if desc.dims != want:
        raise _bad(f"{name}: dims {desc.dims} are not {want}, the dims derived from xDesc {x_desc.dims} "
                   "for this mode (see DeriveBNTensorDescriptor)")
    pt = _param_type(x_desc.dtype)
    if desc.dtype != pt:
        raise _bad(f"{name}: data type {desc.dtype} is not {pt}, the type derived from xDesc's data type "
                   f"{x_desc.dtype} (see DeriveBNTensorDescriptor)")
    if desc.strides != packed_strides(desc.dims, E.PYDNN_TENSOR_NCHW):
        raise _bad(f"{name}: strides {desc.strides} are not packed")
    return desc


def _like_x(x_desc, desc, name, out=False):
    float_tensor(desc, name)
    same_shape(x_desc, "xDesc", desc, name)
    same_type(x_desc, "xDesc", desc, name)
    if out:
        output_tensor(desc, name)


def _epsilon(eps):
    e = scalar("epsilon", eps)
    if not e >= E.PYDNN_BN_MIN_EPSILON:  # NaN too
        raise _bad(f"epsilon: {e} is below PYDNN_BN_MIN_EPSILON ({E.PYDNN_BN_MIN_EPSILON})")
    return e


def _finite(name, v):
    f = scalar(name, v)
    if f != f or f in (float("inf"), float("-inf")):
        raise _bad(f"{name}: {f} is not finite")
    return f


def _null(obj):
    return obj is None or (type(obj) is int and obj == 0)


def _ptr(obj, name, nbytes, itemsize):
    q = device_ptr(obj, name, nbytes)
    if q % itemsize:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER,
                         f"{name}: {q:#x} is not aligned to its {itemsize}-byte elements")
    return q


def _pair(a, an, b, bn, nbytes, itemsize):
    """Two optional buffers that go together (running mean / variance, saved mean / inverse std)."""
    if _null(a) and _null(b):
        return 0, 0
    if _null(a) or _null(b):
        raise _bad(f"{an}, {bn}: give both or neither ({an if _null(a) else bn} is NULL)")
    return _ptr(a, an, nbytes, itemsize), _ptr(b, bn, nbytes, itemsize)


def _bn_ops(bn_ops, activation_desc, z_desc, z_name, x_desc):
    """bnOps and what it needs: (ops, relu?). BN ignores the activation and z descriptors."""
    ops = enum_arg("bnOps", bn_ops, BN_OPS, "pydnnBatchNormOps_t")
    if ops == E.PYDNN_BATCHNORM_OPS_BN:
        return ops
    a = _act._set(activation_desc)
    if a.mode != E.PYDNN_ACTIVATION_RELU:
        raise PydnnError(E.PYDNN_STATUS_NOT_SUPPORTED,
                         f"activationDesc: mode {a.mode} is not fused by batch normalization (PYDNN_ACTIVATION_RELU only)")
    if ops == E.PYDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION:
        if z_desc is None:
            raise _bad(f"{z_name}: NULL, but bnOps BN_ADD_ACTIVATION needs it")
        _like_x(x_desc, z_desc, z_name, out=z_name == "dzDesc")
    return ops


def _reserve_need(ops, x_desc):
    return 0 if ops == E.PYDNN_BATCHNORM_OPS_BN else x_desc.span_bytes() // x_desc.itemsize


# ----------------------------------------------------------------------------- geometry and plans


class _Geom:
    """The problem as rows x feats (layout "rows") or as feature and reduction dims ("gen")."""
    __slots__ = ("layout", "rows", "feats", "ld", "vec_ok", "vmid", "fsize", "fstride", "rsize", "rstride")


def _geometry(mode, dims, operands, vec):
    """operands: {op index: strides}; op OP_X first. Dims of size 1 drop out of the reduction; the
    reduction dims merge where dense in every operand, outermost (by x's strides) first."""
    nd = len(dims)
    feat = [1] if mode != E.PYDNN_BATCHNORM_PER_ACTIVATION else list(range(1, nd))
    red = [d for d in range(nd) if d not in feat]
    g = _Geom()
    g.feats, g.rows = prod(dims[d] for d in feat), prod(dims[d] for d in red)
    keys = list(operands)
    xs = operands[OP_X]
    rsz, rst = [], {k: [] for k in keys}
    for d in sorted((d for d in red if dims[d] > 1), key=lambda d: -xs[d]):
        if rsz and all(rst[k][-1] == operands[k][d] * dims[d] for k in keys):
            rsz[-1] *= dims[d]
            for k in keys:
                rst[k][-1] = operands[k][d]
        else:
            rsz.append(dims[d])
            for k in keys:
                rst[k].append(operands[k][d])
    contiguous = True
    for k in keys:
        expect = 1
        for d in reversed([d for d in feat if dims[d] > 1]):
            contiguous &= operands[k][d] == expect
            expect *= dims[d]
    g.fsize = [dims[d] for d in feat]
    g.fstride = {k: [operands[k][d] for d in feat] for k in keys}
    g.rsize = rsz or [1]
    g.rstride = {k: (rst[k] or [0]) for k in keys}
    if contiguous and len(rsz) <= 1:
        g.layout = "rows"
        g.ld = {k: (rst[k][0] if rsz else g.feats) for k in keys}
        g.vec_ok = vec > 1 and g.feats % vec == 0 and all(v % vec == 0 for v in g.ld.values())
        # (ROWS_MID: the widest narrower vector that the features and row strides allow)
        g.vmid = None if g.vec_ok else next((w for w in _mid_widths(vec) if g.feats % w == 0
                                             and all(v % w == 0 for v in g.ld.values())), None)
    else:
        g.layout, g.ld, g.vec_ok, g.vmid = "gen", {k: 0 for k in keys}, False, None
    return g


# Rows whose feature count (or a row stride) is not a multiple of the 16-byte vector but of a narrower one
# (NHWC with C = 50 fp32, C = 12 fp16): the row kernels at that width (8- or 4-byte accesses) instead of
# 1-element ones. Why: the scalar row kernels ran bn_train NHWC 187x50x14x14 fp32 at 0.60x PyTorch and
# bn_bwd NHWC 37x12x146x146 fp16 at 0.57x, 6x14x25x25 fp32 at 0.60x (H200, tools/sweep_memory.py).
# GPU-tested (tests/ops/batchnorm/test_batchnorm_mid_gpu.py, H200), not timed on its own: off until measured.
# ROWS_MID: a switch, pydnn.tuning.batchnorm.ROWS_MID (default False)
def _mid_widths(vec):
    """The narrower vector widths the row kernels are built for below the full width `vec`, widest first."""
    return tuple(w for w in (4, 2) if w < vec)


def _first_vec(g, tag):
    """The widest row-kernel width of this geometry (the plan's, and its workspace size's, chunking)."""
    if g.vec_ok:
        return vec_width(tag, tag)
    if g.vmid and tuning.batchnorm.ROWS_MID:
        return g.vmid
    return 1


def _fill_geom(p, g):
    p.rows, p.feats = g.rows, g.feats
    for k, v in g.ld.items():
        p.ld[k] = v
    p.nfd = len(g.fsize)
    for d, s in enumerate(g.fsize):
        p.fsize[d] = s
    p.nrd = len(g.rsize)
    for d, s in enumerate(g.rsize):
        p.rsize[d] = s
    for k in g.fstride:
        for d, s in enumerate(g.fstride[k]):
            p.fstride[k][d] = s
        for d, s in enumerate(g.rstride[k]):
            p.rstride[k][d] = s


def _row_block(g, v):
    fv = g.feats // v
    bx = min(32, next_pow2(fv))
    return bx, THREADS // bx, cdiv(fv, bx)


def _chunks(handle, g, v, cap=None, per_sm=BLOCKS_PER_SM):
    """(chunk_rows, chunks) of the stats kernel: about per_sm blocks per SM, at most `cap` chunks."""
    bx, by, tiles = _row_block(g, v)
    want = max(1, (handle.sm_count * per_sm) // tiles)
    p = max(1, min(want, cdiv(g.rows, by * UNROLL), MAX_GRID_Y, cap if cap is not None else want))
    chunk = cdiv(g.rows, p)
    return chunk, cdiv(g.rows, chunk)


class _Launch:
    __slots__ = ("kernel", "vec", "grid", "block", "fields", "func", "u")

    def __init__(self, kernel, vec, grid, block, fields, u=None):
        self.kernel, self.vec, self.grid, self.block, self.fields, self.func = kernel, vec, grid, block, fields, None
        self.u = u  # rows in flight of a FAST16 variant (None: the kernel's default)


def _apply_launch(kernel, g, v, begin, end, u=None, steps=APPLY_STEPS):
    bx, by, tiles = _row_block(g, v)
    n = max(0, end - begin)
    chunk = max(by * (u or UNROLL) * steps, cdiv(n, MAX_GRID_Y))
    return _Launch(kernel, v, (tiles, max(1, cdiv(n, chunk)), 1), (bx, by, 1),
                   {"chunk_rows": chunk, "row_begin": begin, "row_end": end}, u)


# 1-element row kernels (NHWC with C off every vector: odd C) with ROWS1_U rows in flight per thread instead
# of kUnroll (4): a 2-byte load per row leaves 4 rows x 2 operands x 2 bytes in flight per thread, too few
# bytes to cover DRAM latency at the row kernels' occupancy (bn_bwd NHWC bf16 195x93x38x38 0.54x PyTorch,
# 105x405x82x82 0.65x; fp32 39x1315x23x23 0.59x; 22-27% of copy; H200, tools/sweep_memory.py).
# Instantiated for 8 (ROWS1_U_KERNELS; float / half / bfloat16). Measured (mid-session run, H200, 2026-11-28,
# 4 -> 8, same run): bn_bwd NHWC fp32 39x1315x23x23 0.278 -> 0.236 ms (28.3 -> 33.3% of copy), bf16
# 105x405x82x82 1.923 -> 1.836 ms, 195x93x38x38 0.199 -> 0.195, 2x1305x45x45 62.6 -> 60.4 us, fp16
# 37x12x146x146 101.0 -> 98.7 us: faster everywhere, still 0.54-0.73x PyTorch (the fix for odd C is a
# fixed-channel walk over super-rows, gsf_fwd's shape, not more rows in flight).
# ROWS1_U: a switch, pydnn.tuning.batchnorm.ROWS1_U (default 8; 4 = kUnroll, the kernels' own default)
ROWS1_U_VALUES = (8,)
ROWS1_U_KERNELS = ("fwd_stats", "fwd_apply", "bwd_stats", "bwd_apply")


def _rows1_u(tag, v):
    """Rows in flight of the 1-element row kernels for this call (None: kUnroll)."""
    u = tuning.batchnorm.ROWS1_U
    return u if v == 1 and tag != "f64" and u in ROWS1_U_VALUES else None


# Super-rows ({fwd,bwd}_stats / _final / _apply<..., true>, ptx/batchnorm.cu): packed NHWC training forward and backward whose C is
# no multiple of the 16-byte vector reads the rows as R = rows / k super-rows of L = k * C elements (k = VEC /
# gcd(C, VEC)), a whole number of 16-byte vectors: each thread keeps one vector position, so its channels (j mod
# C) and their constants stay fixed, and stats / apply are the full-width row kernels. The rows past R * k (< k)
# are one more stats chunk and the apply's last block's. Blocks: bx = the L / VEC positions (not a power of two:
# no idle lanes past them; split in tiles of <= 256 where longer), by the largest power of two that fits 256.
# Why: the 1-element row kernels ran bn_bwd NHWC bf16 195x93x38x38 at 0.54x PyTorch, 105x405x82x82 0.65x, fp32
# 39x1315x23x23 0.74x (22-33% of copy; H200, 2026-11-28): 2- / 4-byte accesses, 4-8 rows in flight, too few
# bytes in flight; a warp of an odd C's last 32-lane tile mostly idle. Predicted: the vector path's rate (the
# 16-byte NHWC backward), ~1.5-2.5x those points.
# The forward takes the same sequence (fwd_apply's general kernel: no plain / saved-statistics variant); bn_train
# NHWC 187x50x14x14 fp32 ran 0.82x PyTorch on the 1-element rows (H200, 2026-11-28).
# Measured, first version (mid-session run, H200, same run, super-rows / 1-element rows; the stats at 8 blocks an
# SM, partials per (chunk, slot): final merged chunks x k items a channel): bn_bwd NHWC bf16 105x405x82x82 1.231 /
# 1.820 ms (0.98x / 0.70x PyTorch), fp32 39x1315x23x23 0.223 / 0.239; but bf16 195x93x38x38 0.265 / 0.192, fp32
# 64x150x28x28 0.089 / 0.073, bf16 2x1305x45x45 0.097 / 0.059, bn_train bf16 7x337x93x93 0.128 / 0.096, fp32
# 187x50x14x14 0.0425 / 0.0444. The losses track final's items (195x93: 8296 a channel, 65 dependent rounds of
# its 32 lanes x 4 loads, ~+70 us; 7x337: 4224, +32 us). Now: with one position tile the stats block merges each
# channel's k slots (final: one item a chunk, part_count<.., 2>), SR_BLOCKS (4) blocks an SM instead of 8, and
# position tiles (C > 256 odd) only for x of SR_TILED_BYTES (64 MB) or more (the two measured wins).
# SR_BLOCKS: a switch, pydnn.tuning.batchnorm.SR_BLOCKS (default 4)
# Small tensors: the stats chunks are at least SR_MIN_ROUNDS kUnroll steps of a thread long, so fewer partials for
# the final kernel's serial merges (bn_train NHWC fp32 187x50x14x14: 524 chunks of one step each, fwd_final 8.0 us
# of the 20.1 us of kernels, the stats 4.5; H200, mid-session run 1). 1: the old rule. Measured (mid-session run 4,
# H200, same run, eager ms at 1 / 4 / 16): bn_bwd NHWC fp16 37x12x146x146 0.0466 / 0.0411 / -, bf16 1x700x32x32
# 0.0240 / 0.0235 / -, bn_train NHWC fp32 187x50x14x14 0.0363 / 0.0371 / 0.0364, fp16 29x63x31x31 0.0364 / 0.0369 /
# 0.0323; mid-session run 3, 1 / 4 / 16: 37x12x146x146 0.0506 / 0.0449 / -, 1x700x32x32 0.0266 / 0.0285 / -,
# 187x50x14x14 0.0286 / 0.0356 / 0.0275, 29x63x31x31 0.0273 / 0.0279 / 0.0396 (the small forward points move 20-30%
# between runs: host-bound). 4 for the backward (+12-13% on 37x12 in both runs), the forward keeps 1 (no win seen).
# SR_MIN_ROUNDS: a switch, pydnn.tuning.batchnorm.SR_MIN_ROUNDS (default 4; the backward only)
# SR_ROUNDS_WAVE: SR_MIN_ROUNDS's longer chunks only down to a chunk per SM (or one step a thread): bn_bwd NHWC bf16
# 162x4x9x9 (C 4: blocks of 1 x 256 super-rows) had 2 stats chunks of 4 steps a thread against 7 of one step
# (15.5 us of device time in a CUDA graph, 0.91x PyTorch; H200 sweep, 2026-11-28 17:15). Predicted: its stats
# ~3x shorter; 37x12x146x146 (386 chunks) unchanged.
# SR_ROUNDS_WAVE: a switch, pydnn.tuning.batchnorm.SR_ROUNDS_WAVE (default True)
# SR_TILED_BYTES: a switch, pydnn.tuning.batchnorm.SR_TILED_BYTES (default 64 MiB)
# SUPER_ROWS: a switch, pydnn.tuning.batchnorm.SUPER_ROWS (default True)
SR_TAGS = ("f32", "f16", "bf16")
SR_U = "4, true"            # {fwd,bwd}_stats / _apply<T, VEC, kUnroll, true>
SR_FINAL = "false, 1"       # {fwd,bwd}_final<A, false, 1>: partials per (chunk, slot), the tail's chunk
SR_FINAL1 = "false, 2"      # {fwd,bwd}_final<A, false, 2>: one tile, partials per (chunk, channel)


def _sr_geom(tag, g, any_size=False):
    """(k, L, R, tail rows, bx, by, tiles) of the super-row view, or None when it does not apply (not packed NHWC
    rows off the vector; position tiles below SR_TILED_BYTES unless any_size)."""
    if (not tuning.batchnorm.SUPER_ROWS or tag not in SR_TAGS or g.layout != "rows" or g.vec_ok
            or any(ld != g.feats for ld in g.ld.values())):
        return None
    v = vec_width(tag, tag)
    k = v // math.gcd(g.feats, v)
    L, R = k * g.feats, g.rows // k
    if R < 1:
        return None
    nv = L // v
    if nv <= THREADS:
        bx, tiles = nv, 1
        by = 1 << ((THREADS // nv).bit_length() - 1)
    else:
        if g.rows * g.feats * _SIZES[tag] < tuning.batchnorm.SR_TILED_BYTES and not any_size:
            return None
        tiles = cdiv(nv, THREADS)
        bx, by = cdiv(cdiv(nv, tiles), 32) * 32, 1
    return k, L, R, g.rows - R * k, bx, by, tiles


def _sr_chunks(handle, sg, pslot, cap_bytes=None, direction="bwd"):
    """(chunk super-rows, stats blocks along y (with the tail's), bytes of partials), or None where cap_bytes
    cannot hold one chunk's. One tile: a partial per (chunk, channel), the tail in the last chunk; else a
    partial per (chunk, slot of L) and the tail's own chunk."""
    k, L, R, tail, bx, by, tiles = sg
    extra = 1 if tail and tiles > 1 else 0
    width = L // k if tiles == 1 else L
    cap = None if cap_bytes is None else cap_bytes // (width * pslot) - extra
    if cap is not None and cap < 1:
        return None
    want = max(1, (handle.sm_count * tuning.batchnorm.SR_BLOCKS) // tiles)
    rounds = tuning.batchnorm.SR_MIN_ROUNDS if direction == "bwd" else 1
    nr = cdiv(R, by * UNROLL * rounds)
    if rounds > 1 and tuning.batchnorm.SR_ROUNDS_WAVE:  # (the longer chunks only while they fill a wave of SMs)
        nr = max(nr, min(cdiv(R, by * UNROLL), handle.sm_count))
    n = max(1, min(want, nr, MAX_GRID_Y - extra, cap if cap is not None else want))
    chunk = cdiv(R, n)
    gy = cdiv(R, chunk) + extra
    return chunk, gy, gy * width * pslot


def _sr_seq(pl, handle, g, sg, chunk, gy, head_sr, direction):
    """The super-row forward / backward: stats (gy chunks, the last the tail's), final, apply from super-row
    head_sr, and the head kernel over the rows whose bytes held the constants (non-Ex, head_sr > 0)."""
    k, L, R, tail, bx, by, tiles = sg
    v = vec_width(pl.tag, pl.tag)
    pl.params.sr_k = k
    n = R - head_sr
    achunk = max(by * UNROLL * APPLY_STEPS, cdiv(n, MAX_GRID_Y))
    d = direction
    seq = [_Launch(f"{d}_stats", v, (tiles, gy, 1), (bx, by, 1), {"chunk_rows": chunk, "chunks": gy}, SR_U),
           _Launch(f"{d}_final", None, (cdiv(g.feats, FINAL_BLOCK[0]), 1, 1), FINAL_BLOCK + (1,),
                   {"chunk_rows": chunk, "chunks": gy if tiles == 1 else gy * k}, SR_FINAL1 if tiles == 1 else SR_FINAL),
           _Launch(f"{d}_apply", v, (tiles, max(1, cdiv(n, achunk)), 1), (bx, by, 1),
                   {"chunk_rows": achunk, "row_begin": head_sr, "row_end": R}, SR_U)]
    if head_sr:
        seq.append(_head_launch(d, head_sr * k, pl.tag))
    pl.seqs["sr"] = seq


# Super-rows with position tiles below SR_TILED_BYTES (C > 256 off the vector, x under 64 MB): the 1-element rows'
# statistics and final (a partial per (chunk, channel): few, where the tiles' stats write one per (chunk, slot of
# L), as many bytes as the data at 2x1305x45x45), then the super-rows' apply (16-byte accesses; its constants are
# the same per-channel four) and head: sequence "srh". Why: the 1-element apply ran at 1.6-2.1 TB/s (bn_train NHWC
# bf16 7x337x93x93: fwd_apply<bf16, 1, 8> 50.4 us of 87.5; bn_bwd bf16 2x1305x45x45: 15.3 of 48.3) where the
# super-rows' apply ran 3.1-4.0 TB/s (105x405x82x82, 39x1315x23x23; H200, mid-session run 1, session 30).
# Predicted: those applies ~2x faster (7x337x93x93 forward ~1.2x -> ~1.6x PyTorch). Measured (mid-session run 4,
# H200, same run, on / off): bn_train NHWC bf16 7x337x93x93 0.0756 / 0.0951 ms (1.52 / 1.21x PyTorch), bn_bwd bf16
# 2x1305x45x45 0.0270 / 0.0333 ms (1.11 / 0.88x; the super-rows' apply 9.4 us), bn_train bf16 7x1473x21x21 0.0379 /
# 0.0386.
# SR_HYBRID: a switch, pydnn.tuning.batchnorm.SR_HYBRID (default True)
def _srh_seq(pl, g, direction, head_rows):
    """srh: rows1's stats and final, the super-rows' apply from super-row cdiv(head_rows, k) and the head over the
    rows before it (non-Ex: head_rows > 0). Only where the plain super-row sequence is not built."""
    if not tuning.batchnorm.SR_HYBRID or "sr" in pl.seqs or "rows1" not in pl.seqs:
        return
    sg = _sr_geom(pl.tag, g, any_size=True)
    if sg is None or sg[6] == 1:
        return
    k, L, R, tail, bx, by, tiles = sg
    head_sr = cdiv(head_rows, k)
    if head_sr > R:
        return
    rows1 = pl.seqs["rows1"]
    v = vec_width(pl.tag, pl.tag)
    pl.params.sr_k = k
    n = R - head_sr
    achunk = max(by * UNROLL * APPLY_STEPS, cdiv(n, MAX_GRID_Y))
    seq = rows1[:2] + [_Launch(f"{direction}_apply", v, (tiles, max(1, cdiv(n, achunk)), 1), (bx, by, 1),
                               {"chunk_rows": achunk, "row_begin": head_sr, "row_end": R}, SR_U)]
    if head_sr:
        seq.append(_head_launch(direction, head_sr * k, pl.tag))
    pl.seqs["srh"] = seq


def _sr_ws(handle, tag, g, direction):
    """Bytes of the Ex workspace the super-row sequence needs (0: it does not apply)."""
    sg = _sr_geom(tag, g) if direction in ("fwd", "bwd") else None
    if sg is None:
        return 0
    _, cslot, pslot = _slots(tag, direction)
    return cdiv(g.feats * cslot, PART_ALIGN) * PART_ALIGN + _sr_chunks(handle, sg, pslot, None, direction)[2]


def _rows_launches(handle, g, v, direction, chunk, chunks, head_rows, us=None, plain=False, tag=None):
    """stats, final, apply (rows head_rows..), and head (rows 0..head_rows) when head_rows > 0. us: the
    FAST16 rows in flight of stats (None: the 4-rows-in-flight kernel); plain: the forward without z / ReLU / blending
    takes fwd_apply_plain (UNROLL16 rows in flight). tag: 1-element launches take _rows1_u's rows in flight."""
    bx, by, tiles = _row_block(g, v)
    st = {"chunk_rows": chunk, "chunks": chunks}
    u1 = _rows1_u(tag, v) if tag is not None else None
    if u1 is not None and us is None:
        us = u1
    apply = _apply_launch(f"{direction}_apply_plain" if plain else f"{direction}_apply", g, v, head_rows, g.rows,
                          UNROLL16 if plain else u1)
    out = [_Launch(f"{direction}_stats", v, (tiles, chunks, 1), (bx, by, 1), st, us),
           _Launch(f"{direction}_final", None, (cdiv(g.feats, FINAL_BLOCK[0]), 1, 1), FINAL_BLOCK + (1,), st),
           apply]
    if head_rows:
        out.append(_head_launch(direction, head_rows, tag))
    return out


def _head_launch(direction, rows, tag):
    """The non-Ex head: rows 0..rows, whose bytes held the constants."""
    return _Launch(f"{direction}_head_batched", None, (1, 1, 1), (HEAD_THREADS, 1, 1), {"row_begin": 0, "row_end": rows},
                   _head_u(tag, direction))


# fwd_planes / bwd_planes (ptx/batchnorm.cu): the gen kernels (a block per feature, two passes) with
# 16-byte vectors along the contiguous innermost reduction dim, for layouts where it has stride 1 in every
# operand and its size and every other stride are multiples of the vector (NCHW SPATIAL with H * W % VEC
# == 0): one red_off division per vector instead of per element, 16-byte accesses instead of 2-byte ones.
# PLANES: a switch, pydnn.tuning.batchnorm.PLANES (default True)
PLANES_KERNELS = ("fwd_planes", "bwd_planes")
PLANES_THREADS = 512  # kPlanesThreads (fwd) = kGenThreadsBwd (bwd): threads per block at most


def _planes_ok(g, vec):
    """The gen geometry g can take the planes kernels with vec elements per access (pointers checked per
    call)."""
    if not tuning.batchnorm.PLANES or g.layout != "gen" or vec <= 1 or g.rsize[-1] % vec:
        return False
    for k in g.rstride:
        if g.rstride[k][-1] != 1 or any(st % vec for st in g.rstride[k][:-1]):
            return False
        if any(st % vec for n, st in zip(g.fsize, g.fstride[k]) if n > 1):
            return False
    return True


# GEN_WAVE (session 33): the fused gen kernels (a block per feature) take the power of two >= rows threads (a row
# each), or where their blocks need more than one wave (features > SMs x the blocks an SM holds: GEN_REGS, GEN_SMEM)
# the most threads of the fewest waves, halving down to a round of kUnroll (4) rows a thread. Before, always a row
# a thread: bn_bwd NHWC fp32 2x477x13x13 (338 rows, 477 features) ran 512-thread blocks at 76 registers, one an
# SM: 4 waves. Measured (mid-session run, H200, tools/bench_memory_points.py, eager ms at 512 / 256 / 128 / 64
# threads a block, PyTorch in the same run):
# bn_bwd NHWC fp32 2x477x13x13 0.0227 (0.90x; 4 waves) / 0.0163 (2) / 0.0118 (1 wave: 1.71x); 4x200x8x8 fp16
# backward (256 rows, 1 wave throughout) - / 0.0100 / 0.0101 / 0.0135; bn_train NHWC fp32 20x300x4x4 (320 rows) 0.0125
# (2 waves) / 0.0103 / 0.0108; bf16 51x175x2x2 (204 rows) - / 0.0102 / 0.0104 / 0.0108; 1x1000x7x7 fp32 backward
# (49 rows) 64 threads 0.0099, 32 0.0102. The rule takes the fastest of each (128, 256, 256, 256, 64). Off: a row a
# thread (the threads capped at GEN_THREADS / GEN_THREADS_BWD either way).
# GEN_WAVE: a switch, pydnn.tuning.batchnorm.GEN_WAVE (default True)
GEN_REGS = {"fwd": 64, "bwd": 80}          # sm_90 ptxas, every type: 58 / 76 registers (allocated in 8s)
GEN_SMEM = {"fwd": 24592, "bwd": 20496}    # their static shared memory (bytes)
GEN_SMEM_PER_SM = {"sm_90": 228 << 10, "sm_80": 164 << 10}  # (other archs: 100 KiB)


def _gen_blocks_per_sm(arch, threads, direction):
    smem = GEN_SMEM_PER_SM.get(arch, 100 << 10) // (GEN_SMEM[direction] + 1024)  # (1 KiB reserved a block)
    return max(1, min(32, 2048 // threads, 65536 // (threads * GEN_REGS[direction]), smem))


def _gen_launch(kernel, g, handle=None):
    if kernel == "infer_gen":
        total = g.rows * g.feats
        return _Launch(kernel, None, (max(1, min(cdiv(total, THREADS), 2**31 - 1)), 1, 1), (THREADS, 1, 1), {})
    bwd = kernel.startswith("bwd")
    cap = GEN_THREADS_BWD if bwd else GEN_THREADS
    threads = max(32, min(cap, next_pow2(g.rows)))
    if handle is not None and tuning.batchnorm.GEN_WAVE:  # the fewest waves, then the most threads
        d, best = "bwd" if bwd else "fwd", None
        t = threads
        while True:
            waves = cdiv(g.feats, handle.sm_count * _gen_blocks_per_sm(handle.arch, t, d))
            if best is None or waves < best[0]:
                best = (waves, t)
            if waves == 1 or t <= max(32, next_pow2(cdiv(g.rows, 4))):  # (down to kUnroll rows a thread in flight)
                break
            t //= 2
        threads = best[1]
    return _Launch(kernel, None, (max(1, min(g.feats, 2**31 - 1)), 1, 1), (threads, 1, 1), {})


def _planes_launch(direction, g, vec):
    threads = max(32, min(PLANES_THREADS, next_pow2(g.rows // vec)))
    return _Launch(f"{direction}_planes", vec, (max(1, min(g.feats, 2**31 - 1)), 1, 1), (threads, 1, 1), {})


# nc kernels (ptx/batchnorm.cu): packed NCHW / NCDHW SPATIAL (x and every other operand with the packed
# NCHW strides, H * W > 1, any H * W) spread over the whole GPU instead of a block per channel:
#   training / backward: nc_stats (items of nc_g planes x nc_l elements of one channel: about
#   NC_BLOCKS_PER_SM blocks per SM of NC_ITEM_MIN .. NC_ITEM_MAX elements each; one partial per item),
#   fwd_final / bwd_final<A, true> (per channel, the items in order), nc_apply (flat over the elements,
#   16-byte vectors, the channel per lane), and for non-Ex calls nc_head (the elements whose bytes held the
#   constants, as the rows layout's head). The plain forward with saved statistics takes nc_apply
#   kNcFwdSaved over every element instead (no head). Inference: nc_apply kNcInfer alone.
# Why: the gen / planes kernels (a block per channel) ran NCHW fp16 243x555x81x81 training at 0.33x PyTorch,
# fp32 5x1481x23x23 backward at 0.20x, bf16 17x1329x147x147 inference at 0.17x (H200, tools/sweep_memory.py).
# gen / planes are kept where the non-Ex scratch does not fit (tiny tensors, or constants beyond the head's
# shared memory), and for the training forward where N * H * W <= NC_GEN_ROWS: one launch of short blocks
# beat nc's three there (fp32 6x348x14x14 planes 22.5 us against nc 33.8 us, fp16 2x127x17x17 gen 20 us
# against 33 us, fp16 21x413x9x9 36 against 33; H200). Not for backward: gen's backward ran fp32
# 5x1481x23x23 (2645 rows) at 147 us against nc's 61 us.
# NCHW_SPLIT: a switch, pydnn.tuning.batchnorm.NCHW_SPLIT (default True)
# NC_GEN_ROWS: a switch, pydnn.tuning.batchnorm.NC_GEN_ROWS (default 2048)
NC_THREADS = 256  # kNcThreads
NC_U = 4          # kNcU
NC_MODES = {"infer": 0, "fwd": 1, "bwd": 2, "fwd_saved": 3, "bwd_saved": 4}  # kNcInfer, kNcFwd, kNcBwd, kNcFwdSaved,
                                                                            # kNcBwdSaved
NC_ITEM_MIN, NC_ITEM_MAX = 4096, 32768  # elements per stats block
NC_BLOCKS_PER_SM = 4
NC_APPLY_STEPS = 2  # kNcU-vector steps per thread of an apply block
# nc_head: kNcHeadThreads threads, the call's vector width, kNcU vectors in flight per thread (one round of
# loads). Why: one element per thread per step (256 threads) took ~30 us for 1481 fp32 channels' head
# (bn_bwd NCHW 5x1481x23x23 at 0.47x PyTorch, H200, tools/bench_bnpool.py).
NC_HEAD_THREADS = 512


# nc_res (ptx/batchnorm.cu): packed NCHW / NCDHW SPATIAL training forward and backward whose channels hold at
# most NC_RES_MAX elements (N * H * W): one block per channel holds the channel in registers (NC_RES_PER[i]
# elements per thread, blocks of up to NC_RES_THREADS threads), reduces it and writes the outputs: one launch,
# x (and dy) read once, no scratch, any pointer alignment. Before every other NCHW sequence, tiny calls (GEN_TINY)
# included. Why: the small NCHW backward was 3 launches against PyTorch's one block-per-channel kernel (fp32
# 5x1481x23x23: nc 34.6 us eager, 30.1 us of kernels against 27.7 / 26.6 us, 0.80x; bf16 1x306x99x99 0.68x;
# bf16 2x3x77x77 0.64x), the small training forward gen's double Welford walk (fp16 21x413x9x9 fused_gen 29.9 us
# against cuDNN's 6.7 us kernel, 72x37x8x8 0.83x; H200, session 30). Predicted: one launch reading each byte once,
# ~1.3-2x PyTorch on those points.
# NC_RES: a switch, pydnn.tuning.batchnorm.NC_RES (default True)
# NC_RES_MAX: a switch, pydnn.tuning.batchnorm.NC_RES_MAX (default 16384)
NC_RES_THREADS = 1024  # kResThreads
NC_RES_PER = (4, 8, 16)  # elements per thread (template PER): the first whose block fits NC_RES_CAP
NC_RES_CAP = {4: 128, 8: 512, 16: 1024}  # threads per block at most, by PER
# NC_RES_WAVE: where the register-resident blocks take more than one wave (C > SMs x the blocks an SM holds), the
# streaming form nc_res<T, NC_RES_STREAM_PER, .., true> instead: NC_RES_STREAM_PER elements a thread in registers,
# the rest read in each pass (the later passes mostly from L2; kResSU elements a thread a step with their loads in
# flight together), blocks of the most threads (256 down to 64) that keep every channel in one wave. Why: mid-session run 1 (H200, bench_memory_points, eager, PyTorch in the same
# run): the resident form won 1.3-2x where one wave held it (bn_bwd NCHW bf16 2x3x77x77 0.73 -> 1.31x, 62x92x16x16
# 0.69 -> 1.38x, bn_train fp16 21x413x9x9 0.70 -> 1.46x, bf16 4x256x64x64 1.10 -> 1.88x) and lost where it did not:
# bf16 1x306x99x99 (PER 16, 640 threads, 64 registers: one block an SM, 3 waves) 0.70 -> 0.62x, fp32 5x1481x23x23
# (3 blocks an SM, 3.7 waves) 0.82 -> 0.86x. Registers (sm_90, ptxas): NC_RES_REGS, for the waves. Measured (run 2,
# the streaming passes then loading one element a step): fp32 5x1481x23x23 0.0258 ms (1.10x; resident 0.87x, nc
# 0.82x), bf16 1x306x99x99 0.82x (0.56 / 0.68x), bf16 4x256x64x64 training 1.29x (1.20 / 1.06x); lost: fp16
# 4x139x64x64 backward 0.63x (0.68 / 0.75x).
# NC_RES_WAVE: a switch, pydnn.tuning.batchnorm.NC_RES_WAVE (default True)
# NC_RES_SU: elements a thread loads together per step of the streaming passes (nc_res's SU: 4, the template's
# default, or 1, instantiated for first use). Why the switch: the 4-at-once form (1bb5916, after run 2) was never
# timed against the one-a-step form that run 2 measured; the session-32 mid-session sweep read bn_bwd NCHW fp32
# 5x1481x23x23 at 0.0317 ms (0.885x; PyTorch 0.0281) against run 2's 0.0258 (PyTorch 0.0285), and the
# bench's fp16 4x139x64x64 at 0.0333 against 0.0284 (the resident form, untouched, read 0.0264 / 0.0262): a
# regression by that cross-run reading. The same-run A/B (session 32's final call, H200, tools/bench_memory_points.py
# ncrsu_* points, eager ms SU 4 / SU 1, PyTorch beside): fp32 5x1481x23x23 0.0329 / 0.0283 (0.902x -> 1.026x), fp16
# 4x139x64x64 0.0334 / 0.0278 (0.529x -> 0.653x): SU 1 is faster on both, so 1 is the default (session 33) and
# the installed form; SU 4 compiles on first use (rare.py), the same number of instantiations.
# NC_RES_SU: a switch, pydnn.tuning.batchnorm.NC_RES_SU (default 1)
NC_RES_REGS = {("fwd", 4): 32, ("fwd", 8): 32, ("fwd", 16): 64, ("bwd", 4): 32, ("bwd", 8): 56, ("bwd", 16): 64}
NC_RES_STREAM_PER = 4
# the streaming form's registers by (direction, SU), allocated in 8s (sm_90 ptxas, f32 / f16 / bf16: SU 4 fwd 40 /
# 40 / 38, bwd 49 / 47 / 49; SU 1 fwd 32 / 32 / 31, bwd 42 / 40 / 44)
NC_RES_STREAM_REGS = {("fwd", 4): 40, ("bwd", 4): 56, ("fwd", 1): 32, ("bwd", 1): 48}
NC_RES_STREAM_THREADS = (256, 128, 64)
# NC_RES_STREAM_WIDE (session 33): the streaming blocks may take 512 threads too (first in NC_RES_STREAM_THREADS's
# order) where those keep every channel in one wave. Why: bn_bwd NCHW fp16 4x139x64x64 (16384 elements a channel,
# 139 channels) streamed on 256-thread blocks, about one an SM (8 warps, one element a thread a step in flight):
# 0.0281 ms against PyTorch's 0.0177 (0.63x; bf16 1x306x99x99 0.79x, 306 channels: not affected), H200 mid-session
# run 1. Measured (run 2, H200, tools/bench_memory_points.py, eager ms 256 / 512 threads, PyTorch in the same run):
# bwd fp16 4x139x64x64 0.0275 / 0.0201 (0.613x -> 0.843x), training bf16 4x256x64x64 0.0203 / 0.0199 (1.35x ->
# 1.42x); bwd bf16 1x140x99x99 0.0154 / 0.0207 in a disturbed reading (PyTorch's own time 0.0175 / 0.0354 in the same
# two settings: host contention on the shared machine), to re-read in the final call's bench line.
# NC_RES_STREAM_WIDE: a switch, pydnn.tuning.batchnorm.NC_RES_STREAM_WIDE (default True)


def _res_blocks_per_sm(threads, regs):
    return max(1, min(2048 // threads, 32, 65536 // (threads * regs)))


def _nc_res_launch(handle, g, direction, tag):
    """The nc_res launch of a packed NCHW geometry, or None."""
    nc = _nc(g)
    if nc is None or tag == "f64" or not tuning.batchnorm.NC_RES or direction == "infer":
        return None
    n, c, hw = nc
    m = n * hw
    if m > min(tuning.batchnorm.NC_RES_MAX, NC_RES_PER[-1] * NC_RES_THREADS) or n * c * hw >= 2**31:  # (32-bit offsets)
        return None
    b = "true" if direction == "bwd" else "false"
    for per in NC_RES_PER:
        threads = cdiv(cdiv(m, per), 32) * 32
        if threads <= NC_RES_CAP[per]:
            break
    else:
        return None
    if tuning.batchnorm.NC_RES_WAVE and c > handle.sm_count * _res_blocks_per_sm(threads, NC_RES_REGS[direction, per]):
        sp = NC_RES_STREAM_PER
        su_n = 4 if tuning.batchnorm.NC_RES_SU == 4 else 1
        wide = (512,) if tuning.batchnorm.NC_RES_STREAM_WIDE else ()
        for st in wide + NC_RES_STREAM_THREADS:
            st = min(st, cdiv(cdiv(m, sp), 32) * 32)
            if c <= handle.sm_count * _res_blocks_per_sm(st, NC_RES_STREAM_REGS[direction, su_n]):
                break
        su = "" if su_n == 4 else ", 1"  # (SU 4: the template's default)
        return _Launch("nc_res", None, (c, 1, 1), (st, 1, 1), {}, f"{sp}, {b}, true{su}")
    return _Launch("nc_res", None, (c, 1, 1), (threads, 1, 1), {}, f"{per}, {b}")


def _nc_exprs(t):
    out = []
    if t != "f64":
        out += [_expr("nc_res", t, None, f"{per}, {b}") for per in NC_RES_PER for b in ("false", "true")]
        out += [_expr("nc_res", t, None, f"{NC_RES_STREAM_PER}, {b}, true{su}") for b in ("false", "true")
                for su in ("", ", 1")]
    for v in (vec_width(t, t), 1):
        out += [_expr("nc_stats", t, v, b) for b in ("false", "true", "true, true")]
        out += [_expr("nc_apply", t, v, m) for m in sorted(NC_MODES.values())]
    out += [_expr("nc_head", t, v, NC_MODES[m]) for v in (vec_width(t, t), 1) for m in ("fwd", "bwd")]
    out += [_expr(k, t, None, "true") for k in ("fwd_final", "bwd_final")]
    return out


def _nc(g):
    """(N, C, HW) when the gen geometry g is packed NCHW / NCDHW in every operand, else None."""
    if not tuning.batchnorm.NCHW_SPLIT or g.layout != "gen" or len(g.fsize) != 1 or len(g.rsize) not in (1, 2):
        return None
    c = g.fsize[0]
    n, hw = g.rsize if len(g.rsize) == 2 else (1, g.rsize[0])
    if hw < 2 or c < 2:
        return None
    want = [c * hw, 1] if len(g.rsize) == 2 else [1]
    for k in g.rstride:
        if list(g.fstride[k]) != [hw] or list(g.rstride[k]) != want:
            return None
    return n, c, hw


def _nc_items(handle, n, c, hw, vec):
    """(g, k, l, items per channel) of nc_stats: items of g planes x l elements (k per plane)."""
    e = min(NC_ITEM_MAX, max(NC_ITEM_MIN, (n * c * hw) // (handle.sm_count * NC_BLOCKS_PER_SM)))
    if hw >= e:
        k = cdiv(hw, e)
        ln = cdiv(cdiv(hw, k), vec) * vec
        return 1, cdiv(hw, ln), ln, n * cdiv(hw, ln)
    g = max(1, min(n, e // hw))
    return g, 1, hw, cdiv(n, g)


def _nc_layout(handle, g, tag, direction, ex):
    """None (not the nc path) or (n, c, hw, items, cbytes, poff, need, head): the scratch (workspace for Ex,
    else y / dx) holds cbytes of constants, then from poff the partials; need: its bytes; head: the
    elements nc_head writes (non-Ex)."""
    nc = _nc(g)
    if nc is None or direction == "infer":
        return None
    n, c, hw = nc
    if direction == "fwd" and n * hw <= tuning.batchnorm.NC_GEN_ROWS:
        return None
    _, cslot, pslot = _slots(tag, direction)
    isz = _SIZES[tag]
    items = _nc_items(handle, n, c, hw, vec_width(tag, tag))
    cbytes = c * cslot
    poff = cdiv(cbytes, PART_ALIGN) * PART_ALIGN
    need = poff + items[3] * c * pslot
    total = n * c * hw
    head = 0
    if not ex:
        head = cdiv(cdiv(cbytes, isz), 16) * 16  # a multiple of every vector width: the apply starts on a vector
        if need > total * isz or cbytes > HEAD_SMEM or head > total:
            return None
    return n, c, hw, items, cbytes, poff, need, head


def _nc_apply_launch(handle, mode, vec, begin, total):
    """Blocks of chunk vectors: NC_APPLY_STEPS steps per thread, shorter (down to one vector per thread)
    where that leaves fewer than NC_BLOCKS_PER_SM blocks per SM."""
    nv = cdiv(total, vec) - begin // vec
    chunk = min(NC_THREADS * NC_U * NC_APPLY_STEPS, cdiv(cdiv(nv, handle.sm_count * NC_BLOCKS_PER_SM), NC_THREADS) * NC_THREADS)
    chunk = max(chunk, NC_THREADS, cdiv(nv, 2**31 - 1))
    return _Launch("nc_apply", vec, (max(1, cdiv(nv, chunk)), 1, 1), (NC_THREADS, 1, 1),
                   {"chunk_rows": chunk, "row_begin": begin, "row_end": total}, NC_MODES[mode])


def _nc_params(p, n, hw, items=(1, 1, 1, 1)):
    p.nc_n, p.nc_hw = n, hw
    p.nc_g, p.nc_k, p.nc_l, _ = items


def _nc_seqs(pl, handle, g, direction, ex):
    """nc{v} (and nc{v}s, the forward with saved statistics) for v = the vector width and 1; False when the
    call shape does not take the nc kernels."""
    lay = _nc_layout(handle, g, pl.tag, direction, ex)
    if lay is None:
        return False
    n, c, hw, items, cbytes, poff, need, head = lay
    _nc_params(pl.params, n, hw, items)
    total = n * c * hw
    nper = items[3]
    for v in (vec_width(pl.tag, pl.tag), 1):
        stats = _Launch("nc_stats", v, (nper * c, 1, 1), (NC_THREADS, 1, 1), {"chunks": nper},
                        "true" if direction == "bwd" else "false")
        final = _Launch(f"{direction}_final", None, (cdiv(c, FINAL_BLOCK[0]), 1, 1), FINAL_BLOCK + (1,),
                        {"chunks": nper}, "true")
        seq = [stats, final, _nc_apply_launch(handle, direction, v, head, total)]
        if head:
            seq.append(_Launch("nc_head", v, (1, 1, 1), (NC_HEAD_THREADS, 1, 1), {"row_begin": 0, "row_end": head},
                               NC_MODES[direction]))
        pl.seqs[f"nc{v}"] = seq
        if direction == "fwd":
            pl.seqs[f"nc{v}s"] = [stats, final, _nc_apply_launch(handle, "fwd_saved", v, 0, total)]
    pl.scratch = (poff, None, None)
    if ex:
        pl.ws_need = need
    return True


class _Plan:
    """Launch sequences of one call shape. `seqs`: name -> [launch, ...]; the call picks one by its
    pointers and scalars (vector or scalar row kernels; the scratch path or gen). `sums`: id(backward
    sequence) -> its BWD_SUMS form (calls with the saved mean and inverse std)."""
    __slots__ = ("geom", "tag", "unit", "isize", "asize", "params", "argv", "seqs", "ws_need", "scratch", "flags",
                 "vmid", "sums", "sums0", "crec", "crec_obj", "crec_key")


def _slots(tag, direction):
    asz = 8 if tag == "f64" else 4
    return asz, 4 * asz, (2 if direction == "fwd" else 4) * asz


def _stats_per_sm(tag, direction, vec):
    return STATS16_BLOCKS_PER_SM if _stats16(tag, direction, vec) else BLOCKS_PER_SM


def _rows_seqs(pl, handle, g, direction, vecs, chunk, chunks, head_rows):
    """rows{v} for each vector width; with FAST16 also rows{v}p, the plain forward (_pick_plain)."""
    for v in vecs:
        us = UNROLL16 if _stats16(pl.tag, direction, v) else None
        seq = _rows_launches(handle, g, v, direction, chunk, chunks, head_rows, us, tag=pl.tag)
        pl.seqs[f"rows{v}"] = seq
        if direction == "fwd" and _fast16(pl.tag, v):
            pl.seqs[f"rows{v}p"] = _rows_launches(handle, g, v, direction, chunk, chunks, head_rows, us, True, tag=pl.tag)
        if direction == "fwd" and v == vec_width(pl.tag, pl.tag):  # the plain forward with saved statistics: stats,
            # final, apply_saved (built for the full width)
            pl.seqs[f"rows{v}s"] = seq[:2] + [_apply_launch("fwd_apply_saved", g, v, 0, g.rows, steps=tuning.batchnorm.INFER_STEPS)]


def _workspace_layout(handle, g, tag, direction, vec):
    """(bytes, chunk, chunks, partial offset) of the rows layout's workspace: constants, then partials."""
    _, cslot, pslot = _slots(tag, direction)
    chunk, chunks = _chunks(handle, g, vec, per_sm=_stats_per_sm(tag, direction, vec))
    poff = cdiv(g.feats * cslot, PART_ALIGN) * PART_ALIGN
    return poff + chunks * g.feats * pslot, chunk, chunks, poff


# The backward with the saved mean and inverse std (both given, FLAG_SAVED) on the rows (full vector width and 1
# element), super-row and NCHW (nc, nc_stats<T, VEC, true, true>) sequences: bwd_sums (a thread's sums of dy' and
# dy' (x - mean) per feature, no per-row merges) and bwd_sums_final instead of bwd_stats / bwd_final (four moments
# merged with Chan's formula every kUnroll rows, 125 registers in bf16). Why: bwd_stats read x and dy at 1.6-2.1
# TB/s where PyTorch's channels-last reduce (the same two sums) reads at 2.4-2.9 (bn_bwd NHWC bf16 195x93x38x38: 66.9 against 42.8 us, fp32
# 39x1315x23x23: 103.8 against 75.3, bf16 105x405x82x82: 591 against 422; our apply was the faster pass in each;
# H200, tools/profile_memory_points.py, mid-session run 1, session 30). Predicted: the stats at PyTorch's rate or
# better, those points 0.78 / 0.83 / 1.03x -> ~1.0 / ~1.0 / ~1.2x. Measured (mid-session run 4, H200, same run, BWD_SUMS
# on / off, eager ms and x PyTorch): bn_bwd NHWC bf16 195x93x38x38 0.0934 / 0.1360 (1.10 / 0.76x; bwd_sums 39.8 us
# against bwd_stats 66.9 and PyTorch's reduce 42.1), fp32 39x1315x23x23 0.1544 / 0.2053 (1.10 / 0.84x), bf16
# 105x405x82x82 0.771 / 1.167 (1.58 / 1.03x), bf16 64x256x56x56 (16-byte rows) 0.157 / 0.243 (1.20 / 0.77x), fp32
# 42x118x77x77 1.25 / 1.00x, fp16 37x12x146x146 1.20 / 0.81x, bf16 2x1305x45x45 1.11 / 0.60x, NCHW fp16
# 110x251x115x115 2.60 / 2.05x, NCHW fp32 5x1481x23x23 0.80 / 0.63x, bf16 1x306x99x99 0.68 / 0.56x.
# BWD_SUMS: a switch, pydnn.tuning.batchnorm.BWD_SUMS (default True)
# Non-Ex backward with the saved mean / inverse std, dscale / dbias not blended (betaParamDiff 0) and alphaParamDiff
# != 0: the apply computes its constants from scale, the saved statistics and the dscale / dbias that the final
# wrote (bwd_apply<.., SC = true>), over every row: the head launch goes (the constants' bytes in dx are written
# by the apply like any others). Why: a launch is ~3-4 us of host time on the small calls the sweep times back to
# back (bn_train NHWC fp32 187x50x14x14: 33.7 us eager for 20.1 us of kernels; H200, mid-session run 1), and the
# head is one block (2-5 us on the GPU). Rows (full vector width, 1 element), super-rows, srh. GPU-tested (mid-session
# run 4: 115 batch-norm tests passed), not timed on its own (every run-4 backward point above took it).
# BWD_APPLY_SAVED: a switch, pydnn.tuning.batchnorm.BWD_APPLY_SAVED (default True)
SC_SUFFIX = ", true"  # bwd_apply<T, VEC, U, SR, SC = true>


def _sc_u(u):
    """bwd_apply's template tail with SC for an apply launch's u (None: kUnroll, no super-rows)."""
    if u == SR_U:
        return SR_U + SC_SUFFIX
    return f"{u or UNROLL}, false" + SC_SUFFIX


def _apply_from0(a, rows):
    """The apply launch a over rows [0, rows) (its block and chunk size), with SC constants."""
    chunk = max(a.fields["chunk_rows"], cdiv(rows, MAX_GRID_Y))
    return _Launch(a.kernel, a.vec, (a.grid[0], max(1, cdiv(rows, chunk)), 1), a.block,
                   {"chunk_rows": chunk, "row_begin": 0, "row_end": rows}, _sc_u(a.u))


def _sums_seqs(pl):
    """pl.sums: each rows / super-row / nc backward sequence -> the same with bwd_sums / bwd_sums_final; pl.sums0:
    the non-Ex rows / super-row ones -> sums, final and the SC apply over every row, no head."""
    pl.sums, pl.sums0 = {}, {}
    full = vec_width(pl.tag, pl.tag)
    for name in (f"rows{full}", "rows1", "sr", "srh", f"nc{full}", "nc1"):
        seq = pl.seqs.get(name)
        if seq is None or seq[1].kernel != "bwd_final":
            continue
        st, fi = seq[0], seq[1]
        if st.kernel == "bwd_stats":
            sums = _Launch("bwd_sums", st.vec, st.grid, st.block, st.fields, st.u)
        elif st.kernel == "nc_stats":
            sums = _Launch("nc_stats", st.vec, st.grid, st.block, st.fields, "true, true")
        else:
            continue
        pl.sums[id(seq)] = [sums, _Launch("bwd_sums_final", None, fi.grid, fi.block, fi.fields)] + seq[2:]
        a = seq[2]
        if st.kernel == "bwd_stats" and len(seq) == 4 and a.kernel == "bwd_apply":
            rows = a.fields["row_end"]  # (g.rows, or the super-rows R)
            pl.sums0[id(seq)] = pl.sums[id(seq)][:2] + [_apply_from0(a, rows)]
        elif st.kernel == "nc_stats" and len(seq) == 4 and a.kernel == "nc_apply":  # (nc_apply kNcBwdSaved from 0)
            total, chunk = a.fields["row_end"], a.fields["chunk_rows"]
            chunk = max(chunk, cdiv(cdiv(total, a.vec), 2**31 - 1))
            pl.sums0[id(seq)] = pl.sums[id(seq)][:2] + [_Launch(
                "nc_apply", a.vec, (max(1, cdiv(cdiv(total, a.vec), chunk)), 1, 1), a.block,
                {"chunk_rows": chunk, "row_begin": 0, "row_end": total}, NC_MODES["bwd_saved"])]


# The non-Ex training forward that keeps its saved statistics (resultSaveMean / InvVariance given) on the
# 1-element rows, super-row and srh sequences: fwd_apply<.., SC> takes its constants from scale, bias and the saved
# statistics fwd_final wrote, over every row: no head launch (as fwd_apply_saved does for the vector rows).
# Sequences rows1s / srs / srhs, picked by _pick_plain. Why: one launch fewer (bn_train NHWC fp32 187x50x14x14:
# 33.7 us eager for 20.1 us of kernels, 4 launches; H200, mid-session run 1).
# FWD_APPLY_SAVED: a switch, pydnn.tuning.batchnorm.FWD_APPLY_SAVED (default True)
def _fwd_saved_seqs(pl):
    for name in ("rows1", "sr", "srh"):
        seq = pl.seqs.get(name)
        if seq is None or len(seq) != 4 or seq[2].kernel != "fwd_apply" or name + "s" in pl.seqs:
            continue
        a = seq[2]
        pl.seqs[name + "s"] = seq[:2] + [_apply_from0(a, a.fields["row_end"])]


def _make_plan(handle, tag, g, direction, ex):
    pl = _make_plan_seqs(handle, tag, g, direction, ex)
    if direction == "bwd":
        _sums_seqs(pl)
    else:
        pl.sums, pl.sums0 = {}, {}
        if direction == "fwd" and not ex and tuning.batchnorm.FWD_APPLY_SAVED:
            _fwd_saved_seqs(pl)
    return pl


def _make_plan_seqs(handle, tag, g, direction, ex):
    pl = _Plan()
    pl.geom, pl.tag, pl.unit = g, tag, f"batchnorm.{tag}"
    pl.isize = _SIZES[tag]
    asz, cslot, pslot = _slots(tag, direction)
    pl.asize = asz
    pl.params = BnParams()
    _fill_geom(pl.params, g)
    pl.argv = driver.kernel_args(pl.params)
    pl.seqs, pl.ws_need, pl.scratch = {}, 0, None
    pl.flags = FLAG_IDX32 if g.rows * g.feats < 2**32 else 0
    v0 = _first_vec(g, tag) if g.layout == "rows" else 1
    vecs = ([v0] if v0 > 1 else []) + [1]
    pl.vmid = v0 if 1 < v0 < vec_width(tag, tag) else None
    if direction == "infer":
        nc = _nc(g)
        if nc is not None:
            _nc_params(pl.params, nc[0], nc[2])
            total = nc[0] * nc[1] * nc[2]
            for v in (vec_width(tag, tag), 1):
                pl.seqs[f"nc{v}"] = [_nc_apply_launch(handle, "infer", v, 0, total)]
            return pl
        if g.layout == "rows":
            for v in vecs:
                if tuning.batchnorm.INFER_SMEM and v == vec_width(tag, tag):  # the shared set-up (infer_rows_smem is
                    # built for the full vector width)
                    pl.seqs[f"rows{v}"] = [_apply_launch("infer_rows_smem", g, v, 0, g.rows, steps=tuning.batchnorm.INFER_STEPS)]
                else:
                    pl.seqs[f"rows{v}"] = [_apply_launch("infer_rows", g, v, 0, g.rows)]
        else:
            pl.seqs["gen"] = [_gen_launch("infer_gen", g)]
        return pl
    pl.seqs["gen"] = [_gen_launch(f"{direction}_fused_gen", g, handle)]
    res = _nc_res_launch(handle, g, direction, tag)
    if res is not None:
        nc = _nc(g)
        pl.params.nc_n, pl.params.nc_hw = nc[0], nc[2]
        pl.seqs["ncr"] = [res]
    if _planes_ok(g, vec_width(tag, tag)):
        pl.seqs["planes"] = [_planes_launch(direction, g, vec_width(tag, tag))]
    if g.layout != "rows":
        _nc_seqs(pl, handle, g, direction, ex)
        return pl
    sg = _sr_geom(tag, g)
    if ex:  # the caller's workspace: constants, then partials
        pl.ws_need, chunk, chunks, poff = _workspace_layout(handle, g, tag, direction, vecs[0])
        pl.scratch = (poff, chunk, chunks)
        _rows_seqs(pl, handle, g, direction, vecs, chunk, chunks, 0)
        _flat_seqs(pl, handle, g, direction, vecs, chunk, chunks, 0, 0)
        if sg is not None:
            sc = _sr_chunks(handle, sg, pslot, None, direction)
            pl.ws_need = max(pl.ws_need, poff + sc[2])
            _sr_seq(pl, handle, g, sg, sc[0], sc[1], 0, direction)
        _srh_seq(pl, g, direction, 0)
        return pl
    # non-Ex: the output holds the constants (first bytes) and the partials (after PART_ALIGN)
    out = OP_Y if direction == "fwd" else OP_DX
    cbytes = g.feats * cslot
    obytes = g.rows * g.feats * pl.isize
    poff = cdiv(cbytes, PART_ALIGN) * PART_ALIGN
    cap = (obytes - poff) // (g.feats * pslot) if obytes > poff else 0
    if g.ld[out] != g.feats or cbytes > HEAD_SMEM or cap < 1:
        return pl
    chunk, chunks = _chunks(handle, g, vecs[0], cap, _stats_per_sm(tag, direction, vecs[0]))
    head_rows = cdiv(cbytes, g.feats * pl.isize)
    pl.scratch = (poff, chunk, chunks)
    _rows_seqs(pl, handle, g, direction, vecs, chunk, chunks, head_rows)
    _flat_seqs(pl, handle, g, direction, vecs, chunk, chunks, cbytes, head_rows)
    if sg is not None:  # (the constants' rows rounded up to whole super-rows)
        head_sr = cdiv(head_rows, sg[0])
        sc = _sr_chunks(handle, sg, pslot, obytes - poff, direction)
        if sc is not None and head_sr <= sg[2]:
            _sr_seq(pl, handle, g, sg, sc[0], sc[1], head_sr, direction)
    _srh_seq(pl, g, direction, head_rows)
    return pl


# Packed NHWC rows whose channel count is not a multiple of the 16-byte vector (odd C: the row kernels take
# 1-element accesses): the statistics on the row kernels (at the narrower vector when ROWS_MID gives one),
# the apply pass on nc_apply with nc_hw = 1 (flat 16-byte vectors over the rows, each lane's channel = its
# flat index mod C, the constants per lane from L1; nc_head for the elements whose bytes held the constants).
# Why: bn_bwd NHWC 105x405x82x82 bf16 ran 0.64x PyTorch, 195x93x38x38 bf16 0.53x, 39x1315x23x23 fp32 0.59x,
# bn_train NHWC 187x50x14x14 fp32 0.60x on 1-element rows kernels (H200, tools/sweep_memory.py); the apply is
# 3 of the backward's 5 passes over the bytes. Not for inference (nc_apply's inference constants are per
# lane there: a division and a square root per element).
# Measured (H200 mid-session run, 2026-11-28): slower, so off. bn_bwd NHWC 105x405x82x82 bf16 5.01 ms flat
# against 1.89 ms on the scalar rows (0.24x / 0.65x PyTorch), 39x1315x23x23 fp32 0.372 against 0.276 ms,
# 2x477x13x13 fp32 55.5 against 36.5 us, bn_train 187x50x14x14 fp32 53.1 against 37.8 us: each lane loads
# its channel's 4 constants (8 lanes a vector in 16-bit), which costs more than the 16-byte data accesses
# save. A per-thread fixed-channel walk (gsf_fwd's super-rows) would keep the constants in registers.
# ROWS_FLAT: a switch, pydnn.tuning.batchnorm.ROWS_FLAT (default False)
def _flat_seqs(pl, handle, g, direction, vecs, chunk, chunks, cbytes, head_rows):
    """flat{v}: stats + final of the rows sequence at vecs[0], then nc_apply (and nc_head) at the full vector
    width v over the flat elements; flat{v}s, the forward with saved statistics (no head)."""
    v = vec_width(pl.tag, pl.tag)
    if (not tuning.batchnorm.ROWS_FLAT or g.vec_ok or v == 1 or g.layout != "rows"
            or any(ld != g.feats for ld in g.ld.values())):
        return
    total = g.rows * g.feats
    pl.params.nc_n, pl.params.nc_hw = g.rows, 1
    head = cdiv(cbytes, 16) * 16 // pl.isize if cbytes else 0  # (whole 16-byte vectors over the constants)
    if head > total:  # (cbytes <= HEAD_SMEM: the rows path's check covers nc_head's shared constants)
        return
    rows = pl.seqs.get(f"rows{vecs[0]}")
    if rows is None:
        return
    stats, final = rows[0], rows[1]
    seq = [stats, final, _nc_apply_launch(handle, direction, v, head, total)]
    if head:
        seq.append(_Launch("nc_head", v, (1, 1, 1), (NC_HEAD_THREADS, 1, 1), {"row_begin": 0, "row_end": head},
                           NC_MODES[direction]))
    pl.seqs[f"flat{v}"] = seq
    if direction == "fwd":
        pl.seqs[f"flat{v}s"] = [stats, final, _nc_apply_launch(handle, "fwd_saved", v, 0, total)]


_KEYED = (TensorDescriptor, _act.ActivationDescriptor)


def _key(*items):
    try:  # a list, not a generator: no Python frame per item (inlined by Python 3.12)
        return tuple([(d, d.version) if isinstance(d, _KEYED) else d for d in items])
    except TypeError:
        return None


def _aligned16(ptrs):
    return all(q % 16 == 0 for q in ptrs if q)


def _overlap(a, an, b, bn):
    return a < b + bn and b < a + an


def _run(handle, pl, seq):
    p = pl.params
    for lc in seq:
        if lc.func is None:
            lc.func = handle.function(pl.unit, _expr(lc.kernel, pl.tag, lc.vec, lc.u))
    for lc in seq:
        for k, v in lc.fields.items():
            setattr(p, k, v)
        driver.launch_args(lc.func, lc.grid, lc.block, 0, handle.cu_stream, pl.argv)


# Tiny training / backward calls (rows * feats <= GEN_TINY elements, rows <= GEN_TINY_ROWS) take the single
# gen launch (a block per feature, both passes) instead of the rows / nc sequences (3-4 launches): for them
# the launches and their host work are the time (NHWC bf16 7x35x5x5 training 0.67x PyTorch, fp16 18x5x9x9
# backward 0.61x with the rows path; H200, tools/sweep_memory.py). 0: off.
# 262144 (was 32768; mid-session run, H200, 2026-11-28, eager back-to-back / CUDA-graph device time per call,
# rows path -> gen): bn_bwd NHWC fp32 2x477x13x13 (161k elements) 29.9 -> 24.0 us / 14.1 -> 20.6 us,
# 6x14x25x25 31.6 -> 21.9 / 10.7 -> 12.6, bn_train NHWC bf16 51x175x2x2 33.4 -> 22.6 / 11.4 -> 5.8: eager
# (the sweep's and PyTorch's measure) gains 20-32%; inside a CUDA graph the larger ones lose up to 6.5 us.
# Past GEN_TINY_ROWS gen's one block per feature costs more (162x4x9x9 bf16: 13122 rows, device 10.9 -> 28.7
# us for 32.3 -> 30.8 us eager), so the rows limit stays. Second run, same-run A / B (32768 -> 262144): 43.6 ->
# 22.7 us, 43.0 -> 22.4 us, 45.1 -> 12.4 us eager (0.84-0.91x -> 1.72-2.05x PyTorch).
# GEN_TINY: a switch, pydnn.tuning.batchnorm.GEN_TINY (default 262144)
# GEN_TINY_ROWS: a switch, pydnn.tuning.batchnorm.GEN_TINY_ROWS (default 4096)


def _pick(pl, tensor_ptrs, scratch_ok, base=0):
    """The launch sequence for this call: rows (vector when every pointer is 16-byte aligned) when the
    plan has it and the scratch is usable, else gen. nc: also the scratch's base (its float / double
    constants and partials) 16-byte aligned (a 16-bit y / dx off the vector keeps gen). Tiny calls: gen."""
    g = pl.geom
    ncr = pl.seqs.get("ncr")
    if ncr is not None and tuning.batchnorm.NC_RES:
        return ncr
    if g.rows <= tuning.batchnorm.GEN_TINY_ROWS and g.rows * g.feats <= tuning.batchnorm.GEN_TINY and "gen" in pl.seqs:
        return pl.seqs["gen"]
    orb = 0  # the pointers' low bits together (NULL ones add none): aligned to a power of two m <=> orb % m == 0
    for q in tensor_ptrs:
        orb |= q
    a16 = orb & 15 == 0
    if scratch_ok:
        v = vec_width(pl.tag, pl.tag)
        if base % 16 == 0:
            if f"nc{v}" in pl.seqs and a16:
                return pl.seqs[f"nc{v}"]
            if "nc1" in pl.seqs:
                return pl.seqs["nc1"]
        if f"rows{v}" in pl.seqs and a16:
            return pl.seqs[f"rows{v}"]
        if f"flat{v}" in pl.seqs and base % 16 == 0 and a16:
            return pl.seqs[f"flat{v}"]
        vm = pl.vmid
        if vm and base % pl.asize == 0 and orb % (vm * pl.isize) == 0:
            return pl.seqs[f"rows{vm}"]
        if "sr" in pl.seqs and base % 16 == 0 and a16:  # (after the switches that are off by default: turned on,
            return pl.seqs["sr"]                        # they win)
        if "srh" in pl.seqs and base % pl.asize == 0 and a16:
            return pl.seqs["srh"]
        if "rows1" in pl.seqs and base % pl.asize == 0:  # the float / double scratch in a 16-bit y off 4 bytes: gen
            return pl.seqs["rows1"]
    if "planes" in pl.seqs and a16:
        return pl.seqs["planes"]
    return pl.seqs["gen"]


def _pick_plain(pl, seq, flags):
    """The plain forward's sequence when seq is a rows sequence and the call has no z, ReLU, mask or
    blending: with saved statistics (APPLY_SAVED) fwd_apply_saved over every row, else (FAST16)
    fwd_apply_plain and the head."""
    if flags & (FLAG_BETA | FLAG_RELU | FLAG_MASK | FLAG_Z):
        return seq
    for name, s in pl.seqs.items():
        if s is seq:
            if tuning.batchnorm.APPLY_SAVED and flags & FLAG_SAVE and name + "s" in pl.seqs:
                return pl.seqs[name + "s"]
            return pl.seqs.get(name + "p", seq)
    return seq


# A call's 17 pointers (x .. consts, 0 for the ones it does not pass) and its leading scalars written into the
# plan's BnParams with one struct.pack_into each, where zeroing the pointers and one setattr a field took ~30 setattr
# (~2 us a call of this 2-core machine's CPU; the sweep's small batch-norm calls are host-bound: bn_train NHWC fp32
# 187x50x14x14 at 0.88-0.94x PyTorch, H200, session 31). Layout: the pointers lead BnParams, then alpha, beta,
# alpha_p, beta_p, eps, factor.
_PTRS2 = struct.Struct("<17Q2d")   # pointers, alpha, beta
_PTRS5 = struct.Struct("<17Q5d")   # pointers, alpha, beta, alpha_p, beta_p, eps
_EPSF = struct.Struct("<2d")       # eps, factor
_EPS = struct.Struct("<d")
assert (BnParams.x.offset, BnParams.consts.offset, BnParams.alpha.offset, BnParams.eps.offset,
        BnParams.factor.offset) == (0, 128, 136, 168, 176)
_EPS_AT = BnParams.eps.offset


def _scratch_ptrs(pl, base):
    """(partial, consts) of the call: the scratch's partials and constants (0, 0 without a scratch)."""
    if pl.scratch is None or not base:
        return 0, 0
    return base + pl.scratch[0], base


# ----------------------------------------------------------------------------- forward training

def _fwd_validate(mode, x_desc, y_desc, bn_desc, eps, factor):
    mode = enum_arg("mode", mode, MODES, "pydnnBatchNormMode_t")
    _check_x(x_desc, "xDesc")
    _like_x(x_desc, y_desc, "yDesc", out=True)
    _check_bn_desc(bn_desc, "bnScaleBiasMeanVarDesc", x_desc, mode)
    return mode, _epsilon(eps), _finite("exponentialAverageFactor", factor)


# Launch records of forward training and backward (plain and Ex): what validating the descriptors decided
# (the plan, ReLU / add, the reserve space's need, the spans) under a key of every descriptor the validation
# reads and their versions (bnScaleBiasMeanVarDesc and the activation's too), as the inference form keeps its
# plan. A hit checks only what may change per call, without a Python call per argument: float scalars and
# epsilon / factor, int pointers (> 0, element-aligned; PYDNN_CHECKED off), the optional pairs, the workspace
# and reserve sizes, no overlap; anything else (tensor objects, ints for scalars, overlapping buffers, an error)
# takes the full path, which raises exactly as before. Why: the training Ex forward and backward took 92-98
# Python calls each (the inference form 9; tools/profile_torch_host_cpu.py, the CNN demo's step: half of
# pydnn's own host time), and the sweep's small batch-norm points are host-bound (bn_bwd NHWC bf16
# 162x4x9x9: 64.5 us a call eager, 11.5 us of it on the GPU in a CUDA graph; H200, tools/sweep_memory.py).
# RECORDS: a switch, pydnn.tuning.batchnorm.RECORDS (default True)
_MIN_EPS = E.PYDNN_BN_MIN_EPSILON


def _fast_pair(a, b, asz):
    """(a, b) of an optional pair of int pointers, (0, 0) for neither, None when the full path must decide."""
    if type(a) is int and type(b) is int and a > 0 and b > 0 and not a % asz and not b % asz:
        return a, b
    if (a is None or (type(a) is int and a == 0)) and (b is None or (type(b) is int and b == 0)):
        return 0, 0
    return None


def _fast_tail(pl, relu, rneed, reserve, reserve_size, ex, ws, ws_size, plain_scratch_ok, plain_base):
    """The record paths' reserve and workspace arguments: (reserve pointer or 0, scratch_ok, scratch base), or None
    when the full path must decide. The Ex forms' scratch is the workspace; the plain forms' is the output itself,
    usable only where beta is 0."""
    mp = 0
    if relu:
        if type(reserve_size) is not int or reserve_size < rneed or type(reserve) is not int or reserve <= 0:
            return None
        mp = reserve
    if not ex:
        return mp, plain_scratch_ok, plain_base
    if type(ws_size) is not int or ws_size < pl.ws_need:
        return None
    wp = 0
    if pl.ws_need:
        if type(ws) is not int or ws <= 0 or ws % 16:
            return None
        wp = ws
    return mp, True, wp


def _fwd_fast(handle, rec, alpha, beta, x, z, y, scale, bias, factor, run_mean, run_var, eps, save_mean, save_invvar,
              ws, ws_size, reserve, reserve_size, ex):
    """The call through its launch record; False when the full path must take it."""
    pl, relu, add, rneed, xs, ys = rec
    if (_buffers.CHECKED or type(alpha) is not float or type(beta) is not float or type(eps) is not float
            or not eps >= _MIN_EPS or type(factor) is not float or factor - factor != 0):
        return False
    isz, asz = pl.isize, pl.asize
    for q in ((x, y, z) if add else (x, y)):
        if type(q) is not int or q <= 0 or q % isz:
            return False
    for q in (scale, bias):
        if type(q) is not int or q <= 0 or q % asz:
            return False
    rp, sp2 = _fast_pair(run_mean, run_var, asz), _fast_pair(save_mean, save_invvar, asz)
    if rp is None or sp2 is None or (y < x + xs and x < y + ys):
        return False
    t = _fast_tail(pl, relu, rneed, reserve, reserve_size, ex, ws, ws_size, beta == 0, y)
    if t is None:
        return False
    mp, scratch_ok, base = t
    _fwd_go(handle, pl, relu, add, alpha, beta, eps, factor, x, y, z if add else 0, mp, scale, bias, rp, sp2,
            scratch_ok, base)
    return True


def _fwd_go(handle, pl, relu, add, al, be, eps, factor, xp, yp, zp, mp, sp, bp, rp, sp2, scratch_ok, base):
    seq = _pick(pl, (xp, yp, zp, mp), scratch_ok, base)
    p = pl.params
    rm, rv = rp
    sm, si = sp2
    part, cst = _scratch_ptrs(pl, base)
    _PTRS2.pack_into(p, 0, xp, yp, zp or 0, 0, 0, 0, mp or 0, sp, bp, rm or 0, rv or 0, sm or 0, si or 0, 0, 0,
                     part, cst, al, be)
    _EPSF.pack_into(p, _EPS_AT, eps, factor)
    flags = (pl.flags | (FLAG_BETA if be != 0 else 0) | (FLAG_RELU | FLAG_MASK if relu else 0)
             | (FLAG_Z if add else 0) | (FLAG_RUNNING if rm else 0) | (FLAG_SAVE if sm else 0))
    p.flags = flags
    _run(handle, pl, _pick_plain(pl, seq, flags))


def _fwd_train(handle, mode, ops, alpha, beta, x_desc, x, z_desc, z, y_desc, y, bn_desc, scale, bias, factor,
               run_mean, run_var, eps, save_mean, save_invvar, act_desc, ws, ws_size, reserve, reserve_size, ex):
    rkey = None
    if (type(handle) is Handle and handle.alive and type(mode) is int and (ops is None or type(ops) is int)
            and tuning.batchnorm.RECORDS):
        rkey = _key("bn_fwd_rec", ex, mode, ops, x_desc, y_desc, z_desc, bn_desc, act_desc)
        try:
            rec = handle.prepared.get(rkey) if rkey is not None else None
        except TypeError:  # an unhashable argument: the validation below names it
            rec = rkey = None
        if rec is not None and _fwd_fast(handle, rec, alpha, beta, x, z, y, scale, bias, factor, run_mean, run_var,
                                         eps, save_mean, save_invvar, ws, ws_size, reserve, reserve_size, ex):
            return
    check_handle(handle)
    mode, eps, factor = _fwd_validate(mode, x_desc, y_desc, bn_desc, eps, factor)
    if ex:
        ops = _bn_ops(ops, act_desc, z_desc, "zDesc", x_desc)
    tag = TAG[x_desc.dtype]
    isz = x_desc.itemsize
    add = ex and ops == E.PYDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION
    relu = ex and ops != E.PYDNN_BATCHNORM_OPS_BN
    operands = {OP_X: x_desc.strides, OP_Y: y_desc.strides}
    if add:
        operands[OP_Z] = z_desc.strides
    key = _key("bn_fwd", ex, mode, x_desc, y_desc, z_desc if add else None)
    pl = cached(handle, key, lambda: _make_plan(
        handle, tag, _geometry(mode, x_desc.dims, operands, vec_width(tag, tag)), "fwd", ex))
    al, be = scalar("alpha", alpha), scalar("beta", beta)
    asz = pl.asize
    pbytes = pl.geom.feats * asz
    xp = _ptr(x, "x", x_desc.span_bytes(), isz)
    yp = _ptr(y, "y", y_desc.span_bytes(), isz)
    no_partial_alias(yp, y_desc, "y", xp, x_desc, "x")
    zp = _ptr(z, "zData", z_desc.span_bytes(), isz) if add else 0
    sp, bp = _ptr(scale, "bnScale", pbytes, asz), _ptr(bias, "bnBias", pbytes, asz)
    rm, rv = _pair(run_mean, "resultRunningMean", run_var, "resultRunningVariance", pbytes, asz)
    sm, si = _pair(save_mean, "resultSaveMean", save_invvar, "resultSaveInvVariance", pbytes, asz)
    mp = 0
    if relu:
        need = _reserve_need(ops, x_desc)
        rs = _int("reserveSpaceSizeInBytes", reserve_size)
        if rs < need:
            raise _bad(f"reserveSpaceSizeInBytes: {rs} is less than the {need} bytes "
                       "GetBatchNormalizationTrainingExReserveSpaceSize gives")
        mp = device_ptr(reserve, "reserveSpace", need)
    wp = 0
    if ex:
        wsz = _int("workSpaceSizeInBytes", ws_size)
        if wsz < pl.ws_need:
            raise _bad(f"workSpaceSizeInBytes: {wsz} is less than the {pl.ws_need} bytes "
                       "GetBatchNormalizationForwardTrainingExWorkspaceSize gives")
        wp = device_ptr(ws, "workspace", pl.ws_need) if pl.ws_need else 0
        if wp % 16:
            raise PydnnError(E.PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER, f"workspace: {wp:#x} is not 16-byte aligned")
        scratch_ok, base = True, wp
    else:
        scratch_ok = be == 0 and not _overlap(xp, x_desc.span_bytes(), yp, y_desc.span_bytes())
        base = yp
    if rkey is not None:
        handle.remember(rkey, (pl, relu, add, _reserve_need(ops, x_desc) if relu else 0, x_desc.span_bytes(),
                               y_desc.span_bytes()))
    _fwd_go(handle, pl, relu, add, al, be, eps, factor, xp, yp, zp, mp, sp, bp, (rm, rv), (sm, si), scratch_ok, base)


@api
def batch_normalization_forward_training(handle, mode, alpha, beta, x_desc, x, y_desc, y, bn_scale_bias_mean_var_desc,
                                         bn_scale, bn_bias, exponential_average_factor, result_running_mean,
                                         result_running_variance, epsilon, result_save_mean,
                                         result_save_inv_variance):
    """cudnnBatchNormalizationForwardTraining. Running and saved statistics are optional (None / 0), each
    pair both or neither. Statuses: BAD_PARAM (handle, mode, descriptors that differ or are not derived
    from x, epsilon below PYDNN_BN_MIN_EPSILON, a factor not finite, one of a pair NULL, overlapping y),
    BAD_PARAM_NULL_POINTER, BAD_PARAM_MISALIGNED_POINTER, NOT_SUPPORTED (data types other than float,
    double, half, bfloat16)."""
    _fwd_train(handle, mode, None, alpha, beta, x_desc, x, None, None, y_desc, y, bn_scale_bias_mean_var_desc,
               bn_scale, bn_bias, exponential_average_factor, result_running_mean, result_running_variance,
               epsilon, result_save_mean, result_save_inv_variance, None, None, 0, None, 0, False)


@api
def batch_normalization_forward_training_ex(handle, mode, bn_ops, alpha, beta, x_desc, x_data, z_desc, z_data,
                                            y_desc, y_data, bn_scale_bias_mean_var_desc, bn_scale, bn_bias,
                                            exponential_average_factor, result_running_mean,
                                            result_running_variance, epsilon, result_save_mean,
                                            result_save_inv_variance, activation_desc, workspace,
                                            work_space_size_in_bytes, reserve_space, reserve_space_size_in_bytes):
    """cudnnBatchNormalizationForwardTrainingEx: bnOps BN, BN_ACTIVATION (ReLU), BN_ADD_ACTIVATION
    (ReLU(bn(x) + z)); the ReLU mask goes to the reserve space. Statuses as the non-Ex form, plus
    BAD_PARAM for bnOps, a workspace or reserve space smaller than the size queries give, and
    NOT_SUPPORTED for activations other than RELU."""
    _fwd_train(handle, mode, bn_ops, alpha, beta, x_desc, x_data, z_desc, z_data, y_desc, y_data,
               bn_scale_bias_mean_var_desc, bn_scale, bn_bias, exponential_average_factor, result_running_mean,
               result_running_variance, epsilon, result_save_mean, result_save_inv_variance, activation_desc,
               workspace, work_space_size_in_bytes, reserve_space, reserve_space_size_in_bytes, True)


@api
def get_batch_normalization_forward_training_ex_workspace_size(handle, mode, bn_ops, x_desc, z_desc, y_desc,
                                                               bn_scale_bias_mean_var_desc, activation_desc):
    """cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize: the partial statistics and per-channel
    constants of the rows layout (0 for layouts the gen kernels take)."""
    check_handle(handle)
    mode, _, _ = _fwd_validate(mode, x_desc, y_desc, bn_scale_bias_mean_var_desc, 0.0, 0.0)
    ops = _bn_ops(bn_ops, activation_desc, z_desc, "zDesc", x_desc)
    operands = {OP_X: x_desc.strides, OP_Y: y_desc.strides}
    if ops == E.PYDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION:
        operands[OP_Z] = z_desc.strides
    tag = TAG[x_desc.dtype]
    g = _geometry(mode, x_desc.dims, operands, vec_width(tag, tag))
    if g.layout != "rows":
        lay = _nc_layout(handle, g, tag, "fwd", True)
        return 0 if lay is None else lay[6]
    return max(_workspace_layout(handle, g, tag, "fwd", _first_vec(g, tag))[0], _sr_ws(handle, tag, g, "fwd"))


@api
def get_batch_normalization_training_ex_reserve_space_size(handle, mode, bn_ops, activation_desc, x_desc):
    """cudnnGetBatchNormalizationTrainingExReserveSpaceSize: one byte per element of x's span with an
    activation (the ReLU mask), 0 for BN."""
    check_handle(handle)
    enum_arg("mode", mode, MODES, "pydnnBatchNormMode_t")
    _check_x(x_desc, "xDesc")
    ops = _bn_ops(bn_ops, activation_desc, None if bn_ops != E.PYDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION else x_desc,
                  "zDesc", x_desc)
    return _reserve_need(ops, x_desc)


# ----------------------------------------------------------------------------- inference

@api
def batch_normalization_forward_inference(handle, mode, alpha, beta, x_desc, x, y_desc, y, bn_scale_bias_mean_var_desc,
                                          bn_scale, bn_bias, estimated_mean, estimated_variance, epsilon):
    """cudnnBatchNormalizationForwardInference. x and y may be the same buffer. Statuses as forward
    training (estimated mean and variance are required)."""
    if type(handle) is not Handle or not handle.alive:
        check_handle(handle)
    # The plan cache is consulted first, keyed by every descriptor the validation reads (bnScaleBiasMeanVarDesc
    # too) and their versions: a hit means they passed it unchanged, so only epsilon is checked again.
    key = _key("bn_infer", mode, x_desc, y_desc, bn_scale_bias_mean_var_desc) if type(mode) is int else None
    try:
        pl = handle.prepared.get(key) if key is not None else None
    except TypeError:  # an unhashable argument: the validation below names it
        key = pl = None
    fresh = pl is None
    if pl is not None:
        eps = _epsilon(epsilon)
    else:
        mode, eps, _ = _fwd_validate(mode, x_desc, y_desc, bn_scale_bias_mean_var_desc, epsilon, 0.0)
    tag = TAG[x_desc.dtype]
    isz = x_desc.itemsize
    if pl is None:
        pl = cached(handle, key, lambda: _make_plan(
            handle, tag, _geometry(mode, x_desc.dims, {OP_X: x_desc.strides, OP_Y: y_desc.strides},
                                   vec_width(tag, tag)), "infer", False))
    al = alpha if type(alpha) is float else scalar("alpha", alpha)
    be = beta if type(beta) is float else scalar("beta", beta)
    asz = pl.asize
    pbytes = pl.geom.feats * asz
    checked = _buffers.CHECKED
    xs, ys = x_desc.span_bytes(), y_desc.span_bytes()
    xp = x if type(x) is int and x > 0 and not checked and x % isz == 0 else _ptr(x, "x", xs, isz)
    yp = y if type(y) is int and y > 0 and not checked and y % isz == 0 else _ptr(y, "y", ys, isz)
    if yp < xp + xs and xp < yp + ys:  # overlapping: only the very same elements may be shared
        no_partial_alias(yp, y_desc, "y", xp, x_desc, "x")
    p = pl.params
    ptrs = []
    for b, n in ((bn_scale, "bnScale"), (bn_bias, "bnBias"), (estimated_mean, "estimatedMean"),
                 (estimated_variance, "estimatedVariance")):
        ptrs.append(b if type(b) is int and b > 0 and not checked and b % asz == 0 else _ptr(b, n, pbytes, asz))
    _PTRS2.pack_into(p, 0, xp, yp, 0, 0, 0, 0, 0, ptrs[0], ptrs[1], ptrs[2], ptrs[3], 0, 0, 0, 0, 0, 0, al, be)
    _EPS.pack_into(p, _EPS_AT, eps)
    p.flags = pl.flags | (FLAG_BETA if be != 0 else 0)
    seq = _pick(pl, (xp, yp), True)
    _run(handle, pl, seq)
    if _ew.note is not None and key is not None:  # the compiled entry keeps this call site (ew._setup_entries)
        _infer_note(pl, xs, ys, pbytes)
    elif fresh and not _ew._entries_tried:  # a new plan: the entries, where no other call set them up yet
        _ew.plan_entries(seq[0].func)


_py_batch_normalization_forward_inference = batch_normalization_forward_inference  # (ew._setup_entries)


def _infer_note(pl, xs, ys, pbytes):
    """The inference plan's C record (fastcall.bn_infer_record: the launch _pick chooses for each alignment tier of
    x | y) noted for the compiled entry; made again when a switch changed (the picks read them) or a tier's kernel
    was loaded since."""
    vm = pl.vmid
    vm_bytes = vm * pl.isize if vm else 0
    gen, k = tuning.GENERATION[0], getattr(pl, "crec_key", None)
    if k is None or k[0] != gen:  # the tiers' sequences (a Python call each; once a switch generation)
        probes = (1 << 20, vm_bytes or pl.isize, pl.isize)  # 16-byte aligned; the mid width's; element-aligned only
        k = (gen, [_pick(pl, (q,), True) for q in probes], None)
    loaded = (k[1][0][0].func is not None, k[1][1][0].func is not None, k[1][2][0].func is not None)
    if loaded != k[2]:
        fastcall.bn_infer_record(pl, BnParams, k[1], xs, ys, pbytes, vm_bytes if vm_bytes % 16 else 0, FLAG_BETA,
                                 E.PYDNN_BN_MIN_EPSILON)
        k = (k[0], k[1], loaded)
    pl.crec_key = k
    _ew.note(_ew.K_BN_INFER, pl, 0, False, False)


# ----------------------------------------------------------------------------- backward

def _bwd_validate(mode, x_desc, dy_desc, dx_desc, dbn_desc, eps):
    mode = enum_arg("mode", mode, MODES, "pydnnBatchNormMode_t")
    _check_x(x_desc, "xDesc")
    _like_x(x_desc, dy_desc, "dyDesc")
    _like_x(x_desc, dx_desc, "dxDesc", out=True)
    _check_bn_desc(dbn_desc, "dBnScaleBiasDesc", x_desc, mode)
    return mode, _epsilon(eps)


def _bwd_fast(handle, rec, alpha_d, beta_d, alpha_p, beta_p, x, dy, dz, dx, scale, dscale, dbias, eps, saved_mean,
              saved_invvar, ws, ws_size, reserve, reserve_size, ex):
    """The call through its launch record (see _fwd_fast); False when the full path must take it."""
    pl, relu, add, rneed, xs, dys, dxs = rec
    if (_buffers.CHECKED or type(alpha_d) is not float or type(beta_d) is not float or type(alpha_p) is not float
            or type(beta_p) is not float or type(eps) is not float or not eps >= _MIN_EPS):
        return False
    isz, asz = pl.isize, pl.asize
    for q in ((x, dy, dx, dz) if add else (x, dy, dx)):
        if type(q) is not int or q <= 0 or q % isz:
            return False
    for q in (scale, dscale, dbias):
        if type(q) is not int or q <= 0 or q % asz:
            return False
    sv = _fast_pair(saved_mean, saved_invvar, asz)
    if sv is None or (dx < x + xs and x < dx + dxs) or (dx < dy + dys and dy < dx + dxs):
        return False
    t = _fast_tail(pl, relu, rneed, reserve, reserve_size, ex, ws, ws_size, beta_d == 0, dx)
    if t is None:
        return False
    mp, scratch_ok, base = t
    _bwd_go(handle, pl, relu, add, alpha_d, beta_d, alpha_p, beta_p, eps, x, dy, dx, dz if add else 0, mp, scale,
            dscale, dbias, sv, scratch_ok, base)
    return True


def _bwd_go(handle, pl, relu, add, ad, bd, ap, bp_, eps, xp, dyp, dxp, dzp, mp, sp, dsp, dbp, sv, scratch_ok, base):
    seq = _pick(pl, (xp, dyp, dxp, dzp, mp), scratch_ok, base)
    smp, sip = sv
    if smp and tuning.batchnorm.BWD_SUMS:
        s0 = pl.sums0.get(id(seq)) if bp_ == 0 and ap != 0 and tuning.batchnorm.BWD_APPLY_SAVED else None
        seq = s0 or pl.sums.get(id(seq), seq)
    p = pl.params
    part, cst = _scratch_ptrs(pl, base)
    _PTRS5.pack_into(p, 0, xp, 0, 0, dyp, dxp, dzp or 0, mp or 0, sp, 0, 0, 0, smp or 0, sip or 0, dsp or 0, dbp or 0,
                     part, cst, ad, bd, ap, bp_, eps)
    p.flags = (pl.flags | (FLAG_BETA if bd != 0 else 0) | (FLAG_RELU | FLAG_MASK if relu else 0)
               | (FLAG_DZ if add else 0) | (FLAG_SAVED if smp else 0) | (FLAG_PBETA if bp_ != 0 else 0))
    _run(handle, pl, seq)


def _bwd(handle, mode, ops, alpha_d, beta_d, alpha_p, beta_p, x_desc, x, y_desc, dy_desc, dy, dz_desc, dz,
         dx_desc, dx, dbn_desc, scale, dscale, dbias, eps, saved_mean, saved_invvar, act_desc, ws, ws_size,
         reserve, reserve_size, ex):
    rkey = None
    if (type(handle) is Handle and handle.alive and type(mode) is int and (ops is None or type(ops) is int)
            and tuning.batchnorm.RECORDS):
        rkey = _key("bn_bwd_rec", ex, mode, ops, x_desc, y_desc if ex else None, dy_desc, dz_desc, dx_desc, dbn_desc,
                    act_desc)
        try:
            rec = handle.prepared.get(rkey) if rkey is not None else None
        except TypeError:  # an unhashable argument: the validation below names it
            rec = rkey = None
        if rec is not None and _bwd_fast(handle, rec, alpha_d, beta_d, alpha_p, beta_p, x, dy, dz, dx, scale, dscale,
                                         dbias, eps, saved_mean, saved_invvar, ws, ws_size, reserve, reserve_size, ex):
            return
    check_handle(handle)
    mode, eps = _bwd_validate(mode, x_desc, dy_desc, dx_desc, dbn_desc, eps)
    if ex:
        if y_desc is not None:
            _like_x(x_desc, y_desc, "yDesc")
        ops = _bn_ops(ops, act_desc, dz_desc, "dzDesc", x_desc)
    tag = TAG[x_desc.dtype]
    isz = x_desc.itemsize
    add = ex and ops == E.PYDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION
    relu = ex and ops != E.PYDNN_BATCHNORM_OPS_BN
    operands = {OP_X: x_desc.strides, OP_DY: dy_desc.strides, OP_DX: dx_desc.strides}
    if add:
        operands[OP_DZ] = dz_desc.strides
    key = _key("bn_bwd", ex, mode, x_desc, dy_desc, dx_desc, dz_desc if add else None)
    pl = cached(handle, key, lambda: _make_plan(
        handle, tag, _geometry(mode, x_desc.dims, operands, vec_width(tag, tag)), "bwd", ex))
    ad, bd = scalar("alphaDataDiff", alpha_d), scalar("betaDataDiff", beta_d)
    ap, bp_ = scalar("alphaParamDiff", alpha_p), scalar("betaParamDiff", beta_p)
    asz = pl.asize
    pbytes = pl.geom.feats * asz
    xp = _ptr(x, "x", x_desc.span_bytes(), isz)
    dyp = _ptr(dy, "dy", dy_desc.span_bytes(), isz)
    dxp = _ptr(dx, "dx", dx_desc.span_bytes(), isz)
    no_partial_alias(dxp, dx_desc, "dx", xp, x_desc, "x")
    no_partial_alias(dxp, dx_desc, "dx", dyp, dy_desc, "dy")
    dzp = _ptr(dz, "dzData", dz_desc.span_bytes(), isz) if add else 0
    sp = _ptr(scale, "bnScale", pbytes, asz)
    dsp, dbp = _ptr(dscale, "dBnScaleResult", pbytes, asz), _ptr(dbias, "dBnBiasResult", pbytes, asz)
    smp, sip = _pair(saved_mean, "savedMean", saved_invvar, "savedInvVariance", pbytes, asz)
    mp = 0
    if relu:
        need = _reserve_need(ops, x_desc)
        rs = _int("reserveSpaceSizeInBytes", reserve_size)
        if rs < need:
            raise _bad(f"reserveSpaceSizeInBytes: {rs} is less than the {need} bytes "
                       "GetBatchNormalizationTrainingExReserveSpaceSize gives")
        mp = device_ptr(reserve, "reserveSpace", need)
    if ex:
        wsz = _int("workSpaceSizeInBytes", ws_size)
        if wsz < pl.ws_need:
            raise _bad(f"workSpaceSizeInBytes: {wsz} is less than the {pl.ws_need} bytes "
                       "GetBatchNormalizationBackwardExWorkspaceSize gives")
        wp = device_ptr(ws, "workSpace", pl.ws_need) if pl.ws_need else 0
        if wp % 16:
            raise PydnnError(E.PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER, f"workSpace: {wp:#x} is not 16-byte aligned")
        scratch_ok, base = True, wp
    else:
        span = dx_desc.span_bytes()
        scratch_ok = (bd == 0 and not _overlap(dxp, span, xp, x_desc.span_bytes())
                      and not _overlap(dxp, span, dyp, dy_desc.span_bytes()))
        base = dxp
    if rkey is not None:
        handle.remember(rkey, (pl, relu, add, _reserve_need(ops, x_desc) if relu else 0, x_desc.span_bytes(),
                               dy_desc.span_bytes(), dx_desc.span_bytes()))
    _bwd_go(handle, pl, relu, add, ad, bd, ap, bp_, eps, xp, dyp, dxp, dzp, mp, sp, dsp, dbp, (smp, sip), scratch_ok,
            base)


@api
def batch_normalization_backward(handle, mode, alpha_data_diff, beta_data_diff, alpha_param_diff, beta_param_diff,
                                 x_desc, x, dy_desc, dy, dx_desc, dx, d_bn_scale_bias_desc, bn_scale,
                                 d_bn_scale_result, d_bn_bias_result, epsilon, saved_mean, saved_inv_variance):
    """cudnnBatchNormalizationBackward: dx, dScale, dBias (alpha / beta blending for each); savedMean and
    savedInvVariance both given (as forward training saved them) or both NULL (recomputed from x with
    epsilon). Statuses as forward training."""
    _bwd(handle, mode, None, alpha_data_diff, beta_data_diff, alpha_param_diff, beta_param_diff, x_desc, x, None,
         dy_desc, dy, None, None, dx_desc, dx, d_bn_scale_bias_desc, bn_scale, d_bn_scale_result, d_bn_bias_result,
         epsilon, saved_mean, saved_inv_variance, None, None, 0, None, 0, False)


@api
def batch_normalization_backward_ex(handle, mode, bn_ops, alpha_data_diff, beta_data_diff, alpha_param_diff,
                                    beta_param_diff, x_desc, x_data, y_desc, y_data, dy_desc, dy_data, dz_desc,
                                    dz_data, dx_desc, dx_data, d_bn_scale_bias_desc, bn_scale_data, bn_bias_data,
                                    d_bn_scale_data, d_bn_bias_data, epsilon, saved_mean, saved_inv_variance,
                                    activation_desc, work_space, work_space_size_in_bytes, reserve_space,
                                    reserve_space_size_in_bytes):
    """cudnnBatchNormalizationBackwardEx: the ReLU's mask comes from the reserve space the forward Ex
    call wrote (yData is not read); dz = alphaDataDiff * dy' + betaDataDiff * dz for BN_ADD_ACTIVATION.
    bnBiasData is not needed (accepted, not read). Statuses as the forward Ex form."""
    _bwd(handle, mode, bn_ops, alpha_data_diff, beta_data_diff, alpha_param_diff, beta_param_diff, x_desc, x_data,
         y_desc, dy_desc, dy_data, dz_desc, dz_data, dx_desc, dx_data, d_bn_scale_bias_desc, bn_scale_data,
         d_bn_scale_data, d_bn_bias_data, epsilon, saved_mean, saved_inv_variance, activation_desc, work_space,
         work_space_size_in_bytes, reserve_space, reserve_space_size_in_bytes, True)


@api
def get_batch_normalization_backward_ex_workspace_size(handle, mode, bn_ops, x_desc, y_desc, dy_desc, dz_desc,
                                                       dx_desc, d_bn_scale_bias_desc, activation_desc):
    """cudnnGetBatchNormalizationBackwardExWorkspaceSize (0 for layouts the gen kernels take)."""
    check_handle(handle)
    mode, _ = _bwd_validate(mode, x_desc, dy_desc, dx_desc, d_bn_scale_bias_desc, 0.0)
    if y_desc is not None:
        _like_x(x_desc, y_desc, "yDesc")
    ops = _bn_ops(bn_ops, activation_desc, dz_desc, "dzDesc", x_desc)
    operands = {OP_X: x_desc.strides, OP_DY: dy_desc.strides, OP_DX: dx_desc.strides}
    if ops == E.PYDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION:
        operands[OP_DZ] = dz_desc.strides
    tag = TAG[x_desc.dtype]
    g = _geometry(mode, x_desc.dims, operands, vec_width(tag, tag))
    if g.layout != "rows":
        lay = _nc_layout(handle, g, tag, "bwd", True)
        return 0 if lay is None else lay[6]
    return max(_workspace_layout(handle, g, tag, "bwd", _first_vec(g, tag))[0], _sr_ws(handle, tag, g, "bwd"))


def plan_summary(handle, direction, mode, x_desc, *others, ex=False):
    """For tests: (layout, {sequence name: [(kernel, vec, grid, block, fields), ...]}, workspace bytes).
    direction "fwd" (others: y_desc), "infer" (y_desc), "bwd" (dy_desc, dx_desc). Loads no kernel."""
    check_handle(handle)
    tag = TAG[x_desc.dtype]
    ops = (OP_Y,) if direction in ("fwd", "infer") else (OP_DY, OP_DX)
    operands = {OP_X: x_desc.strides}
    operands.update({k: d.strides for k, d in zip(ops, others)})
    pl = _make_plan(handle, tag, _geometry(mode, x_desc.dims, operands, vec_width(tag, tag)), direction, ex)
    seqs = {name: [(lc.kernel, lc.vec, lc.grid, lc.block, dict(lc.fields)) for lc in seq]
            for name, seq in pl.seqs.items()}
    return pl.geom.layout, seqs, pl.ws_need

# the compiled entries over this module's Python functions (_elementwise._setup_entries)
_ew.register_entries(sys.modules[__name__], "batch_normalization_forward_inference")
