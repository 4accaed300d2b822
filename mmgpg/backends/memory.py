"""``mmgpg plan``: per-GPU memory of a training configuration, before any GPU time is spent.

The model is built on the meta device from its ``config.json`` (no weights are read), so parameter counts are the
real ones; the rest are the formulas below, each a small pure function with its source. A step has three phases
that do not overlap in time, so the peak is ``persistent + max(update, rollout)``:

* **persistent** — parameters, gradients, optimizer state, the GRPO reference model (``algo.kl_coef > 0``) and, under
  ZeRO-3, the gathered working set of one layer;
* **update** — activations of one micro-batch, the chunked log-prob buffers and (plain backend under bf16
  autocast) the bf16 weight copies autocast keeps during forward and backward;
* **rollout** — the KV cache of generation, the same autocast weight copies, and under ZeRO-3 the 16-bit weights
  gathered once for ``generate``.

With ``rollout.engine=vllm`` colocated, HF generate's terms are replaced by vLLM's share of the GPU
(:func:`mmgpg.backends.engine_memory.vllm_engine_plan`): resident in every phase, or only in the rollout phase with ``rollout.vllm_sleep``. With
``rollout.vllm_server`` the training GPUs hold no engine and the server's own GPU gets a line of its own.

The backend, ZeRO stage and offload are plain arguments of :func:`plan_memory`; today they come from the command's
flags (``train.backend`` / ``train.zero_stage`` / ``train.offload_*`` config keys are planned to become their
defaults). DeepSpeed's own model-state estimators are printed beside ours when ``deepspeed`` is installed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from mmgpg.backends.engine_memory import VLLM_MARGIN_GIB, engine_plan
from mmgpg.backends.model_shape import VISION_FIELDS, ModelShape, model_shape  # noqa: F401 (model_shape: the planner's API)

GIB = 2**30
OFFLOADS = ("none", "optimizer", "optimizer+params")
# The precision of the training forward: "autocast" = fp32 weights under bf16 autocast (the plain backend on a
# bf16 GPU with model.dtype=auto: mmgpg/train/trainer.py), "fp32" = everything fp32, "bf16" = 16-bit weights, no autocast
# (model.dtype=bfloat16/float16, and DeepSpeed's bf16 mode with fp32 master weights inside the optimizer).
PRECISIONS = ("autocast", "fp32", "bf16")


# --------------------------------------------------------------------------------------------------------------------
# Formulas (bytes). P = parameters, T = trainable parameters, N = world size (GPUs x nodes).
# --------------------------------------------------------------------------------------------------------------------


def model_state_bytes(params: int, trainable: int, world: int, backend: str, zero_stage: int, offload: str,
                      precision: str) -> dict[str, int]:
    """Per-GPU parameters, gradients and optimizer state, and what offload puts in host memory (per rank).

    plain (mmgpg/train/trainer.py: torch AdamW, gradients summed over ranks, nothing partitioned):
      weights w·P, gradients w·T, AdamW m and v 2w·T, with w = 4 (fp32 master weights under bf16 autocast, or
      fp32) or 2 (model.dtype=bfloat16: AdamW keeps its state in the parameter dtype) — 16 bytes/param by default.
    deepspeed (bf16 with fp32 master weights; ZeRO paper, Rajbhandari et al. 2020, and the byte list of
    deepspeed.runtime.zero.stage_1_and_2.estimate_zero2_model_states_mem_needs):
      16-bit parameters 2·P, 16-bit gradients 2·T, and 16·T of fp32 state: master weights 4, gradients 4, m and v 8.
      Stage 1 partitions the fp32 state (/N), stage 2 also the 16-bit gradients, stage 3 also the 16-bit
      parameters. Offloading the optimizer moves the fp32 state and (stages 2-3) the gradients to the host;
      offloading parameters (stage 3) moves the 16-bit parameter partition too.
    """
    if backend == "plain":
        w = 2 if precision == "bf16" else 4
        return {"parameters": w * params, "gradients": w * trainable, "optimizer": 2 * w * trainable, "host": 0}
    opt_off, param_off = offload != "none", offload == "optimizer+params"
    p16 = 2 * params / world if zero_stage == 3 else 2 * params
    g16 = 2 * trainable / world if zero_stage >= 2 else 2 * trainable
    fp32_state = 16 * trainable / world if zero_stage >= 1 else 16 * trainable
    host = 0.0
    if opt_off:
        host += fp32_state + (g16 if zero_stage >= 2 else 0)
        fp32_state, g16 = 0, (0 if zero_stage >= 2 else g16)
    if param_off:
        host, p16 = host + p16, 0
    return {"parameters": int(p16), "gradients": int(g16), "optimizer": int(fp32_state), "host": int(host)}


def zero3_working_set_bytes(largest_layer_params: int) -> int:
    """ZeRO-3 gathers each layer's 16-bit parameters (and produces its 16-bit gradient) before partitioning them
    again: 4 bytes x the largest layer, the same term as DeepSpeed's ``estimate_zero3_model_states_mem_needs``."""
    return 4 * largest_layer_params


