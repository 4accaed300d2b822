"""The vLLM server mode's weight channel (mmgpg.rollout.vllm_channel) between two real processes over gloo: what
trainer rank 0 packs and broadcasts is what the server end unpacks, byte for byte, in every dtype; a server end
whose trainer never sends fails within the group's timeout instead of hanging; and, without a GPU, the parts of the
NCCL and CUDA-IPC transports that need none (the choice of transport, packing on the bucket's device, the IPC handle's
JSON form). Needs no vLLM."""

from __future__ import annotations

import inspect
import multiprocessing as mp

import pytest
import torch

from mmgpg.rollout.vllm_channel import (
    ServerEnd,
    TrainerEnd,
    decode_ipc_args,
    encode_ipc_args,
    ipc_export,
    nbytes,
    pack,
    transport,
    unpack,
)
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


# ---- GPU transports: what can be checked without a GPU (the transfers themselves run in bench/gpu_acceptance.py) --


def test_pack_keeps_the_bucket_on_its_device():
    """A GPU bucket must be packed where it is (no host copy); the meta device stands in for a GPU here: a ``.cpu()``
    inside pack fails on it."""
    bucket = [("a", torch.ones(3, device="meta")), ("b", torch.ones(2, dtype=torch.bfloat16, device="meta"))]
    desc, flat = pack(bucket)
    assert flat.device.type == "meta" and flat.numel() == 20 and desc[1][3] == 16
    desc_cpu, flat_cpu = pack([("a", torch.ones(3)), ("b", torch.ones(2, dtype=torch.bfloat16))], "cpu")
    assert desc_cpu == desc and flat_cpu.device.type == "cpu"


CPU, GPU_A, GPU_B = {"device": "cpu", "gpu_uuid": None}, {"device": "cuda", "gpu_uuid": "GPU-a"}, \
    {"device": "cuda", "gpu_uuid": "GPU-b"}


def test_transport_by_where_the_weights_and_the_server_are():
    assert transport("dist", CPU, CPU) == "gloo"
    assert transport("dist", GPU_A, CPU) == "gloo" and transport("dist", CPU, GPU_A) == "gloo"
    assert transport("dist", GPU_A, GPU_B) == "nccl"
    assert transport("ipc", GPU_A, dict(GPU_A)) == "ipc"
    with pytest.raises(ValueError, match="same GPU .*GPU-a.*rollout.vllm_sync_channel=ipc"):
        transport("dist", GPU_A, dict(GPU_A))  # NCCL refuses two ranks on one device
    for trainer, server in ((GPU_A, GPU_B), (CPU, GPU_A), (GPU_A, CPU), (CPU, CPU)):
        with pytest.raises(ValueError, match="must be on the same GPU"):
            transport("ipc", trainer, server)
    with pytest.raises(ValueError, match="no transport"):
        transport("files", CPU, CPU)


def test_nccl_group_without_cuda_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the NCCL group is built for real in bench/gpu_acceptance.py")
    trainer = TrainerEnd("127.0.0.1", timeout_s=30, backend="nccl")
    with pytest.raises(RuntimeError, match="NCCL weight channel needs CUDA"):
        trainer.connect()


def _ipc_args():
    """A tuple shaped like torch's reduce_tensor(cuda_tensor)[1] (the handles are opaque bytes)."""
    return (torch.Tensor, torch.Size([64]), (1,), 0, torch.TypedStorage, torch.uint8, 3, b"\x00\x01handle\xff",
            64, 512, False, b"refcount\x00", 8, b"\x7fevent", True)


def test_ipc_handle_round_trips_as_json_on_the_receivers_device():
    import json

    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    args = _ipc_args()
    # the field list follows torch's rebuild_cuda_tensor (a torch that changes it fails here, not on a GPU)
    assert len(args) == len(inspect.signature(rebuild_cuda_tensor).parameters)
    wire = json.loads(json.dumps(encode_ipc_args(args)))
    back = decode_ipc_args(wire, device_index=0)
    assert back[6] == 0, "the GPU's index in the receiving process, not the sender's"
    assert back[:6] == args[:6] and back[7:] == args[7:]
    assert wire["tensor_cls"] == "Tensor" and wire["dtype"] == "uint8"


def test_ipc_handle_refuses_what_it_does_not_know():
    wire = encode_ipc_args(_ipc_args())
    with pytest.raises(ValueError, match="names class 'Popen'"):
        decode_ipc_args({**wire, "storage_cls": "Popen"}, 0)
    with pytest.raises(ValueError, match="not a torch dtype"):
        decode_ipc_args({**wire, "dtype": "manual_seed"}, 0)
    with pytest.raises(ValueError, match="lacks handle"):
        decode_ipc_args({k: v for k, v in wire.items() if k != "handle"}, 0)
    with pytest.raises(ValueError, match="15 fields, not 14"):
        encode_ipc_args(_ipc_args()[:-1])
    with pytest.raises(ValueError, match="shares GPU memory"):
        ipc_export(torch.ones(4, dtype=torch.uint8))
