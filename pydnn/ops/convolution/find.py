"""cudnnFindConvolution{Forward,BackwardData,BackwardFilter}Algorithm (the forms without Ex).

They answer the same question as the Ex forms (algorithms.py: every algorithm timed, fastest first,
the tuning cache consulted) but on buffers of their own, as cuDNN's do: the caller passes descriptors only.
These three calls are the documented exception to "no call allocates": they allocate the operands, the
output and a workspace as large as the most demanding supported algorithm asks, zero the operands,
synchronize, and free everything before returning. Nothing of the caller's is read or written. When the
workspace cannot be allocated, the search goes on without one and the algorithms that need it report
ALLOC_FAILED, as in the Ex forms with a too small workspace.
"""
from ... import enums as E
from ..._cuda import driver
from ...handle import check_handle
from ...status import PydnnError, api
from . import algorithms as A
from .problem import DIR_BWD_DATA, DIR_BWD_FILTER, DIR_FWD, check_conv, filter_bytes, operand_names, problem

_OOM = E.PYDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED  # what the driver layer raises for cuMemAlloc


class _Scratch:
    """Device buffers for one Find, freed on exit (also when the search raises)."""

    def __init__(self, handle):
        self.handle, self.ptrs = handle, []

    def __enter__(self):
        return self

    def alloc(self, nbytes, what, zero=False):
        with driver.pushed(self.handle.ctx):
            try:
                ptr = driver.mem_alloc(nbytes)
            except PydnnError as e:
                if e.status != _OOM:
                    raise
                raise PydnnError(E.PYDNN_STATUS_ALLOC_FAILED, f"{what}: no room for its {nbytes} bytes") from None
            self.ptrs.append(ptr)
            if zero:
                driver.memset_d8(ptr, 0, max(int(nbytes), 1))
        return ptr

    def try_alloc(self, nbytes):
        """A workspace of nbytes, or (0, 0) when the device has not that much free."""
        if nbytes <= 0:
            return 0, 0
        try:
            return self.alloc(nbytes, "workSpace"), nbytes
        except PydnnError as e:
            if e.status != E.PYDNN_STATUS_ALLOC_FAILED:
                raise
            return 0, 0

    def __exit__(self, *exc):
        with driver.pushed(self.handle.ctx):
            driver.stream_synchronize(self.handle.stream)  # nothing may still use the buffers
            for p in self.ptrs:
                driver.mem_free(p)
        return False


def _largest_workspace(handle, direction, conv, x_desc, w_desc, y_desc):
    """The biggest workspace any supported algorithm of the direction asks for (validates the problem)."""
    return max([pl.workspace for _, pl, _ in A._candidates(handle, direction, conv, x_desc, w_desc, y_desc) if pl]
               + [0])


def _find(handle, direction, conv, x_desc, w_desc, y_desc, requested, buffers):
    """buffers: (name, bytes) of the two operands and the output, in the order algorithms._find
    takes them; the operands are zeroed (timing on garbage could meet NaNs), the output is not."""
    check_handle(handle)
    n = A._requested(requested)
    need = _largest_workspace(handle, direction, conv, x_desc, w_desc, y_desc)
    if A.tuning_enabled():  # asked before with this workspace (ours are aligned): nothing to allocate
        key = A.tuning_key(A._device_id(handle), direction, conv, x_desc, w_desc, y_desc, need, True)
        cached = A.tuning_get(key)
        if cached is not None:
            return cached[:n]
    with _Scratch(handle) as s:
        ptrs = tuple(s.alloc(n, what, zero=i < 2) for i, (what, n) in enumerate(buffers))
        ws, ws_size = s.try_alloc(need)
        return A._find(handle, direction, conv, x_desc, w_desc, y_desc, requested, ptrs, ws, ws_size)


@api
def find_convolution_forward_algorithm(handle, x_desc, w_desc, conv_desc, y_desc, requested_algo_count):
    """cudnnFindConvolutionForwardAlgorithm -> [ConvolutionPerf] fastest first (on buffers of its own)."""
    check_handle(handle)
    problem(check_conv(conv_desc), x_desc, w_desc, y_desc)
    return _find(handle, DIR_FWD, conv_desc, x_desc, w_desc, y_desc, requested_algo_count,
                 (("x", x_desc.span_bytes()), ("w", filter_bytes(w_desc)), ("y", y_desc.span_bytes())))


@api
def find_convolution_backward_data_algorithm(handle, w_desc, dy_desc, conv_desc, dx_desc, requested_algo_count):
    """cudnnFindConvolutionBackwardDataAlgorithm -> [ConvolutionPerf] fastest first (on buffers of its own)."""
    check_handle(handle)
    problem(check_conv(conv_desc), dx_desc, w_desc, dy_desc, operand_names(DIR_BWD_DATA))
    return _find(handle, DIR_BWD_DATA, conv_desc, dx_desc, w_desc, dy_desc, requested_algo_count,
                 (("dy", dy_desc.span_bytes()), ("w", filter_bytes(w_desc)), ("dx", dx_desc.span_bytes())))


@api
def find_convolution_backward_filter_algorithm(handle, x_desc, dy_desc, conv_desc, dw_desc, requested_algo_count):
    """cudnnFindConvolutionBackwardFilterAlgorithm -> [ConvolutionPerf] fastest first (on buffers of its own)."""
    check_handle(handle)
    problem(check_conv(conv_desc), x_desc, dw_desc, dy_desc, operand_names(DIR_BWD_FILTER))
    return _find(handle, DIR_BWD_FILTER, conv_desc, x_desc, dw_desc, dy_desc, requested_algo_count,
                 (("dy", dy_desc.span_bytes()), ("x", x_desc.span_bytes()), ("dw", filter_bytes(dw_desc))))


__all__ = ["find_convolution_forward_algorithm", "find_convolution_backward_data_algorithm",
           "find_convolution_backward_filter_algorithm"]

_H, _CD, _TD, _FD = ("pydnnHandle_t", "const pydnnConvolutionDescriptor_t", "const pydnnTensorDescriptor_t",
                     "const pydnnFilterDescriptor_t")
C_FUNCTIONS = [
    (f"pydnnStatus_t pydnnFindConvolutionForwardAlgorithm({_H} handle, {_TD} xDesc, {_FD} wDesc, {_CD} convDesc, {_TD} yDesc, int requestedAlgoCount, int *returnedAlgoCount, pydnnConvolutionFwdAlgoPerf_t *perfResults);", "Times every forward algorithm on buffers it allocates and frees itself (synchronizes); fastest first."),
    (f"pydnnStatus_t pydnnFindConvolutionBackwardDataAlgorithm({_H} handle, {_FD} wDesc, {_TD} dyDesc, {_CD} convDesc, {_TD} dxDesc, int requestedAlgoCount, int *returnedAlgoCount, pydnnConvolutionBwdDataAlgoPerf_t *perfResults);", "Times every backward-data algorithm on buffers of its own."),
    (f"pydnnStatus_t pydnnFindConvolutionBackwardFilterAlgorithm({_H} handle, {_TD} xDesc, {_TD} dyDesc, {_CD} convDesc, {_FD} dwDesc, int requestedAlgoCount, int *returnedAlgoCount, pydnnConvolutionBwdFilterAlgoPerf_t *perfResults);", "Times every backward-filter algorithm on buffers of its own."),
]
