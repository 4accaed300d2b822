"""``mmgpg eval``: judge a checkpoint's outputs on task splits, greedy or sampled (``--samples K``: pass@1 and pass@k,
:mod:`mmgpg.evaluation.passk`), one benchmark or several with their average pass@1 (``--task a,b``);
``--predictions`` re-judges existing outputs without a model. docs/evaluation.md describes the files."""

from __future__ import annotations

import sys
from pathlib import Path

from mmgpg.cli.common import add_config_args, int_in, seed_flag
from mmgpg.rollout.engine import ENGINES

PAPER_TEMPERATURE, PAPER_TOP_P = 0.6, 0.95
"""The sampled-evaluation defaults: the GPG authors' lighteval setting (GPG:open-rs/eval.sh:4)."""
SIZE_MAX = 10**12
"""The flags' upper bound as numbers; what fits in memory is planned when the run starts (mmgpg.evaluation.budget)."""


def register(sub) -> None:
    p = sub.add_parser("eval", help="judge a checkpoint (or existing outputs) on task splits",
                       description="With --ckpt: greedy-decode a task split in batches (or, with --samples K, sample "
                       "K completions per item and report pass@k) and judge every output with the task's judge under "
                       "--protocol. With --predictions FILE: re-judge existing outputs without a model (JSONL with id, "
                       "model_output, ground_truth and the task's fields; see docs/evaluation.md). Writes "
                       "OUTPUT/predictions.jsonl and OUTPUT/metrics.json (several tasks: OUTPUT/<task>/ each, and "
                       "OUTPUT/metrics.json with the average) and prints a table.")
    p.add_argument("--task", required=True, action="append",
                   help="task name or path/to/file.py:ClassName (options: task.KEY=VALUE); several benchmarks: "
                   "comma-separated (--task math_500,aime24) or the flag repeated")
    p.add_argument("--ckpt", help="model directory, hub id, tiny, or a training run directory (its latest checkpoint)")
    p.add_argument("--predictions", help="JSONL of existing outputs to re-score (instead of --ckpt)")
    p.add_argument("--protocol", default="paper", help="judge protocol: paper (the anchor's rule, quirks included; "
                   "default) or strict (the quirks fixed)")
    p.add_argument("--split", default="test")
    p.add_argument("--limit", type=int, default=None, help="first N items only")
    p.add_argument("--batch-size", type=int_in(1, SIZE_MAX), default=32,
                   help="prompts per generate call (with --samples: sequences, i.e. batch-size // K prompts, or one "
                   "prompt's samples in pieces of batch-size); a call that does not fit in memory is refused")
    p.add_argument("--max-new-tokens", type=int_in(1, SIZE_MAX), default=256)
    p.add_argument("--samples", type=int, default=None, metavar="K",
                   help="sampled evaluation: K completions per item, reported as pass@1 (the mean over items of the "
                   "fraction correct) and pass@k for k = 1, 2, 4, ..., K (unbiased estimator); default: greedy")
    p.add_argument("--temperature", type=float, default=None,
                   help=f"with --samples: sampling temperature (default {PAPER_TEMPERATURE}, the GPG authors' "
                   "lighteval setting; 0 = greedy, only with --samples 1)")
    p.add_argument("--top-p", type=float, default=None,
                   help=f"with --samples: nucleus sampling mass in (0, 1] (default {PAPER_TOP_P}, as the authors)")
    p.add_argument("--seed", type=seed_flag, default=None,
                   help="with --samples: the sampling seed (default: the config's seed)")
    p.add_argument("--engine", choices=list(ENGINES), default=None,
                   help="rollout engine for --ckpt (default: rollout.engine, i.e. hf); vllm needs vLLM installed, or "
                   "rollout.vllm_server=URL of a running `mmgpg vllm-serve` (docs/install.md)")
    p.add_argument("--output", help="output directory (default runs/eval-<time>)")
    add_config_args(p)
    p.set_defaults(func=cmd_eval)


def task_names(values: list[str]) -> list[str]:
    """The benchmarks of the ``--task`` flags: each flag's comma-separated names, in order; a name twice is an error.

    >>> task_names(["math_500,aime24", "shapes"])
    ['math_500', 'aime24', 'shapes']
    """
    names = [n.strip() for v in values for n in v.split(",")]
    if any(not n for n in names):
        raise ValueError(f"--task {','.join(values)!r} has an empty name; give names separated by commas")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"--task lists {', '.join(twice)} more than once; give each benchmark once")
    return names


