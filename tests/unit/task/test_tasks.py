"""Task registry (entry points, file:Class), the embedded shapes task and the reward helpers."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmgpg.config import ConfigError
from mmgpg.task import TASKS, Example, TaskNotFound, build_task, find_task_class, task_rewards
from mmgpg.task.rewards import extract_answer, format_reward, integer_accuracy, parse_int


def test_builtin_tasks_are_entry_points_of_mmgpg_tasks():
    from importlib.metadata import entry_points

    assert {ep.name: ep.value for ep in entry_points(group="mmgpg.tasks")}["shapes"] == "mmgpg_tasks.shapes:ShapesTask"
    assert TASKS.describe("shapes") == "mmgpg_tasks.shapes:ShapesTask"  # the one registry reads them
    cls = find_task_class("shapes")
    assert cls.__module__ == "mmgpg_tasks.shapes"


def test_unknown_task_lists_available_and_suggests():
    with pytest.raises(TaskNotFound) as info:
        find_task_class("shaeps")
    listed = str(info.value).split("available: ", 1)[1].split("; or give", 1)[0].split(", ")
    assert listed == sorted(listed)
    assert {"cv_bench", "digits", "fine_grained", "geoqa", "lisa_grounding", "scenes", "shapes", "math",
            "math_500", "aime24", "arith"} <= set(listed)
    assert "Did you mean 'shapes'?" in str(info.value)


USER_TASK = '''
from dataclasses import dataclass
from typing import ClassVar
from mmgpg.task import Example, Task

@dataclass
class Parity(Task):
    name: ClassVar[str] = "parity"
    version: ClassVar[str] = "0"
    size: int = 4
    """How many items."""

    def __post_init__(self):
        self.rewards = {"accuracy": lambda c, ex: float(c.strip() == ex.answer)}

    def load(self, split):
        return [Example(id=str(i), media=[], question=f"Is {i} even?", answer="yes" if i % 2 == 0 else "no")
                for i in range(self.size)]

    def prompt(self, example):
        return [{"role": "user", "content": [{"type": "text", "text": example.question}]}]
'''


def test_task_from_a_local_file(tmp_path):
    path = tmp_path / "my_task.py"
    path.write_text(USER_TASK)
    task = build_task(f"{path}:Parity", {"size": 3})
    items = task.load("train")
    assert [ex.answer for ex in items] == ["yes", "no", "yes"]
    assert task_rewards(task, " yes", items[0]) == {"accuracy": 1.0, "total": 1.0}
    with pytest.raises(ConfigError, match="task.size"):
        build_task(f"{path}:Parity", {"size": "big"})
    with pytest.raises(TaskNotFound, match="Did you mean 'Parity'"):
        find_task_class(f"{path}:Parityy")
    with pytest.raises(TaskNotFound, match="does not exist"):
        find_task_class(f"{tmp_path}/none.py:X")
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(TaskNotFound, match="RuntimeError: boom"):
        find_task_class(f"{broken}:X")
    notask = tmp_path / "notask.py"
    notask.write_text("class X:\n    name = 'x'\n")
    with pytest.raises(TaskNotFound, match="does not subclass mmgpg.task.Task"):
        find_task_class(f"{notask}:X")
    halfway = tmp_path / "halfway.py"
    halfway.write_text("from mmgpg.task import Task\nclass H(Task):\n    def load(self, split):\n        return []\n")
    with pytest.raises(TaskNotFound, match="lacks name, prompt"):
        find_task_class(f"{halfway}:H")
    norewards = tmp_path / "norewards.py"
    norewards.write_text(USER_TASK.replace("self.rewards = {", "self.other = {"))
    with pytest.raises(TaskNotFound, match="has no rewards"):
        build_task(f"{norewards}:Parity")


def test_shapes_is_deterministic_and_mixes_image_sizes():
    task = build_task("shapes", {"num_train": 30, "seed": 3})
    a, b = task.load("train")[5], build_task("shapes", {"num_train": 30, "seed": 3}).load("train")[5]
    assert a.answer == b.answer and a.images[0].tobytes() == b.images[0].tobytes()
    items = task.load("train")[:30]
    assert len({ex.images[0].size for ex in items}) > 1
    assert {ex.answer for ex in items} <= set(range(1, 6)) and len({ex.answer for ex in items}) > 2
    assert task.load("train")[-1].id == "shapes-train-29"
    assert build_task("shapes", {"seed": 4}).load("train")[5].images[0].tobytes() != a.images[0].tobytes()
    with pytest.raises(ValueError, match="splits train, test"):
        task.load("validation")
    with pytest.raises(IndexError):
        task.example("train", 30)


def test_shapes_prompt_and_gold_rewards():
    task = build_task("shapes")
    ex = task.load("test")[0]
    messages = task.prompt(ex)
    assert messages[0]["content"][0] == {"type": "image", "image": ex.images[0]}
    assert "<answer> </answer>" in messages[0]["content"][1]["text"]
    assert task_rewards(task, task.gold_completion(ex), ex) == {"accuracy": 1.0, "format": 1.0, "total": 2.0}
    wrong = f"<think>x</think><answer>{ex.answer + 1}</answer>"
    assert task_rewards(task, wrong, ex) == {"accuracy": 0.0, "format": 1.0, "total": 1.0}


@pytest.mark.parametrize("text,fmt", [
    ("<think>a</think><answer>3</answer>", 1.0),
    ("<think>a\nb</think>\n\n<answer>3</answer>", 1.0),
    ("  <think>a</think><answer>3</answer>\n", 0.0),  # the paper rule: nothing outside the tags
    ("<think>a</think><answer>b</answer><answer>c</answer>", 1.0),  # ... but extra tags inside pass
    ("<answer>3</answer>", 0.0),
    ("<think>a</think><answer>3</answer> trailing", 0.0),
    ("", 0.0),
])
def test_format_reward(text, fmt):
    assert format_reward(text) == fmt


@pytest.mark.parametrize("text,gold,acc", [
    ("<answer>3</answer>", 3, 1.0),
    ("<answer> 3. </answer>", 3, 1.0),
    ("<answer>+3</answer>", 3, 1.0),
    ("<answer></answer>", 3, 0.0),  # the empty-answer hack scores nothing
    ("<answer>3 or 4</answer>", 3, 0.0),  # hedging scores nothing
    ("<answer>three</answer>", 3, 0.0),
    ("3", 3, 0.0),
    ("<answer>4</answer><answer>3</answer>", 3, 0.0),  # the first answer counts
])
def test_integer_accuracy(text, gold, acc):
    assert integer_accuracy(text, gold) == acc


def test_extractors():
    assert extract_answer("x <answer> a b </answer> y") == "a b"
    assert extract_answer("no tags") is None
    assert parse_int(None) is None and parse_int("-12") == -12 and parse_int("1 2") is None


@settings(max_examples=2000, deadline=None)  # no wall-clock bound: the machine may be loaded
@given(st.text(max_size=300), st.integers(-5, 10))
def test_rewards_are_total_on_any_text(text, gold):
    ex = Example(id="x", media=[], question="", answer=gold)
    task = build_task("shapes")
    for fn in task.rewards.values():
        assert fn(text, ex) in (0.0, 1.0)
    assert fn(f"<think>{text}</think><answer>{gold}</answer>", ex) == 1.0


def test_a_task_class_must_subclass_task(tmp_path):
    """One contract: a class with the right members that does not subclass Task is refused with the fix."""
    path = tmp_path / "duck.py"
    path.write_text(USER_TASK.replace("class Parity(Task):", "class Parity:"))
    with pytest.raises(TaskNotFound, match="does not subclass mmgpg.task.Task") as err:
        build_task(f"{path}:Parity")
    assert "class Parity(Task)" in err.value.fix


def test_a_task_subclass_gets_the_contract_defaults(tmp_path):
    """USER_TASK defines only name, load, prompt and rewards: every hook the evaluator, SFT and diagnostics call
    exists with its default."""
    from mmgpg.evaluation.run import judge_output, judged_metrics
    from mmgpg.task import Task

    path = tmp_path / "my_task.py"
    path.write_text(USER_TASK)
    task = build_task(f"{path}:Parity", {"size": 2})
    assert isinstance(task, Task) and type(task).__name__ == "Parity" and task.version == "0"
    ex = task.load("train")[0]
    assert not task.overrides("judge") and not task.overrides("success") and not task.overrides("gold_completion")
    assert task.success(" yes", ex, {"accuracy": 1.0}) is None and task.gold_completion(ex) is None
    assert task.record_fields(ex) == {"question": "Is 0 even?", "ground_truth": "yes"}
    records = [judge_output(task, text, ex, "paper") for text in (" yes", "no")]
    assert records[0] == {"correct": 1.0, "extracted": "", "rewards": {"accuracy": 1.0}}
    assert judged_metrics(task, records) == {"accuracy": 0.5}  # no judge: the mean of each reward


def test_a_judge_result_must_be_a_judgement(tmp_path):
    from mmgpg.evaluation.run import judge_output

    path = tmp_path / "my_task.py"
    path.write_text(USER_TASK + """
    def judge(self, completion, example, protocol):
        if completion == "bad":
            return 1.0
        return {"correct": float(completion.strip() == example.answer), "extracted": completion.strip(), "why": "x"}
