"""The graph API (issue 22): the public matmul extension call and cuDNN's backend descriptors, operation
graphs, engines and execution plans. Modules import one way: matmul_api -> descriptors -> opgraph ->
engines -> plans -> frontend."""
from .matmul_api import matmul  # noqa: F401