def layer_activation_bytes_per_token(hidden: int, intermediate: int, heads: int, seq_len: int, precision: str,
                                     kv_dim: int | None = None, masked: bool = True, q_dim: int | None = None,
                                     kv_heads: int = 0, qk_norm: bool = False) -> int:
    """Bytes one decoder layer saves for backward per token (HF Qwen2 / Qwen3 layer, SDPA, no dropout).

    Counted tensor by tensor (h = hidden, q = the query width heads x head_dim, I = intermediate, a = heads,
    s = padded sequence length): two RMSNorms (input, 1/rms, normalised output), the inputs of the q/k/v/o and
    gate/up/down projections, SDPA's q, k, v, output and log-sum-exp, and the SwiGLU intermediates (4·I). In a padded
    batch (``masked``, every RL batch) transformers passes a mask to SDPA, so it repeats the KV heads (k and v saved at
    width K = q) and SDPA turns the boolean mask into a float bias of s per token (b = s); without a mask K =
    ``kv_dim`` and b = 0:

    * fp32:      4·(6h + 2q + 2K + 4I + a + 2) + 4b
    * bf16:      16h + 4q + 4K + 8I + 4a + 8 + 2b      (norms compute in fp32: their input and 1/rms are fp32 copies)
    * autocast:  26h + 4q + 4K + 8I + 4a + 8 + 2b      (fp32 residual stream and norms; each projection saves its own
                                                        bf16 cast of its input; autocast's weight copies are separate)

    Qwen2's layer has q = h (its head_dim is hidden / heads): fp32 4·(8h + 2K + 4I + a + 2) + 4b. Qwen3's layer
    (``qk_norm``: Qwen3, Qwen3-VL) normalises every query and key head with an RMSNorm before the rotary embedding,
    which saves their inputs, 1/rms and outputs, with kvw = ``kv_dim`` (the unrepeated key width) and g = ``kv_heads``:
    fp32 + 4·(2q + 2kvw + a + g), bf16 and autocast + 6q + 6kvw + 4a + 4g; and its q is heads x head_dim, which is
    not h in every size (Qwen3-VL-4B: 32 x 128 = 4096 for h = 2560).

    All equal the bytes torch.autograd.graph.saved_tensors_hooks sees on CPU (tests/unit/backends/test_memory.py:
    Qwen2 fp32 and bf16 padded and unpadded, autocast unpadded; Qwen3 and Qwen3-VL's text stack in all three
    precisions, padded and unpadded, at shapes with q != h). For comparison, Korthikanti et al. 2022
    (arXiv:2205.05198) give 34·h bytes per token per layer for a GPT layer in 16-bit with a 4h MLP, plus 5·a·s
    without flash attention.
    """
    q = hidden if q_dim is None else q_dim
    kvw = kv_dim if kv_dim is not None else q
    k = q if masked else kvw
    bias = seq_len if masked else 0
    norms = (2 * q + 2 * kvw + heads + kv_heads) if qk_norm else 0  # the q/k norms' elements (fp32 in every precision)
    if precision == "fp32":
        return 4 * (6 * hidden + 2 * q + 2 * k + 4 * intermediate + heads + 2) + 4 * bias + 4 * norms
    extra = (6 * q + 6 * kvw + 4 * heads + 4 * kv_heads) if qk_norm else 0
    if precision == "bf16":
        return 16 * hidden + 4 * q + 4 * k + 8 * intermediate + 4 * heads + 8 + 2 * bias + extra
    if precision == "autocast":
        return 26 * hidden + 4 * q + 4 * k + 8 * intermediate + 4 * heads + 8 + 2 * bias + extra
    raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}; got {precision!r}")


