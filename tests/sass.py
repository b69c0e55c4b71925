"""SASS of a cubin for the CPU tests that check a kernel's instructions, where a cuobjdump that reads it exists
(PYDNN_CUOBJDUMP, else the PATH's). None where there is none, or where it is older than the NVRTC that made the
cubin (it then reports "does not contain device code": a CUDA 13.4 cuobjdump on NVRTC 13.5's sm_90a cubins,
session 32): those tests check registers and spills from ptxas's log without it, as CI does."""
import os
import shutil
import subprocess
import tempfile


def cuobjdump():
    tool = os.environ.get("PYDNN_CUOBJDUMP") or shutil.which("cuobjdump")
    return tool if tool and os.path.exists(tool) else None


def sass_of(cubin):
    tool = cuobjdump()
    if not tool:
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        r = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True)
    if r.returncode and "does not contain device code" in r.stdout + r.stderr:
        return None
    if r.returncode:
        raise RuntimeError(f"{tool} -sass failed ({r.returncode}): {r.stderr or r.stdout}")
    return r.stdout
