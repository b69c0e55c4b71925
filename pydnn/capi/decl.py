"""The C API, declared once. include/pydnn.h, the cffi embedding library (libpydnn) and its argument
marshalling are all generated from FUNCTIONS below and from pydnn.enums.

Each entry is (C prototype, one-line description). Argument names follow cuDNN 9; the marshalling in
pydnn/capi/impl.py reads their types: descriptors and handles are opaque pointers, `T *name` is an output
(except `const`), `const int name[]` is an input array whose length is the preceding count argument,
`const void *alpha|beta|...` is a host scalar read as double for a DOUBLE output tensor and as float
otherwise, other `void *` are device pointers.
"""
import importlib

from .. import enums
from .._build.manifest import FAMILIES

# Op families added after the foundation declare their C API beside their Python code: the module has
#   C_API = [(family title, [(prototype, description), ...])]   in header order
#   C_OPAQUE_TYPES = [(typedef name, struct name), ...]        new descriptor types
#   C_NULLABLE = {C function name: (descriptor argument names that may be NULL), ...}
#   C_STRUCTS = [(typedef name, [C field declaration, ...])]   result records (see STRUCTS)
# The foundation's families are declared in this file; FUNCTIONS / OPAQUE_TYPES / NULLABLE / STRUCTS below
# take them from every family module of the kernel manifest that has them, in the manifest's order.

OPAQUE_TYPES = [
    ("pydnnHandle_t", "pydnnContext"),
    ("pydnnTensorDescriptor_t", "pydnnTensorStruct"),
    ("pydnnFilterDescriptor_t", "pydnnFilterStruct"),
    ("pydnnActivationDescriptor_t", "pydnnActivationStruct"),
    ("pydnnOpTensorDescriptor_t", "pydnnOpTensorStruct"),
    ("pydnnReduceTensorDescriptor_t", "pydnnReduceTensorStruct"),
]