def sampled_decoding(args, seed: int):
    """The :class:`~mmgpg.evaluation.run.SampledDecoding` of ``--samples`` / ``--temperature`` / ``--top-p`` /
    ``--seed`` (None: greedy). The sampling flags without ``--samples`` are an error, as is any of them with
    ``--predictions`` (the file's outputs are already made)."""
    from mmgpg.evaluation.run import SampledDecoding

    given = [f for f, v in (("--temperature", args.temperature), ("--top-p", args.top_p), ("--seed", args.seed))
             if v is not None]
    if args.predictions and (given or args.samples is not None):
        raise ValueError(f"{', '.join([*given, *(['--samples'] if args.samples is not None else [])])} decide how "
                         "outputs are sampled; --predictions re-judges outputs already made: leave them out")
    if args.samples is None:
        if given:
            raise ValueError(f"{', '.join(given)} apply to sampled evaluation: add --samples K (K completions per "
                             "item), or leave them out for greedy decoding")
        return None
    temperature = PAPER_TEMPERATURE if args.temperature is None else args.temperature
    top_p = PAPER_TOP_P if args.top_p is None else args.top_p
    try:
        return SampledDecoding(args.samples, temperature, top_p, seed=seed if args.seed is None else args.seed)
    except ValueError as err:  # name the flags
        raise ValueError(str(err).replace("samples must", "--samples must").replace("top_p must", "--top-p must")
                         .replace("temperature must", "--temperature must")) from None


def cmd_eval(args) -> int:
    from mmgpg.config import resolve
    from mmgpg.task.judges import check_protocol

    if bool(args.ckpt) == bool(args.predictions):
        raise ValueError("give exactly one of --ckpt (generate and judge) or --predictions (re-score a JSONL file)")
    check_protocol(args.protocol)
    names = task_names(args.task)
    if args.predictions and len(names) > 1:
        raise ValueError(f"--predictions re-judges one task's outputs; got --task {','.join(names)}: re-score each "
                         "benchmark's predictions.jsonl with its own task")
    # the eval's engine runs no post-sync check (it never trains), so the training rule that refuses top_p < 1 for
    # vLLM (its log-probs are renormalised over the nucleus) does not apply
    engine_args = [f"rollout.max_new_tokens={args.max_new_tokens}", *([f"rollout.engine={args.engine}"]
                                                                      if args.engine else [])]
    resolved = [resolve([f"task={name}", *engine_args, *args.overrides, "rollout.logprob_check=false"],
                        config_dirs=args.config_dir) for name in names]
    cfgs = [r.config for r in resolved]
    _check_same_model(names, cfgs)
    decoding = sampled_decoding(args, cfgs[0].seed)
    if args.predictions:
        results = [_rescore(args, resolved[0].build_task())]
    else:
        results = _evaluate_checkpoint(args, cfgs, [r.build_task() for r in resolved], decoding)
        from mmgpg import distributed

        if not distributed.current().is_main:  # under torchrun: rank 0 writes and prints
            return 0
    _write(args, cfgs, results)
    return 0


def _check_same_model(names, cfgs) -> None:
    """Several benchmarks share one engine: their resolved model and rollout settings must agree."""
    import dataclasses

    first = (dataclasses.asdict(cfgs[0].model), dataclasses.asdict(cfgs[0].rollout))
    for name, cfg in zip(names[1:], cfgs[1:]):
        here = (dataclasses.asdict(cfg.model), dataclasses.asdict(cfg.rollout))
        diff = [f"{section}.{k}" for section, a, b in zip(("model", "rollout"), first, here) for k in a if a[k] != b[k]]
        if diff:
            raise ValueError(f"--task {names[0]} and {name} resolve to different {', '.join(diff)} (a task config "
                             "sets them), but one command evaluates every benchmark with one model and engine: give "
                             "them as overrides, or evaluate these benchmarks in separate commands")


