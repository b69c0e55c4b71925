"""convert(model): swap a model's supported modules for pydnn.torch's in place."""
import torch.nn as nn

from pydnn import tuning

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
    nn.LSTM: M.LSTM, nn.GRU: M.GRU, nn.RNN: M.RNN,
}
# modules whose own forward only calls their children: nothing of theirs is left as PyTorch
_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)


class ConvertReport:
    """converted: [(name, PyTorch class name)]; kept: [(name, class name, reason)] for modules left as
    PyTorch (leaf modules pydnn has no drop-in for, subclasses of supported types, and the model's own
    forward code: functional calls such as F.relu or torch.matmul inside a forward are not swapped)."""

    def __init__(self):
        self.converted, self.kept, self.fused = [], [], []

    def __str__(self):
        lines = [f"pydnn.torch.convert: {len(self.converted)} modules swapped, {len(self.fused)} activations "
                 f"fused, {len(self.kept)} left as PyTorch"]
        lines += [f"  fused {a} into {n}" for n, a in self.fused]
        lines += [f"  kept {n or '(model)'}: {c} ({r})" for n, c, r in self.kept]
        return "\n".join(lines)

    __repr__ = __str__


def _swap(old, cls):
    """A `cls` instance sharing old's state: the same Parameter and buffer objects (so an optimizer built
    on the model keeps working), hooks, training flag."""
    new = cls.__new__(cls)
    new.__dict__.update(old.__dict__)
    if cls in (M.Conv1d, M.Conv2d, M.Conv3d, M.BatchNorm1d, M.BatchNorm2d):
        new.activation = None
    if cls in (M.LSTM, M.GRU, M.RNN):  # the same Parameters, re-laid into pydnn's flat weight space
        new.flatten_parameters()
    return new


_CONVS = (M.Conv1d, M.Conv2d, M.Conv3d)
_BNS = (M.BatchNorm1d, M.BatchNorm2d)
_ACTS = {M.ReLU: "relu", M.Sigmoid: "sigmoid", M.Tanh: "tanh"}


def _fuse(model, report):
    """In every nn.Sequential: a Conv followed by a ReLU / Sigmoid / Tanh, or a BatchNorm followed by a
    ReLU, takes the activation into its epilogue; the activation module becomes nn.Identity (so indices and
    state_dict keys stay). Only inside Sequential, where nothing else can read the value in between."""
    for name, seq in model.named_modules():
        if type(seq) is not nn.Sequential:
            continue
        keys = list(seq._modules)
        for a, b in zip(keys, keys[1:]):
            first, second = seq._modules[a], seq._modules[b]
            act = _ACTS.get(type(second))
            if act is None or getattr(first, "activation", 1) is not None:
                continue
            if type(first) in _CONVS or (type(first) in _BNS and act == "relu"):
                if second._forward_hooks or second._forward_pre_hooks or first._forward_hooks:
                    continue
                first.activation = act
                seq._modules[b] = nn.Identity()
                report.fused.append((f"{name}.{a}" if name else a, act))


def _dil1(d):
    return d == 1 or tuple(d) == (1, 1)


def _fuse_pools(model, report):
    """In every nn.Sequential: a BatchNorm2d followed by a MaxPool2d (nn.Identity modules between them
    skipped: fused activations) takes the pool (its `pool` attribute; the pool module becomes nn.Identity).
    Only pools pydnn runs (no indices, floor mode, dilation 1) and modules without hooks."""
    for name, seq in model.named_modules():
        if type(seq) is not nn.Sequential:
            continue
        keys = list(seq._modules)
        for i, a in enumerate(keys):
            bn = seq._modules[a]
            if type(bn) is not M.BatchNorm2d or bn.__dict__.get("pool") is not None or bn._forward_hooks:
                continue
            j = i + 1
            while j < len(keys) and type(seq._modules[keys[j]]) is nn.Identity and not (
                    seq._modules[keys[j]]._forward_hooks or seq._modules[keys[j]]._forward_pre_hooks):
                j += 1
            if j == len(keys):
                continue
            mp = seq._modules[keys[j]]
            if (type(mp) is not M.MaxPool2d or mp.return_indices or mp.ceil_mode or not _dil1(mp.dilation)
                    or mp._forward_hooks or mp._forward_pre_hooks or mp._backward_hooks):
                continue
            bn.pool = (mp.kernel_size, mp.stride, mp.padding)
            seq._modules[keys[j]] = nn.Identity()
            report.fused.append((f"{name}.{a}" if name else a, "max_pool2d"))


