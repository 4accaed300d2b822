"""Differential tests: the ``paper`` *training* rewards of the four VL families against the GPG authors' own reward
functions, executed from a mirror of their repository at test time (``support.authors_rewards``: only the named
functions, their helpers and their ``re``/``os``/``datetime``/``math_verify`` imports run — nothing is copied), on
thousands of procedural and hand-written adversarial completions (``support.reward_corpus``).

Each family's examples are built by the task itself from records in the authors' schema (the solution string their
reward receives is the one their script builds), and the rewards compared are what mmgpg trains with:
``task_rewards`` under ``task.reward_protocol=paper`` — ``accuracy`` and ``format`` — against their
``accuracy_reward`` and ``format_reward``, value for value (equal floats, not close ones). Each test also checks that
its corpus reaches the quirks it guards, and the LISA test that ``strict`` stays inside [0, 2] where ``paper``
leaves it.

Skipped without a mirror (``git clone --bare https://github.com/AMAP-ML/GPG .gpg-mirror``, or ``MMGPG_GPG_MIRROR``).
"""

from __future__ import annotations

import json
import math

import pytest
from PIL import Image
from support.authors_rewards import load
from support.reward_corpus import classification_corpus, geoqa_corpus, lisa_corpus, sat_corpus

from mmgpg.task import build_task, task_rewards
from mmgpg.task.data import shipped
from mmgpg.task.rewards import box_iou

N = 1500
IMAGE = Image.new("RGB", (28, 28), (120, 30, 200))
FILES = {
    "geoqa": "R1-V/src/r1-v/src/open_r1/grpo.py",
    "cv_bench": "VisualThinker-R1-Zero/src/open-r1-multimodal/src/open_r1/grpo.py",
    "fine_grained": "Visual-RFT/src/virft/src/open_r1/grpo_classification.py",
    "lisa_grounding": "Visual-RFT/src/virft/src/open_r1/grpo_lisa.py",
}


@pytest.fixture(autouse=True)
def _no_debug_log(monkeypatch):
    monkeypatch.delenv("DEBUG_MODE", raising=False)  # their rewards append to LOG_PATH when DEBUG_MODE=true


def authors(family: str) -> dict:
    functions = load(FILES[family], ("accuracy_reward", "format_reward"))
    if functions is None:
        pytest.skip("no clone of the GPG authors' repository: `git clone --bare https://github.com/AMAP-ML/GPG "
                    ".gpg-mirror` or set MMGPG_GPG_MIRROR to one")
    return functions


def compare(task, theirs, items, *, as_strings: bool = False, non_finite: list | None = None) -> list[tuple]:
    """``[(completion, solution, ours, theirs)]`` for every item ``(example, solution, completion)`` whose
    ``accuracy`` or ``format`` differs from the authors' (their functions get one completion per call, as a chat
    message list — or, ``as_strings``, as the plain string their base-model path receives). Where their accuracy
    is not a finite number (LISA's overflowing areas), ours must be 0.0 and the item goes to ``non_finite``."""
    bad = []
    for example, solution, completion in items:
        ours = task_rewards(task, completion, example)
        batch = [completion] if as_strings else [[{"role": "assistant", "content": completion}]]
        want = {"accuracy": theirs["accuracy_reward"](batch, [solution])[0], "format": theirs["format_reward"](batch)[0]}
        got = {k: ours[k] for k in want}
        if non_finite is not None and not math.isfinite(want["accuracy"]):
            non_finite.append(completion)
            want["accuracy"] = 0.0
        if got != want:
            bad.append((completion, solution, got, want))
    return bad


def test_geoqa_paper_rewards_equal_the_authors():
    theirs = authors("geoqa")
    task = build_task("geoqa", {"reward_protocol": "paper"})
    pairs = geoqa_corpus(N)
    items = [(task.example("train", i, {"image": IMAGE, "problem": "p", "solution": s}), s, c)
             for i, (s, c) in enumerate(pairs)]
    bad = compare(task, theirs, items)
    assert not bad, f"{len(bad)} of {len(items)} differ, e.g. {bad[:3]}"
    accuracy = [theirs["accuracy_reward"]([[{"content": c}]], [s])[0] for s, c in pairs[:600]]
    assert 0.1 < sum(accuracy) / len(accuracy) < 0.9


