"""The math family (tasks/math.py): rewards with hand-computed values under both protocols, reward selection and
weights, data loading and its errors, prompts, judges; and the ``paper`` rewards against the GPG authors' own reward
functions (loaded from a mirror of their repository at test time, see ``support.authors_rewards``)."""

from __future__ import annotations

import logging
import math
import random

import pytest
from support import REPO
from support.authors_rewards import load
from support.math_corpus import HAND_WRITTEN, procedural, self_corrections

from mmgpg.task import build_task, mathjudge, task_rewards
from mmgpg.task.data import DataError, DataNotFound
from mmgpg.typed import ConfigError

DATA = REPO / "tests" / "support" / "math_data"
TRAIN = str(DATA / "math_train.jsonl")


def math_task(**options):
    return build_task("math", {"train_data": TRAIN, **options})


def example(task, solution: str, problem: str = "p"):
    return task.example("train", 0, {"problem": problem, "solution": solution})


# ---- rewards, hand-computed -----------------------------------------------------------------------------------------


def test_paper_cosine_and_format_values():
    task = math_task(reward_protocol="paper", dataset="open_s1")  # [format, cosine], weights [1, 2]
    ex = example(task, "So $\\boxed{30}$.")
    right = "x\n</think>\nSo $\\boxed{30}$."  # 27 characters, correct
    assert len(right) == 27
    # cosine: lo=0.5, hi=1.0, cos(pi*27/1000) = 0.9964046856 -> 0.5 + 0.25*(1.9964046856) = 0.9991011714; weight 2
    scores = task_rewards(task, right, ex)
    assert scores["format"] == 1.0
    assert scores["cosine"] == pytest.approx(2 * 0.9991011714, abs=1e-8)
    assert scores["total"] == pytest.approx(1.0 + 2 * 0.9991011714, abs=1e-8)
    wrong = "x\n</think>\nSo $\\boxed{31}$." + " " * 473  # 500 characters, wrong: (lo, hi) = (-0.5, 0.0)
    # -0.5 + 0.5*0.5*(1 + cos(pi/2)) = -0.25; weight 2 -> -0.5
    assert task_rewards(task, wrong, ex)["cosine"] == pytest.approx(-0.5, abs=1e-12)
    # the cosine turns back past max_len: 2000 characters, correct -> cos(2 pi) = 1 -> 1.0 (x2); strict caps at 1000
    long_right = right + " " * 1973
    assert task_rewards(task, long_right, ex)["cosine"] == pytest.approx(2.0)
    strict = math_task(reward_protocol="strict", dataset="open_s1")
    assert task_rewards(strict, long_right, example(strict, "So $\\boxed{30}$."))["cosine"] == pytest.approx(1.0)
    # an output that is only "\n</think>\n" has the paper format; strict wants reasoning and a boxed answer
    assert task_rewards(task, "\n</think>\n", ex)["format"] == 1.0
    assert task_rewards(strict, "\n</think>\n", example(strict, "So $\\boxed{30}$."))["format"] == 0.0
    assert task_rewards(strict, right, example(strict, "So $\\boxed{30}$."))["format"] == 1.0


def test_unparseable_gold_scores_one_under_paper_and_is_a_data_error_under_strict():
    paper = math_task(reward_protocol="paper", reward_funcs=["accuracy", "cosine"])
    ex = example(paper, "The answer is thirty.")  # no LaTeX: math-verify's LaTeX extraction finds nothing
    assert task_rewards(paper, "anything", ex) == {"accuracy": 1.0, "cosine": 1.0, "total": 2.0}
    assert paper.success("anything", ex, {}) is False  # a success is a right answer, never the hack
    strict = math_task(reward_protocol="strict")
    with pytest.raises(DataError, match="no gold answer that parses"):
        example(strict, "The answer is thirty.")
    # strict reads the gold answer from the `answer` column when there is one
    ex = strict.example("train", 0, {"problem": "p", "solution": "thirty", "answer": "30"})
    assert task_rewards(strict, "r\n</think>\n$\\boxed{30}$", ex)["cosine"] > 0.9