def _fuse_blocks(model, report):
    """In every nn.Sequential: a Conv2d (no fused activation, zero padding) followed by a BatchNorm2d (with the
    ReLU and max pool _fuse / _fuse_pools gave it) runs both (pydnn.torch.functional.conv_batch_norm: one autograd
    node in training with tuning.torch.FUSE_BLOCK): the convolution module holds the batch norm (not registered as
    its child: parameters, buffers and state_dict keys unchanged), and the batch norm module passes its input
    through. Modules with hooks are left alone."""
    for name, seq in model.named_modules():
        if type(seq) is not nn.Sequential:
            continue
        keys = list(seq._modules)
        for a, b in zip(keys, keys[1:]):
            cv, bn = seq._modules[a], seq._modules[b]
            if not (type(cv) is M.Conv2d and type(bn) is M.BatchNorm2d and cv.activation is None
                    and cv.padding_mode == "zeros" and "_bn" not in cv.__dict__ and "_absorbed" not in cv.__dict__
                    and "_absorbed" not in bn.__dict__ and cv.out_channels == bn.num_features):
                continue
            if any(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks
                   for m in (cv, bn)):
                continue
            cv.__dict__["_bn"] = bn
            bn.__dict__["_absorbed"] = True
            report.fused.append((f"{name}.{a}" if name else a, f"{name}.{b}" if name else b))


def _fuse_mlps(model, report):
    """In every nn.Sequential: Linear (no bias) -> GELU -> Linear (no bias) runs as one fused MLP
    (pydnn.torch.functional.mlp: the GELU in the first GEMM's epilogue, its gradient in the backward's): the
    first Linear computes the whole block with the second's weight, the GELU becomes nn.Identity and the
    second Linear passes its input through (it keeps its weight: parameters and state_dict keys unchanged).
    tuning.torch.FUSE_MLP; modules with hooks are left alone."""
    for name, seq in model.named_modules():
        if type(seq) is not nn.Sequential:
            continue
        keys = list(seq._modules)
        for a, b, c in zip(keys, keys[1:], keys[2:]):
            l1, act, l2 = seq._modules[a], seq._modules[b], seq._modules[c]
            if not (type(l1) is M.Linear and type(act) is M.GELU and type(l2) is M.Linear and l1.bias is None
                    and l2.bias is None and "_mlp" not in l1.__dict__ and "_mlp_tail" not in l1.__dict__
                    and "_mlp" not in l2.__dict__ and "_mlp_tail" not in l2.__dict__):
                continue
            if any(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks for m in (l1, act, l2)):
                continue
            l1.__dict__["_mlp"] = (act.approximate, l2)  # a tuple: not registered as a child module
            l2.__dict__["_mlp_tail"] = True
            seq._modules[b] = nn.Identity()
            report.fused.append((f"{name}.{a}" if name else a, f"gelu + {name}.{c}" if name else f"gelu + {c}"))


def _chain_sequentials(model, report):
    """Every nn.Sequential (exact type) whose children make a chain (pydnn.torch.modules.chain_stages: fused
    conv + batch norm blocks, Flatten, Linear) becomes pydnn.torch.modules.Sequential in place (its class only:
    children, parameters and state_dict keys unchanged); its training forward then runs the stages as one
    autograd node under tuning.torch.FUSE_CHAIN."""
    for name, seq in list(model.named_modules()):
        if type(seq) is nn.Sequential and M.chain_stages(tuple(seq._modules.values())) is not None:
            seq.__class__ = M.Sequential
            report.fused.append((name or "(model)", "chain"))


def convert(model, fuse=False):
    """Swap every supported module of `model` (exact PyTorch types) in place; returns a ConvertReport. The
    root cannot be replaced in place: a supported root type is reported as kept (construct
    pydnn.torch.<Class> for a single module). fuse=True also fuses Conv + ReLU / Sigmoid / Tanh and
    BatchNorm + ReLU pairs of nn.Sequential containers (the activation replaced by nn.Identity), and a
    BatchNorm2d's following MaxPool2d into it (one autograd node in training; the pool replaced by
    nn.Identity), a Conv2d's following BatchNorm2d into it (_fuse_blocks: one node in training), with
    tuning.torch.FUSE_MLP a Linear -> GELU -> Linear block without biases (_fuse_mlps), and with
    tuning.torch.FUSE_CHAIN an nn.Sequential of such blocks, Flatten and Linear one node in training
    (_chain_sequentials)."""
    report = ConvertReport()
    for name, mod in list(model.named_modules()):
        for cname, child in list(mod.named_children()):
            cls = SWAPS.get(type(child))
            full = f"{name}.{cname}" if name else cname
            if cls is not None:
                setattr(mod, cname, _swap(child, cls))
                report.converted.append((full, type(child).__name__))
    if fuse:
        _fuse(model, report)
        _fuse_pools(model, report)
        _fuse_blocks(model, report)
        if tuning.torch.FUSE_MLP:
            _fuse_mlps(model, report)
        if tuning.torch.FUSE_CHAIN:
            _chain_sequentials(model, report)
    pyd = set(SWAPS.values()) | {nn.Identity}
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
