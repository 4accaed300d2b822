"""The examples in docstrings (``>>>``) are run."""

import doctest

import mmgpg.models.logprobs


def test_logprobs_doctests():
    result = doctest.testmod(mmgpg.models.logprobs)
    assert result.attempted >= 3 and result.failed == 0


def test_text_policy_and_lora_doctests():
    import mmgpg.models.lora
    import mmgpg.models.text

    for module, least in ((mmgpg.models.text, 1), (mmgpg.models.lora, 4)):
        result = doctest.testmod(module)
        assert result.attempted >= least and result.failed == 0, module.__name__


def test_arith_task_doctests():
    import mmgpg_tasks.arith

    result = doctest.testmod(mmgpg_tasks.arith)
    assert result.attempted >= 1 and result.failed == 0


def test_post_sync_check_doctests():
    import mmgpg.rollout.check

    result = doctest.testmod(mmgpg.rollout.check)
    assert result.attempted >= 5 and result.failed == 0


def test_vllm_channel_and_bucket_doctests():
    import mmgpg.rollout.vllm_channel
    import mmgpg.rollout.vllm_core

    for module, least in ((mmgpg.rollout.vllm_channel, 3), (mmgpg.rollout.vllm_core, 2)):
        result = doctest.testmod(module)
        assert result.attempted >= least and result.failed == 0, module.__name__
