"""A few GPG steps on a randomly initialised Qwen2-VL-2B-shaped model: step time, tokens/s, peak GPU memory.

Run it wherever a GPU is available (no download needed: the model is built from the real dimensions, vocabulary
151,936, with random weights; the prompts are the embedded `shapes` task at a realistic image size):

    python bench/gpu_step.py                                   # GPU: bf16 autocast, fp32 master weights
    python bench/gpu_step.py --size tiny --device cpu --steps 2  # a quick CPU smoke run of the same script

A random model gets no reward, so every group would have zero variance and GPG would skip the update; the script
uses the built-in ``shapes_parity`` task (a length-parity reward: about half of random completions score 1) so that
each step really runs the forward, backward and optimizer step. It writes ``bench/results/gpu_step-<size>-<device>.json`` and a markdown table beside it.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=["shape_true", "tiny"], default="shape_true")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=6, help="steps; the first 2 are warm-up and not counted")
    ap.add_argument("--prompts", type=int, default=8, help="prompt groups per step")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--micro-batch", type=int, default=4, help="prompt groups per forward/backward")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--image-pixels", type=int, default=448 * 448, help="max_pixels (448x448 -> 256 visual tokens)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args()

    from mmgpg.config import resolve
    from mmgpg.models.qwen_vl import QwenVLPolicy
    from mmgpg.models.tiny import build_model
    from mmgpg.train.trainer import Trainer

    device = torch.device(args.device)
    t0 = time.perf_counter()
    model, processor = build_model("qwen2_vl", args.size, seed=0, dtype="float32")
    model.to(device)
    build_s = time.perf_counter() - t0
    policy = QwenVLPolicy(model, processor, min_pixels=3136, max_pixels=args.image_pixels, max_prompt_length=2048)
    overrides = [
        "task=shapes_parity", "task.num_train=512", f"device={args.device}",
        "model.dtype=auto", f"model.max_pixels={args.image_pixels}", "model.max_prompt_length=2048",
        f"rollout.group_size={args.group_size}", f"rollout.max_new_tokens={args.max_new_tokens}",
        f"train.prompts_per_step={args.prompts}", f"train.micro_batch_prompts={args.micro_batch}",
        "algo.min_valid_fraction=0", "train.progress=false", "train.tensorboard=false",
    ]
    with tempfile.TemporaryDirectory(prefix="mmgpg-gpu-bench-") as run_dir:  # the run's own files are not kept
        result = _measure(args, model, Trainer(resolve([*overrides, f"output_dir={run_dir}"]), policy=policy),
                          device, build_s)
    _write(result, args, device)


def _measure(args, model, trainer, device, build_s) -> dict:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    rows = []
    for step in range(args.steps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t = time.perf_counter()
        m = trainer.train_step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        wall = time.perf_counter() - t
        tokens = m["rollout/completion_tokens"] * m["gpg/num_samples"]
        rows.append({"step": step + 1, "seconds": wall, "completion_tokens": tokens,
                     "tokens_per_s": tokens / wall, "valid_fraction": m["gpg/valid_fraction"],
                     "time/rollout": m["time/rollout"], "time/update": m["time/update"]})
        print(json.dumps(rows[-1]), flush=True)
    measured = rows[2:] or rows
    return {
        "command": "python " + " ".join(sys.argv),
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__, "size": args.size,
        "parameters": sum(p.numel() for p in model.parameters()),
        "autocast_bf16": trainer.backend.bf16,
        "build_seconds": build_s,
        "median_step_seconds": statistics.median(r["seconds"] for r in measured),
        "median_rollout_seconds": statistics.median(r["time/rollout"] for r in measured),
        "median_update_seconds": statistics.median(r["time/update"] for r in measured),
        "median_tokens_per_s": statistics.median(r["tokens_per_s"] for r in measured),
        "peak_gpu_memory_gib": (torch.cuda.max_memory_allocated(device) / 2**30) if device.type == "cuda" else None,
        "settings": vars(args), "steps": rows,
    }


def _write(result: dict, args, device) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"gpu_step-{args.size}-{device.type}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    md = [f"# `{result['command']}`", "", f"{result['date_utc']} UTC, {result['device']}, torch {result['torch']}, "
          f"{result['parameters']:,} parameters, bf16 autocast: {result['autocast_bf16']}", "",
          "| median step s | rollout s | update s | completion tokens/s | peak GPU memory GiB |",
          "|---:|---:|---:|---:|---:|",
          f"| {result['median_step_seconds']:.2f} | {result['median_rollout_seconds']:.2f} | "
          f"{result['median_update_seconds']:.2f} | {result['median_tokens_per_s']:.0f} | "
          f"{result['peak_gpu_memory_gib'] if result['peak_gpu_memory_gib'] is None else round(result['peak_gpu_memory_gib'], 2)} |"]
    stem.with_suffix(".md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
