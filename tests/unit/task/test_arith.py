"""The embedded text task ``arith`` (tasks/arith.py): data, splits, rewards, judge, gold completions."""

from __future__ import annotations

import pytest

from mmgpg.config import ConfigError
from mmgpg.evaluation.run import judge_output
from mmgpg.task import TASKS, build_task, task_rewards


def item(task, a: int, b: int):
    """The example asking for ``a + b`` (rebuilt from a predictions row, as ``mmgpg eval --predictions`` does)."""
    from mmgpg_tasks.arith import QUESTION

    return task.example_from_record({"id": f"{a}+{b}", "question": QUESTION.format(a=a, b=b), "ground_truth": a + b})


def test_arith_is_a_registered_text_task_with_a_config():
    from mmgpg.config import resolve

    assert TASKS.describe("arith") == "mmgpg_tasks.arith:ArithTask"
    cfg = resolve(["task=arith", "model=tiny_qwen2"]).config
    assert cfg.task.name == "arith" and cfg.rollout.max_new_tokens == 48


def test_items_are_a_pure_function_of_seed_split_index():
    a, b = build_task("arith", {"seed": 3}), build_task("arith", {"seed": 3})
    assert [(e.id, e.question, e.answer, e.meta) for e in a.load("train")[:50]] == \
        [(e.id, e.question, e.answer, e.meta) for e in b.load("train")[:50]]
    assert [e.meta for e in a.load("test")[:20]] != [e.meta for e in build_task("arith", {"seed": 4}).load("test")[:20]]
    ex = a.load("test")[7]
    assert ex.id == "arith-test-7" and ex.images == [] and ex.answer == ex.meta["a"] + ex.meta["b"]
    assert ex.question.startswith(f"What is {ex.meta['a']} + {ex.meta['b']}? ")


def test_splits_share_no_pair_and_cover_both_operand_sizes():
    task = build_task("arith", {"num_train": 9700, "num_test": 300})
    test = {(e.meta["a"], e.meta["b"]) for e in task.load("test")}
    train = {(e.meta["a"], e.meta["b"]) for e in task.load("train")}
    assert len(test) == 300 and len(train) == 9700          # every item a distinct pair ...
    assert not test & train and len(test | train) == 100 ** 2  # ... and together all 10,000 pairs, none in both
    assert {a < 10 for a, _ in test} == {True, False} and max(a + b for a, b in test) <= 198
    # the train split cycles through the non-test pairs when it asks for more items than there are
    long = build_task("arith", {"num_train": 9701, "num_test": 300})
    assert long.load("train")[9700].meta == long.load("train")[0].meta


def test_bad_options_and_indices_are_clear_errors():
    with pytest.raises(ConfigError, match="num_test"):
        build_task("arith", {"max_operand": 9, "num_test": 100})  # 100 pairs: none left for training
    with pytest.raises(ConfigError, match="max_operand"):
        build_task("arith", {"max_operand": 0})
    task = build_task("arith", {"num_test": 5})
    with pytest.raises(ValueError, match="splits train, test"):
        task.load("validation")
    with pytest.raises(IndexError, match="arith/test has 5 items"):
        task.example("test", 5)


@pytest.mark.parametrize("a,b,steps", [
    (97, 70, "7+0=7 9+7=16"),       # no carry into the tens; a carry out of them
    (55, 45, "5+5=10 5+4+1=10"),    # a carry at both columns: 100
    (31, 8, "1+8=9 3+0=3"),         # a one-digit operand is padded with 0
    (8, 31, "8+1=9 0+3=3"),
    (0, 0, "0+0=0"),
    (9, 9, "9+9=18"),
])
def test_gold_completion_writes_column_addition(a, b, steps):
    task = build_task("arith")
    ex = item(task, a, b)
    gold = task.gold_completion(ex)
    assert gold == f"<think>{steps}</think><answer>{a + b}</answer>"
    assert task_rewards(task, gold, ex) == {"accuracy": 1.0, "format": 1.0, "total": 2.0}
    assert task.success(gold, ex, task_rewards(task, gold, ex)) is True


