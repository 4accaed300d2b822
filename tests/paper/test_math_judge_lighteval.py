"""The ``paper`` math judge against lighteval itself: lighteval 0.13.0's extractive-match metric, configured as the
GPG authors' evaluate.py configures it, scores a corpus of ≥2,000 realistic and adversarial outputs in the separate
environment that ``scripts/lighteval-env.sh`` builds (lighteval cannot share mmgpg's environment: it pins
latex2sympy2_extended 1.0.6, math-verify 0.9 pins 1.11); mmgpg's judge must give the same score on every item but
the documented library differences (docs/evaluation.md, "The math judges and lighteval").

Skipped when that environment is missing (``.venv-lighteval`` in the repository, or ``MMGPG_LIGHTEVAL_PYTHON``);
with ``MMGPG_REQUIRE_LIGHTEVAL=1`` (CI) a missing environment fails instead."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from support import REPO
from support.math_corpus import corpus

from mmgpg.task import mathjudge

SCORER = REPO / "scripts" / "lighteval_math_score.py"


def lighteval_python() -> Path:
    path = Path(os.environ.get("MMGPG_LIGHTEVAL_PYTHON", REPO / ".venv-lighteval" / "bin" / "python"))
    if not path.exists():
        why = (f"no lighteval environment at {path}: build it with `scripts/lighteval-env.sh .venv-lighteval` "
               "(or set MMGPG_LIGHTEVAL_PYTHON)")
        if os.environ.get("MMGPG_REQUIRE_LIGHTEVAL") == "1":
            pytest.fail(why + " — MMGPG_REQUIRE_LIGHTEVAL=1 requires it")
        pytest.skip(why)
    return path


def champ_json(python: Path) -> Path:
    """champ-dataset's problems file, installed in the lighteval environment by scripts/lighteval-env.sh."""
    out = subprocess.run([str(python), "-c", "import importlib.util as u; "
                          "print(u.find_spec('champ_dataset').submodule_search_locations[0])"],
                         capture_output=True, text=True, timeout=120)
    path = Path(out.stdout.strip()) / "dataset_files" / "v0.json"
    assert out.returncode == 0 and path.is_file(), f"champ-dataset missing in {python}: rerun scripts/lighteval-env.sh"
    return path


def known_difference(item: dict) -> str | None:
    """The library differences the judge does not reproduce, each found by this test and described in
    docs/evaluation.md; None for every other item (which must agree)."""
    pred = item["prediction"]
    if "percent}" in pred or "percent$" in pred:
        # latex2sympy2_extended 1.11 (math-verify 0.9) reads "9 percent" in a box as 9 %; lighteval's pinned 1.0.6
        # cannot parse it and keeps the string, which never equals a parsed gold
        return "percent-word"
    if "which makes the AM-GM inequalities become equalities" in pred:
        # math-verify 0.9 extracts "\(-1\)" from "... is \(-1\), and ... when \( a = c \) and \( b = d \)";
        # lighteval 0.13 extracts the later "a = c and b = d"
        return "extraction-order"
    return None


def test_paper_judge_agrees_with_lighteval(tmp_path):
    python = lighteval_python()
    items = corpus(champ_json(python), seed=0)
    assert len(items) >= 2000
    source, scores = tmp_path / "corpus.jsonl", tmp_path / "lighteval.json"
    source.write_text("".join(json.dumps(item) + "\n" for item in items), encoding="utf-8")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
    proc = subprocess.Popen([str(python), str(SCORER), str(source), str(scores)], env=env, cwd=str(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ours = []
    for start in range(0, len(items), 100):  # batches through mmgpg's math-verify worker, while lighteval scores
        batch = items[start:start + 100]
        ours += mathjudge.worker().run("lighteval_match", [(x["prediction"], x["gold"], x["kind"]) for x in batch])
    out, err = proc.communicate(timeout=3600)
    assert proc.returncode == 0, f"the lighteval scorer failed:\n{out}\n{err}"
    theirs = json.loads(scores.read_text(encoding="utf-8"))

    agree, known, unexplained = 0, {}, []
    for item, (correct, extracted) in zip(items, ours, strict=True):
        reference = theirs[str(item["id"])]
        if float(correct) == reference["score"]:
            agree += 1
            continue
        kind = known_difference(item)
        if kind:
            known[kind] = known.get(kind, 0) + 1
        else:
            unexplained.append((item, reference, correct, extracted))
    print(f"\nmath judge vs lighteval 0.13.0: {agree}/{len(items)} agree; known library differences: {known}")
    examples = "\n".join(f"  {it['kind']} gold={it['gold'][:60]!r} pred=...{it['prediction'][-100:]!r}: lighteval "
                         f"{ref['score']} (extracted {ref['extracted_predictions']}), mmgpg {c} ({e!r})"
                         for it, ref, c, e in unexplained[:20])
    assert not unexplained, f"{len(unexplained)} unexplained disagreements, e.g.:\n{examples}"
    assert agree >= 0.99 * len(items)
