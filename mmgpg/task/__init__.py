"""Tasks: the contract between mmgpg and a task plugin (the names in ``__all__``), and the registry that finds
plugins (:data:`TASKS`).

:class:`Task` declares every member mmgpg uses — training (rewards, success), evaluation (judge, aggregate, record
fields, mask metrics, re-scoring), SFT (gold completion) and pre-flight — with its default. Subclass it and override
what your task has::

    @dataclass
    class MyTask(Task):
        name: ClassVar[str] = "my_task"
        size: int = 100                                  # dataclass fields are the task's options (task.size=...)

        def __post_init__(self):
            self.rewards = {"accuracy": my_accuracy}     # named, pure, total fns (completion, example) -> float

        def load(self, split: str) -> Sequence[Example]: ...
        def prompt(self, example: Example) -> list[dict]: ...      # chat messages with image parts

A task class must subclass :class:`Task` (its hooks get their defaults from there); anything else is refused with
what to write (:func:`find_task_class`).

If the class is a dataclass, its fields are the task's options, set flat under ``task:`` in the config
(``task.num_train=500``) and type-checked like every other field.

Where tasks come from:

* :data:`TASKS`, the same :class:`mmgpg.registry.Registry` as every other plug-in kind: its entry-point group
  ``mmgpg.tasks`` holds the built-ins (``tasks/`` in the repository, installed as the package ``mmgpg_tasks``, are
  registered this way in ``pyproject.toml``) and any other installed package's; ``TASKS.register(name, cls)`` adds
  one from code;
* ``path/to/file.py:ClassName`` — a task defined in a local file, no packaging needed (resolved before the registry).

The plugin author's surface is ``__all__`` below, plus the modules for judged tasks: :mod:`mmgpg.task.judged`
(:class:`~mmgpg.task.judged.JudgedTask`: tasks whose answers are judged by the anchors' rules), :mod:`.judges`
(:class:`~mmgpg.task.judges.Judgement` and the judges), :mod:`.rewards` (reward functions), :mod:`.data` (data files
and images) and :mod:`.mathjudge`.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from mmgpg.registry import Registry
from mmgpg.typed import ConfigError, Problem, did_you_mean, from_dict

if TYPE_CHECKING:
    from mmgpg.task.judges import Judgement

__all__ = ["TASKS", "Example", "GeneratedTask", "LazyExamples", "RewardFn", "Task", "TaskNotFound", "build_task",
           "media_parts", "task_rewards", "task_success"]

# The task names: `task=NAME`, `mmgpg tasks`, `mmgpg eval --task`. Built-ins and other packages register through the
# entry-point group; a `path/to/file.py:ClassName` reference is resolved before it (find_task_class).
TASKS = Registry("task", "mmgpg.tasks", {})


@dataclass
class Example:
    """One task item: its media, the question text and the gold answer.

    ``media`` lists what the prompt shows, in order: an image is a PIL image, a path or a URL; any other medium is
    a chat content part of its own (``{"type": "video", "video": ...}``), passed to the policy as it is
    (:func:`media_parts`)."""

    id: str
    media: list[Any]
    question: str
    answer: Any
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def images(self) -> list[Any]:
        """The images among :attr:`media`."""
        return [m for m in self.media if not _is_part(m)]


RewardFn = Callable[[str, Example], float]


class Task:
    """The task contract. Required: ``name``, ``rewards``, :meth:`load`, :meth:`prompt`; every other member has the
    default written here (``version`` "1", no judge, no success definition, no gold completion, ...)."""

    name: ClassVar[str] = ""
    """Registry name (also written to every run's and evaluation's metadata)."""
    version: ClassVar[str] = "1"
    """Bump when prompts, rewards or judging change, so results stay comparable."""
    protocols: ClassVar[tuple[str, ...]] = ("paper",)
    """Judge protocols ``mmgpg eval --protocol`` accepts for this task (and pre-flight probes)."""
    categories: ClassVar[tuple[str, ...]] = ()
    """The values a predictions row's ``category`` may take (empty: the task has no categories)."""
    rewards: Mapping[str, RewardFn]
    """Named reward functions ``fn(completion, example) -> float`` (pure, total, finite); set per instance."""
    tools: tuple[str, ...] = ()
    """The tools an episode may call (names in :data:`mmgpg.tools.TOOLS`); empty: one turn, no tools. With tools,
    every rollout is a multi-turn episode (:mod:`mmgpg.rollout.episode`) and the rewards see its whole text."""
    describe_tools: bool = True
    """Add the tools' block (Qwen's function-calling format, :func:`mmgpg.rollout.episode.with_tools`) to the system
    message; False: the task's own prompt says how to call them."""
    episode_limits: Any = None
    """An :class:`mmgpg.rollout.episode.EpisodeLimits` (turns, observation images, tokens, tool time-out) for a task
    with tools; None: the defaults."""

    def load(self, split: str) -> Sequence[Example]:
        """The examples of ``split`` (a :class:`LazyExamples` when images should load only when used)."""
        raise NotImplementedError(f"task {self.name!r} must implement load(split)")

    def prompt(self, example: Example) -> list[dict]:
        """The chat conversation for one example: messages whose content holds image and text parts."""
        raise NotImplementedError(f"task {self.name!r} must implement prompt(example)")

    def metrics(self, completion: str, example: Example) -> Mapping[str, float]:
        """Extra per-sample evaluation scores besides the rewards (default: none)."""
        return {}

    def judge(self, completion: str, example: Example, protocol: str) -> Judgement | None:
        """The evaluation decision for one output under ``protocol`` (default None: the task has no judge and is
        evaluated by its rewards, ``correct`` = the ``accuracy`` reward)."""
        return None

    @classmethod
    def overrides(cls, hook: str) -> bool:
        """Whether the task defines ``hook`` itself instead of using the default here (e.g. ``"judge"``)."""
        return getattr(cls, hook) is not getattr(Task, hook)

    def aggregate(self, records: list[dict[str, Any]]) -> dict[str, float]:
        """The reported metrics over judged records (each has the judgement's fields and ``rewards``). Default: with
        a judge, ``accuracy`` = mean ``correct`` and ``parse_failures`` = how many outputs had no readable answer;
        without one, the mean of each reward and metric."""
        if not records:
            return {}
        n = len(records)
        if self.overrides("judge"):
            return {"accuracy": sum(r["correct"] for r in records) / n,
                    "parse_failures": float(sum(r.get("parse_failure", 0.0) for r in records))}
        scores = [r["rewards"] for r in records]
        return {k: sum(s[k] for s in scores) / n for k in scores[0]}

    def mask_metrics(self, records: list[dict[str, Any]], examples: list[Example], protocol: str) -> dict[str, float]:
        """Metrics that need the examples' images after judging (LISA's SAM mask gIoU/cIoU); may add fields to the
        records. Default: none."""
        return {}

    def record_fields(self, example: Example) -> dict[str, Any]:
        """The fields of a ``predictions.jsonl`` row that :meth:`example_from_record` needs to re-judge it."""
        return {"question": example.question, "ground_truth": example.answer}

    def example_from_record(self, record: dict[str, Any]) -> Example:
        """An example rebuilt from a predictions row, for ``mmgpg eval --predictions`` (default: not supported)."""
        raise NotImplementedError(f"task {self.name!r} has no example_from_record(record)")

    def success(self, completion: str, example: Example, rewards: Mapping[str, float]) -> bool | None:
        """Binary "this completion solved the prompt" (``rewards``: the completion's named rewards and ``total``),
        used by prompt_success.jsonl and the success diagnostics. Default None: not defined (recorded as null). A
        continuous reward (an IoU) is not a success by itself: such a task states its threshold."""
        return None

    def gold_completion(self, example: Example) -> str | None:
        """The gold answer in the task's output format, for SFT and pre-flight (default None: SFT unavailable)."""
        return None

    def model_problems(self, family: Any) -> list[Problem]:
        """What is wrong with running this task's options on a model of ``family`` (its
        :class:`mmgpg.models.Family`: e.g. a grounding task's box convention against the family's), checked when a
        command has loaded its model. Default: nothing."""
        return []


