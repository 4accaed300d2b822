"""Differential tests of the ``video_r1`` task against Video-R1's own code, executed from a mirror of
github.com/tulerfeng/Video-R1 at test time (``support.authors_rewards``: only the named functions and their
helpers run, nothing is copied): the ``paper`` training rewards against their ``accuracy_reward`` and
``format_reward`` (``src/r1-v/src/open_r1/grpo.py``), and the ``paper`` judge against their ``reward_fn``
(``src/eval_bench.py``, defined inside its loop over benchmarks), value for value, on procedural and hand-written
completions of every problem type (the corpus layouts of the GPG families' differential tests). Also: the strict protocol closes the one reward hack found (``nan`` for a
regression item scores 1.0 in theirs).

Skipped without a mirror (``git clone --bare https://github.com/tulerfeng/Video-R1 .video-r1-mirror``, or
``MMGPG_VIDEO_R1_MIRROR``).
"""

from __future__ import annotations

import random

import pytest
from support.authors_rewards import load, video_r1_mirror
from support.judge_corpus import wrap
from support.reward_corpus import adversarial

from mmgpg.task import Example, build_task, task_rewards

pytest.importorskip("rouge_score")

TYPES = ("multiple choice", "numerical", "OCR", "free-form", "regression")
GOLDS = {"multiple choice": ["A", "B", "D"], "numerical": ["3", "3.14", "1,250", "0.5", "-2"],
         "OCR": ["STOP", "the quick brown fox", "EXIT 12"], "free-form": ["a man opens the door", "red car"],
         "regression": ["10", "2.5", "0", "1,200", "0.004"]}
ANSWERS = ["A", "B", " A ", "a", "A.", "(A)", "3", "3.0", "3.14", "3.141", "3.145", "1,250", "1250", "1,250.00", "0.5",
           ".5", "-2", "- 2", "10", "9", "11.5", "0", "0.0", "nan", "NaN", "inf", "-inf", "1e3", "1_000", "2.5",
           "1e400", "8", "12", "2.2", "2.6", "2.9", "0.0045", "0.003", "1,150", "1300", "STOP", "stop", "the quick brown fox", "quick brown", "EXIT 12", "a man opens the door",
           "the man opens a door", "red car", "a red car", "", "  ", "twelve", "0.004", "0.0041", "1,200", "1200.0"]


def corpus(n: int = 3000) -> list[tuple[str, str, str]]:
    """(problem type, gold, completion) triples: random types, golds and answers in the judge corpus' layouts
    (``support.judge_corpus.wrap``: think/answer, bare, several/unclosed/nested tags, Unicode whitespace, ...), then
    every gold's answers in the hand-written adversarial layouts (``support.reward_corpus.adversarial``)."""
    rng = random.Random(0)
    out = []
    for _ in range(n):
        ptype = rng.choice(TYPES)
        gold = rng.choice(GOLDS[ptype])
        out.append((ptype, gold, wrap(rng, rng.choice(ANSWERS + GOLDS[ptype] * 3), decoy=rng.choice(ANSWERS))))
    for ptype in TYPES:
        for gold in GOLDS[ptype]:
            x = float(gold.replace(",", "")) if ptype in ("numerical", "regression") else 1.0
            near = [f"{x * 0.8:g}", f"{x * 1.15:g}"]  # partial MRA / relative scores
            out += [(ptype, gold, c) for c in adversarial([gold, "nan", "1e400", gold + ".0", *near])]
    return out


def theirs() -> tuple[dict, dict]:
    repo = video_r1_mirror()
    if repo is None:
        pytest.skip("no clone of Video-R1: `git clone --bare https://github.com/tulerfeng/Video-R1 .video-r1-mirror` "
                    "or set MMGPG_VIDEO_R1_MIRROR to one")
    train = load("src/r1-v/src/open_r1/grpo.py", ("accuracy_reward", "format_reward"), repo=repo,
                 modules=frozenset({"rouge_score"}))
    evaluation = load("src/eval_bench.py", ("reward_fn",), repo=repo, modules=frozenset({"torch"}), in_loops=True)
    return train, evaluation


def example(task, ptype: str, gold: str) -> Example:
    return Example(id="x", media=[], question="q", answer=gold, meta={"problem_type": ptype, "data_source": ""})


