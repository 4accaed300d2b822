"""Training-reward corpora for the differential tests of the ``paper`` rewards against the GPG authors' own reward
functions (``tests/paper/test_rewards_differential.py``). Seeded: the same seed gives the same corpus everywhere.

Each family gets (solution, completion) pairs: procedural ones built with the judge corpus' layouts
(:func:`support.judge_corpus.wrap`: think/answer, think-only, bare, several/unclosed/nested tags, tags in other
case, Unicode whitespace anywhere) and answer forms, plus hand-written adversarial completions aimed at each
reward's quirks (empty, whitespace-only, nested ``<answer>``, case, full-width characters; for boxes: inverted on one
or both axes, degenerate, negative, zero-padded, many-digit, float-overflowing and 4,300+-digit coordinates, several
boxes, the gold string itself with and without the solution's spaces).
"""

from __future__ import annotations

import random

from support.judge_corpus import THINKS, WS, _box_text, _cv_answer, _label_answer, _pred_box, wrap

ADVERSARIAL_LAYOUTS = [  # {a} = an answer
    "", " ", "\n", "\u3000", "<answer></answer>", "<answer> </answer>", "<think></think><answer></answer>",
    "<answer>{a}</answer>", "<answer> {a} </answer>", "<answer>\n{a}\n</answer>", "{a}", " {a} ", "<ANSWER>{a}</ANSWER>",
    "<answer><answer>{a}</answer></answer>", "<answer>x<answer>{a}</answer>", "<answer>{a}</answer><answer>x</answer>",
    "<answer>x</answer><answer>{a}</answer>", "<think><answer>{a}</answer></think>", "<think>{a}</think>",
    "<think>a</think>\n<answer>{a}</answer>\n", "<think>a</think><answer>{a}", "{a}</answer>",
    "<think>a</think> <answer>{a}</answer>", "<think>a\n</think>\n\n<answer>{a}</answer>",
    "<think>a</think><answer>{a}</answer><|im_end|>", "\u200b<think>a</think><answer>{a}</answer>",
    "<think>a</think>\u00a0<answer>{a}</answer>", "<think>a</think>x<answer>{a}</answer>",
    "<think>{a}</think><answer>{a}</answer>", "<answer>{a}\n</answer>", "<answer>\u00a0{a}\u00a0</answer>",
]


def adversarial(answers: list[str]) -> list[str]:
    """Every adversarial layout around every answer."""
    return [layout.format(a=a) for a in answers for layout in ADVERSARIAL_LAYOUTS]


# ---- GEOQA (R1-V grpo.py) ----------------------------------------------------------------------------------------

GEOQA_GOLDS = ["140°", "60°", "3", "2√{3}", "4.5", "9π", "√{3}", "\\frac{1}{2}", "20cm", "2√{15}米", "0.6", "120",
               "-1", "1:2", "45°"]


def _geoqa_answer(rng: random.Random, gold: str) -> str:
    other = rng.choice(GEOQA_GOLDS)
    forms = [gold, gold, f" {gold} ", gold.rstrip("°"), f"{gold}.", f"${gold}$", f"\\boxed{{{gold}}}", f"x = {gold}",
             f"The answer is {gold}", other, f"{other} or {gold}", f"{gold} or {other}", "", "none", gold.upper(),
             gold.replace("√", "\\sqrt"), f"{gold}\n{other}", "３", "1e3", "2/4", "0.50", "1/2"]
    return rng.choice(forms)


def geoqa_corpus(n: int, seed: int = 23) -> list[tuple[str, str]]:
    """``(solution, completion)`` pairs; solutions are ``<answer>{gold}</answer>`` (the hub set's form) and, for
    one in ten, an unusual spelling (spaces, bare, a newline inside)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        gold = rng.choice(GEOQA_GOLDS)
        solution = rng.choice([f"<answer>{gold}</answer>"] * 9 + [f"<answer> {gold} </answer>", gold,
                                                                  f"<answer>{gold}\n</answer>"])
        out.append((solution, wrap(rng, _geoqa_answer(rng, gold), decoy=rng.choice(GEOQA_GOLDS))))
    out += [(f"<answer>{g}</answer>", c) for g in ("140°", "2√{3}", "3") for c in adversarial([g, "x", "3 or 4"])]
    return out


# ---- CV-Bench / SAT (VisualThinker-R1-Zero grpo.py) ---------------------------------------------------------------

SAT_ITEMS = [  # (options, right answer) in SAT's shapes: option texts, numbers, yes/no, RAVEN-like letters
    (["left", "right"], "left"), (["yes", "no"], "no"), (["3", "2", "1", "0"], "2"), (["above", "below"], "below"),
    (["the lamp", "the table"], "the table"), (["A", "B", "C", "D"], "C"), (["closer", "farther"], "closer"),
    (["rotate left", "rotate right", "move forward"], "move forward"),
]


def sat_corpus(n: int, seed: int = 23) -> list[tuple[list[str], str, str]]:
    """``(options, assistant answer, completion)``; one answer in ten is stored with spaces or a newline around it
    (the authors read their ground truth back out of ``<answer>{answer}</answer>``)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        options, right = rng.choice(SAT_ITEMS)
        stored = rng.choice([right] * 9 + [f" {right} ", f"{right}\n", f"\n{right}"])
        k = options.index(right)
        answer = rng.choice([_cv_answer(rng, options, k), right, right, f"({'ABCDEFGH'[rng.randrange(8)]})",
                             f"[{'ABCDEFGH'[rng.randrange(8)]}]", f"{right} A", f"B {right}", f" {right} "])
        out.append((options, stored, wrap(rng, answer, decoy=rng.choice(options))))
    for options, right in SAT_ITEMS[:4]:
        out += [(options, right, c) for c in adversarial([right, options[-1], "A", "(B)", "H", "x A", f"{right}\n"])]
    return out


