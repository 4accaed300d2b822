"""Rollouts: the engine seam (:mod:`.engine`: :class:`~.engine.RolloutEngine`, the :data:`~.engine.ENGINES`
registry, :class:`~.engine.Sampling`), the engines in their own files (:mod:`.hf`, :mod:`.vllm` with
:mod:`.vllm_core` and :mod:`.vllm_server`), scored groups and the β_th collection loop (:mod:`.collect`) and the
post-sync check (:mod:`.check`).

This ``__init__`` imports only the seam (no torch), so reading the engine names stays cheap. May import: the
top-level modules, :mod:`mmgpg.models` and :mod:`mmgpg.task`.
"""

from mmgpg.rollout.engine import ENGINES, CheckLimits, EngineSettings, RolloutEngine, Sampling, build_engine

__all__ = ["ENGINES", "CheckLimits", "EngineSettings", "RolloutEngine", "Sampling", "build_engine"]
