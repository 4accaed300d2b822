"""A corpus of math model outputs and golds for differential tests of the math judges: realistic outputs (the model
conversations of champ-dataset, when its JSON file is given), procedurally generated answers in many forms (seeded),
and hand-written adversarial cases. Each item: ``{"id", "prediction", "gold", "kind"}`` with ``kind`` ``latex``
(gold = a MATH-style solution or a ``$...$`` answer, as MATH-500/Minerva/OlympiadBench) or ``expr`` (gold = a bare
answer, as AIME/AMC)."""

from __future__ import annotations

import json
import random
from fractions import Fraction
from pathlib import Path

HAND_WRITTEN: list[tuple[str, str, str]] = [  # (prediction, gold, kind)
    ("", "$\\boxed{5}$", "latex"),
    ("", "5", "expr"),
    ("Therefore, the final answer is: $\\boxed{5}$. I hope it is correct", "5", "expr"),
    ("Therefore, the final answer is: $\\boxed{5}$. I hope it is correct", "So $x=\\boxed{5}$.", "latex"),
    ("Therefore, the final answer is: $\\boxed{}$. I hope it is correct", "5", "expr"),
    ("Therefore, the final answer is: $\\boxed{ANSWER}$. I hope it is correct", "5", "expr"),
    ("$\\boxed{3}$ and then $\\boxed{5}$", "5", "expr"),
    ("$\\boxed{5}$ and then $\\boxed{3}$", "5", "expr"),
    ("The answer is \\boxed{0.5}", "$\\frac{1}{2}$", "latex"),
    ("The answer is $\\frac{1}{2}$", "0.5", "expr"),
    ("The answer is $\\dfrac12$.", "$\\boxed{\\frac{1}{2}}$", "latex"),
    ("The answer is $0.333333$", "$\\boxed{\\frac{1}{3}}$", "latex"),
    ("The answer is $0.33$", "$\\boxed{\\frac{1}{3}}$", "latex"),
    ("The answer is $50\\%$", "$\\boxed{50}$", "latex"),
    ("The answer is $50\\%$", "$\\boxed{0.5}$", "latex"),
    ("The answer is $9\\%$", "9", "expr"),
    ("The angle is $\\boxed{120^\\circ}$", "$\\boxed{120}$", "latex"),
    ("The angle is $\\boxed{120}$", "$\\boxed{120^\\circ}$", "latex"),
    ("The area is $\\boxed{12 \\text{ cm}^2}$", "$\\boxed{12}$", "latex"),
    ("The speed is \\boxed{60\\ \\text{km/h}}", "Speed $=\\boxed{60}$", "latex"),
    ("So $x \\in \\boxed{(-3, 3)}$", "$\\boxed{(-3,3)}$", "latex"),
    ("So $x \\in \\boxed{[-3, 3)}$", "$\\boxed{(-3,3)}$", "latex"),
    ("So $\\boxed{-3 < x < 3}$", "$\\boxed{(-3,3)}$", "latex"),
    ("The roots are $\\boxed{2, 0}$", "$\\boxed{0,2}$", "latex"),
    ("The roots are $\\boxed{\\{0, 2\\}}$", "$0,2$", "latex"),
    ("$\\boxed{\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}}$",
     "$\\boxed{\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}}$", "latex"),
    ("$\\boxed{\\begin{pmatrix} 1 & 2 \\\\ 3 & 5 \\end{pmatrix}}$",
     "$\\boxed{\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}}$", "latex"),
    ("$\\boxed{5\\sqrt{2}}$", "$\\boxed{\\sqrt{50}}$", "latex"),
    ("$\\boxed{7.0710678}$", "$\\boxed{5\\sqrt{2}}$", "latex"),
    ("$\\boxed{2\\pi}$", "$\\boxed{6.28318}$", "latex"),
    ("$\\boxed{x^2+2x+1}$", "$\\boxed{(x+1)^2}$", "latex"),
    ("$\\boxed{y = 2x + 1}$", "$\\boxed{2x+1}$", "latex"),
    ("$\\boxed{\\text{Friday}}$", "$\\boxed{\\text{Friday}}$", "latex"),
    ("Friday", "$\\boxed{\\text{Friday}}$", "latex"),
    ("$\\boxed{\\textbf{(C)}\\ 12}$", "12", "expr"),
    ("$\\boxed{(C)}$", "$\\boxed{\\text{(C)}}$", "latex"),
    ("<think>\nMaybe 3? No.\n</think>\nTherefore, the final answer is: $\\boxed{204}$.", "204", "expr"),
    ("<think>\nThe answer is $\\boxed{3}$.\n</think>\n", "204", "expr"),
    ("<think>\nlong reasoning that never ends 1 2 3", "204", "expr"),
    ("The answer is 204", "204", "expr"),
    ("The answer is 0204", "204", "expr"),
    ("The answer is $204.$", "204", "expr"),
    ("The answer is $2{,}024$", "2024", "expr"),
    ("The answer is 2,024", "2024", "expr"),
    ("The answer is $\\boxed{1e10}$", "10000000000", "expr"),
    ("The answer is $\\boxed{10^{10}}$", "10000000000", "expr"),
    ("$\\boxed{123456789012345678901234567890}$", "123456789012345678901234567890", "expr"),
    ("$\\boxed{123456789012345678901234567891}$", "123456789012345678901234567890", "expr"),
    ("\\[ \\boxed{\\frac{\\sqrt{3}}{2}} \\]", "$\\boxed{\\frac{\\sqrt3}{2}}$", "latex"),
    ("\\( \\frac{1}{2} \\)", "$\\boxed{\\frac{1}{2}}$", "latex"),
    ("$$\\frac{1}{2}$$", "$\\boxed{\\frac{1}{2}}$", "latex"),
    ("\\boxed{\\frac{1}{2}", "$\\boxed{\\frac{1}{2}}$", "latex"),
    ("\\boxed{{{{{{", "$\\boxed{1}$", "latex"),
    ("}}}}$$$\\\\\\", "$\\boxed{1}$", "latex"),
    ("$\\boxed{-\\frac{3}{4}}$", "$\\boxed{-0.75}$", "latex"),
    ("$\\boxed{\\frac{-3}{4}}$", "-3/4", "expr"),
    ("$\\boxed{\\infty}$", "$\\boxed{\\infty}$", "latex"),
    ("$\\boxed{(-\\infty, 2]}$", "$\\boxed{(-\\infty,2]}$", "latex"),
    ("$\\boxed{1+i}$", "$\\boxed{1+i}$", "latex"),
    ("$\\boxed{\\log_2 8}$", "$\\boxed{3}$", "latex"),
    ("$\\boxed{\\binom{6}{3}}$", "20", "expr"),
    ("$\\boxed{3!}$", "6", "expr"),
    ("The final answer is $x=5$", "$\\boxed{5}$", "latex"),
    ("final answer: 5", "5", "expr"),
    ("Answer: 17", "17", "expr"),
    ("So the answer is **17**.", "17", "expr"),
    # issue 40: a self-correction (lighteval keeps the last box), a unit or "percent" as a bare word in math (lighteval
    # keeps it: 5*c*m, an unparseable 25\\%), symbols in capitals (lighteval's parser keeps their case)
    ("First \\boxed{(2, 1)}, then correcting: \\boxed{(1, 2)}", "$\\boxed{(1, 2)}$", "latex"),
    ("First \\boxed{(2, 1)}, then correcting: \\boxed{(1, 2)}", "(1, 2)", "expr"),
    ("\\boxed{3} \\boxed{5}", "5", "expr"),
    ("The length is $5 cm$.", "5", "expr"),
    ("$\\boxed{25 percent}$", "$25\\%$", "latex"),
    ("The answer is $\\boxed{B}$", "$\\boxed{b}$", "latex"),
    ("$\\boxed{2X+1}$", "$\\boxed{2x+1}$", "latex"),
]


