"""The C functions' bodies, generated from the prototypes in decl.py: each C call is marshalled to the
Python function of the same name (pydnnSetTensor4dDescriptor -> pydnn.set_tensor4d_descriptor), its
outputs written through the caller's pointers, and any failure returned as a status with the message
kept for pydnnGetLastErrorString. Runs inside libpydnn's embedded interpreter (register() is called by
the library's init code with its ffi); never imported by plain Python code.
"""
import re
import struct
import threading

import pydnn
from pydnn import enums as E
from pydnn.status import PydnnError, set_last_error

from . import decl

# `const void *` host scalars: valuePtr and every alpha*/beta* (alpha1, alphaDataDiff, betaParamDiff, ...)
_SCALAR = re.compile(r"^(alpha|beta)[A-Za-z0-9]*$|^valuePtr$")
NULLABLE = decl.NULLABLE
OPAQUE = {t for t, _ in decl.OPAQUE_TYPES}
# struct types returned as arrays: name -> field names (a field `int reserved[3]` is left zero)
STRUCT_FIELDS = {n: [f.split()[-1] for f in fields if "[" not in f] for n, fields in decl.STRUCTS}
_PROTO = re.compile(r"^(?P<ret>.*?)\b(?P<name>pydnn\w+)\((?P<params>.*)\);$")

_objects = {}  # address of an opaque pointer handed to C -> (its cffi handle, the Python object)
_lock = threading.Lock()


def snake(c_name):
    s = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", c_name)
    return re.sub(r"(?<=[A-Z])(?=[A-Z][a-z])", "_", s).lower()


def parse(proto):
    """(return type, name, [(kind, base type, arg name)]) for one prototype."""
    m = _PROTO.match(proto.strip())
    params = []
    raw = m["params"].strip()
    for p in ([] if raw == "void" else raw.split(",")):
        p = p.strip()
        array = p.endswith("[]")
        p = p[:-2] if array else p
        typ, name = p.rsplit(None, 1)
        stars = name.count("*") + typ.count("*")
        name = name.lstrip("*")
        is_const = typ.startswith("const ")
        base = typ.replace("const ", "").replace("*", "").strip()
        if base in OPAQUE:
            kind = "obj_out" if stars else "obj_in"
        elif base in STRUCT_FIELDS and stars:  # an array of result records (length: requested*Count)
            kind = "struct_out"
        elif base == "void" and name == "paddingFill":  # a host value in the descriptor's dataType (SeqData)
            kind, base = ("out", "fill") if m["name"].startswith("pydnnGet") else ("fill_in", base)
        elif base == "void" and stars >= 2:  # `void **name`: a device address returned (GetDropoutDescriptor)
            kind, base = "out", "void *"
        elif base == "void":
            kind = "scalar" if _SCALAR.match(name) else "devptr"
        elif array:
            kind = "arr_in" if is_const else "arr_out"
        elif stars:
            kind = "out"
        else:
            kind = "in"
        params.append((kind, base, name))
    return m["ret"].strip(), m["name"], params


class HostArray:
    """A `const int name[]` input with no count argument before it (cuDNN's loWinIdx / hiWinIdx): the Python
    function knows its length and calls read(n)."""

    def __init__(self, ffi, ptr):
        self.ffi, self.ptr = ffi, ptr

    def read(self, n):
        return list(self.ffi.unpack(self.ffi.cast("int *", self.ptr), max(0, int(n))))


def _fill_format(dtype):
    return {E.PYDNN_DATA_DOUBLE: "<d", E.PYDNN_DATA_HALF: "<e"}.get(dtype, "<f")


