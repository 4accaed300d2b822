"""The math family (text only): the training task ``math`` and the evaluation tasks ``math_500``, ``aime24``,
``aime25``, ``amc23``, ``minerva`` and ``olympiadbench`` — the GPG paper's unimodal rows (Tables 1, 3 and 4).

Anchors: the authors' ``open-rs`` fork (``GPG:open-rs/src/open_r1/gpg.py``, ``rewards.py``, ``evaluate.py``,
``recipes/gpg.yaml``) and ``open-r1`` fork (``GPG:open-r1/recipes/Qwen2.5-Math-7B/grpo/config_simple_rl_*.yaml``,
``GPG:open-r1/src/open_r1/gpg.py``, ``utils/data_utils.py``). ``docs/tasks.md`` ("The math family") is the user's
guide; this docstring is the reference.

Training (``task=math``, option ``dataset``; ``task.train_data`` = a hub id or a local file/directory in the same
schema overrides the dataset's default source):

* ``math_lighteval`` — ``DigitalLearningGmbH/MATH-lighteval`` (``problem``, ``solution``), the Table 1 / SimpleRL
  recipe (``config_simple_rl_gpg.yaml``): system prompt ``simple_rl``, rewards ``[accuracy]`` weights ``[1.0]``.
* ``simplelr_level3to5`` — ``simplelr_qwen_level3to5/train.parquet`` of ``hkust-nlp/SimpleRL-Zoo-Data``
  (``config_simple_rl_math_l35.yaml``): each row's ``prompt`` (a one-message list) already holds the full chat text,
  which the authors use as the raw prompt (``make_conversation_math35``: no system prompt, no chat template); the gold
  is the bare answer in ``target`` (their data loader renames it ``solution``; a row with ``instruction``/``solution``,
  the renamed schema, is read too). Rewards ``[accuracy, format_r1]`` weights ``[1.0, 1.0]``; the accuracy gold is
  ``"$\\\\boxed{}$".format(answer)`` as in their ``accuracy_reward_lv35``.
* ``open_rs``, ``open_s1`` — ``knoveleng/open-rs``, ``knoveleng/open-s1`` (``problem``, ``solution``), the
  GPG-RS1/RS3/7B recipes (``GPG:open-rs/recipes/gpg.yaml``: open-s1): system prompt ``open_rs``, rewards
  ``[format, cosine]`` weights ``[1.0, 2.0]``.

The ``test`` split (``train.eval_split``, ``mmgpg eval --task math``) is ``task.test_data`` or the dataset's own test
split (MATH-lighteval's hub test split, SimpleRL-Zoo's ``test.parquet``; open-rs and open-s1 have none), judged like
MATH-500.

Prompts: ``[system, user(problem)]`` as ``make_conversation`` builds them (``GPG:open-rs/src/open_r1/gpg.py:183-190``);
``system_prompt`` is ``recipe`` (the dataset's recipe preset), a preset name (:data:`SYSTEM_PROMPTS`), ``none``, or a
literal string. The benchmarks use the user message only: ``MATH_QUERY_TEMPLATE`` with the problem
(``GPG:open-rs/src/open_r1/evaluate.py:34-38``; lighteval's ``--use-chat-template`` adds no system message).

Rewards (``reward_funcs``, ``reward_weights``; ``reward_protocol``):

* ``accuracy`` — ``paper``: their ``accuracy_reward`` (``GPG:open-rs/src/open_r1/rewards.py:22-67``): the gold parsed
  with LaTeX extraction (first match); **an unparseable gold scores 1.0**; the completion parsed with LaTeX extraction
  only (boxed first, no anchor-less match, ``NormalizationConfig(nits=False, malformed_operators=False,
  basic_latex=True, equations=True, boxed="all", units=True)``), ``verify(answer, gold)``. ``strict``: the last
  ``\\boxed{}`` after the last ``</think>`` must equal the gold answer as LaTeX (math-verify); no box scores 0; a gold
  answer that does not parse is a data error (``data.on_bad_row`` decides).
* ``format`` — ``paper``: open-rs's ``format_reward``: 1.0 when ``"\\n</think>\\n"`` occurs exactly once (an output
  that is only that scores 1). ``strict``: exactly one ``</think>`` with non-blank reasoning before it and exactly one
  non-empty ``\\boxed{}`` after it.
* ``format_r1`` — ``paper``: open-r1's ``format_reward``: ``re.match(r"^<think>\\n.*?\\n</think>\\n<answer>\\n.*?\\n
  </answer>$", DOTALL | MULTILINE)`` (trailing text after a line break still matches). ``strict``: the whole output
  is that pattern, both parts non-blank.
* ``cosine`` — ``paper``: ``get_cosine_scaled_reward`` (``rewards.py:267-340``) with open-rs gpg.py's defaults
  (``cosine_min_value_wrong=0.0``, ``cosine_max_value_wrong=-0.5``, ``cosine_min_value_correct=0.5``,
  ``cosine_max_value_correct=1.0``, ``cosine_max_len=1000``): ``r = lo + (hi - lo)(1 + cos(π L / max_len)) / 2`` with
  ``L`` the completion's length in characters, ``(lo, hi) = (min_correct, max_correct)`` when correct and
  ``(max_wrong, min_wrong)`` when wrong; correctness as ``accuracy`` but with ``NormalizationConfig(boxed=True)``
  (which math-verify's normalisation treats as "no boxed extraction"); an unparseable gold scores 1.0. Past
  ``max_len`` the cosine turns back up (L = 2·max_len scores like L = 0). ``strict``: ``L`` capped at ``max_len``,
  correctness = the strict ``accuracy``.

Each named reward is ``weight × function``, so ``reward/<name>`` in the logs is already weighted and
``reward/total`` is their sum, the number the advantages see (TRL, which the authors used, logs each function
unweighted and sums the weighted values: divide ``reward/cosine`` by 2 to compare with their ``rewards/cosine``).

Judges (``mmgpg eval --protocol``): ``paper`` = lighteval's extractive match as evaluate.py configures it
(:func:`mmgpg.task.mathjudge.lighteval_match`; ``latex_gold_metric`` for MATH-500, Minerva, OlympiadBench and the
training sets, ``expr_gold_metric`` for AIME and AMC); ``strict`` = the last ``\\boxed{}`` after ``</think>``
equals the gold answer (math-verify, LaTeX). Success (prompt_success.jsonl) = the answer is right under the training
protocol (an unparseable gold is never a success).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from mmgpg.task import Example, mathjudge
from mmgpg.task.data import DataError, DataNotFound, load_records
from mmgpg.task.judged import JudgedTask, require
from mmgpg.task.judges import Judgement, check_protocol
from mmgpg.typed import check_choice

# ---- prompts ------------------------------------------------------------------------------------------------------

SYSTEM_PROMPTS = {
    # GPG:open-rs/recipes/gpg.yaml:9 (the YAML's "\\boxed{{}}" is the text \boxed{{}}: the doubled braces are theirs)
    "open_rs": ("A conversation between User and Assistant. The user asks a question, and the Assistant solves it. "
                "The assistant first thinks about the reasoning process in the mind and then provides the user with "
                "the answer, and put your final answer within \\boxed{{}} . The reasoning process and answer are "
                "enclosed within <think> </think> and <answer> </answer> tags, respectively, i.e., <think> reasoning "
                "process here </think> <answer> answer here </answer>. Note that respond by English, NOT use other "
                "languages."),
    # GPG:open-r1/recipes/Qwen2.5-Math-7B/grpo/config_simple_rl_gpg.yaml:9
    "simple_rl": ("You are a helpful AI Assistant, designed to provided well-reasoned and detailed responses. You "
                  "FIRST think about the reasoning process as an internal monologue and then provide the user with "
                  "the answer. Please reason step by step, and put your final answer within \\boxed{}."),
    # GPG:open-r1/recipes/Qwen2.5-Math-7B/grpo/config_simple_rl_math_l35.yaml:9 (set there, but unused by their
    # code for that data: its prompts are used as they are)
    "simple_rl_think": ("You are a helpful AI Assistant, designed to provided well-reasoned and detailed responses. "
                        "You FIRST think about the reasoning process as an internal monologue and then provide the "
                        "user with the answer. The reasoning process MUST BE enclosed within <think> and </think> "
                        "tags."),
    "none": "",
}
"""Named system prompts for ``task.system_prompt`` (any other value is used as the system prompt itself)."""

MATH_QUERY_TEMPLATE = (
    "Solve the following math problem efficiently and clearly.  The last line of your response should be of the "
    "following format: 'Therefore, the final answer is: $\\boxed{{ANSWER}}$. I hope it is correct' (without quotes) "
    "where ANSWER is just the final number or expression that solves the problem. Think step by step before "
    "answering.\n\n{Question}")
"""``GPG:open-rs/src/open_r1/evaluate.py:34-38`` (applied with ``str.format``, so the box reads ``\\boxed{ANSWER}``)."""


# ---- data ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainSet:
    hub: str
    data_files: str
    schema: str  # "problem_solution" | "simplelr"
    system: str
    reward_funcs: tuple[str, ...]
    reward_weights: tuple[float, ...]


TRAIN_SETS = {
    "math_lighteval": TrainSet("DigitalLearningGmbH/MATH-lighteval", "", "problem_solution", "simple_rl",
                               ("accuracy",), (1.0,)),
    "simplelr_level3to5": TrainSet("hkust-nlp/SimpleRL-Zoo-Data", "simplelr_qwen_level3to5/train.parquet", "simplelr",
                                   "none", ("accuracy", "format_r1"), (1.0, 1.0)),
    "open_rs": TrainSet("knoveleng/open-rs", "", "problem_solution", "open_rs", ("format", "cosine"), (1.0, 2.0)),
    "open_s1": TrainSet("knoveleng/open-s1", "", "problem_solution", "open_rs", ("format", "cosine"), (1.0, 2.0)),
}
"""The training sets of the paper's unimodal rows, with their recipes' system prompt and rewards."""


@dataclass(frozen=True)
class Benchmark:
    hub: str
    split: str
    question: str
    gold: str
    kind: str  # lighteval gold extraction: "latex" (latex_gold_metric) or "expr" (expr_gold_metric)


BENCHMARKS = {  # GPG:open-rs/src/open_r1/evaluate.py:80-122 (prompt functions) and 141-241 (task configs)
    "math_500": Benchmark("HuggingFaceH4/MATH-500", "test", "problem", "solution", "latex"),
    "aime24": Benchmark("HuggingFaceH4/aime_2024", "train", "problem", "answer", "expr"),
    "aime25": Benchmark("yentinglin/aime_2025", "train", "problem", "answer", "expr"),
    "amc23": Benchmark("knoveleng/AMC-23", "train", "problem", "answer", "expr"),
    "minerva": Benchmark("knoveleng/Minerva-Math", "train", "problem", "solution", "latex"),
    "olympiadbench": Benchmark("knoveleng/OlympiadBench", "train", "question", "answer", "latex"),
}


def how_to_get(hub: str, split: str, name: str, option: str, data_files: str = "") -> str:
    """The offline recipe for one dataset (no network here: a hub load fails and prints this)."""
    if data_files:
        return (f"Download it on a connected machine with `huggingface-cli download {hub} {data_files} --repo-type "
                f"dataset --local-dir {name}`, copy the directory here and set {option}={name}/{data_files}.")
    return (f"Download it on a connected machine with `python -c \"import datasets; datasets.load_dataset('{hub}', "
            f"split='{split}').to_json('{name}.jsonl')\"`, copy the file here and set {option}=/path/to/{name}.jsonl.")


def gold_text(value: Any, what: str, rid: Any) -> str:
    """A gold answer as text: a string as it is, an integer-valued number as its digits, another number as its
    ``repr`` (a gold stored as a number, e.g. AMC-23's ``27.0``, reaches the judge as ``"27"``; see docs/tasks.md).

    >>> gold_text(27.0, "AMC-23", 0), gold_text(3.5, "AMC-23", 1), gold_text("x+1", "x", 2)
    ('27', '3.5', 'x+1')
    """
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise DataError(f"{what}: record {rid!r}: the gold answer must be text or a finite number; got "
                        f"{type(value).__name__} {str(value)[:40]!r}")
    return str(int(value)) if float(value).is_integer() else repr(float(value))


_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) with balanced braces; None when there is none or
    it is not closed.

    >>> last_boxed(r"so $\\boxed{1}$ or rather $\\boxed{\\frac{1}{2}}$."), last_boxed("none"), last_boxed(r"\\boxed{3")
    ('\\\\frac{1}{2}', None, None)
    """
    starts = [m.end() for m in _BOX.finditer(text or "")]
    if not starts:
        return None
    start, depth = starts[-1], 1
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start:i]
    return None


