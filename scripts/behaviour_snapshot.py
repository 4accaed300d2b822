"""A snapshot of what mmgpg computes, to show that a refactoring changed nothing (or to find what it changed).

    python scripts/behaviour_snapshot.py take OUT [--ckpt DIR]     # run the pipeline below, write OUT/snapshot.json
    python scripts/behaviour_snapshot.py compare A B                # exit 1 (and list them) if any value differs

``take`` runs, with one torch thread and a model cache of its own (so the tiny models are built by the code under
test):

* the VL demo, shortened (``mmgpg demo --sft-steps 20 --gpg-steps 6 ...``): SFT, GPG with evaluations, greedy and
  sampled, and the text demo likewise;
* ``mmgpg train`` with LoRA (3 steps) and with GRPO (KL, two updates per batch; 3 steps) from the VL demo's SFT
  checkpoint;
* ``mmgpg eval --task shapes`` (greedy and ``--samples 2``) on ``--ckpt`` (a checkpoint's ``policy/`` or a model
  folder; default: the shortened demo's own final checkpoint).

The snapshot keeps every number of every ``metrics.jsonl`` row (timings, throughput and memory dropped: they vary
between runs), every ``predictions.jsonl`` row and ``metrics.json`` of the evaluations, and the sha256 of each final
``model.safetensors``. Pass the same ``--ckpt`` to both snapshots when the code that builds tiny models changed. Run
both snapshots on the same machine: one thread makes a run deterministic on one CPU, not across CPU types.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

VOLATILE = ("time/", "throughput/", "memory/", "plan/")
VOLATILE_KEYS = {"seconds", "elapsed_s", "created", "started", "finished", "wall_s", "output", "run_dir", "checkpoint",
                 "ckpt", "path", "command", "plots", "seconds_sft", "seconds_rl", "date", "written"}


def _run(args: list[str], env: dict[str, str]) -> None:
    print("+ mmgpg " + " ".join(args), flush=True)
    subprocess.run([sys.executable, "-m", "mmgpg", *args], env=env, check=True, stdout=subprocess.DEVNULL)


def _clean(value):
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()
                if not k.startswith(VOLATILE) and k not in VOLATILE_KEYS}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def _jsonl(path: Path) -> list:
    return [_clean(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _final_policy(run: Path) -> Path:
    return sorted((run / "checkpoints").glob("step-*"), key=lambda p: int(p.name.split("-")[1]))[-1] / "policy"


def take(out: Path, ckpt: str | None) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "MMGPG_CACHE": str(out / "cache"), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    short = ["--sft-steps", "20", "--gpg-steps", "6", "--eval-limit", "20", "--eval-every", "3",
             "--prompts-per-step", "4", "--threads", "1"]
    snap: dict = {}
    for name, extra in (("demo_vl", []), ("demo_text", ["--text"])):
        _run(["demo", *extra, *short, "--output", str(out / name)], env)
        run = out / name
        snap[name] = {"summary": _clean(json.loads((run / "summary.json").read_text())),
                      "metrics": _jsonl(run / "gpg" / "metrics.jsonl"),
                      "weights": _sha(_final_policy(run / "gpg") / "model.safetensors")}
    sft = _final_policy(out / "demo_vl" / "sft")
    common = ["task=shapes", f"model.name_or_path={sft}", "model.dtype=float32", "train.max_steps=3",
              "train.prompts_per_step=4", "train.micro_batch_prompts=2", "rollout.group_size=4",
              "rollout.max_new_tokens=16", "train.learning_rate=2e-4", "train.tensorboard=false",
              "train.progress=false", "device=cpu", "seed=3"]
    for name, extra in (("lora", ["model.lora.rank=4"]),
                        ("grpo", ["algo=grpo", "algo.updates_per_batch=2"])):
        _run(["train", *common, *extra, f"output_dir={out / name}"], env)
        run = out / name
        final = sorted((run / "checkpoints").glob("step-*"))[-1]
        weights = final / ("adapter/adapter_model.safetensors" if name == "lora" else "policy/model.safetensors")
        snap[name] = {"metrics": _jsonl(run / "metrics.jsonl"), "weights": _sha(weights)}
    model = ckpt or str(_final_policy(out / "demo_vl" / "gpg"))
    for name, extra in (("eval_greedy", []), ("eval_sampled", ["--samples", "2"])):
        _run(["eval", "--task", "shapes", "--ckpt", model, "--limit", "12", "--output", str(out / name), *extra], env)
        run = out / name
        snap[name] = {"predictions": _jsonl(run / "predictions.jsonl"),
                      "metrics": _clean(json.loads((run / "metrics.json").read_text()))}
    (out / "snapshot.json").write_text(json.dumps(snap, indent=1, sort_keys=True) + "\n")
    return snap


def differences(a, b, where: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{where}.{k}: only in {'A' if k in a else 'B'}" for k in sorted(set(a) ^ set(b))]
        for k in sorted(set(a) & set(b)):
            out += differences(a[k], b[k], f"{where}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{where}: {len(a)} vs {len(b)} items"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{where}[{i}]")]
    return [] if a == b else [f"{where}: {a!r} vs {b!r}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("take")
    t.add_argument("out", type=Path)
    t.add_argument("--ckpt", default=None, help="model folder evaluated by `mmgpg eval` (default: the demo's own)")
    c = sub.add_parser("compare")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    args = parser.parse_args(argv)
    if args.cmd == "take":
        take(args.out, args.ckpt)
        print(f"snapshot: {args.out / 'snapshot.json'}")
        return 0
    a, b = (_clean(json.loads((p / "snapshot.json").read_text())) for p in (args.a, args.b))
    found = differences(a, b)
    for line in found[:50]:
        print(line)
    print(f"{len(found)} difference(s)" if found else "identical")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
