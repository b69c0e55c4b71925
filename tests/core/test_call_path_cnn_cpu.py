"""The CNN demo's calls repeated on a cached call record, counted (not timed) so that the fast path cannot
silently go away, and checked against the full path: the same launches for the same pointers, every error
of the full path, and a Set of a descriptor taking the full path again.

Over tools/bench_host.py's CPU handle (placeholder kernels) and no-op launch (a Python stand-in for
cuLaunchKernel, counted as one frame). Shapes are the demo's layers at batch 4 (the front half does not
depend on the batch). Before the call records (tuning.callpath.CALL_RECORDS, tools/bench_host_cnn.py --cpu):
a repeated int-pointer convolution_forward ran 28 Python functions (api wrapper, check_handle, get_plan's
key, check_workspace, scalar x2, span_bytes / filter_bytes, device_ptr and element_aligned a buffer, run_plan),
backward data 28, backward filter 32, bias + activation 48, pydnn.matmul 39, activation_backward 19."""
import sys
from pathlib import Path

import pytest

import pydnn as P
from pydnn import tuning

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import bench_host as BH  # noqa: E402

BF16, F32 = P.PYDNN_DATA_BFLOAT16, P.PYDNN_DATA_FLOAT
NHWC, NCHW = P.PYDNN_TENSOR_NHWC, P.PYDNN_TENSOR_NCHW
# what a cached call must not run again (validation and buffer resolution of the full path)
FULL_PATH = {"wrapper", "check_handle", "get_plan", "_key", "_w_key", "check_workspace", "scalar", "device_ptr",
             "element_aligned", "span_bytes", "filter_bytes", "check_tensor", "plan_for", "_matmul", "new_plan",
             "_int"}


@pytest.fixture
def env(monkeypatch):
    # fwd_tma (tuning.conv.FWD_TMA, on since session 31) encodes TMA tensor maps through the driver, which the
    # no-launch stand-in does not offer: these counts are of the fwd_wgmma plan's call records
    monkeypatch.setattr(tuning.conv, "FWD_TMA", False)
    monkeypatch.setattr(tuning.conv, "DGRAD_TMA", False)   # (backward data's fwd_tma plan: the same maps)
    with BH.no_launch() as drv:
        yield BH.cpu_handle(), BH.CpuBuffers(), drv
    tuning.callpath.reset()


def frames(fn):
    names = []

    def prof(frame, event, arg):
        if event == "call":
            names.append(frame.f_code.co_name)

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    i = 0
    while i < len(names) and names[i] in ("<lambda>", "call"):  # the test's own frames
        i += 1
    return names[i:]


def _td(dims, fmt=NCHW, dtype=BF16):
    d = P.create_tensor_descriptor()
    P.set_tensor_nd_descriptor_ex(d, fmt, dtype, len(dims), list(dims))
    return d


def _conv(c, k, hw, fmt, n=4):
    xd, yd = _td((n, c, hw, hw), fmt), _td((n, k, hw, hw), fmt)
    wd = P.create_filter_descriptor()
    P.set_filter4d_descriptor(wd, BF16, fmt, k, c, 3, 3)
    cd = P.create_convolution_descriptor()
    P.set_convolution2d_descriptor(cd, 1, 1, 1, 1, 1, 1, P.PYDNN_CROSS_CORRELATION, F32)
    P.set_convolution_math_type(cd, P.PYDNN_TENSOR_OP_MATH)
    return xd, wd, yd, cd


def _best(perfs):
    return next(p.algo for p in perfs if p.status == P.PYDNN_STATUS_SUCCESS)


