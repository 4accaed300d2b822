"""Build a model of any registered family offline, with the real transformers classes and random weights.

Nothing here downloads anything. The result is a standard Hugging Face directory — ``config.json``,
``generation_config.json``, ``model.safetensors``, ``tokenizer.json``, ``chat_template.jinja`` and (vision-language
families) ``processor_config.json`` — that ``AutoProcessor`` and ``AutoModelForImageTextToText`` (a text family:
``AutoTokenizer`` and ``AutoModelForCausalLM``) load, exactly like a hub checkpoint.

What is shared lives here: a byte-level BPE tokenizer of 1,024 tokens trained on a small synthetic corpus
(:func:`build_tokenizer`), the :class:`Dims` of a model, and building, saving and counting. What is the family's own
— its config class and its dimensions, its processor and its chat template — is in its family file, named by its
:class:`~mmgpg.models.Family` ``tiny`` entry (:mod:`mmgpg.models.qwen2`, :mod:`mmgpg.models.qwen3`). A family file
provides ``dims(family, size)``, ``config(family, dims, tokenizer)``, ``processor(family, tokenizer)`` and
``model_class(family)``, and may provide ``finish(model)`` (changes to the random model, before its dtype).

Sizes: ``tiny`` (about 1 M parameters, for tests and the CPU demo) for every family; ``shape_true`` /
``shape_true_7b`` / ``shape_true_4b`` / ``shape_true_8b`` (a released checkpoint's dimensions, randomly initialised, for memory and speed measurements and
``mmgpg plan``) where the family declares them (``Family.sizes``). The tokenizer is the small local one at every
size (ids < 1,024), which changes no tensor shape the model computes with.
"""

from __future__ import annotations

import importlib
import random
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from mmgpg.models import FAMILIES, Family
from mmgpg.models import family as family_spec
from mmgpg.typed import check_choice

# Qwen2-VL's special tokens, in the order of their ids in the real tokenizer (151643 ... 151656).
QWEN_SPECIAL_TOKENS: tuple[str, ...] = (
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
    head_dim: int = 0  # 0: text_hidden // text_heads (Qwen2); Qwen3 states it (128 in every released size)

    @property
    def text_head_dim(self) -> int:
        return self.head_dim or self.text_hidden // self.text_heads


TINY_VOCAB = 1024
# head_dim 32 -> mrope_section must sum to head_dim / 2 = 16.
TINY = Dims(TINY_VOCAB, 128, 512, 2, 4, 2, (4, 6, 6), 1e4, False, 2, 64, 4, 128)


def parts(family: str) -> tuple[Family, ModuleType]:
    """The :class:`~mmgpg.models.Family` of ``family`` and its family file (the tiny builder's parts)."""
    check_choice("family", family, tuple(FAMILIES))
    spec = family_spec(family)
    return spec, importlib.import_module(spec.tiny)


def dims_for(family: str, size: str) -> Dims:
    """The dimensions of ``family`` at ``size`` (one of its ``Family.sizes``)."""
    return parts(family)[1].dims(family, size)


def build_processor(family: str, tokenizer, min_pixels: int = 56 * 56, max_pixels: int = 112 * 112):
    """The family's processor around ``tokenizer`` (a text family: the tokenizer itself with its chat template)."""
    return parts(family)[1].processor(family, tokenizer, min_pixels, max_pixels)


def build_config(family: str, dims: Dims, tokenizer):
    """The family's config with dimensions ``dims`` and the tokenizer's special-token ids."""
    return parts(family)[1].config(family, dims, tokenizer)


def build_model(family: str = "qwen2_vl", size: str = "tiny", seed: int = 0, dtype: str = "float32"):
    """Return ``(model, processor)``: a randomly initialised model of the family's real class and its processor.
    The caller's random streams (Python, NumPy, torch) are left exactly as they were, so a run that builds the model
    first gives the same numbers as one that finds it cached."""
    import numpy as np
    import torch

    module = parts(family)[1]
    py_state, np_state = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=[]):
            dims = module.dims(family, size)
            tokenizer = family_tokenizer(module, seed)
            processor = module.processor(family, tokenizer, 56 * 56, 112 * 112)
            config = module.config(family, dims, tokenizer)
            torch.manual_seed(seed)
            model = module.model_class(family)(config)
            if hasattr(module, "finish"):  # the family's own touches to the random model (e.g. the pad row)
                module.finish(model)
            model = model.to(getattr(torch, dtype))
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
    gen = model.generation_config
    gen.eos_token_id, gen.pad_token_id, gen.bos_token_id = getattr(module, "generation_ids", generation_ids)(tokenizer)
    return model, processor


