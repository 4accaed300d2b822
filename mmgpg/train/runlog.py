"""What a training run writes as it goes (rank 0 only): ``metrics.jsonl`` (one JSON object per step), TensorBoard
scalars (``train.tensorboard``), Weights & Biases (``train.wandb``) and a progress bar (``train.progress``) on a
terminal, or, when stdout is not one (SLURM, nohup, a pipe: a bar would print nothing until the end), one plain status
line every ``train.status_every_s`` seconds (:class:`StatusLines`)."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

WANDB_RUN_ID = "wandb_run_id"
"""The file in the run directory that holds the run's W&B id (one line), so a resumed run continues its W&B run."""


def planned_memory(cfg, device, world_size: int, note: Callable[[str], None], data: tuple | None = None) -> dict[str, float]:
    """``mmgpg plan``'s prediction for a run of ``cfg`` on ``world_size`` ranks (per device: persistent, update,
    rollout, peak), as ``plan/*_mib`` for the first step's metrics record, where the measured ``memory/*`` of the same
    step sit beside it. On a CPU the planned figures are what one 80 GB GPU of the same setup would hold. Empty when
    the planner cannot model the run (``note`` says why in the log). ``data``: ``(task, dataset)``, whose first
    prompt's images and videos are the ones planned for (default: one image)."""
    import torch

    from mmgpg.backends import backend_fact
    from mmgpg.backends.memory import model_shape, plan_memory

    t = cfg.train
    try:
        total = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else 80 * 2**30
        stage, offload = backend_fact(t.backend, "zero_stage")(t), backend_fact(t.backend, "offload")(t)
        images, videos = media_counts(data[0].prompt(data[1][0])) if data is not None and len(data[1]) else (1, 0)
        plan = plan_memory(cfg, model_shape(cfg.model.name_or_path, cfg.model.lora), gpus=world_size,
                           gpu_memory_gb=total / 2**30, backend=t.backend, zero_stage=stage, offload=offload,
                           with_fixes=False, images_per_prompt=images, videos_per_prompt=videos)
    except (ValueError, OSError) as err:
        note(f"no memory plan for this run ({err})")
        return {}
    return {f"plan/{phase}_mib": float(b) / 2**20 for phase, b in plan.phases.items()}


def media_counts(conversation: list[dict]) -> tuple[int, int]:
    """(images, videos) in a conversation's content parts.

    >>> media_counts([{"role": "user", "content": [{"type": "video", "video": []}, {"type": "text", "text": "?"}]}])
    (0, 1)
    """
    from mmgpg.models.batch import is_image_part, is_video_part

    parts = [p for m in conversation if isinstance(m.get("content"), list) for p in m["content"]]
    return sum(map(is_image_part, parts)), sum(map(is_video_part, parts))


def saved_wandb_id(run_dir: Path, *, resuming: bool) -> str | None:
    """The W&B run id to continue: on a resume from a checkpoint (``resuming``), the one in ``run_dir/wandb_run_id``
    (written by :func:`save_wandb_id` at the first start); None for a new run, a run that starts over at step 0
    (its steps would go back, so it is a new W&B run), or when that file is missing or empty."""
    path = Path(run_dir) / WANDB_RUN_ID
    if not resuming or not path.is_file():
        return None
    return path.read_text(encoding="utf-8").strip() or None


def save_wandb_id(run_dir: Path, run_id: str) -> None:
    """Write the W&B run id to ``run_dir/wandb_run_id`` atomically (:func:`mmgpg.jsonl.write_text_atomic`)."""
    from mmgpg.jsonl import write_text_atomic

    write_text_atomic(Path(run_dir) / WANDB_RUN_ID, run_id + "\n")


def wandb_init_kwargs(project: str, run_dir: Path, config: dict[str, Any], run_id: str | None) -> dict[str, Any]:
    """``wandb.init``'s arguments, its files under ``run_dir/wandb/``: with a saved ``run_id``, that id and
    ``resume="allow"`` (continue the W&B run of that id, or create it if W&B has none); without one, a new run whose
    id W&B chooses (saved afterwards with :func:`save_wandb_id`)."""
    kwargs: dict[str, Any] = {"project": project, "dir": str(run_dir), "config": config}
    if run_id is not None:
        kwargs.update(id=run_id, resume="allow")
    return kwargs


class RunLog:
    """The one writer of a run's ``metrics.jsonl`` (``mmgpg train`` and ``mmgpg sft``). ``total_steps``,
    ``tensorboard``, ``use_wandb``, ``progress``: None takes ``train.max_steps`` / ``train.tensorboard`` / ``train.wandb`` /
    ``train.progress``."""

    def __init__(self, run_dir: Path, cfg: Any, *, start_step: int, is_main: bool, total_steps: int | None = None,
                 tensorboard: bool | None = None, use_wandb: bool | None = None, progress: bool | None = None):
        self.run_dir, self.is_main = Path(run_dir), is_main
        self.tb = self.wandb = None
        t = cfg.train
        progress = t.progress if progress is None else progress
        self.progress = _Progress(total_steps or t.max_steps, start_step, enabled=progress and is_main,
                                  status_every_s=t.status_every_s)
        if not is_main:
            return
        if (t.tensorboard if tensorboard is None else tensorboard):
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(self.run_dir / "tensorboard"), purge_step=start_step + 1)
        if t.wandb if use_wandb is None else use_wandb:
            import wandb

            from mmgpg.config import to_dict

            run_id = saved_wandb_id(self.run_dir, resuming=start_step > 0)
            self.wandb = wandb.init(**wandb_init_kwargs(t.wandb_project, self.run_dir, to_dict(cfg), run_id))
            save_wandb_id(self.run_dir, self.wandb.id)

    def log(self, metrics: dict[str, Any]) -> None:
        """One step's metrics (non-finite and non-numeric values are kept in the JSONL, skipped as scalars)."""
        if not self.is_main:
            return
        with open(self.run_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps(metrics) + "\n")
        step = metrics["step"]
        if self.tb is not None:
            for k, v in metrics.items():
                if k != "step" and isinstance(v, (int, float)) and math.isfinite(v):
                    self.tb.add_scalar(k, v, step)
        if self.wandb is not None:
            self.wandb.log(metrics, step=step)
        if "time/step" in metrics:
            self.progress.update(metrics)

    def note(self, text: str) -> None:
        if self.is_main:
            self.progress.note(text)

    def close(self) -> None:
        self.progress.close()
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