def conv_case(kind, h, buf):
    """(call(ptrs, ws_size=None, alpha=1.0), ptrs, descriptors) of one convolution call of the demo."""
    if kind == "cba":
        xd, wd, yd, cd = _conv(3, 64, 32, NCHW)
    else:
        xd, wd, yd, cd = _conv(64, 128, 32, NHWC)
    if kind in ("fwd", "cba"):
        algo = _best(P.get_convolution_forward_algorithm_v7(h, xd, wd, cd, yd, 8))
        ws = P.get_convolution_forward_workspace_size(h, xd, wd, cd, yd, algo)
    elif kind == "bwd_data":
        algo = _best(P.get_convolution_backward_data_algorithm_v7(h, wd, yd, cd, xd, 8))
        ws = P.get_convolution_backward_data_workspace_size(h, wd, yd, cd, xd, algo)
    else:
        algo = _best(P.get_convolution_backward_filter_algorithm_v7(h, xd, yd, cd, wd, 8))
        ws = P.get_convolution_backward_filter_workspace_size(h, xd, yd, cd, wd, algo)
    bd = _td((1, 64, 1, 1))
    ad = P.create_activation_descriptor()
    P.set_activation_descriptor(ad, P.PYDNN_ACTIVATION_RELU, P.PYDNN_NOT_PROPAGATE_NAN, 0.0)
    big = 4 * 128 * 32 * 32 * 2

    def ptrs():
        return [buf(big)[0] for _ in range(4)] + [buf(max(ws, 16))[0]]

    def call(p, ws_size=ws, alpha=1.0):
        a, b, c, bias, w = p
        if kind == "fwd":
            P.convolution_forward(h, alpha, xd, a, wd, b, cd, algo, w, ws_size, 0.0, yd, c)
        elif kind == "bwd_data":
            P.convolution_backward_data(h, alpha, wd, a, yd, b, cd, algo, w, ws_size, 0.0, xd, c)
        elif kind == "bwd_filter":
            P.convolution_backward_filter(h, alpha, xd, a, yd, b, cd, algo, w, ws_size, 0.0, wd, c)
        else:
            P.convolution_bias_activation_forward(h, alpha, xd, a, wd, b, cd, algo, w, ws_size, 0.0, yd, c, bd,
                                                  bias, ad, yd, c)
    return call, ptrs, (xd, wd, yd, cd), ws


ENTRY = {"fwd": "convolution_forward", "bwd_data": "convolution_backward_data",
         "bwd_filter": "convolution_backward_filter", "cba": "convolution_bias_activation_forward"}


def _recording(monkeypatch):
    """driver.launch_args replaced by a recorder of (func, grid, block, smem, params bytes)."""
    from pydnn._cuda import driver

    got = []
    monkeypatch.setattr(driver, "launch_args", lambda f, g, b, s, st, a: got.append(
        (f, tuple(g), tuple(b), s, bytes(a[2]))))
    return got


@pytest.mark.parametrize("kind", list(ENTRY))
def test_conv_cached_call_skips_the_full_path(env, kind):
    h, buf, drv = env
    call, ptrs, _, _ = conv_case(kind, h, buf)
    p = ptrs()
    call(p)
    before = drv.launches
    names = frames(lambda: call(p))
    assert drv.launches > before
    assert names[0] == ENTRY[kind], names
    assert not FULL_PATH & set(names), names
    # the entry's own frame (and _ws_fast where the plan takes a workspace), then the plan's run (conv's
    # plans.run_plan; the fused call sets its epilogue first)
    i = names.index("run_plan")
    want = [ENTRY[kind], "_fused_run", "strides5"] if kind == "cba" else [ENTRY[kind]]
    assert [n for n in names[:i] if n != "_ws_fast"] == want, names


@pytest.mark.parametrize("kind", list(ENTRY))
def test_conv_cached_call_launches_what_the_full_path_does(env, kind, monkeypatch):
    h, buf, _ = env
    call, ptrs, _, _ = conv_case(kind, h, buf)
    p1, p2 = ptrs(), ptrs()
    call(p1)  # records the call
    got = _recording(monkeypatch)
    call(p2)  # the cached call on other pointers
    fast = list(got)
    got.clear()
    tuning.callpath.CALL_RECORDS = False
    call2, _, _, _ = conv_case(kind, h, buf)  # fresh descriptors: no record, the full path
    call2(p2)
    assert fast and len(fast) == len(got)
    for a, b in zip(fast, got):
        assert a[1:] == b[1:]  # grid, block, smem and every byte of the parameters


