"""``mmgpg probe``: per-prompt success counts of a policy at the rollout's sampling settings → ``probe_success.jsonl``.

A probe of the starting model (``--step 0``) gives each prompt's p_ref; probes of checkpoints give its trajectory.
``mmgpg diagnose`` reads the file from the run directory. Success is the task's binary ``success`` hook, or
``total reward >= --success-threshold`` for a task without one.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

PROBE_FILE = "probe_success.jsonl"


def run_config(run_dir: Path, overrides: list[str]):
    """The run's saved config with ``a.b=value`` overrides applied (a group such as ``task=...`` cannot be swapped
    under a finished run)."""
    from mmgpg.config import Config, ConfigError, Problem, check, from_dict, to_dict
    from mmgpg.theory.diagnose import load_run_config

    tree = to_dict(load_run_config(run_dir / "config.yaml")[0])
    for arg in overrides:
        key, sep, raw = arg.partition("=")
        if not sep or "." not in key:
            raise ConfigError([Problem(arg, arg, "Under a run directory only field overrides a.b=value apply.",
                                       "write e.g. rollout.temperature=1.0 (the run's task and model are kept).")])
        node = tree
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = yaml.safe_load(raw) if raw else ""
    problems: list = []
    cfg = from_dict(Config, tree, problems)
    problems += check(cfg)
    if problems:
        raise ConfigError(problems)
    return cfg


def locate(ckpt: str, step: int | None) -> tuple[Path | None, str, int]:
    """``(run_dir or None, model source, step)``. A run directory gives its checkpoint at ``step`` (default the
    latest; 0 = the run's starting model); any other path or hub id is probed as step ``step or 0``."""
    from mmgpg.train.checkpoint import complete_checkpoints

    path = Path(ckpt)
    if not (path / "config.yaml").exists():
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


def probe(cfg, source: str, *, split: str, samples: int, limit: int | None, success_threshold: float | None,
          batch_prompts: int = 4, chunk: int = 16) -> list[dict]:
    """Load the policy ``source`` and probe the first ``limit`` prompts of ``split`` (:func:`probe_prompts`) with
    ``cfg.rollout``'s sampling settings."""
    from mmgpg.models.load import load_policy_for
    from mmgpg.rollout import build_engine
    from mmgpg.task import build_task, first_items
    from mmgpg.utils import resolve_device

    task = build_task(cfg.task.name, cfg.task.options)
    check_success(task, success_threshold)
    examples = first_items(task.load(split), limit)
    policy = load_policy_for(cfg.model, resolve_device(cfg.device), source=source or cfg.model.name_or_path)
    engine = build_engine(cfg.rollout.engine, policy, cfg)
    try:
        return probe_prompts(engine, task, examples, cfg.rollout, split=split, samples=samples,
                             success_threshold=success_threshold, batch_prompts=batch_prompts, chunk=chunk)
    finally:
        engine.close()


def check_success(task, success_threshold: float | None) -> None:
    if not task.overrides("success") and success_threshold is None:
        raise ValueError(f"task {task.name!r} declares no binary success (no success method); pass "
                         "--success-threshold T to count completions with total reward >= T as successes")


def probe_prompts(engine, task, examples, rollout_cfg, *, split: str, samples: int, success_threshold: float | None,
                  batch_prompts: int = 4, chunk: int = 16) -> list[dict]:
    """Sample ``samples`` completions per example through ``engine`` with the rollout's sampling settings, score them
    as training does (:func:`mmgpg.rollout.sample_groups`) and return one record per prompt. Success: the task's
    ``success`` hook, else ``total reward >= success_threshold``. Used by ``mmgpg probe`` and ``train.probe_every``."""
    from mmgpg.rollout import Sampling, sample_groups

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
            records.append({"prompt_id": ex.id, "split": split, "samples": samples, "successes": int(k),
                            "temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": sampling.top_k,
                            "max_new_tokens": sampling.max_new_tokens})
    return records


def write_probe(path: Path, step: int, checkpoint: str, records: list[dict]) -> Path:
    """Append this probe's records to ``path``, replacing an earlier probe of the same step and split."""
    splits = {r["split"] for r in records}
    kept = []
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                old = json.loads(line)
                if not (old.get("step") == step and old.get("split") in splits):
                    kept.append(line)
    lines = kept + [json.dumps({"step": step, **r, "checkpoint": checkpoint}) for r in records]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines))
    return path


def cmd_probe(args) -> int:
    from mmgpg.config import resolve
    from mmgpg.utils import seed_everything

    run_dir, source, step = locate(args.ckpt, args.step)
    if run_dir is not None:
        cfg = run_config(run_dir, args.overrides)
    else:
        cfg = resolve(args.overrides, config_dirs=args.config_dir).config
    seed_everything(cfg.seed + 20_000 + step)
    records = probe(cfg, source, split=args.split, samples=args.samples, limit=args.limit,
                    success_threshold=args.success_threshold, batch_prompts=args.batch_prompts)
    out = Path(args.out) if args.out else (run_dir / PROBE_FILE if run_dir is not None else Path(PROBE_FILE))
    write_probe(out, step, source or cfg.model.name_or_path, records)
    k = sum(r["successes"] for r in records)
    n = sum(r["samples"] for r in records)
    print(f"probed {len(records)} prompts of {args.split} x {args.samples} samples at step {step} "
          f"({source or cfg.model.name_or_path}): mean success {k / max(n, 1):.3f}; wrote {out}")
    return 0


def add_parser(sub, add_config_args) -> None:
    p = sub.add_parser("probe", help="per-prompt success counts of a checkpoint at the rollout's sampling settings",
                       description="Sample --samples completions for each of the first --limit prompts of --split "
                       "with rollout.temperature/top_p/top_k/max_new_tokens, count successes (the task's success "
                       "hook, or total reward >= --success-threshold) and write probe_success.jsonl: into CKPT when it "
                       "is a training run directory (its config is used; --step 0 probes the starting model, which "
                       "gives p_ref), else to --out. Example: mmgpg probe runs/gpg --step 0 --samples 64 --limit 100")
    p.add_argument("ckpt", help="a training run directory, a model directory or hub id, or tiny")
    p.add_argument("--step", type=int, default=None,
                   help="checkpoint step of a run directory (default the latest; 0 = the starting model)")
    p.add_argument("--split", default="train", help="task split (default train: the prompts the run trains on)")
    p.add_argument("--samples", type=int, default=64, help="completions per prompt (default 64)")
    p.add_argument("--limit", type=int, default=None, help="first N prompts only")
    p.add_argument("--batch-prompts", type=int, default=4, help="prompts per generate call (default 4)")
    p.add_argument("--success-threshold", type=float, default=None,
                   help="count total reward >= this as success (instead of the task's success hook; needed without one)")
    p.add_argument("--out", default=None, help=f"output file (default RUN_DIR/{PROBE_FILE} or ./{PROBE_FILE})")
    add_config_args(p)
    p.set_defaults(func=cmd_probe)
