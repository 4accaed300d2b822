"""The examples in docstrings (``>>>``) are run."""

import doctest

import mmgpg.models.logprobs


def test_logprobs_doctests():
    result = doctest.testmod(mmgpg.models.logprobs)
    assert result.attempted >= 3 and result.failed == 0