def _number(rng: random.Random) -> tuple[str, str, list[str]]:
    """(LaTeX gold, bare gold, equivalent and near-miss LaTeX renderings)."""
    kind = rng.randrange(10)
    if kind == 0:
        n = rng.randrange(0, 1000)
        return str(n), str(n), [str(n), f"{n}.0", f"{n:03d}", str(n + 1), f"{n}\\%", f"{n}^\\circ"]
    if kind == 1:
        f = Fraction(rng.randrange(-30, 30), rng.randrange(2, 13))
        d = float(f)
        return (f"\\frac{{{f.numerator}}}{{{f.denominator}}}", f"{f.numerator}/{f.denominator}",
                [f"\\frac{{{f.numerator}}}{{{f.denominator}}}", f"\\dfrac{{{f.numerator}}}{{{f.denominator}}}",
                 f"{d:.5f}", f"{d:.2f}", f"{d:.8f}", f"\\frac{{{2 * f.numerator}}}{{{2 * f.denominator}}}",
                 f"{f.numerator}/{f.denominator}", f"\\frac{{{f.numerator + 1}}}{{{f.denominator}}}"])
    if kind == 2:
        a, b = rng.randrange(1, 10), rng.choice([2, 3, 5, 6, 7])
        return (f"{a}\\sqrt{{{b}}}", f"{a}*sqrt({b})",
                [f"{a}\\sqrt{{{b}}}", f"\\sqrt{{{a * a * b}}}", f"{a * b ** 0.5:.6f}", f"{a}\\sqrt{b}",
                 f"{a + 1}\\sqrt{{{b}}}"])
    if kind == 3:
        a = rng.randrange(1, 10)
        return (f"{a}\\pi", f"{a}*pi", [f"{a}\\pi", f"\\pi \\cdot {a}", f"{a * 3.14159265:.5f}", f"{a}"])
    if kind == 4:
        lo, hi = sorted(rng.sample(range(-20, 20), 2))
        br = rng.choice(["()", "[]", "(]", "[)"])
        iv = f"{br[0]}{lo}, {hi}{br[1]}"
        other = f"{'[' if br[0] == '(' else '('}{lo}, {hi}{br[1]}"
        return (iv.replace("[", "\\left[").replace("(", "\\left(").replace("]", "\\right]").replace(")", "\\right)")
                if rng.random() < 0.2 else iv, iv, [iv, other, f"{lo} < x < {hi}", f"x \\in {iv}"])
    if kind == 5:
        xs = sorted(rng.sample(range(-9, 10), rng.randrange(2, 4)))
        s = ", ".join(map(str, xs))
        return (s, s, [s, ", ".join(map(str, reversed(xs))), "\\{" + s + "\\}", s + ", 100", f"x = {xs[0]}"])
    if kind == 6:
        m = [[rng.randrange(-5, 6) for _ in range(2)] for _ in range(2)]
        tex = "\\begin{pmatrix} " + " \\\\ ".join(" & ".join(map(str, r)) for r in m) + " \\end{pmatrix}"
        bad = "\\begin{pmatrix} " + " \\\\ ".join(" & ".join(map(str, r)) for r in m[::-1]) + " \\end{pmatrix}"
        return tex, tex, [tex, bad, tex.replace("pmatrix", "bmatrix")]
    if kind == 7:
        n = rng.randrange(1, 100)
        return (f"{n}\\%", f"{n}%", [f"{n}\\%", str(n), f"{n / 100:g}", f"{n}\\,\\%", f"{n} percent"])
    if kind == 8:
        n = rng.randrange(1, 50)
        unit = rng.choice(["cm", "m", "km", "dollars", "inches", "units"])
        return (f"{n}\\text{{ {unit}}}", str(n), [f"{n}\\text{{ {unit}}}", str(n), f"{n}\\ \\mathrm{{{unit}}}",
                                                  f"\\${n}", f"{n + 1} {unit}"])
    n = rng.choice([10 ** 12, 2 ** 64, 10 ** 30 + 7, 999999999999, 3 ** 40])
    return str(n), str(n), [str(n), f"{n:,}", f"{n:.6e}", str(n - 1), f"{float(n)}"]


