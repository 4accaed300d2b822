"""LoRA vs full fine-tuning on CPU: trainable parameter share, peak resident memory and step time of `mmgpg train`.

Each configuration runs the real trainer (GPG on the `shapes_parity` task, whose length-parity reward gives every
group variance, so every step updates) in a fresh child process, which reports its own peak RSS (ru_maxrss) and the
median `time/update` and `time/step` of the steps after the first (warm-up).

Model sizes (random weights, float32):

* ``tiny`` — mmgpg's ~1 M-parameter Qwen2-VL (vocabulary 1,024).
* ``vocab_true`` — Qwen2-VL-2B's true vocabulary and language-model width (V 151,936, H 1,536, FFN 8,960, tied
  embeddings) with the language model cut to 2 layers and the tiny vision tower: the largest shape-true-vocabulary
  model whose *full* fine-tuning (16 bytes per parameter of weights, gradients and AdamW state) fits in the ~12 GB
  this shared 2-core machine has free. The full 28-layer 2B does not (2.2 B x 16 bytes = 35 GB).

    python bench/lora_step.py                                  # both sizes, full vs LoRA r=16 (alpha 32)
    python bench/lora_step.py --sizes tiny --steps 6 --out bench/results/lora.md
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def build(size: str, out: Path) -> Path:
    import torch
    from transformers import Qwen2VLForConditionalGeneration

    from mmgpg.models.tiny import TINY, Dims, build_config, build_processor, build_tokenizer

    tok = build_tokenizer()
    d = TINY if size == "tiny" else Dims(151936, 1536, 8960, 2, 12, 2, (16, 24, 24), 1e6, True, 2, 64, 4, 128)
    torch.manual_seed(0)
    model = Qwen2VLForConditionalGeneration(build_config("qwen2_vl", d, tok))
    gen = model.generation_config
    gen.eos_token_id = [tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")]
    gen.pad_token_id = gen.bos_token_id = tok.convert_tokens_to_ids("<|endoftext|>")
    model.save_pretrained(out)
    build_processor("qwen2_vl", tok).save_pretrained(out)
    return out


def child(model_dir: str, rank: int, steps: int, threads: int, run_dir: str) -> dict:
    import torch

    from mmgpg.config import resolve
    from mmgpg.models import lora
    from mmgpg.train.trainer import Trainer

    torch.set_num_threads(threads)
    args = ["task=shapes_parity", f"model.name_or_path={model_dir}", "model.dtype=float32", "model.max_pixels=12544",
            "device=cpu", "rollout.group_size=4", "rollout.max_new_tokens=16", "train.prompts_per_step=2",
            "train.micro_batch_prompts=2", f"train.max_steps={steps}", "train.save_every=0", "train.progress=false",
            "train.tensorboard=false", "algo.min_valid_fraction=0", f"output_dir={run_dir}",
            f"model.lora.rank={rank}", "train.learning_rate=1e-4"]
    trainer = Trainer(resolve(args))
    base = sum(p.numel() for n, p in trainer.policy.model.named_parameters() if "lora_" not in n)
    counts = lora.trainable_summary(trainer.policy.model)
    rows = [trainer.train_step() for _ in range(steps)]
    # Steps after the first (warm-up) whose update ran (a step whose groups all have zero variance skips it).
    updated = [r for r in rows[1:] if r["grad_norm"] > 0] or rows
    return {"trainable": counts["trainable"], "base_params": base,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "update_s": statistics.median(r["time/update"] for r in updated),
            "step_s": statistics.median(r["time/step"] for r in updated),
            "updated_steps": len(updated)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", nargs="+", default=["tiny", "vocab_true"], choices=["tiny", "vocab_true"])
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", help="append the markdown table to this file")
    ap.add_argument("--child", nargs=2, metavar=("MODEL_DIR", "RANK"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        with tempfile.TemporaryDirectory() as run:
            print(json.dumps(child(args.child[0], int(args.child[1]), args.steps, args.threads, run + "/run")))
        return
    lines = [f"`python bench/lora_step.py --sizes {' '.join(args.sizes)} --rank {args.rank} --steps {args.steps} "
             f"--threads {args.threads}` (GPG, 2 prompts x G=4, 16 new tokens, float32; medians over the steps 2..{args.steps} "
             "that updated, their number in the last column)",
             "", "| model | mode | trainable params | share | peak RSS MB | update s | step s | steps |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            model_dir = build(size, Path(tmp) / size)
            for rank in (0, args.rank):
                out = subprocess.run([sys.executable, __file__, "--child", str(model_dir), str(rank), "--steps",
                                      str(args.steps), "--threads", str(args.threads)], capture_output=True, text=True,
                                     cwd=REPO)
                if out.returncode:
                    raise SystemExit(out.stderr[-3000:])
                r = json.loads(out.stdout.strip().splitlines()[-1])
                mode = "full" if rank == 0 else f"LoRA r={rank}"
                lines.append(f"| {size} | {mode} | {r['trainable']:,} | {r['trainable'] / r['base_params']:.2%} | "
                             f"{r['peak_rss_mb']:.0f} | {r['update_s']:.3f} | {r['step_s']:.3f} | {r['updated_steps']} |")
                print(lines[-1], flush=True)
    table = "\n".join(lines)
    print(table)
    if args.out:
        with open(args.out, "a") as f:
            f.write(table + "\n\n")


if __name__ == "__main__":
    main()
