"""Every public pydnn function, called with random bad and edge-case arguments (hypothesis, CPU).

Arguments are drawn per parameter from junk (wrong types, None, NaN, negative and huge integers, strings,
lists, host arrays), pointer values (NULL, negative, unaligned, 2^70), and live objects of every pydnn
kind: a handle that passes every check but has no kernels, descriptors of every type set to something
valid (4-d float and half tensors, filters, activations, pooling, convolution, ...), unset, or destroyed,
so that calls reach deep into validation. Each call must succeed, raise a PydnnError with a known status
other than INTERNAL_ERROR and a non-empty message naming the function (get_last_error_string), or - only
when the arguments do not bind to the signature (wrong count, unknown keyword) - Python's TypeError.
Nothing else, and no crash. The driver is replaced by one that reports NOT_INITIALIZED, so the test means
the same on a machine with a GPU.

PYDNN_FUZZ_EXAMPLES (default 30) sets the examples per function; the run's totals are printed by the last
test (pytest -s) and written to $PYDNN_FUZZ_REPORT when set.
"""
import collections
import inspect
import json
import math
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pydnn
from pydnn._cuda import driver
from pydnn.handle import Handle

PUBLIC = sorted(n for n in dir(pydnn) if getattr(getattr(pydnn, n), "__pydnn_api__", False))
STATUSES = set(pydnn.ENUMS["pydnnStatus_t"].values()) - {pydnn.PYDNN_STATUS_SUCCESS}
EXAMPLES = int(os.environ.get("PYDNN_FUZZ_EXAMPLES", "30"))
STATS = collections.Counter()
OUTCOMES = collections.Counter()


class _NoKernels(dict):
    def get(self, key, default=None):
        raise pydnn.PydnnError(pydnn.PYDNN_STATUS_NOT_INITIALIZED, "fuzz handle: no kernels on this CPU")


def _handle(alive=True):
    h = Handle.__new__(Handle)
    h.ctx, h.device, h.arch, h.sm_count, h.stream, h.cu_stream, h.alive = None, 0, "sm_90", 132, 0, None, alive
    h._funcs, h.prepared = _NoKernels(), {}
    return h


@pytest.fixture(autouse=True)
def _no_driver(monkeypatch):
    def none():
        raise pydnn.PydnnError(pydnn.PYDNN_STATUS_NOT_INITIALIZED, "fuzz: no CUDA driver")

    monkeypatch.setattr(driver, "_driver", none)
    monkeypatch.setattr(driver, "_drv", None)


def _try(fn, *args):
    try:
        fn(*args)
    except pydnn.PydnnError:
        pass


