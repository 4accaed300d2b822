"""The post-sync check: the rollout engine's log-probs of its sampled tokens against the trainer's.

An engine that keeps its own copy of the weights (vLLM) returns the log-probability of each token it sampled. The
update computes :meth:`mmgpg.models.qwen_vl.QwenVLPolicy.completion_logprobs` of the same tokens with the weights the rollout was
supposed to use (before the optimizer step), so comparing the two costs no extra forward pass. Stale or half-applied
weights after a sync (a known silent failure of colocated training) show up as a jump of the difference.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mmgpg import distributed
from mmgpg.rollout.engine import CheckLimits

EXACT_MEAN_LIMIT = 1e-3
"""Default mean limit when the engine and the trainer both compute in float32 (only summation order differs)."""
MIXED_MEAN_LIMIT = 5e-2
"""Default mean limit otherwise (a bfloat16/float16 side: one bf16 rounding of a log-prob is ~4e-3 relative)."""


class LogprobMismatchError(ValueError):
    """The rollout engine's log-probs disagree with the trainer's beyond the configured limit (a ValueError, so the
    command line prints its message without a traceback)."""


@dataclass
class LogprobDiff:
    """Running ``Σ|d|``, ``max|d|`` and the token count, ``d = engine log-prob − trainer log-prob``."""

    total: float = 0.0
    maximum: float = 0.0
    tokens: int = 0

    def add(self, engine_lp: torch.Tensor, trainer_lp: torch.Tensor, mask: torch.Tensor) -> None:
        """Accumulate over the masked-in tokens of one micro-batch (all ``[N, T]``).

        >>> d = LogprobDiff()
        >>> d.add(torch.tensor([[-1.0, -2.0, 0.0]]), torch.tensor([[-1.5, -2.0, -9.0]]), torch.tensor([[1, 1, 0]]).bool())
        >>> (d.total, d.maximum, d.tokens)
        (0.5, 0.5, 2)
        """
        diff = (engine_lp.to(trainer_lp.device, torch.float64) - trainer_lp.detach().double()).abs()[mask.to(trainer_lp.device)]
        if diff.numel():
            self.total += float(diff.sum())
            self.maximum = max(self.maximum, float(diff.max()))
            self.tokens += int(diff.numel())

    def reduce(self, comm_device="cpu") -> tuple[float, float, int]:
        """``(mean, max, tokens)`` over all ranks (collective: every rank calls it). mean is NaN with no tokens."""
        total, tokens = distributed.all_sum([self.total, float(self.tokens)], comm_device)
        maximum = distributed.all_max(self.maximum, comm_device)
        return (total / tokens if tokens else float("nan")), maximum, int(tokens)


def check_limits(enabled: bool, mean_limit: float | None, max_limit: float | None, *,
                 engine_dtype: str, trainer_dtype: str, autocast: bool) -> CheckLimits | None:
    """The post-sync check's limits from ``rollout.logprob_check``, ``logprob_check_mean`` and ``logprob_check_max``
    (``None`` when the check is off). A mean limit left unset is :data:`EXACT_MEAN_LIMIT` (1e-3) when both sides
    compute in float32 — the engine's weights ``engine_dtype == "float32"``, the trainer's ``trainer_dtype ==
    "float32"`` and no mixed-precision ``autocast`` — else :data:`MIXED_MEAN_LIMIT` (5e-2); an unset max limit stays
    unchecked. A limit that is set is used as given.

    >>> check_limits(True, None, None, engine_dtype="bfloat16", trainer_dtype="float32", autocast=False)
    CheckLimits(mean=0.05, max=None)
    """
    if not enabled:
        return None
    exact = engine_dtype == "float32" and trainer_dtype == "float32" and not autocast
    mean = mean_limit if mean_limit is not None else (EXACT_MEAN_LIMIT if exact else MIXED_MEAN_LIMIT)
    return CheckLimits(mean, max_limit)


def check_logprob_diff(mean: float, maximum: float, tokens: int, *, mean_limit: float | None,
                       max_limit: float | None, step: int) -> dict[str, float]:
    """The step's metrics ``rollout/logprob_diff_mean|max``; raises :class:`LogprobMismatchError` when the mean
    exceeds ``mean_limit`` or the max exceeds ``max_limit`` (``None``: that one is not checked). A value exactly at
    its limit passes (``value <= limit``); a NaN value (a NaN log-prob on either side) fails. With no tokens
    nothing is checked.

    >>> check_logprob_diff(1e-5, 2e-4, 10, mean_limit=1e-3, max_limit=None, step=3)
    {'rollout/logprob_diff_mean': 1e-05, 'rollout/logprob_diff_max': 0.0002}
    """
    out = {"rollout/logprob_diff_mean": mean, "rollout/logprob_diff_max": maximum}
    if not tokens:
        return out
    broken = [(name, value, limit) for name, value, limit in (("mean", mean, mean_limit), ("max", maximum, max_limit))
              if limit is not None and not value <= limit]
    if broken:
        what = "; ".join(f"{name} |difference| {value:.3g} > rollout.logprob_check_{name}={limit:g}"
                         for name, value, limit in broken)
        raise LogprobMismatchError(
            f"step {step + 1}: the rollout engine's log-probs of its sampled tokens disagree with the trainer's "
            f"({what}; over {tokens} completion tokens). The engine did not generate with the trained weights: a "
            "weight sync was skipped, failed or was applied only in part. Training stopped before this step's "
            "optimizer step; resume from the last checkpoint (train.resume=true) after fixing the engine. If the "
            "difference is numerical (e.g. bfloat16), raise the limit or set rollout.logprob_check=false.")
    return out
