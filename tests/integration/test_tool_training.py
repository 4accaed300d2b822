"""``mmgpg train task=shapes_zoom`` (episodes with the zoom tool) end to end on the tiny Qwen2-VL: a model
warm-started on gold episodes (a short ``mmgpg sft``: it then calls the tool, so the training episodes really hold
observations) trains with the HF engine, plain and ZeRO-2, full and LoRA, its metrics.jsonl holding the ``tools/``
keys; ``mmgpg eval`` writes each episode's turns; and the trainer's GPG gradient on episodes equals a one-episode-at-a-
time reference."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from mmgpg.cli import main
from mmgpg.rundir import read_metrics

HAVE_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None
# the demo's task settings: no tools block (SFT teaches the call), prompts that fit the tiny model's budget
TASK = ["task=shapes_zoom", "task.describe_tools=false", "model=tiny", "model.dtype=float32"]


@pytest.fixture(scope="module")
def zoom_model(tmp_path_factory):
    """The tiny Qwen2-VL after 100 SFT steps on gold episodes (zoom into the quarter, then answer): it zooms."""
    out = tmp_path_factory.mktemp("zoom_sft")
    assert main(["sft", *TASK, "sft.max_steps=100", "sft.batch_size=16", "sft.learning_rate=3e-3", "sft.eval_every=0",
                 "sft.save_every=0", "train.eval_limit=4", "rollout.max_new_tokens=80", f"output_dir={out}"]) == 0
    return out / "final"


CELLS = {"plain-full": [], "plain-lora": ["model.lora.rank=4"],
         "zero2-full": ["train.backend=deepspeed", "train.zero_stage=2"],
         "zero2-lora": ["train.backend=deepspeed", "train.zero_stage=2", "model.lora.rank=4"]}


IN_CI = {"plain-full", "zero2-lora"}
"""The cells CI runs (the others with --runslow: CI's time budget, .ci/run)."""


def _cell(cell: str):
    marks = [] if cell in IN_CI else [pytest.mark.slow]
    if cell.startswith("zero") and not HAVE_DEEPSPEED:
        marks.append(pytest.mark.skip(reason="deepspeed is not installed (pip install 'mmgpg[deepspeed]')"))
    return pytest.param(cell, marks=marks)


@pytest.mark.parametrize("cell", [_cell(c) for c in CELLS])
def test_shapes_zoom_trains_with_tool_calls(tmp_path, zoom_model, cell):
    run = tmp_path / "run"
    assert main(["train", *TASK, f"model.name_or_path={zoom_model}", "algo=gpg", "train.max_steps=2",
                 "train.prompts_per_step=2", "train.micro_batch_prompts=1", "rollout.group_size=4",
                 "rollout.max_new_tokens=80", "train.progress=false", "train.tensorboard=false",
                 "algo.max_resample_attempts=1", "train.save_every=0", f"output_dir={run}", *CELLS[cell]]) == 0
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2]
    assert all("tools/calls_per_episode" in r and "tools/calls/zoom" in r and "tools/limit_share" in r for r in rows)
    assert sum(r["tools/calls/zoom"] for r in rows) > 0  # the episodes held observations
    assert all(r["tools/turns"] >= 1 for r in rows)
    if cell == "plain-full":
        out = tmp_path / "eval"
        assert main(["eval", "--task", "shapes_zoom", "task.describe_tools=false", "--ckpt", str(run), "--limit", "3",
                     "--max-new-tokens", "80", "--output", str(out)]) == 0
        preds = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
        assert len(preds) == 3 and all("episode" in p and p["episode"]["turns"] for p in preds)
        turns = [t for p in preds for t in p["episode"]["turns"]]
        assert all({"text", "tool_call", "error", "observation", "image_sizes"} <= t.keys() for t in turns)
        assert all(t["image_sizes"] for t in turns if t["tool_call"] and t["error"] is None and t["observation"])
        metrics = json.loads((out / "metrics.json").read_text())
        assert "useful_zoom" in json.dumps(metrics)


