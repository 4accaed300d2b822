"""An independent reference for episode scoring: one episode (or a prefix of it) at a time, unpadded, through the
model's own ``forward`` with the processor's image tensors concatenated and full-vocabulary logits. It never touches
the policy's episode forward (``completion_logprobs`` with ``context_mask``/``row_vision``) or the chunked scorer."""

from __future__ import annotations

import torch


def turn_spans(policy_mask: list[bool]) -> list[tuple[int, int]]:
    """``[start, end)`` of each run of the policy's tokens (each turn).

    >>> turn_spans([True, True, False, True])
    [(0, 2), (3, 4)]
    """
    spans, start = [], None
    for i, m in enumerate([*policy_mask, False]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append((start, i))
            start = None
    return spans


def images_before(mm: list[int], position: int) -> int:
    """How many observation images an episode showed before token ``position`` (one run of image tokens each)."""
    mm = mm[:position]
    return sum(1 for i, t in enumerate(mm) if t == 1 and (i == 0 or mm[i - 1] != 1))


def episode_token_logprobs(policy, prompts, p: int, episode, end: int | None = None) -> torch.Tensor:
    """``[end]``: log π of each of the episode's first ``end`` tokens (all by default) after prompt ``p`` of
    ``prompts``, with gradients: the unpadded prompt and tokens, the prompt's pixel rows and grids followed by those
    of the observations shown before ``end``, log_softmax over the vocabulary without the suppressed vision tokens."""
    end = len(episode.ids) if end is None else end
    keep = prompts.attention_mask[p].bool()
    prompt, prompt_mm = prompts.input_ids[p][keep], prompts.mm_token_type_ids[p][keep]
    ids, mm = torch.tensor(episode.ids[:end]), torch.tensor(episode.mm[:end])
    seen = episode.vision[: images_before(episode.mm, end)]
    pixels = torch.cat([prompts.vision[p]["pixel_values"], *(v["pixel_values"] for v in seen)])
    grids = torch.cat([prompts.vision[p]["image_grid_thw"], *(v["image_grid_thw"] for v in seen)])
    seq = torch.cat([prompt, ids])[None]
    logits = policy.model(input_ids=seq, attention_mask=torch.ones_like(seq), mm_token_type_ids=torch.cat(
        [prompt_mm, mm])[None], pixel_values=pixels, image_grid_thw=grids).logits[0].float()
    logits[:, policy.vision_token_ids] = float("-inf")
    return torch.log_softmax(logits, -1)[len(prompt) - 1 : -1].gather(-1, ids[:, None])[:, 0]
