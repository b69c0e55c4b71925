"""The convolutions' compiled entries (pydnn/_build/fastcall.py's kinds 10-12, cv_core; tuning.callpath.C_ENTRY_MAP)
without a GPU.

In a child process over tools/bench_host_cpu.py's stand-in libcuda.so.1 (which keeps each launch's function,
stream, shared memory, grid, block and first 64 parameter bytes, and the last launch's whole parameter struct):
convolution_forward, convolution_backward_data and convolution_backward_filter on one-launch plans (plans.Plan:
float implicit GEMM; bfloat16 NHWC tensor-core plans with 16-byte vector loads and the paired store flag; split-K
plans whose fold runs a second launch from a workspace). Every call goes through the public name (the compiled
entry) and again through the Python function behind it; the two must launch the same bytes (and leave the plan's
ConvParams / fold struct the same) or raise the same error. The entry answers exactly the repeated cached calls
(int pointers, torch tensors - a stand-in spelled like torch.Tensor -, other scalars, an output that loses the paired
store, a larger workspace) and declines the rest (first calls, keywords, a wrong argument count, NULL / negative /
None / host / too small buffers, pointers off the element size or the plan's vectors, a short / misaligned / NULL
workspace or a size that is not a plain int, a Set filter, a dead handle, PYDNN_CHECKED), which the Python function
answers or refuses as before."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "tools"))

# (label, direction, algo, (n, c, k, hw, r, data type, layout, pad)): each a plans.Plan on sm_90 (checked in the
# child: the case's plan type, fold and alignment)
CASES = [
    ("f32 fwd", "fwd", 0, (2, 3, 5, 7, 3, "FLOAT", "NCHW", 0)),
    ("f32 dgrad", "bwd_data", 0, (2, 3, 5, 7, 3, "FLOAT", "NCHW", 0)),
    ("f32 wgrad split", "bwd_filter", 1, (8, 4, 4, 32, 3, "FLOAT", "NCHW", 0)),
    ("bf16 wgrad split", "bwd_filter", 1, (2, 16, 16, 6, 3, "BFLOAT16", "NCHW", 1)),
    ("bf16 nhwc dgrad", "bwd_data", 1, (4, 64, 64, 8, 3, "BFLOAT16", "NHWC", 1)),
    ("bf16 nhwc 1x1 fwd", "fwd", 1, (1, 1024, 16, 4, 1, "BFLOAT16", "NHWC", 0)),
]



def case_descs(P, n, c, k, hw, r, dt, fmt, pad):
    """A case's descriptors (x, w, y, conv) and the filter's Set arguments after the descriptor."""
    dt, fmt = getattr(P, "PYDNN_DATA_" + dt), getattr(P, "PYDNN_TENSOR_" + fmt)
    o = hw - r + 1 + 2 * pad
    xd, yd = P.create_tensor_descriptor(), P.create_tensor_descriptor()
    P.set_tensor_nd_descriptor_ex(xd, fmt, dt, 4, [n, c, hw, hw])
    P.set_tensor_nd_descriptor_ex(yd, fmt, dt, 4, [n, k, o, o])
    wd = P.create_filter_descriptor()
    P.set_filter4d_descriptor(wd, dt, fmt, k, c, r, r)
    cd = P.create_convolution_descriptor()
    P.set_convolution2d_descriptor(cd, pad, pad, 1, 1, 1, 1, P.PYDNN_CROSS_CORRELATION, P.PYDNN_DATA_FLOAT)
    if dt != P.PYDNN_DATA_FLOAT:
        P.set_convolution_math_type(cd, P.PYDNN_TENSOR_OP_MATH)
    return xd, wd, yd, cd, (dt, fmt, k, c, r, r)


NAME = {"fwd": "convolution_forward", "bwd_data": "convolution_backward_data",
        "bwd_filter": "convolution_backward_filter"}


def operands(dname, xd, wd, yd):
    """The call's descriptors of its a, b and out buffers: forward (x, w, y), backward data (w, dy, dx), backward
    filter (x, dy, dw)."""
    return {"fwd": (xd, wd, yd), "bwd_data": (wd, yd, xd), "bwd_filter": (xd, yd, wd)}[dname]


def workspace_size(P, h, dname, algo, xd, wd, yd, cd):
    if dname == "fwd":
        return P.get_convolution_forward_workspace_size(h, xd, wd, cd, yd, algo)
    if dname == "bwd_data":
        return P.get_convolution_backward_data_workspace_size(h, wd, yd, cd, xd, algo)
    return P.get_convolution_backward_filter_workspace_size(h, xd, yd, cd, wd, algo)


SCRIPT = r'''
import ctypes, json, sys
sys.path.insert(0, sys.argv[1])
sys.path.insert(0, sys.argv[3])
CASES = json.loads(sys.argv[2])
from test_conv_entry_cpu import NAME, case_descs, operands, workspace_size
import bench_host as B, bench_host_cpu as C
import pydnn as P
from pydnn import buffers, tuning
from pydnn._build import fastcall
from pydnn._cuda import driver
from pydnn.ops.convolution import api as A
from pydnn.ops.convolution.plans import Plan, get_plan
from pydnn.ops.convolution.problem import ConvAuxParams, ConvParams, DIR_BWD_DATA, DIR_BWD_FILTER, DIR_FWD

log = C.LaunchLog(ctypes.sizeof(ConvParams))
drain = log.drain
tuning.callpath.C_LAUNCH = True
fastcall.install()
h, addr = C.real_stub_handle(), B.CpuBuffers()
h.stream = 0x7000
h.cu_stream = driver._driver().CUstream(0x7000)
TL = C._torch_like_type()
# an activation call makes the first compiled record (the entries' setup) and verifies the torch stand-in type
ad = P.create_activation_descriptor()
P.set_activation_descriptor(ad, P.PYDNN_ACTIVATION_RELU, P.PYDNN_NOT_PROPAGATE_NAN, 0.0)
d1, q = B._td((1, 1, 1, 4)), [addr(16)[0] for _ in range(2)]
P.activation_forward(h, ad, 1.0, d1, q[0], 0.0, d1, q[1])
P.activation_forward(h, ad, 1.0, d1, TL(q[0], 16), 0.0, d1, TL(q[1], 16))
assert buffers.TORCH_TENSOR is TL
lib = fastcall._state["lib"]
K = fastcall.MAP_KINDS
DIRS = {"fwd": DIR_FWD, "bwd_data": DIR_BWD_DATA, "bwd_filter": DIR_BWD_FILTER}
assert all(type(getattr(P, n)).__name__ == "Entry" for n in NAME.values()), "the entries were not published"
out, info = {}, {}


def both(label, name, args, pl, **kw):
    """(answered from a slot: 0 / 1, [launches, last params] or the error through the public name, the same through
    the Python function, the plan's structs after each)"""
    k = K[name]
    drain()
    h0 = lib.map_stats()[0][k]
    try:
        getattr(P, name)(*args, **kw)
        r1 = drain()
    except Exception as e:
        r1 = [type(e).__name__, getattr(e, "status", None), str(e)]
    hit = lib.map_stats()[0][k] - h0
    s1 = [bytes(pl.gemm).hex(), bytes(pl.fold).hex() if pl.fold is not None else None]
    drain()
    try:
        getattr(A, "_py_" + name)(*args, **kw)
        r2 = drain()
    except Exception as e:
        r2 = [type(e).__name__, getattr(e, "status", None), str(e)]
    s2 = [bytes(pl.gemm).hex(), bytes(pl.fold).hex() if pl.fold is not None else None]
    out[label] = [hit, r1, r2, s1 == s2]


for label, dname, algo, shape in CASES:
    xd, wd, yd, cd, wfields = case_descs(P, *shape)
    name, dr = NAME[dname], DIRS[dname]
    pl = get_plan(h, dr, algo, cd, xd, wd, yd)
    assert type(pl) is Plan, (label, type(pl).__name__)
    ws_size = workspace_size(P, h, dname, algo, xd, wd, yd, cd)
    it = pl.itemsize
    sx, sy = xd.span_bytes(), yd.span_bytes()
    sw = shape[2] * shape[1] * shape[4] * shape[4] * it
    # the call's (a, b, out) buffers by argument: forward (x, w, y), backward data (w, dy, dx), backward filter
    # (x, dy, dw)
    spans = {"fwd": (sx, sw, sy), "bwd_data": (sw, sy, sx), "bwd_filter": (sx, sy, sw)}[dname]
    dd = operands(dname, xd, wd, yd)
    bufs = [addr(s + 64)[0] for s in spans]
    wsb = addr(max(ws_size, 16) + 256)[0]
    info[label] = {"fold": type(pl.fold).__name__, "align": pl.align, "pair_ok": bool(pl.pair_ok),
                   "workspace": ws_size}

    def mk(b, al=1.0, be=0.0, ws=wsb, wsz=ws_size, algo=algo, hh=h):
        return (hh, al, dd[0], b[0], dd[1], b[1], cd, algo, ws, wsz, be, dd[2], b[2])

    log.capture(ctypes.sizeof(ConvAuxParams) if pl.fold is not None else ctypes.sizeof(ConvParams))
    tl = lambda b, short=-1: [TL(x, spans[j] - (it if j == short else 0)) for j, x in enumerate(b)]
    L = label + ": "
    both(L + "first", name, mk(bufs), pl)
    both(L + "ints", name, mk(bufs), pl)
    both(L + "torch", name, mk(tl(bufs)), pl)
    both(L + "torch again", name, mk(tl(bufs)), pl)
    both(L + "beta", name, mk(bufs, 0.5, 2.0), pl)
    both(L + "int alpha", name, mk(bufs, 1), pl)
    both(L + "out off 4 bytes", name, mk(bufs[:2] + [bufs[2] + 2 * it if it == 2 else bufs[2] + 4]), pl)
    both(L + "out off the pair", name, mk(bufs[:2] + [bufs[2] + it]) if it == 2 else mk(bufs), pl)
    both(L + "input off its vectors", name, mk([bufs[0] + 4 * it, bufs[1] + 4 * it, bufs[2]]), pl)
    both(L + "element misaligned", name, mk([bufs[0] + 1, bufs[1], bufs[2]]), pl)
    both(L + "keywords", name, mk(bufs)[:-1], pl, **{{"fwd": "y", "bwd_data": "dx", "bwd_filter": "dw"}[dname]: bufs[2]})
    both(L + "too many", name, mk(bufs) + (1,), pl)
    both(L + "torch output too small", name, mk(tl(bufs, 2)), pl)
    both(L + "torch input too small", name, mk(tl(bufs, 0)), pl)
    host = tl(bufs)
    for t in host:
        t.is_cuda = False
    both(L + "host tensor", name, mk(host), pl)
    both(L + "NULL", name, mk([0, 0, 0]), pl)
    both(L + "negative", name, mk([-8, -8, -8]), pl)
    both(L + "None", name, mk([None] * 3), pl)
    both(L + "ws larger size", name, mk(bufs, wsz=ws_size + 64), pl)
    both(L + "ws size short", name, mk(bufs, wsz=ws_size - 8), pl)
    both(L + "ws size a bool", name, mk(bufs, wsz=True), pl)
    both(L + "ws negative size", name, mk(bufs, wsz=-1), pl)
    both(L + "ws torch", name, mk(bufs, ws=TL(wsb, max(ws_size, 1))), pl)
    both(L + "ws buffer short", name, mk(bufs, ws=TL(wsb, max(ws_size - 8, 1))), pl)
    both(L + "ws misaligned", name, mk(bufs, ws=wsb + 2), pl)  # (the accumulators: 4 or 8 bytes)
    both(L + "ws NULL", name, mk(bufs, ws=0), pl)
    both(L + "ws None", name, mk(bufs, ws=None), pl)
    both(L + "ints again", name, mk(bufs), pl)
    buffers.CHECKED = True
    both(L + "checked", name, mk(bufs), pl)
    buffers.CHECKED = False
    h.alive = False
    both(L + "dead handle", name, mk(bufs), pl)
    h.alive = True
    P.set_filter4d_descriptor(wd, *wfields)  # the same fields: a Set moves the generation
    both(L + "filter set again", name, mk(bufs), pl)
    both(L + "after set", name, mk(bufs), pl)
print(json.dumps(info))
print(json.dumps(out))
'''

ANSWERED = {"ints", "torch", "torch again", "beta", "out off 4 bytes", "out off the pair", "ws larger size",
            "ws torch", "ints again", "after set"}
ERRORS = {"element misaligned": "PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER",
          "torch output too small": "PYDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT",
          "torch input too small": "PYDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT",
          "host tensor": "PYDNN_STATUS_BAD_PARAM", "NULL": "PYDNN_STATUS_BAD_PARAM_NULL_POINTER",
          "negative": "PYDNN_STATUS_BAD_PARAM", "None": "PYDNN_STATUS_BAD_PARAM_NULL_POINTER",
          "dead handle": "PYDNN_STATUS_BAD_PARAM", "ws size short": "PYDNN_STATUS_BAD_PARAM",
          "ws negative size": "PYDNN_STATUS_BAD_PARAM"}
# errors only where the plan has a workspace (none needed: any workspace buffer will do)
WS_ERRORS = {"ws buffer short": "PYDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT",
             "ws misaligned": "PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER",
             "ws NULL": "PYDNN_STATUS_BAD_PARAM_NULL_POINTER", "ws None": "PYDNN_STATUS_BAD_PARAM_NULL_POINTER"}


def test_conv_entries_answer_what_the_cached_paths_answer(tmp_path, monkeypatch):
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler")
    pytest.importorskip("cuda.bindings")
    import bench_host as B
    import bench_host_cpu

    import pydnn as P

    # the kernels compiled here, into the cache the child reads (no NVRTC under the stand-in)
    monkeypatch.setenv("PYDNN_CACHE_DIR", str(tmp_path))
    with B.no_launch():
        h = B.cpu_handle()
        d = B._td((1, 1, 1, 4))
        a = P.create_activation_descriptor()
        P.set_activation_descriptor(a, P.PYDNN_ACTIVATION_RELU, P.PYDNN_NOT_PROPAGATE_NAN, 0.0)
        P.activation_forward(h, a, 1.0, d, 1 << 32, 0.0, d, 2 << 32)
        for _, dname, algo, shape in CASES:
            xd, wd, yd, cd, _ = case_descs(P, *shape)
            ws, p = 1 << 40, [(i + 1) << 32 for i in range(3)]
            wsz = workspace_size(P, h, dname, algo, xd, wd, yd, cd)
            a, b, out = operands(dname, xd, wd, yd)
            getattr(P, NAME[dname])(h, 1.0, a, p[0], b, p[1], cd, algo, ws, wsz, 0.0, out, p[2])
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(ROOT / "tools"), json.dumps(CASES), str(Path(__file__).parent)],
                       capture_output=True, text=True, env=bench_host_cpu.stand_in_env(ROOT), timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.strip().splitlines()
    info, out = json.loads(lines[-2]), json.loads(lines[-1])
    # the cases cover what cv_core writes: a fold (two launches from a workspace), 16-byte vectors, the paired store
    assert info["f32 wgrad split"]["fold"] == info["bf16 wgrad split"]["fold"] == "ConvAuxParams", info
    assert info["bf16 nhwc dgrad"]["align"] == 16 and info["bf16 nhwc dgrad"]["pair_ok"], info
    assert info["f32 fwd"]["fold"] == "NoneType" and info["f32 fwd"]["workspace"] == 0, info
    assert len(out) == len(CASES) * 32, len(out)
    for label, (hit, public, python, same_structs) in out.items():
        case_label, case = label.split(": ", 1)
        i = info[case_label]
        assert public == python, label  # the same launches and parameter bytes, or the same exception and message
        assert same_structs, label  # the plan's ConvParams (and fold) left as the Python function leaves them
        misaligned_vectors = case == "input off its vectors" and i["align"]
        want = case in ANSWERED or (case == "input off its vectors" and not i["align"]) or (
            case.startswith("ws ") and i["workspace"] == 0 and case not in ("ws size short", "ws negative size",
                                                                            "ws size a bool"))
        assert hit == (1 if want else 0), (label, hit)
        if want:
            launches, _ = public
            assert len(launches) == (2 if i["fold"] == "ConvAuxParams" else 1), label
            assert all(lc[1] == 0x7000 for lc in launches), label
        err = ERRORS.get(case) or (WS_ERRORS.get(case) if i["workspace"] else None)
        if misaligned_vectors:
            err = "PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER"
        if err is not None:
            assert public[0] == "PydnnError" and public[1] == getattr(P, err), (label, public)
        if case in ("too many", "keywords"):
            assert hit == 0, label
    for c, *_ in CASES:
        o = {label.split(": ", 1)[1]: v for label, v in out.items() if label.startswith(c + ": ")}
        # the slot's launches are the Python function's: first (fresh record) and repeated calls alike
        assert o["first"][1] == o["ints"][1] == o["torch again"][1] == o["ints again"][1] == o["after set"][1], c
        assert o["beta"][1][0][0] == o["ints"][1][0][0] and o["beta"][1][1] != o["ints"][1][1], c
        if info[c]["pair_ok"]:  # the paired store flag follows the output's 4-byte alignment
            assert o["out off the pair"][1][1] != o["out off 4 bytes"][1][1], c
