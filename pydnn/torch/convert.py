"""convert(model): swap a model's supported modules for pydnn.torch's in place."""
import torch.nn as nn

from . import modules as M

# PyTorch class -> pydnn.torch class (exact types only: a user's subclass of nn.Conv2d may override forward)
SWAPS = {
    nn.Conv1d: M.Conv1d, nn.Conv2d: M.Conv2d, nn.Conv3d: M.Conv3d,
    nn.BatchNorm1d: M.BatchNorm1d, nn.BatchNorm2d: M.BatchNorm2d,
    nn.LayerNorm: M.LayerNorm, nn.GroupNorm: M.GroupNorm, nn.RMSNorm: M.RMSNorm,
    nn.ReLU: M.ReLU, nn.GELU: M.GELU, nn.SiLU: M.SiLU, nn.Sigmoid: M.Sigmoid, nn.Tanh: M.Tanh,
    nn.MaxPool2d: M.MaxPool2d, nn.AvgPool2d: M.AvgPool2d, nn.AdaptiveAvgPool2d: M.AdaptiveAvgPool2d,
    nn.Dropout: M.Dropout, nn.Softmax: M.Softmax, nn.LogSoftmax: M.LogSoftmax,
    nn.Linear: M.Linear, nn.MultiheadAttention: M.MultiheadAttention,
}
# modules whose own forward only calls their children: nothing of theirs is left as PyTorch
_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)


class ConvertReport:
    """converted: [(name, PyTorch class name)]; kept: [(name, class name, reason)] for modules left as
    PyTorch (leaf modules pydnn has no drop-in for, subclasses of supported types, and the model's own
    forward code: functional calls such as F.relu or torch.matmul inside a forward are not swapped)."""

    def __init__(self):
        self.converted, self.kept = [], []

    def __str__(self):
        lines = [f"pydnn.torch.convert: {len(self.converted)} modules swapped, {len(self.kept)} left as PyTorch"]
        lines += [f"  kept {n or '(model)'}: {c} ({r})" for n, c, r in self.kept]
        return "\n".join(lines)

    __repr__ = __str__


def _swap(old, cls):
    """A `cls` instance sharing old's state: the same Parameter and buffer objects (so an optimizer built
    on the model keeps working), hooks, training flag."""
    new = cls.__new__(cls)
    new.__dict__.update(old.__dict__)
    if cls in (M.Conv1d, M.Conv2d, M.Conv3d):
        new.activation = None
    return new


def convert(model):
    """Swap every supported module of `model` (exact PyTorch types) in place; returns a ConvertReport. The
    root cannot be replaced in place: a supported root type is reported as kept (construct
    pydnn.torch.<Class> for a single module)."""
    report = ConvertReport()
    for name, mod in list(model.named_modules()):
        for cname, child in list(mod.named_children()):
            cls = SWAPS.get(type(child))
            full = f"{name}.{cname}" if name else cname
            if cls is not None:
                setattr(mod, cname, _swap(child, cls))
                report.converted.append((full, type(child).__name__))
    pyd = set(SWAPS.values())
    for name, mod in model.named_modules():
        t = type(mod)
        if t in pyd or isinstance(mod, _CONTAINERS):
            continue
        if t in SWAPS:  # only the root can still be one: children were swapped above
            report.kept.append((name, t.__name__, f"the root module itself (construct pydnn.torch.{t.__name__} "
                                                  "instead)"))
        elif any(isinstance(mod, k) for k in SWAPS):
            report.kept.append((name, t.__name__, f"subclass of a supported module ({t.__mro__[1].__name__}); "
                                                   "its forward may differ"))
        elif not any(True for _ in mod.children()):
            report.kept.append((name, t.__name__, "no pydnn drop-in"))
        else:
            report.kept.append((name, t.__name__, "own forward: its children are converted, its functional calls "
                                                   "are PyTorch's"))
    return report
