"""pydnn.torch's GPU path run on the CPU against emulated pydnn calls.

Every pydnn call the bridge makes on the GPU path is replaced by a fake with the real function's exact
signature (checked with inspect), which reads everything from the real descriptors (pydnn's own getters)
and the raw pointers (memory viewed through the descriptor's dims and strides) and computes with PyTorch.
Descriptors, plans, caches, autograd Functions, modules and convert() are the real code. This checks the
bridge's plumbing (argument order, which buffer goes with which descriptor, layouts / strides, autograd
wiring, autocast and module logic) without a GPU; it does not check pydnn's kernels (the GPU tests do).
"""
import ctypes
import inspect
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import pydnn  # noqa: E402
import pydnn.torch as pt  # noqa: E402
from pydnn.torch import _core as C  # noqa: E402
from pydnn.torch import functional as PF  # noqa: E402

_NP = {pydnn.PYDNN_DATA_FLOAT: (np.float32, torch.float32), pydnn.PYDNN_DATA_DOUBLE: (np.float64, torch.float64),
       pydnn.PYDNN_DATA_HALF: (np.int16, torch.float16), pydnn.PYDNN_DATA_BFLOAT16: (np.int16, torch.bfloat16),
       pydnn.PYDNN_DATA_INT32: (np.int32, torch.int32)}
CALLS = []


def view(p, dtype, dims, strides):
    """The tensor at address p with these dims / strides (elements), sharing the memory."""
    assert isinstance(p, int) and p > 0, f"pointer {p!r}"
    npt, tt = _NP[dtype]
    item = np.dtype(npt).itemsize
    span = 1 + sum((d - 1) * s for d, s in zip(dims, strides))
    buf = np.frombuffer((ctypes.c_char * (span * item)).from_address(p), dtype=npt)
    arr = np.lib.stride_tricks.as_strided(buf, tuple(dims), tuple(s * item for s in strides))
    t = torch.from_numpy(arr)
    return t.view(tt) if npt is np.int16 else t


def tv(desc, p):
    dt, nb, dims, strides = pydnn.get_tensor_nd_descriptor(desc, 8)
    return view(p, dt, dims, strides)


def fv(desc, p):
    """A filter (K, C, spatial...) from its descriptor: NHWC filters are K, spatial..., C in memory."""
    dt, fmt, nb, dims = pydnn.get_filter_nd_descriptor(desc, 8)
    if fmt == pydnn.PYDNN_TENSOR_NHWC:
        perm = [dims[0]] + list(dims[2:]) + [dims[1]]
        st = [1] * len(perm)
        for i in range(len(perm) - 2, -1, -1):
            st[i] = st[i + 1] * perm[i + 1]
        t = view(p, dt, perm, st)
        return t.permute(0, len(dims) - 1, *range(1, len(dims) - 1))
    st = [1] * len(dims)
    for i in range(len(dims) - 2, -1, -1):
        st[i] = st[i + 1] * dims[i + 1]
    return view(p, dt, dims, st)


def blend(out, val, alpha, beta):
    val = alpha * val.to(torch.float64)
    if beta != 0:
        val = val + beta * out.to(torch.float64)
    out.copy_(val.to(out.dtype))


def conv_args(cd):
    n, pad, stride, dil, mode, ct = pydnn.get_convolution_nd_descriptor(cd, 3)
    assert mode == pydnn.PYDNN_CROSS_CORRELATION
    return stride, pad, dil, pydnn.get_convolution_group_count(cd)


def tconv(x, w, cd):
    stride, pad, dil, g = conv_args(cd)
    fn = (F.conv1d, F.conv2d, F.conv3d)[x.dim() - 3]
    return fn(x.double(), w.double(), None, stride, pad, dil, g)


ACTS = {pydnn.PYDNN_ACTIVATION_RELU: F.relu, pydnn.PYDNN_ACTIVATION_SIGMOID: torch.sigmoid,
        pydnn.PYDNN_ACTIVATION_TANH: torch.tanh, pydnn.PYDNN_ACTIVATION_IDENTITY: lambda t: t,
        pydnn.PYDNN_ACTIVATION_GELU_ERF: F.gelu, pydnn.PYDNN_ACTIVATION_GELU_TANH: lambda t: F.gelu(t, approximate="tanh")}


def act_fn(ad):
    mode, nan, coef = pydnn.get_activation_descriptor(ad)
    if mode == pydnn.PYDNN_ACTIVATION_SWISH:
        beta = pydnn.get_activation_descriptor_swish_beta(ad)
        return lambda t: t * torch.sigmoid(beta * t)
    return ACTS[mode]


def ws_check(ws, n):
    if n:
        assert isinstance(ws, int) and ws > 0, "workspace pointer missing"


# ------------------------------------------------------------------------------------------------ fakes
def get_convolution_forward_algorithm_v7(handle, src_desc, filter_desc, conv_desc, dest_desc, requested_algo_count):
    return [pydnn.ConvolutionPerf(pydnn.PYDNN_CONVOLUTION_FWD_ALGO_DIRECT, pydnn.PYDNN_STATUS_NOT_SUPPORTED),
            pydnn.ConvolutionPerf(pydnn.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, pydnn.PYDNN_STATUS_SUCCESS)]


def get_convolution_backward_data_algorithm_v7(handle, filter_desc, diff_desc, conv_desc, grad_desc,
                                               requested_algo_count):
    return [pydnn.ConvolutionPerf(pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_1, pydnn.PYDNN_STATUS_SUCCESS)]


def get_convolution_backward_filter_algorithm_v7(handle, src_desc, diff_desc, conv_desc, grad_desc,
                                                 requested_algo_count):
    return [pydnn.ConvolutionPerf(pydnn.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_1, pydnn.PYDNN_STATUS_SUCCESS)]


def find_convolution_forward_algorithm(handle, x_desc, w_desc, conv_desc, y_desc, requested_algo_count):
    CALLS.append("find_fwd")
    return get_convolution_forward_algorithm_v7(handle, x_desc, w_desc, conv_desc, y_desc, requested_algo_count)


def find_convolution_backward_data_algorithm(handle, w_desc, dy_desc, conv_desc, dx_desc, requested_algo_count):
    CALLS.append("find_bwd_data")
    return get_convolution_backward_data_algorithm_v7(handle, w_desc, dy_desc, conv_desc, dx_desc, 1)


def find_convolution_backward_filter_algorithm(handle, x_desc, dy_desc, conv_desc, dw_desc, requested_algo_count):
    CALLS.append("find_bwd_filter")
    return get_convolution_backward_filter_algorithm_v7(handle, x_desc, dy_desc, conv_desc, dw_desc, 1)


def get_convolution_forward_workspace_size(handle, x_desc, w_desc, conv_desc, y_desc, algo):
    return 256


def get_convolution_backward_data_workspace_size(handle, w_desc, dy_desc, conv_desc, dx_desc, algo):
    return 128


def get_convolution_backward_filter_workspace_size(handle, x_desc, dy_desc, conv_desc, grad_desc, algo):
    return 0


def convolution_forward(handle, alpha, x_desc, x, w_desc, w, conv_desc, algo, work_space, work_space_size_in_bytes,
                        beta, y_desc, y):
    CALLS.append("conv_fwd")
    ws_check(work_space, work_space_size_in_bytes)
    blend(tv(y_desc, y), tconv(tv(x_desc, x), fv(w_desc, w), conv_desc), alpha, beta)


def convolution_bias_activation_forward(handle, alpha1, x_desc, x, w_desc, w, conv_desc, algo, work_space,
                                        work_space_size_in_bytes, alpha2, z_desc, z, bias_desc, bias,
                                        activation_desc, y_desc, y):
    CALLS.append("conv_fused")
    ws_check(work_space, work_space_size_in_bytes)
    val = alpha1 * tconv(tv(x_desc, x), fv(w_desc, w), conv_desc) + tv(bias_desc, bias).double()
    if alpha2 != 0:
        val = val + alpha2 * tv(z_desc, z).double()
    out = tv(y_desc, y)
    out.copy_(act_fn(activation_desc)(val).to(out.dtype))


def convolution_backward_data(handle, alpha, w_desc, w, dy_desc, dy, conv_desc, algo, work_space,
                              work_space_size_in_bytes, beta, dx_desc, dx):
    CALLS.append("conv_bwd_data")
    ws_check(work_space, work_space_size_in_bytes)
    stride, pad, dil, g = conv_args(conv_desc)
    dxt = tv(dx_desc, dx)
    wt = fv(w_desc, w).double()
    r = torch.ops.aten.convolution_backward(tv(dy_desc, dy).double(), torch.zeros(dxt.shape, dtype=torch.float64),
                                            wt, None, stride, pad, dil, False, [0] * len(stride), g,
                                            [True, False, False])[0]
    blend(dxt, r, alpha, beta)


def convolution_backward_filter(handle, alpha, x_desc, x, dy_desc, dy, conv_desc, algo, work_space,
                                work_space_size_in_bytes, beta, dw_desc, dw):
    CALLS.append("conv_bwd_filter")
    stride, pad, dil, g = conv_args(conv_desc)
    dwt = fv(dw_desc, dw)
    r = torch.ops.aten.convolution_backward(tv(dy_desc, dy).double(), tv(x_desc, x).double(),
                                            torch.zeros(dwt.shape, dtype=torch.float64), None, stride, pad, dil,
                                            False, [0] * len(stride), g, [False, True, False])[1]
    blend(dwt, r, alpha, beta)


def transform_tensor(handle, alpha, x_desc, x, beta, y_desc, y):
    CALLS.append("transform")
    blend(tv(y_desc, y), tv(x_desc, x).double(), alpha, beta)


def add_tensor(handle, alpha, a_desc, A, beta, c_desc, C):  # noqa: N803 - the real signature's names
    """C = alpha A + beta C, A broadcast; 16-bit data in float math rounded once (cuDNN's and Tensor.add_'s)."""
    CALLS.append("add_tensor")
    ct, at = tv(c_desc, C), tv(a_desc, A)
    acc = torch.float32 if ct.dtype in (torch.float16, torch.bfloat16) else torch.float64
    ct.copy_((alpha * at.to(acc) + beta * ct.to(acc)).to(ct.dtype))