def final_part(completion: str) -> str:
    """The text after the last ``</think>`` (the whole text when there is none): where ``strict`` reads answers."""
    head, sep, tail = (completion or "").rpartition("</think>")
    return tail if sep else (completion or "")


def strict_answer(completion: str) -> str | None:
    """``strict``'s answer: the last non-empty ``\\boxed{}`` after the last ``</think>``."""
    boxed = last_boxed(final_part(completion))
    return boxed if boxed and boxed.strip() else None


# ---- reward functions (pure; math-verify runs in mmgpg's worker process) -------------------------------------------


def paper_format(completion: str) -> float:
    """open-rs ``format_reward`` (``GPG:open-rs/src/open_r1/rewards.py:70-81``): 1.0 iff ``"\\n</think>\\n"`` occurs
    exactly once.

    >>> paper_format("a\\n</think>\\nb"), paper_format("\\n</think>\\n"), paper_format("a</think>b")
    (1.0, 1.0, 0.0)
    """
    return 1.0 if (completion or "").count("\n</think>\n") == 1 else 0.0


def strict_format(completion: str) -> float:
    """1.0 iff exactly one ``</think>`` (and at most one ``<think>``, before it), non-blank reasoning before it, and
    exactly one non-empty ``\\boxed{}`` after it.

    >>> strict_format("x\\n</think>\\nso $\\\\boxed{2}$"), strict_format("\\n</think>\\n"), strict_format("r</think>$\\\\boxed{}$")
    (1.0, 0.0, 0.0)
    """
    text = completion or ""
    if text.count("</think>") != 1 or text.count("<think>") > 1:
        return 0.0
    reasoning, _, tail = text.partition("</think>")
    if "<think>" in tail or not reasoning.replace("<think>", "").strip():
        return 0.0
    if len(_BOX.findall(tail)) != 1:
        return 0.0
    return 1.0 if strict_answer(text) else 0.0


