"""``arith``: add two whole numbers — an embedded, offline text task for the text policies (``model=tiny_qwen2``).

Each item asks for ``a + b`` with ``0 <= a, b <= max_operand`` (default 99: one- and two-digit operands, sums 0–198).
The gold completion writes column addition, units first, then the sum: ``97 + 75`` is
``<think>7+5=12 9+7+1=17</think><answer>172</answer>`` (:func:`column_steps`). It is the text counterpart of
``shapes``: a randomly initialised tiny model earns nothing, a short SFT on the gold completions gets it part of the
way, and RL has room to raise it. Each step is a one-digit sum (with or without the carry), so a model can learn the
procedure from a few thousand examples and apply it to pairs it never saw. Trained on ``<think>97+75=172</think>``
(the sum without the steps), the tiny text model (``model=tiny_qwen2``) stayed at 6 % greedy test accuracy after
400 SFT steps of 32; with the steps it reached 68 % after 300 (one run each, seed 0, lr 1e-3, 200 test pairs).

Splits never share a pair. All ``(max_operand + 1)²`` ordered pairs are shuffled once with ``random.Random(seed)``;
the first ``num_test`` are the test split, the train split cycles through the rest. So the test accuracy measures
addition of pairs the model never saw, not recall. Items are a pure function of ``(seed, split, index)``.

A record (``split="test"``, index 0, seed 0) looks like::

    Example(id="arith-test-0", media=[], question="What is 97 + 70? Output the thinking process in <think> </think>
            and final answer (number) in <answer> </answer> tags.", answer=167, meta={"a": 97, "b": 70})

and its gold completion is ``<think>7+0=7 9+7=16</think><answer>167</answer>``.

Rewards: ``accuracy`` (the ``<answer>`` holds exactly the sum, :func:`mmgpg.task.rewards.integer_accuracy`; the
steps in ``<think>`` are not checked) and ``format`` (``<think>…</think><answer>…</answer>``, the GPG authors' rule on
the stripped completion, as ``shapes``).
The judge (``mmgpg eval``) decides on the same exact integer match under both protocols: there is no quirk of an
anchor to reproduce, this task is mmgpg's own.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import ClassVar

from mmgpg.task import Example, GeneratedTask
from mmgpg.task.judges import Judgement, check_protocol
from mmgpg.task.rewards import extract_answer, format_reward, integer_accuracy, parse_int

QUESTION = (
    "What is {a} + {b}? Output the thinking process in <think> </think> and final answer (number) in "
    "<answer> </answer> tags."
)

_OPERANDS = re.compile(r"What is (\d+) \+ (\d+)\?")


def pair_order(seed: int, max_operand: int) -> list[tuple[int, int]]:
    """Every ordered pair ``(a, b)`` with ``0 <= a, b <= max_operand``, shuffled by ``random.Random(seed)``."""
    pairs = [(a, b) for a in range(max_operand + 1) for b in range(max_operand + 1)]
    random.Random(seed).shuffle(pairs)
    return pairs


def column_steps(a: int, b: int) -> str:
    """Column addition written out, units first: one ``x+y=s`` per digit position, ``x+y+1=s`` after a carry.

    >>> column_steps(97, 70), column_steps(55, 45), column_steps(31, 8), column_steps(0, 0)
    ('7+0=7 9+7=16', '5+5=10 5+4+1=10', '1+8=9 3+0=3', '0+0=0')
    """
    steps, carry = [], 0
    while True:
        x, y = a % 10, b % 10
        s = x + y + carry
        steps.append(f"{x}+{y}" + ("+1" if carry else "") + f"={s}")
        a, b, carry = a // 10, b // 10, s // 10
        if a == 0 and b == 0:
            return " ".join(steps)


@dataclass
class ArithTask(GeneratedTask):
    """Add two numbers of at most ``max_operand`` (embedded; no downloads). Test pairs never occur in training."""

    name: ClassVar[str] = "arith"
    version: ClassVar[str] = "1"
    protocols: ClassVar[tuple[str, ...]] = ("paper", "strict")
    rewards: ClassVar[dict] = {}  # set per instance in __post_init__: {"accuracy": fn, "format": fn}

    num_train: int = 4000
    """Items in the train split (they cycle through the pairs that are not test pairs)."""
    num_test: int = 300
    """Items (distinct pairs) in the test split."""
    max_operand: int = 99
    """Largest operand; 99 gives one- and two-digit numbers."""
    seed: int = 0
    """Data seed: which pairs are test pairs, and the order of the train pairs."""
    format_reward: bool = True
    """Include the format reward (<think>...</think><answer>...</answer>) besides accuracy."""

    def __post_init__(self):
        if not 1 <= self.max_operand <= 999:
            raise ValueError(f"max_operand must be between 1 and 999; got {self.max_operand}")
        pairs = (self.max_operand + 1) ** 2
        if self.num_test < 1 or self.num_train < 1 or self.num_test >= pairs:
            raise ValueError(f"need num_train >= 1 and 1 <= num_test < {pairs} (the number of pairs with max_operand="
                             f"{self.max_operand}, so some are left for training); got num_train={self.num_train}, "
                             f"num_test={self.num_test}")
        self._pairs = pair_order(self.seed, self.max_operand)
        self.rewards = {"accuracy": lambda completion, ex: integer_accuracy(completion, ex.answer)}
        if self.format_reward:
            self.rewards["format"] = lambda completion, ex: format_reward(completion.strip())

    def pair(self, split: str, index: int) -> tuple[int, int]:
        """The operands of item ``index`` of ``split``: test items are the first ``num_test`` shuffled pairs, train
        items cycle through the others."""
        self.check_item(split, index)
        if split == "test":
            return self._pairs[index]
        rest = len(self._pairs) - self.num_test
        return self._pairs[self.num_test + index % rest]

    def example(self, split: str, index: int) -> Example:
        a, b = self.pair(split, index)
        return Example(id=f"arith-{split}-{index}", media=[], question=QUESTION.format(a=a, b=b), answer=a + b,
                       meta={"a": a, "b": b})

    def prompt(self, example: Example) -> list[dict]:
        return [{"role": "user", "content": example.question}]

    def judge(self, completion: str, example: Example, protocol: str) -> Judgement:
        """Correct iff the first ``<answer>`` holds exactly the sum (``" 82 "`` and ``"82."`` count; ``"82 or 83"``,
        ``"eighty-two"``, an empty or missing tag do not, the last three as parse failures). Both protocols."""
        check_protocol(protocol)
        extracted = extract_answer(completion)
        value = parse_int(extracted)
        return Judgement(correct=float(value is not None and value == example.answer), extracted=extracted or "",
                         parse_failure=value is None)

    def example_from_record(self, record: dict) -> Example:
        """An example from a predictions row (``id``, ``question``, ``ground_truth``), for ``mmgpg eval --predictions``."""
        if record.get("ground_truth") is None or parse_int(str(record["ground_truth"])) is None:
            raise ValueError(f"arith predictions: record {record.get('id')!r} needs an integer ground_truth")
        question = str(record.get("question", ""))
        found = _OPERANDS.search(question)
        meta = {"a": int(found[1]), "b": int(found[2])} if found else {}
        return Example(id=str(record.get("id", "")), media=[], question=question,
                       answer=parse_int(str(record["ground_truth"])), meta=meta)

    def success(self, completion: str, example: Example, rewards) -> bool:
        """The accuracy reward is 1 (the right sum)."""
        return rewards["accuracy"] >= 1.0

    def gold_completion(self, example: Example) -> str:
        """The answer in the task's output format (used by SFT and pre-flight checks)."""
        if "a" not in example.meta:  # rebuilt from a record whose question does not name the operands
            return f"<answer>{example.answer}</answer>"
        return f"<think>{column_steps(example.meta['a'], example.meta['b'])}</think><answer>{example.answer}</answer>"
