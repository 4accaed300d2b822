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
Imports nothing from mmgpg (a bottom module).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import Any


class Registry(Mapping[str, Any]):
    """``name -> implementation`` (loaded on first use). ``kind`` names the part in messages; ``group`` is the
    entry-point group plugins register under."""

    def __init__(self, kind: str, group: str, builtins: dict[str, Any]):
        self.kind, self.group = kind, group
        self._targets: dict[str, Any] = dict(builtins)
        self._loaded: dict[str, Any] = {}
        self._entry_points_read = False

    # ---- registration -------------------------------------------------------------------------------------------

    def register(self, name: str, target: Any, *, replace: bool = False) -> Any:
        """Add ``name`` (``target``: the implementation or ``"module:attribute"``); returns ``target`` so it can be
        used as a decorator helper. Re-registering a name is refused unless ``replace``."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.kind} name must be a non-empty string; got {name!r}")
        self._read_entry_points()
        if name in self._targets and not replace and self._targets[name] is not target:
            raise ValueError(f"{self.kind} {name!r} is already registered ({self._describe(name)}); pick another "
                             "name or pass replace=True")
        self._targets[name] = target
        self._loaded.pop(name, None)
        return target

    def unregister(self, name: str) -> None:
        """Remove ``name`` (a plugin's own, e.g. at the end of a test)."""
        self._targets.pop(name, None)
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

    def _describe(self, name: str) -> str:
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


def _import(target: str) -> Any:
    module, sep, attr = target.partition(":")
    if not sep:
        raise ValueError(f"a registry target must be 'module:attribute'; got {target!r}")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


# ---- the algorithm's parts (mmgpg.algorithms; selected by algo.advantage / token_loss / kl_estimator) --------------

ADVANTAGES = Registry("advantage", "mmgpg.advantages", {
    "group_mean": "mmgpg.algorithms:group_mean_advantages",
    "group_zscore": "mmgpg.algorithms:group_zscore_advantages",
    "group_stabilized": "mmgpg.algorithms:group_stabilized_advantages",
    "rloo": "mmgpg.algorithms:rloo_advantages",
    "reinforce_pp": "mmgpg.algorithms:reinforce_pp_advantages",
    "reinforce_pp_baseline": "mmgpg.algorithms:reinforce_pp_baseline_advantages",
})
TOKEN_LOSSES = Registry("token loss", "mmgpg.token_losses", {
    "reinforce": "mmgpg.algorithms:reinforce_token_loss",
    "clipped_ratio": "mmgpg.algorithms:clipped_ratio_token_loss",
    "cispo": "mmgpg.algorithms:cispo_token_loss",
    "gspo": "mmgpg.algorithms:gspo_sequence_token_loss",
    "gspo_token": "mmgpg.algorithms:gspo_token_level_token_loss",
})
KL_ESTIMATORS = Registry("KL estimator", "mmgpg.kl_estimators", {
    "k1": "mmgpg.algorithms:kl_k1", "k2": "mmgpg.algorithms:kl_k2", "k3": "mmgpg.algorithms:kl_k3",
})
AGGREGATIONS = Registry("aggregation", "mmgpg.aggregations", {
    "token_mean": "mmgpg.algorithms:TOKEN_MEAN",
    "seq_mean_token_mean": "mmgpg.algorithms:SEQ_MEAN_TOKEN_MEAN",
    "constant_length": "mmgpg.algorithms:CONSTANT_LENGTH",
})
