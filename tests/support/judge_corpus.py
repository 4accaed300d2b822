"""A deterministic corpus of realistic and adversarial model outputs for the differential tests of the ``paper``
judges (``tests/paper/test_judges_differential.py``). Seeded: the same seed gives the same corpus on every machine.

Each family's generator mixes what models write (think + answer, think-only, answer-only, bare answers, "The answer
is ..."), what sloppy or adversarial models write (several answer tags, an unclosed tag, a newline inside the answer,
tags in other case or with spaces, empty answers) and what breaks naive string handling: Unicode and non-ASCII
whitespace anywhere (inside and around tags, inside the answer, before newlines), outputs kept unstripped or
stripped, full-width and non-Latin digits and letters.
"""

from __future__ import annotations

import random

# Whitespace that Python's ``str.isspace``/``re`` ``\s`` know and ASCII rules do not (and two that are not whitespace
# at all: U+200B ZERO WIDTH SPACE and U+FEFF, which models do emit).
WS = ["", "", "", " ", " ", "  ", "\n", "\n\n", "\t", "\r\n", "\r", "\x0b", "\x0c", "\x1c", "\x1f", "\x85",
      "\u00a0", "\u1680", "\u2003", "\u2009", "\u2028", "\u2029", "\u202f", "\u3000", "\u200b", "\ufeff",
      " \u00a0", "\u3000\n", "\u00a0\n", "\n\u2003"]
ODD = ["\u00a0", "\u2003", "\u3000", "\u200b", "\u2028", "\x0b", "\x0c", "\x85", "\ufeff", "\n", "\t", "é", "中",
       "\u0301", "<", ">", "/", ")", "(", ",", "1", "A"]
THINKS = ["Let me look at the image carefully.", "The object on the left is closer to the camera.",
          "数一数：图中有三个。", "Ünïcödé réasoning — with dashes… and quotes “like this”.", "",
          "Option (B) seems right, but A could be too.", "The answer is 3.", "x = 40 then 50", "I see 2 chairs and 1 lamp",
          "It looks like a rose, maybe a pink primrose.", "Box guess (120,340),(560,780) first.",
          "Hmm.\n\nStep 1: find it.\nStep 2: answer.", "<answer>draft</answer> no wait", "answer: C"]


def _ws(rng: random.Random) -> str:
    return rng.choice(WS)


def _mutate(rng: random.Random, text: str) -> str:
    """Insert odd characters at random positions (inside tags too), sometimes strip the output."""
    for _ in range(rng.choice([0, 0, 0, 1, 1, 2, 3])):
        at = rng.randint(0, len(text))
        text = text[:at] + rng.choice(ODD) + text[at:]
    if rng.random() < 0.3:
        text = text.strip()
    return text


def wrap(rng: random.Random, answer: str, think: str | None = None, decoy: str = "x") -> str:
    """One model output carrying ``answer`` in one of many layouts."""
    think = rng.choice(THINKS) if think is None else think
    w = [_ws(rng) for _ in range(6)]
    layouts = [
        lambda: f"<think>{think}</think>{w[0]}<answer>{w[1]}{answer}{w[2]}</answer>{w[3]}",
        lambda: f"<think>{think}</think>{w[0]}<answer>{w[1]}{answer}{w[2]}</answer>{w[3]}",
        lambda: f"<think>{think}</think>{w[0]}<answer>{w[1]}{answer}{w[2]}</answer>{w[3]}",
        lambda: f"{w[4]}{think}</think>{w[0]}<answer>{answer}</answer>",  # base-model prompt ended in <think>
        lambda: f"<answer>{w[1]}{answer}{w[2]}</answer>",
        lambda: f"<think>{think} So it is {answer}.</think>{w[0]}",  # think only
        lambda: f"{w[4]}{answer}{w[5]}",  # bare
        lambda: f"The answer is {answer}.",
        lambda: f"<think>{think}</think><answer>{decoy}</answer>{w[0]}<answer>{answer}</answer>",  # several tags
        lambda: f"<think>{think}</think><answer>{w[1]}{answer}{w[2]}</answer><answer>{decoy}</answer>",
        lambda: f"<think>{think}</think><answer>{w[1]}{answer}",  # unclosed
        lambda: f"<think>{think}</think><answer>{w[1]}\n{answer}\n{w[2]}</answer>",  # newlines around
        lambda: f"<think>{think}</think><answer>{answer}\n{decoy}</answer>",  # newline inside
        lambda: f"<think>{think}</think><answer>{decoy}\n</answer><answer>{w[1]}{answer}</answer>",
        lambda: f"<think>{think}</think><Answer>{answer}</Answer>",
        lambda: f"<think>{think}</think>< answer >{answer}</ answer >",
        lambda: f"<think>{think}</think><answer>{w[1]}</answer>",  # empty / whitespace-only answer
        lambda: f"<think>{think} {answer}</think><answer>{w[1]}{decoy}{w[2]}</answer>",
        lambda: f"<think>{think}</think>\n<answer>{w[1]}{answer}{w[2]}</answer>\n<|im_end|>",
        lambda: f"<answer><answer>{answer}</answer></answer>",
    ]
    return _mutate(rng, rng.choice(layouts)())


