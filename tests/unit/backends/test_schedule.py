"""The learning-rate schedules both backends build (mmgpg.backends.build_scheduler), with hand-computed values, and
the config checks of train.min_lr_rate."""

from __future__ import annotations

import math

import pytest
import torch

from mmgpg.backends import OptimizerSettings, build_scheduler
from mmgpg.backends.plain import PlainBackend
from mmgpg.config import ConfigError, resolve


def lrs(settings: OptimizerSettings, steps: int) -> list[float]:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=settings.learning_rate)
    sched = build_scheduler(opt, settings)
    out = []
    for _ in range(steps + 1):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def test_cosine_with_min_lr_is_open_rs_schedule():
    """Warmup 10 of 100 steps, floor 0.1 (open-rs: lr_scheduler_type cosine_with_min_lr, min_lr_rate 0.1):
    lr(t) = lr0 * (0.1 + 0.9 * 0.5 * (1 + cos(pi * (t - 10) / 90))) after the warmup; by hand, step 55 (halfway)
    is 0.1 + 0.9 * 0.5 = 0.55, step 100 is 0.1, step 5 (warmup) is 0.5."""
    got = lrs(OptimizerSettings(1.0, lr_scheduler="cosine_with_min_lr", warmup_steps=10, total_steps=100,
                                min_lr_rate=0.1), 100)
    assert got[5] == pytest.approx(0.5) and got[10] == pytest.approx(1.0)
    assert got[55] == pytest.approx(0.55) and got[100] == pytest.approx(0.1)
    assert got[32] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 22 / 90)))
    # plain cosine goes to 0 instead
    assert lrs(OptimizerSettings(1.0, lr_scheduler="cosine", warmup_steps=10, total_steps=100), 100)[100] == \
        pytest.approx(0.0, abs=1e-12)


def test_plain_backend_uses_the_floor():
    model = torch.nn.Linear(2, 1)
    backend = PlainBackend(resolve(["device=cpu"]).config)
    backend.prepare(model, OptimizerSettings(2.0, lr_scheduler="cosine_with_min_lr", total_steps=4, min_lr_rate=0.25))
    for _ in range(4):
        backend.scheduler.step()
    assert backend.optimizer.param_groups[0]["lr"] == pytest.approx(0.5)  # 2.0 * 0.25


@pytest.mark.parametrize("overrides, problem", [
    (["train.lr_scheduler=cosine_with_min_lr", "train.min_lr_rate=1.5"], "in [0, 1)"),
    (["train.lr_scheduler=linear", "train.min_lr_rate=0.1"], "cosine_with_min_lr only"),
])
def test_min_lr_rate_misuse_is_a_config_error(overrides, problem):
    with pytest.raises(ConfigError, match=r"train\.min_lr_rate") as err:
        resolve(overrides)
    assert problem in str(err.value)