def test_training_rewards_equal_video_r1s(monkeypatch, capsys):
    monkeypatch.delenv("DEBUG_MODE", raising=False)
    train, _ = theirs()
    task = build_task("video_r1", {"reward_protocol": "paper"})
    bad, seen = [], set()
    for ptype, gold, completion in corpus():
        ours = task_rewards(task, completion, example(task, ptype, gold))
        solution = f"<answer>{gold}</answer>"
        want_acc = train["accuracy_reward"]([[{"content": completion}]], [solution], problem_type=[ptype])[0]
        want_fmt = train["format_reward"]([[{"content": completion}]])[0]
        if ours["accuracy"] != want_acc or ours["format"] != want_fmt:
            bad.append((ptype, gold, completion, ours, want_acc, want_fmt))
        seen.add((ptype, 0.0 < want_acc < 1.0))
    capsys.readouterr()  # their normalize_number prints on every non-number
    assert not bad, bad[:5]
    # the corpus reaches graded scores of every graded type (OCR, free-form, regression)
    assert {("OCR", True), ("free-form", True), ("regression", True)} <= seen


def test_judge_equals_video_r1s_evaluation(capsys):
    _, evaluation = theirs()
    task = build_task("video_r1")
    bad, graded = [], 0
    for ptype, gold, completion in corpus():
        ours = task.judge(completion, example(task, ptype, gold), "paper").correct
        want = evaluation["reward_fn"]({"solution": f"<answer>{gold}</answer>"}, completion, ptype)
        if ours != want and not (want != want and ours == 0.0):  # their NaN (float32 overflow) is our 0
            bad.append((ptype, gold, completion, ours, want))
        graded += 0.0 < want < 1.0
    capsys.readouterr()
    assert not bad, bad[:5]
    assert graded > 10, "the corpus must reach partial MRA scores"


def test_strict_closes_the_nan_hack():
    paper, strict = build_task("video_r1", {"reward_protocol": "paper"}), build_task("video_r1")
    hack = "<think>x</think><answer>nan</answer>"
    ex = example(paper, "regression", "10")
    assert task_rewards(paper, hack, ex)["accuracy"] == 1.0  # Video-R1's rule: max(0.0, nan) == 0.0
    assert task_rewards(strict, hack, ex)["accuracy"] == 0.0
    assert task_rewards(strict, "<think>x</think><answer>9</answer>", ex)["accuracy"] == pytest.approx(0.9)
    inf = example(paper, "numerical", "inf")
    assert task_rewards(paper, "<answer>inf</answer>", inf)["accuracy"] == 1.0
    assert task_rewards(strict, "<answer>inf</answer>", inf)["accuracy"] == 0.0


def _their_templates(path: str) -> tuple[str, dict]:
    """QUESTION_TEMPLATE and TYPE_TEMPLATE as assigned (anywhere) in one of Video-R1's files: literals, read with
    ast.literal_eval, nothing executed."""
    import ast

    from support.authors_rewards import source

    found = {}
    for node in ast.walk(ast.parse(source(path, video_r1_mirror()))):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id in ("QUESTION_TEMPLATE", "TYPE_TEMPLATE"):
                found[node.targets[0].id] = ast.literal_eval(node.value)
    return found["QUESTION_TEMPLATE"], found["TYPE_TEMPLATE"]


def test_prompts_are_video_r1s(tmp_path):
    """Each record's prompt text is the one Video-R1 builds: grpo.py's template for training, eval_bench.py's for the
    benchmarks (they differ by a few words), the options appended their way, the per-type sentence after."""
    from support.video_r1_fixture import RECORDS, write_video_r1

    theirs()  # skips without the mirror
    paths = write_video_r1(tmp_path)
    task = build_task("video_r1", {"train_data": str(paths["train"]), "eval_data": str(paths["eval"])})
    for split, path in (("train", "src/r1-v/src/open_r1/grpo.py"), ("test", "src/eval_bench.py")):
        template, per_type = _their_templates(path)
        records = RECORDS if split == "train" else [r for r in RECORDS if r["problem_type"] in
                                                    ("multiple choice", "numerical", "regression")]
        for record, ex in zip(records, task.load(split)):
            question = record["problem"]
            if record["problem_type"] == "multiple choice":
                question += "Options:\n" + "".join(op + "\n" for op in record["options"])
            want = template.format(Question=question) + per_type[record["problem_type"]]
            [turn] = task.prompt(ex)
            assert turn["content"][-1] == {"type": "text", "text": want}, (split, record["problem_id"])
            assert turn["content"][0]["type"] == record["data_type"]  # the media part first, as theirs
