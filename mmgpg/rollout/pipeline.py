"""Rollouts that overlap the update (``rollout.max_staleness = K`` ≥ 1): a thread samples the batches of the next
steps with the rollout engine while the trainer updates on the current one.

**Schedule.** The batch of step ``b`` (0-based) is sampled with the weights of version ``v(b) = max(start, b − K)``
(version = optimizer steps the weights have taken; ``start`` = the step the run started or resumed at), so every
trained group is at most K versions old and no group is dropped for being slow: staleness is bounded by admission.
With K = 1 this is one-step-off-policy training: while step b updates, the engine samples batch b + 1 with the
weights of step b. The engine never samples while its weights change: before the sync to version ``v`` the trainer
waits until every batch that uses version ``v − 1`` is sampled (:meth:`AsyncRollout.before_sync`), and the thread
starts a batch only once its version is synced. So which weights sampled which batch does not depend on timing, and
the per-request seeds of vLLM make an asynchronous run repeatable.

**Data cursor.** The thread draws the prompts of batch ``b`` (β_th resampling included: the same producer) from the
run's stream before the trainer reaches step ``b``. A checkpoint after step ``s`` stores the stream position from
before batch ``s`` drew (:meth:`AsyncRollout.cursor`), so a resumed run samples the batches that were in flight again,
from the same prompts, with the checkpoint's weights: no prompt is repeated or skipped, and those K batches are
sampled by newer weights than in the uninterrupted run (the trainer says so when it resumes).

**Ranks.** Each rank runs its own thread; the β_th stopping rule's sum over ranks runs on a process group of its own,
so it never interleaves with the update's collectives; the trainer's ranks meet in a barrier before each sync.

Partial rollouts (interrupting a generation at a weight update and continuing it with the new weights) are not built.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from mmgpg.rollout.collect import Collected
from mmgpg.rollout.producer import RolloutProducer


def weights_version(step: int, *, staleness: int, start: int) -> int:
    """The weights version that samples the batch of ``step``: ``max(start, step − staleness)``.

    K = 1 from step 0: steps 0, 1, 2, 3 → versions 0, 0, 1, 2; resumed at step 5: 5, 5, 5, 6 for steps 5..8 with K = 2.

    >>> [weights_version(b, staleness=1, start=0) for b in range(4)], [weights_version(b, staleness=2, start=5) for b in range(5, 9)]
    ([0, 0, 1, 2], [5, 5, 5, 6])
    """
    return max(start, step - staleness)


@dataclass
class _Cursor:
    """A stream position as the checkpoint stores it (``state_dict`` like :class:`~mmgpg.rollout.stream.PromptStream`)."""

    state: dict

    def state_dict(self) -> dict:
        return dict(self.state)


class AsyncRollout:
    """The thread that samples ahead (module docstring). ``last``: the step count of the run (no batch at or beyond
    it is sampled). Use :meth:`start`, then per step :meth:`take`, :meth:`before_sync` / :meth:`synced` around the
    weight sync, and :meth:`close` at the end."""

    def __init__(self, producer: RolloutProducer, *, staleness: int, start: int, last: int, group: Any = None):
        if staleness < 1:
            raise ValueError(f"AsyncRollout needs max_staleness >= 1; got {staleness} (0 is the synchronous loop)")
        self.producer, self.staleness, self.first, self.last = producer, staleness, start, last
        producer.group = group
        self._cond = threading.Condition()
        self._version = start  # the engine's weights version: the last sync's
        self._ready: dict[int, Collected] = {}
        self._cursors: dict[int, dict] = {}
        self._done = start  # batches [start, _done) are sampled
        self._error: tuple[int, BaseException] | None = None
        self._stop = False
        self._engine_wait = 0.0  # seconds the thread waited for a sync since the last take()
        self._thread = threading.Thread(target=self._run, name="mmgpg-rollout", daemon=True)

    @classmethod
    def for_run(cls, producer: RolloutProducer, *, staleness: int, start: int, last: int,
                distributed_run: bool) -> AsyncRollout:
        """The pipeline of a training run (collective under torchrun: the thread's β_th sums get a gloo process
        group of their own, created on every rank)."""
        group = None
        if distributed_run:
            import torch.distributed as dist

            group = dist.new_group(backend="gloo")
        return cls(producer, staleness=staleness, start=start, last=last, group=group)

    def version(self, step: int) -> int:
        return weights_version(step, staleness=self.staleness, start=self.first)

    def start(self) -> None:
        self._thread.start()

    # ---- the thread ---------------------------------------------------------------------------------------------

    def _run(self) -> None:
        step = self.first
        try:
            for step in range(self.first, self.last):
                t0 = time.perf_counter()
                need = self.version(step)
                with self._cond:
                    self._cond.wait_for(lambda need=need: self._stop or self._version >= need)
                    if self._stop:
                        return
                    self._engine_wait += time.perf_counter() - t0
                    self._cursors[step] = self.producer.stream.state_dict()  # before this batch draws
                collected = self.producer.next_batch(step, policy_version=need)
                with self._cond:
                    self._ready[step] = collected
                    self._done = step + 1
                    self._cond.notify_all()
        except BaseException as err:  # handed to the trainer, which raises it naming the step
            with self._cond:
                self._error = (step, err)
                self._cond.notify_all()

    # ---- the trainer's side -------------------------------------------------------------------------------------

    def _raise(self) -> None:
        step, err = self._error
        message = (f"step {step + 1}: its rollout, sampled ahead of the update (rollout.max_staleness="
                   f"{self.staleness}), failed: {err}. The run resumes from its last checkpoint (train.resume=true).")
        try:
            raise type(err)(message) from err
        except TypeError:  # an exception class that takes other arguments
            raise RuntimeError(message) from err

    def take(self, step: int) -> tuple[Collected, dict[str, float]]:
        """The batch of ``step`` (waiting for the thread if needed) and the overlap's timings: ``time/wait_rollout``
        (the trainer waited for this batch) and ``time/wait_sync`` (the engine waited for weights since the last
        batch was taken)."""
        t0 = time.perf_counter()
        with self._cond:
            self._cond.wait_for(lambda: step in self._ready or self._error is not None)
            if step not in self._ready:
                self._raise()
            collected = self._ready.pop(step)
            engine_wait, self._engine_wait = self._engine_wait, 0.0
            for old in [k for k in self._cursors if k < step]:
                del self._cursors[old]
        return collected, {"time/wait_rollout": time.perf_counter() - t0, "time/wait_sync": engine_wait}

    def before_sync(self, version: int) -> float:
        """Wait until every batch sampled with version ``version − 1`` is done (the engine must not sample while its
        weights change); returns the seconds waited."""
        need = min(self.last, version + self.staleness)  # batches b with v(b) <= version - 1: b < version + K
        t0 = time.perf_counter()
        with self._cond:
            self._cond.wait_for(lambda: self._done >= need or self._error is not None)
            if self._done < need:
                self._raise()
        return time.perf_counter() - t0

    def synced(self, version: int) -> None:
        """The engine now holds weights ``version``: batches that wait for it may start."""
        with self._cond:
            self._version = version
            self._cond.notify_all()

    def cursor(self, step: int) -> _Cursor:
        """The stream position from before the batch of ``step`` drew its prompts (the current one if the thread
        has not started that batch): what a checkpoint taken before ``step`` trains stores."""
        with self._cond:
            return _Cursor(self._cursors.get(step, self.producer.stream.state_dict()))

    def close(self, timeout: float = 10.0) -> None:
        """Stop the thread: it starts no new batch. A generation in progress is not interrupted; after ``timeout``
        seconds the run goes on without it (a daemon thread: it ends with the process, and the batch was never
        trained, so a resume samples it again)."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)


def staleness_metrics(groups: list, step: int, comm_device: Any = "cpu") -> dict[str, float]:
    """``rollout/staleness_mean|max`` of the update's ``groups`` over all ranks (collective): the versions between the
    weights that sampled a group (``policy_version``) and the weights of ``step``, which it trains."""
    from mmgpg import distributed

    ages = [step - g.policy_version for g in groups]
    total, n = distributed.all_sum([sum(ages), len(ages)], comm_device)
    most = distributed.all_max(max(ages, default=0), comm_device)
    return {"rollout/staleness_mean": total / n if n else 0.0, "rollout/staleness_max": most}
