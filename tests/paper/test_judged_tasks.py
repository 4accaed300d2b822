"""The task plugins on fixtures in the anchors' schemas, the judge probes of docs/anchors.md §7, and
`mmgpg eval --predictions`."""

from __future__ import annotations

import json
import random

import pytest
from mmgpg_tasks.cv_bench import R1_ZERO, sat_record
from mmgpg_tasks.fine_grained import class_names
from PIL import Image
from support import FIXTURE_TASKS

from mmgpg.cli import main
from mmgpg.evaluation.predictions import rescore
from mmgpg.task import build_task, task_rewards
from mmgpg.task.judges import choice_judge, label_judge, math_judge


def _png(path, size=(64, 48), colour=(200, 30, 30)):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(path)
    return path


# ---- §7 judge probes (paper protocol) ----------------------------------------------------------------------------


@pytest.mark.parametrize("response,choices,answer,correct", [
    ("(A)", ["left", "right"], "(A)", True),
    ("A", ["left", "right"], "(A)", True),
    ("A. left", ["left", "right"], "(A)", True),
    ("left", ["left", "right"], "(A)", True),
    ("Left", ["left", "right"], "(A)", False),
    ("The answer is B", ["left", "right"], "(A)", False),
    ("3", ["3", "2", "4", "1"], "(A)", True),
    ("(B) 2", ["3", "2", "4", "1"], "(B)", True),
    ("There are 3 chairs", ["3", "2", "4", "1"], "(A)", True),
    ("table lamp", ["lamp", "table"], "(A)", False),
    ("", ["left", "right"], "(A)", False),
])
def test_cv_bench_judge_probes(response, choices, answer, correct):
    assert choice_judge(f"<think>x</think><answer>{response}</answer>", choices, answer, "paper").correct == correct


def test_cv_bench_strict_fixes_the_quirks():
    assert choice_judge("<answer>Left</answer>", ["left", "right"], "(A)", "strict").correct == 1.0
    assert choice_judge("<answer>The answer is B</answer>", ["left", "right"], "(A)", "strict").correct == 0.0
    assert choice_judge("<answer>A or B</answer>", ["left", "right"], "(A)", "strict").correct == 0.0


def test_geoqa_judge_probes():
    # parse("<answer>140°</answer>") = [] but parse("<answer> 140° </answer>") = [140]
    assert math_judge("<answer>140°</answer>", "140°", "paper").correct == 0.0
    assert math_judge("<answer> 140° </answer>", "140°", "paper").correct == 1.0
    assert math_judge("<answer>140°</answer>", "140°", "strict").correct == 1.0
    assert math_judge("<answer> 2 </answer>", "2√{15}米", "paper").correct == 1.0  # √ collapses to 2
    assert math_judge("<answer> 2 </answer>", "2√{15}米", "strict").correct == 0.0
    assert math_judge("<answer>2√{15}</answer>", "2√{15}米", "strict").correct == 1.0


def test_geoqa_strict_success_reuses_the_accuracy_reward_it_declares_equal_to_the_judge(monkeypatch):
    """GEOQA declares accuracy_is_judge=("strict",): its strict accuracy reward must then equal the strict judge on
    every kind of output, and success must not judge the completion a second time."""
    from mmgpg.task import Example, task_rewards

    task = build_task("geoqa", {"reward_protocol": "strict"})
    outputs = ["<answer>140°</answer>", "<answer> 2 </answer>", "<think>x</think><answer>2√{15}</answer>", "", "140",
               "<answer>3</answer>", "<answer>\\frac{1}{2}</answer>"]
    for gold in ("140°", "2√{15}米", "0.5", "3"):
        ex = Example(id="g", media=[], question="q", answer=gold, meta={"ground_truth": gold})
        for out in outputs:
            assert task.accuracy_reward(out, ex, "strict") == task.judge(out, ex, "strict").correct, (out, gold)
    ex = Example(id="g", media=[], question="q", answer="3", meta={"ground_truth": "3"})
    rewards = task_rewards(task, "<answer>3</answer>", ex)
    calls = []
    monkeypatch.setattr(type(task), "judge", lambda self, *a: calls.append(a))
    assert task.success("<answer>3</answer>", ex, rewards) is True and calls == []


