"""The batches that cross the model seam: prompts (:class:`PromptBatch`, what a policy's ``encode_prompts`` makes)
and prompts with completions (:class:`CompletionBatch`, what a rollout engine returns and ``completion_logprobs``
scores). Plain tensors and lists; no model code, and nothing of any one model family: a prompt's vision inputs are
the processor's own tensors, kept per prompt (:attr:`PromptBatch.vision`) and joined by :func:`join_vision`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch


def is_image_part(part: Any) -> bool:
    """A chat content part that is an image (``{"type": "image" | "image_url", ...}`` or one with an ``image`` key).

    >>> is_image_part({"type": "image", "image": "a.png"}), is_image_part({"image": "a.png"}), is_image_part("text")
    (True, True, False)
    """
    return isinstance(part, dict) and (part.get("type") in ("image", "image_url") or "image" in part)


def is_video_part(part: Any) -> bool:
    """A chat content part that is a video (``{"type": "video", ...}`` or one with a ``video`` key)."""
    return isinstance(part, dict) and (part.get("type") == "video" or "video" in part)


@dataclass
class PromptBatch:
    """Left-padded chat prompts with their media.

    ``vision[p]`` holds prompt ``p``'s vision inputs exactly as the family's processor returns them for that prompt
    alone (Qwen-VL: ``pixel_values`` rows and ``image_grid_thw``; Gemma 3: ``pixel_values`` per image; ...; ``{}``
    for a prompt without media), so any subset of prompts is a batch again (:meth:`select`, the update's
    micro-batches) and a family joins them for its forward with :func:`join_vision`."""

    input_ids: torch.Tensor  # [P, Lp]
    attention_mask: torch.Tensor  # [P, Lp]
    mm_token_type_ids: torch.Tensor  # [P, Lp]; transformers' convention: 0 text, 1 image placeholder, 2 video
    vision: list[dict[str, torch.Tensor]]  # per prompt: the processor's vision tensors for it ({}: no media)
    media: list[list[Any]]  # per prompt: the loaded media the processor saw, for an engine that takes them (vLLM):
    # images (PIL), then videos as (frames, metadata) pairs
    texts: list[str]

    @property
    def num_prompts(self) -> int:
        return self.input_ids.shape[0]

    @property
    def media_per_prompt(self) -> list[int]:
        return [len(m) for m in self.media]

    def to(self, device: torch.device | str) -> PromptBatch:
        def move(v):
            return v.to(device) if isinstance(v, torch.Tensor) else v

        return PromptBatch(move(self.input_ids), move(self.attention_mask), move(self.mm_token_type_ids),
                           [{k: move(t) for k, t in part.items()} for part in self.vision], self.media, self.texts)


def join_vision(parts: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The per-prompt vision inputs ``parts`` as one batch's: each key's tensors concatenated along dim 0, in order.
    Where their trailing shapes differ (a processor that pads within its own batch, e.g. the images of a prompt to the
    batch's largest count), each is zero-padded at the end of every trailing dim to the largest first; a prompt
    without media adds nothing.

    >>> join_vision([{"x": torch.ones(2, 1)}, {}, {"x": torch.zeros(1, 1)}])["x"].tolist()
    [[1.0], [1.0], [0.0]]
    >>> join_vision([{"m": torch.ones(1, 1)}, {"m": torch.ones(1, 2)}])["m"].tolist()
    [[1.0, 0.0], [1.0, 1.0]]
    """
    keys: list[str] = []
    for part in parts:
        keys += [k for k in part if k not in keys]
    out = {}
    for key in keys:
        tensors = [part[key] for part in parts if key in part]
        shape = [max(t.shape[d] for t in tensors) for d in range(1, tensors[0].ndim)]
        padded = []
        for t in tensors:
            pad = [x for d in reversed(range(1, t.ndim)) for x in (0, shape[d - 1] - t.shape[d])]
            padded.append(torch.nn.functional.pad(t, pad) if any(pad) else t)
        out[key] = torch.cat(padded) if len(padded) > 1 else padded[0]
    return out


