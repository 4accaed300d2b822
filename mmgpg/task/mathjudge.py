"""math-verify in a worker process: callable from any thread, with a hard time bound.

math-verify bounds its own work with ``signal.alarm``, which works only in a process's main thread. In any other
thread (a reward computed in a thread pool, a DataLoader worker thread, a web server) math-verify 0.5.2 silently
returns ``False`` and 0.9 raises (``docs/anchors.md`` §1.3). mmgpg therefore never calls math-verify
in the caller's process. Every call goes to one long-lived worker process per caller process, where math-verify runs
in the worker's main thread with its own alarms (5 s per parse or verify, as in the anchors), so the judgements are
the anchors' judgements. The parent adds a hard outer bound: a call that has not answered after ``timeout`` seconds
kills the worker, which restarts on the next call, and the call returns the job's "no answer" value (never correct).

math-verify feeds regex-filtered arithmetic to sympy's ``parse_expr``, which uses Python ``eval`` internally. This
runs only inside the worker and only on text that math-verify's own regexes allow (digits, operators, brackets).
mmgpg itself never ``eval``s model text.

Jobs (run in the worker; every result is plain Python data — booleans and strings):

* ``parse_verify(pred, gold)`` — ``verify(parse(pred), parse(gold))`` with math-verify's default extraction, and
  ``str`` of the first extracted prediction. The anchors' GEOQA judge and every anchor accuracy reward's first branch.
* ``choice(response, choices, letter)`` — the CV-Bench judge: ``parse`` with LaTeX, expression and string extraction
  (the letters A–F in four spellings and the option texts), then ``verify`` against the right letter and option text.
* ``latex_equal(pred, gold)`` — both sides wrapped as ``$…$`` LaTeX, for the ``strict`` GEOQA protocol.
* ``latex_parses(text)`` — whether ``$text$`` parses as LaTeX (the ``strict`` math tasks' gold check).
* ``lighteval_match(pred, gold, kind)`` — lighteval's extractive match as the GPG authors' evaluate.py configures it
  (the ``paper`` judge of the math benchmarks).
* ``r1_gold(solution, mode)``, ``r1_answer(content, solution, mode, boxed)`` — the GPG authors' math training rewards'
  gold parse and answer check (``GPG:open-rs/src/open_r1/rewards.py:22-67``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from typing import Any

DEFAULT_TIMEOUT_S = 20.0
"""Outer bound for one call (math-verify's inner alarms are 5 s for ``parse`` and 5 s for ``verify``)."""

START_TIMEOUT_S = 120.0
"""How long a fresh worker may take to import math-verify and sympy (not counted against any call)."""

NO_ANSWER = (False, "")
"""What every job returns when math-verify fails or the call runs out of time: not correct, nothing extracted."""


# ---- the worker side --------------------------------------------------------------------------------------------


def _letters() -> tuple[str, ...]:
    upper = tuple("ABCDEF")
    return upper + tuple(c.lower() for c in upper) + tuple(f"({c.lower()})" for c in upper) + tuple(f"({c})" for c in upper)


def _first_str(parsed: list) -> str:
    return str(parsed[0]) if parsed else ""


def _job_parse_verify(pred: str, gold: str) -> tuple[bool, str]:
    from math_verify import parse, verify

    target = parse(pred)
    return (bool(target) and bool(verify(target, _gold_default(gold)))), _first_str(target)


def _job_choice(response: str, choices: list[str], letter: str) -> tuple[bool, str]:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, StringExtractionConfig, parse, verify

    strings = _letters() + tuple(choices)
    parsed = parse(response, extraction_config=[LatexExtractionConfig(), ExprExtractionConfig(),
                                                 StringExtractionConfig(strings=strings)])
    index = "ABCDEF".find(letter) if len(letter) == 1 else -1
    option = choices[index] if 0 <= index < len(choices) else ""
    gold = [option.lower(), option, letter, letter.lower(), f"({letter.lower()})", f"({letter})"]
    return bool(verify(gold=gold, target=parsed)), _first_str(parsed)


def _job_latex_equal(pred: str, gold: str) -> tuple[bool, str]:
    from math_verify import LatexExtractionConfig, parse, verify

    config = [LatexExtractionConfig()]
    target = parse(f"${pred}$", extraction_config=config)
    reference = parse(f"${gold}$", extraction_config=config)
    return (bool(target) and bool(reference) and bool(verify(reference, target))), _first_str(target)


_GOLD_CACHE: dict[str, Any] = {}


def _gold_default(gold: str):
    """Gold answers repeat G times per group: parse each once per worker."""
    from math_verify import parse

    if gold not in _GOLD_CACHE:
        if len(_GOLD_CACHE) > 50_000:
            _GOLD_CACHE.clear()
        _GOLD_CACHE[gold] = parse(gold)
    return _GOLD_CACHE[gold]


def _job_latex_parses(text: str) -> tuple[bool, str]:
    from math_verify import LatexExtractionConfig, parse

    parsed = parse(f"${text}$", extraction_config=[LatexExtractionConfig()])
    return bool(parsed), _first_str(parsed)


def _job_lighteval_match(pred: str, gold: str, kind: str) -> tuple[bool, str]:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    modes = {"fallback_mode": "first_match", "extraction_mode": "any_match", "parsing_timeout": 5}
    gold_config = [LatexExtractionConfig()] if kind == "latex" else [ExprExtractionConfig()]
    golds = _cached(("lighteval", kind, gold), lambda: parse(bare_words_kept(gold), extraction_config=gold_config,
                                                             **modes)) or [gold]
    preds = parse(bare_words_kept(final_boxes(pred)),
                  extraction_config=[ExprExtractionConfig(), LatexExtractionConfig(boxed_match_priority=0)], **modes)
    correct = any(not _lighteval_differs(g, p) and verify(g, p, float_rounding=5, timeout_seconds=5)
                  for g in golds for p in preds)
    return bool(correct), _last_str(preds)


_BOX_OPENERS = ("\\boxed{", "\\fbox{")
_BOX_JOINERS = {"and", "or", ","}
_MATH_DELIMITERS = re.compile(r"\$|\\[()\[\]]")


def _boxes(text: str) -> list[tuple[int, int, int]]:
    """``(start, content start, end)`` of every ``\\boxed{...}`` / ``\\fbox{...}`` with balanced braces, in order
    (an unclosed box is left out)."""
    found, i = [], 0
    while True:
        hits = [(text.find(o, i), o) for o in _BOX_OPENERS]
        hits = [(at, o) for at, o in hits if at >= 0]
        if not hits:
            return found
        start, opener = min(hits)
        depth, j = 1, start + len(opener)
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        if depth:
            return found
        found.append((start, start + len(opener), j))
        i = j


def final_boxes(text: str) -> str:
    r"""``text`` with only its final answer boxed, as lighteval 0.13 reads several boxes (measured against lighteval
    itself, tests/paper/test_math_judge_lighteval.py): the last box counts, together with the boxes before it that
    are joined to it by nothing but ``and``, ``or`` or a comma (``$\\boxed{3}$ and $\\boxed{5}$`` is one answer
    ``3, 5``); every other box is unwrapped to its content, and ``\\fbox`` is read as ``\\boxed``. math-verify 0.9 (latex2sympy2_extended 1.11) instead joins
    any boxes that are close together, so a self-correction ``First \\boxed{(2, 1)}, then correcting: \\boxed{(1, 2)}``
    would read ``(2, 1), (1, 2)``.

    Written here because the two libraries cannot share one environment (lighteval 0.13 pins latex2sympy2_extended
    1.0.6, math-verify 0.9 needs 1.11): the judge runs on math-verify and this rule puts back lighteval's reading.

    >>> final_boxes("First \\boxed{(2, 1)}, then correcting: \\boxed{(1, 2)}")
    'First (2, 1), then correcting: \\boxed{(1, 2)}'
    >>> final_boxes("$\\boxed{3}$ and $\\boxed{5}$")
    '$\\boxed{3}$ and $\\boxed{5}$'
    """
    boxes = _boxes(text)
    # lighteval finds an answer box by \boxed: an \fbox counts only after one (alone, it is ordinary text)
    first = next((i for i, (start, _, _) in enumerate(boxes) if text.startswith("\\boxed", start)), len(boxes))
    boxes = boxes[first:]
    keep = len(boxes) - 1
    while keep > 0 and _MATH_DELIMITERS.sub("", text[boxes[keep - 1][2]:boxes[keep][0]]).strip() in _BOX_JOINERS:
        keep -= 1
    out, at = [], 0
    for i, (start, content, end) in enumerate(boxes):
        # an earlier box is unwrapped to its content; a kept one is written \boxed (math-verify reads no \fbox)
        out += [text[at:start], text[content:end - 1] if i < keep else "\\boxed{" + text[content:end]]
        at = end
    return "".join(out) + text[at:]


# Math in a model's answer: $$...$$, $...$, \\[...\\], \\(...\\) and the content of a box.
_MATH_SPAN = re.compile(r"\$\$.+?\$\$|\$.+?\$|\\\[.+?\\\]|\\\(.+?\\\)", re.S)
# A word written right after a number (or a closing brace), not a LaTeX command: a bare unit (5 cm, 180hours, 67 m),
# "percent", or a symbol (2x); "and" / "or" between answers are left alone.
_BARE_WORD = re.compile(r"(?<=[\d}])((?:\s|\\[ ,;:!])*)(?!(?:and|or)\b)([A-Za-z]+)\b")

_TEXT_PERCENT = re.compile(r"\\text\s*\{\s*percent\s*\}")


def bare_words_kept(text: str) -> str:
    r"""``text`` with the words written bare after a number inside math kept as lighteval 0.13 reads them (measured
    against lighteval itself, tests/paper/test_math_judge_lighteval.py): its normaliser (latex2sympy2_extended 1.0.6)
    removes units written as ``\text{cm}`` or ``\mathrm{m}`` but not a bare unit word, so ``$5 cm$`` is the product
    ``5·c·m`` there, and it turns a bare ``percent`` into text that does not parse. math-verify's normaliser (1.11)
    removes a bare unit at the end of the math and reads ``percent`` as ``\%``, so both would score as the number.
    Here a bare word becomes a braced group (``5 {cm}``: a product for the parser, no unit for the normaliser's
    end-of-math rule) and a bare ``percent`` (or ``\text{percent}``) in a box becomes what lighteval's rule leaves
    there (``\\%``, which does not parse).

    >>> bare_words_kept("The length is $5 cm$, i.e. 5 cm.")
    'The length is $5 {cm}$, i.e. 5 cm.'
    >>> bare_words_kept(r"$\boxed{25 percent}$ of $2x + 3\text{ cm}$")
    '$\\boxed{25 \\\\%}$ of $2{x} + 3\\text{ cm}$'
    """
    def word(match: re.Match) -> str:  # outside a box, "percent" is a percentage to both libraries
        space, w = match.groups()
        return match.group(0) if w == "percent" else space + "{" + w + "}"

    def boxed_word(match: re.Match) -> str:
        space, w = match.groups()
        return space + ("\\\\%" if w == "percent" else "{" + w + "}")

    text = _MATH_SPAN.sub(lambda m: _BARE_WORD.sub(word, m.group(0)), text)
    out, at = [], 0
    for _start, content, end in _boxes(text):  # boxes, inside $...$ or not (``**Final Answer** \boxed{9 percent}``)
        out += [text[at:content], _TEXT_PERCENT.sub(r"\\\\%", _BARE_WORD.sub(boxed_word, text[content:end]))]
        at = end
    return "".join(out) + text[at:]


def _percent_of(expr: Any, atomic: type) -> bool:
    """``expr`` is latex2sympy's percentage ``X · UnevaluatedExpr(1/100)`` of an ``atomic`` number ``X``."""
    from sympy import Mul, Rational, UnevaluatedExpr

    return (isinstance(expr, Mul) and len(expr.args) == 2 and expr.args[1] == UnevaluatedExpr(Rational(1, 100))
            and isinstance(expr.args[0], atomic))


def _lighteval_differs(gold: Any, pred: Any) -> bool:
    """The two pairs that math-verify 0.9's ``verify`` calls equal and lighteval 0.13's comparison (the code
    lighteval's extractive match runs) does not, found by the differential test against lighteval itself:

    * an integer and a percentage of an integer (``9`` vs ``9\\%``): math-verify compares the percentage's number,
      lighteval the values (9 ≠ 0.09);
    * a float and an expression that is not a plain number (``7.0710678`` vs ``5\\sqrt{2}``): math-verify rounds
      both to 5 decimals, lighteval rounds only two numbers and otherwise requires symbolic equality.
    """
    from sympy import Basic, Eq, Float, Integer, Number, Symbol

    if not (isinstance(gold, Basic) and isinstance(pred, Basic)):
        return False
    # both compare the value of an assignment (``y = 57``) with a number
    gold, pred = (e.rhs if isinstance(e, Eq) and isinstance(e.lhs, Symbol) else e for e in (gold, pred))
    for a, b in ((gold, pred), (pred, gold)):
        if _percent_of(a, Integer) and isinstance(b, Integer) and a.doit() != b:
            return True
        if (isinstance(a, Float) or _percent_of(a, Float)) and not isinstance(b, Number) and not _percent_of(b, Number):
            try:
                value = b.doit()
            except Exception:  # noqa: BLE001 - what cannot be evaluated is not a number either
                return True
            if not isinstance(value, Number):
                return True
    return False


def _r1_gold(solution: str, gold_mode: str):
    from math_verify import LatexExtractionConfig, parse

    if gold_mode == "boxed_answer":
        # accuracy_reward_lv35's "$\\\\boxed{}$".format(sol): two backslashes and the answer without braces
        return _cached(("r1", gold_mode, solution),
                       lambda: parse(f"$\\\\boxed{solution}$", extraction_mode="first_match"))
    return _cached(("r1", gold_mode, solution),
                   lambda: parse(solution, extraction_mode="first_match", extraction_config=[LatexExtractionConfig()]))


def _job_r1_gold(solution: str, gold_mode: str) -> tuple[bool, str]:
    gold = _r1_gold(solution, gold_mode)
    return bool(gold), _first_str(gold)


def _job_r1_answer(content: str, solution: str, gold_mode: str, boxed: Any) -> tuple[bool, str]:
    from latex2sympy2_extended import NormalizationConfig
    from math_verify import LatexExtractionConfig, parse, verify

    gold = _r1_gold(solution, gold_mode)
    normalization = NormalizationConfig(nits=False, malformed_operators=False, basic_latex=True, equations=True,
                                        boxed=boxed, units=True)
    answer = parse(content, extraction_config=[LatexExtractionConfig(normalization_config=normalization,
                                                                     boxed_match_priority=0,
                                                                     try_extract_without_anchor=False)],
                   extraction_mode="first_match")
    return bool(verify(answer, gold)), _first_str(answer)  # (answer, gold): their argument order, kept


def _last_str(parsed: list) -> str:
    return str(parsed[-1]) if parsed else ""


_CACHE: dict[Any, Any] = {}


def _cached(key, make):
    """Gold answers repeat G times per group: parse each once per worker."""
    if key not in _CACHE:
        if len(_CACHE) > 50_000:
            _CACHE.clear()
        _CACHE[key] = make()
    return _CACHE[key]


_JOBS = {"parse_verify": _job_parse_verify, "choice": _job_choice, "latex_equal": _job_latex_equal,
         "latex_parses": _job_latex_parses, "lighteval_match": _job_lighteval_match, "r1_gold": _job_r1_gold,
         "r1_answer": _job_r1_answer}


def _serve(read_fd: int, write_fd: int) -> None:
    requests, replies = Connection(read_fd, writable=False), Connection(write_fd, readable=False)
    import logging
    import signal

    # Ctrl-C in a terminal reaches the whole process group: the parent decides what to do; the worker ends when the
    # parent closes the pipe or kills it, never with a KeyboardInterrupt traceback of its own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    import math_verify  # noqa: F401 - imported before "ready", so start-up time never counts against a call

    logging.getLogger("math_verify").setLevel(logging.CRITICAL)  # it logs whole inputs on timeouts
    # latex2sympy2_extended warns on every parse with the authors' NormalizationConfig(equations=True)
    logging.getLogger("latex2sympy2_extended").setLevel(logging.ERROR)

    replies.send("ready")
    while True:
        try:
            name, batch = requests.recv()
        except EOFError:
            return
        out = []
        for args in batch:
            try:
                out.append(_JOBS[name](*args))
            except Exception:  # noqa: BLE001 - a judgement never raises; math-verify errors mean "no answer"
                out.append(NO_ANSWER)
        replies.send(out)


# ---- the caller side --------------------------------------------------------------------------------------------


def worker_command(read_fd: int, write_fd: int) -> list[str]:
    """The worker's command line, isolated from the directory the user runs mmgpg in.

    ``python -c`` would put the current directory first on ``sys.path``, so a ``math_verify.py`` or ``sympy.py``
    there would be imported and run. The worker starts with ``-I`` (no current directory, no ``PYTHONPATH``, no user
    site), gets the parent's ``sys.path`` without the current directory and ``''``, runs in a neutral directory and
    loads this very file by its path.
    """
    here = os.path.realpath(os.getcwd())
    paths = [p for p in sys.path if p and os.path.realpath(p) != here]
    code = ("import sys, importlib.util\n"
            f"sys.path[:] = {paths!r}\n"
            f"spec = importlib.util.spec_from_file_location('mmgpg_mathjudge_worker', {os.path.abspath(__file__)!r})\n"
            "module = importlib.util.module_from_spec(spec)\n"
            "spec.loader.exec_module(module)\n"
            f"module._serve({read_fd}, {write_fd})\n")
    return [sys.executable, "-I", "-c", code]


def _neutral_dir() -> str:
    import tempfile

    return os.path.realpath(tempfile.gettempdir()) if os.path.isdir(tempfile.gettempdir()) else "/"


class MathWorker:
    """One worker process; thread-safe; restarts after a timeout or a crash."""

    def __init__(self, timeout: float = DEFAULT_TIMEOUT_S):
        self.timeout = timeout
        self.timeouts = 0
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._send: Connection | None = None
        self._recv: Connection | None = None

    def _start(self) -> None:
        to_child_r, to_child_w = os.pipe()
        to_parent_r, to_parent_w = os.pipe()
        self._proc = subprocess.Popen(worker_command(to_child_r, to_parent_w), pass_fds=(to_child_r, to_parent_w),
                                      cwd=_neutral_dir(), stdin=subprocess.DEVNULL, close_fds=True)
        os.close(to_child_r)
        os.close(to_parent_w)
        self._send, self._recv = Connection(to_child_w, readable=False), Connection(to_parent_r, writable=False)
        if not self._recv.poll(START_TIMEOUT_S) or self._recv.recv() != "ready":
            self._stop()
            raise RuntimeError(f"the math-verify worker did not start within {START_TIMEOUT_S:.0f} s "
                               f"({sys.executable} -c 'import math_verify' should work)")

    def _stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
        for conn in (self._send, self._recv):
            if conn is not None:
                conn.close()
        self._proc = self._send = self._recv = None

    def run(self, name: str, batch: list[tuple]) -> list[tuple[bool, str]]:
        """Run job ``name`` on every argument tuple of ``batch``; a batch that times out gives "no answer" for the
        items not yet done (the whole batch, since results come back together) and restarts the worker."""
        if not batch:
            return []
        with self._lock:
            for attempt in range(2):
                if self._proc is None or self._proc.poll() is not None:
                    self._stop()
                    self._start()
                try:
                    self._send.send((name, batch))
                    if self._recv.poll(self.timeout * len(batch)):
                        return self._recv.recv()
                    self.timeouts += 1
                    self._stop()
                    return [NO_ANSWER] * len(batch)
                except (EOFError, BrokenPipeError, OSError):
                    self._stop()  # the worker died (e.g. killed for memory): start a fresh one once
                    if attempt:
                        raise
            raise RuntimeError("unreachable")

    def close(self) -> None:
        with self._lock:
            self._stop()

    def __del__(self):  # pragma: no cover - best effort at interpreter exit
        try:
            self._stop()
        except Exception:  # noqa: BLE001
            pass


_WORKER: MathWorker | None = None
_WORKER_PID = -1


def worker() -> MathWorker:
    """This process's worker (a forked child gets its own)."""
    global _WORKER, _WORKER_PID
    if _WORKER is None or _WORKER_PID != os.getpid():
        _WORKER, _WORKER_PID = MathWorker(), os.getpid()
    return _WORKER


def parse_verify(pred: str, gold: str) -> tuple[bool, str]:
    """``(verify(parse(pred), parse(gold)) and parse(pred) != [], str(parse(pred)[0]))`` with math-verify defaults."""
    return worker().run("parse_verify", [(as_text(pred), as_text(gold))])[0]


def choice(response: str, choices: list[str], letter: str) -> tuple[bool, str]:
    """The CV-Bench anchor judge (see the module docstring)."""
    return worker().run("choice", [(as_text(response), [as_text(c) for c in choices], as_text(letter))])[0]


def latex_equal(pred: str, gold: str) -> tuple[bool, str]:
    """Both sides parsed as LaTeX (``$…$``) and compared by math-verify; an empty side is never equal."""
    return worker().run("latex_equal", [(as_text(pred), as_text(gold))])[0]


def latex_parses(text: str) -> tuple[bool, str]:
    """Whether ``$text$`` parses as LaTeX (math-verify's LaTeX extraction finds something), and what it read."""
    return worker().run("latex_parses", [(as_text(text),)])[0]


def lighteval_match(pred: str, gold: str, kind: str) -> tuple[bool, str]:
    """lighteval's extractive match as the GPG authors' evaluate.py configures it (``kind``: ``"latex"`` =
    ``latex_gold_metric``, ``"expr"`` = ``expr_gold_metric``), through math-verify: the gold parsed with LaTeX (or
    expression) extraction, the raw gold string when nothing is extracted; the prediction with expression extraction
    and LaTeX extraction whose boxed pattern comes first (``boxed_match_priority=0``); both with
    ``fallback_mode="first_match"``, ``extraction_mode="any_match"``; compared with ``verify(golds, preds,
    float_rounding=5)`` (lighteval's ``precision=5``). Returns ``(correct, the text of the extracted prediction)``."""
    return worker().run("lighteval_match", [(as_text(pred), as_text(gold), kind)])[0]


def r1_gold(solution: str, gold_mode: str) -> tuple[bool, str]:
    """Whether the authors' training rewards can parse the gold (``gold_mode``: ``"solution"`` = a full solution,
    LaTeX extraction, first match; ``"boxed_answer"`` = a bare answer formatted as ``$\\\\boxed{...}$``, default
    extraction, as their ``accuracy_reward_lv35``)."""
    return worker().run("r1_gold", [(as_text(solution), gold_mode)])[0]


def r1_answer(content: str, solution: str, gold_mode: str, boxed: Any) -> tuple[bool, str]:
    """The authors' answer check (``accuracy_reward``, ``get_cosine_scaled_reward``): the completion parsed with
    LaTeX extraction only (boxed first, no anchor-less match, ``malformed_operators=False``, ``NormalizationConfig``
    ``boxed=boxed``: ``"all"`` in accuracy, ``True`` in cosine), first match, then ``verify(answer, gold)`` in their
    argument order. Returns ``(correct, extracted)``; call :func:`r1_gold` first (an unparseable gold is never
    correct here)."""
    return worker().run("r1_answer", [(as_text(content), as_text(solution), gold_mode, boxed)])[0]


def as_text(value: Any) -> str:
    """A model output as text: a str as it is, None as "", anything else through str(). (Defined here, not in
    :mod:`mmgpg.task.rewards`, because this module runs standalone in the worker and imports nothing from mmgpg.)"""
    return value if isinstance(value, str) else "" if value is None else str(value)
