"""Build a Qwen2-VL / Qwen2.5-VL model, or a text-only Qwen2 (``--family qwen2``), offline, with the real
transformers classes.

Nothing here downloads anything. The result is a standard Hugging Face directory — ``config.json``,
``generation_config.json``, ``model.safetensors``, ``tokenizer.json``, ``chat_template.jinja`` and (vision-language
families) ``processor_config.json`` — that ``AutoProcessor.from_pretrained(dir)`` and
``AutoModelForImageTextToText.from_pretrained(dir)`` load, exactly like a hub checkpoint; for ``qwen2``,
``AutoTokenizer`` and ``AutoModelForCausalLM`` (a ``Qwen2ForCausalLM``; transformers loads the tokenizer as its
``Qwen2Tokenizer`` over the trained vocabulary, with Qwen's own pre-tokenizer, as for a real Qwen2.5 checkpoint).

Sizes:

* ``tiny`` (default): about 1 M parameters, a byte-level BPE tokenizer of 1,024 tokens trained here on a small
  synthetic corpus, Qwen2-VL's 14 special tokens (ids 0–13) and a Qwen2-VL-style chat template. For tests and the
  CPU demo.
* ``shape_true``: the real Qwen2-VL-2B-Instruct (or Qwen2.5-VL-3B-Instruct) dimensions, vocabulary 151,936
  included, randomly initialised; ``shape_true_7b``: Qwen2.5-VL-7B-Instruct's (with :func:`save_config_only` only, for
  ``mmgpg plan``: its weights would take 33 GB of memory to initialise). For memory and speed measurements; it has no knowledge. Its tokenizer is still
  the small local one (ids < 1,024), which does not change any tensor shape the model computes with. For ``qwen2``
  (text only) ``shape_true`` is DeepSeek-R1-Distill-Qwen-1.5B's language model and ``shape_true_7b`` that of
  Qwen2.5-Math-7B (the same tensor shapes as DeepSeek-R1-Distill-Qwen-7B): the base models of the GPG paper's
  unimodal rows (:data:`SHAPE_TRUE_TEXT`).

The ``qwen2`` tiny model has the language model of the ``tiny`` Qwen2-VL (same widths, 2 layers, untied head, RoPE
instead of M-RoPE), the same tokenizer and a Qwen2.5-Instruct-style chat template (:data:`TEXT_CHAT_TEMPLATE`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from mmgpg.models import FAMILIES, TEXT_FAMILIES, QwenVLFamily, TextFamily

Family = QwenVLFamily | TextFamily
Size = Literal["tiny", "shape_true", "shape_true_7b"]
SIZES: tuple[str, ...] = ("tiny", "shape_true", "shape_true_7b")

# Qwen2-VL's special tokens, in the order of their ids in the real tokenizer (151643 ... 151656).
SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."

# Both templates: a default system turn, then ``<|im_start|>role\n ... <|im_end|>\n`` per turn; they differ only in
# how a content part is rendered.
_TURNS_OPEN = (
    "{%- set nl = '\\n' -%}"
    "{%- for message in messages -%}"
    "{%- if loop.first and message['role'] != 'system' -%}"
    "<|im_start|>system{{ nl }}" + DEFAULT_SYSTEM_PROMPT + "<|im_end|>{{ nl }}"
    "{%- endif -%}"
    "<|im_start|>{{ message['role'] }}{{ nl }}"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}{%- for part in message['content'] -%}"
)
_TURNS_CLOSE = (
    "{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "<|im_end|>{{ nl }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant{{ nl }}{%- endif -%}"
)

# A chat template written for mmgpg that renders the same text as Qwen2-VL-Instruct's: a default system turn, one
# ``<|vision_start|><|image_pad|><|vision_end|>`` per image, ``<|im_start|>role\n ... <|im_end|>\n`` per turn.
CHAT_TEMPLATE = (
    _TURNS_OPEN +
    "{%- if part['type'] == 'image' or 'image' in part or 'image_url' in part -%}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{%- elif part['type'] == 'video' or 'video' in part -%}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{%- elif 'text' in part -%}{{ part['text'] }}"
    + _TURNS_CLOSE
)

# The text family's template, written for mmgpg in the layout of Qwen2.5-Instruct's: a default system turn and
# ``<|im_start|>role\n ... <|im_end|>\n`` per turn. Content is a string or text parts; a text-only model refuses images.
TEXT_CHAT_TEMPLATE = (
    _TURNS_OPEN +
    "{%- if 'text' in part -%}{{ part['text'] }}"
    "{%- else -%}{{ raise_exception('this is a text-only model: a message part that is not text was given') }}"
    + _TURNS_CLOSE
)

_WORDS = (
    "the a an of to in is are how many what which where there this that image picture shapes shape circle circles "
    "square squares triangle triangles red green blue yellow purple orange white black gray left right above below "
    "count answer think question output final number first then in between inside outside box object objects "
    "color colour closer farther larger smaller bigger same different than and or not yes no I see it its we "
    "please put your reasoning tags format process within respectively e.g. i.e. given figure angle degree "
    "triangle line point circle length area value option options choose from following the correct class "
    "category flower pet cat dog aircraft car species type kind bounding coordinates region find locate person"
).split()


@dataclass(frozen=True)
class Dims:
    """Model dimensions. ``text_*`` is the language model, ``vision_*`` the ViT."""

    vocab_size: int
    text_hidden: int
    text_intermediate: int
    text_layers: int
    text_heads: int
    text_kv_heads: int
    mrope_section: tuple[int, int, int]
    rope_theta: float
    tie_word_embeddings: bool
    vision_depth: int
    vision_dim: int
    vision_heads: int
    vision_intermediate: int  # Qwen2-VL: embed_dim * mlp_ratio; Qwen2.5-VL: intermediate_size


TINY_VOCAB = 1024
# head_dim 32 -> mrope_section must sum to head_dim / 2 = 16.
TINY = Dims(TINY_VOCAB, 128, 512, 2, 4, 2, (4, 6, 6), 1e4, False, 2, 64, 4, 128)
# Qwen2-VL-2B-Instruct and Qwen2.5-VL-3B-Instruct config.json values.
SHAPE_TRUE = {
    "qwen2_vl": Dims(151936, 1536, 8960, 28, 12, 2, (16, 24, 24), 1e6, True, 32, 1280, 16, 5120),
    "qwen2_5_vl": Dims(151936, 2048, 11008, 36, 16, 2, (16, 24, 24), 1e6, True, 32, 1280, 16, 3420),
}


# Qwen2.5-VL-7B-Instruct, from its config.json (huggingface.co/Qwen/Qwen2.5-VL-7B-Instruct/blob/main/config.json):
# vocab_size 152064, hidden_size 3584, intermediate_size 18944, num_hidden_layers 28, num_attention_heads 28,
# num_key_value_heads 4, mrope_section [16, 24, 24], rope_theta 1e6, tie_word_embeddings false; vision_config depth
# 32, hidden_size 1280, num_heads 16, intermediate_size 3420, out_hidden_size 3584 (the LLM width). The same LLM
# numbers are in Table 1 of the Qwen2.5-VL technical report (arXiv:2502.13923: 28 layers, 4 KV heads, head size 128,
# FFN 18944, no embedding tying). Qwen2.5-VL only: `dims_for` refuses it for qwen2_vl.
SHAPE_TRUE_7B = Dims(152064, 3584, 18944, 28, 28, 4, (16, 24, 24), 1e6, False, 32, 1280, 16, 3420)

# Text-only Qwen2 shapes (``--family qwen2``), from the checkpoints' config.json on the hub:
# * shape_true: deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B (a Qwen2.5-Math-1.5B fine-tune; the GPG-RS1/RS3 rows):
#   vocab_size 151936, hidden_size 1536, intermediate_size 8960, num_hidden_layers 28, num_attention_heads 12,
#   num_key_value_heads 2, rope_theta 10000, tie_word_embeddings false.
# * shape_true_7b: Qwen/Qwen2.5-Math-7B (the GPG-7B row and the Qwen2.5-Math-7B ablations): vocab_size 152064,
#   hidden_size 3584, intermediate_size 18944, num_hidden_layers 28, num_attention_heads 28, num_key_value_heads 4,
#   rope_theta 10000, tie_word_embeddings false (DeepSeek-R1-Distill-Qwen-7B has the same tensor shapes).
# The vision fields and mrope_section are unused for a text model.
SHAPE_TRUE_TEXT = {
    "shape_true": Dims(151936, 1536, 8960, 28, 12, 2, (0, 0, 0), 1e4, False, 0, 0, 0, 0),
    "shape_true_7b": Dims(152064, 3584, 18944, 28, 28, 4, (0, 0, 0), 1e4, False, 0, 0, 0, 0),
}


def dims_for(family: Family, size: Size) -> Dims:
    _check_choice("family", family, FAMILIES)
    _check_choice("size", size, SIZES)
    if family in TEXT_FAMILIES:
        return TINY if size == "tiny" else SHAPE_TRUE_TEXT[size]
    if size == "shape_true_7b":
        if family != "qwen2_5_vl":
            raise ValueError("size shape_true_7b is Qwen2.5-VL-7B's shape: use --family qwen2_5_vl")
        return SHAPE_TRUE_7B
    return TINY if size == "tiny" else SHAPE_TRUE[family]


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")


def _corpus(seed: int, lines: int = 4000) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        words = rng.choices(_WORDS, k=rng.randint(3, 14))
        n = rng.randint(0, 9999)
        out.append(
            f"{' '.join(words)} {n}. <think>{' '.join(rng.choices(_WORDS, k=5))}</think><answer>{n % 10}</answer>"
        )
    out.append("(A) (B) (C) (D) (E) [0, 0, 1000, 1000] {\"bbox_2d\": [12, 34, 56, 78]} 0123456789 .,:;!?'\"-+*/=()[]{}")
    return out


def build_tokenizer(seed: int = 0):
    """Train a byte-level BPE with Qwen2-VL's special tokens (ids 0–13) and wrap it for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_corpus(seed), trainer=trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        padding_side="left",
        additional_special_tokens=list(SPECIAL_TOKENS[1:2] + SPECIAL_TOKENS[3:]),
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def build_processor(family: Family, tokenizer, min_pixels: int = 56 * 56, max_pixels: int = 112 * 112):
    """The Qwen2-VL image and video processors (both are required by transformers 5.x) plus the tokenizer; for a text
    family, the tokenizer itself with the text chat template."""
    if family in TEXT_FAMILIES:
        tokenizer.chat_template = TEXT_CHAT_TEMPLATE
        return tokenizer
    from transformers import Qwen2_5_VLProcessor, Qwen2VLImageProcessor, Qwen2VLProcessor, Qwen2VLVideoProcessor

    size = {"shortest_edge": min_pixels, "longest_edge": max_pixels}
    common = dict(size=size, patch_size=14, temporal_patch_size=2, merge_size=2)
    cls = Qwen2VLProcessor if family == "qwen2_vl" else Qwen2_5_VLProcessor
    return cls(
        image_processor=Qwen2VLImageProcessor(**common),
        tokenizer=tokenizer,
        video_processor=Qwen2VLVideoProcessor(**common),
        chat_template=CHAT_TEMPLATE,
    )


