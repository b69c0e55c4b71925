"""The pointwise modes of the graph API: arity and a float expression per mode, written in a small
C-and-numpy subset (arithmetic, calls to the functions below, float literals with an `f`), so that one
string is both the CUDA C the fusion code generator emits and a numpy expression the CPU tests evaluate
(against the float64 reference in pydnn/reference/graph.py).

Operands: `x` (XDESC), `b` (BDESC), `t` (TDESC: BINARY_SELECT's condition); for the backward modes `x` is
the forward input and `b` is dy (DYDESC), the result dx. Parameters of the POINTWISE descriptor appear as
{lower}, {upper}, {slope} (RELU clips), {elu_alpha}, {softplus_beta}, {swish_beta}.
"""
from .. import enums as E

P = "PYDNN_POINTWISE_"

# mode name -> (inputs, expression). inputs: "x", "xb" (binary), "xbt" (BINARY_SELECT), "xdy" (backward)
MODES = {
    "ADD": ("xb", "x + b"),
    "ADD_SQUARE": ("xb", "x + b * b"),
    "SUB": ("xb", "x - b"),
    "MUL": ("xb", "x * b"),
    "DIV": ("xb", "x / b"),
    "MAX": ("xb", "fmaxf(x, b)"),
    "MIN": ("xb", "fminf(x, b)"),
    "MOD": ("xb", "fmodf(x, b)"),
    "POW": ("xb", "powf(x, b)"),
    "ABS": ("x", "fabsf(x)"),
    "CEIL": ("x", "ceilf(x)"),
    "FLOOR": ("x", "floorf(x)"),
    "COS": ("x", "cosf(x)"),
    "SIN": ("x", "sinf(x)"),
    "TAN": ("x", "tanf(x)"),
    "EXP": ("x", "expf(x)"),
    "LOG": ("x", "logf(x)"),
    "NEG": ("x", "-x"),
    "SQRT": ("x", "sqrtf(x)"),
    "RSQRT": ("x", "rsqrtf(x)"),
    "ERF": ("x", "erff(x)"),
    "IDENTITY": ("x", "x"),
    "RECIPROCAL": ("x", "1.0f / x"),
    "RELU_FWD": ("x", "sel(lt(x, {lower}), {lower} + {slope} * (x - {lower}), fminf(x, {upper}))"),
    "TANH_FWD": ("x", "tanhf(x)"),
    "SIGMOID_FWD": ("x", "1.0f / (1.0f + expf(-x))"),
    "ELU_FWD": ("x", "sel(gt(x, 0.0f), x, {elu_alpha} * expm1f(x))"),
    "GELU_FWD": ("x", "0.5f * x * (1.0f + erff(x * 0.70710678118654752f))"),
    "GELU_APPROX_TANH_FWD": ("x", "0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)))"),
    "SOFTPLUS_FWD": ("x", "log1pf(expf({softplus_beta} * x)) / {softplus_beta}"),
    "SWISH_FWD": ("x", "x / (1.0f + expf(-{swish_beta} * x))"),
    "RELU_BWD": ("xdy", "b * sel(lt(x, {lower}), {slope}, sel(gt(x, {upper}), 0.0f, 1.0f))"),
    "TANH_BWD": ("xdy", "b * (1.0f - tanhf(x) * tanhf(x))"),
    "SIGMOID_BWD": ("xdy", "b * (1.0f / (1.0f + expf(-x))) * (1.0f - 1.0f / (1.0f + expf(-x)))"),
    "ELU_BWD": ("xdy", "b * sel(gt(x, 0.0f), 1.0f, {elu_alpha} * expf(x))"),
    "GELU_BWD": ("xdy", "b * (0.5f * (1.0f + erff(x * 0.70710678118654752f)) + x * 0.39894228040143268f * expf(-0.5f * x * x))"),
    "GELU_APPROX_TANH_BWD": ("xdy", "b * gelu_tanh_grad(x)"),
    "SOFTPLUS_BWD": ("xdy", "b / (1.0f + expf(-{softplus_beta} * x))"),
    "SWISH_BWD": ("xdy", "b * swish_grad(x, {swish_beta})"),
    "CMP_EQ": ("xb", "eq(x, b)"),
    "CMP_NEQ": ("xb", "1.0f - eq(x, b)"),
    "CMP_GT": ("xb", "gt(x, b)"),
    "CMP_GE": ("xb", "ge(x, b)"),
    "CMP_LT": ("xb", "lt(x, b)"),
    "CMP_LE": ("xb", "le(x, b)"),
    "LOGICAL_AND": ("xb", "land(x, b)"),
    "LOGICAL_OR": ("xb", "lor(x, b)"),
    "LOGICAL_NOT": ("x", "1.0f - nz(x)"),
    "BINARY_SELECT": ("xbt", "sel(nz(t), x, b)"),
}