_R1_FORMAT = re.compile(r"^<think>\n.*?\n</think>\n<answer>\n.*?\n</answer>$", re.DOTALL | re.MULTILINE)
_R1_FORMAT_STRICT = re.compile(r"<think>\n(.*?)\n</think>\n<answer>\n(.*?)\n</answer>", re.DOTALL)


def paper_format_r1(completion: str) -> float:
    """open-r1 ``format_reward`` (``GPG:open-r1/src/open_r1/rewards.py:120-128``).

    >>> paper_format_r1("<think>\\na\\n</think>\\n<answer>\\nb\\n</answer>\\nmore"), paper_format_r1("<think>a</think>")
    (1.0, 0.0)
    """
    return 1.0 if _R1_FORMAT.match(completion or "") else 0.0


def strict_format_r1(completion: str) -> float:
    """The whole output is ``<think>\\n…\\n</think>\\n<answer>\\n…\\n</answer>`` with both parts non-blank and no tag
    inside them.

    >>> strict_format_r1("<think>\\na\\n</think>\\n<answer>\\nb\\n</answer>\\nmore"), strict_format_r1("<think>\\na\\n</think>\\n<answer>\\nb\\n</answer>")
    (0.0, 1.0)
    """
    m = _R1_FORMAT_STRICT.fullmatch(completion or "")
    if not m:
        return 0.0
    parts = m.groups()
    tags = ("<think>", "</think>", "<answer>", "</answer>")
    return 1.0 if all(p.strip() and not any(t in p for t in tags) for p in parts) else 0.0


