"""``mmgpg check``: a pre-flight of a task with a model before any GPU time is spent.

It loads a few examples, renders their prompts with the model's processor (the model itself is built on the meta
device: no weights are read) and checks each prompt's length — image tokens included — against
``model.max_prompt_length``; then it runs every training reward and the judge under both protocols on three probe
answers: an empty answer, garbage, and the task's gold answer. Expected: the gold answer earns the top accuracy,
the empty and garbage answers earn none; an empty answer that scores is reported (it is a reward hack). A reward that
is not a finite number (NaN) and a ``success()`` that returns neither a bool nor None are errors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PROBES = {"empty": "<think></think><answer></answer>", "garbage": "}{ lorem <answer ipsum 42 ((( \u00e9\u00e9 </think>"}


@dataclass
class Finding:
    check: str
    status: str  # ok | warn | error
    detail: str


def preflight(cfg, *, split: str = "train", examples: int = 4, task=None) -> list[Finding]:
    """Every finding of ``mmgpg check`` (``task``: the command's task when validation built it)."""
    from mmgpg.evaluation.run import judge_output
    from mmgpg.task import build_task, first_items

    findings: list[Finding] = []
    try:
        task = task if task is not None else build_task(cfg.task.name, cfg.task.options)
    except Exception as err:  # noqa: BLE001 - every problem is reported, not raised
        return [Finding("task", "error", f"{type(err).__name__}: {err}")]
    try:
        items = first_items(task.load(split), examples)
        if not items:
            raise ValueError(f"split {split!r} is empty")
        findings.append(Finding("data", "ok", f"{task.name}/{split}: {len(task.load(split))} items; loaded {len(items)}"))
    except Exception as err:  # noqa: BLE001
        findings.append(Finding("data", "error", f"{type(err).__name__}: {err}"))
        return findings
    policy = None
    try:
        from mmgpg.models.load import load_policy_for

        policy = load_policy_for(cfg.model, "meta")
        for problem in task.model_problems(policy.spec):  # e.g. a grounding task's box convention
            findings.append(Finding("task for this model", "error", str(problem)))
        policy.max_prompt_length = None  # measure every prompt here; the limit is compared below
        limit = cfg.model.max_prompt_length
        for ex in items:
            batch = policy.encode_prompts([task.prompt(ex)])
            length = int(batch.attention_mask.sum())
            images = policy.vision_tower is not None  # a text-only policy has no image tokens to count or shrink
            video = int((batch.mm_token_type_ids == 2).sum())  # transformers' convention: 1 image, 2 video
            counted = (f" ({int((batch.mm_token_type_ids == 1).sum())} image tokens"
                       + (f", {video} video tokens" if video else "") + ")") if images else ""
            fix = ("lower model.max_pixels" + (" or model.video_max_frames" if video else "")
                   + " or raise max_prompt_length") if images else "raise max_prompt_length"
            over = limit is not None and length > limit
            findings.append(Finding(f"prompt {ex.id}", "error" if over else "ok",
                                    f"{length} tokens{counted} vs max_prompt_length={limit}"
                                    + (f": too long — {fix}" if over else "")))
    except Exception as err:  # noqa: BLE001
        findings.append(Finding("prompts", "error", f"{type(err).__name__}: {err}"))
    if cfg.model.lora.rank > 0 and policy is not None:
        findings.append(lora_finding(policy.model, cfg.model.lora))
    has_gold = task.overrides("gold_completion")
    probes = dict(PROBES)
    for ex in items[:2]:
        answers = dict(probes)
        if has_gold:
            answers["gold"] = task.gold_completion(ex)
        else:
            findings.append(Finding("gold", "warn", "the task has no gold_completion(example): SFT and this probe "
                                                    "cannot use gold answers"))
        protocols = task.protocols if task.overrides("judge") else ("paper",)
        for label, text in answers.items():
            for protocol in protocols:
                try:
                    record = judge_output(task, text, ex, protocol)
                except Exception as err:  # noqa: BLE001
                    findings.append(Finding(f"{label} answer, {ex.id}", "error", f"raised {type(err).__name__}: {err}"))
                    continue
                findings.append(_judge_finding(label, ex.id, protocol, record))
            findings.extend(_reward_findings(task, label, ex, text))
    return findings


def _reward_findings(task, label: str, example, text: str) -> list[Finding]:
    """Errors for one probe answer: a training reward that is not a finite number (training stops on it; NaN would
    poison its group's advantages), a ``success()`` that raises or returns neither a bool nor None."""
    import math

    from mmgpg.task import SUCCESS_FIX, is_bool

    out: list[Finding] = []
    where = f"{label} answer, {example.id}"
    rewards: dict[str, float] = {}
    for name, fn in task.rewards.items():
        try:
            value = fn(text, example)
            rewards[name] = float(value)
        except Exception as err:  # noqa: BLE001 - every problem is reported, not raised
            out.append(Finding(where, "error", f"reward {name!r} raised {type(err).__name__}: {err}"))
            continue
        if not math.isfinite(rewards[name]):
            out.append(Finding(where, "error", f"reward {name!r} returned {value!r}, not a finite number: it would "
                                               "poison the advantages of its group (training stops on it) — make "
                                               "the reward return 0.0 when it cannot score"))
    rewards["total"] = sum(rewards.values())
    try:
        success = task.success(text, example, rewards)
    except Exception as err:  # noqa: BLE001
        return [*out, Finding(where, "error", f"success() raised {type(err).__name__}: {err}")]
    if success is not None and not is_bool(success):
        out.append(Finding(where, "error", f"success() returned {success!r} ({type(success).__name__}), not a bool: "
                                           "every non-zero value would count as a success in prompt_success.jsonl "
                                           f"and the diagnostics — {SUCCESS_FIX}"))
    return out


def _judge_finding(label: str, ident: str, protocol: str, record: dict[str, Any]) -> Finding:
    rewards = ", ".join(f"{k}={v:.3g}" for k, v in record["rewards"].items())
    detail = f"[{protocol}] judge correct={record['correct']:.3g}; rewards: {rewards}"
    accuracy = record["rewards"].get("accuracy", 0.0)
    status = "ok"
    if label == "gold" and record["correct"] <= 0:
        status, detail = "error", detail + " — the gold answer is judged wrong"
    elif label != "gold" and (record["correct"] > 0 or accuracy > 0):
        status, detail = "warn", detail + f" — an {label} answer scores (a reward hack under this protocol)"
    return Finding(f"{label} answer, {ident}", status, detail)


def lora_finding(model, lora_cfg) -> Finding:
    """What ``model.lora`` trains on this model (meta device): adapter and fully trained parameters and their share,
    or an error when a trainable module does not exist or no layer matches the targets."""
    from mmgpg.models.lora import count_parameters, resolve_trainable

    try:
        resolve_trainable(model, list(lora_cfg.trainable_modules))
    except ValueError as err:
        return Finding("lora", "error", str(err))
    c = count_parameters(model, lora_cfg)
    if not c["adapter"]:
        return Finding("lora", "error", f"model.lora.target_modules={lora_cfg.target_modules} match no linear layer of "
                                        "this model")
    total = sum(p.numel() for p in model.parameters())
    return Finding("lora", "ok", f"rank {lora_cfg.rank}: {c['adapter']:,} adapter + {c['full']:,} fully trained "
                                 f"parameters = {(c['adapter'] + c['full']) / total:.2%} of {total:,}")