_NOISE = ["", "\\,", "\\!", "\\displaystyle ", "\\left. ", "~"]


def _prediction(rng: random.Random, answer: str) -> str:
    form = rng.randrange(12)
    noise = rng.choice(_NOISE)
    if form == 0:
        return f"Therefore, the final answer is: $\\boxed{{{noise}{answer}}}$. I hope it is correct"
    if form == 1:
        return f"We compute step by step.\n\nSo the answer is $\\boxed{{{answer}}}$."
    if form == 2:
        return f"The answer is {answer}"
    if form == 3:
        return f"The answer is ${answer}$."
    if form == 4:
        return f"<think>\nLet me try {rng.randrange(100)} first.\n</think>\nThe final answer is $\\boxed{{{answer}}}$"
    if form == 5:
        return f"First $\\boxed{{{rng.randrange(100)}}}$, then correcting: $\\boxed{{{answer}}}$."
    if form == 6:
        return f"Answer: $\\boxed{{{answer}}}$ (or maybe $\\boxed{{{rng.randrange(100)}}}$)"
    if form == 7:
        full = f"Therefore, the final answer is: $\\boxed{{{answer}}}$. I hope it is correct"
        return full[: rng.randrange(len(full))]
    if form == 8:
        return f"\\[ x = {answer} \\]"
    if form == 9:
        return f"$x = {rng.randrange(10)}$ and so $y = {answer}$"
    if form == 10:
        return f"**Final Answer** \\boxed{{{answer}}}"
    return f"{noise}{answer}"


