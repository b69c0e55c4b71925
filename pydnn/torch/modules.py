"""nn.Module drop-ins: each class subclasses PyTorch's own module, so constructor arguments, parameter and
buffer names, state_dict keys, `extra_repr`, initialisation and `reset_parameters` are PyTorch's; only
`forward` runs pydnn (pydnn.torch.functional), falling back to PyTorch's op (reason recorded in
pydnn.torch.fallbacks) where pydnn does not run a configuration.
"""
import torch.nn as nn
import torch.nn.functional as F

from pydnn import tuning

from . import _core as C
from . import functional as PF
from .rnn import GRU, LSTM, RNN

__all__ = ["Conv1d", "Conv2d", "Conv3d", "BatchNorm1d", "BatchNorm2d", "LayerNorm", "GroupNorm", "RMSNorm",
           "ReLU", "GELU", "SiLU", "Sigmoid", "Tanh", "MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d", "Dropout",
           "Linear", "MultiheadAttention", "Softmax", "LogSoftmax", "LSTM", "GRU", "RNN", "Sequential"]

_FUSABLE = (None, "relu", "sigmoid", "tanh", "identity")
# The per-step forwards read parameters and buffers from the module's _parameters / _buffers dicts, where
# nn.Module.__getattr__ finds them, without its frame (18 a CNN demo step); a KeyError (a parametrization's
# property, an attribute set by other means) reads them the usual way.


class _ConvMixin:
    """forward through pydnn.torch.functional.conv; `activation` (a pydnn.torch extra, default None): 'relu',
    'sigmoid' or 'tanh' fused into the convolution's epilogue (ConvolutionBiasActivationForward)."""

    def _init_activation(self, activation):
        if activation not in _FUSABLE:
            raise ValueError(f"activation: {activation!r} is not one of {_FUSABLE[1:]} (or None)")
        self.activation = activation

    def forward(self, x):
        act = getattr(self, "activation", None)
        bn = self.__dict__.get("_bn")
        if bn is not None and self.padding_mode == "zeros":  # convert(fuse=True): the next BatchNorm's work too
            rm, rv, training, factor = bn._bn_state()
            p, q = self._parameters, bn._parameters
            try:
                w, b, bw, bb = p["weight"], p["bias"], q["weight"], q["bias"]
            except KeyError:
                w, b, bw, bb = self.weight, self.bias, bn.weight, bn.bias
            return PF.conv_batch_norm(x, w, b, self.stride, self.padding, self.dilation, self.groups, rm, rv, bw, bb,
                                      training, factor, bn.eps, getattr(bn, "activation", None),
                                      bn.__dict__.get("pool"))
        if self.padding_mode != "zeros":
            x = F.pad(x, self._reversed_padding_repeated_twice, mode=self.padding_mode)
            return PF.conv(x, self.weight, self.bias, self.stride, 0, self.dilation, self.groups, act)
        return PF.conv(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups, act)

    def extra_repr(self):
        s = super().extra_repr()
        act = getattr(self, "activation", None)
        return s + (f", activation={act!r}" if act else "")


