#!/usr/bin/env python3
"""Regenerate include/pydnn.h and include/cudnn_compat/cudnn.h (cuDNN's names mapped onto pydnn's) from
pydnn/capi/decl.py and pydnn/enums.py (tests fail when either is stale)."""
import sys
from pathlib import Path

root = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(root))
from pydnn.capi import decl  # noqa: E402

path = root / "include" / "pydnn.h"
path.parent.mkdir(exist_ok=True)
path.write_text(decl.header_text())
print(f"wrote {path}")

compat = root / "include" / "cudnn_compat" / "cudnn.h"
compat.parent.mkdir(exist_ok=True)
compat.write_text(decl.compat_header_text())
print(f"wrote {compat}")
