"""The RNN descriptor (cudnnSetRNNDescriptor_v8, cudnnRNNSetClip_v9) and the RNN data descriptor
(cudnnSetRNNDataDescriptor), with the derived geometry and the weight-space layout.

Weight space (what pydnnGetRNNWeightParams describes): pseudo-layers one after another (pseudo-layer
layer * dirs + dir); inside one, its matrices by linLayerID, then its biases by linLayerID, unpadded, in the
data type:
    input matrices    linLayerID 0 .. G-1       [hiddenSize x in]   (in = inputSize on layer 0, else
                                                                     outSize * dirs; absent on layer 0 with
                                                                     SKIP_INPUT)
    recurrent         linLayerID G .. 2G-1      [hiddenSize x outSize]
    projection        linLayerID 8 (LSTM)       [projSize x hiddenSize] (absent without projection)
    input biases      linLayerID 0 .. G-1       [hiddenSize]   (SINGLE_INP_BIAS, DOUBLE_BIAS)
    recurrent biases  linLayerID G .. 2G-1      [hiddenSize]   (SINGLE_REC_BIAS, DOUBLE_BIAS)
G = 1 (RNN_RELU, RNN_TANH), 4 (LSTM: i, f, g, o), 3 (GRU: r, z, n); outSize = projSize for an LSTM with
projSize < hiddenSize, else hiddenSize. The G matrices of one kind are consecutive, so they form one
[G * hiddenSize x in] row-major matrix (PyTorch's weight_ih_l{k} exactly), which the GEMMs use directly.
Matrix descriptors are 3-d (1, rows, cols) packed; bias descriptors (1, rows, 1).
"""
from ... import enums as E
from ...status import PydnnError, api
from ...tensor import DTYPES, _int
from ..common import enum_arg, scalar

RNN_RELU, RNN_TANH, LSTM, GRU = E.PYDNN_RNN_RELU, E.PYDNN_RNN_TANH, E.PYDNN_LSTM, E.PYDNN_GRU
GATES = {RNN_RELU: 1, RNN_TANH: 1, LSTM: 4, GRU: 3}
PROJ_ID = 8
ALGOS = tuple(v for k, v in E.ENUMS["pydnnRNNAlgo_t"].items() if not k.endswith("COUNT"))
CELLS = tuple(E.ENUMS["pydnnRNNMode_t"].values())
BIAS_MODES = tuple(E.ENUMS["pydnnRNNBiasMode_t"].values())
DIR_MODES = tuple(E.ENUMS["pydnnDirectionMode_t"].values())
INPUT_MODES = tuple(E.ENUMS["pydnnRNNInputMode_t"].values())
MATH_TYPES = tuple(E.ENUMS["pydnnMathType_t"].values())
LAYOUTS = tuple(E.ENUMS["pydnnRNNDataLayout_t"].values())
CLIP_MODES = tuple(E.ENUMS["pydnnRNNClipMode_t"].values())
NAN_OPTS = tuple(E.ENUMS["pydnnNanPropagation_t"].values())
FLOAT_DTYPES = (E.PYDNN_DATA_FLOAT, E.PYDNN_DATA_DOUBLE, E.PYDNN_DATA_HALF, E.PYDNN_DATA_BFLOAT16)
# data type -> the math precisions allowed with it (cuDNN: half data may compute in half or float)
MATH_PREC = {E.PYDNN_DATA_FLOAT: (E.PYDNN_DATA_FLOAT,), E.PYDNN_DATA_DOUBLE: (E.PYDNN_DATA_DOUBLE,),
             E.PYDNN_DATA_HALF: (E.PYDNN_DATA_HALF, E.PYDNN_DATA_FLOAT),
             E.PYDNN_DATA_BFLOAT16: (E.PYDNN_DATA_BFLOAT16, E.PYDNN_DATA_FLOAT)}
AUX_FLAGS = E.PYDNN_RNN_PADDED_IO_ENABLED
INT_MAX = 2**31 - 1


def _bad(msg, status=E.PYDNN_STATUS_BAD_PARAM):
    raise PydnnError(status, msg)


