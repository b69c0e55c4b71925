"""The ctypes mirrors of the kernel parameter structs match the C layout (checked with the host compiler)."""
import shutil
import subprocess

import pytest

from pydnn._build import cache
from pydnn._build.params import REGISTRY


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_param_structs_match_c_layout(tmp_path):
    import pydnn.ops.activation  # noqa: F401 - families register their structs on import
    from pydnn._build import manifest

    manifest.all_units()  # imports every family module
    assert REGISTRY
    headers = sorted({h for h, _, _ in REGISTRY})
    lines = ["#include <stdio.h>", "#include <stddef.h>"] + [f'#include "{h}"' for h in headers]
    lines.append("int main(void) {")
    expect = []
    for _, cname, cls in REGISTRY:
        lines.append(f'printf("%zu\\n", sizeof({cname}));')
        expect.append(f"{cname} size {__import__('ctypes').sizeof(cls)}")
        for fname, _ in cls._fields_:
            c_field = getattr(cls, "C_NAMES", {}).get(fname, fname)
            lines.append(f'printf("%zu\\n", offsetof({cname}, {c_field}));')
            expect.append(f"{cname}.{fname} offset {getattr(cls, fname).offset}")
    lines.append("return 0; }")
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "layout"
    subprocess.run(["cc", "-I", str(cache.ptx_dir()), str(src), "-o", str(exe)], check=True)
    got = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()
    for line, value in zip(expect, got):
        assert line.endswith(" " + value), f"{line}, C says {value}"
    assert len(got) == len(expect)
