"""The generic image-text-to-text policy: any family whose processor and chat template follow transformers'
conventions (``AutoProcessor`` renders and expands image placeholders; ``AutoModelForImageTextToText`` takes the
processor's tensors and precomputed ``mm_encoder_outputs``): Gemma 3, InternVL, SmolVLM, LLaVA-OneVision.

What differs between these families is data on their :class:`~mmgpg.models.Family`, never a branch here: the tokens
never to sample (``suppressed_tokens``: the image placeholders a sampled one would desynchronise, and their
delimiters), the keyword under which the forward takes the image-token types (``token_types_kwarg``: Gemma 3's
``token_type_ids`` switch on bidirectional attention inside each image, so generation and scoring both pass them),
per-prompt counts the forward needs for every prompt (``prompt_counts``: LLaVA-OneVision's ``batch_num_images``), and
what a raw prompt writes for an image (``raw_image_text``).

* :meth:`ImageTextPolicy.encode_prompts` renders each conversation with the processor's chat template and runs the
  processor on each prompt **alone** (``add_special_tokens=False``: the template writes its own BOS), so every prompt
  keeps exactly its own vision tensors (:attr:`PromptBatch.vision`, whatever their layout: images, tiles, sub-images
  or crops along dim 0, or a per-prompt stack) and a batch of any prompts is :func:`~mmgpg.models.batch.join_vision`
  of theirs (padding a processor's per-batch dimension with zeros, which these models skip). Images are loaded
  (``transformers.image_utils.load_image``: PIL, path, URL, base64) and resized by the family's own processor.
* :meth:`ImageTextPolicy.generate` is :meth:`~mmgpg.models.base.PolicyBase._sample` with the joined tensors.
* :meth:`ImageTextPolicy.completion_logprobs` runs the inner model on prompts + completions with
  ``position_ids = cumsum(mask) - 1`` (what ``generate`` uses: left padding then changes nothing), and scores the
  completion positions with the output head in chunks. With ``encode_images_once`` each prompt's image features are
  computed once (``get_image_features`` on its own tensors) and repeated for its ``group_size`` copies
  (``mm_encoder_outputs``; a tensor of features is concatenated per copy, a list per image or per prompt extended),
  so the vision tower runs once per prompt and the gradients of every copy meet there.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from mmgpg.models.base import PolicyBase
from mmgpg.models.batch import CompletionBatch, PromptBatch, is_image_part, join_vision
from mmgpg.models.text import positions


class ImageTextPolicy(PolicyBase):
    """A loaded image-text-to-text model of a generic family with its processor (implements
    :class:`mmgpg.models.Policy`). Build one with :func:`mmgpg.models.load.load_policy`."""

    auto_model: ClassVar[str] = "AutoModelForImageTextToText"
    auto_processor: ClassVar[str] = "AutoProcessor"
    takes_images: ClassVar[bool] = True

    def __init__(self, model, processor, *, min_pixels: int, max_pixels: int, max_prompt_length: int | None = None):
        self._setup(model, processor, processor.tokenizer, family=getattr(model.config, "model_type", None),
                    max_prompt_length=max_prompt_length)
        tok = processor.tokenizer
        ids = [tok.convert_tokens_to_ids(t) for t in self.spec.suppressed_tokens]
        self.suppressed_token_ids = sorted({i for i in ids if i is not None and i != tok.unk_token_id})
        config = model.config
        self.image_token_id = getattr(config, "image_token_id", None)
        if self.image_token_id is None:
            self.image_token_id = config.image_token_index
        # min_pixels / max_pixels: Qwen's resize bounds; these processors resize to their own configured sizes.
        self.min_pixels, self.max_pixels = min_pixels, max_pixels
        self._feature_args = set(inspect.signature(model.model.get_image_features).parameters)

    # ---- prompts --------------------------------------------------------------------------------------------------

    def render_prompt(self, conversation: list[dict]) -> str:
        """The prompt text of one conversation: the processor's chat template with a generation prompt, or a raw
        prompt (one ``{"role": "raw", "content": [parts]}`` message: text as is, each image as the family's
        ``raw_image_text``)."""
        if any(m.get("role") == "raw" for m in conversation):
            if len(conversation) != 1 or not isinstance(conversation[0].get("content"), list):
                raise ValueError("a raw prompt is exactly one {'role': 'raw', 'content': [parts]} message")
            pieces = []
            for part in conversation[0]["content"]:
                if is_image_part(part):
                    pieces.append(self.spec.raw_image_text)
                elif isinstance(part, dict) and part.get("type") == "text":
                    pieces.append(str(part["text"]))
                else:
                    raise ValueError(f"raw prompt parts are images or text; got {part!r}")
            return "".join(pieces)
        return self.processor.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False,
                                                  **self.chat_template_kwargs)

    @staticmethod
    def _images(conversation: list[dict], where: str) -> list:
        """The conversation's images, loaded (PIL); a video or other medium is refused."""
        from transformers.image_utils import load_image

        out = []
        for message in conversation:
            content = message.get("content")
            for part in content if isinstance(content, list) else []:
                if isinstance(part, dict) and (part.get("type") in ("video", "video_url") or "video" in part):
                    raise ValueError(f"{where} has a video part: video inputs are not supported by mmgpg yet; give "
                                     "images")
                if is_image_part(part):
                    source = part.get("image", part.get("image_url", part.get("url")))
                    if isinstance(source, dict):
                        source = source.get("url")
                    out.append(load_image(source).convert("RGB"))
        return out

    def encode_prompts(self, conversations: Sequence[list[dict]]) -> PromptBatch:
        """Chat conversations (image parts: ``{"type": "image", "image": PIL.Image | path | URL | base64}``) → one
        left-padded batch; each prompt processed alone (its own vision tensors, exactly)."""
        if not conversations:
            raise ValueError("encode_prompts needs at least one conversation")
        ids, types, vision, media, texts = [], [], [], [], []
        kwarg = self.spec.token_types_kwarg
        for i, conversation in enumerate(conversations):
            text = self.render_prompt(conversation)
            images = self._images(conversation, f"conversation {i}")
            enc = self.processor(text=[text], images=[images] if images else None, return_tensors="pt",
                                 add_special_tokens=False)
            row = enc["input_ids"][0]
            kind = enc.get(kwarg)[0] if kwarg and kwarg in enc else (row == self.image_token_id).long()
            part = {k: v for k, v in enc.items() if k not in ("input_ids", "attention_mask", kwarg)}
            for key in self.spec.prompt_counts:  # one value per prompt, for every prompt (0 without images)
                part.setdefault(key, torch.tensor([len(images)]))
            ids.append(row)
            types.append(kind.long())
            vision.append(part if images else {k: v for k, v in part.items() if k in self.spec.prompt_counts})
            media.append(images)
            texts.append(text)
        width = max(len(r) for r in ids)

        def left_pad(rows, value):
            return torch.stack([torch.cat([r.new_full((width - len(r),), value), r]) for r in rows])

        mask = left_pad([torch.ones_like(r) for r in ids], 0)
        self.check_prompt_lengths(mask, "Image tokens count too; use smaller images (the processor's size) or raise "
                                  "model.max_prompt_length.")
        return PromptBatch(input_ids=left_pad(ids, self.pad_token_id), attention_mask=mask,
                           mm_token_type_ids=left_pad(types, 0), vision=vision, media=media, texts=texts)

    def _types(self, mm_token_type_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        kwarg = self.spec.token_types_kwarg
        return {kwarg: mm_token_type_ids} if kwarg else {}

    # ---- sampling -------------------------------------------------------------------------------------------------

    def generate(self, prompts: PromptBatch, group_size: int, *, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, top_k: int = 0) -> CompletionBatch:
        """``group_size`` sampled completions per prompt (HF ``generate``, which encodes each prompt's images once)."""
        batch = prompts.to(self.device)
        inputs = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                      **self._types(batch.mm_token_type_ids), **join_vision(batch.vision))
        return self._sample(inputs, prompts, group_size, max_new_tokens=max_new_tokens, temperature=temperature,
                            top_p=top_p, top_k=top_k)

    def check_completions(self, completion_ids: torch.Tensor, mask: torch.Tensor) -> None:
        """Refuse completions with a suppressed token (an engine without suppression): an image placeholder would
        desynchronise the image features of the scoring forward."""
        if not self.suppressed_token_ids:
            return
        bad = torch.isin(completion_ids, torch.as_tensor(self.suppressed_token_ids, device=completion_ids.device)) & mask
        if bad.any():
            rows = sorted(set(bad.nonzero()[:, 0].tolist()))
            raise ValueError(f"completions {rows[:10]} contain image tokens {self.suppressed_token_ids}; they would "
                             "break the image-feature alignment of the training forward. Suppress them in the engine.")

    # ---- scoring --------------------------------------------------------------------------------------------------

    def _encoder_outputs(self, vision: list[dict[str, torch.Tensor]], G: int) -> dict[str, Any]:
        """``mm_encoder_outputs`` for the expanded batch: each prompt's features computed once from its own tensors
        and repeated for its ``G`` copies (prompt-major, as the rows)."""
        with self._outer_parameters_gathered():
            pieces, kind = self._image_features(vision, G)
        if not pieces:
            return {}
        pooled = torch.cat(pieces) if isinstance(pieces[0], torch.Tensor) else [t for p in pieces for t in p]
        return {"mm_encoder_outputs": {"image": kind(pooler_output=pooled)}}

    def _outer_parameters_gathered(self) -> contextlib.AbstractContextManager:
        """Under ZeRO-3, the parameters of the multimodal model itself (not of a submodule: LLaVA-OneVision's
        ``image_newline``), gathered while :meth:`_encoder_outputs` calls ``get_image_features`` outside any forward
        of theirs, and registered as external parameters of that model (``fwd_module``) so their gradient is
        gathered and reduced with its backward; a no-op otherwise."""
        own = [p for p in self.model.model.parameters(recurse=False) if hasattr(p, "ds_id")]
        if not own:
            return contextlib.nullcontext()
        import deepspeed

        return deepspeed.zero.GatheredParameters(own, modifier_rank=None, fwd_module=self.model.model)

    def _image_features(self, vision: list[dict[str, torch.Tensor]], G: int) -> tuple[list, Any]:
        pieces, kind = [], None
        for part in vision:
            if not any(k not in self.spec.prompt_counts for k in part):
                continue  # a prompt without images
            args = {k: v for k, v in part.items() if k in self._feature_args}
            feats = self.model.model.get_image_features(**args, return_dict=True)
            kind = type(feats)
            po = feats.pooler_output
            pieces += [po] * G if isinstance(po, torch.Tensor) else [list(po)] * G
        return pieces, kind

    def completion_logprobs(self, rollout: CompletionBatch, *, chunk_size: int = 1024, temperature: float = 1.0,
                            encode_images_once: bool = True, packed: bool = False) -> torch.Tensor:
        """Per-token log-probs ``[N, T]`` of the completion tokens (0 where the mask is 0), with gradients: the
        position before each completion token scored by the output head over the vocabulary without the suppressed
        tokens (:meth:`~mmgpg.models.base.PolicyBase.score_hidden`)."""
        self.check_packing(packed)
        batch, G = rollout.prompts.to(self.device), rollout.group_size
        comp_ids, comp_mask = rollout.completion_ids.to(self.device), rollout.completion_mask.to(self.device)
        prompt_len = batch.input_ids.shape[1]
        input_ids = torch.cat([batch.input_ids.repeat_interleave(G, 0), comp_ids], dim=1)
        attention_mask = torch.cat([batch.attention_mask.repeat_interleave(G, 0), comp_mask.long()], dim=1)
        types = torch.cat([batch.mm_token_type_ids.repeat_interleave(G, 0), torch.zeros_like(comp_ids)], dim=1)
        kwargs: dict[str, Any] = dict(input_ids=input_ids, attention_mask=attention_mask,
                                      position_ids=positions(attention_mask), **self._types(types))
        if encode_images_once:
            kwargs.update(self._encoder_outputs(batch.vision, G))
            counts = [{k: v for k, v in part.items() if k in self.spec.prompt_counts} for part in batch.vision]
            kwargs.update(join_vision([c for c in counts for _ in range(G)]))
        else:
            kwargs.update(join_vision([part for part in batch.vision for _ in range(G)]))
        hidden = self.model.model(**kwargs, use_cache=False).last_hidden_state
        return self.score_hidden(hidden, prompt_len, comp_ids, comp_mask, chunk_size=chunk_size,
                                 temperature=temperature)

