"""The success-amplification diagnostics (Mroueh 2025; docs/theory.md): the pure theory of an objective
(:mod:`.predict`: finite-group weights, fixed points, drift, coverage), per-prompt success probes of a policy
(:mod:`.probe`), and a run's observed success against the prediction (:mod:`.diagnose`, written up by :mod:`.report`).

One-way: training may call the probe (``train.probe_every``); nothing here imports train/ or cli/. May import the
top-level modules, :mod:`mmgpg.models`, :mod:`mmgpg.task`, :mod:`mmgpg.rollout`, :mod:`mmgpg.config`,
:mod:`mmgpg.rundir` and :mod:`mmgpg.evaluation`.
"""
