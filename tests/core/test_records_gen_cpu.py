"""The records' generation (pydnn.tuning.RECORDS_GEN): what keeps records held outside Python's caches true -
libpydnn's C fast path (pydnn/capi/fastpath.py) and activation_forward's compiled call-site slots
(pydnn/_build/fastcall.py) answer a call without reading descriptor versions, so every change of a descriptor,
a handle or a switch must move it. Checked here: which public functions move it (status.mutates), that they do
(and only they, among the cheap calls), and, from the source, that every place a descriptor's version moves is
inside such a function (or a tensor descriptor's _assign, which moves it itself)."""
import ast
import sys
from pathlib import Path

import pytest

import pydnn
from pydnn import tuning
from pydnn.status import mutates

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "tools"))

PUBLIC = sorted(n for n in dir(pydnn) if getattr(getattr(pydnn, n), "__pydnn_api__", False))


def test_mutators_are_the_sets_and_destroys():
    muts = {n for n in PUBLIC if mutates(n)}
    for n in PUBLIC:
        if (n.startswith("set_") and n != "set_tensor") or n.startswith("destroy"):
            assert n in muts, n
    assert {"set_stream", "destroy", "derive_bn_tensor_descriptor", "derive_norm_param_descriptors",
            "restore_dropout_descriptor", "backend_set_attribute", "backend_finalize",
            "backend_destroy_descriptor", "rnn_set_clip_v9"} <= muts
    for n in ("set_tensor", "activation_forward", "get_tensor4d_descriptor", "create_tensor_descriptor",
              "convolution_forward", "get_stream", "backend_execute", "get_convolution_forward_workspace_size"):
        assert n not in muts, n


def _moves(fn):
    g0 = tuning.RECORDS_GEN[0]
    try:
        fn()
    except pydnn.PydnnError:
        pass
    return tuning.RECORDS_GEN[0] != g0


def test_sets_destroys_switches_move_it_and_queries_do_not():
    import bench_host as B

    h = B.cpu_handle()
    t = pydnn.create_tensor_descriptor()
    a = pydnn.create_activation_descriptor()
    assert _moves(lambda: pydnn.set_tensor4d_descriptor(t, 0, 0, 1, 2, 3, 4))
    assert _moves(lambda: pydnn.set_activation_descriptor(a, pydnn.PYDNN_ACTIVATION_RELU, 0, 0.0))
    assert _moves(lambda: pydnn.set_tensor4d_descriptor(t, 0, 0, -1, 2, 3, 4))  # failed: moves all the same
    assert _moves(lambda: pydnn.set_stream(h, 0x1234))
    assert _moves(lambda: setattr(tuning.callpath, "MHA_PLANS", True))
    assert _moves(tuning.reset)
    assert not _moves(lambda: pydnn.get_tensor4d_descriptor(t))
    assert not _moves(lambda: pydnn.get_tensor_size_in_bytes(t))
    assert not _moves(lambda: pydnn.get_stream(h))
    assert not _moves(lambda: pydnn.create_tensor_descriptor())
    assert _moves(lambda: pydnn.destroy_activation_descriptor(a))
    assert _moves(lambda: pydnn.destroy_tensor_descriptor(t))
    assert _moves(lambda: pydnn.destroy(h))


def test_values_are_never_stored_twice():
    """Each move stores a value no earlier move stored (a count, not `+= 1`): two threads moving it at once
    cannot leave it at a value a record was made under."""
    import threading

    seen = []

    def work():
        for _ in range(2000):
            tuning.bump_records()
            seen.append(tuning.RECORDS_GEN[0])

    ts = [threading.Thread(target=work) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    # a value may be read twice (another thread stored nothing in between) but is stored once: check the counter
    assert len(set(seen)) >= 2000
    v = tuning.RECORDS_GEN[0]
    tuning.bump_records()
    assert tuning.RECORDS_GEN[0] > v


def _version_sites():
    """(file, enclosing function, line) of every `<x>.version += 1` in pydnn/."""
    out = []
    for path in (ROOT / "pydnn").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if (isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Attribute)
                        and node.target.attr == "version"):
                    out.append((path, fn.name, node.lineno))
    return out


def test_every_version_move_is_inside_a_mutator():
    """A descriptor's version moves only in a function that moves the records' generation: a public mutator,
    or an _assign helper whose every caller in its file is one (the tensor descriptor's _assign moves it
    itself: a Get* that writes a caller's descriptor calls it)."""
    sites = _version_sites()
    assert len(sites) > 30
    for path, name, line in sites:
        if mutates(name):
            continue
        assert name == "_assign", (str(path), name, line)
        if path.name == "tensor.py":
            assert "RECORDS_GEN[0] = next(_records_count)" in path.read_text()
            continue
        tree = ast.parse(path.read_text())
        callers = set()
        for fn in ast.walk(tree):
            if isinstance(fn, ast.FunctionDef):
                for node in ast.walk(fn):
                    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "_assign"):
                        callers.add(fn.name)
        assert callers and all(mutates(c) for c in callers), (str(path), callers)


@pytest.mark.parametrize("name", ["set_tensor4d_descriptor", "destroy_tensor_descriptor", "set_stream"])
def test_mutators_keep_api_behaviour(name):
    """The mutators' wrapper is api's: Python misuse stays a TypeError, pydnn's checks a PydnnError, and the
    last-error text names the function."""
    fn = getattr(pydnn, name)
    with pytest.raises(TypeError) as ei:
        fn(*([None] * 40))
    assert not isinstance(ei.value, pydnn.PydnnError)
    assert pydnn.get_last_error_string().startswith(name + ": ")
    with pytest.raises(pydnn.PydnnError):
        fn(*([object()] * fn.__wrapped__.__code__.co_argcount))
    assert pydnn.get_last_error_string().startswith(name + ": ")
