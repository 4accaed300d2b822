"""The read-only commands: ``mmgpg check``, ``plot``, ``model tiny|info``, ``config show|groups`` and ``tasks``."""

from __future__ import annotations

import json
import sys
import time

from mmgpg.cli.common import add_config_args, int_in, resolve_args, seed_flag
from mmgpg.cli.plan import add_hardware_args
from mmgpg.models import DTYPES, FAMILIES


def cmd_check(args) -> int:
    from mmgpg.config import resolve
    from mmgpg.evaluation.preflight import preflight
    from mmgpg.utils import console

    resolved = resolve(list(args.overrides), config_dirs=args.config_dir)
    cfg = resolved.config
    findings = preflight(cfg, split=args.split, examples=args.examples, task=resolved.task)
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


def cmd_model_tiny(args) -> int:
    from mmgpg.models.tiny import build_and_save, count_parameters

    if args.config_only:
        from mmgpg.models.tiny import save_config_only

        print(f"wrote {save_config_only(args.out, family=args.family, size=args.size, seed=args.seed)}/config.json")
        return 0
    t0 = time.perf_counter()
    out = build_and_save(args.out, family=args.family, size=args.size, seed=args.seed, dtype=args.dtype)
    from mmgpg.models.load import auto_model_class, no_remote_code

    model = no_remote_code(auto_model_class(args.family).from_pretrained, out)  # what loading will use: it must read the folder
    counts = count_parameters(model)
    split = (f"{counts['vision']:,} vision, {counts['language']:,} language" if counts["vision"]
             else "text-only")
    print(f"built {args.size} {args.family} in {out} ({time.perf_counter() - t0:.1f} s): "
          f"{counts['total']:,} parameters ({split}), vocab {model.config.get_text_config().vocab_size:,}")
    return 0


def cmd_model_info(args) -> int:
    import torch
    from transformers import GenerationConfig

    from mmgpg.backends.model_shape import vision_dims
    from mmgpg.models.load import (
        auto_model_class,
        check_model_source,
        no_remote_code,
        policy_class,
        read_model_config,
        resolve_model_path,
    )
    from mmgpg.models.tiny import count_parameters

    path = resolve_model_path(args.model)
    check_model_source(path, need_weights=False)
    config = read_model_config(path)
    with torch.device("meta"):
        model = no_remote_code(auto_model_class(config.model_type, repr(args.model)).from_config, config)
    counts = count_parameters(model)
    text, vision = config.get_text_config(), getattr(config, "vision_config", None)
    try:
        eos = GenerationConfig.from_pretrained(path).eos_token_id
    except OSError:
        eos = text.eos_token_id
    info = {
        "path": path,
        "model_type": config.model_type,
        "policy": policy_class(config.model_type).__name__,
        "parameters": counts if vision is not None else {"total": counts["total"]},
        "vocab_size": text.vocab_size,
        "hidden_size": text.hidden_size,
        "layers": text.num_hidden_layers,
        **({"vision_depth": vision_dims(vision)[0]} if vision is not None else {}),
        "eos_token_ids": eos,
        **({"image_token_id": getattr(config, "image_token_id", getattr(config, "image_token_index", None))}
           if vision is not None else {}),
    }
    print(json.dumps(info, indent=2))
    return 0


def cmd_config_show(args) -> int:
    from mmgpg.config import to_yaml

    resolved = resolve_args(args)
    sys.stdout.write(to_yaml(resolved.config, with_docs=args.doc))
    return 0


def cmd_config_groups(args) -> int:
    from mmgpg.config import available_groups, config_search_path

    for group, names in available_groups(config_search_path(args.config_dir)).items():
        print(f"{group}: {' '.join(names)}")
    return 0


def cmd_tasks(args) -> int:
    from rich.table import Table

    from mmgpg.task import TASKS, TaskNotFound, build_task
    from mmgpg.typed import ConfigError
    from mmgpg.utils import console

    table = Table(title="mmgpg tasks (entry points: mmgpg.tasks)")
    for col in ("name", "version", "rewards", "provided by", "description"):
        table.add_column(col)
    for name in sorted(TASKS):
        try:
            task = build_task(name)
            doc = (type(task).__doc__ or "").strip().splitlines()[0] if type(task).__doc__ else ""
            table.add_row(name, str(task.version), ", ".join(task.rewards), TASKS.describe(name), doc)
        except (TaskNotFound, ConfigError, TypeError, ValueError) as err:
            table.add_row(name, "?", "?", TASKS.describe(name), f"[red]cannot load: {err}[/red]")
    console().print(table)
    print("A task in a local file: task=path/to/file.py:ClassName")
    return 0


