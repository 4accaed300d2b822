"""The Qwen-VL policy: a Qwen2-VL / Qwen2.5-VL / Qwen3-VL (dense or MoE) model, its processor, and the operations RL
needs from them.

Everything Qwen-VL-specific (``pixel_values`` rows and ``image_grid_thw``, M-RoPE, vision special tokens, DeepStack
features) stays in this file. The rest of mmgpg sees three operations:

* :meth:`Policy.encode_prompts` — chat conversations with images and videos → one left-padded :class:`PromptBatch`.
  Images and videos go through ``qwen_vl_utils`` (paths, URLs, base64, PIL; a video file or a list of frames) with the
  configured ``min_pixels``/``max_pixels`` (per video frame too), ``video_fps`` and ``video_max_frames``; rollout and
  training share this single path.
* :meth:`Policy.generate` — ``group_size`` sampled completions per prompt (:class:`CompletionBatch`), prompt-major order
  (prompt 0's completions first). The completion mask ends at the first EOS of *any* id in the generation config.
* :meth:`Policy.completion_logprobs` — per-token log-probabilities of the completion tokens only, differentiable,
  computed from hidden states in chunks so that peak memory is O(chunk × vocab) rather than
  O(batch × length × vocab). Each prompt's images are encoded once and the features shared by its ``group_size``
  sequences (``encode_images_once``; Qwen3-VL's DeepStack features too); gradients from all copies flow back into
  the one vision-tower pass.

A prompt's vision inputs travel per prompt (:attr:`PromptBatch.vision`: its ``pixel_values`` rows and its images'
``image_grid_thw``, its videos' ``pixel_values_videos`` rows, ``video_grid_thw`` and, for Qwen2.5-VL,
``second_per_grid_ts``); they are joined for a forward (:func:`~mmgpg.models.batch.join_vision`), which gives exactly the
processor's batched tensors.

The EOS, sampling and scoring rules are :class:`mmgpg.models.base.PolicyBase`'s, shared with the text policy.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from mmgpg.models.base import PolicyBase
from mmgpg.models.batch import CompletionBatch, PromptBatch, is_image_part, is_video_part, join_vision
from mmgpg.models.logprobs import group_image_index
from mmgpg.models.video import load_video, read_video, video_part  # noqa: F401 - read_video: the public name here

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
        self.video_token_id: int | None = getattr(model.config, "video_token_id", None)
        self.patch_size: int = int(getattr(processor.image_processor, "patch_size", 14))  # Qwen3-VL: 16
        # Video frames: sampled at video_fps from a file (qwen-vl-utils), at most video_max_frames of them; a list of
        # frames longer than that is subsampled evenly (model.video_fps / model.video_max_frames; set by load_policy).
        self.video_fps: float = 2.0
        self.video_max_frames: int = 16
        self.video_total_pixels: int = 0  # a video's pixel budget over its frames (0: qwen-vl-utils' default)
        if model_type in ("qwen2_vl", "qwen2_5_vl"):  # their video positions: Qwen's rule (see video_rope_index)
            inner = model.model
            inner.get_rope_index = functools.partial(video_rope_index, inner, inner.get_rope_index)

    # ---- prompts --------------------------------------------------------------------------------------------------

    def _with_media_defaults(self, conversation: list[dict]) -> list[dict]:
        """The conversation with the policy's pixel bounds on every image and video part that sets none, and its
        frame budget on every video part (:func:`video_part`)."""
        conversation = copy.copy(conversation)
        for m, message in enumerate(conversation):
            if isinstance(message.get("content"), list):
                parts = []
                for part in message["content"]:
                    if is_video_part(part):
                        part = video_part(part, self.video_fps, self.video_max_frames, self.min_pixels,
                                          self.max_pixels, self.video_total_pixels)
                    elif is_image_part(part):
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
                if is_image_part(part):
                    pieces.append("<|vision_start|><|image_pad|><|vision_end|>")
                elif is_video_part(part):
                    pieces.append("<|vision_start|><|video_pad|><|vision_end|>")
                elif part.get("type") == "text":
                    pieces.append(str(part["text"]))
                else:
                    raise ValueError(f"raw prompt parts are images, videos or text; got {part!r}")
            return "".join(pieces)
        return self.processor.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False,
                                                  **self.chat_template_kwargs)

    def encode_prompts(self, conversations: Sequence[list[dict]]) -> PromptBatch:
        """Turn chat conversations into one left-padded batch.

        Each conversation is a list of ``{"role", "content"}`` messages; image parts are
        ``{"type": "image", "image": PIL.Image | path | "file://..." | URL | "data:image/...;base64,..."}`` and may set
        their own ``min_pixels``/``max_pixels`` (the policy's bounds are the default). Video parts are
        ``{"type": "video", "video": path | URL | [frames]}`` (frames: PIL images or image paths), optionally with
        ``fps`` (a file: the sampling rate; a frame list: the rate its frames were taken at), ``max_frames`` and
        per-frame ``min_pixels``/``max_pixels`` (:func:`video_part`). A generation prompt is appended.

        A conversation of one ``{"role": "raw", "content": [...]}`` message bypasses the chat template: its parts are
        concatenated in order, each image as ``<|vision_start|><|image_pad|><|vision_end|>`` (a base model's text
        prompt, e.g. the R1-Zero prompt of the CV-Bench recipe).
        """
        from qwen_vl_utils import extract_vision_info, fetch_image

        if not conversations:
            raise ValueError("encode_prompts needs at least one conversation")
        conversations = [self._with_media_defaults(c) for c in conversations]
        texts = [self.render_prompt(c) for c in conversations]
        infos = [extract_vision_info([c]) for c in conversations]
        videos_per_prompt = [sum(is_video_part(i) for i in info) for info in infos]
        images_per_prompt = [len(info) - v for info, v in zip(infos, videos_per_prompt)]
        images = [fetch_image(i, image_patch_size=self.patch_size) for info in infos for i in info if not is_video_part(i)]
        loaded = [load_video(i, self.patch_size) for info in infos for i in info if is_video_part(i)]
        videos = [frames for frames, _ in loaded] or None
        # frames already sampled and resized (load_video): the video processor must neither sample nor resize them
        # again (a checkpoint's video processor has its own, larger pixel bounds); the metadata gives Qwen3-VL's
        # timestamps and Qwen2.5-VL's temporal positions
        videos_kwargs = {"do_sample_frames": False, "do_resize": False}
        if hasattr(self.processor.video_processor, "cap_pixels_per_frame"):  # transformers >= 5.19's budget switch:
            videos_kwargs["cap_pixels_per_frame"] = False  # applied by load_video already (silences its notice)
        media_kwargs: dict[str, Any] = {"video_metadata": [m for _, m in loaded], "videos_kwargs": videos_kwargs} \
            if loaded else {}
        images = images or None
        enc = self.processor(text=texts, images=images, videos=videos, padding=True, return_tensors="pt",
                             **media_kwargs)
        input_ids = enc["input_ids"]
        mm = enc.get("mm_token_type_ids")
        if mm is None:  # transformers' convention: 1 image placeholder, 2 video
            mm = (input_ids == self.image_token_id).long() + 2 * (input_ids == self.video_token_id).long()
        self.check_prompt_lengths(enc["attention_mask"], "Image and video tokens count too; lower model.max_pixels "
                                  "(or model.video_max_frames) or raise max_prompt_length.")
        # media per prompt: its images (PIL), then its videos as (frames [T, 3, H, W], metadata) pairs
        media = [a + b for a, b in zip(split_media(images or [], images_per_prompt), split_media(loaded, videos_per_prompt))]
        return PromptBatch(input_ids=input_ids, attention_mask=enc["attention_mask"], mm_token_type_ids=mm,
                           vision=split_vision(enc, images_per_prompt, videos_per_prompt), media=media, texts=texts)

    def observation_text(self, content: list[dict]) -> str:
        """What follows an assistant turn that ended with its end-of-turn token, up to and including the next
        assistant turn's generation prompt, when a user message with ``content`` comes between them: rendered by
        the chat template itself (around a placeholder turn), so every template's glue is its own. Image parts are
        the template's placeholders (not yet expanded)."""
        marker = "\x00"
        conversation = [{"role": "user", "content": "?"}, {"role": "assistant", "content": marker},
                        {"role": "user", "content": content}]
        text = self.processor.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False,
                                                  **self.chat_template_kwargs)
        start = text.index(marker) + len(marker)
        ends = self.tokenizer.convert_ids_to_tokens(self.eos_token_ids)
        found = [(text.find(e, start), e) for e in ends if e and text.find(e, start) >= 0]
        if not found:
            raise ValueError(f"the {self.family} chat template ends an assistant turn with none of the EOS tokens "
                             f"{ends}: an episode cannot continue after a turn")
        at, eos = min(found)
        return text[at + len(eos):]

    def encode_observation(self, content: list[dict]) -> tuple[list[int], list[int], dict[str, torch.Tensor], list]:
        """An observation (a user message with ``content``: text and image parts) as the tokens that continue an
        episode after the policy's turn (:meth:`observation_text`, image placeholders expanded by the processor):
        ``(ids, mm token types, vision inputs, images)``, images resized within the pixel bounds like a prompt's."""
        from qwen_vl_utils import fetch_image

        parts = self._with_media_defaults([{"role": "user", "content": content}])[0]["content"]
        images = [fetch_image(part, image_patch_size=self.patch_size) for part in parts if is_image_part(part)]
        enc = self.processor(text=[self.observation_text(parts)], images=images or None, return_tensors="pt")
        ids = enc["input_ids"][0]
        mm = (ids == self.image_token_id).long()
        return ids.tolist(), mm.tolist(), split_vision(enc, [len(images)])[0], images

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

    def _encoder_outputs(self, kind: str, pixels: torch.Tensor, grid: torch.Tensor, index: list[int]) -> Any:
        """Vision features of every image (``kind`` = ``image``) or video (``video``) once, then shared by the copies of
        its prompt (``index``: :func:`group_image_index`): the merged patch features, and Qwen3-VL's DeepStack
        features (each level indexed the same way)."""
        encode = self.model.model.get_image_features if kind == "image" else self.model.model.get_video_features
        feats = encode(pixels, grid, return_dict=True)
        shared = {"pooler_output": tuple(feats.pooler_output[i] for i in index)}
        if getattr(feats, "deepstack_features", None) is not None:
            shared["deepstack_features"] = [tuple(level[i] for i in index) for level in feats.deepstack_features]
        return type(feats)(**shared)

    @staticmethod
    def _repeated_rows(pixels: torch.Tensor, grid: torch.Tensor, index: list[int]) -> torch.Tensor:
        """Pixel rows of every image (or video) repeated per copy (the vision tower then runs once per copy)."""
        blocks = torch.split(pixels, grid.prod(-1).tolist())
        return torch.cat([blocks[i] for i in index])

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
        # an episode batch (mmgpg.rollout.episode): observation tokens are attended but not scored (comp_mask is the
        # loss mask), and each row's observation images follow its prompt's
        present = rollout.present_mask.to(device)
        comp_mm = rollout.completion_mm.to(device) if rollout.completion_mm is not None else torch.zeros_like(comp_ids)
        rows = rollout.row_vision
        input_ids = torch.cat([batch.input_ids.repeat_interleave(G, 0), comp_ids], dim=1)
        attention_mask = torch.cat([batch.attention_mask.repeat_interleave(G, 0), present.long()], dim=1)
        mm = torch.cat([batch.mm_token_type_ids.repeat_interleave(G, 0), comp_mm], dim=1)
        kwargs: dict[str, Any] = dict(input_ids=input_ids, attention_mask=attention_mask, mm_token_type_ids=mm)
        vision = join_vision([*batch.vision, *(rows or ())])
        encoded: dict[str, Any] = {}
        for kind, pixels_key, grid_key in (("image", "pixel_values", "image_grid_thw"),
                                           ("video", "pixel_values_videos", "video_grid_thw")):
            if grid_key not in vision:
                continue
            index = group_image_index([len(v.get(grid_key, ())) for v in batch.vision], G,
                                      None if rows is None else [len(v.get(grid_key, ())) for v in rows])
            kwargs[grid_key] = vision[grid_key][index]
            if kind == "video" and "second_per_grid_ts" in vision:  # Qwen2.5-VL's temporal positions
                kwargs["second_per_grid_ts"] = vision["second_per_grid_ts"][index]
            if encode_images_once:
                encoded[kind] = self._encoder_outputs(kind, vision[pixels_key], vision[grid_key], index)
            else:
                kwargs[pixels_key] = self._repeated_rows(vision[pixels_key], vision[grid_key], index)
        if encoded:
            kwargs["mm_encoder_outputs"] = encoded
        hidden = self.model.model(**kwargs, use_cache=False).last_hidden_state
        return self.score_hidden(hidden, prompt_len, comp_ids, comp_mask, chunk_size=chunk_size,
                                 temperature=temperature)


