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

import math
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
    """Σ_t log π(o_t) of one completion (:func:`sequence_token_logprobs` summed)."""
    return sequence_token_logprobs(policy, prompt, completion, temperature).sum()


def sequence_token_logprobs(policy, prompt, completion: list[int], temperature: float = 1.0) -> torch.Tensor:
    """``[T]``: log π(o_t) of each token of one completion: one unpadded sequence through model.forward, full logits /
    temperature, log-softmax over the vocabulary the sampler may emit (a Qwen-VL policy's vision special
    tokens excluded; a text policy excludes nothing)."""
    batch = policy.encode_prompts([prompt])
    prompt_ids = batch.input_ids[0]
    ids = torch.cat([prompt_ids, torch.tensor(completion)])[None]
    kwargs = {}
    if policy.spec.token_types_kwarg:  # a vision-language model's image-token types, under its forward's own name
        kwargs[policy.spec.token_types_kwarg] = torch.cat([batch.mm_token_type_ids[0],
                                                           torch.zeros(len(completion), dtype=torch.long)])[None]
    kwargs.update(batch.vision[0])  # the prompt's vision inputs as its processor returns them (none for text)
    logits = policy.model(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs).logits[0]
    logits = logits.float() / temperature
    logits[:, policy.suppressed_token_ids] = float("-inf")
    logp = torch.log_softmax(logits, -1)[len(prompt_ids) - 1 : -1]
    return logp.gather(-1, torch.tensor(completion)[:, None])[:, 0]


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


def reference_gradient_with_kl(trainer, groups, advantages: list[list[float]], *, alpha: float, beta: float,
                               alpha_on_kl: bool = False) -> dict[str, torch.Tensor]:
    """∇L for GPG with a k3 KL term under seq_mean_token_mean, one sequence at a time:

        L = 1/B · Σ_i [ -α A_i Σ_t log π(o_it) / |o_i|  +  c · β Σ_t k3_it / |o_i| ],
        k3_it = exp(d) - d - 1,  d = log π_ref(o_it) - log π(o_it),

    over **every** sequence (zero-variance groups carry KL too), c = 1 (mmgpg's documented choice: α scales the
    policy term only) or c = α (``alpha_on_kl``: the forks' division of the whole loss by the inverse α)."""
    policy, reference = trainer.policy, trainer.reference
    model = policy.model
    model.zero_grad(set_to_none=True)
    B = sum(len(g.completion_ids) for g in groups)
    for g, advs in zip(groups, advantages):
        prompt = trainer.task.prompt(g.example)
        for completion, A in zip(g.completion_ids, advs):
            logp = sequence_token_logprobs(policy, prompt, completion)
            with torch.no_grad():
                ref = sequence_token_logprobs(reference, prompt, completion)
            d = ref - logp
            kl = (torch.exp(d) - d - 1).sum() / len(completion)
            loss = (-alpha * A * logp.sum() / len(completion) + (alpha if alpha_on_kl else 1.0) * beta * kl) / B
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


# ---- the baselines of issue 21: advantages and losses written by hand ------------------------------------------------
#
# RLOO:               A_i = r_i - (Σ_{j≠i} r_j) / (G - 1)
# REINFORCE++:        A_i = (r_i - μ) / sqrt(σ² + ε), μ and σ² (unbiased) over every completion token of the batch
# REINFORCE++-base:   the same whitening of c_i = r_i - group mean
# DAPO overlong:      r_i + min(0, max(-1, (L_max - L_cache - L_i) / L_cache))
# token losses, ρ_t = exp(log π(o_t) - log π_old(o_t)), clip(x) = min(max(x, 1 - lo), 1 + hi):
#   clipped_ratio     ℓ_t = -min(ρ_t A, clip(ρ_t) A)
#   gspo              ℓ_t = -min(s A, clip(s) A) for every t, s = exp(mean_t (log π - log π_old))
#   gspo_token        ℓ_t = -min(s_t A, clip(s_t) A), s_t = sg[s] · π(o_t) / sg[π(o_t)]
#   cispo             ℓ_t = -sg[min(max(ρ_t, 1 - lo), 1 + hi)] · A · log π(o_t)  (lo = None: no lower bound)
# and the policy loss α / D · Σ_i (Σ_t ℓ_t / |o_i| for seq_mean_token_mean, Σ_t ℓ_t otherwise), D = B, N or B·T.


def rloo_advantages(rewards: list[float]) -> list[float]:
    G = len(rewards)
    return [r - (sum(rewards) - r) / (G - 1) for r in rewards]


def whitened(values: list[list[float]], weights: list[list[int]], eps: float = 1e-8) -> list[list[float]]:
    """(v - μ) / sqrt(σ² + eps) with the weight-counted mean and unbiased variance over every group (all ranks)."""
    flat = [(v, w) for vs, ws in zip(values, weights) for v, w in zip(vs, ws)]
    n = sum(w for _, w in flat)
    mean = sum(v * w for v, w in flat) / n
    var = sum(w * (v - mean) ** 2 for v, w in flat) / (n - 1)
    return [[(v - mean) / math.sqrt(var + eps) for v in vs] for vs in values]


