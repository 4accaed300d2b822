"""``mmgpg check`` reports a task's broken rewards and success hook as findings instead of passing them: a reward
that is not a finite number (NaN poisons every advantage of its group) and a ``success()`` that returns something
other than a bool (prompt_success.jsonl and the theory diagnostics count it as a success)."""

from __future__ import annotations

from support import FIXTURE_TASKS

from mmgpg.cli import main
from mmgpg.config import resolve
from mmgpg.evaluation.preflight import preflight


def test_nan_rewards_and_a_non_bool_success_are_errors(capsys):
    findings = preflight(resolve([f"task={FIXTURE_TASKS}:MisbehavingShapes", "model=tiny"]).config, examples=1)
    errors = [f for f in findings if f.status == "error"]
    nan = [f for f in errors if "accuracy" in f.detail and "nan" in f.detail and "finite" in f.detail]
    assert {f.check.split(",")[0] for f in nan} == {"empty answer", "garbage answer", "gold answer"}
    success = [f for f in errors if "success()" in f.detail]
    assert success and all("float" in f.detail and "bool" in f.detail for f in success)
    assert main(["check", f"task={FIXTURE_TASKS}:MisbehavingShapes", "model=tiny", "--examples", "1"]) == 1


def test_a_sound_task_has_no_such_findings():
    findings = preflight(resolve(["task=shapes", "model=tiny"]).config, examples=1)
    assert not [f for f in findings if f.status == "error"], findings
    assert not [f for f in findings if "success()" in f.detail or "finite" in f.detail]