# (family, [(prototype, description), ...]) in header order
FUNCTIONS = [
    ("Versions, errors and the handle", [
        ("size_t pydnnGetVersion(void);", "pydnn's version as MAJOR*10000 + MINOR*100 + PATCH."),
        ("size_t pydnnGetCudartVersion(void);", "CUDA driver API version in use (1000*major + 10*minor), 0 without a driver."),
        ("pydnnStatus_t pydnnGetProperty(pydnnLibraryPropertyType_t type, int *value);", "MAJOR_VERSION, MINOR_VERSION or PATCH_LEVEL."),
        ("const char *pydnnGetErrorString(pydnnStatus_t status);", "The name of a status (a static string)."),
        ("void pydnnGetLastErrorString(char *message, size_t max_size);", "This thread's last error message: at most max_size - 1 characters and a NUL."),
        ("pydnnStatus_t pydnnCreate(pydnnHandle_t *handle);", "A handle on the current device; NOT_INITIALIZED without a GPU or driver."),
        ("pydnnStatus_t pydnnDestroy(pydnnHandle_t handle);", "Release a handle."),
        ("pydnnStatus_t pydnnSetStream(pydnnHandle_t handle, cudaStream_t streamId);", "Later calls on the handle enqueue on streamId."),
        ("pydnnStatus_t pydnnGetStream(pydnnHandle_t handle, cudaStream_t *streamId);", "The handle's stream."),
    ]),
    ("Tensor descriptors", [
        ("pydnnStatus_t pydnnCreateTensorDescriptor(pydnnTensorDescriptor_t *tensorDesc);", "A new tensor descriptor, unset until a Set call."),
        ("pydnnStatus_t pydnnSetTensor4dDescriptor(pydnnTensorDescriptor_t tensorDesc, pydnnTensorFormat_t format, pydnnDataType_t dataType, int n, int c, int h, int w);", "Packed NCHW or NHWC."),
        ("pydnnStatus_t pydnnSetTensor4dDescriptorEx(pydnnTensorDescriptor_t tensorDesc, pydnnDataType_t dataType, int n, int c, int h, int w, int nStride, int cStride, int hStride, int wStride);", "Explicit strides."),
        ("pydnnStatus_t pydnnSetTensorNdDescriptor(pydnnTensorDescriptor_t tensorDesc, pydnnDataType_t dataType, int nbDims, const int dimA[], const int strideA[]);", "1 to 8 dims, explicit strides."),
        ("pydnnStatus_t pydnnSetTensorNdDescriptorEx(pydnnTensorDescriptor_t tensorDesc, pydnnTensorFormat_t format, pydnnDataType_t dataType, int nbDims, const int dimA[]);", "Packed strides from a format."),
        ("pydnnStatus_t pydnnGetTensor4dDescriptor(const pydnnTensorDescriptor_t tensorDesc, pydnnDataType_t *dataType, int *n, int *c, int *h, int *w, int *nStride, int *cStride, int *hStride, int *wStride);", "Data type, dims and strides of a 4-d descriptor."),
        ("pydnnStatus_t pydnnGetTensorNdDescriptor(const pydnnTensorDescriptor_t tensorDesc, int nbDimsRequested, pydnnDataType_t *dataType, int *nbDims, int dimA[], int strideA[]);", "Data type, dim count, and the first nbDimsRequested dims and strides."),
        ("pydnnStatus_t pydnnGetTensorSizeInBytes(const pydnnTensorDescriptor_t tensorDesc, size_t *size);", "Bytes spanned by the tensor's elements."),
        ("pydnnStatus_t pydnnDestroyTensorDescriptor(pydnnTensorDescriptor_t tensorDesc);", "Release a tensor descriptor (NULL: nothing to do)."),
    ]),
    ("Filter descriptors", [
        ("pydnnStatus_t pydnnCreateFilterDescriptor(pydnnFilterDescriptor_t *filterDesc);", "A new filter descriptor, unset until a Set call."),
        ("pydnnStatus_t pydnnSetFilter4dDescriptor(pydnnFilterDescriptor_t filterDesc, pydnnDataType_t dataType, pydnnTensorFormat_t format, int k, int c, int h, int w);", "K, C, H, W filter dims in NCHW or NHWC layout."),
        ("pydnnStatus_t pydnnSetFilterNdDescriptor(pydnnFilterDescriptor_t filterDesc, pydnnDataType_t dataType, pydnnTensorFormat_t format, int nbDims, const int filterDimA[]);", "Filter dims K, C, spatial... in NCHW or NHWC layout."),
        ("pydnnStatus_t pydnnGetFilter4dDescriptor(const pydnnFilterDescriptor_t filterDesc, pydnnDataType_t *dataType, pydnnTensorFormat_t *format, int *k, int *c, int *h, int *w);", "Data type, format and dims of a 4-d filter."),
        ("pydnnStatus_t pydnnGetFilterNdDescriptor(const pydnnFilterDescriptor_t filterDesc, int nbDimsRequested, pydnnDataType_t *dataType, pydnnTensorFormat_t *format, int *nbDims, int filterDimA[]);", "Data type, format, dim count and the first nbDimsRequested dims."),
        ("pydnnStatus_t pydnnGetFilterSizeInBytes(const pydnnFilterDescriptor_t filterDesc, size_t *size);", "Bytes of the filter's elements."),
        ("pydnnStatus_t pydnnDestroyFilterDescriptor(pydnnFilterDescriptor_t filterDesc);", "Release a filter descriptor (NULL: nothing to do)."),
    ]),
    ("Tensor ops", [
        ("pydnnStatus_t pydnnSetTensor(pydnnHandle_t handle, const pydnnTensorDescriptor_t yDesc, void *y, const void *valuePtr);", "Every element of y = *valuePtr (a value of y's data type)."),
        ("pydnnStatus_t pydnnScaleTensor(pydnnHandle_t handle, const pydnnTensorDescriptor_t yDesc, void *y, const void *alpha);", "y = alpha * y."),
        ("pydnnStatus_t pydnnAddTensor(pydnnHandle_t handle, const void *alpha, const pydnnTensorDescriptor_t aDesc, const void *A, const void *beta, const pydnnTensorDescriptor_t cDesc, void *C);", "C = alpha * A + beta * C; A's dims equal C's or are 1."),
        ("pydnnStatus_t pydnnCreateOpTensorDescriptor(pydnnOpTensorDescriptor_t *opTensorDesc);", "A new op-tensor descriptor, unset until pydnnSetOpTensorDescriptor."),
        ("pydnnStatus_t pydnnSetOpTensorDescriptor(pydnnOpTensorDescriptor_t opTensorDesc, pydnnOpTensorOp_t opTensorOp, pydnnDataType_t opTensorCompType, pydnnNanPropagation_t opTensorNanOpt);", "Operation (ADD, MUL, MIN, MAX, SQRT, NOT), compute type (FLOAT or DOUBLE), NaN option."),
        ("pydnnStatus_t pydnnGetOpTensorDescriptor(const pydnnOpTensorDescriptor_t opTensorDesc, pydnnOpTensorOp_t *opTensorOp, pydnnDataType_t *opTensorCompType, pydnnNanPropagation_t *opTensorNanOpt);", "The op-tensor descriptor's operation, compute type and NaN option."),
        ("pydnnStatus_t pydnnDestroyOpTensorDescriptor(pydnnOpTensorDescriptor_t opTensorDesc);", "Release an op-tensor descriptor (NULL: nothing to do)."),
        ("pydnnStatus_t pydnnOpTensor(pydnnHandle_t handle, const pydnnOpTensorDescriptor_t opTensorDesc, const void *alpha1, const pydnnTensorDescriptor_t aDesc, const void *A, const void *alpha2, const pydnnTensorDescriptor_t bDesc, const void *B, const void *beta, const pydnnTensorDescriptor_t cDesc, void *C);", "C = op(alpha1 * A, alpha2 * B) + beta * C; B's dims equal C's or are 1."),
        ("pydnnStatus_t pydnnTransformTensor(pydnnHandle_t handle, const void *alpha, const pydnnTensorDescriptor_t xDesc, const void *x, const void *beta, const pydnnTensorDescriptor_t yDesc, void *y);", "y = alpha * x + beta * y across any strides and data types."),
    ]),
    ("Reductions", [
        ("pydnnStatus_t pydnnCreateReduceTensorDescriptor(pydnnReduceTensorDescriptor_t *reduceTensorDesc);", "A new reduce-tensor descriptor, unset until pydnnSetReduceTensorDescriptor."),
        ("pydnnStatus_t pydnnSetReduceTensorDescriptor(pydnnReduceTensorDescriptor_t reduceTensorDesc, pydnnReduceTensorOp_t reduceTensorOp, pydnnDataType_t reduceTensorCompType, pydnnNanPropagation_t reduceTensorNanOpt, pydnnReduceTensorIndices_t reduceTensorIndices, pydnnIndicesType_t reduceTensorIndicesType);", "Reduction, compute type (FLOAT or DOUBLE), NaN option, whether to write indices and their type."),
        ("pydnnStatus_t pydnnGetReduceTensorDescriptor(const pydnnReduceTensorDescriptor_t reduceTensorDesc, pydnnReduceTensorOp_t *reduceTensorOp, pydnnDataType_t *reduceTensorCompType, pydnnNanPropagation_t *reduceTensorNanOpt, pydnnReduceTensorIndices_t *reduceTensorIndices, pydnnIndicesType_t *reduceTensorIndicesType);", "The reduce-tensor descriptor's settings."),
        ("pydnnStatus_t pydnnDestroyReduceTensorDescriptor(pydnnReduceTensorDescriptor_t reduceTensorDesc);", "Release a reduce-tensor descriptor (NULL: nothing to do)."),
        ("pydnnStatus_t pydnnGetReductionIndicesSize(pydnnHandle_t handle, const pydnnReduceTensorDescriptor_t reduceTensorDesc, const pydnnTensorDescriptor_t aDesc, const pydnnTensorDescriptor_t cDesc, size_t *sizeInBytes);", "Bytes of int32 indices (MIN/MAX/AMAX with FLATTENED_INDICES), else 0."),
        ("pydnnStatus_t pydnnGetReductionWorkspaceSize(pydnnHandle_t handle, const pydnnReduceTensorDescriptor_t reduceTensorDesc, const pydnnTensorDescriptor_t aDesc, const pydnnTensorDescriptor_t cDesc, size_t *sizeInBytes);", "Bytes of device workspace pydnnReduceTensor needs for these tensors."),
        ("pydnnStatus_t pydnnReduceTensor(pydnnHandle_t handle, const pydnnReduceTensorDescriptor_t reduceTensorDesc, void *indices, size_t indicesSizeInBytes, void *workspace, size_t workspaceSizeInBytes, const void *alpha, const pydnnTensorDescriptor_t aDesc, const void *A, const void *beta, const pydnnTensorDescriptor_t cDesc, void *C);", "C = alpha * reduce(A) + beta * C over the dims where C is 1."),
    ]),
    ("Activations (GELU modes are pydnn extensions)", [
        ("pydnnStatus_t pydnnCreateActivationDescriptor(pydnnActivationDescriptor_t *activationDesc);", "A new activation descriptor, unset until pydnnSetActivationDescriptor."),
        ("pydnnStatus_t pydnnSetActivationDescriptor(pydnnActivationDescriptor_t activationDesc, pydnnActivationMode_t mode, pydnnNanPropagation_t reluNanOpt, double coef);", "coef: clipped-ReLU ceiling or ELU alpha."),
        ("pydnnStatus_t pydnnGetActivationDescriptor(const pydnnActivationDescriptor_t activationDesc, pydnnActivationMode_t *mode, pydnnNanPropagation_t *reluNanOpt, double *coef);", "The activation descriptor's mode, NaN option and coef."),
        ("pydnnStatus_t pydnnSetActivationDescriptorSwishBeta(pydnnActivationDescriptor_t activationDesc, double swish_beta);", "beta of SWISH: f(x) = x * sigmoid(beta * x)."),
        ("pydnnStatus_t pydnnGetActivationDescriptorSwishBeta(pydnnActivationDescriptor_t activationDesc, double *swish_beta);", "The SWISH beta."),
        ("pydnnStatus_t pydnnDestroyActivationDescriptor(pydnnActivationDescriptor_t activationDesc);", "Release an activation descriptor (NULL: nothing to do)."),
        ("pydnnStatus_t pydnnActivationForward(pydnnHandle_t handle, pydnnActivationDescriptor_t activationDesc, const void *alpha, const pydnnTensorDescriptor_t xDesc, const void *x, const void *beta, const pydnnTensorDescriptor_t yDesc, void *y);", "y = alpha * f(x) + beta * y."),
        ("pydnnStatus_t pydnnActivationBackward(pydnnHandle_t handle, pydnnActivationDescriptor_t activationDesc, const void *alpha, const pydnnTensorDescriptor_t yDesc, const void *y, const pydnnTensorDescriptor_t dyDesc, const void *dy, const pydnnTensorDescriptor_t xDesc, const void *x, const void *beta, const pydnnTensorDescriptor_t dxDesc, void *dx);", "dx = alpha * f'(x) * dy + beta * dx."),
    ]),
    ("Softmax", [
        ("pydnnStatus_t pydnnSoftmaxForward(pydnnHandle_t handle, pydnnSoftmaxAlgorithm_t algo, pydnnSoftmaxMode_t mode, const void *alpha, const pydnnTensorDescriptor_t xDesc, const void *x, const void *beta, const pydnnTensorDescriptor_t yDesc, void *y);", "y = alpha * softmax(x) + beta * y (log-softmax for PYDNN_SOFTMAX_LOG)."),
        ("pydnnStatus_t pydnnSoftmaxBackward(pydnnHandle_t handle, pydnnSoftmaxAlgorithm_t algo, pydnnSoftmaxMode_t mode, const void *alpha, const pydnnTensorDescriptor_t yDesc, const void *y, const pydnnTensorDescriptor_t dyDesc, const void *dy, const void *beta, const pydnnTensorDescriptor_t dxDesc, void *dx);", "dx = alpha * y * (dy - sum(dy * y)) + beta * dx (LOG: dy - exp(y) * sum(dy))."),
    ]),
]


