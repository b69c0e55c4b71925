"""The graph API's normalization and attention operations through libpydnn (tests/c/graph_norm_cpu.c):
OPERATION_NORM_FORWARD / BACKWARD and OPERATION_SDPA_FWD from C with cuDNN 9's names and values, errors
naming the attribute."""
from cprog import build_and_run


def test_graph_norm_c_program_on_cpu(tmp_path):
    r = build_and_run("graph_norm_cpu", tmp_path)
    print(r.stdout, r.stderr)
    lines = r.stdout.splitlines()
    assert not [x for x in lines if x.startswith("FAIL")], r.stdout + r.stderr
    assert sum(x.startswith("ok ") for x in lines) >= 10, r.stdout + r.stderr
    assert r.returncode == 0, r.stdout + r.stderr
