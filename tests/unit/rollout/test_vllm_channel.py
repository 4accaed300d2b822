"""The vLLM server mode's weight channel (mmgpg.rollout.vllm_channel) between two real processes over gloo: what
trainer rank 0 packs and broadcasts is what the server end unpacks, byte for byte, in every dtype; a server end
whose trainer never sends fails within the group's timeout instead of hanging. Needs no vLLM."""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch

from mmgpg.rollout.vllm_channel import ServerEnd, TrainerEnd, nbytes, pack, unpack
from mmgpg.rollout.vllm_core import buckets


def _weights() -> list[tuple[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    return [("embed.weight", torch.randn(37, 5, generator=gen)),
            ("norm.weight", torch.randn(5, generator=gen).to(torch.bfloat16)),  # 10 bytes: the next one is realigned
            ("layers.0.q.weight", torch.randn(3, 7, generator=gen).to(torch.float16)),
            ("step", torch.tensor(7, dtype=torch.int64)),  # a 0-dim tensor
            ("empty", torch.zeros(0, 4)),
            ("mask", torch.tensor([True, False, True]))]


def _server(port: int, timeout_s: float, plan: list, queue) -> None:
    try:
        end = ServerEnd("127.0.0.1", port, timeout_s)
        got = []
        for desc in plan:
            got.extend((n, t.clone()) for n, t in unpack(desc, end.receive(nbytes(desc))))
        queue.put(("ok", got))
    except Exception as err:  # noqa: BLE001 - reported to the test
        queue.put(("error", f"{type(err).__name__}: {err}"))


def test_buckets_broadcast_over_gloo_arrive_exactly():
    weights = _weights()
    plan = [pack(b) for b in buckets(weights, 48)]
    assert len(plan) >= 3, "the test must cut the weights into several buckets"
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    trainer = TrainerEnd("127.0.0.1", timeout_s=120)
    proc = ctx.Process(target=_server, args=(trainer.port, 120, [d for d, _ in plan], queue))
    proc.start()
    try:
        trainer.connect()
        for _, flat in plan:
            trainer.send(flat)
        status, got = queue.get(timeout=300)
    finally:
        proc.join(timeout=60)
    assert status == "ok", got
    assert [n for n, _ in got] == [n for n, _ in weights]
    for (name, want), (_, have) in zip(weights, got):
        assert have.dtype == want.dtype and have.shape == want.shape, name
        assert torch.equal(have, want), name


def test_server_end_without_a_sender_times_out():
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    trainer = TrainerEnd("127.0.0.1", timeout_s=120)
    desc, _ = pack([("w", torch.ones(4))])
    proc = ctx.Process(target=_server, args=(trainer.port, 5, [desc], queue))
    proc.start()
    try:
        trainer.connect()  # the group exists, but the trainer never broadcasts
        status, message = queue.get(timeout=300)
    finally:
        proc.join(timeout=60)
    assert status == "error" and ("timed out" in message.lower() or "timeout" in message.lower()), message


def test_unpack_refuses_a_description_that_does_not_fit():
    desc, flat = pack([("w", torch.ones(4))])
    with pytest.raises(ValueError, match="does not fit the data"):
        unpack([["w", "float32", [5], 0]], flat)
    assert nbytes(desc) == flat.numel() == 16


def test_buckets_are_bounded_and_lazy():
    pulled = []

    def source():
        for i in range(10):
            pulled.append(i)
            yield f"w{i}", torch.zeros(4)  # 16 bytes each

    it = buckets(source(), 40)
    first = next(it)
    assert [n for n, _ in first] == ["w0", "w1"] and pulled == [0, 1, 2], "one tensor past the bucket, no further"
    rest = list(it)
    assert all(sum(t.numel() * 4 for _, t in b) <= 40 for b in rest)
    assert sum(len(b) for b in [first, *rest]) == 10
    with pytest.raises(ValueError, match="vllm_sync_bucket_mb"):
        next(buckets(source(), 0))
