"""Pure tensor functions of the policy: completion masks, padding, the image index of each sequence, and
per-token log-probabilities from hidden states in chunks (O(chunk x vocab) memory instead of O(batch x length x
vocab)). No model, no processor: each is unit-tested on its own (tests/unit/models/test_logprobs.py)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F


def completion_mask(completion_ids: torch.Tensor, eos_token_ids: Sequence[int]) -> torch.Tensor:
    """Mask of the tokens that belong to each completion: every position up to and including the first EOS.

    ``mask[i, t] = 1  iff  t <= first_eos(i)``, where ``first_eos(i)`` is the first position whose id is in
    ``eos_token_ids`` (Qwen has two: ``<|im_end|>`` and ``<|endoftext|>``, and the pad id is also an EOS, so
    ``ids != pad`` would be wrong). A completion without EOS (truncated at ``max_new_tokens``) is valid throughout.

    >>> completion_mask(torch.tensor([[5, 2, 0, 0], [5, 6, 7, 8]]), [2, 0]).tolist()
    [[True, True, False, False], [True, True, True, True]]
    """
    if completion_ids.ndim != 2:
        raise ValueError(f"completion_ids must be 2-D [sequences, tokens]; got shape {tuple(completion_ids.shape)}")
    if not eos_token_ids:
        raise ValueError("eos_token_ids is empty: the model's generation config names no EOS token")
    is_eos = torch.isin(completion_ids, torch.as_tensor(list(eos_token_ids), device=completion_ids.device))
    # Number of EOS tokens strictly before position t; a token is kept while that count is 0.
    eos_before = torch.cumsum(is_eos.int(), dim=1) - is_eos.int()
    return eos_before == 0


def pad_completions(sequences: Sequence[Sequence[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad token-id lists into ``(ids [N, T], mask [N, T])``; ``T`` is the longest length (at least 1).

    >>> [t.tolist() for t in pad_completions([[5, 2], [7]], 0)]
    [[[5, 2], [7, 0]], [[True, True], [True, False]]]
    """
    width = max([1, *(len(s) for s in sequences)])
    ids = torch.full((len(sequences), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.bool)
    for i, s in enumerate(sequences):
        ids[i, : len(s)] = torch.as_tensor(list(s), dtype=torch.long)
        mask[i, : len(s)] = True
    return ids, mask


def group_image_index(images_per_prompt: Sequence[int], group_size: int,
                      images_per_row: Sequence[int] | None = None) -> list[int]:
    """Image indices of the expanded (prompt-major, ``group_size`` copies per prompt) batch.

    Prompt ``p`` owns images ``offset_p .. offset_p + n_p - 1``; copy ``g`` of prompt ``p`` sees them in that order.
    ``images_per_row`` (an episode batch: each row's own observation images, indexed after all the prompts' images,
    row by row) adds row ``r``'s own images after its prompt's.

    >>> group_image_index([2, 1], 2)
    [0, 1, 0, 1, 2, 2]
    >>> group_image_index([1, 0], 2, images_per_row=[1, 0, 2, 1])
    [0, 1, 0, 2, 3, 4]
    """
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1; got {group_size}")
    out: list[int] = []
    offset = 0
    row_offset = sum(images_per_prompt)
    for p, n in enumerate(images_per_prompt):
        own = list(range(offset, offset + n))
        for g in range(group_size):
            out.extend(own)
            if images_per_row is not None:
                k = images_per_row[p * group_size + g]
                out.extend(range(row_offset, row_offset + k))
                row_offset += k
        offset += n
    return out


def _chunk_logits(hidden, weight, bias, temperature: float, excluded) -> torch.Tensor:
    logits = F.linear(hidden, weight, bias).float()
    if temperature != 1.0:
        logits = logits / temperature
    if excluded is not None:
        logits = logits.index_fill(-1, excluded, float("-inf"))
    return logits


class _ChunkedLogProbs(torch.autograd.Function):
    """Forward and backward of :func:`chunked_token_logprobs`, one ``[chunk, V]`` block of logits at a time.

    Backward recomputes each block's logits and writes ``dL/dW`` into one ``[V, H]`` buffer with ``addmm_``, so no
    per-chunk ``[V, H]`` temporaries exist (plain activation checkpointing would create one per chunk).
    With ``z = (h W^T + b) / T`` and ``p = softmax(z)``: ``d logp_k / d z_k = onehot(y_k) - p_k``, hence
    ``dL/dh_k = g_k W / T``, ``dL/dW = sum_k g_k^T h_k / T`` and ``dL/db = sum_k g_k / T`` with
    ``g_k = dL/dlogp_k * (onehot(y_k) - p_k)``.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, chunk_size, temperature, excluded):
        out = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        lse = torch.empty_like(out)
        for s in range(0, hidden.shape[0], chunk_size):
            logits = _chunk_logits(hidden[s : s + chunk_size], weight, bias, temperature, excluded)
            lse[s : s + chunk_size] = torch.logsumexp(logits, dim=-1)
            out[s : s + chunk_size] = logits.gather(-1, targets[s : s + chunk_size, None]).squeeze(-1) - lse[s : s + chunk_size]
        ctx.save_for_backward(hidden, weight, bias, targets, lse, excluded)
        ctx.chunk_size, ctx.temperature = chunk_size, temperature
        return out

    @staticmethod
    def backward(ctx, grad_out):
        hidden, weight, bias, targets, lse, excluded = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros_like(weight) if need_w else None
        grad_b = torch.zeros_like(bias, dtype=torch.float32) if need_b else None
        c, temperature = ctx.chunk_size, ctx.temperature
        for s in range(0, hidden.shape[0], c):
            h, y, go = hidden[s : s + c], targets[s : s + c], grad_out[s : s + c].float()
            g = _chunk_logits(h, weight, bias, temperature, excluded)
            g.sub_(lse[s : s + c, None]).exp_()  # p
            g.mul_(-go[:, None])  # -dL/dlogp * p
            g[torch.arange(len(y), device=g.device), y] += go  # + dL/dlogp * onehot
            if temperature != 1.0:
                g.div_(temperature)
            if need_b:
                grad_b += g.sum(0)
            g = g.to(weight.dtype)
            if need_h:
                grad_h[s : s + c] = g @ weight
            if need_w:
                grad_w.addmm_(g.T, h.to(weight.dtype))
        if need_b:
            grad_b = grad_b.to(bias.dtype)
        return grad_h, grad_w, grad_b, None, None, None, None


def chunked_token_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    chunk_size: int = 1024,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    excluded_token_ids: Sequence[int] = (),
) -> torch.Tensor:
    """Log-probability of each target token under ``softmax((hidden @ weight.T + bias) / temperature)``.

    ``logp[k] = z[k, y_k] - logsumexp_{v not in S} z[k, v]`` with ``z = (h_k W^T + b) / T``, computed in float32,
    where ``S = excluded_token_ids`` are tokens the sampler can never emit (generate's ``suppress_tokens``), so the
    scored distribution is exactly the sampled one.

    ``hidden`` is ``[K, H]`` (only the positions that are scored), ``weight`` the ``[V, H]`` output embedding and
    ``targets`` ``[K]``. Only one ``[chunk, V]`` block of logits exists at a time, in forward and in backward
    (:class:`_ChunkedLogProbs` recomputes it), so peak memory is O(chunk x V) beside ``dL/dW`` itself, never O(K x V).
    """
    if hidden.ndim != 2 or targets.ndim != 1 or hidden.shape[0] != targets.shape[0]:
        raise ValueError(f"hidden must be [K, H] and targets [K]; got {tuple(hidden.shape)} and {tuple(targets.shape)}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1; got {chunk_size}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 to score tokens; got {temperature}")
    excluded = (
        torch.as_tensor(list(excluded_token_ids), dtype=torch.long, device=hidden.device) if excluded_token_ids else None
    )
    return _ChunkedLogProbs.apply(hidden, weight, bias, targets, chunk_size, float(temperature), excluded)
