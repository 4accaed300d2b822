"""Rollouts: the engine seam (:mod:`mmgpg.rollout.engine`; engines in their own files, e.g. :mod:`mmgpg.rollout.hf`),
scored groups and the β_th collection loop (:mod:`mmgpg.rollout.collect`)."""

from mmgpg.rollout.collect import Collected, Group, assemble_update, collect_groups, sample_groups, score_group
from mmgpg.rollout.engine import ENGINES, RolloutEngine, Sampling, build_engine

__all__ = ["ENGINES", "Collected", "Group", "RolloutEngine", "Sampling", "assemble_update", "build_engine",
           "collect_groups", "sample_groups", "score_group"]
