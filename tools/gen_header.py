#!/usr/bin/env python3
"""Regenerate include/pydnn.h from pydnn/capi/decl.py and pydnn/enums.py (a test fails when it is stale)."""
import sys
from pathlib import Path

root = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(root))
from pydnn.capi import decl  # noqa: E402

path = root / "include" / "pydnn.h"
path.parent.mkdir(exist_ok=True)
path.write_text(decl.header_text())
print(f"wrote {path}")
