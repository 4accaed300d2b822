"""The examples in docstrings (``>>>``) are run: each module below with at least the given number of examples (so
a module whose examples were deleted or no longer collected fails too)."""

import doctest
import importlib

import pytest

MODULES = {
    "mmgpg.models.logprobs": 3,
    "mmgpg.models.text": 2,  # positions, pack_rows
    "mmgpg.models.lora": 4,
    "mmgpg_tasks.arith": 1,
    "mmgpg.rollout.check": 5,
    "mmgpg.rollout.collect": 3,  # length_ordered, plan_micro_batches, padding_counts
    "mmgpg.models.batch": 2,  # join_vision
    "mmgpg.models.qwen_vl": 1,  # split_media
    "mmgpg.rollout.vllm_channel": 3,
    "mmgpg.rollout.vllm_core": 2,
    "mmgpg.evaluation.budget": 2,  # sample_units
    "mmgpg.task.mathjudge": 2,  # final_boxes
}


@pytest.mark.parametrize(("name", "least"), MODULES.items(), ids=list(MODULES))
def test_doctests(name, least):
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted >= least and result.failed == 0, name