# ---- CV-Bench ----------------------------------------------------------------------------------------------------

CV_ITEMS = [  # (task, choices) in CV-Bench's shapes
    ("Count", ["3", "2", "1", "0"]), ("Count", ["2", "0", "4", "1"]), ("Count", ["5", "4", "3", "6", "2", "1"]),
    ("Relation", ["left", "right"]), ("Relation", ["above", "below"]),
    ("Depth", ["lamp", "table"]), ("Depth", ["chair (highlighted by a red box)", "sofa (highlighted by a blue box)"]),
    ("Distance", ["bookshelf", "television"]), ("Distance", ["picture frame", "door"]),
]


def _cv_answer(rng: random.Random, choices: list[str], right: int) -> str:
    k = rng.randrange(len(choices)) if rng.random() < 0.4 else right
    letter, text = "ABCDEF"[k], choices[k]
    other = choices[(k + 1) % len(choices)]
    forms = [letter, f"({letter})", f"{letter}.", f"{letter})", f"({letter.lower()})", letter.lower(),
             f"{letter}. {text}", f"({letter}) {text}", f"({letter}){text}", text, text.upper(), text.title(),
             f"{text}.", f"{text}s", f"The answer is {letter}", f"The answer is ({letter})", f"Answer: {letter}",
             f"{letter} or {'ABCDEF'[(k + 1) % len(choices)]}", f"{text} or {other}", f"{other} {text}",
             f"\\boxed{{{letter}}}", f"${letter}$", f"$\\text{{({letter})}}$", chr(0xFF21 + k), f"（{letter}）",
             f" {text} ", f"{text}\u00a0", f"\u3000{letter}", f"{letter}\u200b", "", "none", "G", "(H)",
             f"There are {text} of them", f"{text} ({letter})", f"option {letter}", f"{letter}\n{text}",
             "3", " 3 ", "3.0", "three", "\\frac{6}{2}", "1 + 2", f"{text}-{text}", f"the {text}"]
    return rng.choice(forms)


def cv_bench_corpus(n: int, seed: int = 16) -> list[dict]:
    """``n`` CV-Bench items with a model output each: ``{id, choices, ground_truth, category, model_output}``."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        category, choices = rng.choice(CV_ITEMS)
        right = rng.randrange(len(choices))
        answer = _cv_answer(rng, choices, right)
        decoy = _cv_answer(rng, choices, right)
        out.append({"id": f"cv-{i}", "choices": choices, "ground_truth": f"({'ABCDEF'[right]})", "category": category,
                    "model_output": wrap(rng, answer, decoy=decoy)})
    return out


# ---- fine-grained classification ---------------------------------------------------------------------------------


def _label_answer(rng: random.Random, classes: list[str], label: str) -> str:
    other = rng.choice(classes)
    words = label.split()
    forms = [label, label, label.upper(), label.title(), label.replace(" ", "_"), label.replace(" ", ""),
             label.replace("-", " "), f"{label}.", f"{label}s", f"{label}es", f"a {label}", f"It is a {label}!",
             words[0], words[-1], label[: max(1, len(label) // 2)], label[len(label) // 3 :], other, f"{other} {label}",
             f"{label}, {other}", "", " ", "\u00a0", "\t", "\u3000", "\x0b", "\r", f"\t{label}", f"{label}\t",
             f"\u00a0{label}\u00a0", f"{words[0]}\u00a0{words[-1]}", f"\t{words[0]}", f"{label[:3]}\u2003",
             label.replace(" ", "\u00a0"), label.replace(" ", "\t"), label.replace(" ", "  "), label.replace("a", "á"),
             f"{label}\n", f"species: {label}", "İ", "ß", label.replace("s", "ſ"), "".join(chr(0xFEE0 + ord(c)) if "!" <= c <= "~"
                                                                                          else c for c in label)]
    return rng.choice(forms)


def fine_grained_corpus(classes: list[str], n: int, seed: int = 16) -> list[dict]:
    """``n`` items of one dataset: ``{id, ground_truth, model_output}`` with ``ground_truth`` a class of ``classes``."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        label = rng.choice(classes)
        answer = _label_answer(rng, classes, label)
        decoy = _label_answer(rng, classes, rng.choice(classes))
        out.append({"id": f"fg-{i}", "ground_truth": label, "model_output": wrap(rng, answer, decoy=decoy)})
    return out


# ---- LISA grounding ----------------------------------------------------------------------------------------------