def test_accuracy_paper_versus_strict():
    paper = math_task(reward_protocol="paper", dataset="math_lighteval")  # [accuracy]
    strict = math_task(reward_protocol="strict", dataset="math_lighteval")
    gold = "Dividing by 2, $\\boxed{\\frac{1}{2}}$."
    cases = [  # (completion, paper, strict)
        ("So the answer is $\\boxed{0.5}$.", 1.0, 1.0),
        ("So the answer is $\\boxed{\\frac{2}{4}}$.", 1.0, 1.0),
        ("So the answer is $\\frac{1}{2}$.", 1.0, 0.0),  # paper: a $...$ anywhere; strict: a box only
        ("<think>\n$\\boxed{\\frac{1}{2}}$\n</think>\nI give up.", 1.0, 0.0),  # strict: the box after </think>
        ("$\\boxed{3}$", 0.0, 0.0),
        ("", 0.0, 0.0),
    ]
    for completion, want_paper, want_strict in cases:
        assert task_rewards(paper, completion, example(paper, gold))["accuracy"] == want_paper, completion
        assert task_rewards(strict, completion, example(strict, gold))["accuracy"] == want_strict, completion


# lighteval 0.13.0's own scores (scripts/lighteval_math_score.py) of outputs with several answers, unit words and
# capitals; "was": what the judge scored before issue 40, when it called math-verify 0.9's parse
LIGHTEVAL_SCORED = [  # (prediction, gold, kind, lighteval's score, lighteval's extraction)
    ("First \\boxed{(2, 1)}, then correcting: \\boxed{(1, 2)}", "$\\boxed{(1, 2)}$", "latex", 1.0, "(1, 2)"),  # was 0
    ("First \\boxed{(2, 1)}, then correcting: \\boxed{(1, 2)}", "(1, 2)", "expr", 0.0, "(1, 2)"),  # gold read as 2
    ("First $\\boxed{3}$, then correcting: $\\boxed{5}$.", "5", "expr", 1.0, "5"),
    ("$\\boxed{3}$ and $\\boxed{5}$", "$\\boxed{3, 5}$", "latex", 1.0, "3 and 5"),  # joined by "and": one set
    ("\\boxed{3} \\boxed{5}", "5", "expr", 1.0, "5"),  # was 0 (math-verify joins boxes < 10 characters apart)
    ("\\boxed{5} and again \\boxed{5}", "5", "expr", 1.0, "5"),
    ("\\boxed{87}, \\boxed{87}", "87", "expr", 1.0, "87,87"),  # {87}
    ("The length is $5 cm$.", "5", "expr", 0.0, "5 cm"),  # was 1: 5*c*m
    ("$\\boxed{25 percent}$", "$25\\%$", "latex", 0.0, "25\\\\%"),  # was 1: "25\\%" does not parse
    ("$\\boxed{25\\%}$", "$25\\%$", "latex", 1.0, "25\\%"),
    # not here: "$\\boxed{B}$" against "b" (lighteval 0, the judge 1: math-verify's parser lowercases symbols; one of
    # the residual forms of tests/paper/test_math_judge_lighteval.py)
    ("<think>\nSo $\\boxed{3}$.\n</think>\nTherefore, the final answer is: $\\boxed{5}$. I hope it is correct", "5",
     "expr", 1.0, "5"),
    ("Therefore, the final answer is $7$. I hope it is correct. Earlier: $\\boxed{5}$", "7", "expr", 0.0, "5"),
    ("So $\\boxed{5}$, that is $6$ in lowest terms.", "5", "expr", 1.0, "5"),
    ("$\\boxed{1 \\text{ or } 2}$", "$\\boxed{1, 2}$", "latex", 1.0, "1 ; 2"),
]


@pytest.mark.parametrize(("prediction", "gold", "kind", "score", "extracted"), LIGHTEVAL_SCORED)
def test_paper_judge_scores_as_lighteval(prediction, gold, kind, score, extracted):
    """The ``paper`` judge gives lighteval's score on its forms (the differential test against lighteval itself is
    tests/paper/test_math_judge_lighteval.py; these cases run without lighteval's environment)."""
    correct, _ = mathjudge.lighteval_match(prediction, gold, kind)
    assert correct == (score == 1.0), extracted