# descriptor arguments that may be NULL (the Python function then takes None)
NULLABLE = {"pydnnOpTensor": ("bDesc",)}

# plain C structs a family returns through out-pointers (cuDNN's perf results): a module's
#   C_STRUCTS = [(typedef name, [C field declaration, ...]), ...]
# impl.py fills `T *name` arguments of these types as arrays (see Marshal).
STRUCTS = []

for _mod in map(importlib.import_module, FAMILIES):
    OPAQUE_TYPES += getattr(_mod, "C_OPAQUE_TYPES", [])
    STRUCTS += getattr(_mod, "C_STRUCTS", [])
    FUNCTIONS += getattr(_mod, "C_API", [])
    NULLABLE.update(getattr(_mod, "C_NULLABLE", {}))

# ---- graph API family (issue 22, pydnn/graph/): the public matmul and cuDNN's backend API ----
FUNCTIONS += [
    ("Matmul (pydnn extension)", [
        ("pydnnStatus_t pydnnMatmul(pydnnHandle_t handle, const void *alpha, const pydnnTensorDescriptor_t aDesc, const void *A, const pydnnTensorDescriptor_t bDesc, const void *B, const void *beta, const pydnnTensorDescriptor_t cDesc, void *C);",
         "C = alpha * A @ B + beta * C: 2-d or 3-d (batched; A's or B's batch 1 broadcasts), transposes through strides; FLOAT (exact), HALF, BFLOAT16 (float accumulation)."),
        ("pydnnStatus_t pydnnGetMatmulExWorkspaceSize(pydnnHandle_t handle, const pydnnTensorDescriptor_t aDesc, const pydnnTensorDescriptor_t bDesc, const pydnnTensorDescriptor_t cDesc, size_t *sizeInBytes);",
         "The workspace bytes MatmulEx uses to split K over the SMs (few output tiles, a long K: a weight gradient); 0: none."),
        ("pydnnStatus_t pydnnMatmulEx(pydnnHandle_t handle, const void *alpha, const pydnnTensorDescriptor_t aDesc, const void *A, const pydnnTensorDescriptor_t bDesc, const void *B, const void *beta, const pydnnTensorDescriptor_t cDesc, void *C, void *workSpace, size_t workSpaceSizeInBytes);",
         "Matmul with a workspace: with GetMatmulExWorkspaceSize bytes K is split (fp32 partials summed in a fixed order); with less, one whole-K launch."),
    ]),
    ("Graph API: backend descriptors, operation graphs and execution plans (cuDNN 9's backend API)", [
        ("pydnnStatus_t pydnnBackendCreateDescriptor(pydnnBackendDescriptorType_t descriptorType, pydnnBackendDescriptor_t *descriptor);",
         "A new, empty descriptor: TENSOR, POINTWISE, OPERATION_POINTWISE, MATMUL, OPERATION_MATMUL, REDUCTION, OPERATION_REDUCTION, OPERATIONGRAPH, ENGINEHEUR, ENGINE, ENGINECFG, KNOB_CHOICE, EXECUTION_PLAN, VARIANT_PACK."),
        ("pydnnStatus_t pydnnBackendDestroyDescriptor(pydnnBackendDescriptor_t descriptor);",
         "Release a backend descriptor."),
        ("pydnnStatus_t pydnnBackendSetAttribute(pydnnBackendDescriptor_t descriptor, pydnnBackendAttributeName_t attributeName, pydnnBackendAttributeType_t attributeType, long long elementCount, const void *arrayOfElements);",
         "Set elementCount elements of attributeType (host array; descriptor handles for PYDNN_TYPE_BACKEND_DESCRIPTOR); BAD_PARAM for a wrong attribute, type, count or value, or a finalized descriptor."),
        ("pydnnStatus_t pydnnBackendGetAttribute(const pydnnBackendDescriptor_t descriptor, pydnnBackendAttributeName_t attributeName, pydnnBackendAttributeType_t attributeType, long long requestedElementCount, long long *elementCount, void *arrayOfElements);",
         "The attribute's element count, and its first requestedElementCount elements written to arrayOfElements (descriptors: copied into the caller's new ones)."),
        ("pydnnStatus_t pydnnBackendFinalize(pydnnBackendDescriptor_t descriptor);",
         "Validate and freeze a descriptor (an EXECUTION_PLAN compiles its kernels here); NOT_SUPPORTED with the reason when no engine runs the graph."),
        ("pydnnStatus_t pydnnBackendExecute(pydnnHandle_t handle, pydnnBackendDescriptor_t executionPlan, pydnnBackendDescriptor_t variantPack);",
         "Run a finalized execution plan on the device pointers and workspace of a finalized variant pack, on the handle's stream."),
    ]),
]
OPAQUE_TYPES += [("pydnnBackendDescriptor_t", "pydnnBackendDescriptorStruct")]
# ---- end of the graph API family ----

