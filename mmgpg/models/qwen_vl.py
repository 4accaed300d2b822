"""The policy: a Qwen2-VL / Qwen2.5-VL model, its processor, and the operations RL needs from them.

Everything Qwen2-VL-specific (``pixel_values``, ``image_grid_thw``, ``mm_token_type_ids``, M-RoPE, vision special
tokens) stays in this file. The rest of mmgpg sees three operations:

* :meth:`Policy.encode_prompts` — chat conversations with images → one left-padded :class:`PromptBatch`. Images go
  through ``qwen_vl_utils`` (paths, URLs, base64, PIL) with the configured ``min_pixels``/``max_pixels``; rollout and
  training share this single path.
* :meth:`Policy.generate` — ``group_size`` sampled completions per prompt (:class:`CompletionBatch`), prompt-major order
  (prompt 0's completions first). The completion mask ends at the first EOS of *any* id in the generation config.
* :meth:`Policy.completion_logprobs` — per-token log-probabilities of the completion tokens only, differentiable,
  computed from hidden states in chunks so that peak memory is O(chunk × vocab) rather than
  O(batch × length × vocab). Each prompt's images are encoded once and the features shared by its ``group_size``
  sequences (``encode_images_once``); gradients from all copies flow back into the one vision-tower pass.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from mmgpg.models.logprobs import (  # noqa: F401  (pad_completions: re-exported with the batches)
    chunked_token_logprobs,
    completion_mask,
    group_image_index,
    pad_completions,
)

SUPPORTED_MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl")
VISION_SPECIAL_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")
TINY_PREFIX = "tiny"


# --------------------------------------------------------------------------------------------------------------------
# Batches
# --------------------------------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------------------------------
# Policy
# --------------------------------------------------------------------------------------------------------------------


class Policy:
    """A loaded Qwen2-VL / Qwen2.5-VL model with its processor. Build one with
    :func:`mmgpg.models.load.load_policy`."""

    def __init__(self, model, processor, *, min_pixels: int, max_pixels: int, max_prompt_length: int | None = None):
        model_type = getattr(model.config, "model_type", None)
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"mmgpg supports model types {', '.join(SUPPORTED_MODEL_TYPES)}; got {model_type!r}. "
                "Load a Qwen2-VL or Qwen2.5-VL checkpoint (e.g. Qwen/Qwen2-VL-2B-Instruct)."
            )
        if not 0 < min_pixels <= max_pixels:
            raise ValueError(f"need 0 < min_pixels <= max_pixels; got min_pixels={min_pixels}, max_pixels={max_pixels}")
        self.model = model
        self.processor = processor
        self.peft = None  # the peft.PeftModel owning LoRA adapters injected into `model` (mmgpg.models.lora.attach)
        self.family = model_type
        self.min_pixels = min_pixels
        self.max_pixels = max_pixels
        self.max_prompt_length = max_prompt_length
        tok = processor.tokenizer
        tok.padding_side = "left"
        processor.image_processor.size = {"shortest_edge": min_pixels, "longest_edge": max_pixels}
        gen = model.generation_config
        eos = gen.eos_token_id if gen.eos_token_id is not None else tok.eos_token_id
        self.eos_token_ids: list[int] = list(eos) if isinstance(eos, (list, tuple)) else [eos]
        self.pad_token_id: int = gen.pad_token_id if gen.pad_token_id is not None else tok.pad_token_id
        if self.pad_token_id is None:
            self.pad_token_id = self.eos_token_ids[0]
        ids = tok.convert_tokens_to_ids(list(VISION_SPECIAL_TOKENS))
        self.vision_token_ids: list[int] = [i for i in ids if i is not None and i != tok.unk_token_id]
        self.image_token_id: int = model.config.image_token_id
        self.patch_size: int = int(getattr(processor.image_processor, "patch_size", 14))

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def merged_state_dict(self) -> dict[str, torch.Tensor]:
        """The weights a rollout engine with its own copy (vLLM) must load after each update: the model's state dict
        with LoRA adapters merged under the base model's names (:func:`mmgpg.models.lora.merged_state_dict`)."""
        from mmgpg.models.lora import merged_state_dict

        return merged_state_dict(self.model)

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
        return self.processor.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)

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
        if self.max_prompt_length is not None:
            lengths = enc["attention_mask"].sum(-1)
            too_long = [(i, int(n)) for i, n in enumerate(lengths) if n > self.max_prompt_length]
            if too_long:
                listed = ", ".join(f"prompt {i}: {n} tokens" for i, n in too_long)
                raise ValueError(
                    f"{len(too_long)} prompt(s) exceed max_prompt_length={self.max_prompt_length} ({listed}). "
                    "Image tokens count too; lower model.max_pixels or raise max_prompt_length. "
                    "mmgpg never truncates a prompt silently."
                )
        return PromptBatch(
            input_ids=input_ids,
            attention_mask=enc["attention_mask"],
            mm_token_type_ids=mm,
            pixel_values=enc.get("pixel_values"),
            image_grid_thw=enc.get("image_grid_thw"),
            images_per_prompt=images_per_prompt,
            texts=texts,
            images=images,
        )

    # ---- sampling -------------------------------------------------------------------------------------------------

    def sampling_kwargs(
        self, *, max_new_tokens: int, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0
    ) -> dict[str, Any]:
        """``generate`` settings that fix every logits processor a checkpoint's generation config could switch on.

        transformers fills any generation setting left at ``None`` from the checkpoint's ``generation_config.json``
        (Qwen2-VL-Instruct ships ``top_k=1, top_p=0.001, temperature=0.1, repetition_penalty=1.05``), so the neutral
        values are set explicitly. With ``temperature`` 1, ``top_p`` 1 and ``top_k`` 0, completions are sampled from
        exactly the distribution :meth:`completion_logprobs` scores (on-policy). ``temperature=0`` is greedy decoding.
        """
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1; got {max_new_tokens}")
        common = dict(
            max_new_tokens=max_new_tokens,
            repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            min_new_tokens=0,
            eos_token_id=self.eos_token_ids,
            pad_token_id=self.pad_token_id,
            # A sampled vision token would desynchronise image features and placeholders in the training forward.
            suppress_tokens=self.vision_token_ids,
        )
        if temperature == 0:  # greedy: the sampling filters below have no effect, so they are not passed
            return dict(common, do_sample=False)
        return dict(common, do_sample=True, temperature=float(temperature), top_p=float(top_p), top_k=int(top_k),
                    min_p=0.0, typical_p=1.0, epsilon_cutoff=0.0, eta_cutoff=0.0)

    @torch.no_grad()
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
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1; got {group_size}")
        batch = prompts.to(self.device)
        inputs = dict(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            mm_token_type_ids=batch.mm_token_type_ids,
        )
        if batch.pixel_values is not None:
            inputs.update(pixel_values=batch.pixel_values, image_grid_thw=batch.image_grid_thw)
        was_training = self.model.training
        self.model.eval()
        try:
            out = self.model.generate(
                **inputs,
                num_return_sequences=group_size,
                **self.sampling_kwargs(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k),
            )
        finally:
            self.model.train(was_training)
        completion_ids = out[:, batch.input_ids.shape[1] :]
        mask = completion_mask(completion_ids, self.eos_token_ids)
        self.check_no_vision_tokens(completion_ids, mask)
        texts = self.processor.batch_decode(
            completion_ids.masked_fill(~mask, self.pad_token_id), skip_special_tokens=True
        )
        return CompletionBatch(prompts=prompts, group_size=group_size, completion_ids=completion_ids.cpu(),
                       completion_mask=mask.cpu(), texts=texts)

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

    def _image_encoder_outputs(self, batch: PromptBatch, index: list[int]) -> dict[str, Any]:
        """Vision features of every image once, then shared by the copies of its prompt (``index``:
        :func:`group_image_index`)."""
        from transformers.modeling_outputs import BaseModelOutputWithPooling

        feats = self.model.model.get_image_features(batch.pixel_values, batch.image_grid_thw, return_dict=True)
        per_image = feats.pooler_output
        return {"mm_encoder_outputs": {"image": BaseModelOutputWithPooling(pooler_output=tuple(per_image[i] for i in index))}}

    def _repeated_pixels(self, batch: PromptBatch, index: list[int]) -> dict[str, Any]:
        """Pixel rows of every image repeated per copy (the vision tower then runs once per copy of each image)."""
        rows = batch.image_grid_thw.prod(-1).tolist()
        blocks = torch.split(batch.pixel_values, rows)
        return {"pixel_values": torch.cat([blocks[i] for i in index])}

    def completion_logprobs(
        self,
        rollout: CompletionBatch,
        *,
        chunk_size: int = 1024,
        temperature: float = 1.0,
        encode_images_once: bool = True,
        rows: slice | None = None,
    ) -> torch.Tensor:
        """Per-token log-probs ``[N, T]`` of the completion tokens (0 where the mask is 0), with gradients.

        ``logp[i, t] = log softmax(z_{i, Lp + t - 1} / temperature)[y_{i, t}]`` over the vocabulary without the vision
        special tokens (which :meth:`generate` suppresses), i.e. exactly the sampling distribution: the hidden state of the position before
        each completion token, scored by the output embedding in chunks of ``chunk_size`` tokens
        (:func:`chunked_token_logprobs`). Only masked-in positions are scored. ``rows`` selects a micro-batch of whole
        prompt groups (a slice of prompts); the result then covers only those prompts' sequences.
        """
        batch, G = rollout.prompts, rollout.group_size
        comp_ids, comp_mask = rollout.completion_ids, rollout.completion_mask
        if rows is not None:
            batch, comp_ids, comp_mask = _select_prompts(batch, rows, G, comp_ids, comp_mask)
        device = self.device
        batch = batch.to(device)
        comp_ids, comp_mask = comp_ids.to(device), comp_mask.to(device)
        prompt_len = batch.input_ids.shape[1]
        input_ids = torch.cat([batch.input_ids.repeat_interleave(G, 0), comp_ids], dim=1)
        attention_mask = torch.cat([batch.attention_mask.repeat_interleave(G, 0), comp_mask.long()], dim=1)
        mm = torch.cat([batch.mm_token_type_ids.repeat_interleave(G, 0), torch.zeros_like(comp_ids)], dim=1)
        kwargs: dict[str, Any] = dict(input_ids=input_ids, attention_mask=attention_mask, mm_token_type_ids=mm)
        if batch.pixel_values is not None:
            index = group_image_index(batch.images_per_prompt, G)
            kwargs["image_grid_thw"] = batch.image_grid_thw[index]
            kwargs.update(self._image_encoder_outputs(batch, index) if encode_images_once
                          else self._repeated_pixels(batch, index))
        from mmgpg.models.lora import output_head

        hidden = self.model.model(**kwargs, use_cache=False).last_hidden_state
        scored = hidden[:, prompt_len - 1 : -1][comp_mask]  # [K, H]: positions that predict completion tokens
        head = self.model.get_output_embeddings()

        def score(hidden_, targets_):  # reads the head's weights only inside head's own call (see _call_through)
            weight, bias = output_head(self.model)  # through PEFT's wrappers: the head the forward really uses
            return chunked_token_logprobs(hidden_, weight, targets_, chunk_size=chunk_size, bias=bias,
                                          temperature=temperature, excluded_token_ids=self.vision_token_ids)

        logp = _call_through(head, score, scored, comp_ids[comp_mask])
        out = torch.zeros(comp_ids.shape, dtype=logp.dtype, device=device)
        return out.masked_scatter(comp_mask, logp)