def _memory(m: dict[str, Any]) -> str:
    """The step's peak RSS (the largest ``memory/*_rss_mib``) and GPU memory, as ``rss 1.5 GiB  gpu 2.0 GiB``."""
    peak = max((v for k, v in m.items() if k.startswith("memory/") and k.endswith("_rss_mib")), default=None)
    cuda = max((v for k, v in m.items() if k.startswith("memory/") and k.endswith("_cuda_allocated_mib")), default=None)
    return ("" if peak is None else f"rss {peak / 1024:.1f} GiB"
            + ("" if cuda is None else f"  gpu {cuda / 1024:.1f} GiB"))


def _info(m: dict[str, Any]) -> str:
    """Reward, valid fraction, α (``-`` on a skipped step), the rollout correction's mean weight and ESS (when on),
    the overlap's waits (trainer for rollouts / engine for weights, with rollout.max_staleness), s/step and memory of
    one step's metrics."""
    alpha = "-" if m.get("gpg/alpha") is None else f"{m['gpg/alpha']:.2f}"
    memory = _memory(m)
    weights = (f"IS {m['rollout_is/mean']:.3f} ess {m['rollout_is/ess']:.2f}  " if "rollout_is/mean" in m else "")
    waits = (f"waits {m['time/wait_rollout']:.1f}/{m['time/wait_sync']:.1f} s  " if "time/wait_sync" in m else "")
    return (f"reward {m['reward/total']:.3f}  valid {m['gpg/valid_fraction']:.2f}  α {alpha}  {weights}{waits}"
            f"{m['time/step']:.2f} s/step" + (f"  {memory}" if memory else ""))


def _duration(seconds: float) -> str:
    """``seconds`` as ``1h02m03s`` / ``2m03s`` / ``3s``.

    >>> _duration(3723.4), _duration(123), _duration(3)
    ('1h02m03s', '2m03s', '3s')
    """
    s = int(round(seconds))
    h, m, s = s // 3600, s // 60 % 60, s % 60
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def status_line(m: dict[str, Any], total: int, elapsed_s: float, steps_done: int) -> str:
    """One plain status line for a log file: step/total, reward, valid fraction, α, the step's s/step, elapsed time,
    ETA and memory. ETA = (total - step) · elapsed_s / steps_done: the mean wall time per step since this process
    started (evaluations and saves included), times the steps left; ``-`` before any step."""
    eta = "-" if steps_done <= 0 else _duration(max(total - m["step"], 0) * elapsed_s / steps_done)
    return f"train step {m['step']}/{total}  {_info(m)}  elapsed {_duration(elapsed_s)}  ETA {eta}"


class StatusLines:
    """Print :func:`status_line` for the first step, then for the newest step once ``every_s`` seconds have passed
    since the last line, and at :meth:`close` for the last step if it has not been printed. ``clock`` (seconds,
    monotonic) and ``write`` are injectable for tests."""

    def __init__(self, total: int, start: int, every_s: float, *, clock: Callable[[], float] = time.monotonic,
                 write: Callable[[str], None] | None = None):
        self.total, self.start, self.every_s, self.clock = total, start, every_s, clock
        self.write = write or (lambda line: print(line, flush=True))
        self.t0, self.last, self.pending = clock(), None, None

    def update(self, m: dict[str, Any]) -> None:
        now = self.clock()
        self.pending = m
        if self.last is None or now - self.last >= self.every_s:
            self._emit(now)

    def _emit(self, now: float) -> None:
        m, self.pending, self.last = self.pending, None, now
        self.write(status_line(m, self.total, now - self.t0, m["step"] - self.start))

    def close(self) -> None:
        if self.pending is not None:
            self._emit(self.clock())


class _Progress:
    """On a terminal, a rich progress bar with step, reward, valid fraction, α, s/step and memory; otherwise
    :class:`StatusLines` every ``status_every_s`` seconds (0: nothing)."""

    def __init__(self, total: int, start: int, enabled: bool, status_every_s: float = 60.0):
        self.bar = self.lines = None
        if not enabled:
            return
        from rich.console import Console

        if not Console().is_terminal:
            if status_every_s > 0:
                self.lines = StatusLines(total, start, status_every_s)
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.bar = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                            TimeRemainingColumn())
        self.task = self.bar.add_task("train", total=total, completed=start, info="")
        self.bar.start()

    def update(self, m: dict[str, Any]) -> None:
        if self.lines is not None:
            self.lines.update(m)
        if self.bar is not None:
            self.bar.update(self.task, completed=m["step"], info=_info(m))

    def note(self, text: str) -> None:
        if self.bar is not None:
            self.bar.console.print(text)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if self.lines is not None:
            self.lines.close()
        if self.bar is not None:
            self.bar.stop()