class Marshal:
    """Converts between one C function's arguments and its Python function."""

    def __init__(self, ffi, proto):
        self.ffi = ffi
        self.ret, self.c_name, self.params = parse(proto)
        self.py_name = snake(self.c_name[len("pydnn"):])
        self.destroys_descriptor = (self.c_name.startswith("pydnnDestroy") and self.c_name.endswith("Descriptor")) \
            or self.c_name == "pydnnBackendDestroyDescriptor"
        self.nullable = NULLABLE.get(self.c_name, ())
        self.destroys = self.c_name.startswith("pydnnDestroy") or self.destroys_descriptor
        self._uintptr = ffi.typeof("uintptr_t")
        # What every call would otherwise work out again from the argument names and types (the C face's
        # per-call cost): per parameter, (kind, base, name, info), info holding the "in" roles
        # (stream, requested count, dims count, array-size count, dataType) or an output's pointer ctype.
        self.steps = []
        for kind, base, name in self.params:
            info = None
            if kind == "in":
                role = 1 if (name.startswith("nbDims") or name.startswith("arrayLength")) else (
                    2 if (name.endswith("ArraySize") or name.endswith("SizeRequested")) else 0)
                info = (base == "cudaStream_t", name.startswith("requested"), role, name == "dataType")
            elif kind in ("out", "obj_out") and base not in ("fill", "void *", "cudaStream_t"):
                info = ffi.typeof(f"{base} *")
            self.steps.append((kind, base, name, info))
        self.has_struct_out = any(k == "struct_out" for k, _, _ in self.params)
        self.rnn_lengths = self.c_name == "pydnnGetRNNDataDescriptor"

    def python_function(self):
        """Looked up at call time, so a family missing from this pydnn fails its own calls, not the library."""
        fn = getattr(pydnn, self.py_name, None)
        if fn is None:
            raise PydnnError(E.PYDNN_STATUS_NOT_SUPPORTED,
                             f"not available in this pydnn (pydnn.{self.py_name} is missing)")
        return fn

    def obj(self, ptr, name, ctype):
        if ptr == self.ffi.NULL:
            if name in self.nullable or self.destroys_descriptor:
                return None  # cuDNN: destroying a NULL descriptor does nothing
            raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{name}: NULL {ctype}")
        entry = _objects.get(int(self.ffi.cast(self._uintptr, ptr)))
        if entry is None:
            raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{name}: not a live {ctype} created by pydnn")
        return entry[1]

    def scalar(self, ptr, name, ref):
        """A host scalar: float or double by the output tensor's type; SetTensor's value in y's type."""
        ffi = self.ffi
        if ptr == ffi.NULL:
            raise PydnnError(E.PYDNN_STATUS_BAD_PARAM_NULL_POINTER, f"{name}: NULL pointer")
        dtype = getattr(ref, "dtype", E.PYDNN_DATA_FLOAT)
        if dtype == E.PYDNN_DATA_DOUBLE:
            return ffi.cast("double *", ptr)[0]
        if name != "valuePtr":
            return ffi.cast("float *", ptr)[0]
        raw = bytes(ffi.buffer(ffi.cast("char *", ptr), pydnn.tensor.DTYPES.get(dtype, (4,))[0]))
        if dtype == E.PYDNN_DATA_HALF:
            return struct.unpack("<e", raw)[0]
        if dtype == E.PYDNN_DATA_BFLOAT16:
            return struct.unpack("<f", b"\0\0" + raw)[0]
        fmt = {E.PYDNN_DATA_INT8: "<b", E.PYDNN_DATA_UINT8: "<B", E.PYDNN_DATA_INT32: "<i",
               E.PYDNN_DATA_INT64: "<q"}.get(dtype, "<f")
        return struct.unpack(fmt, raw)[0]

    def __call__(self, *cargs):
        ffi = self.ffi
        args, outs, ref, count, requested = [], [], None, None, 0
        scalars, cap, dtype_arg = [], E.PYDNN_DIM_MAX, None
        for (kind, base, name, info), a in zip(self.steps, cargs):
            if kind == "obj_in":
                o = self.obj(a, name, base)
                if base == "pydnnTensorDescriptor_t":
                    ref = o  # the last tensor descriptor is the output's
                args.append(o)
            elif kind == "in":
                is_stream, is_requested, role, is_dtype = info
                if is_requested:
                    requested = a  # the capacity of a struct_out array (requestedAlgoCount)
                if role == 1:
                    count = a  # the length of the array arguments that follow (cuDNN's convolution: arrayLength)
                    if self.rnn_lengths:
                        cap = 2**31 - 1  # GetRNNDataDescriptor: sequence lengths, not dims
                elif role == 2:
                    count, cap = a, 2**31 - 1  # seqLengthArraySize / seqLengthSizeRequested: not a dim count
                if is_dtype:
                    dtype_arg = a
                args.append(int(ffi.cast(self._uintptr, a)) if is_stream else a)
            elif kind == "devptr":
                args.append(int(ffi.cast(self._uintptr, a)))
            elif kind == "scalar":
                scalars.append(len(args))
                args.append((a, name))
            elif kind == "fill_in":  # NULL: no fill; else the value in dataType (SetSeqDataDescriptor)
                if a == ffi.NULL:
                    args.append(None)
                elif dtype_arg == E.PYDNN_DATA_BFLOAT16:
                    raw = bytes(ffi.buffer(ffi.cast("char *", a), 2))
                    args.append(struct.unpack("<f", b"\0\0" + raw)[0])
                else:
                    fmt = _fill_format(dtype_arg)
                    raw = bytes(ffi.buffer(ffi.cast("char *", a), struct.calcsize(fmt)))
                    args.append(struct.unpack(fmt, raw)[0])
            elif kind == "arr_in" and count is None:  # no count argument: the Python side knows the length
                if a == ffi.NULL:
                    raise PydnnError(E.PYDNN_STATUS_BAD_PARAM_NULL_POINTER, f"{name}: NULL pointer")
                args.append(HostArray(ffi, a))
            elif kind == "arr_in":
                if a == ffi.NULL:
                    raise PydnnError(E.PYDNN_STATUS_BAD_PARAM_NULL_POINTER, f"{name}: NULL pointer")
                n = max(0, min(int(count or 0), cap))
                args.append(list(ffi.unpack(ffi.cast("int *", a), n)))
            else:  # out, obj_out, arr_out: checked before the call so a NULL never leaves work half done
                if a == ffi.NULL:
                    if name in self.nullable:
                        outs.append((kind, base, name, None, count, cap, info))  # not returned (cuDNN: optional)
                        continue
                    raise PydnnError(E.PYDNN_STATUS_BAD_PARAM_NULL_POINTER, f"{name}: NULL pointer")
                outs.append((kind, base, name, a, count, cap, info))
        for i in scalars:
            args[i] = self.scalar(args[i][0], args[i][1], ref)
        result = self.python_function()(*args)
        if self.destroys and cargs and cargs[0] != ffi.NULL:
            _objects.pop(int(ffi.cast(self._uintptr, cargs[0])), None)
        if not outs:
            return args  # the Python arguments (libpydnn's C fast path keys its records by them)
        if self.has_struct_out:
            # the Python function returns the records; the C face also writes how many (returned*Count)
            recs = list(result)[: max(0, int(requested))]
            values = [recs if o[0] == "struct_out" else len(recs) for o in outs]
        else:
            values = [result] if len(outs) == 1 else list(result or ())
        for out, v in zip(outs, values):
            try:
                if out[0] == "out" and out[6] is not None and out[3] is not None:
                    ffi.cast(out[6], out[3])[0] = v  # a plain value (the common case), inline
                else:
                    self.write(out, v, values)
            except OverflowError:  # a value C's type cannot hold (a stride past INT_MAX into an int *)
                raise PydnnError(E.PYDNN_STATUS_NOT_SUPPORTED,
                                 f"{out[2]}: {v!r} does not fit the C type {out[1]} (the Python API returns it)") from None

    def write(self, out, v, values):
        """Write one result through the caller's pointer."""
        ffi = self.ffi
        kind, base, name, ptr, count, cap, info = out
        if ptr is not None:
            if kind == "out" and info is not None:  # a plain value (the common case)
                ffi.cast(info, ptr)[0] = v
            elif base == "fill":  # the fill value in the descriptor's data type (the first result)
                if v is not None:
                    dt = values[0]
                    data = (struct.pack("<f", v)[2:] if dt == E.PYDNN_DATA_BFLOAT16
                            else struct.pack(_fill_format(dt), v))
                    ffi.memmove(ptr, data, len(data))
            elif kind == "obj_out":
                if v is None:  # an optional descriptor that is not there (GetAttnDescriptor's dropouts)
                    ffi.cast(info, ptr)[0] = ffi.NULL
                    return
                with _lock:  # an object C already holds keeps its address (a getter's; a Create's is new)
                    addr = None if self.c_name.startswith("pydnnCreate") else next(
                        (k for k, e in _objects.items() if e[1] is v), None)
                    if addr is None:
                        h = ffi.new_handle(v)
                        addr = int(ffi.cast(self._uintptr, h))
                        _objects[addr] = (h, v)
                ffi.cast(info, ptr)[0] = ffi.cast(base, addr)
            elif kind == "struct_out":
                arr = ffi.cast(f"{base} *", ptr)
                for i, rec in enumerate(v):
                    for field, x in zip(STRUCT_FIELDS[base], rec):
                        setattr(arr[i], field, x)
            elif kind == "arr_out":  # never more than the caller's count (nbDimsRequested) entries
                arr = ffi.cast("int *", ptr)
                for i, x in enumerate(list(v)[: max(0, min(int(count or 0), cap))]):
                    arr[i] = x
            elif base == "cudaStream_t":
                ffi.cast("cudaStream_t *", ptr)[0] = ffi.cast("cudaStream_t", v)
            elif base == "void *":
                ffi.cast("void **", ptr)[0] = ffi.cast("void *", v or 0)
            else:  # pragma: no cover - every other output has its pointer ctype in info
                ffi.cast(f"{base} *", ptr)[0] = v


