"""Build libpydnn (cffi's embedding API) and answer `python -m pydnn config`.

The library embeds a Python interpreter that imports this pydnn package (its location is baked in) and
defines every C function of decl.py through impl.register. It is built into
<cache>/lib/<python tag>-<hash of pydnn's location>/libpydnn.so - one library per pydnn location and
Python, so two checkouts or two Pythons sharing a cache do not rebuild over each other - and rebuilt only
when the C API declaration, the marshalling code, the Python build or the import path changes (a stamp file
beside it holds the key). The header is written beside it too, for installs without the repository's
include/.
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from .._build.cache import cache_dir
from . import decl, fastpath

PKG_PARENT = Path(__file__).resolve().parent.parent.parent  # the folder holding the pydnn package
REPO_INCLUDE = PKG_PARENT / "include"

# cffi's start-up imports _cffi_backend before our init code can touch sys.path, and an interpreter
# embedded in a C program starts from libpython's own prefix: it does not see the virtual environment or
# PYTHONPATH the library was built from. So when the library is loaded, a constructor appends the builder's
# import path to PYTHONPATH (the caller's own entries stay first), and the init code, once the interpreter
# is up, puts the caller's PYTHONPATH back (unset if it had none) so that the C program's child processes
# do not inherit ours.
_ENV_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static char *pydnn_caller_path;  /* the caller's PYTHONPATH, NULL if it had none */
static int pydnn_path_changed;
__attribute__((constructor)) static void pydnn_python_path(void) {
    const char *ours = @PATH@, *old = getenv("PYTHONPATH");
    if (old && *old) {
        size_t n = strlen(old) + strlen(ours) + 2;
        char *both = malloc(n);
        pydnn_caller_path = strdup(old);
        if (!both || !pydnn_caller_path) { free(both); return; }
        snprintf(both, n, "%s:%s", old, ours);
        setenv("PYTHONPATH", both, 1);
        free(both);
    } else {
        setenv("PYTHONPATH", ours, 1);
    }
    pydnn_path_changed = 1;
}
static int _pydnn_pythonpath_changed(void) { return pydnn_path_changed; }
static const char *_pydnn_caller_pythonpath(void) { return pydnn_caller_path; }
"""
_ENV_CDEF = "int _pydnn_pythonpath_changed(void);\nconst char *_pydnn_caller_pythonpath(void);"

_INIT = """
import os, sys
for p in reversed({paths!r}):
    if p not in sys.path:
        sys.path.insert(0, p)
from _pydnn_capi import ffi, lib
if lib._pydnn_pythonpath_changed():
    caller = lib._pydnn_caller_pythonpath()
    if caller == ffi.NULL:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = ffi.string(caller).decode(errors="surrogateescape")
from pydnn.capi import impl
impl.register(ffi, lib)
"""


def _c_string(text):
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def library_dir():
    where = hashlib.sha256(str(PKG_PARENT).encode()).hexdigest()[:10]
    return cache_dir() / "lib" / f"{sys.implementation.cache_tag}-{where}"


def library_path():
    return library_dir() / "libpydnn.so"


def header_text():
    return decl.header_text()


def _in_checkout():
    return (REPO_INCLUDE / "pydnn.h").is_file() and (PKG_PARENT / "tools" / "gen_header.py").is_file()


def _write_atomic(path, text):
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def include_dir():
    """The folder with pydnn.h: the checkout's include/ when running from one, else the library's folder
    (the header is written there if missing or stale)."""
    if _in_checkout():
        return REPO_INCLUDE
    d = library_dir()
    h = d / "pydnn.h"
    text = header_text()
    if not (h.is_file() and h.read_text() == text):
        d.mkdir(parents=True, exist_ok=True)
        _write_atomic(h, text)
    return d


def compat_include_dir():
    """The folder with the cuDNN compatibility cudnn.h (include/cudnn_compat in a checkout, else written
    beside the library's pydnn.h, kept current)."""
    if _in_checkout() and (REPO_INCLUDE / "cudnn_compat" / "cudnn.h").is_file():
        return REPO_INCLUDE / "cudnn_compat"
    d = library_dir() / "cudnn_compat"
    h = d / "cudnn.h"
    text = decl.compat_header_text()
    if not (h.is_file() and h.read_text() == text):
        d.mkdir(parents=True, exist_ok=True)
        _write_atomic(h, text)
    return d


_path_memo = []


def _import_path():
    """pydnn's parent folder, then the import path a fresh interpreter of this Python gets here
    (PYTHONPATH, the standard library, site-packages of the active environment, .pth entries): the same
    whatever the current folder or the running script, so the library's key does not change with them."""
    if not _path_memo:
        paths = [str(PKG_PARENT)]
        try:
            out = subprocess.run([sys.executable, "-c", "import sys, json; print(json.dumps(sys.path))"],
                                 capture_output=True, text=True, check=True, timeout=60).stdout
            found = json.loads(out)
        except (OSError, ValueError, subprocess.SubprocessError):
            found = [p for p in sys.path if os.path.abspath(p or ".") != os.getcwd()]
        for p in found:
            if p and os.path.exists(p) and os.path.abspath(p) not in paths:
                paths.append(os.path.abspath(p))
        _path_memo.append(paths)
    return _path_memo[0]


def _key():
    import cffi

    h = hashlib.sha256()
    here = Path(__file__).resolve().parent
    for part in (header_text(), (here / "impl.py").read_text(), (here / "library.py").read_text(),
                 (here / "fastpath.py").read_text(),
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
    paths = _import_path()
    ffib = cffi.FFI()
    ffib.cdef(decl.types_block() + "\n" + _ENV_CDEF + "\n" + fastpath.CDEF)
    embedded = fastpath.embedding_prototypes(decl.prototypes())
    ffib.embedding_api("\n".join(embedded))
    libdir = sysconfig.get_config_var("LIBDIR") or ""  # libpython's folder, found at run time via rpath
    slow_decls = "\n".join(p for p in embedded if fastpath.SLOW_PREFIX in p)  # defined by cffi, after this source
    ffib.set_source("_pydnn_capi", header_text() + _ENV_C.replace("@PATH@", _c_string(os.pathsep.join(paths)))
                    + slow_decls + "\n" + fastpath.C_SOURCE, libraries=["dl"],
                    extra_link_args=[f"-Wl,-rpath,{libdir}"] if libdir else [])
    ffib.embedding_init_code(_INIT.format(paths=paths))
    tmp = tempfile.mkdtemp(dir=library_dir(), prefix=".build-")
    try:
        built = ffib.compile(tmpdir=tmp, target="libpydnn.*", verbose=verbose)
        os.replace(built, out)  # atomic: a running program keeps its mapped copy
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _write_atomic(library_dir() / "pydnn.h", header_text())
    _write_atomic(stamp, key)
    if verbose:
        print(f"pydnn: built {out}", file=sys.stderr)
    return out


def config_flags(cflags=False, libs=False, cudnn_compat=False):
    """What `cc prog.c $(python -m pydnn config --cflags --libs)` needs; --libs builds the library if
    missing or stale. libpython is a dependency of libpydnn itself (found through its own rpath).
    cudnn_compat: --cflags also puts the folder of the cuDNN-named cudnn.h first, so that a program
    written against cuDNN's legacy API builds unchanged."""
    parts = []
    if cflags:
        if cudnn_compat:
            parts.append(f"-I{compat_include_dir()}")
        parts.append(f"-I{include_dir()}")
    if libs:
        path = build_library()
        parts += [f"-L{path.parent}", "-lpydnn", f"-Wl,-rpath,{path.parent}"]
    return " ".join(parts)
