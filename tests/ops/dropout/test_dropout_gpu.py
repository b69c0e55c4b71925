"""Dropout on the GPU: the device Philox against the numpy one (known answers and random records), the
mask bit for bit against pydnn.reference.dropout for every dtype and layout (dense vector / element
kernels, strided kernel, odd counts), the same mask for the same (seed, offset) whatever the dims, layout,
dtype or kernel, the kept fraction against the binomial, the offset advancing between forwards, Restore
reproducing a saved state, backward from the reserve space, p = 0 and p = 1, in place, outputs poisoned
and the bytes around them untouched."""
import math

import numpy as np
import pytest

import pydnn
from pydnn import tuning
from devtensor import DevTensor, assert_close
from pydnn.ops import dropout as D
from pydnn.reference import dropout as ref
from pydnn.reference import dtypes as rd
from pydnn.tensor import packed_strides

pytestmark = pytest.mark.gpu

F32, F64, F16, BF16 = (pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DATA_DOUBLE, pydnn.PYDNN_DATA_HALF,
                       pydnn.PYDNN_DATA_BFLOAT16)
DTYPES = [F32, F16, BF16, F64]
MASK_POISON = 0xAB


def _layout(dims, lay):
    if lay == "nchw":
        return None
    if lay == "nhwc":
        return packed_strides(dims, pydnn.PYDNN_TENSOR_NHWC)
    return lay


class Dropout:
    """A dropout descriptor with its own states buffer (and a poisoned reserve space per call)."""

    def __init__(self, handle, p, seed):
        self.h, self.p, self.seed = handle, p, seed
        self.states = pydnn.DeviceArray((4,), np.uint64)
        self.states.fill_bytes(0xEE)
        self.d = pydnn.create_dropout_descriptor()
        pydnn.set_dropout_descriptor(self.d, handle, p, self.states.ptr, 32, seed)

    def state(self):
        return [int(v) for v in self.states.to_numpy()]

    def forward(self, x, y, n):
        nb = pydnn.dropout_get_reserve_space_size(x.desc)
        assert nb == (n + 7) // 8
        r = pydnn.DeviceArray((nb + 32,), np.uint8)
        r.fill_bytes(MASK_POISON)
        pydnn.dropout_forward(self.h, self.d, x.desc, x.ptr, y.desc, y.ptr, r.ptr, nb)
        raw = r.to_numpy()
        assert (raw[nb:] == MASK_POISON).all(), "the forward wrote past the reserve space"
        return r, raw[:nb]


def _random_nonzero(t, rng):
    """Values that are never 0, so y != 0 exactly where the element was kept."""
    v = rng.uniform(0.25, 3.0, t.dims) * rng.choice([-1.0, 1.0], t.dims)
    return t.upload(v.astype(np.float32).astype(np.float64))


def _check_forward(drop, x, y, xv, offset, what):
    n = int(np.prod(x.dims))
    _, mask = drop.forward(x, y, n)
    keep = ref.keep_mask(drop.seed, offset, n, drop.p)
    assert (mask == ref.pack_mask(keep)).all(), f"{what}: mask differs from the reference " \
        f"({int((ref.unpack_mask(mask, n) != keep).sum())} of {n} bits)"
    out = y.download()
    assert_close(out, ref.forward(xv, keep, drop.p), x.dtype, what)
    assert ((out != 0) == keep.reshape(x.dims)).all() or drop.p >= 1.0
    y.check_untouched()
    return keep


# ----------------------------------------------------------------------------- the generator itself

