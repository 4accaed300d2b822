"""The two seams: every generation goes through the configured rollout engine, the update reuses the rollout's
encoded prompts exactly, and the plain backend's bucketed gradient sum equals the plain sum."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from support.conversations import two_image_conversations

from mmgpg.models.batch import join_vision
from mmgpg.models.load import load_policy


def test_gather_prompts_equals_encoding_the_same_conversations(tiny_dirs):
    """Rows picked out of a rollout's left-padded batch (different image sizes, so different lengths) and re-padded
    are exactly what encoding those conversations together gives."""
    policy = load_policy(str(tiny_dirs["qwen2_vl"]), dtype="float32", min_pixels=56 * 56, max_pixels=112 * 112)
    big, small = two_image_conversations()
    text_only = [{"role": "user", "content": [{"type": "text", "text": "No image here, just words."}]}]
    batch = policy.encode_prompts([big, small, text_only])
    for rows, convs in (([1, 0], [small, big]), ([2, 1], [text_only, small]), ([1], [small])):
        got = policy.gather_prompts([(batch, r) for r in rows])
        want = policy.encode_prompts(convs)
        for name in ("input_ids", "attention_mask", "mm_token_type_ids"):
            assert torch.equal(getattr(got, name), getattr(want, name)), (rows, name)
        joined, expected = join_vision(got.vision), join_vision(want.vision)
        assert joined.keys() == expected.keys() and all(torch.equal(joined[k], expected[k]) for k in joined), rows
        assert got.media_per_prompt == want.media_per_prompt and got.texts == want.texts


def test_sampled_groups_are_scored_as_the_update_scores_them(tiny_dirs):
    """collate_groups + group_logprobs (the update's and `mmgpg sample`'s one scoring path): groups that reuse the
    rollout's encoding score exactly as re-encoded ones, any subset of groups gets its own prompts' rows, and the
    sampling temperature is applied."""
    import dataclasses

    from mmgpg.config import resolve
    from mmgpg.rollout import Sampling
    from mmgpg.rollout.collect import collate_groups, group_logprobs, sample_groups
    from mmgpg.rollout.hf import HFEngine
    from mmgpg.task import build_task

    cfg = resolve(["model=tiny", "task=shapes", "rollout.group_size=2", "rollout.max_new_tokens=6",
                   "rollout.temperature=0.7"]).config
    policy = load_policy(str(tiny_dirs["qwen2_vl"]), dtype="float32", min_pixels=3136, max_pixels=12544)
    task = build_task("shapes")
    torch.manual_seed(0)
    groups = sample_groups(HFEngine(policy), task, list(task.load("train")[:3]), 2, Sampling.from_config(cfg.rollout))
    with torch.no_grad():
        batch = collate_groups(policy, task, groups, 2)
        whole = group_logprobs(policy, batch, cfg.model, cfg.rollout)
        assert [batch.completion_ids[i, : int(batch.completion_mask[i].sum())].tolist() for i in range(6)] == \
            [ids for g in groups for ids in g.completion_ids]
        encoded = [dataclasses.replace(g, prompts=None) for g in groups]
        torch.testing.assert_close(group_logprobs(policy, collate_groups(policy, task, encoded, 2), cfg.model,
                                                  cfg.rollout), whole, atol=1e-5, rtol=0)
        for picked in ([2], [1, 0]):
            part = group_logprobs(policy, collate_groups(policy, task, [groups[p] for p in picked], 2), cfg.model,
                                  cfg.rollout)
            for k, p in enumerate(picked):
                for j in range(2):
                    n = len(groups[p].completion_ids[j])
                    torch.testing.assert_close(part[2 * k + j, :n], whole[2 * p + j, :n], atol=1e-5, rtol=0)
        hot = group_logprobs(policy, batch, cfg.model, dataclasses.replace(cfg.rollout, temperature=1.0))
        assert (hot - whole).abs().max() > 1e-3


def test_an_engine_backend_and_advantage_registered_from_a_plugin_drive_training(tmp_path):
    """tests/support/seam_plugin.py registers through the public registries (no edit of mmgpg, no monkeypatching); the
    config accepts the new names and the trainer uses all three."""
    from support import seam_plugin

    from mmgpg.config import resolve
    from mmgpg.train.trainer import Trainer

    seam_plugin.CountingEngine.calls, seam_plugin.CountingBackend.steps = [], 0
    args = ["model=tiny", "rollout.engine=counting", "train.backend=counting", "algo.advantage=doubled_group_mean",
            "rollout.group_size=2", "rollout.max_new_tokens=4", "train.prompts_per_step=2", "train.max_steps=1",
            "train.eval_every=1", "train.eval_limit=2", "train.progress=false", "train.tensorboard=false",
            "algo.min_valid_fraction=0", "task=shapes_parity"]
    trainer = Trainer(resolve([*args, f"output_dir={tmp_path / 'run'}"]))
    assert isinstance(trainer.engine, seam_plugin.CountingEngine)
    assert isinstance(trainer.backend, seam_plugin.CountingBackend)
    rewards = torch.tensor([[1.0, 0.0]])
    assert torch.equal(trainer.objective.advantage_fn(rewards), torch.tensor([[1.0, -1.0]]))  # the plugin's, not GPG's 0.5
    trainer.train()
    # step-0 evaluation (greedy, one completion), the rollout (G = 2 at T = 1), the step-1 evaluation
    assert seam_plugin.CountingEngine.calls == [(1, 0.0), (2, 1.0), (1, 0.0)]
    assert seam_plugin.CountingBackend.steps <= 1


def test_registries_refuse_a_duplicate_name_and_list_registered_ones():
    from mmgpg.backends import BACKENDS
    from mmgpg.registry import Entry, Registry
    from mmgpg.rollout.engine import ENGINES

    with pytest.raises(ValueError, match="rollout engine 'hf' is already registered"):
        ENGINES.register("hf", "somewhere:Else")
    with pytest.raises(ValueError, match="training backend 'plain' is already registered"):
        BACKENDS.register("plain", "somewhere:Else")
    reg = Registry("thing", "mmgpg.test_things", {"a": "math:sqrt"})
    reg.register("b", len)
    assert list(reg) == ["a", "b"] and reg["a"](9.0) == 3.0 and reg["b"]("xy") == 2
    with pytest.raises(KeyError, match="unknown thing 'c'; available: a, b"):
        reg["c"]
    reg.unregister("b")
    assert "b" not in reg
    # Replacing an implementation (a spy in a test) keeps what was declared about it: the checks read the facts.
    reg = Registry("thing", "mmgpg.test_things", {"a": Entry("math:sqrt", {"ratio": "r"})})
    reg.register("a", len, replace=True)
    assert reg.facts("a") == {"ratio": "r"} and reg["a"]("xy") == 2
    reg.register("a", len, replace=True, facts={})
    assert reg.facts("a") == {}


def test_unknown_registered_names_are_config_errors():
    from mmgpg.config import ConfigError, resolve

    with pytest.raises(ConfigError) as err:
        resolve(["model=tiny", "rollout.engine=nope", "train.backend=plain2", "algo.advantage=grp_mean"])
    text = str(err.value)
    assert "rollout.engine" in text and "train.backend" in text and "algo.advantage" in text


def _bucket_worker(rank: int, world: int, init_file: str, out: str) -> None:
    from mmgpg.distributed import gradient_buckets, sum_gradients

    os.environ.update(WORLD_SIZE=str(world), RANK=str(rank), LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        g = torch.Generator().manual_seed(rank)
        shapes = [(3, 5), (7,), (2, 2, 2), (11,), (4,)]
        params = [torch.nn.Parameter(torch.zeros(s, dtype=torch.float64 if i == 3 else torch.float32))
                  for i, s in enumerate(shapes)]
        for i, p in enumerate(params):
            if not (rank == 1 and i == 2):  # rank 1 never touched parameter 2: its gradient counts as zeros
                p.grad = torch.randn(p.shape, generator=g, dtype=p.dtype)
        local = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in params]
        buckets = gradient_buckets(params, bucket_bytes=64)  # several buckets; the float64 one alone
        sum_gradients(params, bucket_bytes=64)
        torch.save({"local": local, "summed": [p.grad for p in params], "buckets": len(buckets)}, f"{out}/r{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
def test_bucketed_gradient_sum_is_the_exact_sum(tmp_path):
    mp.spawn(_bucket_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    r0, r1 = torch.load(tmp_path / "r0.pt"), torch.load(tmp_path / "r1.pt")
    assert r0["buckets"] >= 3
    for a, b, s0, s1 in zip(r0["local"], r1["local"], r0["summed"], r1["summed"]):
        assert torch.equal(s0, s1) and s0.dtype == a.dtype
        torch.testing.assert_close(s0, a + b, rtol=0, atol=0)
