"""Shared argument checks of the op families (pydnn/ops/common.py), on the CPU."""
import pytest

import pydnn
from pydnn.ops.common import no_partial_alias
from pydnn.tensor import packed_strides
from test_fuzz_cpu import _desc

BAD = pydnn.PYDNN_STATUS_BAD_PARAM
F32 = pydnn.PYDNN_DATA_FLOAT


def test_no_partial_alias():
    dims = (2, 3, 4, 5)
    nchw = _desc(dims, F32)
    nhwc = _desc(dims, F32, packed_strides(dims, pydnn.PYDNN_TENSOR_NHWC))
    span = 2 * 3 * 4 * 5 * 4
    base = 1 << 40
    no_partial_alias(base, nchw, "y", base, nchw, "x")  # in place, element for element
    no_partial_alias(base + span, nchw, "y", base, nchw, "x")  # adjacent, no overlap
    for out_ptr, out_desc, in_place in ((base + 4, nchw, True), (base, nhwc, True), (base, nchw, False),
                                        (base + span - 4, nchw, True)):
        with pytest.raises(pydnn.PydnnError) as e:
            no_partial_alias(out_ptr, out_desc, "dx", base, nchw, "dy", in_place=in_place)
        assert e.value.status == BAD and "dx: its memory overlaps dy's" in e.value.message


def test_handle_function_opts_in_to_large_shared_memory_once(monkeypatch):
    """handle.function(unit, expr, smem): past 48 KiB the function is opted in once per handle, and again
    only when a later launch asks for more."""
    from pydnn._cuda import driver
    from test_fuzz_cpu import cpu_handle
    h = cpu_handle()
    h._funcs = {("u", "e"): "F"}
    calls = []
    monkeypatch.setattr(driver, "function_set_max_dynamic_smem", lambda f, n: calls.append((f, n)))
    for smem in (0, 48 * 1024, 100_000, 100_000, 150_000, 120_000):
        assert h.function("u", "e", smem) == "F"
    assert calls == [("F", 100_000), ("F", 150_000)]