class TaskNotFound(LookupError):
    """A task name or ``file.py:Class`` reference that does not resolve; ``why`` and ``fix`` say more."""

    def __init__(self, why: str, fix: str):
        self.why, self.fix = why, fix
        super().__init__(f"{why} {fix}")


def is_task_file(name: str) -> bool:
    """Whether a task name is a ``path/to/file.py:ClassName`` reference (else the name of an installed task).

    >>> is_task_file("my_tasks/geo.py:Geo"), is_task_file("shapes")
    (True, False)
    """
    return ":" in name and name.rpartition(":")[0].endswith(".py")


def same_task(a: str, b: str) -> bool:
    """Whether two task names name the same task: one installed name, or one file (paths resolved from the current
    directory) and class."""
    if is_task_file(a) != is_task_file(b):
        return False
    if not is_task_file(a):
        return a == b
    (fa, _, ca), (fb, _, cb) = a.rpartition(":"), b.rpartition(":")
    return ca == cb and Path(fa).expanduser().resolve() == Path(fb).expanduser().resolve()


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
    if is_task_file(name):
        cls = _load_file_class(name)
    else:
        if name not in TASKS:
            raise TaskNotFound(
                f"No task named {name!r} is installed.",
                "available: " + (", ".join(sorted(TASKS)) or "(none — is mmgpg installed with pip?)") + "; or give "
                "path/to/file.py:ClassName." + did_you_mean(name, list(TASKS)),
            )
        try:
            cls = TASKS[name]
        except (Exception, SystemExit) as err:
            raise TaskNotFound(f"Task {name!r} ({TASKS.describe(name)}) failed to import: {type(err).__name__}: "
                               f"{err}.", "reinstall the package that provides it.") from err
    if not isinstance(cls, type):
        raise TaskNotFound(f"{name!r} is a {type(cls).__name__}, not a class.", "point at a Task subclass.")
    if not issubclass(cls, Task):
        raise TaskNotFound(f"{name!r} ({cls.__qualname__}) does not subclass mmgpg.task.Task.",
                           f"write `class {cls.__name__}(Task)` with `from mmgpg.task import Task` (the one task "
                           "contract: its hooks get their defaults from there; see docs/tasks.md).")
    missing = [m for m in ("load", "prompt") if getattr(cls, m) is getattr(Task, m)]
    if not cls.name:
        missing.insert(0, "name")
    if missing:
        raise TaskNotFound(f"{name!r} is not a task: it lacks {', '.join(missing)}.",
                           "define them (see the docstring of mmgpg.task.Task).")
    return cls


