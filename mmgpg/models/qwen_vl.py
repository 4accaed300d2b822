"""The Qwen-VL policy: a Qwen2-VL / Qwen2.5-VL / Qwen3-VL (dense or MoE) model, its processor, and the operations RL
needs from them.

Everything Qwen-VL-specific (``pixel_values`` rows and ``image_grid_thw``, M-RoPE, vision special tokens, DeepStack
features) stays in this file. The rest of mmgpg sees three operations:

* :meth:`Policy.encode_prompts` — chat conversations with images → one left-padded :class:`PromptBatch`. Images go
  through ``qwen_vl_utils`` (paths, URLs, base64, PIL) with the configured ``min_pixels``/``max_pixels``; rollout and
  training share this single path.
* :meth:`Policy.generate` — ``group_size`` sampled completions per prompt (:class:`CompletionBatch`), prompt-major order
  (prompt 0's completions first). The completion mask ends at the first EOS of *any* id in the generation config.
* :meth:`Policy.completion_logprobs` — per-token log-probabilities of the completion tokens only, differentiable,
  computed from hidden states in chunks so that peak memory is O(chunk × vocab) rather than
  O(batch × length × vocab). Each prompt's images are encoded once and the features shared by its ``group_size``
  sequences (``encode_images_once``; Qwen3-VL's DeepStack features too); gradients from all copies flow back into
  the one vision-tower pass.

A prompt's vision inputs travel per prompt (:attr:`PromptBatch.vision`: its ``pixel_values`` rows and its images'
``image_grid_thw``); they are joined for a forward (:func:`~mmgpg.models.batch.join_vision`), which gives exactly the
processor's batched tensors.

The EOS, sampling and scoring rules are :class:`mmgpg.models.base.PolicyBase`'s, shared with the text policy.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from mmgpg.models.base import PolicyBase
from mmgpg.models.batch import CompletionBatch, PromptBatch, join_vision
from mmgpg.models.logprobs import group_image_index

VISION_SPECIAL_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")


# --------------------------------------------------------------------------------------------------------------------
# Policy
# --------------------------------------------------------------------------------------------------------------------


# The families this policy drives (their processors return pixel_values rows with image_grid_thw, and their forward
# takes mm_encoder_outputs with the vision features of every image).
QWEN_VL_TYPES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe")


class QwenVLPolicy(PolicyBase):
    """A loaded Qwen2-VL / Qwen2.5-VL / Qwen3-VL model with its processor (implements :class:`mmgpg.models.Policy`).
    Build one with :func:`mmgpg.models.load.load_policy`."""

    auto_model: ClassVar[str] = "AutoModelForImageTextToText"  # the transformers classes that load its checkpoints
    auto_processor: ClassVar[str] = "AutoProcessor"
    takes_images: ClassVar[bool] = True

    def __init__(self, model, processor, *, min_pixels: int, max_pixels: int, max_prompt_length: int | None = None):
        model_type = getattr(model.config, "model_type", None)
        if model_type not in QWEN_VL_TYPES:
            raise ValueError(f"QwenVLPolicy drives the model types {', '.join(QWEN_VL_TYPES)}; got {model_type!r}. "
                             "Load a model with mmgpg.models.load.load_policy, which picks its family's policy.")
        if not 0 < min_pixels <= max_pixels:
            raise ValueError(f"need 0 < min_pixels <= max_pixels; got min_pixels={min_pixels}, max_pixels={max_pixels}")
        tok = processor.tokenizer
        self._setup(model, processor, tok, family=model_type, max_prompt_length=max_prompt_length)
        self.min_pixels = min_pixels
        self.max_pixels = max_pixels
        processor.image_processor.size = {"shortest_edge": min_pixels, "longest_edge": max_pixels}
        ids = tok.convert_tokens_to_ids(list(VISION_SPECIAL_TOKENS))
        self.vision_token_ids: list[int] = [i for i in ids if i is not None and i != tok.unk_token_id]
        self.suppressed_token_ids = self.vision_token_ids  # never sampled, excluded from the scored softmax
        self.image_token_id: int = model.config.image_token_id
        self.patch_size: int = int(getattr(processor.image_processor, "patch_size", 14))  # Qwen3-VL: 16

    # ---- prompts --------------------------------------------------------------------------------------------------

    def _with_pixel_bounds(self, conversation: list[dict]) -> list[dict]:
        conversation = copy.copy(conversation)
        for m, message in enumerate(conversation):
            if isinstance(message.get("content"), list):
                parts = []
                for part in message["content"]:
                    if isinstance(part, dict) and part.get("type") == "video" or (isinstance(part, dict) and "video" in part):
                        raise ValueError("video inputs are not supported by mmgpg yet; give images")
                    if isinstance(part, dict) and (part.get("type") in ("image", "image_url") or "image" in part):
                        part = {"min_pixels": self.min_pixels, "max_pixels": self.max_pixels, **part}
                    parts.append(part)
                conversation[m] = {**message, "content": parts}
        return conversation

    def render_prompt(self, conversation: list[dict]) -> str:
        """The prompt text of one conversation (chat template with a generation prompt, or a raw prompt)."""
        if any(m.get("role") == "raw" for m in conversation):
            if len(conversation) != 1 or not isinstance(conversation[0].get("content"), list):
                raise ValueError("a raw prompt is exactly one {'role': 'raw', 'content': [parts]} message")
            pieces = []
            for part in conversation[0]["content"]:
                if part.get("type") in ("image", "image_url") or "image" in part:
                    pieces.append("<|vision_start|><|image_pad|><|vision_end|>")
                elif part.get("type") == "text":
                    pieces.append(str(part["text"]))
                else:
                    raise ValueError(f"raw prompt parts are images or text; got {part!r}")
            return "".join(pieces)
        return self.processor.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False,
                                                  **self.chat_template_kwargs)

    def encode_prompts(self, conversations: Sequence[list[dict]]) -> PromptBatch:
        """Turn chat conversations into one left-padded batch.

        Each conversation is a list of ``{"role", "content"}`` messages; image parts are
        ``{"type": "image", "image": PIL.Image | path | "file://..." | URL | "data:image/...;base64,..."}`` and may set
        their own ``min_pixels``/``max_pixels`` (the policy's bounds are the default). A generation prompt is appended.

        A conversation of one ``{"role": "raw", "content": [...]}`` message bypasses the chat template: its parts are
        concatenated in order, each image as ``<|vision_start|><|image_pad|><|vision_end|>`` (a base model's text
        prompt, e.g. the R1-Zero prompt of the CV-Bench recipe).
        """
        from qwen_vl_utils import extract_vision_info, process_vision_info

        if not conversations:
            raise ValueError("encode_prompts needs at least one conversation")
        conversations = [self._with_pixel_bounds(c) for c in conversations]
        texts = [self.render_prompt(c) for c in conversations]
        images_per_prompt = [len(extract_vision_info([c])) for c in conversations]
        images = None
        if sum(images_per_prompt):
            images, _ = process_vision_info(list(conversations), image_patch_size=self.patch_size)[:2]
        enc = self.processor(text=texts, images=images, padding=True, return_tensors="pt")
        input_ids = enc["input_ids"]
        mm = enc.get("mm_token_type_ids")
        if mm is None:
            mm = (input_ids == self.image_token_id).long()
        self.check_prompt_lengths(enc["attention_mask"], "Image tokens count too; lower model.max_pixels or raise "
                                  "max_prompt_length.")
        return PromptBatch(input_ids=input_ids, attention_mask=enc["attention_mask"], mm_token_type_ids=mm,
                           vision=split_vision(enc.get("pixel_values"), enc.get("image_grid_thw"), images_per_prompt),
                           media=split_media(images or [], images_per_prompt), texts=texts)

    # ---- sampling -------------------------------------------------------------------------------------------------

    def generate(
        self,
        prompts: PromptBatch,
        group_size: int,
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
    ) -> CompletionBatch:
        """Sample ``group_size`` completions per prompt (HF ``generate``; images are encoded once per prompt there)."""
        batch = prompts.to(self.device)
        inputs = dict(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            mm_token_type_ids=batch.mm_token_type_ids,
        )
        inputs.update(join_vision(batch.vision))
        return self._sample(inputs, prompts, group_size, max_new_tokens=max_new_tokens, temperature=temperature,
                            top_p=top_p, top_k=top_k)

    def check_completions(self, completion_ids: torch.Tensor, mask: torch.Tensor) -> None:
        self.check_no_vision_tokens(completion_ids, mask)

    def check_no_vision_tokens(self, completion_ids: torch.Tensor, mask: torch.Tensor) -> None:
        """Refuse completions containing vision special tokens (e.g. from an engine without token suppression)."""
        bad = torch.isin(completion_ids, torch.as_tensor(self.vision_token_ids, device=completion_ids.device)) & mask
        if bad.any():
            rows = sorted(set(bad.nonzero()[:, 0].tolist()))
            raise ValueError(
                f"completions {rows[:10]} contain vision special tokens {self.vision_token_ids}; they would break the "
                "image-feature alignment of the training forward. Suppress them in the rollout engine."
            )

    # ---- scoring --------------------------------------------------------------------------------------------------

    def _image_encoder_outputs(self, vision: dict[str, torch.Tensor], index: list[int]) -> dict[str, Any]:
        """Vision features of every image once, then shared by the copies of its prompt (``index``:
        :func:`group_image_index`): the merged patch features, and Qwen3-VL's DeepStack features (each level
        indexed the same way)."""
        feats = self.model.model.get_image_features(vision["pixel_values"], vision["image_grid_thw"], return_dict=True)
        shared = {"pooler_output": tuple(feats.pooler_output[i] for i in index)}
        if getattr(feats, "deepstack_features", None) is not None:
            shared["deepstack_features"] = [tuple(level[i] for i in index) for level in feats.deepstack_features]
        return {"mm_encoder_outputs": {"image": type(feats)(**shared)}}

    def _repeated_pixels(self, vision: dict[str, torch.Tensor], index: list[int]) -> dict[str, Any]:
        """Pixel rows of every image repeated per copy (the vision tower then runs once per copy of each image)."""
        blocks = torch.split(vision["pixel_values"], vision["image_grid_thw"].prod(-1).tolist())
        return {"pixel_values": torch.cat([blocks[i] for i in index])}

    def completion_logprobs(
        self,
        rollout: CompletionBatch,
        *,
        chunk_size: int = 1024,
        temperature: float = 1.0,
        encode_images_once: bool = True,
        packed: bool = False,
    ) -> torch.Tensor:
        """Per-token log-probs ``[N, T]`` of the completion tokens (0 where the mask is 0), with gradients.

        ``logp[i, t] = log softmax(z_{i, Lp + t - 1} / temperature)[y_{i, t}]`` over the vocabulary without the vision
        special tokens (which :meth:`generate` suppresses), i.e. exactly the sampling distribution: the hidden state of the position before
        each completion token, scored by the output embedding in chunks of ``chunk_size`` tokens
        (:meth:`~mmgpg.models.base.PolicyBase.score_hidden`). Only masked-in positions are scored.
        """
        self.check_packing(packed)  # never packable (Family.packing): M-RoPE, Qwen3.5's recurrent layers
        batch, G = rollout.prompts, rollout.group_size
        comp_ids, comp_mask = rollout.completion_ids, rollout.completion_mask
        device = self.device
        batch = batch.to(device)
        comp_ids, comp_mask = comp_ids.to(device), comp_mask.to(device)
        prompt_len = batch.input_ids.shape[1]
        input_ids = torch.cat([batch.input_ids.repeat_interleave(G, 0), comp_ids], dim=1)
        attention_mask = torch.cat([batch.attention_mask.repeat_interleave(G, 0), comp_mask.long()], dim=1)
        mm = torch.cat([batch.mm_token_type_ids.repeat_interleave(G, 0), torch.zeros_like(comp_ids)], dim=1)
        kwargs: dict[str, Any] = dict(input_ids=input_ids, attention_mask=attention_mask, mm_token_type_ids=mm)
        vision = join_vision(batch.vision)
        if vision:
            index = group_image_index(batch.media_per_prompt, G)
            kwargs["image_grid_thw"] = vision["image_grid_thw"][index]
            kwargs.update(self._image_encoder_outputs(vision, index) if encode_images_once
                          else self._repeated_pixels(vision, index))
        hidden = self.model.model(**kwargs, use_cache=False).last_hidden_state
        return self.score_hidden(hidden, prompt_len, comp_ids, comp_mask, chunk_size=chunk_size,
                                 temperature=temperature)



def split_vision(pixel_values: torch.Tensor | None, grid_thw: torch.Tensor | None,
                 images_per_prompt: Sequence[int]) -> list[dict[str, torch.Tensor]]:
    """The processor's batched ``pixel_values`` (rows flat over all images: image ``i`` owns ``prod(grid_thw[i])``)
    and ``image_grid_thw`` as each prompt's own (views, no copy); ``{}`` for a prompt without images."""
    out: list[dict[str, torch.Tensor]] = []
    rows = grid_thw.prod(-1).tolist() if grid_thw is not None else []
    image = row = 0
    for n in images_per_prompt:
        if not n:
            out.append({})
            continue
        count = sum(rows[image : image + n])
        out.append({"pixel_values": pixel_values[row : row + count], "image_grid_thw": grid_thw[image : image + n]})
        image, row = image + n, row + count
    return out


def split_media(items: Sequence[Any], per_prompt: Sequence[int]) -> list[list[Any]]:
    """A flat list of media (the images of all prompts, in order) as one list per prompt.

    >>> split_media(["a", "b", "c"], [2, 0, 1])
    [['a', 'b'], [], ['c']]
    """
    out, start = [], 0
    for n in per_prompt:
        out.append(list(items[start : start + n]))
        start += n
    return out
