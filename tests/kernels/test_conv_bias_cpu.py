"""ConvolutionBackwardBias's host plan (pydnn/ops/convolution/bias.py), on the CPU: the merge of the reduced
dims keeps the same elements in the same order, the kernel's flat-index decomposition (emulated in numpy)
visits exactly each channel's elements, the 16-byte path is chosen only where every vector stays inside a
row and aligned, and the kernel unit compiles for sm_80 and sm_90 without spills."""
import itertools

import numpy as np
import pytest

from pydnn._build import cache, manifest
from pydnn.ops.convolution import bias as B
from pydnn.tensor import packed_strides

import pydnn


def _direct_offsets(sizes, strides):
    """Offsets of every element of (n, d, h, w) with those strides, row-major order."""
    return np.array([sum(i * s for i, s in zip(idx, strides))
                     for idx in itertools.product(*(range(n) for n in sizes))], dtype=np.int64)


LAYOUTS = [  # (dims5 n, c, d, h, w), strides5
    ((256, 64, 1, 32, 32), None),                                   # the demo's first conv (NCHW)
    ((3, 7, 1, 5, 6), None),
    ((2, 5, 3, 4, 5), None),                                        # 3-d
    ((4, 6, 1, 5, 3), "nhwc"),
    ((2, 3, 1, 1, 9), None),                                        # 1-d
    ((1, 4, 1, 1, 1), None),                                        # one element per channel
    ((3, 4, 1, 6, 8), (4 * 7 * 9 + 5, 7 * 9, 0, 9, 1)),             # padded rows and batches
]


def _strides5(dims5, spec):
    if spec is None:
        return tuple(packed_strides(dims5, pydnn.PYDNN_TENSOR_NCHW))
    if spec == "nhwc":
        n, c, d, h, w = dims5
        return (d * h * w * c, 1, h * w * c, w * c, c)
    return spec


@pytest.mark.parametrize("dims5,spec", LAYOUTS)
def test_merge_keeps_elements_and_order(dims5, spec):
    st5 = _strides5(dims5, spec)
    red_sizes, red_strides = (dims5[0],) + dims5[2:], (st5[0],) + st5[2:]
    sizes, strides = B.merge_reduced(red_sizes, red_strides)
    assert len(sizes) == len(strides) == 4
    assert int(np.prod(sizes)) == int(np.prod(red_sizes))
    want = _direct_offsets(red_sizes, red_strides)
    np.testing.assert_array_equal(B.element_offsets(sizes, strides), want)


def test_merge_makes_nchw_rows():
    st5 = packed_strides((256, 64, 1, 32, 32), pydnn.PYDNN_TENSOR_NCHW)
    sizes, strides = B.merge_reduced((256, 1, 32, 32), (st5[0],) + tuple(st5[2:]))
    assert sizes == (1, 1, 256, 1024) and strides[2:] == (64 * 1024, 1)
    # a packed 1-channel tensor is one contiguous run
    assert B.merge_reduced((8, 1, 4, 4), (16, 16, 4, 1)) == ((1, 1, 1, 128), (0, 0, 0, 1))


@pytest.mark.parametrize("dims5,spec", LAYOUTS)
@pytest.mark.parametrize("itemsize", [2, 4, 8])
def test_vector_path_vectors_stay_in_rows(dims5, spec, itemsize):
    """Where vector_width says V > 1, the kernel's vectors (V consecutive flat indices from a multiple of V)
    are V contiguous, V-aligned elements for every channel; the emulation covers every vector."""
    st5 = _strides5(dims5, spec)
    sizes, strides = B.merge_reduced((dims5[0],) + dims5[2:], (st5[0],) + st5[2:])
    for ptr in (0, 256, 2 * itemsize):
        v = B.vector_width(itemsize, sizes, strides, st5[1], ptr)
        if v == 1:
            continue
        assert v == 16 // itemsize and ptr % 16 == 0
        offs = B.element_offsets(sizes, strides).reshape(-1, v)
        for c in range(dims5[1]):
            base = c * st5[1] + offs
            assert np.all(base[:, 0] % v == 0)
            np.testing.assert_array_equal(np.diff(base, axis=1), 1)


def test_vector_width_choices():
    nchw = ((1, 1, 256, 1024), (0, 0, 65536, 1))
    assert B.vector_width(2, *nchw, 1024, 0) == 8
    assert B.vector_width(4, *nchw, 1024, 0) == 4
    assert B.vector_width(8, *nchw, 1024, 0) == 2
    assert B.vector_width(2, *nchw, 1024, 2) == 1           # pointer not 16-byte aligned
    assert B.vector_width(2, *nchw, 1028, 0) == 1           # channel stride breaks alignment
    assert B.vector_width(2, (1, 1, 6, 30), (0, 0, 210, 1), 30, 0) == 1   # rows of 30: not a multiple of 8
    assert B.vector_width(2, (1, 1, 24, 4), (0, 0, 4, 1), 1, 0) == 1      # NHWC-like: channel stride 1
    assert B.vector_width(2, (1, 1, 4, 8), (0, 0, 12, 1), 8, 0) == 1      # row stride 12: unaligned rows


def test_units_declared_for_every_float_type():
    names = {u.name: u for u in manifest.family_units()}
    for tag in ("f32", "f64", "f16", "bf16"):
        u = names[f"conv_bias.{tag}"]
        assert u.source == "conv_bias.cu"
        assert set(u.exprs) == {B.bias_expr(tag, v) for v in B.widths(tag)}


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_unit_compiles_without_spills(arch):
    nvrtc = pytest.importorskip("pydnn._cuda.nvrtc")
    try:
        nvrtc.version()
    except Exception as e:  # noqa: BLE001 - no NVRTC here
        pytest.skip(f"no NVRTC: {e}")
    u = [u for u in manifest.family_units() if u.name == "conv_bias.bf16"][0]
    text, _ = cache.unit_inputs(u)
    cubin, lowered, log = nvrtc.compile_cubin(text, u.source, u.exprs, arch,
                                              ("-std=c++17", "--ptxas-options=-v"), [str(cache.ptx_dir())])
    assert cubin and set(lowered) == set(u.exprs)
    assert "spill" in log
    for line in log.splitlines():
        if "spill" in line:
            assert "0 bytes spill stores, 0 bytes spill loads" in line, line


def _kernel_visits(nvec, threads=B.THREADS, unroll=4):
    """The vector indices each thread of bias_grad_rows adds (its main loop, then its tail), in order."""
    out = []
    for t in range(threads):
        seen, v = [], t
        while v + (unroll - 1) * threads < nvec:
            seen += [v + u * threads for u in range(unroll)]
            v += unroll * threads
        seen += [v + u * threads for u in range(unroll - 1) if v + u * threads < nvec]
        out.append(seen)
    return out


@pytest.mark.parametrize("nvec", [1, 7, 511, 512, 513, 2047, 2048, 2049, 4095, 6143, 32768, 32769])
def test_kernel_loop_visits_every_vector_once(nvec):
    visits = _kernel_visits(nvec)
    flat = sorted(v for t in visits for v in t)
    assert flat == list(range(nvec))
