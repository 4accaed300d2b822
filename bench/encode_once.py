"""What encoding each prompt's images once (shared by its G completions) saves in the log-prob forward + backward.

The peer is the same :meth:`mmgpg.models.qwen_vl.QwenVLPolicy.completion_logprobs` with ``encode_images_once=False``, which runs
the vision tower on G copies of every image (what a naive ``repeat_interleave`` of the batch does). Both run side by
side in one process on the same rollout, alternating, and the log-probs are checked to agree.

    python bench/encode_once.py                        # tiny model: P=2 prompts, G=8, 112x112 images
    python bench/encode_once.py --dims vision_true     # Qwen2-VL-2B's real vision tower (32 x 1280) + a 2-layer LM

Generation needs no such change: transformers (>= 5.19) already encodes images once per prompt inside
``generate(num_return_sequences=G)`` before expanding the batch.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch


def build(dims: str):
    from transformers import Qwen2VLForConditionalGeneration

    from mmgpg.models.qwen_vl import QwenVLPolicy
    from mmgpg.models.tiny import TINY, Dims, build_config, build_processor, build_tokenizer

    tok = build_tokenizer()
    if dims == "tiny":
        d = TINY
    else:  # Qwen2-VL-2B vision tower, language model cut to 2 layers (hidden size must match the merger output)
        d = Dims(151936, 1536, 8960, 2, 12, 2, (16, 24, 24), 1e6, True, 32, 1280, 16, 5120)
    torch.manual_seed(0)
    model = Qwen2VLForConditionalGeneration(build_config("qwen2_vl", d, tok))
    model.generation_config.eos_token_id = [tok.convert_tokens_to_ids("<|im_end|>"), 0]
    model.generation_config.pad_token_id = 0
    return QwenVLPolicy(model, build_processor("qwen2_vl", tok), min_pixels=3136, max_pixels=12544)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dims", choices=["tiny", "vision_true"], default="tiny")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from PIL import Image

    policy = build(args.dims)
    images = [Image.new("RGB", (112, 112), (123 + 20 * i, 117, 104)) for i in range(args.prompts)]
    convs = [[{"role": "user", "content": [{"type": "image", "image": im}, {"type": "text", "text": "Count."}]}]
             for im in images]
    torch.manual_seed(1)
    rollout = policy.generate(policy.encode_prompts(convs), args.group_size, max_new_tokens=args.new_tokens)

    times: dict[bool, list[float]] = {True: [], False: []}
    results = {}
    for rep in range(args.repeats + 1):  # first round is warm-up
        for once in (True, False):
            policy.model.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            logp = policy.completion_logprobs(rollout, encode_images_once=once)
            logp.sum().backward()
            if rep:
                times[once].append(time.perf_counter() - t0)
            results[once] = logp.detach()
    torch.testing.assert_close(results[True], results[False], atol=1e-4, rtol=0)
    shared, repeated = statistics.median(times[True]), statistics.median(times[False])
    vision = sum(p.numel() for n, p in policy.model.named_parameters() if "visual" in n)
    print(f"`python bench/encode_once.py {' '.join(sys.argv[1:])}`: dims={args.dims} "
          f"(vision {vision / 1e6:.1f} M params), P={args.prompts}, G={args.group_size}, "
          f"{rollout.num_completion_tokens} completion tokens, {args.threads} threads, median of {args.repeats}")
    print(f"| encode_images_once | log-probs forward+backward s |\n|---|---:|\n| True | {shared:.3f} |\n"
          f"| False (peer) | {repeated:.3f} |\n\nratio peer/ours: **{repeated / shared:.2f}x**")


if __name__ == "__main__":
    main()
