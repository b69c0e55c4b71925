"""Convolution forward + scale + bias (+ residual) + activation in the fusion engine (a FUSERS entry that
runs before the engine's own conv_fprop -> bias -> activation mapping):

  ONE kernel   conv_fprop, then multiplications by pass-by-value scalars (folded into alpha1 of
               convolution_bias_activation_forward when the plan executes, with the convolution's own
               alpha), a bias add [1, K, 1, ...], an optional residual add (z, y's dims) and an optional
               activation (RELU with an upper clip, SIGMOID, TANH, ELU, IDENTITY): the convolution
               kernel's epilogue act(alpha1 * conv + alpha2 * z + bias).
  TWO kernels  anything else pointwise after the convolution, among it a per-channel scale [1, K, 1, ...]
               or a scale in device memory: pydnn's convolution epilogue has no per-channel scale and
               folding it into the filter would change the caller's data, so the convolution writes its
               output (x's data type) into the workspace and ONE generated pointwise kernel computes the
               whole epilogue (scale, bias, residual, activation, any other pointwise op, every output).
"""
from .. import enums as E
from . import codegen as cg
from . import engines as EN

BY_VALUE_TYPES = (E.PYDNN_DATA_FLOAT, E.PYDNN_DATA_DOUBLE)


def _conv_of(g):
    convs = [op for op in g.ops if op.kind == "conv_fprop"]
    if len(convs) != 1 or any(op.kind not in ("conv_fprop", "pointwise") for op in g.ops):
        return None
    return convs[0]


def one_launch(g, conv):
    """The mapping onto convolution_bias_activation_forward with scalar scales folded into alpha1, or the
    reason it does not apply."""
    x, w, c = g.tensors[conv.inputs["x"]], g.tensors[conv.inputs["w"]], g.tensors[conv.outputs["y"]]
    if x.uid not in g.inputs or w.uid not in g.inputs or x.dtype != w.dtype or x.dtype not in EN.TAGS:
        return "the convolution's x and w must be graph inputs of one data type (FLOAT, HALF, BFLOAT16)"
    if EN._filter_format(w) is None:
        return f"the filter (uid {w.uid}) must be packed NCHW or NHWC"
    cur, bias, z, act, scales = c.uid, None, None, None, []
    for op in [o for o in g.order if o.kind == "pointwise"]:
        if act is not None:
            return "operations after the activation"
        if not g.tensors[cur].virtual or cur not in op.inputs.values():
            return "the epilogue must be one chain from the convolution's (virtual) output"
        name, p = op.params["name"], op.params
        others = [u for u in op.inputs.values() if u != cur]
        if name == "MUL" and len(others) == 1 and p["alpha1"] == p["alpha2"] == 1.0:
            t = g.tensors[others[0]]
            if bias is not None or z is not None:
                return "a scale after the bias or residual add (the kernel scales the convolution only)"
            if not t.by_value:
                return (f"a scale in device memory (uid {t.uid}, dims {list(t.dims)}): the convolution's epilogue "
                        f"takes a host scalar (a pass-by-value tensor) and no per-channel scale")
            if t.dtype not in BY_VALUE_TYPES:
                return f"a by-value scale of data type {t.dtype} (FLOAT or DOUBLE)"
            scales.append(t.uid)
        elif name == "ADD" and len(others) == 1 and p["alpha1"] == p["alpha2"] == 1.0:
            t = g.tensors[others[0]]
            if t.virtual or t.by_value or t.dtype != x.dtype:
                return f"tensor uid {t.uid}: an epilogue operand must be a graph input of x's data type"
            if bias is None and list(t.dims) == [1, c.dims[1]] + [1] * (len(c.dims) - 2):
                bias = t
            elif z is None and t.dims == c.dims:
                z = t
            else:
                return f"an add of tensor uid {t.uid} (dims {list(t.dims)}) that is neither a bias nor a residual"
        elif name in EN.ACTS and not others and p["alpha1"] == 1.0:
            pr = p["params"]
            if name == "RELU_FWD" and (pr.get("lower", 0.0) != 0.0 or pr.get("slope", 0.0) != 0.0):
                return "a ReLU with a lower clip or slope"
            act = op
        else:
            return f"pointwise {name} in a convolution epilogue (scalar scale, bias, residual add, activation only)"
        cur = next(iter(op.outputs.values()))
    y = g.tensors[cur]
    if bias is None:
        return "a convolution epilogue needs a bias"
    if y.virtual or g.outputs != [y.uid] or y.dtype != x.dtype or y.dims != c.dims:
        return "the epilogue's result must be the graph's one output, of x's data type"
    return dict(x=x, w=w, y=y, z=z, bias=bias, act=act, conv=conv, scales=scales)


