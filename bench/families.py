"""Per model family: what one training step of the tiny model costs, HF vs vLLM, in one table.

    python bench/families.py                                   # every family, the hf engine, 4 steps (1 warm-up)
    .venv-vllm/bin/python bench/families.py --engine vllm      # the families the vLLM engine serves (vLLM env)
    python bench/families.py --families qwen2_vl,qwen3_vl --out bench/results/families.md

Each family trains ``--steps`` real GRPO steps (``mmgpg train`` through :class:`mmgpg.train.trainer.Trainer`) on its
tiny model of the real transformers classes (``model.name_or_path=tiny:<family>``). GRPO, not GPG: a random tiny
model rarely earns a reward, and GPG skips a step whose groups all have zero variance, while GRPO's KL term gives every
step an update (with the reference model's forward). The vision-language families train on the embedded ``shapes``
task, the text families on ``arith``, with the same budget (4 prompts x G = 4, 24 new
tokens, fp32 weights; vLLM in the dtype the family runs in on CPU). The numbers come from the trainer's own records
of each step after the first (a warm-up: vLLM's engine start and compilation, first-call allocations):

* rollout s and completion tokens/s of the rollout phase (``time/rollout``; the step's tokens from
  ``throughput/completion_tokens_per_s``);
* update s (``time/update``: the reference's and the policy's log-probs, backward, optimizer step);
* peak RSS MiB of each phase (``memory/*_rss_mib``: the process's resident set at the phase's peak; each family runs
  in a process of its own).

Tiny models make the families' fixed costs visible (processor, vision tower, Python per token) rather than their
arithmetic; the ratio between the two engines on the same family is the number to read, not absolute times. The
machine load is printed beside the table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_family(family: str, engine: str, steps: int, workdir: Path, overrides: tuple[str, ...] = ()) -> dict:
    """``steps`` GRPO steps of ``family``'s tiny model (``overrides``: more config keys, applied last) and the
    medians of the steps after the first."""
    from mmgpg.config import resolve
    from mmgpg.models import FAMILIES
    from mmgpg.rundir import read_metrics
    from mmgpg.train.trainer import Trainer

    spec = FAMILIES[family]
    task = ["task=shapes", "model=tiny"] if spec.takes_images else ["task=arith", "model=tiny_qwen2"]
    extra = [f"rollout.vllm_dtype={spec.vllm_cpu_dtypes[0]}"] if engine == "vllm" and spec.vllm_cpu_dtypes else []
    cfg = resolve([*task, f"model.name_or_path=tiny:{family}", "algo=grpo", f"rollout.engine={engine}", *extra,
                   "rollout.group_size=4", "rollout.max_new_tokens=24", "train.prompts_per_step=4",
                   "train.micro_batch_prompts=4", f"train.max_steps={steps}", "algo.min_valid_fraction=0",
                   "train.tensorboard=false", "train.progress=false", "train.eval_every=0", "model.dtype=float32",
                   "train.save_every=0", f"output_dir={workdir / family}", *overrides])
    t0 = time.perf_counter()
    Trainer(cfg).train()
    wall = time.perf_counter() - t0
    rows = [r for r in read_metrics(workdir / family) if "time/rollout" in r][1:]  # the first step warms up
    if not rows:
        raise RuntimeError(f"{family}: no step after the warm-up; use --steps 2 or more")

    def med(key: str) -> float:
        return statistics.median(r[key] for r in rows)

    tokens = sum(r["throughput/completion_tokens_per_s"] * r["time/step"] for r in rows)  # the step's tokens
    rollout_s = sum(r["time/rollout"] for r in rows)
    rss = {k.split("/")[1].removesuffix("_rss_mib"): max(r[k] for r in rows)
           for k in rows[0] if k.startswith("memory/") and k.endswith("_rss_mib")}
    return {"family": family, "engine": engine, "steps": len(rows), "rollout_s": med("time/rollout"),
            "tokens_per_s": tokens / rollout_s, "update_s": med("time/update"), "step_s": med("time/step"),
            "rss": rss, "wall_s": wall}


def emit(text: str, out: str | None) -> None:
    """Print a bench's results and, with ``--out``, write them (markdown) there too."""
    print(text)
    if out:
        Path(out).write_text(text, encoding="utf-8")


def child_result(cmd: list[str], what: str) -> dict:
    """Run ``cmd`` (this or another bench script measuring one configuration in a process of its own, so that its
    RSS is its own) and return the JSON of its last output line; exit with its error output if it failed."""
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"bench/{Path(cmd[1]).name}: {what} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def table(results: list[dict]) -> str:
    phases = sorted({p for r in results for p in r["rss"]})
    head = ["family", "engine", "rollout s", "tokens/s", "update s", "step s", *[f"peak RSS {p} MiB" for p in phases]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        cells = [r["family"], r["engine"], f"{r['rollout_s']:.2f}", f"{r['tokens_per_s']:.0f}", f"{r['update_s']:.2f}",
                 f"{r['step_s']:.2f}", *[f"{r['rss'].get(p, float('nan')):.0f}" for p in phases]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    from mmgpg.models import FAMILIES

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", default="", help="comma-separated model types (default: all; --engine vllm: the "
                    "ones the vLLM engine serves)")
    ap.add_argument("--engine", choices=["hf", "vllm"], default="hf")
    ap.add_argument("--steps", type=int, default=4, help="GPG steps per family; the first is a warm-up")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--out", help="also write the table (markdown) here")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one family in this process, print JSON
    args = ap.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    names = [f for f in args.families.split(",") if f] or [f for f in FAMILIES
                                                           if args.engine == "hf" or FAMILIES[f].vllm]
    unknown = [f for f in names if f not in FAMILIES or (args.engine == "vllm" and not FAMILIES[f].vllm)]
    if unknown:
        sys.exit(f"bench/families.py: not a family the {args.engine} engine runs: {', '.join(unknown)}")
    if args.one:  # a child: one family, its result as JSON on the last line
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(run_family(args.one, args.engine, args.steps, Path(tmp))))
        return
    load = os.getloadavg()
    results = []
    for family in names:  # each family in a process of its own: its RSS is its own, not the peak of those before it
        print(f"{family} ...", flush=True)
        cmd = [sys.executable, __file__, "--one", family, "--engine", args.engine, "--steps", str(args.steps),
               "--threads", str(args.threads)]
        results.append(child_result(cmd, family))
    text = (f"{table(results)}\n\nmachine: {os.cpu_count()} CPUs, load average before {load[0]:.2f}, after "
            f"{os.getloadavg()[0]:.2f}; {args.steps - 1} measured steps per family (medians; tokens/s over all)\n")
    emit(text, args.out)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
