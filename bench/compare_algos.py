"""GPG vs GRPO vs the GPG ablations on the embedded shapes task, from one SFT warm start, over several seeds.

    python bench/compare_algos.py                                  # SFT once (seed 0), then 5 algorithms x 3 seeds
    python bench/compare_algos.py --steps 150 --seeds 0 1 2 3 --parallel 2 --out bench/results/compare_algos.md

Every run starts from the same SFT checkpoint and uses the same settings except the algorithm (``configs/algo/``)
and the seed (sampling and data order). Each run ends with a greedy evaluation on the test split. The table reports
mean ± standard deviation over seeds of final accuracy and of the median wall time per step. Runs execute as
separate ``mmgpg train`` processes, ``--parallel`` at a time with one torch thread each. Wall times are only
comparable inside one invocation. This is a measurement, not a test; whatever it shows is reported.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ALGOS = {
    "gpg": "GPG (F_norm=1, α, β_th=0.4)",
    "gpg_ablation_fnorm1_alpha1_threshold": "GPG, α off",
    "gpg_ablation_fnorm1_alpha_nothreshold": "GPG, β_th off",
    "gpg_ablation_fnormstd_alpha_threshold": "GPG, std normalisation on",
    "grpo": "GRPO (z-score, clip, KL 0.04)",
}


def run(cmd: list[str], log: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    with open(log, "w") as f:
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed; see {log}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", default="runs/compare_algos", help="where the runs go")
    ap.add_argument("--sft-steps", type=int, default=200)
    ap.add_argument("--sft-lr", type=float, default=1e-3)
    ap.add_argument("--steps", type=int, default=120, help="RL steps per run")
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--lr-scheduler", default="linear", choices=["constant", "linear", "cosine"],
                    help="RL learning-rate schedule (the demo's default: linear decay to 0)")
    ap.add_argument("--prompts-per-step", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--eval-limit", type=int, default=400)
    ap.add_argument("--eval-samples", type=int, default=4, help="sampled completions per test image (mean@k)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--algos", nargs="+", default=list(ALGOS))
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--out", default=None, help="also write the markdown table here")
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    mmgpg = [sys.executable, "-m", "mmgpg"]
    common = ["task=shapes", "model=tiny", "rollout.max_new_tokens=32", "device=cpu", f"task.num_test={args.eval_limit}",
              f"train.eval_limit={args.eval_limit}"]

    sft_dir = work / "sft"
    if not (sft_dir / "final" / "model.safetensors").exists():
        print(f"SFT warm start: {args.sft_steps} steps", flush=True)
        run(mmgpg + ["sft", *common, "seed=0", f"sft.max_steps={args.sft_steps}", "sft.batch_size=32",
                     f"sft.learning_rate={args.sft_lr}", f"output_dir={sft_dir}"], work / "sft.log")
    sft_eval = json.loads((sft_dir / "metrics.jsonl").read_text().splitlines()[-1])["eval/accuracy"]

    jobs = []
    for algo in args.algos:
        for seed in args.seeds:
            out = work / f"{algo}-seed{seed}"
            if (out / "checkpoints").exists():
                continue  # finished earlier: reuse
            jobs.append((out, mmgpg + ["train", *common, f"algo={algo}", f"seed={seed}",
                                       f"model.name_or_path={sft_dir / 'final'}", "model.dtype=float32",
                                       f"train.max_steps={args.steps}", f"train.prompts_per_step={args.prompts_per_step}",
                                       f"train.micro_batch_prompts={args.prompts_per_step}",
                                       f"rollout.group_size={args.group_size}", f"train.learning_rate={args.lr}",
                                       f"train.lr_scheduler={args.lr_scheduler}",
                                       f"train.eval_every={args.steps}", f"train.eval_samples={args.eval_samples}",
                                       "train.tensorboard=false",
                                       "train.progress=false", f"output_dir={out}"]))
    t0 = time.time()
    with ThreadPoolExecutor(max_workers=args.parallel) as pool:
        for out, _cmd in jobs:
            print(f"queued {out.name}", flush=True)
        list(pool.map(lambda job: run(job[1], job[0].with_suffix(".log")), jobs))
    print(f"runs took {time.time() - t0:.0f} s", flush=True)

    lines = [f"# `python {' '.join(sys.argv)}`", "",
             f"{time.strftime('%Y-%m-%d', time.gmtime())}; SFT warm start ({args.sft_steps} steps) greedy test accuracy "
             f"**{sft_eval:.3f}**; each run: {args.steps} steps x {args.prompts_per_step} prompts x G={args.group_size}, "
             f"lr {args.lr} ({args.lr_scheduler}); greedy evaluation on {args.eval_limit} test images; seeds {args.seeds}; "
             f"{args.parallel} runs in parallel, 1 thread each.", "",
             f"| algorithm | greedy accuracy (mean ± std) | per seed | Δ vs SFT | sampled accuracy, mean of "
             f"{args.eval_samples} (mean ± std) | Δ vs start | s/step (mean ± std) |",
             "|---|---:|---|---:|---:|---:|---:|"]

    def mean_sd(xs: list[float]) -> str:
        return f"{statistics.mean(xs):.3f} ± {statistics.stdev(xs) if len(xs) > 1 else 0.0:.3f}"

    for algo in args.algos:
        accs, sampled, sampled_start, times = [], [], [], []
        for seed in args.seeds:
            rows = [json.loads(x) for x in (work / f"{algo}-seed{seed}" / "metrics.jsonl").read_text().splitlines()]
            evals = [r for r in rows if "eval/accuracy" in r]
            accs.append(evals[-1]["eval/accuracy"])
            sampled.append(evals[-1].get("eval/sampled_accuracy", float("nan")))
            sampled_start.append(evals[0].get("eval/sampled_accuracy", float("nan")))
            times.append(statistics.median(r["time/step"] for r in rows if "time/step" in r))
        lines.append(f"| {ALGOS.get(algo, algo)} (`{algo}`) | {mean_sd(accs)} | {', '.join(f'{a:.3f}' for a in accs)} | "
                     f"{statistics.mean(accs) - sft_eval:+.3f} | {mean_sd(sampled)} | "
                     f"{statistics.mean(sampled) - statistics.mean(sampled_start):+.3f} | {mean_sd(times)} |")
    table = "\n".join(lines) + "\n"
    print(table)
    if args.out:
        Path(args.out).write_text(table)


if __name__ == "__main__":
    main()