def convolution_backward_bias(handle, alpha, dy_desc, dy, beta, db_desc, db):
    CALLS.append("conv_bwd_bias")
    d = tv(dy_desc, dy).double()
    dbt = tv(db_desc, db)
    blend(dbt, d.sum([0] + list(range(2, d.dim()))).view(dbt.shape), alpha, beta)


def activation_forward(handle, activation_desc, alpha, x_desc, x, beta, y_desc, y):
    CALLS.append("act_fwd")
    blend(tv(y_desc, y), act_fn(activation_desc)(tv(x_desc, x).double()), alpha, beta)


def activation_backward(handle, activation_desc, alpha, y_desc, y, dy_desc, dy, x_desc, x, beta, dx_desc, dx):
    CALLS.append("act_bwd")
    mode = pydnn.get_activation_descriptor(activation_desc)[0]
    yt, dyt = tv(y_desc, y).double(), tv(dy_desc, dy).double()
    if mode == pydnn.PYDNN_ACTIVATION_SIGMOID:
        g = dyt * yt * (1 - yt)
    elif mode == pydnn.PYDNN_ACTIVATION_TANH:
        g = dyt * (1 - yt * yt)
    elif mode == pydnn.PYDNN_ACTIVATION_RELU:
        g = dyt * (tv(x_desc, x).double() > 0)
    else:
        xt = tv(x_desc, x).double().requires_grad_(True)
        with torch.enable_grad():
            (g,) = torch.autograd.grad(act_fn(activation_desc)(xt), xt, dyt)
    blend(tv(dx_desc, dx), g, alpha, beta)


def _bn_axes(t):
    return [0] + list(range(2, t.dim()))


def batch_normalization_forward_training(handle, mode, alpha, beta, x_desc, x, y_desc, y,
                                         bn_scale_bias_mean_var_desc, bn_scale, bn_bias, exponential_average_factor,
                                         result_running_mean, result_running_variance, epsilon, result_save_mean,
                                         result_save_inv_variance):
    CALLS.append("bn_fwd_train")
    assert mode == pydnn.PYDNN_BATCHNORM_SPATIAL
    xt = tv(x_desc, x).double()
    pd = bn_scale_bias_mean_var_desc
    w, b = tv(pd, bn_scale).double(), tv(pd, bn_bias).double()
    ax = _bn_axes(xt)
    mean = xt.mean(ax, keepdim=True)
    var = xt.var(ax, unbiased=False, keepdim=True)
    n = xt.numel() // xt.shape[1]
    inv = 1 / torch.sqrt(var + epsilon)
    blend(tv(y_desc, y), (xt - mean) * inv * w + b, alpha, beta)
    f = exponential_average_factor
    if result_running_mean is not None:
        rm = tv(pd, result_running_mean)
        rm.copy_(((1 - f) * rm.double() + f * mean).to(rm.dtype))
        rv = tv(pd, result_running_variance)
        rv.copy_(((1 - f) * rv.double() + f * var * n / (n - 1)).to(rv.dtype))
    if result_save_mean is not None:
        tv(pd, result_save_mean).copy_(mean)
        tv(pd, result_save_inv_variance).copy_(inv)


def batch_normalization_forward_inference(handle, mode, alpha, beta, x_desc, x, y_desc, y,
                                          bn_scale_bias_mean_var_desc, bn_scale, bn_bias, estimated_mean,
                                          estimated_variance, epsilon):
    CALLS.append("bn_fwd_inf")
    pd = bn_scale_bias_mean_var_desc
    xt = tv(x_desc, x).double()
    m, v = tv(pd, estimated_mean).double(), tv(pd, estimated_variance).double()
    blend(tv(y_desc, y), (xt - m) / torch.sqrt(v + epsilon) * tv(pd, bn_scale).double() + tv(pd, bn_bias).double(),
          alpha, beta)


def batch_normalization_backward(handle, mode, alpha_data_diff, beta_data_diff, alpha_param_diff, beta_param_diff,
                                 x_desc, x, dy_desc, dy, dx_desc, dx, d_bn_scale_bias_desc, bn_scale,
                                 d_bn_scale_result, d_bn_bias_result, epsilon, saved_mean, saved_inv_variance):
    CALLS.append("bn_bwd")
    pd = d_bn_scale_bias_desc
    xt = tv(x_desc, x).double()
    mean, inv = tv(pd, saved_mean).double(), tv(pd, saved_inv_variance).double()
    # the saved statistics are the forward's (checked against x's own)
    assert torch.allclose(mean, xt.mean(_bn_axes(xt), keepdim=True), atol=1e-5)
    xx = xt.clone().requires_grad_(True)
    w = tv(pd, bn_scale).double().clone().requires_grad_(True)
    b = torch.zeros_like(w, requires_grad=True)
    with torch.enable_grad():
        ax = _bn_axes(xx)
        m = xx.mean(ax, keepdim=True)
        v = xx.var(ax, unbiased=False, keepdim=True)
        out = (xx - m) / torch.sqrt(v + epsilon) * w + b
        gx, gw, gb = torch.autograd.grad(out, (xx, w, b), tv(dy_desc, dy).double())
    blend(tv(dx_desc, dx), gx, alpha_data_diff, beta_data_diff)
    blend(tv(pd, d_bn_scale_result), gw, alpha_param_diff, beta_param_diff)
    blend(tv(pd, d_bn_bias_result), gb, alpha_param_diff, beta_param_diff)


def _norm_compute(nd, xt, w, b):
    kind, groups, ndims, eps = pydnn.get_norm_descriptor(nd)
    if kind == pydnn.PYDNN_NORM_KIND_GROUP:
        xg = xt.reshape(xt.shape[0], groups, -1)
        mean = xg.mean(-1, keepdim=True)
        inv = 1 / torch.sqrt(xg.var(-1, unbiased=False, keepdim=True) + eps)
        y = ((xg - mean) * inv).reshape(xt.shape) * w.reshape((1, -1) + (1,) * (xt.dim() - 2))
        if b is not None:
            y = y + b.reshape((1, -1) + (1,) * (xt.dim() - 2))
        sshape = (xt.shape[0], groups) + (1,) * (xt.dim() - 2)
        return y, mean.reshape(sshape), inv.reshape(sshape)
    axes = list(range(xt.dim() - ndims, xt.dim()))
    if kind == pydnn.PYDNN_NORM_KIND_RMS:
        mean = None
        inv = 1 / torch.sqrt(xt.pow(2).mean(axes, keepdim=True) + eps)
        y = xt * inv
    else:
        mean = xt.mean(axes, keepdim=True)
        inv = 1 / torch.sqrt(xt.var(axes, unbiased=False, keepdim=True) + eps)
        y = (xt - mean) * inv
    y = y * w.reshape(xt.shape[xt.dim() - ndims:])
    if b is not None:
        y = y + b.reshape(xt.shape[xt.dim() - ndims:])
    return y, mean, inv


def norm_forward_training(handle, norm_desc, alpha, beta, x_desc, x, y_desc, y, scale_bias_desc, scale, bias,
                          mean_invstd_desc, result_mean, result_inv_std):
    CALLS.append("norm_fwd")
    xt = tv(x_desc, x).double()
    w = tv(scale_bias_desc, scale).double()
    b = None if bias is None else tv(scale_bias_desc, bias).double()
    out, mean, inv = _norm_compute(norm_desc, xt, w, b)
    blend(tv(y_desc, y), out, alpha, beta)
    if mean is not None:
        tv(mean_invstd_desc, result_mean).copy_(mean.reshape(tv(mean_invstd_desc, result_mean).shape))
    tv(mean_invstd_desc, result_inv_std).copy_(inv.reshape(tv(mean_invstd_desc, result_inv_std).shape))


def get_norm_backward_workspace_size(handle, norm_desc, x_desc, dy_desc, dx_desc, scale_bias_desc, mean_invstd_desc):
    return 64


def norm_backward(handle, norm_desc, alpha_data_diff, beta_data_diff, alpha_param_diff, beta_param_diff, x_desc, x,
                  dy_desc, dy, dx_desc, dx, scale_bias_desc, scale, bias, result_scale_diff, result_bias_diff,
                  mean_invstd_desc, saved_mean, saved_inv_std, workspace, workspace_size_in_bytes):
    CALLS.append("norm_bwd")
    ws_check(workspace, workspace_size_in_bytes)
    xt = tv(x_desc, x).double().clone().requires_grad_(True)
    w = tv(scale_bias_desc, scale).double().clone().requires_grad_(True)
    b = None if bias is None else tv(scale_bias_desc, bias).double().clone().requires_grad_(True)
    with torch.enable_grad():
        out, _, inv = _norm_compute(norm_desc, xt, w, b)
        assert torch.allclose(inv.reshape(-1), tv(mean_invstd_desc, saved_inv_std).double().reshape(-1), rtol=1e-4)
        grads = torch.autograd.grad(out, [t for t in (xt, w, b) if t is not None], tv(dy_desc, dy).double())
    blend(tv(dx_desc, dx), grads[0], alpha_data_diff, beta_data_diff)
    blend(tv(scale_bias_desc, result_scale_diff), grads[1], alpha_param_diff, beta_param_diff)
    if b is not None:
        blend(tv(scale_bias_desc, result_bias_diff), grads[2], alpha_param_diff, beta_param_diff)
    else:
        assert result_bias_diff is None


def _pool(pd, xt):
    mode, nan, nb, win, pad, stride = pydnn.get_pooling_nd_descriptor(pd, 2)
    if mode == pydnn.PYDNN_POOLING_MAX:
        return F.max_pool2d(xt, win, stride, pad)
    return F.avg_pool2d(xt, win, stride, pad, count_include_pad=mode == pydnn.PYDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING)


def pooling_forward(handle, pooling_desc, alpha, x_desc, x, beta, y_desc, y):
    CALLS.append("pool_fwd")
    blend(tv(y_desc, y), _pool(pooling_desc, tv(x_desc, x).double()), alpha, beta)


def pooling_backward(handle, pooling_desc, alpha, y_desc, y, dy_desc, dy, x_desc, x, beta, dx_desc, dx):
    CALLS.append("pool_bwd")
    xt = tv(x_desc, x).double().clone().requires_grad_(True)
    with torch.enable_grad():
        out = _pool(pooling_desc, xt)
        assert torch.allclose(out, tv(y_desc, y).double())
        (g,) = torch.autograd.grad(out, xt, tv(dy_desc, dy).double())
    blend(tv(dx_desc, dx), g, alpha, beta)