def cosine_scaled(correct: bool, length: float, *, min_value_wrong: float, max_value_wrong: float,
                  min_value_correct: float, max_value_correct: float, max_len: int) -> float:
    """``r = lo + 0.5 (hi − lo)(1 + cos(π · length / max_len))`` with ``(lo, hi) = (min_value_correct,
    max_value_correct)`` when correct, ``(max_value_wrong, min_value_wrong)`` when wrong
    (``GPG:open-rs/src/open_r1/rewards.py:320-335``).

    >>> kw = dict(min_value_wrong=0.0, max_value_wrong=-0.5, min_value_correct=0.5, max_value_correct=1.0, max_len=1000)
    >>> cosine_scaled(True, 0, **kw), cosine_scaled(True, 500, **kw), cosine_scaled(False, 1000, **kw)
    (1.0, 0.75, -0.5)
    """
    cosine = math.cos(length / max_len * math.pi)
    lo, hi = (min_value_correct, max_value_correct) if correct else (max_value_wrong, min_value_wrong)
    return float(lo + 0.5 * (hi - lo) * (1.0 + cosine))


def r1_accuracy(completion: str, solution: str, gold_mode: str, boxed: Any) -> tuple[bool, bool]:
    """``(gold parsed, answer correct)`` by the authors' reward rule (:func:`mmgpg.task.mathjudge.r1_answer`)."""
    gold_ok, _ = mathjudge.r1_gold(solution, gold_mode)
    if not gold_ok:
        return False, False
    return True, mathjudge.r1_answer(completion, solution, gold_mode, boxed)[0]


