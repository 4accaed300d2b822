"""The GPG authors' own reward functions, loaded at test time from a mirror of their repository (never copied into
mmgpg): the named top-level functions of one of their files are executed in a fresh namespace, together with the
top-level helper functions and constants they use (found by name, transitively) and the file's imports of the
modules in :data:`MODULES`. Nothing else of the file runs: the trainers, datasets, models and code sandboxes it
imports (torch, transformers, trl, PIL, cv2, their ``open_r1`` package) are never imported, and the reward
functions do not use them.

Files in use: ``open-rs/src/open_r1/rewards.py``, ``open-r1/src/open_r1/rewards.py`` (math) and the four VL training
scripts ``R1-V/src/r1-v/src/open_r1/grpo.py`` (GEOQA), ``VisualThinker-R1-Zero/src/open-r1-multimodal/src/open_r1/grpo.py``
(CV-Bench / SAT), ``Visual-RFT/src/virft/src/open_r1/grpo_classification.py`` and ``grpo_lisa.py``; from Video-R1's
repository (``repo=video_r1_mirror()``), ``src/r1-v/src/open_r1/grpo.py`` (training rewards) and
``src/eval_bench.py`` (the benchmarks' scoring).

``MMGPG_GPG_MIRROR`` is a git clone of github.com/AMAP-ML/GPG (bare or not; default ``.gpg-mirror`` in the
repository, ignored by git: ``git clone --bare https://github.com/AMAP-ML/GPG .gpg-mirror``); :func:`load` returns
None when it is not there."""

from __future__ import annotations

import ast
import os
import subprocess
from pathlib import Path
from typing import Any

DEFAULT_MIRROR = Path(__file__).resolve().parents[2] / ".gpg-mirror"
MODULES = {"math", "re", "os", "typing", "datetime", "math_verify", "latex2sympy2_extended"}
"""The modules the reward functions use; an import of anything else in the authors' file is not executed."""


def mirror() -> Path | None:
    path = Path(os.environ.get("MMGPG_GPG_MIRROR", DEFAULT_MIRROR)).expanduser()
    return path if path.exists() else None


def video_r1_mirror() -> Path | None:
    """A clone of github.com/tulerfeng/Video-R1 (bare or not): ``MMGPG_VIDEO_R1_MIRROR``, default ``.video-r1-mirror``
    in the repository (ignored by git)."""
    path = Path(os.environ.get("MMGPG_VIDEO_R1_MIRROR", DEFAULT_MIRROR.parent / ".video-r1-mirror")).expanduser()
    return path if path.exists() else None


def source(path: str, repo: Path | None = None) -> str | None:
    repo = repo or mirror()
    if repo is None:
        return None
    git_dir = repo / ".git" if (repo / ".git").exists() else repo
    out = subprocess.run(["git", f"--git-dir={git_dir}", "show", f"HEAD:{path}"], capture_output=True, text=True,
                         timeout=60)
    return out.stdout if out.returncode == 0 else None


def _defined(node: ast.stmt) -> list[str]:
    """The top-level names a function definition or a plain assignment binds."""
    if isinstance(node, ast.FunctionDef):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
        return [node.target.id]
    return []


def _allowed_import(node: ast.stmt, allowed: frozenset[str] | set[str]) -> bool:
    if isinstance(node, ast.Import):
        return all(a.name.split(".")[0] in allowed for a in node.names)
    if isinstance(node, ast.ImportFrom):
        return node.level == 0 and (node.module or "").split(".")[0] in allowed
    return False


def load(path: str, names: tuple[str, ...], *, repo: Path | None = None, modules: frozenset[str] = frozenset(),
         in_loops: bool = False) -> dict[str, Any] | None:
    """``{name: function}`` for the top-level functions ``names`` of the authors' file ``path`` (with the top-level
    functions and constants they reach by name); None without a mirror. ``repo``: another project's mirror than the
    GPG authors' (e.g. Video-R1's, :func:`video_r1_mirror`); ``modules``: imports allowed besides :data:`MODULES`;
    ``in_loops``: also take the functions defined directly inside a top-level ``for`` loop (Video-R1's evaluation
    script defines its scoring functions inside its loop over benchmarks), as if defined at the top."""
    text = source(path, repo)
    if text is None:
        return None
    tree = ast.parse(text)
    allowed = MODULES | modules
    nodes = list(tree.body)
    if in_loops:
        nodes += [n for top in tree.body if isinstance(top, ast.For) for n in top.body if isinstance(n, ast.FunctionDef)]
    definitions: dict[str, ast.stmt] = {}
    for node in nodes:
        for name in _defined(node):
            definitions[name] = node  # the last binding wins, as when the file runs
    missing = [n for n in names if not isinstance(definitions.get(n), ast.FunctionDef)]
    if missing:
        raise LookupError(f"{path} at the mirror's HEAD has no function {', '.join(sorted(missing))}")
    keep: set[int] = set()
    todo = list(names)
    while todo:
        node = definitions[todo.pop()]
        if id(node) in keep:
            continue
        keep.add(id(node))
        used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        todo += [n for n in used if n in definitions and id(definitions[n]) not in keep]
    body = [node for node in nodes if id(node) in keep or _allowed_import(node, allowed)]
    namespace: dict[str, Any] = {"__name__": "gpg_authors_rewards"}
    exec(compile(ast.Module(body=body, type_ignores=[]), f"GPG:{path}", "exec"), namespace)  # noqa: S102
    return {name: namespace[name] for name in names}