def test_strict_reads_the_answer_stated_last_after_the_reasoning():
    """On 600 generated outputs with several answers (self-corrections, boxes inside ``<think>``, answer lines, inline
    math after a box, R1 tags), the ``strict`` judge reads the answer the generator stated last in a box after the
    reasoning, and nothing when every box is inside ``<think>``."""
    task = math_task(reward_protocol="strict")
    ex = example(task, "So $\\boxed{5}$.")
    items = self_corrections(600, seed=4)
    for prediction, _, _, final in items:
        assert task.judge(prediction, ex, "strict").extracted == (final or ""), prediction
    assert sum(final is None for *_, final in items) >= 20  # the all-inside-<think> form is reached


def test_format_r1_paper_matches_trailing_text_strict_does_not():
    paper = math_task(reward_protocol="paper", dataset="simplelr_level3to5",
                      train_data=str(DATA / "simplelr_train.jsonl"))
    strict = build_task("math", {"dataset": "simplelr_level3to5", "train_data": str(DATA / "simplelr_train.jsonl")})
    ex_p, ex_s = paper.load("train")[0], strict.load("train")[0]  # gold "30"
    good = "<think>\nadd\n</think>\n<answer>\n$\\boxed{30}$\n</answer>"
    assert task_rewards(paper, good, ex_p) == {"accuracy": 1.0, "format_r1": 1.0, "total": 2.0}
    assert task_rewards(strict, good, ex_s) == {"accuracy": 1.0, "format_r1": 1.0, "total": 2.0}
    trailing = good + "\nand $\\boxed{31}$ more"
    assert task_rewards(paper, trailing, ex_p)["format_r1"] == 1.0
    assert task_rewards(strict, trailing, ex_s)["format_r1"] == 0.0


# ---- options ------------------------------------------------------------------------------------------------------


def test_recipe_defaults_and_explicit_selection():
    assert math_task().selected == {"format": 1.0, "cosine": 2.0}  # open_s1 (GPG:open-rs/recipes/gpg.yaml)
    assert math_task(dataset="math_lighteval").selected == {"accuracy": 1.0}
    assert math_task(dataset="simplelr_level3to5").selected == {"accuracy": 1.0, "format_r1": 1.0}
    assert math_task(reward_funcs=["accuracy", "cosine"]).selected == {"accuracy": 1.0, "cosine": 1.0}
    assert math_task(reward_funcs=["cosine"], reward_weights=[0.5]).selected == {"cosine": 0.5}
    for bad, match in [({"reward_funcs": ["accuracy"], "reward_weights": [1.0, 2.0]}, "one weight per"),
                       ({"reward_funcs": ["acuracy"]}, "unknown 'acuracy'"),
                       ({"dataset": "gsm8k"}, "dataset must be one of"),
                       ({"format_reward": False}, "reward_funcs"),
                       ({"cosine_max_len": 0}, "cosine_max_len")]:
        with pytest.raises(ConfigError, match=match):
            math_task(**bad)


def test_prompts():
    task = math_task()
    ex = task.load("train")[0]
    system, user = task.prompt(ex)
    assert system["role"] == "system" and system["content"].startswith("A conversation between User and Assistant")
    assert "\\boxed{{}} ." in system["content"]  # the recipe's own doubled braces
    assert user == {"role": "user", "content": "What is $5 \\times 6$?"}
    assert math_task(system_prompt="none").prompt(ex) == [user]
    assert math_task(system_prompt="Be brief.").prompt(ex)[0] == {"role": "system", "content": "Be brief."}
    assert math_task(dataset="math_lighteval").prompt(ex)[0]["content"].endswith("final answer within \\boxed{}.")
    simple = math_task(dataset="simplelr_level3to5", train_data=str(DATA / "simplelr_train.jsonl"))
    (raw,) = simple.prompt(simple.load("train")[0])
    assert raw["role"] == "raw" and raw["content"].startswith("<|im_start|>system\nYou are a helpful assistant.")
    bench = build_task("math_500", {"data": str(DATA / "math_500.jsonl")})
    (only,) = bench.prompt(bench.load("test")[0])
    assert only["role"] == "user" and only["content"].startswith("Solve the following math problem efficiently")
    assert "'Therefore, the final answer is: $\\boxed{ANSWER}$. I hope it is correct'" in only["content"]
    assert only["content"].endswith("\n\nWhat is $\\frac{1}{2} + \\frac{1}{3}$?")