@pytest.mark.parametrize("prompt_style", ["base", "instruct"])
def test_cv_bench_sat_paper_rewards_equal_the_authors(prompt_style):
    theirs = authors("cv_bench")
    task = build_task("cv_bench", {"reward_protocol": "paper", "prompt_style": prompt_style})
    rows = sat_corpus(N, seed=23 if prompt_style == "base" else 24)
    items = []
    for i, (options, answer, completion) in enumerate(rows):
        joined = ", ".join(options[:-1]) + " or " + options[-1]
        user = f"<image> Answer in natural language. Where is it? Choose between the following options: {joined}"
        record = {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}],
                  "images": [IMAGE]}
        items.append((task.example("train", i, record), f"<answer>{answer}</answer>", completion))
    # the base-model run gets plain strings (their format reward then prepends "<think>"), the instruct one messages
    bad = compare(task, theirs, items, as_strings=prompt_style == "base")
    assert not bad, f"{len(bad)} of {len(items)} differ, e.g. {bad[:3]}"
    # quirks reached: a stored answer with whitespace or a newline around it (their ground truth is read back out of
    # the solution), and the RAVEN letter rule deciding alone
    assert sum(a != a.strip() for _, a, _ in rows) >= 50
    assert sum(task_rewards(task, c, ex)["accuracy"] == 1.0 for ex, _, c in items if ex.answer in ("C",)) >= 20


