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


C3, C9 = 0.5 * (1 + math.cos(math.pi / 8)), 0.5 * (1 + math.cos(7 * math.pi / 8))  # cosine at t = 3 and 9 (W=2, T=10)


@pytest.mark.parametrize("name, warmup, min_lr_rate, want", [
    # t:               0    1    2    3           6    9           10       (warmup W, T = 10 slots)
    ("constant", 2, 0.0, [0.0, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0]),  # warmup then flat (HF constant_with_warmup)
    ("constant", 0, 0.0, [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]),
    ("linear", 2, 0.0, [0.0, 0.5, 1.0, 7 / 8, 4 / 8, 1 / 8, 0.0]),  # (T - t) / (T - W)
    ("linear", 0, 0.0, [1.0, 0.9, 0.8, 0.7, 0.4, 0.1, 0.0]),
    ("cosine", 2, 0.0, [0.0, 0.5, 1.0, C3, 0.5, C9, 0.0]),  # ½(1 + cos(π (t - W) / (T - W)))
    ("cosine_with_min_lr", 2, 0.2, [0.0, 0.5, 1.0, 0.2 + 0.8 * C3, 0.6, 0.2 + 0.8 * C9, 0.2]),
])
def test_schedules_at_hand_computed_steps(name, warmup, min_lr_rate, want):
    got = lrs(OptimizerSettings(1.0, lr_scheduler=name, warmup_steps=warmup, total_steps=10, min_lr_rate=min_lr_rate),
              10)
    assert [got[t] for t in (0, 1, 2, 3, 6, 9, 10)] == pytest.approx(want, abs=1e-12)


def test_a_step_with_a_nonfinite_gradient_advances_the_schedule_but_not_the_weights():
    """PlainBackend: linear from 1.0 over 4 slots. A NaN gradient norm skips AdamW (weights unchanged) and the
    schedule still moves to 0.75, as a skipped zero-variance step (advance_schedule) moves it to 0.5."""
    model = torch.nn.Linear(2, 1)
    backend = PlainBackend(resolve(["device=cpu"]).config)
    backend.prepare(model, OptimizerSettings(1.0, lr_scheduler="linear", total_steps=4))
    before = [p.detach().clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = torch.full_like(p, float("nan"))
    result = backend.step()
    assert not result.stepped and math.isnan(result.grad_norm)
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters()))
    assert backend.learning_rate() == pytest.approx(0.75)
    backend.advance_schedule()
    assert backend.learning_rate() == pytest.approx(0.5)
    model(torch.ones(1, 2)).sum().backward()
    assert backend.step().stepped and backend.learning_rate() == pytest.approx(0.25)
    assert not all(torch.equal(b, p) for b, p in zip(before, model.parameters()))


def test_the_run_has_max_steps_times_updates_per_batch_schedule_slots():
    """Every optimizer step of every update takes one slot: 3 steps x 2 updates = 6 (a 6-slot linear schedule)."""
    from types import SimpleNamespace

    from mmgpg.train.trainer import Trainer

    cfg = resolve(["algo=dapo", "train.max_steps=3", "train.lr_scheduler=linear", "train.warmup_steps=1"]).config
    assert cfg.algo.updates_per_batch == 2
    settings = Trainer._optimizer_settings(SimpleNamespace(cfg=cfg))
    assert (settings.total_steps, settings.warmup_steps, settings.lr_scheduler) == (6, 1, "linear")
