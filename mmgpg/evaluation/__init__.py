"""Evaluation: generate with a rollout engine and judge with the task's judge (:mod:`.run`), re-judge existing
outputs (``mmgpg eval --predictions``), and the pre-flight check of a task with a model (:mod:`.preflight`,
``mmgpg check``). Used by ``mmgpg eval`` and by training's periodic evaluations alike.

May import: the top-level modules, :mod:`mmgpg.models`, :mod:`mmgpg.task`, :mod:`mmgpg.rollout`,
:mod:`mmgpg.backends`, :mod:`mmgpg.config` and :mod:`mmgpg.rundir` (not train/, theory/ or cli/).
"""
