"""An independent reference for the trainer's gradient, and the fixed batch the gradient tests use.

The reference never touches the trainer's loss code (advantages, token losses, aggregation, α, micro-batching,
the chunked log-prob Function or the shared image encoding): it scores **one sequence at a time**, unpadded, through
the model's own ``forward`` with full-vocabulary logits, and writes the GPG/GRPO loss by hand:

    seq_mean_token_mean:  L = -α/B · Σ_i A_i · Σ_t log π(o_it) / |o_i|
    token_mean:           L = -α/N · Σ_i A_i · Σ_t log π(o_it)          (N = completion tokens of the update)
    constant_length:      L = -α/(B·T) · Σ_i A_i · Σ_t log π(o_it)      (T = rollout.max_new_tokens)

with B = samples in the update (zero-variance groups included), α = B/(B − M) and A_i computed from the rewards with
the ``statistics`` module. (With one update per batch the clipped ratio is exactly 1, and the k3 KL gradient
vanishes at the reference weights, so GRPO's first-step gradient has the same form with z-scored advantages.)
"""

from __future__ import annotations

import statistics

import torch

# Rewards of the four groups (G = 4). Group 2 has zero variance: B = 16, M = 4, α = 16/12 = 4/3 (B/M would be 4).
# Two ranks get groups [0, 1] and [2, 3]: rank 0 holds two informative groups, rank 1 one (an uneven split).
REWARDS = [[1, 0, 0, 1], [0, 1, 1, 1], [1, 1, 1, 1], [1, 0, 1, 0]]
ALPHA = 16 / 12


def trainer_args(model_dir: str, out: str, algo: str = "gpg", *extra: str) -> list[str]:
    return [f"algo={algo}", f"model.name_or_path={model_dir}", "model.dtype=float32", "model.max_pixels=12544",
            "rollout.group_size=4", "rollout.max_new_tokens=12", "train.prompts_per_step=4",
            "train.micro_batch_prompts=1", "train.learning_rate=1e-4", "train.progress=false",
            "train.tensorboard=false", f"output_dir={out}", *extra]


def make_trainer(model_dir: str, out: str, algo: str = "gpg", *extra: str):
    from mmgpg.config import resolve
    from mmgpg.train.trainer import Trainer

    return Trainer(resolve(trainer_args(model_dir, out, algo, *extra)))


def make_groups(trainer, indices, rewards=REWARDS):
    """Groups of fixed pseudo-random completions with unequal lengths (3-12 tokens; some end with EOS, some are cut
    at max_new_tokens without one), scored with the given rewards."""
    from mmgpg.rollout.collect import Group

    eos = trainer.policy.eos_token_ids[0]
    groups = []
    for i in indices:
        g = torch.Generator().manual_seed(100 + i)
        completions = []
        for j in range(4):
            if j % 2:  # truncated: exactly max_new_tokens tokens, no EOS
                completions.append(torch.randint(20, 1000, (12,), generator=g).tolist())
            else:
                n = int(torch.randint(2, 10, (1,), generator=g))
                completions.append(torch.randint(20, 1000, (n,), generator=g).tolist() + [eos])
        r = [float(x) for x in rewards[i]]
        groups.append(Group(trainer.dataset[i], completions, [""] * 4, r, {"accuracy": r}, 0, len(set(r)) == 1))
    return groups


def gpg_advantages(rewards: list[float]) -> list[float]:
    mean = statistics.fmean(rewards)
    return [r - mean for r in rewards]


def zscore_advantages(rewards: list[float], eps: float = 1e-4) -> list[float]:
    mean, std = statistics.fmean(rewards), statistics.stdev(rewards)  # stdev: the unbiased (n - 1) estimate
    return [(r - mean) / (std + eps) for r in rewards]


def sequence_logprob_sum(policy, example, prompt, completion: list[int], temperature: float = 1.0) -> torch.Tensor:
    """Σ_t log π(o_t) of one completion: one unpadded sequence through model.forward, full logits / temperature,
    log-softmax over the vocabulary the sampler may emit (a Qwen-VL policy's vision special tokens excluded; a text
    policy excludes nothing)."""
    batch = policy.encode_prompts([prompt])
    prompt_ids = batch.input_ids[0]
    ids = torch.cat([prompt_ids, torch.tensor(completion)])[None]
    kwargs = {}
    if policy.vision_tower is not None:  # a vision-language model: its image-token types, and the images if any
        kwargs["mm_token_type_ids"] = torch.cat([batch.mm_token_type_ids[0],
                                                 torch.zeros(len(completion), dtype=torch.long)])[None]
    if batch.pixel_values is not None:
        kwargs.update(pixel_values=batch.pixel_values, image_grid_thw=batch.image_grid_thw)
    logits = policy.model(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs).logits[0]
    logits = logits.float() / temperature
    logits[:, policy.suppressed_token_ids] = float("-inf")
    logp = torch.log_softmax(logits, -1)[len(prompt_ids) - 1 : -1]
    return logp.gather(-1, torch.tensor(completion)[:, None]).sum()


def reference_gradient(trainer, groups, advantages: list[list[float]], *, alpha: float, aggregation: str,
                       temperature: float = 1.0) -> dict[str, torch.Tensor]:
    """∇L of the hand-written loss above, one sequence at a time; {parameter name: gradient}."""
    policy = trainer.policy
    model = policy.model
    model.zero_grad(set_to_none=True)
    B = sum(len(g.completion_ids) for g in groups)
    N = sum(len(c) for g in groups for c in g.completion_ids)
    T = trainer.cfg.rollout.max_new_tokens
    for g, advs in zip(groups, advantages):
        prompt = trainer.task.prompt(g.example)
        for completion, A in zip(g.completion_ids, advs):
            if A == 0:
                continue
            s = sequence_logprob_sum(policy, g.example, prompt, completion, temperature)
            if aggregation == "seq_mean_token_mean":
                loss = -alpha * A * s / len(completion) / B
            elif aggregation == "token_mean":
                loss = -alpha * A * s / N
            elif aggregation == "constant_length":
                loss = -alpha * A * s / (B * T)
            else:
                raise ValueError(aggregation)
            loss.backward()
    out = {n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p)) for n, p in model.named_parameters()
           if p.requires_grad}
    model.zero_grad(set_to_none=True)
    return out


def trainer_gradient(trainer, groups) -> dict[str, torch.Tensor]:
    """The trainer's exact step gradient (summed over ranks), before clipping and the optimizer step."""
    model = trainer.policy.model
    model.zero_grad(set_to_none=True)
    trainer.compute_gradients(groups, trainer.advantages(groups))
    out = {n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p)) for n, p in model.named_parameters()
           if p.requires_grad}
    model.zero_grad(set_to_none=True)
    return out


def relative_error(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """‖a − b‖ / ‖b‖ over all parameters together (float64)."""
    assert a.keys() == b.keys()
    diff = sum(float((a[k].double() - b[k].double()).pow(2).sum()) for k in a)
    norm = sum(float(b[k].double().pow(2).sum()) for k in b)
    assert norm > 0, "the reference gradient is zero: the test would not see anything"
    return (diff / norm) ** 0.5
