"""Typed dicts with one error type: dataclass <-> nested dict with type checks, and :class:`Problem` /
:class:`ConfigError`, the error every user-facing check reports (what, what was given, why, the fix).

The configuration (:mod:`mmgpg.config`), task options (:mod:`mmgpg.task`) and saved runs use these helpers; this
module imports nothing from mmgpg, so any module may import it.

A dataclass may declare one *open* field (``_open_field: ClassVar[str] = "options"``): keys it does not know are
collected into that dict field instead of being reported as unknown (the task section's plugin options).
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import math
import re
import textwrap
import types
import typing
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal


def open_field(cls: type) -> str | None:
    """The name of ``cls``'s open field (see the module docstring), or None."""
    return getattr(cls, "_open_field", None)


# --------------------------------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class Problem:
    """One configuration problem: which key, what was given, why it is wrong, how to fix it."""

    key: str
    got: Any
    why: str
    fix: str

    def __str__(self) -> str:
        got = "nothing" if self.got is _MISSING else f"{self.got!r}"
        return f"{self.key}: got {got}. {self.why} Fix: {self.fix}"


class ConfigError(ValueError):
    """All problems found in one configuration, raised together."""

    def __init__(self, problems: Sequence[Problem]):
        self.problems = list(problems)
        lines = [f"{len(self.problems)} problem(s) in the configuration:"]
        lines += [f"  - {p}" for p in self.problems]
        super().__init__("\n".join(lines))


_MISSING = object()


def check_choice(name: str, value: Any, choices: Collection[str]) -> None:
    """Refuse ``value`` unless it is one of ``choices`` (a task's or a builder's named option), in one message.

    >>> check_choice("kind", "count", ("count", "colour"))
    >>> check_choice("kind", "size", ("count", "colour"))
    Traceback (most recent call last):
    ValueError: kind must be one of count, colour; got 'size'
    """
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")


def did_you_mean(word: str, candidates: Sequence[str]) -> str:
    """`` Did you mean 'x'?`` for the closest candidate, or ``''``."""
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f" Did you mean {close[0]!r}?" if close else ""


# --------------------------------------------------------------------------------------------------------------------
# Field documentation (the docstring under each field)
# --------------------------------------------------------------------------------------------------------------------


@cache
def field_docs(cls: type) -> dict[str, str]:
    """``{field: docstring}`` from the string literal written under each field of a dataclass."""
    source = textwrap.dedent(inspect.getsource(cls))
    body = ast.parse(source).body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for stmt, nxt in zip(body, body[1:]):
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
                docs[stmt.target.id] = " ".join(nxt.value.value.split())
    return docs


def bounded(default: Any, *, ge: float | None = None, gt: float | None = None, le: float | None = None,
            why: str = "") -> Any:
    """A dataclass field with ``default`` and a range, checked by :func:`range_problems`: ``>= ge``, ``> gt``,
    ``<= le``; ``why`` replaces the generic reason in the message."""
    return dataclasses.field(default=default, metadata={"range": (ge, gt, le), "why": why})


def range_problems(obj: Any, prefix: str = "") -> list[Problem]:
    """Every value of the dataclass ``obj`` (and of its dataclass sections) outside the range its field declares
    (:func:`bounded`): one loop over the fields, one message shape (the key, the value, the rule, the default).

    >>> @dataclass
    ... class S:
    ...     n: int = bounded(1, ge=1)
    >>> [p.why for p in range_problems(S(n=0), "s.")]
    ['It must be >= 1.']
    """
    out: list[Problem] = []
    for f in dataclasses.fields(obj):
        value, key = getattr(obj, f.name), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            out += range_problems(value, key + ".")
            continue
        if "range" not in f.metadata or not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        ge, gt, le = f.metadata["range"]
        rules = [(ge is None or value >= ge, f">= {ge}"), (gt is None or value > gt, f"> {gt}"),
                 (le is None or value <= le, f"<= {le}")]
        rule = " and ".join(text for ok, text in rules if text.split()[-1] != "None")
        if not all(ok for ok, _ in rules):
            out.append(Problem(key, value, f.metadata["why"] or f"It must be {rule}.",
                               f"set {key}={f.default} (the default), or another value {rule}."))
    return out


