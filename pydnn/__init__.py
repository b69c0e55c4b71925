"""pydnn: open GPU deep-learning primitives with cuDNN's handle / descriptor / workspace / stream API.

Every cuDNN function `cudnnX` is `pydnn.<snake_case of X>` here and `pydnnX` in C (include/pydnn.h);
every constant is a module attribute under its C name (PYDNN_DATA_FLOAT, ...). Outputs are returned,
failures raise PydnnError carrying the status. Importing pydnn never compiles a kernel or touches a GPU.
"""
from .enums import *  # noqa: F401,F403 - every C constant, under its C name
from .enums import DEFINES, ENUMS
from . import _log  # noqa: F401 - configures the "pydnn" logger from PYDNN_LOG*
from .status import PydnnError, get_error_string, get_last_error_string
from .version import __version__, get_cudart_version, get_property, get_version
from .handle import create, destroy, get_stream, set_stream
from .tensor import (
    create_filter_descriptor, create_tensor_descriptor, destroy_filter_descriptor, destroy_tensor_descriptor,
    get_filter4d_descriptor, get_filter_nd_descriptor, get_filter_size_in_bytes, get_tensor4d_descriptor,
    get_tensor_nd_descriptor, get_tensor_size_in_bytes, set_filter4d_descriptor, set_filter_nd_descriptor,
    set_tensor4d_descriptor, set_tensor4d_descriptor_ex, set_tensor_nd_descriptor, set_tensor_nd_descriptor_ex,
)
from .ops.activation import (
    activation_backward, activation_forward, create_activation_descriptor, destroy_activation_descriptor,
    get_activation_descriptor, get_activation_descriptor_swish_beta, set_activation_descriptor,
    set_activation_descriptor_swish_beta,
)
from .ops.reduce import (
    create_reduce_tensor_descriptor, destroy_reduce_tensor_descriptor, get_reduce_tensor_descriptor,
    get_reduction_indices_size, get_reduction_workspace_size, reduce_tensor, set_reduce_tensor_descriptor,
)
from .ops.softmax import softmax_backward, softmax_forward
from .ops.tensor_ops import (
    add_tensor, create_op_tensor_descriptor, destroy_op_tensor_descriptor, get_op_tensor_descriptor, op_tensor,
    scale_tensor, set_op_tensor_descriptor, set_tensor, transform_tensor,
)
from .ops.pooling import *  # noqa: F401,F403 - each later family exports its API through __all__
from .ops.batchnorm import *  # noqa: F401,F403
from .ops.normalization import *  # noqa: F401,F403
from .ops.dropout import *  # noqa: F401,F403
from .ops.convolution import *  # noqa: F401,F403
from .ops.attention import *  # noqa: F401,F403
from .ops.mha import *  # noqa: F401,F403
from ._cuda.memory import DeviceArray
# ---- RNN family (pydnn/ops/rnn/) ----
from .ops.rnn import *  # noqa: F401,F403,E402
# ---- graph API (issue 22): the public matmul, the backend API, the frontend (pydnn.graph) ----
from .graph import (  # noqa: F401,E402
    backend_create_descriptor, backend_destroy_descriptor, backend_execute, backend_finalize, backend_get_attribute,
    backend_set_attribute, get_matmul_ex_workspace_size, matmul, matmul_ex,
)
