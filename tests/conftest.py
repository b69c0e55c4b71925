"""Test setup: tests marked `gpu` skip cleanly where no GPU (or no driver) is present."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


def _gpu_available():
    try:
        from pydnn._cuda import driver

        return driver.available()
    except Exception:  # noqa: BLE001 - any failure means no GPU here
        return False


HAVE_GPU = _gpu_available()


def pytest_collection_modifyitems(config, items):
    if HAVE_GPU:
        return
    skip = pytest.mark.skip(reason="no CUDA GPU on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def handle():
    import pydnn

    h = pydnn.create()
    yield h
    pydnn.destroy(h)


@pytest.fixture
def rng(request):
    """Fresh random inputs every run; the seed is printed on failure so a case can be replayed."""
    import numpy as np

    seed = int(os.environ.get("PYDNN_TEST_SEED", "0")) or int.from_bytes(os.urandom(4), "little")
    request.node.user_properties.append(("seed", seed))
    print(f"seed={seed}")
    return np.random.default_rng(seed)
