"""The package's shape: no import cycle between mmgpg modules, no folder importing a folder above it, and no module
over ~500 lines without a reason.

Imports are read from the source (every ``import``, also those inside functions, which are a design dependency all
the same); imports under ``if TYPE_CHECKING:`` are annotations only: they do not count for the layers, but a circle
between folders is refused with them too (a type that names a folder above is still a dependency on it).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "mmgpg"
MAX_LINES = 500
# module -> why it is allowed to be longer (empty: none is).
LONG_MODULES: dict[str, str] = {}

# The dependency order, bottom first: a unit (a folder of mmgpg/, or a top-level module) may import only units of its
# own layer or below. Each folder's __init__.py says the same in words.
LAYERS: list[set[str]] = [
    {"mmgpg", "registry", "typed", "jsonl", "utils", "distributed", "algorithms", "correction", "runlock"},  # foundations
    {"models", "task", "tools"},  # the policy seam, the task contract and the tools tasks offer
    {"rollout", "backends"},  # generation and the training backend (they read models/ and task/)
    {"config"},  # the schema and its checks read every registry below
    {"rundir"},  # the run directory: reads config.yaml back as a Config
    {"evaluation"},
    {"theory"},
    {"train"},
    {"cli"},
    {"__main__"},
]


def _module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, package: str, modules: set[str], type_only_too: bool = False) -> set[str]:
    tree = ast.parse(path.read_text())
    type_only = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test) and not type_only_too:
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


def import_graph(root: Path = PACKAGE, type_only_too: bool = False) -> dict[str, set[str]]:
    paths = {_module_name(p, root): p for p in root.rglob("*.py")}
    graph = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        graph[name] = _imports(path, package, set(paths), type_only_too) - {name}
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


def unit_of(module: str) -> str:
    """``mmgpg.train.trainer`` -> ``train``; ``mmgpg.algorithms`` -> ``algorithms``; ``mmgpg`` -> ``mmgpg``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def layer_violations(graph: dict[str, set[str]], layers: list[set[str]]) -> list[str]:
    """Every import of a unit from a higher layer, and every unit no layer names."""
    rank = {unit: i for i, units in enumerate(layers) for unit in units}
    out = []
    for module, targets in sorted(graph.items()):
        a = unit_of(module)
        if a not in rank:
            out.append(f"{module}: its unit {a!r} is in no layer of LAYERS")
            continue
        for target in sorted(targets):
            b = unit_of(target)
            if b in rank and rank[b] > rank[a]:
                out.append(f"{module} imports {target} ({a} is below {b})")
    return out


def folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for module, targets in graph.items():
        out.setdefault(unit_of(module), set()).update(unit_of(t) for t in targets if unit_of(t) != unit_of(module))
    return out


def test_layer_check_sees_an_upward_import():
    graph = {"mmgpg.models.a": {"mmgpg.train.b"}, "mmgpg.train.b": {"mmgpg.models.a"}, "mmgpg.x": set()}
    found = layer_violations(graph, [{"models"}, {"train"}])
    assert found == ["mmgpg.models.a imports mmgpg.train.b (models is below train)", "mmgpg.x: its unit 'x' is in no "
                     "layer of LAYERS"]


def test_no_folder_imports_a_folder_above_it():
    assert layer_violations(import_graph(), LAYERS) == []


def test_no_import_cycle_between_folders():
    assert find_cycle(folder_graph(import_graph())) is None


def test_no_import_cycle_between_folders_counting_annotations():
    """A type named under ``if TYPE_CHECKING:`` from a folder above is a dependency too: no circle with those either."""
    assert find_cycle(folder_graph(import_graph(type_only_too=True))) is None


def test_a_type_only_circle_is_seen(tmp_path):
    pkg = tmp_path / "mmgpg"
    for folder in ("low", "high"):
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "low" / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from mmgpg.high import b\n")
    (pkg / "high" / "b.py").write_text("from mmgpg.low import a\n")
    assert find_cycle(folder_graph(import_graph(pkg))) is None
    assert find_cycle(folder_graph(import_graph(pkg, type_only_too=True))) == ["high", "low", "high"]


def test_help_and_config_show_import_no_torch():
    """`mmgpg --help` and `mmgpg config show` import no torch (2.2 s of the start-up otherwise): the CLI registers
    its parsers without importing library modules, and config validation reads the registries' names only."""
    import subprocess
    import sys

    code = ("import sys, contextlib, io\n"
            "from mmgpg.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try:\n"
            "        main(['--help'])\n"
            "    except SystemExit:\n"
            "        pass\n"
            "    assert main(['config', 'show', 'algo=grpo', 'task=shapes', 'model=tiny']) == 0\n"
            "heavy = sorted(m for m in ('torch', 'transformers', 'peft', 'deepspeed') if m in sys.modules)\n"
            "print(','.join(heavy) or 'none')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip().splitlines()[-1] == "none", out.stdout + out.stderr
