"""Validation of a well-typed :class:`~mmgpg.config.Config`: ranges, relations between keys, registered names and
the task with its options. Every problem is collected (:class:`~mmgpg.typed.Problem`); the caller raises them once."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from mmgpg.backends import BACKENDS, backend_fact
from mmgpg.models.lora import check_lora
from mmgpg.registry import ADVANTAGES, TOKEN_LOSSES
from mmgpg.task import checked_task
from mmgpg.typed import SEED_MAX, Problem, did_you_mean, range_problems

if TYPE_CHECKING:
    from mmgpg.config import Config, TaskConfig


def check(cfg: Config, *, task: bool = True) -> list[Problem]:
    """Every problem with the values of a well-typed config: the ranges its fields declare (one loop:
    :func:`mmgpg.typed.range_problems`), the relations between keys, registered names, the task and its options.
    ``task=False``: the task is not looked up (not imported), for readers of a run that do not use it."""
    p: list[Problem] = range_problems(cfg)
    m, r, a, t = cfg.model, cfg.rollout, cfg.algo, cfg.train
    p += _check_template_kwargs(m.chat_template_kwargs)
    if m.max_pixels < m.min_pixels:
        p.append(Problem("model.max_pixels", m.max_pixels, f"It is below model.min_pixels={m.min_pixels}.",
                         "raise model.max_pixels or lower model.min_pixels."))
    if r.temperature <= 0:
        p.append(Problem("rollout.temperature", r.temperature,
                         "Rollouts sample group_size completions per prompt; at temperature 0 (greedy) they are all "
                         "the same, so every group has zero variance and nothing is learnt.",
                         "set rollout.temperature=1.0 (evaluation is greedy by itself)."))
    p += _check_registered(cfg)
    if a.updates_per_batch > 1 and a.token_loss in TOKEN_LOSSES \
            and TOKEN_LOSSES.facts(a.token_loss).get("on_policy_only"):
        p.append(Problem("algo.updates_per_batch", a.updates_per_batch,
                         f"{a.token_loss} has no importance ratio, so a second update on the same samples would be "
                         "off-policy and uncorrected.", "set algo.token_loss=clipped_ratio, or algo.updates_per_batch=1."))
    p += _check_baselines(cfg)
    if t.lr_scheduler == "cosine_with_min_lr" and not 0 <= t.min_lr_rate < 1:
        p.append(Problem("train.min_lr_rate", t.min_lr_rate, "The floor is a fraction of the learning rate in [0, 1).",
                         "set train.min_lr_rate=0.1 (open-rs)."))
    elif t.lr_scheduler != "cosine_with_min_lr" and t.min_lr_rate != 0:
        p.append(Problem("train.min_lr_rate", t.min_lr_rate,
                         f"It applies to train.lr_scheduler=cosine_with_min_lr only (this run: {t.lr_scheduler}).",
                         "set train.lr_scheduler=cosine_with_min_lr, or leave train.min_lr_rate at 0."))
    if len(t.adam_betas) != 2 or not all(0 <= b < 1 for b in t.adam_betas):
        p.append(Problem("train.adam_betas", t.adam_betas, "AdamW needs two betas in [0, 1).",
                         "set train.adam_betas=[0.9,0.999]."))
    if not 0 <= cfg.seed <= SEED_MAX:
        p.append(Problem("seed", cfg.seed, f"Seeds are whole numbers from 0 to 2^32 - 1 = {SEED_MAX} (NumPy's and "
                         "vLLM's generators take 32-bit seeds).", "set seed to a number in that range, e.g. seed=0."))
    if r.max_staleness > 0 and not (r.engine == "vllm" and r.vllm_server):
        p.append(Problem("rollout.max_staleness", r.max_staleness,
                         f"Sampling ahead needs an engine that generates in a process of its own, with its own copy of "
                         f"the weights: the {r.engine} engine{' in the trainer process' if r.engine == 'vllm' else ''} "
                         "samples with the weights the update is changing.",
                         "start `mmgpg vllm-serve` and set rollout.engine=vllm rollout.vllm_server=http://HOST:PORT, "
                         "or rollout.max_staleness=0."))
    if r.max_staleness > 0 and r.vllm_sleep:
        p.append(Problem("rollout.vllm_sleep", True, "With rollout.max_staleness > 0 the engine samples during the "
                         "update, so it cannot free its memory then.", "set rollout.vllm_sleep=false."))
    for key, limit in (("logprob_check_mean", r.logprob_check_mean), ("logprob_check_max", r.logprob_check_max)):
        if limit is not None and not limit > 0:
            p.append(Problem(f"rollout.{key}", limit, "A limit on an absolute log-prob difference is > 0 (at 0 every "
                             "rounding difference would stop training).",
                             f"set rollout.{key}=null (the default) or a positive number."))
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?|mps|xpu(:\d+)?", cfg.device):
        p.append(Problem("device", cfg.device, "Not a torch device name.", "use auto, cpu, cuda or cuda:N."))
    if t.backend in BACKENDS:  # the backend's own keys (an unregistered name is reported above)
        p += backend_fact(t.backend, "check")(t)
    if task:
        p += _check_task(cfg.task)
    p += check_lora(cfg)
    p += _check_family(cfg)
    return p


def _check_family(cfg: Config) -> list[Problem]:
    """What the model family cannot run, when the model reference declares its family without loading (``tiny:F``
    or a local folder): the vLLM engine for a family it does not serve, packed scoring for one that cannot pack."""
    from mmgpg.models import FAMILIES, declared_model_type

    model_type = declared_model_type(cfg.model.name_or_path)
    if model_type not in FAMILIES:
        return []  # a hub id, or an unsupported family: loading names the problem
    spec, p = FAMILIES[model_type], []
    if cfg.rollout.engine == "vllm" and not spec.vllm:
        p.append(Problem("rollout.engine", "vllm", spec.vllm_refusal(), "use rollout.engine=hf (Hugging Face generate)."))
    if cfg.model.packed_sequences == "always" and not spec.packing:
        p.append(Problem("model.packed_sequences", "always", f"{spec.title} cannot score packed rows "
                         f"({spec.packing_note}).", "use model.packed_sequences=auto or never."))
    return p


def _check_baselines(cfg: Config) -> list[Problem]:
    """The keys of DAPO, GSPO, CISPO and REINFORCE++: ranges, and keys that would have no effect in this config
    (what a loss or an advantage is: the facts registered with it, :data:`mmgpg.registry.TOKEN_LOSSES`,
    :data:`mmgpg.registry.ADVANTAGES`)."""
    a, p = cfg.algo, []
    loss = TOKEN_LOSSES.facts(a.token_loss) if a.token_loss in TOKEN_LOSSES else {}
    ratio_losses = [name for name in TOKEN_LOSSES if TOKEN_LOSSES.facts(name).get("ratio")]
    if a.clip_eps_high is not None and a.clip_eps_high <= 0:
        p.append(Problem("algo.clip_eps_high", a.clip_eps_high, "An upper clip range is > 0.",
                         "set algo.clip_eps_high=0.28 (DAPO), or null for the symmetric clip_eps."))
    if a.cispo_eps_low is not None and not 0 < a.cispo_eps_low <= 1:
        p.append(Problem("algo.cispo_eps_low", a.cispo_eps_low, "The lower bound 1 - cispo_eps_low must lie in [0, 1).",
                         "set algo.cispo_eps_low=null (no lower bound, as MiniMax-M1) or a value in (0, 1]."))
    if a.clip_eps_high is not None and not loss.get("ratio"):
        p.append(Problem("algo.clip_eps_high", a.clip_eps_high, f"token_loss={a.token_loss} has no ratio to clip.",
                         "set algo.clip_eps_high=null, or a token loss with a ratio: " + ", ".join(ratio_losses) + "."))
    if a.cispo_eps_low is not None and a.token_loss != "cispo":
        p.append(Problem("algo.cispo_eps_low", a.cispo_eps_low, "Only the cispo token loss has this bound.",
                         "set algo.cispo_eps_low=null, or algo.token_loss=cispo."))
    if a.dual_clip is not None and (a.token_loss != "clipped_ratio" or not a.dual_clip > 1):
        p.append(Problem("algo.dual_clip", a.dual_clip, "Dual clip caps clipped_ratio's loss of a negative-advantage "
                         "token at -C x A, with C > 1 (the clip range already holds the ratio near 1).",
                         "set algo.dual_clip=null, or algo.token_loss=clipped_ratio with algo.dual_clip=3.0 (verl)."))
    if a.token_loss == "cispo" and a.clip_eps_high is None:
        p.append(Problem("algo.clip_eps_high", None, "CISPO caps its weight at 1 + clip_eps_high and needs the cap.",
                         "set algo.clip_eps_high=4.0 (TRL's epsilon_high = 5 is the cap 1 + 4)."))
    # Off-policy only: with one update per batch the ratio to the rollout policy is exactly 1.
    offpolicy = loss.get("offpolicy_only") or (a.token_loss == "clipped_ratio" and (
        a.clip_eps_high is not None or a.dual_clip is not None))
    if offpolicy and a.updates_per_batch == 1:
        what = {"clipped_ratio": "clip_eps_high (clip-higher) never acts, nor does dual_clip, and the gradient is "
                                 "the unclipped one",
                "cispo": "the CISPO weight is exactly 1 and the loss is reinforce's"}.get(
            a.token_loss, "the sequence ratio is exactly 1, the clip never acts and the gradient is clipped_ratio's")
        p.append(Problem("algo.updates_per_batch", 1,
                         f"The {loss['ratio']} compares the policy with the one that sampled the batch "
                         f"(old log-probs): with one update per rollout batch they are the same, so {what}.",
                         "set algo.updates_per_batch=2 or more (old log-probs are computed once per batch), or a "
                         "token loss whose meaning needs no ratio (reinforce; clipped_ratio without clip_eps_high or dual_clip)."))
    if a.advantage in ADVANTAGES and ADVANTAGES.facts(a.advantage).get("batch_whitened") and a.alpha_correction:
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


# Arguments of apply_chat_template that mmgpg sets itself (a conversation with a generation prompt, as text).
RENDER_ARGUMENTS = ("conversation", "messages", "add_generation_prompt", "tokenize", "continue_final_message",
                    "return_dict", "return_tensors", "chat_template")


def _check_template_kwargs(kwargs: dict) -> list[Problem]:
    """``model.chat_template_kwargs``: names of template variables, never one of the arguments mmgpg sets."""
    bad = sorted(str(k) for k in kwargs if not isinstance(k, str) or k in RENDER_ARGUMENTS or not k.isidentifier())
    if not bad:
        return []
    return [Problem("model.chat_template_kwargs", kwargs,
                    f"{', '.join(bad)}: not a template variable mmgpg can pass (mmgpg sets "
                    f"{', '.join(RENDER_ARGUMENTS)} itself; a variable is a Python identifier).",
                    "keep template variables only, e.g. model.chat_template_kwargs.enable_thinking=false.")]


def _check_registered(cfg: Config) -> list[Problem]:
    """Names that must be keys of a registry (each name list lives once, beside its implementations)."""
    from mmgpg.backends import BACKENDS
    from mmgpg.registry import ADVANTAGES, AGGREGATIONS, KL_ESTIMATORS, ROLLOUT_CORRECTIONS, TOKEN_LOSSES
    from mmgpg.rollout.engine import ENGINES

    out = []
    for key, value, names in (("algo.advantage", cfg.algo.advantage, ADVANTAGES),
                              ("algo.token_loss", cfg.algo.token_loss, TOKEN_LOSSES),
                              ("algo.aggregation", cfg.algo.aggregation, AGGREGATIONS),
                              ("algo.kl_estimator", cfg.algo.kl_estimator, KL_ESTIMATORS),
                              ("algo.rollout_correction", cfg.algo.rollout_correction, ROLLOUT_CORRECTIONS),
                              ("rollout.engine", cfg.rollout.engine, ENGINES),
                              ("train.backend", cfg.train.backend, BACKENDS)):
        if value not in names:
            out.append(Problem(key, value, "Not a registered name.",
                               "use one of: " + ", ".join(names) + "." + did_you_mean(value, list(names))))
    return out


def _check_task(task: TaskConfig) -> list[Problem]:
    return checked_task(task.name, task.options)[1]


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