class ScaledConvBiasActStep(EN.ConvBiasActStep):
    """engines.ConvBiasActStep with alpha1 = the convolution's alpha times the by-value scales' values."""

    def __init__(self, handle, g, an):
        super().__init__(handle, g, an)
        self.scales = list(an["scales"])
        self.alpha = float(an["conv"].params["alpha"])

    def run(self, handle, ptr):
        import pydnn

        a1 = self.alpha
        for u in self.scales:
            a1 *= float(ptr[u])
        u = self.uids
        ws = ptr["workspace"] if self.ws_size else 0
        z = ptr[u["z"]] if u["z"] is not None else ptr[u["y"]]
        pydnn.convolution_bias_activation_forward(
            handle, a1, self.xd, ptr[u["x"]], self.wd, ptr[u["w"]], self.cd, self.algo, ws, self.ws_size,
            1.0 if u["z"] is not None else 0.0, self.zd, z, self.bd, ptr[u["bias"]], self.ad, self.yd, ptr[u["y"]])


def two_launch(g, conv):
    """The convolution into the workspace, then one generated kernel for every pointwise op; or the reason."""
    x, w, c = g.tensors[conv.inputs["x"]], g.tensors[conv.inputs["w"]], g.tensors[conv.outputs["y"]]
    if x.dtype != w.dtype or x.dtype not in EN.TAGS or EN._filter_format(w) is None:
        return "the convolution's x and w need one data type and a packed NCHW / NHWC filter"
    if not c.virtual:
        return "the convolution's output is a graph output (the node engine runs it)"
    pws = [o for o in g.order if o.kind == "pointwise"]
    if len(pws) < 2:
        return "one pointwise op after the convolution (the node engine's two kernels are the same)"
    shape = c.dims
    ins = [c.uid] + [u for u in g.inputs if u not in (x.uid, w.uid)]
    for t in g.tensors.values():
        if t.uid in (x.uid, w.uid):
            if any(t.uid in o.inputs.values() for o in pws):
                return "the epilogue reads the convolution's x or w"
            continue
        if t.by_value:
            return f"tensor uid {t.uid} is by value (the generated epilogue reads device tensors)"
        if t.dtype not in EN.TAGS:
            return f"tensor uid {t.uid}: data type {t.dtype}"
        if len(t.dims) != len(shape) or any(d != s and d != 1 for d, s in zip(t.dims, shape)):
            return f"tensor uid {t.uid} dims {list(t.dims)} do not broadcast to the convolution's output {list(shape)}"
    outs = list(g.outputs)
    for u in outs:
        if tuple(g.tensors[u].dims) != tuple(shape):
            return f"output uid {u} dims {list(g.tensors[u].dims)} differ from the convolution's {list(shape)}"
    if len(ins) + len(outs) > cg.MAX_OPERANDS:
        return f"{len(ins) + len(outs)} epilogue tensors (at most {cg.MAX_OPERANDS})"
    return dict(conv=conv, x=x, w=w, c=c, ins=ins, outs=outs, pws=pws)


class ConvFuser:
    """FUSERS entry of conv_fprop graphs with a scale, or whose epilogue pydnn's convolution kernel cannot
    take (then: two kernels). Graphs the engine's own conv -> bias -> activation mapping runs are left to it."""

    def analyze(self, g):
        conv = _conv_of(g)
        if conv is None:
            return None
        one = one_launch(g, conv)
        if isinstance(one, dict):
            if not one["scales"] and conv.params["alpha"] == 1.0:
                return None  # the engine's own mapping (engines.ConvBiasActStep), the same kernel
            return dict(one, launches=1)
        builtin = EN._conv_epilogue(g) if not any(t.by_value for t in g.tensors.values()) else "by-value tensors"
        if isinstance(builtin, dict):
            return None  # the engine's own mapping (one kernel)
        two = two_launch(g, conv)
        if isinstance(two, dict):
            return dict(two, launches=2, why_not_one=one)
        return f"no one-kernel form ({one}) and no two-kernel form ({two})"

    def build(self, handle, g, an):
        if an["launches"] == 1:
            step = ScaledConvBiasActStep(handle, g, an)
            return EN.EnginePlan([step], {}, step.ws_size)
        st = {u: t.dtype for u, t in g.tensors.items()}
        c = an["c"]
        st[c.uid] = an["x"].dtype  # pydnn's convolutions write the type they read
        span = (EN._span(c, st[c.uid]) + EN.ALIGN - 1) // EN.ALIGN * EN.ALIGN
        conv = EN.ConvStep(handle, g, an["conv"], st, span)
        shape = list(c.dims)
        uids = an["ins"] + an["outs"]
        value, nodes = {}, []

        def ref(u):
            return ("v", value[u]) if u in value else ("op", uids.index(u))

        for op in an["pws"]:
            nodes.append(EN._pw_node(op, ref))
            value[next(iter(op.outputs.values()))] = len(nodes) - 1
        stores = [(value[u], uids.index(u)) for u in an["outs"]]
        operands = [(EN.TAGS[st[u]], "in") for u in an["ins"]] + [(EN.TAGS[st[u]], "out") for u in an["outs"]]
        pw = EN.PwStep(handle, cg.PwProgram(operands, nodes, stores), shape,
                       [EN._bcast_strides(g.tensors[u], shape) for u in uids], uids)
        pw.ws_size = 0
        return EN.EnginePlan([conv, pw], {c.uid: 0}, span + conv.ws_size)


EN.FUSERS.append(ConvFuser())
