"""Tasks judged by the anchors' rules: :class:`JudgedTask` (the plumbing shared by GEOQA, CV-Bench, fine-grained
classification, LISA and the embedded scenes) and :func:`require`, the schema check of a data record."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from mmgpg.task import Example, LazyExamples, Task, media_parts
from mmgpg.typed import check_choice


@dataclass
class JudgedTask(Task):
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
    accuracy_is_judge: ClassVar[tuple[str, ...]] = ()
    """Protocols under which the ``accuracy`` reward is by construction ``judge(...).correct``: :meth:`success` then
    reads the reward already computed instead of judging the completion a second time."""

    def __post_init__(self):
        check_choice("reward_protocol", self.reward_protocol, self.protocols)
        protocol = self.reward_protocol
        self.rewards = {"accuracy": lambda completion, ex: self.accuracy_reward(completion, ex, protocol)}
        if self.format_reward:
            self.rewards["format"] = lambda completion, ex: self.format_score(completion, protocol)

    def format_score(self, completion: str, protocol: str) -> float:
        from mmgpg.task.rewards import format_reward, strict_format_reward

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
        """:meth:`example` of row ``index``; any failure becomes one :class:`~mmgpg.task.data.DataError` naming the
        file and line (or task, split and row), the row's id and the task's own message (field, image path)."""
        from mmgpg.task.data import BadRow, DataError, DataNotFound

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
        messages.append({"role": "user", "content": media_parts(example) + [{"type": "text", "text": example.question}]})
        return messages

    def success(self, completion: str, example: Example, rewards: Mapping[str, float]) -> bool:
        """Success = the task's judge, under the training rewards' protocol, calls the answer correct
        (``correct >= 1``). Box tasks override this with an IoU threshold."""
        if self.reward_protocol in self.accuracy_is_judge and "accuracy" in rewards:
            return float(rewards["accuracy"]) >= 1.0
        return float(self.judge(completion, example, self.reward_protocol).correct) >= 1.0


TEXT_FIELDS = frozenset({"problem", "solution", "question", "prompt", "class", "task", "category", "text"})
"""Fields that are text in every schema mmgpg reads: a number or a list there is a data error, not a prompt."""
GOLD_FIELDS = frozenset({"answer", "ground_truth"})
"""Gold answers: text, a finite number, or a list of numbers (a box)."""


def require(record: dict, keys: Sequence[str], what: str) -> None:
    """Raise a clear :class:`~mmgpg.task.data.DataError` when a record lacks a field its schema needs or a field has
    the wrong type (:data:`TEXT_FIELDS` text, :data:`GOLD_FIELDS` text/number/boxes, ``messages`` a non-empty list
    of ``{"content": text}``, ``choices`` a list of text, ``images`` a non-empty list)."""
    from mmgpg.task.data import DataError

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
