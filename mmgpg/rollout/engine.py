"""The rollout-engine seam: what generates completions for training, evaluation and ``mmgpg sample``.

An engine takes chat conversations (messages with image parts — what a vLLM server also takes), a group size and
:class:`Sampling` settings, and returns a :class:`~mmgpg.models.CompletionBatch`. It is chosen by ``rollout.engine``
from :data:`ENGINES`; adding an engine is one file plus one registration (a built-in entry below, or
``ENGINES.register(name, "module:Class")`` / an ``mmgpg.engines`` entry point from a plugin). An engine class is built
as ``Engine(policy, settings, autocast)`` with its own :class:`EngineSettings` and implements :class:`RolloutEngine`.

Weights reach an engine only through :meth:`RolloutEngine.sync_weights`, as ``(name, tensor)`` pairs that the
training backend produces (:meth:`mmgpg.backends.TrainingBackend.full_weights`: gathered under ZeRO-3, LoRA merged,
in :attr:`RolloutEngine.weights_dtype`). How they travel (in process, a file, HTTP, a collective) is the engine's
business; an engine never reads the policy's parameters itself.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from mmgpg.registry import Registry

if TYPE_CHECKING:
    import torch

    from mmgpg.models import Policy
    from mmgpg.models.batch import CompletionBatch, PromptBatch

# The engine names: config validation, `mmgpg eval --engine` and `build_engine` all read this registry.
ENGINES = Registry("rollout engine", "mmgpg.engines",
                   {"hf": "mmgpg.rollout.hf:HFEngine", "vllm": "mmgpg.rollout.vllm:VLLMEngine"})


@dataclass(frozen=True)
class EngineSettings:
    """What an engine is built with: the rollout section of the config (``rollout.*``, read by attribute: a
    :class:`mmgpg.config.RolloutConfig`), the prompt budget (``model.max_prompt_length``) and the run's seed."""

    rollout: Any
    max_prompt_length: int = 1024
    seed: int = 0

    @classmethod
    def from_config(cls, cfg: Any) -> EngineSettings:
        """The settings of a resolved :class:`mmgpg.config.Config`."""
        return cls(cfg.rollout, cfg.model.max_prompt_length, cfg.seed)


@dataclass(frozen=True)
class Sampling:
    """How to sample: every knob explicit (a checkpoint's generation_config never leaks in). ``temperature = 0`` is
    greedy decoding (evaluation). ``seed_key``: what identifies this draw, e.g. ``(seed, step, attempt, rank)``;
    engines with per-request seeds (vLLM) seed prompt ``p`` with :func:`request_seed` ``(*seed_key, first_prompt + p)``
    so a rollout is reproducible and a resumed run draws the same completions. ``None``: the engine draws from torch's
    RNG. ``first_prompt``: the index of the call's first prompt in a longer stream (sampled evaluation seeds each
    problem by its index in the split, so its samples do not depend on how the split is batched)."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed_key: tuple[int, ...] | None = None
    first_prompt: int = 0

    @classmethod
    def from_config(cls, rollout) -> Sampling:
        return cls(rollout.max_new_tokens, rollout.temperature, rollout.top_p, rollout.top_k)

    @classmethod
    def greedy(cls, max_new_tokens: int) -> Sampling:
        return cls(max_new_tokens, temperature=0.0)


def request_seed(*key: int) -> int:
    """A 62-bit seed from integers (blake2b of their decimal text): unrelated keys give unrelated seeds, and
    vLLM's ``seed + i`` for the i-th of ``n`` completions stays far from any other prompt's seed.

    >>> request_seed(0, 3, 0, 1, 5) == request_seed(0, 3, 0, 1, 5), request_seed(0, 3, 0, 1, 5) == request_seed(0, 3, 0, 1, 6)
    (True, False)
    """
    digest = hashlib.blake2b(",".join(str(int(k)) for k in key).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 2


@dataclass(frozen=True)
class CheckLimits:
    """The post-sync check's limits (:mod:`mmgpg.rollout.check`): the largest allowed mean and max |difference|
    between the engine's sampled log-probs and the trainer's (``None``: that one is not checked)."""

    mean: float | None
    max: float | None


class RolloutEngine(Protocol):
    owns_weights: bool
    """True: the engine generates from its own copy of the weights, so the trainer calls :meth:`sync_weights` after
    every optimizer step (and once at the start). False: it samples with the trained module itself."""

    weights_dtype: torch.dtype | None
    """The dtype :meth:`sync_weights` wants its tensors in (None: an engine without its own copy)."""

    check_limits: CheckLimits | None
    """Limits of the post-sync check, or None when this engine returns no sampled log-probs to check."""

    def generate(self, conversations: Sequence[list[dict]], group_size: int, sampling: Sampling) -> CompletionBatch:
        """``group_size`` completions per conversation, prompt-major. ``prompts`` of the result is the policy's
        encoding of the conversations when the engine made it (the update reuses it)."""
        ...

    def generate_from(self, prompts: PromptBatch, sampling: Sampling) -> CompletionBatch:
        """One completion per prompt of an already-encoded batch (tokens, media): the next turn of multi-turn
        episodes (:mod:`mmgpg.rollout.episode`). Optional: an engine without it cannot roll out tasks with tools."""
        ...

    def sync_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load the policy's current weights: ``(Hugging Face name, tensor)`` pairs in :attr:`weights_dtype` (LoRA
        adapters already merged under the base names). Every rank calls it with its backend's
        :meth:`~mmgpg.backends.TrainingBackend.full_weights`; the iterable may be consumed only once."""
        ...

    def sleep(self) -> None:
        """Free the engine's accelerator memory during the update (``rollout.vllm_sleep``); a no-op otherwise.
        The next :meth:`generate` or :meth:`sync_weights` wakes it."""
        ...

    def close(self) -> None: ...


Weights = Callable[["torch.dtype | None"], Iterable[tuple[str, "torch.Tensor"]]]


def build_engine(name: str, policy: Policy, settings: EngineSettings,
                 autocast: Callable[[], AbstractContextManager] = contextlib.nullcontext,
                 weights: Weights | None = None) -> RolloutEngine:
    """The engine registered as ``name`` for ``policy`` (``settings``: its :class:`EngineSettings`, e.g.
    ``EngineSettings.from_config(cfg)``; ``autocast``: a context factory for mixed precision), started with the
    policy's current weights when it keeps
    its own copy. ``weights(dtype)`` gives them: the training backend's ``full_weights`` in training (collective under
    ZeRO-3: every rank builds its engine), the unpartitioned policy's own tensors by default (evaluation, probes)."""
    if name not in ENGINES:
        raise ValueError(f"unknown rollout engine {name!r}; available: {', '.join(sorted(ENGINES))}")
    engine = ENGINES[name](policy, settings, autocast)
    if engine.owns_weights:
        if weights is None:
            from mmgpg.models.save import policy_weights

            def weights(dtype):
                return policy_weights(policy.model, dtype)
        engine.sync_weights(weights(engine.weights_dtype))  # e.g. a server started from other weights
    return engine
