"""tools/profile_torch_step.py on the GPU, short: the CNN demo's step on both backends plus an A/B variant of
the pydnn backend, in one process; the tables are written and both backends' losses after the same steps
(same initialisation, same batches) agree, which checks the whole pydnn training step against PyTorch's.
Run by the lead on the GPU machine (~10 s once the kernels are compiled; --prebuild compiles them first):

    python -m pytest -q tests/torch/test_profile_tool_gpu.py
"""
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_cnn_profile_both_backends_and_a_variant(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, os.path.join(ROOT, "tools", "profile_torch_step.py"), "--prebuild", "--demos", "cnn",
           "--ab", "nofuse", "--timed-steps", "10", "--steps", "4", "--warmup", "3", "--cprofile-steps", "2",
           "--layer-steps", "3", "--top", "8", "--out", str(tmp_path)]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    md = (tmp_path / "profile_torch_step.md").read_text()
    for needle in ("Step time without a profiler", "GPU time by op family", "host Python time by owner",
                   "pydnn API calls per step", "| cnn | pydnn[nofuse] |", "CNN per layer"):
        assert needle in md, needle
    res = json.loads((tmp_path / "profile_torch_step.json").read_text())["results"]
    assert set(res) == {"cnn/pydnn", "cnn/torch", "cnn/pydnn[nofuse]"}
    api = {row["function"] for row in res["cnn/pydnn"]["cprofile_details"]["api"]}
    # KNOWN GAP (final run of session 30, H200): since the convolutions' call-record entries
    # (tuning.callpath.CALL_RECORDS) and the fused conv + batch-norm blocks (tuning.torch.FUSE_BLOCK), the
    # table lists no convolution row (it read ['batch_normalization_backward_ex', ..._forward_training_ex',
    # 'pooling_backward', 'pooling_forward', 'transform_tensor']); the batch norms and pools still show. Since
    # session 33's compiled entries (tuning.callpath.C_ENTRY_MAP) a repeated pooling_forward never enters Python
    # either, so cProfile cannot list it (final call of session 33, H200: it read ['batch_normalization_backward_ex',
    # 'batch_normalization_forward_training_ex', 'pooling_backward', 'transform_tensor'])
    assert {"batch_normalization_forward_training_ex", "pooling_backward"} <= api, sorted(api)
    for b in ("cnn/pydnn", "cnn/pydnn[nofuse]"):
        r = res[b]
        assert r["timed"]["median_ms"] > 0 and r["torch_profiler"]["gpu_busy_ms_per_step"] > 0
        assert r["final_loss"] == r["final_loss"] and r["final_loss"] < 10
    # pydnn and torch ran the same steps (24 AdamW steps) from the same initialisation on the same batches under
    # bf16 autocast (the variant ran fewer: no cProfile or layer passes): their losses follow each other
    # (train_cnn.py's per-epoch losses agree to ~1e-3 over its whole run)
    mine, ref = res["cnn/pydnn"]["final_loss"], res["cnn/torch"]["final_loss"]
    assert abs(mine - ref) <= 0.05 * abs(ref) + 0.02, (mine, ref)