INSTRUCTIONS = ["the thing people use to keep rain off", "what would you sit on to rest your legs",
                "the animal that is most likely to bark", "something used for cutting paper",
                "the object a driver holds while steering", "where would you put dirty dishes?",
                "the object in the upper left, next to the window", "哪个物体可以用来喝水", "le véhicule le plus proche"]


def _num(rng: random.Random, value: int) -> str:
    r = rng.random()
    if r < 0.75:
        return str(value)
    forms = [f"{value:05d}", "0" * rng.randint(6, 30) + str(value), str(value) + "0" * rng.randint(7, 12),
             str(-value), f"{value}.5", str(value * 10**300), "9" * rng.randint(305, 320), "1" + "0" * 4400,
             "0" * 4301 + str(value), "".join(chr(0xFF10 + int(c)) for c in str(value)),
             "".join(chr(0x0660 + int(c)) for c in str(value)), str(value) + "\u00a0", f"{value:,}"]
    return rng.choice(forms)


def _box_text(rng: random.Random, box: tuple[int, int, int, int]) -> str:
    x1, y1, x2, y2 = (_num(rng, v) for v in box)
    s = lambda: rng.choice(["", "", "", " ", "\u00a0", "\u3000", "\n", "\t"])  # noqa: E731
    forms = [f"({x1},{y1}),({x2},{y2})", f"({x1},{y1}),({x2},{y2})", f"({s()}{x1}{s()},{s()}{y1}{s()}){s()},{s()}({x2},{y2})",
             f"({x1}, {y1}), ({x2}, {y2})", f"[{x1},{y1},{x2},{y2}]", f"[{x1}, {y1}, {x2}, {y2}]", f"{{{x1},{y1},{x2},{y2}}}",
             f"({x1},{y1},{x2},{y2})", f"(({x1},{y1}),({x2},{y2}))", f"[({x1},{y1}),({x2},{y2})]", f"<box>({x1},{y1}),({x2},{y2})</box>",
             f"({x1},{y1})-({x2},{y2})", f"({x1},{y1}) ,\n({x2},{y2})", f"x1={x1}, y1={y1}, x2={x2}, y2={y2}",
             f"（{x1},{y1}），（{x2},{y2}）", f"({x1};{y1}),({x2};{y2})"]
    return rng.choice(forms)


def _pred_box(rng: random.Random, gold: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    r = rng.random()
    if r < 0.5:
        jitter = rng.choice([0, 5, 30, 150])
        box = [v + rng.randint(-jitter, jitter) for v in gold]
        return tuple(max(0, min(1000, v)) for v in box)  # type: ignore[return-value]
    if r < 0.6:
        return (gold[2], gold[3], gold[0], gold[1])  # inverted
    if r < 0.7:
        return (gold[0], gold[1], gold[0], gold[3])  # zero width
    if r < 0.75:
        return (0, 0, 1000, 1000)
    xs, ys = sorted(rng.sample(range(1001), 2)), sorted(rng.sample(range(1001), 2))
    return xs[0], ys[0], xs[1], ys[1]


def lisa_corpus(n: int, seed: int = 16, *, prompt_boxes: bool = False) -> list[dict]:
    """``n`` LISA items: ``{id, instruction, ground_truth (pixels), width, height, model_output}``. With
    ``prompt_boxes`` every instruction itself contains a box (the case the judge cannot reproduce: the authors read
    the first box of the decoded *prompt and* output)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        w, h = rng.randint(100, 2400), rng.randint(100, 2400)
        x1, x2 = sorted(rng.uniform(0, w) for _ in range(2))
        y1, y2 = sorted(rng.uniform(0, h) for _ in range(2))
        if rng.random() < 0.3:
            x1, y1, x2, y2 = int(x1), int(y1), int(x2), int(y2)
        if rng.random() < 0.05:
            x2, y2 = x1, y1  # a degenerate polygon
        gold_units = (int(x1 / w * 1000), int(y1 / h * 1000), int(x2 / w * 1000), int(y2 / h * 1000))
        answer = _box_text(rng, _pred_box(rng, gold_units))
        if rng.random() < 0.25:  # several boxes: the first one decides
            second = _box_text(rng, _pred_box(rng, gold_units))
            answer = rng.choice([f"{answer},{second}", f"{second} {answer}", f"{answer}\n{second}"])
        think = rng.choice(THINKS)
        if rng.random() < 0.2:
            think += " " + _box_text(rng, _pred_box(rng, gold_units))  # a box in the reasoning comes first
        instruction = rng.choice(INSTRUCTIONS)
        if prompt_boxes:
            instruction += rng.choice([" near (10,20),(30,40)", " — the one at (0,0),(500,500)?"])
        out.append({"id": f"lisa-{i}", "instruction": instruction, "ground_truth": [x1, y1, x2, y2], "width": w,
                    "height": h, "model_output": wrap(rng, answer, think=think, decoy=_box_text(rng, gold_units))})
    return out
