"""Softmax on the GPU against the float64 reference: every algo x mode x dtype over layouts that reach every
kernel (row, row_loop, col with channels in registers and streamed, gen; vector and scalar launches),
odd row lengths, huge inputs, NaN, alpha / beta blending, in place, unaligned pointers, backward."""
import numpy as np
import pytest

import pydnn
from devtensor import DevTensor, assert_close
from pydnn.ops import softmax as S
from pydnn.reference import softmax as ref
from pydnn.tensor import packed_strides

pytestmark = pytest.mark.gpu

F32, F64, F16, BF16 = (pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DATA_DOUBLE, pydnn.PYDNN_DATA_HALF,
                       pydnn.PYDNN_DATA_BFLOAT16)
FAST, ACCURATE, LOG = pydnn.PYDNN_SOFTMAX_FAST, pydnn.PYDNN_SOFTMAX_ACCURATE, pydnn.PYDNN_SOFTMAX_LOG
INSTANCE, CHANNEL = pydnn.PYDNN_SOFTMAX_MODE_INSTANCE, pydnn.PYDNN_SOFTMAX_MODE_CHANNEL
ALGOS = [FAST, ACCURATE, LOG]
MODES = [INSTANCE, CHANNEL]
DTYPES = [F32, F16, BF16, F64]

CASES = [  # dims, layout: "nchw", "nhwc" or explicit strides (gaps)
    ((2, 37, 3, 5), "nchw"),              # CHANNEL: col (scalar); INSTANCE: row, 555 per row, rows unaligned
    ((2, 37, 3, 5), "nhwc"),              # CHANNEL: rows of 37 with stride 37
    ((3, 5, 4, 6), (400, 80, 16, 2)),     # gaps everywhere: gen
    ((2, 16, 8, 8), (1280, 1, 160, 20)),  # NHWC with padded channels (row stride 20)
    ((4, 37, 1, 1), (41, 1, 1, 1)),       # padded rows: each row starts at a different alignment
    ((2, 12, 4, 8), "nchw"),              # CHANNEL: col with 16-byte vectors
    ((2, 600, 4, 4), "nchw"),             # CHANNEL: col, 16-byte vectors at one position a thread (COL_FILL)
    ((70, 520, 4, 4), "nchw"),            # CHANNEL: col_loop (channels streamed), 16-byte vectors (140 blocks)
    ((2, 1200, 3, 5), "nchw"),            # CHANNEL: col_loop, scalar (H * W = 15)
    ((2, 5, 3), (1, 2, 10)),              # N innermost
    ((4, 1000, 1, 1), "nchw"),
    ((2, 4097, 1, 1), "nchw"),            # odd length past a register tile
    ((2, 20000, 1, 1), "nchw"),           # few long rows: row_split_fwd (sm_90); double: row_loop
    ((1, 40000, 1, 1), "nchw"),           # the same; past the 16-bit registers too
    ((5, 3, 1, 1), "nchw"),
    ((7, 1, 1, 1), "nchw"),               # rows of one element
    ((2, 16, 8, 8, 3), "nchw"),           # 5-d
    ((64, 4096, 1, 1), "nchw"),           # the benchmark's row length
    ((18, 17000, 1, 1), "nchw"),          # fp32 past the registers with more rows than row_split_fwd takes: row_loop
]


def _tensor(dims, layout, dtype):
    if layout == "nchw":
        return DevTensor(dims, dtype)
    if layout == "nhwc":
        return DevTensor(dims, dtype, packed_strides(dims, pydnn.PYDNN_TENSOR_NHWC))
    return DevTensor(dims, dtype, layout)


def _fwd_check(handle, algo, mode, x, y, xv, alpha, beta, y0, what):
    pydnn.softmax_forward(handle, algo, mode, alpha, x.desc, x.ptr, beta, y.desc, y.ptr)
    want = ref.forward(algo, mode, alpha, xv, beta, y0)
    scale = abs(alpha) * ref.forward_terms(algo, mode, xv) + (np.abs(beta * y0) if beta != 0 else 0)
    assert_close(y.download(), want, x.dtype, what, scale=scale)
    y.check_untouched()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("algo", ALGOS)
