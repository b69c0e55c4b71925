"""CPU: batch norm's narrower-vector row plans (tuning.batchnorm.ROWS_MID): which NHWC channel counts get a
rows<w> sequence, that a call picks it on pointers aligned to its access (and the scalar one otherwise), and
that the Ex workspace queries size the same chunking as the plans (both from _first_vec)."""
import sys
import os

import pytest

import pydnn
from pydnn import tuning
from pydnn.ops import batchnorm as B
from pydnn.tensor import packed_strides

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "core"))
from test_fuzz_cpu import cpu_handle  # noqa: E402

F32, F16, BF16 = pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DATA_HALF, pydnn.PYDNN_DATA_BFLOAT16
SPATIAL = pydnn.PYDNN_BATCHNORM_SPATIAL
SIZE = {F32: 4, F16: 2, BF16: 2}


def _nhwc(dims, dtype):
    d = pydnn.create_tensor_descriptor()
    pydnn.set_tensor_nd_descriptor(d, dtype, 4, dims, packed_strides(dims, pydnn.PYDNN_TENSOR_NHWC))
    return d


@pytest.mark.parametrize("dims,dtype,w", [((4, 50, 5, 7), F32, 2), ((3, 12, 9, 11), F16, 4), ((5, 4, 6, 7), BF16, 4),
                                          ((3, 6, 5, 7), BF16, 2), ((2, 37, 3, 3), F32, None),
                                          ((2, 16, 3, 3), F32, None), ((2, 13, 3, 3), F16, None)])