def strict_correct(completion: str, gold_answer: str) -> bool:
    """``strict`` correctness: :func:`strict_answer` equals ``gold_answer`` as LaTeX (math-verify)."""
    answer = strict_answer(completion)
    return bool(answer) and mathjudge.latex_equal(answer, gold_answer)[0]


REWARD_NAMES = ("accuracy", "format", "format_r1", "cosine")


# ---- tasks --------------------------------------------------------------------------------------------------------


@dataclass
class _MathTask(JudgedTask):
    """Shared by the training task and the benchmarks: text prompts, the two judges, predictions re-scoring."""

    categories: ClassVar[tuple[str, ...]] = ()

    def system_text(self) -> str:
        """The system prompt (none for the benchmarks: lighteval's chat template holds the user message only)."""
        return ""

    def prompt(self, example: Example) -> list[dict]:
        if example.meta.get("raw_prompt"):
            return [{"role": "raw", "content": example.question}]
        system = self.system_text()
        return ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": example.question}]

    def check_format_option(self) -> None:
        if not self.format_reward:
            raise ValueError(f"{self.name} selects its rewards with reward_funcs (task.reward_funcs=[...]); "
                             "task.format_reward does not apply: remove it")

    def judge(self, completion: str, example: Example, protocol: str) -> Judgement:
        gold_answer = example.meta["gold_answer"]
        if check_protocol(protocol) == "paper":
            correct, extracted = mathjudge.lighteval_match(completion, example.answer, example.meta["kind"])
            return Judgement(float(correct), extracted, not extracted)
        answer = strict_answer(completion)
        if not answer:
            return Judgement(0.0, "", True)
        correct = bool(gold_answer) and mathjudge.latex_equal(answer, gold_answer)[0]
        return Judgement(float(correct), answer, False)

    def record_fields(self, example: Example) -> dict:
        return {"question": example.question, "ground_truth": example.answer,
                "gold_answer": example.meta["gold_answer"], "kind": example.meta["kind"]}

    def example_from_record(self, record: dict) -> Example:
        require(record, ("id", "ground_truth", "gold_answer", "kind"), f"{self.name} predictions")
        if record["kind"] not in ("latex", "expr"):
            raise DataError(f"{self.name} predictions: record {record['id']!r}: kind must be latex or expr")
        return Example(id=str(record["id"]), media=[], question=str(record.get("question", "")),
                       answer=str(record["ground_truth"]),
                       meta={"gold_answer": str(record["gold_answer"]), "kind": record["kind"]})

    def gold_completion(self, example: Example) -> str:
        return (f"<think>\nThe answer is {example.meta['gold_answer']}.\n</think>\n"
                f"Therefore, the final answer is: $\\boxed{{{example.meta['gold_answer']}}}$. I hope it is correct")


