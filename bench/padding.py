"""Padding in the update: the fraction of computed token positions that are padding, and the update's
forward + backward time, for three ways of forming micro-batches of the same groups, side by side in one process:

* ``rollout order`` — micro-batches of ``--micro-batch-prompts`` groups in the order the rollout made them, each
  padded to its own longest prompt and completion (mmgpg before length grouping);
* ``length-ordered`` — the same, after :func:`mmgpg.rollout.collect.length_ordered` (the default now);
* ``packed`` — length-ordered, each micro-batch's rows packed into one sequence without padding
  (``model.packed_sequences=always``; text policies).

The groups are synthetic with a long-tailed length mix like a reasoning RL step: each prompt has its own typical
completion length (log-normal around ``--median-tokens``), its ``G`` completions scatter around it (log-normal,
sigma 0.5), and completions longer than ``--max-new-tokens`` are cut there (truncated, as in a real rollout);
prompts are 40-200 tokens. The model is a random-init ``Qwen2ForCausalLM`` built with the real transformers class
(``--hidden``/``--layers``; the tiny tokenizer). Log-probs go through mmgpg's real scoring path
(:meth:`TextPolicy.completion_logprobs`), timed as forward + backward of ``sum(logp)`` per micro-batch, the three
arrangements interleaved over ``--repeats`` rounds (median and range).

    python bench/padding.py                      # 16 prompts x 8, micro-batches of 2 groups, max 512 new tokens
    python bench/padding.py --out bench/results/padding.md

The padding fractions are exact counts (no timing); the times depend on the machine and its load (printed).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path


def synthetic_groups(n_prompts: int, group_size: int, median: int, max_new: int, vocab: int, seed: int):
    import torch

    from mmgpg.models.batch import PromptBatch
    from mmgpg.rollout.collect import Group

    g = torch.Generator().manual_seed(seed)
    groups = []
    for _ in range(n_prompts):
        prompt_len = int(torch.randint(40, 201, (1,), generator=g))
        prompts = PromptBatch(torch.randint(10, vocab, (1, prompt_len), generator=g),
                              torch.ones(1, prompt_len, dtype=torch.long), torch.zeros(1, prompt_len, dtype=torch.long),
                              [{}], [[]], [""])
        typical = median * float(torch.empty(1).log_normal_(0, 0.6, generator=g))
        lengths = [max(1, min(max_new, int(typical * float(torch.empty(1).log_normal_(0, 0.5, generator=g)))))
                   for _ in range(group_size)]
        completions = [torch.randint(10, vocab, (n,), generator=g).tolist() for n in lengths]
        groups.append(Group(None, completions, [""] * group_size, [0.0] * group_size, {}, prompts=prompts,
                            prompt_index=0))
    return groups


def build_policy(directory: Path, hidden: int, layers: int):
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from mmgpg.models.load import load_policy
    from mmgpg.models.tiny import build_and_save
    from mmgpg.utils import no_transformers_bars

    tiny = build_and_save(directory / "tiny", family="qwen2")
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    base = Qwen2Config.from_pretrained(tiny)
    config = Qwen2Config(vocab_size=base.vocab_size, hidden_size=hidden, intermediate_size=3 * hidden,
                         num_hidden_layers=layers, num_attention_heads=max(1, hidden // 64),
                         num_key_value_heads=max(1, hidden // 256), max_position_embeddings=4096,
                         bos_token_id=base.bos_token_id, eos_token_id=base.eos_token_id, pad_token_id=base.pad_token_id)
    out = directory / "model"
    with no_transformers_bars():
        Qwen2ForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return load_policy(str(out), dtype="float32", device="cpu")


def arrangements(groups, mb: int):
    from mmgpg.rollout.collect import length_ordered

    ordered = length_ordered(groups)
    chunk = lambda gs: [gs[i : i + mb] for i in range(0, len(gs), mb)]  # noqa: E731
    return {"rollout order": (chunk(groups), False), "length-ordered": (chunk(ordered), False),
            "packed": (chunk(ordered), True)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--micro-batch-prompts", type=int, default=2)
    ap.add_argument("--median-tokens", type=int, default=160)
    ap.add_argument("--max-new-tokens", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--out", help="also write the markdown table here")
    args = ap.parse_args()

    import torch

    from mmgpg.rollout.collect import collate_groups, padding_counts

    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        policy = build_policy(Path(tmp), args.hidden, args.layers)
        groups = synthetic_groups(args.prompts, args.group_size, args.median_tokens, args.max_new_tokens,
                                  policy.model.config.vocab_size, args.seed)
        arranged = {name: ([collate_groups(policy, None, c, args.group_size) for c in chunks], packed)
                    for name, (chunks, packed) in arrangements(groups, args.micro_batch_prompts).items()}
        counts = {}
        for name, (batches, packed) in arranged.items():
            per = [padding_counts(b, packed=packed) for b in batches]
            counts[name] = (sum(c for c, _ in per), sum(p for _, p in per))
        times: dict[str, list[float]] = {name: [] for name in arranged}
        policy.model.train()
        for _ in range(args.repeats):
            for name, (batches, packed) in arranged.items():
                t0 = time.perf_counter()
                for b in batches:
                    policy.completion_logprobs(b, packed=packed).sum().backward()
                times[name].append(time.perf_counter() - t0)
                policy.model.zero_grad(set_to_none=True)

    lengths = [len(c) for g in groups for c in g.completion_ids]
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    base = statistics.median(times["rollout order"])
    lines = [
        f"{args.prompts} prompts x {args.group_size} completions, micro-batches of {args.micro_batch_prompts} groups; "
        f"completion tokens: median {statistics.median(lengths):.0f}, max {max(lengths)} "
        f"({sum(n == args.max_new_tokens for n in lengths)} truncated at {args.max_new_tokens}); Qwen2 "
        f"hidden {args.hidden}, {args.layers} layers, float32, torch threads {torch.get_num_threads()}; "
        f"load average at the end {load}.",
        "",
        "| micro-batches | computed positions | padding | padding fraction | update fwd+bwd s (median [min-max]) | "
        "time vs rollout order |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, (computed, padding) in counts.items():
        t = times[name]
        lines.append(f"| {name} | {computed:,} | {padding:,} | {padding / computed:.3f} | "
                     f"{statistics.median(t):.2f} [{min(t):.2f}-{max(t):.2f}] | "
                     f"{statistics.median(t) / base:.2f}x |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