# --------------------------------------------------------------------------------------------------------------------
# dict <-> dataclass with type checks
# --------------------------------------------------------------------------------------------------------------------


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any) -> tuple[bool, Any]:
    """Return ``(ok, value)``: ``value`` converted to ``tp`` where that is lossless (``"1e-6"`` → float)."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return True, value
    if origin is Literal:
        return (value in typing.get_args(tp)), value
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            ok, v = _coerce(value, arg)
            if ok:
                return True, v
        return False, value
    if tp is type(None):
        return value is None, value
    if tp is bool:
        if isinstance(value, bool):
            return True, value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return True, value.lower() == "true"
        return False, value
    if tp is int:
        if isinstance(value, bool):
            return False, value
        if isinstance(value, int):
            return True, value
        if isinstance(value, float) and value.is_integer():
            return True, int(value)
        if isinstance(value, str) and re.fullmatch(r"[+-]?\d+", value.strip()):
            return True, int(value)
        return False, value
    if tp is float:
        if isinstance(value, bool):
            return False, value
        if isinstance(value, (int, float)):
            return True, float(value)
        if isinstance(value, str):
            try:
                return True, float(value)
            except ValueError:
                return False, value
        return False, value
    if tp is str:
        return isinstance(value, str), value
    if origin in (list, tuple, Sequence):
        if not isinstance(value, (list, tuple)):
            return False, value
        (arg, *_) = typing.get_args(tp) or (Any,)
        out = []
        for item in value:
            ok, v = _coerce(item, arg)
            if not ok:
                return False, value
            out.append(v)
        return True, list(out)
    if origin is dict:
        return isinstance(value, dict), value
    return isinstance(value, tp), value


def _finite(value: Any) -> bool:
    """False for a float NaN/Inf, also inside lists and dicts (config numbers must be finite)."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, (list, tuple)):
        return all(_finite(v) for v in value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    return True


def from_dict(cls: type, data: Any, problems: list[Problem], prefix: str = "") -> Any:
    """Build dataclass ``cls`` from nested dicts, appending a :class:`Problem` for every mismatch."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    open_key = open_field(cls)
    if not isinstance(data, dict):
        problems.append(Problem(prefix.rstrip(".") or "<root>", data, "Expected a mapping of fields.",
                                f"give {prefix.rstrip('.') or 'the config'} as `key: value` lines."))
        return cls()
    kwargs: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in data.items():
        key = str(key)
        if key not in fields or key == open_key:
            if open_key:
                if key == open_key and isinstance(value, dict):
                    extra.update(value)
                else:
                    extra[key] = value
                continue
            problems.append(Problem(prefix + key, value, f"{cls.__name__} has no field {key!r}.",
                                    "remove it or use one of: " + ", ".join(fields) + "." + did_you_mean(key, list(fields))))
            continue
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            kwargs[key] = from_dict(tp, value, problems, prefix + key + ".")
            continue
        ok, coerced = _coerce(value, tp)
        if not ok:
            doc = field_docs(cls).get(key, "")
            problems.append(Problem(prefix + key, value, f"Expected {_type_name(tp)}." + (f" ({doc})" if doc else ""),
                                    f"set {prefix + key}=<{_type_name(tp)}>."))
            continue
        if not _finite(coerced):
            problems.append(Problem(prefix + key, value, "NaN and infinity are not allowed: every number in the "
                                    "config must be finite.", f"set {prefix + key} to a finite number."))
            continue
        kwargs[key] = coerced
    if open_key:
        kwargs[open_key] = {**kwargs.get(open_key, {}), **extra} if extra else kwargs.get(open_key, {})
    return cls(**kwargs)


def to_dict(obj: Any) -> Any:
    """Nested plain dict of a config dataclass (task options flattened back under ``task:``)."""
    if dataclasses.is_dataclass(obj):
        out: dict[str, Any] = {}
        open_key = open_field(type(obj))
        for f in dataclasses.fields(obj):
            value = to_dict(getattr(obj, f.name))
            if f.name == open_key:
                out.update(value)
            else:
                out[f.name] = value
        return out
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


class CheckpointError(ValueError):
    """A checkpoint that cannot be written or used; the message names it and says what to do."""


# --------------------------------------------------------------------------------------------------------------------
# YAML: the one loader for config and run files
# --------------------------------------------------------------------------------------------------------------------

YAML_MAX_BYTES = 1 << 20
"""The largest YAML text read (1 MiB; a resolved config is a few kB)."""
YAML_MAX_NODES = 100_000
"""The most values a YAML document may expand to, every alias counted at its full size (a config has a few
hundred): an alias bomb — nine aliases of nine aliases of ... — is refused before it is built."""
YAML_MAX_DEPTH = 64
"""The deepest nesting of lists and mappings (a config has four levels)."""

SEED_MAX = 2**32 - 1
"""The largest seed (``seed``, ``--seed``): NumPy's and vLLM's generators take 32-bit seeds, and mmgpg derives its
torch seeds from the seed by adding step counts and multiplying by 1,000,003 within torch's 64 bits."""


class YamlProblem(Problem):
    """A :class:`Problem` of a YAML text: ``key`` is ``FILE:LINE`` and there is no value to show."""

    def __str__(self) -> str:
        return f"{self.key}: {self.why} Fix: {self.fix}"


class YamlError(ConfigError):
    """A YAML text mmgpg refuses: invalid syntax (``syntax``) or over a limit (aliases, size, nesting, a key given
    twice). One :class:`Problem` whose key is ``FILE:LINE``."""

    def __init__(self, source: str, line: int | None, why: str, fix: str, syntax: bool = False):
        self.syntax = syntax
        super().__init__([YamlProblem(f"{source}:{line}" if line else source, _MISSING, why, fix)])


def read_yaml(text: str, source: str) -> Any:
    """Parse YAML ``text`` (read from ``source``, named in errors) as ``yaml.safe_load`` does — plain data only —
    but refuse what safe_load lets through: more than :data:`YAML_MAX_BYTES`, aliases that expand to more than
    :data:`YAML_MAX_NODES` values or refer to themselves, nesting deeper than :data:`YAML_MAX_DEPTH`, and a key
    given twice in one mapping (safe_load keeps the last one silently; a merge key ``<<`` may still be overridden).
    Every refusal is a :class:`YamlError` naming the file and line."""
    import yaml

    size = len(text.encode("utf-8", "surrogatepass"))
    if size > YAML_MAX_BYTES:
        raise YamlError(source, None, f"The YAML is larger than {YAML_MAX_BYTES >> 20} MiB ({size} bytes); a config "
                        "is a few kB.", "give a config file, not a data file.")
    loader = _limited_loader()(text)
    loader.source = source
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node, source, {})
        return loader.construct_document(node)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        raise YamlError(source, mark.line + 1 if mark else None, f"Not valid YAML ({err.problem or err}).",
                        "fix the YAML syntax.", syntax=True) from None
    except yaml.YAMLError as err:
        raise YamlError(source, None, f"Not valid YAML ({err}).", "fix the YAML syntax.", syntax=True) from None
    finally:
        loader.dispose()


