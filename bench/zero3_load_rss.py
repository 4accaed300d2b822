"""Peak host RSS per rank while loading a policy for ZeRO-3 training, both ways side by side in one run: ``full``, the
whole model on every rank then partitioned by ``deepspeed.initialize`` (what mmgpg did before
``DeepSpeedBackend.loading()``), and ``partitioned``, built under ``deepspeed.zero.Init`` inside ``backend.loading()``
(what the trainer does now).

The model has Qwen2-VL-2B-Instruct's widths (vocabulary 151,936, hidden 1536, FFN 8960, vision 1280/5120, tied
embeddings: :data:`mmgpg.models.qwen2.SHAPE_TRUE`) with ``--layers`` language layers and ``--vision-depth`` vision
blocks, randomly initialised and saved in bfloat16 like the hub checkpoint; the ranks load it in float32 (DeepSpeed on
CPU keeps float32 weights). Each way runs in fresh processes (2 ranks, gloo, 1 thread each), one after the other in
one session; per rank it records the RSS before loading (after importing and initialising DeepSpeed), the peak RSS
(``ru_maxrss``) after loading and after ``prepare`` (the ZeRO-3 optimizer's fp32 partitions and Adam state; left out
with ``--skip-prepare``).

    python bench/zero3_load_rss.py                     # prints a markdown table
    python bench/zero3_load_rss.py --layers 8 --skip-prepare --out bench/results/zero3_load_rss.md   # appends
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

WAYS = ("full", "partitioned")


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def build(out: Path, layers: int, vision_depth: int) -> tuple[Path, int]:
    import torch
    from transformers import Qwen2VLForConditionalGeneration

    from mmgpg.models import tiny
    from mmgpg.models.qwen2 import SHAPE_TRUE

    dims = dataclasses.replace(SHAPE_TRUE["qwen2_vl"], text_layers=layers, vision_depth=vision_depth)
    tokenizer = tiny.build_tokenizer(0)
    processor = tiny.build_processor("qwen2_vl", tokenizer)
    torch.manual_seed(0)
    model = Qwen2VLForConditionalGeneration(tiny.build_config("qwen2_vl", dims, tokenizer)).to(torch.bfloat16)
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out, params


def _worker(rank: int, world: int, init: str, model_dir: str, out: str, way: str, prepare: bool) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(WORLD_SIZE=str(world), RANK=str(rank), LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    import contextlib

    from mmgpg.backends import OptimizerSettings
    from mmgpg.backends.deepspeed import DeepSpeedBackend
    from mmgpg.config import resolve
    from mmgpg.models.load import load_for_training

    cfg = resolve([f"model.name_or_path={model_dir}", "train.backend=deepspeed", "train.zero_stage=3",
                   "model.dtype=float32"]).config
    backend = DeepSpeedBackend(cfg)
    dist.barrier()
    before = _rss_mib()
    t0 = time.perf_counter()
    with backend.loading() if way == "partitioned" else contextlib.nullcontext():
        policy = load_for_training(cfg.model, backend.device, "float32")
    load_s = time.perf_counter() - t0
    after_load = _peak_mib()
    if prepare:
        backend.prepare(policy.model, OptimizerSettings(learning_rate=1e-6))
    result = {"rank": rank, "before": before, "peak_load": after_load, "peak_prepare": _peak_mib(), "load_s": load_s}
    Path(f"{out}/rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def run(model_dir: Path, way: str, prepare: bool) -> list[dict]:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(2, f"{tmp}/init", str(model_dir), tmp, way, prepare), nprocs=2, join=True)
        return [json.loads(Path(f"{tmp}/rank{r}.json").read_text()) for r in (0, 1)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vision-depth", type=int, default=2)
    ap.add_argument("--skip-prepare", action="store_true",
                    help="measure loading only (no optimizer state: lets a deeper model fit in host memory)")
    ap.add_argument("--out", type=Path, help="write the table here (appended to when the file exists)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir, params = build(Path(tmp) / "model", args.layers, args.vision_depth)
        rows = {way: run(model_dir, way, not args.skip_prepare) for way in WAYS}
    load = os.getloadavg()
    lines = [f"Qwen2-VL-2B widths, {args.layers} language layers, {args.vision_depth} vision blocks: {params / 1e6:.0f}M "
             f"parameters ({params * 4 / 2**20:.0f} MiB in float32); 2 ranks (gloo, CPU), ZeRO-3; load average "
             f"{load[0]:.1f} at the end.", "",
             "| way | RSS before loading (MiB) r0 / r1 | peak after loading r0 / r1 | loading adds r0 / r1 "
             f"| peak after {'loading' if args.skip_prepare else 'prepare'} r0 / r1 | load s r0 / r1 |",
             "|---|---|---|---|---|---|"]
    def pair(ranks, key, fmt="{:.0f}"):
        return " / ".join(fmt.format(r[key]) for r in ranks)

    for way, ranks in rows.items():
        added = " / ".join(f"{r['peak_load'] - r['before']:.0f}" for r in ranks)
        lines.append(f"| {way} | {pair(ranks, 'before')} | {pair(ranks, 'peak_load')} | {added} "
                     f"| {pair(ranks, 'peak_prepare')} | {pair(ranks, 'load_s', '{:.1f}')} |")
    full, part = rows["full"], rows["partitioned"]
    ratios = [(f["peak_prepare"] - f["before"]) / max(p["peak_prepare"] - p["before"], 1.0) for f, p in zip(full, part)]
    lines += ["", "full / partitioned, peak growth over the pre-load RSS until after "
              f"{'loading' if args.skip_prepare else 'prepare'}: "
              + " / ".join(f"{x:.2f}x" for x in ratios) + " (rank 0 / rank 1)"]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with args.out.open("a") as f:
            f.write(("\n" if f.tell() else "") + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
