#!/usr/bin/env bash
# The success-amplification experiment of docs/theory.md (CPU, tiny Qwen2-VL, embedded shapes task).
# A tiny model is warm-started with SFT (as in `mmgpg demo`); then GPG, GRPO (k3, beta 0.04) and GRPO with k2 at
# beta 0.5 train on the first NTRAIN shapes prompts (each visited many times), with probes of every prompt at step 0
# (p_ref) and at each checkpoint, and `mmgpg diagnose` reads each run.
# Usage: bash bench/theory_experiment.sh OUT [STEPS] [NTRAIN] [SAMPLES]
set -euo pipefail
OUT=${1:?usage: theory_experiment.sh OUT [STEPS] [NTRAIN] [SAMPLES]}
STEPS=${2:-150}
NTRAIN=${3:-48}
SAMPLES=${4:-32}
PY=${PYTHON:-python}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
COMMON=(task=shapes model=tiny seed=0 device=cpu task.format_reward=false rollout.max_new_tokens=32)
if [ ! -d "$OUT/sft/final" ]; then
  $PY -m mmgpg sft "${COMMON[@]}" sft.max_steps=200 sft.batch_size=32 sft.learning_rate=1e-3 output_dir="$OUT/sft"
fi
RL=("${COMMON[@]}" model.name_or_path="$OUT/sft/final" model.dtype=float32 task.num_train="$NTRAIN"
    train.max_steps="$STEPS" train.prompts_per_step=8 train.micro_batch_prompts=8 rollout.group_size=8
    train.learning_rate=5e-4 train.save_every=$((STEPS / 3)) train.keep_last=3 train.tensorboard=false
    train.progress=false)
run() {  # name, extra overrides...
  local name=$1; shift
  if [ ! -f "$OUT/$name/metrics.jsonl" ]; then
    $PY -m mmgpg train "${RL[@]}" "$@" output_dir="$OUT/$name"
  fi
  $PY -m mmgpg probe "$OUT/$name" --step 0 --samples "$SAMPLES" --success-threshold 1
  for ckpt in "$OUT/$name"/checkpoints/step-*; do
    $PY -m mmgpg probe "$OUT/$name" --step "$((10#${ckpt##*step-}))" --samples "$SAMPLES" --success-threshold 1
  done
  $PY -m mmgpg diagnose "$OUT/$name" --success-threshold 1
}
run gpg algo=gpg
run grpo_k3 algo=grpo
run grpo_k2 algo=grpo algo.kl_estimator=k2 algo.kl_coef=0.5