def build_config(family: Family, dims: Dims, tokenizer):
    """A ``Qwen2VLConfig`` / ``Qwen2_5_VLConfig`` (or, for ``qwen2``, a ``Qwen2Config``) with the given dimensions and
    the tokenizer's special-token ids."""
    from transformers import Qwen2_5_VLConfig, Qwen2Config, Qwen2VLConfig

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    if family == "qwen2":
        return Qwen2Config(
            vocab_size=dims.vocab_size, hidden_size=dims.text_hidden, intermediate_size=dims.text_intermediate,
            num_hidden_layers=dims.text_layers, num_attention_heads=dims.text_heads,
            num_key_value_heads=dims.text_kv_heads, max_position_embeddings=32768,
            rope_parameters={"rope_type": "default", "rope_theta": dims.rope_theta},
            bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
            tie_word_embeddings=dims.tie_word_embeddings,
        )
    head_dim = dims.text_hidden // dims.text_heads
    if sum(dims.mrope_section) * 2 != head_dim:
        raise ValueError(f"mrope_section {dims.mrope_section} must sum to head_dim/2 = {head_dim // 2}")
    text = dict(
        vocab_size=dims.vocab_size,
        hidden_size=dims.text_hidden,
        intermediate_size=dims.text_intermediate,
        num_hidden_layers=dims.text_layers,
        num_attention_heads=dims.text_heads,
        num_key_value_heads=dims.text_kv_heads,
        max_position_embeddings=32768,
        rope_parameters={"rope_type": "default", "rope_theta": dims.rope_theta, "mrope_section": list(dims.mrope_section)},
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
        tie_word_embeddings=dims.tie_word_embeddings,
    )
    vision_common = dict(
        depth=dims.vision_depth,
        num_heads=dims.vision_heads,
        patch_size=14,
        spatial_merge_size=2,
        temporal_patch_size=2,
    )
    token_ids = dict(
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=dims.tie_word_embeddings,
    )
    if family == "qwen2_vl":
        vision = dict(
            vision_common,
            embed_dim=dims.vision_dim,
            hidden_size=dims.text_hidden,
            mlp_ratio=dims.vision_intermediate // dims.vision_dim,
        )
        return Qwen2VLConfig(text_config=text, vision_config=vision, **token_ids)
    last = dims.vision_depth - 1
    vision = dict(
        vision_common,
        hidden_size=dims.vision_dim,
        intermediate_size=dims.vision_intermediate,
        out_hidden_size=dims.text_hidden,
        window_size=112,
        fullatt_block_indexes=sorted({last} | set(range(7, last, 8))),
    )
    return Qwen2_5_VLConfig(text_config=text, vision_config=vision, **token_ids)


