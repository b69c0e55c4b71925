"""Run one test function of a file in a fresh interpreter (tests whose outcome depended on what earlier
tests of a long pytest session left in the process: see the callers' comments). The function body runs
only in the child, where PYDNN_TEST_ISOLATED names it; in the parent a launcher test runs the child and
fails with its output when the child fails."""
import os
import subprocess
import sys

import pytest

ENV = "PYDNN_TEST_ISOLATED"


def in_child(name):
    return os.environ.get(ENV) == name


def child_only(name):
    return pytest.mark.skipif(not in_child(name), reason=f"runs in its own process ({name}_isolated)")


def run_in_child(path, name):
    env = dict(os.environ, **{ENV: name})
    env.pop("PYDNN_TEST_SHARD", None)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"{path}", "-k", name],
                       capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert " passed" in r.stdout and "failed" not in r.stdout, r.stdout[-2000:]
