"""The text-only policy: a causal LM (``AutoModelForCausalLM``: Qwen2 / Qwen2.5, the architecture of Qwen2.5-Math and
DeepSeek-R1-Distill-Qwen) with its tokenizer, and the three operations RL needs from them.

* :meth:`TextPolicy.encode_prompts` — chat conversations → one left-padded :class:`PromptBatch` through the
  tokenizer's own chat template (or a raw prompt). A message's content is a string or a list of text parts (joined);
  an image or video part is refused with a clear error. The batch has no media: ``mm_token_type_ids`` is all zeros
  and every prompt's ``vision`` and ``media`` are empty, so every consumer of a :class:`PromptBatch` (gathering
  prompts for the update, the pre-flight's token counts) works unchanged.
* :meth:`TextPolicy.generate` and :meth:`TextPolicy.completion_logprobs` — the same EOS, sampling and chunked scoring
  rules as the Qwen-VL policy (:class:`mmgpg.models.base.PolicyBase`). Nothing is suppressed: the sampler draws
  from the whole vocabulary, and the scorer normalises over it.

Positions: a left-padded prompt's first real token is position 0 (``cumsum(attention_mask) - 1``, the rule of
transformers' ``generate``), so padding changes nothing a sequence computes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from mmgpg.models.base import PolicyBase
from mmgpg.models.batch import CompletionBatch, PromptBatch

_MEDIA = ("image", "image_url", "video", "video_url", "audio")


def _media_kind(part: Any) -> str | None:
    """The media kind of a content part (``image``, ``video``...), or None for a text part."""
    if not isinstance(part, dict):
        return None
    if part.get("type") in _MEDIA:
        return str(part["type"])
    return next((k for k in _MEDIA if k in part), None)


def positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids of left-padded rows: 0 at each row's first real token (0 at the padding too).

    >>> positions(torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 0]])).tolist()
    [[0, 0, 0, 1, 2], [0, 1, 2, 3, 0]]
    """
    mask = attention_mask.long()
    return (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)


