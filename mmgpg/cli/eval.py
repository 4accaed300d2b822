"""``mmgpg eval``: judge a checkpoint's outputs on a task split (``--predictions`` re-judges existing outputs without
a model)."""

from __future__ import annotations

import sys
from pathlib import Path

from mmgpg.cli.common import add_config_args
from mmgpg.rollout.engine import ENGINES


def register(sub) -> None:
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
    p.add_argument("--engine", choices=list(ENGINES), default=None,
                   help="rollout engine for --ckpt (default: rollout.engine, i.e. hf); vllm needs vLLM installed, or "
                   "rollout.vllm_server=URL of a running `mmgpg vllm-serve` (docs/install.md)")
    p.add_argument("--output", help="output directory (default runs/eval-<time>)")
    add_config_args(p)
    p.set_defaults(func=cmd_eval)


def cmd_eval(args) -> int:
    import dataclasses

    from mmgpg.config import resolve
    from mmgpg.evaluation.predictions import rescore_predictions, write_report
    from mmgpg.rundir import make_run_dir
    from mmgpg.task import build_task
    from mmgpg.task.judges import check_protocol

    if bool(args.ckpt) == bool(args.predictions):
        raise ValueError("give exactly one of --ckpt (generate and judge) or --predictions (re-score a JSONL file)")
    check_protocol(args.protocol)
    engine_args = [f"rollout.engine={args.engine}", f"rollout.max_new_tokens={args.max_new_tokens}"] if args.engine else []
    cfg = resolve([f"task={args.task}", *engine_args, *args.overrides], config_dirs=args.config_dir).config
    task = build_task(cfg.task.name, cfg.task.options)
    if args.predictions:
        report = rescore_predictions(task, args.predictions, args.protocol, split=args.split, limit=args.limit)
        skipped, total = report.counts["skipped"], report.counts["rows"]
        for r in [r for r in report.records if "skipped" in r][:5]:
            print(f"skipped {args.predictions}:{r['line']} (id {r['id']!r}): {r['skipped']}", file=sys.stderr)
        if skipped > 5:
            print(f"... and {skipped - 5} more skipped rows (see predictions.jsonl)", file=sys.stderr)
        if not total - skipped:
            raise ValueError(f"{args.predictions}: none of its {total} rows could be judged (reasons above); fix the "
                             "file (docs/evaluation.md lists the fields each task needs)")
    else:
        report = _evaluate_checkpoint(args, cfg, task)
        from mmgpg import distributed

        if not distributed.current().is_main:  # under torchrun: rank 0 writes and prints
            return 0
    out = make_run_dir(args.output or "", "eval")
    config = {"task": {"name": task.name, **(dataclasses.asdict(task) if dataclasses.is_dataclass(task) else {})},
              "model": dataclasses.asdict(cfg.model)}
    write_report(out, report, config)
    print_metrics(report.metrics, report.title())
    print(f"wrote {out / 'predictions.jsonl'} and {out / 'metrics.json'}")
    return 0


def _evaluate_checkpoint(args, cfg, task):
    """Load ``--ckpt`` (a training run directory: its latest policy) into the rollout engine and evaluate it."""
    import torch

    from mmgpg.evaluation.run import run_evaluation
    from mmgpg.models.load import load_policy_for, resolve_device
    from mmgpg.rollout import build_engine
    from mmgpg.rundir import latest_checkpoint

    ckpt = args.ckpt
    run_checkpoint = latest_checkpoint(Path(ckpt)) if Path(ckpt).is_dir() else None
    from mmgpg import distributed

    device = resolve_device(cfg.device)
    info = distributed.setup(device.type)  # under torchrun: the items' batches are split over the ranks
    if device.type == "cuda" and info.enabled:
        device = torch.device("cuda", info.local_rank)
    if run_checkpoint is not None:  # a training run: its latest policy
        ckpt = str(run_checkpoint / "policy")
        if info.is_main:
            print(f"evaluating {ckpt}")
    policy = load_policy_for(cfg.model, device, source=ckpt)
    engine = build_engine(cfg.rollout.engine, policy, cfg)
    try:
        return run_evaluation(engine, task, args.split, limit=args.limit, protocol=args.protocol,
                              max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                              on_bad_row=cfg.data.on_bad_row, checkpoint=args.ckpt, engine_name=cfg.rollout.engine)
    finally:
        engine.close()


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
