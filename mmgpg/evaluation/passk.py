"""pass@k from ``n`` sampled completions per problem: the unbiased estimator of Chen et al. 2021 ("Evaluating Large
Language Models Trained on Code", §2.1) and the per-benchmark numbers sampled evaluation reports.

For one problem with ``n`` samples of which ``c`` are correct, the probability that at least one of ``k`` samples
drawn without replacement from the ``n`` is correct is ``1 - C(n - c, k) / C(n, k)``; averaged over problems it is an
unbiased estimate of pass@k of the sampling policy. ``k = 1`` gives ``c / n``: pass@1 is the mean, over problems, of
the fraction of correct samples (what the GPG paper's tables report, and lighteval's ``pass@1`` with ``n`` samples).
"""

from __future__ import annotations

from collections.abc import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """``1 - C(n - c, k) / C(n, k)``: the chance that ``k`` of ``n`` samples (``c`` correct), drawn without
    replacement, include a correct one.

    Computed as a product, without the large binomials: ``C(n - c, k) / C(n, k) = prod_{j=0}^{c-1} (n - k - j) /
    (n - j)``, which is 0 as soon as ``n - c < k`` (every draw of ``k`` then holds a correct sample); ``k = 1`` is
    ``c / n`` exactly.

    >>> pass_at_k(4, 1, 2), pass_at_k(5, 2, 2), pass_at_k(10, 3, 1), pass_at_k(3, 2, 2)
    (0.5, 0.7, 0.3, 1.0)
    """
    if not (isinstance(n, int) and isinstance(c, int) and isinstance(k, int)):
        raise TypeError(f"pass_at_k takes integers; got n={n!r}, c={c!r}, k={k!r}")
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    if k == 1:
        return c / n
    none_correct = 1.0
    for j in range(c):
        none_correct *= (n - k - j) / (n - j)
    return 1.0 - none_correct


def k_ladder(n: int) -> list[int]:
    """The ``k`` reported for ``n`` samples per problem: 1, 2, 4, ... (powers of two below ``n``) and ``n``.

    >>> k_ladder(1), k_ladder(4), k_ladder(6)
    ([1], [1, 2, 4], [1, 2, 4, 6])
    """
    if n < 1:
        raise ValueError(f"k_ladder needs n >= 1; got {n}")
    ks, k = [], 1
    while k < n:
        ks.append(k)
        k *= 2
    return [*ks, n]


def is_binary(values: Sequence[float]) -> bool:
    """Whether every value is a 0/1 decision (a correct/incorrect judgement, not a score such as an IoU)."""
    return all(v in (0, 1) for v in values)


def pass_at_k_metrics(groups: Sequence[Sequence[float]]) -> dict[str, float]:
    """``pass@k`` averaged over problems, for every ``k`` of :func:`k_ladder` up to the smallest group: ``groups``
    holds each problem's 0/1 ``correct`` values (one per sample). Empty when there are no groups or when a value is
    not 0/1 (a continuous score has no pass@k; the task's own aggregate reports it).

    >>> pass_at_k_metrics([[1, 0, 0, 0], [1, 1, 0, 0]])
    {'pass@1': 0.375, 'pass@2': 0.6666666666666667, 'pass@4': 1.0}
    """
    groups = [list(g) for g in groups]
    if not groups or any(not g for g in groups) or not all(is_binary(g) for g in groups):
        return {}
    counts = [(len(g), int(sum(g))) for g in groups]
    return {f"pass@{k}": sum(pass_at_k(n, c, k) for n, c in counts) / len(counts)
            for k in k_ladder(min(n for n, _ in counts))}