def _call_through(module: torch.nn.Module, fn, *args):
    """``fn(*args)`` run as ``module``'s forward, so hooks on ``module`` see it: DeepSpeed ZeRO-3 gathers a
    partitioned ``lm_head.weight`` for the call and again for its backward (and releases it after each), exactly as for
    the module's own forward. Without hooks this is ``fn(*args)``."""
    module.forward = fn  # an instance attribute shadows the class's forward for this one call
    try:
        return module(*args)
    finally:
        del module.forward


def gather_prompts(rows: Sequence[tuple[PromptBatch, int]], pad_token_id: int) -> PromptBatch:
    """One left-padded batch of prompt ``p`` of each ``(batch, p)``: how the update reuses the prompts the rollout
    already encoded (images preprocessed once per step) for micro-batches of groups from any attempts."""
    if not rows:
        raise ValueError("gather_prompts needs at least one (batch, prompt index)")
    ids, mm, pixels, grids, per_prompt, texts = [], [], [], [], [], []
    for batch, p in rows:
        keep = batch.attention_mask[p].bool()
        ids.append(batch.input_ids[p][keep])
        mm.append(batch.mm_token_type_ids[p][keep])
        n_images = batch.images_per_prompt[p]
        if n_images:
            first = sum(batch.images_per_prompt[:p])
            counts = batch.image_grid_thw.prod(-1)
            start = int(counts[:first].sum())
            pixels.append(batch.pixel_values[start : start + int(counts[first : first + n_images].sum())])
            grids.append(batch.image_grid_thw[first : first + n_images])
        per_prompt.append(n_images)
        texts.append(batch.texts[p])
    width = max(len(x) for x in ids)

    def left_pad(rows_, value):
        return torch.stack([torch.cat([r.new_full((width - len(r),), value), r]) for r in rows_])

    return PromptBatch(
        input_ids=left_pad(ids, pad_token_id),
        attention_mask=left_pad([torch.ones_like(r) for r in ids], 0),
        mm_token_type_ids=left_pad(mm, 0),
        pixel_values=torch.cat(pixels) if pixels else None,
        image_grid_thw=torch.cat(grids) if grids else None,
        images_per_prompt=per_prompt,
        texts=texts,
    )


