"""pydnn under PyTorch (the optional extra `pip install "pydnn[torch]"`; nothing else in pydnn imports torch).

    import pydnn.torch as pt
    model = pt.Conv2d(3, 64, 3, padding=1)           # PyTorch's constructor, parameters and state_dict keys
    report = pt.convert(model)                        # or swap a model's supported modules in place
    pt.benchmark = True                               # every convolution plan picks its algorithm by Find
    pt.fallbacks                                      # reason -> calls that ran PyTorch's own op instead

One pydnn handle per device (created on first use on PyTorch's primary context), its stream set to
torch.cuda.current_stream() on every call; descriptors cached by (dtype, dims, strides); buffers passed as
data_ptr() ints; workspaces from PyTorch's caching allocator (so CUDA graph capture works).
"""
try:
    import torch  # noqa: F401
except ImportError as e:  # pragma: no cover - the extra is not installed
    raise ImportError('pydnn.torch needs PyTorch: pip install "pydnn[torch]"') from e

from . import functional
from ._core import fallbacks, handle_for
from .convert import ConvertReport, convert
from .functional import log_softmax, scaled_dot_product_attention, softmax
from .modules import *  # noqa: F401,F403
from .modules import __all__ as _modules_all

# as torch.backends.cudnn.benchmark: True makes each new convolution problem choose its algorithms with
# pydnn's Find (timed on the GPU, persisted in the tuning cache) instead of the v7 heuristic
benchmark = False
# Linear / pydnn.torch.functional.linear run on pydnn.matmul when pydnn has it (the graph API's public
# matmul; hasattr-checked at each call) and this is true; PyTorch's F.linear otherwise
linear_on_pydnn = True


def fallback_report():
    """{reason: calls} of every call that ran PyTorch's op instead of pydnn's, most frequent first."""
    return dict(fallbacks.most_common())


__all__ = ["benchmark", "linear_on_pydnn", "convert", "ConvertReport", "fallbacks", "fallback_report", "functional", "handle_for",
           "softmax", "log_softmax", "scaled_dot_product_attention", *_modules_all]
