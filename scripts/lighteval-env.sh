#!/usr/bin/env bash
# Build the separate lighteval environment that the math judge's differential test scores with
# (tests/paper/test_math_judge_lighteval.py; docs/evaluation.md, "The math judges and lighteval").
#
#   scripts/lighteval-env.sh TARGET_DIR            # e.g. scripts/lighteval-env.sh .venv-lighteval
#
# Why a separate environment: lighteval 0.13.0 pins latex2sympy2_extended==1.0.6, while mmgpg's math-verify 0.9.0
# pins latex2sympy2_extended==1.11.0, so the two cannot share one environment.
#
# Why it is small: the test needs only lighteval's extractive-match metric
# (lighteval.metrics.dynamic_metrics.MultilingualExtractiveMatchMetric). Importing it imports torch and transformers
# at module level (lighteval.models.model_output, lighteval.metrics.metrics_sample) but never runs them. So this
# script installs lighteval WITHOUT its dependency resolution, then only what that import chain needs:
#   * latex2sympy2_extended==1.0.6 (lighteval's pin; it brings sympy and antlr4-python3-runtime 4.13.2),
#   * nltk==3.9.1 (lighteval's pin), and packaging,
#   * torch, transformers, numpy, scipy, pydantic and huggingface_hub are NOT installed: a `.pth` file makes the
#     environment see them in a base environment (default: this repository's .venv; LIGHTEVAL_ENV_BASE=/path/to/python
#     chooses another). The base's site-packages come AFTER this environment's own, so lighteval's
#     latex2sympy2_extended 1.0.6 and its sympy win over the base's copies. LIGHTEVAL_ENV_BASE=none installs those
#     packages from PyPI instead (torch from PyPI is several GB).
#   * champ-dataset 1.0.0 (MIT; 270 competition problems with answers and real model outputs in its wheel), as data
#     for the test's corpus (installed without its one dependency, natsort: the test reads only its JSON file).
# Idempotent: each stage is skipped when its result is already there; rerunning finishes a half-built environment.
# Local pip configuration (find-links, constraints) is ignored so the result is the same on every machine; set
# LIGHTEVAL_ENV_KEEP_PIP_CONFIG=1 to keep it. PYTHON selects the interpreter (default python3, >=3.11).
set -euo pipefail

TARGET=${1:?usage: scripts/lighteval-env.sh TARGET_DIR}
PYTHON=${PYTHON:-python3}
LIGHTEVAL_VERSION=0.13.0
LATEX2SYMPY_VERSION=1.0.6
NLTK_VERSION=3.9.1
CHAMP_VERSION=1.0.0
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BASE=${LIGHTEVAL_ENV_BASE:-$REPO/.venv/bin/python}

source "$(dirname "${BASH_SOURCE[0]}")/env-common.sh" LIGHTEVAL_ENV_KEEP_PIP_CONFIG
make_venv

SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
stage "torch, transformers, numpy, scipy, pydantic, huggingface_hub (base: $BASE)"
if [[ "$BASE" == none ]]; then
  rm -f "$SITE/zz-lighteval-env-base.pth"
  "${PIP[@]}" install -q torch transformers numpy scipy pydantic huggingface_hub
else
  if [[ ! -x "$BASE" ]]; then
    echo "scripts/lighteval-env.sh: base python $BASE not found: build the repository's .venv first, point" \
         "LIGHTEVAL_ENV_BASE at a python that has torch and transformers, or set LIGHTEVAL_ENV_BASE=none" >&2
    exit 2
  fi
  BASE_SITE=$("$BASE" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  if [[ $("$BASE" -c 'import sys; print(sys.version_info[:2])') != $("$PY" -c 'import sys; print(sys.version_info[:2])') ]]; then
    echo "scripts/lighteval-env.sh: $BASE and $PYTHON differ in their Python minor version" >&2
    exit 2
  fi
  # zz-: .pth files are processed in name order; this one only appends the base's directory to sys.path, so pip and
  # python see the base's packages behind this environment's own.
  echo "$BASE_SITE" > "$SITE/zz-lighteval-env-base.pth"
fi
done_stage

installed() { "$PY" -c "import importlib.metadata as m, sys; sys.exit(m.version('$1') != '$2')" 2>/dev/null; }

stage "lighteval $LIGHTEVAL_VERSION (no deps) + what its metric import needs"
if ! installed lighteval "$LIGHTEVAL_VERSION" || ! installed latex2sympy2_extended "$LATEX2SYMPY_VERSION" \
    || ! installed nltk "$NLTK_VERSION"; then
  "${PIP[@]}" install -q --no-deps "lighteval==$LIGHTEVAL_VERSION"
  # lighteval.metrics imports sacrebleu and pytablewriter at module level; numpy etc. are found in the base.
  # pip warns that lighteval's other pins and the base's math-verify are not satisfied here: expected, hidden.
  out=$("${PIP[@]}" install -q "latex2sympy2_extended==$LATEX2SYMPY_VERSION" "nltk==$NLTK_VERSION" sacrebleu \
    pytablewriter packaging 2>&1) || { echo "$out" >&2; exit 1; }
  echo "$out" | grep -v "^ERROR: pip's dependency resolver\| requires .*, but you have \| requires .*, which is not installed" || true
fi
done_stage

stage "champ-dataset $CHAMP_VERSION (no deps: the test reads its JSON file of 270 problems and model outputs)"
installed champ-dataset "$CHAMP_VERSION" || "${PIP[@]}" install -q --no-deps "champ-dataset==$CHAMP_VERSION"
done_stage

stage "smoke test (import lighteval's extractive match; latex2sympy2_extended is lighteval's own pin)"
HF_HUB_OFFLINE=1 "$PY" -c "
import importlib.metadata as md
import latex2sympy2_extended, lighteval
from lighteval.metrics.dynamic_metrics import MultilingualExtractiveMatchMetric  # noqa: F401
assert md.version('latex2sympy2_extended') == '$LATEX2SYMPY_VERSION', md.version('latex2sympy2_extended')
assert latex2sympy2_extended.__file__.startswith('$SITE'), latex2sympy2_extended.__file__
print('   lighteval', md.version('lighteval'), '| latex2sympy2_extended', md.version('latex2sympy2_extended'),
      '| sympy', md.version('sympy'))
"
done_stage

echo "== lighteval environment ready in $TARGET ($(du -sh "$TARGET" | cut -f1), $(( $(date +%s) - T_ALL )) s)"