def _objects():
    """Fresh live objects of every kind, some set to valid values, some unset, some destroyed."""
    P = pydnn
    objs = {"handle": _handle(), "dead handle": _handle(alive=False)}
    for dtype, name in ((P.PYDNN_DATA_FLOAT, "f32"), (P.PYDNN_DATA_HALF, "f16"), (P.PYDNN_DATA_DOUBLE, "f64")):
        t = P.create_tensor_descriptor()
        P.set_tensor4d_descriptor(t, P.PYDNN_TENSOR_NCHW, dtype, 2, 3, 4, 5)
        objs[f"tensor {name}"] = t
    t = P.create_tensor_descriptor()
    P.set_tensor_nd_descriptor(t, P.PYDNN_DATA_FLOAT, 3, [2, 3, 4], [12, 4, 1])
    objs["tensor 3d"] = t
    t = P.create_tensor_descriptor()
    P.set_tensor4d_descriptor(t, P.PYDNN_TENSOR_NCHW, P.PYDNN_DATA_FLOAT, 1, 3, 1, 1)
    objs["tensor 1c11"] = t
    t = P.create_tensor_descriptor()
    P.set_tensor4d_descriptor(t, P.PYDNN_TENSOR_NHWC, P.PYDNN_DATA_HALF, 2, 64, 8, 8)
    objs["tensor nhwc"] = t
    objs["tensor unset"] = P.create_tensor_descriptor()
    dead = P.create_tensor_descriptor()
    P.set_tensor4d_descriptor(dead, P.PYDNN_TENSOR_NCHW, P.PYDNN_DATA_FLOAT, 2, 3, 4, 5)
    P.destroy_tensor_descriptor(dead)
    objs["tensor destroyed"] = dead
    f = P.create_filter_descriptor()
    P.set_filter4d_descriptor(f, P.PYDNN_DATA_FLOAT, P.PYDNN_TENSOR_NCHW, 4, 3, 3, 3)
    objs["filter"] = f
    objs["filter unset"] = P.create_filter_descriptor()
    a = P.create_activation_descriptor()
    P.set_activation_descriptor(a, P.PYDNN_ACTIVATION_RELU, P.PYDNN_NOT_PROPAGATE_NAN, 0.0)
    objs["activation"] = a
    objs["activation unset"] = P.create_activation_descriptor()
    da = P.create_activation_descriptor()
    P.destroy_activation_descriptor(da)
    objs["activation destroyed"] = da
    o = P.create_op_tensor_descriptor()
    P.set_op_tensor_descriptor(o, P.PYDNN_OP_TENSOR_ADD, P.PYDNN_DATA_FLOAT, P.PYDNN_NOT_PROPAGATE_NAN)
    objs["op tensor"] = o
    r = P.create_reduce_tensor_descriptor()
    P.set_reduce_tensor_descriptor(r, P.PYDNN_REDUCE_TENSOR_MAX, P.PYDNN_DATA_FLOAT, P.PYDNN_NOT_PROPAGATE_NAN,
                                   P.PYDNN_REDUCE_TENSOR_FLATTENED_INDICES, P.PYDNN_32BIT_INDICES)
    objs["reduce"] = r
    p = P.create_pooling_descriptor()
    P.set_pooling2d_descriptor(p, P.PYDNN_POOLING_MAX, P.PYDNN_NOT_PROPAGATE_NAN, 2, 2, 0, 0, 2, 2)
    objs["pooling"] = p
    objs["pooling unset"] = P.create_pooling_descriptor()
    c = P.create_convolution_descriptor()
    P.set_convolution2d_descriptor(c, 1, 1, 1, 1, 1, 1, P.PYDNN_CROSS_CORRELATION, P.PYDNN_DATA_FLOAT)
    objs["convolution"] = c
    dc = P.create_convolution_descriptor()
    P.destroy_convolution_descriptor(dc)
    objs["convolution destroyed"] = dc
    n = P.create_norm_descriptor()
    P.set_norm_descriptor(n, P.PYDNN_NORM_KIND_LAYER, 1, 3, 1e-5, None)
    objs["norm"] = n
    objs["dropout unset"] = P.create_dropout_descriptor()
    at = P.create_attention_descriptor()
    _try(P.set_attention_descriptor, at, 2, 2, 64, 0.125, 0, 0.0, 0)
    objs["attention"] = at
    objs["attn unset"] = P.create_attn_descriptor()
    objs["seq data unset"] = P.create_seq_data_descriptor()
    return objs


POINTERS = [1 << 32, (1 << 32) + 2, 0, -1, 2**64 + 16, 2**70, np.int64(1 << 33), np.uint32(7)]


class _Weird:
    """An object that is nothing pydnn knows, with a __float__ and __index__ that raise."""

    def __float__(self):
        raise ValueError("no float here")

    def __index__(self):
        raise OverflowError("no index here")


class _FakeCAI:
    def __init__(self, ptr, shape, typestr="<f4"):
        self.__cuda_array_interface__ = {"data": (ptr, False), "shape": shape, "typestr": typestr,
                                         "strides": None, "version": 3}