def test_classification_judge_probes():
    assert label_judge("<answer></answer>", "pink primrose", "paper").correct == 1.0  # the empty-answer quirk
    assert label_judge("<answer>rose</answer>", "pink primrose", "paper").correct == 1.0
    assert label_judge("pink primrose", "pink primrose", "paper").correct == 0.0  # no tag: an error in the anchor
    assert label_judge("<answer>a\npink primrose</answer>", "pink primrose", "paper").correct == 0.0  # no DOTALL
    assert label_judge("<answer></answer>", "pink primrose", "strict").correct == 0.0
    assert label_judge("<answer>Pink Primrose</answer>", "pink primrose", "strict").correct == 1.0


# ---- GEOQA --------------------------------------------------------------------------------------------------------


def test_geoqa_shipped_test_split_and_images(tmp_path):
    _png(tmp_path / "Geo170K/images/test/0.png")
    task = build_task("geoqa", {"image_root": str(tmp_path)})
    items = task.load("test")
    assert len(items) == 754
    ex = items[0]
    assert ex.answer == "140°" and ex.images[0].size == (64, 48)
    assert ex.question.endswith("is () Output the thinking process in <think> </think> and final answer (number) in "
                                "<answer> </answer> tags.")
    with pytest.raises(FileNotFoundError, match="Luckyjhg/Geo170K"):
        items[1]  # noqa: B018 - its image is not there: the error says what to download


def test_geoqa_train_from_a_local_file(tmp_path):
    image = _png(tmp_path / "a.png")
    rows = [{"image": str(image), "problem": "Find x.", "solution": "<answer> 65° </answer>"}]
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    for protocol in ("paper", "strict"):
        task = build_task("geoqa", {"train_data": str(tmp_path / "train.jsonl"), "reward_protocol": protocol})
        ex = task.load("train")[0]
        assert ex.question == "Find x.  Output the thinking process in <think> </think> and final answer (number) in <answer> </answer> tags."
        assert task_rewards(task, "<think>x</think><answer> 65 </answer>", ex) == {"accuracy": 1.0, "format": 1.0, "total": 2.0}
        assert task_rewards(task, task.gold_completion(ex), ex)["total"] == 2.0
    with pytest.raises(FileNotFoundError, match="GEOQA training data"):
        build_task("geoqa", {"train_data": str(tmp_path / "missing.jsonl")}).load("train")


def test_eval_predictions_geoqa_both_protocols(tmp_path, capsys):
    rows = [
        {"id": "0", "ground_truth": "140°", "model_output": "<think>180-40</think><answer>140</answer>"},
        {"id": "1", "ground_truth": "140°", "model_output": "<think>180-40</think><answer> 140 </answer>"},
        {"id": "2", "ground_truth": "9π", "model_output": "<think>r = 3</think><answer> 9 </answer>"},
        {"id": "3", "ground_truth": "9π", "model_output": "<think>r=3</think><answer>9π</answer>"},
        {"id": "4", "ground_truth": "2√{3}", "model_output": "<answer>2\\sqrt{3}</answer>"},
        {"id": "5", "model_output": "no ground truth: skipped and counted"},
    ]
    path = tmp_path / "pred.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    expected = {"paper": [0, 1, 1, 0, 0], "strict": [1, 1, 0, 1, 1]}
    # paper: no space before 140 -> nothing extracted; 9π collapses to 9; "r=3" is read before "9π" (no space)
    for protocol, decisions in expected.items():
        out = tmp_path / protocol
        assert main(["eval", "--task", "geoqa", "--predictions", str(path), "--protocol", protocol, "--output", str(out)]) == 0
        records = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
        assert [r["correct"] for r in records[:5]] == decisions
        assert "skipped" in records[5]
        meta = json.loads((out / "metrics.json").read_text())
        assert meta["protocol"] == protocol and meta["task"] == "geoqa" and meta["counts"]["skipped"] == 1
        assert meta["metrics"]["accuracy"] == pytest.approx(sum(decisions) / 5)
    assert main(["eval", "--task", "geoqa", "--predictions", str(path), "--protocol", "lenient"]) == 2
    assert "unknown protocol" in capsys.readouterr().err


# ---- CV-Bench / SAT -----------------------------------------------------------------------------------------------