def read_yaml_file(path: Any) -> Any:
    """:func:`read_yaml` of a file (its size is checked before it is read); OSError when it cannot be read."""
    from pathlib import Path

    path = Path(path)
    size = path.stat().st_size
    if size > YAML_MAX_BYTES:
        raise YamlError(str(path), None, f"The YAML is larger than {YAML_MAX_BYTES >> 20} MiB ({size} bytes); a "
                        "config is a few kB.", "give a config file, not a data file.")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise YamlError(str(path), None, f"The file is not UTF-8 text (byte {err.object[err.start]:#04x} at offset "
                        f"{err.start} cannot be decoded).", "save it as UTF-8 (a config is plain text).") from None
    return read_yaml(text, str(path))


def _expanded_size(node: Any, source: str, sizes: dict[int, int | None]) -> int:
    """How many values ``node`` stands for with every alias expanded (shared nodes are counted at each use but
    visited once); a :class:`YamlError` past :data:`YAML_MAX_NODES` or for a node that contains itself."""
    import yaml

    key = id(node)
    if key in sizes:
        if sizes[key] is None:
            raise YamlError(source, node.start_mark.line + 1, "An alias refers to itself (a recursive structure).",
                            "write the value out instead of aliasing the collection it sits in.")
        return sizes[key]  # type: ignore[return-value]
    sizes[key] = None
    if isinstance(node, yaml.SequenceNode):
        children = node.value
    elif isinstance(node, yaml.MappingNode):
        children = [n for pair in node.value for n in pair]
    else:
        children = []
    total = 1 + sum(_expanded_size(child, source, sizes) for child in children)
    if total > YAML_MAX_NODES:
        raise YamlError(source, node.start_mark.line + 1, f"Its aliases expand it to more than {YAML_MAX_NODES} "
                        "values (an alias bomb, or far more than a config holds).",
                        "write the values out, or remove the aliases (&name / *name).")
    sizes[key] = total
    return total


@cache
def _limited_loader() -> type:
    """``yaml.SafeLoader`` with a nesting limit while composing and a duplicate-key check while constructing."""
    import yaml

    class Loader(yaml.SafeLoader):
        source = "<yaml>"
        _depth = 0

        def compose_node(self, parent, index):
            self._depth += 1
            try:
                if self._depth > YAML_MAX_DEPTH:
                    mark = self.peek_event().start_mark
                    raise YamlError(self.source, mark.line + 1, f"The YAML is nested deeper than {YAML_MAX_DEPTH} "
                                    "levels.", "flatten it; a config has a few levels of `key: value`.")
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1

        def construct_mapping(self, node, deep=False):
            if isinstance(node, yaml.MappingNode):
                seen: dict[Any, int] = {}
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":
                        continue
                    key = self.construct_object(key_node, deep=True)
                    line = key_node.start_mark.line + 1
                    try:
                        first = seen.get(key)
                    except TypeError:  # an unhashable key: safe_load's own error follows
                        continue
                    if first is not None:
                        raise YamlError(self.source, line, f"The key {key!r} is given twice in one mapping (first "
                                        f"at line {first}); YAML would keep the last one silently.",
                                        "keep one of them.")
                    seen[key] = line
            return super().construct_mapping(node, deep=deep)

    return Loader
