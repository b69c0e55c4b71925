"""cuDNN 9 enum and #define constants, renamed from CUDNN_* to PYDNN_*, plus pydnn's own extensions.

Values were read from the cuDNN 9.6.0 public headers (cudnn_graph.h, cudnn_ops.h, cudnn_cnn.h, cudnn_adv.h);
members keep the headers' declaration order. Deprecated names that the headers define as another member are
listed in ALIASES.
"""

# Each enum is a dict: C type name -> {constant name: value}. The C header generator and the
# module attributes are both built from ENUMS (and DEFINES), so this is the single source of truth.
ENUMS = {
    # cudnn_graph.h
    "pydnnStatus_t": {
        "PYDNN_STATUS_SUCCESS": 0,
        "PYDNN_STATUS_NOT_INITIALIZED": 1001,
        "PYDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH": 1002,
        "PYDNN_STATUS_SERIALIZATION_VERSION_MISMATCH": 1003,
        "PYDNN_STATUS_DEPRECATED": 1004,
        "PYDNN_STATUS_LICENSE_ERROR": 1005,
        "PYDNN_STATUS_RUNTIME_IN_PROGRESS": 1006,
        "PYDNN_STATUS_RUNTIME_FP_OVERFLOW": 1007,
        "PYDNN_STATUS_SUBLIBRARY_LOADING_FAILED": 1008,
        "PYDNN_STATUS_BAD_PARAM": 2000,
        "PYDNN_STATUS_BAD_PARAM_NULL_POINTER": 2002,
        "PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER": 2003,
        "PYDNN_STATUS_BAD_PARAM_NOT_FINALIZED": 2004,
        "PYDNN_STATUS_BAD_PARAM_OUT_OF_BOUND": 2005,
        "PYDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT": 2006,
        "PYDNN_STATUS_BAD_PARAM_STREAM_MISMATCH": 2007,
        "PYDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH": 2008,
        "PYDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES": 2009,
        "PYDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE": 2010,
        "PYDNN_STATUS_BAD_PARAM_CUDA_GRAPH_MISMATCH": 2011,
        "PYDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE": 2012,
        "PYDNN_STATUS_NOT_SUPPORTED": 3000,
        "PYDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN": 3001,
        "PYDNN_STATUS_NOT_SUPPORTED_SHAPE": 3002,
        "PYDNN_STATUS_NOT_SUPPORTED_DATA_TYPE": 3003,
        "PYDNN_STATUS_NOT_SUPPORTED_LAYOUT": 3004,
        "PYDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER": 3005,
        "PYDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDART": 3006,
        "PYDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH": 3007,
        "PYDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING": 3008,
        "PYDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE": 3009,
        "PYDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT": 3010,
        "PYDNN_STATUS_NOT_SUPPORTED_PADDING": 3011,
        "PYDNN_STATUS_NOT_SUPPORTED_BAD_LAUNCH_PARAM": 3012,
        "PYDNN_STATUS_NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API": 3013,
        "PYDNN_STATUS_INTERNAL_ERROR": 4000,
        "PYDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED": 4001,
        "PYDNN_STATUS_INTERNAL_ERROR_UNEXPECTED_VALUE": 4002,
        "PYDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED": 4003,
        "PYDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED": 4004,
        "PYDNN_STATUS_INTERNAL_ERROR_BAD_LAUNCH_PARAM": 4005,
        "PYDNN_STATUS_INTERNAL_ERROR_TEXTURE_CREATION_FAILED": 4006,
        "PYDNN_STATUS_EXECUTION_FAILED": 5000,
        "PYDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER": 5001,
        "PYDNN_STATUS_EXECUTION_FAILED_CUBLAS": 5002,
        "PYDNN_STATUS_EXECUTION_FAILED_CUDART": 5003,
        "PYDNN_STATUS_EXECUTION_FAILED_CURAND": 5004,
        "PYDNN_STATUS_ALLOC_FAILED": 4003,  # = PYDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED
        "PYDNN_STATUS_INVALID_VALUE": 2001,
        "PYDNN_STATUS_ARCH_MISMATCH": 3007,  # = PYDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH
        "PYDNN_STATUS_MAPPING_ERROR": 4006,  # = PYDNN_STATUS_INTERNAL_ERROR_TEXTURE_CREATION_FAILED
        "PYDNN_STATUS_RUNTIME_PREREQUISITE_MISSING": 3008,  # = PYDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING
        "PYDNN_STATUS_VERSION_MISMATCH": 1002,  # = PYDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH
    },
    # cudnn_graph.h
    "pydnnDataType_t": {
        "PYDNN_DATA_FLOAT": 0,
        "PYDNN_DATA_DOUBLE": 1,
        "PYDNN_DATA_HALF": 2,
        "PYDNN_DATA_INT8": 3,
        "PYDNN_DATA_INT32": 4,
        "PYDNN_DATA_INT8x4": 5,
        "PYDNN_DATA_UINT8": 6,
        "PYDNN_DATA_UINT8x4": 7,
        "PYDNN_DATA_INT8x32": 8,
        "PYDNN_DATA_BFLOAT16": 9,
        "PYDNN_DATA_INT64": 10,
        "PYDNN_DATA_BOOLEAN": 11,
        "PYDNN_DATA_FP8_E4M3": 12,
        "PYDNN_DATA_FP8_E5M2": 13,
        "PYDNN_DATA_FAST_FLOAT_FOR_FP8": 14,
    },
    # cudnn_graph.h
    "pydnnTensorFormat_t": {
        "PYDNN_TENSOR_NCHW": 0,
        "PYDNN_TENSOR_NHWC": 1,
        "PYDNN_TENSOR_NCHW_VECT_C": 2,
    },
    # cudnn_graph.h
    "pydnnMathType_t": {
        "PYDNN_DEFAULT_MATH": 0,
        "PYDNN_TENSOR_OP_MATH": 1,
        "PYDNN_TENSOR_OP_MATH_ALLOW_CONVERSION": 2,
        "PYDNN_FMA_MATH": 3,
    },
    # cudnn_graph.h
    "pydnnNanPropagation_t": {
        "PYDNN_NOT_PROPAGATE_NAN": 0,
        "PYDNN_PROPAGATE_NAN": 1,
    },
    # cudnn_ops.h
    "pydnnDeterminism_t": {
        "PYDNN_NON_DETERMINISTIC": 0,
        "PYDNN_DETERMINISTIC": 1,
    },
    # cudnn_ops.h
    "pydnnOpTensorOp_t": {
        "PYDNN_OP_TENSOR_ADD": 0,
        "PYDNN_OP_TENSOR_MUL": 1,
        "PYDNN_OP_TENSOR_MIN": 2,
        "PYDNN_OP_TENSOR_MAX": 3,
        "PYDNN_OP_TENSOR_SQRT": 4,
        "PYDNN_OP_TENSOR_NOT": 5,
    },
    # cudnn_graph.h
    "pydnnReduceTensorOp_t": {
        "PYDNN_REDUCE_TENSOR_ADD": 0,
        "PYDNN_REDUCE_TENSOR_MUL": 1,
        "PYDNN_REDUCE_TENSOR_MIN": 2,
        "PYDNN_REDUCE_TENSOR_MAX": 3,
        "PYDNN_REDUCE_TENSOR_AMAX": 4,
        "PYDNN_REDUCE_TENSOR_AVG": 5,
        "PYDNN_REDUCE_TENSOR_NORM1": 6,
        "PYDNN_REDUCE_TENSOR_NORM2": 7,
        "PYDNN_REDUCE_TENSOR_MUL_NO_ZEROS": 8,
    },
    # cudnn_ops.h
    "pydnnReduceTensorIndices_t": {
        "PYDNN_REDUCE_TENSOR_NO_INDICES": 0,
        "PYDNN_REDUCE_TENSOR_FLATTENED_INDICES": 1,
    },
    # cudnn_ops.h
    "pydnnIndicesType_t": {
        "PYDNN_32BIT_INDICES": 0,
        "PYDNN_64BIT_INDICES": 1,
        "PYDNN_16BIT_INDICES": 2,
        "PYDNN_8BIT_INDICES": 3,
    },
    # cudnn_graph.h
    "pydnnActivationMode_t": {
        "PYDNN_ACTIVATION_SIGMOID": 0,
        "PYDNN_ACTIVATION_RELU": 1,
        "PYDNN_ACTIVATION_TANH": 2,
        "PYDNN_ACTIVATION_CLIPPED_RELU": 3,
        "PYDNN_ACTIVATION_ELU": 4,
        "PYDNN_ACTIVATION_IDENTITY": 5,
        "PYDNN_ACTIVATION_SWISH": 6,
        # pydnn extensions
        "PYDNN_ACTIVATION_GELU_ERF": 1000,
        "PYDNN_ACTIVATION_GELU_TANH": 1001,
    },
    # pydnn extension (fused scaled dot-product attention, pydnn/ops/attention.py): which keys a query
    # row sees. TOP_LEFT: key j <= query i; BOTTOM_RIGHT: key j <= i + (kv length - q length).
    "pydnnAttentionMaskMode_t": {
        "PYDNN_ATTN_MASK_NONE": 0,
        "PYDNN_ATTN_MASK_CAUSAL_TOP_LEFT": 1,
        "PYDNN_ATTN_MASK_CAUSAL_BOTTOM_RIGHT": 2,
    },
    # cudnn_ops.h
    "pydnnSoftmaxAlgorithm_t": {
        "PYDNN_SOFTMAX_FAST": 0,
        "PYDNN_SOFTMAX_ACCURATE": 1,
        "PYDNN_SOFTMAX_LOG": 2,
    },
    # cudnn_ops.h
    "pydnnSoftmaxMode_t": {
        "PYDNN_SOFTMAX_MODE_INSTANCE": 0,
        "PYDNN_SOFTMAX_MODE_CHANNEL": 1,
    },
    # cudnn_ops.h
    "pydnnPoolingMode_t": {
        "PYDNN_POOLING_MAX": 0,
        "PYDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING": 1,
        "PYDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING": 2,
        "PYDNN_POOLING_MAX_DETERMINISTIC": 3,
    },
    # cudnn_ops.h
    "pydnnBatchNormMode_t": {
        "PYDNN_BATCHNORM_PER_ACTIVATION": 0,
        "PYDNN_BATCHNORM_SPATIAL": 1,
        "PYDNN_BATCHNORM_SPATIAL_PERSISTENT": 2,
    },
    # cudnn_ops.h
    "pydnnBatchNormOps_t": {
        "PYDNN_BATCHNORM_OPS_BN": 0,
        "PYDNN_BATCHNORM_OPS_BN_ACTIVATION": 1,
        "PYDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION": 2,
    },
    # cudnn_ops.h
    "pydnnNormMode_t": {
        "PYDNN_NORM_PER_ACTIVATION": 0,
        "PYDNN_NORM_PER_CHANNEL": 1,
    },
    # cudnn_ops.h
    "pydnnNormAlgo_t": {
        "PYDNN_NORM_ALGO_STANDARD": 0,
        "PYDNN_NORM_ALGO_PERSIST": 1,
    },
    # cudnn_ops.h
    "pydnnNormOps_t": {
        "PYDNN_NORM_OPS_NORM": 0,
        "PYDNN_NORM_OPS_NORM_ACTIVATION": 1,
        "PYDNN_NORM_OPS_NORM_ADD_ACTIVATION": 2,
    },
    # cudnn_graph.h
    "pydnnConvolutionMode_t": {
        "PYDNN_CONVOLUTION": 0,
        "PYDNN_CROSS_CORRELATION": 1,
    },
    # cudnn_ops.h
    "pydnnConvolutionFwdAlgo_t": {
        "PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM": 0,
        "PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM": 1,
        "PYDNN_CONVOLUTION_FWD_ALGO_GEMM": 2,
        "PYDNN_CONVOLUTION_FWD_ALGO_DIRECT": 3,
        "PYDNN_CONVOLUTION_FWD_ALGO_FFT": 4,
        "PYDNN_CONVOLUTION_FWD_ALGO_FFT_TILING": 5,
        "PYDNN_CONVOLUTION_FWD_ALGO_WINOGRAD": 6,
        "PYDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED": 7,
        "PYDNN_CONVOLUTION_FWD_ALGO_COUNT": 8,
    },
    # cudnn_ops.h
    "pydnnConvolutionBwdDataAlgo_t": {
        "PYDNN_CONVOLUTION_BWD_DATA_ALGO_0": 0,
        "PYDNN_CONVOLUTION_BWD_DATA_ALGO_1": 1,
        "PYDNN_CONVOLUTION_BWD_DATA_ALGO_FFT": 2,
        "PYDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING": 3,
        "PYDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD": 4,
        "PYDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED": 5,
        "PYDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT": 6,
    },
    # cudnn_ops.h
    "pydnnConvolutionBwdFilterAlgo_t": {
        "PYDNN_CONVOLUTION_BWD_FILTER_ALGO_0": 0,
        "PYDNN_CONVOLUTION_BWD_FILTER_ALGO_1": 1,
        "PYDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT": 2,
        "PYDNN_CONVOLUTION_BWD_FILTER_ALGO_3": 3,
        "PYDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD": 4,
        "PYDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED": 5,
        "PYDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING": 6,
        "PYDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT": 7,
    },
    # cudnn_adv.h
    "pydnnRNNMode_t": {
        "PYDNN_RNN_RELU": 0,
        "PYDNN_RNN_TANH": 1,
        "PYDNN_LSTM": 2,
        "PYDNN_GRU": 3,
    },
    # cudnn_adv.h
    "pydnnRNNBiasMode_t": {
        "PYDNN_RNN_NO_BIAS": 0,
        "PYDNN_RNN_SINGLE_INP_BIAS": 1,
        "PYDNN_RNN_DOUBLE_BIAS": 2,
        "PYDNN_RNN_SINGLE_REC_BIAS": 3,
    },
    # cudnn_adv.h
    "pydnnDirectionMode_t": {
        "PYDNN_UNIDIRECTIONAL": 0,
        "PYDNN_BIDIRECTIONAL": 1,
    },
    # cudnn_adv.h
    "pydnnRNNInputMode_t": {
        "PYDNN_LINEAR_INPUT": 0,
        "PYDNN_SKIP_INPUT": 1,
    },
    # cudnn_adv.h
    "pydnnRNNAlgo_t": {
        "PYDNN_RNN_ALGO_STANDARD": 0,
        "PYDNN_RNN_ALGO_PERSIST_STATIC": 1,
        "PYDNN_RNN_ALGO_PERSIST_DYNAMIC": 2,
        "PYDNN_RNN_ALGO_PERSIST_STATIC_SMALL_H": 3,
        "PYDNN_RNN_ALGO_COUNT": 4,
    },
    # cudnn_adv.h
    "pydnnRNNDataLayout_t": {
        "PYDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED": 0,
        "PYDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED": 1,
        "PYDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED": 2,
    },
    # cudnn_adv.h
    "pydnnForwardMode_t": {
        "PYDNN_FWD_MODE_INFERENCE": 0,
        "PYDNN_FWD_MODE_TRAINING": 1,
    },
    # cudnn_adv.h
    "pydnnSeqDataAxis_t": {
        "PYDNN_SEQDATA_TIME_DIM": 0,
        "PYDNN_SEQDATA_BATCH_DIM": 1,
        "PYDNN_SEQDATA_BEAM_DIM": 2,
        "PYDNN_SEQDATA_VECT_DIM": 3,
    },
    # cudnn_adv.h
    "pydnnMultiHeadAttnWeightKind_t": {
        "PYDNN_MH_ATTN_Q_WEIGHTS": 0,
        "PYDNN_MH_ATTN_K_WEIGHTS": 1,
        "PYDNN_MH_ATTN_V_WEIGHTS": 2,
        "PYDNN_MH_ATTN_O_WEIGHTS": 3,
        "PYDNN_MH_ATTN_Q_BIASES": 4,
        "PYDNN_MH_ATTN_K_BIASES": 5,
        "PYDNN_MH_ATTN_V_BIASES": 6,
        "PYDNN_MH_ATTN_O_BIASES": 7,
    },
    # cudnn_adv.h
    "pydnnRNNClipMode_t": {
        "PYDNN_RNN_CLIP_NONE": 0,
        "PYDNN_RNN_CLIP_MINMAX": 1,
    },
    # cudnn_adv.h
    "pydnnWgradMode_t": {
        "PYDNN_WGRAD_MODE_ADD": 0,
        "PYDNN_WGRAD_MODE_SET": 1,
    },
    # cudnn_ops.h
    "pydnnLRNMode_t": {
        "PYDNN_LRN_CROSS_CHANNEL_DIM1": 0,
    },
    # cudnn_ops.h
    "pydnnDivNormMode_t": {
        "PYDNN_DIVNORM_PRECOMPUTED_MEANS": 0,
    },
    # cudnn_graph.h
    "pydnnErrQueryMode_t": {
        "PYDNN_ERRQUERY_RAWCODE": 0,
        "PYDNN_ERRQUERY_NONBLOCKING": 1,
        "PYDNN_ERRQUERY_BLOCKING": 2,
    },
    # cudnn_graph.h
    "pydnnSeverity_t": {
        "PYDNN_SEV_FATAL": 0,
        "PYDNN_SEV_ERROR": 1,
        "PYDNN_SEV_WARNING": 2,
        "PYDNN_SEV_INFO": 3,
    },
    # cudnn_ops.h
    "pydnnCTCLossAlgo_t": {
        "PYDNN_CTC_LOSS_ALGO_DETERMINISTIC": 0,
        "PYDNN_CTC_LOSS_ALGO_NON_DETERMINISTIC": 1,
    },
    # cudnn_adv.h
    "pydnnLossNormalizationMode_t": {
        "PYDNN_LOSS_NORMALIZATION_NONE": 0,
        "PYDNN_LOSS_NORMALIZATION_SOFTMAX": 1,
    },
    # cudnn_ops.h
    "pydnnSamplerType_t": {
        "PYDNN_SAMPLER_BILINEAR": 0,
    },
    # pydnn extension (pydnn/ops/normalization.py): what pydnnSetNormDescriptor normalizes over
    "pydnnNormKind_t": {
        "PYDNN_NORM_KIND_LAYER": 0,
        "PYDNN_NORM_KIND_GROUP": 1,
        "PYDNN_NORM_KIND_INSTANCE": 2,
        "PYDNN_NORM_KIND_RMS": 3,
    },
    # library_types.h (CUDA): the argument type of pydnnGetProperty
    "pydnnLibraryPropertyType_t": {
        "PYDNN_MAJOR_VERSION": 0,
        "PYDNN_MINOR_VERSION": 1,
        "PYDNN_PATCH_LEVEL": 2,
    },
}

