"""The package's shape: no import cycle between mmgpg modules, and no module over ~500 lines without a reason.

Imports are read from the source (every ``import``, also those inside functions, which are a design dependency all
the same); imports under ``if TYPE_CHECKING:`` are annotations only and are not counted.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "mmgpg"
MAX_LINES = 500
# module -> why it is allowed to be longer (empty: none is).
LONG_MODULES: dict[str, str] = {
    "mmgpg.config": "the schema: one dataclass per config section, each field documented once by the docstring under "
                    "it (`mmgpg config show --doc` prints them); resolution and checks already live elsewhere",
}


def _module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, package: str, modules: set[str]) -> set[str]:
    tree = ast.parse(path.read_text())
    type_only = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            type_only.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    found = set()
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target:
                found.add(target)
    return found


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    paths = {_module_name(p, root): p for p in root.rglob("*.py")}
    graph = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        graph[name] = _imports(path, package, set(paths)) - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as ``[a, b, ..., a]``, or None (depth-first search with colours)."""
    colour = dict.fromkeys(graph, 0)  # 0 new, 1 on the current path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        colour[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if colour[nxt] == 1:
                return path[path.index(nxt):] + [nxt]
            if colour[nxt] == 0 and (cycle := visit(nxt)):
                return cycle
        path.pop()
        colour[node] = 2
        return None

    for start in sorted(graph):
        if colour[start] == 0 and (cycle := visit(start)):
            return cycle
    return None


def test_find_cycle_sees_a_cycle_and_a_clean_graph():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_import_graph_reads_function_level_and_relative_imports(tmp_path):
    pkg = tmp_path / "mmgpg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from mmgpg import b\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from mmgpg import a\n")
    (pkg / "sub" / "__init__.py").write_text("from .c import x\n")
    (pkg / "sub" / "c.py").write_text("from ..a import f\n")
    graph = import_graph(pkg)
    assert graph["mmgpg.a"] == {"mmgpg", "mmgpg.b"}
    assert graph["mmgpg.b"] == set()  # annotation-only import
    assert graph["mmgpg.sub"] == {"mmgpg.sub.c"}
    assert graph["mmgpg.sub.c"] == {"mmgpg.a"}


def test_no_import_cycle_in_the_package():
    assert find_cycle(import_graph()) is None


def test_no_module_over_the_line_budget_without_a_reason():
    long = {}
    for path in PACKAGE.rglob("*.py"):
        name = _module_name(path)
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES and name not in LONG_MODULES:
            long[name] = lines
    assert not long, f"split these modules (or state why not in LONG_MODULES): {long}"
