#!/usr/bin/env bash
# Download the wheels the offline GPU machine lacks (cffi and its pycparser, for CPython 3.12 x86-64)
# into .whl/, which tools/gpu_check.sh installs from. Run here, on a machine with network.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl "cffi==2.0.0" "pycparser"
ls .whl
