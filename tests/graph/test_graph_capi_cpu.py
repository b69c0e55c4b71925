"""The graph API through libpydnn (tests/c/graph_cpu.c): backend descriptors from C with typed host
arrays, errors with messages, descriptors as elements, and pydnnMatmul's argument checks."""
from cprog import build_and_run


def test_graph_c_program_on_cpu(tmp_path):
    r = build_and_run("graph_cpu", tmp_path)
    print(r.stdout, r.stderr)
    lines = r.stdout.splitlines()
    assert not [x for x in lines if x.startswith("FAIL")], r.stdout + r.stderr
    assert sum(x.startswith("ok ") for x in lines) >= 18, r.stdout + r.stderr
    assert r.returncode == 0, r.stdout + r.stderr
