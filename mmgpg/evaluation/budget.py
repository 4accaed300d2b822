"""What an evaluation holds in memory, planned before it runs, so that a size the user gives (``--samples``,
``--batch-size``, ``train.eval_samples``) is either run in pieces that fit or refused with the size that fits —
never an allocator traceback.

* **generate calls**: a call never holds more than ``batch_size`` sequences: with ``K`` samples per problem above
  ``batch_size``, a problem's samples come in several calls (:func:`sample_units`). With the in-process HF engine
  a call of ``B`` sequences needs the KV cache and the last step's logits of each (:func:`generation_bytes`);
  :func:`check_generation` refuses a ``B`` whose call does not fit in the memory available now.
* **judged records**: a sampled evaluation keeps one record per sample (the output's text, the judge's fields) until
  it writes ``predictions.jsonl``: ``items · K`` of them, about :func:`record_bytes` each;
  :func:`check_records` refuses a ``K`` whose records do not fit in half the host memory available now.
"""

from __future__ import annotations

import os
from typing import Any

GiB = 1 << 30
RECORD_BASE_BYTES = 4096
"""A judged record without its output text: the dict, the ids, the question and gold fields, the judge's fields and
the rewards. Measured with tracemalloc on 400 sampled records of the tiny models: 1.39 KiB a record on ``math_500`` at
16 new tokens, 1.78-1.82 KiB on ``shapes`` and ``math_500`` at 64 (about 10 bytes a token); a budget of about twice
that leaves room for longer questions and the copy pickled when ranks gather them."""
RECORD_BYTES_PER_TOKEN = 16
"""Its output text, per new token (measured about 10 bytes, see above)."""


def sample_units(num_items: int, samples: int, batch_size: int) -> list[tuple[int, int, int, int]]:
    """The generate calls of ``samples`` (K) completions for each of ``num_items`` problems, none above
    ``batch_size`` (B) sequences: ``(first item, items, first sample, samples)`` per call. ``K <= B``: ``B // K``
    problems per call, all their samples; ``K > B``: one problem per call, its samples in pieces of ``B``.

    >>> sample_units(5, 2, 4)  # two problems of two samples per call
    [(0, 2, 0, 2), (2, 2, 0, 2), (4, 1, 0, 2)]
    >>> sample_units(2, 5, 2)  # five samples in calls of 2, 2, 1
    [(0, 1, 0, 2), (0, 1, 2, 2), (0, 1, 4, 1), (1, 1, 0, 2), (1, 1, 2, 2), (1, 1, 4, 1)]
    """
    if samples < 1 or batch_size < 1:
        raise ValueError(f"samples and batch_size must be >= 1; got {samples}, {batch_size}")
    if samples <= batch_size:
        per_call = batch_size // samples
        return [(i, min(per_call, num_items - i), 0, samples) for i in range(0, num_items, per_call)]
    return [(i, 1, s, min(batch_size, samples - s)) for i in range(num_items) for s in range(0, samples, batch_size)]


def host_available_bytes() -> int:
    """The host memory available now (Linux ``MemAvailable``; elsewhere the free pages)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def record_bytes(max_new_tokens: int) -> int:
    """The memory one judged record may take: ``RECORD_BASE_BYTES + RECORD_BYTES_PER_TOKEN · max_new_tokens``."""
    return RECORD_BASE_BYTES + RECORD_BYTES_PER_TOKEN * max_new_tokens


def check_records(num_items: int, samples: int, max_new_tokens: int, available: int | None = None) -> None:
    """Refuse ``samples`` whose ``num_items · samples`` judged records (:func:`record_bytes` each) do not fit in half
    of ``available`` host memory (default: :func:`host_available_bytes`), naming the largest ``--samples`` that fits.

    4 GiB available, 64 new tokens (5,120 bytes a record): 1 item fits 419,430 samples (2 GiB / 5,120).
    """
    available = host_available_bytes() if available is None else available
    each, budget = record_bytes(max_new_tokens), available // 2
    if num_items * samples * each <= budget:
        return
    fits = budget // (each * max(num_items, 1))
    raise ValueError(
        f"--samples {samples} on {num_items} item(s) keeps {num_items * samples:,} judged records until "
        f"predictions.jsonl is written, up to {num_items * samples * each / GiB:.1f} GiB at {max_new_tokens} new "
        f"tokens each, and {available / GiB:.1f} GiB of memory is available (half of it is the budget): "
        + (f"at most --samples {fits:,} fits on {num_items} item(s)" if fits >= 1 else "not even one sample fits")
        + "; lower --samples, --limit or --max-new-tokens")


def generation_bytes(sequences: int, tokens: int, text_config: Any, dtype_bytes: int) -> int:
    """One HF ``generate`` call of ``sequences`` rows of up to ``tokens`` tokens: the KV cache
    (``sequences · tokens · layers · 2 · kv_heads · head_dim · dtype_bytes``) and the last step's logits with the
    sampling warpers' copies (``sequences · vocab · 24``: float32 logits and probabilities, the top-p sort's values
    and int64 indices)."""
    from mmgpg.backends.memory import kv_cache_bytes

    head_dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // text_config.num_attention_heads
    kv = kv_cache_bytes(sequences, tokens, text_config.num_hidden_layers, text_config.num_key_value_heads, head_dim,
                        dtype_bytes)
    return kv + sequences * text_config.vocab_size * 24


def check_generation(batch_size: int, sequences: int, tokens: int, text_config: Any, dtype_bytes: int,
                     available: int, where: str = "--batch-size") -> None:
    """Refuse a generate call of ``sequences`` rows (at most ``batch_size``) whose :func:`generation_bytes` exceed
    80 % of ``available`` (the device's free memory, the weights already loaded), naming the largest batch that
    fits."""
    need = generation_bytes(sequences, tokens, text_config, dtype_bytes)
    budget = int(available * 0.8)
    if need <= budget:
        return
    fits = budget // max(generation_bytes(1, tokens, text_config, dtype_bytes), 1)
    if fits >= 1:
        fix = f"at most {where} {fits:,} fits; lower it, or --max-new-tokens"
    else:  # the tokens of one sequence alone are too many
        per_token = generation_bytes(1, 2, text_config, dtype_bytes) - generation_bytes(1, 1, text_config, dtype_bytes)
        one = (budget - generation_bytes(1, 0, text_config, dtype_bytes)) // max(per_token, 1)
        fix = f"not even one sequence fits: a sequence of at most {max(one, 0):,} tokens (prompt and new) fits"
    raise ValueError(f"{where} {batch_size}: one generate call of {sequences:,} sequences of up to {tokens:,} tokens "
                     f"needs {need / GiB:.1f} GiB (KV cache and logits) and {available / GiB:.1f} GiB is free: {fix}")
