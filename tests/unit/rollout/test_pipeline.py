"""rollout.max_staleness: the sampling thread's schedule (mmgpg.rollout.pipeline.AsyncRollout) against a scripted
producer that plays the engine: it records which weights version the engine held while each batch was sampled, and
fails if a sync ran during a generation. The trainer side is played by the loop the trainer runs (take, update,
before_sync, sync, synced). The end-to-end run with the vLLM server is in tests/integration/test_vllm.py."""

from __future__ import annotations

import threading
import time

import pytest

from mmgpg.config import resolve
from mmgpg.rollout.pipeline import AsyncRollout, staleness_metrics, weights_version
from mmgpg.rollout.stream import PromptStream
from mmgpg.typed import ConfigError


class ScriptedEngine:
    """Weights version and a flag while a sync runs."""

    def __init__(self, version: int):
        self.version, self.syncing, self.lock = version, False, threading.Lock()


class Batch:
    def __init__(self, step, version, indices):
        self.step, self.version, self.indices = step, version, indices


class ScriptedProducer:
    """``next_batch``: draws prompts from a real stream, 'generates' for ``seconds`` (longer for ``slow`` steps)
    and checks that the engine held the stamped version all along and never synced meanwhile."""

    def __init__(self, engine: ScriptedEngine, seconds=0.02, slow=(), fail_at=None):
        self.engine, self.seconds, self.slow, self.fail_at = engine, seconds, set(slow), fail_at
        self.stream = PromptStream(50, seed=3)
        self.group = None
        self.problems: list[str] = []

    def next_batch(self, step: int, policy_version: int) -> Batch:
        if step == self.fail_at:
            raise ConnectionError("the vLLM server at http://127.0.0.1:1 died")
        indices = self.stream.next(2)
        start = (self.engine.version, self.engine.syncing)
        time.sleep(self.seconds * (20 if step in self.slow else 1))
        end = (self.engine.version, self.engine.syncing)
        if start != (policy_version, False) or end != (policy_version, False):
            self.problems.append(f"batch {step} stamped {policy_version}: engine {start} -> {end}")
        return Batch(step, policy_version, indices)


def run_trainer(pipe: AsyncRollout, engine: ScriptedEngine, start: int, last: int, update_s=0.02):
    """The trainer's loop: take batch s, update, sync version s + 1."""
    taken, waits = [], []
    for s in range(start, last):
        batch, timing = pipe.take(s)
        taken.append(batch)
        waits.append(timing["time/wait_rollout"])
        time.sleep(update_s)  # the update
        waits[-1] += pipe.before_sync(s + 1)  # the trainer counts this in time/wait_rollout too
        engine.syncing = True
        time.sleep(0.01)
        engine.version = s + 1
        engine.syncing = False
        pipe.synced(s + 1)
    return taken, waits


@pytest.mark.parametrize("k,start", [(1, 0), (2, 0), (2, 3)])
def test_every_batch_is_sampled_by_the_scheduled_weights_and_never_during_a_sync(k, start):
    engine = ScriptedEngine(start)
    producer = ScriptedProducer(engine)
    pipe = AsyncRollout(producer, staleness=k, start=start, last=start + 7)
    pipe.start()
    try:
        taken, _ = run_trainer(pipe, engine, start, start + 7)
    finally:
        pipe.close()
    assert not producer.problems, producer.problems
    assert [b.step for b in taken] == list(range(start, start + 7))  # oldest first, none dropped
    assert [b.version for b in taken] == [max(start, s - k) for s in range(start, start + 7)]
    assert max(s - b.version for s, b in zip(range(start, start + 7), taken)) == k


def test_a_slow_batch_is_waited_for_not_dropped_and_never_older_than_k():
    engine = ScriptedEngine(0)
    producer = ScriptedProducer(engine, slow={3})  # batch 3 takes 20x as long
    pipe = AsyncRollout(producer, staleness=1, start=0, last=6)
    pipe.start()
    try:
        taken, waits = run_trainer(pipe, engine, 0, 6)
    finally:
        pipe.close()
    assert not producer.problems, producer.problems
    assert [b.step for b in taken] == list(range(6))
    assert all(s - b.version <= 1 for s, b in enumerate(taken))
    # the trainer waited for it (time/wait_rollout) before step 2's sync: batch 3 uses step 2's weights, which the
    # sync must not change while it is sampled; it trained on nothing else meanwhile
    assert waits[2] > 0.1


def test_the_checkpoint_cursor_resamples_exactly_the_batches_in_flight():
    """After step s the checkpoint stores the stream position from before batch s drew: a fresh stream loaded from
    it draws batch s's prompts, then s + 1's — nothing repeated, nothing skipped."""
    engine = ScriptedEngine(0)
    producer = ScriptedProducer(engine)
    pipe = AsyncRollout(producer, staleness=2, start=0, last=8)
    pipe.start()
    try:
        taken, _ = run_trainer(pipe, engine, 0, 3)  # three steps trained; batches 3 and 4 are sampled or in flight
        time.sleep(0.1)
        cursor = pipe.cursor(3).state_dict()
        # batches 3 and 4 were sampled before step 3's sync: the stream is past batch 3, the cursor is its record
        assert cursor != producer.stream.state_dict()
        rest = [pipe.take(s)[0] for s in (3, 4)]
    finally:
        pipe.close()
    resumed = PromptStream(50, seed=3)
    resumed.load_state_dict(cursor)
    assert [resumed.next(2), resumed.next(2)] == [b.indices for b in rest]


def test_a_failed_rollout_is_an_error_naming_the_step():
    engine = ScriptedEngine(0)
    pipe = AsyncRollout(ScriptedProducer(engine, fail_at=2), staleness=1, start=0, last=5)
    pipe.start()
    try:
        with pytest.raises(ConnectionError, match=r"step 3: .*max_staleness=1.*died.*train.resume=true"):
            run_trainer(pipe, engine, 0, 5)
    finally:
        pipe.close()


def test_schedule_and_staleness_by_hand():
    assert [weights_version(b, staleness=1, start=0) for b in range(4)] == [0, 0, 1, 2]

    class G:
        def __init__(self, v):
            self.policy_version = v

    assert staleness_metrics([G(3), G(4), G(4)], 5) == {"rollout/staleness_mean": pytest.approx(4 / 3),
                                                        "rollout/staleness_max": 2}
    with pytest.raises(ValueError, match="max_staleness >= 1"):
        AsyncRollout(ScriptedProducer(ScriptedEngine(0)), staleness=0, start=0, last=3)


@pytest.mark.parametrize("overrides,key", [
    (["rollout.max_staleness=1"], "rollout.max_staleness"),  # the HF engine samples with the weights being updated
    (["rollout.max_staleness=1", "rollout.engine=vllm"], "rollout.max_staleness"),  # colocated vLLM: same process
    (["rollout.max_staleness=1", "rollout.engine=vllm", "rollout.vllm_server=http://127.0.0.1:8765",
      "rollout.vllm_sleep=true"], "rollout.vllm_sleep"),
    (["rollout.max_staleness=-1"], "rollout.max_staleness"),
])
def test_config_refuses_what_cannot_overlap(overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        resolve(overrides)
    if key == "rollout.max_staleness" and "rollout.engine=vllm" in overrides:
        ok = [*overrides, "rollout.vllm_server=http://127.0.0.1:8765"]
        assert resolve(ok).config.rollout.max_staleness == 1
