"""Resolution of a configuration: YAML groups, ``key=value`` overrides, validation that reports every problem, and
``config.yaml`` written and read back.

Resolution order, later wins:

1. the dataclass defaults (:mod:`mmgpg.config.schema`);
2. ``configs/base.yaml``;
3. group selections ``GROUP=NAME`` (e.g. ``task=shapes``, ``model=tiny``), in command-line order: the file
   ``configs/GROUP/NAME.yaml`` (or ``GROUP=path/to/file.yaml``), a partial config of the same shape as the schema;
4. overrides ``a.b=c``, in command-line order (values are parsed as YAML: ``1e-6``, ``true``, ``[1, 2]``).

Problems are collected — unknown keys (with a did-you-mean), wrong types, out-of-range values, unknown groups — and
raised once as :class:`~mmgpg.typed.ConfigError`, each saying what, what was given, why it is wrong and how to fix it.
"""

from __future__ import annotations

import dataclasses
import textwrap
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mmgpg.config.checks import check
from mmgpg.config.schema import Config, TaskConfig
from mmgpg.jsonl import write_text_atomic
from mmgpg.task import TaskNotFound, checked_task, find_task_class
from mmgpg.typed import (
    ConfigError,
    Problem,
    YamlError,
    did_you_mean,
    field_docs,
    from_dict,
    open_field,
    read_yaml,
    read_yaml_file,
    to_dict,
)

# --------------------------------------------------------------------------------------------------------------------
# YAML groups and overrides
# --------------------------------------------------------------------------------------------------------------------


def builtin_config_dir() -> Path:
    """The packaged ``configs/`` folder (``mmgpg.configs``; the repository's ``configs/`` in an editable install)."""
    from importlib.resources import files

    return Path(str(files("mmgpg.configs")))


def config_search_path(extra: Sequence[str | Path] = ()) -> list[Path]:
    """Folders searched for ``base.yaml`` and groups: the user's (``--config-dir``) first, then the built-in one."""
    return [Path(p) for p in extra] + [builtin_config_dir()]


def available_groups(search_path: Sequence[Path]) -> dict[str, list[str]]:
    """``{group: [names]}`` over the search path (a group is a sub-folder holding ``*.yaml`` files; a folder named
    ``x.yaml`` is not one)."""
    groups: dict[str, set[str]] = {}
    for root in search_path:
        if root.is_dir():
            for sub in sorted(p for p in root.iterdir() if p.is_dir()):
                names = {f.stem for f in sub.glob("*.yaml") if f.is_file()}
                if names:
                    groups.setdefault(sub.name, set()).update(names)
    return {g: sorted(n) for g, n in sorted(groups.items())}


def _read_yaml(path: Path, problems: list[Problem], key: str) -> dict:
    try:
        data = read_yaml_file(path) or {}
    except OSError as err:
        problems.append(Problem(key, str(path), f"Could not read it ({err}).", "check the path and its permissions."))
        return {}
    except YamlError as err:
        problems.extend(err.problems)
        return {}
    if not isinstance(data, dict):
        problems.append(Problem(key, str(path), "The file is not a mapping of config fields.",
                                "write it as nested `key: value` lines shaped like `mmgpg config show`."))
        return {}
    return data


