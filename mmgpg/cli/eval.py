"""``mmgpg sample`` and ``mmgpg eval``: the commands that generate with a rollout engine and score or judge the
outputs (``mmgpg eval --predictions`` re-judges existing outputs without a model)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from mmgpg.config import resolve


def add_parsers(sub, add_config_args) -> None:
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

    p = sub.add_parser("eval", help="judge a checkpoint (or existing outputs) on a task split",
                       description="With --ckpt: greedy-decode a task split in batches and judge every output with "
                       "the task's judge under --protocol. With --predictions FILE: re-judge existing outputs without "
                       "a model (JSONL with id, model_output, ground_truth and the task's fields; see "
                       "docs/evaluation.md). Writes OUTPUT/predictions.jsonl and OUTPUT/metrics.json and prints a table.")
    p.add_argument("--task", required=True, help="task name or path/to/file.py:ClassName (options: task.KEY=VALUE)")
    p.add_argument("--ckpt", help="model directory, hub id, tiny, or a training run directory (its latest checkpoint)")
    p.add_argument("--predictions", help="JSONL of existing outputs to re-score (instead of --ckpt)")
    p.add_argument("--protocol", default="paper", help="judge protocol: paper (the anchor's rule, quirks included; "
                   "default) or strict (the quirks fixed)")
    p.add_argument("--split", default="test")
    p.add_argument("--limit", type=int, default=None, help="first N items only")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--engine", choices=["hf", "vllm"], default=None,
                   help="rollout engine for --ckpt (default: rollout.engine, i.e. hf); vllm needs vLLM installed, or "
                   "rollout.vllm_server=URL of a running `mmgpg vllm-serve` (docs/install.md)")
    p.add_argument("--output", help="output directory (default runs/eval-<time>)")
    add_config_args(p)
    p.set_defaults(func=cmd_eval)


def cmd_sample(args) -> int:
    import torch
    from rich.table import Table

    from mmgpg.config import save_config
    from mmgpg.models.load import load_policy_for
    from mmgpg.models.qwen_vl import CompletionBatch, pad_completions
    from mmgpg.rollout import Sampling, build_engine, sample_groups
    from mmgpg.task import build_task
    from mmgpg.utils import console as make_console
    from mmgpg.utils import make_run_dir, resolve_device, seed_everything

    console = make_console()
    resolved = resolve(args.overrides, config_dirs=args.config_dir)
    cfg = resolved.config
    run_dir = make_run_dir(cfg.output_dir, "sample")
    save_config(resolved, run_dir, "sample")
    seed_everything(cfg.seed)
    timings: dict[str, float] = {}

    t0 = time.perf_counter()
    with console.status(f"loading {cfg.model.name_or_path} ..."):
        policy = load_policy_for(cfg.model, resolve_device(cfg.device))
        task = build_task(cfg.task.name, cfg.task.options)
    timings["load"] = time.perf_counter() - t0
    examples = task.load(args.split)[: args.prompts]
    r = cfg.rollout

    t0 = time.perf_counter()
    engine = build_engine(cfg.rollout.engine, policy, cfg)
    with console.status(f"sampling {r.group_size} completions for each of {len(examples)} prompts ..."):
        groups = sample_groups(engine, task, examples, r.group_size, Sampling.from_config(r),
                               zero_variance_tol=cfg.algo.zero_variance_tol)
    timings["rollout"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    prompts = groups[0].prompts or policy.encode_prompts([task.prompt(ex) for ex in examples])
    batch = CompletionBatch(prompts, r.group_size,
                            *pad_completions([c for g in groups for c in g.completion_ids], policy.pad_token_id))
    with torch.no_grad():
        logprobs = policy.completion_logprobs(batch, chunk_size=cfg.model.logprob_chunk_size,
                                              temperature=r.temperature,
                                              encode_images_once=cfg.model.encode_images_once)
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
    with open(run_dir / "samples.jsonl", "w") as f:
        for rec in records:
            f.write(json.dumps(rec, default=str) + "\n")

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


def cmd_eval(args) -> int:
    import dataclasses

    from mmgpg.evaluation.run import evaluate, read_predictions, rescore, write_evaluation
    from mmgpg.task import build_task, good_items
    from mmgpg.task.judges import check_protocol
    from mmgpg.utils import make_run_dir, resolve_device

    if bool(args.ckpt) == bool(args.predictions):
        raise ValueError("give exactly one of --ckpt (generate and judge) or --predictions (re-score a JSONL file)")
    check_protocol(args.protocol)
    engine_args = [f"rollout.engine={args.engine}", f"rollout.max_new_tokens={args.max_new_tokens}"] if args.engine else []
    cfg = resolve([f"task={args.task}", *engine_args, *args.overrides], config_dirs=args.config_dir).config
    task = build_task(cfg.task.name, cfg.task.options)
    counts: dict[str, int] = {}
    if args.predictions:
        rows, lines, unreadable = read_predictions(args.predictions)
        metrics, records, skipped = rescore(task, rows, args.protocol, lines=lines)
        ordered = sorted([*zip(lines, records), *((u["line"], u) for u in unreadable)], key=lambda pair: pair[0])
        records = [r for _, r in ordered]
        skipped += len(unreadable)
        total = len(rows) + len(unreadable)
        counts.update(rows=total, evaluated=total - skipped, skipped=skipped)
        source = {"predictions": str(Path(args.predictions).resolve())}
        for r in [r for r in records if "skipped" in r][:5]:
            print(f"skipped {args.predictions}:{r['line']} (id {r['id']!r}): {r['skipped']}", file=sys.stderr)
        if skipped > 5:
            print(f"... and {skipped - 5} more skipped rows (see predictions.jsonl)", file=sys.stderr)
        if not total - skipped:
            raise ValueError(f"{args.predictions}: none of its {total} rows could be judged (reasons above); fix the "
                             "file (docs/evaluation.md lists the fields each task needs)")
    else:
        from mmgpg.models.load import load_policy_for
        from mmgpg.train.checkpoint import latest_checkpoint

        ckpt = args.ckpt
        run_checkpoint = latest_checkpoint(Path(ckpt)) if Path(ckpt).is_dir() else None
        if run_checkpoint is not None:  # a training run: its latest policy
            ckpt = str(run_checkpoint / "policy")
            print(f"evaluating {ckpt}")
        from mmgpg.rollout import build_engine

        policy = load_policy_for(cfg.model, resolve_device(cfg.device), source=ckpt)
        engine = build_engine(cfg.rollout.engine, policy, cfg)
        split = task.load(args.split)
        examples, bad_rows = good_items(split, args.limit, cfg.data.on_bad_row)
        for row, reason in bad_rows.items():
            print(f"skipped bad data row {row}: {reason}", file=sys.stderr)
        try:
            metrics, records = evaluate(engine, task, examples, batch_size=args.batch_size,
                                        max_new_tokens=args.max_new_tokens, protocol=args.protocol)
        finally:
            engine.close()
        records += [{"row": row, "skipped": reason} for row, reason in bad_rows.items()]
        counts.update(evaluated=len(examples), skipped=len(bad_rows), available=len(split))
        source = {"checkpoint": args.ckpt, "decoding": "greedy", "max_new_tokens": args.max_new_tokens,
                  "engine": cfg.rollout.engine}
    counts["parse_failures"] = int(sum(r.get("parse_failure", 0) for r in records if "skipped" not in r))
    out = make_run_dir(args.output or "", "eval")
    config = {"task": {"name": task.name, **(dataclasses.asdict(task) if dataclasses.is_dataclass(task) else {})},
              "model": dataclasses.asdict(cfg.model)}
    write_evaluation(out, metrics, records, {"task": task.name, "task_version": task.version, "protocol": args.protocol,
                                             "split": args.split, "limit": args.limit, "counts": counts,
                                             "config": config, **source})
    print_metrics(metrics, f"{task.name} ({args.split}, protocol={args.protocol}, {counts['evaluated']} items"
                   + (f", {counts['skipped']} skipped" if counts.get("skipped") else "") + ")")
    print(f"wrote {out / 'predictions.jsonl'} and {out / 'metrics.json'}")
    return 0


def print_metrics(metrics: dict[str, float], title: str) -> None:
    from rich.table import Table

    from mmgpg.utils import console

    print(title)
    table = Table()
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in metrics.items():
        table.add_row(key, f"{value:.4f}" if isinstance(value, float) and not float(value).is_integer() else f"{value:g}")
    console().print(table)
