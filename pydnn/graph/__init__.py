"""The graph API (issue 22): the public matmul extension call and cuDNN's backend descriptors, operation
graphs, engines and execution plans. Modules import one way: matmul_api -> descriptors -> opgraph ->
engines -> plans -> frontend."""
from .matmul_api import matmul  # noqa: F401
from .backend import (  # noqa: F401
    backend_create_descriptor, backend_destroy_descriptor, backend_execute, backend_finalize, backend_get_attribute,
    backend_set_attribute,
)
from .frontend import Graph, Tensor  # noqa: F401