def test_cv_bench_on_anchor_schema_fixtures(tmp_path):
    images = [_png(tmp_path / f"cv/{i}.png") for i in range(4)]
    test_rows = [
        {"idx": i, "task": task, "question": "q", "choices": choices, "answer": answer, "image": str(images[i]),
         "prompt": "q Select from the following choices.\n" + "\n".join(f"({'ABCD'[k]}) {c}" for k, c in enumerate(choices))}
        for i, (task, choices, answer) in enumerate([("Count", ["3", "2"], "(A)"), ("Relation", ["left", "right"], "(B)"),
                                                     ("Depth", ["lamp", "table"], "(A)"), ("Distance", ["1", "2"], "(B)")])
    ]
    (tmp_path / "cv.jsonl").write_text("\n".join(json.dumps(r) for r in test_rows) + "\n")
    _png(tmp_path / "sat/SAT_images_train/0_0.png")
    sat = [sat_record("Is the cup left of the plate?", ["left", "right"], "left", "SAT_images_train/0_0.png",
                      random.Random(0))]
    (tmp_path / "sat/SAT_train_15000.json").write_text(json.dumps(sat))
    task = build_task("cv_bench", {"test_data": str(tmp_path / "cv.jsonl"),
                                   "train_data": str(tmp_path / "sat/SAT_train_15000.json"), "reward_protocol": "paper"})
    train = task.load("train")[0]
    messages = task.prompt(train)
    assert messages[0]["role"] == "raw"
    assert messages[0]["content"][-1]["text"] == "<image>" + R1_ZERO.format(question=train.question)
    assert train.question.startswith(" Answer in natural language.") and set(train.meta["choices"]) == {"left", "right"}
    # the base prompt ends in <think>, so the format reward prepends it
    assert task_rewards(task, "x</think><answer>left</answer>", train) == {"accuracy": 1.0, "format": 1.0, "total": 2.0}
    assert task_rewards(task, "x</think><answer>Left</answer>", train)["accuracy"] == 0.0  # case-sensitive (paper)
    outputs = ["<answer>(A)</answer>", "<answer>left</answer>", "<answer>table lamp</answer>", "<answer>B</answer>"]
    rows = [{**task.record_fields(ex), "id": ex.id, "model_output": out} for ex, out in zip(task.load("test"), outputs)]
    metrics, _, skipped = rescore(task, rows, "paper")
    assert skipped == 0
    assert metrics["total"] == 0.5 and metrics["count"] == 1.0 and metrics["relation"] == 0.0
    assert metrics["depth"] == 0.0 and metrics["distance"] == 1.0


def test_policy_renders_raw_prompts(tiny_dirs):
    from mmgpg.models.load import load_policy

    tiny_policy = load_policy(str(tiny_dirs["qwen2_vl"]))
    image = Image.new("RGB", (56, 56), (10, 20, 30))
    batch = tiny_policy.encode_prompts([[{"role": "raw", "content": [{"type": "image", "image": image},
                                                                     {"type": "text", "text": "Hi <think>"}]}]])
    assert batch.texts[0].startswith("<|vision_start|><|image_pad|>") and batch.texts[0].endswith("Hi <think>")
    assert int(batch.mm_token_type_ids.sum()) == 4  # 56x56 -> 2x2 merged vision tokens


# ---- fine-grained -------------------------------------------------------------------------------------------------


def test_fine_grained_shipped_splits(tmp_path):
    sizes = {"oxford_flowers": (102, 2463), "pets": (37, 3669), "fgvc_aircraft": (100, 3333), "stanford_cars": (196, 8041)}
    for dataset, (n_classes, n_test) in sizes.items():
        assert len(class_names(dataset)) == n_classes
        assert len(build_task("fine_grained", {"dataset": dataset}).load("test")) == n_test
    _png(tmp_path / "images/Abyssinian_201.jpg")
    task = build_task("fine_grained", {"dataset": "pets", "image_root": str(tmp_path), "reward_protocol": "paper"})
    ex = task.load("test")[0]
    assert ex.answer == "abyssinian" and ex.question.startswith("<image>\nThis is an image containing a pet.")
    # the paper reward falls back to the whole completion and takes substrings both ways
    assert task_rewards(task, "<think>x</think><answer></answer>", ex)["accuracy"] == 1.0
    strict = build_task("fine_grained", {"dataset": "pets", "image_root": str(tmp_path)})
    assert task_rewards(strict, "<think>x</think><answer></answer>", ex)["accuracy"] == 0.0
    assert task_rewards(strict, "<think>x</think><answer>Abyssinian</answer>", ex)["total"] == 2.0
    with pytest.raises(Exception, match="dataset must be one of"):
        build_task("fine_grained", {"dataset": "flowers"})


# ---- LISA ---------------------------------------------------------------------------------------------------------


