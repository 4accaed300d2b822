"""The DeepSpeed configuration mmgpg derives from its own keys, merged with an optional user JSON
(``train.deepspeed_config``), and the checks of the ``train.*`` DeepSpeed keys. Pure Python: importing this module
does not import DeepSpeed, so ``mmgpg check`` works without it.

mmgpg owns everything that changes the numbers of an update: the ZeRO stage and offload switches, gradient clipping,
bf16, the batch bookkeeping (one backward per micro-batch, the accumulation boundary set by the trainer) and the
optimizer and schedule (built from ``train.*``). A user JSON may add anything else (bucket sizes, overlap_comm,
communication dtypes, ...) and may repeat an mmgpg-owned key only with the same value or ``"auto"``; any other value is
a configuration error that names both sources. It may not turn on offload (``zero_optimization.offload_*``; only
``train.offload_*`` do, so the planner and the checks know), set ``train_batch_size`` (DeepSpeed checks it against
mmgpg's batch bookkeeping and stops), apex ``amp``, or give a section as a single value (or the reverse).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

# Keys of the user JSON that mmgpg never takes from it, with the mmgpg key that decides them.
OWNED_SECTIONS = {"optimizer": "train.learning_rate / train.adam_* / train.weight_decay (mmgpg builds AdamW)",
                  "scheduler": "train.lr_scheduler / train.warmup_steps (mmgpg steps the schedule)",
                  "fp16": "model.dtype (mmgpg trains in float32 or bf16; fp16 loss scaling is not supported)",
                  "amp": "model.dtype (mmgpg trains in float32 or bf16; apex AMP is not used)"}
# Keys the user JSON may give only as "auto": DeepSpeed checks them against what mmgpg sets and stops inside its
# initialisation otherwise.
OWNED_KEYS = {"train_batch_size": "train.micro_batch_prompts and the number of ranks (mmgpg drives the accumulation; "
                                  "train_batch_size must equal micro batch x accumulation x ranks inside DeepSpeed)"}
# Offload switches: zero_optimization sections (and DeepSpeed's older boolean spellings) that move state to host or
# NVMe memory. Only mmgpg's own keys turn them on (the planner, the offload checks and resume depend on them).
OFFLOAD_KEYS = {"offload_optimizer": "train.offload_optimizer", "offload_param": "train.offload_params",
                "cpu_offload": "train.offload_optimizer", "cpu_offload_param": "train.offload_params"}

INSTALL_HINT = "pip install 'mmgpg[deepspeed]'"


def planned_offload(train) -> str:
    """The offload a training config (``train.*``) asks for, in the memory planner's names (``mmgpg.backends.memory
    .OFFLOADS``): "none" off DeepSpeed. The planner models parameter offload only together with optimizer offload, so
    ``train.offload_params`` alone is a ValueError (``mmgpg plan --offload`` can still say what to plan for)."""
    if train.backend != "deepspeed":
        return "none"
    if train.offload_params and not train.offload_optimizer:
        raise ValueError("the planner models parameter offload only together with optimizer offload "
                         "(train.offload_params=true, train.offload_optimizer=false); mmgpg plan --offload chooses what to plan for")
    return "optimizer+params" if train.offload_params else "optimizer" if train.offload_optimizer else "none"


def label(zero_stage: int, offload: str) -> str:
    """How a plan or a log names a DeepSpeed setup: ``deepspeed ZeRO-3 + optimizer offload``."""
    return f"deepspeed ZeRO-{zero_stage}" + (f" + {offload} offload" if offload != "none" else "")


def derive(zero_stage: int, offload_optimizer: bool, offload_params: bool, max_grad_norm: float,
           bf16: bool) -> tuple[dict[str, Any], dict[str, str]]:
    """The DeepSpeed config mmgpg needs, and for each of its leaf keys (dotted) the mmgpg key it comes from.

    One micro-batch per backward and ``gradient_accumulation_steps = 1``: the trainer marks the accumulation
    boundary itself (the number of micro-batches varies from step to step), so these two only satisfy DeepSpeed's
    batch-size bookkeeping."""
    zero: dict[str, Any] = {"stage": zero_stage}
    sources = {"zero_optimization.stage": "train.zero_stage",
               "train_micro_batch_size_per_gpu": "train.micro_batch_prompts (mmgpg drives the accumulation)",
               "gradient_accumulation_steps": "train.micro_batch_prompts (mmgpg drives the accumulation)",
               "gradient_clipping": "train.max_grad_norm", "bf16.enabled": "model.dtype (bf16 on a bf16 GPU)"}
    if offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu"}
        sources["zero_optimization.offload_optimizer.device"] = "train.offload_optimizer"
    if offload_params:
        zero["offload_param"] = {"device": "cpu"}
        sources["zero_optimization.offload_param.device"] = "train.offload_params"
    derived = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
               "gradient_clipping": float(max_grad_norm), "bf16": {"enabled": bool(bf16)},
               "zero_optimization": zero, "zero_allow_untested_optimizer": True,
               "steps_per_print": 2**31 - 1, "wall_clock_breakdown": False}
    return derived, sources


def _leaves(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_leaves(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def merge(derived: dict[str, Any], sources: dict[str, str], user: dict[str, Any], origin: str,
          unknown: frozenset[str] = frozenset()) -> dict[str, Any]:
    """``user`` laid over ``derived``; raises :class:`mmgpg.config.ConfigError` listing every key where the user
    JSON (``origin``) contradicts a value mmgpg derives (``"auto"`` always agrees), sets a section or key mmgpg owns
    (:data:`OWNED_SECTIONS`, :data:`OWNED_KEYS`), turns on an offload that mmgpg's ``train.offload_*`` keys leave off
    (:data:`OFFLOAD_KEYS`), or gives a section where mmgpg sets a single value or the reverse (DeepSpeed would stop
    inside its initialisation). ``unknown``: derived leaves whose value is not known yet (bf16 before the GPU is
    seen): their shape is checked, not their value.

    >>> merge({"a": {"b": 1}}, {"a.b": "train.x"}, {"a": {"b": "auto", "c": 2}}, "ds.json")
    {'a': {'b': 1, 'c': 2}}
    """
    from mmgpg.typed import ConfigError, Problem

    def problem(key: str, value: Any, why: str, fix: str) -> Problem:
        return Problem("train.deepspeed_config", f"{origin}: {key} = {value!r}", why, fix)

    problems = []
    for key, owner in OWNED_SECTIONS.items():
        if key in user:
            problems.append(Problem("train.deepspeed_config", f"{origin}: {key}",
                                    f"mmgpg decides this itself from {owner}.",
                                    f"remove the \"{key}\" section from {origin}."))
    for key, owner in OWNED_KEYS.items():
        if key in user and user[key] != "auto":
            problems.append(problem(key, user[key], f"mmgpg decides this itself from {owner}.",
                                    f"remove {key} from {origin} (or set it to \"auto\")."))
    problems += _shape_problems(derived, user, origin, "")
    zero_user, zero_mine = user.get("zero_optimization"), derived.get("zero_optimization", {})
    if isinstance(zero_user, dict):
        for key, switch in OFFLOAD_KEYS.items():
            value = zero_user.get(key)
            device = value.get("device", "none") if isinstance(value, dict) else value
            if key in zero_user and key not in zero_mine and device not in ("none", "auto", None, False):
                what = "parameter" if switch.endswith("params") else "optimizer"
                problems.append(problem(f"zero_optimization.{key}", value, f"It turns on {what} offload behind "
                                        f"{switch}=false: the memory plan, the offload checks and the resume check "
                                        "would not know of it.",
                                        f"remove zero_optimization.{key} from {origin} and set {switch}=true (the JSON "
                                        "may then tune the section, e.g. pin_memory)."))
    mine = _leaves(derived)
    for key, value in _leaves(user).items():
        if key in mine and key not in unknown and value != "auto" and value != mine[key]:
            problems.append(Problem("train.deepspeed_config", f"{origin}: {key} = {value!r}",
                                    f"It contradicts {sources.get(key, 'mmgpg')}, which gives {key} = {mine[key]!r}.",
                                    f"remove {key} from {origin} (or set it to \"auto\"), or change "
                                    f"{sources.get(key, 'the mmgpg key')}."))
    if problems:
        raise ConfigError(problems)
    cleaned = {k: v for k, v in user.items() if not (k in OWNED_KEYS and v == "auto")}

    def drop_auto(tree: dict[str, Any]) -> dict[str, Any]:
        return {k: drop_auto(v) if isinstance(v, dict) else v for k, v in tree.items() if v != "auto"}

    return _deep_merge(derived, drop_auto(cleaned))


def _shape_problems(derived: dict[str, Any], user: dict[str, Any], origin: str, prefix: str) -> list:
    """A user value that is a section where mmgpg sets a single value, or a single value where mmgpg sets a section
    (``"zero_optimization": 3``, ``"bf16": true``): DeepSpeed's own config parser stops on it."""
    from mmgpg.typed import Problem

    out = []
    for key, value in user.items():
        if key not in derived or value == "auto":
            continue
        mine, dotted = derived[key], f"{prefix}{key}"
        if isinstance(mine, dict) and not isinstance(value, dict):
            out.append(Problem("train.deepspeed_config", f"{origin}: {dotted} = {value!r}",
                               f"DeepSpeed expects {dotted} to be a JSON object (mmgpg sets "
                               f"{json.dumps(mine)[:80]}).", f"write {dotted} as a JSON object {{...}}, or remove it."))
        elif not isinstance(mine, dict) and isinstance(value, dict):
            out.append(Problem("train.deepspeed_config", f"{origin}: {dotted} = {value!r}",
                               f"DeepSpeed expects {dotted} to be a single value (mmgpg sets {mine!r}).",
                               f"write {dotted} as a single value, or remove it."))
        elif isinstance(mine, dict):
            out += _shape_problems(mine, value, origin, f"{dotted}.")
    return out


