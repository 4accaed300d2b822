"""Registries: the one list of names for each kind of plug-in part (rollout engines, training backends, the
algorithm's advantages, token losses, KL estimators and aggregations).

A registry maps a name to its implementation: an object, or a ``"module:attribute"`` string imported only when the
name is used (so reading the names — config validation, ``--help`` — imports nothing heavy). Three ways in:

* the built-in names: the engines' in :mod:`mmgpg.rollout.engine`, the backends' in :mod:`mmgpg.backends`, and the
  algorithm parts' at the end of this module (their implementations are in :mod:`mmgpg.algorithms`, which imports
  torch: keeping the names here lets config validation and ``mmgpg config show`` run without it);
* :meth:`Registry.register` from code (a plugin module, a test): ``ENGINES.register("mine", "pkg.mod:MyEngine")``;
* an entry point in the registry's group, read once when the names are first needed, e.g. in a plugin's
  ``pyproject.toml``: ``[project.entry-points."mmgpg.engines"] mine = "pkg.mod:MyEngine"``.

A name is registered once: a second registration under the same name is an error unless ``replace=True``.

What the rest of mmgpg needs to know about a registered name, without importing its implementation, is declared
with it as *facts* (:class:`Entry`, :meth:`Registry.facts`): e.g. that a token loss has an importance ratio, that an
advantage whitens with the batch's statistics, a backend's config check. A name registered without facts has none
(every reader has a default). Imports nothing from mmgpg (a bottom module).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Entry:
    """A registered implementation (an object or ``"module:attribute"``) with its facts."""

    target: Any
    facts: Mapping[str, Any] = field(default_factory=dict)


class Registry(Mapping[str, Any]):
    """``name -> implementation`` (loaded on first use). ``kind`` names the part in messages; ``group`` is the
    entry-point group plugins register under."""

    def __init__(self, kind: str, group: str, builtins: dict[str, Any]):
        self.kind, self.group = kind, group
        self._targets: dict[str, Any] = {k: v.target if isinstance(v, Entry) else v for k, v in builtins.items()}
        self._facts: dict[str, Mapping[str, Any]] = {k: v.facts for k, v in builtins.items() if isinstance(v, Entry)}
        self._loaded: dict[str, Any] = {}
        self._entry_points_read = False

    # ---- registration -------------------------------------------------------------------------------------------

    def register(self, name: str, target: Any, *, replace: bool = False, facts: Mapping[str, Any] | None = None) -> Any:
        """Add ``name`` (``target``: the implementation or ``"module:attribute"``; ``facts``: what readers need to
        know about it, :meth:`facts`); returns ``target`` so it can be used as a decorator helper. Re-registering a
        name is refused unless ``replace``; a replacement without ``facts`` keeps the facts declared before (the
        checks read them: a spy around ``clipped_ratio`` is still a loss with a ratio)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.kind} name must be a non-empty string; got {name!r}")
        self._read_entry_points()
        if name in self._targets and not replace and self._targets[name] is not target:
            raise ValueError(f"{self.kind} {name!r} is already registered ({self.describe(name)}); pick another "
                             "name or pass replace=True")
        self._targets[name] = target
        if facts is not None or not replace:
            self._facts[name] = dict(facts or {})
        self._loaded.pop(name, None)
        return target

    def unregister(self, name: str) -> None:
        """Remove ``name`` (a plugin's own, e.g. at the end of a test)."""
        self._targets.pop(name, None)
        self._facts.pop(name, None)
        self._loaded.pop(name, None)

    # ---- lookup ---------------------------------------------------------------------------------------------------

    def __getitem__(self, name: str) -> Any:
        self._read_entry_points()
        if name not in self._targets:
            raise KeyError(f"unknown {self.kind} {name!r}; available: {', '.join(sorted(self._targets))}")
        if name not in self._loaded:
            target = self._targets[name]
            self._loaded[name] = _import(target) if isinstance(target, str) else target
        return self._loaded[name]

    def __iter__(self) -> Iterator[str]:
        self._read_entry_points()
        return iter(list(self._targets))

    def __len__(self) -> int:
        self._read_entry_points()
        return len(self._targets)

    def __contains__(self, name: object) -> bool:
        self._read_entry_points()
        return name in self._targets

    def facts(self, name: str) -> Mapping[str, Any]:
        """What was declared about ``name`` (empty when nothing was), without importing its implementation."""
        if name not in self:
            raise KeyError(f"unknown {self.kind} {name!r}; available: {', '.join(sorted(self._targets))}")
        return self._facts.get(name, {})

    def describe(self, name: str) -> str:
        """Where ``name``'s implementation is (``"module:attribute"``), without importing it."""
        self._read_entry_points()
        target = self._targets[name]
        return target if isinstance(target, str) else f"{getattr(target, '__module__', '?')}:" \
                                                       f"{getattr(target, '__qualname__', type(target).__name__)}"

    def _read_entry_points(self) -> None:
        if self._entry_points_read:
            return
        self._entry_points_read = True
        from importlib.metadata import entry_points

        for ep in entry_points(group=self.group):
            self._targets.setdefault(ep.name, ep.value)  # a built-in name is never replaced by an entry point