def _reasonseg(root, split, name, points, texts, size=(200, 100)):
    (root / split).mkdir(parents=True, exist_ok=True)
    _png(root / split / f"{name}.jpg", size)
    record = {"text": texts, "is_sentence": True,
              "shapes": [{"label": "target", "shape_type": "polygon", "points": points},
                         {"label": "target", "shape_type": "polygon", "points": [[0, 0], [5, 0], [5, 5]]}]}
    (root / split / f"{name}.json").write_text(json.dumps(record))


def test_lisa_on_reasonseg_fixtures(tmp_path):
    _reasonseg(tmp_path, "train", "a", [[20, 10], [100, 10], [100, 60], [20, 60]], ["the red thing", "what is red"])
    _reasonseg(tmp_path, "test", "b", [[50, 25], [150, 25], [150, 75]], ["the object", "unused second sentence"])
    task = build_task("lisa_grounding", {"data_root": str(tmp_path), "reward_protocol": "paper"})
    train = task.load("train")
    assert len(train) == 2 and len(task.load("test")) == 1  # train: every sentence; test: the first only
    ex = train[0]
    assert ex.answer == [20.0, 10.0, 100.0, 60.0]
    assert ex.meta["answer_text"] == "(100,100),(500,600)"  # 20/200*1000, 10/100*1000, ...
    assert task_rewards(task, "<think>x</think><answer>(100,100),(500,600)</answer>", ex)["accuracy"] == 2.0
    test = task.load("test")[0]
    assert task.prompt(test)[0]["role"] == "system"
    assert "instruction: the object. Output the thinking" in test.question
    # gold (0.25, 0.25, 0.75, 0.75); prediction (0.25, 0.25, 0.5, 0.75): IoU = 0.125 / 0.25 = 0.5
    judged = task.judge("<think>(250,250),(500,750)</think><answer>(0,0),(1,1)</answer>", test, "paper")
    assert judged.correct == pytest.approx(0.5, abs=1e-5)  # the first box anywhere wins (paper)
    assert task.judge("<think>(250,250),(500,750)</think><answer>(0,0),(1,1)</answer>", test, "strict").correct < 1e-4
    qwen25 = build_task("lisa_grounding", {"data_root": str(tmp_path), "box_format": "qwen2_5_vl"})
    assert qwen25.units(200, 100) == (196.0, 112.0)  # smart_resize to multiples of 28
    rows = [{**task.record_fields(test), "id": test.id, "model_output": "<answer>(250,250),(750,750)</answer>"}]
    metrics, _, _ = rescore(task, rows, "paper")
    assert metrics["miou"] == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize(("family", "answer"), [
    ("qwen2_vl", "(250,250),(750,750)"), ("qwen3_vl", "(250,250),(750,750)"), ("qwen3_5", "(250,250),(750,750)"),
    ("internvl", "(250,250),(750,750)"), ("qwen2_5_vl", "(49,28),(147,84)")])
def test_lisa_box_convention_follows_the_model_family(tmp_path, family, answer):
    """Each family's documented box convention (Family.box_format): the 0-1000 grid of Qwen2-VL, Qwen3-VL, Qwen3.5 and
    InternVL, the resized image's pixels of Qwen2.5-VL (a 200 x 100 image resized to 196 x 112 at the task's pixel
    bounds). The task with the family's convention scores the family's answer for the gold box as a perfect match; the
    other convention is refused for that family (a wrong convention would score every answer with the wrong units:
    the same answer then has an IoU far from 1)."""
    from mmgpg.models import FAMILIES

    _reasonseg(tmp_path, "test", "b", [[50, 25], [150, 25], [150, 75]], ["the object"])
    spec = FAMILIES[family]
    right = build_task("lisa_grounding", {"data_root": str(tmp_path), "box_format": spec.box_format})
    wrong = build_task("lisa_grounding", {"data_root": str(tmp_path), "box_format": next(
        f for f in ("norm1000", "resized_pixels") if f != spec.box_format)})
    ex = right.load("test")[0]  # gold (50, 25, 150, 75) pixels of 200 x 100
    output = f"<think>x</think><answer>{answer}</answer>"
    assert right.model_problems(spec) == [] and right.judge(output, ex, "strict").correct == pytest.approx(1.0, abs=0.02)
    assert wrong.judge(output, ex, "strict").correct < 0.5
    (problem,) = wrong.model_problems(spec)
    assert problem.key == "task.box_format" and f"set task.box_format={spec.box_format}" in problem.fix


