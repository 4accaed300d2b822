"""What every policy shares, so that the families cannot drift apart: the EOS and pad ids, the sampling rule, the
completion mask after generation, scoring completions from hidden states in chunks, the prompt-length guard and
regathering encoded prompts. A family's file (:mod:`.qwen_vl`, :mod:`.text`) adds how it encodes prompts and runs
its forward; :class:`PolicyBase` holds the rest.

* **EOS**: every id of the generation config's ``eos_token_id`` (the tokenizer's when it names none); the pad id is
  the generation config's, else the tokenizer's, else the first EOS. A completion ends at the first EOS of *any* id.
* **Sampling**: :meth:`PolicyBase.sampling_kwargs` sets every knob transformers would otherwise fill from the
  checkpoint's ``generation_config.json``, so completions are drawn from exactly the distribution
  :meth:`PolicyBase.score_hidden` scores (temperature only, over the vocabulary without
  :attr:`PolicyBase.suppressed_token_ids`). :class:`SampledLogprobs` records the log-prob of each sampled token
  under the distribution it was drawn from (the engine's behaviour log-probs, for ``algo.rollout_correction``).
* **Scoring**: the hidden state before each completion token, through the output head the forward really uses
  (:meth:`PolicyBase.output_layer`; under LoRA :func:`mmgpg.models.lora.output_head`, called as the head's own
  forward so DeepSpeed ZeRO-3 gathers it), in chunks (:func:`mmgpg.models.logprobs.chunked_token_logprobs`), with
  gradients.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from mmgpg.models import Family
from mmgpg.models import family as family_spec
from mmgpg.models.batch import CompletionBatch, PromptBatch, gather_prompts
from mmgpg.models.logprobs import chunked_token_logprobs, completion_mask


class SampledLogprobs:
    """A logits processor, last in ``generate``'s list, that keeps the log-probability of each sampled token under
    the distribution it was really drawn from (after temperature, top-k, top-p and the suppressed tokens): the
    behaviour log-probs of the HF engine (``algo.rollout_correction``). At step ``k`` the processor sees the token
    drawn at step ``k - 1`` as the last input id, so only the previous step's processed scores are held (one
    ``[N, V]`` tensor, not ``output_scores``' ``[N, T, V]``); :meth:`logprobs` reads the last token's.

    transformers appends its own temperature/top-k/top-p warpers *after* a caller's processors, so
    :func:`recorded_sampling` passes neutral values for those and puts the same warper classes, in transformers'
    order, before this one: the processed scores and the samples are the ones transformers' own warpers give
    (a test compares the completions and ``output_scores`` token for token)."""

    def __init__(self) -> None:
        self.previous: torch.Tensor | None = None
        self.steps: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.previous is not None:
            self.steps.append(self._read(input_ids[:, -1]))
        self.previous = scores
        return scores

    def _read(self, tokens: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.previous.float(), dim=-1).gather(1, tokens[:, None])[:, 0]

    def logprobs(self, completion_ids: torch.Tensor) -> torch.Tensor:
        """``[N, T]`` log-probs of ``completion_ids`` (the generated columns), one per step."""
        steps = [*self.steps, self._read(completion_ids[:, -1])] if self.previous is not None else []
        if len(steps) != completion_ids.shape[1]:
            raise RuntimeError(f"recorded {len(steps)} sampling steps for {completion_ids.shape[1]} generated tokens")
        return torch.stack(steps, dim=1)


def recorded_sampling(kwargs: dict[str, Any]) -> tuple[dict[str, Any], SampledLogprobs | None]:
    """``generate`` keyword arguments from :meth:`PolicyBase.sampling_kwargs` with a :class:`SampledLogprobs`
    recorder after the sampling warpers (``None`` for greedy decoding, which has no sampling distribution)."""
    if not kwargs.get("do_sample"):
        return kwargs, None
    from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    temperature, top_k, top_p = kwargs["temperature"], kwargs["top_k"], kwargs["top_p"]
    chain: list = []
    if temperature != 1.0:  # transformers' order: temperature, top-k, top-p (min_p = 0 removes nothing)
        chain.append(TemperatureLogitsWarper(temperature))
    if top_k:
        chain.append(TopKLogitsWarper(top_k=top_k, min_tokens_to_keep=1))
    if top_p < 1.0:
        chain.append(TopPLogitsWarper(top_p=top_p, min_tokens_to_keep=1))
    recorder = SampledLogprobs()
    neutral = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=None,
                   logits_processor=LogitsProcessorList([*chain, recorder]))
    return {**kwargs, **neutral}, recorder


class PolicyBase:
    """The shared half of a policy (:class:`mmgpg.models.Policy`). Subclasses call :meth:`_setup` first and
    implement ``encode_prompts``, ``generate`` (through :meth:`_sample`) and ``completion_logprobs`` (through
    :meth:`score_hidden`)."""

    family: str
    spec: Family
    suppressed_token_ids: list[int]

    def _setup(self, model, processor, tokenizer, *, family: str, max_prompt_length: int | None) -> None:
        self.model = model
        self.processor = processor
        self.tokenizer = tokenizer
        self.peft = None  # the peft.PeftModel owning LoRA adapters injected into `model` (mmgpg.models.lora.attach)
        self.family = family
        self.spec = family_spec(family)  # the family's declared facts (mmgpg.models.FAMILIES)
        self.max_prompt_length = max_prompt_length
        # extra chat-template variables in every prompt rendered (model.chat_template_kwargs; set by load_policy)
        self.chat_template_kwargs: dict[str, Any] = {}
        self.suppressed_token_ids = []
        tokenizer.padding_side = "left"
        gen = model.generation_config
        eos = gen.eos_token_id if gen.eos_token_id is not None else tokenizer.eos_token_id
        if eos is None:
            raise ValueError(f"the {family} checkpoint names no EOS token (generation_config.json and the tokenizer): "
                             "completions could never end")
        self.eos_token_ids: list[int] = list(eos) if isinstance(eos, (list, tuple)) else [eos]
        self.pad_token_id: int = gen.pad_token_id if gen.pad_token_id is not None else tokenizer.pad_token_id
        if self.pad_token_id is None:
            self.pad_token_id = self.eos_token_ids[0]
        if tokenizer.pad_token_id is None:  # the tokenizer pads prompts with the same id
            tokenizer.pad_token_id = self.pad_token_id

    @property
    def supports_packing(self) -> bool:
        """Packed scoring is exact for this family (``Family.packing``)."""
        return self.spec.packing

    def check_packing(self, packed: bool) -> None:
        """Refuse ``packed=True`` for a family that cannot score packed rows, saying why and what to use."""
        if packed and not self.spec.packing:
            raise ValueError(packing_refusal(self.spec))

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def vision_tower(self) -> torch.nn.Module | None:
        """The vision encoder at the family's ``Family.vision_module``, or None (a text-only model)."""
        return self.model.get_submodule(self.spec.vision_module) if self.spec.vision_module else None

    # ---- prompts --------------------------------------------------------------------------------------------------

    def check_prompt_lengths(self, attention_mask: torch.Tensor, hint: str) -> None:
        """Refuse prompts longer than ``max_prompt_length`` tokens (never truncated silently); ``hint``: what to change."""
        if self.max_prompt_length is None:
            return
        too_long = [(i, int(n)) for i, n in enumerate(attention_mask.sum(-1)) if n > self.max_prompt_length]
        if too_long:
            listed = ", ".join(f"prompt {i}: {n} tokens" for i, n in too_long)
            raise ValueError(f"{len(too_long)} prompt(s) exceed max_prompt_length={self.max_prompt_length} ({listed}). "
                             f"{hint} mmgpg never truncates a prompt silently.")

    def gather_prompts(self, rows: Sequence[tuple[PromptBatch, int]]) -> PromptBatch:
        """One left-padded batch of prompt ``p`` of each ``(batch, p)``: how the update reuses the prompts the rollout
        already encoded (images preprocessed once per step) for micro-batches of groups from any attempts."""
        return gather_prompts(rows, self.pad_token_id)

    # ---- sampling -------------------------------------------------------------------------------------------------

    def sampling_kwargs(
        self, *, max_new_tokens: int, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0
    ) -> dict[str, Any]:
        """``generate`` settings that fix every logits processor a checkpoint's generation config could switch on.

        transformers fills any generation setting not passed to ``generate`` from the checkpoint's
        ``generation_config.json`` (Qwen2-VL-Instruct ships ``top_k=1, top_p=0.001, temperature=0.1,
        repetition_penalty=1.05``), so the neutral values are set explicitly (``None`` passed explicitly switches a
        processor off). With ``temperature`` 1, ``top_p`` 1 and ``top_k`` 0, completions are sampled from exactly the
        distribution :meth:`score_hidden` scores (on-policy). ``temperature=0`` is greedy decoding.
        """
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1; got {max_new_tokens}")
        common = dict(
            max_new_tokens=max_new_tokens,
            num_beams=1,
            repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            min_new_tokens=0,  # also replaces a checkpoint's min_length
            eos_token_id=self.eos_token_ids,
            pad_token_id=self.pad_token_id,
            # Qwen-VL: a sampled vision token would desynchronise image features and placeholders in the training
            # forward. None (nothing suppressed) also clears a checkpoint's own suppress_tokens.
            suppress_tokens=list(self.suppressed_token_ids) or None,
            begin_suppress_tokens=None,
            bad_words_ids=None,
            sequence_bias=None,
            forced_bos_token_id=None,
            forced_eos_token_id=None,
            exponential_decay_length_penalty=None,
            guidance_scale=None,
            watermarking_config=None,
            stop_strings=None,
        )
        if temperature == 0:  # greedy: the sampling filters below have no effect, so they are not passed
            return dict(common, do_sample=False)
        return dict(common, do_sample=True, temperature=float(temperature), top_p=float(top_p), top_k=int(top_k),
                    min_p=0.0, typical_p=1.0, epsilon_cutoff=0.0, eta_cutoff=0.0)

    def check_completions(self, completion_ids: torch.Tensor, mask: torch.Tensor) -> None:
        """Refuse completions the training forward could not score (a family's own rule; none by default)."""

    @torch.no_grad()
    def _sample(self, inputs: dict[str, Any], prompts: PromptBatch, group_size: int, *, max_new_tokens: int,
                temperature: float, top_p: float, top_k: int) -> CompletionBatch:
        """``model.generate(**inputs)`` with :meth:`sampling_kwargs`, ``group_size`` sequences per prompt
        (prompt-major), cut after the prompt and masked at the first EOS of any id."""
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1; got {group_size}")
        was_training = self.model.training
        self.model.eval()
        kwargs, recorder = recorded_sampling(
            self.sampling_kwargs(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k))
        try:
            out = self.model.generate(**inputs, num_return_sequences=group_size, **kwargs)
        finally:
            self.model.train(was_training)
        completion_ids = out[:, inputs["input_ids"].shape[1] :]
        mask = completion_mask(completion_ids, self.eos_token_ids)
        self.check_completions(completion_ids, mask)
        texts = self.processor.batch_decode(
            completion_ids.masked_fill(~mask, self.pad_token_id), skip_special_tokens=True
        )
        sampled = None if recorder is None else recorder.logprobs(completion_ids).masked_fill(~mask, 0.0).cpu()
        return CompletionBatch(prompts=prompts, group_size=group_size, completion_ids=completion_ids.cpu(),
                               completion_mask=mask.cpu(), texts=texts, sampled_logprobs=sampled)

    # ---- scoring --------------------------------------------------------------------------------------------------

    def score_hidden(self, hidden: torch.Tensor, prompt_len: int, completion_ids: torch.Tensor,
                     mask: torch.Tensor, *, chunk_size: int, temperature: float) -> torch.Tensor:
        """Per-token log-probs ``[N, T]`` (0 where ``mask`` is 0) of the completion tokens from the last hidden states
        ``[N, prompt_len + T, H]`` of prompts followed by completions, with gradients.

        ``logp[i, t] = log softmax(z_{i, prompt_len + t - 1} / temperature)[y_{i, t}]`` over the vocabulary without
        :attr:`suppressed_token_ids` (which sampling suppresses), i.e. exactly the sampling distribution. Only
        masked-in positions are scored, ``chunk_size`` tokens at a time.
        """
        scored = hidden[:, prompt_len - 1 : -1][mask]  # [K, H]: positions that predict completion tokens
        return self.score_positions(scored, completion_ids, mask, chunk_size=chunk_size, temperature=temperature)

    def output_layer(self) -> tuple[torch.nn.Module, Any]:
        """``(module, read)``: the module whose forward computes the logits and ``read() -> (weight, bias)`` of the
        head the forward really uses. The model's own output embedding here; :func:`mmgpg.models.lora.attach`
        replaces this lookup with one through PEFT's wrappers when it injects an adapter (a model without LoRA runs
        no LoRA code when it scores)."""
        head = self.model.get_output_embeddings()
        return head, lambda: (head.weight, head.bias)

    def score_positions(self, scored: torch.Tensor, completion_ids: torch.Tensor, mask: torch.Tensor, *,
                        chunk_size: int, temperature: float) -> torch.Tensor:
        """:meth:`score_hidden` from the hidden states ``scored [K, H]`` of the ``K = mask.sum()`` positions that
        predict the masked-in completion tokens, in ``mask``'s row-major order (a packed forward gathers them from
        its one long row)."""
        head, read = self.output_layer()

        def score(hidden_, targets_):  # reads the head's weights only inside head's own call (see call_through)
            weight, bias = read()
            return chunked_token_logprobs(hidden_, weight, targets_, chunk_size=chunk_size, bias=bias,
                                          temperature=temperature, excluded_token_ids=self.suppressed_token_ids)

        logp = call_through(head, score, scored, completion_ids[mask])
        out = torch.zeros(completion_ids.shape, dtype=logp.dtype, device=scored.device)
        return out.masked_scatter(mask, logp)


def packing_refusal(spec: Family) -> str:
    """Why ``model.packed_sequences=always`` cannot run with a family, and what to use."""
    why = spec.packing_note or "not shown to be exact"
    return (f"model.packed_sequences=always: {spec.title} cannot score packed rows ({why}); use "
            "model.packed_sequences=auto or never")


def call_through(module: torch.nn.Module, fn, *args):
    """``fn(*args)`` run as ``module``'s forward, so hooks on ``module`` see it: DeepSpeed ZeRO-3 gathers a
    partitioned ``lm_head.weight`` for the call and again for its backward (and releases it after each), exactly as for
    the module's own forward. Without hooks this is ``fn(*args)``."""
    module.forward = fn  # an instance attribute shadows the class's forward for this one call
    try:
        return module(*args)
    finally:
        del module.forward