junk = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70), st.integers(-3, 70),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([math.nan, -0.0, 1e308, -1e-320]),
    st.text(max_size=4), st.binary(max_size=4), st.lists(st.integers(-3, 9), max_size=10),
    st.lists(st.integers(-2**40, 2**40), max_size=3), st.tuples(st.integers(0, 4), st.integers(0, 4)),
    st.just(np.zeros(4, np.float32)), st.just(np.float64(1.5)), st.just(_Weird()), st.just(object()),
    st.builds(_FakeCAI, st.sampled_from([1 << 32, 0]), st.sampled_from([(4,), (0,), (2, 3, 4, 5)])),
    st.just({"a": 1}), st.just(complex(1, 2)),
)


def _is_desc_param(name):
    return name.endswith("desc") or name in ("handle", "activation_desc")


def _param_strategy(name, objs):
    pool = sorted(objs)
    live = st.sampled_from(pool).map(lambda k: objs[k])
    if name == "handle":
        return st.one_of(st.just(objs["handle"]), st.just(objs["handle"]), st.just(objs["dead handle"]), junk, live)
    if _is_desc_param(name):
        return st.one_of(live, live, live, junk)
    small = st.integers(-2, 70)
    enumish = st.sampled_from(sorted({v for vals in pydnn.ENUMS.values() for v in vals.values()
                                      if -5 < v < 2000}))
    return st.one_of(junk, small, enumish, st.sampled_from(POINTERS), live,
                     st.lists(small, min_size=1, max_size=9), st.floats(-4, 4))


def _call(name, args, kwargs=None):
    fn = getattr(pydnn, name)
    sig = inspect.signature(fn)
    try:
        sig.bind(*args, **(kwargs or {}))
        binds = True
    except TypeError:
        binds = False
    STATS["cases"] += 1
    try:
        fn(*args, **(kwargs or {}))
    except pydnn.PydnnError as e:
        assert binds, f"{name}: arguments that do not bind raised PydnnError {e}"
        assert e.status in STATUSES, e
        assert e.status != pydnn.PYDNN_STATUS_INTERNAL_ERROR, f"{name}{tuple(args)!r}: {e}"
        assert e.message and isinstance(e.message, str), e
        assert pydnn.get_last_error_string() == f"{name}: {e.message}", pydnn.get_last_error_string()
        OUTCOMES[pydnn.get_error_string(e.status)] += 1
        return
    except TypeError as e:
        assert not binds, f"{name}: a TypeError although the arguments bind: {e!r}"
        OUTCOMES["TypeError (arity)"] += 1
        return
    assert binds, f"{name}: arguments that do not bind succeeded"
    OUTCOMES["success"] += 1


@pytest.mark.parametrize("name", PUBLIC)
def test_fuzz_public_function(name):
    params = list(inspect.signature(getattr(pydnn, name)).parameters)

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                     HealthCheck.data_too_large])
    @given(st.data())
    def run(data):
        objs = _objects()
        args = [data.draw(_param_strategy(p, objs), label=p) for p in params]
        arity = data.draw(st.sampled_from(["exact"] * 8 + ["one more", "one less", "bad keyword"]), label="arity")
        if arity == "one more":
            args.append(None)
        elif arity == "one less" and args:
            args.pop()
        if arity == "bad keyword":
            _call(name, args, {"no_such_argument": 1})
        else:
            _call(name, args)
        STATS[name] += 1

    run()


def test_zz_report():
    """The run's totals (printed with -s; also $PYDNN_FUZZ_REPORT as JSON)."""
    functions = sum(1 for n in PUBLIC if STATS[n])
    report = {"cases": STATS["cases"], "functions": functions, "examples_per_function": EXAMPLES,
              "outcomes": dict(OUTCOMES.most_common())}
    print("\nfuzz report:", json.dumps(report, indent=1))
    if os.environ.get("PYDNN_FUZZ_REPORT"):
        with open(os.environ["PYDNN_FUZZ_REPORT"], "w") as f:
            json.dump(report, f, indent=1)
    if functions == len(PUBLIC):  # the whole file ran
        assert report["cases"] >= len(PUBLIC) * min(EXAMPLES, 10)