def overlong_shaped(rewards: list[float], lengths: list[int], max_len: int, cache: int) -> list[float]:
    return [r + min(0.0, max(-1.0, (max_len - cache - n) / cache)) for r, n in zip(rewards, lengths)]


def is_truncated(trainer, completion: list[int]) -> bool:
    return not completion or completion[-1] not in trainer.policy.eos_token_ids


def token_losses(loss: str, logp: torch.Tensor, old: torch.Tensor, A: float, lo: float, hi: float,
                 cispo_low: float | None = None) -> torch.Tensor:
    """ℓ_t of one sequence by the formulas above (``old`` is a constant)."""
    def clip(x):
        return torch.clamp(x, 1 - lo, 1 + hi)

    if loss == "reinforce":
        return -A * logp
    if loss == "clipped_ratio":
        ratio = torch.exp(logp - old)
        return -torch.minimum(ratio * A, clip(ratio) * A)
    if loss == "gspo":
        s = torch.exp((logp - old).mean())
        return (-torch.minimum(s * A, clip(s) * A)).expand(len(logp))
    if loss == "gspo_token":
        s_t = torch.exp((logp - old).mean()).detach() * torch.exp(logp - logp.detach())
        return -torch.minimum(s_t * A, clip(s_t) * A)
    if loss == "cispo":
        ratio = torch.exp(logp - old).detach()
        weight = torch.clamp(ratio, None if cispo_low is None else 1 - cispo_low, 1 + hi)
        return -weight * A * logp
    raise ValueError(loss)


def reference_loss_gradient(trainer, groups, advantages: list[list[float]], *, loss: str, aggregation: str,
                            alpha: float = 1.0, old: list[list[torch.Tensor]] | None = None, lo: float = 0.2,
                            hi: float = 0.2, cispo_low: float | None = None,
                            filtered: bool = False) -> dict[str, torch.Tensor]:
    """∇ of the loss above, one sequence at a time, with old log-probs ``old[g][j]`` (None: the current weights', a
    ratio of 1) and ``filtered``: truncated completions out of the loss and of N (DAPO's overlong filter)."""
    policy, model = trainer.policy, trainer.policy.model
    model.zero_grad(set_to_none=True)
    B = sum(len(g.completion_ids) for g in groups)
    kept = [[not (filtered and is_truncated(trainer, c)) for c in g.completion_ids] for g in groups]
    N = sum(len(c) for g, ks in zip(groups, kept) for c, k in zip(g.completion_ids, ks) if k)
    denominator = {"seq_mean_token_mean": B, "token_mean": N,
                   "constant_length": B * trainer.cfg.rollout.max_new_tokens}[aggregation]
    for gi, (g, advs) in enumerate(zip(groups, advantages)):
        prompt = trainer.task.prompt(g.example)
        for j, (completion, A) in enumerate(zip(g.completion_ids, advs)):
            if A == 0 or not kept[gi][j]:
                continue
            logp = sequence_token_logprobs(policy, prompt, completion)
            o = logp.detach() if old is None else old[gi][j]
            per_token = token_losses(loss, logp, o, A, lo, hi, cispo_low)
            total = per_token.sum() / len(completion) if aggregation == "seq_mean_token_mean" else per_token.sum()
            (alpha * total / denominator).backward()
    out = {n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p)) for n, p in model.named_parameters()
           if p.requires_grad}
    model.zero_grad(set_to_none=True)
    return out


def reference_old_logprobs(trainer, groups) -> list[list[torch.Tensor]]:
    """Each completion's token log-probs at the current weights, as constants."""
    with torch.no_grad():
        return [[sequence_token_logprobs(trainer.policy, trainer.task.prompt(g.example), c) for c in g.completion_ids]
                for g in groups]


def update_gradients(trainer, groups) -> list[tuple[dict, dict]]:
    """Run the trainer's real update (``algo.updates_per_batch`` optimizer steps on these groups) and return, for
    each optimizer step, the weights it was computed at and the summed gradient it received before clipping (read
    by a wrapper around the backend's own step, which then runs)."""
    model, real_step, seen = trainer.policy.model, trainer.backend.step, []

    def recording_step():
        params = dict(model.named_parameters())
        seen.append(({n: p.detach().clone() for n, p in params.items()},
                     {n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p)) for n, p in params.items()
                      if p.requires_grad}))
        return real_step()

    trainer.backend.step = recording_step
    try:
        trainer.update(groups, trainer.advantages(groups))
    finally:
        trainer.backend.step = real_step
    return seen


def load_weights(trainer, weights: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for n, p in trainer.policy.model.named_parameters():
            p.copy_(weights[n])


def group_centred(rewards: list[float]) -> list[float]:
    mean = statistics.fmean(rewards)
    return [r - mean for r in rewards]