class Conv1d(_ConvMixin, nn.Conv1d):
    def __init__(self, *args, activation=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_activation(activation)


class Conv2d(_ConvMixin, nn.Conv2d):
    def __init__(self, *args, activation=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_activation(activation)


class Conv3d(_ConvMixin, nn.Conv3d):
    def __init__(self, *args, activation=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_activation(activation)


class _BatchNormMixin:
    """`activation` (a pydnn.torch extra, default None): 'relu' fused after the normalization
    (BatchNormalizationForwardTrainingEx's BN_ACTIVATION in training). `pool` (set by convert(fuse=True) where
    a MaxPool2d followed, itself replaced by nn.Identity): (kernel_size, stride, padding) of that max pool,
    run in the same autograd node in training (pydnn.tuning.torch.FUSE_POOL)."""

    def _init_activation(self, activation):
        if activation not in (None, "relu"):
            raise ValueError(f"activation: {activation!r} is not 'relu' (or None)")
        self.activation = activation

    def extra_repr(self):
        s = super().extra_repr()
        act = getattr(self, "activation", None)
        pool = self.__dict__.get("pool")
        return (s + (f", activation={act!r}" if act else "")
                + (f", max_pool(kernel_size, stride, padding)={pool!r}" if pool else ""))

    def _bn_state(self):
        """(running mean, running var, training, exponential average factor) of a call, as torch's
        _BatchNorm.forward finds them (num_batches_tracked counted here)."""
        factor = 0.0 if self.momentum is None else self.momentum
        bufs = self._buffers
        try:
            nbt, rm, rv = bufs["num_batches_tracked"], bufs["running_mean"], bufs["running_var"]
        except KeyError:
            nbt, rm, rv = getattr(self, "num_batches_tracked", None), self.running_mean, self.running_var
        if self.training and self.track_running_stats and nbt is not None:
            nbt.add_(1)
            factor = 1.0 / float(nbt) if self.momentum is None else self.momentum
        bn_training = self.training or (rm is None and rv is None)
        if self.training and not self.track_running_stats:
            rm = rv = None
        return rm, rv, bn_training, factor

    def forward(self, x):
        if self.__dict__.get("_absorbed"):  # convert(fuse=True): the Conv2d before it ran this batch norm
            return x
        self._check_input_dim(x)
        rm, rv, bn_training, factor = self._bn_state()
        return PF.batch_norm(x, rm, rv, self.weight, self.bias, bn_training, factor, self.eps,
                             getattr(self, "activation", None), self.__dict__.get("pool"))


class BatchNorm1d(_BatchNormMixin, nn.BatchNorm1d):
    def __init__(self, *args, activation=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_activation(activation)


class BatchNorm2d(_BatchNormMixin, nn.BatchNorm2d):
    def __init__(self, *args, activation=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_activation(activation)


class LayerNorm(nn.LayerNorm):
    def forward(self, x):
        return PF.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


class GroupNorm(nn.GroupNorm):
    def forward(self, x):
        return PF.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)


class RMSNorm(nn.RMSNorm):
    def forward(self, x):
        return PF.rms_norm(x, self.normalized_shape, self.weight, self.eps)


class ReLU(nn.ReLU):
    """inplace=True is accepted (PyTorch's argument) but the result is a new tensor."""

    def forward(self, x):
        return PF.relu(x)


class GELU(nn.GELU):
    def forward(self, x):
        return PF.gelu(x, self.approximate)


class SiLU(nn.SiLU):
    def forward(self, x):
        return PF.silu(x)


class Sigmoid(nn.Sigmoid):
    def forward(self, x):
        return PF.sigmoid(x)


class Tanh(nn.Tanh):
    def forward(self, x):
        return PF.tanh(x)


class MaxPool2d(nn.MaxPool2d):
    def forward(self, x):
        return PF.max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode,
                             self.return_indices)


class AvgPool2d(nn.AvgPool2d):
    def forward(self, x):
        return PF.avg_pool2d(x, self.kernel_size, self.stride, self.padding, self.ceil_mode, self.count_include_pad,
                             self.divisor_override)


class AdaptiveAvgPool2d(nn.AdaptiveAvgPool2d):
    def forward(self, x):
        return PF.adaptive_avg_pool2d(x, self.output_size)


class Dropout(nn.Dropout):
    """pydnn's counter-based dropout: the mask is not PyTorch's (a different generator), its distribution
    is; the seed is drawn from PyTorch's default generator on first use per device."""

    def forward(self, x):
        st = self.__dict__.get("_pydnn_state")
        if st is None:
            st = self.__dict__["_pydnn_state"] = PF.DropoutState()
        return PF.dropout(x, self.p, self.training, st)


class Softmax(nn.Softmax):
    def forward(self, x):
        dim = self.dim if self.dim is not None else (0 if x.dim() in (0, 1, 3) else 1)
        return PF.softmax(x, dim)


class LogSoftmax(nn.LogSoftmax):
    def forward(self, x):
        dim = self.dim if self.dim is not None else (0 if x.dim() in (0, 1, 3) else 1)
        return PF.log_softmax(x, dim)


class Linear(nn.Linear):
    """Linear on pydnn.matmul where this pydnn has the public matmul (hasattr(pydnn, "matmul"), the graph
    API's) and pydnn.torch.linear_on_pydnn is true; PyTorch's F.linear (cuBLAS) otherwise."""

    def forward(self, x):
        fused = self.__dict__.get("_mlp")
        if fused is not None:  # convert(fuse=True) with tuning.torch.FUSE_MLP: act, then the next Linear's
            approximate, nxt = fused  # product here (its own forward passes the result through)
            return PF.mlp(x, self.weight, nxt.weight, approximate)
        if self.__dict__.get("_mlp_tail"):
            return x
        p = self._parameters
        try:
            w, b = p["weight"], p["bias"]
        except KeyError:
            w, b = self.weight, self.bias
        return PF.linear(x, w, b)


def chain_stages(mods):
    """The stages of a Sequential's children (convert(fuse=True)'s conv + batch norm blocks, nn.Flatten(1), a
    pydnn Linear; nn.Identity and the blocks' absorbed batch norms pass through): [(kind, module(s))], or None
    where a child is anything else or fewer than two stages compute."""
    stages = []
    for m in mods:
        t = type(m)
        if t is nn.Identity or (t in (BatchNorm2d,) and m.__dict__.get("_absorbed")):
            continue
        bn = m.__dict__.get("_bn") if t is Conv2d else None
        if bn is not None and m.padding_mode == "zeros" and bn.__dict__.get("_absorbed"):
            stages.append((PF._ST_BLOCK, m, bn))
        elif t is nn.Flatten and m.start_dim == 1 and m.end_dim == -1:
            stages.append((PF._ST_FLAT, m, None))
        elif t is Linear and not m.__dict__.get("_mlp") and not m.__dict__.get("_mlp_tail"):
            stages.append((PF._ST_LINEAR, m, None))
        else:
            return None
    return stages if sum(k != PF._ST_FLAT for k, _, _ in stages) >= 2 else None


class Sequential(nn.Sequential):
    """nn.Sequential whose training forward runs its fused stages as one autograd node where
    pydnn.torch.functional.chain takes it (tuning.torch.FUSE_CHAIN; convert(fuse=True) gives this class to an
    nn.Sequential of conv + batch norm blocks, Flatten and Linear); otherwise nn.Sequential's forward."""

    def forward(self, input):  # noqa: A002 - nn.Sequential's name
        if self.training and tuning.torch.FUSE_CHAIN:
            y = PF.chain(self, input, chain_stages)
            if y is not None:
                return y
        return super().forward(input)


class MultiheadAttention(nn.MultiheadAttention):
    """PyTorch's MultiheadAttention with the attention core on pydnn's fused attention (projections:
    F.linear). Runs pydnn when need_weights=False, no key_padding_mask, no attn_mask (or attn_mask with
    is_causal=True, taken as the causal mask it must be, as PyTorch's fast path does), the packed in-projection,
    no bias_k / bias_v / add_zero_attn, and head dim 64 or 128 in fp16 / bf16; otherwise PyTorch's forward."""

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        reason = None
        if need_weights:
            reason = "need_weights=True (fused attention returns no weights)"
        elif key_padding_mask is not None:
            reason = "key_padding_mask"
        elif attn_mask is not None and not is_causal:
            reason = "attn_mask (only causal)"
        elif not self._qkv_same_embed_dim or self.bias_k is not None or self.add_zero_attn:
            reason = "separate q/k/v projections, bias_k / bias_v or add_zero_attn"
        elif query.dim() != 3:
            reason = "unbatched input"
        elif not C.on_cuda(query, key, value):
            reason = "tensors not on a CUDA device"
        elif self.head_dim not in (64, 128):
            reason = f"head dim {self.head_dim} (64 or 128)"
        if reason is not None:
            C.fallback(f"MultiheadAttention: {reason}")
            return super().forward(query, key, value, key_padding_mask, need_weights, attn_mask,
                                   average_attn_weights, is_causal)
        self_attention = query is key and key is value
        if not self.batch_first:
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        b, sq, e = query.shape
        h, d = self.num_heads, self.head_dim
        w, bias = self.in_proj_weight, self.in_proj_bias
        if self_attention:
            qkv = F.linear(query, w, bias).view(b, sq, 3, h, d)
            q, k, v = qkv.unbind(2)
        else:
            wq, wk, wv = w.chunk(3)
            bq, bk, bv = bias.chunk(3) if bias is not None else (None, None, None)
            q = F.linear(query, wq, bq).view(b, sq, h, d)
            k = F.linear(key, wk, bk).view(b, key.shape[1], h, d)
            v = F.linear(value, wv, bv).view(b, value.shape[1], h, d)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        o = PF.scaled_dot_product_attention(q, k, v, None, self.dropout if self.training else 0.0,
                                            is_causal=is_causal)
        o = o.transpose(1, 2).reshape(b, sq, e)
        out = F.linear(o, self.out_proj.weight, self.out_proj.bias)
        if not self.batch_first:
            out = out.transpose(0, 1)
        return out, None
