"""Score math outputs with lighteval's own extractive-match metric, configured as the GPG authors' evaluate.py does.

Run it with the python of the environment that ``scripts/lighteval-env.sh`` builds (it imports lighteval, never
mmgpg)::

    .venv-lighteval/bin/python scripts/lighteval_math_score.py corpus.jsonl scores.json

Each input line is ``{"id": ..., "prediction": <model output>, "gold": <gold text>, "kind": "latex" | "expr"}``:
``latex`` is the authors' ``latex_gold_metric`` (MATH-500, Minerva, OlympiadBench: gold extracted as LaTeX),
``expr`` their ``expr_gold_metric`` (AIME, AMC: gold extracted as an expression). Both: language English,
``fallback_mode="first_match"``, ``precision=5``, predictions extracted with ``ExprExtractionConfig()`` and
``LatexExtractionConfig(boxed_match_priority=0)``, ``aggregation_function=max``
(``GPG:open-rs/src/open_r1/evaluate.py:52-70``). The output maps each id to ``{"score": 0.0 | 1.0,
"extracted_predictions": [...], "extracted_golds": [...]}`` (the metric's own ``specific`` record).
"""

from __future__ import annotations

import json
import logging
import sys


def metrics():
    from lighteval.metrics.dynamic_metrics import (
        ExprExtractionConfig,
        LatexExtractionConfig,
        MultilingualExtractiveMatchMetric,
    )
    from lighteval.utils.language import Language

    def metric(gold_target):
        return MultilingualExtractiveMatchMetric(
            language=Language.ENGLISH,
            fallback_mode="first_match",
            precision=5,
            gold_extraction_target=gold_target,
            pred_extraction_target=(ExprExtractionConfig(), LatexExtractionConfig(boxed_match_priority=0)),
            aggregation_function=max,
        )

    return {"latex": metric((LatexExtractionConfig(),)), "expr": metric((ExprExtractionConfig(),))}


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    logging.disable(logging.WARNING)  # the metric warns on every unextractable prediction
    from lighteval.models.model_output import ModelResponse
    from lighteval.tasks.requests import Doc

    by_kind = metrics()
    out = {}
    with open(argv[1], encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            item = json.loads(line)
            doc = Doc(query="", choices=[item["gold"]], gold_index=0, task_name=f"custom|{item['kind']}")
            score = by_kind[item["kind"]].compute(doc, ModelResponse(text=[item["prediction"]]))
            specific = doc.specific or {}
            out[str(item["id"])] = {"score": float(score),
                                    "extracted_predictions": specific.get("extracted_predictions", []),
                                    "extracted_golds": specific.get("extracted_golds", [])}
    with open(argv[2], "w", encoding="utf-8") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