# ---- attention forward family (attnf, issue 19; pydnn/ops/attention.py): paged K / V ----
_TD = "pydnnTensorDescriptor_t"
FUNCTIONS += [("Fused attention with paged K / V (pydnn extension)", [
    ("pydnnStatus_t pydnnGetAttentionForwardPagedWorkspaceSize(pydnnHandle_t handle, const pydnnAttentionDescriptor_t "
     f"attnDesc, const {_TD} qDesc, const {_TD} kDesc, const {_TD} pageTableKDesc, int maxSeqLenKV, size_t *sizeInBytes);",
     "Workspace bytes pydnnAttentionForwardPaged needs (the split-KV decode kernel's partial results, else 0)."),
    ("pydnnStatus_t pydnnAttentionForwardPaged(pydnnHandle_t handle, const pydnnAttentionDescriptor_t attnDesc, "
     f"const {_TD} qDesc, const void *q, const {_TD} kDesc, const void *k, const {_TD} vDesc, const void *v, "
     f"const {_TD} pageTableKDesc, const void *pageTableK, const {_TD} pageTableVDesc, const void *pageTableV, "
     f"int maxSeqLenKV, const {_TD} oDesc, void *o, const {_TD} statsDesc, void *stats, const void *seqLensQ, "
     "const void *seqLensKV, void *workSpace, size_t workSpaceSizeInBytes);",
     "The forward with K / V in page pools (pages, numHeadsKV, pageSize, headDim) read through INT32 page tables "
     "(B, 1, maxPages, 1); seqLensKV required; maxSeqLenKV 0: maxPages * pageSize."),
])]
NULLABLE["pydnnAttentionForwardPaged"] = ("statsDesc",)
# ---- end of the attention forward family ----


