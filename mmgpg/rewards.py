"""Reward building blocks shared by training rewards and evaluation judges.

Every function here is pure and total: any model text gives a float (or ``None`` from an extractor), never an
exception, in time linear in the text, and nothing is ever ``eval``-ed.
"""

from __future__ import annotations

import re

# The GPG authors' format rule (all three multimodal forks): re.fullmatch with DOTALL.
FORMAT_PATTERN = re.compile(r"<think>.*?</think>\s*<answer>.*?</answer>", re.DOTALL)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_INT = re.compile(r"[+-]?\d+")


def format_reward(completion: str) -> float:
    """1.0 if the whole completion is ``<think>…</think> <answer>…</answer>`` (``re.fullmatch``, DOTALL), else 0.0."""
    return 1.0 if FORMAT_PATTERN.fullmatch(completion.strip()) else 0.0


def extract_answer(completion: str) -> str | None:
    """The stripped text inside the first ``<answer>…</answer>``, or ``None`` when there is none."""
    match = _ANSWER.search(completion)
    return match.group(1).strip() if match else None


def parse_int(text: str | None) -> int | None:
    """The answer as an integer if it is exactly one integer (``" 3 "`` → 3); ``"3 or 4"``, ``""`` → ``None``."""
    if text is None:
        return None
    found = _INT.findall(text)
    if len(found) != 1 or _INT.sub("", text).strip(" .") != "":
        return None
    return int(found[0])


def integer_accuracy(completion: str, gold: int) -> float:
    """1.0 iff the ``<answer>`` holds exactly the integer ``gold`` (an empty or multi-number answer scores 0.0)."""
    value = parse_int(extract_answer(completion))
    return 1.0 if value is not None and value == gold else 0.0
