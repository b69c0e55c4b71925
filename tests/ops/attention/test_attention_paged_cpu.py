"""The paged-KV forward (pydnn.attention_forward_paged, ptx/attention.cu dec<T, D, true> and
ptx/attention_ws.cu fwd_ws(_tma)_paged) on the CPU: every validation error (status + the argument it
names), the workspace query, the dispatch (decode kernel or warp-specialized, the params' page-table
fields), the checked mode's page-id check, the reference's page gather against a loop, an emulation of
the kernels' row -> page address arithmetic, the C API declarations, and the units compiling without
spills (NVRTC, sm_90a / sm_90)."""
import numpy as np
import pytest

import pydnn
from pydnn import tuning
from pydnn.ops import attention as A
from pydnn.ops import attention_ws as WS
from pydnn.reference import attention as R
from test_attention_cpu import BAD, BF16, BR, F16, F32, MIS, NOINIT, NONE, NS, NULL, _attn, _check, _t
from test_attention_hdim_cpu import _Recorded, _short, launches  # noqa: F401 - the fixture
from test_fuzz_cpu import cpu_handle

I32 = pydnn.PYDNN_DATA_INT32
Q, K, V, O, LSE, TK, TV, LKV, LQ, WSP = (i << 36 for i in range(1, 11))


def _pool(pages, h, ps, d, dtype=BF16, layout="hnd"):
    st = (ps * h * d, ps * d, d, 1) if layout == "hnd" else (ps * h * d, d, h * d, 1)
    return _t((pages, h, ps, d), dtype, strides=st)


def _table(b, n, dtype=I32, dims=None):
    d = pydnn.create_tensor_descriptor()
    dims = dims or (b, 1, n, 1)
    st = [1] * len(dims)
    for i in range(len(dims) - 2, -1, -1):
        st[i] = st[i + 1] * dims[i + 1]
    pydnn.set_tensor_nd_descriptor(d, dtype, len(dims), dims, st)
    return d


def _args(a=None, q=None, k=None, v=None, tk=None, tv=None, m=1000, o=None, st="default", lens=(None, LKV),
          ws=(None, 0), ptrs=None, handle=None):
    a = a or _attn(8, 2, 128)
    b, hq, sq, d = (q.dims if q is not None else (3, 8, 1, 128))
    q = q or _t((b, hq, sq, d))
    k = k or _pool(40, 2, 64, d)
    v = v or _pool(40, 2, 64, d)
    tk = tk or _table(b, 16)
    tv = tv or _table(b, 16)
    o = o or _t((b, hq, sq, d))
    if st == "default":
        st = _t((b, hq, sq, 1), F32)
    p = dict(q=Q, k=K, v=V, tk=TK, tv=TV, o=O, lse=LSE)
    p.update(ptrs or {})
    return (handle or cpu_handle(), a, q, p["q"], k, p["k"], v, p["v"], tk, p["tk"], tv, p["tv"], m, o, p["o"],
            st, p["lse"], lens[0], lens[1], ws[0], ws[1])


F = pydnn.attention_forward_paged


def test_valid_calls_reach_the_kernel_lookup():
    _check(F, _args(), NOINIT, "")
    _check(F, _args(st=None), NOINIT, "")
    _check(F, _args(m=0), NOINIT, "")  # maxSeqLenKV 0: 16 pages x 64
    _check(F, _args(k=_pool(40, 2, 64, 128, layout="nhd"), v=_pool(40, 2, 64, 128, layout="nhd")), NOINIT, "")
    _check(F, _args(q=_t((3, 8, 300, 128)), o=_t((3, 8, 300, 128)), st=None, lens=(LQ, LKV)), NOINIT, "")
    _check(F, _args(a=_attn(8, 2, 96), q=_t((3, 8, 1, 96)), k=_pool(9, 2, 7, 96), v=_pool(9, 2, 7, 96),
                    tk=_table(3, 143), tv=_table(3, 200), m=1000), NOINIT, "")  # any page size
    _check(F, _args(tk=_table(3, 16, dims=(3, 1, 16, 1))), NOINIT, "")