def read_user_config(path: str) -> dict[str, Any]:
    """The JSON object in ``path``; a missing or malformed file is a ConfigError naming it."""
    from mmgpg.typed import ConfigError, Problem

    p = Path(path).expanduser()
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError([Problem("train.deepspeed_config", path, "The file does not exist.",
                                   "give the path of a DeepSpeed JSON file, or leave the key unset.")]) from None
    except (OSError, json.JSONDecodeError) as err:
        raise ConfigError([Problem("train.deepspeed_config", path, f"It is not readable JSON ({err}).",
                                   "fix the file (DeepSpeed configs are one JSON object).")]) from None
    if not isinstance(data, dict):
        raise ConfigError([Problem("train.deepspeed_config", path, "It holds no JSON object.",
                                   "write the DeepSpeed settings as one {...} object.")])
    return data


def check(t: Any) -> list:
    """Problems of the ``train.*`` DeepSpeed keys (``t`` is the TrainConfig): ranges, combinations, the package, the
    user JSON and its conflicts with everything mmgpg derives except bf16 (that depends on the GPU found at start)."""
    from mmgpg.typed import ConfigError, Problem

    p = []
    ds = t.backend == "deepspeed"
    if not ds:
        for key, value in (("offload_optimizer", t.offload_optimizer), ("offload_params", t.offload_params),
                           ("deepspeed_config", t.deepspeed_config)):
            if value:
                p.append(Problem(f"train.{key}", value, f"It only applies to train.backend=deepspeed, not "
                                 f"{t.backend}.", f"set train.backend=deepspeed, or drop train.{key}."))
        return p
    if t.zero_stage not in (0, 1, 2, 3):
        p.append(Problem("train.zero_stage", t.zero_stage, "ZeRO stages are 0, 1, 2 and 3.",
                         "set train.zero_stage=2 (or 3 to partition the parameters too)."))
        return p
    if t.offload_params and t.zero_stage != 3:
        p.append(Problem("train.offload_params", True, f"Parameter offload needs partitioned parameters (ZeRO stage 3); "
                         f"train.zero_stage={t.zero_stage}.", "set train.zero_stage=3, or train.offload_params=false."))
    if t.offload_optimizer and t.zero_stage == 0:
        p.append(Problem("train.offload_optimizer", True, "Optimizer offload needs ZeRO stage 1 or more.",
                         "set train.zero_stage=2, or train.offload_optimizer=false."))
    if importlib.util.find_spec("deepspeed") is None:
        p.append(Problem("train.backend", "deepspeed", "The deepspeed package is not installed.",
                         f"{INSTALL_HINT}, or set train.backend=plain."))
    if t.deepspeed_config:
        derived, sources = derive(t.zero_stage, t.offload_optimizer, t.offload_params, t.max_grad_norm, bf16=False)
        try:  # bf16 depends on the GPU found at start: its value is checked then, its shape now
            merge(derived, sources, read_user_config(t.deepspeed_config), t.deepspeed_config,
                  unknown=frozenset({"bf16.enabled"}))
        except ConfigError as err:
            p.extend(err.problems)
    return p
