"""One traced training step: the map of it in the README is the files it really enters, and it never climbs back up
the layers (a unit calling into a unit of a higher layer of tests/meta/test_structure.py, e.g. the rollout loop
calling back into the trainer).

The trace records every call into a function of the ``mmgpg`` package or a built-in task plugin (``tasks/``, the
``task`` layer), with as caller the nearest enclosing frame of those (library frames in between, e.g. transformers'
``generate`` calling the model, are skipped). A module's first import is not counted: it depends on what ran before.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from support import REPO
from support.gradient_reference import make_trainer
from test_structure import LAYERS, unit_of

PACKAGE = REPO / "mmgpg"
TASKS = REPO / "tasks"
README_MARK = "One training step (`Trainer.train_step`) enters these files"


def _unit(path: Path) -> str | None:
    """The layer unit of a source file: ``train`` for mmgpg/train/trainer.py, ``task`` for a task plugin."""
    try:
        rel = path.resolve().relative_to(PACKAGE)
    except ValueError:
        return "task" if path.resolve().is_relative_to(TASKS) else None
    module = ".".join(("mmgpg", *rel.with_suffix("").parts))
    return unit_of(module.removesuffix(".__init__"))


def trace_step(trainer) -> tuple[list[tuple[str, str, str]], set[str]]:
    """``(climbs, files)``: every call from a unit into a unit of a higher layer (caller file, callee file, callee
    function), and every file of mmgpg or of a task plugin the step entered (relative to the repository)."""
    rank = {unit: i for i, units in enumerate(LAYERS) for unit in units}
    climbs: list[tuple[str, str, str]] = []
    files: set[str] = set()
    cache: dict[str, str | None] = {}

    def unit(filename: str) -> str | None:
        if filename not in cache:
            cache[filename] = _unit(Path(filename)) if filename.endswith(".py") else None
        return cache[filename]

    start = sys._getframe()

    def importing(frame) -> bool:
        """A module body (or a class in it) runs between this call and the trace's start: an import."""
        while frame is not None and frame is not start:
            if frame.f_code.co_name == "<module>":
                return True
            frame = frame.f_back
        return False

    def profile(frame, event, arg):
        if event != "call":
            return
        callee = unit(frame.f_code.co_filename)
        if callee is None or importing(frame):  # a module's first import (its body, its classes) is not the step
            return
        files.add(str(Path(frame.f_code.co_filename).resolve().relative_to(REPO)))
        caller = frame.f_back
        while caller is not None and unit(caller.f_code.co_filename) is None:
            caller = caller.f_back
        if caller is None:
            return
        up = unit(caller.f_code.co_filename)
        if rank[callee] > rank[up]:
            climbs.append((str(Path(caller.f_code.co_filename).resolve().relative_to(REPO)),
                           str(Path(frame.f_code.co_filename).resolve().relative_to(REPO)), frame.f_code.co_name))

    sys.setprofile(profile)
    try:
        trainer.train_step()
    finally:
        sys.setprofile(None)
    return climbs, files


def readme_step_files() -> set[str]:
    """The files the README's map of one step lists (backquoted paths after :data:`README_MARK`, up to the next
    blank line), as repository paths (``tasks/<plugin>.py`` for the task plugin)."""
    text = (REPO / "README.md").read_text()
    paragraph = text[text.index(README_MARK):].split("\n\n", 1)[0]
    return {p if p.startswith("tasks/") else f"mmgpg/{p}" for p in re.findall(r"`([\w/]+\.py)`", paragraph)
            if not p.startswith("tests/")}


def test_one_step_climbs_back_up_never_and_enters_the_files_the_readme_lists(tiny_dirs, tmp_path):
    trainer = make_trainer(str(tiny_dirs["qwen2_vl"]), str(tmp_path / "run"), "gpg", "train.prompts_per_step=2",
                           "rollout.group_size=2", "rollout.max_new_tokens=6", "algo.max_resample_attempts=1")
    climbs, files = trace_step(trainer)
    assert not climbs, f"a step climbs back up the layers: {climbs}"
    assert "mmgpg/train/trainer.py" in files and "mmgpg/models/logprobs.py" in files  # the trace saw the step
    listed = readme_step_files()
    assert files == listed, (f"the README's map of one step is out of date: entered but not listed "
                             f"{sorted(files - listed)}, listed but not entered {sorted(listed - files)}")


def test_the_trace_sees_a_climb_back_up(tiny_dirs, tmp_path, monkeypatch):
    """A rollout that calls back into the trainer (what the step did before the rollout producer) is a climb."""
    trainer = make_trainer(str(tiny_dirs["qwen2_vl"]), str(tmp_path / "run"), "gpg", "train.prompts_per_step=2",
                           "rollout.group_size=2", "rollout.max_new_tokens=6", "algo.max_resample_attempts=1")
    from mmgpg.rollout import producer

    real = producer.sample_groups

    def calling_back(*args, **kwargs):
        trainer.padding_positions([])  # the rollout asking the trainer something
        return real(*args, **kwargs)

    monkeypatch.setattr(producer, "sample_groups", calling_back)
    climbs, _ = trace_step(trainer)
    assert any(callee == "mmgpg/train/trainer.py" for _, callee, _ in climbs), climbs
