"""Rollouts that overlap the update (``rollout.max_staleness``) on the demo task with the vLLM CPU server, paired in one
session: steps per hour, reward against wall-clock and final accuracy for K = 0 vs 1 vs 2, and at K = 1 the final
accuracy with ``algo.rollout_correction=token_tis`` vs ``none`` over seeds.

    .venv-vllm/bin/python bench/async_rollout.py --out bench/results/async_rollout.md        # in the vLLM environment
    .venv-vllm/bin/python bench/async_rollout.py --seeds 0 --gpg-steps 4 --eval-limit 8      # a smoke run

Each run is ``mmgpg demo`` (the tiny Qwen2-VL on ``shapes``: SFT warm start, then GPG with 16 prompts x G = 8) with
its RL stage on the vLLM engine behind one ``mmgpg vllm-serve`` (``--rl-set rollout.engine=vllm
rollout.vllm_server=...``); the first run of a seed does the SFT, the others of that seed start from its SFT policy
(``--sft-from``), so the variants of a seed share the warm start. Every process runs torch on one thread (the
trainer and the server then use one core each on this 2-core machine: overlap can only hide one behind the other).
The machine's load average is printed beside every run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def serve(log: Path) -> tuple[subprocess.Popen, str]:
    """`mmgpg vllm-serve` of the tiny Qwen2-VL, its log in ``log`` (the run's first sync gives it the run's own
    weights). One server per run: no run inherits another's engine state."""
    proc = subprocess.Popen([sys.executable, "-m", "mmgpg", "vllm-serve", "--model", "tiny", "--port", "0",
                             "--max-pixels", "12544", "--max-model-len", "1048"], stdout=subprocess.PIPE,
                            stderr=log.open("w"), text=True, env=ENV, cwd=ROOT)
    url = next((line.split()[4] for line in proc.stdout if line.startswith("mmgpg vllm-serve: ready at ")), None)
    if not url:
        raise RuntimeError(f"the server did not start (exit {proc.poll()}); its log: {log}")
    # keep reading its stdout (vLLM logs there): a full pipe would block the server's next log line, and with it
    # the request that writes it
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
    return proc, url