def adaptive_pooling_forward(handle, mode, maxpooling_nan_opt, alpha, x_desc, x, beta, y_desc, y):
    CALLS.append("apool_fwd")
    yt = tv(y_desc, y)
    blend(yt, F.adaptive_avg_pool2d(tv(x_desc, x).double(), yt.shape[2:]), alpha, beta)


def adaptive_pooling_backward(handle, mode, maxpooling_nan_opt, alpha, y_desc, y, dy_desc, dy, x_desc, x, beta,
                              dx_desc, dx):
    CALLS.append("apool_bwd")
    xt = tv(x_desc, x).double().clone().requires_grad_(True)
    with torch.enable_grad():
        out = F.adaptive_avg_pool2d(xt, tv(y_desc, y).shape[2:])
        (g,) = torch.autograd.grad(out, xt, tv(dy_desc, dy).double())
    blend(tv(dx_desc, dx), g, alpha, beta)


def softmax_forward(handle, algo, mode, alpha, x_desc, x, beta, y_desc, y):
    CALLS.append("softmax_fwd")
    assert mode == pydnn.PYDNN_SOFTMAX_MODE_CHANNEL
    fn = F.log_softmax if algo == pydnn.PYDNN_SOFTMAX_LOG else F.softmax
    blend(tv(y_desc, y), fn(tv(x_desc, x).double(), 1), alpha, beta)


def softmax_backward(handle, algo, mode, alpha, y_desc, y, dy_desc, dy, beta, dx_desc, dx):
    CALLS.append("softmax_bwd")
    yt, dyt = tv(y_desc, y).double(), tv(dy_desc, dy).double()
    if algo == pydnn.PYDNN_SOFTMAX_LOG:
        g = dyt - yt.exp() * dyt.sum(1, keepdim=True)
    else:
        g = yt * (dyt - (dyt * yt).sum(1, keepdim=True))
    blend(tv(dx_desc, dx), g, alpha, beta)


_DROP = {}


def dropout_get_states_size(handle):
    return 64


def set_dropout_descriptor(dropout_desc, handle, dropout, states, state_size_in_bytes, seed):
    st = _DROP.setdefault(id(dropout_desc), {})
    st["p"] = dropout
    if states is not None:
        assert state_size_in_bytes >= pydnn.ops.dropout.dropout_get_states_size(handle) if not isinstance(
            handle, str) else state_size_in_bytes > 0
        st["gen"] = torch.Generator().manual_seed(seed)


def dropout_get_reserve_space_size(xdesc):
    return math.prod(pydnn.get_tensor_nd_descriptor(xdesc, 8)[2])


_MASKS = {}  # reserve-space address -> mask (pydnn's reserve space is 1 bit per element: not written here)


def dropout_forward(handle, dropout_desc, xdesc, x, ydesc, y, reserve_space, reserve_space_size_in_bytes):
    CALLS.append("dropout_fwd")
    st = _DROP[id(dropout_desc)]
    xt = tv(xdesc, x)
    assert reserve_space_size_in_bytes >= (xt.numel() + 7) // 8
    keep = torch.rand(xt.shape, generator=st["gen"]) >= st["p"]
    _MASKS[reserve_space] = keep
    tv(ydesc, y).copy_(torch.where(keep, xt.double() / (1 - st["p"]), 0.0))


def dropout_backward(handle, dropout_desc, dydesc, dy, dxdesc, dx, reserve_space, reserve_space_size_in_bytes):
    CALLS.append("dropout_bwd")
    st = _DROP[id(dropout_desc)]
    dyt = tv(dydesc, dy)
    keep = _MASKS.pop(reserve_space)
    tv(dxdesc, dx).copy_(torch.where(keep, dyt.double() / (1 - st["p"]), 0.0))