# ---- fine-grained classification (Visual-RFT grpo_classification.py) ------------------------------------------------


def classification_corpus(classes: list[str], n: int, seed: int = 23) -> list[tuple[str, str]]:
    """``(solution, completion)``; solutions ``<answer>{label}</answer>``, one in ten with spaces or an underscore
    spelling."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        label = rng.choice(classes)
        solution = rng.choice([f"<answer>{label}</answer>"] * 9 + [f"<answer> {label} </answer>",
                                                                   f"<answer>{label.replace(' ', '_')}</answer>"])
        decoy = _label_answer(rng, classes, rng.choice(classes))
        out.append((solution, wrap(rng, _label_answer(rng, classes, label), decoy=decoy)))
    label = classes[0]
    out += [(f"<answer>{label}</answer>", c) for c in adversarial([label, label[:2], label.upper(), "x", "\t"])]
    return out


# ---- LISA grounding (Visual-RFT grpo_lisa.py) -------------------------------------------------------------------


def lisa_box_answers(gold: tuple[int, int, int, int]) -> list[str]:
    """Hand-written answers around a gold box (0–1000 units): exact, inverted, degenerate, huge, many-digit."""
    x1, y1, x2, y2 = gold
    big = "9" * 312  # int(...) / 1000 overflows a float
    return [
        f"({x1},{y1}),({x2},{y2})", f"({x1}, {y1}), ({x2}, {y2})", f"({x2},{y2}),({x1},{y1})", f"({x2},{y1}),({x1},{y2})",
        f"({x1},{y2}),({x2},{y1})", "(999,999),(0,0)", "(1000,0),(0,1000)", f"({x1},{y1}),({x1},{y1})",
        f"({x1},{y1}),({x1},{y2})", "(0,0),(0,0)", f"(-{x1},{y1}),({x2},{y2})", f"({x1}.5,{y1}),({x2},{y2})",
        f"({x1:05d},{y1:07d}),({x2},{y2})", f"(000000000000{x1},{y1}),({x2},{y2})", f"({x1}0000000000,{y1}),({x2},{y2})",
        f"({big},{y1}),({x2},{y2})", f"({big},{y1}),({x2},{y2}) ({x1},{y1}),({x2},{y2})", f"({'9' * 308},1),(2,3)",
        f"({'1' + '0' * 4400},{y1}),({x2},{y2})", f"({'0' * 4301}{x1},{y1}),({x2},{y2})", f"({10**40},{y1}),({x2},{y2})",
        f"({x1},{y1}),({x2},{y2}),({x1},{y1}),({x2},{y2})", f"({x1},{y1}),({x2},{y2}) (0,0),(1000,1000)",
        f"(0,0),(1000,1000) ({x1},{y1}),({x2},{y2})", f"({x2},{y2}),({x2},{y2}) ({x1},{y1}),({x1},{y1})",
        f"[{x1},{y1},{x2},{y2}]", f"({x1},{y1},{x2},{y2})", "".join(chr(0xFF10 + int(c)) if c.isdigit() else c
                                                                for c in f"({x1},{y1}),({x2},{y2})"),
        f"(\u00a0{x1}\u3000,{y1}),\n({x2},{y2})", f"(1e3,{y1}),({x2},{y2})", "(0,0),(1000,1000)", "",
        f"({10**200},{y1}),({x2},{y2})", f"({10**300},{10**300}),(0,0)",  # areas overflow to inf / NaN
    ]


def lisa_corpus(golds: list[tuple[int, int, int, int]], n: int, seed: int = 23) -> list[tuple[int, str]]:
    """``(index into golds, completion)``: procedural answers (jittered, inverted, degenerate, random, several
    boxes, a box in the reasoning) in the judge corpus' layouts and number spellings, then every hand-written
    answer of :func:`lisa_box_answers` in every adversarial layout for the first two golds."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        k = rng.randrange(len(golds))
        gold = golds[k]
        answer = _box_text(rng, _pred_box(rng, gold))
        if rng.random() < 0.3:
            second = _box_text(rng, _pred_box(rng, gold))
            answer = rng.choice([f"{answer},{second}", f"{second} {answer}", f"{answer}\n{second}"])
        if rng.random() < 0.1:
            answer = rng.choice(lisa_box_answers(gold))
        think = rng.choice(THINKS) + (rng.choice(WS) + _box_text(rng, _pred_box(rng, gold)) if rng.random() < 0.2 else "")
        out.append((k, wrap(rng, answer, think=think, decoy=_box_text(rng, _pred_box(rng, gold)))))
    for k in (0, 1):
        out += [(k, c) for c in adversarial(lisa_box_answers(golds[k]))]
    return out