@pytest.mark.parametrize("kw,status,needle", [
    (dict(tk="f32"), BAD, "pageTableKDesc: data type"),
    (dict(tk=(3, 16)), BAD, "pageTableKDesc: dims (3, 16, 1, 1) must be (3, 1, maxPages, 1)"),
    (dict(tv=(2, 1, 16, 1)), BAD, "pageTableVDesc: dims (2, 1, 16, 1)"),
    (dict(m=1025), BAD, "pageTableKDesc: 16 pages of 64 keys cover 1024 keys, fewer than maxSeqLenKV = 1025"),
    (dict(tv=(3, 1, 15, 1)), BAD, "pageTableVDesc: 15 pages of 64 keys cover 960"),
    (dict(m=-1), BAD, "maxSeqLenKV: -1"),
    (dict(m=1.5), BAD, "maxSeqLenKV"),
    (dict(k="heads"), BAD, "kDesc: dims[1] = 4 heads, the descriptor says 2"),
    (dict(k="d"), BAD, "kDesc: dims[3] = 64"),
    (dict(k="3d"), BAD, "kDesc: expected 4 dims (pages, heads, page size, head dim)"),
    (dict(v="ps"), BAD, "vDesc: dims (40, 2, 32, 128) differ from kDesc dims (40, 2, 64, 128)"),
    (dict(k="f16"), BAD, "kDesc: data type"),
    (dict(k="stride"), NS, "kDesc: strides[3] = 2"),
    (dict(k="stride8"), NS, "kDesc: strides[2] = 132 is not a multiple of 8"),
    (dict(a="drop"), NS, "attnDesc: dropout 0.1 with paged K / V"),
    (dict(a="d80"), NS, "attnDesc: headDim 80"),
    (dict(o="dims"), BAD, "oDesc"),
    (dict(st="dims"), BAD, "statsDesc: dims"),
    (dict(lens=(None, None)), NULL, "seqLensKV: NULL; paged K / V need"),
    (dict(ptrs=dict(k=K + 8)), MIS, "k: "),
    (dict(ptrs=dict(tk=TK + 2)), MIS, "pageTableK: "),
    (dict(ptrs=dict(tv=None)), NULL, "pageTableV"),
    (dict(ws=(None, -1)), BAD, "workSpaceSizeInBytes"),
])
def test_validation(kw, status, needle):
    d = 128
    subs = dict(
        tk=lambda x: _table(3, 16, F32) if x == "f32" else _table(3, 16, dims=(3, 16, 1, 1)),
        tv=lambda x: _table(3, 16, dims=x),
        k=lambda x: {"heads": _pool(40, 4, 64, d), "d": _pool(40, 2, 64, 64), "3d": _t3(), "f16": _pool(40, 2, 64, d, F16),
                     "stride": _t((40, 2, 64, d), strides=(2 * 64 * 2 * d, 64 * 2 * d, 2 * d, 2)),
                     "stride8": _t((40, 2, 64, d), strides=(2 * 64 * 132, 64 * 132, 132, 1))}[x],
        v=lambda x: _pool(40, 2, 32, d),
        a=lambda x: _attn(8, 2, d, p=0.1) if x == "drop" else _attn(8, 2, 80),
        o=lambda x: _t((3, 8, 2, d)),
        st=lambda x: _t((3, 8, 2, 1), F32),
    )
    args = {}
    for key, val in kw.items():
        args[key] = subs[key](val) if key in subs and not isinstance(val, int) and key not in ("m",) else val
    if "a" in kw and kw["a"] == "d80":
        args.update(q=_t((3, 8, 1, 80)))
    _check(F, _args(**args), status, needle)


def _t3():
    d = pydnn.create_tensor_descriptor()
    pydnn.set_tensor_nd_descriptor(d, BF16, 3, (40, 64, 128), (64 * 128, 128, 1))
    return d


def test_workspace_query():
    h = cpu_handle()
    a, q, k, tk = _attn(8, 2, 128), _t((3, 8, 1, 128)), _pool(400, 2, 64, 128), _table(3, 128)
    n = pydnn.get_attention_forward_paged_workspace_size(h, a, q, k, tk, 8000)
    pl = A.decode_plan(132, 3, 8, 2, 1, 8000, 128, NONE)
    assert n == pl.ws > 0
    qp = _t((3, 8, 500, 128))
    assert pydnn.get_attention_forward_paged_workspace_size(h, a, qp, k, tk, 8000) == 0  # the ws kernel: none
    with tuning.override({"attention.PAGED_WS": False}):  # the prefill on dec: its plan's partials, if any
        assert (pydnn.get_attention_forward_paged_workspace_size(h, a, qp, k, tk, 8000)
                == A.decode_plan(132, 3, 8, 2, 500, 8000, 128, NONE).ws)
    _check(pydnn.get_attention_forward_paged_workspace_size, (h, a, q, k, tk, 8193), BAD, "fewer than maxSeqLenKV")