def _instantiate(cls: type, options: Mapping[str, Any]) -> tuple[Task | None, list[Problem]]:
    """``cls(**options)`` with every problem collected (unknown or mistyped options, the task's own value checks)."""
    if not dataclasses.is_dataclass(cls):
        problems = [Problem(f"task.{k}", v, f"Task {cls.__name__} takes no options.", f"remove task.{k}.")
                    for k, v in options.items()]
        return (None if problems else cls()), problems
    problems: list[Problem] = []
    try:
        task = from_dict(cls, dict(options), problems, prefix="task.")
    except (ValueError, TypeError) as err:  # the task's own checks of its option values
        problems.append(Problem("task", dict(options), f"Task {cls.__name__} rejected its options: {err}.",
                                "change the task options named there."))
        task = None
    return (None if problems else task), problems


def checked_task(name: str, options: Mapping[str, Any] | None = None) -> tuple[Task | None, list[Problem]]:
    """The task ``name`` built with ``options``, or None and every problem (as config problems of ``task.*``): an
    unknown or broken task, unknown or mistyped options, the task's own checks of their values, no rewards. What
    config validation runs once per command; the instance it builds is the command's task
    (:attr:`mmgpg.config.Resolved.task`)."""
    try:
        cls = find_task_class(name)
        task, problems = _instantiate(cls, dict(options or {}))
        if task is not None:
            _check_rewards(task, name)
    except TaskNotFound as err:
        return None, [Problem("task.name", name, err.why, err.fix)]
    return task, problems


def _check_rewards(task: Task, name: str) -> None:
    rewards = getattr(task, "rewards", None)
    if not isinstance(rewards, Mapping) or not rewards or not all(callable(f) for f in rewards.values()):
        raise TaskNotFound(f"Task {name!r} has no rewards: it needs a non-empty mapping name -> fn(completion, example).",
                           "set `rewards` on the class or in __init__/__post_init__.")


def build_task(name: str, options: Mapping[str, Any] | None = None) -> Task:
    """Instantiate a task with validated options (raises :class:`mmgpg.typed.ConfigError` for its options, or
    :class:`TaskNotFound` for an unknown or broken task)."""
    task, problems = _instantiate(find_task_class(name), dict(options or {}))
    if problems:
        raise ConfigError(problems)
    _check_rewards(task, name)
    return task


