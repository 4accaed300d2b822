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
from collections.abc import Sequence
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
