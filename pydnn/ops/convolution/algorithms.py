"""Convolution algorithm selection: Get...AlgorithmMaxCount, Get..._v7 (a heuristic ranking that runs
nothing) and Find...AlgorithmEx (times every algorithm on the caller's buffers and workspace).

Results are ConvolutionPerf records (cudnnConvolution{Fwd,BwdData,BwdFilter}AlgoPerf_t): algo, status,
time (ms; -1 when not measured), memory (workspace bytes), determinism, mathType. Every algorithm of the
enum appears once: the ones pydnn cannot run for this problem carry status NOT_SUPPORTED (the reason is
in `.message`, a pydnn extension) and sort last.

The heuristic model (Get..._v7): each implemented algorithm's time is estimated from its blocks and work
(flops at an assumed CUDA-core or tensor-core rate, scaled by how many waves of blocks fill the GPU);
the multi-launch plans (GEMM, WINOGRAD_NONFUSED, FFT) add up a model of each of their launches
(their `estimate_ms`; the 16-bit matmul ones by gemm.mm16_ms, the tile matmul's chooser takes). fwd_wgmma
runs at WGMMA_TFLOPS, the mma.sync kernels at TENSOR_CORE_TFLOPS; a channel tail's zero-filled K tile
counts; a 1x1 implicit GEMM pays its short K loop's fill and its traffic (_tc_1x1_ms). The rates are a
ranking, not a promise: Find measures.

Find...AlgorithmEx synchronizes the handle's stream (it times with events), as cuDNN's does; it
overwrites the output buffer (y, dx or dw), as cuDNN's does. Its answers persist in a tuning cache (see
below; PYDNN_CONV_TUNING_CACHE=0 turns it off): a repeated question is answered without timing.

Find...Algorithm (without Ex, on buffers it allocates itself) is in find.py.
"""
import json
import os
import threading

from ... import enums as E
from ..._build import cache as _kcache
from ..._cuda import driver
from ...buffers import device_ptr
from ...handle import check_handle
from ...status import PydnnError, api
from ...tensor import DTYPES, _int
from ..common import cdiv, element_aligned, prod
from .implicit import BM, BN
from .plans import check_workspace, new_plan, register_estimate, run_plan
from .problem import (ALGO_TYPES, DIR_BWD_DATA, DIR_BWD_FILTER, DIR_FWD, check_conv, filter_bytes, operand_names,
                      problem)

REPS = 3  # timed runs per algorithm in Find (after one warm-up); the median is reported
CUDA_CORE_TFLOPS = 8.0   # the model's rates (measured on the H200): a ranking, not a promise
TENSOR_CORE_TFLOPS = 150.0
# fwd_wgmma (forward, and backward data as the forward of dy): the median of its bf16 points >= 5 GFLOP in the
# full sweep of 2026-11-27 (H200): 344 TFLOP/s over 103 points of 3x3 / 5x5 / 7x7 filters (40-583), 219 over 60
# 1x1 points (118-382; _tc_1x1_ms's fill makes 340 into 227-302 for 4-16 K tiles); the mma.sync kernels' 150
# stands (implicit_gemm_pipe_tc's 1x1 points: 53-100 TFLOP/s at 1-3 K tiles, the fill's 50-90)
WGMMA_TFLOPS = 340.0


class ConvolutionPerf:
    """cudnnConvolution*AlgoPerf_t. `message` (pydnn extension): why an algorithm is not supported."""

    __slots__ = ("algo", "status", "time", "memory", "determinism", "math_type", "message")

    def __init__(self, algo, status, time=-1.0, memory=0, determinism=E.PYDNN_NON_DETERMINISTIC,
                 math_type=E.PYDNN_DEFAULT_MATH, message=""):
        self.algo, self.status, self.time, self.memory = algo, status, time, memory
        self.determinism, self.math_type, self.message = determinism, math_type, message

    def as_tuple(self):
        return self.algo, self.status, self.time, self.memory, self.determinism, self.math_type

    def __iter__(self):
        return iter(self.as_tuple())

    def __repr__(self):
        return (f"ConvolutionPerf(algo={self.algo}, status={self.status}, time={self.time:.4g}, "
                f"memory={self.memory}, determinism={self.determinism}, mathType={self.math_type})")


def _count(direction):
    return len(ALGO_TYPES[direction][1])


