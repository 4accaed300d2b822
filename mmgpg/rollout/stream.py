"""A deterministic, resumable, rank-sharded stream of prompt indices.

Every rank holds the same :class:`PromptStream` state. Epoch ``e`` visits the items in the order
``randperm(n, seed=(seed, e))``; each draw takes the next ``per_rank * world_size`` positions, and rank ``r`` gets the
``r``-th slice of them. The remainder of an epoch that cannot fill a whole draw is skipped. Resampled prompts
(β_th) come from the same stream, so a resumed run sees exactly the prompts the uninterrupted run would have seen.
"""

from __future__ import annotations

import torch


class PromptStream:
    def __init__(self, num_items: int, seed: int, world_size: int = 1, rank: int = 0):
        if num_items < 1:
            raise ValueError("the training split is empty")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world size {world_size}")
        self.num_items, self.seed, self.world_size, self.rank = num_items, seed, world_size, rank
        self.epoch, self.offset, self.draws = 0, 0, 0
        self._perm: list[int] | None = None

    def _permutation(self) -> list[int]:
        if self._perm is None:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
            self._perm = torch.randperm(self.num_items, generator=g).tolist()
        return self._perm

    def next(self, per_rank: int) -> list[int]:
        """The next ``per_rank`` item indices of this rank (all ranks advance together)."""
        total = per_rank * self.world_size
        if total > self.num_items:
            raise ValueError(f"a draw needs {total} prompts ({per_rank} per rank x {self.world_size} ranks) but the "
                             f"split has only {self.num_items}; lower train.prompts_per_step or use a larger split")
        if self.offset + total > self.num_items:
            self.epoch, self.offset, self._perm = self.epoch + 1, 0, None
        perm = self._permutation()
        start = self.offset + self.rank * per_rank
        self.offset += total
        self.draws += 1
        return perm[start : start + per_rank]

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "offset": self.offset, "draws": self.draws, "num_items": self.num_items,
                "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        if state["num_items"] != self.num_items or state["seed"] != self.seed:
            raise ValueError(f"checkpoint's data stream was over {state['num_items']} items with seed {state['seed']}; "
                             f"this run has {self.num_items} items and seed {self.seed} — resume with the same task and seed")
        self.epoch, self.offset, self.draws, self._perm = state["epoch"], state["offset"], state["draws"], None
