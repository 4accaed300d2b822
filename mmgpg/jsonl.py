"""The one JSON Lines reader of mmgpg (trainer logs, plots, eval files, data) and the one atomic writer, through which
every file mmgpg replaces is written (:func:`atomic_writer`: the old file or the new one, never a truncated one).

Every error names the file and the line. A last line that does not parse and has no newline is what a kill or a full
disk leaves behind during an append (a *torn* line); :func:`read_jsonl` drops it with a warning when asked to
(``torn_tail="drop"``, for mmgpg's own logs), because everything before it is intact. Any other bad line is an error,
or, with ``on_error="skip"``, a counted skip returned with its line number and reason.
"""

from __future__ import annotations

import contextlib
import glob
import json
import math
import os
import socket
import sys
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any


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


@contextlib.contextmanager
def atomic_writer(path: str | Path, mode: str = "w") -> Iterator[IO]:
    """The one way mmgpg replaces a file: ``with atomic_writer(path) as f: f.write(...)`` writes a temporary file
    beside ``path``, fsyncs it and renames it over ``path`` only when the block ends without an error, so a kill, a
    full disk or an exception at any moment leaves the old file or the new one, never a truncated one. ``mode``:
    ``"w"`` (UTF-8 text) or ``"wb"``. The new file keeps the old one's permissions (or the umask's for a new file).
    A temporary file left by a writer that was killed (its process is gone) is removed."""
    path = Path(path)
    _remove_dead_temporaries(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{_OWNER}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, path.stat().st_mode & 0o7777 if path.exists() else 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    try:  # the rename itself survives a power loss once the directory is synced
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass


def write_text_atomic(path: str | Path, text: str) -> None:
    """Replace ``path`` with ``text`` (UTF-8) through :func:`atomic_writer`."""
    with atomic_writer(path) as f:
        f.write(text)


def write_jsonl_atomic(path: str | Path, rows: Iterable[Any]) -> None:
    """Replace ``path`` with ``rows`` (dicts, or already-serialised lines), one a line, through
    :func:`atomic_writer`."""
    with atomic_writer(path) as f:
        for row in rows:
            f.write((row if isinstance(row, str) else json.dumps(row)) + "\n")


_OWNER = f"{socket.gethostname()}-{os.getpid()}"  # in temporary names: which process may still be writing one


def _remove_dead_temporaries(path: Path) -> None:
    """Temporary files of ``path`` whose writer (on this host) no longer runs: a rewrite killed before its rename."""
    host = socket.gethostname()
    for stale in path.parent.glob(f".{glob.escape(path.name)}.{glob.escape(host)}-*.tmp"):
        pid = stale.name[len(f".{path.name}.{host}-"):].partition(".")[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            stale.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


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