def test_forward(handle, rng, algo, mode, dtype):
    for dims, layout in CASES:
        x, y = _tensor(dims, layout, dtype), _tensor(dims, layout, dtype)
        xv = x.random(rng, -4, 4)
        _fwd_check(handle, algo, mode, x, y, xv, 1.0, 0.0, None, f"fwd {dims} {layout}")
        y0 = y.random(rng)
        alpha, beta = float(rng.uniform(-2, 2)), float(rng.uniform(-2, 2))
        _fwd_check(handle, algo, mode, x, y, xv, alpha, beta, y0, f"fwd blend {dims} {layout}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("algo", ALGOS)
def test_backward(handle, rng, algo, mode, dtype):
    for dims, layout in CASES:
        x, y, dy, dx = (_tensor(dims, layout, dtype) for _ in range(4))
        x.random(rng, -4, 4)
        pydnn.softmax_forward(handle, algo, mode, 1.0, x.desc, x.ptr, 0.0, y.desc, y.ptr)
        yv = y.download()
        dyv = dy.random(rng)
        pydnn.softmax_backward(handle, algo, mode, 1.0, y.desc, y.ptr, dy.desc, dy.ptr, 0.0, dx.desc, dx.ptr)
        want = ref.backward(algo, mode, 1.0, yv, dyv, 0.0, None)
        terms = ref.backward_terms(algo, mode, yv, dyv)
        assert_close(dx.download(), want, dtype, f"bwd {dims} {layout}", scale=terms)
        dx.check_untouched()
        dx0 = dx.random(rng)
        alpha, beta = float(rng.uniform(-2, 2)), float(rng.uniform(-2, 2))
        pydnn.softmax_backward(handle, algo, mode, alpha, y.desc, y.ptr, dy.desc, dy.ptr, beta, dx.desc, dx.ptr)
        want = ref.backward(algo, mode, alpha, yv, dyv, beta, dx0)
        assert_close(dx.download(), want, dtype, f"bwd blend {dims} {layout}",
                     scale=abs(alpha) * terms + np.abs(beta * dx0))
        dx.check_untouched()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("length", [1, 3, 37, 1000, 4097, 20000])
def test_odd_row_lengths(handle, rng, dtype, length):
    dims = (3, length)
    for mode in MODES:
        for algo in ALGOS:
            x, y = DevTensor(dims, dtype), DevTensor(dims, dtype)
            xv = x.random(rng, -6, 6)
            _fwd_check(handle, algo, mode, x, y, xv, 1.0, 0.0, None, f"len {length}")


@pytest.mark.parametrize("algo", ALGOS)
def test_huge_inputs_do_not_overflow(handle, algo):
    # (every x - max stays within float range, so LOG's results are finite too)
    rows = np.array([[1e4, -1e4, 0, 88, 1e4, -50], [-1e4, -1e4, -1e4, -1e4, -1e4, -9999],
                     [3e38, 1e37, 1e30, 0, -1e30, 3e38]])
    for mode, dims, layout in ((CHANNEL, (3, 6, 1, 1), "nchw"), (INSTANCE, (3, 6, 1, 1), "nchw"),
                               (CHANNEL, (3, 6, 1, 2), "nchw"), (CHANNEL, (3, 6, 1, 2), (24, 1, 12, 6))):
        v = np.repeat(rows.reshape(3, 6, 1, 1), dims[3], axis=3)
        x, y = _tensor(dims, layout, F32), _tensor(dims, layout, F32)
        xv = x.upload(v)
        pydnn.softmax_forward(handle, algo, mode, 1.0, x.desc, x.ptr, 0.0, y.desc, y.ptr)
        out = y.download()
        assert np.isfinite(out).all(), out
        want = ref.forward(algo, mode, 1.0, xv, 0.0, None)
        assert_close(out, want, F32, f"huge {dims} {layout}", scale=ref.forward_terms(algo, mode, xv))
        if algo != LOG:  # exp(0) = 1 twice, everything else underflows to exactly 0
            for r, halves in ((0, [0, 4]), (2, [0, 5])):
                row = out[r, :, 0, 0]
                assert np.allclose(row[halves], 0.5, rtol=2e-7, atol=0)
                assert (np.delete(row, halves) == 0).all(), row


def test_huge_inputs_half_types(handle):
    for dtype, big in ((F16, 6e4), (BF16, 3e38)):
        dims = (2, 64, 1, 1)
        v = np.zeros(dims)
        v[0, ::2], v[0, 1::2] = big, -big
        v[1, :] = -big
        v[1, 5] = big
        for mode in MODES:
            x, y = DevTensor(dims, dtype), DevTensor(dims, dtype)
            xv = x.upload(v)
            pydnn.softmax_forward(handle, ACCURATE, mode, 1.0, x.desc, x.ptr, 0.0, y.desc, y.ptr)
            out = y.download()
            assert np.isfinite(out).all()
            assert_close(out, ref.forward(ACCURATE, mode, 1.0, xv, 0.0, None), dtype, "huge 16-bit")


NAN_LAYOUTS = [((3, 5, 1, 1), "nchw"), ((3, 5, 2, 2), "nchw"), ((3, 5, 2, 2), (40, 1, 10, 5)),
               ((3, 20000, 1, 1), "nchw"), ((3, 600, 2, 4), "nchw"), ((3, 5, 4, 6), (400, 80, 16, 2))]


@pytest.mark.parametrize("dims, layout", NAN_LAYOUTS)
def test_nan_in_a_row_makes_that_row_nan(handle, dims, layout):
    """One NaN, or NaN everywhere but one element (then whole batches of a thread's elements are NaN
    before anything finite: the streaming kernels must still carry the NaN into the sum)."""
    for fill in ("one", "most"):
        v = np.arange(np.prod(dims), dtype=np.float64).reshape(dims) % 7 / 10
        if fill == "one":
            v[1, 2] = np.nan
        else:
            v[1] = np.nan
            v[1, dims[1] - 1] = 1.0
        x, y = _tensor(dims, layout, F32), _tensor(dims, layout, F32)
        x.upload(v)
        for algo in ALGOS:
            for mode in MODES:
                pydnn.softmax_forward(handle, algo, mode, 1.0, x.desc, x.ptr, 0.0, y.desc, y.ptr)
                out = y.download()
                assert np.isnan(out[1]).all(), (dims, layout, algo, mode, fill)
                assert np.isfinite(out[0]).all() and np.isfinite(out[2]).all()


def test_minus_infinity_entries(handle):
    """-inf elements get 0 (LOG: -inf); a row of nothing but -inf is NaN, as 0 / 0 in the reference."""
    for dims, layout in (((2, 6, 1, 1), "nchw"), ((2, 6, 2, 2), "nchw"), ((2, 6, 1, 1), (12, 2, 1, 1))):
        v = np.zeros(dims)
        v[0, ::2] = -np.inf
        v[1] = -np.inf
        x, y = _tensor(dims, layout, F32), _tensor(dims, layout, F32)
        x.upload(v)
        for algo in ALGOS:
            pydnn.softmax_forward(handle, algo, CHANNEL, 1.0, x.desc, x.ptr, 0.0, y.desc, y.ptr)
            out = y.download()
            if algo == LOG:
                assert (out[0, ::2] == -np.inf).all() and np.allclose(out[0, 1::2], -np.log(3))
            else:
                assert (out[0, ::2] == 0).all() and np.allclose(out[0, 1::2], 1 / 3)
            assert np.isnan(out[1]).all()


def test_long_row_with_few_rows_across_the_loop_kernels(handle, rng):
    """INSTANCE over a large C*H*W: a cluster per row (row_split_fwd, sm_90) or one row per block, streamed
    twice (row_loop or gen)."""
    for dims, dtype in (((2, 8, 64, 64), F32), ((2, 8, 64, 72), BF16), ((1, 3, 100, 101), F16)):
        x, y = DevTensor(dims, dtype), DevTensor(dims, dtype)
        xv = x.random(rng, -5, 5)
        for algo in ALGOS:
            _fwd_check(handle, algo, INSTANCE, x, y, xv, 1.0, 0.0, None, f"long {dims}")


def test_in_place(handle, rng):
    for dims, layout, mode in (((8, 300, 1, 1), "nchw", CHANNEL), ((2, 12, 4, 8), "nchw", CHANNEL),
                               ((3, 5, 4, 6), (400, 80, 16, 2), INSTANCE), ((2, 20000, 1, 1), "nchw", CHANNEL)):
        for algo in ALGOS:
            x = _tensor(dims, layout, F32)
            xv = x.random(rng)
            pydnn.softmax_forward(handle, algo, mode, 1.0, x.desc, x.ptr, 0.0, x.desc, x.ptr)
            assert_close(x.download(), ref.forward(algo, mode, 1.0, xv, 0.0, None), F32, f"in place {dims}",
                         scale=ref.forward_terms(algo, mode, xv))


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_unaligned_pointers(handle, rng, dtype):
    """Pointers off 16-byte alignment: all at the same offset (the vector kernels split off each row's head
    and tail), or at different offsets (the scalar kernels)."""
    from pydnn._cuda import driver

    dims = (8, 256, 1, 1)
    n = 8 * 256
    np_dtype = np.uint16 if dtype == BF16 else np.float32
    item = 2 if dtype == BF16 else 4
    x = DevTensor(dims, dtype)
    xv = x.random(rng)
    for mode in MODES:
        for xoff, yoff in ((1, 1), (3, 3), (0, 1), (1, 0), (5, 2)):
            xbuf, ybuf = pydnn.DeviceArray((n + 8,), np_dtype), pydnn.DeviceArray((n + 8,), np_dtype)
            xbuf.copy_from_numpy(np.concatenate([np.zeros(xoff, np_dtype), x.buf.to_numpy(),
                                                 np.zeros(8 - xoff, np_dtype)]))
            ybuf.fill_bytes(0xFF)
            pydnn.softmax_forward(handle, ACCURATE, mode, 1.0, x.desc, xbuf.ptr + xoff * item, 0.0, x.desc,
                                  ybuf.ptr + yoff * item)
            driver.synchronize()
            flat = ybuf.to_numpy()
            got = flat[yoff:yoff + n]
            got = (got.astype(np.uint32) << 16).view(np.float32) if dtype == BF16 else got
            assert_close(got.reshape(dims).astype(np.float64), ref.forward(ACCURATE, mode, 1.0, xv, 0, None), dtype,
                         f"unaligned {xoff} {yoff}")
            assert (flat[:yoff].view(np.uint8) == 0xFF).all() and (flat[yoff + n:].view(np.uint8) == 0xFF).all()


def test_kernel_choice_is_what_the_tests_assume(handle):
    """The cases above reach every kernel (guards the layouts against a change of the planner)."""
    seen = set()
    for dims, layout in CASES:
        for dtype in (F32, BF16):
            d = _tensor(dims, layout, dtype).desc
            for mode in MODES:
                for _, launches in (S.plan_summary(handle, ACCURATE, mode, d, d),
                                    S.plan_summary(handle, ACCURATE, mode, d, d, d, backward=True)):
                    seen.update(k for k, *_ in launches)
    want = {"row_fwd", "row_bwd", "row_loop_fwd", "row_loop_bwd", "col_fwd", "col_bwd", "col_loop_fwd",
            "col_loop_bwd", "gen_fwd", "gen_bwd"}
    if handle.arch == "sm_90":  # few long rows over a cluster
        want.add("row_split_fwd")
    assert seen == want, seen


@pytest.mark.parametrize("fill", [1, 2])
@pytest.mark.parametrize("dtype", [F32, BF16, F16])
def test_col_fill(handle, rng, monkeypatch, fill, dtype):
    """tuning.softmax.COL_FILL: channel softmax over few (outer, tile) blocks takes tiles narrower than a 32-byte
    sector (col_loop at 2 or 1 positions; with 2 the col kernel once the channels fit its registers), forward and
    backward, ACCURATE and LOG, blending, outputs poisoned; the launch shapes the planner is meant to give."""
    from pydnn import tuning
    monkeypatch.setattr(tuning.softmax, "COL_FILL", fill)
    cases = [((40, 601, 3, 3), {1: ("col_loop_fwd", (2, 128)), 2: ("col_fwd", (1, 256))}),
             ((3, 1000, 7, 7), {1: ("col_fwd", (1, 256)), 2: ("col_fwd", (1, 256))}),
             ((2, 2048, 5, 5), {1: ("col_loop_fwd", (1, 256)), 2: ("col_loop_fwd", (1, 256))}),
             ((16, 300, 9, 9), {1: ("col_loop_fwd", (8, 32)), 2: ("col_fwd", (2, 128))})]
    for dims, want in cases:
        x, y, dy, dx = (_tensor(dims, "nchw", dtype) for _ in range(4))
        got = S.plan_summary(handle, ACCURATE, CHANNEL, x.desc, y.desc)[1][-1]
        assert (got[0], got[2]) == want[fill], (dims, got)
        xv = x.random(rng, -4, 4)
        for algo in (ACCURATE, LOG):
            _fwd_check(handle, algo, CHANNEL, x, y, xv, 1.0, 0.0, None, f"col_fill {fill} fwd {dims}")
            y0 = y.random(rng)
            _fwd_check(handle, algo, CHANNEL, x, y, xv, 0.5, -1.5, y0, f"col_fill {fill} fwd blend {dims}")
            pydnn.softmax_forward(handle, algo, CHANNEL, 1.0, x.desc, x.ptr, 0.0, y.desc, y.ptr)
            yv, dyv = y.download(), dy.random(rng)
            dx0 = dx.random(rng)
            pydnn.softmax_backward(handle, algo, CHANNEL, 0.75, y.desc, y.ptr, dy.desc, dy.ptr, 0.5, dx.desc, dx.ptr)
            terms = ref.backward_terms(algo, CHANNEL, yv, dyv)
            assert_close(dx.download(), ref.backward(algo, CHANNEL, 0.75, yv, dyv, 0.5, dx0), dtype,
                         f"col_fill {fill} bwd {dims}", scale=0.75 * terms + np.abs(0.5 * dx0))
            dx.check_untouched()
