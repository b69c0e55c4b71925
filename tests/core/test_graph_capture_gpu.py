"""pydnn calls neither synchronize nor allocate: they can be captured into a CUDA graph and replayed."""
import numpy as np
import pytest

import pydnn
from devtensor import DevTensor, assert_close
from pydnn._cuda import driver
from pydnn.reference import activation as ref

pytestmark = pytest.mark.gpu


def test_capture_and_replay_activation(rng):
    h = pydnn.create()
    stream = driver.stream_create()
    try:
        pydnn.set_stream(h, stream)
        dims = (2, 16, 33, 35)
        x, y = DevTensor(dims, pydnn.PYDNN_DATA_HALF), DevTensor(dims, pydnn.PYDNN_DATA_HALF)
        a = pydnn.create_activation_descriptor()
        pydnn.set_activation_descriptor(a, pydnn.PYDNN_ACTIVATION_SIGMOID, pydnn.PYDNN_NOT_PROPAGATE_NAN, 0.0)
        pydnn.activation_forward(h, a, 1.0, x.desc, x.ptr, 0.0, y.desc, y.ptr)  # warm-up: loads the module
        driver.synchronize()
        g = driver.Graph(stream)
        with g:
            pydnn.activation_forward(h, a, 1.0, x.desc, x.ptr, 0.0, y.desc, y.ptr)
        assert g.node_count() == 1
        for _ in range(2):  # new inputs each replay: the graph reads the buffers, not a snapshot
            xv = x.random(rng)
            y.poison()
            # the uploads and the poisoning run on the legacy NULL stream, which this non-blocking stream
            # does not wait for, and both may still be in flight on return (a pageable host-to-device copy
            # returns once staged; a memset is asynchronous): finish them before the replay reads the buffers
            driver.synchronize()
            g.launch()
            driver.stream_synchronize(stream)
            assert_close(y.download(), ref.act(pydnn.PYDNN_ACTIVATION_SIGMOID, xv), pydnn.PYDNN_DATA_HALF)
    finally:
        pydnn.destroy(h)
        driver.stream_destroy(stream)