def test_device_philox_matches_reference(handle, rng):
    recs = [list(c) + list(k) for c, k, _ in
            [((0, 0, 0, 0), (0, 0), 0), ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, 0),
             ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0), 0)]]
    recs = np.array(recs + rng.integers(0, 2**32, (997, 6), dtype=np.uint64).tolist(), np.uint32)
    src = pydnn.DeviceArray.from_numpy(recs)
    dst = pydnn.DeviceArray((len(recs), 4), np.uint32)
    dst.fill_bytes(0xFF)
    p = D.DropoutParams()
    p.in_, p.out, p.n = src.ptr, dst.ptr, len(recs)
    handle.launch(D.MISC_UNIT, D.PROBE_EXPR, (-(-len(recs) // 128), 1, 1), (128, 1, 1), p)
    got = dst.to_numpy()
    assert (got == ref.philox4x32_10(recs[:, :4], recs[:, 4:])).all()
    assert got[0].tolist() == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]


def test_set_writes_the_states(handle):
    drop = Dropout(handle, 0.5, 0xDEADBEEFCAFEF00D)
    assert drop.state() == [0xDEADBEEFCAFEF00D, 0, 0, D.STATE_TAG]
    assert pydnn.get_dropout_descriptor(drop.d, handle) == (0.5, drop.states.ptr, 0xDEADBEEFCAFEF00D)


# ----------------------------------------------------------------------------- forward against the reference

CASES = [  # dims, layout of x, layout of y
    ((2, 37, 3, 5), "nchw", "nchw"),              # dense, n % 8 = 6: a tail group
    ((4, 64, 8, 8), "nchw", "nchw"),              # dense, several blocks
    ((2, 37, 3, 5), "nhwc", "nhwc"),              # strided (H*W = 15)
    ((2, 70, 6, 4), "nhwc", "nhwc"),              # tile (H*W = 24), a partial tile along C
    ((2, 64, 16, 16), "nhwc", (17408, 1, 1088, 68)),  # tile, y with channels padded to 68
    ((2, 37, 3, 5), "nchw", "nhwc"),              # x and y in different layouts
    ((3, 5, 4, 6), (400, 80, 16, 2), "nchw"),     # gaps in x
    ((4, 1, 13), (20, 99, 1), (13, 13, 1)),       # padded rows crossing group boundaries
    ((7,), "nchw", "nchw"),                       # fewer than 8 elements: the tail only
    ((1,), "nchw", "nchw"),
    ((3, 1000003), "nchw", "nchw"),               # large, odd
]


@pytest.mark.parametrize("dims,xl,yl", CASES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_forward_mask_bit_for_bit(handle, rng, dims, xl, yl, dtype):
    seed = int(rng.integers(0, 2**64, dtype=np.uint64))
    drop = Dropout(handle, 0.3, seed)
    x, y = DevTensor(dims, dtype, _layout(dims, xl)), DevTensor(dims, dtype, _layout(dims, yl))
    xv = _random_nonzero(x, rng)
    _check_forward(drop, x, y, xv, 0, f"{dims} {xl}->{yl}")
    x.check_untouched()
    assert drop.state()[:3] == [seed, 1, 0]


@pytest.mark.parametrize("dtype", DTYPES)
def test_unaligned_pointers_take_the_element_kernel(handle, rng, dtype):
    """x and y 1 element past 16-byte alignment: the dense element-access kernel, same mask."""
    n = 1000
    size = pydnn.tensor.DTYPES[dtype][0]
    npd = pydnn.tensor.DTYPES[dtype][1]
    xs, ys = pydnn.DeviceArray((n + 1,), npd), pydnn.DeviceArray((n + 1,), npd)
    ys.fill_bytes(0xFF)
    xv = rng.uniform(0.5, 2.0, n + 1)
    xs.copy_from_numpy(rd.to_storage(xv, dtype))
    xv = rd.round_to(xv, dtype)[1:]
    d = pydnn.create_tensor_descriptor()
    pydnn.set_tensor_nd_descriptor(d, dtype, 1, [n], [1])
    drop = Dropout(handle, 0.5, 42)
    nb = pydnn.dropout_get_reserve_space_size(d)
    r = pydnn.DeviceArray((nb,), np.uint8)
    pydnn.dropout_forward(handle, drop.d, d, xs.ptr + size, d, ys.ptr + size, r.ptr, nb)
    keep = ref.keep_mask(42, 0, n, 0.5)
    assert (r.to_numpy() == ref.pack_mask(keep)).all()
    out = rd.from_storage(ys.to_numpy(), dtype)
    assert np.isnan(out[0])  # the poisoned element before y is untouched
    assert_close(out[1:], ref.forward(xv, keep, 0.5), dtype, "unaligned")


# ----------------------------------------------------------------------------- launch-shape independence

def test_same_seed_and_offset_same_mask_on_any_shape(handle, rng):
    n = 2 * 3 * 5 * 7 * 11 * 13  # 30030
    seed = int(rng.integers(0, 2**63))
    want = ref.pack_mask(ref.keep_mask(seed, 0, n, 0.45))
    shapes = [((n,), "nchw", F32), ((2, 15015), "nchw", F32), ((6, 5005, 1, 1), "nchw", BF16),
              ((2, 3, 5, 1001), "nhwc", F16), ((2, 3, 5, 1001), "nchw", F64), ((30, 1001), (1, 30), F32),
              ((1, 1, 30030), "nchw", BF16)]
    n2 = 2 * 64 * 6 * 8  # a count that channels-last layouts can take to the tile kernel
    want2 = ref.pack_mask(ref.keep_mask(seed, 0, n2, 0.45))
    shapes2 = [((n2,), "nchw", F32), ((2, 64, 6, 8), "nhwc", BF16), ((2, 64, 48), (3072, 1, 64), F16),
               ((2, 64, 6, 8), "nhwc", F64), ((2, 64, 6, 8), (3072, 1, 512, 64), F32)]
    for count, expect, cases in ((n, want, shapes), (n2, want2, shapes2)):
        for dims, lay, dtype in cases:
            drop = Dropout(handle, 0.45, seed)  # a fresh Set: offset 0
            x, y = DevTensor(dims, dtype, _layout(dims, lay)), DevTensor(dims, dtype, _layout(dims, lay))
            _random_nonzero(x, rng)
            _, mask = drop.forward(x, y, count)
            assert (mask == expect).all(), (dims, lay, dtype)


# ----------------------------------------------------------------------------- statistics

@pytest.mark.parametrize("p", [0.05, 0.1, 0.25, 0.5, 0.75, 0.9])
def test_kept_fraction_is_binomial(handle, rng, p):
    n = 1 << 22
    drop = Dropout(handle, p, int(rng.integers(0, 2**63)))
    x, y = DevTensor((n,), BF16), DevTensor((n,), BF16)
    x.upload(np.ones(n))
    for _ in range(3):  # three forwards: three independent masks
        _, mask = drop.forward(x, y, n)
        kept = int(np.unpackbits(mask).sum())
        assert abs(kept - (1 - p) * n) < 6 * math.sqrt(n * p * (1 - p)), (kept, (1 - p) * n)
        out = y.download()
        assert set(np.unique(out).tolist()) <= {0.0, float(rd.round_to(np.array([1 / (1 - p)]), BF16)[0])}


# ----------------------------------------------------------------------------- offsets, restore, backward

def test_successive_forwards_differ_and_advance_the_offset(handle, rng):
    dims = (8, 1001)
    seed = int(rng.integers(0, 2**63))
    drop = Dropout(handle, 0.5, seed)
    x, y = DevTensor(dims, F32), DevTensor(dims, F32)
    xv = _random_nonzero(x, rng)
    keeps = []
    for k in range(3):
        y.poison()
        keeps.append(_check_forward(drop, x, y, xv, k, f"forward {k}"))
        assert drop.state()[:3] == [seed, k + 1, 0]
    assert (keeps[0] != keeps[1]).any() and (keeps[1] != keeps[2]).any() and (keeps[0] != keeps[2]).any()
    pydnn.set_dropout_descriptor(drop.d, handle, 0.5, drop.states.ptr, 32, seed)  # Set again: offset 0
    y.poison()
    assert (_check_forward(drop, x, y, xv, 0, "after a new Set") == keeps[0]).all()


def test_restore_reproduces_a_saved_state(handle, rng):
    dims = (3, 7, 11, 13)
    seed = int(rng.integers(0, 2**63))
    drop = Dropout(handle, 0.6, seed)
    x, y = DevTensor(dims, BF16), DevTensor(dims, BF16)
    xv = _random_nonzero(x, rng)
    _check_forward(drop, x, y, xv, 0, "first")
    saved = pydnn.DeviceArray.from_numpy(drop.states.to_numpy())  # the state before the second forward
    y.poison()
    second = _check_forward(drop, x, y, xv, 1, "second")
    d2 = pydnn.create_dropout_descriptor()
    pydnn.restore_dropout_descriptor(d2, handle, 0.6, saved.ptr, 32, 12345)
    assert pydnn.get_dropout_descriptor(d2, handle) == (pytest.approx(0.6), saved.ptr, 12345)
    other = Dropout(handle, 0.6, 0)
    other.d, other.states, other.seed = d2, saved, seed  # the buffer's seed is the one that counts
    y.poison()
    assert (_check_forward(other, x, y, xv, 1, "restored") == second).all()
    assert other.state()[:3] == [seed, 2, 0]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dims,dyl,dxl", [((2, 37, 3, 5), "nchw", "nchw"), ((2, 37, 3, 5), "nchw", "nhwc"),
                                          ((3, 5, 4, 6), (400, 80, 16, 2), "nhwc"), ((5,), "nchw", "nchw"),
                                          ((2, 70, 6, 4), "nhwc", "nhwc")])
def test_backward_uses_the_forward_mask(handle, rng, dtype, dims, dyl, dxl):
    n = int(np.prod(dims))
    # A seed whose offset-1 mask differs from its offset-0 one, so that using the wrong mask would fail
    # (for 5 elements two masks agree about 5% of the time).
    seed = int(rng.integers(0, 2**63))
    while (ref.keep_mask(seed, 0, n, 0.35) == ref.keep_mask(seed, 1, n, 0.35)).all():
        seed = int(rng.integers(0, 2**63))
    drop = Dropout(handle, 0.35, seed)
    x, y = DevTensor(dims, dtype), DevTensor(dims, dtype)
    xv = _random_nonzero(x, rng)
    keep = _check_forward(drop, x, y, xv, 0, "forward")
    r, _ = drop.forward(x, y, n)  # a second forward: mask of offset 1, kept in r
    keep1 = ref.keep_mask(drop.seed, 1, n, 0.35)
    assert (keep1 != keep).any()
    dy, dx = DevTensor(dims, dtype, _layout(dims, dyl)), DevTensor(dims, dtype, _layout(dims, dxl))
    dyv = _random_nonzero(dy, rng)
    nb = (n + 7) // 8
    pydnn.dropout_backward(handle, drop.d, dy.desc, dy.ptr, dx.desc, dx.ptr, r.ptr, nb)
    assert_close(dx.download(), ref.backward(dyv, keep1, 0.35), dtype, "backward")
    dx.check_untouched()
    assert drop.state()[1] == 2  # backward does not touch the states


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_p_zero_and_one(handle, rng, dtype):
    dims = (3, 1001)
    n = 3003
    x, y = DevTensor(dims, dtype), DevTensor(dims, dtype)
    xv = _random_nonzero(x, rng)
    xv = x.upload(np.where(np.arange(n).reshape(dims) % 97 == 0, np.inf, xv))
    drop = Dropout(handle, 0.0, 5)
    _, mask = drop.forward(x, y, n)
    assert (ref.unpack_mask(mask, n)).all() and (y.download() == xv).all()
    assert drop.state()[1] == 1  # every forward consumes an offset
    drop = Dropout(handle, 1.0, 5)
    y.poison()
    r, mask = drop.forward(x, y, n)
    assert not mask.any()
    out = y.download()
    assert (out == 0).all() and not np.signbit(out).any()  # exact +0, also where x is inf: no 0 * inf
    dx = DevTensor(dims, dtype)
    pydnn.dropout_backward(handle, drop.d, x.desc, x.ptr, dx.desc, dx.ptr, r.ptr, (n + 7) // 8)
    assert (dx.download() == 0).all()
    # no states buffer: p = 0 and p = 1 need none
    d = pydnn.create_dropout_descriptor()
    pydnn.set_dropout_descriptor(d, handle, 0.0, None, 0, 0)
    rr = pydnn.DeviceArray(((n + 7) // 8,), np.uint8)
    y.poison()
    pydnn.dropout_forward(handle, d, x.desc, x.ptr, y.desc, y.ptr, rr.ptr, (n + 7) // 8)
    assert (y.download() == xv).all() and ref.unpack_mask(rr.to_numpy(), n).all()


def test_in_place(handle, rng):
    dims = (5, 999)
    drop = Dropout(handle, 0.2, 77)
    x = DevTensor(dims, F16)
    xv = _random_nonzero(x, rng)
    n = 4995
    r = pydnn.DeviceArray(((n + 7) // 8,), np.uint8)
    pydnn.dropout_forward(handle, drop.d, x.desc, x.ptr, x.desc, x.ptr, r.ptr, (n + 7) // 8)
    keep = ref.keep_mask(77, 0, n, 0.2)
    assert (r.to_numpy() == ref.pack_mask(keep)).all()
    assert_close(x.download(), ref.forward(xv, keep, 0.2), F16, "in place")


def test_graph_replays_draw_new_masks(rng):
    """A CUDA graph of one forward draws a new mask on every replay: the offset lives on the device (the
    states buffer), not in the captured parameters. Buffers passed as __cuda_array_interface__ objects."""
    from pydnn._cuda import driver

    n = 4096
    h = pydnn.create()
    stream = driver.stream_create()
    try:
        pydnn.set_stream(h, stream)
        x, y = DevTensor((n,), F32), DevTensor((n,), F32)
        _random_nonzero(x, rng)
        r = pydnn.DeviceArray(((n + 7) // 8,), np.uint8)
        st = pydnn.DeviceArray((4,), np.uint64)
        d = pydnn.create_dropout_descriptor()
        pydnn.set_dropout_descriptor(d, h, 0.5, st, 32, 9)
        pydnn.dropout_forward(h, d, x.desc, x.buf, y.desc, y.buf, r, r.nbytes)  # warm-up: loads the kernel
        driver.stream_synchronize(stream)
        g = driver.Graph(stream)
        with g:
            pydnn.dropout_forward(h, d, x.desc, x.buf, y.desc, y.buf, r, r.nbytes)
        assert g.node_count() == 1
        for k in range(3):
            g.launch()
            driver.stream_synchronize(stream)
            assert (r.to_numpy() == ref.pack_mask(ref.keep_mask(9, k + 1, n, 0.5))).all(), k
        assert [int(v) for v in st.to_numpy()][:3] == [9, 4, 0]
    finally:
        pydnn.destroy(h)
        driver.stream_destroy(stream)


# ----------------------------------------------------------------------------- the C face

def test_c_program(tmp_path):
    from cprog import build_and_run

    r = build_and_run("dropout_gpu", tmp_path, extra=["-ldl", "-lm"])
    print(r.stdout, r.stderr)
    assert "FAIL" not in r.stdout and r.returncode == 0, r.stdout + r.stderr
    for what in ("forward mask", "forward values", "backward values", "offset advanced", "get descriptor"):
        assert f"ok {what}" in r.stdout, r.stdout + r.stderr


# ----------------------------------------------------------------------------- fwd_packed (16-bit dense forward)

@pytest.mark.parametrize("dtype", [F16, BF16])
@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 1.0])
def test_packed_forward_matches_plain_forward_bitwise(handle, rng, dtype, p, monkeypatch):
    """fwd_packed and fwd<T, 8> write the same y and mask bits (odd count, inf / NaN / -0 / subnormal
    elements, p at both ends), each from a fresh descriptor with the same seed (offset 0)."""
    n = 8 * 3000 + 5
    npd = pydnn.tensor.DTYPES[dtype][1]
    xv = rng.standard_normal(n) * 4.0
    xv[:40] = [np.inf, -np.inf, np.nan, -0.0, 0.0, 1e-40, -1e-40, 65504.0] * 5
    x = pydnn.DeviceArray((n,), npd)
    x.copy_from_numpy(rd.to_storage(xv, dtype))
    d = pydnn.create_tensor_descriptor()
    pydnn.set_tensor_nd_descriptor(d, dtype, 1, [n], [1])
    nb = pydnn.dropout_get_reserve_space_size(d)
    got = {}
    for packed in (True, False):
        monkeypatch.setattr(tuning.dropout, "FWD_PACKED", packed)
        handle.prepared.clear()  # no prepared launch from the other setting
        h = handle
        drop = Dropout(h, p, 1234)
        y = pydnn.DeviceArray((n,), npd)
        y.fill_bytes(0xEE)
        r = pydnn.DeviceArray((nb,), np.uint8)
        r.fill_bytes(MASK_POISON)
        pydnn.dropout_forward(h, drop.d, d, x.ptr, d, y.ptr, r.ptr, nb)
        got[packed] = (y.to_numpy().view(np.uint16).copy(), r.to_numpy().copy())
        assert drop.state()[:3] == [1234, 1, 0]
    want_y, want_m = got[False]
    assert (want_m == ref.pack_mask(ref.keep_mask(1234, 0, n, p))).all()
    assert (got[True][1] == want_m).all(), "masks differ"
    assert (got[True][0] == want_y).all(), f"y differs in {int((got[True][0] != want_y).sum())} elements"
