"""The batches that cross the model seam: prompts (:class:`PromptBatch`, what a policy's ``encode_prompts`` makes)
and prompts with completions (:class:`CompletionBatch`, what a rollout engine returns and ``completion_logprobs``
scores). Plain tensors and lists; no model code."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class PromptBatch:
    """Left-padded chat prompts with their images, as the processor returns them."""

    input_ids: torch.Tensor  # [P, Lp]
    attention_mask: torch.Tensor  # [P, Lp]
    mm_token_type_ids: torch.Tensor  # [P, Lp]; 1 at image tokens
    pixel_values: torch.Tensor | None  # [sum_i t*h*w, C*T*p*p], flat over all images of all prompts
    image_grid_thw: torch.Tensor | None  # [num_images, 3]
    images_per_prompt: list[int]
    texts: list[str]
    images: list | None = None  # the loaded, resized images the processor saw (flat over prompts); encode_prompts only

    @property
    def num_prompts(self) -> int:
        return self.input_ids.shape[0]

    def prompt_images(self) -> list[list]:
        """:attr:`images` per prompt (for an engine that takes images rather than pixel tensors, such as vLLM)."""
        if self.images is None and sum(self.images_per_prompt):
            raise ValueError("this PromptBatch does not carry its images (only encode_prompts' batches do)")
        out, start = [], 0
        for n in self.images_per_prompt:
            out.append(list(self.images[start : start + n]) if n else [])
            start += n
        return out

    def to(self, device: torch.device | str) -> PromptBatch:
        moved = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in self.__dict__.items()}
        return PromptBatch(**moved)


@dataclass
class CompletionBatch:
    """Prompts with ``group_size`` completions each, prompt-major: row ``p * group_size + g``. A rollout engine's
    sampled completions, or SFT's gold answers (``group_size = 1``); what :meth:`Policy.completion_logprobs` scores."""

    prompts: PromptBatch
    group_size: int
    completion_ids: torch.Tensor  # [P*G, T], right-padded with the pad id after EOS
    completion_mask: torch.Tensor  # [P*G, T] bool, True up to and including the first EOS
    texts: list[str] = field(default_factory=list)  # decoded completions without special tokens
    sampled_logprobs: torch.Tensor | None = None  # [P*G, T] the engine's log-probs of the sampled tokens, if it gives them

    @property
    def num_sequences(self) -> int:
        return self.completion_ids.shape[0]

    @property
    def num_completion_tokens(self) -> int:
        return int(self.completion_mask.sum())
