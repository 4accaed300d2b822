"""The Hugging Face ``generate`` engine: the policy's own model samples (no weight copy, nothing to sync)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from mmgpg.models import Policy
from mmgpg.models.batch import CompletionBatch, PromptBatch
from mmgpg.rollout.engine import Sampling


class HFEngine:
    name = "hf"
    owns_weights = False  # it samples with the trained module itself (LoRA adapters included)
    weights_dtype = None
    check_limits = None  # its sampled log-probs are the trainer's own: nothing to check

    def __init__(self, policy: Policy, settings: Any = None,
                 autocast: Callable[[], AbstractContextManager] = contextlib.nullcontext):
        """``settings`` (:class:`~mmgpg.rollout.engine.EngineSettings`): nothing in them changes how it samples."""
        self.policy, self.autocast = policy, autocast

    def generate(self, conversations: Sequence[list[dict]], group_size: int, sampling: Sampling) -> CompletionBatch:
        batch = self.policy.encode_prompts(conversations)
        with self.autocast():
            return self.policy.generate(batch, group_size, max_new_tokens=sampling.max_new_tokens,
                                        temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k)

    def generate_from(self, prompts: PromptBatch, sampling: Sampling) -> CompletionBatch:
        """One completion per already-encoded prompt (the next turn of multi-turn episodes,
        :mod:`mmgpg.rollout.episode`)."""
        with self.autocast():
            return self.policy.generate(prompts, 1, max_new_tokens=sampling.max_new_tokens,
                                        temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k)

    def sync_weights(self, weights) -> None:
        """Nothing to do: generation uses the trained module itself (the trainer does not call it)."""

    def sleep(self) -> None:
        """Nothing to free."""

    def close(self) -> None:
        """Nothing to release."""