def first_items(items: Sequence[Example], limit: int | None) -> list[Example]:
    """The first ``limit`` items (all of them when ``limit`` is None or <= 0)."""
    n = len(items) if limit is None or limit <= 0 else min(limit, len(items))
    return list(items[:n])


SUCCESS_FIX = ("return a comparison (e.g. rewards['accuracy'] >= 1.0), or None when the task has no binary "
               "success")
"""What to do about a ``success()`` that returns neither a bool nor None (training's error, ``mmgpg check``)."""


def is_bool(value: Any) -> bool:
    """A Python or NumPy bool (``numpy.bool_``, named ``numpy.bool`` since NumPy 2, is what a comparison of NumPy
    scalars returns)."""
    import numpy as np

    return isinstance(value, (bool, np.bool_))


def check_task_for_model(task: Task, family: Any) -> None:
    """Raise the task's :meth:`Task.model_problems` for a model of ``family`` as one :class:`ConfigError`, and a task
    with tools on a family whose policy cannot continue episodes (``Family.takes_tools``)."""
    problems = list(task.model_problems(family))
    if task.tools and not getattr(family, "takes_tools", False):
        tools_families = "Qwen2-VL, Qwen2.5-VL, Qwen3-VL or Qwen3.5"
        problems.append(Problem("model.name_or_path", getattr(family, "title", family),
                                f"task {task.name!r} offers tools, and its episodes show images between turns, which "
                                f"{getattr(family, 'title', family)} cannot take yet", f"use a {tools_families} model"))
    if problems:
        raise ConfigError(problems)


def task_success(task: Task, completion: str, example: Example, rewards: Mapping[str, float]) -> bool | None:
    """The task's binary success of one completion, or None when the task defines none. Anything else is a bug in
    the task and raises: coercing it (``bool("False")``, ``bool(0.5)``) would count it silently as a success in
    prompt_success.jsonl and the diagnostics (``mmgpg check`` reports the same before a run)."""
    result = task.success(completion, example, rewards)
    if result is None:
        return None
    if not is_bool(result):
        raise ValueError(f"task {getattr(task, 'name', type(task).__name__)!r}: success() returned {result!r} "
                         f"({type(result).__name__}) for example {example.id!r}, not a bool or None; {SUCCESS_FIX}")
    return bool(result)


def task_rewards(task: Task, completion: str, example: Example) -> dict[str, float]:
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
        from mmgpg.task.data import DataError, DataNotFound

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
    from mmgpg.task.data import DataError, DataNotFound

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


class GeneratedTask(Task):
    """A task whose items are drawn on access, each a pure function of ``(seed, split, index)`` (the embedded
    ``shapes``, ``moving_shapes``, ``arith``): its dataclass fields ``num_train`` / ``num_test`` size the two splits,
    its :meth:`example` ``(split, index)`` draws one item (after :meth:`check_item`), and the prompt is the item's
    media then its question, in one user turn."""

    def splits(self) -> dict[str, int]:
        return {"train": self.num_train, "test": self.num_test}

    def check_item(self, split: str, index: int | None = None) -> int:
        """The size of ``split``; a ValueError for another split, an IndexError for an index outside it."""
        sizes = self.splits()
        if split not in sizes:
            raise ValueError(f"{self.name} has splits {', '.join(sizes)}; got {split!r}")
        if index is not None and not 0 <= index < sizes[split]:
            raise IndexError(f"{self.name}/{split} has {sizes[split]} items; got index {index}")
        return sizes[split]

    def example(self, split: str, index: int) -> Example:
        raise NotImplementedError(f"{type(self).__name__} must define example(split, index)")

    def load(self, split: str) -> Sequence[Example]:
        """Items are drawn on access (thousands of images are never all held in memory)."""
        return LazyExamples(self.check_item(split), lambda index: self.example(split, index))

    def prompt(self, example: Example) -> list[dict]:
        return [{"role": "user", "content": media_parts(example) + [{"type": "text", "text": example.question}]}]


def _is_part(item: Any) -> bool:
    return isinstance(item, dict) and "type" in item


def media_parts(example: Example) -> list[dict]:
    """The example's media as chat content parts, in order: ``{"type": "image", "image": ...}`` for an image, any
    other part as it is."""
    return [m if _is_part(m) else {"type": "image", "image": m} for m in example.media]