@pytest.mark.parametrize("dataset", ["oxford_flowers", "stanford_cars"])
def test_fine_grained_paper_rewards_equal_the_authors(dataset):
    theirs = authors("fine_grained")
    task = build_task("fine_grained", {"reward_protocol": "paper", "dataset": dataset})
    classes = [c.strip() for c in shipped(f"fine_grained/{dataset}.classes.txt").read_text().splitlines() if c.strip()]
    pairs = classification_corpus(classes, N // 2, seed=23 + len(classes))
    items = [(task.example("train", i, {"image": IMAGE, "problem": "p", "solution": s}), s, c)
             for i, (s, c) in enumerate(pairs)]
    bad = compare(task, theirs, items)
    assert not bad, f"{len(bad)} of {len(items)} differ, e.g. {bad[:3]}"
    empty = [c for _, _, c in items if "<answer></answer>" in c]
    assert len(empty) >= 10  # the empty-answer hack is in the corpus


# ---- LISA -----------------------------------------------------------------------------------------------------------

SIZES = [(200, 100), (640, 480), (333, 517), (1024, 768), (97, 1301), (2400, 180), (500, 500), (731, 409)]


def reasonseg(root, rng_seed: int = 5) -> None:
    """A ReasonSeg ``train/`` folder: one image + LabelMe JSON per size, a polygon target each (one degenerate)."""
    import random

    rng = random.Random(rng_seed)
    folder = root / "train"
    folder.mkdir(parents=True)
    for i, (w, h) in enumerate(SIZES):
        Image.new("RGB", (w, h), (10 * i, 80, 160)).save(folder / f"img{i}.jpg")
        x1, x2 = sorted(rng.uniform(0, w) for _ in range(2))
        y1, y2 = sorted(rng.uniform(0, h) for _ in range(2))
        if i == len(SIZES) - 1:
            x2, y2 = x1, y1
        points = [[x1, y1], [x2, y1], [x2, y2], [x1, y2], [(x1 + x2) / 2, y1]]
        record = {"text": [f"the thing number {i}"], "is_sentence": True,
                  "shapes": [{"label": "target", "shape_type": "polygon", "points": points}]}
        (folder / f"img{i}.json").write_text(json.dumps(record), encoding="utf-8")


def test_lisa_paper_rewards_equal_the_authors(tmp_path):
    theirs = authors("lisa_grounding")
    reasonseg(tmp_path)
    task = build_task("lisa_grounding", {"reward_protocol": "paper", "data_root": str(tmp_path)})
    strict = build_task("lisa_grounding", {"reward_protocol": "strict", "data_root": str(tmp_path)})
    examples = list(task.load("train"))
    golds = [tuple(int(v) for v in ex.meta["answer_text"].replace("(", "").replace(")", "").split(","))
             for ex in examples]
    corpus = lisa_corpus(golds, N)
    # the solution their script builds from gen_sft.py's answer: "<answer> " + "(x1,y1),(x2,y2)" + " </answer>"
    items = [(examples[k], f"<answer> {examples[k].meta['answer_text']} </answer>", c) for k, c in corpus]
    non_finite: list[str] = []
    bad = compare(task, theirs, items, non_finite=non_finite)
    assert not bad, f"{len(bad)} of {len(items)} differ, e.g. {bad[:3]}"
    # the one documented difference: coordinates of ~1e154 and more overflow their areas to inf/NaN; ours is 0.0
    assert 20 <= len(non_finite) <= len(items) // 10
    paper = [task_rewards(task, c, ex)["accuracy"] for ex, _, c in items]
    # the corpus reaches the quirks: the signed-area hack above 2 and below 0, exact string matches (2.0), huge
    # numbers that make their conversion raise (0 although a good box follows), and partial overlaps
    assert sum(v > 2.0 for v in paper) >= 20 and sum(v < 0.0 for v in paper) >= 20
    assert sum(v == 2.0 for v in paper) >= 30 and sum(0.5 < v < 1.9 for v in paper) >= 200
    assert sum(v == 0.0 and "9" * 312 in c for v, (_, _, c) in zip(paper, items)) >= 10
    # strict never leaves [0, 2]; its judge's IoU never leaves [0, 1]
    for ex, _, c in items[:: 3]:
        value = task_rewards(strict, c, ex)["accuracy"]
        iou = strict.judge(c, ex, "strict").correct
        assert 0.0 <= value <= 2.0 and 0.0 <= iou <= 1.0, (c, value, iou)


def test_lisa_strict_reward_is_giou_of_one_valid_box(tmp_path):
    """Hand-computed strict values on the first example, and the hacks paper pays for scoring 0 under strict."""
    reasonseg(tmp_path)
    strict = build_task("lisa_grounding", {"reward_protocol": "strict", "data_root": str(tmp_path)})
    paper = build_task("lisa_grounding", {"reward_protocol": "paper", "data_root": str(tmp_path)})
    ex = strict.load("train")[0]
    x1, y1, x2, y2 = strict._gold_units(ex)  # 0-1000 units of the 200x100 image
    inverted = f"<think>t</think><answer>({int(x2)},{int(y2)}),({int(x1)},{int(y1)})</answer>"
    hack = "<think>t</think><answer>(999,999),(0,0)</answer>"
    for completion in (inverted, hack, "<think>t</think><answer>(0,0),(0,0)</answer>"):
        assert strict.rewards["accuracy"](completion, ex) == 0.0
    assert paper.rewards["accuracy"](hack, ex) > 2.0
    # a valid box inside the gold: GIoU = IoU (the enclosing box is the gold) = its area / the gold's
    bx = (x1 + (x2 - x1) / 4, y1 + (y2 - y1) / 4, x2 - (x2 - x1) / 4, y2 - (y2 - y1) / 4)
    inner = f"<think>t</think><answer>[{bx[0]:.3f},{bx[1]:.3f},{bx[2]:.3f},{bx[3]:.3f}]</answer>"
    want = box_iou(tuple(round(v, 3) for v in bx), (x1, y1, x2, y2)) + 1.0
    assert strict.rewards["accuracy"](inner, ex) == pytest.approx(want, abs=1e-12)
    assert want == pytest.approx(1.25, abs=1e-3)  # (1/2)^2 of the gold's area