# Function-like macros of the header (cuDNN 9's status arithmetic: a status is category + specific error,
# so PYDNN_STATUS_CATEGORY(PYDNN_STATUS_BAD_PARAM_NULL_POINTER) == PYDNN_STATUS_BAD_PARAM). Header only:
# cffi's cdef takes no function-like macros and the library needs none.
MACROS = [
    ("PYDNN_STATUS_CATEGORY(full_error_code)", "((full_error_code) / 1000 * 1000)"),
    ("PYDNN_STATUS_SPECIFIC_ERROR(full_error_code)", "((full_error_code) % 1000)"),
    ("PYDNN_STATUS_FULL_ERROR_CODE(category, specific_err)", "((pydnnStatus_t)(0 + (category) + (specific_err)))"),
]


def enum_block():
    out = []
    for ctype, members in enums.ENUMS.items():
        body = ",\n".join(f"    {name} = {value}" for name, value in members.items())
        out.append(f"typedef enum {{\n{body}\n}} {ctype};")
    return "\n\n".join(out)


def define_block():
    return "\n".join(f"#define {k} {v!r}" if isinstance(v, float) else f"#define {k} {v}"
                     for k, v in enums.DEFINES.items())


def types_block():
    """Every type the prototypes use (no #defines: cffi's cdef takes those separately)."""
    opaque = "\n".join(f"typedef struct {s} *{t};" for t, s in OPAQUE_TYPES)
    return enum_block() + "\n\n" + opaque + "\ntypedef struct CUstream_st *cudaStream_t;\n" + struct_block()


