"""load_trainer_state on a checkpoint written by another number of ranks: refused for a backend with partitioned
state (DeepSpeed), accepted without an RNG state for one with replicated state (plain); the re-derived seeds."""

from __future__ import annotations

import json

import pytest
import torch

from mmgpg.train.checkpoint import checkpoint_world_size, load_trainer_state, resharded_seed, rng_state
from mmgpg.typed import CheckpointError


def _two_rank_checkpoint(root):
    ckpt = root / "step-00000001"
    ckpt.mkdir()
    torch.save({"counters": {"step": 1}, "optimizer": {"state": {}}}, ckpt / "trainer_state.pt")
    for rank in (0, 1):
        torch.save(rng_state(), ckpt / f"rng_rank{rank}.pt")
    (ckpt / "COMPLETE").write_text(json.dumps({"step": 1, "world_size": 2}) + "\n")
    return ckpt


def test_another_count_is_refused_unless_the_state_is_replicated(tmp_path):
    ckpt = _two_rank_checkpoint(tmp_path)  # this process is one rank
    assert checkpoint_world_size(ckpt) == 2
    with pytest.raises(CheckpointError, match="written by 2 ranks; this run has 1. Resume with the same number"):
        load_trainer_state(ckpt)
    state, rng = load_trainer_state(ckpt, any_world_size=True)
    assert state["counters"] == {"step": 1} and rng is None  # the caller re-derives the generators
    (ckpt / "COMPLETE").write_text(json.dumps({"step": 1, "world_size": 1}) + "\n")
    state, rng = load_trainer_state(ckpt, any_world_size=True)
    assert rng is not None and torch.equal(rng["torch"], torch.load(ckpt / "rng_rank0.pt")["torch"])


def test_resharded_seeds_are_distinct_and_deterministic():
    seeds = {resharded_seed(seed, step, rank) for seed in range(3) for step in range(50) for rank in range(8)}
    assert len(seeds) == 3 * 50 * 8
    assert resharded_seed(7, 3, 1) == ((7 * 1_000_003 + 3) * 65_537 + 1) % 2**63
