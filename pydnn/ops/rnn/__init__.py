"""The RNN family: cuDNN 9's RNN API (the _v8 functions, RNNSetClip_v9 / RNNGetClip_v9).

    descriptors.py   RNN and RNN data descriptors, the derived geometry and the weight-space layout
    engine.py        size queries, GetRNNWeightParams, BuildRNNDynamic, RNNForward, RNNBackwardData_v8,
                     RNNBackwardWeights_v8 (the STANDARD algorithm on pydnn's matmul + ptx/rnn.cu)
    kernels.py       the kernel units of ptx/rnn.cu and their launcher
    gemm_f64.py      a double GEMM (ptx/gemm_f64.cu) for the double path: matmul's formula and params names
    persist.py       PERSIST_STATIC: one persistent kernel per layer (ptx/rnn_persist.cu), its plan and launches
The float64 reference is pydnn/reference/rnn.py.
"""
from .descriptors import (
    RNNDataDescriptor, RNNDescriptor, create_rnn_data_descriptor, create_rnn_descriptor, destroy_rnn_data_descriptor,
    destroy_rnn_descriptor, get_rnn_data_descriptor, get_rnn_descriptor_v8, rnn_get_clip_v9, rnn_set_clip_v9,
    set_rnn_data_descriptor, set_rnn_descriptor_v8,
)
from .engine import (
    build_rnn_dynamic, get_rnn_temp_space_sizes, get_rnn_weight_params, get_rnn_weight_space_size,
    rnn_backward_data_v8, rnn_backward_weights_v8, rnn_forward,
)
from .kernels import kernel_units  # noqa: F401 - the manifest reads it

__all__ = ["RNNDescriptor", "RNNDataDescriptor", "create_rnn_descriptor", "destroy_rnn_descriptor",
           "set_rnn_descriptor_v8", "get_rnn_descriptor_v8", "rnn_set_clip_v9", "rnn_get_clip_v9",
           "create_rnn_data_descriptor", "destroy_rnn_data_descriptor", "set_rnn_data_descriptor",
           "get_rnn_data_descriptor", "get_rnn_weight_space_size", "get_rnn_temp_space_sizes",
           "get_rnn_weight_params", "build_rnn_dynamic", "rnn_forward", "rnn_backward_data_v8",
           "rnn_backward_weights_v8"]