def vision_layer_bytes_per_patch(family: str, hidden: int, intermediate: int, precision: str) -> int:
    """Bytes one vision-tower block saves for backward per patch (D = vision width, M = its MLP width), ``a·D + b·M +
    c`` with the family's own coefficients (``Family.vision_block_bytes``), e.g.

    * Qwen2-VL (LayerNorm, fc1 -> QuickGELU -> fc2):  fp32 44D + 12M + 32;  bf16 22D + 6M + 24
    * Qwen2.5-VL (RMSNorm, SwiGLU):                    fp32 52D + 16M + 24;  bf16 30D + 8M + 24
    * Qwen3-VL (LayerNorm, linear_fc1 -> GELU -> linear_fc2): fp32 44D + 8M + 32;  bf16 22D + 4M + 24

    The coefficients are the saved bytes torch.autograd.graph.saved_tensors_hooks measures on CPU, solved from three
    (D, M) pairs; tests/unit/backends/test_memory.py checks them at a fourth. Linear in the patch count (attention runs per image with
    SDPA). Under autocast the fp32 count is used: an upper bound (not measured here: CPU autocast differs from CUDA's).
    A family that declares none is refused with a clear message: the planner does not guess.
    """
    from mmgpg.models import family as family_spec

    spec = family_spec(family)
    if spec.vision_block_bytes is None:
        raise ValueError(f"mmgpg plan does not model the {spec.title} vision tower's activations (its Family declares "
                         "no vision_block_bytes); plan with train.freeze_vision=true, or measure them as "
                         "tests/unit/backends/test_memory.py does")
    fp32, bf16 = spec.vision_block_bytes
    a, b, c = bf16 if precision == "bf16" else fp32
    return a * hidden + b * intermediate + c


def checkpointed_layer_bytes_per_token(hidden: int, precision: str) -> int:
    """With gradient checkpointing each layer keeps only its input (the residual stream: fp32 unless the weights
    are 16-bit); one layer's full activations are recomputed at a time in backward."""
    return (2 if precision == "bf16" else 4) * hidden


def activation_bytes(tokens: int, layers: int, per_token_layer: int, per_token_checkpointed: int,
                     checkpointing: bool) -> int:
    """All layers of a stack: ``tokens·layers·per_token_layer`` without checkpointing;
    ``tokens·(layers·per_token_checkpointed + per_token_layer)`` with it (inputs kept, one layer recomputed)."""
    if checkpointing:
        return tokens * (layers * per_token_checkpointed + per_token_layer)
    return tokens * layers * per_token_layer


def logprob_bytes(chunk: int, vocab: int, hidden: int, weight_bytes: int, scored_tokens: int, act_bytes: int) -> int:
    """mmgpg/models/logprobs.py ``chunked_token_logprobs``: three fp32 ``[chunk, V]`` blocks (logits, their softmax terms,
    the gradient block), the ``[V, H]`` gradient buffer of the output embedding (``torch.zeros_like(weight)``) and
    the ``[K, H]`` hidden states of the scored positions saved for backward."""
    return 3 * 4 * chunk * vocab + weight_bytes * vocab * hidden + act_bytes * scored_tokens * hidden


