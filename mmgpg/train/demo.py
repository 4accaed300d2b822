"""``mmgpg demo``: the whole pipeline offline on CPU — a tiny Qwen2-VL is built, warm-started with SFT on the
embedded ``shapes`` task, evaluated, trained with GPG, evaluated again; a before/after table and PNG plots.

``mmgpg demo --text`` does the same with the tiny text-only Qwen2 (``model=tiny_qwen2``) on the embedded ``arith``
task (add two numbers of 0–99; test pairs never occur in training), with its own defaults (:data:`TEXT_DEFAULTS`).

Every stage is the real one (``mmgpg sft``, ``mmgpg train``, greedy and sampled evaluation through the task's judge
or rewards); the demo only chooses settings that fit a few minutes on 2 CPU cores. The defaults were chosen by the
runs recorded in ``docs/demo.md``.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class DemoSettings:
    output: str = ""
    """Run directory (default runs/demo-<time>)."""
    seed: int = 0
    sft_steps: int = 200
    sft_lr: float = 1e-3
    gpg_steps: int = 400
    gpg_lr: float = 2e-4
    lr_scheduler: str = "linear"
    """RL learning-rate schedule (linear decay to 0, as the anchors' TRL runs; constant was less stable)."""
    prompts_per_step: int = 16
    group_size: int = 8
    eval_limit: int = 300
    eval_every: int = 100
    eval_samples: int = 8
    algo: str = "gpg"
    max_resample_attempts: int = 20
    threads: int = 1
    """torch threads (0: torch's default). One by default: a float sum's order depends on the thread count, so a
    seed's numbers are the documented ones (docs/demo.md) only at the count they were measured with."""
    overrides: tuple[str, ...] = ()
    """Extra KEY=VALUE config overrides applied to both SFT and RL (e.g. task.format_reward=false)."""
    rl_overrides: tuple[str, ...] = ()
    """Overrides for the RL stage only (e.g. model.lora.rank=8: LoRA on the SFT-warm-started model)."""
    sft_from: str = ""
    """Start the RL stage from this SFT policy (a previous demo's ``sft/checkpoints/step-N/policy`` of the same seed
    and settings), skipping stage 1: RL variants of one warm start (e.g. bench/async_rollout.py)."""
    text: bool = False
    """The text demo: model=tiny_qwen2 on task=arith instead of model=tiny on task=shapes."""
    tools: bool = False
    """The tools demo: model=tiny on task=shapes_zoom (episodes with the zoom tool) instead of task=shapes."""
    video: bool = False
    """The video demo: the tiny Qwen2.5-VL (``model`` changes it) on task=moving_shapes (kind=total, 2 frames: count
    the shapes a clip shows over its frames)."""
    model: str = ""
    """The tiny model's family (``model.name_or_path=tiny:<model>``: e.g. qwen3_vl, or qwen3 with ``text``); empty:
    Qwen2-VL (the text demo: Qwen2). The settings are the Qwen2 demos'; docs/demo.md has the runs of each."""


# What each demo trains on: (task, model, max new tokens, what an evaluation item is, chance accuracy).
VL_SETUP = ("shapes", "tiny", 32, "test images", "chance is 0.20")
TEXT_SETUP = ("arith", "tiny_qwen2", 48, "test sums", "a random model scores 0; a uniform guess of 0-198 would be 0.005")

TEXT_DEFAULTS: dict[str, object] = dict(sft_steps=300, gpg_steps=150, eval_every=50)
"""The text demo's settings where they differ from the VL demo's (chosen by the runs in docs/demo.md)."""
TOOLS_SETUP = ("shapes_zoom", "tiny", 80, "test images", "chance is 0.25 without a zoom")
TOOLS_TASK = ("task.describe_tools=false", "task.gold_zoom_share=0.5")
"""The tools demo's task: half the gold episodes zoom (the rest guess at once), and no tools block in the prompt
(SFT teaches the call; the block would be ~600 tokens of the tiny model's character-level vocabulary)."""
TOOLS_DEFAULTS: dict[str, object] = dict(sft_steps=400, sft_lr=2e-3, gpg_steps=60, eval_every=20, eval_limit=100,
                                         eval_samples=4)
"""The tools demo's settings where they differ from the VL demo's (chosen by the runs in docs/demo.md)."""
VIDEO_SETUP = ("moving_shapes", "tiny", 32, "test clips", "chance is 0.20")
VIDEO_TASK = ("task.kind=total", "task.frames=2")
"""The video demo's task: count the shapes of a 2-frame clip, each shape shown in one of the frames (the two frames
make one temporal patch; with 4 frames, two patches, the tiny models' SFT stays at chance: docs/demo.md)."""
VIDEO_DEFAULTS: dict[str, object] = dict(gpg_steps=200, eval_every=50, model="qwen2_5_vl")
"""The video demo's settings where they differ from the VL demo's (chosen by the runs in docs/demo.md)."""


@dataclass(frozen=True)
class Demo:
    """One demo: its ``setup`` (task, model, max new tokens, what an evaluation item is, chance accuracy), the task
    options it adds, and its settings where they differ from the VL demo's."""

    setup: tuple[str, str, int, str, str]
    task_options: tuple[str, ...] = ()
    defaults: dict[str, object] = field(default_factory=dict)


DEMOS = {"vl": Demo(VL_SETUP), "text": Demo(TEXT_SETUP, (), TEXT_DEFAULTS),
         "tools": Demo(TOOLS_SETUP, TOOLS_TASK, TOOLS_DEFAULTS), "video": Demo(VIDEO_SETUP, VIDEO_TASK, VIDEO_DEFAULTS)}
"""The demos by their flag (``vl``: no flag)."""


def demo_kind(text: bool = False, tools: bool = False, video: bool = False) -> str:
    """The :data:`DEMOS` key of the flags given (at most one)."""
    if text + tools + video > 1:
        raise ValueError("--text, --tools and --video are different demos; choose one")
    return "text" if text else "tools" if tools else "video" if video else "vl"


def demo_settings(text: bool = False, tools: bool = False, video: bool = False, **given) -> DemoSettings:
    """The demo's settings: the defaults of the VL demo, or with ``text`` those of the text demo
    (:data:`TEXT_DEFAULTS`), with ``tools`` those of the tools demo (:data:`TOOLS_DEFAULTS`), with ``video`` those of
    the video demo (:data:`VIDEO_DEFAULTS`), then every value in ``given`` that is not None."""
    defaults = DEMOS[demo_kind(text, tools, video)].defaults
    base = {**defaults, **{k: v for k, v in given.items() if v is not None}}
    return DemoSettings(text=text, tools=tools, video=video, **base)


def check_demo_model(model: str, text: bool) -> None:
    """A ``--model`` the demo can build: a registered family that takes images (the VL demo) or a text-only one
    (``--text``); anything else is a ValueError naming the choices."""
    if not model:
        return
    from mmgpg.models import FAMILIES

    choices = [n for n in FAMILIES if FAMILIES[n].takes_images != text]
    if model not in choices:
        kind = "text-only" if text else "vision-language"
        raise ValueError(f"--model {model!r}: the {'text ' if text else ''}demo needs a {kind} model family; choose "
                         "one of " + ", ".join(choices))


def run_demo(s: DemoSettings, console=None) -> dict:
    import torch

    from mmgpg.config import resolve
    from mmgpg.jsonl import write_text_atomic
    from mmgpg.rundir import read_metrics, run_dir_path
    from mmgpg.train.plots import plot_run
    from mmgpg.train.sft import SFTTrainer
    from mmgpg.train.trainer import Trainer

    check_demo_model(s.model, s.text)
    if s.threads:
        torch.set_num_threads(s.threads)
    say = console.print if console is not None else print
    out = run_dir_path(s.output or "", "demo")
    demo = DEMOS[demo_kind(s.text, s.tools, s.video)]
    task, model, max_new_tokens, items, chance = demo.setup
    common = [f"task={task}", *demo.task_options, f"model={model}", f"seed={s.seed}", f"rollout.max_new_tokens={max_new_tokens}", "device=cpu",
              f"train.eval_limit={s.eval_limit}", f"task.num_test={max(s.eval_limit, 1)}",
              *([f"model.name_or_path=tiny:{s.model}"] if s.model else []), *s.overrides]
    t0 = time.perf_counter()

    if s.sft_from:
        if not (Path(s.sft_from) / "config.json").is_file():
            raise FileNotFoundError(f"--sft-from {s.sft_from}: not a saved policy (no config.json); give a demo's "
                                    "sft/checkpoints/step-N/policy folder")
        say(f"[bold]1/3 SFT warm start[/bold]: skipped, from {s.sft_from}")
        final = s.sft_from
    else:
        say(f"[bold]1/3 SFT warm start[/bold]: {s.sft_steps} steps of 32 gold answers, lr {s.sft_lr}")
        sft = SFTTrainer(resolve(common + [f"sft.max_steps={s.sft_steps}", "sft.batch_size=32",
                                           f"sft.learning_rate={s.sft_lr}", f"output_dir={out / 'sft'}"]))
        every = max(1, s.sft_steps // 4)
        final = sft.train(progress=lambda m: say(f"  sft step {m['step']:4d}  loss {m['loss/sft']:.3f}")
                          if m["step"] % every == 0 else None)
    t_sft = time.perf_counter() - t0

    say(f"[bold]2/3 {s.algo.upper()}[/bold]: {s.gpg_steps} steps x {s.prompts_per_step} prompts x G={s.group_size}, "
        f"lr {s.gpg_lr} ({s.lr_scheduler}), evaluation on {s.eval_limit} {items} every {s.eval_every} steps")
    trainer = Trainer(resolve(common + [
        f"algo={s.algo}", f"model.name_or_path={final}", "model.dtype=float32", f"train.max_steps={s.gpg_steps}",
        f"train.prompts_per_step={s.prompts_per_step}", f"train.micro_batch_prompts={s.prompts_per_step}",
        f"rollout.group_size={s.group_size}", f"train.learning_rate={s.gpg_lr}", f"train.lr_scheduler={s.lr_scheduler}", f"train.eval_every={s.eval_every}", f"train.eval_samples={s.eval_samples}",
        f"algo.max_resample_attempts={s.max_resample_attempts}", "train.tensorboard=false",
        f"output_dir={out / 'gpg'}", *s.rl_overrides]))
    trainer.train()
    t_gpg = time.perf_counter() - t0 - t_sft

    rows = read_metrics(out / "gpg")
    evals = [r for r in rows if "eval/accuracy" in r]
    before, after = evals[0], evals[-1]
    plots = plot_run(out / "gpg", out / "plots")
    sampled = "eval/sampled_accuracy" in before
    summary = {
        "settings": asdict(s), "output": str(out),
        "accuracy_before": before["eval/accuracy"], "accuracy_after": after["eval/accuracy"],
        "format_before": _format(before), "format_after": _format(after),
        **({f"{kind}useful_zoom_{when}": r.get(f"eval/{kind}useful_zoom") for kind in ("", "sampled_")
            for when, r in (("before", before), ("after", after))} if s.tools else {}),
        "sampled_accuracy_before": before.get("eval/sampled_accuracy"),
        "sampled_accuracy_after": after.get("eval/sampled_accuracy"),
        "eval_samples": before.get("eval/num_samples"), "eval_curve": [(r["step"], r["eval/accuracy"]) for r in evals],
        "seconds_sft": t_sft, "seconds_rl": t_gpg, "plots": [str(p) for p in plots],
    }
    write_text_atomic(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    say("[bold]3/3 result[/bold] (greedy, test split, "
        f"{int(before.get('eval/num_samples', 0))} {items.split()[-1]}; {chance})")
    second, read = ("useful zoom", lambda r: r.get("eval/useful_zoom")) if s.tools else ("format", _format)

    extra = [f"sampled accuracy (mean of {s.eval_samples}, T=1)"] if sampled else []
    extra += ["sampled useful zoom"] if sampled and s.tools else []

    def row(name: str, r: dict) -> str:
        cells = [r["eval/accuracy"], read(r) if read(r) is not None else float("nan")]
        if sampled:
            cells.append(r["eval/sampled_accuracy"])
        if sampled and s.tools:
            cells.append(r.get("eval/sampled_useful_zoom", float("nan")))
        return f"| {name} | " + " | ".join(f"{c:.3f}" for c in cells) + " |"

    header = f"| stage | greedy accuracy | greedy {second} |" + "".join(f" {e} |" for e in extra)
    say("\n".join([header, "|---|---:|---:|" + "---:|" * len(extra),
                   row(f"after SFT (before {s.algo})", before), row(f"after {s.algo} ({s.gpg_steps} steps)", after)]))
    say(f"time: SFT {t_sft:.0f} s, {s.algo} {t_gpg:.0f} s. Plots: {out / 'plots'}; summary: {out / 'summary.json'}")
    return summary


def _format(row: dict) -> float | None:
    """The format rate of an evaluation row: ``eval/format`` for a task judged by its rewards (shapes), or
    ``eval/reward/format`` for one with a judge (arith)."""
    return row.get("eval/format", row.get("eval/reward/format"))
