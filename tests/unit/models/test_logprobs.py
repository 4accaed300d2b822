"""Pure tensor functions of mmgpg.models.qwen_vl, against hand-computed numbers and naive references."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mmgpg.models.logprobs import chunked_token_logprobs, completion_mask, group_image_index


def test_completion_mask_hand_cases():
    eos = [2, 0]  # <|im_end|>, <|endoftext|> (also the pad id)
    ids = torch.tensor([
        [5, 6, 2, 0, 0],  # ends at im_end -> 3 tokens, EOS included
        [5, 0, 0, 0, 0],  # ends at endoftext (the pad id is an EOS too) -> 2 tokens
        [5, 6, 7, 8, 9],  # truncated: no EOS -> all 5
        [2, 5, 6, 7, 8],  # EOS first -> 1 token
        [5, 2, 6, 2, 6],  # tokens after the first EOS never count
    ])
    assert completion_mask(ids, eos).int().tolist() == [
        [1, 1, 1, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 1, 1],
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
    ]


def test_completion_mask_errors():
    with pytest.raises(ValueError, match="2-D"):
        completion_mask(torch.tensor([1, 2]), [2])
    with pytest.raises(ValueError, match="no EOS"):
        completion_mask(torch.tensor([[1, 2]]), [])


@given(st.lists(st.lists(st.integers(0, 6), min_size=1, max_size=9), min_size=1, max_size=5).filter(
    lambda rows: len({len(r) for r in rows}) == 1))
def test_completion_mask_property(rows):
    ids = torch.tensor(rows)
    mask = completion_mask(ids, [0, 3])
    for r, m in zip(rows, mask.tolist()):
        first = next((i for i, t in enumerate(r) if t in (0, 3)), len(r) - 1)
        assert m == [i <= first for i in range(len(r))]


def test_group_image_index():
    assert group_image_index([1, 1], 3) == [0, 0, 0, 1, 1, 1]
    assert group_image_index([2, 0, 1], 2) == [0, 1, 0, 1, 2, 2]  # a prompt without images contributes nothing
    assert group_image_index([], 4) == []
    with pytest.raises(ValueError):
        group_image_index([1], 0)


def test_chunked_logprobs_hand_computed():
    # vocab 3, hidden 2, W = I-like: logits of h=[1, 0] are [1, 0, 0]
    weight = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    hidden = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    targets = torch.tensor([0, 2])
    logp = chunked_token_logprobs(hidden, weight, targets, chunk_size=1)
    # row 0: log(e / (e + 2)); row 1: uniform -> log(1/3)
    assert logp.tolist() == pytest.approx([1 - math.log(math.e + 2), -math.log(3)], abs=1e-6)
    # temperature 2 halves the logits: log(e^0.5 / (e^0.5 + 2))
    logp_t = chunked_token_logprobs(hidden, weight, targets, temperature=2.0)
    assert logp_t[0].item() == pytest.approx(0.5 - math.log(math.exp(0.5) + 2), abs=1e-6)
    # excluding token 1 renormalises over {0, 2}: row 0 -> log(e / (e + 1)), row 1 -> log(1/2)
    logp_x = chunked_token_logprobs(hidden, weight, targets, excluded_token_ids=[1])
    assert logp_x.tolist() == pytest.approx([1 - math.log(math.e + 1), -math.log(2)], abs=1e-6)


@pytest.mark.parametrize("chunk", [1, 7, 64, 1000])
def test_chunked_logprobs_equal_naive_values_and_gradients(chunk):
    """Values and gradients (hidden, weight, bias) equal autograd through full logits, with a temperature and
    excluded tokens."""
    torch.manual_seed(0)
    K, H, V = 50, 16, 97
    hidden = torch.randn(K, H, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(V, H, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(V, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, V, (K,))
    coef = torch.randn(K, dtype=torch.float64)

    excluded = [3, 50, 96]
    targets = torch.where(torch.isin(targets, torch.tensor(excluded)), 0, targets)

    def naive():
        logits = (hidden @ weight.T + bias) / 0.8
        logits = logits.index_fill(-1, torch.tensor(excluded), float("-inf"))
        return torch.log_softmax(logits, -1).gather(-1, targets[:, None]).squeeze(-1)

    ref = naive()
    (ref * coef).sum().backward()
    ref_grads = [t.grad.clone() for t in (hidden, weight, bias)]
    for t in (hidden, weight, bias):
        t.grad = None
    out = chunked_token_logprobs(hidden, weight, targets, chunk_size=chunk, bias=bias, temperature=0.8,
                                 excluded_token_ids=excluded)
    (out.double() * coef).sum().backward()
    # float32 inside each chunk
    torch.testing.assert_close(out.double(), ref.detach(), atol=1e-5, rtol=0)
    for got, want in zip((hidden.grad, weight.grad, bias.grad), ref_grads):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_chunked_logprobs_without_grad_and_errors():
    hidden, weight = torch.randn(4, 3), torch.randn(5, 3)
    with torch.no_grad():
        out = chunked_token_logprobs(hidden, weight, torch.tensor([0, 1, 2, 3]), chunk_size=3)
    assert out.shape == (4,) and not out.requires_grad and (out < 0).all()
    assert chunked_token_logprobs(hidden[:0], weight, torch.tensor([], dtype=torch.long)).shape == (0,)
    with pytest.raises(ValueError, match=r"\[K, H\]"):
        chunked_token_logprobs(hidden, weight, torch.tensor([0]))
    with pytest.raises(ValueError, match="chunk_size"):
        chunked_token_logprobs(hidden, weight, torch.tensor([0, 1, 2, 3]), chunk_size=0)
    with pytest.raises(ValueError, match="temperature"):
        chunked_token_logprobs(hidden, weight, torch.tensor([0, 1, 2, 3]), temperature=0)


@settings(deadline=None, max_examples=25)
@given(st.integers(1, 40), st.integers(1, 50))
def test_chunking_never_changes_the_result(k, chunk):
    g = torch.Generator().manual_seed(k * 100 + chunk)
    hidden, weight = torch.randn(k, 8, generator=g), torch.randn(33, 8, generator=g)
    targets = torch.randint(0, 33, (k,), generator=g)
    whole = chunked_token_logprobs(hidden, weight, targets, chunk_size=k)
    torch.testing.assert_close(chunked_token_logprobs(hidden, weight, targets, chunk_size=chunk), whole)


def test_bfloat16_weights_give_float32_logprobs_and_grads_in_their_dtype():
    torch.manual_seed(0)
    hidden = torch.randn(20, 16, dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(40, 16, dtype=torch.bfloat16, requires_grad=True)
    targets = torch.randint(0, 40, (20,))
    out = chunked_token_logprobs(hidden, weight, targets, chunk_size=6)
    assert out.dtype == torch.float32
    out.sum().backward()
    assert hidden.grad.dtype == torch.bfloat16 and weight.grad.dtype == torch.bfloat16
    ref = torch.log_softmax((hidden.float() @ weight.float().T), -1).gather(-1, targets[:, None]).squeeze(-1)
    torch.testing.assert_close(out, ref.detach(), atol=0.05, rtol=0)
