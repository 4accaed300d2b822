"""Seconds per GiB of one vLLM weight sync in server mode, every transport side by side, in one run.

Runs in the environment that has vLLM (scripts/vllm-cpu-env.sh on CPU). It builds a small random Qwen2 text model
(``--hidden``/``--layers``; the tiny tokenizer), starts ``mmgpg vllm-serve`` on it and syncs the model's weights
``--repeats`` times through each transport, alternating:

* ``gloo``: trainer rank 0's gloo broadcast, in buckets (``rollout.vllm_sync_channel=dist`` on CPU; on a GPU the
  buckets go through host memory);
* ``nccl``: the NCCL broadcast (``dist`` between two GPUs): the server runs on a second GPU;
* ``ipc``: CUDA IPC handles (``rollout.vllm_sync_channel=ipc``, trainer and server on one GPU);
* ``files``: a safetensors file in /dev/shm that the server reloads, in buckets.

``--device cuda`` puts the trainer's weights on GPU 0 and the server on GPU 0 (and a second server on GPU 1 for
``nccl``); a transport the machine cannot run is a row with ``skipped: <why>`` (``nccl`` on one GPU, ``nccl``/``ipc``
without CUDA), so ``bench/gpu_acceptance.py --dry-run`` runs this on CPU up to where a GPU is needed. A sync is timed
from the trainer's call to the server's reply that the weights are loaded and the caches reset (what ``time/sync``
measures in training); each transport's first sync (opening it, warm-up) is not timed. Then, per transport, the
trainer's weights are changed, synced once more through it, and the server's log-probs are compared with the
trainer's, so a broken transport cannot give a fast number.

    python bench/vllm_sync.py --out bench/results             # the numbers of bench/results/vllm_sync.md
    python bench/vllm_sync.py --hidden 256 --layers 2 --repeats 1  # a quick smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def build_model(out: Path, hidden: int, layers: int) -> Path:
    """A random Qwen2 causal LM of ``layers`` x ``hidden`` (intermediate 2.75 x hidden, head dim 64, 2 KV heads) with
    the tiny text model's tokenizer, saved in float32."""
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from mmgpg.models.tiny import build_and_save

    tiny = build_and_save(out / "tiny", family="qwen2")
    tok = AutoTokenizer.from_pretrained(tiny)
    cfg = Qwen2Config.from_pretrained(tiny)
    cfg.update({"hidden_size": hidden, "intermediate_size": int(2.75 * hidden) // 64 * 64, "num_hidden_layers": layers,
                "num_attention_heads": hidden // 64, "num_key_value_heads": 2, "head_dim": 64,
                "layer_types": ["full_attention"] * layers, "max_window_layers": layers})
    model = Qwen2ForCausalLM(cfg).float()
    path = out / "small"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


TRANSPORTS = ("gloo", "nccl", "ipc", "files")


