"""The ``mmgpg`` command. Each subcommand's ``--help`` says what it does; config arguments are ``GROUP=NAME`` and
``a.b=c`` (see ``mmgpg config show --doc`` for every field)."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

OVERRIDES_HELP = (
    "config groups GROUP=NAME (e.g. task=shapes model=tiny) and field overrides a.b=c "
    "(e.g. rollout.group_size=4); `mmgpg config show --doc` documents every field"
)


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help=OVERRIDES_HELP)
    p.add_argument("--config-dir", action="append", default=[], metavar="DIR",
                   help="extra folder with base.yaml and group folders, searched before the built-in configs/")


def _resolve(args):
    from mmgpg.config import resolve

    return resolve(args.overrides, config_dirs=args.config_dir)


# ---- mmgpg model --------------------------------------------------------------------------------------------------


def cmd_model_tiny(args) -> int:
    from mmgpg.models.tiny import build_and_save, count_parameters

    if args.config_only:
        from mmgpg.models.tiny import save_config_only

        print(f"wrote {save_config_only(args.out, family=args.family, size=args.size, seed=args.seed)}/config.json")
        return 0
    t0 = time.perf_counter()
    out = build_and_save(args.out, family=args.family, size=args.size, seed=args.seed, dtype=args.dtype)
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(out)
    counts = count_parameters(model)
    print(f"built {args.size} {args.family} in {out} ({time.perf_counter() - t0:.1f} s): "
          f"{counts['total']:,} parameters ({counts['vision']:,} vision, {counts['language']:,} language), "
          f"vocab {model.config.text_config.vocab_size:,}")
    return 0


def cmd_model_info(args) -> int:
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText, GenerationConfig

    from mmgpg.models.load import resolve_model_path
    from mmgpg.models.tiny import count_parameters
    from mmgpg.train.checkpoint import check_model_source

    path = resolve_model_path(args.model)
    check_model_source(path)
    config = AutoConfig.from_pretrained(path)
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(config)
    counts = count_parameters(model)
    text = config.text_config
    try:
        eos = GenerationConfig.from_pretrained(path).eos_token_id
    except OSError:
        eos = text.eos_token_id
    info = {
        "path": path,
        "model_type": config.model_type,
        "parameters": counts,
        "vocab_size": text.vocab_size,
        "hidden_size": text.hidden_size,
        "layers": text.num_hidden_layers,
        "vision_depth": config.vision_config.depth,
        "eos_token_ids": eos,
        "image_token_id": config.image_token_id,
    }
    print(json.dumps(info, indent=2))
    return 0


# ---- mmgpg config -------------------------------------------------------------------------------------------------


def cmd_config_show(args) -> int:
    from mmgpg.config import to_yaml

    resolved = _resolve(args)
    sys.stdout.write(to_yaml(resolved.config, with_docs=args.doc))
    return 0


def cmd_config_groups(args) -> int:
    from mmgpg.config import available_groups, config_search_path

    for group, names in available_groups(config_search_path(args.config_dir)).items():
        print(f"{group}: {' '.join(names)}")
    return 0


# ---- mmgpg tasks --------------------------------------------------------------------------------------------------


def cmd_tasks(args) -> int:
    from rich.table import Table

    from mmgpg.task import TaskNotFound, build_task, registered_tasks
    from mmgpg.typed import ConfigError
    from mmgpg.utils import console

    table = Table(title="mmgpg tasks (entry points: mmgpg.tasks)")
    for col in ("name", "version", "rewards", "provided by", "description"):
        table.add_column(col)
    for name, ep in sorted(registered_tasks().items()):
        try:
            task = build_task(name)
            doc = (type(task).__doc__ or "").strip().splitlines()[0] if type(task).__doc__ else ""
            table.add_row(name, str(task.version), ", ".join(task.rewards), ep.value, doc)
        except (TaskNotFound, ConfigError, TypeError, ValueError) as err:
            table.add_row(name, "?", "?", ep.value, f"[red]cannot load: {err}[/red]")
    console().print(table)
    print("A task in a local file: task=path/to/file.py:ClassName")
    return 0


# ---- mmgpg sample -------------------------------------------------------------------------------------------------


# ---- mmgpg train --------------------------------------------------------------------------------------------------


def cmd_train(args) -> int:
    from mmgpg.train.trainer import Trainer

    trainer = Trainer(_resolve(args))
    run_dir = trainer.train()
    if trainer.dist.is_main:
        print(f"run directory: {run_dir} (metrics.jsonl, prompt_success.jsonl, checkpoints/, tensorboard/)")
    return 0


# ---- mmgpg sft / eval / plot / demo --------------------------------------------------------------------------------


def cmd_sft(args) -> int:
    from mmgpg.train.sft import SFTTrainer

    trainer = SFTTrainer(_resolve(args))
    final = trainer.train(progress=lambda m: print(json.dumps(m), flush=True))
    print(f"fine-tuned model: {final}")
    return 0


def cmd_check(args) -> int:
    from mmgpg.config import resolve
    from mmgpg.evaluation.preflight import preflight
    from mmgpg.utils import console

    cfg = resolve(list(args.overrides), config_dirs=args.config_dir).config
    findings = preflight(cfg, split=args.split, examples=args.examples)
    if args.gpus is not None or args.gpu_memory_gb is not None:  # the same test as `mmgpg plan`
        from mmgpg.cli.plan import memory_finding

        findings.append(memory_finding(cfg, args))
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=None)
    for column in ("check", "status", "detail"):
        table.add_column(column)
    colour = {"ok": "green", "warn": "yellow", "error": "red"}
    for f in findings:
        table.add_row(escape(f.check), f"[{colour[f.status]}]{f.status}[/]", escape(f.detail))
    print(f"mmgpg check: task={cfg.task.name} model={cfg.model.name_or_path} split={args.split}")
    console().print(table)
    errors = sum(f.status == "error" for f in findings)
    warnings = sum(f.status == "warn" for f in findings)
    print(f"{errors} error(s), {warnings} warning(s)")
    return 1 if errors else 0


def cmd_plot(args) -> int:
    from mmgpg.train.plots import plot_run

    for path in plot_run(args.run_dir, args.out):
        print(path)
    return 0


def cmd_demo(args) -> int:
    from mmgpg.train.demo import DemoSettings, run_demo
    from mmgpg.utils import console

    settings = DemoSettings(output=args.output or "", seed=args.seed, sft_steps=args.sft_steps,
                            gpg_steps=args.gpg_steps, eval_limit=args.eval_limit, eval_every=args.eval_every,
                            prompts_per_step=args.prompts_per_step, algo=args.algo, threads=args.threads,
                            sft_lr=args.sft_lr, gpg_lr=args.lr, lr_scheduler=args.lr_scheduler,
                            overrides=tuple(args.set), rl_overrides=tuple(args.rl_set))
    if args.quick:
        settings.sft_steps, settings.gpg_steps, settings.eval_limit, settings.eval_every = 4, 2, 8, 1
        settings.eval_samples = 2
        settings.prompts_per_step, settings.max_resample_attempts = 2, 2
    run_demo(settings, console())
    return 0


# ---- parser -------------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    from mmgpg import __version__

    parser = argparse.ArgumentParser(
        prog="mmgpg",
        description="GPG (Group Policy Gradient) and GRPO for vision-language models (Qwen2-VL, Qwen2.5-VL).",
    )
    parser.add_argument("--version", action="version", version=f"mmgpg {__version__}")
    parser.add_argument("--debug", action="store_true", help="show the full traceback when a command fails")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("train", help="train a policy with GPG, GRPO or a variant (algo=...)",
                       description="Train the policy on the task with the algorithm of the config (algo=gpg by "
                       "default). Writes config.yaml, metrics.jsonl, prompt_success.jsonl, TensorBoard logs and "
                       "checkpoints/ to output_dir. Runs under torchrun for several processes (gloo on CPU, nccl on "
                       "GPU). Example: mmgpg train algo=gpg task=shapes model=tiny train.max_steps=20")
    _add_config_args(p)
    p.set_defaults(func=cmd_train)

    from mmgpg.train.demo import DemoSettings

    d = DemoSettings()
    p = sub.add_parser("demo", help="offline CPU demo: tiny Qwen2-VL, SFT warm start, GPG, before/after + plots",
                       description="Build a tiny Qwen2-VL offline, warm-start it with SFT on the embedded shapes task, "
                       "evaluate it, train it with GPG, evaluate again, print a before/after table and write PNG "
                       "plots. About 8 minutes on 2 CPU cores with the defaults; --quick runs a seconds-long version.")
    p.add_argument("--output", help="run directory (default runs/demo-<time>)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--sft-steps", type=int, default=d.sft_steps)
    p.add_argument("--gpg-steps", type=int, default=d.gpg_steps, help="RL steps")
    p.add_argument("--prompts-per-step", type=int, default=d.prompts_per_step)
    p.add_argument("--eval-limit", type=int, default=d.eval_limit, help="test images per evaluation")
    p.add_argument("--eval-every", type=int, default=d.eval_every)
    p.add_argument("--algo", default=d.algo, help="any configs/algo/ name (default gpg)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--sft-lr", type=float, default=d.sft_lr)
    p.add_argument("--lr", type=float, default=d.gpg_lr, help="RL learning rate")
    p.add_argument("--lr-scheduler", choices=["constant", "linear", "cosine"], default=d.lr_scheduler,
                   help="RL learning-rate schedule")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="extra config override for SFT and RL, e.g. --set task.format_reward=false (repeatable)")
    p.add_argument("--rl-set", action="append", default=[], metavar="KEY=VALUE",
                   help="config override for the RL stage only, e.g. --rl-set model.lora.rank=8 (repeatable)")
    p.add_argument("--quick", action="store_true", help="a seconds-long smoke version (tiny budgets)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("sft", help="supervised fine-tuning on the task's gold answers (the +SFT baseline)",
                       description="Fine-tune the policy on the task's gold completions (sft.* fields); writes "
                       "metrics.jsonl and final/ (a Hugging Face directory) to output_dir.")
    _add_config_args(p)
    p.set_defaults(func=cmd_sft)

    p = sub.add_parser("check", help="pre-flight: data, image-token budgets and every reward/judge on probe answers",
                       description="Load a few examples of the task, check each prompt's length (image tokens "
                       "included) against model.max_prompt_length, and run every reward and the judge (both "
                       "protocols) on an empty, a garbage and the gold answer. Exit status 1 when an error is found.")
    p.add_argument("--split", default="train")
    p.add_argument("--examples", type=int, default=4, help="examples to load and check")
    _add_config_args(p)
    from mmgpg.cli.plan import add_hardware_args

    add_hardware_args(p, required=False)  # with --gpus and --gpu-memory-gb: also the memory plan (mmgpg plan)
    p.set_defaults(func=cmd_check)

    from mmgpg.cli.plan import add_plan_parser

    add_plan_parser(sub, _add_config_args)

    p = sub.add_parser("plot", help="PNG plots of a run's metrics (reward, valid fraction, alpha, evaluation)",
                       description="Write PNG plots of RUN_DIR/metrics.jsonl to RUN_DIR/plots (or --out).")
    p.add_argument("run_dir")
    p.add_argument("--out", default=None)
    p.set_defaults(func=cmd_plot)

    p = sub.add_parser("model", help="build or inspect models", description="Build or inspect models.")
    msub = p.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    t = msub.add_parser("tiny", help="build a Qwen2-VL / Qwen2.5-VL offline (random init, real classes)",
                        description="Build a randomly initialised Qwen2-VL or Qwen2.5-VL with a tokenizer and "
                        "processor made locally, and save it as a Hugging Face directory that AutoProcessor and "
                        "AutoModelForImageTextToText load. --size shape_true uses the real 2B/3B dimensions "
                        "(vocab 151,936) for memory and speed measurements.")
    t.add_argument("--out", required=True, help="output directory")
    t.add_argument("--family", choices=["qwen2_vl", "qwen2_5_vl"], default="qwen2_vl")
    t.add_argument("--size", choices=["tiny", "shape_true", "shape_true_7b"], default="tiny",
                   help="tiny (~1M params) or shape_true (Qwen2-VL-2B / Qwen2.5-VL-3B dimensions; ~9 GB in fp32) or "
                   "shape_true_7b (Qwen2.5-VL-7B dimensions; with --config-only)")
    t.add_argument("--config-only", action="store_true",
                   help="write config.json only, no weights (enough for mmgpg plan and mmgpg model info)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                   help="saved dtype (default float32 for tiny, bfloat16 for shape_true)")
    t.set_defaults(func=cmd_model_tiny)
    i = msub.add_parser("info", help="print a model's family, sizes, parameter counts and EOS ids",
                        description="Print a model's family, sizes, parameter counts and EOS ids without loading "
                        "its weights.")
    i.add_argument("model", help="hub id, local directory, or tiny / tiny:qwen2_5_vl")
    i.set_defaults(func=cmd_model_info)

    p = sub.add_parser("config", help="show the resolved configuration", description="Inspect configuration.")
    csub = p.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    s = csub.add_parser("show", help="print the resolved config as YAML",
                        description="Resolve groups and overrides exactly as a run would and print the result as YAML.")
    _add_config_args(s)
    s.add_argument("--doc", action="store_true", help="put each field's documentation above it as a comment")
    s.set_defaults(func=cmd_config_show)
    g = csub.add_parser("groups", help="list the config groups and their choices",
                        description="List the config groups (configs/<group>/<name>.yaml) and their choices.")
    g.add_argument("--config-dir", action="append", default=[], metavar="DIR")
    g.set_defaults(func=cmd_config_groups)

    p = sub.add_parser("tasks", help="list the installed task plugins",
                       description="List the task plugins registered under the entry-point group mmgpg.tasks.")
    p.set_defaults(func=cmd_tasks)

    from mmgpg.cli import eval as eval_cli
    from mmgpg.cli import theory as theory_cli

    eval_cli.add_parsers(sub, _add_config_args)
    theory_cli.add_parsers(sub, _add_config_args)
    from mmgpg.rollout.vllm_server import add_parser as add_vllm_serve

    add_vllm_serve(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    # Overrides may come before or after options (`mmgpg sample --prompts 4 task=shapes model=tiny`).
    args, extra = parser.parse_known_args(argv)
    if extra:
        if not hasattr(args, "overrides") or any(a.startswith("-") or "=" not in a for a in extra):
            parser.error("unrecognized arguments: " + " ".join(extra))
        args.overrides = [*args.overrides, *extra]
    try:
        return _run(args)
    finally:
        if argv is None:  # a real process (console script, python -m mmgpg): the work is done or given up, so a
            # late Ctrl-C during interpreter shutdown must not print a KeyboardInterrupt traceback
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def _run(args) -> int:
    from mmgpg.task import TaskNotFound
    from mmgpg.typed import ConfigError

    try:
        for folder in getattr(args, "config_dir", None) or []:
            if not Path(folder).is_dir():
                raise FileNotFoundError(f"--config-dir {folder!r} is not a directory; give a folder holding base.yaml "
                                        "and/or group folders (task/, model/, algo/)")
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        if args.debug:
            raise
        print(f"mmgpg {args.command}: interrupted (a run continues from its last checkpoint with "
              "train.resume=true)", file=sys.stderr)
        return 130
    except Exception as err:
        message = None if args.debug else user_error(err, (ConfigError, TaskNotFound))
        if message is None:  # a bug, or --debug: the full traceback
            raise
        print(f"mmgpg {args.command}: {message}", file=sys.stderr)
        return 2


def user_error(err: BaseException, known: tuple[type, ...]) -> str | None:
    """The one-message form of an error caused by input (config, files, data, disk), or None for a bug."""
    import errno

    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        where = f" writing {err.filename}" if err.filename else ""
        return f"no space left on device{where}. Free space and run again (train.resume=true continues a run)."
    if isinstance(err, (*known, ValueError, OSError)):  # bad values, files, permissions, an unreachable hub
        return str(err)
    return None


if __name__ == "__main__":
    raise SystemExit(main())
