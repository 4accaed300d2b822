"""The GPG authors' own math reward functions, loaded at test time from a mirror of their repository (never copied
into mmgpg): the named top-level functions of ``open-rs/src/open_r1/rewards.py`` or ``open-r1/src/open_r1/rewards.py``
are executed, with the file's own imports of ``math``, ``re``, ``math_verify`` and ``latex2sympy2_extended``, in a
fresh namespace. Only those functions are taken: the rest of each file (code sandboxes, their ``.utils`` package)
needs services the math rewards never use.

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
MODULES = {"math", "re", "typing", "math_verify", "latex2sympy2_extended"}


def mirror() -> Path | None:
    path = Path(os.environ.get("MMGPG_GPG_MIRROR", DEFAULT_MIRROR))
    return path if path.exists() else None


def source(path: str) -> str | None:
    repo = mirror()
    if repo is None:
        return None
    git_dir = repo / ".git" if (repo / ".git").exists() else repo
    out = subprocess.run(["git", f"--git-dir={git_dir}", "show", f"HEAD:{path}"], capture_output=True, text=True,
                         timeout=60)
    return out.stdout if out.returncode == 0 else None


def load(path: str, names: tuple[str, ...]) -> dict[str, Any] | None:
    """``{name: function}`` for the top-level functions ``names`` of the authors' file ``path``."""
    text = source(path)
    if text is None:
        return None
    tree = ast.parse(text)
    def wanted(node: ast.stmt) -> bool:
        if isinstance(node, ast.FunctionDef):
            return node.name in names
        if isinstance(node, ast.Import):
            return all(a.name.split(".")[0] in MODULES for a in node.names)
        if isinstance(node, ast.ImportFrom):
            return node.level == 0 and (node.module or "").split(".")[0] in MODULES
        return False

    keep = [node for node in tree.body if wanted(node)]
    found = {n.name for n in keep if isinstance(n, ast.FunctionDef)}
    missing = set(names) - found
    if missing:
        raise LookupError(f"{path} at the mirror's HEAD has no function {', '.join(sorted(missing))}")
    namespace: dict[str, Any] = {"__name__": "gpg_authors_rewards"}
    exec(compile(ast.Module(body=keep, type_ignores=[]), f"GPG:{path}", "exec"), namespace)  # noqa: S102
    return {name: namespace[name] for name in names}
