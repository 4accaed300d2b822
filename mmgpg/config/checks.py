"""Validation of a well-typed :class:`~mmgpg.config.Config`: ranges, relations between keys, registered names and
the task with its options. Every problem is collected (:class:`~mmgpg.typed.Problem`); the caller raises them once."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from mmgpg.backends import deepspeed_config
from mmgpg.models.lora import check_lora
from mmgpg.task import TaskNotFound, find_task_class, options_problems
from mmgpg.typed import Problem, did_you_mean

if TYPE_CHECKING:
    from mmgpg.config import Config, TaskConfig


def check(cfg: Config, *, task: bool = True) -> list[Problem]:
    """Every problem with the values of a well-typed config (ranges, relations, the task and its options).
    ``task=False``: the task is not looked up (not imported), for readers of a run that do not use it."""
    p: list[Problem] = []
    m, r = cfg.model, cfg.rollout
    if m.min_pixels < 1:
        p.append(Problem("model.min_pixels", m.min_pixels, "Images need a positive area.", "set model.min_pixels=3136."))
    if m.max_pixels < m.min_pixels:
        p.append(Problem("model.max_pixels", m.max_pixels, f"It is below model.min_pixels={m.min_pixels}.",
                         "raise model.max_pixels or lower model.min_pixels."))
    if m.max_prompt_length < 1:
        p.append(Problem("model.max_prompt_length", m.max_prompt_length, "Prompts need at least one token.",
                         "set model.max_prompt_length=1024."))
    if m.logprob_chunk_size < 1:
        p.append(Problem("model.logprob_chunk_size", m.logprob_chunk_size, "Chunks need at least one token.",
                         "set model.logprob_chunk_size=1024."))
    if r.group_size < 1:
        p.append(Problem("rollout.group_size", r.group_size, "Each prompt needs at least one completion.",
                         "set rollout.group_size=8."))
    if r.max_new_tokens < 1:
        p.append(Problem("rollout.max_new_tokens", r.max_new_tokens, "Completions need at least one token.",
                         "set rollout.max_new_tokens=256."))
    if r.temperature <= 0:
        p.append(Problem("rollout.temperature", r.temperature,
                         "Rollouts sample group_size completions per prompt; at temperature 0 (greedy) they are all "
                         "the same, so every group has zero variance and nothing is learnt.",
                         "set rollout.temperature=1.0 (evaluation is greedy by itself)."))
    if not 0 < r.top_p <= 1:
        p.append(Problem("rollout.top_p", r.top_p, "top_p is a probability mass in (0, 1].", "set rollout.top_p=1.0."))
    if r.top_k < 0:
        p.append(Problem("rollout.top_k", r.top_k, "top_k counts tokens (0 disables it).", "set rollout.top_k=0."))
    a, t = cfg.algo, cfg.train
    p += _check_registered(cfg)
    if a.std_eps < 0:
        p.append(Problem("algo.std_eps", a.std_eps, "It must be >= 0.", "set algo.std_eps=1e-4."))
    if a.clip_eps <= 0:
        p.append(Problem("algo.clip_eps", a.clip_eps, "The clip range must be > 0.", "set algo.clip_eps=0.2."))
    if a.kl_coef < 0:
        p.append(Problem("algo.kl_coef", a.kl_coef, "A KL weight is >= 0.", "set algo.kl_coef=0 (GPG) or 0.04 (GRPO)."))
    if not 0 <= a.min_valid_fraction <= 1:
        p.append(Problem("algo.min_valid_fraction", a.min_valid_fraction, "It is a fraction of samples in [0, 1].",
                         "set algo.min_valid_fraction=0.4 (0 disables resampling)."))
    if a.max_resample_attempts < 1:
        p.append(Problem("algo.max_resample_attempts", a.max_resample_attempts, "At least one rollout is needed.",
                         "set algo.max_resample_attempts=20."))
    if a.zero_variance_tol < 0:
        p.append(Problem("algo.zero_variance_tol", a.zero_variance_tol, "A tolerance is >= 0.",
                         "set algo.zero_variance_tol=0."))
    if a.updates_per_batch < 1:
        p.append(Problem("algo.updates_per_batch", a.updates_per_batch, "At least one update per batch.",
                         "set algo.updates_per_batch=1."))
    elif a.updates_per_batch > 1 and a.token_loss == "reinforce":
        p.append(Problem("algo.updates_per_batch", a.updates_per_batch,
                         "reinforce has no importance ratio, so a second update on the same samples would be off-policy "
                         "and uncorrected.", "set algo.token_loss=clipped_ratio, or algo.updates_per_batch=1."))
    p += _check_baselines(cfg)
    for key, value, low in (("max_steps", t.max_steps, 1), ("prompts_per_step", t.prompts_per_step, 1),
                            ("micro_batch_prompts", t.micro_batch_prompts, 1), ("keep_last", t.keep_last, 1),
                            ("warmup_steps", t.warmup_steps, 0), ("save_every", t.save_every, 0),
                            ("max_nonfinite_steps", t.max_nonfinite_steps, 0), ("probe_every", t.probe_every, 0),
                            ("probe_samples", t.probe_samples, 1), ("probe_limit", t.probe_limit, 0)):
        if value < low:
            p.append(Problem(f"train.{key}", value, f"It must be >= {low}.", f"set train.{key} to an integer >= {low}."))
    for key, value, low in (("max_steps", cfg.sft.max_steps, 1), ("batch_size", cfg.sft.batch_size, 1),
                            ("eval_every", cfg.sft.eval_every, 0), ("save_every", cfg.sft.save_every, 0)):
        if value < low:
            p.append(Problem(f"sft.{key}", value, f"It must be >= {low}.", f"set sft.{key} to an integer >= {low}."))
    if cfg.sft.learning_rate <= 0:
        p.append(Problem("sft.learning_rate", cfg.sft.learning_rate, "It must be > 0.", "set sft.learning_rate=1e-5."))
    if t.eval_every < 0 or t.eval_limit < 0:
        p.append(Problem("train.eval_every", (t.eval_every, t.eval_limit), "eval_every and eval_limit are >= 0.",
                         "set train.eval_every=0 or a positive step count."))
    if t.status_every_s < 0:  # NaN and infinity are refused for every number already
        p.append(Problem("train.status_every_s", t.status_every_s, "It must be a number of seconds >= 0.",
                         "set train.status_every_s=60 (0: no status lines)."))
    if t.learning_rate <= 0:
        p.append(Problem("train.learning_rate", t.learning_rate, "It must be > 0.", "set train.learning_rate=1e-6."))
    if t.lr_scheduler == "cosine_with_min_lr" and not 0 <= t.min_lr_rate < 1:
        p.append(Problem("train.min_lr_rate", t.min_lr_rate, "The floor is a fraction of the learning rate in [0, 1).",
                         "set train.min_lr_rate=0.1 (open-rs)."))
    elif t.lr_scheduler != "cosine_with_min_lr" and t.min_lr_rate != 0:
        p.append(Problem("train.min_lr_rate", t.min_lr_rate,
                         f"It applies to train.lr_scheduler=cosine_with_min_lr only (this run: {t.lr_scheduler}).",
                         "set train.lr_scheduler=cosine_with_min_lr, or leave train.min_lr_rate at 0."))
    if t.max_grad_norm < 0:
        p.append(Problem("train.max_grad_norm", t.max_grad_norm, "It must be >= 0 (0 disables clipping).",
                         "set train.max_grad_norm=1.0."))
    if len(t.adam_betas) != 2 or not all(0 <= b < 1 for b in t.adam_betas):
        p.append(Problem("train.adam_betas", t.adam_betas, "AdamW needs two betas in [0, 1).",
                         "set train.adam_betas=[0.9,0.999]."))
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?|mps|xpu(:\d+)?", cfg.device):
        p.append(Problem("device", cfg.device, "Not a torch device name.", "use auto, cpu, cuda or cuda:N."))
    p += deepspeed_config.check(t)
    if task:
        p += _check_task(cfg.task)
    p += check_lora(cfg)
    return p


# Token losses with a ratio to the rollout policy (and what their ratio bounds are called in the messages).
_RATIO_LOSSES = {"clipped_ratio": "clipped ratio", "gspo": "GSPO ratio", "gspo_token": "GSPO-token ratio",
                 "cispo": "CISPO weight"}
# Advantages whitened with the statistics of the whole batch: zero-variance groups carry gradient there.
_BATCH_WHITENED = ("reinforce_pp", "reinforce_pp_baseline")


def _check_baselines(cfg: Config) -> list[Problem]:
    """The keys of DAPO, GSPO, CISPO and REINFORCE++: ranges, and keys that would have no effect in this config."""
    a, p = cfg.algo, []
    if a.clip_eps_high is not None and a.clip_eps_high <= 0:
        p.append(Problem("algo.clip_eps_high", a.clip_eps_high, "An upper clip range is > 0.",
                         "set algo.clip_eps_high=0.28 (DAPO), or null for the symmetric clip_eps."))
    if a.cispo_eps_low is not None and not 0 < a.cispo_eps_low <= 1:
        p.append(Problem("algo.cispo_eps_low", a.cispo_eps_low, "The lower bound 1 - cispo_eps_low must lie in [0, 1).",
                         "set algo.cispo_eps_low=null (no lower bound, as MiniMax-M1) or a value in (0, 1]."))
    if a.clip_eps_high is not None and a.token_loss not in _RATIO_LOSSES:
        p.append(Problem("algo.clip_eps_high", a.clip_eps_high, f"token_loss={a.token_loss} has no ratio to clip.",
                         "set algo.clip_eps_high=null, or a token loss with a ratio: " + ", ".join(_RATIO_LOSSES) + "."))
    if a.cispo_eps_low is not None and a.token_loss != "cispo":
        p.append(Problem("algo.cispo_eps_low", a.cispo_eps_low, "Only the cispo token loss has this bound.",
                         "set algo.cispo_eps_low=null, or algo.token_loss=cispo."))
    if a.token_loss == "cispo" and a.clip_eps_high is None:
        p.append(Problem("algo.clip_eps_high", None, "CISPO caps its weight at 1 + clip_eps_high and needs the cap.",
                         "set algo.clip_eps_high=4.0 (TRL's epsilon_high = 5 is the cap 1 + 4)."))
    # Off-policy only: with one update per batch the ratio to the rollout policy is exactly 1.
    offpolicy = a.token_loss in ("gspo", "gspo_token", "cispo") or (a.token_loss == "clipped_ratio"
                                                                    and a.clip_eps_high is not None)
    if offpolicy and a.updates_per_batch == 1:
        what = {"clipped_ratio": "clip_eps_high (clip-higher) never acts and the gradient is the unclipped one",
                "cispo": "the CISPO weight is exactly 1 and the loss is reinforce's"}.get(
            a.token_loss, "the sequence ratio is exactly 1, the clip never acts and the gradient is clipped_ratio's")
        p.append(Problem("algo.updates_per_batch", 1,
                         f"The {_RATIO_LOSSES[a.token_loss]} compares the policy with the one that sampled the batch "
                         f"(old log-probs): with one update per rollout batch they are the same, so {what}.",
                         "set algo.updates_per_batch=2 or more (old log-probs are computed once per batch), or a "
                         "token loss whose meaning needs no ratio (reinforce; clipped_ratio without clip_eps_high)."))
    if a.advantage in _BATCH_WHITENED and a.alpha_correction:
        p.append(Problem("algo.alpha_correction", True,
                         f"{a.advantage} whitens with the batch's statistics, so zero-variance groups carry gradient too "
                         "and B/(B-M) would correct a shrinkage that does not happen.",
                         "set algo.alpha_correction=false."))
    r = cfg.rollout
    f = a.overlong_buffer_fraction
    if not 0 <= f < 1 or (f > 0 and round(f * r.max_new_tokens) < 1):
        p.append(Problem("algo.overlong_buffer_fraction", f,
                         f"L_cache = round(fraction x rollout.max_new_tokens={r.max_new_tokens}) must be at least one "
                         "token and below L_max: the penalty ramps from L_max - L_cache to L_max.",
                         "set it to 0 (off), or in (0, 1), e.g. 0.2 (DAPO: 4096 of 20480)."))
    return p


def _check_registered(cfg: Config) -> list[Problem]:
    """Names that must be keys of a registry (each name list lives once, beside its implementations)."""
    from mmgpg.backends import BACKENDS
    from mmgpg.registry import ADVANTAGES, AGGREGATIONS, KL_ESTIMATORS, TOKEN_LOSSES
    from mmgpg.rollout.engine import ENGINES

    out = []
    for key, value, names in (("algo.advantage", cfg.algo.advantage, ADVANTAGES),
                              ("algo.token_loss", cfg.algo.token_loss, TOKEN_LOSSES),
                              ("algo.aggregation", cfg.algo.aggregation, AGGREGATIONS),
                              ("algo.kl_estimator", cfg.algo.kl_estimator, KL_ESTIMATORS),
                              ("rollout.engine", cfg.rollout.engine, ENGINES),
                              ("train.backend", cfg.train.backend, BACKENDS)):
        if value not in names:
            out.append(Problem(key, value, "Not a registered name.",
                               "use one of: " + ", ".join(names) + "." + did_you_mean(value, list(names))))
    return out


def _check_task(task: TaskConfig) -> list[Problem]:
    try:
        cls = find_task_class(task.name)
    except TaskNotFound as err:
        return [Problem("task.name", task.name, err.why, err.fix)]
    return options_problems(cls, task.options)


def check_training(cfg: Config, world_size: int) -> list[Problem]:
    """What only ``mmgpg train`` needs, checked when it starts (the world size is known then): the step's prompts
    split evenly over the ranks, groups of two or more (a group of one never has variance), wandb installed."""
    problems = []
    if cfg.train.prompts_per_step % world_size:
        problems.append(Problem("train.prompts_per_step", cfg.train.prompts_per_step,
                                f"It must split evenly over the {world_size} ranks.", f"use a multiple of {world_size}."))
    if cfg.rollout.group_size < 2:
        problems.append(Problem("rollout.group_size", cfg.rollout.group_size,
                                "A group of one always has zero variance and never teaches anything.",
                                "use 2 or more (the papers use 8)."))
    if cfg.train.wandb:
        import importlib.util

        if importlib.util.find_spec("wandb") is None:
            problems.append(Problem("train.wandb", True, "The wandb package is not installed.",
                                    "pip install wandb, or set train.wandb=false."))
    return problems
