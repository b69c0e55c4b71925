"""convert(fuse=True) giving a BatchNorm2d its following MaxPool2d (pydnn.tuning.torch.FUSE_POOL: the pool
runs inside the batch norm's autograd Function in training), on the CPU against emulated pydnn calls
(test_torch_emulated_cpu.py's harness): which patterns fuse, state-dict keys kept, outputs / gradients /
running statistics against PyTorch over training steps and in eval, the switch off (same results, separate
pool calls), and the patterns left alone."""
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import pydnn.torch as pt  # noqa: E402
from pydnn import tuning  # noqa: E402
from test_torch_emulated_cpu import CALLS, check, emulated  # noqa: E402,F401


@pytest.fixture(autouse=True)
def _chain_off():
    """(tuning.torch.FUSE_CHAIN off: this file's node counts, reports and Python work are its blocks' own;
    test_torch_chain_*.py covers the chain.)"""
    with tuning.override({"torch.FUSE_CHAIN": False}):
        yield


def _model(pool=None):
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), pool or nn.MaxPool2d(2),
                         nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.MaxPool2d(3, 2, 1),
                         nn.Flatten(), nn.Linear(8 * 2 * 2, 5))


def _pair():
    torch.manual_seed(3)
    ref = _model()
    mine = _model()
    mine.load_state_dict(ref.state_dict())
    keys = list(mine.state_dict())
    report = pt.convert(mine, fuse=True)
    assert list(mine.state_dict()) == keys
    return mine, ref, report


def test_convert_fuses_pools(emulated):
    mine, ref, report = _pair()
    assert report.fused == [("1", "relu"), ("1", "max_pool2d"), ("5", "max_pool2d"), ("0", "1"), ("4", "5")]
    assert type(mine[3]) is nn.Identity and type(mine[6]) is nn.Identity
    assert mine[1].pool == (2, 2, 0) and mine[5].pool == (3, 2, 1) and "max_pool" in repr(mine[1])


@pytest.mark.parametrize("fuse_pool", [True, False])
def test_fused_pool_matches_torch(emulated, monkeypatch, fuse_pool):
    monkeypatch.setattr(tuning.torch, "FUSE_POOL", fuse_pool)
    mine, ref, _ = _pair()
    for _ in range(3):
        mine.zero_grad(), ref.zero_grad()
        check(mine, ref, torch.randn(2, 3, 8, 8))
    for a, b in zip(mine.buffers(), ref.buffers()):
        torch.testing.assert_close(a, b)
    pools = CALLS.count("pool_fwd")
    assert pools == 6  # (two pools a step, three steps: in the batch norm's Function or as their own calls)
    mine.eval(), ref.eval()
    check(mine, ref, torch.randn(2, 3, 8, 8))


def test_unfusable_pools_stay(emulated):
    for pool in (nn.MaxPool2d(2, ceil_mode=True), nn.MaxPool2d(2, return_indices=True), nn.AvgPool2d(2)):
        model = _model(pool)
        report = pt.convert(model, fuse=True)
        assert ("1", "max_pool2d") not in report.fused
        assert type(model[3]) is not nn.Identity
    model = _model()
    model[3].register_forward_hook(lambda m, i, o: None)
    assert ("1", "max_pool2d") not in pt.convert(model, fuse=True).fused
    model = _model()
    assert not any(a == "max_pool2d" for _, a in pt.convert(model).fused)  # fuse=False: nothing