""")
    task = build_task(f"{path}:Parity", {"size": 2})
    ex = task.load("train")[0]
    with pytest.raises(TypeError, match="got dict"):  # one return type: a dict (the old API) is refused
        judge_output(task, " yes", ex, "paper")
    with pytest.raises(TypeError, match="task 'parity' judge\\(\\) must return a mmgpg.task.judges.Judgement"):
        judge_output(task, "bad", ex, "paper")


@pytest.mark.parametrize("value", ["False", 0.5, 1, "yes", [True]])
def test_success_that_is_not_a_bool_is_an_error_not_a_silent_success(value):
    """bool("False") and bool(0.5) are True: coercing a task's success() would count such answers as successes in
    prompt_success.jsonl and the diagnostics. Training raises instead, naming the task, the value and the example."""
    import numpy as np

    from mmgpg.task import task_success

    class Returns:
        name = "returns"

        def __init__(self, out):
            self.out = out

        def success(self, completion, example, rewards):
            return self.out

    ex = Example(id="e7", media=[], question="q", answer=1)
    with pytest.raises(ValueError, match=r"'returns': success\(\) returned .* for example 'e7', not a bool or None"):
        task_success(Returns(value), "x", ex, {})
    assert task_success(Returns(np.float64(1.0) >= 1.0), "x", ex, {}) is True  # numpy's bool_
    assert task_success(Returns(False), "x", ex, {}) is False
    assert task_success(Returns(None), "x", ex, {}) is None