def _ns(msg):
    raise PydnnError(E.PYDNN_STATUS_NOT_SUPPORTED, msg)


def _positive(name, v):
    v = _int(name, v)
    if not 0 < v <= INT_MAX:
        _bad(f"{name}: {v} must be positive")
    return v


def _float_type(name, v):
    t = _int(name, v)
    if t not in FLOAT_DTYPES:
        if t in E.ENUMS["pydnnDataType_t"].values():
            _ns(f"{name}: data type {t} is not supported by the RNN functions (float, double, half, bfloat16)")
        _bad(f"{name}: {t} is not a pydnnDataType_t value")
    return t


# ----------------------------------------------------------------------------- the RNN descriptor

class RNNDescriptor:
    """cudnnRNNDescriptor_t (the _v8 settings and the v9 clip)."""

    __slots__ = ("algo", "cell", "bias_mode", "dir_mode", "input_mode", "dtype", "math_prec", "math_type",
                 "input_size", "hidden", "proj_size", "layers", "dropout", "aux_flags", "clip_mode",
                 "clip_nan", "lclip", "rclip", "is_set", "alive", "version")

    def __init__(self):
        self.is_set, self.alive, self.version = False, True, 0
        self.clip_mode, self.clip_nan = E.PYDNN_RNN_CLIP_NONE, E.PYDNN_NOT_PROPAGATE_NAN
        self.lclip = self.rclip = 0.0

    # derived geometry
    @property
    def gates(self):
        return GATES[self.cell]

    @property
    def dirs(self):
        return 2 if self.dir_mode == E.PYDNN_BIDIRECTIONAL else 1

    @property
    def proj(self):
        """Whether the LSTM has a recurrent projection (projSize < hiddenSize)."""
        return self.cell == LSTM and self.proj_size < self.hidden

    @property
    def out(self):
        """Width of h (hx, hy, each direction's share of y): projSize with a projection, else hiddenSize."""
        return self.proj_size if self.proj else self.hidden

    @property
    def pseudo_layers(self):
        return self.layers * self.dirs

    @property
    def esize(self):
        return DTYPES[self.dtype][0]

    @property
    def has_bw(self):
        return self.bias_mode in (E.PYDNN_RNN_SINGLE_INP_BIAS, E.PYDNN_RNN_DOUBLE_BIAS)

    @property
    def has_br(self):
        return self.bias_mode in (E.PYDNN_RNN_SINGLE_REC_BIAS, E.PYDNN_RNN_DOUBLE_BIAS)

    def layer_input(self, layer):
        return self.input_size if layer == 0 else self.out * self.dirs

    def has_w(self, layer):
        return not (layer == 0 and self.input_mode == E.PYDNN_SKIP_INPUT)

    def clip(self):
        """(lclip, rclip) when LSTM cell clipping is on, else None."""
        if self.cell == LSTM and self.clip_mode == E.PYDNN_RNN_CLIP_MINMAX:
            return (self.lclip, self.rclip)
        return None

    # the weight space
    def pseudo_layer_regions(self, pl):
        """{(kind, linLayerID): (element offset within the weight space, dims)} of one pseudo-layer, and the
        element offset past it. kind 'm' matrices, 'b' biases."""
        layer = pl // self.dirs
        g, h, out = self.gates, self.hidden, self.out
        off = self.pseudo_layer_offset(pl)
        regs = {}
        if self.has_w(layer):
            n = self.layer_input(layer)
            for k in range(g):
                regs[("m", k)] = (off, (1, h, n))
                off += h * n
        for k in range(g):
            regs[("m", g + k)] = (off, (1, h, out))
            off += h * out
        if self.proj:
            regs[("m", PROJ_ID)] = (off, (1, out, h))
            off += out * h
        if self.has_bw:
            for k in range(g):
                regs[("b", k)] = (off, (1, h, 1))
                off += h
        if self.has_br:
            for k in range(g):
                regs[("b", g + k)] = (off, (1, h, 1))
                off += h
        return regs, off

    def pseudo_layer_size(self, pl):
        layer = pl // self.dirs
        g, h, out = self.gates, self.hidden, self.out
        n = g * h * self.layer_input(layer) if self.has_w(layer) else 0
        n += g * h * out + (out * h if self.proj else 0)
        n += g * h * (int(self.has_bw) + int(self.has_br))
        return n

    def pseudo_layer_offset(self, pl):
        return sum(self.pseudo_layer_size(p) for p in range(pl))

    def weight_elements(self):
        return self.pseudo_layer_offset(self.pseudo_layers)

    def lin_ids(self):
        return 9 if self.cell == LSTM else 2 * self.gates


