"""The graph API (issue 22): the public matmul extension call and cuDNN's backend descriptors, operation
graphs, engines and execution plans. Modules import one way: matmul_api -> descriptors -> opgraph ->
engines -> plans -> frontend -> the node modules (norm_nodes, sdpa_nodes, conv_fusion, prologue, reduce_tail), which register their
operation descriptors, engine steps, fusions and Graph methods when this package is imported (importing
any module of it, pydnn.graph.backend from the C API among them, runs this first)."""
from .matmul_api import get_matmul_ex_workspace_size, matmul, matmul_ex  # noqa: F401
from .backend import (  # noqa: F401
    backend_create_descriptor, backend_destroy_descriptor, backend_execute, backend_finalize, backend_get_attribute,
    backend_set_attribute,
)
from .frontend import Graph, Tensor  # noqa: F401
from . import conv_fusion, norm_nodes, prologue, reduce_tail, sdpa_nodes  # noqa: F401,E402 - registration (see above)
