"""The paged GPU tests (test_attention_paged_gpu.py, tests/graph/test_graph_sdpa_paged_gpu.py) run on the CPU
against a numpy emulation of the paged kernels: device memory is numpy (driver.mem_alloc / memcpy / memset
faked), and a launch of dec<T, D, true> or fwd_ws_paged computes O and lse in float64 from nothing but the
params struct the host built (the page tables through ptab_k / ptab_v and ptab_stride, the pools through
stride[K] / stride[V] as (page, head, row), page_size, seq_kv, the lengths, the mask), as the kernels
address them. What this checks: the host's params (what the kernels are told) and the GPU tests' own
plumbing (pools, NaN rows, tables, references); not the kernels (the GPU run does that). The TMA producer
is not reached (no driver to encode tensor maps), so its cases are left to the GPU."""
import ctypes

import numpy as np
import pytest

import pydnn
from pydnn._cuda import driver
from pydnn.ops import attention as A
from pydnn.reference import dtypes as rd


MEM = {}
NEXT = [1 << 32]


def _find(addr):
    for base, buf in MEM.items():
        if base <= addr < base + len(buf):
            return base, buf
    raise RuntimeError(f"bad address {addr:#x}")


def alloc(n):
    a = NEXT[0]
    NEXT[0] += (max(n, 1) + 4095) // 4096 * 4096 + 4096
    MEM[a] = np.zeros(max(n, 1), np.uint8)
    return a


def read(addr, n):
    base, buf = _find(addr)
    assert addr + n <= base + len(buf), "read past allocation"
    return buf[addr - base: addr - base + n]


def htod(dst, src, n):
    base, buf = _find(dst)
    buf[dst - base: dst - base + n] = np.frombuffer((ctypes.c_ubyte * n).from_address(src), np.uint8)


def dtoh(dst, src, n):
    ctypes.memmove(dst, read(src, n).ctypes.data, n)


def memset(dst, byte, n):
    base, buf = _find(dst)
    buf[dst - base: dst - base + n] = byte


def elem(addr, tag):
    if tag == "f32":
        return float(read(addr, 4).view(np.float32)[0])
    bits = read(addr, 2).view(np.uint16)
    if tag == "bf16":
        return float(rd.f32_from_bf16_bits(bits)[0])
    return float(bits.view(np.float16)[0])


def row(addr, d, tag):
    if tag == "bf16":
        return rd.f32_from_bf16_bits(read(addr, 2 * d).view(np.uint16)).astype(np.float64)
    return read(addr, 2 * d).view(np.float16).astype(np.float64)


def write_row(addr, vals, tag):
    base, buf = _find(addr)
    st = rd.to_storage(vals, pydnn.PYDNN_DATA_BFLOAT16 if tag == "bf16" else pydnn.PYDNN_DATA_HALF)
    b = np.ascontiguousarray(st).view(np.uint8)
    buf[addr - base: addr - base + len(b)] = b


def i32(addr):
    return int(read(addr, 4).view(np.int32)[0])