def _live_rnn(desc, name="rnnDesc"):
    if type(desc) is not RNNDescriptor or not desc.alive:
        _bad(f"{name}: not a live RNN descriptor")
    return desc


def set_rnn(desc, name="rnnDesc"):
    if not _live_rnn(desc, name).is_set:
        _bad(f"{name}: descriptor was never set")
    return desc


@api
def create_rnn_descriptor():
    """cudnnCreateRNNDescriptor."""
    return RNNDescriptor()


@api
def destroy_rnn_descriptor(rnn_desc):
    """cudnnDestroyRNNDescriptor (None: nothing to do)."""
    if rnn_desc is None:
        return
    _live_rnn(rnn_desc).alive = False
    rnn_desc.version += 1


def _dropout_desc(d):
    if d is None or (type(d) is int and d == 0):
        return None
    from ..dropout import DropoutDescriptor
    if type(d) is not DropoutDescriptor or not d.alive:
        _bad("dropoutDesc: not a live dropout descriptor")
    if not d.is_set:
        _bad("dropoutDesc: dropout descriptor was never set")
    return d


@api
def set_rnn_descriptor_v8(rnn_desc, algo, cell_mode, bias_mode, dir_mode, input_mode, data_type, math_prec,
                          math_type, input_size, hidden_size, proj_size, num_layers, dropout_desc, aux_flags):
    """cudnnSetRNNDescriptor_v8. Every argument is checked before anything changes; the clip goes back to
    CLIP_NONE. BAD_PARAM: an enum value outside its type, sizes not positive, projSize > hiddenSize or
    projSize < hiddenSize with a cell other than LSTM, SKIP_INPUT with inputSize != hiddenSize, auxFlags
    other than PYDNN_RNN_PADDED_IO_{DISABLED,ENABLED}, a dead or unset dropoutDesc (None / NULL: no dropout).
    NOT_SUPPORTED: a data type other than float / double / half / bfloat16, or a math precision that the
    data type does not allow (float: float; double: double; half: half or float; bfloat16: bfloat16 or
    float)."""
    d = _live_rnn(rnn_desc)
    a = enum_arg("algo", algo, ALGOS, "pydnnRNNAlgo_t")
    cell = enum_arg("cellMode", cell_mode, CELLS, "pydnnRNNMode_t")
    bm = enum_arg("biasMode", bias_mode, BIAS_MODES, "pydnnRNNBiasMode_t")
    dm = enum_arg("dirMode", dir_mode, DIR_MODES, "pydnnDirectionMode_t")
    im = enum_arg("inputMode", input_mode, INPUT_MODES, "pydnnRNNInputMode_t")
    dt = _float_type("dataType", data_type)
    mp = _int("mathPrec", math_prec)
    if mp not in E.ENUMS["pydnnDataType_t"].values():
        _bad(f"mathPrec: {mp} is not a pydnnDataType_t value")
    if mp not in MATH_PREC[dt]:
        _ns(f"mathPrec: {mp} is not supported with dataType {dt} (allowed: {', '.join(map(str, MATH_PREC[dt]))})")
    mt = enum_arg("mathType", math_type, MATH_TYPES, "pydnnMathType_t")
    isz = _positive("inputSize", input_size)
    h = _positive("hiddenSize", hidden_size)
    p = _positive("projSize", proj_size)
    layers = _positive("numLayers", num_layers)
    if p > h:
        _bad(f"projSize: {p} is larger than hiddenSize {h}")
    if p < h and cell != LSTM:
        _bad(f"projSize: {p} < hiddenSize {h} (a recurrent projection) is only for LSTM cells; "
             f"set projSize = hiddenSize for cellMode {cell}")
    if im == E.PYDNN_SKIP_INPUT and isz != h:
        _bad(f"inputSize: {isz} must equal hiddenSize {h} with PYDNN_SKIP_INPUT")
    drop = _dropout_desc(dropout_desc)
    flags = _int("auxFlags", aux_flags)
    if flags & ~AUX_FLAGS or flags < 0:
        _bad(f"auxFlags: {flags:#x} has bits other than PYDNN_RNN_PADDED_IO_ENABLED")
    d.algo, d.cell, d.bias_mode, d.dir_mode, d.input_mode = a, cell, bm, dm, im
    d.dtype, d.math_prec, d.math_type = dt, mp, mt
    d.input_size, d.hidden, d.proj_size, d.layers, d.dropout, d.aux_flags = isz, h, p, layers, drop, flags
    d.clip_mode, d.clip_nan, d.lclip, d.rclip = E.PYDNN_RNN_CLIP_NONE, E.PYDNN_NOT_PROPAGATE_NAN, 0.0, 0.0
    d.is_set = True
    d.version += 1


