"""``video_r1``: Video-R1's RL data and its six video benchmarks (Feng et al., "Video-R1: Reinforcing Video Reasoning
in MLLMs", arXiv 2503.21776; code github.com/tulerfeng/Video-R1), as a task plugin.

Data (both splits are JSON lists in Video-R1's one schema; media paths start with ``./`` and are relative to the
folder of the JSON file, as Video-R1's scripts join them)::

    {"problem_id": 2, "problem": "What is the man doing before he opens the door?", "data_type": "video",
     "problem_type": "multiple choice", "options": ["A. sitting", "B. running", ...],
     "solution": "<answer>A</answer>", "path": "./LLaVA-Video-178K/liwei_youtube_videos/.../clip.mp4",
     "data_source": "LLaVA-Video-178K"}

* ``train`` — ``Video-R1-260k.json`` of the hub dataset ``Video-R1/Video-R1-data`` (images and videos; problem types
  ``multiple choice``, ``numerical``, ``OCR``, ``free-form``, ``regression``); ``task.train_data=/path/to/it``.
* ``test`` — one benchmark's file of the hub dataset ``Video-R1/Video-R1-eval`` (``eval_mvbench.json``,
  ``eval_tempcompass.json``, ``eval_videomme.json``, ``eval_videommmu.json``, ``eval_vsibench.json``,
  ``eval_mmvu.json``), chosen by ``task.benchmark``; ``task.eval_data`` is that file or the folder holding it. The
  videos come from each benchmark's own site (licences differ) and go where the JSON's ``path`` says.

A missing file or video is a :class:`~mmgpg.task.data.DataNotFound` naming the record and the path, with where to
get it.

Prompt (Video-R1's ``grpo.py`` for training, ``eval_bench.py`` for the benchmarks; the two differ by a few words):
the question (``problem``; for multiple choice followed by ``Options:`` and one option per line), then the "think
as if you were a human pondering deeply" template and the per-type sentence that says what goes in the answer
tag. The video part comes first in the user turn.

Rewards (``task.reward_protocol``): ``paper`` is Video-R1's training ``accuracy_reward`` per problem type —
multiple choice: the tagged answer equals the solution's; numerical: both or neither have a decimal point or comma,
and the numbers agree to 2 decimals; OCR: 1 − word error rate; free-form: the mean F of ROUGE-1/2/L
(``rouge-score``, stemmed); regression: 1 − min(1, relative error) — and its ``format_reward`` (the R1 regex).
``strict`` is the same with non-finite numbers worth 0 (their regression reward gives 1.0 to the answer ``nan``:
``max(0.0, nan)`` is 0.0 in Python, so the relative error reads as 0). Judge (``mmgpg eval``): Video-R1's
``eval_bench.py`` — the tagged answer, or under ``paper`` the whole output when there is no tag; multiple choice and
numerical as above, regression scored by VSI-Bench's mean relative accuracy (10 thresholds 0.50..0.95, float32 as
theirs), other types 0. Metrics: ``accuracy`` over the non-regression items and ``mra`` over the regression ones
(what ``eval_bench.py`` prints), per problem type, and per ``data_source`` when the records have one.

Not built: T-GRPO's temporal reward (a second rollout on shuffled frames) and Video-R1's length reward (both live in
their trainer, not in their reward functions).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from mmgpg.task import Example
from mmgpg.task.data import DataNotFound, load_records, open_image
from mmgpg.task.judged import JudgedTask, require
from mmgpg.task.judges import Judgement
from mmgpg.task.rewards import extract_answer
from mmgpg.typed import check_choice

PROBLEM_TYPES = ("multiple choice", "numerical", "OCR", "free-form", "regression")
BENCHMARKS = ("mvbench", "tempcompass", "videomme", "videommmu", "vsibench", "mmvu")
_THINK = ("Please think about this question as if you were a human pondering deeply. Engage in an internal dialogue "
          "using expressions such as 'let me think', 'wait', 'Hmm', 'oh, I see', 'let's break it down', etc, or other "
          "natural language thought expressions It's encouraged to include self-reflection or verification in the "
          "reasoning process. ")
TRAIN_TEMPLATE = ("{question}\n" + _THINK + "Provide your detailed reasoning between the <think> </think> tags, and then "
                  "give your final answer between the <answer> </answer> tags.")
EVAL_TEMPLATE = ("{question}\n" + _THINK + "Provide your detailed reasoning between the <think> and </think> tags, and "
                 "then give your final answer between the <answer> and </answer> tags.")
TYPE_TEMPLATE = {
    "multiple choice": " Please provide only the single option letter (e.g., A, B, C, D, etc.) within the <answer> "
                       "</answer> tags.",
    "numerical": " Please provide the numerical value (e.g., 42 or 3.14) within the <answer> </answer> tags.",
    "OCR": " Please transcribe text from the image/video clearly and provide your text answer within the <answer> "
           "</answer> tags.",
    "free-form": " Please provide your text answer within the <answer> </answer> tags.",
    "regression": " Please provide the numerical value (e.g., 42 or 3.14) within the <answer> </answer> tags.",
}
GET_TRAIN = ("Download Video-R1-260k.json and the media of the hub dataset Video-R1/Video-R1-data on a connected "
             "machine (the JSON's paths are relative to its folder), copy them here and set "
             "task.train_data=/path/to/Video-R1-260k.json.")
GET_TEST = ("Download eval_{benchmark}.json of the hub dataset Video-R1/Video-R1-eval, put the benchmark's videos "
            "from its own site where the JSON's paths say (relative to the JSON's folder), and set "
            "task.eval_data=/path/to/eval_{benchmark}.json (or its folder).")


# ---- Video-R1's scores, as pure functions ---------------------------------------------------------------------------


def tagged(text: str) -> str:
    """The stripped text of the first ``<answer>…</answer>``, ``""`` when there is none (Video-R1's
    ``extract_answer``)."""
    return extract_answer(text) or ""


def to_number(text: str) -> float | None:
    """``float(text)`` with commas removed, ``None`` when it is no number (their ``normalize_number``).

    >>> to_number("1,234.5"), to_number("3 apples")
    (1234.5, None)
    """
    try:
        return float(text.replace(",", ""))
    except (ValueError, OverflowError):
        return None


def numerical_score(answer: str, gold: str, *, finite: bool = False) -> float:
    """1.0 when both or neither have a decimal mark (``.`` or ``,``) and the numbers agree after rounding to 2
    decimals (``"3"`` vs ``"3.0"`` is 0.0: one has a decimal mark, the other not). ``finite``: a non-finite number
    scores 0 (their rule gives ``inf`` = ``inf``).

    >>> numerical_score("3.14159", "3.14"), numerical_score("3", "3.0"), numerical_score("1,000.5", "1000.50")
    (1.0, 0.0, 1.0)
    """
    if ("." in gold or "," in gold) != ("." in answer or "," in answer):
        return 0.0
    a, g = to_number(answer), to_number(gold)
    if a is None or g is None or (finite and not (abs(a) < float("inf") and abs(g) < float("inf"))):
        return 0.0
    return float(round(g, 2) == round(a, 2))


def word_error_rate(reference: str, hypothesis: str) -> float:
    """Word-level Levenshtein distance / max(1, reference words) (Video-R1's ``wer``; jiwer's raises on an empty
    reference, theirs does not, hence this one).

    >>> word_error_rate("the cat sat", "the cat sat down"), word_error_rate("", "a b")
    (0.3333333333333333, 2.0)
    """
    ref, hyp = reference.split(), hypothesis.split()
    previous = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        row = [i]
        for j, h in enumerate(hyp, 1):
            row.append(previous[j - 1] if r == h else 1 + min(previous[j], row[j - 1], previous[j - 1]))
        previous = row
    return previous[-1] / max(1, len(ref))


@functools.cache
def _rouge_scorer():
    """One stemming ROUGE-1/2/L scorer for the process (built once, not per completion)."""
    try:
        from rouge_score import rouge_scorer
    except ImportError as err:
        raise ImportError("video_r1's free-form reward needs rouge-score: pip install 'mmgpg[video]' "
                          "(or pip install rouge-score)") from err
    return rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)


def rouge_score(reference: str, hypothesis: str) -> float:
    """Mean F-measure of ROUGE-1, ROUGE-2 and ROUGE-L with stemming (Google's ``rouge-score``, as Video-R1)."""
    scores = _rouge_scorer().score(reference, hypothesis)
    return (scores["rouge1"].fmeasure + scores["rouge2"].fmeasure + scores["rougeL"].fmeasure) / 3


def relative_score(answer: str, gold: str, *, finite: bool = False) -> float:
    """1 − min(1, (|a − g| + 1e-9) / (|g| + 1e-9)) (Video-R1's training reward for regression items).

    >>> round(relative_score("9", "10"), 6), relative_score("30", "10")
    (0.9, 0.0)
    """
    a, g = to_number(answer), to_number(gold)
    if a is None or g is None:
        return 0.0
    try:
        rel = (abs(a - g) + 1e-9) / (abs(g) + 1e-9)
    except (OverflowError, ZeroDivisionError):
        return 0.0
    if finite and not rel < float("inf"):  # nan or inf: theirs clamps nan to 0 and pays 1.0
        return 0.0
    return 1 - min(1.0, max(0.0, rel))


def mean_relative_accuracy(answer: float, gold: float) -> float:
    """VSI-Bench's MRA as Video-R1's ``eval_bench.py`` computes it (float32 torch): the share of the thresholds
    θ ∈ {0.50, 0.55, …, 0.95} with |a − g| / (|g| + 1e-8) < 1 − θ. 7.3 for 10: relative error 0.27 passes
    θ = 0.50 … 0.70, 5 of 10. At a boundary float32 decides: 9 for 10 (error 0.1) passes θ = 0.90 too, because
    float32's arange gives 0.8999999762 there, so 0.9 where exact arithmetic gives 0.8 — as Video-R1 reports it.

    >>> mean_relative_accuracy(10.0, 10.0), mean_relative_accuracy(7.3, 10.0), mean_relative_accuracy(30.0, 10.0)
    (1.0, 0.5, 0.0)
    >>> round(mean_relative_accuracy(9.0, 10.0), 6)
    0.9
    """
    import torch

    pred, target = torch.tensor(answer, dtype=torch.float32), torch.tensor(gold, dtype=torch.float32)
    rel = torch.abs(pred - target) / (torch.abs(target) + 1e-8)
    thresholds = torch.arange(0.5, 0.95 + 0.05 / 2, 0.05, dtype=torch.float32)
    return (rel < (1 - thresholds)).float().mean().item()


def training_accuracy(completion: str, gold: str, problem_type: str, *, strict: bool = False) -> float:
    """Video-R1's training ``accuracy_reward`` for one completion (``gold``: the answer inside the solution's tag)."""
    answer = tagged(completion)
    if problem_type == "multiple choice":
        return float(answer.strip() == gold.strip())
    if problem_type == "numerical":
        return numerical_score(answer, gold, finite=strict)
    if problem_type == "OCR":
        return max(0.0, min(1.0, 1 - word_error_rate(gold, answer)))
    if problem_type == "free-form":
        return max(0.0, min(1.0, rouge_score(gold, answer)))
    if problem_type == "regression":
        return relative_score(answer, gold, finite=strict)
    return 0.0


def benchmark_judge(completion: str, gold: str, problem_type: str, protocol: str) -> Judgement:
    """Video-R1's ``eval_bench.py`` score of one output: the tagged answer (``paper``: the whole output when there is
    no tag; ``strict``: none); multiple choice exact, numerical as in training, regression by
    :func:`mean_relative_accuracy`, other types 0."""
    answer = tagged(completion)
    missing = answer == ""
    if missing and protocol == "paper":
        answer = completion
    score = 0.0
    if problem_type == "multiple choice":
        score = float(answer.strip() == gold.strip())
    elif problem_type == "numerical":
        score = numerical_score(answer, gold, finite=protocol == "strict")
    elif problem_type == "regression":
        a, g = to_number(answer), to_number(gold)
        if a is not None and g is not None:
            score = mean_relative_accuracy(a, g)
            if score != score:  # NaN (their float32 overflow on huge numbers) is no score
                score = 0.0
    return Judgement(correct=score, extracted=answer.strip() if not missing else "", parse_failure=missing,
                     fields={"problem_type": problem_type})


# ---- the task ------------------------------------------------------------------------------------------------------


@dataclass
class VideoR1Task(JudgedTask):
    """Video-R1-260k (train) and one of its six video benchmarks (test), with Video-R1's prompts and scores."""

    name: ClassVar[str] = "video_r1"
    version: ClassVar[str] = "1"

    train_data: str = ""
    """Video-R1-260k.json (its media relative to its folder)."""
    benchmark: str = "mvbench"
    """The test split's benchmark: mvbench, tempcompass, videomme, videommmu, vsibench or mmvu."""
    eval_data: str = ""
    """eval_<benchmark>.json of Video-R1-eval, or the folder holding it (its videos relative to that folder)."""

    def __post_init__(self):
        check_choice("benchmark", self.benchmark, BENCHMARKS)
        super().__post_init__()

    def _eval_file(self) -> str:
        path = Path(self.eval_data).expanduser() if self.eval_data else None
        if path is not None and path.is_dir():
            return str(path / f"eval_{self.benchmark}.json")
        return self.eval_data

    def source_rows(self, split: str):
        if split == "train":
            return load_records(self.train_data, split="train", what="Video-R1 training data", how_to_get=GET_TRAIN)
        return load_records(self._eval_file(), split="test", what=f"Video-R1 {self.benchmark} evaluation data",
                            how_to_get=GET_TEST.format(benchmark=self.benchmark))

    def example(self, split: str, index: int, row: dict) -> Example:
        what = "Video-R1 training data" if split == "train" else f"Video-R1 {self.benchmark} evaluation data"
        require(row, ("problem", "problem_type", "solution", "data_type", "path"), what)
        kind, ptype = row["data_type"], row["problem_type"]
        if kind not in ("image", "video"):
            raise ValueError(f"data_type must be image or video; got {kind!r}")
        check_choice("problem_type", ptype, PROBLEM_TYPES)
        gold = tagged(row["solution"])
        if not gold:
            raise ValueError(f"solution {row['solution'][:80]!r} holds no <answer>...</answer>: no gold answer to score "
                             "against (Video-R1 would compare every output with the empty string)")
        question = row["problem"]
        if ptype == "multiple choice":
            options = row.get("options")
            if not isinstance(options, list) or not all(isinstance(o, str) for o in options):
                raise ValueError(f"a multiple-choice record needs options (a list of text); got {options!r}")
            question = question + "Options:\n" + "".join(o + "\n" for o in options)
        template = TRAIN_TEMPLATE if split == "train" else EVAL_TEMPLATE
        source = self.train_data if split == "train" else self._eval_file()
        how = GET_TRAIN if split == "train" else GET_TEST.format(benchmark=self.benchmark)
        rid = str(row.get("problem_id", f"{split}-{index}"))
        path = Path(source).expanduser().parent / str(row["path"])
        if kind == "video":
            if not path.is_file():
                raise DataNotFound(f"record {rid!r}: video {str(path)!r} does not exist. {how}")
            media: list[Any] = [{"type": "video", "video": str(path)}]
        else:
            media = [open_image(str(path), what=f"record {rid!r} image", how_to_get=how)]
        meta = {"problem_type": ptype, "data_source": str(row.get("data_source", ""))}
        return Example(id=f"video_r1-{self.benchmark if split == 'test' else 'train'}-{rid}", media=media,
                       question=template.format(question=question) + TYPE_TEMPLATE[ptype],
                       answer=gold, meta=meta)

    def accuracy_reward(self, completion: str, example: Example, protocol: str) -> float:
        return training_accuracy(completion, str(example.answer), example.meta["problem_type"],
                                 strict=protocol == "strict")

    def judge(self, completion: str, example: Example, protocol: str) -> Judgement:
        out = benchmark_judge(completion, str(example.answer), example.meta["problem_type"], protocol)
        return out.with_fields(data_source=example.meta.get("data_source", ""))

    def aggregate(self, per_sample: list[dict[str, Any]]) -> dict[str, float]:
        """``accuracy`` over the non-regression items and ``mra`` over the regression items (eval_bench.py's two
        means), ``accuracy/<type>`` per problem type and ``source/<data_source>`` per source."""
        metrics = super().aggregate(per_sample)
        metrics.pop("accuracy", None)
        scored = [r for r in per_sample if r.get("problem_type") != "regression"]
        regression = [r for r in per_sample if r.get("problem_type") == "regression"]
        if scored:
            metrics["accuracy"] = sum(r["correct"] for r in scored) / len(scored)
        if regression:
            metrics["mra"] = sum(r["correct"] for r in regression) / len(regression)
        for key, prefix in (("problem_type", "accuracy/"), ("data_source", "source/")):
            for value in sorted({str(r.get(key, "")) for r in per_sample} - {""}):
                rows = [r for r in per_sample if r.get(key) == value]
                metrics[prefix + value.replace(" ", "_")] = sum(r["correct"] for r in rows) / len(rows)
        return metrics

    def success(self, completion: str, example: Example, rewards) -> bool:
        """A graded reward (OCR, free-form, regression) counts as a success at 1.0 only, like the exact types."""
        return float(rewards.get("accuracy", 0.0)) >= 1.0

    def example_from_record(self, record: dict) -> Example:
        require(record, ("id", "ground_truth", "problem_type"), "Video-R1 predictions")
        return Example(id=str(record["id"]), media=[], question=str(record.get("question", "")),
                       answer=str(record["ground_truth"]),
                       meta={"problem_type": str(record["problem_type"]),
                             "data_source": str(record.get("data_source", ""))})

    def record_fields(self, example: Example) -> dict:
        return {"question": example.question, "ground_truth": example.answer,
                "problem_type": example.meta["problem_type"], "data_source": example.meta.get("data_source", "")}

    def gold_completion(self, example: Example) -> str:
        return f"<think>Let me think. The answer is {example.answer}.</think><answer>{example.answer}</answer>"