@pytest.mark.parametrize("kind", list(ENTRY))
def test_conv_cached_call_errors_are_the_full_paths(env, kind):
    h, buf, drv = env
    call, ptrs, descs, ws = conv_case(kind, h, buf)
    p = ptrs()
    call(p)
    cases = [([p[0] + 1] + p[1:], {}, P.PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER),
             ([0] + p[1:], {}, P.PYDNN_STATUS_BAD_PARAM_NULL_POINTER),
             (p, {"alpha": True}, P.PYDNN_STATUS_BAD_PARAM),
             (p, {"alpha": "1"}, P.PYDNN_STATUS_BAD_PARAM),
             (p, {"ws_size": -1}, P.PYDNN_STATUS_BAD_PARAM)]
    if ws:
        cases.append((p, {"ws_size": ws - 1}, P.PYDNN_STATUS_BAD_PARAM))
        cases.append((p[:4] + [0], {}, P.PYDNN_STATUS_BAD_PARAM_NULL_POINTER))
    for q, kw, status in cases:
        n = drv.launches
        with pytest.raises(P.PydnnError) as ei:
            call(q, **kw)
        assert ei.value.status == status, (q, kw, ei.value)
        assert P.get_last_error_string().startswith(ENTRY[kind] + ": ")
        assert drv.launches == n  # nothing launched
    call(p)  # and the record still serves
    assert not FULL_PATH & set(frames(lambda: call(p)))


def test_conv_set_or_destroy_takes_the_full_path_again(env):
    h, buf, _ = env
    call, ptrs, (xd, wd, yd, cd), _ = conv_case("fwd", h, buf)
    p = ptrs()
    call(p)
    P.set_tensor_nd_descriptor_ex(yd, NHWC, BF16, 4, [4, 128, 32, 32])  # the same values: a new version
    assert "get_plan" in frames(lambda: call(p))
    assert "get_plan" not in frames(lambda: call(p))
    P.set_convolution2d_descriptor(cd, 1, 1, 1, 1, 1, 1, P.PYDNN_CROSS_CORRELATION, F32)
    assert "get_plan" in frames(lambda: call(p))
    P.set_filter4d_descriptor(wd, BF16, NHWC, 128, 64, 3, 3)  # (the filter is keyed by its fields)
    assert "get_plan" not in frames(lambda: call(p))
    P.set_filter4d_descriptor(wd, BF16, NHWC, 128, 64, 1, 1)  # another shape: the full path refuses it
    with pytest.raises(P.PydnnError):
        call(p)
    P.set_filter4d_descriptor(wd, BF16, NHWC, 128, 64, 3, 3)
    call(p)
    P.destroy_filter_descriptor(wd)
    with pytest.raises(P.PydnnError) as ei:
        call(p)
    assert ei.value.status == P.PYDNN_STATUS_BAD_PARAM and "wDesc" in str(ei.value)
    P.destroy_convolution_descriptor(cd)
    with pytest.raises(P.PydnnError) as ei:
        call(p)
    assert "convDesc" in str(ei.value)


def test_conv_records_off_keeps_the_full_path(env):
    h, buf, _ = env
    tuning.callpath.CALL_RECORDS = False
    call, ptrs, _, _ = conv_case("fwd", h, buf)
    p = ptrs()
    call(p)
    assert "get_plan" in frames(lambda: call(p))


def test_conv_misuse_is_pythons_type_error(env):
    h, buf, _ = env
    call, ptrs, (xd, wd, yd, cd), _ = conv_case("fwd", h, buf)
    call(ptrs())
    with pytest.raises(TypeError):
        P.convolution_forward(h, 1.0, xd)
    with pytest.raises(TypeError):
        P.convolution_forward(h, 1.0, xd, 0, wd, 0, cd, 0, None, 0, 0.0, yd, 0, bogus=1)


def _matmul_case(h, buf):
    ad, bd, cd = _td((4, 8192)), _td((8192, 10)), _td((4, 10))
    ptrs = [buf(4 * 8192 * 2)[0], buf(8192 * 10 * 2)[0], buf(4 * 10 * 2)[0]]
    return (lambda p, alpha=1.0: P.matmul(h, alpha, ad, p[0], bd, p[1], 0.0, cd, p[2])), ptrs, (ad, bd, cd)