def _rescore(args, task):
    from mmgpg.evaluation.predictions import rescore_predictions

    report = rescore_predictions(task, args.predictions, args.protocol, split=args.split, limit=args.limit)
    skipped, total = report.counts["skipped"], report.counts["rows"]
    for r in [r for r in report.records if "skipped" in r][:5]:
        print(f"skipped {args.predictions}:{r['line']} (id {r['id']!r}): {r['skipped']}", file=sys.stderr)
    if skipped > 5:
        print(f"... and {skipped - 5} more skipped rows (see predictions.jsonl)", file=sys.stderr)
    if not total - skipped:
        raise ValueError(f"{args.predictions}: none of its {total} rows could be judged (reasons above); fix the "
                         "file (docs/evaluation.md lists the fields each task needs)")
    return task, report


def _write(args, cfgs, results) -> None:
    """Each ``(task, report)`` as predictions.jsonl + metrics.json (several: one folder per benchmark, and the
    summary with the average pass@1 in OUTPUT/metrics.json); print the tables."""
    import dataclasses

    from mmgpg.evaluation.predictions import write_report, write_summary
    from mmgpg.evaluation.run import benchmark_summary
    from mmgpg.rundir import make_run_dir

    out = make_run_dir(args.output or "", "eval")
    for cfg, (task, report) in zip(cfgs, results):
        config = {"task": {"name": task.name, **(dataclasses.asdict(task) if dataclasses.is_dataclass(task) else {})},
                  "model": dataclasses.asdict(cfg.model)}
        folder = out if len(results) == 1 else out / report.task
        write_report(folder, report, config)
        print_metrics(report.metrics, report.title())
        print(f"wrote {folder / 'predictions.jsonl'} and {folder / 'metrics.json'}")
    if len(results) > 1:
        reports = [r for _, r in results]
        summary = benchmark_summary(reports)
        missing = [r.task for r in reports if f"{r.task}/pass@1" not in summary]
        if missing:
            print(f"no average: {', '.join(missing)} report a score, not a 0/1 correct (no pass@1)", file=sys.stderr)
        write_summary(out, summary, reports)
        print_metrics(summary, f"{len(reports)} benchmarks ({args.split}, protocol={args.protocol}): pass@1 per "
                      "benchmark and their unweighted average")
        print(f"wrote {out / 'metrics.json'}")


def _evaluate_checkpoint(args, cfgs, tasks, decoding):
    """Load ``--ckpt`` (a training run directory: its latest policy) into the rollout engine once and evaluate it on
    every task."""
    import torch

    from mmgpg.evaluation.run import run_evaluation
    from mmgpg.models.load import load_policy_for, resolve_device
    from mmgpg.rollout import EngineSettings, build_engine
    from mmgpg.rundir import latest_checkpoint
    cfg = cfgs[0]
    clash = sorted({t.name for t in tasks if [u.name for u in tasks].count(t.name) > 1})
    if clash:
        raise ValueError(f"--task: several benchmarks are the task {', '.join(clash)}; each benchmark is written to "
                         "a folder named after its task, so give each task once")
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
    from mmgpg.task import check_task_for_model

    for task in tasks:  # e.g. a grounding task's box convention against the model family's
        check_task_for_model(task, policy.spec)
    engine = build_engine(cfg.rollout.engine, policy, EngineSettings.from_config(cfg))
    check_batch = _generation_budget(args, cfg, policy, device) if cfg.rollout.engine == "hf" else None
    try:
        return [(task, run_evaluation(engine, task, args.split, limit=args.limit, protocol=args.protocol,
                               max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                               on_bad_row=c.data.on_bad_row, checkpoint=args.ckpt, engine_name=cfg.rollout.engine,
                               decoding=decoding, check_batch=check_batch))
                for task, c in zip(tasks, cfgs)]
    finally:
        engine.close()


def _generation_budget(args, cfg, policy, device):
    """``check_batch`` of the in-process HF engine: a generate call of that many sequences of up to
    ``model.max_prompt_length + --max-new-tokens`` tokens must fit in the device's free memory
    (:func:`mmgpg.evaluation.budget.check_generation`)."""
    import torch

    from mmgpg.evaluation.budget import check_generation, host_available_bytes

    text = policy.model.config.get_text_config()
    dtype_bytes = torch.finfo(policy.model.dtype).bits // 8
    tokens = cfg.model.max_prompt_length + args.max_new_tokens

    def check(sequences: int) -> None:
        free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else host_available_bytes()
        check_generation(args.batch_size, sequences, tokens, text, dtype_bytes, free)

    return check


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
