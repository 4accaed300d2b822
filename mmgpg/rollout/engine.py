"""The rollout-engine seam: what generates completions for training, evaluation and ``mmgpg sample``.

An engine takes chat conversations (messages with image parts — what a vLLM server also takes), a group size and
:class:`Sampling` settings, and returns a :class:`~mmgpg.models.qwen_vl.CompletionBatch`. It is chosen by ``rollout.engine``
from :data:`ENGINES` (``name -> "module:Class"``); adding an engine is one file plus one entry there. An engine class
is built as ``Engine(policy, config, autocast)`` and implements :class:`RolloutEngine`.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from mmgpg.models.qwen_vl import CompletionBatch, Policy

# The one place engine names live: config validation and `build_engine` both read this.
ENGINES: dict[str, str] = {"hf": "mmgpg.rollout.hf:HFEngine", "vllm": "mmgpg.rollout.vllm:VLLMEngine"}


@dataclass(frozen=True)
class Sampling:
    """How to sample: every knob explicit (a checkpoint's generation_config never leaks in). ``temperature = 0`` is
    greedy decoding (evaluation). ``seed_key``: what identifies this draw, e.g. ``(seed, step, attempt, rank)``;
    engines with per-request seeds (vLLM) seed prompt ``p`` with :func:`request_seed` ``(*seed_key, p)`` so a rollout
    is reproducible and a resumed run draws the same completions. ``None``: the engine draws from torch's RNG."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed_key: tuple[int, ...] | None = None

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


class RolloutEngine(Protocol):
    def generate(self, conversations: Sequence[list[dict]], group_size: int, sampling: Sampling) -> CompletionBatch:
        """``group_size`` completions per conversation, prompt-major. ``prompts`` of the result is the policy's
        encoding of the conversations when the engine made it (the update reuses it)."""
        ...

    def sync_weights(self) -> None:
        """Make the engine generate with the policy's current weights (after each optimizer step). An engine with its
        own copy of the weights loads ``policy.merged_state_dict()``: with LoRA, the adapters merged into the base
        weights under the base model's names (vLLM's own LoRA does not cover the vision tower)."""
        ...

    def close(self) -> None: ...


def build_engine(name: str, policy: Policy, config: Any = None,
                 autocast: Callable[[], AbstractContextManager] = contextlib.nullcontext) -> RolloutEngine:
    """The engine registered as ``name`` for ``policy`` (``config``: the resolved :class:`mmgpg.config.Config`, for
    engines with settings of their own; ``autocast``: a context factory for mixed precision)."""
    if name not in ENGINES:
        raise ValueError(f"unknown rollout engine {name!r}; available: {', '.join(sorted(ENGINES))}")
    module, _, cls = ENGINES[name].partition(":")
    return getattr(importlib.import_module(module), cls)(policy, config, autocast)