def test_a_model_whose_box_convention_the_task_lacks_is_refused_at_start(tmp_path, tiny_dirs):
    """mmgpg train with task.box_format=norm1000 on a Qwen2.5-VL: one ConfigError naming the key and the fix, before
    any rollout."""
    from support.gradient_reference import make_trainer

    from mmgpg.typed import ConfigError

    _reasonseg(tmp_path, "train", "a", [[20, 10], [100, 10], [100, 60], [20, 60]], ["the red thing"])
    with pytest.raises(ConfigError, match="Qwen2.5-VL answers boxes as resized_pixels.*set task.box_format="
                                          "resized_pixels"):
        make_trainer(str(tiny_dirs["qwen2_5_vl"]), str(tmp_path / "run"), "gpg", "task=lisa_grounding",
                     f"task.data_root={tmp_path}", "task.box_format=norm1000")


# ---- embedded tasks -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["count_mc", "count", "relation", "colour", "grounding"])
def test_scenes_gold_answers_are_judged_correct(kind):
    task = build_task("scenes", {"kind": kind, "num_train": 5, "num_test": 5})
    for ex in task.load("test"):
        assert ex == task.load("test")[int(ex.id.rsplit("-", 1)[1])]  # deterministic
        for protocol in ("paper", "strict"):
            assert task.judge(task.gold_completion(ex), ex, protocol).correct > 0.95
            assert task.judge("<think></think><answer>zzz</answer>", ex, protocol).correct == 0.0


def test_digits_are_real_images():
    task = build_task("digits", {"num_test": 10})
    items = task.load("test")
    assert len(items) == 10 and len(task.load("train")) == 1787
    ex = items[0]
    assert ex.images[0].size == (56, 56) and ex.answer in ex.meta["classes"]
    assert task_rewards(task, task.gold_completion(ex), ex)["total"] == 2.0


# ---- a task in a file outside the repository trains and evaluates through the CLI ---------------------------------

USER_TASK = '''
from dataclasses import dataclass
from typing import ClassVar

from PIL import Image

from mmgpg.task.judges import label_judge
from mmgpg.task.rewards import extract_answer, format_reward, strict_label_match
from mmgpg.task import Example, LazyExamples, Task


@dataclass
class BrightOrDark(Task):
    """Is the picture bright or dark? (a user's own task, defined outside mmgpg)"""

    name: ClassVar[str] = "bright_or_dark"
    version: ClassVar[str] = "0.1"
    size: int = 56

    def __post_init__(self):
        self.rewards = {"accuracy": lambda c, ex: strict_label_match(extract_answer(c), ex.answer),
                        "format": lambda c, ex: format_reward(c)}

    def load(self, split):
        n = 16 if split == "train" else 6
        def make(i):
            grey = 230 if i % 2 else 25
            return Example(f"{split}-{i}", [Image.new("RGB", (self.size, self.size), (grey,) * 3)],
                           "Is the image bright or dark? Answer in <answer> </answer> tags.",
                           "bright" if i % 2 else "dark")
        return LazyExamples(n, make)

    def prompt(self, example):
        return [{"role": "user", "content": [{"type": "image", "image": example.images[0]},
                                             {"type": "text", "text": example.question}]}]

    def judge(self, completion, example, protocol):
        return label_judge(completion, example.answer, protocol)

    def aggregate(self, records):
        return {"accuracy": sum(r["correct"] for r in records) / len(records)}

    def example_from_record(self, record):
        return Example(record["id"], [], record.get("question", ""), record["ground_truth"])
'''


