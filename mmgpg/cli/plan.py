"""``mmgpg plan`` (and the memory row of ``mmgpg check``): the command line and the printed table of
:mod:`mmgpg.backends.memory`."""

from __future__ import annotations

import argparse

from mmgpg.backends import BACKENDS
from mmgpg.backends.memory import GIB, OFFLOADS, Plan, model_shape, plan_memory
from mmgpg.cli.common import add_config_args, float_in, int_in

ROWS = (
    ("parameters", "parameters"), ("gradients", "gradients"), ("optimizer", "optimizer state"),
    ("zero3_gathered_layer", "ZeRO-3 gathered layer"), ("reference_model", "reference model (kl_coef > 0)"),
    ("activations_text", "activations, language model"), ("activations_vision", "activations, vision tower"),
    ("autocast_weight_copies", "bf16 weight copies (autocast)"), ("logprob_buffers", "log-prob chunk buffers"),
    ("kv_cache", "rollout KV cache"), ("rollout_gathered_weights", "16-bit weights gathered for generate"),
    ("vllm_engine", "vLLM engine share"), ("vllm_sync_tensor", "vLLM weight sync, one tensor"),
)
VLLM_ROWS = ("vllm_engine", "vllm_sync_tensor")  # only with rollout.engine=vllm colocated


def gib(n: float) -> str:
    return f"{n / GIB:.2f}"


def setup_label(setup: dict) -> str:
    """The plan's backend setup as its backend names it (``plain``, ``deepspeed ZeRO-3 + optimizer offload``)."""
    from mmgpg.backends import backend_fact

    return backend_fact(setup["backend"], "label")(setup["zero_stage"], setup["offload"])


def format_plan(plan: Plan) -> str:
    s, w, mdl = plan.setup, plan.workload, plan.model
    lora = f", LoRA rank {mdl['lora_rank']}: {mdl['trainable_params'] / mdl['params']:.2%}" if mdl["lora_rank"] else ""
    lines = [
        f"mmgpg plan: {mdl['name_or_path']} ({mdl['params'] / 1e9:.2f} B parameters, "
        f"{mdl['trainable_params'] / 1e9:.2f} B trainable{lora}), {setup_label(s)}, precision {s['precision']}, "
        f"{s['nodes']} node(s) x {s['gpus_per_node']} GPU(s) of {s['gpu_memory_gib']:g} GiB",
        f"micro-batch: {w['micro_batch_sequences']} sequences x {w['sequence_length']} tokens, "
        + (f"{w['images_per_micro_batch']} image(s) x {w['patches_per_image']} patches"
           + (f" (videos of {w['frames_per_video']} frames count as frames / 2 images of "
              f"{w['patches_per_video_frame']} patches)" if "frames_per_video" in w
              else "") if "images_per_micro_batch" in w else "no images (text-only model)") + "; rollout: "
        f"{w['rollout_sequences_per_rank']} sequences per GPU; gradient checkpointing "
        f"{'on' if w['gradient_checkpointing'] else 'off'}",
        "",
        f"{'per GPU':<40}{'GiB':>9}",
    ]
    e = plan.engine
    for key, label in ROWS:
        if key in plan.per_gpu_bytes:  # a text-only model has no vision rows, an HF rollout no vLLM rows
            if key == "vllm_engine":
                label += " (update: freed)" if e["sleeps"] else " (all phases)"
            lines.append(f"  {label:<38}{gib(plan.per_gpu_bytes[key]):>9}")
    ph = plan.phases
    lines += [
        f"{'persistent':<40}{gib(ph['persistent']):>9}",
        f"{'update phase (activations, buffers)':<40}{gib(ph['update']):>9}",
        f"{'rollout phase (KV cache, gathers)':<40}{gib(ph['rollout']):>9}",
        f"{'peak = persistent + max(update, rollout)':<40}{gib(ph['peak']):>9}",
        f"{'usable (GPU memory - reserve)':<40}{gib(plan.usable_bytes):>9}",
    ]
    if plan.host_bytes_per_node:
        lines.append(f"{'host memory per node (offload, sleep)':<40}{gib(plan.host_bytes_per_node):>9}")
    lines += engine_lines(plan)
    ds = plan.deepspeed
    if ds.get("available"):
        lines.append(f"DeepSpeed estimator ({ds['function'].rsplit('.', 1)[1]}): {gib(ds['gpu_bytes'])} GiB per GPU, "
                     f"{gib(ds['cpu_bytes_per_node'])} GiB per node CPU; ours for the same model states: "
                     f"{gib(ds['ours_model_states_bytes'])} GiB per GPU")
    else:
        lines.append(f"DeepSpeed estimator: {ds['note']}")
    if plan.fits:
        lines.append(f"fits: peak {gib(ph['peak'])} GiB <= {gib(plan.usable_bytes)} GiB usable")
    else:
        why = (f"peak {gib(ph['peak'])} GiB > {gib(plan.usable_bytes)} GiB usable" if ph["peak"] > plan.usable_bytes
               else f"peak {gib(ph['peak'])} GiB fits, but the vLLM engine cannot start (above)")
        lines.append(f"DOES NOT FIT: {why}. Changes that would fit:")
        lines += [f"  - {fix}" for fix in plan.fixes]
    return "\n".join(lines)