def _gold(rng: random.Random, latex: str, bare: str, kind: str) -> str:
    if kind == "expr":
        return bare
    form = rng.randrange(4)
    if form == 0:
        return f"We find that the value is $\\boxed{{{latex}}}$."
    if form == 1:
        return f"${latex}$"
    if form == 2:
        return f"Solving, we get $x = {latex}$. So the answer is $\\boxed{{{latex}}}$."
    return f"The answer is $\\boxed{{{latex}}}$, since ${rng.randrange(10)} + 1$ is smaller."


def procedural(n: int, seed: int) -> list[tuple[str, str, str]]:
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        latex, bare, renders = _number(rng)
        kind = rng.choice(["latex", "expr"])
        gold = _gold(rng, latex, bare, kind)
        for render in rng.sample(renders, min(len(renders), 3)):
            out.append((_prediction(rng, render), gold, kind))
    return out[:n]


def champ(path: Path, per_problem: int, seed: int) -> list[tuple[str, str, str]]:
    """Real model outputs (GPT-3.5, GPT-4, PaLM 2, Llama 2 conversations of champ-dataset 1.0.0) judged against the
    problem's answer, as a bare answer (``expr``) and boxed in a solution (``latex``)."""
    rng = random.Random(seed)
    problems = json.loads(path.read_text(encoding="utf-8"))["problems"]
    out = []
    for key in sorted(problems):
        p = problems[key]
        answer = p.get("_answer") or ""
        texts = sorted({m["text"] for conv in p.get("conversations", {}).values() for m in conv["messages"]
                        if str(m.get("role", "")).startswith("Model") and m.get("text")})
        for text in rng.sample(texts, min(per_problem, len(texts))):
            kind = rng.choice(["latex", "expr"])
            gold = answer if kind == "expr" else f"The answer is $\\boxed{{{answer}}}$."
            out.append((text, gold, kind))
    return out


def corpus(champ_json: Path | None, *, seed: int = 0, n_procedural: int = 1400, champ_per_problem: int = 3) -> list[dict]:
    items = list(HAND_WRITTEN) + procedural(n_procedural, seed)
    if champ_json is not None:
        items += champ(champ_json, champ_per_problem, seed)
    return [{"id": i, "prediction": p, "gold": g, "kind": k} for i, (p, g, k) in enumerate(items)]


# ---- self-corrections and several answers (issue 40) ---------------------------------------------------------------

_UNITS = ["cm", "m", "km", "inches", "feet", "dollars", "units", "degrees", "meters", "hours", "apples", "mph"]
_BETWEEN = [", then correcting: ", ". Wait, that is wrong; the answer is ", ". Hmm, let me recheck.\n\nActually ",
            " ", ", ", " and ", " or ", ",\\quad ", "\n\nNo: ", " (not ", ". So "]


def _box(rng: random.Random, answer: str) -> str:
    """One answer in a box, in one of the ways models write it."""
    form = rng.randrange(7)
    return [f"$\\boxed{{{answer}}}$", f"\\boxed{{{answer}}}", f"\\[\\boxed{{{answer}}}\\]", f"\\(\\boxed{{{answer}}}\\)",
            f"$$\\boxed{{{answer}}}$$", f"\\fbox{{{answer}}}", f"$x = \\boxed{{{answer}}}$"][form]


