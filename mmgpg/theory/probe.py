"""``mmgpg probe``: per-prompt success counts of a policy at the rollout's sampling settings → ``probe_success.jsonl``.

A probe of the starting model (``--step 0``) gives each prompt's p_ref; probes of checkpoints give its trajectory.
``mmgpg diagnose`` reads the file from the run directory. Success is the task's binary ``success`` hook, or
``total reward >= --success-threshold`` for a task without one.
"""

from __future__ import annotations

import re
from pathlib import Path

from mmgpg.rundir import ProbeRecord


def locate(ckpt: str, step: int | None) -> tuple[Path | None, str, int]:
    """``(run_dir or None, model source, step)``. A run directory gives its checkpoint at ``step`` (default the
    latest; 0 = the run's starting model); any other path or hub id is probed as step ``step or 0``."""
    from mmgpg.rundir import CONFIG, complete_checkpoints

    path = Path(ckpt)
    if not (path / CONFIG).exists():
        return None, ckpt, step or 0
    if step == 0:
        return path, "", 0
    found = {int(m.group(1)): c for c in complete_checkpoints(path) if (m := re.search(r"(\d+)$", c.name))}
    if step is None:
        if not found:
            return path, "", 0
        step = max(found)
    if step not in found:
        raise FileNotFoundError(f"{path} has no complete checkpoint for step {step}; it has steps "
                                f"{sorted(found) or 'none'} (0 probes the starting model)")
    return path, str(found[step] / "policy"), step


def probe(cfg, source: str, *, step: int, split: str, samples: int, limit: int | None,
          success_threshold: float | None, batch_prompts: int = 4, chunk: int = 16, task=None) -> list[ProbeRecord]:
    """Load the policy ``source`` and probe the first ``limit`` prompts of ``split`` (:func:`probe_prompts`) with
    ``cfg.rollout``'s sampling settings (``task``: the command's task when it built one, else built here)."""
    from mmgpg.models.load import load_policy_for, resolve_device
    from mmgpg.rollout import EngineSettings, build_engine
    from mmgpg.task import build_task, check_task_for_model, first_items

    task = task if task is not None else build_task(cfg.task.name, cfg.task.options)
    check_success(task, success_threshold)
    examples = first_items(task.load(split), limit)
    policy = load_policy_for(cfg.model, resolve_device(cfg.device), source=source or cfg.model.name_or_path)
    check_task_for_model(task, policy.spec)
    engine = build_engine(cfg.rollout.engine, policy, EngineSettings.from_config(cfg))
    try:
        return probe_prompts(engine, task, examples, cfg.rollout, step=step, checkpoint=source or cfg.model.name_or_path,
                             split=split, samples=samples, success_threshold=success_threshold,
                             batch_prompts=batch_prompts, chunk=chunk)
    finally:
        engine.close()


def check_success(task, success_threshold: float | None) -> None:
    if not task.overrides("success") and success_threshold is None:
        raise ValueError(f"task {task.name!r} declares no binary success (no success method); pass "
                         "--success-threshold T to count completions with total reward >= T as successes")


def probe_prompts(engine, task, examples, rollout_cfg, *, step: int, checkpoint: str, split: str, samples: int,
                  success_threshold: float | None, batch_prompts: int = 4, chunk: int = 16) -> list[ProbeRecord]:
    """Sample ``samples`` completions per example through ``engine`` with the rollout's sampling settings, score them
    as training does (:func:`mmgpg.rollout.sample_groups`) and return one record per prompt. Success: the task's
    ``success`` hook, else ``total reward >= success_threshold``. Used by ``mmgpg probe`` and ``train.probe_every``."""
    from mmgpg.rollout import Sampling
    from mmgpg.rollout.collect import sample_groups

    if samples < 1:
        raise ValueError(f"--samples must be >= 1; got {samples}")
    sampling = Sampling.from_config(rollout_cfg)
    records = []
    for start in range(0, len(examples), batch_prompts):
        batch = examples[start:start + batch_prompts]
        counts = [0] * len(batch)
        done = 0
        while done < samples:
            n = min(chunk, samples - done)
            for i, group in enumerate(sample_groups(engine, task, batch, n, sampling)):
                if success_threshold is not None:
                    counts[i] += sum(r >= success_threshold for r in group.rewards)
                else:
                    counts[i] += sum(bool(x) for x in group.success)
            done += n
        for ex, k in zip(batch, counts):
            records.append(ProbeRecord(step=step, prompt_id=str(ex.id), split=split, samples=samples, successes=int(k),
                                       temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
                                       max_new_tokens=sampling.max_new_tokens, checkpoint=checkpoint))
    return records
