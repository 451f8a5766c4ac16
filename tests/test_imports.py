"""Imports in src/ go one way: no module imports, directly or through others, a module that imports it.

Every ``import`` and ``from ... import`` counts, at module level or inside a function (a lazy import
is still a dependency). ``from anyspec.pkg import name`` points at ``anyspec.pkg.name`` when that is a
module, else at ``anyspec.pkg``. A package's ``__init__`` is not counted as imported by its own
submodules: Python runs it first, but nothing in it is read.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph(root: Path, package: str = "anyspec") -> dict[str, set[str]]:
    files = {module_name(p, root): p for p in (root / package).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        is_package = path.name == "__init__.py"
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".") if is_package else name.split(".")[:-1]
                    base = base[: len(base) - node.level + 1]
                    origin = ".".join(base + ([node.module] if node.module else []))
                else:
                    origin = node.module
                for alias in node.names:
                    sub = f"{origin}.{alias.name}"
                    targets.add(sub if sub in files else origin)
        graph[name] = {t for t in targets if t in files and t != name and not name.startswith(t + ".")}
    return graph


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_checker_finds_a_circle(tmp_path):
    pkg = tmp_path / "anyspec"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from anyspec.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from .c import g\n")
    (pkg / "sub" / "c.py").write_text("import anyspec.a\n")
    (pkg / "d.py").write_text("from anyspec import a\n")
    graph = import_graph(tmp_path)
    assert graph["anyspec.sub.b"] == {"anyspec.sub.c"} and graph["anyspec.d"] == {"anyspec.a"}
    assert circles(graph) == [{"anyspec.a", "anyspec.sub.b", "anyspec.sub.c"}]


def test_src_has_no_import_circles():
    assert circles(import_graph(SRC)) == []


def test_the_bench_sits_on_top_and_its_runner_imports_nothing_of_anyspec():
    """Only the command line imports the bench package; the vLLM runner, run by path in another
    python where anyspec need not be installed, imports no anyspec module."""
    graph = import_graph(SRC)
    bench = {m for m in graph if m == "anyspec.bench" or m.startswith("anyspec.bench.")}
    assert {"anyspec.bench.run", "anyspec.bench.llama", "anyspec.bench.isolated.vllm_runner"} <= bench
    importers = {m for m, targets in graph.items() if targets & bench and m not in bench}
    assert importers == {"anyspec.cli.bench"}
    assert graph["anyspec.bench.isolated.vllm_runner"] == set()
    assert not list((SRC / "anyspec").glob("bench*.py")) and not list((SRC / "anyspec").glob("isolated/*.py"))


def test_the_cache_folder_is_a_bottom_layer():
    """``paths`` needs only ``errors``, so the vocabulary, the kernels and the fetching can all use it."""
    graph = import_graph(SRC)
    assert graph["anyspec.paths"] == {"anyspec.errors"} and graph["anyspec.errors"] == set()
    users = {m for m, targets in graph.items() if "anyspec.paths" in targets}
    assert {"anyspec.fetch", "anyspec.models", "anyspec.vocab.cache", "anyspec.vocab.loading"} <= users


def test_the_vocabulary_sits_below_the_models():
    """``vocab`` reads tokenizers and the cache folder only: finding a built-in model's tokenizer is
    the command line's (``cli/analyze.py``)."""
    graph = import_graph(SRC)
    used = set().union(*(targets for m, targets in graph.items() if m.startswith("anyspec.vocab")))
    assert {m for m in used if not m.startswith("anyspec.vocab")} <= {"anyspec.errors", "anyspec.paths"}
