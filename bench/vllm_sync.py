"""Seconds per GiB of one vLLM weight sync in server mode, both channels side by side, in one run.

Runs in the environment that has vLLM (scripts/vllm-cpu-env.sh on CPU). It builds a small random Qwen2 text model
(``--hidden``/``--layers``; the tiny tokenizer), starts ``mmgpg vllm-serve`` on it, and syncs the model's weights
``--repeats`` times through each channel, alternating (``dist``: trainer rank 0's gloo broadcast, in buckets;
``files``: a safetensors file in /dev/shm that the server reloads, in buckets). A sync is timed from the trainer's
call to the server's reply that the weights are loaded and the caches reset (what ``time/sync`` measures in
training). The first sync of each channel (opening the channel, warm-up) is not timed. After the last sync the
server's log-probs are compared with the trainer's, so a broken channel cannot give a fast number.

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


def serve(model: Path) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "mmgpg", "vllm-serve", "--model", str(model), "--port", "0",
                             "--max-model-len", "512"], stdout=subprocess.PIPE, text=True)
    url = next((line.split()[4] for line in proc.stdout if line.startswith("mmgpg vllm-serve: ready at ")), None)
    if url is None:
        raise SystemExit(f"the server did not start (exit {proc.poll()})")
    return proc, url


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--bucket-mb", type=float, default=256.0)
    ap.add_argument("--out", type=Path, default=None, help="folder for vllm_sync.json")
    args = ap.parse_args()

    import torch

    from mmgpg.config import resolve
    from mmgpg.models.load import load_policy
    from mmgpg.models.save import policy_weights
    from mmgpg.rollout.engine import EngineSettings, Sampling, build_engine

    tmp = Path(tempfile.mkdtemp(prefix="mmgpg_bench_sync_"))
    model = build_model(tmp, args.hidden, args.layers)
    policy = load_policy(str(model), dtype="float32", device="cpu", max_prompt_length=256)
    gib = sum(t.numel() * t.element_size() for _, t in policy_weights(policy.model)) / 2**30
    proc, url = serve(model)
    uptime = {"before": os.getloadavg()}
    try:
        engines = {}
        for channel in ("dist", "files"):
            cfg = resolve([f"model.name_or_path={model}", "model.dtype=float32", "model.max_prompt_length=256",
                           "rollout.engine=vllm", f"rollout.vllm_server={url}", f"rollout.vllm_sync_channel={channel}",
                           f"rollout.vllm_sync_bucket_mb={args.bucket_mb}", "rollout.max_new_tokens=16"]).config
            engines[channel] = build_engine("vllm", policy, EngineSettings.from_config(cfg))  # the untimed first sync (opens the channel)
        seconds: dict[str, list[float]] = {c: [] for c in engines}
        buckets: dict[str, int] = {}
        for _ in range(args.repeats):
            for channel, eng in engines.items():
                t0 = time.perf_counter()
                out = eng.core.reload(weights=policy_weights(policy.model), bucket_bytes=int(args.bucket_mb * 2**20))
                seconds[channel].append(time.perf_counter() - t0)
                buckets[channel] = int(out.get("buckets", 0))
        convs = [[{"role": "user", "content": f"word{k} " * (k + 1)}] for k in range(4)]
        check = {}
        for channel, eng in engines.items():
            eng.sync_weights(policy_weights(policy.model))
            batch = eng.generate(convs, 2, Sampling(16, seed_key=(1,)))
            with torch.no_grad():
                lp = policy.completion_logprobs(batch, temperature=1.0)
            check[channel] = float((lp - batch.sampled_logprobs).abs()[batch.completion_mask].max())
        uptime["after"] = os.getloadavg()
        result = {"model_gib": gib, "hidden": args.hidden, "layers": args.layers, "bucket_mb": args.bucket_mb,
                  "load_average_1_5_15": uptime, "logprob_diff_max_after_sync": check,
                  **{c: {"seconds": s, "median_s": statistics.median(s), "s_per_gib": statistics.median(s) / gib,
                         "buckets": buckets[c]} for c, s in seconds.items()}}
        print(json.dumps(result, indent=1))
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "vllm_sync.json").write_text(json.dumps(result, indent=1) + "\n")
        for eng in engines.values():
            eng.close()
    finally:
        proc.terminate()
        proc.wait(timeout=60)


if __name__ == "__main__":
    main()