def struct_block():
    return "\n".join("typedef struct {\n" + "".join(f"    {f};\n" for f in fields) + f"}} {name};"
                     for name, fields in STRUCTS)


def prototypes():
    return [proto for _, entries in FUNCTIONS for proto, _ in entries]


def header_text():
    from .. import __version__

    major, minor, patch = __version__.split(".")
    lines = [
        "/* pydnn.h: the C API of pydnn. Generated by tools/gen_header.py from pydnn/capi/decl.py and",
        " * pydnn/enums.py; do not edit. Link with the flags `python -m pydnn config --cflags --libs` prints. */",
        "#ifndef PYDNN_H",
        "#define PYDNN_H",
        "",
        "#include <stddef.h>",
        "",
        "#ifdef __cplusplus",
        'extern "C" {',
        "#endif",
        "",
        f"#define PYDNN_MAJOR {major}",
        f"#define PYDNN_MINOR {minor}",
        f"#define PYDNN_PATCHLEVEL {patch}",
        "#define PYDNN_VERSION (PYDNN_MAJOR * 10000 + PYDNN_MINOR * 100 + PYDNN_PATCHLEVEL)",
        define_block(),
        "",
        enum_block(),
        "",
        "/* status categories: a status is its category (BAD_PARAM, NOT_SUPPORTED, ...) plus a specific error */",
        *[f"#define {name} {body}" for name, body in MACROS],
        "",
        "/* opaque objects */",
        *[f"typedef struct {s} *{t};" for t, s in OPAQUE_TYPES],
        "",
        "/* a CUDA stream (the same type as the CUDA runtime's cudaStream_t / the driver's CUstream) */",
        "#ifndef __DRIVER_TYPES_H__",
        "typedef struct CUstream_st *cudaStream_t;",
        "#endif",
    ]
    if STRUCTS:
        lines += ["", "/* result records */", struct_block()]
    for family, entries in FUNCTIONS:
        lines += ["", f"/* ---- {family} ---- */"]
        for proto, doc in entries:
            if doc:
                lines.append(f"/* {doc} */")
            lines.append(proto)
    lines += ["", "#ifdef __cplusplus", "}", "#endif", "", "#endif /* PYDNN_H */", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------- cuDNN source compatibility
# include/cudnn_compat/cudnn.h maps cuDNN's names onto pydnn's, so that a program written against cuDNN's
# legacy API builds unchanged with `$(python -m pydnn config --cudnn-compat --cflags --libs)`: every type
# (cudnnX_t -> pydnnX_t), constant (CUDNN_X -> PYDNN_X) and function (cudnnX -> pydnnX) that pydnn has.
# A cuDNN function pydnn lacks stays undeclared, so such a program fails to compile instead of misbehaving.
CUDNN_API_VERSION = (9, 0, 0)  # the cuDNN API level pydnn's names and enum values follow


def _cudnn(name):
    if name.startswith("pydnn"):
        return "cudnn" + name[len("pydnn"):]
    assert name.startswith("PYDNN_"), name
    return "CUDNN_" + name[len("PYDNN_"):]


def compat_header_text():
    major, minor, patch = CUDNN_API_VERSION
    own = {"PYDNN_MAJOR", "PYDNN_MINOR", "PYDNN_PATCHLEVEL", "PYDNN_VERSION"}
    lines = [
        "/* cudnn.h for pydnn: cuDNN's legacy API names mapped onto pydnn's (types, constants, functions), so",
        " * that a C or C++ program written against cuDNN builds unchanged with",
        " *     cc prog.c $(python -m pydnn config --cudnn-compat --cflags --libs)",
        " * Generated by tools/gen_header.py from pydnn/capi/decl.py and pydnn/enums.py; do not edit.",
        " * CUDNN_MAJOR/MINOR/VERSION give the cuDNN API level pydnn follows (enum values, argument order);",
        " * cudnnGetVersion() returns pydnn's own version (PYDNN_VERSION). A cuDNN function pydnn lacks is not",
        " * declared: a program using one fails to compile rather than to run. */",
        "#ifndef CUDNN_H_",
        "#define CUDNN_H_",
        "",
        "#include <pydnn.h>",
        "",
        f"#define CUDNN_MAJOR {major}",
        f"#define CUDNN_MINOR {minor}",
        f"#define CUDNN_PATCHLEVEL {patch}",
        "#define CUDNN_VERSION (CUDNN_MAJOR * 10000 + CUDNN_MINOR * 100 + CUDNN_PATCHLEVEL)",
        "",
        "/* constants */",
        *[f"#define {_cudnn(k)} {k}" for k in enums.DEFINES if k not in own],
        "",
        "/* types */",
        *[f"typedef {t} {_cudnn(t)};" for t in enums.ENUMS],
        *[f"typedef {t} {_cudnn(t)};" for t, _ in OPAQUE_TYPES],
        *[f"typedef {t} {_cudnn(t)};" for t, _ in STRUCTS],
        "",
        "/* enum values */",
    ]
    for members in enums.ENUMS.values():
        lines += [f"#define {_cudnn(m)} {m}" for m in members]
    lines += ["", "/* status categories */"]
    for name, _ in MACROS:
        fn, args = name.split("(", 1)
        lines.append(f"#define {_cudnn(fn)}({args} {fn}({args}")
    lines += ["", "/* functions */"]
    for proto in prototypes():
        name = proto.split("(", 1)[0].split()[-1].lstrip("*")
        lines.append(f"#define {_cudnn(name)} {name}")
    lines += ["", "#endif /* CUDNN_H_ */", ""]
    return "\n".join(lines)
