"""Multi-turn episodes with the zoom tool on the tiny Qwen2-VL: episodes per second, policy tokens per second and the
share of time in the tools, for episodes of 1, 2 and 4 turns, in one table.

    python bench/tools.py --out bench/results/tools.md
    .venv-vllm/bin/python bench/tools.py --engine vllm           # the vLLM engine (vLLM environment)

A random tiny model calls no tool, so each row first teaches one the episode it measures: ``mmgpg sft`` on
``shapes_zoom``'s gold episodes (``--sft-steps``, lr 1e-3, 32 per step; ``task.describe_tools=false``) that answer at
once (1 turn), zoom once and answer (2 turns), or zoom three times and answer (4 turns: ``task.gold_zooms=3``). Then
``--episodes`` episodes (8 prompts x G = 4 per call, 80 new tokens per turn, temperature 1, fp32) are rolled out
through :func:`mmgpg.rollout.episode.rollout` with the HF engine, the first call a warm-up. Reported: turns per
episode as sampled, episodes/s and policy tokens/s over the measured calls, and the share of the rollout's wall time
spent in the zoom function and in encoding observations (the processor; both timed around the real calls). Each row
runs in a process of its own. The machine load is printed beside the table; read the ratios between rows.

``--engine vllm`` (in the vLLM environment) rolls out with the colocated vLLM engine instead (fp32; later turns
continue from token ids).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROWS = {1: ["task.gold_zoom_share=0"], 2: [], 4: ["task.gold_zooms=3", "task.max_turns=4"]}
TASK = ["task=shapes_zoom", "task.describe_tools=false", "model=tiny", "model.dtype=float32", "device=cpu"]


def measure(turns: int, sft_steps: int, episodes: int, workdir: Path, engine_name: str = "hf") -> dict:
    import torch

    from mmgpg.config import resolve
    from mmgpg.models.load import load_policy
    from mmgpg.rollout.engine import Sampling
    from mmgpg.rollout.episode import rollout
    from mmgpg.rollout.hf import HFEngine
    from mmgpg.task import build_task
    from mmgpg.tools import TOOLS
    from mmgpg.train.sft import SFTTrainer

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    sft = SFTTrainer(resolve([*TASK, *ROWS[turns], f"sft.max_steps={sft_steps}", "sft.batch_size=32",
                              "sft.learning_rate=1e-3", "sft.eval_every=0", "sft.save_every=0", "train.eval_limit=8",
                              "rollout.max_new_tokens=80", f"output_dir={workdir / 'sft'}"]))
    final = sft.train()
    sft_s = time.perf_counter() - t0
    options = {"describe_tools": False, **{k.split(".")[1]: int(v) for k, v in (o.split("=") for o in ROWS[turns])
                                          if k in ("task.gold_zooms", "task.max_turns")}}
    task = build_task("shapes_zoom", options)
    policy = load_policy(str(final), dtype="float32", device="cpu", min_pixels=3136, max_pixels=12544)
    timed = {"tool": 0.0, "observation": 0.0}

    def timing(fn, key: str):
        """``fn`` that adds its wall time to ``timed[key]``."""
        def run(*args):
            t = time.perf_counter()
            try:
                return fn(*args)
            finally:
                timed[key] += time.perf_counter() - t
        return run

    zoom = TOOLS["zoom"]
    TOOLS.register("zoom", replace(zoom, fn=timing(zoom.fn, "tool")), replace=True)
    policy.encode_observation = timing(policy.encode_observation, "observation")
    if engine_name == "vllm":
        from mmgpg.rollout.engine import EngineSettings, build_engine

        engine = build_engine("vllm", policy, EngineSettings.from_config(resolve(
            ["model=tiny", "rollout.vllm_max_model_len=1024"]).config))
    else:
        engine = HFEngine(policy)
    examples = task.load("test")
    calls = max(1, episodes // 32)
    stats = {"episodes": 0, "turns": 0, "tokens": 0, "seconds": 0.0}
    for c in range(calls + 1):
        batch = [examples[(8 * c + i) % len(examples)] for i in range(8)]
        if c == 1:  # the warm-up's time is not counted
            timed.update(tool=0.0, observation=0.0)
        t = time.perf_counter()
        out = rollout(engine, task, batch, 4, Sampling(80))
        if c == 0:
            continue  # warm-up
        stats["seconds"] += time.perf_counter() - t
        stats["episodes"] += len(out.episodes)
        stats["turns"] += sum(len(e.turns) for e in out.episodes)
        stats["tokens"] += int(out.completion_mask.sum())
    return {"turns_wanted": turns, "turns": stats["turns"] / stats["episodes"],
            "episodes_per_s": stats["episodes"] / stats["seconds"], "tokens_per_s": stats["tokens"] / stats["seconds"],
            "tool_share": timed["tool"] / stats["seconds"], "observation_share": timed["observation"] / stats["seconds"],
            "sft_s": sft_s, "episodes": stats["episodes"]}


def table(rows: list[dict]) -> str:
    lines = ["| episode (gold turns) | turns sampled | episodes/s | policy tokens/s | time in zoom | time encoding "
             "observations |", "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['turns_wanted']} | {r['turns']:.2f} | {r['episodes_per_s']:.2f} | {r['tokens_per_s']:.0f} "
                     f"| {100 * r['tool_share']:.2f} % | {100 * r['observation_share']:.1f} % |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", choices=["hf", "vllm"], default="hf")
    ap.add_argument("--sft-steps", type=int, default=150)
    ap.add_argument("--episodes", type=int, default=64, help="measured episodes per row (calls of 32)")
    ap.add_argument("--out", help="also write the results (markdown) here")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # internal: one row in this process
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "bench"))
    from families import child_result, emit

    if args.one:
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(measure(args.one, args.sft_steps, args.episodes, Path(tmp), args.engine)))
        return
    load = os.getloadavg()
    rows = []
    for turns in ROWS:
        print(f"{turns}-turn episodes ...", flush=True)
        cmd = [sys.executable, __file__, "--one", str(turns), "--sft-steps", str(args.sft_steps),
               "--episodes", str(args.episodes), "--engine", args.engine]
        rows.append(child_result(cmd, f"{turns}-turn episodes"))
    sft_seconds = ", ".join(f"{r['sft_s']:.0f}" for r in rows)
    text = "\n".join([table(rows), "",
                      f"machine: {os.cpu_count()} CPUs, load average before {load[0]:.2f}, after "
                      f"{os.getloadavg()[0]:.2f}; {args.engine} engine, {rows[0]['episodes']} measured episodes per row after "
                      f"{args.sft_steps} SFT steps (SFT {sft_seconds} s)", ""])
    emit(text, args.out)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
