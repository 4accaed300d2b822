"""``mmgpg train``, ``mmgpg sft`` and ``mmgpg demo``: the training commands."""

from __future__ import annotations

import json

from mmgpg.cli.common import add_config_args, int_in, resolve_args, seed_flag


def cmd_train(args) -> int:
    from mmgpg.train.trainer import Trainer

    trainer = Trainer(resolve_args(args))
    run_dir = trainer.train()
    if trainer.dist.is_main:
        print(f"run directory: {run_dir} (metrics.jsonl, prompt_success.jsonl, checkpoints/, tensorboard/)")
    return 0


def cmd_sft(args) -> int:
    from mmgpg.train.sft import SFTTrainer

    trainer = SFTTrainer(resolve_args(args))
    final = trainer.train(progress=lambda m: print(json.dumps(m), flush=True))
    print(f"fine-tuned model: {final}")
    return 0


def cmd_demo(args) -> int:
    from mmgpg.train.demo import check_demo_model, demo_settings, run_demo
    from mmgpg.utils import console

    settings = demo_settings(args.text, args.tools, args.video, output=args.output or "", seed=args.seed, sft_steps=args.sft_steps,
                             gpg_steps=args.gpg_steps, eval_limit=args.eval_limit, eval_every=args.eval_every,
                             prompts_per_step=args.prompts_per_step, algo=args.algo, threads=args.threads,
                             sft_lr=args.sft_lr, gpg_lr=args.lr, lr_scheduler=args.lr_scheduler,
                             overrides=tuple(args.set), rl_overrides=tuple(args.rl_set), model=args.model,
                             sft_from=args.sft_from or "")
    check_demo_model(settings.model, settings.text)  # before anything is built
    if args.quick:
        settings.sft_steps, settings.gpg_steps, settings.eval_limit, settings.eval_every = 4, 2, 8, 1
        settings.eval_samples = 2
        settings.prompts_per_step, settings.max_resample_attempts = 2, 2
    run_demo(settings, console())
    return 0


def register(sub) -> None:
    p = sub.add_parser("train", help="train a policy with GPG, GRPO or a variant (algo=...)",
                       description="Train the policy on the task with the algorithm of the config (algo=gpg by "
                       "default). Writes config.yaml, metrics.jsonl, prompt_success.jsonl, TensorBoard logs and "
                       "checkpoints/ to output_dir. Runs under torchrun for several processes (gloo on CPU, nccl on "
                       "GPU). Example: mmgpg train algo=gpg task=shapes model=tiny train.max_steps=20")
    add_config_args(p)
    p.set_defaults(func=cmd_train)

    from mmgpg.train.demo import DEMOS, DemoSettings

    d = DemoSettings()

    def default(name: str) -> str:
        """The help text's default: the VL demo's value, and each other demo's where it differs."""
        others = "".join(f"; --{kind}: {demo.defaults[name]}" for kind, demo in DEMOS.items() if name in demo.defaults)
        return f"default {getattr(d, name)}{others}"

    p = sub.add_parser("demo", help="offline CPU demo: tiny Qwen2-VL, SFT warm start, GPG, before/after + plots",
                       description="Build a tiny Qwen2-VL offline, warm-start it with SFT on the embedded shapes task, "
                       "evaluate it, train it with GPG, evaluate again, print a before/after table and write PNG "
                       "plots. About 8 minutes on 2 CPU cores with the defaults; --quick runs a seconds-long version. "
                       "--text runs the same stages on the tiny text-only Qwen2 and the arith task (add two numbers); "
                       "--tools on shapes_zoom, whose episodes call a zoom tool; --video on 2-frame clips of "
                       "moving_shapes.")
    p.add_argument("--text", action="store_true",
                   help="the text demo: model=tiny_qwen2 (text-only Qwen2) on task=arith instead of Qwen2-VL on shapes")
    p.add_argument("--tools", action="store_true",
                   help="the tools demo: episodes with the zoom tool on task=shapes_zoom (the colour of a mark the "
                   "full view cannot resolve); half the SFT gold episodes zoom, RL has to find out that it pays")
    p.add_argument("--video", action="store_true",
                   help="the video demo: task=moving_shapes with task.kind=total (how many shapes a 2-frame clip "
                   "shows, each shape in one frame only) on the tiny Qwen2.5-VL (--model qwen3_vl: Qwen3-VL)")
    p.add_argument("--output", help="run directory (default runs/demo-<time>)")
    p.add_argument("--model", metavar="FAMILY",
                   help="the tiny model's family, e.g. qwen3_vl (or qwen3 with --text); default Qwen2-VL (Qwen2; "
                   "--video: Qwen2.5-VL)")
    p.add_argument("--seed", type=seed_flag, default=d.seed)
    p.add_argument("--sft-steps", type=int, help=default("sft_steps"))
    p.add_argument("--gpg-steps", type=int, help="RL steps (" + default("gpg_steps") + ")")
    p.add_argument("--prompts-per-step", type=int, help=default("prompts_per_step"))
    p.add_argument("--eval-limit", type=int, help="test items per evaluation (" + default("eval_limit") + ")")
    p.add_argument("--eval-every", type=int, help=default("eval_every"))
    p.add_argument("--algo", default=d.algo, help="any configs/algo/ name (default gpg)")
    p.add_argument("--threads", type=int_in(0, 4096), default=d.threads,
                   help="torch threads (default 1: the seeds' numbers in docs/demo.md were measured so, and a "
                   "seed's numbers change with the thread count; 0: torch's default)")
    p.add_argument("--sft-lr", type=float, help=default("sft_lr"))
    p.add_argument("--lr", type=float, help="RL learning rate (" + default("gpg_lr") + ")")
    p.add_argument("--lr-scheduler", choices=["constant", "linear", "cosine"],
                   help="RL learning-rate schedule (" + default("lr_scheduler") + ")")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="extra config override for SFT and RL, e.g. --set task.format_reward=false (repeatable)")
    p.add_argument("--rl-set", action="append", default=[], metavar="KEY=VALUE",
                   help="config override for the RL stage only, e.g. --rl-set model.lora.rank=8 (repeatable)")
    p.add_argument("--sft-from", metavar="DIR", help="start the RL stage from this SFT policy (a previous demo's "
                   "sft/checkpoints/step-N/policy, same seed and settings), skipping the SFT stage")
    p.add_argument("--quick", action="store_true", help="a seconds-long smoke version (tiny budgets)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("sft", help="supervised fine-tuning on the task's gold answers (the +SFT baseline)",
                       description="Fine-tune the policy on the task's gold completions (sft.* fields); writes "
                       "metrics.jsonl and final/ (a Hugging Face directory) to output_dir.")
    add_config_args(p)
    p.set_defaults(func=cmd_sft)
