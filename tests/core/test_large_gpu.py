"""Tensors of more than 2^31 elements: 64-bit indexing end to end (descriptor, plan, kernel)."""
import numpy as np
import pytest

import pydnn
from devtensor import assert_close
from pydnn.reference import activation as ref
from pydnn.reference import dtypes as rd

pytestmark = [pytest.mark.gpu, pytest.mark.large]

N = 2**31 + 3  # odd: exercises the vector tail past the 2^31 boundary


def _bf16_pattern(n, rng):
    """Fresh random finite bf16 values in [-4, 4]: a table of a prime length, repeated (cheap for 2^31)."""
    table = rd.bf16_bits_from_f32(rng.uniform(-4, 4, 1_000_003).astype(np.float32))
    return np.resize(table, n)


def test_gelu_over_2g_elements_bf16(handle, rng):
    from pydnn._cuda import driver

    free = None
    try:
        import torch

        free = torch.cuda.mem_get_info()[0]
    except Exception:  # noqa: BLE001
        pass
    if free is not None and free < 3 * N * 2:
        pytest.skip("not enough GPU memory")
    d = pydnn.create_tensor_descriptor()
    pydnn.set_tensor_nd_descriptor(d, pydnn.PYDNN_DATA_BFLOAT16, 4, [1, 1, 1, N], [N, N, N, 1])
    bits = _bf16_pattern(N, rng)
    x = pydnn.DeviceArray.from_numpy(bits)
    y = pydnn.DeviceArray((N,), np.uint16)
    y.fill_bytes(0xFF)
    a = pydnn.create_activation_descriptor()
    pydnn.set_activation_descriptor(a, pydnn.PYDNN_ACTIVATION_GELU_TANH, pydnn.PYDNN_NOT_PROPAGATE_NAN, 0.0)
    pydnn.activation_forward(handle, a, 1.0, d, x, 0.0, d, y)
    driver.synchronize()
    out = y.to_numpy()
    nan = (out & 0x7FFF) > 0x7F80
    assert not nan.any(), f"{int(nan.sum())} elements unwritten (first at {int(np.argmax(nan))})"
    picks = np.concatenate([np.arange(1 << 16), np.arange(N - (1 << 16), N),
                            np.arange(2**31 - (1 << 12), 2**31 + 3),
                            rng.integers(0, N, 1 << 18)])
    xv = rd.from_storage(bits[picks], pydnn.PYDNN_DATA_BFLOAT16)
    got = rd.from_storage(out[picks], pydnn.PYDNN_DATA_BFLOAT16)
    assert_close(got, ref.act(pydnn.PYDNN_ACTIVATION_GELU_TANH, xv), pydnn.PYDNN_DATA_BFLOAT16, "gelu 2^31+3")