def test_matmul_cached_call(env, monkeypatch):
    h, buf, drv = env
    call, p, (ad, bd, cd) = _matmul_case(h, buf)
    call(p)
    names = frames(lambda: call(p))
    assert names[:3] == ["matmul", "_fast", "launch"], names  # the entry, then the plan's launch (ops/matmul.py)
    assert not {"wrapper", "_matmul", "plan_for", "check_tensor", "span_bytes"} & set(names), names
    # the same launch as the full path for other pointers
    q = [buf(4 * 8192 * 2)[0], buf(8192 * 10 * 2)[0], buf(4 * 10 * 2)[0]]
    got = _recording(monkeypatch)
    call(q)
    fast = list(got)
    got.clear()
    tuning.callpath.CALL_RECORDS = False
    call2, _, _ = _matmul_case(h, buf)
    call2(q)
    assert fast and [g[1:] for g in fast] == [g[1:] for g in got]
    monkeypatch.undo()
    tuning.callpath.CALL_RECORDS = True
    # errors as the full path's: C overlapping A, misaligned, NULL, a bool alpha
    for r, kw, status in (([p[0], p[1], p[0] + 2], {}, P.PYDNN_STATUS_BAD_PARAM),
                          ([p[0] + 1, p[1], p[2]], {}, P.PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER),
                          ([p[0], 0, p[2]], {}, P.PYDNN_STATUS_BAD_PARAM_NULL_POINTER),
                          (p, {"alpha": True}, P.PYDNN_STATUS_BAD_PARAM)):
        n = drv.launches
        with pytest.raises(P.PydnnError) as ei:
            call(r, **kw)
        assert ei.value.status == status
        assert P.get_last_error_string().startswith("matmul: ")
        assert drv.launches == n
    P.set_tensor_nd_descriptor_ex(cd, NCHW, BF16, 2, [4, 10])
    assert "_matmul" in frames(lambda: call(p))


def test_activation_backward_cached_call(env):
    h, buf, drv = env
    d = _td((4, 64, 32, 32))
    ad = P.create_activation_descriptor()
    P.set_activation_descriptor(ad, P.PYDNN_ACTIVATION_RELU, P.PYDNN_NOT_PROPAGATE_NAN, 0.0)
    nb = 4 * 64 * 32 * 32 * 2
    y, dy, dx = buf(nb)[0], buf(nb)[0], buf(nb)[0]
    call = lambda: P.activation_backward(h, ad, 1.0, d, y, d, dy, d, y, 0.0, d, dx)  # noqa: E731
    call()
    # over the CPU handle there is no compiled launch record: run_map's Python launch
    assert frames(call) == ["wrapper", "activation_backward", "run_map", "launch_args", "cuLaunchKernel"]
    with pytest.raises(P.PydnnError) as ei:
        P.activation_backward(h, ad, 1.0, d, y, d, dy, d, y, 0.0, d, 0)
    assert ei.value.status == P.PYDNN_STATUS_BAD_PARAM_NULL_POINTER


@pytest.mark.parametrize("kind", list(ENTRY))
def test_conv_cached_call_with_torch_tensors(env, kind, monkeypatch):
    """Buffers of buffers.TORCH_TENSOR's type (a stand-in spelled like torch.Tensor) are read inline: no
    device_ptr; a short one goes to the full path, which names it."""
    import bench_host_cpu

    from pydnn import buffers

    h, buf, drv = env
    tl = bench_host_cpu._torch_like_type()
    monkeypatch.setattr(buffers, "TORCH_TENSOR", tl)
    call, ptrs, _, ws = conv_case(kind, h, buf)
    p = ptrs()
    call(p)
    big = 4 * 128 * 32 * 32 * 2
    objs = [tl(q, big) for q in p[:4]] + [tl(p[4], max(ws, 16))]
    n = drv.launches
    names = [x for x in frames(lambda: call(objs)) if x != "<lambda>"]  # (the stand-in's methods)
    assert drv.launches > n
    assert names[0] == ENTRY[kind] and not FULL_PATH & set(names), names
    short = [tl(p[0], 2)] + objs[1:]
    with pytest.raises(P.PydnnError) as ei:
        call(short)
    assert ei.value.status == P.PYDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT


def test_matmul_cached_call_with_torch_tensors(env, monkeypatch):
    import bench_host_cpu

    from pydnn import buffers

    h, buf, _ = env
    tl = bench_host_cpu._torch_like_type()
    monkeypatch.setattr(buffers, "TORCH_TENSOR", tl)
    call, p, _ = _matmul_case(h, buf)
    call(p)
    objs = [tl(p[0], 4 * 8192 * 2), tl(p[1], 8192 * 10 * 2), tl(p[2], 4 * 10 * 2)]
    names = [x for x in frames(lambda: call(objs)) if x != "<lambda>"]
    assert names[:3] == ["matmul", "_fast", "launch"] and "_matmul" not in names, names