def _merge(base: dict, update: dict) -> dict:
    out = dict(base)
    for k, v in update.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _set_dotted(tree: dict, dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = tree
    for p in parents:
        if not isinstance(node.get(p), dict):
            node[p] = {}
        node = node[p]
    node[leaf] = value


def apply_override(tree: dict, dotted: str, raw: str) -> None:
    """Set ``a.b.c=raw`` in a config tree, the value parsed as YAML (``1e-6``, ``true``, ``[1, 2]``)."""
    _set_dotted(tree, dotted, _parse_value(raw))


def _parse_value(text: str) -> Any:
    if text == "":
        return ""
    try:
        return read_yaml(text, "the command-line value")
    except YamlError as err:
        if err.syntax:  # not YAML: the text itself (a path, a name)
            return text
        raise


def _find_group_file(group: str, name: str, search_path: Sequence[Path]) -> Path | None:
    if name.endswith((".yaml", ".yml")) or "/" in name:
        p = Path(name).expanduser()
        return p if p.is_file() else None
    for root in search_path:
        p = root / group / f"{name}.yaml"
        if p.is_file():
            return p
    return None


@dataclass
class Resolved:
    """The outcome of :func:`resolve`: the config plus how it came about."""

    config: Config
    groups: dict[str, str]
    overrides: list[str]
    task: Any = field(default=None, compare=False, repr=False)
    """The task built while validating the config; None when it was not validated."""

    def build_task(self) -> Any:
        """The command's task: the one validation built (a task is built once per command), else built now."""
        from mmgpg.task import build_task

        return self.task if self.task is not None else build_task(self.config.task.name, self.config.task.options)


def resolve(args: Sequence[str] = (), config_dirs: Sequence[str | Path] = (), validate_config: bool = True) -> Resolved:
    """Resolve ``GROUP=NAME`` and ``a.b=c`` arguments into a validated :class:`Config` (see the module docstring)."""
    search_path = config_search_path(config_dirs)
    groups = available_groups(search_path)
    problems: list[Problem] = []
    tree: dict = to_dict(Config())
    for root in reversed(search_path):
        base = root / "base.yaml"
        if base.is_file():
            tree = _merge(tree, _read_yaml(base, problems, "base.yaml"))
    selected: dict[str, str] = {}
    overrides: list[str] = []
    top_fields = {f.name for f in dataclasses.fields(Config)}
    for arg in args:
        key, sep, raw = arg.partition("=")
        key = key.strip()
        if not sep or not key:
            problems.append(Problem(arg, arg, "Arguments must look like GROUP=NAME or a.b.c=value.",
                                    "write e.g. task=shapes or rollout.group_size=8."))
            continue
        is_file = raw.endswith((".yaml", ".yml"))
        if "." not in key and (key in groups or key not in top_fields or is_file):
            if key not in groups and not is_file:
                problems.append(Problem(key, raw, f"{key!r} is neither a config group nor a top-level field.",
                                        "use one of the groups " + ", ".join(groups) + " or the fields "
                                        + ", ".join(sorted(top_fields)) + "." + did_you_mean(key, [*groups, *top_fields])))
                continue
            path = _find_group_file(key, raw, search_path)
            if path is None and key == "task" and not is_file:
                # A task without a preset file: a registered plugin name or path/to/file.py:ClassName.
                _set_dotted(tree, "task.name", raw)
                selected[key] = raw
                continue
            if path is None:
                names = groups.get(key, [])
                folders = [str(root / key / f"{raw}.yaml") for root in search_path
                           if (root / key / f"{raw}.yaml").is_dir()]
                why = (f"{folders[0]} is a folder, not a config file." if folders else
                       f"No config file {key}/{raw}.yaml in {', '.join(map(str, search_path))}.")
                problems.append(Problem(key, raw, why, "choose one of: " + (", ".join(names) or "(none)") + "."
                                        + did_you_mean(raw, names)))
                continue
            tree = _merge(tree, _read_yaml(path, problems, f"{key}={raw}"))
            selected[key] = raw
        else:
            value = _parse_value(raw)
            if dataclasses.is_dataclass(_field_type(key)) and not isinstance(value, dict):
                problems.append(Problem(key, value, f"{key!r} is a section, not a value.",
                                        f"set one of its fields, e.g. {key}.<field>=..."))
                continue
            _set_dotted(tree, key, value)
            overrides.append(arg)
    config = from_dict(Config, tree, problems)
    task = None
    if validate_config and not problems:
        problems += check(config, task=False)
        task, task_problems = checked_task(config.task.name, config.task.options)
        problems += task_problems
    elif validate_config:
        problems += check(config)
    if problems:
        raise ConfigError(problems)
    return Resolved(config=config, groups=selected, overrides=overrides, task=task)


def _field_type(dotted: str) -> Any:
    cls: Any = Config
    for part in dotted.split("."):
        if not dataclasses.is_dataclass(cls):
            return None
        hints = typing.get_type_hints(cls)
        if part not in hints:
            return None
        cls = hints[part]
    return cls


# --------------------------------------------------------------------------------------------------------------------
# YAML output
# --------------------------------------------------------------------------------------------------------------------


def _scalar(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=10**9).strip().removesuffix("...").strip()


def to_yaml(cfg: Config, with_docs: bool = False) -> str:
    """The config as YAML; ``with_docs`` puts each field's docstring above it as a comment."""
    lines: list[str] = []

    def emit(obj: Any, indent: int) -> None:
        pad = "  " * indent
        open_key = open_field(type(obj))
        docs = field_docs(type(obj))
        option_docs = _task_option_docs(obj.name) if isinstance(obj, TaskConfig) and with_docs else {}
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if with_docs and f.name in docs and f.name != open_key:
                lines.extend(pad + "# " + line for line in textwrap.wrap(docs[f.name], 100))
            if dataclasses.is_dataclass(value):
                lines.append(f"{pad}{f.name}:")
                emit(value, indent + 1)
            elif f.name == open_key:
                for k, v in value.items():
                    if k in option_docs:
                        lines.extend(pad + "# " + line for line in textwrap.wrap(option_docs[k], 100))
                    lines.append(f"{pad}{k}: {_scalar(v)}")
            else:
                lines.append(f"{pad}{f.name}: {_scalar(value)}")

    emit(cfg, 0)
    return "\n".join(lines) + "\n"


def _task_option_docs(name: str) -> dict[str, str]:
    try:
        cls = find_task_class(name)
    except TaskNotFound:
        return {}
    return field_docs(cls) if dataclasses.is_dataclass(cls) else {}


def save_config(resolved: Resolved, run_dir: str | Path, command: str) -> Path:
    """Write the resolved config to ``run_dir/config.yaml`` with a header naming how it was made."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    header = [f"# mmgpg {command} — resolved configuration"]
    if resolved.groups:
        header.append("# groups: " + " ".join(f"{k}={v}" for k, v in resolved.groups.items()))
    if resolved.overrides:
        header.append("# overrides: " + " ".join(resolved.overrides))
    path = run_dir / "config.yaml"
    write_text_atomic(path, "\n".join(header) + "\n" + to_yaml(resolved.config))
    return path

