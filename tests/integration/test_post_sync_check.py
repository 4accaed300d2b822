"""The post-sync log-prob check as the trainer wires it, without vLLM: an engine registered through
``mmgpg.rollout.ENGINES`` (the real HF engine underneath) returns, as its "sampled log-probs", the trainer's own
log-probs of the sampled tokens plus a known offset — 0.01 on every token and 0.08 on each completion's first — and
takes its limits from ``rollout.logprob_check*`` through :func:`mmgpg.rollout.check.check_limits`, as the vLLM
engine does. So the step's mean |difference| lies strictly between 0.01 and 0.08 and its max is 0.08, and each
configured limit decides on its own: a mean limit of 0.009 stops the step (only the mean can break it), a max limit of
0.05 with a mean limit of 1 stops it (only the max can), both at 0.1 pass. A trainer that drops either limit, or
passes one for the other, fails a case. (The defaults of unset limits are check_limits' doctest.)"""

from __future__ import annotations

import pytest
import torch

from mmgpg.config import ModelConfig, resolve
from mmgpg.rollout import ENGINES
from mmgpg.rollout.check import LogprobMismatchError, check_limits
from mmgpg.rollout.collect import group_logprobs
from mmgpg.rollout.hf import HFEngine
from mmgpg.train.trainer import Trainer

OFFSET, FIRST = 0.01, 0.08


class OffsetEngine(HFEngine):
    """The HF engine, reporting log-probs of its sampled tokens off by a known amount (a stale-weights stand-in)."""

    name = "offset"

    def __init__(self, policy, settings, autocast=None):
        super().__init__(policy, settings)
        self.rollout = settings.rollout
        r = settings.rollout
        self.check_limits = check_limits(r.logprob_check, r.logprob_check_mean, r.logprob_check_max,
                                         engine_dtype="float32", trainer_dtype="float32", autocast=False)

    def generate(self, conversations, group_size, sampling):
        out = super().generate(conversations, group_size, sampling)
        with torch.no_grad():
            exact = group_logprobs(self.policy, out, ModelConfig(dtype="float32"), self.rollout)  # step() runs fp32
        offset = torch.full_like(exact, OFFSET)
        offset[:, 0] = FIRST
        out.sampled_logprobs = (exact + offset) * out.completion_mask
        return out


@pytest.fixture
def offset_engine():
    ENGINES.register("offset", OffsetEngine, replace=True)
    yield
    ENGINES.unregister("offset")


def step(tmp_path, *limits: str) -> dict:
    args = ["model=tiny", "task=shapes_parity", "rollout.engine=offset", "rollout.group_size=2",
            "rollout.max_new_tokens=4", "train.prompts_per_step=2", "train.micro_batch_prompts=2", "train.max_steps=1",
            "train.progress=false", "train.tensorboard=false", "algo.min_valid_fraction=0", "model.dtype=float32",
            f"output_dir={tmp_path / 'run'}", *limits]
    trainer = Trainer(resolve(args))
    trainer.runlog = None
    return trainer.train_step()


def test_the_configured_mean_and_max_limits_are_the_ones_applied(tmp_path, offset_engine):
    metrics = step(tmp_path / "pass", "rollout.logprob_check_mean=0.1", "rollout.logprob_check_max=0.1")
    mean, largest = metrics["rollout/logprob_diff_mean"], metrics["rollout/logprob_diff_max"]
    assert OFFSET + 1e-3 < mean < FIRST - 1e-3 and largest == pytest.approx(FIRST, abs=1e-4)
    with pytest.raises(LogprobMismatchError, match=r"mean \|difference\| .* > rollout.logprob_check_mean=0.009;"
                                                   r" over \d+ completion tokens") as caught:
        step(tmp_path / "mean", "rollout.logprob_check_mean=0.009")  # max unset: only the mean limit can stop it
    assert "logprob_check_max" not in str(caught.value)
    with pytest.raises(LogprobMismatchError, match=r"\(max \|difference\| .* > rollout.logprob_check_max=0.05;") as c2:
        step(tmp_path / "max", "rollout.logprob_check_mean=1", "rollout.logprob_check_max=0.05")
    assert "logprob_check_mean" not in str(c2.value)
