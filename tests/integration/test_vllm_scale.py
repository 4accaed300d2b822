"""vLLM in the combinations (real vLLM on CPU, tiny text models, float32): DeepSpeed ZeRO-2/3 on two gloo ranks with
one colocated vLLM per rank, GRPO's partitioned reference beside it, and the server mode's weight channels (a
torch.distributed broadcast from trainer rank 0, or a file) in buckets.

Run in the environment scripts/vllm-cpu-env.sh builds (it has DeepSpeed too):
``VENV/bin/python -m pytest tests/integration/test_vllm_scale.py``; elsewhere skipped. Tolerances as in test_vllm.py
(float32 on CPU: ≤ 5e-4 per token, ≤ 5e-5 on the mean).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

if os.environ.get("MMGPG_REQUIRE_VLLM"):  # CI's vLLM environment: a broken vLLM must fail, not skip
    import vllm  # noqa: F401
else:
    pytest.importorskip("vllm", reason="vLLM is not installed here; run in the env scripts/vllm-cpu-env.sh builds")

from support import FIXTURE_TASKS, REPO, run_mmgpg, start_vllm_server

from mmgpg.config import resolve  # noqa: E402
from mmgpg.models.load import load_policy  # noqa: E402
from mmgpg.models.save import policy_weights  # noqa: E402
from mmgpg.rollout.engine import EngineSettings, Sampling, build_engine  # noqa: E402

TOKEN_TOL, MEAN_TOL = 5e-4, 5e-5
TEXT_MODEL = ["model.name_or_path=tiny:qwen2", "model.dtype=float32", "model.max_prompt_length=1024"]
# 0.25 MiB buckets: the tiny model's 2.9 MiB go in ~12 loads per sync, fused layers (q/k/v, gate/up) cut across them
TRAIN = [*TEXT_MODEL, f"task={FIXTURE_TASKS}:TextParity", "rollout.engine=vllm", "rollout.group_size=4",
         "rollout.max_new_tokens=12", "train.prompts_per_step=4", "train.micro_batch_prompts=1",
         "train.learning_rate=1e-3", "train.progress=false", "train.tensorboard=false", "train.max_steps=2",
         "rollout.vllm_sync_bucket_mb=0.25"]
BACKENDS = {"plain": ["train.backend=plain"], "zero2": ["train.backend=deepspeed", "train.zero_stage=2"],
            "zero3": ["train.backend=deepspeed", "train.zero_stage=3"]}
ADAPTERS = {"full": ["model.lora.rank=0"], "lora": ["model.lora.rank=4"]}
CELLS = [f"{b}-{a}-{g}" for b in BACKENDS for a in ADAPTERS for g in ("gpg", "grpo")]
"""The vLLM rows of docs/distributed.md's combination table name these ids (``<backend>-<adapter>-<algo>``)."""
IN_CI = {"zero3-full-grpo", "zero3-lora-gpg"}
"""The cells CI runs: ZeRO-3's gathered sync with a partitioned reference beside it and LoRA merged under ZeRO-3
(each 2-rank launch with two vLLM engines costs about a minute on 2 CPU cores; the others run with ``--runslow``)."""


def _steps(run) -> list[dict]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [m for m in rows if "rollout/logprob_diff_max" in m]


def _cell(cell: str):
    return pytest.param(*cell.split("-"), id=cell, marks=[] if cell in IN_CI else [pytest.mark.slow])


@pytest.mark.parametrize(("backend", "adapter", "algo"), [_cell(c) for c in CELLS])
def test_vllm_cell(tmp_path, backend, adapter, algo):
    """`torchrun --nproc_per_node 2 mmgpg train rollout.engine=vllm` with each backend x adapter x algorithm: each
    rank's vLLM starts from and is synced with the backend's full weights (ZeRO-3: gathered, the module's own tensors
    being empty placeholders; LoRA: merged), bucketed; step 2 is sampled after the first update + sync, and the
    post-sync check (on, 1e-3 mean) holds on both steps. GRPO adds the reference (partitioned under ZeRO-3; the
    policy with its adapter off under LoRA)."""
    run = tmp_path / "run"
    run_mmgpg("train", *TRAIN, *BACKENDS[backend], *ADAPTERS[adapter], f"algo={algo}", f"output_dir={run}", ranks=2,
              env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=1500)
    steps = _steps(run)
    assert [m["step"] for m in steps] == [1, 2]
    assert steps[0]["grad_norm"] > 0, "the first step must change the weights"
    for m in steps:
        assert m["rollout/logprob_diff_max"] <= TOKEN_TOL and m["rollout/logprob_diff_mean"] <= MEAN_TOL, m
    if algo == "grpo":
        assert all(m["loss/kl"] > 0 for m in steps[1:]), "the reference must be in the loss after the first update"


