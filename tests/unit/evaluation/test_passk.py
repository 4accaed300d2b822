"""pass@k (Chen et al. 2021): hand-computed values, the exact binomial ratio (``math.comb`` with fractions) as the
independent reference, the k ladder, and sampled-evaluation settings that are refused."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from mmgpg.evaluation.passk import k_ladder, pass_at_k, pass_at_k_metrics
from mmgpg.evaluation.run import SampledDecoding


@pytest.mark.parametrize(("n", "c", "k", "want"), [
    (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
    (10, 3, 1, 0.3),  # c/n
    (8, 2, 4, 1 - 15 / 70),  # 1 - C(6,4)/C(8,4) = 1 - 15/70 = 11/14
    (3, 2, 2, 1.0),  # n - c < k: every pair holds a correct sample
    (6, 0, 3, 0.0),
    (6, 6, 6, 1.0),
])
def test_hand_computed(n, c, k, want):
    assert pass_at_k(n, c, k) == pytest.approx(want, abs=1e-15)


def test_equals_the_exact_binomial_ratio_without_overflow():
    """The product form against ``1 - C(n-c, k) / C(n, k)`` in exact arithmetic, including n = 1000 where the
    binomials have ~300 digits (a float division of them would overflow)."""
    for n, c, k in [(16, 5, 1), (16, 5, 8), (16, 5, 12), (64, 31, 16), (1000, 7, 500), (1000, 993, 3)]:
        exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
        assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-12, abs=1e-15), (n, c, k)


def test_invalid_counts_are_errors():
    for n, c, k in [(4, 5, 1), (4, 1, 0), (4, 1, 5), (4, -1, 1)]:
        with pytest.raises(ValueError, match="0 <= c <= n and 1 <= k <= n"):
            pass_at_k(n, c, k)
    with pytest.raises(TypeError):
        pass_at_k(4, 1.0, 1)


def test_k_ladder_and_metrics():
    assert k_ladder(1) == [1] and k_ladder(2) == [1, 2] and k_ladder(8) == [1, 2, 4, 8]
    assert k_ladder(5) == [1, 2, 4, 5] and k_ladder(12) == [1, 2, 4, 8, 12]
    # problems with 1/4, 2/4 and 0/4 correct: pass@1 = (0.25 + 0.5 + 0) / 3; pass@2 = (1/2 + 5/6 + 0) / 3
    got = pass_at_k_metrics([[1, 0, 0, 0], [0, 1, 0, 1], [0, 0, 0, 0]])
    assert got == pytest.approx({"pass@1": 0.25, "pass@2": 4 / 9, "pass@4": 2 / 3})
    # unequal sample counts (rows skipped): pass@k only up to the smallest group; pass@1 is still each c/n
    assert pass_at_k_metrics([[1, 0], [1, 1, 0, 0]]) == pytest.approx({"pass@1": 0.5, "pass@2": (1 + 5 / 6) / 2})
    assert pass_at_k_metrics([[0.5, 1.0]]) == {} and pass_at_k_metrics([]) == {}  # a score (an IoU) has no pass@k


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"samples": 0, "temperature": 0.6}, "samples must be an integer >= 1"),
    ({"samples": 2, "temperature": -0.1}, "temperature must be >= 0"),
    ({"samples": 4, "temperature": 0.0}, "temperature 0 is greedy decoding: the 4 samples"),
    ({"samples": 2, "temperature": 0.6, "top_p": 0.0}, r"top_p must be in \(0, 1\]"),
    ({"samples": 2, "temperature": 0.6, "top_p": 1.5}, r"top_p must be in \(0, 1\]"),
    ({"samples": 2, "temperature": 0.6, "top_k": -1}, "top_k must be an integer >= 0"),
])
def test_refused_decodings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SampledDecoding(**kwargs)


def test_greedy_as_one_sample_is_allowed():
    assert SampledDecoding(1, 0.0).source()["temperature"] == 0.0