def pack_rows(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
              completion_mask: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every row (prompt ``r // group_size`` followed by completion ``r``) without its padding, concatenated into one
    sequence: ``(input_ids [1, S], position_ids [1, S], scored [K])``. Positions restart at 0 with each row, which is
    how transformers recognises packed sequences (with no attention mask it lets no token attend across rows; with
    flash-attention 2 the kernel runs varlen). ``scored`` indexes the ``K = completion_mask.sum()`` positions that
    predict the completion tokens, in ``completion_mask``'s row-major order (as :meth:`PolicyBase.score_hidden`).
    Completion masks must be prefixes (real tokens, then padding), as rollouts make them.

    >>> ids, pos, scored = pack_rows(torch.tensor([[0, 7, 8], [9, 9, 9]]), torch.tensor([[0, 1, 1], [1, 1, 1]]),
    ...                              torch.tensor([[5, 6], [4, 0], [3, 3], [2, 0]]),
    ...                              torch.tensor([[1, 1], [1, 0], [1, 1], [1, 0]]).bool(), 2)
    >>> ids.tolist(), pos.tolist(), scored.tolist()
    ([[7, 8, 5, 6, 7, 8, 4, 9, 9, 9, 3, 3, 9, 9, 9, 2]], [[0, 1, 2, 3, 0, 1, 2, 0, 1, 2, 3, 4, 0, 1, 2, 3]], [1, 2, 5, 9, 10, 14])
    """
    lengths = completion_mask.sum(1)
    prefix = torch.arange(completion_mask.shape[1], device=completion_mask.device) < lengths[:, None]
    if not bool((completion_mask == prefix).all()):
        raise ValueError("packed scoring needs right-padded completions (real tokens first, then padding)")
    ids, pos, scored, offset = [], [], [], 0
    for r in range(completion_ids.shape[0]):
        p = r // group_size
        prompt = prompt_ids[p][prompt_mask[p].bool()]
        if len(prompt) == 0:
            raise ValueError(f"prompt {p} is empty: its first completion token has no position to be predicted from")
        n = int(lengths[r])
        ids += [prompt, completion_ids[r, :n]]
        pos.append(torch.arange(len(prompt) + n))
        scored.append(torch.arange(n) + offset + len(prompt) - 1)
        offset += len(prompt) + n
    device = prompt_ids.device
    return torch.cat(ids)[None], torch.cat(pos)[None].to(device), torch.cat(scored).to(device)


class TextPolicy(PolicyBase):
    """A loaded text-only causal LM with its tokenizer (implements :class:`mmgpg.models.Policy`). Build one with
    :func:`mmgpg.models.load.load_policy`; the families it serves are those whose :class:`~mmgpg.models.Family` names
    it (:data:`mmgpg.models.FAMILIES`).
    """

    auto_model: ClassVar[str] = "AutoModelForCausalLM"  # the transformers classes that load its checkpoints
    auto_processor: ClassVar[str] = "AutoTokenizer"
    takes_images: ClassVar[bool] = False

    def __init__(self, model, tokenizer, *, max_prompt_length: int | None = None):
        model_type = getattr(model.config, "model_type", None)
        if getattr(model.config, "vision_config", None) is not None:
            raise ValueError(f"a {model_type!r} model has a vision tower: load it with its vision-language policy "
                             "(mmgpg.models.load.load_policy picks it), not TextPolicy")
        self._setup(model, tokenizer, tokenizer, family=model_type, max_prompt_length=max_prompt_length)

    # ---- prompts --------------------------------------------------------------------------------------------------

    @staticmethod
    def _text_content(content: Any, where: str) -> str:
        """A message's content as one string; image/video parts are an error."""
        if content is None:
            return ""
        if isinstance(content, str):
            return content
        if not isinstance(content, list):
            raise ValueError(f"{where}: content must be a string or a list of parts; got {type(content).__name__}")
        pieces = []
        for part in content:
            kind = _media_kind(part)
            if kind is not None:
                raise ValueError(f"{where} has an {kind} part, but this is a text-only model: mmgpg's text policies "
                                 "take no images. Use a vision-language model (a Qwen2-VL, Qwen2.5-VL or "
                                 "Qwen3-VL checkpoint, or model=tiny) for a task with images.")
            if isinstance(part, str):
                pieces.append(part)
            elif isinstance(part, dict) and "text" in part:
                pieces.append(str(part["text"]))
            else:
                raise ValueError(f"{where}: a content part is a string or {{'type': 'text', 'text': ...}}; got {part!r}")
        return "".join(pieces)

    def render_prompt(self, conversation: list[dict], where: str = "the conversation") -> str:
        """The prompt text of one conversation: the tokenizer's chat template with a generation prompt, or the text of
        a raw prompt (one ``{"role": "raw", "content": ...}`` message, written as is: add a BOS yourself if the model
        wants one)."""
        if any(m.get("role") == "raw" for m in conversation):
            if len(conversation) != 1:
                raise ValueError("a raw prompt is exactly one {'role': 'raw', 'content': ...} message")
            return self._text_content(conversation[0].get("content"), f"{where}, the raw prompt")
        messages = [{**m, "content": self._text_content(m.get("content"), f"{where}, message {i}")}
                    for i, m in enumerate(conversation)]
        if getattr(self.tokenizer, "chat_template", None) is None:
            raise ValueError(f"the {self.family} tokenizer has no chat template, and mmgpg renders chat prompts with "
                             "it: use a checkpoint whose tokenizer has one, or raw prompts ({'role': 'raw', ...}).")
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                                  **self.chat_template_kwargs)

    def encode_prompts(self, conversations: Sequence[list[dict]]) -> PromptBatch:
        """Turn chat conversations into one left-padded batch (the rendered text tokenized as is: the chat template
        writes its own special tokens, so none are added)."""
        if not conversations:
            raise ValueError("encode_prompts needs at least one conversation")
        texts = [self.render_prompt(c, f"conversation {i}") for i, c in enumerate(conversations)]
        enc = self.tokenizer(texts, padding=True, return_tensors="pt", add_special_tokens=False)
        self.check_prompt_lengths(enc["attention_mask"], "Raise model.max_prompt_length or shorten the prompt.")
        input_ids = enc["input_ids"]
        return PromptBatch(input_ids=input_ids, attention_mask=enc["attention_mask"],
                           mm_token_type_ids=torch.zeros_like(input_ids), vision=[{} for _ in texts],
                           media=[[] for _ in texts], texts=texts)

    # ---- sampling and scoring -------------------------------------------------------------------------------------

    def generate(self, prompts: PromptBatch, group_size: int, *, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, top_k: int = 0) -> CompletionBatch:
        """Sample ``group_size`` completions per prompt (HF ``generate`` with :meth:`sampling_kwargs`)."""
        if sum(prompts.media_per_prompt):
            raise ValueError("a text-only policy cannot generate from prompts with images")
        batch = prompts.to(self.device)
        inputs = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
        return self._sample(inputs, prompts, group_size, max_new_tokens=max_new_tokens, temperature=temperature,
                            top_p=top_p, top_k=top_k)

    def completion_logprobs(self, rollout: CompletionBatch, *, chunk_size: int = 1024, temperature: float = 1.0,
                            encode_images_once: bool = True, packed: bool = False) -> torch.Tensor:
        """Per-token log-probs ``[N, T]`` of the completion tokens (0 where the mask is 0), with gradients:
        ``log softmax(z / temperature)`` over the whole vocabulary at the position before each completion token
        (:meth:`~mmgpg.models.base.PolicyBase.score_hidden`). ``encode_images_once`` has nothing to do here.
        ``packed``: the rows without padding as one sequence (:func:`pack_rows`; ``model.packed_sequences``)."""
        self.check_packing(packed)
        batch, G = rollout.prompts.to(self.device), rollout.group_size
        comp_ids, comp_mask = rollout.completion_ids.to(self.device), rollout.completion_mask.to(self.device)
        if packed:
            input_ids, position_ids, index = pack_rows(batch.input_ids, batch.attention_mask, comp_ids, comp_mask, G)
            hidden = self.model.model(input_ids=input_ids, attention_mask=None, position_ids=position_ids,
                                      use_cache=False).last_hidden_state
            return self.score_positions(hidden[0, index], comp_ids, comp_mask, chunk_size=chunk_size,
                                        temperature=temperature)
        prompt_len = batch.input_ids.shape[1]
        input_ids = torch.cat([batch.input_ids.repeat_interleave(G, 0), comp_ids], dim=1)
        attention_mask = torch.cat([batch.attention_mask.repeat_interleave(G, 0), comp_mask.long()], dim=1)
        hidden = self.model.model(input_ids=input_ids, attention_mask=attention_mask,
                                  position_ids=positions(attention_mask), use_cache=False).last_hidden_state
        return self.score_hidden(hidden, prompt_len, comp_ids, comp_mask, chunk_size=chunk_size,
                                 temperature=temperature)
