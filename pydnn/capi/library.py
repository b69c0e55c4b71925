"""Build libpydnn (cffi's embedding API) and answer `python -m pydnn config`.

The library embeds a Python interpreter that imports this pydnn package (its location is baked in) and
defines every C function of decl.py through impl.register. It is built into <cache>/lib/libpydnn.so
and rebuilt only when the C API declaration, the marshalling code, pydnn's version or the Python build
changes (a stamp file beside it holds the key). The header is written beside it too, for installs that
do not carry the repository's include/.
"""
import hashlib
import os
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

from .._build.cache import cache_dir
from . import decl

PKG_PARENT = Path(__file__).resolve().parent.parent.parent  # the folder holding the pydnn package
REPO_INCLUDE = PKG_PARENT / "include"

# The embedded interpreter starts from libpython's own prefix and knows nothing of the virtual environment
# or PYTHONPATH the library was built from; the builder's import path is baked in so that pydnn and its
# dependencies (numpy, cuda-bindings) resolve as they did at build time.
_INIT = """
import sys
for p in reversed({paths!r}):
    if p not in sys.path:
        sys.path.insert(0, p)
from _pydnn_capi import ffi
from pydnn.capi import impl
impl.register(ffi)
"""


# cffi's start-up imports _cffi_backend before our init code can touch sys.path, and an interpreter
# embedded in a C program does not see the virtual environment it was built from. So when the library is
# loaded and the caller has no PYTHONPATH of its own, it sets PYTHONPATH to the builder's import path
# (a caller who sets PYTHONPATH keeps it; it must then make cffi and numpy importable itself).
_ENV_C = """
#include <stdlib.h>
__attribute__((constructor)) static void pydnn_python_path(void) {
    setenv("PYTHONPATH", @PATH@, 0);
}
"""


def _c_string(text):
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def library_dir():
    return cache_dir() / "lib"


def library_path():
    return library_dir() / "libpydnn.so"


def include_dir():
    """The folder with pydnn.h: the checkout's include/ when running from one, else beside the library."""
    if (REPO_INCLUDE / "pydnn.h").is_file():
        return REPO_INCLUDE
    return cache_dir() / "include"


def header_text():
    return decl.header_text()


def _import_path():
    """pydnn's parent folder, then the builder's sys.path entries that exist (no '' or cwd)."""
    paths = [str(PKG_PARENT)]
    for p in sys.path:
        if p and os.path.isdir(p) and p not in paths:
            paths.append(os.path.abspath(p))
    return paths


def _key():
    import cffi

    h = hashlib.sha256()
    here = Path(__file__).resolve().parent
    for part in (header_text(), (here / "impl.py").read_text(), (here / "library.py").read_text(),
                 repr(_import_path()), sys.version, cffi.__version__):
        h.update(part.encode())
    return h.hexdigest()


def build_library(verbose=False):
    """Build libpydnn.so if it is missing or stale; returns its path."""
    import cffi

    out, stamp = library_path(), library_dir() / "libpydnn.stamp"
    key = _key()
    if out.is_file() and stamp.is_file() and stamp.read_text() == key:
        return out
    library_dir().mkdir(parents=True, exist_ok=True)
    ffib = cffi.FFI()
    ffib.cdef(decl.types_block())
    ffib.embedding_api("\n".join(decl.prototypes()))
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    ffib.set_source("_pydnn_capi", header_text() + _ENV_C.replace("@PATH@", _c_string(os.pathsep.join(_import_path()))),
                    extra_link_args=[f"-Wl,-rpath,{libdir}"] if libdir else [])
    ffib.embedding_init_code(_INIT.format(paths=_import_path()))
    tmp = tempfile.mkdtemp(dir=library_dir(), prefix=".build-")
    try:
        built = ffib.compile(tmpdir=tmp, target="libpydnn.*", verbose=verbose)
        os.replace(built, out)  # atomic: a running program keeps its mapped copy
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    inc = cache_dir() / "include"
    inc.mkdir(parents=True, exist_ok=True)
    (inc / "pydnn.h").write_text(header_text())
    stamp.write_text(key)
    if verbose:
        print(f"pydnn: built {out}", file=sys.stderr)
    return out


def config_flags(cflags=False, libs=False):
    """What `cc prog.c $(python -m pydnn config --cflags --libs)` needs; builds the library if missing."""
    parts = []
    if cflags:
        parts.append(f"-I{include_dir()}")
    if libs:
        path = build_library()
        parts += [f"-L{path.parent}", "-lpydnn", f"-Wl,-rpath,{path.parent}"]
    return " ".join(parts)