def _attn(ad, q, k, v):
    hq, hkv, d, scale, mask, p, seed = pydnn.get_attention_descriptor(ad)
    assert p == 0
    assert q.shape[1] == hq and k.shape[1] == hkv and q.shape[3] == d
    rep = hq // hkv
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = q @ k.transpose(-1, -2) * scale
    if mask == pydnn.PYDNN_ATTN_MASK_CAUSAL_TOP_LEFT:
        sq, sk = s.shape[-2:]
        s = s.masked_fill(torch.ones(sq, sk, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1, keepdim=True)


def get_attention_forward_workspace_size(handle, attn_desc, q_desc, k_desc):
    return 0


def get_attention_backward_workspace_size(handle, attn_desc, q_desc, k_desc):
    return 512


def attention_forward(handle, attn_desc, q_desc, q, k_desc, k, v_desc, v, o_desc, o, stats_desc, stats, seq_lens_q,
                      seq_lens_kv, work_space, work_space_size_in_bytes):
    CALLS.append("attn_fwd")
    for desc in (q_desc, k_desc, v_desc, o_desc):  # the layout rules of pydnn's fused attention
        st = pydnn.get_tensor_nd_descriptor(desc, 4)[3]
        assert st[3] == 1 and all(s % 8 == 0 for s in st[:3]), st
    out, lse = _attn(attn_desc, *(tv(dd, p).double() for dd, p in ((q_desc, q), (k_desc, k), (v_desc, v))))
    tv(o_desc, o).copy_(out)
    tv(stats_desc, stats).copy_(lse)


def attention_backward(handle, attn_desc, q_desc, q, k_desc, k, v_desc, v, o_desc, o, d_o_desc, d_o, stats_desc,
                       stats, d_q_desc, d_q, d_k_desc, d_k, d_v_desc, d_v, seq_lens_q, seq_lens_kv, deterministic,
                       work_space, work_space_size_in_bytes):
    CALLS.append("attn_bwd")
    ws_check(work_space, work_space_size_in_bytes)
    ts = [tv(dd, p).double().clone().requires_grad_(True) for dd, p in ((q_desc, q), (k_desc, k), (v_desc, v))]
    with torch.enable_grad():
        out, lse = _attn(attn_desc, *ts)
        assert torch.allclose(lse, tv(stats_desc, stats).double(), atol=1e-4)
        grads = torch.autograd.grad(out, ts, tv(d_o_desc, d_o).double())
    for (dd, p), g in zip(((d_q_desc, d_q), (d_k_desc, d_k), (d_v_desc, d_v)), grads):
        tv(dd, p).copy_(g)


# ---- RNN: the reference is PyTorch's own nn.LSTM / GRU / RNN in float64, its weights read from the weight
# space at the addresses pydnn's real GetRNNWeightParams gives (so the bridge's flat layout is checked
# against pydnn's), the forward's inputs kept per reserve space for the backward calls
_RNN_STASH = {}
_RNN_CELLS = {pydnn.PYDNN_LSTM: ("LSTM", 4), pydnn.PYDNN_GRU: ("GRU", 3), pydnn.PYDNN_RNN_TANH: ("tanh", 1),
              pydnn.PYDNN_RNN_RELU: ("relu", 1)}


def _real_rnn(name, handle, *args):
    """A real pydnn RNN query on a CPU-only handle (the emulated mode's handle is a stand-in string)."""
    fn = getattr(pydnn.ops.rnn, name)
    return fn(cpu_handle() if isinstance(handle, str) else handle, *args)


def get_rnn_weight_space_size(handle, rnn_desc):
    return _real_rnn("get_rnn_weight_space_size", handle, rnn_desc)


def get_rnn_temp_space_sizes(handle, rnn_desc, fwd_mode, x_desc):
    return _real_rnn("get_rnn_temp_space_sizes", handle, rnn_desc, fwd_mode, x_desc)


def get_rnn_weight_params(handle, rnn_desc, pseudo_layer, weight_space_size, weight_space, lin_layer_id, m_desc,
                          b_desc):
    return _real_rnn("get_rnn_weight_params", handle, rnn_desc, pseudo_layer, weight_space_size, weight_space,
                     lin_layer_id, m_desc, b_desc)


def _rnn_ref(handle, rd, wsize, w):
    """(module, {param name: (pseudo-layer, kind, [linLayerIDs])}) of the RNN descriptor, its weights read
    from the weight space at w."""
    (algo, cell, bias_mode, dir_mode, input_mode, dt, mp, mt, isz, hid, proj, layers, drop,
     aux) = pydnn.get_rnn_descriptor_v8(rd)
    name, g = _RNN_CELLS[cell]
    bi = dir_mode == pydnn.PYDNN_BIDIRECTIONAL
    bias = bias_mode == pydnn.PYDNN_RNN_DOUBLE_BIAS
    assert bias or bias_mode == pydnn.PYDNN_RNN_NO_BIAS
    kw = dict(num_layers=layers, bidirectional=bi, bias=bias, dtype=torch.float64)
    if name == "LSTM":
        mod = nn.LSTM(isz, hid, proj_size=proj if proj < hid else 0, **kw)
    elif name == "GRU":
        mod = nn.GRU(isz, hid, **kw)
    else:
        mod = nn.RNN(isz, hid, nonlinearity=name, **kw)
    md, bd = pydnn.create_tensor_descriptor(), pydnn.create_tensor_descriptor()
    parts = {}
    for layer in range(layers):
        for d in range(2 if bi else 1):
            pl, sfx = layer * (2 if bi else 1) + d, f"l{layer}" + ("_reverse" if d else "")
            items = [(f"weight_ih_{sfx}", "m", range(g)), (f"weight_hh_{sfx}", "m", range(g, 2 * g))]
            if proj < hid:
                items.append((f"weight_hr_{sfx}", "m", [8]))
            if bias:
                items += [(f"bias_ih_{sfx}", "b", range(g)), (f"bias_hh_{sfx}", "b", range(g, 2 * g))]
            for pname, kind, lins in items:
                chunks = []
                for lin in lins:
                    ma, ba = get_rnn_weight_params(handle, rd, pl, wsize, w, lin, md, bd)
                    desc = md if kind == "m" else bd
                    chunks.append(tv(desc, ma if kind == "m" else ba).reshape(-1))
                with torch.no_grad():
                    getattr(mod, pname).copy_(torch.cat(chunks).double().view(getattr(mod, pname).shape))
                parts[pname] = (pl, kind, list(lins))
    return mod, parts, dt


def _rnn_data(desc, p):
    """(padded [T, B, vec] view maker, lengths, layout): read / write sequence data in the descriptor's layout."""
    dt, lay, tmax, b, vec, lens, fill = pydnn.get_rnn_data_descriptor(desc, 1 << 20)
    if lay == pydnn.PYDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED:
        mem = view(p, dt, (sum(lens), vec), (vec, 1))
    elif lay == pydnn.PYDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED:
        mem = view(p, dt, (b, tmax, vec), (tmax * vec, vec, 1)).transpose(0, 1)
    else:
        mem = view(p, dt, (tmax, b, vec), (b * vec, vec, 1))
    return mem, list(lens), lay, tmax, b, fill


def _rnn_read(desc, p):
    mem, lens, lay, tmax, b, _ = _rnn_data(desc, p)
    if lay != pydnn.PYDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED:
        return mem.double().clone(), lens
    out = torch.zeros(tmax, b, mem.shape[1], dtype=torch.float64)
    row = 0
    for t in range(tmax):
        for i in range(b):
            if lens[i] > t:
                out[t, i] = mem[row].double()
                row += 1
    return out, lens


def _rnn_write(desc, p, padded, pad_value):
    mem, lens, lay, tmax, b, _ = _rnn_data(desc, p)
    if lay == pydnn.PYDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED:
        row = 0
        for t in range(tmax):
            for i in range(b):
                if lens[i] > t:
                    mem[row] = padded[t, i].to(mem.dtype)
                    row += 1
        return
    valid = (torch.arange(tmax)[:, None] < torch.tensor(lens)[None, :])[:, :, None]
    mem.copy_(torch.where(valid, padded, pad_value).to(mem.dtype))


def _rnn_run(mod, x, lens, h0, c0):
    packed = nn.utils.rnn.pack_padded_sequence(x, torch.tensor(lens), enforce_sorted=False)
    y, st = mod(packed, (h0, c0) if c0 is not None else h0)
    y, _ = nn.utils.rnn.pad_packed_sequence(y, total_length=x.shape[0])
    return (y, st[0], st[1]) if c0 is not None else (y, st, None)


def rnn_forward(handle, rnn_desc, fwd_mode, dev_seq_lengths, x_desc, x, y_desc, y, h_desc, hx, hy, c_desc, cx, cy,
                weight_space_size, weight_space, work_space_size, work_space, reserve_space_size, reserve_space):
    CALLS.append("rnn_fwd_train" if fwd_mode == pydnn.PYDNN_FWD_MODE_TRAINING else "rnn_fwd_inf")
    mod, parts, dt = _rnn_ref(handle, rnn_desc, weight_space_size, weight_space)
    xs, lens = _rnn_read(x_desc, x)
    assert view(dev_seq_lengths, pydnn.PYDNN_DATA_INT32, (len(lens),), (1,)).tolist() == lens
    hshape = pydnn.get_tensor_nd_descriptor(h_desc, 3)[2]
    h0 = tv(h_desc, hx).double().clone() if hx else torch.zeros(hshape, dtype=torch.float64)
    c0 = None
    if mod.mode == "LSTM":
        c0 = tv(c_desc, cx).double().clone() if cx else torch.zeros(pydnn.get_tensor_nd_descriptor(c_desc, 3)[2],
                                                                     dtype=torch.float64)
    with torch.no_grad():
        ys, hys, cys = _rnn_run(mod, xs, lens, h0, c0)
    fill = _rnn_data(y_desc, y)[5]
    _rnn_write(y_desc, y, ys, 0.0 if fill is None else fill)
    if hy:
        tv(h_desc, hy).copy_(hys)
    if cy:
        tv(c_desc, cy).copy_(cys)
    if fwd_mode == pydnn.PYDNN_FWD_MODE_TRAINING:
        assert reserve_space and reserve_space_size > 0
        _RNN_STASH[reserve_space] = dict(mod=mod, parts=parts, x=xs, lens=lens, h0=h0, c0=c0)


def rnn_backward_data_v8(handle, rnn_desc, dev_seq_lengths, y_desc, y, dy, x_desc, dx, h_desc, hx, dhy, dhx, c_desc,
                         cx, dcy, dcx, weight_space_size, weight_space, work_space_size, work_space,
                         reserve_space_size, reserve_space):
    CALLS.append("rnn_bwd_data")
    ws_check(work_space, work_space_size)
    st = _RNN_STASH[reserve_space]
    mod = st["mod"]
    xs, h0, c0 = (t.clone().requires_grad_(True) if t is not None else None for t in (st["x"], st["h0"], st["c0"]))
    with torch.enable_grad():
        ys, hys, cys = _rnn_run(mod, xs, st["lens"], h0, c0)
        dys, _ = _rnn_read(y_desc, dy)
        loss = (ys * dys).sum()
        if dhy:
            loss = loss + (hys * tv(h_desc, dhy).double()).sum()
        if dcy:
            loss = loss + (cys * tv(c_desc, dcy).double()).sum()
        ins = [xs, h0] + ([c0] if c0 is not None else [])
        params = list(mod.parameters())
        grads = torch.autograd.grad(loss, ins + params, allow_unused=True)
    _rnn_write(x_desc, dx, grads[0], 0.0)
    if dhx:
        tv(h_desc, dhx).copy_(grads[1])
    if dcx:
        tv(c_desc, dcx).copy_(grads[2])
    st["grads"] = dict(zip([n for n, _ in mod.named_parameters()], grads[len(ins):]))


def rnn_backward_weights_v8(handle, rnn_desc, add_grad, dev_seq_lengths, x_desc, x, h_desc, hx, y_desc, y,
                            weight_space_size, dweight_space, work_space_size, work_space, reserve_space_size,
                            reserve_space):
    CALLS.append("rnn_bwd_weights")
    ws_check(work_space, work_space_size)
    assert add_grad == pydnn.PYDNN_WGRAD_MODE_ADD
    st = _RNN_STASH.pop(reserve_space)
    md, bd = pydnn.create_tensor_descriptor(), pydnn.create_tensor_descriptor()
    for pname, (pl, kind, lins) in st["parts"].items():
        g = st["grads"][pname].reshape(len(lins), -1)
        for i, lin in enumerate(lins):
            ma, ba = get_rnn_weight_params(handle, rnn_desc, pl, weight_space_size, dweight_space, lin, md, bd)
            desc, addr = (md, ma) if kind == "m" else (bd, ba)
            t = tv(desc, addr)
            t.copy_((t.double() + g[i].view(t.shape)).to(t.dtype))


FAKES = [v for k, v in list(globals().items()) if callable(v) and getattr(pydnn, k, None) is not None
         and k not in ("view",) and not k.startswith("_") and inspect.isfunction(v) and v.__module__ == __name__]


def test_fakes_have_the_real_signatures():
    assert len(FAKES) > 30
    for f in FAKES:
        real = getattr(pydnn, f.__name__)
        assert inspect.signature(f) == inspect.signature(real), f.__name__


class _NoKernels(dict):
    """Kernel table of a CPU-only handle (as tests/test_fuzz_cpu.py's): a lookup fails before the driver."""

    def get(self, key, default=None):
        raise pydnn.PydnnError(pydnn.PYDNN_STATUS_NOT_INITIALIZED, "CPU-only test handle: no kernels")


def cpu_handle():
    from pydnn.handle import Handle
    h = Handle.__new__(Handle)
    h.ctx, h.device, h.arch, h.sm_count, h.stream, h.cu_stream, h.alive = None, 0, "sm_90", 132, 0, None, True
    h._funcs, h.prepared = _NoKernels(), {}
    return h


_QUERIES = ("get_", "dropout_get_")


def _validated(real, fake):
    """The real pydnn function first (every argument check, plan and size computation runs, on an sm_90
    CPU-only handle); where it reaches its kernel lookup (NOT_INITIALIZED from the CPU-only handle) the
    fake computes the result instead. Any other PydnnError is the bridge's fault and fails the test."""
    def call(*args, **kw):
        try:
            out = real(*args, **kw)
        except pydnn.PydnnError as e:
            if e.status != pydnn.PYDNN_STATUS_NOT_INITIALIZED or "CPU-only test handle" not in str(e):
                raise AssertionError(f"pydnn.{real.__name__} refused the bridge's arguments: {e}") from e
            CALLS.append("validated:" + real.__name__)
            out = fake(*args, **kw)
            if real.__name__ == "set_dropout_descriptor":  # the real one stopped at its init kernel
                pydnn.restore_dropout_descriptor(*args, **kw)
            return out
        if real.__name__.startswith(_QUERIES):
            return out
        return fake(*args, **kw)  # a compute call that returned without launching (nothing to do on a GPU)
    call.__name__ = real.__name__
    return call


@pytest.fixture(params=["emulated", "validated"])
def emulated(monkeypatch, request):
    """emulated: every pydnn call the bridge makes is a fake. validated: the real call runs first (its
    validation and planning on a CPU-only sm_90 handle) and the fake only computes the outputs."""
    validated = request.param == "validated"
    for f in FAKES:
        real = getattr(pydnn, f.__name__)
        timed = f.__name__.startswith("find_")  # Find times kernels (needs the driver): the fake answers
        monkeypatch.setattr(pydnn, f.__name__, _validated(real, f) if validated and not timed else f)
    h = cpu_handle() if validated else "handle"
    # the same on a machine with a GPU (the lead's GPU runs execute these tests too): the bridge never sees
    # CUDA -- no real handle is made or used (handle_for answers the stand-in), the caches keyed by handle
    # or device start empty and are restored, and host pointers are not checked against device allocations
    # (PYDNN_CHECKED=1 would ask the driver about them)
    handles = dict(C._handles)
    monkeypatch.setattr(C, "handle_for", lambda device: h)
    monkeypatch.setattr(C, "on_cuda", lambda *ts: True)
    monkeypatch.setattr(C, "device_index", lambda device: 0)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(C, "_current_stream", lambda idx: 7)  # the stream a workspace is kept for
    monkeypatch.setattr(C, "_ws", {})
    monkeypatch.setattr(PF, "_conv_plans", {})
    monkeypatch.setattr(PF, "_sizes", C.BoundedDict())
    monkeypatch.setattr(PF, "_attn_plans", C.BoundedDict())
    monkeypatch.setattr(PF, "_specs", C.BoundedDict())
    monkeypatch.setattr(PF, "_linear_descs", C.BoundedDict())
    monkeypatch.setattr(PF, "_splitk_plans", C.BoundedDict())
    monkeypatch.setattr(PF, "_recs", C.BoundedDict())
    monkeypatch.setattr(PF, "_dw_plans", C.BoundedDict())
    monkeypatch.setattr(PF, "_functional_dropout_state", PF.DropoutState())
    monkeypatch.setattr(pydnn.buffers, "CHECKED", False)
    CALLS.clear()
    pt.benchmark = False
    yield CALLS
    pt.benchmark = False
    assert C._handles == handles, "an emulated test made or replaced a real handle"


def no_fallback(fn):
    before = dict(pt.fallbacks)
    out = fn()
    new = {r: n - before.get(r, 0) for r, n in pt.fallbacks.items() if n != before.get(r, 0)}
    assert not new, f"fell back: {new}"
    return out


def check(mine, ref, x, atol=1e-5, rtol=1e-4):
    """Forward / backward of module `mine` (pydnn path, emulated) against PyTorch's `ref` on x (float64
    reference copies)."""
    x = x.detach().requires_grad_(True)
    xr = x.detach().clone().requires_grad_(True)
    y = no_fallback(lambda: mine(x))
    yr = ref(xr)
    torch.testing.assert_close(y, yr, atol=atol, rtol=rtol)
    assert y.stride() == yr.stride() or not yr.is_contiguous(), (y.stride(), yr.stride())
    dy = torch.randn_like(yr)
    no_fallback(lambda: y.backward(dy))
    yr.backward(dy)
    torch.testing.assert_close(x.grad, xr.grad, atol=atol, rtol=rtol)
    for (n, p), (_, pr) in zip(mine.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p.grad, pr.grad, atol=atol, rtol=rtol, msg=n)
    return y


def make(pcls, tcls, *args, **kw):
    torch.manual_seed(0)
    ref = tcls(*args, **kw)
    mine = pcls(*args, **kw)
    mine.load_state_dict(ref.state_dict())
    return mine, ref


CONVS = [
    (pt.Conv1d, nn.Conv1d, (4, 6, 3), dict(stride=2, padding=1, groups=2), (2, 4, 11)),
    (pt.Conv2d, nn.Conv2d, (3, 8, 3), dict(padding=1), (2, 3, 7, 6)),
    (pt.Conv2d, nn.Conv2d, (4, 8, (3, 5)), dict(stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=4, bias=False),
     (2, 4, 9, 11)),
    (pt.Conv2d, nn.Conv2d, (3, 4, 3), dict(padding="same", padding_mode="reflect"), (1, 3, 6, 6)),
    (pt.Conv3d, nn.Conv3d, (2, 4, 3), dict(padding=1), (1, 2, 5, 4, 5)),
]


@pytest.mark.parametrize("case", CONVS, ids=[str(i) for i in range(len(CONVS))])
@pytest.mark.parametrize("channels_last", [False, True])
def test_conv(emulated, case, channels_last):
    pcls, tcls, args, kw, shape = case
    mine, ref = make(pcls, tcls, *args, **kw)
    x = torch.randn(shape)
    if channels_last and x.dim() == 4:
        mine.to(memory_format=torch.channels_last)
        x = x.to(memory_format=torch.channels_last)
    y = check(mine, ref, x)
    if channels_last and x.dim() == 4:
        assert y.is_contiguous(memory_format=torch.channels_last)
    fused = kw.get("bias", True)
    assert ("conv_fused" if fused else "conv_fwd") in emulated
    assert {"conv_bwd_data", "conv_bwd_filter"} <= set(emulated)
    assert ("conv_bwd_bias" in emulated) == fused


@pytest.mark.parametrize("act", ["relu", "sigmoid", "tanh"])
def test_conv_fused_activation_and_benchmark(emulated, act):
    mine, ref = make(pt.Conv2d, nn.Conv2d, 3, 5, 3, padding=1)
    mine.activation = act
    pt.benchmark = True
    check(mine, nn.Sequential(ref, {"relu": nn.ReLU(), "sigmoid": nn.Sigmoid(), "tanh": nn.Tanh()}[act]),
          torch.randn(2, 3, 6, 7))
    assert {"find_fwd", "find_bwd_data", "find_bwd_filter", "conv_fused", "act_bwd"} <= set(emulated)


def test_validated_mode_reaches_the_real_kernels(emulated, request):
    """In validated mode each compute call passed every real check and stopped at its kernel lookup."""
    mine, ref = make(pt.Conv2d, nn.Conv2d, 16, 32, 3, padding=1)
    mine.bfloat16().to(memory_format=torch.channels_last)
    x = torch.randn(2, 16, 8, 8).bfloat16().to(memory_format=torch.channels_last).requires_grad_(True)
    no_fallback(lambda: mine(x).sum().backward())
    if request.node.callspec.params["emulated"] == "validated":
        assert {"validated:convolution_bias_activation_forward", "validated:convolution_backward_data",
                "validated:convolution_backward_filter", "validated:convolution_backward_bias"} <= set(emulated)


def test_conv_plan_cache(emulated):
    mine, _ = make(pt.Conv2d, nn.Conv2d, 3, 4, 3)
    x = torch.randn(2, 3, 8, 8)
    mine(x), mine(x)
    assert len(PF._conv_plans) == 1
    mine(torch.randn(1, 3, 8, 8))
    assert len(PF._conv_plans) == 2


def test_conv_under_autocast_casts_like_torch(emulated):
    mine, ref = make(pt.Conv2d, nn.Conv2d, 3, 4, 3)
    x = torch.randn(2, 3, 6, 6)
    monkey_ac = torch.bfloat16
    orig = C.autocast_dtype
    C.autocast_dtype = lambda: monkey_ac  # CPU autocast is not CUDA autocast: emulate the CUDA flag
    try:
        y = no_fallback(lambda: mine(x))
    finally:
        C.autocast_dtype = orig
    assert y.dtype == torch.bfloat16
    want = F.conv2d(x.bfloat16().double(), ref.weight.bfloat16().double(), ref.bias.bfloat16().double())
    torch.testing.assert_close(y.double(), want, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("case", [
    (pt.BatchNorm2d, nn.BatchNorm2d, (5,), dict(momentum=0.3), (4, 5, 3, 3)),
    (pt.BatchNorm2d, nn.BatchNorm2d, (5,), dict(momentum=None), (4, 5, 3, 3)),
    (pt.BatchNorm1d, nn.BatchNorm1d, (6,), dict(), (8, 6)),
    (pt.BatchNorm1d, nn.BatchNorm1d, (6,), dict(affine=False), (8, 6, 5)),
    (pt.BatchNorm2d, nn.BatchNorm2d, (5,), dict(track_running_stats=False), (4, 5, 3, 3)),
])
def test_batch_norm(emulated, case):
    pcls, tcls, args, kw, shape = case
    mine, ref = make(pcls, tcls, *args, **kw)
    for _ in range(3):
        mine.zero_grad(), ref.zero_grad()
        check(mine, ref, torch.randn(shape))
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(mine.state_dict()[k], v, msg=k)
    mine.eval(), ref.eval()
    mine.zero_grad(), ref.zero_grad()
    check(mine, ref, torch.randn(shape))
    assert "bn_bwd" in emulated and "bn_fwd_train" in emulated
    if kw.get("track_running_stats", True):
        assert "bn_fwd_inf" in emulated


def test_batch_norm_channels_last(emulated):
    mine, ref = make(pt.BatchNorm2d, nn.BatchNorm2d, 6)
    y = check(mine, ref, torch.randn(3, 6, 4, 5).to(memory_format=torch.channels_last))
    assert y.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("case", [
    (pt.LayerNorm, nn.LayerNorm, ((4, 6),), dict(eps=1e-6), (3, 4, 6)),
    (pt.LayerNorm, nn.LayerNorm, (6,), dict(bias=False), (3, 6)),
    (pt.LayerNorm, nn.LayerNorm, (6,), dict(elementwise_affine=False), (2, 3, 6)),
    (pt.GroupNorm, nn.GroupNorm, (2, 6), dict(), (3, 6, 4, 4)),
    (pt.GroupNorm, nn.GroupNorm, (3, 6), dict(affine=False), (3, 6, 5)),
    (pt.RMSNorm, nn.RMSNorm, (8,), dict(eps=1e-5), (3, 5, 8)),
    (pt.RMSNorm, nn.RMSNorm, (8,), dict(), (3, 5, 8)),
], ids=["ln2", "ln-nobias", "ln-noaffine", "gn", "gn-noaffine", "rms", "rms-eps-none"])
def test_norms(emulated, case):
    pcls, tcls, args, kw, shape = case
    mine, ref = make(pcls, tcls, *args, **kw)
    check(mine, ref, torch.randn(shape))
    check(mine, ref, torch.randn(shape[::-1]).permute(*range(len(shape) - 1, -1, -1)))  # non-contiguous
    assert "norm_fwd" in emulated and "norm_bwd" in emulated


@pytest.mark.parametrize("case", [(pt.ReLU, nn.ReLU, {}), (pt.GELU, nn.GELU, {}),
                                  (pt.GELU, nn.GELU, dict(approximate="tanh")), (pt.SiLU, nn.SiLU, {}),
                                  (pt.Sigmoid, nn.Sigmoid, {}), (pt.Tanh, nn.Tanh, {})])
def test_activations(emulated, case):
    pcls, tcls, kw = case
    x = torch.randn(4, 6, 5)
    check(pcls(**kw), tcls(**kw), x)
    y = check(pcls(**kw), tcls(**kw), x.transpose(0, 2))
    assert y.stride() == x.transpose(0, 2).stride()  # strided in, the same strides out (no copy)
    check(pcls(**kw), tcls(**kw), torch.randn(4, 1).expand(4, 6))  # broadcast: materialised


@pytest.mark.parametrize("case", [
    (pt.MaxPool2d, nn.MaxPool2d, (2,), {}), (pt.MaxPool2d, nn.MaxPool2d, (3,), dict(stride=2, padding=1)),
    (pt.AvgPool2d, nn.AvgPool2d, (3,), dict(stride=2, padding=1)),
    (pt.AvgPool2d, nn.AvgPool2d, (3,), dict(stride=1, padding=1, count_include_pad=False)),
    (pt.AdaptiveAvgPool2d, nn.AdaptiveAvgPool2d, (1,), {}),
    (pt.AdaptiveAvgPool2d, nn.AdaptiveAvgPool2d, ((5, None),), {}),
])
@pytest.mark.parametrize("channels_last", [False, True])
def test_pooling(emulated, case, channels_last):
    pcls, tcls, args, kw = case
    x = torch.randn(2, 3, 9, 8)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    y = check(pcls(*args, **kw), tcls(*args, **kw), x)
    if channels_last:
        assert y.is_contiguous(memory_format=torch.channels_last)


def test_pooling_unsupported_falls_back(emulated):
    x = torch.randn(1, 2, 7, 7)
    before = sum(pt.fallbacks.values())
    torch.testing.assert_close(pt.MaxPool2d(2, ceil_mode=True)(x), F.max_pool2d(x, 2, ceil_mode=True))
    y, idx = pt.MaxPool2d(2, return_indices=True)(x)
    assert idx.dtype == torch.int64
    assert sum(pt.fallbacks.values()) == before + 2
    assert any("ceil_mode" in r for r in pt.fallbacks) and any("return_indices" in r for r in pt.fallbacks)


def test_dropout(emulated):
    torch.manual_seed(1)
    m = pt.Dropout(0.25)
    x = (torch.rand(40, 50) + 0.5).requires_grad_(True)
    y = no_fallback(lambda: m(x))
    keep = y != 0
    assert 0.15 < 1 - keep.float().mean().item() < 0.35
    torch.testing.assert_close(y[keep], x[keep] / 0.75)
    dy = torch.randn(40, 50)
    y.backward(dy)
    torch.testing.assert_close(x.grad, torch.where(keep, dy / 0.75, 0.0))
    m.p = 0.5  # p changes without a new descriptor
    y2 = m(x.detach())
    assert 0.4 < 1 - (y2 != 0).float().mean().item() < 0.6
    assert "dropout_bwd" in emulated


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_softmax(emulated, log, dim):
    x = torch.randn(3, 5, 4).transpose(0, 1)
    mine = pt.LogSoftmax(dim) if log else pt.Softmax(dim)
    ref = nn.LogSoftmax(dim) if log else nn.Softmax(dim)
    check(mine, ref, x)
    assert "softmax_bwd" in emulated


def _sdpa_ref(q, k, v, causal, gqa):
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2)])
def test_sdpa(emulated, causal, heads):
    torch.manual_seed(2)
    hq, hkv = heads
    qkv = torch.randn(2, 24, hq + 2 * hkv, 64).bfloat16()
    q, k, v = qkv.split([hq, hkv, hkv], 2)  # (B, S, H, D) slices of one projection
    q, k, v = (t.transpose(1, 2).detach().requires_grad_(True) for t in (q, k, v))
    o = no_fallback(lambda: pt.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=hq != hkv))
    assert o.dtype == torch.bfloat16 and o.shape == q.shape
    assert o.transpose(1, 2).is_contiguous()  # O is BSHD in memory: the reshape after it is free
    qr, kr, vr = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    orf = _sdpa_ref(qr, kr, vr, causal, hq != hkv)
    torch.testing.assert_close(o.double(), orf, atol=2e-2, rtol=2e-2)
    do = torch.randn_like(orf)
    no_fallback(lambda: o.backward(do.bfloat16()))
    orf.backward(do)
    for t, r in zip((q, k, v), (qr, kr, vr)):
        torch.testing.assert_close(t.grad.double(), r.grad, atol=3e-2, rtol=3e-2)


