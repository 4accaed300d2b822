"""The memory planner's table for the Qwen2-VL-2B and Qwen2.5-VL-7B shapes, with DeepSpeed's estimator beside it.

Writes the real dimensions of both models as config-only directories (``mmgpg model tiny --config-only``: no
weights), plans the default training config (``model=qwen2_vl_2b`` / ``model=qwen2_5_vl_7b``; micro-batch 2 prompts
x G=8, 1024 prompt + 256 completion tokens, 8 prompts per step) on 8 GPUs of 80 GiB with the plain backend, ZeRO-2,
ZeRO-3 and ZeRO-3 + optimizer offload, each with gradient checkpointing off and on, and appends the verbatim output
of DeepSpeed's ``estimate_zero{2,3}_model_states_mem_needs_all_cold`` for the same parameter counts.

    python bench/plan_table.py --out bench/results/plan.md
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import tempfile
from pathlib import Path

MODELS = (("Qwen2-VL-2B", "qwen2_vl_2b", "qwen2_vl", "shape_true"),
          ("Qwen2.5-VL-7B", "qwen2_5_vl_7b", "qwen2_5_vl", "shape_true_7b"))
SETUPS = (("plain", "plain", 0, "none"), ("ZeRO-2", "deepspeed", 2, "none"), ("ZeRO-3", "deepspeed", 3, "none"),
          ("ZeRO-3 + optimizer offload", "deepspeed", 3, "optimizer"),
          ("ZeRO-3 + optimizer+params offload", "deepspeed", 3, "optimizer+params"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--gpu-memory-gb", type=float, default=80)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from mmgpg.backends.memory import model_shape, plan_memory
    from mmgpg.cli.plan import gib
    from mmgpg.config import resolve
    from mmgpg.models.tiny import save_config_only

    lines = [f"# `python bench/plan_table.py{' --out ' + args.out if args.out else ''}`", ""]
    lines += [f"`mmgpg plan` on {args.gpus} x {args.gpu_memory_gb:g} GiB, 1 node, for the real dimensions of each model "
              "(config-only directories written by `mmgpg model tiny --size shape_true|shape_true_7b --config-only`); "
              "the default training config: micro-batch 2 prompts x G=8 = 16 sequences of 1024 + 256 tokens, one "
              "image of <= 401,408 pixels (2,048 patches) per prompt, 8 prompts per step, no reference model. "
              "GiB per GPU; peak = persistent + max(update, rollout); usable = 80 - 2 GiB reserve. `DS` = DeepSpeed "
              "0.19.8's estimator for the model states (parameters, gradients, optimizer, ZeRO-3 gathered layer) "
              "and `ours` = the same states by the planner. One command per row: "
              "`mmgpg plan model=M model.name_or_path=DIR [train.gradient_checkpointing=true] --gpus 8 "
              "--gpu-memory-gb 80 [--backend deepspeed --zero-stage S --offload O]`.", ""]
    header = ("| model | setup | ckpt | params | grads | optim | ZeRO-3 layer | activations | log-prob | KV cache "
              "| gathered for generate | peak | fits | ours states | DS states | DS CPU/node |")
    lines += [header, "|" + "|".join(["---"] * 16) + "|"]
    ds_text = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, group, family, size in MODELS:
            path = save_config_only(Path(tmp) / group, family, size)
            shape = model_shape(str(path))
            for ckpt in (False, True):
                cfg = resolve([f"model={group}", f"model.name_or_path={path}",
                               f"train.gradient_checkpointing={str(ckpt).lower()}"]).config
                for name, backend, stage, offload in SETUPS:
                    p = plan_memory(cfg, shape, gpus=args.gpus, gpu_memory_gb=args.gpu_memory_gb, backend=backend,
                                    zero_stage=stage, offload=offload, with_fixes=False)
                    b, ds = p.per_gpu_bytes, p.deepspeed
                    act = b["activations_text"] + b["activations_vision"] + b["autocast_weight_copies"]
                    states = b["parameters"] + b["gradients"] + b["optimizer"] + b["zero3_gathered_layer"]
                    lines.append(
                        f"| {label} | {name} | {'on' if ckpt else 'off'} | {gib(b['parameters'])} | "
                        f"{gib(b['gradients'])} | {gib(b['optimizer'])} | {gib(b['zero3_gathered_layer'])} | "
                        f"{gib(act)} | {gib(b['logprob_buffers'])} | {gib(b['kv_cache'])} | "
                        f"{gib(b['rollout_gathered_weights'])} | **{gib(p.phases['peak'])}** | "
                        f"{'yes' if p.fits else 'NO'} | {gib(states)} | "
                        + (f"{gib(ds['gpu_bytes'])} | {gib(ds['cpu_bytes_per_node'])} |" if ds.get("available")
                           else "- | - |"))
            ds_text.append(_deepspeed_output(label, shape, args.gpus))
    lines += ["", "`activations` includes the bf16 weight copies autocast keeps on the plain backend (2 bytes/param; "
              "they also count in the rollout phase). "
              "`ours states` - `DS states` is 2·P/8 for ZeRO-3 without offload: DeepSpeed's ZeRO-3 figure leaves out "
              "the rank's 2-byte parameter partition (its byte list is grads 2 + 4, master 4, Adam 8 = 18); the "
              "other rows agree to the byte. DeepSpeed's CPU column includes its 1.5x buffer factor.", ""]
    lines += ["## DeepSpeed's estimator output (verbatim)", ""] + ds_text
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


def _deepspeed_output(label: str, shape, gpus: int) -> str:
    try:
        with contextlib.redirect_stdout(sys.stderr):
            from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs_all_cold
            from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs_all_cold
    except ImportError:
        return f"{label}: deepspeed is not installed; skipped.\n"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        estimate_zero2_model_states_mem_needs_all_cold(shape.params, num_gpus_per_node=gpus)
        estimate_zero3_model_states_mem_needs_all_cold(shape.params, shape.largest_layer_params, num_gpus_per_node=gpus)
    return (f"{label} (total {shape.params:,} parameters, largest layer {shape.largest_layer_params:,}):\n\n```\n"
            + out.getvalue() + "```\n")


if __name__ == "__main__":
    main()
