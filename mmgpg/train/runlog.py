"""What a training run writes as it goes (rank 0 only): ``metrics.jsonl`` (one JSON object per step), TensorBoard
scalars (``train.tensorboard``), Weights & Biases (``train.wandb``) and a progress bar (``train.progress``)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


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
        self.progress = _Progress(total_steps or t.max_steps, start_step, enabled=progress and is_main)
        if not is_main:
            return
        if (t.tensorboard if tensorboard is None else tensorboard):
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(self.run_dir / "tensorboard"), purge_step=start_step + 1)
        if t.wandb if use_wandb is None else use_wandb:
            import wandb

            from mmgpg.config import to_dict

            self.wandb = wandb.init(project=cfg.train.wandb_project, dir=str(self.run_dir), config=to_dict(cfg),
                                    resume="allow")

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


class _Progress:
    """A rich progress bar with step, reward, valid fraction, α and s/step."""

    def __init__(self, total: int, start: int, enabled: bool):
        self.bar = None
        if not enabled:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.bar = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                            TimeRemainingColumn())
        self.task = self.bar.add_task("train", total=total, completed=start, info="")
        self.bar.start()

    def update(self, m: dict[str, Any]) -> None:
        if self.bar is None:
            return
        alpha = "-" if m.get("gpg/alpha") is None else f"{m['gpg/alpha']:.2f}"
        peak = max((v for k, v in m.items() if k.startswith("memory/") and k.endswith("_rss_mib")), default=None)
        cuda = max((v for k, v in m.items() if k.startswith("memory/") and k.endswith("_cuda_allocated_mib")),
                   default=None)
        memory = "" if peak is None else f"  rss {peak / 1024:.1f} GiB" + ("" if cuda is None else f"  gpu {cuda / 1024:.1f} GiB")
        info = (f"reward {m['reward/total']:.3f}  valid {m['gpg/valid_fraction']:.2f}  α {alpha}  "
                f"{m['time/step']:.2f} s/step{memory}")
        self.bar.update(self.task, completed=m["step"], info=info)

    def note(self, text: str) -> None:
        if self.bar is not None:
            self.bar.console.print(text)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