def test_sdpa_unsupported_falls_back(emulated):
    q = torch.randn(1, 2, 8, 32).bfloat16()
    before = sum(pt.fallbacks.values())
    pt.scaled_dot_product_attention(q, q, q)  # head dim 32
    pt.scaled_dot_product_attention(q.float(), q.float(), q.float())  # fp32
    m = torch.ones(8, 8, dtype=torch.bool)
    q64 = torch.randn(1, 2, 8, 64).bfloat16()
    pt.scaled_dot_product_attention(q64, q64, q64, attn_mask=m)
    assert sum(pt.fallbacks.values()) == before + 3


@pytest.mark.parametrize("self_attention", [True, False])
def test_multihead_attention(emulated, self_attention):
    torch.manual_seed(3)
    mine, ref = make(pt.MultiheadAttention, nn.MultiheadAttention, 128, 2, batch_first=True)
    mine.bfloat16(), ref.bfloat16()
    x = torch.randn(2, 10, 128).bfloat16()
    kv = x if self_attention else torch.randn(2, 7, 128).bfloat16()
    y, w = no_fallback(lambda: mine(x, kv, kv, need_weights=False))
    yr, _ = ref(x, kv, kv, need_weights=False)
    assert w is None
    torch.testing.assert_close(y.double(), yr.double(), atol=3e-2, rtol=3e-2)
    assert "attn_fwd" in emulated


