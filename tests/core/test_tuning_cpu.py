"""pydnn.tuning: one home for the planners' switches, settable from code, tests and the environment."""
import os
import subprocess
import sys

import pytest

import pydnn
from pydnn import tuning


def test_every_family_documents_its_switches():
    assert {"conv", "conv_gemm", "conv_winograd", "conv_wgrad_wgmma", "batchnorm", "norm", "pooling", "dropout",
            "matmul", "attention", "attention_bwd", "activation"} <= set(tuning.FAMILIES)
    for fam in tuning.FAMILIES.values():
        assert fam.names()
        for n in fam.names():
            assert fam._docs[n].strip(), f"{fam._family}.{n} has no doc"


def test_unknown_switch_is_an_error():
    with pytest.raises(AttributeError, match="no switch"):
        tuning.conv.USE_WGMM = True
    with pytest.raises(KeyError):
        tuning.get("conv.nope")


def test_override_restores():
    before = tuning.conv.USE_WGM
    with tuning.override({"conv.USE_WGM": not before, "norm.GN_FILL": 7}):
        assert tuning.conv.USE_WGM is (not before) and tuning.norm.GN_FILL == 7
    assert tuning.conv.USE_WGM is before and tuning.norm.GN_FILL != 7


def test_mutable_defaults_are_copies():
    tuning.conv.TC_FORCE[0] = (128, 64)
    try:
        assert tuning.conv._defaults["TC_FORCE"] == {}
    finally:
        tuning.conv.reset()
    assert tuning.conv.TC_FORCE == {}


def test_environment_sets_switches_at_import():
    code = "import pydnn; from pydnn import tuning; print(tuning.conv.USE_WGM, tuning.conv_gemm.COL_LIMIT)"
    env = dict(os.environ, PYDNN_TUNING="conv.USE_WGM=False; conv_gemm.COL_LIMIT=1048576, bogus.X=1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", str(1 << 20)]
    assert "bogus.X" in out.stderr   # an unknown setting is named, then ignored


def test_environment_literals_keep_their_commas():
    """Commas inside a tuple / set / list literal belong to it; outside they separate settings as ';' does."""
    assert tuning._items("a.X=(1, 2); b.Y={3, 4},c.Z=[5, (6, 7)], d.W=1") == \
        ["a.X=(1, 2)", " b.Y={3, 4}", "c.Z=[5, (6, 7)]", " d.W=1"]
    try:
        tuning.apply_environment("activation.PLAIN_ACCESS=(1, 2); norm.XSPLIT=False")
        assert tuning.activation.PLAIN_ACCESS == (1, 2) and tuning.norm.XSPLIT is False
    finally:
        tuning.activation.reset()
        tuning.norm.reset()


def test_planners_read_the_switch(monkeypatch):
    """A switch changes the plan a planner makes (the 1x1 bf16 forward on sm_90 takes fwd_wgmma with
    USE_WGM, the pipelined mma.sync kernel without)."""
    from pydnn.ops.convolution import plans, problem
    from test_fuzz_cpu import cpu_handle
    h = cpu_handle()
    conv = pydnn.create_convolution_descriptor()
    pydnn.set_convolution2d_descriptor(conv, 1, 1, 1, 1, 1, 1, pydnn.PYDNN_CROSS_CORRELATION, pydnn.PYDNN_DATA_FLOAT)
    bf = pydnn.PYDNN_DATA_BFLOAT16
    x, y = pydnn.create_tensor_descriptor(), pydnn.create_tensor_descriptor()
    pydnn.set_tensor4d_descriptor(x, pydnn.PYDNN_TENSOR_NHWC, bf, 32, 256, 28, 28)
    pydnn.set_tensor4d_descriptor(y, pydnn.PYDNN_TENSOR_NHWC, bf, 32, 256, 28, 28)
    w = pydnn.create_filter_descriptor()
    pydnn.set_filter4d_descriptor(w, bf, pydnn.PYDNN_TENSOR_NHWC, 256, 256, 3, 3)
    algo = pydnn.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM
    monkeypatch.setattr(tuning.conv, "FWD_TMA", False)   # (conv, session 31: else fwd_tma replaces the wgmma plan)
    on = plans.new_plan(h, problem.DIR_FWD, algo, conv, x, w, y)
    monkeypatch.setattr(tuning.conv, "USE_WGM", False)
    off = plans.new_plan(h, problem.DIR_FWD, algo, conv, x, w, y)
    assert "fwd_wgmma" in on.gemm_expr and "fwd_wgmma" not in off.gemm_expr


def test_command_line_lists_switches():
    out = subprocess.run([sys.executable, "-m", "pydnn", "tuning"], capture_output=True, text=True, check=True)
    assert "conv.USE_WGM" in out.stdout and "norm.GN_REG" in out.stdout