def load_target(target: str) -> Any:
    """The object a ``"module:attribute"`` string names (the attribute may be dotted), imported now."""
    return _import(target)


def _import(target: str) -> Any:
    module, sep, attr = target.partition(":")
    if not sep:
        raise ValueError(f"a registry target must be 'module:attribute'; got {target!r}")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


# ---- the algorithm's parts (mmgpg.algorithms; selected by algo.advantage / token_loss / kl_estimator) --------------

# Facts: `batch_whitened` — the advantage whitens with the statistics of the whole batch, so zero-variance groups carry
# gradient too (config checks refuse α with it).
ADVANTAGES = Registry("advantage", "mmgpg.advantages", {
    "group_mean": "mmgpg.algorithms:group_mean_advantages",
    "group_zscore": "mmgpg.algorithms:group_zscore_advantages",
    "group_stabilized": "mmgpg.algorithms:group_stabilized_advantages",
    "rloo": "mmgpg.algorithms:rloo_advantages",
    "reinforce_pp": Entry("mmgpg.algorithms:reinforce_pp_advantages", {"batch_whitened": True}),
    "reinforce_pp_baseline": Entry("mmgpg.algorithms:reinforce_pp_baseline_advantages", {"batch_whitened": True}),
})
# Facts: `ratio` — what its importance ratio to the sampling policy is called (a loss with none has no `ratio`);
# `on_policy_only` — no ratio at all, so a second update on the same samples would be uncorrected; `offpolicy_only`
# — its ratio and clip only act with two or more updates per batch.
TOKEN_LOSSES = Registry("token loss", "mmgpg.token_losses", {
    "reinforce": Entry("mmgpg.algorithms:reinforce_token_loss", {"on_policy_only": True}),
    "clipped_ratio": Entry("mmgpg.algorithms:clipped_ratio_token_loss", {"ratio": "clipped ratio"}),
    "cispo": Entry("mmgpg.algorithms:cispo_token_loss", {"ratio": "CISPO weight", "offpolicy_only": True}),
    "gspo": Entry("mmgpg.algorithms:gspo_sequence_token_loss", {"ratio": "GSPO ratio", "offpolicy_only": True}),
    "gspo_token": Entry("mmgpg.algorithms:gspo_token_level_token_loss",
                        {"ratio": "GSPO-token ratio", "offpolicy_only": True}),
})
# Facts: `level` — what one importance weight covers (a token, or a whole sequence), for the rollout_is/* metrics.
ROLLOUT_CORRECTIONS = Registry("rollout correction", "mmgpg.rollout_corrections", {
    "none": Entry("mmgpg.correction:no_rollout_correction", {"level": "token"}),
    "token_tis": Entry("mmgpg.correction:token_tis_weights", {"level": "token"}),
    "seq_tis": Entry("mmgpg.correction:seq_tis_weights", {"level": "sequence"}),
    "seq_mis": Entry("mmgpg.correction:seq_mis_weights", {"level": "sequence"}),
})
KL_ESTIMATORS = Registry("KL estimator", "mmgpg.kl_estimators", {
    "k1": "mmgpg.algorithms:kl_k1", "k2": "mmgpg.algorithms:kl_k2", "k3": "mmgpg.algorithms:kl_k3",
})
AGGREGATIONS = Registry("aggregation", "mmgpg.aggregations", {
    "token_mean": "mmgpg.algorithms:TOKEN_MEAN",
    "seq_mean_token_mean": "mmgpg.algorithms:SEQ_MEAN_TOKEN_MEAN",
    "constant_length": "mmgpg.algorithms:CONSTANT_LENGTH",
})
