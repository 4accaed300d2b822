"""The run directory: the one module that knows its on-disk layout, reads its files back and finds its checkpoints.

Layout of a run directory (``output_dir``)::

    .lock                      # held by the run writing here (mmgpg.runlock): who, since when
    config.yaml                # the resolved config with a header saying how it was made (written once)
    config_changes.jsonl       # resumes that changed the config (train.resume_config=new)
    metrics.jsonl              # one record per step (train and sft: mmgpg.train.runlog.RunLog)
    prompt_success.jsonl       # one SuccessRecord per generated group (mmgpg train)
    probe_success.jsonl        # ProbeRecords (mmgpg probe, train.probe_every)
    tensorboard/               # event files
    checkpoints/step-00000010/ # mmgpg.train.checkpoint writes it; latest_checkpoint finds and verifies it

Everything here reads; the writers are the trainer (records, through :func:`append_records`), the run log and the
checkpoint module. May import: the top-level modules and :mod:`mmgpg.config` (a run's config is read as a Config).
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mmgpg.jsonl import read_jsonl, write_jsonl_atomic
from mmgpg.typed import CheckpointError

CONFIG = "config.yaml"
METRICS = "metrics.jsonl"
SUCCESS = "prompt_success.jsonl"
PROBES = "probe_success.jsonl"
CHECKPOINTS = "checkpoints"
_STEP_DIR = re.compile(r"step-(\d{8})")


def run_dir_path(output_dir: str, command: str) -> Path:
    """``output_dir``, or ``runs/<command>-<YYYYmmdd-HHMMSS>`` when it is empty (the one default spelling)."""
    return Path(output_dir) if output_dir else Path("runs") / f"{command}-{time.strftime('%Y%m%d-%H%M%S')}"


def make_run_dir(output_dir: str, command: str) -> Path:
    """:func:`run_dir_path`, created."""
    path = run_dir_path(output_dir, command)
    path.mkdir(parents=True, exist_ok=True)
    return path


# --------------------------------------------------------------------------------------------------------------------
# config.yaml
# --------------------------------------------------------------------------------------------------------------------


def read_config_tree(path: str | Path) -> dict | None:
    """A saved ``config.yaml`` as a plain dict (None when the file is absent or is not a mapping). It is read with
    :func:`mmgpg.typed.read_yaml` (plain data; aliases, size, nesting and duplicate keys limited): a hostile file is
    a :class:`~mmgpg.typed.ConfigError` naming it and the line."""
    from mmgpg.typed import read_yaml_file

    path = Path(path)
    if not path.is_file():
        return None
    tree = read_yaml_file(path)
    return tree if isinstance(tree, dict) else None


def read_config(path: str | Path, *, overrides: list[str] = (), lenient: bool = False, use_task: bool = True):
    """A run's ``config.yaml`` (or the run directory holding it) → ``(Config, ignored keys, task)``, validated, with
    ``a.b=value`` field overrides applied (a group such as ``task=...`` cannot be swapped under a finished run).
    ``lenient``: keys this mmgpg version does not have (a run made by an older version) are ignored and named
    instead of being an error. Every other problem is one :class:`mmgpg.config.ConfigError`.

    The run's task, when it is a task *file* (``path.py:Class``), is code named by a file that may come from someone
    else: it is never imported on the run's word. ``use_task`` (the caller runs the task): the user must name it
    in ``overrides`` (``task=path.py:Class``, the run's own file and class), else the read is refused with the
    argument to add. ``use_task=False`` (the caller only reads the run): the task is not looked up at all. An
    installed task (a ``mmgpg.tasks`` entry point) is the user's own code and is checked as usual. ``task`` is the
    task built while checking it (the caller's, built once), or None when it was not looked up."""
    from mmgpg.config import Config, ConfigError, Problem, apply_override, check, from_dict
    from mmgpg.task import checked_task, is_task_file, same_task

    path = Path(path)
    if path.is_dir():
        path = path / CONFIG
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: give a run directory written by mmgpg train")
    tree = read_config_tree(path) or {}
    problems: list = []
    named = None  # task=... on the command line: the user naming the run's task
    for arg in overrides:
        key, sep, raw = arg.partition("=")
        if key == "task" and sep:
            named = raw
            continue
        if not sep or "." not in key:
            problems.append(Problem(arg, arg, "Under a run directory only field overrides a.b=value apply.",
                                    "write e.g. rollout.temperature=1.0 (the run's task and model are kept)."))
            continue
        apply_override(tree, key, raw)
    cfg = from_dict(Config, tree, problems)
    ignored = [p.key for p in problems if lenient and "has no field" in p.why]
    task = cfg.task.name
    check_task = True
    if named is not None and not same_task(named, task):
        problems.append(Problem("task", named, f"It is not this run's task ({task}, in {path}); a finished run's task "
                                "cannot be swapped.", f"give task={task} (the run's own), or leave task= out."))
        check_task = False
    elif is_task_file(task) and named is None:
        check_task = False
        if use_task:
            problems.append(Problem("task.name", task, f"{path} names a task file. mmgpg does not import code named "
                                    "by a run directory (it may come from someone else).",
                                    f"read that file; to run it, name it yourself: add task={task} to the command."))
    problems = [p for p in problems if p.key not in ignored] + check(cfg, task=False)
    built = None
    if check_task:
        built, task_problems = checked_task(cfg.task.name, cfg.task.options)
        problems += task_problems
    if problems:
        raise ConfigError(problems)
    return cfg, ignored, built


# --------------------------------------------------------------------------------------------------------------------
# metrics.jsonl
# --------------------------------------------------------------------------------------------------------------------


def read_metrics(run_dir: str | Path) -> list[dict]:
    """Every record of ``metrics.jsonl`` (a torn last line, from a kill mid-write, is dropped with a warning)."""
    path = Path(run_dir) / METRICS
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: give a run directory written by mmgpg train or mmgpg sft")
    read = read_jsonl(path, torn_tail="drop")
    for number, row in zip(read.lines, read.rows):
        if not isinstance(row, dict) or not isinstance(row.get("step"), int):
            raise ValueError(f"{path}:{number}: a record without an integer 'step': not an mmgpg metrics log")
    return read.rows


# --------------------------------------------------------------------------------------------------------------------
# prompt_success.jsonl and probe_success.jsonl
# --------------------------------------------------------------------------------------------------------------------


def _typed(path: Path, number: int, rec: dict, key: str, kind, required: bool = True):
    if key not in rec or rec[key] is None:
        if required:
            raise ValueError(f"{path}:{number}: the record has no {key!r} field; was it written by this mmgpg version?")
        return None
    value = rec[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        name = getattr(kind, "__name__", None) or " or ".join(k.__name__ for k in kind)
        raise ValueError(f"{path}:{number}: {key!r} must be {name}; got {value!r}")
    return value


@dataclass(frozen=True)
class SuccessRecord:
    """One generated group of a training step (every rank, every resampling attempt), as ``prompt_success.jsonl``
    holds it: whether it entered the update, its rewards and the task's binary success per completion (None when
    the task declares no success)."""

    step: int
    prompt_id: str
    attempt: int
    rank: int
    group_size: int
    in_update: bool | None
    zero_variance: bool | None
    rewards: list[float] | None
    success: list[int] | None

    def to_json(self) -> dict[str, Any]:
        row = asdict(self)
        row["successes"] = None if self.success is None else sum(self.success)
        return row

    @classmethod
    def parse(cls, path: Path, number: int, rec: Any) -> SuccessRecord:
        if not isinstance(rec, dict):
            raise ValueError(f"{path}:{number}: not a record (a JSON object)")
        group_size = _typed(path, number, rec, "group_size", int)
        if group_size < 1:
            raise ValueError(f"{path}:{number}: 'group_size' must be at least 1; got {group_size}. Fix or remove the "
                             "record.")
        success = rec.get("success")
        if success is None and "success" not in rec and isinstance(rec.get("successes"), int):
            # a record that carries only the count: read as that many successes
            if not 0 <= rec["successes"] <= group_size:
                raise ValueError(f"{path}:{number}: 'successes' must lie in [0, group_size={group_size}]; got "
                                 f"{rec['successes']!r}. Fix or remove the record.")
            success = [1] * rec["successes"] + [0] * (group_size - rec["successes"])
        if success is not None and not (isinstance(success, list) and len(success) == group_size
                                        and all(x in (0, 1) and isinstance(x, int) for x in success)):
            raise ValueError(f"{path}:{number}: 'success' must be a list of {group_size} values, each 0 or 1 (or "
                             f"false/true); got {success!r}. Fix or remove the record.")
        rewards = rec.get("rewards")
        if rewards is not None and not (isinstance(rewards, list)
                                        and all(isinstance(r, int | float) and not isinstance(r, bool) for r in rewards)):
            raise ValueError(f"{path}:{number}: 'rewards' must be a list of numbers; got {rewards!r}")
        return cls(step=_typed(path, number, rec, "step", int),
                   prompt_id=str(_typed(path, number, rec, "prompt_id", (str, int))),
                   attempt=_typed(path, number, rec, "attempt", int, required=False) or 0,
                   rank=_typed(path, number, rec, "rank", int, required=False) or 0,
                   group_size=group_size, in_update=rec.get("in_update"), zero_variance=rec.get("zero_variance"),
                   rewards=rewards, success=None if success is None else [int(x) for x in success])


@dataclass(frozen=True)
class ProbeRecord:
    """One probed prompt (``mmgpg probe``, ``train.probe_every``): ``successes`` of ``samples`` completions at the
    rollout's sampling settings, of the policy at ``step`` (0: the starting model) read from ``checkpoint``."""

    step: int
    prompt_id: str
    split: str
    samples: int
    successes: int
    temperature: float
    top_p: float
    top_k: int
    max_new_tokens: int
    checkpoint: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def parse(cls, path: Path, number: int, rec: Any) -> ProbeRecord:
        if not isinstance(rec, dict):
            raise ValueError(f"{path}:{number}: not a record (a JSON object)")
        k, n = _typed(path, number, rec, "successes", int), _typed(path, number, rec, "samples", int)
        if n < 1:
            raise ValueError(f"{path}:{number}: 'samples' must be at least 1 (a probe draws completions to count); "
                             f"got {n}. Fix or remove the record, or probe again (mmgpg probe --samples 64).")
        if not 0 <= k <= n:
            raise ValueError(f"{path}:{number}: successes must lie in [0, samples]; got {k} of {n}")
        number_kind = (int, float)
        return cls(step=_typed(path, number, rec, "step", int),
                   prompt_id=str(_typed(path, number, rec, "prompt_id", (str, int))),
                   split=str(rec.get("split", "")), samples=n, successes=k,
                   temperature=float(_typed(path, number, rec, "temperature", number_kind, required=False) or 0.0),
                   top_p=float(_typed(path, number, rec, "top_p", number_kind, required=False) or 1.0),
                   top_k=int(_typed(path, number, rec, "top_k", int, required=False) or 0),
                   max_new_tokens=int(_typed(path, number, rec, "max_new_tokens", int, required=False) or 0),
                   checkpoint=str(rec.get("checkpoint", "")))


def read_records(path: str | Path, kind: type[SuccessRecord] | type[ProbeRecord], *, numbered: bool = False) -> list:
    """Every record of a ``prompt_success.jsonl`` / ``probe_success.jsonl`` file, typed and checked (a line that is
    not valid JSON, or a record of the wrong shape, is an error naming the line; a torn last line is dropped).
    ``numbered``: ``(line number, record)`` pairs, for messages about a record's content."""
    path = Path(path)
    read = read_jsonl(path, torn_tail="drop")
    records = [kind.parse(path, number, rec) for number, rec in zip(read.lines, read.rows)]
    return list(zip(read.lines, records)) if numbered else records


def append_records(path: str | Path, records: list) -> None:
    """Append typed records to a run file (one JSON object a line)."""
    with open(path, "a", encoding="utf-8") as f:
        for rec in records:
            f.write(json.dumps(rec.to_json()) + "\n")


def replace_probe(path: str | Path, records: list[ProbeRecord]) -> Path:
    """Add ``records`` to ``probe_success.jsonl``, replacing an earlier probe of the same step and split, atomically
    (a kill mid-rewrite leaves the old file or the new one, never a truncated one). Two writers at once (``mmgpg
    probe RUN`` beside a run's ``train.probe_every``) take turns: the read-merge-write holds an exclusive ``flock``
    on the file's folder, so neither drops the other's records."""
    path = Path(path)
    keys = {(r.step, r.split) for r in records}
    path.parent.mkdir(parents=True, exist_ok=True)
    with _folder_locked(path.parent):
        kept = [r for r in (read_records(path, ProbeRecord) if path.exists() else []) if (r.step, r.split) not in keys]
        write_jsonl_atomic(path, [r.to_json() for r in kept + list(records)])
    return path


@contextlib.contextmanager
def _folder_locked(folder: Path):
    """An exclusive ``flock`` on a folder for the block (released when the block ends, or by the kernel when the
    process dies). Nothing is held on a filesystem without such locks (some network filesystems): as before."""
    import fcntl
    import os

    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        yield
        return
    try:
        with contextlib.suppress(OSError):  # a filesystem without flock: no lock, as before
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the only descriptor releases the lock


# --------------------------------------------------------------------------------------------------------------------
# checkpoints: discovery and verification (mmgpg.train.checkpoint writes and loads them)
# --------------------------------------------------------------------------------------------------------------------


def checkpoint_root(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def complete_checkpoints(output_dir: str | Path) -> list[Path]:
    """Checkpoint directories with a ``COMPLETE`` marker, oldest first (not yet verified)."""
    root = checkpoint_root(output_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and _STEP_DIR.fullmatch(p.name) and (p / "COMPLETE").is_file()]
    return sorted(found, key=lambda p: int(p.name[5:]))


def latest_checkpoint(output_dir: str | Path, warn=None) -> Path | None:
    """The newest complete checkpoint that passes :func:`verify_checkpoint`; each newer one that fails is reported
    through ``warn`` (default: a warning on stderr) with its reason, and skipped."""
    warn = warn or _warn
    for candidate in reversed(complete_checkpoints(output_dir)):
        try:
            verify_checkpoint(candidate)
        except CheckpointError as err:
            warn(f"skipping checkpoint {candidate}: {err}")
            continue
        return candidate
    return None


def _read_marker(checkpoint: Path) -> dict[str, int]:
    try:
        meta = json.loads((checkpoint / "COMPLETE").read_text(encoding="utf-8"))
        if not (isinstance(meta, dict) and isinstance(meta.get("step"), int) and isinstance(meta.get("world_size"), int)):
            raise ValueError("expected {\"step\": int, \"world_size\": int}")
    except (OSError, ValueError) as err:
        raise CheckpointError(f"its COMPLETE marker is unreadable ({err})") from None
    return meta


def _safe_load(path: Path, mmap: bool = False, **kwargs) -> Any:
    """:func:`mmgpg.utils.safe_load` (imported here only when used: reading a run's logs must not import torch)."""
    from mmgpg.utils import safe_load

    return safe_load(path, mmap=mmap, **kwargs)


def verify_checkpoint(checkpoint: Path) -> dict[str, int]:
    """Check ``checkpoint`` without loading the model: the marker, every rank's RNG file, the trainer state and the
    backend's own files (each registered backend's ``verify_checkpoint`` fact: DeepSpeed's ``engine/``) load
    (safely), and ``policy/`` has a readable ``config.json`` and intact safetensors headers. Returns the marker."""
    meta = _read_marker(checkpoint)
    state = _safe_load(checkpoint / "trainer_state.pt", mmap=True)
    if not isinstance(state, dict) or not {"optimizer", "scheduler", "stream", "counters"} <= set(state):
        raise CheckpointError("trainer_state.pt lacks the optimizer, scheduler, stream or counters")
    from mmgpg.backends import BACKENDS, backend_fact

    for name in BACKENDS:  # each backend checks its own files (DeepSpeed: engine/), when the checkpoint has them
        hook = backend_fact(name, "verify_checkpoint")
        if hook is not None:
            hook(checkpoint, state, meta["world_size"])
    for rank in range(meta["world_size"]):
        rng = _safe_load(checkpoint / f"rng_rank{rank}.pt")
        if not isinstance(rng, dict) or not {"python", "numpy", "torch"} <= set(rng):
            raise CheckpointError(f"rng_rank{rank}.pt is not an RNG state")
    verify_policy_dir(checkpoint / "policy")
    if (checkpoint / "adapter").exists():  # a LoRA run (mmgpg.models.lora.ADAPTER_DIR)
        verify_adapter_dir(checkpoint / "adapter")
    return meta


def verify_adapter_dir(adapter: Path) -> None:
    """A PEFT adapter folder (a LoRA run's ``adapter/``): ``adapter_config.json`` parses, the weights are whole."""
    try:
        json.loads((adapter / "adapter_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{adapter.name}/adapter_config.json is unreadable ({err})") from None
    _check_safetensors(adapter, adapter.glob("adapter_model.safetensors"))


def verify_policy_dir(policy: Path) -> None:
    """A Hugging Face model directory whose ``config.json`` parses and whose safetensors files are whole."""
    if not policy.is_dir():
        raise CheckpointError(f"{policy.name}/ is missing")
    try:
        json.loads((policy / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{policy.name}/config.json is unreadable ({err})") from None
    _check_safetensors(policy, policy.glob("*.safetensors"))


def _check_safetensors(folder: Path, paths) -> None:
    from safetensors import safe_open

    weights = sorted(paths)
    if not weights:
        raise CheckpointError(f"{folder.name}/ holds no *.safetensors weights")
    for path in weights:
        try:  # safe_open parses the header and checks that the data it describes covers the file exactly
            with safe_open(str(path), framework="pt"):
                pass
        except Exception as err:  # noqa: BLE001 - safetensors raises its own error types
            raise CheckpointError(f"{folder.name}/{path.name} is damaged ({str(err).splitlines()[0][:200]})") from None


def _warn(message: str) -> None:
    from mmgpg import distributed

    if distributed.current().is_main:
        print(f"warning: {message}", file=sys.stderr, flush=True)
