"""Where one GPG step's time goes: mmgpg's step of ``bench/trl_peer.py`` (same model, task, settings:
:func:`trl_peer.mmgpg_overrides`), profiled on the CPU, by phase and by function.

    python bench/profile_step.py                        # 2 warm-up steps, then 3 profiled steps
    python bench/profile_step.py --steps 5 --out bench/results/profile_step.md

Three views of the same profiled steps:

* **phases** — wall time of the trainer's phases (rollout, advantages, update; the update includes the optimizer
  step), from ``torch.profiler.record_function`` ranges around the trainer's own methods;
* **torch operators** — ``torch.profiler`` (CPU activity) operators by self CPU time: which kernels dominate;
* **Python functions** — ``cProfile`` over the same steps, by cumulative and by own time: where the Python-side
  overhead is (data drawing, image processing, generate's per-token loop, collation, logging).

The share of each row is what to read; absolute times depend on the machine and its load (printed beside them).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trl_peer import mmgpg_overrides  # noqa: E402

PHASES = ("rollout", "advantages", "update")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=3, help="profiled steps (after --warmup)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--top", type=int, default=20, help="rows per table")
    ap.add_argument("--out", help="also write the report (markdown) here")
    a = ap.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from mmgpg.config import resolve
    from mmgpg.models.tiny import build_and_save
    from mmgpg.train.trainer import Trainer

    torch.set_num_threads(a.threads)
    total = a.warmup + a.steps
    with tempfile.TemporaryDirectory() as tmp:
        a.model = str(build_and_save(Path(tmp) / "tiny", family="qwen2_vl"))
        a.num_prompts, a.steps_total = total * a.prompts, total
        ns = argparse.Namespace(**{**vars(a), "steps": total})
        trainer = Trainer(resolve(mmgpg_overrides(ns, Path(tmp) / "run")))
        for phase in PHASES:  # record_function ranges around the trainer's own phase methods
            method = getattr(trainer, phase)

            def timed(*args, _method=method, _name=phase, **kwargs):
                with record_function(f"phase/{_name}"):
                    return _method(*args, **kwargs)

            setattr(trainer, phase, timed)
        for _ in range(a.warmup):
            trainer.train_step()
        python = cProfile.Profile()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            python.enable()
            t0 = time.perf_counter()  # inside the profiler: its start-up and shut-down are not step time
            for _ in range(a.steps):
                trainer.train_step()
            wall = time.perf_counter() - t0
            python.disable()

    events = prof.key_averages()
    phases = {e.key.split("/", 1)[1]: e.cpu_time_total / 1e6 for e in events if e.key.startswith("phase/")}
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    out = [f"# One GPG step, profiled ({a.steps} steps after {a.warmup} warm-up; P={a.prompts} x G={a.group_size}, "
           f"{a.max_new_tokens} new tokens, tiny Qwen2-VL, float32, {torch.get_num_threads()} torch threads)", "",
           f"Wall time of the profiled steps: {wall:.2f} s ({wall / a.steps:.2f} s/step, profiler overhead included); "
           f"load average at the end {load}.", "", "## Phases", "", "| phase | s | share of the steps |", "|---|---:|---:|"]
    out += [f"| {p} | {phases.get(p, 0.0):.2f} | {phases.get(p, 0.0) / wall:.1%} |" for p in PHASES]
    out += ["", "## torch operators by self CPU time", "", "| operator | calls | self CPU s | share |",
            "|---|---:|---:|---:|"]
    ops = sorted((e for e in events if not e.key.startswith("phase/")), key=lambda e: e.self_cpu_time_total,
                 reverse=True)
    self_total = sum(e.self_cpu_time_total for e in ops) or 1
    out += [f"| `{e.key}` | {e.count} | {e.self_cpu_time_total / 1e6:.3f} | {e.self_cpu_time_total / self_total:.1%} |"
            for e in ops[: a.top]]
    for order, title in (("cumulative", "cumulative time"), ("tottime", "own time")):
        buf = io.StringIO()
        pstats.Stats(python, stream=buf).strip_dirs().sort_stats(order).print_stats(a.top)
        out += ["", f"## Python functions by {title} (cProfile)", "", "```", buf.getvalue().strip(), "```"]
    text = "\n".join(out)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
