"""The rollout engine's share of the planner (:mod:`mmgpg.backends.memory`): what a vLLM engine holds on each of
its GPUs, colocated beside training or on a server GPU of its own. HF generate's terms (its KV cache, the ZeRO-3
gather, autocast copies) are in :func:`mmgpg.backends.memory.plan_memory` itself."""

from __future__ import annotations

from typing import Any

GIB = 2**30


def vllm_engine_plan(*, engine_bytes: int, params: int, largest_layer_params: int, layers: int, kv_heads: int,
                     head_dim: int, max_model_len: int, sequences: int, tensor_parallel: int, gpu_bytes: int,
                     utilization: float | None) -> dict[str, Any]:
    """What one vLLM engine holds on each of its GPUs (b = the engine's weight bytes, TP = tensor-parallel size).

    * weights: ``b·P / TP`` (vLLM shards every layer over its TP GPUs);
    * KV cache per token: ``layers x 2 x ceil(kv_heads / TP) x head_dim x b`` (the KV heads are split over TP; with
      fewer KV heads than GPUs each GPU keeps one);
    * colocated (``utilization`` set): vLLM takes ``utilization x GPU memory`` on each GPU at start-up — its
      ``gpu_memory_utilization`` is the fraction of the whole device this instance may use for weights,
      activations and KV cache, and it fills what the weights and its profiling pass leave with KV-cache blocks, so
      the share is the whole fraction whatever the sequence settings. It cannot start when the weights plus the KV
      cache of one ``max_model_len`` sequence exceed the share; with a smaller cache than the rollout needs it runs
      fewer sequences at once (slower, not out of memory);
    * server (``utilization`` None): the GPU needs the weights plus the KV cache of all ``sequences`` at full length
      to run them at once (``mmgpg vllm-serve --gpu-memory-utilization`` should give at least that), and at least
      the weights plus one sequence to start.

    The weight sync streams one tensor at a time (the training backend's ``full_weights`` is an iterator): at most
    ``b x largest module`` beside the engine.
    """
    tp = tensor_parallel
    weights = engine_bytes * params // tp
    kv_per_token = layers * 2 * -(-kv_heads // tp) * head_dim * engine_bytes
    one_sequence = kv_per_token * max_model_len
    all_sequences = kv_per_token * max_model_len * sequences
    out: dict[str, Any] = {"engine_dtype_bytes": engine_bytes, "tensor_parallel_size": tp, "weights_bytes": weights,
                           "kv_bytes_per_token": kv_per_token, "max_model_len": max_model_len,
                           "rollout_sequences": sequences, "kv_bytes_all_sequences": all_sequences,
                           "sync_tensor_bytes": engine_bytes * largest_layer_params}
    if utilization is None:
        out["needed_bytes"] = weights + all_sequences
        out["minimum_bytes"] = weights + one_sequence
        out["starts"] = out["minimum_bytes"] <= gpu_bytes
        return out
    share = int(utilization * gpu_bytes)
    kv_capacity = max(share - weights, 0)
    out.update(gpu_memory_utilization=utilization, share_bytes=share, kv_capacity_bytes=kv_capacity,
               concurrent_sequences=min(sequences, kv_capacity // one_sequence) if one_sequence else sequences,
               starts=weights + one_sequence <= share)
    return out


ENGINE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
VLLM_MARGIN_GIB = 1.0
"""Added to a suggested ``rollout.vllm_gpu_memory_utilization`` for what vLLM keeps beside weights and KV cache
(the activations of its profiling forward, CUDA graphs, the sampler): a judgement, not a measurement."""


def engine_plan(r, shape, precision: str, seq_len: int, prompts_per_rank: int, world: int,
                 gpu_memory_gb: float, reserve_gb: float) -> dict[str, Any]:
    """The rollout engine's entry of the plan: ``{"name": "hf"}``, or vLLM's figures (:func:`vllm_engine_plan`)."""
    if r.engine != "vllm":
        return {"name": r.engine}
    if not 0 < r.vllm_gpu_memory_utilization <= 1 or r.vllm_tensor_parallel_size < 1:
        raise ValueError(f"rollout.vllm_gpu_memory_utilization must be in (0, 1] and rollout.vllm_tensor_parallel_size "
                         f">= 1; got {r.vllm_gpu_memory_utilization} and {r.vllm_tensor_parallel_size}")
    # auto: bfloat16 under mixed precision, else the policy's own dtype (mmgpg/rollout/vllm.py)
    dtype = r.vllm_dtype if r.vllm_dtype != "auto" else ("float32" if precision == "fp32" else "bfloat16")
    server = bool(r.vllm_server)
    out = vllm_engine_plan(
        engine_bytes=ENGINE_BYTES[dtype], params=shape.params, largest_layer_params=shape.largest_layer_params,
        layers=shape.layers, kv_heads=shape.kv_heads, head_dim=shape.head_dim,
        max_model_len=r.vllm_max_model_len or seq_len,
        sequences=(prompts_per_rank * world if server else prompts_per_rank) * r.group_size,
        tensor_parallel=r.vllm_tensor_parallel_size,
        gpu_bytes=int((gpu_memory_gb - reserve_gb) * GIB) if server else int(gpu_memory_gb * GIB),
        utilization=None if server else r.vllm_gpu_memory_utilization)
    return {"name": "vllm", "mode": "server" if server else "colocated", "dtype": dtype,
            "sleeps": bool(r.vllm_sleep) and not server, **out}