def run(out: Path, seed: int, url: str, staleness: int, correction: str, args, sft_from: str = "") -> dict:
    """One demo run; its summary with the RL stage's per-step timings and rewards."""
    cmd = [sys.executable, "-m", "mmgpg", "demo", "--seed", str(seed), "--gpg-steps", str(args.gpg_steps),
           "--eval-every", str(args.gpg_steps), "--eval-limit", str(args.eval_limit), "--output", str(out),
           *(["--sft-from", sft_from] if sft_from else []),
           *[f"--rl-set={kv}" for kv in ("rollout.engine=vllm", f"rollout.vllm_server={url}",
                                         f"rollout.max_staleness={staleness}", f"algo.rollout_correction={correction}",
                                         "rollout.vllm_server_timeout=600")]]
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=ENV, cwd=ROOT)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    rows = [json.loads(x) for x in (out / "gpg" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "time/step" in r]
    clock, curve = 0.0, []
    for r in steps:
        clock += r["time/step"]
        curve.append((clock, r["reward/total"]))
    return {"seed": seed, "staleness": staleness, "correction": correction, "wall_s": wall,
            "load": (load0, os.getloadavg()[0]), "rl_s": summary["seconds_rl"],
            "s_per_step": statistics.fmean(r["time/step"] for r in steps[1:] or steps),
            "wait_rollout": statistics.fmean(r.get("time/wait_rollout", r["time/rollout"]) for r in steps),
            "wait_sync": statistics.fmean(r.get("time/wait_sync", 0.0) for r in steps),
            "reward_curve": curve, "greedy": (summary["accuracy_before"], summary["accuracy_after"]),
            "sampled": (summary["sampled_accuracy_before"], summary["sampled_accuracy_after"]),
            "is_ess": statistics.fmean(r["rollout_is/ess"] for r in steps if "rollout_is/ess" in r)
            if any("rollout_is/ess" in r for r in steps) else None}


def reward_at(curve, fraction: float) -> float:
    """Mean reward of the steps within ±5 % of the run's step time around ``fraction`` of it."""
    total = curve[-1][0]
    near = [r for t, r in curve if abs(t / total - fraction) <= 0.05] or [curve[-1][1]]
    return statistics.fmean(near)


def _shown(argv: list[str]) -> list[str]:
    """The command line as the results file shows it: without ``--workdir`` (a path of this machine)."""
    out, skip = [], False
    for a in argv:
        if skip or a.startswith("--workdir="):
            skip = False
            continue
        skip = a == "--workdir"
        if not skip:
            out.append(a)
    return out


def table(results: list[dict], args) -> str:
    lines = ["# Sampling ahead of the update (`rollout.max_staleness`) on the demo task, vLLM CPU server",
             "", f"`{' '.join(['.venv-vllm/bin/python', 'bench/async_rollout.py', *_shown(sys.argv[1:])])}` on "
             f"{time.strftime('%Y-%m-%d')}: `mmgpg demo` (tiny Qwen2-VL on shapes, SFT warm start, then "
             f"{args.gpg_steps} GPG steps of 16 prompts x G = 8, 32 new tokens) with the RL stage on the vLLM engine "
             f"behind one `mmgpg vllm-serve`; torch on one thread in every process; evaluations on {args.eval_limit} "
             "test images (greedy, and 8 samples at T = 1). Load: the 1-minute load average at each run's start "
             "and end.", "",
             "| seed | K | correction | s/step | steps/hour | trainer waits s/step | engine waits s/step | "
             "reward at 25/50/100 % of the time | greedy before → after | sampled before → after | ESS | load |",
             "|---:|---:|---|---:|---:|---:|---:|---|---|---|---:|---|"]
    for r in results:
        c = r["reward_curve"]
        ess = "" if r["is_ess"] is None else f"{r['is_ess']:.3f}"
        lines.append(f"| {r['seed']} | {r['staleness']} | {r['correction']} | {r['s_per_step']:.2f} | "
                     f"{3600 / r['s_per_step']:.0f} | {r['wait_rollout']:.2f} | {r['wait_sync']:.2f} | "
                     f"{reward_at(c, 0.25):.3f} / {reward_at(c, 0.5):.3f} / {reward_at(c, 1.0):.3f} | "
                     f"{r['greedy'][0]:.3f} → {r['greedy'][1]:.3f} | {r['sampled'][0]:.3f} → {r['sampled'][1]:.3f} | "
                     f"{ess} | {r['load'][0]:.1f} / {r['load'][1]:.1f} |")
    base = {r["seed"]: r for r in results if r["staleness"] == 0}
    for r in results:
        if r["staleness"] and r["seed"] in base:
            lines.append(f"\nseed {r['seed']}, K = {r['staleness']} ({r['correction']}): "
                         f"{base[r['seed']]['s_per_step'] / r['s_per_step']:.2f}x the steps per hour of K = 0")
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", default="0,1,2", help="seeds of the token_tis vs none comparison at K = 1")
    p.add_argument("--speed-seed", type=int, default=0, help="the seed of the K = 0 / 1 / 2 comparison")
    p.add_argument("--gpg-steps", type=int, default=100)
    p.add_argument("--eval-limit", type=int, default=100)
    p.add_argument("--out", help="write the markdown table here (and the raw numbers beside it as .json)")
    p.add_argument("--workdir", help="where the runs and the servers' logs go (default: a new temporary folder)")
    args = p.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    plan = [(args.speed_seed, k, "token_tis") for k in (1, 0, 2)]  # K = 1 first: it does the seed's SFT
    plan += [(s, 1, c) for s in seeds for c in ("token_tis", "none") if (s, 1, c) not in plan]
    plan.sort(key=lambda x: x[0] != args.speed_seed)
    results, sft = [], {}
    work = Path(args.workdir or tempfile.mkdtemp(prefix="mmgpg-async-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    for i, (seed, k, correction) in enumerate(plan):
        out = work / f"run{i}"
        proc, url = serve(work / f"server{i}.log")
        try:
            r = run(out, seed, url, k, correction, args, sft.get(seed, ""))
        finally:
            proc.terminate()
            proc.wait(timeout=120)
        if seed not in sft:
            sft[seed] = str(sorted((out / "sft" / "checkpoints").glob("step-*"))[-1] / "policy")
        results.append(r)
        print(json.dumps({k: v for k, v in r.items() if k != "reward_curve"}), flush=True)
    text = table(results, args)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
        Path(args.out).with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