def _select_prompts(batch: PromptBatch, rows: slice, group_size: int, comp_ids, comp_mask):
    """The sub-batch of prompts ``rows`` (and their completions), trimmed of left padding shared by all of them."""
    p_index = list(range(batch.num_prompts))[rows]
    if not p_index or p_index != list(range(p_index[0], p_index[-1] + 1)):
        raise ValueError(f"rows must select a non-empty contiguous range of prompts; got {rows}")
    p0, p1 = p_index[0], p_index[-1] + 1
    img_start = sum(batch.images_per_prompt[:p0])
    img_end = img_start + sum(batch.images_per_prompt[p0:p1])
    pixel_values = grid = None
    if batch.image_grid_thw is not None and img_end > img_start:
        row_counts = batch.image_grid_thw.prod(-1)
        r0, r1 = int(row_counts[:img_start].sum()), int(row_counts[:img_end].sum())
        pixel_values, grid = batch.pixel_values[r0:r1], batch.image_grid_thw[img_start:img_end]
    attn = batch.attention_mask[p0:p1]
    keep_from = int((attn.sum(0) > 0).nonzero()[0]) if attn.any() else 0
    sub = PromptBatch(
        input_ids=batch.input_ids[p0:p1, keep_from:],
        attention_mask=attn[:, keep_from:],
        mm_token_type_ids=batch.mm_token_type_ids[p0:p1, keep_from:],
        pixel_values=pixel_values,
        image_grid_thw=grid,
        images_per_prompt=batch.images_per_prompt[p0:p1],
        texts=batch.texts[p0:p1],
    )
    s0, s1 = p0 * group_size, p1 * group_size
    return sub, comp_ids[s0:s1], comp_mask[s0:s1]