def test_convert_cnn_train_step(emulated):
    def cnn():
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))
    torch.manual_seed(4)
    model, ref = cnn(), cnn()
    ref.load_state_dict(model.state_dict())
    pt.convert(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt_r = torch.optim.SGD(ref.parameters(), lr=0.1)
    for _ in range(3):
        x, t = torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,))
        loss = no_fallback(lambda: F.cross_entropy(model(x), t))
        loss_r = F.cross_entropy(ref(x), t)
        torch.testing.assert_close(loss, loss_r, atol=1e-5, rtol=1e-4)
        opt.zero_grad(), opt_r.zero_grad()
        loss.backward(), loss_r.backward()
        opt.step(), opt_r.step()
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(model.state_dict()[k], v, atol=1e-5, rtol=1e-4, msg=k)


# ---------------------------------------------------------------------------------- the demos' models
def _examples():
    import importlib
    import os
    import sys
    d = os.path.join(os.path.dirname(__file__), "..", "..", "examples")
    sys.path.insert(0, os.path.abspath(d))
    try:
        return importlib.import_module("train_gpt"), importlib.import_module("train_cnn")
    finally:
        sys.path.pop(0)


def test_demo_models_run_pydnn_end_to_end(emulated, monkeypatch):
    """The demos' pydnn models under bf16 autocast (CUDA autocast's dtype choice emulated, CPU autocast
    for PyTorch's own Linear): every supported op goes to pydnn, and loss and gradients match the PyTorch
    model's within bf16 tolerance."""
    import argparse
    gpt, cnn = _examples()
    monkeypatch.setattr(C, "autocast_dtype", lambda: torch.bfloat16)
    args = argparse.Namespace(d_model=128, n_head=2, n_kv_head=1, seq=32, n_layer=2, norm="rms", dropout=0.0)
    torch.manual_seed(5)
    ref = gpt.GPT(args, "torch", gpt.torch_attention("default"))
    mine = gpt.GPT(args, "pydnn", pt.scaled_dot_product_attention)
    mine.load_state_dict(ref.state_dict())
    x = torch.randint(0, 256, (3, 32))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = no_fallback(lambda: F.cross_entropy(mine(x).float().view(-1, 256), x.view(-1)))
        loss_r = F.cross_entropy(ref(x).float().view(-1, 256), x.view(-1))
    torch.testing.assert_close(loss, loss_r, atol=2e-2, rtol=2e-2)
    no_fallback(loss.backward)
    loss_r.backward()
    for (n, p), pr in zip(mine.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, pr.grad, atol=3e-2 * pr.grad.abs().max().item() + 1e-6, rtol=0, msg=n)
    assert {"attn_fwd", "attn_bwd", "norm_fwd", "norm_bwd", "act_fwd", "act_bwd"} <= set(emulated)

    torch.manual_seed(6)
    ref, mine = cnn.build("torch"), cnn.build("pydnn")
    mine.load_state_dict(ref.state_dict())
    x = torch.randn(4, 3, 32, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = no_fallback(lambda: mine(x))
        out_r = ref(x)
    assert out.dtype == out_r.dtype
    torch.testing.assert_close(out.float(), out_r.float(), atol=5e-2, rtol=5e-2)


# ------------------------------------------------------------------ Linear on the public pydnn.matmul
def matmul(handle, alpha, a_desc, A, b_desc, B, beta, c_desc, C):  # noqa: N803 - the graph API's signature
    """pydnn.matmul as the graph API (pydnn/graph/matmul_api.py) declares it: C = alpha A @ B + beta C, 2-d or
    3-d descriptors, transposes as strides."""
    CALLS.append("matmul")
    a, b, c = tv(a_desc, A), tv(b_desc, B), tv(c_desc, C)
    for t in (a, b):
        assert 1 in t.stride()[-2:], f"matmul operands are row- or column-major, got strides {t.stride()}"
    blend(c, a.double() @ b.double(), alpha, beta)


_MATMUL_SIG = "(handle, alpha, a_desc, A, b_desc, B, beta, c_desc, C)"


def matmul_ex(handle, alpha, a_desc, A, b_desc, B, beta, c_desc, C, work_space, work_space_size_in_bytes):  # noqa
    """pydnn.matmul_ex: the same product as matmul (the workspace only splits K on the GPU); recorded as
    "matmul" so that the call patterns the tests assert do not depend on the workspace query."""
    matmul(handle, alpha, a_desc, A, b_desc, B, beta, c_desc, C)


def get_matmul_ex_workspace_size(handle, a_desc, b_desc, c_desc):
    """The split-K workspace a GPU plan may ask for; the emulation sums in float64 and needs none (so the
    bridge calls matmul, not matmul_ex)."""
    CALLS.append("get_matmul_ex_workspace_size")
    return 0
# defined after FAKES was collected: added by hand (as the batch-norm Ex fakes below) once pydnn has the
# public matmul (merged with the graph API): without it, pt.Linear in the converted models / demos reached the
# real pydnn.matmul with the emulated handle ("not a live handle") or the CPU-only one ("no kernels")
if hasattr(pydnn, "matmul"):
    FAKES.append(matmul)
    FAKES.append(get_matmul_ex_workspace_size)
    FAKES.append(matmul_ex)


def test_matmul_fake_signature():
    assert str(inspect.signature(matmul)) == _MATMUL_SIG
    if hasattr(pydnn, "matmul"):  # once the graph API is merged: the real one must match
        assert str(inspect.signature(pydnn.matmul)) == _MATMUL_SIG
        assert str(inspect.signature(pydnn.get_matmul_ex_workspace_size)) == str(
            inspect.signature(get_matmul_ex_workspace_size))


@pytest.mark.parametrize("bias", [True, False])
def test_linear_on_pydnn_matmul(emulated, monkeypatch, bias):
    monkeypatch.setattr(pydnn, "matmul", matmul, raising=False)
    mine, ref = make(pt.Linear, nn.Linear, 12, 7, bias=bias)
    check(mine, ref, torch.randn(3, 5, 12))
    check(mine, ref, torch.randn(12, 5, 3).transpose(0, 2))  # non-contiguous input
    assert emulated.count("matmul") >= 6
    monkeypatch.setattr(pt, "linear_on_pydnn", False)
    emulated.clear()
    check(mine, ref, torch.randn(3, 12))
    assert "matmul" not in emulated


def test_linear_asks_the_matmul_workspace_once_per_problem(emulated, monkeypatch):
    """The split-K workspace size of a (handle, descriptors) problem is asked once (descriptors are cached and
    never changed), not at every forward / backward: a second step of the same shapes asks nothing."""
    asked = []
    query = pydnn.get_matmul_ex_workspace_size  # the fake (emulated) or the real query (validated)

    def counted(*a):
        asked.append(a[1:])
        return query(*a)
    monkeypatch.setattr(pydnn, "get_matmul_ex_workspace_size", counted)
    mine, ref = make(pt.Linear, nn.Linear, 12, 7)
    x = torch.randn(5, 12)
    check(mine, ref, x)
    assert len(asked) >= 2  # dx and dW (and the forward, where it runs on pydnn.matmul)
    asked.clear(), emulated.clear()
    check(mine, ref, x)
    assert emulated.count("matmul") >= 2 and not asked
    check(mine, ref, torch.randn(6, 12))  # another M: other descriptors, asked again
    assert asked


def test_linear_without_pydnn_matmul_is_torch(emulated, monkeypatch):
    monkeypatch.delattr(pydnn, "matmul", raising=False)
    mine, ref = make(pt.Linear, nn.Linear, 6, 4)
    check(mine, ref, torch.randn(2, 6))
    assert "matmul" not in emulated


# ------------------------------------------------------------------------ batch norm + ReLU (Ex form)
def get_batch_normalization_forward_training_ex_workspace_size(handle, mode, bn_ops, x_desc, z_desc, y_desc,
                                                               bn_scale_bias_mean_var_desc, activation_desc):
    return 96


def get_batch_normalization_training_ex_reserve_space_size(handle, mode, bn_ops, activation_desc, x_desc):
    return math.prod(pydnn.get_tensor_nd_descriptor(x_desc, 8)[2])


def get_batch_normalization_backward_ex_workspace_size(handle, mode, bn_ops, x_desc, y_desc, dy_desc, dz_desc,
                                                       dx_desc, d_bn_scale_bias_desc, activation_desc):
    return 32


def _bytes(p, n):
    return torch.from_numpy(np.frombuffer((ctypes.c_char * n).from_address(p), dtype=np.uint8))


def batch_normalization_forward_training_ex(handle, mode, bn_ops, alpha, beta, x_desc, x_data, z_desc, z_data,
                                            y_desc, y_data, bn_scale_bias_mean_var_desc, bn_scale, bn_bias,
                                            exponential_average_factor, result_running_mean,
                                            result_running_variance, epsilon, result_save_mean,
                                            result_save_inv_variance, activation_desc, workspace,
                                            work_space_size_in_bytes, reserve_space, reserve_space_size_in_bytes):
    CALLS.append("bn_fwd_train_ex")
    assert bn_ops == pydnn.PYDNN_BATCHNORM_OPS_BN_ACTIVATION and z_desc is None and z_data is None
    assert pydnn.get_activation_descriptor(activation_desc)[0] == pydnn.PYDNN_ACTIVATION_RELU
    ws_check(workspace, work_space_size_in_bytes)
    batch_normalization_forward_training(handle, mode, alpha, beta, x_desc, x_data, y_desc, y_data,
                                         bn_scale_bias_mean_var_desc, bn_scale, bn_bias, exponential_average_factor,
                                         result_running_mean, result_running_variance, epsilon, result_save_mean,
                                         result_save_inv_variance)
    y = tv(y_desc, y_data)
    _bytes(reserve_space, reserve_space_size_in_bytes).copy_((y > 0).reshape(-1).to(torch.uint8))
    y.copy_(F.relu(y))


def batch_normalization_backward_ex(handle, mode, bn_ops, alpha_data_diff, beta_data_diff, alpha_param_diff,
                                    beta_param_diff, x_desc, x_data, y_desc, y_data, dy_desc, dy_data, dz_desc,
                                    dz_data, dx_desc, dx_data, d_bn_scale_bias_desc, bn_scale_data, bn_bias_data,
                                    d_bn_scale_data, d_bn_bias_data, epsilon, saved_mean, saved_inv_variance,
                                    activation_desc, work_space, work_space_size_in_bytes, reserve_space,
                                    reserve_space_size_in_bytes):
    CALLS.append("bn_bwd_ex")
    ws_check(work_space, work_space_size_in_bytes)
    dy = tv(dy_desc, dy_data)
    mask = _bytes(reserve_space, reserve_space_size_in_bytes).reshape(dy.shape).bool()
    g = torch.where(mask, dy, 0.0).contiguous()
    batch_normalization_backward(handle, mode, alpha_data_diff, beta_data_diff, alpha_param_diff, beta_param_diff,
                                 x_desc, x_data, C.tdesc(g), g.data_ptr(), dx_desc, dx_data, d_bn_scale_bias_desc,
                                 bn_scale_data, d_bn_scale_data, d_bn_bias_data, epsilon, saved_mean,
                                 saved_inv_variance)


FAKES += [get_batch_normalization_forward_training_ex_workspace_size,
          get_batch_normalization_training_ex_reserve_space_size, get_batch_normalization_backward_ex_workspace_size,
          batch_normalization_forward_training_ex, batch_normalization_backward_ex]


@pytest.mark.parametrize("cls,tcls,shape", [(pt.BatchNorm2d, nn.BatchNorm2d, (4, 5, 3, 3)),
                                            (pt.BatchNorm1d, nn.BatchNorm1d, (8, 6))])
def test_batch_norm_relu_fused(emulated, cls, tcls, shape):
    mine, ref = make(cls, tcls, shape[1])
    mine.activation = "relu"
    seq = nn.Sequential(ref, nn.ReLU())
    for _ in range(2):
        mine.zero_grad(), seq.zero_grad()
        check(mine, seq, torch.randn(shape))
    assert {"bn_fwd_train_ex", "bn_bwd_ex"} <= set(emulated)
    mine.eval(), seq.eval()
    mine.zero_grad(), seq.zero_grad()
    check(mine, seq, torch.randn(shape))
    with pytest.raises(ValueError):
        cls(4, activation="gelu")


def test_convert_fuses_activations(emulated):
    torch.manual_seed(7)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 4, 1),
                          nn.Sigmoid(), nn.Conv2d(4, 4, 1), nn.GELU(), nn.Flatten(), nn.Linear(4 * 36, 3))
    ref = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 4, 1),
                        nn.Sigmoid(), nn.Conv2d(4, 4, 1), nn.GELU(), nn.Flatten(), nn.Linear(4 * 36, 3))
    ref.load_state_dict(model.state_dict())
    keys = list(model.state_dict())
    report = pt.convert(model, fuse=True)
    assert report.fused == [("1", "relu"), ("3", "sigmoid"), ("0", "1")]  # (the last: _fuse_blocks)
    assert model[0].__dict__["_bn"] is model[1] and model[1].__dict__["_absorbed"]
    assert type(model[2]) is nn.Identity and type(model[4]) is nn.Identity and type(model[6]) is pt.GELU
    assert model[1].activation == "relu" and model[3].activation == "sigmoid" and model[5].activation is None
    assert list(model.state_dict()) == keys and "fused" in str(report)
    for _ in range(2):
        model.zero_grad(), ref.zero_grad()
        check(model, ref, torch.randn(2, 3, 6, 6))
    assert {"bn_fwd_train_ex", "conv_fused"} <= set(emulated)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("act", [None, "tanh"])
