"""The graph API's paged sdpa (cudnn-frontend's paged_attention_k_table / _v_table / _max_seq_len_kv on
pydnn.attention_forward_paged) on the CPU: the frontend arguments and their errors, the backend
attributes (PYDNN_ATTR_OPERATION_SDPA_FWD_PAGE_TABLE_KDESC / _VDESC / MAX_SEQ_LEN_KV) and their checks
at finalize, the plan's step (the paged call, its workspace), and an execute whose every argument check
passes (the CPU-only handle then refuses at the kernel lookup)."""
import pytest

import pydnn as P
from pydnn.graph import Graph
from test_fuzz_cpu import cpu_handle
from test_graph_nodes_cpu import BAD, BF16, NS, _fake_execute, _raises

I32 = P.PYDNN_DATA_INT32


def _paged_graph(b=2, hq=8, hkv=2, sq=1, pages=40, ps=64, d=128, npg=16, max_seq=None, lens=True, tv=True):
    g = Graph(io_data_type=BF16, handle=cpu_handle())
    q = g.tensor(name="q", dim=[b, hq, sq, d])
    k = g.tensor(name="k", dim=[pages, hkv, ps, d])
    v = g.tensor(name="v", dim=[pages, hkv, ps, d])
    tk = g.tensor(name="tk", dim=[b, 1, npg, 1], data_type=I32)
    tvt = g.tensor(name="tv", dim=[b, 1, npg, 1], data_type=I32) if tv else None
    lkv = g.tensor(name="lkv", dim=[b, 1, 1, 1], data_type=I32)
    o, st = g.sdpa(q, k, v, attn_scale=0.125, use_padding_mask=lens, seq_len_kv=lkv if lens else None,
                   paged_attention_k_table=tk, paged_attention_v_table=tvt, paged_attention_max_seq_len_kv=max_seq)
    o.set_output(True)
    st.set_output(True)
    return g, (q, k, v, tk, tvt, lkv, o, st)


def test_paged_sdpa_builds_and_calls_the_paged_forward():
    g, (q, k, v, tk, tv, lkv, o, st) = _paged_graph(max_seq=1000)
    assert o.dim == [2, 8, 1, 128] and st.dim == [2, 8, 1, 1]
    g.build_operation_graph().create_execution_plans([P.PYDNN_HEUR_MODE_A]).check_support().build_plans()
    op = g._opgraph.state.ops[0]
    assert set(op.inputs) == {"q", "k", "v", "attn_scale", "seq_len_kv", "page_table_k", "page_table_v"}
    assert op.params["max_seq_len_kv"] == 1000
    step = g._plan_obj.built.steps[0]
    assert step.max_seq == 1000
    # a one-row query: the split-KV decode kernel, its partials in the graph's workspace
    want = P.get_attention_forward_paged_workspace_size(cpu_handle(), step.attn, step.descs["q"], step.descs["k"],
                                                        step.descs["page_table_k"], 1000)
    assert want > 0 and step.ws_size == want and g.get_workspace_size() >= want
    _fake_execute(g)
    g2 = Graph.deserialize(cpu_handle(), g.serialize())
    assert g2._plan_obj.built.steps[0].max_seq == 1000


def test_paged_sdpa_default_max_seq_and_prefill():
    g, _ = _paged_graph(sq=300)  # maxSeqLenKV: 16 pages x 64; a prefill (no workspace on the ws kernel)
    g.build_operation_graph().create_execution_plans([P.PYDNN_HEUR_MODE_A]).check_support().build_plans()
    assert g._opgraph.state.ops[0].params["max_seq_len_kv"] == 1024
    assert g._plan_obj.built.steps[0].ws_size == 0
    _fake_execute(g)


def test_paged_sdpa_frontend_errors():
    g = Graph(io_data_type=BF16, handle=cpu_handle())
    q = g.tensor(name="q", dim=[2, 8, 1, 128])
    k = g.tensor(name="k", dim=[40, 2, 64, 128])
    tk = g.tensor(name="tk", dim=[2, 1, 16, 1], data_type=I32)
    lkv = g.tensor(name="lkv", dim=[2, 1, 1, 1], data_type=I32)
    _raises(BAD, "needs paged_attention_k_table and paged_attention_v_table", g.sdpa, q, k, k, use_padding_mask=True,
            seq_len_kv=lkv, paged_attention_k_table=tk)
    _raises(BAD, "needs use_padding_mask=True with seq_len_kv", g.sdpa, q, k, k, paged_attention_k_table=tk,
            paged_attention_v_table=tk)
    _raises(BAD, "paged_attention_max_seq_len_kv 0 must be a positive int", g.sdpa, q, k, k, use_padding_mask=True,
            seq_len_kv=lkv, paged_attention_k_table=tk, paged_attention_v_table=tk, paged_attention_max_seq_len_kv=0)
    _raises(BAD, "without page tables", g.sdpa, q, k, k, paged_attention_max_seq_len_kv=100)
    dq = g.tensor(name="do", dim=[2, 8, 1, 128])
    st = g.tensor(name="st", dim=[2, 8, 1, 1], data_type=P.PYDNN_DATA_FLOAT)
    _raises(NS, "paged_attention_k_table is not supported", g.sdpa_backward, q, k, k, q, dq, st,
            paged_attention_k_table=tk)


@pytest.mark.parametrize("kw,needle", [
    (dict(max_seq=1025), "MAX_SEQ_LEN_KV = 1025: page_table_k covers 1024 keys"),
    (dict(npg=16, b=2, pages=40, ps=64, max_seq=2000), "covers 1024 keys"),
])
def test_paged_sdpa_finalize_errors(kw, needle):
    g, _ = _paged_graph(**kw)
    _raises(BAD, needle, g.build_operation_graph)


def test_paged_sdpa_table_checks():
    g = Graph(io_data_type=BF16, handle=cpu_handle())
    q = g.tensor(name="q", dim=[2, 8, 1, 128])
    k, v = g.tensor(name="k", dim=[40, 2, 64, 128]), g.tensor(name="v", dim=[40, 2, 64, 128])
    tk = g.tensor(name="tk", dim=[2, 1, 16, 1], data_type=P.PYDNN_DATA_FLOAT)
    tv = g.tensor(name="tv", dim=[2, 1, 16, 1], data_type=I32)
    lkv = g.tensor(name="lkv", dim=[2, 1, 1, 1], data_type=I32)
    o, st = g.sdpa(q, k, v, use_padding_mask=True, seq_len_kv=lkv, paged_attention_k_table=tk,
                   paged_attention_v_table=tv)
    o.set_output(True)
    st.set_output(True)
    _raises(BAD, "PAGE_TABLE_KDESC data type 0 must be INT32", g.build_operation_graph)
    g = Graph(io_data_type=BF16, handle=cpu_handle())
    q = g.tensor(name="q", dim=[2, 8, 1, 128])
    k, v = g.tensor(name="k", dim=[40, 2, 64, 128]), g.tensor(name="v", dim=[40, 2, 64, 128])
    tk = g.tensor(name="tk", dim=[3, 1, 16, 1], data_type=I32)
    lkv = g.tensor(name="lkv", dim=[2, 1, 1, 1], data_type=I32)
    o, st = g.sdpa(q, k, v, use_padding_mask=True, seq_len_kv=lkv, paged_attention_k_table=tk,
                   paged_attention_v_table=tk)
    o.set_output(True)
    st.set_output(True)
    _raises(BAD, "PAGE_TABLE_KDESC dims [3, 1, 16, 1] must be [2, 1, maxPages, 1]", g.build_operation_graph)
