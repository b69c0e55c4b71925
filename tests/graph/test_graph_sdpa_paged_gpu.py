"""The graph API's paged sdpa (cudnn-frontend's paged_attention_k_table / _v_table) on the GPU: the
problems of tests/ops/attention/test_attention_paged_gpu.py (scattered pages, NaN in every pool row no
live key reads, -1 past each table's live pages) run through g.sdpa and execute, against the float64
reference over the gathered pages; a decode (the split-KV kernel, its partials in the graph's workspace)
and, on sm_90, a prefill (the warp-specialized kernel)."""
import numpy as np
import pytest

import pydnn as P
from devtensor import assert_close
from pydnn.graph import Graph
from test_attention_paged_gpu import BF16, BR, F32, NONE, PagedProblem
from test_graph_gpu import _ws

pytestmark = pytest.mark.gpu
I32 = P.PYDNN_DATA_INT32


@pytest.mark.parametrize("case", [(3, 8, 2, 1, 900, 128, 16, NONE, [900, 31, 400]),
                                  (2, 8, 2, 150, 512, 128, 128, BR, [512, 200])], ids=["decode", "prefill"])
def test_paged_sdpa(handle, rng, case):
    b, hq, hkv, sq, seq, d, ps, mask, lens = case
    if sq > 16 and handle.arch != "sm_90":
        pytest.skip("the paged prefill's kernel is sm_90 only (elsewhere the decode kernel: covered by the op test)")
    pb = PagedProblem(rng, b, hq, hkv, sq, seq, d, ps, BF16, mask, lens)
    g = Graph(io_data_type=BF16, handle=handle)
    q = g.tensor(name="q", dim=list(pb.q.dims), stride=list(pb.q.strides))
    k = g.tensor(name="k", dim=list(pb.pools[0].dims), stride=list(pb.pools[0].strides))
    v = g.tensor(name="v", dim=list(pb.pools[1].dims), stride=list(pb.pools[1].strides))
    tk = g.tensor(name="tk", dim=[b, 1, pb.max_pages, 1], data_type=I32)
    tv = g.tensor(name="tv", dim=[b, 1, pb.max_pages, 1], data_type=I32)
    lkv = g.tensor(name="lkv", dim=[b, 1, 1, 1], data_type=I32)
    o, st = g.sdpa(q, k, v, attn_scale=pb.scale, use_causal_mask_bottom_right=mask == BR, use_padding_mask=True,
                   seq_len_kv=lkv, paged_attention_k_table=tk, paged_attention_v_table=tv,
                   paged_attention_max_seq_len_kv=seq)
    o.set_output(True).set_stride(list(pb.o.strides))
    st.set_output(True)
    g.build_operation_graph().create_execution_plans([P.PYDNN_HEUR_MODE_A]).check_support().build_plans()
    ws = _ws(g)
    if sq == 1:
        assert ws is not None  # the decode kernel's split partials
        ws.fill_bytes(0xFF)
    pb.o.poison()
    pb.lse.poison()
    g.execute({q: pb.q.ptr, k: pb.pools[0].ptr, v: pb.pools[1].ptr, tk: pb.tables[0][0].ptr,
               tv: pb.tables[1][0].ptr, lkv: pb.lkv_dev.ptr, o: pb.o.ptr, st: pb.lse.ptr}, ws.ptr if ws else 0)
    ro, rlse, so, slse = pb.ref_forward()
    assert_close(pb.o.download(), ro, BF16, "O", scale=so)
    got = pb.lse.download()[..., 0]
    dead = np.isneginf(rlse)
    assert np.isneginf(got[dead]).all()
    assert_close(np.where(dead, 0, got), np.where(dead, 0, rlse), F32, "stats", scale=slse)
