"""The examples in docstrings (``>>>``) are run."""

import doctest

import mmgpg.policy


def test_policy_doctests():
    result = doctest.testmod(mmgpg.policy)
    assert result.attempted >= 3 and result.failed == 0