@api
def get_rnn_descriptor_v8(rnn_desc):
    """cudnnGetRNNDescriptor_v8 -> (algo, cellMode, biasMode, dirMode, inputMode, dataType, mathPrec, mathType,
    inputSize, hiddenSize, projSize, numLayers, dropoutDesc (None: none), auxFlags)."""
    d = set_rnn(rnn_desc)
    return (d.algo, d.cell, d.bias_mode, d.dir_mode, d.input_mode, d.dtype, d.math_prec, d.math_type,
            d.input_size, d.hidden, d.proj_size, d.layers, d.dropout, d.aux_flags)


@api
def rnn_set_clip_v9(rnn_desc, clip_mode, clip_nan_opt, lclip, rclip):
    """cudnnRNNSetClip_v9: LSTM cell clipping, c = min(max(c, lclip), rclip) after each step's update.
    BAD_PARAM: clipMode / clipNanOpt outside their types, CLIP_MINMAX on a cell other than LSTM,
    lclip > rclip (or NaN)."""
    d = set_rnn(rnn_desc)
    mode = enum_arg("clipMode", clip_mode, CLIP_MODES, "pydnnRNNClipMode_t")
    nan = enum_arg("clipNanOpt", clip_nan_opt, NAN_OPTS, "pydnnNanPropagation_t")
    lo, hi = scalar("lclip", lclip), scalar("rclip", rclip)
    if mode == E.PYDNN_RNN_CLIP_MINMAX:
        if d.cell != LSTM:
            _bad(f"clipMode: PYDNN_RNN_CLIP_MINMAX clips LSTM cells only (cellMode is {d.cell})")
        if not lo <= hi:
            _bad(f"lclip: {lo!r} must not exceed rclip {hi!r}")
    d.clip_mode, d.clip_nan, d.lclip, d.rclip = mode, nan, lo, hi
    d.version += 1


@api
def rnn_get_clip_v9(rnn_desc):
    """cudnnRNNGetClip_v9 -> (clipMode, clipNanOpt, lclip, rclip)."""
    d = set_rnn(rnn_desc)
    return (d.clip_mode, d.clip_nan, d.lclip, d.rclip)


# ----------------------------------------------------------------------------- the RNN data descriptor

class RNNDataDescriptor:
    """cudnnRNNDataDescriptor_t: sequence data x or y, with a length per batch entry."""

    __slots__ = ("dtype", "layout", "max_seq", "batch", "vector", "lengths", "fill", "is_set", "alive", "version",
                 "_rows")

    def __init__(self):
        self.is_set, self.alive, self.version = False, True, 0

    def rows(self):
        """Rows of `vector` elements the data spans: maxSeqLength * batch, or the sum of the lengths (packed)."""
        return self._rows

    def span_bytes(self):
        return self._rows * self.vector * DTYPES[self.dtype][0]

    def packed_offsets(self):
        """Packed layout: the first row of each time step (time t holds the sequences longer than t)."""
        offs, acc = [], 0
        for t in range(self.max_seq):
            offs.append(acc)
            acc += sum(1 for n in self.lengths if n > t)
        return offs


