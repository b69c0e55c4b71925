"""cuDNN's backend API with the pydnn prefix (Python names are the snake_case of the C ones):

    d = backend_create_descriptor(PYDNN_BACKEND_TENSOR_DESCRIPTOR)
    backend_set_attribute(d, PYDNN_ATTR_TENSOR_DIMENSIONS, PYDNN_TYPE_INT64, 3, [2, 64, 64])
    backend_finalize(d)                                   # validate + freeze
    count, values = backend_get_attribute(d, PYDNN_ATTR_TENSOR_DIMENSIONS, PYDNN_TYPE_INT64, 8)
    backend_execute(handle, plan, variant_pack)
    backend_destroy_descriptor(d)

From C, `arrayOfElements` is the host address of elementCount elements of the attribute type (descriptor
handles for PYDNN_TYPE_BACKEND_DESCRIPTOR); the Python function reads / writes it when given an int.
"""
import ctypes

from .. import enums as E
from ..status import api
from . import descriptors as D
from . import opgraph  # noqa: F401 - registers the OPERATIONGRAPH finalizer
from . import plans

__all__ = ["backend_create_descriptor", "backend_destroy_descriptor", "backend_finalize", "backend_set_attribute",
           "backend_get_attribute", "backend_execute"]

_CT = {"INT64": ctypes.c_int64, "INT32": ctypes.c_int32, "FLOAT": ctypes.c_float, "DOUBLE": ctypes.c_double,
       "BOOLEAN": ctypes.c_bool, "VOID_PTR": ctypes.c_uint64}
_ENUM_TYPES = set(D.TYPE_ENUMS)


def _ctype(tn):
    return ctypes.c_int if tn in _ENUM_TYPES or tn in ("DATA_TYPE",) else _CT.get(tn, ctypes.c_uint64)


def _objects():
    from ..capi import impl

    return impl


def _read_c_array(tn, count, addr):
    """The elements a C caller passed at host address `addr`."""
    n = max(0, int(count))
    if n == 0:
        return "" if tn == "CHAR" else []
    if addr == 0:
        raise D.bad("arrayOfElements: NULL pointer", E.PYDNN_STATUS_BAD_PARAM_NULL_POINTER)
    if tn == "CHAR":
        return ctypes.string_at(addr, n).decode("utf-8", "replace")
    if tn in ("BACKEND_DESCRIPTOR", "HANDLE"):
        raw = (ctypes.c_uint64 * n).from_address(addr)
        impl = _objects()
        out = []
        for i, a in enumerate(raw):
            e = impl._objects.get(int(a))
            if e is None:
                raise D.bad(f"arrayOfElements[{i}]: not a live pydnn object")
            out.append(e[1])
        return out
    return list((_ctype(tn) * n).from_address(addr))


def _attr_type_name(attr_type):
    return D.T.get(attr_type) if not isinstance(attr_type, bool) and isinstance(attr_type, int) else None


@api
def backend_create_descriptor(descriptor_type):
    """cudnnBackendCreateDescriptor: a new, empty descriptor of the type."""
    return D.BackendDescriptor(D.descriptor_type(descriptor_type))


@api
def backend_destroy_descriptor(descriptor):
    """cudnnBackendDestroyDescriptor (None: nothing to do)."""
    if descriptor is None:
        return
    D.check_descriptor(descriptor).alive = False


@api
def backend_finalize(descriptor):
    """cudnnBackendFinalize: validate the attributes and freeze the descriptor."""
    D.finalize(descriptor)


@api
def backend_set_attribute(descriptor, attribute_name, attribute_type, element_count, array_of_elements):
    """cudnnBackendSetAttribute. array_of_elements: a sequence (a str for PYDNN_TYPE_CHAR), or from C the
    host address of the elements."""
    if type(array_of_elements) is int:
        D.check_descriptor(descriptor)
        tn = _attr_type_name(attribute_type)
        if tn is not None and isinstance(element_count, int) and 0 <= element_count <= 1 << 24:
            array_of_elements = _read_c_array(tn, element_count, array_of_elements)
    D.set_attribute(descriptor, attribute_name, attribute_type, element_count, array_of_elements)


@api
def backend_get_attribute(descriptor, attribute_name, attribute_type, requested_element_count,
                          array_of_elements=None):
    """cudnnBackendGetAttribute: (elementCount, the first requested elements). From C (array_of_elements a
    host address) the elements are written there and elementCount is returned; descriptor elements are
    copied into the descriptors the caller created (cuDNN's way for ENGINEHEUR_RESULTS)."""
    count, values = D.get_attribute(descriptor, attribute_name, attribute_type, requested_element_count)
    if array_of_elements is None:
        return count, values
    addr = array_of_elements
    if type(addr) is not int:
        raise D.bad("arrayOfElements: expected None (Python) or a host address")
    if not values and count >= 0:
        return count
    if addr == 0:
        raise D.bad("arrayOfElements: NULL pointer", E.PYDNN_STATUS_BAD_PARAM_NULL_POINTER)
    tn = D.T[attribute_type]
    if tn == "CHAR":
        data = values.encode()
        ctypes.memmove(addr, data, len(data))
    elif tn == "BACKEND_DESCRIPTOR":
        targets = _read_c_array(tn, len(values), addr)
        for i, (dst, src) in enumerate(zip(targets, values)):
            if type(dst) is not D.BackendDescriptor or dst.kind != src.kind or dst.finalized:
                raise D.bad(f"arrayOfElements[{i}]: expected a new, unfinalized {src.kind} descriptor")
            dst.attrs, dst.state, dst.finalized = dict(src.attrs), src.state, True
    else:
        arr = (_ctype(tn) * len(values)).from_address(addr)
        for i, v in enumerate(values):
            arr[i] = v
    return count


@api
def backend_execute(handle, execution_plan, variant_pack):
    """cudnnBackendExecute: run a finalized EXECUTION_PLAN on the tensors of a finalized VARIANT_PACK."""
    plans.execute(handle, execution_plan, variant_pack)