def serve(model: Path, gpu: int | None = None) -> tuple[subprocess.Popen, str]:
    """``mmgpg vllm-serve`` on ``model`` (on CUDA device ``gpu`` when given, a small share of its memory)."""
    cmd = [sys.executable, "-m", "mmgpg", "vllm-serve", "--model", str(model), "--port", "0", "--max-model-len", "512"]
    env = dict(os.environ)
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
        cmd += ["--gpu-memory-utilization", "0.15"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    url = next((line.split()[4] for line in proc.stdout if line.startswith("mmgpg vllm-serve: ready at ")), None)
    if url is None:
        raise SystemExit(f"the server did not start (exit {proc.poll()})")
    threading.Thread(target=proc.stdout.read, daemon=True).start()  # drain: a full pipe would block the server
    return proc, url


def skip_reason(transport: str, device: str) -> str | None:
    """Why this machine cannot run ``transport`` (None when it can)."""
    import torch

    if transport in ("nccl", "ipc") and device != "cuda":
        return f"skipped: {transport} needs CUDA (--device cuda on a GPU machine)"
    if transport == "nccl" and torch.cuda.device_count() < 2:
        return ("skipped: NCCL needs the server on a second GPU (NCCL cannot put both ranks on one device; "
                f"this machine has {torch.cuda.device_count()})")
    return None


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--bucket-mb", type=float, default=256.0)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the trainer's weights live")
    ap.add_argument("--dtype", default="float32", help="the policy's and the server's dtype")
    ap.add_argument("--transports", default=",".join(TRANSPORTS), help="comma-separated subset of " + ",".join(TRANSPORTS))
    ap.add_argument("--out", type=Path, default=None, help="folder for vllm_sync.json")
    ap.add_argument("--json", type=Path, default=None, help="write the result to this file (bench/gpu_acceptance.py)")
    args = ap.parse_args(argv)

    import torch

    from mmgpg.config import resolve
    from mmgpg.models.load import load_policy
    from mmgpg.models.save import policy_weights
    from mmgpg.rollout.engine import EngineSettings, Sampling, build_engine
    from mmgpg.rollout.vllm_server import ServerClient

    wanted = [t.strip() for t in args.transports.split(",") if t.strip()]
    unknown = sorted(set(wanted) - set(TRANSPORTS))
    if unknown:
        raise SystemExit(f"unknown transport(s) {unknown}; choose from {TRANSPORTS}")
    tmp = Path(tempfile.mkdtemp(prefix="mmgpg_bench_sync_"))
    model = build_model(tmp, args.hidden, args.layers)
    device = "cuda:0" if args.device == "cuda" else "cpu"
    policy = load_policy(str(model), dtype=args.dtype, device=device, max_prompt_length=256)
    gib = sum(t.numel() * t.element_size() for _, t in policy_weights(policy.model)) / 2**30
    skipped = {t: r for t in wanted if (r := skip_reason(t, args.device))}
    runnable = [t for t in wanted if t not in skipped]
    servers = {}
    uptime = {"before": os.getloadavg()}
    result: dict = {"model_gib": gib, "hidden": args.hidden, "layers": args.layers, "bucket_mb": args.bucket_mb,
                    "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu", "dtype": args.dtype,
                    "torch": torch.__version__, **{t: {"status": r} for t, r in skipped.items()}}
    try:
        if runnable:
            servers["main"] = serve(model, 0 if args.device == "cuda" else None)
        if "nccl" in runnable:
            servers["second"] = serve(model, 1)
        url = servers["main"][1] if runnable else ""
        bucket_bytes = int(args.bucket_mb * 2**20)
        cfg = resolve([f"model.name_or_path={model}", f"model.dtype={args.dtype}", "model.max_prompt_length=256",
                       f"device={device}", "rollout.engine=vllm", f"rollout.vllm_server={url}",
                       "rollout.vllm_sync_channel=files", f"rollout.vllm_sync_bucket_mb={args.bucket_mb}",
                       "rollout.max_new_tokens=16"]).config
        eng = build_engine("vllm", policy, EngineSettings.from_config(cfg)) if runnable else None
        clients = {}
        for t in runnable:
            if t == "files":
                clients[t] = eng.core
            else:
                where = servers["second" if t == "nccl" else "main"][1]
                clients[t] = ServerClient(where, timeout=600, channel="ipc" if t == "ipc" else "dist", transport=t)
                clients[t].reload(weights=policy_weights(policy.model), bucket_bytes=bucket_bytes)  # opens it, untimed
        seconds: dict[str, list[float]] = {t: [] for t in clients}
        buckets: dict[str, int] = {}
        for _ in range(args.repeats):
            for t, client in clients.items():
                t0 = time.perf_counter()
                out = client.reload(weights=policy_weights(policy.model), bucket_bytes=bucket_bytes)
                seconds[t].append(time.perf_counter() - t0)
                buckets[t] = int(out.get("buckets", 0))
        convs = [[{"role": "user", "content": f"word{k} " * (k + 1)}] for k in range(4)]
        gen = torch.Generator().manual_seed(0)
        for t, client in clients.items():
            with torch.no_grad():  # new weights, synced through this transport only: a no-op transport shows
                for p in policy.model.parameters():
                    p.add_((0.02 * torch.randn(p.shape, generator=gen)).to(p.device, p.dtype))
            client.reload(weights=policy_weights(policy.model), bucket_bytes=bucket_bytes)
            eng.core = client
            batch = eng.generate(convs, 2, Sampling(16, seed_key=(1,)))
            with torch.no_grad():
                lp = policy.completion_logprobs(batch, temperature=1.0)
            diff = float((lp - batch.sampled_logprobs.to(lp.device)).abs()[batch.completion_mask.to(lp.device)].max())
            med = statistics.median(seconds[t])
            result[t] = {"status": "ok", "seconds": seconds[t], "median_s": med, "s_per_gib": med / gib,
                         "buckets": buckets[t], "logprob_diff_max_after_sync": diff}
        uptime["after"] = os.getloadavg()
        result["load_average_1_5_15"] = uptime
        print(json.dumps(result, indent=1))
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "vllm_sync.json").write_text(json.dumps(result, indent=1) + "\n")
        if args.json:
            args.json.write_text(json.dumps(result, indent=1) + "\n")
        for client in clients.values():
            client.close()
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(timeout=60)
    return result


if __name__ == "__main__":
    main()
