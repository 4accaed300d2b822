"""Tasks: the plugin interface and the registry that finds plugins.

A task is any class with this shape (no base class needed)::

    class MyTask:
        name = "my_task"
        version = "1"
        def load(self, split: str) -> Sequence[Example]: ...
        def prompt(self, example: Example) -> list[dict]: ...        # chat messages with image parts
        rewards: Mapping[str, Callable[[str, Example], float]]       # named, pure, total reward functions
        def metrics(self, completion: str, example: Example) -> dict[str, float]: ...   # optional
        def aggregate(self, per_sample: list[dict[str, float]]) -> dict[str, float]: ...  # optional (mean)
        def success(self, completion: str, example: Example, rewards: Mapping[str, float]) -> bool: ...  # optional

``success`` is the task's *binary* notion of "this completion solved the prompt" (``rewards`` are the completion's
named rewards and their ``total``). Per-prompt success records (``prompt_success.jsonl``) and the success
diagnostics use it; a task without it records ``null`` there. A continuous reward (an IoU, GIoU + 1) is not a
success by itself: such a task states its threshold.

If the class is a dataclass, its fields are the task's options, set flat under ``task:`` in the config
(``task.num_train=500``) and type-checked like every other field.

Where tasks come from:

* the entry-point group ``mmgpg.tasks`` — the built-ins (``tasks/`` in the repository, installed as the package
  ``mmgpg_tasks``) are registered this way in ``pyproject.toml``, and so can any other installed package;
* ``path/to/file.py:ClassName`` — a task defined in a local file, no packaging needed.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

from mmgpg.schema import ConfigError, Problem, did_you_mean, from_dict

ENTRY_POINT_GROUP = "mmgpg.tasks"


@dataclass
class Example:
    """One task item: its images (PIL images or paths/URLs), the question text and the gold answer."""

    id: str
    images: list[Any]
    question: str
    answer: Any
    meta: dict[str, Any] = field(default_factory=dict)


RewardFn = Callable[[str, Example], float]


@runtime_checkable
class Task(Protocol):
    name: str
    version: str
    rewards: Mapping[str, RewardFn]

    def load(self, split: str) -> Sequence[Example]: ...

    def prompt(self, example: Example) -> list[dict]: ...


class TaskNotFound(LookupError):
    """A task name or ``file.py:Class`` reference that does not resolve; ``why`` and ``fix`` say more."""

    def __init__(self, why: str, fix: str):
        self.why, self.fix = why, fix
        super().__init__(f"{why} {fix}")


def registered_tasks() -> dict[str, Any]:
    """``{name: entry point}`` of every installed task plugin."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def _load_file_class(ref: str) -> type:
    path_text, _, cls_name = ref.rpartition(":")
    path = Path(path_text).expanduser()
    if not path.is_file():
        raise TaskNotFound(f"Task file {str(path)!r} does not exist.", "give path/to/file.py:ClassName with an existing file.")
    module_name = f"mmgpg_user_task_{abs(hash(str(path.resolve())))}"
    module = sys.modules.get(module_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(module_name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except (Exception, SystemExit) as err:  # a task file that calls sys.exit() must not end mmgpg "successfully"
            del sys.modules[module_name]
            what = f"called sys.exit({err.code!r})" if isinstance(err, SystemExit) else f"{type(err).__name__}: {err}"
            raise TaskNotFound(f"Importing {str(path)!r} failed: {what}.", "fix the error in that file.") from err
    cls = getattr(module, cls_name, None)
    if cls is None:
        names = [n for n, v in vars(module).items() if isinstance(v, type) and v.__module__ == module_name]
        raise TaskNotFound(f"{str(path)!r} defines no class {cls_name!r}.",
                           "classes there: " + (", ".join(names) or "(none)") + "." + did_you_mean(cls_name, names))
    return cls


def find_task_class(name: str) -> type:
    """The task class for a registered name or a ``path/to/file.py:ClassName`` reference."""
    if ":" in name and name.rpartition(":")[0].endswith(".py"):
        cls = _load_file_class(name)
    else:
        tasks = registered_tasks()
        if name not in tasks:
            raise TaskNotFound(
                f"No task named {name!r} is installed.",
                "available: " + (", ".join(sorted(tasks)) or "(none — is mmgpg installed with pip?)") + "; or give "
                "path/to/file.py:ClassName." + did_you_mean(name, list(tasks)),
            )
        try:
            cls = tasks[name].load()
        except (Exception, SystemExit) as err:
            raise TaskNotFound(f"Task {name!r} ({tasks[name].value}) failed to import: {type(err).__name__}: {err}.",
                               "reinstall the package that provides it.") from err
    missing = [a for a in ("name", "version", "load", "prompt") if not hasattr(cls, a)]
    if missing:
        raise TaskNotFound(f"{name!r} is not a task: it lacks {', '.join(missing)}.",
                           "see the Task protocol in mmgpg/task.py.")
    return cls


def options_problems(cls: type, options: Mapping[str, Any]):
    """Config problems of ``options`` for task class ``cls`` (its dataclass fields are the allowed options)."""
    if not dataclasses.is_dataclass(cls):
        return [Problem(f"task.{k}", v, f"Task {cls.__name__} takes no options.", f"remove task.{k}.") for k, v in options.items()]
    problems: list[Problem] = []
    try:
        from_dict(cls, dict(options), problems, prefix="task.")
    except (ValueError, TypeError) as err:  # the task's own checks of its option values
        problems.append(Problem("task", dict(options), f"Task {cls.__name__} rejected its options: {err}.",
                                "change the task options named there."))
    return problems


def build_task(name: str, options: Mapping[str, Any] | None = None):
    """Instantiate a task with validated options (raises :class:`mmgpg.schema.ConfigError`)."""
    cls = find_task_class(name)
    options = dict(options or {})
    problems = options_problems(cls, options)
    if problems:
        raise ConfigError(problems)
    task = from_dict(cls, options, []) if dataclasses.is_dataclass(cls) else cls()
    rewards = getattr(task, "rewards", None)
    if not isinstance(rewards, Mapping) or not rewards or not all(callable(f) for f in rewards.values()):
        raise TaskNotFound(f"Task {name!r} has no rewards: it needs a non-empty mapping name -> fn(completion, example).",
                           "set `rewards` on the class or in __init__/__post_init__.")
    return task


def first_items(items: Sequence[Example], limit: int | None) -> list[Example]:
    """The first ``limit`` items (all of them when ``limit`` is None or <= 0)."""
    n = len(items) if limit is None or limit <= 0 else min(limit, len(items))
    return list(items[:n])


def task_success(task: Any, completion: str, example: Example, rewards: Mapping[str, float]) -> bool | None:
    """The task's binary success of one completion, or None when the task declares no ``success``."""
    fn = getattr(task, "success", None)
    return None if fn is None else bool(fn(completion, example, rewards))


def task_rewards(task: Any, completion: str, example: Example) -> dict[str, float]:
    """Every named reward of ``task`` for one completion; ``total`` is their sum. A reward that is not a finite
    number is a bug in the task and raises (it would poison advantages and the update silently)."""
    scores = {name: float(fn(completion, example)) for name, fn in task.rewards.items()}
    bad = {name: v for name, v in scores.items() if not math.isfinite(v)}
    if bad:
        raise ValueError(f"task {getattr(task, 'name', type(task).__name__)!r}: reward "
                         + ", ".join(f"{k!r} returned {v}" for k, v in bad.items())
                         + f" for example {example.id!r}; rewards must be finite numbers (fix the reward function)")
    scores["total"] = sum(scores.values())
    return scores


class LazyExamples(Sequence[Example]):
    """A split whose items are built on access (``make(index) -> Example``), so images load only when used."""

    def __init__(self, n: int, make: Callable[[int], Example]):
        self.n, self.make = n, make

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return [self.make(i) for i in range(*index.indices(self.n))]
        if not -self.n <= index < self.n:
            raise IndexError(f"index {index} out of range for {self.n} items")
        return self.make(index % self.n)


class SkipBadRows(Sequence[Example]):
    """A split under ``data.on_bad_row``. ``error``: a bad row raises its message. ``skip``: item ``i`` is the first
    good row at or after ``i`` (cyclically), so the training stream stays deterministic and a resumed run skips the
    same rows; each bad row is warned about once and counted in :attr:`skipped` (row index → reason)."""

    def __init__(self, items: Sequence[Example], on_bad_row: str, warn: Callable[[str], None] | None = None):
        self.items, self.on_bad_row = items, on_bad_row
        self.skipped: dict[int, str] = {}
        self.warn = warn or (lambda message: print(f"warning: {message}", file=sys.stderr, flush=True))

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index):  # type: ignore[override]
        from mmgpg.taskdata import DataError, DataNotFound

        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        n = len(self.items)
        for k in range(n):
            j = (index + k) % n
            if j in self.skipped:
                continue
            try:
                return self.items[j]
            except (DataError, DataNotFound) as err:
                if self.on_bad_row != "skip":
                    raise
                self.skipped[j] = str(err)
                self.warn(f"skipped bad data row ({len(self.skipped)} so far): {err}")
        raise DataError(f"every one of the {n} rows is bad (data.on_bad_row=skip); the first: "
                        f"{next(iter(self.skipped.values()), '?')}")


def good_items(items: Sequence[Example], limit: int | None, on_bad_row: str) -> tuple[list[Example], dict[int, str]]:
    """The first ``limit`` items (all when None or <= 0) for evaluation: a bad row raises, or under ``skip`` is left
    out and returned in ``{row: reason}`` (never replaced by another row, which would count it twice)."""
    from mmgpg.taskdata import DataError, DataNotFound

    n = len(items) if limit is None or limit <= 0 else min(limit, len(items))
    out, skipped = [], {}
    for i in range(n):
        try:
            out.append(items[i])
        except (DataError, DataNotFound) as err:
            if on_bad_row != "skip":
                raise
            skipped[i] = str(err)
    return out, skipped


def image_parts(example: Example) -> list[dict]:
    """The example's images as chat content parts."""
    return [{"type": "image", "image": im} for im in example.images]


@dataclass
class JudgedTask:
    """Shared plumbing for tasks with anchor judges (every field is a task option).

    A subclass sets ``name``, ``version``, ``splits`` and implements ``example(split, index)``,
    ``accuracy_reward(completion, example, protocol)``, ``judge(completion, example, protocol)``,
    ``example_from_record(record)`` and ``gold_completion(example)``. Its rewards are ``accuracy`` and ``format``
    under ``reward_protocol``; ``mmgpg eval --protocol`` chooses the judge's protocol independently.
    """

    reward_protocol: str = "strict"
    """Protocol of the training rewards: `strict` (hardened; rejects the anchors' reward hacks) or `paper`."""
    format_reward: bool = True
    """Include the format reward besides accuracy (the anchors sum both)."""

    name: ClassVar[str] = ""
    version: ClassVar[str] = "1"
    protocols: ClassVar[tuple[str, ...]] = ("paper", "strict")
    splits: ClassVar[tuple[str, ...]] = ("train", "test")
    format_prefix: ClassVar[str] = ""
    categories: ClassVar[tuple[str, ...]] = ()
    """The values a record's ``category`` may take (empty: the task has no categories, any text is kept)."""

    def __post_init__(self):
        if self.reward_protocol not in self.protocols:
            raise ValueError(f"reward_protocol must be one of {', '.join(self.protocols)}; got {self.reward_protocol!r}")
        protocol = self.reward_protocol
        self.rewards = {"accuracy": lambda completion, ex: self.accuracy_reward(completion, ex, protocol)}
        if self.format_reward:
            self.rewards["format"] = lambda completion, ex: self.format_score(completion, protocol)

    def format_score(self, completion: str, protocol: str) -> float:
        from mmgpg.rewards import format_reward, strict_format_reward

        rule = format_reward if protocol == "paper" else strict_format_reward
        return rule(completion, prefix=self.format_prefix)

    def source_rows(self, split: str) -> Sequence[Any]:
        """The raw records of a split (a subclass that uses the default :meth:`load` implements this)."""
        raise NotImplementedError(f"{type(self).__name__} implements neither load() nor source_rows()")

    def rows(self, split: str) -> Sequence[Any]:
        """:meth:`source_rows`, read once per split and kept."""
        self.check_split(split)
        cache = self.__dict__.setdefault("_rows_cache", {})
        if split not in cache:
            cache[split] = self.source_rows(split)
        return cache[split]

    def load(self, split: str) -> Sequence[Example]:
        rows = self.rows(split)
        return LazyExamples(len(rows), lambda i: self.checked_example(split, i, rows))

    def checked_example(self, split: str, index: int, rows: Sequence[Any]) -> Example:
        """:meth:`example` of row ``index``; any failure becomes one :class:`~mmgpg.taskdata.DataError` naming the
        file and line (or task, split and row), the row's id and the task's own message (field, image path)."""
        from mmgpg.taskdata import BadRow, DataError, DataNotFound

        source, lines = getattr(rows, "source", ""), getattr(rows, "lines", None)
        where = (f"{source}:{lines[index]}" if source and lines else f"{source} row {index}" if source
                 else f"{self.name} {split} row {index}")
        row = rows[index]
        if isinstance(row, BadRow):
            raise DataError(f"{where}: {row.reason}")
        if not isinstance(row, dict):
            raise DataError(f"{where}: a row must be a JSON object with the task's fields; got {type(row).__name__}")
        try:
            return self.example(split, index, row)
        except (DataError, DataNotFound, ValueError, KeyError, IndexError, TypeError, AttributeError, OSError) as err:
            if isinstance(err, DataNotFound):  # missing files stay FileNotFoundErrors (with the download advice)
                raise DataNotFound(f"{where}: {err}") from None
            detail = str(err) if isinstance(err, (DataError, ValueError)) else f"{type(err).__name__}: {err}"
            raise DataError(f"{where}: {detail}") from None

    def check_split(self, split: str) -> None:
        if split not in self.splits:
            raise ValueError(f"{self.name} has splits {', '.join(self.splits)}; got {split!r}")

    def prompt(self, example: Example) -> list[dict]:
        messages = []
        system = example.meta.get("system")
        if system:
            messages.append({"role": "system", "content": [{"type": "text", "text": system}]})
        messages.append({"role": "user", "content": image_parts(example) + [{"type": "text", "text": example.question}]})
        return messages

    def success(self, completion: str, example: Example, rewards: Mapping[str, float]) -> bool:
        """Success = the task's judge, under the training rewards' protocol, calls the answer correct
        (``correct >= 1``). Box tasks override this with an IoU threshold."""
        return float(self.judge(completion, example, self.reward_protocol)["correct"]) >= 1.0

    def aggregate(self, per_sample: list[dict[str, Any]]) -> dict[str, float]:
        """``accuracy`` = mean of ``correct``; ``parse_failures`` = how many outputs had no readable answer."""
        n = len(per_sample)
        return {"accuracy": sum(r["correct"] for r in per_sample) / n if n else 0.0,
                "parse_failures": float(sum(r.get("parse_failure", 0.0) for r in per_sample))}


TEXT_FIELDS = frozenset({"problem", "solution", "question", "prompt", "class", "task", "category", "text"})
"""Fields that are text in every schema mmgpg reads: a number or a list there is a data error, not a prompt."""
GOLD_FIELDS = frozenset({"answer", "ground_truth"})
"""Gold answers: text, a finite number, or a list of numbers (a box)."""


def require(record: dict, keys: Sequence[str], what: str) -> None:
    """Raise a clear :class:`~mmgpg.taskdata.DataError` when a record lacks a field its schema needs or a field has
    the wrong type (:data:`TEXT_FIELDS` text, :data:`GOLD_FIELDS` text/number/boxes, ``messages`` a non-empty list
    of ``{"content": text}``, ``choices`` a list of text, ``images`` a non-empty list)."""
    from mmgpg.taskdata import DataError

    if not isinstance(record, dict):
        raise DataError(f"{what}: a record must be an object with fields {', '.join(keys)}; got {type(record).__name__}")
    rid = record.get("id", record.get("idx", "?"))
    missing = [k for k in keys if k not in record or record[k] is None]
    if missing:
        raise DataError(f"{what}: record {rid!r} lacks {', '.join(missing)}; "
                        f"it has {', '.join(sorted(map(str, record))) or 'no fields'}")
    for key in keys:
        problem = _field_problem(key, record[key])
        if problem:
            raise DataError(f"{what}: record {rid!r}: field {key!r} {problem}")


def _field_problem(key: str, value: Any) -> str:
    import math

    kind = type(value).__name__
    if key in TEXT_FIELDS and not isinstance(value, str):
        return f"must be text; got {kind} {str(value)[:40]!r}"
    if key in GOLD_FIELDS:
        items = value if isinstance(value, list) else [value]
        if not all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in items) or (
                isinstance(value, list) and not all(isinstance(v, (int, float)) for v in items)):
            return f"must be text, a number or a list of numbers; got {kind} {str(value)[:40]!r}"
        if any(isinstance(v, float) and not math.isfinite(v) for v in items):
            return "is not a finite number"
    if key == "messages" and not (isinstance(value, list) and value and all(
            isinstance(m, dict) and isinstance(m.get("content"), str) for m in value)):
        return "must be a non-empty list of {\"role\": ..., \"content\": text} messages"
    if key == "choices" and not (isinstance(value, list) and all(isinstance(c, str) for c in value)):
        return f"must be a list of option texts; got {kind}"
    if key == "images" and not (isinstance(value, list) and value):
        return f"must be a non-empty list of images; got {kind}"
    return ""