def _run(args, arch="sm_90"):
    h = args[0]
    h.arch, h._funcs = arch, _Recorded()
    pydnn.attention_forward_paged(*args)


def test_dispatch_decode(launches, monkeypatch):
    rec = []
    real = A._decode_forward
    monkeypatch.setattr(A, "_decode_forward", lambda *a, **k: (rec.append(a[3]), real(*a, **k)))
    n = pydnn.get_attention_forward_paged_workspace_size(cpu_handle(), _attn(8, 2, 128), _t((3, 8, 1, 128)),
                                                         _pool(40, 2, 64, 128), _table(3, 16), 1000)
    _run(_args(ws=(WSP, n), tk=_table(3, 16), tv=_table(3, 20)))
    assert A.LAST_PAGED_ROUTE == "dec"
    assert _short(launches[0]["f"]) == "dec<pydnn::bf16_t, 128, true>"
    assert launches[0]["smem"] == A.smem_bytes("dec_paged", 128) == A.smem_bytes("dec", 128) + 3 * 2 * 64 * 8
    p = rec[0]
    assert (p.ptab_k, p.ptab_v, p.page_size, p.seq_kv, p.lens_kv) == (TK, TV, 64, 1000, LKV)
    assert [list(r) for r in p.ptab_stride] == [[16, 1], [20, 1]]
    assert list(p.stride[A.T_K]) == [2 * 64 * 128, 64 * 128, 128]  # (page, head, row)
    pl = A.decode_plan(132, 3, 8, 2, 1, 1000, 128, NONE)
    assert launches[0]["grid"] == (pl.splits, 2 * pl.rblocks, 3)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_dispatch_prefill(launches, monkeypatch, arch):
    """sm_90: one fwd_ws_paged launch (TMA maps cannot be encoded without a driver, so the recorded launch
    is the cp.async producer's); elsewhere the paged decode kernel, 16 rows a CTA."""
    args = _args(q=_t((3, 8, 300, 128)), o=_t((3, 8, 300, 128)), lens=(LQ, LKV))
    _run(args, arch)
    (f,) = launches
    if arch == "sm_90":
        assert A.LAST_PAGED_ROUTE == "ws" and WS.LAST_PAGED == "cp.async"
        assert f["f"] == WS._paged_expr("bf16", 128, False) and f["threads"] == 384
        assert f["smem"] == WS.smem_bytes(128) and f["grid"] == (min(132, 3 * 8 * 3), 1, 1)
    else:
        assert A.LAST_PAGED_ROUTE == "dec" and _short(f["f"]) == "dec<pydnn::bf16_t, 128, true>"
        assert f["grid"][1] == 2 * (4 * 300 // 16)


def test_dispatch_switches(launches):
    big = dict(q=_t((3, 8, 300, 128)), o=_t((3, 8, 300, 128)))
    with tuning.override({"attention.PAGED_WS": False}):
        _run(_args(**big))
    with tuning.override({"attention.DECODE": False}):  # a one-row query on the ws kernel
        _run(_args())
    _run(_args(a=_attn(8, 2, 96), q=_t((3, 8, 300, 96)), o=_t((3, 8, 300, 96)), k=_pool(40, 2, 64, 96),
               v=_pool(40, 2, 64, 96)))  # d 96: no ws kernel
    assert [_short(x["f"]).split("<")[0] for x in launches] == ["dec", "fwd_ws_paged", "dec"]


def test_dispatch_grid_limit():
    """The decode kernel's grid y (K/V heads x row blocks) must fit: a long paged prefill off sm_90."""
    args = list(_args(a=_attn(64, 64, 128), q=_t((1, 64, 20000, 128)), o=_t((1, 64, 20000, 128)),
                      k=_pool(40, 64, 64, 128), v=_pool(40, 64, 64, 128), tk=_table(1, 16), tv=_table(1, 16), st=None))
    args[0].arch = "sm_80"
    _check(F, tuple(args), NS, "exceed the paged decode kernel's grid")


def test_takes_tma_paged():
    p = A.AttnParams()
    for ps, d, want in ((128, 128, True), (256, 64, True), (64, 256, True), (64, 128, True), (16, 64, True),
                        (8, 128, True), (32, 256, True), (192, 128, False), (48, 128, False), (4, 128, False),
                        (7, 64, False), (96, 256, False)):
        p.page_size = ps
        assert WS.takes_tma_paged(d, p) == want, (ps, d)
    with tuning.override({"attention.PAGED_TMA_SMALL": False}):
        p.page_size = 64
        assert not WS.takes_tma_paged(128, p)
        p.page_size = 256
        assert WS.takes_tma_paged(128, p)
    p.page_size = 128
    with tuning.override({"attention.PAGED_TMA": False}):
        assert not WS.takes_tma_paged(128, p)
    with tuning.override({"attention.WS_TMA": False}):
        assert not WS.takes_tma_paged(128, p)


def test_check_pages():
    tab = [[3, 0, -1, 99], [1, 2, 5, -1]]
    A.check_pages(tab, "pageTableK", [32, 48], 16, 6)  # batch 0 reads 2 pages, batch 1 three
    A.check_pages(tab, "pageTableK", [0, 0], 16, 6)
    with pytest.raises(pydnn.PydnnError, match=r"pageTableK\[0\]\[2\]: page id -1"):
        A.check_pages(tab, "pageTableK", [33, 48], 16, 6)
    with pytest.raises(pydnn.PydnnError, match=r"pageTableV\[1\]\[2\]: page id 5 is outside \[0, 5\)"):
        A.check_pages(tab, "pageTableV", [1, 33], 16, 5)


def test_gather_pages_reference(rng):
    """gather_pages against an explicit loop, and the paged reference forward equal to the contiguous one."""
    pool = rng.standard_normal((7, 2, 4, 8))
    table = np.array([[5, 0, 3], [6, 1, -1]])
    lens = [11, 6]
    got = R.gather_pages(pool, table, 12, lens)
    want = np.zeros((2, 2, 12, 8))
    for b in range(2):
        for j in range(lens[b]):
            want[b, :, j] = pool[table[b][j // 4], :, j % 4]
    assert np.array_equal(got, want)
    q = rng.standard_normal((2, 4, 3, 8))
    o1 = R.forward(q, got, got, 0.3, BR, None, lens)[0]
    dense = want.copy()
    dense[1, :, 6:] = 1e9  # past the length: never read
    o2 = R.forward(q, dense, dense, 0.3, BR, None, lens)[0]
    assert np.allclose(o1, o2)


@pytest.mark.parametrize("d,ps,layout", [(128, 16, "hnd"), (64, 48, "nhd"), (256, 64, "hnd"), (128, 7, "nhd")])
def test_copy_tile_paged_addresses(rng, d, ps, layout):
    """attention_ws.cu copy_tile_paged / attention.cu load_tile_paged's address arithmetic, emulated in
    numpy over flat element offsets: every row of a tile that is live reads the pool row gather_pages
    would, every 16-byte chunk of it once; rows past `valid` read nothing (no page id)."""
    hkv, pages, bn = 2, 30, 128 if d <= 128 else 64
    st = (ps * hkv * d, ps * d, d, 1) if layout == "hnd" else (ps * hkv * d, d, hkv * d, 1)
    table = rng.permutation(pages)[None, :]
    for hk in range(hkv):
        for n0, valid in ((0, bn), (bn, 37), (2 * bn, 0)):
            ch, tpr = d // 8, min(d // 8, 16)
            per, rs = ch // tpr, 128 // tpr
            seen = {}
            for tid in range(128):
                r0, c = tid // tpr, tid % tpr
                for i in range(bn // rs):
                    row = r0 + i * rs
                    if row >= valid:
                        continue
                    key = n0 + row
                    pg = table[0][key // ps]
                    src = hk * st[1] + pg * st[0] + (key % ps) * st[2] + c * 8
                    for e in range(per):
                        seen[(row, c + 16 * e)] = src + 128 * e
            assert len(seen) == valid * ch
            for (row, cc), src in seen.items():
                key = n0 + row
                want = table[0][key // ps] * st[0] + hk * st[1] + (key % ps) * st[2] + cc * 8
                assert src == want


def test_c_api_declared():
    from pydnn.capi import decl
    names = {proto.split("(")[0].split()[-1]: proto for _, fns in decl.FUNCTIONS for proto, _ in fns}
    assert "pydnnAttentionForwardPaged" in names and "pydnnGetAttentionForwardPagedWorkspaceSize" in names
    assert decl.NULLABLE["pydnnAttentionForwardPaged"] == ("statsDesc",)
    import pathlib
    header = (pathlib.Path(__file__).resolve().parents[3] / "include" / "pydnn.h").read_text()
    assert "pydnnStatus_t pydnnAttentionForwardPaged(pydnnHandle_t handle" in header
    assert "pydnnGetAttentionForwardPagedWorkspaceSize" in header


def test_units():
    units = {u.name: u for u in A.kernel_units() + WS.kernel_units()}
    for t in ("bf16", "f16"):
        assert units[f"attention.dec.paged.{t}"].exprs == tuple(A._expr(k, t, d) for k in ("dec_paged", "dec_paged_pipe")
                                                                for d in A.HEAD_DIMS)
        assert A._expr("dec_paged", t, 128).endswith(", 128, true>")
        assert A._expr("dec_paged_pipe", t, 128).endswith(", 128, true, true>")
        u = units[f"attention.ws.paged.{t}"]
        assert u.archs == ("sm_90a",) and len(u.exprs) == 2 * len(WS.HEAD_DIMS)
    assert A.unit_name("dec_paged", 128, "bf16") == A.unit_name("dec_paged_pipe", 64, "bf16") == "attention.dec.paged.bf16"


def test_dispatch_decode_pipe(launches):
    """tuning.attention.PAGED_DEC_PIPE: dec<T, D, true, true>, the same grid and shared memory."""
    with tuning.override({"attention.PAGED_DEC_PIPE": True}):
        _run(_args())
    (f,) = launches
    assert _short(f["f"]) == "dec<pydnn::bf16_t, 128, true, true>" and f["smem"] == A.smem_bytes("dec_paged", 128)


def _compile(unit, arch):
    from pydnn._build import cache
    from pydnn._build.manifest import COMMON_OPTIONS
    from pydnn._cuda import nvrtc
    try:
        nvrtc.version()
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"NVRTC unavailable: {e}")
    text, _ = cache.unit_inputs(unit)
    cubin, lowered, log = nvrtc.compile_cubin(text, unit.source, unit.exprs, arch,
                                              COMMON_OPTIONS + ("--ptxas-options=-v",), [str(cache.ptx_dir())],
                                              unit=unit.name)
    assert cubin[:4] == b"\x7fELF" and set(lowered) == set(unit.exprs)
    return log.decode() if isinstance(log, bytes) else log


@pytest.mark.parametrize("tag", ["bf16", "f16"])
def test_ws_paged_unit_compiles_without_spills(tag):
    """sm_90a: both paged producers at every head dim, 168 registers (setmaxnreg's pool), no wgmma
    serialization (what test_attention_ws_cpu asks of the other units), no spills but the d 256 TMA
    kernel's: at most 8 bytes, its one producer thread's page ids (attention_ws.cu load_paged)."""
    (u,) = [u for u in WS.kernel_units() if u.name == f"attention.ws.paged.{tag}"]
    log = _compile(u, "sm_90a")
    for code in ("C7514", "C7520", "C7508", "C7510"):
        assert code not in log, log
    entry, spills = None, {}
    for ln in log.splitlines():
        if "Compiling entry function" in ln:
            entry = ln.split("'")[1]
        elif "bytes spill stores" in ln and "warning" not in ln:
            spills[entry] = int(ln.split("bytes stack frame,")[1].split("bytes spill stores")[0])
    assert len(spills) == len(u.exprs), log
    for k, n in spills.items():
        assert n <= (8 if "fwd_ws_tma_paged" in k and "Li256E" in k else 0), (k, n)
    assert log.count("Used 168 registers") == len(u.exprs), log


def test_dec_paged_unit_compiles():
    """sm_90 (and sm_80, the decode kernel's other home): dec<T, D, true> and dec<T, D, true, true> for every
    head dim; spills no worse than the plain dec's (d 256: its O is 128 registers; 8 bytes in the plain
    kernel)."""
    (u,) = [u for u in A.kernel_units() if u.name == "attention.dec.paged.bf16"]
    for arch in ("sm_90", "sm_80"):
        log = _compile(u, arch)
        spills = [ln for ln in log.splitlines() if "bytes spill stores" in ln and "warning" not in ln]
        assert len(spills) == len(u.exprs), log
        assert all(int(ln.split(",")[1].split()[0]) <= 32 for ln in spills), log
