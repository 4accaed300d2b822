"""The vLLM engine's set-up errors and the post-sync check's arithmetic, without vLLM (core environment)."""

from __future__ import annotations

import importlib.util
import time

import pytest
import torch

from mmgpg.config import ConfigError, resolve
from mmgpg.models.load import load_policy
from mmgpg.rollout.check import LogprobDiff, LogprobMismatchError, check_logprob_diff
from mmgpg.rollout.engine import EngineSettings, build_engine


@pytest.fixture(scope="module")
def policy(tiny_dirs):
    return load_policy(str(tiny_dirs["qwen2_vl"]), dtype="float32", device="cpu")


def test_top_p_with_the_check_is_a_config_error(policy):
    cfg = resolve(["model=tiny", "rollout.engine=vllm", "rollout.top_p=0.9"]).config
    with pytest.raises(ConfigError, match="rollout.top_p/top_k.*logprob_check=false"):
        build_engine("vllm", policy, EngineSettings.from_config(cfg))


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_missing_vllm_names_the_install_doc(policy):
    with pytest.raises(ConfigError, match="docs/install.md"):
        build_engine("vllm", policy, EngineSettings.from_config(resolve(["model=tiny", "rollout.engine=vllm"]).config))


def test_unreachable_server_is_one_clear_error(policy):
    from mmgpg.rollout.vllm_server import VLLMServerError

    cfg = resolve(["model=tiny", "rollout.engine=vllm", "rollout.vllm_server=http://127.0.0.1:9",
                   "rollout.vllm_server_timeout=2"]).config
    t0 = time.monotonic()
    with pytest.raises(VLLMServerError, match="no vLLM server answered at http://127.0.0.1:9.*mmgpg vllm-serve"):
        build_engine("vllm", policy, EngineSettings.from_config(cfg))
    assert time.monotonic() - t0 < 60
    cfg.rollout.vllm_server = "127.0.0.1:9"
    with pytest.raises(ValueError, match="not an http:// URL"):
        build_engine("vllm", policy, EngineSettings.from_config(cfg))


def test_logprob_diff_over_micro_batches_and_the_limits():
    d = LogprobDiff()
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]]).bool()
    d.add(torch.tensor([[-1.0, -2.0, -0.5, 3.0], [-4.0, 9.0, 9.0, 9.0]]),
          torch.tensor([[-1.1, -2.0, -0.2, 0.0], [-4.0, 0.0, 0.0, 0.0]]), mask)
    d.add(torch.tensor([[-1.0]]), torch.tensor([[-1.0]]), torch.tensor([[True]]))
    mean, mx, n = d.reduce()
    assert n == 5 and mx == pytest.approx(0.3) and mean == pytest.approx((0.1 + 0.3) / 5)
    ok = check_logprob_diff(mean, mx, n, mean_limit=0.1, max_limit=0.5, step=0)
    assert ok == {"rollout/logprob_diff_mean": mean, "rollout/logprob_diff_max": mx}
    with pytest.raises(LogprobMismatchError, match=r"step 8: .*mean \|difference\| 0.08 > rollout.logprob_check_mean=0.01"):
        check_logprob_diff(mean, mx, n, mean_limit=0.01, max_limit=None, step=7)
    with pytest.raises(LogprobMismatchError, match="max .* > rollout.logprob_check_max=0.2"):
        check_logprob_diff(mean, mx, n, mean_limit=None, max_limit=0.2, step=0)
    nothing = LogprobDiff().reduce()
    assert nothing[2] == 0 and check_logprob_diff(*nothing, mean_limit=1e-9, max_limit=1e-9, step=0)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_a_text_policy_gets_past_the_family_check(tiny_text_dir):
    """The vLLM engine serves text policies (tests/integration/test_vllm.py runs them): here, without vLLM, the
    first refusal is the missing install, not the model family."""
    text_policy = load_policy(str(tiny_text_dir), dtype="float32", device="cpu")
    cfg = resolve(["model.name_or_path=tiny:qwen2", "rollout.engine=vllm"]).config
    with pytest.raises(ConfigError, match="vLLM is not installed.*docs/install.md") as err:
        build_engine("vllm", text_policy, EngineSettings.from_config(cfg))
    assert "text-only" not in str(err.value)