# The processor's batched vision outputs: (pixel rows, grid, per-item extras) for images and for videos.
_MEDIA_KEYS = (("pixel_values", "image_grid_thw", ()), ("pixel_values_videos", "video_grid_thw", ("second_per_grid_ts",)))


def split_vision(enc: Any, images_per_prompt: Sequence[int],
                 videos_per_prompt: Sequence[int] | None = None) -> list[dict[str, torch.Tensor]]:
    """The processor's batched outputs ``enc`` as each prompt's own (views, no copy): ``pixel_values`` rows (flat
    over all images: image ``i`` owns ``prod(image_grid_thw[i])``) and ``image_grid_thw``, and likewise
    ``pixel_values_videos`` and ``video_grid_thw`` (with Qwen2.5-VL's ``second_per_grid_ts``, one per video);
    ``{}`` for a prompt without media."""
    videos_per_prompt = videos_per_prompt or [0] * len(images_per_prompt)
    out: list[dict[str, torch.Tensor]] = [{} for _ in images_per_prompt]
    for (pixels_key, grid_key, extras), counts in zip(_MEDIA_KEYS, (images_per_prompt, videos_per_prompt)):
        grid = enc.get(grid_key)
        if grid is None:
            continue
        rows = grid.prod(-1).tolist()
        item = row = 0
        for p, n in enumerate(counts):
            if not n:
                continue
            count = sum(rows[item : item + n])
            out[p][pixels_key] = enc[pixels_key][row : row + count]
            out[p][grid_key] = grid[item : item + n]
            for key in extras:
                if enc.get(key) is not None:
                    out[p][key] = torch.as_tensor(enc[key])[item : item + n]
            item, row = item + n, row + count
    return out


