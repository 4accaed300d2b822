# Shared by scripts/vllm-cpu-env.sh and scripts/lighteval-env.sh (sourced, not run): the pip settings, the timed
# stages and the virtual environment itself.
#
#   source "$(dirname "${BASH_SOURCE[0]}")/env-common.sh" KEEP_VAR    # then: make_venv [--upgrade-pip]
#
# KEEP_VAR names the variable that, when set, keeps the local pip configuration (find-links, constraints, index);
# otherwise it is ignored, so the environment comes out the same on every machine. Expects TARGET and PYTHON.

if [[ -z "${!1:-}" ]]; then
  unset PIP_FIND_LINKS PIP_CONSTRAINT PIP_EXTRA_INDEX_URL PIP_INDEX_URL
  export PIP_CONFIG_FILE=/dev/null
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1
# No pip cache: the wheels these environments download (a CUDA torch build and its libraries: several GB) would stay
# in ~/.cache/pip beside the installed copies. ENV_PIP_CACHE=1 keeps pip's cache on (faster rebuilds).
if [[ -z "${ENV_PIP_CACHE:-}" ]]; then export PIP_NO_CACHE_DIR=1; fi

stage() {  # stage NAME -- prints the time each stage took
  STAGE_NAME=$1; STAGE_T0=$(date +%s); echo "== [$(date -u +%H:%M:%S)] $STAGE_NAME"
}
done_stage() { echo "   $STAGE_NAME: $(( $(date +%s) - STAGE_T0 )) s"; }
T_ALL=$(date +%s)

PY="$TARGET/bin/python"
PIP=("$PY" -m pip)

make_venv() {  # make_venv [--upgrade-pip] -- the "venv" stage: TARGET with PYTHON (>= 3.11), kept when it exists
  stage "venv"
  if [[ ! -x "$PY" ]]; then
    "$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11), f"python >= 3.11 needed, got {sys.version}"'
    "$PYTHON" -m venv "$TARGET"
    if [[ "${1:-}" == --upgrade-pip ]]; then "${PIP[@]}" install -q --upgrade pip; fi
  fi
  done_stage
}
