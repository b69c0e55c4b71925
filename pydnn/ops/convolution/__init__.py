"""Convolution (cudnnConvolution*). The package's modules import in one direction only:

    problem      the descriptor, output dims, the validated Problem, kernel parameter structs, enums,
                 the tensor-core operand rules            (imports no sibling)
    plans        Plan / StepPlan, running a plan, the {(direction, algo): planners} table, the plan cache
    implicit, tensor_core, wgrad_wgmma, gemm, winograd, fft
                 one module per algorithm: its planners (registered in plans' table) and kernel units;
                 each imports only problem and plans
    algorithms   Get..._v7 (the heuristic ranking) and Find...Ex (timing, the tuning cache)
    find         Find without Ex (buffers of its own)
    api          the public calls and their C declarations
"""
from .api import *  # noqa: F401,F403
from .api import C_API, C_NULLABLE, C_OPAQUE_TYPES, C_STRUCTS, __all__  # noqa: F401
from .plans import kernel_units  # noqa: F401 - the build's entry (pydnn._build.manifest.FAMILIES)