BY_VALUE = {getattr(E, P + name): name for name in MODES}
UNSUPPORTED = {getattr(E, P + "GEN_INDEX"): "GEN_INDEX"}  # a valid mode no engine of pydnn runs (yet)
DEFAULT_PARAMS = dict(lower=0.0, upper=float("inf"), slope=0.0, elu_alpha=1.0, softplus_beta=1.0, swish_beta=1.0)


def inputs(mode):
    return MODES[BY_VALUE[mode]][0]


def literal(v):
    """A float literal of the expression language (C float, numpy float32)."""
    v = float(v)
    if v == float("inf"):
        return "INFINITY"
    if v == float("-inf"):
        return "(-INFINITY)"
    return f"({v!r}f)" if v >= 0 else f"(-{-v!r}f)"


def expression(mode, params, x, b=None, t=None):
    """The expression of one pointwise node with operand expressions x, b, t substituted (parenthesised)."""
    _, text = MODES[BY_VALUE[mode]]
    p = dict(DEFAULT_PARAMS)
    p.update({k: v for k, v in params.items() if v is not None})
    text = text.format(**{k: literal(v) for k, v in p.items()})
    # substitute operand names as whole words
    import re

    ops = {"x": x, "b": b, "t": t}
    return re.sub(r"\b([xbt])\b", lambda m: f"({ops[m.group(1)]})", text)


# The device helpers the expressions call (ptx/graph_pointwise.cuh defines the same in CUDA C).
def numpy_namespace(np):
    f = np.float32

    def sel(c, a, b):
        return np.where(c != 0, a, b).astype(f)

    def cmp(fn):
        return lambda a, b: fn(a, b).astype(f)

    def sig(v):
        return f(1) / (f(1) + np.exp(-v))

    def gelu_tanh_grad(v):
        k = f(0.79788456080286536)
        u = k * (v + f(0.044715) * v * v * v)
        th = np.tanh(u)
        return f(0.5) * (f(1) + th) + f(0.5) * v * (f(1) - th * th) * k * (f(1) + f(3 * 0.044715) * v * v)

    def swish_grad(v, beta):
        s = sig(beta * v)
        return s + beta * v * s * (f(1) - s)

    return {
        "fmaxf": np.fmax, "fminf": np.fmin, "fmodf": np.fmod, "powf": np.power, "fabsf": np.abs, "ceilf": np.ceil,
        "floorf": np.floor, "cosf": np.cos, "sinf": np.sin, "tanf": np.tan, "expf": np.exp, "logf": np.log,
        "sqrtf": np.sqrt, "rsqrtf": lambda v: f(1) / np.sqrt(v), "erff": _erf(np), "tanhf": np.tanh,
        "expm1f": np.expm1, "log1pf": np.log1p, "sel": sel, "lt": cmp(np.less), "gt": cmp(np.greater),
        "le": cmp(np.less_equal), "ge": cmp(np.greater_equal), "eq": cmp(np.equal),
        "nz": lambda v: (v != 0).astype(f), "land": lambda a, b: ((a != 0) & (b != 0)).astype(f),
        "lor": lambda a, b: ((a != 0) | (b != 0)).astype(f), "INFINITY": f(np.inf),
        "gelu_tanh_grad": gelu_tanh_grad, "swish_grad": swish_grad, "tanh_nonneg": np.tanh, "tanh_fast": np.tanh,
        "gelu_fast": lambda v: (f(0.5) * v * (f(1) + _erf(np)(v * f(0.70710678118654752)))).astype(f),
        "gelu_fast5": lambda v: (f(0.5) * v * (f(1) + _erf(np)(v * f(0.70710678118654752)))).astype(f),
        "gelu_ex2": lambda v: (f(0.5) * v * (f(1) + _erf(np)(v * f(0.70710678118654752)))).astype(f),
    }


def _erf(np):
    import math

    return np.vectorize(lambda v: np.float32(math.erf(float(v))), otypes=[np.float32])


def to_numpy_source(expr):
    """The expression as Python source: float literals lose their `f`."""
    import re

    return re.sub(r"(?<![A-Za-z_0-9.])(\d[\d.]*(?:e[-+]?\d+)?)f\b", r"\1", expr)