def video_rope_index(model, fallback, input_ids: torch.Tensor, mm_token_type_ids: torch.Tensor,
                     image_grid_thw: torch.Tensor | None = None, video_grid_thw: torch.Tensor | None = None,
                     second_per_grid_ts: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                     **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen2-VL / Qwen2.5-VL M-RoPE positions ``[3, B, L]`` and decoding deltas ``[B, 1]`` by Qwen's published rule,
    installed as the model's ``get_rope_index`` for batches with videos (``fallback``, transformers' own, for the
    rest: image and text positions are transformers' unchanged).

    Each run of text tokens continues from ``start``; an image or video of merged grid (t, h, w) takes
    ``(start + t_i * interval, start + h_i, start + w_i)`` with ``interval = tokens_per_second x second_per_grid_ts``
    for a Qwen2.5-VL video (Qwen2-VL, images: 1), and the next run starts at the largest of those plus one (the
    Qwen2.5-VL report's example: a video of 3 temporal patches at interval 50 ends at temporal 100, so text resumes at
    101). transformers 5.3 to 5.24 resume text at ``start + max(h, w)``, without the temporal extent, which is the
    same for an image but not for a video whose temporal positions reach further: found by vLLM's log-probs
    disagreeing with the trainer's on video prompts (vLLM keeps Qwen's rule). The delta of a row is its largest
    position + 1 - its unpadded length, as transformers'.
    """
    if video_grid_thw is None:
        return fallback(input_ids, mm_token_type_ids, image_grid_thw=image_grid_thw, video_grid_thw=video_grid_thw,
                        second_per_grid_ts=second_per_grid_ts, attention_mask=attention_mask, **kwargs)
    merge = model.config.vision_config.spatial_merge_size
    per_second = getattr(model.config.vision_config, "tokens_per_second", None)  # Qwen2.5-VL only
    grids = {1: iter(image_grid_thw.tolist() if image_grid_thw is not None else []), 2: iter(video_grid_thw.tolist())}
    seconds = iter(second_per_grid_ts.tolist() if second_per_grid_ts is not None else [])
    positions = torch.zeros(3, *input_ids.shape, dtype=input_ids.dtype, device=input_ids.device)
    deltas = []
    for b in range(input_ids.shape[0]):
        keep = attention_mask[b].bool() if attention_mask is not None else torch.ones_like(input_ids[b], dtype=torch.bool)
        kinds = mm_token_type_ids[b][keep].tolist()
        pieces: list[torch.Tensor] = []
        start = i = 0
        while i < len(kinds):
            j = i
            while j < len(kinds) and kinds[j] == kinds[i]:
                j += 1
            if kinds[i] == 0:
                piece = torch.arange(j - i).expand(3, -1) + start
            else:
                t, h, w = next(grids[kinds[i]])
                step = per_second * next(seconds, 1.0) if kinds[i] == 2 and per_second is not None else 1.0
                axes = ((torch.arange(t) * step).long(), torch.arange(h // merge), torch.arange(w // merge))
                piece = torch.stack(torch.meshgrid(*axes, indexing="ij")).reshape(3, -1) + start
                if piece.shape[1] != j - i:
                    raise ValueError(f"row {b}: {j - i} placeholder tokens for a grid of {piece.shape[1]}: two images "
                                     "or videos with no text between them")
            pieces.append(piece)
            start, i = int(piece.max()) + 1, j
        row = torch.cat(pieces, dim=1).to(positions)
        positions[:, b, keep] = row
        deltas.append(int(row.max()) + 1 - len(kinds))
    return positions, torch.tensor(deltas, device=input_ids.device).unsqueeze(1)


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