def _on_error(c_name):
    """cffi's onerror hook: an exception that escapes a function's body (a pydnn bug) is kept as the last
    error instead of printed, and the C caller gets the function's error value."""
    def onerror(exc_type, exc_value, _tb):
        set_last_error(f"{c_name}: internal error: {exc_type.__name__}: {exc_value}")
    return onerror


def register(ffi, lib=None):
    """Define every C function of decl.py with `ffi.def_extern` (called by libpydnn's init code with its
    ffi and lib). With lib, the functions of capi/fastpath.py are defined under their slow names (libpydnn's
    C wrappers call them when their record table has no answer), and the records' generation is
    pydnn.tuning.RECORDS_GEN: moved by every call that changes a descriptor or a handle (status.mutates),
    from C or Python; the C face bumps it again after its own such calls (a function that is not
    api-wrapped still moves it)."""
    from pydnn import tuning
    from pydnn.status import mutates

    from . import fastpath

    error_strings = {}
    if lib is not None:
        lib._pydnn_fast_set_gen(ffi.cast("void *", tuning.records_gen_address()))

    def export(name, fn, error):
        ffi.def_extern(name=name, error=error, onerror=_on_error(name))(fn)

    for proto in decl.prototypes():
        ret, c_name, _ = parse(proto)
        if ret != "pydnnStatus_t":
            continue
        m = Marshal(ffi, proto)

        if lib is not None and c_name in fastpath.FAST:
            def call(*cargs, _m=m, _epoch=lib._pydnn_fast_epoch, _local=lib._pydnn_fast_local):
                e0, l0 = _epoch(), _local()
                try:
                    args = _m(*cargs)
                except PydnnError as e:
                    set_last_error(f"{_m.c_name}: {e.message}")
                    return e.status
                except Exception as e:  # noqa: BLE001 - a C caller gets a status, never a Python exception
                    set_last_error(f"{_m.c_name}: internal error: {type(e).__name__}: {e}")
                    return E.PYDNN_STATUS_INTERNAL_ERROR
                try:
                    fastpath.install(ffi, lib, _m.c_name, cargs, args, e0, l0)
                except Exception:  # noqa: BLE001 - no record: later calls take this slow path again
                    pass
                return E.PYDNN_STATUS_SUCCESS

            export(fastpath.slow_name(c_name), call, E.PYDNN_STATUS_INTERNAL_ERROR)
            continue

        bump = tuning.bump_records if mutates(m.py_name) else None

        def call(*cargs, _m=m, _bump=bump):
            try:
                _m(*cargs)
                return E.PYDNN_STATUS_SUCCESS
            except PydnnError as e:
                set_last_error(f"{_m.c_name}: {e.message}")
                return e.status
            except Exception as e:  # noqa: BLE001 - a C caller gets a status, never a Python exception
                set_last_error(f"{_m.c_name}: internal error: {type(e).__name__}: {e}")
                return E.PYDNN_STATUS_INTERNAL_ERROR
            finally:
                if _bump is not None:
                    _bump()

        export(c_name, call, E.PYDNN_STATUS_INTERNAL_ERROR)

    def get_error_string(status):
        name = pydnn.get_error_string(status)
        s = error_strings.get(name)
        if s is None:  # one per name, kept for the library's lifetime: the caller holds a static string
            s = error_strings.setdefault(name, ffi.new("char[]", name.encode()))  # a racing thread's copy loses
        return s

    def get_last_error_string(message, max_size):
        if message == ffi.NULL or max_size == 0:
            return
        data = pydnn.get_last_error_string().encode()[: max_size - 1]
        ffi.memmove(message, data + b"\0", len(data) + 1)

    export("pydnnGetVersion", lambda: pydnn.get_version(), 0)
    export("pydnnGetCudartVersion", lambda: pydnn.get_cudart_version(), 0)
    export("pydnnGetErrorString", get_error_string, ffi.NULL)
    export("pydnnGetLastErrorString", get_last_error_string, None)