def test_matmul_ex_cached_call(env, monkeypatch):
    """matmul_ex (the Linear forward's split K) shares matmul's record; its workspace is checked per call."""
    h, buf, drv = env
    def descs():  # the bridge's Linear forward: x @ W^T, W (10, 8192) read column-major; split K
        b = P.create_tensor_descriptor()
        P.set_tensor_nd_descriptor(b, BF16, 2, [8192, 10], [1, 8192])
        return _td((256, 8192)), b, _td((256, 10))

    ad, bd, cd = descs()
    ws = P.get_matmul_ex_workspace_size(h, ad, bd, cd)
    assert ws > 0
    p = [buf(256 * 8192 * 2)[0], buf(8192 * 10 * 2)[0], buf(256 * 10 * 2)[0], buf(max(ws, 16))[0]]

    def call(q, n=ws):
        P.matmul_ex(h, 1.0, ad, q[0], bd, q[1], 0.0, cd, q[2], q[3], n)
    call(p)
    names = frames(lambda: call(p))
    assert names[:3] == ["matmul_ex", "_fast", "launch"] and not {"_matmul", "plan_for", "wrapper"} & set(names)
    got = _recording(monkeypatch)
    for n in (ws, 0):  # with and without the workspace (split K, or the whole-K launch)
        call(p, n)
        fast = list(got)
        got.clear()
        tuning.callpath.CALL_RECORDS = False
        ad2, bd2, cd2 = descs()
        P.matmul_ex(h, 1.0, ad2, p[0], bd2, p[1], 0.0, cd2, p[2], p[3], n)
        tuning.callpath.CALL_RECORDS = True
        assert fast and [g[1:] for g in fast] == [g[1:] for g in got], n
        got.clear()
    monkeypatch.undo()
    for n, status in ((-1, P.PYDNN_STATUS_BAD_PARAM), (True, P.PYDNN_STATUS_BAD_PARAM)):
        with pytest.raises(P.PydnnError) as ei:
            call(p, n)
        assert ei.value.status == status
        assert P.get_last_error_string().startswith("matmul_ex: ")
    with pytest.raises(P.PydnnError) as ei:
        call(p[:3] + [0])
    assert ei.value.status == P.PYDNN_STATUS_BAD_PARAM_NULL_POINTER


def test_conv_backward_bias_cached_call(env, monkeypatch):
    from pydnn._cuda import driver

    h, buf, drv = env
    dyd, dbd = _td((4, 64, 32, 32)), _td((1, 64, 1, 1))
    dy, db = buf(4 * 64 * 32 * 32 * 2)[0], buf(64 * 2)[0]
    call = lambda q=dy, alpha=1.0: P.convolution_backward_bias(h, alpha, dyd, q, 0.0, dbd, db)  # noqa: E731
    call()
    names = frames(call)
    assert names[:2] == ["convolution_backward_bias", "_bias_go"] and not FULL_PATH & set(names), names
    got = []
    monkeypatch.setattr(driver, "launch", lambda f, g, b, s, st, p: got.append((f, g, b, s, bytes(p))))
    for q in (dy, dy + 2):  # 16-byte aligned and not: two launch records
        call(q)
        call(q)
        fast = got[-1]
        tuning.callpath.CALL_RECORDS = False
        dyd2, dbd2 = _td((4, 64, 32, 32)), _td((1, 64, 1, 1))
        P.convolution_backward_bias(h, 1.0, dyd2, q, 0.0, dbd2, db)
        tuning.callpath.CALL_RECORDS = True
        assert fast[1:] == got[-1][1:]
    monkeypatch.undo()
    for q, kw, status in ((dy + 1, {}, P.PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER),
                          (0, {}, P.PYDNN_STATUS_BAD_PARAM_NULL_POINTER),
                          (dy, {"alpha": None}, P.PYDNN_STATUS_BAD_PARAM)):
        n = drv.launches
        with pytest.raises(P.PydnnError) as ei:
            call(q, **kw)
        assert ei.value.status == status
        assert P.get_last_error_string().startswith("convolution_backward_bias: ")
        assert drv.launches == n
