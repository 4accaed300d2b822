"""The DeepSpeed backend on CPU (gloo, 2 ranks), tiny Qwen2-VL: step time and peak RSS per rank for plain vs ZeRO-2
vs ZeRO-3, and HF ``generate`` under ZeRO-3 with and without the gather-once generation context.

Each configuration runs in fresh processes (``torch.multiprocessing.spawn``, 2 ranks, 1 thread each):

* **train**: ``mmgpg train``'s Trainer on ``task=shapes``, ``model=tiny`` (G=4, 12 new tokens, 4 prompts per step,
  one prompt per micro-batch, one rollout attempt per step); ``--steps`` steps; the step time is the median over steps 2.. (step 1 includes the
  first trace of ZeRO-3); peak RSS is ``ru_maxrss`` of each rank at the end (it includes importing DeepSpeed).
* **generate** (ZeRO-3 only): greedy ``model.generate`` of ``--prompts`` prompts for exactly ``--new-tokens``
  tokens, timed twice per way after one warm-up: (a) inside ``backend.generation_context()`` (one all-gather of
  every parameter, then no collective), (b) with the ZeRO-3 hooks active and ``synced_gpus=True`` (transformers'
  own way under ZeRO-3: every layer's parameters are all-gathered for every token, and ranks keep stepping until all
  finished).

    python bench/deepspeed_cpu.py                       # prints a markdown table
    python bench/deepspeed_cpu.py --steps 6 --out bench/results/deepspeed.md

Numbers are for the CPU tiny model: they show the mechanics (communication per step, gathers per token), not GPU
throughput.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

ARGS = ["task=shapes", "model=tiny", "model.dtype=float32", "rollout.group_size=4", "rollout.max_new_tokens=12",
        "train.prompts_per_step=4", "train.micro_batch_prompts=1", "train.learning_rate=1e-3", "train.progress=false",
        "train.tensorboard=false", "train.save_every=0", "algo.max_resample_attempts=1"]
SETUPS = {"plain": ["train.backend=plain"],
          "ZeRO-2": ["train.backend=deepspeed", "train.zero_stage=2"],
          "ZeRO-3": ["train.backend=deepspeed", "train.zero_stage=3"]}


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _worker(rank: int, world: int, init: str, out: str, setup: str, steps: int, prompts: int, new_tokens: int):
    import torch
    import torch.distributed as dist

    os.environ.update(WORLD_SIZE=str(world), RANK=str(rank), LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    from mmgpg.config import resolve
    from mmgpg.models.batch import join_vision
    from mmgpg.train.trainer import Trainer

    trainer = Trainer(resolve([*ARGS, *SETUPS[setup], f"train.max_steps={steps}", f"output_dir={out}/run"]))
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        trainer.train_step()
        times.append(time.perf_counter() - t0)
    result = {"rank": rank, "step_s": times, "peak_rss_mb": _peak_mb()}
    if setup == "ZeRO-3":
        policy = trainer.policy
        examples = [trainer.dataset[i] for i in range(prompts)]
        batch = policy.encode_prompts([trainer.task.prompt(e) for e in examples]).to(trainer.device)
        kwargs = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                      mm_token_type_ids=batch.mm_token_type_ids, **join_vision(batch.vision),
                      **{**policy.sampling_kwargs(max_new_tokens=new_tokens, temperature=0.0),
                         "min_new_tokens": new_tokens})
        policy.model.eval()
        for way in ("gather_once", "hooks_synced", "gather_once", "hooks_synced", "gather_once", "hooks_synced"):
            dist.barrier()
            t0 = time.perf_counter()
            with torch.no_grad():
                if way == "gather_once":
                    with trainer.backend.generation_context():
                        out_ids = policy.model.generate(**kwargs)
                else:
                    out_ids = policy.model.generate(**kwargs, synced_gpus=True)
            result.setdefault(way, []).append(time.perf_counter() - t0)
            assert out_ids.shape[1] - batch.input_ids.shape[1] == new_tokens
    Path(f"{out}/rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def run(setup: str, steps: int, prompts: int, new_tokens: int) -> list[dict]:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(2, f"{tmp}/init", tmp, setup, steps, prompts, new_tokens), nprocs=2, join=True)
        return [json.loads(Path(f"{tmp}/rank{r}.json").read_text()) for r in (0, 1)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    lines = ["| backend | step time, median of steps 2.. (s) rank 0 / rank 1 | peak RSS rank 0 / rank 1 (MiB) |",
             "|---|---|---|"]
    gen = []
    for setup in SETUPS:
        ranks = run(setup, args.steps, args.prompts, args.new_tokens)
        med = [statistics.median(r["step_s"][1:]) for r in ranks]
        lines.append(f"| {setup} | {med[0]:.2f} / {med[1]:.2f} | {ranks[0]['peak_rss_mb']:.0f} / "
                     f"{ranks[1]['peak_rss_mb']:.0f} |")
        if setup == "ZeRO-3":
            for way in ("gather_once", "hooks_synced"):
                t = [x for r in ranks for x in r[way][1:]]  # the first of each way is a warm-up
                gen.append((way, statistics.median(t), min(t), max(t)))
        print(lines[-1], flush=True)
    lines += ["", f"HF generate under ZeRO-3, {args.prompts} prompts x {args.new_tokens} new tokens (greedy, forced "
              "length), 2 ranks; median [min-max] over 2 timed runs x 2 ranks after a warm-up:", "",
              "| way | seconds |", "|---|---|"]
    lines += [f"| {w} | {m:.2f} [{lo:.2f}-{hi:.2f}] |" for w, m, lo, hi in gen]
    if len(gen) == 2:
        lines.append(f"\nhooks_synced / gather_once = {gen[1][1] / gen[0][1]:.1f}x")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