@pytest.mark.parametrize("completion,accuracy,fmt,extracted,parse_failure", [
    ("<think>2+5=7 6+4=10</think><answer>107</answer>", 1.0, 1.0, "107", False),
    ("<think>x</think><answer> 107. </answer>", 1.0, 1.0, "107. ", False),
    ("<think>x</think><answer>106</answer>", 0.0, 1.0, "106", False),     # off by one
    ("<think>x</think><answer>17</answer>", 0.0, 1.0, "17", False),       # carry dropped
    ("<answer>107</answer>", 1.0, 0.0, "107", False),                     # right sum, no <think>
    ("<think>x</think><answer>107 or 108</answer>", 0.0, 1.0, "107 or 108", True),  # hedging
    ("<think>x</think><answer></answer>", 0.0, 1.0, "", True),            # the empty-answer hack
    ("<think>x</think><answer>one hundred seven</answer>", 0.0, 1.0, "one hundred seven", True),
    ("107", 0.0, 0.0, "", True),                                          # no tags
    ("<think>x</think><answer>108</answer><answer>107</answer>", 0.0, 1.0, "108", False),  # the first answer counts
])
def test_rewards_and_judge_on_hand_written_outputs(completion, accuracy, fmt, extracted, parse_failure):
    task = build_task("arith")
    ex = item(task, 62, 45)
    assert ex.answer == 107 and ex.meta == {"a": 62, "b": 45}
    assert task_rewards(task, completion, ex) == {"accuracy": accuracy, "format": fmt, "total": accuracy + fmt}
    for protocol in ("paper", "strict"):
        j = task.judge(completion, ex, protocol)
        assert (j.correct, j.extracted.strip(), j.parse_failure) == (accuracy, extracted.strip(), parse_failure)
    record = judge_output(task, completion, ex, "paper")
    assert record["correct"] == accuracy and record["parse_failure"] == float(parse_failure)
    with pytest.raises(ValueError, match="unknown protocol"):
        task.judge(completion, ex, "lenient")


def test_aggregate_counts_accuracy_and_parse_failures():
    task = build_task("arith")
    ex = task.load("test")[0]
    outs = [task.gold_completion(ex), "<think>x</think><answer>-1</answer>", "nothing"]
    metrics = task.aggregate([judge_output(task, o, ex, "paper") for o in outs])
    assert metrics == {"accuracy": pytest.approx(1 / 3), "parse_failures": 1.0}


def test_without_format_reward_and_predictions_round_trip():
    task = build_task("arith", {"format_reward": False})
    ex = task.load("test")[3]
    assert set(task.rewards) == {"accuracy"}
    again = task.example_from_record({"id": ex.id, **task.record_fields(ex)})
    assert (again.answer, again.meta) == (ex.answer, ex.meta)
    assert task.gold_completion(again) == task.gold_completion(ex)
    with pytest.raises(ValueError, match="integer ground_truth"):
        task.example_from_record({"id": "x", "ground_truth": "many"})


def test_prompt_is_text_only_and_the_tiny_text_tokenizer_spells_every_digit():
    from mmgpg.models.load import load_policy

    task = build_task("arith")
    ex = task.load("test")[0]
    assert task.prompt(ex) == [{"role": "user", "content": ex.question}]
    tok = load_policy("tiny:qwen2", dtype="float32", device="cpu").processor
    gold = task.gold_completion(ex)
    assert tok.decode(tok(gold)["input_ids"]) == gold
    # Qwen2's pre-tokenizer splits numbers into single digits: every sum is spelt with the same 10 digit tokens
    assert [tok.decode([i]) for i in tok(str(ex.answer))["input_ids"]] == list(str(ex.answer))