@dataclass
class MathTask(_MathTask):
    """Training on the math sets of the GPG paper's unimodal rows (see the module docstring)."""

    name: ClassVar[str] = "math"
    version: ClassVar[str] = "1"
    splits: ClassVar[tuple[str, ...]] = ("train", "test")

    dataset: str = "open_s1"
    """Training set: math_lighteval, simplelr_level3to5, open_rs or open_s1 (chooses the recipe's defaults)."""
    train_data: str = ""
    """A hub dataset id or a local file/directory in the dataset's schema; empty = the dataset's hub source."""
    test_data: str = ""
    """Test split (train.eval_split=test) in the training schema; empty = the dataset's own test split
    (math_lighteval: the hub test split; simplelr_level3to5: test.parquet; open_rs/open_s1 have none)."""
    system_prompt: str = "recipe"
    """`recipe` (the dataset's recipe), a preset (open_rs, simple_rl, simple_rl_think, none) or a literal prompt."""
    reward_funcs: list[str] = field(default_factory=list)
    """Rewards to sum, from accuracy, format, format_r1, cosine; empty = the dataset's recipe."""
    reward_weights: list[float] = field(default_factory=list)
    """One weight per reward_funcs entry (each logged reward is weight × function); empty = all 1.0 (or the recipe's)."""
    cosine_min_value_wrong: float = 0.0
    """cosine reward of a wrong answer of length 0 (open-rs gpg.py default)."""
    cosine_max_value_wrong: float = -0.5
    """cosine reward of a wrong answer of length cosine_max_len."""
    cosine_min_value_correct: float = 0.5
    """cosine reward of a right answer of length cosine_max_len."""
    cosine_max_value_correct: float = 1.0
    """cosine reward of a right answer of length 0."""
    cosine_max_len: int = 1000
    """Length (characters) over which the cosine falls."""

    def __post_init__(self):
        check_choice("reward_protocol", self.reward_protocol, self.protocols)
        self.check_format_option()
        check_choice("dataset", self.dataset, TRAIN_SETS)
        recipe = TRAIN_SETS[self.dataset]
        funcs = list(self.reward_funcs) or list(recipe.reward_funcs)
        weights = list(self.reward_weights) or (list(recipe.reward_weights) if not self.reward_funcs
                                                else [1.0] * len(funcs))
        unknown = [f for f in funcs if f not in REWARD_NAMES]
        if unknown:
            raise ValueError(f"reward_funcs: unknown {', '.join(map(repr, unknown))}; choose from "
                             f"{', '.join(REWARD_NAMES)}")
        if len(set(funcs)) != len(funcs):
            raise ValueError(f"reward_funcs lists a reward twice: {funcs}")
        if len(weights) != len(funcs):
            raise ValueError(f"reward_weights needs one weight per reward_funcs entry: {len(funcs)} rewards "
                             f"({', '.join(funcs)}), {len(weights)} weights")
        if self.cosine_max_len <= 0:
            raise ValueError(f"cosine_max_len must be > 0; got {self.cosine_max_len}")
        self.selected = dict(zip(funcs, map(float, weights)))
        fns = self.reward_fns(self.reward_protocol)
        self.rewards = {name: _weighted(fns[name], w) for name, w in self.selected.items()}

    def system_text(self) -> str:
        name = TRAIN_SETS[self.dataset].system if self.system_prompt == "recipe" else self.system_prompt
        return SYSTEM_PROMPTS.get(name, name)

    def reward_fns(self, protocol: str) -> dict[str, Callable[[str, Example], float]]:
        """Every reward function of this task under ``protocol``, unweighted."""
        cos = dict(min_value_wrong=self.cosine_min_value_wrong, max_value_wrong=self.cosine_max_value_wrong,
                   min_value_correct=self.cosine_min_value_correct, max_value_correct=self.cosine_max_value_correct,
                   max_len=self.cosine_max_len)
        if protocol == "paper":
            def accuracy(c: str, ex: Example) -> float:
                gold_ok, correct = r1_accuracy(c, ex.answer, ex.meta["gold_mode"], "all")
                return 1.0 if not gold_ok else float(correct)  # their "skip this example" for unparseable golds

            def cosine(c: str, ex: Example) -> float:
                gold_ok, correct = r1_accuracy(c, ex.answer, ex.meta["gold_mode"], True)
                return 1.0 if not gold_ok else cosine_scaled(correct, len(c or ""), **cos)

            return {"accuracy": accuracy, "format": lambda c, ex: paper_format(c),
                    "format_r1": lambda c, ex: paper_format_r1(c), "cosine": cosine}

        def strict_accuracy(c: str, ex: Example) -> float:
            return float(strict_correct(c, ex.meta["gold_answer"]))

        def strict_cosine(c: str, ex: Example) -> float:
            return cosine_scaled(strict_correct(c, ex.meta["gold_answer"]), min(len(c or ""), self.cosine_max_len),
                                 **cos)

        return {"accuracy": strict_accuracy, "format": lambda c, ex: strict_format(c),
                "format_r1": lambda c, ex: strict_format_r1(c), "cosine": strict_cosine}

    def source_rows(self, split: str):
        recipe = TRAIN_SETS[self.dataset]
        option, given = ("task.train_data", self.train_data) if split == "train" else ("task.test_data", self.test_data)
        what = f"math {split} data ({self.dataset})"
        files = recipe.data_files.replace("train.parquet", f"{split}.parquet")
        get = how_to_get(recipe.hub, split, self.dataset, option, files)
        if not given and split == "test" and self.dataset in ("open_rs", "open_s1"):
            raise DataNotFound(f"{self.dataset} has no test split: set task.test_data to a file in its schema "
                               "(problem, solution), or evaluate with a benchmark task (mmgpg eval --task math_500)")
        if given or not files:
            return load_records(given or recipe.hub, split=split, what=what, how_to_get=get)
        return load_hub_file(recipe.hub, files, what=what, how_to_get=get)

    def example(self, split: str, index: int, row: dict) -> Example:
        recipe = TRAIN_SETS[self.dataset]
        what = f"math {split} data ({self.dataset})"
        rid = row.get("id", row.get("unique_id", index))
        if recipe.schema == "simplelr":
            prompt, gold = simplelr_fields(row, what)
            ex = Example(id=f"math-{self.dataset}-{split}-{index}", media=[], question=prompt, answer=gold,
                         meta={"raw_prompt": True, "gold_mode": "boxed_answer", "gold_answer": gold,
                               "kind": "latex"})
        else:
            require(row, ("problem", "solution"), what)
            solution = row["solution"]
            answer = row.get("answer")
            gold_answer = gold_text(answer, what, rid) if answer is not None else (last_boxed(solution) or "")
            ex = Example(id=f"math-{self.dataset}-{split}-{index}", media=[], question=row["problem"],
                         answer=solution,
                         meta={"gold_mode": "solution", "gold_answer": gold_answer, "kind": "latex"})
        if self.reward_protocol == "strict":
            if not ex.meta["gold_answer"] or not mathjudge.latex_parses(ex.meta["gold_answer"])[0]:
                raise DataError(f"{what}: record {rid!r}: no gold answer that parses as LaTeX "
                                f"({str(ex.meta['gold_answer'])[:60]!r}); strict rewards cannot score it "
                                "(data.on_bad_row=skip skips such rows)")
        return ex

    def judge(self, completion: str, example: Example, protocol: str) -> Judgement:
        if example.meta.get("gold_mode") == "boxed_answer" and check_protocol(protocol) == "paper":
            example = Example(example.id, [], example.question, f"${example.answer}$", example.meta)
        return super().judge(completion, example, protocol)

    def success(self, completion: str, example: Example, rewards: Mapping[str, float]) -> bool:
        """The answer is right under the training protocol (an unparseable gold is never a success)."""
        if self.reward_protocol == "paper":
            return r1_accuracy(completion, example.answer, example.meta["gold_mode"], "all")[1]
        return strict_correct(completion, example.meta["gold_answer"])


