"""The one JSON Lines reader and the one atomic JSON Lines rewrite of mmgpg (trainer logs, plots, eval files, data).

Every error names the file and the line. A last line that does not parse and has no newline is what a kill or a full
disk leaves behind during an append (a *torn* line); :func:`read_jsonl` drops it with a warning when asked to
(``torn_tail="drop"``, for mmgpg's own logs), because everything before it is intact. Any other bad line is an error,
or, with ``on_error="skip"``, a counted skip returned with its line number and reason.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class JsonlError(ValueError):
    """A JSON Lines file that cannot be read; the message names the file and line."""


@dataclass
class JsonlRows:
    """The rows read, each with its 1-based line number, and the lines skipped with their reasons."""

    rows: list[Any] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)
    skipped: list[tuple[int, str]] = field(default_factory=list)
    torn_tail: bool = False


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON (write null or a finite number)")


def parse_line(text: str) -> Any:
    """One strict JSON value: ``NaN``/``Infinity`` (which Python's json accepts by default) are refused."""
    return json.loads(text, parse_constant=_reject_constant)


def read_jsonl(path: str | Path, *, torn_tail: str = "error", on_error: str = "error", strict: bool = False,
               warn=None) -> JsonlRows:
    """Read ``path`` line by line (blank lines ignored).

    ``torn_tail="drop"``: an unparseable last line without a trailing newline is dropped with a warning (a write cut
    short). ``on_error="skip"``: any other unparseable line (bad JSON, bad UTF-8) is skipped and listed instead of
    raising :class:`JsonlError`. ``strict``: ``NaN``/``Infinity`` are errors too (input files; mmgpg's own logs
    may hold a non-finite metric).
    """
    path = Path(path)
    warn = warn or _warn
    try:
        data = path.read_bytes()
    except IsADirectoryError:
        raise JsonlError(f"{path} is a directory, not a JSON Lines file") from None
    except FileNotFoundError:
        raise JsonlError(f"{path} does not exist") from None
    out = JsonlRows()
    lines = data.split(b"\n")
    last = len(lines) - (1 if data.endswith(b"\n") else 0)  # 1-based number of the last line
    for number, raw in enumerate(lines[:last], 1):
        if not raw.strip():
            continue
        try:
            text = raw.decode("utf-8")
            value = parse_line(text) if strict else json.loads(text)
        except UnicodeDecodeError as err:
            reason = f"not UTF-8 text (byte {err.start + 1})"
        except (json.JSONDecodeError, ValueError) as err:
            reason = f"not valid JSON ({getattr(err, 'msg', str(err))}, column {getattr(err, 'colno', '?')})"
        else:
            out.rows.append(value)
            out.lines.append(number)
            continue
        if number == last and not data.endswith(b"\n") and torn_tail == "drop":
            warn(f"{path}:{number}: dropped an incomplete last line (a write cut short by a kill or a full disk)")
            out.torn_tail = True
        elif on_error == "skip":
            out.skipped.append((number, reason))
        else:
            raise JsonlError(f"{path}:{number}: {reason}")
    return out


def write_jsonl_atomic(path: str | Path, rows: list[Any] | list[str]) -> None:
    """Replace ``path`` with ``rows`` (dicts, or already-serialised lines) so that a kill at any moment leaves either
    the old file or the new one: write a temporary file beside it, fsync, rename over it."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for row in rows:
                f.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def finite_json(value: Any) -> Any:
    """``value`` with every non-finite float replaced by ``None`` (strict JSON has no NaN or Infinity)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)