def register(sub) -> None:
    p = sub.add_parser("check", help="pre-flight: data, image-token budgets and every reward/judge on probe answers",
                       description="Load a few examples of the task, check each prompt's length (image tokens "
                       "included) against model.max_prompt_length, and run every reward and the judge (both "
                       "protocols) on an empty, a garbage and the gold answer. Exit status 1 when an error is found.")
    p.add_argument("--split", default="train")
    p.add_argument("--examples", type=int_in(1, 10_000), default=4, help="examples to load and check (1-10,000)")
    add_config_args(p)
    add_hardware_args(p, required=False)  # with --gpus and --gpu-memory-gb: also the memory plan (mmgpg plan)
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("plot", help="PNG plots of a run's metrics (reward, valid fraction, alpha, evaluation)",
                       description="Write PNG plots of RUN_DIR/metrics.jsonl to RUN_DIR/plots (or --out).")
    p.add_argument("run_dir")
    p.add_argument("--out", default=None)
    p.set_defaults(func=cmd_plot)

    p = sub.add_parser("model", help="build or inspect models", description="Build or inspect models.")
    msub = p.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    t = msub.add_parser("tiny", help="build a model of any family offline (random init, real classes)",
                        description="Build a randomly initialised model of a registered family with a tokenizer and "
                        "processor made locally, and save it as a Hugging Face directory that AutoProcessor and "
                        "AutoModelForImageTextToText load (a text family: AutoTokenizer and AutoModelForCausalLM). "
                        "--size shape_true uses a released checkpoint's dimensions (Qwen2-VL-2B / Qwen2.5-VL-3B; "
                        "qwen2: DeepSeek-R1-Distill-Qwen-1.5B; qwen3_vl: Qwen3-VL-2B; qwen3: Qwen3-1.7B) for memory and "
                        "speed measurements, shape_true_7b Qwen2.5-VL-7B's (qwen2: Qwen2.5-Math-7B), shape_true_4b / "
                        "shape_true_8b Qwen3-VL-4B / 8B's (qwen3: Qwen3-4B / 8B); the sizes each family has are its "
                        "Family.sizes.")
    t.add_argument("--out", required=True, help="output directory")
    t.add_argument("--family", choices=list(FAMILIES), default="qwen2_vl", help="a model_type (default qwen2_vl)")
    t.add_argument("--size", choices=["tiny", "shape_true", "shape_true_4b", "shape_true_7b", "shape_true_8b"],
                   default="tiny", help="tiny (~1M params; every family) or shape_true* (a released checkpoint's "
                   "dimensions, where the family has them; the large ones with --config-only)")
    t.add_argument("--config-only", action="store_true",
                   help="write config.json only, no weights (enough for mmgpg plan and mmgpg model info)")
    t.add_argument("--seed", type=seed_flag, default=0)
    t.add_argument("--dtype", choices=DTYPES[1:], default=None,
                   help="saved dtype (default float32 for tiny, bfloat16 for shape_true)")
    t.set_defaults(func=cmd_model_tiny)
    i = msub.add_parser("info", help="print a model's family, sizes, parameter counts and EOS ids",
                        description="Print a model's family, sizes, parameter counts and EOS ids without loading "
                        "its weights.")
    i.add_argument("model", help="hub id, local directory, or tiny / tiny:<family> (tiny:qwen3_vl, tiny:qwen2, ...)")
    i.set_defaults(func=cmd_model_info)

    p = sub.add_parser("config", help="show the resolved configuration", description="Inspect configuration.")
    csub = p.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    s = csub.add_parser("show", help="print the resolved config as YAML",
                        description="Resolve groups and overrides exactly as a run would and print the result as YAML.")
    add_config_args(s)
    s.add_argument("--doc", action="store_true", help="put each field's documentation above it as a comment")
    s.set_defaults(func=cmd_config_show)
    g = csub.add_parser("groups", help="list the config groups and their choices",
                        description="List the config groups (configs/<group>/<name>.yaml) and their choices.")
    g.add_argument("--config-dir", action="append", default=[], metavar="DIR")
    g.set_defaults(func=cmd_config_groups)

    p = sub.add_parser("tasks", help="list the installed task plugins",
                       description="List the task plugins registered under the entry-point group mmgpg.tasks.")
    p.set_defaults(func=cmd_tasks)