def test_conv_other_dtypes(emulated, dtype, act):
    """float64 (the GPU gradcheck's dtype) and the 16-bit types through the real checks (validated mode)."""
    mine, ref = make(pt.Conv2d, nn.Conv2d, 4, 6, 3, stride=2, padding=1, groups=2)
    mine.activation = act
    mine.to(dtype), ref.to(dtype)
    r = nn.Sequential(ref, nn.Tanh()) if act else ref
    tol = 1e-9 if dtype == torch.float64 else 2e-2
    check(mine, r, torch.randn(2, 4, 6, 5).to(dtype), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float64])
def test_bn_pool_softmax_float64(emulated, dtype):
    mine, ref = make(pt.BatchNorm2d, nn.BatchNorm2d, 3)
    mine.double(), ref.double()
    check(mine, ref, torch.randn(5, 3, 4, 2, dtype=dtype), atol=1e-9, rtol=1e-9)
    check(pt.MaxPool2d(2), nn.MaxPool2d(2), torch.randn(2, 3, 6, 7, dtype=dtype))
    check(pt.AvgPool2d(3, 2, 1), nn.AvgPool2d(3, 2, 1), torch.randn(2, 3, 6, 7, dtype=dtype))
    check(pt.AdaptiveAvgPool2d((4, 3)), nn.AdaptiveAvgPool2d((4, 3)), torch.randn(2, 3, 6, 7, dtype=dtype))
    check(pt.Softmax(1), nn.Softmax(1), torch.randn(3, 7, dtype=dtype))
    check(pt.Tanh(), nn.Tanh(), torch.randn(3, 7, dtype=dtype))


