"""The post-sync check's limit handling (mmgpg.rollout.check), decided by hand: which limit applies for which
dtypes, what happens exactly at a limit, beyond it, below it, with NaN, with no tokens, and with either limit unset.
(The arithmetic of the differences is in test_vllm_setup.py.)"""

from __future__ import annotations

import math

import pytest

from mmgpg.rollout.check import LogprobMismatchError, check_limits, check_logprob_diff
from mmgpg.rollout.engine import CheckLimits


@pytest.mark.parametrize("engine, trainer, autocast, mean", [
    ("float32", "float32", False, 1e-3),  # both sides float32: only summation order differs
    ("bfloat16", "float32", False, 5e-2),  # the engine's weights in bf16
    ("float32", "bfloat16", False, 5e-2),  # the trainer's weights in bf16
    ("float32", "float32", True, 5e-2),  # float32 master weights under bf16 autocast
    ("float16", "float16", False, 5e-2),
])
def test_default_mean_limit_follows_the_dtypes(engine, trainer, autocast, mean):
    limits = check_limits(True, None, None, engine_dtype=engine, trainer_dtype=trainer, autocast=autocast)
    assert limits == CheckLimits(mean, None)  # an unset max is not checked


def test_set_limits_are_used_as_given_and_off_means_no_check():
    assert check_limits(True, 0.2, 0.7, engine_dtype="float32", trainer_dtype="float32", autocast=False) == \
        CheckLimits(0.2, 0.7)
    assert check_limits(True, 1e-6, None, engine_dtype="bfloat16", trainer_dtype="float32", autocast=True) == \
        CheckLimits(1e-6, None)
    assert check_limits(False, 0.2, 0.7, engine_dtype="float32", trainer_dtype="float32", autocast=False) is None


def check(mean, maximum, tokens=10, mean_limit=None, max_limit=None):
    return check_logprob_diff(mean, maximum, tokens, mean_limit=mean_limit, max_limit=max_limit, step=4)


@pytest.mark.parametrize("limit", [1e-3, 5e-2, 0.25, 0.0])
def test_a_value_exactly_at_its_limit_passes_and_the_next_float_above_fails(limit):
    above = math.nextafter(limit, math.inf)
    below = math.nextafter(limit, -math.inf) if limit > 0 else 0.0
    for value in (below, limit):
        assert check(value, 0.0, mean_limit=limit) == {"rollout/logprob_diff_mean": value, "rollout/logprob_diff_max": 0.0}
        assert check(0.0, value, max_limit=limit)["rollout/logprob_diff_max"] == value
    with pytest.raises(LogprobMismatchError, match="mean"):
        check(above, 0.0, mean_limit=limit)
    with pytest.raises(LogprobMismatchError, match="max"):
        check(0.0, above, max_limit=limit)


def test_each_limit_guards_its_own_value():
    # mean 0.01 and max 0.3: a mean limit of 0.02 passes whatever the max, a max limit of 0.2 fails whatever the mean
    assert check(0.01, 0.3, mean_limit=0.02)  # the max is not checked (unset)
    with pytest.raises(LogprobMismatchError) as err:
        check(0.01, 0.3, mean_limit=0.02, max_limit=0.2)
    assert "max |difference| 0.3 > rollout.logprob_check_max=0.2" in str(err.value) and "mean |" not in str(err.value)
    with pytest.raises(LogprobMismatchError) as err:
        check(0.03, 0.1, mean_limit=0.02, max_limit=0.2)
    assert "mean |difference| 0.03 > rollout.logprob_check_mean=0.02" in str(err.value) and "max |" not in str(err.value)
    with pytest.raises(LogprobMismatchError) as err:  # both broken: both named, and the 1-based step
        check(0.03, 0.3, mean_limit=0.02, max_limit=0.2)
    assert "step 5:" in str(err.value) and "mean |" in str(err.value) and "max |" in str(err.value)
    assert "over 10 completion tokens" in str(err.value)


@pytest.mark.parametrize("mean, maximum, limits", [
    (math.nan, 0.0, {"mean_limit": 1.0}),
    (0.0, math.nan, {"max_limit": 1.0}),
    (math.inf, 0.0, {"mean_limit": 1e300}),
])
def test_nan_and_inf_fail_the_check(mean, maximum, limits):
    """A NaN log-prob on either side makes the mean (or max) NaN: never "within the limit"."""
    with pytest.raises(LogprobMismatchError):
        check(mean, maximum, **limits)


def test_no_limits_or_no_tokens_check_nothing():
    assert check(math.nan, math.nan) == {"rollout/logprob_diff_mean": pytest.approx(math.nan, nan_ok=True),
                                         "rollout/logprob_diff_max": pytest.approx(math.nan, nan_ok=True)}
    # a step with no sampled tokens (every completion empty): the NaN mean is logged, not an error
    out = check(math.nan, 0.0, tokens=0, mean_limit=1e-9, max_limit=1e-9)
    assert math.isnan(out["rollout/logprob_diff_mean"]) and out["rollout/logprob_diff_max"] == 0.0
