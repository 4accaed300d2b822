"""torch.distributed plumbing: set-up under torchrun, global sums, and the gradient all-reduce.

mmgpg does not wrap the model in DistributedDataParallel. Every loss is already divided by *global* denominators
(counted over all ranks), so the exact gradient of the step is the **sum** of the ranks' gradients; one flattened
all-reduce per bucket of gradients after the local backward passes computes it. This also lets ranks run different numbers of micro-batches
(zero-variance groups are never forwarded) without collective calls inside forward or backward.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def setup(device_type: str) -> DistInfo:
    """Initialise the process group when launched by torchrun (``WORLD_SIZE`` > 1): nccl on GPU, gloo on CPU."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo")
    return DistInfo(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def finish(clean: bool = True) -> None:
    """Tear the process group down at the end of a command. ``clean``: every rank got here, so a barrier first lets
    no rank leave while another still talks to it. A rank that exits with the group alive may abort in the gloo
    threads' destructors ("terminate called without an active exception", SIGABRT after the work was done); after
    an error the barrier is skipped (the other ranks may never reach it)."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    if clean and dist.get_world_size() > 1:
        dist.barrier()
    dist.destroy_process_group()


def current() -> DistInfo:
    if dist.is_available() and dist.is_initialized():
        return DistInfo(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))
    return DistInfo()


def all_sum(values: Iterable[float], device: torch.device | str = "cpu", group: Any = None) -> list[float]:
    """Element-wise sum over ranks of a few numbers (float64); the identity on one process. ``group``: a process
    group of its own (the asynchronous rollout's thread, :mod:`mmgpg.rollout.pipeline`), else the default one."""
    values = list(values)
    if not (dist.is_available() and dist.is_initialized()):
        return [float(v) for v in values]
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
    return t.tolist()


def sum_counts(counts: Mapping[str, float], device: torch.device | str = "cpu") -> dict[str, float]:
    """Named counts summed over ranks (one all-reduce): ``{"num_samples": 8, ...}`` → the same keys, global values."""
    return dict(zip(counts, all_sum(counts.values(), device)))


def max_counts(values: Mapping[str, float], device: torch.device | str = "cpu") -> dict[str, float]:
    """``{name: max over ranks}`` in one collective (every rank passes the same names)."""
    names = sorted(values)
    if not (dist.is_available() and dist.is_initialized()) or not names:
        return {k: float(values[k]) for k in names}
    t = torch.tensor([float(values[k]) for k in names], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return dict(zip(names, t.tolist()))


def all_max(value: float, device: torch.device | str = "cpu") -> float:
    if not (dist.is_available() and dist.is_initialized()):
        return float(value)
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


BUCKET_BYTES = 64 * 2**20  # one all-reduce per ~64 MiB of gradients: the transient copy is one bucket, not the model


def gradient_buckets(params: list[torch.nn.Parameter], bucket_bytes: int = BUCKET_BYTES) -> list[list[torch.Tensor]]:
    """The parameters' gradients in consecutive buckets of at most ``bucket_bytes`` (a larger gradient is a bucket
    of its own), never mixing dtypes or devices. Missing gradients become zeros (a rank may not have touched a
    parameter that another rank did)."""
    buckets: list[list[torch.Tensor]] = []
    current: list[torch.Tensor] = []
    size = 0
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        g = p.grad
        nbytes = g.numel() * g.element_size()
        if current and (size + nbytes > bucket_bytes or g.dtype != current[0].dtype or g.device != current[0].device):
            buckets.append(current)
            current, size = [], 0
        current.append(g)
        size += nbytes
    if current:
        buckets.append(current)
    return buckets


def sum_gradients(params: list[torch.nn.Parameter], bucket_bytes: int = BUCKET_BYTES) -> None:
    """Replace every parameter's gradient by its exact sum over ranks (missing gradients count as zeros), one
    flattened all-reduce per bucket of :func:`gradient_buckets`."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    for bucket in gradient_buckets(params, bucket_bytes):
        if len(bucket) == 1:
            dist.all_reduce(bucket[0], op=dist.ReduceOp.SUM)
            continue
        flat = torch.cat([g.reshape(-1) for g in bucket])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for g in bucket:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj`` (in rank order) on every rank."""
    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank."""
    if not (dist.is_available() and dist.is_initialized()):
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on at ``host`` right now (bound to port 0 and released): for a rendezvous or
    store that this process opens next (another process may take it in between; the callers then fail clearly)."""
    import socket

    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
