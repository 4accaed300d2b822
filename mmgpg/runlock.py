"""One run per run directory: an exclusive lock on ``RUN/.lock`` whose content names the holder.

Two runs writing one ``output_dir`` would interleave ``metrics.jsonl`` (steps 1, 1, 2, 2, ...) and fight over its
checkpoints; :func:`lock_run_dir` refuses the second one with a message that names the first (command, pid, host,
start) and says how to proceed. The lock is a ``flock``, which the kernel releases when its process ends however it
ends, so a run killed with kill -9 never leaves the directory locked. One case remains: a process the killed run had
forked (without exec) inherits the lock and may outlive it; the lock then names a process that is dead on this host,
and the next run takes it over with a warning. Imports nothing from mmgpg (a bottom module).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl  # at import: a lock released by garbage collection at interpreter exit can no longer import
import json
import os
import socket
import sys
import time
from pathlib import Path

LOCK = ".lock"


class RunDirLocked(OSError):
    """The run directory is in use by another run; the message names it and says how to proceed."""


class RunLock:
    """An exclusive ``flock`` on ``RUN/.lock`` (:func:`lock_run_dir`), whose content names the holder. The kernel
    releases a ``flock`` when the process ends, however it ends (kill -9 included), so a killed run never leaves the
    directory locked; :meth:`release` (or garbage collection) ends it earlier. ``fd`` is None on a filesystem
    without file locks (nothing is held)."""

    def __init__(self, fd: int | None, path: Path):
        self.fd, self.path = fd, path

    def release(self) -> None:
        fd, self.fd = self.fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)  # nobody holds it: no stale name for the next reader
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    def __del__(self):
        self.release()


def lock_run_dir(run_dir: str | Path, command: str, warn=None) -> RunLock:
    """Lock ``run_dir`` (created if needed) for this process, or raise :class:`RunDirLocked` naming the holder (its
    command, pid, host and start) and how to proceed. A lock whose holder is dead on this host (it was killed while a
    process it had forked, which inherited the lock, lives on) is taken over with a warning."""

    warn = warn or _warn
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK
    for _ in range(5):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder, inode = _read_holder(fd), os.fstat(fd).st_ino
            os.close(fd)
            if holder.get("host") == socket.gethostname() and isinstance(holder.get("pid"), int) \
                    and not _running(holder["pid"], holder.get("start")):
                warn(f"{run_dir}: taking over the lock of mmgpg {holder.get('command', '?')} (pid {holder['pid']}, "
                     "no longer running: it was killed, and a process it had started still holds the lock file)")
                with contextlib.suppress(FileNotFoundError):
                    if os.stat(path).st_ino == inode:  # not already replaced by another process taking over
                        os.unlink(path)
                continue
            raise RunDirLocked(_locked_message(run_dir, holder)) from None
        except OSError as err:
            os.close(fd)
            if err.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                warn(f"{run_dir}: this filesystem has no file locks, so a second run in this directory would not be "
                     "stopped; start one run per output_dir")
                return RunLock(None, path)
            raise
        try:
            current = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            current = False
        if not current:  # locked a file another process had just removed (a takeover): lock the new one
            os.close(fd)
            continue
        me = {"command": command, "pid": os.getpid(), "host": socket.gethostname(),
              "started": time.strftime("%Y-%m-%d %H:%M:%S"), "start": _process_start(os.getpid())}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
        return RunLock(fd, path)
    raise RunDirLocked(f"{run_dir}: could not take its lock ({path}): other processes keep replacing it")


def _read_holder(fd: int) -> dict:
    try:
        holder = json.loads(os.pread(fd, 4096, 0).decode("utf-8", "replace").strip() or "{}")
    except ValueError:
        return {}
    return holder if isinstance(holder, dict) else {}


def _locked_message(run_dir: Path, holder: dict) -> str:
    who = (f"mmgpg {holder.get('command', '?')} (pid {holder.get('pid', '?')} on {holder.get('host', '?')}, started "
           f"{holder.get('started', '?')})") if holder else "another process (it has not written its name yet)"
    stop = f"stop it (kill {holder['pid']} on {holder.get('host', '?')}: it saves a checkpoint at the next step)" \
        if "pid" in holder else "stop it"
    return (f"{run_dir} is in use by {who}: two runs in one output_dir would interleave its logs and checkpoints. "
            f"Wait for it to end, or {stop} and then continue it with train.resume=true; or choose another "
            "output_dir.")


def _process_start(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot (Linux ``/proc``), which tells a reused pid apart."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _running(pid: int, start: int | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: alive
    return start is None or _process_start(pid) in (None, start)


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)