def test_a_task_file_outside_the_repo_trains_and_evaluates(tmp_path):
    import subprocess
    import sys

    task_file = tmp_path / "elsewhere" / "my_task.py"
    task_file.parent.mkdir()
    task_file.write_text(USER_TASK)
    ref = f"{task_file}:BrightOrDark"
    run, ev = tmp_path / "run", tmp_path / "ev"

    def cli(*args):
        proc = subprocess.run([sys.executable, "-m", "mmgpg", *args], capture_output=True, text=True, timeout=900,
                              cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout

    cli("train", f"task={ref}", "task.size=28", "model=tiny", "rollout.group_size=4", "rollout.max_new_tokens=8",
        "train.prompts_per_step=2", "train.max_steps=2", "train.progress=false", "train.tensorboard=false",
        f"output_dir={run}")
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2
    out = cli("eval", "--task", ref, "--ckpt", str(run), "--limit", "4", "--max-new-tokens", "8",
              "--output", str(ev), "task.size=28")
    assert "accuracy" in out
    meta = json.loads((ev / "metrics.json").read_text())
    assert meta["task"] == "bright_or_dark" and meta["counts"]["evaluated"] == 4
    assert meta["config"]["task"]["size"] == 28
    records = [json.loads(line) for line in (ev / "predictions.jsonl").read_text().splitlines()]
    assert [r["ground_truth"] for r in records] == ["dark", "bright", "dark", "bright"]
    assert all({"id", "model_output", "extracted", "correct", "rewards"} <= r.keys() for r in records)


def test_lisa_evaluation_with_a_sam_checkpoint_reports_mask_metrics(tmp_path, tiny_dirs, tiny_sam_dir):
    from mmgpg.evaluation.run import evaluate
    from mmgpg.models.load import load_policy
    from mmgpg.rollout.hf import HFEngine

    _reasonseg(tmp_path, "test", "b", [[50, 25], [150, 25], [150, 75]], ["the object"])
    _reasonseg(tmp_path, "test", "c", [[10, 10], [60, 10], [60, 40], [10, 40]], ["the other"], size=(90, 70))
    policy = load_policy(str(tiny_dirs["qwen2_vl"]), dtype="float32", max_pixels=12544)
    task = build_task("lisa_grounding", {"data_root": str(tmp_path), "sam_checkpoint": str(tiny_sam_dir)})
    metrics, records = evaluate(HFEngine(policy), task, list(task.load("test")), max_new_tokens=6)
    assert {"miou", "giou", "ciou", "parse_failures"} <= metrics.keys()
    assert 0.0 <= metrics["giou"] <= 1.0 and all("mask_iou" in r for r in records)
    assert metrics["giou"] == pytest.approx(sum(r["mask_iou"] for r in records) / 2)


def test_check_cli(tmp_path, capsys):
    assert main(["check", "task=scenes", "task.kind=grounding", "model=tiny", "--examples", "1"]) == 0
    out = capsys.readouterr().out
    assert "gold answer" in out and "0 error(s)" in out
    # classification under the paper protocol: the empty answer is "correct" — a warning, not an error
    assert main(["check", "task=digits", "task.reward_protocol=paper", "model=tiny", "--examples", "1"]) == 0
    assert "empty answer scores" in capsys.readouterr().out
    # missing images: an error that says what to download; exit status 1
    assert main(["check", "task=geoqa", "model=tiny", "--split", "test", "--examples", "1"]) == 1
    assert "Luckyjhg/Geo170K" in capsys.readouterr().out


@pytest.mark.parametrize("pred,gt,correct", [
    ("240π", "240πcm^{2}", 1.0), ("27", "27cm^{2}", 1.0), ("4 * pi", "4π", 1.0), ("pi", "π", 1.0),
    ("sqrt(3)/2", "\\frac{√{3}}{2}", 1.0), ("2", "2√{15}米", 0.0), ("65", "65°", 1.0),
])
def test_geoqa_strict_normal_form(pred, gt, correct):
    """Units with exponents and a spelled-out pi (cases found by replaying R1-V's GRPO log, tests/paper/test_geoqa_log.py)."""
    assert math_judge(f"<answer>{pred}</answer>", gt, "strict").correct == correct


def test_evaluation_judges_each_output_once_per_protocol(tmp_path, tiny_dirs):
    """run_evaluation and rescore_predictions judge every output once under the evaluation protocol (count_mc's
    accuracy reward is the judge under its own reward protocol: one judgement more, under that protocol only)."""
    from mmgpg.evaluation.predictions import rescore_predictions, write_report
    from mmgpg.evaluation.run import run_evaluation
    from mmgpg.models.load import load_policy
    from mmgpg.rollout.hf import HFEngine

    task = build_task(f"{FIXTURE_TASKS}:JudgeCountingScenes",
                      {"num_test": 3, "reward_protocol": "strict"})
    policy = load_policy(str(tiny_dirs["qwen2_vl"]), dtype="float32", min_pixels=3136, max_pixels=12544)
    report = run_evaluation(HFEngine(policy), task, "test", limit=None, protocol="paper",
                            max_new_tokens=4, checkpoint="tiny", engine_name="hf")
    ids = [f"scenes-count_mc-test-{i}" for i in range(3)]
    assert sorted(task.judged) == sorted([(i, "paper") for i in ids] + [(i, "strict") for i in ids])
    write_report(tmp_path, report, {})
    task.judged.clear()
    again = rescore_predictions(task, tmp_path / "predictions.jsonl", "paper", split="test", limit=None)
    assert sorted(task.judged) == sorted([(i, "paper") for i in ids] + [(i, "strict") for i in ids])
    assert again.metrics == report.metrics and again.counts["evaluated"] == 3