# Names that the headers define as another member of the same enum (deprecated cuDNN 8 spellings).
ALIASES = {
    "PYDNN_STATUS_ALLOC_FAILED",
    "PYDNN_STATUS_ARCH_MISMATCH",
    "PYDNN_STATUS_MAPPING_ERROR",
    "PYDNN_STATUS_RUNTIME_PREREQUISITE_MISSING",
    "PYDNN_STATUS_VERSION_MISMATCH",
}

# Plain #define constants (the version macros are left out).
DEFINES = {
    # cudnn_graph.h
    "PYDNN_SEV_ERROR_EN": 2,
    "PYDNN_SEV_WARNING_EN": 4,
    "PYDNN_SEV_INFO_EN": 8,
    "PYDNN_DIM_MAX": 8,
    # cudnn_ops.h
    "PYDNN_LRN_MIN_N": 1,
    "PYDNN_LRN_MAX_N": 16,
    "PYDNN_LRN_MIN_K": 1e-05,
    "PYDNN_LRN_MIN_BETA": 0.01,
    "PYDNN_BN_MIN_EPSILON": 0.0,
    # cudnn_adv.h
    "PYDNN_RNN_PADDED_IO_DISABLED": 0,
    "PYDNN_RNN_PADDED_IO_ENABLED": 1,
    "PYDNN_SEQDATA_DIM_COUNT": 4,
    "PYDNN_ATTN_QUERYMAP_ALL_TO_ONE": 0,
    "PYDNN_ATTN_QUERYMAP_ONE_TO_ONE": 1,
    "PYDNN_ATTN_DISABLE_PROJ_BIASES": 0,
    "PYDNN_ATTN_ENABLE_PROJ_BIASES": 2,
    "PYDNN_ATTN_WKIND_COUNT": 8,
}

# Export every constant as a module attribute
globals().update({k: v for members in ENUMS.values() for k, v in members.items()})
globals().update(DEFINES)


def _check():
    """Cheap import-time sanity check: inside one enum, a repeated value is allowed only for an ALIASES name."""
    seen_names = set()
    for ctype, members in ENUMS.items():
        by_value = {}
        for name, value in members.items():
            if name in seen_names or name in DEFINES:
                raise AssertionError(f"{ctype}: {name} is defined twice")
            seen_names.add(name)
            if value in by_value and name not in ALIASES:
                raise AssertionError(f"{ctype}: {name} = {value} repeats {by_value[value]} but is not in ALIASES")
            by_value.setdefault(value, name)
    for name in ALIASES:
        if name not in seen_names:
            raise AssertionError(f"ALIASES names {name}, which no enum defines")


_check()