def kv_cache_bytes(sequences: int, tokens: int, layers: int, kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """``sequences x tokens x layers x 2 (K and V) x kv_heads x head_dim x bytes`` (HF generate's DynamicCache)."""
    return sequences * tokens * layers * 2 * kv_heads * head_dim * dtype_bytes


def deepspeed_estimate(params: int, largest_layer_params: int, gpus_per_node: int, nodes: int, zero_stage: int,
                       offload: str) -> dict[str, Any]:
    """DeepSpeed's own per-GPU and per-node-CPU figures for ZeRO-2 / ZeRO-3 model states (the functions its
    ``estimate_zero{2,3}_model_states_mem_needs_all_cold`` print), or why there is none."""
    if zero_stage not in (2, 3):
        return {"available": False, "note": "DeepSpeed has estimators for ZeRO-2 and ZeRO-3 only"}
    import contextlib
    import sys

    from mmgpg.utils import quiet_deepspeed_import

    try:  # deepspeed logs its accelerator choice to stdout on import: keep stdout for the plan (--json)
        with contextlib.redirect_stdout(sys.stderr), quiet_deepspeed_import():
            from deepspeed.runtime.zero import stage3, stage_1_and_2
    except ImportError:
        return {"available": False, "note": "deepspeed is not installed (pip install 'mmgpg[deepspeed]'): "
                                            "cross-check skipped"}
    if zero_stage == 2:
        fn = "deepspeed.runtime.zero.stage_1_and_2.estimate_zero2_model_states_mem_needs"
        cpu, gpu = stage_1_and_2.estimate_zero2_model_states_mem_needs(
            params, gpus_per_node, nodes, cpu_offload=offload != "none")
    else:
        fn = "deepspeed.runtime.zero.stage3.estimate_zero3_model_states_mem_needs"
        cpu, gpu, _ = stage3.estimate_zero3_model_states_mem_needs(
            params, largest_layer_params, gpus_per_node, nodes, cpu_offload=offload != "none",
            cpu_offload_params=offload == "optimizer+params", zero_init=True)
    return {"available": True, "function": fn, "gpu_bytes": int(gpu), "cpu_bytes_per_node": int(cpu)}


# --------------------------------------------------------------------------------------------------------------------
# The plan
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class Plan:
    setup: dict[str, Any]
    model: dict[str, Any]
    workload: dict[str, Any]
    per_gpu_bytes: dict[str, int]
    phases: dict[str, int]
    host_bytes_per_node: int
    deepspeed: dict[str, Any]
    usable_bytes: int
    engine: dict[str, Any] = field(default_factory=dict)  # the rollout engine: {"name": "hf"} or vLLM's figures
    fixes: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        """The training GPUs' peak fits, and a vLLM engine (colocated or on its server GPU) can start."""
        return self.phases["peak"] <= self.usable_bytes and self.engine.get("starts", True)

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "fits": self.fits}


def check_setup(backend: str, zero_stage: int, offload: str, gpus: int, nodes: int, gpu_memory_gb: float) -> None:
    """One clear message for a combination DeepSpeed or mmgpg does not support."""
    from mmgpg.backends import BACKENDS

    if backend not in BACKENDS:
        raise ValueError(f"--backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
    if offload not in OFFLOADS:
        raise ValueError(f"--offload must be one of {', '.join(OFFLOADS)}; got {offload!r}")
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"--zero-stage must be 0, 1, 2 or 3; got {zero_stage}")
    if backend == "plain" and (zero_stage or offload != "none"):
        raise ValueError("--zero-stage and --offload need --backend deepspeed (the plain backend partitions nothing)")
    if offload == "optimizer" and zero_stage == 0:
        raise ValueError("optimizer offload needs ZeRO stage 1, 2 or 3: add --zero-stage 2")
    if offload == "optimizer+params" and zero_stage != 3:
        raise ValueError("parameter offload needs ZeRO stage 3: use --zero-stage 3")
    if gpus < 1 or nodes < 1 or gpu_memory_gb <= 0:
        raise ValueError(f"need --gpus >= 1, --nodes >= 1 and --gpu-memory-gb > 0; got {gpus}, {nodes}, {gpu_memory_gb}")