def emulate(p, tag):
    """The paged forward from params: O, lse."""
    es = 2
    T_Q, T_K, T_V, T_O, T_LSE = A.T_Q, A.T_K, A.T_V, A.T_O, A.T_LSE
    d = EMU_D[0]
    g = p.group
    for b in range(p.batch):
        lq = min(max(i32(p.lens_q + 4 * b), 0), p.seq_q) if p.lens_q else p.seq_q
        lkv = min(max(i32(p.lens_kv + 4 * b), 0), p.seq_kv) if p.lens_kv else p.seq_kv
        off = lkv - lq if p.mask == 2 else 0
        for hk in range(p.heads_kv):
            K = np.zeros((lkv, d)); V = np.zeros((lkv, d))
            for j in range(lkv):
                pk = i32(p.ptab_k + 4 * (b * p.ptab_stride[0][0] + (j // p.page_size) * p.ptab_stride[0][1]))
                pv = i32(p.ptab_v + 4 * (b * p.ptab_stride[1][0] + (j // p.page_size) * p.ptab_stride[1][1]))
                K[j] = row(p.k + es * (pk * p.stride[T_K][0] + hk * p.stride[T_K][1] + (j % p.page_size) * p.stride[T_K][2]), d, tag)
                V[j] = row(p.v + es * (pv * p.stride[T_V][0] + hk * p.stride[T_V][1] + (j % p.page_size) * p.stride[T_V][2]), d, tag)
            for hh in range(g):
                h = hk * g + hh
                for i in range(p.seq_q):
                    oa = p.o + es * (b * p.stride[T_O][0] + h * p.stride[T_O][1] + i * p.stride[T_O][2])
                    q = row(p.q + es * (b * p.stride[T_Q][0] + h * p.stride[T_Q][1] + i * p.stride[T_Q][2]), d, tag)
                    vis = np.arange(lkv) < lkv
                    if p.mask:
                        vis &= np.arange(lkv) <= i + off
                    if i >= lq or not vis.any():
                        o, lse = np.zeros(d), -np.inf
                    else:
                        s = p.scale * (K @ q)
                        s = np.where(vis, s, -np.inf)
                        m = s.max()
                        e = np.exp(s - m)
                        o = e @ V / e.sum()
                        lse = m + np.log(e.sum())
                    write_row(oa, o, tag)
                    if p.lse:
                        la = p.lse + 4 * (b * p.stride[T_LSE][0] + h * p.stride[T_LSE][1] + i * p.stride[T_LSE][2])
                        base, buf = _find(la)
                        buf[la - base: la - base + 4] = np.array([lse], np.float32).view(np.uint8)


EMU_D = [0]


class _Funcs(dict):
    def get(self, key, default=None):
        return key[1]


@pytest.fixture
def emu(monkeypatch):
    monkeypatch.setattr(driver, "current_context", lambda: None)
    monkeypatch.setattr(driver, "mem_alloc", alloc)
    monkeypatch.setattr(driver, "mem_free", lambda a: MEM.pop(a, None))
    monkeypatch.setattr(driver, "memcpy_htod", htod)
    monkeypatch.setattr(driver, "memcpy_dtoh", dtoh)
    monkeypatch.setattr(driver, "memset_d8", memset)
    monkeypatch.setattr(driver, "synchronize", lambda: None)
    monkeypatch.setattr(driver, "function_set_max_dynamic_smem", lambda f, n: None)
    calls = []

    def launch(f, grid, block, smem, stream, p):
        calls.append(f)
        if "dec_combine" in f:
            return
        assert p.ptab_k, f  # (only the paged kernels may run here)
        tag = "bf16" if "bf16" in f else "f16"
        EMU_D[0] = int(f.split(",")[1])
        emulate(p, tag)
    monkeypatch.setattr(driver, "launch", launch)
    monkeypatch.setattr(driver, "launch_args", lambda f, grid, block, smem, stream, argv: launch(
        f, grid, block, smem, stream, argv[2]))
    from test_fuzz_cpu import cpu_handle
    h = cpu_handle()
    h._funcs = _Funcs()
    h.arch = "sm_90"
    yield h
    MEM.clear()

def test_decode_cases(emu, rng):
    import test_attention_paged_gpu as G
    for case in G.DEC_CASES:
        G.test_paged_decode(emu, rng, case)
    G.test_paged_decode_nhd_f16(emu, rng)
    G.test_paged_decode_without_stats_and_wide_table(emu, rng)
    G.test_paged_prefill_on_the_decode_kernel(emu, rng)
    G.test_paged_decode_pipe(emu, rng, G.DEC_CASES[0])


def test_prefill_cases(emu, rng):
    """Every prefill case (here on the cp.async producer: no driver to encode the TMA maps)."""
    import test_attention_paged_gpu as G
    for case in G.WS_CASES:
        G.run_prefill(emu, rng, case)


def test_graph_cases(emu, rng):
    import test_graph_sdpa_paged_gpu as GG
    GG.test_paged_sdpa(emu, rng, (3, 8, 2, 1, 900, 128, 16, 0, [900, 31, 400]))
    GG.test_paged_sdpa(emu, rng, (2, 8, 2, 150, 512, 128, 128, 2, [512, 200]))


def test_emulation_catches_a_wrong_page_stride(emu, rng, monkeypatch):
    """The emulation reads what the params say: a host that sent the K table's batch stride wrong gives a
    wrong O, and the GPU test's check fails."""
    import test_attention_paged_gpu as G
    pb = G.PagedProblem(rng, 2, 8, 2, 1, 700, 64, 16, pydnn.PYDNN_DATA_BFLOAT16, 0, [700, 250], max_pages=50)
    real_fwd = A._decode_forward

    def skew(handle, a, pr, p, *rest, **kw):
        p.ptab_stride[0][0] = 0  # batch 1 reads batch 0's K pages (live ids: no fault, a wrong answer)
        return real_fwd(handle, a, pr, p, *rest, **kw)
    monkeypatch.setattr(A, "_decode_forward", skew)
    with pytest.raises(AssertionError):
        G._check(emu, pb, "dec")