def build_model(family: Family = "qwen2_vl", size: Size = "tiny", seed: int = 0, dtype: str = "float32"):
    """Return ``(model, processor)``: a randomly initialised model of the real class and its processor. The caller's
    random streams (Python, NumPy, torch) are left exactly as they were, so a run that builds the model first gives
    the same numbers as one that finds it cached."""
    import random

    import numpy as np
    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration, Qwen2ForCausalLM, Qwen2VLForConditionalGeneration

    py_state, np_state = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=[]):
            dims = dims_for(family, size)
            tokenizer = build_tokenizer(seed)
            processor = build_processor(family, tokenizer)
            config = build_config(family, dims, tokenizer)
            torch.manual_seed(seed)
            cls = {"qwen2_vl": Qwen2VLForConditionalGeneration, "qwen2_5_vl": Qwen2_5_VLForConditionalGeneration,
                   "qwen2": Qwen2ForCausalLM}[family]
            model = cls(config).to(getattr(torch, dtype))
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
    gen = model.generation_config
    gen.eos_token_id = [tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids("<|endoftext|>")]
    gen.pad_token_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    gen.bos_token_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    return model, processor


def build_and_save(
    out: str | Path, family: Family = "qwen2_vl", size: Size = "tiny", seed: int = 0, dtype: str | None = None
) -> Path:
    """Build a model with :func:`build_model` and save it with its processor (a text family: its tokenizer) as a
    Hugging Face directory."""
    out = Path(out)
    dtype = dtype or ("float32" if size == "tiny" else "bfloat16")
    model, processor = build_model(family, size, seed, dtype)
    out.mkdir(parents=True, exist_ok=True)
    from mmgpg.utils import no_transformers_bars, quiet_deepspeed_import

    with no_transformers_bars(), quiet_deepspeed_import():
        model.save_pretrained(out)
        processor.save_pretrained(out)
    return out


def save_config_only(out: str | Path, family: Family = "qwen2_vl", size: Size = "shape_true", seed: int = 0) -> Path:
    """Write only ``config.json`` (and ``generation_config.json``) of a model of these dimensions: no weights, so even
    a 7B shape takes a second. Enough for anything that builds the model on the meta device (``mmgpg plan``,
    ``mmgpg model info``); not loadable with ``from_pretrained``."""
    from transformers import GenerationConfig

    out = Path(out)
    tokenizer = build_tokenizer(seed)
    config = build_config(family, dims_for(family, size), tokenizer)
    out.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(out)
    eos = [tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids("<|endoftext|>")]
    GenerationConfig(eos_token_id=eos, pad_token_id=eos[1], bos_token_id=eos[1]).save_pretrained(out)
    return out


def count_parameters(model) -> dict[str, int]:
    """Total, vision-tower and language-model parameter counts (tied weights counted once)."""
    seen: set[int] = set()
    total = vision = 0
    for name, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
        if ".visual." in f".{name}":
            vision += p.numel()
    return {"total": total, "vision": vision, "language": total - vision}