def plan_memory(cfg, shape: ModelShape, *, gpus: int, nodes: int = 1, gpu_memory_gb: float, backend: str = "plain",
                zero_stage: int = 0, offload: str = "none", reserve_gb: float = 2.0, images_per_prompt: int = 1,
                with_fixes: bool = True, videos_per_prompt: int = 0) -> Plan:
    """The per-GPU memory of ``cfg`` (a :class:`mmgpg.config.Config`) on ``gpus`` x ``nodes`` GPUs, for prompts of
    ``images_per_prompt`` images and ``videos_per_prompt`` videos of ``model.video_max_frames`` frames each (a
    frame pair is one temporal patch: a video is frames / 2 frames' worth of vision-tower rows, a frame within
    ``model.max_pixels`` and the video's ``model.video_total_pixels`` budget, :func:`mmgpg.models.video.frame_max_pixels`)."""
    check_setup(backend, zero_stage, offload, gpus, nodes, gpu_memory_gb)
    from mmgpg.models import family as family_spec
    from mmgpg.models.video import frame_max_pixels  # imports torch: not at module level (mmgpg --help stays light)

    spec = family_spec(shape.family)
    if not spec.planned_layers:
        raise ValueError(f"mmgpg plan does not model the {spec.title} decoder layers' activations: its formula was "
                         "measured on Qwen2's and Qwen3's dense layers and under-counts others (a Qwen3 MoE layer by "
                         "about 50 %, a Qwen3.5 linear-attention layer 2.6x, on tiny models); the family's "
                         "Family.planned_layers is False. Measure its layer as tests/unit/backends/test_memory.py does")
    m, r, t = cfg.model, cfg.rollout, cfg.train
    world = gpus * nodes
    if backend == "deepspeed":
        precision = "bf16"
    else:
        precision = {"auto": "autocast", "float32": "fp32"}.get(m.dtype, "bf16")
    act = 4 if precision == "fp32" else 2
    weight = 2 if precision == "bf16" else 4
    lora = m.lora.rank > 0  # LoRA: gradients and AdamW state for the adapters only, the reference is the adapter off
    if lora and shape.lora_rank != m.lora.rank:
        raise ValueError("the model shape was counted without model.lora: use model_shape(path, cfg.model.lora)")
    if t.freeze_vision and not shape.has_vision:
        raise ValueError(f"train.freeze_vision=true, but the {shape.family} model is text-only: it has no vision tower "
                         "to freeze (remove train.freeze_vision)")
    trainable = shape.lora_params if lora else shape.params - (shape.vision_params if t.freeze_vision else 0)
    states = model_state_bytes(shape.params + (shape.lora_params if lora else 0), trainable, world, backend,
                               zero_stage, offload, precision)
    per_gpu: dict[str, int] = {k: states[k] for k in ("parameters", "gradients", "optimizer")}
    per_gpu["zero3_gathered_layer"] = zero3_working_set_bytes(shape.largest_layer_params) if zero_stage == 3 else 0
    if cfg.algo.kl_coef > 0 and not lora:  # frozen copy: the policy's weight dtype, partitioned under ZeRO-3
        per_gpu["reference_model"] = weight * shape.params // (world if zero_stage == 3 else 1)
    else:
        per_gpu["reference_model"] = 0

    seq_len = m.max_prompt_length + r.max_new_tokens
    prompts_per_rank = -(-t.prompts_per_step // world)
    # A micro-batch holds train.micro_batch_prompts groups, or all of a rank's groups when it has fewer; β_th
    # resampling can add groups to the update (up to the attempts), so with it the full micro-batch is the peak.
    resampling = cfg.algo.min_valid_fraction > 0 and cfg.algo.max_resample_attempts > 1
    micro_groups = t.micro_batch_prompts if resampling else min(t.micro_batch_prompts, prompts_per_rank)
    sequences = micro_groups * r.group_size
    text_layer = layer_activation_bytes_per_token(shape.hidden, shape.intermediate, shape.heads, seq_len, precision,
                                                  kv_dim=shape.kv_heads * shape.head_dim, masked=True,
                                                  q_dim=shape.heads * shape.head_dim, kv_heads=shape.kv_heads,
                                                  qk_norm=spec.qk_norm)
    text_ckpt = checkpointed_layer_bytes_per_token(shape.hidden, precision)
    text_act = activation_bytes(sequences * seq_len, shape.layers, text_layer, text_ckpt, t.gradient_checkpointing)
    per_gpu["activations_text"] = text_act
    if shape.has_vision:  # a text-only model has no vision terms at all
        patches = m.max_pixels // (shape.patch_size**2)  # pre-merge patches of the largest image
        # a video: its frame pairs (temporal patches), each of one frame's patches within the video's pixel budget;
        # the longest video (video_max_frames) is the largest, as rows grow with the frames under any budget
        pairs = -(-m.video_max_frames // shape.temporal_patch_size)
        frame_patches = int(frame_max_pixels(pairs * shape.temporal_patch_size, m.min_pixels, m.max_pixels,
                                             m.video_total_pixels, shape.patch_size)) // (shape.patch_size**2)
        copies = micro_groups * (1 if m.encode_images_once else r.group_size)
        images = copies * (images_per_prompt + videos_per_prompt * pairs)
        rows = copies * (images_per_prompt * patches + videos_per_prompt * pairs * frame_patches)
        vision_act = 0
        if not t.freeze_vision and (shape.lora_vision or not lora):  # no gradient into the tower: nothing saved
            v_layer = vision_layer_bytes_per_patch(shape.family, shape.vision_hidden, shape.vision_intermediate,
                                                   precision)
            v_ckpt = checkpointed_layer_bytes_per_token(shape.vision_hidden, precision)
            vision_act = activation_bytes(rows, shape.vision_depth, v_layer, v_ckpt,
                                          t.gradient_checkpointing)
        per_gpu["activations_vision"] = vision_act
    per_gpu["autocast_weight_copies"] = 2 * shape.params if precision == "autocast" else 0
    per_gpu["logprob_buffers"] = logprob_bytes(m.logprob_chunk_size, shape.vocab, shape.hidden, weight,
                                               sequences * r.max_new_tokens, act)
    if lora and not shape.lora_head:  # a frozen head has no [V, H] gradient buffer
        per_gpu["logprob_buffers"] -= weight * shape.vocab * shape.hidden
    engine = engine_plan(r, shape, precision, seq_len, prompts_per_rank, world, gpu_memory_gb, reserve_gb)
    hf_generate = engine["name"] == "hf"  # vLLM generates from its own copy: no HF KV cache, gather or autocast
    per_gpu["kv_cache"] = kv_cache_bytes(prompts_per_rank * r.group_size, seq_len, shape.layers, shape.kv_heads,
                                         shape.head_dim, act) if hf_generate else 0
    per_gpu["rollout_gathered_weights"] = 2 * shape.params if zero_stage == 3 and hf_generate else 0
    if engine.get("mode") == "colocated":
        per_gpu["vllm_engine"] = engine["share_bytes"]
        per_gpu["vllm_sync_tensor"] = engine["sync_tensor_bytes"]

    persistent = sum(per_gpu[k] for k in ("parameters", "gradients", "optimizer", "zero3_gathered_layer",
                                          "reference_model"))
    update = sum(per_gpu.get(k, 0) for k in ("activations_text", "activations_vision", "autocast_weight_copies",
                                             "logprob_buffers"))
    # generate runs under autocast too (mmgpg/train/trainer.py _sample_groups), so its weight copies count in both phases
    rollout = per_gpu["kv_cache"] + per_gpu["rollout_gathered_weights"] \
        + (per_gpu["autocast_weight_copies"] if hf_generate else 0) + per_gpu.get("vllm_sync_tensor", 0)
    if engine.get("mode") == "colocated":  # resident all step, or (vllm_sleep) freed during the update only
        if engine["sleeps"]:
            rollout += per_gpu["vllm_engine"]
        else:
            persistent += per_gpu["vllm_engine"]
    phases = {"persistent": persistent, "update": update, "rollout": rollout,
              "peak": persistent + max(update, rollout)}
    ds = deepspeed_estimate(shape.params, shape.largest_layer_params, gpus, nodes, zero_stage, offload) \
        if backend == "deepspeed" else {"available": False, "note": "plain backend: DeepSpeed estimates ZeRO only"}
    if ds.get("available"):
        ds["ours_model_states_bytes"] = states["parameters"] + states["gradients"] + states["optimizer"] \
            + per_gpu["zero3_gathered_layer"]
    plan = Plan(
        setup={"gpus_per_node": gpus, "nodes": nodes, "world_size": world, "gpu_memory_gib": gpu_memory_gb,
               "reserve_gib": reserve_gb, "backend": backend, "zero_stage": zero_stage, "offload": offload,
               "precision": precision},
        model={"name_or_path": m.name_or_path, "trainable_params": trainable,
               **{k: v for k, v in dataclasses.asdict(shape).items() if shape.has_vision or k not in VISION_FIELDS}},
        workload={"micro_batch_sequences": sequences, "sequence_length": seq_len,
                  **({"images_per_micro_batch": images, "patches_per_image": patches} if shape.has_vision else {}),
                  **({"videos_per_prompt": videos_per_prompt, "frames_per_video": m.video_max_frames,
                      "patches_per_video_frame": frame_patches} if shape.has_vision and videos_per_prompt else {}),
                  "rollout_sequences_per_rank": prompts_per_rank * r.group_size,
                  "gradient_checkpointing": t.gradient_checkpointing,
                  **({"freeze_vision": t.freeze_vision} if shape.has_vision else {}),
                  "reference_model": cfg.algo.kl_coef > 0 and not lora, "lora_rank": m.lora.rank},
        per_gpu_bytes=per_gpu, phases=phases,
        host_bytes_per_node=(states["host"] + (engine["weights_bytes"] if engine.get("sleeps") else 0)) * gpus,
        deepspeed=ds, usable_bytes=int((gpu_memory_gb - reserve_gb) * GIB), engine=engine,
    )
    if with_fixes and not plan.fits:
        plan.fixes = _fixes(cfg, shape, gpus=gpus, nodes=nodes, gpu_memory_gb=gpu_memory_gb, backend=backend,
                            zero_stage=zero_stage, offload=offload, reserve_gb=reserve_gb,
                            images_per_prompt=images_per_prompt, videos_per_prompt=videos_per_prompt)
    return plan


def _changed(cfg, change: dict):
    """``cfg`` with ``{"section.field": value}`` applied (sections: train, rollout)."""
    for key, value in change.items():
        section, name = key.split(".")
        cfg = dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section), **{name: value})})
    return cfg


