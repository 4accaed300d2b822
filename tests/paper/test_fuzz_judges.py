"""Every reward and judge on >= 10,000 random and adversarial strings: no exception, each call under a time bound."""

from __future__ import annotations

import random
import time

import pytest

from mmgpg.task import build_task

# Catastrophic regex backtracking on these 10^4..10^5-character strings takes minutes to hours, so generous bounds
# still catch it while staying far above what a loaded 2-core machine adds. Pure-Python rewards and judges are timed
# in this process's CPU seconds (time.process_time: other processes' load does not count); math-verify runs in the
# isolated worker process, so those calls are timed on the wall clock against the worker's own hard outer bound.
PURE_BOUND_S = 5.0  # CPU seconds for a pure-Python reward on a 100k-character string (the slowest measured: 0.004 s)
MATH_BOUND_S = 30.0  # wall seconds for a math-verify call: its own 5 s alarms plus the worker's hard outer bound

ADVERSARIAL = [
    "", " ", "\n" * 1000, "<answer>" * 20_000, "</answer>" * 20_000, "<think>" + "</think>" * 10_000,
    "<think>" + "</think> " * 5000 + "<answer>" + "x" * 50_000, "(" * 50_000, "(1," * 30_000, "[" + "1," * 40_000,
    "9" * 100_000, "1" * 5000 + "**" + "9" * 5000, "\\frac{" * 2000, "√{" * 3000 + "}" * 3000, "π" * 10_000,
    "<answer>" + "(" + "1" * 10_000 + ",2),(3,4)</answer>", "<answer>" + " " * 50_000 + "a", "\x00\x01\ud7ff\ufffd" * 1000,
    "<answer>\n(1,2),(3,4)\n</answer>" * 2000, "<think>a</think><answer>" + "A " * 20_000 + "</answer>",
    "$" * 10_000, "\\boxed{" * 3000, "The final answer is " * 2000, "=" * 50_000 + "1",
]
PIECES = ["<think>", "</think>", "<answer>", "</answer>", "(", ")", ",", "[", "]", "A", "(B)", "left", "rose", "3",
          "140°", "√{3}", "9π", "\\frac{1}{2}", " ", "\n", "=", "$", "answer is", "-", ".", "e", "ü", "米", "0" * 12]


def random_strings(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = list(ADVERSARIAL)
    while len(out) < n:
        if rng.random() < 0.5:
            out.append("".join(rng.choice(PIECES) for _ in range(rng.randint(0, 30))))
        else:
            out.append("".join(chr(rng.randint(0, 0x2FFF)) for _ in range(rng.randint(0, 60))))
    return out


def _tasks_and_examples():
    """One example of every judged task built from records (no images needed), with both reward protocols."""
    cases = []
    for protocol in ("paper", "strict"):
        geo = build_task("geoqa", {"reward_protocol": protocol})
        cases.append((geo, geo.example_from_record({"id": "g", "ground_truth": "2√{15}米"})))
        cvb = build_task("cv_bench", {"reward_protocol": protocol})
        cases.append((cvb, cvb.example_from_record({"id": "c", "ground_truth": "(B)", "choices": ["lamp", "table"],
                                                    "category": "Depth"})))
        fg = build_task("fine_grained", {"reward_protocol": protocol})
        cases.append((fg, fg.example_from_record({"id": "f", "ground_truth": "pink primrose"})))
        lisa = build_task("lisa_grounding", {"reward_protocol": protocol})
        cases.append((lisa, lisa.example_from_record({"id": "l", "ground_truth": [10, 20, 100, 80], "width": 200,
                                                      "height": 100})))
        for kind in ("count_mc", "count", "relation", "colour", "grounding"):
            scenes = build_task("scenes", {"kind": kind, "num_train": 1, "num_test": 1, "reward_protocol": protocol})
            cases.append((scenes, scenes.load("test")[0]))
        digits = build_task("digits", {"num_test": 1, "reward_protocol": protocol})
        cases.append((digits, digits.load("test")[0]))
    return cases


def _timed(fn, *args, clock=time.process_time):
    start = clock()
    value = fn(*args)
    return value, clock() - start


@pytest.mark.parametrize("n", [2_500, pytest.param(10_000, marks=pytest.mark.slow)])  # 10k: ~100 s on 2 cores
def test_every_reward_and_judge_is_total_and_bounded(n):
    strings = random_strings(n)
    assert len(strings) == n
    uses_math = {"geoqa", "cv_bench"}
    slowest = {}
    judged = set()
    for task, example in _tasks_and_examples():
        # judges do not depend on the reward protocol: judge each task (and scenes kind) once
        key = (task.name, getattr(task, "kind", ""))
        run_judges = key not in judged
        judged.add(key)
        math_calls = task.name in uses_math or getattr(task, "kind", "") in ("count", "count_mc", "relation")
        bound = MATH_BOUND_S if math_calls else PURE_BOUND_S
        clock = time.perf_counter if math_calls else time.process_time
        for text in strings:
            for name, fn in task.rewards.items():
                value, took = _timed(fn, text, example, clock=clock)
                assert isinstance(value, float) and value == value, (task.name, name, text[:80])
                assert took < bound, (task.name, name, len(text), took)
                slowest[task.name] = max(slowest.get(task.name, 0.0), took)
            for protocol in ("paper", "strict") if run_judges else ():
                decision, took = _timed(task.judge, text, example, protocol, clock=clock)
                assert 0.0 <= decision.correct <= 1.0 and isinstance(decision.extracted, str)
                assert took < bound, (task.name, protocol, len(text), took)
    print("slowest call per task (s):", {k: round(v, 3) for k, v in slowest.items()})


@pytest.mark.parametrize("bad", [None, 3, b"bytes", ["list"]])
def test_non_string_outputs_are_judged_not_raised(bad):
    task = build_task("scenes", {"kind": "grounding", "num_train": 1, "num_test": 1})
    example = task.load("test")[0]
    for fn in task.rewards.values():
        assert fn(bad, example) == 0.0
