"""float64 references of the graph API: every pointwise mode (by its PYDNN_POINTWISE_* name), written
independently of the expression strings in pydnn/graph/pointwise_ops.py, and a whole-graph evaluator.

    pointwise(name, x, b=None, t=None, lower=0, upper=inf, slope=0, elu_alpha=1, softplus_beta=1, swish_beta=1)

For the backward modes x is the forward input and b is dy; the result is dx.
"""
import math

import numpy as np

_erf = np.vectorize(math.erf, otypes=[np.float64])


def _sig(v):
    return 1.0 / (1.0 + np.exp(-v))


def _gelu(v):
    return 0.5 * v * (1.0 + _erf(v / math.sqrt(2.0)))


def _gelu_tanh(v):
    return 0.5 * v * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v ** 3)))


def _num_grad(f, v, h=1e-6):
    return (f(v + h) - f(v - h)) / (2 * h)


def pointwise(name, x, b=None, t=None, lower=0.0, upper=math.inf, slope=0.0, elu_alpha=1.0, softplus_beta=1.0,
              swish_beta=1.0):
    x = np.asarray(x, np.float64)
    b = None if b is None else np.asarray(b, np.float64)
    f = {
        "ADD": lambda: x + b, "ADD_SQUARE": lambda: x + b * b, "SUB": lambda: x - b, "MUL": lambda: x * b,
        "DIV": lambda: x / b, "MAX": lambda: np.maximum(x, b), "MIN": lambda: np.minimum(x, b),
        "MOD": lambda: np.fmod(x, b), "POW": lambda: np.power(x, b), "ABS": lambda: np.abs(x),
        "CEIL": lambda: np.ceil(x), "FLOOR": lambda: np.floor(x), "COS": lambda: np.cos(x), "SIN": lambda: np.sin(x),
        "TAN": lambda: np.tan(x), "EXP": lambda: np.exp(x), "LOG": lambda: np.log(x), "NEG": lambda: -x,
        "SQRT": lambda: np.sqrt(x), "RSQRT": lambda: 1.0 / np.sqrt(x), "ERF": lambda: _erf(x),
        "IDENTITY": lambda: x + 0.0, "RECIPROCAL": lambda: 1.0 / x,
        "RELU_FWD": lambda: np.where(x < lower, lower + slope * (x - lower), np.minimum(x, upper)),
        "TANH_FWD": lambda: np.tanh(x), "SIGMOID_FWD": lambda: _sig(x),
        "ELU_FWD": lambda: np.where(x > 0, x, elu_alpha * np.expm1(x)), "GELU_FWD": lambda: _gelu(x),
        "GELU_APPROX_TANH_FWD": lambda: _gelu_tanh(x),
        "SOFTPLUS_FWD": lambda: np.log1p(np.exp(softplus_beta * x)) / softplus_beta,
        "SWISH_FWD": lambda: x * _sig(swish_beta * x),
        "RELU_BWD": lambda: b * np.where(x < lower, slope, np.where(x > upper, 0.0, 1.0)),
        "TANH_BWD": lambda: b * (1.0 - np.tanh(x) ** 2),
        "SIGMOID_BWD": lambda: b * _sig(x) * (1.0 - _sig(x)),
        "ELU_BWD": lambda: b * np.where(x > 0, 1.0, elu_alpha * np.exp(x)),
        "GELU_BWD": lambda: b * (0.5 * (1.0 + _erf(x / math.sqrt(2.0))) + x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)),
        "GELU_APPROX_TANH_BWD": lambda: b * _num_grad(_gelu_tanh, x),
        "SOFTPLUS_BWD": lambda: b * _sig(softplus_beta * x),
        "SWISH_BWD": lambda: b * _num_grad(lambda v: v * _sig(swish_beta * v), x),
        "CMP_EQ": lambda: (x == b) * 1.0, "CMP_NEQ": lambda: (x != b) * 1.0, "CMP_GT": lambda: (x > b) * 1.0,
        "CMP_GE": lambda: (x >= b) * 1.0, "CMP_LT": lambda: (x < b) * 1.0, "CMP_LE": lambda: (x <= b) * 1.0,
        "LOGICAL_AND": lambda: ((x != 0) & (b != 0)) * 1.0, "LOGICAL_OR": lambda: ((x != 0) | (b != 0)) * 1.0,
        "LOGICAL_NOT": lambda: (x == 0) * 1.0,
        "BINARY_SELECT": lambda: np.where(np.asarray(t) != 0, x, b),
    }[name]
    with np.errstate(all="ignore"):
        return np.asarray(f(), np.float64)