def family_tokenizer(module: ModuleType, seed: int):
    """The family file's own tokenizer (its ``tokenizer(seed)``: other special tokens), else Qwen's."""
    return module.tokenizer(seed) if hasattr(module, "tokenizer") else build_tokenizer(seed)


def generation_ids(tokenizer) -> tuple[list[int], int, int]:
    """``(eos ids, pad id, bos id)`` of a tiny model's generation config: Qwen's ``<|im_end|>`` and
    ``<|endoftext|>`` (both end a completion), padding and beginning with ``<|endoftext|>``. A family file with other
    tokens provides its own ``generation_ids``."""
    eos = [tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids("<|endoftext|>")]
    return eos, eos[1], eos[1]


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
    """Train a byte-level BPE with Qwen's special tokens (ids 0–13, in the order of the real tokenizer's) and wrap it for
    transformers; the family's ``processor`` part sets its chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB,
        special_tokens=list(QWEN_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_corpus(seed), trainer=trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        padding_side="left",
        additional_special_tokens=list(QWEN_SPECIAL_TOKENS[1:2] + QWEN_SPECIAL_TOKENS[3:]),
    )
    return tok


def build_family_tokenizer(seed: int, specials: tuple[str, ...], *, eos: str, pad: str, bos: str | None = None,
                           named: dict[str, str] | None = None, prepend_bos: bool = False):
    """A byte-level BPE of :data:`TINY_VOCAB` tokens trained like :func:`build_tokenizer`, with another family's
    special tokens at ids 0.. in the order given. ``named``: the model-specific tokens its processor reads as tokenizer
    attributes (``tokenizer.image_token``, ``tokenizer.boi_token``, ...), as the released tokenizer configs name them.
    ``prepend_bos``: the tokenizer itself writes ``bos`` before every text, as Gemma's does (the chat template writes it
    too: mmgpg tokenizes rendered prompts with ``add_special_tokens=False``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TINY_VOCAB, special_tokens=list(specials),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(_corpus(seed), trainer=trainer)
    if prepend_bos:
        bpe.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A $B",
                                                           special_tokens=[(bos, bpe.token_to_id(bos))])
    kwargs = dict(tokenizer_object=bpe, eos_token=eos, pad_token=pad, padding_side="left",
                  extra_special_tokens=dict(named or {}))
    return PreTrainedTokenizerFast(**kwargs, **({"bos_token": bos} if bos else {}))


def family_generation_ids(tokenizer, eos: tuple[str, ...], pad: str, bos: str | None) -> tuple[list[int], int, int]:
    """``(eos ids, pad id, bos id)`` of a family's tiny generation config from token strings."""
    ids = tokenizer.convert_tokens_to_ids
    return [ids(t) for t in eos], ids(pad), ids(bos) if bos else None


def build_and_save(
    out: str | Path, family: str = "qwen2_vl", size: str = "tiny", seed: int = 0, dtype: str | None = None
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


def save_config_only(out: str | Path, family: str = "qwen2_vl", size: str = "shape_true", seed: int = 0) -> Path:
    """Write only ``config.json`` (and ``generation_config.json``) of a model of these dimensions: no weights, so even
    a 7B shape takes a second. Enough for anything that builds the model on the meta device (``mmgpg plan``,
    ``mmgpg model info``); not loadable with ``from_pretrained``."""
    from transformers import GenerationConfig

    out = Path(out)
    module = parts(family)[1]
    tokenizer = family_tokenizer(module, seed)
    config = build_config(family, dims_for(family, size), tokenizer)
    out.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(out)
    eos, pad, bos = getattr(module, "generation_ids", generation_ids)(tokenizer)
    GenerationConfig(eos_token_id=eos, pad_token_id=pad, bos_token_id=bos).save_pretrained(out)
    return out


def count_parameters(model) -> dict[str, int]:
    """Total, vision-tower and language-model parameter counts (tied weights counted once); the vision tower is the
    module at the family's ``Family.vision_module``."""
    tower = family_spec(getattr(model.config, "model_type", None)).vision_module
    seen: set[int] = set()
    total = vision = 0
    for name, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
        if tower and name.startswith(tower + "."):
            vision += p.numel()
    return {"total": total, "vision": vision, "language": total - vision}