def _engine_moves(cfg, shape: ModelShape, **setup) -> list[tuple[str, dict, dict]]:
    """vLLM's own fixes (colocated): sleep during the update, or the share that holds the whole rollout's KV cache
    (lower than the current one), or the smallest share it starts with (when it cannot start)."""
    r = cfg.rollout
    if r.engine != "vllm" or r.vllm_server:
        return []
    e = plan_memory(cfg, shape, **setup, with_fixes=False).engine
    gpu = setup["gpu_memory_gb"] * GIB
    moves = [] if r.vllm_sleep else [("rollout.vllm_sleep=true (vLLM frees its share during the update)", {},
                                      {"rollout.vllm_sleep": True})]
    margin = VLLM_MARGIN_GIB * GIB
    whole = -(-(e["weights_bytes"] + e["kv_bytes_all_sequences"] + margin) * 100 // gpu) / 100  # rounded up to 0.01
    least = -(-(e["weights_bytes"] + e["kv_bytes_per_token"] * e["max_model_len"] + margin) * 100 // gpu) / 100
    for u in ((least,) if not e["starts"] else (whole,) if whole < r.vllm_gpu_memory_utilization else ()):
        if 0 < u <= 1:
            moves.append((f"rollout.vllm_gpu_memory_utilization={u:g}", {}, {"rollout.vllm_gpu_memory_utilization": u}))
    return moves


def _fixes(cfg, shape: ModelShape, **setup) -> list[str]:
    """The single changes that make the plan fit, found by planning each; when none does, the shortest cumulative
    list of them (in the order below) that does. LoRA is always added as a hint."""
    t = cfg.train
    moves: list[tuple[str, dict, dict]] = []  # (flag or override, setup change, {"section.field": value})
    for s, o in ((1, "none"), (2, "none"), (3, "none"), (2, "optimizer"), (3, "optimizer"), (3, "optimizer+params")):
        if s > setup["zero_stage"] or (s == 3 and setup["zero_stage"] == 3 and o != setup["offload"] and o != "none"):
            flag = f"--backend deepspeed --zero-stage {s}" + (f" --offload {o}" if o != "none" else "")
            moves.append((flag, {"backend": "deepspeed", "zero_stage": s, "offload": o}, {}))
    if not t.gradient_checkpointing:
        moves.append(("train.gradient_checkpointing=true", {}, {"train.gradient_checkpointing": True}))
    if t.micro_batch_prompts > 1:
        moves.append(("train.micro_batch_prompts=1", {}, {"train.micro_batch_prompts": 1}))
    if not t.freeze_vision and shape.has_vision:
        moves.append(("train.freeze_vision=true", {}, {"train.freeze_vision": True}))
    moves += _engine_moves(cfg, shape, **setup)

    def fits(setup_change: dict, change: dict) -> bool:
        return plan_memory(_changed(cfg, change), shape, **{**setup, **setup_change}, with_fixes=False).fits

    out: list[str] = []
    ds_done = False
    for flag, sc, tc in moves:
        if sc and ds_done:
            continue  # only the lowest ZeRO stage / offload that fits
        if fits(sc, tc):
            out.append(flag)
            ds_done = ds_done or bool(sc)
    if setup["backend"] == "deepspeed" and setup["zero_stage"] >= 1:
        for gpus in (setup["gpus"] * 2, setup["gpus"] * 4):
            if fits({"gpus": gpus}, {}):
                out.append(f"--gpus {gpus} (ZeRO partitions model states over all ranks)")
                break
    if not out:  # no single change is enough: the fewest cumulative train changes, with the lowest ZeRO option
        ds_moves = [(None, {}, {})] + [m for m in moves if m[1]]
        others = [m for m in moves if not m[1]]
        found = next(((ds, others[:k]) for k in range(1, len(others) + 1) for ds in ds_moves
                      if fits(ds[1], {key: v for m in others[:k] for key, v in m[2].items()})), None)
        if found:
            out.append("together: " + " ".join([m[0] for m in ([found[0]] if found[0][0] else []) + found[1]]))
        else:
            moves_tried = ("ZeRO stage, offload, checkpointing, micro-batch 1 and a frozen vision tower" if shape.has_vision
                           else "ZeRO stage, offload, checkpointing and micro-batch 1")
            out.append(f"no combination of {moves_tried} fits on this many GPUs: add GPUs, shorten the sequences, or "
                       "lower rollout.group_size")
    if cfg.model.lora.rank <= 0:
        out.append("hint: model.lora.rank=16 (LoRA) trains small adapters: gradients and optimizer state for those "
                   "only, and GRPO's reference is the adapter switched off (no second copy)")
    return out