@api
def get_convolution_forward_algorithm_max_count(handle):
    """cudnnGetConvolutionForwardAlgorithmMaxCount: the number of forward algorithms (8)."""
    check_handle(handle)
    return _count(DIR_FWD)


@api
def get_convolution_backward_data_algorithm_max_count(handle):
    """cudnnGetConvolutionBackwardDataAlgorithmMaxCount (6)."""
    check_handle(handle)
    return _count(DIR_BWD_DATA)


@api
def get_convolution_backward_filter_algorithm_max_count(handle):
    """cudnnGetConvolutionBackwardFilterAlgorithmMaxCount (7)."""
    check_handle(handle)
    return _count(DIR_BWD_FILTER)


def _candidates(handle, direction, conv, x_desc, w_desc, y_desc):
    """[(algo, plan or None, reason)] for every algorithm of the direction, after validating the problem."""
    check_conv(conv)
    problem(conv, x_desc, w_desc, y_desc, operand_names(direction))  # raises for a bad problem
    out = []
    for a in ALGO_TYPES[direction][1]:
        try:
            out.append((a, new_plan(handle, direction, a, conv, x_desc, w_desc, y_desc), ""))
        except PydnnError as e:
            if e.status != E.PYDNN_STATUS_NOT_SUPPORTED:
                raise
            out.append((a, None, e.message))
    return out


