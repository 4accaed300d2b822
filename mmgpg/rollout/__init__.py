"""Rollouts: sampled groups and the β_th collection loop that assembles a step's update batch."""

from mmgpg.rollout.collect import CollectStats, Group, assemble_update, collect_groups

__all__ = ["CollectStats", "Group", "assemble_update", "collect_groups"]