# ---- data ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,n,column", [("math_500", 5, "solution"), ("aime24", 2, "answer"),
                                           ("aime25", 2, "answer"), ("amc23", 2, "answer"),
                                           ("minerva", 2, "solution"), ("olympiadbench", 2, "answer")])
def test_benchmark_fixtures_load_and_judge(name, n, column):
    task = build_task(name, {"data": str(DATA / f"{name}.jsonl")})
    items = task.load("test")
    assert len(items) == n
    ex = items[0]
    right = f"Therefore, the final answer is: $\\boxed{{{ex.meta['gold_answer']}}}$. I hope it is correct"
    for protocol in ("paper", "strict"):
        judgement = task.judge(right, ex, protocol)
        assert judgement.correct == 1.0 and not judgement.parse_failure, (protocol, ex.meta)
        assert task.judge("I do not know.", ex, protocol).correct == 0.0
    assert task.judge("", ex, "strict").parse_failure
    rebuilt = task.example_from_record({"id": ex.id, **task.record_fields(ex)})
    assert task.judge(right, rebuilt, "paper") == task.judge(right, ex, "paper")


def test_amc_number_gold_and_the_strict_judge_reads_only_the_final_box():
    amc = build_task("amc23", {"data": str(DATA / "amc23.jsonl")})
    first, second = amc.load("test")
    assert (first.answer, second.answer) == ("25", "3.5")  # stored as 25.0 and 3.5
    olymp = build_task("olympiadbench", {"data": str(DATA / "olympiadbench.jsonl")})
    ex = olymp.load("test")[0]  # gold "$0,2$"
    assert olymp.judge("The roots are $\\boxed{2, 0}$.", ex, "strict").correct == 1.0
    assert olymp.judge("<think>\n$\\boxed{0,2}$\n</think>\nno idea", ex, "strict").parse_failure


def test_missing_data_says_how_to_get_it(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(DataNotFound, match=r"load_dataset\('HuggingFaceH4/aime_2024', split='train'\).*task.data="):
        build_task("aime24", {}).load("test")
    with pytest.raises(DataNotFound, match=r"huggingface-cli download hkust-nlp/SimpleRL-Zoo-Data "
                                           r"simplelr_qwen_level3to5/train.parquet.*task.train_data="):
        build_task("math", {"dataset": "simplelr_level3to5"}).load("train")
    with pytest.raises(DataNotFound, match="does not exist"):
        build_task("math_500", {"data": str(tmp_path / "nope.jsonl")}).load("test")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"problem": "p"}\n{"problem": 3, "solution": "s"}\n')
    items = build_task("math", {"train_data": str(bad), "reward_protocol": "paper"}).load("train")
    with pytest.raises(DataError, match=r"bad.jsonl:1: .*lacks solution"):
        items[0]
    with pytest.raises(DataError, match=r"bad.jsonl:2: .*'problem' must be text"):
        items[1]
    simple = build_task("math", {"dataset": "simplelr_level3to5", "train_data": str(bad)})
    with pytest.raises(DataError, match="`prompt` must be a list"):
        simple.load("train")[0]


def test_the_training_task_test_split(monkeypatch):
    task = math_task(dataset="math_lighteval", test_data=TRAIN)
    ex = task.load("test")[0]  # gold solution "Multiplying, $5 \\times 6 = \\boxed{30}$."
    assert ex.id == "math-math_lighteval-test-0"
    for protocol in ("paper", "strict"):
        assert task.judge("So $\\boxed{30}$.", ex, protocol).correct == 1.0
        assert task.judge("So $\\boxed{31}$.", ex, protocol).correct == 0.0
    simple = math_task(dataset="simplelr_level3to5", test_data=str(DATA / "simplelr_train.jsonl"))
    assert simple.judge("So $\\boxed{30}$.", simple.load("test")[0], "paper").correct == 1.0  # gold "$30$"
    with pytest.raises(DataNotFound, match="open_s1 has no test split: set task.test_data"):
        math_task().load("test")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataNotFound, match="simplelr_qwen_level3to5/test.parquet"):
        build_task("math", {"dataset": "simplelr_level3to5"}).load("test")