def _estimate_ms(handle, pl):
    """The model's time for a plan: flops / rate, stretched by partly filled waves of blocks."""
    if hasattr(pl, "estimate_ms"):  # multi-launch plans (GEMM, WINOGRAD_NONFUSED) model their own steps
        return pl.estimate_ms(handle, _estimate_ms)
    g = pl.gemm_grid
    blocks = g[0] * g[1] * g[2]
    per_wave = 2 * handle.sm_count
    waves = -(-blocks // per_wave)
    fill = blocks / (waves * per_wave)
    rate = (WGMMA_TFLOPS if "fwd_wgmma<" in pl.gemm_expr
            else TENSOR_CORE_TFLOPS if ("_tc<" in pl.gemm_expr or "_wgmma<" in pl.gemm_expr) else CUDA_CORE_TFLOPS)
    if pl.direction == DIR_BWD_FILTER and rate == CUDA_CORE_TFLOPS:
        fill = _busiest_sm_fill(handle, blocks)
    if "bwd_data_tc" in pl.gemm_expr:  # the gather meets zeros in all but 1 / stride^d of its MMAs
        rate /= prod(pl.problem.stride3)
    t = pl.problem.flops / (rate * 1e9) / max(fill, 1e-3)
    if pl.direction != DIR_BWD_FILTER and ("fwd_wgmma<" in pl.gemm_expr or "implicit_gemm_pipe_tc<" in pl.gemm_expr):
        rc = pl.problem.c if pl.direction == DIR_FWD else pl.problem.k   # the channels a tap's K tiles walk
        t *= cdiv(rc, 64) * 64 / rc   # a channel tail's zero-filled rest of its 64-deep K tile (FWD / BWD_TAIL_FILL)
    if rate != CUDA_CORE_TFLOPS and pl.direction != DIR_BWD_FILTER and prod(pl.problem.filt3) == 1:
        t = _tc_1x1_ms(pl, t)
    if rate == CUDA_CORE_TFLOPS and pl.direction == DIR_BWD_DATA:
        t *= _cc_tile_waste(pl)
    if pl.fold is not None:  # the fold reads the partials once
        t += pl.workspace / 2.0e9
    return t


register_estimate(_estimate_ms)

TC_FILL_KTILES = 2.0   # a tensor-core implicit GEMM block's pipeline fill + epilogue, in K tiles of 64
TC_GBPS = 3000.0        # the implicit GEMMs' least traffic time: x, w and y once at this rate (H100 copy ~2960)


def _tc_1x1_ms(pl, t):
    """A 1x1 tensor-core implicit GEMM (forward, backward data): its blocks' K loops are a few K tiles
    (C / 64 forward, K / 64 backward data), so the fill and the epilogue weigh; and its traffic is the
    floor. Fit to the issue's layers (H200, bf16 N = 64): 64->256 @56 forward on implicit_gemm_pipe_tc
    (1 K tile) measured 0.12 ms, this model 0.13 (without the fill: 0.044); 256->64 (4 K tiles, fwd_wgmma)
    0.055 / 0.066."""
    pb = pl.problem
    ktiles = cdiv(cdiv(pl.gemm.gk, 64), max(pl.splits, 1))   # a block's (a split's slice)
    t *= (ktiles + TC_FILL_KTILES) / ktiles
    es = DTYPES[pb.dtype][0]
    nbytes = (pb.n * prod(pb.in3) * pb.c + pb.n * prod(pb.out3) * pb.k + pb.k * pb.c) * es
    return max(t, nbytes / (TC_GBPS * 1e6))


def _cc_tile_waste(pl):
    """The CUDA-core backward-data kernel's work per useful flop: its BM x BN tiles run whole (a GEMM N of
    3, the stem's C, keeps 3 of 64 columns busy), and its gather visits every tap, of which 1 / stride^d
    meet an output position (the forward's tiles waste the same way; not counted there yet, its rankings
    were measured without it). Measured (H200, fp32 7x7/2 3->64 @224 backward data ALGO_0): 0.1 TFLOP/s,
    the model's 8 x 3/64 x 1/4 = 0.09."""
    g = pl.gemm
    waste = (cdiv(g.gm, BM) * BM / max(g.gm, 1)) * (cdiv(g.gn, BN) * BN / max(g.gn, 1))
    return waste * prod(pl.problem.stride3)


CC_LONE_BLOCK_SPEED = 0.75   # a CUDA-core block alone on its SM, relative to two sharing it (per SM)


def _busiest_sm_fill(handle, blocks):
    """The CUDA-core backward filter's fill: the busiest SM runs ceil(blocks / SMs) blocks one after the
    other in pairs, a lone block at CC_LONE_BLOCK_SPEED of a pair's per-SM rate. Counting waves of two
    blocks per SM instead made 144 blocks (ALGO_0 at 256->256 @14) one wave and ALGO_1's 288 half-length
    blocks two, a tie; measured (H200, fp32), the busiest SM's 2 full blocks against 3 half blocks:
    ALGO_1 1.33x faster, as this model says."""
    sms = max(handle.sm_count, 1)
    per_sm = -(-blocks // sms)
    speed = 1.0 if per_sm >= 2 else CC_LONE_BLOCK_SPEED
    return blocks / (per_sm * sms) * speed


def _requested(n):
    n = _int("requestedAlgoCount", n)
    if n <= 0:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"requestedAlgoCount: {n} must be positive")
    return n


def _perf(pl, algo, status, time, msg, math_type):
    det = E.PYDNN_DETERMINISTIC if pl is not None and pl.deterministic else E.PYDNN_NON_DETERMINISTIC
    return ConvolutionPerf(algo, status, time, pl.workspace if pl is not None else 0, det, math_type, msg)


def _heuristic(handle, direction, conv, x_desc, w_desc, y_desc, requested):
    check_handle(handle)
    n = _requested(requested)
    ok, bad = [], []
    for a, pl, msg in _candidates(handle, direction, conv, x_desc, w_desc, y_desc):
        if pl is None:
            bad.append(_perf(None, a, E.PYDNN_STATUS_NOT_SUPPORTED, -1.0, msg, conv.math_type))
        else:
            ok.append((_estimate_ms(handle, pl), _perf(pl, a, E.PYDNN_STATUS_SUCCESS, -1.0, "", conv.math_type)))
    ok.sort(key=lambda t: t[0])
    return ([p for _, p in ok] + bad)[:n]


@api
def get_convolution_forward_algorithm_v7(handle, src_desc, filter_desc, conv_desc, dest_desc, requested_algo_count):
    """cudnnGetConvolutionForwardAlgorithm_v7 -> [ConvolutionPerf] best first (time -1: not measured)."""
    return _heuristic(handle, DIR_FWD, conv_desc, src_desc, filter_desc, dest_desc, requested_algo_count)


@api
def get_convolution_backward_data_algorithm_v7(handle, filter_desc, diff_desc, conv_desc, grad_desc,
                                               requested_algo_count):
    """cudnnGetConvolutionBackwardDataAlgorithm_v7 -> [ConvolutionPerf] best first."""
    return _heuristic(handle, DIR_BWD_DATA, conv_desc, grad_desc, filter_desc, diff_desc, requested_algo_count)


@api
def get_convolution_backward_filter_algorithm_v7(handle, src_desc, diff_desc, conv_desc, grad_desc,
                                                 requested_algo_count):
    """cudnnGetConvolutionBackwardFilterAlgorithm_v7 -> [ConvolutionPerf] best first."""
    return _heuristic(handle, DIR_BWD_FILTER, conv_desc, src_desc, grad_desc, diff_desc, requested_algo_count)


# ----------------------------------------------------------------------------- the tuning cache
#
# Find...AlgorithmEx results persist in <cache dir>/conv_tuning.json, one entry per (device, arch,
# pydnn version, direction, problem, workspace limit), so another process asking the same question gets
# the answer without timing anything (as MIOpen's perf db does). PYDNN_CONV_TUNING_CACHE=0 turns it off
# (no reads, no writes). The file is rewritten atomically (a temporary file renamed over it), merged with
# what is on disk at that moment, so concurrent processes lose at most each other's newest entries.

TUNING_FILE = "conv_tuning.json"
_tuning_lock = threading.Lock()
_tuning = {"path": None, "data": None}


def tuning_enabled():
    return os.environ.get("PYDNN_CONV_TUNING_CACHE", "1") not in ("0", "", "off", "false")


def tuning_path():
    return _kcache.cache_dir() / TUNING_FILE


def _read_tuning(path):
    try:
        with open(path) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def tuning_key(device, direction, conv, x_desc, w_desc, y_desc, limit, aligned16=True):
    """The text key of a Find question: everything its answer depends on (aligned16: whether the operands
    the tensor-core plans read in 16-byte vectors are 16-byte aligned, which decides if they can run)."""
    from ...version import __version__
    return json.dumps([device, __version__, direction, x_desc.dtype, list(x_desc.dims), list(x_desc.strides),
                       w_desc.format, list(w_desc.dims), list(y_desc.dims), list(y_desc.strides), list(conv.pad),
                       list(conv.stride), list(conv.dil), conv.mode, conv.compute_type, conv.math_type, conv.groups,
                       int(limit)] + ([] if aligned16 else ["unaligned"]))


def tuning_get(key):
    if not tuning_enabled():
        return None
    path = tuning_path()
    with _tuning_lock:
        if _tuning["path"] != path:
            _tuning["path"], _tuning["data"] = path, _read_tuning(path)
        rows = _tuning["data"].get(key)
    if not isinstance(rows, list):
        return None
    try:
        return [ConvolutionPerf(*r) for r in rows]
    except TypeError:
        return None


def tuning_put(key, perfs):
    if not tuning_enabled():
        return
    path = tuning_path()
    rows = [[p.algo, p.status, p.time, p.memory, p.determinism, p.math_type, p.message] for p in perfs]
    with _tuning_lock:
        data = _read_tuning(path)
        data[key] = rows
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            with open(tmp, "w") as f:
                json.dump(data, f)
            os.replace(tmp, path)
        except OSError:
            pass  # a read-only cache directory: the answer is simply not kept
        _tuning["path"], _tuning["data"] = path, data


def _device_id(handle):
    return f"{driver.device_name(handle.device)}|{handle.arch}"


def _find(handle, direction, conv, x_desc, w_desc, y_desc, requested, ptrs, work_space, ws_size):
    """Time every supported algorithm on the caller's buffers (or answer from the tuning cache).
    ptrs = (A operand, B operand, output)."""
    check_handle(handle)
    n = _requested(requested)
    limit = _int("workSpaceSizeInBytes", ws_size)
    aligned16 = (ptrs[0] | ptrs[1]) % 16 == 0
    key = (tuning_key(_device_id(handle), direction, conv, x_desc, w_desc, y_desc, limit, aligned16)
           if tuning_enabled() else None)
    cached = tuning_get(key) if key else None
    if cached is not None:
        return cached[:n]
    timed, bad = [], []
    for a, pl, msg in _candidates(handle, direction, conv, x_desc, w_desc, y_desc):
        if pl is None:
            bad.append(_perf(None, a, E.PYDNN_STATUS_NOT_SUPPORTED, -1.0, msg, conv.math_type))
            continue
        if pl.workspace > limit:
            bad.append(_perf(pl, a, E.PYDNN_STATUS_ALLOC_FAILED, -1.0,
                             f"needs {pl.workspace} workspace bytes, {limit} given", conv.math_type))
            continue
        if pl.align and (ptrs[0] | ptrs[1]) % pl.align:  # run_plan would refuse the caller's buffers
            bad.append(_perf(pl, a, E.PYDNN_STATUS_NOT_SUPPORTED, -1.0,
                             f"reads its input and w in {pl.align}-byte vectors; these buffers are not "
                             f"{pl.align}-byte aligned", conv.math_type))
            continue
        ws = check_workspace(pl, work_space, limit)
        times = []
        run = lambda: run_plan(handle, pl, ptrs[0], ptrs[1], ptrs[2], ws, 1.0, 0.0)  # noqa: E731
        run()  # warm-up (and the module load)
        for _ in range(REPS):
            start, end = driver.Event(), driver.Event()
            start.record(handle.stream)
            run()
            end.record(handle.stream)
            end.synchronize()
            times.append(end.elapsed_ms(start))
        times.sort()
        timed.append(_perf(pl, a, E.PYDNN_STATUS_SUCCESS, times[len(times) // 2], "", conv.math_type))
    timed.sort(key=lambda p: p.time)
    if key:
        tuning_put(key, timed + bad)
    return (timed + bad)[:n]


def _buf(buf, name, nbytes, itemsize):
    return element_aligned(device_ptr(buf, name, nbytes), name, itemsize)


@api
def find_convolution_forward_algorithm_ex(handle, x_desc, x, w_desc, w, conv_desc, y_desc, y, requested_algo_count,
                                          work_space, work_space_size_in_bytes):
    """cudnnFindConvolutionForwardAlgorithmEx -> [ConvolutionPerf] fastest first (overwrites y)."""
    check_handle(handle)
    pb = problem(check_conv(conv_desc), x_desc, w_desc, y_desc)
    it = DTYPES[pb.dtype][0]
    ptrs = (_buf(x, "x", x_desc.span_bytes(), it), _buf(w, "w", filter_bytes(w_desc), it),
            _buf(y, "y", y_desc.span_bytes(), it))
    return _find(handle, DIR_FWD, conv_desc, x_desc, w_desc, y_desc, requested_algo_count, ptrs, work_space,
                 work_space_size_in_bytes)


@api
def find_convolution_backward_data_algorithm_ex(handle, w_desc, w, dy_desc, dy, conv_desc, dx_desc, dx,
                                                requested_algo_count, work_space, work_space_size_in_bytes):
    """cudnnFindConvolutionBackwardDataAlgorithmEx -> [ConvolutionPerf] fastest first (overwrites dx)."""
    check_handle(handle)
    pb = problem(check_conv(conv_desc), dx_desc, w_desc, dy_desc, operand_names(DIR_BWD_DATA))
    it = DTYPES[pb.dtype][0]
    ptrs = (_buf(dy, "dy", dy_desc.span_bytes(), it), _buf(w, "w", filter_bytes(w_desc), it),
            _buf(dx, "dx", dx_desc.span_bytes(), it))
    return _find(handle, DIR_BWD_DATA, conv_desc, dx_desc, w_desc, dy_desc, requested_algo_count, ptrs,
                 work_space, work_space_size_in_bytes)


@api
def find_convolution_backward_filter_algorithm_ex(handle, x_desc, x, dy_desc, dy, conv_desc, dw_desc, dw,
                                                  requested_algo_count, work_space, work_space_size_in_bytes):
    """cudnnFindConvolutionBackwardFilterAlgorithmEx -> [ConvolutionPerf] fastest first (overwrites dw)."""
    check_handle(handle)
    pb = problem(check_conv(conv_desc), x_desc, dw_desc, dy_desc, operand_names(DIR_BWD_FILTER))
    it = DTYPES[pb.dtype][0]
    ptrs = (_buf(dy, "dy", dy_desc.span_bytes(), it), _buf(x, "x", x_desc.span_bytes(), it),
            _buf(dw, "dw", filter_bytes(dw_desc), it))
    return _find(handle, DIR_BWD_FILTER, conv_desc, x_desc, dw_desc, dy_desc, requested_algo_count, ptrs,
                 work_space, work_space_size_in_bytes)


__all__ = [
    "ConvolutionPerf", "get_convolution_forward_algorithm_max_count",
    "get_convolution_backward_data_algorithm_max_count", "get_convolution_backward_filter_algorithm_max_count",
    "get_convolution_forward_algorithm_v7", "get_convolution_backward_data_algorithm_v7",
    "get_convolution_backward_filter_algorithm_v7", "find_convolution_forward_algorithm_ex",
    "find_convolution_backward_data_algorithm_ex", "find_convolution_backward_filter_algorithm_ex",
]

def _perf_struct(algo_type):
    return ["%s algo" % algo_type, "pydnnStatus_t status", "float time", "size_t memory",
            "pydnnDeterminism_t determinism", "pydnnMathType_t mathType", "int reserved[3]"]


C_STRUCTS = [("pydnnConvolutionFwdAlgoPerf_t", _perf_struct("pydnnConvolutionFwdAlgo_t")),
             ("pydnnConvolutionBwdDataAlgoPerf_t", _perf_struct("pydnnConvolutionBwdDataAlgo_t")),
             ("pydnnConvolutionBwdFilterAlgoPerf_t", _perf_struct("pydnnConvolutionBwdFilterAlgo_t"))]

_H, _CD, _TD, _FD = ("pydnnHandle_t", "const pydnnConvolutionDescriptor_t", "const pydnnTensorDescriptor_t",
                     "const pydnnFilterDescriptor_t")
C_FUNCTIONS = [
    (f"pydnnStatus_t pydnnGetConvolutionForwardAlgorithm_v7({_H} handle, {_TD} srcDesc, {_FD} filterDesc, {_CD} convDesc, {_TD} destDesc, int requestedAlgoCount, int *returnedAlgoCount, pydnnConvolutionFwdAlgoPerf_t *perfResults);", "Forward algorithms ranked by pydnn's model (nothing runs; time -1); unsupported ones last with NOT_SUPPORTED."),
    (f"pydnnStatus_t pydnnGetConvolutionBackwardDataAlgorithm_v7({_H} handle, {_FD} filterDesc, {_TD} diffDesc, {_CD} convDesc, {_TD} gradDesc, int requestedAlgoCount, int *returnedAlgoCount, pydnnConvolutionBwdDataAlgoPerf_t *perfResults);", "Backward-data algorithms ranked by the model."),
    (f"pydnnStatus_t pydnnGetConvolutionBackwardFilterAlgorithm_v7({_H} handle, {_TD} srcDesc, {_TD} diffDesc, {_CD} convDesc, {_FD} gradDesc, int requestedAlgoCount, int *returnedAlgoCount, pydnnConvolutionBwdFilterAlgoPerf_t *perfResults);", "Backward-filter algorithms ranked by the model."),
    (f"pydnnStatus_t pydnnFindConvolutionForwardAlgorithmEx({_H} handle, {_TD} xDesc, const void *x, {_FD} wDesc, const void *w, {_CD} convDesc, {_TD} yDesc, void *y, int requestedAlgoCount, int *returnedAlgoCount, pydnnConvolutionFwdAlgoPerf_t *perfResults, void *workSpace, size_t workSpaceSizeInBytes);", "Times every forward algorithm on these buffers (overwrites y; synchronizes); fastest first."),
    (f"pydnnStatus_t pydnnFindConvolutionBackwardDataAlgorithmEx({_H} handle, {_FD} wDesc, const void *w, {_TD} dyDesc, const void *dy, {_CD} convDesc, {_TD} dxDesc, void *dx, int requestedAlgoCount, int *returnedAlgoCount, pydnnConvolutionBwdDataAlgoPerf_t *perfResults, void *workSpace, size_t workSpaceSizeInBytes);", "Times every backward-data algorithm (overwrites dx)."),
    (f"pydnnStatus_t pydnnFindConvolutionBackwardFilterAlgorithmEx({_H} handle, {_TD} xDesc, const void *x, {_TD} dyDesc, const void *dy, {_CD} convDesc, {_FD} dwDesc, void *dw, int requestedAlgoCount, int *returnedAlgoCount, pydnnConvolutionBwdFilterAlgoPerf_t *perfResults, void *workSpace, size_t workSpaceSizeInBytes);", "Times every backward-filter algorithm (overwrites dw)."),
    ("pydnnStatus_t pydnnGetConvolutionForwardAlgorithmMaxCount(pydnnHandle_t handle, int *count);", "The number of forward algorithms."),
    ("pydnnStatus_t pydnnGetConvolutionBackwardDataAlgorithmMaxCount(pydnnHandle_t handle, int *count);", "The number of backward-data algorithms."),
    ("pydnnStatus_t pydnnGetConvolutionBackwardFilterAlgorithmMaxCount(pydnnHandle_t handle, int *count);", "The number of backward-filter algorithms."),
]
