"""Python mirrors of the kernel parameter structs in ptx/common/params.h (ctypes follows the C layout
rules; tests/test_params_layout.py compiles the header with the host C compiler and compares offsets)."""
import ctypes

MAX_DIMS = 8
MAP_INPUTS = 3

FLAG_BETA = 1
FLAG_NAN_PROP = 2
FLAG_IN_BF16 = 4    # a pydnn::h16_t map's inputs are bfloat16 (else half): PYDNN_FLAG_IN_BF16 in common/elementwise.cuh
FLAG_OUT_BF16 = 8   # its output is bfloat16 (PYDNN_FLAG_OUT_BF16)

# (header under ptx/, C struct name, ctypes class): every struct the layout test checks.
REGISTRY = []


def kernel_params(header, cname):
    def register(cls):
        REGISTRY.append((header, cname, cls))
        return cls
    return register


@kernel_params("common/params.h", "MapParams")
class MapParams(ctypes.Structure):
    _fields_ = [
        ("out", ctypes.c_void_p),
        ("in_", ctypes.c_void_p * MAP_INPUTS),
        ("alpha", ctypes.c_double),
        ("alpha2", ctypes.c_double),
        ("beta", ctypes.c_double),
        ("coef", ctypes.c_double),
        ("coef2", ctypes.c_double),
        ("n", ctypes.c_longlong),
        ("ndim", ctypes.c_int),
        ("flags", ctypes.c_uint),
        ("size", ctypes.c_longlong * MAX_DIMS),
        ("stride", (ctypes.c_longlong * MAX_DIMS) * (MAP_INPUTS + 1)),
    ]
    C_NAMES = {"in_": "in"}  # Python field name -> C field name where they differ
