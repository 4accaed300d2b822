"""Multi-turn episodes with tools (mmgpg.rollout.episode) on the tiny Qwen-VL models: a scripted 3-turn episode's
tokens and loss mask equal ones built by hand from Qwen's tool-response format; an episode's log-probs equal each
turn scored alone by an unpadded full-logits forward; with no tool call the episode path equals today's single-turn
path bit for bit; bad tool calls become error observations and the limits hold."""

from __future__ import annotations

import pytest
import torch
from support.episodes import episode_token_logprobs, turn_spans
from support.families import QWEN_VL

from mmgpg.models.load import load_policy
from mmgpg.rollout.engine import Sampling
from mmgpg.rollout.episode import (
    EpisodeLimits,
    episode_means,
    episode_prompt,
    episode_sums,
    generate_episodes,
    rollout,
    scripted_episodes,
    with_tools,
)
from mmgpg.rollout.hf import HFEngine
from mmgpg.task import build_task
from mmgpg.tools import TOOLS, EpisodeState

BOUNDS = dict(min_pixels=56 * 56, max_pixels=112 * 112)
ZOOM = '<tool_call>{"name": "zoom", "arguments": {"bbox_2d": [%d, %d, %d, %d]}}</tool_call>'
# Qwen's tool-response turn after an assistant turn (what Qwen3's chat template renders for a tool message), written
# out by hand: the test's independent statement of the format
GLUE = ("\n<|im_start|>user\n<tool_response>\n%s%s\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"


def _policy(tiny_dirs, family):
    return load_policy(str(tiny_dirs[family]), dtype="float32", device="cpu", **BOUNDS)


@pytest.fixture(scope="module")
def task():
    return build_task("shapes_zoom", {"num_train": 8, "num_test": 4, "max_turns": 4})


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_scripted_three_turn_episode_equals_the_hand_built_tokens_and_mask(tiny_dirs, task, family):
    policy = _policy(tiny_dirs, family)
    ex = task.load("train")[0]
    turns = [ZOOM % (100, 100, 400, 400), ZOOM % (0, 0, 500, 500), "<answer>red</answer>"]
    batch = scripted_episodes(policy, task, [episode_prompt(task, ex)], [turns])
    tok, eos = policy.tokenizer, policy.eos_token_ids[0]
    crop1 = TOOLS["zoom"].fn({"bbox_2d": [100, 100, 400, 400]}, EpisodeState([ex.media[0]])).images[0]
    crop2 = TOOLS["zoom"].fn({"bbox_2d": [0, 0, 500, 500]}, EpisodeState([ex.media[0], crop1])).images[0]
    ids, mask, mm = [], [], []
    for k, text in enumerate(turns):
        own = tok(text, add_special_tokens=False)["input_ids"] + [eos]
        ids, mask, mm = ids + own, mask + [1] * len(own), mm + [0] * len(own)
        if k < 2:
            said = f"Zoomed into {[[100, 100, 400, 400], [0, 0, 500, 500]][k]} of image {k}."
            enc = policy.processor(text=[GLUE % (IMAGE, said)], images=[[crop1, crop2][k]], return_tensors="pt")
            glue = enc["input_ids"][0].tolist()
            ids, mask = ids + glue, mask + [0] * len(glue)
            mm += [int(t == policy.image_token_id) for t in glue]
    n = len(ids)
    assert batch.completion_ids[0, :n].tolist() == ids
    assert batch.completion_mask[0].tolist() == [bool(m) for m in mask]
    assert batch.context_mask[0].all() and batch.completion_mm[0].tolist() == mm
    assert batch.row_vision[0]["image_grid_thw"].shape[0] == 2  # the two zooms' images
    episode = batch.episodes[0]
    assert [t.tool_call["name"] if t.tool_call else None for t in episode.turns] == ["zoom", "zoom", None]
    assert episode.limit is None and episode.calls == 2 and "<tool_response>" in batch.texts[0]


def per_turn_reference(policy, batch) -> torch.Tensor:
    """Each turn of each episode scored alone (support.episodes: the prompt and everything before the turn's end,
    the observation images shown before it included, unpadded, full-vocabulary logits)."""
    out = torch.zeros(batch.completion_ids.shape)
    for r, episode in enumerate(batch.episodes):
        for start, end in turn_spans(episode.policy):
            with torch.no_grad():
                logp = episode_token_logprobs(policy, batch.prompts, r // batch.group_size, episode, end)
            out[r, start:end] = logp[start:end]
    return out


@pytest.mark.parametrize("family", QWEN_VL)
def test_episode_logprobs_equal_the_sum_of_the_per_turn_references(tiny_dirs, task, family):
    policy = _policy(tiny_dirs, family)
    examples = [task.load("train")[i] for i in range(2)]
    scripts = [[ZOOM % (100, 100, 400, 400), '<tool_call>{"name": zoom}</tool_call>', ZOOM % (0, 500, 300, 900),
                "<answer>blue</answer>"],
               ["<answer>red</answer>"]]  # turns of different counts: 3 observations (one an error) and none
    batch = scripted_episodes(policy, task, [episode_prompt(task, ex) for ex in examples], scripts)
    assert [t.error for t in batch.episodes[0].turns] == [None, "malformed", None, None]
    policy.model.train()
    logp = policy.completion_logprobs(batch, chunk_size=7)
    want = per_turn_reference(policy, batch)
    torch.testing.assert_close(logp.detach(), want, atol=1e-5, rtol=0)
    sums = (logp.detach() * batch.completion_mask).sum(1)
    turn_sums = [sum(float(want[r, a:b].sum()) for a, b in turn_spans(e.policy)) for r, e in enumerate(batch.episodes)]
    assert sums.tolist() == pytest.approx(turn_sums, abs=1e-4)
    assert float(logp[~batch.completion_mask].abs().sum()) == 0  # observations are never scored
    logp.sum().backward()  # the observation images reach the vision tower's gradient
    assert sum(float(p.grad.abs().sum()) for n, p in policy.model.named_parameters()
               if "visual" in n and p.grad is not None) > 0


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen3_vl"])
def test_episodes_without_tool_calls_equal_the_single_turn_path_bit_for_bit(tiny_dirs, task, family):
    policy = _policy(tiny_dirs, family)
    engine = HFEngine(policy)
    examples = [task.load("train")[i] for i in range(3)]
    torch.manual_seed(7)
    episodes = rollout(engine, task, examples, 2, Sampling(10))
    torch.manual_seed(7)
    single = engine.generate([episode_prompt(task, ex) for ex in examples], 2, Sampling(10))
    assert all(e.calls == 0 for e in episodes.episodes)  # a random tiny model calls no tool in 10 tokens
    assert torch.equal(episodes.completion_ids, single.completion_ids)
    assert torch.equal(episodes.completion_mask, single.completion_mask) and episodes.texts == single.texts
    assert torch.equal(episodes.sampled_logprobs, single.sampled_logprobs)
    with torch.no_grad():
        assert torch.equal(policy.completion_logprobs(episodes), policy.completion_logprobs(single))


def test_the_tools_block_is_qwens_and_joins_the_system_message(task):
    conv = [{"role": "user", "content": "hi"}]
    system = with_tools(conv, ["zoom"])[0]
    assert system["role"] == "system" and system["content"].startswith("# Tools\n\nYou may call one or more functions")
    assert '"name": "zoom"' in system["content"] and "<tool_call>\n{\"name\": <function-name>" in system["content"]
    joined = with_tools([{"role": "system", "content": "Be brief."}, *conv], ["zoom"])
    assert joined[0]["content"].startswith("Be brief.\n\n# Tools") and len(joined) == 2


# ---- bad input and limits -------------------------------------------------------------------------------------------


@pytest.fixture
def bad_tools():
    from support.bad_tools import register_bad_tools

    return register_bad_tools()


def test_bad_calls_become_error_observations_and_the_episode_goes_on(tiny_dirs, task, bad_tools):
    policy = _policy(tiny_dirs, "qwen2_vl")
    saved = task.episode_limits
    task.tools = ("zoom", *bad_tools)
    task.episode_limits = EpisodeLimits(max_turns=11, max_images=8, max_tokens=4096, tool_timeout_s=0.3)
    call = '<tool_call>{"name": "%s", "arguments": %s}</tool_call>'
    turns = ['<tool_call>{"name": zoom}</tool_call>',  # malformed JSON
             call % ("crop", "{}"),  # unknown tool
             call % ("zoom", '{"bbox_2d": [1, 2, 3]}'),  # outside the schema
             call % ("zoom", '{"bbox_2d": [0, 0, 1200, 10]}'),  # outside the image (the 0-1000 grid)
             call % ("zoom", '{"bbox_2d": [5, 5, 5, 10]}'),  # zero area
             call % ("zoom", '{"bbox_2d": [0, 0, 1, 1]}'),  # less than a pixel
             call % ("t_raises", "{}"), call % ("t_refuses", "{}"), call % ("t_wrong", "{}"), call % ("t_slow", "{}"),
             "<answer>red</answer>"]
    try:
        batch = scripted_episodes(policy, task, [episode_prompt(task, task.load("train")[0])], [turns])
    finally:
        del task.tools
        task.episode_limits = saved
    episode = batch.episodes[0]
    assert [t.error for t in episode.turns] == ["malformed", "unknown_tool", "bad_arguments", "bad_arguments",
                                                "tool_error", "tool_error", "tool_error", "tool_error", "tool_error",
                                                "timeout", None]
    assert "disk on fire" in episode.turns[6].observation and "no such region" in episode.turns[7].observation
    assert episode.limit is None and not episode.media  # only error text was shown
    sums = episode_means(episode_sums([episode], ["zoom"]))
    assert sums["tools/invalid_calls"] == 10 and sums["tools/errors/tool_error"] == 5 and sums["tools/turns"] == 11


@pytest.mark.parametrize("limits, turns, limit, shown", [
    (EpisodeLimits(max_turns=2), [ZOOM % (0, 0, 500, 500), ZOOM % (0, 0, 500, 500)], "turns", 1),
    (EpisodeLimits(max_images=1), [ZOOM % (0, 0, 500, 500), ZOOM % (0, 0, 500, 500)], "images", 1),
    (EpisodeLimits(max_tokens=90), [ZOOM % (0, 0, 500, 500)], "tokens", 0),
])
def test_limits_end_the_episode(tiny_dirs, task, limits, turns, limit, shown):
    policy = _policy(tiny_dirs, "qwen2_vl")
    saved, task.episode_limits = task.episode_limits, limits
    try:
        prompt = [episode_prompt(task, task.load("train")[0])]
        batch = scripted_episodes(policy, task, prompt, [turns])
        with pytest.raises(ValueError, match="follows the end of the episode"):
            scripted_episodes(policy, task, prompt, [[*turns, "<answer>red</answer>"]])
    finally:
        task.episode_limits = saved
    episode = batch.episodes[0]
    assert episode.limit == limit and len(episode.media) == shown and len(episode.ids) <= limits.max_tokens


def test_generated_episodes_hold_the_token_limit(tiny_dirs, task):
    policy = _policy(tiny_dirs, "qwen2_vl")
    saved, task.episode_limits = task.episode_limits, EpisodeLimits(max_tokens=9)
    try:
        torch.manual_seed(0)
        out = generate_episodes(HFEngine(policy), task, [episode_prompt(task, task.load("train")[0])], 3,
                                Sampling(16))
    finally:
        task.episode_limits = saved
    assert all(len(e.ids) <= 9 and e.limit == "tokens" for e in out.episodes)
    assert out.completion_mask.shape[1] <= 9


def test_a_task_with_tools_is_refused_for_a_family_that_cannot_continue_episodes(task):
    from mmgpg.models import family
    from mmgpg.task import check_task_for_model
    from mmgpg.typed import ConfigError

    check_task_for_model(task, family("qwen2_5_vl"))
    for name in ("gemma3", "qwen2"):
        with pytest.raises(ConfigError, match="offers tools"):
            check_task_for_model(task, family(name))