def _live_data(desc, name):
    if type(desc) is not RNNDataDescriptor or not desc.alive:
        _bad(f"{name}: not a live RNN data descriptor")
    return desc


def set_data(desc, name):
    if not _live_data(desc, name).is_set:
        _bad(f"{name}: descriptor was never set")
    return desc


@api
def create_rnn_data_descriptor():
    """cudnnCreateRNNDataDescriptor."""
    return RNNDataDescriptor()


@api
def destroy_rnn_data_descriptor(rnn_data_desc):
    """cudnnDestroyRNNDataDescriptor (None: nothing to do)."""
    if rnn_data_desc is None:
        return
    _live_data(rnn_data_desc, "rnnDataDesc").alive = False
    rnn_data_desc.version += 1


@api
def set_rnn_data_descriptor(rnn_data_desc, data_type, layout, max_seq_length, batch_size, vector_size,
                            seq_length_array, padding_fill):
    """cudnnSetRNNDataDescriptor. Layouts: SEQ_MAJOR_UNPACKED [maxSeqLength, batch, vector], BATCH_MAJOR_UNPACKED
    [batch, maxSeqLength, vector], SEQ_MAJOR_PACKED (time-major rows of the sequences still running at each
    step: the lengths must not increase along the batch). seqLengthArray: batchSize lengths, each in
    [1, maxSeqLength]. paddingFill: None (NULL) or a number: the forward writes it into y past each
    sequence's length (unpacked layouts). BAD_PARAM names the argument; NOT_SUPPORTED: a data type other
    than float / double / half / bfloat16."""
    d = _live_data(rnn_data_desc, "rnnDataDesc")
    dt = _float_type("dataType", data_type)
    lay = enum_arg("layout", layout, LAYOUTS, "pydnnRNNDataLayout_t")
    tmax = _positive("maxSeqLength", max_seq_length)
    b = _positive("batchSize", batch_size)
    v = _positive("vectorSize", vector_size)
    if hasattr(seq_length_array, "read"):  # the C face: a host array whose length is batchSize
        seq_length_array = seq_length_array.read(b)
    if seq_length_array is None:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM_NULL_POINTER, "seqLengthArray: NULL pointer")
    try:
        lens = [_int(f"seqLengthArray[{i}]", x) for i, x in enumerate(seq_length_array)]
    except TypeError:
        _bad(f"seqLengthArray: expected a sequence of integers, got {type(seq_length_array).__name__}")
    if len(lens) != b:
        _bad(f"seqLengthArray: {len(lens)} lengths for batchSize {b}")
    for i, n in enumerate(lens):
        if not 1 <= n <= tmax:
            _bad(f"seqLengthArray[{i}]: {n} is outside [1, {tmax}] (maxSeqLength)")
    if lay == E.PYDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED:
        for i in range(1, b):
            if lens[i] > lens[i - 1]:
                _bad(f"seqLengthArray[{i}]: {lens[i]} is longer than seqLengthArray[{i - 1}] {lens[i - 1]}; "
                     "the packed layout needs the sequences sorted by decreasing length")
    fill = None if padding_fill is None else scalar("paddingFill", padding_fill)
    d.dtype, d.layout, d.max_seq, d.batch, d.vector, d.lengths, d.fill = dt, lay, tmax, b, v, tuple(lens), fill
    d._rows = sum(lens) if lay == E.PYDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED else tmax * b
    d.is_set = True
    d.version += 1


@api
def get_rnn_data_descriptor(rnn_data_desc, array_length_requested):
    """cudnnGetRNNDataDescriptor -> (dataType, layout, maxSeqLength, batchSize, vectorSize,
    seqLengthArray[:arrayLengthRequested], paddingFill (None: none))."""
    d = set_data(rnn_data_desc, "rnnDataDesc")
    req = _int("arrayLengthRequested", array_length_requested)
    if req < 0:
        _bad(f"arrayLengthRequested: {req} is negative")
    return (d.dtype, d.layout, d.max_seq, d.batch, d.vector, list(d.lengths[:req]), d.fill)