# ---- RNN family C API (cuDNN 9's RNN _v8 API) ----
_R, _RD, _T, _D = "pydnnRNNDescriptor_t", "pydnnRNNDataDescriptor_t", "pydnnTensorDescriptor_t", "pydnnDropoutDescriptor_t"
C_API = [("RNN, LSTM and GRU (cuDNN 9's RNN API: the _v8 functions)", [
    (f"pydnnStatus_t pydnnCreateRNNDescriptor({_R} *rnnDesc);", "A new RNN descriptor, unset until pydnnSetRNNDescriptor_v8."),
    (f"pydnnStatus_t pydnnDestroyRNNDescriptor({_R} rnnDesc);", "Release an RNN descriptor (NULL: nothing to do)."),
    (f"pydnnStatus_t pydnnSetRNNDescriptor_v8({_R} rnnDesc, pydnnRNNAlgo_t algo, pydnnRNNMode_t cellMode, "
     "pydnnRNNBiasMode_t biasMode, pydnnDirectionMode_t dirMode, pydnnRNNInputMode_t inputMode, "
     "pydnnDataType_t dataType, pydnnDataType_t mathPrec, pydnnMathType_t mathType, int inputSize, "
     f"int hiddenSize, int projSize, int numLayers, {_D} dropoutDesc, unsigned auxFlags);",
     "Algorithm, cell, bias / direction / input modes, types, sizes (projSize = hiddenSize: no projection), dropout (NULL: none), PYDNN_RNN_PADDED_IO_*."),
    (f"pydnnStatus_t pydnnGetRNNDescriptor_v8({_R} rnnDesc, pydnnRNNAlgo_t *algo, pydnnRNNMode_t *cellMode, "
     "pydnnRNNBiasMode_t *biasMode, pydnnDirectionMode_t *dirMode, pydnnRNNInputMode_t *inputMode, "
     "pydnnDataType_t *dataType, pydnnDataType_t *mathPrec, pydnnMathType_t *mathType, int *inputSize, "
     f"int *hiddenSize, int *projSize, int *numLayers, {_D} *dropoutDesc, unsigned *auxFlags);",
     "The RNN descriptor's settings."),
    (f"pydnnStatus_t pydnnRNNSetClip_v9({_R} rnnDesc, pydnnRNNClipMode_t clipMode, pydnnNanPropagation_t clipNanOpt, "
     "double lclip, double rclip);", "LSTM cell clipping to [lclip, rclip] (CLIP_MINMAX) or none."),
    (f"pydnnStatus_t pydnnRNNGetClip_v9({_R} rnnDesc, pydnnRNNClipMode_t *clipMode, pydnnNanPropagation_t *clipNanOpt, "
     "double *lclip, double *rclip);", "The LSTM clipping settings."),
    (f"pydnnStatus_t pydnnBuildRNNDynamic(pydnnHandle_t handle, {_R} rnnDesc, int miniBatch);",
     "Nothing to build for STANDARD; PERSIST_DYNAMIC: NOT_SUPPORTED."),
    (f"pydnnStatus_t pydnnGetRNNTempSpaceSizes(pydnnHandle_t handle, {_R} rnnDesc, pydnnForwardMode_t fwdMode, "
     f"{_RD} xDesc, size_t *workSpaceSize, size_t *reserveSpaceSize);",
     "Workspace and reserve-space bytes (training sizes also serve the backward calls)."),
    (f"pydnnStatus_t pydnnGetRNNWeightSpaceSize(pydnnHandle_t handle, {_R} rnnDesc, size_t *weightSpaceSize);",
     "Bytes of the weight space."),
    (f"pydnnStatus_t pydnnGetRNNWeightParams(pydnnHandle_t handle, {_R} rnnDesc, int pseudoLayer, "
     f"size_t weightSpaceSize, const void *weightSpace, int linLayerID, {_T} mDesc, void **mAddr, {_T} bDesc, "
     "void **bAddr);",
     "Matrix and bias of (pseudoLayer, linLayerID): descriptors (1, rows, cols) / (1, rows, 1) and addresses, NULL where absent."),
    (f"pydnnStatus_t pydnnCreateRNNDataDescriptor({_RD} *rnnDataDesc);", "A new RNN data descriptor."),
    (f"pydnnStatus_t pydnnDestroyRNNDataDescriptor({_RD} rnnDataDesc);", "Release an RNN data descriptor (NULL: nothing to do)."),
    (f"pydnnStatus_t pydnnSetRNNDataDescriptor({_RD} rnnDataDesc, pydnnDataType_t dataType, pydnnRNNDataLayout_t layout, "
     "int maxSeqLength, int batchSize, int vectorSize, const int seqLengthArray[], void *paddingFill);",
     "Layout, sizes, batchSize lengths in [1, maxSeqLength] (packed: not increasing), fill (NULL: none)."),
    (f"pydnnStatus_t pydnnGetRNNDataDescriptor({_RD} rnnDataDesc, pydnnDataType_t *dataType, pydnnRNNDataLayout_t *layout, "
     "int *maxSeqLength, int *batchSize, int *vectorSize, int arrayLengthRequested, int seqLengthArray[], "
     "void *paddingFill);", "The RNN data descriptor's settings (paddingFill NULL: not returned)."),
    (f"pydnnStatus_t pydnnRNNForward(pydnnHandle_t handle, {_R} rnnDesc, pydnnForwardMode_t fwdMode, "
     f"const void *devSeqLengths, {_RD} xDesc, const void *x, {_RD} yDesc, void *y, {_T} hDesc, const void *hx, "
     f"void *hy, {_T} cDesc, const void *cx, void *cy, size_t weightSpaceSize, const void *weightSpace, "
     "size_t workSpaceSize, void *workSpace, size_t reserveSpaceSize, void *reserveSpace);",
     "y, hy, cy from x, hx, cx (each state NULL-able); devSeqLengths: int32 device array."),
    (f"pydnnStatus_t pydnnRNNBackwardData_v8(pydnnHandle_t handle, {_R} rnnDesc, const void *devSeqLengths, "
     f"{_RD} yDesc, const void *y, const void *dy, {_RD} xDesc, void *dx, {_T} hDesc, const void *hx, "
     f"const void *dhy, void *dhx, {_T} cDesc, const void *cx, const void *dcy, void *dcx, size_t weightSpaceSize, "
     "const void *weightSpace, size_t workSpaceSize, void *workSpace, size_t reserveSpaceSize, void *reserveSpace);",
     "dx, dhx, dcx from dy, dhy, dcy after a training forward."),
    (f"pydnnStatus_t pydnnRNNBackwardWeights_v8(pydnnHandle_t handle, {_R} rnnDesc, pydnnWgradMode_t addGrad, "
     f"const void *devSeqLengths, {_RD} xDesc, const void *x, {_T} hDesc, const void *hx, {_RD} yDesc, "
     "const void *y, size_t weightSpaceSize, void *dweightSpace, size_t workSpaceSize, void *workSpace, "
     "size_t reserveSpaceSize, void *reserveSpace);",
     "Weight gradients added (ADD) to / written (SET) into dweightSpace, after pydnnRNNBackwardData_v8."),
])]
C_OPAQUE_TYPES = [(_R, "pydnnRNNStruct"), (_RD, "pydnnRNNDataStruct")]
C_NULLABLE = {"pydnnSetRNNDescriptor_v8": ("dropoutDesc",),
              "pydnnGetRNNTempSpaceSizes": ("reserveSpaceSize",),
              "pydnnGetRNNWeightParams": ("mDesc", "bDesc", "mAddr", "bAddr"),
              "pydnnGetRNNDataDescriptor": ("paddingFill",),
              "pydnnRNNForward": ("cDesc",),
              "pydnnRNNBackwardData_v8": ("cDesc",),
              "pydnnRNNBackwardWeights_v8": ("yDesc",)}
