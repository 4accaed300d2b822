"""Every algorithm of configs/algo on the embedded shapes task, from one SFT warm start, over several seeds.

    python bench/compare_algos.py                      # SFT once (seed 0), then 13 algorithms x 3 seeds
    python bench/compare_algos.py --steps 150 --seeds 0 1 2 3 --parallel 2 --out bench/results/compare_algos.md \
        --plot bench/results/compare_algos_rewards.png

Every run starts from the same SFT checkpoint and uses the same settings except the algorithm (``configs/algo/``)
and the seed (sampling and data order): the same steps x prompts_per_step x group_size completions in every update
(methods that resample, GPG's β_th and DAPO's dynamic sampling, generate more: the table counts them). Each run
starts and ends with a greedy and a sampled evaluation on the test split. The table reports mean ± standard
deviation over seeds of final accuracy, completions generated, completion tokens generated per step and the median
wall time per step; ``--plot`` draws every algorithm's reward curve (mean over seeds) in one PNG. Runs execute as
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
    "gpg_token_mean": "GPG, token mean",
    "gpg_kl": "GPG + KL 0.04 (Table 9)",
    "gpg_clip": "GPG + clip, 2 upd. (Table 9)",
    "grpo": "GRPO (z-score, clip, KL 0.04)",
    "dr_grpo": "Dr. GRPO",
    "dapo": "DAPO (clip-higher, dyn. sampling, overlong, 2 upd.)",
    "gspo": "GSPO (2 upd.)",
    "gspo_token": "GSPO-token (2 upd.)",
    "cispo": "CISPO (2 upd.)",
    "rloo": "RLOO",
    "reinforce_pp": "REINFORCE++",
    "reinforce_pp_baseline": "REINFORCE++-baseline",
}
# The GPG ablations (configs/algo/gpg_ablation_*) run with --algos; the earlier results below the table have them.


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
    ap.add_argument("--plot", default=None, help="write the reward curves of every algorithm (one PNG) here")
    args = ap.parse_args()
    load_before = os.getloadavg()
    t_start = time.time()
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

    summary = {algo: summarise(work, algo, args.seeds, args.prompts_per_step * args.group_size)
               for algo in args.algos}
    load_after = os.getloadavg()
    budget = args.steps * args.prompts_per_step * args.group_size
    lines = [f"# `python {' '.join(sys.argv)}`", "",
             f"{time.strftime('%Y-%m-%d', time.gmtime())}; SFT warm start ({args.sft_steps} steps) greedy test accuracy "
             f"**{sft_eval:.3f}**; each run: {args.steps} steps x {args.prompts_per_step} prompts x G={args.group_size} "
             f"= {budget} completions in the updates, lr {args.lr} ({args.lr_scheduler}); greedy and sampled "
             f"(mean of {args.eval_samples}) evaluation on {args.eval_limit} test images before and after; seeds "
             f"{args.seeds}; {args.parallel} run(s) at a time, 1 thread each; {os.cpu_count()} cores. Load average "
             f"(1/5/15 min) {fmt_load(load_before)} at the start, {fmt_load(load_after)} at the end; all runs "
             f"{time.time() - t_start:.0f} s.", "",
             "| algorithm | greedy accuracy (mean ± std) | per seed | Δ vs SFT | sampled accuracy (mean ± std) "
             "| Δ vs start | completions generated | completion tokens / step | s/step (mean ± std) |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for algo in args.algos:
        r = summary[algo]
        lines.append(f"| {ALGOS.get(algo, algo)} (`{algo}`) | {mean_sd(r['greedy'])} | "
                     f"{', '.join(f'{a:.3f}' for a in r['greedy'])} | {statistics.mean(r['greedy']) - sft_eval:+.3f} | "
                     f"{mean_sd(r['sampled'])} | {statistics.mean(r['sampled']) - statistics.mean(r['sampled_start']):+.3f} "
                     f"| {statistics.mean(r['generated']):.0f} | {statistics.mean(r['tokens_per_step']):.0f} | "
                     f"{mean_sd(r['seconds'])} |")
    table = "\n".join(lines) + "\n"
    print(table)
    if args.out:
        Path(args.out).write_text(table)
    if args.plot:
        plot_rewards({algo: summary[algo]["curve"] for algo in args.algos}, Path(args.plot),
                     f"reward/total (sampled, mean over seeds {args.seeds}); {args.steps} steps x "
                     f"{args.prompts_per_step} prompts x G={args.group_size} from one SFT start")


def mean_sd(xs: list[float]) -> str:
    return f"{statistics.mean(xs):.3f} ± {statistics.stdev(xs) if len(xs) > 1 else 0.0:.3f}"


def fmt_load(load: tuple[float, float, float]) -> str:
    return "/".join(f"{x:.1f}" for x in load)


def summarise(work: Path, algo: str, seeds: list[int], per_attempt: int) -> dict:
    """Per seed: final greedy and sampled accuracy (and the sampled one at step 0), completions generated (every
    attempt), completion tokens generated per step, the median s/step, and the reward curve."""
    out: dict = {k: [] for k in ("greedy", "sampled", "sampled_start", "generated", "tokens_per_step", "seconds")}
    curves = []
    for seed in seeds:
        rows = [json.loads(x) for x in (work / f"{algo}-seed{seed}" / "metrics.jsonl").read_text().splitlines()]
        evals = [r for r in rows if "eval/accuracy" in r]
        steps = [r for r in rows if "time/step" in r]
        out["greedy"].append(evals[-1]["eval/accuracy"])
        out["sampled"].append(evals[-1].get("eval/sampled_accuracy", float("nan")))
        out["sampled_start"].append(evals[0].get("eval/sampled_accuracy", float("nan")))
        generated = [r["rollout/resample_attempts"] * per_attempt for r in steps]
        out["generated"].append(sum(generated))
        out["tokens_per_step"].append(statistics.mean(n * r["rollout/completion_tokens"]
                                                      for n, r in zip(generated, steps)))
        out["seconds"].append(statistics.median(r["time/step"] for r in steps))
        curves.append([r["reward/total"] for r in steps])
    out["curve"] = [statistics.mean(c[i] for c in curves) for i in range(min(map(len, curves)))]
    return out


def plot_rewards(curves: dict[str, list[float]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 6))
    colours = plt.get_cmap("tab20").colors
    for i, (algo, curve) in enumerate(curves.items()):
        ax.plot(range(1, len(curve) + 1), curve, label=algo, color=colours[i % len(colours)],
                linestyle=("-", "--", ":")[i // 7 % 3], linewidth=1.6)
    ax.set_xlabel("step")
    ax.set_ylabel("mean reward of the step's completions")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
