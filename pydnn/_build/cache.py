"""The on-disk cubin cache.

Key = sha256 of (cache format, unit source, every header it includes, name expressions, options, NVRTC
version, arch); the file name carries the key, so a changed input simply misses. An entry holds a small
JSON header (lowered names, cubin digest) and the cubin; a truncated or corrupt entry fails its digest
check and is rebuilt. Writes go to a temporary file in the same folder and are renamed into place, so a
reader never sees half an entry and concurrent builders cannot corrupt each other.
"""
import hashlib
import json
import os
import re
import struct
import tempfile
from pathlib import Path

from .options import common_options

FORMAT = b"PYDNNCB1"
_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def cache_dir():
    env = os.environ.get("PYDNN_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pydnn"


def ptx_dir():
    """Kernel sources: inside the package for a regular install, the repo's ptx/ for an editable one."""
    here = Path(__file__).resolve().parent.parent
    packaged = here / "_ptx"
    return packaged if packaged.is_dir() else here.parent / "ptx"


_source_memo = {}


def _headers(root, folder, text):
    """[(path relative to ptx/, text)] of every header `text` includes, transitively, sorted; an include
    resolves beside the including file, else under ptx/."""
    headers, seen = [], set()
    stack = [(folder, text)]
    while stack:
        folder, body = stack.pop()
        for inc in _INCLUDE.findall(body):
            path = (folder / inc) if (folder / inc).exists() else (root / inc)
            rel = os.path.relpath(path.resolve(), root.resolve())
            if rel in seen:
                continue
            seen.add(rel)
            htext = path.read_text()
            headers.append((rel, htext))
            stack.append((path.parent, htext))
    return sorted(headers)


def unit_inputs(unit):
    """(source text, [(header path, text)...]) for a unit; memoised per process (sources do not change)."""
    memo = _source_memo.get(unit.source)
    if memo is None:
        root = ptx_dir()
        text = (root / unit.source).read_text()
        memo = (text, _headers(root, (root / unit.source).parent, text))
        _source_memo[unit.source] = memo
    return memo


def register_generated(source_name, text):
    """A unit source that is not a file under ptx/ (the graph API's generated kernels): its text, and the
    headers it includes from ptx/, keyed like any unit's (the key hashes the text), so generated kernels
    share this cache. `source_name` (e.g. "graph/pw_<hash>.cu") stands for the file in keys and names."""
    if source_name not in _source_memo:
        root = ptx_dir()
        _source_memo[source_name] = (text, _headers(root, root, text))


def unit_key(unit, arch, nvrtc_version):
    text, headers = unit_inputs(unit)
    h = hashlib.sha256()
    for part in (FORMAT, unit.source, text, *[f"{p}\n{t}" for p, t in headers], "\n".join(unit.exprs),
                 " ".join(common_options() + tuple(unit.options)), f"nvrtc{nvrtc_version}", arch):
        data = part if isinstance(part, bytes) else part.encode()
        h.update(struct.pack("<Q", len(data)))
        h.update(data)
    return h.hexdigest()


def entry_path(unit, arch, key):
    return cache_dir() / "cubin" / f"{unit.name}.{arch}.{key[:24]}.cubin"


def read_entry(path):
    """(cubin, lowered names) or None when the entry is missing, truncated or corrupt."""
    try:
        blob = path.read_bytes()
    except OSError:
        return None
    try:
        if blob[:8] != FORMAT:
            return None
        (mlen,) = struct.unpack_from("<I", blob, 8)
        meta = json.loads(blob[12:12 + mlen])
        cubin = blob[12 + mlen:]
        if len(cubin) != meta["size"] or hashlib.sha256(cubin).hexdigest() != meta["sha256"]:
            return None
        return cubin, meta["lowered"]
    except (ValueError, KeyError, struct.error):
        return None


def write_entry(path, cubin, lowered):
    meta = json.dumps({"size": len(cubin), "sha256": hashlib.sha256(cubin).hexdigest(),
                       "lowered": lowered}).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(FORMAT + struct.pack("<I", len(meta)) + meta + cubin)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def prune(keep_paths):
    """Delete cache entries not in `keep_paths` (stale keys from older sources or NVRTC versions)."""
    folder = cache_dir() / "cubin"
    keep = {str(p) for p in keep_paths}
    removed = 0
    if folder.is_dir():
        for p in folder.glob("*.cubin"):
            if str(p) not in keep:
                p.unlink(missing_ok=True)
                removed += 1
    return removed


def describe():
    """What the cache holds: {arch: count of entries}, and the total size in bytes."""
    folder = cache_dir() / "cubin"
    counts, total = {}, 0
    if folder.is_dir():
        for p in folder.glob("*.cubin"):
            arch = p.name.split(".")[-3]
            counts[arch] = counts.get(arch, 0) + 1
            total += p.stat().st_size
    return counts, total
