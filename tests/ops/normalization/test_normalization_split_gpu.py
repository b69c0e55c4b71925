"""The split layer / RMS backward for long fp32 rows (tuning.norm.BWD_SPLIT: bwd_split_dx, a block per row
reading x and dy twice; bwd_split_params, dscale / dbias per row chunk; finish_rowx) on the GPU against the
float64 reference, outputs poisoned: rows the one-pass kernels serve only with an 8-block cluster, at least as
many as the SMs; blending of dx and of dscale / dbias, no bias; the switch off keeps the cluster kernels."""
import pytest

import pydnn
from pydnn import tuning
from pydnn.ops import normalization as N
from test_normalization_gpu import _backward_check, _nd, _tensor

pytestmark = pytest.mark.gpu

F32, BF16, F16 = pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DATA_BFLOAT16, pydnn.PYDNN_DATA_HALF
LAYER, RMS = pydnn.PYDNN_NORM_KIND_LAYER, pydnn.PYDNN_NORM_KIND_RMS


@pytest.mark.parametrize("kind,length", [(LAYER, 8552), (RMS, 12288), (LAYER, 16384)], ids=["ln8552", "rms12288",
                                                                                             "ln16384"])
def test_split_backward(handle, rng, monkeypatch, kind, length):
    dims = (max(200, handle.sm_count + 7), length)
    x = _tensor(dims, "nchw", F32)
    monkeypatch.setattr(tuning.norm, "BWD_SPLIT", False)
    alts, _ = N.plan_summary(handle, _nd(kind, 0, 1), x.desc, backward=True)
    assert not alts[0][0].startswith("bwd_split"), alts
    monkeypatch.setattr(tuning.norm, "BWD_SPLIT", True)
    alts, ws = N.plan_summary(handle, _nd(kind, 0, 1), x.desc, backward=True)
    assert [a.split()[0] for a in alts[0]] == ["bwd_split_params", "bwd_split_dx", "finish"], alts
    _backward_check(handle, rng, kind, 0, 1, dims, "nchw", F32)
    _backward_check(handle, rng, kind, 0, 1, dims, "nchw", F32, alphas=(0.5, -1.5, 2.0, 0.25), bias=False,
                    dbias=False)


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "f16"])
def test_split_backward_16(handle, rng, monkeypatch, dtype):
    """BWD_SPLIT_16: the 16-bit rows the same way (8-element vectors)."""
    monkeypatch.setattr(tuning.norm, "BWD_SPLIT", True)
    monkeypatch.setattr(tuning.norm, "BWD_SPLIT_16", True)
    for kind, dims in ((RMS, (max(150, handle.sm_count + 3), 32768)), (LAYER, (max(140, handle.sm_count + 1), 17000))):
        x = _tensor(dims, "nchw", dtype)
        alts, _ = N.plan_summary(handle, _nd(kind, 0, 1), x.desc, backward=True)
        assert [a.split()[0] for a in alts[0]] == ["bwd_split_params", "bwd_split_dx", "finish"], alts
        _backward_check(handle, rng, kind, 0, 1, dims, "nchw", dtype)
        _backward_check(handle, rng, kind, 0, 1, dims, "nchw", dtype, alphas=(0.5, -1.5, 2.0, 0.25), bias=False,
                        dbias=False)