def engine_lines(plan: Plan) -> list[str]:
    """What the rollout engine takes: nothing beyond the rows above for HF generate; vLLM's share or its server GPU."""
    e = plan.engine
    if e.get("name") != "vllm":
        return []
    tp = e["tensor_parallel_size"]
    split = (f"; tensor parallel {tp}: each of {tp} GPUs holds 1/{tp} of the weights and "
             f"{'1/' + str(tp) + ' of ' if tp > 1 else ''}the KV heads" if tp > 1 else "")
    if e["mode"] == "server":
        need = (f"vLLM server GPU (not the training GPUs): weights {gib(e['weights_bytes'])} GiB ({e['dtype']}) + KV "
                f"cache {gib(e['kv_bytes_all_sequences'])} GiB for all {e['rollout_sequences']} sequences x "
                f"{e['max_model_len']} tokens = {gib(e['needed_bytes'])} GiB per server GPU{split}; start mmgpg "
                f"vllm-serve with --gpu-memory-utilization >= {e['needed_bytes'] / GIB / plan.setup['gpu_memory_gib']:.2f}"
                " on a GPU of the same size")
        start = ("" if e["starts"] else f"; it CANNOT START: weights + one sequence = {gib(e['minimum_bytes'])} GiB "
                 "exceed the usable memory")
        return [need + start]
    share = (f"vLLM colocated: {e['gpu_memory_utilization']:g} x {plan.setup['gpu_memory_gib']:g} GiB = "
             f"{gib(e['share_bytes'])} GiB per GPU, taken at start-up: weights {gib(e['weights_bytes'])} GiB "
             f"({e['dtype']}), the rest ({gib(e['kv_capacity_bytes'])} GiB) KV cache, {e['concurrent_sequences']} of "
             f"the {e['rollout_sequences']} rollout sequences x {e['max_model_len']} tokens at once{split}; "
             + ("rollout.vllm_sleep frees the share during the update (weights to host memory), so it counts in the "
                "rollout phase only" if e["sleeps"] else "resident in every phase (rollout.vllm_sleep=true frees it "
                "during the update)"))
    if not e["starts"]:
        share += (f"; vLLM CANNOT START: its weights + one sequence's KV cache "
                  f"({gib(e['weights_bytes'] + e['kv_bytes_per_token'] * e['max_model_len'])} GiB) exceed its share")
    return [share]


MAX_GPUS_PER_NODE, MAX_NODES, MAX_GPU_MEMORY_GB, MAX_IMAGES_PER_PROMPT = 64, 100_000, 10_000.0, 1_000
"""Bounds of the hardware flags: far beyond any machine, they only catch typos (``--gpus -1``, ``--gpu-memory-gb
nan``, ``8e9``) that would otherwise crash the planner or print a nonsense plan."""


def add_hardware_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    """The GPUs and the backend to plan for (``mmgpg plan``; optional on ``mmgpg check``)."""
    p.add_argument("--gpus", type=int_in(1, MAX_GPUS_PER_NODE), required=required,
                   help=f"GPUs per node (1-{MAX_GPUS_PER_NODE})")
    p.add_argument("--nodes", type=int_in(1, MAX_NODES), default=1, help=f"nodes (default 1; at most {MAX_NODES})")
    p.add_argument("--gpu-memory-gb", type=float_in(0, MAX_GPU_MEMORY_GB, low_open=True), required=required,
                   help=f"memory of one GPU in GiB (e.g. 80; above 0, at most {MAX_GPU_MEMORY_GB})")
    p.add_argument("--reserve-gb", type=float_in(0, MAX_GPU_MEMORY_GB), default=2.0,
                   help="kept free for the CUDA context, NCCL buffers and fragmentation (default 2 GiB; a judgement; "
                   "less than --gpu-memory-gb)")
    p.add_argument("--backend", choices=list(BACKENDS), default=None, help="default: train.backend")
    p.add_argument("--zero-stage", type=int, choices=(0, 1, 2, 3), default=None,
                   help="DeepSpeed ZeRO stage (default: train.zero_stage with the deepspeed backend)")
    p.add_argument("--offload", choices=OFFLOADS, default=None,
                   help="DeepSpeed offload to host memory (default: from train.offload_optimizer/offload_params)")
    p.add_argument("--images-per-prompt", type=int_in(0, MAX_IMAGES_PER_PROMPT), default=1,
                   help=f"images in each prompt (default 1; 0 for text prompts; at most {MAX_IMAGES_PER_PROMPT})")
    p.add_argument("--videos-per-prompt", type=int_in(0, MAX_IMAGES_PER_PROMPT), default=0,
                   help="videos in each prompt (default 0), of model.video_max_frames frames of at most "
                   "model.max_pixels each, within model.video_total_pixels per video")