def _several(rng: random.Random, right: str, wrong: str) -> tuple[str, str | None]:
    """``(prediction, final)``: an output with several answers, and the answer it states last in a box after its
    reasoning (None when every box is inside ``<think>``)."""
    form = rng.randrange(14)
    first, last = (wrong, right) if rng.random() < 0.7 else (right, wrong)
    between = rng.choice(_BETWEEN)
    if form == 0:  # a self-correction: two boxes
        return f"First {_box(rng, first)}{between}{_box(rng, last)}.", last
    if form == 1:  # the box inside <think>, the final one after it
        return (f"<think>\nI guess {_box(rng, first)}.{between}maybe not.\n</think>\n"
                f"Therefore, the final answer is: $\\boxed{{{last}}}$. I hope it is correct", last)
    if form == 2:  # only inside <think>: nothing after it
        return f"<think>\nSo {_box(rng, first)}{between}{_box(rng, last)}\n</think>\n", None
    if form == 3:  # "the final answer is" with no box after a boxed guess
        return f"Guess: {_box(rng, first)}.\nTherefore, the final answer is ${last}$. I hope it is correct.", first
    if form == 4:  # inline math after the box
        return f"So {_box(rng, first)}, that is ${last}$ in lowest terms.", first
    if form == 5:  # three boxes, the middle one repeated
        return f"{_box(rng, first)}{between}{_box(rng, last)}{rng.choice(_BETWEEN)}{_box(rng, last)}", last
    if form == 6:  # the same box twice
        return f"{_box(rng, last)} and again {_box(rng, last)}", last
    if form == 7:  # a final-answer line, then a correction after it
        return f"The final answer is ${first}$.\n\nWait: {_box(rng, last)}", last
    if form == 8:  # several answers in one box, joined by a word
        joiner = rng.choice([" and ", " or ", ", ", "\\text{ and }", "\\text{ or }", "; "])
        return f"The solutions are $\\boxed{{{first}{joiner}{last}}}$.", f"{first}{joiner}{last}"
    if form == 9:  # an answer line with inline math, then a box
        return f"Answer: ${first}$. Double-checking, {_box(rng, last)}", last
    if form == 10:  # boxes right next to each other
        return f"\\boxed{{{first}}}\\boxed{{{last}}}", last
    if form == 11:  # a long correction between the boxes
        return (f"{_box(rng, first)}\n\n" + "Let me verify this. " * rng.randrange(1, 5) + f"Fixed: {_box(rng, last)}",
                last)
    if form == 12:  # R1 style: think, answer tags
        return f"<think>\n{_box(rng, first)}{between}\n</think>\n<answer>\n{_box(rng, last)}\n</answer>", last
    return f"**Final Answer**\n{_box(rng, first)}{between}**Final Answer**\n{_box(rng, last)}", last


def _unit_word(rng: random.Random) -> tuple[str, str, str, str | None]:
    """``(prediction, gold latex, gold bare, final)``: a unit or ``percent`` written as a bare word inside math."""
    n = rng.randrange(1, 200)
    unit = rng.choice(_UNITS + ["percent", "percent", "\\%"])
    form = rng.randrange(6)
    answer, final = [(f"${n} {unit}$", None), (f"$\\boxed{{{n} {unit}}}$", f"{n} {unit}"),
                     (f"\\boxed{{{n}\\ {unit}}}", f"{n}\\ {unit}"), (f"$\\boxed{{{n}{unit}}}$", f"{n}{unit}"),
                     (f"The answer is ${n}\\text{{ {unit}}}$", None),
                     (f"$\\boxed{{{n} \\text{{{unit}}}}}$", f"{n} \\text{{{unit}}}")][form]
    prediction = rng.choice([f"So it is {answer}.", f"Therefore, the final answer is: {answer}. I hope it is correct",
                             answer])
    gold = f"{n}\\%" if "percent" in unit or "%" in unit else str(n)
    return prediction, gold, str(n), final


def self_corrections(n: int, seed: int) -> list[tuple[str, str, str, str | None]]:
    """``n`` seeded items ``(prediction, gold, kind, final)`` of the forms the authors' metric sees from reasoning
    models: several boxes (self-corrections, repeats, boxes side by side, joined by and/or/commas), boxes inside
    ``<think>``, "Therefore, the final answer is" lines, inline math after a box, R1-style ``<answer>`` tags, and
    units or ``percent`` written as bare words inside math. ``final`` is the answer the output states last in a box
    after its reasoning (None when there is none), which the ``strict`` protocol must read."""
    rng = random.Random(seed)
    out: list[tuple[str, str, str, str | None]] = []
    while len(out) < n:
        if rng.random() < 0.12:
            prediction, latex, bare, final = _unit_word(rng)
            kind = rng.choice(["latex", "expr"])
            out.append((prediction, _gold(rng, latex, bare, kind), kind, final))
            continue
        latex, bare, renders = _number(rng)
        wrong_latex, _, _ = _number(rng)
        right = rng.choice(renders[:2])
        wrong = rng.choice([wrong_latex, renders[-1]])
        prediction, final = _several(rng, right, wrong)
        kind = rng.choice(["latex", "expr"])
        out.append((prediction, _gold(rng, latex, bare, kind), kind, final))
    return out
