"""Convolution Find without Ex on the GPU: the same answer as the Ex form with room for every algorithm,
all of its own buffers freed again, and a repeated question answered from the tuning cache."""
import pytest

import pydnn
from pydnn.ops.convolution import algorithms as A
from pydnn.ops.convolution import find as F
from test_convolution_gpu import CASES, F32, Problem, _workspace

pytestmark = pytest.mark.gpu
OK = pydnn.PYDNN_STATUS_SUCCESS



@pytest.fixture
def tuning(tmp_path, monkeypatch):
    monkeypatch.setattr(A, "tuning_path", lambda: tmp_path / A.TUNING_FILE)
    monkeypatch.delenv("PYDNN_CONV_TUNING_CACHE", raising=False)
    A._tuning["path"] = None
    return tmp_path


def _succeeded(perfs):
    return sorted(p.algo for p in perfs if p.status == OK)


def _ex_and_plain(handle, pb):
    """(Ex answers with a workspace big enough for all, non-Ex answers), per direction."""
    ws, n = _workspace(1 << 26)
    c, x, w, y = pb.conv, pb.x, pb.w, pb.y
    return [
        (pydnn.find_convolution_forward_algorithm_ex(handle, x.desc, x.ptr, pb.wdesc, w.ptr, c, y.desc, y.ptr, 8,
                                                     ws.ptr, n),
         pydnn.find_convolution_forward_algorithm(handle, x.desc, pb.wdesc, c, y.desc, 8)),
        (pydnn.find_convolution_backward_data_algorithm_ex(handle, pb.wdesc, w.ptr, y.desc, y.ptr, c, x.desc, x.ptr,
                                                           6, ws.ptr, n),
         pydnn.find_convolution_backward_data_algorithm(handle, pb.wdesc, y.desc, c, x.desc, 6)),
        (pydnn.find_convolution_backward_filter_algorithm_ex(handle, x.desc, x.ptr, y.desc, y.ptr, c, pb.wdesc,
                                                             w.ptr, 7, ws.ptr, n),
         pydnn.find_convolution_backward_filter_algorithm(handle, x.desc, y.desc, c, pb.wdesc, 7)),
    ]


def test_find_without_ex_matches_ex_and_frees(handle, rng, monkeypatch):
    """Find without Ex answers as Ex does, and frees every buffer it allocated: the driver's allocations
    of this process are counted (the device's free memory would also move with other processes on the GPU,
    such as tools/gpu_check.sh's concurrent test shards)."""
    from pydnn._cuda import driver

    monkeypatch.setenv("PYDNN_CONV_TUNING_CACHE", "0")  # time both forms for real
    pb = Problem(CASES[6], F32)
    live, allocs = set(), []
    alloc, free = driver.mem_alloc, driver.mem_free

    def counted_alloc(nbytes):
        ptr = alloc(nbytes)
        live.add(ptr)
        allocs.append(nbytes)
        return ptr

    def counted_free(ptr):
        live.discard(ptr)
        free(ptr)

    monkeypatch.setattr(driver, "mem_alloc", counted_alloc)
    monkeypatch.setattr(driver, "mem_free", counted_free)
    for ex, plain in _ex_and_plain(handle, pb):
        assert _succeeded(plain) == _succeeded(ex) and _succeeded(plain)
        ok = [p for p in plain if p.status == OK]
        assert all(p.time > 0 for p in ok) and [p.time for p in ok] == sorted(p.time for p in ok)
        assert plain[:len(ok)] == ok  # the timed ones first, then the rest
    assert allocs and not live  # the non-Ex searches allocated their buffers and freed each one


def test_find_without_ex_cached(handle, tuning, monkeypatch):
    pb = Problem(CASES[1], F32)
    first = pydnn.find_convolution_forward_algorithm(handle, pb.x.desc, pb.wdesc, pb.conv, pb.y.desc, 8)
    assert (tuning / A.TUNING_FILE).exists()

    def no_alloc(*a):
        raise AssertionError("a cached answer must not allocate")

    monkeypatch.setattr(F.driver, "mem_alloc", no_alloc)
    again = pydnn.find_convolution_forward_algorithm(handle, pb.x.desc, pb.wdesc, pb.conv, pb.y.desc, 8)
    assert [p.as_tuple() for p in again] == [p.as_tuple() for p in first]