@pytest.mark.parametrize("direction", ["fwd", "bwd", "infer"])
def test_mid_plans_and_pick(dims, dtype, w, direction, monkeypatch):
    monkeypatch.setattr(tuning.batchnorm, "GEN_TINY", 0)  # (small shapes: the rows path, not gen)
    monkeypatch.setattr(tuning.batchnorm, "ROWS_FLAT", False)  # (the mid-width rows alone; flat: below)
    monkeypatch.setattr(tuning.batchnorm, "ROWS_MID", True)
    h = cpu_handle()
    d = _nhwc(dims, dtype)
    tag = B.TAG[dtype]
    ops = {B.OP_X: d.strides}
    ops.update({k: d.strides for k in ((B.OP_DY, B.OP_DX) if direction == "bwd" else (B.OP_Y,))})
    g = B._geometry(SPATIAL, dims, ops, B.vec_width(tag, tag))
    pl = B._make_plan(h, tag, g, direction, False)
    full = B.vec_width(tag, tag)
    names = {n for n in pl.seqs if n.startswith("rows")}
    if w is None:  # a full-vector shape or an odd C: no narrower sequence
        assert pl.vmid is None and not any(n[4:].rstrip("ps").isdigit() and 1 < int(n[4:].rstrip("ps")) < full
                                           for n in names)
        return
    assert pl.vmid == w and f"rows{w}" in pl.seqs and f"rows{full}" not in pl.seqs
    assert all(lc.vec in (w, None) for lc in pl.seqs[f"rows{w}"])
    al = w * SIZE[dtype]
    assert B._pick(pl, (1 << 20, 2 << 20), True, 1 << 20) is pl.seqs[f"rows{w}"]            # 16-byte aligned
    assert B._pick(pl, ((1 << 20) + al, 2 << 20), True, 1 << 20) is pl.seqs[f"rows{w}"]     # aligned to w only
    assert B._pick(pl, ((1 << 20) + al // 2, 2 << 20), True, 1 << 20) is pl.seqs["rows1"]  # not even that
    monkeypatch.setattr(tuning.batchnorm, "ROWS_MID", False)
    pl = B._make_plan(h, tag, g, direction, False)
    assert pl.vmid is None and f"rows{w}" not in pl.seqs


@pytest.mark.parametrize("mid", [True, False])
def test_ex_workspace_matches_the_plan(mid, monkeypatch):
    monkeypatch.setattr(tuning.batchnorm, "ROWS_MID", mid)
    h = cpu_handle()
    for dims, dtype in (((64, 50, 14, 14), F32), ((37, 12, 46, 46), F16)):
        d = _nhwc(dims, dtype)
        bd = pydnn.create_tensor_descriptor()
        pydnn.derive_bn_tensor_descriptor(bd, d, SPATIAL)
        ops = pydnn.PYDNN_BATCHNORM_OPS_BN
        wf = pydnn.get_batch_normalization_forward_training_ex_workspace_size(h, SPATIAL, ops, d, None, d, bd, None)
        wb = pydnn.get_batch_normalization_backward_ex_workspace_size(h, SPATIAL, ops, d, None, d, None, d, bd, None)
        tag = B.TAG[dtype]
        for direction, got in (("fwd", wf), ("bwd", wb)):
            others = {B.OP_X: d.strides}
            others.update({k: d.strides for k in ((B.OP_DY, B.OP_DX) if direction == "bwd" else (B.OP_Y,))})
            pl = B._make_plan(h, tag, B._geometry(SPATIAL, dims, others, B.vec_width(tag, tag)), direction, True)
            assert got == pl.ws_need, (dims, direction, got, pl.ws_need)


@pytest.mark.parametrize("dims,dtype", [((2, 477, 13, 13), F32), ((105, 405, 8, 8), BF16), ((6, 14, 25, 25), F32),
                                        ((37, 12, 14, 14), F16), ((3, 37, 5, 7), F16)])
@pytest.mark.parametrize("direction", ["fwd", "bwd"])
@pytest.mark.parametrize("ex", [False, True])
def test_flat_apply_plans(dims, dtype, direction, ex, monkeypatch):
    """ROWS_FLAT: NHWC rows whose C is not a multiple of the 16-byte vector get flat{v} (the rows sequence's
    stats and final at its widest width, then nc_apply over the flat elements with nc_hw 1, nc_head over the
    16-byte-rounded constants' bytes in non-Ex calls), picked on 16-byte aligned pointers and scratch; the
    switch off: none."""
    monkeypatch.setattr(tuning.batchnorm, "GEN_TINY", 0)
    monkeypatch.setattr(tuning.batchnorm, "ROWS_FLAT", True)
    monkeypatch.setattr(tuning.batchnorm, "ROWS_MID", True)
    h = cpu_handle()
    d = _nhwc(dims, dtype)
    tag = B.TAG[dtype]
    ops = {B.OP_X: d.strides}
    ops.update({k: d.strides for k in ((B.OP_DY, B.OP_DX) if direction == "bwd" else (B.OP_Y,))})
    g = B._geometry(SPATIAL, dims, ops, B.vec_width(tag, tag))
    pl = B._make_plan(h, tag, g, direction, ex)
    v = B.vec_width(tag, tag)
    seq = pl.seqs[f"flat{v}"]
    first = f"rows{pl.vmid}" if pl.vmid else "rows1"
    assert seq[0] is pl.seqs[first][0] and seq[1] is pl.seqs[first][1]
    total = dims[0] * dims[1] * dims[2] * dims[3]
    ap = seq[2]
    assert ap.kernel == "nc_apply" and ap.vec == v and ap.fields["row_end"] == total
    assert pl.params.nc_hw == 1
    begin = ap.fields["row_begin"]
    assert begin % v == 0
    if ex:
        assert begin == 0 and len(seq) == 3
    else:
        cbytes = dims[1] * 4 * 4
        assert begin * SIZE[dtype] >= cbytes and begin * SIZE[dtype] < cbytes + 16
        assert seq[3].kernel == "nc_head" and seq[3].fields == {"row_begin": 0, "row_end": begin}
    # every flat vector of [begin, total) in exactly one nc_apply block (chunk_rows vectors a block)
    ch, nb = ap.fields["chunk_rows"], ap.grid[0]
    vb = [begin // v + b * ch for b in range(nb)]
    assert vb[0] == begin // v and vb[-1] < -(-total // v) <= vb[-1] + ch
    base = 1 << 20
    assert B._pick(pl, (base, 2 * base), True, base) is seq
    assert B._pick(pl, (base + SIZE[dtype], 2 * base), True, base) is not seq  # (one element off)
    if direction == "fwd":
        assert pl.seqs[f"flat{v}s"][2].fields == {"chunk_rows": pl.seqs[f"flat{v}s"][2].fields["chunk_rows"],
                                                  "row_begin": 0, "row_end": total}
    monkeypatch.setattr(tuning.batchnorm, "ROWS_FLAT", False)
    assert f"flat{v}" not in B._make_plan(h, tag, g, direction, ex).seqs