def backend_setup(cfg, args) -> tuple[str, int, str]:
    """(backend, ZeRO stage, offload) to plan for: the flags where given, otherwise what the backend makes of the
    config's ``train.*`` keys (its ``zero_stage`` and ``offload`` facts)."""
    import dataclasses

    from mmgpg.backends import backend_fact

    backend = args.backend or cfg.train.backend
    train = dataclasses.replace(cfg.train, backend=backend)
    stage = args.zero_stage if args.zero_stage is not None else backend_fact(backend, "zero_stage")(train)
    return backend, stage, args.offload if args.offload is not None else backend_fact(backend, "offload")(train)


def plan_from_args(cfg, args) -> Plan:
    if args.reserve_gb >= args.gpu_memory_gb:
        raise ValueError(f"--reserve-gb {args.reserve_gb:g} leaves nothing of --gpu-memory-gb {args.gpu_memory_gb:g}: "
                         "the reserve must be less than one GPU's memory (default 2)")
    backend, stage, offload = backend_setup(cfg, args)
    return plan_memory(cfg, model_shape(cfg.model.name_or_path, cfg.model.lora), gpus=args.gpus, nodes=args.nodes,
                       gpu_memory_gb=args.gpu_memory_gb, backend=backend, zero_stage=stage,
                       offload=offload, reserve_gb=args.reserve_gb, images_per_prompt=args.images_per_prompt,
                       videos_per_prompt=args.videos_per_prompt)


def register(sub) -> None:
    p = sub.add_parser(
        "plan", help="per-GPU memory of a training config (no weights read); exit 1 when it does not fit",
        description="Build the configured model on the meta device and print, per GPU, parameters, gradients, "
        "optimizer state, the reference model, activations of one micro-batch, the log-prob chunk buffers and the "
        "rollout's KV cache for the chosen backend, ZeRO stage and offload, with DeepSpeed's own estimate beside "
        "ours. Exit status 1 (with the changes that would fit) when the peak exceeds --gpu-memory-gb minus "
        "--reserve-gb. Example: mmgpg plan model.name_or_path=DIR --gpus 8 --gpu-memory-gb 80 --backend deepspeed "
        "--zero-stage 3. See docs/plan.md.")
    add_config_args(p)
    add_hardware_args(p)
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=cmd_plan)


def cmd_plan(args) -> int:
    import json

    from mmgpg.config import resolve

    plan = plan_from_args(resolve(list(args.overrides), config_dirs=args.config_dir).config, args)
    print(json.dumps(plan.to_json(), indent=2) if args.json else format_plan(plan))
    return 0 if plan.fits else 1


def memory_summary(plan: Plan) -> str:
    """One line for ``mmgpg check``."""
    s = plan.setup
    setup = setup_label(s)
    verdict = "fits" if plan.fits else "does not fit; changes that would fit: " + "; ".join(plan.fixes)
    e = plan.engine
    if e.get("mode") == "colocated":
        setup += (f", vLLM share {gib(e['share_bytes'])} GiB" + (" (freed in the update)" if e["sleeps"] else "")
                  + ("" if e["starts"] else ", too small for vLLM to start"))
    elif e.get("mode") == "server":
        setup += f", vLLM server GPU needs {gib(e['needed_bytes'])} GiB" + ("" if e["starts"] else " (cannot start)")
    return (f"peak {gib(plan.phases['peak'])} GiB per GPU vs {gib(plan.usable_bytes)} usable on "
            f"{s['nodes']}x{s['gpus_per_node']} GPUs, {setup}: {verdict} (details: mmgpg plan)")


def memory_finding(cfg, args):
    """``mmgpg check``'s memory row: an error when the plan does not fit."""
    from mmgpg.evaluation.preflight import Finding

    if args.gpus is None or args.gpu_memory_gb is None:
        raise ValueError("the memory check needs both --gpus and --gpu-memory-gb")
    from mmgpg.models import declared_model_type
    from mmgpg.models import family as family_spec

    model_type = declared_model_type(cfg.model.name_or_path)
    if model_type is not None and not family_spec(model_type).planned_layers:  # the rest of the check still runs
        return Finding("memory", "warn", f"not planned: mmgpg plan does not model the {family_spec(model_type).title} "
                       "decoder layers yet (docs/training.md, 'Model families')")
    plan = plan_from_args(cfg, args)
    return Finding("memory", "ok" if plan.fits else "error", memory_summary(plan))