def episode_reference_gradient(trainer, groups, advantages, alpha: float, aggregation: str) -> dict[str, torch.Tensor]:
    """∇ of L = -α/B · Σ_i A_i · Σ_t log π(o_it) / |o_i| (seq_mean_token_mean) or -α/N · Σ_i A_i · Σ_t log π(o_it)
    (token_mean) over the policy's tokens of each episode, one episode at a time (support.episodes: its prompt and
    all its tokens, unpadded, through model.forward with the prompt's and its observations' images, full-vocabulary
    logits); |o_i| = the episode's policy tokens, N = the update's."""
    from support.episodes import episode_token_logprobs

    policy = trainer.policy
    model = policy.model
    model.zero_grad(set_to_none=True)
    B = sum(len(g.episodes) for g in groups)
    N = sum(sum(e.policy) for g in groups for e in g.episodes)
    for g, advs in zip(groups, advantages):
        for episode, A in zip(g.episodes, advs):
            if A == 0:
                continue
            logp = episode_token_logprobs(policy, g.prompts, g.prompt_index, episode)
            mine = torch.tensor(episode.policy)
            norm = int(mine.sum()) * B if aggregation == "seq_mean_token_mean" else N
            loss = -alpha * A * logp[mine].sum() / norm
            loss.backward()
    out = {n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p)) for n, p in model.named_parameters()
           if p.requires_grad}
    model.zero_grad(set_to_none=True)
    return out


@pytest.mark.parametrize("aggregation", ["seq_mean_token_mean", "token_mean"])
def test_gpg_gradient_on_episodes_equals_the_one_episode_reference(tmp_path, aggregation):
    """Scripted episodes of 1-4 turns (zooms, an error observation, answers) in groups of 4 with the gradient tests'
    rewards (one zero-variance group: α = 4/3), micro-batches of 3 groups, chunked scoring."""
    from support.gradient_reference import (
        ALPHA,
        REWARDS,
        gpg_advantages,
        make_trainer,
        relative_error,
        trainer_gradient,
    )

    from mmgpg.rollout.collect import Group
    from mmgpg.rollout.episode import episode_prompt, scripted_episodes

    trainer = make_trainer("tiny", str(tmp_path / "r"), "gpg", "task=shapes_zoom", "task.describe_tools=false", "task.max_turns=4",
                           "train.micro_batch_prompts=3", "model.logprob_chunk_size=7",
                           f"algo.aggregation={aggregation}")
    zoom = '<tool_call>{"name": "zoom", "arguments": {"bbox_2d": [%d, %d, %d, %d]}}</tool_call>'
    scripts = [[zoom % (100, 100, 400, 400), "<answer>red</answer>"], ["<answer>blue</answer>"],
               [zoom % (0, 0, 500, 500), '<tool_call>{"name": "crop", "arguments": {}}</tool_call>',
                zoom % (200, 200, 300, 300), "<answer>green</answer>"],
               ['<tool_call>{"name": zoom}</tool_call>', "<answer>yellow</answer>"]]
    groups = []
    for i in range(4):
        example = trainer.dataset[i]
        turns = [scripts[(i + j) % 4] for j in range(4)]
        out = scripted_episodes(trainer.policy, trainer.task, [episode_prompt(trainer.task, example)] * 4, turns)
        r = [float(x) for x in REWARDS[i]]
        groups.append(Group(example, [e.ids for e in out.episodes], out.texts, r, {"accuracy": r}, 0,
                            len(set(r)) == 1, prompts=out.prompts, prompt_index=0, episodes=out.episodes))
    assert sum(e.calls for g in groups for e in g.episodes) > 8
    want = episode_reference_gradient(trainer, groups, [gpg_advantages(g.rewards) for g in groups], ALPHA, aggregation)
    assert relative_error(trainer_gradient(trainer, groups), want) < 1e-5