def test_functional_batch_norm_without_running_stats(emulated):
    x = torch.randn(5, 3, 4, 2, dtype=torch.float64, requires_grad=True)
    w = torch.rand(3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, dtype=torch.float64, requires_grad=True)
    y = no_fallback(lambda: PF.batch_norm(x, None, None, w, b, True))
    yr = F.batch_norm(x, None, None, w, b, True)
    torch.testing.assert_close(y, yr)
    gx, gw, gb = torch.autograd.grad(y.square().sum(), (x, w, b))
    rx, rw, rb = torch.autograd.grad(yr.square().sum(), (x, w, b))
    torch.testing.assert_close((gx, gw, gb), (rx, rw, rb))


# ============================================================================================ RNN modules
from pydnn.torch import rnn as PR  # noqa: E402

RNN_CASES = [  # class, args, kwargs, input shape (T, B, I) or (B, T, I) with batch_first
    (nn.LSTM, (5, 8), dict(), (6, 3, 5)),
    (nn.LSTM, (5, 8), dict(num_layers=2, bidirectional=True), (4, 2, 5)),
    (nn.LSTM, (5, 8), dict(num_layers=2, proj_size=3, batch_first=True), (3, 5, 5)),
    (nn.LSTM, (4, 6), dict(bidirectional=True, proj_size=4, bias=False), (5, 2, 4)),
    (nn.GRU, (5, 7), dict(num_layers=2, bidirectional=True, batch_first=True), (2, 4, 5)),
    (nn.GRU, (3, 4), dict(bias=False), (5, 3, 3)),
    (nn.RNN, (5, 6), dict(num_layers=3, nonlinearity="relu"), (4, 2, 5)),
    (nn.RNN, (5, 6), dict(bidirectional=True), (4, 2, 5)),
]


@pytest.fixture
def rnn_emulated(emulated, monkeypatch):
    monkeypatch.setattr(PR, "_plans", C.BoundedDict())
    monkeypatch.setattr(PR, "_rdescs", C.BoundedDict())
    monkeypatch.setattr(PR, "_checked", set())
    _RNN_STASH.clear()
    yield emulated
    _RNN_STASH.clear()


def _rnn_pair(tcls, args, kw):
    torch.manual_seed(0)
    ref = tcls(*args, **kw)
    mine = {nn.LSTM: pt.LSTM, nn.GRU: pt.GRU, nn.RNN: pt.RNN}[tcls](*args, **kw)
    mine.load_state_dict(ref.state_dict())
    return mine, ref


def _rnn_check(mine, ref, inp, inp_ref, hx=None, hx_ref=None, atol=1e-5, rtol=1e-4):
    out = no_fallback(lambda: mine(inp, hx))
    out_ref = ref(inp_ref, hx_ref)
    flat = lambda o: [t for t in (o[0].data if isinstance(o[0], nn.utils.rnn.PackedSequence) else o[0],  # noqa: E731
                                   *(o[1] if isinstance(o[1], tuple) else (o[1],)))]
    got, want = flat(out), flat(out_ref)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=atol, rtol=rtol)
    torch.manual_seed(1)
    loss = sum((a * torch.randn(a.shape)).sum() for a in got)  # randn_like follows strides
    torch.manual_seed(1)
    loss_ref = sum((b * torch.randn(b.shape)).sum() for b in want)
    no_fallback(loss.backward)
    loss_ref.backward()
    for (n, p), (_, pr) in zip(mine.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p.grad, pr.grad, atol=atol, rtol=rtol, msg=lambda m: f"{n}: {m}")
    return out


@pytest.mark.parametrize("case", RNN_CASES, ids=[str(i) for i in range(len(RNN_CASES))])
@pytest.mark.parametrize("with_state", [False, True])
def test_rnn_modules(rnn_emulated, case, with_state):
    tcls, args, kw, shape = case
    mine, ref = _rnn_pair(tcls, args, kw)
    torch.manual_seed(2)
    x = torch.randn(shape).requires_grad_(True)
    xr = x.detach().clone().requires_grad_(True)
    hx = hx_ref = None
    if with_state:
        dirs, layers = (2 if ref.bidirectional else 1), ref.num_layers
        b = shape[0] if ref.batch_first else shape[1]
        out = ref.proj_size or ref.hidden_size if tcls is nn.LSTM else ref.hidden_size
        h0 = torch.randn(dirs * layers, b, out).requires_grad_(True)
        hr = h0.detach().clone().requires_grad_(True)
        if tcls is nn.LSTM:
            c0 = torch.randn(dirs * layers, b, ref.hidden_size).requires_grad_(True)
            cr = c0.detach().clone().requires_grad_(True)
            hx, hx_ref = (h0, c0), (hr, cr)
        else:
            hx, hx_ref = h0, hr
    _rnn_check(mine, ref, x, xr, hx, hx_ref)
    torch.testing.assert_close(x.grad, xr.grad, atol=1e-5, rtol=1e-4)
    if with_state:
        for a, b in zip(hx if isinstance(hx, tuple) else (hx,), hx_ref if isinstance(hx_ref, tuple) else (hx_ref,)):
            torch.testing.assert_close(a.grad, b.grad, atol=1e-5, rtol=1e-4)
    assert {"rnn_fwd_train", "rnn_bwd_data", "rnn_bwd_weights"} <= set(rnn_emulated)
    assert not _RNN_STASH, "a training forward's reserve space was never consumed by the backward calls"
    # the gradients are views of one flat dweight space, the parameters views of the flat weight space
    flat = mine.__dict__["_pydnn_flat"]
    base = flat.data_ptr()
    for n, off, shape in PR.layout(mine)[0]:
        assert getattr(mine, n).data_ptr() == base + off * flat.element_size(), n
    # inference (no grad): RNNForward INFERENCE, same outputs
    with torch.no_grad():
        y = no_fallback(lambda: mine(x, hx))[0]
        yr = ref(xr, hx_ref)[0]
    torch.testing.assert_close(y, yr, atol=1e-5, rtol=1e-4)
    assert "rnn_fwd_inf" in rnn_emulated


@pytest.mark.parametrize("tcls", [nn.LSTM, nn.GRU])
def test_rnn_packed_sequence(rnn_emulated, tcls):
    mine, ref = _rnn_pair(tcls, (4, 6), dict(num_layers=2, bidirectional=True))
    lengths = [3, 5, 1, 4]
    torch.manual_seed(3)
    xs = torch.randn(5, 4, 4)
    x = xs.clone().requires_grad_(True)
    xr = xs.clone().requires_grad_(True)
    p = nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=False)
    pr = nn.utils.rnn.pack_padded_sequence(xr, lengths, enforce_sorted=False)
    h0 = torch.randn(4, 4, 6)
    hx = (h0, torch.randn(4, 4, 6)) if tcls is nn.LSTM else h0
    out = _rnn_check(mine, ref, p, pr, hx, hx)
    assert isinstance(out[0], nn.utils.rnn.PackedSequence)
    torch.testing.assert_close(x.grad, xr.grad, atol=1e-5, rtol=1e-4)
    assert _rnn_data  # the packed layout went through the SEQ_MAJOR_PACKED descriptor
    assert any(k[3] == pydnn.PYDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED for k in PR._plans)


def test_rnn_unbatched_and_autocast(rnn_emulated):
    mine, ref = _rnn_pair(nn.GRU, (5, 8), dict(num_layers=2))
    x = torch.randn(6, 5)
    y, hy = no_fallback(lambda: mine(x))
    yr, hyr = ref(x)
    assert y.shape == yr.shape and hy.shape == hyr.shape
    torch.testing.assert_close(y, yr, atol=1e-5, rtol=1e-4)
    orig = C.autocast_dtype
    C.autocast_dtype = lambda: torch.bfloat16  # emulate CUDA autocast (the CPU flag is another one)
    try:
        xb = torch.randn(6, 3, 5)
        y, hy = no_fallback(lambda: mine(xb))
        assert y.dtype == torch.bfloat16 and hy.dtype == torch.bfloat16
        y.float().sum().backward()
    finally:
        C.autocast_dtype = orig
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in mine.parameters())
    ref_b = nn.GRU(5, 8, num_layers=2).bfloat16()
    ref_b.load_state_dict({k: v.bfloat16() for k, v in ref.state_dict().items()})
    torch.testing.assert_close(y.double(), ref_b(xb.bfloat16())[0].double(), atol=3e-2, rtol=3e-2)


def test_rnn_params_replaced_copy_per_call(rnn_emulated):
    mine, ref = _rnn_pair(nn.LSTM, (5, 8), dict(num_layers=2))
    with torch.no_grad():
        mine.weight_hh_l1 = nn.Parameter(mine.weight_hh_l1.detach().clone())  # no longer a view
    x = torch.randn(4, 2, 5)
    _rnn_check(mine, ref, x, x)
    assert mine.weight_hh_l1.grad is not None
    mine.flatten_parameters()
    flat = mine.__dict__["_pydnn_flat"]
    assert mine.weight_hh_l1.data_ptr() != flat.data_ptr() and mine.weight_hh_l1.untyped_storage().data_ptr() == \
        flat.untyped_storage().data_ptr()


def test_rnn_validated_mode_reaches_the_real_kernels(rnn_emulated, request):
    mine, ref = _rnn_pair(nn.LSTM, (16, 32), dict(num_layers=2, bidirectional=True, proj_size=8))
    mine.bfloat16()
    x = torch.randn(5, 3, 16).bfloat16().requires_grad_(True)
    out, (hy, cy) = no_fallback(lambda: mine(x))
    no_fallback(lambda: (out.float().sum() + hy.float().sum() + cy.float().sum()).backward())
    if request.node.callspec.params["emulated"] == "validated":
        assert {"validated:rnn_forward", "validated:rnn_backward_data_v8",
                "validated:rnn_backward_weights_v8"} <= set(rnn_emulated)


def test_rnn_convert(rnn_emulated):
    model = nn.Sequential()
    model.add_module("lstm", nn.LSTM(5, 8, num_layers=2))
    params = list(model.parameters())
    rep = pt.convert(model)
    assert ("lstm", "LSTM") in rep.converted and type(model.lstm) is pt.LSTM
    assert list(model.parameters()) == params  # the same Parameter objects, now views of one flat buffer
    flat = model.lstm.__dict__["_pydnn_flat"]
    assert all(p.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr() for p in params)
    no_fallback(lambda: model.lstm(torch.randn(3, 2, 5)))
