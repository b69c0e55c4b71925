"""The RNN C prototypes marshal onto the Python functions (pydnn/capi/impl.py's reading of each argument),
checked without building the library: device pointers, host arrays, outputs, the fill value, NULL-able
descriptors, and the Python signature matching the C inputs."""
import inspect

import pydnn
from pydnn.capi import decl, impl
from pydnn.ops import rnn

PROTOS = {impl.parse(p)[1]: impl.parse(p)[2] for p, _ in rnn.C_API[0][1]}


def kinds(name):
    return {n: (k, b) for k, b, n in PROTOS[name]}


def test_every_rnn_function_is_declared_and_maps_onto_python():
    assert len(PROTOS) == 17
    for c_name, params in PROTOS.items():
        fn = getattr(pydnn, impl.snake(c_name[len("pydnn"):]))
        inputs = [n for k, _, n in params if k in ("obj_in", "in", "devptr", "scalar", "arr_in", "fill_in")]
        assert len(inspect.signature(fn).parameters) == len(inputs), c_name
    assert {t for t, _ in rnn.C_OPAQUE_TYPES} <= {t for t, _ in decl.OPAQUE_TYPES}


def test_argument_kinds():
    k = kinds("pydnnRNNForward")
    assert k["devSeqLengths"][0] == "devptr" and k["x"][0] == "devptr" and k["hx"][0] == "devptr"
    assert k["xDesc"][0] == "obj_in" and k["weightSpaceSize"][0] == "in"
    k = kinds("pydnnGetRNNWeightParams")
    assert k["mAddr"] == ("out", "void *") and k["bAddr"] == ("out", "void *") and k["weightSpace"][0] == "devptr"
    k = kinds("pydnnSetRNNDataDescriptor")
    assert k["seqLengthArray"][0] == "arr_in" and k["paddingFill"][0] == "fill_in"
    k = kinds("pydnnGetRNNDataDescriptor")
    assert k["seqLengthArray"][0] == "arr_out" and k["paddingFill"] == ("out", "fill")
    k = kinds("pydnnGetRNNDescriptor_v8")
    assert k["dropoutDesc"][0] == "obj_out" and k["auxFlags"][0] == "out"
    k = kinds("pydnnRNNSetClip_v9")
    assert k["lclip"] == ("in", "double")
    for name, nullable in rnn.C_NULLABLE.items():
        assert set(nullable) <= set(kinds(name)), name
