"""``mmgpg sample``: sample ``rollout.group_size`` completions for a few task prompts and score them (token
log-probs exactly as a training step computes them, and the task's rewards)."""

from __future__ import annotations

import json
import time

from mmgpg.cli.common import add_config_args, resolve_args


def register(sub) -> None:
    p = sub.add_parser("sample", help="sample G completions per task prompt and score them (log-probs, rewards)",
                       description="Load the policy, sample rollout.group_size completions for the first --prompts "
                       "items of the task split, compute their token log-probs exactly as a training step does, "
                       "score them with the task's rewards, print a table and write samples.jsonl + config.yaml "
                       "to the run directory.")
    add_config_args(p)
    p.add_argument("--prompts", type=int, default=2, help="number of task items to sample for (default 2)")
    p.add_argument("--split", default="train", help="task split to read (default train)")
    p.add_argument("--show", type=int, default=4, help="completions per prompt to print (default 4)")
    p.set_defaults(func=cmd_sample)


def cmd_sample(args) -> int:
    import torch
    from rich.table import Table

    from mmgpg.config import save_config
    from mmgpg.jsonl import write_jsonl_atomic
    from mmgpg.models.load import load_policy_for, resolve_device
    from mmgpg.rollout import EngineSettings, Sampling, build_engine
    from mmgpg.rollout.collect import collate_groups, group_logprobs, sample_groups
    from mmgpg.rundir import make_run_dir
    from mmgpg.task import check_task_for_model
    from mmgpg.utils import console as make_console
    from mmgpg.utils import seed_everything

    console = make_console()
    resolved = resolve_args(args)
    cfg = resolved.config
    run_dir = make_run_dir(cfg.output_dir, "sample")
    save_config(resolved, run_dir, "sample")
    seed_everything(cfg.seed)
    timings: dict[str, float] = {}

    t0 = time.perf_counter()
    with console.status(f"loading {cfg.model.name_or_path} ..."):
        policy = load_policy_for(cfg.model, resolve_device(cfg.device))
        task = resolved.build_task()
        check_task_for_model(task, policy.spec)
    timings["load"] = time.perf_counter() - t0
    examples = task.load(args.split)[: args.prompts]
    r = cfg.rollout

    t0 = time.perf_counter()
    engine = build_engine(cfg.rollout.engine, policy, EngineSettings.from_config(cfg))
    with console.status(f"sampling {r.group_size} completions for each of {len(examples)} prompts ..."):
        groups = sample_groups(engine, task, examples, r.group_size, Sampling.from_config(r),
                               zero_variance_tol=cfg.algo.zero_variance_tol)
    timings["rollout"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    batch = collate_groups(policy, task, groups, r.group_size)
    with torch.no_grad():
        logprobs = group_logprobs(policy, batch, cfg.model, r)
    timings["logprobs"] = time.perf_counter() - t0

    records = []
    for g in groups:
        truncated = g.truncated(policy.eos_token_ids)
        for j, (ids, text, total) in enumerate(zip(g.completion_ids, g.texts, g.rewards)):
            row = g.prompt_index * r.group_size + j
            scores = {**{k: v[j] for k, v in g.components.items()}, "total": total}
            records.append({
                "prompt_id": g.example.id, "sample": j, "answer": g.example.answer, "completion": text,
                "tokens": len(ids), "truncated": truncated[j],
                "logprob_sum": float(logprobs[row].sum()), "rewards": scores,
                "success": None if g.success is None else g.success[j],
            })
    write_jsonl_atomic(run_dir / "samples.jsonl", (json.dumps(rec, default=str) for rec in records))

    table = Table(title=f"{len(examples)} prompts x {r.group_size} completions ({args.show} shown per prompt)")
    for col in ("prompt", "gold", "completion", "tokens", "sum log p", *task.rewards):
        table.add_column(col, overflow="fold")
    for rec in records:
        if rec["sample"] < args.show:
            text = rec["completion"].replace("\n", " ")
            table.add_row(rec["prompt_id"], str(rec["answer"]), text[:70] + ("…" if len(text) > 70 else ""),
                          str(rec["tokens"]), f"{rec['logprob_sum']:.2f}",
                          *(f"{rec['rewards'][k]:.2f}" for k in task.rewards))
    console.print(table)
    means = {k: sum(rec["rewards"][k] for rec in records) / len(records) for k in [*task.rewards, "total"]}
    console.print("mean rewards: " + ", ".join(f"reward/{k}={v:.3f}" for k, v in means.items()))
    console.print("time: " + ", ".join(f"{k} {v:.2f} s" for k, v in timings.items())
                  + f"; {batch.num_completion_tokens} completion tokens")
    console.print(f"wrote {run_dir / 'samples.jsonl'} and {run_dir / 'config.yaml'}")
    return 0