# ---- server mode: the weight channels ------------------------------------------------------------------------------


def _serve(model, *extra: str) -> tuple[subprocess.Popen, str]:
    return start_vllm_server(model, "--max-model-len", "1048", *extra)


def _convs(n: int = 8) -> list[list[dict]]:
    return [[{"role": "user", "content": " ".join([f"word{k}"] * (k % 7 + 1)) + "?"}] for k in range(n)]


def _diff(policy, engine) -> torch.Tensor:
    out = engine.generate(_convs(), 4, Sampling(16, seed_key=(3,)))
    with torch.no_grad():
        lp = policy.completion_logprobs(out, temperature=1.0)
    return (lp - out.sampled_logprobs).abs()[out.completion_mask]


def _perturb(policy, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))


def test_server_weight_channel_buckets_drops_and_restart(tiny_text_dir, monkeypatch):
    """The dist channel (the default): after a weight change + bucketed broadcast sync the server's log-probs are the
    trainer's; a bucket dropped on the way trips the post-sync comparison, and buckets whose loss leaves parameters
    without values are an error at the end of that sync (naming them); after those and a sync of NaN weights the next
    full sync gives the trainer's log-probs again; a server restarted under the run refuses the next sync with a
    message instead of hanging; the NCCL and IPC transports are refused by a CPU server with a message."""
    from mmgpg.rollout import vllm_core
    from mmgpg.rollout.vllm_server import ServerClient, VLLMServerError

    proc, url = _serve(tiny_text_dir, "--port", "0")
    port = url.rsplit(":", 1)[1]
    policy = load_policy(str(tiny_text_dir), dtype="float32", device="cpu", max_prompt_length=1024)
    cfg = resolve([*TEXT_MODEL, "rollout.engine=vllm", f"rollout.vllm_server={url}", "rollout.vllm_server_timeout=60",
                   "rollout.vllm_sync_bucket_mb=0.25", "rollout.max_new_tokens=16"]).config
    try:
        eng = build_engine("vllm", policy, EngineSettings.from_config(cfg))  # the first sync opens the channel
        assert eng.core.channel == "dist" and eng.core.transport == "gloo" and eng.core._end is not None
        _perturb(policy, 1)
        assert _diff(policy, eng).mean() > 100 * MEAN_TOL  # stale: the check would see it
        out = eng.core.reload(weights=policy_weights(policy.model), bucket_bytes=1 << 18)
        assert out["buckets"] >= 8, out
        diff = _diff(policy, eng)
        assert diff.max() <= TOKEN_TOL and diff.mean() <= MEAN_TOL, (diff.max(), diff.mean())
        # on the CPU the broadcast is gloo; the GPU transports are refused by this server, and their requests change
        # nothing: the gloo channel stays open (the syncs below use it)
        assert eng.core.info["device"] == "cpu" and eng.core.transport == "gloo"
        with pytest.raises(ValueError, match="needs this server on a GPU"):
            eng.core._post("/init_channel", {"transport": "nccl", "host": "127.0.0.1", "port": 1, "timeout_s": 1})
        with pytest.raises(ValueError, match="ipc shares GPU memory"):
            ServerClient(url, timeout=60, channel="ipc").reload(weights=policy_weights(policy.model))

        real_buckets = vllm_core.buckets

        def dropping(keep):  # the breakage: the buckets `keep` refuses never reach the server
            def buckets(weights, max_bytes):
                for i, bucket in enumerate(real_buckets(weights, max_bytes)):
                    if keep(i):
                        yield bucket
            return buckets

        # the third bucket alone: every vLLM parameter still gets some values (it holds part of fused layers), so
        # the sync completes, and the post-sync comparison sees the stale/half-loaded layers
        monkeypatch.setattr(vllm_core, "buckets", dropping(lambda i: i != 2))
        _perturb(policy, 2)
        eng.sync_weights(policy_weights(policy.model))
        broken = _diff(policy, eng).mean()
        # large or NaN (the missing part of the layer is uninitialised memory): either way the trainer's check
        # (`not mean <= limit`) stops the run
        assert not broken <= 100 * MEAN_TOL, broken
        # every bucket after the first: whole parameters get nothing, and the sync itself says so
        monkeypatch.setattr(vllm_core, "buckets", dropping(lambda i: i == 0))
        with pytest.raises(VLLMServerError, match="never arrived"):
            eng.sync_weights(policy_weights(policy.model))
        monkeypatch.setattr(vllm_core, "buckets", real_buckets)
        # non-finite weights (a diverged policy; the uninitialised memory of a half-loaded layer above is NaN only
        # now and then): the KV blocks its requests fill hold NaN, which must not leak into the requests after the
        # repair (the attention kernels read a block's unwritten slots too; vllm_core.reset_caches zeroes them)
        nan_v = "model.layers.1.self_attn.v_proj.weight"
        eng.sync_weights((k, torch.full_like(v, float("nan")) if k == nan_v else v)
                         for k, v in policy_weights(policy.model))
        assert _diff(policy, eng).isnan().any()
        eng.sync_weights(policy_weights(policy.model))  # the next full sync repairs it
        diff = _diff(policy, eng)
        assert diff.max() <= TOKEN_TOL and diff.mean() <= MEAN_TOL, (diff.max(), diff.mean())

        proc.terminate()
        proc.wait(timeout=60)
        proc, _ = _serve(tiny_text_dir, "--port", port)  # the same address, a fresh server without the channel
        with pytest.raises(VLLMServerError, match="restarted"):
            eng.sync_weights(policy_weights(policy.model))
        eng.close()
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_file_channel_writes_the_servers_dtype(tiny_text_dir, tmp_path):
    """rollout.vllm_sync_channel=files against a bfloat16 server with a float32 policy: the sync file holds
    bfloat16 tensors (not the trainer's float32 master weights), and the server's log-probs follow the sync."""
    from safetensors import safe_open

    proc, url = _serve(tiny_text_dir, "--port", "0", "--dtype", "bfloat16")
    try:
        policy = load_policy(str(tiny_text_dir), dtype="float32", device="cpu", max_prompt_length=1024)
        cfg = resolve([*TEXT_MODEL, "rollout.engine=vllm", f"rollout.vllm_server={url}",
                       "rollout.vllm_server_timeout=60", "rollout.vllm_sync_channel=files", "rollout.max_new_tokens=16",
                       f"rollout.vllm_sync_dir={tmp_path}"]).config
        eng = build_engine("vllm", policy, EngineSettings.from_config(cfg))
        assert eng.weights_dtype == torch.bfloat16
        _perturb(policy, 1)
        stale = _diff(policy, eng).mean()
        eng.sync_weights(policy_weights(policy.model))  # float32: the client casts to the server's dtype
        with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
            dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}
        assert dtypes == {"BF16"}, dtypes
        fresh = _diff(policy, eng).mean()
        assert fresh < stale / 10, (fresh, stale)  # bfloat16 vs float32: close, not exact
        eng.close()
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_gpu_acceptance_sync_section_runs_on_cpu_up_to_the_gpu(tmp_path):
    """bench/gpu_acceptance.py's weight-sync comparison as its dry run runs it (bench/vllm_sync.py on CPU): gloo and
    files sync changed weights that the server then scores like the trainer; nccl and ipc are rows saying they need
    CUDA, not errors."""
    import argparse
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_acceptance", REPO / "bench" / "gpu_acceptance.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    args = argparse.Namespace(dry_run=True, vllm_python=sys.executable)
    sync = module.run_sync(args, tmp_path, 400)
    assert sync["status"] == "ok", sync
    for t in ("gloo", "files"):
        assert sync[t]["status"] == "ok" and sync[t]["buckets"] >= 1 and sync[t]["s_per_gib"] > 0, sync[t]
        assert sync[t]["logprob_diff_max_after_sync"] <= TOKEN_TOL, sync[t]
    for t in ("nccl", "ipc"):
        assert sync[t]["status"] == f"skipped: {t} needs CUDA (--device cuda on a GPU machine)"
    table = "\n".join(module.sync_markdown(sync))
    assert "| gloo | ok |" in table and "| nccl | skipped: nccl needs CUDA" in table