def _weighted(fn: Callable[[str, Example], float], weight: float) -> Callable[[str, Example], float]:
    if weight == 1.0:
        return fn
    return lambda completion, example: weight * fn(completion, example)


def simplelr_fields(row: dict, what: str) -> tuple[str, str]:
    """``(raw prompt text, bare gold answer)`` of a SimpleRL-Zoo row: ``prompt`` (or, renamed, ``instruction``) is a
    list whose first message's ``content`` is the prompt; the gold is ``target`` (renamed: ``solution``)."""
    rid = row.get("id", row.get("idx", "?"))
    messages = row.get("prompt", row.get("instruction"))
    if hasattr(messages, "tolist"):  # numpy arrays from parquet through pandas
        messages = messages.tolist()
    if not (isinstance(messages, list) and messages and isinstance(messages[0], dict)
            and isinstance(messages[0].get("content"), str)):
        raise DataError(f"{what}: record {rid!r}: `prompt` must be a list of {{\"role\", \"content\"}} messages "
                        f"(SimpleRL-Zoo schema); it has {', '.join(sorted(map(str, row)))}")
    gold = row.get("target", row.get("solution"))
    if gold is None:
        raise DataError(f"{what}: record {rid!r} lacks the gold answer `target` (or `solution`)")
    return messages[0]["content"], gold_text(gold, what, rid)


