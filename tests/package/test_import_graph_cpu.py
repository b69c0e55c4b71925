"""The package's modules import in one direction only: no module of pydnn imports (at module level or
inside a function) one that imports it back, directly or through others. Read from the sources (ast), so
an import hidden in a function body counts as much as one at the top."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "pydnn"


def _modules():
    mods = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _package(name, path):
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def import_graph():
    mods = _modules()
    graph = {}
    for name, path in mods.items():
        pkg = _package(name, path)
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name in mods)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".")
                    base = base[:len(base) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in mods]
                if subs:
                    edges.update(subs)
                elif target in mods:
                    edges.add(target)
        # importing a submodule runs its parents' __init__ first: that is Python's doing, not an import of
        # the parent by this module, so an edge to an enclosing package does not count
        graph[name] = {e for e in edges if e != name and not name.startswith(e + ".")}
    return graph


def cycles(graph):
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_checker_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    graph = import_graph()
    assert "pydnn.ops.convolution.plans" in graph and graph["pydnn.ops.convolution.api"]
    assert cycles(graph) == []


def test_convolution_layers():
    """problem imports no sibling; plans only problem; each algorithm module only those two."""
    graph = import_graph()
    pkg = "pydnn.ops.convolution"

    def siblings(m):
        return {e.rpartition(".")[2] for e in graph[f"{pkg}.{m}"] if e.startswith(pkg + ".")}

    assert siblings("problem") == set()
    assert siblings("plans") == {"problem"}
    for algo in ("implicit", "tensor_core", "wgrad_wgmma", "gemm", "winograd", "fft"):
        assert siblings(algo) <= {"problem", "plans"}, (algo, siblings(algo))
