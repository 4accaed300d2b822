"""The training progress bar: step, reward, valid fraction, α and s/step (rank 0 only)."""

from __future__ import annotations

from typing import Any


class TrainProgress:
    """A rich progress bar with step, reward, valid fraction, α and s/step (rank 0 only)."""

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
        alpha = "-" if m["gpg/alpha"] is None else f"{m['gpg/alpha']:.2f}"
        info = (f"reward {m['reward/total']:.3f}  valid {m['gpg/valid_fraction']:.2f}  α {alpha}  "
                f"{m['time/step']:.2f} s/step")
        self.bar.update(self.task, completed=m["step"], info=info)

    def note(self, text: str) -> None:
        if self.bar is not None:
            self.bar.console.print(text)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