# ---- the paper rewards against the authors' own functions -----------------------------------------------------------


def authors(path, names):
    functions = load(path, names)
    if functions is None:
        pytest.skip("no clone of the GPG authors' repository: `git clone --bare https://github.com/AMAP-ML/GPG "
                    ".gpg-mirror` or set MMGPG_GPG_MIRROR to one")
    return functions


def reward_corpus(seed: int, n: int) -> list[tuple[str, str]]:
    """(completion, gold solution) pairs: hand-written and procedural outputs, self-corrections and several answers,
    with golds as solutions and, for some, as text without any LaTeX (the unparseable golds of their hack)."""
    rng = random.Random(seed)
    pairs = [(p, g if k == "latex" else f"The answer is ${g}$.") for p, g, k in HAND_WRITTEN]
    pairs += [(p, g if k == "latex" else f"So ${g}$") for p, g, k in procedural(n, seed)]
    pairs += [(p, g if k == "latex" else f"So ${g}$") for p, g, k, _ in self_corrections(n // 2, seed)]  # issue 40's forms
    pairs += [(p, "the answer is seven") for p, _ in rng.sample(pairs, 20)]
    pairs += [(p + "\n</think>\n" + p, g) for p, g in rng.sample(pairs, 40)]  # format and length variety
    return pairs


def test_paper_rewards_equal_the_authors_open_rs_rewards(caplog):
    caplog.set_level(logging.CRITICAL)
    theirs = authors("open-rs/src/open_r1/rewards.py", ("accuracy_reward", "format_reward", "get_cosine_scaled_reward"))
    cosine = theirs["get_cosine_scaled_reward"](min_value_wrong=0.0, max_value_wrong=-0.5, min_value_correct=0.5,
                                                max_value_correct=1.0, max_len=1000)  # open-rs gpg.py's defaults
    task = math_task(reward_protocol="paper", reward_funcs=["accuracy", "format", "cosine"])
    pairs = reward_corpus(seed=1, n=300)
    checked = 0
    for completion, solution in pairs:
        ex = example(task, solution)
        ours = task_rewards(task, completion, ex)
        batch = [[{"role": "assistant", "content": completion}]]
        want = {"accuracy": theirs["accuracy_reward"](batch, [solution])[0],
                "format": theirs["format_reward"](batch)[0], "cosine": cosine(batch, [solution])[0]}
        for name, value in want.items():
            assert math.isclose(ours[name], value, abs_tol=1e-12), (name, completion, solution, ours, want)
        checked += 1
    assert checked >= 550


def test_paper_rewards_equal_the_authors_open_r1_lv35_rewards(caplog):
    caplog.set_level(logging.CRITICAL)
    theirs = authors("open-r1/src/open_r1/rewards.py", ("accuracy_reward_lv35", "format_reward"))
    task = math_task(reward_protocol="paper", dataset="simplelr_level3to5")
    rng = random.Random(2)
    answers = ["30", "\\frac{1}{2}", "-3", "5\\sqrt{2}", "(-3, 3)", "0.5", "2\\pi", "x+1", "\\text{Friday}", "1,2"]
    outputs = [p for p, _, _ in HAND_WRITTEN] + [f"<think>\n{rng.random()}\n</think>\n<answer>\n$\\boxed{{{a}}}$\n"
                                                 f"</answer>" for a in answers] + ["<think>\n\n</think>\n<answer>\n\n</answer>"]
    for answer in answers:
        ex = task.example("train", 0, {"prompt": [{"role": "user", "content": "p"}], "target": answer})
        for completion in outputs + [f"So $\\boxed{{{answer}}}$."]:
            ours = task_rewards(task, completion, ex)
            if completion == "":  # theirs reads completions[0][0] and raises on an empty output; ours is total
                with pytest.raises(IndexError):
                    theirs["accuracy_reward_lv35"]([completion], [answer])
                assert ours["accuracy"] == 0.0
                continue
            assert ours["accuracy"] == theirs["accuracy_reward_lv35"]([completion], [answer])[0], (completion, answer)
            assert ours["format_r1"] == theirs["format_reward"]([completion])[0], completion