def gather_prompts(rows: Sequence[tuple[PromptBatch, int]], pad_token_id: int) -> PromptBatch:
    """Prompt ``p`` of each ``(batch, p)`` as one left-padded batch, with its vision inputs and media: how the
    update reuses the prompts the rollout already encoded (images preprocessed once per step) for micro-batches of
    groups from any attempts."""
    if not rows:
        raise ValueError("gather_prompts needs at least one (batch, prompt index)")
    ids, mm = [], []
    for batch, p in rows:
        keep = batch.attention_mask[p].bool()
        ids.append(batch.input_ids[p][keep])
        mm.append(batch.mm_token_type_ids[p][keep])
    input_ids, attention_mask, mm_token_type_ids = _left_padded(ids, mm, pad_token_id)
    return PromptBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        mm_token_type_ids=mm_token_type_ids,
        vision=[batch.vision[p] for batch, p in rows],
        media=[batch.media[p] for batch, p in rows],
        texts=[batch.texts[p] for batch, p in rows],
    )


def extend_prompts(batch: PromptBatch, rows: Sequence[tuple[int, Sequence[int], Sequence[int], Sequence[dict],
                                                           Sequence[Any]]], pad_token_id: int) -> PromptBatch:
    """Prompts that continue prompts of ``batch``: one left-padded row per ``(p, ids, mm, vision, media)``, prompt
    ``p``'s tokens followed by ``ids`` (their mm token types ``mm``), its vision inputs followed by ``vision`` (each
    a processor output of the added images, in order), its media followed by ``media``. What the next turn of a
    multi-turn episode is generated from (:mod:`mmgpg.rollout.episode`); ``texts`` are empty (an engine that needs
    text cannot continue an episode).

    >>> b = PromptBatch(torch.tensor([[0, 7]]), torch.tensor([[0, 1]]), torch.zeros(1, 2, dtype=torch.long), [{}], [[]], ["x"])
    >>> e = extend_prompts(b, [(0, [8, 9], [0, 0], [], []), (0, [], [], [], [])], pad_token_id=0)
    >>> e.input_ids.tolist(), e.attention_mask.tolist()
    ([[7, 8, 9], [0, 0, 7]], [[1, 1, 1], [0, 0, 1]])
    """
    ids, mm, vision, media = [], [], [], []
    for p, extra_ids, extra_mm, extra_vision, extra_media in rows:
        keep = batch.attention_mask[p].bool()
        ids.append(torch.cat([batch.input_ids[p][keep], torch.as_tensor(list(extra_ids), dtype=torch.long)]))
        mm.append(torch.cat([batch.mm_token_type_ids[p][keep].long(), torch.as_tensor(list(extra_mm), dtype=torch.long)]))
        vision.append(join_vision([batch.vision[p], *extra_vision]))
        media.append([*batch.media[p], *extra_media])
    return PromptBatch(*_left_padded(ids, mm, pad_token_id), vision, media, [""] * len(ids))


def _left_padded(ids: Sequence[torch.Tensor], mm: Sequence[torch.Tensor],
                 pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Unpadded prompt rows (token ids and their mm token types) as ``(input_ids, attention_mask,
    mm_token_type_ids)``, left-padded to the longest."""
    width = max(len(x) for x in ids)

    def left_pad(rows_, value):
        return torch.stack([torch.cat([r.new_full((width - len(r),), value), r]) for r in rows_])

    return left_pad(ids, pad_token_id), left_pad([torch.ones_like(r) for r in ids], 0), left_pad(mm, 0)


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
    # Multi-turn episodes (mmgpg.rollout.episode): the "completion" is everything after the prompt — the policy's
    # turns and the observations between them. completion_mask is then the loss mask (1 on the policy's own tokens
    # only) and these say what else the sequence holds; None for a single-turn batch.
    context_mask: torch.Tensor | None = None  # [P*G, T] bool: the row's real tokens (policy and observation)
    completion_mm: torch.Tensor | None = None  # [P*G, T] mm token types of the completion tokens (observation images)
    row_vision: list[dict[str, torch.Tensor]] | None = None  # per row: its observation images' vision inputs
    episodes: list[Any] | None = None  # per row: its mmgpg.rollout.episode.Episode (turns, tool calls, limits)

    @property
    def num_sequences(self) -> int:
        return self.completion_ids.shape[0]

    @property
    def num_completion_tokens(self) -> int:
        return int(self.completion_mask.sum())

    @property
    def present_mask(self) -> torch.Tensor:
        """``[P*G, T]`` bool: the tokens each row holds after its prompt (:attr:`context_mask` of an episode batch,
        else the completion mask)."""
        return self.completion_mask if self.context_mask is None else self.context_mask