def load_hub_file(hub: str, data_files: str, *, what: str, how_to_get: str):
    """One file of a hub dataset repository (``datasets.load_dataset(hub, data_files=...)``)."""
    import datasets

    try:
        return datasets.load_dataset(hub, data_files=data_files, split="train")
    except Exception as err:  # offline, unknown id: the hub's own message plus ours
        raise DataNotFound(f"Could not load {what} {hub!r} ({data_files}) from the Hugging Face hub: "
                           f"{type(err).__name__}: {str(err)[:300]}. {how_to_get}") from err


@dataclass
class _BenchmarkTask(_MathTask):
    """One math benchmark of the GPG paper (evaluation; the ``accuracy`` reward is the judge's decision)."""

    benchmark: ClassVar[Benchmark]
    version: ClassVar[str] = "1"
    splits: ClassVar[tuple[str, ...]] = ("test",)

    data: str = ""
    """A hub dataset id or a local file/directory in the benchmark's schema; empty = the authors' hub dataset."""

    def __post_init__(self):
        check_choice("reward_protocol", self.reward_protocol, self.protocols)
        self.check_format_option()
        protocol = self.reward_protocol
        self.rewards = {"accuracy": lambda completion, ex: self.judge(completion, ex, protocol).correct}

    def source_rows(self, split: str) -> Sequence[Any]:
        b = self.benchmark
        return load_records(self.data or b.hub, split=b.split, what=f"{self.name} data",
                            how_to_get=how_to_get(b.hub, b.split, self.name, "task.data"))

    def example(self, split: str, index: int, row: dict) -> Example:
        b, what = self.benchmark, f"{self.name} data"
        rid = row.get("id", row.get("unique_id", row.get("idx", index)))
        missing = [k for k in (b.question, b.gold) if row.get(k) is None]
        if missing:
            raise DataError(f"{what}: record {rid!r} lacks {', '.join(missing)}; it has "
                            f"{', '.join(sorted(map(str, row)))}")
        require(row, (b.question,), what)
        gold = gold_text(row[b.gold], what, rid)
        answer = row.get("answer")
        gold_answer = gold if b.gold == "answer" else (
            gold_text(answer, what, rid) if answer is not None else (last_boxed(gold) or ""))
        return Example(id=str(row.get("unique_id", row.get("id", f"{self.name}-{index}"))), media=[],
                       question=MATH_QUERY_TEMPLATE.format(Question=row[b.question]), answer=gold,
                       meta={"gold_answer": gold_answer, "kind": b.kind})

    def success(self, completion: str, example: Example, rewards: Mapping[str, float]) -> bool:
        return float(rewards["accuracy"]) >= 1.0 if "accuracy" in rewards else (
            self.judge(completion, example, self.reward_protocol).correct >= 1.0)


def _benchmark(key: str, doc: str) -> type:
    cls = type(f"{''.join(p.capitalize() for p in key.split('_'))}Task", (_BenchmarkTask,),
               {"__doc__": doc, "name": key, "benchmark": BENCHMARKS[key], "__module__": __name__,
                "__annotations__": {}})
    return dataclass(cls)


Math500Task = _benchmark("math_500", "MATH-500 (HuggingFaceH4/MATH-500, test; gold: the solution, LaTeX).")
Aime24Task = _benchmark("aime24", "AIME 2024 (HuggingFaceH4/aime_2024, train; gold: the integer answer).")
Aime25Task = _benchmark("aime25", "AIME 2025 (yentinglin/aime_2025, train; gold: the integer answer).")
Amc23Task = _benchmark("amc23", "AMC 2023 (knoveleng/AMC-23, train; gold: the answer, as an expression).")
MinervaTask = _benchmark("minerva", "Minerva-Math (knoveleng/Minerva-Math, train; gold: the solution, LaTeX).")
OlympiadbenchTask = _benchmark("olympiadbench", "OlympiadBench (knoveleng/OlympiadBench, train; gold: the answer, "
                                                "LaTeX; question column `question`).")
